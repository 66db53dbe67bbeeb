//! Zero allocation on the I/O path, measured: a counting global allocator
//! attributes every heap allocation (alloc, alloc_zeroed, realloc) to the
//! thread that made it, and
//!
//! * a real server (control plane + a `dp-worker-0` thread, echo upper
//!   layer, soft provider) serves thousands of round trips without its
//!   worker thread allocating once warmed up: echoes of mixed sizes,
//!   fragmented ones included, and RDMA echo requests, for which the worker
//!   RDMA-reads the client's granted buffer and RDMA-writes it back into
//!   another ([MS-SMBD] 3.1.4.5, 3.1.4.6), replying with or without Send
//!   with Invalidate;
//! * the soft provider's RDMA path (grant, RDMA Write, RDMA Read, Send with
//!   Invalidate, revoke, poll) does not allocate on the posting thread
//!   either, measured without a worker.
//!
//! * the SMB2 upper layer serves pipelined READ/WRITE (inline, RDMA_V1 and
//!   RDMA_V1_INVALIDATE) on the memory store, some of it through a Storage
//!   QoS flow whose limit makes requests wait in the worker's QoS queue,
//!   without its worker thread allocating once warmed up; the client thread
//!   issuing them is counted too.

mod common;

use smbdirect_controlplane::{start, ServerConfig};
use smbdirect_dataplane::client::{buffer_descriptor, Client};
use smbdirect_dataplane::provider::soft::SoftProvider;
use smbdirect_dataplane::provider::{
    Access, Completion, CompletionQueue, ConnRequest, Listener, Provider, QpCaps, QueuePair,
    RecvWr, RemoteBuf, SendOp, SendWr, Sge, WcOpcode, WcStatus,
};
use smbdirect_dataplane::upper::{parse_rdma_done, rdma_echo_request, Echo, RDMA_ECHO_INVALIDATE};
use smbdirect_hugepages::{
    Backing, BufId, BufLocation, ClassId, HugepagePolicy, PoolConfig, SizeClass,
};
use smbdirect_protocol::ntstatus::STATUS_SUCCESS;
use smbdirect_protocol::smbd::SmbdConfig;
use std::alloc::{GlobalAlloc, Layout, System};
use std::backtrace::Backtrace;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// ---- the counting allocator ------------------------------------------------

/// Threads whose allocations are counted globally.
const WORKER_PREFIX: &str = "dp-worker";

/// Thread classification: not yet known, a data-plane worker, anything else.
const UNKNOWN: u8 = 0;
const WORKER: u8 = 1;
const OTHER: u8 = 2;

/// Allocations made on worker threads.
static WORKER_ALLOCS: AtomicU64 = AtomicU64::new(0);
/// While set, the first worker allocation captures a backtrace.
static ARMED: AtomicBool = AtomicBool::new(false);
static FIRST_WORKER_ALLOC: Mutex<Option<Backtrace>> = Mutex::new(None);
/// The counter is process-wide: tests that run servers take turns.
static SERVERS: Mutex<()> = Mutex::new(());

thread_local! {
    /// What this thread is (const-initialised, no destructor: reading it
    /// never allocates and works during thread teardown).
    static KIND: Cell<u8> = const { Cell::new(UNKNOWN) };
    /// Inside the allocator's own bookkeeping on this thread: allocations
    /// made now (by `thread::current()` or a backtrace) are passed through
    /// uncounted, so the allocator never recurses into itself.
    static BUSY: Cell<bool> = const { Cell::new(false) };
    /// Count this thread's allocations into `HERE` (see [`count_here`]).
    static COUNTING_HERE: Cell<bool> = const { Cell::new(false) };
    static HERE: Cell<u64> = const { Cell::new(0) };
}

struct CountingAlloc;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// Runs `f` with the reentrancy guard set; `None` if it already was.
fn guarded<R>(f: impl FnOnce() -> R) -> Option<R> {
    if BUSY.try_with(|b| b.replace(true)).unwrap_or(true) {
        return None;
    }
    let r = f();
    let _ = BUSY.try_with(|b| b.set(false));
    Some(r)
}

fn note_allocation() {
    guarded(|| {
        let kind = match KIND.try_with(Cell::get).unwrap_or(OTHER) {
            UNKNOWN => {
                // May allocate (the thread handle); the guard lets that through.
                let k = if std::thread::current()
                    .name()
                    .is_some_and(|n| n.starts_with(WORKER_PREFIX))
                {
                    WORKER
                } else {
                    OTHER
                };
                let _ = KIND.try_with(|c| c.set(k));
                k
            }
            k => k,
        };
        if kind == WORKER {
            WORKER_ALLOCS.fetch_add(1, Ordering::Relaxed);
            if ARMED.swap(false, Ordering::Relaxed) {
                // Allocates, under the guard; resolved (symbolised) later,
                // on the test thread, when printed.
                let bt = Backtrace::force_capture();
                if let Ok(mut first) = FIRST_WORKER_ALLOC.lock() {
                    first.get_or_insert(bt);
                }
            }
        }
        if COUNTING_HERE.try_with(Cell::get).unwrap_or(false) {
            let _ = HERE.try_with(|h| h.set(h.get() + 1));
        }
    });
}

// SAFETY: every method forwards to `System` with the caller's arguments; the
// bookkeeping touches only atomics and const thread-locals (and, guarded,
// code that may allocate through `System` via this allocator uncounted).
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_allocation();
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Allocations `f` makes on the calling thread.
fn count_here<R>(f: impl FnOnce() -> R) -> (R, u64) {
    HERE.with(|h| h.set(0));
    COUNTING_HERE.with(|c| c.set(true));
    let r = f();
    COUNTING_HERE.with(|c| c.set(false));
    (r, HERE.with(Cell::get))
}

// ---- the worker's poll loop --------------------------------------------------

/// Largest RDMA echo (and the server's MaxReadWriteSize, which sizes its
/// RDMA buffers).
const MAX_RDMA: usize = 1 << 20;

fn smbd() -> SmbdConfig {
    SmbdConfig {
        receive_credit_max: 32,
        send_credit_target: 32,
        max_read_write_size: MAX_RDMA as u32,
        ..SmbdConfig::default()
    }
}

fn server_config() -> ServerConfig {
    common::server_config(1, 4, smbd())
}

/// Message sizes of one cycle: 1 B to a few KiB around the send-size and
/// fragment boundaries (MaxSendSize 1364 carries 1340 data bytes), and one
/// 64 KiB message that travels as ~50 fragments each way.
const SIZES: [usize; 10] = [1, 64, 100, 512, 1340, 1341, 2000, 4096, 6000, 65_536];

/// RDMA echo lengths: a page, an odd size, 64 KiB, MaxReadWriteSize.
const RDMA_SIZES: [usize; 4] = [4096, 100_003, 65_536, MAX_RDMA];

/// The client's side of the RDMA echoes: a source buffer holding a pattern
/// and a destination buffer the server writes into.
struct RdmaBufs {
    src: BufId,
    dst: BufId,
    pattern: Vec<u8>,
    scratch: Vec<u8>,
}

impl RdmaBufs {
    fn new(client: &mut Client<SoftProvider>) -> Self {
        let src = client.alloc_buffer(MAX_RDMA).expect("source buffer");
        let dst = client.alloc_buffer(MAX_RDMA).expect("destination buffer");
        let pattern: Vec<u8> = (0..MAX_RDMA).map(|i| (i * 13 + 5) as u8).collect();
        assert!(client.write_buffer(src, 0, &pattern));
        RdmaBufs {
            src,
            dst,
            pattern,
            scratch: vec![0; MAX_RDMA],
        }
    }
}

/// One RDMA echo of `len` bytes through one or two descriptors each way:
/// grant, request, reply (with Send with Invalidate when `invalidate`),
/// check the bytes landed, revoke.
fn rdma_round_trip(
    client: &mut Client<SoftProvider>,
    b: &mut RdmaBufs,
    len: usize,
    split: bool,
    invalidate: bool,
) {
    // Overwrite what the server must restore.
    assert!(client.write_buffer(b.dst, 0, &[!b.pattern[0]]));
    assert!(client.write_buffer(b.dst, len - 1, &[!b.pattern[len - 1]]));
    let cut = if split { len / 3 } else { len };
    let mut grants = Vec::with_capacity(4);
    let mut descs = Vec::with_capacity(4);
    for (buf, access) in [(b.src, Access::RemoteRead), (b.dst, Access::RemoteWrite)] {
        for (off, n) in [(0, cut), (cut, len - cut)] {
            if n > 0 {
                let g = client.grant(buf, off, n, access).expect("grant");
                descs.push(buffer_descriptor(&g).to_bytes());
                grants.push(g);
            }
        }
    }
    let reads = if split { 2 } else { 1 };
    let flags = if invalidate { RDMA_ECHO_INVALIDATE } else { 0 };
    let req = rdma_echo_request(len as u32, &descs[..reads], &descs[reads..], flags);
    client.send(&req).expect("send RDMA echo request");
    let (status, moved, token) = client
        .recv_with_token(Duration::from_secs(10), |m, token| {
            let (status, moved) = parse_rdma_done(m).expect("an RDMADONE reply");
            (status, moved, token)
        })
        .expect("RDMA echo reply");
    assert_eq!(
        (status, moved as usize),
        (STATUS_SUCCESS, len),
        "RDMA echo of {len} B"
    );
    assert_eq!(
        token,
        invalidate.then_some(grants[reads].rkey),
        "invalidated token"
    );
    assert!(client.read_buffer(b.dst, 0, &mut b.scratch[..len]));
    assert!(
        b.scratch[..len] == b.pattern[..len],
        "RDMA echo of {len} B: bytes differ"
    );
    for g in &grants {
        client.revoke(g.rkey).expect("revoke");
    }
}

/// Runs `n` round trips: every fourth an RDMA echo, the rest echoes of
/// `msgs` in turn; checks every reply.
fn round_trips(client: &mut Client<SoftProvider>, msgs: &[Vec<u8>], rdma: &mut RdmaBufs, n: usize) {
    for i in 0..n {
        if i % 4 == 3 {
            let k = i / 4;
            let len = RDMA_SIZES[k % RDMA_SIZES.len()];
            rdma_round_trip(client, rdma, len, k % 2 == 0, k % 3 == 0);
            continue;
        }
        let msg = &msgs[i % msgs.len()];
        client.send(msg).expect("send");
        let same = client
            .recv_with(Duration::from_secs(10), |m| m == &msg[..])
            .expect("echo reply");
        assert!(same, "echo of {} bytes differs (round trip {i})", msg.len());
    }
}

#[test]
fn worker_poll_loop_does_not_allocate_once_warmed_up() {
    let _one_at_a_time = SERVERS.lock().unwrap_or_else(|e| e.into_inner());
    const WARMUP: usize = 2_000;
    const MEASURED: usize = 6_000;
    let provider = Arc::new(SoftProvider::new().expect("soft provider"));
    let server = start(provider.clone(), server_config(), || Echo).expect("server starts");

    // The pool outlives the provider's use of it in this test (the server
    // is shut down and the client closed before it drops).
    let (cpool, mr) = common::client_pool(&provider, 48 << 20, MAX_RDMA);
    let mut client = Client::connect(
        &*provider,
        server.local_addr(),
        smbd(),
        cpool.claim_slice(0).unwrap(),
        mr,
        Duration::from_secs(5),
    )
    .expect("connect");
    let msgs: Vec<Vec<u8>> = SIZES
        .iter()
        .map(|&n| (0..n).map(|i| (i * 7 + n) as u8).collect())
        .collect();

    let mut rdma = RdmaBufs::new(&mut client);

    round_trips(&mut client, &msgs, &mut rdma, WARMUP);
    let warm = WORKER_ALLOCS.load(Ordering::Relaxed);
    ARMED.store(true, Ordering::Relaxed);
    let t = Instant::now();
    round_trips(&mut client, &msgs, &mut rdma, MEASURED);
    let elapsed = t.elapsed();
    ARMED.store(false, Ordering::Relaxed);
    let after = WORKER_ALLOCS.load(Ordering::Relaxed);

    let totals = server.stats().totals();
    println!(
        "worker allocations: {warm} during start-up, connection set-up and {WARMUP} warm-up round trips; \
         {} during {MEASURED} measured round trips, {} of them RDMA echoes ({:.2} s; server totals: \
         {} messages in, {} out, {} RDMA errors)",
        after - warm,
        MEASURED / 4,
        elapsed.as_secs_f64(),
        totals.messages_in,
        totals.messages_out,
        totals.rdma_errors,
    );
    assert!(
        warm > 0,
        "the allocator never saw the worker thread allocate, not even at start-up: is it named {WORKER_PREFIX}-N?"
    );
    assert_eq!(totals.messages_in, (WARMUP + MEASURED) as u64);
    assert_eq!(totals.rdma_errors, 0);
    if after != warm {
        let bt = FIRST_WORKER_ALLOC.lock().unwrap().take();
        panic!(
            "the worker thread allocated {} times in steady state; the first allocation:\n{}",
            after - warm,
            bt.map_or_else(|| "(no backtrace captured)".into(), |b| b.to_string())
        );
    }
    let _alloc = client.close(Duration::from_secs(2));
    server.shutdown();

    // The instrument itself: a worker-named thread that allocates is
    // counted, and its first allocation while armed leaves a backtrace.
    let before = WORKER_ALLOCS.load(Ordering::Relaxed);
    ARMED.store(true, Ordering::Relaxed);
    std::thread::Builder::new()
        .name(format!("{WORKER_PREFIX}-selfcheck"))
        .spawn(|| drop(std::hint::black_box(Box::new([7u8; 32]))))
        .unwrap()
        .join()
        .unwrap();
    ARMED.store(false, Ordering::Relaxed);
    assert!(
        WORKER_ALLOCS.load(Ordering::Relaxed) > before,
        "a worker allocation went uncounted"
    );
    let bt = FIRST_WORKER_ALLOC
        .lock()
        .unwrap()
        .take()
        .expect("a backtrace was captured");
    assert!(
        bt.to_string().contains("worker_no_alloc"),
        "the backtrace names the allocating code:\n{bt}"
    );
}

// ---- the SMB2 + QoS I/O path -------------------------------------------------

/// A server with the SMB2 upper layer over a 64 MiB memory store (one
/// worker, [`server_config`]) and an anonymous SMB 3.1.1 client of it with
/// a registered pool of `client_pool` bytes, tree-connected to `data`.
/// The provider and the client's pool are returned to outlive the client.
fn smb2_session(
    client_pool: usize,
) -> (
    Arc<SoftProvider>,
    smbdirect_hugepages::BufferPool,
    smbdirect_controlplane::RunningServer,
    smbdirect_dataplane::smb2::client::Smb2Client<SoftProvider>,
) {
    use smbdirect_dataplane::smb2::client::{Smb2Client, Smb2ClientOptions};
    use smbdirect_dataplane::smb2::store::{MemStoreFactory, StoreFactory};
    use smbdirect_dataplane::smb2::{Smb2Config, Smb2Server};
    use smbdirect_protocol::smb2::Dialect;
    let provider = Arc::new(SoftProvider::new().expect("soft provider"));
    let store = Arc::new(MemStoreFactory::new(64 << 20).expect("memory store"));
    let server = start(provider.clone(), server_config(), move || {
        Smb2Server::new(Smb2Config::default(), store.handle(0))
    })
    .expect("server starts");
    let cpool = PoolConfig::smbdirect(client_pool, 1, 8192, 1364, 1 << 16)
        .backing(Backing::SharedMemfd)
        .build()
        .expect("client pool");
    // SAFETY: the pool is returned with the client and outlives it.
    let mr = unsafe { provider.register_pool(&cpool) }.expect("register the client pool");
    let mut c = Smb2Client::connect(
        &*provider,
        server.local_addr(),
        smbd(),
        cpool.claim_slice(0).unwrap(),
        mr,
        Duration::from_secs(5),
        Smb2ClientOptions::default(),
    )
    .expect("connect");
    c.negotiate(&[Dialect::SMB_3_1_1]).unwrap();
    c.session_setup_anonymous().unwrap();
    c.tree_connect("data").unwrap();
    (provider, cpool, server, c)
}

#[test]
fn smb2_read_write_and_qos_path_does_not_allocate_once_warmed_up() {
    let _one_at_a_time = SERVERS.lock().unwrap_or_else(|e| e.into_inner());
    use smbdirect_dataplane::smb2::client::{Smb2Client, Transfer};
    use smbdirect_protocol::smb2::{CreateDisposition, CreateOptions};
    use smbdirect_protocol::sqos::{
        Dialect as QosDialect, Guid, Options, StorageQosControlRequestRepr,
        FSCTL_STORAGE_QOS_CONTROL,
    };
    const QD: usize = 8;
    const ROUNDS: usize = 1_500;

    let (_provider, _pool, server, mut c) = smb2_session(64 << 20);
    let open = |c: &mut Smb2Client<SoftProvider>, name: &str| {
        c.create(
            name,
            CreateDisposition::OVERWRITE_IF,
            CreateOptions::NON_DIRECTORY_FILE,
        )
        .unwrap()
        .file_id
    };
    let plain = open(&mut c, "plain.bin");
    let limited = open(&mut c, "limited.bin");
    for f in [plain, limited] {
        let t = Transfer::Rdma {
            descriptors: 1,
            invalidate: false,
        };
        c.write(f, 0, &vec![7u8; 1 << 16], t).unwrap();
    }
    // A flow of 2,000 normalized IOPS: faster than that, requests wait in
    // the worker's QoS queue (the held-message path).
    let mut req = StorageQosControlRequestRepr::new(
        QosDialect::V1_1,
        Options::from_bits(Options::SET_LOGICAL_FLOW_ID.bits() | Options::SET_POLICY.bits()),
        Guid::from_fields(1, 2, 3, [4; 8]),
    );
    req.limit = 2_000;
    let (st, _) = c
        .ioctl(limited, FSCTL_STORAGE_QOS_CONTROL, &req.to_vec(), 1024)
        .expect("set policy");
    assert_eq!(st, STATUS_SUCCESS);

    let kinds = [
        (plain, 4096u32, Transfer::Inline, false),
        (
            plain,
            4096,
            Transfer::Rdma {
                descriptors: 1,
                invalidate: false,
            },
            true,
        ),
        (
            plain,
            65536,
            Transfer::Rdma {
                descriptors: 2,
                invalidate: true,
            },
            false,
        ),
        (
            limited,
            8192,
            Transfer::Rdma {
                descriptors: 1,
                invalidate: true,
            },
            false,
        ),
        (limited, 4096, Transfer::Inline, true),
    ];
    let mut bufs = Vec::new();
    for _ in 0..QD {
        // Buffers move between request kinds: all of the largest size.
        bufs.push(c.alloc_io_buf(65536).unwrap());
    }
    let run = |c: &mut Smb2Client<SoftProvider>, rounds: usize| {
        let mut issued = 0usize;
        let mut done = 0usize;
        let submit = |c: &mut Smb2Client<SoftProvider>, k: usize, b| {
            let (f, len, t, write) = kinds[k % kinds.len()];
            if write {
                c.submit_write(f, 0, len, b, t).expect("submit write");
            } else {
                c.submit_read(f, 0, len, b, t).expect("submit read");
            }
        };
        for (i, b) in bufs.iter().enumerate() {
            submit(c, i, *b);
            issued += 1;
        }
        while done < issued {
            let comp = c
                .poll(Duration::from_secs(5))
                .expect("poll")
                .expect("a completion within 5 s");
            assert!(comp.result.is_ok(), "{:?}", comp.result);
            done += 1;
            if issued < rounds {
                submit(c, issued, comp.buf.expect("the buffer comes back"));
                issued += 1;
            }
        }
    };
    run(&mut c, ROUNDS);
    let warm = WORKER_ALLOCS.load(Ordering::Relaxed);
    ARMED.store(true, Ordering::Relaxed);
    let t0 = Instant::now();
    let ((), client_allocs) = count_here(|| run(&mut c, ROUNDS * 2));
    let took = t0.elapsed();
    // 2/5 of the requests are on the limited flow, one normalized I/O each:
    // at 2,000 IOPS they cannot all finish in much less than 0.6 s, so they
    // did wait in the QoS queue.
    assert!(
        took >= Duration::from_millis(450),
        "{} requests in {took:?}: the QoS limit did not hold them",
        ROUNDS * 2
    );
    ARMED.store(false, Ordering::Relaxed);
    let after = WORKER_ALLOCS.load(Ordering::Relaxed);
    let t = server.stats().totals();
    println!(
        "SMB2 path: {} worker allocations and {client_allocs} client-thread allocations during {} \
         pipelined READ/WRITE (QD {QD}; inline, RDMA_V1, RDMA_V1_INVALIDATE, a QoS-limited flow); \
         {:.2} s (the limited flow's requests waited in the QoS queue)",
        after - warm,
        ROUNDS * 2,
        took.as_secs_f64(),
    );
    if after != warm {
        let bt = FIRST_WORKER_ALLOC.lock().unwrap().take();
        panic!(
            "the worker thread allocated {} times in steady state; the first allocation:\n{}",
            after - warm,
            bt.map_or_else(|| "(no backtrace captured)".into(), |b| b.to_string())
        );
    }
    assert_eq!(t.rdma_errors, 0);
    let _ = c.disconnect(Duration::from_secs(2));
    server.shutdown();
}

/// Storage QoS window reports of more flows than the ring to the control
/// plane holds (its capacity is `max_connections * 4 + 16` = 32 here):
/// every 100 ms window closes on all of them, and the worker sends their
/// reports a ring's room at a time instead of queueing them on the heap.
#[test]
fn qos_window_reports_of_many_flows_do_not_allocate_on_the_worker() {
    let _one_at_a_time = SERVERS.lock().unwrap_or_else(|e| e.into_inner());
    use smbdirect_dataplane::smb2::client::{Smb2Client, Transfer};
    use smbdirect_protocol::smb2::{CreateDisposition, CreateOptions};
    use smbdirect_protocol::sqos::{
        Dialect as QosDialect, Guid, Options, StorageQosControlRequestRepr,
        FSCTL_STORAGE_QOS_CONTROL,
    };
    // More than the worker's event queue (256) and ten times the ring.
    const FLOWS: u32 = 300;

    let (_provider, _pool, server, mut c) = smb2_session(16 << 20);
    let f = c
        .create(
            "data.bin",
            CreateDisposition::OVERWRITE_IF,
            CreateOptions::NON_DIRECTORY_FILE,
        )
        .unwrap()
        .file_id;
    c.write(f, 0, &[5u8; 4096], Transfer::Inline).unwrap();
    c.close(f).unwrap();
    // One open per flow, each its own logical flow with a generous
    // client-defined limit (no PolicyId: [MS-SQOS] note <8>); nothing
    // waits: only the reports matter.
    let mut opens = Vec::new();
    for n in 0..FLOWS {
        let fid = c
            .create(
                "data.bin",
                CreateDisposition::OPEN,
                CreateOptions::NON_DIRECTORY_FILE,
            )
            .unwrap()
            .file_id;
        let mut req = StorageQosControlRequestRepr::new(
            QosDialect::V1_1,
            Options::from_bits(Options::SET_LOGICAL_FLOW_ID.bits() | Options::SET_POLICY.bits()),
            Guid::from_fields(n + 1, 7, 7, [7; 8]),
        );
        req.limit = 1_000_000;
        let (st, _) = c
            .ioctl(fid, FSCTL_STORAGE_QOS_CONTROL, &req.to_vec(), 1024)
            .unwrap_or_else(|e| panic!("set policy of flow {n}: {e:?}"));
        assert_eq!(st, STATUS_SUCCESS, "flow {n}");
        opens.push(fid);
    }
    // One 4 KiB READ on each of the first `busy` flows per round, rounds
    // spread over several windows: each window closes on all of them.
    let rounds = |c: &mut Smb2Client<SoftProvider>, n: usize, busy: usize| {
        for _ in 0..n {
            for &fid in &opens[..busy] {
                let data = c.read(fid, 0, 4096, Transfer::Inline).expect("read");
                assert_eq!(data.len(), 4096);
            }
            std::thread::sleep(Duration::from_millis(40));
        }
    };
    // Warmed up with a few flows busy: the windows close on few reports.
    // Then every flow is: a window closes on 300 reports, more than the
    // ring and the worker's event queue hold.
    rounds(&mut c, 6, 8);
    let warm = WORKER_ALLOCS.load(Ordering::Relaxed);
    ARMED.store(true, Ordering::Relaxed);
    let t0 = Instant::now();
    rounds(&mut c, 8, opens.len());
    // The last window's reports too.
    std::thread::sleep(Duration::from_millis(250));
    let took = t0.elapsed();
    ARMED.store(false, Ordering::Relaxed);
    let after = WORKER_ALLOCS.load(Ordering::Relaxed);
    println!(
        "QoS window reports: {} worker allocations while {FLOWS} flows did I/O in every window \
         for {:.2} s (ring to the control plane: 32 messages)",
        after - warm,
        took.as_secs_f64()
    );
    assert!(
        took >= Duration::from_millis(300),
        "the run spans several 100 ms windows"
    );
    if after != warm {
        let bt = FIRST_WORKER_ALLOC.lock().unwrap().take();
        panic!(
            "the worker thread allocated {} times reporting {FLOWS} flows; the first allocation:\n{}",
            after - warm,
            bt.map_or_else(|| "(no backtrace captured)".into(), |b| b.to_string())
        );
    }
    let _ = c.disconnect(Duration::from_secs(2));
    server.shutdown();
}

// ---- the provider's RDMA path ------------------------------------------------

struct Side {
    cq: <SoftProvider as Provider>::Cq,
    qp: <SoftProvider as Provider>::Qp,
}

fn connect(p: &SoftProvider) -> (Side, Side) {
    let caps = QpCaps {
        max_send_wr: 64,
        max_recv_wr: 16,
        max_sge: 2,
        ird: 8,
        ord: 8,
    };
    let mut listener = p.listen("127.0.0.1:0".parse().unwrap()).expect("listen");
    let addr = listener.local_addr();
    let (tcq, icq) = (p.create_cq(256).unwrap(), p.create_cq(256).unwrap());
    let (th, ih) = (tcq.handle(), icq.handle());
    let (tqp, iqp) = std::thread::scope(|s| {
        let acceptor = s.spawn(|| {
            let req = listener
                .accept_request(Duration::from_secs(5))
                .expect("accept_request")
                .expect("a connection request");
            req.accept(&th, caps, &[]).expect("accept")
        });
        let (iqp, _) = p
            .connect(addr, &ih, caps, &[], Duration::from_secs(5))
            .expect("connect");
        (acceptor.join().expect("acceptor"), iqp)
    });
    (Side { cq: tcq, qp: tqp }, Side { cq: icq, qp: iqp })
}

/// Polls until one completion arrives; returns it (never allocates).
fn one_completion(side: &mut Side) -> Completion {
    let mut wc = [Completion::EMPTY; 1];
    let deadline = Instant::now() + Duration::from_secs(5);
    while side.cq.poll(&mut wc) == 0 {
        assert!(Instant::now() < deadline, "no completion within 5 s");
    }
    wc[0]
}

fn expect(side: &mut Side, opcode: WcOpcode) {
    let wc = one_completion(side);
    assert_eq!(
        (wc.opcode, wc.status),
        (opcode, WcStatus::Success),
        "{wc:?}"
    );
}

/// One of everything the RDMA path does, with `len`-byte transfers: grant
/// for write, RDMA Write, revoke; grant for read, RDMA Read, Send with
/// Invalidate of that grant (and the receive it lands in), revoke.
fn rdma_cycle(
    target: &mut Side,
    initiator: &mut Side,
    t: &BufLocation,
    i: &BufLocation,
    mr: (u32, u32),
    len: u32,
) {
    let (tkey, ikey) = mr;
    let tsge = Sge {
        addr: t.addr(),
        len,
        lkey: tkey,
    };
    let isge = Sge {
        addr: i.addr(),
        len,
        lkey: ikey,
    };
    let g = target
        .qp
        .grant(1, tsge, Access::RemoteWrite, true)
        .expect("grant");
    expect(target, WcOpcode::Bind);
    let remote = RemoteBuf {
        addr: g.addr,
        rkey: g.rkey,
    };
    let sges = [isge];
    initiator
        .qp
        .post_send(&[SendWr {
            wr_id: 2,
            op: SendOp::RdmaWrite {
                sges: &sges,
                remote,
            },
            signaled: true,
        }])
        .expect("RDMA Write");
    expect(initiator, WcOpcode::RdmaWrite);
    target.qp.revoke(3, g.rkey, true).expect("revoke");
    expect(target, WcOpcode::Revoke);

    let g = target
        .qp
        .grant(4, tsge, Access::RemoteRead, true)
        .expect("grant");
    expect(target, WcOpcode::Bind);
    let remote = RemoteBuf {
        addr: g.addr,
        rkey: g.rkey,
    };
    initiator
        .qp
        .post_send(&[SendWr {
            wr_id: 5,
            op: SendOp::RdmaRead {
                sges: &sges,
                remote,
            },
            signaled: true,
        }])
        .expect("RDMA Read");
    expect(initiator, WcOpcode::RdmaRead);
    // The initiator says it is done with a Send with Invalidate, as an SMB2
    // server's reply would ([MS-SMBD] 3.1.4.2).
    let slot = Sge {
        addr: t.addr() + u64::from(len),
        len: 64,
        lkey: tkey,
    };
    target
        .qp
        .post_recv(&[RecvWr {
            wr_id: 6,
            sge: slot,
        }])
        .expect("post_recv");
    let hdr = [Sge { len: 24, ..isge }];
    initiator
        .qp
        .post_send(&[SendWr {
            wr_id: 7,
            op: SendOp::Send {
                sges: &hdr,
                invalidate: Some(g.rkey),
            },
            signaled: true,
        }])
        .expect("Send with Invalidate");
    expect(initiator, WcOpcode::Send);
    let wc = one_completion(target);
    assert_eq!(
        (wc.opcode, wc.status, wc.invalidated_rkey),
        (WcOpcode::Recv, WcStatus::Success, Some(g.rkey))
    );
    target
        .qp
        .revoke(8, g.rkey, true)
        .expect("revoke after invalidate");
    expect(target, WcOpcode::Revoke);
}

#[test]
fn soft_provider_rdma_path_does_not_allocate() {
    const CYCLES: usize = 5_000;
    let pool = PoolConfig::new(8 << 20, 1)
        .class(SizeClass::new("rdma", 1 << 20).per_slice(2))
        .hugepages(HugepagePolicy::Disable)
        .mlock(false)
        .build()
        .expect("pool");
    let mut alloc = pool.claim_slice(0).unwrap();
    let t = pool.locate(alloc.alloc(ClassId(0)).unwrap()).unwrap();
    let i = pool.locate(alloc.alloc(ClassId(0)).unwrap()).unwrap();
    let provider = SoftProvider::new().expect("soft provider");
    // SAFETY: the pool is declared before the provider, so it is unmapped
    // after the provider is dropped.
    let mr = unsafe { provider.register(pool.region_base().as_ptr(), pool.region_len(), None) }
        .expect("register");
    let keys = (mr.lkey, mr.lkey);
    let (mut target, mut initiator) = connect(&provider);
    let sizes = [4096u32, 65_536, 1 << 19];

    // Warm-up: first polls attach the queue pairs to their CQs (a Vec grows).
    for k in 0..64 {
        rdma_cycle(
            &mut target,
            &mut initiator,
            &t,
            &i,
            keys,
            sizes[k % sizes.len()],
        );
    }
    let ((), allocs) = count_here(|| {
        for k in 0..CYCLES {
            rdma_cycle(
                &mut target,
                &mut initiator,
                &t,
                &i,
                keys,
                sizes[k % sizes.len()],
            );
        }
    });
    println!(
        "posting-thread allocations over {CYCLES} cycles of grant/RDMA Write/revoke, grant/RDMA Read/\
         Send with Invalidate/Recv/revoke ({} work requests): {allocs}",
        CYCLES * 9
    );
    assert_eq!(allocs, 0, "the soft provider's RDMA path allocated");
    let ((), control) = count_here(|| drop(std::hint::black_box(vec![0u8; 16])));
    assert_eq!(control, 1, "the per-thread counter works");
}
