//! The RDMA lower layer SMB Direct needs ([MS-SMBD] 2.1, 3.1.4.3–3.1.4.6,
//! Appendix A), as one interface with two implementations:
//!
//! - [`soft`]: the embedded software provider (default where no RDMA device
//!   exists): poll-mode, zero-copy, across threads and processes of one
//!   host, and *stricter* than hardware (RNR is fatal, every remote access is
//!   checked against its grant, revoked grants never work again);
//! - [`verbs`]: real RDMA through rdma-core's libibverbs and librdmacm.
//!
//! Dispatch is static: workers are generic over [`Provider`], so the hot
//! path (post, poll) is monomorphised per provider with no vtable.
//!
//! Memory exposure model (RFC 5042): pools are registered once, for *local*
//! access only. A node never exposes a whole pool. Remote access is granted
//! per I/O with [`QueuePair::grant`] over the exact byte range and direction
//! (a type-2 memory window bound to that queue pair on verbs), and revoked by
//! the peer's Send with Invalidate or by [`QueuePair::revoke`].
//!
//! Connection loss surfaces the way verbs surfaces it: the queue pair enters
//! the error state and every posted work request completes with
//! [`WcStatus::Flushed`] (plus the completion of whatever failed).

use std::net::SocketAddr;
use std::time::Duration;

pub mod conformance;
pub mod soft;
pub mod verbs;

/// Identifies a queue pair within its provider (its QP number on verbs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QpId(pub u32);

/// A memory region registered for local access (send/receive buffers, RDMA
/// read/write local side). `lkey` goes in every [`Sge`] that points into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryRegion {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Local key.
    pub lkey: u32,
}

impl MemoryRegion {
    /// An SGE for `len` bytes at `offset` into this region.
    pub fn sge(&self, offset: u64, len: u32) -> Sge {
        Sge {
            addr: self.addr + offset,
            len,
            lkey: self.lkey,
        }
    }
}

/// Scatter/gather element: registered local memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    /// Address.
    pub addr: u64,
    /// Length.
    pub len: u32,
    /// Local key of the region containing it.
    pub lkey: u32,
}

/// A peer buffer named by an [MS-SMBD] Buffer Descriptor V1 (2.2.3.1):
/// `addr` is its Offset field, `rkey` its Token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteBuf {
    /// Remote address (the descriptor's Offset).
    pub addr: u64,
    /// Remote key (the descriptor's Token).
    pub rkey: u32,
}

/// What a grant lets the peer do with our memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The peer may RDMA Read it (we are writing data to the server).
    RemoteRead,
    /// The peer may RDMA Write it (we are reading data from the server).
    RemoteWrite,
}

/// A per-I/O remote access grant: what goes into a Buffer Descriptor V1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// Offset field: the address the peer uses.
    pub addr: u64,
    /// Token field: the rkey of the bound memory window.
    pub rkey: u32,
    /// Length field.
    pub len: u32,
}

/// One receive work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvWr {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Where the message lands.
    pub sge: Sge,
}

/// The operation of a send-queue work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp<'a> {
    /// Send the gathered bytes; with `invalidate`, Send with Invalidate of
    /// that peer rkey ([MS-SMBD] 3.1.5.1).
    Send {
        /// Gather list (header, payload).
        sges: &'a [Sge],
        /// Remote rkey to invalidate on delivery.
        invalidate: Option<u32>,
    },
    /// RDMA Write the gathered bytes to the peer buffer ([MS-SMBD] 3.1.4.5).
    RdmaWrite {
        /// Local source.
        sges: &'a [Sge],
        /// Peer destination.
        remote: RemoteBuf,
    },
    /// RDMA Read the peer buffer into the scattered local memory
    /// ([MS-SMBD] 3.1.4.6).
    RdmaRead {
        /// Local destination.
        sges: &'a [Sge],
        /// Peer source.
        remote: RemoteBuf,
    },
}

/// One send-queue work request; a slice of them is posted as a chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWr<'a> {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub op: SendOp<'a>,
    /// Generate a completion on success (errors always complete).
    /// Selective signaling: unsignaled work requests are retired by the next
    /// signaled one on the same queue pair.
    pub signaled: bool,
}

/// Completion opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcOpcode {
    /// A Send (with or without invalidate) finished.
    Send,
    /// A message arrived in a posted receive.
    Recv,
    /// An RDMA Write finished.
    RdmaWrite,
    /// An RDMA Read finished.
    RdmaRead,
    /// A grant (memory window bind) finished.
    Bind,
    /// A revoke (local invalidate) finished.
    Revoke,
}

/// Completion status (the verbs statuses SMB Direct cares about).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcStatus {
    /// Success.
    Success,
    /// The peer had no receive posted (receiver not ready): fatal to the
    /// connection, as RNR retry exhaustion is on hardware.
    RnrRetryExceeded,
    /// The message was longer than the posted receive buffer.
    LocalLengthError,
    /// A local SGE was outside registered memory or used a wrong lkey.
    LocalProtectionError,
    /// The peer refused our RDMA access (bad token, wrong QP, out of range,
    /// wrong direction, revoked).
    RemoteAccessError,
    /// We refused the peer's RDMA access (reported on the victim's side).
    RemoteAccessViolation,
    /// The queue pair is in error or disconnected; the request was flushed.
    Flushed,
    /// Any other provider error (raw code).
    Other(u32),
}

/// One work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The work request's identifier.
    pub wr_id: u64,
    /// The queue pair it belongs to.
    pub qp: QpId,
    /// Outcome.
    pub status: WcStatus,
    /// What completed.
    pub opcode: WcOpcode,
    /// Bytes received (Recv) or transferred.
    pub byte_len: u32,
    /// On Recv: the local rkey the sender invalidated (IBV_WC_WITH_INV).
    pub invalidated_rkey: Option<u32>,
}

impl Completion {
    /// A placeholder for output arrays.
    pub const EMPTY: Completion = Completion {
        wr_id: 0,
        qp: QpId(0),
        status: WcStatus::Success,
        opcode: WcOpcode::Send,
        byte_len: 0,
        invalidated_rkey: None,
    };
}

/// Sizes of a queue pair ([MS-SMBD] credits and the upper layer's queue
/// depth decide them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Send queue depth (sends + RDMA ops + binds + invalidates in flight).
    pub max_send_wr: u32,
    /// Receive queue depth (ReceiveCreditMax + 1).
    pub max_recv_wr: u32,
    /// Gather/scatter entries per work request.
    pub max_sge: u32,
    /// Incoming RDMA Read depth we offer (responder resources).
    pub ird: u32,
    /// Outgoing RDMA Read depth we want (initiator depth).
    pub ord: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 512,
            max_recv_wr: 256,
            max_sge: 4,
            ird: 16,
            ord: 16,
        }
    }
}

/// State of a queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpState {
    /// Connected and usable.
    Connected,
    /// In error (a fatal completion or the peer disconnected); outstanding
    /// requests are flushed.
    Error,
    /// Disconnected locally.
    Disconnected,
}

/// Why a post, registration or connection failed.
#[derive(Debug)]
pub enum ProviderError {
    /// The queue pair is not connected.
    NotConnected,
    /// A work queue is full (more outstanding requests than its depth).
    QueueFull,
    /// A grant could not be created (no window, registration failed).
    GrantFailed(String),
    /// Connection setup failed or was rejected.
    Connect(String),
    /// The operation is not supported by this provider or device.
    Unsupported(&'static str),
    /// An operating-system or verbs error.
    Io(std::io::Error),
    /// Anything else, described.
    Other(String),
}

impl core::fmt::Display for ProviderError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ProviderError::NotConnected => f.write_str("queue pair not connected"),
            ProviderError::QueueFull => f.write_str("work queue full"),
            ProviderError::GrantFailed(s) => write!(f, "remote access grant failed: {s}"),
            ProviderError::Connect(s) => write!(f, "connect failed: {s}"),
            ProviderError::Unsupported(s) => write!(f, "not supported: {s}"),
            ProviderError::Io(e) => write!(f, "{e}"),
            ProviderError::Other(s) => f.write_str(s),
        }
    }
}

impl std::error::Error for ProviderError {}

impl From<std::io::Error> for ProviderError {
    fn from(e: std::io::Error) -> Self {
        ProviderError::Io(e)
    }
}

/// A completion queue, polled by its owning worker only.
pub trait CompletionQueue: Send {
    /// A cheap handle other threads use to create queue pairs on this CQ
    /// (the control plane creates a connection's QP on the chosen worker's
    /// CQ, then hands the QP to the worker over a ring).
    type Handle: Clone + Send + Sync;

    /// The handle.
    fn handle(&self) -> Self::Handle;

    /// Busy-poll: fills `out` with up to `out.len()` completions and returns
    /// how many. Never blocks, allocates or makes a syscall.
    fn poll(&mut self, out: &mut [Completion]) -> usize;

    /// Idle sleep: asks for a wake-up at the next completion and returns
    /// the descriptor that becomes readable then, or None when the provider
    /// cannot wake a sleeper (the default; the worker naps instead). A
    /// completion that arrived before the request raises no wake-up: poll
    /// once more after arming before sleeping. Arming an armed queue is
    /// harmless.
    fn arm(&mut self) -> Option<std::os::fd::RawFd> {
        None
    }

    /// Consumes the wake-ups raised since [`CompletionQueue::arm`] (after
    /// the descriptor became readable or the sleep timed out), so the
    /// descriptor is quiet until the next arm; never blocks.
    fn disarm(&mut self) {}
}

/// A reliable-connected queue pair.
pub trait QueuePair: Send {
    /// Its identifier (in completions).
    fn id(&self) -> QpId;

    /// Current state.
    fn state(&self) -> QpState;

    /// Negotiated (IRD, ORD) of the connection ([MS-SMBD] Appendix A).
    fn ird_ord(&self) -> (u32, u32);

    /// Posts receives (chained).
    fn post_recv(&mut self, wrs: &[RecvWr]) -> Result<(), ProviderError>;

    /// Posts send-queue work requests (chained, in order). RDMA Write data
    /// is visible at the peer before a later Send on this queue pair
    /// completes there ([MS-SMBD] 1.5).
    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<(), ProviderError>;

    /// Whether a reply sent straight from the receive buffer of the message
    /// it answers (`Replies::reply_in_place`) should carry its SMB Direct
    /// header in that buffer too, over the 24 bytes of the request's own
    /// header before the payload: one contiguous Send and no send buffer,
    /// instead of the header in a send buffer and the payload gathered
    /// (two SGEs). Worth it where the device, not another core, wrote the
    /// receive buffer (a NIC's DMA; Soft-RoCE's kernel copy): the line is
    /// this core's to write for nothing. The soft provider's receive
    /// buffers are written by the peer's core, and until its copy wrote
    /// whole lines and demoted the first one, taking the header's line
    /// back cost about what the send buffer saved (docs/bench-results.md,
    /// "SMB Direct send path"); now it answers true as well. The default
    /// is false. On the wire nothing differs.
    fn reply_header_in_receive_buffer(&self) -> bool {
        false
    }

    /// Grants the peer `access` to exactly the bytes of `sge`, through this
    /// queue pair only, until revoked. Completes with [`WcOpcode::Bind`] if
    /// `signaled`.
    fn grant(
        &mut self,
        wr_id: u64,
        sge: Sge,
        access: Access,
        signaled: bool,
    ) -> Result<Grant, ProviderError>;

    /// Revokes a grant (local invalidate). Completes with
    /// [`WcOpcode::Revoke`] if `signaled`. Revoking a grant the peer already
    /// invalidated with Send with Invalidate is not an error.
    fn revoke(&mut self, wr_id: u64, rkey: u32, signaled: bool) -> Result<(), ProviderError>;

    /// Disconnects; outstanding requests are flushed on both sides.
    fn disconnect(&mut self);

    /// Posts a drain marker, once the queue pair is out of service (after
    /// [`QueuePair::disconnect`], or broken by a failed request): a
    /// signaled request with no data that completes (normally with
    /// [`WcStatus::Flushed`], opcode [`WcOpcode::Send`], `wr_id`) after
    /// every send-queue request posted before it. A caller that signals
    /// selectively learns from it that the unsignaled requests at the
    /// queue's tail, which succeeded silently and will never complete on
    /// their own, are done with their buffers (the way the kernel's
    /// `ib_drain_sq` posts a marker after moving the queue pair to the
    /// error state). Refused ([`ProviderError::Other`]) while the queue
    /// pair is connected, where the marker would reach the peer as an empty
    /// message, and with [`ProviderError::QueueFull`] while the queue has
    /// no room.
    fn drain_send_queue(&mut self, wr_id: u64) -> Result<(), ProviderError>;
}

/// A connection request at a listener.
pub trait ConnRequest<P: Provider + ?Sized>: Send {
    /// The private data the peer sent (the IRD/ORD header on iWARP).
    fn private_data(&self) -> &[u8];
    /// Peer address.
    fn peer_addr(&self) -> SocketAddr;
    /// Accepts on `cq` (a worker's), replying with `private_data`.
    fn accept(
        self,
        cq: &<P::Cq as CompletionQueue>::Handle,
        caps: QpCaps,
        private_data: &[u8],
    ) -> Result<P::Qp, ProviderError>;
    /// Rejects.
    fn reject(self);

    /// Accepts like [`ConnRequest::accept`], but posts `recvs` on the new
    /// queue pair *before* the peer learns that the connection is up, so the
    /// peer's first message (the Negotiate Request) always finds a posted
    /// receive ([MS-SMBD] 3.1.7.2; a strict provider treats a send with no
    /// posted receive as fatal). The default accepts, then posts: correct only
    /// for providers whose peers retry on RNR; the soft and verbs providers
    /// override it.
    fn accept_with_receives(
        self,
        cq: &<P::Cq as CompletionQueue>::Handle,
        caps: QpCaps,
        private_data: &[u8],
        recvs: &[RecvWr],
    ) -> Result<P::Qp, ProviderError>
    where
        Self: Sized,
    {
        let mut qp = self.accept(cq, caps, private_data)?;
        qp.post_recv(recvs)?;
        Ok(qp)
    }
}

/// A listening endpoint; serviced by the control plane thread.
pub trait Listener<P: Provider + ?Sized>: Send {
    /// Waits up to `timeout` for a connection request.
    fn accept_request(&mut self, timeout: Duration) -> Result<Option<P::Request>, ProviderError>;
    /// Bound address.
    fn local_addr(&self) -> SocketAddr;
    /// A descriptor that polls readable (`POLLIN`) while a connection
    /// request (or another event [`accept_request`](Self::accept_request)
    /// consumes) is waiting, so the caller can sleep in `poll(2)` with its
    /// other descriptors; `None` (the default): poll `accept_request`
    /// with a timeout instead.
    fn poll_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
}

/// An RDMA provider (device + protection domain).
pub trait Provider: Send + Sync + 'static {
    /// Its completion queues.
    type Cq: CompletionQueue;
    /// Its queue pairs.
    type Qp: QueuePair;
    /// Its connection requests.
    type Request: ConnRequest<Self>;
    /// Its listeners.
    type Listener: Listener<Self>;

    /// "soft" or "verbs".
    fn name(&self) -> &'static str;

    /// Registers `len` bytes at `addr` for local access (and memory-window
    /// binding, so per-I/O grants can be carved out of it). `shared` names
    /// the file descriptor (and offset in it) backing the mapping, when it is
    /// a shareable memfd/hugetlbfs mapping: the soft provider needs it to let
    /// a peer *process* reach granted bytes; verbs ignores it.
    ///
    /// # Safety
    /// The memory must stay mapped and unmoved until the registration is
    /// given back ([`Provider::deregister`]) or the provider is dropped.
    unsafe fn register(
        &self,
        addr: *mut u8,
        len: usize,
        shared: Option<(std::os::fd::RawFd, u64)>,
    ) -> Result<MemoryRegion, ProviderError>;

    /// Gives back a registration made by [`Provider::register`] on this
    /// provider (`ibv_dereg_mr`): its lkey names nothing afterwards, so a
    /// post or grant that still uses it fails, and the memory may be
    /// unmapped. The soft provider reuses the table slot, so a process can
    /// register and deregister without limit; verbs unpins the pages. A
    /// registration this provider does not hold (already given back, or
    /// another provider's) is an error, as is one the device refuses (a
    /// memory window still bound to it).
    ///
    /// # Safety
    /// Nothing may use the memory through this registration any more: every
    /// work request posted with it has completed (or its queue pair was
    /// dropped) and every grant carved from it was revoked (or its queue
    /// pair dropped). The provider cannot see in-flight uses from other
    /// threads.
    unsafe fn deregister(&self, mr: &MemoryRegion) -> Result<(), ProviderError>;

    /// Registers the whole region of a buffer pool, passing its memfd (when
    /// the pool is memfd-backed) so that the soft provider can let peer
    /// processes reach granted bytes. The one place pools meet `register`.
    ///
    /// # Safety
    /// `pool` (or a clone of it, which shares the mapping) must outlive every
    /// use of the returned registration.
    unsafe fn register_pool(
        &self,
        pool: &smbdirect_hugepages::BufferPool,
    ) -> Result<MemoryRegion, ProviderError> {
        use std::os::fd::AsRawFd;
        let shared = pool.shared_fd().map(|fd| (fd.as_raw_fd(), 0u64));
        // SAFETY: forwarded to the caller (see above).
        unsafe { self.register(pool.region_base().as_ptr(), pool.region_len(), shared) }
    }

    /// Creates a completion queue with room for `entries` completions.
    fn create_cq(&self, entries: u32) -> Result<Self::Cq, ProviderError>;

    /// The most entries [`Provider::create_cq`] accepts: the device's
    /// `max_cqe` on verbs (32,767 on rdma_rxe); the soft provider sets no
    /// limit of its own.
    fn max_cq_entries(&self) -> u32 {
        u32::MAX
    }

    /// Listens on `addr`.
    fn listen(&self, addr: SocketAddr) -> Result<Self::Listener, ProviderError>;

    /// Provider counters for `stats` (live registrations and grants, access
    /// violations, RNR, ...), as (name, value) pairs. Control-plane only.
    fn counters(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }

    /// Connects to `addr`, creating the queue pair on `cq`; returns it with
    /// the private data the peer accepted with.
    fn connect(
        &self,
        addr: SocketAddr,
        cq: &<Self::Cq as CompletionQueue>::Handle,
        caps: QpCaps,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<(Self::Qp, Vec<u8>), ProviderError>;
}
