//! # smbdirect-protocol
//!
//! The sans-IO protocol core of smbdirectd: wire codecs and state machines for
//! the SMB2 RDMA Transport ([MS-SMBD] v13.0) and the Storage Quality of Service
//! protocol ([MS-SQOS] v8.0). Nothing in this crate performs I/O or reads a
//! clock: bytes and time are inputs, and what the caller must do (post
//! receives, send bytes, deliver a message, terminate) is an output.
//!
//! Shape (see `../shared/STYLE.md`):
//! - wire codecs follow smoltcp: a checked zero-copy view over untrusted bytes
//!   (`new_checked`) plus a `Repr` value struct with `parse`/`emit`/`buffer_len`;
//! - the connection follows quinn-proto: events in, actions out, time passed in.
//!
//! Where the specifications are silent or inconsistent, the choice made is
//! written down once in `docs/spec-notes.md`.
#![forbid(unsafe_code)]
#![warn(missing_debug_implementations)]

pub mod ntstatus;
pub mod smb2;
pub mod smbd;
pub mod sqos;
pub mod time;

/// Error returned by every wire decoder when untrusted bytes do not form the
/// structure being parsed. Decoders never panic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireError {
    /// The buffer is shorter than the structure's fixed part (or than a
    /// length field says it must be).
    Truncated {
        /// Which structure was being decoded.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// A field holds a value the specification forbids.
    Malformed {
        /// Which structure was being decoded.
        what: &'static str,
        /// Which field is wrong.
        field: &'static str,
    },
}

impl core::fmt::Display for WireError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            WireError::Truncated { what, need, have } => {
                write!(f, "{what}: truncated ({have} bytes, need {need})")
            }
            WireError::Malformed { what, field } => write!(f, "{what}: malformed field {field}"),
        }
    }
}

impl std::error::Error for WireError {}
