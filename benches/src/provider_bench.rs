//! The provider benchmark: what the embedded software provider costs, next
//! to the hardware floor measured in the same run (perftest's `ib_send_lat`,
//! `ib_write_bw` and `ib_read_bw`, with [`crate::baseline`] as the yardstick).
//!
//! ```text
//! cargo run --release -p smbdirect-benches --bin provider-bench -- [--duration S] [--pairs N] [--quick]
//! ```
//!
//! * **Send/Recv round trip.** Two threads pinned to two cores, each with its
//!   own completion queue, queue pair and registered memory, bounce one small
//!   message (64 B by default). Both keep 16 receives posted, as an SMB
//!   Direct peer keeps its receive credits posted. The requester posts a
//!   signaled Send, spins on its CQ until the reply's receive completes and
//!   reads the sequence number the reply carries; the responder sends every
//!   message straight back out of the receive buffer it landed in and
//!   reposts that buffer once the Send completes. Timed per round trip
//!   (HdrHistogram, ns) from the Send's post to the requester having read
//!   the reply; reposting the requester's receive is outside the timed
//!   span. Its baseline is [`baseline::cacheline_pingpong`] on the same two
//!   cores.
//! * **RDMA Write / Read throughput.** The target grants one `size`-byte
//!   buffer ([`Access::RemoteWrite`] or [`Access::RemoteRead`]); the
//!   initiator keeps a window of signaled work requests outstanding between
//!   that buffer and one local `size`-byte buffer, the same two buffers every
//!   time, as perftest does. Its baseline is [`baseline::memcpy_throughput`]
//!   of the same size (also two fixed buffers, from the heap), and a second
//!   reference, `memcpy*`, copies between the very buffers the RDMA uses:
//!   the heap puts the baseline's two buffers back to back, so the
//!   destination sits 16 bytes past a multiple of 4 KiB from the source and
//!   every load aliases a store in flight (4K aliasing): on the development
//!   machine that halves memcpy at 4 KiB (about 25 against 70 GB/s) and
//!   costs a third at 64 KiB, so RDMA "beats memcpy" at those sizes.
//!   `memcpy*` isolates the provider's own overhead.
//!
//! The development machine (2 vCPUs, shared) is noisy, so every measurement
//! alternates with its baseline (A B A B ..., at least three pairs) and the
//! ratio reported is the median of the per-pair ratios, not a ratio of
//! pooled numbers. Targets: round-trip p50 at most [`LATENCY_RATIO_TARGET`]
//! times the ping-pong's; 1 MiB RDMA Write and Read at least
//! [`RDMA_RATIO_TARGET`] of memcpy.
//!
//! The soft provider executes a work request on the posting thread
//! (`post_send` is the NIC), so RDMA throughput is one core's copy bandwidth
//! minus per-request overhead, and a round trip is the provider's
//! instruction path plus the cache-line transfers between the two cores. To
//! tell the two apart, the report adds the same round trip driven by one
//! thread (every line local, timing only the two-thread critical path).

use crate::baseline;
use hdrhistogram::Histogram;
use smbdirect_dataplane::provider::soft::SoftProvider;
use smbdirect_dataplane::provider::{
    Access, Completion, CompletionQueue, ConnRequest, Listener, MemoryRegion, Provider,
    ProviderError, QpCaps, QueuePair, RecvWr, RemoteBuf, SendOp, SendWr, Sge, WcOpcode, WcStatus,
};
use smbdirect_hugepages::{
    BackingInfo, BufLocation, BufferPool, ClassId, HugepagePolicy, PoolConfig, SizeClass,
    SliceAllocator,
};
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Target: soft Send/Recv round-trip p50 at most this many times the
/// cache-line ping-pong's p50.
pub const LATENCY_RATIO_TARGET: f64 = 3.0;

/// Target: 1 MiB RDMA Write and Read throughput at least this fraction of
/// memcpy's.
pub const RDMA_RATIO_TARGET: f64 = 0.8;

/// The transfer size the RDMA target applies to.
pub const RDMA_TARGET_SIZE: usize = 1 << 20;

/// Most work requests kept outstanding in the RDMA loops.
pub const MAX_WINDOW: usize = 64;

/// Receives the responder keeps posted.
const RESPONDER_RECEIVES: usize = 16;

/// Entries of every CQ the benchmark creates.
const CQ_ENTRIES: u32 = 1024;

/// A round trip that takes longer than this means the peer is gone.
const STALL_LIMIT: Duration = Duration::from_secs(5);

/// What to run.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchConfig {
    /// (requester / initiator core, responder core).
    pub cores: (usize, usize),
    /// Unmeasured run-in before each measurement.
    pub warmup: Duration,
    /// Length of each measurement.
    pub duration: Duration,
    /// Measurement/baseline pairs (rounds) per result; at least 3.
    pub pairs: usize,
    /// Send/Recv message size in bytes (at least 8: it carries a sequence
    /// number).
    pub message_size: usize,
    /// RDMA transfer sizes.
    pub sizes: Vec<usize>,
    /// RDMA work requests kept outstanding (1..=[`MAX_WINDOW`]).
    pub window: usize,
}

impl BenchConfig {
    /// The documented run: 5 pairs of 0.5 s measurements, 64 B messages,
    /// 4 KiB / 64 KiB / 1 MiB transfers, a window of 16.
    pub fn standard() -> Self {
        BenchConfig {
            cores: (0, 1),
            warmup: Duration::from_millis(100),
            duration: Duration::from_millis(500),
            pairs: 5,
            message_size: 64,
            sizes: vec![4 << 10, 64 << 10, 1 << 20],
            window: 16,
        }
    }

    /// A smoke run: 3 pairs of 0.1 s measurements.
    pub fn quick() -> Self {
        BenchConfig {
            warmup: Duration::from_millis(20),
            duration: Duration::from_millis(100),
            pairs: 3,
            ..Self::standard()
        }
    }

    fn validate(&self) -> Result<(), BenchError> {
        let bad = |detail: String| Err(BenchError::config(detail));
        if self.pairs < 3 {
            return bad(format!(
                "{} pairs: at least 3 are needed for a median of per-pair ratios",
                self.pairs
            ));
        }
        if !(8..=4096).contains(&self.message_size) {
            return bad(format!(
                "message size {} B: want 8..=4096",
                self.message_size
            ));
        }
        if self.window == 0 || self.window > MAX_WINDOW {
            return bad(format!("window {}: want 1..={MAX_WINDOW}", self.window));
        }
        if let Some(s) = self.sizes.iter().find(|&&s| s == 0 || s > 64 << 20) {
            return bad(format!("RDMA size {s} B: want 1..=64 MiB"));
        }
        if self.duration.is_zero() {
            return bad("zero measurement duration".into());
        }
        Ok(())
    }
}

/// Why the benchmark could not run.
#[derive(Debug)]
pub struct BenchError {
    /// What was being done.
    pub during: &'static str,
    /// What went wrong.
    pub detail: String,
}

impl BenchError {
    fn config(detail: String) -> Self {
        BenchError {
            during: "checking the configuration",
            detail,
        }
    }

    fn provider(during: &'static str, e: ProviderError) -> Self {
        BenchError {
            during,
            detail: e.to_string(),
        }
    }
}

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "provider benchmark failed {}: {}",
            self.during, self.detail
        )
    }
}

impl std::error::Error for BenchError {}

/// Send/Recv round trips and their ping-pong baselines.
#[derive(Debug, Clone)]
pub struct LatencyResult {
    /// Message size in bytes.
    pub message_size: usize,
    /// Per pair, in run order: (soft Send/Recv, cache-line ping-pong)
    /// round-trip histograms in ns.
    pub pairs: Vec<(Histogram<u64>, Histogram<u64>)>,
    /// The same round trip with one thread driving both ends, timing only
    /// the steps on the two-thread critical path: the provider's instruction
    /// path with every cache line local (what is left of the two-thread
    /// round trip is cache-line transfers between the cores).
    pub one_thread: Histogram<u64>,
}

impl LatencyResult {
    /// Soft p50 / ping-pong p50 of each pair.
    pub fn p50_ratios(&self) -> Vec<f64> {
        self.pairs
            .iter()
            .map(|(s, b)| s.value_at_quantile(0.5) as f64 / b.value_at_quantile(0.5).max(1) as f64)
            .collect()
    }

    /// The median of [`Self::p50_ratios`].
    pub fn median_ratio(&self) -> f64 {
        median(self.p50_ratios())
    }

    /// All pairs' histograms merged: (soft, ping-pong).
    pub fn merged(&self) -> (Histogram<u64>, Histogram<u64>) {
        let mut soft = histogram();
        let mut base = histogram();
        for (s, b) in &self.pairs {
            // Same bounds on both sides: adding cannot fail.
            let _ = soft.add(s);
            let _ = base.add(b);
        }
        (soft, base)
    }

    /// Whether the round-trip target is met.
    pub fn target_met(&self) -> bool {
        self.median_ratio() <= LATENCY_RATIO_TARGET
    }
}

/// One round of RDMA measurements, in run order (bytes/s).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ThroughputRound {
    /// The memcpy baseline ([`baseline::memcpy_throughput`]: two heap
    /// buffers).
    pub memcpy: f64,
    /// RDMA Write.
    pub write: f64,
    /// RDMA Read.
    pub read: f64,
    /// memcpy between the very buffers the RDMA operations use (registered,
    /// page aligned): the copy the provider makes, without the provider, so
    /// `write / memcpy_same` is the provider's own overhead whatever the
    /// heap layout does to the baseline.
    pub memcpy_same: f64,
}

/// RDMA throughput at one size.
#[derive(Debug, Clone, PartialEq)]
pub struct ThroughputResult {
    /// Transfer size in bytes.
    pub size: usize,
    /// Rounds in run order.
    pub rounds: Vec<ThroughputRound>,
}

impl ThroughputResult {
    fn median_of(&self, f: impl Fn(&ThroughputRound) -> f64) -> f64 {
        median(self.rounds.iter().map(f).collect())
    }

    /// Median memcpy bytes/s.
    pub fn memcpy(&self) -> f64 {
        self.median_of(|r| r.memcpy)
    }

    /// Median RDMA Write bytes/s.
    pub fn write(&self) -> f64 {
        self.median_of(|r| r.write)
    }

    /// Median RDMA Read bytes/s.
    pub fn read(&self) -> f64 {
        self.median_of(|r| r.read)
    }

    /// Median of the per-round Write / memcpy ratios.
    pub fn write_ratio(&self) -> f64 {
        self.median_of(|r| r.write / r.memcpy)
    }

    /// Median of the per-round Read / memcpy ratios.
    pub fn read_ratio(&self) -> f64 {
        self.median_of(|r| r.read / r.memcpy)
    }

    /// Median memcpy bytes/s between the RDMA buffers.
    pub fn memcpy_same(&self) -> f64 {
        self.median_of(|r| r.memcpy_same)
    }

    /// Median of the per-round Write / same-buffer memcpy ratios.
    pub fn write_same_ratio(&self) -> f64 {
        self.median_of(|r| r.write / r.memcpy_same)
    }

    /// Median of the per-round Read / same-buffer memcpy ratios.
    pub fn read_same_ratio(&self) -> f64 {
        self.median_of(|r| r.read / r.memcpy_same)
    }
}

/// Everything one run measured.
#[derive(Debug, Clone)]
pub struct Report {
    /// What ran.
    pub config: BenchConfig,
    /// Whether both threads could be pinned to their cores.
    pub pinned: bool,
    /// How the registered buffers are backed.
    pub backing: BackingInfo,
    /// Send/Recv round trips.
    pub latency: LatencyResult,
    /// RDMA throughput per size.
    pub throughput: Vec<ThroughputResult>,
    /// Wall time of the whole run.
    pub elapsed: Duration,
}

impl Report {
    /// Whether the RDMA target (Write and Read at [`RDMA_TARGET_SIZE`]) is
    /// met; `None` if that size was not measured.
    pub fn rdma_target_met(&self) -> Option<bool> {
        self.throughput
            .iter()
            .find(|t| t.size == RDMA_TARGET_SIZE)
            .map(|t| t.write_ratio().min(t.read_ratio()) >= RDMA_RATIO_TARGET)
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 10_000_000_000, 3).expect("constant histogram bounds are valid")
}

fn size_name(size: usize) -> String {
    if size >= 1 << 20 && size % (1 << 20) == 0 {
        format!("{} MiB", size >> 20)
    } else if size >= 1 << 10 && size % (1 << 10) == 0 {
        format!("{} KiB", size >> 10)
    } else {
        format!("{size} B")
    }
}

fn verdict(met: bool) -> &'static str {
    if met {
        "MET"
    } else {
        "MISSED"
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        writeln!(
            f,
            "soft provider benchmark: cores {} and {}{}, {} pairs of {:.2} s (+{:.2} s warm-up), {:.1} s in all",
            c.cores.0,
            c.cores.1,
            if self.pinned { " (pinned)" } else { " (NOT pinned)" },
            c.pairs,
            c.duration.as_secs_f64(),
            c.warmup.as_secs_f64(),
            self.elapsed.as_secs_f64(),
        )?;
        writeln!(f, "registered memory: {}", self.backing)?;
        writeln!(f)?;

        let l = &self.latency;
        let (soft, base) = l.merged();
        writeln!(
            f,
            "Send/Recv round trip, {} message (us; all pairs merged)",
            size_name(l.message_size)
        )?;
        writeln!(
            f,
            "  {:<22} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>11}",
            "", "min", "p50", "p90", "p99", "p99.9", "max", "samples"
        )?;
        for (name, h) in [("soft Send/Recv", &soft), ("cache-line ping-pong", &base)] {
            let us = |v: u64| v as f64 / 1000.0;
            writeln!(
                f,
                "  {:<22} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>9.2} {:>11}",
                name,
                us(h.min()),
                us(h.value_at_quantile(0.50)),
                us(h.value_at_quantile(0.90)),
                us(h.value_at_quantile(0.99)),
                us(h.value_at_quantile(0.999)),
                us(h.max()),
                h.len(),
            )?;
        }
        let per_pair: Vec<String> = l
            .pairs
            .iter()
            .zip(l.p50_ratios())
            .map(|((s, b), r)| {
                format!(
                    "{:.3}/{:.3}={r:.2}",
                    s.value_at_quantile(0.5) as f64 / 1000.0,
                    b.value_at_quantile(0.5) as f64 / 1000.0
                )
            })
            .collect();
        writeln!(
            f,
            "  per-pair p50 soft/ping-pong (us): {}",
            per_pair.join("  ")
        )?;
        writeln!(
            f,
            "  median p50 ratio {:.2}  (target <= {:.1}: {})",
            l.median_ratio(),
            LATENCY_RATIO_TARGET,
            verdict(l.target_met())
        )?;
        writeln!(
            f,
            "  one thread driving both ends (instruction path, every line local): p50 {:.3} us, min {:.3} us",
            l.one_thread.value_at_quantile(0.5) as f64 / 1000.0,
            l.one_thread.min() as f64 / 1000.0,
        )?;
        writeln!(f)?;

        writeln!(
            f,
            "RDMA throughput, window {} signaled WRs (GB/s, medians over {} rounds; ratios are medians of per-round ratios)",
            c.window, c.pairs
        )?;
        writeln!(
            f,
            "  {:<8} {:>8} {:>8} {:>12} {:>8} {:>12} {:>9} {:>10} {:>10}",
            "size",
            "memcpy",
            "write",
            "write/memcpy",
            "read",
            "read/memcpy",
            "memcpy*",
            "write/m*",
            "read/m*"
        )?;
        let gb = |v: f64| v / 1e9;
        for t in &self.throughput {
            writeln!(
                f,
                "  {:<8} {:>8.2} {:>8.2} {:>12.2} {:>8.2} {:>12.2} {:>9.2} {:>10.2} {:>10.2}",
                size_name(t.size),
                gb(t.memcpy()),
                gb(t.write()),
                t.write_ratio(),
                gb(t.read()),
                t.read_ratio(),
                gb(t.memcpy_same()),
                t.write_same_ratio(),
                t.read_same_ratio(),
            )?;
        }
        writeln!(
            f,
            "  memcpy: baseline::memcpy_throughput (two heap buffers); memcpy*: the same copy between the \
             registered buffers the RDMA uses"
        )?;
        for t in &self.throughput {
            let rounds: Vec<String> = t
                .rounds
                .iter()
                .map(|r| {
                    format!(
                        "{:.1}/{:.1}/{:.1}/{:.1}",
                        gb(r.memcpy),
                        gb(r.write),
                        gb(r.read),
                        gb(r.memcpy_same)
                    )
                })
                .collect();
            writeln!(
                f,
                "  per-round memcpy/write/read/memcpy* {:<7}: {}",
                size_name(t.size),
                rounds.join("  ")
            )?;
        }
        match self.rdma_target_met() {
            Some(met) => writeln!(
                f,
                "  {} RDMA >= {:.1} x memcpy (write and read): {}",
                size_name(RDMA_TARGET_SIZE),
                RDMA_RATIO_TARGET,
                verdict(met)
            ),
            None => writeln!(
                f,
                "  {} not measured: RDMA target not evaluated",
                size_name(RDMA_TARGET_SIZE)
            ),
        }
    }
}

/// Registered memory of one side: two buffers of the largest size used.
struct Mem {
    pool: BufferPool,
    _alloc: SliceAllocator,
    mr: MemoryRegion,
    bufs: [BufLocation; 2],
}

impl Mem {
    /// Maps the pool; [`Self::register`] it before use. Created before the
    /// provider so that it is dropped after it, as `register`'s contract
    /// requires.
    fn new(buf_size: usize) -> Result<Self, BenchError> {
        let during = "setting up registered memory";
        let buf_size = buf_size.next_multiple_of(4096);
        let pool = PoolConfig::new(2 * buf_size + 8192, 1)
            .class(SizeClass::new("bench", buf_size).per_slice(2))
            .hugepages(HugepagePolicy::Prefer)
            .mlock(false)
            .build()
            .map_err(|e| BenchError {
                during,
                detail: e.to_string(),
            })?;
        let mut alloc = pool.claim_slice(0).map_err(|e| BenchError {
            during,
            detail: e.to_string(),
        })?;
        let mut one = || {
            alloc
                .alloc(ClassId(0))
                .ok()
                .and_then(|id| pool.locate(id))
                .ok_or_else(|| BenchError {
                    during,
                    detail: "the pool has fewer than two buffers".into(),
                })
        };
        let bufs = [one()?, one()?];
        Ok(Mem {
            pool,
            _alloc: alloc,
            mr: MemoryRegion {
                addr: 0,
                len: 0,
                lkey: 0,
            },
            bufs,
        })
    }

    fn register<P: Provider>(&mut self, p: &P) -> Result<(), BenchError> {
        let pool = &self.pool;
        // SAFETY: the region stays mapped while `pool` lives, and `run`
        // creates every `Mem` before the provider, so it is dropped after.
        self.mr = unsafe { p.register(pool.region_base().as_ptr(), pool.region_len(), None) }
            .map_err(|e| BenchError::provider("registering memory", e))?;
        Ok(())
    }

    fn sge(&self, buf: usize, off: usize, len: usize) -> Sge {
        let b = &self.bufs[buf];
        debug_assert!(off + len <= b.len);
        self.mr.sge(
            (b.offset + off) as u64,
            u32::try_from(len).unwrap_or(u32::MAX),
        )
    }

    fn ptr(&self, buf: usize, off: usize) -> *mut u8 {
        debug_assert!(off < self.bufs[buf].len);
        // SAFETY: in bounds of the buffer (checked by the callers' sizes).
        unsafe { self.bufs[buf].ptr.as_ptr().add(off) }
    }

    /// Fills `len` bytes of buffer `buf` with a pattern of `seed`.
    fn fill(&self, buf: usize, len: usize, seed: u8) {
        assert!(len <= self.bufs[buf].len);
        let p = self.ptr(buf, 0);
        for i in 0..len {
            // SAFETY: in bounds; no work request touches the buffer now.
            unsafe { p.add(i).write_volatile((i as u8).wrapping_mul(31) ^ seed) };
        }
    }

    /// Whether `len` bytes of buffer `buf` hold the pattern of `seed`.
    fn holds(&self, buf: usize, len: usize, seed: u8) -> bool {
        assert!(len <= self.bufs[buf].len);
        let p = self.ptr(buf, 0);
        (0..len).all(|i| {
            // SAFETY: as in `fill`, for reads.
            unsafe { p.add(i).read_volatile() == (i as u8).wrapping_mul(31) ^ seed }
        })
    }
}

/// One end of a connection.
struct Side<P: Provider> {
    cq: P::Cq,
    qp: P::Qp,
}

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 2 * MAX_WINDOW as u32,
        max_recv_wr: 2 * RESPONDER_RECEIVES as u32,
        max_sge: 1,
        ird: 16,
        ord: 16,
    }
}

/// Connects a fresh pair of queue pairs on fresh CQs: (target, initiator).
fn connect<P: Provider>(p: &P) -> Result<(Side<P>, Side<P>), BenchError> {
    let during = "connecting two queue pairs";
    let err = |e| BenchError::provider(during, e);
    let any: SocketAddr = "127.0.0.1:0".parse().expect("literal address");
    let mut listener = p.listen(any).map_err(err)?;
    let addr = listener.local_addr();
    let target_cq = p.create_cq(CQ_ENTRIES).map_err(err)?;
    let initiator_cq = p.create_cq(CQ_ENTRIES).map_err(err)?;
    let (th, ih) = (target_cq.handle(), initiator_cq.handle());
    let timeout = Duration::from_secs(5);
    let (accepted, connected) = std::thread::scope(|s| {
        let acceptor = s.spawn(|| -> Result<P::Qp, ProviderError> {
            let req = listener
                .accept_request(timeout)?
                .ok_or_else(|| ProviderError::Connect("no connection request arrived".into()))?;
            req.accept(&th, caps(), &[])
        });
        let connected = p.connect(addr, &ih, caps(), &[], timeout);
        let accepted = acceptor
            .join()
            .unwrap_or_else(|_| Err(ProviderError::Other("acceptor thread panicked".into())));
        (accepted, connected)
    });
    let target_qp = accepted.map_err(err)?;
    let (initiator_qp, _) = connected.map_err(err)?;
    Ok((
        Side {
            cq: target_cq,
            qp: target_qp,
        },
        Side {
            cq: initiator_cq,
            qp: initiator_qp,
        },
    ))
}

fn failed(during: &'static str, wc: &Completion) -> BenchError {
    BenchError {
        during,
        detail: format!(
            "work request {} ({:?}) completed with {:?}",
            wc.wr_id, wc.opcode, wc.status
        ),
    }
}

/// Polls `side` until a completion of `opcode` arrives.
fn wait_for<P: Provider>(
    side: &mut Side<P>,
    opcode: WcOpcode,
    during: &'static str,
) -> Result<(), BenchError> {
    let deadline = Instant::now() + STALL_LIMIT;
    let mut wcs = [Completion::EMPTY; 8];
    loop {
        let n = side.cq.poll(&mut wcs);
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success {
                return Err(failed(during, wc));
            }
            if wc.opcode == opcode {
                return Ok(());
            }
        }
        if n == 0 && Instant::now() > deadline {
            return Err(BenchError {
                during,
                detail: format!("no {opcode:?} completion within {STALL_LIMIT:?}"),
            });
        }
    }
}

/// A flag on a cache line of its own, so the responder's poll of it never
/// misses because the requester wrote a neighbour.
#[repr(align(128))]
struct StopFlag(AtomicBool);

/// The responder's thread: echoes every message out of the buffer it landed
/// in, reposts the buffer when the Send completes. Receive `i` is `slots[i]`,
/// with wr_id `i`.
fn respond<P: Provider>(
    side: &mut Side<P>,
    slots: &[Sge; RESPONDER_RECEIVES],
    stop: &StopFlag,
) -> Result<u64, BenchError> {
    let during = "echoing round trips (responder)";
    let mut wcs = [Completion::EMPTY; 32];
    let mut echoed = 0u64;
    while !stop.0.load(Ordering::Relaxed) {
        let n = side.cq.poll(&mut wcs);
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success {
                return Err(failed(during, wc));
            }
            let Some(&slot) = slots.get(wc.wr_id as usize) else {
                return Err(BenchError {
                    during,
                    detail: format!("completion of unknown work request {}", wc.wr_id),
                });
            };
            match wc.opcode {
                WcOpcode::Recv => {
                    let sges = [Sge {
                        len: wc.byte_len,
                        ..slot
                    }];
                    side.qp
                        .post_send(&[SendWr {
                            wr_id: wc.wr_id,
                            op: SendOp::Send {
                                sges: &sges,
                                invalidate: None,
                            },
                            signaled: true,
                        }])
                        .map_err(|e| BenchError::provider(during, e))?;
                    echoed += 1;
                }
                WcOpcode::Send => side
                    .qp
                    .post_recv(&[RecvWr {
                        wr_id: wc.wr_id,
                        sge: slot,
                    }])
                    .map_err(|e| BenchError::provider(during, e))?,
                _ => {}
            }
        }
    }
    Ok(echoed)
}

/// One Send/Recv measurement: `warmup`, then `duration` of round trips.
/// Returns the histogram and whether the responder could be pinned.
fn send_recv_round_trips<P: Provider>(
    p: &P,
    cfg: &BenchConfig,
    requester_mem: &Mem,
    responder_mem: &Mem,
) -> Result<(Histogram<u64>, bool), BenchError> {
    let during = "measuring Send/Recv round trips";
    let perr = |e| BenchError::provider(during, e);
    let (mut responder, mut requester) = connect(p)?;
    let size = cfg.message_size;
    let slot = size.next_multiple_of(64);
    // Every receive is posted before the first Send: a Send that finds none
    // is fatal on the soft provider.
    let slots: [Sge; RESPONDER_RECEIVES] =
        std::array::from_fn(|i| responder_mem.sge(0, i * slot, slot));
    let recvs: Vec<RecvWr> = (0..RESPONDER_RECEIVES)
        .map(|i| RecvWr {
            wr_id: i as u64,
            sge: slots[i],
        })
        .collect();
    responder.qp.post_recv(&recvs).map_err(perr)?;
    // Requester: sends from buffer 0 offset 0, keeps as many receives
    // posted in buffer 1 (an SMB Direct peer keeps its receive credits
    // posted), reposting each as soon as it has read the reply in it.
    let replies: [RecvWr; RESPONDER_RECEIVES] = std::array::from_fn(|i| RecvWr {
        wr_id: i as u64,
        sge: requester_mem.sge(1, i * slot, slot),
    });
    requester.qp.post_recv(&replies).map_err(perr)?;
    requester_mem.fill(0, size, 0x5a);
    let send_sges = [requester_mem.sge(0, 0, size)];
    let send = [SendWr {
        wr_id: 0,
        op: SendOp::Send {
            sges: &send_sges,
            invalidate: None,
        },
        signaled: true,
    }];
    let seq_out = requester_mem.ptr(0, 0) as *mut u64;
    let seq_in: [*const u64; RESPONDER_RECEIVES] =
        std::array::from_fn(|i| requester_mem.ptr(1, i * slot) as *const u64);
    let stop = StopFlag(AtomicBool::new(false));
    let responder_core = cfg.cores.1;

    std::thread::scope(|s| {
        let resp = std::thread::Builder::new()
            .name("bench-responder".into())
            .spawn_scoped(s, || {
                let pinned = baseline::pin(responder_core);
                respond(&mut responder, &slots, &stop).map(|_| pinned)
            })
            .map_err(|e| BenchError {
                during,
                detail: format!("spawning the responder: {e}"),
            })?;
        let mut hist = histogram();
        let mut wcs = [Completion::EMPTY; 8];
        let run = (|| -> Result<(), BenchError> {
            let start = Instant::now();
            let mut measuring = false;
            let mut seq = 0u64;
            loop {
                let el = start.elapsed();
                if el >= cfg.warmup + cfg.duration {
                    return Ok(());
                }
                if !measuring && el >= cfg.warmup {
                    measuring = true;
                    hist.reset();
                }
                seq += 1;
                // SAFETY: 8 bytes at the start of our send buffer (size >= 8,
                // 4 KiB aligned); no work request reads it now (the previous
                // Send completed before its reply arrived).
                unsafe { seq_out.write_volatile(seq) };
                let t0 = Instant::now();
                requester.qp.post_send(&send).map_err(perr)?;
                let mut spins = 0u32;
                let i = 'wait: loop {
                    let n = requester.cq.poll(&mut wcs);
                    for wc in &wcs[..n] {
                        if wc.status != WcStatus::Success {
                            return Err(failed(during, wc));
                        }
                        if wc.opcode == WcOpcode::Recv {
                            break 'wait wc.wr_id as usize % RESPONDER_RECEIVES;
                        }
                    }
                    spins = spins.wrapping_add(1);
                    if spins % 65_536 == 0 && t0.elapsed() > STALL_LIMIT {
                        return Err(BenchError {
                            during,
                            detail: format!("no reply to message {seq} within {STALL_LIMIT:?}"),
                        });
                    }
                };
                // SAFETY: the reply's receive completed: the buffer is ours
                // again and holds at least 8 bytes.
                let echoed = unsafe { seq_in[i].read_volatile() };
                hist.saturating_record(t0.elapsed().as_nanos().max(1) as u64);
                if echoed != seq {
                    return Err(BenchError {
                        during,
                        detail: format!("reply carries sequence {echoed}, sent {seq}"),
                    });
                }
                requester.qp.post_recv(&replies[i..=i]).map_err(perr)?;
            }
        })();
        stop.0.store(true, Ordering::Relaxed);
        let echoed = resp.join().unwrap_or_else(|_| {
            Err(BenchError {
                during,
                detail: "the responder thread panicked".into(),
            })
        });
        run?;
        Ok((hist, echoed?))
    })
}

/// Polls `side` until a Recv completes; returns its wr_id (other
/// completions are retired and dropped).
fn next_recv<P: Provider>(side: &mut Side<P>, during: &'static str) -> Result<u64, BenchError> {
    let mut wcs = [Completion::EMPTY; 8];
    let mut spins = 0u32;
    let t0 = Instant::now();
    loop {
        let n = side.cq.poll(&mut wcs);
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success {
                return Err(failed(during, wc));
            }
            if wc.opcode == WcOpcode::Recv {
                return Ok(wc.wr_id);
            }
        }
        spins = spins.wrapping_add(1);
        if spins % 65_536 == 0 && t0.elapsed() > STALL_LIMIT {
            return Err(BenchError {
                during,
                detail: format!("no receive completed within {STALL_LIMIT:?}"),
            });
        }
    }
}

/// The Send/Recv round trip with both ends on the calling thread. Timed:
/// the requester's Send, the responder's poll and echo, the requester's
/// poll and read of the reply (the two-thread critical path). Untimed: the
/// responder's Send completion and both reposts.
fn one_thread_round_trips<P: Provider>(
    p: &P,
    cfg: &BenchConfig,
    requester_mem: &Mem,
    responder_mem: &Mem,
) -> Result<Histogram<u64>, BenchError> {
    let during = "measuring one-thread Send/Recv round trips";
    let perr = |e| BenchError::provider(during, e);
    let (mut responder, mut requester) = connect(p)?;
    let size = cfg.message_size;
    let slot = size.next_multiple_of(64);
    let s_recvs: [RecvWr; RESPONDER_RECEIVES] = std::array::from_fn(|i| RecvWr {
        wr_id: i as u64,
        sge: responder_mem.sge(0, i * slot, slot),
    });
    let c_recvs: [RecvWr; RESPONDER_RECEIVES] = std::array::from_fn(|i| RecvWr {
        wr_id: i as u64,
        sge: requester_mem.sge(1, i * slot, slot),
    });
    responder.qp.post_recv(&s_recvs).map_err(perr)?;
    requester.qp.post_recv(&c_recvs).map_err(perr)?;
    requester_mem.fill(0, size, 0x3c);
    let send_sges = [requester_mem.sge(0, 0, size)];
    let send = [SendWr {
        wr_id: 0,
        op: SendOp::Send {
            sges: &send_sges,
            invalidate: None,
        },
        signaled: true,
    }];
    let seq_out = requester_mem.ptr(0, 0) as *mut u64;
    let mut hist = histogram();
    let start = Instant::now();
    let mut measuring = false;
    let mut seq = 0u64;
    while start.elapsed() < cfg.warmup + cfg.duration {
        if !measuring && start.elapsed() >= cfg.warmup {
            measuring = true;
            hist.reset();
        }
        seq += 1;
        // SAFETY: as in `send_recv_round_trips`.
        unsafe { seq_out.write_volatile(seq) };
        let t0 = Instant::now();
        requester.qp.post_send(&send).map_err(perr)?;
        let i = next_recv(&mut responder, during)? as usize % RESPONDER_RECEIVES;
        let echo = [Sge {
            len: size as u32,
            ..s_recvs[i].sge
        }];
        responder
            .qp
            .post_send(&[SendWr {
                wr_id: i as u64,
                op: SendOp::Send {
                    sges: &echo,
                    invalidate: None,
                },
                signaled: true,
            }])
            .map_err(perr)?;
        let j = next_recv(&mut requester, during)? as usize % RESPONDER_RECEIVES;
        // SAFETY: the reply's receive completed; the buffer is ours again.
        let echoed = unsafe { (requester_mem.ptr(1, j * slot) as *const u64).read_volatile() };
        hist.saturating_record(t0.elapsed().as_nanos().max(1) as u64);
        if echoed != seq {
            return Err(BenchError {
                during,
                detail: format!("reply carries sequence {echoed}, sent {seq}"),
            });
        }
        // The echo executed inside post_send, so its buffer is free again.
        wait_for(&mut responder, WcOpcode::Send, during)?;
        responder.qp.post_recv(&s_recvs[i..=i]).map_err(perr)?;
        requester.qp.post_recv(&c_recvs[j..=j]).map_err(perr)?;
    }
    Ok(hist)
}

/// One RDMA measurement: bytes/s of `size`-byte Writes (or Reads) from the
/// initiator's buffer 1 to the target's granted buffer 1.
fn rdma_throughput<P: Provider>(
    target: &mut Side<P>,
    initiator: &mut Side<P>,
    target_mem: &Mem,
    initiator_mem: &Mem,
    cfg: &BenchConfig,
    size: usize,
    write: bool,
) -> Result<f64, BenchError> {
    let during = if write {
        "measuring RDMA Write throughput"
    } else {
        "measuring RDMA Read throughput"
    };
    let perr = |e| BenchError::provider(during, e);
    let access = if write {
        Access::RemoteWrite
    } else {
        Access::RemoteRead
    };
    let g = target
        .qp
        .grant(1, target_mem.sge(1, 0, size), access, true)
        .map_err(perr)?;
    wait_for(target, WcOpcode::Bind, during)?;
    let local = [initiator_mem.sge(1, 0, size)];
    let remote = RemoteBuf {
        addr: g.addr,
        rkey: g.rkey,
    };
    let op = if write {
        SendOp::RdmaWrite {
            sges: &local,
            remote,
        }
    } else {
        SendOp::RdmaRead {
            sges: &local,
            remote,
        }
    };
    let wrs = [SendWr {
        wr_id: 7,
        op,
        signaled: true,
    }; MAX_WINDOW];

    // Correctness first: one transfer moves the bytes.
    let (src, dst) = if write {
        (initiator_mem, target_mem)
    } else {
        (target_mem, initiator_mem)
    };
    let seed = if write { 0x11 } else { 0x22 } ^ (size as u8);
    src.fill(1, size, seed);
    dst.fill(1, size, !seed);
    initiator.qp.post_send(&wrs[..1]).map_err(perr)?;
    wait_for(
        initiator,
        if write {
            WcOpcode::RdmaWrite
        } else {
            WcOpcode::RdmaRead
        },
        during,
    )?;
    if !dst.holds(1, size, seed) {
        return Err(BenchError {
            during,
            detail: format!("a {size}-byte transfer did not move the bytes"),
        });
    }

    let window = cfg.window;
    let mut wcs = [Completion::EMPTY; 2 * MAX_WINDOW];
    let mut outstanding = 0usize;
    let mut done = 0u64;
    let start = Instant::now();
    let mut measured_from: Option<Instant> = None;
    let mut last_progress = start;
    let rate = loop {
        let now = Instant::now();
        match measured_from {
            None if now - start >= cfg.warmup => {
                measured_from = Some(now);
                done = 0;
            }
            Some(t) if now - t >= cfg.duration => {
                break done as f64 * size as f64 / (now - t).as_secs_f64();
            }
            _ => {}
        }
        if outstanding < window {
            initiator
                .qp
                .post_send(&wrs[..window - outstanding])
                .map_err(perr)?;
            outstanding = window;
        }
        let n = initiator.cq.poll(&mut wcs);
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success {
                return Err(failed(during, wc));
            }
        }
        if n > 0 {
            last_progress = now;
        } else if now - last_progress > STALL_LIMIT {
            return Err(BenchError {
                during,
                detail: format!("no completion within {STALL_LIMIT:?}"),
            });
        }
        outstanding -= n;
        done += n as u64;
    };
    // Retire the rest, then take the grant back.
    while outstanding > 0 {
        let n = initiator.cq.poll(&mut wcs);
        if let Some(wc) = wcs[..n].iter().find(|wc| wc.status != WcStatus::Success) {
            return Err(failed(during, wc));
        }
        outstanding -= n;
    }
    target.qp.revoke(2, g.rkey, true).map_err(perr)?;
    wait_for(target, WcOpcode::Revoke, during)?;
    Ok(rate)
}

/// [`baseline::memcpy_throughput`]'s loop, between two given buffers of at
/// least `size` bytes that nothing else touches meanwhile.
fn memcpy_between(src: *const u8, dst: *mut u8, size: usize, duration: Duration) -> f64 {
    let start = Instant::now();
    let mut bytes = 0u64;
    while start.elapsed() < duration {
        for _ in 0..16 {
            // SAFETY: the callers pass two distinct registered buffers of at
            // least `size` bytes with no work request outstanding on them.
            unsafe { std::ptr::copy_nonoverlapping(std::hint::black_box(src), dst, size) };
            std::hint::black_box(dst);
            bytes += size as u64;
        }
    }
    bytes as f64 / start.elapsed().as_secs_f64()
}

/// Runs the whole benchmark on a fresh [`SoftProvider`].
pub fn run(cfg: &BenchConfig) -> Result<Report, BenchError> {
    cfg.validate()?;
    let started = Instant::now();
    let buf_size = cfg
        .sizes
        .iter()
        .copied()
        .chain([RESPONDER_RECEIVES * cfg.message_size.next_multiple_of(64)])
        .max()
        .unwrap_or(4096);
    // Locals drop in reverse order: the memory outlives the provider.
    let mut initiator_mem = Mem::new(buf_size)?;
    let mut target_mem = Mem::new(buf_size)?;
    let provider =
        SoftProvider::new().map_err(|e| BenchError::provider("creating the soft provider", e))?;
    initiator_mem.register(&provider)?;
    target_mem.register(&provider)?;
    run_with(&provider, cfg, &initiator_mem, &target_mem, started)
}

fn run_with<P: Provider>(
    provider: &P,
    cfg: &BenchConfig,
    initiator_mem: &Mem,
    target_mem: &Mem,
    started: Instant,
) -> Result<Report, BenchError> {
    let pinned = baseline::pin(cfg.cores.0);

    // (a) Send/Recv round trip, alternating with the ping-pong.
    let mut pairs = Vec::with_capacity(cfg.pairs);
    let mut responder_pinned = true;
    for _ in 0..cfg.pairs {
        let (soft, pinned) = send_recv_round_trips(provider, cfg, initiator_mem, target_mem)?;
        responder_pinned &= pinned;
        let base = baseline::cacheline_pingpong(cfg.cores, cfg.warmup, cfg.duration);
        pairs.push((soft, base));
    }
    let one_thread = one_thread_round_trips(provider, cfg, initiator_mem, target_mem)?;
    let latency = LatencyResult {
        message_size: cfg.message_size,
        pairs,
        one_thread,
    };

    // (b) RDMA throughput, alternating memcpy / Write / Read / memcpy*.
    let (mut target, mut initiator) = connect(provider)?;
    let mut throughput = Vec::with_capacity(cfg.sizes.len());
    for &size in &cfg.sizes {
        let mut rounds = Vec::with_capacity(cfg.pairs);
        for _ in 0..cfg.pairs {
            let memcpy = baseline::memcpy_throughput(size, cfg.duration);
            let write = rdma_throughput(
                &mut target,
                &mut initiator,
                target_mem,
                initiator_mem,
                cfg,
                size,
                true,
            )?;
            let read = rdma_throughput(
                &mut target,
                &mut initiator,
                target_mem,
                initiator_mem,
                cfg,
                size,
                false,
            )?;
            let memcpy_same = memcpy_between(
                initiator_mem.ptr(1, 0),
                target_mem.ptr(1, 0),
                size,
                cfg.duration,
            );
            rounds.push(ThroughputRound {
                memcpy,
                write,
                read,
                memcpy_same,
            });
        }
        throughput.push(ThroughputResult { size, rounds });
    }
    Ok(Report {
        config: cfg.clone(),
        pinned: pinned && responder_pinned,
        backing: initiator_mem.pool.backing(),
        latency,
        throughput,
        elapsed: started.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(vec![]).is_nan());
    }

    #[test]
    fn config_rejects_fewer_than_three_pairs() {
        let cfg = BenchConfig {
            pairs: 2,
            ..BenchConfig::quick()
        };
        assert!(cfg.validate().is_err());
    }

    #[test]
    fn tiny_run_measures_every_result_and_moves_bytes() {
        let cfg = BenchConfig {
            warmup: Duration::from_millis(2),
            duration: Duration::from_millis(20),
            pairs: 3,
            sizes: vec![4096, 100_000],
            window: 4,
            ..BenchConfig::standard()
        };
        let r = run(&cfg).expect("benchmark runs");
        assert_eq!(r.latency.pairs.len(), 3);
        assert!(r
            .latency
            .pairs
            .iter()
            .all(|(s, b)| !s.is_empty() && !b.is_empty()));
        assert_eq!(r.throughput.len(), 2);
        for t in &r.throughput {
            assert!(t
                .rounds
                .iter()
                .all(|x| x.memcpy > 0.0 && x.write > 0.0 && x.read > 0.0 && x.memcpy_same > 0.0));
        }
        let text = r.to_string();
        assert!(text.contains("Send/Recv round trip"), "{text}");
        assert!(text.contains("100000 B"), "{text}");
    }
}
