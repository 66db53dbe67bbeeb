//! Static against dynamic dispatch on the data-plane hot path: does making
//! workers generic over [`Provider`] (monomorphised, no vtable) measurably
//! beat trait objects?
//!
//! ```text
//! cargo run --release -p smbdirect-benches --bin dispatch-bench -- [--iters N] [--pairs N] [--callgrind]
//! ```
//!
//! One thread drives both ends of one soft-provider connection (every cache
//! line stays local, so there is no cross-core noise) through the hot path
//! of a worker: post one receive, post one signaled 64-byte Send, poll both
//! completion queues (one Send and one Recv completion). The loop is one
//! function, [`hot_loop`], instantiated twice:
//!
//! * **generic**: with the concrete `SoftQp` and `SoftCq`, as the workers
//!   run (calls resolved at compile time and inlinable);
//! * **dyn**: with `dyn QueuePair` and `dyn CompletionQueue<Handle = ...>`
//!   behind `Box`es (every call through a vtable; the boxes pass through
//!   [`std::hint::black_box`] so the compiler cannot devirtualise them).
//!
//! Each variant has its own connection, set up once. Runs alternate
//! generic, dyn, generic, dyn, ... (at least three pairs); the ratio
//! reported is the median of the per-pair dyn/generic ratios. With
//! `--callgrind` the binary also re-runs each variant under `valgrind
//! --tool=callgrind`, collecting only inside [`hot_loop`], and reports
//! instructions per iteration: a count unaffected by the machine's noise.

use smbdirect_dataplane::provider::soft::{SoftCqHandle, SoftProvider};
use smbdirect_dataplane::provider::{
    Completion, CompletionQueue, ConnRequest, Listener, MemoryRegion, Provider, ProviderError,
    QpCaps, QueuePair, RecvWr, SendOp, SendWr, Sge, WcStatus,
};
use std::fmt;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Bytes of the Send.
pub const MESSAGE_SIZE: usize = 64;

/// Entries of each completion queue: the soft provider reserves a queue
/// pair's send and receive depths on its CQ.
const CQ_ENTRIES: u32 = 256;

/// The completion queue trait object of the soft provider.
pub type DynCq = dyn CompletionQueue<Handle = SoftCqHandle>;

/// Which instantiation of [`hot_loop`] to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// Concrete types (static dispatch).
    Generic,
    /// Trait objects (dynamic dispatch).
    Dyn,
}

impl Variant {
    /// "generic" or "dyn".
    pub fn name(self) -> &'static str {
        match self {
            Variant::Generic => "generic",
            Variant::Dyn => "dyn",
        }
    }

    /// Parses [`Variant::name`].
    pub fn parse(s: &str) -> Option<Variant> {
        match s {
            "generic" => Some(Variant::Generic),
            "dyn" => Some(Variant::Dyn),
            _ => None,
        }
    }
}

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DispatchConfig {
    /// Iterations of the hot path per measurement.
    pub iters: u64,
    /// Generic/dyn pairs; at least 3.
    pub pairs: usize,
    /// Core to pin the thread to (if possible).
    pub core: usize,
}

impl DispatchConfig {
    /// The documented run: 5 pairs of 2 million iterations.
    pub fn standard() -> Self {
        DispatchConfig {
            iters: 2_000_000,
            pairs: 5,
            core: 0,
        }
    }
}

/// Why the benchmark stopped.
#[derive(Debug)]
pub struct DispatchError(pub String);

impl fmt::Display for DispatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DispatchError {}

fn perr(during: &str) -> impl Fn(ProviderError) -> DispatchError + '_ {
    move |e| DispatchError(format!("{during}: {e}"))
}

/// The hot path, `iters` times: post a receive on `rx_qp`, post a signaled
/// Send on `tx_qp`, poll `tx_cq` and `rx_cq`. Returns the completions that
/// were not successes (0 when all went well). Never inlined, so that each
/// instantiation is one symbol (callgrind collects inside it).
#[inline(never)]
pub fn hot_loop<Q, C>(
    tx_qp: &mut Q,
    tx_cq: &mut C,
    rx_qp: &mut Q,
    rx_cq: &mut C,
    recv: &RecvWr,
    send: &SendWr<'_>,
    iters: u64,
) -> Result<u64, ProviderError>
where
    Q: QueuePair + ?Sized,
    C: CompletionQueue + ?Sized,
{
    let mut wcs = [Completion::EMPTY; 4];
    let mut bad = 0u64;
    for _ in 0..iters {
        rx_qp.post_recv(std::slice::from_ref(recv))?;
        tx_qp.post_send(std::slice::from_ref(send))?;
        let n = tx_cq.poll(&mut wcs);
        bad += (n != 1 || wcs[0].status != WcStatus::Success) as u64;
        let n = rx_cq.poll(&mut wcs);
        bad += (n != 1 || wcs[0].status != WcStatus::Success) as u64;
    }
    Ok(bad)
}

/// One connection's two ends, with concrete types.
struct Pair<Q: ?Sized, C: ?Sized> {
    tx_qp: Box<Q>,
    tx_cq: Box<C>,
    rx_qp: Box<Q>,
    rx_cq: Box<C>,
}

/// Registered memory: the Send's source and the receive's destination.
struct Mem {
    buf: Box<[u8]>,
    mr: MemoryRegion,
}

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_sge: 1,
        ird: 1,
        ord: 1,
    }
}

/// Connects two fresh queue pairs on fresh completion queues: (sender,
/// receiver) sides.
#[allow(clippy::type_complexity)]
fn connect<P: Provider>(p: &P) -> Result<((P::Qp, P::Cq), (P::Qp, P::Cq)), DispatchError> {
    let err = perr("connecting two queue pairs");
    let any: SocketAddr = "127.0.0.1:0".parse().expect("literal address");
    let mut listener = p.listen(any).map_err(&err)?;
    let addr = listener.local_addr();
    let rx_cq = p.create_cq(CQ_ENTRIES).map_err(&err)?;
    let tx_cq = p.create_cq(CQ_ENTRIES).map_err(&err)?;
    let (rh, th) = (rx_cq.handle(), tx_cq.handle());
    let timeout = Duration::from_secs(5);
    let (accepted, connected) = std::thread::scope(|s| {
        let acceptor = s.spawn(|| -> Result<P::Qp, ProviderError> {
            let req = listener
                .accept_request(timeout)?
                .ok_or_else(|| ProviderError::Connect("no connection request arrived".into()))?;
            req.accept(&rh, caps(), &[])
        });
        let connected = p.connect(addr, &th, caps(), &[], timeout);
        let accepted = acceptor
            .join()
            .unwrap_or_else(|_| Err(ProviderError::Other("acceptor thread panicked".into())));
        (accepted, connected)
    });
    // The connector's error explains the acceptor's timeout, not vice versa.
    let (tx_qp, _) = connected.map_err(&err)?;
    let rx_qp = accepted.map_err(&err)?;
    Ok(((tx_qp, tx_cq), (rx_qp, rx_cq)))
}

/// Both connections and the memory they use. Field order is drop order: the
/// queue pairs and the provider go before the memory they registered.
struct Bed {
    generic: Pair<<SoftProvider as Provider>::Qp, <SoftProvider as Provider>::Cq>,
    dynamic: Pair<dyn QueuePair, DynCq>,
    _provider: SoftProvider,
    mem: Mem,
}

impl Bed {
    fn new() -> Result<Bed, DispatchError> {
        let mut buf = vec![0u8; 2 * 4096].into_boxed_slice();
        for (i, b) in buf.iter_mut().enumerate().take(MESSAGE_SIZE) {
            *b = i as u8;
        }
        let provider = SoftProvider::new().map_err(perr("creating the soft provider"))?;
        // SAFETY: `buf` is not moved (a boxed slice) and `Bed` drops the
        // provider before `mem`.
        let mr = unsafe { provider.register(buf.as_mut_ptr(), buf.len(), None) }
            .map_err(perr("registering memory"))?;
        let ((tq, tc), (rq, rc)) = connect(&provider)?;
        let generic = Pair {
            tx_qp: Box::new(tq),
            tx_cq: Box::new(tc),
            rx_qp: Box::new(rq),
            rx_cq: Box::new(rc),
        };
        let ((tq, tc), (rq, rc)) = connect(&provider)?;
        // black_box hides the vtables from the optimiser: the calls in
        // `hot_loop::<dyn ..>` stay indirect, as in a worker that got its
        // queue pairs as trait objects from elsewhere.
        let dynamic = Pair {
            tx_qp: std::hint::black_box(Box::new(tq) as Box<dyn QueuePair>),
            tx_cq: std::hint::black_box(Box::new(tc) as Box<DynCq>),
            rx_qp: std::hint::black_box(Box::new(rq) as Box<dyn QueuePair>),
            rx_cq: std::hint::black_box(Box::new(rc) as Box<DynCq>),
        };
        Ok(Bed {
            generic,
            dynamic,
            _provider: provider,
            mem: Mem { buf, mr },
        })
    }

    /// Runs `iters` iterations of `variant`; returns ns per iteration.
    fn run(&mut self, variant: Variant, iters: u64) -> Result<f64, DispatchError> {
        let recv = RecvWr {
            wr_id: 1,
            sge: self.mem.mr.sge(4096, 4096),
        };
        let sges: [Sge; 1] = [self.mem.mr.sge(0, MESSAGE_SIZE as u32)];
        let send = SendWr {
            wr_id: 2,
            op: SendOp::Send {
                sges: &sges,
                invalidate: None,
            },
            signaled: true,
        };
        let t0 = Instant::now();
        let bad = match variant {
            Variant::Generic => {
                let g = &mut self.generic;
                hot_loop(
                    &mut *g.tx_qp,
                    &mut *g.tx_cq,
                    &mut *g.rx_qp,
                    &mut *g.rx_cq,
                    &recv,
                    &send,
                    iters,
                )
            }
            Variant::Dyn => {
                let d = &mut self.dynamic;
                hot_loop::<dyn QueuePair, DynCq>(
                    &mut *d.tx_qp,
                    &mut *d.tx_cq,
                    &mut *d.rx_qp,
                    &mut *d.rx_cq,
                    &recv,
                    &send,
                    iters,
                )
            }
        }
        .map_err(perr("running the hot path"))?;
        let elapsed = t0.elapsed();
        if bad != 0 {
            return Err(DispatchError(format!(
                "{}: {bad} of {} polls did not return exactly one successful completion",
                variant.name(),
                2 * iters
            )));
        }
        if self.buf_received() != self.buf_sent() {
            return Err(DispatchError(format!(
                "{}: the received message differs from the sent one",
                variant.name()
            )));
        }
        Ok(elapsed.as_nanos() as f64 / iters.max(1) as f64)
    }

    fn buf_sent(&self) -> &[u8] {
        &self.mem.buf[..MESSAGE_SIZE]
    }

    fn buf_received(&self) -> &[u8] {
        &self.mem.buf[4096..4096 + MESSAGE_SIZE]
    }
}

/// One generic/dyn pair of measurements (ns per iteration).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Round {
    /// Static dispatch.
    pub generic_ns: f64,
    /// Dynamic dispatch.
    pub dyn_ns: f64,
}

/// Instructions per iteration, from callgrind.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Instructions {
    /// Static dispatch.
    pub generic: f64,
    /// Dynamic dispatch.
    pub dyn_: f64,
}

/// The results.
#[derive(Debug, Clone, PartialEq)]
pub struct DispatchReport {
    /// Iterations per measurement.
    pub iters: u64,
    /// Whether the thread was pinned.
    pub pinned: bool,
    /// The rounds, in order.
    pub rounds: Vec<Round>,
    /// Callgrind's counts, when asked for.
    pub instructions: Option<Instructions>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

impl DispatchReport {
    /// Median of the per-round dyn/generic ratios.
    pub fn median_ratio(&self) -> f64 {
        median(
            self.rounds
                .iter()
                .map(|r| r.dyn_ns / r.generic_ns)
                .collect(),
        )
    }
    /// Median ns per iteration, generic.
    pub fn generic_ns(&self) -> f64 {
        median(self.rounds.iter().map(|r| r.generic_ns).collect())
    }
    /// Median ns per iteration, dyn.
    pub fn dyn_ns(&self) -> f64 {
        median(self.rounds.iter().map(|r| r.dyn_ns).collect())
    }
}

impl fmt::Display for DispatchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "dispatch-bench: soft provider, one thread{}, {} iterations per run of post_recv + post_send (64 B Send, signaled) + poll both CQs",
            if self.pinned { " (pinned)" } else { " (not pinned)" },
            self.iters
        )?;
        writeln!(f, "  round   generic ns/op   dyn ns/op   dyn/generic")?;
        for (i, r) in self.rounds.iter().enumerate() {
            writeln!(
                f,
                "  {:>5}   {:>13.1}   {:>9.1}   {:>11.3}",
                i + 1,
                r.generic_ns,
                r.dyn_ns,
                r.dyn_ns / r.generic_ns
            )?;
        }
        writeln!(
            f,
            "  median  {:>13.1}   {:>9.1}   {:>11.3}  (median of per-round ratios)",
            self.generic_ns(),
            self.dyn_ns(),
            self.median_ratio()
        )?;
        if let Some(i) = self.instructions {
            writeln!(
                f,
                "  callgrind instructions/op: generic {:.1}, dyn {:.1}, dyn/generic {:.3}",
                i.generic,
                i.dyn_,
                i.dyn_ / i.generic
            )?;
        }
        Ok(())
    }
}

/// Runs `cfg.pairs` alternating rounds (after one unmeasured warm-up round).
pub fn run(cfg: &DispatchConfig) -> Result<DispatchReport, DispatchError> {
    if cfg.pairs < 3 || cfg.iters == 0 {
        return Err(DispatchError(format!(
            "want at least 3 pairs and 1 iteration (got {} pairs, {} iterations)",
            cfg.pairs, cfg.iters
        )));
    }
    let mut bed = Bed::new()?;
    // Pinned after the set-up, so the acceptor threads are not confined.
    let pinned = crate::baseline::pin(cfg.core);
    let warm = (cfg.iters / 10).max(1);
    bed.run(Variant::Generic, warm)?;
    bed.run(Variant::Dyn, warm)?;
    let mut rounds = Vec::with_capacity(cfg.pairs);
    for _ in 0..cfg.pairs {
        let generic_ns = bed.run(Variant::Generic, cfg.iters)?;
        let dyn_ns = bed.run(Variant::Dyn, cfg.iters)?;
        rounds.push(Round { generic_ns, dyn_ns });
    }
    Ok(DispatchReport {
        iters: cfg.iters,
        pinned,
        rounds,
        instructions: None,
    })
}

/// Runs one variant once, `iters` iterations, without warm-up (what the
/// callgrind child runs, so the count inside [`hot_loop`] is exact).
pub fn run_once(variant: Variant, iters: u64) -> Result<f64, DispatchError> {
    Bed::new()?.run(variant, iters)
}

/// Instructions per iteration of `variant`: runs `exe --only <variant>
/// --iters <iters>` under callgrind, collecting inside [`hot_loop`] only.
pub fn callgrind_instructions(
    exe: &std::path::Path,
    variant: Variant,
    iters: u64,
) -> Result<f64, DispatchError> {
    let args = ["--only", variant.name(), "--iters", &iters.to_string()].map(String::from);
    callgrind_per_iter(exe, "*dispatch_bench*hot_loop*", &args, iters)
        .map_err(|e| DispatchError(format!("{}: {e}", variant.name())))
}

/// Instructions per iteration of a benchmark loop: runs `exe args` under
/// `valgrind --tool=callgrind`, collecting only inside functions matching
/// `toggle` (a callgrind `--toggle-collect` pattern), and divides the count
/// by `iters`. Errors when valgrind fails or collected nothing.
pub fn callgrind_per_iter(
    exe: &std::path::Path,
    toggle: &str,
    args: &[String],
    iters: u64,
) -> Result<f64, String> {
    let out = std::process::Command::new("valgrind")
        .args([
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            &format!("--toggle-collect={toggle}"),
        ])
        .arg(exe)
        .args(args)
        .output()
        .map_err(|e| format!("running valgrind: {e}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!(
            "valgrind failed ({}): {}",
            out.status,
            stderr.lines().rev().take(5).collect::<Vec<_>>().join(" | ")
        ));
    }
    let collected = stderr
        .lines()
        .find_map(|l| {
            let (_, rest) = l.split_once("Collected :")?;
            rest.trim().replace(',', "").parse::<u64>().ok()
        })
        .ok_or_else(|| "no \"Collected :\" line in callgrind's output".to_string())?;
    if collected == 0 {
        return Err(format!(
            "callgrind collected nothing: no symbol matched {toggle}"
        ));
    }
    Ok(collected as f64 / iters as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_variants_move_the_message_and_complete_every_request() {
        let mut bed = Bed::new().expect("bed");
        for v in [Variant::Generic, Variant::Dyn, Variant::Generic] {
            let ns = bed.run(v, 1000).expect("run");
            assert!(ns > 0.0, "{v:?}");
        }
    }

    #[test]
    fn median_ratio_is_of_per_round_ratios() {
        let r = DispatchReport {
            iters: 1,
            pinned: false,
            rounds: vec![
                Round {
                    generic_ns: 100.0,
                    dyn_ns: 110.0,
                },
                Round {
                    generic_ns: 200.0,
                    dyn_ns: 200.0,
                },
                Round {
                    generic_ns: 100.0,
                    dyn_ns: 130.0,
                },
            ],
            instructions: None,
        };
        assert!((r.median_ratio() - 1.1).abs() < 1e-9);
        assert_eq!(r.generic_ns(), 100.0);
        assert_eq!(r.dyn_ns(), 130.0);
    }

    #[test]
    fn fewer_than_three_pairs_is_refused() {
        let cfg = DispatchConfig {
            pairs: 2,
            ..DispatchConfig::standard()
        };
        assert!(run(&cfg).is_err());
    }
}
