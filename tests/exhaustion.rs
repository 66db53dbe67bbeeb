//! Resource exhaustion against `smbdirectd serve` as a child process: the
//! affected connection or request gets the right error, the daemon logs the
//! condition once per interval (with the count since its last line) rather
//! than once per request, serves normally once the pressure goes, gives
//! every buffer back and exits 0 on SIGTERM without a panic.
//!
//! Ring full is not provoked here: the control-plane/worker rings are sized
//! from `--max-connections` (to a worker: 2 per connection + 16; from it:
//! 4 per connection + 16), no flag shrinks them, and a full ring is
//! backpressure (the control plane waits, the worker keeps the message and
//! retries), never a drop or an error to a peer.

mod common;
use common::*;

use smbdirect_dataplane::client::Client;
use smbdirect_dataplane::provider::soft::SoftProvider;
use smbdirect_dataplane::provider::MemoryRegion;
use smbdirect_dataplane::smb2::client::{Smb2Client, Smb2ClientOptions, Smb2Error, Transfer};
use smbdirect_hugepages::BufferPool;
use smbdirect_protocol::ntstatus::STATUS_DISK_FULL;
use smbdirect_protocol::smb2::{CreateDisposition, CreateOptions, Dialect};
use smbdirect_protocol::smbd::SmbdConfig;
use std::time::Duration;

fn cfg() -> SmbdConfig {
    SmbdConfig {
        receive_credit_max: 32,
        send_credit_target: 32,
        ..SmbdConfig::default()
    }
}

/// The client side: a registered pool with one slice per connection.
fn client_pool(provider: &SoftProvider, slices: usize) -> (BufferPool, MemoryRegion) {
    registered_pool(
        provider,
        slices,
        &[
            ("receive", 8192, 40),
            ("send", 1364, 128),
            ("mid", 1 << 20, 2),
        ],
    )
}

fn connect(
    provider: &SoftProvider,
    port: u16,
    pool: &BufferPool,
    mr: MemoryRegion,
) -> Result<Client<SoftProvider>, String> {
    let alloc = (0..pool.slice_count())
        .find_map(|i| pool.claim_slice(i).ok())
        .ok_or("no free client slice")?;
    Client::connect(
        provider,
        format!("127.0.0.1:{port}").parse().unwrap(),
        cfg(),
        alloc,
        mr,
        Duration::from_secs(10),
    )
    .map_err(|e| e.to_string())
}

/// One echo round trip.
fn echo(c: &mut Client<SoftProvider>) {
    let msg: Vec<u8> = (0..200u32).map(|i| (i * 7) as u8).collect();
    c.send(&msg).expect("send");
    assert!(
        c.recv_with(Duration::from_secs(20), |m| m == &msg[..])
            .expect("echo"),
        "echo differs"
    );
}

/// Stderr lines containing `needle`.
fn lines_with<'a>(err: &'a str, needle: &str) -> Vec<&'a str> {
    err.lines().filter(|l| l.contains(needle)).collect()
}

/// The daemon's stderr once a line containing `needle` is in it (up to
/// 20 s: the control plane may be starved of CPU on a loaded host).
fn wait_for_line(d: &Daemon, needle: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let err = d.stderr.lock().unwrap().clone();
        if err.contains(needle) || std::time::Instant::now() > deadline {
            return err;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What a set of rate-limited lines accounts for: each line is one
/// occurrence plus the "(N more since the last such line)" it reports; a
/// summary line ("N more ... since the last such line") is N.
fn accounted(lines: &[&str]) -> u64 {
    lines
        .iter()
        .map(|l| {
            let n = |s: &str| {
                s.split_whitespace()
                    .next()
                    .and_then(|w| w.parse::<u64>().ok())
            };
            if let Some(i) = l.find("warn: ") {
                if let Some(k) = n(&l[i + 6..]) {
                    return k; // a summary line
                }
            }
            1 + l
                .rfind(" (")
                .and_then(|i| n(&l[i + 2..]))
                .filter(|_| l.ends_with(" more since the last such line)"))
                .unwrap_or(0)
        })
        .sum()
}

/// Asserts every pool buffer came home (the final stats line).
fn all_buffers_back(out: &str) {
    let doc = out
        .lines()
        .find_map(|l| l.strip_prefix("smbdirectd: final stats: "))
        .unwrap_or_else(|| panic!("final stats line missing:\n{out}"));
    let mut rest = doc;
    let mut classes = 0;
    while let Some(i) = rest.find("\"buf_size\":") {
        rest = &rest[i..];
        assert_eq!(
            field(rest, "free"),
            field(rest, "total"),
            "pool buffers outstanding at exit: {doc}"
        );
        classes += 1;
        rest = &rest[10..];
    }
    assert!(classes >= 3, "{doc}");
}

#[test]
fn connections_beyond_max_connections_are_refused_logged_once_and_the_daemon_recovers() {
    let _serial = serial();
    let port = free_port();
    let d = spawn(port, &["--max-connections", "2"]);
    let provider = SoftProvider::new().unwrap();
    let (pool, mr) = client_pool(&provider, 4);
    let mut a = connect(&provider, port, &pool, mr).expect("first connection");
    let mut b = connect(&provider, port, &pool, mr).expect("second connection");
    echo(&mut a);
    const REFUSED: u64 = 40;
    for i in 0..REFUSED {
        if let Ok(c) = connect(&provider, port, &pool, mr) {
            let _ = c.close(Duration::from_secs(2));
            panic!(
                "connection {} beyond --max-connections 2 was admitted",
                i + 3
            );
        }
    }
    // The admitted ones are unaffected.
    echo(&mut a);
    echo(&mut b);
    let doc = stats_json(&d);
    assert_eq!(field(&doc, "rejected"), REFUSED, "{doc}");
    let err = d.stderr.lock().unwrap().clone();
    let refusals = lines_with(&err, "at --max-connections");
    // 40 refusals in (far) less than two 5 s intervals: a line or two, not 40.
    assert!(
        !refusals.is_empty() && refusals.len() <= 3,
        "{} lines for {REFUSED} refusals:\n{err}",
        refusals.len()
    );
    // Pressure gone: the daemon serves a new connection normally.
    let _ = a.close(Duration::from_secs(2));
    let _ = b.close(Duration::from_secs(2));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while field(&stats_json(&d), "connections") > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "connections not released"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut c = connect(&provider, port, &pool, mr).expect("a connection after the pressure");
    echo(&mut c);
    let _ = c.close(Duration::from_secs(2));
    let (out, err) = terminate(d);
    all_buffers_back(&out);
    // Every refusal is accounted for in the lines (the exit summary gives
    // the rest of the last interval).
    let refusals = lines_with(&err, "at --max-connections");
    assert_eq!(accounted(&refusals), REFUSED, "{err}");
}

#[test]
fn writes_beyond_a_full_store_get_disk_full_logged_once_and_the_store_recovers() {
    let _serial = serial();
    let port = free_port();
    let d = spawn(port, &["--upper", "smb2", "--store-size", "4M"]);
    let provider = SoftProvider::new().unwrap();
    let (pool, mr) = client_pool(&provider, 1);
    let mut s = Smb2Client::connect(
        &provider,
        format!("127.0.0.1:{port}").parse().unwrap(),
        cfg(),
        pool.claim_slice(0).unwrap(),
        mr,
        Duration::from_secs(10),
        Smb2ClientOptions::default(),
    )
    .expect("connect");
    s.negotiate(&[Dialect::SMB_3_1_1]).expect("negotiate");
    s.session_setup_anonymous().expect("session setup");
    s.tree_connect("data").expect("tree connect");
    let f = s
        .create(
            "big.bin",
            CreateDisposition::OVERWRITE_IF,
            CreateOptions::NON_DIRECTORY_FILE,
        )
        .expect("create")
        .file_id;
    let chunk = vec![0xa5u8; 64 << 10];
    // Fill the 4 MiB store; every write after that is refused.
    let mut off = 0u64;
    let mut full = 0u64;
    while off < (8 << 20) {
        match s.write(f, off, &chunk, Transfer::Inline) {
            Ok(n) => assert_eq!(n as usize, chunk.len()),
            Err(Smb2Error::Status(st)) => {
                assert_eq!(st, STATUS_DISK_FULL, "write at {off}");
                full += 1;
            }
            Err(e) => panic!("write at {off}: {e}"),
        }
        off += chunk.len() as u64;
    }
    assert!(
        full >= 60,
        "only {full} writes refused beyond a 4 MiB store"
    );
    // The connection goes on: what fits is still written, and a smaller
    // file fits again once the big one is gone.
    assert_eq!(
        s.write(f, 0, &chunk, Transfer::Inline).expect("overwrite"),
        chunk.len() as u32
    );
    let doc = stats_json(&d);
    assert_eq!(field(&doc, "store_full"), full, "{doc}");
    // The control plane reads the workers' counters every 100 ms.
    let err = wait_for_line(&d, "STATUS_DISK_FULL");
    let lines = lines_with(&err, "STATUS_DISK_FULL");
    assert!(
        !lines.is_empty() && lines.len() <= 4,
        "{} lines for {full} refused writes:\n{err}",
        lines.len()
    );
    s.close(f).expect("close");
    let g = s
        .create(
            "big.bin",
            CreateDisposition::OVERWRITE,
            CreateOptions::NON_DIRECTORY_FILE,
        )
        .expect("truncate")
        .file_id;
    assert_eq!(
        s.write(g, 0, &chunk, Transfer::Inline)
            .expect("write after truncation"),
        chunk.len() as u32
    );
    s.close(g).expect("close");
    let _ = s.disconnect(Duration::from_secs(2));
    let (out, err) = terminate(d);
    all_buffers_back(&out);
    let lines = lines_with(&err, "STATUS_DISK_FULL");
    assert_eq!(accounted(&lines), full, "{err}");
}

#[test]
fn an_empty_receive_pool_refuses_new_connections_logged_once_and_the_daemon_recovers() {
    let _serial = serial();
    let port = free_port();
    // 12 MiB: the smallest pool with a buffer of every class; its receive
    // class (94 buffers, 16 lent to the control plane) is what runs out.
    let d = spawn(
        port,
        &[
            "--pool-mem",
            "12M",
            "--receive-credit-max",
            "255",
            "--max-connections",
            "64",
        ],
    );
    let provider = SoftProvider::new().unwrap();
    let (pool, mr) = client_pool(&provider, 48);
    // A peer asking for 255 credits: the server posts receives for as many
    // as its pool allows, which takes every free receive buffer.
    let greedy_cfg = SmbdConfig {
        receive_credit_max: 255,
        send_credit_target: 255,
        ..SmbdConfig::default()
    };
    let mut greedy = Client::connect(
        &provider,
        format!("127.0.0.1:{port}").parse().unwrap(),
        greedy_cfg,
        pool.claim_slice(0).unwrap(),
        mr,
        Duration::from_secs(10),
    )
    .expect("greedy connection");
    echo(&mut greedy);
    const TRIES: u64 = 40;
    let mut refused = 0u64;
    let mut held = Vec::new();
    for _ in 0..TRIES {
        match connect(&provider, port, &pool, mr) {
            Ok(c) => held.push(c),
            Err(e) => {
                // [MS-SMBD] 3.1.5.6: no receive could be posted for its
                // credits: a Negotiate Response with an error status.
                assert!(e.contains("STATUS_INSUFFICIENT_RESOURCES"), "{e}");
                refused += 1;
            }
        }
    }
    // The receive pool holds 78 free buffers: a connection or two more fit
    // beside the greedy one, no more.
    assert!(
        held.len() <= 4 && refused >= TRIES - 4,
        "{} admitted",
        held.len()
    );
    // Those admitted are served, the greedy one too.
    for c in held.iter_mut() {
        echo(c);
    }
    echo(&mut greedy);
    let doc = stats_json(&d);
    assert_eq!(field(&doc, "negotiate_failures"), refused, "{doc}");
    assert!(field(&doc, "pool_stalls") >= refused, "{doc}");
    let err = wait_for_line(&d, "no receive buffer could be posted");
    let lines = lines_with(&err, "no receive buffer");
    assert!(
        !lines.is_empty() && lines.len() <= 3,
        "{} lines for {refused} refused connections:\n{err}",
        lines.len()
    );
    // Pressure gone: the greedy peer leaves, its receives come home, and a
    // new connection is served.
    let _ = greedy.close(Duration::from_secs(2));
    for c in held {
        let _ = c.close(Duration::from_secs(2));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while field(&stats_json(&d), "connections") > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "connections not released"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut c = connect(&provider, port, &pool, mr).expect("a connection after the pressure");
    echo(&mut c);
    let _ = c.close(Duration::from_secs(2));
    let (out, err) = terminate(d);
    all_buffers_back(&out);
    let lines = lines_with(&err, "for want of a receive buffer");
    let first = lines_with(&err, "no receive buffer could be posted");
    assert_eq!(accounted(&first) + accounted(&lines), refused, "{err}");
}
