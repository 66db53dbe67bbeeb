//! Reliable-connected queue pairs: chained posts from fixed scratch arrays,
//! grants and revokes.

use std::io;
use std::ptr;
use std::sync::Arc;

use rdma_sys::*;

use super::completion_queue::{CqShared, VerbsCqHandle};
use super::connection_manager::CmId;
use super::device::{Device, GrantMechanism, MrEntry};
use super::memory_window::{window_access, Grants, RegistrationGrants, WindowPool};
use super::work_queue::{self, QpShadow, WrTag};
use crate::provider::{
    Access, Completion, Grant, ProviderError, QpCaps, QpId, QpState, QueuePair, RecvWr, SendOp,
    SendWr, Sge, WcOpcode, WcStatus,
};

/// Work requests per `ibv_post_send`/`ibv_post_recv` call; longer slices are
/// posted as several chains.
const POST_BATCH: usize = 32;

/// Bytes of a Send the device is asked to take inline (`IBV_SEND_INLINE`:
/// copied out of the work request at post time, so the device never reads
/// them through their registration): SMB Direct's small messages fit
/// (credit grants and keepalives, 20 bytes; the 104-byte SMB2 response to
/// a READ or WRITE that moved its data by RDMA; short echoes). A device
/// that refuses this much gets a second try asking for none; either way
/// the queue pair uses what the device reports back.
const INLINE_WANT: u32 = 256;

/// A reliable-connected queue pair on a verbs device.
pub struct VerbsQp {
    qp: *mut ibv_qp,
    qp_num: u32,
    shadow: Arc<QpShadow>,
    slot: u16,
    generation: u16,
    wqes: u32,
    sq_head: u32,
    rq_head: u32,
    max_sge: usize,
    /// Sends of at most this many bytes go inline (what the device
    /// granted for [`INLINE_WANT`]; 0: none).
    max_inline: u32,
    send_wrs: Box<[ibv_send_wr]>,
    send_sges: Box<[ibv_sge]>,
    recv_wrs: Box<[ibv_recv_wr]>,
    recv_sges: Box<[ibv_sge]>,
    ird_ord: (u32, u32),
    grants: Grants,
    mrs: Vec<MrEntry>,
    mrs_seen: u64,
    /// [`Device::mr_removals`] when the table was last refreshed for one.
    mr_removals_seen: u64,
    /// Dropped after the queue pair is destroyed (Drop), which is what the
    /// id requires.
    cm_id: CmId,
    cq: Arc<CqShared>,
    device: Arc<Device>,
}

// SAFETY: the raw pointers (QP, scratch chains, windows) are owned by this
// value and used only through &mut self or verbs calls that are thread-safe;
// moving the owner to another thread (control plane -> worker) is fine.
unsafe impl Send for VerbsQp {}

impl std::fmt::Debug for VerbsQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsQp")
            .field("qp_num", &self.qp_num)
            .field("state", &self.state())
            .field("ird_ord", &self.ird_ord)
            .field("max_inline", &self.max_inline)
            .finish_non_exhaustive()
    }
}

fn zeroed_send_wr() -> ibv_send_wr {
    // SAFETY: all-zero is a valid ibv_send_wr: null pointers, zero integers.
    unsafe { std::mem::zeroed() }
}

fn zeroed_recv_wr() -> ibv_recv_wr {
    // SAFETY: as above.
    unsafe { std::mem::zeroed() }
}

fn post_error(what: &str, rc: i32) -> ProviderError {
    if rc == libc::ENOMEM {
        // What mlx5 and rxe return for a full work queue.
        ProviderError::QueueFull
    } else {
        ProviderError::Other(format!("{what}: {}", io::Error::from_raw_os_error(rc)))
    }
}

impl VerbsQp {
    /// Creates the queue pair on `cm_id` (resolved or from a connection
    /// request) and `cq`. On failure the id is handed back so the caller can
    /// reject or destroy it.
    pub(super) fn create(
        device: &Arc<Device>,
        cm_id: CmId,
        cq: &VerbsCqHandle,
        caps: QpCaps,
    ) -> Result<VerbsQp, (ProviderError, CmId)> {
        let cq = cq.0.clone();
        if !Arc::ptr_eq(cq.device(), device) {
            return Err((
                ProviderError::Other("completion queue belongs to another verbs provider".into()),
                cm_id,
            ));
        }
        let limits = device.limits();
        if caps.max_send_wr == 0 || caps.max_recv_wr == 0 || caps.max_sge == 0 {
            return Err((
                ProviderError::Other(format!("queue pair caps must be non-zero: {caps:?}")),
                cm_id,
            ));
        }
        if caps.max_send_wr > limits.max_qp_wr
            || caps.max_recv_wr > limits.max_qp_wr
            || caps.max_sge > limits.max_sge
        {
            return Err((
                ProviderError::Other(format!(
                    "queue pair caps {caps:?} exceed device {} limits (max_qp_wr {}, max_sge {})",
                    device.name(),
                    limits.max_qp_wr,
                    limits.max_sge
                )),
                cm_id,
            ));
        }
        let grants = match device.grant_mechanism() {
            GrantMechanism::MemoryWindow => match WindowPool::new(
                device.pd(),
                device.config().mws_per_qp,
                limits.quirks.window_bounds_from_region,
            ) {
                Ok(p) => Grants::Windows(p),
                Err(e) => return Err((e, cm_id)),
            },
            GrantMechanism::Registration => {
                Grants::Registrations(RegistrationGrants::new(device.pd()))
            }
        };
        let window_rkeys = match &grants {
            Grants::Windows(p) => p.rkeys(),
            Grants::Registrations(_) => Vec::new(),
        };
        let shadow = Arc::new(QpShadow::new(
            caps.max_send_wr,
            caps.max_recv_wr,
            &window_rkeys,
        ));
        let wqes = caps.max_send_wr + caps.max_recv_wr;
        let (slot, generation) = match cq.register(shadow.clone(), wqes) {
            Ok(s) => s,
            Err(e) => return Err((e, cm_id)),
        };
        // SAFETY: all-zero is a valid ibv_qp_init_attr (null pointers).
        let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = cq.cq();
        attr.recv_cq = cq.cq();
        attr.cap.max_send_wr = caps.max_send_wr;
        attr.cap.max_recv_wr = caps.max_recv_wr;
        attr.cap.max_send_sge = caps.max_sge;
        attr.cap.max_recv_sge = 1;
        attr.cap.max_inline_data = INLINE_WANT;
        attr.qp_type = ibv_qp_type::IBV_QPT_RC;
        attr.sq_sig_all = 0;
        let id = cm_id.raw();
        let asked = attr;
        // SAFETY: `id` is a live cm id on this device (checked by the
        // callers), the PD and CQ are live; the QP is destroyed in Drop.
        let mut rc = unsafe { rdma_create_qp(id, device.pd(), &mut attr) };
        if rc != 0 {
            // A device with less inline room than INLINE_WANT: without.
            attr = asked;
            attr.cap.max_inline_data = 0;
            // SAFETY: as above (the first call created nothing).
            rc = unsafe { rdma_create_qp(id, device.pd(), &mut attr) };
        }
        if rc != 0 {
            let e = io::Error::last_os_error();
            cq.unregister(slot, wqes);
            return Err((
                ProviderError::Other(format!(
                    "rdma_create_qp on {} with {caps:?}: {e}",
                    device.name()
                )),
                cm_id,
            ));
        }
        // SAFETY: rdma_create_qp succeeded, so id->qp is the new QP.
        let qp = unsafe { (*id).qp };
        // SAFETY: `qp` is live.
        let qp_num = unsafe { (*qp).qp_num };
        cm_id.state().set_qp(qp);
        let max_sge = caps.max_sge as usize;
        // What the device granted (rdma_create_qp writes the caps back).
        let max_inline = attr.cap.max_inline_data;
        let mut mrs = Vec::with_capacity(16);
        let mut mrs_seen = u64::MAX;
        let mr_removals_seen = device.mr_removals();
        device.sync_mrs(&mut mrs, &mut mrs_seen);
        Ok(VerbsQp {
            qp,
            qp_num,
            shadow,
            slot,
            generation,
            wqes,
            sq_head: 0,
            rq_head: 0,
            max_sge,
            max_inline,
            send_wrs: (0..POST_BATCH).map(|_| zeroed_send_wr()).collect(),
            send_sges: vec![
                ibv_sge {
                    addr: 0,
                    length: 0,
                    lkey: 0
                };
                POST_BATCH * max_sge
            ]
            .into_boxed_slice(),
            recv_wrs: (0..POST_BATCH).map(|_| zeroed_recv_wr()).collect(),
            recv_sges: vec![
                ibv_sge {
                    addr: 0,
                    length: 0,
                    lkey: 0
                };
                POST_BATCH
            ]
            .into_boxed_slice(),
            ird_ord: (0, 0),
            grants,
            mrs,
            mrs_seen,
            mr_removals_seen,
            cm_id,
            cq,
            device: device.clone(),
        })
    }

    /// Sends of at most this many bytes are posted inline (0: none); what
    /// the device granted when asked for [`INLINE_WANT`].
    pub fn max_inline(&self) -> u32 {
        self.max_inline
    }

    /// Registrations made to back memory windows with exactly their granted
    /// range (devices whose windows are checked against their region only, i.e.
    /// rxe: `Quirks::window_bounds_from_region`):
    /// one per distinct range granted while the queue pair lives, not one
    /// per grant. 0 elsewhere.
    pub fn backing_registrations(&self) -> u64 {
        match &self.grants {
            Grants::Windows(p) => p.backing_registrations(),
            Grants::Registrations(_) => 0,
        }
    }

    pub(super) fn set_ird_ord(&mut self, ird: u32, ord: u32) {
        self.ird_ord = (ird, ord);
    }

    pub(super) fn cm_id(&self) -> &CmId {
        &self.cm_id
    }

    fn tag(&self, recv: bool, seq: u32) -> u64 {
        WrTag {
            slot: self.slot,
            generation: self.generation,
            recv,
            seq,
        }
        .encode()
    }

    fn check_connected(&self) -> Result<(), ProviderError> {
        match self.state() {
            QpState::Connected => Ok(()),
            _ => Err(ProviderError::NotConnected),
        }
    }

    /// The registration containing `sge` (refreshing the local copy of the
    /// table once on a miss, and whenever a registration was given back so
    /// that a deregistered MR is never bound).
    fn find_mr(&mut self, sge: &Sge) -> Option<MrEntry> {
        let removals = self.device.mr_removals();
        if removals != self.mr_removals_seen {
            self.mr_removals_seen = removals;
            self.device.sync_mrs(&mut self.mrs, &mut self.mrs_seen);
            if let Grants::Windows(pool) = &mut self.grants {
                pool.drop_idle_backings();
            }
        }
        if let Some(m) = self
            .mrs
            .iter()
            .find(|m| m.covers(sge.addr, sge.len, sge.lkey))
        {
            return Some(*m);
        }
        self.device.sync_mrs(&mut self.mrs, &mut self.mrs_seen);
        self.mrs
            .iter()
            .find(|m| m.covers(sge.addr, sge.len, sge.lkey))
            .copied()
    }

    /// Posts one chain of at most [`POST_BATCH`] send-queue requests.
    fn post_send_chain(&mut self, wrs: &[SendWr<'_>]) -> Result<(), ProviderError> {
        let base = self.send_wrs.as_mut_ptr();
        let sge_base = self.send_sges.as_mut_ptr();
        let start = self.sq_head;
        for (i, wr) in wrs.iter().enumerate() {
            let seq = start.wrapping_add(i as u32);
            let (sges, opcode, wc_opcode, send) = match wr.op {
                SendOp::Send {
                    sges,
                    invalidate: None,
                } => (sges, ibv_wr_opcode::IBV_WR_SEND, WcOpcode::Send, true),
                SendOp::Send {
                    sges,
                    invalidate: Some(_),
                } => (
                    sges,
                    ibv_wr_opcode::IBV_WR_SEND_WITH_INV,
                    WcOpcode::Send,
                    true,
                ),
                SendOp::RdmaWrite { sges, .. } => (
                    sges,
                    ibv_wr_opcode::IBV_WR_RDMA_WRITE,
                    WcOpcode::RdmaWrite,
                    false,
                ),
                SendOp::RdmaRead { sges, .. } => (
                    sges,
                    ibv_wr_opcode::IBV_WR_RDMA_READ,
                    WcOpcode::RdmaRead,
                    false,
                ),
            };
            let mut len = 0u32;
            for (j, s) in sges.iter().enumerate() {
                // SAFETY: j < max_sge (checked by post_send) and i <
                // POST_BATCH, so the slot is inside send_sges.
                unsafe {
                    *sge_base.add(i * self.max_sge + j) = ibv_sge {
                        addr: s.addr,
                        length: s.len,
                        lkey: s.lkey,
                    }
                };
                len = len.wrapping_add(s.len);
            }
            self.shadow.sq.record(seq, wr.wr_id, wc_opcode, len);
            let mut flags = if wr.signaled {
                ibv_send_flags::IBV_SEND_SIGNALED
            } else {
                ibv_send_flags(0)
            };
            if send && len <= self.max_inline {
                // Copied into the request by the post itself; the buffer
                // still stays ours until the completion, as for any Send.
                flags |= ibv_send_flags::IBV_SEND_INLINE;
            }
            // SAFETY: i < wrs.len() <= POST_BATCH = send_wrs.len().
            let w = unsafe { &mut *base.add(i) };
            w.wr_id = self.tag(false, seq);
            w.next = if i + 1 < wrs.len() {
                // SAFETY: i + 1 < POST_BATCH.
                unsafe { base.add(i + 1) }
            } else {
                ptr::null_mut()
            };
            // SAFETY: inside send_sges, as above.
            w.sg_list = unsafe { sge_base.add(i * self.max_sge) };
            w.num_sge = sges.len() as i32;
            w.opcode = opcode;
            // Scratch entries are reused: every field a provider may check
            // is set (rxe refuses a bind whose immediate field is not zero).
            w.imm_data_invalidated_rkey_union.invalidated_rkey = 0;
            match wr.op {
                SendOp::Send {
                    invalidate: Some(rkey),
                    ..
                } => {
                    w.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
                    // Never let the invalidation overtake an earlier RDMA
                    // Read of the buffer it invalidates.
                    flags |= ibv_send_flags::IBV_SEND_FENCE;
                }
                SendOp::RdmaWrite { remote, .. } | SendOp::RdmaRead { remote, .. } => {
                    w.wr.rdma = rdma_t {
                        remote_addr: remote.addr,
                        rkey: remote.rkey,
                    };
                }
                SendOp::Send {
                    invalidate: None, ..
                } => {}
            }
            w.send_flags = flags.0;
        }
        self.ring_send(base, wrs.len(), "ibv_post_send")
    }

    /// Rings the send doorbell for the chain at `base` of `n` requests
    /// recorded from `sq_head`, and advances `sq_head` past what was posted.
    fn ring_send(
        &mut self,
        base: *mut ibv_send_wr,
        n: usize,
        what: &str,
    ) -> Result<(), ProviderError> {
        work_queue::publish();
        let mut bad: *mut ibv_send_wr = ptr::null_mut();
        // SAFETY: the QP is live; the chain is `n` linked entries of
        // send_wrs whose SGE lists point into send_sges; all stay valid for
        // the call (the device copies the requests).
        let rc = unsafe { ibv_post_send(self.qp, base, &mut bad) };
        let posted = if rc == 0 {
            n
        } else if bad.is_null() {
            0
        } else {
            // SAFETY: `bad` points into the chain starting at `base`.
            unsafe { bad.offset_from(base) }.clamp(0, n as isize) as usize
        };
        self.sq_head = self.sq_head.wrapping_add(posted as u32);
        if rc == 0 {
            Ok(())
        } else {
            Err(post_error(what, rc))
        }
    }

    fn post_recv_chain(&mut self, wrs: &[RecvWr]) -> Result<(), ProviderError> {
        let base = self.recv_wrs.as_mut_ptr();
        let sge_base = self.recv_sges.as_mut_ptr();
        let start = self.rq_head;
        for (i, wr) in wrs.iter().enumerate() {
            let seq = start.wrapping_add(i as u32);
            self.shadow
                .rq
                .record(seq, wr.wr_id, WcOpcode::Recv, wr.sge.len);
            // SAFETY: i < POST_BATCH = recv_sges.len() = recv_wrs.len().
            unsafe {
                *sge_base.add(i) = ibv_sge {
                    addr: wr.sge.addr,
                    length: wr.sge.len,
                    lkey: wr.sge.lkey,
                }
            };
            // SAFETY: as above.
            let w = unsafe { &mut *base.add(i) };
            w.wr_id = self.tag(true, seq);
            w.next = if i + 1 < wrs.len() {
                // SAFETY: i + 1 < POST_BATCH.
                unsafe { base.add(i + 1) }
            } else {
                ptr::null_mut()
            };
            // SAFETY: as above.
            w.sg_list = unsafe { sge_base.add(i) };
            w.num_sge = 1;
        }
        work_queue::publish();
        let mut bad: *mut ibv_recv_wr = ptr::null_mut();
        // SAFETY: the QP is live; the chain and its SGEs are in our scratch
        // arrays, valid for the call.
        let rc = unsafe { ibv_post_recv(self.qp, base, &mut bad) };
        let posted = if rc == 0 {
            wrs.len()
        } else if bad.is_null() {
            0
        } else {
            // SAFETY: `bad` points into the chain starting at `base`.
            unsafe { bad.offset_from(base) }.clamp(0, wrs.len() as isize) as usize
        };
        self.rq_head = self.rq_head.wrapping_add(posted as u32);
        if rc == 0 {
            Ok(())
        } else {
            Err(post_error("ibv_post_recv", rc))
        }
    }

    fn grant_window(
        &mut self,
        wr_id: u64,
        sge: Sge,
        access: Access,
        mr: MrEntry,
        signaled: bool,
    ) -> Result<Grant, ProviderError> {
        let Grants::Windows(pool) = &mut self.grants else {
            unreachable!("grant_window on a registration QP")
        };
        let (index, mw, rkey) = pool.take()?;
        let bind_mr = match pool.backing(index, mr.mr, sge.addr, sge.len) {
            Ok(m) => m,
            Err(e) => {
                pool.untake(index);
                return Err(e);
            }
        };
        let seq = self.sq_head;
        self.shadow.sq.record(seq, wr_id, WcOpcode::Bind, sge.len);
        let tag = self.tag(false, seq);
        let base = self.send_wrs.as_mut_ptr();
        // SAFETY: the scratch array is non-empty.
        let w = unsafe { &mut *base };
        w.wr_id = tag;
        w.next = ptr::null_mut();
        w.sg_list = ptr::null_mut();
        w.num_sge = 0;
        w.opcode = ibv_wr_opcode::IBV_WR_BIND_MW;
        w.imm_data_invalidated_rkey_union.invalidated_rkey = 0;
        w.send_flags = if signaled {
            ibv_send_flags::IBV_SEND_SIGNALED.0
        } else {
            0
        };
        w.bind_mw_tso_union.bind_mw = bind_mw_t {
            mw,
            rkey,
            bind_info: ibv_mw_bind_info {
                mr: bind_mr,
                addr: sge.addr,
                length: sge.len as u64,
                mw_access_flags: window_access(access).0,
            },
        };
        let r = self.ring_send(base, 1, "ibv_post_send(BIND_MW)");
        let Grants::Windows(pool) = &mut self.grants else {
            unreachable!()
        };
        match r {
            Ok(()) => {
                // SAFETY: `mw` is a live window of the pool. Providers take
                // the window's current rkey from it on the next bind, so it
                // must follow the binds (type-2 binds through post_send do
                // not update it themselves).
                unsafe { (*mw).rkey = rkey };
                pool.bound(index, rkey);
                Ok(Grant {
                    addr: sge.addr,
                    rkey,
                    len: sge.len,
                })
            }
            Err(e) => {
                pool.untake(index);
                Err(e)
            }
        }
    }

    fn synthetic(&self, wr_id: u64, opcode: WcOpcode, byte_len: u32) -> Result<(), ProviderError> {
        self.cq.push_synthetic(Completion {
            wr_id,
            qp: QpId(self.qp_num),
            status: WcStatus::Success,
            opcode,
            byte_len,
            invalidated_rkey: None,
        })
    }
}

impl QueuePair for VerbsQp {
    fn id(&self) -> QpId {
        QpId(self.qp_num)
    }

    fn state(&self) -> QpState {
        match self.cm_id.state().qp_state() {
            QpState::Connected
                if self
                    .shadow
                    .failed
                    .load(std::sync::atomic::Ordering::Relaxed) =>
            {
                QpState::Error
            }
            s => s,
        }
    }

    fn ird_ord(&self) -> (u32, u32) {
        self.ird_ord
    }

    fn post_recv(&mut self, wrs: &[RecvWr]) -> Result<(), ProviderError> {
        self.check_connected()?;
        if (self.shadow.rq.room(self.rq_head) as usize) < wrs.len() {
            return Err(ProviderError::QueueFull);
        }
        for chunk in wrs.chunks(POST_BATCH) {
            self.post_recv_chain(chunk)?;
        }
        Ok(())
    }

    fn reply_header_in_receive_buffer(&self) -> bool {
        // The receive buffer was written by the device (DMA; rxe's kernel
        // copy), not by another core of ours.
        true
    }

    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<(), ProviderError> {
        self.check_connected()?;
        if (self.shadow.sq.room(self.sq_head) as usize) < wrs.len() {
            return Err(ProviderError::QueueFull);
        }
        for wr in wrs {
            let n = match wr.op {
                SendOp::Send { sges, .. }
                | SendOp::RdmaWrite { sges, .. }
                | SendOp::RdmaRead { sges, .. } => sges.len(),
            };
            if n > self.max_sge {
                return Err(ProviderError::Other(format!(
                    "work request {} has {n} SGEs; the queue pair was created with max_sge {}",
                    wr.wr_id, self.max_sge
                )));
            }
        }
        for chunk in wrs.chunks(POST_BATCH) {
            self.post_send_chain(chunk)?;
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
        self.check_connected()?;
        if sge.len == 0 {
            return Err(ProviderError::GrantFailed("zero-length grant".into()));
        }
        let Some(mr) = self.find_mr(&sge) else {
            return Err(ProviderError::GrantFailed(format!(
                "{} bytes at {:#x} (lkey {:#x}) are not inside a registered region",
                sge.len, sge.addr, sge.lkey
            )));
        };
        if let Grants::Registrations(r) = &mut self.grants {
            let rkey = r.grant(sge.addr, sge.len, access)?;
            if signaled {
                if let Err(e) = self.synthetic(wr_id, WcOpcode::Bind, sge.len) {
                    if let Grants::Registrations(r) = &mut self.grants {
                        let _ = r.revoke(rkey);
                    }
                    return Err(e);
                }
            }
            return Ok(Grant {
                addr: sge.addr,
                rkey,
                len: sge.len,
            });
        }
        if self.shadow.sq.room(self.sq_head) == 0 {
            return Err(ProviderError::QueueFull);
        }
        self.grant_window(wr_id, sge, access, mr, signaled)
    }

    fn revoke(&mut self, wr_id: u64, rkey: u32, signaled: bool) -> Result<(), ProviderError> {
        let connected = self.state() == QpState::Connected;
        let qp_num = self.qp_num;
        let not_granted = || {
            ProviderError::GrantFailed(format!(
                "rkey {rkey:#x} is not granted on queue pair {qp_num}"
            ))
        };
        let index = match &mut self.grants {
            Grants::Registrations(r) => {
                if !r.revoke(rkey)? {
                    return Err(not_granted());
                }
                if signaled && connected {
                    self.synthetic(wr_id, WcOpcode::Revoke, 0)?;
                }
                return Ok(());
            }
            Grants::Windows(pool) => {
                let Some(index) = pool.find_bound(rkey) else {
                    return Err(not_granted());
                };
                let remotely = self.shadow.take_remote_invalidation(index, rkey);
                if remotely || !connected {
                    // The peer's Send with Invalidate already revoked it (a
                    // second invalidation is pointless, and crashes rdma_rxe
                    // on Linux 6.1), or the queue pair is in error and the
                    // window useless to the peer: nothing to post.
                    pool.revoked(index);
                    if remotely && signaled && connected {
                        self.synthetic(wr_id, WcOpcode::Revoke, 0)?;
                    }
                    return Ok(());
                }
                index
            }
        };
        if self.shadow.sq.room(self.sq_head) == 0 {
            return Err(ProviderError::QueueFull);
        }
        let seq = self.sq_head;
        self.shadow.sq.record(seq, wr_id, WcOpcode::Revoke, 0);
        let tag = self.tag(false, seq);
        let base = self.send_wrs.as_mut_ptr();
        // SAFETY: the scratch array is non-empty.
        let w = unsafe { &mut *base };
        w.wr_id = tag;
        w.next = ptr::null_mut();
        w.sg_list = ptr::null_mut();
        w.num_sge = 0;
        w.opcode = ibv_wr_opcode::IBV_WR_LOCAL_INV;
        w.send_flags = if signaled {
            ibv_send_flags::IBV_SEND_SIGNALED.0
        } else {
            0
        };
        w.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
        self.ring_send(base, 1, "ibv_post_send(LOCAL_INV)")?;
        if let Grants::Windows(pool) = &mut self.grants {
            pool.revoked(index);
        }
        Ok(())
    }

    fn disconnect(&mut self) {
        self.cm_id.state().disconnect_local();
    }

    fn drain_send_queue(&mut self, wr_id: u64) -> Result<(), ProviderError> {
        // Out of service: rdma_disconnect (or the failed request) moved the
        // queue pair to the error state, where a posted request is flushed,
        // not sent; behind the requests before it, as the queue completes
        // in order.
        if self.state() == QpState::Connected {
            return Err(ProviderError::Other(
                "drain marker refused: the queue pair is still connected".into(),
            ));
        }
        if self.shadow.sq.room(self.sq_head) < 1 {
            return Err(ProviderError::QueueFull);
        }
        self.post_send_chain(&[SendWr {
            wr_id,
            op: SendOp::Send {
                sges: &[],
                invalidate: None,
            },
            signaled: true,
        }])
    }
}

impl Drop for VerbsQp {
    fn drop(&mut self) {
        // Windows first: a bound type-2 window holds a reference to its
        // queue pair (rdma_rxe then makes ibv_destroy_qp wait ~50 s for it).
        let none = Grants::Registrations(RegistrationGrants::new(self.device.pd()));
        drop(std::mem::replace(&mut self.grants, none));
        // Tells the peer (if still connected) and destroys the QP under the
        // connection's lock, so the CM thread never touches it afterwards.
        self.cm_id.state().destroy_qp(self.cm_id.raw());
        self.cq.unregister(self.slot, self.wqes);
        // Then the fields: the cm id is destroyed (after its pending events
        // are acknowledged), and the CQ and device references are released.
    }
}
