//! `--hgrm`: the latency distribution in HdrHistogram's textual
//! "percentile distribution" format (what the reference implementation's
//! `outputPercentileDistribution` prints and the HdrHistogram plotter
//! reads): a header line, a blank line, one line per percentile step (five
//! steps per halving of the distance to 100 %) with the value, the
//! percentile as a fraction, the cumulative count and 1/(1-percentile), the
//! last (100 %) line without that column, then three `#[...]` footer lines.
//! Values are written in microseconds (recorded in nanoseconds, scaled by
//! 1000) with as many decimals as the histogram has significant digits.

use hdrhistogram::Histogram;
use std::fmt::Write as _;

/// Percentile steps per halving of the distance to 100 %.
pub const TICKS_PER_HALF_DISTANCE: u32 = 5;

/// Value scaling: nanoseconds recorded, microseconds written.
pub const NS_PER_US: f64 = 1000.0;

/// The sub-bucket count HdrHistogram derives from the significant digits
/// (the smallest power of two at least 2 * 10^digits).
fn sub_buckets(sigfig: u8) -> u64 {
    let largest = 2 * 10u64.pow(u32::from(sigfig));
    largest.next_power_of_two()
}

/// The percentile distribution of `h` (ns), values in microseconds.
pub fn percentile_distribution(h: &Histogram<u64>) -> String {
    let digits = usize::from(h.sigfig());
    let mut s = String::new();
    let _ = write!(
        s,
        "{:>12} {:>14} {:>10} {:>14}\n\n",
        "Value", "Percentile", "TotalCount", "1/(1-Percentile)"
    );
    let mut total = 0u64;
    if !h.is_empty() {
        for v in h.iter_quantiles(TICKS_PER_HALF_DISTANCE) {
            total += v.count_since_last_iteration();
            let value = v.value_iterated_to() as f64 / NS_PER_US;
            let q = v.quantile_iterated_to();
            if q < 1.0 {
                let _ = writeln!(
                    s,
                    "{value:>12.digits$} {q:>2.12} {total:>10} {:>14.2}",
                    1.0 / (1.0 - q)
                );
            } else {
                let _ = writeln!(s, "{value:>12.digits$} {q:>2.12} {total:>10}");
            }
        }
    }
    let (mean, stdev, max) = if h.is_empty() {
        (0.0, 0.0, 0.0)
    } else {
        (
            h.mean() / NS_PER_US,
            h.stdev() / NS_PER_US,
            h.highest_equivalent(h.max()) as f64 / NS_PER_US,
        )
    };
    let _ = writeln!(
        s,
        "#[Mean    = {mean:>12.digits$}, StdDeviation   = {stdev:>12.digits$}]"
    );
    let _ = writeln!(
        s,
        "#[Max     = {max:>12.digits$}, Total count    = {:>12}]",
        h.len()
    );
    let _ = writeln!(
        s,
        "#[Buckets = {:>12}, SubBuckets     = {:>12}]",
        h.buckets(),
        sub_buckets(h.sigfig())
    );
    s
}

/// One data line of a percentile distribution: (value, percentile as a
/// fraction, cumulative count). `None` for header, blank and footer lines.
pub fn parse_line(line: &str) -> Option<(f64, f64, u64)> {
    let mut cols = line.split_whitespace();
    let value = cols.next()?.parse().ok()?;
    let q = cols.next()?.parse().ok()?;
    let count = cols.next()?.parse().ok()?;
    Some((value, q, count))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distribution_is_monotone_ends_at_100_percent_and_has_the_footer() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).expect("bounds");
        for v in 1..=10_000u64 {
            h.record(v * 100).expect("in range");
        }
        let text = percentile_distribution(&h);
        let mut lines = text.lines();
        let header = lines.next().expect("header");
        assert!(header.contains("Value") && header.contains("1/(1-Percentile)"));
        assert_eq!(lines.next(), Some(""));
        let rows: Vec<(f64, f64, u64)> = text.lines().filter_map(parse_line).collect();
        assert!(rows.len() > 20, "{text}");
        for w in rows.windows(2) {
            assert!(
                w[0].0 <= w[1].0 && w[0].1 <= w[1].1 && w[0].2 <= w[1].2,
                "{w:?}"
            );
        }
        let last = rows.last().expect("rows");
        assert_eq!(last.1, 1.0);
        assert_eq!(last.2, 10_000);
        assert!((last.0 - 1000.0).abs() < 1.0, "max {} us", last.0);
        assert!(text.contains("#[Mean    ="), "{text}");
        assert!(text.contains("Total count    =        10000]"), "{text}");
        assert!(text.contains("SubBuckets     =         2048]"), "{text}");
    }

    #[test]
    fn an_empty_histogram_still_has_header_and_footer() {
        let h = Histogram::<u64>::new_with_bounds(1, 1000, 3).expect("bounds");
        let text = percentile_distribution(&h);
        assert!(text.starts_with("       Value"));
        assert!(text.contains("Total count    =            0]"));
    }
}
