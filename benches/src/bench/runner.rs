//! The runner: client threads pinned to `--cores`, `--connections` spread
//! round-robin over them, `--queue-depth` operations outstanding on each
//! connection, a warm-up, then the measurement (`--duration` or exactly
//! `--iterations` operations), optionally at a fixed `--rate`.
//!
//! Timing. Every operation is timed from its start to the poll that saw it
//! finish, in nanoseconds, into a per-thread HdrHistogram (1 ns to one hour,
//! 3 significant digits) created before the first operation; the threads'
//! histograms are merged at the end. Without `--rate` an operation starts
//! as soon as a slot is free and its start is when it was posted. With
//! `--rate` each connection has a schedule (one operation every
//! `connections / rate` seconds, connections staggered across the
//! interval) and an operation's latency counts from its *intended* start:
//! when the server falls behind and the queue is full, the operations that
//! wait for a slot are charged for the wait (coordinated omission
//! corrected, as wrk2 and HdrHistogram's `recordValueWithExpectedInterval`
//! intend).
//!
//! Phases. All threads open their connections first, then start together
//! from one instant `t0`. Operations *started* (or, at a fixed rate,
//! *scheduled*) before `t0 + warmup` are not measured; those started in the
//! measured window are, even when they finish after it. With
//! `--iterations N` connection `i` measures `N / connections` operations
//! (the first `N % connections` connections one more), so exactly N are
//! measured.
//!
//! The measured loop does not allocate: slots, the free-slot stack and the
//! histogram are created before `t0`, and sessions promise the same
//! ([`Session`]).

use super::error::BenchError;
use super::options::Stop;
use super::progress::Progress;
use super::workload::{Outcome, Session, Workload};
use crate::baseline;
use hdrhistogram::Histogram;
use smbdirect_dataplane::{ab, clock};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Largest latency the histograms hold (longer ones saturate): one hour.
pub const MAX_LATENCY_NS: u64 = 3_600_000_000_000;

/// What to run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Unmeasured run-in.
    pub warmup: Duration,
    /// When the measurement ends.
    pub stop: Stop,
    /// Operations per second over all connections (fixed-rate mode).
    pub rate: Option<f64>,
    /// Outstanding operations per connection.
    pub queue_depth: u32,
    /// Connections.
    pub connections: usize,
    /// One client thread per entry, up to `connections` (None: not pinned).
    pub client_cores: Vec<Option<usize>>,
    /// A connection with operations outstanding and none finishing for this
    /// long ends the run with an error (rather than hanging).
    pub stall_limit: Duration,
}

/// What the run measured.
#[derive(Debug)]
pub struct Measurement {
    /// Latency of every measured operation, ns.
    pub histogram: Histogram<u64>,
    /// Measured operations.
    pub ops: u64,
    /// Operations that finished with an error (any phase).
    pub errors: u64,
    /// Credit stalls over all sessions.
    pub credit_stalls: u64,
    /// From the start of the measured window to the last measured
    /// operation's end.
    pub elapsed: Duration,
    /// Whether every client thread is pinned to its core.
    pub pinned: bool,
    /// Client threads used.
    pub threads: usize,
    /// Share of the client threads' loop cycles that found work
    /// (completions or starts) over the measured window, summed over the
    /// threads ([`clock::cycles`]; None when not sampled).
    pub client_busy: Option<f64>,
    /// The same for the server's poll loops, where the caller can read them
    /// ([`run_with`]'s probe: the loopback server's workers).
    pub server_busy: Option<f64>,
}

/// Busy and idle loop cycles of some threads, summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoopCycles {
    /// Cycles of iterations that found work.
    pub busy: u64,
    /// Cycles of iterations that found none.
    pub idle: u64,
}

impl LoopCycles {
    /// busy / (busy + idle) between `earlier` and `self`.
    pub fn busy_since(self, earlier: LoopCycles) -> Option<f64> {
        clock::busy_share(
            self.busy.saturating_sub(earlier.busy),
            self.idle.saturating_sub(earlier.idle),
        )
    }
}

/// A new latency histogram (ns).
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3).expect("constant histogram bounds are valid")
}

/// In-run A/B ([`ab`], the `ab-phases` feature): the latency of the
/// measured operations that ran under variant A and under variant B, summed
/// over the client threads of the runs since the last [`take_ab`].
static AB_HISTOGRAMS: Mutex<Option<[Histogram<u64>; 2]>> = Mutex::new(None);

/// The per-variant histograms of the runs so far (None without the
/// `ab-phases` feature), leaving none.
pub fn take_ab() -> Option<[Histogram<u64>; 2]> {
    AB_HISTOGRAMS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
}

/// Live counters of one client thread, read by the progress display.
#[derive(Default)]
#[repr(align(128))]
struct Counters {
    completed: AtomicU64,
    errors: AtomicU64,
    /// The thread's measured loop is over (it is closing its sessions).
    drained: AtomicBool,
    /// [`clock::cycles`] of loop iterations with and without work (the
    /// thread's running sums, for [`Measurement::client_busy`]).
    busy_cycles: AtomicU64,
    idle_cycles: AtomicU64,
}

/// Start gate shared by the client threads and the caller.
#[derive(Default)]
struct Gate {
    ready: AtomicUsize,
    abort: AtomicBool,
    go: AtomicBool,
    t0: OnceLock<Instant>,
}

#[derive(Debug, Clone, Copy)]
/// Times in the loop are [`clock::now_ns`] counts: integers, not
/// `Instant`s (where the clock runs on the TSC, the `Instant` and
/// `Duration` conversions were ~100-150 instructions a round trip).
struct Slot {
    start: u64,
    measured: bool,
    busy: bool,
}

struct Conn<S> {
    index: usize,
    session: S,
    slots: Box<[Slot]>,
    free: Vec<u32>,
    outstanding: u32,
    seq: u64,
    quota: u64,
    started_measured: u64,
    next_due: u64,
    last_progress: u64,
    finished: bool,
}

struct ThreadResult {
    histogram: Histogram<u64>,
    ops: u64,
    errors: u64,
    credit_stalls: u64,
    last_done: Option<Instant>,
    pinned: bool,
}

/// Measured operations connection `index` owes in `--iterations` mode.
fn quota(stop: Stop, index: usize, connections: usize) -> u64 {
    match stop {
        Stop::After(_) => u64::MAX,
        Stop::Iterations(n) => {
            let c = connections as u64;
            n / c + u64::from((index as u64) < n % c)
        }
    }
}

/// Runs `workload` as `plan` says; `progress` is updated about once a
/// second from the calling thread, which otherwise sleeps.
pub fn run<W: Workload>(
    workload: &W,
    plan: &Plan,
    progress: &mut Progress,
) -> Result<Measurement, BenchError> {
    run_with(workload, plan, progress, None)
}

/// [`run`], also sampling `server` (the busy and idle cycles of the
/// threads serving the workload, e.g. the loopback server's workers) and
/// the client threads' own at the start of the measured window and at its
/// end (`--duration`), or when the threads have drained (`--iterations`),
/// for [`Measurement::server_busy`] and [`Measurement::client_busy`]. The
/// caller's thread wakes at those edges (else every 20 ms, as before).
pub fn run_with<W: Workload>(
    workload: &W,
    plan: &Plan,
    progress: &mut Progress,
    server: Option<&(dyn Fn() -> LoopCycles + Sync)>,
) -> Result<Measurement, BenchError> {
    let threads = plan.client_cores.len().min(plan.connections).max(1);
    let gate = Gate::default();
    let counters: Vec<Counters> = (0..threads).map(|_| Counters::default()).collect();
    std::thread::scope(|s| {
        let mut handles = Vec::with_capacity(threads);
        for t in 0..threads {
            let (gate, counters) = (&gate, &counters[t]);
            let spawned = std::thread::Builder::new()
                .name(format!("bench-client-{t}"))
                .spawn_scoped(s, move || {
                    let r = client_thread(workload, plan, t, threads, gate, counters);
                    if r.is_err() {
                        gate.abort.store(true, Ordering::Release);
                    }
                    r
                });
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    gate.abort.store(true, Ordering::Release);
                    for h in handles {
                        let _ = h.join();
                    }
                    return Err(BenchError::failed("starting client threads", e));
                }
            }
        }
        // Wait for every connection to open, then start everyone at once.
        while gate.ready.load(Ordering::Acquire) < threads && !gate.abort.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let client_cycles = || {
            counters
                .iter()
                .fold(LoopCycles::default(), |a, c| LoopCycles {
                    busy: a.busy + c.busy_cycles.load(Ordering::Relaxed),
                    idle: a.idle + c.idle_cycles.load(Ordering::Relaxed),
                })
        };
        let sample = || (client_cycles(), server.map(|f| f()));
        // (client, server) cycles at the window's start, then its end.
        let mut window: [Option<(LoopCycles, Option<LoopCycles>)>; 2] = [None, None];
        if !gate.abort.load(Ordering::Acquire) {
            let t0 = clock::now();
            let _ = gate.t0.set(t0);
            gate.go.store(true, Ordering::Release);
            // The window: from the end of the warm-up to the end of the
            // duration (or, with --iterations, until the threads drain).
            let start_at = t0 + plan.warmup;
            let end_at = match plan.stop {
                Stop::After(d) => Some(start_at + d),
                Stop::Iterations(_) => None,
            };
            while !handles.iter().all(|h| h.is_finished()) {
                // Wake at the window's edges, else every 20 ms.
                let now = clock::now();
                let edge = [
                    window[0].is_none().then_some(start_at),
                    end_at.filter(|_| window[1].is_none()),
                ]
                .into_iter()
                .flatten()
                .filter(|&t| t > now)
                .min();
                let nap = Duration::from_millis(20);
                std::thread::sleep(edge.map_or(nap, |t| (t - now).min(nap)));
                let now = clock::now();
                if window[0].is_none() && now >= start_at {
                    window[0] = Some(sample());
                }
                let drained = counters.iter().all(|c| c.drained.load(Ordering::Relaxed));
                if window[1].is_none() && (end_at.is_some_and(|e| now >= e) || drained) {
                    window[1] = Some(sample());
                }
                if drained {
                    // Clear the line before closing connections logs anything.
                    progress.finish();
                    continue;
                }
                let completed = counters
                    .iter()
                    .map(|c| c.completed.load(Ordering::Relaxed))
                    .sum();
                let errors = counters
                    .iter()
                    .map(|c| c.errors.load(Ordering::Relaxed))
                    .sum();
                progress.update(clock::now(), t0, plan.warmup, completed, errors);
            }
            progress.finish();
        }
        let mut results = Vec::with_capacity(threads);
        let mut first_err: Option<BenchError> = None;
        for h in handles {
            let r = h
                .join()
                .unwrap_or_else(|_| Err(BenchError::failed("running", "a client thread panicked")));
            match r {
                Ok(v) => results.push(v),
                // Report the cause, not the threads it stopped.
                Err(e) if first_err.as_ref().map_or(true, is_aborted) => first_err = Some(e),
                Err(_) => {}
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        let mut histogram = histogram();
        let (mut ops, mut errors, mut credit_stalls) = (0, 0, 0);
        let mut last_done: Option<Instant> = None;
        let mut pinned = true;
        for r in results {
            // Same bounds everywhere: adding cannot fail.
            let _ = histogram.add(&r.histogram);
            ops += r.ops;
            errors += r.errors;
            credit_stalls += r.credit_stalls;
            last_done = last_done.max(r.last_done);
            pinned &= r.pinned;
        }
        let measure_start = gate.t0.get().map(|&t| t + plan.warmup);
        let elapsed = match (measure_start, last_done) {
            (Some(m), Some(l)) => l.saturating_duration_since(m),
            _ => Duration::ZERO,
        };
        let (client_busy, server_busy) = match window {
            [Some((c0, s0)), Some((c1, s1))] => (
                c1.busy_since(c0),
                s0.zip(s1).and_then(|(s0, s1)| s1.busy_since(s0)),
            ),
            _ => (None, None),
        };
        Ok(Measurement {
            histogram,
            ops,
            errors,
            credit_stalls,
            elapsed,
            pinned,
            threads,
            client_busy,
            server_busy,
        })
    })
}

const ABORTED: &str = "stopped because another client thread failed";

fn aborted() -> BenchError {
    BenchError::failed("running", ABORTED)
}

fn is_aborted(e: &BenchError) -> bool {
    matches!(e, BenchError::Failed { detail, .. } if detail == ABORTED)
}

fn client_thread<W: Workload>(
    workload: &W,
    plan: &Plan,
    thread: usize,
    threads: usize,
    gate: &Gate,
    counters: &Counters,
) -> Result<ThreadResult, BenchError> {
    let pinned = plan.client_cores[thread].is_some_and(baseline::pin);
    let qd = plan.queue_depth as usize;
    let mut conns = Vec::with_capacity(plan.connections.div_ceil(threads));
    let now = clock::now_ns();
    for index in (thread..plan.connections).step_by(threads) {
        let session = workload.open(index)?;
        conns.push(Conn {
            index,
            session,
            slots: vec![
                Slot {
                    start: now,
                    measured: false,
                    busy: false,
                };
                qd
            ]
            .into_boxed_slice(),
            free: (0..qd as u32).rev().collect(),
            outstanding: 0,
            seq: super::pattern::seq_base(index),
            quota: quota(plan.stop, index, plan.connections),
            started_measured: 0,
            next_due: now,
            last_progress: now,
            finished: false,
        });
    }
    let mut hist = histogram();
    gate.ready.fetch_add(1, Ordering::AcqRel);
    while !gate.go.load(Ordering::Acquire) {
        if gate.abort.load(Ordering::Acquire) {
            close_all(conns);
            return Err(aborted());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let t0 = *gate.t0.get().expect("t0 is set before go");
    for c in conns.iter_mut() {
        c.session.begin(t0 + plan.warmup);
    }
    // In-run A/B (a build with the `ab-phases` feature): a histogram per
    // variant, made before the measured loop like `hist`.
    let mut ab_hists = ab::ENABLED.then(|| [histogram(), histogram()]);
    let r = drive(
        &mut conns,
        &mut hist,
        &mut ab_hists,
        plan,
        t0,
        gate,
        counters,
    )
    .map(|(ops, errors, last)| (ops, errors, last.map(clock::instant_of)));
    if let Some(h) = ab_hists {
        ab::set_variant_b(false);
        let mut merged = AB_HISTOGRAMS.lock().unwrap_or_else(|p| p.into_inner());
        let m = merged.get_or_insert_with(|| [histogram(), histogram()]);
        // Same bounds everywhere: adding cannot fail.
        let _ = m[0].add(&h[0]);
        let _ = m[1].add(&h[1]);
    }
    counters.drained.store(true, Ordering::Relaxed);
    let credit_stalls = conns.iter().map(|c| c.session.credit_stalls()).sum();
    close_all(conns);
    let (ops, errors, last_done) = r?;
    Ok(ThreadResult {
        histogram: hist,
        ops,
        errors,
        credit_stalls,
        last_done,
        pinned,
    })
}

fn close_all<S: Session>(conns: Vec<Conn<S>>) {
    for c in conns {
        c.session.close();
    }
}

/// The measured loop. Returns (measured operations, errors, end of the
/// last measured operation).
fn drive<S: Session>(
    conns: &mut [Conn<S>],
    hist: &mut Histogram<u64>,
    ab_hists: &mut Option<[Histogram<u64>; 2]>,
    plan: &Plan,
    t0: Instant,
    gate: &Gate,
    counters: &Counters,
) -> Result<(u64, u64, Option<u64>), BenchError> {
    let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let t0 = clock::ns_of(t0);
    let measure_start = t0.saturating_add(ns(plan.warmup));
    let end = match plan.stop {
        Stop::After(d) => Some(measure_start.saturating_add(ns(d))),
        Stop::Iterations(_) => None,
    };
    // Whole nanoseconds: under 1 ns of drift per operation.
    let interval = plan
        .rate
        .map(|r| ns(Duration::from_secs_f64(plan.connections as f64 / r)).max(1));
    for c in conns.iter_mut() {
        c.next_due = t0
            + interval.map_or(0, |iv| {
                (iv as f64 * c.index as f64 / plan.connections as f64) as u64
            });
        c.last_progress = t0;
    }
    let (mut ops, mut errors, mut completed) = (0u64, 0u64, 0u64);
    let mut last_done = None;
    let mut turn = 0u64;
    // Busy and idle cycles (Counters::busy_cycles): each pass over the
    // connections is charged to one or the other by whether it found work.
    let mut meter = clock::BusyMeter::new();
    let mut worked = false;
    loop {
        meter.charge(worked, &counters.busy_cycles, &counters.idle_cycles);
        worked = false;
        turn = turn.wrapping_add(1);
        if turn % 1024 == 0 && gate.abort.load(Ordering::Relaxed) {
            return Err(aborted());
        }
        let mut active = false;
        for c in conns.iter_mut() {
            if c.finished && c.outstanding == 0 {
                continue;
            }
            active = true;
            // Completions.
            let mut stray = None;
            let progressed = {
                let Conn {
                    session,
                    slots,
                    free,
                    outstanding,
                    last_progress,
                    ..
                } = c;
                session.poll(&mut |o: Outcome| {
                    let now = clock::now_ns();
                    match slots.get_mut(o.slot as usize) {
                        Some(s) if s.busy => {
                            s.busy = false;
                            if s.measured {
                                let latency = now.saturating_sub(s.start).max(1);
                                hist.saturating_record(latency);
                                if let Some(h) = ab_hists.as_mut() {
                                    if let Some(p) = ab::phase_of(ops) {
                                        h[p].saturating_record(latency);
                                    }
                                    ab::set_variant_b(ab::b_after(ops + 1));
                                }
                                ops += 1;
                                last_done = Some(now);
                            }
                            if !o.ok {
                                errors += 1;
                            }
                            completed += 1;
                            free.push(o.slot);
                            *outstanding -= 1;
                            *last_progress = now;
                        }
                        _ => stray = Some(o.slot),
                    }
                })?
            };
            if let Some(slot) = stray {
                return Err(BenchError::failed(
                    format!("connection {}", c.index),
                    format!("the workload reported slot {slot}, which has no operation in flight"),
                ));
            }
            if progressed {
                worked = true;
                counters.completed.store(completed, Ordering::Relaxed);
                counters.errors.store(errors, Ordering::Relaxed);
            }
            // Starts.
            while !c.finished {
                let Some(&slot) = c.free.last() else { break };
                let now = clock::now_ns();
                let at = if interval.is_some() { c.next_due } else { now };
                if end.is_some_and(|e| at >= e) {
                    c.finished = true;
                    break;
                }
                if at > now {
                    break; // not due yet
                }
                let measured = at >= measure_start;
                if measured {
                    if c.started_measured >= c.quota {
                        c.finished = true;
                        break;
                    }
                    c.started_measured += 1;
                }
                c.free.pop();
                c.slots[slot as usize] = Slot {
                    start: at,
                    measured,
                    busy: true,
                };
                if c.outstanding == 0 {
                    c.last_progress = now;
                }
                c.session.start(slot, c.seq)?;
                worked = true;
                c.seq += 1;
                c.outstanding += 1;
                if let Some(iv) = interval {
                    c.next_due += iv;
                }
            }
            if !progressed && c.outstanding > 0 && turn % 4096 == 0 {
                let quiet = Duration::from_nanos(clock::now_ns().saturating_sub(c.last_progress));
                if quiet > plan.stall_limit {
                    return Err(BenchError::failed(
                        format!("connection {}", c.index),
                        format!(
                            "{} operation(s) outstanding and none finished in {:.1} s: the server is not answering this workload{}",
                            c.outstanding,
                            quiet.as_secs_f64(),
                            match c.session.describe() {
                                d if d.is_empty() => d,
                                d => format!(" ({d})"),
                            }
                        ),
                    ));
                }
            }
        }
        if !active {
            counters.completed.store(completed, Ordering::Relaxed);
            return Ok((ops, errors, last_done));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    /// A session whose operations finish on the next poll (optionally
    /// failing every `fail_every`th).
    struct Instant1 {
        pending: Vec<u32>,
        fail_every: u64,
        seen: u64,
    }

    impl Session for Instant1 {
        fn start(&mut self, slot: u32, _seq: u64) -> Result<(), BenchError> {
            self.pending.push(slot);
            Ok(())
        }
        fn poll(&mut self, done: &mut dyn FnMut(Outcome)) -> Result<bool, BenchError> {
            let any = !self.pending.is_empty();
            while let Some(slot) = self.pending.pop() {
                self.seen += 1;
                let ok = self.fail_every == 0 || self.seen % self.fail_every != 0;
                done(Outcome { slot, ok });
            }
            Ok(any)
        }
        fn close(self) {}
    }

    struct Fake {
        fail_every: u64,
        opened: AtomicU64,
    }

    impl Workload for Fake {
        type Session = Instant1;
        fn name(&self) -> &'static str {
            "fake"
        }
        fn bytes_per_op(&self) -> u64 {
            1
        }
        fn open(&self, _index: usize) -> Result<Instant1, BenchError> {
            self.opened.fetch_add(1, Ordering::Relaxed);
            Ok(Instant1 {
                pending: Vec::with_capacity(64),
                fail_every: self.fail_every,
                seen: 0,
            })
        }
    }

    fn plan(stop: Stop) -> Plan {
        Plan {
            warmup: Duration::from_millis(5),
            stop,
            rate: None,
            queue_depth: 4,
            connections: 3,
            client_cores: vec![None, None],
            stall_limit: Duration::from_secs(5),
        }
    }

    #[test]
    fn iterations_measure_exactly_n_operations_over_all_connections() {
        let w = Fake {
            fail_every: 0,
            opened: AtomicU64::new(0),
        };
        let m = run(&w, &plan(Stop::Iterations(1001)), &mut Progress::disabled()).expect("runs");
        assert_eq!(m.ops, 1001);
        assert_eq!(m.histogram.len(), 1001);
        assert_eq!(w.opened.load(Ordering::Relaxed), 3);
        assert_eq!(m.threads, 2);
    }

    #[test]
    fn failed_operations_are_counted_as_errors() {
        let w = Fake {
            fail_every: 10,
            opened: AtomicU64::new(0),
        };
        let m = run(&w, &plan(Stop::Iterations(1000)), &mut Progress::disabled()).expect("runs");
        // Each of the 3 sessions fails every 10th of its own operations, so
        // n measured operations on a session bring at least floor(n/10)
        // failures: 1,000 over 3 sessions give at least 97, whatever the
        // split. Failures during the warm-up count too (a failed run is
        // never reported clean), so there is no upper bound.
        assert!(m.errors >= 97, "{} errors", m.errors);
    }

    #[test]
    fn fixed_rate_runs_at_about_the_rate() {
        let w = Fake {
            fail_every: 0,
            opened: AtomicU64::new(0),
        };
        let p = Plan {
            rate: Some(2000.0),
            warmup: Duration::ZERO,
            ..plan(Stop::After(Duration::from_millis(300)))
        };
        let m = run(&w, &p, &mut Progress::disabled()).expect("runs");
        // 600 scheduled in 0.3 s (one connection per 1.5 ms, three of them).
        assert!((550..=650).contains(&m.ops), "{} ops", m.ops);
    }

    /// A session whose operations take `service` each, one at a time.
    struct Slow {
        service: Duration,
        busy: Option<(u32, Instant)>,
    }

    impl Session for Slow {
        fn start(&mut self, slot: u32, _seq: u64) -> Result<(), BenchError> {
            self.busy = Some((slot, Instant::now()));
            Ok(())
        }
        fn poll(&mut self, done: &mut dyn FnMut(Outcome)) -> Result<bool, BenchError> {
            match self.busy {
                Some((slot, t)) if t.elapsed() >= self.service => {
                    self.busy = None;
                    done(Outcome { slot, ok: true });
                    Ok(true)
                }
                _ => Ok(false),
            }
        }
        fn close(self) {}
    }

    struct SlowServer;
    impl Workload for SlowServer {
        type Session = Slow;
        fn name(&self) -> &'static str {
            "slow"
        }
        fn bytes_per_op(&self) -> u64 {
            1
        }
        fn open(&self, _index: usize) -> Result<Slow, BenchError> {
            Ok(Slow {
                service: Duration::from_millis(2),
                busy: None,
            })
        }
    }

    #[test]
    fn fixed_rate_latency_counts_from_the_intended_start() {
        // One operation per millisecond scheduled, two milliseconds each,
        // one at a time: the backlog grows, and every late operation is
        // charged for its wait (coordinated omission corrected).
        let p = Plan {
            rate: Some(1000.0),
            warmup: Duration::ZERO,
            queue_depth: 1,
            connections: 1,
            client_cores: vec![None],
            ..plan(Stop::After(Duration::from_millis(100)))
        };
        let m = run(&SlowServer, &p, &mut Progress::disabled()).expect("runs");
        assert!(
            (95..=101).contains(&m.ops),
            "every scheduled op runs: {}",
            m.ops
        );
        let max_ms = m.histogram.max() as f64 / 1e6;
        let min_ms = m.histogram.min() as f64 / 1e6;
        assert!(min_ms >= 2.0, "min {min_ms} ms");
        assert!(
            max_ms > 80.0,
            "the last op waited for the backlog: max {max_ms} ms"
        );
    }

    #[test]
    fn quotas_add_up_to_the_iterations() {
        for n in [1u64, 2, 7, 1000] {
            let sum: u64 = (0..3).map(|i| quota(Stop::Iterations(n), i, 3)).sum();
            assert_eq!(sum, n);
        }
    }

    /// A session that never answers.
    struct Silent;
    impl Session for Silent {
        fn start(&mut self, _slot: u32, _seq: u64) -> Result<(), BenchError> {
            Ok(())
        }
        fn poll(&mut self, _done: &mut dyn FnMut(Outcome)) -> Result<bool, BenchError> {
            Ok(false)
        }
        fn close(self) {}
    }
    struct Mute;
    impl Workload for Mute {
        type Session = Silent;
        fn name(&self) -> &'static str {
            "mute"
        }
        fn bytes_per_op(&self) -> u64 {
            1
        }
        fn open(&self, _index: usize) -> Result<Silent, BenchError> {
            Ok(Silent)
        }
    }

    #[test]
    fn a_server_that_never_answers_is_an_error_not_a_hang() {
        let p = Plan {
            stall_limit: Duration::from_millis(200),
            connections: 1,
            ..plan(Stop::Iterations(10))
        };
        let e = run(&Mute, &p, &mut Progress::disabled()).expect_err("stalls");
        assert!(e.to_string().contains("none finished"), "{e}");
    }
}
