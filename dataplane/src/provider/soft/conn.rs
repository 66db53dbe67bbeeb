//! A connection: the shared segment both ends map (state word, gates,
//! receive queues, inbound completion rings, counters) and this process's
//! end of it ([`Endpoint`]), shared by the queue pair, the completion queue
//! it is attached to, the watchdog and the provider.
//!
//! Segment layout (side 0 = the connecting end, side 1 = the accepting end):
//!
//! ```text
//! header   magic | state | gate[0] | gate[1]
//! side s   rq index | inbound cq index | counters | rq slots | inbound cq slots
//! ```
//!
//! Side `s`'s receive queue is produced by `s` (post_recv) and consumed by
//! the other side's posting thread (a Send); its inbound completion ring is
//! produced by the other side's posting thread and consumed by `s`'s
//! completion queue. Both hold `next_pow2(max_recv_wr of s)` slots.
//!
//! **Gates.** `gate[s]` guards side `s`'s memory (its posted receive buffers
//! and its grants) against the other side: `CLOSED | GONE | in-flight count`.
//! An accessor increments the count and proceeds only if `CLOSED` was clear;
//! it decrements when done. Breaking the connection sets `CLOSED` on both.
//! Because entry and close are read-modify-writes of the same word, either
//! the accessor's increment precedes the close (and the closer sees the count
//! and waits for the Release decrement, so the access happens-before whatever
//! the closer does next) or it follows it (and the accessor sees `CLOSED`).
//! `GONE` is set when the peer process has exited: a count it left behind
//! will never drop, and nobody can access anything any more.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use super::cq::CqShared;
use super::grant::GrantTable;
use super::region::PeerMemory;
use super::ring::{CqSlot, LocalRing, RecvSlot, RingIndex, RingRef};
use super::shm::{align64, Padded, Segment, ShmSafe};
use super::ProviderInner;
use crate::provider::{QpCaps, QpId, QpState};

/// Names the segment layout: changed with it (v2: stamped ring slots, one
/// cache line per completion), so ends built from different layouts refuse
/// each other instead of misreading the rings.
const CONN_MAGIC: u64 = u64::from_le_bytes(*b"SMBDCON2");

#[repr(C)]
#[derive(Debug, Default)]
struct ConnHeader {
    magic: AtomicU64,
    /// 0 while connected; else the first break's code (see [`BreakInfo`]).
    state: AtomicU64,
    _reserved: [AtomicU64; 6],
    gate: [Padded<AtomicU64>; 2],
}

// SAFETY: repr(C) of ShmSafe fields.
unsafe impl ShmSafe for ConnHeader {}

/// Counters of one side written by its owner.
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct OwnerCounters {
    pub(crate) grants_created: AtomicU64,
    pub(crate) grants_revoked: AtomicU64,
}

/// Counters of one side written by the peer's posting thread.
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct PeerCounters {
    pub(crate) grants_invalidated: AtomicU64,
    /// Refused accesses to this side's grants, by [`super::grant::Refusal`] kind.
    pub(crate) refused: [AtomicU64; 5],
}

/// One side's counters: owner-written and peer-written on separate lines so
/// the two posting threads never share a cache line.
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct SideCounters {
    pub(crate) owner: Padded<OwnerCounters>,
    pub(crate) peer: Padded<PeerCounters>,
}

// SAFETY: repr(C) of atomics.
unsafe impl ShmSafe for OwnerCounters {}
// SAFETY: repr(C) of atomics.
unsafe impl ShmSafe for PeerCounters {}
// SAFETY: repr(C) of ShmSafe fields.
unsafe impl ShmSafe for SideCounters {}

/// Where everything is in a connection segment, computed by both ends from
/// the two sides' receive depths (never read from the segment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConnLayout {
    rq_cap: [usize; 2],
    rq_index: [usize; 2],
    cq_index: [usize; 2],
    counters: [usize; 2],
    rq_slots: [usize; 2],
    cq_slots: [usize; 2],
    /// Total bytes.
    pub(crate) len: usize,
}

impl ConnLayout {
    /// The layout for receive depths `[side 0, side 1]`.
    pub(crate) fn new(recv_depth: [u32; 2]) -> Self {
        let mut off = align64(std::mem::size_of::<ConnHeader>());
        let mut l = ConnLayout {
            rq_cap: [0; 2],
            rq_index: [0; 2],
            cq_index: [0; 2],
            counters: [0; 2],
            rq_slots: [0; 2],
            cq_slots: [0; 2],
            len: 0,
        };
        for (s, depth) in recv_depth.iter().enumerate() {
            let cap = depth.max(&1).next_power_of_two() as usize;
            l.rq_cap[s] = cap;
            l.rq_index[s] = off;
            off += align64(std::mem::size_of::<RingIndex>());
            l.cq_index[s] = off;
            off += align64(std::mem::size_of::<RingIndex>());
            l.counters[s] = off;
            off += align64(std::mem::size_of::<SideCounters>());
            l.rq_slots[s] = off;
            off += align64(cap * std::mem::size_of::<RecvSlot>());
            l.cq_slots[s] = off;
            off += align64(cap * std::mem::size_of::<CqSlot>());
        }
        l.len = off;
        l
    }
}

/// Where one side's structures are in this mapping (see [`ConnSegment`]).
#[derive(Debug, Clone, Copy)]
struct SidePtrs {
    rq_index: NonNull<RingIndex>,
    rq_slots: NonNull<RecvSlot>,
    cq_index: NonNull<RingIndex>,
    cq_slots: NonNull<CqSlot>,
    counters: NonNull<SideCounters>,
    cap: usize,
}

/// A mapped connection segment. The addresses of its structures are
/// computed and checked against the mapping once, when it is mapped: the
/// rings are reached on every post and poll, and rebuilding each view
/// through [`Segment::slice`]'s checks cost more than an empty poll.
#[derive(Debug)]
pub(crate) struct ConnSegment {
    seg: Segment,
    header: NonNull<ConnHeader>,
    sides: [SidePtrs; 2],
}

// SAFETY: the pointers point into `seg`'s mapping, which `seg` owns and
// keeps mapped for as long as the ConnSegment lives; everything there is
// atomics (ShmSafe), shared between threads and processes by design.
unsafe impl Send for ConnSegment {}
// SAFETY: as above: only shared references to atomics are handed out.
unsafe impl Sync for ConnSegment {}

impl ConnSegment {
    fn new(seg: Segment, layout: ConnLayout) -> Self {
        // `Segment::at` / `slice` check bounds and alignment (and panic on a
        // layout this module got wrong; offsets never come from the peer).
        let side = |s: usize| SidePtrs {
            rq_index: NonNull::from(seg.at::<RingIndex>(layout.rq_index[s])),
            rq_slots: NonNull::from(seg.slice::<RecvSlot>(layout.rq_slots[s], layout.rq_cap[s]))
                .cast(),
            cq_index: NonNull::from(seg.at::<RingIndex>(layout.cq_index[s])),
            cq_slots: NonNull::from(seg.slice::<CqSlot>(layout.cq_slots[s], layout.rq_cap[s]))
                .cast(),
            counters: NonNull::from(seg.at::<SideCounters>(layout.counters[s])),
            cap: layout.rq_cap[s],
        };
        let sides = [side(0), side(1)];
        ConnSegment {
            header: NonNull::from(seg.at::<ConnHeader>(0)),
            sides,
            seg,
        }
    }

    /// Creates one (the accepting end does).
    pub(crate) fn create(layout: ConnLayout) -> io::Result<Self> {
        let seg = Segment::create(c"smbdirectd-soft-conn", layout.len)?;
        let c = ConnSegment::new(seg, layout);
        c.header().magic.store(CONN_MAGIC, Ordering::Relaxed);
        Ok(c)
    }

    /// Maps the one the accepting end created.
    pub(crate) fn open(fd: OwnedFd, layout: ConnLayout) -> io::Result<Self> {
        let seg = Segment::open(fd, layout.len)?;
        let c = ConnSegment::new(seg, layout);
        if c.header().magic.load(Ordering::Relaxed) != CONN_MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not a soft connection segment",
            ));
        }
        Ok(c)
    }

    /// Its memfd.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.seg.fd()
    }

    #[inline]
    fn header(&self) -> &ConnHeader {
        // SAFETY: checked in `new`; the mapping lives as long as `self`.
        unsafe { self.header.as_ref() }
    }

    /// Side `s`'s receive queue.
    #[inline]
    pub(crate) fn rq(&self, s: usize) -> RingRef<'_, RecvSlot> {
        let p = &self.sides[s];
        // SAFETY: checked in `new` (in bounds, aligned, `cap` slots); the
        // mapping lives as long as `self`.
        unsafe {
            RingRef {
                index: p.rq_index.as_ref(),
                slots: std::slice::from_raw_parts(p.rq_slots.as_ptr(), p.cap),
            }
        }
    }

    /// Side `s`'s inbound completion ring.
    #[inline]
    pub(crate) fn cq(&self, s: usize) -> RingRef<'_, CqSlot> {
        let p = &self.sides[s];
        // SAFETY: as in `rq`.
        unsafe {
            RingRef {
                index: p.cq_index.as_ref(),
                slots: std::slice::from_raw_parts(p.cq_slots.as_ptr(), p.cap),
            }
        }
    }

    /// Side `s`'s counters.
    #[inline]
    pub(crate) fn counters(&self, s: usize) -> &SideCounters {
        // SAFETY: as in `rq`.
        unsafe { self.sides[s].counters.as_ref() }
    }

    /// Side `s`'s gate.
    #[inline]
    pub(crate) fn gate(&self, s: usize) -> &AtomicU64 {
        &self.header().gate[s].0
    }

    /// The state word.
    #[inline]
    fn state(&self) -> &AtomicU64 {
        &self.header().state
    }
}

const GATE_CLOSED: u64 = 1 << 63;
const GATE_GONE: u64 = 1 << 62;
const GATE_COUNT: u64 = (1 << 32) - 1;

/// Enters a gate; false if it is closed (the connection broke).
#[inline]
pub(crate) fn gate_enter(g: &AtomicU64) -> bool {
    // Relaxed suffices for the increment itself: what we then read of the
    // owner's memory is ordered by the ring/grant Acquire loads, and the
    // closer's guarantee comes from this RMW's place in the gate's
    // modification order (see the module doc).
    let prev = g.fetch_add(1, Ordering::Relaxed);
    if prev & GATE_CLOSED != 0 {
        g.fetch_sub(1, Ordering::Relaxed);
        return false;
    }
    true
}

/// Leaves a gate entered with [`gate_enter`].
#[inline]
pub(crate) fn gate_leave(g: &AtomicU64) {
    // Release: everything we did to the owner's memory and rings
    // happens-before a closer's Acquire load that sees the count drop.
    g.fetch_sub(1, Ordering::Release);
}

/// Closes a gate (idempotent).
#[inline]
pub(crate) fn gate_close(g: &AtomicU64) {
    g.fetch_or(GATE_CLOSED, Ordering::AcqRel);
}

/// Whether a closed gate has no access in flight (or its accessor is gone).
#[inline]
pub(crate) fn gate_idle(g: &AtomicU64) -> bool {
    // Acquire pairs with `gate_leave`'s Release.
    let v = g.load(Ordering::Acquire);
    v & GATE_COUNT == 0 || v & GATE_GONE != 0
}

/// Why a connection broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BreakReason {
    /// `disconnect()` or the drop of a queue pair.
    Disconnected,
    /// A Send found no posted receive (RNR; fatal here, unlike hardware's
    /// retries).
    ReceiverNotReady,
    /// A Send was longer than the posted receive buffer.
    MessageTooLong,
    /// An RDMA access or Send with Invalidate was refused by the grant check.
    AccessViolation,
    /// A local SGE was outside registered memory.
    LocalProtection,
    /// The peer's end vanished without disconnecting (its process died):
    /// the rendezvous socket closed under a live connection.
    PeerLost,
    /// The provider of one end was dropped.
    ProviderDropped,
    /// The shared rings were found inconsistent (a corrupt peer).
    Corruption,
}

impl BreakReason {
    fn code(self) -> u64 {
        match self {
            BreakReason::Disconnected => 1,
            BreakReason::ReceiverNotReady => 2,
            BreakReason::MessageTooLong => 3,
            BreakReason::AccessViolation => 4,
            BreakReason::LocalProtection => 5,
            BreakReason::PeerLost => 6,
            BreakReason::ProviderDropped => 7,
            BreakReason::Corruption => 8,
        }
    }

    fn from_code(c: u64) -> Self {
        match c {
            1 => BreakReason::Disconnected,
            2 => BreakReason::ReceiverNotReady,
            3 => BreakReason::MessageTooLong,
            4 => BreakReason::AccessViolation,
            5 => BreakReason::LocalProtection,
            6 => BreakReason::PeerLost,
            7 => BreakReason::ProviderDropped,
            _ => BreakReason::Corruption,
        }
    }
}

/// How and by whom a connection broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BreakInfo {
    /// The first break's reason (later ones are not recorded).
    pub reason: BreakReason,
    /// Whether the other end's provider broke it (for `AccessViolation`:
    /// the peer's access to our memory was refused; for `PeerLost`, always
    /// false: we detected it).
    pub by_peer: bool,
}

/// This process's end of a connection.
#[derive(Debug)]
pub(crate) struct Endpoint {
    pub(crate) id: QpId,
    /// Our side index (0 connector, 1 acceptor).
    pub(crate) me: usize,
    pub(crate) seg: ConnSegment,
    pub(crate) peer_mem: PeerMemory,
    pub(crate) peer_grants: Arc<GrantTable>,
    /// What the peer's grants for this connection are bound to.
    pub(crate) peer_binding: u32,
    /// What ours are bound to.
    pub(crate) my_binding: u32,
    /// Our slots in our provider's grant table.
    pub(crate) grant_base: u32,
    pub(crate) grant_count: u32,
    /// Local completions (sends, RDMA, binds, revokes, local flushes).
    pub(crate) local: LocalRing,
    /// Receives completed and polled (success, error or flush); written by
    /// the CQ.
    pub(crate) rq_retired: Padded<AtomicU64>,
    /// Send-queue sequence number up to which work requests are retired;
    /// written by the CQ.
    pub(crate) sq_retired: Padded<AtomicU64>,
    pub(crate) caps: QpCaps,
    pub(crate) ird_ord: (u32, u32),
    /// The peer is another process.
    pub(crate) cross_process: bool,
    /// Its pid (as seen from here), for messages.
    pub(crate) peer_pid: i32,
    /// Our registrations made before the handshake (cross-process only;
    /// `u32::MAX` for a peer in this process): the peer mapped the regions
    /// among them still live then, and no later one
    /// ([`super::region::LocalRegion::serial`]).
    pub(crate) serials_exported: u32,
    /// The queue pair was dropped; the CQ detaches once all is flushed.
    pub(crate) dropped: AtomicBool,
    /// The rendezvous socket, kept open for the connection's lifetime.
    pub(crate) sock: OwnedFd,
    pub(crate) socket_shut: AtomicBool,
    /// CQ entries reserved for us.
    pub(crate) cq: Arc<CqShared>,
    pub(crate) cq_reserved: u64,
    pub(crate) provider: Arc<ProviderInner>,
}

impl Endpoint {
    /// The peer's side index.
    #[inline]
    pub(crate) fn peer(&self) -> usize {
        1 - self.me
    }

    /// Gate guarding our memory (entered by the peer).
    #[inline]
    pub(crate) fn my_gate(&self) -> &AtomicU64 {
        self.seg.gate(self.me)
    }

    /// Gate guarding the peer's memory (entered by us).
    #[inline]
    pub(crate) fn peer_gate(&self) -> &AtomicU64 {
        self.seg.gate(self.peer())
    }

    /// The state word's value (0 = connected).
    #[inline]
    pub(crate) fn state_code(&self) -> u64 {
        // Acquire: pairs with the breaker's AcqRel CAS, so whatever the
        // breaker published before (e.g. an error completion) is visible.
        self.seg.state().load(Ordering::Acquire)
    }

    /// Whether the connection broke.
    #[inline]
    pub(crate) fn is_broken(&self) -> bool {
        self.state_code() != 0
    }

    /// Breaks the connection (we detected `reason`); true if ours was the
    /// first break. Both gates close; flushing is the CQs' business.
    pub(crate) fn break_conn(&self, reason: BreakReason) -> bool {
        let code = reason.code() | (self.me as u64 + 1) << 8;
        // AcqRel: the first break wins; its code is published with Release.
        let won = self
            .seg
            .state()
            .compare_exchange(0, code, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        gate_close(self.seg.gate(0));
        gate_close(self.seg.gate(1));
        won
    }

    /// How the connection broke, if it did.
    pub(crate) fn break_info(&self) -> Option<BreakInfo> {
        let code = self.state_code();
        (code != 0).then(|| BreakInfo {
            reason: BreakReason::from_code(code & 0xff),
            by_peer: (code >> 8) as usize != self.me + 1,
        })
    }

    /// The queue pair's state.
    pub(crate) fn qp_state(&self) -> QpState {
        match self.break_info() {
            None => QpState::Connected,
            Some(BreakInfo {
                reason: BreakReason::Disconnected,
                by_peer: false,
            }) => QpState::Disconnected,
            Some(_) => QpState::Error,
        }
    }

    /// Shuts the rendezvous socket down, so the peer's watchdog learns of
    /// the disconnect even if it is not polling its CQ. Setup path.
    pub(crate) fn shutdown_socket(&self) {
        if !self.socket_shut.swap(true, Ordering::Relaxed) {
            // SAFETY: shutdown on a socket fd we own; no memory is passed.
            unsafe { libc::shutdown(self.sock.as_raw_fd(), libc::SHUT_RDWR) };
        }
    }

    /// Our end's disconnect: break, tell the peer.
    pub(crate) fn disconnect(&self) {
        self.break_conn(BreakReason::Disconnected);
        self.shutdown_socket();
    }

    /// The watchdog saw the peer's socket close. If the connection was still
    /// up, the peer vanished without a disconnect.
    pub(crate) fn peer_hung_up(&self) {
        if self.break_conn(BreakReason::PeerLost) {
            self.provider
                .counters
                .peers_lost
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The watchdog saw the peer process exit: nothing it left in flight
    /// will ever complete, and nothing of it can access our memory.
    pub(crate) fn peer_exited(&self) {
        self.peer_hung_up();
        self.my_gate().fetch_or(GATE_GONE, Ordering::AcqRel);
    }

    /// Whether the peer process exited.
    #[inline]
    pub(crate) fn peer_gone(&self) -> bool {
        self.my_gate().load(Ordering::Relaxed) & GATE_GONE != 0
    }

    /// Closes our gate and waits until no peer access is in flight. Setup
    /// paths (queue pair and provider drop) only: it may spin.
    pub(crate) fn drain_my_gate(&self) {
        let g = self.my_gate();
        gate_close(g);
        let mut spins = 0u32;
        while !gate_idle(g) {
            spins += 1;
            if spins < 1000 {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        let c = &self.provider.counters;
        let mine = self.seg.counters(self.me);
        c.retired_grants_created.fetch_add(
            mine.owner.grants_created.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        c.retired_grants_revoked.fetch_add(
            mine.owner.grants_revoked.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        c.retired_grants_invalidated.fetch_add(
            mine.peer.grants_invalidated.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        for (k, r) in mine.peer.refused.iter().enumerate() {
            c.retired_refused[k].fetch_add(r.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        self.provider
            .release_grant_range(self.grant_base, self.grant_count);
        self.cq.release(self.cq_reserved);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_disjoint_and_aligned() {
        let l = ConnLayout::new([3, 256]);
        assert_eq!(l.rq_cap, [4, 256]);
        let mut spans = vec![(0, std::mem::size_of::<ConnHeader>())];
        for s in 0..2 {
            spans.push((l.rq_index[s], std::mem::size_of::<RingIndex>()));
            spans.push((l.cq_index[s], std::mem::size_of::<RingIndex>()));
            spans.push((l.counters[s], std::mem::size_of::<SideCounters>()));
            spans.push((l.rq_slots[s], l.rq_cap[s] * 32));
            spans.push((l.cq_slots[s], l.rq_cap[s] * 32));
        }
        spans.sort();
        for w in spans.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "{spans:?}");
        }
        assert!(spans.iter().all(|(o, _)| o % 64 == 0));
        assert!(spans.last().map(|(o, n)| o + n).unwrap() <= l.len);
    }

    #[test]
    fn gate_close_excludes_later_entries_and_waits_for_earlier() {
        let g = AtomicU64::new(0);
        assert!(gate_enter(&g));
        gate_close(&g);
        assert!(!gate_idle(&g), "an access is in flight");
        assert!(!gate_enter(&g), "closed");
        gate_leave(&g);
        assert!(gate_idle(&g));
        // An accessor that died holding the gate does not block forever.
        let g = AtomicU64::new(0);
        assert!(gate_enter(&g));
        gate_close(&g);
        g.fetch_or(GATE_GONE, Ordering::AcqRel);
        assert!(gate_idle(&g));
    }
}
