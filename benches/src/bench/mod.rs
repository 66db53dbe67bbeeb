//! `smbdirectd bench`: the load generator and latency meter, the client of
//! everything the server speaks.
//!
//! ```text
//! smbdirectd bench --loopback --workload send --size 512 --duration 3
//! smbdirectd bench --connect 192.0.2.7:445 --provider verbs --cores 2,3 \
//!     --connections 8 --queue-depth 16 --workload send --size 4K --json out.json
//! ```
//!
//! * [`options`]: the command line ([`BenchArgs`]) and its checked form
//!   ([`BenchOptions`]);
//! * [`workload`]: the [`Workload`] / [`Session`] traits every `--workload`
//!   implements;
//! * [`runner`]: pinned client threads, queue depth, warm-up, duration or
//!   iterations, fixed rate with coordinated-omission correction;
//! * the workloads: [`send`] (SMB Direct echo round trips), [`raw_send`]
//!   (the same over the bare provider: the baseline), [`pingpong`] (two
//!   threads bouncing a cache line: the hardware floor), [`smb2`] (`read`,
//!   `write`, `mixed`, `qos`: SMB2 I/O through the SMB2 client library),
//!   [`memcpy`] (a copy of the same size: the bulk baseline);
//! * the outputs: [`report`] (table, JSON), [`hgrm`] (HdrHistogram
//!   percentile distribution), [`plot`] (SVG), [`progress`] (the live line);
//! * [`pattern`]: `--verify`'s per-operation payload.

pub mod error;
pub mod hgrm;
pub mod memcpy;
pub mod options;
pub mod pattern;
pub mod pingpong;
pub mod plot;
pub mod progress;
pub mod raw_send;
pub mod report;
pub mod runner;
pub mod send;
pub mod smb2;
pub mod workload;

pub use error::BenchError;
pub use options::{BenchArgs, BenchOptions, ProviderChoice, Stop, Target, WorkloadKind};
pub use report::Report;
pub use workload::{Outcome, Session, Workload};

use progress::Progress;
use smbdirect_controlplane::RunningServer;
use smbdirect_dataplane::provider::soft::{SoftConfig, SoftProvider};
use smbdirect_dataplane::provider::verbs::{self, VerbsConfig, VerbsProvider};
use smbdirect_dataplane::provider::Provider;
use smbdirect_hugepages::BufferPool;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A connection with operations outstanding and none finishing for this
/// long ends the run with an error.
pub const STALL_LIMIT: Duration = Duration::from_secs(10);

/// Buffer pools registered with the provider during a run. The provider's
/// registration contract wants the memory mapped until the provider is
/// dropped, so [`run`] creates this before the provider and drops it after.
#[derive(Default)]
pub struct Retained(Mutex<Vec<BufferPool>>);

impl Retained {
    /// Keeps `pool` mapped until this is dropped.
    pub fn keep(&self, pool: BufferPool) {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(pool);
    }
}

fn plan(opts: &BenchOptions) -> runner::Plan {
    runner::Plan {
        warmup: opts.warmup,
        stop: opts.stop,
        rate: opts.rate,
        queue_depth: opts.queue_depth,
        connections: opts.connections,
        client_cores: opts.client_cores[..opts.client_threads()].to_vec(),
        stall_limit: STALL_LIMIT,
    }
}

fn report(opts: &BenchOptions, provider: &'static str, m: runner::Measurement) -> Report {
    Report {
        smb2: None,
        max_send_size: None,
        memcpy_span: opts.memcpy_span.map(|s| (s, opts.smb2.read_pct)),
        workload: opts.workload.name(),
        size: if opts.workload == WorkloadKind::Pingpong {
            8
        } else {
            opts.size
        },
        queue_depth: opts.queue_depth,
        connections: opts.connections,
        provider,
        target: match opts.target {
            Target::Loopback(_) => "loopback".into(),
            Target::Connect(a) => a.to_string(),
        },
        warmup_s: opts.warmup.as_secs_f64(),
        iterations: match opts.stop {
            Stop::Iterations(n) => Some(n),
            Stop::After(_) => None,
        },
        rate: opts.rate,
        verify: opts.verify,
        server_cores: opts.server_cores.clone(),
        client_cores: opts.client_cores[..m.threads.min(opts.client_cores.len())].to_vec(),
        m,
    }
}

fn progress(opts: &BenchOptions) -> Progress {
    Progress::new(
        format!("[bench {}]", opts.workload.name()),
        !opts.quiet && progress::stderr_is_tty(),
    )
}

/// Runs the benchmark `opts` describes.
pub fn run(opts: &BenchOptions) -> Result<Report, BenchError> {
    // Chosen (and the TSC calibrated) before any thread times anything.
    let clock = smbdirect_dataplane::clock::describe();
    if !opts.quiet {
        eprintln!("bench: {clock}");
    }
    let r = run_chosen(opts);
    // Built with --features ab-phases only.
    if let Some([a, b]) = runner::take_ab() {
        eprintln!("bench: {}", ab_line(&a, &b));
    }
    // Built with --features latency-marks only.
    if let Some(m) = smbdirect_dataplane::marks::report() {
        eprintln!("bench: {m}");
    }
    if !opts.quiet && smbdirect_dataplane::clock::mode() == smbdirect_dataplane::clock::Mode::Tsc {
        let (anchors, worst) = smbdirect_dataplane::clock::tsc_stats();
        eprintln!(
            "bench: clock: {anchors} periodic or migration anchors, largest correction at an anchor {:.1} us",
            worst as f64 / 1e3
        );
    }
    r
}

/// The in-run A/B line: each variant's p50 and operations, and B over A
/// (parsed by scripts/ab-rxe.sh).
fn ab_line(a: &hdrhistogram::Histogram<u64>, b: &hdrhistogram::Histogram<u64>) -> String {
    let p50 = |h: &hdrhistogram::Histogram<u64>| h.value_at_quantile(0.5);
    let ratio = if p50(a) > 0 {
        format!("{:.4}", p50(b) as f64 / p50(a) as f64)
    } else {
        "-".into()
    };
    format!(
        "ab-phases: A p50 {} ns ({} ops), B p50 {} ns ({} ops), B/A {ratio} \
         (variants alternate every {} measured operations; clean with one client thread at QD 1)",
        p50(a),
        a.len(),
        p50(b),
        b.len(),
        smbdirect_dataplane::ab::PHASE_OPS
    )
}

fn run_chosen(opts: &BenchOptions) -> Result<Report, BenchError> {
    if opts.workload == WorkloadKind::Memcpy {
        let w = memcpy::MemcpyWorkload::new(
            opts.size,
            opts.memcpy_span,
            opts.smb2.read_pct,
            opts.queue_depth,
            opts.verify,
        );
        let m = runner::run(&w, &plan(opts), &mut progress(opts))?;
        return Ok(report(opts, "none", m));
    }
    if opts.workload == WorkloadKind::Pingpong {
        let w = pingpong::PingPongWorkload::new(opts.server_cores.clone());
        let m = runner::run(&w, &plan(opts), &mut progress(opts))?;
        return Ok(report(opts, "none", m));
    }
    // Declared before the provider, so dropped after it.
    let retained = Retained::default();
    let use_verbs = match opts.provider {
        ProviderChoice::Soft => false,
        ProviderChoice::Verbs => true,
        ProviderChoice::Auto => verbs::devices().map(|d| !d.is_empty()).unwrap_or(false),
    };
    if use_verbs {
        let p = VerbsProvider::open(VerbsConfig::default()).map_err(|e| {
            BenchError::failed(
                "opening an RDMA device",
                format!("{e} (use --provider soft on hosts without one)"),
            )
        })?;
        run_on(Arc::new(p), opts, &retained)
    } else {
        let p = SoftProvider::with_config(soft_config(opts))
            .map_err(|e| BenchError::failed("starting the soft provider", e))?;
        run_on(Arc::new(p), opts, &retained)
    }
}

/// The soft provider's tables for `opts`. Each connection reserves
/// [`SoftConfig::grants_per_qp`] grant slots at its client end (and, in
/// loopback, where the server shares the provider, up to as many again at
/// its server end) and registers one client pool, so the defaults (65,536
/// slots, 256 regions) held about 233 loopback connections of the 256
/// `--connections` allows. The tables are sized for `--connections`
/// instead (at most 2^20 slots and 1,024 regions, what [`SoftConfig`]
/// accepts: about 1,000 connections).
fn soft_config(opts: &BenchOptions) -> SoftConfig {
    let d = SoftConfig::default();
    let ends: u64 = if matches!(opts.target, Target::Loopback(_)) {
        2
    } else {
        1
    };
    // Room for the control connections and pools beside the measured ones.
    let conns = opts.connections as u64 + 8;
    let slots = (conns * ends * u64::from(d.grants_per_qp))
        .next_power_of_two()
        .min(1 << 20) as u32;
    let regions = (conns + 8).next_power_of_two().min(1024) as u32;
    SoftConfig {
        grant_slots: slots.max(d.grant_slots),
        max_regions: regions.max(d.max_regions),
        ..d
    }
}

fn run_on<P: Provider>(
    provider: Arc<P>,
    opts: &BenchOptions,
    retained: &Retained,
) -> Result<Report, BenchError> {
    let name = provider.name();
    let plan = plan(opts);
    let mut progress = progress(opts);
    let m = match opts.workload {
        WorkloadKind::Send => {
            let (addr, server) = match opts.target {
                Target::Loopback(listen) => {
                    let s = send::start_echo_server(provider.clone(), opts, listen)?;
                    (s.local_addr(), Some(s))
                }
                Target::Connect(addr) => (addr, None),
            };
            let w = send::SendWorkload::new(provider.clone(), addr, opts, retained);
            let probe = server.as_ref().map(worker_cycles);
            let r = runner::run_with(&w, &plan, &mut progress, probe.as_ref().map(as_probe));
            if let Some(s) = server {
                s.shutdown();
            }
            let mut rep = report(opts, name, r?);
            rep.max_send_size = w.negotiated_max_send_size();
            return Ok(rep);
        }
        WorkloadKind::RawSend | WorkloadKind::RawSmbd => {
            let Target::Loopback(listen) = opts.target else {
                return Err(BenchError::Usage(format!(
                    "--workload {} needs --loopback (its peer is a thread of this process)",
                    opts.workload.name()
                )));
            };
            let messages = raw_send::Messages {
                size: opts.size,
                header: opts.workload == WorkloadKind::RawSmbd,
            };
            let echo = raw_send::RawEchoServer::start(
                provider.clone(),
                listen,
                opts.server_cores.first().copied().flatten(),
                opts.connections,
                opts.queue_depth,
                messages,
                retained,
            )?;
            let w = raw_send::RawSendWorkload::new(
                provider.clone(),
                echo.addr(),
                messages,
                opts.queue_depth,
                opts.verify,
                retained,
            );
            let r = runner::run(&w, &plan, &mut progress);
            let echoed = echo.stop();
            let m = r?;
            echoed?;
            m
        }
        WorkloadKind::Read | WorkloadKind::Write | WorkloadKind::Mixed | WorkloadKind::Qos => {
            let (addr, server) = match opts.target {
                Target::Loopback(listen) => {
                    let s = smb2::start_smb2_server(provider.clone(), opts, listen)?;
                    (s.local_addr(), Some(s))
                }
                Target::Connect(addr) => (addr, None),
            };
            let probe = server.as_ref().map(worker_cycles);
            let r = smb2::Smb2Workload::new(provider.clone(), addr, opts, retained).and_then(|w| {
                let m = runner::run_with(&w, &plan, &mut progress, probe.as_ref().map(as_probe))?;
                Ok((w.channel(), w.flow_reports(), m))
            });
            if let Some(s) = server {
                s.shutdown();
            }
            let (channel, flows, m) = r?;
            let mut rep = report(opts, name, m);
            rep.smb2 = Some(report::Smb2Report {
                channel,
                file_size: opts.smb2.file_size,
                read_pct: match opts.workload {
                    WorkloadKind::Read => 100,
                    WorkloadKind::Write => 0,
                    _ => opts.smb2.read_pct,
                },
                flows: (opts.workload == WorkloadKind::Qos).then_some(flows),
            });
            return Ok(rep);
        }
        WorkloadKind::Pingpong | WorkloadKind::Memcpy => {
            return Err(BenchError::failed(
                "running",
                format!(
                    "--workload {} runs without a provider",
                    opts.workload.name()
                ),
            ))
        }
    };
    Ok(report(opts, name, m))
}

/// The loopback server's workers' busy and idle poll-loop cycles, summed
/// (`WorkerStats::busy_cycles`), for `runner::run_with`.
fn worker_cycles(server: &RunningServer) -> impl Fn() -> runner::LoopCycles + Sync {
    let stats = server.stats().clone();
    move || {
        let t = stats.totals();
        runner::LoopCycles {
            busy: t.busy_cycles,
            idle: t.idle_cycles,
        }
    }
}

fn as_probe<F: Fn() -> runner::LoopCycles + Sync>(
    f: &F,
) -> &(dyn Fn() -> runner::LoopCycles + Sync) {
    f
}

/// Renders one output file's contents.
type Render = fn(&Report) -> String;

/// The output files, created before the run so that a bad path fails
/// early.
struct Outputs {
    files: Vec<(PathBuf, File, Render)>,
}

impl Outputs {
    fn create(opts: &BenchOptions) -> Result<Self, BenchError> {
        let mut files = Vec::new();
        let wanted: [(&Option<PathBuf>, &str, Render); 3] = [
            (&opts.json, "--json", |r| r.to_json()),
            (&opts.hgrm, "--hgrm", |r| {
                hgrm::percentile_distribution(&r.m.histogram)
            }),
            (&opts.plot, "--plot", |r| {
                plot::svg(&r.m.histogram, &r.title())
            }),
        ];
        for (path, flag, render) in wanted {
            if let Some(p) = path {
                let f = File::create(p)
                    .map_err(|e| BenchError::Usage(format!("{flag} {}: {e}", p.display())))?;
                files.push((p.clone(), f, render));
            }
        }
        Ok(Outputs { files })
    }

    fn write(self, r: &Report) -> Result<(), String> {
        for (path, mut f, render) in self.files {
            f.write_all(render(r).as_bytes())
                .and_then(|()| f.flush())
                .map_err(|e| format!("writing {}: {e}", Path::new(&path).display()))?;
        }
        Ok(())
    }
}

/// `smbdirectd bench`: runs, prints the table, writes the files. Exit
/// status 0 when every operation succeeded, 1 on errors (failed operations,
/// `--verify` mismatches, a run that could not complete), 2 on usage
/// errors.
pub fn main(args: &BenchArgs) -> ExitCode {
    let fail = |e: &dyn std::fmt::Display, code: u8| {
        eprintln!("smbdirectd bench: {e}");
        ExitCode::from(code)
    };
    let opts = match BenchOptions::from_args(args) {
        Ok(o) => o,
        Err(e) => return fail(&e, e.exit_code()),
    };
    // The loopback server's connection-closing lines are noise here.
    smbdirect_controlplane::log::set_level(smbdirect_controlplane::log::Level::Warn);
    let outputs = match Outputs::create(&opts) {
        Ok(o) => o,
        Err(e) => return fail(&e, e.exit_code()),
    };
    let r = match run(&opts) {
        Ok(r) => r,
        Err(e) => return fail(&e, e.exit_code()),
    };
    println!("{}", r.table());
    if let Err(e) = outputs.write(&r) {
        return fail(&e, 1);
    }
    if r.m.errors > 0 {
        let what = if opts.verify {
            "operation(s) failed or echoed bytes that differ from those sent"
        } else {
            "operation(s) failed"
        };
        return fail(&format!("{} {what}", r.m.errors), 1);
    }
    if r.m.ops == 0 {
        return fail(&"no operation was measured", 1);
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(argv: &[&str]) -> BenchOptions {
        options::test_args::parse(argv).expect("valid options")
    }

    #[test]
    fn the_soft_tables_hold_every_connection_the_cli_allows() {
        let d = SoftConfig::default();
        // The defaults where they suffice.
        assert_eq!(soft_config(&options(&["--loopback"])), d);
        // 256 loopback connections (the most `--connections` takes): a
        // client and a server range of grant slots each, and a client pool
        // each, beside the control connections.
        let lo = soft_config(&options(&["--loopback", "--connections", "256"]));
        let per_qp = u64::from(d.grants_per_qp);
        assert!(u64::from(lo.grant_slots) >= 2 * 264 * per_qp, "{lo:?}");
        assert!(lo.max_regions >= 264, "{lo:?}");
        assert_eq!(lo.grants_per_qp, d.grants_per_qp);
        SoftProvider::with_config(lo).expect("a table the provider accepts");
        // Against a running server only the client ends use it: half that.
        let c = soft_config(&options(&[
            "--connect",
            "127.0.0.1:1",
            "--connections",
            "256",
        ]));
        assert!(u64::from(c.grant_slots) >= 264 * per_qp, "{c:?}");
        assert_eq!(c.grant_slots, lo.grant_slots / 2);
    }

    #[test]
    fn the_ab_line_gives_each_variants_median_and_their_ratio() {
        let (mut a, mut b) = (runner::histogram(), runner::histogram());
        for v in [1000, 1000, 1000, 5000] {
            a.record(v).expect("in bounds");
        }
        for v in [900, 1100, 1100] {
            b.record(v).expect("in bounds");
        }
        let line = ab_line(&a, &b);
        assert!(
            line.starts_with(
                "ab-phases: A p50 1000 ns (4 ops), B p50 1100 ns (3 ops), B/A 1.1000 "
            ),
            "{line}"
        );
        // No A samples: no ratio rather than a division by zero.
        assert!(ab_line(&runner::histogram(), &b).contains("B/A - "));
    }
}
