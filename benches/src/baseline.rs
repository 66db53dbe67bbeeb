//! Same-run baselines the benchmarks report ratios against: the hardware
//! floor for a cross-core round trip (two pinned threads bouncing one cache
//! line) and memcpy of the same size as an RDMA transfer.

use hdrhistogram::Histogram;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[repr(align(128))]
struct Line(AtomicU64);

/// Pins the calling thread to `core` if possible; returns whether it worked.
pub fn pin(core: usize) -> bool {
    core_affinity::set_for_current(core_affinity::CoreId { id: core })
}

/// Round-trip latency (ns) of a cache line bounced between two threads
/// pinned to `cores`: the requester writes `2k+1`, the responder answers
/// `2k+2`. Runs `warmup` then `duration`.
pub fn cacheline_pingpong(
    cores: (usize, usize),
    warmup: Duration,
    duration: Duration,
) -> Histogram<u64> {
    let line = Arc::new(Line(AtomicU64::new(0)));
    let stop = Arc::new(AtomicBool::new(false));
    let responder = {
        let line = line.clone();
        let stop = stop.clone();
        std::thread::Builder::new()
            .name("pingpong-resp".into())
            .spawn(move || {
                pin(cores.1);
                let mut expect = 1u64;
                while !stop.load(Ordering::Relaxed) {
                    if line.0.load(Ordering::Acquire) == expect {
                        line.0.store(expect + 1, Ordering::Release);
                        expect += 2;
                    } else {
                        std::hint::spin_loop();
                    }
                }
            })
            .expect("spawn responder")
    };
    pin(cores.0);
    let mut hist =
        Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3).expect("histogram bounds");
    let start = Instant::now();
    let mut measuring = false;
    let mut v = 0u64;
    loop {
        let el = start.elapsed();
        if el >= warmup + duration {
            break;
        }
        if !measuring && el >= warmup {
            measuring = true;
            hist.reset();
        }
        let t0 = Instant::now();
        line.0.store(v + 1, Ordering::Release);
        // Bounded wait: a responder that cannot run (descheduled on a
        // shared core) shows up as latency, not a hang.
        while line.0.load(Ordering::Acquire) != v + 2 {
            std::hint::spin_loop();
        }
        v += 2;
        hist.saturating_record(t0.elapsed().as_nanos().max(1) as u64);
    }
    stop.store(true, Ordering::Relaxed);
    // Unblock a responder waiting for the next odd value.
    line.0.store(u64::MAX, Ordering::Release);
    let _ = responder.join();
    hist
}

/// A page-aligned heap buffer (both memcpy operands are page-aligned, as
/// registered RDMA buffers are; two back-to-back `Vec`s would instead make
/// loads alias in-flight stores and understate memcpy).
struct PageBuf {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl PageBuf {
    fn new(len: usize) -> Self {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 4096).expect("valid layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "allocation of {len} bytes failed");
        PageBuf { ptr, layout }
    }
    fn slice_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr is a live allocation of layout.size() initialised bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for PageBuf {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `new`.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// memcpy throughput in bytes per second for `size`-byte copies between two
/// page-aligned buffers (warm in cache for small sizes, as an RDMA loopback
/// would be).
pub fn memcpy_throughput(size: usize, duration: Duration) -> f64 {
    let mut src = PageBuf::new(size);
    let mut dst = PageBuf::new(size);
    for (i, b) in src.slice_mut().iter_mut().enumerate() {
        *b = i as u8;
    }
    let start = Instant::now();
    let mut bytes = 0u64;
    while start.elapsed() < duration {
        for _ in 0..16 {
            let s = std::hint::black_box(&mut src).slice_mut()[..size].as_ptr();
            let d = dst.slice_mut();
            // SAFETY: two distinct live allocations of at least `size` bytes.
            unsafe { std::ptr::copy_nonoverlapping(s, d.as_mut_ptr(), size) };
            std::hint::black_box(&mut dst);
            bytes += size as u64;
        }
    }
    bytes as f64 / start.elapsed().as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn baselines_measure_something() {
        let h = cacheline_pingpong((0, 1), Duration::ZERO, Duration::from_millis(20));
        assert!(!h.is_empty());
        assert!(memcpy_throughput(4096, Duration::from_millis(10)) > 0.0);
    }
}
