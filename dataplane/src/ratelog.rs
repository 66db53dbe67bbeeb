//! Log lines for conditions that can repeat as fast as requests arrive (a
//! refused connection, a full store, an empty buffer class, a peer that
//! keeps misbehaving): at most one line per kind per interval, each saying
//! how many occurrences were not logged since the previous line, so an
//! operator sees that the condition persists and how often, and a peer (or
//! a burst of load) cannot flood the log.
//!
//! The caller owns one [`RateLimited`] per kind of line and asks it on
//! every occurrence; nothing here prints, allocates or reads a clock, so it
//! serves the control plane and a worker's upper layer alike.

use std::time::{Duration, Instant};

/// How often a line of one kind may be printed, for pressure conditions
/// the control plane reports (refused connections, exhausted pools, full
/// stores, refused negotiations).
pub const PRESSURE_LOG_INTERVAL: Duration = Duration::from_secs(5);

/// One kind of log line, printed at most once per interval.
#[derive(Debug, Clone, Copy)]
pub struct RateLimited {
    interval: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl RateLimited {
    /// A kind printed at most once per `interval`.
    pub const fn new(interval: Duration) -> Self {
        RateLimited {
            interval,
            last: None,
            suppressed: 0,
        }
    }

    /// `count` occurrences at `now`: `Some(n)` when a line is due (print
    /// it, saying `n` earlier occurrences were not logged), `None` when
    /// they are counted towards the next line instead.
    pub fn hit_n(&mut self, now: Instant, count: u64) -> Option<u64> {
        if count == 0 {
            return None;
        }
        match self.last {
            Some(t) if now.saturating_duration_since(t) < self.interval => {
                self.suppressed += count;
                None
            }
            _ => {
                self.last = Some(now);
                // The occurrences of this line beyond the first are not
                // logged individually either.
                Some(std::mem::take(&mut self.suppressed) + count - 1)
            }
        }
    }

    /// One occurrence at `now` (see [`RateLimited::hit_n`]).
    pub fn hit(&mut self, now: Instant) -> Option<u64> {
        self.hit_n(now, 1)
    }

    /// Occurrences not logged yet, once an interval has passed since the
    /// last line: the closing summary of a condition that stopped (or a
    /// periodic one of a condition that continues without a new line).
    /// Taking it starts a new interval.
    pub fn summary_due(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(t) if self.suppressed > 0 && now.saturating_duration_since(t) >= self.interval => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
            _ => None,
        }
    }

    /// Occurrences not logged yet, whenever asked (the last word before
    /// exiting).
    pub fn take_pending(&mut self) -> u64 {
        std::mem::take(&mut self.suppressed)
    }
}

/// " (N more since the last such line)" when `n > 0`, else nothing: the
/// suffix of a rate-limited line.
pub fn suppressed_note(n: u64) -> String {
    if n == 0 {
        String::new()
    } else {
        format!(" ({n} more since the last such line)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_and_every_occurrence_is_counted() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut r = RateLimited::new(Duration::from_secs(1));
        // 48 occurrences in 2.6 s: a line at 0, 1.0 and 2.0 s.
        let mut lines = Vec::new();
        for i in 0..48u64 {
            if let Some(n) = r.hit(ms(i * 55)) {
                lines.push((i * 55, n));
            }
        }
        assert_eq!(
            lines.iter().map(|l| l.0).collect::<Vec<_>>(),
            [0, 1045, 2090]
        );
        // Each line counts what the previous one did not log.
        assert_eq!(lines.iter().map(|l| l.1).collect::<Vec<_>>(), [0, 18, 18]);
        // The rest comes in the summary, an interval after the last line.
        assert_eq!(r.summary_due(ms(2600)), None);
        let summary = r.summary_due(ms(3090));
        assert_eq!(summary, Some(9));
        assert_eq!(r.summary_due(ms(9000)), None);
        // Nothing lost: every occurrence is a line or counted in one.
        let logged: u64 = lines.iter().map(|l| 1 + l.1).sum::<u64>() + summary.unwrap_or(0);
        assert_eq!(logged, 48);
    }

    #[test]
    fn counted_batches_report_all_but_the_one_printed() {
        let t0 = Instant::now();
        let mut r = RateLimited::new(Duration::from_secs(5));
        assert_eq!(r.hit_n(t0, 0), None);
        assert_eq!(r.hit_n(t0, 7), Some(6));
        assert_eq!(r.hit_n(t0 + Duration::from_secs(1), 3), None);
        assert_eq!(r.hit_n(t0 + Duration::from_secs(5), 2), Some(4));
        assert_eq!(suppressed_note(0), "");
        assert_eq!(suppressed_note(4), " (4 more since the last such line)");
    }
}
