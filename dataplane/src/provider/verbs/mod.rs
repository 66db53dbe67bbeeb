//! The verbs provider: real RDMA through rdma-core (libibverbs for the data
//! path, librdmacm for connection management), over InfiniBand, RoCE and
//! iWARP.
//!
//! Layout:
//! - `device`: the opened device, its protection domain, the pools
//!   registered on it and its quirks; [`devices`] lists devices for the CLI;
//! - `work_queue`: the per-queue-pair shadow rings that give every completion
//!   (including flushed ones, whose verbs opcode is undefined) its caller's
//!   `wr_id` and opcode, and account for selective signaling;
//! - `completion_queue`: [`VerbsCq`], busy-polled `ibv_poll_cq`;
//! - `queue_pair`: [`VerbsQp`], chained `ibv_post_send`/`ibv_post_recv` from
//!   fixed scratch arrays, grants and revokes;
//! - `memory_window`: per-I/O grants, type-2 memory windows bound to one queue
//!   pair (or a per-I/O registration where the device has no windows);
//! - `connection_manager`: rdma_cm listen/accept/connect and the CM service
//!   thread that turns a lost connection into a queue pair in error;
//! - `ird_ord`: IRD/ORD at connection time ([MS-SMBD] Appendix A): the offer,
//!   the negotiation, and the iWARP private-data header, as pure functions.
//!
//! # Design
//!
//! **Memory exposure (RFC 5042, [MS-SMBD] 3.1.4.3).** Pools are registered
//! once with `IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND`: never remote
//! access on a whole region. A grant binds a type-2 memory window over the
//! exact bytes and one direction (`REMOTE_READ` or `REMOTE_WRITE`) with an
//! `IBV_WR_BIND_MW` posted on the queue pair, so the window is usable through
//! that queue pair only. Each queue pair allocates
//! [`VerbsConfig::mws_per_qp`] windows when it is created (a grant beyond
//! them fails). The rkey's 8-bit key is bumped on every bind, so a revoked
//! token is refused even after its window is reused (for 255 binds).
//! Revocation is the peer's Send with Invalidate or our `IBV_WR_LOCAL_INV`.
//! [MS-SMBD] 3.1.4.4 has the upper layer deregister every grant, also those
//! the peer invalidated: the poller records each remote invalidation against
//! its window, and revoking such a grant posts nothing (a second invalidation
//! is pointless, and crashes rdma_rxe on Linux 6.1) but still completes
//! [`WcOpcode::Revoke`](super::WcOpcode::Revoke) if signaled. On a device
//! without type-2 windows ([`devices`] says which), a grant is a per-I/O
//! `ibv_reg_mr` of the exact range, revoked by `ibv_dereg_mr`: correct but
//! slow (a syscall per grant), usable by any queue pair of the protection
//! domain, and not remotely invalidatable. Its signaled grant and revoke
//! completions are made by the provider.
//!
//! **Signaling.** Queue pairs are created with `sq_sig_all = 0`; each
//! [`SendWr`](super::SendWr) says whether it is signaled. A signaled
//! completion retires every earlier unsignaled request of the same queue (the
//! shadow ring's consumer index moves past them), so posting more than the
//! send queue depth without ever signaling yields
//! [`ProviderError::QueueFull`], never a silently overrun queue. A Send with
//! Invalidate is posted with `IBV_SEND_FENCE`, so it never overtakes an
//! earlier RDMA Read of the buffer it invalidates.
//!
//! **Threads.** A worker owns its [`VerbsCq`] and [`VerbsQp`]s; post and poll
//! neither lock nor allocate. Queue pairs are created from any thread through
//! a [`VerbsCqHandle`] (`ibv_create_qp` is thread-safe; the handle's shared
//! part is behind an `Arc`). Listening, accepting and connecting are blocking
//! calls for the control-plane thread. Each connection's rdma_cm id then
//! moves (at the request on the accepting side, once established on the
//! connecting side) to one provider-wide event channel serviced by the
//! provider's CM thread (`verbs-cm`): on `DISCONNECTED`, `DEVICE_REMOVAL`,
//! `CONNECT_ERROR`, `UNREACHABLE` or `REJECTED` it calls `rdma_disconnect`,
//! which moves the queue pair to the error state, so every posted request
//! completes with [`WcStatus::Flushed`](super::WcStatus::Flushed) on the
//! worker's completion queue, and [`QueuePair::state`](super::QueuePair::state)
//! says [`QpState::Error`](super::QpState::Error). A fatal completion (RNR,
//! refused access, length error) puts the queue pair in error too; the peer
//! of such a failure stays connected until the failing end disconnects.
//!
//! **IRD/ORD ([MS-SMBD] Appendix A).** We offer `responder_resources = ird`
//! and `initiator_depth = ord` (from [`QpCaps`], clamped to the device). On
//! InfiniBand and RoCE the CM carries them: each side's IRD becomes
//! `min(own ird, peer ord)` and its ORD `min(own ord, peer ird)`. On iWARP
//! (`IBV_TRANSPORT_IWARP`), whose MPA may not negotiate them (RFC 6581), the
//! 8-byte IRD/ORD negotiate header of 6.1 (big-endian, as Linux sends it) goes
//! first in the private data: the connecting side sends its offer; the
//! accepting side strips the header from the request (the caller's
//! [`ConnRequest::private_data`](super::ConnRequest::private_data) is what
//! follows it), computes the 6.2 reply, *rejects* the request when a result
//! is zero, sets its IRD/ORD before `rdma_accept` and sends the reply's
//! header first in the accept's private data; the connecting side adopts the
//! reply from the ESTABLISHED event and strips it too. The accepting side's
//! values mirror the reply (see `ird_ord` for why), which gives the same
//! result as the CM on InfiniBand and RoCE. A peer that sends no header
//! (fewer than 8 bytes) gets the CM's values, as on InfiniBand. Both sides
//! report the result in [`QueuePair::ird_ord`](super::QueuePair::ird_ord);
//! on the connecting side it can only be recorded (the queue pair was set up
//! with the offer before the reply came), and it is what bounds the worker's
//! outstanding RDMA Reads. The SMB Direct port is 445 on InfiniBand and RoCE
//! and 5445 on iWARP ([`Transport::smb_direct_port`]).
//!
//! *Not tested at run time on iWARP:* there is no iWARP device here, and the
//! rxe guest that runs `scripts/rxe-tests.sh` has only `rdma_rxe` (no `siw`
//! module). The header's construction, parsing, stripping and the
//! zero-rejection decision are unit-tested in `ird_ord`; the rxe run shows
//! that InfiniBand/RoCE behaviour (no header) is unchanged.
//!
//! **Private data.** InfiniBand CM messages have fixed-size private data: the
//! peer's private data arrives zero-padded to 56 bytes (connect request) or
//! 196 bytes (accept reply), and longer private data is refused. iWARP does
//! not pad; there the IRD/ORD header counts against the same limits.
//!
//! **Accept and the first receive.**
//! [`ConnRequest::accept_with_receives`](super::ConnRequest::accept_with_receives)
//! posts the first receives on the new queue pair before `rdma_accept` sends
//! the reply, so the peer's first Send always finds one (the peer's QP has
//! `rnr_retry = 0`, see [`VerbsConfig::rnr_retry`]). Accept returns as soon as
//! the reply is sent; the peer's ready-to-use message arrives later, at the
//! CM thread. A disconnect before it arrived is sent again when it does (the
//! kernel drops it silently).
//!
//! **Completions.** Verbs leaves the opcode of an error completion undefined
//! and selective signaling hides most successes, so the device sees our own
//! `wr_id`s: they name a shadow ring entry that holds the caller's `wr_id`,
//! opcode and length (see `work_queue`). Every completion, flushed or not,
//! carries the caller's `wr_id` and the right opcode; `byte_len` is the
//! received length for receives and the posted length otherwise.
//!
//! **rdma_rxe.** Soft-RoCE (Linux 6.1, the rxe VM's kernel) needs three
//! workarounds, on that device only: its invalidate flag in receive
//! completions has the kernel's bit value; it reports a too-short receive as
//! `IBV_WC_LOC_QP_OP_ERR`; and it checks memory-window accesses against the
//! underlying region's bounds, not the window's, so each window is bound
//! onto a registration of exactly the granted bytes (a registration per
//! grant). Also, a queue pair is destroyed only after its windows are
//! deallocated (rxe makes `ibv_destroy_qp` wait ~50 s for bound windows).

mod completion_queue;
mod connection_manager;
mod device;
mod ird_ord;
mod memory_window;
mod queue_pair;
mod work_queue;

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

pub use completion_queue::{VerbsCq, VerbsCqHandle};
pub use connection_manager::{VerbsListener, VerbsRequest};
pub use device::{
    devices, DeviceInfo, GrantMechanism, LinkLayer, MemoryWindowSupport, PortInfo, PortState,
    Transport,
};
pub use queue_pair::VerbsQp;

use super::{MemoryRegion, Provider, ProviderError, QpCaps};
use device::Device;

/// How grants are implemented (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GrantMode {
    /// Type-2 memory windows where the device has them, else per-I/O
    /// registration.
    #[default]
    Auto,
    /// Type-2 memory windows; opening fails on a device without them.
    MemoryWindow,
    /// Per-I/O `ibv_reg_mr` even where windows exist (for testing the
    /// fallback).
    Registration,
}

/// Settings of a [`VerbsProvider`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerbsConfig {
    /// Device name (`mlx5_0`, `rxe0`); `None` takes the first device.
    pub device: Option<String>,
    /// How grants are made.
    pub grants: GrantMode,
    /// RNR retry count we announce in connect/accept (0–7; 7 = forever).
    /// On InfiniBand CM this tells the *peer* how often to retry when we
    /// have no receive posted. 0 makes RNR fatal at once, as on the soft
    /// provider: SMB Direct credits mean a peer never needs to retry.
    pub rnr_retry: u8,
    /// Transport retry count (0–7) for lost packets.
    pub retry_count: u8,
    /// Memory windows allocated with each queue pair: at most this many of
    /// its grants can be live at once.
    pub mws_per_qp: u32,
    /// Queue pairs one completion queue can serve.
    pub max_qps_per_cq: u16,
}

impl Default for VerbsConfig {
    fn default() -> Self {
        VerbsConfig {
            device: None,
            grants: GrantMode::Auto,
            rnr_retry: 0,
            retry_count: 7,
            mws_per_qp: 64,
            max_qps_per_cq: 1024,
        }
    }
}

/// An opened RDMA device with its protection domain: the verbs
/// implementation of [`Provider`].
#[derive(Debug, Clone)]
pub struct VerbsProvider {
    device: Arc<Device>,
}

impl VerbsProvider {
    /// Opens the configured device (through librdmacm, so connection
    /// identifiers and the protection domain share one verbs context),
    /// allocates a protection domain and starts the CM service thread.
    pub fn open(config: VerbsConfig) -> Result<Self, ProviderError> {
        Ok(VerbsProvider {
            device: Device::open(config)?,
        })
    }

    /// The device's name.
    pub fn device_name(&self) -> &str {
        self.device.name()
    }

    /// How this provider implements grants on its device.
    pub fn grant_mechanism(&self) -> GrantMechanism {
        self.device.grant_mechanism()
    }
}

impl Provider for VerbsProvider {
    type Cq = VerbsCq;
    type Qp = VerbsQp;
    type Request = VerbsRequest;
    type Listener = VerbsListener;

    fn name(&self) -> &'static str {
        "verbs"
    }

    unsafe fn register(
        &self,
        addr: *mut u8,
        len: usize,
        _shared: Option<(RawFd, u64)>,
    ) -> Result<MemoryRegion, ProviderError> {
        // SAFETY: the caller guarantees the memory stays mapped until the
        // provider (and so the device holding the registration) is dropped.
        unsafe { self.device.register(addr, len) }
    }

    unsafe fn deregister(&self, mr: &MemoryRegion) -> Result<(), ProviderError> {
        // SAFETY: forwarded: nothing uses the registration any more.
        unsafe { self.device.deregister(mr) }
    }

    fn create_cq(&self, entries: u32) -> Result<VerbsCq, ProviderError> {
        VerbsCq::new(&self.device, entries)
    }

    fn max_cq_entries(&self) -> u32 {
        self.device.limits().max_cqe
    }

    fn listen(&self, addr: SocketAddr) -> Result<VerbsListener, ProviderError> {
        VerbsListener::new(&self.device, addr)
    }

    fn connect(
        &self,
        addr: SocketAddr,
        cq: &VerbsCqHandle,
        caps: QpCaps,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<(VerbsQp, Vec<u8>), ProviderError> {
        connection_manager::connect(&self.device, addr, cq, caps, private_data, timeout)
    }
}
