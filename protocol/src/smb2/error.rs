//! Decode (and encode) failures of the SMB2 wire layer, and what a server
//! does about each ([MS-SMB2] 3.3.5.2.6).

use super::header::Command;
use crate::ntstatus::{
    NtStatus, STATUS_BUFFER_TOO_SMALL, STATUS_INVALID_PARAMETER, STATUS_NOT_SUPPORTED,
};
use crate::WireError;

/// Why bytes are not the SMB2 structure being decoded, or why a `Repr`
/// cannot be encoded. Every decoder of this module returns it; none panics.
///
/// Each variant names the structure (`what`) and, where one is to blame, the
/// field, with the numbers involved, so a log line says which limit a peer
/// broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Smb2Error {
    /// The message is shorter than the 64-byte SMB2 header. [MS-SMB2]
    /// 3.3.5.2.6: the server MUST disconnect without a response.
    ShortMessage {
        /// Bytes present.
        have: usize,
    },
    /// ProtocolId is not 0xFE 'S' 'M' 'B' ([MS-SMB2] 2.2.1). Transform
    /// (0xFD) and compression (0xFC) headers are reported here too: this
    /// crate does not negotiate encryption or compression.
    ProtocolId {
        /// The four bytes found.
        found: [u8; 4],
    },
    /// The header's Command is not one of the codes of [MS-SMB2] 2.2.1.
    /// 3.3.5.2.6: the server MUST disconnect without a response.
    UnknownCommand {
        /// The code found.
        command: u16,
    },
    /// NextCommand does not delimit a message: not 8-byte aligned, smaller
    /// than a header, or past the end of the compound ([MS-SMB2] 2.2.1,
    /// 3.3.5.2.7).
    NextCommand {
        /// NextCommand as received.
        next_command: u32,
        /// Bytes from this header to the end of the compound.
        remaining: usize,
    },
    /// A command [MS-SMB2] 2.2.1 defines but this crate does not decode
    /// (LOCK, QUERY_DIRECTORY, CHANGE_NOTIFY, QUERY_INFO, SET_INFO,
    /// OPLOCK_BREAK, SERVER_TO_CLIENT_NOTIFICATION): STATUS_NOT_SUPPORTED.
    UnsupportedCommand {
        /// The command.
        command: Command,
    },
    /// StructureSize differs from the value the command's section fixes.
    /// Kept apart from [`Smb2Error::Malformed`] because it is the first check
    /// of every body (STATUS_INVALID_PARAMETER).
    StructureSize {
        /// Which structure.
        what: &'static str,
        /// The value [MS-SMB2] fixes.
        expected: u16,
        /// The value received.
        found: u16,
    },
    /// Fewer bytes than the structure's fixed part (or than a count says).
    Truncated {
        /// Which structure.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// An offset/length pair places a buffer outside the message, or inside
    /// the header or the fixed part of the structure.
    OutOfBounds {
        /// Which structure.
        what: &'static str,
        /// The offset field.
        field: &'static str,
        /// Offset as received (from the start of the SMB2 header, or of the
        /// enclosing structure for nested ones).
        offset: u64,
        /// Length as received (0 where no length field goes with the
        /// offset, e.g. NegotiateContextOffset or a create context's Next).
        length: u64,
        /// First offset the buffer may start at.
        min: u64,
        /// Offset the buffer may not end after.
        limit: u64,
    },
    /// Two variable-length buffers of one structure overlap.
    Overlap {
        /// Which structure.
        what: &'static str,
        /// One buffer.
        first: &'static str,
        /// The other.
        second: &'static str,
    },
    /// An offset [MS-SMB2] requires to be 8-byte aligned is not.
    Misaligned {
        /// Which structure.
        what: &'static str,
        /// The offset field.
        field: &'static str,
        /// Its value.
        offset: u64,
    },
    /// A field holds a value [MS-SMB2] forbids.
    Malformed {
        /// Which structure.
        what: &'static str,
        /// Which field, and why.
        field: &'static str,
    },
    /// `emit`: the caller's buffer is too small.
    BufferTooSmall {
        /// Which structure.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes given.
        have: usize,
    },
    /// `emit`: a value does not fit the wire field that carries it (a name
    /// longer than 65535 bytes, a buffer past a 16-bit offset, ...).
    TooLarge {
        /// Which structure.
        what: &'static str,
        /// Which field.
        field: &'static str,
        /// The value.
        value: u64,
        /// The largest value the field holds.
        max: u64,
    },
}

/// What a server does with a request that failed to decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerAction {
    /// Send an ERROR response ([MS-SMB2] 2.2.2, 3.3.4.4) with this status.
    FailRequest(NtStatus),
    /// Disconnect without a response ([MS-SMB2] 3.3.5.2.6, 3.3.7.1).
    Disconnect,
}

impl Smb2Error {
    /// The NTSTATUS a server puts in the ERROR response:
    /// STATUS_NOT_SUPPORTED for a command it does not implement (or a code
    /// [MS-SMB2] does not define, should the caller answer one rather than
    /// disconnect), STATUS_BUFFER_TOO_SMALL for an encode into a short
    /// buffer, and STATUS_INVALID_PARAMETER for every malformed structure
    /// ([MS-SMB2] 3.3.5.2.6).
    pub fn status(&self) -> NtStatus {
        match self {
            Smb2Error::UnknownCommand { .. } | Smb2Error::UnsupportedCommand { .. } => {
                STATUS_NOT_SUPPORTED
            }
            Smb2Error::BufferTooSmall { .. } => STATUS_BUFFER_TOO_SMALL,
            _ => STATUS_INVALID_PARAMETER,
        }
    }

    /// What a server does: [MS-SMB2] 3.3.5.2.6 disconnects for a message
    /// shorter than the header and for a Command outside 2.2.1; this crate
    /// also disconnects when the message cannot be delimited or is not SMB2
    /// (ProtocolId, header StructureSize, NextCommand: the "MAY also
    /// disconnect" of the same section, because no request can be answered
    /// reliably). Everything else fails the one request with
    /// [`status`](Self::status).
    pub fn server_action(&self) -> ServerAction {
        match self {
            Smb2Error::ShortMessage { .. }
            | Smb2Error::ProtocolId { .. }
            | Smb2Error::UnknownCommand { .. }
            | Smb2Error::NextCommand { .. } => ServerAction::Disconnect,
            Smb2Error::StructureSize { what, .. } if *what == super::header::WHAT => {
                ServerAction::Disconnect
            }
            _ => ServerAction::FailRequest(self.status()),
        }
    }
}

impl core::fmt::Display for Smb2Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Smb2Error::ShortMessage { have } => write!(
                f,
                "SMB2 message of {have} bytes is shorter than the 64-byte header"
            ),
            Smb2Error::ProtocolId { found } => write!(
                f,
                "SMB2 header: ProtocolId {:02X} {:02X} {:02X} {:02X} is not FE 'SMB'",
                found[0], found[1], found[2], found[3]
            ),
            Smb2Error::UnknownCommand { command } => {
                write!(f, "SMB2 header: Command {command:#06x} is not defined")
            }
            Smb2Error::NextCommand {
                next_command,
                remaining,
            } => write!(
                f,
                "SMB2 header: NextCommand {next_command} does not delimit a message \
                 ({remaining} bytes remain; must be 8-byte aligned, >= 64 and < remaining)"
            ),
            Smb2Error::UnsupportedCommand { command } => {
                write!(f, "SMB2 {command:?} is not supported")
            }
            Smb2Error::StructureSize {
                what,
                expected,
                found,
            } => write!(f, "{what}: StructureSize {found}, must be {expected}"),
            Smb2Error::Truncated { what, need, have } => {
                write!(f, "{what}: truncated ({have} bytes, need {need})")
            }
            Smb2Error::OutOfBounds {
                what,
                field,
                offset,
                length,
                min,
                limit,
            } => write!(
                f,
                "{what}: {field} {offset} with length {length} is outside [{min}, {limit})"
            ),
            Smb2Error::Overlap {
                what,
                first,
                second,
            } => write!(f, "{what}: buffers {first} and {second} overlap"),
            Smb2Error::Misaligned {
                what,
                field,
                offset,
            } => write!(f, "{what}: {field} {offset} is not 8-byte aligned"),
            Smb2Error::Malformed { what, field } => write!(f, "{what}: malformed field {field}"),
            Smb2Error::BufferTooSmall { what, need, have } => {
                write!(f, "{what}: emit needs {need} bytes, buffer has {have}")
            }
            Smb2Error::TooLarge {
                what,
                field,
                value,
                max,
            } => write!(f, "{what}: {field} {value} exceeds {max}"),
        }
    }
}

impl std::error::Error for Smb2Error {}

impl From<WireError> for Smb2Error {
    fn from(e: WireError) -> Smb2Error {
        match e {
            WireError::Truncated { what, need, have } => Smb2Error::Truncated { what, need, have },
            WireError::Malformed { what, field } => Smb2Error::Malformed { what, field },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::smb2::header::Command;

    #[test]
    fn framing_errors_disconnect_and_body_errors_fail_the_request() {
        let disconnect = [
            Smb2Error::ShortMessage { have: 10 },
            Smb2Error::ProtocolId {
                found: [0xFF, b'S', b'M', b'B'],
            },
            Smb2Error::UnknownCommand { command: 0x99 },
            Smb2Error::NextCommand {
                next_command: 3,
                remaining: 100,
            },
            Smb2Error::StructureSize {
                what: super::super::header::WHAT,
                expected: 64,
                found: 0,
            },
        ];
        for e in disconnect {
            assert_eq!(e.server_action(), ServerAction::Disconnect, "{e}");
        }
        let invalid = [
            Smb2Error::StructureSize {
                what: "SMB2 READ request",
                expected: 49,
                found: 48,
            },
            Smb2Error::Truncated {
                what: "x",
                need: 2,
                have: 1,
            },
            Smb2Error::Overlap {
                what: "x",
                first: "a",
                second: "b",
            },
            Smb2Error::Misaligned {
                what: "x",
                field: "f",
                offset: 3,
            },
            Smb2Error::Malformed {
                what: "x",
                field: "f",
            },
        ];
        for e in invalid {
            assert_eq!(
                e.server_action(),
                ServerAction::FailRequest(STATUS_INVALID_PARAMETER),
                "{e}"
            );
        }
        assert_eq!(
            Smb2Error::UnsupportedCommand {
                command: Command::Lock
            }
            .server_action(),
            ServerAction::FailRequest(STATUS_NOT_SUPPORTED)
        );
    }

    #[test]
    fn display_names_the_field_and_the_numbers() {
        let e = Smb2Error::OutOfBounds {
            what: "SMB2 CREATE request",
            field: "NameOffset",
            offset: 100,
            length: 14,
            min: 120,
            limit: 200,
        };
        let s = e.to_string();
        for part in ["CREATE", "NameOffset", "100", "14", "120", "200"] {
            assert!(s.contains(part), "{s}");
        }
        assert_eq!(
            Smb2Error::from(WireError::Truncated {
                what: "w",
                need: 2,
                have: 1
            }),
            Smb2Error::Truncated {
                what: "w",
                need: 2,
                have: 1
            }
        );
    }
}
