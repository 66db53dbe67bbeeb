//! Remote-access safety: a peer reaches only memory granted to it, only in
//! the direction granted, only through its own queue pair, only until the
//! grant is revoked, and cannot guess a token ([MS-SMBD] 3.1.4.3, 3.1.4.4;
//! RFC 5042). This goes beyond the provider conformance suite
//! (`dataplane/src/provider/conformance.rs`: `bad_token_refused_*`,
//! `wrong_qp_refused`, `out_of_range_refused`, `wrong_direction_refused`,
//! `revoked_by_*`) and the soft provider's own tests
//! (`dataplane/tests/soft_conformance.rs`:
//! `tokens_are_not_predictable_from_earlier_ones`, 600 tokens of one queue
//! pair):
//!
//! - every boundary of a grant (each side, crossing either end, around
//!   it, another grant's address with this token, an address that wraps);
//! - two grants over the same bytes, each keeping its own direction;
//! - a third provider (another peer of the grantor) holding a live token;
//! - stale tokens of a queue pair that granted and revoked hundreds of
//!   times, tried while the same memory is granted again;
//! - 10,000 tokens over 16 queue pairs and 10,000 of one queue pair
//!   (soft provider): duplicates, strides, which bits vary;
//! - end to end against `smbdirectd serve`: the daemon exposes no memory
//!   of its own, and a client cannot steer it into another connection's
//!   memory, through a read-only grant, or past a grant.
//!
//! The provider cases run on the soft provider here, and on verbs where an
//! RDMA device and `RXE_IP` exist (`remote_access::verbs::*` in the
//! Soft-RoCE guest of `scripts/rxe-tests.sh`); without one they say
//! "skipped" and pass. The token statistics are soft-only (rxe randomises
//! only the low 8 bits of a memory window's rkey).

mod common;
use common::*;

use smbdirect_dataplane::client::{buffer_descriptor, Client, ClientError};
use smbdirect_dataplane::provider::conformance::{Fixture, FixtureRegion};
use smbdirect_dataplane::provider::soft::SoftProvider;
use smbdirect_dataplane::provider::{
    Access, Completion, CompletionQueue, ConnRequest, Grant, Listener, MemoryRegion, Provider,
    QpCaps, QpState, QueuePair, RemoteBuf, SendOp, SendWr, Sge, WcStatus,
};
use smbdirect_dataplane::upper::{parse_rdma_done, rdma_echo_request};
use smbdirect_hugepages::{Backing, BufferPool, HugepagePolicy, PoolConfig, SizeClass};
use smbdirect_protocol::ntstatus::STATUS_SUCCESS;
use smbdirect_protocol::smbd::wire::BufferDescriptorRepr;
use smbdirect_protocol::smbd::SmbdConfig;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Mutex;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// Fixtures: the conformance suite's, plus a third provider

/// A provider under test with three instances: the grantor, its intended
/// peer, and a third party.
trait Rig: Fixture {
    /// Another peer of the grantor.
    fn third(&self) -> &Self::P;
}

/// Soft providers and memfd-backed memory.
struct SoftRig {
    // Providers first: dropped before the memory they registered.
    grantor: SoftProvider,
    peer: SoftProvider,
    third: SoftProvider,
    pools: Mutex<Vec<BufferPool>>,
}

impl SoftRig {
    fn new() -> SoftRig {
        SoftRig {
            grantor: SoftProvider::new().unwrap(),
            peer: SoftProvider::new().unwrap(),
            third: SoftProvider::new().unwrap(),
            pools: Mutex::new(Vec::new()),
        }
    }
}

impl Fixture for SoftRig {
    type P = SoftProvider;

    /// The grantor listens and accepts.
    fn server(&self) -> &SoftProvider {
        &self.grantor
    }

    fn client(&self) -> &SoftProvider {
        &self.peer
    }

    fn listen_addr(&self) -> SocketAddr {
        "127.0.0.1:0".parse().unwrap()
    }

    fn region(&self, len: usize) -> FixtureRegion {
        let pool = PoolConfig::new(len.next_multiple_of(2 << 20), 1)
            .class(SizeClass::new("buf", 4096).per_slice(1))
            .backing(Backing::SharedMemfd)
            .hugepages(HugepagePolicy::Disable)
            .mlock(false)
            .build()
            .expect("pool");
        let r = FixtureRegion {
            ptr: pool.region_base().as_ptr(),
            len: pool.region_len(),
            shared: Some((pool.shared_fd().expect("memfd").as_raw_fd(), 0)),
        };
        self.pools.lock().unwrap().push(pool);
        r
    }
}

impl Rig for SoftRig {
    fn third(&self) -> &SoftProvider {
        &self.third
    }
}

// ---------------------------------------------------------------------------
// Generic helpers

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 256,
        max_recv_wr: 16,
        max_sge: 4,
        ird: 8,
        ord: 8,
    }
}

/// One end of a connection.
struct End<P: Provider> {
    cq: P::Cq,
    qp: P::Qp,
}

/// Connects `connector` to `acceptor`; returns (acceptor's end,
/// connector's end).
fn pair<F: Rig>(f: &F, acceptor: &F::P, connector: &F::P) -> (End<F::P>, End<F::P>) {
    let mut listener = acceptor.listen(f.listen_addr()).expect("listen");
    let addr = listener.local_addr();
    let (acq, ccq) = (
        acceptor.create_cq(1024).expect("create_cq"),
        connector.create_cq(1024).expect("create_cq"),
    );
    let (ah, ch) = (acq.handle(), ccq.handle());
    let timeout = f.timeout();
    let (aqp, cqp) = std::thread::scope(|s| {
        let a = s.spawn(|| {
            listener
                .accept_request(timeout)
                .expect("accept_request")
                .expect("a connection request")
                .accept(&ah, caps(), b"")
                .expect("accept")
        });
        let c = connector
            .connect(addr, &ch, caps(), b"", timeout)
            .expect("connect")
            .0;
        (a.join().expect("acceptor"), c)
    });
    (End { cq: acq, qp: aqp }, End { cq: ccq, qp: cqp })
}

/// Registered fixture memory.
struct Mem {
    ptr: *mut u8,
    len: usize,
    mr: MemoryRegion,
}

fn mem<F: Rig>(f: &F, p: &F::P, len: usize) -> Mem {
    let r = f.region(len);
    // SAFETY: fixture memory stays mapped, used by nothing else, until the
    // fixture drops, after its providers.
    let mr = unsafe { p.register(r.ptr, len, r.shared) }.expect("register");
    Mem {
        ptr: r.ptr,
        len,
        mr,
    }
}

impl Mem {
    fn sge(&self, off: usize, len: usize) -> Sge {
        assert!(off + len <= self.len);
        self.mr.sge(off as u64, len as u32)
    }

    fn addr(&self, off: usize) -> u64 {
        self.mr.addr + off as u64
    }

    fn write(&self, off: usize, bytes: &[u8]) {
        assert!(off + bytes.len() <= self.len);
        // SAFETY: in bounds; written only while no work request uses it.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.add(off), bytes.len()) }
    }

    fn read(&self, off: usize, len: usize) -> Vec<u8> {
        assert!(off + len <= self.len);
        let mut v = vec![0; len];
        // SAFETY: as in `write`, for reads.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), v.as_mut_ptr(), len) };
        v
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(37).wrapping_add(seed) ^ 0xa5)
        .collect()
}

fn wait_one<P: Provider>(timeout: Duration, cq: &mut P::Cq, what: &str) -> Completion {
    let deadline = Instant::now() + timeout;
    let mut out = [Completion::EMPTY; 1];
    loop {
        if cq.poll(&mut out) == 1 {
            return out[0];
        }
        assert!(Instant::now() < deadline, "{what}: no completion");
        std::thread::yield_now();
    }
}

/// One RDMA Write (`write`) or Read between `local` and `remote`, waited
/// for; its completion status.
fn access<F: Rig>(
    f: &F,
    e: &mut End<F::P>,
    local: Sge,
    remote: RemoteBuf,
    write: bool,
) -> WcStatus {
    let sges = [local];
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
    e.qp.post_send(&[SendWr {
        wr_id: 7,
        op,
        signaled: true,
    }])
    .expect("post the RDMA operation");
    wait_one::<F::P>(f.timeout(), &mut e.cq, "RDMA operation").status
}

fn remote(addr: u64, rkey: u32) -> RemoteBuf {
    RemoteBuf { addr, rkey }
}

/// Grants on the grantor's end, waiting for the bind.
fn grant<F: Rig>(f: &F, e: &mut End<F::P>, sge: Sge, access: Access) -> Grant {
    let g = e.qp.grant(1, sge, access, true).expect("grant");
    let c = wait_one::<F::P>(f.timeout(), &mut e.cq, "bind");
    assert_eq!(c.status, WcStatus::Success, "bind: {c:?}");
    g
}

/// A refused access: `RemoteAccessError` at the accessor, whose queue
/// pair is then in error.
fn assert_refused<F: Rig>(f: &F, e: &mut End<F::P>, status: WcStatus, what: &str) {
    assert_eq!(status, WcStatus::RemoteAccessError, "{what}");
    let deadline = Instant::now() + f.timeout();
    let mut out = [Completion::EMPTY; 8];
    while e.qp.state() == QpState::Connected {
        assert!(
            Instant::now() < deadline,
            "{what}: the accessor's queue pair stayed up"
        );
        e.cq.poll(&mut out);
        std::thread::yield_now();
    }
}

// ---------------------------------------------------------------------------
// The provider cases

/// Grant geometry of [`access_reaches_exactly_the_granted_bytes`].
const GRANTOR_LEN: usize = 64 << 10;
const G_OFF: usize = 8192;
const G_LEN: usize = 4096;
const H_OFF: usize = 32 << 10;

/// Every access inside a grant works, in the granted direction; every
/// access that touches a byte outside it is refused whole, places and
/// returns nothing, and breaks only the accessor's connection.
fn access_reaches_exactly_the_granted_bytes<F: Rig>(f: &F) {
    let g_mem = mem(f, f.server(), GRANTOR_LEN);
    let p_mem = mem(f, f.client(), GRANTOR_LEN);
    let fence = pattern(1, GRANTOR_LEN);
    for write in [true, false] {
        let access_kind = if write {
            Access::RemoteWrite
        } else {
            Access::RemoteRead
        };
        // Inside: all of it, its first and last byte, a middle piece.
        g_mem.write(0, &fence);
        let (mut gr, mut pe) = pair(f, f.server(), f.client());
        let g = grant(f, &mut gr, g_mem.sge(G_OFF, G_LEN), access_kind);
        let _h = grant(f, &mut gr, g_mem.sge(H_OFF, G_LEN), access_kind);
        let mut expect = fence.clone();
        for (k, &(off, len)) in [(0, G_LEN), (0, 1), (G_LEN - 1, 1), (100, 1000)]
            .iter()
            .enumerate()
        {
            let data = pattern(10 + k as u8, len);
            p_mem.write(0, &data);
            let st = access(
                f,
                &mut pe,
                p_mem.sge(0, len),
                remote(g.addr + off as u64, g.rkey),
                write,
            );
            assert_eq!(st, WcStatus::Success, "{len} B at +{off} inside the grant");
            if write {
                expect[G_OFF + off..G_OFF + off + len].copy_from_slice(&data);
                assert!(
                    g_mem.read(0, GRANTOR_LEN) == expect,
                    "write inside the grant"
                );
            } else {
                assert_eq!(p_mem.read(0, len), fence[G_OFF + off..G_OFF + off + len]);
            }
        }
        drop((gr, pe));
        // Outside, each on a fresh connection (a refusal breaks it).
        let cases: [(&str, u64, usize); 8] = [
            ("the byte before the grant", g.addr - 1, 1),
            ("the byte after the grant", g.addr + G_LEN as u64, 1),
            ("crossing its end by one byte", g.addr + 1, G_LEN),
            ("crossing its start by one byte", g.addr - 1, 2),
            ("the grant and a byte either side", g.addr - 1, G_LEN + 2),
            (
                "registered bytes next to it",
                g.addr + G_LEN as u64 + 4096,
                64,
            ),
            ("another grant's bytes", g_mem.addr(H_OFF), 64),
            ("an address that wraps around", u64::MAX - 15, 64),
        ];
        for (what, addr, len) in cases {
            g_mem.write(0, &fence);
            let (mut gr, mut pe) = pair(f, f.server(), f.client());
            let g = grant(f, &mut gr, g_mem.sge(G_OFF, G_LEN), access_kind);
            let _h = grant(f, &mut gr, g_mem.sge(H_OFF, G_LEN), access_kind);
            // Addresses are relative to this connection's grant.
            let addr = addr.wrapping_sub(g_mem.addr(G_OFF)).wrapping_add(g.addr);
            let sentinel = pattern(99, len);
            p_mem.write(0, &sentinel);
            let st = access(f, &mut pe, p_mem.sge(0, len), remote(addr, g.rkey), write);
            let what = format!(
                "{} {what}",
                if write {
                    "RDMA Write to"
                } else {
                    "RDMA Read of"
                }
            );
            assert_refused(f, &mut pe, st, &what);
            assert!(
                g_mem.read(0, GRANTOR_LEN) == fence,
                "{what}: grantor memory changed"
            );
            assert_eq!(p_mem.read(0, len), sentinel, "{what}: bytes were returned");
        }
    }
}

/// Two grants over the same bytes, one for reading and one for writing:
/// each keeps its own direction.
fn overlapping_grants_keep_their_own_direction<F: Rig>(f: &F) {
    let g_mem = mem(f, f.server(), 16384);
    let p_mem = mem(f, f.client(), 16384);
    let fence = pattern(2, 16384);
    for wrong_write in [true, false] {
        g_mem.write(0, &fence);
        let (mut gr, mut pe) = pair(f, f.server(), f.client());
        let r = grant(f, &mut gr, g_mem.sge(4096, 4096), Access::RemoteRead);
        let w = grant(f, &mut gr, g_mem.sge(4096, 4096), Access::RemoteWrite);
        // Each works in its direction.
        let st = access(
            f,
            &mut pe,
            p_mem.sge(0, 4096),
            remote(r.addr, r.rkey),
            false,
        );
        assert_eq!(st, WcStatus::Success);
        assert_eq!(p_mem.read(0, 4096), fence[4096..8192]);
        let data = pattern(3, 4096);
        p_mem.write(0, &data);
        let st = access(f, &mut pe, p_mem.sge(0, 4096), remote(w.addr, w.rkey), true);
        assert_eq!(st, WcStatus::Success);
        assert_eq!(g_mem.read(4096, 4096), data);
        // The other direction through either is refused.
        let before = g_mem.read(0, 16384);
        p_mem.write(0, &pattern(4, 4096));
        let (g, what) = if wrong_write {
            (r, "writing through the read grant")
        } else {
            (w, "reading through the write grant")
        };
        let st = access(
            f,
            &mut pe,
            p_mem.sge(0, 4096),
            remote(g.addr, g.rkey),
            wrong_write,
        );
        assert_refused(f, &mut pe, st, what);
        assert!(
            g_mem.read(0, 16384) == before,
            "{what}: grantor memory changed"
        );
        assert_eq!(
            p_mem.read(0, 4096),
            pattern(4, 4096),
            "{what}: bytes returned"
        );
    }
}

/// Another peer of the grantor, on its own connection, holding a live
/// token and its address (as a snooping or confused peer might), is
/// refused; the intended peer's access works before and after.
fn third_party_with_a_live_token_is_refused<F: Rig>(f: &F) {
    let g_mem = mem(f, f.server(), 16384);
    let p_mem = mem(f, f.client(), 16384);
    let t_mem = mem(f, f.third(), 16384);
    let fence = pattern(5, 16384);
    for write in [true, false] {
        g_mem.write(0, &fence);
        let (mut gr, mut pe) = pair(f, f.server(), f.client());
        let (_gr3, mut th) = pair(f, f.server(), f.third());
        let kind = if write {
            Access::RemoteWrite
        } else {
            Access::RemoteRead
        };
        let g = grant(f, &mut gr, g_mem.sge(4096, 4096), kind);
        let st = access(
            f,
            &mut pe,
            p_mem.sge(0, 4096),
            remote(g.addr, g.rkey),
            write,
        );
        assert_eq!(st, WcStatus::Success, "the intended peer");
        let before = g_mem.read(0, 16384);
        t_mem.write(0, &pattern(6, 4096));
        let st = access(
            f,
            &mut th,
            t_mem.sge(0, 4096),
            remote(g.addr, g.rkey),
            write,
        );
        assert_refused(f, &mut th, st, "the third party");
        assert!(
            g_mem.read(0, 16384) == before,
            "the third party changed memory"
        );
        assert_eq!(
            t_mem.read(0, 4096),
            pattern(6, 4096),
            "the third party got bytes"
        );
        let st = access(
            f,
            &mut pe,
            p_mem.sge(0, 4096),
            remote(g.addr, g.rkey),
            write,
        );
        assert_eq!(
            st,
            WcStatus::Success,
            "the intended peer, after the third party"
        );
    }
}

/// A queue pair grants and revokes the same bytes hundreds of times; then,
/// with those bytes granted again, stale tokens are tried by its own peer
/// (the only one a token could ever work for): the latest, the first, and
/// one revoked long ago. Each is refused and places nothing.
fn stale_tokens_stay_dead_while_the_memory_is_granted_again<F: Rig>(f: &F) {
    const CYCLES: usize = 300;
    let g_mem = mem(f, f.server(), 16384);
    let p_mem = mem(f, f.client(), 16384);
    let fence = pattern(7, 16384);
    for pick in [CYCLES - 1, 0, CYCLES / 2] {
        g_mem.write(0, &fence);
        let (mut gr, mut pe) = pair(f, f.server(), f.client());
        let mut old = Vec::with_capacity(CYCLES);
        for _ in 0..CYCLES {
            let g = gr
                .qp
                .grant(1, g_mem.sge(4096, 4096), Access::RemoteWrite, false)
                .expect("grant");
            old.push(g);
            gr.qp.revoke(2, g.rkey, true).expect("revoke");
            wait_one::<F::P>(f.timeout(), &mut gr.cq, "revoke");
        }
        let live = grant(f, &mut gr, g_mem.sge(4096, 4096), Access::RemoteWrite);
        // A token is a slot index plus random bits: the live one equals a
        // revoked one by chance only (soft: 1 in 65,536 per reuse of a slot).
        let stale = old[pick];
        if stale.rkey == live.rkey {
            eprintln!("stale token #{pick} was handed out again by chance; not tried");
            continue;
        }
        p_mem.write(0, &pattern(8, 4096));
        let st = access(
            f,
            &mut pe,
            p_mem.sge(0, 4096),
            remote(stale.addr, stale.rkey),
            true,
        );
        assert_refused(f, &mut pe, st, &format!("stale token #{pick} of {CYCLES}"));
        assert!(g_mem.read(0, 16384) == fence, "a stale token placed data");
    }
}

// ---------------------------------------------------------------------------
// Soft provider

mod soft {
    use super::*;

    #[test]
    fn access_reaches_exactly_the_granted_bytes() {
        super::access_reaches_exactly_the_granted_bytes(&SoftRig::new());
    }

    #[test]
    fn overlapping_grants_keep_their_own_direction() {
        super::overlapping_grants_keep_their_own_direction(&SoftRig::new());
    }

    #[test]
    fn third_party_with_a_live_token_is_refused() {
        super::third_party_with_a_live_token_is_refused(&SoftRig::new());
    }

    #[test]
    fn stale_tokens_stay_dead_while_the_memory_is_granted_again() {
        super::stale_tokens_stay_dead_while_the_memory_is_granted_again(&SoftRig::new());
    }

    /// 10,000 tokens from 16 queue pairs (interleaved) and 10,000 from one
    /// queue pair: no live token twice; no arithmetic relation between
    /// consecutive tokens (no repeated stride); every random bit set in
    /// 45-55 % of them; duplicates among revoked tokens no more often than
    /// chance allows for the random bits there are.
    #[test]
    fn ten_thousand_tokens_are_unpredictable() {
        const N: usize = 10_000;
        const QPS: usize = 16;
        let f = SoftRig::new();
        let slot_bits = f.grantor.config().grant_slots.trailing_zeros();
        let random_bits = 32 - slot_bits;
        let g_mem = mem(&f, f.server(), 1 << 20);
        // (grantor's end, peer's end): the peer's must stay open too.
        let mut conns: Vec<_> = (0..QPS).map(|_| pair(&f, f.server(), f.client())).collect();
        let mut ends: Vec<&mut End<SoftProvider>> = conns.iter_mut().map(|c| &mut c.0).collect();
        let mut report = Vec::new();
        for (label, qps) in [("16 queue pairs", QPS), ("one queue pair", 1)] {
            let mut tokens = Vec::with_capacity(N);
            let mut live: Vec<Vec<u32>> = vec![Vec::new(); qps];
            let mut live_set: HashSet<u32> = HashSet::new();
            for i in 0..N {
                let q = i % qps;
                let e = &mut *ends[q];
                let off = (i % 256) * 4096;
                let g =
                    e.qp.grant(1, g_mem.sge(off, 4096), Access::RemoteRead, false)
                        .expect("grant");
                assert!(
                    live_set.insert(g.rkey),
                    "live token {:#x} handed out twice",
                    g.rkey
                );
                tokens.push(g.rkey);
                live[q].push(g.rkey);
                // Keep up to 64 live per queue pair; revoke the oldest.
                if live[q].len() > 64 {
                    let old = live[q].remove(0);
                    live_set.remove(&old);
                    e.qp.revoke(2, old, true).expect("revoke");
                    wait_one::<SoftProvider>(f.timeout(), &mut e.cq, "revoke");
                }
            }
            for (q, keys) in live.iter_mut().enumerate() {
                for k in keys.drain(..) {
                    ends[q].qp.revoke(2, k, true).expect("revoke");
                    wait_one::<SoftProvider>(f.timeout(), &mut ends[q].cq, "revoke");
                }
            }
            // Strides: the most frequent difference between consecutive
            // tokens (and between tokens of the same queue pair).
            let mut deltas: HashMap<u32, usize> = HashMap::new();
            for w in tokens.windows(2) {
                *deltas.entry(w[1].wrapping_sub(w[0])).or_default() += 1;
            }
            let top_delta = deltas.values().copied().max().unwrap_or(0);
            let mut per_qp: HashMap<u32, usize> = HashMap::new();
            for q in 0..qps {
                let mine: Vec<u32> = tokens.iter().skip(q).step_by(qps).copied().collect();
                for w in mine.windows(2) {
                    *per_qp.entry(w[1].wrapping_sub(w[0])).or_default() += 1;
                }
            }
            let top_qp_delta = per_qp.values().copied().max().unwrap_or(0);
            // (Random 16-bit differences over 10,000 pairs repeat a few
            // times by chance; a stride would repeat thousands of times.)
            assert!(
                top_delta <= N / 1000 && top_qp_delta <= N / 1000,
                "{label}: a stride repeats: {top_delta} / {top_qp_delta} times"
            );
            // Every random bit varies, about half the time.
            for b in slot_bits..32 {
                let ones = tokens.iter().filter(|t| *t >> b & 1 == 1).count();
                let share = ones as f64 / N as f64;
                assert!(
                    (0.45..=0.55).contains(&share),
                    "{label}: token bit {b} is set in {:.1} % of tokens",
                    share * 100.0
                );
            }
            // Duplicates: revoked tokens may come back only by chance: a
            // slot's token is its index plus `random_bits` fresh bits.
            let distinct: HashSet<u32> = tokens.iter().copied().collect();
            let dups = N - distinct.len();
            let mut per_slot: HashMap<u32, usize> = HashMap::new();
            for t in &tokens {
                *per_slot.entry(t & ((1 << slot_bits) - 1)).or_default() += 1;
            }
            let expected: f64 = per_slot
                .values()
                .map(|&n| (n * n.saturating_sub(1)) as f64 / 2.0 / (1u64 << random_bits) as f64)
                .sum();
            assert!(
                (dups as f64) <= 3.0 * expected + 3.0,
                "{label}: {dups} duplicate tokens; chance gives about {expected:.2}"
            );
            report.push(format!(
                "{label}: {N} tokens over {} slots, {dups} duplicates (chance: {expected:.2}), most repeated stride {top_delta} (per queue pair {top_qp_delta})",
                per_slot.len()
            ));
        }
        // Two providers' tokens do not follow each other either.
        eprintln!(
            "tokens: {} slot bits (the grant slot), {random_bits} random bits; {}",
            slot_bits,
            report.join("; ")
        );
    }
}

// ---------------------------------------------------------------------------
// Verbs (the Soft-RoCE guest, or real hardware)

mod verbs {
    use super::*;
    use smbdirect_dataplane::provider::verbs::{devices, VerbsConfig, VerbsProvider};
    use std::net::IpAddr;

    struct VerbsRig {
        // Providers first: they deregister before the memory goes.
        grantor: VerbsProvider,
        peer: VerbsProvider,
        third: VerbsProvider,
        ip: IpAddr,
        maps: Maps,
    }

    #[derive(Default)]
    struct Maps(Mutex<Vec<(usize, usize)>>);

    impl Drop for Maps {
        fn drop(&mut self) {
            for &(p, len) in self.0.lock().unwrap().iter() {
                // SAFETY: mappings made by `region`, no longer registered.
                unsafe { libc::munmap(p as *mut libc::c_void, len) };
            }
        }
    }

    impl VerbsRig {
        /// The rig, or `None` (having said why) without a device.
        fn new() -> Option<VerbsRig> {
            let case = std::thread::current()
                .name()
                .unwrap_or("remote_access::verbs")
                .to_string();
            if devices().map(|d| d.is_empty()).unwrap_or(true) {
                eprintln!("{case}: skipped: no RDMA device (runs in the rxe guest)");
                return None;
            }
            let Some(ip) = std::env::var("RXE_IP")
                .or_else(|_| std::env::var("SMBD_VERBS_TEST_IP"))
                .ok()
                .and_then(|v| v.parse().ok())
            else {
                eprintln!("{case}: skipped: neither RXE_IP nor SMBD_VERBS_TEST_IP is set");
                return None;
            };
            let open = || VerbsProvider::open(VerbsConfig::default()).expect("open verbs");
            Some(VerbsRig {
                grantor: open(),
                peer: open(),
                third: open(),
                ip,
                maps: Maps::default(),
            })
        }
    }

    impl Fixture for VerbsRig {
        type P = VerbsProvider;

        fn server(&self) -> &VerbsProvider {
            &self.grantor
        }

        fn client(&self) -> &VerbsProvider {
            &self.peer
        }

        fn listen_addr(&self) -> SocketAddr {
            SocketAddr::new(self.ip, 0)
        }

        fn region(&self, len: usize) -> FixtureRegion {
            let len = len.max(1).next_multiple_of(4096);
            // SAFETY: a fresh private anonymous mapping, unmapped when the
            // rig drops, after its providers.
            let ptr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(ptr, libc::MAP_FAILED, "mmap");
            self.maps.0.lock().unwrap().push((ptr as usize, len));
            FixtureRegion {
                ptr: ptr.cast(),
                len,
                shared: None,
            }
        }

        fn fatal_errors_reach_the_peer(&self) -> bool {
            false
        }

        fn timeout(&self) -> Duration {
            Duration::from_secs(20)
        }
    }

    impl Rig for VerbsRig {
        fn third(&self) -> &VerbsProvider {
            &self.third
        }
    }

    #[test]
    fn access_reaches_exactly_the_granted_bytes() {
        if let Some(r) = VerbsRig::new() {
            super::access_reaches_exactly_the_granted_bytes(&r);
        }
    }

    #[test]
    fn overlapping_grants_keep_their_own_direction() {
        if let Some(r) = VerbsRig::new() {
            super::overlapping_grants_keep_their_own_direction(&r);
        }
    }

    #[test]
    fn third_party_with_a_live_token_is_refused() {
        if let Some(r) = VerbsRig::new() {
            super::third_party_with_a_live_token_is_refused(&r);
        }
    }

    #[test]
    fn stale_tokens_stay_dead_while_the_memory_is_granted_again() {
        if let Some(r) = VerbsRig::new() {
            super::stale_tokens_stay_dead_while_the_memory_is_granted_again(&r);
        }
    }
}

// ---------------------------------------------------------------------------
// End to end: `smbdirectd serve --upper echo`

fn cfg() -> SmbdConfig {
    SmbdConfig {
        receive_credit_max: 32,
        send_credit_target: 32,
        ..SmbdConfig::default()
    }
}

/// A client pool, one slice per connection, 1 MiB data buffers.
fn client_pool(provider: &SoftProvider, slices: usize) -> (BufferPool, MemoryRegion) {
    registered_pool(
        provider,
        slices,
        &[
            ("receive", 8192, 64),
            ("send", 1364, 128),
            ("data", 1 << 20, 3),
        ],
    )
}

fn connect(
    provider: &SoftProvider,
    port: u16,
    pool: &BufferPool,
    mr: MemoryRegion,
    slice: usize,
) -> Client<SoftProvider> {
    Client::connect(
        provider,
        format!("127.0.0.1:{port}").parse().unwrap(),
        cfg(),
        pool.claim_slice(slice).unwrap(),
        mr,
        Duration::from_secs(10),
    )
    .expect("connect and negotiate")
}

/// Waits until the connection ends; returns how the client saw it.
fn wait_for_end(c: &mut Client<SoftProvider>, what: &str) -> ClientError {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match c.step(&mut |m, _| panic!("{what}: unexpected message of {} B", m.len())) {
            Err(e) => return e,
            Ok(_) => assert!(
                Instant::now() < deadline,
                "{what}: the connection was not ended"
            ),
        }
    }
}

/// A verified RDMA echo of `len` bytes from `src` to `dst` (fresh grants).
fn echo_ok(
    c: &mut Client<SoftProvider>,
    src: smbdirect_hugepages::BufId,
    dst: smbdirect_hugepages::BufId,
    len: usize,
    seed: u8,
) {
    let data = pattern(seed, len);
    assert!(c.write_buffer(src, 0, &data));
    assert!(c.write_buffer(dst, 0, &vec![0; len]));
    let r = c.grant(src, 0, len, Access::RemoteRead).unwrap();
    let w = c.grant(dst, 0, len, Access::RemoteWrite).unwrap();
    c.send(&rdma_echo_request(
        len as u32,
        &[buffer_descriptor(&r).to_bytes()],
        &[buffer_descriptor(&w).to_bytes()],
        0,
    ))
    .unwrap();
    let (st, n) = c
        .recv_with(Duration::from_secs(20), |m| {
            parse_rdma_done(m).expect("RDMADONE")
        })
        .unwrap();
    assert_eq!((st, n as usize), (STATUS_SUCCESS, len));
    let mut back = vec![0; len];
    assert!(c.read_buffer(dst, 0, &mut back));
    assert!(back == data, "the healthy connection's echo differs");
    c.revoke(r.rkey).unwrap();
    c.revoke(w.rkey).unwrap();
}

/// A client cannot steer the daemon into memory it was not granted: not
/// another connection's live grant, not through a read-only grant as the
/// destination, not past the end of a grant, not a grant of a connection
/// that has closed. Each attempt ends only the attempting connection; the
/// victim's bytes do not change; a healthy connection keeps echoing.
#[test]
fn the_daemon_cannot_be_steered_outside_what_a_connection_granted() {
    let _serial = serial();
    let port = free_port();
    let d = spawn(port, &[]);
    let provider = SoftProvider::new().unwrap();
    let (pool, mr) = client_pool(&provider, 8);
    let mut healthy = connect(&provider, port, &pool, mr, 0);
    let hsrc = healthy.alloc_buffer(1 << 20).unwrap();
    let hdst = healthy.alloc_buffer(1 << 20).unwrap();
    echo_ok(&mut healthy, hsrc, hdst, 100_000, 1);

    // The victim: a live write grant and a live read grant.
    let mut victim = connect(&provider, port, &pool, mr, 1);
    let vbuf = victim.alloc_buffer(1 << 20).unwrap();
    let vfence = pattern(2, 1 << 20);
    assert!(victim.write_buffer(vbuf, 0, &vfence));
    let vw = victim.grant(vbuf, 0, 8192, Access::RemoteWrite).unwrap();
    let vr = victim.grant(vbuf, 8192, 8192, Access::RemoteRead).unwrap();
    let vbytes = |v: &Client<SoftProvider>| {
        let mut b = vec![0; 1 << 20];
        assert!(v.read_buffer(vbuf, 0, &mut b));
        b
    };

    let mut slice = 2;
    let mut attacker = |what: &str, build: &dyn Fn(&mut Client<SoftProvider>) -> Vec<u8>| {
        let mut a = connect(&provider, port, &pool, mr, slice);
        slice += 1;
        let req = build(&mut a);
        a.send(&req).unwrap();
        let e = wait_for_end(&mut a, what);
        eprintln!("remote access: {what}: the attacker's connection ended ({e})");
        drop(a.close(Duration::from_secs(2)));
    };
    // 1. Another connection's live grants, as the destination and as the source.
    attacker(
        "another connection's write grant as the destination",
        &|a| {
            let src = a.alloc_buffer(8192).unwrap();
            assert!(a.write_buffer(src, 0, &pattern(3, 8192)));
            let r = a.grant(src, 0, 8192, Access::RemoteRead).unwrap();
            rdma_echo_request(
                8192,
                &[buffer_descriptor(&r).to_bytes()],
                &[buffer_descriptor(&vw).to_bytes()],
                0,
            )
        },
    );
    assert!(vbytes(&victim) == vfence, "the victim's memory changed");
    attacker("another connection's read grant as the source", &|a| {
        let dst = a.alloc_buffer(8192).unwrap();
        let w = a.grant(dst, 0, 8192, Access::RemoteWrite).unwrap();
        rdma_echo_request(
            8192,
            &[buffer_descriptor(&vr).to_bytes()],
            &[buffer_descriptor(&w).to_bytes()],
            0,
        )
    });
    // 2. Its own read-only grant as the destination.
    attacker("a read-only grant as the destination", &|a| {
        let src = a.alloc_buffer(8192).unwrap();
        let dst = a.alloc_buffer(8192).unwrap();
        let r = a.grant(src, 0, 8192, Access::RemoteRead).unwrap();
        let ro = a.grant(dst, 0, 8192, Access::RemoteRead).unwrap();
        rdma_echo_request(
            8192,
            &[buffer_descriptor(&r).to_bytes()],
            &[buffer_descriptor(&ro).to_bytes()],
            0,
        )
    });
    // 3. A descriptor one byte longer than its grant.
    attacker("a descriptor one byte longer than its grant", &|a| {
        let src = a.alloc_buffer(8192).unwrap();
        let dst = a.alloc_buffer(8192).unwrap();
        let r = a.grant(src, 0, 8192, Access::RemoteRead).unwrap();
        let w = a.grant(dst, 0, 4096, Access::RemoteWrite).unwrap();
        let long = BufferDescriptorRepr {
            length: 4097,
            ..buffer_descriptor(&w)
        };
        rdma_echo_request(
            4097,
            &[buffer_descriptor(&r).to_bytes()],
            &[long.to_bytes()],
            0,
        )
    });
    // 4. The grants of a connection that has closed.
    let mut gone = connect(&provider, port, &pool, mr, 6);
    let gbuf = gone.alloc_buffer(8192).unwrap();
    let gw = gone.grant(gbuf, 0, 8192, Access::RemoteWrite).unwrap();
    drop(gone.close(Duration::from_secs(2)));
    attacker("a closed connection's grant", &|a| {
        let src = a.alloc_buffer(8192).unwrap();
        let r = a.grant(src, 0, 8192, Access::RemoteRead).unwrap();
        rdma_echo_request(
            8192,
            &[buffer_descriptor(&r).to_bytes()],
            &[buffer_descriptor(&gw).to_bytes()],
            0,
        )
    });
    // Nothing reached the victim; it and the healthy connection go on.
    assert!(vbytes(&victim) == vfence, "the victim's memory changed");
    echo_ok(&mut healthy, hsrc, hdst, 1 << 20, 4);
    let vdst = victim.alloc_buffer(1 << 20).unwrap();
    echo_ok(&mut victim, vbuf, vdst, 65536, 5);
    // The client sees a refused connection end before the daemon has
    // closed and counted it (worker, then control plane): wait for the
    // count, with a deadline, rather than read it once.
    let doc = wait_for_stats(
        &d,
        Duration::from_secs(20),
        "the 5 refused and the closed connection gone, 2 left",
        |doc| field(doc, "connections") == 2 && field(doc, "rdma_errors") >= 5,
    );
    assert_eq!(field(&doc, "rdma_errors"), 5, "{doc}");
    assert_eq!(
        field(&doc, "grants_created"),
        0,
        "the daemon granted nothing: {doc}"
    );
    drop(healthy.close(Duration::from_secs(2)));
    drop(victim.close(Duration::from_secs(2)));
    let (out, err) = terminate(d);
    let refused = err
        .lines()
        .filter(|l| l.contains("RemoteAccessError"))
        .count();
    assert_eq!(refused, 5, "one log line per refused connection:\n{err}");
    assert_final_pools_free(&out);
}

/// The daemon grants no remote access to its own memory: a client that
/// RDMA-reads or -writes the daemon with any token (zero, all ones, a
/// random one, one of its own) is refused, only its connection ends, and
/// a healthy connection keeps echoing.
#[test]
fn the_daemon_exposes_no_memory_of_its_own() {
    let _serial = serial();
    let port = free_port();
    let d = spawn(port, &[]);
    let provider = SoftProvider::new().unwrap();
    let (pool, mr) = client_pool(&provider, 12);
    let mut healthy = connect(&provider, port, &pool, mr, 0);
    let hsrc = healthy.alloc_buffer(1 << 20).unwrap();
    let hdst = healthy.alloc_buffer(1 << 20).unwrap();
    let before = stats_json(&d);
    let mut slice = 1;
    let mut attempts = 0;
    for write in [false, true] {
        for token in [0u32, 0xffff_ffff, 0x5eed_1234, 1] {
            let mut a = connect(&provider, port, &pool, mr, slice);
            slice += 1;
            let buf = a.alloc_buffer(4096).unwrap();
            assert!(a.write_buffer(buf, 0, &pattern(9, 4096)));
            // One of its own tokens, for the last try.
            let token = if token == 1 {
                a.grant(buf, 0, 4096, Access::RemoteWrite).unwrap().rkey
            } else {
                token
            };
            let sge = a.sge(buf, 0, 4096).unwrap();
            let sges = [sge];
            // The daemon's pool is somewhere in its address space: aim at
            // addresses of our own (the same layout is likely) and low ones.
            let remote = RemoteBuf {
                addr: if token & 1 == 0 { sge.addr } else { 0x1000 },
                rkey: token,
            };
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
            let refused_before = provider.stats().remote_access_errors;
            a.endpoint_mut()
                .qp_mut()
                .post_send(&[SendWr {
                    wr_id: 0,
                    op,
                    signaled: true,
                }])
                .expect("post the RDMA operation");
            let e = wait_for_end(&mut a, "RDMA against the daemon");
            assert_eq!(
                provider.stats().remote_access_errors,
                refused_before + 1,
                "{} with token {token:#x}: not refused as a remote access error ({e})",
                if write { "RDMA Write" } else { "RDMA Read" }
            );
            if !write {
                let mut b = vec![0; 4096];
                assert!(a.read_buffer(buf, 0, &mut b));
                assert_eq!(b, pattern(9, 4096), "bytes came back from the daemon");
            }
            drop(a.close(Duration::from_secs(2)));
            attempts += 1;
            echo_ok(&mut healthy, hsrc, hdst, 65536, attempts as u8);
        }
    }
    // Provider counters reach `stats` within 100 ms; the refused
    // connections are closed a little after the client saw them end.
    let after = wait_for_stats(
        &d,
        Duration::from_secs(20),
        "every refused access counted and its connection closed",
        |doc| {
            field(doc, "access_violations") >= field(&before, "access_violations") + attempts
                && field(doc, "connections") == 1
        },
    );
    let violations = field(&after, "access_violations") - field(&before, "access_violations");
    eprintln!(
        "remote access: {attempts} RDMA accesses against the daemon, {violations} refused by it"
    );
    assert_eq!(violations, attempts, "{after}");
    assert_eq!(field(&after, "grants_created"), 0, "{after}");
    assert_eq!(field(&after, "connections"), 1, "{after}");
    drop(healthy.close(Duration::from_secs(2)));
    let (out, _err) = terminate(d);
    assert_final_pools_free(&out);
}

fn assert_final_pools_free(out: &str) {
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
