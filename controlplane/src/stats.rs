//! Counters of a running server, readable from any thread, and their JSON
//! form (field names are documented in README.md, "stats --json").

use smbdirect_dataplane::planes::{WorkerStats, WorkerStatsSnapshot};
use smbdirect_hugepages::BufferPool;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Control-plane counters plus every worker's.
#[derive(Debug)]
pub struct ServerStats {
    /// Per-worker counters, by worker index.
    pub workers: Vec<Arc<WorkerStats>>,
    /// Core each worker is pinned to.
    pub worker_cores: Vec<Option<usize>>,
    /// Connection requests accepted.
    pub accepted: AtomicU64,
    /// Connection requests rejected (admission).
    pub rejected: AtomicU64,
    /// Negotiations refused with a failure response.
    pub negotiate_failures: AtomicU64,
    /// The buffer pool.
    pub pool: BufferPool,
    /// Provider name.
    pub provider: &'static str,
    /// Upper layer name.
    pub upper: &'static str,
    /// Extra provider counters (name, value), refreshed by the control plane.
    pub provider_counters: std::sync::Mutex<Vec<(&'static str, u64)>>,
    /// Storage QoS logical flows in the control plane's table.
    pub qos_flows: AtomicU64,
    /// Opens with Storage QoS state (associated to a flow).
    pub qos_opens: AtomicU64,
    /// The share's store ("mem (1 GiB)", a directory, ...).
    pub store: std::sync::Mutex<String>,
}

/// Pool class counters, summed over slices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolClassTotals {
    /// Class name.
    pub name: String,
    /// Buffer size.
    pub buf_size: usize,
    /// Buffers.
    pub total: u64,
    /// Free buffers.
    pub free: u64,
}

impl ServerStats {
    /// Sum over workers.
    pub fn totals(&self) -> WorkerStatsSnapshot {
        let mut t = WorkerStatsSnapshot::default();
        for w in &self.workers {
            t += w.snapshot();
        }
        t
    }

    /// Pool counters per class, summed over slices.
    pub fn pool_classes(&self) -> Vec<PoolClassTotals> {
        let mut out: Vec<PoolClassTotals> = Vec::new();
        for c in 0..self.pool.class_count() {
            let cid = smbdirect_hugepages::ClassId(c as u8);
            let Some(layout) = self.pool.class_layout(cid) else {
                continue;
            };
            let mut t = PoolClassTotals {
                name: layout.name.clone(),
                buf_size: layout.buf_size,
                total: 0,
                free: 0,
            };
            for s in 0..self.pool.slice_count() {
                if let Some(cs) = self.pool.class_stats(s, cid) {
                    t.total += cs.total as u64;
                    t.free += cs.free as u64;
                }
            }
            out.push(t);
        }
        out
    }

    /// The JSON document `smbdirectd stats --json` prints.
    pub fn to_json(&self) -> String {
        let mut s = String::new();
        let t = self.totals();
        let _ = write!(
            s,
            "{{\"provider\":\"{}\",\"upper\":\"{}\",",
            self.provider, self.upper
        );
        let _ = write!(
            s,
            "\"accepted\":{},\"rejected\":{},\"negotiate_failures\":{},",
            self.accepted.load(Ordering::Relaxed),
            self.rejected.load(Ordering::Relaxed),
            self.negotiate_failures.load(Ordering::Relaxed)
        );
        let _ = write!(
            s,
            "\"sessions\":{},\"opens\":{},\"flows\":{},\"qos_opens\":{},\"qos_queued\":{},",
            t.sessions,
            t.opens,
            self.qos_flows.load(Ordering::Relaxed),
            self.qos_opens.load(Ordering::Relaxed),
            t.qos_queued
        );
        if let Ok(st) = self.store.lock() {
            s.push_str("\"store\":");
            crate::qos_admin::push_json_string(&mut s, &st);
            s.push(',');
        }
        s.push_str("\"total\":");
        snapshot_json(&mut s, &t);
        s.push_str(",\"workers\":[");
        for (i, w) in self.workers.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            let core = self
                .worker_cores
                .get(i)
                .copied()
                .flatten()
                .map_or("null".to_string(), |c| c.to_string());
            let _ = write!(s, "{{\"index\":{i},\"core\":{core},\"stats\":");
            snapshot_json(&mut s, &w.snapshot());
            s.push('}');
        }
        s.push_str("],\"pool\":{");
        let _ = write!(
            s,
            "\"hugepage_backed\":{},\"region_bytes\":{},\"classes\":[",
            self.pool.is_hugepage_backed(),
            self.pool.region_len()
        );
        for (i, c) in self.pool_classes().iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            let _ = write!(
                s,
                "{{\"name\":\"{}\",\"buf_size\":{},\"total\":{},\"free\":{}}}",
                c.name, c.buf_size, c.total, c.free
            );
        }
        s.push_str("]},\"provider_counters\":{");
        if let Ok(pc) = self.provider_counters.lock() {
            for (i, (k, v)) in pc.iter().enumerate() {
                if i > 0 {
                    s.push(',');
                }
                let _ = write!(s, "\"{k}\":{v}");
            }
        }
        s.push_str("}}");
        s
    }

    /// The one-line summary printed every `--stats-interval`.
    pub fn line(&self, prev: &WorkerStatsSnapshot, secs: f64) -> String {
        let t = self.totals();
        let rate = |a: u64, b: u64| (a.saturating_sub(b)) as f64 / secs.max(1e-9);
        format!(
            "conns {} sessions {} opens {} flows {} | msgs/s in {:.0} out {:.0} | MB/s in {:.1} out {:.1} | RDMA MB/s read {:.1} written {:.1} | workers busy {} | credit stalls {} | rnr {} | errors {}",
            t.connections,
            t.sessions,
            t.opens,
            self.qos_flows.load(Ordering::Relaxed),
            rate(t.messages_in, prev.messages_in),
            rate(t.messages_out, prev.messages_out),
            rate(t.bytes_in, prev.bytes_in) / 1e6,
            rate(t.bytes_out, prev.bytes_out) / 1e6,
            // READ/WRITE payloads through RDMA channels move here, not in
            // the messages counted before
            rate(t.rdma_read_bytes, prev.rdma_read_bytes) / 1e6,
            rate(t.rdma_write_bytes, prev.rdma_write_bytes) / 1e6,
            // Summed over workers: the mean load of their cores.
            t.busy_fraction_since(prev)
                .map_or_else(|| "-".to_string(), |f| format!("{:.0} %", f * 100.0)),
            t.credit_stalls,
            t.rnr,
            t.protocol_errors + t.rdma_errors
        )
    }
}

fn snapshot_json(s: &mut String, t: &WorkerStatsSnapshot) {
    let _ = write!(
        s,
        "{{\"connections\":{},\"connections_total\":{},\"messages_in\":{},\"messages_out\":{},\"bytes_in\":{},\"bytes_out\":{},\"credit_stalls\":{},\"rnr\":{},\"protocol_errors\":{},\"rdma_errors\":{},\"pool_stalls\":{},\"store_full\":{},\"store_copies_away\":{},\"store_copies_kept\":{},\"timeouts\":{},\"sessions\":{},\"opens\":{},\"qos_queued\":{},\"idle_sleeps\":{},\"rdma_read_bytes\":{},\"rdma_write_bytes\":{},\"rdma_posts\":{},\"replies_chained\":{},\"rdma_table_waits\":{},\"busy_cycles\":{},\"idle_cycles\":{}}}",
        t.connections,
        t.connections_total,
        t.messages_in,
        t.messages_out,
        t.bytes_in,
        t.bytes_out,
        t.credit_stalls,
        t.rnr,
        t.protocol_errors,
        t.rdma_errors,
        t.pool_stalls,
        t.store_full,
        t.store_copies_away,
        t.store_copies_kept,
        t.timeouts,
        t.sessions,
        t.opens,
        t.qos_queued,
        t.idle_sleeps,
        t.rdma_read_bytes,
        t.rdma_write_bytes,
        t.rdma_posts,
        t.replies_chained,
        t.rdma_table_waits,
        t.busy_cycles,
        t.idle_cycles
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use smbdirect_hugepages::{HugepagePolicy, PoolConfig, SizeClass};

    #[test]
    fn the_periodic_line_shows_rdma_rates_beside_message_rates() {
        let pool = PoolConfig::new(1 << 20, 1)
            .class(SizeClass::new("send", 4096).per_slice(4))
            .hugepages(HugepagePolicy::Disable)
            .mlock(false)
            .build()
            .expect("a small pool");
        let workers: Vec<Arc<WorkerStats>> = (0..2).map(|_| Arc::default()).collect();
        // 3 MB read and 1 MB written by RDMA over 2 s, split over two
        // workers; 2 MB of messages in
        WorkerStats::add(&workers[0].rdma_read_bytes, 2_000_000);
        WorkerStats::add(&workers[1].rdma_read_bytes, 1_000_000);
        WorkerStats::add(&workers[1].rdma_write_bytes, 1_000_000);
        WorkerStats::add(&workers[0].bytes_in, 2_000_000);
        // Worker 0 busy 3/4 of its loop cycles, worker 1 1/4: half overall.
        WorkerStats::add(&workers[0].busy_cycles, 3_000);
        WorkerStats::add(&workers[0].idle_cycles, 1_000);
        WorkerStats::add(&workers[1].busy_cycles, 1_000);
        WorkerStats::add(&workers[1].idle_cycles, 3_000);
        let stats = ServerStats {
            workers,
            worker_cores: vec![None, None],
            accepted: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            negotiate_failures: AtomicU64::new(0),
            pool,
            provider: "soft",
            upper: "smb2",
            provider_counters: Default::default(),
            qos_flows: AtomicU64::new(0),
            qos_opens: AtomicU64::new(0),
            store: Default::default(),
        };
        let line = stats.line(&WorkerStatsSnapshot::default(), 2.0);
        assert!(line.contains("MB/s in 1.0 out 0.0"), "{line}");
        assert!(line.contains("RDMA MB/s read 1.5 written 0.5"), "{line}");
        assert!(line.contains("workers busy 50 %"), "{line}");
        // No cycles counted since the last line: no share to show.
        let line = stats.line(&stats.totals(), 2.0);
        assert!(line.contains("workers busy - |"), "{line}");
        let json = stats.to_json();
        assert!(
            json.contains("\"busy_cycles\":4000,\"idle_cycles\":4000"),
            "{json}"
        );
        assert!(json.contains("\"rdma_read_bytes\":3000000"), "{json}");
        assert!(json.contains("\"rdma_write_bytes\":1000000"), "{json}");
    }
}
