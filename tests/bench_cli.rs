//! `smbdirectd bench` end to end: the built binary against a loopback
//! server (and a `serve` child process for `--connect`), its JSON,
//! HdrHistogram and SVG outputs, `--iterations`, and the errors it must give
//! instead of hanging.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `smbdirectd bench ARGS`, killing it after `limit`.
fn bench(args: &[&str], limit: Duration) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_smbdirectd"))
        .arg("bench")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn smbdirectd bench");
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "bench {args:?} still running after {limit:?}; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// [`bench`] of `workload` against a running soft `serve` at `addr`.
fn bench_connect(addr: &str, workload: &str, extra: &[&str], limit: Duration) -> Output {
    let mut args = vec![
        "--connect",
        addr,
        "--provider",
        "soft",
        "--workload",
        workload,
    ];
    args.extend_from_slice(extra);
    bench(&args, limit)
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "smbdirectd-bench-cli-{}-{name}",
        std::process::id()
    ));
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// The number after `"key":` in a JSON document (first occurrence).
fn number(doc: &str, key: &str) -> f64 {
    let k = format!("\"{key}\":");
    let i = doc
        .find(&k)
        .unwrap_or_else(|| panic!("{key} missing in {doc}"))
        + k.len();
    doc[i..]
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | 'e' | 'E' | '+'))
        .collect::<String>()
        .parse()
        .unwrap_or_else(|e| panic!("{key} is not a number in {doc}: {e}"))
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Checks the three output files of a run of `workload`.
fn check_outputs(dir: &Path, workload: &str, size: u64) {
    let json = std::fs::read_to_string(dir.join("r.json")).expect("json written");
    assert!(
        json.trim_start().starts_with('{') && json.trim_end().ends_with('}'),
        "{json}"
    );
    assert!(
        json.contains(&format!("\"workload\": \"{workload}\"")),
        "{json}"
    );
    assert!(json.contains("\"provider\": \"soft\""), "{json}");
    assert!(json.contains("\"verify\": true"), "{json}");
    assert!(json.contains("\"latency_us\": {"), "{json}");
    for k in ["server_cores", "client_cores", "credit_stalls"] {
        assert!(json.contains(&format!("\"{k}\":")), "{k} missing: {json}");
    }
    // Busy shares of the measured window: the client's loop always; the
    // server's where bench runs it (SMB Direct workloads on loopback), not
    // for raw-send's bare echo thread.
    let client_busy = number(&json, "client_busy_pct");
    assert!(client_busy > 0.0 && client_busy <= 100.0, "{json}");
    if workload.starts_with("raw-") {
        assert!(json.contains("\"server_busy_pct\": null"), "{json}");
    } else {
        let server_busy = number(&json, "server_busy_pct");
        assert!(server_busy > 0.0 && server_busy <= 100.0, "{json}");
    }
    assert_eq!(number(&json, "size"), size as f64);
    assert_eq!(number(&json, "queue_depth"), 1.0);
    assert_eq!(number(&json, "connections"), 1.0);
    assert_eq!(number(&json, "errors"), 0.0);
    let ops = number(&json, "ops");
    assert!(ops > 0.0, "{json}");
    assert!(number(&json, "ops_per_sec") > 0.0, "{json}");
    assert!(number(&json, "mb_per_sec") > 0.0, "{json}");
    let d = number(&json, "duration_s");
    assert!(d > 0.5 && d < 5.0, "duration_s {d}: {json}");
    let (min, p50, p90, p99, p999, p9999, max) = (
        number(&json, "min"),
        number(&json, "p50"),
        number(&json, "p90"),
        number(&json, "p99"),
        number(&json, "p999"),
        number(&json, "p9999"),
        number(&json, "max"),
    );
    assert!(min > 0.0, "{json}");
    assert!(
        min <= p50 && p50 <= p90 && p90 <= p99 && p99 <= p999 && p999 <= p9999 && p9999 <= max,
        "percentiles out of order: {json}"
    );

    let hgrm = std::fs::read_to_string(dir.join("r.hgrm")).expect("hgrm written");
    let mut lines = hgrm.lines();
    let header = lines.next().expect("header line");
    for col in ["Value", "Percentile", "TotalCount", "1/(1-Percentile)"] {
        assert!(header.contains(col), "{header}");
    }
    let rows: Vec<(f64, f64, u64)> = hgrm
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let mut c = l.split_whitespace();
            Some((
                c.next()?.parse().ok()?,
                c.next()?.parse().ok()?,
                c.next()?.parse().ok()?,
            ))
        })
        .collect();
    assert!(rows.len() >= 10, "{hgrm}");
    for w in rows.windows(2) {
        assert!(
            w[0].0 <= w[1].0 && w[0].1 <= w[1].1 && w[0].2 <= w[1].2,
            "not monotone: {w:?}\n{hgrm}"
        );
    }
    let last = rows.last().expect("rows");
    assert_eq!(last.1, 1.0, "{hgrm}");
    assert_eq!(last.2 as f64, ops, "the last row counts every operation");
    assert!(hgrm.contains("#[Mean    ="), "{hgrm}");
    assert!(hgrm.contains("#[Max     ="), "{hgrm}");
    assert!(hgrm.contains("#[Buckets ="), "{hgrm}");

    let svg = std::fs::read_to_string(dir.join("r.svg")).expect("svg written");
    assert!(svg.starts_with("<svg"), "{svg}");
    assert!(svg.trim_end().ends_with("</svg>"), "{svg}");
    assert!(svg.contains("<polyline") || svg.contains("<path"), "{svg}");
    assert!(
        svg.contains("Percentile") && svg.contains("Latency"),
        "{svg}"
    );
    assert!(
        svg.contains(workload),
        "the title names the workload: {svg}"
    );
}

fn run_with_outputs(workload: &str) {
    let _g = common::serial();
    let dir = scratch(workload);
    let (j, h, p) = (dir.join("r.json"), dir.join("r.hgrm"), dir.join("r.svg"));
    let o = bench(
        &[
            "--loopback",
            "--provider",
            "soft",
            "--workload",
            workload,
            "--size",
            "512",
            "--duration",
            "1",
            "--warmup",
            "0.2",
            "--json",
            j.to_str().unwrap(),
            "--hgrm",
            h.to_str().unwrap(),
            "--plot",
            p.to_str().unwrap(),
            "--verify",
            "--quiet",
        ],
        Duration::from_secs(20),
    );
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for k in [
        "ops/s",
        "MB/s",
        "p50",
        "p99.99",
        "max",
        "credit stalls",
        "errors 0",
    ] {
        assert!(out.contains(k), "{k} missing from the table: {}", text(&o));
    }
    check_outputs(&dir, workload, 512);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn send_over_loopback_writes_json_hgrm_and_svg() {
    run_with_outputs("send");
}

#[test]
fn raw_send_over_loopback_writes_json_hgrm_and_svg() {
    run_with_outputs("raw-send");
}

/// Runs `bench --loopback --provider soft ARGS --iterations N --warmup W
/// --verify --quiet --json F` and returns its output and JSON, checked to
/// have succeeded with exactly N measured operations.
fn verified_run(name: &str, args: &[&str], iterations: u64, warmup: &str) -> (Output, String) {
    counted_run(name, args, iterations, warmup, true)
}

/// [`verified_run`], with `--verify` only if `verify`.
fn counted_run(
    name: &str,
    args: &[&str],
    iterations: u64,
    warmup: &str,
    verify: bool,
) -> (Output, String) {
    let dir = scratch(name);
    let j = dir.join("r.json");
    let n = iterations.to_string();
    let mut argv = vec!["--loopback", "--provider", "soft"];
    argv.extend_from_slice(args);
    argv.extend_from_slice(&["--iterations", &n, "--warmup", warmup, "--quiet"]);
    if verify {
        argv.push("--verify");
    }
    argv.extend_from_slice(&["--json", j.to_str().unwrap()]);
    let o = bench(&argv, Duration::from_secs(20));
    assert!(o.status.success(), "{args:?}: {}", text(&o));
    let json = std::fs::read_to_string(&j).expect("json");
    assert_eq!(number(&json, "ops"), iterations as f64, "{args:?}: {json}");
    let _ = std::fs::remove_dir_all(&dir);
    (o, json)
}

#[test]
fn iterations_measure_exactly_that_many_operations() {
    let _g = common::serial();
    for (workload, extra) in [("send", "3"), ("raw-send", "1"), ("raw-smbd", "2")] {
        let args = [
            "--workload",
            workload,
            "--queue-depth",
            extra,
            "--connections",
            "2",
        ];
        let (_, json) = verified_run(&format!("iter-{workload}"), &args, 1001, "0.1");
        assert_eq!(number(&json, "iterations"), 1001.0, "{workload}: {json}");
    }
}

/// Without `--verify`, every `send` echo is still matched to its operation
/// by the number in its first eight bytes (bench::pattern::stamp): at a
/// queue depth over two connections a mismatch would count as an error.
#[test]
fn unverified_echoes_are_matched_to_their_operations() {
    let _g = common::serial();
    let args = [
        "--workload",
        "send",
        "--queue-depth",
        "4",
        "--connections",
        "2",
    ];
    let (_, json) = counted_run("stamp-send", &args, 2000, "0.1", false);
    assert!(json.contains("\"verify\": false"), "{json}");
    assert_eq!(number(&json, "errors"), 0.0, "{json}");
}

/// `raw-smbd` (the floor under `send`): without `--verify` each echo must
/// still carry the echo's own SMB Direct header and the operation's stamp,
/// at a queue depth over two connections and at sizes around a cache line.
#[test]
fn raw_smbd_echoes_carry_their_header_and_stamp() {
    let _g = common::serial();
    for size in ["1", "40", "512", "1340"] {
        let args = [
            "--workload",
            "raw-smbd",
            "--size",
            size,
            "--queue-depth",
            "4",
            "--connections",
            "2",
        ];
        let (_, json) = counted_run(&format!("raw-smbd-{size}"), &args, 2000, "0.1", false);
        assert!(json.contains("\"workload\": \"raw-smbd\""), "{json}");
        assert_eq!(number(&json, "errors"), 0.0, "{size}: {json}");
    }
}

#[test]
fn fragmented_sends_with_a_queue_depth_verify() {
    let _g = common::serial();
    let o = bench(
        &[
            "--loopback",
            "--provider",
            "soft",
            "--workload",
            "send",
            "--size",
            "20000",
            "--queue-depth",
            "4",
            "--iterations",
            "300",
            "--warmup",
            "0",
            "--verify",
            "--quiet",
        ],
        Duration::from_secs(20),
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("300 ops"),
        "{}",
        text(&o)
    );
}

/// `--max-send-size` is the client's PreferredSendSize and the loopback
/// server's MaxSendSize ([MS-SMBD] 3.1.5.2-3.1.5.3): with 4120 a 4 KiB
/// message (24-byte header) travels in one Send, with the default 1364 in
/// four; the JSON says which was negotiated, and every byte still echoes.
#[test]
fn max_send_size_is_negotiated_and_reported() {
    let _g = common::serial();
    for (mss, sends) in [
        ("4120", "1 Send per message"),
        ("1364", "4 Sends per message"),
    ] {
        let args = [
            "--workload",
            "send",
            "--size",
            "4096",
            "--max-send-size",
            mss,
        ];
        let (o, json) = verified_run(&format!("mss-{mss}"), &args, 300, "0");
        let want: f64 = mss.parse().unwrap();
        assert_eq!(number(&json, "max_send_size"), want, "{json}");
        assert!(
            String::from_utf8_lossy(&o.stdout).contains(sends),
            "{}",
            text(&o)
        );
    }
}

/// Runs an SMB2 workload against the loopback server with `--verify` and
/// `--iterations`, and returns its JSON after the common checks.
fn smb2_run(name: &str, extra: &[&str], iterations: u64) -> String {
    let _g = common::serial();
    let dir = scratch(name);
    let j = dir.join("r.json");
    let n = iterations.to_string();
    let mut args = vec![
        "--loopback",
        "--provider",
        "soft",
        "--file-size",
        "4M",
        "--iterations",
        &n,
        "--warmup",
        "0.1",
        "--verify",
        "--quiet",
        "--json",
        j.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let o = bench(&args, Duration::from_secs(120));
    assert!(o.status.success(), "{name}: {}", text(&o));
    let json = std::fs::read_to_string(&j).expect("json written");
    assert_eq!(number(&json, "ops"), iterations as f64, "{json}");
    assert_eq!(number(&json, "errors"), 0.0, "{json}");
    assert!(json.contains("\"verify\": true"), "{json}");
    assert_eq!(number(&json, "file_size"), (4 << 20) as f64, "{json}");
    assert!(number(&json, "ops_per_sec") > 0.0, "{json}");
    assert!(number(&json, "p50") > 0.0, "{json}");
    json
}

#[test]
fn read_and_write_move_verified_bytes_through_rdma_and_inline() {
    for (workload, size, qd, inline, n) in [
        ("read", "4096", "4", false, 300),
        ("write", "4096", "4", false, 300),
        ("read", "65536", "2", true, 100),
        ("write", "1M", "2", false, 20),
        // A size that does not divide 1 MiB: the set-up's fill chunks
        // (5 blocks, 960 KiB) are not a power of two.
        ("read", "192K", "2", false, 20),
    ] {
        let mut extra = vec!["--workload", workload, "--size", size, "--queue-depth", qd];
        if inline {
            extra.push("--inline");
        }
        let json = smb2_run(workload, &extra, n);
        assert!(
            json.contains(&format!("\"workload\": \"{workload}\"")),
            "{json}"
        );
        let channel = if inline {
            "inline"
        } else {
            "rdma_v1_invalidate"
        };
        assert!(
            json.contains(&format!("\"channel\": \"{channel}\"")),
            "{json}"
        );
        let want = if workload == "read" { 100.0 } else { 0.0 };
        assert_eq!(number(&json, "read_pct"), want, "{json}");
    }
}

#[test]
fn mixed_reads_back_what_it_wrote_over_two_connections() {
    let json = smb2_run(
        "mixed",
        &[
            "--workload",
            "mixed",
            "--read-pct",
            "60",
            "--size",
            "8192",
            "--queue-depth",
            "8",
            "--connections",
            "2",
        ],
        1000,
    );
    assert_eq!(number(&json, "read_pct"), 60.0, "{json}");
    assert_eq!(number(&json, "connections"), 2.0, "{json}");
}

#[test]
fn qos_reports_every_flow_against_its_limit() {
    let _g = common::serial();
    let dir = scratch("qos");
    let j = dir.join("r.json");
    let o = bench(
        &[
            "--loopback",
            "--provider",
            "soft",
            "--workload",
            "qos",
            "--flows",
            "2",
            "--limit",
            "400",
            "--size",
            "4096",
            "--queue-depth",
            "2",
            "--file-size",
            "4M",
            "--duration",
            "2",
            "--warmup",
            "0.5",
            "--verify",
            "--quiet",
            "--json",
            j.to_str().unwrap(),
        ],
        Duration::from_secs(120),
    );
    assert!(o.status.success(), "{}", text(&o));
    let json = std::fs::read_to_string(&j).expect("json written");
    assert_eq!(number(&json, "errors"), 0.0, "{json}");
    let flows = &json[json.find("\"flows\": [").expect("flows")..];
    assert_eq!(flows.matches("\"flow_id\"").count(), 2, "{json}");
    for k in ["limit_iops", "achieved_iops", "achieved_kbps"] {
        assert!(flows.contains(&format!("\"{k}\":")), "{k}: {json}");
    }
    assert_eq!(number(flows, "limit_iops"), 400.0, "{json}");
    // The client keeps each flow within its limit (MS-SQOS 3.1.7.1), and
    // both flows move data. (Accuracy figures come from scripts/bench.sh.)
    let achieved = number(flows, "achieved_iops");
    assert!(achieved > 0.0 && achieved <= 400.0 * 1.1, "{json}");
    assert!(number(flows, "achieved_kbps") > 0.0, "{json}");
    assert!(flows.contains("\"status\": \"ok\""), "{json}");
}

#[test]
fn smb2_workloads_against_an_echo_server_are_an_error_not_a_hang() {
    let _g = common::serial();
    let port = common::free_port();
    let d = common::spawn(port, &[]);
    let addr = format!("127.0.0.1:{port}");
    let o = bench_connect(
        &addr,
        "read",
        &["--file-size", "1M", "--iterations", "10", "--quiet"],
        Duration::from_secs(60),
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--upper smb2"), "{}", text(&o));
    drop(d);
}

#[test]
fn memcpy_baseline_copies_verified_bytes() {
    let _g = common::serial();
    let o = bench(
        &[
            "--loopback",
            "--workload",
            "memcpy",
            "--size",
            "64K",
            "--iterations",
            "200",
            "--warmup",
            "0",
            "--verify",
            "--quiet",
        ],
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("200 ops"),
        "{}",
        text(&o)
    );
}

#[test]
fn usage_errors_exit_with_status_2() {
    for args in [
        &["--loopback", "--size", "0"][..],
        &["--loopback", "--queue-depth", "0"],
        &["--connect", "127.0.0.1:445", "--workload", "raw-send"],
        &["--workload", "send"],
        &["--loopback", "--iterations", "10", "--duration", "1"],
        &["--loopback", "--cores", "4096"],
        &["--loopback", "--json", "/nonexistent-dir/r.json"],
        &["--connect", "127.0.0.1:445", "--workload", "memcpy"],
        &[
            "--loopback",
            "--workload",
            "qos",
            "--flows",
            "1",
            "--connections",
            "2",
        ],
        &[
            "--loopback",
            "--workload",
            "qos",
            "--policy-id",
            "not-a-guid",
        ],
        &[
            "--loopback",
            "--workload",
            "read",
            "--size",
            "1M",
            "--file-size",
            "1M",
            "--queue-depth",
            "2",
        ],
    ] {
        let o = bench(args, Duration::from_secs(20));
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(!o.stderr.is_empty(), "{args:?}: says why");
    }
}

/// `bench --connect ADDR --provider soft --workload send --warmup 0
/// --quiet`, then `extra`.
fn send_to(addr: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "--connect",
        addr,
        "--provider",
        "soft",
        "--workload",
        "send",
        "--warmup",
        "0",
        "--quiet",
    ];
    args.extend_from_slice(extra);
    bench(&args, Duration::from_secs(20))
}

#[test]
fn send_drives_a_running_serve_over_connect() {
    let _g = common::serial();
    let port = common::free_port();
    let d = common::spawn(port, &[]);
    let addr = format!("127.0.0.1:{port}");
    let o = send_to(
        &addr,
        &[
            "--size",
            "4096",
            "--queue-depth",
            "2",
            "--iterations",
            "500",
            "--verify",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("500 ops") && out.contains(&addr),
        "{}",
        text(&o)
    );
    common::terminate(d);
}

#[test]
fn more_connections_than_the_server_has_buffers_for_is_an_error_that_says_what_to_give_it() {
    let _g = common::serial();
    let port = common::free_port();
    // Receive buffers for about two connections of 255 credits.
    let d = common::spawn(port, &["--pool-mem", "16M", "--receive-credit-max", "255"]);
    let addr = format!("127.0.0.1:{port}");
    let o = send_to(&addr, &["--connections", "8", "--iterations", "10"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("STATUS_INSUFFICIENT_RESOURCES")
            && err.contains("--pool-mem")
            && !err.contains("--upper echo"),
        "{}",
        text(&o)
    );
    common::terminate(d);
}

#[test]
fn send_against_an_smb2_server_is_an_error_not_a_hang() {
    let _g = common::serial();
    let port = common::free_port();
    let d = common::spawn(port, &["--upper", "smb2"]);
    let addr = format!("127.0.0.1:{port}");
    let o = send_to(&addr, &["--iterations", "10"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(!o.stderr.is_empty(), "{}", text(&o));
    drop(d);
}

/// `serve --store-copy-cores` with a directory store on a memory file
/// system: 1 MiB READs at queue depth 4 make large copies, and `stats
/// --json` counts each as sent to the copy core or kept on the worker
/// (`store_copies_away`, `store_copies_kept`); with several READs in flight
/// at once, some go away.
#[test]
fn large_store_copies_are_counted_as_sent_away_or_kept() {
    let _g = common::serial();
    let shm_is_tmpfs = std::fs::read_to_string("/proc/mounts").is_ok_and(|m| {
        m.lines()
            .any(|l| l.split_whitespace().nth(1) == Some("/dev/shm") && l.contains(" tmpfs "))
    });
    if !shm_is_tmpfs {
        eprintln!("skipped: /dev/shm is not a tmpfs here (copies leave the worker only on one)");
        return;
    }
    if std::thread::available_parallelism().map_or(0, |n| n.get()) < 2 {
        eprintln!("skipped: one core (the copy core must not be the worker's)");
        return;
    }
    let dir = PathBuf::from(format!("/dev/shm/smbdirectd-copies-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("store dir");
    let port = common::free_port();
    let d = common::spawn(
        port,
        &[
            "--upper",
            "smb2",
            "--store",
            dir.to_str().unwrap(),
            "--cores",
            "1",
            "--store-copy-cores",
            "0",
        ],
    );
    let addr = format!("127.0.0.1:{port}");
    let reads = 64u64;
    let o = bench_connect(
        &addr,
        "read",
        &[
            "--size",
            "1M",
            "--file-size",
            "8M",
            "--queue-depth",
            "4",
            "--iterations",
            &reads.to_string(),
            "--warmup",
            "0",
            "--verify",
            "--quiet",
        ],
        Duration::from_secs(120),
    );
    assert!(o.status.success(), "{}", text(&o));
    let doc = common::stats_json(&d);
    let (_, err) = common::terminate(d);
    let _ = std::fs::remove_dir_all(&dir);
    if err.contains("cannot pin io_uring workers") {
        eprintln!("skipped: this kernel cannot pin io_uring workers: {err}");
        return;
    }
    let away = common::field(&doc, "store_copies_away");
    let kept = common::field(&doc, "store_copies_kept");
    eprintln!("{reads} READs of 1 MiB: copies sent away {away}, kept {kept}");
    // Every measured READ is a large copy; the set-up's fill may add more.
    assert!(away + kept >= reads, "{doc}");
    assert!(away > 0, "four READs in flight, none sent away: {doc}");
}
