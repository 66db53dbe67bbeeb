//! Per-worker request scheduler: requests over a flow's limit wait in the
//! worker's queue (never rejected, never spun on one by one); when several
//! flows are ready, flows below their reservation (MinimumIoRate) go first
//! (dmclock's reservation phase), then the others round-robin.
//!
//! Fixed capacity, allocated up front; ids only (the caller owns the
//! request data). The caller dispatches one request per `next_ready` call
//! when it has device capacity.

use super::bucket::{burst_for, io_cost, kb_cost, FlowLimiter, FlowRates, TokenBucket};
use crate::sqos::{FlowStatus, DEFAULT_BASE_IO_SIZE};
use crate::time::{Duration, Instant};

const NIL: u32 = u32::MAX;

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
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            max_flows: 1024,
            max_queued: 4096,
            base_io_size: DEFAULT_BASE_IO_SIZE,
            window: Duration::from_millis(100),
            burst_window: super::bucket::DEFAULT_BURST_WINDOW,
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

#[derive(Debug, Clone)]
struct FlowState {
    open: bool,
    limiter: FlowLimiter,
    reservation: TokenBucket,
    min_iops: u64,
    head: u32,
    tail: u32,
    len: u32,
    queued_ios: u64,
    ready_at: Instant,
    active_pos: u32,
    offered: u64,
    backlog: u64,
    idle_in_window: bool,
    served: u64,
    served_kb: u64,
    last: WindowReport,
}

/// The per-worker scheduler.
#[derive(Debug, Clone)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    flows: Vec<FlowState>,
    free_flows: Vec<u32>,
    nodes: Vec<Node>,
    free_node: u32,
    active: Vec<u32>,
    cursor: usize,
    window_start: Instant,
}

impl Scheduler {
    /// A scheduler with every slot allocated up front.
    pub fn new(cfg: SchedulerConfig, now: Instant) -> Self {
        assert!(cfg.max_queued < NIL as usize && cfg.max_flows < NIL as usize);
        let idle = FlowState {
            open: false,
            limiter: FlowLimiter::new(now, FlowRates::UNLIMITED),
            reservation: TokenBucket::unlimited(now),
            min_iops: 0,
            head: NIL,
            tail: NIL,
            len: 0,
            queued_ios: 0,
            ready_at: Instant::ZERO,
            active_pos: NIL,
            offered: 0,
            backlog: 0,
            idle_in_window: true,
            served: 0,
            served_kb: 0,
            last: WindowReport {
                reservation_met: true,
                ..WindowReport::default()
            },
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
        Scheduler {
            cfg,
            flows: vec![idle; cfg.max_flows],
            free_flows: (0..cfg.max_flows as u32).rev().collect(),
            nodes,
            free_node: if cfg.max_queued > 0 { 0 } else { NIL },
            active: Vec::with_capacity(cfg.max_flows),
            cursor: 0,
            window_start: now,
        }
    }

    /// Opens a flow slot with `rates`; `None` when all slots are in use.
    pub fn open_flow(&mut self, now: Instant, rates: FlowRates) -> Option<FlowSlot> {
        let i = self.free_flows.pop()?;
        let cfg = self.cfg;
        let f = &mut self.flows[i as usize];
        f.open = true;
        f.limiter = FlowLimiter::with_params(now, rates, cfg.base_io_size, cfg.burst_window);
        f.min_iops = rates.min_iops;
        f.reservation = TokenBucket::new(
            now,
            rates.min_iops,
            burst_for(rates.min_iops, cfg.burst_window),
        );
        f.ready_at = Instant::ZERO;
        f.offered = 0;
        f.backlog = 0;
        f.idle_in_window = true;
        f.served = 0;
        f.served_kb = 0;
        f.last = WindowReport {
            reservation_met: true,
            ..WindowReport::default()
        };
        Some(FlowSlot(i))
    }

    /// Closes a flow slot; refused (false) while requests are queued.
    pub fn close_flow(&mut self, slot: FlowSlot) -> bool {
        match self.flows.get_mut(slot.index()) {
            Some(f) if f.open && f.len == 0 => {
                f.open = false;
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
        let f = self.flow_mut(slot)?;
        f.limiter.set_rates(now, rates);
        f.reservation
            .set_limits(now, rates.min_iops, burst_for(rates.min_iops, bw));
        f.min_iops = rates.min_iops;
        f.ready_at = Instant::ZERO;
        Ok(())
    }

    fn flow_mut(&mut self, slot: FlowSlot) -> Result<&mut FlowState, SchedulerError> {
        match self.flows.get_mut(slot.index()) {
            Some(f) if f.open => Ok(f),
            _ => Err(SchedulerError::NoSuchFlow),
        }
    }

    /// Queues request `req` of `bytes` for `slot`.
    pub fn enqueue(
        &mut self,
        slot: FlowSlot,
        req: RequestId,
        bytes: u64,
    ) -> Result<(), SchedulerError> {
        self.flow_mut(slot)?;
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
        let cost = io_cost(bytes, self.cfg.base_io_size);
        let f = &mut self.flows[slot.index()];
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
    /// the caller [`enqueue`](Self::enqueue)s it. O(1).
    pub fn try_now(&mut self, now: Instant, slot: FlowSlot, bytes: u64) -> bool {
        if !self.active.is_empty() {
            return false;
        }
        self.tick(now);
        let base = self.cfg.base_io_size;
        let Ok(f) = self.flow_mut(slot) else {
            return false;
        };
        if f.limiter.try_take(now, bytes).is_err() {
            return false;
        }
        let ios = io_cost(bytes, base);
        f.reservation.take_saturating(now, ios);
        f.offered += ios;
        f.served += ios;
        f.served_kb += kb_cost(bytes);
        true
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
        self.flows.get(slot.index()).map_or(0, |f| f.len as usize)
    }

    /// Requests queued, all flows.
    pub fn total_queued(&self) -> usize {
        self.active
            .iter()
            .map(|&i| self.flows[i as usize].len as usize)
            .sum()
    }

    /// Closes the accounting window if it has elapsed at `now`.
    pub fn tick(&mut self, now: Instant) {
        let len = now.saturating_since(self.window_start);
        if len < self.cfg.window {
            return;
        }
        let slack = |f: &FlowState| f.reservation.burst();
        for f in self.flows.iter_mut().filter(|f| f.open) {
            // A flow that stayed backlogged the whole window wanted more
            // than it got; otherwise it wanted what it offered.
            let wanted = if f.idle_in_window {
                f.backlog.saturating_add(f.offered)
            } else {
                u64::MAX
            };
            let reserved = (f.min_iops as u128 * len.as_nanos() as u128 / 1_000_000_000) as u64;
            let required = wanted.min(reserved);
            let met = f.min_iops == 0 || f.served.saturating_add(slack(f)) >= required;
            f.last = WindowReport {
                length: len,
                offered_ios: f.offered,
                backlog_ios: f.backlog,
                served_ios: f.served,
                served_kb: f.served_kb,
                reservation_met: met,
            };
            f.offered = 0;
            f.served = 0;
            f.served_kb = 0;
            f.backlog = f.queued_ios;
            f.idle_in_window = f.len == 0;
        }
        self.window_start = now;
    }

    /// The last complete window of `slot`.
    pub fn last_window(&self, slot: FlowSlot) -> Option<WindowReport> {
        self.flows
            .get(slot.index())
            .filter(|f| f.open)
            .map(|f| f.last)
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
        let base = self.cfg.base_io_size;
        // Reservation phase.
        for k in 0..n {
            let idx = (self.cursor + k) % n;
            let fi = self.active[idx] as usize;
            let f = &mut self.flows[fi];
            if f.min_iops == 0 || f.ready_at > now {
                continue;
            }
            let bytes = self.nodes[f.head as usize].bytes;
            let ios = io_cost(bytes, base);
            if f.reservation.check(now, ios).is_err() {
                continue;
            }
            match f.limiter.try_take(now, bytes) {
                Ok(()) => {
                    f.reservation.take_saturating(now, ios);
                    return Some(self.pop(fi, now));
                }
                Err(t) => f.ready_at = t,
            }
        }
        // Round-robin phase.
        for k in 0..n {
            let idx = (self.cursor + k) % n;
            let fi = self.active[idx] as usize;
            let f = &mut self.flows[fi];
            if f.ready_at > now {
                continue;
            }
            let bytes = self.nodes[f.head as usize].bytes;
            match f.limiter.try_take(now, bytes) {
                Ok(()) => {
                    f.reservation.take_saturating(now, io_cost(bytes, base));
                    self.cursor = idx + 1;
                    return Some(self.pop(fi, now));
                }
                Err(t) => f.ready_at = t,
            }
        }
        None
    }

    fn pop(&mut self, fi: usize, _now: Instant) -> (FlowSlot, RequestId) {
        let f = &mut self.flows[fi];
        let n = f.head;
        let node = self.nodes[n as usize];
        f.head = node.next;
        if f.head == NIL {
            f.tail = NIL;
        }
        f.len -= 1;
        let ios = io_cost(node.bytes, self.cfg.base_io_size);
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
                self.flows[moved as usize].active_pos = pos as u32;
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
            .map(|&i| self.flows[i as usize].ready_at)
            .min()
    }
}
