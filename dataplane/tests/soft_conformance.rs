//! The provider conformance suite against the soft provider, twice: with two
//! providers (as a server and a client process would have) and with one
//! provider connecting to itself. Then what is specific to the soft
//! provider: its counters, its keys, its queue limits, its teardown.

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use smbdirect_dataplane::provider::conformance::{Fixture, FixtureRegion};
use smbdirect_dataplane::provider::soft::{BreakReason, SoftConfig, SoftProvider};
use smbdirect_dataplane::provider::{
    Access, Completion, CompletionQueue, ConnRequest, Listener, MemoryRegion, Provider,
    ProviderError, QpCaps, QpState, QueuePair, RecvWr, RemoteBuf, SendOp, SendWr, WcOpcode,
    WcStatus,
};
use smbdirect_hugepages::{
    Backing, BufferPool, HugepagePolicy, PoolConfig, SizeClass, HUGEPAGE_SIZE,
};

/// Two soft providers (or one) and memfd-backed memory for buffers.
struct SoftFixture {
    // Providers first: they are dropped before the memory they registered.
    server: SoftProvider,
    client: Option<SoftProvider>,
    pools: Mutex<Vec<BufferPool>>,
}

impl SoftFixture {
    fn two_providers() -> Self {
        SoftFixture {
            server: SoftProvider::new().expect("provider"),
            client: Some(SoftProvider::new().expect("provider")),
            pools: Mutex::new(Vec::new()),
        }
    }

    fn one_provider() -> Self {
        SoftFixture {
            server: SoftProvider::new().expect("provider"),
            client: None,
            pools: Mutex::new(Vec::new()),
        }
    }
}

/// A memfd-backed (shareable) region of at least `len` bytes.
fn shared_pool(len: usize, backing: Backing) -> BufferPool {
    PoolConfig::new(len.next_multiple_of(HUGEPAGE_SIZE), 1)
        .class(SizeClass::new("buf", 4096).per_slice(1))
        .backing(backing)
        .hugepages(HugepagePolicy::Disable)
        .mlock(false)
        .build()
        .expect("pool")
}

impl Fixture for SoftFixture {
    type P = SoftProvider;

    fn server(&self) -> &SoftProvider {
        &self.server
    }

    fn client(&self) -> &SoftProvider {
        self.client.as_ref().unwrap_or(&self.server)
    }

    fn listen_addr(&self) -> SocketAddr {
        "127.0.0.1:0".parse().unwrap()
    }

    fn region(&self, len: usize) -> FixtureRegion {
        let pool = shared_pool(len, Backing::SharedMemfd);
        let r = FixtureRegion {
            ptr: pool.region_base().as_ptr(),
            len: pool.region_len(),
            shared: Some((pool.shared_fd().expect("memfd").as_raw_fd(), 0)),
        };
        self.pools.lock().unwrap().push(pool);
        r
    }
}

mod two_providers {
    smbdirect_dataplane::provider_conformance_tests!(super::SoftFixture::two_providers());
}

mod one_provider {
    smbdirect_dataplane::provider_conformance_tests!(super::SoftFixture::one_provider());
}

// ---- soft-specific ----------------------------------------------------------

struct Side {
    cq: <SoftProvider as Provider>::Cq,
    qp: <SoftProvider as Provider>::Qp,
}

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 32,
        max_recv_wr: 32,
        max_sge: 4,
        ird: 8,
        ord: 8,
    }
}

fn connect(server: &SoftProvider, client: &SoftProvider, sc: QpCaps, cc: QpCaps) -> (Side, Side) {
    let mut l = server.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = l.local_addr();
    let (scq, ccq) = (
        server.create_cq(4096).unwrap(),
        client.create_cq(4096).unwrap(),
    );
    let (sh, ch) = (scq.handle(), ccq.handle());
    let (sqp, cqp) = std::thread::scope(|s| {
        let a = s.spawn(|| {
            l.accept_request(Duration::from_secs(5))
                .unwrap()
                .unwrap()
                .accept(&sh, sc, b"")
                .unwrap()
        });
        let c = client
            .connect(addr, &ch, cc, b"", Duration::from_secs(5))
            .unwrap()
            .0;
        (a.join().unwrap(), c)
    });
    (Side { cq: scq, qp: sqp }, Side { cq: ccq, qp: cqp })
}

/// Anonymous (not shareable) memory: reachable in-process only.
struct Mem {
    pool: BufferPool,
    mr: MemoryRegion,
}

fn mem(p: &SoftProvider, len: usize, backing: Backing) -> Mem {
    let pool = shared_pool(len, backing);
    // SAFETY: the pool outlives every provider in these tests (each test
    // declares its memory before its providers... or drops the providers
    // first explicitly).
    let mr = unsafe { p.register_pool(&pool) }.unwrap();
    Mem { pool, mr }
}

impl Mem {
    fn write(&self, off: usize, bytes: &[u8]) {
        // SAFETY: in bounds; no outstanding work request uses these bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.pool.region_base().as_ptr().add(off),
                bytes.len(),
            )
        }
    }
    fn read(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        // SAFETY: in bounds; reads only.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.pool.region_base().as_ptr().add(off),
                v.as_mut_ptr(),
                len,
            )
        };
        v
    }
}

fn wait(cq: &mut <SoftProvider as Provider>::Cq, n: usize) -> Vec<Completion> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut got = Vec::new();
    let mut out = [Completion::EMPTY; 16];
    while got.len() < n {
        let k = cq.poll(&mut out[..(n - got.len()).min(16)]);
        got.extend_from_slice(&out[..k]);
        assert!(
            Instant::now() < deadline,
            "{} of {n} completions: {got:?}",
            got.len()
        );
    }
    got
}

fn send1(side: &mut Side, wr_id: u64, m: &Mem, off: u64, len: u32) -> Result<(), ProviderError> {
    let sges = [m.mr.sge(off, len)];
    side.qp.post_send(&[SendWr {
        wr_id,
        op: SendOp::Send {
            sges: &sges,
            invalidate: None,
        },
        signaled: true,
    }])
}

#[test]
fn stats_count_rnr_length_and_access_errors_on_the_right_side() {
    let (s, c) = (SoftProvider::new().unwrap(), SoftProvider::new().unwrap());
    let sm = mem(&s, 1 << 16, Backing::SharedMemfd);
    let cm = mem(&c, 1 << 16, Backing::SharedMemfd);

    // RNR: counted by the sender.
    let (mut ss, mut cs) = connect(&s, &c, caps(), caps());
    send1(&mut ss, 1, &sm, 0, 10).unwrap();
    assert_eq!(wait(&mut ss.cq, 1)[0].status, WcStatus::RnrRetryExceeded);
    assert_eq!(
        cs.qp.break_info().map(|b| (b.reason, b.by_peer)),
        Some((BreakReason::ReceiverNotReady, true))
    );
    assert_eq!(
        ss.qp.break_info().map(|b| (b.reason, b.by_peer)),
        Some((BreakReason::ReceiverNotReady, false))
    );
    cs.cq.poll(&mut [Completion::EMPTY; 4]);

    // Length error: counted by the sender, reported on the receiver.
    let (mut ss2, mut cs2) = connect(&s, &c, caps(), caps());
    cs2.qp
        .post_recv(&[RecvWr {
            wr_id: 5,
            sge: cm.mr.sge(0, 8),
        }])
        .unwrap();
    send1(&mut ss2, 1, &sm, 0, 9).unwrap();
    assert_eq!(
        wait(&mut ss2.cq, 1)[0].status,
        WcStatus::Other(smbdirect_dataplane::provider::soft::WC_REMOTE_INVALID_REQUEST)
    );
    assert_eq!(wait(&mut cs2.cq, 1)[0].status, WcStatus::LocalLengthError);

    // Access violations of each kind: counted by the accessor as remote
    // access errors and by the victim by kind.
    // (what, where the write aims given the grant's rkey and address, grant direction)
    type Aim = fn(u32, u64) -> RemoteBuf;
    let kinds: [(&str, Aim, Access); 3] = [
        (
            "bad token",
            |k, a| RemoteBuf {
                addr: a,
                rkey: k ^ 0xffff_0000,
            },
            Access::RemoteWrite,
        ),
        (
            "out of range",
            |k, a| RemoteBuf {
                addr: a + 1,
                rkey: k,
            },
            Access::RemoteWrite,
        ),
        (
            "wrong direction",
            |k, a| RemoteBuf { addr: a, rkey: k },
            Access::RemoteRead,
        ),
    ];
    for (what, aim, access) in kinds {
        let (mut ss3, mut cs3) = connect(&s, &c, caps(), caps());
        cs3.qp
            .post_recv(&[RecvWr {
                wr_id: 9,
                sge: cm.mr.sge(4096, 64),
            }])
            .unwrap();
        let g = cs3.qp.grant(1, cm.mr.sge(0, 4096), access, false).unwrap();
        let sges = [sm.mr.sge(0, 4096)];
        let op = SendOp::RdmaWrite {
            sges: &sges,
            remote: aim(g.rkey, g.addr),
        };
        ss3.qp
            .post_send(&[SendWr {
                wr_id: 1,
                op,
                signaled: true,
            }])
            .unwrap();
        assert_eq!(
            wait(&mut ss3.cq, 1)[0].status,
            WcStatus::RemoteAccessError,
            "{what}"
        );
        // The victim's first flushed receive names the violation.
        let v = wait(&mut cs3.cq, 1)[0];
        assert_eq!(
            (v.wr_id, v.status),
            (9, WcStatus::RemoteAccessViolation),
            "{what}"
        );
        assert_eq!(
            cs3.qp.break_info().map(|b| (b.reason, b.by_peer)),
            Some((BreakReason::AccessViolation, true))
        );
        let st = c.stats();
        assert!(st.access_violations >= 1, "{what}: {st:?}");
    }
    let st = c.stats();
    assert_eq!(
        (
            st.refused_bad_token,
            st.refused_out_of_range,
            st.refused_wrong_direction
        ),
        (1, 1, 1),
        "{st:?}"
    );
    assert_eq!(st.access_violations, 3);
    let ss_ = s.stats();
    assert_eq!(
        (ss_.rnr_errors, ss_.length_errors, ss_.remote_access_errors),
        (1, 1, 3),
        "{ss_:?}"
    );
    assert_eq!(ss_.connections_established, 5);
    // Dropping each victim queue pair revoked its grant.
    assert_eq!(
        (st.grants_created, st.grants_revoked, st.grants_live),
        (3, 3, 0),
        "{st:?}"
    );
    drop((ss, cs, ss2, cs2));
    drop((s, c));
    drop((sm, cm));
}

#[test]
fn tokens_are_not_predictable_from_earlier_ones() {
    let (s, c) = (SoftProvider::new().unwrap(), SoftProvider::new().unwrap());
    let cm = mem(&c, 1 << 16, Backing::SharedMemfd);
    let (_ss, mut cs) = connect(
        &s,
        &c,
        QpCaps {
            max_send_wr: 512,
            ..caps()
        },
        QpCaps {
            max_send_wr: 512,
            ..caps()
        },
    );
    let mut keys = Vec::new();
    for i in 0..600u64 {
        let g = cs
            .qp
            .grant(i, cm.mr.sge(0, 4096), Access::RemoteWrite, false)
            .unwrap();
        cs.qp.revoke(i, g.rkey, i % 16 == 15).unwrap();
        keys.push(g.rkey);
        if i % 16 == 15 {
            wait(&mut cs.cq, 1);
        }
    }
    let slot_bits = c.config().grant_slots.trailing_zeros();
    let random: Vec<u32> = keys.iter().map(|k| k >> slot_bits).collect();
    let distinct: std::collections::HashSet<_> = keys.iter().collect();
    assert!(
        distinct.len() > 590,
        "only {} distinct tokens of 600",
        distinct.len()
    );
    // No arithmetic relation between consecutive tokens (rxe: +1 in the low byte).
    let deltas: std::collections::HashSet<_> =
        keys.windows(2).map(|w| w[1].wrapping_sub(w[0])).collect();
    assert!(
        deltas.len() > 500,
        "consecutive tokens differ by only {} distinct deltas",
        deltas.len()
    );
    // Every random bit position varies.
    let or = random.iter().fold(0, |a, r| a | r);
    let and = random.iter().fold(u32::MAX >> slot_bits, |a, r| a & r);
    assert_eq!(
        (or, and),
        (u32::MAX >> slot_bits, 0),
        "some token bits never change"
    );
}

#[test]
fn queue_depths_are_enforced_and_freed_by_polling() {
    let (s, c) = (SoftProvider::new().unwrap(), SoftProvider::new().unwrap());
    let sm = mem(&s, 1 << 16, Backing::SharedMemfd);
    let cm = mem(&c, 1 << 16, Backing::SharedMemfd);
    let cap = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 4,
        ..caps()
    };
    let (mut ss, mut cs) = connect(&s, &c, cap, cap);
    let recvs: Vec<RecvWr> = (0..5)
        .map(|i| RecvWr {
            wr_id: i,
            sge: cm.mr.sge(i * 64, 64),
        })
        .collect();
    assert!(
        matches!(cs.qp.post_recv(&recvs), Err(ProviderError::QueueFull)),
        "5 receives on a depth-4 queue"
    );
    cs.qp.post_recv(&recvs[..4]).unwrap();
    assert!(matches!(
        cs.qp.post_recv(&recvs[4..]),
        Err(ProviderError::QueueFull)
    ));
    for i in 0..4 {
        send1(&mut ss, i, &sm, 0, 8).unwrap();
    }
    assert!(
        matches!(send1(&mut ss, 9, &sm, 0, 8), Err(ProviderError::QueueFull)),
        "send queue holds 4"
    );
    // Consumed but not yet polled receives still count.
    assert!(matches!(
        cs.qp.post_recv(&recvs[4..]),
        Err(ProviderError::QueueFull)
    ));
    wait(&mut ss.cq, 4);
    wait(&mut cs.cq, 4);
    // Polling gave both queues their room back.
    cs.qp.post_recv(&recvs[..4]).unwrap();
    for i in 0..4 {
        send1(&mut ss, 10 + i, &sm, 0, 8).unwrap();
    }
    assert!(wait(&mut ss.cq, 4)
        .iter()
        .all(|c| c.status == WcStatus::Success));
    // A grant is a send-queue work request too.
    let cap1 = QpCaps {
        max_send_wr: 1,
        ..caps()
    };
    let (_ss2, mut cs2) = connect(&s, &c, cap1, cap1);
    let g = cs2
        .qp
        .grant(1, cm.mr.sge(0, 64), Access::RemoteRead, false)
        .unwrap();
    assert!(
        matches!(
            cs2.qp.revoke(2, g.rkey, true),
            Err(ProviderError::QueueFull)
        ),
        "unsignaled grant still occupies the queue"
    );
}

#[test]
fn completion_queue_refuses_more_queue_pairs_than_its_entries_hold() {
    let (s, c) = (SoftProvider::new().unwrap(), SoftProvider::new().unwrap());
    let mut l = s.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = l.local_addr();
    let small = c.create_cq(100).unwrap();
    let e = std::thread::scope(|sc| {
        sc.spawn(|| {
            // The connector fails before sending anything.
            let _ = l.accept_request(Duration::from_millis(300));
        });
        c.connect(
            addr,
            &small.handle(),
            QpCaps::default(),
            b"",
            Duration::from_secs(1),
        )
        .unwrap_err()
    });
    assert!(e.to_string().contains("overcommitted"), "{e}");
}

#[test]
fn revoke_waits_for_an_access_in_flight_and_nothing_lands_after_it() {
    let (s, c) = (SoftProvider::new().unwrap(), SoftProvider::new().unwrap());
    const LEN: usize = 1 << 20;
    let sm = mem(&s, LEN, Backing::SharedMemfd);
    let cm = mem(&c, LEN, Backing::SharedMemfd);
    sm.write(0, &vec![0xab; LEN]);
    for _ in 0..3 {
        let (mut ss, mut cs) = connect(&s, &c, caps(), caps());
        let g = cs
            .qp
            .grant(1, cm.mr.sge(0, LEN as u32), Access::RemoteWrite, false)
            .unwrap();
        let started = AtomicBool::new(false);
        std::thread::scope(|scope| {
            let writer = scope.spawn(|| {
                let sges = [sm.mr.sge(0, LEN as u32)];
                let mut n = 0u64;
                loop {
                    ss.qp
                        .post_send(&[SendWr {
                            wr_id: n,
                            op: SendOp::RdmaWrite {
                                sges: &sges,
                                remote: RemoteBuf {
                                    addr: g.addr,
                                    rkey: g.rkey,
                                },
                            },
                            signaled: true,
                        }])
                        .unwrap();
                    let cpl = wait(&mut ss.cq, 1)[0];
                    started.store(true, Ordering::Release);
                    if cpl.status != WcStatus::Success {
                        assert_eq!(cpl.status, WcStatus::RemoteAccessError);
                        return n;
                    }
                    n += 1;
                }
            });
            while !started.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
            cs.qp.revoke(2, g.rkey, false).unwrap();
            // Nothing can write after revoke returned: zero it and check.
            cm.write(0, &vec![0; LEN]);
            let writes = writer.join().unwrap();
            assert!(writes >= 1);
        });
        assert!(
            cm.read(0, LEN).iter().all(|&b| b == 0),
            "an RDMA Write landed after revoke returned"
        );
    }
}

#[test]
fn memory_registered_without_fd_works_in_process() {
    let (s, c) = (SoftProvider::new().unwrap(), SoftProvider::new().unwrap());
    let sm = mem(&s, 1 << 16, Backing::Anonymous);
    let cm = mem(&c, 1 << 16, Backing::Anonymous);
    let (mut ss, mut cs) = connect(&s, &c, caps(), caps());
    assert!(!cs.qp.is_cross_process());
    cs.qp
        .post_recv(&[RecvWr {
            wr_id: 1,
            sge: cm.mr.sge(0, 64),
        }])
        .unwrap();
    let g = cs
        .qp
        .grant(2, cm.mr.sge(4096, 4096), Access::RemoteWrite, false)
        .unwrap();
    sm.write(0, b"hello");
    sm.write(8192, &[7; 4096]);
    let data = [sm.mr.sge(8192, 4096)];
    let hdr = [sm.mr.sge(0, 5)];
    ss.qp
        .post_send(&[
            SendWr {
                wr_id: 1,
                op: SendOp::RdmaWrite {
                    sges: &data,
                    remote: RemoteBuf {
                        addr: g.addr,
                        rkey: g.rkey,
                    },
                },
                signaled: false,
            },
            SendWr {
                wr_id: 2,
                op: SendOp::Send {
                    sges: &hdr,
                    invalidate: Some(g.rkey),
                },
                signaled: true,
            },
        ])
        .unwrap();
    let rc = wait(&mut cs.cq, 1)[0];
    assert_eq!(
        (rc.status, rc.byte_len, rc.invalidated_rkey),
        (WcStatus::Success, 5, Some(g.rkey))
    );
    assert_eq!(cm.read(0, 5), b"hello");
    assert_eq!(cm.read(4096, 4096), vec![7; 4096]);
    assert_eq!(c.stats().grants_invalidated, 1);
    assert_eq!(c.stats().grants_live, 0);
}

#[test]
fn local_sges_outside_registered_memory_are_refused() {
    let (s, c) = (SoftProvider::new().unwrap(), SoftProvider::new().unwrap());
    let sm = mem(&s, 1 << 16, Backing::SharedMemfd);
    let cm = mem(&c, 1 << 16, Backing::SharedMemfd);
    let (mut ss, mut cs) = connect(&s, &c, caps(), caps());
    // A receive past the end of its region is refused at post time.
    let e = cs
        .qp
        .post_recv(&[RecvWr {
            wr_id: 1,
            sge: cm.mr.sge(cm.mr.len - 10, 64),
        }])
        .unwrap_err();
    assert!(e.to_string().contains("not inside a region"), "{e}");
    // Another provider's lkey is not ours.
    let e = cs
        .qp
        .post_recv(&[RecvWr {
            wr_id: 1,
            sge: sm.mr.sge(0, 64),
        }])
        .unwrap_err();
    assert!(e.to_string().contains("not inside a region"), "{e}");
    cs.qp
        .post_recv(&[RecvWr {
            wr_id: 2,
            sge: cm.mr.sge(0, 64),
        }])
        .unwrap();
    // A send gathering from outside: LocalProtectionError, connection lost.
    let mut bad = sm.mr.sge(0, 8);
    bad.lkey ^= 0x8000_0000;
    let sges = [bad];
    ss.qp
        .post_send(&[SendWr {
            wr_id: 3,
            op: SendOp::Send {
                sges: &sges,
                invalidate: None,
            },
            signaled: false,
        }])
        .unwrap();
    let sc = wait(&mut ss.cq, 1)[0];
    assert_eq!(
        (sc.wr_id, sc.status),
        (3, WcStatus::LocalProtectionError),
        "errors complete even unsignaled"
    );
    assert_eq!(wait(&mut cs.cq, 1)[0].status, WcStatus::Flushed);
    assert_eq!(s.stats().local_protection_errors, 1);
}

#[test]
fn listen_address_in_use_is_refused_and_wildcard_listener_is_reachable() {
    let (s, c) = (SoftProvider::new().unwrap(), SoftProvider::new().unwrap());
    let l = s.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let e = c.listen(l.local_addr()).unwrap_err();
    assert!(e.to_string().contains("in use"), "{e}");
    // A listener on 0.0.0.0:P accepts connections to 127.0.0.2:P, as TCP would.
    let mut wild = None;
    for attempt in 0..64u32 {
        let port = 20000 + ((std::process::id().wrapping_mul(7) + attempt * 131) % 40000) as u16;
        let Ok(mut l) = s.listen(SocketAddr::new([0, 0, 0, 0].into(), port)) else {
            continue;
        };
        let cq = c.create_cq(1024).unwrap();
        let scq = s.create_cq(1024).unwrap();
        let (h, sh) = (cq.handle(), scq.handle());
        std::thread::scope(|sc| {
            sc.spawn(|| {
                l.accept_request(Duration::from_secs(5))
                    .unwrap()
                    .unwrap()
                    .accept(&sh, caps(), b"")
                    .unwrap()
            });
            c.connect(
                SocketAddr::new([127, 0, 0, 2].into(), port),
                &h,
                caps(),
                b"",
                Duration::from_secs(5),
            )
            .unwrap();
        });
        wild = Some(port);
        break;
    }
    assert!(wild.is_some(), "no free port for the wildcard listener");
    assert!(
        smbdirect_dataplane::provider::soft::rendezvous_name(l.local_addr())
            .starts_with("smbdirectd-soft/127.0.0.1:")
    );
}

#[test]
fn dropping_a_provider_breaks_its_connections() {
    let s = SoftProvider::new().unwrap();
    let c = SoftProvider::new().unwrap();
    let cm = mem(&c, 1 << 16, Backing::SharedMemfd);
    let (ss, mut cs) = connect(&s, &c, caps(), caps());
    cs.qp
        .post_recv(&[RecvWr {
            wr_id: 1,
            sge: cm.mr.sge(0, 64),
        }])
        .unwrap();
    drop(s);
    assert_eq!(
        ss.qp.break_info().map(|b| b.reason),
        Some(BreakReason::ProviderDropped)
    );
    let f = wait(&mut cs.cq, 1)[0];
    assert_eq!(
        (f.wr_id, f.status, f.opcode),
        (1, WcStatus::Flushed, WcOpcode::Recv)
    );
    assert_eq!(cs.qp.state(), QpState::Error);
    drop(ss);
    let st = c.stats();
    assert_eq!((st.connections_broken, st.flushed), (1, 1), "{st:?}");
}

#[test]
fn dropping_a_queue_pair_revokes_its_grants() {
    let (s, c) = (SoftProvider::new().unwrap(), SoftProvider::new().unwrap());
    let cm = mem(&c, 1 << 16, Backing::SharedMemfd);
    let (mut ss, mut cs) = connect(&s, &c, caps(), caps());
    let g: Vec<_> = (0..5)
        .map(|i| {
            cs.qp
                .grant(i, cm.mr.sge(i * 100, 100), Access::RemoteRead, false)
                .unwrap()
        })
        .collect();
    assert_eq!(c.stats().grants_live, 5);
    cs.qp.revoke(9, g[0].rkey, false).unwrap();
    assert_eq!(c.stats().grants_live, 4);
    drop(cs);
    let st = c.stats();
    assert_eq!(
        (st.grants_live, st.grants_created, st.grants_revoked),
        (0, 5, 5),
        "{st:?}"
    );
    // The peer's next access finds nothing.
    let sm = mem(&s, 4096, Backing::SharedMemfd);
    let sges = [sm.mr.sge(0, 100)];
    ss.qp
        .post_send(&[SendWr {
            wr_id: 1,
            op: SendOp::RdmaRead {
                sges: &sges,
                remote: RemoteBuf {
                    addr: g[1].addr,
                    rkey: g[1].rkey,
                },
            },
            signaled: true,
        }])
        .unwrap();
    assert_eq!(wait(&mut ss.cq, 1)[0].status, WcStatus::Flushed);
}

#[test]
fn grant_slots_per_queue_pair_are_bounded_and_remote_invalidations_are_reclaimed() {
    let cfg = SoftConfig {
        grants_per_qp: 4,
        ..SoftConfig::default()
    };
    let (s, c) = (
        SoftProvider::with_config(cfg).unwrap(),
        SoftProvider::with_config(cfg).unwrap(),
    );
    let sm = mem(&s, 1 << 16, Backing::SharedMemfd);
    let cm = mem(&c, 1 << 16, Backing::SharedMemfd);
    let (mut ss, mut cs) = connect(&s, &c, caps(), caps());
    assert_eq!(cs.qp.grant_capacity(), 4);
    let gs: Vec<_> = (0..4)
        .map(|i| {
            cs.qp
                .grant(i, cm.mr.sge(0, 64), Access::RemoteWrite, false)
                .unwrap()
        })
        .collect();
    let e = cs
        .qp
        .grant(9, cm.mr.sge(0, 64), Access::RemoteWrite, false)
        .unwrap_err();
    assert!(e.to_string().contains("grant slots"), "{e}");
    // The peer invalidates one; the upper layer never revokes it; its slot
    // comes back anyway.
    cs.qp
        .post_recv(&[RecvWr {
            wr_id: 1,
            sge: cm.mr.sge(4096, 64),
        }])
        .unwrap();
    let sges = [sm.mr.sge(0, 4)];
    ss.qp
        .post_send(&[SendWr {
            wr_id: 1,
            op: SendOp::Send {
                sges: &sges,
                invalidate: Some(gs[2].rkey),
            },
            signaled: true,
        }])
        .unwrap();
    assert_eq!(wait(&mut cs.cq, 1)[0].invalidated_rkey, Some(gs[2].rkey));
    let again = cs
        .qp
        .grant(10, cm.mr.sge(0, 64), Access::RemoteWrite, false)
        .unwrap();
    assert_ne!(again.rkey, gs[2].rkey);
    // Revoking the invalidated one later is still fine, and harmless.
    cs.qp.revoke(11, gs[2].rkey, false).unwrap();
    assert_eq!(c.stats().grants_live, 4);
}

#[test]
fn posts_after_disconnect_complete_flushed_and_state_says_who() {
    let (s, c) = (SoftProvider::new().unwrap(), SoftProvider::new().unwrap());
    let sm = mem(&s, 1 << 16, Backing::SharedMemfd);
    let (mut ss, cs) = connect(&s, &c, caps(), caps());
    ss.qp.disconnect();
    assert_eq!(ss.qp.state(), QpState::Disconnected);
    assert_eq!(cs.qp.state(), QpState::Error);
    assert_eq!(
        cs.qp.break_info().map(|b| (b.reason, b.by_peer)),
        Some((BreakReason::Disconnected, true))
    );
    assert!(matches!(
        ss.qp.grant(1, sm.mr.sge(0, 64), Access::RemoteRead, true),
        Err(ProviderError::NotConnected)
    ));
    send1(&mut ss, 7, &sm, 0, 8).unwrap();
    let f = wait(&mut ss.cq, 1)[0];
    assert_eq!(
        (f.wr_id, f.status, f.opcode),
        (7, WcStatus::Flushed, WcOpcode::Send)
    );
    assert!(s.stats().flushed >= 1);
    drop(cs);
}
