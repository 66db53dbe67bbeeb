//! Static (generic) against dynamic (`dyn`) dispatch on the soft provider's
//! hot path (see `smbdirect_benches::dispatch_bench`).
//!
//! ```text
//! cargo run --release -p smbdirect-benches --bin dispatch-bench -- [--iters N] [--pairs N] [--callgrind]
//! ```

use smbdirect_benches::dispatch_bench::{
    callgrind_instructions, run, run_once, DispatchConfig, Instructions, Variant,
};
use std::process::ExitCode;

const USAGE: &str = "\
usage: dispatch-bench [--iters N] [--pairs N] [--core C] [--callgrind [--callgrind-iters N]]
       dispatch-bench --only generic|dyn [--iters N]

One thread drives both ends of a soft-provider connection through the hot
path (post_recv, post_send of a 64 B signaled Send, poll both CQs), through
concrete types (generic) and through Box<dyn QueuePair> / Box<dyn
CompletionQueue> (dyn), alternating generic, dyn, ...; reports ns/op and
the median of the per-round dyn/generic ratios.

  --iters N            iterations per run (default 2000000)
  --pairs N            generic/dyn rounds, at least 3 (default 5)
  --core C             core to pin to (default 0)
  --callgrind          also count instructions/op under valgrind's callgrind
  --callgrind-iters N  iterations under callgrind (default 100000)
  --only V             run variant V once and print ns/op (what the
                       callgrind child runs)
  -h, --help           this text";

struct Args {
    cfg: DispatchConfig,
    callgrind: Option<u64>,
    only: Option<Variant>,
}

fn parse(args: impl Iterator<Item = String>) -> Result<Option<Args>, String> {
    let mut a = Args {
        cfg: DispatchConfig::standard(),
        callgrind: None,
        only: None,
    };
    let mut callgrind_iters = 100_000u64;
    let mut callgrind = false;
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
            "--iters" => a.cfg.iters = number("--iters", value("--iters")?, 1)?,
            "--pairs" => a.cfg.pairs = number("--pairs", value("--pairs")?, 3)? as usize,
            "--core" => a.cfg.core = number("--core", value("--core")?, 0)? as usize,
            "--callgrind" => callgrind = true,
            "--callgrind-iters" => {
                callgrind_iters = number("--callgrind-iters", value("--callgrind-iters")?, 1)?
            }
            "--only" => {
                let v = value("--only")?;
                a.only =
                    Some(Variant::parse(&v).ok_or_else(|| format!("--only {v}: generic or dyn"))?);
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
            eprintln!("dispatch-bench: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if let Some(v) = args.only {
        return match run_once(v, args.cfg.iters) {
            Ok(ns) => {
                println!("{}: {ns:.1} ns/op", v.name());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("dispatch-bench: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let mut report = match run(&args.cfg) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("dispatch-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(iters) = args.callgrind {
        let counts = std::env::current_exe()
            .map_err(|e| e.to_string())
            .and_then(|exe| {
                let g = callgrind_instructions(&exe, Variant::Generic, iters)
                    .map_err(|e| e.to_string())?;
                let d =
                    callgrind_instructions(&exe, Variant::Dyn, iters).map_err(|e| e.to_string())?;
                Ok(Instructions {
                    generic: g,
                    dyn_: d,
                })
            });
        match counts {
            Ok(i) => report.instructions = Some(i),
            Err(e) => eprintln!("dispatch-bench: callgrind skipped: {e}"),
        }
    }
    print!("{report}");
    ExitCode::SUCCESS
}
