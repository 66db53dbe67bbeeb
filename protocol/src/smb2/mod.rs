//! SMB2 wire layer ([MS-SMB2] section 2), sans-IO: the messages the next
//! server and client speak over SMB Direct, plus the compounding walker.
//!
//! Shape (see `../shared/STYLE.md`): every message has a zero-copy view
//! (`new_checked` validates the fixed part *and* every offset/length pair
//! once, so no accessor can panic or read out of range afterwards; setters
//! for emission) and a `Repr` value struct with `parse`/`emit`/`buffer_len`.
//! Field ranges are named after the [MS-SMB2] tables, relative to the first
//! byte of the structure.
//!
//! # Framing
//! Over SMB Direct an SMB2 message (possibly a compound chain) is one
//! upper-layer message: there is no 4-byte Direct TCP transport header
//! ([MS-SMB2] 2.1). [`compound`] walks the chain; each [`Message`] is a
//! 64-byte header ([`Header`], [`HeaderRepr`]) and a body.
//!
//! # Offsets
//! Every `*Offset` field of an SMB2 body counts from the first byte of the
//! SMB2 header ([MS-SMB2] 2.2.x). Body views wrap the bytes *after* the
//! header (up to NextCommand, or the end of the message) and translate.
//!
//! # Receive rules, stated once
//! - StructureSize must equal the value the command's section fixes; a wrong
//!   one is [`Smb2Error::StructureSize`] (STATUS_INVALID_PARAMETER). An odd
//!   StructureSize counts one byte of the variable Buffer, which a sender may
//!   leave out: a body must hold `StructureSize & !1` bytes.
//! - A variable buffer of length 0 has its offset ignored. A non-empty one
//!   must start at or after the end of the fixed part and end inside the
//!   message ([`Smb2Error::OutOfBounds`]); two buffers of one message must not
//!   overlap ([`Smb2Error::Overlap`]). [MS-SMB2] 3.3.5.2.6 maps every such
//!   request to STATUS_INVALID_PARAMETER.
//! - Where [MS-SMB2] says a structure is 8-byte aligned (negotiate contexts,
//!   create contexts, NextCommand) a misaligned offset is
//!   [`Smb2Error::Misaligned`].
//!
//! # Emit rules
//! `emit` writes into a caller buffer, zeroes padding and reserved fields,
//! places variable buffers right after the fixed part (8-byte aligned where
//! [MS-SMB2] expects it: negotiate contexts, create contexts, IOCTL output,
//! channel info after inline data) and always writes at least StructureSize
//! bytes (one zero byte of Buffer for an odd StructureSize with no variable
//! data). It fails with [`Smb2Error::BufferTooSmall`] rather than panic.

#[macro_use]
mod bitmask;
#[macro_use]
mod body;
#[macro_use]
mod output_response;

pub mod auth;
mod cancel;
mod change_notify;
mod channel;
mod close;
mod compound;
mod create;
mod create_context;
mod echo;
mod error;
mod error_response;
mod file_id;
mod flush;
pub mod fscc;
mod header;
mod ioctl;
mod layout;
mod lock;
mod logoff;
mod message;
mod negotiate;
mod negotiate_context;
mod netif;
mod oplock_break;
mod query_directory;
mod query_info;
mod read;
mod session_setup;
mod set_info;
mod tree_connect;
mod tree_disconnect;
mod u16_array;
mod utf16;
mod validate_negotiate;
mod write;

pub use crate::sqos::Guid;
pub use body::Smb2Body;
pub use cancel::{CancelRequest, CancelRequestRepr};
pub use change_notify::{
    ChangeNotifyFlags, ChangeNotifyRequest, ChangeNotifyRequestRepr, ChangeNotifyResponse,
    ChangeNotifyResponseRepr, CompletionFilter,
};
pub use channel::{Channel, ChannelInfo};
pub use close::{CloseFlags, CloseRequest, CloseRequestRepr, CloseResponse, CloseResponseRepr};
pub use compound::{compound, CompoundIter, CompoundWriter, Message};
pub use create::{
    AccessMask, CreateAction, CreateDisposition, CreateOptions, CreateRequest, CreateRequestRepr,
    CreateResponse, CreateResponseFlags, CreateResponseRepr, FileAttributes, ImpersonationLevel,
    OplockLevel, ShareAccess,
};
pub use create_context::{
    CreateContext, CreateContextIter, CreateContextList, CreateContextRequest,
    DurableHandleRequestV2, LeaseFlags, LeaseRequest, LeaseRequestV2, LeaseState,
    MaximalAccessRequest, MaximalAccessResponse, QueryOnDiskIdResponse,
    SMB2_CREATE_ALLOCATION_SIZE, SMB2_CREATE_APP_INSTANCE_ID, SMB2_CREATE_DURABLE_HANDLE_RECONNECT,
    SMB2_CREATE_DURABLE_HANDLE_RECONNECT_V2, SMB2_CREATE_DURABLE_HANDLE_REQUEST,
    SMB2_CREATE_DURABLE_HANDLE_REQUEST_V2, SMB2_CREATE_EA_BUFFER, SMB2_CREATE_POSIX_CONTEXT,
    SMB2_CREATE_QUERY_MAXIMAL_ACCESS_REQUEST, SMB2_CREATE_QUERY_MAXIMAL_ACCESS_RESPONSE,
    SMB2_CREATE_QUERY_ON_DISK_ID, SMB2_CREATE_REQUEST_LEASE, SMB2_CREATE_SD_BUFFER,
    SMB2_CREATE_TIMEWARP_TOKEN,
};
pub use echo::{EchoRequest, EchoRequestRepr, EchoResponse, EchoResponseRepr};
pub use error::{ServerAction, Smb2Error};
pub use error_response::{ErrorContext, ErrorContextIter, ErrorResponse, ErrorResponseRepr};
pub use file_id::FileId;
pub use flush::{FlushRequest, FlushRequestRepr, FlushResponse, FlushResponseRepr};
pub use header::{
    Command, Header, HeaderFlags, HeaderId, HeaderRepr, COMPRESSION_PROTOCOL_ID, HEADER_LEN,
    PROTOCOL_ID, TRANSFORM_PROTOCOL_ID,
};
pub use ioctl::{
    DfsReferralRequest, IoctlFlags, IoctlRequest, IoctlRequestRepr, IoctlResponse,
    IoctlResponseRepr, FSCTL_DFS_GET_REFERRALS, FSCTL_DFS_GET_REFERRALS_EX, FSCTL_PIPE_TRANSCEIVE,
    FSCTL_PIPE_WAIT, FSCTL_QUERY_NETWORK_INTERFACE_INFO, FSCTL_STORAGE_QOS_CONTROL,
    FSCTL_VALIDATE_NEGOTIATE_INFO,
};
pub use lock::{
    LockElement, LockElements, LockFlags, LockOperation, LockRequest, LockRequestRepr,
    LockResponse, LockResponseRepr,
};
pub use logoff::{LogoffRequest, LogoffRequestRepr, LogoffResponse, LogoffResponseRepr};
pub use message::{emit_message, RequestBody, ResponseBody};
pub use negotiate::{
    Capabilities, Dialect, NegotiateRequest, NegotiateRequestRepr, NegotiateResponse,
    NegotiateResponseRepr, SecurityMode,
};
pub use negotiate_context::{
    Cipher, CompressionAlgorithm, CompressionCapabilities, CompressionCapabilityFlags,
    EncryptionCapabilities, HashAlgorithm, NegotiateContext, NegotiateContextIter,
    NegotiateContextList, NegotiateContextType, PreauthIntegrityCapabilities,
    RdmaTransformCapabilities, RdmaTransformId, SigningAlgorithm, SigningCapabilities,
    TransportCapabilities, TransportCapabilityFlags, POSIX_EXTENSIONS_GUID,
    SMB2_POSIX_EXTENSIONS_AVAILABLE,
};
pub use netif::{
    InterfaceCapability, NetworkInterfaceInfoIter, NetworkInterfaceInfoList,
    NetworkInterfaceInfoRepr, AF_INET6_WIRE, AF_INET_WIRE,
};
pub use oplock_break::{
    LeaseBreak, LeaseBreakAckRepr, OplockBreak, OplockBreakAckRepr, OplockBreakRepr,
};
pub use query_directory::{
    QueryDirectoryFlags, QueryDirectoryRequest, QueryDirectoryRequestRepr, QueryDirectoryResponse,
    QueryDirectoryResponseRepr,
};
pub use query_info::{
    fit_query_info_output, AdditionalInformation, InfoType, QueryInfoFlags, QueryInfoRequest,
    QueryInfoRequestRepr, QueryInfoResponse, QueryInfoResponseRepr,
};
pub use read::{ReadFlags, ReadRequest, ReadRequestRepr, ReadResponse, ReadResponseRepr};
pub use session_setup::{
    SessionFlags, SessionSetupFlags, SessionSetupRequest, SessionSetupRequestRepr,
    SessionSetupResponse, SessionSetupResponseRepr,
};
pub use set_info::{SetInfoRequest, SetInfoRequestRepr, SetInfoResponse, SetInfoResponseRepr};
pub use tree_connect::{
    ShareCapabilities, ShareFlags, ShareType, TreeConnectFlags, TreeConnectRequest,
    TreeConnectRequestRepr, TreeConnectResponse, TreeConnectResponseRepr,
};
pub use tree_disconnect::{
    TreeDisconnectRequest, TreeDisconnectRequestRepr, TreeDisconnectResponse,
    TreeDisconnectResponseRepr,
};
pub use u16_array::U16Array;
pub use utf16::Utf16Str;
pub use validate_negotiate::{
    ValidateNegotiateInfoRequest, ValidateNegotiateInfoRequestRepr, ValidateNegotiateInfoResponse,
    ValidateNegotiateInfoResponseRepr,
};
pub use write::{WriteFlags, WriteRequest, WriteRequestRepr, WriteResponse, WriteResponseRepr};

/// A byte range of a fixed-layout field.
pub(crate) type Field = core::ops::Range<usize>;

/// A value stored in a fixed-layout field, little-endian ([MS-SMB2] 1.3:
/// "all multi-byte fields are little-endian"). Reads of a range the buffer
/// does not cover yield zero and such writes are dropped, so even a view made
/// with `new_unchecked` over a short buffer cannot panic.
pub(crate) trait Scalar: Copy {
    fn read(b: &[u8], f: Field) -> Self;
    fn write(self, b: &mut [u8], f: Field);
}

fn read_array<const N: usize>(b: &[u8], f: Field) -> [u8; N] {
    let mut a = [0u8; N];
    if let Some(src) = b.get(f) {
        if src.len() == N {
            a.copy_from_slice(src);
        }
    }
    a
}

fn write_bytes(b: &mut [u8], f: Field, v: &[u8]) {
    if let Some(dst) = b.get_mut(f) {
        if dst.len() == v.len() {
            dst.copy_from_slice(v);
        }
    }
}

macro_rules! scalar_int {
    ($($t:ty),*) => {$(
        impl Scalar for $t {
            #[inline]
            fn read(b: &[u8], f: Field) -> Self {
                <$t>::from_le_bytes(read_array(b, f))
            }
            #[inline]
            fn write(self, b: &mut [u8], f: Field) {
                write_bytes(b, f, &self.to_le_bytes())
            }
        }
    )*};
}
scalar_int!(u8, u16, u32, u64);

impl Scalar for [u8; 16] {
    fn read(b: &[u8], f: Field) -> Self {
        read_array(b, f)
    }
    fn write(self, b: &mut [u8], f: Field) {
        write_bytes(b, f, &self)
    }
}

impl Scalar for crate::sqos::Guid {
    fn read(b: &[u8], f: Field) -> Self {
        crate::sqos::Guid::from_bytes(read_array(b, f))
    }
    fn write(self, b: &mut [u8], f: Field) {
        write_bytes(b, f, self.as_bytes())
    }
}

impl Scalar for crate::ntstatus::NtStatus {
    fn read(b: &[u8], f: Field) -> Self {
        crate::ntstatus::NtStatus(u32::read(b, f))
    }
    fn write(self, b: &mut [u8], f: Field) {
        self.0.write(b, f)
    }
}
