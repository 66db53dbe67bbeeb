//! `--plot FILE.svg`: the latency-by-percentile plot, drawn as a
//! self-contained SVG. Like the HdrHistogram plotter, the x axis is the
//! percentile on a log scale of 1/(1-percentile) (0 %, 90 %, 99 %, 99.9 %
//! ... equally spaced) and the y axis latency in microseconds, linear from
//! zero.

use super::hgrm::{NS_PER_US, TICKS_PER_HALF_DISTANCE};
use hdrhistogram::Histogram;
use std::fmt::Write as _;

const WIDTH: f64 = 900.0;
const HEIGHT: f64 = 540.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 30.0;
const TOP: f64 = 60.0;
const BOTTOM: f64 = 70.0;

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A "nice" upper bound and step for an axis whose data reach `max`.
fn nice_axis(max: f64) -> (f64, f64) {
    let max = if max > 0.0 { max } else { 1.0 };
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    ((max / step).ceil() * step, step)
}

fn percentile_label(decades: u32) -> String {
    match decades {
        0 => "0%".into(),
        1 => "90%".into(),
        2 => "99%".into(),
        d => format!("99.{}%", "9".repeat(d as usize - 2)),
    }
}

/// The SVG document for `h` (ns) titled `title`.
pub fn svg(h: &Histogram<u64>, title: &str) -> String {
    // Decades of 1/(1-p) shown: enough for the sample count, 2..=6.
    let decades = if h.len() > 1 {
        ((h.len() as f64).log10().ceil() as u32).clamp(2, 6)
    } else {
        2
    };
    let x_max = f64::from(decades);
    let mut points: Vec<(f64, f64)> = Vec::new();
    if !h.is_empty() {
        for v in h.iter_quantiles(TICKS_PER_HALF_DISTANCE) {
            let q = v.quantile_iterated_to();
            let x = if q < 1.0 {
                (1.0 / (1.0 - q)).log10().min(x_max)
            } else {
                x_max
            };
            points.push((x, v.value_iterated_to() as f64 / NS_PER_US));
        }
    }
    let y_data = points.iter().map(|p| p.1).fold(0.0, f64::max);
    let (y_max, y_step) = nice_axis(y_data);
    let pw = WIDTH - LEFT - RIGHT;
    let ph = HEIGHT - TOP - BOTTOM;
    let sx = |x: f64| LEFT + x / x_max * pw;
    let sy = |y: f64| TOP + ph - y / y_max * ph;

    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" font-family=\"sans-serif\" font-size=\"13\">"
    );
    let _ = writeln!(s, "<title>{}</title>", escape(title));
    let _ = writeln!(s, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>");
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"30\" text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\">{}</text>",
        WIDTH / 2.0,
        escape(title)
    );
    // Grid and tick labels.
    for d in 0..=decades {
        let x = sx(f64::from(d));
        let _ = writeln!(
            s,
            "<line x1=\"{x:.1}\" y1=\"{TOP}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#ddd\"/>",
            TOP + ph
        );
        let _ = writeln!(
            s,
            "<text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            TOP + ph + 20.0,
            percentile_label(d)
        );
    }
    let mut y = 0.0;
    while y <= y_max + y_step / 2.0 {
        let py = sy(y);
        let _ = writeln!(
            s,
            "<line x1=\"{LEFT}\" y1=\"{py:.1}\" x2=\"{:.1}\" y2=\"{py:.1}\" stroke=\"#ddd\"/>",
            LEFT + pw
        );
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            LEFT - 8.0,
            py + 4.0,
            format_tick(y, y_step)
        );
        y += y_step;
    }
    // Axes and their labels.
    let _ = writeln!(
        s,
        "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" stroke=\"black\"/>"
    );
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">Percentile</text>",
        LEFT + pw / 2.0,
        HEIGHT - 20.0
    );
    let _ = writeln!(
        s,
        "<text x=\"22\" y=\"{:.1}\" text-anchor=\"middle\" transform=\"rotate(-90 22 {:.1})\">Latency (µs)</text>",
        TOP + ph / 2.0,
        TOP + ph / 2.0
    );
    // The curve.
    let mut pts = String::new();
    for (x, v) in &points {
        let _ = write!(pts, "{:.1},{:.1} ", sx(*x), sy(*v));
    }
    let _ = writeln!(
        s,
        "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\" points=\"{}\"/>",
        pts.trim_end()
    );
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#555\">{} samples, max {:.2} µs</text>",
        LEFT + pw - 6.0,
        TOP + 16.0,
        h.len(),
        if h.is_empty() { 0.0 } else { h.max() as f64 / NS_PER_US }
    );
    s.push_str("</svg>\n");
    s
}

fn format_tick(v: f64, step: f64) -> String {
    if step >= 1.0 {
        format!("{v:.0}")
    } else if step >= 0.1 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plot_has_axes_title_and_a_curve() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).expect("bounds");
        for v in 1..=5000u64 {
            h.record(500 + v).expect("in range");
        }
        let svg = svg(&h, "send, 512 B, qd 1 <soft>");
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("<polyline"));
        assert!(svg.contains("Percentile") && svg.contains("Latency (µs)"));
        assert!(svg.contains("99.9%"));
        assert!(svg.contains("&lt;soft&gt;"));
    }

    #[test]
    fn axis_bounds_cover_the_data() {
        for max in [0.3, 1.0, 7.3, 95.0, 12_345.0] {
            let (top, step) = nice_axis(max);
            assert!(
                top >= max && step > 0.0 && top / step <= 10.0,
                "{max}: {top} {step}"
            );
        }
    }
}
