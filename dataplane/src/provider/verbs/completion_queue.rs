//! Completion queues: `ibv_poll_cq` into a fixed array, translated through
//! the queue pairs' shadow rings.
//!
//! Each CQ is created with its own completion channel (non-blocking
//! descriptor) so an idle worker can sleep until the next completion
//! ([`CompletionQueue::arm`]: `ibv_req_notify_cq`; [`CompletionQueue::disarm`]:
//! `ibv_get_cq_event` until EAGAIN, each event acknowledged at once with
//! `ibv_ack_cq_events`, so destroying the CQ never waits for an
//! acknowledgement).

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rdma_sys::*;

use super::device::Device;
use super::work_queue::{self, QpShadow, WrTag, GENERATION_MASK};
use crate::provider::{Completion, CompletionQueue, ProviderError, QpId, WcOpcode, WcStatus};

/// Completions read from the device per `ibv_poll_cq` call.
const POLL_BATCH: usize = 32;
/// Room for completions the provider makes itself (per-I/O registration
/// grants and revokes, which post no work request).
const SYNTHETIC_CAPACITY: usize = 1024;

/// Maps a verbs completion status to the provider's.
pub fn map_status(status: ibv_wc_status::Type) -> WcStatus {
    match status {
        ibv_wc_status::IBV_WC_SUCCESS => WcStatus::Success,
        ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR => WcStatus::RnrRetryExceeded,
        ibv_wc_status::IBV_WC_LOC_LEN_ERR => WcStatus::LocalLengthError,
        ibv_wc_status::IBV_WC_LOC_PROT_ERR => WcStatus::LocalProtectionError,
        ibv_wc_status::IBV_WC_REM_ACCESS_ERR => WcStatus::RemoteAccessError,
        // The responder's view of a peer's access it refused (reported on a
        // receive consumed by an RDMA Write with Immediate).
        ibv_wc_status::IBV_WC_LOC_ACCESS_ERR => WcStatus::RemoteAccessViolation,
        ibv_wc_status::IBV_WC_WR_FLUSH_ERR => WcStatus::Flushed,
        other => WcStatus::Other(other),
    }
}

#[derive(Debug, Clone)]
struct SlotEntry {
    generation: u16,
    shadow: Arc<QpShadow>,
}

/// Which queue pairs use the completion queue (slots named in [`WrTag`]s).
#[derive(Debug)]
struct Registry {
    slots: Vec<Option<SlotEntry>>,
    generations: Vec<u16>,
    free: Vec<u16>,
    /// Work queue entries of the registered queue pairs (must fit the CQ).
    committed: u64,
}

/// The part of a completion queue queue pairs share (from any thread).
pub(super) struct CqShared {
    cq: *mut ibv_cq,
    /// The CQ's completion channel (destroyed after the CQ).
    channel: *mut ibv_comp_channel,
    capacity: u32,
    registry: Mutex<Registry>,
    synthetic: Mutex<VecDeque<Completion>>,
    synthetic_pending: AtomicUsize,
    device: Arc<Device>,
}

// SAFETY: the CQ pointer is used for ibv_create_qp (thread-safe) from any
// thread and polled only by the one VerbsCq (&mut self); other state is behind
// mutexes and atomics.
unsafe impl Send for CqShared {}
// SAFETY: as above.
unsafe impl Sync for CqShared {}

impl std::fmt::Debug for CqShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CqShared")
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl CqShared {
    pub(super) fn cq(&self) -> *mut ibv_cq {
        self.cq
    }
    pub(super) fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// Registers a queue pair's shadow rings; `wqes` is its send + receive
    /// depth, which must fit the completion queue with the others'.
    pub(super) fn register(
        &self,
        shadow: Arc<QpShadow>,
        wqes: u32,
    ) -> Result<(u16, u16), ProviderError> {
        let mut r = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        if r.committed + wqes as u64 > self.capacity as u64 {
            return Err(ProviderError::Other(format!(
                "completion queue of {} entries cannot take a queue pair of {wqes} more work requests \
                 ({} already committed): create a larger completion queue",
                self.capacity, r.committed
            )));
        }
        let Some(slot) = r.free.pop() else {
            return Err(ProviderError::Other(format!(
                "completion queue serves its maximum of {} queue pairs (VerbsConfig::max_qps_per_cq)",
                r.slots.len()
            )));
        };
        let generation = (r.generations[slot as usize].wrapping_add(1)) & GENERATION_MASK;
        r.generations[slot as usize] = generation;
        r.slots[slot as usize] = Some(SlotEntry { generation, shadow });
        r.committed += wqes as u64;
        Ok((slot, generation))
    }

    /// Releases a slot (queue pair destroyed).
    pub(super) fn unregister(&self, slot: u16, wqes: u32) {
        let mut r = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        r.slots[slot as usize] = None;
        r.free.push(slot);
        r.committed = r.committed.saturating_sub(wqes as u64);
    }

    /// Queues a completion made by the provider itself. Fails when the poller
    /// has let [`SYNTHETIC_CAPACITY`] of them pile up.
    pub(super) fn push_synthetic(&self, c: Completion) -> Result<(), ProviderError> {
        let mut q = self.synthetic.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= SYNTHETIC_CAPACITY {
            return Err(ProviderError::QueueFull);
        }
        q.push_back(c);
        self.synthetic_pending.fetch_add(1, Ordering::Release);
        Ok(())
    }
}

impl Drop for CqShared {
    fn drop(&mut self) {
        // SAFETY: every queue pair using the CQ holds an Arc of this, so none
        // is left; the CQ is destroyed once, then its channel (every event
        // read was acknowledged at once).
        unsafe {
            ibv_destroy_cq(self.cq);
            ibv_destroy_comp_channel(self.channel);
        }
    }
}

/// Handle other threads use to create queue pairs on a [`VerbsCq`].
#[derive(Debug, Clone)]
pub struct VerbsCqHandle(pub(super) Arc<CqShared>);

/// A completion queue, busy-polled by its owning worker.
pub struct VerbsCq {
    shared: Arc<CqShared>,
    wcs: Box<[ibv_wc]>,
    /// The poller's copy of the registry's slots (refreshed on a miss).
    local: Vec<Option<SlotEntry>>,
    /// `wc_flags` bits meaning "invalidated" on this device.
    with_inv: u32,
    /// rxe: a receive's `LOC_QP_OP_ERR` is a length error.
    length_error_as_qp_op_error: bool,
    /// A wake-up was requested and its event not read yet.
    armed: bool,
}

impl std::fmt::Debug for VerbsCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsCq")
            .field("shared", &self.shared)
            .finish_non_exhaustive()
    }
}

impl VerbsCq {
    pub(super) fn new(device: &Arc<Device>, entries: u32) -> Result<Self, ProviderError> {
        let max = device.limits().max_cqe;
        if entries == 0 || entries > max {
            return Err(ProviderError::Other(format!(
                "completion queue of {entries} entries: device {} allows 1..={max}",
                device.name()
            )));
        }
        // SAFETY: the context is open; the channel is destroyed by
        // CqShared::drop (or below on failure).
        let channel = unsafe { ibv_create_comp_channel(device.ctx()) };
        if channel.is_null() {
            return Err(ProviderError::Other(format!(
                "ibv_create_comp_channel({}): {}",
                device.name(),
                io::Error::last_os_error()
            )));
        }
        // SAFETY: the channel is live; its descriptor is ours to configure
        // (non-blocking: `disarm` reads events until EAGAIN).
        let nonblocking = unsafe {
            let fd = (*channel).fd;
            let fl = libc::fcntl(fd, libc::F_GETFL);
            fl >= 0 && libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) == 0
        };
        // SAFETY: the context and channel are open; the CQ is destroyed by
        // CqShared::drop.
        let cq = if nonblocking {
            unsafe {
                ibv_create_cq(
                    device.ctx(),
                    entries as i32,
                    std::ptr::null_mut(),
                    channel,
                    0,
                )
            }
        } else {
            std::ptr::null_mut()
        };
        if cq.is_null() {
            let e = io::Error::last_os_error();
            // SAFETY: no CQ uses the channel.
            unsafe { ibv_destroy_comp_channel(channel) };
            return Err(ProviderError::Other(format!(
                "ibv_create_cq({}, {entries}): {e}",
                device.name(),
            )));
        }
        // SAFETY: `cq` is live; the provider may round the size up.
        let capacity = unsafe { (*cq).cqe }.max(entries as i32) as u32;
        let n = device.config().max_qps_per_cq.max(1) as usize;
        let registry = Registry {
            slots: vec![None; n],
            generations: vec![0; n],
            free: (0..n as u16).rev().collect(),
            committed: 0,
        };
        let shared = Arc::new(CqShared {
            cq,
            channel,
            capacity,
            registry: Mutex::new(registry),
            synthetic: Mutex::new(VecDeque::with_capacity(SYNTHETIC_CAPACITY)),
            synthetic_pending: AtomicUsize::new(0),
            device: device.clone(),
        });
        Ok(VerbsCq {
            shared,
            // SAFETY: all-zero is a valid ibv_wc (integers and a union of
            // integers).
            wcs: (0..POLL_BATCH)
                .map(|_| unsafe { std::mem::zeroed() })
                .collect(),
            local: vec![None; n],
            with_inv: device.limits().quirks.with_inv_flags(),
            length_error_as_qp_op_error: device.limits().quirks.length_error_as_qp_op_error,
            armed: false,
        })
    }

    fn shadow(&mut self, slot: u16, generation: u16) -> Option<&QpShadow> {
        let i = slot as usize;
        let fresh = matches!(self.local.get(i), Some(Some(e)) if e.generation == generation);
        if !fresh {
            if i >= self.local.len() {
                return None;
            }
            // A queue pair created since the last refresh. clone_from reuses
            // the vector's capacity: no allocation, just Arc increments.
            let r = self
                .shared
                .registry
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            self.local.clone_from(&r.slots);
        }
        match &self.local[i] {
            Some(e) if e.generation == generation => Some(&e.shadow),
            // A completion of a queue pair destroyed since: nobody to tell.
            _ => None,
        }
    }

    fn drain_synthetic(&mut self, out: &mut [Completion]) -> usize {
        if out.is_empty() || self.shared.synthetic_pending.load(Ordering::Acquire) == 0 {
            return 0;
        }
        let mut q = self
            .shared
            .synthetic
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut n = 0;
        while n < out.len() {
            let Some(c) = q.pop_front() else { break };
            out[n] = c;
            n += 1;
        }
        self.shared
            .synthetic_pending
            .fetch_sub(n, Ordering::Release);
        n
    }
}

impl CompletionQueue for VerbsCq {
    type Handle = VerbsCqHandle;

    /// `ibv_req_notify_cq` (any completion) unless a request is still
    /// pending; the channel's descriptor. None if the request fails (the
    /// worker naps).
    fn arm(&mut self) -> Option<std::os::fd::RawFd> {
        if !self.armed {
            // SAFETY: the CQ is live (we hold its Arc).
            if unsafe { ibv_req_notify_cq(self.shared.cq, 0) } != 0 {
                return None;
            }
            self.armed = true;
        }
        // SAFETY: the channel lives as long as the CQ.
        Some(unsafe { (*self.shared.channel).fd })
    }

    /// Reads every pending event (non-blocking) and acknowledges each.
    fn disarm(&mut self) {
        loop {
            let mut cq: *mut ibv_cq = std::ptr::null_mut();
            let mut ctx: *mut std::ffi::c_void = std::ptr::null_mut();
            // SAFETY: the channel is live and non-blocking; the out-pointers
            // are valid.
            if unsafe { ibv_get_cq_event(self.shared.channel, &mut cq, &mut ctx) } != 0 {
                break;
            }
            // SAFETY: `cq` is the CQ the event was read for (ours).
            unsafe { ibv_ack_cq_events(cq, 1) };
            // The request was consumed by this event.
            self.armed = false;
        }
    }

    fn handle(&self) -> VerbsCqHandle {
        VerbsCqHandle(self.shared.clone())
    }

    fn poll(&mut self, out: &mut [Completion]) -> usize {
        let mut n = self.drain_synthetic(out);
        let (with_inv, qp_op_is_length) = (self.with_inv, self.length_error_as_qp_op_error);
        while n < out.len() {
            let want = (out.len() - n).min(POLL_BATCH);
            // SAFETY: the CQ is live (we hold its Arc) and `wcs` has room for
            // `want` entries.
            let got = unsafe { ibv_poll_cq(self.shared.cq, want as i32, self.wcs.as_mut_ptr()) };
            if got <= 0 {
                break;
            }
            work_queue::acquire();
            for i in 0..got as usize {
                let wc = &self.wcs[i];
                let (wr_id, status, qp_num, wc_byte_len, wc_flags) =
                    (wc.wr_id, wc.status, wc.qp_num, wc.byte_len, wc.wc_flags);
                // SAFETY: reading a u32 member of a union of u32s.
                let inv_rkey = unsafe { wc.imm_data_invalidated_rkey_union.invalidated_rkey };
                let tag = WrTag::decode(wr_id);
                let Some(shadow) = self.shadow(tag.slot, tag.generation) else {
                    continue;
                };
                let ring = if tag.recv { &shadow.rq } else { &shadow.sq };
                let (user_wr_id, opcode, len) = ring.complete(tag.seq);
                let status = match map_status(status) {
                    WcStatus::Other(ibv_wc_status::IBV_WC_LOC_QP_OP_ERR)
                        if tag.recv && qp_op_is_length =>
                    {
                        WcStatus::LocalLengthError
                    }
                    s => s,
                };
                if status != WcStatus::Success {
                    shadow.failed.store(true, Ordering::Relaxed);
                }
                let ok = status == WcStatus::Success;
                let byte_len = match (ok, opcode) {
                    (false, _) => 0,
                    (true, WcOpcode::Recv) => wc_byte_len,
                    (true, _) => len,
                };
                let invalidated_rkey =
                    (ok && tag.recv && (wc_flags & with_inv) != 0).then_some(inv_rkey);
                if let Some(rkey) = invalidated_rkey {
                    shadow.note_remote_invalidation(rkey);
                }
                out[n] = Completion {
                    wr_id: user_wr_id,
                    qp: QpId(qp_num),
                    status,
                    opcode,
                    byte_len,
                    invalidated_rkey,
                };
                n += 1;
            }
            if (got as usize) < want {
                break;
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_statuses_map_to_provider_statuses() {
        use ibv_wc_status::*;
        assert_eq!(map_status(IBV_WC_SUCCESS), WcStatus::Success);
        assert_eq!(
            map_status(IBV_WC_RNR_RETRY_EXC_ERR),
            WcStatus::RnrRetryExceeded
        );
        assert_eq!(map_status(IBV_WC_LOC_LEN_ERR), WcStatus::LocalLengthError);
        assert_eq!(
            map_status(IBV_WC_LOC_PROT_ERR),
            WcStatus::LocalProtectionError
        );
        assert_eq!(
            map_status(IBV_WC_REM_ACCESS_ERR),
            WcStatus::RemoteAccessError
        );
        assert_eq!(
            map_status(IBV_WC_LOC_ACCESS_ERR),
            WcStatus::RemoteAccessViolation
        );
        assert_eq!(map_status(IBV_WC_WR_FLUSH_ERR), WcStatus::Flushed);
        assert_eq!(
            map_status(IBV_WC_RETRY_EXC_ERR),
            WcStatus::Other(IBV_WC_RETRY_EXC_ERR)
        );
        assert_eq!(
            map_status(IBV_WC_MW_BIND_ERR),
            WcStatus::Other(IBV_WC_MW_BIND_ERR)
        );
    }
}
