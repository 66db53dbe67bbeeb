//! The provider conformance suite: what SMB Direct needs of an RDMA provider
//! ([MS-SMBD] 1.5, 2.1, 3.1.4.3–3.1.4.6, Appendix A), as generic functions
//! that run against any [`Provider`] through a [`Fixture`].
//!
//! Each function is named for the behaviour it pins down, sets up its own
//! connections (between `Fixture::server()` and `Fixture::client()`) and
//! panics with a message on failure.
//! [`provider_conformance_tests!`](crate::provider_conformance_tests) expands to one `#[test]` per
//! function, so a provider's test file is:
//!
//! ```ignore
//! smbdirect_dataplane::provider_conformance_tests!(MyFixture::new());
//! ```
//!
//! The soft provider runs it in `tests/soft_conformance.rs`; the verbs
//! provider runs the same suite inside a Soft-RoCE VM. Requirements on a
//! provider beyond the trait signatures, all of which hardware meets when
//! configured for it:
//!
//! * a Send that finds no posted receive fails the sender's work request
//!   with [`WcStatus::RnrRetryExceeded`] in bounded time (verbs: create the
//!   QP with a finite `rnr_retry`, not 7);
//! * a refused RDMA access fails the accessor's work request with
//!   [`WcStatus::RemoteAccessError`], and the accessor's queue pair goes to
//!   [`QpState::Error`] with everything else posted on it flushed;
//! * after a connection breaks, every work request posted on either end
//!   completes (with [`WcStatus::Flushed`], or the error that broke it), or
//!   the post itself fails with [`ProviderError::NotConnected`].
//!
//! Where hardware is legitimately laxer than the soft provider — the
//! responder of an RNR or an access violation stays up until the requester
//! disconnects — [`Fixture::fatal_errors_reach_the_peer`] says so, and the
//! suite disconnects the failing end itself before checking the other.

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use crate::provider::{
    Access, Completion, CompletionQueue, ConnRequest, Grant, Listener, MemoryRegion, Provider,
    ProviderError, QpCaps, QpState, QueuePair, RecvWr, RemoteBuf, SendOp, SendWr, Sge, WcOpcode,
    WcStatus,
};

/// Memory a fixture hands out for test buffers.
#[derive(Debug, Clone, Copy)]
pub struct FixtureRegion {
    /// First byte: zero-filled, page aligned.
    pub ptr: *mut u8,
    /// Usable length (at least what was asked for).
    pub len: usize,
    /// What to pass as `shared` to [`Provider::register`]: the memfd backing
    /// it and the offset of `ptr` in it, or `None`.
    pub shared: Option<(RawFd, u64)>,
}

/// A provider under test: two providers (or one, twice), addresses to
/// listen on, and memory for buffers.
///
/// The suite registers fixture memory with [`Provider::register`], so the
/// memory must stay mapped until the providers are dropped: a fixture drops
/// its providers before its memory (declare the provider fields first).
pub trait Fixture: Sync {
    /// The provider type.
    type P: Provider;

    /// The passive end's provider: it listens and accepts.
    fn server(&self) -> &Self::P;

    /// The active end's provider: it connects. May be the same object as
    /// [`Self::server`].
    fn client(&self) -> &Self::P;

    /// An address for the server to listen on. Port 0 is fine (the suite
    /// connects to [`Listener::local_addr`]); otherwise return a fresh
    /// address per call, since the cases run in parallel.
    fn listen_addr(&self) -> SocketAddr;

    /// At least `len` bytes of zero-filled, page-aligned memory, used by
    /// nothing else and valid until the fixture is dropped.
    fn region(&self, len: usize) -> FixtureRegion;

    /// Whether a fatal error on one end (RNR, length error, refused access)
    /// breaks the other end by itself. The soft provider: yes. Verbs: the
    /// responder stays up until the requester disconnects, so return false
    /// and the suite disconnects the failing end before checking the other.
    fn fatal_errors_reach_the_peer(&self) -> bool {
        true
    }

    /// How long to wait for a completion or a state change.
    fn timeout(&self) -> Duration {
        Duration::from_secs(5)
    }
}

/// Expands to one `#[test]` per conformance case, each calling the case
/// with a fresh fixture built by `$fixture` (an expression).
#[macro_export]
macro_rules! provider_conformance_tests {
    ($fixture:expr) => {
        $crate::provider_conformance_tests!(@cases $fixture;
            send_receive_preserves_order,
            send_without_posted_receive_is_rnr_and_breaks_connection,
            message_longer_than_receive_buffer_is_length_error,
            rdma_write_read_across_region_boundaries_and_descriptor_arrays,
            rdma_write_visible_before_later_send,
            bad_token_refused_and_fatal_to_that_qp_only,
            wrong_qp_refused,
            out_of_range_refused,
            wrong_direction_refused,
            revoked_by_local_invalidate_never_works_again,
            revoked_by_send_with_invalidate,
            completion_batching,
            selective_signaling_retires_unsignaled_work,
            drain_marker_completes_behind_silent_sends,
            disconnect_surfaces_as_connection_loss_on_both_sides,
            dropped_queue_pair_surfaces_as_connection_loss,
            ird_ord_negotiated_to_minimum,
            private_data_round_trips,
            rejected_request_fails_connect,
            connect_without_listener_fails,
            receives_posted_at_accept_catch_the_first_send,
            deregistered_memory_names_nothing_and_registers_again,
        );
    };
    (@cases $fixture:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                let fixture = $fixture;
                $crate::provider::conformance::$case(&fixture);
            }
        )*
    };
}

// ---- helpers ---------------------------------------------------------------

/// Entries of every CQ the suite creates (enough for three default QPs).
const CQ_ENTRIES: u32 = 4096;

/// Small caps most cases use.
fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_sge: 4,
        ird: 8,
        ord: 8,
    }
}

/// One end of a connection: its completion queue and queue pair.
struct Side<P: Provider> {
    cq: P::Cq,
    qp: P::Qp,
}

struct Pair<P: Provider> {
    server: Side<P>,
    client: Side<P>,
    /// Private data the server's request carried.
    request_data: Vec<u8>,
    /// Private data the client got back.
    reply_data: Vec<u8>,
}

const CLIENT_PRIVATE: &[u8] = b"client private data";
const SERVER_PRIVATE: &[u8] = b"server private data";

fn connect<F: Fixture>(f: &F, server_caps: QpCaps, client_caps: QpCaps) -> Pair<F::P> {
    let mut listener = f.server().listen(f.listen_addr()).expect("listen");
    let addr = listener.local_addr();
    let server_cq = f.server().create_cq(CQ_ENTRIES).expect("server create_cq");
    let client_cq = f.client().create_cq(CQ_ENTRIES).expect("client create_cq");
    let (sh, ch) = (server_cq.handle(), client_cq.handle());
    let timeout = f.timeout();
    let ((server_qp, request_data), client) = std::thread::scope(|s| {
        let acceptor = s.spawn(|| {
            let req = listener
                .accept_request(timeout)
                .expect("accept_request")
                .expect("no connection request arrived");
            let data = req.private_data().to_vec();
            (
                req.accept(&sh, server_caps, SERVER_PRIVATE)
                    .expect("accept"),
                data,
            )
        });
        let client = f
            .client()
            .connect(addr, &ch, client_caps, CLIENT_PRIVATE, timeout);
        (acceptor.join().expect("acceptor panicked"), client)
    });
    let (client_qp, reply_data) = client.expect("connect");
    assert_eq!(server_qp.state(), QpState::Connected);
    assert_eq!(client_qp.state(), QpState::Connected);
    Pair {
        server: Side {
            cq: server_cq,
            qp: server_qp,
        },
        client: Side {
            cq: client_cq,
            qp: client_qp,
        },
        request_data,
        reply_data,
    }
}

/// Registered fixture memory.
struct Buf {
    ptr: *mut u8,
    len: usize,
    mr: MemoryRegion,
}

// SAFETY: a `Buf` is a view of fixture memory; the cases share it between
// their server and client threads exactly as a NIC shares memory with its
// host, ordering accesses by completions.
unsafe impl Send for Buf {}
// SAFETY: as above.
unsafe impl Sync for Buf {}

fn buf<F: Fixture>(f: &F, p: &F::P, len: usize) -> Buf {
    let r = f.region(len);
    assert!(r.len >= len);
    // SAFETY: the fixture guarantees the memory stays mapped, unused by
    // anything else, until it is dropped, after its providers.
    let mr = unsafe { p.register(r.ptr, len, r.shared) }.expect("register");
    Buf {
        ptr: r.ptr,
        len,
        mr,
    }
}

impl Buf {
    fn sge(&self, off: usize, len: usize) -> Sge {
        assert!(off + len <= self.len);
        self.mr.sge(off as u64, len as u32)
    }

    fn write(&self, off: usize, bytes: &[u8]) {
        assert!(off + bytes.len() <= self.len);
        // SAFETY: in bounds of fixture memory; the cases write a buffer only
        // while no work request that accesses it is outstanding.
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

/// `len` bytes that differ per `seed` and per position.
fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(31)
                .wrapping_add(seed.wrapping_mul(131)) as u8
                ^ 0x5a
        })
        .collect()
}

/// Polls until `n` completions arrived; panics after the fixture's timeout.
fn wait_for<P: Provider>(
    f: &impl Fixture,
    cq: &mut P::Cq,
    n: usize,
    what: &str,
) -> Vec<Completion> {
    let deadline = Instant::now() + f.timeout();
    let mut got = Vec::with_capacity(n);
    let mut out = [Completion::EMPTY; 16];
    while got.len() < n {
        let k = cq.poll(&mut out[..(n - got.len()).min(16)]);
        got.extend_from_slice(&out[..k]);
        if k == 0 {
            assert!(
                Instant::now() < deadline,
                "{what}: {} of {n} completions after {:?}: {got:?}",
                got.len(),
                f.timeout()
            );
            std::thread::yield_now();
        }
    }
    got
}

/// Polls for a short while and returns whatever arrives (for "nothing
/// else completes" checks).
fn drain<P: Provider>(cq: &mut P::Cq, wait: Duration) -> Vec<Completion> {
    let deadline = Instant::now() + wait;
    let mut got = Vec::new();
    let mut out = [Completion::EMPTY; 16];
    while Instant::now() < deadline {
        let k = cq.poll(&mut out);
        got.extend_from_slice(&out[..k]);
        if k == 0 {
            std::thread::yield_now();
        }
    }
    got
}

/// Waits until the side's QP leaves `Connected`, polling its CQ meanwhile;
/// returns what the CQ produced.
fn wait_broken<F: Fixture>(f: &F, side: &mut Side<F::P>, what: &str) -> Vec<Completion> {
    let deadline = Instant::now() + f.timeout();
    let mut got = Vec::new();
    let mut out = [Completion::EMPTY; 16];
    while side.qp.state() == QpState::Connected {
        assert!(
            Instant::now() < deadline,
            "{what}: queue pair still connected after {:?}",
            f.timeout()
        );
        let k = side.cq.poll(&mut out);
        got.extend_from_slice(&out[..k]);
        std::thread::yield_now();
    }
    got
}

fn recv(side: &mut Side<impl Provider>, wr_id: u64, sge: Sge) {
    side.qp
        .post_recv(&[RecvWr { wr_id, sge }])
        .expect("post_recv");
}

fn send(side: &mut Side<impl Provider>, wr_id: u64, sge: Sge, invalidate: Option<u32>) {
    let sges = [sge];
    side.qp
        .post_send(&[SendWr {
            wr_id,
            op: SendOp::Send {
                sges: &sges,
                invalidate,
            },
            signaled: true,
        }])
        .expect("post_send");
}

fn rdma(side: &mut Side<impl Provider>, wr_id: u64, sges: &[Sge], remote: RemoteBuf, write: bool) {
    let op = if write {
        SendOp::RdmaWrite { sges, remote }
    } else {
        SendOp::RdmaRead { sges, remote }
    };
    side.qp
        .post_send(&[SendWr {
            wr_id,
            op,
            signaled: true,
        }])
        .expect("post_send (RDMA)");
}

fn remote(g: &Grant) -> RemoteBuf {
    RemoteBuf {
        addr: g.addr,
        rkey: g.rkey,
    }
}

fn one(cs: &[Completion], wr_id: u64) -> Completion {
    let found: Vec<_> = cs.iter().filter(|c| c.wr_id == wr_id).collect();
    assert_eq!(
        found.len(),
        1,
        "exactly one completion for wr_id {wr_id} expected in {cs:?}"
    );
    *found[0]
}

/// The failing end's QP is in error; the other end's breaks too (by itself,
/// or after the failing end disconnects where the provider is laxer), and
/// receives posted on either end complete without success.
fn expect_connection_broken<F: Fixture>(
    f: &F,
    failing: &mut Side<F::P>,
    failing_completions: &[Completion],
    failing_recvs: &[u64],
    peer: &mut Side<F::P>,
    peer_recvs: &[u64],
) {
    assert_eq!(
        failing.qp.state(),
        QpState::Error,
        "the failing queue pair is in error"
    );
    let mut fc = failing_completions.to_vec();
    let missing = failing_recvs
        .iter()
        .filter(|w| !fc.iter().any(|c| c.wr_id == **w))
        .count();
    fc.extend(wait_for::<F::P>(
        f,
        &mut failing.cq,
        missing,
        "failing end's receives flush",
    ));
    for w in failing_recvs {
        let c = one(&fc, *w);
        assert_eq!(
            (c.opcode, c.status),
            (WcOpcode::Recv, WcStatus::Flushed),
            "failing end's receive {w}"
        );
    }
    if !f.fatal_errors_reach_the_peer() {
        failing.qp.disconnect();
    }
    let mut pc = wait_broken(f, peer, "peer of the failing end");
    let missing = peer_recvs
        .iter()
        .filter(|w| !pc.iter().any(|c| c.wr_id == **w))
        .count();
    pc.extend(wait_for::<F::P>(
        f,
        &mut peer.cq,
        missing,
        "peer's receives flush",
    ));
    for w in peer_recvs {
        let c = one(&pc, *w);
        assert_eq!(c.opcode, WcOpcode::Recv);
        assert!(
            matches!(
                c.status,
                WcStatus::Flushed | WcStatus::RemoteAccessViolation
            ),
            "peer's receive {w} completed {:?}",
            c.status
        );
    }
    assert_ne!(peer.qp.state(), QpState::Connected);
}

/// Posting on a broken queue pair fails with `NotConnected` or completes
/// `Flushed`.
fn expect_posts_flushed<F: Fixture>(f: &F, side: &mut Side<F::P>, b: &Buf) {
    let r = side.qp.post_recv(&[RecvWr {
        wr_id: 9001,
        sge: b.sge(0, 64),
    }]);
    let sges = [b.sge(64, 64)];
    let s = side.qp.post_send(&[SendWr {
        wr_id: 9002,
        op: SendOp::Send {
            sges: &sges,
            invalidate: None,
        },
        signaled: true,
    }]);
    let expected = [(9001, r), (9002, s)]
        .into_iter()
        .filter_map(|(w, r)| match r {
            Ok(()) => Some(w),
            Err(ProviderError::NotConnected) => None,
            Err(e) => panic!("post on a broken queue pair: {e}"),
        })
        .collect::<Vec<_>>();
    let cs = wait_for::<F::P>(f, &mut side.cq, expected.len(), "posts after the break");
    for w in expected {
        assert_eq!(
            one(&cs, w).status,
            WcStatus::Flushed,
            "work posted after the break"
        );
    }
}

/// [MS-SMBD] 3.1.4.5/3.1.4.6: the pieces of `[offset, offset + len)` of the
/// buffer a descriptor array describes, as (remote, offset in the transfer,
/// length), consuming the elements' lengths and trimming the first and last.
fn split(descs: &[Grant], offset: u64, len: u64) -> Vec<(RemoteBuf, u64, u32)> {
    let mut out = Vec::new();
    let (mut skip, mut left, mut done) = (offset, len, 0u64);
    for d in descs {
        let dlen = u64::from(d.len);
        if skip >= dlen {
            skip -= dlen;
            continue;
        }
        let n = (dlen - skip).min(left);
        out.push((
            RemoteBuf {
                addr: d.addr + skip,
                rkey: d.rkey,
            },
            done,
            n as u32,
        ));
        done += n;
        left -= n;
        skip = 0;
        if left == 0 {
            break;
        }
    }
    assert_eq!(left, 0, "descriptors too short");
    out
}

/// The SGEs covering bytes `[off, off + len)` of the concatenation of `sges`.
fn sub_sges(sges: &[Sge], off: u64, len: u64) -> Vec<Sge> {
    let mut out = Vec::new();
    let (mut skip, mut left) = (off, len);
    for s in sges {
        let slen = u64::from(s.len);
        if skip >= slen {
            skip -= slen;
            continue;
        }
        let n = (slen - skip).min(left);
        out.push(Sge {
            addr: s.addr + skip,
            len: n as u32,
            lkey: s.lkey,
        });
        left -= n;
        skip = 0;
        if left == 0 {
            break;
        }
    }
    assert_eq!(left, 0, "SGEs too short");
    out
}

// ---- cases -------------------------------------------------------------------

/// [MS-SMBD] 1.5, 2.1: reliable, in-order delivery; gathered sends arrive
/// whole, each in the next posted receive, completions in posting order.
pub fn send_receive_preserves_order<F: Fixture>(f: &F) {
    let mut p = connect(f, caps(), caps());
    const N: usize = 48;
    const SLOT: usize = 256;
    let s = buf(f, f.server(), 32 * 1024);
    let c = buf(f, f.client(), 32 * 1024);
    let recvs: Vec<RecvWr> = (0..N)
        .map(|i| RecvWr {
            wr_id: 1000 + i as u64,
            sge: c.sge(i * SLOT, SLOT),
        })
        .collect();
    p.client.qp.post_recv(&recvs).expect("post_recv");
    let lens: Vec<usize> = (0..N).map(|i| 1 + (i * 37) % 200).collect();
    for (i, len) in lens.iter().enumerate() {
        s.write(i * 8, &(i as u64).to_le_bytes());
        s.write(8192 + i * SLOT, &pattern(i as u32, *len));
    }
    let gathers: Vec<[Sge; 2]> = (0..N)
        .map(|i| [s.sge(i * 8, 8), s.sge(8192 + i * SLOT, lens[i])])
        .collect();
    for chunk in (0..N).collect::<Vec<_>>().chunks(4) {
        let wrs: Vec<SendWr<'_>> = chunk
            .iter()
            .map(|&i| SendWr {
                wr_id: i as u64,
                op: SendOp::Send {
                    sges: &gathers[i],
                    invalidate: None,
                },
                signaled: true,
            })
            .collect();
        p.server.qp.post_send(&wrs).expect("post_send");
    }
    let sent = wait_for::<F::P>(f, &mut p.server.cq, N, "send completions");
    let got = wait_for::<F::P>(f, &mut p.client.cq, N, "receive completions");
    for i in 0..N {
        let sc = sent[i];
        assert_eq!(
            (sc.wr_id, sc.status, sc.opcode),
            (i as u64, WcStatus::Success, WcOpcode::Send),
            "send {i}"
        );
        let rc = got[i];
        assert_eq!(
            (rc.wr_id, rc.status, rc.opcode),
            (1000 + i as u64, WcStatus::Success, WcOpcode::Recv),
            "receive {i}"
        );
        assert_eq!(rc.byte_len as usize, 8 + lens[i], "receive {i} length");
        assert_eq!(rc.invalidated_rkey, None);
        let bytes = c.read(i * SLOT, 8 + lens[i]);
        assert_eq!(
            u64::from_le_bytes(bytes[..8].try_into().unwrap()),
            i as u64,
            "message {i} landed in receive {i}"
        );
        assert_eq!(
            bytes[8..],
            pattern(i as u32, lens[i]),
            "message {i} payload"
        );
    }
    // And the other way.
    recv(&mut p.server, 77, s.sge(16384, 64));
    c.write(16384, b"pong");
    send(&mut p.client, 78, c.sge(16384, 4), None);
    let rc = wait_for::<F::P>(f, &mut p.server.cq, 1, "reverse receive")[0];
    assert_eq!(
        (rc.wr_id, rc.status, rc.byte_len),
        (77, WcStatus::Success, 4)
    );
    assert_eq!(s.read(16384, 4), b"pong");
    assert_eq!(
        wait_for::<F::P>(f, &mut p.client.cq, 1, "reverse send")[0].status,
        WcStatus::Success
    );
}

/// [`Provider::deregister`] gives a registration back: a grant through its
/// lkey is refused afterwards, giving it back twice is an error, and a
/// process may register and deregister memory far more often than the
/// provider holds registrations at once (the soft provider's table holds
/// 256; verbs unpins the pages each time). The memory registered once more
/// carries a Send and takes an RDMA Write through a grant, and that
/// registration is given back in turn once its queue pair is gone.
pub fn deregistered_memory_names_nothing_and_registers_again<F: Fixture>(f: &F) {
    const LEN: usize = 16384;
    const ROUNDS: usize = 600;
    let r = f.region(LEN);
    assert!(r.len >= LEN);
    let s = buf(f, f.server(), LEN);
    // SAFETY (every register and deregister below): fixture memory stays
    // mapped until the fixture is dropped; nothing uses a registration when
    // it is given back (no work request or grant was made with it, or its
    // queue pair was dropped).
    let first = unsafe { f.client().register(r.ptr, LEN, r.shared) }.expect("register");
    unsafe { f.client().deregister(&first) }.expect("deregister");
    assert!(
        unsafe { f.client().deregister(&first) }.is_err(),
        "a registration given back twice"
    );
    for round in 0..ROUNDS {
        let mr = unsafe { f.client().register(r.ptr, LEN, r.shared) }
            .unwrap_or_else(|e| panic!("register, round {round}: {e}"));
        unsafe { f.client().deregister(&mr) }
            .unwrap_or_else(|e| panic!("deregister, round {round}: {e}"));
    }
    let c = Buf {
        ptr: r.ptr,
        len: LEN,
        mr: unsafe { f.client().register(r.ptr, LEN, r.shared) }.expect("register again"),
    };
    let mut p = connect(f, caps(), caps());
    assert!(
        p.client
            .qp
            .grant(1, first.sge(0, 4096), Access::RemoteWrite, false)
            .is_err(),
        "a grant through a given-back lkey"
    );
    // A Send into the memory as registered again...
    recv(&mut p.client, 5, c.sge(8192, 256));
    s.write(0, &pattern(31, 200));
    send(&mut p.server, 6, s.sge(0, 200), None);
    let rc = wait_for::<F::P>(f, &mut p.client.cq, 1, "the receive")[0];
    assert_eq!(
        (rc.wr_id, rc.status, rc.byte_len),
        (5, WcStatus::Success, 200)
    );
    assert_eq!(c.read(8192, 200), pattern(31, 200));
    // ...and an RDMA Write through a grant of it.
    let g = p
        .client
        .qp
        .grant(2, c.sge(0, 4096), Access::RemoteWrite, false)
        .expect("grant");
    s.write(4096, &pattern(32, 4096));
    rdma(&mut p.server, 7, &[s.sge(4096, 4096)], remote(&g), true);
    let done = wait_for::<F::P>(f, &mut p.server.cq, 2, "the send and the write");
    assert_eq!(one(&done, 6).status, WcStatus::Success);
    assert_eq!(one(&done, 7).status, WcStatus::Success);
    assert_eq!(c.read(0, 4096), pattern(32, 4096));
    drop(p);
    unsafe { f.client().deregister(&c.mr) }.expect("deregister after the queue pair is gone");
}

/// A Send with no receive posted at the peer is RNR: the sender's work
/// request fails with `RnrRetryExceeded` and the connection is lost on both
/// ends (on hardware, once the RNR retries run out).
pub fn send_without_posted_receive_is_rnr_and_breaks_connection<F: Fixture>(f: &F) {
    let mut p = connect(f, caps(), caps());
    let s = buf(f, f.server(), 4096);
    let c = buf(f, f.client(), 4096);
    recv(&mut p.server, 7, s.sge(0, 256));
    s.write(1024, b"nobody is listening");
    send(&mut p.server, 1, s.sge(1024, 19), None);
    let cs = wait_for::<F::P>(f, &mut p.server.cq, 1, "RNR completion");
    let sc = one(&cs, 1);
    assert_eq!(
        (sc.opcode, sc.status),
        (WcOpcode::Send, WcStatus::RnrRetryExceeded)
    );
    expect_connection_broken(f, &mut p.server, &cs, &[7], &mut p.client, &[]);
    expect_posts_flushed(f, &mut p.client, &c);
    expect_posts_flushed(f, &mut p.server, &s);
}

/// A message longer than the posted receive buffer: the receive completes
/// with `LocalLengthError`, the Send fails, and the connection is lost.
pub fn message_longer_than_receive_buffer_is_length_error<F: Fixture>(f: &F) {
    let mut p = connect(f, caps(), caps());
    let s = buf(f, f.server(), 4096);
    let c = buf(f, f.client(), 4096);
    recv(&mut p.client, 5, c.sge(0, 64));
    recv(&mut p.client, 6, c.sge(64, 64));
    recv(&mut p.server, 8, s.sge(0, 64));
    s.write(1024, &pattern(1, 100));
    send(&mut p.server, 1, s.sge(1024, 100), None);
    let cc = wait_for::<F::P>(f, &mut p.client.cq, 1, "length error");
    let rc = one(&cc, 5);
    assert_eq!(
        (rc.opcode, rc.status),
        (WcOpcode::Recv, WcStatus::LocalLengthError)
    );
    let sc = wait_for::<F::P>(f, &mut p.server.cq, 1, "sender's completion");
    assert_ne!(
        one(&sc, 1).status,
        WcStatus::Success,
        "the oversized Send must fail"
    );
    // Both ends break; the receiver's other receive and the sender's flush.
    let mut cc = cc;
    cc.extend(wait_broken(f, &mut p.client, "receiver"));
    let missing = usize::from(!cc.iter().any(|c| c.wr_id == 6));
    cc.extend(wait_for::<F::P>(
        f,
        &mut p.client.cq,
        missing,
        "receiver flush",
    ));
    assert_eq!(one(&cc, 6).status, WcStatus::Flushed);
    let mut sc = sc;
    sc.extend(wait_broken(f, &mut p.server, "sender"));
    let missing = usize::from(!sc.iter().any(|c| c.wr_id == 8));
    sc.extend(wait_for::<F::P>(
        f,
        &mut p.server.cq,
        missing,
        "sender flush",
    ));
    assert_eq!(one(&sc, 8).status, WcStatus::Flushed);
}

/// [MS-SMBD] 3.1.4.3, 3.1.4.5, 3.1.4.6: a buffer registered as several
/// descriptors (here spanning two regions) is written and read at any
/// offset, with the local side also spanning regions and SGE boundaries
/// that do not line up with the descriptor boundaries.
pub fn rdma_write_read_across_region_boundaries_and_descriptor_arrays<F: Fixture>(f: &F) {
    let mut p = connect(f, caps(), caps());
    // Client: logical buffer = A[3192..8192] ++ B[0..7000] (12000 bytes).
    let a = buf(f, f.client(), 8192);
    let b = buf(f, f.client(), 8192);
    let c_msgs = buf(f, f.client(), 4096);
    let (a_off, a_len, b_len) = (3192usize, 5000usize, 7000usize);
    let total = a_len + b_len;
    let w = [
        p.client
            .qp
            .grant(1, a.sge(a_off, a_len), Access::RemoteWrite, false)
            .expect("grant"),
        p.client
            .qp
            .grant(2, b.sge(0, b_len), Access::RemoteWrite, false)
            .expect("grant"),
    ];
    let r = [
        p.client
            .qp
            .grant(3, a.sge(a_off, a_len), Access::RemoteRead, false)
            .expect("grant"),
        p.client
            .qp
            .grant(4, b.sge(0, b_len), Access::RemoteRead, true)
            .expect("grant"),
    ];
    let logical = |off: usize, len: usize| -> Vec<u8> {
        let mut v = a.read(a_off, a_len);
        v.extend(b.read(0, b_len));
        v[off..off + len].to_vec()
    };
    // Server: source = X[100..7100] ++ Y[0..5000]; splits at 7000, not 5000.
    let x = buf(f, f.server(), 16384);
    let y = buf(f, f.server(), 16384);
    let local = [x.sge(100, 7000), y.sge(0, 5000)];
    let write_local = |off: usize, bytes: &[u8]| {
        for (i, &byte) in bytes.iter().enumerate() {
            let at = off + i;
            if at < 7000 {
                x.write(100 + at, &[byte]);
            } else {
                y.write(at - 7000, &[byte]);
            }
        }
    };
    let mut seq = 100u64;
    let mut client_recv = 500u64;
    let mut transfer =
        |p: &mut Pair<F::P>, off: u64, len: u64, descs: &[Grant], local: &[Sge], write: bool| {
            let pieces = split(descs, off, len);
            let sges: Vec<Vec<Sge>> = pieces
                .iter()
                .map(|&(_, at, n)| sub_sges(local, at, u64::from(n)))
                .collect();
            let wrs: Vec<SendWr<'_>> = pieces
                .iter()
                .zip(&sges)
                .enumerate()
                .map(|(i, (&(remote, _, _), sges))| SendWr {
                    wr_id: seq + i as u64,
                    op: if write {
                        SendOp::RdmaWrite { sges, remote }
                    } else {
                        SendOp::RdmaRead { sges, remote }
                    },
                    signaled: i + 1 == pieces.len(),
                })
                .collect();
            p.server.qp.post_send(&wrs).expect("post RDMA chain");
            let last = seq + pieces.len() as u64 - 1;
            seq += 100;
            let cs = wait_for::<F::P>(f, &mut p.server.cq, 1, "RDMA chain");
            let want = if write {
                WcOpcode::RdmaWrite
            } else {
                WcOpcode::RdmaRead
            };
            assert_eq!(
                (cs[0].wr_id, cs[0].status, cs[0].opcode),
                (last, WcStatus::Success, want)
            );
            if write {
                // The data is known to be placed once a later Send arrived.
                recv(&mut p.client, client_recv, c_msgs.sge(0, 64));
                send(&mut p.server, seq, x.sge(8000, 4), None);
                seq += 1;
                let rc = wait_for::<F::P>(f, &mut p.client.cq, 1, "Send after the writes")[0];
                assert_eq!((rc.wr_id, rc.status), (client_recv, WcStatus::Success));
                client_recv += 1;
                wait_for::<F::P>(f, &mut p.server.cq, 1, "Send completion");
            }
            pieces.len()
        };
    // Bind completion of the signaled grant (unsignaled ones are retired by it).
    let bind = wait_for::<F::P>(f, &mut p.client.cq, 1, "bind")[0];
    assert_eq!(
        (bind.wr_id, bind.status, bind.opcode),
        (4, WcStatus::Success, WcOpcode::Bind)
    );

    let p1 = pattern(1, total);
    write_local(0, &p1);
    assert_eq!(transfer(&mut p, 0, total as u64, &w, &local, true), 2);
    assert_eq!(logical(0, total), p1, "whole-buffer write");
    assert_eq!(
        a.read(a_off - 1, 1),
        [0],
        "byte before the first descriptor untouched"
    );
    assert_eq!(
        b.read(b_len, 1),
        [0],
        "byte after the last descriptor untouched"
    );

    let p2 = pattern(2, 6000);
    write_local(0, &p2);
    assert_eq!(transfer(&mut p, 1000, 6000, &w, &local, true), 2);
    let mut expect = p1.clone();
    expect[1000..7000].copy_from_slice(&p2);
    assert_eq!(
        logical(0, total),
        expect,
        "write at an offset into the descriptor array"
    );

    // Read 9000 bytes from offset 2500 into Y[6000..10000] ++ X[9000..14000].
    let dest = [y.sge(6000, 4000), x.sge(9000, 5000)];
    assert_eq!(transfer(&mut p, 2500, 9000, &r, &dest, false), 2);
    let mut got = y.read(6000, 4000);
    got.extend(x.read(9000, 5000));
    assert_eq!(
        got,
        expect[2500..11500],
        "read at an offset across descriptors and local regions"
    );
}

/// [MS-SMBD] 1.5: data an RDMA Write placed is visible at the peer no later
/// than the completion of a Send posted after it on the same queue pair.
/// The server thread streams (write `data[r]`, send `r`) with a window of two
/// rounds; the client, on another thread, checks each round's data the
/// moment round r's receive completes, then returns a credit.
///
/// Why it must hold on the soft provider: the server thread's copy into the
/// client's buffer is sequenced before its Release store publishing the
/// receive completion; the client's poll Acquire-loads that index, so the
/// copy happens-before the client's check (no fence needed beyond that
/// pair). On verbs it is the RC ordering rule for RDMA Write followed by Send.
pub fn rdma_write_visible_before_later_send<F: Fixture>(f: &F) {
    let p = connect(f, caps(), caps());
    const ROUNDS: u32 = 200;
    const W: usize = 2;
    const LEN: usize = 4096;
    let s = buf(f, f.server(), W * LEN + 4096);
    let c = buf(f, f.client(), W * LEN + 4096);
    let Pair {
        mut server,
        mut client,
        ..
    } = p;
    let g = client
        .qp
        .grant(1, c.sge(0, W * LEN), Access::RemoteWrite, false)
        .expect("grant");
    for k in 0..W {
        recv(&mut client, k as u64, c.sge(W * LEN + k * 64, 64));
        recv(&mut server, k as u64, s.sge(W * LEN + k * 64, 64));
    }
    std::thread::scope(|scope| {
        let (s, c) = (&s, &c);
        let writer = scope.spawn(move || {
            let mut credits = W;
            for r in 0..ROUNDS {
                while credits == 0 {
                    for cpl in wait_for::<F::P>(f, &mut server.cq, 1, "credit") {
                        assert_eq!(cpl.status, WcStatus::Success, "{cpl:?}");
                        if cpl.opcode == WcOpcode::Recv {
                            credits += 1;
                            recv(
                                &mut server,
                                cpl.wr_id,
                                s.sge(W * LEN + cpl.wr_id as usize * 64, 64),
                            );
                        }
                    }
                }
                credits -= 1;
                let slot = r as usize % W;
                s.write(slot * LEN, &pattern(r, LEN));
                s.write(W * LEN + 2048 + slot * 8, &r.to_le_bytes());
                let data = [s.sge(slot * LEN, LEN)];
                let hdr = [s.sge(W * LEN + 2048 + slot * 8, 4)];
                let remote = RemoteBuf {
                    addr: g.addr + (slot * LEN) as u64,
                    rkey: g.rkey,
                };
                server
                    .qp
                    .post_send(&[
                        SendWr {
                            wr_id: 10_000 + u64::from(r),
                            op: SendOp::RdmaWrite {
                                sges: &data,
                                remote,
                            },
                            signaled: false,
                        },
                        SendWr {
                            wr_id: 20_000 + u64::from(r),
                            op: SendOp::Send {
                                sges: &hdr,
                                invalidate: None,
                            },
                            signaled: true,
                        },
                    ])
                    .expect("post write+send");
            }
            server
        });
        let mut r = 0;
        while r < ROUNDS {
            for cpl in wait_for::<F::P>(f, &mut client.cq, 1, "round") {
                assert_eq!(cpl.status, WcStatus::Success, "{cpl:?}");
                if cpl.opcode != WcOpcode::Recv {
                    continue; // a credit Send's completion
                }
                let at = W * LEN + cpl.wr_id as usize * 64;
                let round = u32::from_le_bytes(c.read(at, 4).try_into().unwrap());
                assert_eq!(round, r, "rounds arrive in order");
                let slot = r as usize % W;
                assert!(
                    c.read(slot * LEN, LEN) == pattern(r, LEN),
                    "round {r}: RDMA Write not visible at the later Send's completion"
                );
                recv(&mut client, cpl.wr_id, c.sge(at, 64));
                c.write(W * LEN + 3072 + slot * 8, &r.to_le_bytes());
                send(
                    &mut client,
                    30_000 + u64::from(r),
                    c.sge(W * LEN + 3072 + slot * 8, 4),
                    None,
                );
                r += 1;
            }
        }
        writer.join().expect("writer thread");
    });
}

/// Access with a token nobody granted is refused (`RemoteAccessError`),
/// breaks that connection only, and writes nothing; another connection
/// between the same two providers keeps working.
pub fn bad_token_refused_and_fatal_to_that_qp_only<F: Fixture>(f: &F) {
    let mut p1 = connect(f, caps(), caps());
    let mut p2 = connect(f, caps(), caps());
    let c = buf(f, f.client(), 16384);
    let s = buf(f, f.server(), 16384);
    let g1 = p1
        .client
        .qp
        .grant(1, c.sge(0, 4096), Access::RemoteWrite, false)
        .expect("grant");
    let g2 = p2
        .client
        .qp
        .grant(1, c.sge(4096, 4096), Access::RemoteWrite, false)
        .expect("grant");
    recv(&mut p1.client, 11, c.sge(8192, 64));
    recv(&mut p1.server, 12, s.sge(8192, 64));
    s.write(0, &pattern(3, 4096));
    let bad = RemoteBuf {
        addr: g1.addr,
        rkey: g1.rkey ^ 0x5a5a_5a00,
    };
    rdma(&mut p1.server, 1, &[s.sge(0, 4096)], bad, true);
    let cs = wait_for::<F::P>(f, &mut p1.server.cq, 1, "refused write");
    assert_eq!(one(&cs, 1).status, WcStatus::RemoteAccessError);
    assert!(
        c.read(0, 4096).iter().all(|&b| b == 0),
        "a refused write must not place data"
    );
    expect_connection_broken(f, &mut p1.server, &cs, &[12], &mut p1.client, &[11]);
    // The other connection between the same providers is unaffected.
    assert_eq!(p2.server.qp.state(), QpState::Connected);
    assert_eq!(p2.client.qp.state(), QpState::Connected);
    recv(&mut p2.client, 21, c.sge(8192 + 64, 64));
    let sges = [s.sge(0, 4096)];
    let hdr = [s.sge(8192 + 128, 8)];
    p2.server
        .qp
        .post_send(&[
            SendWr {
                wr_id: 1,
                op: SendOp::RdmaWrite {
                    sges: &sges,
                    remote: remote(&g2),
                },
                signaled: false,
            },
            SendWr {
                wr_id: 2,
                op: SendOp::Send {
                    sges: &hdr,
                    invalidate: None,
                },
                signaled: true,
            },
        ])
        .expect("post on the healthy connection");
    assert_eq!(
        wait_for::<F::P>(f, &mut p2.server.cq, 1, "healthy send")[0].status,
        WcStatus::Success
    );
    assert_eq!(
        wait_for::<F::P>(f, &mut p2.client.cq, 1, "healthy receive")[0].status,
        WcStatus::Success
    );
    assert_eq!(c.read(4096, 4096), pattern(3, 4096));
}

/// A grant is bound to the queue pair it was made on: using it through
/// another connection to the same peer is refused and breaks that
/// connection, and the grant still works on its own connection.
pub fn wrong_qp_refused<F: Fixture>(f: &F) {
    let mut p1 = connect(f, caps(), caps());
    let mut p2 = connect(f, caps(), caps());
    let c = buf(f, f.client(), 8192);
    let s = buf(f, f.server(), 8192);
    let g1 = p1
        .client
        .qp
        .grant(1, c.sge(0, 4096), Access::RemoteWrite, false)
        .expect("grant");
    recv(&mut p2.client, 21, c.sge(4096, 64));
    recv(&mut p2.server, 22, s.sge(4096, 64));
    s.write(0, &pattern(4, 4096));
    rdma(&mut p2.server, 1, &[s.sge(0, 4096)], remote(&g1), true);
    let cs = wait_for::<F::P>(f, &mut p2.server.cq, 1, "wrong-QP write");
    assert_eq!(one(&cs, 1).status, WcStatus::RemoteAccessError);
    assert!(
        c.read(0, 4096).iter().all(|&b| b == 0),
        "a refused write must not place data"
    );
    expect_connection_broken(f, &mut p2.server, &cs, &[22], &mut p2.client, &[21]);
    // On its own connection the grant works.
    recv(&mut p1.client, 11, c.sge(4096 + 64, 64));
    let sges = [s.sge(0, 4096)];
    let hdr = [s.sge(4096 + 128, 8)];
    p1.server
        .qp
        .post_send(&[
            SendWr {
                wr_id: 1,
                op: SendOp::RdmaWrite {
                    sges: &sges,
                    remote: remote(&g1),
                },
                signaled: false,
            },
            SendWr {
                wr_id: 2,
                op: SendOp::Send {
                    sges: &hdr,
                    invalidate: None,
                },
                signaled: true,
            },
        ])
        .expect("post");
    assert_eq!(
        wait_for::<F::P>(f, &mut p1.server.cq, 1, "send")[0].status,
        WcStatus::Success
    );
    assert_eq!(
        wait_for::<F::P>(f, &mut p1.client.cq, 1, "receive")[0].status,
        WcStatus::Success
    );
    assert_eq!(c.read(0, 4096), pattern(4, 4096));
}

/// An access that starts before or ends after the granted bytes is refused
/// whole (nothing placed, nothing read) and breaks the connection.
pub fn out_of_range_refused<F: Fixture>(f: &F) {
    let c = buf(f, f.client(), 16384);
    let s = buf(f, f.server(), 16384);
    c.write(0, &pattern(5, 8192));
    s.write(0, &pattern(6, 8192));
    // One byte past the end, writing.
    let mut p = connect(f, caps(), caps());
    let g = p
        .client
        .qp
        .grant(1, c.sge(1024, 2048), Access::RemoteWrite, false)
        .expect("grant");
    recv(&mut p.client, 11, c.sge(12288, 64));
    rdma(&mut p.server, 1, &[s.sge(0, 2049)], remote(&g), true);
    let cs = wait_for::<F::P>(f, &mut p.server.cq, 1, "write past the end");
    assert_eq!(one(&cs, 1).status, WcStatus::RemoteAccessError);
    assert_eq!(c.read(0, 8192), pattern(5, 8192), "nothing placed");
    expect_connection_broken(f, &mut p.server, &cs, &[], &mut p.client, &[11]);
    // One byte before the start, reading.
    let mut p = connect(f, caps(), caps());
    let g = p
        .client
        .qp
        .grant(1, c.sge(1024, 2048), Access::RemoteRead, false)
        .expect("grant");
    recv(&mut p.client, 11, c.sge(12288, 64));
    rdma(
        &mut p.server,
        1,
        &[s.sge(0, 16)],
        RemoteBuf {
            addr: g.addr - 1,
            rkey: g.rkey,
        },
        false,
    );
    let cs = wait_for::<F::P>(f, &mut p.server.cq, 1, "read before the start");
    assert_eq!(one(&cs, 1).status, WcStatus::RemoteAccessError);
    assert_eq!(
        s.read(0, 8192),
        pattern(6, 8192),
        "nothing read into local memory"
    );
    expect_connection_broken(f, &mut p.server, &cs, &[], &mut p.client, &[11]);
}

/// [MS-SMBD] 3.1.4.3: only the permissions asked for. Writing through a
/// read grant, or reading through a write grant, is refused.
pub fn wrong_direction_refused<F: Fixture>(f: &F) {
    let c = buf(f, f.client(), 16384);
    let s = buf(f, f.server(), 16384);
    c.write(0, &pattern(7, 8192));
    s.write(0, &pattern(8, 8192));
    let mut p = connect(f, caps(), caps());
    let g = p
        .client
        .qp
        .grant(1, c.sge(0, 4096), Access::RemoteRead, false)
        .expect("grant");
    recv(&mut p.client, 11, c.sge(12288, 64));
    rdma(&mut p.server, 1, &[s.sge(0, 4096)], remote(&g), true);
    let cs = wait_for::<F::P>(f, &mut p.server.cq, 1, "write through a read grant");
    assert_eq!(one(&cs, 1).status, WcStatus::RemoteAccessError);
    assert_eq!(c.read(0, 8192), pattern(7, 8192));
    expect_connection_broken(f, &mut p.server, &cs, &[], &mut p.client, &[11]);

    let mut p = connect(f, caps(), caps());
    let g = p
        .client
        .qp
        .grant(1, c.sge(4096, 4096), Access::RemoteWrite, false)
        .expect("grant");
    recv(&mut p.client, 11, c.sge(12288, 64));
    rdma(&mut p.server, 1, &[s.sge(0, 4096)], remote(&g), false);
    let cs = wait_for::<F::P>(f, &mut p.server.cq, 1, "read through a write grant");
    assert_eq!(one(&cs, 1).status, WcStatus::RemoteAccessError);
    assert_eq!(s.read(0, 8192), pattern(8, 8192));
    expect_connection_broken(f, &mut p.server, &cs, &[], &mut p.client, &[11]);
}

/// [MS-SMBD] 3.1.4.4: after a revoke completes no further remote access is
/// possible. The revoked token stays dead while the same memory is granted
/// again (and again), and is never handed out again.
pub fn revoked_by_local_invalidate_never_works_again<F: Fixture>(f: &F) {
    let mut p = connect(f, caps(), caps());
    let c = buf(f, f.client(), 8192);
    let s = buf(f, f.server(), 8192);
    let g = p
        .client
        .qp
        .grant(1, c.sge(0, 4096), Access::RemoteWrite, true)
        .expect("grant");
    let b = wait_for::<F::P>(f, &mut p.client.cq, 1, "bind")[0];
    assert_eq!(
        (b.wr_id, b.status, b.opcode),
        (1, WcStatus::Success, WcOpcode::Bind)
    );
    // It works...
    recv(&mut p.client, 11, c.sge(4096, 64));
    s.write(0, &pattern(9, 4096));
    let sges = [s.sge(0, 4096)];
    let hdr = [s.sge(4096, 8)];
    p.server
        .qp
        .post_send(&[
            SendWr {
                wr_id: 1,
                op: SendOp::RdmaWrite {
                    sges: &sges,
                    remote: remote(&g),
                },
                signaled: false,
            },
            SendWr {
                wr_id: 2,
                op: SendOp::Send {
                    sges: &hdr,
                    invalidate: None,
                },
                signaled: true,
            },
        ])
        .expect("post");
    wait_for::<F::P>(f, &mut p.server.cq, 1, "send");
    assert_eq!(
        wait_for::<F::P>(f, &mut p.client.cq, 1, "receive")[0].status,
        WcStatus::Success
    );
    assert_eq!(c.read(0, 4096), pattern(9, 4096));
    // ...until revoked.
    p.client.qp.revoke(2, g.rkey, true).expect("revoke");
    let rv = wait_for::<F::P>(f, &mut p.client.cq, 1, "revoke")[0];
    assert_eq!(
        (rv.wr_id, rv.status, rv.opcode),
        (2, WcStatus::Success, WcOpcode::Revoke)
    );
    let mut seen = vec![g.rkey];
    for k in 0..8u64 {
        let again = p
            .client
            .qp
            .grant(10 + k, c.sge(0, 4096), Access::RemoteWrite, false)
            .expect("grant again");
        assert!(
            !seen.contains(&again.rkey),
            "token {:#x} handed out twice",
            again.rkey
        );
        seen.push(again.rkey);
        p.client
            .qp
            .revoke(20 + k, again.rkey, k == 7)
            .expect("revoke again");
    }
    assert_eq!(
        wait_for::<F::P>(f, &mut p.client.cq, 1, "revokes")[0].status,
        WcStatus::Success
    );
    let live = p
        .client
        .qp
        .grant(30, c.sge(0, 4096), Access::RemoteWrite, false)
        .expect("live grant");
    assert!(!seen.contains(&live.rkey));
    c.write(0, &[0xee; 4096]);
    rdma(&mut p.server, 3, &[s.sge(0, 4096)], remote(&g), true);
    let cs = wait_for::<F::P>(f, &mut p.server.cq, 1, "write through a revoked grant");
    assert_eq!(one(&cs, 3).status, WcStatus::RemoteAccessError);
    assert!(
        c.read(0, 4096).iter().all(|&b| b == 0xee),
        "a revoked grant must not place data"
    );
    expect_connection_broken(f, &mut p.server, &cs, &[], &mut p.client, &[]);
}

/// [MS-SMBD] 3.1.5.1 / 3.1.4.4: Send with Invalidate revokes the peer's
/// grant on delivery and reports the rkey in the receive completion; a
/// later local revoke of it is a no-op, not an error; and without any local
/// revoke the rkey never works again.
pub fn revoked_by_send_with_invalidate<F: Fixture>(f: &F) {
    let mut p = connect(f, caps(), caps());
    let c = buf(f, f.client(), 16384);
    let s = buf(f, f.server(), 16384);
    let g0 = p
        .client
        .qp
        .grant(1, c.sge(0, 4096), Access::RemoteWrite, false)
        .expect("grant");
    let g1 = p
        .client
        .qp
        .grant(2, c.sge(4096, 4096), Access::RemoteWrite, false)
        .expect("grant");
    recv(&mut p.client, 31, c.sge(8192, 64));
    recv(&mut p.client, 32, c.sge(8192 + 64, 64));
    s.write(0, &pattern(10, 4096));
    s.write(8192, b"done");
    let sges = [s.sge(0, 4096)];
    let hdr = [s.sge(8192, 4)];
    p.server
        .qp
        .post_send(&[
            SendWr {
                wr_id: 1,
                op: SendOp::RdmaWrite {
                    sges: &sges,
                    remote: remote(&g0),
                },
                signaled: false,
            },
            SendWr {
                wr_id: 2,
                op: SendOp::Send {
                    sges: &hdr,
                    invalidate: Some(g0.rkey),
                },
                signaled: true,
            },
        ])
        .expect("post write + send with invalidate");
    let sc = wait_for::<F::P>(f, &mut p.server.cq, 1, "send with invalidate")[0];
    assert_eq!(
        (sc.wr_id, sc.status, sc.opcode),
        (2, WcStatus::Success, WcOpcode::Send)
    );
    let rc = wait_for::<F::P>(f, &mut p.client.cq, 1, "receive")[0];
    assert_eq!(
        (rc.wr_id, rc.status, rc.byte_len),
        (31, WcStatus::Success, 4)
    );
    assert_eq!(
        rc.invalidated_rkey,
        Some(g0.rkey),
        "the receive reports the invalidated rkey"
    );
    assert_eq!(c.read(0, 4096), pattern(10, 4096));
    // Revoking what the peer invalidated is not an error.
    p.client
        .qp
        .revoke(3, g0.rkey, true)
        .expect("revoke after remote invalidate");
    let rv = wait_for::<F::P>(f, &mut p.client.cq, 1, "revoke")[0];
    assert_eq!(
        (rv.wr_id, rv.status, rv.opcode),
        (3, WcStatus::Success, WcOpcode::Revoke)
    );
    // The second grant is invalidated and then used, with no local revoke.
    send(&mut p.server, 4, s.sge(8192, 4), Some(g1.rkey));
    assert_eq!(
        wait_for::<F::P>(f, &mut p.server.cq, 1, "second send with invalidate")[0].status,
        WcStatus::Success
    );
    let rc = wait_for::<F::P>(f, &mut p.client.cq, 1, "second receive")[0];
    assert_eq!(
        (rc.wr_id, rc.status, rc.invalidated_rkey),
        (32, WcStatus::Success, Some(g1.rkey))
    );
    c.write(0, &[0xee; 8192]);
    rdma(&mut p.server, 5, &[s.sge(0, 4096)], remote(&g1), true);
    let cs = wait_for::<F::P>(f, &mut p.server.cq, 1, "write through an invalidated grant");
    assert_eq!(one(&cs, 5).status, WcStatus::RemoteAccessError);
    assert!(
        c.read(0, 8192).iter().all(|&b| b == 0xee),
        "an invalidated grant must not place data"
    );
    expect_connection_broken(f, &mut p.server, &cs, &[], &mut p.client, &[]);
}

/// One poll returns as many completions as are ready, up to the array's
/// length, in order.
pub fn completion_batching<F: Fixture>(f: &F) {
    let cap = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 64,
        ..caps()
    };
    let mut p = connect(f, cap, cap);
    let s = buf(f, f.server(), 8192);
    let c = buf(f, f.client(), 8192);
    const N: usize = 32;
    let recvs: Vec<RecvWr> = (0..N)
        .map(|i| RecvWr {
            wr_id: i as u64,
            sge: c.sge(i * 64, 64),
        })
        .collect();
    p.client.qp.post_recv(&recvs).expect("post_recv");
    let sges: Vec<[Sge; 1]> = (0..N).map(|i| [s.sge(i * 64, 64)]).collect();
    let mut sent = Vec::new();
    for half in [0..N / 2, N / 2..N] {
        let wrs: Vec<SendWr<'_>> = half
            .map(|i| SendWr {
                wr_id: i as u64,
                op: SendOp::Send {
                    sges: &sges[i],
                    invalidate: None,
                },
                signaled: true,
            })
            .collect();
        p.server.qp.post_send(&wrs).expect("post 16 sends");
        // Let them all finish, then take them 8 at a time.
        std::thread::sleep(Duration::from_millis(20));
        let deadline = Instant::now() + f.timeout();
        let mut out = [Completion::EMPTY; 8];
        let mut biggest = 0;
        let start = sent.len();
        while sent.len() < start + N / 2 {
            let k = p.server.cq.poll(&mut out);
            assert!(k <= 8);
            biggest = biggest.max(k);
            sent.extend_from_slice(&out[..k]);
            assert!(Instant::now() < deadline, "send completions: {sent:?}");
        }
        assert_eq!(
            biggest, 8,
            "a poll fills the whole array when enough completions are ready"
        );
    }
    assert!(
        sent.iter()
            .enumerate()
            .all(|(i, c)| c.wr_id == i as u64 && c.status == WcStatus::Success),
        "{sent:?}"
    );
    let mut out = [Completion::EMPTY; 64];
    let mut got = Vec::new();
    let mut biggest = 0;
    let deadline = Instant::now() + f.timeout();
    while got.len() < N {
        let k = p.client.cq.poll(&mut out);
        biggest = biggest.max(k);
        got.extend_from_slice(&out[..k]);
        assert!(Instant::now() < deadline, "receives: {got:?}");
    }
    assert!(biggest > 1, "completions come in batches");
    assert!(got
        .iter()
        .enumerate()
        .all(|(i, c)| c.wr_id == i as u64 && c.status == WcStatus::Success));
    assert!(drain::<F::P>(&mut p.client.cq, Duration::from_millis(10)).is_empty());
}

/// Selective signaling: unsignaled successful work requests produce no
/// completion and are retired by the next signaled one, so a send queue of
/// depth 16 takes round after round of 15 unsignaled + 1 signaled.
pub fn selective_signaling_retires_unsignaled_work<F: Fixture>(f: &F) {
    let cap = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        ..caps()
    };
    let mut p = connect(f, cap, cap);
    let s = buf(f, f.server(), 8192);
    let c = buf(f, f.client(), 8192);
    let g = p
        .client
        .qp
        .grant(1, c.sge(0, 4096), Access::RemoteWrite, false)
        .expect("grant");
    let sges: Vec<[Sge; 1]> = (0..16).map(|i| [s.sge(i * 256, 256)]).collect();
    for round in 0..6u64 {
        let wrs: Vec<SendWr<'_>> = (0..16)
            .map(|i| SendWr {
                wr_id: round * 100 + i as u64,
                op: SendOp::RdmaWrite {
                    sges: &sges[i],
                    remote: RemoteBuf {
                        addr: g.addr + i as u64 * 256,
                        rkey: g.rkey,
                    },
                },
                signaled: i == 15,
            })
            .collect();
        p.server
            .qp
            .post_send(&wrs)
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        let cs = wait_for::<F::P>(f, &mut p.server.cq, 1, "signaled write");
        assert_eq!(
            (cs[0].wr_id, cs[0].status, cs[0].opcode),
            (round * 100 + 15, WcStatus::Success, WcOpcode::RdmaWrite)
        );
    }
    assert!(
        drain::<F::P>(&mut p.server.cq, Duration::from_millis(10)).is_empty(),
        "unsignaled work completed"
    );
}

/// The drain marker ([`QueuePair::drain_send_queue`]): refused while the
/// queue pair is connected (it would reach the peer as an empty message);
/// once disconnected, it completes, the only completion on the queue,
/// behind unsignaled Sends that succeeded silently and never complete on
/// their own; and their send-queue room is back after it.
pub fn drain_marker_completes_behind_silent_sends<F: Fixture>(f: &F) {
    let cap = QpCaps {
        max_send_wr: 8,
        max_recv_wr: 16,
        ..caps()
    };
    let mut p = connect(f, cap, cap);
    let s = buf(f, f.server(), 4096);
    let c = buf(f, f.client(), 4096);
    let recvs: Vec<RecvWr> = (0..8)
        .map(|i| RecvWr {
            wr_id: 10 + i,
            sge: s.sge(i as usize * 256, 256),
        })
        .collect();
    p.server.qp.post_recv(&recvs).expect("post_recv");
    let sges: Vec<[Sge; 1]> = (0..7).map(|i| [c.sge(i * 64, 64)]).collect();
    let wrs: Vec<SendWr<'_>> = (0..7)
        .map(|i| SendWr {
            wr_id: 100 + i as u64,
            op: SendOp::Send {
                sges: &sges[i],
                invalidate: None,
            },
            signaled: false,
        })
        .collect();
    p.client.qp.post_send(&wrs).expect("post_send");
    let got = wait_for::<F::P>(f, &mut p.server.cq, 7, "the seven messages");
    assert!(got
        .iter()
        .all(|c| c.status == WcStatus::Success && c.opcode == WcOpcode::Recv));
    assert!(
        p.client.qp.drain_send_queue(999).is_err(),
        "a marker on a connected queue pair was accepted"
    );
    assert!(drain::<F::P>(&mut p.client.cq, Duration::from_millis(20)).is_empty());
    p.client.qp.disconnect();
    p.client.qp.drain_send_queue(999).expect("drain marker");
    let cs = wait_for::<F::P>(f, &mut p.client.cq, 1, "the drain marker");
    assert_eq!(
        (cs[0].wr_id, cs[0].status, cs[0].opcode),
        (999, WcStatus::Flushed, WcOpcode::Send)
    );
    assert!(
        drain::<F::P>(&mut p.client.cq, Duration::from_millis(50)).is_empty(),
        "a silent Send completed after all"
    );
    // Everything before the marker is retired: a full queue of markers
    // fits again.
    for k in 0..8 {
        p.client
            .qp
            .drain_send_queue(1000 + k)
            .unwrap_or_else(|e| panic!("marker {k}: {e}"));
    }
    let cs = wait_for::<F::P>(f, &mut p.client.cq, 8, "eight more markers");
    assert!(cs
        .iter()
        .enumerate()
        .all(|(k, c)| c.wr_id == 1000 + k as u64 && c.status == WcStatus::Flushed));
}

/// [MS-SMBD] 3.1.7.1: a disconnect by either end is connection loss on
/// both: neither queue pair is connected any more, every receive posted on
/// either end completes `Flushed`, and later posts are flushed too.
pub fn disconnect_surfaces_as_connection_loss_on_both_sides<F: Fixture>(f: &F) {
    let mut p = connect(f, caps(), caps());
    let s = buf(f, f.server(), 4096);
    let c = buf(f, f.client(), 4096);
    let srecvs: Vec<RecvWr> = (0..3)
        .map(|i| RecvWr {
            wr_id: 10 + i,
            sge: s.sge(i as usize * 64, 64),
        })
        .collect();
    let crecvs: Vec<RecvWr> = (0..3)
        .map(|i| RecvWr {
            wr_id: 20 + i,
            sge: c.sge(i as usize * 64, 64),
        })
        .collect();
    p.server.qp.post_recv(&srecvs).expect("post_recv");
    p.client.qp.post_recv(&crecvs).expect("post_recv");
    p.client.qp.disconnect();
    assert!(
        matches!(p.client.qp.state(), QpState::Disconnected | QpState::Error),
        "after disconnect: {:?}",
        p.client.qp.state()
    );
    let cc = wait_for::<F::P>(f, &mut p.client.cq, 3, "disconnecting end's flushes");
    let mut sc = wait_broken(f, &mut p.server, "the other end");
    let missing = 3 - sc.len().min(3);
    sc.extend(wait_for::<F::P>(
        f,
        &mut p.server.cq,
        missing,
        "other end's flushes",
    ));
    for w in [10, 11, 12] {
        assert_eq!(one(&sc, w).status, WcStatus::Flushed);
    }
    for w in [20, 21, 22] {
        assert_eq!(one(&cc, w).status, WcStatus::Flushed);
    }
    expect_posts_flushed(f, &mut p.client, &c);
    expect_posts_flushed(f, &mut p.server, &s);
    assert!(drain::<F::P>(&mut p.client.cq, Duration::from_millis(10)).is_empty());
}

/// Dropping one end's queue pair is connection loss for the other end.
pub fn dropped_queue_pair_surfaces_as_connection_loss<F: Fixture>(f: &F) {
    let p = connect(f, caps(), caps());
    let c = buf(f, f.client(), 4096);
    let Pair {
        server, mut client, ..
    } = p;
    recv(&mut client, 1, c.sge(0, 64));
    recv(&mut client, 2, c.sge(64, 64));
    drop(server);
    let mut cs = wait_broken(f, &mut client, "peer of the dropped queue pair");
    let missing = 2 - cs.len().min(2);
    cs.extend(wait_for::<F::P>(f, &mut client.cq, missing, "flushes"));
    assert_eq!(one(&cs, 1).status, WcStatus::Flushed);
    assert_eq!(one(&cs, 2).status, WcStatus::Flushed);
    assert_eq!(client.qp.state(), QpState::Error);
}

/// [MS-SMBD] Appendix A: each end's IRD is bounded by the other's ORD and
/// its ORD by the other's IRD.
pub fn ird_ord_negotiated_to_minimum<F: Fixture>(f: &F) {
    let server = QpCaps {
        ird: 8,
        ord: 4,
        ..caps()
    };
    let client = QpCaps {
        ird: 2,
        ord: 16,
        ..caps()
    };
    let p = connect(f, server, client);
    assert_eq!(p.server.qp.ird_ord(), (8, 2), "server (IRD, ORD)");
    assert_eq!(p.client.qp.ird_ord(), (2, 8), "client (IRD, ORD)");
}

/// Private data travels with the request and the accept (the transport may
/// pad it).
pub fn private_data_round_trips<F: Fixture>(f: &F) {
    let p = connect(f, caps(), caps());
    assert!(
        p.request_data.starts_with(CLIENT_PRIVATE),
        "request carried {:?}",
        p.request_data
    );
    assert!(
        p.reply_data.starts_with(SERVER_PRIVATE),
        "accept carried {:?}",
        p.reply_data
    );
}

/// A rejected request fails `connect`.
pub fn rejected_request_fails_connect<F: Fixture>(f: &F) {
    let mut listener = f.server().listen(f.listen_addr()).expect("listen");
    let addr = listener.local_addr();
    let cq = f.client().create_cq(CQ_ENTRIES).expect("create_cq");
    let h = cq.handle();
    let timeout = f.timeout();
    let r = std::thread::scope(|s| {
        s.spawn(|| {
            let req = listener
                .accept_request(timeout)
                .expect("accept_request")
                .expect("a request");
            assert!(req.private_data().starts_with(CLIENT_PRIVATE));
            req.reject();
        });
        f.client()
            .connect(addr, &h, caps(), CLIENT_PRIVATE, timeout)
    });
    assert!(
        r.is_err(),
        "connect succeeded although the listener rejected it"
    );
}

/// Connecting where nobody listens fails (promptly, not at the timeout).
pub fn connect_without_listener_fails<F: Fixture>(f: &F) {
    let addr = {
        let l = f.server().listen(f.listen_addr()).expect("listen");
        l.local_addr()
    };
    let cq = f.client().create_cq(CQ_ENTRIES).expect("create_cq");
    let start = Instant::now();
    let r = f
        .client()
        .connect(addr, &cq.handle(), caps(), CLIENT_PRIVATE, f.timeout());
    assert!(r.is_err(), "connected to a closed listener");
    assert!(
        start.elapsed() < f.timeout(),
        "failure took the whole timeout"
    );
}

/// [MS-SMBD] 3.1.7.2: receives posted with
/// [`ConnRequest::accept_with_receives`] are in place before the connector
/// learns the connection is up, so a Send it posts the moment `connect`
/// returns (the Negotiate Request) lands instead of hitting RNR.
pub fn receives_posted_at_accept_catch_the_first_send<F: Fixture>(f: &F) {
    let s = buf(f, f.server(), 4096);
    let c = buf(f, f.client(), 4096);
    let mut listener = f.server().listen(f.listen_addr()).expect("listen");
    let addr = listener.local_addr();
    let mut server_cq = f.server().create_cq(CQ_ENTRIES).expect("create_cq");
    let mut client_cq = f.client().create_cq(CQ_ENTRIES).expect("create_cq");
    let (sh, ch) = (server_cq.handle(), client_cq.handle());
    let timeout = f.timeout();
    c.write(0, b"negotiate request");
    let sge = c.sge(0, 17);
    let recvs: Vec<RecvWr> = (0..4)
        .map(|i| RecvWr {
            wr_id: 40 + i,
            sge: s.sge(i as usize * 512, 512),
        })
        .collect();
    let (server_qp, client_qp) = std::thread::scope(|sc| {
        let acceptor = sc.spawn(|| {
            let req = listener
                .accept_request(timeout)
                .expect("accept_request")
                .expect("a request");
            req.accept_with_receives(&sh, caps(), SERVER_PRIVATE, &recvs)
                .expect("accept_with_receives")
        });
        let (mut qp, _) = f
            .client()
            .connect(addr, &ch, caps(), CLIENT_PRIVATE, timeout)
            .expect("connect");
        let sges = [sge];
        qp.post_send(&[SendWr {
            wr_id: 1,
            op: SendOp::Send {
                sges: &sges,
                invalidate: None,
            },
            signaled: true,
        }])
        .expect("first send");
        (acceptor.join().expect("acceptor panicked"), qp)
    });
    let sc = wait_for::<F::P>(f, &mut client_cq, 1, "first send")[0];
    assert_eq!(
        (sc.wr_id, sc.status),
        (1, WcStatus::Success),
        "the first Send found a receive"
    );
    let rc = wait_for::<F::P>(f, &mut server_cq, 1, "first receive")[0];
    assert_eq!(
        (rc.wr_id, rc.status, rc.byte_len),
        (40, WcStatus::Success, 17)
    );
    assert_eq!(s.read(0, 17), b"negotiate request");
    assert_eq!(server_qp.state(), QpState::Connected);
    assert_eq!(client_qp.state(), QpState::Connected);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_arrays_split_per_ms_smbd_3_1_4_5() {
        let d = [
            Grant {
                addr: 1000,
                rkey: 1,
                len: 100,
            },
            Grant {
                addr: 5000,
                rkey: 2,
                len: 50,
            },
            Grant {
                addr: 9000,
                rkey: 3,
                len: 10,
            },
        ];
        let r = |addr, rkey| RemoteBuf { addr, rkey };
        assert_eq!(
            split(&d, 0, 160),
            vec![
                (r(1000, 1), 0, 100),
                (r(5000, 2), 100, 50),
                (r(9000, 3), 150, 10)
            ]
        );
        assert_eq!(
            split(&d, 90, 20),
            vec![(r(1090, 1), 0, 10), (r(5000, 2), 10, 10)]
        );
        assert_eq!(
            split(&d, 120, 35),
            vec![(r(5020, 2), 0, 30), (r(9000, 3), 30, 5)]
        );
        let s = [
            Sge {
                addr: 0,
                len: 10,
                lkey: 1,
            },
            Sge {
                addr: 100,
                len: 10,
                lkey: 2,
            },
        ];
        assert_eq!(
            sub_sges(&s, 5, 10),
            vec![
                Sge {
                    addr: 5,
                    len: 5,
                    lkey: 1
                },
                Sge {
                    addr: 100,
                    len: 5,
                    lkey: 2
                }
            ]
        );
    }
}
