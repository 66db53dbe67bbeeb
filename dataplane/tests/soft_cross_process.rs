//! The soft provider between two processes: this test binary re-executes
//! itself as the peer (`peer_process_entry_point`, selected by an
//! environment variable), which connects over the rendezvous socket; the
//! two exchange messages and RDMA-write and -read each other's memfd-backed
//! memory, checked byte for byte on both sides. A peer that dies without
//! disconnecting is connection loss.

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use smbdirect_dataplane::provider::soft::{BreakReason, SoftConfig, SoftCq, SoftProvider, SoftQp};
use smbdirect_dataplane::provider::{
    Access, Completion, CompletionQueue, ConnRequest, Grant, Listener, MemoryRegion, Provider,
    ProviderError, QpCaps, QpState, QueuePair, RecvWr, RemoteBuf, SendOp, SendWr, WcOpcode,
    WcStatus,
};
use smbdirect_hugepages::{
    Backing, BufferPool, HugepagePolicy, PoolConfig, SizeClass, HUGEPAGE_SIZE,
};

const ROLE: &str = "SMBD_SOFT_PEER_ROLE";
const ADDR: &str = "SMBD_SOFT_PEER_ADDR";
const TIMEOUT: Duration = Duration::from_secs(10);

/// Bytes moved by each RDMA operation: large enough to span many pages.
const BIG: usize = 256 * 1024;
// Layout of each side's pool.
const MSG: usize = 0; // 8 message slots of 256 bytes
const OUT: usize = 4096; // outgoing message
const WRITE_TARGET: usize = 1 << 20; // granted for the peer to write
const READ_SOURCE: usize = 2 << 20; // granted for the peer to read
const SCRATCH: usize = 3 << 20; // local side of our own RDMA
const POOL: usize = 4 << 20;

const TAG_GRANTS: u32 = 1;
const TAG_DONE: u32 = 2;
const TAG_CHECKED: u32 = 3;
const TAG_HELLO: u32 = 4;

/// Regions each side of `more_regions_than_one_message_passes_...`
/// registers besides its node's: more fds than one `SCM_RIGHTS` message
/// carries (253).
const MANY: usize = 300;

fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761) >> 13).wrapping_add(seed) as u8)
        .collect()
}

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 32,
        max_recv_wr: 16,
        max_sge: 2,
        ird: 4,
        ord: 4,
    }
}

/// One side: provider, memory, completion queue, queue pair.
struct Node {
    // Drop order: queue pair and CQ, then the provider, then the memory.
    qp: Option<SoftQp>,
    cq: SoftCq,
    provider: SoftProvider,
    mr: MemoryRegion,
    pool: BufferPool,
}

fn pool(backing: Backing) -> BufferPool {
    PoolConfig::new(POOL.next_multiple_of(HUGEPAGE_SIZE), 1)
        .class(SizeClass::new("buf", 4096).per_slice(1))
        .backing(backing)
        .hugepages(HugepagePolicy::Disable)
        .mlock(false)
        .build()
        .expect("pool")
}

impl Node {
    fn new() -> Node {
        Node::with_config(SoftConfig::default())
    }

    fn with_config(config: SoftConfig) -> Node {
        let provider = SoftProvider::with_config(config).expect("provider");
        let pool = pool(Backing::SharedMemfd);
        assert!(pool.shared_fd().is_some(), "a memfd-backed pool");
        // SAFETY: the pool is dropped after the provider (field order).
        let mr = unsafe { provider.register_pool(&pool) }.expect("register");
        let cq = provider.create_cq(1024).expect("cq");
        Node {
            qp: None,
            cq,
            provider,
            mr,
            pool,
        }
    }

    fn qp(&mut self) -> &mut SoftQp {
        self.qp.as_mut().expect("connected")
    }

    fn write(&self, off: usize, bytes: &[u8]) {
        pool_write(&self.pool, off, bytes)
    }

    fn read(&self, off: usize, len: usize) -> Vec<u8> {
        pool_bytes(&self.pool, off, len)
    }

    fn recv_wrs(&self) -> Vec<RecvWr> {
        (0..8)
            .map(|i| RecvWr {
                wr_id: i,
                sge: self.mr.sge(MSG as u64 + i * 256, 256),
            })
            .collect()
    }

    fn post_recvs(&mut self) {
        let wrs = self.recv_wrs();
        self.qp().post_recv(&wrs).expect("post_recv");
    }

    fn wait(&mut self, n: usize) -> Vec<Completion> {
        let deadline = Instant::now() + TIMEOUT;
        let mut got = Vec::new();
        let mut out = [Completion::EMPTY; 8];
        while got.len() < n {
            let k = self.cq.poll(&mut out[..(n - got.len()).min(8)]);
            got.extend_from_slice(&out[..k]);
            assert!(
                Instant::now() < deadline,
                "pid {}: {} of {n} completions: {got:?}",
                std::process::id(),
                got.len()
            );
        }
        got
    }

    /// Sends a message (tag + u64 words), optionally invalidating `inv`.
    fn send(&mut self, tag: u32, words: &[u64], inv: Option<u32>) {
        let mut b = tag.to_le_bytes().to_vec();
        for w in words {
            b.extend_from_slice(&w.to_le_bytes());
        }
        self.write(OUT, &b);
        let sges = [self.mr.sge(OUT as u64, b.len() as u32)];
        self.qp()
            .post_send(&[SendWr {
                wr_id: 100 + u64::from(tag),
                op: SendOp::Send {
                    sges: &sges,
                    invalidate: inv,
                },
                signaled: true,
            }])
            .expect("post_send");
        let c = self.wait(1)[0];
        assert_eq!(
            (c.opcode, c.status),
            (WcOpcode::Send, WcStatus::Success),
            "send {tag}"
        );
    }

    /// Waits for a message; returns its tag, words and the invalidated rkey.
    fn recv(&mut self) -> (u32, Vec<u64>, Option<u32>) {
        let c = self.wait(1)[0];
        assert_eq!(
            (c.opcode, c.status),
            (WcOpcode::Recv, WcStatus::Success),
            "{c:?}"
        );
        let b = self.read(MSG + c.wr_id as usize * 256, c.byte_len as usize);
        // Repost the slot.
        let sge = self.mr.sge(MSG as u64 + c.wr_id * 256, 256);
        self.qp()
            .post_recv(&[RecvWr {
                wr_id: c.wr_id,
                sge,
            }])
            .expect("repost");
        let tag = u32::from_le_bytes(b[..4].try_into().unwrap());
        let words = b[4..]
            .chunks(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
            .collect();
        (tag, words, c.invalidated_rkey)
    }

    fn rdma(&mut self, write: bool, local: usize, remote: RemoteBuf, len: usize) -> WcStatus {
        let sges = [self.mr.sge(local as u64, len as u32)];
        let op = if write {
            SendOp::RdmaWrite {
                sges: &sges,
                remote,
            }
        } else {
            SendOp::RdmaRead {
                sges: &sges,
                remote,
            }
        };
        self.qp()
            .post_send(&[SendWr {
                wr_id: 7,
                op,
                signaled: true,
            }])
            .expect("post RDMA");
        self.wait(1)[0].status
    }
}

fn grant_words(g: &Grant) -> [u64; 2] {
    [g.addr, u64::from(g.rkey) << 32 | u64::from(g.len)]
}

fn remote_of(words: &[u64]) -> (RemoteBuf, u32) {
    (
        RemoteBuf {
            addr: words[0],
            rkey: (words[1] >> 32) as u32,
        },
        words[1] as u32,
    )
}

fn spawn_peer(role: &str, addr: SocketAddr) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "peer_process_entry_point",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, role)
        .env(ADDR, addr.to_string())
        // The peer's harness chatter would clutter our output; its panics
        // go to stderr, which we keep.
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn the peer process")
}

fn listen_and_accept(node: &mut Node, role: &str) -> Child {
    let mut listener = node
        .provider
        .listen("127.0.0.1:0".parse().unwrap())
        .expect("listen");
    let child = spawn_peer(role, listener.local_addr());
    let req = listener
        .accept_request(TIMEOUT)
        .expect("accept_request")
        .expect("the peer process connected");
    assert!(!req.is_same_process());
    assert_eq!(
        req.peer_pid(),
        child.id() as i32,
        "SO_PEERCRED names the child"
    );
    assert_eq!(req.private_data(), b"from the peer process");
    // The peer sends the moment the accept reaches it: post first.
    let wrs = node.recv_wrs();
    let qp = req
        .accept_with_receives(&node.cq.handle(), caps(), b"from the parent", &wrs)
        .expect("accept");
    assert!(qp.is_cross_process());
    node.qp = Some(qp);
    child
}

/// [`MANY`] regions of 4 KiB, one per page of `extra` (memfd-backed).
fn register_many(n: &Node, extra: &BufferPool) -> Vec<MemoryRegion> {
    let fd = extra.shared_fd().expect("a memfd-backed pool");
    assert!(MANY * 4096 <= extra.region_len());
    (0..MANY)
        .map(|i| {
            // SAFETY: in bounds (checked above); `extra` outlives the
            // provider (the callers declare it before the node).
            unsafe {
                n.provider.register(
                    extra.region_base().as_ptr().add(i * 4096),
                    4096,
                    Some((fd.as_raw_fd(), (i * 4096) as u64)),
                )
            }
            .expect("register one of many regions")
        })
        .collect()
}

/// A node whose provider's table holds its pool and [`MANY`] more.
fn node_for_many() -> Node {
    Node::with_config(SoftConfig {
        max_regions: 512,
        ..SoftConfig::default()
    })
}

/// Writes `bytes` at `off` of `pool`.
fn pool_write(pool: &BufferPool, off: usize, bytes: &[u8]) {
    assert!(off + bytes.len() <= pool.region_len());
    // SAFETY: in bounds; the peer does not access these bytes meanwhile
    // (the message protocol orders it).
    unsafe {
        std::ptr::copy_nonoverlapping(
            bytes.as_ptr(),
            pool.region_base().as_ptr().add(off),
            bytes.len(),
        )
    }
}

/// The `len` bytes at `off` of `pool`.
fn pool_bytes(pool: &BufferPool, off: usize, len: usize) -> Vec<u8> {
    assert!(off + len <= pool.region_len());
    // SAFETY: as in `pool_write`.
    unsafe { std::slice::from_raw_parts(pool.region_base().as_ptr().add(off), len) }.to_vec()
}

fn expect_exit_ok(mut child: Child) {
    let status = child.wait().expect("wait for the peer");
    assert!(status.success(), "peer process failed: {status}");
}

#[test]
fn cross_process_send_recv_and_rdma_byte_for_byte() {
    let mut n = Node::new();
    let child = listen_and_accept(&mut n, "client");
    // The peer's grants: it lets us write one buffer and read another.
    let (tag, words, _) = n.recv();
    assert_eq!(tag, TAG_GRANTS);
    let (peer_write, wlen) = remote_of(&words[0..2]);
    let (peer_read, rlen) = remote_of(&words[2..4]);
    assert_eq!((wlen as usize, rlen as usize), (BIG, BIG));
    // RDMA Write our pattern A into the peer's memory.
    n.write(SCRATCH, &pattern(0xA, BIG));
    assert_eq!(n.rdma(true, SCRATCH, peer_write, BIG), WcStatus::Success);
    // RDMA Read its pattern B.
    assert_eq!(
        n.rdma(false, SCRATCH + BIG, peer_read, BIG),
        WcStatus::Success
    );
    assert!(
        n.read(SCRATCH + BIG, BIG) == pattern(0xB, BIG),
        "RDMA Read from the peer process: bytes differ"
    );
    // Our grants for the peer: pattern C to read, a buffer to write.
    n.write(READ_SOURCE, &pattern(0xC, BIG));
    let (mr, qp) = (n.mr, n.qp());
    let gw = qp
        .grant(
            1,
            mr.sge(WRITE_TARGET as u64, BIG as u32),
            Access::RemoteWrite,
            false,
        )
        .expect("grant");
    let gr = qp
        .grant(
            2,
            mr.sge(READ_SOURCE as u64, BIG as u32),
            Access::RemoteRead,
            false,
        )
        .expect("grant");
    let mut words = grant_words(&gw).to_vec();
    words.extend(grant_words(&gr));
    // Send with Invalidate of the grant we wrote through: done with it.
    n.send(TAG_DONE, &words, Some(peer_write.rkey));
    // The peer read C, wrote D, and tells us.
    let (tag, _, _) = n.recv();
    assert_eq!(tag, TAG_CHECKED);
    assert!(
        n.read(WRITE_TARGET, BIG) == pattern(0xD, BIG),
        "RDMA Write from the peer process: bytes differ"
    );
    n.qp().revoke(3, gw.rkey, false).unwrap();
    n.qp().revoke(4, gr.rkey, false).unwrap();
    // The peer disconnects and exits.
    expect_exit_ok(child);
    let deadline = Instant::now() + TIMEOUT;
    while n.qp().state() == QpState::Connected {
        assert!(Instant::now() < deadline, "peer's disconnect not seen");
        n.cq.poll(&mut [Completion::EMPTY; 8]);
    }
    assert_eq!(
        n.qp().break_info().map(|b| (b.reason, b.by_peer)),
        Some((BreakReason::Disconnected, true))
    );
    let st = n.provider.stats();
    assert_eq!(
        (st.access_violations, st.grants_live, st.grants_created),
        (0, 0, 2),
        "{st:?}"
    );
}

#[test]
fn peer_process_death_surfaces_as_connection_loss() {
    let mut n = Node::new();
    let child = listen_and_accept(&mut n, "die");
    let sge = n.mr.sge(WRITE_TARGET as u64, 4096);
    let g = n
        .qp()
        .grant(1, sge, Access::RemoteWrite, false)
        .expect("grant");
    // The peer's hello says its receives are posted; only after our
    // answer may it die (its death could beat the grant before).
    let (tag, _, _) = n.recv();
    assert_eq!(tag, TAG_HELLO);
    n.send(TAG_GRANTS, &[], None);
    let status = { child }.wait().expect("wait for the peer");
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "the peer killed itself: {status}"
    );
    // Connection loss, detected through the rendezvous socket: every posted
    // receive flushes.
    let flushed = n.wait(8);
    assert!(
        flushed
            .iter()
            .all(|c| c.status == WcStatus::Flushed && c.opcode == WcOpcode::Recv),
        "{flushed:?}"
    );
    assert_eq!(n.qp().state(), QpState::Error);
    assert_eq!(
        n.qp().break_info().map(|b| b.reason),
        Some(BreakReason::PeerLost)
    );
    // Nothing waits for the dead process.
    n.qp().revoke(2, g.rkey, false).unwrap();
    let st = n.provider.stats();
    assert_eq!(
        (st.peers_lost, st.connections_broken, st.grants_live),
        (1, 1, 0),
        "{st:?}"
    );
}

/// A region given back frees its table slot for the next registration, but
/// a peer process mapped the regions live when it connected, by slot: a
/// region registered in a reused slot after the handshake is refused on
/// that connection (saying why), as any region registered after it is,
/// instead of reaching the memory the peer mapped under that slot.
#[test]
fn a_slot_reused_after_the_handshake_is_refused_on_that_connection() {
    // Declared before the node: they outlive the provider they are
    // registered with.
    let a = pool(Backing::SharedMemfd);
    let c = pool(Backing::SharedMemfd);
    let mut n = Node::new();
    let register = |p: &BufferPool, n: &Node| {
        // SAFETY: the pool outlives the provider (declared before the node).
        unsafe { n.provider.register_pool(p) }.expect("register")
    };
    let amr = register(&a, &n);
    let child = listen_and_accept(&mut n, "idle");
    let (tag, _, _) = n.recv();
    assert_eq!(tag, TAG_HELLO);
    // Registered before the handshake: the peer mapped it.
    let g = n
        .qp()
        .grant(1, amr.sge(0, 4096), Access::RemoteWrite, false)
        .expect("grant of a region the peer mapped");
    n.qp().revoke(2, g.rkey, false).unwrap();
    // SAFETY: its one grant is revoked; nothing else used it.
    unsafe { n.provider.deregister(&amr) }.expect("deregister");
    let cmr = register(&c, &n);
    assert_eq!(
        cmr.lkey & 0xff,
        amr.lkey & 0xff,
        "the slot given back is reused (a table of 256)"
    );
    assert_ne!(cmr.lkey, amr.lkey);
    let e = n
        .qp()
        .grant(3, cmr.sge(0, 4096), Access::RemoteWrite, false)
        .expect_err("a region in a reused slot, through a connection made before");
    assert!(
        e.to_string().contains("registered after the connection"),
        "{e}"
    );
    n.send(TAG_DONE, &[], None);
    expect_exit_ok(child);
}

/// A process with more memfd-backed regions than one `SCM_RIGHTS` message
/// passes connects to another such process: the handshake carries every
/// fd, in order, both ways, so each side reaches the other's last region.
#[test]
fn more_regions_than_one_message_passes_reach_the_peer_process_both_ways() {
    // Declared before the node: it outlives the provider.
    let extra = pool(Backing::SharedMemfd);
    let mut n = node_for_many();
    let mrs = register_many(&n, &extra);
    let child = listen_and_accept(&mut n, "many");
    // The child's grant of the last of its regions: we write into it.
    let (tag, words, _) = n.recv();
    assert_eq!(tag, TAG_GRANTS);
    let (peer_write, len) = remote_of(&words[0..2]);
    assert_eq!(len, 4096);
    n.write(SCRATCH, &pattern(0xE, 4096));
    assert_eq!(n.rdma(true, SCRATCH, peer_write, 4096), WcStatus::Success);
    // Ours: the last of our regions, for the child to read.
    let last = mrs[MANY - 1];
    pool_write(&extra, (MANY - 1) * 4096, &pattern(0xF, 4096));
    let g = n
        .qp()
        .grant(1, last.sge(0, 4096), Access::RemoteRead, false)
        .expect("grant of our last region");
    n.send(TAG_DONE, &grant_words(&g), None);
    let (tag, _, _) = n.recv();
    assert_eq!(tag, TAG_CHECKED);
    n.qp().revoke(2, g.rkey, false).unwrap();
    expect_exit_ok(child);
    assert_eq!(n.provider.stats().access_violations, 0);
}

/// Not a test on its own: the peer process's side of the tests above, run
/// when this binary is re-executed with `SMBD_SOFT_PEER_ROLE` set.
#[test]
fn peer_process_entry_point() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let addr: SocketAddr = std::env::var(ADDR).unwrap().parse().unwrap();
    // Declared before the node, so it outlives the provider it is registered with.
    let anon = pool(Backing::Anonymous);
    let extra = (role == "many").then(|| pool(Backing::SharedMemfd));
    let mut n = if extra.is_some() {
        node_for_many()
    } else {
        Node::new()
    };
    let many = extra.as_ref().map(|e| register_many(&n, e));
    let (qp, reply) = n
        .provider
        .connect(
            addr,
            &n.cq.handle(),
            caps(),
            b"from the peer process",
            TIMEOUT,
        )
        .expect("connect to the parent");
    assert_eq!(reply, b"from the parent");
    assert!(qp.is_cross_process());
    assert_eq!(qp.peer_pid(), std::os::unix::process::parent_id() as i32);
    n.qp = Some(qp);
    n.post_recvs();
    match role.as_str() {
        "client" => client(&mut n, &anon),
        "idle" => {
            // Says hello and leaves when the parent is done.
            n.send(TAG_HELLO, &[], None);
            let (tag, _, _) = n.recv();
            assert_eq!(tag, TAG_DONE);
        }
        "many" => {
            let (extra, mrs) = (extra.as_ref().unwrap(), many.unwrap());
            let g = n
                .qp()
                .grant(1, mrs[MANY - 1].sge(0, 4096), Access::RemoteWrite, false)
                .expect("grant of our last region");
            n.send(TAG_GRANTS, &grant_words(&g), None);
            let (tag, words, _) = n.recv();
            assert_eq!(tag, TAG_DONE);
            assert!(
                pool_bytes(extra, (MANY - 1) * 4096, 4096) == pattern(0xE, 4096),
                "the parent's RDMA Write into our last region: bytes differ"
            );
            let (parent_read, _) = remote_of(&words[0..2]);
            assert_eq!(n.rdma(false, SCRATCH, parent_read, 4096), WcStatus::Success);
            assert!(
                n.read(SCRATCH, 4096) == pattern(0xF, 4096),
                "RDMA Read of the parent's last region: bytes differ"
            );
            n.qp().revoke(2, g.rkey, false).unwrap();
            n.send(TAG_CHECKED, &[], None);
        }
        "die" => {
            // Says hello, waits for the parent's answer (its grant is
            // made), then dies.
            n.send(TAG_HELLO, &[], None);
            let (tag, _, _) = n.recv();
            assert_eq!(tag, TAG_GRANTS);
            // SAFETY: kill(2) on our own pid; no memory is involved.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            unreachable!("SIGKILL");
        }
        other => panic!("unknown role {other}"),
    }
}

fn client(n: &mut Node, anon: &BufferPool) {
    // Memory registered without an fd cannot be reached from the parent:
    // granting it or receiving into it fails, saying why.
    // SAFETY: `anon` outlives the provider (declared before it by the caller).
    let amr = unsafe { n.provider.register(anon.region_base().as_ptr(), 4096, None) }
        .expect("register anonymous");
    match n
        .qp()
        .grant(1, amr.sge(0, 4096), Access::RemoteWrite, false)
    {
        Err(ProviderError::GrantFailed(msg)) => {
            assert!(msg.contains("without a shared fd"), "{msg}")
        }
        other => panic!("cross-process grant of fd-less memory: {other:?}"),
    }
    let e = n
        .qp()
        .post_recv(&[RecvWr {
            wr_id: 99,
            sge: amr.sge(0, 64),
        }])
        .unwrap_err();
    assert!(e.to_string().contains("without a shared fd"), "{e}");
    // Our grants: the parent writes one and reads the other.
    n.write(READ_SOURCE, &pattern(0xB, BIG));
    let (mr, qp) = (n.mr, n.qp());
    let gw = qp
        .grant(
            2,
            mr.sge(WRITE_TARGET as u64, BIG as u32),
            Access::RemoteWrite,
            false,
        )
        .unwrap();
    let gr = qp
        .grant(
            3,
            mr.sge(READ_SOURCE as u64, BIG as u32),
            Access::RemoteRead,
            false,
        )
        .unwrap();
    let mut words = grant_words(&gw).to_vec();
    words.extend(grant_words(&gr));
    n.send(TAG_GRANTS, &words, None);
    let (tag, words, inv) = n.recv();
    assert_eq!(tag, TAG_DONE);
    assert_eq!(inv, Some(gw.rkey), "the parent invalidated our write grant");
    assert!(
        n.read(WRITE_TARGET, BIG) == pattern(0xA, BIG),
        "the parent's RDMA Write: bytes differ"
    );
    let (parent_write, _) = remote_of(&words[0..2]);
    let (parent_read, _) = remote_of(&words[2..4]);
    assert_eq!(n.rdma(false, SCRATCH, parent_read, BIG), WcStatus::Success);
    assert!(
        n.read(SCRATCH, BIG) == pattern(0xC, BIG),
        "RDMA Read from the parent: bytes differ"
    );
    n.write(SCRATCH + BIG, &pattern(0xD, BIG));
    assert_eq!(
        n.rdma(true, SCRATCH + BIG, parent_write, BIG),
        WcStatus::Success
    );
    n.send(TAG_CHECKED, &[], None);
    n.qp().revoke(4, gw.rkey, false).unwrap();
    n.qp().revoke(5, gr.rkey, false).unwrap();
    n.qp().disconnect();
    let st = n.provider.stats();
    assert_eq!(
        (st.grants_invalidated, st.grants_revoked, st.grants_live),
        (1, 1, 0),
        "{st:?}"
    );
}
