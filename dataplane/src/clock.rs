//! How often a busy-polling loop may read the clock.
//!
//! Workers and clients read the monotonic clock only every so many idle
//! polls (their timers, [MS-SMBD] 3.1.6 and the 1 ms timer scan, are far
//! coarser than a poll). Where `clock_gettime` is served by the vDSO a
//! read costs tens of nanoseconds, about one idle poll, and every 16 polls
//! keeps the loop's time within a microsecond. Where it is not (a guest
//! whose clocksource is the HPET or the ACPI PM timer: every read is a
//! system call plus an emulated device read, microseconds under TCG) a
//! read every 16 polls made the loop spend most of its idle time in the
//! clock and answer completions late: the Soft-RoCE guest's `send` bench
//! made about 11 clock system calls per round trip, perftest's
//! `ib_send_lat` one. [`idle_polls_per_read`] scales the interval by the
//! measured cost of a read, so reading stays a small share of the loop.

use std::sync::OnceLock;
use std::time::Instant;

/// Batches of reads timed once per process; the cheapest batch counts (a
/// batch the scheduler interrupted is not the clock's cost).
const BATCHES: u32 = 8;
/// Reads per batch.
const SAMPLES: u32 = 8;
/// A read at or below this cost (a vDSO read) keeps the base interval.
const CHEAP_READ_NS: u64 = 100;
/// The most an interval is stretched (a read of ~6 µs or more).
const MAX_STRETCH: u64 = 64;

/// Nanoseconds one `Instant::now()` costs on this machine, measured once.
pub fn read_cost_ns() -> u64 {
    static COST: OnceLock<u64> = OnceLock::new();
    *COST.get_or_init(|| {
        (0..BATCHES)
            .map(|_| {
                let start = Instant::now();
                let mut last = start;
                for _ in 0..SAMPLES {
                    last = std::hint::black_box(Instant::now());
                }
                last.duration_since(start).as_nanos() as u64 / u64::from(SAMPLES)
            })
            .min()
            .unwrap_or(0)
    })
}

/// Idle polls between clock reads for a loop whose base interval (with a
/// vDSO clock) is `base`: `base` while a read costs at most ~100 ns, else
/// stretched in proportion to the read's cost (up to 64 times), so the
/// time spent reading the clock stays about what it is with a vDSO clock.
/// Timers then lag by up to that many idle polls: microseconds to a
/// millisecond, against timers of a millisecond and more.
pub fn idle_polls_per_read(base: u32) -> u32 {
    stretch(base, read_cost_ns())
}

fn stretch(base: u32, cost_ns: u64) -> u32 {
    if cost_ns <= CHEAP_READ_NS {
        return base;
    }
    let factor = cost_ns.div_ceil(CHEAP_READ_NS).min(MAX_STRETCH);
    u32::try_from(u64::from(base) * factor).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cheap_clocks_keep_the_base_interval_and_costly_ones_stretch_it_up_to_a_cap() {
        assert_eq!(stretch(16, 25), 16);
        assert_eq!(stretch(16, 100), 16);
        assert_eq!(stretch(16, 250), 48);
        assert_eq!(stretch(16, 1_000), 160);
        assert_eq!(stretch(16, 50_000), 16 * 64);
        assert_eq!(stretch(u32::MAX, 50_000), u32::MAX);
    }

    #[test]
    fn the_measured_cost_is_stable_and_the_interval_never_shrinks() {
        let c = read_cost_ns();
        assert_eq!(read_cost_ns(), c, "measured once");
        assert!(idle_polls_per_read(16) >= 16);
    }
}
