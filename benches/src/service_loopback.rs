//! The main job of a fresh checkout: a real `serve` (control plane and a
//! pinned poll-mode worker, echo upper layer) on the embedded soft RDMA
//! provider, and an SMB Direct client in this process on another core,
//! exchanging echo round trips for a few seconds. Prints the latency
//! percentile table (HdrHistogram) the benchmarks use. This is the transport
//! path end to end — negotiation, credits, fragmentation above
//! MaxSendSize - 24, receives posted through the pool — not a simulation.

use hdrhistogram::Histogram;
use smbdirect_controlplane::{start, ServerConfig};
use smbdirect_dataplane::client::Client;
use smbdirect_dataplane::provider::soft::SoftProvider;
use smbdirect_dataplane::provider::Provider;
use smbdirect_dataplane::upper::Echo;
use smbdirect_hugepages::{Backing, PoolConfig};
use smbdirect_protocol::smbd::SmbdConfig;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What to run.
#[derive(Debug, Clone)]
pub struct LoopbackOptions {
    /// Upper-layer message size.
    pub size: usize,
    /// Measured time.
    pub duration: Duration,
    /// Unmeasured warm-up.
    pub warmup: Duration,
    /// Core for the client thread (the caller's), if any.
    pub client_core: Option<usize>,
    /// Core for the server's worker, if any.
    pub server_core: Option<usize>,
    /// Worker idle policy.
    pub idle_park: Duration,
    /// Verify every echoed byte.
    pub verify: bool,
}

/// What it measured.
#[derive(Debug)]
pub struct LoopbackResult {
    /// Round-trip latency, ns.
    pub histogram: Histogram<u64>,
    /// Measured round trips.
    pub round_trips: u64,
    /// Measured time.
    pub elapsed: Duration,
    /// Credit stalls seen by the client.
    pub credit_stalls: u64,
    /// Server-side counters after the run (JSON).
    pub server_stats: String,
    /// Pool buffers free/total on the server after shutdown, per class.
    pub server_pool_after: Vec<(String, u64, u64)>,
    /// Share of the server worker's poll-loop cycles that found work over
    /// the measured window (`WorkerStats::busy_cycles`).
    pub server_busy: Option<f64>,
}

/// Runs the loopback.
pub fn run(opts: &LoopbackOptions) -> Result<LoopbackResult, String> {
    let provider = Arc::new(SoftProvider::new().map_err(|e| e.to_string())?);
    // A port chosen by the provider: the soft rendezvous accepts port 0.
    let smbd = SmbdConfig::default();
    let cfg = ServerConfig {
        worker_cores: vec![opts.server_core],
        smbd: smbd.clone(),
        queue_depth: 1,
        max_connections: 4,
        idle_park: opts.idle_park,
        ..ServerConfig::default()
    };
    let server =
        start(provider.clone(), cfg, || Echo).map_err(|e| format!("starting the server: {e}"))?;
    let pool = PoolConfig::smbdirect(
        64 << 20,
        1,
        8192,
        1364,
        smbd.max_fragmented_recv_size as usize,
    )
    .backing(Backing::SharedMemfd)
    .build()
    .map_err(|e| e.to_string())?;
    // SAFETY: the pool outlives every use of the registration in this run.
    let mr = unsafe { provider.register_pool(&pool) }.map_err(|e| e.to_string())?;
    if let Some(c) = opts.client_core {
        core_affinity::set_for_current(core_affinity::CoreId { id: c });
    }
    let alloc = pool.claim_slice(0).map_err(|e| e.to_string())?;
    let mut client = Client::connect(
        &*provider,
        server.local_addr(),
        smbd,
        alloc,
        mr,
        Duration::from_secs(10),
    )
    .map_err(|e| format!("connecting: {e}"))?;
    let msg: Vec<u8> = (0..opts.size).map(|i| (i * 31 + 7) as u8).collect();
    let mut hist =
        Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).map_err(|e| e.to_string())?;
    let start_t = Instant::now();
    let mut measuring_since = None;
    let mut busy_from = None;
    let mut round_trips = 0u64;
    loop {
        let el = start_t.elapsed();
        if el >= opts.warmup + opts.duration {
            break;
        }
        if measuring_since.is_none() && el >= opts.warmup {
            busy_from = Some(server.stats().totals());
            measuring_since = Some(Instant::now());
            hist.reset();
            round_trips = 0;
        }
        let t0 = Instant::now();
        client.send(&msg).map_err(|e| format!("send: {e}"))?;
        let ok = client
            .recv_with(Duration::from_secs(10), |m| !opts.verify || m == &msg[..])
            .map_err(|e| format!("receive: {e}"))?;
        if !ok {
            return Err("echoed bytes differ from what was sent".into());
        }
        hist.saturating_record(t0.elapsed().as_nanos().max(1) as u64);
        round_trips += 1;
    }
    let elapsed = measuring_since.map_or(Duration::ZERO, |t| t.elapsed());
    let server_busy = busy_from.and_then(|b| server.stats().totals().busy_fraction_since(&b));
    let credit_stalls = client.connection().stats().credit_stalls;
    let server_stats = server.stats().to_json();
    let _ = client.close(Duration::from_secs(2));
    let stats = server.shutdown();
    let server_pool_after = stats
        .pool_classes()
        .into_iter()
        .map(|c| (c.name, c.free, c.total))
        .collect();
    Ok(LoopbackResult {
        histogram: hist,
        round_trips,
        elapsed,
        credit_stalls,
        server_stats,
        server_pool_after,
        server_busy,
    })
}

impl LoopbackResult {
    /// The human table.
    pub fn table(&self, size: usize) -> String {
        let h = &self.histogram;
        let us = |v: u64| v as f64 / 1000.0;
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        let pool: Vec<String> = self
            .server_pool_after
            .iter()
            .map(|(n, f, t)| format!("{n} {f}/{t}"))
            .collect();
        format!(
            "smbdirectd loopback: SMB Direct echo over the soft RDMA provider (serve + client in one process)\n\
             size {size} B, {rt} round trips in {secs:.2} s: {ops:.0} round trips/s, {mbs:.1} MB/s each way\n\
             latency us: min {min:.2}  p50 {p50:.2}  p90 {p90:.2}  p99 {p99:.2}  p99.9 {p999:.2}  p99.99 {p9999:.2}  max {max:.2}\n\
             client credit stalls: {cs}; server worker busy (loop cycles with work) {busy}\n\
             server pool after shutdown (free/total): {pool}",
            rt = self.round_trips,
            ops = self.round_trips as f64 / secs,
            mbs = self.round_trips as f64 * size as f64 / secs / 1e6,
            min = us(h.min()),
            p50 = us(h.value_at_quantile(0.50)),
            p90 = us(h.value_at_quantile(0.90)),
            p99 = us(h.value_at_quantile(0.99)),
            p999 = us(h.value_at_quantile(0.999)),
            p9999 = us(h.value_at_quantile(0.9999)),
            max = us(h.max()),
            cs = self.credit_stalls,
            busy = crate::bench::report::busy_text(self.server_busy),
            pool = pool.join(", "),
        )
    }
}
