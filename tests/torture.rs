//! `smbdirectd torture` end to end: every case against `serve --provider
//! soft --upper smb2` (a 2 s keepalive interval, so the timer cases run in
//! seconds), judged by the tool's JSON report, and then by the daemon
//! process itself: it must exit 0 on SIGTERM, print no panic, and give
//! every pool buffer back (what the daemon says about itself is not
//! enough). The server knows the user `smb2-mutated-handshake` logs on as
//! (`--users`), and accepts the other cases' anonymous sessions
//! (`--guest-ok`), so mutated AUTHENTICATE messages reach the NTLMv2
//! verification and what follows it.

mod common;
use common::*;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The server's keepalive interval in this test, told to the tool.
const KEEPALIVE: &str = "2";

/// `smbdirectd user add torture` (the account of the handshake case,
/// src/torture/cases_mutated.rs) into `file`.
fn add_torture_user(file: &str) {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_smbdirectd"))
        .args(["user", "add", "torture", "--users", file])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run smbdirectd user add");
    writeln!(child.stdin.take().expect("stdin"), "torture-password").expect("password");
    let out = child.wait_with_output().expect("user add");
    assert!(
        out.status.success(),
        "user add: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Names of every case `torture --list` knows.
fn listed_cases() -> Vec<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_smbdirectd"))
        .args(["torture", "--list"])
        .output()
        .expect("run torture --list");
    assert!(out.status.success(), "torture --list failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// One case of the JSON report: (name, pass, the whole line).
fn report_cases(doc: &str) -> Vec<(String, bool, String)> {
    doc.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("{\"name\":\"")?;
            let name = rest[..rest.find('"')?].to_string();
            Some((name, l.contains("\"pass\":true"), l.to_string()))
        })
        .collect()
}

/// How long the tool waits for a reaction the spec makes immediate. Its
/// default, 5 s, is right against an idle server, but on a shared 2-core
/// host the daemon's pinned threads are sometimes not scheduled for a
/// long time: the traced failures (3 in 40 runs of the suspect cases, all
/// while a parallel `cargo` build ran) were a fresh connection whose queue
/// pair reached the worker's completion queue and ring 6 s after the
/// control plane had sent the accept, nothing else happening in between;
/// loop-gap tracing under the same CPU hogs without the build showed both
/// pinned threads stalled up to 0.9 s at a time. Passing cases do not wait
/// this long.
const TIMEOUT: &str = "15";

// In the default run: on a loaded 2-core host it takes 30-40 s (about 26 s
// idle), most of it the timer cases waiting for real timers.
#[test]
fn every_torture_case_passes_and_the_daemon_survives_them_cleanly() {
    let _serial = serial();
    let port = free_port();
    let users = format!("/tmp/smbdirectd-torture-users-{port}");
    let _ = std::fs::remove_file(&users);
    add_torture_user(&users);
    let d = spawn(
        port,
        &[
            "--upper",
            "smb2",
            "--keepalive-interval",
            KEEPALIVE,
            "--store-size",
            "64M",
            "--users",
            &users,
            "--guest-ok",
            "",
        ],
    );
    let json = format!("/tmp/smbdirectd-torture-{port}.json");
    let _ = std::fs::remove_file(&json);
    let t0 = Instant::now();
    let mut tool = Command::new(env!("CARGO_BIN_EXE_smbdirectd"))
        .args(["torture", "--connect", &format!("127.0.0.1:{port}")])
        .args(["--provider", "soft", "--keepalive-interval", KEEPALIVE])
        .args(["--timeout", TIMEOUT])
        .args(["--admin-socket", &d.admin, "--json", &json])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run smbdirectd torture");
    // Read stdout while it runs (the pipe must not fill up).
    let mut stdout = tool.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let deadline = t0 + Duration::from_secs(300);
    let status = loop {
        if let Some(s) = tool.try_wait().expect("wait for torture") {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = tool.kill();
            let _ = tool.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let elapsed = t0.elapsed();
    let out = reader.join().unwrap_or_default();
    let mut err = String::new();
    if let Some(mut e) = tool.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    // About 40 s on an idle host (the timer cases wait for real timers);
    // not asserted, because a shared host under load stretches every case.
    eprintln!("torture ran {:.1} s:\n{out}{err}", elapsed.as_secs_f64());

    // The daemon itself, whatever the tool concluded: exit status 0 on
    // SIGTERM and no panic (`terminate` asserts both), every buffer back.
    let (final_out, final_err) = terminate(d);
    let pools: Vec<&str> = final_out
        .lines()
        .filter(|l| l.contains("final: pool ") && l.ends_with("buffers free"))
        .collect();
    assert!(pools.len() >= 3, "final pool lines missing:\n{final_out}");
    for l in &pools {
        let frac = l
            .rsplit(": ")
            .next()
            .and_then(|s| s.split_whitespace().next())
            .unwrap_or("");
        let (free, total) = frac.split_once('/').unwrap_or(("?", "!"));
        assert_eq!(
            free, total,
            "pool buffers not all returned: {l}\n{final_out}"
        );
    }
    assert!(
        !final_err.contains("panicked"),
        "daemon stderr has a panic:\n{final_err}"
    );

    // The tool's verdict, case by case.
    let Some(status) = status else {
        panic!("torture did not finish in 300 s:\n{out}");
    };
    let doc = std::fs::read_to_string(&json).unwrap_or_else(|e| panic!("{json}: {e}\n{out}{err}"));
    let cases = report_cases(&doc);
    let listed = listed_cases();
    assert_eq!(
        cases.iter().map(|c| c.0.clone()).collect::<Vec<_>>(),
        listed,
        "the report does not cover every listed case"
    );
    let failed: Vec<&str> = cases
        .iter()
        .filter(|c| !c.1)
        .map(|c| c.2.as_str())
        .collect();
    assert!(
        failed.is_empty(),
        "{} torture case(s) did not pass:\n{}",
        failed.len(),
        failed.join("\n")
    );
    assert_eq!(status.code(), Some(0), "torture exit status:\n{out}{err}");
    let _ = std::fs::remove_file(&json);
}

#[test]
fn unknown_case_name_is_a_usage_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_smbdirectd"))
        .args([
            "torture",
            "--connect",
            "127.0.0.1:9",
            "--case",
            "no-such-case",
        ])
        .output()
        .expect("run smbdirectd torture");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("no-such-case"), "{err}");
}
