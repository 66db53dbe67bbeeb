//! The embedded software provider: RDMA semantics over shared memory, for
//! hosts without an RDMA device, for tests, and for any two processes (or
//! threads) of one host. Poll-mode and zero-copy like the verbs provider,
//! behind the same [`Provider`] interface, and deliberately *stricter* than
//! hardware so that the tests catch what hardware would punish.
//!
//! # Execution model
//!
//! The posting thread is the NIC. `post_send` executes each work request
//! synchronously ([`SoftQp`]): a Send pops the peer's next posted receive
//! from the peer's receive queue (a shared-memory SPSC ring), copies the
//! gathered bytes straight into that buffer (the only copy: the one a NIC's
//! DMA would make), publishes the receive completion into the peer's inbound
//! completion ring with a Release store, and completes locally if signaled.
//! RDMA Write and Read validate the peer's grant and copy. An RDMA Write is
//! therefore visible to the peer before any later Send on the same queue
//! pair completes there ([MS-SMBD] 1.5), by construction: the write's copy
//! is sequenced before the Send's Release publish, which the peer's poll
//! observes with an Acquire load.
//!
//! A [`SoftCq`] polls, for each queue pair attached to it, that QP's inbound
//! ring and local ring, in batches (one index store per ring per batch), and
//! flushes the QP's posted receives once its connection broke. Rings shared
//! with the peer's thread are read by the stamps in their slots, never by
//! the producer's index, so a Send hands its completion over in the one
//! cache line of the slot (`ring.rs`). QPs are created by the control plane against a [`SoftCqHandle`]
//! and reach the worker's CQ through a lock-free attach list.
//!
//! Nothing on the post/poll path allocates, locks or makes a system call.
//! Rings are fixed-size, sized from [`QpCaps`]: a receive queue holds
//! `max_recv_wr`, the local completion ring `max_send_wr`, and a CQ refuses
//! queue pairs whose `max_send_wr + max_recv_wr` would exceed its entries, so
//! a completion ring can never overrun (hardware punishes CQ overrun with an
//! asynchronous fatal error; we refuse the setup instead). Send-queue
//! occupancy is tracked as on hardware: a work request stays outstanding
//! until its completion, or a later signaled one (selective signaling), is
//! polled; posting beyond `max_send_wr` or `max_recv_wr` outstanding is
//! [`ProviderError::QueueFull`].
//!
//! # Stricter than hardware
//!
//! * A Send that finds no posted receive is RNR, fatal at once (no retries):
//!   the sender's WR completes with `RnrRetryExceeded` and the connection
//!   breaks.
//! * A message longer than the posted receive is `LocalLengthError` on that
//!   receive (the sender gets `Other(`[`WC_REMOTE_INVALID_REQUEST`]`)`, as
//!   verbs reports it) and breaks the connection.
//! * Every RDMA access and Send with Invalidate is checked against the grant:
//!   token, binding to this queue pair, direction, bounds. A violation
//!   completes the accessor's WR with `RemoteAccessError` and breaks the
//!   connection; the victim's first flushed receive carries
//!   `RemoteAccessViolation`, the rest `Flushed`.
//! * Any break takes *both* queue pairs to the error state and flushes
//!   everything posted on both sides (hardware leaves the responder up after
//!   an RNR or length error until the upper layer disconnects).
//! * A local SGE outside registered memory is `LocalProtectionError` and
//!   breaks the connection; a receive posted outside registered memory is
//!   refused at `post_recv`.
//!
//! # Connection manager: the rendezvous socket
//!
//! A listener on `ADDR:PORT` binds the abstract-namespace Unix socket
//! `"\0smbdirectd-soft/ADDR:PORT"` ([`rendezvous_name`]), so the soft
//! provider listens on exactly the address the verbs provider would, and a
//! client connects by the same address. A Unix socket because it can pass
//! file descriptors (`SCM_RIGHTS`): the connection segment, the grant table
//! and the memfds of registered pools travel in the handshake, so nothing is
//! named in the filesystem or `/dev/shm`. The abstract namespace because a
//! name there disappears with its socket (no stale files after a crash), is
//! scoped to the network namespace like the TCP port it mirrors, and gives
//! `EADDRINUSE` to a second listener as a port would. `SOCK_SEQPACKET`
//! because it keeps message boundaries and reports hang-up when the peer
//! closes or dies. A connector falls back from `ADDR:PORT` to the wildcard
//! listener `0.0.0.0:PORT` / `[::]:PORT`, as TCP would. Port 0 picks a free
//! ephemeral port ([`crate::provider::Listener::local_addr`] tells which).
//!
//! # Memory
//!
//! Registered memory is addressed by the owner's virtual addresses, as on
//! verbs (a Buffer Descriptor's Offset is the granted address). A peer in the
//! same process uses them directly. A peer in another process maps the
//! owner's regions from the memfds registered with them
//! ([`Provider::register`]'s `shared` argument) and translates, with bounds
//! checks, into its mapping. Memory registered without an fd is therefore
//! reachable only in-process: granting it, or posting a receive in it, on a
//! connection to another process fails with an error saying so. So does
//! memory registered after that connection was established (a peer process
//! maps the regions that existed when it connected; smbdirectd registers its
//! pools once, at start).
//!
//! # Grants and tokens
//!
//! Grants live in a per-provider table in shared memory; each queue pair
//! owns a range of slots (`grant.rs`). A token
//! (rkey) is the slot index in its low bits and fresh random bits above it,
//! from a per-queue-pair xorshift seeded from `getrandom(2)`, different from
//! the slot's previous token; with the default 65536-slot table that is 16
//! random bits, against rxe's 8. Slots are reused FIFO, as late as possible.
//! Revocation ([`QueuePair::revoke`](crate::provider::QueuePair::revoke), the peer's Send with Invalidate, or the
//! queue pair's drop) moves the slot out of the live state with a CAS and
//! waits for the accesses that had already validated (a per-slot reference
//! count): once it returns, nothing can touch the memory again. A Send with
//! Invalidate reports the rkey in the receive completion's
//! `invalidated_rkey`; revoking it locally afterwards is not an error.
//!
//! # Disconnect and peer death
//!
//! `disconnect()` (or dropping the queue pair, or the provider) breaks the
//! connection in the shared state word and shuts the rendezvous socket down.
//! The peer sees the state word on its next post or poll (no syscall), and
//! its watchdog thread (one per provider, blocked in `poll(2)`) sees the
//! hang-up even if it never polls. A peer process that dies without
//! disconnecting is detected the same way: its sockets close, and the
//! connection breaks with [`BreakReason::PeerLost`]. A pidfd of the peer
//! process tells when it has fully exited, after which accesses it left in
//! flight are known to be dead and teardown stops waiting for them. Either
//! way both queue pairs go to `Error` (`Disconnected` for the side that
//! disconnected) and every posted work request completes `Flushed`; work
//! posted after that completes `Flushed` too, as on verbs.
//!
//! # IRD/ORD
//!
//! Negotiated at connect as `ird = min(our ird, peer ord)` and
//! `ord = min(our ord, peer ird)` on each side, rejecting zero ([MS-SMBD]
//! Appendix A 6.2). The spec has the acceptor adopt the values it transmits,
//! which are the connector's view; we give each side its own view (equal to
//! the spec's for the connector, swapped for the acceptor), as rdma_cm does.
//! Reads execute synchronously, so the values are recorded and exposed
//! ([`QueuePair::ird_ord`](crate::provider::QueuePair::ird_ord)), not enforced.
//!
//! # Trust
//!
//! Peers are processes of the same host that were handed the shared
//! segments. A corrupt peer can make its own connection fail (inconsistent
//! ring indices break it with [`BreakReason::Corruption`]) and can write
//! garbage into memory it was granted, but every address it supplies is
//! bounds-checked against our mappings, so it cannot make this process
//! access memory outside them. Our own segments are sealed against
//! shrinking; registered pools are not (the hugepages crate maps them
//! unsealed), so a peer that truncated its own pool's memfd could fault us.
//! Dropping a queue pair or provider waits for a live peer that is inside an
//! access to our memory to leave it (microseconds, unless that peer is
//! stopped by a debugger).

mod conn;
mod copy;
mod cq;
mod grant;
mod qp;
mod region;
mod rendezvous;
mod ring;
mod rng;
mod shm;
mod watchdog;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

pub use conn::{BreakInfo, BreakReason};
pub use cq::{SoftCq, SoftCqHandle};
pub use qp::{SoftQp, WC_REMOTE_INVALID_REQUEST};
pub use rendezvous::{rendezvous_name, SoftListener, SoftRequest, MAX_PRIVATE_DATA};

use conn::Endpoint;
use grant::GrantTable;
use region::{LocalRegions, MapCache};
use watchdog::Watchdog;

use crate::provider::{MemoryRegion, Provider, ProviderError, QpCaps};

/// Sizes of a soft provider's tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SoftConfig {
    /// Grant slots of the provider (a power of two, 256..=2^20). The rkey
    /// spends log2 of this on the slot index and randomises the rest.
    pub grant_slots: u32,
    /// Grant slots reserved per queue pair (at most its `max_send_wr`).
    pub grants_per_qp: u32,
    /// Registered regions live at once (a power of two, 1..=1024; a region
    /// given back with [`Provider::deregister`] frees its slot). Every
    /// client connection of `bench` registers its own pool, so in one
    /// process this bounds the connections open at once. A handshake with
    /// another process passes the fds of all live ones that have one (in
    /// batches of the kernel's SCM_MAX_FD, 253, per message).
    pub max_regions: u32,
    /// Reuse a grant slot the peer invalidated with Send with Invalidate
    /// even though its owner never revoked it (true by default). `false`
    /// models verbs memory windows, which stay taken until the owner
    /// deregisters them as [MS-SMBD] 3.1.4.4 asks, also after a remote
    /// invalidation: for testing that an upper layer releases every grant.
    pub reclaim_invalidated: bool,
}

impl Default for SoftConfig {
    fn default() -> Self {
        SoftConfig {
            grant_slots: 1 << 16,
            grants_per_qp: 256,
            max_regions: 256,
            reclaim_invalidated: true,
        }
    }
}

/// Counters of a soft provider, for tests and `stats`. A relaxed snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SoftStats {
    /// Connections set up (either side).
    pub connections_established: u64,
    /// Connections whose break this provider's CQs have processed.
    pub connections_broken: u64,
    /// Connections broken because the peer vanished without disconnecting.
    pub peers_lost: u64,
    /// Our Sends that found no posted receive.
    pub rnr_errors: u64,
    /// Our Sends longer than the peer's receive buffer.
    pub length_errors: u64,
    /// Our work requests with an SGE outside registered memory.
    pub local_protection_errors: u64,
    /// Our RDMA accesses (or Send with Invalidate) the peer's grant check refused.
    pub remote_access_errors: u64,
    /// Peers' accesses to our grants that were refused (sum of the
    /// `refused_*` counters).
    pub access_violations: u64,
    /// ...because no grant had that token.
    pub refused_bad_token: u64,
    /// ...because the grant had been revoked or invalidated.
    pub refused_revoked: u64,
    /// ...because the grant is bound to another queue pair.
    pub refused_wrong_qp: u64,
    /// ...because the access exceeded the granted bytes.
    pub refused_out_of_range: u64,
    /// ...because it read a write grant or wrote a read grant.
    pub refused_wrong_direction: u64,
    /// Work requests completed with `Flushed` by this provider.
    pub flushed: u64,
    /// Grants currently live.
    pub grants_live: u64,
    /// Grants made.
    pub grants_created: u64,
    /// Grants revoked locally (`revoke`, or queue pair teardown).
    pub grants_revoked: u64,
    /// Grants invalidated by the peer's Send with Invalidate.
    pub grants_invalidated: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) connections_established: AtomicU64,
    pub(crate) connections_broken: AtomicU64,
    pub(crate) peers_lost: AtomicU64,
    pub(crate) rnr_errors: AtomicU64,
    pub(crate) length_errors: AtomicU64,
    pub(crate) local_protection_errors: AtomicU64,
    pub(crate) remote_access_errors: AtomicU64,
    pub(crate) flushed: AtomicU64,
    /// Per-connection counters of connections already dropped.
    pub(crate) retired_grants_created: AtomicU64,
    pub(crate) retired_grants_revoked: AtomicU64,
    pub(crate) retired_grants_invalidated: AtomicU64,
    pub(crate) retired_refused: [AtomicU64; 5],
}

/// State shared by a provider and everything created from it.
#[derive(Debug)]
pub(crate) struct ProviderInner {
    pub(crate) id: u64,
    pub(crate) config: SoftConfig,
    pub(crate) regions: LocalRegions,
    pub(crate) grants: GrantTable,
    /// Free ranges of grant slots (base, count), sorted.
    grant_ranges: Mutex<Vec<(u32, u32)>>,
    pub(crate) counters: Counters,
    endpoints: Mutex<Vec<Weak<Endpoint>>>,
    pub(crate) peer_maps: MapCache,
    pub(crate) peer_tables: Mutex<HashMap<(u64, u64), Weak<GrantTable>>>,
    pub(crate) watchdog: Watchdog,
    pub(crate) next_qp: AtomicU32,
    pub(crate) next_binding: AtomicU32,
}

impl ProviderInner {
    /// Reserves `n` consecutive grant slots for a queue pair. Setup path.
    pub(crate) fn take_grant_range(&self, n: u32) -> Result<(u32, u32), String> {
        let n = n.max(1);
        let mut free = self.grant_ranges.lock().unwrap_or_else(|e| e.into_inner());
        let Some(i) = free.iter().position(|&(_, c)| c >= n) else {
            let left: u32 = free.iter().map(|&(_, c)| c).sum();
            return Err(format!(
                "grant table exhausted: {n} slots wanted, {left} of {} free in fragments (raise SoftConfig::grant_slots \
                 or lower grants_per_qp)",
                self.grants.slots()
            ));
        };
        let (base, count) = free[i];
        if count == n {
            free.remove(i);
        } else {
            free[i] = (base + n, count - n);
        }
        Ok((base, n))
    }

    /// Returns a queue pair's grant slots.
    pub(crate) fn release_grant_range(&self, base: u32, n: u32) {
        let mut free = self.grant_ranges.lock().unwrap_or_else(|e| e.into_inner());
        let i = free.partition_point(|&(b, _)| b < base);
        free.insert(i, (base, n));
        // Merge with the neighbours.
        if i + 1 < free.len() && free[i].0 + free[i].1 == free[i + 1].0 {
            free[i].1 += free[i + 1].1;
            free.remove(i + 1);
        }
        if i > 0 && free[i - 1].0 + free[i - 1].1 == free[i].0 {
            free[i - 1].1 += free[i].1;
            free.remove(i);
        }
    }

    pub(crate) fn register_endpoint(&self, ep: &Arc<Endpoint>) {
        let mut eps = self.endpoints.lock().unwrap_or_else(|e| e.into_inner());
        eps.retain(|w| w.strong_count() > 0);
        eps.push(Arc::downgrade(ep));
    }

    fn live_endpoints(&self) -> Vec<Arc<Endpoint>> {
        let eps = self.endpoints.lock().unwrap_or_else(|e| e.into_inner());
        eps.iter().filter_map(Weak::upgrade).collect()
    }
}

/// The embedded software provider (see the module doc).
pub struct SoftProvider {
    inner: Arc<ProviderInner>,
}

impl std::fmt::Debug for SoftProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftProvider")
            .field("id", &format_args!("{:#018x}", self.inner.id))
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl SoftProvider {
    /// A provider with the default [`SoftConfig`].
    pub fn new() -> Result<Self, ProviderError> {
        Self::with_config(SoftConfig::default())
    }

    /// A provider with the given table sizes.
    pub fn with_config(config: SoftConfig) -> Result<Self, ProviderError> {
        let SoftConfig {
            grant_slots,
            grants_per_qp,
            max_regions,
            reclaim_invalidated: _,
        } = config;
        if !grant_slots.is_power_of_two() || !(256..=1 << 20).contains(&grant_slots) {
            return Err(ProviderError::Other(format!(
                "SoftConfig::grant_slots {grant_slots}: want a power of two in 256..=1048576"
            )));
        }
        if grants_per_qp == 0 || grants_per_qp > grant_slots {
            return Err(ProviderError::Other(format!(
                "SoftConfig::grants_per_qp {grants_per_qp}: want 1..={grant_slots}"
            )));
        }
        if !max_regions.is_power_of_two() || max_regions > 1024 {
            return Err(ProviderError::Other(format!(
                "SoftConfig::max_regions {max_regions}: want a power of two up to 1024"
            )));
        }
        let id = rng::os_random_u64();
        Ok(SoftProvider {
            inner: Arc::new(ProviderInner {
                id,
                config,
                regions: LocalRegions::new(max_regions),
                grants: GrantTable::create(grant_slots, id)?,
                grant_ranges: Mutex::new(vec![(0, grant_slots)]),
                counters: Counters::default(),
                endpoints: Mutex::new(Vec::new()),
                peer_maps: Mutex::new(HashMap::new()),
                peer_tables: Mutex::new(HashMap::new()),
                watchdog: Watchdog::new()?,
                next_qp: AtomicU32::new(1),
                next_binding: AtomicU32::new(1),
            }),
        })
    }

    /// Its table sizes.
    pub fn config(&self) -> SoftConfig {
        self.inner.config
    }

    /// A snapshot of its counters. Takes a lock (not for the I/O path).
    pub fn stats(&self) -> SoftStats {
        let c = &self.inner.counters;
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut refused = [0u64; 5];
        for (r, a) in refused.iter_mut().zip(&c.retired_refused) {
            *r = ld(a);
        }
        let mut s = SoftStats {
            connections_established: ld(&c.connections_established),
            connections_broken: ld(&c.connections_broken),
            peers_lost: ld(&c.peers_lost),
            rnr_errors: ld(&c.rnr_errors),
            length_errors: ld(&c.length_errors),
            local_protection_errors: ld(&c.local_protection_errors),
            remote_access_errors: ld(&c.remote_access_errors),
            flushed: ld(&c.flushed),
            grants_created: ld(&c.retired_grants_created),
            grants_revoked: ld(&c.retired_grants_revoked),
            grants_invalidated: ld(&c.retired_grants_invalidated),
            ..SoftStats::default()
        };
        for ep in self.inner.live_endpoints() {
            let side = ep.seg.counters(ep.me);
            s.grants_created += ld(&side.owner.grants_created);
            s.grants_revoked += ld(&side.owner.grants_revoked);
            s.grants_invalidated += ld(&side.peer.grants_invalidated);
            for (r, a) in refused.iter_mut().zip(&side.peer.refused) {
                *r += ld(a);
            }
        }
        [
            s.refused_bad_token,
            s.refused_revoked,
            s.refused_wrong_qp,
            s.refused_out_of_range,
            s.refused_wrong_direction,
        ] = refused;
        s.access_violations = refused.iter().sum();
        s.grants_live = s
            .grants_created
            .saturating_sub(s.grants_revoked + s.grants_invalidated);
        s
    }
}

impl Drop for SoftProvider {
    fn drop(&mut self) {
        // Break every connection, then wait until no peer is inside our
        // memory: the register() contract lets the caller unmap it next.
        let eps = self.inner.live_endpoints();
        for ep in &eps {
            ep.break_conn(BreakReason::ProviderDropped);
            ep.shutdown_socket();
        }
        for ep in &eps {
            ep.drain_my_gate();
        }
        self.inner.watchdog.stop();
    }
}

impl Provider for SoftProvider {
    type Cq = SoftCq;
    type Qp = SoftQp;
    type Request = SoftRequest;
    type Listener = SoftListener;

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let s = self.stats();
        vec![
            ("registrations", self.inner.regions.len() as u64),
            ("grants_live", s.grants_live),
            ("grants_created", s.grants_created),
            ("grants_revoked", s.grants_revoked),
            ("grants_invalidated", s.grants_invalidated),
            ("access_violations", s.access_violations),
            ("rnr_errors", s.rnr_errors),
            ("length_errors", s.length_errors),
            ("remote_access_errors", s.remote_access_errors),
            ("connections_established", s.connections_established),
            ("connections_broken", s.connections_broken),
            ("peers_lost", s.peers_lost),
            ("flushed", s.flushed),
        ]
    }

    fn name(&self) -> &'static str {
        "soft"
    }

    unsafe fn register(
        &self,
        addr: *mut u8,
        len: usize,
        shared: Option<(RawFd, u64)>,
    ) -> Result<MemoryRegion, ProviderError> {
        self.inner.regions.register(addr, len, shared)
    }

    unsafe fn deregister(&self, mr: &MemoryRegion) -> Result<(), ProviderError> {
        self.inner.regions.deregister(mr.lkey, mr.addr, mr.len)
    }

    fn create_cq(&self, entries: u32) -> Result<SoftCq, ProviderError> {
        SoftCq::new(entries)
    }

    fn listen(&self, addr: SocketAddr) -> Result<SoftListener, ProviderError> {
        SoftListener::bind(self.inner.clone(), addr)
    }

    fn connect(
        &self,
        addr: SocketAddr,
        cq: &SoftCqHandle,
        caps: QpCaps,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<(SoftQp, Vec<u8>), ProviderError> {
        rendezvous::connect(&self.inner, addr, cq, caps, private_data, timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_ranges_split_and_merge() {
        let p = SoftProvider::with_config(SoftConfig {
            grant_slots: 256,
            grants_per_qp: 64,
            max_regions: 4,
            reclaim_invalidated: true,
        })
        .unwrap();
        let i = &p.inner;
        let a = i.take_grant_range(100).unwrap();
        let b = i.take_grant_range(100).unwrap();
        assert_eq!((a, b), ((0, 100), (100, 100)));
        assert!(i.take_grant_range(100).unwrap_err().contains("exhausted"));
        i.release_grant_range(a.0, a.1);
        i.release_grant_range(b.0, b.1);
        assert_eq!(*i.grant_ranges.lock().unwrap(), vec![(0, 256)]);
    }

    #[test]
    fn a_connect_to_a_listener_in_this_process_passes_no_regions() {
        use crate::provider::{CompletionQueue, ConnRequest, Listener};
        use std::os::fd::AsRawFd;
        // Declared before the provider, so dropped after it.
        let seg = shm::Segment::create(c"many-pools", 4096).unwrap();
        let mut mem = vec![0u8; 64];
        let p = SoftProvider::with_config(SoftConfig {
            max_regions: 512,
            ..SoftConfig::default()
        })
        .unwrap();
        let fd = seg.fd().as_raw_fd();
        // More memfd-backed regions than one SCM_RIGHTS message passes: a
        // listener in this process maps none of them, so none are passed
        // (bench --loopback with 256 connections would dup 256 fds for each).
        for _ in 0..260 {
            // SAFETY: `mem` and `seg` outlive the provider (declared before it).
            unsafe { p.register(mem.as_mut_ptr(), 64, Some((fd, 0))) }.unwrap();
        }
        let mut listener = p.listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr();
        let (scq, ccq) = (p.create_cq(64).unwrap(), p.create_cq(64).unwrap());
        let caps = QpCaps {
            max_send_wr: 8,
            max_recv_wr: 8,
            max_sge: 1,
            ird: 1,
            ord: 1,
        };
        std::thread::scope(|s| {
            let acceptor = s.spawn(|| {
                let req = listener
                    .accept_request(Duration::from_secs(5))
                    .unwrap()
                    .expect("a request");
                assert_eq!(req.fds_passed(), 1, "the grant table's alone");
                req.accept(&scq.handle(), caps, b"").unwrap()
            });
            let (qp, _) = p
                .connect(addr, &ccq.handle(), caps, b"", Duration::from_secs(5))
                .expect("connect to a listener in this process");
            assert!(!qp.is_cross_process());
            drop(acceptor.join().unwrap());
        });
    }

    #[test]
    fn config_is_validated() {
        for bad in [
            SoftConfig {
                grant_slots: 300,
                ..SoftConfig::default()
            },
            SoftConfig {
                grants_per_qp: 0,
                ..SoftConfig::default()
            },
            SoftConfig {
                max_regions: 3,
                ..SoftConfig::default()
            },
        ] {
            assert!(SoftProvider::with_config(bad).is_err(), "{bad:?}");
        }
    }
}
