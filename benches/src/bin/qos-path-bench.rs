//! The per-I/O Storage QoS admission path with many flows (see
//! `smbdirect_benches::qos_path_bench`).
//!
//! ```text
//! cargo run --release -p smbdirect-benches --bin qos-path-bench -- [--flows N] [--iters N] [--runs N] [--callgrind]
//! ```

use smbdirect_benches::dispatch_bench::callgrind_per_iter;
use smbdirect_benches::qos_path_bench::{run, Bed, Variant, DEFAULT_LIMIT_IOPS};
use std::process::ExitCode;

const USAGE: &str = "\
usage: qos-path-bench [--flows N] [--limit IOPS] [--iters N] [--runs N] [--callgrind [--callgrind-iters N]]
       qos-path-bench --only direct|prefetch|no-lane [--flows N] [--limit IOPS] [--iters N] [--warmup N]

Admits 4 KiB I/Os through randomly chosen Opens of N flows on one worker's
QoS scheduler (fake clock); reports the median ns/op of each variant.

  --flows N            flows (and Opens) in the table (default 100000)
  --limit IOPS         each flow's limit in normalized IOPS, and 4 x IOPS
                       KB/s (default 100000): an Open's lane is lent
                       IOPS / 1000 I/Os at a time, so a lower limit sends
                       more I/Os to the flow's records (each flow gets about
                       100000000 / N I/Os per second of fake time; a lower
                       limit shows as refusals)
  --iters N            operations per run (default 5000000)
  --runs N             runs per variant, at least 1 (default 5)
  --callgrind          also count instructions/op under valgrind's callgrind
  --callgrind-iters N  operations under callgrind (default 10000000: a
                       100 ms accounting window of fake time, so it
                       includes a window close and the loans it ends)
  --warmup N           with --only: operations run first, not measured
                       (default 1000000, as before each variant's runs)
  --only V             run variant V once (after building the table and
                       the warm-up) and print ns/op (what the callgrind
                       child runs)
  -h, --help           this text";

struct Args {
    flows: usize,
    limit: u64,
    iters: u64,
    runs: usize,
    callgrind: Option<u64>,
    only: Option<Variant>,
    warmup: u64,
}

fn parse(args: impl Iterator<Item = String>) -> Result<Option<Args>, String> {
    let mut a = Args {
        flows: 100_000,
        limit: DEFAULT_LIMIT_IOPS,
        iters: 5_000_000,
        runs: 5,
        callgrind: None,
        only: None,
        warmup: 1_000_000,
    };
    let mut callgrind = false;
    let mut callgrind_iters = 10_000_000u64;
    let args: Vec<String> = args.collect();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .ok_or_else(|| format!("{name} needs a value"))
                .cloned()
        };
        let number = |name: &str, v: String, min: u64| -> Result<u64, String> {
            v.parse::<u64>()
                .ok()
                .filter(|&n| n >= min)
                .ok_or_else(|| format!("{name} {v}: want an integer >= {min}"))
        };
        match arg.as_str() {
            "-h" | "--help" => return Ok(None),
            "--flows" => a.flows = number("--flows", value("--flows")?, 1)? as usize,
            "--limit" => a.limit = number("--limit", value("--limit")?, 1)?,
            "--iters" => a.iters = number("--iters", value("--iters")?, 1)?,
            "--runs" => a.runs = number("--runs", value("--runs")?, 1)? as usize,
            "--callgrind" => callgrind = true,
            "--warmup" => a.warmup = number("--warmup", value("--warmup")?, 0)?,
            "--callgrind-iters" => {
                callgrind_iters = number("--callgrind-iters", value("--callgrind-iters")?, 1)?
            }
            "--only" => {
                let v = value("--only")?;
                a.only = Some(
                    Variant::parse(&v)
                        .ok_or_else(|| format!("--only {v}: direct, prefetch or no-lane"))?,
                );
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if callgrind {
        a.callgrind = Some(callgrind_iters);
    }
    Ok(Some(a))
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("qos-path-bench: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if let Some(v) = args.only {
        let mut bed = Bed::with_limit(args.flows, args.limit);
        bed.warm_up(v, args.warmup);
        let (ns, refused) = bed.run(v, args.iters);
        println!("{}: {ns:.1} ns/op, {refused} refused", v.name());
        return ExitCode::SUCCESS;
    }
    let mut report = run(args.flows, args.limit, args.iters, args.runs);
    if let Some(iters) = args.callgrind {
        let exe = match std::env::current_exe() {
            Ok(e) => e,
            Err(e) => {
                eprintln!("qos-path-bench: callgrind skipped: {e}");
                print!("{report}");
                return ExitCode::SUCCESS;
            }
        };
        for v in report.variants.iter_mut() {
            let a = [
                "--only",
                v.variant.name(),
                "--flows",
                &args.flows.to_string(),
                "--limit",
                &args.limit.to_string(),
                "--iters",
                &iters.to_string(),
            ]
            .map(String::from);
            match callgrind_per_iter(&exe, "*qos_path_bench*hot_loop*", &a, iters) {
                Ok(i) => v.instructions = Some(i),
                Err(e) => eprintln!("qos-path-bench: callgrind skipped: {e}"),
            }
        }
    }
    print!("{report}");
    ExitCode::SUCCESS
}
