//! The SMB2 workloads, over the SMB2 client library
//! ([`smbdirect_dataplane::smb2::client`]):
//!
//! * `read` / `write`: SMB2 READ / WRITE of `--size` bytes ([MS-SMB2]
//!   3.2.4.6, 3.2.4.7) through an RDMA channel (SMB2_CHANNEL_RDMA_V1_INVALIDATE
//!   on SMB 3.0.2 and later, SMB2_CHANNEL_RDMA_V1 on 3.0: one buffer
//!   descriptor, the server's response invalidates it) or, with `--inline`,
//!   inside the SMB2 messages;
//! * `mixed`: READs and WRITEs, `--read-pct` percent READs (chosen per
//!   operation from its sequence number, so runs are repeatable);
//! * `qos`: the mix of `mixed` on `--flows` Storage QoS logical flows
//!   ([MS-SQOS]), each on its own Open of the file, associated and given a
//!   policy with SET_POLICY at set-up (client-defined: `--limit`,
//!   `--reservation`, `--bandwidth-limit`; or `--policy-id`). Each
//!   connection's operations go round robin over its flows. The client runs
//!   UPDATE_COUNTERS + GET_STATUS whenever a flow's StatusRequestTimer
//!   expires ([MS-SQOS] 3.1.6) and, unless `--ignore-limit`, holds each I/O
//!   back until the flow's initiation limit allows it ([MS-SQOS] 3.1.7.1;
//!   the operation's latency includes that wait). With `--ignore-limit`
//!   the client initiates as fast as the queue depth allows, so what is
//!   measured is the server's enforcement.
//!
//! # The file
//! Every connection works on one file, [`FILE_NAME`], of `--file-size`
//! bytes, created (or truncated) and filled at set-up, before any
//! connection of the run opens: block `k` (bytes `k * size ..`) holds
//! [`pattern`]`(block_seed(k))`. Block `k` belongs to one (connection,
//! slot) pair only (`k mod (connections * queue_depth)`), so no two
//! operations in flight ever touch the same bytes, and each slot walks
//! through its blocks in turn.
//!
//! # --verify
//! Every READ's data is compared byte for byte with what its block must
//! hold (the pre-fill, or the last WRITE to it); every WRITE sends its own
//! per-operation pattern and is then read back into the same buffer and
//! compared (the operation, and its latency, cover both requests).
//!
//! Nothing allocates once a session is open (buffers, slots and the
//! expected-pattern table are made in [`Workload::open`]); the QoS status
//! requests, once a second per flow, do (they are not per operation).

use super::error::BenchError;
use super::options::{BenchOptions, WorkloadKind};
use super::pattern;
use super::send::{client_pool, client_smbd, loopback_server_config, server_pool_mem};
use super::workload::{Outcome, Session, Workload};
use super::Retained;
use smbdirect_controlplane::{start, RunningServer};
use smbdirect_dataplane::clock;
use smbdirect_dataplane::marks::{self, Point};
use smbdirect_dataplane::provider::Provider;
use smbdirect_dataplane::smb2::client::{
    Completion, IoBuf, MessageId, Smb2Client, Smb2ClientOptions, Smb2Error, Transfer,
};
use smbdirect_dataplane::smb2::store::{MemStoreFactory, StoreFactory};
use smbdirect_dataplane::smb2::{Smb2Config, Smb2Server, DEFAULT_SHARE};
use smbdirect_protocol::smb2::{CreateDisposition, CreateOptions, Dialect, FileId};
use smbdirect_protocol::smbd::SmbdConfig;
use smbdirect_protocol::sqos::client::{LogicalFlow, PolicyParams};
use smbdirect_protocol::sqos::{normalized_io_size, Dialect as QosDialect, FlowStatus, Guid};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The file every SMB2 workload works on, in the share's root.
pub const FILE_NAME: &str = "smbdirectd-bench.dat";

/// How long a synchronous SMB2 call (set-up, QoS status) may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// How long a submit may wait for SMB2 credits.
const CREDIT_WAIT: Duration = Duration::from_secs(10);

/// The dialects offered, best first.
const DIALECTS: [Dialect; 3] = [Dialect::SMB_3_1_1, Dialect::SMB_3_0_2, Dialect::SMB_3_0];

/// The pattern seed of block `k` as pre-filled (above every operation's
/// sequence number, below 2^56: see [`pattern`]).
pub fn block_seed(block: u64) -> u64 {
    (1 << 55) | block
}

/// Whether operation `seq` of a workload with `read_pct` % reads is a
/// READ (a fixed hash of the sequence number: repeatable runs).
pub(super) fn is_read(seq: u64, read_pct: u8) -> bool {
    let h = seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32;
    (h % 100) < u64::from(read_pct)
}

/// The policy every `qos` flow is given.
#[derive(Debug, Clone, Copy)]
pub struct QosSpec {
    /// Logical flows over all connections.
    pub flows: u32,
    /// PolicyID (NULL: client-defined from the fields below).
    pub policy_id: Guid,
    /// Limit, normalized IOPS.
    pub limit: u64,
    /// Reservation, normalized IOPS.
    pub reservation: u64,
    /// BandwidthLimit, KB/s.
    pub bandwidth_limit: u64,
    /// Skip the client's initiation-rate limiting.
    pub ignore_limit: bool,
}

/// One flow's result (JSON `flows`).
#[derive(Debug, Clone, PartialEq)]
pub struct FlowReport {
    /// LogicalFlowID.
    pub flow_id: String,
    /// The flow's MaximumIoRate from the server's last status (normalized
    /// IOPS; 0: none), or the requested `--limit` if no status came.
    pub limit_iops: u64,
    /// Normalized IOPS the flow achieved in the measured window (every SMB2
    /// READ and WRITE sent on it, normalized by its BaseIoSize).
    pub achieved_iops: f64,
    /// KB/s (1024 bytes) it moved in the measured window.
    pub achieved_kbps: f64,
    /// FlowStatus of the last GET_STATUS ("ok", "insufficient_throughput",
    /// ...; "none" if no status came).
    pub status: String,
}

fn status_name(s: Option<FlowStatus>) -> String {
    match s {
        None => "none".into(),
        Some(FlowStatus::Ok) => "ok".into(),
        Some(FlowStatus::InsufficientThroughput) => "insufficient_throughput".into(),
        Some(FlowStatus::UnknownPolicyId) => "unknown_policy_id".into(),
        Some(FlowStatus::ConfigurationMismatch) => "configuration_mismatch".into(),
        Some(FlowStatus::NotAvailable) => "not_available".into(),
        Some(FlowStatus::Unrecognized(v)) => format!("unrecognized_{v}"),
    }
}

/// Starts the `--loopback` server for the SMB2 workloads: control plane
/// and one pinned worker per `--server-cores` entry, `smb2` upper layer on
/// a memory store that holds the file, listening on `listen`.
pub fn start_smb2_server<P: Provider>(
    provider: Arc<P>,
    opts: &BenchOptions,
    listen: SocketAddr,
) -> Result<RunningServer, BenchError> {
    // The store hands out whole blocks and keeps some for metadata: the
    // file plus 16 MiB, in 2 MiB units (hugepage-backed when reserved).
    let store_size = (opts.smb2.file_size + (16 << 20)).next_multiple_of(2 << 20);
    let store = MemStoreFactory::new(store_size)
        .map_err(|e| BenchError::failed("creating the loopback server's memory store", e))?;
    let store: Arc<dyn StoreFactory> = Arc::new(store);
    // Staging buffers for RDMA transfers: as many as operations in flight,
    // in the class of --size (at least the 64 KiB one).
    let pool_mem = server_pool_mem(opts, opts.size.max((64 << 10) + 1));
    let mut cfg = loopback_server_config(opts, listen, pool_mem);
    // The set-up connection may still be closing when the run's open.
    cfg.max_connections = opts.connections + 2;
    cfg.store_description = store.describe();
    let smb2 = Smb2Config::default();
    let next = AtomicUsize::new(0);
    start(provider, cfg, move || {
        let i = next.fetch_add(1, Ordering::Relaxed);
        Smb2Server::new(smb2.clone(), store.handle(i))
    })
    .map_err(|e| BenchError::failed("starting the loopback server (upper smb2)", e))
}

/// An SMB2 workload against the server at `addr`.
pub struct Smb2Workload<'a, P: Provider> {
    provider: Arc<P>,
    addr: SocketAddr,
    kind: WorkloadKind,
    size: usize,
    queue_depth: u32,
    connections: usize,
    verify: bool,
    smbd: SmbdConfig,
    transfer_inline: bool,
    read_pct: u8,
    /// Blocks of each (connection, slot) region.
    per_region: u64,
    qos: Option<QosSpec>,
    retained: &'a Retained,
    flows: Arc<Mutex<Vec<FlowReport>>>,
}

fn call_error(index: Option<usize>, what: &str, e: Smb2Error) -> BenchError {
    let during = match index {
        Some(i) => format!("connection {i}: {what}"),
        None => format!("set-up: {what}"),
    };
    BenchError::failed(during, e)
}

impl<'a, P: Provider> Smb2Workload<'a, P> {
    /// Checks `opts` against the file layout, then creates and fills the
    /// file over a set-up connection.
    pub fn new(
        provider: Arc<P>,
        addr: SocketAddr,
        opts: &BenchOptions,
        retained: &'a Retained,
    ) -> Result<Self, BenchError> {
        let size = opts.size as u64;
        let blocks = opts.smb2.file_size / size;
        let regions = opts.connections as u64 * u64::from(opts.queue_depth);
        let per_region = blocks / regions;
        if per_region == 0 {
            return Err(BenchError::Usage(format!(
                "--file-size {} holds {blocks} blocks of --size {size}, fewer than connections x queue depth ({regions}): every operation in flight needs its own block",
                opts.smb2.file_size
            )));
        }
        let qos = (opts.workload == WorkloadKind::Qos).then(|| {
            let s = &opts.smb2;
            QosSpec {
                flows: s.flows.unwrap_or(opts.connections as u32),
                policy_id: s
                    .policy_id
                    .as_deref()
                    .and_then(|g| g.parse().ok())
                    .unwrap_or(Guid::NULL),
                limit: s.limit.unwrap_or(0),
                reservation: s.reservation.unwrap_or(0),
                bandwidth_limit: s.bandwidth_limit.unwrap_or(0),
                ignore_limit: s.ignore_limit,
            }
        });
        let w = Smb2Workload {
            provider,
            addr,
            kind: opts.workload,
            size: opts.size,
            queue_depth: opts.queue_depth,
            connections: opts.connections,
            verify: opts.verify,
            smbd: client_smbd(opts),
            transfer_inline: opts.smb2.inline,
            read_pct: match opts.workload {
                WorkloadKind::Read => 100,
                WorkloadKind::Write => 0,
                _ => opts.smb2.read_pct,
            },
            per_region,
            qos,
            retained,
            flows: Arc::new(Mutex::new(Vec::new())),
        };
        w.prefill(blocks * size)?;
        Ok(w)
    }

    /// The flows' results (after the run).
    pub fn flow_reports(&self) -> Vec<FlowReport> {
        let mut v = self.flows.lock().unwrap_or_else(|p| p.into_inner()).clone();
        v.sort_by(|a, b| a.flow_id.cmp(&b.flow_id));
        v
    }

    /// `inline`, `rdma_v1` or `rdma_v1_invalidate`.
    pub fn channel(&self) -> &'static str {
        if self.transfer_inline {
            "inline"
        } else {
            "rdma_v1_invalidate"
        }
    }

    /// Connects (`index`: None for the set-up connection), negotiates, sets
    /// up an anonymous session and connects to the share; the pool holds
    /// `queue_depth` buffers of `io_size`.
    fn connect(
        &self,
        index: Option<usize>,
        io_size: usize,
        queue_depth: u32,
    ) -> Result<Smb2Client<P>, BenchError> {
        let cfg = self.smbd.clone();
        // Inline, every request or response also needs a message buffer of
        // the data plus its SMB2 header (sent, or reassembled).
        let pool = if self.transfer_inline {
            client_pool(&cfg, io_size + 4096, 2 * queue_depth)
        } else {
            client_pool(&cfg, io_size, queue_depth)
        }
        .build()
        .map_err(|e| call_error_s(index, "client buffer pool", e))?;
        self.retained.keep(pool.clone());
        // SAFETY: `retained` keeps the pool mapped until after the provider
        // is dropped (`super::run` creates it first).
        let mr = unsafe { self.provider.register_pool(&pool) }
            .map_err(|e| call_error_s(index, "registering memory", e))?;
        let alloc = pool
            .claim_slice(0)
            .map_err(|e| call_error_s(index, "client buffer pool", e))?;
        let options = Smb2ClientOptions {
            timeout: CALL_TIMEOUT,
            max_outstanding: queue_depth as usize * 2 + 8,
            idle_park: None,
            ..Smb2ClientOptions::default()
        };
        let mut c = Smb2Client::connect(
            &*self.provider,
            self.addr,
            cfg,
            alloc,
            mr,
            Duration::from_secs(10),
            options,
        )
        .map_err(|e| call_error(index, &format!("connecting to {}", self.addr), e))?;
        if let Err(e) = c.negotiate(&DIALECTS) {
            let hint = if c.stats().discarded > 0 {
                format!(
                    " (the server answered with something that is not an SMB2 response: --workload {} needs a server with --upper smb2; `serve --upper echo` serves --workload send only)",
                    self.kind.name()
                )
            } else {
                String::new()
            };
            let _ = c.disconnect(Duration::from_secs(1));
            return Err(BenchError::failed(
                match index {
                    Some(i) => format!("connection {i}: SMB2 NEGOTIATE"),
                    None => "set-up: SMB2 NEGOTIATE".into(),
                },
                format!("{e}{hint}"),
            ));
        }
        c.session_setup_anonymous()
            .map_err(|e| call_error(index, "SESSION_SETUP", e))?;
        c.tree_connect(DEFAULT_SHARE)
            .map_err(|e| call_error(index, &format!("TREE_CONNECT to {DEFAULT_SHARE}"), e))?;
        Ok(c)
    }

    fn transfer(&self, c: &Smb2Client<P>) -> Transfer {
        if self.transfer_inline {
            return Transfer::Inline;
        }
        let invalidate = c
            .negotiated()
            .is_some_and(|n| n.dialect != Dialect::SMB_3_0);
        Transfer::Rdma {
            descriptors: 1,
            invalidate,
        }
    }

    /// Creates the file and writes every block's pattern.
    fn prefill(&self, len: u64) -> Result<(), BenchError> {
        // Chunks of whole blocks, up to 1 MiB over RDMA (16 KiB inline: a
        // message's fragments all need send buffers at once).
        let max = if self.transfer_inline {
            16 << 10
        } else {
            1 << 20
        };
        let blocks_per_chunk = (max / self.size).max(1);
        let chunk = blocks_per_chunk * self.size;
        // The client's synchronous WRITE stages through one I/O buffer of
        // the next power of two (at least 4 KiB): the pool's class must
        // hold that, not just `chunk` (5 blocks of 192 KiB are 960 KiB).
        let mut c = self.connect(None, chunk.max(4096).next_power_of_two(), 1)?;
        let t = self.transfer(&c);
        let fid = c
            .create(
                FILE_NAME,
                CreateDisposition::OVERWRITE_IF,
                CreateOptions::NON_DIRECTORY_FILE,
            )
            .map_err(|e| call_error(None, &format!("CREATE {FILE_NAME}"), e))?
            .file_id;
        let mut data = vec![0u8; chunk];
        let mut off = 0u64;
        while off < len {
            let n = (chunk as u64).min(len - off) as usize;
            let first = off / self.size as u64;
            for (i, b) in data[..n].chunks_mut(self.size).enumerate() {
                pattern::fill(b, block_seed(first + i as u64));
            }
            let wrote = c
                .write(fid, off, &data[..n], t)
                .map_err(|e| call_error(None, &format!("WRITE at {off} (filling the file)"), e))?;
            if wrote as usize != n {
                return Err(BenchError::failed(
                    "set-up",
                    format!("WRITE at {off} wrote {wrote} of {n} bytes"),
                ));
            }
            off += n as u64;
        }
        let _ = c.close(fid);
        let _ = c.disconnect(Duration::from_secs(2));
        Ok(())
    }
}

fn call_error_s(index: Option<usize>, what: &str, e: impl std::fmt::Display) -> BenchError {
    let during = match index {
        Some(i) => format!("connection {i}: {what}"),
        None => format!("set-up: {what}"),
    };
    BenchError::failed(during, e)
}

/// One logical flow of a `qos` session.
struct Flow {
    fid: FileId,
    flow: LogicalFlow,
    requested_limit: u64,
    /// Bytes of the SMB2 I/Os completed in the measured window.
    measured_bytes: u64,
    /// Sum of their normalized sizes.
    measured_normalized: u64,
}

/// What a slot's operation is waiting for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Idle,
    /// Held back by the flow's initiation limit.
    Deferred,
    Read,
    Write,
    /// The read-back of a verified WRITE.
    ReadBack,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    buf: IoBuf,
    id: MessageId,
    phase: Phase,
    seq: u64,
    block: u64,
    /// Index in the expected-pattern table.
    expect_at: usize,
    flow: usize,
    measured: bool,
    /// Operations this slot started (walks its blocks).
    count: u64,
}

/// One connection of an SMB2 workload.
pub struct Smb2Session<P: Provider> {
    c: Smb2Client<P>,
    index: usize,
    size: usize,
    read_pct: u8,
    verify: bool,
    transfer: Transfer,
    regions: u64,
    per_region: u64,
    slots: Box<[Slot]>,
    /// Pattern seed each of this connection's blocks holds.
    expected: Box<[u64]>,
    fids: Vec<FileId>,
    flows: Vec<Flow>,
    next_flow: usize,
    ignore_limit: bool,
    deferred: VecDeque<u32>,
    /// Completions a submit polled while waiting for credits.
    stash: VecDeque<Completion>,
    measure_start: Option<Instant>,
    last_measured_done: Option<Instant>,
    reports: Arc<Mutex<Vec<FlowReport>>>,
}

impl<P: Provider> Workload for Smb2Workload<'_, P> {
    type Session = Smb2Session<P>;

    fn name(&self) -> &'static str {
        self.kind.name()
    }

    fn bytes_per_op(&self) -> u64 {
        self.size as u64
    }

    fn open(&self, index: usize) -> Result<Smb2Session<P>, BenchError> {
        let qd = self.queue_depth as usize;
        let mut c = self.connect(Some(index), self.size, self.queue_depth)?;
        let transfer = self.transfer(&c);
        let mut fids = Vec::new();
        let mut flows = Vec::new();
        let open = |c: &mut Smb2Client<P>| {
            c.create(
                FILE_NAME,
                CreateDisposition::OPEN,
                CreateOptions::NON_DIRECTORY_FILE,
            )
            .map(|i| i.file_id)
            .map_err(|e| call_error(Some(index), &format!("CREATE {FILE_NAME}"), e))
        };
        match self.qos {
            None => fids.push(open(&mut c)?),
            Some(q) => {
                for f in (index..q.flows as usize).step_by(self.connections) {
                    let fid = open(&mut c)?;
                    fids.push(fid);
                    let id = flow_guid(f);
                    let mut flow = LogicalFlow::new(id, QosDialect::V1_1);
                    let policy = PolicyParams {
                        policy_id: q.policy_id,
                        limit: q.limit,
                        reservation: q.reservation,
                        bandwidth_limit: q.bandwidth_limit,
                        ..PolicyParams::default()
                    };
                    let now = c.now();
                    c.qos_set_policy(fid, &mut flow, policy, now).map_err(|e| {
                        call_error(Some(index), &format!("SET_POLICY of flow {id}"), e)
                    })?;
                    flows.push(Flow {
                        fid,
                        flow,
                        requested_limit: q.limit,
                        measured_bytes: 0,
                        measured_normalized: 0,
                    });
                }
                if flows.is_empty() {
                    return Err(BenchError::Usage(format!(
                        "--flows {} is fewer than --connections {}: every connection needs a flow",
                        q.flows, self.connections
                    )));
                }
            }
        }
        let regions = self.connections as u64 * qd as u64;
        let mut slots = Vec::with_capacity(qd);
        let mut expected = Vec::with_capacity(qd * self.per_region as usize);
        for s in 0..qd {
            let buf = c
                .alloc_io_buf(self.size)
                .map_err(|e| call_error(Some(index), "I/O buffer", e))?;
            if let Some(b) = c.io_buf_mut(buf) {
                pattern::fill(b, u64::MAX >> 8);
            }
            let region = (index * qd + s) as u64;
            for j in 0..self.per_region {
                expected.push(block_seed(region + regions * j));
            }
            slots.push(Slot {
                buf,
                id: MessageId(0),
                phase: Phase::Idle,
                seq: 0,
                block: 0,
                expect_at: 0,
                flow: 0,
                measured: false,
                count: 0,
            });
        }
        Ok(Smb2Session {
            c,
            index,
            size: self.size,
            read_pct: self.read_pct,
            verify: self.verify,
            transfer,
            regions,
            per_region: self.per_region,
            slots: slots.into_boxed_slice(),
            expected: expected.into_boxed_slice(),
            fids,
            flows,
            next_flow: 0,
            ignore_limit: self.qos.is_some_and(|q| q.ignore_limit),
            deferred: VecDeque::with_capacity(qd),
            stash: VecDeque::with_capacity(qd * 2 + 8),
            measure_start: None,
            last_measured_done: None,
            reports: self.flows.clone(),
        })
    }
}

/// LogicalFlowID of flow `f`: unique per process and flow.
fn flow_guid(f: usize) -> Guid {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let pid = std::process::id();
    let mut tail = [0u8; 8];
    tail[..4].copy_from_slice(&nanos.to_le_bytes());
    tail[4..].copy_from_slice(&(f as u32).to_be_bytes());
    Guid::from_fields(
        0x5b3d_0000 ^ pid,
        0xbe4c,
        0x4000 | (f as u16 & 0x0fff),
        tail,
    )
}

impl<P: Provider> Smb2Session<P> {
    fn err(&self, what: &str, e: impl std::fmt::Display) -> BenchError {
        BenchError::failed(format!("connection {}: {what}", self.index), e)
    }

    /// Sends slot `s`'s request for its current phase, waiting for credits
    /// if none are left (completions polled meanwhile are stashed).
    fn submit(&mut self, s: usize) -> Result<(), BenchError> {
        // The clock is read only once a request has to wait for credits.
        let mut deadline = None;
        loop {
            let sl = self.slots[s];
            let fid = if self.flows.is_empty() {
                self.fids[0]
            } else {
                self.flows[sl.flow].fid
            };
            let off = sl.block * self.size as u64;
            let len = self.size as u32;
            marks::mark(Point::ClientPostBegin);
            let r = match sl.phase {
                Phase::Write => self.c.submit_write(fid, off, len, sl.buf, self.transfer),
                _ => self.c.submit_read(fid, off, len, sl.buf, self.transfer),
            };
            marks::mark(Point::ClientPostEnd);
            match r {
                Ok(id) => {
                    self.slots[s].id = id;
                    return Ok(());
                }
                Err(Smb2Error::NoCredits { .. })
                    if clock::now()
                        < *deadline.get_or_insert_with(|| clock::now() + CREDIT_WAIT) =>
                {
                    match self.c.poll(Duration::ZERO) {
                        Ok(Some(done)) => self.stash.push_back(done),
                        Ok(None) => std::hint::spin_loop(),
                        Err(e) => return Err(self.err("waiting for credits", e)),
                    }
                }
                Err(e) => {
                    let what = if sl.phase == Phase::Write {
                        "WRITE"
                    } else {
                        "READ"
                    };
                    return Err(self.err(what, e));
                }
            }
        }
    }

    /// Starts slot `s`'s operation now (it was assigned its phase).
    fn launch(&mut self, s: usize) -> Result<(), BenchError> {
        if !self.ignore_limit && !self.flows.is_empty() {
            let f = self.slots[s].flow;
            let now = self.c.now();
            if self.flows[f]
                .flow
                .may_initiate(now, self.size as u64)
                .is_err()
            {
                self.slots[s].phase = Phase::Deferred;
                self.deferred.push_back(s as u32);
                return Ok(());
            }
        }
        if self.slots[s].phase == Phase::Deferred {
            self.slots[s].phase = if is_read(self.slots[s].seq, self.read_pct) {
                Phase::Read
            } else {
                Phase::Write
            };
        }
        if self.slots[s].phase == Phase::Write && self.verify {
            let (buf, seq) = (self.slots[s].buf, self.slots[s].seq);
            match self.c.io_buf_mut(buf) {
                Some(b) => pattern::fill(b, seq),
                None => return Err(self.err("WRITE", "its buffer is still lent")),
            }
        }
        self.submit(s)
    }

    /// Releases deferred operations whose flow now allows them.
    fn release_deferred(&mut self) -> Result<(), BenchError> {
        for _ in 0..self.deferred.len() {
            let Some(s) = self.deferred.pop_front() else {
                break;
            };
            self.launch(s as usize)?;
        }
        Ok(())
    }

    /// Sends the status requests whose StatusRequestTimer expired.
    fn qos_timers(&mut self) -> Result<(), BenchError> {
        for i in 0..self.flows.len() {
            let now = self.c.now();
            if self.flows[i].flow.poll_timeout().is_some_and(|t| t <= now) {
                let fid = self.flows[i].fid;
                let r = self.c.qos_get_status(fid, &mut self.flows[i].flow, now);
                if let Err(e) = r {
                    if matches!(e, Smb2Error::Transport(_)) {
                        return Err(self.err("GET_STATUS", e));
                    }
                    // A refused status request arms the 10 s retry
                    // ([MS-SQOS] 3.1.5.1); the run goes on.
                }
            }
        }
        Ok(())
    }

    /// One completion: either the operation ends (reported to `done`) or
    /// its verified WRITE goes on with the read-back.
    fn complete(&mut self, c: Completion, done: &mut dyn FnMut(Outcome)) -> Result<(), BenchError> {
        let Some(s) = self.slots.iter().position(|sl| {
            sl.id == c.id && matches!(sl.phase, Phase::Read | Phase::Write | Phase::ReadBack)
        }) else {
            return Err(self.err(
                "polling",
                format!("a completion for request {} that no slot sent", c.id.0),
            ));
        };
        let sl = self.slots[s];
        let now = clock::now();
        let mut ok = match c.result {
            Ok(n) => n as usize == self.size,
            Err(Smb2Error::Transport(e)) => return Err(self.err("the connection failed", e)),
            Err(_) => false,
        };
        if !self.flows.is_empty() {
            let lat = smbdirect_protocol::time::Duration::from_nanos(
                u64::try_from(c.latency.as_nanos()).unwrap_or(u64::MAX),
            );
            let f = &mut self.flows[sl.flow];
            f.flow.record_io(self.size as u64, lat, lat);
            if sl.measured {
                f.measured_bytes += self.size as u64;
                f.measured_normalized +=
                    normalized_io_size(self.size as u64, f.flow.base_io_size());
            }
        }
        if ok && self.verify {
            match sl.phase {
                Phase::Read => {
                    let want = self.expected[sl.expect_at];
                    ok = self
                        .c
                        .io_buf(sl.buf)
                        .is_some_and(|b| pattern::check(b, want));
                }
                Phase::ReadBack => {
                    ok = self
                        .c
                        .io_buf(sl.buf)
                        .is_some_and(|b| pattern::check(b, sl.seq));
                }
                Phase::Write => {
                    self.expected[sl.expect_at] = sl.seq;
                    self.slots[s].phase = Phase::ReadBack;
                    return self.submit(s);
                }
                Phase::Idle | Phase::Deferred => {}
            }
        }
        self.slots[s].phase = Phase::Idle;
        if sl.measured {
            self.last_measured_done = Some(now);
        }
        marks::mark(Point::ClientDone);
        done(Outcome { slot: s as u32, ok });
        Ok(())
    }
}

impl<P: Provider> Session for Smb2Session<P> {
    fn start(&mut self, slot: u32, seq: u64) -> Result<(), BenchError> {
        let s = slot as usize;
        let Some(sl) = self.slots.get(s).copied() else {
            return Err(self.err("start", format!("slot {slot} beyond the queue depth")));
        };
        let j = sl.count % self.per_region;
        let region = (self.index * self.slots.len() + s) as u64;
        let now = clock::now();
        let flow = if self.flows.is_empty() {
            0
        } else {
            self.next_flow = (self.next_flow + 1) % self.flows.len();
            self.next_flow
        };
        self.slots[s] = Slot {
            phase: if is_read(seq, self.read_pct) {
                Phase::Read
            } else {
                Phase::Write
            },
            seq,
            block: region + self.regions * j,
            expect_at: s * self.per_region as usize + j as usize,
            flow,
            measured: self.measure_start.is_some_and(|m| now >= m),
            count: sl.count + 1,
            ..sl
        };
        self.launch(s)
    }

    fn poll(&mut self, done: &mut dyn FnMut(Outcome)) -> Result<bool, BenchError> {
        let mut progressed = false;
        if !self.flows.is_empty() {
            self.qos_timers()?;
            if !self.deferred.is_empty() {
                self.release_deferred()?;
            }
        }
        while let Some(c) = self.stash.pop_front() {
            progressed = true;
            self.complete(c, done)?;
        }
        for _ in 0..self.slots.len() {
            match self.c.poll(Duration::ZERO) {
                Ok(Some(c)) => {
                    progressed = true;
                    self.complete(c, done)?;
                }
                Ok(None) => break,
                Err(e) => return Err(self.err("polling", e)),
            }
        }
        Ok(progressed)
    }

    fn begin(&mut self, measure_start: Instant) {
        self.measure_start = Some(measure_start);
    }

    fn credit_stalls(&self) -> u64 {
        self.c.client().connection().stats().credit_stalls
    }

    fn describe(&self) -> String {
        let st = self.c.stats();
        format!(
            "SMB2: {} requests outstanding, {} credits, {} requests sent, {} responses, {} discarded; {} held back by the QoS initiation limit",
            self.c.outstanding(),
            self.c.credits().available(),
            st.requests,
            st.responses,
            st.discarded,
            self.deferred.len()
        )
    }

    fn close(mut self) {
        if !self.flows.is_empty() {
            let secs = match (self.measure_start, self.last_measured_done) {
                (Some(m), Some(l)) => l.saturating_duration_since(m).as_secs_f64(),
                _ => 0.0,
            };
            let rate = |v: u64| if secs > 0.0 { v as f64 / secs } else { 0.0 };
            let mut out = Vec::with_capacity(self.flows.len());
            for f in &mut self.flows {
                // A last status (and the counters' last UPDATE_COUNTERS).
                let now = self.c.now();
                let _ = self.c.qos_get_status(f.fid, &mut f.flow, now);
                let server_limit = f.flow.maximum_io_rate();
                out.push(FlowReport {
                    flow_id: f.flow.logical_flow_id().to_string(),
                    limit_iops: if server_limit > 0 {
                        server_limit
                    } else {
                        f.requested_limit
                    },
                    achieved_iops: rate(f.measured_normalized),
                    achieved_kbps: rate(f.measured_bytes) / 1024.0,
                    status: status_name(f.flow.last_status()),
                });
            }
            self.reports
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(out);
        }
        // Wait for what is still in flight (the runner only closes once
        // nothing is), then close the opens.
        for fid in std::mem::take(&mut self.fids) {
            let _ = self.c.close(fid);
        }
        let _ = self.c.disconnect(Duration::from_secs(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_percentage_is_honoured_over_many_operations() {
        for pct in [0u8, 30, 50, 100] {
            let reads = (0..10_000u64).filter(|&s| is_read(s, pct)).count();
            let want = pct as usize * 100;
            assert!(
                reads.abs_diff(want) <= 300,
                "{pct} %: {reads} reads of 10000"
            );
        }
    }

    #[test]
    fn block_seeds_never_collide_with_operation_numbers() {
        assert!(block_seed(0) > pattern::seq_base(255) + (1 << 40));
        assert!(block_seed(1 << 40) < 1 << 56);
    }
}
