//! RDMA Read/Write through granted Buffer Descriptor V1 arrays, end to end:
//! `smbdirectd serve --provider soft --upper echo` as a real child process,
//! clients in this process granting the server access to their own pool
//! memory and sending the echo upper layer's RDMA echo request (format in
//! `dataplane/src/upper.rs`): the server RDMA-reads the bytes from the read
//! descriptors and RDMA-writes them to the write descriptors before it
//! replies ([MS-SMBD] 3.1.4.5, 3.1.4.6, 4.4, 4.5).
//!
//! Tests that start servers run one at a time (a static lock): the machine
//! these run on may have two cores.

mod common;
use common::*;

use smbdirect_dataplane::client::{buffer_descriptor, client_caps, Client, ClientError};
use smbdirect_dataplane::provider::soft::SoftProvider;
use smbdirect_dataplane::provider::{Access, Grant, MemoryRegion, Provider, QpCaps};
use smbdirect_dataplane::upper::{parse_rdma_done, rdma_echo_request, RDMA_ECHO_INVALIDATE};
use smbdirect_hugepages::{Backing, BufId, BufferPool, PoolConfig, SizeClass};
use smbdirect_protocol::ntstatus::{NtStatus, STATUS_INVALID_PARAMETER, STATUS_SUCCESS};
use smbdirect_protocol::smbd::SmbdConfig;
use std::time::{Duration, Instant};

// ---- the daemon (helpers as in serve_e2e.rs) --------------------------------

/// (class name, free buffers) of every pool class in a stats document.
fn pool_free(doc: &str) -> Vec<(String, u64)> {
    let mut v = Vec::new();
    let mut rest = doc;
    while let Some(i) = rest.find("\"buf_size\":") {
        let name_at = rest[..i].rfind("\"name\":\"").expect("class name") + 8;
        let name = rest[name_at..].split('"').next().unwrap().to_string();
        rest = &rest[i..];
        v.push((name, field(rest, "free")));
        rest = &rest[10..];
    }
    assert!(v.len() >= 3, "{doc}");
    v
}

// ---- the client side --------------------------------------------------------

/// A client pool of `slices` slices (one per connection), each with two
/// 8 MiB and two 1 MiB data buffers besides the receive and send buffers.
fn client_pool(provider: &SoftProvider, slices: usize) -> (BufferPool, MemoryRegion) {
    let pool = PoolConfig::new(slices * (24 << 20), slices)
        .class(SizeClass::new("receive", 8192).per_slice(64))
        .class(SizeClass::new("send", 1364).per_slice(128))
        .class(SizeClass::new("mid", 1 << 20).per_slice(2))
        .class(SizeClass::new("big", 8 << 20).per_slice(2))
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

fn connect(
    provider: &SoftProvider,
    port: u16,
    pool: &BufferPool,
    mr: MemoryRegion,
    slice: usize,
    caps: Option<QpCaps>,
) -> Client<SoftProvider> {
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let caps = caps.unwrap_or_else(|| client_caps(&cfg()));
    Client::connect_with_caps(
        provider,
        addr,
        cfg(),
        pool.claim_slice(slice).unwrap(),
        mr,
        Duration::from_secs(10),
        caps,
    )
    .expect("connect and negotiate")
}

/// Splits `len` bytes into `n` (non-empty, unequal) pieces.
fn pieces(len: usize, n: usize) -> Vec<usize> {
    let n = n.min(len).max(1);
    let mut v: Vec<usize> = (0..n).map(|i| (len / n) + (i % 3)).collect();
    let sum: usize = v.iter().sum();
    // Keep the total exact: adjust the last piece (never below 1 byte).
    if sum > len {
        let over = sum - len;
        let mut left = over;
        for p in v.iter_mut().rev() {
            let take = left.min(*p - 1);
            *p -= take;
            left -= take;
        }
    } else {
        *v.last_mut().unwrap() += len - sum;
    }
    assert_eq!(v.iter().sum::<usize>(), len);
    v
}

/// Grants `sizes` consecutive ranges of `buf` from offset 0.
fn grant_ranges(
    c: &mut Client<SoftProvider>,
    buf: BufId,
    sizes: &[usize],
    access: Access,
) -> Vec<Grant> {
    let mut off = 0;
    sizes
        .iter()
        .map(|&s| {
            let g = c.grant(buf, off, s, access).expect("grant");
            off += s;
            g
        })
        .collect()
}

fn wire(grants: &[Grant]) -> Vec<[u8; 16]> {
    grants
        .iter()
        .map(|g| buffer_descriptor(g).to_bytes())
        .collect()
}

/// Sends an RDMA echo request and waits for its reply: (status, length,
/// invalidated token).
fn rdma_echo(
    c: &mut Client<SoftProvider>,
    len: u32,
    read: &[[u8; 16]],
    write: &[[u8; 16]],
    flags: u32,
) -> Result<(NtStatus, u32, Option<u32>), ClientError> {
    c.send(&rdma_echo_request(len, read, write, flags))?;
    c.recv_with_token(Duration::from_secs(60), |m, token| {
        let (status, len) = parse_rdma_done(m).expect("an RDMADONE reply");
        (status, len, token)
    })
}

/// Deterministic test bytes.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

const SLACK: usize = 64;

/// One verified RDMA echo of `len` bytes through `n` read and `n` write
/// descriptors: the server reads the client's source buffer and writes the
/// bytes into the destination buffer, whose bytes past `len` (granted too)
/// stay untouched.
fn verified_echo(
    c: &mut Client<SoftProvider>,
    src: BufId,
    dst: BufId,
    len: usize,
    n: usize,
    seed: u64,
) {
    let data = pattern(len, seed);
    assert!(c.write_buffer(src, 0, &data));
    assert!(c.write_buffer(dst, 0, &vec![0x5a; len + SLACK]));
    let reads = grant_ranges(c, src, &pieces(len, n), Access::RemoteRead);
    let mut wsizes = pieces(len, n);
    *wsizes.last_mut().unwrap() += SLACK;
    let writes = grant_ranges(c, dst, &wsizes, Access::RemoteWrite);
    let (status, moved, token) =
        rdma_echo(c, len as u32, &wire(&reads), &wire(&writes), 0).expect("RDMA echo");
    assert_eq!(status, STATUS_SUCCESS, "{len} B x {n} descriptors");
    assert_eq!(moved as usize, len);
    assert_eq!(token, None);
    let mut back = vec![0u8; len + SLACK];
    assert!(c.read_buffer(dst, 0, &mut back));
    assert!(
        back[..len] == data[..],
        "{len} B through {n} descriptors: data differs"
    );
    assert!(
        back[len..].iter().all(|&b| b == 0x5a),
        "bytes past the transfer were written"
    );
    for g in reads.iter().chain(&writes) {
        c.revoke(g.rkey).expect("revoke");
    }
}

// ---- tests ------------------------------------------------------------------

#[test]
fn rdma_echo_moves_1_byte_to_8_mib_through_1_2_and_16_descriptors_byte_for_byte() {
    let _serial = serial();
    let port = free_port();
    let d = spawn(port, &[]);
    let provider = SoftProvider::new().unwrap();
    let (pool, mr) = client_pool(&provider, 1);
    let mut c = connect(&provider, port, &pool, mr, 0, None);
    let src = c.alloc_buffer(8 << 20).unwrap();
    let dst = c.alloc_buffer(8 << 20).unwrap();
    assert_eq!(c.buffer_len(dst), 8 << 20);
    let t0 = Instant::now();
    let mut echoes = 0;
    let mut bytes = 0;
    for &len in &[
        1usize,
        17,
        4096,
        65_536,
        100_003,
        1 << 20,
        (8 << 20) - SLACK,
    ] {
        for &n in &[1usize, 2, 16] {
            let t = Instant::now();
            verified_echo(&mut c, src, dst, len, n, (len * 31 + n) as u64);
            echoes += 1;
            bytes += len;
            if len >= 1 << 20 {
                eprintln!("{len} B x {n} descriptors: {:?}", t.elapsed());
            }
        }
    }
    eprintln!(
        "{echoes} RDMA echoes, {bytes} bytes read and written, in {:?}",
        t0.elapsed()
    );
    // Every byte moved shows in the daemon's RDMA counters (a Write's
    // completion can be counted just after its reply reached us: wait).
    let doc = wait_for_stats(
        &d,
        Duration::from_secs(20),
        "the RDMA byte counters",
        |doc| field(doc, "rdma_write_bytes") >= bytes as u64,
    );
    assert_eq!(field(&doc, "rdma_errors"), 0, "{doc}");
    assert_eq!(field(&doc, "connections"), 1, "{doc}");
    assert_eq!(field(&doc, "rdma_read_bytes"), bytes as u64, "{doc}");
    assert_eq!(field(&doc, "rdma_write_bytes"), bytes as u64, "{doc}");
    // at least one doorbell for each echo's Reads and one for its Writes
    assert!(field(&doc, "rdma_posts") >= 2 * echoes, "{doc}");
    assert!(field(&doc, "replies_chained") <= echoes, "{doc}");
    let _ = c.close(Duration::from_secs(2));
    terminate(d);
}

#[test]
fn rdma_echo_of_exactly_max_read_write_size_8_mib_works_and_one_byte_more_is_refused() {
    let _serial = serial();
    let port = free_port();
    let d = spawn(port, &[]);
    let provider = SoftProvider::new().unwrap();
    let (pool, mr) = client_pool(&provider, 1);
    let mut c = connect(&provider, port, &pool, mr, 0, None);
    assert_eq!(
        c.connection().params().max_read_write_size,
        8 << 20,
        "the server's --max-read-write-size defaults to 8 MiB"
    );
    let src = c.alloc_buffer(8 << 20).unwrap();
    let dst = c.alloc_buffer(8 << 20).unwrap();
    let t = Instant::now();
    verified_echo_exact(&mut c, src, dst, 8 << 20);
    eprintln!("8 MiB x 16 descriptors, both ways: {:?}", t.elapsed());
    // One byte more than Connection.MaxReadWriteSize: refused, not attempted.
    let r = c.grant(src, 0, 8 << 20, Access::RemoteRead).unwrap();
    let big = smbdirect_protocol::smbd::wire::BufferDescriptorRepr {
        length: (8 << 20) + 1,
        ..buffer_descriptor(&r)
    }
    .to_bytes();
    let (status, moved, _) = rdma_echo(&mut c, (8 << 20) + 1, &[big], &[big], 0).unwrap();
    assert_eq!((status, moved), (STATUS_INVALID_PARAMETER, 0));
    c.revoke(r.rkey).unwrap();
    let doc = stats_json(&d);
    assert_eq!(field(&doc, "rdma_errors"), 0, "{doc}");
    let _ = c.close(Duration::from_secs(2));
    terminate(d);
}

/// An echo of the whole 8 MiB buffer (no slack past it) through 16
/// descriptors each way.
fn verified_echo_exact(c: &mut Client<SoftProvider>, src: BufId, dst: BufId, len: usize) {
    let data = pattern(len, 8);
    assert!(c.write_buffer(src, 0, &data));
    assert!(c.write_buffer(dst, 0, &vec![0; len]));
    let reads = grant_ranges(c, src, &pieces(len, 16), Access::RemoteRead);
    let writes = grant_ranges(c, dst, &pieces(len, 16), Access::RemoteWrite);
    let (status, moved, _) = rdma_echo(c, len as u32, &wire(&reads), &wire(&writes), 0).unwrap();
    assert_eq!((status, moved as usize), (STATUS_SUCCESS, len));
    let mut back = vec![0u8; len];
    assert!(c.read_buffer(dst, 0, &mut back));
    assert!(back == data, "8 MiB echo differs");
    for g in reads.iter().chain(&writes) {
        c.revoke(g.rkey).unwrap();
    }
}

#[test]
fn rdma_reads_beyond_a_small_ord_are_queued_and_every_byte_still_arrives() {
    let _serial = serial();
    let port = free_port();
    let d = spawn(port, &[]);
    let provider = SoftProvider::new().unwrap();
    let (pool, mr) = client_pool(&provider, 1);
    // Our IRD 2 bounds the server's ORD to 2 ([MS-SMBD] Appendix A): its
    // 16-segment reads go out two at a time.
    let caps = QpCaps {
        ird: 2,
        ..client_caps(&cfg())
    };
    let mut c = connect(&provider, port, &pool, mr, 0, Some(caps));
    let src = c.alloc_buffer(8 << 20).unwrap();
    let dst = c.alloc_buffer(8 << 20).unwrap();
    for &len in &[16usize, 65_536, 1 << 20] {
        verified_echo(&mut c, src, dst, len, 16, len as u64);
    }
    let _ = c.close(Duration::from_secs(2));
    terminate(d);
}

/// `--queue-depth 2` gives each connection a table of two RDMA operations.
/// Eight echoes sent at once fill it: the requests beyond it wait in order
/// until a transfer finishes (`rdma_table_waits`), instead of being handed
/// to the upper layer, refused (RdmaBusy) and retried on every turn of the
/// worker's loop, which counted a pool stall per retry. Every echo's bytes
/// arrive, and its reply comes in request order.
#[test]
fn requests_beyond_the_rdma_table_wait_for_a_slot_and_are_not_retried() {
    let _serial = serial();
    let port = free_port();
    let d = spawn(port, &["--queue-depth", "2"]);
    let provider = SoftProvider::new().unwrap();
    let (pool, mr) = client_pool(&provider, 1);
    let mut c = connect(&provider, port, &pool, mr, 0, None);
    let src = c.alloc_buffer(8 << 20).unwrap();
    let dst = c.alloc_buffer(8 << 20).unwrap();
    const N: usize = 8;
    const LEN: usize = 512 << 10;
    let mut grants = Vec::new();
    for i in 0..N {
        let data = pattern(LEN, 100 + i as u64);
        assert!(c.write_buffer(src, i << 20, &data));
        assert!(c.write_buffer(dst, i << 20, &vec![0x5a; LEN]));
        let r = c.grant(src, i << 20, LEN, Access::RemoteRead).unwrap();
        let w = c.grant(dst, i << 20, LEN, Access::RemoteWrite).unwrap();
        grants.push((r, w));
    }
    for (i, (r, w)) in grants.iter().enumerate() {
        // the length tells the replies apart: they must come in order
        let len = (LEN - i) as u32;
        c.send(&rdma_echo_request(len, &wire(&[*r]), &wire(&[*w]), 0))
            .expect("send");
    }
    for i in 0..N {
        let (status, moved) = c
            .recv_with(Duration::from_secs(60), |m| {
                parse_rdma_done(m).expect("an RDMADONE reply")
            })
            .expect("reply");
        assert_eq!(
            (status, moved as usize),
            (STATUS_SUCCESS, LEN - i),
            "echo {i}"
        );
        let mut back = vec![0u8; LEN];
        assert!(c.read_buffer(dst, i << 20, &mut back));
        let want = pattern(LEN, 100 + i as u64);
        assert!(back[..LEN - i] == want[..LEN - i], "echo {i}: data differs");
        assert!(
            back[LEN - i..].iter().all(|&b| b == 0x5a),
            "echo {i}: wrote past its length"
        );
    }
    let doc = stats_json(&d);
    assert!(
        field(&doc, "rdma_table_waits") >= 1,
        "eight echoes against a table of two never waited: {doc}"
    );
    assert_eq!(field(&doc, "pool_stalls"), 0, "{doc}");
    assert_eq!(field(&doc, "rdma_errors"), 0, "{doc}");
    for (r, w) in grants {
        c.revoke(r.rkey).unwrap();
        c.revoke(w.rkey).unwrap();
    }
    let _ = c.close(Duration::from_secs(2));
    terminate(d);
}

#[test]
fn malformed_rdma_requests_are_answered_invalid_parameter_and_the_connection_stays_up() {
    let _serial = serial();
    let port = free_port();
    let d = spawn(port, &[]);
    let provider = SoftProvider::new().unwrap();
    let (pool, mr) = client_pool(&provider, 1);
    let mut c = connect(&provider, port, &pool, mr, 0, None);
    let src = c.alloc_buffer(1 << 20).unwrap();
    let dst = c.alloc_buffer(1 << 20).unwrap();
    let r = c.grant(src, 0, 4096, Access::RemoteRead).unwrap();
    let w = c.grant(dst, 0, 4096, Access::RemoteWrite).unwrap();
    let (rd, wd) = (buffer_descriptor(&r), buffer_descriptor(&w));
    let zero_len = smbdirect_protocol::smbd::wire::BufferDescriptorRepr { length: 0, ..rd };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "zero-length descriptor",
            rdma_echo_request(10, &[zero_len.to_bytes()], &[wd.to_bytes()], 0),
        ),
        (
            "length past the read descriptors",
            rdma_echo_request(4097, &[rd.to_bytes()], &[wd.to_bytes()], 0),
        ),
        (
            "length past the write descriptors",
            rdma_echo_request(4097, &[rd.to_bytes(), rd.to_bytes()], &[wd.to_bytes()], 0),
        ),
        (
            "zero length",
            rdma_echo_request(0, &[rd.to_bytes()], &[wd.to_bytes()], 0),
        ),
        (
            "no read descriptor",
            rdma_echo_request(10, &[], &[wd.to_bytes()], 0),
        ),
        ("descriptor count past the message", {
            let mut m = rdma_echo_request(10, &[rd.to_bytes()], &[wd.to_bytes()], 0);
            m[12] = 9;
            m
        }),
        ("truncated header", b"RDMAECHO\x01\x00".to_vec()),
    ];
    for (what, msg) in &cases {
        c.send(msg).unwrap();
        let reply = c
            .recv_with(Duration::from_secs(10), parse_rdma_done)
            .unwrap();
        assert_eq!(reply, Some((STATUS_INVALID_PARAMETER, 0)), "{what}");
    }
    // The connection is fine: a good request and a plain echo work.
    let data = pattern(4096, 5);
    assert!(c.write_buffer(src, 0, &data));
    let (status, moved, _) =
        rdma_echo(&mut c, 4096, &[rd.to_bytes()], &[wd.to_bytes()], 0).unwrap();
    assert_eq!((status, moved), (STATUS_SUCCESS, 4096));
    let mut back = vec![0; 4096];
    assert!(c.read_buffer(dst, 0, &mut back));
    assert_eq!(back, data);
    c.send(b"plain echo").unwrap();
    assert!(c
        .recv_with(Duration::from_secs(5), |m| m == b"plain echo")
        .unwrap());
    let doc = stats_json(&d);
    assert_eq!(field(&doc, "rdma_errors"), 0, "{doc}");
    assert_eq!(field(&doc, "connections"), 1, "{doc}");
    let _ = c.close(Duration::from_secs(2));
    terminate(d);
}

/// Waits until the connection ends (the client sees its queue pair fail).
fn wait_for_end(c: &mut Client<SoftProvider>, what: &str) -> ClientError {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match c.step(&mut |m, _| panic!("{what}: unexpected message {m:?}")) {
            Err(e) => return e,
            Ok(_) => assert!(
                Instant::now() < deadline,
                "{what}: connection not terminated"
            ),
        }
    }
}

#[test]
fn send_with_invalidate_reply_names_the_first_write_token_and_that_grant_is_dead() {
    let _serial = serial();
    let port = free_port();
    let d = spawn(port, &[]);
    let provider = SoftProvider::new().unwrap();
    let (pool, mr) = client_pool(&provider, 1);
    let mut c = connect(&provider, port, &pool, mr, 0, None);
    let src = c.alloc_buffer(1 << 20).unwrap();
    let dst = c.alloc_buffer(1 << 20).unwrap();
    let len = 100_000;
    let data = pattern(len, 77);
    assert!(c.write_buffer(src, 0, &data));
    let reads = grant_ranges(&mut c, src, &pieces(len, 2), Access::RemoteRead);
    let writes = grant_ranges(&mut c, dst, &pieces(len, 2), Access::RemoteWrite);
    let (status, moved, token) = rdma_echo(
        &mut c,
        len as u32,
        &wire(&reads),
        &wire(&writes),
        RDMA_ECHO_INVALIDATE,
    )
    .unwrap();
    assert_eq!((status, moved as usize), (STATUS_SUCCESS, len));
    assert_eq!(
        token,
        Some(writes[0].rkey),
        "the reply invalidates the first write descriptor's token"
    );
    let mut back = vec![0; len];
    assert!(c.read_buffer(dst, 0, &mut back));
    assert!(back == data);
    // The second write grant was not invalidated: still usable.
    let second = pieces(len, 2)[1];
    let (status, moved, token) = rdma_echo(
        &mut c,
        second as u32,
        &wire(&reads[1..]),
        &wire(&writes[1..]),
        0,
    )
    .unwrap();
    assert_eq!(
        (status, moved as usize, token),
        (STATUS_SUCCESS, second, None)
    );
    // A later RDMA through the invalidated token fails at the provider: the
    // server's RDMA Write is refused and this connection ends.
    c.send(&rdma_echo_request(
        10,
        &wire(&reads[..1]),
        &wire(&writes[..1]),
        0,
    ))
    .unwrap();
    let e = wait_for_end(&mut c, "RDMA Write through an invalidated token");
    eprintln!("client saw: {e}");
    let doc = stats_json(&d);
    assert_eq!(field(&doc, "rdma_errors"), 1, "{doc}");
    let _ = c.close(Duration::from_secs(2));
    let (_, err) = terminate(d);
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("RemoteAccessError"))
        .collect();
    assert_eq!(lines.len(), 1, "{err}");
}

#[test]
fn bad_or_revoked_token_ends_only_that_connection_and_every_buffer_comes_back() {
    let _serial = serial();
    let port = free_port();
    let d = spawn(port, &[]);
    // Baseline: the pool before any connection (the worker's receive loans
    // are out already; wait until two readings agree).
    let mut baseline = pool_free(&stats_json(&d));
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(20));
        let now = pool_free(&stats_json(&d));
        if now == baseline {
            break;
        }
        baseline = now;
    }
    let provider = SoftProvider::new().unwrap();
    let (pool, mr) = client_pool(&provider, 3);
    let mut healthy = connect(&provider, port, &pool, mr, 0, None);
    let hsrc = healthy.alloc_buffer(1 << 20).unwrap();
    let hdst = healthy.alloc_buffer(1 << 20).unwrap();
    verified_echo(&mut healthy, hsrc, hdst, 200_000, 2, 1);

    // A read descriptor whose token was never granted.
    let mut bad = connect(&provider, port, &pool, mr, 1, None);
    let bsrc = bad.alloc_buffer(1 << 20).unwrap();
    let bdst = bad.alloc_buffer(1 << 20).unwrap();
    let r = bad.grant(bsrc, 0, 8192, Access::RemoteRead).unwrap();
    let w = bad.grant(bdst, 0, 8192, Access::RemoteWrite).unwrap();
    let mut wrong = buffer_descriptor(&r);
    wrong.token ^= 0x5555_0000;
    bad.send(&rdma_echo_request(
        8192,
        &[
            smbdirect_protocol::smbd::wire::BufferDescriptorRepr {
                length: 4096,
                ..buffer_descriptor(&r)
            }
            .to_bytes(),
            wrong.to_bytes(),
        ],
        &[buffer_descriptor(&w).to_bytes()],
        0,
    ))
    .unwrap();
    let e = wait_for_end(&mut bad, "wrong read token");
    eprintln!("client with a wrong read token saw: {e}");
    verified_echo(&mut healthy, hsrc, hdst, 65_536, 16, 2);

    // A write descriptor whose grant was revoked before the request.
    let mut revoked = connect(&provider, port, &pool, mr, 2, None);
    let rsrc = revoked.alloc_buffer(1 << 20).unwrap();
    let rdst = revoked.alloc_buffer(1 << 20).unwrap();
    let r = revoked.grant(rsrc, 0, 4096, Access::RemoteRead).unwrap();
    let w = revoked.grant(rdst, 0, 4096, Access::RemoteWrite).unwrap();
    revoked.revoke(w.rkey).unwrap();
    revoked
        .send(&rdma_echo_request(
            4096,
            &wire(&[r]),
            &wire(&[w]),
            RDMA_ECHO_INVALIDATE,
        ))
        .unwrap();
    let e = wait_for_end(&mut revoked, "revoked write token");
    eprintln!("client with a revoked write token saw: {e}");
    verified_echo(&mut healthy, hsrc, hdst, (1 << 20) - SLACK, 16, 3);

    // The server counted both, kept the healthy connection, and once every
    // connection is gone every buffer is back.
    // The client sees its connection end before the worker has finished
    // closing it (and counted why): wait for the daemon's counts.
    let doc = wait_for_stats(
        &d,
        Duration::from_secs(20),
        "both broken connections closed and counted",
        |doc| field(doc, "connections") == 1 && field(doc, "rdma_errors") >= 2,
    );
    assert_eq!(field(&doc, "rdma_errors"), 2, "{doc}");
    assert_eq!(field(&doc, "connections"), 1, "{doc}");
    let _ = bad.close(Duration::from_secs(2));
    let _ = revoked.close(Duration::from_secs(2));
    let _ = healthy.close(Duration::from_secs(2));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let doc = stats_json(&d);
        if field(&doc, "connections") == 0 && pool_free(&doc) == baseline {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "pool not back to baseline {baseline:?}: {doc}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (out, err) = terminate(d);
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("RemoteAccessError"))
        .collect();
    assert_eq!(lines.len(), 2, "one log line per failed connection:\n{err}");
    for l in lines {
        assert!(l.contains("closed: RDMA error RemoteAccessError"), "{l}");
    }
    assert!(out.contains("2 RDMA errors"), "{out}");
}
