//! The process clock, and how often a busy-polling loop may read it.
//!
//! Workers and clients read the monotonic clock only every so many idle
//! polls (their timers, [MS-SMBD] 3.1.6 and the 1 ms timer scan, are far
//! coarser than a poll). Where `clock_gettime` is served by the vDSO a
//! read costs tens of nanoseconds, about one idle poll, and every 16 polls
//! keeps the loop's time within a microsecond. Where it is not (a guest
//! whose clocksource is the HPET or the ACPI PM timer: every read is a
//! system call plus an emulated device read, microseconds under TCG) a
//! read every 16 polls made the loop spend most of its idle time in the
//! clock and answer completions late: the Soft-RoCE guest's `send` bench
//! made about 11 clock system calls per round trip, perftest's
//! `ib_send_lat` one. [`idle_polls_per_read`] scales the interval by the
//! measured cost of a read, so reading stays a small share of the loop.
//!
//! [`now`] is the clock of the data path. Where a read is cheap it is
//! `Instant::now()`, nothing more. Where a read is costly (above
//! [`CHEAP_READ_NS`]) and the CPU has `rdtscp` (x86_64), it is the time
//! stamp counter scaled to nanoseconds, the way poll-mode frameworks time
//! their loops: each thread anchors a TSC reading to a real
//! `CLOCK_MONOTONIC` reading taken on that thread and CPU (a guest's TSCs
//! need not agree across vCPUs), anchors again when `rdtscp` says the
//! thread moved to another CPU and every [`REANCHOR`] of TSC time (one
//! system call per thread per 50 ms), and never returns an earlier time
//! than it returned before on that thread. The tick rate is calibrated
//! against `CLOCK_MONOTONIC` at start-up and refined by each thread over
//! its anchors on one CPU, so the error between anchors is the rate's
//! error times at most 50 ms. Each thread counts nanoseconds since a
//! process-wide epoch (an anchor's count plus scaled ticks: integers
//! between anchors); [`now_ns`] returns that count, [`now`] the epoch plus
//! it as an `Instant`, comparable with `Instant::now()` within that error.
//!
//! `SMBDIRECTD_CLOCK=os|tsc|auto` forces a mode (default `auto`); the
//! mode and why it was chosen are in [`describe`], logged by `serve` and
//! `bench` at start-up.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Batches of reads timed once per process; the cheapest batch counts (a
/// batch the scheduler interrupted is not the clock's cost).
const BATCHES: u32 = 8;
/// Reads per batch.
const SAMPLES: u32 = 8;
/// A read at or below this cost (a vDSO read) keeps the base interval and
/// keeps [`now`] on `Instant::now()`.
pub const CHEAP_READ_NS: u64 = 100;
/// The most an interval is stretched (a read of ~6 µs or more).
const MAX_STRETCH: u64 = 64;
/// The environment variable forcing [`now`]'s mode: `os`, `tsc` or `auto`.
pub const CLOCK_ENV: &str = "SMBDIRECTD_CLOCK";
/// TSC time between a thread's anchors to `CLOCK_MONOTONIC`.
pub const REANCHOR: Duration = Duration::from_millis(50);
/// Each of the two start-up calibration windows.
const CALIBRATION_WINDOW: Duration = Duration::from_millis(10);
/// How far the two windows' rates may differ, in parts per million.
const CALIBRATION_AGREE_PPM: u128 = 2_000;
/// A thread refines its rate from anchors on one CPU at least this far
/// apart, and restarts that baseline once it is this long (so a slewed
/// `CLOCK_MONOTONIC` is followed).
const REFINE_AFTER: Duration = Duration::from_secs(1);
const REFINE_RESTART: Duration = Duration::from_secs(64);
/// A refined rate differs from the current by at most this (ppm).
const REFINE_AGREE_PPM: u128 = 10_000;
/// Fraction bits of the fixed-point nanoseconds per tick.
const FRAC_BITS: u32 = 32;
/// Real-clock samples per anchor; the one bracketed most tightly by its
/// two TSC readings counts (a preempted sample is not the anchor).
const ANCHOR_SAMPLES: u32 = 3;

/// Nanoseconds one `Instant::now()` costs on this machine, measured once.
pub fn read_cost_ns() -> u64 {
    static COST: OnceLock<u64> = OnceLock::new();
    *COST.get_or_init(|| cost_of(Instant::now))
}

/// Nanoseconds one [`now`] costs in the mode chosen, measured once: the
/// cost of a TSC read (and its scaling) in `Tsc` mode.
pub fn now_cost_ns() -> u64 {
    static COST: OnceLock<u64> = OnceLock::new();
    *COST.get_or_init(|| match mode() {
        Mode::Os => read_cost_ns(),
        Mode::Tsc => cost_of(now),
    })
}

/// The cheapest batch's time per read of `read`.
fn cost_of(read: fn() -> Instant) -> u64 {
    (0..BATCHES)
        .map(|_| {
            let start = read();
            let mut last = start;
            for _ in 0..SAMPLES {
                last = std::hint::black_box(read());
            }
            last.duration_since(start).as_nanos() as u64 / u64::from(SAMPLES)
        })
        .min()
        .unwrap_or(0)
}

/// Idle polls between clock reads for a loop whose base interval (with a
/// vDSO clock) is `base`: `base` while a read of [`now`] costs at most
/// ~100 ns, else stretched in proportion to the read's cost (up to 64
/// times), so the time spent reading the clock stays about what it is
/// with a vDSO clock. Timers then lag by up to that many idle polls:
/// microseconds to a millisecond, against timers of a millisecond and
/// more. Where [`now`] reads the TSC the cost is that of a TSC read.
pub fn idle_polls_per_read(base: u32) -> u32 {
    stretch(base, now_cost_ns())
}

fn stretch(base: u32, cost_ns: u64) -> u32 {
    if cost_ns <= CHEAP_READ_NS {
        return base;
    }
    let factor = cost_ns.div_ceil(CHEAP_READ_NS).min(MAX_STRETCH);
    u32::try_from(u64::from(base) * factor).unwrap_or(u32::MAX)
}

/// Where [`now`] takes its time from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `Instant::now()` (`clock_gettime(CLOCK_MONOTONIC)`).
    Os,
    /// The TSC, anchored per thread to `CLOCK_MONOTONIC`.
    Tsc,
}

/// What `SMBDIRECTD_CLOCK` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Request {
    Auto,
    Os,
    Tsc,
}

fn parse_request(v: Option<&str>) -> Result<Request, String> {
    match v.map(str::trim) {
        None | Some("") | Some("auto") => Ok(Request::Auto),
        Some("os") => Ok(Request::Os),
        Some("tsc") => Ok(Request::Tsc),
        Some(other) => Err(format!(
            "{CLOCK_ENV}={other:?} is none of os, tsc, auto: using auto"
        )),
    }
}

/// The mode for a request, a `clock_gettime` cost and whether the CPU has
/// `rdtscp`, with the reason (before calibration, which may still refuse
/// the TSC).
fn choose(req: Request, cost_ns: u64, tsc: bool) -> (Mode, &'static str) {
    match (req, tsc) {
        (Request::Os, _) => (Mode::Os, "forced by SMBDIRECTD_CLOCK=os"),
        (Request::Tsc, true) => (Mode::Tsc, "forced by SMBDIRECTD_CLOCK=tsc"),
        (Request::Tsc, false) => (Mode::Os, "SMBDIRECTD_CLOCK=tsc, but the CPU has no rdtscp"),
        (Request::Auto, _) if cost_ns <= CHEAP_READ_NS => (Mode::Os, "clock_gettime is cheap"),
        (Request::Auto, true) => (Mode::Tsc, "clock_gettime is costly"),
        (Request::Auto, false) => (
            Mode::Os,
            "clock_gettime is costly, but the CPU has no rdtscp",
        ),
    }
}

/// Nanoseconds per TSC tick, fixed point with [`FRAC_BITS`] fraction bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rate {
    mult: u64,
}

impl Rate {
    /// `ns` nanoseconds took `ticks` ticks; None unless 10 MHz..100 GHz.
    fn from_span(ns: Duration, ticks: u64) -> Option<Rate> {
        if ticks == 0 {
            return None;
        }
        let mult = (ns.as_nanos() << FRAC_BITS) / u128::from(ticks);
        // 0.01 ns .. 100 ns per tick.
        let lo = (1u128 << FRAC_BITS) / 100;
        let hi = 100u128 << FRAC_BITS;
        (lo..=hi)
            .contains(&mult)
            .then_some(Rate { mult: mult as u64 })
    }

    /// The time `ticks` ticks take, saturating (never overflows).
    fn duration(self, ticks: u64) -> Duration {
        Duration::from_nanos(self.nanos(ticks))
    }

    /// [`Rate::duration`] in nanoseconds.
    #[inline]
    fn nanos(self, ticks: u64) -> u64 {
        let ns = (u128::from(ticks) * u128::from(self.mult)) >> FRAC_BITS;
        u64::try_from(ns).unwrap_or(u64::MAX)
    }

    /// The ticks `d` takes, saturating.
    fn ticks(self, d: Duration) -> u64 {
        u64::try_from((d.as_nanos() << FRAC_BITS) / u128::from(self.mult.max(1)))
            .unwrap_or(u64::MAX)
    }

    fn hz(self) -> u64 {
        self.ticks(Duration::from_secs(1))
    }

    /// The two rates differ by at most `ppm` parts per million.
    fn agrees(self, other: Rate, ppm: u128) -> bool {
        let (a, b) = (u128::from(self.mult), u128::from(other.mult));
        a.abs_diff(b) * 1_000_000 <= a.max(b) * ppm
    }
}

/// A TSC and the real clock (the hardware, or a test's fake).
trait Source {
    /// The TSC and the CPU's TSC_AUX (which Linux sets to the CPU number).
    fn tsc(&mut self) -> (u64, u32);
    fn mono(&mut self) -> Instant;
}

/// The CPU's TSC (`rdtscp`) and `Instant::now()`.
struct Hw;

impl Source for Hw {
    #[inline]
    fn tsc(&mut self) -> (u64, u32) {
        #[cfg(target_arch = "x86_64")]
        {
            let mut aux = 0u32;
            // SAFETY: rdtscp only reads the TSC and TSC_AUX; it is only
            // reached once has_rdtscp() said the CPU has the instruction.
            let t = unsafe { core::arch::x86_64::__rdtscp(&mut aux) };
            (t, aux)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            (0, 0)
        }
    }

    fn mono(&mut self) -> Instant {
        Instant::now()
    }
}

/// Whether the CPU has `rdtscp` (CPUID 0x8000_0001, EDX bit 27).
fn has_rdtscp() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::__cpuid;
        // SAFETY: cpuid exists on every x86_64 CPU (the intrinsic is safe
        // on newer compilers, unsafe on the MSRV's); the extended leaf is
        // read only if the maximum one says it exists.
        #[allow(unused_unsafe)]
        let leaf = |l: u32| unsafe { __cpuid(l) };
        leaf(0x8000_0000).eax >= 0x8000_0001 && leaf(0x8000_0001).edx & (1 << 27) != 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// A TSC reading, its CPU and the real time at it: of a few samples, the
/// real reading bracketed most tightly by two TSC readings on one CPU,
/// timed at their midpoint.
fn anchor<S: Source>(s: &mut S) -> (u64, u32, Instant) {
    let mut best: Option<(u64, u64, u32, Instant)> = None;
    for _ in 0..ANCHOR_SAMPLES {
        let (t1, a1) = s.tsc();
        let at = s.mono();
        let (t2, a2) = s.tsc();
        if a1 != a2 || t2 < t1 {
            continue; // moved to another CPU in between
        }
        let width = t2 - t1;
        if best.map_or(true, |b| width < b.0) {
            best = Some((width, t1 + width / 2, a1, at));
        }
    }
    match best {
        Some((_, t, a, at)) => (t, a, at),
        None => {
            // Moved on every sample: the TSC after the real reading.
            let at = s.mono();
            let (t, a) = s.tsc();
            (t, a, at)
        }
    }
}

/// The rate over two windows of `window`, which must agree; tried a few
/// times (the thread may move to another CPU in a window).
fn calibrate<S: Source>(s: &mut S, window: Duration) -> Option<Rate> {
    for _ in 0..3 {
        let (t0, a0, m0) = anchor(s);
        std::thread::sleep(window);
        let (t1, a1, m1) = anchor(s);
        std::thread::sleep(window);
        let (t2, a2, m2) = anchor(s);
        if a0 != a1 || a1 != a2 || t1 < t0 || t2 < t1 {
            continue;
        }
        let first = Rate::from_span(m1.saturating_duration_since(m0), t1 - t0);
        let second = Rate::from_span(m2.saturating_duration_since(m1), t2 - t1);
        if let (Some(a), Some(b)) = (first, second) {
            if a.agrees(b, CALIBRATION_AGREE_PPM) {
                return Rate::from_span(m2.saturating_duration_since(m0), t2 - t0);
            }
        }
    }
    None
}

/// Anchors taken after the first, process-wide.
static REANCHORS: AtomicU64 = AtomicU64::new(0);
/// The largest difference, at a periodic anchor, between the time the TSC
/// predicted and the real one: the clock's error just before an anchor.
static MAX_CORRECTION_NS: AtomicU64 = AtomicU64::new(0);

/// One thread's TSC clock.
#[derive(Debug)]
struct ThreadClock {
    rate: Rate,
    /// Ticks between anchors.
    period: u64,
    /// The anchor: a TSC reading on CPU `aux` at real time `at`.
    tsc: u64,
    aux: u32,
    at: Instant,
    /// `at` in nanoseconds since `epoch`.
    at_ns: u64,
    /// What the times are counted from ([`now_ns`]).
    epoch: Instant,
    /// The first anchor of the baseline the rate is refined over.
    base_tsc: u64,
    base_at: Instant,
    /// The latest time returned, in nanoseconds since `epoch` (never
    /// return an earlier one).
    last_ns: u64,
}

impl ThreadClock {
    /// A clock counting from `epoch` (no later than its first anchor).
    fn new<S: Source>(rate: Rate, period: Duration, epoch: Instant, s: &mut S) -> ThreadClock {
        let (tsc, aux, at) = anchor(s);
        let at_ns = since(epoch, at);
        ThreadClock {
            rate,
            period: rate.ticks(period),
            tsc,
            aux,
            at,
            at_ns,
            epoch,
            base_tsc: tsc,
            base_at: at,
            last_ns: at_ns,
        }
    }

    /// Nanoseconds since `epoch`: between anchors integer arithmetic on
    /// the TSC alone (no `Instant` or `Duration` on the way).
    #[inline]
    fn now_ns<S: Source>(&mut self, s: &mut S) -> u64 {
        let (tsc, aux) = s.tsc();
        // Wrapping: a TSC behind the anchor reads as far ahead.
        let ticks = tsc.wrapping_sub(self.tsc);
        let t = if aux == self.aux && ticks < self.period {
            self.at_ns.saturating_add(self.rate.nanos(ticks))
        } else {
            self.reanchor(s);
            self.at_ns
        };
        if t > self.last_ns {
            self.last_ns = t;
        }
        self.last_ns
    }

    /// [`ThreadClock::now_ns`] as an `Instant` (the tests' view).
    #[cfg(test)]
    fn now<S: Source>(&mut self, s: &mut S) -> Instant {
        self.epoch + Duration::from_nanos(self.now_ns(s))
    }

    #[cold]
    fn reanchor<S: Source>(&mut self, s: &mut S) -> Instant {
        let (tsc, aux, at) = anchor(s);
        REANCHORS.fetch_add(1, Ordering::Relaxed);
        if aux == self.aux {
            let ticks = tsc.wrapping_sub(self.tsc);
            if ticks < self.period.saturating_mul(2) {
                // A periodic anchor: how far off was the TSC's time?
                let predicted = self.at + self.rate.duration(ticks);
                let off = predicted
                    .saturating_duration_since(at)
                    .max(at.saturating_duration_since(predicted));
                MAX_CORRECTION_NS.fetch_max(off.as_nanos() as u64, Ordering::Relaxed);
            }
            let span = at.saturating_duration_since(self.base_at);
            let span_ticks = tsc.wrapping_sub(self.base_tsc);
            if span >= REFINE_AFTER && span_ticks < u64::MAX / 2 {
                let period = self.rate.duration(self.period);
                // A refinement, not a new rate: a TSC that jumped between
                // the anchors (it may, without a CPU change) is ignored.
                if let Some(r) = Rate::from_span(span, span_ticks)
                    .filter(|r| r.agrees(self.rate, REFINE_AGREE_PPM))
                {
                    self.rate = r;
                    self.period = r.ticks(period);
                }
                if span >= REFINE_RESTART {
                    self.base_tsc = tsc;
                    self.base_at = at;
                }
            }
        } else {
            // Another CPU, another TSC: a new baseline (same rate).
            self.aux = aux;
            self.base_tsc = tsc;
            self.base_at = at;
        }
        self.tsc = tsc;
        self.at = at;
        self.at_ns = since(self.epoch, at);
        at
    }
}

/// Nanoseconds from `epoch` to `t` (0 if `t` is earlier).
#[inline]
fn since(epoch: Instant, t: Instant) -> u64 {
    u64::try_from(t.saturating_duration_since(epoch).as_nanos()).unwrap_or(u64::MAX)
}

/// The process's choice, made once.
#[derive(Debug)]
struct Global {
    mode: Mode,
    rate: Option<Rate>,
    /// What [`now_ns`] counts from: taken before any thread's anchor.
    epoch: Instant,
    reason: String,
    cost_ns: u64,
}

fn global() -> &'static Global {
    static GLOBAL: OnceLock<Global> = OnceLock::new();
    GLOBAL.get_or_init(|| {
        let epoch = Instant::now();
        let var = std::env::var(CLOCK_ENV).ok();
        let (req, warning) = match parse_request(var.as_deref()) {
            Ok(r) => (r, None),
            Err(w) => (Request::Auto, Some(w)),
        };
        let cost_ns = read_cost_ns();
        let (mode, why) = choose(req, cost_ns, has_rdtscp());
        let (mode, rate, why) = match mode {
            Mode::Os => (Mode::Os, None, why.to_string()),
            Mode::Tsc => match calibrate(&mut Hw, CALIBRATION_WINDOW) {
                Some(r) => (Mode::Tsc, Some(r), why.to_string()),
                None => (
                    Mode::Os,
                    None,
                    format!("{why}, but the TSC's rate did not calibrate"),
                ),
            },
        };
        let reason = match warning {
            Some(w) => format!("{why}; {w}"),
            None => why,
        };
        Global {
            mode,
            rate,
            epoch,
            reason,
            cost_ns,
        }
    })
}

thread_local! {
    static THREAD: RefCell<Option<ThreadClock>> = const { RefCell::new(None) };
}

/// The data path's monotonic clock: `Instant::now()`, or where that is a
/// costly system call and the CPU has a TSC, the TSC's time (see the
/// module docs). Never earlier than a previous result on the same thread;
/// results from different threads agree with each other and with
/// `Instant::now()` within the rate's error over at most [`REANCHOR`]
/// (see [`tsc_stats`]).
#[inline]
pub fn now() -> Instant {
    let g = global();
    match g.rate {
        None => Instant::now(),
        Some(rate) => g.epoch + Duration::from_nanos(tsc_now_ns(rate, g.epoch)),
    }
}

/// A free-running count for busy/idle accounting on one pinned thread
/// (the worker's poll loop, the bench's client loop): the TSC on x86_64
/// (`rdtsc`, ~20-40 cycles, no serialisation: an iteration's boundary to
/// within a few dozen cycles), [`now_ns`] elsewhere. Only differences
/// taken on the same thread mean anything, and only as fractions of one
/// another (busy / (busy + idle)): the unit is not calibrated.
#[inline]
pub fn cycles() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc has no preconditions on x86_64.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        now_ns()
    }
}

/// busy / (busy + idle), or None when no cycles were counted.
#[inline]
pub fn busy_share(busy: u64, idle: u64) -> Option<f64> {
    let all = busy.saturating_add(idle);
    (all > 0).then(|| busy as f64 / all as f64)
}

/// Idle iterations a [`BusyMeter`] lets pass between two reads of the TSC.
const METER_IDLE_RUN: u32 = 16;

/// A loop's busy and idle [`cycles`], published as two running sums (one
/// writer: the loop's thread; readers load them): the worker's poll loop
/// ([`crate::planes::WorkerStats::busy_cycles`]) and the bench's client
/// loop. Each call to [`BusyMeter::charge`] ends one iteration of the loop,
/// which found work or did not.
///
/// The TSC is read after every iteration that worked, but only once per
/// [`METER_IDLE_RUN`] idle ones, as the loops read their clock. A spinning
/// loop that reads it on every empty poll costs a poll a few nanoseconds
/// on hardware, and far more in a TCG guest: QEMU serves each guest
/// `rdtsc` under one global lock, so a vCPU polling with `rdtsc` slows
/// the other vCPUs' TSC reads, and their system calls with them
/// (docs/bench-results.md, session 30: in the rxe guest a vCPU spinning on
/// `rdtsc` made another's `getppid` loop 2.2 times slower and its `rdtsc`
/// 8 times). A span read after a worked iteration holds that iteration and
/// the idle ones before it; the idle ones are charged at the cost per idle
/// iteration that the last runs of idle iterations read alone measured (a
/// running average: empty polls cost about the same each), the rest to
/// busy.
#[derive(Debug)]
pub struct BusyMeter {
    busy: u64,
    idle: u64,
    last: u64,
    /// Idle iterations since `last` was read.
    idle_run: u32,
    /// Cycles per idle iteration (0: not measured yet).
    idle_cost: u64,
    /// The current idle run holds a wait ([`BusyMeter::waited`]).
    waited: bool,
}

impl BusyMeter {
    /// A meter counting from now.
    pub fn new() -> Self {
        BusyMeter {
            busy: 0,
            idle: 0,
            last: cycles(),
            idle_run: 0,
            idle_cost: 0,
            waited: false,
        }
    }

    /// Ends an iteration that found work (`worked`) or did not, and stores
    /// the sums it changed in `busy` and `idle` (relaxed stores: these have
    /// no other writer). An idle iteration is counted, and the TSC read
    /// only when it ends a run of [`METER_IDLE_RUN`] or a wait.
    #[inline]
    pub fn charge(&mut self, worked: bool, busy: &AtomicU64, idle: &AtomicU64) {
        if !worked {
            self.idle_run += 1;
            if self.idle_run < METER_IDLE_RUN && !self.waited {
                return;
            }
            let c = cycles();
            let spent = c.wrapping_sub(self.last);
            if !self.waited {
                let per = spent / u64::from(self.idle_run);
                self.idle_cost = match self.idle_cost {
                    0 => per,
                    old => old - old / 8 + per / 8,
                };
            }
            self.last = c;
            self.idle_run = 0;
            self.waited = false;
            self.idle = self.idle.wrapping_add(spent);
            idle.store(self.idle, Ordering::Relaxed);
            return;
        }
        let c = cycles();
        let spent = c.wrapping_sub(self.last);
        self.last = c;
        let before = u64::from(self.idle_run)
            .saturating_mul(self.idle_cost)
            .min(spent);
        self.idle_run = 0;
        if before > 0 {
            self.idle = self.idle.wrapping_add(before);
            idle.store(self.idle, Ordering::Relaxed);
        }
        self.busy = self.busy.wrapping_add(spent - before);
        busy.store(self.busy, Ordering::Relaxed);
    }

    /// The iteration about to be charged idle waited (slept or napped): the
    /// TSC is read when it is charged and the whole span goes to idle,
    /// without teaching the meter what an idle iteration costs.
    #[inline]
    pub fn waited(&mut self) {
        self.waited = true;
    }
}

impl Default for BusyMeter {
    fn default() -> Self {
        Self::new()
    }
}

/// [`now`] as nanoseconds since a fixed instant of this process (the same
/// for every thread). For a loop that keeps its time as a number: where
/// [`now`] runs on the TSC this is integer arithmetic between anchors,
/// without the `Instant` and `Duration` conversions (a few dozen
/// instructions a read, several reads a round trip). Never earlier than a
/// previous result on the same thread.
#[inline]
pub fn now_ns() -> u64 {
    let g = global();
    match g.rate {
        None => since(g.epoch, Instant::now()),
        Some(rate) => tsc_now_ns(rate, g.epoch),
    }
}

/// An `Instant` in [`now_ns`]'s count (0 for one before the epoch, which
/// is taken before any caller can hold an `Instant` of [`now`]).
#[inline]
pub fn ns_of(t: Instant) -> u64 {
    since(global().epoch, t)
}

/// The `Instant` of a [`now_ns`] count: `ns_of(instant_of(n)) == n`.
#[inline]
pub fn instant_of(ns: u64) -> Instant {
    global().epoch + Duration::from_nanos(ns)
}

#[inline]
fn tsc_now_ns(rate: Rate, epoch: Instant) -> u64 {
    THREAD
        .try_with(|t| {
            let mut t = t.borrow_mut();
            let c = t.get_or_insert_with(|| ThreadClock::new(rate, REANCHOR, epoch, &mut Hw));
            c.now_ns(&mut Hw)
        })
        // The thread is exiting: its clock is gone.
        .unwrap_or_else(|_| since(epoch, Instant::now()))
}

/// The mode [`now`] uses in this process (chosen, and calibrated, on the
/// first call of this, [`now`] or [`describe`]).
pub fn mode() -> Mode {
    global().mode
}

/// One line saying which clock [`now`] reads and why.
pub fn describe() -> String {
    let g = global();
    match g.rate {
        Some(r) => format!(
            "clock: TSC at {:.3} GHz, anchored per thread to CLOCK_MONOTONIC every {} ms, a read costs {} ns (a clock_gettime {} ns; {}; {CLOCK_ENV}=os|tsc|auto)",
            r.hz() as f64 / 1e9,
            REANCHOR.as_millis(),
            now_cost_ns(),
            g.cost_ns,
            g.reason
        ),
        None => format!(
            "clock: clock_gettime, a read costs {} ns ({}; {CLOCK_ENV}=os|tsc|auto)",
            g.cost_ns, g.reason
        ),
    }
}

/// Anchors taken after each thread's first, and the largest error seen
/// at a periodic anchor (nanoseconds), process-wide; zeros in `Os` mode.
pub fn tsc_stats() -> (u64, u64) {
    (
        REANCHORS.load(Ordering::Relaxed),
        MAX_CORRECTION_NS.load(Ordering::Relaxed),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_meter_charges_each_span_to_the_side_that_worked() {
        let (busy, idle) = (AtomicU64::new(0), AtomicU64::new(0));
        let mut m = BusyMeter::new();
        m.charge(true, &busy, &idle);
        let b1 = busy.load(Ordering::Relaxed);
        assert_eq!(idle.load(Ordering::Relaxed), 0);
        std::thread::sleep(Duration::from_millis(2));
        m.waited();
        m.charge(false, &busy, &idle);
        // The 2 ms asleep went to idle at once; busy kept its sum.
        assert_eq!(busy.load(Ordering::Relaxed), b1);
        let i1 = idle.load(Ordering::Relaxed);
        assert!(i1 > 0);
        m.charge(true, &busy, &idle);
        assert!(busy.load(Ordering::Relaxed) >= b1);
        assert_eq!(idle.load(Ordering::Relaxed), i1);
        let share = busy_share(busy.load(Ordering::Relaxed), i1).expect("cycles counted");
        assert!(
            share < 0.5,
            "a 2 ms sleep counted as idle outweighs three short spans: {share}"
        );
        assert_eq!(busy_share(0, 0), None);
        assert_eq!(busy_share(3, 1), Some(0.75));
    }

    #[test]
    fn a_busy_meter_reads_once_per_idle_run_and_splits_a_mixed_span() {
        let (busy, idle) = (AtomicU64::new(0), AtomicU64::new(0));
        let mut m = BusyMeter::new();
        // Idle iterations publish nothing until a run of METER_IDLE_RUN
        // ends: the TSC was not read for them.
        for _ in 1..METER_IDLE_RUN {
            m.charge(false, &busy, &idle);
        }
        assert_eq!(idle.load(Ordering::Relaxed), 0);
        m.charge(false, &busy, &idle);
        let i1 = idle.load(Ordering::Relaxed);
        assert!(i1 > 0, "a whole idle run is read and charged");
        assert_eq!(busy.load(Ordering::Relaxed), 0);
        // A few idle iterations, then one that works for 2 ms: the span
        // read after it holds both; the idle ones are charged at the
        // measured cost of an idle iteration (tiny), the rest to busy.
        for _ in 0..3 {
            m.charge(false, &busy, &idle);
        }
        assert_eq!(idle.load(Ordering::Relaxed), i1);
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(2) {
            std::hint::spin_loop();
        }
        m.charge(true, &busy, &idle);
        let (b, i2) = (busy.load(Ordering::Relaxed), idle.load(Ordering::Relaxed));
        assert!(i2 >= i1);
        assert!(
            b > 2 * (i2 - i1),
            "2 ms of work against three empty iterations: busy {b}, idle part {}",
            i2 - i1
        );
        // Without a measured idle cost (a fresh meter), a mixed span is
        // all busy.
        let (busy2, idle2) = (AtomicU64::new(0), AtomicU64::new(0));
        let mut m2 = BusyMeter::new();
        m2.charge(false, &busy2, &idle2);
        m2.charge(true, &busy2, &idle2);
        assert_eq!(idle2.load(Ordering::Relaxed), 0);
        assert!(busy2.load(Ordering::Relaxed) > 0);
    }

    #[test]
    fn cheap_clocks_keep_the_base_interval_and_costly_ones_stretch_it_up_to_a_cap() {
        assert_eq!(stretch(16, 25), 16);
        assert_eq!(stretch(16, 100), 16);
        assert_eq!(stretch(16, 250), 48);
        assert_eq!(stretch(16, 1_000), 160);
        assert_eq!(stretch(16, 50_000), 16 * 64);
        assert_eq!(stretch(u32::MAX, 50_000), u32::MAX);
    }

    #[test]
    fn the_measured_cost_is_stable_and_the_interval_never_shrinks() {
        let c = read_cost_ns();
        assert_eq!(read_cost_ns(), c, "measured once");
        assert_eq!(now_cost_ns(), now_cost_ns(), "measured once");
        assert!(idle_polls_per_read(16) >= 16);
    }

    #[test]
    fn the_variable_forces_a_mode_and_auto_takes_the_tsc_only_where_reads_are_costly() {
        assert_eq!(parse_request(None), Ok(Request::Auto));
        assert_eq!(parse_request(Some("auto")), Ok(Request::Auto));
        assert_eq!(parse_request(Some(" os ")), Ok(Request::Os));
        assert_eq!(parse_request(Some("tsc")), Ok(Request::Tsc));
        assert!(parse_request(Some("hpet")).is_err());
        assert_eq!(choose(Request::Auto, 25, true).0, Mode::Os);
        assert_eq!(choose(Request::Auto, CHEAP_READ_NS, true).0, Mode::Os);
        assert_eq!(choose(Request::Auto, CHEAP_READ_NS + 1, true).0, Mode::Tsc);
        assert_eq!(choose(Request::Auto, 5_000, false).0, Mode::Os);
        assert_eq!(choose(Request::Os, 5_000, true).0, Mode::Os);
        assert_eq!(choose(Request::Tsc, 25, true).0, Mode::Tsc);
        assert_eq!(choose(Request::Tsc, 25, false).0, Mode::Os);
    }

    #[test]
    fn rate_arithmetic_is_exact_enough_and_saturates_instead_of_overflowing() {
        let r = Rate::from_span(Duration::from_secs(1), 3_000_000_000).expect("3 GHz");
        assert!(r.hz().abs_diff(3_000_000_000) <= 1, "{}", r.hz());
        let one_s = r.duration(3_000_000_000);
        assert!(one_s.as_nanos().abs_diff(1_000_000_000) <= 1, "{one_s:?}");
        assert!(r.ticks(REANCHOR).abs_diff(150_000_000) <= 1);
        // Ten years of ticks at 3 GHz: exact to a microsecond.
        let ten_years = 10 * 365 * 86_400 * 3_000_000_000u64;
        let d = r.duration(ten_years);
        assert!(d.as_secs().abs_diff(10 * 365 * 86_400) <= 1, "{d:?}");
        // The most ticks at the slowest rate: saturates, no panic.
        let slow = Rate::from_span(Duration::from_nanos(100), 1).expect("10 MHz");
        assert_eq!(slow.duration(u64::MAX), Duration::from_nanos(u64::MAX));
        assert_eq!(slow.ticks(Duration::MAX), u64::MAX);
        // Outside 10 MHz..100 GHz, or no ticks: refused.
        assert!(Rate::from_span(Duration::from_nanos(101), 1).is_none());
        assert!(Rate::from_span(Duration::from_nanos(1), 1_000).is_none());
        assert!(Rate::from_span(Duration::from_secs(1), 0).is_none());
        assert!(r.agrees(
            Rate {
                mult: r.mult + r.mult / 1000
            },
            2_000
        ));
        assert!(!r.agrees(
            Rate {
                mult: r.mult + r.mult / 100
            },
            2_000
        ));
    }

    /// A TSC and clock the test moves by hand; counts real-clock reads.
    struct Fake {
        tsc: u64,
        aux: u32,
        mono: Instant,
        monos: u32,
    }

    impl Source for Fake {
        fn tsc(&mut self) -> (u64, u32) {
            (self.tsc, self.aux)
        }
        fn mono(&mut self) -> Instant {
            self.monos += 1;
            self.mono
        }
    }

    fn fake(tsc: u64) -> (Fake, Rate) {
        let f = Fake {
            tsc,
            aux: 0,
            mono: Instant::now(),
            monos: 0,
        };
        // One nanosecond per tick.
        (
            f,
            Rate {
                mult: 1 << FRAC_BITS,
            },
        )
    }

    const MS: u64 = 1_000_000;

    #[test]
    fn reads_between_anchors_read_no_clock_and_anchors_come_with_the_period_and_a_cpu_change() {
        // Near the top of the counter: the anchor is crossed by a wrap.
        let (mut f, rate) = fake(u64::MAX - 100);
        let mut c = ThreadClock::new(rate, REANCHOR, f.mono, &mut f);
        let t0 = f.mono;
        let anchor_reads = f.monos;
        assert!(anchor_reads >= 1);
        f.tsc = f.tsc.wrapping_add(1_000);
        assert_eq!(c.now(&mut f), t0 + Duration::from_nanos(1_000));
        f.tsc = f.tsc.wrapping_add(40 * MS);
        assert_eq!(c.now(&mut f), t0 + Duration::from_nanos(40 * MS + 1_000));
        assert_eq!(f.monos, anchor_reads, "no clock read between anchors");
        // A period later: anchored again, to the real clock.
        f.tsc = f.tsc.wrapping_add(10 * MS);
        f.mono = t0 + Duration::from_millis(60);
        assert_eq!(c.now(&mut f), t0 + Duration::from_millis(60));
        assert_eq!(f.monos, 2 * anchor_reads);
        // Another CPU (TSC_AUX): anchored again at once.
        f.aux = 1;
        f.tsc = f.tsc.wrapping_add(1);
        f.mono = t0 + Duration::from_millis(61);
        assert_eq!(c.now(&mut f), t0 + Duration::from_millis(61));
        assert_eq!(f.monos, 3 * anchor_reads);
        // A TSC behind the anchor (another CPU's, same aux): anchored too.
        f.tsc = f.tsc.wrapping_sub(5 * MS);
        f.mono = t0 + Duration::from_millis(62);
        assert_eq!(c.now(&mut f), t0 + Duration::from_millis(62));
        assert_eq!(f.monos, 4 * anchor_reads);
    }

    #[test]
    fn an_anchor_behind_the_time_already_returned_holds_the_time_instead_of_going_back() {
        let (mut f, rate) = fake(1_000);
        let mut c = ThreadClock::new(rate, REANCHOR, f.mono, &mut f);
        let t0 = f.mono;
        f.tsc += 40 * MS;
        let high = c.now(&mut f);
        assert_eq!(high, t0 + Duration::from_millis(40));
        // The TSC ran fast: the real clock says 30 ms (found on a move).
        f.aux = 3;
        f.mono = t0 + Duration::from_millis(30);
        assert_eq!(c.now(&mut f), high, "held, not back to 30 ms");
        f.tsc += 5 * MS;
        assert_eq!(c.now(&mut f), high, "35 ms < 40 ms: still held");
        f.tsc += 15 * MS;
        assert_eq!(c.now(&mut f), t0 + Duration::from_millis(50));
    }

    #[test]
    fn a_thread_refines_a_slightly_wrong_rate_from_its_anchors_but_ignores_a_jump() {
        // Calibrated at 1 ns per tick; really 1.005 ns per tick.
        let (mut f, rate) = fake(0);
        let mut c = ThreadClock::new(rate, REANCHOR, f.mono, &mut f);
        let mut real = f.mono;
        for _ in 0..24 {
            f.tsc += 50 * MS; // a period, by the calibrated rate
            real += Duration::from_micros(50_250);
            f.mono = real;
            assert_eq!(c.now(&mut f), real);
        }
        let (_, worst) = tsc_stats();
        assert!(worst >= 250_000, "the 250 us error was recorded: {worst}");
        f.tsc += MS;
        let t = c.now(&mut f);
        let want = real + Duration::from_nanos(1_005_000);
        assert!(
            t.max(want) - t.min(want) <= Duration::from_nanos(2),
            "refined"
        );
        // The TSC jumps 10 s ahead while 50 ms pass: anchored, rate kept.
        let mult = c.rate.mult;
        f.tsc += 10_000 * MS;
        real += Duration::from_millis(50);
        f.mono = real;
        assert_eq!(c.now(&mut f), real);
        assert_eq!(c.rate.mult, mult, "a jump is not a rate");
    }

    fn hw_tsc() -> bool {
        if !has_rdtscp() {
            eprintln!("SKIPPED: this CPU has no rdtscp");
        }
        has_rdtscp()
    }

    #[test]
    fn the_hardware_tsc_calibrates_is_monotonic_and_agrees_with_instant_over_a_sleep() {
        if !hw_tsc() {
            return;
        }
        let rate = calibrate(&mut Hw, CALIBRATION_WINDOW).expect("the TSC calibrates");
        // No periodic anchor: all error over the sleep is the rate's.
        let mut c = ThreadClock::new(rate, Duration::from_secs(60), Instant::now(), &mut Hw);
        let mut prev = c.now(&mut Hw);
        for _ in 0..100_000 {
            let t = c.now(&mut Hw);
            assert!(t >= prev);
            prev = t;
        }
        let span = Duration::from_millis(300);
        std::thread::sleep(span);
        let before = Instant::now();
        let t = c.now(&mut Hw);
        let after = Instant::now();
        // Stated bound: 1 % of the time since the anchor, plus 0.5 ms for
        // the anchor's own reading (the thread may also have moved CPUs,
        // which anchors again and is exact).
        let since = after.saturating_duration_since(c.base_at);
        let tol = since / 100 + Duration::from_micros(500);
        assert!(
            t + tol >= before && t <= after + tol,
            "TSC time off by more than {tol:?}: {:?} before, {:?} after",
            before.saturating_duration_since(t),
            t.saturating_duration_since(after)
        );
    }

    const EXPECT_ENV: &str = "SMBDIRECTD_CLOCK_TEST_EXPECT";

    /// Run by the next test in a child process with `SMBDIRECTD_CLOCK` set
    /// (the mode is chosen once per process).
    #[test]
    #[ignore = "run by the_variable_forces_each_mode_in_a_fresh_process"]
    fn forced_mode_child() {
        let Ok(expect) = std::env::var(EXPECT_ENV) else {
            eprintln!("SKIPPED: only meaningful as the child of the_variable_forces_each_mode_in_a_fresh_process");
            return;
        };
        let line = describe();
        println!("{line}");
        let want = match expect.as_str() {
            "os" => Mode::Os,
            "tsc" => Mode::Tsc,
            other => panic!("expectation {other:?}"),
        };
        assert_eq!(mode(), want, "{line}");
        let mut prev = now();
        let start = Instant::now();
        for _ in 0..10_000 {
            let t = now();
            assert!(t >= prev);
            prev = t;
        }
        std::thread::sleep(REANCHOR * 3);
        let before = Instant::now();
        let t = now();
        let after = Instant::now();
        let tol = REANCHOR / 100 + Duration::from_micros(500);
        assert!(
            t >= start && t + tol >= before && t <= after + tol,
            "{line}"
        );
        if want == Mode::Tsc {
            assert!(tsc_stats().0 >= 1, "slept past a period: anchored again");
        }
    }

    #[test]
    fn the_variable_forces_each_mode_in_a_fresh_process() {
        let exe = std::env::current_exe().expect("test binary");
        let tsc = if has_rdtscp() { "tsc" } else { "os" };
        let auto = if read_cost_ns() > CHEAP_READ_NS {
            tsc
        } else {
            "os"
        };
        for (value, expect, says) in [
            ("os", "os", "forced by SMBDIRECTD_CLOCK=os"),
            ("tsc", tsc, "SMBDIRECTD_CLOCK=tsc"),
            ("auto", auto, "clock_gettime is"),
            ("hpet", auto, "is none of os, tsc, auto"),
        ] {
            let out = std::process::Command::new(&exe)
                .args(["--exact", "clock::tests::forced_mode_child"])
                .args(["--ignored", "--nocapture", "--test-threads=1"])
                .env(CLOCK_ENV, value)
                .env(EXPECT_ENV, expect)
                .output()
                .expect("run the test binary");
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success() && stdout.contains("1 passed") && stdout.contains(says),
                "{CLOCK_ENV}={value}: {stdout}\n{stderr}"
            );
        }
    }
}
