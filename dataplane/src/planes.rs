//! What the control plane and the workers say to each other, and the
//! counters workers publish. Both planes depend on this one module; the
//! channels are bounded lock-free rings (a full ring is backpressure to the
//! sender, never a drop and never growth).

use crossbeam_queue::ArrayQueue;
use smbdirect_protocol::ntstatus::NtStatus;
use smbdirect_protocol::smbd::{NegotiateDecision, TerminateReason};
use smbdirect_protocol::sqos::enforcement::{FlowRates, WindowReport};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Identifies a connection across both planes.
pub type ConnId = u64;

/// Control plane → worker.
#[derive(Debug)]
pub enum ToWorker<Q> {
    /// A new connection whose queue pair was created on this worker's CQ;
    /// it is PASSIVE and its negotiate receive must be posted.
    Attach {
        /// Connection id.
        conn: ConnId,
        /// The queue pair.
        qp: Q,
        /// Peer address (for logs).
        peer: SocketAddr,
        /// The negotiate receive was posted before accepting, with a buffer
        /// the worker lent the control plane (see [`LOANED_RECEIVES`]).
        negotiate_receive_posted: bool,
    },
    /// The negotiation decision for a connection ([MS-SMBD] 3.1.5.6).
    Negotiated {
        /// Connection id.
        conn: ConnId,
        /// What to do.
        decision: NegotiateDecision,
    },
    /// Stop: finish in-flight work within the grace period, disconnect
    /// everything, return every buffer, exit.
    Shutdown,
    /// For the worker's upper layer (Storage QoS answers and rates).
    Upper(UpperControl),
}

/// The rates a worker enforces for a flow, and the control plane's index of
/// the flow (stable while the flow exists; the worker's key for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QosFlowAssign {
    /// Control-plane flow index.
    pub flow: u32,
    /// This worker's share ([MS-SQOS] MaximumIoRate / MinimumIoRate /
    /// MaximumBandwidth, divided by the control plane).
    pub rates: FlowRates,
}

/// Control plane → upper layer of a worker.
#[derive(Debug)]
pub enum UpperControl {
    /// The answer to [`UpperEvent::QosRequest`]: the IOCTL's status and
    /// output buffer, and the flow the Open is associated to afterwards
    /// (None: not associated).
    QosReply {
        /// Connection.
        conn: ConnId,
        /// The upper layer's token from the request.
        token: u64,
        /// The Open (persistent FileId) the request named.
        open: u64,
        /// STATUS_SUCCESS with an optional output buffer, or the failure.
        result: Result<Option<Box<[u8]>>, NtStatus>,
        /// The Open's flow after the request.
        flow: Option<QosFlowAssign>,
    },
    /// New rates for a flow on this worker (pushed at least every 100 ms
    /// while the flow is active, and on every change).
    QosRates(QosFlowAssign),
}

/// Upper layer of a worker → control plane.
#[derive(Debug)]
pub enum UpperEvent {
    /// An SMB2 IOCTL FSCTL_STORAGE_QOS_CONTROL to process ([MS-SQOS] 3.2.5.1).
    QosRequest {
        /// Connection.
        conn: ConnId,
        /// Returned in the reply.
        token: u64,
        /// The Open (its persistent FileId, unique per connection).
        open: u64,
        /// The Open is a data file (Storage QoS applies to files only).
        is_file: bool,
        /// The IOCTL input buffer.
        request: Box<[u8]>,
        /// The IOCTL's MaxOutputResponse.
        max_output: u32,
    },
    /// A file was opened on a share with a default Storage QoS policy: the
    /// Open becomes a flow under that policy (clients that send no
    /// FSCTL_STORAGE_QOS_CONTROL, such as Linux cifs, are limited too).
    QosDefaultFlow {
        /// Connection.
        conn: ConnId,
        /// The Open (persistent FileId).
        open: u64,
        /// The share's policy.
        policy: smbdirect_protocol::sqos::Guid,
    },
    /// An Open that was named by a QoS request closed.
    OpenClosed {
        /// Connection.
        conn: ConnId,
        /// Its persistent FileId.
        open: u64,
    },
    /// What the worker's scheduler measured for a flow over its last window.
    QosWindow {
        /// Control-plane flow index.
        flow: u32,
        /// The window's measurements.
        report: WindowReport,
        /// The worker had more ready requests than it could dispatch.
        saturated: bool,
    },
}

/// Why a connection closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// The SMB Direct state machine terminated it.
    Protocol(TerminateReason),
    /// An RDMA work request failed (RNR, access error, flush after loss).
    Provider(crate::provider::WcStatus),
    /// The worker had no room for it.
    Capacity,
    /// The buffer pool had no buffer for a message that cannot wait (a
    /// reassembled message): pool pressure, not the peer's fault.
    PoolExhausted,
    /// The upper layer's reply is larger than the peer can reassemble.
    ReplyTooLarge,
    /// The upper layer asked for it (the peer broke the upper-layer
    /// protocol in a way that calls for a disconnect).
    UpperLayer,
    /// Shut down.
    Shutdown,
}

impl core::fmt::Display for CloseReason {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CloseReason::Protocol(r) => write!(f, "{r}"),
            CloseReason::Provider(crate::provider::WcStatus::Flushed) => {
                f.write_str("connection lost (the peer disconnected or the RDMA connection broke)")
            }
            CloseReason::Provider(s) => write!(f, "RDMA error {s:?}"),
            CloseReason::Capacity => f.write_str("worker at its connection limit"),
            CloseReason::PoolExhausted => f.write_str(
                "no free pool buffer for a reassembled message (buffer pool exhausted: see --pool-mem)",
            ),
            CloseReason::ReplyTooLarge => {
                f.write_str("a reply is larger than the peer's MaxFragmentedSize")
            }
            CloseReason::UpperLayer => {
                f.write_str("the upper layer disconnected it (upper-layer protocol violation)")
            }
            CloseReason::Shutdown => f.write_str("shutdown"),
        }
    }
}

/// Worker → control plane.
#[derive(Debug)]
pub enum FromWorker {
    /// A Negotiate Request arrived; decide it.
    NegotiateRequest {
        /// Connection id.
        conn: ConnId,
        /// The first 32 bytes of the message.
        bytes: [u8; 32],
        /// The message's length.
        len: usize,
    },
    /// The connection is gone and every buffer it held is back in the pool.
    Closed {
        /// Connection id.
        conn: ConnId,
        /// Why.
        reason: CloseReason,
        /// Was it the peer's fault (a protocol violation)?
        peer_violation: bool,
    },
    /// From the worker's upper layer.
    Upper(UpperEvent),
}

/// Receive buffers each worker keeps lent to the control plane, which posts
/// one as the negotiate receive of every connection it accepts for that
/// worker, before accepting ([MS-SMBD] 3.1.7.2). The worker refills the loan
/// ring from its pool slice; the buffer comes home through the worker's own
/// completion queue like any other receive.
pub const LOANED_RECEIVES: usize = 16;

/// A bounded lock-free ring in one direction.
pub type Ring<T> = Arc<ArrayQueue<T>>;

/// Creates a ring of `capacity` entries.
pub fn ring<T>(capacity: usize) -> Ring<T> {
    Arc::new(ArrayQueue::new(capacity.max(1)))
}

/// Wakes a thread that sleeps in `poll(2)` while its ring is empty (a
/// worker with nothing to do, the control plane between events), so that a
/// message pushed to the ring is seen at once instead of after the sleeper's
/// timeout. An eventfd plus a "sleeping" flag: the producer writes the
/// eventfd only when the consumer has said it may sleep, so a busy consumer
/// costs the producer a fence and a load per ring, never a system call.
///
/// Protocol (the Dekker pattern, both sides fenced): the consumer
/// [`arm`](Self::arm)s, looks at its rings once more, sleeps polling
/// [`fd`](Self::fd) among its descriptors, then [`disarm`](Self::disarm)s;
/// the producer pushes, then [`ring`](Self::ring)s. Either the consumer's
/// last look sees the message, or the producer sees the flag and wakes it.
#[derive(Debug)]
pub struct Doorbell {
    fd: std::os::fd::OwnedFd,
    sleeping: AtomicBool,
}

impl Doorbell {
    /// A new doorbell (a non-blocking, close-on-exec eventfd).
    pub fn new() -> std::io::Result<Arc<Self>> {
        use std::os::fd::FromRawFd;
        // SAFETY: plain eventfd(2); the descriptor is owned from here on.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Arc::new(Doorbell {
            // SAFETY: `fd` is a fresh descriptor nobody else owns.
            fd: unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) },
            sleeping: AtomicBool::new(false),
        }))
    }

    /// The descriptor to poll for `POLLIN`.
    pub fn fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.fd.as_raw_fd()
    }

    /// Producer, after pushing: wakes the consumer if it sleeps (or is about
    /// to).
    pub fn ring(&self) {
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) {
            let one = 1u64;
            // SAFETY: an 8-byte write to our eventfd. EAGAIN (the counter
            // at its maximum) still leaves it readable: nothing is lost.
            unsafe { libc::write(self.fd(), (&one as *const u64).cast(), 8) };
        }
    }

    /// Consumer, before its last look at the ring: from here on a
    /// [`ring`](Self::ring) makes [`fd`](Self::fd) readable.
    pub fn arm(&self) {
        self.sleeping.store(true, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    /// Consumer, after sleeping (or deciding not to): `rung` is whether the
    /// poll found [`fd`](Self::fd) readable; its count is then consumed.
    pub fn disarm(&self, rung: bool) {
        self.sleeping.store(false, Ordering::Relaxed);
        if rung {
            let mut v = 0u64;
            // SAFETY: an 8-byte read from our non-blocking eventfd.
            unsafe { libc::read(self.fd(), (&mut v as *mut u64).cast(), 8) };
        }
    }
}

/// Waits until one of `fds` is readable (`POLLIN`) or `timeout` passes
/// (`ppoll(2)`; a signal or an error just ends the wait early). Returns a
/// bit per descriptor (bit `i`: `fds[i]` readable or in error); at most 8
/// descriptors.
pub fn wait_readable(fds: &[std::os::fd::RawFd], timeout: std::time::Duration) -> u8 {
    let mut p = [libc::pollfd {
        fd: -1,
        events: libc::POLLIN,
        revents: 0,
    }; 8];
    let n = fds.len().min(p.len());
    for (slot, &fd) in p.iter_mut().zip(&fds[..n]) {
        slot.fd = fd;
    }
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: `n` valid pollfds, a valid timespec, no signal mask.
    let rc = unsafe { libc::ppoll(p.as_mut_ptr(), n as libc::nfds_t, &ts, std::ptr::null()) };
    if rc <= 0 {
        return 0;
    }
    p[..n]
        .iter()
        .enumerate()
        .filter(|(_, q)| q.revents != 0)
        .fold(0u8, |m, (i, _)| m | (1 << i))
}

/// Counters a worker publishes (single writer: the worker; readers: the
/// control plane's stats and the admin socket). Relaxed atomics: each value
/// is individually exact, a snapshot across fields is approximate.
#[derive(Debug, Default)]
pub struct WorkerStats {
    /// Live connections.
    pub connections: AtomicU64,
    /// Connections accepted over the worker's life.
    pub connections_total: AtomicU64,
    /// Upper-layer messages received.
    pub messages_in: AtomicU64,
    /// Upper-layer messages sent.
    pub messages_out: AtomicU64,
    /// Upper-layer bytes received.
    pub bytes_in: AtomicU64,
    /// Upper-layer bytes sent.
    pub bytes_out: AtomicU64,
    /// Transmits held back for lack of a send credit.
    pub credit_stalls: AtomicU64,
    /// RNR failures (a peer sent with no receive posted, or we did).
    pub rnr: AtomicU64,
    /// Connections terminated for a peer protocol violation.
    pub protocol_errors: AtomicU64,
    /// Other RDMA errors.
    pub rdma_errors: AtomicU64,
    /// Times a buffer was not available and work waited (send buffers,
    /// RDMA data buffers, receives that could not be reposted).
    pub pool_stalls: AtomicU64,
    /// Requests refused because the store is full (STATUS_DISK_FULL).
    pub store_full: AtomicU64,
    /// Large READ and WRITE copies of a memory-file-system store made on
    /// a copy core (`serve --store-copy-cores`), and those eligible but
    /// made on the worker, with nothing else in flight to overlap.
    pub store_copies_away: AtomicU64,
    /// See [`WorkerStats::store_copies_away`].
    pub store_copies_kept: AtomicU64,
    /// Connections ended by the negotiation or keepalive timers.
    pub timeouts: AtomicU64,
    /// Poll-loop iterations that found work.
    pub busy_polls: AtomicU64,
    /// Idle sleeps on the completion queue's wake-up descriptor (verbs;
    /// [`crate::worker::IdleMode::Sleep`]).
    pub idle_sleeps: AtomicU64,
    /// SMB2 sessions on this worker (upper-layer gauge).
    pub sessions: AtomicU64,
    /// SMB2 Opens on this worker (upper-layer gauge).
    pub opens: AtomicU64,
    /// Requests waiting in the worker's QoS queue (upper-layer gauge).
    pub qos_queued: AtomicU64,
    /// Bytes RDMA Read from peers by completed operations (WRITE data).
    pub rdma_read_bytes: AtomicU64,
    /// Bytes RDMA Written to peers by completed operations (READ data).
    pub rdma_write_bytes: AtomicU64,
    /// `post_send` calls carrying RDMA requests (doorbells).
    pub rdma_posts: AtomicU64,
    /// READ responses that went in their RDMA Write's `post_send`.
    pub replies_chained: AtomicU64,
    /// Times a connection's next message waited for a free slot in its
    /// RDMA operation table (all its operations in flight).
    pub rdma_table_waits: AtomicU64,
    /// [`crate::clock::cycles`] spent in poll-loop iterations that found
    /// work (completions, control messages, upper-layer wakes, service,
    /// timers), and in those that found none (including idle sleeps):
    /// busy / (busy + idle) over an interval is how loaded the worker's
    /// core was, as SPDK reports a reactor's busy and idle ticks.
    pub busy_cycles: AtomicU64,
    /// See [`WorkerStats::busy_cycles`].
    pub idle_cycles: AtomicU64,
    /// Set when the worker thread has exited.
    pub exited: AtomicBool,
}

impl WorkerStats {
    /// Adds `v` to a counter. Each worker's counters have one writer, the
    /// worker thread (readers only load them), so a plain load and store
    /// is exact and costs no locked read-modify-write: a handful of these
    /// run on every message's path.
    #[inline]
    pub fn add(c: &AtomicU64, v: u64) {
        c.store(c.load(Ordering::Relaxed).wrapping_add(v), Ordering::Relaxed);
    }

    /// A plain-value snapshot.
    pub fn snapshot(&self) -> WorkerStatsSnapshot {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        WorkerStatsSnapshot {
            connections: g(&self.connections),
            connections_total: g(&self.connections_total),
            messages_in: g(&self.messages_in),
            messages_out: g(&self.messages_out),
            bytes_in: g(&self.bytes_in),
            bytes_out: g(&self.bytes_out),
            credit_stalls: g(&self.credit_stalls),
            rnr: g(&self.rnr),
            protocol_errors: g(&self.protocol_errors),
            rdma_errors: g(&self.rdma_errors),
            pool_stalls: g(&self.pool_stalls),
            store_full: g(&self.store_full),
            store_copies_away: g(&self.store_copies_away),
            store_copies_kept: g(&self.store_copies_kept),
            timeouts: g(&self.timeouts),
            sessions: g(&self.sessions),
            opens: g(&self.opens),
            qos_queued: g(&self.qos_queued),
            idle_sleeps: g(&self.idle_sleeps),
            rdma_read_bytes: g(&self.rdma_read_bytes),
            rdma_write_bytes: g(&self.rdma_write_bytes),
            rdma_posts: g(&self.rdma_posts),
            replies_chained: g(&self.replies_chained),
            rdma_table_waits: g(&self.rdma_table_waits),
            busy_cycles: g(&self.busy_cycles),
            idle_cycles: g(&self.idle_cycles),
        }
    }
}

/// Plain values of [`WorkerStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerStatsSnapshot {
    /// Live connections.
    pub connections: u64,
    /// Connections accepted over the worker's life.
    pub connections_total: u64,
    /// Upper-layer messages received.
    pub messages_in: u64,
    /// Upper-layer messages sent.
    pub messages_out: u64,
    /// Upper-layer bytes received.
    pub bytes_in: u64,
    /// Upper-layer bytes sent.
    pub bytes_out: u64,
    /// Credit stalls.
    pub credit_stalls: u64,
    /// RNR failures.
    pub rnr: u64,
    /// Protocol violations.
    pub protocol_errors: u64,
    /// Other RDMA errors.
    pub rdma_errors: u64,
    /// Pool stalls.
    pub pool_stalls: u64,
    /// Requests refused with STATUS_DISK_FULL.
    pub store_full: u64,
    /// Large store copies made on a copy core.
    pub store_copies_away: u64,
    /// Large store copies made on the worker.
    pub store_copies_kept: u64,
    /// Timer terminations.
    pub timeouts: u64,
    /// SMB2 sessions.
    pub sessions: u64,
    /// SMB2 Opens.
    pub opens: u64,
    /// Requests waiting in QoS queues.
    pub qos_queued: u64,
    /// Idle sleeps on the completion queue's wake-up descriptor.
    pub idle_sleeps: u64,
    /// Bytes RDMA Read from peers.
    pub rdma_read_bytes: u64,
    /// Bytes RDMA Written to peers.
    pub rdma_write_bytes: u64,
    /// `post_send` calls carrying RDMA requests.
    pub rdma_posts: u64,
    /// READ responses posted with their RDMA Write.
    pub replies_chained: u64,
    /// Messages that waited for a free RDMA operation slot.
    pub rdma_table_waits: u64,
    /// Poll-loop cycles with work ([`WorkerStats::busy_cycles`]).
    pub busy_cycles: u64,
    /// Poll-loop cycles without work.
    pub idle_cycles: u64,
}

impl WorkerStatsSnapshot {
    /// The share of poll-loop cycles that found work since `prev` (None
    /// when no cycles were counted in between).
    pub fn busy_fraction_since(&self, prev: &WorkerStatsSnapshot) -> Option<f64> {
        crate::clock::busy_share(
            self.busy_cycles.saturating_sub(prev.busy_cycles),
            self.idle_cycles.saturating_sub(prev.idle_cycles),
        )
    }
}

impl core::ops::AddAssign for WorkerStatsSnapshot {
    fn add_assign(&mut self, o: Self) {
        self.connections += o.connections;
        self.connections_total += o.connections_total;
        self.messages_in += o.messages_in;
        self.messages_out += o.messages_out;
        self.bytes_in += o.bytes_in;
        self.bytes_out += o.bytes_out;
        self.credit_stalls += o.credit_stalls;
        self.rnr += o.rnr;
        self.protocol_errors += o.protocol_errors;
        self.rdma_errors += o.rdma_errors;
        self.pool_stalls += o.pool_stalls;
        self.store_full += o.store_full;
        self.store_copies_away += o.store_copies_away;
        self.store_copies_kept += o.store_copies_kept;
        self.timeouts += o.timeouts;
        self.sessions += o.sessions;
        self.opens += o.opens;
        self.qos_queued += o.qos_queued;
        self.idle_sleeps += o.idle_sleeps;
        self.rdma_read_bytes += o.rdma_read_bytes;
        self.rdma_write_bytes += o.rdma_write_bytes;
        self.rdma_posts += o.rdma_posts;
        self.replies_chained += o.replies_chained;
        self.rdma_table_waits += o.rdma_table_waits;
        self.busy_cycles += o.busy_cycles;
        self.idle_cycles += o.idle_cycles;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_doorbell_rings_only_an_armed_sleeper_and_disarming_consumes_it() {
        let bell = Doorbell::new().expect("eventfd");
        // Not armed: ringing costs no write, the descriptor stays quiet.
        bell.ring();
        assert_eq!(wait_readable(&[bell.fd()], Duration::ZERO), 0);
        bell.arm();
        bell.ring();
        bell.ring();
        assert_eq!(wait_readable(&[bell.fd()], Duration::ZERO), 1);
        bell.disarm(true);
        assert_eq!(wait_readable(&[bell.fd()], Duration::ZERO), 0, "consumed");
        bell.ring();
        assert_eq!(wait_readable(&[bell.fd()], Duration::ZERO), 0, "disarmed");
    }

    #[test]
    fn a_message_pushed_while_the_consumer_sleeps_wakes_it() {
        let r: Ring<u32> = ring(4);
        let bell = Doorbell::new().expect("eventfd");
        for round in 0..20u32 {
            let producer = {
                let (r, bell) = (r.clone(), bell.clone());
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(u64::from(round % 3)));
                    r.push(round).expect("room");
                    bell.ring();
                })
            };
            // The consumer's protocol: arm, look, sleep, disarm. Either the
            // look finds the message or the sleep ends rung; never a sleep
            // to the (long) timeout with the message waiting.
            bell.arm();
            let got = match r.pop() {
                Some(v) => v,
                None => {
                    let woke = wait_readable(&[bell.fd()], Duration::from_secs(30));
                    assert_eq!(woke, 1, "round {round}: slept to the timeout");
                    r.pop().expect("the message that rang")
                }
            };
            bell.disarm(wait_readable(&[bell.fd()], Duration::ZERO) != 0);
            assert_eq!(got, round);
            producer.join().expect("producer");
        }
    }

    #[test]
    fn wait_readable_reports_each_descriptor_and_ignores_negative_ones() {
        let a = Doorbell::new().expect("eventfd");
        let b = Doorbell::new().expect("eventfd");
        b.arm();
        b.ring();
        assert_eq!(wait_readable(&[a.fd(), -1, b.fd()], Duration::ZERO), 0b100);
        assert_eq!(wait_readable(&[], Duration::from_millis(1)), 0);
    }
}
