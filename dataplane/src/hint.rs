//! CPU hints for the hot path.

/// Asks the CPU to start fetching the cache line at `addr` into all cache
/// levels, so that a later access finds it there. A hint only: it changes
/// no state a program can observe, and does nothing on targets without a
/// prefetch instruction.
#[inline(always)]
pub fn prefetch(addr: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is an architectural no-op: it loads nothing into a
    // register, never faults (not even for an unmapped or null address) and
    // writes nothing, so it is sound for any pointer value; SSE, the only
    // feature it needs, is part of the x86-64 baseline.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(addr as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}
