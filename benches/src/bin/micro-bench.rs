//! Micro-benchmarks: ns/op (median of several runs) and optionally
//! instructions/op from callgrind (see `smbdirect_benches::micro_bench`).
//!
//! ```text
//! cargo run --release -p smbdirect-benches --bin micro-bench -- [--iters N] [--runs N] [--case NAME] [--callgrind]
//! ```

use smbdirect_benches::micro_bench::{callgrind_instructions, countable, median, run, CASES};
use std::process::ExitCode;

const USAGE: &str = "\
usage: micro-bench [--iters N] [--runs N] [--case NAME]... [--callgrind [--callgrind-iters N]]
       micro-bench --only NAME [--iters N]

Cases: smbd-message (one 512 B message through the SMB Direct state
machines), smbd-encode / smbd-decode (a 512 B data-transfer message),
smb2-read-encode / smb2-read-decode (SMB2 header + READ request with one
RDMA descriptor), ring (push + pop), token-bucket (one try_take).

  --iters N            operations per run (default 1000000)
  --runs N             timed runs per case after a warm-up run, median
                       reported (default 5)
  --case NAME          only this case (repeatable)
  --callgrind          also count instructions/op under valgrind's callgrind
  --callgrind-iters N  operations under callgrind (default 100000)
  --only NAME          run NAME once and print ns/op (what callgrind runs)
  -h, --help           this text";

fn number(name: &str, v: Option<&String>) -> Result<u64, String> {
    v.and_then(|s| s.parse::<u64>().ok())
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("{name} needs a positive integer"))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut iters, mut runs, mut cg_iters) = (1_000_000u64, 5u64, 100_000u64);
    let (mut cases, mut callgrind, mut only) = (Vec::new(), false, None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let r = match a.as_str() {
            "--iters" => number(a, it.next()).map(|n| iters = n),
            "--runs" => number(a, it.next()).map(|n| runs = n),
            "--callgrind-iters" => number(a, it.next()).map(|n| cg_iters = n),
            "--callgrind" => {
                callgrind = true;
                Ok(())
            }
            "--case" | "--only" => match it.next() {
                Some(c) if CASES.contains(&c.as_str()) => {
                    if a == "--only" {
                        only = Some(c.clone());
                    } else {
                        cases.push(c.clone());
                    }
                    Ok(())
                }
                other => Err(format!(
                    "{a} {}: cases are {}",
                    other.map_or("(missing)", |s| s),
                    CASES.join(", ")
                )),
            },
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => Err(format!("unknown argument {other}")),
        };
        if let Err(e) = r {
            eprintln!("micro-bench: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    }
    if let Some(c) = only {
        return match run(&c, iters) {
            Ok(ns) => {
                println!("{c} {ns:.2} ns/op");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("micro-bench: {c}: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if cases.is_empty() {
        cases = CASES.iter().map(|s| s.to_string()).collect();
    }
    let exe = std::env::current_exe().ok();
    println!(
        "{:<18} {:>10} {:>10} {:>10} {:>12}",
        "case", "median ns", "min ns", "max ns", "instr/op"
    );
    for c in &cases {
        let mut v = Vec::with_capacity(runs as usize);
        // One warm-up run, then the timed ones.
        let mut r = run(c, iters.min(100_000));
        for _ in 0..runs {
            if r.is_err() {
                break;
            }
            r = run(c, iters).inspect(|&ns| v.push(ns));
        }
        if let Err(e) = r {
            eprintln!("micro-bench: {c}: {e}");
            return ExitCode::FAILURE;
        }
        let (lo, hi) = (
            v.iter().copied().fold(f64::INFINITY, f64::min),
            v.iter().copied().fold(0.0, f64::max),
        );
        let instr = match (&exe, callgrind && countable(c)) {
            (Some(exe), true) => match callgrind_instructions(exe, c, cg_iters) {
                Ok(i) => format!("{i:.1}"),
                Err(e) => {
                    eprintln!("micro-bench: {c}: callgrind: {e}");
                    "error".into()
                }
            },
            _ => "-".into(),
        };
        println!(
            "{c:<18} {:>10.2} {lo:>10.2} {hi:>10.2} {instr:>12}",
            median(&mut v)
        );
    }
    ExitCode::SUCCESS
}
