//! Long runs against `smbdirectd serve` as child processes (issue 7):
//!
//! - **soak**: two daemons side by side for `SMBDIRECTD_SOAK_SECS` (60 s by
//!   default), each with 2 pinned workers and 64 connections: `--upper
//!   echo` gets a random mix of SMB Direct sends (0 B to MaxFragmentedSize)
//!   and RDMA echoes (1 B to 1 MiB through 1-4 buffer descriptors);
//!   `--upper smb2` gets SMB2 READ and WRITE inline and through
//!   SMB2_CHANNEL_RDMA_V1(_INVALIDATE) (1 B to 8 MiB), a quarter of the
//!   connections in Storage QoS flows limited to 200 normalized IOPS. Every
//!   byte is verified (echoes against what was sent, reads against a shadow
//!   copy of each file); every request completes, or the test fails naming
//!   the connection and why. Credit invariants are checked after every poll
//!   of every connection on the client side, and every second on the
//!   server side through `stats --json` (see [`check_credits`] and
//!   [`ServerWatch`]).
//! - **churn**: `SMBDIRECTD_CHURN_CYCLES` (10,000 by default)
//!   connect/negotiate/IO/disconnect cycles against `--upper smb2`, a fifth
//!   of them disconnecting abruptly with RDMA transfers and a fragmented
//!   message in flight; afterwards the daemon's pool free counts, grants,
//!   registrations, sessions, opens, Storage QoS flows, open file
//!   descriptors and memory mappings are back to what they were before the
//!   first cycle.
//!
//! Both print their figures (`--nocapture` shows them; they are on stderr).
//! docs/reliability.md says how to run the long variants.

mod common;
use common::*;

use smbdirect_dataplane::client::{buffer_descriptor, Client, ClientError};
use smbdirect_dataplane::provider::soft::SoftProvider;
use smbdirect_dataplane::provider::{Access, Grant, Provider};
use smbdirect_dataplane::smb2::client::{
    IoBuf, MessageId, Smb2Client, Smb2ClientOptions, Smb2Error, Transfer,
};
use smbdirect_dataplane::smb2::MAX_INLINE;
use smbdirect_dataplane::upper::{parse_rdma_done, rdma_echo_request, RDMA_ECHO_INVALIDATE};
use smbdirect_hugepages::BufId;
use smbdirect_protocol::ntstatus::STATUS_SUCCESS;
use smbdirect_protocol::smb2::{CreateDisposition, CreateOptions, Dialect, FileId};
use smbdirect_protocol::smbd::{SendError, SmbdConfig};
use smbdirect_protocol::sqos::client::{LogicalFlow, PolicyParams};
use smbdirect_protocol::sqos::{normalized_io_size, Dialect as QosDialect, Guid};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// Shared pieces

/// The daemons' `--receive-credit-max` (the harness default) and the
/// clients' ReceiveCreditMax / SendCreditTarget.
const SERVER_RECEIVE_CREDIT_MAX: u16 = 32;
const CLIENT_CREDITS: u16 = 32;
/// The daemons' MaxFragmentedSize (the default).
const MAX_FRAGMENTED: usize = 1 << 20;
/// [MS-SMB2] credits the server lets a connection hold
/// (`smb2::MAX_CREDITS`).
const SMB2_MAX_CREDITS: u32 = 512;

fn cfg() -> SmbdConfig {
    SmbdConfig {
        receive_credit_max: CLIENT_CREDITS,
        send_credit_target: CLIENT_CREDITS,
        ..SmbdConfig::default()
    }
}

/// Prints a figure of the run on stderr even when the test harness
/// captures output (a passing test's `eprintln!` is swallowed): CI logs
/// show the soak's and churn's figures without `--nocapture`.
macro_rules! figure {
    ($($t:tt)*) => {{
        use std::io::Write;
        let line = format!($($t)*);
        let _ = writeln!(std::io::stderr().lock(), "{line}");
    }};
}

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

/// splitmix64: small, seedable, good enough to pick sizes and offsets.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }

    /// 1..=max, spread evenly over the powers of two (as many 10-byte
    /// transfers as 1 MiB ones).
    fn size(&mut self, max: usize) -> usize {
        let bits = 64 - (max as u64).leading_zeros() as u64;
        let top = 1u64 << self.below(bits);
        (1 + self.below(top) as usize).min(max)
    }
}

/// Random bytes every payload is a window of: a payload is named by a key,
/// and its bytes are `NOISE_SPAN` bytes further into the noise for each
/// key (so two payloads of one length differ, and a payload delivered in
/// the place of another is noticed). Comparing is a memcmp, which keeps an
/// unoptimized test build from spending the run generating patterns.
struct Noise(Vec<u8>);

const NOISE_SPAN: usize = 1 << 20;
/// The longest payload: a soak file (both slots).
const NOISE_MAX: usize = 9 << 20;

impl Noise {
    fn new(seed: u64) -> Noise {
        let mut r = Rng(seed);
        let mut v = Vec::with_capacity(NOISE_MAX + NOISE_SPAN + 8);
        while v.len() < NOISE_MAX + NOISE_SPAN {
            v.extend_from_slice(&r.next().to_le_bytes());
        }
        Noise(v)
    }

    fn bytes(&self, key: u64, len: usize) -> &[u8] {
        let off = (Rng(key).next() % NOISE_SPAN as u64) as usize;
        &self.0[off..off + len]
    }
}

fn addr(port: u16) -> SocketAddr {
    format!("127.0.0.1:{port}").parse().unwrap()
}

/// Client-side credit invariants of one SMB Direct connection ([MS-SMBD]
/// 3.1.1.1, 3.1.5.1, 3.1.5.9), checked after every poll:
///
/// - the books balance: Data Transfer messages sent plus send credits
///   held equals the credits the server ever granted (so no message went
///   out without a credit, and no grant was lost or counted twice);
/// - the client never holds more send credits than the server can have
///   receives posted (its ReceiveCreditMax + 1): the server grants only
///   receives it has posted;
/// - the client's own receives: granted ones are posted ones, and never
///   more than its ReceiveCreditMax + 1 are posted.
///
/// Returns why an invariant fails.
fn check_credits<P: Provider>(c: &Client<P>) -> Result<(), String> {
    let conn = c.connection();
    if !conn.is_established() {
        return Ok(());
    }
    let cr = conn.credits();
    let st = conn.stats();
    if st.messages_sent + u64::from(cr.send_credits) != st.credits_granted {
        return Err(format!(
            "{} messages sent + {} send credits held != {} credits granted",
            st.messages_sent, cr.send_credits, st.credits_granted
        ));
    }
    if cr.send_credits > SERVER_RECEIVE_CREDIT_MAX + 1 {
        return Err(format!(
            "{} send credits held; the server posts at most {}",
            cr.send_credits,
            SERVER_RECEIVE_CREDIT_MAX + 1
        ));
    }
    if cr.peer_credits > cr.recv_posted || cr.recv_posted > CLIENT_CREDITS + 1 {
        return Err(format!(
            "{} receives granted, {} posted (at most {})",
            cr.peer_credits,
            cr.recv_posted,
            CLIENT_CREDITS + 1
        ));
    }
    Ok(())
}

/// An SMB Direct connection's state, for a failure message.
fn conn_state<P: Provider>(c: &Client<P>) -> String {
    let conn = c.connection();
    format!(
        "credits {:?}, {} queued to send, {} B reassembled, {:?}",
        conn.credits(),
        conn.send_queue_len(),
        conn.reassembly_buffered(),
        conn.stats()
    )
}

/// The last 100 lines of a daemon's log (without the hugepage warning).
/// The daemon's log for a failure message: its whole standard error goes
/// to a file under the target directory (the line that explains a failure
/// can be hundreds of lines before the end), and the message carries the
/// file's path and the last 100 log lines.
fn daemon_log(d: &Daemon) -> String {
    let err = d.stderr.lock().unwrap().clone();
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("soak-daemon-{}.log", d.child.id()));
    let saved = match std::fs::write(&path, &err) {
        Ok(()) => format!("whole log: {}", path.display()),
        Err(e) => format!("(could not save the whole log to {}: {e})", path.display()),
    };
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("smbdirectd:") || l.contains("panicked"))
        .collect();
    // Its counters now (timeouts, refusals, errors), if it still answers.
    let stats = try_stats_json(d).unwrap_or_else(|e| format!("(stats failed: {})", e.trim()));
    format!(
        "{saved}\nstats: {}\n{}",
        stats.trim(),
        lines[lines.len().saturating_sub(100)..].join("\n")
    )
}

/// The server side, every second while the soak runs: nothing a healthy
/// run cannot show. `rnr` counts the server's sends that found no receive
/// posted at the client (a send beyond the credits the client granted),
/// the client provider's `rnr_errors` the converse; `protocol_errors`
/// includes a peer's send without a credit ([MS-SMBD] 3.1.5.8); no
/// connection may be dropped, time out or fail an RDMA access.
struct ServerWatch {
    checks: AtomicU64,
}

impl ServerWatch {
    fn check(&self, name: &str, doc: &str, connections: u64) -> Result<(), String> {
        for key in [
            "rnr",
            "protocol_errors",
            "rdma_errors",
            "timeouts",
            "negotiate_failures",
            "rejected",
            "rnr_errors",
            "access_violations",
            "remote_access_errors",
            "length_errors",
            "peers_lost",
        ] {
            if field(doc, key) != 0 {
                return Err(format!("{name} daemon: {key} is not 0: {doc}"));
            }
        }
        if field(doc, "connections") != connections {
            return Err(format!(
                "{name} daemon: {} connections, not {connections}: {doc}",
                field(doc, "connections")
            ));
        }
        self.checks.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Pool `free` counts by class, from `stats --json`.
fn pool_free(doc: &str) -> Vec<(String, u64)> {
    let classes = &doc[doc.find("\"classes\":").expect("pool classes")..];
    classes
        .split("{\"name\":\"")
        .skip(1)
        .map(|c| {
            let name = c[..c.find('"').unwrap()].to_string();
            (name, field(c, "free"))
        })
        .collect()
}

/// What must be back where it started once every client is gone. Storage
/// QoS flows are not: a flow no Open references stays for the retention
/// period (60 s, docs/spec-notes.md "Logical flow lifetime") so that a
/// client reopening its file finds it; see [`check_flows`].
fn resources(doc: &str) -> Vec<(String, u64)> {
    let mut v = pool_free(doc);
    for key in [
        "connections",
        "sessions",
        "opens",
        "qos_opens",
        "qos_queued",
        "registrations",
        "grants_live",
    ] {
        v.push((key.to_string(), field(doc, key)));
    }
    v
}

/// The flows a run leaves: at most the `named` distinct flow ids its
/// clients used (each association reuses its flow; none leaks), none with
/// an Open (`qos_opens` is in [`resources`]). With
/// `SMBDIRECTD_WAIT_FLOW_RETENTION=1`, also waits out the retention period
/// and requires every flow gone.
fn check_flows(d: &Daemon, name: &str, named: u64) -> u64 {
    let doc = stats_json(d);
    let flows = field(&doc, "flows");
    assert!(
        flows <= named,
        "{name}: {flows} Storage QoS flows left; the clients named {named}: {doc}"
    );
    if env_u64("SMBDIRECTD_WAIT_FLOW_RETENTION", 0) != 0 {
        wait_for_stats(
            d,
            Duration::from_secs(120),
            "every flow removed after its retention",
            |doc| field(doc, "flows") == 0,
        );
        figure!("{name}: every Storage QoS flow removed after the retention period");
    }
    flows
}

fn show(v: &[(String, u64)]) -> String {
    v.iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The resources of a quiet daemon: two readings a little apart that
/// agree (workers lend their negotiate receives just after start).
fn quiet_baseline(d: &Daemon) -> Vec<(String, u64)> {
    let mut last = resources(&stats_json(d));
    for _ in 0..100 {
        std::thread::sleep(Duration::from_millis(50));
        let now = resources(&stats_json(d));
        if now == last {
            return now;
        }
        last = now;
    }
    last
}

// ---------------------------------------------------------------------------
// Soak: echo connections

/// Plain echoes kept in flight per connection, besides one RDMA echo.
const ECHO_DEPTH: usize = 2;

struct RdmaEcho {
    key: u64,
    len: usize,
    invalidate: bool,
    reads: Vec<Grant>,
    writes: Vec<Grant>,
    /// The RDMADONE reply: status, length, invalidated token.
    done: Option<(u32, u32, Option<u32>)>,
}

struct EchoConn {
    id: u64,
    c: Client<SoftProvider>,
    next_seq: u64,
    /// Keys and lengths of the plain echoes in flight, oldest first.
    plain: VecDeque<(u64, usize)>,
    rdma: Option<RdmaEcho>,
    src: BufId,
    dst: BufId,
}

#[derive(Default, Debug, Clone, Copy)]
struct EchoTotals {
    messages: u64,
    message_bytes: u64,
    empty_refused: u64,
    rdma_echoes: u64,
    rdma_bytes: u64,
    credit_checks: u64,
}

fn echo_key(conn: u64, seq: u64) -> u64 {
    conn << 40 | seq
}

/// One thread driving `conns` echo connections until `stop`, then
/// draining them.
fn echo_thread(port: u16, first: u64, conns: usize, stop: Arc<AtomicBool>) -> EchoTotals {
    let provider = SoftProvider::new().unwrap();
    let (pool, mr) = registered_pool(
        &provider,
        conns,
        &[
            ("send", 1364, 64),
            ("receive", 8192, 64),
            ("m64k", 65536, 4),
            ("data", 1 << 20, ECHO_DEPTH as u32 + 3),
        ],
    );
    let noise = Noise::new(first);
    let mut rng = Rng(first ^ 0xec40);
    let mut t = EchoTotals::default();
    let mut cs: Vec<EchoConn> = (0..conns)
        .map(|i| {
            let mut c = Client::connect(
                &provider,
                addr(port),
                cfg(),
                pool.claim_slice(i).unwrap(),
                mr,
                Duration::from_secs(30),
            )
            .unwrap_or_else(|e| panic!("echo connection {}: {e}", first + i as u64));
            let src = c.alloc_buffer(1 << 20).unwrap();
            let dst = c.alloc_buffer(1 << 20).unwrap();
            EchoConn {
                id: first + i as u64,
                c,
                next_seq: 0,
                plain: VecDeque::new(),
                rdma: None,
                src,
                dst,
            }
        })
        .collect();
    let mut scratch = vec![0u8; 1 << 20];
    let mut drain_deadline = None;
    loop {
        let stopping = stop.load(Ordering::Relaxed);
        if stopping && drain_deadline.is_none() {
            drain_deadline = Some(Instant::now() + Duration::from_secs(120));
        }
        let mut progress = false;
        let mut busy = false;
        for e in cs.iter_mut() {
            if !stopping {
                echo_submit(e, &mut rng, &noise, &mut t);
            }
            progress |= echo_poll(e, &noise, &mut scratch, &mut t);
            busy |= !e.plain.is_empty() || e.rdma.is_some();
        }
        if stopping && !busy {
            break;
        }
        if let Some(d) = drain_deadline {
            assert!(
                Instant::now() < d,
                "echo: requests still unanswered 120 s after the soak ended: {}",
                cs.iter()
                    .filter(|e| !e.plain.is_empty() || e.rdma.is_some())
                    .map(|e| format!(
                        "connection {}: {} plain (next {:?} B), RDMA {:?}; {}",
                        e.id,
                        e.plain.len(),
                        e.plain.front().map(|p| p.1),
                        e.rdma.as_ref().map(|r| (r.len, r.done)),
                        conn_state(&e.c)
                    ))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
        if !progress {
            std::thread::yield_now();
        }
    }
    for e in cs {
        drop(e.c.close(Duration::from_secs(5)));
    }
    let s = provider.stats();
    assert_eq!(s.rnr_errors, 0, "echo client sent without a credit: {s:?}");
    t
}

fn echo_submit(e: &mut EchoConn, rng: &mut Rng, noise: &Noise, t: &mut EchoTotals) {
    while e.plain.len() < ECHO_DEPTH {
        // 0 B to MaxFragmentedSize; an empty upper-layer message is refused
        // before it reaches the wire ([MS-SMBD] 3.1.4.2 sends messages;
        // empty Data Transfer messages carry only credits).
        let len = if rng.chance(32) {
            0
        } else {
            rng.size(MAX_FRAGMENTED)
        };
        let key = echo_key(e.id, e.next_seq);
        match e.c.send(noise.bytes(key, len)) {
            Ok(()) => {
                e.next_seq += 1;
                e.plain.push_back((key, len));
            }
            Err(ClientError::Send(SendError::Empty)) if len == 0 => t.empty_refused += 1,
            Err(ClientError::Send(SendError::QueueFull)) | Err(ClientError::PoolExhausted) => break,
            Err(err) => panic!("echo connection {}: send of {len} B: {err}", e.id),
        }
    }
    if e.rdma.is_none() && rng.chance(4) {
        let len = rng.size(1 << 20);
        let key = echo_key(e.id, e.next_seq) | 1 << 39;
        e.next_seq += 1;
        assert!(e.c.write_buffer(e.src, 0, noise.bytes(key, len)));
        let n = 1 + rng.below(4.min(len as u64)) as usize;
        let grant = |c: &mut Client<SoftProvider>, buf, access| -> Vec<Grant> {
            let mut off = 0;
            (0..n)
                .map(|i| {
                    let piece = len / n + usize::from(i < len % n);
                    let g = c.grant(buf, off, piece, access).expect("grant");
                    off += piece;
                    g
                })
                .collect()
        };
        let reads = grant(&mut e.c, e.src, Access::RemoteRead);
        let writes = grant(&mut e.c, e.dst, Access::RemoteWrite);
        let invalidate = rng.chance(2);
        let wire = |g: &[Grant]| -> Vec<[u8; 16]> {
            g.iter().map(|g| buffer_descriptor(g).to_bytes()).collect()
        };
        let req = rdma_echo_request(
            len as u32,
            &wire(&reads),
            &wire(&writes),
            if invalidate { RDMA_ECHO_INVALIDATE } else { 0 },
        );
        e.c.send(&req)
            .unwrap_or_else(|err| panic!("echo connection {}: RDMA echo: {err}", e.id));
        e.rdma = Some(RdmaEcho {
            key,
            len,
            invalidate,
            reads,
            writes,
            done: None,
        });
    }
}

/// Polls one echo connection; verifies what arrived. Returns whether
/// anything happened.
fn echo_poll(e: &mut EchoConn, noise: &Noise, scratch: &mut [u8], t: &mut EchoTotals) -> bool {
    let EchoConn {
        id,
        c,
        plain,
        rdma,
        dst,
        ..
    } = e;
    let id = *id;
    let progress = c
        .step(&mut |m, token| {
            if let Some((status, n)) = parse_rdma_done(m).filter(|_| m.len() == 16) {
                let r = rdma
                    .as_mut()
                    .unwrap_or_else(|| panic!("echo connection {id}: RDMADONE with none asked"));
                assert!(r.done.is_none(), "echo connection {id}: two RDMADONEs");
                r.done = Some((status.0, n, token));
                return;
            }
            let (key, len) = plain
                .pop_front()
                .unwrap_or_else(|| panic!("echo connection {id}: {} B nobody sent", m.len()));
            assert!(
                m.len() == len && m == noise.bytes(key, len),
                "echo connection {id}: message {:#x} came back corrupt ({} B, {len} B sent)",
                key,
                m.len()
            );
            t.messages += 1;
            t.message_bytes += len as u64;
        })
        .unwrap_or_else(|err| panic!("echo connection {id}: the connection failed: {err}"));
    if let Err(why) = check_credits(c) {
        panic!("echo connection {id}: credit invariant: {why}");
    }
    t.credit_checks += 1;
    if let Some((status, n, token)) = rdma.as_ref().and_then(|r| r.done) {
        let r = rdma.take().unwrap();
        assert_eq!(
            (status, n as usize),
            (STATUS_SUCCESS.0, r.len),
            "echo connection {id}: RDMA echo of {} B",
            r.len
        );
        let first = r.writes[0].rkey;
        assert_eq!(
            token,
            r.invalidate.then_some(first),
            "echo connection {id}: the reply's invalidated token"
        );
        assert!(c.read_buffer(*dst, 0, &mut scratch[..r.len]));
        assert!(
            scratch[..r.len] == *noise.bytes(r.key, r.len),
            "echo connection {id}: RDMA echo of {} B came back corrupt",
            r.len
        );
        for g in r.reads.iter().chain(&r.writes) {
            c.revoke(g.rkey)
                .unwrap_or_else(|err| panic!("echo connection {id}: revoke: {err}"));
        }
        t.rdma_echoes += 1;
        t.rdma_bytes += r.len as u64;
    }
    progress
}

// ---------------------------------------------------------------------------
// Soak: SMB2 connections

/// Per connection: two requests in flight, each in its own slot of the
/// file (so reads can be checked against the shadow copy while writes go
/// on), slot 0 up to 8 MiB, slot 1 up to 1 MiB.
const SLOTS: [usize; 2] = [8 << 20, 1 << 20];
/// Largest inline READ/WRITE: the server's (a response must fit one
/// reassembled SMB Direct message with its SMB2 header).
const INLINE_MAX: usize = MAX_INLINE as usize;
/// The Storage QoS limit of the limited flows (normalized IOPS, [MS-SQOS]
/// 3.2.5.1.2), and which connections have one.
const QOS_LIMIT: u64 = 200;
const QOS_EVERY: u64 = 4;

struct Io {
    id: MessageId,
    write: bool,
    off: usize,
    len: usize,
    inline: bool,
}

struct Slot {
    buf: IoBuf,
    base: usize,
    size: usize,
    io: Option<Io>,
}

struct SmbConn {
    id: u64,
    c: Smb2Client<SoftProvider>,
    fid: FileId,
    shadow: Vec<u8>,
    slots: Vec<Slot>,
    seq: u64,
    qos: Option<LogicalFlow>,
    normalized: u64,
}

#[derive(Default, Debug, Clone, Copy)]
struct SmbTotals {
    reads: u64,
    writes: u64,
    inline: u64,
    rdma: u64,
    bytes_read: u64,
    bytes_written: u64,
    smb2_credit_checks: u64,
    credit_checks: u64,
    /// Limited flows: normalized I/Os and seconds.
    qos_flows: u64,
    qos_normalized: u64,
    qos_secs: f64,
    qos_max_rate: f64,
}

fn smb_thread(port: u16, first: u64, conns: usize, stop: Arc<AtomicBool>) -> SmbTotals {
    let provider = SoftProvider::new().unwrap();
    let (pool, mr) = registered_pool(
        &provider,
        conns,
        &[
            ("send", 1364, 64),
            ("receive", 8192, 64),
            ("m64k", 65536, 4),
            ("m1m", 1 << 20, 5),
            ("big", 8 << 20, 1),
        ],
    );
    let noise = Noise::new(first);
    let mut rng = Rng(first ^ 0x5b2);
    let mut t = SmbTotals::default();
    let file_len: usize = SLOTS.iter().sum();
    let mut cs: Vec<SmbConn> = (0..conns)
        .map(|i| {
            let id = first + i as u64;
            let mut c = Smb2Client::connect(
                &provider,
                addr(port),
                cfg(),
                pool.claim_slice(i).unwrap(),
                mr,
                Duration::from_secs(30),
                Smb2ClientOptions {
                    timeout: Duration::from_secs(120),
                    ..Smb2ClientOptions::default()
                },
            )
            .unwrap_or_else(|e| panic!("SMB2 connection {id}: {e}"));
            c.negotiate(&[Dialect::SMB_3_1_1]).expect("negotiate");
            c.session_setup_anonymous().expect("session setup");
            c.tree_connect("data").expect("tree connect");
            let fid = c
                .create(
                    &format!("soak-{id}.bin"),
                    CreateDisposition::OVERWRITE_IF,
                    CreateOptions::NON_DIRECTORY_FILE,
                )
                .expect("create")
                .file_id;
            let mut base = 0;
            let slots = SLOTS
                .iter()
                .map(|&size| {
                    let s = Slot {
                        buf: c.alloc_io_buf(size).expect("I/O buffer"),
                        base,
                        size,
                        io: None,
                    };
                    base += size;
                    s
                })
                .collect::<Vec<_>>();
            // The whole file, once, so every read has bytes to compare.
            let shadow = noise.bytes(id, file_len).to_vec();
            for s in &slots {
                let data = &shadow[s.base..s.base + s.size];
                c.io_buf_mut(s.buf).unwrap().copy_from_slice(data);
                let rdma = Transfer::Rdma {
                    descriptors: 2,
                    invalidate: false,
                };
                let m = c
                    .submit_write(fid, s.base as u64, s.size as u32, s.buf, rdma)
                    .expect("initial write");
                let done = c.wait(m).expect("initial write");
                assert_eq!(done.result.expect("initial write") as usize, s.size);
            }
            // The flow limits the soak's I/O, not the initial write.
            let qos = (id % QOS_EVERY == 0).then(|| {
                let mut g = [0x5a; 16];
                g[..8].copy_from_slice(&id.to_le_bytes());
                let mut flow = LogicalFlow::new(Guid::from_bytes(g), QosDialect::V1_1);
                let now = c.now();
                let policy = PolicyParams {
                    limit: QOS_LIMIT,
                    ..PolicyParams::default()
                };
                c.qos_set_policy(fid, &mut flow, policy, now)
                    .expect("SET_POLICY")
                    .expect("its GET_STATUS response");
                assert!(flow.is_associated());
                flow
            });
            SmbConn {
                id,
                c,
                fid,
                shadow,
                slots,
                seq: 0,
                qos,
                normalized: 0,
            }
        })
        .collect();
    let start = Instant::now();
    let mut drain_deadline = None;
    loop {
        let stopping = stop.load(Ordering::Relaxed);
        if stopping && drain_deadline.is_none() {
            drain_deadline = Some(Instant::now() + Duration::from_secs(120));
        }
        let mut progress = false;
        let mut busy = false;
        for s in cs.iter_mut() {
            if !stopping {
                smb_submit(s, &mut rng, &noise);
            }
            progress |= smb_poll(s, &mut t);
            busy |= s.c.outstanding() > 0;
        }
        if stopping && !busy {
            break;
        }
        if let Some(d) = drain_deadline {
            assert!(
                Instant::now() < d,
                "SMB2: requests still outstanding 120 s after the soak ended: {}",
                cs.iter()
                    .filter(|s| s.c.outstanding() > 0)
                    .map(|s| format!(
                        "connection {}: {} outstanding, {} SMB2 credits; {}",
                        s.id,
                        s.c.outstanding(),
                        s.c.credits().available(),
                        conn_state(s.c.client())
                    ))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
        if !progress {
            std::thread::yield_now();
        }
    }
    let secs = start.elapsed().as_secs_f64();
    for mut s in cs {
        if s.qos.is_some() {
            t.qos_flows += 1;
            t.qos_normalized += s.normalized;
            t.qos_secs += secs;
            t.qos_max_rate = t.qos_max_rate.max(s.normalized as f64 / secs);
            // A limited flow gets its limit, not more: the token bucket may
            // let one largest request (1024 normalized I/Os) and the ones
            // in flight at the start through early.
            let bound = QOS_LIMIT as f64 * 1.1 * secs + 2048.0;
            assert!(
                (s.normalized as f64) <= bound,
                "SMB2 connection {}: {} normalized I/Os in {secs:.1} s through a {QOS_LIMIT} IOPS limit",
                s.id,
                s.normalized
            );
            // (An 8 MiB request is 1024 normalized I/Os: 5 s of this limit.)
            assert!(
                s.normalized > 0 || secs < 15.0,
                "SMB2 connection {}: starved for {secs:.1} s",
                s.id
            );
        }
        s.c.close(s.fid).expect("close");
        drop(s.c.disconnect(Duration::from_secs(5)));
    }
    let st = provider.stats();
    assert_eq!(
        st.rnr_errors, 0,
        "SMB2 client sent without a credit: {st:?}"
    );
    t
}

fn smb_submit(s: &mut SmbConn, rng: &mut Rng, noise: &Noise) {
    for k in 0..s.slots.len() {
        if s.slots[k].io.is_some() {
            continue;
        }
        let size = s.slots[k].size;
        let len = rng.size(size);
        let off = s.slots[k].base + rng.below((size - len + 1) as u64) as usize;
        let write = rng.chance(2);
        let inline = len <= INLINE_MAX && rng.chance(3);
        let transfer = if inline {
            Transfer::Inline
        } else {
            Transfer::Rdma {
                descriptors: 1 + rng.below(4.min(len as u64)) as usize,
                invalidate: rng.chance(2),
            }
        };
        let key = s.id << 40 | s.seq | 1 << 39;
        s.seq += 1;
        let buf = s.slots[k].buf;
        let r = if write {
            s.c.io_buf_mut(buf).expect("slot buffer")[..len].copy_from_slice(noise.bytes(key, len));
            s.c.submit_write(s.fid, off as u64, len as u32, buf, transfer)
        } else {
            s.c.submit_read(s.fid, off as u64, len as u32, buf, transfer)
        };
        match r {
            Ok(id) => {
                s.slots[k].io = Some(Io {
                    id,
                    write,
                    off,
                    len,
                    inline,
                })
            }
            // Out of credits until a response brings some: try later.
            Err(Smb2Error::NoCredits { .. }) => return,
            Err(e) => panic!("SMB2 connection {}: submit: {e}", s.id),
        }
    }
}

fn smb_poll(s: &mut SmbConn, t: &mut SmbTotals) -> bool {
    let done =
        s.c.poll(Duration::ZERO)
            .unwrap_or_else(|e| panic!("SMB2 connection {}: the connection failed: {e}", s.id));
    if let Err(why) = check_credits(s.c.client()) {
        panic!("SMB2 connection {}: credit invariant: {why}", s.id);
    }
    t.credit_checks += 1;
    // [MS-SMB2] 3.3.1.2: the server keeps at most 512 credits granted.
    let w = s.c.credits();
    assert!(
        w.available() <= SMB2_MAX_CREDITS,
        "SMB2 connection {}: {} credits held",
        s.id,
        w.available()
    );
    assert!(
        w.available() > 0 || s.c.outstanding() > 0,
        "SMB2 connection {}: no credits and nothing outstanding to bring any",
        s.id
    );
    t.smb2_credit_checks += 1;
    let Some(done) = done else {
        return false;
    };
    let slot = s
        .slots
        .iter_mut()
        .find(|sl| sl.io.as_ref().is_some_and(|io| io.id == done.id))
        .unwrap_or_else(|| panic!("SMB2 connection {}: completion of no request", s.id));
    let io = slot.io.take().unwrap();
    let what = format!(
        "SMB2 connection {}: {} {} of {} B at {}",
        s.id,
        if io.inline { "inline" } else { "RDMA" },
        if io.write { "WRITE" } else { "READ" },
        io.len,
        io.off
    );
    let n = done.result.unwrap_or_else(|e| panic!("{what}: {e}")) as usize;
    assert_eq!(n, io.len, "{what}: short");
    if io.write {
        let data = s.c.io_buf(slot.buf).expect("slot buffer");
        s.shadow[io.off..io.off + n].copy_from_slice(&data[..n]);
        t.writes += 1;
        t.bytes_written += n as u64;
    } else {
        let data = s.c.io_buf(slot.buf).expect("slot buffer");
        assert!(
            data[..n] == s.shadow[io.off..io.off + n],
            "{what}: the bytes read differ from those written"
        );
        t.reads += 1;
        t.bytes_read += n as u64;
    }
    if io.inline {
        t.inline += 1;
    } else {
        t.rdma += 1;
    }
    s.normalized += normalized_io_size(n as u64, 8192);
    true
}

#[test]
fn soak() {
    let _serial = serial();
    let secs = env_u64("SMBDIRECTD_SOAK_SECS", 60);
    const CONNS: usize = 64;
    const THREADS: usize = 2;
    let common = [
        "--log-level",
        "info",
        "--cores",
        "0,1",
        "--max-connections",
        "80",
        // A fragmented message the daemon reassembles takes a pool buffer
        // of its size until it is answered, and one that finds none ends
        // its connection: room for every connection's (up to 1 MiB)
        // messages in flight, ECHO_DEPTH or two SMB2 requests, in the
        // 1 MiB class (20 % of the pool).
        "--pool-mem",
        "640M",
    ];
    let echo_port = free_port();
    let mut args = common.to_vec();
    args.extend(["--upper", "echo"]);
    let echo = spawn(echo_port, &args);
    let smb_port = free_port();
    let mut args = common.to_vec();
    args.extend(["--upper", "smb2", "--store-size", "1G"]);
    let smb = spawn(smb_port, &args);
    let echo_base = quiet_baseline(&echo);
    let smb_base = quiet_baseline(&smb);

    let stop = Arc::new(AtomicBool::new(false));
    let setup = Instant::now();
    let mut echo_threads = Vec::new();
    let mut smb_threads = Vec::new();
    for i in 0..THREADS {
        let per = CONNS / THREADS;
        let first = (i * per) as u64;
        let st = stop.clone();
        echo_threads.push(std::thread::spawn(move || {
            echo_thread(echo_port, first, per, st)
        }));
        let st = stop.clone();
        smb_threads.push(std::thread::spawn(move || {
            smb_thread(smb_port, 1000 + first, per, st)
        }));
    }
    // Server side, every second: once all connections are up, nothing lost.
    let watch = ServerWatch {
        checks: AtomicU64::new(0),
    };
    let up = |d: &Daemon| field(&stats_json(d), "connections") == CONNS as u64;
    // A thread that ends early has failed: stop, and join to show why.
    let finished = || {
        echo_threads.iter().any(|h| h.is_finished()) || smb_threads.iter().any(|h| h.is_finished())
    };
    let deadline = Instant::now() + Duration::from_secs(300);
    while !(finished() || up(&echo) && up(&smb)) {
        assert!(
            Instant::now() < deadline,
            "the 2 x {CONNS} connections did not come up in 300 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let set_up_in = setup.elapsed();
    let start = Instant::now();
    let fail = |why: String| -> ! {
        panic!(
            "{why}\necho daemon:\n{}\nsmb2 daemon:\n{}",
            daemon_log(&echo),
            daemon_log(&smb)
        )
    };
    while start.elapsed() < Duration::from_secs(secs) && !finished() {
        let checked = watch
            .check("echo", &stats_json(&echo), CONNS as u64)
            .and_then(|_| watch.check("smb2", &stats_json(&smb), CONNS as u64));
        if let Err(why) = checked {
            stop.store(true, Ordering::Relaxed);
            fail(why);
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    stop.store(true, Ordering::Relaxed);
    let ran = start.elapsed();
    let echo_doc = stats_json(&echo);
    let smb_doc = stats_json(&smb);
    let mut e = EchoTotals::default();
    for h in echo_threads {
        let t = h
            .join()
            .unwrap_or_else(|_| fail("an echo client thread failed (see above)".into()));
        e.messages += t.messages;
        e.message_bytes += t.message_bytes;
        e.empty_refused += t.empty_refused;
        e.rdma_echoes += t.rdma_echoes;
        e.rdma_bytes += t.rdma_bytes;
        e.credit_checks += t.credit_checks;
    }
    let mut s = SmbTotals::default();
    for h in smb_threads {
        let t = h
            .join()
            .unwrap_or_else(|_| fail("an SMB2 client thread failed (see above)".into()));
        s.reads += t.reads;
        s.writes += t.writes;
        s.inline += t.inline;
        s.rdma += t.rdma;
        s.bytes_read += t.bytes_read;
        s.bytes_written += t.bytes_written;
        s.credit_checks += t.credit_checks;
        s.smb2_credit_checks += t.smb2_credit_checks;
        s.qos_flows += t.qos_flows;
        s.qos_normalized += t.qos_normalized;
        s.qos_secs += t.qos_secs;
        s.qos_max_rate = s.qos_max_rate.max(t.qos_max_rate);
    }
    if let Err(why) = watch
        .check("echo", &echo_doc, CONNS as u64)
        .and_then(|_| watch.check("smb2", &smb_doc, CONNS as u64))
    {
        fail(why);
    }
    // Every connection gone: the daemons are back to where they started.
    let echo_end = wait_for_stats(
        &echo,
        Duration::from_secs(30),
        "echo back to baseline",
        |d| resources(d) == echo_base,
    );
    let smb_end = wait_for_stats(
        &smb,
        Duration::from_secs(30),
        "smb2 back to baseline",
        |d| resources(d) == smb_base,
    );
    let flows_left = check_flows(&smb, "soak", s.qos_flows);
    let gb = |b: u64| b as f64 / 1e9;
    figure!(
        "soak: {:.0} s ({} connections set up in {:.1} s) against two daemons of 2 workers, {CONNS} connections each",
        ran.as_secs_f64(),
        2 * CONNS,
        set_up_in.as_secs_f64()
    );
    figure!(
        "soak: echo: {} messages ({:.2} GB) echoed and verified, {} empty sends refused locally, {} RDMA echoes ({:.2} GB) verified",
        e.messages,
        gb(e.message_bytes),
        e.empty_refused,
        e.rdma_echoes,
        gb(e.rdma_bytes)
    );
    figure!(
        "soak: smb2: {} READs ({:.2} GB) verified against the shadow files, {} WRITEs ({:.2} GB); {} inline, {} through RDMA",
        s.reads,
        gb(s.bytes_read),
        s.writes,
        gb(s.bytes_written),
        s.inline,
        s.rdma
    );
    figure!(
        "soak: Storage QoS: {} flows limited to {QOS_LIMIT} normalized IOPS got {:.0} on average, {:.0} at most; {flows_left} flows left in retention at the end",
        s.qos_flows,
        s.qos_normalized as f64 / s.qos_secs.max(1e-9),
        s.qos_max_rate
    );
    figure!(
        "soak: credit invariants: {} SMB Direct checks (echo {}, smb2 {}), {} SMB2 credit-window checks, {} server stats checks",
        e.credit_checks + s.credit_checks,
        e.credit_checks,
        s.credit_checks,
        s.smb2_credit_checks,
        watch.checks.load(Ordering::Relaxed)
    );
    figure!(
        "soak: echo daemon at the end: {}; at the start: {}",
        show(&resources(&echo_end)),
        show(&echo_base)
    );
    figure!(
        "soak: smb2 daemon at the end: {}; at the start: {}",
        show(&resources(&smb_end)),
        show(&smb_base)
    );
    assert!(e.messages > 0 && e.rdma_echoes > 0 && s.reads > 0 && s.writes > 0);
    terminate(echo);
    terminate(smb);
}

// ---------------------------------------------------------------------------
// Churn

/// Storage QoS flow ids the churn's clients associate their files with (a
/// few, reused: each association finds its flow again).
const CHURN_FLOWS: u64 = 8;

#[derive(Default, Debug, Clone, Copy)]
struct ChurnTotals {
    cycles: u64,
    smbd_only: u64,
    graceful: u64,
    abrupt: u64,
    qos: u64,
    bytes_verified: u64,
}

/// The daemon process's open files (what each fd points to) and memory
/// mappings (address range and what is mapped), sorted.
fn proc_resources(pid: u32) -> (Vec<String>, Vec<String>) {
    let mut fds: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("/proc/PID/fd")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|p| p.display().to_string())
        .collect();
    fds.sort();
    let mut maps: Vec<String> = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .expect("/proc/PID/maps")
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // Named mappings only: memfd pools (ours and the peers'),
            // hugetlbfs, files. Anonymous ones are left out: glibc reserves
            // a 64 MiB arena the first time a thread allocates under
            // contention, whenever that happens, and keeps it.
            let name = f.get(5).copied().filter(|n| !n.starts_with('['))?;
            Some(format!("{} {name}", f[0]))
        })
        .collect();
    maps.sort();
    (fds, maps)
}

/// Descriptors that can leak per connection: all but pidfds, which the
/// soft provider's watchdog holds one of per peer process it watches.
fn per_connection_fds(fds: &[String]) -> Vec<String> {
    fds.iter()
        .filter(|f| !f.contains("[pidfd]"))
        .cloned()
        .collect()
}

fn pidfds(fds: &[String]) -> usize {
    fds.len() - per_connection_fds(fds).len()
}

/// What `now` has that `then` has not.
fn added(then: &[String], now: &[String]) -> Vec<String> {
    now.iter().filter(|x| !then.contains(x)).cloned().collect()
}

fn churn_thread(port: u16, thread: u64, cycles: u64) -> ChurnTotals {
    let provider = SoftProvider::new().unwrap();
    let (pool, mr) = registered_pool(
        &provider,
        1,
        &[
            ("send", 1364, 64),
            ("receive", 8192, 40),
            ("m64k", 65536, 6),
            ("m1m", 1 << 20, 2),
        ],
    );
    let noise = Noise::new(thread);
    let mut rng = Rng(thread ^ 0xc4u64 << 32);
    let mut t = ChurnTotals::default();
    let mut alloc = Some(pool.claim_slice(0).unwrap());
    let dialects = [Dialect::SMB_3_0, Dialect::SMB_3_0_2, Dialect::SMB_3_1_1];
    for cycle in 0..cycles {
        let what = format!("churn thread {thread} cycle {cycle}");
        let c = Client::connect(
            &provider,
            addr(port),
            cfg(),
            alloc.take().unwrap(),
            mr,
            Duration::from_secs(30),
        )
        .unwrap_or_else(|e| panic!("{what}: connect: {e}"));
        check_credits(&c).unwrap_or_else(|why| panic!("{what}: {why}"));
        t.cycles += 1;
        if rng.chance(10) {
            // SMB Direct negotiated, no SMB2: gone at once.
            t.smbd_only += 1;
            alloc = Some(c.close(Duration::from_secs(5)));
            continue;
        }
        let mut c = Smb2Client::from_client(c, "127.0.0.1".into(), Smb2ClientOptions::default());
        let dialect = dialects[rng.below(3) as usize];
        c.negotiate(&[dialect])
            .unwrap_or_else(|e| panic!("{what}: negotiate: {e}"));
        c.session_setup_anonymous()
            .unwrap_or_else(|e| panic!("{what}: session setup: {e}"));
        c.tree_connect("data")
            .unwrap_or_else(|e| panic!("{what}: tree connect: {e}"));
        let fid = c
            .create(
                &format!("churn-{thread}.bin"),
                CreateDisposition::OPEN_IF,
                CreateOptions::NON_DIRECTORY_FILE,
            )
            .unwrap_or_else(|e| panic!("{what}: create: {e}"))
            .file_id;
        if rng.chance(4) {
            let mut g = [0xc4; 16];
            g[..8].copy_from_slice(&rng.below(CHURN_FLOWS).to_le_bytes());
            let mut flow = LogicalFlow::new(Guid::from_bytes(g), QosDialect::V1_0);
            let now = c.now();
            let policy = PolicyParams {
                limit: 100_000,
                ..PolicyParams::default()
            };
            c.qos_set_policy(fid, &mut flow, policy, now)
                .unwrap_or_else(|e| panic!("{what}: SET_POLICY: {e}"));
            t.qos += 1;
        }
        if rng.chance(5) {
            // Abrupt: the server is RDMA-reading 1 MiB from us, RDMA-writing
            // 256 KiB to us and reassembling a 60 KiB message when the
            // connection goes; no CLOSE, no LOGOFF.
            t.abrupt += 1;
            let big = c.alloc_io_buf(1 << 20).expect("I/O buffer");
            let mid = c.alloc_io_buf(256 << 10).expect("I/O buffer");
            let rdma = Transfer::Rdma {
                descriptors: 2,
                invalidate: false,
            };
            let _ = c.submit_write(fid, 0, 1 << 20, big, rdma);
            let _ = c.submit_read(fid, 0, 256 << 10, mid, rdma);
            let _ = c.submit_write(fid, 0, 60 << 10, mid, Transfer::Inline);
            for _ in 0..rng.below(50) {
                let _ = c.poll(Duration::ZERO);
            }
            alloc = Some(c.disconnect(Duration::from_secs(5)));
            continue;
        }
        // Graceful: a verified inline and a verified RDMA round trip.
        t.graceful += 1;
        let key = thread << 40 | cycle;
        for (len, transfer) in [
            (4096, Transfer::Inline),
            (
                64 << 10,
                Transfer::Rdma {
                    descriptors: 2,
                    invalidate: dialect != Dialect::SMB_3_0 && rng.chance(2),
                },
            ),
        ] {
            let off = rng.below(1 << 20);
            let data = noise.bytes(key ^ len as u64, len);
            let n = c
                .write(fid, off, data, transfer)
                .unwrap_or_else(|e| panic!("{what}: write: {e}"));
            assert_eq!(n as usize, len, "{what}: short write");
            let back = c
                .read(fid, off, len as u32, transfer)
                .unwrap_or_else(|e| panic!("{what}: read: {e}"));
            assert!(back == data, "{what}: read back differs from write");
            t.bytes_verified += len as u64;
        }
        check_credits(c.client()).unwrap_or_else(|why| panic!("{what}: {why}"));
        c.close(fid)
            .unwrap_or_else(|e| panic!("{what}: close: {e}"));
        if rng.chance(2) {
            c.tree_disconnect()
                .unwrap_or_else(|e| panic!("{what}: tree disconnect: {e}"));
            c.logoff().unwrap_or_else(|e| panic!("{what}: logoff: {e}"));
        }
        alloc = Some(c.disconnect(Duration::from_secs(5)));
    }
    let s = provider.stats();
    assert_eq!(s.rnr_errors, 0, "churn client sent without a credit: {s:?}");
    t
}

#[test]
fn churn() {
    let _serial = serial();
    let cycles = env_u64("SMBDIRECTD_CHURN_CYCLES", 10_000);
    const THREADS: u64 = 4;
    let port = free_port();
    // A small pool: every connect maps the peer's registered memory
    // (pre-faulted) on both sides.
    let d = spawn(
        port,
        &[
            "--upper",
            "smb2",
            "--cores",
            "0,1",
            "--pool-mem",
            "16M",
            "--max-read-write-size",
            "1048576",
            "--store-size",
            "64M",
            // Unreferenced flows go 2 s after their last Open (not 60 s), so
            // the flow table too must come back to where it started.
            "--qos-flow-retention",
            "2",
        ],
    );
    let pid = d.child.id();
    let base = quiet_baseline(&d);
    // The process's files and mappings after a warm-up of every kind of
    // cycle: the first peer process's connections start threads (their
    // stacks and malloc arenas) and a watch on that process (a pidfd)
    // that stay for the daemon's life, not per connection.
    let warm: Vec<_> = (0..THREADS)
        .map(|i| std::thread::spawn(move || churn_thread(port, 100 + i, 20)))
        .collect();
    for h in warm {
        h.join().expect("a warm-up churn thread failed (see above)");
    }
    wait_for_stats(&d, Duration::from_secs(60), "warm-up done", |doc| {
        resources(doc) == base
    });
    let (base_fds, base_maps) = proc_resources(pid);
    let base_doc = stats_json(&d);
    let start = Instant::now();
    let threads: Vec<_> = (0..THREADS)
        .map(|i| {
            let n = cycles / THREADS + u64::from(i < cycles % THREADS);
            std::thread::spawn(move || churn_thread(port, i, n))
        })
        .collect();
    let mut t = ChurnTotals::default();
    for h in threads {
        let r = h.join().unwrap_or_else(|_| {
            panic!(
                "a churn thread failed (see above); daemon:\n{}",
                daemon_log(&d)
            )
        });
        t.cycles += r.cycles;
        t.smbd_only += r.smbd_only;
        t.graceful += r.graceful;
        t.abrupt += r.abrupt;
        t.qos += r.qos;
        t.bytes_verified += r.bytes_verified;
    }
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(t.cycles, cycles);
    let end = wait_for_stats(&d, Duration::from_secs(60), "back to baseline", |doc| {
        resources(doc) == base
    });
    let flows = check_flows(&d, "churn", CHURN_FLOWS);
    wait_for_stats(
        &d,
        Duration::from_secs(30),
        "every Storage QoS flow removed after its 2 s retention",
        |doc| field(doc, "flows") == 0 && field(doc, "qos_opens") == 0,
    );
    figure!(
        "churn: every Storage QoS flow removed 2 s after its last Open (--qos-flow-retention 2)"
    );
    let accepted = field(&end, "accepted") - field(&base_doc, "accepted");
    assert_eq!(accepted, cycles, "every cycle's connection admitted: {end}");
    for key in ["rejected", "negotiate_failures", "protocol_errors", "rnr"] {
        assert_eq!(field(&end, key), 0, "{key}: {end}");
    }
    // The process itself: no file descriptor (memfds passed by peers) or
    // mapping (their pools) left behind.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (fds, maps) = loop {
        let now = proc_resources(pid);
        let settled = per_connection_fds(&now.0).len() <= per_connection_fds(&base_fds).len()
            && pidfds(&now.0) <= pidfds(&base_fds) + 1
            && now.1.len() <= base_maps.len();
        if settled || Instant::now() > deadline {
            break now;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    figure!(
        "churn: {} connections cycled in {secs:.1} s by {THREADS} clients: {} SMB Direct only, {} graceful ({:.1} MB verified), {} abrupt mid-transfer; {} associated to one of {CHURN_FLOWS} Storage QoS flows",
        t.cycles,
        t.smbd_only,
        t.graceful,
        t.bytes_verified as f64 / 1e6,
        t.abrupt,
        t.qos
    );
    figure!("churn: daemon at the start: {}", show(&base));
    figure!("churn: (open fds and mappings counted from after 80 warm-up cycles)");
    figure!("churn: daemon at the end:   {}", show(&resources(&end)));
    figure!(
        "churn: daemon process: {} open fds (start {}), {} named mappings (start {}); {flows} flows in retention, {} rdma errors, {} peers lost",
        fds.len(),
        base_fds.len(),
        maps.len(),
        base_maps.len(),
        field(&end, "rdma_errors"),
        field(&end, "peers_lost")
    );
    assert!(
        per_connection_fds(&fds).len() <= per_connection_fds(&base_fds).len()
            && pidfds(&fds) <= pidfds(&base_fds) + 1
            && maps.len() <= base_maps.len(),
        "the daemon kept file descriptors {:?} or mappings {:?}",
        added(&base_fds, &fds),
        added(&base_maps, &maps)
    );
    terminate(d);
}
