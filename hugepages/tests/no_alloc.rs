//! After construction, the I/O-path operations (alloc, free from the owner
//! and from other threads, exhaustion, double free, locate, stats of one
//! class) never touch the heap.
//!
//! A counting global allocator tallies heap calls per thread, so the test
//! harness's own threads do not disturb the count.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use smbdirect_hugepages::{AllocError, BufId, ClassId, FreeError, HugepagePolicy, PoolConfig};

struct CountingAllocator;

thread_local! {
    static HEAP_CALLS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    // `try_with`: the slot may already be gone while the thread exits.
    let _ = HEAP_CALLS.try_with(|c| c.set(c.get() + 1));
}

fn heap_calls() -> u64 {
    HEAP_CALLS.with(Cell::get)
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees carry over; counting touches only a
// const-initialised thread-local `Cell`, which never allocates.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count();
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

#[test]
fn counting_allocator_sees_heap_use() {
    let before = heap_calls();
    drop(std::hint::black_box(vec![1u8; 16]));
    assert_eq!(heap_calls() - before, 2, "one alloc, one dealloc");
}

#[test]
fn alloc_and_free_do_not_touch_the_heap_after_construction() {
    let pool = PoolConfig::smbdirect(16 << 20, 2, 8192, 1364, 1 << 20)
        .hugepages(HugepagePolicy::Prefer)
        .build()
        .unwrap();
    let mut mine = pool.claim_slice(0).unwrap();
    let mut other = pool.claim_slice(1).unwrap();
    let classes = [ClassId::RECEIVE, ClassId::SEND, ClassId::RDMA];
    let most = (0..3)
        .map(|c| pool.class_layout(ClassId(c)).unwrap().per_slice)
        .max()
        .unwrap();
    let mut held: Vec<BufId> = Vec::with_capacity(most as usize);

    let before = heap_calls();
    for round in 0..3u8 {
        for class in classes {
            // Drain the class completely, touching each buffer.
            loop {
                match mine.alloc(class) {
                    Ok(id) => {
                        let loc = pool.locate(id).unwrap();
                        // SAFETY: `id` was just allocated here and is ours alone.
                        unsafe { pool.bytes_mut(id) }.unwrap()[0] = round;
                        assert!(loc.offset < pool.region_len());
                        assert_eq!(BufId::from_bits(id.to_bits()), id);
                        held.push(id);
                    }
                    Err(AllocError::Exhausted { .. }) => break,
                    Err(e) => panic!("{e:?}"),
                }
            }
            assert!(held.len() <= held.capacity());
            let stats = pool.class_stats(0, class).unwrap();
            assert_eq!(stats.free, 0);
            // Free half locally, half the way another thread would.
            for (i, id) in held.drain(..).enumerate() {
                if i % 2 == 0 {
                    mine.free(id).unwrap();
                    assert!(matches!(mine.free(id), Err(FreeError::DoubleFree { .. })));
                } else {
                    pool.free(id).unwrap();
                    assert!(matches!(pool.free(id), Err(FreeError::DoubleFree { .. })));
                }
            }
        }
        // A buffer from one slice freed through another slice's allocator.
        let id = other.alloc_len(100).unwrap();
        mine.free(id).unwrap();
        assert!(pool.locate(id).is_none());
    }
    let calls = heap_calls() - before;
    assert_eq!(calls, 0, "the I/O path made {calls} heap calls");
}
