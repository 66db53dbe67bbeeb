//! The SMB2 client library (`smbdirect_dataplane::smb2::client`) against
//! `smbdirectd serve --provider soft --upper smb2` as a child process:
//! NEGOTIATE of each SMB 3.x dialect, sessions and trees, CREATE/WRITE/
//! READ/CLOSE inline and through SMB2_CHANNEL_RDMA_V1(_INVALIDATE) with
//! 1, 2 and 16 buffer descriptors, 32 pipelined requests on one
//! connection, and server errors surfaced as `Smb2Error::Status`.

mod common;
use common::*;

use smbdirect_dataplane::provider::soft::{SoftConfig, SoftProvider};
use smbdirect_dataplane::provider::{MemoryRegion, Provider};
use smbdirect_dataplane::smb2::client::{
    IoBuf, MessageId, Smb2Client, Smb2ClientOptions, Smb2Error, Transfer,
};
use smbdirect_hugepages::{Backing, BufferPool, PoolConfig, SizeClass, SliceAllocator};
use smbdirect_protocol::ntstatus::*;
use smbdirect_protocol::smb2::{
    CreateAction, CreateDisposition, CreateOptions, Dialect, FileId, HashAlgorithm, SessionFlags,
    ShareType, FSCTL_PIPE_TRANSCEIVE, FSCTL_PIPE_WAIT,
};
use smbdirect_protocol::smbd::SmbdConfig;
use smbdirect_protocol::sqos::client::{LogicalFlow, PolicyParams};
use smbdirect_protocol::sqos::{Dialect as QosDialect, FlowStatus, Guid};
use smbdirect_protocol::time::Duration as PDuration;
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

const QD: usize = 32;
const IO: usize = 4096;

/// Counts the heap allocations of the threads that ask for it (the
/// steady-state test below).
struct CountingAlloc;

std::thread_local! {
    static COUNTING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    static ALLOCATIONS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn note_allocation() {
    if COUNTING.try_with(|c| c.get()).unwrap_or(false) {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
    }
}

// SAFETY: every call is forwarded to the system allocator unchanged.
unsafe impl std::alloc::GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: as above.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
        note_allocation();
        // SAFETY: as above.
        unsafe { std::alloc::System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// Runs `f` and returns the heap allocations this thread made meanwhile.
fn allocations_in(f: impl FnOnce()) -> u64 {
    ALLOCATIONS.with(|n| n.set(0));
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    ALLOCATIONS.with(|n| n.get())
}

fn cfg() -> SmbdConfig {
    SmbdConfig {
        receive_credit_max: 32,
        send_credit_target: 32,
        ..SmbdConfig::default()
    }
}

/// The client's pool: one slice, reused connection after connection. The
/// `io4k` class holds the pipelined 4 KiB buffers (so they do not come out
/// of the 8 KiB receive class).
fn client_pool(provider: &SoftProvider) -> (BufferPool, MemoryRegion) {
    let pool = PoolConfig::new(48 << 20, 1)
        .class(SizeClass::new("send", 1364).per_slice(256))
        .class(SizeClass::new("io4k", 4096).per_slice(2 * QD as u32))
        .class(SizeClass::new("receive", 8192).per_slice(64))
        .class(SizeClass::new("io64k", 65536).per_slice(16))
        .class(SizeClass::new("mid", 1 << 20).per_slice(6))
        .class(SizeClass::new("big", 8 << 20).per_slice(2))
        .backing(Backing::SharedMemfd)
        .build()
        .unwrap();
    // SAFETY: the pool outlives the provider's use of it (whole test).
    let mr = unsafe { provider.register_pool(&pool) }.unwrap();
    (pool, mr)
}

/// Deterministic test bytes.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

struct Env {
    d: Option<Daemon>,
    port: u16,
    provider: SoftProvider,
    _pool: BufferPool,
    mr: MemoryRegion,
    alloc: Option<SliceAllocator>,
}

impl Env {
    fn start() -> Env {
        Self::start_with(SoftConfig::default())
    }

    /// With the client's provider configured as `provider`.
    fn start_with(provider: SoftConfig) -> Env {
        Self::start_serving(provider, &["--upper", "smb2"])
    }

    /// A daemon started with `args`.
    fn start_serving(provider: SoftConfig, args: &[&str]) -> Env {
        let port = free_port();
        let d = spawn(port, args);
        let provider = SoftProvider::with_config(provider).unwrap();
        let (pool, mr) = client_pool(&provider);
        let alloc = Some(pool.claim_slice(0).unwrap());
        Env {
            d: Some(d),
            port,
            provider,
            _pool: pool,
            mr,
            alloc,
        }
    }

    fn connect_with(&mut self, options: Smb2ClientOptions) -> Smb2Client<SoftProvider> {
        let addr = format!("127.0.0.1:{}", self.port).parse().unwrap();
        let alloc = self.alloc.take().expect("slice free");
        Smb2Client::connect(
            &self.provider,
            addr,
            cfg(),
            alloc,
            self.mr,
            Duration::from_secs(10),
            options,
        )
        .expect("connect")
    }

    fn connect(&mut self) -> Smb2Client<SoftProvider> {
        self.connect_with(Smb2ClientOptions::default())
    }

    /// Connects, negotiates `dialect`, sets up an anonymous session and
    /// connects to `data`.
    fn session(&mut self, dialect: Dialect) -> Smb2Client<SoftProvider> {
        let mut c = self.connect();
        c.negotiate(&[dialect]).expect("negotiate");
        c.session_setup_anonymous().expect("session setup");
        c.tree_connect("data").expect("tree connect");
        c
    }

    /// Stops the daemon (a clean exit is part of every test).
    fn stop(mut self) {
        if let Some(d) = self.d.take() {
            let _ = terminate(d);
        }
    }

    fn done(&mut self, c: Smb2Client<SoftProvider>) {
        self.alloc = Some(c.disconnect(Duration::from_secs(2)));
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        // A failing test shows what the server said.
        if let (true, Some(d)) = (std::thread::panicking(), &mut self.d) {
            eprintln!("daemon stderr:\n{}", d.stderr.lock().unwrap());
            eprintln!("client provider: {:?}", self.provider.stats());
            if let Ok(None) = d.child.try_wait() {
                eprintln!("daemon stats: {}", stats_json(d));
            }
        }
    }
}

fn status(r: Result<impl std::fmt::Debug, Smb2Error>) -> NtStatus {
    match r {
        Err(Smb2Error::Status(s)) => s,
        other => panic!("expected an error status, got {other:?}"),
    }
}

fn create(c: &mut Smb2Client<SoftProvider>, name: &str) -> FileId {
    c.create(
        name,
        CreateDisposition::OVERWRITE_IF,
        CreateOptions::NON_DIRECTORY_FILE,
    )
    .expect("create")
    .file_id
}

/// The set-up of the pipelined tests: creates `name`, writes `blocks`
/// blocks of [`IO`] bytes of pattern `seed` to it through `t`, and
/// allocates [`QD`] I/O buffers of [`IO`] bytes. Returns the file, its
/// contents and the buffers.
fn pipelined_setup(
    c: &mut Smb2Client<SoftProvider>,
    name: &str,
    blocks: usize,
    seed: u64,
    t: Transfer,
) -> (FileId, Vec<u8>, Vec<IoBuf>) {
    let fid = create(c, name);
    let file = pattern(blocks * IO, seed);
    assert_eq!(c.write(fid, 0, &file, t).unwrap() as usize, file.len());
    let bufs = (0..QD).map(|_| c.alloc_io_buf(IO).unwrap()).collect();
    (fid, file, bufs)
}

#[test]
fn negotiates_each_smb3_dialect_and_records_the_servers_limits() {
    let _serial = serial();
    let mut env = Env::start();
    let all = [Dialect::SMB_3_0, Dialect::SMB_3_0_2, Dialect::SMB_3_1_1];
    let cases: [(&[Dialect], Dialect); 4] = [
        (&all[0..1], Dialect::SMB_3_0),
        (&all[1..2], Dialect::SMB_3_0_2),
        (&all[2..3], Dialect::SMB_3_1_1),
        (&all, Dialect::SMB_3_1_1),
    ];
    for (offer, want) in cases {
        let mut c = env.connect();
        assert_eq!(c.credits().available(), 1, "one credit before NEGOTIATE");
        let info = c.negotiate(offer).expect("negotiate");
        assert_eq!(info.dialect, want);
        assert_eq!(c.negotiated(), Some(&info));
        for v in [
            info.max_read_size,
            info.max_write_size,
            info.max_transact_size,
        ] {
            assert!(v >= 1 << 20, "{info:?}");
        }
        assert!(c.credits().multi_credit(), "LARGE_MTU offered");
        assert!(c.credits().available() > QD as u32, "{:?}", c.credits());
        if want == Dialect::SMB_3_1_1 {
            assert_eq!(info.preauth_hash, Some(HashAlgorithm::SHA_512));
            assert_eq!(info.server_salt.len(), 32);
        } else {
            assert_eq!(info.preauth_hash, None);
        }
        // NEGOTIATE is once per connection.
        assert!(matches!(c.negotiate(offer), Err(Smb2Error::Invalid(_))));

        let s = c.session_setup_anonymous().expect("session setup");
        assert_ne!(s.session_id, 0);
        assert!(s
            .flags
            .intersects(SessionFlags::IS_NULL | SessionFlags::IS_GUEST));
        let t = c.tree_connect("data").expect("tree connect");
        assert_eq!(t.share_type, ShareType::DISK);
        assert_ne!(t.tree_id, 0);
        assert_eq!(c.tree_id(), t.tree_id);

        // A little I/O in every dialect, RDMA included.
        let fid = create(&mut c, "dialect.bin");
        let data = pattern(70_000, u64::from(want.0));
        let rdma = Transfer::Rdma {
            descriptors: 2,
            invalidate: false,
        };
        assert_eq!(c.write(fid, 0, &data, rdma).unwrap(), 70_000);
        assert_eq!(c.read(fid, 0, 70_000, Transfer::Inline).unwrap(), data);
        let invalidate = Transfer::Rdma {
            descriptors: 1,
            invalidate: true,
        };
        if want == Dialect::SMB_3_0 {
            // SMB2_CHANNEL_RDMA_V1_INVALIDATE is 3.0.2 and later.
            assert!(matches!(
                c.read(fid, 0, 100, invalidate),
                Err(Smb2Error::Invalid(_))
            ));
        } else {
            assert_eq!(c.read(fid, 0, 70_000, invalidate).unwrap(), data);
        }
        c.close(fid).unwrap();

        c.echo().unwrap();
        c.tree_disconnect().unwrap();
        assert_eq!(c.tree_id(), 0);
        c.logoff().unwrap();
        assert_eq!(c.session_id(), 0);
        assert_eq!(c.outstanding(), 0);
        let st = c.stats();
        assert_eq!(st.requests, st.responses);
        assert_eq!(st.discarded, 0);
        env.done(c);
    }
    env.stop();
}

#[test]
fn create_write_read_close_inline_and_rdma_with_1_2_and_16_descriptors() {
    let _serial = serial();
    let mut env = Env::start();
    let mut c = env.session(Dialect::SMB_3_1_1);

    let created = c
        .create(
            "rdma.bin",
            CreateDisposition::OVERWRITE_IF,
            CreateOptions::NON_DIRECTORY_FILE,
        )
        .unwrap();
    assert_eq!(created.action, CreateAction::CREATED);
    assert_eq!(created.end_of_file, 0);
    let fid = created.file_id;

    // Inline.
    let small = pattern(3000, 1);
    assert_eq!(c.write(fid, 0, &small, Transfer::Inline).unwrap(), 3000);
    assert_eq!(c.read(fid, 0, 3000, Transfer::Inline).unwrap(), small);
    c.flush(fid).unwrap();

    // RDMA: 256 KiB + 123 bytes (CreditCharge 5) through 1, 2 and 16
    // descriptors, with and without invalidation, written and read back.
    let len = (256 << 10) + 123;
    let mut end = 0;
    let mut invalidating_ops = 0;
    for (i, (descriptors, invalidate)) in [
        (1, false),
        (1, true),
        (2, false),
        (2, true),
        (16, false),
        (16, true),
    ]
    .into_iter()
    .enumerate()
    {
        let t = Transfer::Rdma {
            descriptors,
            invalidate,
        };
        let data = pattern(len, 10 + i as u64);
        let off = 4096 + (i * len) as u64;
        let before = c.credits().next_message_id();
        assert_eq!(c.write(fid, off, &data, t).unwrap() as usize, len, "{t:?}");
        // MessageId advances by CreditCharge = ceil(len / 64 KiB).
        assert_eq!(c.credits().next_message_id() - before, 5);
        let back = c.read(fid, off, len as u32, t).unwrap();
        assert!(back == data, "RDMA round trip differs with {t:?}");
        if invalidate {
            invalidating_ops += 2;
        }
        end = off + len as u64;
    }
    // Whole-file read through 16 descriptors covers every range at once.
    let whole = c
        .read(
            fid,
            4096,
            (end - 4096) as u32,
            Transfer::Rdma {
                descriptors: 16,
                invalidate: true,
            },
        )
        .unwrap();
    invalidating_ops += 1;
    for i in 0..6 {
        assert!(whole[i * len..(i + 1) * len] == pattern(len, 10 + i as u64)[..]);
    }
    // Every grant was either invalidated by the server (the first of each
    // invalidating request) or revoked.
    let st = c.stats();
    assert_eq!(st.invalidated, invalidating_ops);
    assert_eq!(st.grants, st.revokes + st.invalidated, "{st:?}");

    c.close(fid).unwrap();
    // The handle is gone.
    assert_eq!(
        status(c.read(fid, 0, 10, Transfer::Inline)),
        STATUS_FILE_CLOSED
    );
    // Reopened, the file has everything written.
    let reopened = c
        .create(
            "rdma.bin",
            CreateDisposition::OPEN,
            CreateOptions::NON_DIRECTORY_FILE,
        )
        .unwrap();
    assert_eq!(reopened.action, CreateAction::OPENED);
    assert_eq!(reopened.end_of_file, end);
    assert_eq!(
        c.read(reopened.file_id, 0, 3000, Transfer::Inline).unwrap(),
        small
    );
    c.close(reopened.file_id).unwrap();
    env.done(c);
    env.stop();
}

/// Runs `total` requests with `QD` outstanding: `submit(c, i, buf)` starts
/// request `i` with `buf`; `check(c, i, bytes, buf)` verifies its
/// completion. Returns the most requests outstanding at once as the caller
/// sees them (submitted, completion not polled yet) and on the wire (no
/// response yet).
fn pipeline(
    c: &mut Smb2Client<SoftProvider>,
    bufs: &[IoBuf],
    total: usize,
    mut submit: impl FnMut(&mut Smb2Client<SoftProvider>, usize, IoBuf) -> Result<MessageId, Smb2Error>,
    mut check: impl FnMut(&Smb2Client<SoftProvider>, usize, u32, IoBuf),
) -> (usize, usize) {
    let mut free: VecDeque<IoBuf> = bufs.iter().copied().collect();
    let mut inflight: HashMap<MessageId, usize> = HashMap::new();
    let (mut next, mut done, mut peak, mut wire) = (0, 0, 0, 0);
    while done < total {
        while next < total {
            let Some(b) = free.pop_front() else { break };
            match submit(c, next, b) {
                Ok(id) => {
                    inflight.insert(id, next);
                    next += 1;
                }
                Err(Smb2Error::NoCredits { .. }) => {
                    free.push_front(b);
                    break;
                }
                Err(e) => panic!("submit {next}: {e}"),
            }
        }
        peak = peak.max(inflight.len());
        wire = wire.max(c.outstanding());
        let comp = c
            .poll(Duration::from_secs(10))
            .expect("poll")
            .expect("a completion");
        let i = inflight.remove(&comp.id).expect("a submitted request");
        let n = comp
            .result
            .unwrap_or_else(|e| panic!("request {i} failed: {e}"));
        let b = comp.buf.expect("its buffer");
        check(c, i, n, b);
        free.push_back(b);
        done += 1;
    }
    assert_eq!(c.outstanding(), 0);
    (peak, wire)
}

#[test]
fn pipelined_4k_reads_and_writes_keep_32_requests_outstanding() {
    let _serial = serial();
    let mut env = Env::start();
    let mut c = env.session(Dialect::SMB_3_1_1);
    const BLOCKS: usize = 128;
    let t = Transfer::Rdma {
        descriptors: 4,
        invalidate: true,
    };
    let (fid, mut file, bufs) = pipelined_setup(&mut c, "qd.bin", BLOCKS, 77, t);
    let block = |i: usize| (i * 37) % BLOCKS;

    // Reads, RDMA with invalidation, then inline.
    for transfer in [
        Transfer::Rdma {
            descriptors: 1,
            invalidate: true,
        },
        Transfer::Inline,
    ] {
        let total = 8 * QD;
        let expect = file.clone();
        let peak = pipeline(
            &mut c,
            &bufs,
            total,
            |c, i, b| c.submit_read(fid, (block(i) * IO) as u64, IO as u32, b, transfer),
            |c, i, n, b| {
                assert_eq!(n as usize, IO);
                let got = c.io_buf(b).expect("buffer is back");
                let off = block(i) * IO;
                assert!(
                    got == &expect[off..off + IO],
                    "read {i} ({transfer:?}) differs"
                );
            },
        );
        assert_eq!(peak, (QD, QD), "{transfer:?}");
    }

    // Writes, RDMA through 2 descriptors: new contents for every block.
    let peak = pipeline(
        &mut c,
        &bufs,
        BLOCKS,
        |c, i, b| {
            c.io_buf_mut(b)
                .unwrap()
                .copy_from_slice(&pattern(IO, 1000 + i as u64));
            c.submit_write(
                fid,
                (i * IO) as u64,
                IO as u32,
                b,
                Transfer::Rdma {
                    descriptors: 2,
                    invalidate: false,
                },
            )
        },
        |_, _, n, _| assert_eq!(n as usize, IO),
    );
    // Grants are drained in batches, which may retire responses while
    // submitting: the 32 are the caller's, not always on the wire at once.
    assert_eq!(peak.0, QD, "{peak:?}");
    for i in 0..BLOCKS {
        file[i * IO..(i + 1) * IO].copy_from_slice(&pattern(IO, 1000 + i as u64));
    }
    let back = c
        .read(
            fid,
            0,
            file.len() as u32,
            Transfer::Rdma {
                descriptors: 8,
                invalidate: false,
            },
        )
        .unwrap();
    assert!(back == file, "pipelined writes differ");

    // Flushes and echoes pipeline too.
    let a = c.submit_flush(fid).unwrap();
    let b = c.submit_echo().unwrap();
    assert_eq!(c.wait(b).unwrap().result.unwrap(), 0);
    assert_eq!(c.wait(a).unwrap().result.unwrap(), 0);

    let st = c.stats();
    assert_eq!(st.requests, st.responses);
    assert_eq!(st.grants, st.revokes + st.invalidated, "{st:?}");
    for b in bufs {
        c.free_io_buf(b).unwrap();
    }
    c.close(fid).unwrap();
    env.done(c);
    env.stop();
}

/// A daemon serving SMB2 from a directory store in `dir` (made anew, empty).
fn serve_dir_store(dir: &std::path::Path) -> Env {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    Env::start_serving(
        SoftConfig::default(),
        &["--upper", "smb2", "--store", dir.to_str().unwrap()],
    )
}

/// Whether /dev/shm is a tmpfs (where a directory store reads and writes
/// synchronously).
fn shm_is_tmpfs() -> bool {
    // SAFETY: zeroed statfs is valid; a NUL-terminated path, an out-pointer.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::statfs(c"/dev/shm".as_ptr(), &mut st) } == 0;
    ok && st.f_type as i64 == 0x0102_1994 // TMPFS_MAGIC
}

/// A directory store on tmpfs reads synchronously and sends each READ's
/// data from its staging run (zero-copy): many more pipelined RDMA READs
/// than the store has operation slots (512) all come back with the right
/// bytes, and the daemon exits clean (every pool buffer back).
#[test]
fn pipelined_rdma_reads_of_a_tmpfs_directory_store_outlast_its_slots() {
    let _serial = serial();
    let shm = std::path::Path::new("/dev/shm");
    if !shm_is_tmpfs() {
        eprintln!("skipped: /dev/shm is not a tmpfs here");
        return;
    }
    let dir = shm.join(format!("smbdirectd-client-zc-{}", std::process::id()));
    let mut env = serve_dir_store(&dir);
    let mut c = env.session(Dialect::SMB_3_1_1);
    const BLOCKS: usize = 64;
    let t = Transfer::Rdma {
        descriptors: 2,
        invalidate: false,
    };
    let (fid, file, bufs) = pipelined_setup(&mut c, "zc.bin", BLOCKS, 91, t);
    let block = |i: usize| (i * 29) % BLOCKS;
    let total = 2_000;
    let peak = pipeline(
        &mut c,
        &bufs,
        total,
        |c, i, b| {
            c.submit_read(
                fid,
                (block(i) * IO) as u64,
                IO as u32,
                b,
                Transfer::Rdma {
                    descriptors: 1,
                    invalidate: i % 2 == 0,
                },
            )
        },
        |c, i, n, b| {
            assert_eq!(n as usize, IO, "read {i}");
            let off = block(i) * IO;
            assert!(
                c.io_buf(b).unwrap() == &file[off..off + IO],
                "read {i} differs"
            );
        },
    );
    assert_eq!(peak.0, QD);
    // One READ larger than the staging chunk, at an odd offset, across
    // the end of the file.
    let back = c.read(fid, 1000, (BLOCKS * IO) as u32, t).unwrap();
    assert!(back == file[1000..], "the long read differs");
    for b in bufs {
        c.free_io_buf(b).unwrap();
    }
    c.close(fid).unwrap();
    env.done(c);
    env.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A directory store takes each RDMA-channel WRITE's data straight into a
/// staging run (zero-copy) and writes it out from there: synchronously on
/// tmpfs, through io_uring on a disk file system. Many more pipelined
/// RDMA WRITEs than the store has operation slots (512), then one larger
/// than a staging chunk at an odd offset: the file holds exactly what was
/// written (read back through SMB2 and from the file itself), and the
/// daemon exits clean.
#[test]
fn pipelined_rdma_writes_to_a_directory_store_land_from_their_staging_runs() {
    let _serial = serial();
    let mut dirs = vec![(std::env::temp_dir(), "io_uring")];
    if shm_is_tmpfs() {
        dirs.push((std::path::PathBuf::from("/dev/shm"), "synchronous (tmpfs)"));
    } else {
        eprintln!("/dev/shm is not a tmpfs here: only the io_uring case runs");
    }
    for (base, path) in dirs {
        let dir = base.join(format!("smbdirectd-client-zcw-{}", std::process::id()));
        let mut env = serve_dir_store(&dir);
        let mut c = env.session(Dialect::SMB_3_1_1);
        const BLOCKS: usize = 64;
        let fid = create(&mut c, "zw.bin");
        let bufs: Vec<IoBuf> = (0..QD).map(|_| c.alloc_io_buf(IO).unwrap()).collect();
        let block = |i: usize| (i * 29) % BLOCKS;
        let data = |i: usize| pattern(IO, 500 + i as u64);
        let total = 2_000;
        // Writes i and i + 64 go to one block; at most QD (32) are in
        // flight, so the later one starts after the earlier finished.
        pipeline(
            &mut c,
            &bufs,
            total,
            |c, i, b| {
                c.io_buf_mut(b).unwrap().copy_from_slice(&data(i));
                c.submit_write(
                    fid,
                    (block(i) * IO) as u64,
                    IO as u32,
                    b,
                    Transfer::Rdma {
                        descriptors: 1,
                        invalidate: i % 2 == 0,
                    },
                )
            },
            |_, i, n, _| assert_eq!(n as usize, IO, "{path}: write {i}"),
        );
        let mut want = vec![0u8; BLOCKS * IO];
        for i in 0..total {
            let off = block(i) * IO;
            want[off..off + IO].copy_from_slice(&data(i));
        }
        // Larger than a staging chunk (64 KiB), at an odd offset, across
        // the end of the file.
        let big = pattern(300_000, 77);
        let t = Transfer::Rdma {
            descriptors: 2,
            invalidate: false,
        };
        assert_eq!(c.write(fid, 250_001, &big, t).unwrap() as usize, big.len());
        want.resize(250_001, 0);
        want.extend_from_slice(&big);
        let back = c.read(fid, 0, want.len() as u32, t).unwrap();
        assert!(back == want, "{path}: the file read back differs");
        for b in bufs {
            c.free_io_buf(b).unwrap();
        }
        c.close(fid).unwrap();
        env.done(c);
        env.stop();
        let on_disk = std::fs::read(dir.join("zw.bin")).unwrap();
        assert!(on_disk == want, "{path}: the file on disk differs");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn server_errors_surface_as_status_and_non_qos_ioctl_is_not_supported() {
    let _serial = serial();
    let mut env = Env::start();
    let mut c = env.connect_with(Smb2ClientOptions {
        timeout: Duration::from_secs(10),
        ..Smb2ClientOptions::default()
    });
    c.negotiate(&[Dialect::SMB_3_0_2]).unwrap();
    c.session_setup_anonymous().unwrap();
    assert_eq!(status(c.tree_connect("nope")), STATUS_BAD_NETWORK_NAME);
    c.tree_connect("data").unwrap();

    assert_eq!(
        status(c.create(
            "missing.bin",
            CreateDisposition::OPEN,
            CreateOptions::NON_DIRECTORY_FILE
        )),
        STATUS_OBJECT_NAME_NOT_FOUND
    );
    let fid = c
        .create(
            "e.bin",
            CreateDisposition::CREATE,
            CreateOptions::NON_DIRECTORY_FILE,
        )
        .unwrap()
        .file_id;
    assert_eq!(
        status(c.create(
            "e.bin",
            CreateDisposition::CREATE,
            CreateOptions::NON_DIRECTORY_FILE
        )),
        STATUS_OBJECT_NAME_COLLISION
    );

    // An IOCTL this server does not implement.
    assert_eq!(
        status(c.ioctl(fid, FSCTL_PIPE_TRANSCEIVE, &[], 4096)),
        STATUS_NOT_SUPPORTED
    );
    assert_eq!(
        status(c.ioctl(FileId::ANY, FSCTL_PIPE_WAIT, &[], 4096)),
        STATUS_NOT_SUPPORTED
    );

    // READ of an empty file.
    assert_eq!(
        status(c.read(fid, 0, 100, Transfer::Inline)),
        STATUS_END_OF_FILE
    );
    let rdma = Transfer::Rdma {
        descriptors: 2,
        invalidate: true,
    };
    // A failed request with SMB2_CHANNEL_RDMA_V1_INVALIDATE is answered with
    // a Send with Invalidate of its token too (Linux's cifs.ko counts on it
    // and re-registers the buffer: on rxe that failed and broke the
    // connection after every read past the end of a file).
    let invalidated = c.stats().invalidated;
    assert_eq!(status(c.read(fid, 0, 8192, rdma)), STATUS_END_OF_FILE);
    assert_eq!(c.stats().invalidated, invalidated + 1, "EOF READ");

    // A failed pipelined request gives its buffer back with the status.
    let b = c.alloc_io_buf(IO).unwrap();
    let id = c.submit_read(fid, 0, IO as u32, b, rdma).unwrap();
    // Lent: neither readable nor lendable.
    assert!(c.io_buf(b).is_none());
    assert!(matches!(
        c.submit_read(fid, 0, IO as u32, b, Transfer::Inline),
        Err(Smb2Error::Invalid(_))
    ));
    let comp = c.wait(id).unwrap();
    assert!(matches!(comp.result, Err(Smb2Error::Status(s)) if s == STATUS_END_OF_FILE));
    assert_eq!(c.stats().invalidated, invalidated + 2, "pipelined EOF READ");
    assert_eq!(comp.buf, Some(b));
    assert!(c.io_buf(b).is_some());

    // Local checks: over MaxReadSize, more descriptors than bytes.
    let max = c.negotiated().unwrap().max_read_size;
    assert!(matches!(
        c.submit_read(fid, 0, max + 1, b, Transfer::Inline),
        Err(Smb2Error::Invalid(_))
    ));
    assert!(matches!(
        c.submit_read(
            fid,
            0,
            8,
            b,
            Transfer::Rdma {
                descriptors: 9,
                invalidate: false
            }
        ),
        Err(Smb2Error::Invalid(_))
    ));

    c.close(fid).unwrap();
    assert_eq!(status(c.flush(fid)), STATUS_FILE_CLOSED);
    assert_eq!(status(c.close(fid)), STATUS_FILE_CLOSED);
    assert_eq!(
        status(c.write(fid, 0, &[7; 8192], rdma)),
        STATUS_FILE_CLOSED
    );
    assert_eq!(status(c.read(fid, 0, 8192, rdma)), STATUS_FILE_CLOSED);
    assert_eq!(
        c.stats().invalidated,
        invalidated + 4,
        "WRITE and READ on a closed file"
    );
    // Every grant was released despite the errors; the connection goes on.
    let st = c.stats();
    assert_eq!(st.grants, st.revokes + st.invalidated, "{st:?}");
    c.echo().unwrap();
    assert!(c.credits().available() >= 1);

    // After LOGOFF the session is gone on the server.
    c.logoff().unwrap();
    c.set_tree_id(1);
    assert!(c
        .create(
            "x",
            CreateDisposition::OPEN_IF,
            CreateOptions::NON_DIRECTORY_FILE
        )
        .is_err());
    env.done(c);
    env.stop();
}

#[test]
fn storage_qos_helpers_set_update_and_get_status_in_both_sqos_dialects() {
    let _serial = serial();
    let mut env = Env::start();
    let mut c = env.session(Dialect::SMB_3_1_1);
    for (i, dialect) in [QosDialect::V1_0, QosDialect::V1_1].into_iter().enumerate() {
        let fid = create(&mut c, &format!("qos{i}.bin"));
        let flow_id = Guid::from_bytes([0x40 + i as u8; 16]);
        let mut flow = LogicalFlow::new(flow_id, dialect);
        let policy = PolicyParams {
            limit: 3000,
            ..PolicyParams::default()
        };
        let now = c.now();
        let r = c
            .qos_set_policy(fid, &mut flow, policy, now)
            .expect("SET_POLICY")
            .expect("its GET_STATUS response");
        assert_eq!(r.dialect, dialect);
        assert_eq!(r.logical_flow_id, flow_id);
        assert_eq!(r.maximum_io_rate, 3000);
        assert!(flow.is_associated());
        assert_eq!(flow.maximum_io_rate(), 3000);

        c.write(fid, 0, &pattern(8192, 5), Transfer::Inline)
            .unwrap();
        flow.record_io(
            8192,
            PDuration::from_micros(100),
            PDuration::from_micros(80),
        );
        let now = c.now();
        c.qos_update_counters(fid, &mut flow, now)
            .expect("UPDATE_COUNTERS");
        assert_eq!(flow.io_count_increment(), 0, "counters were sent");
        let now = c.now();
        let st = c.qos_get_status(fid, &mut flow, now).expect("GET_STATUS");
        assert_eq!(st.dialect, dialect);
        assert_eq!(st.maximum_io_rate, 3000);
        assert_eq!(st.status, FlowStatus::Ok);
        assert_eq!(flow.last_status(), Some(FlowStatus::Ok));
        assert!(flow.poll_timeout().is_some(), "the status timer runs");
        c.close(fid).unwrap();
    }
    env.done(c);
    env.stop();
}

#[test]
fn steady_state_pipelined_io_does_not_allocate_in_the_client() {
    let _serial = serial();
    let mut env = Env::start();
    let mut c = env.session(Dialect::SMB_3_1_1);
    const BLOCKS: usize = 64;
    let t = Transfer::Rdma {
        descriptors: 2,
        invalidate: true,
    };
    let (fid, file, bufs) = pipelined_setup(&mut c, "steady.bin", BLOCKS, 5, t);
    // Request k: block (k * 7) % BLOCKS, by kind k % 3: inline READ, RDMA
    // READ with invalidation, RDMA WRITE (of the same bytes) through 2
    // descriptors.
    let mut inflight: Vec<(MessageId, usize)> = Vec::with_capacity(QD);
    let mut run = |c: &mut Smb2Client<SoftProvider>, total: usize| {
        let submit = |c: &mut Smb2Client<SoftProvider>, k: usize, b: IoBuf| {
            let block = (k * 7) % BLOCKS;
            let off = block * IO;
            match k % 3 {
                0 => c.submit_read(fid, off as u64, IO as u32, b, Transfer::Inline),
                1 => c.submit_read(
                    fid,
                    off as u64,
                    IO as u32,
                    b,
                    Transfer::Rdma {
                        descriptors: 1,
                        invalidate: true,
                    },
                ),
                _ => {
                    c.io_buf_mut(b)
                        .unwrap()
                        .copy_from_slice(&file[off..off + IO]);
                    c.submit_write(
                        fid,
                        off as u64,
                        IO as u32,
                        b,
                        Transfer::Rdma {
                            descriptors: 2,
                            invalidate: false,
                        },
                    )
                }
            }
        };
        let mut next = 0;
        for &b in &bufs {
            inflight.push((submit(c, next, b).expect("submit"), next));
            next += 1;
        }
        while !inflight.is_empty() {
            let comp = c
                .poll(Duration::from_secs(10))
                .expect("poll")
                .expect("a completion");
            let i = inflight
                .iter()
                .position(|(id, _)| *id == comp.id)
                .expect("submitted");
            let (_, k) = inflight.swap_remove(i);
            assert_eq!(comp.result.as_ref().ok(), Some(&(IO as u32)));
            let b = comp.buf.expect("buffer");
            if k % 3 != 2 {
                let off = ((k * 7) % BLOCKS) * IO;
                assert!(c.io_buf(b).unwrap() == &file[off..off + IO], "read {k}");
            }
            if next < total {
                inflight.push((submit(c, next, b).expect("submit"), next));
                next += 1;
            }
        }
    };
    run(&mut c, 4 * QD);
    let n = allocations_in(|| run(&mut c, 32 * QD));
    assert_eq!(n, 0, "the client allocated {n} times in steady state");
    let st = c.stats();
    assert_eq!(st.grants, st.revokes + st.invalidated, "{st:?}");
    env.done(c);
    env.stop();
}

#[test]
fn invalidated_grants_are_given_back_so_rdma_io_never_runs_out_of_windows() {
    // The client's provider modelled on verbs: 64 memory windows per queue
    // pair (VerbsConfig::mws_per_qp), and a window the server invalidated
    // with Send with Invalidate stays taken until the client deregisters it
    // ([MS-SMBD] 3.1.4.4). Before the fix the 65th invalidating request
    // found no window.
    let mut env = Env::start_with(SoftConfig {
        grants_per_qp: 64,
        reclaim_invalidated: false,
        ..SoftConfig::default()
    });
    let mut c = env.session(Dialect::SMB_3_1_1);
    let fid = create(&mut c, "invalidate.bin");
    let t = Transfer::Rdma {
        descriptors: 2,
        invalidate: true,
    };
    let rounds = 3 * 64;
    for i in 0..rounds {
        let data = pattern(4096, 7000 + i);
        let off = (i % 8) * 4096;
        assert_eq!(c.write(fid, off, &data, t).expect("write") as usize, 4096);
        assert!(
            c.read(fid, off, 4096, t).expect("read") == data,
            "round {i}"
        );
    }
    let st = c.stats();
    assert!(st.invalidated >= 2 * rounds, "{st:?}");
    assert_eq!(st.grants, st.revokes + st.invalidated, "{st:?}");
    assert_eq!(st.released, st.grants, "every grant handed back: {st:?}");
    c.close(fid).unwrap();
    env.done(c);
    env.stop();
}

/// Zero-copy RDMA between the client and the memory store's blocks (READ
/// from the blocks, holes from the zero block; WRITE into mapped blocks
/// inside the end of file, else staged): every byte checked against a model
/// of the file, across holes, block boundaries, the end of file, in-place
/// overwrites and extending writes, through 1 and 16 descriptors.
#[test]
fn rdma_through_the_store_blocks_matches_a_model_across_holes_and_file_ends() {
    let _serial = serial();
    let mut env = Env::start();
    let mut c = env.session(Dialect::SMB_3_1_1);
    let fid = create(&mut c, "zc.bin");
    const BLOCK: usize = 64 << 10;
    let mut model: Vec<u8> = Vec::new();
    let one = Transfer::Rdma {
        descriptors: 1,
        invalidate: false,
    };
    let many = Transfer::Rdma {
        descriptors: 16,
        invalidate: true,
    };
    // (offset, length, seed): extending writes leaving holes, then
    // overwrites inside the end of file (in place), one straddling a hole.
    let writes = [
        (100, 100_000, 1u64),
        (5 * BLOCK + 17, 3000, 2),
        (10, 40_000, 3),
        (BLOCK - 5, 40, 4),
        (20_000, 150_000, 5),
        (5 * BLOCK, 20, 6),
        (9 * BLOCK - 1, BLOCK + 2, 7),
    ];
    for (i, &(off, len, seed)) in writes.iter().enumerate() {
        let data = pattern(len, seed);
        let t = if i % 2 == 0 { one } else { many };
        assert_eq!(c.write(fid, off as u64, &data, t).unwrap() as usize, len);
        if model.len() < off + len {
            model.resize(off + len, 0);
        }
        model[off..off + len].copy_from_slice(&data);
        // Reads of the whole file, past its end, of a hole, of its tail.
        let eof = model.len();
        for (roff, rlen) in [
            (0, eof + 1000),
            (3 * BLOCK + 1, 1000),
            (eof - 7, 100),
            (BLOCK - 3, 2 * BLOCK + 6),
        ] {
            if roff >= eof {
                continue;
            }
            for t in [one, many] {
                let back = c.read(fid, roff as u64, rlen as u32, t).unwrap();
                let want = &model[roff..(roff + rlen).min(eof)];
                assert!(
                    back == want,
                    "after write {i}: read of {rlen} at {roff} with {t:?} differs"
                );
            }
        }
    }
    c.close(fid).unwrap();
    env.done(c);
    env.stop();
}

/// A file is overwritten, truncated and deleted by one connection while
/// another reads it through RDMA, and a third file takes the blocks freed
/// (a 2 MiB store: 32 blocks, reused at once), on two server workers: the
/// reads return the file's bytes, zeros, or an error status, never the
/// other file's bytes (the pinned blocks are not reused while the RDMA
/// Write from them can still run).
#[test]
fn truncate_and_delete_during_rdma_reads_never_return_another_files_bytes() {
    let _serial = serial();
    const X: u8 = 0x11;
    const OTHER: u8 = 0xEE;
    const LEN: usize = 256 << 10;
    let port = free_port();
    let d = spawn(
        port,
        &["--upper", "smb2", "--cores", "0,1", "--store-size", "2M"],
    );
    let provider = SoftProvider::new().unwrap();
    let pools: Vec<(BufferPool, MemoryRegion)> = (0..2).map(|_| client_pool(&provider)).collect();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let session = |i: usize| {
        let (pool, mr) = &pools[i];
        let mut c = Smb2Client::connect(
            &provider,
            addr,
            cfg(),
            pool.claim_slice(0).unwrap(),
            *mr,
            Duration::from_secs(10),
            Smb2ClientOptions::default(),
        )
        .expect("connect");
        c.negotiate(&[Dialect::SMB_3_1_1]).unwrap();
        c.session_setup_anonymous().unwrap();
        c.tree_connect("data").unwrap();
        c
    };
    let mut mutator = session(0);
    let mut reader = session(1);
    let t = Transfer::Rdma {
        descriptors: 2,
        invalidate: false,
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    let stop = std::sync::atomic::AtomicBool::new(false);
    /// Stops the reader however the mutator's loop ends (a panic too).
    struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let (reads, rounds) = std::thread::scope(|s| {
        let r = s.spawn(|| {
            let mut reads = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let Ok(f) = reader.create(
                    "x",
                    CreateDisposition::OPEN,
                    CreateOptions::NON_DIRECTORY_FILE,
                ) else {
                    std::thread::yield_now();
                    continue;
                };
                if let Ok(data) = reader.read(f.file_id, 0, LEN as u32, t) {
                    assert!(
                        data.iter().all(|&b| b == X || b == 0),
                        "a read of x returned bytes x never held"
                    );
                    reads += 1;
                }
                let _ = reader.close(f.file_id);
            }
            reads
        });
        let stopper = StopOnDrop(&stop);
        let mut rounds = 0u64;
        while std::time::Instant::now() < deadline {
            rounds += 1;
            // STATUS_DELETE_PENDING while the reader still has the deleted
            // x open: try again.
            let Ok(x) = mutator.create(
                "x",
                CreateDisposition::OVERWRITE_IF,
                CreateOptions::NON_DIRECTORY_FILE
                    | if rounds % 2 == 0 {
                        CreateOptions::DELETE_ON_CLOSE
                    } else {
                        CreateOptions::empty()
                    },
            ) else {
                std::thread::yield_now();
                continue;
            };
            let x = x.file_id;
            // Staged (extending), then in place (an overwrite).
            mutator.write(x, 0, &vec![X; LEN], t).expect("write x");
            mutator.write(x, 0, &vec![X; LEN], t).expect("rewrite x");
            mutator.close(x).unwrap();
            let y = mutator
                .create(
                    "y",
                    CreateDisposition::OVERWRITE_IF,
                    CreateOptions::NON_DIRECTORY_FILE | CreateOptions::DELETE_ON_CLOSE,
                )
                .expect("create y")
                .file_id;
            // As much of the store as is free.
            let _ = mutator.write(y, 0, &vec![OTHER; 1 << 20], t);
            mutator.close(y).unwrap();
        }
        drop(stopper);
        (r.join().expect("reader"), rounds)
    });
    assert!(reads > 0 && rounds > 0, "{reads} reads, {rounds} rounds");
    let _ = mutator.disconnect(Duration::from_secs(2));
    let _ = reader.disconnect(Duration::from_secs(2));
    let stats = stats_json(&d);
    assert!(
        !stats.contains("\"rdma_errors\":1"),
        "no RDMA error on either connection: {stats}"
    );
    let _ = terminate(d);
}
