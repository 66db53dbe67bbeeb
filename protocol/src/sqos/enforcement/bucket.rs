//! Token buckets in exact integer arithmetic.
//!
//! Credit is kept in *nano-units* (units × 10⁹) so that refilling for `dt`
//! nanoseconds at `rate` units per second adds exactly `dt × rate`
//! nano-units: no rounding, no drift, no floating point.

use crate::sqos::client::KILOBYTE;
use crate::sqos::{normalized_io_size, DEFAULT_BASE_IO_SIZE};
use crate::time::{Duration, Instant};

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// Burst window a [`FlowLimiter`] derives its bucket sizes from: a bucket
/// holds at most `rate × DEFAULT_BURST_WINDOW` units (at least one).
pub const DEFAULT_BURST_WINDOW: Duration = Duration::from_millis(20);

/// `rate × window`, at least 1: the burst a rate gets for a burst window.
pub fn burst_for(rate: u64, window: Duration) -> u64 {
    let b = rate as u128 * window.as_nanos() as u128 / NANOS_PER_SEC;
    (b.min(u64::MAX as u128) as u64).max(1)
}

/// A token bucket: `rate` units per second, holding at most `burst` units.
/// A rate of 0 means unlimited (every take succeeds, no credit is tracked).
///
/// Admission rule: a take of `cost` succeeds when the credit covers
/// `min(cost, burst)`, and then charges the full `cost` (the credit may go
/// negative). So for costs ≤ burst the bucket never admits more than
/// `rate × t + burst` units over any `t`; a single take larger than the
/// burst is admitted once the bucket is full and the debt is paid back
/// before the next take (the long-run rate still holds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBucket {
    rate: u64,
    burst: u64,
    /// Nano-units; ≤ burst × 10⁹; negative after an oversized take.
    credit: i128,
    last: Instant,
}

impl TokenBucket {
    /// An unlimited bucket.
    pub const fn unlimited(now: Instant) -> Self {
        TokenBucket {
            rate: 0,
            burst: 1,
            credit: NANOS_PER_SEC as i128,
            last: now,
        }
    }

    /// A bucket of `rate` units/s (0 = unlimited) and `burst` units (at
    /// least 1), starting full.
    pub fn new(now: Instant, rate: u64, burst: u64) -> Self {
        let burst = burst.max(1);
        TokenBucket {
            rate,
            burst,
            credit: Self::nano(burst),
            last: now,
        }
    }

    #[inline(always)]
    fn nano(units: u64) -> i128 {
        units as i128 * NANOS_PER_SEC as i128
    }

    /// Units per second; 0 = unlimited.
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// Largest credit, in units.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// True when the rate is 0.
    pub fn is_unlimited(&self) -> bool {
        self.rate == 0
    }

    /// Whole units of credit at `now` (0 when in debt).
    pub fn available(&mut self, now: Instant) -> u64 {
        self.refill(now);
        (self.credit.max(0) as u128 / NANOS_PER_SEC) as u64
    }

    /// Adds the credit earned since the last call, capped at the burst.
    /// A `now` earlier than the last call adds nothing.
    #[inline(always)]
    fn refill(&mut self, now: Instant) {
        let dt = now.as_nanos().saturating_sub(self.last.as_nanos());
        self.last = self.last.max(now);
        let cap = Self::nano(self.burst);
        // credit ≤ cap, so the headroom is non-negative (and may exceed the
        // burst while in debt); u64 × u64 fits in u128, and the min with the
        // headroom fits back in i128.
        let headroom = (cap - self.credit) as u128;
        self.credit += (dt as u128 * self.rate as u128).min(headroom) as i128;
    }

    /// Credit check after a refill: `Err(when)` is the instant the take
    /// would succeed if nothing else is taken meanwhile.
    #[inline(always)]
    fn check_refilled(&self, cost: u64) -> Result<(), Instant> {
        let need = Self::nano(cost.min(self.burst));
        if self.credit >= need {
            Ok(())
        } else {
            let missing = (need - self.credit) as u128;
            let rate = self.rate.max(1) as u128;
            let wait = missing.div_ceil(rate).min(u64::MAX as u128) as u64;
            Err(self.last + Duration::from_nanos(wait))
        }
    }

    /// Would a take of `cost` succeed at `now`? Takes nothing.
    #[inline]
    pub fn check(&mut self, now: Instant, cost: u64) -> Result<(), Instant> {
        if self.rate == 0 {
            return Ok(());
        }
        self.refill(now);
        self.check_refilled(cost)
    }

    /// Charges `cost` after a successful [`TokenBucket::check`] at the same
    /// instant.
    #[inline(always)]
    fn charge(&mut self, cost: u64) {
        if self.rate != 0 {
            self.credit -= Self::nano(cost);
        }
    }

    /// Takes `cost` units if the credit allows (see the type's admission
    /// rule), else returns when it will.
    #[inline]
    pub fn try_take(&mut self, now: Instant, cost: u64) -> Result<(), Instant> {
        if self.rate == 0 {
            return Ok(());
        }
        self.refill(now);
        self.check_refilled(cost)?;
        self.credit -= Self::nano(cost);
        Ok(())
    }

    /// Charges `cost` units unconditionally but never below zero credit
    /// (used to record service that was granted for another reason, e.g.
    /// round-robin service against a reservation bucket). Returns true when
    /// the credit covered the whole cost.
    pub fn take_saturating(&mut self, now: Instant, cost: u64) -> bool {
        if self.rate == 0 {
            return true;
        }
        self.refill(now);
        let need = Self::nano(cost);
        let covered = self.credit >= need;
        self.credit = (self.credit - need).max(0);
        covered
    }

    /// Changes the rate from `now` on, keeping the burst. Credit earned
    /// until `now` is settled at the old rate; the credit stays bounded by
    /// the burst, so a change never releases a burst. Going from unlimited
    /// to limited starts with the credit the bucket had (at most the burst).
    pub fn set_rate(&mut self, now: Instant, rate: u64) {
        self.refill(now);
        self.rate = rate;
    }

    /// Changes rate and burst from `now` on; the credit is clamped to the
    /// new burst.
    pub fn set_limits(&mut self, now: Instant, rate: u64, burst: u64) {
        self.refill(now);
        self.rate = rate;
        self.burst = burst.max(1);
        self.credit = self.credit.min(Self::nano(self.burst));
    }
}

/// The rates a worker enforces for one flow (its share of the policy, see
/// [`super::allocate`]). Zero means "not limited" / "no reservation".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FlowRates {
    /// MaximumIoRate share, normalized IOPS.
    pub max_iops: u64,
    /// MinimumIoRate (reservation) share, normalized IOPS.
    pub min_iops: u64,
    /// MaximumBandwidth share, KB/s with KB = 1024 bytes.
    pub max_kbps: u64,
}

impl FlowRates {
    /// No limit, no reservation.
    pub const UNLIMITED: FlowRates = FlowRates {
        max_iops: 0,
        min_iops: 0,
        max_kbps: 0,
    };
}

/// Cost of an I/O of `bytes` in normalized I/Os: `ceil(bytes / base)`, at
/// least 1 (a zero-byte I/O still occupies an I/O slot).
#[inline(always)]
pub fn io_cost(bytes: u64, base_io_size: u32) -> u64 {
    normalized_io_size(bytes, base_io_size).max(1)
}

/// Cost of an I/O of `bytes` in KB (1024 bytes), rounded up.
#[inline(always)]
pub fn kb_cost(bytes: u64) -> u64 {
    bytes.div_ceil(KILOBYTE)
}

/// A flow's maximum-rate enforcement on one worker: a normalized-IOPS bucket
/// and a KB/s bucket; an I/O passes only when both allow it, and then is
/// charged to both. O(1), no allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowLimiter {
    iops: TokenBucket,
    kbps: TokenBucket,
    base_io_size: u32,
    burst_window: Duration,
}

impl FlowLimiter {
    /// A limiter for `max_iops` / `max_kbps` (0 = unlimited) with
    /// BaseIoSize 8192 and the [`DEFAULT_BURST_WINDOW`].
    pub fn new(now: Instant, rates: FlowRates) -> Self {
        Self::with_params(now, rates, DEFAULT_BASE_IO_SIZE, DEFAULT_BURST_WINDOW)
    }

    /// As [`FlowLimiter::new`] with an explicit BaseIoSize (0 = 8192) and
    /// burst window.
    pub fn with_params(
        now: Instant,
        rates: FlowRates,
        base_io_size: u32,
        burst_window: Duration,
    ) -> Self {
        let base_io_size = if base_io_size == 0 {
            DEFAULT_BASE_IO_SIZE
        } else {
            base_io_size
        };
        FlowLimiter {
            iops: TokenBucket::new(now, rates.max_iops, burst_for(rates.max_iops, burst_window)),
            kbps: TokenBucket::new(now, rates.max_kbps, burst_for(rates.max_kbps, burst_window)),
            base_io_size,
            burst_window,
        }
    }

    /// Admits an I/O of `bytes` at `now`, charging both buckets, or returns
    /// the instant it would be admitted.
    #[inline]
    pub fn try_take(&mut self, now: Instant, bytes: u64) -> Result<(), Instant> {
        let ios = io_cost(bytes, self.base_io_size);
        let kb = kb_cost(bytes);
        let a = self.iops.check(now, ios);
        let b = self.kbps.check(now, kb);
        match (a, b) {
            (Ok(()), Ok(())) => {
                self.iops.charge(ios);
                self.kbps.charge(kb);
                Ok(())
            }
            (Err(x), Err(y)) => Err(x.max(y)),
            (Err(x), Ok(())) | (Ok(()), Err(x)) => Err(x),
        }
    }

    /// New rates from `now` on (bursts re-derived from the burst window,
    /// credit clamped: no burst on a change).
    pub fn set_rates(&mut self, now: Instant, rates: FlowRates) {
        self.iops.set_limits(
            now,
            rates.max_iops,
            burst_for(rates.max_iops, self.burst_window),
        );
        self.kbps.set_limits(
            now,
            rates.max_kbps,
            burst_for(rates.max_kbps, self.burst_window),
        );
    }

    /// The normalized-IOPS bucket.
    pub fn iops_bucket(&self) -> &TokenBucket {
        &self.iops
    }

    /// The KB/s bucket.
    pub fn kbps_bucket(&self) -> &TokenBucket {
        &self.kbps
    }

    /// BaseIoSize used for the normalized cost.
    pub fn base_io_size(&self) -> u32 {
        self.base_io_size
    }
}
