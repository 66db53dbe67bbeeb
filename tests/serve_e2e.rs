//! `smbdirectd serve` as a real child process on the soft provider, with
//! clients in this (another) process.

mod common;
use common::*;

use smbdirect_dataplane::client::Client;
use smbdirect_dataplane::provider::soft::SoftProvider;
use smbdirect_dataplane::provider::{MemoryRegion, Provider};
use smbdirect_hugepages::{Backing, BufferPool, PoolConfig};
use smbdirect_protocol::smbd::SmbdConfig;
use std::process::Command;
use std::time::{Duration, Instant};

fn client_pool(provider: &SoftProvider) -> (BufferPool, MemoryRegion) {
    let pool = PoolConfig::smbdirect(48 << 20, 1, 8192, 1364, 1 << 20)
        .backing(Backing::SharedMemfd)
        .build()
        .unwrap();
    // SAFETY: the pool lives for the whole test, longer than the provider uses it.
    let mr = unsafe { provider.register_pool(&pool) }.unwrap();
    (pool, mr)
}

fn cfg() -> SmbdConfig {
    SmbdConfig {
        receive_credit_max: 32,
        send_credit_target: 32,
        ..SmbdConfig::default()
    }
}

#[test]
fn serve_echoes_1_byte_to_max_fragmented_size_and_returns_every_buffer() {
    let _serial = serial();
    let port = free_port();
    let d = spawn(port, &[]);
    let provider = SoftProvider::new().unwrap();
    let (pool, mr) = client_pool(&provider);
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut c = Client::connect(
        &provider,
        addr,
        cfg(),
        pool.claim_slice(0).unwrap(),
        mr,
        Duration::from_secs(10),
    )
    .expect("connect and negotiate");
    for &size in &[1usize, 2, 1340, 1341, 4096, 100_000, 1 << 20] {
        let msg: Vec<u8> = (0..size).map(|i| (i * 13 + size) as u8).collect();
        c.send(&msg).unwrap();
        assert!(
            c.recv_with(Duration::from_secs(20), |m| m == &msg[..])
                .unwrap(),
            "echo of {size} B differs"
        );
    }
    let doc = stats_json(&d);
    assert_eq!(field(&doc, "connections"), 1, "{doc}");
    assert_eq!(field(&doc, "messages_in"), 7, "{doc}");
    let _ = c.close(Duration::from_secs(2));
    let (out, _err) = terminate(d);
    let final_doc = out
        .lines()
        .find_map(|l| l.strip_prefix("smbdirectd: final stats: "))
        .expect("final stats line");
    // Every pool buffer is back: free == total in every class.
    let mut rest = final_doc;
    let mut classes = 0;
    while let Some(i) = rest.find("\"buf_size\":") {
        rest = &rest[i..];
        let total = field(rest, "total");
        let free = field(rest, "free");
        assert_eq!(free, total, "pool buffers outstanding at exit: {final_doc}");
        classes += 1;
        rest = &rest[10..];
    }
    assert!(classes >= 3, "{final_doc}");
}

#[test]
fn workers_are_pinned_to_the_requested_cores_and_cp_is_not_on_them() {
    let _serial = serial();
    let port = free_port();
    let d = spawn(port, &[]);
    let pid = d.child.id();
    let mut found = 0;
    for e in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        let status = std::fs::read_to_string(e.path().join("status")).unwrap_or_default();
        let allowed = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        match comm.trim() {
            "dp-worker-0" => {
                assert_eq!(allowed, "1", "worker pinned to {allowed}");
                found += 1;
            }
            "cp" => {
                assert_eq!(allowed, "0", "cp on {allowed}, expected the spare core 0");
                found += 1;
            }
            _ => {}
        }
    }
    assert_eq!(found, 2, "expected threads dp-worker-0 and cp");
    terminate(d);
}

/// `serve` raises its soft limit on open files to the hard one: started
/// with 64 (of the test's hard limit), it runs with the hard limit.
#[test]
fn serve_raises_its_open_file_limit_to_the_hard_limit() {
    let _serial = serial();
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit, ours.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) }, 0);
    let hard = r.rlim_max.min(1 << 20);
    if hard <= 64 {
        eprintln!("skipped: the hard limit on open files is {hard}");
        return;
    }
    let port = free_port();
    let d = spawn_with(port, &[], |cmd| {
        use std::os::unix::process::CommandExt;
        let low = libc::rlimit {
            rlim_cur: 64,
            rlim_max: r.rlim_max,
        };
        // SAFETY: setrlimit is async-signal-safe; `low` is copied into
        // the closure.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setrlimit(libc::RLIMIT_NOFILE, &low) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
        };
    });
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", d.child.id())).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("Max open files in /proc/PID/limits");
    let soft: Vec<&str> = line.split_whitespace().skip(3).take(1).collect();
    assert_eq!(soft, [hard.to_string()], "{line}");
    terminate(d);
}

#[test]
fn capture_of_a_session_decodes_in_tshark_with_the_values_sent() {
    let _serial = serial();
    if Command::new("tshark").arg("--version").output().is_err() {
        eprintln!("skipped: tshark not installed (apt-get install tshark)");
        return;
    }
    let port = free_port();
    let pcap = format!("/tmp/smbdirectd-capture-{port}.pcap");
    let _ = std::fs::remove_file(&pcap);
    let d = spawn(port, &["--capture", &pcap]);
    let provider = SoftProvider::new().unwrap();
    let (pool, mr) = client_pool(&provider);
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut c = Client::connect(
        &provider,
        addr,
        cfg(),
        pool.claim_slice(0).unwrap(),
        mr,
        Duration::from_secs(10),
    )
    .unwrap();
    let sizes = [100usize, 500, 3000];
    for &size in &sizes {
        let msg = vec![0x5a; size];
        c.send(&msg).unwrap();
        c.recv_with(Duration::from_secs(10), |m| assert_eq!(m.len(), size))
            .unwrap();
    }
    let _ = c.close(Duration::from_secs(2));
    let (out, _) = terminate(d);
    assert!(
        out.contains("capture:"),
        "capture stats line missing:\n{out}"
    );
    let fields = Command::new("tshark")
        .env("HOME", "/nonexistent")
        .args([
            "-n",
            "-r",
            &pcap,
            "-Y",
            "smb_direct",
            "-T",
            "fields",
            "-E",
            "separator=;",
        ])
        .args([
            "-e",
            "smb_direct.version.min",
            "-e",
            "smb_direct.credits.requested",
        ])
        .args([
            "-e",
            "smb_direct.preferred_send_size",
            "-e",
            "smb_direct.max_receive_size",
        ])
        .args([
            "-e",
            "smb_direct.max_fragmented_size",
            "-e",
            "smb_direct.data_offset",
        ])
        .args([
            "-e",
            "smb_direct.data_length",
            "-e",
            "smb_direct.remaining_length",
        ])
        .output()
        .expect("run tshark");
    let text = String::from_utf8_lossy(&fields.stdout);
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split(';').collect()).collect();
    // The client's Negotiate Request: version 0x0100, 32 credits, 1364 / 8192 / 1 MiB.
    assert!(
        rows.iter().any(|r| r[0] == "0x0100"
            && r[1] == "32"
            && r[2] == "1364"
            && r[3] == "8192"
            && r[4] == "1048576"),
        "negotiate request not decoded as sent:\n{text}"
    );
    // The server's Negotiate Response carries the server's sizes (1364 send, 8192 receive).
    assert!(
        rows.iter().filter(|r| r[0] == "0x0100").count() >= 2,
        "negotiate response missing:\n{text}"
    );
    // Each echoed message, both directions: DataOffset 24 and its length (3000 B is fragmented).
    for &size in &sizes[..2] {
        let n = rows
            .iter()
            .filter(|r| r[5] == "24" && r[6] == size.to_string())
            .count();
        assert!(
            n >= 2,
            "data transfer of {size} B seen {n} times (want request and echo):\n{text}"
        );
    }
    let first_frag = rows
        .iter()
        .filter(|r| r[5] == "24" && r[6] == "1340" && r[7] == "1660")
        .count();
    assert!(
        first_frag >= 2,
        "first fragment of the 3000-byte message (1340 + 1660 remaining) missing:\n{text}"
    );
    if std::env::var_os("SMBDIRECTD_KEEP_CAPTURE").is_none() {
        let _ = std::fs::remove_file(&pcap);
    }
}

#[test]
fn idle_connection_gets_keepalives_and_stays_up() {
    let _serial = serial();
    let port = free_port();
    let d = spawn(port, &["--keepalive-interval", "1"]);
    let provider = SoftProvider::new().unwrap();
    let (pool, mr) = client_pool(&provider);
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut c = Client::connect(
        &provider,
        addr,
        cfg(),
        pool.claim_slice(0).unwrap(),
        mr,
        Duration::from_secs(10),
    )
    .unwrap();
    // Idle (but polling, so keepalives are answered) until the server has
    // sent two keepalives: about 2 s with a 1 s interval; the deadline
    // allows for a loaded machine (it once took longer than 2.5 s at load 11).
    let start = Instant::now();
    while c.connection().stats().keepalives_received < 2
        && start.elapsed() < Duration::from_secs(15)
    {
        c.step(&mut |_, _| panic!("no upper-layer message expected"))
            .unwrap();
        std::thread::sleep(Duration::from_micros(200));
    }
    let ka = c.connection().stats().keepalives_received;
    assert!(
        ka >= 2,
        "server sent {ka} keepalives in {:?} with a 1 s interval",
        start.elapsed()
    );
    c.send(b"still here").unwrap();
    assert!(c
        .recv_with(Duration::from_secs(5), |m| m == b"still here")
        .unwrap());
    let doc = stats_json(&d);
    assert_eq!(field(&doc, "timeouts"), 0, "{doc}");
    let _ = c.close(Duration::from_secs(2));
    terminate(d);
}

#[test]
fn sixty_four_connections_over_two_workers_one_violator_is_cut_off_alone() {
    let _serial = serial();
    use smbdirect_dataplane::provider::{QueuePair, SendOp, SendWr};
    use smbdirect_hugepages::{ClassId, SizeClass};
    let port = free_port();
    let d = spawn(
        port,
        &[
            "--cores",
            "0,1",
            "--max-connections",
            "64",
            "--pool-mem",
            "256M",
        ],
    );
    let provider = SoftProvider::new().unwrap();
    const N: usize = 64;
    let pool = PoolConfig::new(64 << 20, N)
        .class(SizeClass::new("receive", 8192).per_slice(40))
        .class(SizeClass::new("send", 1364).per_slice(48))
        .class(SizeClass::new("msg", 8192).per_slice(4))
        .backing(Backing::SharedMemfd)
        .build()
        .unwrap();
    // SAFETY: the pool lives for the whole test.
    let mr = unsafe { provider.register_pool(&pool) }.unwrap();
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let t0 = Instant::now();
    let mut clients: Vec<_> = (0..N)
        .map(|i| {
            Client::connect(
                &provider,
                addr,
                cfg(),
                pool.claim_slice(i).unwrap(),
                mr,
                Duration::from_secs(20),
            )
            .unwrap_or_else(|e| panic!("client {i}: {e}"))
        })
        .collect();
    eprintln!("connected {N} clients at {:?}", t0.elapsed());
    let violator = 17;
    let rounds = 40;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut verified = 0u64;
    for round in 0..rounds {
        let mut expect: Vec<Option<Vec<u8>>> = vec![None; N];
        for (i, c) in clients.iter_mut().enumerate() {
            if i == violator && round == rounds / 2 {
                // Mid-stream, a Data Transfer whose DataOffset is not 8-byte
                // aligned ([MS-SMBD] 3.1.5.8: the receiver MUST terminate).
                let buf = c.alloc_mut().alloc(ClassId(1)).unwrap();
                let loc = pool.locate(buf).unwrap();
                let mut bad = [0u8; 40];
                bad[0] = 1; // CreditsRequested
                bad[12] = 20; // DataOffset 20: unaligned
                bad[16] = 8; // DataLength
                             // SAFETY: buf is ours.
                unsafe { pool.bytes_mut(buf).unwrap()[..40].copy_from_slice(&bad) };
                let sge = [mr.sge(loc.offset as u64, 40)];
                let wr = [SendWr {
                    wr_id: 7 << 62,
                    op: SendOp::Send {
                        sges: &sge,
                        invalidate: None,
                    },
                    signaled: false,
                }];
                c.endpoint_mut().qp_mut().post_send(&wr).unwrap();
                continue;
            }
            if i == violator && round > rounds / 2 {
                continue;
            }
            let size = 1 + (next() % 6000) as usize;
            let msg: Vec<u8> = (0..size).map(|k| (k as u64 ^ next()) as u8).collect();
            c.send(&msg)
                .unwrap_or_else(|e| panic!("client {i} round {round}: {e}"));
            expect[i] = Some(msg);
        }
        for (i, c) in clients.iter_mut().enumerate() {
            if let Some(msg) = expect[i].take() {
                let ok = c
                    .recv_with(Duration::from_secs(30), |m| m == &msg[..])
                    .unwrap_or_else(|e| panic!("client {i} round {round}: {e}"));
                assert!(ok, "client {i} round {round}: echo differs");
                verified += msg.len() as u64;
            }
        }
    }
    eprintln!("rounds done at {:?}", t0.elapsed());
    // The violator's connection is gone; the server logged why.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = clients[violator].step(&mut |_, _| {});
        if r.is_err() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "violator's connection was not terminated"
        );
    }
    let doc = stats_json(&d);
    assert_eq!(field(&doc, "protocol_errors"), 1, "{doc}");
    assert_eq!(field(&doc, "connections"), (N - 1) as u64, "{doc}");
    for (i, c) in clients.into_iter().enumerate() {
        if i != violator {
            let _ = c.close(Duration::from_secs(2));
        }
    }
    let (_out, err) = terminate(d);
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("protocol violation"))
        .collect();
    assert_eq!(lines.len(), 1, "expected one violation log line:\n{err}");
    assert!(
        lines[0].contains("DataOffset 20 is not 8-byte aligned"),
        "{}",
        lines[0]
    );
    eprintln!("63 connections x {rounds} rounds: {verified} bytes echoed and verified");
}

/// `serve --provider verbs --pool-mem 96M` plus `extra` on $RXE_IP (or
/// 127.0.0.1) and a free port, with its listen address; None (the test
/// says it is skipped) where there is no RDMA device.
fn spawn_verbs(extra: &[&str]) -> Option<(Daemon, String)> {
    use smbdirect_dataplane::provider::verbs::devices;
    if devices().map(|d| d.is_empty()).unwrap_or(true) {
        eprintln!("skipped: no RDMA device (runs in the rxe guest: scripts/rxe-tests.sh)");
        return None;
    }
    let ip = std::env::var("RXE_IP").unwrap_or_else(|_| "127.0.0.1".into());
    let port = free_port();
    let listen = format!("{ip}:{port}");
    let mut args = vec![
        "--provider",
        "verbs",
        "--listen",
        &listen,
        "--pool-mem",
        "96M",
    ];
    args.extend_from_slice(extra);
    Some((spawn(port, &args), listen))
}

/// A verbs client connected to `listen` and negotiated, with the provider
/// and pool it uses (kept alive by the caller).
fn verbs_client(
    listen: &str,
) -> (
    smbdirect_dataplane::provider::verbs::VerbsProvider,
    BufferPool,
    Client<smbdirect_dataplane::provider::verbs::VerbsProvider>,
) {
    use smbdirect_dataplane::provider::verbs::{VerbsConfig, VerbsProvider};
    let provider = VerbsProvider::open(VerbsConfig::default()).expect("open the RDMA device");
    let pool = PoolConfig::smbdirect(48 << 20, 1, 8192, 1364, 1 << 20)
        .build()
        .unwrap();
    // SAFETY: the pool lives for the whole test (returned to the caller).
    let mr =
        unsafe { provider.register(pool.region_base().as_ptr(), pool.region_len(), None) }.unwrap();
    let c = Client::connect(
        &provider,
        listen.parse().unwrap(),
        cfg(),
        pool.claim_slice(0).unwrap(),
        mr,
        Duration::from_secs(20),
    )
    .expect("connect over verbs and negotiate");
    (provider, pool, c)
}

/// `serve --provider verbs` with the default idle mode (sleep on the
/// completion channel after --idle-park-us): an idle connection's worker
/// sleeps, and is woken by the server's own keepalive timer (the client
/// sees the keepalives) and by messages that arrive after idle gaps.
#[test]
fn serve_over_verbs_idle_worker_sleeps_and_wakes_for_timers_and_messages() {
    let _serial = serial();
    let Some((d, listen)) = spawn_verbs(&["--keepalive-interval", "1"]) else {
        return;
    };
    let (_provider, _pool, mut c) = verbs_client(&listen);
    let sleeps = |d: &Daemon| field(&stats_json(d), "idle_sleeps");
    // Idle: only the server's keepalive timer (1 s) makes work. Two
    // keepalives must arrive while its worker sleeps in between.
    let before = sleeps(&d);
    let start = Instant::now();
    while c.connection().stats().keepalives_received < 2
        && start.elapsed() < Duration::from_secs(20)
    {
        c.step(&mut |_, _| panic!("no upper-layer message expected"))
            .unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    let ka = c.connection().stats().keepalives_received;
    assert!(
        ka >= 2,
        "server sent {ka} keepalives in {:?} with a 1 s interval",
        start.elapsed()
    );
    let after = sleeps(&d);
    assert!(
        after > before,
        "the idle worker never slept on its completion channel ({before} -> {after})"
    );
    // Messages after idle gaps wake it.
    for i in 0..5u8 {
        std::thread::sleep(Duration::from_millis(100));
        let msg = [b'w', b'a', b'k', b'e', i];
        c.send(&msg).unwrap();
        assert!(
            c.recv_with(Duration::from_secs(10), |m| m == msg).unwrap(),
            "echo {i} after an idle gap"
        );
    }
    let doc = stats_json(&d);
    assert_eq!(field(&doc, "timeouts"), 0, "{doc}");
    assert_eq!(field(&doc, "messages_in"), 5, "{doc}");
    assert!(field(&doc, "idle_sleeps") > after, "{doc}");
    let _ = c.close(Duration::from_secs(5));
    terminate(d);
}

/// `serve --provider verbs` at the default admission limit and credits
/// (256 connections of 257 receives and 148 sends: 103,680 completion
/// entries on one worker) on a device whose completion queues hold fewer
/// (rdma_rxe: 32,767): the server starts with the limit lowered to what a
/// queue holds, says so in one line, and serves. On a device with room,
/// nothing is lowered or said.
#[test]
fn serve_over_verbs_lowers_max_connections_to_what_the_device_cq_holds() {
    let _serial = serial();
    let Some((d, listen)) = spawn_verbs(&[
        "--max-connections",
        "256",
        "--receive-credit-max",
        "255",
        "--send-credit-target",
        "255",
    ]) else {
        return;
    };
    let (provider, _pool, mut c) = verbs_client(&listen);
    c.send(b"admitted").unwrap();
    assert!(
        c.recv_with(Duration::from_secs(60), |m| m == b"admitted")
            .unwrap(),
        "echo over the lowered server differs"
    );
    let max_cqe = provider.max_cq_entries();
    let err = d.stderr.lock().unwrap().clone();
    let lowered: Vec<&str> = err.lines().filter(|l| l.contains("lowered to")).collect();
    if max_cqe / 405 < 256 {
        assert_eq!(lowered.len(), 1, "expected one line saying so:\n{err}");
        let want = format!("--max-connections 256 lowered to {}", max_cqe / 405);
        assert!(lowered[0].contains(&want), "{}", lowered[0]);
        eprintln!("{}", lowered[0]);
    } else {
        assert!(lowered.is_empty(), "{err}");
    }
}

/// The same exchange over real verbs: runs where an RDMA device exists (the
/// Soft-RoCE guest of `scripts/rxe-tests.sh` in CI, or real hardware), with
/// `serve --provider verbs` on $RXE_IP (or 127.0.0.1 elsewhere).
#[test]
fn serve_over_verbs_echoes_and_returns_every_buffer() {
    let _serial = serial();
    let Some((d, listen)) = spawn_verbs(&[]) else {
        return;
    };
    let (_provider, _pool, mut c) = verbs_client(&listen);
    for &size in &[1usize, 1340, 1341, 65_536, 1 << 20] {
        let msg: Vec<u8> = (0..size).map(|i| (i * 3 + size) as u8).collect();
        c.send(&msg).unwrap();
        assert!(
            c.recv_with(Duration::from_secs(60), |m| m == &msg[..])
                .unwrap(),
            "echo of {size} B differs"
        );
    }
    // RDMA through granted descriptors ([MS-SMBD] 3.1.4.5/3.1.4.6): the
    // server RDMA-reads 256 KiB from two memory windows of ours and
    // RDMA-writes them into two others, then answers with Send with
    // Invalidate of the first write grant.
    {
        use smbdirect_dataplane::client::buffer_descriptor;
        use smbdirect_dataplane::provider::Access;
        use smbdirect_dataplane::upper::{
            parse_rdma_done, rdma_echo_request, RDMA_ECHO_INVALIDATE,
        };
        let len = 256 * 1024;
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + 1) as u8).collect();
        let src = c.alloc_buffer(len).unwrap();
        let dst = c.alloc_buffer(len).unwrap();
        assert!(c.write_buffer(src, 0, &data));
        let half = len / 2;
        let r = [
            c.grant(src, 0, half, Access::RemoteRead).unwrap(),
            c.grant(src, half, len - half, Access::RemoteRead).unwrap(),
        ];
        let w = [
            c.grant(dst, 0, half, Access::RemoteWrite).unwrap(),
            c.grant(dst, half, len - half, Access::RemoteWrite).unwrap(),
        ];
        let rd: Vec<[u8; 16]> = r.iter().map(|g| buffer_descriptor(g).to_bytes()).collect();
        let wd: Vec<[u8; 16]> = w.iter().map(|g| buffer_descriptor(g).to_bytes()).collect();
        c.send(&rdma_echo_request(
            len as u32,
            &rd,
            &wd,
            RDMA_ECHO_INVALIDATE,
        ))
        .unwrap();
        let (status, moved, token) = c
            .recv_with_token(Duration::from_secs(60), |m, t| {
                let (st, n) = parse_rdma_done(m).expect("RDMADONE reply");
                (st, n, t)
            })
            .unwrap();
        assert_eq!(status, smbdirect_protocol::ntstatus::STATUS_SUCCESS);
        assert_eq!(moved as usize, len);
        assert_eq!(
            token,
            Some(w[0].rkey),
            "Send with Invalidate names the first write token"
        );
        let mut back = vec![0u8; len];
        assert!(c.read_buffer(dst, 0, &mut back));
        assert!(back == data, "RDMA echo over verbs: bytes differ");
        for g in r.iter().chain(&w[1..]) {
            c.revoke(g.rkey).unwrap();
        }
        // The first write grant was invalidated by the peer; revoking it is not an error.
        c.revoke(w[0].rkey).unwrap();
        c.free_buffer(src);
        c.free_buffer(dst);
    }
    let doc = stats_json(&d);
    assert!(doc.contains("\"provider\":\"verbs\""), "{doc}");
    assert_eq!(field(&doc, "messages_in"), 6, "{doc}");
    let _ = c.close(Duration::from_secs(5));
    let (out, _) = terminate(d);
    assert!(out.contains("protocol errors"), "{out}");
    for l in out.lines().filter(|l| l.contains("buffers free")) {
        let frac = l
            .rsplit(": ")
            .next()
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap();
        let (free, total) = frac.split_once('/').unwrap();
        assert_eq!(free, total, "{l}");
    }
}

/// `serve --provider verbs --upper smb2` with the memory store registered
/// for zero-copy RDMA (runs in the rxe guest, skips elsewhere): SMB2 WRITEs
/// and READs through RDMA channels over verbs, staged (extending writes)
/// and in place (overwrites; READs from the store's blocks, holes from its
/// zero block), checked against a model of the file.
#[test]
fn serve_over_verbs_smb2_rdma_moves_data_to_and_from_the_store_blocks() {
    let _serial = serial();
    use smbdirect_dataplane::provider::verbs::{VerbsConfig, VerbsProvider};
    use smbdirect_dataplane::smb2::client::{Smb2Client, Smb2ClientOptions, Transfer};
    use smbdirect_protocol::smb2::{CreateDisposition, CreateOptions, Dialect};
    let Some((d, listen)) = spawn_verbs(&["--upper", "smb2", "--store-size", "64M"]) else {
        return;
    };
    let provider = VerbsProvider::open(VerbsConfig::default()).expect("open the RDMA device");
    let pool = PoolConfig::smbdirect(48 << 20, 1, 8192, 1364, 1 << 20)
        .build()
        .unwrap();
    // SAFETY: the pool lives for the whole test.
    let mr =
        unsafe { provider.register(pool.region_base().as_ptr(), pool.region_len(), None) }.unwrap();
    let mut c = Smb2Client::connect(
        &provider,
        listen.parse().unwrap(),
        cfg(),
        pool.claim_slice(0).unwrap(),
        mr,
        Duration::from_secs(20),
        Smb2ClientOptions::default(),
    )
    .expect("connect over verbs");
    c.negotiate(&[Dialect::SMB_3_1_1]).unwrap();
    c.session_setup_anonymous().unwrap();
    c.tree_connect("data").unwrap();
    let fid = c
        .create(
            "zc.bin",
            CreateDisposition::OVERWRITE_IF,
            CreateOptions::NON_DIRECTORY_FILE,
        )
        .unwrap()
        .file_id;
    let t = Transfer::Rdma {
        descriptors: 2,
        invalidate: true,
    };
    let mut model = Vec::new();
    // Extending (staged), a hole, then overwrites (in place).
    for (i, &(off, len)) in [
        (0usize, 200_000usize),
        (400_000, 5_000),
        (50_000, 100_000),
        (399_990, 20),
    ]
    .iter()
    .enumerate()
    {
        let data: Vec<u8> = (0..len).map(|j| (j * 7 + i * 31 + 1) as u8).collect();
        assert_eq!(c.write(fid, off as u64, &data, t).unwrap() as usize, len);
        if model.len() < off + len {
            model.resize(off + len, 0);
        }
        model[off..off + len].copy_from_slice(&data);
        let back = c.read(fid, 0, 1 << 20, t).unwrap();
        assert!(
            back == model,
            "after write {i}: the file read back over verbs differs"
        );
    }
    c.close(fid).unwrap();
    let _ = c.disconnect(Duration::from_secs(5));
    let (_out, err) = terminate(d);
    assert!(
        !err.contains("zero-copy RDMA off"),
        "the store registers with the verbs provider: {err}"
    );
}

#[test]
fn silent_peer_is_dropped_by_the_5s_negotiation_timer_and_unanswered_keepalives_end_a_connection() {
    use smbdirect_dataplane::provider::{CompletionQueue, QpCaps};
    let _serial = serial();
    let port = free_port();
    let d = spawn(port, &["--keepalive-interval", "1"]);
    let provider = SoftProvider::new().unwrap();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    // 1. A peer that connects at the RDMA level and never sends its
    //    Negotiate Request ([MS-SMBD] 3.1.7.2: 5 s Negotiation Timer).
    let cq = provider.create_cq(64).unwrap();
    let (silent, _) = provider
        .connect(
            addr,
            &cq.handle(),
            QpCaps {
                max_send_wr: 8,
                max_recv_wr: 8,
                ..QpCaps::default()
            },
            &[],
            Duration::from_secs(5),
        )
        .unwrap();
    // 2. A peer that negotiates, then stops processing messages, so the
    //    server's keepalive request goes unanswered ([MS-SMBD] 3.1.6.2).
    let (pool, mr) = client_pool(&provider);
    let deaf = Client::connect(
        &provider,
        addr,
        cfg(),
        pool.claim_slice(0).unwrap(),
        mr,
        Duration::from_secs(10),
    )
    .unwrap();
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(15);
    loop {
        let doc = stats_json(&d);
        if field(&doc, "timeouts") == 2 && field(&doc, "connections") == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "timers did not end both connections: {doc}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let el = t0.elapsed();
    assert!(
        el >= Duration::from_secs(5),
        "dropped after {el:?}, before the 5 s timers"
    );
    drop(silent);
    drop(deaf);
    let (_out, err) = terminate(d);
    assert!(err.contains("negotiation timer expired"), "{err}");
    assert!(err.contains("did not answer a keepalive"), "{err}");
}

#[test]
fn invalid_flags_get_one_line_and_exit_status_2() {
    for args in [
        &["serve", "--cores", "4096"][..],
        &["serve", "--cores", "3-1"][..],
        &["serve", "--pool-mem", "lots"][..],
        &["serve", "--max-fragmented-size", "1000"][..],
        &["serve", "--queue-depth", "0"][..],
        &["serve", "--log-level", "chatty"][..],
        // A copy core must not be a worker's, must exist, and needs a
        // directory store.
        &[
            "serve",
            "--cores",
            "0",
            "--store-copy-cores",
            "0",
            "--store",
            "/tmp",
        ][..],
        &[
            "serve",
            "--cores",
            "0",
            "--store-copy-cores",
            "4096",
            "--store",
            "/tmp",
        ][..],
        &["serve", "--store-copy-cores", "0"][..],
        &["loopback", "--size", "0"][..],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_smbdirectd"))
            .args(args)
            .output()
            .expect("run smbdirectd");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "{args:?}: want one line, got:\n{err}"
        );
        assert!(err.starts_with("smbdirectd: "), "{args:?}: {err}");
    }
}

/// The README's main job: an echo over the soft provider, its figures, the
/// server worker's busy share over the measured window, and every server
/// pool buffer home after shutdown.
#[test]
fn the_main_job_reports_throughput_latency_busy_share_and_a_full_pool() {
    let out = Command::new(env!("CARGO_BIN_EXE_smbdirectd"))
        .args(["loopback", "--duration", "0.5", "--warmup", "0.1"])
        .output()
        .expect("run smbdirectd");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("round trips/s"), "{text}");
    assert!(text.contains("latency us: min"), "{text}");
    let busy = text
        .split("server worker busy (loop cycles with work) ")
        .nth(1)
        .and_then(|r| r.split(" %").next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no busy share: {text}"));
    assert!(busy > 0.0 && busy <= 100.0, "{text}");
    let pool = text
        .lines()
        .find_map(|l| l.strip_prefix("server pool after shutdown (free/total): "))
        .unwrap_or_else(|| panic!("no pool line: {text}"));
    for class in pool.split(", ") {
        let (free, total) = class
            .rsplit_once(' ')
            .and_then(|(_, ft)| ft.split_once('/'))
            .unwrap_or_else(|| panic!("{class}"));
        assert_eq!(free, total, "{class}: {text}");
    }
}
