//! Queue pairs. The posting thread is the NIC: `post_send` executes each
//! work request synchronously, against the peer's shared receive queue,
//! inbound completion ring and grant table, then completes it locally.
//!
//! A Send enters the peer's gate, pops the peer's next posted receive, copies
//! the gathered bytes into it and publishes the receive completion into the
//! peer's inbound ring with a Release store; an RDMA Write or Read enters the
//! gate, validates the grant and copies. Consequently an RDMA Write's data is
//! visible to the peer before a later Send's completion ([MS-SMBD] 1.5): the
//! write's copy is sequenced before the Send's Release publish, and the
//! peer's CQ observes that publish with an Acquire load.
//!
//! Hot-path cost: no allocation, lock or syscall. A Send is a few atomic
//! loads and stores on lines shared with the peer, two uncontended RMWs on
//! the peer's gate, and the copy.

use std::collections::VecDeque;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::conn::{gate_enter, gate_leave, BreakInfo, BreakReason, Endpoint};
use super::copy::gather;
use super::grant::{Refusal, RevokeOutcome};
use super::ring::PostedRecv;
use super::rng::XorShift;
use crate::provider::{
    Access, Completion, Grant, ProviderError, QpId, QpState, QueuePair, RecvWr, RemoteBuf, SendOp,
    SendWr, Sge, WcOpcode, WcStatus,
};

/// The raw status ([`WcStatus::Other`]) a sender gets when its message was
/// longer than the receive buffer the peer posted, as verbs reports it
/// (`IBV_WC_REM_INV_REQ_ERR`); the receiver's receive completes with
/// [`WcStatus::LocalLengthError`].
pub const WC_REMOTE_INVALID_REQUEST: u32 = 9;

/// A soft queue pair. Use it from one thread at a time (it is `Send`).
#[derive(Debug)]
pub struct SoftQp {
    ep: Arc<Endpoint>,
    /// Send-queue work requests posted so far (their sequence numbers).
    sq_posted: u64,
    /// Receives posted so far.
    rq_posted: u64,
    /// Our grant slots that are FREE, oldest first (FIFO, so a slot is
    /// re-granted as late as possible).
    free_grants: VecDeque<u32>,
    rng: XorShift,
    rq_head_cache: std::cell::Cell<u64>,
    peer_cq_head_cache: std::cell::Cell<u64>,
}

#[inline]
fn bump(c: &AtomicU64) {
    // Single writer (this queue pair's owner): no RMW needed.
    c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

impl SoftQp {
    pub(crate) fn new(ep: Arc<Endpoint>) -> Self {
        let free_grants = (ep.grant_base..ep.grant_base + ep.grant_count).collect();
        SoftQp {
            ep,
            sq_posted: 0,
            rq_posted: 0,
            free_grants,
            rng: XorShift::from_os(),
            rq_head_cache: std::cell::Cell::new(0),
            peer_cq_head_cache: std::cell::Cell::new(0),
        }
    }

    /// How and by whom the connection broke, if it did.
    pub fn break_info(&self) -> Option<BreakInfo> {
        self.ep.break_info()
    }

    /// Whether the peer is another process (memory it reaches must then be
    /// registered with a shared fd before connecting).
    pub fn is_cross_process(&self) -> bool {
        self.ep.cross_process
    }

    /// The peer's pid as seen from this process.
    pub fn peer_pid(&self) -> i32 {
        self.ep.peer_pid
    }

    /// How many grants can be live at once on this queue pair.
    pub fn grant_capacity(&self) -> u32 {
        self.ep.grant_count
    }

    #[inline]
    fn sq_room(&self, n: usize) -> Result<(), ProviderError> {
        // Acquire pairs with the CQ's Release store of `sq_retired`.
        let outstanding = self.sq_posted - self.ep.sq_retired.load(Ordering::Acquire);
        if outstanding + n as u64 > u64::from(self.ep.caps.max_send_wr) {
            return Err(ProviderError::QueueFull);
        }
        Ok(())
    }

    /// Completes send-queue work request `seq` locally.
    #[inline]
    fn complete(
        &mut self,
        seq: u64,
        wr_id: u64,
        status: WcStatus,
        opcode: WcOpcode,
        byte_len: u32,
    ) {
        let c = Completion {
            wr_id,
            qp: self.ep.id,
            status,
            opcode,
            byte_len,
            invalidated_rkey: None,
        };
        // Cannot fail: the ring holds next_pow2(max_send_wr) entries and at
        // most max_send_wr work requests are outstanding (unretired).
        let pushed = self.ep.local.view().try_push(|s| s.write(&c, seq));
        debug_assert!(pushed, "local completion ring overflow");
    }

    /// Total length of `sges` if each lies inside a region registered with
    /// this provider and the sum fits a message.
    #[inline]
    fn local_len(&self, sges: &[Sge]) -> Option<u32> {
        let regions = &self.ep.provider.regions;
        let mut total = 0u64;
        for s in sges {
            regions.find(s.lkey, s.addr, u64::from(s.len))?;
            total += u64::from(s.len);
        }
        u32::try_from(total).ok()
    }

    /// The region of `sge` if the peer can reach it (receive buffers and
    /// granted memory).
    fn reachable(&self, sge: Sge) -> Result<u32, String> {
        let ep = &*self.ep;
        let Some(r) = ep
            .provider
            .regions
            .find(sge.lkey, sge.addr, u64::from(sge.len))
        else {
            return Err(format!(
                "{} bytes at {:#x} (lkey {:#x}) are not inside a region registered with this provider",
                sge.len, sge.addr, sge.lkey
            ));
        };
        if ep.cross_process && !r.shared {
            return Err(format!(
                "memory at {:#x} (lkey {:#x}) was registered without a shared fd, so the peer process \
                 (pid {}) cannot reach it: register memfd-backed memory (Backing::SharedMemfd) with its fd",
                sge.addr, sge.lkey, ep.peer_pid
            ));
        }
        if ep.cross_process && r.serial >= ep.serials_exported {
            return Err(format!(
                "region lkey {:#x} was registered after the connection to pid {} was established; a peer \
                 process maps only the regions registered before it connected",
                sge.lkey, ep.peer_pid
            ));
        }
        Ok(r.index)
    }

    /// Executes one work request; returns its status, opcode and length.
    #[inline]
    fn execute(&mut self, wr: &SendWr<'_>) -> (WcStatus, WcOpcode, u32) {
        let (opcode, sges) = match wr.op {
            SendOp::Send { sges, .. } => (WcOpcode::Send, sges),
            SendOp::RdmaWrite { sges, .. } => (WcOpcode::RdmaWrite, sges),
            SendOp::RdmaRead { sges, .. } => (WcOpcode::RdmaRead, sges),
        };
        let ep = &*self.ep;
        if ep.is_broken() {
            ep.provider.counters.flushed.fetch_add(1, Ordering::Relaxed);
            return (WcStatus::Flushed, opcode, 0);
        }
        let Some(total) = self.local_len(sges) else {
            ep.provider
                .counters
                .local_protection_errors
                .fetch_add(1, Ordering::Relaxed);
            ep.break_conn(BreakReason::LocalProtection);
            return (WcStatus::LocalProtectionError, opcode, 0);
        };
        let gate = ep.peer_gate();
        if !gate_enter(gate) {
            ep.provider.counters.flushed.fetch_add(1, Ordering::Relaxed);
            return (WcStatus::Flushed, opcode, 0);
        }
        let status = match wr.op {
            SendOp::Send { invalidate, .. } => self.deliver(sges, total, invalidate),
            SendOp::RdmaWrite { remote, .. } => self.rdma(sges, total, remote, Access::RemoteWrite),
            SendOp::RdmaRead { remote, .. } => self.rdma(sges, total, remote, Access::RemoteRead),
        };
        gate_leave(gate);
        (
            status,
            opcode,
            if status == WcStatus::Success {
                total
            } else {
                0
            },
        )
    }

    /// A Send, inside the peer's gate.
    #[inline]
    fn deliver(&self, sges: &[Sge], total: u32, invalidate: Option<u32>) -> WcStatus {
        let ep = &*self.ep;
        let peer = ep.peer();
        if let Some(rkey) = invalidate {
            if let Err(r) = ep.peer_grants.invalidate(rkey, ep.peer_binding) {
                return self.refused(r);
            }
            bump(&ep.seg.counters(peer).peer.grants_invalidated);
        }
        let rq = ep.seg.rq(peer);
        let mut posted = PostedRecv {
            wr_id: 0,
            addr: 0,
            len: 0,
            region: 0,
        };
        if rq.pop_stamped(1, |_, s| posted = s.read()) == 0 {
            ep.provider
                .counters
                .rnr_errors
                .fetch_add(1, Ordering::Relaxed);
            ep.break_conn(BreakReason::ReceiverNotReady);
            return WcStatus::RnrRetryExceeded;
        }
        let (recv_status, mine, fatal) = if total > posted.len {
            ep.provider
                .counters
                .length_errors
                .fetch_add(1, Ordering::Relaxed);
            (
                WcStatus::LocalLengthError,
                WcStatus::Other(WC_REMOTE_INVALID_REQUEST),
                Some(BreakReason::MessageTooLong),
            )
        } else {
            match ep
                .peer_mem
                .translate(posted.region, posted.addr, u64::from(total))
            {
                Some(dst) => {
                    // SAFETY: every SGE lies in a region registered with our
                    // provider (checked by `local_len`), hence mapped; `dst`
                    // is `total` bytes of the receive buffer the peer posted
                    // (same process: validated by its provider at post time;
                    // cross process: bounds-checked against our mapping of its
                    // region). The peer gave the buffer to the "NIC" and
                    // cannot reuse it before this completion, and our gate
                    // entry keeps its queue pair from being torn down.
                    unsafe { gather(sges, dst) };
                    (WcStatus::Success, WcStatus::Success, None)
                }
                None => (
                    WcStatus::LocalProtectionError,
                    WcStatus::Other(WC_REMOTE_INVALID_REQUEST),
                    Some(BreakReason::LocalProtection),
                ),
            }
        };
        let c = Completion {
            wr_id: posted.wr_id,
            qp: QpId(0),
            status: recv_status,
            opcode: WcOpcode::Recv,
            byte_len: if recv_status == WcStatus::Success {
                total
            } else {
                0
            },
            invalidated_rkey: if recv_status == WcStatus::Success {
                invalidate
            } else {
                None
            },
        };
        // The copy above is sequenced before this Release publish (in
        // `push_n`); the peer's CQ Acquire-loads the tail before reading the
        // completion, so it sees the bytes, and any RDMA Write this thread
        // made before, once it sees the completion.
        if !ep
            .seg
            .cq(peer)
            .try_push_cached(&self.peer_cq_head_cache, |s| s.write(&c, 0))
        {
            // More completions than receives posted: the peer's indices lie.
            ep.break_conn(BreakReason::Corruption);
            return WcStatus::Other(WC_REMOTE_INVALID_REQUEST);
        }
        if let Some(reason) = fatal {
            ep.break_conn(reason);
        }
        mine
    }

    /// An RDMA Write or Read, inside the peer's gate.
    #[inline]
    fn rdma(&self, sges: &[Sge], total: u32, remote: RemoteBuf, need: Access) -> WcStatus {
        let ep = &*self.ep;
        let grant = match ep.peer_grants.acquire(
            remote.rkey,
            ep.peer_binding,
            remote.addr,
            u64::from(total),
            need,
        ) {
            Ok(g) => g,
            Err(r) => return self.refused(r),
        };
        let status = match ep
            .peer_mem
            .translate(grant.region, remote.addr, u64::from(total))
        {
            Some(p) => {
                // SAFETY: local SGEs are registered memory (checked by
                // `local_len`); `p..p + total` is inside the grant (checked by
                // `acquire`) and reachable from here (checked by `translate`).
                // The grant reference we hold makes a concurrent revoke wait
                // until the copy is done.
                unsafe {
                    match need {
                        Access::RemoteWrite => gather(sges, p),
                        Access::RemoteRead => scatter(p, sges),
                    }
                }
                WcStatus::Success
            }
            None => WcStatus::RemoteAccessError,
        };
        ep.peer_grants.release(grant);
        if status != WcStatus::Success {
            return self.refused(Refusal::OutOfRange);
        }
        status
    }

    /// The peer's grant check refused us: fatal to this connection.
    #[cold]
    fn refused(&self, r: Refusal) -> WcStatus {
        let ep = &*self.ep;
        ep.seg.counters(ep.peer()).peer.refused[r.index()].fetch_add(1, Ordering::Relaxed);
        ep.provider
            .counters
            .remote_access_errors
            .fetch_add(1, Ordering::Relaxed);
        ep.break_conn(BreakReason::AccessViolation);
        WcStatus::RemoteAccessError
    }

    /// A FREE grant slot of ours, reclaiming slots the peer invalidated with
    /// Send with Invalidate that were never revoked locally.
    fn take_grant_slot(&mut self) -> Option<u32> {
        if let Some(i) = self.free_grants.pop_front() {
            return Some(i);
        }
        if !self.ep.provider.config.reclaim_invalidated {
            return None;
        }
        let t = &self.ep.provider.grants;
        for i in self.ep.grant_base..self.ep.grant_base + self.ep.grant_count {
            if t.is_dead(i) {
                t.reclaim(i);
                self.free_grants.push_back(i);
            }
        }
        self.free_grants.pop_front()
    }
}

/// Copies consecutive bytes from `src` into `sges`, in order.
///
/// # Safety
/// As [`gather`], with the roles swapped.
#[inline]
unsafe fn scatter(src: *const u8, sges: &[Sge]) {
    let mut off = 0usize;
    for s in sges {
        // SAFETY: per the function contract.
        unsafe { ptr::copy(src.add(off), s.addr as *mut u8, s.len as usize) };
        off += s.len as usize;
    }
}

impl QueuePair for SoftQp {
    /// Yes since the gather writes whole lines and demotes the first
    /// (`copy.rs`): the header's line, which the peer's core wrote, is taken
    /// back for less than a send buffer costs (`send` 512 B p50, 6
    /// alternated pairs: 0.93-0.98 µs against 0.97-1.06 with the header in
    /// a send buffer).
    fn reply_header_in_receive_buffer(&self) -> bool {
        true
    }

    fn id(&self) -> QpId {
        self.ep.id
    }

    fn state(&self) -> QpState {
        self.ep.qp_state()
    }

    fn ird_ord(&self) -> (u32, u32) {
        self.ep.ird_ord
    }

    fn post_recv(&mut self, wrs: &[RecvWr]) -> Result<(), ProviderError> {
        let ep = &*self.ep;
        // Acquire pairs with the CQ's Release: polled receives are retired.
        let outstanding = self.rq_posted - ep.rq_retired.load(Ordering::Acquire);
        if outstanding + wrs.len() as u64 > u64::from(ep.caps.max_recv_wr) {
            return Err(ProviderError::QueueFull);
        }
        let rq = ep.seg.rq(ep.me);
        // Never short: the ring holds next_pow2(max_recv_wr) and occupancy
        // never exceeds the outstanding count checked above.
        if rq.free_slots_cached(&self.rq_head_cache, wrs.len() as u64) < wrs.len() as u64 {
            return Err(ProviderError::QueueFull);
        }
        // Validate all first, so a bad one posts nothing (verbs would fail
        // the receive later with a local protection error; failing now points
        // at the caller's bug directly). The regions found are kept for the
        // ring slots (the first RECV_REGIONS of a batch; any further ones
        // are looked up again).
        const RECV_REGIONS: usize = 32;
        let mut found = [0u32; RECV_REGIONS];
        for (k, wr) in wrs.iter().enumerate() {
            let region = self
                .reachable(wr.sge)
                .map_err(|e| ProviderError::Other(format!("post_recv: {e}")))?;
            if let Some(f) = found.get_mut(k) {
                *f = region;
            }
        }
        let regions = &ep.provider.regions;
        // One Release store publishes the whole batch.
        rq.push_n(wrs.len() as u64, |k, slot| {
            let wr = &wrs[k as usize];
            let region = match found.get(k as usize) {
                Some(&r) => r,
                None => regions
                    .find(wr.sge.lkey, wr.sge.addr, u64::from(wr.sge.len))
                    .map_or(0, |r| r.index),
            };
            slot.write(PostedRecv {
                wr_id: wr.wr_id,
                addr: wr.sge.addr,
                len: wr.sge.len,
                region,
            });
        });
        self.rq_posted += wrs.len() as u64;
        Ok(())
    }

    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<(), ProviderError> {
        let max_sge = self.ep.caps.max_sge as usize;
        for wr in wrs {
            let (SendOp::Send { sges, .. }
            | SendOp::RdmaWrite { sges, .. }
            | SendOp::RdmaRead { sges, .. }) = wr.op;
            if sges.len() > max_sge {
                return Err(ProviderError::Unsupported(
                    "more SGEs in a work request than QpCaps::max_sge",
                ));
            }
        }
        self.sq_room(wrs.len())?;
        for wr in wrs {
            let seq = self.sq_posted;
            self.sq_posted += 1;
            let (status, opcode, len) = self.execute(wr);
            // Selective signaling: errors always complete.
            if wr.signaled || status != WcStatus::Success {
                self.complete(seq, wr.wr_id, status, opcode, len);
            }
        }
        Ok(())
    }

    fn grant(
        &mut self,
        wr_id: u64,
        sge: Sge,
        access: Access,
        signaled: bool,
    ) -> Result<Grant, ProviderError> {
        if self.ep.is_broken() {
            return Err(ProviderError::NotConnected);
        }
        self.sq_room(1)?;
        let region = self.reachable(sge).map_err(ProviderError::GrantFailed)?;
        let Some(index) = self.take_grant_slot() else {
            return Err(ProviderError::GrantFailed(format!(
                "all {} grant slots of queue pair {} are live; revoke finished I/Os (or raise SoftConfig::grants_per_qp)",
                self.ep.grant_count, self.ep.id.0
            )));
        };
        let ep = &*self.ep;
        let t = &ep.provider.grants;
        let rng = &mut self.rng;
        let rkey = t.new_rkey(index, || (rng.next_u64() >> 32) as u32);
        t.publish(
            index,
            rkey,
            sge.addr,
            sge.len,
            ep.my_binding,
            region,
            access,
        );
        bump(&ep.seg.counters(ep.me).owner.grants_created);
        let seq = self.sq_posted;
        self.sq_posted += 1;
        if signaled {
            self.complete(seq, wr_id, WcStatus::Success, WcOpcode::Bind, 0);
        }
        Ok(Grant {
            addr: sge.addr,
            rkey,
            len: sge.len,
        })
    }

    fn revoke(&mut self, wr_id: u64, rkey: u32, signaled: bool) -> Result<(), ProviderError> {
        self.sq_room(1)?;
        let ep = &*self.ep;
        let t = &ep.provider.grants;
        let index = t.index_of(rkey);
        if index < ep.grant_base || index >= ep.grant_base + ep.grant_count {
            return Err(ProviderError::GrantFailed(format!(
                "revoke: rkey {rkey:#x} was not granted on queue pair {}",
                ep.id.0
            )));
        }
        match t.revoke(index, rkey, || ep.peer_gone()) {
            RevokeOutcome::Revoked => {
                bump(&ep.seg.counters(ep.me).owner.grants_revoked);
                t.reclaim(index);
                self.free_grants.push_back(index);
            }
            RevokeOutcome::AlreadyDead => {
                t.reclaim(index);
                self.free_grants.push_back(index);
            }
            // Already reclaimed after the peer invalidated it, or never ours
            // with this token: nothing is reachable through it either way.
            RevokeOutcome::Unknown => {}
        }
        let status = if ep.is_broken() {
            ep.provider.counters.flushed.fetch_add(1, Ordering::Relaxed);
            WcStatus::Flushed
        } else {
            WcStatus::Success
        };
        let seq = self.sq_posted;
        self.sq_posted += 1;
        if signaled || status != WcStatus::Success {
            self.complete(seq, wr_id, status, WcOpcode::Revoke, 0);
        }
        Ok(())
    }

    fn disconnect(&mut self) {
        self.ep.disconnect();
    }

    fn drain_send_queue(&mut self, wr_id: u64) -> Result<(), ProviderError> {
        // Requests execute when posted, so the marker is flushed at once,
        // behind everything before it.
        if !self.ep.is_broken() {
            return Err(ProviderError::Other(
                "drain marker refused: the queue pair is still connected".into(),
            ));
        }
        self.post_send(&[SendWr {
            wr_id,
            op: SendOp::Send {
                sges: &[],
                invalidate: None,
            },
            signaled: true,
        }])
    }
}

impl Drop for SoftQp {
    fn drop(&mut self) {
        let ep = &*self.ep;
        ep.disconnect();
        // No peer access to our memory is in flight after this...
        ep.drain_my_gate();
        // ...and none can start: every grant still live is killed.
        let t = &ep.provider.grants;
        for i in ep.grant_base..ep.grant_base + ep.grant_count {
            if let Some(rkey) = t.live_rkey(i) {
                if t.revoke(i, rkey, || ep.peer_gone()) == RevokeOutcome::Revoked {
                    bump(&ep.seg.counters(ep.me).owner.grants_revoked);
                }
            }
            t.reclaim(i);
        }
        // Release: the CQ's Acquire load sees a fully torn-down endpoint.
        ep.dropped.store(true, Ordering::Release);
    }
}
