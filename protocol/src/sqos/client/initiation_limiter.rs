//! [MS-SQOS] 3.1.7.1 Initiating Read or Write Requests for a Logical Flow:
//! "the client MUST limit the average I/O initiation rate for the logical
//! flow to the value indicated by LogicalFlow.MaximumIoRate, or ... the
//! minimum of LogicalFlow.MaximumIoRate and LogicalFlow.MaximumBandwidth".
//!
//! The two limits are in different units — MaximumIoRate in normalized IOPS
//! (one I/O of `n` bytes counts NormalizedIoSize(n) = ceil(n / BaseIoSize)),
//! MaximumBandwidth in KB/s with **KB = 1024 bytes** — so both are turned
//! into I/Os per second at the size of the I/O being started, and the
//! smaller wins (`docs/spec-notes.md`, "Initiation limit units").

use crate::sqos::{normalized_io_size, DEFAULT_BASE_IO_SIZE};
use crate::time::{Duration, Instant};

/// Bytes in the kilobyte of KilobyteCountIncrement, BandwidthLimit and
/// MaximumBandwidth.
pub const KILOBYTE: u64 = 1024;

/// [MS-SQOS] 3.1.7.1 as a pure function: how many I/Os of `io_size` bytes
/// per second the flow may start, `None` when neither limit is set (both 0).
///
/// - from MaximumIoRate: `maximum_io_rate / max(1, NormalizedIoSize(io_size))`;
/// - from MaximumBandwidth: `maximum_bandwidth * 1024 / io_size` (no limit
///   for a zero-byte I/O);
/// - the result is the minimum of those that apply.
pub fn allowed_ios_per_sec(
    maximum_io_rate: u64,
    maximum_bandwidth: u64,
    base_io_size: u32,
    io_size: u64,
) -> Option<f64> {
    let by_rate = (maximum_io_rate > 0)
        .then(|| maximum_io_rate as f64 / normalized_io_size(io_size, base_io_size).max(1) as f64);
    let by_bandwidth = (maximum_bandwidth > 0 && io_size > 0)
        .then(|| maximum_bandwidth as f64 * KILOBYTE as f64 / io_size as f64);
    match (by_rate, by_bandwidth) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Fixed-point scale of the token counts: one token (one normalized I/O, or
/// one byte) is `SCALE` units, so refilling at `r` per second adds `r` units
/// per nanosecond.
const SCALE: i128 = 1_000_000_000;

/// A token bucket enforcing [MS-SQOS] 3.1.7.1 on average: one bucket of
/// normalized I/Os refilled at MaximumIoRate per second and one of bytes
/// refilled at MaximumBandwidth × 1024 per second. An I/O may start when
/// neither bucket is in debt; starting it takes its cost from both (which
/// may put them in debt, so an I/O larger than the burst is never starved).
/// Each bucket holds at most `burst` worth of its rate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitiationLimiter {
    maximum_io_rate: u64,
    maximum_bandwidth: u64,
    base_io_size: u32,
    burst: Duration,
    io_tokens: i128,
    byte_tokens: i128,
    last_refill: Option<Instant>,
}

impl InitiationLimiter {
    /// Default burst: a tenth of a second of the allowed rate.
    pub const DEFAULT_BURST: Duration = Duration::from_millis(100);

    /// An unlimited limiter (both limits 0) with the given burst.
    pub fn new(burst: Duration) -> Self {
        InitiationLimiter {
            maximum_io_rate: 0,
            maximum_bandwidth: 0,
            base_io_size: DEFAULT_BASE_IO_SIZE,
            burst,
            io_tokens: 0,
            byte_tokens: 0,
            last_refill: None,
        }
    }

    /// Sets the limits (from a STORAGE_QOS_CONTROL_RESPONSE). Tokens already
    /// accumulated are kept, capped to the new burst.
    pub fn set_limits(&mut self, maximum_io_rate: u64, maximum_bandwidth: u64, base_io_size: u32) {
        self.maximum_io_rate = maximum_io_rate;
        self.maximum_bandwidth = maximum_bandwidth;
        self.base_io_size = if base_io_size == 0 {
            DEFAULT_BASE_IO_SIZE
        } else {
            base_io_size
        };
        self.io_tokens = self.io_tokens.min(self.io_cap());
        self.byte_tokens = self.byte_tokens.min(self.byte_cap());
    }

    /// True when at least one limit is set ([MS-SQOS] 3.1.7.1 applies only
    /// "if LogicalFlow.MaximumIoRate is greater than zero or ...
    /// LogicalFlow.MaximumBandwidth is greater than zero").
    pub fn is_limited(&self) -> bool {
        self.maximum_io_rate > 0 || self.maximum_bandwidth > 0
    }

    /// I/Os of `io_size` bytes per second allowed on average; see
    /// [`allowed_ios_per_sec`].
    pub fn allowed_ios_per_sec(&self, io_size: u64) -> Option<f64> {
        allowed_ios_per_sec(
            self.maximum_io_rate,
            self.maximum_bandwidth,
            self.base_io_size,
            io_size,
        )
    }

    fn io_per_ns(&self) -> i128 {
        i128::from(self.maximum_io_rate)
    }
    fn bytes_per_ns(&self) -> i128 {
        i128::from(self.maximum_bandwidth) * i128::from(KILOBYTE)
    }
    fn io_cap(&self) -> i128 {
        self.io_per_ns()
            .saturating_mul(i128::from(self.burst.as_nanos()))
    }
    fn byte_cap(&self) -> i128 {
        self.bytes_per_ns()
            .saturating_mul(i128::from(self.burst.as_nanos()))
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = match self.last_refill {
            // Time never runs backwards here: an earlier `now` adds nothing.
            Some(last) if now <= last => return,
            Some(last) => (now - last).as_nanos(),
            // First use: start with a full burst.
            None => self.burst.as_nanos(),
        };
        self.last_refill = Some(now);
        let dt = i128::from(elapsed);
        self.io_tokens = self
            .io_tokens
            .saturating_add(self.io_per_ns().saturating_mul(dt))
            .min(self.io_cap());
        self.byte_tokens = self
            .byte_tokens
            .saturating_add(self.bytes_per_ns().saturating_mul(dt))
            .min(self.byte_cap());
    }

    /// Asks to start one I/O of `io_size` bytes at `now`. `Ok(())` means
    /// start it (its cost has been taken); `Err(t)` means wait: it may start
    /// at `t` (ask again then).
    pub fn may_initiate(&mut self, now: Instant, io_size: u64) -> Result<(), Instant> {
        if !self.is_limited() {
            return Ok(());
        }
        self.refill(now);
        let mut wait_ns: i128 = 0;
        if self.maximum_io_rate > 0 && self.io_tokens < 0 {
            wait_ns = wait_ns.max(ceil_div(-self.io_tokens, self.io_per_ns()));
        }
        if self.maximum_bandwidth > 0 && self.byte_tokens < 0 {
            wait_ns = wait_ns.max(ceil_div(-self.byte_tokens, self.bytes_per_ns()));
        }
        if wait_ns > 0 {
            let ns = u64::try_from(wait_ns).unwrap_or(u64::MAX);
            return Err(now + Duration::from_nanos(ns));
        }
        if self.maximum_io_rate > 0 {
            let cost = i128::from(normalized_io_size(io_size, self.base_io_size).max(1))
                .saturating_mul(SCALE);
            self.io_tokens = self.io_tokens.saturating_sub(cost);
        }
        if self.maximum_bandwidth > 0 {
            self.byte_tokens = self
                .byte_tokens
                .saturating_sub(i128::from(io_size).saturating_mul(SCALE));
        }
        Ok(())
    }
}

impl Default for InitiationLimiter {
    fn default() -> Self {
        InitiationLimiter::new(InitiationLimiter::DEFAULT_BURST)
    }
}

fn ceil_div(a: i128, b: i128) -> i128 {
    if b <= 0 {
        return i128::MAX;
    }
    a / b + i128::from(a % b != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_rate_is_the_minimum_of_io_rate_and_bandwidth_in_ios() {
        // 100 normalized IOPS, 200 KB/s, 8 KiB I/Os: 100 vs 25 -> 25.
        assert_eq!(allowed_ios_per_sec(100, 200, 8192, 8192), Some(25.0));
        // 64 KiB I/Os count 8 normalized I/Os each: 100 / 8 = 12.5 vs 3.125.
        assert_eq!(allowed_ios_per_sec(100, 200, 8192, 65536), Some(3.125));
        assert_eq!(allowed_ios_per_sec(100, 0, 8192, 65536), Some(12.5));
        assert_eq!(allowed_ios_per_sec(0, 200, 8192, 1024), Some(200.0));
        assert_eq!(allowed_ios_per_sec(0, 0, 8192, 1024), None);
        assert_eq!(allowed_ios_per_sec(0, 200, 8192, 0), None);
    }

    #[test]
    fn unlimited_limiter_always_allows() {
        let mut l = InitiationLimiter::default();
        for _ in 0..1000 {
            assert_eq!(l.may_initiate(Instant::ZERO, 1 << 20), Ok(()));
        }
    }

    #[test]
    fn limiter_enforces_the_average_rate() {
        // 10 normalized IOPS with a 100 ms burst: 1 I/O of 8 KiB admitted at
        // t=0, then one every 100 ms.
        let mut l = InitiationLimiter::new(Duration::from_millis(100));
        l.set_limits(10, 0, 8192);
        let mut now = Instant::ZERO;
        let mut started = 0u32;
        while now < Instant::ZERO + Duration::from_secs(10) {
            match l.may_initiate(now, 8192) {
                Ok(()) => started += 1,
                Err(t) => {
                    assert!(t > now);
                    now = t;
                }
            }
        }
        // 10 s at 10 IOPS, plus the initial burst of one.
        assert!((100..=101).contains(&started), "{started}");
    }

    #[test]
    fn large_io_is_not_starved_by_a_small_burst() {
        let mut l = InitiationLimiter::new(Duration::from_millis(1));
        l.set_limits(0, 200, 8192); // 200 KB/s
        let t0 = Instant::ZERO;
        assert_eq!(l.may_initiate(t0, 1 << 20), Ok(()));
        // 1 MiB at 200 KiB/s: the next I/O waits about 5.12 s.
        let next = l.may_initiate(t0, 1 << 20).unwrap_err();
        let waited = next - t0;
        assert!(
            waited >= Duration::from_millis(5110) && waited <= Duration::from_millis(5130),
            "{waited:?}"
        );
        assert_eq!(l.may_initiate(next, 1 << 20), Ok(()));
    }

    #[test]
    fn huge_limits_do_not_overflow() {
        let mut l = InitiationLimiter::new(Duration::from_secs(u64::MAX / 1_000_000_000));
        l.set_limits(u64::MAX, u64::MAX, 1);
        assert_eq!(
            l.may_initiate(Instant::from_nanos(u64::MAX), u64::MAX),
            Ok(())
        );
        assert!(l
            .may_initiate(Instant::from_nanos(u64::MAX), u64::MAX)
            .is_ok());
    }
}
