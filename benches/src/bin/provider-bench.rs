//! Soft-provider Send/Recv latency and RDMA Write/Read throughput next to
//! same-run baselines (see `smbdirect_benches::provider_bench`).
//!
//! ```text
//! cargo run --release -p smbdirect-benches --bin provider-bench -- [--duration S] [--pairs N] [--quick]
//! ```

use smbdirect_benches::provider_bench::{run, BenchConfig};
use std::process::ExitCode;
use std::time::Duration;

const USAGE: &str = "\
usage: provider-bench [--duration S] [--pairs N] [--quick]

Soft-provider Send/Recv round-trip latency (64 B, two threads pinned to
cores 0 and 1) beside a cache-line ping-pong on the same cores, and RDMA
Write/Read throughput for 4 KiB, 64 KiB and 1 MiB beside memcpy of the same
size. Each measurement alternates with its baseline; ratios are medians of
per-pair ratios.

  --duration S   seconds per measurement (default 0.5; --quick: 0.1)
  --pairs N      measurement/baseline pairs, at least 3 (default 5; --quick: 3)
  --quick        a short smoke run
  -h, --help     this text";

fn parse(args: impl Iterator<Item = String>) -> Result<Option<BenchConfig>, String> {
    let args: Vec<String> = args.collect();
    let mut cfg = if args.iter().any(|a| a == "--quick") {
        BenchConfig::quick()
    } else {
        BenchConfig::standard()
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .ok_or_else(|| format!("{name} needs a value"))
                .cloned()
        };
        match a.as_str() {
            "--quick" => {}
            "-h" | "--help" => return Ok(None),
            "--duration" => {
                let v = value("--duration")?;
                let secs: f64 = v
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s > 0.0 && *s <= 3600.0)
                    .ok_or_else(|| format!("--duration {v}: want seconds in (0, 3600]"))?;
                cfg.duration = Duration::from_secs_f64(secs);
                cfg.warmup = cfg.duration.mul_f64(0.2).min(Duration::from_millis(200));
            }
            "--pairs" => {
                let v = value("--pairs")?;
                cfg.pairs = v
                    .parse()
                    .ok()
                    .filter(|&n: &usize| (3..=1000).contains(&n))
                    .ok_or_else(|| format!("--pairs {v}: want 3..=1000"))?;
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Some(cfg))
}

fn main() -> ExitCode {
    let cfg = match parse(std::env::args().skip(1)) {
        Ok(Some(c)) => c,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("provider-bench: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&cfg) {
        Ok(report) => {
            print!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("provider-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
