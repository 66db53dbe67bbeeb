//! [MS-SMB2] 2.2.1 SMB2 Packet Header, in both forms: 2.2.1.1 (ASYNC) and
//! 2.2.1.2 (SYNC). 64 bytes, little-endian.

use super::error::Smb2Error;
use super::Scalar;
use crate::ntstatus::{NtStatus, STATUS_SUCCESS};

/// Length of the SMB2 header; also its StructureSize.
pub const HEADER_LEN: usize = 64;

/// [MS-SMB2] 2.2.1: ProtocolId of an SMB2 message, 0xFE 'S' 'M' 'B'.
pub const PROTOCOL_ID: [u8; 4] = [0xFE, b'S', b'M', b'B'];
/// [MS-SMB2] 2.2.41: ProtocolId of an SMB2 TRANSFORM_HEADER (encryption).
pub const TRANSFORM_PROTOCOL_ID: [u8; 4] = [0xFD, b'S', b'M', b'B'];
/// [MS-SMB2] 2.2.42: ProtocolId of an SMB2 COMPRESSION_TRANSFORM_HEADER.
pub const COMPRESSION_PROTOCOL_ID: [u8; 4] = [0xFC, b'S', b'M', b'B'];

pub(crate) const WHAT: &str = "SMB2 header";

/// Byte ranges of [MS-SMB2] 2.2.1.1 / 2.2.1.2, in table order.
mod field {
    use crate::smb2::Field;
    pub const PROTOCOL_ID: Field = 0..4;
    pub const STRUCTURE_SIZE: Field = 4..6;
    pub const CREDIT_CHARGE: Field = 6..8;
    /// Status (responses); in SMB 3.x requests ChannelSequence (8..10) and
    /// Reserved (10..12).
    pub const STATUS: Field = 8..12;
    pub const CHANNEL_SEQUENCE: Field = 8..10;
    pub const COMMAND: Field = 12..14;
    /// CreditRequest (requests) / CreditResponse (responses).
    pub const CREDIT: Field = 14..16;
    pub const FLAGS: Field = 16..20;
    pub const NEXT_COMMAND: Field = 20..24;
    pub const MESSAGE_ID: Field = 24..32;
    /// 2.2.1.1 (ASYNC): AsyncId.
    pub const ASYNC_ID: Field = 32..40;
    /// 2.2.1.2 (SYNC): Reserved (the ProcessId of older documents).
    pub const PROCESS_ID: Field = 32..36;
    /// 2.2.1.2 (SYNC): TreeId.
    pub const TREE_ID: Field = 36..40;
    pub const SESSION_ID: Field = 40..48;
    pub const SIGNATURE: Field = 48..64;
}

/// [MS-SMB2] 2.2.1: the Command codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u16)]
pub enum Command {
    /// SMB2 NEGOTIATE (0x0000).
    Negotiate = 0x0000,
    /// SMB2 SESSION_SETUP (0x0001).
    SessionSetup = 0x0001,
    /// SMB2 LOGOFF (0x0002).
    Logoff = 0x0002,
    /// SMB2 TREE_CONNECT (0x0003).
    TreeConnect = 0x0003,
    /// SMB2 TREE_DISCONNECT (0x0004).
    TreeDisconnect = 0x0004,
    /// SMB2 CREATE (0x0005).
    Create = 0x0005,
    /// SMB2 CLOSE (0x0006).
    Close = 0x0006,
    /// SMB2 FLUSH (0x0007).
    Flush = 0x0007,
    /// SMB2 READ (0x0008).
    Read = 0x0008,
    /// SMB2 WRITE (0x0009).
    Write = 0x0009,
    /// SMB2 LOCK (0x000A).
    Lock = 0x000A,
    /// SMB2 IOCTL (0x000B).
    Ioctl = 0x000B,
    /// SMB2 CANCEL (0x000C).
    Cancel = 0x000C,
    /// SMB2 ECHO (0x000D).
    Echo = 0x000D,
    /// SMB2 QUERY_DIRECTORY (0x000E).
    QueryDirectory = 0x000E,
    /// SMB2 CHANGE_NOTIFY (0x000F).
    ChangeNotify = 0x000F,
    /// SMB2 QUERY_INFO (0x0010).
    QueryInfo = 0x0010,
    /// SMB2 SET_INFO (0x0011).
    SetInfo = 0x0011,
    /// SMB2 OPLOCK_BREAK (0x0012).
    OplockBreak = 0x0012,
    /// SMB2 SERVER_TO_CLIENT_NOTIFICATION (0x0013, SMB 3.1.1).
    ServerToClientNotification = 0x0013,
}

impl Command {
    /// Every command, in code order.
    pub const ALL: [Command; 20] = [
        Command::Negotiate,
        Command::SessionSetup,
        Command::Logoff,
        Command::TreeConnect,
        Command::TreeDisconnect,
        Command::Create,
        Command::Close,
        Command::Flush,
        Command::Read,
        Command::Write,
        Command::Lock,
        Command::Ioctl,
        Command::Cancel,
        Command::Echo,
        Command::QueryDirectory,
        Command::ChangeNotify,
        Command::QueryInfo,
        Command::SetInfo,
        Command::OplockBreak,
        Command::ServerToClientNotification,
    ];

    /// The command a wire code names, if [MS-SMB2] 2.2.1 defines it.
    pub fn from_wire(code: u16) -> Option<Command> {
        Command::ALL.get(usize::from(code)).copied()
    }

    /// The wire code.
    pub const fn to_wire(self) -> u16 {
        self as u16
    }
}

bitmask! {
    /// [MS-SMB2] 2.2.1.2 Flags.
    pub struct HeaderFlags(u32) {
        /// SMB2_FLAGS_SERVER_TO_REDIR: this is a response.
        SERVER_TO_REDIR = 0x0000_0001;
        /// SMB2_FLAGS_ASYNC_COMMAND: the header is the ASYNC form (2.2.1.1).
        ASYNC_COMMAND = 0x0000_0002;
        /// SMB2_FLAGS_RELATED_OPERATIONS: related compounded operation.
        RELATED_OPERATIONS = 0x0000_0004;
        /// SMB2_FLAGS_SIGNED.
        SIGNED = 0x0000_0008;
        /// SMB2_FLAGS_PRIORITY_MASK (SMB 3.1.1): I/O priority, 3 bits.
        PRIORITY_MASK = 0x0000_0070;
        /// SMB2_FLAGS_DFS_OPERATIONS.
        DFS_OPERATIONS = 0x1000_0000;
        /// SMB2_FLAGS_REPLAY_OPERATION (SMB 3.x).
        REPLAY_OPERATION = 0x2000_0000;
    }
}

/// A zero-copy view of an SMB2 header ([MS-SMB2] 2.2.1).
#[derive(Debug, Clone)]
pub struct Header<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Header<T> {
    /// Wraps `buffer` without checking it (accessors then read zeros from
    /// a short buffer, never panic).
    pub const fn new_unchecked(buffer: T) -> Self {
        Header { buffer }
    }

    /// Wraps `buffer` (a message: the header and what follows), failing
    /// with `ShortMessage` below 64 bytes, `ProtocolId` unless it starts
    /// 0xFE 'SMB', and `StructureSize` unless StructureSize is 64.
    pub fn new_checked(buffer: T) -> Result<Self, Smb2Error> {
        let b = buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(Smb2Error::ShortMessage { have: b.len() });
        }
        let v = Header::new_unchecked(buffer);
        let found = v.protocol_id();
        if found != PROTOCOL_ID {
            return Err(Smb2Error::ProtocolId { found });
        }
        if v.structure_size() != HEADER_LEN as u16 {
            return Err(Smb2Error::StructureSize {
                what: WHAT,
                expected: HEADER_LEN as u16,
                found: v.structure_size(),
            });
        }
        Ok(v)
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// ProtocolId.
    pub fn protocol_id(&self) -> [u8; 4] {
        let mut a = [0u8; 4];
        if let Some(s) = self.b().get(field::PROTOCOL_ID) {
            a.copy_from_slice(s);
        }
        a
    }
    /// StructureSize (64).
    pub fn structure_size(&self) -> u16 {
        u16::read(self.b(), field::STRUCTURE_SIZE)
    }
    /// CreditCharge.
    pub fn credit_charge(&self) -> u16 {
        u16::read(self.b(), field::CREDIT_CHARGE)
    }
    /// Status (meaningful in responses).
    pub fn status(&self) -> NtStatus {
        NtStatus::read(self.b(), field::STATUS)
    }
    /// ChannelSequence (SMB 3.x requests): the low 16 bits of the Status
    /// field.
    pub fn channel_sequence(&self) -> u16 {
        u16::read(self.b(), field::CHANNEL_SEQUENCE)
    }
    /// Command, as a wire code.
    pub fn command(&self) -> u16 {
        u16::read(self.b(), field::COMMAND)
    }
    /// CreditRequest (requests) / CreditResponse (responses).
    pub fn credit(&self) -> u16 {
        u16::read(self.b(), field::CREDIT)
    }
    /// Flags.
    pub fn flags(&self) -> HeaderFlags {
        HeaderFlags::read(self.b(), field::FLAGS)
    }
    /// NextCommand: offset of the next header of a compound, 0 if last.
    pub fn next_command(&self) -> u32 {
        u32::read(self.b(), field::NEXT_COMMAND)
    }
    /// MessageId.
    pub fn message_id(&self) -> u64 {
        u64::read(self.b(), field::MESSAGE_ID)
    }
    /// AsyncId (ASYNC form).
    pub fn async_id(&self) -> u64 {
        u64::read(self.b(), field::ASYNC_ID)
    }
    /// Reserved / ProcessId (SYNC form).
    pub fn process_id(&self) -> u32 {
        u32::read(self.b(), field::PROCESS_ID)
    }
    /// TreeId (SYNC form).
    pub fn tree_id(&self) -> u32 {
        u32::read(self.b(), field::TREE_ID)
    }
    /// SessionId.
    pub fn session_id(&self) -> u64 {
        u64::read(self.b(), field::SESSION_ID)
    }
    /// Signature.
    pub fn signature(&self) -> [u8; 16] {
        <[u8; 16]>::read(self.b(), field::SIGNATURE)
    }
    /// True when SMB2_FLAGS_ASYNC_COMMAND is set (2.2.1.1 layout).
    pub fn is_async(&self) -> bool {
        self.flags().contains(HeaderFlags::ASYNC_COMMAND)
    }
    /// True when SMB2_FLAGS_SERVER_TO_REDIR is set.
    pub fn is_response(&self) -> bool {
        self.flags().contains(HeaderFlags::SERVER_TO_REDIR)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    fn bm(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }
    /// Sets ProtocolId.
    pub fn set_protocol_id(&mut self, v: [u8; 4]) {
        if let Some(d) = self.bm().get_mut(field::PROTOCOL_ID) {
            d.copy_from_slice(&v);
        }
    }
    /// Sets StructureSize.
    pub fn set_structure_size(&mut self, v: u16) {
        v.write(self.bm(), field::STRUCTURE_SIZE)
    }
    /// Sets CreditCharge.
    pub fn set_credit_charge(&mut self, v: u16) {
        v.write(self.bm(), field::CREDIT_CHARGE)
    }
    /// Sets Status.
    pub fn set_status(&mut self, v: NtStatus) {
        v.write(self.bm(), field::STATUS)
    }
    /// Sets ChannelSequence (and leaves the Reserved half alone).
    pub fn set_channel_sequence(&mut self, v: u16) {
        v.write(self.bm(), field::CHANNEL_SEQUENCE)
    }
    /// Sets Command.
    pub fn set_command(&mut self, v: u16) {
        v.write(self.bm(), field::COMMAND)
    }
    /// Sets CreditRequest / CreditResponse.
    pub fn set_credit(&mut self, v: u16) {
        v.write(self.bm(), field::CREDIT)
    }
    /// Sets Flags.
    pub fn set_flags(&mut self, v: HeaderFlags) {
        v.write(self.bm(), field::FLAGS)
    }
    /// Sets NextCommand.
    pub fn set_next_command(&mut self, v: u32) {
        v.write(self.bm(), field::NEXT_COMMAND)
    }
    /// Sets MessageId.
    pub fn set_message_id(&mut self, v: u64) {
        v.write(self.bm(), field::MESSAGE_ID)
    }
    /// Sets AsyncId.
    pub fn set_async_id(&mut self, v: u64) {
        v.write(self.bm(), field::ASYNC_ID)
    }
    /// Sets Reserved / ProcessId.
    pub fn set_process_id(&mut self, v: u32) {
        v.write(self.bm(), field::PROCESS_ID)
    }
    /// Sets TreeId.
    pub fn set_tree_id(&mut self, v: u32) {
        v.write(self.bm(), field::TREE_ID)
    }
    /// Sets SessionId.
    pub fn set_session_id(&mut self, v: u64) {
        v.write(self.bm(), field::SESSION_ID)
    }
    /// Sets Signature (a signer zeroes it, computes, then sets it:
    /// [MS-SMB2] 3.1.4.1).
    pub fn set_signature(&mut self, v: [u8; 16]) {
        v.write(self.bm(), field::SIGNATURE)
    }
}

/// The identifier that follows MessageId: the ASYNC form carries AsyncId,
/// the SYNC form Reserved (ProcessId) and TreeId.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HeaderId {
    /// 2.2.1.2 SYNC.
    Sync {
        /// Reserved (ProcessId in older documents): the client SHOULD set
        /// 0xFEFF, the server ignores it.
        process_id: u32,
        /// TreeId.
        tree_id: u32,
    },
    /// 2.2.1.1 ASYNC (SMB2_FLAGS_ASYNC_COMMAND set).
    Async {
        /// AsyncId.
        async_id: u64,
    },
}

/// The values of an SMB2 header ([MS-SMB2] 2.2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderRepr {
    /// CreditCharge.
    pub credit_charge: u16,
    /// Status in responses. In SMB 3.x requests the field is ChannelSequence
    /// (low 16 bits) and Reserved; see [`HeaderRepr::channel_sequence`].
    pub status: NtStatus,
    /// Command.
    pub command: Command,
    /// CreditRequest (requests) / CreditResponse (responses).
    pub credit: u16,
    /// Flags, as on the wire. [`emit`](Self::emit) sets or clears
    /// SMB2_FLAGS_ASYNC_COMMAND to match [`id`](Self::id).
    pub flags: HeaderFlags,
    /// NextCommand (0 for the last, or only, message).
    pub next_command: u32,
    /// MessageId.
    pub message_id: u64,
    /// AsyncId, or Reserved and TreeId.
    pub id: HeaderId,
    /// SessionId.
    pub session_id: u64,
    /// Signature (all zero when not signed).
    pub signature: [u8; 16],
}

impl HeaderRepr {
    /// A SYNC request header: CreditCharge 1, CreditRequest 1, everything
    /// else zero.
    pub fn request(command: Command, message_id: u64) -> HeaderRepr {
        HeaderRepr {
            credit_charge: 1,
            status: STATUS_SUCCESS,
            command,
            credit: 1,
            flags: HeaderFlags::empty(),
            next_command: 0,
            message_id,
            id: HeaderId::Sync {
                process_id: 0,
                tree_id: 0,
            },
            session_id: 0,
            signature: [0; 16],
        }
    }

    /// The header of the response to the request `self` ([MS-SMB2]
    /// 3.3.4.1): same Command, MessageId, CreditCharge, SessionId and
    /// TreeId/AsyncId; SMB2_FLAGS_SERVER_TO_REDIR set,
    /// SMB2_FLAGS_RELATED_OPERATIONS and the ASYNC flag kept; CreditResponse
    /// 0 (the caller grants), NextCommand 0, Signature zero.
    pub fn response_to(&self, status: NtStatus) -> HeaderRepr {
        let kept = self.flags & (HeaderFlags::RELATED_OPERATIONS | HeaderFlags::ASYNC_COMMAND);
        HeaderRepr {
            credit_charge: self.credit_charge,
            status,
            command: self.command,
            credit: 0,
            flags: kept | HeaderFlags::SERVER_TO_REDIR,
            next_command: 0,
            message_id: self.message_id,
            id: self.id,
            session_id: self.session_id,
            signature: [0; 16],
        }
    }

    /// [MS-SMB2] 3.1.5.2: the CreditCharge of a request whose payload (the
    /// larger of what it sends and what it expects back) is `payload_len`
    /// bytes: `(payload_len - 1) / 65536 + 1`, at least 1.
    pub fn credit_charge_for(payload_len: u64) -> u16 {
        let charge = payload_len.saturating_sub(1) / 65536 + 1;
        u16::try_from(charge).unwrap_or(u16::MAX)
    }

    /// ChannelSequence, when this is an SMB 3.x request.
    pub fn channel_sequence(&self) -> u16 {
        (self.status.0 & 0xFFFF) as u16
    }

    /// TreeId of a SYNC header (`None` for ASYNC).
    pub fn tree_id(&self) -> Option<u32> {
        match self.id {
            HeaderId::Sync { tree_id, .. } => Some(tree_id),
            HeaderId::Async { .. } => None,
        }
    }

    /// AsyncId of an ASYNC header.
    pub fn async_id(&self) -> Option<u64> {
        match self.id {
            HeaderId::Async { async_id } => Some(async_id),
            HeaderId::Sync { .. } => None,
        }
    }

    /// True when SMB2_FLAGS_SERVER_TO_REDIR is set.
    pub fn is_response(&self) -> bool {
        self.flags.contains(HeaderFlags::SERVER_TO_REDIR)
    }

    /// True when SMB2_FLAGS_RELATED_OPERATIONS is set.
    pub fn is_related(&self) -> bool {
        self.flags.contains(HeaderFlags::RELATED_OPERATIONS)
    }

    /// Reads a checked view; fails with `UnknownCommand` for a Command code
    /// [MS-SMB2] 2.2.1 does not define.
    pub fn parse<T: AsRef<[u8]>>(h: &Header<T>) -> Result<HeaderRepr, Smb2Error> {
        let code = h.command();
        let command =
            Command::from_wire(code).ok_or(Smb2Error::UnknownCommand { command: code })?;
        let id = if h.is_async() {
            HeaderId::Async {
                async_id: h.async_id(),
            }
        } else {
            HeaderId::Sync {
                process_id: h.process_id(),
                tree_id: h.tree_id(),
            }
        };
        Ok(HeaderRepr {
            credit_charge: h.credit_charge(),
            status: h.status(),
            command,
            credit: h.credit(),
            flags: h.flags(),
            next_command: h.next_command(),
            message_id: h.message_id(),
            id,
            session_id: h.session_id(),
            signature: h.signature(),
        })
    }

    /// Checks and parses the first 64 bytes of `message`.
    pub fn from_bytes(message: &[u8]) -> Result<HeaderRepr, Smb2Error> {
        HeaderRepr::parse(&Header::new_checked(message)?)
    }

    /// 64.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header into the first 64 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        super::layout::room(WHAT, buf, HEADER_LEN)?;
        let mut h = Header::new_unchecked(&mut buf[..HEADER_LEN]);
        h.set_protocol_id(PROTOCOL_ID);
        h.set_structure_size(HEADER_LEN as u16);
        h.set_credit_charge(self.credit_charge);
        h.set_status(self.status);
        h.set_command(self.command.to_wire());
        h.set_credit(self.credit);
        let flags = match self.id {
            HeaderId::Sync {
                process_id,
                tree_id,
            } => {
                h.set_process_id(process_id);
                h.set_tree_id(tree_id);
                self.flags.without(HeaderFlags::ASYNC_COMMAND)
            }
            HeaderId::Async { async_id } => {
                h.set_async_id(async_id);
                self.flags.with(HeaderFlags::ASYNC_COMMAND)
            }
        };
        h.set_flags(flags);
        h.set_next_command(self.next_command);
        h.set_message_id(self.message_id);
        h.set_session_id(self.session_id);
        h.set_signature(self.signature);
        Ok(HEADER_LEN)
    }
}
