//! Completion queues. A soft CQ owns no ring of its own: it polls, for each
//! queue pair attached to it, the QP's inbound completion ring (receives the
//! peer's posting thread completed) and its local completion ring (our own
//! sends, RDMA, binds, revokes), and once the connection broke it flushes
//! the QP's remaining posted receives itself.
//!
//! Queue pairs are created by the control plane against a
//! [`SoftCqHandle`]; they reach the worker's CQ through a lock-free attach
//! list (a Treiber stack the CQ empties with one swap on its next poll).
//! A poll with nothing attached or pending is a handful of loads.

use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::Arc;

use super::conn::{gate_close, gate_idle, BreakReason, Endpoint};
use crate::provider::{Completion, CompletionQueue, ProviderError, WcOpcode, WcStatus};

struct AttachNode {
    ep: Arc<Endpoint>,
    next: *mut AttachNode,
}

/// The part of a CQ other threads see.
#[derive(Debug)]
pub(crate) struct CqShared {
    attach: AtomicPtr<AttachNode>,
    /// Completions that attached QPs can have outstanding at once
    /// (`max_send_wr + max_recv_wr` each).
    committed: AtomicU64,
    entries: u64,
}

// SAFETY: the raw node pointers are owned by the stack and transferred with
// the swap in `take`; nodes hold `Arc<Endpoint>`, which is Send + Sync.
unsafe impl Send for CqShared {}
// SAFETY: as above; all shared access is through atomics.
unsafe impl Sync for CqShared {}

impl CqShared {
    /// Reserves room for a QP's completions, or says why not. Setup path.
    pub(crate) fn reserve(&self, n: u64) -> Result<(), ProviderError> {
        let mut cur = self.committed.load(Ordering::Relaxed);
        loop {
            if cur + n > self.entries {
                return Err(ProviderError::Other(format!(
                    "completion queue overcommitted: {cur} of {} entries promised to attached queue pairs, \
                     a new one needs {n} (max_send_wr + max_recv_wr); create the CQ with more entries",
                    self.entries
                )));
            }
            // Relaxed: a plain counter.
            match self.committed.compare_exchange_weak(
                cur,
                cur + n,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(v) => cur = v,
            }
        }
    }

    /// Gives back a reservation.
    pub(crate) fn release(&self, n: u64) {
        self.committed.fetch_sub(n, Ordering::Relaxed);
    }

    /// Hands a new endpoint to the CQ's owner. Setup path (allocates a node).
    pub(crate) fn attach(&self, ep: Arc<Endpoint>) {
        let node = Box::into_raw(Box::new(AttachNode {
            ep,
            next: ptr::null_mut(),
        }));
        let mut head = self.attach.load(Ordering::Relaxed);
        loop {
            // SAFETY: `node` is ours until the CAS below publishes it.
            unsafe { (*node).next = head };
            // Release: the node's contents are visible to the owner's
            // Acquire swap in `take`.
            match self.attach.compare_exchange_weak(
                head,
                node,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(h) => head = h,
            }
        }
    }

    /// Takes every pending node (owner only).
    fn take(&self, into: &mut Vec<Attached>) {
        // Relaxed pre-check keeps the empty case to one load.
        if self.attach.load(Ordering::Relaxed).is_null() {
            return;
        }
        // Acquire pairs with `attach`'s Release.
        let mut p = self.attach.swap(ptr::null_mut(), Ordering::Acquire);
        while !p.is_null() {
            // SAFETY: every node was created by `Box::into_raw` in `attach`
            // and, after the swap, is reachable only from here.
            let node = unsafe { Box::from_raw(p) };
            p = node.next;
            into.push(Attached {
                ep: node.ep,
                drained: false,
                violation_reported: false,
                local_first: false,
            });
        }
    }
}

impl Drop for CqShared {
    fn drop(&mut self) {
        let mut v = Vec::new();
        self.take(&mut v);
    }
}

/// A handle to create queue pairs on a [`SoftCq`] from another thread.
#[derive(Clone, Debug)]
pub struct SoftCqHandle(pub(crate) Arc<CqShared>);

#[derive(Debug)]
struct Attached {
    ep: Arc<Endpoint>,
    /// The connection broke, our gate is closed and idle: receives are ours
    /// to flush.
    drained: bool,
    /// The peer's access violation was reported on a flushed receive.
    violation_reported: bool,
    /// Which ring the next poll drains first.
    local_first: bool,
}

/// The soft provider's completion queue (see the module doc).
#[derive(Debug)]
pub struct SoftCq {
    shared: Arc<CqShared>,
    attached: Vec<Attached>,
    next: usize,
}

impl SoftCq {
    pub(crate) fn new(entries: u32) -> Result<Self, ProviderError> {
        if entries == 0 {
            return Err(ProviderError::Other("create_cq: zero entries".into()));
        }
        Ok(SoftCq {
            shared: Arc::new(CqShared {
                attach: AtomicPtr::new(ptr::null_mut()),
                committed: AtomicU64::new(0),
                entries: u64::from(entries),
            }),
            attached: Vec::with_capacity(16),
            next: 0,
        })
    }

    /// Queue pairs currently attached (after the last poll).
    pub fn attached(&self) -> usize {
        self.attached.len()
    }
}

impl CompletionQueue for SoftCq {
    type Handle = SoftCqHandle;

    fn handle(&self) -> SoftCqHandle {
        SoftCqHandle(self.shared.clone())
    }

    fn poll(&mut self, out: &mut [Completion]) -> usize {
        // Allocates only when a queue pair was just attached (connection
        // setup), to grow the list.
        self.shared.take(&mut self.attached);
        let len = self.attached.len();
        if len == 0 || out.is_empty() {
            return 0;
        }
        // Round robin without divisions (a poll with nothing to deliver
        // should cost a handful of loads).
        let start = if self.next >= len { 0 } else { self.next };
        self.next = start + 1;
        let mut n = 0;
        let mut finished = false;
        let mut i = start;
        for _ in 0..len {
            if n == out.len() {
                break;
            }
            let a = &mut self.attached[i];
            i += 1;
            if i == len {
                i = 0;
            }
            n += poll_one(a, &mut out[n..]);
            finished |= a.drained && a.ep.dropped.load(Ordering::Acquire) && idle(&a.ep);
        }
        if finished {
            // Rare: a dropped queue pair is fully flushed; forget it.
            self.attached
                .retain(|a| !(a.drained && a.ep.dropped.load(Ordering::Acquire) && idle(&a.ep)));
        }
        n
    }
}

/// Nothing left to deliver for a broken, drained endpoint.
fn idle(ep: &Endpoint) -> bool {
    ep.seg.cq(ep.me).available() == Ok(0)
        && ep.local.view().available() == Ok(0)
        && ep.seg.rq(ep.me).available().is_ok_and(|n| n == 0)
}

#[inline]
fn poll_one(a: &mut Attached, out: &mut [Completion]) -> usize {
    let ep = &*a.ep;
    // The common empty poll: nothing published on either ring and the
    // connection up. Three loads of lines we already hold.
    if !ep.seg.cq(ep.me).peek_stamped() && !ep.local.view().peek_index() && !ep.is_broken() {
        return 0;
    }
    poll_rings(a, out)
}

#[inline(never)]
fn poll_rings(a: &mut Attached, out: &mut [Completion]) -> usize {
    // Alternate which ring goes first, so a steady stream of receives
    // cannot starve our own send completions (and with them the send
    // queue's room) when the caller polls with a short array.
    a.local_first = !a.local_first;
    let ep = &*a.ep;
    let mut n;
    if a.local_first {
        n = drain_local(ep, out);
        n += drain_inbound(ep, &mut out[n..]);
    } else {
        n = drain_inbound(ep, out);
        n += drain_local(ep, &mut out[n..]);
    }
    if n < out.len() && ep.is_broken() {
        n += flush(a, &mut out[n..]);
    }
    n
}

/// Receives the peer completed into our buffers.
#[inline]
fn drain_inbound(ep: &Endpoint, out: &mut [Completion]) -> usize {
    let ring = ep.seg.cq(ep.me);
    let taken = ring.pop_stamped(out.len() as u64, |k, slot| {
        let (mut c, _) = slot.read(ep.id);
        c.opcode = WcOpcode::Recv;
        out[k as usize] = c;
    });
    if taken > 0 {
        retire_receives(ep, taken);
    }
    taken as usize
}

/// Counts `n` polled receives as retired (this CQ is `rq_retired`'s only
/// writer, so a load and a store, not a locked read-modify-write).
#[inline]
fn retire_receives(ep: &Endpoint, n: u64) {
    let r = ep.rq_retired.load(Ordering::Relaxed);
    // Release: pairs with post_recv's Acquire load (the receive buffers are
    // handed back before their slots are reused).
    ep.rq_retired.store(r + n, Ordering::Release);
}

/// Our own send-queue completions.
#[inline]
fn drain_local(ep: &Endpoint, out: &mut [Completion]) -> usize {
    let mut last = None;
    let taken = ep
        .local
        .view()
        .pop_n(out.len() as u64, |k, slot| {
            let (c, seq) = slot.read(ep.id);
            out[k as usize] = c;
            last = Some(seq);
        })
        .unwrap_or(0);
    if let Some(seq) = last {
        // Release: pairs with post_send's Acquire; every work request up to
        // this one (signaled or not) is retired.
        ep.sq_retired.store(seq + 1, Ordering::Release);
    }
    taken as usize
}

/// The connection broke: once no peer access to our memory is in flight,
/// every receive still posted completes as Flushed (the first one carries
/// `RemoteAccessViolation` if the break was the peer's refused access to our
/// memory, the way a responder reports it).
#[cold]
fn flush(a: &mut Attached, out: &mut [Completion]) -> usize {
    let ep = &*a.ep;
    let mut n = 0;
    if !a.drained {
        gate_close(ep.my_gate());
        if !gate_idle(ep.my_gate()) {
            // The peer is finishing a delivery; never wait in poll.
            return 0;
        }
        a.drained = true;
        let p = &ep.provider.counters;
        p.connections_broken.fetch_add(1, Ordering::Relaxed);
        // Whatever the last accessor published before leaving the gate
        // comes before the flushes.
        n = drain_inbound(ep, out);
    }
    let mut report = !a.violation_reported
        && matches!(ep.break_info(), Some(i) if i.reason == BreakReason::AccessViolation && i.by_peer);
    let rq = ep.seg.rq(ep.me);
    let taken = rq
        .pop_n((out.len() - n) as u64, |k, slot| {
            let r = slot.read();
            let status = if std::mem::take(&mut report) {
                WcStatus::RemoteAccessViolation
            } else {
                WcStatus::Flushed
            };
            out[n + k as usize] = Completion {
                wr_id: r.wr_id,
                qp: ep.id,
                status,
                opcode: WcOpcode::Recv,
                byte_len: 0,
                invalidated_rkey: None,
            };
        })
        .unwrap_or(0);
    if taken > 0 {
        // The break reason never changes, so one flush round settles it.
        a.violation_reported = true;
    }
    if taken > 0 {
        retire_receives(ep, taken);
        ep.provider
            .counters
            .flushed
            .fetch_add(taken, Ordering::Relaxed);
    }
    n + taken as usize
}
