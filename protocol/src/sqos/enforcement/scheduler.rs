//! Per-worker request scheduler: requests over a flow's limit wait in the
//! worker's queue (never rejected, never spun on one by one); when several
//! flows are ready, flows below their reservation (MinimumIoRate) go first
//! (dmclock's reservation phase), then the others round-robin.
//!
//! Fixed capacity, allocated up front; ids only (the caller owns the
//! request data). The caller dispatches one request per `next_ready` call
//! when it has device capacity.

use super::bucket::{burst_for, io_cost, kb_cost, FlowRates, Limits, TokenBucket};
use crate::sqos::{FlowStatus, DEFAULT_BASE_IO_SIZE};
use crate::time::{Duration, Instant};

const NIL: u32 = u32::MAX;

/// Default [`SchedulerConfig::lane_loan`]: 1 ms at the flow's rates, a
/// twentieth of its 20 ms burst.
pub const DEFAULT_LANE_LOAN: Duration = Duration::from_millis(1);

/// Normalized I/Os lent to a lane of a flow limited in neither IOPS nor
/// bandwidth (its lane only saves the trip to the flow for accounting).
const UNLIMITED_LOAN_IOS: u32 = 64;

/// A caller-chosen request identifier.
pub type RequestId = u64;

/// A flow's slot in one [`Scheduler`] (the open keeps it: no hash lookup
/// per I/O).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowSlot(u32);

impl FlowSlot {
    /// The slot index.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Credit an Open holds on its flow's behalf, kept in the Open's own
/// record (so the per-I/O admission reads one cache line, the Open's, and
/// not the flow's): see [`Scheduler::try_lane`].
///
/// The flow lends a lane [`SchedulerConfig::lane_loan`] worth of its rates
/// at a time, out of the credit its buckets hold; lent credit stays
/// charged to the flow's buckets (their credit plus what they lent never
/// exceeds their burst), so the flow's limits hold over its lanes
/// together. A loan lasts until the accounting window closes or the lane
/// comes back to the flow (its next I/O the loan does not cover, or
/// [`Scheduler::release_lane`]); what was not spent is returned then.
/// Lent credit is accounted as served when lent, and the unspent part is
/// deducted when returned in the same window: a window's report may count
/// up to one loan per Open that was lent but not spent.
///
/// A lane belongs to one flow slot: [`release_lane`](Scheduler::release_lane)
/// it before pointing its Open at another flow or closing the Open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lane {
    /// Low 32 bits of the window the loan was made in.
    epoch: u32,
    /// Unspent normalized I/Os and KB.
    ios: u32,
    kb: u32,
    /// The loan as made.
    lent_ios: u32,
    lent_kb: u32,
}

impl Lane {
    /// A lane holding nothing.
    pub const EMPTY: Lane = Lane {
        epoch: 0,
        ios: 0,
        kb: 0,
        lent_ios: 0,
        lent_kb: 0,
    };

    /// Unspent normalized I/Os and KB of its loan (accounted as served
    /// until returned).
    pub fn unspent(&self) -> (u32, u32) {
        (self.ios, self.kb)
    }

    /// True when it holds no loan.
    pub fn is_empty(&self) -> bool {
        self.lent_ios | self.lent_kb | self.ios | self.kb == 0
    }
}

impl Default for Lane {
    fn default() -> Self {
        Lane::EMPTY
    }
}

/// Why an operation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchedulerError {
    /// Every request slot is in use.
    QueueFull,
    /// The flow slot is not open.
    NoSuchFlow,
}

/// Sizes and windows of a [`Scheduler`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Flow slots.
    pub max_flows: usize,
    /// Queued requests, all flows together.
    pub max_queued: usize,
    /// BaseIoSize for normalized costs.
    pub base_io_size: u32,
    /// Accounting window for reservation reports and measured demand.
    pub window: Duration,
    /// Burst window of the limit and reservation buckets.
    pub burst_window: Duration,
    /// How much credit a flow lends an Open's [`Lane`] at a time: this long
    /// at the flow's rates, at most 1 s (zero: no loans, every I/O reaches
    /// the flow).
    pub lane_loan: Duration,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            max_flows: 1024,
            max_queued: 4096,
            base_io_size: DEFAULT_BASE_IO_SIZE,
            window: Duration::from_millis(100),
            burst_window: super::bucket::DEFAULT_BURST_WINDOW,
            lane_loan: DEFAULT_LANE_LOAN,
        }
    }
}

/// One flow's accounting over the last complete window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WindowReport {
    /// Window length.
    pub length: Duration,
    /// Normalized I/Os enqueued during the window.
    pub offered_ios: u64,
    /// Normalized I/Os queued when the window started.
    pub backlog_ios: u64,
    /// Normalized I/Os dispatched.
    pub served_ios: u64,
    /// KB (1024 bytes) dispatched.
    pub served_kb: u64,
    /// True unless the flow had a reservation, wanted at least that much
    /// and was served less (beyond one burst of slack).
    pub reservation_met: bool,
}

impl WindowReport {
    /// Offered normalized IOPS (demand to report to the control plane).
    pub fn offered_iops(&self) -> u64 {
        per_sec(self.offered_ios, self.length)
    }
    /// Served normalized IOPS.
    pub fn served_iops(&self) -> u64 {
        per_sec(self.served_ios, self.length)
    }
}

fn per_sec(n: u64, d: Duration) -> u64 {
    if d.as_nanos() == 0 {
        return 0;
    }
    (n as u128 * 1_000_000_000 / d.as_nanos() as u128) as u64
}

#[derive(Debug, Clone, Copy)]
struct Node {
    req: RequestId,
    bytes: u64,
    next: u32,
}

/// `Hot::flags`: the slot is open.
const OPEN: u32 = 1;
/// `Hot::flags`: the flow has a reservation (its reservation bucket, in the
/// cold record, is charged on the fast path too).
const RESERVED: u32 = 2;
/// `Hot::flags`: the slot is in the list of flows the current window
/// accounts (`Scheduler::touched`).
const IN_WINDOW: u32 = 4;

/// What the per-I/O admission of a flow reads and writes, in one cache
/// line: the two limit buckets, the fast path's window counters, flags.
/// (A flow with a reservation also charges its reservation bucket, in the
/// cold record.)
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
struct Hot {
    limits: Limits,
    /// Normalized I/Os admitted by [`Scheduler::try_now`] this window
    /// (offered and served at once), saturating.
    fast_ios: u32,
    /// KB admitted by [`Scheduler::try_now`] this window, saturating.
    fast_kb: u32,
    flags: u32,
}

const _: () = assert!(core::mem::size_of::<Hot>() == 64);

/// The rest of a flow's state: queue, reservation, window accounting.
#[derive(Debug, Clone)]
struct Cold {
    reservation: TokenBucket,
    head: u32,
    tail: u32,
    len: u32,
    active_pos: u32,
    queued_ios: u64,
    ready_at: Instant,
    /// Normalized I/Os enqueued this window.
    offered: u64,
    backlog: u64,
    idle_in_window: bool,
    /// Normalized I/Os and KB dispatched from the queue this window.
    served: u64,
    served_kb: u64,
    last: WindowReport,
    /// The window `last` closed (`Scheduler::epoch`).
    last_epoch: u64,
}

/// The per-worker scheduler.
///
/// Per-flow state is split in a 64-byte hot record (everything
/// [`try_now`](Self::try_now) touches for a flow without a reservation) and
/// a cold one. Closing an accounting window costs time proportional to the
/// flows with I/O in that window or the one before (the others' report is
/// all zeros and is produced on demand), not to the flows open.
#[derive(Debug, Clone)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    /// `log2(base_io_size)` when it is a power of two (it always is in
    /// practice): the normalized cost is a shift, not a division.
    base_shift: Option<u32>,
    hot: Vec<Hot>,
    cold: Vec<Cold>,
    free_flows: Vec<u32>,
    nodes: Vec<Node>,
    free_node: u32,
    active: Vec<u32>,
    cursor: usize,
    window_start: Instant,
    /// Windows closed so far.
    epoch: u64,
    /// Length of the last closed window.
    last_len: Duration,
    /// Slots accounted in the current window (flag `IN_WINDOW`).
    touched: Vec<u32>,
    /// Slots whose report the last window close produced.
    closed: Vec<u32>,
}

impl Scheduler {
    /// A scheduler with every slot allocated up front.
    pub fn new(cfg: SchedulerConfig, now: Instant) -> Self {
        assert!(cfg.max_queued < NIL as usize && cfg.max_flows < NIL as usize);
        let hot = Hot {
            limits: Limits::new(now, FlowRates::UNLIMITED, cfg.burst_window),
            fast_ios: 0,
            fast_kb: 0,
            flags: 0,
        };
        let cold = Cold {
            reservation: TokenBucket::unlimited(now),
            head: NIL,
            tail: NIL,
            len: 0,
            active_pos: NIL,
            queued_ios: 0,
            ready_at: Instant::ZERO,
            offered: 0,
            backlog: 0,
            idle_in_window: true,
            served: 0,
            served_kb: 0,
            last: IDLE_REPORT,
            last_epoch: 0,
        };
        let nodes = (0..cfg.max_queued)
            .map(|i| Node {
                req: 0,
                bytes: 0,
                next: if i + 1 < cfg.max_queued {
                    i as u32 + 1
                } else {
                    NIL
                },
            })
            .collect();
        let base = if cfg.base_io_size == 0 {
            DEFAULT_BASE_IO_SIZE
        } else {
            cfg.base_io_size
        };
        Scheduler {
            cfg,
            base_shift: base.is_power_of_two().then(|| base.trailing_zeros()),
            hot: vec![hot; cfg.max_flows],
            cold: vec![cold; cfg.max_flows],
            free_flows: (0..cfg.max_flows as u32).rev().collect(),
            nodes,
            free_node: if cfg.max_queued > 0 { 0 } else { NIL },
            active: Vec::with_capacity(cfg.max_flows),
            cursor: 0,
            window_start: now,
            epoch: 0,
            last_len: Duration::ZERO,
            touched: Vec::with_capacity(cfg.max_flows),
            closed: Vec::with_capacity(cfg.max_flows),
        }
    }

    /// Normalized cost of `bytes` (see [`io_cost`]).
    #[inline(always)]
    fn cost(&self, bytes: u64) -> u64 {
        match self.base_shift {
            Some(s) => ((bytes >> s) + (bytes & ((1u64 << s) - 1) != 0) as u64).max(1),
            None => io_cost(bytes, self.cfg.base_io_size),
        }
    }

    /// Opens a flow slot with `rates`; `None` when all slots are in use.
    pub fn open_flow(&mut self, now: Instant, rates: FlowRates) -> Option<FlowSlot> {
        let i = self.free_flows.pop()?;
        let cfg = self.cfg;
        let h = &mut self.hot[i as usize];
        h.limits = Limits::new(now, rates, cfg.burst_window);
        h.fast_ios = 0;
        h.fast_kb = 0;
        // A slot closed and reopened within one window may still be listed.
        h.flags = OPEN | (h.flags & IN_WINDOW) | reserved_flag(rates);
        let c = &mut self.cold[i as usize];
        c.reservation = TokenBucket::new(
            now,
            rates.min_iops,
            burst_for(rates.min_iops, cfg.burst_window),
        );
        c.ready_at = Instant::ZERO;
        c.offered = 0;
        c.backlog = 0;
        c.idle_in_window = true;
        c.served = 0;
        c.served_kb = 0;
        c.last = IDLE_REPORT;
        c.last_epoch = self.epoch;
        Some(FlowSlot(i))
    }

    /// Closes a flow slot; refused (false) while requests are queued.
    pub fn close_flow(&mut self, slot: FlowSlot) -> bool {
        let i = slot.index();
        match (self.hot.get_mut(i), self.cold.get(i)) {
            (Some(h), Some(c)) if h.flags & OPEN != 0 && c.len == 0 => {
                h.flags &= !OPEN;
                self.free_flows.push(slot.0);
                true
            }
            _ => false,
        }
    }

    /// New rates for a flow from `now` on (pushed by the control plane).
    pub fn set_rates(
        &mut self,
        now: Instant,
        slot: FlowSlot,
        rates: FlowRates,
    ) -> Result<(), SchedulerError> {
        let bw = self.cfg.burst_window;
        let i = self.open_index(slot)?;
        let h = &mut self.hot[i];
        h.limits.set_rates(now, rates, bw);
        h.flags = (h.flags & !RESERVED) | reserved_flag(rates);
        let c = &mut self.cold[i];
        c.reservation
            .set_limits(now, rates.min_iops, burst_for(rates.min_iops, bw));
        c.ready_at = Instant::ZERO;
        Ok(())
    }

    fn open_index(&self, slot: FlowSlot) -> Result<usize, SchedulerError> {
        match self.hot.get(slot.index()) {
            Some(h) if h.flags & OPEN != 0 => Ok(slot.index()),
            _ => Err(SchedulerError::NoSuchFlow),
        }
    }

    /// Lists slot `i` for the current window's accounting.
    #[inline(always)]
    fn touch(hot: &mut Hot, touched: &mut Vec<u32>, i: usize) {
        if hot.flags & IN_WINDOW == 0 {
            hot.flags |= IN_WINDOW;
            // Within capacity: a slot is listed at most once.
            touched.push(i as u32);
        }
    }

    /// Queues request `req` of `bytes` for `slot`.
    pub fn enqueue(
        &mut self,
        slot: FlowSlot,
        req: RequestId,
        bytes: u64,
    ) -> Result<(), SchedulerError> {
        let i = self.open_index(slot)?;
        let n = self.free_node;
        if n == NIL {
            return Err(SchedulerError::QueueFull);
        }
        self.free_node = self.nodes[n as usize].next;
        self.nodes[n as usize] = Node {
            req,
            bytes,
            next: NIL,
        };
        let cost = self.cost(bytes);
        Self::touch(&mut self.hot[i], &mut self.touched, i);
        let f = &mut self.cold[i];
        if f.tail == NIL {
            f.head = n;
        } else {
            self.nodes[f.tail as usize].next = n;
        }
        f.tail = n;
        f.len += 1;
        f.queued_ios += cost;
        f.offered += cost;
        if f.len == 1 {
            f.ready_at = Instant::ZERO;
            f.active_pos = self.active.len() as u32;
            self.active.push(slot.0);
        }
        Ok(())
    }

    /// The fast path of a request arriving for `slot` at `now`: when no
    /// request of any flow is waiting (so no ordering decision is at stake)
    /// and the flow's limits allow `bytes` now, the request is charged and
    /// accounted as offered and served at once (true). Otherwise (false)
    /// the caller [`enqueue`](Self::enqueue)s it. O(1); touches the flow's
    /// hot record only (and its reservation bucket if it has one).
    #[inline]
    pub fn try_now(&mut self, now: Instant, slot: FlowSlot, bytes: u64) -> bool {
        if !self.active.is_empty() {
            return false;
        }
        self.tick(now);
        let ios = self.cost(bytes);
        let kb = kb_cost(bytes);
        let i = slot.index();
        let Some(h) = self.hot.get_mut(i) else {
            return false;
        };
        if h.flags & OPEN == 0 || h.limits.try_take(now, ios, kb).is_err() {
            return false;
        }
        h.fast_ios = h.fast_ios.saturating_add(ios.min(u32::MAX as u64) as u32);
        h.fast_kb = h.fast_kb.saturating_add(kb.min(u32::MAX as u64) as u32);
        if h.flags & RESERVED != 0 {
            self.cold[i].reservation.take_saturating(now, ios);
        }
        Self::touch(h, &mut self.touched, i);
        true
    }

    /// The address of `slot`'s hot record (what [`try_now`](Self::try_now)
    /// reads), for a prefetch hint issued when the Open is found; null for a
    /// slot out of range.
    #[inline]
    pub fn flow_addr(&self, slot: FlowSlot) -> *const u8 {
        self.hot
            .get(slot.index())
            .map_or(core::ptr::null(), |h| h as *const Hot as *const u8)
    }

    /// [`try_now`](Self::try_now) through the Open's `lane` for `slot`:
    /// when nothing waits and the lane's loan covers the I/O, it is spent
    /// from the lane without touching the flow's records (one memory trip:
    /// the Open's). Otherwise the lane comes back to the flow: its unspent
    /// loan is returned, the I/O is admitted as by `try_now` (false when
    /// the limits refuse it: the caller enqueues it) and, when admitted, the
    /// lane gets a new loan out of the credit left.
    #[inline]
    pub fn try_lane(&mut self, now: Instant, slot: FlowSlot, lane: &mut Lane, bytes: u64) -> bool {
        if !self.active.is_empty() {
            return false;
        }
        self.tick(now);
        let ios = self.cost(bytes);
        let kb = kb_cost(bytes);
        if lane.epoch == self.epoch as u32 && u64::from(lane.ios) >= ios && u64::from(lane.kb) >= kb
        {
            // Both fit in 32 bits: they are at most the lane's.
            lane.ios -= ios as u32;
            lane.kb -= kb as u32;
            return true;
        }
        self.try_lane_slow(now, slot, lane, ios, kb)
    }

    /// [`try_lane`](Self::try_lane) when the lane does not cover the I/O.
    #[inline(never)]
    fn try_lane_slow(
        &mut self,
        now: Instant,
        slot: FlowSlot,
        lane: &mut Lane,
        ios: u64,
        kb: u64,
    ) -> bool {
        let i = slot.index();
        let epoch = self.epoch as u32;
        let loan = self.cfg.lane_loan.as_nanos();
        let base_kb = (self.cfg.base_io_size / 1024).max(1);
        let Some(h) = self.hot.get_mut(i) else {
            *lane = Lane::EMPTY;
            return false;
        };
        if h.flags & OPEN == 0 {
            *lane = Lane::EMPTY;
            return false;
        }
        Self::settle(h, lane, epoch);
        if h.limits.try_take(now, ios, kb).is_err() {
            return false;
        }
        let (want_ios, want_kb) = loan_size(h.limits.rates(), loan, base_kb);
        let (li, lk) = h.limits.lend(want_ios, want_kb);
        let (ti, tk) = (ios.saturating_add(li as u64), kb.saturating_add(lk as u64));
        h.fast_ios = h.fast_ios.saturating_add(ti.min(u32::MAX as u64) as u32);
        h.fast_kb = h.fast_kb.saturating_add(tk.min(u32::MAX as u64) as u32);
        if h.flags & RESERVED != 0 {
            self.cold[i].reservation.take_saturating(now, ti);
        }
        Self::touch(h, &mut self.touched, i);
        *lane = Lane {
            epoch,
            ios: li,
            kb: lk,
            lent_ios: li,
            lent_kb: lk,
        };
        true
    }

    /// Ends `lane`'s loan: in the window it was made in, the unspent part
    /// is credit again and is no longer accounted as served; after that
    /// window (the loan already ended) the unspent part is credit again,
    /// capped at the burst.
    #[inline]
    fn settle(h: &mut Hot, lane: &mut Lane, epoch: u32) {
        if lane.is_empty() {
            return;
        }
        let unused = (lane.ios, lane.kb);
        if lane.epoch == epoch {
            h.limits.repay((lane.lent_ios, lane.lent_kb), unused);
            h.fast_ios = h.fast_ios.saturating_sub(unused.0);
            h.fast_kb = h.fast_kb.saturating_sub(unused.1);
        } else {
            h.limits.restore(unused);
        }
        *lane = Lane::EMPTY;
    }

    /// Returns `lane`'s loan to `slot` (see [`Lane`]) and empties it; call
    /// before the lane's Open closes or is pointed at another flow.
    pub fn release_lane(&mut self, slot: FlowSlot, lane: &mut Lane) {
        let epoch = self.epoch as u32;
        match self.hot.get_mut(slot.index()) {
            Some(h) if h.flags & OPEN != 0 => Self::settle(h, lane, epoch),
            _ => *lane = Lane::EMPTY,
        }
    }

    /// True when `lane` holds a loan of this window covering an I/O of
    /// `bytes` ([`try_lane`](Self::try_lane) will not need the flow's
    /// records if nothing is queued): when false, the caller may prefetch
    /// [`flow_addr`](Self::flow_addr).
    #[inline]
    pub fn lane_covers(&self, lane: &Lane, bytes: u64) -> bool {
        lane.epoch == self.epoch as u32
            && u64::from(lane.ios) >= self.cost(bytes)
            && u64::from(lane.kb) >= kb_cost(bytes)
    }

    /// True when no request is waiting.
    pub fn is_idle(&self) -> bool {
        self.active.is_empty()
    }

    /// Start of the current accounting window (changes when a window
    /// closes, so a caller can tell when [`last_window`](Self::last_window)
    /// has new reports).
    pub fn window_start(&self) -> Instant {
        self.window_start
    }

    /// Requests queued for `slot`.
    pub fn queued(&self, slot: FlowSlot) -> usize {
        self.cold.get(slot.index()).map_or(0, |f| f.len as usize)
    }

    /// Requests queued, all flows.
    pub fn total_queued(&self) -> usize {
        self.active
            .iter()
            .map(|&i| self.cold[i as usize].len as usize)
            .sum()
    }

    /// Closes the accounting window if it has elapsed at `now`.
    #[inline]
    pub fn tick(&mut self, now: Instant) {
        let len = now.saturating_since(self.window_start);
        if len >= self.cfg.window {
            self.close_window(now, len);
        }
    }

    /// Closes the window: a report for every flow listed in it; the flows
    /// whose report is not all zeros (or that still have requests queued)
    /// stay listed for the next window, so that a flow going idle gets one
    /// all-zero report and then costs nothing. When many flows are listed
    /// the slots are swept in order (sequential memory access) rather than
    /// visited in the order they were listed.
    #[inline(never)]
    fn close_window(&mut self, now: Instant, len: Duration) {
        self.epoch += 1;
        self.last_len = len;
        let mut closed = core::mem::take(&mut self.closed);
        closed.clear();
        if self.touched.len() * 8 > self.hot.len() {
            self.touched.clear();
            for i in 0..self.hot.len() {
                if self.hot[i].flags & IN_WINDOW != 0 {
                    closed.push(i as u32);
                    self.close_flow_window(i, len);
                }
            }
        } else {
            core::mem::swap(&mut closed, &mut self.touched);
            for &i in &closed {
                self.close_flow_window(i as usize, len);
            }
        }
        self.closed = closed;
        self.window_start = now;
    }

    /// Closes listed slot `i`'s window of length `len` (see
    /// [`close_window`](Self::close_window)).
    #[inline(always)]
    fn close_flow_window(&mut self, i: usize, len: Duration) {
        let (h, f) = (&mut self.hot[i], &mut self.cold[i]);
        h.flags &= !IN_WINDOW;
        if h.flags & OPEN == 0 {
            return;
        }
        // Lanes' loans last one window (what they did not spend is
        // accounted as served in it, see `Lane`).
        h.limits.end_loans();
        let offered = f.offered + h.fast_ios as u64;
        let served = f.served + h.fast_ios as u64;
        let served_kb = f.served_kb + h.fast_kb as u64;
        let min_iops = f.reservation.rate();
        let met = min_iops == 0 || {
            // A flow that stayed backlogged the whole window wanted more
            // than it got; otherwise it wanted what it offered.
            let wanted = if f.idle_in_window {
                f.backlog.saturating_add(offered)
            } else {
                u64::MAX
            };
            let reserved = (min_iops as u128 * len.as_nanos() as u128 / 1_000_000_000) as u64;
            let required = wanted.min(reserved);
            served.saturating_add(f.reservation.burst()) >= required
        };
        f.last = WindowReport {
            length: len,
            offered_ios: offered,
            backlog_ios: f.backlog,
            served_ios: served,
            served_kb,
            reservation_met: met,
        };
        f.last_epoch = self.epoch;
        let busy = offered != 0 || served != 0 || f.backlog != 0 || f.len != 0;
        h.fast_ios = 0;
        h.fast_kb = 0;
        f.offered = 0;
        f.served = 0;
        f.served_kb = 0;
        f.backlog = f.queued_ios;
        f.idle_in_window = f.len == 0;
        if busy {
            Self::touch(h, &mut self.touched, i);
        }
    }

    /// The slots whose report the last window close produced: every open
    /// flow not listed here had an all-zero last window, as it had the
    /// window before (or it was opened since).
    pub fn closed_window_slots(&self) -> impl Iterator<Item = FlowSlot> + '_ {
        self.closed
            .iter()
            .filter(|&&i| self.hot[i as usize].flags & OPEN != 0)
            .map(|&i| FlowSlot(i))
    }

    /// How many slots the last window close listed: the positions
    /// [`Self::closed_window_slot`] takes.
    pub fn closed_window_len(&self) -> usize {
        self.closed.len()
    }

    /// The slot at position `k` of the last window close's list if it is
    /// still open (what [`Self::closed_window_slots`] yields, by position),
    /// so that a caller can report a window's flows a few at a time.
    pub fn closed_window_slot(&self, k: usize) -> Option<FlowSlot> {
        let &i = self.closed.get(k)?;
        (self.hot[i as usize].flags & OPEN != 0).then_some(FlowSlot(i))
    }

    /// The last complete window of `slot`.
    pub fn last_window(&self, slot: FlowSlot) -> Option<WindowReport> {
        let i = self.open_index(slot).ok()?;
        let f = &self.cold[i];
        Some(if f.last_epoch == self.epoch {
            f.last
        } else {
            // Not listed in the last window: nothing happened in it.
            WindowReport {
                length: self.last_len,
                ..IDLE_REPORT
            }
        })
    }

    /// The Status to report for `slot`: StorageQoSStatusInsufficientThroughput
    /// when the worker was saturated and the flow's reservation was not met
    /// over the last window, else StorageQoSStatusOk.
    pub fn flow_status(&self, slot: FlowSlot, worker_saturated: bool) -> FlowStatus {
        match self.last_window(slot) {
            Some(w) if worker_saturated && !w.reservation_met => FlowStatus::InsufficientThroughput,
            _ => FlowStatus::Ok,
        }
    }

    /// The next request to dispatch at `now`, if any flow is ready: first a
    /// ready flow below its reservation, else the next ready flow in
    /// round-robin order. Call once per free device slot.
    pub fn next_ready(&mut self, now: Instant) -> Option<(FlowSlot, RequestId)> {
        self.tick(now);
        let n = self.active.len();
        if n == 0 {
            return None;
        }
        // Reservation phase.
        for k in 0..n {
            let idx = (self.cursor + k) % n;
            let fi = self.active[idx] as usize;
            let f = &mut self.cold[fi];
            if f.reservation.rate() == 0 || f.ready_at > now {
                continue;
            }
            let bytes = self.nodes[f.head as usize].bytes;
            let ios = self.cost(bytes);
            let f = &mut self.cold[fi];
            if f.reservation.check(now, ios).is_err() {
                continue;
            }
            match self.hot[fi].limits.try_take(now, ios, kb_cost(bytes)) {
                Ok(()) => {
                    f.reservation.take_saturating(now, ios);
                    return Some(self.pop(fi));
                }
                Err(t) => f.ready_at = t,
            }
        }
        // Round-robin phase.
        for k in 0..n {
            let idx = (self.cursor + k) % n;
            let fi = self.active[idx] as usize;
            let f = &self.cold[fi];
            if f.ready_at > now {
                continue;
            }
            let bytes = self.nodes[f.head as usize].bytes;
            let ios = self.cost(bytes);
            let f = &mut self.cold[fi];
            match self.hot[fi].limits.try_take(now, ios, kb_cost(bytes)) {
                Ok(()) => {
                    f.reservation.take_saturating(now, ios);
                    self.cursor = idx + 1;
                    return Some(self.pop(fi));
                }
                Err(t) => f.ready_at = t,
            }
        }
        None
    }

    fn pop(&mut self, fi: usize) -> (FlowSlot, RequestId) {
        let n = self.cold[fi].head;
        let node = self.nodes[n as usize];
        let ios = self.cost(node.bytes);
        let f = &mut self.cold[fi];
        f.head = node.next;
        if f.head == NIL {
            f.tail = NIL;
        }
        f.len -= 1;
        f.queued_ios -= ios;
        f.served += ios;
        f.served_kb += kb_cost(node.bytes);
        f.ready_at = Instant::ZERO;
        if f.len == 0 {
            f.idle_in_window = true;
            let pos = f.active_pos as usize;
            f.active_pos = NIL;
            self.active.swap_remove(pos);
            if let Some(&moved) = self.active.get(pos) {
                self.cold[moved as usize].active_pos = pos as u32;
            }
        }
        self.nodes[n as usize].next = self.free_node;
        self.free_node = n;
        if self.cursor > self.active.len() {
            self.cursor = 0;
        }
        (FlowSlot(fi as u32), node.req)
    }

    /// When `next_ready` may next return a request: `None` with nothing
    /// queued; an instant ≤ the last `next_ready` call when some flow was
    /// not yet examined (poll again now); otherwise the earliest instant a
    /// waiting flow's limits allow it.
    pub fn next_wakeup(&self) -> Option<Instant> {
        self.active
            .iter()
            .map(|&i| self.cold[i as usize].ready_at)
            .min()
    }
}

/// The report of a window with no I/O (and of a flow before its first
/// window closes, with length 0).
const IDLE_REPORT: WindowReport = WindowReport {
    length: Duration::ZERO,
    offered_ios: 0,
    backlog_ios: 0,
    served_ios: 0,
    served_kb: 0,
    reservation_met: true,
};

/// Normalized I/Os and KB to lend a lane of a flow with `rates` (units
/// per second, 0 unlimited): `loan_ns` worth of each limited rate; an
/// unlimited dimension gets what the other allows (a normalized I/O moves
/// at most `base_kb` KB; a KB costs at most one normalized I/O), and a flow
/// limited in neither gets [`UNLIMITED_LOAN_IOS`].
#[inline]
fn loan_size((iops, kbps): (u32, u32), loan_ns: u64, base_kb: u32) -> (u32, u32) {
    if loan_ns == 0 {
        return (0, 0);
    }
    // At most 1 s: the product fits in 64 bits (and the division by a
    // constant is a multiplication).
    let loan_ns = loan_ns.min(1_000_000_000);
    let of = |rate: u32| (rate as u64 * loan_ns / 1_000_000_000) as u32;
    match (iops, kbps) {
        (0, 0) => (UNLIMITED_LOAN_IOS, UNLIMITED_LOAN_IOS * base_kb),
        (0, k) => (of(k), of(k)),
        (i, 0) => (of(i), of(i).saturating_mul(base_kb)),
        (i, k) => (of(i), of(k)),
    }
}

fn reserved_flag(rates: FlowRates) -> u32 {
    if rates.min_iops != 0 {
        RESERVED
    } else {
        0
    }
}
