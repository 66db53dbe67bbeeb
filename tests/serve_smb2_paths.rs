//! The data paths of the `smb2` upper layer end to end, every byte checked:
//! `smbdirectd serve --provider soft --upper smb2` as a child process,
//! driven by the SMB2 client library (`smbdirect_dataplane::smb2::client`)
//! for well-formed pipelined I/O and by a hand-built client (SMB2 messages
//! from `smbdirect_protocol::smb2` reprs, patched where a test needs a
//! malformed field) for compounds, broken descriptor lists, revoked tokens
//! and MessageIds outside the CommandSequenceWindow.
//!
//! Covered: a 64 MiB file in 1 MiB SMB2_CHANNEL_RDMA_V1 WRITEs and
//! SMB2_CHANNEL_RDMA_V1_INVALIDATE READs on the memory and the directory
//! store ([MS-SMB2] 3.3.5.12, 3.3.5.13; [MS-SMBD] 3.1.4.5, 3.1.4.6); every
//! malformed channel the server must refuse with STATUS_INVALID_PARAMETER
//! while the connection goes on; an RDMA transfer on a revoked token ending
//! its own connection only; RDMA requests inside a related compound with the
//! Send with Invalidate of the _INVALIDATE READ's first token ([MS-SMBD]
//! 3.1.4.2); the CommandSequenceWindow ([MS-SMB2] 3.3.5.2.3, see
//! docs/spec-notes.md); every resource returned once the clients are gone;
//! the directory store's confinement (no symlink, no `..`).

mod common;
use common::*;

use smbdirect_dataplane::client::{buffer_descriptor, Client, ClientError};
use smbdirect_dataplane::planes::LOANED_RECEIVES;
use smbdirect_dataplane::provider::soft::SoftProvider;
use smbdirect_dataplane::provider::{Access, Grant, MemoryRegion, Provider};
use smbdirect_dataplane::smb2::client::{
    IoBuf, MessageId, Smb2Client, Smb2ClientOptions, Smb2Error, Transfer,
};
use smbdirect_hugepages::{Backing, BufId, BufferPool, PoolConfig, SizeClass, SliceAllocator};
use smbdirect_protocol::ntstatus::*;
use smbdirect_protocol::smb2::*;
use smbdirect_protocol::smbd::wire::BufferDescriptorRepr;
use smbdirect_protocol::smbd::SmbdConfig;
use smbdirect_protocol::sqos::{
    Dialect as QosDialect, Options as QosOptions, StorageQosControlRequestRepr, Utf16Name,
    FSCTL_STORAGE_QOS_CONTROL,
};
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;
/// Requests kept outstanding by the pipelined round trip.
const QD: usize = 8;
/// How long a response may take before a test fails.
const REPLY_WAIT: Duration = Duration::from_secs(20);

fn cfg() -> SmbdConfig {
    SmbdConfig {
        receive_credit_max: 32,
        send_credit_target: 32,
        ..SmbdConfig::default()
    }
}

/// Deterministic test bytes (xorshift64, eight bytes a step).
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// Where two byte strings first differ (for failure messages that do not
/// print megabytes).
fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    if a.len() != b.len() {
        return Some(a.len().min(b.len()));
    }
    a.iter().zip(b).position(|(x, y)| x != y)
}

fn assert_same(got: &[u8], want: &[u8], what: &str) {
    if let Some(i) = first_difference(got, want) {
        panic!(
            "{what}: {} bytes, expected {}; first difference at byte {i}",
            got.len(),
            want.len()
        );
    }
}

/// A directory of this test run, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "smbdirectd-paths-{}-{tag}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create a temporary directory");
        TempDir(p)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The daemon under test; a failing test shows what it said.
struct Server {
    d: Option<Daemon>,
    port: u16,
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        let port = free_port();
        let mut args = vec!["--upper", "smb2", "--store-size", "256M"];
        args.extend_from_slice(extra);
        Server {
            d: Some(spawn(port, &args)),
            port,
        }
    }

    fn daemon(&self) -> &Daemon {
        self.d.as_ref().expect("daemon running")
    }

    fn stats(&self) -> String {
        stats_json(self.daemon())
    }

    fn stderr(&self) -> String {
        self.daemon().stderr.lock().unwrap().clone()
    }

    /// Polls `stats --json` until `ok` holds (or fails after `within`).
    fn stats_until(&self, within: Duration, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + within;
        loop {
            let doc = self.stats();
            if ok(&doc) {
                return doc;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within {within:?}:\n{doc}"
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// SIGTERM, a clean exit, and every pool buffer free at the end (the
    /// final lines on stdout).
    fn stop(mut self) {
        let d = self.d.take().expect("daemon running");
        let (out, _err) = terminate(d);
        let pools: Vec<&str> = out.lines().filter(|l| l.contains("final: pool ")).collect();
        assert!(!pools.is_empty(), "no final pool lines:\n{out}");
        for line in pools {
            let counts = line
                .split_whitespace()
                .find(|w| w.contains('/'))
                .unwrap_or_else(|| panic!("no free/total in {line:?}"));
            let (free, total) = counts.split_once('/').unwrap();
            assert_eq!(free, total, "buffers not returned at exit: {line}");
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let (true, Some(d)) = (std::thread::panicking(), &self.d) {
            eprintln!("daemon stderr:\n{}", d.stderr.lock().unwrap());
            if let Ok(doc) = std::panic::catch_unwind(|| stats_json(d)) {
                eprintln!("daemon stats: {doc}");
            }
        }
    }
}

/// The clients' memory: one pool registered with the soft provider, one
/// slice for each connection open at the same time.
struct Side {
    provider: SoftProvider,
    _pool: BufferPool,
    mr: MemoryRegion,
    slices: Vec<SliceAllocator>,
}

impl Side {
    fn new(slices: usize) -> Side {
        let provider = SoftProvider::new().unwrap();
        let pool = PoolConfig::new(slices * (20 << 20), slices)
            .class(SizeClass::new("send", 1364).per_slice(256))
            .class(SizeClass::new("receive", 8192).per_slice(64))
            .class(SizeClass::new("io64k", 65536).per_slice(8))
            .class(SizeClass::new("mid", MIB).per_slice(QD as u32 + 2))
            .class(SizeClass::new("big", 2 * MIB).per_slice(2))
            .backing(Backing::SharedMemfd)
            .build()
            .unwrap();
        // SAFETY: the pool outlives the provider's use of it (whole test).
        let mr = unsafe { provider.register_pool(&pool) }.unwrap();
        let slices = (0..slices)
            .rev()
            .map(|i| pool.claim_slice(i).unwrap())
            .collect();
        Side {
            provider,
            _pool: pool,
            mr,
            slices,
        }
    }

    fn slice(&mut self) -> SliceAllocator {
        self.slices.pop().expect("a free client pool slice")
    }

    fn addr(port: u16) -> std::net::SocketAddr {
        format!("127.0.0.1:{port}").parse().unwrap()
    }

    /// A hand-built client, connected (no SMB2 yet).
    fn raw(&mut self, port: u16) -> Raw {
        let alloc = self.slice();
        let c = Client::connect(
            &self.provider,
            Self::addr(port),
            cfg(),
            alloc,
            self.mr,
            Duration::from_secs(10),
        )
        .expect("connect");
        Raw {
            c,
            next_id: 0,
            credits: 1,
            session: 0,
            tree: 0,
            inbox: VecDeque::new(),
        }
    }

    /// A library client with an anonymous session on `data` (SMB 3.1.1).
    fn library(&mut self, port: u16) -> Smb2Client<SoftProvider> {
        let alloc = self.slice();
        let mut c = Smb2Client::connect(
            &self.provider,
            Self::addr(port),
            cfg(),
            alloc,
            self.mr,
            Duration::from_secs(10),
            Smb2ClientOptions {
                timeout: REPLY_WAIT,
                ..Smb2ClientOptions::default()
            },
        )
        .expect("connect");
        c.negotiate(&[Dialect::SMB_3_1_1]).expect("negotiate");
        c.session_setup_anonymous().expect("session setup");
        c.tree_connect("data").expect("tree connect");
        c
    }
}

// ---------------------------------------------------------------------------
// The hand-built client

/// One SMB2 message of a response.
struct Part {
    header: HeaderRepr,
    body: Vec<u8>,
}

impl Part {
    fn body(&self) -> ResponseBody<'_> {
        ResponseBody::parse(&self.header, &self.body).expect("response body")
    }

    fn status(&self) -> NtStatus {
        self.header.status
    }
}

/// One SMB Direct message from the server: its SMB2 messages and the token
/// its Send with Invalidate invalidated.
struct Reply {
    parts: Vec<Part>,
    token: Option<u32>,
}

/// SMB2 over a bare SMB Direct [`Client`]: sends whatever bytes a test
/// builds and tracks the credits the server grants.
struct Raw {
    c: Client<SoftProvider>,
    next_id: u64,
    credits: u32,
    session: u64,
    tree: u32,
    /// Messages received and not yet handed out.
    inbox: VecDeque<Reply>,
}

impl Raw {
    /// The next request header: consumes CreditCharge MessageIds (at least
    /// one) and asks for 64 credits more.
    fn header(&mut self, command: Command, charge: u16) -> HeaderRepr {
        let n = u32::from(charge.max(1));
        assert!(
            self.credits >= n,
            "the test holds {} credits, {command:?} needs {n}",
            self.credits
        );
        self.credits -= n;
        let mut h = HeaderRepr::request(command, self.next_id);
        self.next_id += u64::from(n);
        h.credit_charge = charge;
        h.credit = 64;
        h.session_id = self.session;
        h.id = HeaderId::Sync {
            process_id: 0xFEFF,
            tree_id: self.tree,
        };
        h
    }

    fn related(mut h: HeaderRepr) -> HeaderRepr {
        h.flags |= HeaderFlags::RELATED_OPERATIONS;
        h
    }

    /// Emits one request; returns its MessageId and bytes.
    fn message<B: Smb2Body + ?Sized>(
        &mut self,
        command: Command,
        charge: u16,
        body: &B,
    ) -> (u64, Vec<u8>) {
        let h = self.header(command, charge);
        let mut buf = vec![0u8; HEADER_LEN + body.buffer_len()];
        let n = emit_message(&h, body, &mut buf).expect("emit");
        buf.truncate(n);
        (h.message_id, buf)
    }

    fn send(&mut self, bytes: &[u8]) {
        self.c.send(bytes).expect("send");
    }

    /// The next message from the server. Polls the connection itself and
    /// queues every message a poll delivers: `Client::recv_with_token`
    /// keeps only the first of those that arrive in one completion batch.
    fn recv(&mut self, timeout: Duration) -> Result<Reply, ClientError> {
        let deadline = Instant::now() + timeout;
        while self.inbox.is_empty() {
            let inbox = &mut self.inbox;
            let progress = self.c.step(&mut |m, token| {
                let parts = compound(m)
                    .map(|msg| {
                        let msg = msg.expect("a well-formed response");
                        assert!(msg.header().is_response());
                        Part {
                            header: *msg.header(),
                            body: msg.body().to_vec(),
                        }
                    })
                    .collect();
                inbox.push_back(Reply { parts, token });
            })?;
            if self.inbox.is_empty() {
                if Instant::now() > deadline {
                    return Err(ClientError::Timeout("a message"));
                }
                if !progress {
                    std::thread::yield_now();
                }
            }
        }
        let r = self.inbox.pop_front().expect("a queued message");
        self.credits += r
            .parts
            .iter()
            .map(|p| u32::from(p.header.credit))
            .sum::<u32>();
        Ok(r)
    }

    /// The one-message, not-invalidating response to request `id`.
    fn expect_reply(&mut self, id: u64, command: Command) -> Part {
        let r = self
            .recv(REPLY_WAIT)
            .unwrap_or_else(|e| panic!("response to {command:?} {id}: {e}"));
        assert_eq!(r.parts.len(), 1, "one response to {command:?} {id}");
        assert_eq!(
            r.token, None,
            "{command:?} {id} answered with Send with Invalidate"
        );
        let p = r.parts.into_iter().next().unwrap();
        assert_eq!(p.header.message_id, id);
        assert_eq!(p.header.command, command);
        p
    }

    fn send_expect(&mut self, (id, bytes): (u64, Vec<u8>), command: Command) -> Part {
        self.send(&bytes);
        self.expect_reply(id, command)
    }

    fn call<B: Smb2Body + ?Sized>(&mut self, command: Command, charge: u16, body: &B) -> Part {
        let m = self.message(command, charge, body);
        self.send_expect(m, command)
    }

    /// NEGOTIATE (`dialects`, with a preauth integrity context when 3.1.1
    /// is offered), an anonymous SESSION_SETUP, TREE_CONNECT to `data`.
    /// Returns the server's MaxReadSize.
    fn setup(&mut self, dialects: &[u16]) -> u32 {
        let salt = [9u8; 32];
        let hashes = [HashAlgorithm::SHA_512.0];
        let ctxs = [NegotiateContext::PreauthIntegrity(
            PreauthIntegrityCapabilities {
                hash_algorithms: U16Array::new(&hashes),
                salt: &salt,
            },
        )];
        let neg = NegotiateRequestRepr {
            security_mode: SecurityMode::SIGNING_ENABLED,
            capabilities: Capabilities::LARGE_MTU,
            client_guid: Guid::from_bytes([0x42; 16]),
            dialects: U16Array::new(dialects),
            negotiate_contexts: if dialects.contains(&Dialect::SMB_3_1_1.0) {
                NegotiateContextList::new(&ctxs)
            } else {
                NegotiateContextList::EMPTY
            },
        };
        let r = self.call(Command::Negotiate, 0, &neg);
        assert_eq!(r.status(), STATUS_SUCCESS, "NEGOTIATE");
        let ResponseBody::Negotiate(n) = r.body() else {
            panic!("not a NEGOTIATE response")
        };
        let max_read = n.max_read_size;
        let ss = SessionSetupRequestRepr {
            flags: SessionSetupFlags::empty(),
            security_mode: SecurityMode::SIGNING_ENABLED,
            capabilities: Capabilities::empty(),
            channel: 0,
            previous_session_id: 0,
            security_buffer: &[],
        };
        let r = self.call(Command::SessionSetup, 1, &ss);
        assert_eq!(r.status(), STATUS_SUCCESS, "SESSION_SETUP");
        self.session = r.header.session_id;
        let tc = TreeConnectRequestRepr {
            flags: TreeConnectFlags::empty(),
            path: Utf16Str::new("\\\\127.0.0.1\\data"),
        };
        let r = self.call(Command::TreeConnect, 1, &tc);
        assert_eq!(r.status(), STATUS_SUCCESS, "TREE_CONNECT");
        self.tree = r.header.tree_id().expect("a SYNC response");
        max_read
    }

    /// CREATE of a file (read/write); its FileId.
    fn create(&mut self, name: &str, disposition: CreateDisposition) -> FileId {
        let r = self.call(Command::Create, 1, &create_req(name, disposition));
        assert_eq!(r.status(), STATUS_SUCCESS, "CREATE {name}");
        match r.body() {
            ResponseBody::Create(c) => c.file_id,
            _ => panic!("not a CREATE response"),
        }
    }

    fn close(&mut self, fid: FileId) {
        let r = self.call(Command::Close, 1, &close_req(fid));
        assert_eq!(r.status(), STATUS_SUCCESS, "CLOSE");
    }

    fn write_inline(&mut self, fid: FileId, offset: u64, data: &[u8]) {
        let charge = HeaderRepr::credit_charge_for(data.len() as u64);
        let r = self.call(
            Command::Write,
            charge,
            &write_req(fid, offset, data, Channel::None, 0, &[]),
        );
        assert_eq!(r.status(), STATUS_SUCCESS, "inline WRITE");
        match r.body() {
            ResponseBody::Write(w) => assert_eq!(w.count as usize, data.len()),
            _ => panic!("not a WRITE response"),
        }
    }

    fn read_inline(&mut self, fid: FileId, offset: u64, len: u32) -> Vec<u8> {
        let charge = HeaderRepr::credit_charge_for(u64::from(len));
        let r = self.call(
            Command::Read,
            charge,
            &read_req(fid, offset, len, Channel::None, &[]),
        );
        assert_eq!(r.status(), STATUS_SUCCESS, "inline READ");
        match r.body() {
            ResponseBody::Read(rd) => rd.data.to_vec(),
            _ => panic!("not a READ response"),
        }
    }

    fn echo(&mut self) {
        let r = self.call(Command::Echo, 1, &EchoRequestRepr);
        assert_eq!(r.status(), STATUS_SUCCESS, "ECHO");
    }

    /// Grants the server `access` to consecutive ranges of `buf`.
    fn grants(&mut self, buf: BufId, sizes: &[usize], access: Access) -> Vec<Grant> {
        let mut off = 0;
        sizes
            .iter()
            .map(|&s| {
                let g = self.c.grant(buf, off, s, access).expect("grant");
                off += s;
                g
            })
            .collect()
    }

    fn revoke(&mut self, grants: &[Grant]) {
        for g in grants {
            self.c.revoke(g.rkey).expect("revoke");
        }
    }

    /// Sends an ECHO with MessageId `id`, outside the test's own
    /// bookkeeping of MessageIds and credits.
    fn send_echo_as(&mut self, id: u64) {
        let mut h = HeaderRepr::request(Command::Echo, id);
        h.session_id = self.session;
        h.credit = 8;
        let mut buf = vec![0u8; HEADER_LEN + EchoRequestRepr.buffer_len()];
        let n = emit_message(&h, &EchoRequestRepr, &mut buf).expect("emit");
        self.send(&buf[..n]);
    }

    /// Waits for the server to end the connection: no message may arrive,
    /// and the connection must fail within `within`.
    fn expect_disconnect(&mut self, within: Duration) -> ClientError {
        match self.recv(within) {
            Ok(r) => panic!(
                "{} response(s) arrived; the server should have disconnected",
                r.parts.len()
            ),
            Err(ClientError::Timeout(_)) => panic!("the connection is still up after {within:?}"),
            Err(e) => e,
        }
    }
}

fn close_req(fid: FileId) -> CloseRequestRepr {
    CloseRequestRepr {
        flags: CloseFlags::empty(),
        file_id: fid,
    }
}

fn write_req<'a>(
    fid: FileId,
    offset: u64,
    data: &'a [u8],
    channel: Channel,
    remaining: u32,
    descs: &'a [BufferDescriptorRepr],
) -> WriteRequestRepr<'a> {
    WriteRequestRepr {
        offset,
        file_id: fid,
        channel,
        remaining_bytes: remaining,
        flags: WriteFlags::empty(),
        data,
        channel_info: ChannelInfo::descriptors(descs),
    }
}

fn read_req<'a>(
    fid: FileId,
    offset: u64,
    length: u32,
    channel: Channel,
    descs: &'a [BufferDescriptorRepr],
) -> ReadRequestRepr<'a> {
    ReadRequestRepr {
        padding: 0x50,
        flags: ReadFlags::empty(),
        length,
        offset,
        file_id: fid,
        minimum_count: 0,
        channel,
        remaining_bytes: 0,
        channel_info: ChannelInfo::descriptors(descs),
    }
}

fn descs(g: &[Grant]) -> Vec<BufferDescriptorRepr> {
    g.iter().map(buffer_descriptor).collect()
}

// ---------------------------------------------------------------------------
// Library-client helpers

/// Writes `data` to `name` in 1 MiB RDMA_V1 WRITEs (two descriptors each)
/// and reads it back in 1 MiB RDMA_V1_INVALIDATE READs, [`QD`] of them
/// outstanding, comparing every byte; every READ's response must be a Send
/// with Invalidate of its first token.
fn round_trip_in_1_mib_rdma(c: &mut Smb2Client<SoftProvider>, name: &str, data: &[u8]) {
    assert_eq!(data.len() % MIB, 0);
    let chunks = data.len() / MIB;
    let fid = c
        .create(
            name,
            CreateDisposition::OVERWRITE_IF,
            CreateOptions::NON_DIRECTORY_FILE,
        )
        .expect("create")
        .file_id;
    let mut free: Vec<IoBuf> = (0..QD)
        .map(|_| c.alloc_io_buf(MIB).expect("a 1 MiB I/O buffer"))
        .collect();
    let write = Transfer::Rdma {
        descriptors: 2,
        invalidate: false,
    };
    let read = Transfer::Rdma {
        descriptors: 1,
        invalidate: true,
    };
    let invalidated_before = c.stats().invalidated;
    for reading in [false, true] {
        let what = if reading { "READ" } else { "WRITE" };
        let mut pending: HashMap<MessageId, usize> = HashMap::new();
        let (mut next, mut done) = (0, 0);
        while done < chunks {
            while next < chunks && pending.len() < QD {
                let b = free.pop().expect("a free buffer");
                let off = (next * MIB) as u64;
                let id = if reading {
                    // A buffer may still hold this very MiB from the WRITEs.
                    c.io_buf_mut(b).expect("buffer not lent").fill(0xEE);
                    c.submit_read(fid, off, MIB as u32, b, read)
                } else {
                    c.io_buf_mut(b)
                        .expect("buffer not lent")
                        .copy_from_slice(&data[next * MIB..][..MIB]);
                    c.submit_write(fid, off, MIB as u32, b, write)
                }
                .unwrap_or_else(|e| panic!("submit {what} {next}: {e}"));
                pending.insert(id, next);
                next += 1;
            }
            let comp = c
                .poll(REPLY_WAIT)
                .unwrap_or_else(|e| panic!("{what}s: {e}"))
                .unwrap_or_else(|| panic!("no {what} completed within {REPLY_WAIT:?}"));
            let i = pending.remove(&comp.id).expect("a request we sent");
            assert_eq!(
                comp.result.as_ref().ok(),
                Some(&(MIB as u32)),
                "{what} of MiB {i}: {:?}",
                comp.result
            );
            let b = comp.buf.expect("the request's buffer");
            if reading {
                let got = c.io_buf(b).expect("buffer back");
                assert_same(
                    &got[..MIB],
                    &data[i * MIB..][..MIB],
                    &format!("{name}: MiB {i} read back"),
                );
            }
            free.push(b);
            done += 1;
        }
        if !reading {
            c.flush(fid).expect("flush");
        }
    }
    assert_eq!(
        c.stats().invalidated - invalidated_before,
        chunks as u64,
        "every RDMA_V1_INVALIDATE READ answered with Send with Invalidate of its token"
    );
    c.close(fid).expect("close");
    for b in free {
        c.free_io_buf(b).expect("free the I/O buffer");
    }
}

fn create_file(c: &mut Smb2Client<SoftProvider>, name: &str) -> FileId {
    c.create(
        name,
        CreateDisposition::OVERWRITE_IF,
        CreateOptions::NON_DIRECTORY_FILE,
    )
    .unwrap_or_else(|e| panic!("create {name}: {e}"))
    .file_id
}

fn rdma(descriptors: usize, invalidate: bool) -> Transfer {
    Transfer::Rdma {
        descriptors,
        invalidate,
    }
}

/// WRITE `data` by RDMA and READ it back by RDMA, comparing.
fn rdma_write_read(c: &mut Smb2Client<SoftProvider>, fid: FileId, offset: u64, data: &[u8]) {
    let n = c
        .write(fid, offset, data, rdma(2, false))
        .expect("RDMA write");
    assert_eq!(n as usize, data.len());
    let back = c
        .read(fid, offset, data.len() as u32, rdma(1, true))
        .expect("RDMA read");
    assert_same(&back, data, "RDMA round trip");
}

// ---------------------------------------------------------------------------
// 1. Large files over RDMA

#[test]
fn file_of_64_mib_round_trips_in_1_mib_rdma_operations() {
    let _serial = serial();
    let data = pattern(64 * MIB, 1);
    let mut side = Side::new(2);

    // The memory store.
    let s = Server::start(&[]);
    let mut c = side.library(s.port);
    round_trip_in_1_mib_rdma(&mut c, "big.bin", &data);
    side.slices.push(c.disconnect(Duration::from_secs(2)));
    let doc = s.stats();
    assert_eq!(field(&doc, "rdma_errors"), 0, "{doc}");
    s.stop();

    // The directory store: the bytes are in DIR/big.bin afterwards.
    let dir = TempDir::new("big");
    let store = dir.path().to_str().unwrap().to_string();
    let s = Server::start(&["--store", &store]);
    let mut c = side.library(s.port);
    round_trip_in_1_mib_rdma(&mut c, "big.bin", &data);
    side.slices.push(c.disconnect(Duration::from_secs(2)));
    s.stop();
    let on_disk = std::fs::read(dir.path().join("big.bin")).expect("DIR/big.bin");
    assert_same(&on_disk, &data, "DIR/big.bin on disk");
}

// ---------------------------------------------------------------------------
// 2. Malformed descriptor lists

/// The file the malformed requests name: 64 KiB of known bytes.
const M_LEN: usize = 65536;

/// [MS-SMB2] 2.2.19: ReadChannelInfoOffset, ReadChannelInfoLength.
const READ_INFO_OFFSET: usize = 44;
const READ_INFO_LENGTH: usize = 46;
/// [MS-SMB2] 2.2.21: WriteChannelInfoOffset, WriteChannelInfoLength.
const WRITE_INFO_OFFSET: usize = 40;
const WRITE_INFO_LENGTH: usize = 42;

/// A connection, the file its malformed requests name, and the client
/// buffers their descriptors point into.
struct Victim {
    r: Raw,
    fid: FileId,
    content: Vec<u8>,
    /// What the server would RDMA-write (READ), filled with 0x5a.
    dst: BufId,
    /// What the server would RDMA-read (WRITE).
    src: BufId,
}

const DST_FILL: u8 = 0x5a;

impl Victim {
    /// Connects, negotiates `dialects` and writes `name` (64 KiB inline).
    fn new(side: &mut Side, port: u16, dialects: &[u16], name: &str) -> (Victim, u32) {
        let mut r = side.raw(port);
        let max_read = r.setup(dialects);
        let content = pattern(M_LEN, 2);
        let fid = r.create(name, CreateDisposition::OVERWRITE_IF);
        r.write_inline(fid, 0, &content);
        let dst = r.c.alloc_buffer(2 * MIB).expect("dst");
        let src = r.c.alloc_buffer(2 * MIB).expect("src");
        assert!(r.c.write_buffer(dst, 0, &vec![DST_FILL; 2 * MIB]));
        assert!(r.c.write_buffer(src, 0, &pattern(2 * MIB, 3)));
        let v = Victim {
            r,
            fid,
            content,
            dst,
            src,
        };
        (v, max_read)
    }

    /// Grants ranges of `dst` (for READs) or `src` (for WRITEs).
    fn grants(&mut self, command: Command, sizes: &[usize]) -> Vec<Grant> {
        match command {
            Command::Read => self.r.grants(self.dst, sizes, Access::RemoteWrite),
            _ => self.r.grants(self.src, sizes, Access::RemoteRead),
        }
    }

    /// An RDMA READ or WRITE of `len` bytes at `offset` naming `descs`.
    fn request(
        &mut self,
        command: Command,
        channel: Channel,
        offset: u64,
        len: usize,
        descs: &[BufferDescriptorRepr],
    ) -> (u64, Vec<u8>) {
        let charge = HeaderRepr::credit_charge_for(len as u64);
        let (fid, len) = (self.fid, len as u32);
        match command {
            Command::Read => {
                let body = read_req(fid, offset, len, channel, descs);
                self.r.message(command, charge, &body)
            }
            _ => {
                let body = write_req(fid, offset, &[], channel, len, descs);
                self.r.message(command, charge, &body)
            }
        }
    }

    /// Sends `m`, which the server must refuse with
    /// STATUS_INVALID_PARAMETER without touching the client's buffer or the
    /// file; then the connection goes on (ECHO, and an inline READ of the
    /// file returns what it held).
    fn refused(&mut self, what: &str, m: (u64, Vec<u8>)) {
        let command = Command::from_wire(Header::new_unchecked(&m.1[..]).command())
            .expect("a defined command");
        let what = format!("{command:?}, {what}");
        let p = self.r.send_expect(m, command);
        assert_eq!(
            p.status(),
            STATUS_INVALID_PARAMETER,
            "{what}: expected STATUS_INVALID_PARAMETER"
        );
        let mut b = vec![0u8; 2 * MIB];
        assert!(self.r.c.read_buffer(self.dst, 0, &mut b));
        assert!(
            b.iter().all(|&x| x == DST_FILL),
            "{what}: the server wrote the client's buffer"
        );
        self.r.echo();
        let back = self.r.read_inline(self.fid, 0, M_LEN as u32);
        assert_same(&back, &self.content, &format!("the file after {what}"));
    }

    /// A request built by `build` from fresh grants of `sizes`, refused.
    fn refused_with(
        &mut self,
        what: &str,
        command: Command,
        sizes: &[usize],
        build: impl FnOnce(&mut Victim, Vec<BufferDescriptorRepr>) -> (u64, Vec<u8>),
    ) {
        let g = self.grants(command, sizes);
        let m = build(self, descs(&g));
        self.refused(what, m);
        self.r.revoke(&g);
    }
}

/// Patches a 16-bit field of an emitted request's body.
fn patch(m: &mut (u64, Vec<u8>), at: usize, value: u16) {
    m.1[HEADER_LEN + at..HEADER_LEN + at + 2].copy_from_slice(&value.to_le_bytes());
}

#[test]
fn malformed_descriptor_lists_are_refused_and_the_connection_goes_on() {
    let _serial = serial();
    // MaxReadWriteSize 1 MiB, so "too large" costs 17 credits, not 129.
    let s = Server::start(&["--max-read-write-size", "1048576"]);
    let mut side = Side::new(2);
    let (mut v, max_read) = Victim::new(&mut side, s.port, &[0x0300, 0x0302, 0x0311], "m.bin");
    assert_eq!(max_read, MIB as u32, "MaxReadSize = MaxReadWriteSize");
    let (read, write, v1) = (Command::Read, Command::Write, Channel::RdmaV1);

    // A zero-length descriptor (the first of a READ's, the last of a WRITE's).
    let zero = |d: &BufferDescriptorRepr| BufferDescriptorRepr { length: 0, ..*d };
    v.refused_with("zero-length first", read, &[4096], |v, mut d| {
        d.insert(0, zero(&d[0]));
        v.request(read, v1, 0, 4096, &d)
    });
    v.refused_with("zero-length last", write, &[4096], |v, mut d| {
        d.push(zero(&d[0]));
        v.request(write, v1, 0, 4096, &d)
    });

    // Descriptors totalling less than READ Length / WRITE RemainingBytes.
    for command in [read, write] {
        v.refused_with("8192 bytes, 4096 described", command, &[4096], |v, d| {
            v.request(command, v1, 0, 8192, &d)
        });
    }

    // Longer than the negotiated MaxReadWriteSize (1 MiB): descriptors
    // covering all of it, CreditCharge paid.
    let over = MIB + 4096;
    for command in [read, write] {
        v.refused_with("over MaxReadWriteSize", command, &[over], |v, d| {
            v.request(command, v1, 0, over, &d)
        });
    }

    // Read/WriteChannelInfoLength not a multiple of 16.
    for (command, at, len) in [(read, READ_INFO_LENGTH, 20), (write, WRITE_INFO_LENGTH, 24)] {
        v.refused_with("ChannelInfoLength % 16", command, &[2048, 2048], |v, d| {
            let mut m = v.request(command, v1, 0, 4096, &d);
            patch(&mut m, at, len);
            m
        });
    }

    // Channel information outside the message: an offset past its end, a
    // length running past its end, an offset inside the fixed part.
    for (command, offset_at, length_at) in [
        (read, READ_INFO_OFFSET, READ_INFO_LENGTH),
        (write, WRITE_INFO_OFFSET, WRITE_INFO_LENGTH),
    ] {
        for (at, value, what) in [
            (offset_at, 0xFFF0, "ChannelInfoOffset past the end"),
            (length_at, 32, "ChannelInfoLength past the end"),
            (offset_at, 80, "ChannelInfoOffset in the fixed part"),
        ] {
            v.refused_with(what, command, &[4096], |v, d| {
                let mut m = v.request(command, v1, 0, 4096, &d);
                patch(&mut m, at, value);
                m
            });
        }
    }

    // A WRITE through an RDMA channel that also carries inline data.
    let inline = pattern(512, 4);
    v.refused_with("RDMA WRITE with inline data", write, &[4096], |v, d| {
        let body = write_req(v.fid, 0, &inline, v1, 4096, &d);
        v.r.message(write, 1, &body)
    });

    // Well-formed, the same kind of descriptors work: the refusals were
    // about the requests.
    let g = v.grants(read, &[4096, 4096]);
    let m = v.request(read, v1, 0, 8192, &descs(&g));
    let p = v.r.send_expect(m, read);
    assert_eq!(p.status(), STATUS_SUCCESS, "a well-formed RDMA READ");
    let mut got = vec![0u8; 8192];
    assert!(v.r.c.read_buffer(v.dst, 0, &mut got));
    assert_same(&got, &v.content[..8192], "a well-formed RDMA READ");
    v.r.revoke(&g);

    // SMB2_CHANNEL_RDMA_V1_INVALIDATE on a 3.0 connection; RDMA_V1 works.
    let (mut v30, _) = Victim::new(&mut side, s.port, &[0x0300], "m30.bin");
    let inv = Channel::RdmaV1Invalidate;
    for command in [read, write] {
        v30.refused_with("RDMA_V1_INVALIDATE on 3.0", command, &[4096], |v, d| {
            v.request(command, inv, 0, 4096, &d)
        });
    }
    let g = v30.grants(write, &[4096]);
    let m = v30.request(write, v1, 0, 4096, &descs(&g));
    let p = v30.r.send_expect(m, write);
    assert_eq!(p.status(), STATUS_SUCCESS, "RDMA_V1 WRITE on 3.0");
    v30.r.revoke(&g);
    let back = v30.r.read_inline(v30.fid, 0, 4096);
    assert_same(&back, &pattern(2 * MIB, 3)[..4096], "RDMA_V1 WRITE on 3.0");

    // Nothing here was a reason to end a connection.
    let doc = s.stats();
    assert_eq!(field(&doc, "connections"), 2, "{doc}");
    assert_eq!(field(&doc, "protocol_errors"), 0, "{doc}");
    assert_eq!(field(&doc, "rdma_errors"), 0, "{doc}");
    for mut v in [v, v30] {
        v.r.close(v.fid);
        let _ = v.r.c.close(Duration::from_secs(2));
    }
    s.stop();
}

/// [MS-SMB2] 3.3.5.12: an RDMA READ whose descriptors cannot hold Length
/// bytes is refused, also when the file ends before Length (so fewer bytes
/// would have moved).
#[test]
fn read_descriptors_shorter_than_length_are_refused_near_the_end_of_file() {
    let _serial = serial();
    let s = Server::start(&[]);
    let mut side = Side::new(1);
    let (mut v, _) = Victim::new(&mut side, s.port, &[0x0311], "eof.bin");
    // 4096 bytes remain after the offset; Length 8192; 4096 described.
    let off = (M_LEN - 4096) as u64;
    let read = Command::Read;
    v.refused_with("8192 at EOF-4096, 4096 described", read, &[4096], |v, d| {
        v.request(read, Channel::RdmaV1, off, 8192, &d)
    });
    v.r.close(v.fid);
    let _ = v.r.c.close(Duration::from_secs(2));
    s.stop();
}

// ---------------------------------------------------------------------------
// 3. A revoked token

#[test]
fn invalid_token_ends_only_its_own_connection() {
    let _serial = serial();
    let s = Server::start(&[]);
    let mut side = Side::new(3);

    // B, opened first, works.
    let mut b = side.library(s.port);
    let fb = create_file(&mut b, "b.bin");
    let before = pattern(256 << 10, 6);
    rdma_write_read(&mut b, fb, 0, &before);

    // A: READ by RDMA into a buffer whose grant it revoked.
    let mut a = side.raw(s.port);
    a.setup(&[0x0311]);
    let fa = a.create("a.bin", CreateDisposition::OVERWRITE_IF);
    a.write_inline(fa, 0, &pattern(4096, 7));
    let dst = a.c.alloc_buffer(MIB).expect("dst");
    let g = a.grants(dst, &[4096], Access::RemoteWrite);
    a.revoke(&g);
    let m = a.message(
        Command::Read,
        1,
        &read_req(fa, 0, 4096, Channel::RdmaV1, &descs(&g)),
    );
    a.send(&m.1);
    let e = a.expect_disconnect(Duration::from_secs(10));
    eprintln!("connection A ended: {e}");
    let doc = s.stats_until(Duration::from_secs(10), "A gone", |d| {
        field(d, "connections") == 1 && field(d, "rdma_errors") == 1
    });
    assert_eq!(field(&doc, "protocol_errors"), 0, "{doc}");
    let err = s.stderr();
    assert!(
        err.lines()
            .any(|l| l.contains("RDMA error") && l.contains("RemoteAccessError")),
        "the daemon's stderr does not log A's RDMA error:\n{err}"
    );

    // B goes on: READ and WRITE after A died.
    assert_same(
        &b.read(fb, 0, before.len() as u32, rdma(1, true))
            .expect("B reads"),
        &before,
        "B's file after A died",
    );
    let after = pattern(MIB, 8);
    rdma_write_read(&mut b, fb, 4096, &after);

    // A fresh connection C works too (and sees B's bytes).
    let mut c = side.library(s.port);
    let fc = c
        .create(
            "b.bin",
            CreateDisposition::OPEN,
            CreateOptions::NON_DIRECTORY_FILE,
        )
        .expect("C opens b.bin")
        .file_id;
    assert_same(
        &c.read(fc, 4096, MIB as u32, rdma(2, true))
            .expect("C reads"),
        &after,
        "b.bin through C",
    );
    let fc2 = create_file(&mut c, "c.bin");
    rdma_write_read(&mut c, fc2, 0, &pattern(300_000, 9));
    c.close(fc).unwrap();
    c.close(fc2).unwrap();
    b.close(fb).unwrap();
    let _ = c.disconnect(Duration::from_secs(2));
    let _ = b.disconnect(Duration::from_secs(2));
    let _ = a.c.close(Duration::from_secs(2));
    let doc = s.stats_until(Duration::from_secs(10), "all gone", |d| {
        field(d, "connections") == 0
    });
    assert_eq!(field(&doc, "rdma_errors"), 1, "{doc}");
    s.stop();
}

// ---------------------------------------------------------------------------
// 4. RDMA inside a compound

#[test]
fn rdma_request_in_the_middle_of_a_compound() {
    let _serial = serial();
    let s = Server::start(&[]);
    let mut side = Side::new(1);
    let mut r = side.raw(s.port);
    r.setup(&[0x0311]);

    let len = 100_000usize;
    let data = pattern(len, 10);
    let src = r.c.alloc_buffer(MIB).expect("src");
    let dst = r.c.alloc_buffer(MIB).expect("dst");
    assert!(r.c.write_buffer(src, 0, &data));
    assert!(r.c.write_buffer(dst, 0, &vec![0x5a; len]));
    let wg = r.grants(src, &[40_000, len - 40_000], Access::RemoteRead);
    let rg = r.grants(dst, &[30_000, len - 30_000], Access::RemoteWrite);
    let (wd, rd) = (descs(&wg), descs(&rg));
    let charge = HeaderRepr::credit_charge_for(len as u64);

    // CREATE + WRITE(RDMA_V1, 2 descriptors) + READ(RDMA_V1_INVALIDATE) +
    // CLOSE, related: the RDMA requests are not last.
    let mut buf = vec![0u8; 8192];
    let mut w = CompoundWriter::new(&mut buf);
    let hc = r.header(Command::Create, 1);
    w.push(
        &hc,
        &create_req("compound.bin", CreateDisposition::OVERWRITE_IF),
    )
    .unwrap();
    let hw = Raw::related(r.header(Command::Write, charge));
    w.push(
        &hw,
        &write_req(FileId::ANY, 0, &[], Channel::RdmaV1, len as u32, &wd),
    )
    .unwrap();
    let hr = Raw::related(r.header(Command::Read, charge));
    w.push(
        &hr,
        &read_req(FileId::ANY, 0, len as u32, Channel::RdmaV1Invalidate, &rd),
    )
    .unwrap();
    let hx = Raw::related(r.header(Command::Close, 1));
    w.push(&hx, &close_req(FileId::ANY)).unwrap();
    let n = w.finish();
    r.send(&buf[..n]);

    // One or more responses, together answering all four.
    let want = [
        (hc.message_id, Command::Create),
        (hw.message_id, Command::Write),
        (hr.message_id, Command::Read),
        (hx.message_id, Command::Close),
    ];
    let mut answered: Vec<(Part, Option<u32>, usize)> = Vec::new();
    let mut messages = 0;
    while answered.len() < want.len() {
        let reply = r.recv(REPLY_WAIT).unwrap_or_else(|e| {
            let got: Vec<_> = answered
                .iter()
                .map(|(p, t, m)| (p.header.command, p.status(), *t, *m))
                .collect();
            panic!("compound responses: {e}; answered so far: {got:?}")
        });
        for p in reply.parts {
            answered.push((p, reply.token, messages));
        }
        messages += 1;
    }
    eprintln!("the compound was answered in {messages} message(s)");
    assert_eq!(answered.len(), 4, "one response per request");
    for (&(id, command), (p, _, _)) in want.iter().zip(&answered) {
        assert_eq!(
            (p.header.message_id, p.header.command),
            (id, command),
            "responses in request order"
        );
        assert_eq!(p.status(), STATUS_SUCCESS, "{command:?}");
    }
    let ResponseBody::Write(wr) = answered[1].0.body() else {
        panic!("WRITE response")
    };
    assert_eq!(wr.count as usize, len);
    let ResponseBody::Read(rr) = answered[2].0.body() else {
        panic!("READ response")
    };
    assert!(rr.data.is_empty(), "RDMA READ data came inline");
    assert_eq!(rr.data_remaining as usize, len);
    // [MS-SMBD] 3.1.4.2: the message answering the _INVALIDATE READ is a
    // Send with Invalidate of its first token; the others invalidate none
    // (a message answering several shares its token).
    let read_msg = answered[2].2;
    for (p, token, msg) in &answered {
        if *msg == read_msg {
            assert_eq!(*token, Some(rg[0].rkey), "{:?}'s message", p.header.command);
        } else {
            assert_eq!(*token, None, "{:?}'s message", p.header.command);
        }
    }
    let mut got = vec![0u8; len];
    assert!(r.c.read_buffer(dst, 0, &mut got));
    assert_same(&got, &data, "READ by RDMA in the compound");
    r.revoke(&wg);
    r.revoke(&rg[1..]);

    // The data is in the file, and the connection goes on.
    let fid = r.create("compound.bin", CreateDisposition::OPEN);
    assert_same(
        &r.read_inline(fid, 0, len as u32),
        &data,
        "compound.bin read inline",
    );
    r.close(fid);
    let doc = s.stats();
    assert_eq!(field(&doc, "rdma_errors"), 0, "{doc}");
    assert_eq!(field(&doc, "opens"), 0, "{doc}");
    let _ = r.c.close(Duration::from_secs(2));
    s.stop();
}

// ---------------------------------------------------------------------------
// 5. The CommandSequenceWindow

#[test]
fn smb2_message_id_outside_window_disconnects() {
    let _serial = serial();
    let s = Server::start(&[]);
    let mut side = Side::new(3);

    // Far above the window: no response, the connection ends.
    let mut r = side.raw(s.port);
    r.setup(&[0x0311]);
    r.echo();
    r.send_echo_as(r.next_id + 100_000);
    let e = r.expect_disconnect(Duration::from_secs(10));
    eprintln!("MessageId above the window: {e}");
    s.stats_until(Duration::from_secs(10), "first violation counted", |d| {
        field(d, "protocol_errors") == 1 && field(d, "connections") == 0
    });
    let _ = r.c.close(Duration::from_secs(2));

    // Out of order inside the window is fine; a reused MessageId is not.
    let mut r = side.raw(s.port);
    r.setup(&[0x0311]);
    assert!(r.credits >= 2, "credits for two ECHOs: {}", r.credits);
    let (first, second) = (r.next_id, r.next_id + 1);
    r.next_id += 2;
    r.credits -= 2;
    for id in [second, first] {
        r.send_echo_as(id);
        let p = r.expect_reply(id, Command::Echo);
        assert_eq!(p.status(), STATUS_SUCCESS, "ECHO {id} out of order");
    }
    r.echo();
    r.send_echo_as(first);
    let e = r.expect_disconnect(Duration::from_secs(10));
    eprintln!("MessageId reused: {e}");
    s.stats_until(Duration::from_secs(10), "second violation counted", |d| {
        field(d, "protocol_errors") == 2 && field(d, "connections") == 0
    });
    let _ = r.c.close(Duration::from_secs(2));
    let err = s.stderr();
    let logged = err.lines().filter(|l| l.contains("protocol violation"));
    assert_eq!(logged.count(), 2, "two protocol violations logged:\n{err}");

    // A fresh connection works.
    let mut r = side.raw(s.port);
    r.setup(&[0x0311]);
    r.echo();
    let fid = r.create("after.bin", CreateDisposition::OVERWRITE_IF);
    let data = pattern(5000, 11);
    r.write_inline(fid, 0, &data);
    assert_same(&r.read_inline(fid, 0, 5000), &data, "after.bin");
    r.close(fid);
    let _ = r.c.close(Duration::from_secs(2));
    s.stop();
}

// ---------------------------------------------------------------------------
// 6. Nothing leaks

/// `(name, total, free)` of each pool class in `stats --json`.
fn pool_classes(doc: &str) -> Vec<(String, u64, u64)> {
    let start = doc.find("\"classes\":[").expect("pool classes") + "\"classes\":[".len();
    let end = start + doc[start..].find(']').expect("end of the classes");
    doc[start..end]
        .split('}')
        .filter(|c| c.contains("\"name\""))
        .map(|c| {
            let name = c.split("\"name\":\"").nth(1).expect("class name");
            let name = name[..name.find('"').expect("closing quote")].to_string();
            (name, field(c, "total"), field(c, "free"))
        })
        .collect()
}

/// The provider counters that are gauges (they return to their value once
/// nothing is registered or granted any more).
const PROVIDER_GAUGES: [&str; 2] = ["registrations", "grants_live"];

fn qos_set_policy_request() -> Vec<u8> {
    let flow: smbdirect_protocol::sqos::Guid =
        "6a0b2c1d-0000-4000-8000-5e7e5e7e5e7e".parse().unwrap();
    let mut r = StorageQosControlRequestRepr::new(
        QosDialect::V1_1,
        QosOptions::from_bits(
            QosOptions::SET_LOGICAL_FLOW_ID.bits() | QosOptions::SET_POLICY.bits(),
        ),
        flow,
    );
    r.initiator_id = "6a0b2c1d-0000-4000-8000-000000000001".parse().unwrap();
    r.policy_id = smbdirect_protocol::sqos::Guid::NULL;
    r.limit = 1_000_000;
    r.initiator_name = Utf16Name::new("paths-test").unwrap();
    r.initiator_node_name = Utf16Name::new("host").unwrap();
    r.to_vec()
}

#[test]
fn everything_is_returned_after_the_connections_close() {
    let _serial = serial();
    let s = Server::start(&[]);
    // The provider counters appear within 100 ms of the start.
    let base = s.stats_until(Duration::from_secs(5), "provider counters", |d| {
        PROVIDER_GAUGES
            .iter()
            .all(|k| d.contains(&format!("\"{k}\":")))
    });
    let workers = base.matches("\"index\":").count() as u64;
    assert!(workers >= 1, "{base}");
    for (name, total, free) in pool_classes(&base) {
        let lent = if name == "receive" {
            LOANED_RECEIVES as u64 * workers
        } else {
            0
        };
        assert_eq!(
            free + lent,
            total,
            "class {name} before any connection: {base}"
        );
    }
    let mut side = Side::new(6);

    // L1 (library): an open with a Storage QoS flow, 1 MiB moved by RDMA,
    // then a READ still outstanding (its grant live) when it disconnects.
    let mut l1 = side.library(s.port);
    let f1 = create_file(&mut l1, "keep.bin");
    rdma_write_read(&mut l1, f1, 0, &pattern(MIB, 12));
    let (st, _) = l1
        .ioctl(
            f1,
            FSCTL_STORAGE_QOS_CONTROL,
            &qos_set_policy_request(),
            4096,
        )
        .expect("QoS SET_POLICY");
    assert_eq!(st, STATUS_SUCCESS);
    let io = l1.alloc_io_buf(MIB).expect("I/O buffer");

    // R2: an open left open, then a compound whose WRITE (not last) RDMA-reads
    // a revoked token: its connection dies while the message is held.
    let mut r2 = side.raw(s.port);
    r2.setup(&[0x0311]);
    r2.create("r2-open.bin", CreateDisposition::OVERWRITE_IF);
    let src2 = r2.c.alloc_buffer(MIB).expect("src");
    let g2 = r2.grants(src2, &[65536], Access::RemoteRead);
    r2.revoke(&g2);

    // R3: an open left open, then a reused MessageId.
    let mut r3 = side.raw(s.port);
    r3.setup(&[0x0311]);
    r3.create("r3-open.bin", CreateDisposition::OVERWRITE_IF);

    // R4: an open left open, then a compound with an RDMA WRITE in the
    // middle, sent just before the client goes away (grants live).
    let mut r4 = side.raw(s.port);
    r4.setup(&[0x0311]);
    r4.create("r4-open.bin", CreateDisposition::OVERWRITE_IF);
    let src4 = r4.c.alloc_buffer(MIB).expect("src");
    assert!(r4.c.write_buffer(src4, 0, &pattern(MIB, 13)));
    let g4 = r4.grants(src4, &[MIB / 2, MIB / 2], Access::RemoteRead);

    // L5 (library): a clean open/close, left connected with its session.
    let mut l5 = side.library(s.port);
    let f5 = create_file(&mut l5, "l5.bin");
    l5.write(f5, 0, &pattern(8192, 14), Transfer::Inline)
        .expect("inline write");
    l5.close(f5).expect("close");

    let doc = s.stats();
    assert_eq!(field(&doc, "connections"), 5, "{doc}");
    assert!(field(&doc, "opens") >= 4, "{doc}");
    assert_eq!(field(&doc, "sessions"), 5, "{doc}");
    assert!(field(&doc, "qos_opens") >= 1, "{doc}");

    // Now end them all, each its own way.
    l1.submit_read(f1, 0, MIB as u32, io, rdma(4, true))
        .expect("submit the READ left outstanding");
    let _ = l1.disconnect(Duration::from_millis(200));

    let wd2 = descs(&g2);
    let mut buf = vec![0u8; 8192];
    let mut w = CompoundWriter::new(&mut buf);
    let h = r2.header(Command::Create, 1);
    w.push(
        &h,
        &create_req("r2-held.bin", CreateDisposition::OVERWRITE_IF),
    )
    .unwrap();
    let h = Raw::related(r2.header(Command::Write, 1));
    w.push(
        &h,
        &write_req(FileId::ANY, 0, &[], Channel::RdmaV1, 65536, &wd2),
    )
    .unwrap();
    let h = Raw::related(r2.header(Command::Close, 1));
    w.push(&h, &close_req(FileId::ANY)).unwrap();
    let n = w.finish();
    r2.send(&buf[..n]);
    // The CREATE's response may come first; then the connection ends.
    match r2.recv(Duration::from_secs(10)) {
        Ok(reply) => {
            assert_eq!(reply.parts.len(), 1, "only the CREATE is answered");
            assert_eq!(reply.parts[0].header.command, Command::Create);
            r2.expect_disconnect(Duration::from_secs(10));
        }
        Err(ClientError::Timeout(_)) => panic!("neither a response nor a disconnect"),
        Err(_) => {}
    }

    r3.send_echo_as(1); // SESSION_SETUP's
    r3.expect_disconnect(Duration::from_secs(10));

    let wd4 = descs(&g4);
    let mut w = CompoundWriter::new(&mut buf);
    let h = r4.header(Command::Create, 1);
    w.push(
        &h,
        &create_req("r4-held.bin", CreateDisposition::OVERWRITE_IF),
    )
    .unwrap();
    let h = Raw::related(r4.header(Command::Write, 16));
    w.push(
        &h,
        &write_req(FileId::ANY, 0, &[], Channel::RdmaV1, MIB as u32, &wd4),
    )
    .unwrap();
    let h = Raw::related(r4.header(Command::Echo, 1));
    w.push(&h, &EchoRequestRepr).unwrap();
    let n = w.finish();
    r4.send(&buf[..n]);
    let _ = r4.c.close(Duration::from_millis(200));
    let _ = r2.c.close(Duration::from_millis(200));
    let _ = r3.c.close(Duration::from_millis(200));
    let _ = l5.disconnect(Duration::from_millis(200));

    // Once every client is gone, everything is back.
    let done = s.stats_until(Duration::from_secs(15), "everything returned", |d| {
        field(d, "connections") == 0
            && field(d, "opens") == 0
            && field(d, "sessions") == 0
            && field(d, "qos_opens") == 0
            && field(d, "qos_queued") == 0
            && pool_classes(d) == pool_classes(&base)
            && PROVIDER_GAUGES
                .iter()
                .all(|k| field(d, k) == field(&base, k))
    });
    assert_eq!(field(&done, "connections_total"), 5, "{done}");
    assert!(field(&done, "protocol_errors") >= 1, "{done}");
    s.stop();
}

// ---------------------------------------------------------------------------
// 7. The directory store's confinement

#[test]
fn directory_store_confines_paths() {
    let _serial = serial();
    let base = TempDir::new("confine");
    let root = base.path().join("store");
    let outside = base.path().join("outside");
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(&outside).unwrap();
    let victim = outside.join("victim.txt");
    std::fs::write(&victim, b"untouched\n").unwrap();
    let victim_mtime = std::fs::metadata(&victim).unwrap().modified().unwrap();
    std::os::unix::fs::symlink(&outside, root.join("to_outside")).unwrap();
    std::os::unix::fs::symlink(&victim, root.join("victim_link")).unwrap();
    std::fs::create_dir(root.join("sub")).unwrap();

    let s = Server::start(&["--store", root.to_str().unwrap()]);
    let mut side = Side::new(1);
    let mut c = side.library(s.port);
    let file = CreateOptions::NON_DIRECTORY_FILE;
    let dir = CreateOptions::DIRECTORY_FILE;

    // Through a symlink: refused, nothing outside created or changed.
    for (name, disposition, options) in [
        ("to_outside\\new.bin", CreateDisposition::OVERWRITE_IF, file),
        ("to_outside\\new.bin", CreateDisposition::CREATE, file),
        ("to_outside\\victim.txt", CreateDisposition::OPEN, file),
        ("to_outside\\victim.txt", CreateDisposition::OVERWRITE, file),
        ("victim_link", CreateDisposition::OPEN, file),
        ("victim_link", CreateDisposition::OVERWRITE_IF, file),
        ("victim_link", CreateDisposition::SUPERSEDE, file),
        ("to_outside", CreateDisposition::OPEN, dir),
        ("to_outside\\newdir", CreateDisposition::CREATE, dir),
    ] {
        match c.create(name, disposition, options) {
            Err(Smb2Error::Status(st)) => assert!(
                st == STATUS_OBJECT_NAME_INVALID || st == STATUS_ACCESS_DENIED,
                "CREATE {name:?} ({disposition:?}) through a symlink: {st}"
            ),
            other => panic!("CREATE {name:?} ({disposition:?}) through a symlink: {other:?}"),
        }
    }
    let mut entries: Vec<_> = std::fs::read_dir(&outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    entries.sort();
    assert_eq!(
        entries,
        ["victim.txt"],
        "something was created outside the store"
    );
    assert_eq!(std::fs::read(&victim).unwrap(), b"untouched\n");
    assert_eq!(
        std::fs::metadata(&victim).unwrap().modified().unwrap(),
        victim_mtime
    );
    assert!(std::fs::symlink_metadata(root.join("victim_link"))
        .unwrap()
        .file_type()
        .is_symlink());

    // `..` components: STATUS_OBJECT_NAME_INVALID.
    for name in [
        "..",
        "..\\escape.bin",
        "sub\\..\\..\\escape.bin",
        "sub\\..",
        "sub\\..\\x",
    ] {
        for disposition in [CreateDisposition::OVERWRITE_IF, CreateDisposition::OPEN] {
            match c.create(name, disposition, file) {
                Err(Smb2Error::Status(st)) => {
                    assert_eq!(st, STATUS_OBJECT_NAME_INVALID, "CREATE {name:?}")
                }
                other => panic!("CREATE {name:?}: {other:?}"),
            }
        }
    }
    assert!(!base.path().join("escape.bin").exists());
    assert!(!root.join("x").exists());

    // Inside the store all is well, and the bytes land under the root.
    let f = c
        .create("sub\\inside.bin", CreateDisposition::OVERWRITE_IF, file)
        .expect("create inside")
        .file_id;
    let data = pattern(200_000, 15);
    rdma_write_read(&mut c, f, 0, &data);
    c.close(f).expect("close");
    let _ = c.disconnect(Duration::from_secs(2));
    s.stop();
    assert_same(
        &std::fs::read(root.join("sub").join("inside.bin")).unwrap(),
        &data,
        "DIR/sub/inside.bin",
    );
}
