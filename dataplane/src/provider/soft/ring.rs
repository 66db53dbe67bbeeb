//! Single-producer single-consumer rings: a queue pair's receive queue and
//! its completion rings. The receive queue and the inbound completion ring
//! live in the connection's shared segment (the peer's posting thread is the
//! other end); the local completion ring lives in this process.
//!
//! Indices are free-running `u64`s (never wrap in practice); a slot is
//! `index & mask`. The producer writes a slot's fields, then publishes it
//! with a Release store of the slot's *stamp* (`index + 1`), then advances
//! `tail` (Release). A consumer on the other core ([`RingRef::pop_stamped`])
//! never reads `tail`: it Acquire-loads the stamp of the slot at its `head`
//! and takes the slot when the stamp says it was published for that index
//! (a stamp from the previous lap, or zero, says not yet). So a handoff
//! moves the one line the slot is on from producer to consumer, instead of
//! that line and the line of `tail` (which, being spun on, also had to be
//! taken back by every publish): the cost of a cache-line ping-pong. The
//! consumer frees slots with a Release store of `head`, which the producer
//! Acquire-loads (rarely: it caches it) before reusing a slot. `tail` stays
//! for the producer's own bookkeeping and for consumers that need a count
//! ([`RingRef::available`]: teardown, flushing). Every slot field is an
//! atomic accessed Relaxed: the stamp and index store/load pairs order
//! them, and a misbehaving peer writing concurrently can corrupt values but
//! cannot cause undefined behaviour.

use std::sync::atomic::{AtomicU64, Ordering};

use super::shm::{Padded, ShmSafe};
use crate::provider::{Completion, QpId, WcOpcode, WcStatus};

/// Head (consumer) and tail (producer) of one ring, each on its own line.
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct RingIndex {
    pub(crate) head: Padded<AtomicU64>,
    pub(crate) tail: Padded<AtomicU64>,
}

// SAFETY: repr(C) of ShmSafe fields.
unsafe impl ShmSafe for RingIndex {}

/// A posted receive: where the peer may place the next message.
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct RecvSlot {
    /// The receive's `wr_id`.
    pub(crate) wr_id: AtomicU64,
    /// Buffer address in the owner's address space.
    pub(crate) addr: AtomicU64,
    /// `len | region index << 32`.
    pub(crate) len_region: AtomicU64,
    /// `index + 1` once published (see the module doc).
    stamp: AtomicU64,
}

// SAFETY: repr(C) of atomics.
unsafe impl ShmSafe for RecvSlot {}

/// A receive as the consumer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PostedRecv {
    pub(crate) wr_id: u64,
    pub(crate) addr: u64,
    pub(crate) len: u32,
    pub(crate) region: u32,
}

impl RecvSlot {
    #[inline]
    pub(crate) fn write(&self, r: PostedRecv) {
        self.wr_id.store(r.wr_id, Ordering::Relaxed);
        self.addr.store(r.addr, Ordering::Relaxed);
        self.len_region.store(
            u64::from(r.len) | u64::from(r.region) << 32,
            Ordering::Relaxed,
        );
    }

    #[inline]
    pub(crate) fn read(&self) -> PostedRecv {
        let lr = self.len_region.load(Ordering::Relaxed);
        PostedRecv {
            wr_id: self.wr_id.load(Ordering::Relaxed),
            addr: self.addr.load(Ordering::Relaxed),
            len: lr as u32,
            region: (lr >> 32) as u32,
        }
    }
}

/// A completion in a ring: a cache line of its own, so a handoff moves
/// exactly one line and a neighbour being written never disturbs it.
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub(crate) struct CqSlot {
    wr_id: AtomicU64,
    /// `status | opcode << 16 | has_invalidate << 24 | byte_len << 32`.
    meta: AtomicU64,
    /// Invalidated rkey, or the raw code of `WcStatus::Other`.
    aux: AtomicU64,
    /// Send-queue sequence number (local ring only).
    seq: AtomicU64,
    /// `index + 1` once published (see the module doc).
    stamp: AtomicU64,
}

/// A ring slot with a publication stamp.
pub(crate) trait Stamped {
    fn stamp(&self) -> &AtomicU64;
}

impl Stamped for RecvSlot {
    #[inline]
    fn stamp(&self) -> &AtomicU64 {
        &self.stamp
    }
}

impl Stamped for CqSlot {
    #[inline]
    fn stamp(&self) -> &AtomicU64 {
        &self.stamp
    }
}

// SAFETY: repr(C) of atomics.
unsafe impl ShmSafe for CqSlot {}

const ST_SUCCESS: u64 = 0;
const ST_RNR: u64 = 1;
const ST_LEN: u64 = 2;
const ST_LOC_PROT: u64 = 3;
const ST_REM_ACCESS: u64 = 4;
const ST_REM_VIOLATION: u64 = 5;
const ST_FLUSHED: u64 = 6;
const ST_OTHER: u64 = 7;

fn opcode_code(op: WcOpcode) -> u64 {
    match op {
        WcOpcode::Send => 0,
        WcOpcode::Recv => 1,
        WcOpcode::RdmaWrite => 2,
        WcOpcode::RdmaRead => 3,
        WcOpcode::Bind => 4,
        WcOpcode::Revoke => 5,
    }
}

fn opcode_of(code: u64) -> WcOpcode {
    match code {
        0 => WcOpcode::Send,
        2 => WcOpcode::RdmaWrite,
        3 => WcOpcode::RdmaRead,
        4 => WcOpcode::Bind,
        5 => WcOpcode::Revoke,
        _ => WcOpcode::Recv,
    }
}

impl CqSlot {
    /// Stores `c` (its `qp` is not stored: a ring belongs to one QP).
    #[inline]
    pub(crate) fn write(&self, c: &Completion, seq: u64) {
        let (status, other) = match c.status {
            WcStatus::Success => (ST_SUCCESS, 0),
            WcStatus::RnrRetryExceeded => (ST_RNR, 0),
            WcStatus::LocalLengthError => (ST_LEN, 0),
            WcStatus::LocalProtectionError => (ST_LOC_PROT, 0),
            WcStatus::RemoteAccessError => (ST_REM_ACCESS, 0),
            WcStatus::RemoteAccessViolation => (ST_REM_VIOLATION, 0),
            WcStatus::Flushed => (ST_FLUSHED, 0),
            WcStatus::Other(code) => (ST_OTHER, u64::from(code)),
        };
        let (inv, aux) = match c.invalidated_rkey {
            Some(rkey) => (1u64, u64::from(rkey)),
            None => (0, other),
        };
        self.wr_id.store(c.wr_id, Ordering::Relaxed);
        self.meta.store(
            status | opcode_code(c.opcode) << 16 | inv << 24 | u64::from(c.byte_len) << 32,
            Ordering::Relaxed,
        );
        self.aux.store(aux, Ordering::Relaxed);
        self.seq.store(seq, Ordering::Relaxed);
    }

    /// Reads a completion of `qp`; returns it with its sequence number.
    /// Unknown codes (a corrupt peer) decode as `Other`, never panic.
    #[inline]
    pub(crate) fn read(&self, qp: QpId) -> (Completion, u64) {
        let meta = self.meta.load(Ordering::Relaxed);
        let aux = self.aux.load(Ordering::Relaxed);
        let status = match meta & 0xffff {
            ST_SUCCESS => WcStatus::Success,
            ST_RNR => WcStatus::RnrRetryExceeded,
            ST_LEN => WcStatus::LocalLengthError,
            ST_LOC_PROT => WcStatus::LocalProtectionError,
            ST_REM_ACCESS => WcStatus::RemoteAccessError,
            ST_REM_VIOLATION => WcStatus::RemoteAccessViolation,
            ST_FLUSHED => WcStatus::Flushed,
            ST_OTHER => WcStatus::Other(aux as u32),
            raw => WcStatus::Other(raw as u32),
        };
        let has_inv = (meta >> 24) & 1 == 1;
        let c = Completion {
            wr_id: self.wr_id.load(Ordering::Relaxed),
            qp,
            status,
            opcode: opcode_of((meta >> 16) & 0xff),
            byte_len: (meta >> 32) as u32,
            invalidated_rkey: has_inv.then_some(aux as u32),
        };
        (c, self.seq.load(Ordering::Relaxed))
    }
}

/// A view of one ring: its indices and its slots (a power of two of them).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RingRef<'a, E> {
    pub(crate) index: &'a RingIndex,
    pub(crate) slots: &'a [E],
}

/// The consumer saw more entries than the ring holds: the peer corrupted
/// the indices. Fatal to the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Corrupt;

impl<'a, E> RingRef<'a, E> {
    #[inline]
    fn mask(&self) -> u64 {
        debug_assert!(self.slots.len().is_power_of_two());
        self.slots.len() as u64 - 1
    }

    #[inline]
    fn slot(&self, i: u64) -> &'a E {
        &self.slots[(i & self.mask()) as usize]
    }

    /// Producer: free slots.
    #[inline]
    pub(crate) fn free_slots(&self) -> u64 {
        // Relaxed: only the producer writes `tail`.
        let tail = self.index.tail.load(Ordering::Relaxed);
        // Acquire pairs with the consumer's Release store of `head`: its reads
        // of the slots it freed are done before we overwrite them.
        let head = self.index.head.load(Ordering::Acquire);
        (self.slots.len() as u64).saturating_sub(tail.wrapping_sub(head))
    }

    /// Producer: writes up to `n` slots with `fill(k, slot)` (the caller
    /// checked [`Self::free_slots`]), stamps each, and advances `tail` once.
    #[inline]
    pub(crate) fn push_n(&self, n: u64, mut fill: impl FnMut(u64, &E))
    where
        E: Stamped,
    {
        let tail = self.index.tail.load(Ordering::Relaxed);
        for k in 0..n {
            let i = tail.wrapping_add(k);
            let slot = self.slot(i);
            fill(k, slot);
            // Release: the fields written by `fill` happen-before the
            // consumer's Acquire load that sees this stamp.
            slot.stamp().store(i.wrapping_add(1), Ordering::Release);
        }
        // Release: the slot writes above happen-before the consumer's Acquire
        // load that observes the new tail.
        self.index
            .tail
            .store(tail.wrapping_add(n), Ordering::Release);
    }

    /// Producer: free slots, re-reading the consumer's `head` only when the
    /// value cached in `head_cache` says fewer than `want` are free.
    #[inline]
    pub(crate) fn free_slots_cached(&self, head_cache: &std::cell::Cell<u64>, want: u64) -> u64 {
        let tail = self.index.tail.load(Ordering::Relaxed);
        let cap = self.slots.len() as u64;
        let free = cap.saturating_sub(tail.wrapping_sub(head_cache.get()));
        if free >= want {
            return free;
        }
        let head = self.index.head.load(Ordering::Acquire);
        head_cache.set(head);
        cap.saturating_sub(tail.wrapping_sub(head))
    }

    /// Producer: [`Self::try_push`] with a cached consumer index.
    #[inline]
    pub(crate) fn try_push_cached(
        &self,
        head_cache: &std::cell::Cell<u64>,
        fill: impl FnOnce(&E),
    ) -> bool
    where
        E: Stamped,
    {
        if self.free_slots_cached(head_cache, 1) == 0 {
            return false;
        }
        let mut fill = Some(fill);
        self.push_n(1, |_, s| {
            if let Some(f) = fill.take() {
                f(s)
            }
        });
        true
    }

    /// Consumer on the other side of the producer: takes up to `max`
    /// published entries with `take(k, slot)`, found by their stamps
    /// without reading `tail`, and frees them with one index store. Returns
    /// how many were taken. Garbage stamps from a misbehaving peer can only
    /// make slots look published or not: at most `max` slots are read, each
    /// an atomic load, so nothing worse than garbage values follows.
    #[inline]
    pub(crate) fn pop_stamped(&self, max: u64, mut take: impl FnMut(u64, &E)) -> u64
    where
        E: Stamped,
    {
        let head = self.index.head.load(Ordering::Relaxed);
        let mut n = 0;
        while n < max {
            let i = head.wrapping_add(n);
            let slot = self.slot(i);
            // Acquire pairs with `push_n`'s Release store of the stamp.
            if slot.stamp().load(Ordering::Acquire) != i.wrapping_add(1) {
                break;
            }
            take(n, slot);
            n += 1;
        }
        if n > 0 {
            // Release: our slot reads happen-before the producer reuses them.
            self.index
                .head
                .store(head.wrapping_add(n), Ordering::Release);
        }
        n
    }

    /// Consumer: whether the slot at `head` is published (a hint for an
    /// empty poll to return early; [`Self::pop_stamped`] is what orders).
    #[inline]
    pub(crate) fn peek_stamped(&self) -> bool
    where
        E: Stamped,
    {
        let head = self.index.head.load(Ordering::Relaxed);
        self.slot(head).stamp().load(Ordering::Relaxed) == head.wrapping_add(1)
    }

    /// Whether `tail` moved past `head` (a hint, as [`Self::peek_stamped`],
    /// for a ring whose producer and consumer share a thread or that is
    /// read by index).
    #[inline]
    pub(crate) fn peek_index(&self) -> bool {
        self.index.tail.load(Ordering::Relaxed) != self.index.head.load(Ordering::Relaxed)
    }

    /// Producer: pushes one entry if there is room.
    #[inline]
    pub(crate) fn try_push(&self, fill: impl FnOnce(&E)) -> bool
    where
        E: Stamped,
    {
        if self.free_slots() == 0 {
            return false;
        }
        let mut fill = Some(fill);
        self.push_n(1, |_, s| {
            if let Some(f) = fill.take() {
                f(s)
            }
        });
        true
    }

    /// Consumer: entries available.
    #[inline]
    pub(crate) fn available(&self) -> Result<u64, Corrupt> {
        // Relaxed: `head` is written by the consumer only (or, for a receive
        // queue after the connection broke, by the owner's completion queue,
        // which synchronised with the last peer consumer through the gate).
        let head = self.index.head.load(Ordering::Relaxed);
        // Acquire pairs with the producer's Release store: its slot writes
        // are visible.
        let tail = self.index.tail.load(Ordering::Acquire);
        let n = tail.wrapping_sub(head);
        if n > self.slots.len() as u64 {
            return Err(Corrupt);
        }
        Ok(n)
    }

    /// Consumer: reads up to `max` entries with `take(k, slot)` and frees them
    /// with one index store. Returns how many were taken.
    #[inline]
    pub(crate) fn pop_n(&self, max: u64, mut take: impl FnMut(u64, &E)) -> Result<u64, Corrupt> {
        let n = self.available()?.min(max);
        if n == 0 {
            return Ok(0);
        }
        let head = self.index.head.load(Ordering::Relaxed);
        for k in 0..n {
            take(k, self.slot(head.wrapping_add(k)));
        }
        // Release: our slot reads happen-before the producer reuses them.
        self.index
            .head
            .store(head.wrapping_add(n), Ordering::Release);
        Ok(n)
    }
}

/// A ring in process memory (the local completion ring of a queue pair:
/// producer the QP's owner, consumer the CQ's owner).
#[derive(Debug)]
pub(crate) struct LocalRing {
    index: RingIndex,
    slots: Box<[CqSlot]>,
}

impl LocalRing {
    /// A ring of at least `cap` slots.
    pub(crate) fn new(cap: u32) -> Self {
        let cap = cap.max(1).next_power_of_two() as usize;
        LocalRing {
            index: RingIndex::default(),
            slots: (0..cap).map(|_| CqSlot::default()).collect(),
        }
    }

    /// Its view.
    #[inline]
    pub(crate) fn view(&self) -> RingRef<'_, CqSlot> {
        RingRef {
            index: &self.index,
            slots: &self.slots,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_round_trips_through_a_slot() {
        let slot = CqSlot::default();
        for status in [
            WcStatus::Success,
            WcStatus::RnrRetryExceeded,
            WcStatus::LocalLengthError,
            WcStatus::LocalProtectionError,
            WcStatus::RemoteAccessError,
            WcStatus::RemoteAccessViolation,
            WcStatus::Flushed,
            WcStatus::Other(9),
        ] {
            for (opcode, inv) in [
                (WcOpcode::Recv, Some(0xdead_beef)),
                (WcOpcode::Send, None),
                (WcOpcode::RdmaWrite, None),
                (WcOpcode::RdmaRead, None),
                (WcOpcode::Bind, None),
                (WcOpcode::Revoke, None),
            ] {
                let inv = if status == WcStatus::Success {
                    inv
                } else {
                    None
                };
                let c = Completion {
                    wr_id: 0x0123_4567_89ab_cdef,
                    qp: QpId(7),
                    status,
                    opcode,
                    byte_len: 8192,
                    invalidated_rkey: inv,
                };
                slot.write(&c, 99);
                assert_eq!(slot.read(QpId(7)), (c, 99));
            }
        }
    }

    #[test]
    fn spsc_ring_orders_and_bounds() {
        let ring = LocalRing::new(3);
        let v = ring.view();
        assert_eq!(v.free_slots(), 4);
        let c = |i| Completion {
            wr_id: i,
            ..Completion::EMPTY
        };
        v.push_n(3, |k, s| s.write(&c(k), k));
        assert!(v.try_push(|s| s.write(&c(3), 3)));
        assert!(!v.try_push(|s| s.write(&c(4), 4)), "full");
        let mut got = vec![];
        assert_eq!(v.pop_n(2, |_, s| got.push(s.read(QpId(0)).0.wr_id)), Ok(2));
        assert!(v.try_push(|s| s.write(&c(4), 4)));
        assert_eq!(v.pop_n(10, |_, s| got.push(s.read(QpId(0)).0.wr_id)), Ok(3));
        assert_eq!(got, [0, 1, 2, 3, 4]);
        // A corrupt tail is detected, not followed.
        ring.index.tail.store(100, Ordering::Relaxed);
        assert_eq!(v.available(), Err(Corrupt));
    }

    #[test]
    fn stamped_pop_takes_exactly_the_published_slots_across_laps() {
        let ring = LocalRing::new(4);
        let v = ring.view();
        let c = |i| Completion {
            wr_id: i,
            ..Completion::EMPTY
        };
        let mut got = vec![];
        assert_eq!(
            v.pop_stamped(8, |_, s| got.push(s.read(QpId(0)).0.wr_id)),
            0
        );
        let mut next = 0;
        for lap in 0..5u64 {
            // Fill the ring, take part of it, refill what was freed.
            let free = v.free_slots();
            v.push_n(free, |k, s| s.write(&c(next + k), 0));
            next += free;
            assert_eq!(
                v.pop_stamped(3, |_, s| got.push(s.read(QpId(0)).0.wr_id)),
                3
            );
            // A slot still holding the stamp of its previous lap is not
            // taken again.
            if lap > 0 {
                let taken = v.pop_stamped(8, |_, s| got.push(s.read(QpId(0)).0.wr_id));
                assert_eq!(taken, 1, "only the one published slot is left");
            }
        }
        assert_eq!(got, (0..got.len() as u64).collect::<Vec<_>>());
        // A stamp that does not match the head's index is "not published".
        let head = ring.index.head.load(Ordering::Relaxed);
        ring.slots[(head & 3) as usize]
            .stamp
            .store(head + 5, Ordering::Relaxed);
        assert_eq!(v.pop_stamped(8, |_, _| {}), 0);
    }
}
