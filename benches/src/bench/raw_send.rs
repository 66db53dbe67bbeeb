//! `--workload raw-send`: the `send` round trip over the bare provider,
//! without SMB Direct — the baseline `send` is judged against. Each
//! operation posts one Send of `--size` bytes from the next registered send
//! buffer of a rotation; an echo thread on the server core
//! ([`RawEchoServer`]) sends every message straight back out of the receive
//! buffer it landed in and reposts that buffer once the echo's Send is
//! retired (the provider benchmark's responder, `crate::provider_bench`,
//! for many connections and a queue depth). The operation ends when the
//! echo's receive completed (and, for a signaled Send, its completion).
//!
//! Both ends signal their Sends selectively, as `send`'s endpoint does: one
//! in [`SIGNAL_EVERY`], whose completion retires those before it (the send
//! queue completes in order). The rotation holds `2 x queue depth +
//! SIGNAL_EVERY` send buffers, so a buffer comes round again only after its
//! Send is retired (checked); the echo side keeps `3 x queue depth + 2 +
//! SIGNAL_EVERY` receives ([`echo_receives`]).
//!
//! The baseline stays the floor: without `--verify` the client never reads
//! what it receives (with the soft provider, bytes the other core wrote),
//! where `send`'s client reads the SMB Direct header of every echo and
//! checks, on the same cache line, the operation number it carries
//! ([`pattern::stamp`]). Reading that line costs the baseline 0.02-0.05 us
//! on this host (docs/bench-results.md, "The echo's first line").
//!
//! No negotiation, credits, headers, fragmentation or pool allocation:
//! messages above MaxSendSize travel as one Send here, so compare `send`
//! and `raw-send` at sizes up to MaxSendSize - 24 (1340 bytes by default)
//! for the protocol's own cost.
//!
//! Loopback only: the peer is a thread of this process (a running `serve`
//! speaks SMB Direct).
//!
//! # `--workload raw-smbd`: the floor under `send`
//!
//! The same loop with what [MS-SMBD] asks of every message and nothing
//! else, to show in the same run how much of `send`'s distance to
//! `raw-send` any SMB Direct implementation pays on the provider. Each
//! message carries a 24-byte Data Transfer header (2.2.3) before its
//! `--size` bytes, and the receiving end reads and checks it as 3.1.5.5
//! requires (its length, CreditsRequested not zero, the payload inside the
//! message, no fragments to follow); the client stamps the operation number
//! behind the header and checks it on the echo, on the header's cache line,
//! as `send`'s client does; the echo answers with its header written over
//! the request's and sends the message back from the receive buffer (one
//! SGE), as smbdirectd's echo does on both providers
//! (`QueuePair::reply_header_in_receive_buffer`). Both ends' poll loops
//! prefetch the header line of the receive the next message lands in, as
//! smbdirectd's do (`Endpoint::prefetch_next_receive`; in-run A/B on the
//! soft provider, 512 B: p50 0.908-0.967 of without, 8 of 8 runs), so the
//! floor keeps the best shape we know. What it leaves out is the
//! rest of a protocol stack: credit accounting, receive reposting policy,
//! reassembly, an upper layer, pools. The client grants 0 credits and the
//! echo 1, so an echo that did not write its own header fails the client's
//! check (an error, counted like any other). docs/bench-results.md, session
//! 29, "The floor under `send`", first measured this shape.

use super::error::BenchError;
use super::pattern;
use super::workload::{Fifo, Outcome, Session, Workload};
use super::Retained;
use crate::baseline;
use smbdirect_dataplane::endpoint::SIGNAL_EVERY;
use smbdirect_dataplane::hint::prefetch;
use smbdirect_dataplane::marks::{self, Point};
use smbdirect_dataplane::provider::{
    Completion, CompletionQueue, ConnRequest, Listener, MemoryRegion, Provider, QpCaps, QueuePair,
    RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus,
};
use smbdirect_hugepages::{
    BufLocation, BufferPool, ClassId, HugepagePolicy, PoolConfig, SizeClass, SliceAllocator,
};
use smbdirect_protocol::smbd::wire::{DataTransfer, DataTransferRepr};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// wr_id bit that marks a receive (its low bits: the receive buffer index).
const RECV_BIT: u64 = 1 << 63;
/// The Data Transfer header before the payload ([MS-SMBD] 2.2.3: 20 bytes
/// and the padding to DataOffset 24) in `raw-smbd`.
const HEADER: usize = 24;
/// CreditsGranted of the client's headers and of the echo's (see the module
/// documentation, `raw-smbd`).
const CLIENT_GRANTS: u16 = 0;
const ECHO_GRANTS: u16 = 1;

/// A `raw-smbd` header: CreditsRequested 255, `granted`, one whole message
/// of `payload` bytes at DataOffset 24.
fn smbd_header(granted: u16, payload: usize) -> [u8; HEADER] {
    DataTransferRepr::whole_message_header(255, granted, payload as u32)
}

/// [MS-SMBD] 3.1.5.5's checks of a received Data Transfer message `msg`
/// (long enough for the header, CreditsRequested not zero, the payload at
/// DataOffset inside the message and the whole of it, RemainingDataLength
/// zero), plus the CreditsGranted the peer writes.
fn smbd_header_ok(msg: &[u8], granted: u16) -> bool {
    match DataTransfer::new_checked(msg) {
        Ok(v) => {
            v.credits_requested() != 0
                && v.credits_granted() == granted
                && v.remaining_data_length() == 0
                && v.payload_range().is_ok_and(|r| {
                    msg.len().checked_sub(HEADER) == Some(r.len())
                        && (r.is_empty() || r.start == HEADER)
                })
        }
        Err(_) => false,
    }
}

/// How long connection set-up may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Receives the echo thread keeps per connection for `qd`: `qd` requests
/// can arrive while the buffers of the echoes before them are not retired
/// yet: up to `SIGNAL_EVERY - 1` unsignaled ones wait for a later one, and
/// a signaled one's completion can sit behind a whole poll's worth of
/// receives (a batch of up to `qd` echoes).
fn echo_receives(qd: u32) -> u32 {
    3 * qd + 2 + SIGNAL_EVERY
}

/// Send buffers of a client connection at queue depth `qd`: the
/// operations in flight, the unsignaled Sends not yet retired, and as many
/// again for echoes that overtake a signaled Send's completion.
fn send_buffers(qd: u32) -> u32 {
    2 * qd + SIGNAL_EVERY
}

/// A client Send's work-request id: its operation slot in the low bits,
/// the Send's number above ([`RawSession::retired`]).
const SLOT_BITS: u32 = 20;

fn caps(depth: u32) -> QpCaps {
    QpCaps {
        max_send_wr: depth + 4,
        max_recv_wr: depth + 4,
        max_sge: 1,
        ird: 1,
        ord: 1,
    }
}

/// A registered pool of `count` buffers of `size` bytes, all allocated.
struct Buffers {
    /// Keeps the mapping alive (also kept by [`Retained`]).
    _pool: BufferPool,
    /// Owns the buffers for the run.
    _alloc: SliceAllocator,
    mr: MemoryRegion,
    bufs: Box<[BufLocation]>,
}

// SAFETY: the buffers are plain memory of a pool mapping that `pool` keeps
// alive; whoever holds `Buffers` is their only user on this side.
unsafe impl Send for Buffers {}

impl Buffers {
    fn new<P: Provider>(
        provider: &P,
        size: usize,
        count: u32,
        retained: &Retained,
        what: &str,
    ) -> Result<Self, BenchError> {
        let err = |e: &dyn std::fmt::Display| BenchError::failed(what.to_string(), e.to_string());
        let stride = size.next_multiple_of(4096);
        let budget = stride * (count as usize + 2) + (4 << 20);
        let pool = PoolConfig::new(budget, 1)
            .class(SizeClass::new("raw", size.next_multiple_of(64)).per_slice(count))
            .hugepages(HugepagePolicy::Prefer)
            .mlock(false)
            .build()
            .map_err(|e| err(&e))?;
        retained.keep(pool.clone());
        // SAFETY: `retained` keeps the pool mapped until after the provider
        // is dropped.
        let mr = unsafe { provider.register_pool(&pool) }.map_err(|e| err(&e))?;
        let mut alloc = pool.claim_slice(0).map_err(|e| err(&e))?;
        let mut bufs = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let loc = alloc
                .alloc(ClassId(0))
                .ok()
                .and_then(|id| pool.locate(id))
                .ok_or_else(|| err(&"the pool has fewer buffers than asked for"))?;
            bufs.push(loc);
        }
        Ok(Buffers {
            _pool: pool,
            _alloc: alloc,
            mr,
            bufs: bufs.into_boxed_slice(),
        })
    }

    fn sge(&self, i: usize, len: usize) -> Sge {
        self.mr.sge(
            self.bufs[i].offset as u64,
            u32::try_from(len).unwrap_or(u32::MAX),
        )
    }

    /// Buffer `i`'s first `len` bytes.
    ///
    /// # Safety
    /// No work request may be writing buffer `i` (its receive completed, or
    /// it is not posted).
    unsafe fn bytes(&self, i: usize, len: usize) -> &[u8] {
        debug_assert!(len <= self.bufs[i].len);
        // SAFETY: in bounds of a live buffer of `self.pool`; exclusivity is
        // the caller's promise.
        unsafe { std::slice::from_raw_parts(self.bufs[i].ptr.as_ptr(), len) }
    }

    /// Buffer `i`'s first `len` bytes, writable.
    ///
    /// # Safety
    /// No work request may be reading or writing buffer `i`.
    #[allow(clippy::mut_from_ref)]
    unsafe fn bytes_mut(&self, i: usize, len: usize) -> &mut [u8] {
        debug_assert!(len <= self.bufs[i].len);
        // SAFETY: as in `bytes`.
        unsafe { std::slice::from_raw_parts_mut(self.bufs[i].ptr.as_ptr(), len) }
    }
}

/// A flag on a cache line of its own: the echo thread polls it in its loop.
#[repr(align(128))]
struct StopFlag(AtomicBool);

/// The in-process raw echo peer: one thread, pinned to the first server
/// core, accepting `connections` connections then echoing until stopped.
pub struct RawEchoServer {
    addr: SocketAddr,
    stop: Arc<StopFlag>,
    thread: Option<JoinHandle<Result<u64, BenchError>>>,
}

/// What the messages of a raw run are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Messages {
    /// Payload bytes (`--size`).
    pub size: usize,
    /// `raw-smbd`: an SMB Direct header before the payload (see the module
    /// documentation).
    pub header: bool,
}

impl RawEchoServer {
    /// Listens on `listen` and starts the echo thread.
    pub fn start<P: Provider>(
        provider: Arc<P>,
        listen: SocketAddr,
        core: Option<usize>,
        connections: usize,
        queue_depth: u32,
        messages: Messages,
        retained: &Retained,
    ) -> Result<Self, BenchError> {
        let per_conn = echo_receives(queue_depth);
        let header = messages.header;
        let bufs = Buffers::new(
            &*provider,
            messages.size + if header { HEADER } else { 0 },
            per_conn * connections as u32,
            retained,
            "raw echo: registered memory",
        )?;
        let listener = provider
            .listen(listen)
            .map_err(|e| BenchError::failed(format!("raw echo: listening on {listen}"), e))?;
        let addr = listener.local_addr();
        let cq = provider
            .create_cq((2 * per_conn + 8) * connections as u32)
            .map_err(|e| BenchError::failed("raw echo: completion queue", e))?;
        let stop = Arc::new(StopFlag(AtomicBool::new(false)));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("bench-raw-echo".into())
            .spawn(move || {
                if let Some(c) = core {
                    baseline::pin(c);
                }
                let _provider = provider;
                echo::<P>(listener, cq, bufs, connections, per_conn, header, &stop2)
            })
            .map_err(|e| BenchError::failed("raw echo: starting its thread", e))?;
        Ok(RawEchoServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops the thread; returns how many messages it echoed.
    pub fn stop(mut self) -> Result<u64, BenchError> {
        self.stop.0.store(true, Ordering::Relaxed);
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(BenchError::failed("raw echo", "its thread panicked")),
            None => Ok(0),
        }
    }
}

impl Drop for RawEchoServer {
    fn drop(&mut self) {
        self.stop.0.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn echo<P: Provider>(
    mut listener: P::Listener,
    mut cq: P::Cq,
    bufs: Buffers,
    connections: usize,
    per_conn: u32,
    header: bool,
    stop: &StopFlag,
) -> Result<u64, BenchError> {
    let per_conn = per_conn as usize;
    let mut qps: Vec<P::Qp> = Vec::with_capacity(connections);
    let mut recvs: Vec<RecvWr> = Vec::with_capacity(per_conn);
    let deadline = Instant::now() + Duration::from_secs(30);
    while qps.len() < connections {
        if stop.0.load(Ordering::Relaxed) {
            return Ok(0);
        }
        if Instant::now() > deadline {
            return Err(BenchError::failed(
                "raw echo",
                format!("{} of {connections} connections arrived in 30 s", qps.len()),
            ));
        }
        let req = listener
            .accept_request(Duration::from_millis(50))
            .map_err(|e| BenchError::failed("raw echo: accepting", e))?;
        let Some(req) = req else { continue };
        let c = qps.len();
        recvs.clear();
        recvs.extend((0..per_conn).map(|k| {
            let i = c * per_conn + k;
            RecvWr {
                wr_id: RECV_BIT | i as u64,
                sge: bufs.sge(i, bufs.bufs[i].len),
            }
        }));
        let qp = req
            .accept_with_receives(&cq.handle(), caps(per_conn as u32), &[], &recvs)
            .map_err(|e| BenchError::failed(format!("raw echo: accepting connection {c}"), e))?;
        qps.push(qp);
    }
    let mut dead = vec![false; connections];
    // Per connection: the receive buffers whose echoes are not retired yet,
    // in sending order, and the unsignaled echoes since the latest signaled
    // one (the send queue completes in order: a completion retires every
    // echo before it, whose buffers are reposted then).
    let mut unretired: Vec<std::collections::VecDeque<usize>> = (0..connections)
        .map(|_| std::collections::VecDeque::with_capacity(per_conn))
        .collect();
    let mut silent = vec![0u32; connections];
    let mut wcs = [Completion::EMPTY; 32];
    let mut echoed = 0u64;
    // raw-smbd: the receive the connection heard from last gets its next
    // message in (each connection's receives come round in the order they
    // were posted: at first, then as their echoes retire, in arrival
    // order). Its header line is fetched with its completion, as
    // smbdirectd's worker does (Endpoint::prefetch_next_receive).
    let mut next_recv: Option<usize> = None;
    while !stop.0.load(Ordering::Relaxed) {
        if let Some(i) = next_recv {
            prefetch(bufs.sge(i, 0).addr as *const u8);
        }
        let n = cq.poll(&mut wcs);
        let detected = marks::now();
        for wc in &wcs[..n] {
            let i = (wc.wr_id & !RECV_BIT) as usize;
            let c = i / per_conn;
            if c >= connections || dead[c] {
                continue;
            }
            if wc.status != WcStatus::Success {
                // The client went away (its disconnect flushes our
                // receives) or broke the connection: that one ends here;
                // the client side reports what it saw.
                dead[c] = true;
                continue;
            }
            let r = match wc.opcode {
                WcOpcode::Recv => {
                    marks::mark_at(Point::ServerDetect, detected);
                    let len = wc.byte_len as usize;
                    if header {
                        let k = i - c * per_conn;
                        next_recv = Some(c * per_conn + if k + 1 == per_conn { 0 } else { k + 1 });
                        // SAFETY: the receive completed; nothing uses the
                        // buffer until the echo below is posted.
                        let ok = smbd_header_ok(unsafe { bufs.bytes(i, len) }, CLIENT_GRANTS);
                        if ok {
                            // SAFETY: as above.
                            unsafe { bufs.bytes_mut(i, HEADER) }
                                .copy_from_slice(&smbd_header(ECHO_GRANTS, len - HEADER));
                        }
                        // A bad header goes back as it came: the client's
                        // check of the echo's header then fails the
                        // operation.
                    }
                    let sges = [bufs.sge(i, len)];
                    echoed += 1;
                    let signaled = silent[c] + 1 >= SIGNAL_EVERY;
                    silent[c] = if signaled { 0 } else { silent[c] + 1 };
                    marks::mark(Point::ServerPostBegin);
                    let posted = qps[c].post_send(&[SendWr {
                        wr_id: i as u64,
                        op: SendOp::Send {
                            sges: &sges,
                            invalidate: None,
                        },
                        signaled,
                    }]);
                    marks::mark(Point::ServerPostEnd);
                    // Never beyond its capacity: each buffer is in it once.
                    unretired[c].push_back(i);
                    posted
                }
                WcOpcode::Send => {
                    // Every echo up to this one is retired: their buffers
                    // are reposted, a batch to a post.
                    let mut r = Ok(());
                    let mut batch = [RecvWr {
                        wr_id: 0,
                        sge: bufs.sge(0, 0),
                    }; 16];
                    let mut n = 0;
                    let mut last = false;
                    while !last {
                        let Some(b) = unretired[c].pop_front() else {
                            break;
                        };
                        last = b == i;
                        batch[n] = RecvWr {
                            wr_id: RECV_BIT | b as u64,
                            sge: bufs.sge(b, bufs.bufs[b].len),
                        };
                        n += 1;
                        if n == batch.len() || last || unretired[c].is_empty() {
                            r = r.and(qps[c].post_recv(&batch[..n]));
                            n = 0;
                        }
                    }
                    r
                }
                _ => Ok(()),
            };
            if r.is_err() {
                dead[c] = true;
            }
        }
    }
    for qp in &mut qps {
        qp.disconnect();
    }
    drop(bufs);
    Ok(echoed)
}

/// Raw Send/Recv round trips against a [`RawEchoServer`].
pub struct RawSendWorkload<'a, P: Provider> {
    provider: Arc<P>,
    addr: SocketAddr,
    size: usize,
    queue_depth: u32,
    verify: bool,
    /// `raw-smbd`: each message carries an SMB Direct header (see the
    /// module documentation).
    header: bool,
    retained: &'a Retained,
}

impl<'a, P: Provider> RawSendWorkload<'a, P> {
    /// Round trips of `messages`, `queue_depth` outstanding per
    /// connection, against the echo peer at `addr` (started with the same
    /// `messages`).
    pub fn new(
        provider: Arc<P>,
        addr: SocketAddr,
        messages: Messages,
        queue_depth: u32,
        verify: bool,
        retained: &'a Retained,
    ) -> Self {
        let Messages { size, header } = messages;
        RawSendWorkload {
            provider,
            addr,
            size,
            queue_depth,
            verify,
            header,
            retained,
        }
    }
}

impl<P: Provider> Workload for RawSendWorkload<'_, P> {
    type Session = RawSession<P>;

    fn name(&self) -> &'static str {
        if self.header {
            "raw-smbd"
        } else {
            "raw-send"
        }
    }

    fn bytes_per_op(&self) -> u64 {
        self.size as u64
    }

    fn open(&self, index: usize) -> Result<RawSession<P>, BenchError> {
        let qd = self.queue_depth as usize;
        let nrecv = qd + 1;
        let nsend = send_buffers(self.queue_depth) as usize;
        let what = format!("connection {index}");
        let head = if self.header { HEADER } else { 0 };
        let bufs = Buffers::new(
            &*self.provider,
            head + self.size,
            (nsend + nrecv) as u32,
            self.retained,
            &what,
        )?;
        let caps = caps(nsend.max(nrecv) as u32);
        let cq = self
            .provider
            .create_cq(caps.max_send_wr + caps.max_recv_wr)
            .map_err(|e| BenchError::failed(what.clone(), e))?;
        let (mut qp, _) = self
            .provider
            .connect(self.addr, &cq.handle(), caps, &[], CONNECT_TIMEOUT)
            .map_err(|e| {
                BenchError::failed(format!("{what}: connecting to the raw echo peer"), e)
            })?;
        let recv_wrs: Box<[RecvWr]> = (0..nrecv)
            .map(|k| RecvWr {
                wr_id: RECV_BIT | (nsend + k) as u64,
                sge: bufs.sge(nsend + k, bufs.bufs[nsend + k].len),
            })
            .collect();
        qp.post_recv(&recv_wrs)
            .map_err(|e| BenchError::failed(format!("{what}: posting receives"), e))?;
        for b in 0..nsend {
            // SAFETY: no work request uses the send buffers yet.
            let w = unsafe { bufs.bytes_mut(b, head + self.size) };
            pattern::fill(&mut w[head..], u64::MAX >> 8);
            if self.header {
                w[..HEADER].copy_from_slice(&smbd_header(CLIENT_GRANTS, self.size));
            }
        }
        Ok(RawSession {
            cq,
            qp,
            bufs,
            recv_wrs,
            nsend,
            posted: 0,
            retired: 0,
            silent: 0,
            state: vec![0; qd].into_boxed_slice(),
            ok: vec![true; qd].into_boxed_slice(),
            fifo: Fifo::with_capacity(qd),
            wcs: [Completion::EMPTY; 32],
            size: self.size,
            head,
            verify: self.verify,
            index,
            next_recv: 0,
        })
    }
}

/// Slot state bits: its Send completed (or needs no completion), its echo
/// arrived.
const SENT: u8 = 1;
const ECHOED: u8 = 2;

/// One raw connection: buffers `0..nsend` are the send rotation, the rest
/// receive buffers.
pub struct RawSession<P: Provider> {
    cq: P::Cq,
    qp: P::Qp,
    bufs: Buffers,
    recv_wrs: Box<[RecvWr]>,
    /// Send buffers in the rotation.
    nsend: usize,
    /// Sends posted (the next one uses buffer `posted % nsend`).
    posted: u64,
    /// Sends retired: every one before the latest completed.
    retired: u64,
    /// Unsignaled Sends since the latest signaled one.
    silent: u32,
    state: Box<[u8]>,
    ok: Box<[bool]>,
    fifo: Fifo,
    wcs: [Completion; 32],
    size: usize,
    /// Header bytes before the payload: [`HEADER`] for `raw-smbd`, else 0.
    head: usize,
    verify: bool,
    index: usize,
    /// raw-smbd: the receive (index into `recv_wrs`) the next echo lands
    /// in. The receive queue is consumed in order and each buffer is
    /// reposted as soon as its echo is read, so they come round in turn.
    next_recv: usize,
}

impl<P: Provider> RawSession<P> {
    fn fail(&self, detail: impl std::fmt::Display) -> BenchError {
        BenchError::failed(format!("connection {}", self.index), detail)
    }
}

impl<P: Provider> Session for RawSession<P> {
    fn start(&mut self, slot: u32, seq: u64) -> Result<(), BenchError> {
        let s = slot as usize;
        if self.posted - self.retired >= self.nsend as u64 {
            // Never seen: the buffer's previous Send is still the queue's.
            return Err(self.fail(format!(
                "{} Sends unretired: the send buffer rotation of {} is used up",
                self.posted - self.retired,
                self.nsend
            )));
        }
        let b = (self.posted % self.nsend as u64) as usize;
        let head = self.head;
        if self.verify || head > 0 {
            // SAFETY: the buffer's previous Send, `nsend` Sends ago, is
            // retired (checked above).
            let w = unsafe { self.bufs.bytes_mut(b, head + self.size) };
            if self.verify {
                pattern::fill(&mut w[head..], seq);
            } else {
                // raw-smbd: the header was written at set-up (the same
                // every time, as a client's is but for its credit fields);
                // the stamp behind it, as `send`'s client writes.
                pattern::stamp(&mut w[head..], seq);
            }
        }
        let sges = [self.bufs.sge(b, head + self.size)];
        let signaled = self.silent + 1 >= SIGNAL_EVERY;
        self.silent = if signaled { 0 } else { self.silent + 1 };
        // An unsignaled Send needs no completion: the operation ends with
        // its echo.
        self.state[s] = if signaled { 0 } else { SENT };
        marks::mark(Point::ClientPostBegin);
        let posted = self.qp.post_send(&[SendWr {
            wr_id: self.posted << SLOT_BITS | slot as u64,
            op: SendOp::Send {
                sges: &sges,
                invalidate: None,
            },
            signaled,
        }]);
        self.posted += 1;
        marks::mark(Point::ClientPostEnd);
        posted.map_err(|e| self.fail(format!("posting a Send: {e}")))?;
        if !self.fifo.push(slot, seq) {
            return Err(self.fail("more operations started than the queue depth"));
        }
        Ok(())
    }

    fn poll(&mut self, done: &mut dyn FnMut(Outcome)) -> Result<bool, BenchError> {
        if self.head > 0 {
            // raw-smbd: the header line of the next echo, fetched with its
            // completion, as smbdirectd's poll loops do
            // (Endpoint::prefetch_next_receive).
            prefetch(self.recv_wrs[self.next_recv].sge.addr as *const u8);
        }
        let n = self.cq.poll(&mut self.wcs);
        let detected = marks::now();
        for k in 0..n {
            let wc = self.wcs[k];
            if wc.status != WcStatus::Success {
                return Err(self.fail(format!(
                    "work request {:#x} ({:?}) completed with {:?}: the raw echo peer is gone",
                    wc.wr_id, wc.opcode, wc.status
                )));
            }
            let slot = match wc.opcode {
                WcOpcode::Send => {
                    // In order: this Send and every one before it are done.
                    self.retired = (wc.wr_id >> SLOT_BITS) + 1;
                    (wc.wr_id & ((1 << SLOT_BITS) - 1)) as usize
                }
                WcOpcode::Recv => {
                    marks::mark_at(Point::ClientDetect, detected);
                    let i = (wc.wr_id & !RECV_BIT) as usize;
                    let Some((slot, seq)) = self.fifo.pop() else {
                        return Err(self.fail("an echo arrived with no operation in flight"));
                    };
                    let s = slot as usize;
                    let len = wc.byte_len as usize;
                    let head = self.head;
                    let ok = len == head + self.size
                        && (head == 0 && !self.verify || {
                            // SAFETY: the receive completed: the buffer is
                            // ours until reposted below.
                            let m = unsafe { self.bufs.bytes(i, len) };
                            (head == 0 || smbd_header_ok(m, ECHO_GRANTS))
                                && if self.verify {
                                    pattern::check(&m[head..], seq)
                                } else {
                                    pattern::stamped(&m[head..], seq)
                                }
                        });
                    self.ok[s] = ok;
                    let r = i - self.nsend;
                    self.next_recv = if r + 1 == self.recv_wrs.len() {
                        0
                    } else {
                        r + 1
                    };
                    self.qp
                        .post_recv(&self.recv_wrs[r..=r])
                        .map_err(|e| self.fail(format!("reposting a receive: {e}")))?;
                    self.state[s] |= ECHOED;
                    s
                }
                _ => continue,
            };
            let Some(st) = self.state.get_mut(slot) else {
                return Err(self.fail(format!(
                    "completion of unknown work request {:#x}",
                    wc.wr_id
                )));
            };
            if wc.opcode == WcOpcode::Send {
                *st |= SENT;
            }
            if *st == SENT | ECHOED {
                *st = 0;
                marks::mark(Point::ClientDone);
                done(Outcome {
                    slot: slot as u32,
                    ok: self.ok[slot],
                });
            }
        }
        Ok(n > 0)
    }

    fn describe(&self) -> String {
        format!(
            "raw: {} echo(es) awaited, queue pair {:?}",
            self.fifo.len(),
            self.qp.state()
        )
    }

    fn close(mut self) {
        self.qp.disconnect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(granted: u16, payload: usize) -> Vec<u8> {
        let mut m = smbd_header(granted, payload).to_vec();
        m.resize(HEADER + payload, 0x5a);
        m
    }

    #[test]
    fn raw_smbd_headers_pass_only_as_the_peer_writes_them() {
        for payload in [0usize, 1, 40, 512, 1340] {
            let m = message(ECHO_GRANTS, payload);
            assert!(smbd_header_ok(&m, ECHO_GRANTS), "{payload}");
            // An echo that sent the client's header back unchanged.
            assert!(!smbd_header_ok(
                &message(CLIENT_GRANTS, payload),
                ECHO_GRANTS
            ));
            // Shorter or longer than the header says.
            assert!(!smbd_header_ok(&m[..m.len() - 1], ECHO_GRANTS) || payload == 0);
            let mut long = m.clone();
            long.push(0);
            assert!(!smbd_header_ok(&long, ECHO_GRANTS), "{payload}");
        }
        // [MS-SMBD] 3.1.5.5: CreditsRequested zero, fragments to follow, a
        // payload inside the header, a message shorter than the header.
        let mut m = message(ECHO_GRANTS, 100);
        m[0..2].copy_from_slice(&0u16.to_le_bytes());
        assert!(!smbd_header_ok(&m, ECHO_GRANTS));
        let mut m = message(ECHO_GRANTS, 100);
        m[8..12].copy_from_slice(&7u32.to_le_bytes());
        assert!(!smbd_header_ok(&m, ECHO_GRANTS));
        let mut m = message(ECHO_GRANTS, 100);
        m[12..16].copy_from_slice(&8u32.to_le_bytes());
        assert!(!smbd_header_ok(&m, ECHO_GRANTS));
        assert!(!smbd_header_ok(&message(ECHO_GRANTS, 0)[..19], ECHO_GRANTS));
    }
}
