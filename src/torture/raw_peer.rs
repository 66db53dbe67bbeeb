//! A hand-driven SMB Direct peer: its own queue pair and completion queue,
//! messages built byte by byte (so they can break any rule of [MS-SMBD]
//! 2.2 and 3.1.5), and credits kept by hand (so it can spend credits it
//! does not have, or never grant any). Nothing here enforces the protocol:
//! that is the point. It only records what the server did: the messages
//! that arrived, and when and how the connection broke.

use super::rig::Rig;
use smbdirect_dataplane::provider::{
    Completion, CompletionQueue, MemoryRegion, Provider, QpCaps, QpState, QueuePair, RecvWr,
    SendOp, SendWr, WcOpcode, WcStatus,
};
use smbdirect_hugepages::{BufId, ClassId, SliceAllocator};
use smbdirect_protocol::smbd::wire::{
    DataTransfer, NegotiateRequestRepr, NegotiateResponse, NegotiateResponseRepr,
    SMB_DIRECT_RESPONSE_REQUESTED,
};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

const KIND_SHIFT: u32 = 62;
const KIND_RECV: u64 = 1;
const KIND_SEND: u64 = 2;
const ID_MASK: u64 = (1 << KIND_SHIFT) - 1;
/// Send-queue depth of a raw peer (sends are signaled and retired as
/// their completions are polled).
const SEND_DEPTH: u32 = 256;

/// Messages received, as raw bytes.
pub type Messages = Vec<Vec<u8>>;

/// How the connection ended, as the raw peer saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Broken {
    /// The first failed completion's status (`Flushed` when the server
    /// disconnected; `RnrRetryExceeded` when our send found no receive).
    pub status: WcStatus,
    /// When we noticed.
    pub at: Instant,
}

/// What waiting for a message produced.
#[derive(Debug)]
pub enum Wait {
    /// A message (raw bytes).
    Message(Vec<u8>),
    /// The connection broke.
    Broken(Broken),
    /// Nothing happened in time.
    Silent,
}

/// One Data Transfer message ([MS-SMBD] 2.2.3) to build, any field any
/// value. `grant: None` grants every receive posted since the last grant
/// (what a conforming peer does); `Some(n)` puts exactly `n` in
/// CreditsGranted.
#[derive(Debug, Clone, Copy)]
pub struct Dt {
    /// CreditsRequested.
    pub credits_requested: u16,
    /// CreditsGranted, or `None` for the receives posted and not yet granted.
    pub grant: Option<u16>,
    /// Flags.
    pub flags: u16,
    /// RemainingDataLength.
    pub remaining: u32,
    /// DataOffset.
    pub data_offset: u32,
    /// DataLength.
    pub data_length: u32,
    /// Length of the message on the wire (payload bytes beyond the header
    /// are taken from the payload given to [`RawPeer::send_dt`], zero-filled
    /// past its end).
    pub len: usize,
}

impl Dt {
    /// A well-formed message carrying `data_length` bytes at offset 24 with
    /// `remaining` bytes still to come.
    pub fn data(data_length: u32, remaining: u32) -> Dt {
        Dt {
            credits_requested: 32,
            grant: None,
            flags: 0,
            remaining,
            data_offset: 24,
            data_length,
            len: 24 + data_length as usize,
        }
    }

    /// A well-formed empty (credit-only) message.
    pub fn empty() -> Dt {
        Dt {
            credits_requested: 32,
            grant: None,
            flags: 0,
            remaining: 0,
            data_offset: 0,
            data_length: 0,
            len: 20,
        }
    }

    /// An empty message asking for an immediate answer (a keepalive,
    /// [MS-SMBD] 3.1.6.2).
    pub fn keepalive() -> Dt {
        Dt {
            flags: SMB_DIRECT_RESPONSE_REQUESTED,
            ..Dt::empty()
        }
    }
}

/// The Negotiate Request of a conforming peer ([MS-SMBD] 2.2.1, 3.1.5.2),
/// to start from and break one field of.
pub fn negotiate_request(credits_requested: u16) -> NegotiateRequestRepr {
    NegotiateRequestRepr {
        min_version: 0x0100,
        max_version: 0x0100,
        credits_requested,
        preferred_send_size: 1364,
        max_receive_size: 8192,
        max_fragmented_size: 1 << 20,
    }
}

/// A raw SMB Direct peer on its own queue pair.
pub struct RawPeer<P: Provider> {
    qp: Option<P::Qp>,
    cq: P::Cq,
    alloc: SliceAllocator,
    mr: MemoryRegion,
    recv: Vec<Option<BufId>>,
    sends_out: u32,
    wcs: [Completion; 16],
    inbox: VecDeque<Vec<u8>>,
    broken: Option<Broken>,
    established: bool,
    /// Send credits as the server granted them (negotiate response plus
    /// every CreditsGranted since), minus the messages sent with
    /// [`RawPeer::send_dt`].
    pub send_credits: u32,
    ungranted: u16,
    /// The server's Negotiate Response, once negotiated.
    pub negotiated: Option<NegotiateResponseRepr>,
    /// Data Transfer messages received.
    pub received: u64,
}

impl<P: Provider> RawPeer<P> {
    /// Connects at the RDMA level only (no SMB Direct message sent) and
    /// posts `receives` receive buffers.
    pub fn connect(rig: &Rig<P>, receives: u16) -> Result<Self, String> {
        let receives = receives.max(1);
        let caps = QpCaps {
            max_send_wr: SEND_DEPTH,
            max_recv_wr: u32::from(receives) + 1,
            ..QpCaps::default()
        };
        let cq = rig
            .provider
            .create_cq(caps.max_send_wr + caps.max_recv_wr)
            .map_err(|e| format!("create CQ: {e}"))?;
        let (qp, _) = rig
            .provider
            .connect(
                rig.addr,
                &cq.handle(),
                caps,
                &[],
                rig.timeout.max(Duration::from_secs(5)),
            )
            .map_err(|e| format!("RDMA connect to {}: {e}", rig.addr))?;
        let mut p = RawPeer {
            qp: Some(qp),
            cq,
            alloc: rig.slice()?,
            mr: rig.mr,
            recv: vec![None; usize::from(receives)],
            sends_out: 0,
            wcs: [Completion::EMPTY; 16],
            inbox: VecDeque::new(),
            broken: None,
            established: false,
            send_credits: 0,
            ungranted: 0,
            negotiated: None,
            received: 0,
        };
        for slot in 0..p.recv.len() {
            p.post_recv(slot)?;
        }
        Ok(p)
    }

    /// Connects and negotiates as a conforming peer with `req`; fails unless
    /// the server accepts.
    pub fn negotiated(
        rig: &Rig<P>,
        receives: u16,
        req: NegotiateRequestRepr,
    ) -> Result<Self, String> {
        let mut p = Self::connect(rig, receives)?;
        let rsp = p.negotiate(&req.to_bytes(), rig.timeout.max(Duration::from_secs(5)))?;
        if rsp.status != smbdirect_protocol::ntstatus::STATUS_SUCCESS {
            return Err(format!("negotiation refused: {}", rsp.status));
        }
        Ok(p)
    }

    fn post_recv(&mut self, slot: usize) -> Result<(), String> {
        let id = self
            .alloc
            .alloc(ClassId(0))
            .map_err(|e| format!("receive buffer: {e}"))?;
        let loc = match self.alloc.pool().locate(id) {
            Some(l) => l,
            None => {
                let _ = self.alloc.free(id);
                return Err("receive buffer vanished".into());
            }
        };
        let wr = RecvWr {
            wr_id: (KIND_RECV << KIND_SHIFT) | slot as u64,
            sge: self.mr.sge(loc.offset as u64, loc.len as u32),
        };
        let Some(qp) = self.qp.as_mut() else {
            let _ = self.alloc.free(id);
            return Err("queue pair closed".into());
        };
        if let Err(e) = qp.post_recv(&[wr]) {
            let _ = self.alloc.free(id);
            return Err(format!("post receive: {e}"));
        }
        self.recv[slot] = Some(id);
        Ok(())
    }

    fn note_broken(&mut self, status: WcStatus) {
        if self.broken.is_none() {
            self.broken = Some(Broken {
                status,
                at: Instant::now(),
            });
        }
    }

    /// Polls the completion queue once; returns whether anything happened.
    pub fn poll(&mut self) -> bool {
        // Sampled before polling: a message the server sent before it
        // disconnected is then already in the completion queue, and is
        // taken before the break is noted.
        let down = self
            .qp
            .as_ref()
            .is_some_and(|q| q.state() != QpState::Connected);
        let n = self.cq.poll(&mut self.wcs);
        for i in 0..n {
            let wc = self.wcs[i];
            match wc.wr_id >> KIND_SHIFT {
                KIND_RECV => {
                    let slot = (wc.wr_id & ID_MASK) as usize;
                    let Some(id) = self.recv.get_mut(slot).and_then(Option::take) else {
                        continue;
                    };
                    if wc.status != WcStatus::Success || wc.opcode != WcOpcode::Recv {
                        let _ = self.alloc.free(id);
                        self.note_broken(wc.status);
                        continue;
                    }
                    // SAFETY: the receive completed; the buffer is ours again.
                    let msg = unsafe { self.alloc.pool().bytes(id) }
                        .map(|b| b[..(wc.byte_len as usize).min(b.len())].to_vec())
                        .unwrap_or_default();
                    let _ = self.alloc.free(id);
                    self.on_message(&msg);
                    self.inbox.push_back(msg);
                    if self.broken.is_none() && self.post_recv(slot).is_ok() {
                        self.ungranted = self.ungranted.saturating_add(1);
                    }
                }
                KIND_SEND => {
                    self.sends_out = self.sends_out.saturating_sub(1);
                    let _ = self.alloc.free(BufId::from_bits(wc.wr_id & ID_MASK));
                    if wc.status != WcStatus::Success {
                        self.note_broken(wc.status);
                    }
                }
                _ => {}
            }
        }
        if down && n < self.wcs.len() {
            self.note_broken(WcStatus::Flushed);
        }
        n > 0
    }

    fn on_message(&mut self, msg: &[u8]) {
        if !self.established {
            return;
        }
        self.received += 1;
        if let Ok(v) = DataTransfer::new_checked(msg) {
            self.send_credits += u32::from(v.credits_granted());
        }
    }

    /// How the connection broke, if it did.
    pub fn broken(&self) -> Option<Broken> {
        self.broken
    }

    /// Sends `bytes` as one RDMA Send, without any credit accounting.
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), String> {
        while self.sends_out >= SEND_DEPTH / 2 && self.broken.is_none() {
            self.poll();
        }
        let id = self
            .alloc
            .alloc_len(bytes.len().max(1))
            .map_err(|e| format!("send buffer of {} bytes: {e}", bytes.len()))?;
        let Some(loc) = self.alloc.pool().locate(id) else {
            let _ = self.alloc.free(id);
            return Err("send buffer vanished".into());
        };
        // SAFETY: `id` was just allocated and is exclusively ours.
        match unsafe { self.alloc.pool().bytes_mut(id) } {
            Some(b) if b.len() >= bytes.len() => b[..bytes.len()].copy_from_slice(bytes),
            _ => {
                let _ = self.alloc.free(id);
                return Err("send buffer too small".into());
            }
        }
        let sge = [self.mr.sge(loc.offset as u64, bytes.len() as u32)];
        let wr = [SendWr {
            wr_id: (KIND_SEND << KIND_SHIFT) | id.to_bits(),
            op: SendOp::Send {
                sges: &sge,
                invalidate: None,
            },
            signaled: true,
        }];
        let Some(qp) = self.qp.as_mut() else {
            let _ = self.alloc.free(id);
            return Err("queue pair closed".into());
        };
        if let Err(e) = qp.post_send(&wr) {
            let _ = self.alloc.free(id);
            return Err(format!("post send: {e}"));
        }
        self.sends_out += 1;
        Ok(())
    }

    /// Builds and sends one Data Transfer message, spending one send credit
    /// (whether or not we hold one).
    pub fn send_dt(&mut self, dt: Dt, payload: &[u8]) -> Result<(), String> {
        let mut buf = dt_bytes(&dt, payload);
        let grant = match dt.grant {
            Some(g) => g,
            None => std::mem::take(&mut self.ungranted),
        };
        if buf.len() >= 4 {
            buf[2..4].copy_from_slice(&grant.to_le_bytes());
        }
        self.send_credits = self.send_credits.saturating_sub(1);
        self.send_raw(&buf)
    }

    /// Sends a Negotiate Request (`bytes`, well-formed or not) and waits for
    /// the response; on success the peer is established with the credits
    /// the response granted.
    pub fn negotiate(
        &mut self,
        bytes: &[u8],
        timeout: Duration,
    ) -> Result<NegotiateResponseRepr, String> {
        self.send_raw(bytes)?;
        match self.wait_message(timeout) {
            Wait::Message(m) => {
                let v = NegotiateResponse::new_checked(&m[..])
                    .map_err(|e| format!("negotiate response: {e}"))?;
                let r = NegotiateResponseRepr::parse(&v);
                if r.status == smbdirect_protocol::ntstatus::STATUS_SUCCESS {
                    self.established = true;
                    self.send_credits = u32::from(r.credits_granted);
                    // The receive the response used was reposted: every
                    // posted receive is still to be granted.
                    self.ungranted = self.recv.iter().filter(|s| s.is_some()).count() as u16;
                    self.negotiated = Some(r);
                }
                Ok(r)
            }
            Wait::Broken(b) => Err(format!(
                "connection broke ({:?}) instead of a negotiate response",
                b.status
            )),
            Wait::Silent => Err(format!("no negotiate response in {timeout:?}")),
        }
    }

    /// Waits up to `timeout` for the next message.
    pub fn wait_message(&mut self, timeout: Duration) -> Wait {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(m) = self.inbox.pop_front() {
                return Wait::Message(m);
            }
            if let Some(b) = self.broken {
                return Wait::Broken(b);
            }
            if Instant::now() >= deadline {
                return Wait::Silent;
            }
            if !self.poll() {
                std::hint::spin_loop();
            }
        }
    }

    /// Waits up to `timeout` for the connection to break, collecting what
    /// arrives meanwhile. `Ok(messages)` if it broke, `Err(messages)` if it
    /// was still up at the deadline.
    pub fn wait_broken(&mut self, timeout: Duration) -> Result<(Broken, Messages), Messages> {
        let deadline = Instant::now() + timeout;
        let mut got = Vec::new();
        loop {
            while let Some(m) = self.inbox.pop_front() {
                got.push(m);
            }
            if let Some(b) = self.broken {
                return Ok((b, got));
            }
            if Instant::now() >= deadline {
                return Err(got);
            }
            if !self.poll() {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }

    /// Messages received and not yet taken.
    pub fn take_inbox(&mut self) -> Vec<Vec<u8>> {
        self.inbox.drain(..).collect()
    }

    /// Disconnects (the server sees the connection lost).
    pub fn disconnect(&mut self) {
        if let Some(qp) = self.qp.as_mut() {
            qp.disconnect();
        }
    }
}

impl<P: Provider> Drop for RawPeer<P> {
    fn drop(&mut self) {
        self.disconnect();
        // Flushed completions give the buffers back.
        let deadline = Instant::now() + Duration::from_millis(500);
        while (self.sends_out > 0 || self.recv.iter().any(Option::is_some))
            && Instant::now() < deadline
        {
            self.poll();
        }
        drop(self.qp.take());
        for id in self.recv.iter_mut().filter_map(Option::take) {
            let _ = self.alloc.free(id);
        }
    }
}

/// The bytes of `dt` (CreditsGranted as given, or 0 for `None`; the sender
/// fills it in), with `payload` at DataOffset when it fits. A `len` below
/// the 20-byte header cuts the header short.
pub fn dt_bytes(dt: &Dt, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; dt.len.max(DataTransfer::<&[u8]>::HEADER_LEN)];
    {
        let mut v = DataTransfer::new_unchecked(&mut buf[..]);
        v.set_credits_requested(dt.credits_requested);
        v.set_credits_granted(dt.grant.unwrap_or(0));
        v.set_flags(dt.flags);
        v.set_remaining_data_length(dt.remaining);
        v.set_data_offset(dt.data_offset);
        v.set_data_length(dt.data_length);
    }
    let at = dt.data_offset as usize;
    if at >= 20 && at < buf.len() {
        let n = payload.len().min(buf.len() - at);
        buf[at..at + n].copy_from_slice(&payload[..n]);
    }
    buf.truncate(dt.len);
    buf
}
