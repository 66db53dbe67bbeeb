//! `bench` allocates nothing per operation, on either side: a counting
//! global allocator attributes every heap allocation to the kind of thread
//! that made it (client threads `bench-client-N`; the loopback server's
//! `dp-worker-N`; the raw echo peer `bench-raw-echo`), and two runs that
//! differ only in `--iterations` (by 5,000 operations) must make the same
//! number of allocations on those threads, give or take set-up noise.
//! `read` and `write` run with `--verify` too (RDMA channel and inline).

use clap::Parser;
use smbdirect_benches::bench::{run, BenchArgs, BenchOptions};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

const UNKNOWN: u8 = 0;
const CLIENT: u8 = 1;
const SERVER: u8 = 2;
const OTHER: u8 = 3;

static CLIENT_ALLOCS: AtomicU64 = AtomicU64::new(0);
static SERVER_ALLOCS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static KIND: Cell<u8> = const { Cell::new(UNKNOWN) };
    /// Set while classifying: allocations made by that are not counted.
    static BUSY: Cell<bool> = const { Cell::new(false) };
}

fn classify() -> u8 {
    let k = KIND.try_with(|k| k.get()).unwrap_or(OTHER);
    if k != UNKNOWN {
        return k;
    }
    if BUSY.try_with(|b| b.replace(true)).unwrap_or(true) {
        return OTHER;
    }
    let k = match std::thread::current().name() {
        Some(n) if n.starts_with("bench-client") => CLIENT,
        Some(n) if n.starts_with("dp-worker") || n.starts_with("bench-raw-echo") => SERVER,
        _ => OTHER,
    };
    let _ = KIND.try_with(|c| c.set(k));
    let _ = BUSY.try_with(|b| b.set(false));
    k
}

fn count() {
    match classify() {
        CLIENT => {
            CLIENT_ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        SERVER => {
            SERVER_ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        _ => {}
    }
}

struct Counting;

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: forwarded.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: BenchArgs,
}

/// Allocations on (client, server) threads of one run.
fn allocations(workload: &str, extra: &[&str], iterations: u64) -> (u64, u64) {
    let n = iterations.to_string();
    let mut argv = vec![
        "bench",
        "--loopback",
        "--provider",
        "soft",
        "--workload",
        workload,
        "--queue-depth",
        "2",
        "--iterations",
        &n,
        "--warmup",
        "0",
        "--verify",
        "--quiet",
    ];
    if !extra.contains(&"--size") {
        argv.extend_from_slice(&["--size", "2000"]);
    }
    argv.extend_from_slice(extra);
    let cli = Cli::parse_from(argv);
    let opts = BenchOptions::from_args(&cli.args).expect("valid options");
    let (c0, s0) = (
        CLIENT_ALLOCS.load(Ordering::Relaxed),
        SERVER_ALLOCS.load(Ordering::Relaxed),
    );
    let r = run(&opts).expect("bench runs");
    assert_eq!(r.m.ops, iterations);
    assert_eq!(r.m.errors, 0);
    (
        CLIENT_ALLOCS.load(Ordering::Relaxed) - c0,
        SERVER_ALLOCS.load(Ordering::Relaxed) - s0,
    )
}

/// The counters are process-wide: one measurement at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn assert_no_allocation_per_operation(workload: &str) {
    assert_no_allocation_per_operation_with(workload, &[]);
}

fn assert_no_allocation_per_operation_with(workload: &str, extra: &[&str]) {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // A first run warms up anything process-wide (the soft provider's
    // statics, hugepage probing).
    allocations(workload, extra, 200);
    let (c_short, s_short) = allocations(workload, extra, 500);
    let (c_long, s_long) = allocations(workload, extra, 5_500);
    let slack = 64;
    let workload = format!("{workload} {}", extra.join(" "));
    eprintln!("{workload}: (client, server) allocations: 500 ops ({c_short}, {s_short}), 5,500 ops ({c_long}, {s_long})");
    assert!(
        c_long <= c_short + slack,
        "{workload}: client threads allocated {c_short} times for 500 operations and {c_long} for 5,500"
    );
    assert!(
        s_long <= s_short + slack,
        "{workload}: server threads allocated {s_short} times for 500 operations and {s_long} for 5,500"
    );
}

#[test]
fn send_allocates_nothing_per_operation_on_either_side() {
    assert_no_allocation_per_operation("send");
}

#[test]
fn raw_send_allocates_nothing_per_operation_on_either_side() {
    assert_no_allocation_per_operation("raw-send");
}

#[test]
fn raw_smbd_allocates_nothing_per_operation_on_either_side() {
    assert_no_allocation_per_operation("raw-smbd");
}

#[test]
fn read_and_write_allocate_nothing_per_operation_on_either_side() {
    for w in ["read", "write"] {
        assert_no_allocation_per_operation_with(w, &["--size", "4096", "--file-size", "1M"]);
        assert_no_allocation_per_operation_with(
            w,
            &["--size", "4096", "--file-size", "1M", "--inline"],
        );
    }
}
