//! A pinned poll-mode worker (SPDK reactor style): one thread per core, owning
//! its completion queue, its queue pairs, its slice of the registered buffer
//! pool, and the SMB Direct state of every connection on it. Its loop runs to
//! completion: poll completions in batches, step each connection's state
//! machine, post receives/sends, drain the control plane's ring, fire timers.
//! Nothing on this path locks, blocks or allocates once connections are
//! attached; what other threads read (stats) is published through atomics.
//!
//! RDMA for the upper layer: each connection gets a fixed table of RDMA
//! operations when it is attached ([`crate::endpoint::RdmaOps`]); the upper
//! layer requests Reads and Writes through [`Replies`], the endpoint posts
//! them (bounded by ORD and the send queue) whenever the connection is
//! flushed, and finished ones go back to the upper layer
//! ([`UpperLayer::on_rdma_complete`]) before any newer message, so it can
//! reply. A failed RDMA operation fails its connection only.
//!
//! Idle policy: busy-poll, and only after `idle_park` without work stop
//! spinning ([`IdleMode`]): by default, where the provider can wake a
//! sleeper (verbs: a completion channel), sleep until the next completion
//! or for [`IDLE_SLEEP`] at most, whichever comes first; elsewhere (the soft
//! provider, or [`IdleMode::Nap`]) nap [`IDLE_NAP`] at a time. Any
//! completion or ring message returns it to busy-polling at once. A sleep
//! is taken only with nothing left to do but wait for the peer: no
//! connection with messages, wakes or transmits waiting, no upper-layer
//! background work ([`UpperLayer::busy`]: store operations in flight,
//! requests queued for QoS tokens), nothing for the control plane, not
//! shutting down. Sleeping follows the rdma-core pattern: arm the
//! completion queue (`ibv_req_notify_cq`), run one more full iteration (a
//! completion that arrived before the arm raises no event), then `poll(2)`
//! the channel's descriptor; the events are read and acknowledged after.
//! The control plane rings the worker's [`Doorbell`] after pushing to its
//! ring ([`Worker::with_doorbells`]; the worker polls it with the channel),
//! so a message wakes it at once and a sleep may last [`IDLE_SLEEP_RUNG`],
//! the lateness its timers accept; without a doorbell a sleep lasts
//! [`IDLE_SLEEP`] at most, the delay a ring message may then see. An idle
//! worker thus wakes 100 times a second, not 1,000: where every system
//! call is expensive (the Soft-RoCE guest), an idle server's workers and
//! control plane had used half a vCPU between them.

use crate::capture::{CaptureConn, CaptureHandle};
use crate::endpoint::{
    recv_wr_buf, Delivery, Endpoint, EndpointError, Event, RdmaStats, INLINE_AUX,
    RDMA_OPS_PER_CONNECTION,
};
use crate::idhash::{id_map, IdMap};
use crate::marks::{self, Point};
use crate::planes::{
    wait_readable, CloseReason, ConnId, Doorbell, FromWorker, Ring, ToWorker, WorkerStats,
    LOANED_RECEIVES,
};
use crate::provider::{
    Completion, CompletionQueue, MemoryRegion, Provider, QpId, QpState, QueuePair, WcOpcode,
    WcStatus,
};
use crate::upper::{Backpressure, QueuedReply, RdmaDone, Replies, UpperIo, UpperLayer};
use smbdirect_hugepages::{BufId, BufferPool, ClassId, SliceAllocator};
use smbdirect_protocol::smbd::{Connection, SmbdConfig, TerminateReason};
use smbdirect_protocol::time::Instant as PInstant;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Completions taken per poll.
pub const POLL_BATCH: usize = 32;
/// Loop iterations without work between clock reads. A read costs tens of
/// nanoseconds, as much as an idle iteration: reading it every iteration was
/// ~10 % of a worker's samples and lengthened the delay before a completion
/// is seen. The clock is read at the start of every iteration that follows
/// one with work, so the time an iteration's work sees lags the real one by
/// at most this many idle iterations (about a microsecond); the timers it
/// drives ([MS-SMBD] 3.1.6, the 1 ms timer scan) are far coarser.
const CLOCK_IDLE_ITERATIONS: u32 = 16;
/// Replies an upper layer may queue per message.
const MAX_REPLIES: usize = 4;
/// Longest idle sleep on the completion queue's descriptor: how late a
/// control-plane ring message or a timer may be seen by a sleeping worker.
pub const IDLE_SLEEP: Duration = Duration::from_millis(1);
/// The longest idle sleep of a worker whose control plane rings its
/// doorbell ([`Worker::with_doorbells`]): ring messages wake it, so only
/// its timers bound the sleep (keepalive and negotiation timers of
/// seconds, [MS-SMBD] 3.1.6; they fire up to this late).
pub const IDLE_SLEEP_RUNG: Duration = Duration::from_millis(10);
/// The same for a worker with no connection (no timers at all).
pub const IDLE_SLEEP_EMPTY: Duration = Duration::from_millis(100);
/// One idle nap where the worker cannot sleep on its completion queue.
pub const IDLE_NAP: Duration = Duration::from_micros(50);

/// What an idle worker does once `idle_park` has passed without work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IdleMode {
    /// Sleep until the next completion ([`IDLE_SLEEP`] at most) where the
    /// provider supports it ([`CompletionQueue::arm`]), else nap.
    #[default]
    Sleep,
    /// Nap [`IDLE_NAP`] at a time, polling in between.
    Nap,
}

/// How a worker runs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Worker index (thread name `dp-worker-N`).
    pub index: usize,
    /// Core to pin to.
    pub core: Option<usize>,
    /// SMB Direct parameters for new connections.
    pub smbd: SmbdConfig,
    /// Busy-poll this long without work before napping or sleeping.
    pub idle_park: Duration,
    /// Nap or sleep once idle.
    pub idle: IdleMode,
    /// Most connections this worker holds.
    pub max_connections: usize,
    /// After Shutdown, how long in-flight work may take before everything is
    /// disconnected.
    pub shutdown_grace: Duration,
    /// Sends in flight per connection (the queue pair's send depth).
    pub send_depth: u32,
    /// SGEs per work request of the connections' queue pairs.
    pub max_sge: u32,
}

struct Slot<Q: QueuePair> {
    conn: ConnId,
    ep: Endpoint<Q>,
    deferred: VecDeque<Delivery>,
    dirty: bool,
    closing: Option<CloseReason>,
    next_timer: Option<PInstant>,
    /// Messages the upper layer holds ([`Replies::hold`]), by token.
    held: Vec<(u64, Delivery)>,
    /// Tokens woken by the upper layer, oldest first.
    wakes: VecDeque<u64>,
    /// The endpoint's receive shortfalls already added to `pool_stalls`.
    shortfalls_seen: u64,
    /// The endpoint's RDMA counters already added to the worker's.
    rdma_seen: RdmaStats,
    /// Delivery is waiting for a free slot in the connection's RDMA
    /// operation table (counted once per wait in `rdma_table_waits`).
    rdma_wait: bool,
    /// The upper layer pushed back (a pool buffer, a send-queue entry or
    /// an RDMA slot missing) when the worker's progress count stood at
    /// this value: its calls wait until the count moves ([`Worker::
    /// progress`]), not for the next turn of the loop.
    stalled: Option<u64>,
}

impl<Q: QueuePair> Slot<Q> {
    /// Receives the endpoint could not post for want of a buffer since the
    /// last call (they count as pool stalls).
    fn new_shortfalls(&mut self) -> u64 {
        let now = self.ep.stats().receive_shortfalls;
        let d = now - self.shortfalls_seen;
        self.shortfalls_seen = now;
        d
    }

    /// Whether a service pass would find nothing to do for this connection
    /// now: no message, wake or RDMA operation waiting for the upper layer
    /// or the provider, nothing for the connection to transmit (queued
    /// messages, a grant, a keepalive answer), no receive shortfall not yet
    /// counted, not closing. True after an express delivery whose replies
    /// all went out at once.
    fn settled(&self) -> bool {
        self.closing.is_none()
            && self.deferred.is_empty()
            && self.wakes.is_empty()
            && !self.ep.connection().transmit_pending()
            && self.ep.stats().receive_shortfalls == self.shortfalls_seen
            && self
                .ep
                .rdma()
                .map_or(true, |r| r.waiting() == 0 && r.peek_done().is_none())
    }

    /// Adds what the connection's RDMA counters gained since the last call
    /// to the worker's (after a flush, and at close).
    fn add_rdma_stats(&mut self, stats: &WorkerStats) {
        let Some(now) = self.ep.rdma().map(|r| *r.stats()) else {
            return;
        };
        let was = core::mem::replace(&mut self.rdma_seen, now);
        if now == was {
            return;
        }
        WorkerStats::add(&stats.rdma_read_bytes, now.bytes_read - was.bytes_read);
        WorkerStats::add(
            &stats.rdma_write_bytes,
            now.bytes_written - was.bytes_written,
        );
        WorkerStats::add(&stats.rdma_posts, now.chains_posted - was.chains_posted);
        WorkerStats::add(
            &stats.replies_chained,
            now.replies_chained - was.replies_chained,
        );
    }
}

/// The worker's state; [`Worker::run`] is its thread body.
pub struct Worker<P: Provider, U: UpperLayer> {
    cfg: WorkerConfig,
    cq: P::Cq,
    alloc: SliceAllocator,
    pool: BufferPool,
    mr: MemoryRegion,
    upper: U,
    inbox: Ring<ToWorker<P::Qp>>,
    outbox: Ring<FromWorker>,
    loans: Ring<u64>,
    stats: Arc<WorkerStats>,
    slots: Vec<Option<Slot<P::Qp>>>,
    /// Bit `i` set: `slots[i]` is occupied (what the per-iteration service
    /// walks, instead of every slot: a slot is ~1 KB, and scanning 256 of
    /// them each loop iteration was ~40 % of a worker's samples at 4 KiB
    /// READs).
    occupied: Vec<u64>,
    by_qp: IdMap<QpId, usize>,
    by_conn: IdMap<ConnId, usize>,
    /// Wakes and events the upper layer produced in its last poll.
    upper_wakes: VecDeque<(ConnId, u64)>,
    upper_events: VecDeque<crate::planes::UpperEvent>,
    /// Its start, in [`crate::clock::now_ns`]'s count.
    origin: u64,
    shutdown_at: Option<Instant>,
    pending_out: VecDeque<FromWorker>,
    /// Completions of queue pairs whose Attach has not been drained from the
    /// control plane's ring yet (the peer may send its Negotiate Request the
    /// moment the accept completes). Retried after the ring is drained.
    orphans: VecDeque<Completion>,
    /// Queue pairs refused at attach (no free slot) whose negotiate
    /// receive, posted by the control plane with a buffer of this slice,
    /// has not come back yet: kept (disconnected) until it flushes, so
    /// the buffer goes home and the completion is not left circulating
    /// among the orphans (a verbs provider may also discard the
    /// completions of a queue pair destroyed early).
    refused: Vec<P::Qp>,
    capture: Option<Arc<CaptureHandle>>,
    /// RDMA operations per connection (table size, allocated at attach).
    rdma_ops: usize,
    /// The clock, read once per poll-loop iteration (a clock read costs
    /// tens of nanoseconds; everything in one iteration shares it).
    loop_now: PInstant,
    /// Rung by the control plane after it pushes to `inbox`: lets a
    /// sleeping worker sleep past [`IDLE_SLEEP`] (see the module docs).
    bell: Option<Arc<Doorbell>>,
    /// The control plane's doorbell, rung after pushing to `outbox`.
    cp_bell: Option<Arc<Doorbell>>,
    /// Something was pushed to `outbox` since the control plane's doorbell
    /// was last rung.
    told: bool,
    /// Something may have changed a slot since [`Worker::service_slots`]
    /// last left every slot with nothing to do (a completion, a control
    /// message, an upper-layer wake, a timer): only then does the loop walk
    /// the slots. An idle iteration is a completion poll and little else,
    /// so a message arriving is noticed sooner.
    needs_service: bool,
    /// The slot of the queue pair whose completion came last (completions
    /// come in runs per queue pair): `by_qp` is looked up only on a change.
    /// Forgotten when a slot is freed.
    last_qp: Option<(QpId, usize)>,
    /// Counts what may have freed a resource the upper layer was refused:
    /// a poll that returned completions (Sends give back send-queue
    /// entries and buffers, RDMA operations their table slots and data
    /// buffers), a control message (a close, a buffer handed back), a
    /// connection closed, an upper-layer poll that woke held requests
    /// (its background work finished), the 1 ms timer scan (buffers freed
    /// elsewhere, e.g. by another thread, at the latest). A call refused for want of
    /// one ([`Slot::stalled`], [`UpperIo::wake_when_freed`]) is made again
    /// only once this moved: before, it was made again on every turn of
    /// the loop, executing the request from scratch each time.
    progress: u64,
    /// A slot stalled at the current `progress` (the next move of it asks
    /// for a service pass).
    stall_waiting: bool,
    /// Tokens the upper layer asked to be woken once `progress` moves
    /// ([`UpperIo::wake_when_freed`]), with the count they were refused
    /// at, oldest first.
    parked: VecDeque<(ConnId, u64, u64)>,
    /// The progress count at the first upper-layer call since its last
    /// poll: what a token it parks in that poll was refused at (the
    /// refusal happened in such a call; the count may have moved since,
    /// and then the token is due at once).
    calls_from: Option<u64>,
}

impl<P: Provider, U: UpperLayer> core::fmt::Debug for Worker<P, U> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Worker")
            .field("index", &self.cfg.index)
            .field("upper", &self.upper.name())
            .finish()
    }
}

impl<P: Provider, U: UpperLayer> Worker<P, U> {
    /// Builds a worker around its CQ, pool slice (registered as `mr`),
    /// upper layer and rings. Everything it needs is allocated here.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cfg: WorkerConfig,
        cq: P::Cq,
        alloc: SliceAllocator,
        mr: MemoryRegion,
        upper: U,
        inbox: Ring<ToWorker<P::Qp>>,
        outbox: Ring<FromWorker>,
        loans: Ring<u64>,
        stats: Arc<WorkerStats>,
    ) -> Self {
        let pool = alloc.pool().clone();
        let mut slots = Vec::with_capacity(cfg.max_connections);
        slots.resize_with(cfg.max_connections, || None);
        Worker {
            occupied: vec![0; cfg.max_connections.div_ceil(64)],
            by_qp: id_map(cfg.max_connections * 2),
            by_conn: id_map(cfg.max_connections * 2),
            upper_wakes: VecDeque::with_capacity(4096),
            upper_events: VecDeque::with_capacity(1024),
            pending_out: VecDeque::with_capacity(cfg.max_connections * 4 + 16),
            orphans: VecDeque::with_capacity(cfg.max_connections * 2 + 16),
            refused: Vec::with_capacity(16),
            capture: None,
            rdma_ops: RDMA_OPS_PER_CONNECTION,
            cfg,
            cq,
            alloc,
            pool,
            mr,
            upper,
            inbox,
            outbox,
            loans,
            stats,
            slots,
            origin: crate::clock::now_ns(),
            loop_now: PInstant::ZERO,
            shutdown_at: None,
            bell: None,
            cp_bell: None,
            told: false,
            needs_service: true,
            last_qp: None,
            progress: 0,
            stall_waiting: false,
            parked: VecDeque::with_capacity(1024),
            calls_from: None,
        }
    }

    /// Doorbells: `own`, which the control plane rings after pushing to this
    /// worker's inbox (a sleep may then last [`IDLE_SLEEP_RUNG`]), and the
    /// control plane's, rung after pushing to its ring.
    pub fn with_doorbells(mut self, own: Arc<Doorbell>, cp: Arc<Doorbell>) -> Self {
        self.bell = Some(own);
        self.cp_bell = Some(cp);
        self
    }

    /// Records every message of every connection into `capture`.
    pub fn with_capture(mut self, capture: Option<Arc<CaptureHandle>>) -> Self {
        self.capture = capture;
        self
    }

    /// Sizes each connection's table of RDMA operations (default
    /// [`RDMA_OPS_PER_CONNECTION`]); more requests wait as backpressure.
    pub fn with_rdma_ops_per_connection(mut self, n: usize) -> Self {
        self.rdma_ops = n.max(1);
        self
    }

    fn now(&self) -> PInstant {
        self.loop_now
    }

    fn tell_cp(&mut self, m: FromWorker) {
        // A full ring is backpressure: keep the message (bounded by the
        // connections we hold) and retry every loop.
        match self.outbox.push(m) {
            Ok(()) => self.told = true,
            Err(m) => self.pending_out.push_back(m),
        }
    }

    fn flush_pending_out(&mut self) {
        while let Some(m) = self.pending_out.pop_front() {
            if let Err(m) = self.outbox.push(m) {
                self.pending_out.push_front(m);
                break;
            }
            self.told = true;
        }
        if std::mem::take(&mut self.told) {
            if let Some(b) = &self.cp_bell {
                b.ring();
            }
        }
    }

    /// Sleeps until a completion (`cq_fd` readable), a control-plane
    /// message (with a doorbell) or the timeout: [`IDLE_SLEEP_RUNG`] where
    /// the control plane rings, else [`IDLE_SLEEP`].
    fn sleep(&self, cq_fd: std::os::fd::RawFd) {
        match &self.bell {
            Some(bell) => {
                bell.arm();
                // The last look: a message pushed before the arm rang no one.
                // With no connection there are no timers: only a ring
                // message (an Attach) can give the worker work.
                let timeout = if self.occupied.iter().all(|&w| w == 0) {
                    IDLE_SLEEP_EMPTY
                } else {
                    IDLE_SLEEP_RUNG
                };
                let rung =
                    self.inbox.is_empty() && wait_readable(&[cq_fd, bell.fd()], timeout) & 2 != 0;
                bell.disarm(rung);
            }
            None => {
                wait_readable(&[cq_fd], IDLE_SLEEP);
            }
        }
    }

    /// The thread body: pins, names nothing (the spawner names the thread),
    /// and loops until shut down and drained.
    pub fn run(self) {
        self.run_reporting(|| {});
    }

    /// [`Worker::run`], calling `ready` once the thread is pinned (so the
    /// spawner can report the daemon up only when its threads are in place).
    pub fn run_reporting(mut self, ready: impl FnOnce()) {
        if let Some(core) = self.cfg.core {
            core_affinity::set_for_current(core_affinity::CoreId { id: core });
        }
        // Lend the control plane its receive buffers before reporting ready:
        // a connection may arrive the moment the daemon says it serves.
        self.refill_loans();
        marks::set_server_thread();
        ready();
        let mut wcs = [Completion::EMPTY; POLL_BATCH];
        // The timer scan and idle checks compare nanoseconds since `origin`
        // (no further Duration arithmetic on the hot loop); the clock
        // (crate::clock::now: the TSC where clock_gettime is a system call)
        // is read only as CLOCK_IDLE_ITERATIONS says.
        let origin = self.origin;
        let nanos = move || crate::clock::now_ns().saturating_sub(origin);
        let timer_scan = Duration::from_millis(1).as_nanos() as u64;
        let idle_park = self.cfg.idle_park.as_nanos() as u64;
        let mut last_work = nanos();
        let mut last_timer_scan = last_work;
        let mut tick = last_work;
        // Iterations since the clock was read, and whether the last one
        // worked (see CLOCK_IDLE_ITERATIONS).
        let mut idle_iterations = 0u32;
        let mut worked = true;
        // The completion queue was armed and one full iteration has run
        // since without work: the worker may sleep.
        let mut armed = false;
        // Stretched where a clock read is a system call (crate::clock).
        let clock_idle_iterations = crate::clock::idle_polls_per_read(CLOCK_IDLE_ITERATIONS);
        // Busy and idle cycles (WorkerStats::busy_cycles): each iteration
        // is charged to one or the other by whether it found work.
        let mut meter = crate::clock::BusyMeter::new();
        loop {
            if worked || idle_iterations >= clock_idle_iterations {
                tick = nanos();
                self.loop_now = PInstant::from_nanos(tick);
                idle_iterations = 0;
            } else {
                idle_iterations += 1;
            }
            let mut work = false;
            // The connection heard from last is the likeliest to hear again.
            if let Some((_, i)) = self.last_qp {
                if let Some(slot) = self.slots[i].as_ref() {
                    slot.ep.prefetch_next_receive();
                }
            }
            let n = self.cq.poll(&mut wcs);
            if n > 0 {
                work = true;
                self.progressed();
                // `on_completion` asks for the service pass where a
                // completion left something to do.
                let now = self.now();
                for wc in &wcs[..n] {
                    self.on_completion(now, wc);
                }
            }
            if !self.inbox.is_empty() {
                self.progressed();
                while let Some(m) = self.inbox.pop() {
                    work = true;
                    self.needs_service = true;
                    self.on_control(m);
                }
            }
            if !self.orphans.is_empty() {
                self.needs_service = true;
                let now = self.now();
                for _ in 0..self.orphans.len() {
                    let Some(wc) = self.orphans.pop_front() else {
                        break;
                    };
                    self.on_completion(now, &wc);
                }
            }
            if self.poll_upper() {
                work = true;
                self.needs_service = true;
            }
            if self.needs_service && self.service_slots() {
                work = true;
            }
            if tick.saturating_sub(last_timer_scan) >= timer_scan {
                last_timer_scan = tick;
                self.fire_timers();
                self.progressed();
                self.needs_service = true;
            }
            self.flush_pending_out();
            // With the clock: after work, and every few idle iterations (the
            // control plane takes a loan per arriving connection).
            if self.shutdown_at.is_none() && idle_iterations == 0 {
                self.refill_loans();
            }
            if let Some(t) = self.shutdown_at {
                self.needs_service = true;
                // A refused queue pair's receive comes back once flushed;
                // past the grace period it is not waited for.
                if self.live_slots() == 0
                    && self.pending_out.is_empty()
                    && (self.refused.is_empty() || t.elapsed() >= self.cfg.shutdown_grace)
                {
                    break;
                }
                if t.elapsed() >= self.cfg.shutdown_grace {
                    self.close_all(CloseReason::Shutdown);
                }
            }
            worked = work;
            if work {
                last_work = tick;
                armed = false;
                WorkerStats::add(&self.stats.busy_polls, 1);
            } else if tick.saturating_sub(last_work) >= idle_park {
                let fd = (self.cfg.idle == IdleMode::Sleep && self.may_sleep())
                    .then(|| self.cq.arm())
                    .flatten();
                match fd {
                    // Armed just now: one more iteration before sleeping.
                    Some(_) if !armed => armed = true,
                    Some(fd) => {
                        self.sleep(fd);
                        meter.waited();
                        self.cq.disarm();
                        WorkerStats::add(&self.stats.idle_sleeps, 1);
                        // Arm (a no-op if still armed) and look once more
                        // before the next sleep.
                        armed = false;
                        worked = true; // read the clock again
                    }
                    None => {
                        armed = false;
                        std::thread::sleep(IDLE_NAP);
                        meter.waited();
                        worked = true; // the nap was long: read the clock again
                    }
                }
            } else {
                std::hint::spin_loop();
            }
            // The iteration, with its pause or sleep, was busy or idle (the
            // meter reads the TSC after work, a wait, or a run of idle ones).
            meter.charge(work, &self.stats.busy_cycles, &self.stats.idle_cycles);
        }
        // Take back the receive buffers lent to the control plane.
        while let Some(bits) = self.loans.pop() {
            let _ = self.alloc.free(BufId::from_bits(bits));
        }
        self.stats.exited.store(true, Ordering::Release);
    }

    /// Nothing to do but wait for the peer (see the module docs).
    fn may_sleep(&self) -> bool {
        if self.shutdown_at.is_some()
            || !self.orphans.is_empty()
            || !self.refused.is_empty()
            || !self.pending_out.is_empty()
            || !self.inbox.is_empty()
            || !self.parked.is_empty()
            || self.stall_waiting
            || self.upper.busy()
        {
            return false;
        }
        let mut from = 0;
        while let Some(i) = next_set_bit(&self.occupied, from) {
            from = i + 1;
            if let Some(slot) = &self.slots[i] {
                if slot.dirty
                    || slot.closing.is_some()
                    || !slot.deferred.is_empty()
                    || !slot.wakes.is_empty()
                {
                    return false;
                }
            }
        }
        true
    }

    fn refill_loans(&mut self) {
        while self.loans.len() < LOANED_RECEIVES {
            let Ok(id) = self.alloc.alloc(ClassId::RECEIVE) else {
                break;
            };
            if let Err(bits) = self.loans.push(id.to_bits()) {
                let _ = self.alloc.free(BufId::from_bits(bits));
                break;
            }
        }
    }

    /// Something happened that may have freed what a stalled call lacked
    /// (see [`Worker::progress`]).
    #[inline]
    fn progressed(&mut self) {
        self.progress = self.progress.wrapping_add(1);
        if self.stall_waiting {
            self.stall_waiting = false;
            self.needs_service = true;
        }
    }

    fn live_slots(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    fn on_control(&mut self, m: ToWorker<P::Qp>) {
        match m {
            ToWorker::Attach {
                conn,
                qp,
                peer,
                negotiate_receive_posted,
            } => self.attach(conn, qp, peer, negotiate_receive_posted),
            ToWorker::Negotiated { conn, decision } => {
                let now = self.now();
                if let Some(i) = self.find(conn) {
                    let slot = self.slots[i].as_mut().expect("found slot");
                    if let Err(e) = slot
                        .ep
                        .apply_negotiate_decision(now, decision, &mut self.alloc)
                    {
                        slot.closing.get_or_insert(close_reason(e));
                    }
                    slot.dirty = true;
                }
            }
            ToWorker::Shutdown => {
                if self.shutdown_at.is_none() {
                    self.shutdown_at = Some(Instant::now());
                }
            }
            ToWorker::Upper(m) => self.upper.on_control(m),
        }
    }

    fn find(&self, conn: ConnId) -> Option<usize> {
        self.by_conn.get(&conn).copied()
    }

    /// Lets the upper layer reap background work; routes its wakes to the
    /// connections and its events to the control plane.
    fn poll_upper(&mut self) -> bool {
        let now = self.now();
        // What the ring to the control plane takes now; nothing while
        // earlier messages wait for room.
        let control_room = if self.pending_out.is_empty() {
            self.outbox.capacity() - self.outbox.len()
        } else {
            0
        };
        let parked_at = self.calls_from.take().unwrap_or(self.progress);
        let mut io = UpperIo {
            wakes: &mut self.upper_wakes,
            parked: &mut self.parked,
            parked_at,
            events: &mut self.upper_events,
            stats: &self.stats,
            control_room,
        };
        let mut any = self.upper.poll(now, &mut io);
        if !self.upper_wakes.is_empty() {
            // The layer finished background work (a store operation, a
            // QoS dispatch, an answer from the control plane): it may have
            // freed buffers too.
            self.progressed();
        }
        // Parked tokens are due once the progress count moved past the
        // one they were parked at (in order: the counts only grow).
        while let Some(&(conn, token, at)) = self.parked.front() {
            if at == self.progress {
                break; // the ones behind it were parked later
            }
            self.parked.pop_front();
            self.upper_wakes.push_back((conn, token));
        }
        while let Some((conn, token)) = self.upper_wakes.pop_front() {
            any = true;
            if let Some(&i) = self.by_conn.get(&conn) {
                if let Some(slot) = self.slots[i].as_mut() {
                    slot.wakes.push_back(token);
                    slot.dirty = true;
                }
            }
        }
        while let Some(ev) = self.upper_events.pop_front() {
            any = true;
            self.tell_cp(FromWorker::Upper(ev));
        }
        any
    }

    fn attach(
        &mut self,
        conn: ConnId,
        mut qp: P::Qp,
        peer: std::net::SocketAddr,
        receive_posted: bool,
    ) {
        let Some(i) = self.slots.iter().position(|s| s.is_none()) else {
            qp.disconnect();
            if receive_posted {
                // Its receive flushes back through our CQ (set-up path: the
                // list may grow).
                self.refused.push(qp);
            }
            self.tell_cp(FromWorker::Closed {
                conn,
                reason: CloseReason::Capacity,
                peer_violation: false,
            });
            return;
        };
        let now = self.now();
        let c = Connection::new_passive(self.cfg.smbd.clone(), now);
        let qp_id = qp.id();
        let mut ep = Endpoint::new(qp, c, self.pool.clone(), self.mr);
        ep.defer_negotiation(true);
        ep.set_send_depth(self.cfg.send_depth);
        ep.enable_rdma(self.rdma_ops);
        ep.set_max_sge(self.cfg.max_sge);
        if let Some(h) = &self.capture {
            // The peer's QP number is not exposed by every provider: a
            // stable synthetic one keeps the two directions distinct.
            let c = CaptureConn::new(peer, qp_id.0, qp_id.0 ^ 0x00ff_ffff);
            ep.set_capture(h.clone(), c);
        }
        let mut closing = None;
        if receive_posted {
            ep.assume_posted_receives(1);
        } else if !ep.post_negotiate_receive(&mut self.alloc) {
            // 3.1.7.2: "terminate the connection if it fails" (counted as a
            // pool stall: the endpoint's receive shortfall).
            ep.close(&mut self.alloc);
            closing = Some(CloseReason::Protocol(TerminateReason::NoReceiveCredits));
        }
        let deferred = VecDeque::with_capacity(self.cfg.smbd.receive_credit_max as usize + 2);
        // The 5 s Negotiation Timer runs from arrival ([MS-SMBD] 3.1.7.2),
        // whether or not the peer ever sends anything.
        let next_timer = ep.connection().poll_timeout();
        self.occupied[i / 64] |= 1 << (i % 64);
        self.slots[i] = Some(Slot {
            conn,
            ep,
            deferred,
            dirty: false,
            closing,
            next_timer,
            held: Vec::with_capacity(self.cfg.smbd.receive_credit_max as usize + 2),
            wakes: VecDeque::with_capacity(self.cfg.smbd.receive_credit_max as usize + 2),
            shortfalls_seen: 0,
            rdma_seen: RdmaStats::default(),
            rdma_wait: false,
            stalled: None,
        });
        self.by_qp.insert(qp_id, i);
        self.last_qp = None;
        self.by_conn.insert(conn, i);
        WorkerStats::add(&self.stats.connections, 1);
        WorkerStats::add(&self.stats.connections_total, 1);
    }

    fn on_completion(&mut self, now: PInstant, wc: &Completion) {
        let detected = marks::now();
        let i = match self.last_qp {
            Some((qp, i)) if qp == wc.qp => i,
            _ => {
                let Some(&i) = self.by_qp.get(&wc.qp) else {
                    if let Some(k) = self.refused.iter().position(|q| q.id() == wc.qp) {
                        // The one receive of a queue pair refused at attach:
                        // its buffer goes home, and the queue pair with it.
                        if let Some(b) = recv_wr_buf(wc.wr_id) {
                            let _ = self.alloc.free(b);
                        }
                        self.refused.swap_remove(k);
                        return;
                    }
                    // Its Attach is still in the ring (bounded: a new queue
                    // pair has only its negotiate receive posted until
                    // attached, and the control plane has at most a ring's
                    // worth of Attaches on their way).
                    if self.orphans.len() < self.orphans.capacity() {
                        self.orphans.push_back(*wc);
                    }
                    return;
                };
                self.last_qp = Some((wc.qp, i));
                i
            }
        };
        let Some(slot) = self.slots[i].as_mut() else {
            return;
        };
        let mut express = false;
        match slot.ep.on_completion(now, wc, &mut self.alloc) {
            // A Send finished: it gave back a send-queue entry (and maybe a
            // buffer), which matters only to a transmit that waits for one;
            // with none pending there is nothing to flush. Every other
            // completion (a receive's credits and grants, a finished RDMA
            // operation) may have changed what the connection says next.
            Ok(None) if wc.opcode == WcOpcode::Send && wc.status == WcStatus::Success => {
                slot.dirty |= slot.ep.connection().transmit_pending();
            }
            Ok(None) => slot.dirty = true,
            Ok(Some(Event::Message(d))) => {
                marks::mark_at(Point::ServerDetect, detected);
                slot.dirty = true;
                WorkerStats::add(&self.stats.messages_in, 1);
                WorkerStats::add(&self.stats.bytes_in, slot.ep.message_len(&d) as u64);
                slot.deferred.push_back(d);
                // Nothing older waits on this connection (no message, wake
                // or finished RDMA operation): hand the message to the
                // upper layer now, not after the rest of the poll batch,
                // the loop and the walk of every connection. The order is
                // the service pass's own.
                express = slot.deferred.len() == 1
                    && slot.wakes.is_empty()
                    && slot.closing.is_none()
                    && !slot.ep.rdma().is_some_and(|r| r.peek_done().is_some());
            }
            Ok(Some(Event::NegotiateRequest { bytes, len })) => {
                slot.dirty = true;
                let conn = slot.conn;
                self.tell_cp(FromWorker::NegotiateRequest { conn, bytes, len });
            }
            Err(e) => {
                slot.dirty = true;
                // A flushed completion (or the queue-pair state check of
                // `fire_timers`) only says the queue pair broke; the
                // completion of the request that broke it, polled later,
                // names why (e.g. RemoteAccessError): it is the reason
                // logged and counted.
                let reason = close_reason(e);
                let flushed = Some(CloseReason::Provider(WcStatus::Flushed));
                if slot.closing.is_none()
                    || (slot.closing == flushed
                        && matches!(reason, CloseReason::Provider(s) if s != WcStatus::Flushed))
                {
                    slot.closing = Some(reason);
                }
                if wc.status == WcStatus::RnrRetryExceeded {
                    WorkerStats::add(&self.stats.rnr, 1);
                }
            }
        }
        if express {
            // Its replies go out from here (`settle` posts a reply with
            // nothing ahead of it at once); the flush of what waits behind
            // (RDMA transfers above all) stays with the service pass, which
            // posts a whole poll batch's transfers together.
            self.deliver_deferred(i);
            if let Some(slot) = self.slots[i].as_mut() {
                if slot.settled() {
                    // Nothing left for the service pass (it would find
                    // nothing to flush and no counter moved): the message
                    // and its replies cost one pass of the connection's
                    // state, not two. Its timers may have moved.
                    slot.dirty = false;
                    slot.next_timer = slot.ep.connection().poll_timeout();
                }
            }
        }
        let Some(slot) = self.slots[i].as_ref() else {
            return;
        };
        if slot.dirty || slot.closing.is_some() || !slot.deferred.is_empty() {
            self.needs_service = true;
        }
    }

    /// Runs the upper layer on waiting messages, flushes transmits, reaps
    /// closed connections. Returns whether anything happened. Leaves
    /// `needs_service` set while a slot still has something to do
    /// (backpressure, a pool stall, a close waiting for completions).
    fn service_slots(&mut self) -> bool {
        let now = self.now();
        let progress = self.progress;
        self.calls_from.get_or_insert(progress);
        let mut any = false;
        let mut again = false;
        let mut from = 0;
        while let Some(i) = next_set_bit(&self.occupied, from) {
            from = i + 1;
            let Some(slot) = self.slots[i].as_mut() else {
                continue;
            };
            if slot.stalled.is_some_and(|p| p != progress) {
                slot.stalled = None;
            }
            if slot.closing.is_none() && slot.stalled.is_none() {
                // Finished RDMA operations first: they belong to requests
                // older than any message still waiting.
                while let Some(op) = slot.ep.rdma().and_then(|r| r.peek_done()) {
                    let space = slot.ep.connection().send_queue_space().min(MAX_REPLIES);
                    let mut queued = [QueuedReply::EMPTY; MAX_REPLIES];
                    let max_read_write = slot.ep.connection().params().max_read_write_size;
                    // SAFETY: the op is done: no work request of it is in
                    // flight and nothing writes its buffers until the
                    // handler returns (a write-back posts after commit).
                    let data = op
                        .data
                        .and_then(|d| unsafe { self.pool.bytes(d) })
                        .and_then(|b| b.get(..op.len as usize))
                        .unwrap_or(&[]);
                    let mut scratch = [0u8; INLINE_AUX];
                    let context = slot
                        .ep
                        .rdma()
                        .map_or(&[][..], |r| r.done_context(&self.pool, &op, &mut scratch));
                    let done = RdmaDone {
                        ticket: op.ticket,
                        kind: op.kind,
                        data,
                        len: op.len,
                        zero_copy: op.data.is_none(),
                        context,
                    };
                    let mut out = Replies::new(
                        &mut self.alloc,
                        &self.pool,
                        &mut queued[..space],
                        slot.ep.rdma_mut(),
                        max_read_write,
                        Some(op.slot),
                        None,
                    );
                    let r = self.upper.on_rdma_complete(slot.conn, &done, &mut out);
                    let o = CallOutcome::of(&out);
                    let ok = settle(
                        &mut slot.ep,
                        &mut self.alloc,
                        &self.stats,
                        &queued,
                        o,
                        r,
                        Some(op.slot),
                        &mut slot.closing,
                    );
                    if !ok {
                        slot.stalled = Some(progress);
                        break;
                    }
                    slot.dirty = true;
                    any = true;
                }
            }
            if slot.closing.is_none() && slot.stalled.is_none() {
                // Tokens the upper layer woke (held messages it can finish
                // now, or operations of its own), in wake order.
                while let Some(&token) = slot.wakes.front() {
                    let space = slot.ep.connection().send_queue_space().min(MAX_REPLIES);
                    let mut queued = [QueuedReply::EMPTY; MAX_REPLIES];
                    let max_read_write = slot.ep.connection().params().max_read_write_size;
                    let Slot { ep, held, .. } = slot;
                    let k = held.iter().position(|(t, _)| *t == token);
                    let (msg, rdma) = match k {
                        Some(k) => {
                            let (m, r) = ep.message_and_rdma(&held[k].1);
                            (Some(m), r)
                        }
                        None => (None, ep.rdma_mut()),
                    };
                    let mut out = Replies::new(
                        &mut self.alloc,
                        &self.pool,
                        &mut queued[..space],
                        rdma,
                        max_read_write,
                        None,
                        None,
                    );
                    let r = self.upper.on_wake(slot.conn, token, msg, &mut out);
                    let o = CallOutcome::of(&out);
                    let hold = o.hold;
                    let ok = settle(
                        &mut slot.ep,
                        &mut self.alloc,
                        &self.stats,
                        &queued,
                        o,
                        r,
                        None,
                        &mut slot.closing,
                    );
                    if !ok {
                        slot.stalled = Some(progress);
                        break;
                    }
                    slot.wakes.pop_front();
                    if let Some(k) = k {
                        match hold {
                            Some(t) => slot.held[k].0 = t,
                            None => {
                                let (_, d) = slot.held.swap_remove(k);
                                slot.ep.release(d, &mut self.alloc);
                            }
                        }
                    }
                    slot.dirty = true;
                    any = true;
                }
            }
            any |= self.deliver_deferred(i);
            any |= self.flush_slot(i, now);
            let Some(slot) = self.slots[i].as_mut() else {
                continue;
            };
            if slot.stalled.is_some() {
                // Refused for a resource: looked at again once something
                // may have freed one (`progressed`), not on the next turn.
                self.stall_waiting = true;
                again |= slot.closing.is_some();
            } else {
                again |= slot.dirty
                    || slot.closing.is_some()
                    || !slot.deferred.is_empty()
                    || !slot.wakes.is_empty()
                    || slot.ep.rdma().is_some_and(|r| r.peek_done().is_some());
            }
            if let Some(reason) = slot.closing {
                self.finish_close(i, reason);
            }
        }
        // A connection closed in this pass moved the count: a slot that
        // stalled before it may go on.
        self.needs_service = again || self.progress != progress;
        any
    }

    /// Hands slot `i`'s waiting messages to the upper layer, oldest first,
    /// until it pushes back. Returns whether it took any.
    fn deliver_deferred(&mut self, i: usize) -> bool {
        let Some(slot) = self.slots[i].as_mut() else {
            return false;
        };
        let mut any = false;
        if slot.closing.is_some() || slot.stalled == Some(self.progress) {
            return false;
        }
        self.calls_from.get_or_insert(self.progress);
        while let Some(d) = slot.deferred.front() {
            // Intake follows the RDMA engine: with every operation slot of
            // the connection taken, a request that needs one could only be
            // refused (RdmaBusy) and run again from a wake, as often as the
            // loop turns, until a transfer finishes: at 64 READs in flight
            // against a table of 32 that doubled the worker's cost per
            // READ. The message waits here instead, in order, until a
            // finished operation frees a slot (its completion marks the
            // slot for service). A connection whose upper layer uses no
            // RDMA never fills its table.
            if slot.ep.rdma().is_some_and(|r| !r.has_room()) {
                if !slot.rdma_wait {
                    slot.rdma_wait = true;
                    WorkerStats::add(&self.stats.rdma_table_waits, 1);
                }
                break;
            }
            slot.rdma_wait = false;
            let space = slot.ep.connection().send_queue_space().min(MAX_REPLIES);
            let mut queued = [QueuedReply::EMPTY; MAX_REPLIES];
            let max_read_write = slot.ep.connection().params().max_read_write_size;
            let message = slot.ep.in_place(d);
            let (msg, rdma) = slot.ep.message_and_rdma(d);
            let mut out = Replies::new(
                &mut self.alloc,
                &self.pool,
                &mut queued[..space],
                rdma,
                max_read_write,
                None,
                message,
            );
            let r = self.upper.on_message(slot.conn, msg, &mut out);
            let o = CallOutcome::of(&out);
            let (hold, taken) = (o.hold, o.taken);
            let ok = settle(
                &mut slot.ep,
                &mut self.alloc,
                &self.stats,
                &queued,
                o,
                r,
                None,
                &mut slot.closing,
            );
            if !ok {
                slot.stalled = Some(self.progress);
                self.stall_waiting = true;
                break;
            }
            let d = slot.deferred.pop_front().expect("front exists");
            match hold {
                // Its buffer went out as the reply (settle passed it to the
                // endpoint, or freed it if that failed).
                _ if taken => slot.ep.forget(d),
                Some(t) => slot.held.push((t, d)),
                None => slot.ep.release(d, &mut self.alloc),
            }
            slot.dirty = true;
            any = true;
        }
        any
    }

    /// Posts what slot `i`'s connection has to transmit, if something may
    /// have changed it. Returns whether it looked.
    fn flush_slot(&mut self, i: usize, now: PInstant) -> bool {
        let Some(slot) = self.slots[i].as_mut() else {
            return false;
        };
        if !slot.dirty || slot.closing.is_some() {
            return false;
        }
        slot.dirty = false;
        let stalls_before = slot.ep.connection().stats().credit_stalls;
        match slot.ep.flush(now, &mut self.alloc) {
            Ok(true) => {}
            Ok(false) => {
                slot.dirty = true;
                slot.stalled = Some(self.progress);
                self.stall_waiting = true;
                WorkerStats::add(&self.stats.pool_stalls, 1);
            }
            Err(e) => slot.closing = Some(close_reason(e)),
        }
        let stalls = slot.ep.connection().stats().credit_stalls - stalls_before;
        if stalls > 0 {
            WorkerStats::add(&self.stats.credit_stalls, stalls);
        }
        let short = slot.new_shortfalls();
        if short > 0 {
            WorkerStats::add(&self.stats.pool_stalls, short);
        }
        slot.add_rdma_stats(&self.stats);
        slot.next_timer = slot.ep.connection().poll_timeout();
        true
    }

    fn fire_timers(&mut self) {
        let now = self.now();
        for slot in self.slots.iter_mut().flatten() {
            if slot.closing.is_some() {
                continue;
            }
            // A broken queue pair with nothing posted produces no flushed
            // completion to notice it by (e.g. the peer's send met RNR while
            // we had no receive posted): look at its state. With work
            // posted, its completions say why it broke (an RDMA access
            // error, counted as such) and must not be preempted by a
            // generic "connection lost".
            if slot.ep.completions_due() == 0 && slot.ep.qp().state() == QpState::Error {
                slot.closing = Some(CloseReason::Provider(WcStatus::Flushed));
                slot.dirty = true;
                continue;
            }
            if slot.next_timer.is_some_and(|t| t <= now) {
                if let Err(e) = slot.ep.on_timer(now) {
                    slot.closing = Some(close_reason(e));
                    WorkerStats::add(&self.stats.timeouts, 1);
                }
                slot.dirty = true;
                slot.next_timer = slot.ep.connection().poll_timeout();
            }
        }
    }

    /// Tears a connection down: disconnect, return queued and deferred
    /// buffers, and once the provider has flushed every posted request back
    /// (all buffers home), forget it and tell the control plane.
    fn finish_close(&mut self, i: usize, reason: CloseReason) {
        let Some(slot) = self.slots[i].as_mut() else {
            return;
        };
        if slot.ep.failure().is_none() {
            slot.ep.close(&mut self.alloc);
        }
        while let Some(d) = slot.deferred.pop_front() {
            slot.ep.release(d, &mut self.alloc);
        }
        while let Some((_, d)) = slot.held.pop() {
            slot.ep.release(d, &mut self.alloc);
        }
        slot.wakes.clear();
        slot.ep.free_queued(&mut self.alloc);
        // RDMA operations not in flight give their buffers back now; those
        // in flight once their (flushed) completions are in.
        slot.ep.release_rdma(&mut self.alloc);
        if slot.ep.outstanding() > 0 {
            return; // wait for the flushed completions
        }
        let mut slot = self.slots[i].take().expect("slot present");
        self.occupied[i / 64] &= !(1 << (i % 64));
        // Its upper layer's resources go with it (on_close, below).
        self.progressed();
        WorkerStats::add(&self.stats.pool_stalls, slot.new_shortfalls());
        slot.add_rdma_stats(&self.stats);
        self.by_qp.remove(&slot.ep.qp().id());
        self.last_qp = None;
        self.by_conn.remove(&slot.conn);
        let peer_violation = matches!(reason, CloseReason::Protocol(r) if r.is_peer_violation())
            || reason == CloseReason::UpperLayer;
        if peer_violation {
            WorkerStats::add(&self.stats.protocol_errors, 1);
        } else if matches!(reason, CloseReason::Provider(s) if s != WcStatus::Flushed && s != WcStatus::Success)
        {
            WorkerStats::add(&self.stats.rdma_errors, 1);
        }
        self.stats.connections.fetch_sub(1, Ordering::Relaxed);
        self.upper.on_close(slot.conn);
        self.tell_cp(FromWorker::Closed {
            conn: slot.conn,
            reason,
            peer_violation,
        });
    }

    fn close_all(&mut self, reason: CloseReason) {
        self.needs_service = true;
        for slot in self.slots.iter_mut().flatten() {
            slot.closing.get_or_insert(reason);
        }
    }
}

/// The lowest set bit at or after `from` in the bitmap `bits` (bit `i` is
/// bit `i % 64` of word `i / 64`).
fn next_set_bit(bits: &[u64], from: usize) -> Option<usize> {
    let mut w = from / 64;
    let mut word = bits.get(w)? & (u64::MAX << (from % 64));
    loop {
        if word != 0 {
            return Some(w * 64 + word.trailing_zeros() as usize);
        }
        w += 1;
        word = *bits.get(w)?;
    }
}

/// What one upper-layer call left in its [`Replies`], read once it
/// returned: the replies it queued, those attached to RDMA Writes (count,
/// bytes), a message it holds, whether it took the message's buffer for a
/// reply, and whether it asked to disconnect.
#[derive(Clone, Copy)]
struct CallOutcome {
    count: usize,
    attached: (u32, u64),
    hold: Option<u64>,
    taken: bool,
    disconnect: bool,
}

impl CallOutcome {
    fn of(out: &Replies<'_>) -> Self {
        CallOutcome {
            count: out.count,
            attached: (out.attached, out.attached_bytes),
            hold: out.hold,
            taken: out.message_taken,
            disconnect: out.disconnect,
        }
    }
}

/// Applies what an upper-layer handler did through its [`Replies`] (`o`):
/// marks the connection for closing if it asked to disconnect; on
/// `Ok`, queues the replies and commits the RDMA requests (and finishes the
/// operation being completed, if any); on backpressure, undoes both so the
/// handler can be called again with the same input. Returns whether the
/// handler succeeded.
#[allow(clippy::too_many_arguments)]
fn settle<Q: crate::provider::QueuePair>(
    ep: &mut Endpoint<Q>,
    alloc: &mut SliceAllocator,
    stats: &WorkerStats,
    queued: &[QueuedReply],
    o: CallOutcome,
    r: Result<(), Backpressure>,
    completing: Option<usize>,
    closing: &mut Option<CloseReason>,
) -> bool {
    if o.disconnect {
        closing.get_or_insert(CloseReason::UpperLayer);
    }
    let (queued, attached) = (&queued[..o.count], o.attached);
    match r {
        Ok(()) => {
            // A reply in place (the message's own receive buffer) carries
            // its header over the request's where the provider says that
            // is cheaper than a send buffer (QueuePair::
            // reply_header_in_receive_buffer: verbs, whose device wrote
            // the buffer, and the soft provider, whose copy leaves the
            // header's line where taking it back costs little); otherwise
            // it keeps the general path (header in a send buffer). A reply
            // built here (`Replies::reply`, a local buffer) and the
            // client's messages go in place.
            let header_in_place = ep.qp().reply_header_in_receive_buffer();
            for q in queued {
                // The bytes before a reply are its own (QueuedReply).
                //
                // Posted at once when nothing waits to go before it
                // (`Endpoint::send_now`); a reply to a finished RDMA
                // operation is queued, so that the operation's next
                // transfer (posted by the flush, RDMA first) keeps going
                // ahead of it.
                let r = if completing.is_none() {
                    let room = !q.in_place || header_in_place;
                    ep.send_now(alloc, q.buf, q.offset, q.len, q.invalidate, room)
                        .map(|_| ())
                } else if q.in_place {
                    ep.send_at(q.buf, q.offset, q.len, q.invalidate)
                } else {
                    ep.send_with_header_room(q.buf, q.offset, q.len, q.invalidate)
                };
                if r.is_err() {
                    // An in-place reply's buffer is ours to free too: the
                    // delivery it came from is forgotten, not released.
                    let _ = alloc.free(q.buf);
                } else {
                    WorkerStats::add(&stats.messages_out, 1);
                    WorkerStats::add(&stats.bytes_out, q.len as u64);
                }
            }
            // Replies attached to RDMA Writes go out with them.
            WorkerStats::add(&stats.messages_out, u64::from(attached.0));
            WorkerStats::add(&stats.bytes_out, attached.1);
            if let Some(rdma) = ep.rdma_mut() {
                rdma.commit(alloc, completing);
            }
            true
        }
        Err(bp) => {
            // An in-place reply's buffer is still the message's, which
            // the handler gets again.
            for q in queued.iter().filter(|q| !q.in_place) {
                let _ = alloc.free(q.buf);
            }
            if let Some(rdma) = ep.rdma_mut() {
                rdma.abort(alloc, completing);
            }
            if bp == Backpressure::TooLarge {
                *closing = Some(CloseReason::ReplyTooLarge);
            } else {
                WorkerStats::add(&stats.pool_stalls, 1);
            }
            false
        }
    }
}

fn close_reason(e: EndpointError) -> CloseReason {
    match e {
        EndpointError::Terminated(r) => CloseReason::Protocol(r),
        EndpointError::Provider(s) => CloseReason::Provider(s),
        EndpointError::PoolExhausted => CloseReason::PoolExhausted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::recv_wr_id;
    use crate::provider::soft::SoftProvider;
    use crate::provider::{ConnRequest, Listener, QpCaps, RecvWr};
    use crate::upper::Echo;
    use smbdirect_hugepages::PoolConfig;

    /// A queue pair refused at attach (no free slot) gives back the
    /// receive buffer the control plane posted for it, once its receive
    /// flushes; nothing is left among the orphans.
    #[test]
    fn a_queue_pair_refused_at_attach_gives_its_negotiate_receive_buffer_back() {
        let provider = SoftProvider::new().expect("soft provider");
        let pool = PoolConfig::smbdirect(8 << 20, 1, 8192, 1364, 1 << 20)
            .build()
            .expect("pool");
        // SAFETY: the pool outlives every use of the registration here.
        let mr = unsafe { provider.register_pool(&pool) }.expect("register");
        let cq = provider.create_cq(4096).expect("cq");
        let handle = cq.handle();
        let mut listener = provider
            .listen("127.0.0.1:0".parse().unwrap())
            .expect("listen");
        let addr = listener.local_addr();
        let cfg = WorkerConfig {
            index: 0,
            core: None,
            smbd: SmbdConfig::default(),
            idle_park: Duration::from_millis(1),
            idle: IdleMode::Nap,
            max_connections: 1,
            shutdown_grace: Duration::from_millis(100),
            send_depth: 64,
            max_sge: 4,
        };
        let mut w = Worker::<SoftProvider, Echo>::new(
            cfg,
            cq,
            pool.claim_slice(0).expect("slice"),
            mr,
            Echo,
            crate::planes::ring(8),
            crate::planes::ring(8),
            crate::planes::ring(8),
            Arc::new(WorkerStats::default()),
        );
        let receive_free = || pool.class_stats(0, ClassId::RECEIVE).expect("class").free;
        let before = receive_free();
        let caps = QpCaps {
            max_send_wr: 16,
            max_recv_wr: 16,
            ..QpCaps::default()
        };
        // Two connections, accepted as the control plane accepts them
        // (the negotiate receive posted first); the worker has room for one.
        let mut clients = Vec::new();
        for conn in 0..2u64 {
            let client_cq = provider.create_cq(64).expect("client cq");
            let ch = client_cq.handle();
            let (qp, client) = std::thread::scope(|s| {
                let c = s.spawn(|| provider.connect(addr, &ch, caps, &[], Duration::from_secs(5)));
                let req = listener
                    .accept_request(Duration::from_secs(5))
                    .expect("accept_request")
                    .expect("a request");
                let buf = w.alloc.alloc(ClassId::RECEIVE).expect("receive buffer");
                let loc = pool.locate(buf).expect("located");
                let recv = [RecvWr {
                    wr_id: recv_wr_id(buf),
                    sge: w.mr.sge(loc.offset as u64, loc.len as u32),
                }];
                let qp = req
                    .accept_with_receives(&handle, caps, &[], &recv)
                    .expect("accept");
                (qp, c.join().expect("connector").expect("connect"))
            });
            clients.push((client_cq, client));
            w.attach(conn, qp, addr, true);
        }
        assert_eq!(receive_free(), before - 2, "two negotiate receives posted");
        assert_eq!(w.refused.len(), 1, "the second queue pair was refused");
        match w.outbox.pop() {
            Some(FromWorker::Closed {
                conn: 1, reason, ..
            }) => {
                assert_eq!(reason, CloseReason::Capacity)
            }
            other => panic!("expected the refusal of conn 1, got {other:?}"),
        }
        // The refused queue pair's receive flushes back through the CQ.
        let mut wcs = [Completion::EMPTY; 16];
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !w.refused.is_empty() && std::time::Instant::now() < deadline {
            let n = w.cq.poll(&mut wcs);
            let now = w.now();
            for wc in &wcs[..n] {
                w.on_completion(now, wc);
            }
        }
        assert!(w.refused.is_empty(), "the refused receive never came back");
        assert!(
            w.orphans.is_empty(),
            "a completion was left among the orphans"
        );
        assert_eq!(
            receive_free(),
            before - 1,
            "the refused queue pair's buffer is home; the attached one's still posted"
        );
        drop(clients);
    }

    #[test]
    fn next_set_bit_walks_every_set_bit_in_order() {
        let mut bits = vec![0u64; 5];
        let set = [0usize, 1, 63, 64, 130, 255, 256, 319];
        for &i in &set {
            bits[i / 64] |= 1 << (i % 64);
        }
        let mut seen = Vec::new();
        let mut from = 0;
        while let Some(i) = next_set_bit(&bits, from) {
            seen.push(i);
            from = i + 1;
        }
        assert_eq!(seen, set);
        assert_eq!(next_set_bit(&bits, 320), None);
        assert_eq!(next_set_bit(&bits, 1000), None);
        assert_eq!(next_set_bit(&[], 0), None);
        assert_eq!(next_set_bit(&bits, 65), Some(130));
    }
}
