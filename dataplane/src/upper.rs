//! The upper layer a worker hands reassembled messages to ([MS-SMBD] 3.1.5.8
//! "passed to the upper layer"), and what it may ask of the worker in
//! return: replies (optionally with Send with Invalidate, [MS-SMBD] 3.1.5.1)
//! and RDMA Reads and Writes against the peer's Buffer Descriptor V1 arrays
//! ([MS-SMBD] 3.1.4.5, 3.1.4.6), which complete asynchronously through
//! [`UpperLayer::on_rdma_complete`]. `echo` returns every message to its
//! sender (the transport benchmark server, like perftest's) and serves the
//! RDMA echo request below; the SMB2 layer comes with the SMB2+QoS issue.
//!
//! # RDMA requests
//!
//! An upper layer handling a message (or a completed RDMA operation) calls
//! [`Replies::rdma_read`] / [`Replies::rdma_write`] with the peer's
//! descriptors *as they appeared on the wire* (a whole number of 16-byte
//! SMB_DIRECT_BUFFER_DESCRIPTOR_V1 structures), an offset into the buffer
//! they describe, a length, and up to a few hundred bytes of `context` of
//! its own (what it needs to build the reply later: an SMB2 message id, the
//! descriptors of a second transfer, ...). The worker copies descriptors and
//! context into pool memory, so the message may be released at once; the
//! data lives in one pool buffer of the smallest class that holds it. The
//! request is validated before anything is allocated: a malformed array or
//! an impossible range comes back at once as an [`RdmaError`] (the SMB2
//! layer answers STATUS_INVALID_PARAMETER), never as a panic.
//!
//! When every work request of the operation has completed successfully the
//! worker calls [`UpperLayer::on_rdma_complete`] with the data (read from
//! the peer, or written to it) and the context, and a [`Replies`] to answer
//! with. A failed RDMA operation (bad token, revoked grant, out of range at
//! the peer: `RemoteAccessError`) breaks the queue pair, as it does on
//! hardware: the connection is terminated and logged, its pending tickets
//! are dropped without a callback, and [`UpperLayer::on_close`] is the
//! upper layer's cue to forget them.
//!
//! Ordering ([MS-SMBD] 1.5): an RDMA Write's data is visible at the peer
//! before a later Send on the same queue pair completes there. A reply
//! queued from `on_rdma_complete` is posted only once the Write has
//! completed locally. A reply attached to the Write with
//! [`Replies::reply_after_write`] (the SMB2 READ) is posted right behind the
//! Write's work requests instead, relying on that ordering: a Write the peer
//! refuses breaks the queue pair before the reply is delivered, and the
//! connection ends either way (docs/spec-notes.md, "A READ's response
//! follows its RDMA Write").
//!
//! # The RDMA echo request (tests and benchmarks through `serve --upper echo`)
//!
//! All integers little-endian:
//!
//! | offset | size   | field                                                    |
//! |--------|--------|----------------------------------------------------------|
//! | 0      | 8      | magic `b"RDMAECHO"`                                      |
//! | 8      | 4      | Length: bytes to move                                    |
//! | 12     | 4      | R: number of read descriptors                            |
//! | 16     | 4      | W: number of write descriptors                           |
//! | 20     | 4      | Flags: bit 0 = reply with Send with Invalidate           |
//! | 24     | 16 × R | read descriptors (Buffer Descriptor V1, peer memory granted RemoteRead) |
//! | …      | 16 × W | write descriptors (granted RemoteWrite)                  |
//!
//! The server RDMA-reads Length bytes from offset 0 of the buffer the read
//! descriptors describe, RDMA-writes the same bytes (zero-copy: the same
//! pool buffer) to offset 0 of the write descriptors' buffer, then replies
//! `b"RDMADONE"`, u32 NTSTATUS, u32 Length (16 bytes); with flag bit 0 the
//! reply is a Send with Invalidate of the first write descriptor's Token. A
//! request whose descriptors or length are unusable is answered at once with
//! STATUS_INVALID_PARAMETER and Length 0. Every other message is echoed.

use crate::endpoint::RdmaOps;
use crate::planes::{ConnId, UpperControl, UpperEvent, WorkerStats};
use crate::provider::MemoryRegion;
use crate::zerocopy::{Piece, Pins};
use smbdirect_hugepages::{BufId, BufferPool, SliceAllocator};
use smbdirect_protocol::ntstatus::{
    NtStatus, STATUS_INSUFFICIENT_RESOURCES, STATUS_INVALID_PARAMETER, STATUS_SUCCESS,
};
use smbdirect_protocol::smbd::config::DATA_TRANSFER_PAYLOAD_OFFSET as HEADER_ROOM;
use smbdirect_protocol::smbd::rdma_slice::{self, SliceError};
use smbdirect_protocol::smbd::wire::BufferDescriptorArray;
use smbdirect_protocol::time::Instant as PInstant;
use smbdirect_protocol::WireError;
use std::collections::VecDeque;
use std::sync::Arc;

/// Why a reply could not be queued now. The worker keeps the message and
/// calls the upper layer again later; nothing is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backpressure {
    /// No pool buffer large enough is free.
    PoolExhausted,
    /// The connection's send queue is full.
    SendQueueFull,
    /// The reply is larger than the peer can reassemble.
    TooLarge,
    /// The connection already has its maximum of RDMA operations requested
    /// and not yet finished.
    RdmaBusy,
}

/// Names one RDMA operation of one connection (unique for the connection's
/// life), returned by the request and passed back on completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket(pub u64);

/// The direction of an RDMA operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RdmaKind {
    /// RDMA Read from the peer's buffer ([MS-SMBD] 3.1.4.6).
    Read,
    /// RDMA Write to the peer's buffer ([MS-SMBD] 3.1.4.5).
    Write,
}

/// Why an RDMA request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RdmaError {
    /// Not now: return it from the handler and the worker calls again later.
    Backpressure(Backpressure),
    /// The descriptor bytes are not a non-empty whole number of 16-byte
    /// Buffer Descriptor V1 structures ([MS-SMBD] 2.2.3.1).
    Malformed(WireError),
    /// [MS-SMBD] 3.1.4.5/3.1.4.6 slicing refused the request: zero length,
    /// a zero-length or wrapping descriptor, a range past the buffer.
    Descriptors(SliceError),
    /// The transfer is longer than Connection.MaxReadWriteSize or than the
    /// largest pool buffer, or the descriptors plus context do not fit one.
    TooLarge {
        /// Bytes requested.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// `rdma_write_back` outside the completion of an RDMA Read, or RDMA on
    /// a connection without RDMA state.
    NotAvailable,
}

impl RdmaError {
    /// The NTSTATUS an SMB2 server answers a refused request with:
    /// STATUS_INVALID_PARAMETER for a request that can never work (for
    /// backpressure the answer is to retry later, not to reply).
    pub fn status(&self) -> NtStatus {
        match self {
            RdmaError::Backpressure(_) => STATUS_INSUFFICIENT_RESOURCES,
            _ => STATUS_INVALID_PARAMETER,
        }
    }
}

impl core::fmt::Display for RdmaError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RdmaError::Backpressure(b) => write!(f, "busy: {b:?}"),
            RdmaError::Malformed(e) => write!(f, "buffer descriptors: {e}"),
            RdmaError::Descriptors(e) => write!(f, "buffer descriptors: {e}"),
            RdmaError::TooLarge { len, max } => {
                write!(f, "RDMA transfer of {len} bytes exceeds the limit of {max}")
            }
            RdmaError::NotAvailable => f.write_str("no RDMA operation to continue here"),
        }
    }
}

impl std::error::Error for RdmaError {}

impl From<Backpressure> for RdmaError {
    fn from(b: Backpressure) -> Self {
        RdmaError::Backpressure(b)
    }
}

/// A finished RDMA operation, as [`UpperLayer::on_rdma_complete`] sees it.
#[derive(Debug, Clone, Copy)]
pub struct RdmaDone<'a> {
    /// The request's ticket.
    pub ticket: Ticket,
    /// Read or Write.
    pub kind: RdmaKind,
    /// The bytes read from the peer (Read) or written to it (Write); empty
    /// for a zero-copy operation (the bytes are in the upper layer's own
    /// memory: see `zero_copy`).
    pub data: &'a [u8],
    /// Bytes moved.
    pub len: u32,
    /// Requested with [`Replies::rdma_write_pieces`] or
    /// [`Replies::rdma_read_pieces`].
    pub zero_copy: bool,
    /// The context passed with the request.
    pub context: &'a [u8],
}

/// A reply queued by the upper layer: `len` bytes at `offset` into pool
/// buffer `buf`, and the peer token to invalidate with it. The bytes of
/// `buf` before `offset` are the reply's own scratch (a received message's
/// header, or room [`Replies::reply`] left): the transport may write the
/// reply's SMB Direct header there ([`Endpoint::send_with_header_room`]).
///
/// [`Endpoint::send_with_header_room`]: crate::endpoint::Endpoint::send_with_header_room
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QueuedReply {
    pub(crate) buf: BufId,
    pub(crate) offset: u32,
    pub(crate) len: u32,
    pub(crate) invalidate: Option<u32>,
    /// `buf` is the receive buffer of the message being handled
    /// ([`Replies::reply_in_place`]): it passes to the transport only if
    /// the handler succeeds, and is never freed by an abort.
    pub(crate) in_place: bool,
}

impl QueuedReply {
    /// An unused entry (output arrays).
    pub(crate) const EMPTY: QueuedReply = QueuedReply {
        buf: BufId::from_bits(0),
        offset: 0,
        len: 0,
        invalidate: None,
        in_place: false,
    };
}

/// The message an `on_message` handler is looking at, where it lies: its
/// receive (or reassembly) pool buffer and the byte range in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InPlace {
    pub(crate) buf: BufId,
    pub(crate) offset: u32,
    pub(crate) len: u32,
}

/// Where an upper layer writes its replies (pool buffers, queued on the
/// connection the message came from) and requests RDMA operations.
#[derive(Debug)]
pub struct Replies<'a> {
    pub(crate) alloc: &'a mut SliceAllocator,
    pub(crate) pool: &'a BufferPool,
    pub(crate) queued: &'a mut [QueuedReply],
    pub(crate) count: usize,
    /// The connection's RDMA state (None: no RDMA on this connection).
    pub(crate) rdma: Option<&'a mut RdmaOps>,
    /// Connection.MaxReadWriteSize ([MS-SMBD] 3.1.4.7).
    pub(crate) max_read_write: u32,
    /// Inside `on_rdma_complete`: the op being completed.
    pub(crate) completing: Option<usize>,
    /// Set by [`Replies::disconnect`].
    pub(crate) disconnect: bool,
    /// Set by [`Replies::hold`].
    pub(crate) hold: Option<u64>,
    /// The message being handled, when it can be answered from its own
    /// buffer ([`Replies::reply_in_place`]; `on_message` only).
    pub(crate) message: Option<InPlace>,
    /// Set once [`Replies::reply_in_place`] queued `message`: the worker
    /// must not release it.
    pub(crate) message_taken: bool,
    /// Replies attached to RDMA Writes ([`Replies::reply_after_write`]) and
    /// their bytes, for the worker's counters.
    pub(crate) attached: u32,
    pub(crate) attached_bytes: u64,
}

impl<'a> Replies<'a> {
    /// Replies of one upper-layer call: into `queued`, with the
    /// connection's RDMA state if it has one, inside `on_rdma_complete` of
    /// op `completing`, answering `message` in place if the call may.
    pub(crate) fn new(
        alloc: &'a mut SliceAllocator,
        pool: &'a BufferPool,
        queued: &'a mut [QueuedReply],
        rdma: Option<&'a mut RdmaOps>,
        max_read_write: u32,
        completing: Option<usize>,
        message: Option<InPlace>,
    ) -> Self {
        Replies {
            alloc,
            pool,
            queued,
            count: 0,
            rdma,
            max_read_write,
            completing,
            disconnect: false,
            hold: None,
            message,
            message_taken: false,
            attached: 0,
            attached_bytes: 0,
        }
    }
}

impl Replies<'_> {
    /// Asks the worker to terminate this connection once the replies queued
    /// so far are handed to the transport (e.g. [MS-SMB2] 3.3.5.2: a request
    /// the server must answer by disconnecting). The worker logs it as a
    /// peer protocol violation and returns every buffer.
    pub fn disconnect(&mut self) {
        self.disconnect = true;
    }

    /// Keeps the message being handled (its receive buffer) after the
    /// handler returns `Ok`, under `token`, instead of releasing it: the
    /// upper layer finishes it later, when it calls [`UpperIo::wake`] with
    /// the token and the worker hands the same bytes to
    /// [`UpperLayer::on_wake`]. Replies queued and RDMA requested before
    /// returning take effect as usual. Later messages of the connection are
    /// not held up (SMB2 requests may complete out of order, [MS-SMB2]
    /// 3.3.4.2). Only meaningful in `on_message` and `on_wake` (where it
    /// keeps holding, possibly under a new token), and ignored after
    /// [`Replies::reply_in_place`] (the message is the reply).
    pub fn hold(&mut self, token: u64) {
        if self.message_taken {
            return; // queued by reply_in_place: it is the transport's now
        }
        self.hold = Some(token);
    }

    /// Queues the message being handled, unchanged, as the reply, sent
    /// straight from the buffer it was received (or reassembled) into: no
    /// pool buffer, no copy ([MS-SMBD] 3.1.5.1 fragments it like any other
    /// message; the buffer returns to the pool once the last fragment's
    /// Send completes, and the receive it came from was already replaced
    /// through the credit logic of 3.1.5.9). Returns `Ok(false)` where that
    /// is not possible (outside `on_message`, with the message held, or
    /// already queued once): reply with a copy instead. Like every reply it
    /// takes effect only if the handler returns `Ok`.
    pub fn reply_in_place(&mut self) -> Result<bool, Backpressure> {
        let Some(m) = self.message else {
            return Ok(false);
        };
        if self.message_taken || self.hold.is_some() {
            return Ok(false);
        }
        if self.count == self.queued.len() {
            return Err(Backpressure::SendQueueFull);
        }
        self.queued[self.count] = QueuedReply {
            buf: m.buf,
            offset: m.offset,
            len: m.len,
            invalidate: None,
            in_place: true,
        };
        self.count += 1;
        self.message_taken = true;
        Ok(true)
    }

    /// Queues a reply of `len` bytes written by `fill`.
    pub fn reply(&mut self, len: usize, fill: impl FnOnce(&mut [u8])) -> Result<(), Backpressure> {
        self.queue(len, None, fill)
    }

    /// Queues a reply sent as Send with Invalidate of the peer's `token`
    /// ([MS-SMBD] 3.1.5.1; SMB2_CHANNEL_RDMA_V1_INVALIDATE): the peer's
    /// grant is dead once the reply arrives. On a fragmented reply the last
    /// fragment carries the invalidate.
    pub fn reply_with_invalidate(
        &mut self,
        len: usize,
        token: u32,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<(), Backpressure> {
        self.queue(len, Some(token), fill)
    }

    /// A pool buffer for a reply of `len` bytes, and the room left before
    /// the reply in it: [`HEADER_ROOM`] where the buffer the reply needs
    /// anyway has it (the transport then writes the SMB Direct header there
    /// and sends header and reply as one contiguous Send, without a send
    /// buffer), else 0.
    #[inline(always)]
    fn alloc_reply(&mut self, len: usize) -> Result<(BufId, usize), Backpressure> {
        let class = self
            .pool
            .class_for_len(len.max(1))
            .ok_or(Backpressure::PoolExhausted)?;
        let room = match self.pool.class_layout(class) {
            Some(l) if l.buf_size >= len + HEADER_ROOM => HEADER_ROOM,
            _ => 0,
        };
        let id = self
            .alloc
            .alloc(class)
            .map_err(|_| Backpressure::PoolExhausted)?;
        Ok((id, room))
    }

    fn queue(
        &mut self,
        len: usize,
        invalidate: Option<u32>,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<(), Backpressure> {
        if self.count == self.queued.len() {
            return Err(Backpressure::SendQueueFull);
        }
        let (id, room) = self.alloc_reply(len)?;
        // SAFETY: `id` was just allocated and is exclusively ours.
        match unsafe { self.pool.bytes_mut(id) } {
            Some(b) if b.len() >= room + len => fill(&mut b[room..room + len]),
            _ => {
                let _ = self.alloc.free(id);
                return Err(Backpressure::TooLarge);
            }
        }
        self.queued[self.count] = QueuedReply {
            buf: id,
            offset: room as u32,
            len: len as u32,
            invalidate,
            in_place: false,
        };
        self.count += 1;
        Ok(())
    }

    /// Queues a reply of `len` bytes written by `fill` to go out right
    /// behind the RDMA Write `ticket` requested by this handler (Send with
    /// Invalidate of `invalidate` when given), instead of answering from
    /// [`UpperLayer::on_rdma_complete`], which is then not called for that
    /// Write. The reply is handed to the transport the moment the Write's
    /// last work request is posted, so its Send follows the Write on the
    /// same queue pair: [MS-SMBD] 1.5 requires in-order delivery of the
    /// transport, so the Write's data is placed at the peer before the
    /// reply arrives, and a Write that fails breaks the queue pair before
    /// the reply can be delivered (the connection ends, as when a Write
    /// fails today). This is how an SMB2 READ over RDMA is answered
    /// ([MS-SMB2] 3.3.5.12): one pass through the upper layer per READ.
    /// Takes effect only if the handler returns `Ok`.
    pub fn reply_after_write(
        &mut self,
        ticket: Ticket,
        len: usize,
        invalidate: Option<u32>,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<(), RdmaError> {
        if self.rdma.is_none() {
            return Err(RdmaError::NotAvailable);
        }
        let (id, room) = self.alloc_reply(len).map_err(RdmaError::Backpressure)?;
        // SAFETY: `id` was just allocated and is exclusively ours.
        match unsafe { self.pool.bytes_mut(id) } {
            Some(b) if b.len() >= room + len => fill(&mut b[room..room + len]),
            _ => {
                let _ = self.alloc.free(id);
                return Err(RdmaError::Backpressure(Backpressure::TooLarge));
            }
        }
        let attached = match self.rdma.as_deref_mut() {
            Some(rdma) => rdma.attach_reply(ticket, id, room as u32, len as u32, invalidate),
            None => Err(RdmaError::NotAvailable),
        };
        if let Err(e) = attached {
            let _ = self.alloc.free(id);
            return Err(e);
        }
        self.attached += 1;
        self.attached_bytes += len as u64;
        Ok(())
    }

    /// Withdraws the RDMA operation `ticket` requested by this handler (its
    /// staging buffers and pins are released now); false if this handler
    /// requested no such operation. For a handler that cannot complete what
    /// it started (e.g. no buffer for [`Replies::reply_after_write`]).
    pub fn cancel_rdma(&mut self, ticket: Ticket) -> bool {
        match self.rdma.as_deref_mut() {
            Some(r) => r.unstage(self.alloc, ticket),
            None => false,
        }
    }

    /// [MS-SMBD] 3.1.4.6: RDMA-reads `len` bytes starting `offset` bytes
    /// into the peer buffer described by `descs` (Buffer Descriptor V1
    /// structures as on the wire). Completes through
    /// [`UpperLayer::on_rdma_complete`] with the bytes and `context`.
    /// Takes effect only if the handler returns `Ok`.
    pub fn rdma_read(
        &mut self,
        descs: &[u8],
        offset: u64,
        len: u32,
        context: &[u8],
    ) -> Result<Ticket, RdmaError> {
        let max = self.max_read_write;
        let rdma = self.rdma.as_deref_mut().ok_or(RdmaError::NotAvailable)?;
        rdma.stage(
            self.alloc,
            self.pool,
            RdmaKind::Read,
            descs,
            offset,
            len,
            max,
            context,
            |_| {},
        )
    }

    /// [MS-SMBD] 3.1.4.5: RDMA-writes `len` bytes, produced by `fill`, to
    /// the peer buffer described by `descs`, starting `offset` bytes into
    /// it. Completes through [`UpperLayer::on_rdma_complete`]. Takes effect
    /// only if the handler returns `Ok`.
    pub fn rdma_write(
        &mut self,
        descs: &[u8],
        offset: u64,
        len: u32,
        context: &[u8],
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<Ticket, RdmaError> {
        let max = self.max_read_write;
        let rdma = self.rdma.as_deref_mut().ok_or(RdmaError::NotAvailable)?;
        rdma.stage(
            self.alloc,
            self.pool,
            RdmaKind::Write,
            descs,
            offset,
            len,
            max,
            context,
            fill,
        )
    }

    /// [MS-SMBD] 3.1.4.5 without a staging buffer: RDMA-writes the `len`
    /// bytes of `pieces` (memory of the upper layer registered with the
    /// provider through [`UpperLayer::zero_copy_regions`], pinned so it is
    /// not reused before the transfer ends; see [`crate::zerocopy`]) to the
    /// peer buffer `descs` describe, starting `offset` bytes into it. The
    /// pins are released through `pins` once no work request can touch the
    /// pieces any more (at once if this returns an error, or if the handler
    /// returns backpressure). Completes like [`Replies::rdma_write`], with
    /// empty [`RdmaDone::data`].
    #[allow(clippy::too_many_arguments)]
    pub fn rdma_write_pieces(
        &mut self,
        descs: &[u8],
        offset: u64,
        len: u32,
        context: &[u8],
        pieces: &[Piece],
        pins: &Arc<dyn Pins>,
    ) -> Result<Ticket, RdmaError> {
        self.stage_pieces(RdmaKind::Write, descs, offset, len, context, pieces, pins)
    }

    /// [MS-SMBD] 3.1.4.6 without a staging buffer: RDMA-reads `len` bytes
    /// from the peer buffer `descs` describe (from `offset` into it)
    /// straight into `pieces`; pins as for [`Replies::rdma_write_pieces`].
    /// If the Read fails the connection ends and the pieces may hold part of
    /// the data.
    #[allow(clippy::too_many_arguments)]
    pub fn rdma_read_pieces(
        &mut self,
        descs: &[u8],
        offset: u64,
        len: u32,
        context: &[u8],
        pieces: &[Piece],
        pins: &Arc<dyn Pins>,
    ) -> Result<Ticket, RdmaError> {
        self.stage_pieces(RdmaKind::Read, descs, offset, len, context, pieces, pins)
    }

    #[allow(clippy::too_many_arguments)]
    fn stage_pieces(
        &mut self,
        kind: RdmaKind,
        descs: &[u8],
        offset: u64,
        len: u32,
        context: &[u8],
        pieces: &[Piece],
        pins: &Arc<dyn Pins>,
    ) -> Result<Ticket, RdmaError> {
        let max = self.max_read_write;
        let Some(rdma) = self.rdma.as_deref_mut() else {
            for p in pieces.iter().filter(|p| p.pin != crate::zerocopy::NO_PIN) {
                pins.unpin(p);
            }
            return Err(RdmaError::NotAvailable);
        };
        rdma.stage_pieces(
            self.alloc, self.pool, kind, descs, offset, len, max, context, pieces, pins,
        )
    }

    /// Inside [`UpperLayer::on_rdma_complete`] of an RDMA Read: RDMA-writes
    /// the bytes just read, without copying them (the pool buffer moves to
    /// the Write), to the buffer `descs` describe at `offset`. The Read's
    /// data and context stay readable for the rest of the callback. Takes
    /// effect only if the handler returns `Ok`.
    pub fn rdma_write_back(
        &mut self,
        descs: &[u8],
        offset: u64,
        context: &[u8],
    ) -> Result<Ticket, RdmaError> {
        let slot = self.completing.ok_or(RdmaError::NotAvailable)?;
        let rdma = self.rdma.as_deref_mut().ok_or(RdmaError::NotAvailable)?;
        rdma.stage_write_back(self.alloc, self.pool, slot, descs, offset, context)
    }

    /// Connection.MaxReadWriteSize: the largest RDMA transfer allowed.
    pub fn max_read_write_size(&self) -> u32 {
        self.max_read_write
    }
}

/// An upper layer served by a worker.
pub trait UpperLayer: Send + 'static {
    /// Name for logs and `stats`.
    fn name(&self) -> &'static str;

    /// Handles one complete message from `conn`. On `Err` the worker keeps
    /// the message and calls again with the same bytes once it has done
    /// something that may have freed what was missing (as for
    /// [`UpperIo::wake_when_freed`]), so the handler must not have acted
    /// on it (replies and RDMA requests made through `out` are undone).
    fn on_message(
        &mut self,
        conn: ConnId,
        msg: &[u8],
        out: &mut Replies<'_>,
    ) -> Result<(), Backpressure>;

    /// An RDMA operation requested through [`Replies`] finished
    /// successfully. Same retry rule as [`UpperLayer::on_message`]: on `Err`
    /// nothing done through `out` takes effect and the worker calls again
    /// later with the same completion.
    fn on_rdma_complete(
        &mut self,
        _conn: ConnId,
        _done: &RdmaDone<'_>,
        _out: &mut Replies<'_>,
    ) -> Result<(), Backpressure> {
        Ok(())
    }

    /// The connection closed (RDMA operations still pending are dropped,
    /// held messages released).
    fn on_close(&mut self, _conn: ConnId) {}

    /// Called on every iteration of the worker's poll loop: reap background
    /// work (a store's io_uring, the QoS queue) and wake held messages or
    /// pending operations through `io`. Must be cheap when idle. Returns
    /// whether anything happened.
    fn poll(&mut self, _now: PInstant, _io: &mut UpperIo<'_>) -> bool {
        false
    }

    /// Background work [`UpperLayer::poll`] must reap promptly (a store's
    /// operations in flight, requests waiting for QoS tokens): while this
    /// is true the worker never sleeps when idle (it naps at most). Cheap;
    /// called only when the worker is about to sleep.
    fn busy(&self) -> bool {
        false
    }

    /// A token passed to [`UpperIo::wake`] is due: `msg` is the message
    /// held under it ([`Replies::hold`]), if any. Same retry rule as
    /// [`UpperLayer::on_message`] (on `Err` the worker calls again later).
    fn on_wake(
        &mut self,
        _conn: ConnId,
        _token: u64,
        _msg: Option<&[u8]>,
        _out: &mut Replies<'_>,
    ) -> Result<(), Backpressure> {
        Ok(())
    }

    /// A message from the control plane for the upper layer.
    fn on_control(&mut self, _msg: UpperControl) {}

    /// Memory of this layer that RDMA may move data from and to directly
    /// ([`crate::zerocopy`]): `(address, length)` of each region. The server
    /// registers each distinct region once with its provider, before the
    /// worker runs, and passes the registrations to
    /// [`UpperLayer::set_zero_copy_regions`].
    fn zero_copy_regions(&self) -> Vec<(usize, usize)> {
        Vec::new()
    }

    /// The registrations of [`UpperLayer::zero_copy_regions`], in the same
    /// order; not called when registration failed (the layer then keeps
    /// staging its data through pool buffers).
    fn set_zero_copy_regions(&mut self, _mrs: &[MemoryRegion]) {}
}

/// What an upper layer's [`UpperLayer::poll`] may do.
#[derive(Debug)]
pub struct UpperIo<'a> {
    pub(crate) wakes: &'a mut VecDeque<(ConnId, u64)>,
    /// Tokens for [`UpperIo::wake_when_freed`], with the worker's progress
    /// count they wait to see move past (`parked_at`).
    pub(crate) parked: &'a mut VecDeque<(ConnId, u64, u64)>,
    pub(crate) parked_at: u64,
    pub(crate) events: &'a mut VecDeque<UpperEvent>,
    pub(crate) stats: &'a WorkerStats,
    /// Events the control plane's ring takes now (see
    /// [`UpperIo::control_room`]).
    pub(crate) control_room: usize,
}

impl UpperIo<'_> {
    /// Schedules [`UpperLayer::on_wake`] for `token` of `conn` (ignored if
    /// the connection is gone).
    pub fn wake(&mut self, conn: ConnId, token: u64) {
        self.wakes.push_back((conn, token));
    }

    /// Schedules [`UpperLayer::on_wake`] for `token` of `conn` once the
    /// worker has done something that may free a pool buffer, a send-queue
    /// entry or an RDMA operation slot: polled a completion, taken a
    /// control message, closed a connection, had a [`UpperIo::wake`] from
    /// this layer's poll, or run its 1 ms timer scan.
    /// For a held request that was refused one of them ([`Backpressure`]):
    /// a plain [`UpperIo::wake`] would run it again on the loop's next
    /// turn, and on every turn after, while nothing has changed.
    pub fn wake_when_freed(&mut self, conn: ConnId, token: u64) {
        self.parked.push_back((conn, token, self.parked_at));
    }

    /// Sends an event to the control plane (ordered, never dropped: a full
    /// ring is retried).
    pub fn to_control(&mut self, ev: UpperEvent) {
        self.control_room = self.control_room.saturating_sub(1);
        self.events.push_back(ev);
    }

    /// How many more events [`UpperIo::to_control`] can send in this poll
    /// straight into the control plane's ring (0 while earlier messages
    /// wait for room). Events beyond it are still delivered, but queue on
    /// the worker: a layer with many reports to make at once (Storage QoS
    /// window reports, one per flow) sends at most this many per poll, so
    /// that nothing grows on the I/O path.
    pub fn control_room(&self) -> usize {
        self.control_room
    }

    /// Adds to the worker's counters: `pool_stalls` (work that waited for
    /// a pool buffer, e.g. an RDMA data buffer) and `store_full` (requests
    /// refused with STATUS_DISK_FULL).
    pub fn add_counts(&mut self, pool_stalls: u64, store_full: u64) {
        WorkerStats::add(&self.stats.pool_stalls, pool_stalls);
        WorkerStats::add(&self.stats.store_full, store_full);
    }

    /// Adds to the worker's counts of large store copies
    /// ([`crate::smb2::store::Store::take_copy_counts`]): made on a copy
    /// core (`away`), or on the worker (`kept`).
    pub fn add_copy_counts(&mut self, away: u64, kept: u64) {
        WorkerStats::add(&self.stats.store_copies_away, away);
        WorkerStats::add(&self.stats.store_copies_kept, kept);
    }

    /// Publishes the upper layer's gauges (`stats`: sessions, opens,
    /// requests waiting in QoS queues).
    pub fn set_gauges(&mut self, sessions: u64, opens: u64, qos_queued: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        self.stats.sessions.store(sessions, Relaxed);
        self.stats.opens.store(opens, Relaxed);
        self.stats.qos_queued.store(qos_queued, Relaxed);
    }
}

/// Magic of the RDMA echo request (see the module documentation).
pub const RDMA_ECHO_MAGIC: &[u8; 8] = b"RDMAECHO";
/// Magic of the RDMA echo reply.
pub const RDMA_DONE_MAGIC: &[u8; 8] = b"RDMADONE";
/// RDMA echo request header length (before the descriptors).
pub const RDMA_ECHO_HEADER_LEN: usize = 24;
/// RDMA echo reply length.
pub const RDMA_DONE_LEN: usize = 16;
/// RDMA echo flag: reply with Send with Invalidate of the first write
/// descriptor's token.
pub const RDMA_ECHO_INVALIDATE: u32 = 1;

/// Encodes an RDMA echo request (for clients and tests).
pub fn rdma_echo_request(len: u32, read: &[[u8; 16]], write: &[[u8; 16]], flags: u32) -> Vec<u8> {
    let mut m = Vec::with_capacity(RDMA_ECHO_HEADER_LEN + 16 * (read.len() + write.len()));
    m.extend_from_slice(RDMA_ECHO_MAGIC);
    m.extend_from_slice(&len.to_le_bytes());
    m.extend_from_slice(&(read.len() as u32).to_le_bytes());
    m.extend_from_slice(&(write.len() as u32).to_le_bytes());
    m.extend_from_slice(&flags.to_le_bytes());
    for d in read.iter().chain(write) {
        m.extend_from_slice(d);
    }
    m
}

/// Decodes an RDMA echo reply: (status, length).
pub fn parse_rdma_done(msg: &[u8]) -> Option<(NtStatus, u32)> {
    if msg.len() != RDMA_DONE_LEN || &msg[..8] != RDMA_DONE_MAGIC {
        return None;
    }
    Some((NtStatus(le32(msg, 8)?), le32(msg, 12)?))
}

fn le32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// A parsed RDMA echo request, borrowing the message.
struct RdmaEcho<'a> {
    len: u32,
    flags: u32,
    read: &'a [u8],
    write: &'a [u8],
}

impl<'a> RdmaEcho<'a> {
    /// `None`: not an RDMA echo request; `Some(Err)`: one, malformed.
    fn parse(msg: &'a [u8]) -> Option<Result<Self, ()>> {
        if msg.len() < 8 || &msg[..8] != RDMA_ECHO_MAGIC {
            return None;
        }
        let hdr = || -> Option<(u32, u32, u32, u32)> {
            Some((
                le32(msg, 8)?,
                le32(msg, 12)?,
                le32(msg, 16)?,
                le32(msg, 20)?,
            ))
        };
        let Some((len, r, w, flags)) = hdr() else {
            return Some(Err(()));
        };
        let r = r as usize * 16;
        let w = w as usize * 16;
        let end = RDMA_ECHO_HEADER_LEN
            .checked_add(r)
            .and_then(|x| x.checked_add(w));
        match end {
            Some(end) if end == msg.len() => Some(Ok(RdmaEcho {
                len,
                flags,
                read: &msg[RDMA_ECHO_HEADER_LEN..RDMA_ECHO_HEADER_LEN + r],
                write: &msg[RDMA_ECHO_HEADER_LEN + r..end],
            })),
            _ => Some(Err(())),
        }
    }
}

/// Returns every message to its sender, and serves the RDMA echo request
/// (module documentation). Stateless: what a pending RDMA echo needs later
/// travels in the operations' context.
#[derive(Debug, Default, Clone, Copy)]
pub struct Echo;

/// Context of an RDMA echo's Read: flags, then the write descriptors.
const ECHO_READ_CTX_FLAGS: usize = 4;
/// Context of an RDMA echo's Write: flags, first write token.
const ECHO_WRITE_CTX_LEN: usize = 8;

fn rdma_done(
    out: &mut Replies<'_>,
    status: NtStatus,
    len: u32,
    invalidate: Option<u32>,
) -> Result<(), Backpressure> {
    let fill = |b: &mut [u8]| {
        b[..8].copy_from_slice(RDMA_DONE_MAGIC);
        b[8..12].copy_from_slice(&status.0.to_le_bytes());
        b[12..16].copy_from_slice(&len.to_le_bytes());
    };
    match invalidate {
        Some(t) => out.reply_with_invalidate(RDMA_DONE_LEN, t, fill),
        None => out.reply(RDMA_DONE_LEN, fill),
    }
}

impl UpperLayer for Echo {
    fn name(&self) -> &'static str {
        "echo"
    }

    fn on_message(
        &mut self,
        _conn: ConnId,
        msg: &[u8],
        out: &mut Replies<'_>,
    ) -> Result<(), Backpressure> {
        let req = match RdmaEcho::parse(msg) {
            // Straight back out of its receive buffer where the worker
            // allows it (no copy); else a copy.
            None => {
                return match out.reply_in_place() {
                    Ok(true) => Ok(()),
                    Ok(false) => out.reply(msg.len(), |b| b.copy_from_slice(msg)),
                    Err(b) => Err(b),
                }
            }
            Some(Err(())) => return rdma_done(out, STATUS_INVALID_PARAMETER, 0, None),
            Some(Ok(r)) => r,
        };
        // The write side is checked now too, so a bad request costs no Read.
        let write_ok = BufferDescriptorArray::new_checked(req.write)
            .ok()
            .is_some_and(|a| rdma_slice::slice(&a, 0, u64::from(req.len)).is_ok());
        if !write_ok || req.len > out.max_read_write_size() {
            return rdma_done(out, STATUS_INVALID_PARAMETER, 0, None);
        }
        // The Read's context: what the Write needs once the data is here
        // (up to 511 write descriptors; more are refused).
        let mut ctx = [0u8; 8192];
        let ctx_len = ECHO_READ_CTX_FLAGS + req.write.len();
        if ctx_len > ctx.len() {
            return rdma_done(out, STATUS_INVALID_PARAMETER, 0, None);
        }
        ctx[..4].copy_from_slice(&req.flags.to_le_bytes());
        ctx[4..ctx_len].copy_from_slice(req.write);
        match out.rdma_read(req.read, 0, req.len, &ctx[..ctx_len]) {
            Ok(_) => Ok(()),
            Err(RdmaError::Backpressure(b)) => Err(b),
            Err(_) => rdma_done(out, STATUS_INVALID_PARAMETER, 0, None),
        }
    }

    fn on_rdma_complete(
        &mut self,
        _conn: ConnId,
        done: &RdmaDone<'_>,
        out: &mut Replies<'_>,
    ) -> Result<(), Backpressure> {
        let flags = le32(done.context, 0).unwrap_or(0);
        match done.kind {
            RdmaKind::Read => {
                let write = done.context.get(ECHO_READ_CTX_FLAGS..).unwrap_or(&[]);
                let first_token = le32(write, 8).unwrap_or(0);
                let mut ctx = [0u8; ECHO_WRITE_CTX_LEN];
                ctx[..4].copy_from_slice(&flags.to_le_bytes());
                ctx[4..].copy_from_slice(&first_token.to_le_bytes());
                match out.rdma_write_back(write, 0, &ctx) {
                    Ok(_) => Ok(()),
                    Err(RdmaError::Backpressure(b)) => Err(b),
                    Err(_) => rdma_done(out, STATUS_INVALID_PARAMETER, 0, None),
                }
            }
            RdmaKind::Write => {
                let invalidate = (flags & RDMA_ECHO_INVALIDATE != 0)
                    .then(|| le32(done.context, 4))
                    .flatten();
                rdma_done(out, STATUS_SUCCESS, done.data.len() as u32, invalidate)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smbdirect_hugepages::{ClassId, HugepagePolicy, PoolConfig, SizeClass};

    fn pool() -> BufferPool {
        PoolConfig::new(1 << 20, 1)
            .class(SizeClass::new("receive", 8192).per_slice(4))
            .class(SizeClass::new("send", 1364).per_slice(4))
            .hugepages(HugepagePolicy::Disable)
            .mlock(false)
            .build()
            .unwrap()
    }

    fn replies<'a>(
        alloc: &'a mut SliceAllocator,
        pool: &'a BufferPool,
        queued: &'a mut [QueuedReply],
        message: Option<InPlace>,
    ) -> Replies<'a> {
        Replies::new(alloc, pool, queued, None, 1 << 20, None, message)
    }

    #[test]
    fn reply_in_place_queues_the_message_once_and_only_where_it_may() {
        let pool = pool();
        let mut alloc = pool.claim_slice(0).unwrap();
        let rbuf = alloc.alloc(ClassId::RECEIVE).unwrap();
        let mut queued = [QueuedReply::EMPTY; 4];
        let free_before = pool.class_stats(0, ClassId::SEND).unwrap().free;
        let message = InPlace {
            buf: rbuf,
            offset: 24,
            len: 512,
        };
        let mut out = replies(&mut alloc, &pool, &mut queued, Some(message));
        assert_eq!(out.reply_in_place(), Ok(true));
        // Once: the buffer can carry one reply.
        assert_eq!(out.reply_in_place(), Ok(false));
        // The message is the reply: holding it is ignored.
        out.hold(7);
        assert_eq!(out.hold, None);
        assert!(out.message_taken);
        assert_eq!(out.count, 1);
        // No pool buffer was taken for it.
        assert_eq!(
            pool.class_stats(0, ClassId::SEND).unwrap().free,
            free_before
        );
        assert_eq!(
            queued[0],
            QueuedReply {
                buf: rbuf,
                offset: 24,
                len: 512,
                invalidate: None,
                in_place: true,
            }
        );

        // Outside on_message (no message), or once held: a copy is needed.
        let mut queued = [QueuedReply::EMPTY; 1];
        let mut out = replies(&mut alloc, &pool, &mut queued, None);
        assert_eq!(out.reply_in_place(), Ok(false));
        out.message = Some(InPlace {
            buf: rbuf,
            offset: 0,
            len: 1,
        });
        out.hold(3);
        assert_eq!(out.reply_in_place(), Ok(false));
        out.hold = None;
        // A full reply array is backpressure, as for any reply.
        out.count = 1;
        assert_eq!(out.reply_in_place(), Err(Backpressure::SendQueueFull));
        alloc.free(rbuf).unwrap();
    }

    #[test]
    fn a_reply_leaves_room_for_its_header_where_its_buffer_class_has_it() {
        // 100 bytes in a 1,364-byte send buffer: 24 bytes of room before
        // it. 1,350 bytes would not fit behind 24: no room, offset 0, same
        // class either way (no larger buffer taken for the room).
        let pool = pool();
        let mut alloc = pool.claim_slice(0).unwrap();
        let mut queued = [QueuedReply::EMPTY; 2];
        let mut out = replies(&mut alloc, &pool, &mut queued, None);
        out.reply(100, |b| b.fill(7)).unwrap();
        out.reply(1350, |b| b.fill(9)).unwrap();
        let (a, b) = (queued[0], queued[1]);
        assert_eq!((a.offset, a.len), (24, 100));
        assert_eq!((b.offset, b.len), (0, 1350));
        for (q, byte) in [(a, 7u8), (b, 9)] {
            assert_eq!(q.buf.class(), ClassId::SEND);
            // SAFETY: the test owns the buffers.
            let bytes = unsafe { pool.bytes(q.buf) }.unwrap();
            let r = q.offset as usize..(q.offset + q.len) as usize;
            assert!(bytes[r].iter().all(|&x| x == byte));
            alloc.free(q.buf).unwrap();
        }
    }
}
