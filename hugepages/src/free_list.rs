//! The free list of one size class in one worker slice.
//!
//! Two intrusive LIFO stacks thread through one array of slots (one slot per
//! buffer; the slots live on the heap, never in the possibly shared region):
//!
//! * the **owner stack**, touched only by the thread that holds the slice
//!   (see [`crate::SliceAllocator`]). Push and pop are plain relaxed loads and
//!   stores: no read-modify-write, no contention;
//! * the **return stack**, onto which any other thread pushes with a CAS loop
//!   (Treiber push). The owner never pops single entries from it: when its own
//!   stack runs dry it takes the whole return stack with one `swap(NIL)`. A
//!   stack that only supports *push* and *take-all* has no ABA problem, because
//!   a pusher never reads anything beyond the head word it CASes against, so no
//!   tag bits are needed.
//!
//! Every slot also carries a state word `generation << 1 | ALLOCATED`. A free
//! must win a CAS from `gen << 1 | 1` to `(gen + 1) << 1`; this is the single
//! point that decides who may push a buffer, so a double free (or a free through
//! a stale handle from an earlier allocation of the same buffer) loses the CAS,
//! is reported, and never reaches either stack. Generations are 16 bits wide and
//! travel in [`crate::BufId`], so detection of stale handles is exact until the
//! same buffer has been reallocated 65536 times in between.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// End-of-list marker, and the reason a class slice holds at most `u32::MAX - 1` buffers.
pub(crate) const NIL: u32 = u32::MAX;

/// Low bit of [`Slot::state`]: the buffer is handed out.
const ALLOCATED: u32 = 1;

#[inline]
fn allocated_state(generation: u16) -> u32 {
    (u32::from(generation) << 1) | ALLOCATED
}

#[inline]
fn free_state(generation: u16) -> u32 {
    u32::from(generation) << 1
}

/// Per-buffer bookkeeping: link for whichever stack holds the buffer, and state.
struct Slot {
    next: AtomicU32,
    state: AtomicU32,
}

/// Keeps the owner's hot words and the remote freers' hot words on different
/// cache lines (128 bytes: adjacent-line prefetch pairs lines on x86).
#[repr(align(128))]
struct CachePadded<T>(T);

/// Written only by the owning thread (single writer: load + store, no RMW).
struct OwnerSide {
    head: AtomicU32,
    allocs: AtomicU64,
    local_frees: AtomicU64,
    exhausted: AtomicU64,
}

/// Written by any thread.
struct RemoteSide {
    head: AtomicU32,
    remote_frees: AtomicU64,
    double_frees: AtomicU64,
}

/// A free was refused: the buffer is not allocated under that generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NotAllocated;

/// Counter snapshot, see [`crate::ClassStats`].
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Counters {
    pub(crate) allocs: u64,
    pub(crate) local_frees: u64,
    pub(crate) remote_frees: u64,
    pub(crate) exhausted: u64,
    pub(crate) double_frees: u64,
}

/// Free list of `len()` buffers, indices `0..len()`.
pub(crate) struct FreeList {
    owner: CachePadded<OwnerSide>,
    remote: CachePadded<RemoteSide>,
    slots: Box<[Slot]>,
}

#[inline]
fn bump(counter: &AtomicU64) {
    // Single writer: a load and a store, not a locked RMW.
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(1),
        Ordering::Relaxed,
    );
}

impl FreeList {
    /// All `count` buffers start free on the owner stack, lowest index on top.
    pub(crate) fn new(count: u32) -> Self {
        assert!(count < NIL, "free list capacity must be below u32::MAX");
        let slots = (0..count)
            .map(|i| Slot {
                next: AtomicU32::new(if i + 1 < count { i + 1 } else { NIL }),
                state: AtomicU32::new(free_state(0)),
            })
            .collect();
        Self {
            owner: CachePadded(OwnerSide {
                head: AtomicU32::new(if count > 0 { 0 } else { NIL }),
                allocs: AtomicU64::new(0),
                local_frees: AtomicU64::new(0),
                exhausted: AtomicU64::new(0),
            }),
            remote: CachePadded(RemoteSide {
                head: AtomicU32::new(NIL),
                remote_frees: AtomicU64::new(0),
                double_frees: AtomicU64::new(0),
            }),
            slots,
        }
    }

    /// Number of buffers (free or not) managed by this list.
    #[inline]
    pub(crate) fn len(&self) -> u32 {
        // Cannot truncate: `new` takes a u32 count.
        self.slots.len() as u32
    }

    /// Takes a free buffer; returns its index and the generation it is handed
    /// out under, or `None` when both stacks are empty.
    ///
    /// # Safety
    ///
    /// Only the single owner of this list may call `pop_owner` and
    /// [`push_owner`](Self::push_owner), and never concurrently with itself
    /// (ownership moves between threads only through a release/acquire pair).
    #[inline]
    pub(crate) unsafe fn pop_owner(&self) -> Option<(u32, u16)> {
        let owner = &self.owner.0;
        let mut head = owner.head.load(Ordering::Relaxed);
        if head == NIL {
            // Take everything other threads returned. Acquire pairs with the
            // Release CAS in `push_remote`: the links and the freers' last
            // accesses to the buffer memory happen-before our reuse.
            head = self.remote.0.head.swap(NIL, Ordering::Acquire);
            if head == NIL {
                bump(&owner.exhausted);
                return None;
            }
        }
        let slot = &self.slots[head as usize];
        owner
            .head
            .store(slot.next.load(Ordering::Relaxed), Ordering::Relaxed);
        let state = slot.state.load(Ordering::Relaxed);
        debug_assert_eq!(state & ALLOCATED, 0, "free list held an allocated buffer");
        // A plain store is enough: a concurrent (erroneous) free CASes against an
        // allocated state, which this free slot does not have, so it cannot win.
        slot.state.store(state | ALLOCATED, Ordering::Relaxed);
        bump(&owner.allocs);
        Some((head, (state >> 1) as u16))
    }

    /// Frees `index` (handed out under `generation`) onto the owner stack.
    ///
    /// # Safety
    ///
    /// As for [`pop_owner`](Self::pop_owner): caller is the single owner.
    #[inline]
    pub(crate) unsafe fn push_owner(
        &self,
        index: u32,
        generation: u16,
    ) -> Result<(), NotAllocated> {
        let slot = self.release(index, generation)?;
        let owner = &self.owner.0;
        slot.next
            .store(owner.head.load(Ordering::Relaxed), Ordering::Relaxed);
        owner.head.store(index, Ordering::Relaxed);
        bump(&owner.local_frees);
        Ok(())
    }

    /// Frees `index` (handed out under `generation`) onto the return stack.
    /// Safe from any thread, concurrently with everything else.
    #[inline]
    pub(crate) fn push_remote(&self, index: u32, generation: u16) -> Result<(), NotAllocated> {
        let slot = self.release(index, generation)?;
        let remote = &self.remote.0;
        let mut head = remote.head.load(Ordering::Relaxed);
        loop {
            slot.next.store(head, Ordering::Relaxed);
            // Release publishes `next` and our accesses to the buffer to the
            // owner's Acquire swap (later pushers' CASes continue the release
            // sequence, so earlier links stay visible too).
            match remote.head.compare_exchange_weak(
                head,
                index,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(current) => head = current,
            }
        }
        remote.remote_frees.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Flips the slot from allocated-under-`generation` to free, or reports why not.
    #[inline]
    fn release(&self, index: u32, generation: u16) -> Result<&Slot, NotAllocated> {
        let slot = self.slots.get(index as usize).ok_or(NotAllocated)?;
        match slot.state.compare_exchange(
            allocated_state(generation),
            free_state(generation.wrapping_add(1)),
            Ordering::AcqRel,
            Ordering::Relaxed,
        ) {
            Ok(_) => Ok(slot),
            Err(_) => {
                self.remote.0.double_frees.fetch_add(1, Ordering::Relaxed);
                Err(NotAllocated)
            }
        }
    }

    /// Whether `index` is currently handed out under `generation`.
    #[inline]
    pub(crate) fn is_live(&self, index: u32, generation: u16) -> bool {
        self.slots
            .get(index as usize)
            .is_some_and(|s| s.state.load(Ordering::Relaxed) == allocated_state(generation))
    }

    /// Relaxed snapshot of the counters; readable from any thread.
    pub(crate) fn counters(&self) -> Counters {
        Counters {
            allocs: self.owner.0.allocs.load(Ordering::Relaxed),
            local_frees: self.owner.0.local_frees.load(Ordering::Relaxed),
            remote_frees: self.remote.0.remote_frees.load(Ordering::Relaxed),
            exhausted: self.owner.0.exhausted.load(Ordering::Relaxed),
            double_frees: self.remote.0.double_frees.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_stack_is_lifo_and_exhausts() {
        let list = FreeList::new(3);
        // SAFETY: this test thread is the only user of `list`.
        unsafe {
            assert_eq!(list.pop_owner(), Some((0, 0)));
            assert_eq!(list.pop_owner(), Some((1, 0)));
            assert_eq!(list.pop_owner(), Some((2, 0)));
            assert_eq!(list.pop_owner(), None);
            list.push_owner(1, 0).unwrap();
            assert_eq!(list.pop_owner(), Some((1, 1)), "reuse bumps the generation");
        }
        let c = list.counters();
        assert_eq!((c.allocs, c.local_frees, c.exhausted), (4, 1, 1));
    }

    #[test]
    fn return_stack_is_taken_whole_when_owner_stack_is_empty() {
        let list = FreeList::new(2);
        // SAFETY: this test thread is the only owner of `list`.
        unsafe {
            let a = list.pop_owner().unwrap();
            let b = list.pop_owner().unwrap();
            list.push_remote(a.0, a.1).unwrap();
            list.push_remote(b.0, b.1).unwrap();
            assert_eq!(list.pop_owner(), Some((b.0, 1)));
            assert_eq!(list.pop_owner(), Some((a.0, 1)));
            assert_eq!(list.pop_owner(), None);
        }
    }

    #[test]
    fn stale_generation_and_double_free_are_refused() {
        let list = FreeList::new(1);
        // SAFETY: this test thread is the only owner of `list`.
        unsafe {
            let (i, g) = list.pop_owner().unwrap();
            list.push_owner(i, g).unwrap();
            assert_eq!(list.push_owner(i, g), Err(NotAllocated));
            assert_eq!(list.push_remote(i, g), Err(NotAllocated));
            let (i2, g2) = list.pop_owner().unwrap();
            assert_eq!(i2, i);
            assert_eq!(list.push_remote(i, g), Err(NotAllocated), "stale handle");
            assert!(list.is_live(i, g2));
            assert_eq!(list.push_owner(7, g2), Err(NotAllocated), "out of range");
            list.push_remote(i2, g2).unwrap();
        }
        assert_eq!(
            list.counters().double_frees,
            3,
            "out of range is not a double free"
        );
    }
}
