//! What a run reports: the human table and the JSON document (stable
//! fields, listed in README.md, "Benchmarks"; written by hand, no serde).

use super::runner::Measurement;
use super::smb2::FlowReport;
use std::fmt::Write as _;

/// One run's result.
#[derive(Debug)]
pub struct Report {
    /// `--workload`.
    pub workload: &'static str,
    /// Bytes per operation.
    pub size: usize,
    /// Outstanding operations per connection.
    pub queue_depth: u32,
    /// Connections.
    pub connections: usize,
    /// Provider used (`soft`, `verbs`; `none` for pingpong).
    pub provider: &'static str,
    /// `loopback` or the `--connect` address.
    pub target: String,
    /// Warm-up, seconds.
    pub warmup_s: f64,
    /// `--iterations`, if given.
    pub iterations: Option<u64>,
    /// `--rate`, if given.
    pub rate: Option<f64>,
    /// `--verify`.
    pub verify: bool,
    /// Loopback server cores (empty with `--connect`).
    pub server_cores: Vec<Option<usize>>,
    /// Client cores in use.
    pub client_cores: Vec<Option<usize>>,
    /// What was measured.
    pub m: Measurement,
    /// The SMB2 workloads' parameters and QoS flows.
    pub smb2: Option<Smb2Report>,
    /// `memcpy --file-size`: the region's bytes and the percentage of
    /// copies out of it (JSON `file_size`, `read_pct`).
    pub memcpy_span: Option<(u64, u8)>,
    /// `send`: the Connection.MaxSendSize the client negotiated ([MS-SMBD]
    /// 3.1.5.3): a message above it travels in fragments (JSON
    /// `max_send_size`).
    pub max_send_size: Option<u32>,
}

/// What the SMB2 workloads add to a report.
#[derive(Debug)]
pub struct Smb2Report {
    /// `inline` or `rdma_v1_invalidate`.
    pub channel: &'static str,
    /// `--file-size`.
    pub file_size: u64,
    /// Percentage of READs.
    pub read_pct: u8,
    /// `qos`: every flow.
    pub flows: Option<Vec<FlowReport>>,
}

/// The latency summary, microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatencyUs {
    /// Smallest.
    pub min: f64,
    /// Mean.
    pub mean: f64,
    /// 50th percentile.
    pub p50: f64,
    /// 90th.
    pub p90: f64,
    /// 99th.
    pub p99: f64,
    /// 99.9th.
    pub p999: f64,
    /// 99.99th.
    pub p9999: f64,
    /// Largest.
    pub max: f64,
}

/// A busy share (0..=1) as text, "-" when not measured (the bench table,
/// the main job's summary).
pub fn busy_text(f: Option<f64>) -> String {
    f.map_or_else(|| "-".to_string(), |f| format!("{:.1} %", f * 100.0))
}

fn cores_text(cores: &[Option<usize>]) -> String {
    if cores.is_empty() {
        return "-".into();
    }
    let v: Vec<String> = cores
        .iter()
        .map(|c| c.map_or("unpinned".into(), |c| c.to_string()))
        .collect();
    v.join(",")
}

fn cores_json(cores: &[Option<usize>]) -> String {
    let v: Vec<String> = cores
        .iter()
        .map(|c| c.map_or("null".into(), |c| c.to_string()))
        .collect();
    format!("[{}]", v.join(", "))
}

/// A JSON number (non-finite values become null).
fn num(v: f64) -> String {
    if v.is_finite() {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        "null".into()
    }
}

/// A JSON string.
fn string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl Report {
    /// Measured seconds.
    pub fn duration_s(&self) -> f64 {
        self.m.elapsed.as_secs_f64()
    }

    /// Operations per second.
    pub fn ops_per_sec(&self) -> f64 {
        let s = self.duration_s();
        if s > 0.0 {
            self.m.ops as f64 / s
        } else {
            0.0
        }
    }

    /// Payload megabytes (10^6) per second, each way.
    pub fn mb_per_sec(&self) -> f64 {
        self.ops_per_sec() * self.size as f64 / 1e6
    }

    /// Latency percentiles in microseconds (zeros when nothing was
    /// measured).
    pub fn latency_us(&self) -> LatencyUs {
        let h = &self.m.histogram;
        let us = |ns: u64| ns as f64 / 1000.0;
        if h.is_empty() {
            return LatencyUs {
                min: 0.0,
                mean: 0.0,
                p50: 0.0,
                p90: 0.0,
                p99: 0.0,
                p999: 0.0,
                p9999: 0.0,
                max: 0.0,
            };
        }
        LatencyUs {
            min: us(h.min()),
            mean: h.mean() / 1000.0,
            p50: us(h.value_at_quantile(0.50)),
            p90: us(h.value_at_quantile(0.90)),
            p99: us(h.value_at_quantile(0.99)),
            p999: us(h.value_at_quantile(0.999)),
            p9999: us(h.value_at_quantile(0.9999)),
            max: us(h.max()),
        }
    }

    /// A short description of the run ("send, 512 B, qd 1, 1 connection").
    pub fn title(&self) -> String {
        format!(
            "{}, {} B, qd {}, {} connection{} ({}){}",
            self.workload,
            self.size,
            self.queue_depth,
            self.connections,
            if self.connections == 1 { "" } else { "s" },
            self.provider,
            self.memcpy_span
                .map_or(String::new(), |(span, pct)| format!(
                    ", blocks of a {span} B region, {pct} % of the copies out of it"
                ))
        )
    }

    /// The human table.
    pub fn table(&self) -> String {
        let l = self.latency_us();
        let mut s = String::new();
        let _ = writeln!(
            s,
            "smbdirectd bench: {} against {}{}",
            self.title(),
            self.target,
            self.rate.map_or(String::new(), |r| format!(
                ", fixed rate {r} ops/s (latency from intended start)"
            ))
        );
        let _ = writeln!(
            s,
            "cores: client {}{}, server {}",
            cores_text(&self.client_cores),
            if self.m.pinned {
                ""
            } else {
                " (NOT all pinned)"
            },
            cores_text(&self.server_cores)
        );
        let _ = writeln!(
            s,
            "{} ops in {:.3} s: {:.0} ops/s, {:.2} MB/s each way",
            self.m.ops,
            self.duration_s(),
            self.ops_per_sec(),
            self.mb_per_sec()
        );
        let _ = writeln!(
            s,
            "{:<13} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            "latency (us)", "min", "p50", "p90", "p99", "p99.9", "p99.99", "max"
        );
        let _ = writeln!(
            s,
            "{:<13} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2}",
            "", l.min, l.p50, l.p90, l.p99, l.p999, l.p9999, l.max
        );
        let _ = write!(
            s,
            "credit stalls {}, errors {}, verify {}",
            self.m.credit_stalls,
            self.m.errors,
            if self.verify { "on" } else { "off" }
        );
        if let Some(m) = self.max_send_size {
            let sends = self.size.div_ceil(m.saturating_sub(24).max(1) as usize);
            let _ = write!(
                s,
                ", MaxSendSize {m} ({sends} Send{} per message)",
                if sends == 1 { "" } else { "s" }
            );
        }
        if self.m.client_busy.is_some() || self.m.server_busy.is_some() {
            let _ = write!(
                s,
                "\nbusy (loop cycles with work, measured window): client {}, server {}",
                busy_text(self.m.client_busy),
                busy_text(self.m.server_busy)
            );
        }
        if let Some(flows) = self.smb2.as_ref().and_then(|x| x.flows.as_ref()) {
            for f in flows {
                let _ = write!(
                    s,
                    "\nflow {}: limit {} IOPS, achieved {:.0} IOPS ({:.0} KB/s), status {}",
                    f.flow_id, f.limit_iops, f.achieved_iops, f.achieved_kbps, f.status
                );
            }
        }
        s
    }

    /// The JSON document.
    pub fn to_json(&self) -> String {
        let l = self.latency_us();
        let mut s = String::from("{\n");
        let mut field = |k: &str, v: String| {
            let _ = writeln!(s, "  {}: {v},", string(k));
        };
        field("workload", string(self.workload));
        field("size", self.size.to_string());
        field("queue_depth", self.queue_depth.to_string());
        field("connections", self.connections.to_string());
        field("provider", string(self.provider));
        field("target", string(&self.target));
        field("duration_s", num(self.duration_s()));
        field("warmup_s", num(self.warmup_s));
        if let Some(n) = self.iterations {
            field("iterations", n.to_string());
        }
        if let Some(r) = self.rate {
            field("rate", num(r));
        }
        field("ops", self.m.ops.to_string());
        field("ops_per_sec", num(self.ops_per_sec()));
        field("mb_per_sec", num(self.mb_per_sec()));
        field(
            "latency_us",
            format!(
                "{{\"min\": {}, \"mean\": {}, \"p50\": {}, \"p90\": {}, \"p99\": {}, \"p999\": {}, \"p9999\": {}, \"max\": {}}}",
                num(l.min),
                num(l.mean),
                num(l.p50),
                num(l.p90),
                num(l.p99),
                num(l.p999),
                num(l.p9999),
                num(l.max)
            ),
        );
        field("errors", self.m.errors.to_string());
        field("credit_stalls", self.m.credit_stalls.to_string());
        field("verify", self.verify.to_string());
        field("pinned", self.m.pinned.to_string());
        field("server_cores", cores_json(&self.server_cores));
        field("client_cores", cores_json(&self.client_cores));
        let pct = |f: Option<f64>| f.map_or("null".to_string(), |f| num(f * 100.0));
        field("client_busy_pct", pct(self.m.client_busy));
        field("server_busy_pct", pct(self.m.server_busy));
        if let Some(m) = self.max_send_size {
            field("max_send_size", m.to_string());
        }
        if let Some((span, pct)) = self.memcpy_span {
            field("file_size", span.to_string());
            field("read_pct", pct.to_string());
        }
        if let Some(x) = &self.smb2 {
            field("channel", string(x.channel));
            field("file_size", x.file_size.to_string());
            field("read_pct", x.read_pct.to_string());
            if let Some(flows) = &x.flows {
                let v: Vec<String> = flows
                    .iter()
                    .map(|f| {
                        format!(
                            "{{\"flow_id\": {}, \"limit_iops\": {}, \"achieved_iops\": {}, \"achieved_kbps\": {}, \"status\": {}}}",
                            string(&f.flow_id),
                            f.limit_iops,
                            num(f.achieved_iops),
                            num(f.achieved_kbps),
                            string(&f.status)
                        )
                    })
                    .collect();
                field("flows", format!("[{}]", v.join(", ")));
            }
        }
        // The last field has no trailing comma.
        if s.ends_with(",\n") {
            s.truncate(s.len() - 2);
            s.push('\n');
        }
        s.push_str("}\n");
        s
    }
}

#[cfg(test)]
mod tests {
    use super::super::runner::{histogram, Measurement};
    use super::*;
    use std::time::Duration;

    pub(crate) fn sample() -> Report {
        let mut h = histogram();
        for v in 1..=1000u64 {
            h.record(v * 1000).expect("in range");
        }
        Report {
            workload: "send",
            size: 512,
            queue_depth: 1,
            connections: 1,
            provider: "soft",
            target: "loopback".into(),
            warmup_s: 0.5,
            iterations: None,
            rate: Some(1000.0),
            verify: true,
            server_cores: vec![Some(1)],
            client_cores: vec![Some(0)],
            m: Measurement {
                histogram: h,
                ops: 1000,
                errors: 0,
                credit_stalls: 2,
                elapsed: Duration::from_secs(1),
                pinned: true,
                threads: 1,
                client_busy: Some(0.975),
                server_busy: None,
            },
            smb2: None,
            memcpy_span: None,
            max_send_size: None,
        }
    }

    #[test]
    fn json_has_the_documented_fields_and_no_trailing_comma() {
        let j = sample().to_json();
        for k in [
            "\"workload\": \"send\"",
            "\"size\": 512",
            "\"queue_depth\": 1",
            "\"connections\": 1",
            "\"provider\": \"soft\"",
            "\"duration_s\": 1",
            "\"ops\": 1000",
            "\"ops_per_sec\": 1000",
            "\"mb_per_sec\": 0.512",
            "\"p50\": 500",
            "\"p9999\": 1000",
            "\"errors\": 0",
            "\"credit_stalls\": 2",
            "\"verify\": true",
            "\"server_cores\": [1]",
            "\"client_cores\": [0]",
            "\"rate\": 1000",
            "\"client_busy_pct\": 97.5",
            "\"server_busy_pct\": null",
        ] {
            assert!(j.contains(k), "{k} missing from {j}");
        }
        assert!(
            j.trim_end().ends_with("]\n}") || j.trim_end().ends_with("}"),
            "{j}"
        );
        assert!(!j.contains(",\n}"), "{j}");
    }

    #[test]
    fn a_memcpy_over_a_region_says_so_in_title_and_json() {
        let mut r = sample();
        r.workload = "memcpy";
        r.memcpy_span = Some((64 << 20, 100));
        assert!(
            r.title().contains("blocks of a 67108864 B region, 100 %"),
            "{}",
            r.title()
        );
        let j = r.to_json();
        assert!(j.contains("\"file_size\": 67108864,"), "{j}");
        assert!(j.contains("\"read_pct\": 100"), "{j}");
        assert!(!j.contains(",\n}"), "{j}");
    }

    #[test]
    fn strings_are_escaped() {
        assert_eq!(string("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
        assert_eq!(num(f64::NAN), "null");
        assert_eq!(num(2.5), "2.5");
    }

    #[test]
    fn table_names_every_percentile() {
        let t = sample().table();
        for k in [
            "p50",
            "p99.99",
            "max",
            "credit stalls 2",
            "errors 0",
            "ops/s",
            "MB/s",
            "busy (loop cycles with work, measured window): client 97.5 %, server -",
        ] {
            assert!(t.contains(k), "{k} missing from {t}");
        }
    }
}
