//! The active side: one SMB Direct connection driven from the calling
//! thread by busy-polling its own completion queue. Used by the load
//! generator, the end-to-end tests and `torture`; the server never uses it.
//!
//! For RDMA through the server, the client plays the SMB2 client's part
//! ([MS-SMBD] 3.1.4.3, 3.1.4.4): it grants the server access to ranges of
//! its own pool buffers ([`Client::grant`], one memory window per range),
//! puts the grants in its requests as Buffer Descriptor V1 structures
//! ([`buffer_descriptor`]), and revokes them afterwards ([`Client::revoke`])
//! unless the server's reply invalidated them ([`Client::recv_with_token`]).

use crate::endpoint::{Endpoint, EndpointError, Event};
use crate::marks::{self, Point};
use crate::provider::{
    Access, Completion, CompletionQueue, Grant, MemoryRegion, Provider, ProviderError, QpCaps,
    QueuePair, Sge,
};
use smbdirect_hugepages::{BufId, BufferPool, SliceAllocator};
use smbdirect_protocol::smbd::config::DATA_TRANSFER_PAYLOAD_OFFSET;
use smbdirect_protocol::smbd::wire::BufferDescriptorRepr;
use smbdirect_protocol::smbd::{Connection, SmbdConfig};
use smbdirect_protocol::time::Instant as PInstant;
use std::mem::ManuallyDrop;
use std::net::SocketAddr;
use std::time::Duration;

/// Why a client operation failed.
#[derive(Debug)]
pub enum ClientError {
    /// Connection setup failed.
    Provider(ProviderError),
    /// The connection ended.
    Endpoint(EndpointError),
    /// Negotiation or a receive did not finish in time.
    Timeout(&'static str),
    /// No pool buffer for the message.
    PoolExhausted,
    /// The message cannot be sent (too large, queue full).
    Send(smbdirect_protocol::smbd::SendError),
}

impl core::fmt::Display for ClientError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ClientError::Provider(e) => write!(f, "{e}"),
            ClientError::Endpoint(e) => write!(f, "{e}"),
            ClientError::Timeout(w) => write!(f, "timed out waiting for {w}"),
            ClientError::PoolExhausted => f.write_str("buffer pool exhausted"),
            ClientError::Send(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ClientError {}

/// Bytes [`Client::send`] leaves before a message that fits one segment,
/// for its Data Transfer header ([MS-SMBD] 2.2.3: the payload at
/// DataOffset 24).
const HEADER_ROOM: usize = DATA_TRANSFER_PAYLOAD_OFFSET;

/// Send-queue room kept for grants and revokes on top of the sends the
/// credits allow.
const GRANT_ROOM: u32 = 64;
/// Work-request id of grants and revokes (kind 0: the endpoint ignores
/// their completions, which only retire send-queue slots).
const LOCAL_WR_ID: u64 = 0;

/// The queue-pair sizes [`Client::connect`] uses for `cfg`; adjust them
/// (e.g. a small `ird`, which bounds the server's ORD) for
/// [`Client::connect_with_caps`].
pub fn client_caps(cfg: &SmbdConfig) -> QpCaps {
    QpCaps {
        max_recv_wr: cfg.receive_credit_max as u32 + 2,
        max_send_wr: cfg.send_credit_target as u32 + 8 + GRANT_ROOM,
        ..QpCaps::default()
    }
}

/// The Buffer Descriptor V1 ([MS-SMBD] 2.2.3.1) naming a grant: Offset is
/// its address, Token its rkey, Length its length.
pub fn buffer_descriptor(g: &Grant) -> BufferDescriptorRepr {
    BufferDescriptorRepr {
        offset: g.addr,
        token: g.rkey,
        length: g.len,
    }
}

impl From<ProviderError> for ClientError {
    fn from(e: ProviderError) -> Self {
        ClientError::Provider(e)
    }
}

impl From<EndpointError> for ClientError {
    fn from(e: EndpointError) -> Self {
        ClientError::Endpoint(e)
    }
}

/// Polls between clock reads while nothing happens (see [`PollClock`]).
const CLOCK_IDLE_POLLS: u32 = 16;

/// The clock of a busy-polling loop. A clock read costs tens of
/// nanoseconds, as much as an empty poll: reading it on every poll made the
/// loop (and so the delay before a completion is noticed) about a third
/// longer. It is read at the start of a step that follows one with
/// completions, and every [`CLOCK_IDLE_POLLS`] idle steps otherwise, so the
/// time the state machine sees lags by at most a few idle polls
/// (microseconds) behind the real one; [MS-SMBD] 3.1.6 timers are seconds.
/// Where a clock read is a system call the idle interval is stretched
/// ([`crate::clock::idle_polls_per_read`]).
#[derive(Debug)]
struct PollClock {
    /// Its start, in [`crate::clock::now_ns`]'s count.
    origin: u64,
    now: PInstant,
    /// Steps since the last read.
    idle: u32,
    /// The last step polled completions: read at the next.
    busy: bool,
    /// Idle steps between reads.
    idle_polls: u32,
}

impl PollClock {
    fn new() -> Self {
        PollClock {
            origin: crate::clock::now_ns(),
            now: PInstant::ZERO,
            idle: 0,
            busy: true,
            idle_polls: crate::clock::idle_polls_per_read(CLOCK_IDLE_POLLS),
        }
    }

    /// Reads the clock now.
    fn read(&mut self) -> PInstant {
        self.now = PInstant::from_nanos(crate::clock::now_ns().saturating_sub(self.origin));
        self.idle = 0;
        self.busy = false;
        self.now
    }

    /// The time for the step about to poll.
    #[inline]
    fn tick(&mut self) -> PInstant {
        if self.busy || self.idle >= self.idle_polls {
            return self.read();
        }
        self.idle += 1;
        self.now
    }
}

/// One connection to an SMB Direct server.
pub struct Client<P: Provider> {
    cq: P::Cq,
    ep: Endpoint<P::Qp>,
    /// Given back by [`Client::close`]; dropped by `Drop` only after the
    /// endpoint's buffers came home (a dropped slice allocator un-claims
    /// its slice, and buffers still out stay counted as allocated in it).
    alloc: ManuallyDrop<SliceAllocator>,
    /// `close` ran: `Drop` has nothing to shut and no allocator to drop.
    closed: bool,
    mr: MemoryRegion,
    clock: PollClock,
    /// The last flush found no send buffer: flush again on the next step.
    retry_flush: bool,
    wcs: [Completion; 16],
    /// Messages that arrived in the same batch as the one `recv_with`
    /// returned (kept, in order, for the next call).
    pending: std::collections::VecDeque<(Vec<u8>, Option<u32>)>,
}

impl<P: Provider> core::fmt::Debug for Client<P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Client")
            .field("established", &self.ep.connection().is_established())
            .finish()
    }
}

impl<P: Provider> Client<P> {
    /// Connects to `addr` and negotiates ([MS-SMBD] 3.1.4.1, 3.1.5.2, 3.1.5.7).
    /// `alloc` is a claimed slice of `mr`'s pool.
    pub fn connect(
        provider: &P,
        addr: SocketAddr,
        cfg: SmbdConfig,
        alloc: SliceAllocator,
        mr: MemoryRegion,
        timeout: Duration,
    ) -> Result<Self, ClientError> {
        let caps = client_caps(&cfg);
        Self::connect_with_caps(provider, addr, cfg, alloc, mr, timeout, caps)
    }

    /// [`Client::connect`] with explicit queue-pair sizes (start from
    /// [`client_caps`]); the send queue keeps 64 slots for grants.
    pub fn connect_with_caps(
        provider: &P,
        addr: SocketAddr,
        cfg: SmbdConfig,
        alloc: SliceAllocator,
        mr: MemoryRegion,
        timeout: Duration,
        caps: QpCaps,
    ) -> Result<Self, ClientError> {
        let cq = provider.create_cq(caps.max_recv_wr + caps.max_send_wr)?;
        let (qp, _pd) = provider.connect(addr, &cq.handle(), caps, &[], timeout)?;
        let pool: BufferPool = alloc.pool().clone();
        let conn = Connection::new_active(cfg, PInstant::ZERO);
        let mut ep = Endpoint::new(qp, conn, pool, mr);
        ep.set_send_depth(caps.max_send_wr.saturating_sub(GRANT_ROOM).max(1));
        let mut c = Client {
            pending: std::collections::VecDeque::new(),
            cq,
            ep,
            alloc: ManuallyDrop::new(alloc),
            closed: false,
            mr,
            clock: PollClock::new(),
            retry_flush: false,
            wcs: [Completion::EMPTY; 16],
        };
        if !c.ep.post_negotiate_receive(&mut c.alloc) {
            return Err(ClientError::PoolExhausted);
        }
        let now = c.clock.read();
        c.ep.flush(now, &mut c.alloc)?;
        let deadline = crate::clock::now() + timeout;
        while !c.ep.connection().is_established() {
            if crate::clock::now() > deadline {
                return Err(ClientError::Timeout("the negotiate response"));
            }
            c.step(&mut |_, _| {})?;
        }
        Ok(c)
    }

    /// The SMB Direct state.
    pub fn connection(&self) -> &Connection {
        self.ep.connection()
    }

    /// The endpoint (queue pair access for RDMA grants).
    pub fn endpoint_mut(&mut self) -> &mut Endpoint<P::Qp> {
        &mut self.ep
    }

    /// The pool slice.
    pub fn alloc_mut(&mut self) -> &mut SliceAllocator {
        &mut self.alloc
    }

    /// Polls once: completions, timers, transmits. Calls `on_msg` with each
    /// delivered message. Returns whether anything happened.
    pub fn step(
        &mut self,
        on_msg: &mut dyn FnMut(&[u8], Option<u32>),
    ) -> Result<bool, ClientError> {
        Self::step_into(
            &mut self.cq,
            &mut self.ep,
            &mut self.alloc,
            &mut self.wcs,
            &mut self.clock,
            &mut self.retry_flush,
            on_msg,
        )
    }

    fn step_into(
        cq: &mut P::Cq,
        ep: &mut Endpoint<P::Qp>,
        alloc: &mut SliceAllocator,
        wcs: &mut [Completion; 16],
        clock: &mut PollClock,
        retry_flush: &mut bool,
        on_msg: &mut dyn FnMut(&[u8], Option<u32>),
    ) -> Result<bool, ClientError> {
        let now = clock.tick();
        ep.prefetch_next_receive();
        let n = cq.poll(wcs);
        let detected = marks::now();
        clock.busy = n > 0;
        // Every polled completion is handled (each may return a buffer to
        // the pool); the first error is reported after the batch.
        let mut first_err = None;
        for wc in wcs.iter().take(n) {
            match ep.on_completion(now, wc, alloc) {
                Ok(Some(Event::Message(d))) => {
                    marks::mark_at(Point::ClientDetect, detected);
                    on_msg(ep.message(&d), d.invalidated_token);
                    ep.release(d, alloc);
                }
                Ok(Some(Event::NegotiateRequest { .. })) | Ok(None) => {}
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e.into());
        }
        let mut flush = n > 0 || *retry_flush;
        // [MS-SMBD] 3.1.6 timers: `now` moves only when the clock is read,
        // and deadlines only with completions, so an idle step between
        // clock reads has nothing new to compare.
        let clock_read = clock.idle == 0;
        if (n > 0 || clock_read) && ep.connection().poll_timeout().is_some_and(|t| t <= now) {
            ep.on_timer(now)?;
            flush = true;
        }
        // Transmits come from completions (grants, keepalive answers, send
        // queue room, returned buffers), timers, and sends (which flush
        // themselves): an idle step has nothing to flush, unless the last
        // flush found no send buffer.
        if flush {
            *retry_flush = !ep.flush(now, alloc)?;
        }
        Ok(n > 0)
    }

    /// Queues `msg` (copied into a pool buffer, the one copy: the Sends
    /// gather from there) and starts sending it. A message that fits one
    /// Data Transfer message ([MS-SMBD] 3.1.5.1) is copied in behind room
    /// for its header and goes as one contiguous Send from that buffer
    /// ([`Endpoint::send_with_header_room`]).
    pub fn send(&mut self, msg: &[u8]) -> Result<(), ClientError> {
        self.send_with(msg.len(), |b| b.copy_from_slice(msg))
    }

    /// [`Client::send`] of a `len`-byte message that `build` writes in
    /// place: it gets the pool buffer's `len` bytes the Sends gather from
    /// (behind room for the header where the message fits one Data
    /// Transfer message), so the message is never copied. What it does
    /// not write holds whatever the buffer held before.
    pub fn send_with(
        &mut self,
        len: usize,
        build: impl FnOnce(&mut [u8]),
    ) -> Result<(), ClientError> {
        let max_seg =
            (self.ep.connection().params().max_send_size as usize).saturating_sub(HEADER_ROOM);
        let room = if len <= max_seg { HEADER_ROOM } else { 0 };
        let id = self
            .alloc
            .alloc_len((room + len).max(1))
            .map_err(|_| ClientError::PoolExhausted)?;
        // SAFETY: `id` was just allocated and is exclusively ours.
        let built = match unsafe { self.alloc.pool().bytes_mut(id) } {
            Some(b) if b.len() >= room + len => {
                build(&mut b[room..room + len]);
                true
            }
            _ => false,
        };
        if !built {
            let _ = self.alloc.free(id);
            return Err(ClientError::PoolExhausted);
        }
        // Posted at once when nothing waits to go before it, else queued.
        let len = len as u32;
        match self
            .ep
            .send_now(&mut self.alloc, id, room as u32, len, None, room > 0)
        {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => {
                let _ = self.alloc.free(id);
                return Err(ClientError::Send(e));
            }
        }
        // The time of the last step: flush needs it only to stamp a
        // keepalive request, which a step would have sent already.
        let now = self.clock.now;
        self.retry_flush = !self.ep.flush(now, &mut self.alloc)?;
        Ok(())
    }

    /// Busy-polls until one message arrives (or `timeout`), handing it to `f`.
    pub fn recv_with<R>(
        &mut self,
        timeout: Duration,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, ClientError> {
        self.recv_with_token(timeout, |m, _| f(m))
    }

    /// [`Client::recv_with`], also passing the token the message's Send with
    /// Invalidate invalidated (Connection.InvalidatedToken), if any.
    pub fn recv_with_token<R>(
        &mut self,
        timeout: Duration,
        f: impl FnOnce(&[u8], Option<u32>) -> R,
    ) -> Result<R, ClientError> {
        if let Some((m, token)) = self.pending.pop_front() {
            return Ok(f(&m, token));
        }
        let deadline = crate::clock::now() + timeout;
        let mut f = Some(f);
        let mut out = None;
        let pending = &mut self.pending;
        while out.is_none() {
            let mut on_msg = |m: &[u8], token: Option<u32>| match f.take() {
                Some(f) => out = Some(f(m, token)),
                None => pending.push_back((m.to_vec(), token)),
            };
            Self::step_into(
                &mut self.cq,
                &mut self.ep,
                &mut self.alloc,
                &mut self.wcs,
                &mut self.clock,
                &mut self.retry_flush,
                &mut on_msg,
            )?;
            if out.is_none() && crate::clock::now() > deadline {
                return Err(ClientError::Timeout("a message"));
            }
        }
        Ok(out.expect("set above"))
    }

    /// A pool buffer of at least `len` bytes, for RDMA data.
    pub fn alloc_buffer(&mut self, len: usize) -> Result<BufId, ClientError> {
        self.alloc
            .alloc_len(len.max(1))
            .map_err(|_| ClientError::PoolExhausted)
    }

    /// Returns a buffer from [`Client::alloc_buffer`] (revoke its grants
    /// first).
    pub fn free_buffer(&mut self, id: BufId) {
        let _ = self.alloc.free(id);
    }

    /// Usable bytes of a buffer (0 for a stale id).
    pub fn buffer_len(&self, id: BufId) -> usize {
        self.alloc.pool().locate(id).map_or(0, |l| l.len)
    }

    /// Copies `bytes` into buffer `id` at `offset`; false if out of range.
    /// Meaningful only while no grant lets the peer write that range.
    pub fn write_buffer(&mut self, id: BufId, offset: usize, bytes: &[u8]) -> bool {
        let Some(loc) = self.alloc.pool().locate(id) else {
            return false;
        };
        if offset
            .checked_add(bytes.len())
            .map_or(true, |end| end > loc.len)
        {
            return false;
        }
        // SAFETY: the range is inside the live buffer (checked above), which
        // this client owns; a raw copy, since a peer granted access may touch
        // the memory concurrently (the caller is told not to rely on that).
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), loc.ptr.as_ptr().add(offset), bytes.len())
        };
        true
    }

    /// Copies `out.len()` bytes of buffer `id` from `offset` into `out`;
    /// false if out of range.
    pub fn read_buffer(&self, id: BufId, offset: usize, out: &mut [u8]) -> bool {
        let Some(loc) = self.alloc.pool().locate(id) else {
            return false;
        };
        if offset
            .checked_add(out.len())
            .map_or(true, |end| end > loc.len)
        {
            return false;
        }
        // SAFETY: as in `write_buffer`, in the other direction.
        unsafe {
            std::ptr::copy_nonoverlapping(loc.ptr.as_ptr().add(offset), out.as_mut_ptr(), out.len())
        };
        true
    }

    /// The SGE of `len` bytes at `offset` into buffer `id`.
    pub fn sge(&self, id: BufId, offset: usize, len: usize) -> Option<Sge> {
        let loc = self.alloc.pool().locate(id)?;
        if offset.checked_add(len)? > loc.len {
            return None;
        }
        Some(
            self.mr
                .sge((loc.offset + offset) as u64, u32::try_from(len).ok()?),
        )
    }

    /// Grants the server `access` to `len` bytes at `offset` into buffer
    /// `id`, through this connection only ([MS-SMBD] 3.1.4.3 Register
    /// Buffer); put [`buffer_descriptor`] of the result in a request.
    pub fn grant(
        &mut self,
        id: BufId,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Grant, ClientError> {
        let sge = self.sge(id, offset, len).ok_or_else(|| {
            ClientError::Provider(ProviderError::GrantFailed(format!(
                "{len} bytes at {offset} are outside buffer {id:?}"
            )))
        })?;
        let deadline = crate::clock::now() + Duration::from_secs(5);
        loop {
            match self.ep.qp_mut().grant(LOCAL_WR_ID, sge, access, true) {
                // A full send queue drains as completions are polled.
                Err(ProviderError::QueueFull) if crate::clock::now() < deadline => {
                    self.step(&mut |_, _| {})?;
                }
                r => return r.map_err(ClientError::Provider),
            }
        }
    }

    /// Revokes a grant ([MS-SMBD] 3.1.4.4 Deregister Buffer); revoking one
    /// the server already invalidated is not an error.
    pub fn revoke(&mut self, rkey: u32) -> Result<(), ClientError> {
        let deadline = crate::clock::now() + Duration::from_secs(5);
        loop {
            match self.ep.qp_mut().revoke(LOCAL_WR_ID, rkey, true) {
                Err(ProviderError::QueueFull) if crate::clock::now() < deadline => {
                    self.step(&mut |_, _| {})?;
                }
                r => return r.map_err(ClientError::Provider),
            }
        }
    }

    /// Closes the connection and waits (up to `timeout`) for every posted
    /// buffer to come back.
    pub fn close(mut self, timeout: Duration) -> SliceAllocator {
        self.shut(timeout);
        self.closed = true;
        // SAFETY: taken exactly once: `closed` keeps `Drop` off it.
        unsafe { ManuallyDrop::take(&mut self.alloc) }
    }

    fn shut(&mut self, timeout: Duration) {
        self.ep.close(&mut self.alloc);
        let deadline = crate::clock::now() + timeout;
        while self.ep.outstanding() > 0 && crate::clock::now() < deadline {
            let _ = self.step(&mut |_, _| {});
            // Retries a drain marker the send queue had no room for.
            self.ep.release_rdma(&mut self.alloc);
        }
    }
}

/// How long a dropped [`Client`] waits for its posted buffers (a flushed
/// queue pair returns them at once; a peer that stopped answering does
/// not hold a drop longer than this).
const DROP_DRAIN: Duration = Duration::from_millis(500);

impl<P: Provider> Drop for Client<P> {
    /// A client dropped without [`Client::close`] (an error path, a
    /// failed connect) closes its connection and lets its buffers come
    /// home before its slice is given back, so the next claim of the slice
    /// finds every buffer free.
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        self.shut(DROP_DRAIN);
        // SAFETY: dropped exactly once (not closed, so never taken).
        unsafe { ManuallyDrop::drop(&mut self.alloc) }
    }
}
