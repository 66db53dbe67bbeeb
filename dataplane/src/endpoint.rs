//! One SMB Direct connection bound to one queue pair: the glue between the
//! sans-IO [`Connection`] and an RDMA [`QueuePair`], over a worker's slice of
//! the registered buffer pool. Workers own many endpoints; benchmarks and
//! clients drive single ones. Nothing here allocates from the heap, locks or
//! makes a syscall once the endpoint exists: receive buffers, send buffers and
//! upper-layer message buffers all come from the pool slice, and exhaustion
//! is reported, never papered over with an allocation.
//!
//! Receive buffers are posted through [`Connection`]'s [`ReceivePoster`]
//! ([MS-SMBD] 3.1.5.9) directly on the queue pair, so a credit is only ever
//! granted for a receive that is really posted.

use crate::capture::{CaptureConn, CaptureHandle, CaptureOp, Direction};
use crate::provider::{
    Completion, MemoryRegion, QueuePair, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus,
};
use smbdirect_hugepages::{BufId, BufferPool, ClassId, SliceAllocator};
use smbdirect_protocol::smbd::{
    Connection, MessageData, NegotiateDecision, Receive, ReceivePoster, Role, SendError,
    TerminateReason, MAX_HEADER_LEN,
};
use smbdirect_protocol::time::Instant;
use std::sync::Arc;

/// Tag in the top bits of a work-request id: which kind of buffer it names.
const KIND_SHIFT: u32 = 62;
const KIND_RECV: u64 = 1;
const KIND_SEND: u64 = 2;
const ID_MASK: u64 = (1 << KIND_SHIFT) - 1;

/// The work-request id of a receive posted with buffer `buf` on behalf of an
/// endpoint (the control plane posts the negotiate receive before accepting).
pub fn recv_wr_id(buf: BufId) -> u64 {
    wr_id(KIND_RECV, buf)
}

fn wr_id(kind: u64, buf: BufId) -> u64 {
    debug_assert_eq!(buf.to_bits() & !ID_MASK, 0, "BufId uses the tag bits");
    (kind << KIND_SHIFT) | buf.to_bits()
}

/// Why an endpoint stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointError {
    /// The SMB Direct connection terminated.
    Terminated(TerminateReason),
    /// The provider failed a work request (status) on this queue pair.
    Provider(WcStatus),
    /// The pool had no buffer for a send: retry after buffers return.
    PoolExhausted,
}

impl core::fmt::Display for EndpointError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            EndpointError::Terminated(r) => write!(f, "{r}"),
            EndpointError::Provider(s) => write!(f, "RDMA work request failed: {s:?}"),
            EndpointError::PoolExhausted => f.write_str("buffer pool exhausted"),
        }
    }
}

/// A complete upper-layer message, still in its receive buffer (or in the
/// connection's reassembly buffer). Read it with [`Endpoint::message`], then
/// give it back with [`Endpoint::release`].
#[derive(Debug)]
#[must_use = "a delivery holds a receive buffer until released"]
pub struct Delivery {
    buf: BufId,
    data: MessageData,
    /// Connection.InvalidatedToken passed up with the message.
    pub invalidated_token: Option<u32>,
}

/// What a completion produced for the endpoint's owner.
#[derive(Debug)]
#[must_use = "an event may hold a receive buffer until released"]
pub enum Event {
    /// A complete upper-layer message.
    Message(Delivery),
    /// Passive side: the Negotiate Request arrived. The owner has it decided
    /// (the control plane runs `evaluate_negotiate_request`) and calls
    /// [`Endpoint::apply_negotiate_decision`]. The bytes are in `bytes[..len]`.
    NegotiateRequest {
        /// The message (a Negotiate Request is 20 bytes; more is ignored).
        bytes: [u8; 32],
        /// Bytes received (may exceed 32; only the first 32 are kept).
        len: usize,
    },
}

/// Counters of one endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EndpointStats {
    /// Receives posted on the queue pair.
    pub receives_posted: u64,
    /// Sends posted.
    pub sends_posted: u64,
    /// Sends held back because the pool had no send buffer.
    pub pool_stalls: u64,
}

/// Posts receives on behalf of the connection.
struct Poster<'a, Q: QueuePair> {
    qp: &'a mut Q,
    alloc: &'a mut SliceAllocator,
    pool: &'a BufferPool,
    mr: MemoryRegion,
    posted: &'a mut u16,
    stats: &'a mut EndpointStats,
}

impl<Q: QueuePair> ReceivePoster for Poster<'_, Q> {
    fn post_receives(&mut self, want: u16) -> u16 {
        const BATCH: usize = 16;
        let mut wrs = [RecvWr {
            wr_id: 0,
            sge: Sge {
                addr: 0,
                len: 0,
                lkey: 0,
            },
        }; BATCH];
        let mut done = 0u16;
        while done < want {
            let mut n = 0;
            while n < BATCH && done + (n as u16) < want {
                let Ok(id) = self.alloc.alloc(ClassId::RECEIVE) else {
                    break;
                };
                let Some(loc) = self.pool.locate(id) else {
                    let _ = self.alloc.free(id);
                    break;
                };
                wrs[n] = RecvWr {
                    wr_id: wr_id(KIND_RECV, id),
                    sge: self.mr.sge(loc.offset as u64, loc.len as u32),
                };
                n += 1;
            }
            if n == 0 {
                break;
            }
            if self.qp.post_recv(&wrs[..n]).is_err() {
                for w in &wrs[..n] {
                    let _ = self.alloc.free(BufId::from_bits(w.wr_id & ID_MASK));
                }
                break;
            }
            done += n as u16;
            *self.posted += n as u16;
            self.stats.receives_posted += n as u64;
            if n < BATCH {
                break;
            }
        }
        done
    }
}

/// One connection on one queue pair.
#[derive(Debug)]
pub struct Endpoint<Q: QueuePair> {
    qp: Q,
    conn: Connection,
    pool: BufferPool,
    mr: MemoryRegion,
    /// Receives currently posted (returned by flush completions on teardown).
    recv_posted: u16,
    /// Sends in flight (their buffers return on completion).
    sends_in_flight: u32,
    stats: EndpointStats,
    failed: Option<EndpointError>,
    defer_negotiation: bool,
    send_depth: u32,
    capture: Option<(Arc<CaptureHandle>, CaptureConn)>,
}

impl<Q: QueuePair> Endpoint<Q> {
    /// Binds `conn` to `qp`. `mr` is the registration of `pool`'s region.
    pub fn new(qp: Q, conn: Connection, pool: BufferPool, mr: MemoryRegion) -> Self {
        Endpoint {
            qp,
            conn,
            pool,
            mr,
            recv_posted: 0,
            sends_in_flight: 0,
            stats: EndpointStats::default(),
            failed: None,
            defer_negotiation: false,
            send_depth: u32::MAX,
            capture: None,
        }
    }

    /// Records every message sent and received on this connection
    /// (`serve --capture`).
    pub fn set_capture(&mut self, handle: Arc<CaptureHandle>, conn: CaptureConn) {
        self.capture = Some((handle, conn));
    }

    /// Most sends in flight at once (the queue pair's send depth); a peer
    /// granting more credits than that cannot overrun the send queue.
    pub fn set_send_depth(&mut self, depth: u32) {
        self.send_depth = depth.max(1);
    }

    /// Passive side: hand the Negotiate Request to the owner as
    /// [`Event::NegotiateRequest`] instead of deciding here.
    pub fn defer_negotiation(&mut self, defer: bool) {
        self.defer_negotiation = defer;
    }

    /// Applies a negotiation decision taken elsewhere ([MS-SMBD] 3.1.5.6):
    /// posts the receives and queues the response (call `flush` next).
    pub fn apply_negotiate_decision(
        &mut self,
        now: Instant,
        decision: NegotiateDecision,
        alloc: &mut SliceAllocator,
    ) -> Result<(), EndpointError> {
        let mut p = Poster {
            qp: &mut self.qp,
            alloc,
            pool: &self.pool,
            mr: self.mr,
            posted: &mut self.recv_posted,
            stats: &mut self.stats,
        };
        match self.conn.apply_negotiate_decision(now, decision, &mut p) {
            Ok(_) => Ok(()),
            Err(r) => Err(self.fail(EndpointError::Terminated(r))),
        }
    }

    /// The queue pair.
    pub fn qp(&self) -> &Q {
        &self.qp
    }

    /// The queue pair, mutably (RDMA operations of the upper layer).
    pub fn qp_mut(&mut self) -> &mut Q {
        &mut self.qp
    }

    /// The SMB Direct state machine.
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// Counters.
    pub fn stats(&self) -> &EndpointStats {
        &self.stats
    }

    /// Why the endpoint stopped, once it has.
    pub fn failure(&self) -> Option<EndpointError> {
        self.failed
    }

    /// Work requests (receives and sends) whose completions are outstanding:
    /// zero once everything has been returned to the pool.
    pub fn outstanding(&self) -> u64 {
        self.recv_posted as u64 + self.sends_in_flight as u64
    }

    /// Accounts for `n` receives posted on the queue pair by someone else
    /// before the endpoint existed (with ids from [`recv_wr_id`]).
    pub fn assume_posted_receives(&mut self, n: u16) {
        self.recv_posted += n;
        self.stats.receives_posted += n as u64;
    }

    /// Posts the receive for the negotiate message ([MS-SMBD] 3.1.4.1 /
    /// 3.1.7.2: "post at least one receive buffer of at least 512 bytes").
    pub fn post_negotiate_receive(&mut self, alloc: &mut SliceAllocator) -> bool {
        let mut p = Poster {
            qp: &mut self.qp,
            alloc,
            pool: &self.pool,
            mr: self.mr,
            posted: &mut self.recv_posted,
            stats: &mut self.stats,
        };
        p.post_receives(1) == 1
    }

    fn fail(&mut self, e: EndpointError) -> EndpointError {
        if self.failed.is_none() {
            self.failed = Some(e);
            if let EndpointError::Terminated(_) = e {
                // A protocol violation or timer: tear the RDMA connection down
                // (flushes return every posted buffer through completions).
                self.qp.disconnect();
            }
        }
        e
    }

    /// Handles one completion of this queue pair. A complete upper-layer
    /// message comes back as a [`Delivery`].
    pub fn on_completion(
        &mut self,
        now: Instant,
        wc: &Completion,
        alloc: &mut SliceAllocator,
    ) -> Result<Option<Event>, EndpointError> {
        let buf = BufId::from_bits(wc.wr_id & ID_MASK);
        match wc.wr_id >> KIND_SHIFT {
            KIND_SEND => {
                self.sends_in_flight = self.sends_in_flight.saturating_sub(1);
                let _ = alloc.free(buf);
                if wc.status != WcStatus::Success {
                    return Err(self.fail(EndpointError::Provider(wc.status)));
                }
                Ok(None)
            }
            KIND_RECV => {
                self.recv_posted = self.recv_posted.saturating_sub(1);
                if wc.status != WcStatus::Success || wc.opcode != WcOpcode::Recv {
                    let _ = alloc.free(buf);
                    if self.failed.is_none() {
                        self.conn.handle_connection_lost();
                    }
                    return Err(self.fail(EndpointError::Provider(wc.status)));
                }
                if self.failed.is_some() {
                    let _ = alloc.free(buf);
                    return Ok(None);
                }
                // SAFETY: the buffer was filled by the completed receive and
                // is owned by this endpoint until freed below or released.
                let bytes = match unsafe { self.pool.bytes(buf) } {
                    Some(b) => &b[..(wc.byte_len as usize).min(b.len())],
                    None => &[][..],
                };
                if let Some((h, c)) = &self.capture {
                    let op = wc
                        .invalidated_rkey
                        .map_or(CaptureOp::Send, CaptureOp::SendWithInvalidate);
                    h.record(c, Direction::Received, op, bytes);
                }
                if self.conn.role() == Role::Passive && self.defer_negotiation {
                    let mut copy = [0u8; 32];
                    let n = bytes.len().min(32);
                    copy[..n].copy_from_slice(&bytes[..n]);
                    let len = bytes.len();
                    let _ = alloc.free(buf);
                    return Ok(Some(Event::NegotiateRequest { bytes: copy, len }));
                }
                let mut p = Poster {
                    qp: &mut self.qp,
                    alloc,
                    pool: &self.pool,
                    mr: self.mr,
                    posted: &mut self.recv_posted,
                    stats: &mut self.stats,
                };
                let r = self
                    .conn
                    .handle_receive(now, bytes, wc.invalidated_rkey, &mut p);
                match r {
                    Ok(Receive::Message {
                        data,
                        invalidated_token,
                    }) => Ok(Some(Event::Message(Delivery {
                        buf,
                        data,
                        invalidated_token,
                    }))),
                    Ok(_) => {
                        let _ = alloc.free(buf);
                        Ok(None)
                    }
                    Err(reason) => {
                        let _ = alloc.free(buf);
                        Err(self.fail(EndpointError::Terminated(reason)))
                    }
                }
            }
            _ => Ok(None),
        }
    }

    /// The bytes of a delivered message.
    pub fn message(&self, d: &Delivery) -> &[u8] {
        match &d.data {
            MessageData::Reassembled => self.conn.reassembled(),
            MessageData::InPlace(r) => {
                // SAFETY: the delivery keeps the receive buffer allocated and
                // untouched by the provider (it is no longer posted).
                match unsafe { self.pool.bytes(d.buf) } {
                    Some(b) if r.end <= b.len() => &b[r.clone()],
                    _ => &[],
                }
            }
        }
    }

    /// Returns a delivery's receive buffer to the pool.
    pub fn release(&mut self, d: Delivery, alloc: &mut SliceAllocator) {
        let _ = alloc.free(d.buf);
    }

    /// Queues an upper-layer message held in pool buffer `msg` (`len`
    /// bytes). The endpoint frees `msg` once its last byte is on the wire.
    pub fn send(&mut self, msg: BufId, len: u32) -> Result<(), SendError> {
        self.conn.send(msg.to_bits(), len, None)
    }

    /// Posts everything the connection wants to transmit. Returns false when
    /// a send buffer was not available (call again after completions).
    pub fn flush(
        &mut self,
        now: Instant,
        alloc: &mut SliceAllocator,
    ) -> Result<bool, EndpointError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        let mut hdr = [0u8; MAX_HEADER_LEN];
        loop {
            if self.sends_in_flight >= self.send_depth {
                return Ok(true); // completions will call us again
            }
            // Reserve the send buffer first, so a transmit the connection
            // commits to always has somewhere to go.
            let sbuf = match alloc.alloc(ClassId::SEND) {
                Ok(b) => b,
                Err(_) => {
                    self.stats.pool_stalls += 1;
                    return Ok(false);
                }
            };
            let mut p = Poster {
                qp: &mut self.qp,
                alloc,
                pool: &self.pool,
                mr: self.mr,
                posted: &mut self.recv_posted,
                stats: &mut self.stats,
            };
            let Some(t) = self.conn.poll_transmit(now, &mut p, &mut hdr) else {
                let _ = alloc.free(sbuf);
                if let Some(r) = self.conn.terminated() {
                    return Err(self.fail(EndpointError::Terminated(r)));
                }
                return Ok(true);
            };
            let Some(loc) = self.pool.locate(sbuf) else {
                let _ = alloc.free(sbuf);
                return Err(self.fail(EndpointError::PoolExhausted));
            };
            // SAFETY: sbuf was just allocated and is exclusively ours.
            let out = unsafe { self.pool.bytes_mut(sbuf) }.unwrap_or_default();
            if out.len() < t.len() {
                let _ = alloc.free(sbuf);
                return Err(self.fail(EndpointError::PoolExhausted));
            }
            out[..t.header_len].copy_from_slice(&hdr[..t.header_len]);
            if let Some(ps) = t.payload {
                let msg = BufId::from_bits(ps.handle);
                // SAFETY: the message buffer belongs to this endpoint until
                // its last slice is copied.
                if let Some(src) = unsafe { self.pool.bytes(msg) } {
                    let s = &src[ps.offset as usize..(ps.offset + ps.len) as usize];
                    out[t.header_len..t.len()].copy_from_slice(s);
                }
                if ps.last {
                    let _ = alloc.free(msg);
                }
            }
            if let Some((h, c)) = &self.capture {
                let op = t
                    .invalidate_token
                    .map_or(CaptureOp::Send, CaptureOp::SendWithInvalidate);
                h.record(c, Direction::Sent, op, &out[..t.len()]);
            }
            let sge = [self.mr.sge(loc.offset as u64, t.len() as u32)];
            let wr = [SendWr {
                wr_id: wr_id(KIND_SEND, sbuf),
                op: SendOp::Send {
                    sges: &sge,
                    invalidate: t.invalidate_token,
                },
                signaled: true,
            }];
            if let Err(_e) = self.qp.post_send(&wr) {
                let _ = alloc.free(sbuf);
                self.conn.handle_connection_lost();
                return Err(self.fail(EndpointError::Provider(WcStatus::Flushed)));
            }
            self.sends_in_flight += 1;
            self.stats.sends_posted += 1;
            if t.disconnect_after {
                // The failure negotiate response is on its way; the caller
                // disconnects once it completes.
                return Ok(true);
            }
        }
    }

    /// [MS-SMBD] 3.1.6 timers; the earliest deadline is
    /// `connection().poll_timeout()`.
    pub fn on_timer(&mut self, now: Instant) -> Result<(), EndpointError> {
        match self.conn.handle_timeout(now) {
            Ok(()) => Ok(()),
            Err(r) => Err(self.fail(EndpointError::Terminated(r))),
        }
    }

    /// Upper-layer messages still queued (after termination): their buffers
    /// go back to the pool.
    pub fn drain_queued(&mut self) -> impl Iterator<Item = BufId> + '_ {
        self.conn
            .drain_send_queue()
            .map(|m| BufId::from_bits(m.handle))
    }

    /// Closes the connection; posted buffers come back through flushed
    /// completions, queued messages are freed here.
    pub fn close(&mut self, alloc: &mut SliceAllocator) {
        self.conn.close();
        for m in self.conn.drain_send_queue() {
            let _ = alloc.free(BufId::from_bits(m.handle));
        }
        self.fail(EndpointError::Terminated(TerminateReason::LocalClose));
    }
}
