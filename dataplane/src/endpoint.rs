//! One SMB Direct connection bound to one queue pair: the glue between the
//! sans-IO [`Connection`] and an RDMA [`QueuePair`], over a worker's slice of
//! the registered buffer pool. Workers own many endpoints; benchmarks and
//! clients drive single ones. Nothing here allocates from the heap, locks or
//! makes a syscall once the endpoint exists: receive buffers, send buffers and
//! upper-layer message buffers all come from the pool slice, and exhaustion
//! is reported, never papered over with an allocation.
//!
//! Receive buffers are posted through [`Connection`]'s [`ReceivePoster`]
//! ([MS-SMBD] 3.1.5.9) directly on the queue pair, so a credit is only ever
//! granted for a receive that is really posted.
//!
//! RDMA Reads and Writes the upper layer requests against the peer's Buffer
//! Descriptor V1 arrays ([MS-SMBD] 3.1.4.5, 3.1.4.6) run here too, from a
//! fixed table of [`RdmaOps`] allocated when the connection is attached: see
//! [`Endpoint::post_rdma`] for how they are posted (one work request per
//! descriptor segment, chained, selectively signaled, RDMA Reads bounded by
//! the negotiated ORD) and [`Endpoint::outstanding`] for how teardown waits
//! for them.

use crate::capture::{CaptureConn, CaptureHandle, CaptureOp, Direction};
use crate::marks;
use crate::provider::{
    Completion, MemoryRegion, ProviderError, QueuePair, RecvWr, RemoteBuf, SendOp, SendWr, Sge,
    WcOpcode, WcStatus,
};
use crate::upper::{Backpressure, RdmaError, RdmaKind, Ticket};
use crate::zerocopy::{unpin_encoded, Piece, Pins, PIECE_BYTES};
use smbdirect_hugepages::{AllocError, BufId, BufferPool, ClassId, SliceAllocator};
use smbdirect_protocol::smbd::config::DATA_TRANSFER_PAYLOAD_OFFSET;
use smbdirect_protocol::smbd::rdma_slice;
use smbdirect_protocol::smbd::read_depth::ReadDepth;
use smbdirect_protocol::smbd::wire::BufferDescriptorArray;
use smbdirect_protocol::smbd::{
    Connection, MessageData, NegotiateDecision, PayloadSlice, Receive, ReceivePoster, Role,
    SendError, TerminateReason, MAX_HEADER_LEN,
};
use smbdirect_protocol::time::Instant;
use std::collections::VecDeque;
use std::sync::Arc;

/// Tag in the top bits of a work-request id: which kind of buffer it names.
const KIND_SHIFT: u32 = 62;
const KIND_RECV: u64 = 1;
const KIND_SEND: u64 = 2;
/// An RDMA Read or Write of an upper-layer operation; the rest of the id is
/// laid out by [`rdma_wr_id`].
const KIND_RDMA: u64 = 3;
const ID_MASK: u64 = (1 << KIND_SHIFT) - 1;

/// Where a send buffer keeps, past the header it carries, the message
/// buffer its Send completion releases (the last segment of a message sent
/// by gather: the payload SGE points into that buffer, so it may only go
/// back to the pool once the Send is done). Bytes past the header are never
/// sent, so the stash travels nowhere.
const RELEASE_STASH: usize = MAX_HEADER_LEN;
/// The stash's "nothing to release".
const RELEASE_NONE: u64 = u64::MAX;
/// In a send's work-request id: the buffer named is the message itself,
/// sent in place with its header in the header room before it
/// ([`Connection::next_in_place`]): its completion frees it, no stash to
/// read. The top bit of the buffer index, which no buffer has in a pool
/// whose classes hold fewer than 2^31 buffers per slice (checked when the
/// endpoint is made: [`Endpoint::new`]).
const SEND_IN_PLACE: u64 = 1 << 31;

/// Most Sends one endpoint keeps in flight (the capacity of its
/// [`SendRing`]; a larger send depth is clamped to it).
pub const SEND_RING: u32 = 1024;
/// A whole message posted at once goes out signaled one time in this many
/// (fewer on a shallow send queue: half its depth); the Sends
/// between are retired by the next signaled one ([`Endpoint::post_now`]).
pub const SIGNAL_EVERY: u32 = 8;
/// The work-request id of the drain marker ([`QueuePair::drain_send_queue`]):
/// every id bit set, which no buffer has (its slice number would be 63,
/// its class 255).
const DRAIN_WR_ID: u64 = (KIND_SEND << KIND_SHIFT) | ID_MASK;

/// Every Send an endpoint has on its queue pair and not yet retired, in
/// posting order. A reliable-connected send queue completes in order, so a
/// Send's completion (a signaled one's, a failed one's, the drain
/// marker's) retires it and every Send posted before it: the unsignaled
/// ones that succeeded silently. (Which Sends ask for a completion is the
/// implementation's choice: [MS-SMBD] specifies the messages, not the
/// work completions of its RDMA lower layer.)
#[derive(Debug)]
struct SendRing {
    ids: Box<[u64]>,
    /// Pushed so far (wrapping).
    head: u32,
    /// Retired so far (wrapping).
    tail: u32,
    /// The position just past the latest signaled Send (or drain marker):
    /// the Sends after it are unsignaled, retired by a later one.
    signaled_end: u32,
}

impl SendRing {
    fn new(capacity: u32) -> Self {
        SendRing {
            ids: vec![0; capacity.next_power_of_two() as usize].into_boxed_slice(),
            head: 0,
            tail: 0,
            signaled_end: 0,
        }
    }

    fn len(&self) -> u32 {
        self.head.wrapping_sub(self.tail)
    }

    fn mask(&self) -> u32 {
        self.ids.len() as u32 - 1
    }

    /// Records a posted Send, and whether it asked for a completion. Never
    /// full: Sends in flight are bounded by the send depth, which is
    /// clamped to [`SEND_RING`].
    fn push(&mut self, id: u64, signaled: bool) {
        debug_assert!((self.len() as usize) < self.ids.len(), "send ring full");
        let i = (self.head & self.mask()) as usize;
        self.ids[i] = id;
        self.head = self.head.wrapping_add(1);
        if signaled {
            self.signaled_end = self.head;
        }
    }

    /// The oldest Send not yet retired.
    fn pop_front(&mut self) -> Option<u64> {
        if self.len() == 0 {
            return None;
        }
        let id = self.ids[(self.tail & self.mask()) as usize];
        self.tail = self.tail.wrapping_add(1);
        Some(id)
    }

    /// The newest Send not yet retired.
    fn pop_back(&mut self) -> Option<u64> {
        if self.len() == 0 {
            return None;
        }
        self.head = self.head.wrapping_sub(1);
        Some(self.ids[(self.head & self.mask()) as usize])
    }

    /// Unsignaled Sends after the latest signaled one, not yet retired.
    fn silent(&self) -> u32 {
        self.head.wrapping_sub(self.signaled_end).min(self.len())
    }

    /// Whether the next whole-message Send asks for a completion: one in
    /// `every`, and any after pool pressure (`pressure`, the count of
    /// shortfalls and stalls, moved since `seen`, which it updates).
    fn signal_next(&self, every: u32, pressure: u64, seen: &mut u64) -> bool {
        let moved = pressure != *seen;
        *seen = pressure;
        self.silent() + 1 >= every || moved
    }

    /// How many Sends, oldest first, a completion of `id` retires (`id`
    /// and those before it); None if `id` is not in flight.
    fn through(&self, id: u64) -> Option<u32> {
        (0..self.len())
            .position(|k| self.ids[(self.tail.wrapping_add(k) & self.mask()) as usize] == id)
            .map(|k| k as u32 + 1)
    }
}

/// RDMA operations a connection may have requested and not yet finished
/// (the default size of its [`RdmaOps`] table).
pub const RDMA_OPS_PER_CONNECTION: usize = 32;
/// Most work requests chained in one `post_send` (one per descriptor
/// segment); an operation with more segments is posted in several chains.
const RDMA_CHAIN: usize = 16;
/// Most SGEs per RDMA work request of a zero-copy operation (one per store
/// block it spans); the endpoint uses at most what the queue pair was
/// created with ([`Endpoint::set_max_sge`]).
pub const RDMA_MAX_SGE: usize = 8;
/// Most pieces one zero-copy operation may have.
pub const RDMA_MAX_PIECES: usize = 1024;
/// Bytes of descriptors, context and encoded pieces an operation keeps in
/// its own slot of the table ([`RdmaOps`]) instead of a pool buffer: a
/// READ's one descriptor and one piece (36 bytes), an SMB2 WRITE's
/// descriptor and 112-byte context with up to two pieces (168).
pub(crate) const INLINE_AUX: usize = 192;

// RDMA work-request id layout (below the 2 kind bits): op slot, work
// requests in the chain, "last of its chain", low bits of the op's ticket.
const RDMA_SLOT_BITS: u32 = 16;
const RDMA_N_SHIFT: u32 = 16;
const RDMA_LAST_BIT: u32 = 32;
const RDMA_GEN_SHIFT: u32 = 33;
const RDMA_GEN_MASK: u64 = (1 << (KIND_SHIFT - RDMA_GEN_SHIFT)) - 1;

fn rdma_wr_id(slot: usize, n: usize, last: bool, ticket: Ticket) -> u64 {
    (KIND_RDMA << KIND_SHIFT)
        | ((ticket.0 & RDMA_GEN_MASK) << RDMA_GEN_SHIFT)
        | (u64::from(last) << RDMA_LAST_BIT)
        | ((n as u64 & 0xffff) << RDMA_N_SHIFT)
        | (slot as u64 & ((1 << RDMA_SLOT_BITS) - 1))
}

/// The work-request id of a receive posted with buffer `buf` on behalf of an
/// endpoint (the control plane posts the negotiate receive before accepting).
pub fn recv_wr_id(buf: BufId) -> u64 {
    wr_id(KIND_RECV, buf)
}

/// The buffer of a receive posted with [`recv_wr_id`], from its
/// completion's work-request id (`None` for any other kind of request).
pub fn recv_wr_buf(wr_id: u64) -> Option<BufId> {
    (wr_id >> KIND_SHIFT == KIND_RECV).then(|| BufId::from_bits(wr_id & ID_MASK))
}

fn wr_id(kind: u64, buf: BufId) -> u64 {
    debug_assert_eq!(buf.to_bits() & !ID_MASK, 0, "BufId uses the tag bits");
    (kind << KIND_SHIFT) | buf.to_bits()
}

/// Why an endpoint stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointError {
    /// The SMB Direct connection terminated.
    Terminated(TerminateReason),
    /// The provider failed a work request (status) on this queue pair.
    Provider(WcStatus),
    /// The pool had no buffer for a message that cannot wait (a
    /// reassembled message, [MS-SMBD] 3.1.5.8): the connection ends.
    PoolExhausted,
}

impl core::fmt::Display for EndpointError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            EndpointError::Terminated(r) => write!(f, "{r}"),
            EndpointError::Provider(s) => write!(f, "RDMA work request failed: {s:?}"),
            EndpointError::PoolExhausted => f.write_str("buffer pool exhausted"),
        }
    }
}

/// A complete upper-layer message, still in its receive buffer (or in the
/// connection's reassembly buffer). Read it with [`Endpoint::message`], then
/// give it back with [`Endpoint::release`].
#[derive(Debug)]
#[must_use = "a delivery holds a receive buffer until released"]
pub struct Delivery {
    buf: BufId,
    data: MessageData,
    /// Connection.InvalidatedToken passed up with the message.
    pub invalidated_token: Option<u32>,
}

/// What a completion produced for the endpoint's owner.
#[derive(Debug)]
#[must_use = "an event may hold a receive buffer until released"]
pub enum Event {
    /// A complete upper-layer message.
    Message(Delivery),
    /// Passive side: the Negotiate Request arrived. The owner has it decided
    /// (the control plane runs `evaluate_negotiate_request`) and calls
    /// [`Endpoint::apply_negotiate_decision`]. The bytes are in `bytes[..len]`.
    NegotiateRequest {
        /// The message (a Negotiate Request is 20 bytes; more is ignored).
        bytes: [u8; 32],
        /// Bytes received (may exceed 32; only the first 32 are kept).
        len: usize,
    },
}

/// Counters of one endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EndpointStats {
    /// Receives posted on the queue pair.
    pub receives_posted: u64,
    /// Sends posted.
    pub sends_posted: u64,
    /// Sends held back because the pool had no send buffer.
    pub pool_stalls: u64,
    /// Times fewer receives were posted than the credits called for,
    /// because the pool had no receive buffer ([MS-SMBD] 3.1.5.9: those
    /// credits are not granted until a buffer returns).
    pub receive_shortfalls: u64,
}

/// Counters of a connection's RDMA operations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RdmaStats {
    /// RDMA Read work requests posted.
    pub reads_posted: u64,
    /// RDMA Write work requests posted.
    pub writes_posted: u64,
    /// Bytes read from the peer by completed operations.
    pub bytes_read: u64,
    /// Bytes written to the peer by completed operations.
    pub bytes_written: u64,
    /// `post_send` calls (chains) for RDMA.
    pub chains_posted: u64,
    /// Times an RDMA Read waited because ORD reads were outstanding.
    pub ord_waits: u64,
    /// Most RDMA Reads ever outstanding at once (never above ORD).
    pub max_reads_in_flight: u32,
    /// Replies posted in the same `post_send` as the last chain of their
    /// Write (one doorbell for both; [`Endpoint::flush`]).
    pub replies_chained: u64,
    /// Operations completed successfully.
    pub ops_completed: u64,
    /// Operations that failed (and took the connection down).
    pub ops_failed: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpState {
    /// Slot unused.
    Free,
    /// Requested by an upper-layer call still in progress: undone if the
    /// handler returns backpressure.
    Staged,
    /// Waiting for (or in the middle of) posting, or in flight.
    Queued,
    /// Every work request completed successfully; waiting for the upper
    /// layer's `on_rdma_complete`.
    Done,
    /// A work request failed; the slot is freed once nothing is in flight.
    Failed,
}

/// An `rdma_write_back` staged during `on_rdma_complete` of a Read: the
/// Read's data buffer becomes a Write's once the handler returns `Ok`.
#[derive(Debug, Clone, Copy)]
struct Continuation {
    ticket: Ticket,
    aux: BufId,
    descs_len: u32,
    ctx_len: u32,
    offset: u64,
}

/// One RDMA operation: where its data is, what describes the peer buffer,
/// how far it is posted and what of it is in flight.
#[derive(Debug, Clone, Copy)]
struct Op {
    state: OpState,
    kind: RdmaKind,
    ticket: Ticket,
    /// The local data buffer (pool); None for a zero-copy operation.
    data: Option<BufId>,
    len: u32,
    /// Where the descriptors as received are kept, then the context, then
    /// (zero-copy) the encoded pieces.
    aux: Option<AuxAt>,
    descs_len: u32,
    ctx_len: u32,
    /// Zero-copy: pieces of local memory (pinned by the upper layer) in
    /// place of `data`, encoded after the context; 0 otherwise.
    pieces: u16,
    /// Offset into the buffer the descriptors describe.
    offset: u64,
    /// Bytes whose work requests are posted.
    posted: u32,
    /// Work requests posted and not yet retired.
    wrs: u32,
    /// Chains posted and not yet retired (each ends in a signaled request).
    chains: u32,
    cont: Option<Continuation>,
    /// A reply to send right behind this (Write) operation
    /// ([`RdmaOps::attach_reply`]): handed to the connection once the last
    /// work request is posted, so the Send follows the Write on the queue
    /// pair. Taken (None) once handed over.
    reply: Option<AttachedReply>,
    /// The operation's reply went (or goes) with it: its completion frees it
    /// without calling the upper layer back.
    detached: bool,
}

/// Where an operation's descriptors, context and pieces are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AuxAt {
    /// A pool buffer (they did not fit [`INLINE_AUX`]).
    Pool(BufId),
    /// The operation's own slot of [`RdmaOps::inline`].
    Inline,
}

impl AuxAt {
    /// The pool buffer to give back, if any.
    fn pool(self) -> Option<BufId> {
        match self {
            AuxAt::Pool(b) => Some(b),
            AuxAt::Inline => None,
        }
    }
}

/// An operation's aux bytes: its slot's inline bytes (`inline`) or its
/// pool buffer.
#[inline]
fn aux_bytes<'a>(
    aux: Option<AuxAt>,
    inline: &'a [u8; INLINE_AUX],
    pool: &'a BufferPool,
) -> Option<&'a [u8]> {
    match aux? {
        AuxAt::Inline => Some(&inline[..]),
        // SAFETY: the aux buffer belongs to its op and is never given to the
        // provider; nothing writes it while the op lives.
        AuxAt::Pool(b) => unsafe { pool.bytes(b) },
    }
}

/// A reply attached to an RDMA Write (see [`Op::reply`]).
#[derive(Debug, Clone, Copy)]
struct AttachedReply {
    buf: BufId,
    /// Where the reply starts in `buf`: the bytes before it are room for
    /// its SMB Direct header (`Replies::reply_after_write` leaves
    /// [`DATA_TRANSFER_PAYLOAD_OFFSET`] where the buffer has it), so the
    /// reply goes as one contiguous Send with no send buffer.
    offset: u32,
    len: u32,
    invalidate: Option<u32>,
}

impl Op {
    const FREE: Op = Op {
        state: OpState::Free,
        kind: RdmaKind::Read,
        ticket: Ticket(0),
        data: None,
        len: 0,
        aux: None,
        descs_len: 0,
        ctx_len: 0,
        pieces: 0,
        offset: 0,
        posted: 0,
        wrs: 0,
        chains: 0,
        cont: None,
        reply: None,
        detached: false,
    };

    /// Where its encoded pieces lie in the aux buffer.
    fn pieces_range(&self) -> core::ops::Range<usize> {
        let start = (self.descs_len + self.ctx_len) as usize;
        start..start + self.pieces as usize * PIECE_BYTES
    }
}

/// What the worker hands the upper layer for a finished operation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DoneOp {
    pub slot: usize,
    pub ticket: Ticket,
    pub kind: RdmaKind,
    /// None: a zero-copy operation (the data is in the upper layer's memory).
    pub data: Option<BufId>,
    pub len: u32,
    aux: AuxAt,
    pub descs_len: u32,
    pub ctx_len: u32,
}

/// The RDMA operations of one connection: a fixed table allocated with the
/// connection, FIFO queues of slot numbers within it, and the ORD limiter
/// ([MS-SMBD] Appendix A). Nothing here allocates after construction.
#[derive(Debug)]
pub struct RdmaOps {
    ops: Box<[Op]>,
    /// Per slot: the aux bytes of an operation whose descriptors, context
    /// and pieces fit ([`AuxAt::Inline`]), so the common READ and WRITE
    /// take no pool buffer for them. Beside `ops`, not in [`Op`], which is
    /// copied whole on the posting path.
    inline: Box<[[u8; INLINE_AUX]]>,
    /// Ops with bytes left to post (and staged ones), oldest first.
    pending: VecDeque<u16>,
    /// Finished ops waiting for the upper layer, in completion order.
    done: VecDeque<u16>,
    depth: ReadDepth,
    /// RDMA work requests on the send queue (not yet retired).
    wrs_in_flight: u32,
    next_ticket: u64,
    stats: RdmaStats,
    /// Releases the pins of zero-copy operations (set by the first one).
    pins: Option<Arc<dyn Pins>>,
    /// SGEs per work request a zero-copy operation may use.
    max_sge: usize,
    /// Where the search for a free slot starts ([`RdmaOps::free_slot`]).
    scan_from: usize,
}

/// A pool buffer of at least `len` bytes: the smallest class that holds it,
/// or the next larger one with a free buffer when that class is exhausted.
fn alloc_at_least(
    alloc: &mut SliceAllocator,
    pool: &BufferPool,
    len: usize,
) -> Result<BufId, AllocError> {
    let first = alloc.alloc_len(len);
    let Err(AllocError::Exhausted { class, .. }) = first else {
        return first;
    };
    let size = |c: ClassId| pool.class_layout(c).map_or(0, |l| l.buf_size);
    let mut tried = size(class);
    loop {
        let next = (0..pool.class_count())
            .map(|c| ClassId(c as u8))
            .filter(|&c| size(c) > tried)
            .min_by_key(|&c| size(c));
        let Some(c) = next else {
            return first;
        };
        if let Ok(id) = alloc.alloc(c) {
            return Ok(id);
        }
        tried = size(c);
    }
}

/// Gives `aux` back to the pool if it is a pool buffer.
fn free_aux(alloc: &mut SliceAllocator, aux: AuxAt) {
    if let Some(b) = aux.pool() {
        let _ = alloc.free(b);
    }
}

/// Sends one `flush` posts together (one doorbell).
const SEND_BATCH: usize = 16;

/// The Sends `flush` has built and not yet posted: each one's send buffer
/// (header; its release stash written), the message buffer its completion
/// releases (RELEASE_NONE: none), its SGEs and invalidation.
struct SendBatch {
    n: usize,
    sbufs: [BufId; SEND_BATCH],
    releases: [u64; SEND_BATCH],
    sges: [[Sge; 2]; SEND_BATCH],
    nsge: [usize; SEND_BATCH],
    invalidate: [Option<u32>; SEND_BATCH],
}

impl SendBatch {
    fn new() -> Self {
        SendBatch {
            n: 0,
            sbufs: [BufId::from_bits(0); SEND_BATCH],
            releases: [RELEASE_NONE; SEND_BATCH],
            sges: [[Chain::EMPTY_SGE; 2]; SEND_BATCH],
            nsge: [0; SEND_BATCH],
            invalidate: [None; SEND_BATCH],
        }
    }

    fn push(&mut self, sbuf: BufId, release: u64, sges: [Sge; 2], nsge: usize, inv: Option<u32>) {
        let k = self.n;
        self.sbufs[k] = sbuf;
        self.releases[k] = release;
        self.sges[k] = sges;
        self.nsge[k] = nsge;
        self.invalidate[k] = inv;
        self.n = k + 1;
    }
}

/// One chain of RDMA work requests: per work request, its SGEs (one into
/// the op's data buffer, or up to [`RDMA_MAX_SGE`] pieces of a zero-copy
/// op) and the peer buffer it moves to or from.
#[derive(Debug)]
struct Chain {
    sges: [[Sge; RDMA_MAX_SGE]; RDMA_CHAIN],
    nsge: [usize; RDMA_CHAIN],
    remotes: [RemoteBuf; RDMA_CHAIN],
    n: usize,
    bytes: u32,
}

impl Chain {
    const EMPTY_SGE: Sge = Sge {
        addr: 0,
        len: 0,
        lkey: 0,
    };

    fn new() -> Self {
        Chain {
            sges: [[Self::EMPTY_SGE; RDMA_MAX_SGE]; RDMA_CHAIN],
            nsge: [0; RDMA_CHAIN],
            remotes: [RemoteBuf { addr: 0, rkey: 0 }; RDMA_CHAIN],
            n: 0,
            bytes: 0,
        }
    }

    /// Empties the chain for reuse (the arrays keep stale entries past `n`,
    /// never read).
    fn reset(&mut self) {
        self.n = 0;
        self.bytes = 0;
    }
}

/// The next (up to `room`) segments of `op` from where its posting stopped:
/// the descriptors sliced per [MS-SMBD] 3.1.4.5/3.1.4.6 at `offset +
/// posted`, each mapped to the same position in the data buffer at region
/// offset `base`. None if nothing is left or the descriptors do not slice.
/// Fills `c` (the endpoint's scratch chain: nothing is built or moved per
/// call) and returns whether it holds anything.
fn next_chain(
    c: &mut Chain,
    op: &Op,
    descs: &[u8],
    base: u64,
    mr: MemoryRegion,
    room: usize,
) -> bool {
    c.reset();
    let Ok(arr) = BufferDescriptorArray::new_checked(descs) else {
        return false;
    };
    let posted = u64::from(op.posted);
    let Ok(segs) = rdma_slice::slice(&arr, op.offset + posted, u64::from(op.len - op.posted))
    else {
        return false;
    };
    for seg in segs.take(room.min(RDMA_CHAIN)) {
        c.sges[c.n][0] = mr.sge(base + posted + seg.local_offset, seg.length);
        c.nsge[c.n] = 1;
        c.remotes[c.n] = RemoteBuf {
            addr: seg.remote_offset,
            rkey: seg.token,
        };
        c.bytes += seg.length;
        c.n += 1;
    }
    c.n > 0
}

/// [`next_chain`] for a zero-copy op: the local side is its `pieces`
/// (encoded), gathered up to `max_sge` per work request; a segment spanning
/// more pieces than that is split into several work requests at
/// consecutive peer addresses. False if nothing is left, the descriptors do
/// not slice or the pieces are shorter than the transfer.
fn next_chain_pieces(
    c: &mut Chain,
    op: &Op,
    descs: &[u8],
    pieces: &[u8],
    room: usize,
    max_sge: usize,
) -> bool {
    c.reset();
    let Ok(arr) = BufferDescriptorArray::new_checked(descs) else {
        return false;
    };
    let posted = u64::from(op.posted);
    let Ok(segs) = rdma_slice::slice(&arr, op.offset + posted, u64::from(op.len - op.posted))
    else {
        return false;
    };
    let count = pieces.len() / PIECE_BYTES;
    let piece = |i: usize| Piece::decode(&pieces[i * PIECE_BYTES..]);
    // The piece holding transfer byte `posted`, and where it starts.
    let (mut pi, mut pstart) = (0usize, 0u64);
    while pi < count && pstart + u64::from(piece(pi).sge.len) <= posted {
        pstart += u64::from(piece(pi).sge.len);
        pi += 1;
    }
    let (mut pos, room, max_sge) = (posted, room.min(RDMA_CHAIN), max_sge.clamp(1, RDMA_MAX_SGE));
    'segs: for seg in segs {
        let seg_len = u64::from(seg.length);
        let mut seg_done = 0u64;
        while seg_done < seg_len {
            if c.n == room {
                break 'segs;
            }
            let (k, mut ns, mut wr_bytes) = (c.n, 0usize, 0u64);
            while ns < max_sge && seg_done + wr_bytes < seg_len {
                if pi >= count {
                    c.reset();
                    return false;
                }
                let p = piece(pi);
                let in_piece = pos - pstart;
                let take = (u64::from(p.sge.len) - in_piece).min(seg_len - seg_done - wr_bytes);
                c.sges[k][ns] = Sge {
                    addr: p.sge.addr + in_piece,
                    len: take as u32,
                    lkey: p.sge.lkey,
                };
                ns += 1;
                wr_bytes += take;
                pos += take;
                if pos == pstart + u64::from(p.sge.len) {
                    pstart = pos;
                    pi += 1;
                }
            }
            c.remotes[k] = RemoteBuf {
                addr: seg.remote_offset + seg_done,
                rkey: seg.token,
            };
            c.nsge[k] = ns;
            c.n += 1;
            c.bytes += wr_bytes as u32;
            seg_done += wr_bytes;
        }
    }
    c.n > 0
}

fn map_alloc(e: AllocError) -> RdmaError {
    match e {
        AllocError::TooLarge { len, largest } => RdmaError::TooLarge {
            len: len as u64,
            max: largest as u64,
        },
        _ => RdmaError::Backpressure(Backpressure::PoolExhausted),
    }
}

impl RdmaOps {
    /// A table of `capacity` operations for a queue pair whose negotiated
    /// ORD is `ord`.
    pub fn new(capacity: usize, ord: u32) -> Self {
        let capacity = capacity.clamp(1, 1 << RDMA_SLOT_BITS);
        RdmaOps {
            ops: vec![Op::FREE; capacity].into_boxed_slice(),
            inline: vec![[0u8; INLINE_AUX]; capacity].into_boxed_slice(),
            pending: VecDeque::with_capacity(capacity),
            done: VecDeque::with_capacity(capacity),
            depth: ReadDepth::new(ord),
            wrs_in_flight: 0,
            next_ticket: 1,
            stats: RdmaStats::default(),
            pins: None,
            max_sge: 1,
            scan_from: 0,
        }
    }

    /// The ORD reads are bounded by.
    pub fn ord(&self) -> u32 {
        self.depth.ord()
    }

    /// RDMA Reads outstanding now.
    pub fn reads_in_flight(&self) -> u32 {
        self.depth.outstanding()
    }

    /// RDMA work requests on the send queue now.
    pub fn wrs_in_flight(&self) -> u32 {
        self.wrs_in_flight
    }

    /// Operations requested and not finished (or not yet handed back).
    pub fn active(&self) -> usize {
        self.ops.iter().filter(|o| o.state != OpState::Free).count()
    }

    /// Operations with work requests still to post.
    pub fn waiting(&self) -> usize {
        self.pending.len()
    }

    /// Counters.
    pub fn stats(&self) -> &RdmaStats {
        &self.stats
    }

    /// A free slot, searched round-robin from the one after the last taken:
    /// operations mostly finish in the order they were requested, so the
    /// next slot is usually free (no scan of a table full of live ones).
    fn free_slot(&mut self) -> Option<usize> {
        let slot = self.next_free()?;
        self.scan_from = slot + 1;
        Some(slot)
    }

    /// The slot [`RdmaOps::free_slot`] would take next, if any.
    fn next_free(&self) -> Option<usize> {
        let n = self.ops.len();
        let from = self.scan_from.min(n);
        (from..n)
            .chain(0..from)
            .find(|&i| self.ops[i].state == OpState::Free)
    }

    /// Whether a new operation would find a free slot. O(1) while
    /// operations finish in the order they were requested (the slot after
    /// the last one taken is free); a scan of the table only when it is
    /// (nearly) full.
    pub fn has_room(&self) -> bool {
        self.next_free().is_some()
    }

    fn take_ticket(&mut self) -> Ticket {
        let t = Ticket(self.next_ticket);
        self.next_ticket += 1;
        t
    }

    /// Validates a request and copies `descs`, `context` and the encoded
    /// `pieces` into `inline` when given and they fit, else into one pool
    /// buffer; returns where, with the descriptors' and context's lengths.
    #[allow(clippy::too_many_arguments)]
    fn stage_aux(
        alloc: &mut SliceAllocator,
        pool: &BufferPool,
        inline: Option<&mut [u8; INLINE_AUX]>,
        descs: &[u8],
        offset: u64,
        len: u32,
        context: &[u8],
        pieces: &[Piece],
    ) -> Result<(AuxAt, u32, u32), RdmaError> {
        let arr = BufferDescriptorArray::new_checked(descs).map_err(RdmaError::Malformed)?;
        rdma_slice::slice(&arr, offset, u64::from(len)).map_err(RdmaError::Descriptors)?;
        let head = descs.len() + context.len();
        let aux_len = head + pieces.len() * PIECE_BYTES;
        // One destination, then one copy: written once, so it stays inline.
        let (at, b): (AuxAt, &mut [u8]) = match inline.filter(|_| aux_len <= INLINE_AUX) {
            Some(b) => (AuxAt::Inline, &mut b[..aux_len]),
            None => {
                let aux = alloc_at_least(alloc, pool, aux_len).map_err(map_alloc)?;
                // SAFETY: `aux` was just allocated and is exclusively ours.
                match unsafe { pool.bytes_mut(aux) } {
                    Some(b) if b.len() >= aux_len => (AuxAt::Pool(aux), &mut b[..aux_len]),
                    _ => {
                        let _ = alloc.free(aux);
                        return Err(RdmaError::Backpressure(Backpressure::PoolExhausted));
                    }
                }
            }
        };
        b[..descs.len()].copy_from_slice(descs);
        b[descs.len()..head].copy_from_slice(context);
        for (p, out) in pieces.iter().zip(b[head..].chunks_exact_mut(PIECE_BYTES)) {
            p.encode(out);
        }
        Ok((at, descs.len() as u32, context.len() as u32))
    }

    /// Stages a new operation (see [`crate::upper::Replies::rdma_read`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn stage(
        &mut self,
        alloc: &mut SliceAllocator,
        pool: &BufferPool,
        kind: RdmaKind,
        descs: &[u8],
        offset: u64,
        len: u32,
        max_len: u32,
        context: &[u8],
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<Ticket, RdmaError> {
        if len > max_len {
            // Connection.MaxReadWriteSize ([MS-SMBD] 3.1.1.1).
            return Err(RdmaError::TooLarge {
                len: u64::from(len),
                max: u64::from(max_len),
            });
        }
        let Some(slot) = self.free_slot() else {
            return Err(RdmaError::Backpressure(Backpressure::RdmaBusy));
        };
        let inline = Some(&mut self.inline[slot]);
        let (aux, descs_len, ctx_len) =
            Self::stage_aux(alloc, pool, inline, descs, offset, len, context, &[])?;
        let data = match alloc_at_least(alloc, pool, len as usize) {
            Ok(d) => d,
            Err(e) => {
                free_aux(alloc, aux);
                return Err(map_alloc(e));
            }
        };
        if kind == RdmaKind::Write {
            // SAFETY: `data` was just allocated and is exclusively ours.
            match unsafe { pool.bytes_mut(data) } {
                Some(b) if b.len() >= len as usize => fill(&mut b[..len as usize]),
                _ => {
                    free_aux(alloc, aux);
                    let _ = alloc.free(data);
                    return Err(RdmaError::Backpressure(Backpressure::PoolExhausted));
                }
            }
        }
        let ticket = self.take_ticket();
        self.ops[slot] = Op {
            state: OpState::Staged,
            kind,
            ticket,
            data: Some(data),
            len,
            aux: Some(aux),
            descs_len,
            ctx_len,
            pieces: 0,
            offset,
            posted: 0,
            wrs: 0,
            chains: 0,
            cont: None,
            reply: None,
            detached: false,
        };
        // Cannot exceed the capacity: one entry per non-free slot at most.
        self.pending.push_back(slot as u16);
        Ok(ticket)
    }

    /// Stages a zero-copy operation (see
    /// [`crate::upper::Replies::rdma_write_pieces`]): the local side is
    /// `pieces` (registered memory of the upper layer, pinned), which must
    /// add up to `len`. Whatever the outcome, the pins are released through
    /// `pins` once no work request can touch the pieces: at once if this
    /// fails.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn stage_pieces(
        &mut self,
        alloc: &mut SliceAllocator,
        pool: &BufferPool,
        kind: RdmaKind,
        descs: &[u8],
        offset: u64,
        len: u32,
        max_len: u32,
        context: &[u8],
        pieces: &[Piece],
        pins: &Arc<dyn Pins>,
    ) -> Result<Ticket, RdmaError> {
        let r = self.stage_pieces_inner(
            alloc, pool, kind, descs, offset, len, max_len, context, pieces,
        );
        match r {
            Ok(t) => {
                if self.pins.is_none() {
                    self.pins = Some(Arc::clone(pins));
                }
                Ok(t)
            }
            Err(e) => {
                for p in pieces {
                    if p.pin != crate::zerocopy::NO_PIN {
                        pins.unpin(p);
                    }
                }
                Err(e)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn stage_pieces_inner(
        &mut self,
        alloc: &mut SliceAllocator,
        pool: &BufferPool,
        kind: RdmaKind,
        descs: &[u8],
        offset: u64,
        len: u32,
        max_len: u32,
        context: &[u8],
        pieces: &[Piece],
    ) -> Result<Ticket, RdmaError> {
        if len > max_len {
            return Err(RdmaError::TooLarge {
                len: u64::from(len),
                max: u64::from(max_len),
            });
        }
        let total: u64 = pieces.iter().map(|p| u64::from(p.sge.len)).sum();
        if pieces.is_empty()
            || pieces.len() > RDMA_MAX_PIECES
            || total != u64::from(len)
            || pieces.iter().any(|p| p.sge.len == 0)
        {
            return Err(RdmaError::NotAvailable);
        }
        let Some(slot) = self.free_slot() else {
            return Err(RdmaError::Backpressure(Backpressure::RdmaBusy));
        };
        let inline = Some(&mut self.inline[slot]);
        let (aux, descs_len, ctx_len) =
            Self::stage_aux(alloc, pool, inline, descs, offset, len, context, pieces)?;
        let ticket = self.take_ticket();
        self.ops[slot] = Op {
            state: OpState::Staged,
            kind,
            ticket,
            data: None,
            len,
            aux: Some(aux),
            descs_len,
            ctx_len,
            pieces: pieces.len() as u16,
            offset,
            posted: 0,
            wrs: 0,
            chains: 0,
            cont: None,
            reply: None,
            detached: false,
        };
        self.pending.push_back(slot as u16);
        Ok(ticket)
    }

    /// Attaches the reply in pool buffer `buf` (`len` bytes from `offset`,
    /// Send with Invalidate of `invalidate` when given; the bytes before
    /// `offset` are the reply's header room) to the RDMA Write `ticket`
    /// staged by the handler running now: the reply is queued on the
    /// connection as soon as the Write's last work request is posted, so
    /// its Send follows the Write on the same queue pair, and the Write's
    /// completion frees the operation without an
    /// [`crate::upper::UpperLayer::on_rdma_complete`]. [MS-SMBD] 1.5: the
    /// transport delivers in order, so the Write's data is placed at the
    /// peer before the reply is (see docs/spec-notes.md, "A READ's response
    /// follows its RDMA Write"). Takes the buffer only on success.
    pub(crate) fn attach_reply(
        &mut self,
        ticket: Ticket,
        buf: BufId,
        offset: u32,
        len: u32,
        invalidate: Option<u32>,
    ) -> Result<(), RdmaError> {
        // The handler's latest request, normally.
        let slot = match self.pending.back() {
            Some(&s) if self.ops[s as usize].ticket == ticket => s as usize,
            _ => self
                .pending
                .iter()
                .rev()
                .map(|&s| s as usize)
                .take_while(|&s| self.ops[s].state == OpState::Staged)
                .find(|&s| self.ops[s].ticket == ticket)
                .ok_or(RdmaError::NotAvailable)?,
        };
        let op = &mut self.ops[slot];
        if op.state != OpState::Staged || op.kind != RdmaKind::Write || op.reply.is_some() {
            return Err(RdmaError::NotAvailable);
        }
        op.reply = Some(AttachedReply {
            buf,
            offset,
            len,
            invalidate,
        });
        op.detached = true;
        Ok(())
    }

    /// Undoes the RDMA operation `ticket` staged by the handler running
    /// now (its buffers and pins are released at once). False if there is
    /// no such staged operation.
    pub(crate) fn unstage(&mut self, alloc: &mut SliceAllocator, ticket: Ticket) -> bool {
        let n = self.pending.len();
        let Some(k) = (0..n)
            .rev()
            .take_while(|&k| self.ops[self.pending[k] as usize].state == OpState::Staged)
            .find(|&k| self.ops[self.pending[k] as usize].ticket == ticket)
        else {
            return false;
        };
        let slot = self.pending[k] as usize;
        Self::free_op(
            &mut self.ops[slot],
            &self.inline[slot],
            alloc,
            self.pins.as_deref(),
        );
        self.pending.remove(k);
        true
    }

    /// Stages turning the Read in `slot` (being completed) into a Write of
    /// the same bytes (see [`crate::upper::Replies::rdma_write_back`]).
    pub(crate) fn stage_write_back(
        &mut self,
        alloc: &mut SliceAllocator,
        pool: &BufferPool,
        slot: usize,
        descs: &[u8],
        offset: u64,
        context: &[u8],
    ) -> Result<Ticket, RdmaError> {
        let op = self.ops.get(slot).copied().ok_or(RdmaError::NotAvailable)?;
        if op.state != OpState::Done
            || op.kind != RdmaKind::Read
            || op.cont.is_some()
            || op.data.is_none()
        {
            return Err(RdmaError::NotAvailable);
        }
        // Not inline: the slot's bytes are the Read's until the handler
        // returns `Ok` (commit).
        let (AuxAt::Pool(aux), descs_len, ctx_len) =
            Self::stage_aux(alloc, pool, None, descs, offset, op.len, context, &[])?
        else {
            return Err(RdmaError::NotAvailable);
        };
        let ticket = self.take_ticket();
        self.ops[slot].cont = Some(Continuation {
            ticket,
            aux,
            descs_len,
            ctx_len,
            offset,
        });
        Ok(ticket)
    }

    /// The upper layer's handler returned `Ok`: staged operations are
    /// queued, and the operation being completed (`completing`) is either
    /// continued as a Write or freed.
    pub(crate) fn commit(&mut self, alloc: &mut SliceAllocator, completing: Option<usize>) {
        for &s in self.pending.iter().rev() {
            let op = &mut self.ops[s as usize];
            if op.state != OpState::Staged {
                break;
            }
            op.state = OpState::Queued;
        }
        let Some(slot) = completing else {
            return;
        };
        if self.done.front() == Some(&(slot as u16)) {
            self.done.pop_front();
        } else {
            self.done.retain(|&s| s as usize != slot);
        }
        let (op, inline) = (&mut self.ops[slot], &self.inline[slot]);
        match op.cont.take() {
            Some(c) => {
                if let Some(old) = op.aux.replace(AuxAt::Pool(c.aux)) {
                    free_aux(alloc, old);
                }
                op.state = OpState::Queued;
                op.kind = RdmaKind::Write;
                op.ticket = c.ticket;
                op.descs_len = c.descs_len;
                op.ctx_len = c.ctx_len;
                op.offset = c.offset;
                op.posted = 0;
                self.pending.push_back(slot as u16);
            }
            None => Self::free_op(op, inline, alloc, self.pins.as_deref()),
        }
    }

    /// The handler returned backpressure: staged operations are undone
    /// (their buffers freed); the operation being completed stays done.
    pub(crate) fn abort(&mut self, alloc: &mut SliceAllocator, completing: Option<usize>) {
        while let Some(&s) = self.pending.back() {
            let (op, inline) = (&mut self.ops[s as usize], &self.inline[s as usize]);
            if op.state != OpState::Staged {
                break;
            }
            Self::free_op(op, inline, alloc, self.pins.as_deref());
            self.pending.pop_back();
        }
        if let Some(op) = completing.and_then(|s| self.ops.get_mut(s)) {
            if let Some(c) = op.cont.take() {
                let _ = alloc.free(c.aux);
            }
        }
    }

    /// Frees `op`'s buffers and releases the pins of its pieces (nothing of
    /// it is in flight).
    fn free_op(
        op: &mut Op,
        inline: &[u8; INLINE_AUX],
        alloc: &mut SliceAllocator,
        pins: Option<&dyn Pins>,
    ) {
        if op.pieces > 0 {
            if let Some(pins) = pins {
                if let Some(b) =
                    aux_bytes(op.aux, inline, alloc.pool()).and_then(|b| b.get(op.pieces_range()))
                {
                    unpin_encoded(pins, b);
                }
            }
        }
        for b in [
            op.data.take(),
            op.aux.take().and_then(AuxAt::pool),
            op.cont.take().map(|c| c.aux),
            op.reply.take().map(|r| r.buf),
        ]
        .into_iter()
        .flatten()
        {
            let _ = alloc.free(b);
        }
        *op = Op::FREE;
    }

    /// The oldest finished operation, if any.
    pub(crate) fn peek_done(&self) -> Option<DoneOp> {
        let slot = *self.done.front()? as usize;
        let op = &self.ops[slot];
        Some(DoneOp {
            slot,
            ticket: op.ticket,
            kind: op.kind,
            data: op.data,
            len: op.len,
            aux: op.aux?,
            descs_len: op.descs_len,
            ctx_len: op.ctx_len,
        })
    }

    /// The context `op` (from [`RdmaOps::peek_done`]) was staged with: in
    /// its pool buffer, or copied out of its slot into `scratch` (so the
    /// handler may stage more operations while reading it).
    pub(crate) fn done_context<'a>(
        &self,
        pool: &'a BufferPool,
        op: &DoneOp,
        scratch: &'a mut [u8; INLINE_AUX],
    ) -> &'a [u8] {
        let range = op.descs_len as usize..(op.descs_len + op.ctx_len) as usize;
        if op.aux == AuxAt::Inline {
            *scratch = self.inline[op.slot];
        }
        aux_bytes(Some(op.aux), scratch, pool)
            .and_then(|b| b.get(range))
            .unwrap_or(&[])
    }

    /// Frees every operation with nothing in flight (connection teardown).
    pub(crate) fn release_idle(&mut self, alloc: &mut SliceAllocator) {
        for (op, inline) in self.ops.iter_mut().zip(self.inline.iter()) {
            if op.state != OpState::Free && op.chains == 0 {
                Self::free_op(op, inline, alloc, self.pins.as_deref());
            }
        }
        let ops = &self.ops;
        self.pending
            .retain(|&s| ops[s as usize].state != OpState::Free);
        self.done
            .retain(|&s| ops[s as usize].state != OpState::Free);
    }
}

/// The [`Poster`] of endpoint `$ep` over `$alloc`: its fields borrowed
/// one by one, so the connection stays usable beside it.
macro_rules! poster {
    ($ep:expr, $alloc:expr) => {
        Poster {
            qp: &mut $ep.qp,
            alloc: $alloc,
            pool: &$ep.pool,
            mr: $ep.mr,
            posted: &mut $ep.recv_posted,
            trail: &mut $ep.recv_trail,
            stats: &mut $ep.stats,
        }
    };
}

/// A send buffer for a message header with, past the longest header, the
/// release stash: `Ok(None)` when the pool has none free, `Err` (the buffer
/// given back) when the one allocated is too short or not live, which a
/// correctly configured pool never does.
fn send_buffer(
    pool: &BufferPool,
    alloc: &mut SliceAllocator,
) -> Result<Option<(BufId, smbdirect_hugepages::BufLocation)>, ()> {
    let Ok(sbuf) = alloc.alloc(ClassId::SEND) else {
        return Ok(None);
    };
    match pool
        .locate(sbuf)
        .filter(|l| l.len >= MAX_HEADER_LEN.max(RELEASE_STASH + 8))
    {
        Some(loc) => Ok(Some((sbuf, loc))),
        None => {
            let _ = alloc.free(sbuf);
            Err(())
        }
    }
}

/// A whole message's Send, sent now (`send_now`, and a reply going behind
/// its Write's last chain in [`Endpoint::post_rdma_with`]): the header,
/// committed by [`Connection::transmit_now`], in a send buffer whose
/// release stash names `msg`, the payload (`len` bytes at `offset`)
/// gathered from `msg`; `sges` gets both. Returns the send buffer, or None
/// (nothing committed, nothing allocated) when the message must be queued
/// the usual way.
#[allow(clippy::too_many_arguments)]
fn header_send<Q: QueuePair>(
    conn: &mut Connection,
    poster: &mut Poster<'_, Q>,
    pool: &BufferPool,
    mr: MemoryRegion,
    msg: BufId,
    offset: u32,
    len: u32,
    sges: &mut [Sge; 2],
) -> Option<BufId> {
    let end = offset as usize + len as usize;
    let mloc = pool.locate(msg).filter(|l| end <= l.len)?;
    let (sbuf, loc) = send_buffer(pool, poster.alloc).ok().flatten()?;
    let mut header = [0u8; DATA_TRANSFER_PAYLOAD_OFFSET];
    if conn.transmit_now(poster, len, &mut header).is_none() {
        let _ = poster.alloc.free(sbuf);
        return None;
    }
    // SAFETY: sbuf was just allocated and is exclusively ours; `loc` is its
    // live location, at least MAX_HEADER_LEN + the stash long (checked).
    let out = unsafe { std::slice::from_raw_parts_mut(loc.ptr.as_ptr(), loc.len) };
    out[..DATA_TRANSFER_PAYLOAD_OFFSET].copy_from_slice(&header);
    out[RELEASE_STASH..RELEASE_STASH + 8].copy_from_slice(&msg.to_bits().to_le_bytes());
    *sges = [
        mr.sge(loc.offset as u64, DATA_TRANSFER_PAYLOAD_OFFSET as u32),
        mr.sge((mloc.offset + offset as usize) as u64, len),
    ];
    Some(sbuf)
}

/// A whole message's Send from its own buffer (`send_now`, and a reply
/// going behind its Write's last chain in [`Endpoint::post_rdma_with`]):
/// the header, committed by [`Connection::transmit_now`], is written into
/// the [`DATA_TRANSFER_PAYLOAD_OFFSET`] bytes before `offset` in the
/// message's buffer (`mloc`, the sender's header room), and the one SGE
/// returned covers header and payload. None (nothing committed) when the
/// message must be queued the usual way.
#[inline]
fn header_in_place<Q: QueuePair>(
    conn: &mut Connection,
    poster: &mut Poster<'_, Q>,
    mr: MemoryRegion,
    mloc: &smbdirect_hugepages::BufLocation,
    offset: u32,
    len: u32,
) -> Option<Sge> {
    const ROOM: usize = DATA_TRANSFER_PAYLOAD_OFFSET;
    let end = offset as usize + len as usize;
    let start = (offset as usize).checked_sub(ROOM)?;
    if end > mloc.len {
        return None;
    }
    let mut header = [0u8; ROOM];
    conn.transmit_now(poster, len, &mut header)?;
    // SAFETY: the message buffer is the sender's until its Send completes;
    // the ROOM bytes before `offset` are its header room, inside the
    // buffer (`offset >= ROOM` and `end <= len` checked above).
    unsafe { std::ptr::copy_nonoverlapping(header.as_ptr(), mloc.ptr.as_ptr().add(start), ROOM) };
    Some(mr.sge((mloc.offset + start) as u64, (ROOM + len as usize) as u32))
}

/// Posts receives on behalf of the connection.
struct Poster<'a, Q: QueuePair> {
    qp: &'a mut Q,
    alloc: &'a mut SliceAllocator,
    pool: &'a BufferPool,
    mr: MemoryRegion,
    posted: &'a mut u16,
    trail: &'a mut RecvTrail,
    stats: &'a mut EndpointStats,
}

/// The addresses of the posted receives, in posting order, for the idle
/// poll loop's hint ([`Endpoint::prefetch_next_receive`]): a reliable
/// connection's receive queue is consumed in order, so the peer's next Send
/// lands in the oldest receive still posted.
#[derive(Debug)]
struct RecvTrail {
    /// `addrs[i & mask]` is the address of the `i`th receive posted (0 when
    /// someone else posted it).
    addrs: Box<[u64]>,
    mask: u64,
    posted: u64,
    done: u64,
}

impl RecvTrail {
    /// Room for `capacity` receives posted at once (rounded up to a power
    /// of two); past that [`RecvTrail::next`] knows nothing.
    fn new(capacity: usize) -> Self {
        let n = capacity.max(2).next_power_of_two();
        RecvTrail {
            addrs: vec![0; n].into_boxed_slice(),
            mask: n as u64 - 1,
            posted: 0,
            done: 0,
        }
    }

    #[inline]
    fn push(&mut self, addr: u64) {
        self.addrs[(self.posted & self.mask) as usize] = addr;
        self.posted += 1;
    }

    /// The oldest receive completed (successfully or flushed).
    #[inline]
    fn pop(&mut self) {
        if self.done < self.posted {
            self.done += 1;
        }
    }

    /// The address of the oldest receive still posted, if known.
    #[inline]
    fn next(&self) -> Option<u64> {
        let waiting = self.posted - self.done;
        if waiting == 0 || waiting > self.mask + 1 {
            return None;
        }
        Some(self.addrs[(self.done & self.mask) as usize]).filter(|&a| a != 0)
    }
}

impl<Q: QueuePair> ReceivePoster for Poster<'_, Q> {
    fn post_receives(&mut self, want: u16) -> u16 {
        const BATCH: usize = 16;
        let mut wrs = [RecvWr {
            wr_id: 0,
            sge: Sge {
                addr: 0,
                len: 0,
                lkey: 0,
            },
        }; BATCH];
        let mut done = 0u16;
        while done < want {
            let mut n = 0;
            while n < BATCH && done + (n as u16) < want {
                let Ok(id) = self.alloc.alloc(ClassId::RECEIVE) else {
                    self.stats.receive_shortfalls += 1;
                    break;
                };
                let Some(loc) = self.pool.locate(id) else {
                    let _ = self.alloc.free(id);
                    break;
                };
                wrs[n] = RecvWr {
                    wr_id: wr_id(KIND_RECV, id),
                    sge: self.mr.sge(loc.offset as u64, loc.len as u32),
                };
                n += 1;
            }
            if n == 0 {
                break;
            }
            if self.qp.post_recv(&wrs[..n]).is_err() {
                for w in &wrs[..n] {
                    let _ = self.alloc.free(BufId::from_bits(w.wr_id & ID_MASK));
                }
                break;
            }
            for w in &wrs[..n] {
                self.trail.push(w.sge.addr);
            }
            done += n as u16;
            *self.posted += n as u16;
            self.stats.receives_posted += n as u64;
            if n < BATCH {
                break;
            }
        }
        done
    }
}

/// What [`Endpoint::flush_in_place`] did.
enum InPlaceSend {
    /// Posted the message.
    Posted,
    /// The connection has nothing to send now (e.g. no send credit).
    Nothing,
    /// The buffer has no usable header room: take the general path.
    NoRoom,
}

/// One connection on one queue pair.
#[derive(Debug)]
pub struct Endpoint<Q: QueuePair> {
    qp: Q,
    conn: Connection,
    pool: BufferPool,
    mr: MemoryRegion,
    /// Receives currently posted (returned by flush completions on teardown).
    recv_posted: u16,
    /// Where those receives are, oldest first.
    recv_trail: RecvTrail,
    /// Sends in flight, in posting order (their buffers return when they
    /// are retired).
    sends: SendRing,
    /// One whole message posted at once in this many is signaled.
    signal_every: u32,
    /// Receive shortfalls and send-buffer stalls when the latest Send was
    /// posted: pool pressure since then makes the next one signaled, so
    /// the buffers unsignaled Sends hold come back.
    pressure_seen: u64,
    /// The send buffer of the latest segment posted of a message whose
    /// last segment is not posted yet, until that Send completes: if the
    /// connection ends before the last segment goes, the message buffer is
    /// released by this Send's completion (segments in flight still read
    /// it), not at once.
    partial: Option<BufId>,
    stats: EndpointStats,
    failed: Option<EndpointError>,
    defer_negotiation: bool,
    send_depth: u32,
    capture: Option<(Arc<CaptureHandle>, CaptureConn)>,
    /// The upper layer's RDMA operations (None until enabled).
    rdma: Option<RdmaOps>,
    /// Scratch for the work requests of one `post_send` of RDMA (reused:
    /// nothing of its size is built per post).
    chain: Box<Chain>,
    /// Whole messages queued with header room go as one contiguous Send
    /// ([`SEND_IN_PLACE`] is free in every buffer id of the pool).
    in_place_sends: bool,
}

impl<Q: QueuePair> Endpoint<Q> {
    /// Binds `conn` to `qp`. `mr` is the registration of `pool`'s region.
    pub fn new(qp: Q, conn: Connection, pool: BufferPool, mr: MemoryRegion) -> Self {
        // At most receive_credit_max + 1 receives are posted at once
        // ([MS-SMBD] 3.1.1.1, and the negotiate receive before it).
        let recv_trail = RecvTrail::new(usize::from(conn.config().receive_credit_max) + 1);
        Endpoint {
            qp,
            conn,
            mr,
            recv_posted: 0,
            recv_trail,
            // One more than the deepest send queue: the drain marker.
            sends: SendRing::new(SEND_RING + 1),
            signal_every: SIGNAL_EVERY,
            pressure_seen: 0,
            partial: None,
            stats: EndpointStats::default(),
            failed: None,
            defer_negotiation: false,
            send_depth: SEND_RING,
            capture: None,
            rdma: None,
            chain: Box::new(Chain::new()),
            in_place_sends: (0..pool.class_count()).all(|c| {
                pool.class_layout(ClassId(c as u8))
                    .is_some_and(|l| u64::from(l.per_slice) <= SEND_IN_PLACE)
            }),
            pool,
        }
    }

    /// Gives the connection a table of `capacity` RDMA operations, with
    /// RDMA Reads bounded by the queue pair's negotiated ORD ([MS-SMBD]
    /// Appendix A). Allocates: call when the connection is attached.
    pub fn enable_rdma(&mut self, capacity: usize) {
        let (_ird, ord) = self.qp.ird_ord();
        self.rdma = Some(RdmaOps::new(capacity, ord));
    }

    /// SGEs per work request the queue pair was created with
    /// ([`crate::provider::QpCaps::max_sge`]): zero-copy RDMA gathers up to
    /// that many (at most [`RDMA_MAX_SGE`]) pieces per work request. Call
    /// after [`Endpoint::enable_rdma`].
    pub fn set_max_sge(&mut self, max_sge: u32) {
        if let Some(r) = self.rdma.as_mut() {
            r.max_sge = (max_sge as usize).clamp(1, RDMA_MAX_SGE);
        }
    }

    /// The RDMA operations, if enabled.
    pub fn rdma(&self) -> Option<&RdmaOps> {
        self.rdma.as_ref()
    }

    /// The RDMA operations, mutably (to build [`crate::upper::Replies`]).
    pub fn rdma_mut(&mut self) -> Option<&mut RdmaOps> {
        self.rdma.as_mut()
    }

    /// Records every message sent and received on this connection
    /// (`serve --capture`).
    pub fn set_capture(&mut self, handle: Arc<CaptureHandle>, conn: CaptureConn) {
        self.capture = Some((handle, conn));
    }

    /// Most sends in flight at once (the queue pair's send depth, at most
    /// [`SEND_RING`]); a peer granting more credits than that cannot overrun
    /// the send queue. Also sets how often a Send is signaled: one in
    /// [`SIGNAL_EVERY`], or in half a shallower depth (so
    /// unsignaled Sends never fill the queue, and the drain marker always
    /// finds room behind them).
    pub fn set_send_depth(&mut self, depth: u32) {
        self.send_depth = depth.clamp(1, SEND_RING);
        self.signal_every = SIGNAL_EVERY.min(self.send_depth / 2).max(1);
    }

    /// Signals one whole-message Send in `n` (1: every Send; at most what
    /// the send depth allows, [`Endpoint::set_send_depth`]).
    pub fn set_signal_every(&mut self, n: u32) {
        self.signal_every = n.clamp(1, SIGNAL_EVERY.min(self.send_depth / 2).max(1));
    }

    /// Passive side: hand the Negotiate Request to the owner as
    /// [`Event::NegotiateRequest`] instead of deciding here.
    pub fn defer_negotiation(&mut self, defer: bool) {
        self.defer_negotiation = defer;
    }

    /// Applies a negotiation decision taken elsewhere ([MS-SMBD] 3.1.5.6):
    /// posts the receives and queues the response (call `flush` next).
    pub fn apply_negotiate_decision(
        &mut self,
        now: Instant,
        decision: NegotiateDecision,
        alloc: &mut SliceAllocator,
    ) -> Result<(), EndpointError> {
        let mut p = poster!(self, alloc);
        match self.conn.apply_negotiate_decision(now, decision, &mut p) {
            Ok(_) => Ok(()),
            Err(r) => Err(self.fail(EndpointError::Terminated(r))),
        }
    }

    /// The queue pair.
    pub fn qp(&self) -> &Q {
        &self.qp
    }

    /// The queue pair, mutably (RDMA operations of the upper layer).
    pub fn qp_mut(&mut self) -> &mut Q {
        &mut self.qp
    }

    /// The SMB Direct state machine.
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// Counters.
    pub fn stats(&self) -> &EndpointStats {
        &self.stats
    }

    /// Why the endpoint stopped, once it has.
    pub fn failure(&self) -> Option<EndpointError> {
        self.failed
    }

    /// Work requests (receives, sends, RDMA Reads and Writes) whose
    /// completions are outstanding: zero once the provider has returned
    /// everything, so every buffer (RDMA data buffers included) can go back
    /// to the pool. Every RDMA chain ends in a signaled request, and a
    /// broken queue pair flushes it, so RDMA work always comes back;
    /// unsignaled Sends at the queue's tail come back behind the drain
    /// marker ([`Endpoint::drain_sends`]).
    pub fn outstanding(&self) -> u64 {
        self.recv_posted as u64
            + self.sends.len() as u64
            + self.rdma.as_ref().map_or(0, |r| r.wrs_in_flight as u64)
    }

    /// [`Endpoint::outstanding`] less the unsignaled Sends at the send
    /// queue's tail, which produce no completion of their own: the work
    /// whose completions will come without a drain marker. Zero on a broken
    /// queue pair means nothing will tell the endpoint it broke.
    pub fn completions_due(&self) -> u64 {
        self.outstanding() - u64::from(self.silent_sends())
    }

    /// Unsignaled Sends after the latest signaled one (or drain marker),
    /// not yet retired.
    fn silent_sends(&self) -> u32 {
        self.sends.silent()
    }

    /// Send-queue slots in use (sends and RDMA work requests).
    fn sq_used(&self) -> u32 {
        self.sends.len() + self.rdma.as_ref().map_or(0, |r| r.wrs_in_flight)
    }

    /// Records a Send just posted, and whether it was signaled.
    #[inline]
    fn sent(&mut self, id: u64, signaled: bool) {
        self.sends.push(id, signaled);
        self.stats.sends_posted += 1;
    }

    /// Retires the Send whose completion this is and every Send posted
    /// before it (the send queue completes in order: those before it are
    /// done, the unsignaled ones silently), returning their buffers.
    fn retire_sends_through(&mut self, wr_id: u64, alloc: &mut SliceAllocator) {
        // Every Send the endpoint posts is in the ring; a completion of one
        // that is not must retire nothing (those in flight still are).
        let n = self.sends.through(wr_id);
        debug_assert!(n.is_some(), "completion of an unknown Send");
        for _ in 0..n.unwrap_or(0) {
            if let Some(id) = self.sends.pop_front() {
                self.retire_send(id, alloc);
            }
        }
    }

    /// Gives back what one finished Send held: a message sent in place
    /// frees its buffer; a header Send frees its send buffer and the
    /// message its release stash names (the last segment's).
    fn retire_send(&mut self, id: u64, alloc: &mut SliceAllocator) {
        if id == DRAIN_WR_ID {
            return;
        }
        if self.in_place_sends && id & SEND_IN_PLACE != 0 {
            // A whole message sent in place: the buffer is the message's,
            // done with once its Send is.
            let _ = alloc.free(BufId::from_bits(id & ID_MASK & !SEND_IN_PLACE));
            return;
        }
        let buf = BufId::from_bits(id & ID_MASK);
        if self.partial == Some(buf) {
            self.partial = None;
        }
        // SAFETY: the Send is done with the buffer, which is ours until
        // freed below.
        let release = unsafe { self.pool.bytes(buf) }
            .and_then(|b| b.get(RELEASE_STASH..RELEASE_STASH + 8))
            .map_or(RELEASE_NONE, |b| {
                u64::from_le_bytes(b.try_into().expect("8 bytes"))
            });
        if release != RELEASE_NONE {
            let _ = alloc.free(BufId::from_bits(release));
        }
        let _ = alloc.free(buf);
    }

    /// On a connection out of service with unsignaled Sends at its send
    /// queue's tail: posts the drain marker behind them, whose (flushed)
    /// completion retires them ([`QueuePair::drain_send_queue`]). Called
    /// by [`Endpoint::release_rdma`], so a closing connection's owner,
    /// calling it until [`Endpoint::outstanding`] is zero, retries a marker
    /// the queue had no room for yet. A provider that refuses the marker
    /// on a queue pair out of service leaves nothing to wait for: those
    /// Sends are retired at once, with a log line. Either way no Send is
    /// silent afterwards, so no second marker follows.
    fn drain_sends(&mut self, alloc: &mut SliceAllocator) {
        if self.failed.is_none() || self.silent_sends() == 0 {
            return;
        }
        match self.qp.drain_send_queue(DRAIN_WR_ID) {
            Ok(()) => {
                self.sends.push(DRAIN_WR_ID, true);
            }
            Err(ProviderError::QueueFull) => {}
            Err(e) => {
                let n = self.silent_sends();
                eprintln!(
                    "smbdirectd: queue pair {}: drain marker refused ({e}); retiring the closed connection's {n} unsignaled Sends without it",
                    self.qp.id().0,
                );
                for _ in 0..n {
                    if let Some(id) = self.sends.pop_back() {
                        self.retire_send(id, alloc);
                    }
                }
            }
        }
    }

    /// Accounts for `n` receives posted on the queue pair by someone else
    /// before the endpoint existed (with ids from [`recv_wr_id`]).
    pub fn assume_posted_receives(&mut self, n: u16) {
        self.recv_posted += n;
        for _ in 0..n {
            self.recv_trail.push(0);
        }
        self.stats.receives_posted += n as u64;
    }

    /// Posts the receive for the negotiate message ([MS-SMBD] 3.1.4.1 /
    /// 3.1.7.2: "post at least one receive buffer of at least 512 bytes").
    pub fn post_negotiate_receive(&mut self, alloc: &mut SliceAllocator) -> bool {
        let mut p = poster!(self, alloc);
        p.post_receives(1) == 1
    }

    /// Ends the endpoint for `e`. A protocol violation, a timer or no pool
    /// buffer for a message tears the RDMA connection down here, so the
    /// provider flushes every posted request back and every buffer comes
    /// home through completions (a connection left up with receives posted
    /// would be neither served nor released). After a failed work request
    /// the provider has already broken the queue pair and flushes it
    /// itself.
    fn fail(&mut self, e: EndpointError) -> EndpointError {
        if self.failed.is_none() {
            self.failed = Some(e);
            if !matches!(e, EndpointError::Provider(_)) {
                self.qp.disconnect();
            }
        }
        e
    }

    /// Starts fetching the first line of the receive buffer the peer's next
    /// Send lands in: the line [MS-SMBD] 3.1.5.5's checks read first, once
    /// the receive completes. Poll loops call it just before they poll the
    /// completion queue, so that when a message has arrived the core
    /// fetches its header line and its completion together instead of one
    /// after the other (as a NIC driver prefetches its next receive
    /// descriptor). A hint: it changes nothing a program can observe.
    ///
    /// On the soft provider, `send` 512 B, in-run A/B (`scripts/ab-rxe.sh
    /// --host --runs 8 --iterations 100000`), p50 B/A 0.976-0.992 over 8
    /// runs, B lower in 8 of 8 (about 25 ns of a 1.2 µs round trip); in
    /// the Soft-RoCE guest, where TCG makes a prefetch a no-op, 0.979-1.016,
    /// median 1.000. Prefetching every line of the last message's length
    /// instead was 17 % slower: the lines the peer is about to write bounce
    /// between the cores.
    #[inline]
    pub fn prefetch_next_receive(&self) {
        if let Some(a) = self.recv_trail.next() {
            crate::hint::prefetch(a as *const u8);
        }
    }

    /// Handles one completion of this queue pair. A complete upper-layer
    /// message comes back as a [`Delivery`].
    pub fn on_completion(
        &mut self,
        now: Instant,
        wc: &Completion,
        alloc: &mut SliceAllocator,
    ) -> Result<Option<Event>, EndpointError> {
        let buf = BufId::from_bits(wc.wr_id & ID_MASK);
        match wc.wr_id >> KIND_SHIFT {
            KIND_SEND => {
                self.retire_sends_through(wc.wr_id, alloc);
                // The drain marker completes flushed: the queue pair was
                // already out of service, for the reason recorded then.
                if wc.status != WcStatus::Success && wc.wr_id != DRAIN_WR_ID {
                    return Err(self.fail(EndpointError::Provider(wc.status)));
                }
                Ok(None)
            }
            KIND_RECV => {
                self.recv_posted = self.recv_posted.saturating_sub(1);
                self.recv_trail.pop();
                if wc.status != WcStatus::Success || wc.opcode != WcOpcode::Recv {
                    let _ = alloc.free(buf);
                    if self.failed.is_none() {
                        self.conn.handle_connection_lost();
                    }
                    return Err(self.fail(EndpointError::Provider(wc.status)));
                }
                if self.failed.is_some() {
                    let _ = alloc.free(buf);
                    return Ok(None);
                }
                // SAFETY: the buffer was filled by the completed receive and
                // is owned by this endpoint until freed below or released.
                let bytes = match unsafe { self.pool.bytes(buf) } {
                    Some(b) => &b[..(wc.byte_len as usize).min(b.len())],
                    None => &[][..],
                };
                if let Some((h, c)) = &self.capture {
                    let op = wc
                        .invalidated_rkey
                        .map_or(CaptureOp::Send, CaptureOp::SendWithInvalidate);
                    h.record(c, Direction::Received, op, bytes);
                }
                if self.conn.role() == Role::Passive && self.defer_negotiation {
                    let mut copy = [0u8; 32];
                    let n = bytes.len().min(32);
                    copy[..n].copy_from_slice(&bytes[..n]);
                    let len = bytes.len();
                    let _ = alloc.free(buf);
                    return Ok(Some(Event::NegotiateRequest { bytes: copy, len }));
                }
                let mut p = poster!(self, alloc);
                let r = self
                    .conn
                    .handle_receive(now, bytes, wc.invalidated_rkey, &mut p);
                match r {
                    Ok(Receive::Message {
                        data: MessageData::Reassembled,
                        invalidated_token,
                    }) => {
                        // The reassembly buffer is reused by the next
                        // fragment: a delivery that may wait (deferred
                        // behind others, held by the upper layer) gets its
                        // own pool buffer. One copy per fragmented message.
                        let _ = alloc.free(buf);
                        let msg = self.conn.reassembled();
                        let len = msg.len();
                        let Ok(nb) = alloc.alloc_len(len.max(1)) else {
                            return Err(self.fail(EndpointError::PoolExhausted));
                        };
                        // SAFETY: `nb` was just allocated and is exclusively ours.
                        match unsafe { self.pool.bytes_mut(nb) } {
                            Some(b) if b.len() >= len => b[..len].copy_from_slice(msg),
                            _ => {
                                let _ = alloc.free(nb);
                                return Err(self.fail(EndpointError::PoolExhausted));
                            }
                        }
                        Ok(Some(Event::Message(Delivery {
                            buf: nb,
                            data: MessageData::InPlace(0..len),
                            invalidated_token,
                        })))
                    }
                    Ok(Receive::Message {
                        data,
                        invalidated_token,
                    }) => Ok(Some(Event::Message(Delivery {
                        buf,
                        data,
                        invalidated_token,
                    }))),
                    Ok(_) => {
                        let _ = alloc.free(buf);
                        Ok(None)
                    }
                    Err(reason) => {
                        let _ = alloc.free(buf);
                        Err(self.fail(EndpointError::Terminated(reason)))
                    }
                }
            }
            KIND_RDMA => {
                self.on_rdma_completion(wc, alloc);
                if wc.status != WcStatus::Success {
                    if self.failed.is_none() {
                        self.conn.handle_connection_lost();
                    }
                    return Err(self.fail(EndpointError::Provider(wc.status)));
                }
                Ok(None)
            }
            _ => Ok(None),
        }
    }

    /// Accounts for one RDMA completion: the last request of a chain
    /// retires the whole chain (selective signaling: the send queue
    /// completes in order, so the unsignaled requests before it are done
    /// too) and gives its RDMA Reads back to the ORD limiter. A failed
    /// request fails its operation; the connection fails with it.
    fn on_rdma_completion(&mut self, wc: &Completion, alloc: &mut SliceAllocator) {
        let Some(r) = self.rdma.as_mut() else {
            return;
        };
        let slot = (wc.wr_id & ((1 << RDMA_SLOT_BITS) - 1)) as usize;
        let n = ((wc.wr_id >> RDMA_N_SHIFT) & 0xffff) as u32;
        let last = (wc.wr_id >> RDMA_LAST_BIT) & 1 == 1;
        let gen = (wc.wr_id >> RDMA_GEN_SHIFT) & RDMA_GEN_MASK;
        let Some(op) = r.ops.get_mut(slot) else {
            return;
        };
        if op.state == OpState::Free || op.ticket.0 & RDMA_GEN_MASK != gen {
            debug_assert!(false, "RDMA completion for an op not in flight");
            return;
        }
        if last {
            op.wrs = op.wrs.saturating_sub(n);
            op.chains = op.chains.saturating_sub(1);
            r.wrs_in_flight = r.wrs_in_flight.saturating_sub(n);
            if op.kind == RdmaKind::Read {
                for _ in 0..n {
                    r.depth.complete();
                }
            }
        }
        if wc.status != WcStatus::Success && op.state != OpState::Failed {
            op.state = OpState::Failed;
            r.stats.ops_failed += 1;
        }
        if op.chains > 0 {
            return;
        }
        match op.state {
            OpState::Queued if op.posted == op.len && self.failed.is_none() => {
                r.stats.ops_completed += 1;
                match op.kind {
                    RdmaKind::Read => r.stats.bytes_read += u64::from(op.len),
                    RdmaKind::Write => r.stats.bytes_written += u64::from(op.len),
                }
                if op.detached {
                    // Its reply went behind it: nothing left for the upper
                    // layer (its pins are released here).
                    RdmaOps::free_op(op, &r.inline[slot], alloc, r.pins.as_deref());
                } else {
                    op.state = OpState::Done;
                    r.done.push_back(slot as u16);
                }
            }
            OpState::Queued if op.posted < op.len && self.failed.is_none() => {}
            OpState::Failed | OpState::Queued => {
                // Nothing of it in flight any more: its buffers go home.
                RdmaOps::free_op(op, &r.inline[slot], alloc, r.pins.as_deref());
                let ops = &r.ops;
                r.pending
                    .retain(|&s| ops[s as usize].state != OpState::Free);
            }
            OpState::Free | OpState::Staged | OpState::Done => {}
        }
    }

    /// Posts the upper layer's queued RDMA operations ([MS-SMBD] 3.1.4.5,
    /// 3.1.4.6), oldest first, as far as the send queue and ORD allow:
    ///
    /// - the peer buffer is sliced with [`rdma_slice::slice`] from the
    ///   descriptors as received, one work request per segment, each with
    ///   one SGE into the operation's pool buffer;
    /// - the requests go in chains of up to 16 with one `post_send`, only
    ///   the last signaled (its completion retires the chain);
    /// - RDMA Reads take a slot of the negotiated ORD each
    ///   ([`ReadDepth`]); with none left, the Read waits (Writes behind it
    ///   may pass) until a chain of Reads completes: reads beyond ORD are
    ///   never posted;
    /// - RDMA work requests and Sends share the send queue's depth.
    ///
    /// Ordering ([MS-SMBD] 1.5): RDMA Write data is placed at the peer before
    /// a later Send on this queue pair completes there, so a reply sent after
    /// the Write is never seen before the data. A reply attached to a Write
    /// ([`RdmaOps::attach_reply`]) is queued on the connection the moment
    /// the Write's last request is posted (an op with one waits while the
    /// connection's send queue is full), so the flush that posts the Write
    /// posts the reply's Send right after it; other replies wait for the
    /// Write's completion and the upper layer.
    pub fn post_rdma(&mut self) -> Result<(), EndpointError> {
        self.post_rdma_with(None)
    }

    /// [`Endpoint::post_rdma`]; given the allocator (as [`Endpoint::flush`]
    /// gives it), a reply attached to a Write goes in the same `post_send`
    /// as the Write's last chain when the connection can send it at once
    /// ([`Connection::transmit_now`]: nothing queued ahead of it, credits,
    /// one segment): one doorbell for the data and its reply, as SPDK's
    /// NVMe-oF RDMA target chains a response's Send behind its data's
    /// RDMA Writes. On a NIC a doorbell is a write to device memory; on
    /// Soft-RoCE it is a system call. Otherwise the reply is queued and
    /// goes with the flush, as before.
    fn post_rdma_with(
        &mut self,
        mut alloc: Option<&mut SliceAllocator>,
    ) -> Result<(), EndpointError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        let used = self.sq_used();
        let mut sq_room = self.send_depth.saturating_sub(used);
        let chain_replies = self.capture.is_none();
        let Endpoint {
            qp,
            pool,
            mr,
            chain,
            conn,
            rdma,
            recv_posted,
            recv_trail,
            stats,
            sends,
            signal_every,
            pressure_seen,
            in_place_sends,
            ..
        } = self;
        let (pool, mr, c) = (&*pool, *mr, &mut **chain);
        let Some(r) = rdma.as_mut() else {
            return Ok(());
        };
        let max_sge = r.max_sge;
        // (error, whether the connection is lost) once the loop stops.
        let mut failure: Option<(WcStatus, bool)> = None;
        let mut i = 0;
        while i < r.pending.len() && sq_room > 0 {
            let slot = r.pending[i] as usize;
            let op = r.ops[slot];
            if op.state != OpState::Queued || op.posted >= op.len {
                i += 1;
                continue;
            }
            if op.reply.is_some() && conn.send_queue_space() == 0 {
                // Its reply must be queued the moment its last request is
                // posted: wait for room in the connection's send queue.
                i += 1;
                continue;
            }
            let mut room = (sq_room as usize).min(RDMA_CHAIN);
            if op.kind == RdmaKind::Read {
                let ord_room = (r.depth.ord() - r.depth.outstanding()) as usize;
                if ord_room == 0 {
                    r.stats.ord_waits += 1;
                    i += 1;
                    continue;
                }
                room = room.min(ord_room);
            }
            let aux = aux_bytes(op.aux, &r.inline[slot], pool);
            let descs = aux.and_then(|b| b.get(..op.descs_len as usize));
            let filled = if op.pieces > 0 {
                let pieces = aux.and_then(|b| b.get(op.pieces_range()));
                descs
                    .zip(pieces)
                    .is_some_and(|(d, p)| next_chain_pieces(c, &op, d, p, room, max_sge))
            } else {
                let base = op
                    .data
                    .and_then(|d| pool.locate(d))
                    .map(|l| l.offset as u64);
                descs
                    .zip(base)
                    .is_some_and(|(descs, base)| next_chain(c, &op, descs, base, mr, room))
            };
            // Validated when the op was staged: failing here is a bug,
            // reported as a local protection error rather than a panic.
            if !filled {
                failure = Some((WcStatus::LocalProtectionError, false));
                break;
            };
            let (n, bytes) = (c.n, c.bytes);
            let ch = &*c;
            // Only the `n` requests of the chain are built (most chains of
            // small transfers hold one: no array of 16 to initialise).
            let make = |k: usize| {
                let (sges, remote) = (&ch.sges[k][..ch.nsge[k]], ch.remotes[k]);
                SendWr {
                    wr_id: rdma_wr_id(slot, n, k + 1 == n, op.ticket),
                    op: match op.kind {
                        RdmaKind::Read => SendOp::RdmaRead { sges, remote },
                        RdmaKind::Write => SendOp::RdmaWrite { sges, remote },
                    },
                    // Selective signaling: the chain's last request completes
                    // for all of them (errors always complete).
                    signaled: k + 1 == n,
                }
            };
            // The reply rides with the chain that finishes its Write, when
            // the connection can say it now (its header is then committed:
            // credits spent and granted, so from here a failed post fails
            // the connection, as a failed `send_now` does).
            let mut reply_sges = [Chain::EMPTY_SGE; 2];
            let mut nsge = 2;
            // (the Send's wr_id, its send buffer if it has one, the reply)
            let mut reply: Option<(u64, Option<BufId>, AttachedReply)> = None;
            if let (Some(a), Some(alloc), true, true) = (
                op.reply,
                alloc.as_deref_mut(),
                chain_replies && op.posted + bytes >= op.len,
                (sq_room as usize) > n,
            ) {
                let mut poster = Poster {
                    qp: &mut *qp,
                    alloc,
                    pool,
                    mr,
                    posted: &mut *recv_posted,
                    trail: &mut *recv_trail,
                    stats: &mut *stats,
                };
                let in_place = (*in_place_sends
                    && a.offset as usize >= DATA_TRANSFER_PAYLOAD_OFFSET
                    && a.buf.to_bits() & (SEND_IN_PLACE | !ID_MASK) == 0)
                    .then(|| pool.locate(a.buf))
                    .flatten();
                if let Some(mloc) = in_place {
                    // One contiguous Send from the reply's buffer, which its
                    // completion frees (as `send_now`).
                    if let Some(sge) =
                        header_in_place(conn, &mut poster, mr, &mloc, a.offset, a.len)
                    {
                        reply_sges[0] = sge;
                        nsge = 1;
                        reply = Some((wr_id(KIND_SEND, a.buf) | SEND_IN_PLACE, None, a));
                    }
                } else {
                    reply = header_send(
                        conn,
                        &mut poster,
                        pool,
                        mr,
                        a.buf,
                        a.offset,
                        a.len,
                        &mut reply_sges,
                    )
                    .map(|sbuf| (wr_id(KIND_SEND, sbuf), Some(sbuf), a));
                }
            }
            // Signaled selectively, as `post_now`'s whole messages are: the
            // Write's completion finishes the operation, the reply's
            // only frees its buffers.
            let reply_wr = reply.map(|(id, _, a)| SendWr {
                wr_id: id,
                op: SendOp::Send {
                    sges: &reply_sges[..nsge],
                    invalidate: a.invalidate,
                },
                signaled: sends.signal_next(
                    *signal_every,
                    stats.receive_shortfalls + stats.pool_stalls,
                    pressure_seen,
                ),
            });
            let posted = if n == 1 && reply_wr.is_none() {
                qp.post_send(&[make(0)])
            } else {
                const UNUSED: SendWr<'static> = SendWr {
                    wr_id: 0,
                    op: SendOp::RdmaWrite {
                        sges: &[],
                        remote: RemoteBuf { addr: 0, rkey: 0 },
                    },
                    signaled: false,
                };
                let mut wrs = [UNUSED; RDMA_CHAIN + 1];
                for (k, wr) in wrs[..n].iter_mut().enumerate() {
                    *wr = make(k);
                }
                let total = match reply_wr {
                    Some(w) => {
                        wrs[n] = w;
                        n + 1
                    }
                    None => n,
                };
                // A reply chained behind its Write is the server's post of
                // the reply (latency marks: an SMB2 READ's round trip).
                marks::server_post(reply_wr.is_some(), || qp.post_send(&wrs[..total]))
            };
            match posted {
                Ok(()) => {}
                // The provider counts work requests we do not (grants,
                // revokes): try again after completions.
                Err(ProviderError::QueueFull) if reply.is_none() => break,
                Err(_) => {
                    if let (Some((_, Some(sbuf), _)), Some(alloc)) = (reply, alloc.as_deref_mut()) {
                        // The reply stays with its op, whose buffers go home
                        // with the failed connection.
                        let _ = alloc.free(sbuf);
                    }
                    failure = Some((WcStatus::Flushed, true));
                    break;
                }
            }
            if let Some(w) = &reply_wr {
                sends.push(w.wr_id, w.signaled);
                stats.sends_posted += 1;
                r.stats.replies_chained += 1;
            }
            r.stats.chains_posted += 1;
            if op.kind == RdmaKind::Read {
                for _ in 0..n {
                    let started = r.depth.try_start();
                    debug_assert!(started, "ORD room was checked");
                }
                r.stats.reads_posted += n as u64;
                r.stats.max_reads_in_flight =
                    r.stats.max_reads_in_flight.max(r.depth.outstanding());
            } else {
                r.stats.writes_posted += n as u64;
            }
            r.wrs_in_flight += n as u32;
            sq_room -= n as u32 + u32::from(reply.is_some());
            let o = &mut r.ops[slot];
            o.wrs += n as u32;
            o.chains += 1;
            o.posted += bytes;
            if o.posted >= o.len {
                if reply.is_some() {
                    // Posted with the chain: its Send releases it (in
                    // place, or through its send buffer's stash).
                    o.reply = None;
                } else if let Some(a) = o.reply.take() {
                    // Every request of the Write is on the send queue: its
                    // reply follows (room was checked above). A reply the
                    // connection refuses (it is terminating) stays with the
                    // op, whose completion frees it: dropped, as `settle`
                    // drops a refused reply. (Queued without its header
                    // room: the flush's general path then posts it in one
                    // batch with what is queued ahead of it.)
                    if conn
                        .send_at(a.buf.to_bits(), a.offset, a.len, a.invalidate)
                        .is_err()
                    {
                        o.reply = Some(a);
                    }
                }
                // Usually the oldest: operations are posted in order.
                if i == 0 {
                    r.pending.pop_front();
                } else {
                    r.pending.remove(i);
                }
            } else {
                i += 1;
            }
        }
        match failure {
            None => Ok(()),
            Some((status, lost)) => {
                if lost {
                    self.conn.handle_connection_lost();
                }
                Err(self.fail(EndpointError::Provider(status)))
            }
        }
    }

    /// Frees the buffers of RDMA operations with nothing in flight and, on
    /// a connection out of service, drains its unsignaled Sends
    /// ([`Endpoint::drain_sends`]); on a closing connection, call until
    /// [`Endpoint::outstanding`] is zero.
    pub fn release_rdma(&mut self, alloc: &mut SliceAllocator) {
        if let Some(r) = self.rdma.as_mut() {
            r.release_idle(alloc);
        }
        self.drain_sends(alloc);
    }

    /// The bytes of a delivered message.
    pub fn message(&self, d: &Delivery) -> &[u8] {
        message_bytes(&self.conn, &self.pool, d)
    }

    /// A delivered message's length (without locating its buffer).
    pub fn message_len(&self, d: &Delivery) -> usize {
        match &d.data {
            MessageData::InPlace(r) => r.len(),
            MessageData::Reassembled => self.conn.reassembled().len(),
        }
    }

    /// A delivered message's bytes and the RDMA operations, at once (the
    /// upper layer reads the one and requests the other).
    pub fn message_and_rdma(&mut self, d: &Delivery) -> (&[u8], Option<&mut RdmaOps>) {
        (message_bytes(&self.conn, &self.pool, d), self.rdma.as_mut())
    }

    /// Returns a delivery's receive buffer to the pool.
    pub fn release(&mut self, d: Delivery, alloc: &mut SliceAllocator) {
        let _ = alloc.free(d.buf);
    }

    /// Drops a delivery whose buffer went elsewhere (queued with
    /// [`Endpoint::send_at`] as a reply from the buffer itself).
    pub(crate) fn forget(&mut self, d: Delivery) {
        let _ = d;
    }

    /// Where a delivered message lies in the pool (None for one still in
    /// the connection's reassembly buffer), for [`Endpoint::send_at`].
    pub(crate) fn in_place(&self, d: &Delivery) -> Option<crate::upper::InPlace> {
        match &d.data {
            MessageData::InPlace(r) => Some(crate::upper::InPlace {
                buf: d.buf,
                offset: u32::try_from(r.start).ok()?,
                len: u32::try_from(r.len()).ok()?,
            }),
            MessageData::Reassembled => None,
        }
    }

    /// Queues an upper-layer message held in pool buffer `msg` (`len`
    /// bytes). The endpoint frees `msg` once the Send of its last segment
    /// completes (its segments are sent from it, gathered behind their
    /// headers: [`Endpoint::flush`]).
    pub fn send(&mut self, msg: BufId, len: u32) -> Result<(), SendError> {
        self.conn.send(msg.to_bits(), len, None)
    }

    /// [`Endpoint::send_with_invalidate`] of the `len` bytes at `offset`
    /// into pool buffer `msg` (e.g. a received message answered from its
    /// receive buffer); the endpoint frees `msg` as [`Endpoint::send`] does.
    pub fn send_at(
        &mut self,
        msg: BufId,
        offset: u32,
        len: u32,
        invalidate: Option<u32>,
    ) -> Result<(), SendError> {
        self.conn.send_at(msg.to_bits(), offset, len, invalidate)
    }

    /// [`Endpoint::send_at`] where the 24 bytes before `offset` in `msg`
    /// are free for the header (a received message's own header, answered
    /// in place; a message copied in behind room left for it): sent whole,
    /// header and payload go as one contiguous Send from `msg`
    /// ([`Connection::send_with_header_room`]), with no send buffer.
    pub fn send_with_header_room(
        &mut self,
        msg: BufId,
        offset: u32,
        len: u32,
        invalidate: Option<u32>,
    ) -> Result<(), SendError> {
        self.conn
            .send_with_header_room(msg.to_bits(), offset, len, invalidate)
    }

    /// [`Endpoint::send`], as Send with Invalidate of the peer's `token`
    /// when given ([MS-SMBD] 3.1.5.1: the last fragment carries it).
    pub fn send_with_invalidate(
        &mut self,
        msg: BufId,
        len: u32,
        invalidate: Option<u32>,
    ) -> Result<(), SendError> {
        self.conn.send(msg.to_bits(), len, invalidate)
    }

    /// [`Endpoint::send_at`] (or, with `header_room`,
    /// [`Endpoint::send_with_header_room`]) that posts the message at once
    /// when nothing else is waiting to go and it is sent whole
    /// ([`Connection::transmit_now`]): no trip through the send queue and
    /// [`Endpoint::flush`], the same bytes on the wire. Returns `Ok(true)`
    /// when posted, `Ok(false)` when queued the usual way (the caller
    /// flushes, which also reports a provider failure of the post tried
    /// here), and the queueing error otherwise (the caller keeps `msg`).
    pub fn send_now(
        &mut self,
        alloc: &mut SliceAllocator,
        msg: BufId,
        offset: u32,
        len: u32,
        invalidate: Option<u32>,
        header_room: bool,
    ) -> Result<bool, SendError> {
        let queue = |ep: &mut Self| {
            let h = msg.to_bits();
            if header_room {
                ep.conn.send_with_header_room(h, offset, len, invalidate)
            } else {
                ep.conn.send_at(h, offset, len, invalidate)
            }
            .map(|()| false)
        };
        if self.failed.is_some()
            || self.capture.is_some()
            || self.sq_used() >= self.send_depth
            || self.rdma.as_ref().is_some_and(|r| !r.pending.is_empty())
            || msg.to_bits() & (SEND_IN_PLACE | !ID_MASK) != 0
        {
            return queue(self);
        }
        let end = offset as usize + len as usize;
        let Some(mloc) = self.pool.locate(msg).filter(|l| end <= l.len) else {
            return queue(self);
        };
        if header_room && self.in_place_sends && offset as usize >= DATA_TRANSFER_PAYLOAD_OFFSET {
            // One contiguous Send from the message's own buffer, header in
            // the room before it (as `flush_in_place`).
            let Some(sge) = header_in_place(
                &mut self.conn,
                &mut poster!(self, alloc),
                self.mr,
                &mloc,
                offset,
                len,
            ) else {
                return queue(self);
            };
            let id = wr_id(KIND_SEND, msg) | SEND_IN_PLACE;
            return Ok(self.post_now(alloc, &[sge], id, invalidate, None, msg));
        }
        // The header in a send buffer, the payload gathered from the
        // message (as `flush`'s general path).
        let mut sges = [Chain::EMPTY_SGE; 2];
        let Some(sbuf) = header_send(
            &mut self.conn,
            &mut poster!(self, alloc),
            &self.pool,
            self.mr,
            msg,
            offset,
            len,
            &mut sges,
        ) else {
            return queue(self);
        };
        let id = wr_id(KIND_SEND, sbuf);
        Ok(self.post_now(alloc, &sges, id, invalidate, Some(sbuf), msg))
    }

    /// Posts a Send of whole message `msg` (`send_now`, `flush_in_place`).
    /// On a provider failure frees its buffers (`sbuf`, if any, and `msg`),
    /// fails the endpoint as `flush` does and returns false.
    ///
    /// Selective signaling: one such Send in `signal_every` (counting the
    /// replies chained behind a Write too) asks for a completion, and its
    /// completion retires the unsignaled ones before it ([`SendRing`]), as
    /// perftest does; a round trip then polls one completion per side
    /// fewer. Any sign of
    /// pool pressure since the previous Send (a receive not reposted, a
    /// send buffer not found) makes this one signaled, so the buffers the
    /// unsignaled ones still hold come home. A connection that goes quiet
    /// keeps at most `signal_every - 1` of them until its next Send, or
    /// its close ([`Endpoint::drain_sends`]). Segments and control
    /// messages stay signaled.
    #[inline]
    fn post_now(
        &mut self,
        alloc: &mut SliceAllocator,
        sges: &[crate::provider::Sge],
        id: u64,
        invalidate: Option<u32>,
        sbuf: Option<BufId>,
        msg: BufId,
    ) -> bool {
        let signaled = self.sends.signal_next(
            self.signal_every,
            self.stats.receive_shortfalls + self.stats.pool_stalls,
            &mut self.pressure_seen,
        );
        let wr = [SendWr {
            wr_id: id,
            op: SendOp::Send { sges, invalidate },
            signaled,
        }];
        let posted = marks::server_post(true, || self.qp.post_send(&wr));
        if posted.is_err() {
            if let Some(b) = sbuf {
                let _ = alloc.free(b);
            }
            let _ = alloc.free(msg);
            self.conn.handle_connection_lost();
            self.fail(EndpointError::Provider(WcStatus::Flushed));
            return false;
        }
        self.sent(id, signaled);
        true
    }

    /// Posts everything the connection wants to transmit. Returns false when
    /// a send buffer was not available (call again after completions).
    pub fn flush(
        &mut self,
        now: Instant,
        alloc: &mut SliceAllocator,
    ) -> Result<bool, EndpointError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        // RDMA first: a reply the upper layer queued after an RDMA Write was
        // queued after its completion, so no ordering is at stake here.
        if self.rdma.as_ref().is_some_and(|r| !r.pending.is_empty()) {
            self.post_rdma_with(Some(alloc))?;
        }
        if !self.conn.transmit_pending() {
            // Nothing to say (the common case): no batch to set up.
            return Ok(true);
        }
        // Sends built by the general path go out together, up to
        // SEND_BATCH in one `post_send` (one doorbell: on rdma_rxe one
        // system call, not one per segment of a fragmented message).
        let mut batch = SendBatch::new();
        loop {
            if !self.conn.transmit_pending() {
                // Nothing to say: no send buffer to reserve and give back.
                self.post_batch(alloc, &mut batch)?;
                return Ok(true);
            }
            if self.sq_used() + batch.n as u32 >= self.send_depth {
                self.post_batch(alloc, &mut batch)?;
                return Ok(true); // completions will call us again
            }
            if self.in_place_sends && self.capture.is_none() {
                if let Some(ps) = self.conn.next_in_place() {
                    // Whatever is built goes first: the send queue keeps
                    // the connection's order.
                    self.post_batch(alloc, &mut batch)?;
                    match self.flush_in_place(now, alloc, ps)? {
                        InPlaceSend::Posted => continue,
                        InPlaceSend::Nothing => return Ok(true),
                        InPlaceSend::NoRoom => {}
                    }
                }
            }
            // Reserve the send buffer first, so a transmit the connection
            // commits to always has somewhere to go.
            let (sbuf, loc) = match send_buffer(&self.pool, alloc) {
                Ok(Some(b)) => b,
                Ok(None) => {
                    self.post_batch(alloc, &mut batch)?;
                    self.stats.pool_stalls += 1;
                    return Ok(false);
                }
                Err(()) => {
                    self.post_batch(alloc, &mut batch)?;
                    return Err(self.fail(EndpointError::PoolExhausted));
                }
            };
            // SAFETY: sbuf was just allocated and is exclusively ours; `loc`
            // is its live location in the pool's mapping.
            let out = unsafe { std::slice::from_raw_parts_mut(loc.ptr.as_ptr(), loc.len) };
            // The header is written straight into the send buffer; the
            // payload is gathered from the message buffer as a second SGE
            // of the same Send: no copy ([MS-SMBD] 2.2.3: the payload
            // follows the 24-byte header at DataOffset 24, which is what
            // the gather puts on the wire).
            let Some(t) = self.poll_transmit(now, alloc, out) else {
                let _ = alloc.free(sbuf);
                self.post_batch(alloc, &mut batch)?;
                if let Some(r) = self.conn.terminated() {
                    return Err(self.fail(EndpointError::Terminated(r)));
                }
                return Ok(true);
            };
            let mut sges = [self.mr.sge(loc.offset as u64, t.header_len as u32); 2];
            let mut nsge = 1;
            let mut release = RELEASE_NONE;
            let mut payload: &[u8] = &[];
            if let Some(ps) = t.payload {
                let msg = BufId::from_bits(ps.handle);
                let end = ps.offset as usize + ps.len as usize;
                let Some(mloc) = self.pool.locate(msg).filter(|l| end <= l.len) else {
                    let _ = alloc.free(sbuf);
                    self.post_batch(alloc, &mut batch)?;
                    return Err(self.fail(EndpointError::PoolExhausted));
                };
                sges[1] = self
                    .mr
                    .sge((mloc.offset + ps.offset as usize) as u64, ps.len);
                nsge = 2;
                if ps.last {
                    release = ps.handle;
                }
                if self.capture.is_some() {
                    // SAFETY: the message buffer belongs to this endpoint
                    // until its last segment's Send completes; `end` is
                    // inside it (checked above).
                    payload = unsafe { self.pool.bytes(msg) }
                        .and_then(|b| b.get(ps.offset as usize..end))
                        .unwrap_or_default();
                }
            }
            out[RELEASE_STASH..RELEASE_STASH + 8].copy_from_slice(&release.to_le_bytes());
            if let Some((h, c)) = &self.capture {
                let op = t
                    .invalidate_token
                    .map_or(CaptureOp::Send, CaptureOp::SendWithInvalidate);
                h.record_parts(c, Direction::Sent, op, &[&out[..t.header_len], payload]);
            }
            batch.push(sbuf, release, sges, nsge, t.invalidate_token);
            if t.disconnect_after {
                // The failure negotiate response is on its way; the caller
                // disconnects once it completes.
                self.post_batch(alloc, &mut batch)?;
                return Ok(true);
            }
            if batch.n == SEND_BATCH {
                self.post_batch(alloc, &mut batch)?;
            }
        }
    }

    /// Posts the Sends `flush` built, in one `post_send`, and empties
    /// `b`. A refused post fails the endpoint: a lone Send was not posted,
    /// and its buffers go home now (as before batching); of a chain, the
    /// provider may have posted a prefix (verbs stops at the first bad
    /// request), so every Send of it is kept as if posted but unsignaled:
    /// the completions of those that went out, or the drain marker at
    /// teardown ([`Endpoint::drain_sends`]), return their buffers, never
    /// while the device may still read them.
    fn post_batch(
        &mut self,
        alloc: &mut SliceAllocator,
        b: &mut SendBatch,
    ) -> Result<(), EndpointError> {
        let n = core::mem::take(&mut b.n);
        if n == 0 {
            return Ok(());
        }
        let wrs: [SendWr<'_>; SEND_BATCH] = core::array::from_fn(|k| SendWr {
            wr_id: wr_id(KIND_SEND, b.sbufs[k]),
            op: SendOp::Send {
                sges: &b.sges[k][..b.nsge[k]],
                invalidate: b.invalidate[k],
            },
            signaled: true,
        });
        let posted = self.qp.post_send(&wrs[..n]).is_ok();
        if !posted && n == 1 {
            let _ = alloc.free(b.sbufs[0]);
            if b.releases[0] != RELEASE_NONE {
                let _ = alloc.free(BufId::from_bits(b.releases[0]));
            }
        } else {
            for k in 0..n {
                if b.nsge[k] == 2 {
                    // A segment before the last one: the message stays
                    // queued and this Send reads it.
                    self.partial = (b.releases[k] == RELEASE_NONE).then_some(b.sbufs[k]);
                }
                self.sent(wr_id(KIND_SEND, b.sbufs[k]), posted);
            }
        }
        if !posted {
            self.conn.handle_connection_lost();
            return Err(self.fail(EndpointError::Provider(WcStatus::Flushed)));
        }
        Ok(())
    }

    /// [`Connection::poll_transmit`] into `header`, receives posted
    /// through this endpoint's queue pair and `alloc` ([MS-SMBD] 3.1.5.9).
    #[inline]
    fn poll_transmit(
        &mut self,
        now: Instant,
        alloc: &mut SliceAllocator,
        header: &mut [u8],
    ) -> Option<smbdirect_protocol::smbd::Transmit> {
        let mut p = poster!(self, alloc);
        self.conn.poll_transmit(now, &mut p, header)
    }

    /// Posts the whole message `ps` ([`Connection::next_in_place`]) as one
    /// Send from its own buffer: the connection writes the 24-byte header
    /// into the header room right before the payload, and that contiguous
    /// range is the one SGE. The same bytes reach the wire as through the
    /// general path (header from a send buffer, payload gathered): no send
    /// buffer to allocate, locate and free, one SGE instead of two.
    fn flush_in_place(
        &mut self,
        now: Instant,
        alloc: &mut SliceAllocator,
        ps: PayloadSlice,
    ) -> Result<InPlaceSend, EndpointError> {
        let msg = BufId::from_bits(ps.handle);
        let room = DATA_TRANSFER_PAYLOAD_OFFSET;
        let start = ps.offset as usize - room;
        let end = ps.offset as usize + ps.len as usize;
        // The header buffer handed to the connection runs from the header
        // room to the end of the message buffer: at least MAX_HEADER_LEN.
        let Some(mloc) = self
            .pool
            .locate(msg)
            .filter(|l| end <= l.len && l.len - start >= MAX_HEADER_LEN)
        else {
            return Ok(InPlaceSend::NoRoom);
        };
        if msg.to_bits() & (SEND_IN_PLACE | !ID_MASK) != 0 {
            return Ok(InPlaceSend::NoRoom);
        }
        // SAFETY: the message buffer belongs to this endpoint until its
        // Send completes and nothing reads or writes it meanwhile; the
        // range is inside it (checked above). The connection writes only
        // the 24 header bytes, all in the header room, which the sender
        // gave up ([`Endpoint::send_with_header_room`]).
        let header = unsafe {
            std::slice::from_raw_parts_mut(mloc.ptr.as_ptr().add(start), mloc.len - start)
        };
        let Some(t) = self.poll_transmit(now, alloc, header) else {
            if let Some(r) = self.conn.terminated() {
                return Err(self.fail(EndpointError::Terminated(r)));
            }
            return Ok(InPlaceSend::Nothing);
        };
        debug_assert_eq!(t.payload, Some(ps));
        debug_assert_eq!(t.header_len, room);
        let sges = [self.mr.sge(
            (mloc.offset + start) as u64,
            (room + ps.len as usize) as u32,
        )];
        let id = wr_id(KIND_SEND, msg) | SEND_IN_PLACE;
        if !self.post_now(alloc, &sges, id, t.invalidate_token, None, msg) {
            return Err(self
                .failed
                .unwrap_or(EndpointError::Provider(WcStatus::Flushed)));
        }
        Ok(InPlaceSend::Posted)
    }

    /// [MS-SMBD] 3.1.6 timers; the earliest deadline is
    /// `connection().poll_timeout()`.
    pub fn on_timer(&mut self, now: Instant) -> Result<(), EndpointError> {
        match self.conn.handle_timeout(now) {
            Ok(()) => Ok(()),
            Err(r) => Err(self.fail(EndpointError::Terminated(r))),
        }
    }

    /// Returns the buffers of upper-layer messages still queued (after
    /// termination) to the pool: at once, except a partly sent message's,
    /// which its segments in flight still read: the completion of the
    /// latest one releases it.
    pub fn free_queued(&mut self, alloc: &mut SliceAllocator) {
        let partial = self.partial.take();
        for m in self.conn.drain_send_queue() {
            let msg = BufId::from_bits(m.handle);
            let stash = partial.filter(|_| m.sent > 0).and_then(|sb| {
                // SAFETY: `sb` is in flight (its completion clears
                // `partial`); the provider never reads past the header it
                // sends, so the stash is ours to write.
                unsafe { self.pool.bytes_mut(sb) }?.get_mut(RELEASE_STASH..RELEASE_STASH + 8)
            });
            match stash {
                Some(b) => b.copy_from_slice(&m.handle.to_le_bytes()),
                None => {
                    let _ = alloc.free(msg);
                }
            }
        }
    }

    /// Closes the connection; posted buffers come back through flushed
    /// completions, queued messages are freed here (or with the Send still
    /// reading them, [`Endpoint::free_queued`]).
    pub fn close(&mut self, alloc: &mut SliceAllocator) {
        self.conn.close();
        self.free_queued(alloc);
        self.fail(EndpointError::Terminated(TerminateReason::LocalClose));
        self.release_rdma(alloc);
    }
}

fn message_bytes<'a>(conn: &'a Connection, pool: &'a BufferPool, d: &Delivery) -> &'a [u8] {
    match &d.data {
        MessageData::Reassembled => conn.reassembled(),
        MessageData::InPlace(r) => {
            // SAFETY: the delivery keeps the receive buffer allocated and
            // untouched by the provider (it is no longer posted).
            match unsafe { pool.bytes(d.buf) } {
                Some(b) if r.end <= b.len() => &b[r.clone()],
                _ => &[],
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::{Access, Grant, QpId, QpState, RecvWr};
    use crate::upper::{QueuedReply, Replies};
    use smbdirect_hugepages::{HugepagePolicy, PoolConfig, SizeClass};
    use smbdirect_protocol::smbd::rdma_slice::SliceError;
    use smbdirect_protocol::smbd::wire::BufferDescriptorRepr;
    use smbdirect_protocol::smbd::SmbdConfig;

    /// A queue pair that executes RDMA against an in-memory "peer" at post
    /// time and hands out completions only when the test asks, so what is
    /// outstanding at each moment is under the test's control.
    struct MockQp {
        ord: u32,
        peer: Vec<u8>,
        bad_rkey: u32,
        /// Posted, unretired send-queue requests: (wr_id, read, signaled,
        /// status, opcode).
        sq: VecDeque<(u64, bool, bool, WcStatus, WcOpcode)>,
        reads_outstanding: u32,
        max_reads_outstanding: u32,
        chains: Vec<usize>,
        /// The bytes of every Send posted, gathered from its SGEs at post
        /// time, and its SGE count.
        sends: Vec<(Vec<u8>, usize)>,
        broken: bool,
        /// Every post fails (a queue pair the provider has torn down).
        refuse_posts: bool,
        /// The drain marker is refused.
        refuse_drain: bool,
        /// Drain markers posted.
        drains: usize,
    }

    impl MockQp {
        fn new(ord: u32) -> Self {
            MockQp {
                ord,
                peer: (0..1 << 20).map(|i| (i * 7 + 3) as u8).collect(),
                bad_rkey: 0xdead,
                sq: VecDeque::new(),
                reads_outstanding: 0,
                max_reads_outstanding: 0,
                chains: Vec::new(),
                sends: Vec::new(),
                broken: false,
                refuse_posts: false,
                refuse_drain: false,
                drains: 0,
            }
        }

        /// Retires requests up to the next one that completes (signaled or
        /// failed) and returns its completion.
        fn next_completion(&mut self) -> Option<Completion> {
            while let Some((wr_id, read, signaled, status, opcode)) = self.sq.pop_front() {
                if read {
                    self.reads_outstanding -= 1;
                }
                if signaled || status != WcStatus::Success {
                    return Some(Completion {
                        wr_id,
                        qp: QpId(1),
                        status,
                        opcode,
                        byte_len: 0,
                        invalidated_rkey: None,
                    });
                }
            }
            None
        }
    }

    impl QueuePair for MockQp {
        fn id(&self) -> QpId {
            QpId(1)
        }
        fn state(&self) -> QpState {
            if self.broken {
                QpState::Error
            } else {
                QpState::Connected
            }
        }
        fn ird_ord(&self) -> (u32, u32) {
            (16, self.ord)
        }
        fn post_recv(&mut self, _wrs: &[RecvWr]) -> Result<(), ProviderError> {
            Ok(())
        }
        fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<(), ProviderError> {
            if self.refuse_posts {
                return Err(ProviderError::NotConnected);
            }
            self.chains.push(wrs.len());
            for wr in wrs {
                let (read, sges, remote, opcode) = match wr.op {
                    SendOp::RdmaRead { sges, remote } => (true, sges, remote, WcOpcode::RdmaRead),
                    SendOp::RdmaWrite { sges, remote } => {
                        (false, sges, remote, WcOpcode::RdmaWrite)
                    }
                    SendOp::Send { sges, .. } => {
                        let mut bytes = Vec::new();
                        for sge in sges {
                            // SAFETY: as for RDMA below: the SGEs point into
                            // the test's pool.
                            bytes.extend_from_slice(unsafe {
                                std::slice::from_raw_parts(sge.addr as *const u8, sge.len as usize)
                            });
                        }
                        self.sends.push((bytes, sges.len()));
                        // A Send: completes, or is flushed once broken.
                        let status = if self.broken {
                            WcStatus::Flushed
                        } else {
                            WcStatus::Success
                        };
                        self.sq
                            .push_back((wr.wr_id, false, wr.signaled, status, WcOpcode::Send));
                        continue;
                    }
                };
                assert!(!sges.is_empty() && sges.len() <= RDMA_MAX_SGE);
                let status = if self.broken {
                    WcStatus::Flushed
                } else if remote.rkey == self.bad_rkey {
                    self.broken = true;
                    WcStatus::RemoteAccessError
                } else {
                    let mut at = remote.addr as usize;
                    for sge in sges {
                        let (len, local) = (sge.len as usize, sge.addr as *mut u8);
                        // SAFETY: the SGE points into the test's pool (the
                        // fake region's address is the pool's mapping) or
                        // into a test's own buffer.
                        unsafe {
                            if read {
                                std::ptr::copy_nonoverlapping(self.peer[at..].as_ptr(), local, len);
                            } else {
                                std::ptr::copy_nonoverlapping(
                                    local,
                                    self.peer[at..at + len].as_mut_ptr(),
                                    len,
                                );
                            }
                        }
                        at += len;
                    }
                    WcStatus::Success
                };
                if read {
                    self.reads_outstanding += 1;
                    self.max_reads_outstanding =
                        self.max_reads_outstanding.max(self.reads_outstanding);
                }
                self.sq
                    .push_back((wr.wr_id, read, wr.signaled, status, opcode));
            }
            Ok(())
        }
        fn grant(
            &mut self,
            _wr_id: u64,
            _sge: Sge,
            _access: Access,
            _signaled: bool,
        ) -> Result<Grant, ProviderError> {
            Err(ProviderError::Unsupported("mock"))
        }
        fn revoke(
            &mut self,
            _wr_id: u64,
            _rkey: u32,
            _signaled: bool,
        ) -> Result<(), ProviderError> {
            Ok(())
        }
        fn disconnect(&mut self) {
            self.broken = true;
        }
        fn drain_send_queue(&mut self, wr_id: u64) -> Result<(), ProviderError> {
            if !self.broken || self.refuse_drain {
                return Err(ProviderError::Other("refused".into()));
            }
            self.drains += 1;
            self.sq
                .push_back((wr_id, false, true, WcStatus::Flushed, WcOpcode::Send));
            Ok(())
        }
    }

    struct Rig {
        ep: Endpoint<MockQp>,
        alloc: SliceAllocator,
        pool: BufferPool,
        baseline: Vec<u32>,
    }

    fn rig(ord: u32) -> Rig {
        rig_sized(ord, 8)
    }

    /// [`rig`] with `receives` receive buffers (8 leaves the connection
    /// short of the receives its credits want: pool pressure); more than 8
    /// come with 64 send buffers instead of 8.
    fn rig_sized(ord: u32, receives: u32) -> Rig {
        rig_with_class(ord, receives, None)
    }

    /// [`rig_sized`] with `extra` as a fourth size class.
    fn rig_with_class(ord: u32, receives: u32, extra: Option<SizeClass>) -> Rig {
        let sends = if receives > 8 { 64 } else { 8 };
        let mut cfg = PoolConfig::new(8 << 20, 1)
            .class(SizeClass::new("receive", 8192).per_slice(receives))
            .class(SizeClass::new("send", 1364).per_slice(sends))
            .class(SizeClass::new("rdma", 64 << 10).per_slice(8));
        if let Some(c) = extra {
            cfg = cfg.class(c);
        }
        let pool = cfg
            .hugepages(HugepagePolicy::Disable)
            .mlock(false)
            .build()
            .unwrap();
        let mr = MemoryRegion {
            addr: pool.region_base().as_ptr() as u64,
            len: pool.region_len() as u64,
            lkey: 7,
        };
        let conn = Connection::new_passive(SmbdConfig::default(), Instant::ZERO);
        let mut ep = Endpoint::new(MockQp::new(ord), conn, pool.clone(), mr);
        ep.set_send_depth(64);
        ep.enable_rdma(8);
        let alloc = pool.claim_slice(0).unwrap();
        let baseline = free_counts(&pool);
        Rig {
            ep,
            alloc,
            pool,
            baseline,
        }
    }

    fn free_counts(pool: &BufferPool) -> Vec<u32> {
        (0..pool.class_count())
            .map(|c| pool.class_stats(0, ClassId(c as u8)).unwrap().free)
            .collect()
    }

    /// Descriptors of `n` peer ranges of `each` bytes, 100 bytes apart.
    fn descs(base: u64, n: usize, each: u32, token: u32) -> Vec<u8> {
        (0..n)
            .flat_map(|i| {
                BufferDescriptorRepr {
                    offset: base + i as u64 * (u64::from(each) + 100),
                    token,
                    length: each,
                }
                .to_bytes()
            })
            .collect()
    }

    /// Runs `f` with a `Replies` on the rig, then commits (Ok) or aborts.
    fn with_replies<R>(
        r: &mut Rig,
        completing: Option<usize>,
        f: impl FnOnce(&mut Replies<'_>) -> Result<R, RdmaError>,
    ) -> Result<R, RdmaError> {
        let mut queued = [QueuedReply::EMPTY; 2];
        let mut out = Replies::new(
            &mut r.alloc,
            &r.pool,
            &mut queued,
            r.ep.rdma.as_mut(),
            1 << 20,
            completing,
            None,
        );
        let res = f(&mut out);
        let rdma = r.ep.rdma.as_mut().unwrap();
        match res {
            Ok(_) => rdma.commit(&mut r.alloc, completing),
            Err(_) => rdma.abort(&mut r.alloc, completing),
        }
        res
    }

    #[test]
    fn rdma_reads_beyond_ord_wait_and_writes_pass_them() {
        let mut r = rig(2);
        // A: 5 segments, B: 1 segment (both reads); C: a 3-segment write.
        let a = with_replies(&mut r, None, |o| {
            o.rdma_read(&descs(0, 5, 1000, 1), 0, 5000, b"A")
        })
        .unwrap();
        let b = with_replies(&mut r, None, |o| {
            o.rdma_read(&descs(9000, 1, 700, 2), 0, 700, b"B")
        })
        .unwrap();
        let c = with_replies(&mut r, None, |o| {
            o.rdma_write(&descs(20_000, 3, 100, 3), 0, 300, b"C", |b| b.fill(0xee))
        })
        .unwrap();
        assert!(a < b && b < c);
        r.ep.post_rdma().unwrap();
        // Two reads of A (ORD 2) in one chain; B waits; C's write passes.
        assert_eq!(r.ep.qp().chains, vec![2, 3]);
        assert_eq!(r.ep.qp().reads_outstanding, 2);
        assert_eq!(r.ep.rdma().unwrap().reads_in_flight(), 2);
        let mut done = Vec::new();
        let mut steps = 0;
        while let Some(wc) = r.ep.qp_mut().next_completion() {
            r.ep.on_completion(Instant::ZERO, &wc, &mut r.alloc)
                .unwrap();
            r.ep.post_rdma().unwrap();
            assert!(r.ep.qp().reads_outstanding <= 2, "reads posted beyond ORD");
            while let Some(d) = r.ep.rdma().unwrap().peek_done() {
                // SAFETY: the op is done; nothing writes its buffer.
                let data =
                    unsafe { r.pool.bytes(d.data.unwrap()) }.unwrap()[..d.len as usize].to_vec();
                done.push((d.ticket, d.kind, data));
                with_replies(&mut r, Some(d.slot), |_| Ok(())).unwrap();
            }
            steps += 1;
            assert!(steps < 100);
        }
        assert_eq!(r.ep.qp().max_reads_outstanding, 2);
        assert!(r.ep.rdma().unwrap().stats().ord_waits > 0);
        assert_eq!(r.ep.rdma().unwrap().stats().max_reads_in_flight, 2);
        // Every chain of reads had at most ORD requests.
        let order: Vec<Ticket> = done.iter().map(|d| d.0).collect();
        assert_eq!(order, vec![c, a, b], "the write finished before the reads");
        // A's bytes are the peer's five ranges, back to back.
        let peer = &r.ep.qp().peer;
        let want_a: Vec<u8> = (0..5)
            .flat_map(|i| peer[i * 1100..i * 1100 + 1000].to_vec())
            .collect();
        assert_eq!(done[1].2, want_a);
        assert_eq!(done[2].2, peer[9000..9700].to_vec());
        for i in 0..3 {
            let at = 20_000 + i * 200;
            assert!(peer[at..at + 100].iter().all(|&x| x == 0xee));
        }
        assert_eq!(r.ep.outstanding(), 0);
        assert_eq!(r.ep.rdma().unwrap().active(), 0);
        assert_eq!(free_counts(&r.pool), r.baseline, "every buffer returned");
    }

    #[test]
    fn read_then_write_back_moves_the_same_bytes_without_a_copy() {
        let mut r = rig(16);
        with_replies(&mut r, None, |o| {
            o.rdma_read(&descs(100, 2, 3000, 1), 1000, 4000, b"ctx")
        })
        .unwrap();
        r.ep.post_rdma().unwrap();
        let wc = r.ep.qp_mut().next_completion().unwrap();
        r.ep.on_completion(Instant::ZERO, &wc, &mut r.alloc)
            .unwrap();
        let d = r.ep.rdma().unwrap().peek_done().unwrap();
        let mut scratch = [0u8; INLINE_AUX];
        let ctx =
            r.ep.rdma()
                .unwrap()
                .done_context(&r.pool, &d, &mut scratch)
                .to_vec();
        assert_eq!(ctx, b"ctx");
        // Backpressure after staging the write-back undoes it...
        let before = free_counts(&r.pool);
        let e = with_replies(&mut r, Some(d.slot), |o| {
            o.rdma_write_back(&descs(200_000, 4, 1000, 2), 0, b"w")?;
            Err::<(), _>(RdmaError::Backpressure(Backpressure::SendQueueFull))
        });
        assert!(e.is_err());
        assert_eq!(free_counts(&r.pool), before);
        // ...and the retry continues the same buffer as a write.
        with_replies(&mut r, Some(d.slot), |o| {
            o.rdma_write_back(&descs(200_000, 4, 1000, 2), 0, b"w")
        })
        .unwrap();
        r.ep.post_rdma().unwrap();
        let wc = r.ep.qp_mut().next_completion().unwrap();
        r.ep.on_completion(Instant::ZERO, &wc, &mut r.alloc)
            .unwrap();
        let w = r.ep.rdma().unwrap().peek_done().unwrap();
        assert_eq!((w.kind, w.data, w.len), (RdmaKind::Write, d.data, 4000));
        with_replies(&mut r, Some(w.slot), |_| Ok(())).unwrap();
        // The peer's bytes 1000..5000 of the first buffer (split over two
        // descriptors 3100 apart) landed in four 1000-byte ranges.
        let peer = r.ep.qp().peer.clone();
        let src: Vec<u8> = peer[1100..3100]
            .iter()
            .chain(&peer[3200..5200])
            .copied()
            .collect();
        let dst: Vec<u8> = (0..4)
            .flat_map(|i| peer[200_000 + i * 1100..200_000 + i * 1100 + 1000].to_vec())
            .collect();
        assert_eq!(src, dst);
        assert_eq!(free_counts(&r.pool), r.baseline);
    }

    #[test]
    fn descriptors_and_context_that_fit_stay_in_the_table_and_larger_ones_take_a_pool_buffer() {
        let mut r = rig(16);
        let free = |r: &Rig| free_counts(&r.pool).iter().sum::<u32>();
        let start = free(&r);
        // One descriptor and an SMB2 WRITE's 112-byte context: the data
        // buffer is the only pool buffer the operation takes.
        let small = [0x5au8; 112];
        with_replies(&mut r, None, |o| {
            o.rdma_read(&descs(100, 1, 4000, 1), 0, 4000, &small)
        })
        .unwrap();
        assert_eq!(free(&r), start - 1, "the data buffer only");
        // Twelve descriptors (192 bytes) and a context: past INLINE_AUX,
        // so a pool buffer holds them beside the data's.
        let large: Vec<u8> = (0..40u8).collect();
        with_replies(&mut r, None, |o| {
            o.rdma_read(&descs(100_000, 12, 900, 2), 0, 10_800, &large)
        })
        .unwrap();
        assert_eq!(free(&r), start - 3, "data and aux buffers");
        r.ep.post_rdma().unwrap();
        while let Some(wc) = r.ep.qp_mut().next_completion() {
            r.ep.on_completion(Instant::ZERO, &wc, &mut r.alloc)
                .unwrap();
        }
        // Each context comes back from where it was kept, and stays
        // intact while the handler (holding it, as the worker's does)
        // stages another operation.
        let mut seen = Vec::new();
        while let Some(d) = r.ep.rdma().unwrap().peek_done() {
            let mut scratch = [0u8; INLINE_AUX];
            let ctx = r.ep.rdma().unwrap().done_context(&r.pool, &d, &mut scratch);
            let ctx = ctx.to_vec();
            let peer = r.ep.qp().peer.clone();
            // SAFETY: the op is done; nothing writes its data buffer.
            let data = d
                .data
                .and_then(|b| unsafe { r.pool.bytes(b) })
                .map(|b| b[..d.len as usize].to_vec())
                .unwrap();
            let want: Vec<u8> = if d.len == 4000 {
                peer[100..4100].to_vec()
            } else {
                (0..12)
                    .flat_map(|i| peer[100_000 + i * 1000..100_000 + i * 1000 + 900].to_vec())
                    .collect()
            };
            assert_eq!(data, want, "the bytes the descriptors named");
            with_replies(&mut r, Some(d.slot), |o| {
                o.rdma_write(&descs(300_000, 1, 10, 3), 0, 10, b"w", |b| b.fill(1))
                    .map(|_| ())
            })
            .unwrap();
            seen.push((d.len, ctx));
        }
        assert_eq!(seen, vec![(4000, small.to_vec()), (10_800, large)]);
        r.ep.post_rdma().unwrap();
        while let Some(wc) = r.ep.qp_mut().next_completion() {
            r.ep.on_completion(Instant::ZERO, &wc, &mut r.alloc)
                .unwrap();
        }
        while let Some(d) = r.ep.rdma().unwrap().peek_done() {
            with_replies(&mut r, Some(d.slot), |_| Ok(())).unwrap();
        }
        assert_eq!(r.ep.rdma().unwrap().active(), 0);
        assert_eq!(free_counts(&r.pool), r.baseline, "every buffer home");
    }

    #[test]
    fn malformed_descriptors_are_refused_as_values_and_cost_nothing() {
        let mut r = rig(16);
        let read = |r: &mut Rig, d: &[u8], off: u64, len: u32| {
            with_replies(r, None, |o| o.rdma_read(d, off, len, b"")).unwrap_err()
        };
        assert!(matches!(
            read(&mut r, &[0; 15], 0, 1),
            RdmaError::Malformed(_)
        ));
        assert!(matches!(
            read(&mut r, &[0; 24], 0, 1),
            RdmaError::Malformed(_)
        ));
        assert_eq!(
            read(&mut r, &descs(0, 1, 0, 1), 0, 1),
            RdmaError::Descriptors(SliceError::ZeroLengthDescriptor { index: 0 })
        );
        assert_eq!(
            read(&mut r, &descs(0, 2, 10, 1), 15, 6),
            RdmaError::Descriptors(SliceError::OutOfRange { end: 21, total: 20 })
        );
        assert_eq!(
            read(&mut r, &descs(0, 1, 10, 1), 0, 0),
            RdmaError::Descriptors(SliceError::ZeroLength)
        );
        assert_eq!(
            read(&mut r, &descs(0, 1, u32::MAX, 1), 0, (1 << 20) + 1),
            RdmaError::TooLarge {
                len: (1 << 20) + 1,
                max: 1 << 20
            }
        );
        // Larger than any pool buffer (64 KiB here).
        assert!(matches!(
            read(&mut r, &descs(0, 1, 1 << 20, 1), 0, 1 << 20),
            RdmaError::TooLarge { .. }
        ));
        r.ep.post_rdma().unwrap();
        assert!(r.ep.qp().chains.is_empty());
        assert_eq!(free_counts(&r.pool), r.baseline);
    }

    #[test]
    fn a_full_table_is_backpressure_not_an_error() {
        let mut r = rig(16);
        for _ in 0..8 {
            assert!(r.ep.rdma().unwrap().has_room());
            with_replies(&mut r, None, |o| {
                o.rdma_read(&descs(0, 1, 10, 1), 0, 10, b"")
            })
            .unwrap();
        }
        // What the worker checks before handing over the next message.
        assert!(!r.ep.rdma().unwrap().has_room());
        let e = with_replies(&mut r, None, |o| {
            o.rdma_read(&descs(0, 1, 10, 1), 0, 10, b"")
        });
        assert_eq!(e, Err(RdmaError::Backpressure(Backpressure::RdmaBusy)));
    }

    #[test]
    fn a_failed_rdma_read_fails_the_connection_and_every_buffer_comes_back() {
        let mut r = rig(16);
        let mut d = descs(0, 3, 1000, 1);
        d[16 + 8..16 + 12].copy_from_slice(&0xdeadu32.to_le_bytes()); // 2nd token bad
        with_replies(&mut r, None, |o| o.rdma_read(&d, 0, 3000, b"")).unwrap();
        with_replies(&mut r, None, |o| {
            o.rdma_read(&descs(0, 1, 10, 1), 0, 10, b"")
        })
        .unwrap();
        r.ep.post_rdma().unwrap();
        assert_eq!(r.ep.outstanding(), 4);
        let mut errors = Vec::new();
        while let Some(wc) = r.ep.qp_mut().next_completion() {
            if let Err(e) = r.ep.on_completion(Instant::ZERO, &wc, &mut r.alloc) {
                errors.push(e);
            }
        }
        // The bad token's request fails; the rest of the chain and the next
        // op are flushed. The first error is the one the connection keeps.
        assert_eq!(
            errors[0],
            EndpointError::Provider(WcStatus::RemoteAccessError)
        );
        assert_eq!(
            r.ep.failure(),
            Some(EndpointError::Provider(WcStatus::RemoteAccessError))
        );
        assert!(r.ep.rdma().unwrap().peek_done().is_none());
        assert_eq!(r.ep.outstanding(), 0);
        r.ep.release_rdma(&mut r.alloc);
        assert_eq!(r.ep.rdma().unwrap().active(), 0);
        assert_eq!(free_counts(&r.pool), r.baseline);
        assert!(
            r.ep.post_rdma().is_err(),
            "nothing is posted after a failure"
        );
    }

    /// Delivers `bytes` as a receive completion in a fresh receive buffer.
    fn deliver(r: &mut Rig, bytes: &[u8]) -> Result<Option<Event>, EndpointError> {
        let id = r.alloc.alloc(ClassId::RECEIVE).unwrap();
        // SAFETY: `id` was just allocated and is exclusively ours.
        unsafe { r.pool.bytes_mut(id) }.unwrap()[..bytes.len()].copy_from_slice(bytes);
        let wc = Completion {
            wr_id: recv_wr_id(id),
            qp: QpId(1),
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: bytes.len() as u32,
            invalidated_rkey: None,
        };
        r.ep.on_completion(Instant::ZERO, &wc, &mut r.alloc)
    }

    /// A Data Transfer fragment of `len` payload bytes, `remaining` to come.
    fn fragment(len: u32, remaining: u32) -> Vec<u8> {
        use smbdirect_protocol::smbd::wire::DataTransferRepr;
        let h = DataTransferRepr {
            credits_requested: 8,
            credits_granted: 8,
            ..DataTransferRepr::with_payload(len, remaining)
        };
        let mut b = vec![0x5au8; h.buffer_len()];
        h.emit_header(&mut b);
        b
    }

    #[test]
    fn no_buffer_for_a_reassembled_message_ends_the_connection_and_disconnects() {
        let mut r = negotiated_rig();
        // A 10,000-byte message needs a 64 KiB buffer once reassembled:
        // take every one.
        let taken: Vec<BufId> = std::iter::from_fn(|| r.alloc.alloc(ClassId(2)).ok()).collect();
        assert_eq!(taken.len(), 8);
        assert!(matches!(deliver(&mut r, &fragment(6000, 4000)), Ok(None)));
        assert!(matches!(
            deliver(&mut r, &fragment(4000, 0)),
            Err(EndpointError::PoolExhausted)
        ));
        // The connection is over, and torn down: the provider flushes every
        // posted receive back, so the worker's close completes (it waited
        // for them forever when the queue pair stayed up).
        assert_eq!(r.ep.failure(), Some(EndpointError::PoolExhausted));
        assert_eq!(r.ep.qp().state(), QpState::Error);
        for id in taken {
            r.alloc.free(id).unwrap();
        }
    }

    /// A rig whose connection negotiated (passive side): the negotiate
    /// response is posted, not completed.
    fn negotiated_rig() -> Rig {
        negotiated_rig_sized(8)
    }

    fn negotiated_rig_sized(receives: u32) -> Rig {
        negotiate(rig_sized(16, receives))
    }

    /// Runs the passive side's negotiation on `r`.
    fn negotiate(mut r: Rig) -> Rig {
        use smbdirect_protocol::smbd::wire::NegotiateRequestRepr;
        assert!(r.ep.post_negotiate_receive(&mut r.alloc));
        let req = NegotiateRequestRepr {
            min_version: 0x0100,
            max_version: 0x0100,
            credits_requested: 8,
            preferred_send_size: 1364,
            max_receive_size: 8192,
            max_fragmented_size: 1 << 20,
        };
        deliver(&mut r, &req.to_bytes()).expect("negotiate request");
        r.ep.flush(Instant::ZERO, &mut r.alloc)
            .expect("negotiate response");
        assert!(r.ep.connection().is_established());
        r
    }

    /// [`negotiated_rig`] with send credits and the negotiate response's
    /// Send completed.
    fn established_rig() -> Rig {
        established_rig_sized(8)
    }

    fn established_rig_sized(receives: u32) -> Rig {
        establish(negotiated_rig_sized(receives))
    }

    /// The peer's first message on negotiated `r`.
    fn establish(mut r: Rig) -> Rig {
        // The peer's first message grants the send credits ([MS-SMBD]
        // 3.1.5.8).
        match deliver(&mut r, &fragment(10, 0)) {
            Ok(Some(Event::Message(d))) => r.ep.release(d, &mut r.alloc),
            other => panic!("expected a message, got {other:?}"),
        }
        while let Some(wc) = r.ep.qp_mut().next_completion() {
            r.ep.on_completion(Instant::ZERO, &wc, &mut r.alloc)
                .unwrap();
        }
        r.ep.qp_mut().sends.clear();
        r
    }

    /// A 3,000-byte upper-layer message in a fresh 64 KiB pool buffer.
    fn queued_message(r: &mut Rig) -> (BufId, Vec<u8>) {
        let msg: Vec<u8> = (0..3000u32).map(|i| (i * 31 + 7) as u8).collect();
        let id = r.alloc.alloc(ClassId(2)).unwrap();
        // SAFETY: `id` was just allocated and is exclusively ours.
        unsafe { r.pool.bytes_mut(id) }.unwrap()[..msg.len()].copy_from_slice(&msg);
        (id, msg)
    }

    #[test]
    fn the_receive_trail_names_the_oldest_posted_receive_until_it_overflows() {
        let mut t = RecvTrail::new(3);
        assert_eq!(t.mask, 3, "rounded up to a power of two");
        assert_eq!(t.next(), None, "nothing posted");
        t.push(0x1000);
        t.push(0); // posted by someone else: address unknown
        t.push(0x3000);
        assert_eq!(t.next(), Some(0x1000));
        t.pop();
        assert_eq!(t.next(), None, "the unknown one is next");
        t.pop();
        assert_eq!(t.next(), Some(0x3000));
        t.push(0x4000);
        t.push(0x5000);
        t.push(0x6000);
        assert_eq!(
            t.next(),
            Some(0x3000),
            "four waiting: the ring is full, not wrapped"
        );
        t.push(0x7000);
        assert_eq!(t.next(), None, "five waiting in four slots: not known");
        t.pop();
        assert_eq!(t.next(), Some(0x4000));
        for _ in 0..10 {
            t.pop();
        }
        assert_eq!(t.next(), None, "all completed; extra pops do not underflow");
        t.push(0x8000);
        assert_eq!(t.next(), Some(0x8000));
    }

    #[test]
    fn the_endpoint_prefetches_a_receive_buffer_it_posted() {
        let mut r = established_rig();
        assert!(r.ep.recv_posted > 1);
        let mr = r.ep.mr;
        let inside = |a: u64| a >= mr.addr && a < mr.addr + mr.len;
        let first = r.ep.recv_trail.next().expect("receives are posted");
        assert!(inside(first), "{first:#x} outside the pool region");
        // One receive completes: the trail moves to the next one posted.
        match deliver(&mut r, &fragment(10, 0)) {
            Ok(Some(Event::Message(d))) => r.ep.release(d, &mut r.alloc),
            other => panic!("expected a message, got {other:?}"),
        }
        let second = r.ep.recv_trail.next().expect("receives are posted");
        assert!(inside(second));
        assert_ne!(first, second);
        assert_eq!(
            r.ep.recv_trail.posted - r.ep.recv_trail.done,
            u64::from(r.ep.recv_posted),
            "the trail counts what the endpoint counts"
        );
        r.ep.prefetch_next_receive();
    }

    #[test]
    fn segments_are_sent_by_gather_and_the_message_buffer_returns_after_the_last() {
        // [MS-SMBD] 3.1.5.1: 3,000 bytes at MaxSendSize 1364 are three
        // segments of 1340, 1340 and 320 bytes behind 24-byte headers; each
        // Send gathers header and payload (two SGEs), and the message buffer
        // goes back to the pool only when the last Send completes.
        let mut r = established_rig();
        let (id, msg) = queued_message(&mut r);
        r.ep.send(id, msg.len() as u32).unwrap();
        let posts = r.ep.qp().chains.len();
        r.ep.flush(Instant::ZERO, &mut r.alloc).unwrap();
        assert_eq!(
            r.ep.qp().chains[posts..],
            [3],
            "the three segments in one post_send (one doorbell)"
        );
        let sends = std::mem::take(&mut r.ep.qp_mut().sends);
        assert_eq!(sends.len(), 3);
        let mut whole = Vec::new();
        for (bytes, nsge) in &sends {
            assert_eq!(*nsge, 2, "header and payload gathered");
            let v = smbdirect_protocol::smbd::wire::DataTransfer::new_checked(&bytes[..]).unwrap();
            assert_eq!(v.data_offset(), 24);
            whole.extend_from_slice(v.payload().unwrap());
        }
        assert_eq!(whole, msg);
        let mut done = 0;
        while let Some(wc) = r.ep.qp_mut().next_completion() {
            assert!(
                r.pool.locate(id).is_some(),
                "freed before the last Send completed"
            );
            r.ep.on_completion(Instant::ZERO, &wc, &mut r.alloc)
                .unwrap();
            done += 1;
        }
        assert_eq!(done, 3);
        assert!(r.pool.locate(id).is_none());
        assert_eq!(r.ep.outstanding(), r.ep.recv_posted as u64);
    }

    #[test]
    fn a_refused_post_of_segments_fails_the_connection_and_every_buffer_comes_home() {
        // The provider refuses the chain of three segments (a provider may
        // have posted a prefix of it: verbs stops at the first bad request).
        // They are kept as posted but unsignaled, and the drain marker at
        // close returns their send buffers and the message's.
        let mut r = established_rig();
        let before = home(&r);
        let (id, msg) = queued_message(&mut r);
        r.ep.send(id, msg.len() as u32).unwrap();
        r.ep.qp_mut().broken = true;
        r.ep.qp_mut().refuse_posts = true;
        assert!(r.ep.flush(Instant::ZERO, &mut r.alloc).is_err());
        assert!(r.ep.failure().is_some());
        assert!(
            r.pool.locate(id).is_some(),
            "freed while a Send may read it"
        );
        r.ep.close(&mut r.alloc);
        while let Some(wc) = r.ep.qp_mut().next_completion() {
            let _ = r.ep.on_completion(Instant::ZERO, &wc, &mut r.alloc);
        }
        r.ep.release_rdma(&mut r.alloc);
        assert_eq!(r.ep.qp().drains, 1, "one drain marker");
        while let Some(wc) = r.ep.qp_mut().next_completion() {
            let _ = r.ep.on_completion(Instant::ZERO, &wc, &mut r.alloc);
        }
        assert!(r.pool.locate(id).is_none());
        assert_eq!(r.ep.outstanding() - u64::from(r.ep.recv_posted), 0);
        assert_eq!(home(&r), before);
    }

    #[test]
    fn a_whole_message_with_header_room_goes_as_one_contiguous_send_with_the_same_bytes() {
        // The same 1,000 bytes, once through the general path (header from
        // a send buffer, payload gathered) and once queued with header room
        // (header written in the 24 bytes before the payload, one SGE):
        // identical messages on the wire, and the in-place one takes no
        // send buffer.
        let mut r = established_rig();
        let (id, msg) = queued_message(&mut r);
        r.ep.send(id, 1000).unwrap();
        r.ep.flush(Instant::ZERO, &mut r.alloc).unwrap();
        let general = std::mem::take(&mut r.ep.qp_mut().sends);
        assert_eq!(general.len(), 1);
        assert_eq!(general[0].1, 2, "general path: header and payload gathered");
        while let Some(wc) = r.ep.qp_mut().next_completion() {
            r.ep.on_completion(Instant::ZERO, &wc, &mut r.alloc)
                .unwrap();
        }
        assert!(r.pool.locate(id).is_none());

        let free_sends = |r: &Rig| r.pool.class_stats(0, ClassId::SEND).unwrap().free;
        let id = r.alloc.alloc(ClassId(2)).unwrap();
        // SAFETY: `id` was just allocated and is exclusively ours.
        let b = unsafe { r.pool.bytes_mut(id) }.unwrap();
        b[..24].fill(0xee); // whatever was there: overwritten by the header
        b[24..1024].copy_from_slice(&msg[..1000]);
        let before = free_sends(&r);
        r.ep.send_with_header_room(id, 24, 1000, None).unwrap();
        r.ep.flush(Instant::ZERO, &mut r.alloc).unwrap();
        let in_place = std::mem::take(&mut r.ep.qp_mut().sends);
        assert_eq!(in_place.len(), 1);
        assert_eq!(in_place[0].1, 1, "one contiguous SGE");
        assert_eq!(free_sends(&r), before, "no send buffer taken");
        // Byte for byte the general path's message except CreditsGranted
        // (the first message granted the receives posted since).
        let (g, p) = (&general[0].0, &in_place[0].0);
        let gv = smbdirect_protocol::smbd::wire::DataTransfer::new_checked(&g[..]).unwrap();
        let pv = smbdirect_protocol::smbd::wire::DataTransfer::new_checked(&p[..]).unwrap();
        assert_eq!(p.len(), g.len());
        assert_eq!(pv.credits_requested(), gv.credits_requested());
        assert_eq!(pv.flags(), gv.flags());
        assert_eq!(pv.remaining_data_length(), 0);
        assert_eq!(pv.data_offset(), 24);
        assert_eq!(&p[20..24], &[0; 4], "padding zeroed");
        assert_eq!(pv.payload().unwrap(), &msg[..1000]);
        assert_eq!(gv.payload().unwrap(), &msg[..1000]);
        // Its completion frees the message buffer itself.
        assert!(r.pool.locate(id).is_some());
        while let Some(wc) = r.ep.qp_mut().next_completion() {
            r.ep.on_completion(Instant::ZERO, &wc, &mut r.alloc)
                .unwrap();
        }
        assert!(r.pool.locate(id).is_none());
        assert_eq!(free_sends(&r), before);
        assert_eq!(r.ep.outstanding(), r.ep.recv_posted as u64);

        // Too long for one segment: the general path, fragments and all.
        let (id, msg) = queued_message(&mut r);
        // SAFETY: as above.
        let b = unsafe { r.pool.bytes_mut(id) }.unwrap();
        b.copy_within(..msg.len(), 24);
        r.ep.send_with_header_room(id, 24, msg.len() as u32, None)
            .unwrap();
        r.ep.flush(Instant::ZERO, &mut r.alloc).unwrap();
        let sends = std::mem::take(&mut r.ep.qp_mut().sends);
        assert_eq!(sends.len(), 3);
        let mut whole = Vec::new();
        for (bytes, nsge) in &sends {
            assert_eq!(*nsge, 2);
            let v = smbdirect_protocol::smbd::wire::DataTransfer::new_checked(&bytes[..]).unwrap();
            whole.extend_from_slice(v.payload().unwrap());
        }
        assert_eq!(whole, msg);
        while let Some(wc) = r.ep.qp_mut().next_completion() {
            r.ep.on_completion(Instant::ZERO, &wc, &mut r.alloc)
                .unwrap();
        }
        assert!(r.pool.locate(id).is_none());
    }

    #[test]
    fn send_now_posts_what_queue_and_flush_would_and_every_buffer_returns() {
        // Twin endpoints in the same state: one sends through `send_now`,
        // the other queues and flushes. The same bytes go on the wire,
        // with the same SGE count, and after the completions every buffer
        // is back on both.
        let mut a = established_rig();
        let mut b = established_rig();
        let free_sends = |r: &Rig| r.pool.class_stats(0, ClassId::SEND).unwrap().free;
        let drain_completions = |r: &mut Rig| {
            while let Some(wc) = r.ep.qp_mut().next_completion() {
                r.ep.on_completion(Instant::ZERO, &wc, &mut r.alloc)
                    .unwrap();
            }
        };
        let (sends_a, sends_b) = (free_sends(&a), free_sends(&b));
        // (header room, offset, len, posted at once): in place behind its
        // room; from the front of a buffer; at an offset without room (a
        // reply from its receive buffer); too long for one segment.
        let cases = [
            (true, 24, 1000, true),
            (false, 0, 1000, true),
            (false, 100, 500, true),
            (true, 24, 2900, false),
        ];
        for (room, offset, len, at_once) in cases {
            let (ia, msg) = queued_message(&mut a);
            let (ib, _) = queued_message(&mut b);
            let posted =
                a.ep.send_now(&mut a.alloc, ia, offset, len, None, room)
                    .unwrap();
            assert_eq!(posted, at_once, "room {room} offset {offset} len {len}");
            if !posted {
                a.ep.flush(Instant::ZERO, &mut a.alloc).unwrap();
            }
            if room {
                b.ep.send_with_header_room(ib, offset, len, None).unwrap();
            } else {
                b.ep.send_at(ib, offset, len, None).unwrap();
            }
            b.ep.flush(Instant::ZERO, &mut b.alloc).unwrap();
            let wa = std::mem::take(&mut a.ep.qp_mut().sends);
            let wb = std::mem::take(&mut b.ep.qp_mut().sends);
            assert_eq!(wa, wb, "room {room} offset {offset} len {len}");
            let mut whole = Vec::new();
            for (bytes, _) in &wa {
                let v =
                    smbdirect_protocol::smbd::wire::DataTransfer::new_checked(&bytes[..]).unwrap();
                whole.extend_from_slice(v.payload().unwrap());
            }
            assert_eq!(whole, &msg[offset as usize..(offset + len) as usize]);
            assert_eq!(a.ep.connection().credits(), b.ep.connection().credits());
            assert_eq!(a.ep.connection().stats(), b.ep.connection().stats());
            drain_completions(&mut a);
            drain_completions(&mut b);
            assert!(a.pool.locate(ia).is_none(), "the message buffer is back");
            assert!(b.pool.locate(ib).is_none());
            assert_eq!((free_sends(&a), free_sends(&b)), (sends_a, sends_b));
            assert_eq!(a.ep.outstanding(), a.ep.recv_posted as u64);
        }
        // Behind a queued message it waits its turn: queued, then sent
        // second by the flush (a fresh rig: credits for both).
        let mut a = established_rig();
        let (first, msg) = queued_message(&mut a);
        let (second, _) = queued_message(&mut a);
        a.ep.send_at(first, 0, 100, None).unwrap();
        assert_eq!(
            a.ep.send_now(&mut a.alloc, second, 200, 100, None, false),
            Ok(false)
        );
        assert!(a.ep.qp_mut().sends.is_empty());
        a.ep.flush(Instant::ZERO, &mut a.alloc).unwrap();
        let sent = std::mem::take(&mut a.ep.qp_mut().sends);
        assert_eq!(sent.len(), 2);
        assert_eq!(&sent[0].0[24..], &msg[..100]);
        assert_eq!(&sent[1].0[24..], &msg[200..300]);
        drain_completions(&mut a);
        assert!(a.pool.locate(first).is_none() && a.pool.locate(second).is_none());
        // A broken queue pair: the post fails, the buffers come back and
        // the next flush reports the failure.
        let mut a = established_rig();
        let sends_a = free_sends(&a);
        let (id, _) = queued_message(&mut a);
        a.ep.qp_mut().broken = true;
        a.ep.qp_mut().refuse_posts = true;
        assert_eq!(
            a.ep.send_now(&mut a.alloc, id, 0, 100, None, false),
            Ok(false)
        );
        assert!(a.pool.locate(id).is_none());
        assert_eq!(free_sends(&a), sends_a);
        assert!(a.ep.flush(Instant::ZERO, &mut a.alloc).is_err());
    }

    /// Sends `n` whole messages at once (`send_now`, in place), taking
    /// every completion after each; returns the message buffers and
    /// whether each Send was signaled. With `grants`, the peer grants
    /// credits every fourth message (else the 8 of the rig's set-up last).
    fn send_whole_messages(r: &mut Rig, n: usize, grants: bool) -> Vec<(BufId, bool)> {
        let mut out = Vec::new();
        for i in 0..n {
            if grants && i % 4 == 0 {
                // The peer grants 8 more send credits.
                match deliver(r, &fragment(10, 0)) {
                    Ok(Some(Event::Message(d))) => r.ep.release(d, &mut r.alloc),
                    other => panic!("expected a message, got {other:?}"),
                }
            }
            let (id, _) = queued_message(r);
            assert_eq!(
                r.ep.send_now(&mut r.alloc, id, 24, 100, None, true),
                Ok(true)
            );
            let &(_, _, signaled, _, _) = r.ep.qp_mut().sq.back().unwrap();
            out.push((id, signaled));
            while let Some(wc) = r.ep.qp_mut().next_completion() {
                r.ep.on_completion(Instant::ZERO, &wc, &mut r.alloc)
                    .unwrap();
            }
        }
        out
    }

    #[test]
    fn one_send_in_eight_is_signaled_and_retires_those_before_it() {
        let mut r = established_rig_sized(512);
        let sent = send_whole_messages(&mut r, 43, true);
        // No pool pressure: exactly every 8th Send asks for a completion.
        let signaled: Vec<usize> = (0..sent.len()).filter(|&i| sent[i].1).collect();
        assert_eq!(signaled, [7, 15, 23, 31, 39]);
        // Each one's completion retired every Send up to it: those buffers
        // are home; the three after the last are still the queue's.
        for (i, (id, _)) in sent.iter().enumerate() {
            assert_eq!(r.pool.locate(*id).is_none(), i <= 39, "message {i}");
        }
        assert_eq!(r.ep.silent_sends(), 3);
        assert_eq!(r.ep.completions_due(), r.ep.outstanding() - 3);
        // Closing drains them: one marker, flushed behind them, retires
        // all three; nothing of the Sends is outstanding after.
        r.ep.close(&mut r.alloc);
        assert_eq!(r.ep.qp_mut().drains, 1);
        while let Some(wc) = r.ep.qp_mut().next_completion() {
            let _ = r.ep.on_completion(Instant::ZERO, &wc, &mut r.alloc);
        }
        assert!(sent.iter().all(|(id, _)| r.pool.locate(*id).is_none()));
        assert_eq!(r.ep.outstanding(), r.ep.recv_posted as u64);
        // A second release posts no second marker.
        r.ep.release_rdma(&mut r.alloc);
        assert_eq!(r.ep.qp_mut().drains, 1);
    }

    #[test]
    fn pool_pressure_makes_every_send_signaled() {
        // Eight receive buffers for a connection whose credits want more:
        // every repost falls short, and every Send is signaled, so no
        // buffer waits on a later Send.
        let mut r = established_rig_sized(8);
        let sent = send_whole_messages(&mut r, 5, false);
        assert!(sent.iter().all(|&(_, signaled)| signaled));
        assert!(sent.iter().all(|(id, _)| r.pool.locate(*id).is_none()));
        assert_eq!(r.ep.silent_sends(), 0);
    }

    #[test]
    fn a_refused_drain_marker_retires_the_silent_sends_at_close() {
        let mut r = established_rig_sized(512);
        r.ep.set_signal_every(4);
        let sent = send_whole_messages(&mut r, 6, true);
        assert_eq!(
            sent.iter().map(|s| s.1).collect::<Vec<_>>(),
            [false, false, false, true, false, false]
        );
        r.ep.qp_mut().refuse_drain = true;
        r.ep.close(&mut r.alloc);
        assert_eq!(r.ep.qp_mut().drains, 0);
        assert!(sent.iter().all(|(id, _)| r.pool.locate(*id).is_none()));
        assert_eq!(r.ep.outstanding(), r.ep.recv_posted as u64);
    }

    #[test]
    fn signaling_every_send_is_one_setting_away() {
        let mut r = established_rig_sized(512);
        r.ep.set_signal_every(1);
        let sent = send_whole_messages(&mut r, 9, true);
        assert!(sent.iter().all(|&(_, signaled)| signaled));
        assert!(sent.iter().all(|(id, _)| r.pool.locate(*id).is_none()));
    }

    #[test]
    fn a_partly_sent_message_outlives_its_segments_in_flight_on_close() {
        // Room for one Send: the first segment goes, the message stays
        // queued. Closing must not free the buffer that Send still reads;
        // its (flushed) completion does.
        let mut r = established_rig();
        r.ep.set_send_depth(1);
        let (id, msg) = queued_message(&mut r);
        r.ep.send(id, msg.len() as u32).unwrap();
        r.ep.flush(Instant::ZERO, &mut r.alloc).unwrap();
        assert_eq!(r.ep.qp().sends.len(), 1);
        r.ep.close(&mut r.alloc);
        assert!(r.pool.locate(id).is_some(), "freed under a Send in flight");
        while let Some(wc) = r.ep.qp_mut().next_completion() {
            let _ = r.ep.on_completion(Instant::ZERO, &wc, &mut r.alloc);
        }
        assert!(r.pool.locate(id).is_none());
    }

    #[test]
    fn zero_copy_chains_gather_pieces_up_to_max_sge_and_split_segments() {
        // Two peer segments of 150 bytes (gap between them), five local
        // pieces of 60 bytes: 300 bytes in all.
        let d = descs(0x10_0000, 2, 150, 7);
        let pieces: Vec<u8> = (0..5u64)
            .flat_map(|i| {
                let p = Piece {
                    sge: Sge {
                        addr: 0x9000 + i * 1000,
                        len: 60,
                        lkey: 3,
                    },
                    pin: i as u32,
                };
                let mut b = [0u8; PIECE_BYTES];
                p.encode(&mut b);
                b
            })
            .collect();
        let mut op = Op {
            state: OpState::Queued,
            kind: RdmaKind::Write,
            len: 300,
            pieces: 5,
            ..Op::FREE
        };
        // Everything at once, two SGEs per work request.
        let mut c = Chain::new();
        assert!(next_chain_pieces(&mut c, &op, &d, &pieces, 16, 2));
        assert_eq!(c.bytes, 300);
        let mut local = Vec::new();
        let mut at = [0u64; 2];
        for k in 0..c.n {
            assert!(c.nsge[k] >= 1 && c.nsge[k] <= 2);
            let len: u64 = c.sges[k][..c.nsge[k]]
                .iter()
                .map(|s| u64::from(s.len))
                .sum();
            // Work requests stay inside one segment, at consecutive
            // peer addresses.
            let seg = ((c.remotes[k].addr - 0x10_0000) / 250) as usize;
            assert_eq!(c.remotes[k].addr, 0x10_0000 + seg as u64 * 250 + at[seg]);
            assert_eq!(c.remotes[k].rkey, 7);
            at[seg] += len;
            for s in &c.sges[k][..c.nsge[k]] {
                assert_eq!(s.lkey, 3);
                local.extend((0..s.len as u64).map(|i| s.addr + i));
            }
        }
        assert_eq!(at, [150, 150]);
        let expect: Vec<u64> = (0..5u64)
            .flat_map(|i| (0..60).map(move |j| 0x9000 + i * 1000 + j))
            .collect();
        assert_eq!(local, expect, "every local byte once, in order");
        // Room for two work requests: the rest comes in the next chain,
        // from where this one stopped (mid-piece and mid-segment).
        assert!(next_chain_pieces(&mut c, &op, &d, &pieces, 2, 2));
        assert_eq!(c.n, 2);
        let first_bytes = c.bytes;
        op.posted = first_bytes;
        assert!(next_chain_pieces(&mut c, &op, &d, &pieces, 16, 2));
        assert_eq!(first_bytes + c.bytes, 300);
        let s0 = c.sges[0][0];
        assert_eq!(
            s0.addr, expect[first_bytes as usize],
            "the next chain starts at the next byte"
        );
        // Pieces shorter than the transfer: refused, not a panic.
        assert!(!next_chain_pieces(
            &mut c,
            &op,
            &d,
            &pieces[..PIECE_BYTES * 2],
            16,
            2
        ));
    }

    /// Counts pins per piece (`pin` is an index).
    #[derive(Default)]
    struct CountingPins(std::sync::Mutex<Vec<u32>>);

    impl Pins for CountingPins {
        fn unpin(&self, piece: &Piece) {
            self.0.lock().unwrap()[piece.pin as usize] += 1;
        }
    }

    #[test]
    fn zero_copy_pins_are_released_once_on_every_path() {
        let mut r = rig(16);
        r.ep.set_max_sge(4);
        let counting = Arc::new(CountingPins(std::sync::Mutex::new(vec![0; 8])));
        let pins: Arc<dyn Pins> = counting.clone();
        let mut src = vec![0u8; 3000];
        for (i, b) in src.iter_mut().enumerate() {
            *b = i as u8;
        }
        // Three pieces of 1000 bytes (pins 0..3) and a zero piece (no pin).
        let piece = |i: usize, pin: u32| Piece {
            sge: Sge {
                addr: src.as_ptr() as u64 + i as u64 * 1000,
                len: 1000,
                lkey: 9,
            },
            pin,
        };
        let pieces = [piece(0, 0), piece(1, 1), piece(2, 2)];
        let unpins = || counting.0.lock().unwrap().clone();
        // Completed and handed to the upper layer: released at its commit.
        let t = with_replies(&mut r, None, |o| {
            o.rdma_write_pieces(&descs(0, 2, 1500, 1), 0, 3000, b"ctx", &pieces, &pins)
        })
        .unwrap();
        r.ep.post_rdma().unwrap();
        while let Some(wc) = r.ep.qp_mut().next_completion() {
            r.ep.on_completion(Instant::ZERO, &wc, &mut r.alloc)
                .unwrap();
        }
        assert_eq!(&r.ep.qp().peer[..1500], &src[..1500]);
        assert_eq!(&r.ep.qp().peer[1600..3100], &src[1500..]);
        let done = r.ep.rdma().unwrap().peek_done().unwrap();
        assert_eq!((done.ticket, done.data, done.len), (t, None, 3000));
        assert_eq!(
            unpins(),
            [0; 8],
            "held while the upper layer has not seen it"
        );
        with_replies(&mut r, Some(done.slot), |_| Ok(())).unwrap();
        assert_eq!(unpins(), [1, 1, 1, 0, 0, 0, 0, 0]);
        // Refused (descriptors too short): released at once.
        let e = with_replies(&mut r, None, |o| {
            o.rdma_write_pieces(&descs(0, 1, 100, 1), 0, 3000, b"", &pieces, &pins)
        });
        assert!(e.is_err());
        assert_eq!(unpins(), [2, 2, 2, 0, 0, 0, 0, 0]);
        // Undone by the handler's backpressure: released.
        let _ = with_replies(&mut r, None, |o| {
            o.rdma_read_pieces(&descs(0, 1, 3000, 1), 0, 3000, b"", &pieces, &pins)?;
            Err::<Ticket, _>(RdmaError::Backpressure(Backpressure::SendQueueFull))
        });
        assert_eq!(unpins(), [3, 3, 3, 0, 0, 0, 0, 0]);
        // Failed on the wire: released once the flushed chain is back.
        let mut bad = descs(0, 2, 1500, 1);
        bad[16 + 8..16 + 12].copy_from_slice(&0xdeadu32.to_le_bytes());
        with_replies(&mut r, None, |o| {
            o.rdma_write_pieces(&bad, 0, 3000, b"", &pieces, &pins)
        })
        .unwrap();
        r.ep.post_rdma().unwrap();
        while let Some(wc) = r.ep.qp_mut().next_completion() {
            let _ = r.ep.on_completion(Instant::ZERO, &wc, &mut r.alloc);
        }
        assert_eq!(r.ep.outstanding(), 0);
        r.ep.release_rdma(&mut r.alloc);
        assert_eq!(unpins(), [4, 4, 4, 0, 0, 0, 0, 0]);
        assert_eq!(free_counts(&r.pool), r.baseline, "every aux buffer home");
    }

    #[test]
    fn chained_replies_are_signaled_one_in_eight_and_drained_on_close() {
        let mut r = established_rig_sized(512);
        let src = vec![0x42u8; 3000];
        let mut signaled = Vec::new();
        for k in 0..10 {
            if k % 4 == 0 {
                match deliver(&mut r, &fragment(10, 0)) {
                    Ok(Some(Event::Message(d))) => r.ep.release(d, &mut r.alloc),
                    other => panic!("expected a message, got {other:?}"),
                }
            }
            with_replies(&mut r, None, |o| {
                let t = o.rdma_write(&descs(0, 2, 1500, 1), 0, 3000, b"", |b| {
                    b.copy_from_slice(&src)
                })?;
                o.reply_after_write(t, 5, None, |b| b.copy_from_slice(b"hello"))?;
                Ok(t)
            })
            .unwrap();
            r.ep.flush(Instant::ZERO, &mut r.alloc).unwrap();
            let &(_, _, sig, _, op) = r.ep.qp().sq.back().unwrap();
            assert_eq!(op, WcOpcode::Send, "reply {k} chained");
            signaled.push(sig);
            while let Some(wc) = r.ep.qp_mut().next_completion() {
                r.ep.on_completion(Instant::ZERO, &wc, &mut r.alloc)
                    .unwrap();
            }
            // The Write's completion finished the operation, whatever the
            // reply's signaling.
            assert_eq!(r.ep.rdma().unwrap().active(), 0, "reply {k}");
        }
        let expect: Vec<bool> = (0..10).map(|k| k == 7).collect();
        assert_eq!(signaled, expect);
        assert_eq!(r.ep.silent_sends(), 2);
        let free_sends = |r: &Rig| r.pool.class_stats(0, ClassId::SEND).unwrap().free;
        let held = free_sends(&r);
        r.ep.close(&mut r.alloc);
        while let Some(wc) = r.ep.qp_mut().next_completion() {
            let _ = r.ep.on_completion(Instant::ZERO, &wc, &mut r.alloc);
        }
        // Each silent reply held its buffer (its header went in place).
        assert_eq!(free_sends(&r), held + 2, "the two silent replies' buffers");
        assert_eq!(r.ep.outstanding(), r.ep.recv_posted as u64);
    }

    #[test]
    fn a_reply_attached_to_a_write_is_posted_right_behind_it_and_needs_no_callback() {
        let mut r = established_rig();
        let before = free_counts(&r.pool);
        let src: Vec<u8> = (0..3000u32).map(|i| (i * 13 + 1) as u8).collect();
        let t = with_replies(&mut r, None, |o| {
            let t = o.rdma_write(&descs(0, 2, 1500, 1), 0, 3000, b"", |b| {
                b.copy_from_slice(&src)
            })?;
            o.reply_after_write(t, 5, Some(0x77), |b| b.copy_from_slice(b"hello"))?;
            Ok(t)
        })
        .unwrap();
        // Nothing reaches the connection before the Write is posted.
        assert!(!r.ep.connection().transmit_pending());
        let sent_before = r.ep.connection().stats().messages_sent;
        let posts_before = r.ep.qp().chains.len();
        r.ep.flush(Instant::ZERO, &mut r.alloc).unwrap();
        let order: Vec<WcOpcode> = r.ep.qp().sq.iter().map(|e| e.4).collect();
        assert_eq!(
            order,
            [WcOpcode::RdmaWrite, WcOpcode::RdmaWrite, WcOpcode::Send],
            "the reply's Send follows every request of its Write"
        );
        assert_eq!(
            r.ep.qp().chains[posts_before..],
            [3],
            "one post_send (one doorbell) for the Write and its reply"
        );
        assert_eq!(r.ep.rdma().unwrap().stats().replies_chained, 1);
        assert_eq!(r.ep.connection().stats().messages_sent, sent_before + 1);
        assert!(!r.ep.connection().transmit_pending());
        let (sent, nsge) = r.ep.qp().sends.last().unwrap().clone();
        assert_eq!(
            nsge, 1,
            "header in the room before the reply: one contiguous Send"
        );
        // [MS-SMBD] 2.2.3: the 24-byte Data Transfer header, then the reply.
        assert_eq!(sent.len(), 24 + 5);
        let field = |at: usize| u32::from_le_bytes(sent[at..at + 4].try_into().unwrap());
        assert_eq!((field(8), field(12), field(16)), (0, 24, 5));
        assert!(sent.ends_with(b"hello"), "{sent:?}");
        assert_eq!(&r.ep.qp().peer[..1500], &src[..1500]);
        assert_eq!(&r.ep.qp().peer[1600..3100], &src[1500..]);
        while let Some(wc) = r.ep.qp_mut().next_completion() {
            r.ep.on_completion(Instant::ZERO, &wc, &mut r.alloc)
                .unwrap();
        }
        // Finished without the upper layer: nothing waits for it.
        assert!(r.ep.rdma().unwrap().peek_done().is_none());
        assert_eq!(r.ep.rdma().unwrap().active(), 0);
        assert_eq!(r.ep.rdma().unwrap().stats().ops_completed, 1);
        assert_eq!(
            free_counts(&r.pool),
            before,
            "data, aux and reply buffers home"
        );
        let _ = t;
    }

    #[test]
    fn an_attached_reply_without_header_room_rides_behind_its_write_with_a_header_buffer() {
        // A reply in a buffer class too small for the header room before
        // it (a 64-byte class, a 50-byte reply) still rides with its
        // Write's chain: header from a send buffer, reply gathered behind
        // it, the same bytes on the wire as in place.
        let tiny = SizeClass::new("tiny", 64).per_slice(8);
        let mut r = establish(negotiate(rig_with_class(16, 8, Some(tiny))));
        let before = free_counts(&r.pool);
        let reply: Vec<u8> = (0..50u8).collect();
        with_replies(&mut r, None, |o| {
            let t = o.rdma_write(&descs(0, 1, 100, 1), 0, 100, b"", |b| b.fill(3))?;
            o.reply_after_write(t, reply.len(), Some(0x55), |b| b.copy_from_slice(&reply))?;
            Ok(t)
        })
        .unwrap();
        let posts_before = r.ep.qp().chains.len();
        r.ep.flush(Instant::ZERO, &mut r.alloc).unwrap();
        assert_eq!(r.ep.qp().chains[posts_before..], [2], "one doorbell");
        assert_eq!(r.ep.rdma().unwrap().stats().replies_chained, 1);
        let (sent, nsge) = r.ep.qp().sends.last().unwrap().clone();
        assert_eq!(nsge, 2, "header from a send buffer, reply gathered");
        assert_eq!(sent.len(), 24 + reply.len());
        let field = |at: usize| u32::from_le_bytes(sent[at..at + 4].try_into().unwrap());
        assert_eq!((field(8), field(12), field(16)), (0, 24, 50));
        assert_eq!(&sent[24..], &reply[..]);
        while let Some(wc) = r.ep.qp_mut().next_completion() {
            r.ep.on_completion(Instant::ZERO, &wc, &mut r.alloc)
                .unwrap();
        }
        // The Send is signaled one time in 8: close drains a silent one.
        r.ep.close(&mut r.alloc);
        while let Some(wc) = r.ep.qp_mut().next_completion() {
            let _ = r.ep.on_completion(Instant::ZERO, &wc, &mut r.alloc);
        }
        assert_eq!(r.ep.rdma().unwrap().active(), 0);
        let after = free_counts(&r.pool);
        assert_eq!(after[1..], before[1..], "send, rdma and tiny buffers home");
    }

    #[test]
    fn an_attached_reply_behind_a_queued_message_waits_its_turn() {
        // A message queued before the Write is posted goes first: the reply
        // cannot ride with the Write's chain ([MS-SMBD] 3.1.5.1: messages
        // leave in order), so it is queued behind it and the flush posts
        // both, Write first.
        let mut r = established_rig();
        let before = home(&r);
        let (id, msg) = queued_message(&mut r);
        r.ep.send(id, 100).unwrap();
        with_replies(&mut r, None, |o| {
            let t = o.rdma_write(&descs(0, 1, 100, 1), 0, 100, b"", |b| b.fill(7))?;
            o.reply_after_write(t, 5, None, |b| b.copy_from_slice(b"after"))
        })
        .unwrap();
        let posts_before = r.ep.qp().chains.len();
        r.ep.flush(Instant::ZERO, &mut r.alloc).unwrap();
        assert_eq!(r.ep.rdma().unwrap().stats().replies_chained, 0);
        assert_eq!(
            r.ep.qp().chains[posts_before..],
            [1, 2],
            "the Write, then the message and the reply in one post"
        );
        let order: Vec<WcOpcode> = r.ep.qp().sq.iter().map(|e| e.4).collect();
        assert_eq!(order, [WcOpcode::RdmaWrite, WcOpcode::Send, WcOpcode::Send]);
        let sends = &r.ep.qp().sends;
        assert!(sends[0].0.ends_with(&msg[..100]));
        assert!(sends[1].0.ends_with(b"after"));
        while let Some(wc) = r.ep.qp_mut().next_completion() {
            r.ep.on_completion(Instant::ZERO, &wc, &mut r.alloc)
                .unwrap();
        }
        assert_eq!(home(&r), before);
    }

    #[test]
    fn chained_replies_count_against_the_send_depth() {
        // Send depth 3: the first READ's Write and reply take two slots,
        // leaving one: the second Write goes alone and its reply waits for
        // a completion (never four work requests on a queue of three).
        let mut r = established_rig();
        r.ep.set_send_depth(3);
        let before = home(&r);
        for (k, word) in [b"first", b"again"].iter().enumerate() {
            with_replies(&mut r, None, |o| {
                let t = o.rdma_write(&descs(k as u64 * 200, 1, 100, 1), 0, 100, b"", |b| {
                    b.fill(k as u8)
                })?;
                o.reply_after_write(t, 5, None, |b| b.copy_from_slice(*word))
            })
            .unwrap();
        }
        r.ep.flush(Instant::ZERO, &mut r.alloc).unwrap();
        assert_eq!(r.ep.qp().sq.len(), 3, "the send depth, and no more");
        assert_eq!(r.ep.rdma().unwrap().stats().replies_chained, 1);
        assert!(
            r.ep.connection().transmit_pending(),
            "the second reply waits"
        );
        while !r.ep.qp().sq.is_empty() || r.ep.connection().transmit_pending() {
            while let Some(wc) = r.ep.qp_mut().next_completion() {
                r.ep.on_completion(Instant::ZERO, &wc, &mut r.alloc)
                    .unwrap();
            }
            r.ep.flush(Instant::ZERO, &mut r.alloc).unwrap();
            assert!(r.ep.qp().sq.len() <= 3);
        }
        let sends = &r.ep.qp().sends;
        assert!(sends[sends.len() - 2].0.ends_with(b"first"));
        assert!(sends[sends.len() - 1].0.ends_with(b"again"));
        assert_eq!(home(&r), before);
    }

    /// Free buffers per class, receives posted counted as home (the
    /// flushes top the receives up).
    fn home(r: &Rig) -> Vec<u32> {
        let mut c = free_counts(&r.pool);
        c[0] += u32::from(r.ep.recv_posted);
        c
    }

    #[test]
    fn a_refused_post_of_a_write_and_its_reply_fails_the_connection_and_frees_both() {
        // The reply's header is committed before the post: a post the
        // provider refuses cannot be retried without it, so the connection
        // fails (as a refused `send_now` does), and every buffer (the send
        // buffer at once, the op's with the teardown) comes home.
        let mut r = established_rig();
        let before = home(&r);
        with_replies(&mut r, None, |o| {
            let t = o.rdma_write(&descs(0, 1, 100, 1), 0, 100, b"", |_| {})?;
            o.reply_after_write(t, 8, None, |b| b.fill(1))
        })
        .unwrap();
        r.ep.qp_mut().broken = true;
        r.ep.qp_mut().refuse_posts = true;
        assert!(r.ep.flush(Instant::ZERO, &mut r.alloc).is_err());
        assert!(r.ep.failure().is_some());
        assert_eq!(r.ep.rdma().unwrap().stats().replies_chained, 0);
        r.ep.close(&mut r.alloc);
        while let Some(wc) = r.ep.qp_mut().next_completion() {
            let _ = r.ep.on_completion(Instant::ZERO, &wc, &mut r.alloc);
        }
        r.ep.release_rdma(&mut r.alloc);
        assert_eq!(r.ep.rdma().unwrap().active(), 0);
        assert_eq!(r.ep.outstanding() - u64::from(r.ep.recv_posted), 0);
        assert_eq!(home(&r), before);
    }

    #[test]
    fn an_attached_reply_is_undone_with_its_write_and_never_outlives_a_failed_one() {
        let mut r = established_rig();
        let before = free_counts(&r.pool);
        // Backpressure after attaching: Write and reply undone.
        let e = with_replies(&mut r, None, |o| {
            let t = o.rdma_write(&descs(0, 1, 100, 1), 0, 100, b"", |_| {})?;
            o.reply_after_write(t, 8, None, |_| {})?;
            Err::<(), _>(RdmaError::Backpressure(Backpressure::SendQueueFull))
        });
        assert!(e.is_err());
        assert_eq!(free_counts(&r.pool), before);
        // Withdrawn by the handler itself.
        with_replies(&mut r, None, |o| {
            let t = o.rdma_write(&descs(0, 1, 100, 1), 0, 100, b"", |_| {})?;
            assert!(o.cancel_rdma(t));
            assert!(!o.cancel_rdma(t), "once");
            // Only a Write staged by this handler takes a reply.
            assert_eq!(
                o.reply_after_write(t, 8, None, |_| {}),
                Err(RdmaError::NotAvailable)
            );
            Ok(())
        })
        .unwrap();
        assert_eq!(r.ep.rdma().unwrap().active(), 0);
        assert_eq!(free_counts(&r.pool), before);
        // A Read takes none.
        let e = with_replies(&mut r, None, |o| {
            let t = o.rdma_read(&descs(0, 1, 100, 1), 0, 100, b"")?;
            o.reply_after_write(t, 8, None, |_| {})
        });
        assert_eq!(e, Err(RdmaError::NotAvailable));
        assert_eq!(free_counts(&r.pool), before);
        // A Write refused by the peer: its reply's Send never succeeds
        // (posted behind it on a broken queue pair) and every buffer
        // comes home once the connection is torn down.
        let mut bad = descs(0, 1, 100, 1);
        bad[8..12].copy_from_slice(&0xdeadu32.to_le_bytes());
        with_replies(&mut r, None, |o| {
            let t = o.rdma_write(&bad, 0, 100, b"", |_| {})?;
            o.reply_after_write(t, 8, None, |b| b.fill(1))
        })
        .unwrap();
        let _ = r.ep.flush(Instant::ZERO, &mut r.alloc);
        let mut send_ok = false;
        while let Some(wc) = r.ep.qp_mut().next_completion() {
            send_ok |= wc.opcode == WcOpcode::Send && wc.status == WcStatus::Success;
            let _ = r.ep.on_completion(Instant::ZERO, &wc, &mut r.alloc);
        }
        assert!(!send_ok, "no reply behind a failed Write");
        assert!(r.ep.failure().is_some());
        r.ep.close(&mut r.alloc);
        while let Some(wc) = r.ep.qp_mut().next_completion() {
            let _ = r.ep.on_completion(Instant::ZERO, &wc, &mut r.alloc);
        }
        r.ep.release_rdma(&mut r.alloc);
        assert_eq!(r.ep.outstanding() - u64::from(r.ep.recv_posted), 0);
        assert_eq!(
            r.ep.rdma().unwrap().active(),
            0,
            "the reply went with its op"
        );
    }
}
