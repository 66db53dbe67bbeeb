//! The SMB2 client over SMB Direct ([MS-SMB2] 3.2, [MS-SMBD] 3.1.4): what
//! the bench tool and the end-to-end tests drive the `smb2` upper layer
//! with.
//!
//! [`Smb2Client`] wraps one [`Client`] (an SMB Direct connection polled from
//! the calling thread) and speaks SMB2 on it through the
//! `smbdirect_protocol::smb2` codecs.
//!
//! # Two ways to call
//! - Synchronous: [`Smb2Client::negotiate`], [`session_setup_anonymous`],
//!   [`tree_connect`], [`create`], [`read`], [`write`], [`ioctl`], the
//!   Storage QoS helpers ... send one request and busy-poll until its
//!   response. They wait for SMB2 credits themselves.
//! - Pipelined: [`submit_read`], [`submit_write`], [`submit_flush`],
//!   [`submit_echo`] send without waiting and return the request's
//!   [`MessageId`]; [`poll`] hands out [`Completion`]s in arrival order and
//!   [`wait`] waits for one request. A caller keeps `--queue-depth N`
//!   requests outstanding by submitting until N are out, then polling one
//!   completion and submitting again.
//!
//! # Credits and MessageIds ([MS-SMB2] 3.2.4.1.3, 3.2.4.1.5, 3.2.4.1.6, 3.2.5.1.4)
//! [`CreditWindow`] is the sequence window: it starts as `{0}` (one
//! credit), a request consumes CreditCharge consecutive MessageIds (the
//! lowest available), every response (interim ones included) adds its
//! CreditResponse. A request is never sent with more CreditCharge than the
//! credits held. Each request's CreditRequest tops the credits held plus the
//! credits still expected from outstanding requests up to
//! [`Smb2ClientOptions::credit_target`] (512 by default), and asks at least
//! its own charge back, so a queue depth of 32 and more keeps flowing.
//! CreditCharge is `(payload - 1) / 65536 + 1` for READ, WRITE and IOCTL
//! when the server offers SMB2_GLOBAL_CAP_LARGE_MTU, 1 for every other
//! command, and 0 (one credit, payload at most 64 KiB) without multi-credit
//! support and for NEGOTIATE.
//!
//! A `submit_*` that lacks credits fails with [`Smb2Error::NoCredits`]
//! and changes nothing: poll completions (each brings credits back), then
//! submit again. Synchronous calls poll outstanding requests until the
//! credits are there; with nothing outstanding they ask for more with an
//! ECHO, and fail with `NoCredits` only when that does not help.
//!
//! # Buffers and RDMA ([MS-SMB2] 3.2.4.6, 3.2.4.7, 3.2.5.12, 3.2.5.13)
//! Data of pipelined I/O lives in [`IoBuf`]s: buffers of the connection's
//! pool slice, allocated once ([`Smb2Client::alloc_io_buf`]) and reused
//! for every I/O (nothing is allocated per I/O in a steady submit/poll
//! loop). A submit lends the buffer to the request; its [`Completion`]
//! gives it back, and only then can [`Smb2Client::io_buf`] read it. The
//! buffers come from the slice's size classes, so size the pool for them
//! (a class the SMB Direct receives or sends use is shared with them).
//!
//! [`Transfer::Rdma`] splits the buffer into `descriptors` ranges, grants
//! the server access to each through its own memory window ([MS-SMBD]
//! 3.1.4.3) and sends them as SMB_DIRECT_BUFFER_DESCRIPTOR_V1s with
//! SMB2_CHANNEL_RDMA_V1, or SMB2_CHANNEL_RDMA_V1_INVALIDATE (SMB 3.0.2 and
//! later) when `invalidate` is set. When the response arrives every grant
//! is revoked ([MS-SMBD] 3.1.4.4); the first, when the response's Send with
//! Invalidate invalidated its token, is only handed back to the provider
//! (its memory window is reusable after that); a response that invalidated
//! any other token fails the request with
//! [`ProtocolError::InvalidatedToken`]. A buffer whose revoke fails is
//! never lent or freed again.
//!
//! # Errors
//! A response with a non-success status is [`Smb2Error::Status`] (IOCTL
//! and READ also accept STATUS_BUFFER_OVERFLOW, which carries data); a
//! response that does not decode or does not fit its request is
//! [`Smb2Error::Protocol`]; a failed or timed-out connection is
//! [`Smb2Error::Transport`], and every outstanding request completes with
//! it. A message that answers no outstanding request is discarded and
//! counted ([MS-SMB2] 3.2.5.1.3). Nothing here panics on server input.
//!
//! Not implemented: signing, encryption, the preauthentication integrity
//! hash (the 3.1.1 context is sent and checked, but no hash is kept: an
//! anonymous session derives no keys), CANCEL, compounds, async
//! (STATUS_PENDING) responses beyond counting their credits.
//!
//! [`session_setup_anonymous`]: Smb2Client::session_setup_anonymous
//! [`tree_connect`]: Smb2Client::tree_connect
//! [`create`]: Smb2Client::create
//! [`read`]: Smb2Client::read
//! [`write`]: Smb2Client::write
//! [`ioctl`]: Smb2Client::ioctl
//! [`submit_read`]: Smb2Client::submit_read
//! [`submit_write`]: Smb2Client::submit_write
//! [`submit_flush`]: Smb2Client::submit_flush
//! [`submit_echo`]: Smb2Client::submit_echo
//! [`poll`]: Smb2Client::poll
//! [`wait`]: Smb2Client::wait

use crate::client::{buffer_descriptor, Client, ClientError};
use crate::idhash::{id_map, IdMap};
use crate::provider::{Access, Grant, MemoryRegion, Provider, ProviderError, QpCaps, QueuePair};
use smbdirect_hugepages::{BufId, BufferPool, SliceAllocator};
use smbdirect_protocol::ntstatus::*;
use smbdirect_protocol::smb2 as wire;
use smbdirect_protocol::smb2::{
    AccessMask, Capabilities, Channel, ChannelInfo, CloseFlags, CloseRequestRepr, Command,
    CreateAction, CreateContextList, CreateDisposition, CreateOptions, CreateRequestRepr, Dialect,
    EchoRequestRepr, FileAttributes, FileId, FlushRequestRepr, Guid, HashAlgorithm, HeaderFlags,
    HeaderId, HeaderRepr, ImpersonationLevel, IoctlRequestRepr, LogoffRequestRepr,
    NegotiateContext, NegotiateContextList, NegotiateContextType, NegotiateRequestRepr,
    OplockLevel, PreauthIntegrityCapabilities, ReadFlags, ReadRequestRepr, ResponseBody,
    SecurityMode, SessionFlags, SessionSetupFlags, SessionSetupRequestRepr, ShareAccess,
    ShareCapabilities, ShareFlags, ShareType, Smb2Body, TreeConnectFlags, TreeConnectRequestRepr,
    TreeDisconnectRequestRepr, U16Array, Utf16Str, WriteFlags, WriteRequestRepr, HEADER_LEN,
};
use smbdirect_protocol::smbd::wire::BufferDescriptorRepr;
use smbdirect_protocol::smbd::{SendError, SmbdConfig};
use smbdirect_protocol::sqos::client::{ClientRequest, LogicalFlow, PolicyParams};
use smbdirect_protocol::sqos::{Options as QosOptions, StorageQosControlResponseRepr};
use smbdirect_protocol::time::Instant as PInstant;
use smbdirect_protocol::WireError;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use smbdirect_protocol::sqos::FSCTL_STORAGE_QOS_CONTROL;

/// [MS-SMB2] 2.2.1.2: the Reserved (ProcessId) value a client SHOULD send.
const PROCESS_ID: u32 = 0xFEFF;
/// Work-request id of grants and revokes (kind 0: the endpoint ignores
/// their completions, which only retire send-queue slots).
const LOCAL_WR_ID: u64 = 0;
/// [MS-SMB2] 2.2.20: header plus the READ response's fixed part, where
/// inline data starts (DataOffset 0x50).
const READ_RESPONSE_DATA_OFFSET: u32 = 80;
/// [MS-SMB2] 2.2.21: header plus the WRITE request's fixed part.
const WRITE_REQUEST_DATA_OFFSET: u32 = 112;
/// [MS-SMBD] 2.2.3.1: bytes of one SMB_DIRECT_BUFFER_DESCRIPTOR_V1.
const DESCRIPTOR_LEN: usize = 16;
/// Descriptors whose array still fits the 16-bit ChannelInfoLength.
pub const MAX_DESCRIPTORS: usize = u16::MAX as usize / DESCRIPTOR_LEN;
/// Descriptors per I/O buffer the client keeps room for without allocating
/// (more grow that buffer's list once).
const GRANTS_PER_BUFFER: usize = 16;
/// [MS-SMB2] 3.2.5.2: a client SHOULD disconnect when MaxTransactSize,
/// MaxReadSize or MaxWriteSize is below this.
pub const MIN_SERVER_IO_SIZE: u32 = 65_536;
/// Idle polls before the busy-poll loops yield the core once.
const IDLE_SPINS: u32 = 64;
/// Grants and revokes posted between two drains of the completion queue
/// (half the send-queue room [`Client`] keeps for them).
const LOCAL_WR_BATCH: u32 = 32;
/// Of the grants and revokes, every this many is signaled (see
/// [`Smb2Client::local_wr_signaled`]): twice per batch, so a drain finds
/// the first half retired even when the second's completion is still on
/// its way.
const LOCAL_WR_SIGNAL_EVERY: u32 = LOCAL_WR_BATCH / 2;
/// Bound on the steps of one drain (each polls up to 16 completions).
const MAX_DRAIN_STEPS: u32 = 64;

// ---------------------------------------------------------------------------
// Errors

/// Why an SMB2 request failed.
#[derive(Debug, Clone)]
pub enum Smb2Error {
    /// The server answered with this (non-success) status.
    Status(NtStatus),
    /// The server's response is malformed or does not fit the request.
    Protocol(ProtocolError),
    /// The SMB Direct connection failed (or the response did not arrive in
    /// time); every outstanding request completes with this.
    Transport(Arc<ClientError>),
    /// Not enough SMB2 credits to send now: poll completions, then retry.
    /// Nothing was sent and nothing changed.
    NoCredits {
        /// Credits the request consumes (its CreditCharge).
        need: u16,
        /// Credits held.
        have: u32,
    },
    /// The call does not fit this connection (a length over the server's
    /// limits, a busy or stale [`IoBuf`], no NEGOTIATE yet, ...).
    Invalid(String),
    /// A local resource ran out: pool buffers, memory-window grant slots.
    Resources(String),
}

impl Smb2Error {
    /// The server's status, for [`Smb2Error::Status`].
    pub fn status(&self) -> Option<NtStatus> {
        match self {
            Smb2Error::Status(s) => Some(*s),
            _ => None,
        }
    }

    fn transport(e: ClientError) -> Self {
        Smb2Error::Transport(Arc::new(e))
    }
}

impl core::fmt::Display for Smb2Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Smb2Error::Status(s) => write!(f, "server returned {s}"),
            Smb2Error::Protocol(e) => write!(f, "invalid SMB2 response: {e}"),
            Smb2Error::Transport(e) => write!(f, "SMB Direct transport: {e}"),
            Smb2Error::NoCredits { need, have } => write!(
                f,
                "not enough SMB2 credits: the request needs {need}, {have} held \
                 (poll completions and retry)"
            ),
            Smb2Error::Invalid(s) => f.write_str(s),
            Smb2Error::Resources(s) => write!(f, "out of local resources: {s}"),
        }
    }
}

impl std::error::Error for Smb2Error {}

/// A response that does not decode, or does not fit its request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtocolError {
    /// The body does not decode as the command's response.
    Decode {
        /// MessageId of the response.
        message_id: u64,
        /// Its Command.
        command: Command,
        /// Why.
        error: wire::Smb2Error,
    },
    /// The response's Command is not the request's ([MS-SMB2] 3.2.5.1.8).
    CommandMismatch {
        /// MessageId of the response.
        message_id: u64,
        /// The request's Command.
        sent: Command,
        /// The response's Command.
        received: Command,
    },
    /// A field holds a value the request rules out.
    Field {
        /// MessageId of the response.
        message_id: u64,
        /// Its Command.
        command: Command,
        /// Which field.
        field: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// The response's Send with Invalidate invalidated a token other than
    /// the request's first buffer descriptor's ([MS-SMBD] 3.1.4.2).
    InvalidatedToken {
        /// MessageId of the response.
        message_id: u64,
        /// The first descriptor's token.
        expected: u32,
        /// The token the server invalidated.
        found: u32,
    },
    /// The IOCTL output is not a STORAGE_QOS_CONTROL_RESPONSE ([MS-SQOS]
    /// 2.2.2.3).
    Qos(WireError),
}

impl core::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ProtocolError::Decode {
                message_id,
                command,
                error,
            } => write!(f, "MessageId {message_id} ({command:?}): {error}"),
            ProtocolError::CommandMismatch {
                message_id,
                sent,
                received,
            } => write!(
                f,
                "MessageId {message_id}: response Command {received:?} to a {sent:?} request"
            ),
            ProtocolError::Field {
                message_id,
                command,
                field,
                detail,
            } => write!(f, "MessageId {message_id} ({command:?}): {field}: {detail}"),
            ProtocolError::InvalidatedToken {
                message_id,
                expected,
                found,
            } => write!(
                f,
                "MessageId {message_id}: Send with Invalidate of token {found:#x}, \
                 the first buffer descriptor's is {expected:#x}"
            ),
            ProtocolError::Qos(e) => write!(f, "STORAGE_QOS_CONTROL_RESPONSE: {e}"),
        }
    }
}

fn field_error(h: &HeaderRepr, field: &'static str, detail: String) -> Smb2Error {
    Smb2Error::Protocol(ProtocolError::Field {
        message_id: h.message_id,
        command: h.command,
        field,
        detail,
    })
}

// ---------------------------------------------------------------------------
// Public value types

/// The MessageId of a request: the handle of a submitted request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(pub u64);

/// How READ and WRITE data travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transfer {
    /// In the SMB2 message (SMB2_CHANNEL_NONE).
    #[default]
    Inline,
    /// By RDMA from/to the client's buffer, split into `descriptors`
    /// granted ranges (SMB2_CHANNEL_RDMA_V1, or _INVALIDATE when
    /// `invalidate` is set).
    Rdma {
        /// Buffer descriptors (memory windows), 1..=[`MAX_DESCRIPTORS`] and
        /// at most the transfer length.
        descriptors: usize,
        /// Ask the server to invalidate the first descriptor's token with
        /// its response (SMB 3.0.2 and later).
        invalidate: bool,
    },
}

/// A pool buffer lent to pipelined I/O: allocate with
/// [`Smb2Client::alloc_io_buf`], pass to `submit_*`, get back in the
/// [`Completion`]. A plain handle: copying it does not copy the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IoBuf {
    index: u32,
    generation: u32,
}

/// A finished request.
#[derive(Debug)]
pub struct Completion {
    /// The request.
    pub id: MessageId,
    /// Its command.
    pub command: Command,
    /// Bytes read or written (0 for other commands), or why it failed.
    pub result: Result<u32, Smb2Error>,
    /// The buffer the request borrowed, free again.
    pub buf: Option<IoBuf>,
    /// From the submit to the response.
    pub latency: Duration,
}

/// What NEGOTIATE settled ([MS-SMB2] 3.2.5.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NegotiateInfo {
    /// Connection.Dialect.
    pub dialect: Dialect,
    /// The server's SecurityMode.
    pub security_mode: SecurityMode,
    /// Connection.ServerCapabilities.
    pub capabilities: Capabilities,
    /// Connection.ServerGuid.
    pub server_guid: Guid,
    /// Connection.MaxTransactSize.
    pub max_transact_size: u32,
    /// Connection.MaxReadSize.
    pub max_read_size: u32,
    /// Connection.MaxWriteSize.
    pub max_write_size: u32,
    /// The server's SystemTime (FILETIME).
    pub system_time: u64,
    /// Connection.PreauthIntegrityHashId (3.1.1).
    pub preauth_hash: Option<HashAlgorithm>,
    /// The server's preauthentication salt (3.1.1).
    pub server_salt: Vec<u8>,
}

/// An established session ([MS-SMB2] 3.2.5.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionInfo {
    /// SessionId.
    pub session_id: u64,
    /// SessionFlags (IS_NULL for an anonymous session, IS_GUEST).
    pub flags: SessionFlags,
}

/// A connected tree ([MS-SMB2] 3.2.5.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeInfo {
    /// TreeId.
    pub tree_id: u32,
    /// ShareType.
    pub share_type: ShareType,
    /// ShareFlags.
    pub share_flags: ShareFlags,
    /// Capabilities.
    pub capabilities: ShareCapabilities,
    /// MaximalAccess.
    pub maximal_access: AccessMask,
}

/// An open ([MS-SMB2] 3.2.5.5, 2.2.14).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreateInfo {
    /// FileId.
    pub file_id: FileId,
    /// CreateAction.
    pub action: CreateAction,
    /// EndofFile.
    pub end_of_file: u64,
    /// AllocationSize.
    pub allocation_size: u64,
    /// FileAttributes.
    pub attributes: FileAttributes,
    /// OplockLevel granted.
    pub oplock_level: OplockLevel,
    /// LastWriteTime (FILETIME).
    pub last_write_time: u64,
}

/// Settings of an [`Smb2Client`].
#[derive(Debug, Clone)]
pub struct Smb2ClientOptions {
    /// Credits to keep granted (plus expected): CreditRequest sizing.
    pub credit_target: u16,
    /// How long a synchronous call (and [`Smb2Client::wait`]) waits.
    pub timeout: Duration,
    /// ClientGuid (`None`: random).
    pub client_guid: Option<Guid>,
    /// Outstanding requests the bookkeeping is sized for up front.
    pub max_outstanding: usize,
    /// Queue-pair sizes (`None`: [`crate::client::client_caps`]). The
    /// send queue bounds live memory-window grants on the soft provider.
    pub caps: Option<QpCaps>,
    /// Server name in tree-connect paths (`None`: the address's IP).
    pub server_name: Option<String>,
    /// How long a waiting loop ([`Smb2Client::poll`], synchronous calls)
    /// sleeps after 64 polls in a row found nothing (`None`: it yields the
    /// core and spins on). Parking frees the core for the server or other
    /// clients when cores are shared, at some latency when idle.
    pub idle_park: Option<Duration>,
}

impl Default for Smb2ClientOptions {
    fn default() -> Self {
        Smb2ClientOptions {
            credit_target: 512,
            timeout: Duration::from_secs(30),
            client_guid: None,
            max_outstanding: 256,
            caps: None,
            server_name: None,
            idle_park: Some(Duration::from_micros(50)),
        }
    }
}

/// Counters of one client.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Requests sent.
    pub requests: u64,
    /// Final responses matched to a request.
    pub responses: u64,
    /// Interim (STATUS_PENDING) responses.
    pub interim: u64,
    /// Messages that matched no outstanding request, or did not parse.
    pub discarded: u64,
    /// Memory-window grants made.
    pub grants: u64,
    /// Grants revoked.
    pub revokes: u64,
    /// Grants the server invalidated with Send with Invalidate.
    pub invalidated: u64,
    /// Grants handed back to the provider: every revoked grant, and every
    /// grant the server invalidated, which still holds a memory window
    /// until it is deregistered ([MS-SMBD] 3.1.4.4).
    pub released: u64,
}

// ---------------------------------------------------------------------------
// Credits (sans-IO)

/// What a request costs ([MS-SMB2] 3.1.5.2, 3.2.4.1.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    /// The CreditCharge field.
    pub wire: u16,
    /// Credits (consecutive MessageIds) the request consumes.
    pub credits: u16,
}

/// A request's place in the sequence window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    /// MessageId: the first of the consumed identifiers.
    pub message_id: u64,
    /// Identifiers consumed.
    pub credits: u16,
    /// The CreditRequest to send.
    pub credit_request: u16,
}

/// The client's sequence window and credit accounting ([MS-SMB2]
/// 3.2.4.1.3, 3.2.4.1.5, 3.2.4.1.6, 3.2.5.1.4), without I/O.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreditWindow {
    next_message_id: u64,
    available: u32,
    expected: u32,
    target: u32,
    multi_credit: bool,
}

impl CreditWindow {
    /// Largest payload of a request when multi-credit is off (3.2.4.1.5).
    pub const SINGLE_CREDIT_PAYLOAD: u64 = 65_536;

    /// [MS-SMB2] 3.2.4.1.6: the window starts as `{0}`: one credit.
    /// `target` is the credits to keep granted.
    pub fn new(target: u16) -> Self {
        CreditWindow {
            next_message_id: 0,
            available: 1,
            expected: 0,
            target: u32::from(target.max(1)),
            multi_credit: false,
        }
    }

    /// Connection.SupportsMultiCredit: set after NEGOTIATE when the server
    /// offers SMB2_GLOBAL_CAP_LARGE_MTU.
    pub fn set_multi_credit(&mut self, on: bool) {
        self.multi_credit = on;
    }

    /// Connection.SupportsMultiCredit.
    pub fn multi_credit(&self) -> bool {
        self.multi_credit
    }

    /// Credits held: the size of the sequence window.
    pub fn available(&self) -> u32 {
        self.available
    }

    /// The lowest MessageId not used yet.
    pub fn next_message_id(&self) -> u64 {
        self.next_message_id
    }

    /// Credits requested by outstanding requests and not granted yet.
    pub fn expected(&self) -> u32 {
        self.expected
    }

    /// [MS-SMB2] 3.2.4.1.5: CreditCharge of a `command` request moving
    /// `payload` bytes (the larger of what it sends and what it may get
    /// back). `None` when the payload is over 64 KiB and multi-credit is
    /// off.
    pub fn charge(&self, command: Command, payload: u64) -> Option<Charge> {
        if !self.multi_credit {
            return (payload <= Self::SINGLE_CREDIT_PAYLOAD).then_some(Charge {
                wire: 0,
                credits: 1,
            });
        }
        let n = match command {
            Command::Read | Command::Write | Command::Ioctl | Command::QueryDirectory => {
                HeaderRepr::credit_charge_for(payload)
            }
            _ => 1,
        };
        Some(Charge {
            wire: n,
            credits: n,
        })
    }

    /// [MS-SMB2] 3.2.4.1.3: takes the lowest `credits` consecutive
    /// MessageIds, or fails with [`Smb2Error::NoCredits`] (changing nothing)
    /// when fewer credits are held. The CreditRequest asks at least
    /// `credits` back, and enough to bring held plus expected credits up to
    /// the target.
    pub fn reserve(&mut self, credits: u16) -> Result<Reservation, Smb2Error> {
        let credits = credits.max(1);
        let no = Smb2Error::NoCredits {
            need: credits,
            have: self.available,
        };
        if u32::from(credits) > self.available {
            return Err(no);
        }
        let Some(next) = self.next_message_id.checked_add(u64::from(credits)) else {
            return Err(no);
        };
        let message_id = self.next_message_id;
        self.next_message_id = next;
        self.available -= u32::from(credits);
        let deficit = self
            .target
            .saturating_sub(self.available.saturating_add(self.expected));
        let credit_request = deficit.max(u32::from(credits)).min(u32::from(u16::MAX)) as u16;
        self.expected = self.expected.saturating_add(u32::from(credit_request));
        Ok(Reservation {
            message_id,
            credits,
            credit_request,
        })
    }

    /// Undoes the latest [`reserve`](Self::reserve) of a request that never
    /// reached the wire. (Should another reservation have followed, the
    /// identifiers stay used and only the expectation is dropped.)
    pub fn unreserve(&mut self, r: &Reservation) {
        self.expected = self.expected.saturating_sub(u32::from(r.credit_request));
        if self.next_message_id == r.message_id + u64::from(r.credits) {
            self.next_message_id = r.message_id;
            self.available += u32::from(r.credits);
        }
    }

    /// [MS-SMB2] 3.2.5.1.4: a response (interim or final) granted
    /// `granted` credits; `expect` is what its request still expects.
    pub fn on_response(&mut self, granted: u16, expect: &mut u16) {
        self.available = self.available.saturating_add(u32::from(granted));
        let g = granted.min(*expect);
        *expect -= g;
        self.expected = self.expected.saturating_sub(u32::from(g));
    }

    /// The request's final response arrived (or never will): what it asked
    /// and was not granted is no longer expected.
    pub fn settle(&mut self, expect: u16) {
        self.expected = self.expected.saturating_sub(u32::from(expect));
    }
}

// ---------------------------------------------------------------------------
// Pure helpers

/// Lengths of `n` ranges splitting `len` bytes: as equal as possible, in
/// order, each at least one byte when `n <= len`.
pub fn split_lengths(len: usize, n: usize) -> impl Iterator<Item = usize> {
    let n = n.max(1);
    let (base, extra) = (len / n, len % n);
    (0..n).map(move |i| base + usize::from(i < extra))
}

/// Emits header and body into `scratch` (grown once to the largest
/// message); returns the message length.
fn emit_into<B: Smb2Body + ?Sized>(
    scratch: &mut Vec<u8>,
    h: &HeaderRepr,
    body: &B,
) -> Result<usize, wire::Smb2Error> {
    let need = HEADER_LEN + body.buffer_len();
    if scratch.len() < need {
        scratch.resize(need, 0);
    }
    wire::emit_message(h, body, &mut scratch[..need])
}

/// What an outstanding request is, for decoding its response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// A response without a result (CLOSE, FLUSH, ECHO, LOGOFF, ...).
    Control,
    Negotiate,
    SessionSetup,
    TreeConnect,
    Create,
    Read {
        buf: IoBuf,
        len: u32,
        rdma: Option<bool>,
    },
    Write {
        buf: Option<IoBuf>,
        len: u32,
        rdma: Option<bool>,
    },
    Ioctl {
        max_output: u32,
    },
}

impl Op {
    fn buf(&self) -> Option<IoBuf> {
        match *self {
            Op::Read { buf, .. } => Some(buf),
            Op::Write { buf, .. } => buf,
            _ => None,
        }
    }
}

/// An owned result of a successful response.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Reply {
    Empty,
    Negotiate(NegotiateInfo),
    Session(SessionInfo),
    Tree(TreeInfo),
    Create(CreateInfo),
    Bytes(u32),
    Ioctl { status: NtStatus, output: Vec<u8> },
}

impl Reply {
    fn bytes(&self) -> u32 {
        match self {
            Reply::Bytes(n) => *n,
            _ => 0,
        }
    }
}

/// A decoded response, still borrowing the message.
#[derive(Debug, PartialEq, Eq)]
enum Decoded<'a> {
    Reply(Reply),
    /// READ data to copy into the request's buffer.
    ReadInline(&'a [u8]),
    Ioctl {
        status: NtStatus,
        output: &'a [u8],
    },
}

/// Decodes the body of the response `h` to a request of kind `op`
/// ([MS-SMB2] 3.2.5.x). An ERROR response, or any non-success status but
/// STATUS_BUFFER_OVERFLOW on READ and IOCTL, is [`Smb2Error::Status`].
fn decode<'a>(op: &Op, h: &HeaderRepr, body: &'a [u8]) -> Result<Decoded<'a>, Smb2Error> {
    let parsed = ResponseBody::parse(h, body);
    let warning_ok =
        h.status == STATUS_BUFFER_OVERFLOW && matches!(op, Op::Read { .. } | Op::Ioctl { .. });
    if h.status != STATUS_SUCCESS && !warning_ok {
        return Err(Smb2Error::Status(h.status));
    }
    let body = match parsed {
        Ok(ResponseBody::Error(_)) => return Err(Smb2Error::Status(h.status)),
        Ok(b) => b,
        Err(error) => {
            return Err(Smb2Error::Protocol(ProtocolError::Decode {
                message_id: h.message_id,
                command: h.command,
                error,
            }))
        }
    };
    let reply = |r| Ok(Decoded::Reply(r));
    match (*op, body) {
        (Op::Negotiate, ResponseBody::Negotiate(n)) => {
            reply(Reply::Negotiate(negotiate_info(h, &n)?))
        }
        (Op::SessionSetup, ResponseBody::SessionSetup(s)) => reply(Reply::Session(SessionInfo {
            session_id: h.session_id,
            flags: s.session_flags,
        })),
        (Op::TreeConnect, ResponseBody::TreeConnect(t)) => {
            let tree_id = h
                .tree_id()
                .ok_or_else(|| field_error(h, "Flags", "ASYNC header carries no TreeId".into()))?;
            reply(Reply::Tree(TreeInfo {
                tree_id,
                share_type: t.share_type,
                share_flags: t.share_flags,
                capabilities: t.capabilities,
                maximal_access: t.maximal_access,
            }))
        }
        (Op::Create, ResponseBody::Create(c)) => reply(Reply::Create(CreateInfo {
            file_id: c.file_id,
            action: c.create_action,
            end_of_file: c.end_of_file,
            allocation_size: c.allocation_size,
            attributes: c.file_attributes,
            oplock_level: c.oplock_level,
            last_write_time: c.last_write_time,
        })),
        (Op::Read { len, rdma, .. }, ResponseBody::Read(r)) => {
            if r.data.len() > len as usize {
                return Err(field_error(
                    h,
                    "DataLength",
                    format!("{} bytes for a READ of {len}", r.data.len()),
                ));
            }
            // [MS-SMB2] 3.3.5.12: over RDMA the data went by RDMA Write,
            // DataLength is 0 and DataRemaining says how much. A server may
            // still answer inline; both are accepted.
            if r.data.is_empty() && rdma.is_some() {
                if r.data_remaining > len {
                    return Err(field_error(
                        h,
                        "DataRemaining",
                        format!("{} bytes for an RDMA READ of {len}", r.data_remaining),
                    ));
                }
                return reply(Reply::Bytes(r.data_remaining));
            }
            Ok(Decoded::ReadInline(r.data))
        }
        (Op::Write { len, .. }, ResponseBody::Write(w)) => {
            if w.count > len {
                return Err(field_error(
                    h,
                    "Count",
                    format!("{} bytes for a WRITE of {len}", w.count),
                ));
            }
            reply(Reply::Bytes(w.count))
        }
        (Op::Ioctl { max_output }, ResponseBody::Ioctl(i)) => {
            if i.output.len() > max_output as usize {
                return Err(field_error(
                    h,
                    "OutputCount",
                    format!(
                        "{} bytes, MaxOutputResponse was {max_output}",
                        i.output.len()
                    ),
                ));
            }
            Ok(Decoded::Ioctl {
                status: h.status,
                output: i.output,
            })
        }
        (
            Op::Control,
            ResponseBody::Close(_)
            | ResponseBody::Flush(_)
            | ResponseBody::Echo(_)
            | ResponseBody::Logoff(_)
            | ResponseBody::TreeDisconnect(_),
        ) => reply(Reply::Empty),
        _ => Err(field_error(
            h,
            "Command",
            "response body does not answer the request".into(),
        )),
    }
}

/// [MS-SMB2] 3.2.5.2: the NEGOTIATE response's settings; a 3.1.1 response
/// must carry exactly one preauth integrity context naming SHA-512, the one
/// hash offered.
fn negotiate_info(
    h: &HeaderRepr,
    n: &wire::NegotiateResponseRepr<'_>,
) -> Result<NegotiateInfo, Smb2Error> {
    let dialect = Dialect(n.dialect_revision);
    let (preauth_hash, server_salt) = if dialect == Dialect::SMB_3_1_1 {
        let kind = NegotiateContextType::PREAUTH_INTEGRITY_CAPABILITIES;
        let count = n.negotiate_contexts.count_of(kind);
        let p = match n.negotiate_contexts.find(kind) {
            Some(NegotiateContext::PreauthIntegrity(p)) if count == 1 => p,
            _ => {
                return Err(field_error(
                    h,
                    "NegotiateContextList",
                    format!("{count} SMB2_PREAUTH_INTEGRITY_CAPABILITIES contexts, want 1"),
                ))
            }
        };
        if p.hash_algorithms.len() != 1 || !p.hash_algorithms.contains(HashAlgorithm::SHA_512.0) {
            return Err(field_error(
                h,
                "HashAlgorithms",
                format!("{:?}, want exactly SHA-512", p.hash_algorithms),
            ));
        }
        (Some(HashAlgorithm::SHA_512), p.salt.to_vec())
    } else {
        (None, Vec::new())
    };
    Ok(NegotiateInfo {
        dialect,
        security_mode: n.security_mode,
        capabilities: n.capabilities,
        server_guid: n.server_guid,
        max_transact_size: n.max_transact_size,
        max_read_size: n.max_read_size,
        max_write_size: n.max_write_size,
        system_time: n.system_time,
        preauth_hash,
        server_salt,
    })
}

/// Feeds the outcome of a FSCTL_STORAGE_QOS_CONTROL IOCTL to its flow
/// ([MS-SQOS] 3.1.5.1) and returns the STORAGE_QOS_CONTROL_RESPONSE, if the
/// request asked for one. A failure reaches the flow as a status (a dead
/// connection as STATUS_CONNECTION_DISCONNECTED, a bad response as
/// STATUS_INVALID_NETWORK_RESPONSE), which arms its retry timer.
pub fn qos_outcome(
    flow: &mut LogicalFlow,
    result: Result<(NtStatus, Vec<u8>), Smb2Error>,
    now: PInstant,
) -> Result<Option<StorageQosControlResponseRepr>, Smb2Error> {
    let failed = |flow: &mut LogicalFlow, status: NtStatus| {
        // A failure outcome never fails to parse.
        let _ = flow.handle_response(Err(status), now);
    };
    match result {
        Ok((status, output)) if status == STATUS_SUCCESS => flow
            .handle_response(Ok(&output), now)
            .map_err(|e| Smb2Error::Protocol(ProtocolError::Qos(e))),
        Ok((status, _)) => {
            failed(flow, status);
            Err(Smb2Error::Status(status))
        }
        Err(e) => {
            let status = match &e {
                Smb2Error::Status(s) => *s,
                Smb2Error::Transport(_) => STATUS_CONNECTION_DISCONNECTED,
                Smb2Error::Protocol(_) => STATUS_INVALID_NETWORK_RESPONSE,
                _ => STATUS_INSUFFICIENT_RESOURCES,
            };
            failed(flow, status);
            Err(e)
        }
    }
}

/// Bytes for a salt or a ClientGuid: unique, not secret.
fn random_bytes(out: &mut [u8]) {
    use std::io::Read;
    let ok = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(out))
        .is_ok();
    if ok {
        return;
    }
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut x = t ^ (u64::from(std::process::id()) << 32) ^ COUNTER.fetch_add(1, Ordering::Relaxed);
    for chunk in out.chunks_mut(8) {
        // splitmix64
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        chunk.copy_from_slice(&z.to_le_bytes()[..chunk.len()]);
    }
}

// ---------------------------------------------------------------------------
// Connection state (everything but the SMB Direct client)

/// One pool buffer of the client.
#[derive(Debug)]
struct BufSlot {
    id: BufId,
    len: usize,
    generation: u32,
    live: bool,
    /// Lent to an outstanding request.
    busy: bool,
    /// A revoke failed: the peer may still reach it; never reused.
    poisoned: bool,
    /// Grants of the outstanding request (capacity kept across I/Os).
    grants: Vec<Grant>,
}

#[derive(Debug)]
struct Pending {
    command: Command,
    /// Credits asked and not granted yet.
    expect: u16,
    submitted: Instant,
    op: Op,
    async_id: Option<u64>,
    /// A synchronous call gave up waiting: drop the completion.
    abandoned: bool,
}

#[derive(Debug)]
struct Finished {
    id: u64,
    pending: Pending,
    outcome: Result<Reply, Smb2Error>,
    token: Option<u32>,
}

#[derive(Debug)]
struct Done {
    completion: Completion,
    reply: Option<Reply>,
}

#[derive(Debug)]
struct State {
    pool: BufferPool,
    credits: CreditWindow,
    /// By MessageId (ids this client assigns: the id hasher, not SipHash).
    pending: IdMap<u64, Pending>,
    finished: VecDeque<Finished>,
    ready: VecDeque<Done>,
    bufs: Vec<BufSlot>,
    free_slots: Vec<u32>,
    descs: Vec<BufferDescriptorRepr>,
    scratch: Vec<u8>,
    session_id: u64,
    tree_id: u32,
    negotiated: Option<NegotiateInfo>,
    dead: Option<Arc<ClientError>>,
    stats: ClientStats,
    /// Grants and revokes posted since the completion queue was last
    /// drained.
    local_wrs: u32,
}

impl State {
    fn header(&self, command: Command, r: &Reservation, wire_charge: u16) -> HeaderRepr {
        HeaderRepr {
            credit_charge: wire_charge,
            // SMB 3.x: ChannelSequence 0, Reserved 0.
            status: STATUS_SUCCESS,
            command,
            credit: r.credit_request,
            flags: HeaderFlags::empty(),
            next_command: 0,
            message_id: r.message_id,
            id: HeaderId::Sync {
                process_id: PROCESS_ID,
                tree_id: self.tree_id,
            },
            session_id: self.session_id,
            signature: [0; 16],
        }
    }

    /// Step callback: every message of a delivered (possibly compounded)
    /// SMB Direct message.
    fn on_message(&mut self, m: &[u8], token: Option<u32>) {
        for item in wire::compound(m) {
            match item {
                Ok(msg) => self.on_response(msg.header(), msg.body(), token),
                Err(_) => {
                    // [MS-SMB2] 3.2.5.1: what cannot be delimited is
                    // discarded.
                    self.stats.discarded += 1;
                    break;
                }
            }
        }
    }

    fn on_response(&mut self, h: &HeaderRepr, body: &[u8], token: Option<u32>) {
        if !h.is_response() {
            self.stats.discarded += 1;
            return;
        }
        // [MS-SMB2] 3.2.5.1.3: a response no request waits for (including
        // unsolicited oplock breaks, MessageId 0xFFFFFFFFFFFFFFFF) is
        // discarded.
        let Some(p) = self.pending.get_mut(&h.message_id) else {
            self.stats.discarded += 1;
            return;
        };
        self.credits.on_response(h.credit, &mut p.expect);
        // [MS-SMB2] 3.2.5.1.5: an interim response; the final one follows.
        if h.status == STATUS_PENDING && h.flags.contains(HeaderFlags::ASYNC_COMMAND) {
            p.async_id = h.async_id();
            self.stats.interim += 1;
            return;
        }
        let Some(mut p) = self.pending.remove(&h.message_id) else {
            return;
        };
        self.credits.settle(p.expect);
        p.expect = 0;
        self.stats.responses += 1;
        let outcome = if h.command != p.command {
            Err(Smb2Error::Protocol(ProtocolError::CommandMismatch {
                message_id: h.message_id,
                sent: p.command,
                received: h.command,
            }))
        } else {
            match decode(&p.op, h, body) {
                Ok(Decoded::Reply(r)) => Ok(r),
                Ok(Decoded::ReadInline(data)) => match p.op.buf() {
                    Some(b) if self.copy_into(b, data) => Ok(Reply::Bytes(data.len() as u32)),
                    _ => Err(field_error(
                        h,
                        "DataLength",
                        format!("{} bytes do not fit the request's buffer", data.len()),
                    )),
                },
                Ok(Decoded::Ioctl { status, output }) => Ok(Reply::Ioctl {
                    status,
                    output: output.to_vec(),
                }),
                Err(e) => Err(e),
            }
        };
        self.finished.push_back(Finished {
            id: h.message_id,
            pending: p,
            outcome,
            token,
        });
    }

    /// Copies READ data into the start of a lent buffer.
    fn copy_into(&self, b: IoBuf, data: &[u8]) -> bool {
        let Some(slot) = self.bufs.get(b.index as usize) else {
            return false;
        };
        let Some(loc) = self.pool.locate(slot.id) else {
            return false;
        };
        if slot.generation != b.generation || !slot.busy || data.len() > slot.len.min(loc.len) {
            return false;
        }
        // SAFETY: the range is inside the live buffer (checked above), which
        // is lent to the request being completed, so no reference to its
        // bytes exists; a raw copy, as a peer with a grant could touch the
        // memory concurrently.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), loc.ptr.as_ptr(), data.len()) };
        true
    }

    /// The connection failed: every outstanding request fails with `e`.
    fn mark_dead(&mut self, e: Arc<ClientError>) {
        if self.dead.is_none() {
            self.dead = Some(e.clone());
        }
        let ids: Vec<u64> = self.pending.keys().copied().collect();
        for id in ids {
            if let Some(p) = self.pending.remove(&id) {
                self.credits.settle(p.expect);
                self.finished.push_back(Finished {
                    id,
                    pending: p,
                    outcome: Err(Smb2Error::Transport(e.clone())),
                    token: None,
                });
            }
        }
    }

    fn slot(&self, b: IoBuf) -> Result<&BufSlot, Smb2Error> {
        match self.bufs.get(b.index as usize) {
            Some(s) if s.live && s.generation == b.generation => Ok(s),
            _ => Err(Smb2Error::Invalid(format!("{b:?} is not a live buffer"))),
        }
    }

    /// A buffer that can be lent to a request moving `len` bytes.
    fn lendable(&self, b: IoBuf, len: usize) -> Result<BufId, Smb2Error> {
        let s = self.slot(b)?;
        if s.busy || s.poisoned {
            return Err(Smb2Error::Invalid(format!(
                "{b:?} is {}",
                if s.busy {
                    "lent to an outstanding request"
                } else {
                    "unusable (a revoke failed)"
                }
            )));
        }
        if len > s.len {
            return Err(Smb2Error::Invalid(format!(
                "{len} bytes do not fit {b:?} ({} bytes)",
                s.len
            )));
        }
        Ok(s.id)
    }
}

// ---------------------------------------------------------------------------
// The client

/// An SMB2 client on one SMB Direct connection (see the module docs).
pub struct Smb2Client<P: Provider> {
    c: Client<P>,
    st: State,
    opts: Smb2ClientOptions,
    server: String,
    origin: Instant,
    client_guid: Guid,
    sync_buf: Option<IoBuf>,
}

impl<P: Provider> core::fmt::Debug for Smb2Client<P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Smb2Client")
            .field("server", &self.server)
            .field("dialect", &self.st.negotiated.as_ref().map(|n| n.dialect))
            .field("session_id", &self.st.session_id)
            .field("tree_id", &self.st.tree_id)
            .field("credits", &self.st.credits)
            .field("outstanding", &self.st.pending.len())
            .field("dead", &self.st.dead)
            .finish()
    }
}

impl<P: Provider> Smb2Client<P> {
    /// Connects (as [`Client::connect`], with `options.caps` when given)
    /// and wraps the connection. SMB2 starts with [`negotiate`](Self::negotiate).
    pub fn connect(
        provider: &P,
        addr: SocketAddr,
        cfg: SmbdConfig,
        alloc: SliceAllocator,
        mr: MemoryRegion,
        timeout: Duration,
        options: Smb2ClientOptions,
    ) -> Result<Self, Smb2Error> {
        let c = match options.caps {
            Some(caps) => Client::connect_with_caps(provider, addr, cfg, alloc, mr, timeout, caps),
            None => Client::connect(provider, addr, cfg, alloc, mr, timeout),
        }
        .map_err(Smb2Error::transport)?;
        let server = options
            .server_name
            .clone()
            .unwrap_or_else(|| addr.ip().to_string());
        Ok(Self::from_client(c, server, options))
    }

    /// Wraps an established SMB Direct connection on which no SMB2 message
    /// was exchanged yet. `server` names the server in tree-connect paths.
    pub fn from_client(mut c: Client<P>, server: String, options: Smb2ClientOptions) -> Self {
        let pool = c.alloc_mut().pool().clone();
        let client_guid = options.client_guid.unwrap_or_else(|| {
            let mut g = [0u8; 16];
            random_bytes(&mut g);
            Guid::from_bytes(g)
        });
        let n = options.max_outstanding.max(1);
        Smb2Client {
            c,
            st: State {
                pool,
                credits: CreditWindow::new(options.credit_target),
                pending: id_map(n),
                finished: VecDeque::with_capacity(n),
                ready: VecDeque::with_capacity(n),
                bufs: Vec::new(),
                free_slots: Vec::new(),
                descs: Vec::with_capacity(16),
                scratch: vec![0u8; 4096],
                session_id: 0,
                tree_id: 0,
                negotiated: None,
                dead: None,
                stats: ClientStats::default(),
                local_wrs: 0,
            },
            server,
            origin: crate::clock::now(),
            client_guid,
            sync_buf: None,
            opts: options,
        }
    }

    /// The SMB Direct connection.
    pub fn client(&self) -> &Client<P> {
        &self.c
    }

    /// What NEGOTIATE settled.
    pub fn negotiated(&self) -> Option<&NegotiateInfo> {
        self.st.negotiated.as_ref()
    }

    /// The credit window.
    pub fn credits(&self) -> &CreditWindow {
        &self.st.credits
    }

    /// Requests sent and not completed.
    pub fn outstanding(&self) -> usize {
        self.st.pending.len()
    }

    /// Counters.
    pub fn stats(&self) -> ClientStats {
        self.st.stats
    }

    /// SessionId in use (0: none).
    pub fn session_id(&self) -> u64 {
        self.st.session_id
    }

    /// TreeId requests carry (0: none).
    pub fn tree_id(&self) -> u32 {
        self.st.tree_id
    }

    /// Switches the TreeId requests carry (after several tree connects).
    pub fn set_tree_id(&mut self, tree_id: u32) {
        self.st.tree_id = tree_id;
    }

    /// The ClientGuid sent in NEGOTIATE.
    pub fn client_guid(&self) -> Guid {
        self.client_guid
    }

    /// This client's clock (since it was created), for the Storage QoS
    /// flows' timers.
    pub fn now(&self) -> PInstant {
        PInstant::from_nanos(
            crate::clock::now()
                .saturating_duration_since(self.origin)
                .as_nanos() as u64,
        )
    }

    /// Why the connection is dead, if it is.
    pub fn dead(&self) -> Option<&ClientError> {
        self.st.dead.as_deref()
    }

    /// Closes the connection (waiting up to `timeout` for posted buffers)
    /// and returns the pool slice with every buffer this client allocated
    /// freed (but those a failed revoke left reachable).
    pub fn disconnect(self, timeout: Duration) -> SliceAllocator {
        let Smb2Client { c, st, .. } = self;
        let mut alloc = c.close(timeout);
        for s in st.bufs {
            if s.live && !s.poisoned {
                let _ = alloc.free(s.id);
            }
        }
        alloc
    }

    // --- buffers ---------------------------------------------------------

    /// A pool buffer of `len` bytes for pipelined I/O (from the smallest
    /// size class that holds it).
    pub fn alloc_io_buf(&mut self, len: usize) -> Result<IoBuf, Smb2Error> {
        let id = self
            .c
            .alloc_buffer(len)
            .map_err(|e| Smb2Error::Resources(format!("I/O buffer of {len} bytes: {e}")))?;
        let slot = BufSlot {
            id,
            len,
            generation: 0,
            live: true,
            busy: false,
            poisoned: false,
            // Room for the descriptors of a typical request, so the first
            // RDMA request of a new buffer does not allocate in steady
            // state (a buffer's first multi-descriptor use used to grow it).
            grants: Vec::with_capacity(GRANTS_PER_BUFFER),
        };
        if let Some(i) = self.st.free_slots.pop() {
            let s = &mut self.st.bufs[i as usize];
            let generation = s.generation.wrapping_add(1);
            let grants = std::mem::take(&mut s.grants);
            *s = BufSlot {
                generation,
                grants,
                ..slot
            };
            return Ok(IoBuf {
                index: i,
                generation,
            });
        }
        let index = u32::try_from(self.st.bufs.len())
            .map_err(|_| Smb2Error::Resources("I/O buffer table full".into()))?;
        self.st.bufs.push(slot);
        Ok(IoBuf {
            index,
            generation: 0,
        })
    }

    /// Returns a buffer to the pool. Fails while it is lent to a request.
    pub fn free_io_buf(&mut self, b: IoBuf) -> Result<(), Smb2Error> {
        let s = self.st.slot(b)?;
        if s.busy {
            return Err(Smb2Error::Invalid(format!(
                "{b:?} is lent to an outstanding request"
            )));
        }
        let (id, poisoned) = (s.id, s.poisoned);
        if !poisoned {
            self.c.free_buffer(id);
        }
        let s = &mut self.st.bufs[b.index as usize];
        s.live = false;
        s.generation = s.generation.wrapping_add(1);
        self.st.free_slots.push(b.index);
        Ok(())
    }

    /// Length of a buffer.
    pub fn io_buf_len(&self, b: IoBuf) -> Option<usize> {
        self.st.slot(b).ok().map(|s| s.len)
    }

    /// The bytes of a buffer; `None` while it is lent to a request (or
    /// stale).
    pub fn io_buf(&self, b: IoBuf) -> Option<&[u8]> {
        let s = self.st.slot(b).ok()?;
        if s.busy || s.poisoned {
            return None;
        }
        // SAFETY: the buffer is live and not lent: no request and no grant
        // can write it, and `&self` keeps this client from lending it while
        // the slice lives.
        let bytes = unsafe { self.st.pool.bytes(s.id) }?;
        bytes.get(..s.len)
    }

    /// The bytes of a buffer, to fill before a WRITE; `None` while lent.
    pub fn io_buf_mut(&mut self, b: IoBuf) -> Option<&mut [u8]> {
        let s = self.st.slot(b).ok()?;
        if s.busy || s.poisoned {
            return None;
        }
        // SAFETY: as in `io_buf`; `&mut self` makes the slice exclusive.
        let bytes = unsafe { self.st.pool.bytes_mut(s.id) }?;
        bytes.get_mut(..s.len)
    }

    // --- polling ---------------------------------------------------------

    /// One step of the SMB Direct client; responses are decoded into
    /// `finished` (grants are revoked by [`finish`](Self::finish)).
    fn step_raw(&mut self) -> Result<bool, Smb2Error> {
        if let Some(e) = &self.st.dead {
            return Err(Smb2Error::Transport(e.clone()));
        }
        let st = &mut self.st;
        match self.c.step(&mut |m, token| st.on_message(m, token)) {
            Ok(progress) => Ok(progress),
            Err(e) => {
                let e = Arc::new(e);
                self.st.mark_dead(e.clone());
                Err(Smb2Error::Transport(e))
            }
        }
    }

    /// Retires finished requests: revokes their grants, frees their buffers
    /// and queues their completions.
    fn finish(&mut self) {
        while let Some(f) = self.st.finished.pop_front() {
            self.finish_one(f);
        }
    }

    fn finish_one(&mut self, f: Finished) {
        let Finished {
            id,
            pending: p,
            mut outcome,
            token,
        } = f;
        if let Some(b) = p.op.buf() {
            let idx = b.index as usize;
            let first = self
                .st
                .bufs
                .get(idx)
                .and_then(|s| s.grants.first().copied());
            // [MS-SMBD] 3.1.4.2: the server invalidated the first token
            // with its response; any other token is a protocol error.
            let first_invalidated = match (token, first) {
                (Some(t), Some(g)) if t == g.rkey => {
                    self.st.stats.invalidated += 1;
                    true
                }
                (Some(t), Some(g)) => {
                    if outcome.is_ok() {
                        outcome = Err(Smb2Error::Protocol(ProtocolError::InvalidatedToken {
                            message_id: id,
                            expected: g.rkey,
                            found: t,
                        }));
                    }
                    false
                }
                _ => false,
            };
            let ok = self.release_grants(idx, first_invalidated);
            if let Some(s) = self.st.bufs.get_mut(idx) {
                s.busy = false;
                s.poisoned |= !ok;
            }
        }
        if p.abandoned {
            return;
        }
        let (result, reply) = match outcome {
            Ok(r) => (Ok(r.bytes()), Some(r)),
            Err(e) => (Err(e), None),
        };
        self.st.ready.push_back(Done {
            completion: Completion {
                id: MessageId(id),
                command: p.command,
                result,
                buf: p.op.buf(),
                latency: crate::clock::now().saturating_duration_since(p.submitted),
            },
            reply,
        });
    }

    /// Between polls of a waiting loop: after [`IDLE_SPINS`] polls that
    /// found nothing, park for [`Smb2ClientOptions::idle_park`] (or yield).
    fn idle(&self, spins: &mut u32, progress: bool) {
        if progress {
            *spins = 0;
            return;
        }
        *spins += 1;
        if *spins % IDLE_SPINS == 0 {
            match self.opts.idle_park {
                Some(d) if !d.is_zero() => std::thread::sleep(d),
                _ => std::thread::yield_now(),
            }
        }
    }

    /// The next completion, polling up to `timeout` for one (a zero
    /// timeout polls once). `Ok(None)`: nothing completed in time, or
    /// nothing is outstanding. `Err` once the
    /// connection is dead and every outstanding request has been handed
    /// out (with the transport error).
    pub fn poll(&mut self, timeout: Duration) -> Result<Option<Completion>, Smb2Error> {
        // A zero timeout polls once and never reads the clock (a
        // busy-polling caller makes this call once per completion and per
        // empty poll).
        let deadline = (!timeout.is_zero()).then(|| crate::clock::now() + timeout);
        let mut spins = 0;
        loop {
            self.finish();
            if let Some(d) = self.st.ready.pop_front() {
                return Ok(Some(d.completion));
            }
            if self.st.pending.is_empty() {
                return match &self.st.dead {
                    Some(e) => Err(Smb2Error::Transport(e.clone())),
                    None => Ok(None),
                };
            }
            // At least one step, so a zero timeout polls once.
            let progress = self.step_raw().unwrap_or(true);
            if deadline.map_or(true, |d| crate::clock::now() >= d) {
                self.finish();
                return Ok(self.st.ready.pop_front().map(|d| d.completion));
            }
            self.idle(&mut spins, progress);
        }
    }

    /// Waits (up to the options' timeout) for request `id` and returns its
    /// completion; other completions stay queued for [`poll`](Self::poll).
    pub fn wait(&mut self, id: MessageId) -> Result<Completion, Smb2Error> {
        self.wait_done(id, false).map(|d| d.completion)
    }

    fn wait_done(&mut self, id: MessageId, abandon: bool) -> Result<Done, Smb2Error> {
        let deadline = crate::clock::now() + self.opts.timeout;
        let mut spins = 0;
        loop {
            self.finish();
            if let Some(i) = self.st.ready.iter().position(|d| d.completion.id == id) {
                if let Some(d) = self.st.ready.remove(i) {
                    return Ok(d);
                }
            }
            if !self.st.pending.contains_key(&id.0) {
                return Err(match &self.st.dead {
                    Some(e) => Smb2Error::Transport(e.clone()),
                    None => Smb2Error::Invalid(format!("no outstanding request {}", id.0)),
                });
            }
            if crate::clock::now() >= deadline {
                if abandon {
                    if let Some(p) = self.st.pending.get_mut(&id.0) {
                        p.abandoned = true;
                    }
                }
                return Err(Smb2Error::transport(ClientError::Timeout(
                    "an SMB2 response",
                )));
            }
            let progress = self.step_raw().unwrap_or(true);
            self.idle(&mut spins, progress);
        }
    }

    /// Waits for a synchronous call's response.
    fn call(&mut self, id: MessageId) -> Result<Reply, Smb2Error> {
        let d = self.wait_done(id, true)?;
        d.completion.result?;
        Ok(d.reply.unwrap_or(Reply::Empty))
    }

    /// For a synchronous call: waits until `need` credits are held.
    fn ensure_credits(&mut self, need: u16) -> Result<(), Smb2Error> {
        let deadline = crate::clock::now() + self.opts.timeout;
        let mut spins = 0;
        loop {
            let have = self.st.credits.available();
            if have >= u32::from(need.max(1)) {
                return Ok(());
            }
            if let Some(e) = &self.st.dead {
                return Err(Smb2Error::Transport(e.clone()));
            }
            if !self.st.pending.is_empty() && crate::clock::now() < deadline {
                let progress = self.step_raw().unwrap_or(true);
                self.finish();
                self.idle(&mut spins, progress);
                continue;
            }
            // Nothing outstanding brings credits back: an ECHO asks for
            // them ([MS-SMB2] 3.2.4.1.5 "wait until available").
            if self.st.pending.is_empty() && have >= 1 && crate::clock::now() < deadline {
                let id = self.send_simple(Command::Echo, &EchoRequestRepr, Op::Control)?;
                self.call(id)?;
                if self.st.credits.available() > have {
                    continue;
                }
            }
            return Err(Smb2Error::NoCredits { need, have });
        }
    }

    // --- sending ---------------------------------------------------------

    fn check_alive(&self) -> Result<(), Smb2Error> {
        match &self.st.dead {
            Some(e) => Err(Smb2Error::Transport(e.clone())),
            None => Ok(()),
        }
    }

    fn check_negotiated(&self) -> Result<&NegotiateInfo, Smb2Error> {
        self.check_alive()?;
        self.st
            .negotiated
            .as_ref()
            .ok_or_else(|| Smb2Error::Invalid("no NEGOTIATE on this connection yet".into()))
    }

    fn charge(&self, command: Command, payload: u64) -> Result<Charge, Smb2Error> {
        self.st.credits.charge(command, payload).ok_or_else(|| {
            Smb2Error::Invalid(format!(
                "{command:?} of {payload} bytes: over 64 KiB needs multi-credit \
                 (SMB2_GLOBAL_CAP_LARGE_MTU), which the server did not offer"
            ))
        })
    }

    fn check_credits(&self, charge: Charge) -> Result<(), Smb2Error> {
        let have = self.st.credits.available();
        if u32::from(charge.credits) > have {
            return Err(Smb2Error::NoCredits {
                need: charge.credits,
                have,
            });
        }
        Ok(())
    }

    /// Sends the `n` bytes emitted into the scratch buffer and records the
    /// request; undoes the reservation if they never reach the wire.
    fn transmit(
        &mut self,
        n: usize,
        command: Command,
        r: Reservation,
        op: Op,
    ) -> Result<MessageId, Smb2Error> {
        // Read the clock only if the first attempt has to wait.
        let mut deadline = None;
        loop {
            let e = match self.c.send(&self.st.scratch[..n]) {
                Ok(()) => break,
                Err(e) => e,
            };
            let transient = matches!(
                e,
                ClientError::Send(SendError::QueueFull) | ClientError::PoolExhausted
            );
            if transient && before(&mut deadline, self.opts.timeout) {
                // Send-queue room and send buffers come back as sends
                // complete.
                if let Err(e) = self.step_raw() {
                    self.st.credits.unreserve(&r);
                    return Err(e);
                }
                continue;
            }
            self.st.credits.unreserve(&r);
            return Err(match e {
                ClientError::Send(SendError::TooLarge { len, max }) => Smb2Error::Invalid(format!(
                    "{command:?} request of {len} bytes exceeds the server's \
                     MaxFragmentedSize {max} ([MS-SMBD] 3.1.4.2)"
                )),
                ClientError::Send(SendError::QueueFull) | ClientError::PoolExhausted => {
                    Smb2Error::Resources(format!("sending {command:?}: {e}"))
                }
                e => {
                    let e = Arc::new(e);
                    self.st.mark_dead(e.clone());
                    Smb2Error::Transport(e)
                }
            });
        }
        self.st.pending.insert(
            r.message_id,
            Pending {
                command,
                expect: r.credit_request,
                submitted: crate::clock::now(),
                op,
                async_id: None,
                abandoned: false,
            },
        );
        self.st.stats.requests += 1;
        Ok(MessageId(r.message_id))
    }

    /// Sends a request whose body does not borrow the client.
    fn send_with<B: Smb2Body + ?Sized>(
        &mut self,
        command: Command,
        charge: Charge,
        body: &B,
        op: Op,
    ) -> Result<MessageId, Smb2Error> {
        self.check_alive()?;
        let r = self.st.credits.reserve(charge.credits)?;
        let h = self.st.header(command, &r, charge.wire);
        let n = match emit_into(&mut self.st.scratch, &h, body) {
            Ok(n) => n,
            Err(e) => {
                self.st.credits.unreserve(&r);
                return Err(Smb2Error::Invalid(format!("encoding {command:?}: {e}")));
            }
        };
        self.transmit(n, command, r, op)
    }

    /// A one-credit request (everything but READ, WRITE, IOCTL).
    fn send_simple<B: Smb2Body + ?Sized>(
        &mut self,
        command: Command,
        body: &B,
        op: Op,
    ) -> Result<MessageId, Smb2Error> {
        let charge = self.charge(command, 0)?;
        self.send_with(command, charge, body, op)
    }

    /// A synchronous one-credit request.
    fn control<B: Smb2Body + ?Sized>(
        &mut self,
        command: Command,
        body: &B,
        op: Op,
    ) -> Result<Reply, Smb2Error> {
        self.check_alive()?;
        let charge = self.charge(command, 0)?;
        self.ensure_credits(charge.credits)?;
        let id = self.send_with(command, charge, body, op)?;
        self.call(id)
    }

    // --- grants ----------------------------------------------------------

    fn grant_raw(
        &mut self,
        id: BufId,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Grant, Smb2Error> {
        let sge = self.c.sge(id, offset, len).ok_or_else(|| {
            Smb2Error::Invalid(format!("{len} bytes at {offset} are outside buffer {id:?}"))
        })?;
        self.local_wr_room()?;
        // Read the clock only if the first attempt has to wait.
        let mut deadline = None;
        loop {
            let signaled = self.local_wr_signaled();
            match self
                .c
                .endpoint_mut()
                .qp_mut()
                .grant(LOCAL_WR_ID, sge, access, signaled)
            {
                Ok(g) => {
                    self.st.stats.grants += 1;
                    self.st.local_wrs += 1;
                    return Ok(g);
                }
                // A full send queue drains as completions are polled.
                Err(ProviderError::QueueFull) if before(&mut deadline, self.opts.timeout) => {
                    self.step_raw()?;
                }
                Err(ProviderError::GrantFailed(s)) => {
                    return Err(Smb2Error::Resources(format!(
                        "memory-window grant of {len} bytes: {s}"
                    )))
                }
                Err(e) => return Err(Smb2Error::transport(ClientError::Provider(e))),
            }
        }
    }

    /// Revokes grant `rkey` (`remotely_invalidated`: the server's Send
    /// with Invalidate already did, and this only gives its memory window
    /// back to the provider).
    fn revoke_raw(&mut self, rkey: u32, remotely_invalidated: bool) -> Result<(), Smb2Error> {
        if self.st.dead.is_some() {
            // A broken connection reaches no memory; the revoke only frees
            // the provider's slot and its outcome does not matter.
            let _ = self
                .c
                .endpoint_mut()
                .qp_mut()
                .revoke(LOCAL_WR_ID, rkey, true);
            return Ok(());
        }
        self.local_wr_room()?;
        // Read the clock only if the first attempt has to wait.
        let mut deadline = None;
        loop {
            let signaled = self.local_wr_signaled();
            match self
                .c
                .endpoint_mut()
                .qp_mut()
                .revoke(LOCAL_WR_ID, rkey, signaled)
            {
                Ok(()) => {
                    if !remotely_invalidated {
                        self.st.stats.revokes += 1;
                    }
                    self.st.stats.released += 1;
                    self.st.local_wrs += 1;
                    return Ok(());
                }
                Err(ProviderError::QueueFull) if before(&mut deadline, self.opts.timeout) => {
                    // A dead connection cannot drain the queue; give up.
                    self.step_raw()?;
                }
                Err(e) => return Err(Smb2Error::transport(ClientError::Provider(e))),
            }
        }
    }

    /// Whether the grant or revoke about to be posted asks for a completion:
    /// one in [`LOCAL_WR_SIGNAL_EVERY`] does. Nothing waits for
    /// their completions (a failed one completes anyway, as an error, and
    /// breaks the queue pair, so the request's Send behind it fails too);
    /// they only retire send-queue slots, and a signaled work request
    /// retires every one posted before it on the queue pair: the request's
    /// own Send (always signaled) right behind its grants, or the next
    /// signaled grant or revoke, which [`Self::local_wr_room`] drains. Each
    /// saves a completion (rxe: a completion-queue entry the kernel writes)
    /// and the poll that would take it, twice per RDMA READ or WRITE.
    fn local_wr_signaled(&self) -> bool {
        (self.st.local_wrs + 1) % LOCAL_WR_SIGNAL_EVERY == 0
    }

    /// [`Client`] keeps 64 send-queue slots for grants and revokes beyond
    /// what its own sends may use, and a send that finds the queue full
    /// ends the connection. A grant or revoke holds its slot until a
    /// signaled work request after it completes, so after every
    /// [`LOCAL_WR_BATCH`] of them (the last of each half signaled) the
    /// completion queue is drained before the next.
    fn local_wr_room(&mut self) -> Result<(), Smb2Error> {
        if self.st.local_wrs < LOCAL_WR_BATCH {
            return Ok(());
        }
        for _ in 0..MAX_DRAIN_STEPS {
            if !self.step_raw()? {
                break;
            }
        }
        self.st.local_wrs = 0;
        Ok(())
    }

    /// Revokes the grants of buffer slot `idx`; false if a revoke failed.
    /// With `first_invalidated` the server's Send with Invalidate already
    /// revoked the first, which is still deregistered: [MS-SMBD] 3.1.4.4
    /// has the upper layer deregister every buffer it registered, and on
    /// verbs the invalidated memory window stays allocated to the grant
    /// until then (skipping it used up a queue pair's 64 windows after 64
    /// invalidating requests).
    fn release_grants(&mut self, idx: usize, first_invalidated: bool) -> bool {
        let Some(s) = self.st.bufs.get_mut(idx) else {
            return true;
        };
        let mut grants = std::mem::take(&mut s.grants);
        let mut ok = true;
        for (i, g) in grants.iter().enumerate() {
            ok &= self.revoke_raw(g.rkey, first_invalidated && i == 0).is_ok();
        }
        grants.clear();
        if let Some(s) = self.st.bufs.get_mut(idx) {
            s.grants = grants;
        }
        ok
    }

    /// Grants `len` bytes of buffer slot `idx` in `n` ranges ([MS-SMBD]
    /// 3.1.4.3) and fills the descriptor scratch list. On failure every
    /// grant made is revoked.
    fn grant_ranges(
        &mut self,
        idx: usize,
        id: BufId,
        len: usize,
        n: usize,
        access: Access,
    ) -> Result<(), Smb2Error> {
        let mut grants = std::mem::take(&mut self.st.bufs[idx].grants);
        grants.clear();
        let mut offset = 0;
        let mut result = Ok(());
        for piece in split_lengths(len, n) {
            match self.grant_raw(id, offset, piece, access) {
                Ok(g) => grants.push(g),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
            offset += piece;
        }
        self.st.bufs[idx].grants = grants;
        if let Err(e) = result {
            let ok = self.release_grants(idx, false);
            self.st.bufs[idx].poisoned |= !ok;
            return Err(e);
        }
        self.st.descs.clear();
        let descs = &mut self.st.descs;
        descs.extend(self.st.bufs[idx].grants.iter().map(buffer_descriptor));
        Ok(())
    }

    /// Checks an RDMA transfer against the connection's limits.
    fn check_rdma(&self, len: u32, descriptors: usize, invalidate: bool) -> Result<(), Smb2Error> {
        let neg = self.check_negotiated()?;
        if invalidate && neg.dialect == Dialect::SMB_3_0 {
            return Err(Smb2Error::Invalid(
                "SMB2_CHANNEL_RDMA_V1_INVALIDATE needs SMB 3.0.2 or later ([MS-SMB2] 2.2.19)"
                    .into(),
            ));
        }
        if descriptors == 0 || descriptors > MAX_DESCRIPTORS || descriptors > len as usize {
            return Err(Smb2Error::Invalid(format!(
                "{descriptors} buffer descriptors for {len} bytes: want 1..={}",
                (len as usize).min(MAX_DESCRIPTORS)
            )));
        }
        let max = self.c.connection().params().max_read_write_size;
        if max != 0 && len > max {
            return Err(Smb2Error::Invalid(format!(
                "RDMA transfer of {len} bytes exceeds the SMB Direct MaxReadWriteSize {max}"
            )));
        }
        Ok(())
    }

    // --- SMB2 commands -----------------------------------------------------

    /// [MS-SMB2] 3.2.4.2.2.2: NEGOTIATE with `dialects` (SMB 3.x; with
    /// 3.1.1 a preauth integrity context offering SHA-512 with a random
    /// 32-byte salt). Records the dialect, the server's limits and
    /// capabilities, and turns multi-credit on with LARGE_MTU.
    pub fn negotiate(&mut self, dialects: &[Dialect]) -> Result<NegotiateInfo, Smb2Error> {
        self.check_alive()?;
        if self.st.negotiated.is_some() || self.st.credits.next_message_id() != 0 {
            return Err(Smb2Error::Invalid(
                "NEGOTIATE must be the first request of a connection ([MS-SMB2] 3.2.4.2.2.2)"
                    .into(),
            ));
        }
        if dialects.is_empty() {
            return Err(Smb2Error::Invalid("NEGOTIATE without dialects".into()));
        }
        let codes: Vec<u16> = dialects.iter().map(|d| d.0).collect();
        let mut salt = [0u8; 32];
        random_bytes(&mut salt);
        let hashes = [HashAlgorithm::SHA_512.0];
        let ctxs = [NegotiateContext::PreauthIntegrity(
            PreauthIntegrityCapabilities {
                hash_algorithms: U16Array::new(&hashes),
                salt: &salt,
            },
        )];
        let offers_311 = codes.contains(&Dialect::SMB_3_1_1.0);
        let req = NegotiateRequestRepr {
            security_mode: SecurityMode::SIGNING_ENABLED,
            capabilities: Capabilities::LARGE_MTU,
            client_guid: self.client_guid,
            dialects: U16Array::new(&codes),
            negotiate_contexts: if offers_311 {
                NegotiateContextList::new(&ctxs)
            } else {
                NegotiateContextList::EMPTY
            },
        };
        let Reply::Negotiate(info) = self.control(Command::Negotiate, &req, Op::Negotiate)? else {
            return Err(Smb2Error::Invalid("NEGOTIATE: unexpected reply".into()));
        };
        let bad = |field: &'static str, detail: String| {
            Smb2Error::Protocol(ProtocolError::Field {
                message_id: 0,
                command: Command::Negotiate,
                field,
                detail,
            })
        };
        if !codes.contains(&info.dialect.0) {
            return Err(bad(
                "DialectRevision",
                format!("{:?} was not offered ({codes:04x?})", info.dialect),
            ));
        }
        for (field, v) in [
            ("MaxTransactSize", info.max_transact_size),
            ("MaxReadSize", info.max_read_size),
            ("MaxWriteSize", info.max_write_size),
        ] {
            if v < MIN_SERVER_IO_SIZE {
                return Err(bad(
                    field,
                    format!("{v} is below {MIN_SERVER_IO_SIZE} ([MS-SMB2] 3.2.5.2)"),
                ));
            }
        }
        self.st
            .credits
            .set_multi_credit(info.capabilities.contains(Capabilities::LARGE_MTU));
        self.st.negotiated = Some(info.clone());
        Ok(info)
    }

    /// [MS-SMB2] 3.2.4.2.3: an anonymous (null) session: SESSION_SETUP with
    /// an empty security buffer. Later requests carry its SessionId.
    pub fn session_setup_anonymous(&mut self) -> Result<SessionInfo, Smb2Error> {
        self.check_negotiated()?;
        let req = SessionSetupRequestRepr {
            flags: SessionSetupFlags::empty(),
            security_mode: SecurityMode::SIGNING_ENABLED,
            capabilities: Capabilities::empty(),
            channel: 0,
            previous_session_id: 0,
            security_buffer: &[],
        };
        let Reply::Session(s) = self.control(Command::SessionSetup, &req, Op::SessionSetup)? else {
            return Err(Smb2Error::Invalid("SESSION_SETUP: unexpected reply".into()));
        };
        self.st.session_id = s.session_id;
        Ok(s)
    }

    /// [MS-SMB2] 3.2.4.2.4: TREE_CONNECT to `share` (a bare name becomes
    /// `\\server\share`; a path starting `\\` is sent as is). Later
    /// requests carry its TreeId.
    pub fn tree_connect(&mut self, share: &str) -> Result<TreeInfo, Smb2Error> {
        self.check_negotiated()?;
        let path = if share.starts_with("\\\\") {
            share.to_string()
        } else {
            format!("\\\\{}\\{share}", self.server)
        };
        let req = TreeConnectRequestRepr {
            flags: TreeConnectFlags::empty(),
            path: Utf16Str::new(&path),
        };
        let Reply::Tree(t) = self.control(Command::TreeConnect, &req, Op::TreeConnect)? else {
            return Err(Smb2Error::Invalid("TREE_CONNECT: unexpected reply".into()));
        };
        self.st.tree_id = t.tree_id;
        Ok(t)
    }

    /// [MS-SMB2] 3.2.4.22: TREE_DISCONNECT of the current tree.
    pub fn tree_disconnect(&mut self) -> Result<(), Smb2Error> {
        self.check_negotiated()?;
        self.control(
            Command::TreeDisconnect,
            &TreeDisconnectRequestRepr,
            Op::Control,
        )?;
        self.st.tree_id = 0;
        Ok(())
    }

    /// [MS-SMB2] 3.2.4.23: LOGOFF of the session.
    pub fn logoff(&mut self) -> Result<(), Smb2Error> {
        self.check_negotiated()?;
        self.control(Command::Logoff, &LogoffRequestRepr, Op::Control)?;
        self.st.session_id = 0;
        self.st.tree_id = 0;
        Ok(())
    }

    /// [MS-SMB2] 3.2.4.3: CREATE `name` (relative to the share) for read
    /// and write, sharing read/write/delete.
    pub fn create(
        &mut self,
        name: &str,
        disposition: CreateDisposition,
        options: CreateOptions,
    ) -> Result<CreateInfo, Smb2Error> {
        self.check_negotiated()?;
        let req = CreateRequestRepr {
            security_flags: 0,
            requested_oplock_level: OplockLevel::NONE,
            impersonation_level: ImpersonationLevel::IMPERSONATION,
            smb_create_flags: 0,
            desired_access: AccessMask::GENERIC_READ | AccessMask::GENERIC_WRITE,
            file_attributes: FileAttributes::NORMAL,
            share_access: ShareAccess::READ | ShareAccess::WRITE | ShareAccess::DELETE,
            create_disposition: disposition,
            create_options: options,
            name: Utf16Str::new(name),
            create_contexts: CreateContextList::EMPTY,
        };
        let Reply::Create(c) = self.control(Command::Create, &req, Op::Create)? else {
            return Err(Smb2Error::Invalid("CREATE: unexpected reply".into()));
        };
        Ok(c)
    }

    /// [MS-SMB2] 3.2.4.5: CLOSE.
    pub fn close(&mut self, fid: FileId) -> Result<(), Smb2Error> {
        self.check_negotiated()?;
        let req = CloseRequestRepr {
            flags: CloseFlags::empty(),
            file_id: fid,
        };
        self.control(Command::Close, &req, Op::Control).map(|_| ())
    }

    /// [MS-SMB2] 3.2.4.10: FLUSH.
    pub fn flush(&mut self, fid: FileId) -> Result<(), Smb2Error> {
        self.check_negotiated()?;
        self.control(
            Command::Flush,
            &FlushRequestRepr { file_id: fid },
            Op::Control,
        )
        .map(|_| ())
    }

    /// [MS-SMB2] 3.2.4.17: ECHO.
    pub fn echo(&mut self) -> Result<(), Smb2Error> {
        self.control(Command::Echo, &EchoRequestRepr, Op::Control)
            .map(|_| ())
    }

    /// [MS-SMB2] 3.2.4.20: an FSCTL on `fid` ([`FileId::ANY`] for codes
    /// without an open). Returns the status (STATUS_SUCCESS, or the
    /// STATUS_BUFFER_OVERFLOW warning with truncated output) and the output
    /// buffer; an error status is [`Smb2Error::Status`].
    pub fn ioctl(
        &mut self,
        fid: FileId,
        ctl_code: u32,
        input: &[u8],
        max_output: u32,
    ) -> Result<(NtStatus, Vec<u8>), Smb2Error> {
        let neg = self.check_negotiated()?;
        let max = neg.max_transact_size;
        if input.len() > max as usize || max_output > max {
            return Err(Smb2Error::Invalid(format!(
                "IOCTL input {} / MaxOutputResponse {max_output} exceed MaxTransactSize {max}",
                input.len()
            )));
        }
        let payload = (input.len() as u64).max(u64::from(max_output));
        let charge = self.charge(Command::Ioctl, payload)?;
        self.ensure_credits(charge.credits)?;
        let req = IoctlRequestRepr::fsctl(ctl_code, fid, input, max_output);
        let id = self.send_with(Command::Ioctl, charge, &req, Op::Ioctl { max_output })?;
        match self.call(id)? {
            Reply::Ioctl { status, output } => Ok((status, output)),
            _ => Err(Smb2Error::Invalid("IOCTL: unexpected reply".into())),
        }
    }

    // --- READ / WRITE ------------------------------------------------------

    /// [MS-SMB2] 3.2.4.6: READ of `len` bytes at `offset` into `buf`,
    /// without waiting. The completion's result is the byte count; the data
    /// is at the start of `buf`.
    pub fn submit_read(
        &mut self,
        fid: FileId,
        offset: u64,
        len: u32,
        buf: IoBuf,
        transfer: Transfer,
    ) -> Result<MessageId, Smb2Error> {
        let neg = self.check_negotiated()?;
        if len > neg.max_read_size {
            return Err(Smb2Error::Invalid(format!(
                "READ of {len} bytes exceeds MaxReadSize {}",
                neg.max_read_size
            )));
        }
        let id = self.st.lendable(buf, len as usize)?;
        let charge = self.charge(Command::Read, u64::from(len))?;
        self.check_credits(charge)?;
        let idx = buf.index as usize;
        let (channel, rdma) = match transfer {
            Transfer::Inline => {
                let max = self.c.connection().params().max_fragmented_recv_size;
                if u64::from(len) + u64::from(READ_RESPONSE_DATA_OFFSET) > u64::from(max) {
                    return Err(Smb2Error::Invalid(format!(
                        "inline READ of {len} bytes: the response exceeds our \
                         MaxFragmentedRecvSize {max}; use RDMA"
                    )));
                }
                self.st.descs.clear();
                (Channel::None, None)
            }
            Transfer::Rdma {
                descriptors,
                invalidate,
            } => {
                self.check_rdma(len, descriptors, invalidate)?;
                self.grant_ranges(idx, id, len as usize, descriptors, Access::RemoteWrite)?;
                let ch = if invalidate {
                    Channel::RdmaV1Invalidate
                } else {
                    Channel::RdmaV1
                };
                (ch, Some(invalidate))
            }
        };
        let r = match self.st.credits.reserve(charge.credits) {
            Ok(r) => r,
            Err(e) => {
                self.abort_grants(idx);
                return Err(e);
            }
        };
        let h = self.st.header(Command::Read, &r, charge.wire);
        let req = ReadRequestRepr {
            // [MS-SMB2] 2.2.19: where the client wants the data (header
            // plus the response's fixed part).
            padding: READ_RESPONSE_DATA_OFFSET as u8,
            flags: ReadFlags::empty(),
            length: len,
            offset,
            file_id: fid,
            minimum_count: 0,
            channel,
            remaining_bytes: 0,
            channel_info: ChannelInfo::descriptors(&self.st.descs),
        };
        let n = emit_into(&mut self.st.scratch, &h, &req);
        let op = Op::Read { buf, len, rdma };
        self.send_io(n, Command::Read, r, op, idx)
    }

    /// [MS-SMB2] 3.2.4.7: WRITE of the first `len` bytes of `buf` at
    /// `offset`, without waiting. The completion's result is the Count the
    /// server wrote.
    pub fn submit_write(
        &mut self,
        fid: FileId,
        offset: u64,
        len: u32,
        buf: IoBuf,
        transfer: Transfer,
    ) -> Result<MessageId, Smb2Error> {
        let neg = self.check_negotiated()?;
        if len > neg.max_write_size {
            return Err(Smb2Error::Invalid(format!(
                "WRITE of {len} bytes exceeds MaxWriteSize {}",
                neg.max_write_size
            )));
        }
        let id = self.st.lendable(buf, len as usize)?;
        let charge = self.charge(Command::Write, u64::from(len))?;
        self.check_credits(charge)?;
        let idx = buf.index as usize;
        let rdma = match transfer {
            Transfer::Inline => {
                self.check_inline_write(len)?;
                None
            }
            Transfer::Rdma {
                descriptors,
                invalidate,
            } => {
                self.check_rdma(len, descriptors, invalidate)?;
                self.grant_ranges(idx, id, len as usize, descriptors, Access::RemoteRead)?;
                Some(invalidate)
            }
        };
        let r = match self.st.credits.reserve(charge.credits) {
            Ok(r) => r,
            Err(e) => {
                self.abort_grants(idx);
                return Err(e);
            }
        };
        let h = self.st.header(Command::Write, &r, charge.wire);
        let n = match rdma {
            None => {
                // SAFETY: the buffer is live and not lent (checked by
                // `lendable`): no grant and no request writes it; the
                // slice ends before the next `&mut` use of the pool.
                let data = unsafe { self.st.pool.bytes(id) }.and_then(|b| b.get(..len as usize));
                match data {
                    Some(data) => {
                        let req = write_request(fid, offset, data, Channel::None, 0, &[]);
                        emit_into(&mut self.st.scratch, &h, &req)
                    }
                    None => Err(wire::Smb2Error::BufferTooSmall {
                        what: "I/O buffer",
                        need: len as usize,
                        have: 0,
                    }),
                }
            }
            Some(invalidate) => {
                let ch = if invalidate {
                    Channel::RdmaV1Invalidate
                } else {
                    Channel::RdmaV1
                };
                let req = write_request(fid, offset, &[], ch, len, &self.st.descs);
                emit_into(&mut self.st.scratch, &h, &req)
            }
        };
        let op = Op::Write {
            buf: Some(buf),
            len,
            rdma,
        };
        self.send_io(n, Command::Write, r, op, idx)
    }

    fn check_inline_write(&self, len: u32) -> Result<(), Smb2Error> {
        let max = self.c.connection().params().max_fragmented_send_size;
        if u64::from(len) + u64::from(WRITE_REQUEST_DATA_OFFSET) > u64::from(max) {
            return Err(Smb2Error::Invalid(format!(
                "inline WRITE of {len} bytes exceeds the server's MaxFragmentedSize {max}; use RDMA"
            )));
        }
        Ok(())
    }

    /// Revokes the grants of a request that was never sent.
    fn abort_grants(&mut self, idx: usize) {
        let ok = self.release_grants(idx, false);
        if let Some(s) = self.st.bufs.get_mut(idx) {
            s.poisoned |= !ok;
        }
    }

    /// Sends an emitted READ/WRITE and lends its buffer.
    fn send_io(
        &mut self,
        emitted: Result<usize, wire::Smb2Error>,
        command: Command,
        r: Reservation,
        op: Op,
        idx: usize,
    ) -> Result<MessageId, Smb2Error> {
        let n = match emitted {
            Ok(n) => n,
            Err(e) => {
                self.st.credits.unreserve(&r);
                self.abort_grants(idx);
                return Err(Smb2Error::Invalid(format!("encoding {command:?}: {e}")));
            }
        };
        match self.transmit(n, command, r, op) {
            Ok(id) => {
                self.st.bufs[idx].busy = true;
                Ok(id)
            }
            Err(e) => {
                self.abort_grants(idx);
                Err(e)
            }
        }
    }

    /// [MS-SMB2] 3.2.4.10: FLUSH, without waiting.
    pub fn submit_flush(&mut self, fid: FileId) -> Result<MessageId, Smb2Error> {
        self.check_negotiated()?;
        let charge = self.charge(Command::Flush, 0)?;
        self.check_credits(charge)?;
        self.send_with(
            Command::Flush,
            charge,
            &FlushRequestRepr { file_id: fid },
            Op::Control,
        )
    }

    /// [MS-SMB2] 3.2.4.17: ECHO, without waiting.
    pub fn submit_echo(&mut self) -> Result<MessageId, Smb2Error> {
        let charge = self.charge(Command::Echo, 0)?;
        self.check_credits(charge)?;
        self.send_with(Command::Echo, charge, &EchoRequestRepr, Op::Control)
    }

    /// The internal buffer of synchronous READ/WRITE, at least `len` bytes.
    fn sync_buf(&mut self, len: usize) -> Result<IoBuf, Smb2Error> {
        if let Some(b) = self.sync_buf {
            match self.st.slot(b) {
                Ok(s) if !s.busy && !s.poisoned && s.len >= len => return Ok(b),
                // Still lent to an abandoned call: leave it to its completion.
                Ok(s) if s.busy || s.poisoned => self.sync_buf = None,
                Ok(_) => {
                    self.free_io_buf(b)?;
                    self.sync_buf = None;
                }
                Err(_) => self.sync_buf = None,
            }
        }
        let b = self.alloc_io_buf(len.max(4096).next_power_of_two())?;
        self.sync_buf = Some(b);
        Ok(b)
    }

    /// [MS-SMB2] 3.2.4.6: READ of up to `len` bytes at `offset`; returns
    /// the bytes read.
    pub fn read(
        &mut self,
        fid: FileId,
        offset: u64,
        len: u32,
        transfer: Transfer,
    ) -> Result<Vec<u8>, Smb2Error> {
        let mut out = vec![0u8; len as usize];
        let n = self.read_into(fid, offset, &mut out, transfer)?;
        out.truncate(n);
        Ok(out)
    }

    /// [`read`](Self::read) into `out` (up to `out.len()` bytes); returns
    /// the bytes read.
    pub fn read_into(
        &mut self,
        fid: FileId,
        offset: u64,
        out: &mut [u8],
        transfer: Transfer,
    ) -> Result<usize, Smb2Error> {
        let len = u32::try_from(out.len())
            .map_err(|_| Smb2Error::Invalid(format!("READ of {} bytes", out.len())))?;
        self.check_negotiated()?;
        let b = self.sync_buf(out.len())?;
        let charge = self.charge(Command::Read, u64::from(len))?;
        self.ensure_credits(charge.credits)?;
        let id = self.submit_read(fid, offset, len, b, transfer)?;
        let n = self.call(id)?.bytes() as usize;
        let data = self
            .io_buf(b)
            .and_then(|d| d.get(..n))
            .ok_or_else(|| Smb2Error::Resources("READ buffer unusable after the read".into()))?;
        out[..n].copy_from_slice(data);
        Ok(n)
    }

    /// [MS-SMB2] 3.2.4.7: WRITE of `data` at `offset`; returns the Count
    /// written. Inline data goes straight into the message; RDMA data is
    /// staged in an internal pool buffer.
    pub fn write(
        &mut self,
        fid: FileId,
        offset: u64,
        data: &[u8],
        transfer: Transfer,
    ) -> Result<u32, Smb2Error> {
        let len = u32::try_from(data.len())
            .map_err(|_| Smb2Error::Invalid(format!("WRITE of {} bytes", data.len())))?;
        let neg = self.check_negotiated()?;
        if len > neg.max_write_size {
            return Err(Smb2Error::Invalid(format!(
                "WRITE of {len} bytes exceeds MaxWriteSize {}",
                neg.max_write_size
            )));
        }
        let charge = self.charge(Command::Write, u64::from(len))?;
        self.ensure_credits(charge.credits)?;
        let id = match transfer {
            Transfer::Inline => {
                self.check_inline_write(len)?;
                let req = write_request(fid, offset, data, Channel::None, 0, &[]);
                let op = Op::Write {
                    buf: None,
                    len,
                    rdma: None,
                };
                self.send_with(Command::Write, charge, &req, op)?
            }
            Transfer::Rdma { .. } => {
                let b = self.sync_buf(data.len())?;
                self.io_buf_mut(b)
                    .and_then(|d| d.get_mut(..data.len()))
                    .ok_or_else(|| Smb2Error::Resources("WRITE staging buffer unusable".into()))?
                    .copy_from_slice(data);
                self.submit_write(fid, offset, len, b, transfer)?
            }
        };
        Ok(self.call(id)?.bytes())
    }

    // --- Storage QoS ([MS-SQOS] 3.1.4.1) -----------------------------------

    /// Sends a STORAGE_QOS_CONTROL_REQUEST the flow built as an IOCTL on
    /// `fid` and feeds the outcome back to the flow ([`qos_outcome`]).
    pub fn qos_request(
        &mut self,
        fid: FileId,
        flow: &mut LogicalFlow,
        req: &ClientRequest<'_>,
        now: PInstant,
    ) -> Result<Option<StorageQosControlResponseRepr>, Smb2Error> {
        let input = req.repr.to_vec();
        let r = self.ioctl(
            fid,
            FSCTL_STORAGE_QOS_CONTROL,
            &input,
            req.max_response_size,
        );
        qos_outcome(flow, r, now)
    }

    /// SET_POLICY | GET_STATUS (plus UPDATE_COUNTERS, and
    /// SET_LOGICAL_FLOW_ID while the handle is not associated), in the
    /// flow's dialect (1.0 or 1.1).
    pub fn qos_set_policy(
        &mut self,
        fid: FileId,
        flow: &mut LogicalFlow,
        policy: PolicyParams<'_>,
        now: PInstant,
    ) -> Result<Option<StorageQosControlResponseRepr>, Smb2Error> {
        let req = flow.set_policy_request(policy, now);
        self.qos_request(fid, flow, &req, now)
    }

    /// PROBE_POLICY | GET_STATUS ([MS-SQOS] 4.3).
    pub fn qos_probe_policy(
        &mut self,
        fid: FileId,
        flow: &mut LogicalFlow,
        policy: PolicyParams<'_>,
        now: PInstant,
    ) -> Result<Option<StorageQosControlResponseRepr>, Smb2Error> {
        let req = flow.probe_policy_request(policy, now);
        self.qos_request(fid, flow, &req, now)
    }

    /// UPDATE_COUNTERS alone: reports the flow's counters (and zeroes them).
    pub fn qos_update_counters(
        &mut self,
        fid: FileId,
        flow: &mut LogicalFlow,
        now: PInstant,
    ) -> Result<(), Smb2Error> {
        let req = flow.request(QosOptions::NONE, None, now);
        self.qos_request(fid, flow, &req, now).map(|_| ())
    }

    /// GET_STATUS | UPDATE_COUNTERS ([MS-SQOS] 3.1.6): the flow's status.
    pub fn qos_get_status(
        &mut self,
        fid: FileId,
        flow: &mut LogicalFlow,
        now: PInstant,
    ) -> Result<StorageQosControlResponseRepr, Smb2Error> {
        let req = flow.status_request(now);
        self.qos_request(fid, flow, &req, now)?
            .ok_or(Smb2Error::Protocol(ProtocolError::Qos(
                WireError::Truncated {
                    what: "STORAGE_QOS_CONTROL_RESPONSE",
                    need: req.max_response_size as usize,
                    have: 0,
                },
            )))
    }
}

/// A WRITE request body.
fn write_request<'a>(
    fid: FileId,
    offset: u64,
    data: &'a [u8],
    channel: Channel,
    remaining: u32,
    descs: &'a [BufferDescriptorRepr],
) -> WriteRequestRepr<'a> {
    WriteRequestRepr {
        offset,
        file_id: fid,
        channel,
        // [MS-SMB2] 2.2.21: over RDMA, RemainingBytes is the length to
        // read from the descriptors and Length is 0.
        remaining_bytes: remaining,
        flags: WriteFlags::empty(),
        data,
        channel_info: ChannelInfo::descriptors(descs),
    }
}

/// Whether a retry may go on: `deadline` (`timeout` after the first call,
/// which sets it) has not passed. Callers read the clock only once an
/// attempt has failed, not on every request.
fn before(deadline: &mut Option<Instant>, timeout: Duration) -> bool {
    let now = crate::clock::now();
    now < *deadline.get_or_insert(now + timeout)
}

#[cfg(test)]
mod tests {
    use super::*;
    use smbdirect_protocol::smb2::{
        compound, emit_message, ErrorResponseRepr, IoctlRequest, IoctlResponseRepr,
        NegotiateResponseRepr, ReadResponseRepr, RequestBody,
    };
    use smbdirect_protocol::sqos::{
        Dialect as QosDialect, FlowStatus, StorageQosControlRequestRepr, Utf16Name,
    };

    fn response(command: Command, id: u64, status: NtStatus, body: &dyn Smb2Body) -> Vec<u8> {
        let mut h = HeaderRepr::request(command, id).response_to(status);
        h.credit = 1;
        let mut buf = vec![0u8; HEADER_LEN + body.buffer_len()];
        let n = emit_message(&h, body, &mut buf).unwrap();
        buf.truncate(n);
        buf
    }

    fn state_with_buffer() -> (State, SliceAllocator) {
        use smbdirect_hugepages::{HugepagePolicy, PoolConfig, SizeClass};
        let pool = PoolConfig::new(1 << 20, 1)
            .class(SizeClass::new("io", 4096).per_slice(4))
            .hugepages(HugepagePolicy::Disable)
            .mlock(false)
            .build()
            .unwrap();
        let mut alloc = pool.claim_slice(0).unwrap();
        let id = alloc.alloc_len(16).unwrap();
        let st = State {
            pool,
            credits: CreditWindow::new(64),
            pending: id_map(0),
            finished: VecDeque::new(),
            ready: VecDeque::new(),
            bufs: vec![BufSlot {
                id,
                len: 16,
                generation: 0,
                live: true,
                busy: true,
                poisoned: false,
                grants: Vec::new(),
            }],
            free_slots: Vec::new(),
            descs: Vec::new(),
            scratch: Vec::new(),
            session_id: 0,
            tree_id: 0,
            negotiated: None,
            dead: None,
            stats: ClientStats::default(),
            local_wrs: 0,
        };
        (st, alloc)
    }

    fn pending(command: Command, op: Op, expect: u16) -> Pending {
        Pending {
            command,
            expect,
            submitted: Instant::now(),
            op,
            async_id: None,
            abandoned: false,
        }
    }

    #[test]
    fn responses_match_by_message_id_and_interim_ones_only_grant_credits() {
        let (mut st, _alloc) = state_with_buffer();
        let buf = IoBuf {
            index: 0,
            generation: 0,
        };
        let mut e = st.credits.reserve(1).unwrap().credit_request;
        st.credits.on_response(0, &mut e); // as if the request was READ 0
        let read = Op::Read {
            buf,
            len: 16,
            rdma: None,
        };
        st.pending.insert(5, pending(Command::Read, read, e));
        st.pending
            .insert(6, pending(Command::Flush, Op::Control, 0));
        let avail = st.credits.available();

        // [MS-SMB2] 3.2.5.1.3: no request waits for MessageId 99.
        let data = [0xA5u8; 16];
        let body = ReadResponseRepr {
            data: &data,
            data_remaining: 0,
            flags: 0,
        };
        st.on_message(&response(Command::Read, 99, STATUS_SUCCESS, &body), None);
        // A request is not a response.
        let mut req = vec![0u8; HEADER_LEN + 4];
        let n = emit_message(
            &HeaderRepr::request(Command::Echo, 5),
            &EchoRequestRepr,
            &mut req,
        )
        .unwrap();
        st.on_message(&req[..n], None);
        // Garbage does not delimit an SMB2 message.
        st.on_message(&[1, 2, 3], None);
        assert_eq!(st.stats.discarded, 3);
        assert_eq!(st.credits.available(), avail);
        assert_eq!(st.pending.len(), 2);

        // [MS-SMB2] 3.2.5.1.5: an interim response grants credits only.
        let mut h = HeaderRepr::request(Command::Read, 5).response_to(STATUS_PENDING);
        h.id = HeaderId::Async { async_id: 77 };
        h.credit = 4;
        let mut msg = vec![0u8; HEADER_LEN + 9];
        let n = emit_message(&h, &ErrorResponseRepr::EMPTY, &mut msg).unwrap();
        st.on_message(&msg[..n], None);
        assert_eq!(st.stats.interim, 1);
        assert_eq!(st.credits.available(), avail + 4);
        assert_eq!(st.pending[&5].async_id, Some(77));
        assert!(st.finished.is_empty());

        // The final response: data copied into the lent buffer.
        st.on_message(&response(Command::Read, 5, STATUS_SUCCESS, &body), None);
        let f = st.finished.pop_front().unwrap();
        assert_eq!((f.id, f.outcome.unwrap()), (5, Reply::Bytes(16)));
        // SAFETY: test-only; nothing else touches the buffer.
        let got = unsafe { st.pool.bytes(st.bufs[0].id) }.unwrap();
        assert_eq!(&got[..16], &data);
        assert_eq!(st.credits.available(), avail + 5);
        assert_eq!(st.credits.expected(), 0);

        // [MS-SMB2] 3.2.5.1.8: a response of another command fails the
        // request.
        st.on_message(
            &response(Command::Echo, 6, STATUS_SUCCESS, &wire::EchoResponseRepr),
            None,
        );
        let f = st.finished.pop_front().unwrap();
        assert!(matches!(
            f.outcome,
            Err(Smb2Error::Protocol(ProtocolError::CommandMismatch {
                sent: Command::Flush,
                received: Command::Echo,
                ..
            }))
        ));
        assert!(st.pending.is_empty());
    }

    #[test]
    fn a_dead_connection_fails_every_outstanding_request() {
        let (mut st, _alloc) = state_with_buffer();
        st.pending
            .insert(1, pending(Command::Flush, Op::Control, 3));
        st.pending.insert(2, pending(Command::Echo, Op::Control, 0));
        st.mark_dead(Arc::new(ClientError::Timeout("test")));
        assert!(st.pending.is_empty());
        assert_eq!(st.finished.len(), 2);
        assert!(st
            .finished
            .iter()
            .all(|f| matches!(f.outcome, Err(Smb2Error::Transport(_)))));
        assert!(st.dead.is_some());
    }

    fn decode_msg(op: Op, msg: &[u8]) -> Result<Decoded<'_>, Smb2Error> {
        let m = compound(msg).next().unwrap().unwrap();
        let h = *m.header();
        decode(&op, &h, m.body())
    }

    #[test]
    fn credit_window_starts_as_message_id_zero_with_one_credit() {
        let w = CreditWindow::new(512);
        assert_eq!(w.available(), 1);
        assert_eq!(w.next_message_id(), 0);
        assert!(!w.multi_credit());
    }

    #[test]
    fn negotiate_charges_zero_but_consumes_one_identifier() {
        let mut w = CreditWindow::new(512);
        let c = w.charge(Command::Negotiate, 0).unwrap();
        assert_eq!(
            c,
            Charge {
                wire: 0,
                credits: 1
            }
        );
        let r = w.reserve(c.credits).unwrap();
        assert_eq!(r.message_id, 0);
        assert_eq!(w.next_message_id(), 1);
        assert_eq!(w.available(), 0);
        // The first request asks for the whole target.
        assert_eq!(r.credit_request, 512);
    }

    #[test]
    fn multi_credit_charge_is_ceil_payload_over_64k_for_read_write_ioctl_only() {
        let mut w = CreditWindow::new(512);
        w.set_multi_credit(true);
        for (len, n) in [(0, 1), (1, 1), (65_536, 1), (65_537, 2), (1 << 20, 16)] {
            for cmd in [Command::Read, Command::Write, Command::Ioctl] {
                assert_eq!(w.charge(cmd, len).unwrap().credits, n, "{cmd:?} {len}");
                assert_eq!(w.charge(cmd, len).unwrap().wire, n);
            }
        }
        // [MS-SMB2] 3.2.4.1.5: every other command charges 1.
        assert_eq!(w.charge(Command::Create, 1 << 20).unwrap().credits, 1);
        assert_eq!(w.charge(Command::Echo, 0).unwrap().wire, 1);
    }

    #[test]
    fn without_multi_credit_payloads_over_64k_are_refused() {
        let w = CreditWindow::new(512);
        assert_eq!(
            w.charge(Command::Read, 65_536),
            Some(Charge {
                wire: 0,
                credits: 1
            })
        );
        assert_eq!(w.charge(Command::Read, 65_537), None);
    }

    #[test]
    fn message_ids_advance_by_the_charge_and_credits_never_go_negative() {
        let mut w = CreditWindow::new(64);
        let mut e = w.reserve(1).unwrap().credit_request;
        w.on_response(20, &mut e);
        w.settle(e);
        assert_eq!(w.available(), 20);
        let a = w.reserve(16).unwrap();
        let b = w.reserve(2).unwrap();
        assert_eq!((a.message_id, b.message_id), (1, 17));
        assert_eq!(w.next_message_id(), 19);
        assert_eq!(w.available(), 2);
        // Three credits are not held: nothing changes.
        let before = w.clone();
        assert!(matches!(
            w.reserve(3),
            Err(Smb2Error::NoCredits { need: 3, have: 2 })
        ));
        assert_eq!(w, before);
    }

    #[test]
    fn credit_requests_top_up_to_the_target_and_ask_back_the_charge() {
        let mut w = CreditWindow::new(512);
        let mut e = w.reserve(1).unwrap().credit_request;
        w.on_response(512, &mut e);
        w.settle(e);
        assert_eq!(w.available(), 512);
        assert_eq!(w.expected(), 0);
        // Steady state: each request asks its charge back.
        let r = w.reserve(1).unwrap();
        assert_eq!(r.credit_request, 1);
        let r16 = w.reserve(16).unwrap();
        assert_eq!(r16.credit_request, 16);
        // A short grant is asked for again by the next request.
        let mut e = r16.credit_request;
        w.on_response(6, &mut e);
        w.settle(e);
        let mut e1 = r.credit_request;
        w.on_response(1, &mut e1);
        w.settle(e1);
        assert_eq!(w.available(), 502);
        let next = w.reserve(1).unwrap();
        assert_eq!(next.credit_request, 11);
    }

    #[test]
    fn interim_grants_count_once_and_settle_drops_the_rest() {
        let mut w = CreditWindow::new(8);
        let r = w.reserve(1).unwrap();
        assert_eq!(w.expected(), 8);
        let mut e = r.credit_request;
        w.on_response(3, &mut e); // interim
        assert_eq!((w.available(), w.expected(), e), (3, 5, 5));
        w.on_response(0, &mut e); // final, no grant
        w.settle(e);
        assert_eq!((w.available(), w.expected()), (3, 0));
    }

    #[test]
    fn unreserve_restores_an_unsent_request() {
        let mut w = CreditWindow::new(4);
        let before = w.clone();
        let r = w.reserve(1).unwrap();
        w.unreserve(&r);
        assert_eq!(w, before);
    }

    #[test]
    fn split_lengths_cover_the_transfer_in_near_equal_ranges() {
        for (len, n) in [(65_536, 1), (65_536, 2), (100_003, 16), (16, 16), (4096, 3)] {
            let v: Vec<usize> = split_lengths(len, n).collect();
            assert_eq!(v.len(), n);
            assert_eq!(v.iter().sum::<usize>(), len);
            let (min, max) = (v.iter().min().unwrap(), v.iter().max().unwrap());
            assert!(*min >= 1 && max - min <= 1, "{v:?}");
        }
    }

    #[test]
    fn an_error_response_is_the_status_and_a_bad_body_is_a_protocol_error() {
        let msg = response(
            Command::Read,
            7,
            STATUS_END_OF_FILE,
            &ErrorResponseRepr::EMPTY,
        );
        let op = Op::Read {
            buf: IoBuf {
                index: 0,
                generation: 0,
            },
            len: 10,
            rdma: None,
        };
        assert!(matches!(
            decode_msg(op, &msg),
            Err(Smb2Error::Status(s)) if s == STATUS_END_OF_FILE
        ));
        // A success status with an ERROR body (StructureSize 9) does not
        // decode as a READ response.
        let msg = response(Command::Read, 7, STATUS_SUCCESS, &ErrorResponseRepr::EMPTY);
        assert!(matches!(
            decode_msg(op, &msg),
            Err(Smb2Error::Protocol(ProtocolError::Decode {
                message_id: 7,
                ..
            }))
        ));
    }

    #[test]
    fn read_responses_longer_than_the_request_are_refused() {
        let data = [5u8; 11];
        let body = ReadResponseRepr {
            data: &data,
            data_remaining: 0,
            flags: 0,
        };
        let msg = response(Command::Read, 1, STATUS_SUCCESS, &body);
        let op = |rdma| Op::Read {
            buf: IoBuf {
                index: 0,
                generation: 0,
            },
            len: 10,
            rdma,
        };
        assert!(matches!(
            decode_msg(op(None), &msg),
            Err(Smb2Error::Protocol(ProtocolError::Field {
                field: "DataLength",
                ..
            }))
        ));
        // Over RDMA the count is DataRemaining.
        let body = ReadResponseRepr {
            data: &[],
            data_remaining: 10,
            flags: 0,
        };
        let msg = response(Command::Read, 1, STATUS_SUCCESS, &body);
        assert_eq!(
            decode_msg(op(Some(true)), &msg).unwrap(),
            Decoded::Reply(Reply::Bytes(10))
        );
        let body = ReadResponseRepr {
            data: &[],
            data_remaining: 11,
            flags: 0,
        };
        let msg = response(Command::Read, 1, STATUS_SUCCESS, &body);
        assert!(decode_msg(op(Some(false)), &msg).is_err());
    }

    fn negotiate_body<'a>(
        dialect: Dialect,
        ctxs: NegotiateContextList<'a>,
    ) -> NegotiateResponseRepr<'a> {
        NegotiateResponseRepr {
            security_mode: SecurityMode::SIGNING_ENABLED,
            dialect_revision: dialect.0,
            server_guid: Guid::from_bytes([9; 16]),
            capabilities: Capabilities::LARGE_MTU,
            max_transact_size: 1 << 20,
            max_read_size: 1 << 20,
            max_write_size: 1 << 20,
            system_time: 1,
            server_start_time: 0,
            security_buffer: &[],
            negotiate_contexts: ctxs,
        }
    }

    #[test]
    fn a_3_1_1_negotiate_response_needs_one_sha512_preauth_context() {
        let msg = response(
            Command::Negotiate,
            0,
            STATUS_SUCCESS,
            &negotiate_body(Dialect::SMB_3_1_1, NegotiateContextList::EMPTY),
        );
        assert!(matches!(
            decode_msg(Op::Negotiate, &msg),
            Err(Smb2Error::Protocol(ProtocolError::Field {
                field: "NegotiateContextList",
                ..
            }))
        ));
        let salt = [1u8; 32];
        let hashes = [HashAlgorithm::SHA_512.0];
        let ctxs = [NegotiateContext::PreauthIntegrity(
            PreauthIntegrityCapabilities {
                hash_algorithms: U16Array::new(&hashes),
                salt: &salt,
            },
        )];
        let msg = response(
            Command::Negotiate,
            0,
            STATUS_SUCCESS,
            &negotiate_body(Dialect::SMB_3_1_1, NegotiateContextList::new(&ctxs)),
        );
        let Ok(Decoded::Reply(Reply::Negotiate(info))) = decode_msg(Op::Negotiate, &msg) else {
            panic!("negotiate info")
        };
        assert_eq!(info.dialect, Dialect::SMB_3_1_1);
        assert_eq!(info.preauth_hash, Some(HashAlgorithm::SHA_512));
        assert_eq!(info.server_salt, salt);
        assert_eq!(info.max_read_size, 1 << 20);
        // 3.0.2 carries no contexts.
        let msg = response(
            Command::Negotiate,
            0,
            STATUS_SUCCESS,
            &negotiate_body(Dialect::SMB_3_0_2, NegotiateContextList::EMPTY),
        );
        assert!(decode_msg(Op::Negotiate, &msg).is_ok());
    }

    #[test]
    fn ioctl_passes_the_buffer_overflow_warning_and_checks_the_output_limit() {
        let out = [3u8; 20];
        let body = IoctlResponseRepr {
            ctl_code: 0x1234,
            file_id: FileId::ANY,
            input: &[],
            output: &out,
            flags: 0,
        };
        let msg = response(Command::Ioctl, 2, STATUS_BUFFER_OVERFLOW, &body);
        assert_eq!(
            decode_msg(Op::Ioctl { max_output: 20 }, &msg).unwrap(),
            Decoded::Ioctl {
                status: STATUS_BUFFER_OVERFLOW,
                output: &out
            }
        );
        assert!(matches!(
            decode_msg(Op::Ioctl { max_output: 19 }, &msg),
            Err(Smb2Error::Protocol(ProtocolError::Field {
                field: "OutputCount",
                ..
            }))
        ));
        // Other commands take no warning.
        let msg = response(
            Command::Flush,
            2,
            STATUS_BUFFER_OVERFLOW,
            &wire::FlushResponseRepr,
        );
        assert!(matches!(
            decode_msg(Op::Control, &msg),
            Err(Smb2Error::Status(s)) if s == STATUS_BUFFER_OVERFLOW
        ));
    }

    /// The IOCTL a QoS helper sends, as the server sees it.
    fn qos_ioctl_message(fid: FileId, req: &ClientRequest<'_>) -> Vec<u8> {
        let mut w = CreditWindow::new(16);
        w.set_multi_credit(true);
        let input = req.repr.to_vec();
        let ioctl = IoctlRequestRepr::fsctl(
            FSCTL_STORAGE_QOS_CONTROL,
            fid,
            &input,
            req.max_response_size,
        );
        let payload = (input.len() as u64).max(u64::from(req.max_response_size));
        let c = w.charge(Command::Ioctl, payload).unwrap();
        let r = w.reserve(c.credits).unwrap();
        let h = HeaderRepr {
            credit_charge: c.wire,
            credit: r.credit_request,
            message_id: r.message_id,
            ..HeaderRepr::request(Command::Ioctl, 0)
        };
        let mut scratch = Vec::new();
        let n = emit_into(&mut scratch, &h, &ioctl).unwrap();
        scratch.truncate(n);
        scratch
    }

    #[test]
    fn qos_requests_encode_as_fsctl_storage_qos_control_in_both_dialects() {
        let fid = FileId::new(3, 4);
        for dialect in [QosDialect::V1_0, QosDialect::V1_1] {
            let mut flow = LogicalFlow::new(Guid::from_bytes([7; 16]), dialect);
            flow.record_io(
                8192,
                smbdirect_protocol::time::Duration::from_micros(50),
                smbdirect_protocol::time::Duration::from_micros(40),
            );
            let name = Utf16Name::new("node-a").unwrap();
            let policy = PolicyParams {
                policy_id: Guid::from_bytes([2; 16]),
                initiator_id: Guid::from_bytes([5; 16]),
                limit: 1000,
                reservation: 100,
                bandwidth_limit: 4096,
                initiator_name: name,
                initiator_node_name: Utf16Name::EMPTY,
            };
            let req = flow.set_policy_request(policy, PInstant::ZERO);
            let msg = qos_ioctl_message(fid, &req);
            let m = compound(&msg).next().unwrap().unwrap();
            assert_eq!(m.header().credit_charge, 1);
            let RequestBody::Ioctl(io) = m.request_body().unwrap() else {
                panic!("an IOCTL")
            };
            assert_eq!(io.ctl_code, FSCTL_STORAGE_QOS_CONTROL);
            assert_eq!(io.file_id, fid);
            assert!(io.flags.contains(wire::IoctlFlags::IS_FSCTL));
            assert_eq!(io.max_output_response as usize, dialect.response_len());
            let view = IoctlRequest::new_checked(m.body()).unwrap();
            let sq = view.storage_qos_control_request().unwrap().unwrap();
            let parsed = StorageQosControlRequestRepr::parse(&sq).unwrap();
            assert_eq!(parsed, req.repr);
            assert_eq!(parsed.dialect, dialect);
            assert!(parsed.options.contains(
                QosOptions::SET_POLICY
                    | QosOptions::GET_STATUS
                    | QosOptions::UPDATE_COUNTERS
                    | QosOptions::SET_LOGICAL_FLOW_ID
            ));
            assert_eq!(parsed.limit, 1000);
            assert_eq!(parsed.io_count_increment, 1);
            assert_eq!(parsed.initiator_name, name);
            // BandwidthLimit travels in 1.1 only.
            let bw = if dialect == QosDialect::V1_1 { 4096 } else { 0 };
            assert_eq!(parsed.bandwidth_limit, bw);
        }
    }

    #[test]
    fn qos_responses_decode_through_the_ioctl_path_into_the_flow() {
        for dialect in [QosDialect::V1_0, QosDialect::V1_1] {
            let flow_id = Guid::from_bytes([7; 16]);
            let mut flow = LogicalFlow::new(flow_id, dialect);
            let req = flow.status_request(PInstant::ZERO);
            let repr = StorageQosControlResponseRepr {
                dialect,
                logical_flow_id: flow_id,
                policy_id: Guid::from_bytes([2; 16]),
                initiator_id: Guid::NULL,
                time_to_live: 4000,
                status: FlowStatus::Ok,
                maximum_io_rate: 900,
                minimum_io_rate: 10,
                base_io_size: 8192,
                maximum_bandwidth: if dialect == QosDialect::V1_1 { 2048 } else { 0 },
            };
            let out = repr.to_vec();
            let body = IoctlResponseRepr {
                ctl_code: FSCTL_STORAGE_QOS_CONTROL,
                file_id: FileId::new(3, 4),
                input: &[],
                output: &out,
                flags: 0,
            };
            let msg = response(Command::Ioctl, 9, STATUS_SUCCESS, &body);
            let op = Op::Ioctl {
                max_output: req.max_response_size,
            };
            let Decoded::Ioctl { status, output } = decode_msg(op, &msg).unwrap() else {
                panic!("IOCTL output")
            };
            let got = qos_outcome(&mut flow, Ok((status, output.to_vec())), PInstant::ZERO)
                .unwrap()
                .unwrap();
            assert_eq!(got, repr);
            assert_eq!(flow.maximum_io_rate(), 900);
            assert!(flow.is_associated());
            // A truncated response is a protocol error and arms the retry.
            let _ = flow.status_request(PInstant::ZERO);
            let short = out[..out.len() - 8].to_vec();
            assert!(matches!(
                qos_outcome(&mut flow, Ok((STATUS_SUCCESS, short)), PInstant::ZERO),
                Err(Smb2Error::Protocol(ProtocolError::Qos(_)))
            ));
            // A failed IOCTL reaches the flow as its status.
            let _ = flow.status_request(PInstant::ZERO);
            assert!(matches!(
                qos_outcome(
                    &mut flow,
                    Err(Smb2Error::Status(STATUS_NOT_SUPPORTED)),
                    PInstant::ZERO
                ),
                Err(Smb2Error::Status(s)) if s == STATUS_NOT_SUPPORTED
            ));
            assert!(!flow.request_in_flight());
            assert!(flow.poll_timeout().is_some());
        }
    }
}
