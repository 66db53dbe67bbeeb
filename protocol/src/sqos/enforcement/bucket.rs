//! Token buckets in exact integer arithmetic.
//!
//! Credit is kept in *nano-units* (units × 10⁹) so that refilling for `dt`
//! nanoseconds at `rate` units per second adds exactly `dt × rate`
//! nano-units: no rounding, no drift, no floating point.
//!
//! Credit is a 64-bit integer (a bucket fits in 32 bytes, a flow's two
//! limit buckets with their shared refill instant in 48, see
//! [`FlowLimiter`]), so bursts are bounded: a burst, and a single charge,
//! count at most [`MAX_BURST`] (2³² − 1) units. That is 4.29 × 10⁹
//! normalized I/Os (32 TiB at BaseIoSize 8192) or KB per burst window;
//! limits whose burst would exceed it (above ~2 × 10¹¹ units per second
//! with the 20 ms window) are enforced with that burst, and an I/O costing
//! more is charged [`MAX_BURST`] units: neither is reachable by a real
//! worker.

use crate::sqos::client::KILOBYTE;
use crate::sqos::{normalized_io_size, DEFAULT_BASE_IO_SIZE};
use crate::time::{Duration, Instant};

const NANOS_PER_SEC: u128 = 1_000_000_000;
const NANOS: i64 = 1_000_000_000;

/// Largest burst, and largest single charge, of a bucket in units.
pub const MAX_BURST: u64 = u32::MAX as u64;

/// Burst window a [`FlowLimiter`] derives its bucket sizes from: a bucket
/// holds at most `rate × DEFAULT_BURST_WINDOW` units (at least one).
pub const DEFAULT_BURST_WINDOW: Duration = Duration::from_millis(20);

/// `rate × window`, at least 1: the burst a rate gets for a burst window.
pub fn burst_for(rate: u64, window: Duration) -> u64 {
    let b = rate as u128 * window.as_nanos() as u128 / NANOS_PER_SEC;
    (b.min(u64::MAX as u128) as u64).max(1)
}

/// A burst in units as stored: at least 1, at most [`MAX_BURST`].
#[inline]
fn clamp_burst(burst: u64) -> u32 {
    burst.clamp(1, MAX_BURST) as u32
}

// The credit arithmetic every bucket shares. Invariants: `credit ≤ burst ×
// 10⁹ ≤ MAX_BURST × 10⁹` and `credit ≥ −MAX_BURST × 10⁹` (a charge is at
// most MAX_BURST units and is taken only from a non-negative credit, or
// saturates at 0), so `cap − credit < 2 × MAX_BURST × 10⁹ < 2⁶³`: nothing
// below overflows.

/// Adds `dt × rate` nano-units, capped at the burst.
#[inline(always)]
fn refill_credit(credit: &mut i64, rate: u64, burst: u32, dt: u64) {
    let cap = burst as i64 * NANOS;
    let headroom = (cap - *credit) as u64;
    *credit += dt.saturating_mul(rate).min(headroom) as i64;
}

/// Nano-units missing for a take of `cost` (0: the take is allowed): the
/// credit must cover `min(cost, burst)`.
#[inline(always)]
fn shortfall(credit: i64, burst: u32, cost: u64) -> u64 {
    let need = cost.min(burst as u64) as i64 * NANOS;
    if credit >= need {
        0
    } else {
        (need - credit) as u64
    }
}

/// The instant `missing` nano-units have been earned at `rate` from `last`.
#[inline]
fn ready_at(last: Instant, missing: u64, rate: u64) -> Instant {
    last + Duration::from_nanos(missing.div_ceil(rate.max(1)))
}

/// `cost` units in nano-units, the charge capped at [`MAX_BURST`] units.
#[inline(always)]
fn nano_charge(cost: u64) -> i64 {
    cost.min(MAX_BURST) as i64 * NANOS
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
    /// Nano-units; ≤ burst × 10⁹; negative after an oversized take.
    credit: i64,
    last: Instant,
    burst: u32,
}

impl TokenBucket {
    /// An unlimited bucket.
    pub const fn unlimited(now: Instant) -> Self {
        TokenBucket {
            rate: 0,
            burst: 1,
            credit: NANOS,
            last: now,
        }
    }

    /// A bucket of `rate` units/s (0 = unlimited) and `burst` units (at
    /// least 1, at most [`MAX_BURST`]), starting full.
    pub fn new(now: Instant, rate: u64, burst: u64) -> Self {
        let burst = clamp_burst(burst);
        TokenBucket {
            rate,
            burst,
            credit: burst as i64 * NANOS,
            last: now,
        }
    }

    /// Units per second; 0 = unlimited.
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// Largest credit, in units.
    pub fn burst(&self) -> u64 {
        self.burst as u64
    }

    /// True when the rate is 0.
    pub fn is_unlimited(&self) -> bool {
        self.rate == 0
    }

    /// Whole units of credit at `now` (0 when in debt).
    pub fn available(&mut self, now: Instant) -> u64 {
        self.refill(now);
        (self.credit.max(0) / NANOS) as u64
    }

    /// Adds the credit earned since the last call, capped at the burst.
    /// A `now` earlier than the last call adds nothing.
    #[inline(always)]
    fn refill(&mut self, now: Instant) {
        let dt = now.as_nanos().saturating_sub(self.last.as_nanos());
        self.last = self.last.max(now);
        refill_credit(&mut self.credit, self.rate, self.burst, dt);
    }

    /// Credit check after a refill: `Err(when)` is the instant the take
    /// would succeed if nothing else is taken meanwhile.
    #[inline(always)]
    fn check_refilled(&self, cost: u64) -> Result<(), Instant> {
        match shortfall(self.credit, self.burst, cost) {
            0 => Ok(()),
            missing => Err(ready_at(self.last, missing, self.rate)),
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

    /// Takes `cost` units if the credit allows (see the type's admission
    /// rule), else returns when it will.
    #[inline]
    pub fn try_take(&mut self, now: Instant, cost: u64) -> Result<(), Instant> {
        if self.rate == 0 {
            return Ok(());
        }
        self.refill(now);
        self.check_refilled(cost)?;
        self.credit -= nano_charge(cost);
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
        let need = nano_charge(cost);
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
        self.burst = clamp_burst(burst);
        self.credit = self.credit.min(self.burst as i64 * NANOS);
    }
}

/// A flow's two maximum-rate buckets (normalized IOPS and KB/s) with one
/// shared refill instant, in 48 bytes: what a per-I/O admission reads and
/// writes (the scheduler keeps it in the flow's 64-byte hot record).
///
/// Equivalent to two [`TokenBucket`]s always refilled at the same instants:
/// a refill is path-independent (refilling at `t1` then `t2` gives the
/// credit a single refill at `t2` gives, both being capped at the burst),
/// and refilling an unlimited bucket changes nothing.
///
/// Rates are kept in 32 bits: a per-worker share above [`MAX_RATE`] units
/// per second (4.29 × 10⁹ normalized IOPS, or KB/s: 4 TiB/s) is enforced as
/// [`MAX_RATE`], which no worker reaches.
///
/// Credit handed out to lanes (see the scheduler's `Lane`) and not yet
/// returned is *lent*: it no longer counts as credit but still occupies the
/// bucket, whose credit is capped at `burst − lent`. So credit plus lent
/// credit never exceeds the burst, and what the flow admits through its
/// buckets and its lanes together stays within `rate × t + burst` for every
/// interval `t`, as for a single bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    last: Instant,
    iops_credit: i64,
    kbps_credit: i64,
    iops_rate: u32,
    kbps_rate: u32,
    iops_burst: u32,
    kbps_burst: u32,
    /// Units lent to lanes, normalized I/Os and KB.
    iops_lent: u32,
    kbps_lent: u32,
}

/// Largest rate a flow's [`Limits`] enforce, units per second.
pub const MAX_RATE: u64 = u32::MAX as u64;

#[inline]
fn clamp_rate(rate: u64) -> u32 {
    rate.min(MAX_RATE) as u32
}

/// Adds `dt × rate` nano-units, capped at `burst − lent` units (the credit
/// is only lowered to that cap by a rate change, never by a refill).
#[inline(always)]
fn refill_lent(credit: &mut i64, rate: u32, burst: u32, lent: u32, dt: u64) {
    let cap = (burst as i64 - lent as i64) * NANOS;
    let headroom = (cap - *credit).max(0) as u64;
    *credit += dt.saturating_mul(rate as u64).min(headroom) as i64;
}

/// Whole units of `credit` (0 when in debt).
#[inline(always)]
fn whole_units(credit: i64) -> u64 {
    (credit.max(0) / NANOS) as u64
}

impl Limits {
    /// Full buckets for `rates` with bursts from `burst_window`.
    pub(crate) fn new(now: Instant, rates: FlowRates, burst_window: Duration) -> Self {
        let (ir, kr) = (clamp_rate(rates.max_iops), clamp_rate(rates.max_kbps));
        let ib = clamp_burst(burst_for(ir as u64, burst_window));
        let kb = clamp_burst(burst_for(kr as u64, burst_window));
        Limits {
            last: now,
            iops_credit: ib as i64 * NANOS,
            kbps_credit: kb as i64 * NANOS,
            iops_rate: ir,
            kbps_rate: kr,
            iops_burst: ib,
            kbps_burst: kb,
            iops_lent: 0,
            kbps_lent: 0,
        }
    }

    #[inline(always)]
    fn refill(&mut self, now: Instant) {
        let dt = now.as_nanos().saturating_sub(self.last.as_nanos());
        self.last = self.last.max(now);
        refill_lent(
            &mut self.iops_credit,
            self.iops_rate,
            self.iops_burst,
            self.iops_lent,
            dt,
        );
        refill_lent(
            &mut self.kbps_credit,
            self.kbps_rate,
            self.kbps_burst,
            self.kbps_lent,
            dt,
        );
    }

    /// Admits an I/O costing `ios` normalized I/Os and `kb` KB at `now`,
    /// charging both buckets, or returns the instant it would be admitted.
    /// The credit must cover `min(cost, burst − lent)` (at least 1 unit).
    #[inline(always)]
    pub(crate) fn try_take(&mut self, now: Instant, ios: u64, kb: u64) -> Result<(), Instant> {
        if self.iops_rate == 0 && self.kbps_rate == 0 {
            return Ok(());
        }
        self.refill(now);
        let a = if self.iops_rate == 0 {
            0
        } else {
            shortfall(
                self.iops_credit,
                avail_burst(self.iops_burst, self.iops_lent),
                ios,
            )
        };
        let b = if self.kbps_rate == 0 {
            0
        } else {
            shortfall(
                self.kbps_credit,
                avail_burst(self.kbps_burst, self.kbps_lent),
                kb,
            )
        };
        if a == 0 && b == 0 {
            if self.iops_rate != 0 {
                self.iops_credit -= nano_charge(ios);
            }
            if self.kbps_rate != 0 {
                self.kbps_credit -= nano_charge(kb);
            }
            return Ok(());
        }
        Err(self.blocked_until(a, b))
    }

    #[cold]
    fn blocked_until(&self, a: u64, b: u64) -> Instant {
        let at = |missing: u64, rate: u32| {
            (missing > 0).then(|| ready_at(self.last, missing, rate as u64))
        };
        match (at(a, self.iops_rate), at(b, self.kbps_rate)) {
            (Some(x), Some(y)) => x.max(y),
            (Some(x), None) | (None, Some(x)) => x,
            (None, None) => self.last,
        }
    }

    /// Lends up to `want_ios` normalized I/Os and `want_kb` KB of the credit
    /// there is (whole units, after the refill the last
    /// [`try_take`](Self::try_take) did) to a lane; returns what was lent:
    /// nothing when either part would be nothing (a lane needs both). An
    /// unlimited bucket lends what is asked and tracks nothing.
    #[inline]
    pub(crate) fn lend(&mut self, want_ios: u32, want_kb: u32) -> (u32, u32) {
        let have = |rate: u32, credit: i64, want: u32| {
            if rate == 0 {
                want
            } else {
                whole_units(credit).min(want as u64) as u32
            }
        };
        let ios = have(self.iops_rate, self.iops_credit, want_ios);
        let kb = have(self.kbps_rate, self.kbps_credit, want_kb);
        if ios == 0 || kb == 0 {
            return (0, 0);
        }
        if self.iops_rate != 0 {
            self.iops_credit -= ios as i64 * NANOS;
            self.iops_lent = self.iops_lent.saturating_add(ios);
        }
        if self.kbps_rate != 0 {
            self.kbps_credit -= kb as i64 * NANOS;
            self.kbps_lent = self.kbps_lent.saturating_add(kb);
        }
        (ios, kb)
    }

    /// A lane returns a loan of `lent` (as [`lend`](Self::lend) returned
    /// it) of which `unused` was not spent: the loan ends and the unused
    /// units are credit again.
    #[inline]
    pub(crate) fn repay(&mut self, lent: (u32, u32), unused: (u32, u32)) {
        if self.iops_rate != 0 {
            self.iops_lent = self.iops_lent.saturating_sub(lent.0);
            self.iops_credit += unused.0 as i64 * NANOS;
        }
        if self.kbps_rate != 0 {
            self.kbps_lent = self.kbps_lent.saturating_sub(lent.1);
            self.kbps_credit += unused.1 as i64 * NANOS;
        }
    }

    /// Credit a lane held past the end of its loan (the loans were ended
    /// with [`end_loans`](Self::end_loans)) comes back, capped as a refill
    /// is.
    #[inline]
    pub(crate) fn restore(&mut self, unused: (u32, u32)) {
        if self.iops_rate != 0 {
            refill_lent(
                &mut self.iops_credit,
                1,
                self.iops_burst,
                self.iops_lent,
                unused.0 as u64 * NANOS as u64,
            );
        }
        if self.kbps_rate != 0 {
            refill_lent(
                &mut self.kbps_credit,
                1,
                self.kbps_burst,
                self.kbps_lent,
                unused.1 as u64 * NANOS as u64,
            );
        }
    }

    /// Every loan ends (the lanes holding one can no longer spend it).
    #[inline]
    pub(crate) fn end_loans(&mut self) {
        self.iops_lent = 0;
        self.kbps_lent = 0;
    }

    /// The rates, units per second (0: unlimited).
    #[inline]
    pub(crate) fn rates(&self) -> (u32, u32) {
        (self.iops_rate, self.kbps_rate)
    }

    /// New rates from `now` on, bursts from `burst_window` (credit earned
    /// until `now` settled at the old rates, then clamped to the new
    /// bursts less what is lent: no burst on a change).
    pub(crate) fn set_rates(&mut self, now: Instant, rates: FlowRates, burst_window: Duration) {
        self.refill(now);
        self.iops_rate = clamp_rate(rates.max_iops);
        self.iops_burst = clamp_burst(burst_for(self.iops_rate as u64, burst_window));
        self.iops_credit = self
            .iops_credit
            .min((self.iops_burst as i64 - self.iops_lent as i64) * NANOS);
        self.kbps_rate = clamp_rate(rates.max_kbps);
        self.kbps_burst = clamp_burst(burst_for(self.kbps_rate as u64, burst_window));
        self.kbps_credit = self
            .kbps_credit
            .min((self.kbps_burst as i64 - self.kbps_lent as i64) * NANOS);
    }

    /// The normalized-IOPS bucket as a [`TokenBucket`].
    pub(crate) fn iops_bucket(&self) -> TokenBucket {
        TokenBucket {
            rate: self.iops_rate as u64,
            credit: self.iops_credit,
            last: self.last,
            burst: self.iops_burst,
        }
    }

    /// The KB/s bucket as a [`TokenBucket`].
    pub(crate) fn kbps_bucket(&self) -> TokenBucket {
        TokenBucket {
            rate: self.kbps_rate as u64,
            credit: self.kbps_credit,
            last: self.last,
            burst: self.kbps_burst,
        }
    }
}

/// The burst a take may need: `burst − lent`, at least 1 unit.
#[inline(always)]
fn avail_burst(burst: u32, lent: u32) -> u32 {
    burst.saturating_sub(lent).max(1)
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
    limits: Limits,
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
            limits: Limits::new(now, rates, burst_window),
            base_io_size,
            burst_window,
        }
    }

    /// Admits an I/O of `bytes` at `now`, charging both buckets, or returns
    /// the instant it would be admitted.
    #[inline]
    pub fn try_take(&mut self, now: Instant, bytes: u64) -> Result<(), Instant> {
        self.limits
            .try_take(now, io_cost(bytes, self.base_io_size), kb_cost(bytes))
    }

    /// New rates from `now` on (bursts re-derived from the burst window,
    /// credit clamped: no burst on a change).
    pub fn set_rates(&mut self, now: Instant, rates: FlowRates) {
        self.limits.set_rates(now, rates, self.burst_window);
    }

    /// The normalized-IOPS bucket (a copy).
    pub fn iops_bucket(&self) -> TokenBucket {
        self.limits.iops_bucket()
    }

    /// The KB/s bucket (a copy).
    pub fn kbps_bucket(&self) -> TokenBucket {
        self.limits.kbps_bucket()
    }

    /// BaseIoSize used for the normalized cost.
    pub fn base_io_size(&self) -> u32 {
        self.base_io_size
    }
}
