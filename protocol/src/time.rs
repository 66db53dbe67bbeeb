//! Time as an input. The protocol core never reads a clock: callers pass the
//! current [`Instant`] into every event handler, and tests drive a fake clock.

use core::ops::{Add, Sub};

/// A monotonic point in time, in nanoseconds since an arbitrary origin chosen
/// by the caller (the data plane uses a per-process monotonic origin; tests
/// start at zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(u64);

impl Instant {
    /// The origin.
    pub const ZERO: Instant = Instant(0);

    /// An instant `nanos` nanoseconds after the origin.
    pub const fn from_nanos(nanos: u64) -> Self {
        Instant(nanos)
    }

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Time elapsed from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_since(self, earlier: Instant) -> Duration {
        Duration(self.0.saturating_sub(earlier.0))
    }
}

/// A span of time in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration(u64);

impl Duration {
    /// Zero length.
    pub const ZERO: Duration = Duration(0);

    /// From nanoseconds.
    pub const fn from_nanos(n: u64) -> Self {
        Duration(n)
    }
    /// From microseconds.
    pub const fn from_micros(us: u64) -> Self {
        Duration(us.saturating_mul(1_000))
    }
    /// From milliseconds.
    pub const fn from_millis(ms: u64) -> Self {
        Duration(ms.saturating_mul(1_000_000))
    }
    /// From seconds.
    pub const fn from_secs(s: u64) -> Self {
        Duration(s.saturating_mul(1_000_000_000))
    }
    /// In nanoseconds.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }
    /// In whole milliseconds.
    pub const fn as_millis(self) -> u64 {
        self.0 / 1_000_000
    }
    /// In seconds, as a float (for reporting).
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        Instant(self.0.saturating_add(d.0))
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    fn sub(self, earlier: Instant) -> Duration {
        self.saturating_since(earlier)
    }
}

impl From<core::time::Duration> for Duration {
    fn from(d: core::time::Duration) -> Self {
        Duration(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }
}

impl From<Duration> for core::time::Duration {
    fn from(d: Duration) -> Self {
        core::time::Duration::from_nanos(d.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instant_arithmetic_saturates() {
        let t = Instant::from_nanos(5);
        assert_eq!(
            t + Duration::from_nanos(u64::MAX),
            Instant::from_nanos(u64::MAX)
        );
        assert_eq!(Instant::ZERO - t, Duration::ZERO);
        assert_eq!(t - Instant::ZERO, Duration::from_nanos(5));
        assert_eq!(Duration::from_secs(2).as_millis(), 2000);
    }
}
