//! The per-I/O Storage QoS admission path of a worker with many flows.
//!
//! ```text
//! cargo run --release -p smbdirect-benches --bin qos-path-bench -- [--flows N] [--limit IOPS] [--runs N] [--callgrind]
//! ```
//!
//! A worker's [`Scheduler`] holds `flows` flows (every one limited in both
//! normalized IOPS and KB/s, [`DEFAULT_LIMIT_IOPS`] unless `--limit` says
//! otherwise, every tenth with a reservation). A lane is lent 1 ms of its
//! flow's limit at a time, so the lower the limit, the more often an I/O
//! goes on to the flow's records. There are as
//! many Opens as flows, each naming its flow slot and holding its
//! [`Lane`] (as the server's Open does), laid out in an order unrelated to
//! the slots. Each operation picks an Open at random and admits a 4 KiB I/O
//! through it with [`Scheduler::try_lane`] (the fast path taken whenever
//! nothing is queued: spent from the Open's lane when its loan covers it,
//! else from the flow's records, which then lend the lane more), while a
//! fake clock advances 10 ns per operation, so accounting windows close
//! (every 100 ms of fake time) inside the measurement too, ending every
//! loan. The rates are high enough that every I/O is admitted; the loop
//! counts refusals and the report says if there were any.
//!
//! Three variants of the loop ([`hot_loop`]):
//!
//! * **direct**: look up the Open, then admit at once;
//! * **prefetch**: the Open of request *i* is looked up and, when its lane
//!   does not cover the I/O ([`Scheduler::lane_covers`]), its flow's hot
//!   record is prefetched ([`Scheduler::flow_addr`]); request *i − 8* is
//!   admitted: what the server does when it prefetches at the Open lookup
//!   and admits after parsing and validating the request;
//! * **no-lane**: as direct, but every I/O is admitted on the flow's
//!   records with [`Scheduler::try_now`] (two dependent memory trips: the
//!   Open, then its flow): the path before lanes, for comparison.
//!
//! It also times closing an accounting window with no flow, 1,000 flows
//! and every flow having done I/O in it ([`window_close`]).
//!
//! Each variant runs `runs` times; the report gives the median and the
//! fastest run's ns/op (on a loaded machine other work only adds time). With
//! `--callgrind` the binary re-runs each variant under valgrind's callgrind,
//! collecting inside [`hot_loop`] only, and reports instructions per
//! operation (independent of the machine's load).

use smbdirect_dataplane::hint::prefetch;
use smbdirect_protocol::sqos::enforcement::{
    FlowRates, FlowSlot, Lane, Scheduler, SchedulerConfig,
};
use smbdirect_protocol::time::Instant;
use std::fmt;

/// Default per-flow limit, normalized IOPS.
pub const DEFAULT_LIMIT_IOPS: u64 = 100_000;
/// Bytes per admitted I/O.
pub const IO_BYTES: u64 = 4096;
/// Fake nanoseconds per operation.
pub const STEP_NS: u64 = 10;
/// How many requests ahead the prefetch variant looks up.
pub const PREFETCH_DISTANCE: usize = 8;

/// Which loop to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// Open lookup then admission, back to back.
    Direct,
    /// Open lookup and prefetch [`PREFETCH_DISTANCE`] requests ahead.
    Prefetch,
    /// Open lookup then admission on the flow's records, no lane.
    NoLane,
}

impl Variant {
    /// "direct" or "prefetch".
    pub fn name(self) -> &'static str {
        match self {
            Variant::Direct => "direct",
            Variant::Prefetch => "prefetch",
            Variant::NoLane => "no-lane",
        }
    }

    /// Parses [`Variant::name`].
    pub fn parse(s: &str) -> Option<Variant> {
        match s {
            "direct" => Some(Variant::Direct),
            "prefetch" => Some(Variant::Prefetch),
            "no-lane" => Some(Variant::NoLane),
            _ => None,
        }
    }
}

/// The server's Open as far as the admission path sees it: 64 bytes, the
/// flow slot and the lane among other fields.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
pub struct BenchOpen {
    /// FileId.Persistent.
    pub persistent: u64,
    /// The store's handle.
    pub handle: u64,
    /// The flow the Open's I/O is charged to.
    pub flow: Option<FlowSlot>,
    /// The file's id.
    pub file_id: u64,
    /// Credit lent by the flow.
    pub lane: Lane,
}

/// A scheduler full of flows and the Opens pointing at them.
pub struct Bed {
    sched: Scheduler,
    opens: Vec<BenchOpen>,
    now: u64,
    rng: u64,
}

impl Bed {
    /// `flows` flows limited to [`DEFAULT_LIMIT_IOPS`], one Open each.
    pub fn new(flows: usize) -> Bed {
        Bed::with_limit(flows, DEFAULT_LIMIT_IOPS)
    }

    /// `flows` flows, one Open each (Open i names a slot chosen by a fixed
    /// permutation), each limited to `limit` normalized IOPS and `4 ×
    /// limit` KB/s (both allow `limit` 4 KiB I/Os per second; an Open's
    /// lane is lent 1 ms of that at a time), every tenth with a reservation
    /// of 1,000 IOPS (at most the limit).
    pub fn with_limit(flows: usize, limit: u64) -> Bed {
        let mut sched = Scheduler::new(
            SchedulerConfig {
                max_flows: flows,
                max_queued: 1024,
                ..SchedulerConfig::default()
            },
            Instant::ZERO,
        );
        let mut slots: Vec<FlowSlot> = (0..flows)
            .map(|i| {
                let rates = FlowRates {
                    max_iops: limit,
                    max_kbps: 4 * limit,
                    min_iops: if i % 10 == 0 { limit.min(1_000) } else { 0 },
                };
                sched
                    .open_flow(Instant::ZERO, rates)
                    .expect("max_flows slots")
            })
            .collect();
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        for i in (1..slots.len()).rev() {
            let j = (xorshift(&mut rng) % (i as u64 + 1)) as usize;
            slots.swap(i, j);
        }
        let opens = slots
            .into_iter()
            .enumerate()
            .map(|(i, s)| BenchOpen {
                persistent: i as u64 + 1,
                handle: i as u64,
                flow: Some(s),
                file_id: i as u64,
                lane: Lane::EMPTY,
            })
            .collect();
        Bed {
            sched,
            opens,
            now: 0,
            rng,
        }
    }

    /// Runs `iters` operations of `variant` through [`warm_loop`] (not
    /// timed, not collected under callgrind); returns the refusals.
    pub fn warm_up(&mut self, variant: Variant, iters: u64) -> u64 {
        warm_loop(self, variant, iters)
    }

    /// Runs `iters` operations of `variant`; returns (ns/op, refusals).
    pub fn run(&mut self, variant: Variant, iters: u64) -> (f64, u64) {
        let t = std::time::Instant::now();
        let refused = hot_loop(self, variant, iters);
        let ns = t.elapsed().as_nanos() as f64 / iters as f64;
        (ns, refused)
    }
}

#[inline(always)]
fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// A random index below `n` (multiply-shift range reduction).
#[inline(always)]
fn pick(rng: &mut u64, n: usize) -> usize {
    (((xorshift(rng) >> 32) * n as u64) >> 32) as usize
}

/// `iters` admissions of [`IO_BYTES`] through random Opens; returns how
/// many were refused. Never inlined (callgrind collects inside it).
#[inline(never)]
pub fn hot_loop(bed: &mut Bed, variant: Variant, iters: u64) -> u64 {
    admissions(bed, variant, iters)
}

/// [`hot_loop`]'s work in chunks of 1,000 operations: the warm-up,
/// which callgrind does not collect (a different body from `hot_loop`'s,
/// so the compiler cannot fold the two functions into one).
#[inline(never)]
pub fn warm_loop(bed: &mut Bed, variant: Variant, iters: u64) -> u64 {
    let mut refused = 0;
    let mut left = iters;
    while left > 0 {
        let n = left.min(1000);
        refused += admissions(bed, variant, n);
        left -= n;
    }
    refused
}

#[inline(always)]
fn admissions(bed: &mut Bed, variant: Variant, iters: u64) -> u64 {
    let Bed {
        sched,
        opens,
        now,
        rng,
    } = bed;
    let n = opens.len();
    let mut refused = 0u64;
    let mut admit = |sched: &mut Scheduler, now: &mut u64, o: &mut BenchOpen| {
        *now += STEP_NS;
        if let Some(slot) = o.flow {
            if !sched.try_lane(Instant::from_nanos(*now), slot, &mut o.lane, IO_BYTES) {
                refused += 1;
            }
        }
    };
    match variant {
        Variant::Direct => {
            for _ in 0..iters {
                admit(sched, now, &mut opens[pick(rng, n)]);
            }
        }
        Variant::Prefetch => {
            let mut ring = [0usize; PREFETCH_DISTANCE];
            for i in 0..iters as usize + PREFETCH_DISTANCE {
                let k = i % PREFETCH_DISTANCE;
                if i >= PREFETCH_DISTANCE {
                    admit(sched, now, &mut opens[ring[k]]);
                }
                if i < iters as usize {
                    let j = pick(rng, n);
                    let o = &opens[j];
                    if let Some(s) = o.flow {
                        if !sched.lane_covers(&o.lane, IO_BYTES) {
                            prefetch(sched.flow_addr(s));
                        }
                    }
                    ring[k] = j;
                }
            }
        }
        Variant::NoLane => {
            for _ in 0..iters {
                let o = &opens[pick(rng, n)];
                *now += STEP_NS;
                if let Some(slot) = o.flow {
                    if !sched.try_now(Instant::from_nanos(*now), slot, IO_BYTES) {
                        refused += 1;
                    }
                }
            }
        }
    }
    refused
}

/// One variant's measurements.
#[derive(Debug, Clone)]
pub struct VariantReport {
    /// The variant.
    pub variant: Variant,
    /// ns/op of each run.
    pub runs: Vec<f64>,
    /// Refused admissions over all runs.
    pub refused: u64,
    /// Instructions per operation under callgrind, if measured.
    pub instructions: Option<f64>,
}

impl VariantReport {
    /// Median ns/op.
    pub fn median(&self) -> f64 {
        let mut v = self.runs.clone();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    }

    /// Fastest run (the least disturbed by other load: noise only adds).
    pub fn best(&self) -> f64 {
        self.runs.iter().copied().fold(f64::NAN, f64::min)
    }
}

/// The benchmark's result.
#[derive(Debug, Clone)]
pub struct QosPathReport {
    /// Flows (and Opens).
    pub flows: usize,
    /// Each flow's limit, normalized IOPS.
    pub limit: u64,
    /// Operations per run.
    pub iters: u64,
    /// Per variant.
    pub variants: Vec<VariantReport>,
    /// Window closes, see [`window_close`].
    pub windows: Vec<WindowClose>,
}

/// The cost of closing one accounting window.
#[derive(Debug, Clone, Copy)]
pub struct WindowClose {
    /// Flows that did I/O in the window.
    pub active: usize,
    /// Median µs of one close (over the closes measured).
    pub micros: f64,
}

/// Median µs of closing a 100 ms window in which `active` of the table's
/// flows did one I/O each (the others open but idle), over `rounds`
/// windows. The closes in the middle of the rounds' sequence are what a
/// steady state looks like: each active flow is visited, plus the flows
/// active in the window before.
pub fn window_close(bed: &mut Bed, active: usize, rounds: usize) -> f64 {
    let n = bed.opens.len();
    let active = active.min(n);
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        for k in 0..active {
            let o = &mut bed.opens[(k * 7919) % n];
            bed.now += STEP_NS;
            if let Some(s) = o.flow {
                bed.sched
                    .try_lane(Instant::from_nanos(bed.now), s, &mut o.lane, IO_BYTES);
            }
        }
        bed.now += 100_000_000;
        let t = std::time::Instant::now();
        bed.sched.tick(Instant::from_nanos(bed.now));
        times.push(t.elapsed().as_nanos() as f64 / 1e3);
    }
    times.sort_by(f64::total_cmp);
    times.get(times.len() / 2).copied().unwrap_or(f64::NAN)
}

impl fmt::Display for QosPathReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "qos-path-bench: {} flows limited to {} IOPS (lane loans of {} I/Os), {} ops/run, {} B I/Os, random Opens",
            self.flows,
            self.limit,
            self.limit / 1000,
            self.iters,
            IO_BYTES
        )?;
        for v in &self.variants {
            let runs: Vec<String> = v.runs.iter().map(|r| format!("{r:.1}")).collect();
            write!(
                f,
                "  {:<8} median {:>6.1} ns/op  best {:>6.1}  (runs: {})",
                v.variant.name(),
                v.median(),
                v.best(),
                runs.join(" ")
            )?;
            if let Some(i) = v.instructions {
                write!(f, "  {i:.0} instructions/op")?;
            }
            if v.refused > 0 {
                write!(f, "  ({} refused: rates too low for the run)", v.refused)?;
            }
            writeln!(f)?;
        }
        for w in &self.windows {
            writeln!(
                f,
                "  window close, {} of {} flows with I/O: median {:.1} us",
                w.active, self.flows, w.micros
            )?;
        }
        Ok(())
    }
}

/// Runs both variants `runs` times each (alternating, after one warm-up
/// run each).
pub fn run(flows: usize, limit: u64, iters: u64, runs: usize) -> QosPathReport {
    let mut bed = Bed::with_limit(flows, limit);
    let variants = [Variant::Direct, Variant::Prefetch, Variant::NoLane];
    let mut out: Vec<VariantReport> = variants
        .iter()
        .map(|&variant| VariantReport {
            variant,
            runs: Vec::new(),
            refused: 0,
            instructions: None,
        })
        .collect();
    for &v in &variants {
        bed.warm_up(v, iters.min(1_000_000));
    }
    for _ in 0..runs {
        for r in out.iter_mut() {
            let (ns, refused) = bed.run(r.variant, iters);
            r.runs.push(ns);
            r.refused += refused;
        }
    }
    let windows = [0, 1000, flows]
        .into_iter()
        .filter(|&a| a <= flows)
        .map(|active| WindowClose {
            active,
            micros: window_close(&mut bed, active, 9),
        })
        .collect();
    QosPathReport {
        flows,
        limit,
        iters,
        variants: out,
        windows,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_io_is_admitted_and_reaches_a_flow() {
        let mut bed = Bed::new(1000);
        let variants = [Variant::Direct, Variant::Prefetch, Variant::NoLane];
        for v in variants {
            let (ns, refused) = bed.run(v, 100_000);
            assert!(ns > 0.0);
            assert_eq!(refused, 0, "{v:?}");
        }
        // The fake clock moved 10 ns per I/O, inside the first window.
        // Closing it accounts every admitted I/O (one normalized I/O each)
        // to some flow, plus the loans the Opens' lanes hold unspent.
        assert_eq!(bed.now, 3 * 100_000 * STEP_NS);
        let unspent: u64 = bed.opens.iter().map(|o| o.lane.unspent().0 as u64).sum();
        assert!(unspent > 0, "no loan outstanding: the lanes were not used");
        bed.sched.tick(Instant::from_nanos(bed.now + 100_000_000));
        let served: u64 = bed
            .opens
            .iter()
            .filter_map(|o| bed.sched.last_window(o.flow?))
            .map(|w| w.served_ios)
            .sum();
        assert_eq!(served, 300_000 + unspent);
    }
}
