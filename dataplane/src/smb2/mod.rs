//! The `smb2` upper layer: SMB2 over SMB Direct (no Direct TCP transport
//! header, [MS-SMB2] 2.1), server side, wire-exact through
//! `smbdirect_protocol::smb2`.
//!
//! Served: NEGOTIATE (3.0, 3.0.2, 3.1.1 with preauth integrity and signing
//! capabilities), SESSION_SETUP (NTLMSSP against local users with signing,
//! or anonymous/guest sessions), LOGOFF, TREE_CONNECT (the share and IPC$),
//! TREE_DISCONNECT, CREATE (with MxAc/QFid answers, delete-on-close), CLOSE,
//! FLUSH, READ/WRITE inline and through SMB2_CHANNEL_RDMA_V1 and
//! SMB2_CHANNEL_RDMA_V1_INVALIDATE (any number of descriptors, in any
//! position of a compound), QUERY_INFO, SET_INFO, QUERY_DIRECTORY, LOCK
//! (fs.rs), ECHO, IOCTL (FSCTL_STORAGE_QOS_CONTROL answered by the control
//! plane, VALIDATE_NEGOTIATE_INFO, QUERY_NETWORK_INTERFACE_INFO; DFS
//! referrals STATUS_FS_DRIVER_REQUIRED; other codes STATUS_NOT_SUPPORTED),
//! compounds, credits with the CommandSequenceWindow ([MS-SMB2] 3.3.1.1,
//! 3.3.5.2.3) and CreditCharge validation (3.3.5.2.5). CHANGE_NOTIFY and
//! oplocks/leases are not offered.
//!
//! # Requests that wait
//!
//! A request that cannot finish inside its handler — a READ/WRITE over its
//! Storage QoS flow's limits (it waits in the worker's QoS queue), a store
//! operation that went to the disk (io_uring), an IOCTL the control plane
//! answers, an RDMA transfer of a request that is not the last of its
//! compound — keeps its message ([`Replies::hold`]) with its progress in an
//! `Exec`, and the responses of the compound's earlier requests are sent
//! at once. The worker hands the message back ([`UpperLayer::on_wake`])
//! when what it waited for has happened, and execution resumes at the
//! request that waited. Later messages of the connection go on meanwhile
//! (responses may be sent out of order, [MS-SMB2] 3.3.4.2; no interim
//! STATUS_PENDING is sent, see docs/spec-notes.md).
//!
//! The common case — a READ/WRITE that is the last (or only) request of
//! its message, on the memory store, within its limits — never holds: its
//! RDMA transfer is staged, the message released, and the response built
//! from the RDMA context on completion. Nothing on that path allocates.

pub mod client;
pub mod dirstore;
mod fs;
pub mod memstore;
pub mod store;

use crate::idhash::{id_map, IdMap};
use crate::planes::{ConnId, QosFlowAssign, UpperControl, UpperEvent};
use crate::provider::MemoryRegion;
use crate::ratelog::{suppressed_note, RateLimited};
use crate::upper::{
    Backpressure, RdmaDone, RdmaError, RdmaKind, Replies, Ticket, UpperIo, UpperLayer,
};
use crate::zerocopy::{Piece, Pins};
use smbdirect_protocol::ntstatus::*;
use smbdirect_protocol::smb2::auth;
use smbdirect_protocol::smb2::*;
use smbdirect_protocol::sqos::enforcement::{FlowSlot, Lane, Scheduler, SchedulerConfig};
use smbdirect_protocol::sqos::FSCTL_STORAGE_QOS_CONTROL;
use smbdirect_protocol::time::Instant as PInstant;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use store::{Disposition, Handle, OpenRequest, Poll, Store};

/// Credits a connection may hold outstanding.
pub const MAX_CREDITS: u32 = 512;
/// Span of the CommandSequenceWindow kept per connection: MessageIds more
/// than this far above the lowest unused one are refused.
pub const SEQ_WINDOW: u64 = 4096;
/// TreeId of the share.
pub const SHARE_TREE_ID: u32 = 1;
/// TreeId of IPC$ (the inter-process share clients connect to for
/// FSCTLs such as QUERY_NETWORK_INTERFACE_INFO, [MS-SMB2] 3.3.5.7).
pub const IPC_TREE_ID: u32 = 2;
/// Default share name (`--share`).
pub const DEFAULT_SHARE: &str = "data";
/// Largest inline READ/WRITE payload (a response must fit one reassembled
/// SMB Direct message, default MaxFragmentedRecvSize 1 MiB).
pub const MAX_INLINE: u32 = (1 << 20) - 4096;
/// Response scratch buffer per worker.
const SCRATCH_LEN: usize = 1 << 20;
/// Where the response header starts in an RDMA context.
const CTX_HEADER: usize = 48;
/// Context of an RDMA operation (see [`plan`]).
const CTX_LEN: usize = CTX_HEADER + HEADER_LEN;
/// Maximal access granted on the share (FILE_ALL_ACCESS).
const FILE_ALL_ACCESS: u32 = 0x001F_01FF;
/// Requests the QoS queue dispatches per poll-loop iteration; more ready
/// requests than this mark the worker saturated for the window.
const QOS_DISPATCH_BUDGET: usize = 32;
/// Storage QoS window reports sent to the control plane per poll-loop
/// iteration at most (fewer when its ring has less room): a window closing
/// on thousands of flows is reported over a few iterations, never queued
/// beyond the ring, and a window lasts 100 ms.
const QOS_REPORT_BUDGET: usize = 64;
/// Largest Storage QoS control request forwarded to the control plane
/// (the fixed part plus two maximal names, [MS-SQOS] 2.2.2.2).
const MAX_QOS_REQUEST: usize = 4096;
/// LinkSpeed FSCTL_QUERY_NETWORK_INTERFACE_INFO reports (10 Gb/s, bits per
/// second; [MS-SMB2] 2.2.32.5: implementation-specific).
const INTERFACE_LINK_SPEED: u64 = 10_000_000_000;

/// How the SMB2 layer of each worker is set up.
#[derive(Debug, Clone)]
pub struct Smb2Config {
    /// The share's name (TREE_CONNECT `\\server\NAME`).
    pub share: String,
    /// Storage QoS: flow slots in each worker's scheduler.
    pub qos_max_flows: usize,
    /// Storage QoS: requests that may wait in each worker's queue.
    pub qos_max_queued: usize,
    /// The share's default Storage QoS policy: every file Open on it becomes
    /// a logical flow under this PolicyID (`--share NAME:policy=GUID`).
    pub default_policy: Option<smbdirect_protocol::sqos::Guid>,
    /// Local users ([MS-SMB2] 3.3.5.5.3 with NTLMSSP): None serves
    /// anonymous/guest sessions only (any security buffer is accepted).
    pub users: Option<std::sync::Arc<dyn UserLookup>>,
    /// With `users`: sessions without credentials (anonymous NTLMSSP, an
    /// empty security buffer) are accepted as null sessions.
    pub guest_ok: bool,
    /// Sign every response of authenticated sessions and require signed
    /// requests (SMB2_NEGOTIATE_SIGNING_REQUIRED).
    pub require_signing: bool,
    /// The server's name in NTLMSSP CHALLENGE target info.
    pub server_name: String,
    /// Byte-range locks of the share's files, shared by every worker (LOCK
    /// is not on the READ/WRITE path).
    pub locks: std::sync::Arc<fs::LockTable>,
    /// The addresses FSCTL_QUERY_NETWORK_INTERFACE_INFO reports, one
    /// RDMA-capable interface each ([MS-SMB2] 3.3.5.15.11); empty: the
    /// FSCTL is STATUS_NOT_SUPPORTED.
    pub interfaces: Vec<std::net::IpAddr>,
}

impl Default for Smb2Config {
    fn default() -> Self {
        Smb2Config {
            share: DEFAULT_SHARE.to_string(),
            qos_max_flows: 4096,
            qos_max_queued: 8192,
            default_policy: None,
            users: None,
            guest_ok: true,
            require_signing: false,
            server_name: "smbdirectd".into(),
            locks: Default::default(),
            interfaces: Vec::new(),
        }
    }
}

/// Where SESSION_SETUP finds a user's NT hash (MD4 of the UTF-16LE
/// password), e.g. the daemon's `--users` file.
pub trait UserLookup: Send + Sync + core::fmt::Debug {
    /// The NT hash of `user` (case-insensitive), if it may log on.
    fn nt_hash(&self, user: &str) -> Option<[u8; 16]>;
}

/// What the client said in NEGOTIATE, for FSCTL_VALIDATE_NEGOTIATE_INFO
/// ([MS-SMB2] 3.3.5.15.12), and what was settled.
#[derive(Debug)]
struct NegotiateState {
    client_capabilities: u32,
    client_guid: Guid,
    client_security_mode: u16,
    client_dialects: Vec<u16>,
    server_capabilities: u32,
    server_security_mode: u16,
    signing: Option<SigningAlgorithm>,
}

/// A session's authentication and signing state.
#[derive(Debug)]
struct SessionAuth {
    /// NTLMSSP exchange in progress.
    acceptor: Option<auth::Acceptor>,
    /// 3.1.1 Session.PreauthIntegrityHashValue.
    preauth: Option<auth::preauth::PreauthHash>,
    /// Session.SigningKey (None: null/anonymous session).
    key: Option<[u8; 16]>,
    /// Session.SigningRequired.
    signing_required: bool,
    /// Authentication completed.
    ready: bool,
}

/// One open.
#[derive(Debug)]
struct Open {
    persistent: u64,
    handle: Handle,
    is_dir: bool,
    /// The Storage QoS flow this Open's I/O is charged to (a direct
    /// reference: no lookup per I/O).
    flow: Option<FlowSlot>,
    /// Credit the flow lent this Open: most I/O is admitted from it without
    /// reading the flow's records (see `Lane`).
    lane: Lane,
    /// Named in a QoS request: the control plane keeps state for it.
    qos_named: bool,
    /// The share's default QoS policy applies and the control plane has
    /// not yet answered with the Open's flow: its READs and WRITEs wait
    /// ([`Wait::Flow`]) rather than run unlimited until then.
    flow_pending: bool,
    /// The store's id of the file (FileInternalInformation, lock table key).
    file_id: u64,
    /// The share-relative path it was opened by (FileNameInformation).
    path: String,
    /// QUERY_DIRECTORY enumeration state (fs.rs).
    dir: Option<fs::DirCursor>,
}

/// [MS-SMB2] 3.3.1.1 CommandSequenceWindow: the MessageIds granted and not
/// yet used, as `[low, high)` with a bitmap of those used above `low`.
#[derive(Debug)]
struct SeqWindow {
    low: u64,
    high: u64,
    used: [u64; (SEQ_WINDOW / 64) as usize],
}

impl SeqWindow {
    fn new() -> Self {
        // 3.3.1.1 / 3.3.5.1: a new connection's window holds MessageId 0.
        SeqWindow {
            low: 0,
            high: 1,
            used: [0; (SEQ_WINDOW / 64) as usize],
        }
    }

    fn bit(&self, id: u64) -> bool {
        let i = (id % SEQ_WINDOW) as usize;
        self.used[i / 64] & (1 << (i % 64)) != 0
    }

    fn set(&mut self, id: u64, v: bool) {
        let i = (id % SEQ_WINDOW) as usize;
        if v {
            self.used[i / 64] |= 1 << (i % 64);
        } else {
            self.used[i / 64] &= !(1 << (i % 64));
        }
    }

    /// 3.3.5.2.3: `[mid, mid + n)` must lie in the window and be unused;
    /// uses them and slides the window.
    fn consume(&mut self, mid: u64, n: u64) -> bool {
        let n = n.max(1);
        let Some(end) = mid.checked_add(n) else {
            return false;
        };
        if mid < self.low || end > self.high {
            return false;
        }
        if (mid..end).any(|id| self.bit(id)) {
            return false;
        }
        (mid..end).for_each(|id| self.set(id, true));
        while self.low < self.high && self.bit(self.low) {
            self.set(self.low, false);
            self.low += 1;
        }
        true
    }

    /// Room for more grants within [`SEQ_WINDOW`].
    fn room(&self) -> u64 {
        SEQ_WINDOW - (self.high - self.low)
    }

    fn grant(&mut self, n: u64) {
        self.high += n;
    }
}

#[derive(Debug)]
struct Conn {
    dialect: Option<Dialect>,
    session: Option<u64>,
    /// Authentication state of `session`.
    auth: Option<SessionAuth>,
    /// NEGOTIATE as received and answered.
    neg: Option<NegotiateState>,
    /// 3.1.1 Connection.PreauthIntegrityHashValue.
    preauth: Option<auth::preauth::PreauthHash>,
    /// Trees connected: bit 0 the share, bit 1 IPC$.
    trees: u8,
    opens: IdMap<u64, Open>,
    outstanding: u32,
    seq: SeqWindow,
    dead: bool,
}

impl Conn {
    fn tree_connected(&self, tree: u32) -> bool {
        match tree {
            SHARE_TREE_ID => self.trees & 1 != 0,
            IPC_TREE_ID => self.trees & 2 != 0,
            _ => false,
        }
    }

    fn new() -> Self {
        Conn {
            dialect: None,
            session: None,
            auth: None,
            neg: None,
            preauth: None,
            trees: 0,
            opens: id_map(0),
            outstanding: 1,
            seq: SeqWindow::new(),
            dead: false,
        }
    }

    /// [MS-SMB2] 3.3.5.2.3 and 3.3.1.2: checks and consumes the request's
    /// MessageIds (CreditCharge of them), then grants CreditRequest (at
    /// least 1 while room remains, never past MAX_CREDITS outstanding).
    /// None: the MessageId is outside the window or reused.
    fn sequence_and_grant(&mut self, h: &HeaderRepr) -> Option<u16> {
        let charge = u64::from(h.credit_charge.max(1));
        if h.command != Command::Cancel && !self.seq.consume(h.message_id, charge) {
            return None;
        }
        self.outstanding = self.outstanding.saturating_sub(charge as u32);
        let room = (MAX_CREDITS.saturating_sub(self.outstanding) as u64).min(self.seq.room());
        let g = u64::from(h.credit.max(1)).min(room);
        self.outstanding += g as u32;
        self.seq.grant(g);
        Some(g as u16)
    }
}

/// SessionId/TreeId/FileId a related request inherits.
#[derive(Debug, Default, Clone, Copy)]
struct Chain {
    session: u64,
    tree: u32,
    file: Option<FileId>,
}

/// What a waiting request waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// Its turn in the QoS queue.
    Qos,
    /// A store operation (tag = the message's token).
    Store,
    /// The control plane's answer to a QoS IOCTL.
    Ioctl,
    /// Its RDMA transfer (a request not last in its compound).
    Rdma,
    /// The control plane's flow for its Open, under the share's default
    /// QoS policy (`Open::flow_pending`).
    Flow,
}

/// The progress of one message: which request runs next and what the
/// request that waits has obtained so far.
#[derive(Debug)]
struct Exec {
    conn: ConnId,
    token: u64,
    /// Index (in the compound) of the request to run next.
    next: usize,
    chain: Chain,
    /// The credits granted to request `next` (its MessageIds are consumed
    /// once, at its first run).
    grant: Option<u16>,
    /// Request `next` passed QoS admission.
    admitted: bool,
    /// Request `next` sits in the QoS queue.
    queued: bool,
    /// The control plane's answer for request `next`.
    ioctl: Option<Result<Option<Box<[u8]>>, NtStatus>>,
    /// Request `next` staged its RDMA transfer.
    rdma_staged: bool,
    /// Its outcome: bytes moved, or the status to answer with.
    rdma: Option<Result<u32, NtStatus>>,
    /// After an RDMA Read, the store write of its data went to the disk.
    rdma_store: bool,
    /// What it waits for, and whether that has happened.
    wait: Option<Wait>,
    ready: bool,
    /// Responses of earlier requests that met backpressure (and the token
    /// to invalidate with them).
    pending_reply: Option<(Vec<u8>, Option<u32>)>,
    /// A held RDMA request with _INVALIDATE finished: the compound's
    /// response invalidates this token.
    invalidate: Option<u32>,
    /// Sign the responses of this message (a request was signed, or the
    /// session requires it, or SESSION_SETUP completed, 3.3.4.1.1).
    sign: bool,
    /// A LOGOFF of this message ended the session: its id and signing key,
    /// which still sign the LOGOFF response ([MS-SMB2] 3.3.5.6, 3.3.4.1.1).
    ended: Option<(u64, SigningAlgorithm, [u8; 16])>,
    /// Response bytes to add to a preauth integrity hash (3.1.1): range in
    /// the compound response, and whether it is the connection's hash
    /// (NEGOTIATE) or the session's (SESSION_SETUP).
    hash_response: Option<(usize, usize, bool)>,
}

impl Exec {
    fn new(conn: ConnId, token: u64) -> Self {
        Exec {
            conn,
            token,
            next: 0,
            chain: Chain::default(),
            grant: None,
            admitted: false,
            queued: false,
            ioctl: None,
            rdma_staged: false,
            rdma: None,
            rdma_store: false,
            wait: None,
            ready: false,
            pending_reply: None,
            invalidate: None,
            sign: false,
            ended: None,
            hash_response: None,
        }
    }

    /// Request `next` is finished: the following one starts clean.
    fn advance(&mut self) {
        self.next += 1;
        self.grant = None;
        self.admitted = false;
        self.queued = false;
        self.ioctl = None;
        self.rdma_staged = false;
        self.rdma = None;
        self.rdma_store = false;
        self.wait = None;
        self.ready = false;
    }
}

/// A store write after the last-request RDMA Read that went to the disk:
/// the response goes out when it completes.
#[derive(Debug)]
struct PostWrite {
    conn: ConnId,
    handle: Handle,
    offset: u64,
    ctx: [u8; CTX_LEN],
    /// The store's answer, once collected (kept if the reply must wait).
    result: Option<Result<u32, store::StoreError>>,
}

/// An RDMA transfer a request asks for.
#[derive(Debug)]
struct Plan<'a> {
    kind: RdmaKind,
    descs: &'a [u8],
    len: u32,
    handle: Handle,
    file_offset: u64,
    fid: FileId,
    /// MODE_FAST or MODE_HELD.
    mode: u8,
    /// The message's token (the store's tag).
    tag: u64,
    /// SMB2_CHANNEL_RDMA_V1_INVALIDATE: the first descriptor's token, which
    /// the response invalidates.
    invalidate: Option<u32>,
    /// Sign the response (MODE_FAST).
    sign: bool,
    response: HeaderRepr,
}

impl Plan<'_> {
    /// The context the transfer's completion is handled from (see
    /// [`plan`] for its layout).
    fn context(&self) -> [u8; CTX_LEN] {
        // Context: [0] invalidate, [1] mode, [2] sign, [4..8] first token,
        // [8..16] volatile FileId, [16..24] persistent FileId, [24..28]
        // length, [32..40] file offset, [40..48] tag, [48..112] response
        // header.
        let mut ctx = [0u8; CTX_LEN];
        if let Some(t) = self.invalidate {
            ctx[0] = 1;
            ctx[4..8].copy_from_slice(&t.to_le_bytes());
        }
        ctx[1] = self.mode;
        ctx[2] = u8::from(self.sign);
        ctx[8..16].copy_from_slice(&self.fid.volatile.to_le_bytes());
        ctx[16..24].copy_from_slice(&self.fid.persistent.to_le_bytes());
        ctx[24..28].copy_from_slice(&self.len.to_le_bytes());
        ctx[32..40].copy_from_slice(&self.file_offset.to_le_bytes());
        ctx[40..48].copy_from_slice(&self.tag.to_le_bytes());
        let _ = self.response.emit(&mut ctx[CTX_HEADER..]);
        ctx
    }
}

// Not boxed: no allocation per request on the I/O path.
#[allow(clippy::large_enum_variant)]
enum Step<'a> {
    Done,
    Rdma(Plan<'a>),
    Hold(Wait),
    Disconnect,
}

/// Storage QoS on one worker: the scheduler and the flows it knows.
#[derive(Debug)]
struct WorkerQos {
    sched: Scheduler,
    /// Control-plane flow index → (slot, Opens referencing it).
    by_flow: HashMap<u32, (FlowSlot, u32)>,
    /// Slot index → control-plane flow index.
    slot_flow: Vec<u32>,
    window: PInstant,
    saturated: bool,
    /// Reporting the last closed window (the per-flow I/O counts the
    /// control plane aggregates into flow rates and statuses): the next
    /// position of the scheduler's closed list to report, and whether the
    /// worker was saturated in that window. Reports go a few per poll, as
    /// the control plane's ring has room (see [`QOS_REPORT_BUDGET`]).
    report_next: usize,
    report_saturated: bool,
}

/// State shared by the connections of one worker.
struct Core {
    cfg: Smb2Config,
    store: Box<dyn Store>,
    next_session: u64,
    next_file: u64,
    next_token: u64,
    server_guid: Guid,
    salt_seed: u64,
    now: PInstant,
    qos: WorkerQos,
    /// Held messages by token.
    execs: IdMap<u64, Exec>,
    /// Store writes finishing after an RDMA Read, by tag.
    posts: IdMap<u64, PostWrite>,
    wakes: VecDeque<(ConnId, u64)>,
    /// Held requests refused a resource (Backpressure): woken once the
    /// worker may have freed one ([`UpperIo::wake_when_freed`]).
    retries: VecDeque<(ConnId, u64)>,
    events: VecDeque<UpperEvent>,
    /// Inline READ data from the store.
    rbuf: Vec<u8>,
    sessions: u64,
    opens: u64,
    gauges_dirty: bool,
    /// "All QoS flow slots in use", at most once a second.
    flows_full_log: RateLimited,
    /// Peer-misbehaviour warnings, at most once a second per [`Warn`] kind.
    warn_log: [RateLimited; 4],
    /// Counted since the last poll, published to the worker's counters
    /// there: requests that waited for an RDMA data buffer, requests
    /// refused with STATUS_DISK_FULL.
    pool_stalls: u64,
    store_full: u64,
    /// A READ or a pinned WRITE went to the store since the last poll:
    /// its large-copy counts ([`Store::take_copy_counts`]) are collected
    /// there, not asked for at every poll.
    copies_due: bool,
    /// Zero-copy RDMA to and from the store, when it offers it and its
    /// memory is registered ([`UpperLayer::set_zero_copy_regions`]).
    zc: Option<ZeroCopyState>,
}

/// What zero-copy READ and WRITE need: the lkeys of the store's regions,
/// its pin releaser and a scatter list to fill (allocated once).
struct ZeroCopyState {
    lkeys: Vec<u32>,
    pins: Arc<dyn Pins>,
    pieces: Vec<Piece>,
}

/// Pieces one zero-copy transfer may have (more: staged instead). One per
/// memory-store block, fewer where neighbouring blocks merge: 8 MiB of
/// 64 KiB blocks, plus one for an unaligned start.
const ZC_MAX_PIECES: usize = 129;

/// Kinds of peer misbehaviour logged at most once a second each.
#[derive(Debug, Clone, Copy)]
enum Warn {
    Signature = 0,
    Logon = 1,
    Validate = 2,
    QosReports = 3,
}

impl core::fmt::Debug for Core {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Core")
            .field("share", &self.cfg.share)
            .field("held", &self.execs.len())
            .finish()
    }
}

/// The SMB2 upper layer of one worker.
#[derive(Debug)]
pub struct Smb2Server {
    core: Core,
    conns: IdMap<ConnId, Conn>,
    scratch: Vec<u8>,
}

impl Smb2Server {
    /// A server for one worker, on its handle of the share's store.
    pub fn new(cfg: Smb2Config, store: Box<dyn Store>) -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        let mut g = [0u8; 16];
        g[..8].copy_from_slice(&seed.to_le_bytes());
        g[8..].copy_from_slice(b"smbdrct\0");
        let sc = SchedulerConfig {
            max_flows: cfg.qos_max_flows.max(1),
            max_queued: cfg.qos_max_queued.max(1),
            ..SchedulerConfig::default()
        };
        Smb2Server {
            core: Core {
                qos: WorkerQos {
                    sched: Scheduler::new(sc, PInstant::ZERO),
                    by_flow: HashMap::with_capacity(sc.max_flows),
                    slot_flow: vec![u32::MAX; sc.max_flows],
                    window: PInstant::ZERO,
                    saturated: false,
                    report_next: 0,
                    report_saturated: false,
                },
                cfg,
                store,
                // Distinct per worker and run: high bits from the clock.
                next_session: (seed & 0xFFFF_FFFF_0000) | 1,
                next_file: 1,
                next_token: 1,
                server_guid: Guid::from_bytes(g),
                salt_seed: seed | 1,
                now: PInstant::ZERO,
                execs: id_map(1024),
                posts: id_map(256),
                wakes: VecDeque::with_capacity(1024),
                retries: VecDeque::with_capacity(256),
                events: VecDeque::with_capacity(256),
                rbuf: vec![0u8; MAX_INLINE as usize],
                sessions: 0,
                opens: 0,
                gauges_dirty: false,
                flows_full_log: RateLimited::new(std::time::Duration::from_secs(1)),
                warn_log: [RateLimited::new(std::time::Duration::from_secs(1)); 4],
                pool_stalls: 0,
                store_full: 0,
                copies_due: false,
                zc: None,
            },
            conns: id_map(0),
            scratch: vec![0u8; SCRATCH_LEN],
        }
    }
}

/// Fills `out` with bytes from the kernel's random source (NTLMSSP
/// challenges, preauth salts), falling back to a mixed counter if
/// /dev/urandom cannot be read.
fn random_bytes(out: &mut [u8], seed: &mut u64) {
    use std::io::Read;
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        if f.read_exact(out).is_ok() {
            return;
        }
    }
    for ch in out.chunks_mut(8) {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut x = *seed;
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        let b = x.to_le_bytes();
        ch.copy_from_slice(&b[..ch.len()]);
    }
}

fn filetime_now() -> u64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    116_444_736_000_000_000 + d.as_nanos() as u64 / 100
}

fn resp_header(
    req: &HeaderRepr,
    status: NtStatus,
    grant: u16,
    session: u64,
    tree: u32,
) -> HeaderRepr {
    let mut h = req.response_to(status);
    h.credit = grant;
    h.session_id = session;
    if let HeaderId::Sync { process_id, .. } = h.id {
        h.id = HeaderId::Sync {
            process_id,
            tree_id: tree,
        };
    }
    h
}

fn push<B: Smb2Body + ?Sized>(w: &mut CompoundWriter<'_>, h: &HeaderRepr, body: &B) {
    if w.push(h, body).is_err() {
        // Only a response larger than the scratch buffer gets here.
        let mut e = *h;
        e.status = STATUS_INSUFFICIENT_RESOURCES;
        let _ = w.push(&e, &ErrorResponseRepr::EMPTY);
    }
}

/// [MS-SMB2] 3.3.5.2.5: a large READ/WRITE must be paid for.
fn charge_ok(h: &HeaderRepr, payload: u32) -> bool {
    h.credit_charge.max(1) >= HeaderRepr::credit_charge_for(u64::from(payload))
}

fn disposition(d: CreateDisposition) -> Option<Disposition> {
    Some(if d == CreateDisposition::SUPERSEDE {
        Disposition::Supersede
    } else if d == CreateDisposition::OPEN {
        Disposition::Open
    } else if d == CreateDisposition::CREATE {
        Disposition::Create
    } else if d == CreateDisposition::OPEN_IF {
        Disposition::OpenIf
    } else if d == CreateDisposition::OVERWRITE {
        Disposition::Overwrite
    } else if d == CreateDisposition::OVERWRITE_IF {
        Disposition::OverwriteIf
    } else {
        return None;
    })
}

fn action(a: store::Action) -> CreateAction {
    match a {
        store::Action::Superseded => CreateAction::SUPERSEDED,
        store::Action::Opened => CreateAction::OPENED,
        store::Action::Created => CreateAction::CREATED,
        store::Action::Overwritten => CreateAction::OVERWRITTEN,
    }
}

fn attributes(is_dir: bool) -> FileAttributes {
    if is_dir {
        FileAttributes::DIRECTORY
    } else {
        FileAttributes::ARCHIVE
    }
}

/// The token a READ or WRITE with SMB2_CHANNEL_RDMA_V1_INVALIDATE asks the
/// server to invalidate with its response: its first buffer descriptor's
/// ([MS-SMB2] 3.3.5.12, 3.3.5.13; [MS-SMBD] 3.1.4.1).
fn invalidate_token(body: &RequestBody<'_>) -> Option<u32> {
    let (channel, info) = match body {
        RequestBody::Read(r) => (r.channel, r.channel_info),
        RequestBody::Write(r) => (r.channel, r.channel_info),
        _ => return None,
    };
    if channel != Channel::RdmaV1Invalidate {
        return None;
    }
    info.as_bytes()
        .filter(|d| d.len() >= 16)
        .map(|d| le32(d, 8))
}

fn le32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes(s.try_into().unwrap()))
        .unwrap_or(0)
}

fn le64(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .map(|s| u64::from_le_bytes(s.try_into().unwrap()))
        .unwrap_or(0)
}

/// Descriptor lists up to this long are checked for overlapping ranges.
const OVERLAP_CHECK_MAX: usize = 512;

/// RDMA context mode: answered from the context on completion.
const MODE_FAST: u8 = 1;
/// RDMA context mode: the message is held; completion resumes it.
const MODE_HELD: u8 = 2;

/// Checks an RDMA channel ([MS-SMB2] 3.3.5.12/3.3.5.13) and returns its
/// descriptor bytes (validated again by the worker when the transfer is
/// staged: zero-length or wrapping descriptors, a total shorter than the
/// transfer).
fn rdma_channel<'a>(
    ch: Channel,
    dialect: Dialect,
    info: ChannelInfo<'a>,
    len: u32,
    max_rw: u32,
) -> Result<&'a [u8], NtStatus> {
    if ch == Channel::RdmaV1Invalidate && dialect == Dialect::SMB_3_0 {
        return Err(STATUS_INVALID_PARAMETER);
    }
    if len > max_rw {
        return Err(STATUS_INVALID_PARAMETER);
    }
    let descs = info.as_bytes().unwrap_or(&[]);
    if descs.is_empty() || descs.len() % 16 != 0 {
        return Err(STATUS_INVALID_PARAMETER);
    }
    // The descriptors must describe the whole transfer the request names
    // (READ Length, WRITE RemainingBytes), whatever the file's size: a
    // shorter list is malformed even when less data would move.
    let described: u64 = descs.chunks_exact(16).map(|d| u64::from(le32(d, 12))).sum();
    if described < u64::from(len) {
        return Err(STATUS_INVALID_PARAMETER);
    }
    // Two descriptors of the same token that overlap describe one byte of
    // the client's buffer twice: not a buffer ([MS-SMBD] 3.1.4.3 lists each
    // memory location once). Checked pairwise up to OVERLAP_CHECK_MAX
    // descriptors (no allocation); see docs/spec-notes.md.
    let n = descs.len() / 16;
    if n <= OVERLAP_CHECK_MAX {
        for i in 0..n {
            let a = &descs[i * 16..i * 16 + 16];
            let (ao, at, al) = (le64(a, 0), le32(a, 8), u64::from(le32(a, 12)));
            for j in i + 1..n {
                let b = &descs[j * 16..j * 16 + 16];
                let (bo, bt, bl) = (le64(b, 0), le32(b, 8), u64::from(le32(b, 12)));
                if at == bt && ao < bo.saturating_add(bl) && bo < ao.saturating_add(al) {
                    return Err(STATUS_INVALID_PARAMETER);
                }
            }
        }
    }
    Ok(descs)
}

/// What [`Core::stage`] needs to request a request's RDMA transfer (and,
/// from [`Plan::context`], to finish it on completion).
#[allow(clippy::too_many_arguments)]
fn plan<'a>(
    kind: RdmaKind,
    descs: &'a [u8],
    len: u32,
    ch: Channel,
    fid: FileId,
    handle: Handle,
    file_offset: u64,
    mode: u8,
    tag: u64,
    response: HeaderRepr,
) -> Plan<'a> {
    let invalidate = (ch == Channel::RdmaV1Invalidate).then(|| le32(descs, 8));
    Plan {
        kind,
        descs,
        len,
        handle,
        file_offset,
        fid,
        mode,
        tag,
        invalidate,
        sign: false,
        response,
    }
}

/// The response to a READ or WRITE whose data moved by RDMA: `n` bytes.
fn rdma_response(kind: RdmaKind, h: &HeaderRepr, n: u32, buf: &mut [u8]) -> Option<usize> {
    match kind {
        // [MS-SMB2] 3.3.5.12: the data went to the client's buffer.
        RdmaKind::Write => emit_message(
            h,
            &ReadResponseRepr {
                data: &[],
                data_remaining: n,
                flags: 0,
            },
            buf,
        )
        .ok(),
        RdmaKind::Read => emit_message(h, &WriteResponseRepr { count: n }, buf).ok(),
    }
}

fn error_message(h: &HeaderRepr, st: NtStatus, buf: &mut [u8]) -> Option<usize> {
    let mut h = *h;
    h.status = st;
    emit_message(&h, &ErrorResponseRepr::EMPTY, buf).ok()
}

impl Core {
    fn token(&mut self) -> u64 {
        let t = self.next_token;
        self.next_token += 1;
        t
    }

    /// Runs the requests of `msg` from `ex.next` on. Returns once every
    /// request has run (the responses queued through `out`), or one waits
    /// (the message is held and `ex` kept).
    fn run(
        &mut self,
        c: &mut Conn,
        msg: &[u8],
        mut ex: Exec,
        scratch: &mut [u8],
        out: &mut Replies<'_>,
    ) {
        let max_rw = out.max_read_write_size();
        let mut w = CompoundWriter::new(scratch);
        let mut fast: Option<Plan<'_>> = None;
        let mut hold = false;
        let mut disconnect = false;
        let mut it = compound(msg).skip(ex.next).peekable();
        while let Some(m) = it.next() {
            let Ok(m) = m else {
                // Every chain-walk failure is a Disconnect
                // (`Smb2Error::server_action`): the chain cannot be delimited.
                disconnect = true;
                break;
            };
            let last = it.peek().is_none();
            match self.execute(c, &m, &mut ex, &mut w, max_rw, last) {
                Step::Done => ex.advance(),
                Step::Rdma(mut p) if last => {
                    // Its response goes behind its transfer (READ) or is
                    // built from the context on completion (WRITE): whether
                    // to sign it goes along.
                    p.sign = ex.sign;
                    fast = Some(p);
                }
                Step::Rdma(p) => match self.stage(&p, out) {
                    Ok(()) => {
                        ex.rdma_staged = true;
                        ex.wait = Some(Wait::Rdma);
                        ex.ready = false;
                        hold = true;
                        break;
                    }
                    Err(RdmaError::Backpressure(b)) => {
                        // Retry from a wake (the request's MessageIds are
                        // consumed: it must not run from scratch), once
                        // something may have freed what it lacked.
                        self.pool_stalls += u64::from(b == Backpressure::PoolExhausted);
                        ex.ready = true;
                        self.retries.push_back((ex.conn, ex.token));
                        hold = true;
                        break;
                    }
                    Err(e) => {
                        let mut h = p.response;
                        h.status = e.status();
                        push(&mut w, &h, &ErrorResponseRepr::EMPTY);
                        ex.advance();
                    }
                },
                Step::Hold(wait) => {
                    ex.wait = Some(wait);
                    ex.ready = false;
                    hold = true;
                    break;
                }
                Step::Disconnect => {
                    disconnect = true;
                    break;
                }
            }
        }
        if disconnect {
            // [MS-SMB2] 3.3.5.2: the request calls for a disconnect; the
            // worker terminates the connection (the control plane logs it).
            c.dead = true;
            out.disconnect();
            return;
        }
        if let Some(p) = fast {
            let staged = match p.kind {
                RdmaKind::Write => self.stage_read(c, &p, out),
                RdmaKind::Read => self.stage(&p, out),
            };
            match staged {
                Ok(()) => ex.advance(),
                Err(RdmaError::Backpressure(b)) => {
                    self.pool_stalls += u64::from(b == Backpressure::PoolExhausted);
                    ex.ready = true;
                    self.retries.push_back((ex.conn, ex.token));
                    hold = true;
                }
                Err(e) => {
                    // Malformed descriptors: this request fails, the
                    // connection goes on.
                    let mut h = p.response;
                    h.status = e.status();
                    push(&mut w, &h, &ErrorResponseRepr::EMPTY);
                    ex.advance();
                }
            }
        }
        let len = w.finish();
        if let Some((a, b, conn_hash)) = ex.hash_response.take() {
            // 3.1.1 preauth integrity: the NEGOTIATE response into the
            // connection's hash, a SESSION_SETUP continuation into the
            // session's (3.3.5.4, 3.3.5.5).
            if a < b && b <= len {
                let bytes = &scratch[a..b];
                let h = if conn_hash {
                    c.preauth.as_mut()
                } else {
                    c.auth.as_mut().and_then(|s| s.preauth.as_mut())
                };
                if let Some(h) = h {
                    h.update(bytes);
                }
            }
        }
        if ex.sign && len > 0 {
            sign_compound(c, ex.ended.take(), &mut scratch[..len]);
        }
        if len > 0 {
            let invalidate = ex.invalidate.take();
            let fill = |b: &mut [u8]| b.copy_from_slice(&scratch[..len]);
            let r = match invalidate {
                Some(t) => out.reply_with_invalidate(len, t, fill),
                None => out.reply(len, fill),
            };
            if r.is_err() {
                ex.pending_reply = Some((scratch[..len].to_vec(), invalidate));
                if !hold {
                    hold = true;
                    ex.ready = true;
                    self.retries.push_back((ex.conn, ex.token));
                }
            }
        }
        if hold {
            out.hold(ex.token);
            self.execs.insert(ex.token, ex);
        }
    }

    /// [MS-SMB2] 3.3.5.12 for a READ that is the last request of its
    /// message: its data goes by RDMA Write and its response is queued
    /// behind the Write ([`Replies::reply_after_write`]), with Send with
    /// Invalidate of the first descriptor's token for
    /// SMB2_CHANNEL_RDMA_V1_INVALIDATE: the READ is finished here, with no
    /// context to keep and no completion to handle.
    fn stage_read(
        &mut self,
        c: &Conn,
        p: &Plan<'_>,
        out: &mut Replies<'_>,
    ) -> Result<(), RdmaError> {
        let mut buf = [0u8; HEADER_LEN + 64];
        let Some(n) = rdma_response(RdmaKind::Write, &p.response, p.len, &mut buf) else {
            return Err(RdmaError::NotAvailable);
        };
        if p.sign {
            sign_compound(c, None, &mut buf[..n]);
        }
        let ticket = self.stage_with(p, &[], out)?;
        let buf = &buf;
        let r = out.reply_after_write(ticket, n, p.invalidate, |b| b.copy_from_slice(&buf[..n]));
        if r.is_err() {
            out.cancel_rdma(ticket);
        }
        r
    }

    fn stage(&mut self, p: &Plan<'_>, out: &mut Replies<'_>) -> Result<(), RdmaError> {
        let ctx = p.context();
        self.stage_with(p, &ctx, out).map(|_| ())
    }

    /// Requests `p`'s transfer with `ctx` as its completion's context.
    fn stage_with(
        &mut self,
        p: &Plan<'_>,
        ctx: &[u8],
        out: &mut Replies<'_>,
    ) -> Result<Ticket, RdmaError> {
        let tag = p.tag;
        if let Some(zc) = self.zc.as_mut() {
            // Zero-copy: the data moves between the client and the store's
            // blocks directly (pinned until the transfer ends).
            let pinned = match p.kind {
                RdmaKind::Write => self.store.pin_read(
                    tag,
                    p.handle,
                    p.file_offset,
                    p.len,
                    &zc.lkeys,
                    &mut zc.pieces,
                ),
                RdmaKind::Read => self.store.pin_write(
                    tag,
                    p.handle,
                    p.file_offset,
                    p.len,
                    &zc.lkeys,
                    &mut zc.pieces,
                ),
            };
            if let Some(n) = pinned {
                let pieces = &zc.pieces[..n];
                return match p.kind {
                    RdmaKind::Write => {
                        out.rdma_write_pieces(p.descs, 0, p.len, ctx, pieces, &zc.pins)
                    }
                    RdmaKind::Read => {
                        out.rdma_read_pieces(p.descs, 0, p.len, ctx, pieces, &zc.pins)
                    }
                };
            }
        }
        match p.kind {
            RdmaKind::Write => {
                let store = &mut self.store;
                out.rdma_write(p.descs, 0, p.len, ctx, |b| {
                    store.copy_out(tag, p.handle, p.file_offset, b)
                })
            }
            RdmaKind::Read => out.rdma_read(p.descs, 0, p.len, ctx),
        }
    }

    fn execute<'a>(
        &mut self,
        c: &mut Conn,
        m: &smbdirect_protocol::smb2::Message<'a>,
        ex: &mut Exec,
        w: &mut CompoundWriter<'_>,
        max_rw: u32,
        last: bool,
    ) -> Step<'a> {
        let req = *m.header();
        if req.is_response() {
            return Step::Disconnect;
        }
        let (session, tree) = if m.is_related() {
            (ex.chain.session, ex.chain.tree)
        } else {
            (req.session_id, req.tree_id().unwrap_or(0))
        };
        ex.chain.session = session;
        ex.chain.tree = tree;
        if req.command == Command::Cancel {
            // No response ([MS-SMB2] 3.3.5.16); waiting requests finish on
            // their own shortly (QoS queues and disks drain).
            return Step::Done;
        }
        let grant = match ex.grant {
            Some(g) => g,
            None => match c.sequence_and_grant(&req) {
                Some(g) => {
                    ex.grant = Some(g);
                    g
                }
                // 3.3.5.2.3: a MessageId outside the CommandSequenceWindow
                // or used twice (see docs/spec-notes.md).
                None => return Step::Disconnect,
            },
        };
        let body = match m.request_body() {
            Ok(b) => b,
            Err(e) => match e.server_action() {
                ServerAction::Disconnect => return Step::Disconnect,
                ServerAction::FailRequest(st) => {
                    push(
                        w,
                        &resp_header(&req, st, grant, session, tree),
                        &ErrorResponseRepr::EMPTY,
                    );
                    return Step::Done;
                }
            },
        };
        // [MS-SMB2] 3.3.5.2.4: verify the signature of a request of an
        // authenticated session; unsigned requests are refused when the
        // session requires signing.
        if let (Some(a), Some(d)) = (c.auth.as_ref(), c.dialect) {
            if a.ready && c.session == Some(session) {
                if let Some(key) = a.key {
                    let alg =
                        auth::signing::algorithm_for(d, c.neg.as_ref().and_then(|n| n.signing));
                    let signed = req.flags.contains(HeaderFlags::SIGNED);
                    if signed && !auth::signing::verify(alg, &key, m.bytes()) {
                        // Linux 6.1's cifs.ko signs the data of a signed
                        // inline WRITE of more than one page but sends other
                        // bytes (docs/linux-client.md): say so, since
                        // the operator's remedy is on the client.
                        let multi_page_write = matches!(
                            &body,
                            RequestBody::Write(wr) if wr.data.len() > 4096
                        );
                        self.warn_once(
                            Warn::Signature,
                            format_args!(
                                "conn {}: the signature of a {:?} request (MessageId {}, {} bytes) \
                                 does not verify: STATUS_ACCESS_DENIED{}",
                                ex.conn,
                                req.command,
                                req.message_id,
                                m.bytes().len(),
                                if multi_page_write {
                                    " (a signed inline WRITE of more than 4 KiB: Linux 6.1 \
                                     cifs.ko sends other bytes than it signs; mount with \
                                     wsize=4096)"
                                } else {
                                    ""
                                }
                            ),
                        );
                        push(
                            w,
                            &resp_header(&req, STATUS_ACCESS_DENIED, grant, session, tree),
                            &ErrorResponseRepr::EMPTY,
                        );
                        return Step::Done;
                    }
                    if !signed && a.signing_required && req.command != Command::Cancel {
                        push(
                            w,
                            &resp_header(&req, STATUS_ACCESS_DENIED, grant, session, tree),
                            &ErrorResponseRepr::EMPTY,
                        );
                        return Step::Done;
                    }
                    ex.sign |= signed || a.signing_required;
                }
            }
        }
        let msg_bytes = m.bytes();
        // Not on 3.0, where that channel is itself invalid (3.3.5.12).
        let token = invalidate_token(&body).filter(|_| {
            c.dialect
                .is_some_and(|d| d.is_smb3() && d != Dialect::SMB_3_0)
        });
        match self.handle(
            c, &req, body, ex, w, max_rw, grant, session, tree, last, msg_bytes,
        ) {
            Ok(step) => step,
            Err(st) => {
                if st == STATUS_DISK_FULL {
                    self.store_full += 1;
                }
                // A failed READ/WRITE with SMB2_CHANNEL_RDMA_V1_INVALIDATE
                // (STATUS_END_OF_FILE, a closed file, a failed transfer...)
                // invalidates its buffer too: the client counts on it and
                // reuses the registration (docs/spec-notes.md).
                if token.is_some() {
                    ex.invalidate = token;
                }
                push(
                    w,
                    &resp_header(&req, st, grant, ex.chain.session, ex.chain.tree),
                    &ErrorResponseRepr::EMPTY,
                );
                Step::Done
            }
        }
    }

    /// [`Core::lookup`] and the Open, with one map lookup (READ and WRITE).
    fn lookup_mut<'c>(
        c: &'c mut Conn,
        fid: FileId,
        chain: &Chain,
        related: bool,
    ) -> Result<(FileId, &'c mut Open), NtStatus> {
        let fid = Self::related_fid(fid, chain, related)?;
        match c.opens.get_mut(&fid.volatile) {
            Some(o) if o.persistent == fid.persistent => Ok((fid, o)),
            _ => Err(STATUS_FILE_CLOSED),
        }
    }

    /// The FileId a request names: a related request's FileId::ANY is the
    /// previous one of its compound ([MS-SMB2] 3.3.5.2.7.2).
    fn related_fid(fid: FileId, chain: &Chain, related: bool) -> Result<FileId, NtStatus> {
        if related && fid == FileId::ANY {
            chain.file.ok_or(STATUS_INVALID_PARAMETER)
        } else {
            Ok(fid)
        }
    }

    fn lookup(c: &Conn, fid: FileId, chain: &Chain, related: bool) -> Result<FileId, NtStatus> {
        let fid = Self::related_fid(fid, chain, related)?;
        match c.opens.get(&fid.volatile) {
            Some(o) if o.persistent == fid.persistent => Ok(fid),
            _ => Err(STATUS_FILE_CLOSED),
        }
    }

    /// Storage QoS admission of `bytes` of I/O on an Open's `flow` through
    /// its `lane`: at once when nothing waits and the limits allow, else
    /// through the queue.
    fn admit(
        &mut self,
        flow: Option<FlowSlot>,
        lane: &mut Lane,
        ex: &mut Exec,
        bytes: u64,
    ) -> Result<bool, NtStatus> {
        let Some(slot) = flow else {
            return Ok(true);
        };
        if ex.admitted {
            return Ok(true);
        }
        if ex.queued {
            return Ok(false);
        }
        if self.qos.sched.try_lane(self.now, slot, lane, bytes) {
            ex.admitted = true;
            return Ok(true);
        }
        match self.qos.sched.enqueue(slot, ex.token, bytes) {
            Ok(()) => {
                ex.queued = true;
                self.gauges_dirty = true;
                Ok(false)
            }
            // The worker's queue is full: the request is refused rather
            // than admitted over the limit.
            Err(_) => Err(STATUS_INSUFFICIENT_RESOURCES),
        }
    }

    /// When `lane` will not cover an I/O of `bytes`, prefetches its flow's
    /// hot record: it arrives while the request is checked.
    #[inline]
    fn prefetch_flow(&self, flow: Option<FlowSlot>, lane: &Lane, bytes: u64) {
        if let Some(s) = flow {
            if !self.qos.sched.lane_covers(lane, bytes) {
                crate::hint::prefetch(self.qos.sched.flow_addr(s));
            }
        }
    }

    fn close_open(&mut self, conn: ConnId, mut o: Open) {
        // [MS-FSA] 2.1.5.4: a closed Open's byte-range locks are released.
        self.cfg
            .locks
            .release(o.file_id, fs::LockOwner::new(conn, o.persistent));
        self.store.close(o.handle);
        if let Some(s) = o.flow {
            self.qos.sched.release_lane(s, &mut o.lane);
            self.release_slot(s);
        }
        if o.qos_named {
            self.events.push_back(UpperEvent::OpenClosed {
                conn,
                open: o.persistent,
            });
        }
        self.opens = self.opens.saturating_sub(1);
        self.gauges_dirty = true;
    }

    fn release_slot(&mut self, s: FlowSlot) {
        let flow = self.qos.slot_flow[s.index()];
        if let Some(e) = self.qos.by_flow.get_mut(&flow) {
            e.1 = e.1.saturating_sub(1);
            if e.1 == 0 && self.qos.sched.close_flow(s) {
                self.qos.by_flow.remove(&flow);
                self.qos.slot_flow[s.index()] = u32::MAX;
            }
        }
    }

    /// Points `o` at the flow the control plane associated it with.
    fn assign(&mut self, o: &mut Open, flow: Option<QosFlowAssign>) {
        let now = self.now;
        let current = o.flow.map(|s| self.qos.slot_flow[s.index()]);
        if let (Some(cur), Some(f)) = (current, flow) {
            if cur == f.flow {
                if let Some(&(s, _)) = self.qos.by_flow.get(&f.flow) {
                    let _ = self.qos.sched.set_rates(now, s, f.rates);
                }
                return;
            }
        }
        if let Some(s) = o.flow.take() {
            self.qos.sched.release_lane(s, &mut o.lane);
            self.release_slot(s);
        }
        let Some(f) = flow else { return };
        let slot = match self.qos.by_flow.get_mut(&f.flow) {
            Some(e) => {
                e.1 += 1;
                let _ = self.qos.sched.set_rates(now, e.0, f.rates);
                Some(e.0)
            }
            None => match self.qos.sched.open_flow(now, f.rates) {
                Some(s) => {
                    self.qos.by_flow.insert(f.flow, (s, 1));
                    self.qos.slot_flow[s.index()] = f.flow;
                    Some(s)
                }
                None => {
                    // Every flow slot of this worker is taken: the Open's
                    // I/O is not enforced (logged at most once a second).
                    if let Some(n) = self.flows_full_log.hit(std::time::Instant::now()) {
                        eprintln!(
                            "smbdirectd: warn: storage QoS: all {} flow slots of this worker are in use; new flows are not enforced (raise the limit){}",
                            self.cfg.qos_max_flows,
                            suppressed_note(n)
                        );
                    }
                    None
                }
            },
        };
        o.flow = slot;
    }

    #[allow(clippy::too_many_arguments)]
    fn handle<'a>(
        &mut self,
        c: &mut Conn,
        req: &HeaderRepr,
        body: RequestBody<'a>,
        ex: &mut Exec,
        w: &mut CompoundWriter<'_>,
        max_rw: u32,
        grant: u16,
        session: u64,
        tree: u32,
        last: bool,
        msg_bytes: &[u8],
    ) -> Result<Step<'a>, NtStatus> {
        let related = req.is_related();
        let ok = |s: u64, t: u32| resp_header(req, STATUS_SUCCESS, grant, s, t);
        // Connection, session and tree checks ([MS-SMB2] 3.3.5.2.x).
        let Some(dialect) = c.dialect else {
            if let RequestBody::Negotiate(n) = body {
                return self.negotiate(c, req, n, ex, w, max_rw, grant, msg_bytes);
            }
            return Ok(Step::Disconnect);
        };
        let needs_session = !matches!(
            body,
            RequestBody::Negotiate(_) | RequestBody::SessionSetup(_) | RequestBody::Echo(_)
        );
        let ready = c.auth.as_ref().map_or(true, |a| a.ready);
        if needs_session && (!ready || c.session.is_none() || c.session != Some(session)) {
            return Err(STATUS_USER_SESSION_DELETED);
        }
        let needs_tree =
            needs_session && !matches!(body, RequestBody::Logoff(_) | RequestBody::TreeConnect(_));
        if needs_tree && !c.tree_connected(tree) {
            return Err(STATUS_NETWORK_NAME_DELETED);
        }
        // IPC$ serves no files: only tree-level FSCTLs, ECHO and the like.
        if tree == IPC_TREE_ID
            && matches!(
                body,
                RequestBody::Create(_) | RequestBody::Read(_) | RequestBody::Write(_)
            )
        {
            return Err(STATUS_OBJECT_NAME_NOT_FOUND);
        }
        let tag = ex.token;
        match body {
            // 3.3.5.3.1: a second NEGOTIATE ends the connection.
            RequestBody::Negotiate(_) => Ok(Step::Disconnect),
            RequestBody::SessionSetup(s) if self.cfg.users.is_some() => {
                self.session_setup(c, req, &s, ex, w, grant, session, tree, msg_bytes)
            }
            RequestBody::SessionSetup(s) => {
                let id = match c.session {
                    Some(id) if session == id => id,
                    _ if session != 0 => return Err(STATUS_USER_SESSION_DELETED),
                    _ => {
                        let id = self.next_session;
                        self.next_session += 1;
                        c.session = Some(id);
                        self.sessions += 1;
                        self.gauges_dirty = true;
                        id
                    }
                };
                ex.chain.session = id;
                let flags = if s.security_buffer.is_empty() {
                    SessionFlags::IS_NULL
                } else {
                    SessionFlags::IS_GUEST
                };
                let r = SessionSetupResponseRepr {
                    session_flags: flags,
                    security_buffer: &[],
                };
                push(w, &ok(id, tree), &r);
                Ok(Step::Done)
            }
            RequestBody::Logoff(_) => {
                if let (Some(d), Some(sid), Some(key)) =
                    (c.dialect, c.session, c.auth.as_ref().and_then(|a| a.key))
                {
                    let alg =
                        auth::signing::algorithm_for(d, c.neg.as_ref().and_then(|n| n.signing));
                    ex.ended = Some((sid, alg, key));
                }
                c.session = None;
                c.auth = None;
                c.trees = 0;
                self.sessions = self.sessions.saturating_sub(1);
                for (_, o) in c.opens.drain() {
                    self.close_open(ex.conn, o);
                }
                push(w, &ok(session, tree), &LogoffResponseRepr);
                Ok(Step::Done)
            }
            RequestBody::TreeConnect(t) => {
                let path = t.path.decode().map_err(|_| STATUS_INVALID_PARAMETER)?;
                let share = path.rsplit('\\').next().unwrap_or("");
                let (id, share_type) = if share.eq_ignore_ascii_case(&self.cfg.share) {
                    (SHARE_TREE_ID, ShareType::DISK)
                } else if share.eq_ignore_ascii_case("IPC$") {
                    (IPC_TREE_ID, ShareType::PIPE)
                } else {
                    return Err(STATUS_BAD_NETWORK_NAME);
                };
                c.trees |= if id == SHARE_TREE_ID { 1 } else { 2 };
                ex.chain.tree = id;
                let r = TreeConnectResponseRepr {
                    share_type,
                    share_flags: ShareFlags::empty(),
                    capabilities: ShareCapabilities::empty(),
                    maximal_access: AccessMask::from_bits(FILE_ALL_ACCESS),
                };
                push(w, &ok(session, id), &r);
                Ok(Step::Done)
            }
            RequestBody::TreeDisconnect(_) => {
                c.trees &= if tree == SHARE_TREE_ID { !1 } else { !2 };
                if tree == SHARE_TREE_ID {
                    for (_, o) in c.opens.drain() {
                        self.close_open(ex.conn, o);
                    }
                }
                push(w, &ok(session, tree), &TreeDisconnectResponseRepr);
                Ok(Step::Done)
            }
            RequestBody::Create(r) => {
                let name = r.name.decode().map_err(|_| STATUS_OBJECT_NAME_INVALID)?;
                if !store::valid_path(&name) {
                    return Err(STATUS_OBJECT_NAME_INVALID);
                }
                let disposition =
                    disposition(r.create_disposition).ok_or(STATUS_INVALID_PARAMETER)?;
                let directory = r.create_options.contains(CreateOptions::DIRECTORY_FILE);
                if directory && !store::disposition_allows_directory(disposition) {
                    // [MS-FSA] 2.1.5.1: a directory is never superseded or
                    // overwritten.
                    return Err(STATUS_INVALID_PARAMETER);
                }
                let oreq = OpenRequest {
                    path: &name,
                    disposition,
                    directory,
                    non_directory: r.create_options.contains(CreateOptions::NON_DIRECTORY_FILE),
                };
                // Create contexts (fs.rs): checked before anything is opened.
                let mut answers = fs::CreateAnswers::of(&r.create_contexts)?;
                let (handle, act, info) = match self.store.open(tag, &oreq) {
                    Poll::Pending => return Ok(Step::Hold(Wait::Store)),
                    Poll::Ready(r) => r.map_err(|e| e.status())?,
                };
                if r.create_options.contains(CreateOptions::DELETE_ON_CLOSE) {
                    // Delete pending from now on (store.rs module docs);
                    // on failure the handle is closed.
                    self.delete_on_close_at_create(handle, &info)?;
                }
                answers.opened(info.file_id, self.volume_id());
                let (contexts, n_contexts) = answers.contexts();
                let id = self.next_file;
                self.next_file += 1;
                let fid = FileId {
                    persistent: id,
                    volatile: id,
                };
                let default_flow = match self.cfg.default_policy {
                    Some(policy) if !info.is_dir => {
                        self.events.push_back(UpperEvent::QosDefaultFlow {
                            conn: ex.conn,
                            open: id,
                            policy,
                        });
                        true
                    }
                    _ => false,
                };
                c.opens.insert(
                    id,
                    Open {
                        persistent: id,
                        handle,
                        is_dir: info.is_dir,
                        flow: None,
                        lane: Lane::EMPTY,
                        qos_named: default_flow,
                        flow_pending: default_flow,
                        file_id: info.file_id,
                        path: name.clone(),
                        dir: None,
                    },
                );
                self.opens += 1;
                self.gauges_dirty = true;
                ex.chain.file = Some(fid);
                let resp = CreateResponseRepr {
                    oplock_level: OplockLevel::NONE,
                    flags: CreateResponseFlags::empty(),
                    create_action: action(act),
                    creation_time: info.creation_time,
                    last_access_time: info.last_access_time,
                    last_write_time: info.last_write_time,
                    change_time: info.change_time,
                    allocation_size: info.allocation,
                    end_of_file: info.size,
                    file_attributes: attributes(info.is_dir),
                    file_id: fid,
                    create_contexts: CreateContextList::new(&contexts[..n_contexts]),
                };
                push(w, &ok(session, tree), &resp);
                Ok(Step::Done)
            }
            RequestBody::Close(r) => {
                let fid = Self::lookup(c, r.file_id, &ex.chain, related)?;
                let handle = c.opens[&fid.volatile].handle;
                let mut resp = CloseResponseRepr {
                    flags: CloseFlags::empty(),
                    creation_time: 0,
                    last_access_time: 0,
                    last_write_time: 0,
                    change_time: 0,
                    allocation_size: 0,
                    end_of_file: 0,
                    file_attributes: FileAttributes::empty(),
                };
                if r.flags.contains(CloseFlags::POSTQUERY_ATTRIB) {
                    let info = match self.store.stat(tag, handle) {
                        Poll::Pending => return Ok(Step::Hold(Wait::Store)),
                        Poll::Ready(r) => r.map_err(|e| e.status())?,
                    };
                    resp = CloseResponseRepr {
                        flags: CloseFlags::POSTQUERY_ATTRIB,
                        creation_time: info.creation_time,
                        last_access_time: info.last_access_time,
                        last_write_time: info.last_write_time,
                        change_time: info.change_time,
                        allocation_size: info.allocation,
                        end_of_file: info.size,
                        file_attributes: attributes(info.is_dir),
                    };
                }
                if let Some(o) = c.opens.remove(&fid.volatile) {
                    self.close_open(ex.conn, o);
                }
                push(w, &ok(session, tree), &resp);
                Ok(Step::Done)
            }
            RequestBody::Flush(r) => {
                let fid = Self::lookup(c, r.file_id, &ex.chain, related)?;
                let handle = c.opens[&fid.volatile].handle;
                match self.store.flush(tag, handle) {
                    Poll::Pending => return Ok(Step::Hold(Wait::Store)),
                    Poll::Ready(r) => r.map_err(|e| e.status())?,
                }
                push(w, &ok(session, tree), &FlushResponseRepr);
                Ok(Step::Done)
            }
            RequestBody::Echo(_) => {
                push(w, &ok(session, tree), &EchoResponseRepr);
                Ok(Step::Done)
            }
            RequestBody::Ioctl(r)
                if r.ctl_code == FSCTL_VALIDATE_NEGOTIATE_INFO
                    && r.flags.contains(IoctlFlags::IS_FSCTL) =>
            {
                self.validate_negotiate(c, &r, w, ok(session, tree))
            }
            RequestBody::Ioctl(r) => {
                // [MS-SMB2] 3.3.5.15: FSCTLs without an open (FileId all
                // ones, no lookup).
                let no_open = matches!(
                    r.ctl_code,
                    FSCTL_QUERY_NETWORK_INTERFACE_INFO
                        | FSCTL_DFS_GET_REFERRALS
                        | FSCTL_DFS_GET_REFERRALS_EX
                );
                if no_open && r.flags.contains(IoctlFlags::IS_FSCTL) {
                    if !r.file_id.is_any() {
                        return Err(STATUS_INVALID_PARAMETER);
                    }
                    // 3.3.5.15.2: not a DFS server.
                    if r.ctl_code != FSCTL_QUERY_NETWORK_INTERFACE_INFO {
                        return Err(STATUS_FS_DRIVER_REQUIRED);
                    }
                    // 3.3.5.15.11: one RDMA-capable entry per configured
                    // address (IfIndex from 1).
                    if self.cfg.interfaces.is_empty() {
                        return Err(STATUS_NOT_SUPPORTED);
                    }
                    let entries: Vec<NetworkInterfaceInfoRepr> = (1..)
                        .zip(&self.cfg.interfaces)
                        .map(|(i, &address)| NetworkInterfaceInfoRepr {
                            if_index: i,
                            capability: InterfaceCapability::RDMA_CAPABLE,
                            link_speed: INTERFACE_LINK_SPEED,
                            address,
                        })
                        .collect();
                    let list = NetworkInterfaceInfoList { entries: &entries };
                    if list.buffer_len() > r.max_output_response as usize {
                        return Err(STATUS_BUFFER_TOO_SMALL);
                    }
                    let mut output = vec![0u8; list.buffer_len()];
                    list.emit(&mut output)
                        .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
                    let resp = IoctlResponseRepr {
                        ctl_code: r.ctl_code,
                        file_id: r.file_id,
                        input: &[],
                        output: &output,
                        flags: 0,
                    };
                    push(w, &ok(session, tree), &resp);
                    return Ok(Step::Done);
                }
                // Otherwise only FSCTL_STORAGE_QOS_CONTROL ([MS-SQOS]
                // 3.2.5.1) is served; it is an FSCTL on an open.
                if r.ctl_code != FSCTL_STORAGE_QOS_CONTROL
                    || !r.flags.contains(IoctlFlags::IS_FSCTL)
                {
                    return Err(STATUS_NOT_SUPPORTED);
                }
                let fid = Self::lookup(c, r.file_id, &ex.chain, related)?;
                let answer = match ex.ioctl.take() {
                    Some(a) => a,
                    None => {
                        if ex.queued {
                            return Ok(Step::Hold(Wait::Ioctl));
                        }
                        if r.input.len() > MAX_QOS_REQUEST {
                            return Err(STATUS_INVALID_PARAMETER);
                        }
                        let o = c.opens.get_mut(&fid.volatile).expect("looked up");
                        o.qos_named = true;
                        self.events.push_back(UpperEvent::QosRequest {
                            conn: ex.conn,
                            token: ex.token,
                            open: o.persistent,
                            is_file: !o.is_dir,
                            request: r.input.into(),
                            max_output: r.max_output_response,
                        });
                        ex.queued = true;
                        return Ok(Step::Hold(Wait::Ioctl));
                    }
                };
                let output = answer?;
                let resp = IoctlResponseRepr {
                    ctl_code: r.ctl_code,
                    file_id: fid,
                    input: &[],
                    output: output.as_deref().unwrap_or(&[]),
                    flags: 0,
                };
                push(w, &ok(session, tree), &resp);
                Ok(Step::Done)
            }
            RequestBody::Cancel(_) => Ok(Step::Done),
            // File-system commands (fs.rs).
            RequestBody::QueryInfo(r) => {
                let fid = Self::lookup(c, r.file_id, &ex.chain, related)?;
                self.query_info(c, fid, &r, ex, w, ok(session, tree))
            }
            RequestBody::SetInfo(r) => {
                let fid = Self::lookup(c, r.file_id, &ex.chain, related)?;
                self.set_info(c, fid, &r, ex, w, ok(session, tree))
            }
            RequestBody::QueryDirectory(r) => {
                let fid = Self::lookup(c, r.file_id, &ex.chain, related)?;
                self.query_directory(c, fid, &r, ex, w, ok(session, tree))
            }
            RequestBody::Lock(r) => {
                let fid = Self::lookup(c, r.file_id, &ex.chain, related)?;
                self.lock(c, fid, &r, ex, w, ok(session, tree))
            }
            // [MS-SMB2] 3.3.5.19: change notifications are not offered.
            RequestBody::ChangeNotify(_) => Err(STATUS_NOT_SUPPORTED),
            // No oplocks or leases are ever granted (3.3.5.22).
            RequestBody::OplockBreak(_) => Err(STATUS_INVALID_OPLOCK_PROTOCOL),
            RequestBody::Read(r) => {
                let (fid, o) = Self::lookup_mut(c, r.file_id, &ex.chain, related)?;
                if o.is_dir {
                    return Err(STATUS_INVALID_DEVICE_REQUEST);
                }
                if o.flow_pending {
                    return Ok(Step::Hold(Wait::Flow));
                }
                let (handle, flow, lane) = (o.handle, o.flow, &mut o.lane);
                self.prefetch_flow(flow, lane, u64::from(r.length));
                if !charge_ok(req, r.length) {
                    return Err(STATUS_INVALID_PARAMETER);
                }
                let rdma = r.channel.is_rdma();
                if ex.rdma_staged {
                    // Resumed after its RDMA Write (not last in its compound).
                    let n = ex.rdma.take().unwrap_or(Err(STATUS_UNEXPECTED_IO_ERROR))?;
                    if r.channel == Channel::RdmaV1Invalidate {
                        ex.invalidate = r.channel_info.as_bytes().map(|d| le32(d, 8));
                    }
                    let resp = ReadResponseRepr {
                        data: &[],
                        data_remaining: n,
                        flags: 0,
                    };
                    push(w, &ok(session, tree), &resp);
                    return Ok(Step::Done);
                }
                let descs = match r.channel {
                    Channel::None => {
                        if r.length > MAX_INLINE {
                            return Err(STATUS_INVALID_PARAMETER);
                        }
                        None
                    }
                    ch if rdma => {
                        Some(rdma_channel(ch, dialect, r.channel_info, r.length, max_rw)?)
                    }
                    _ => return Err(STATUS_INVALID_PARAMETER),
                };
                if !self.admit(flow, lane, ex, u64::from(r.length))? {
                    return Ok(Step::Hold(Wait::Qos));
                }
                self.copies_due = true;
                let avail = match self.store.read(tag, handle, r.offset, r.length) {
                    Poll::Pending => return Ok(Step::Hold(Wait::Store)),
                    Poll::Ready(n) => n.map_err(|e| e.status())?,
                };
                if (avail == 0 && r.length > 0) || avail < r.minimum_count {
                    self.store.cancel(tag);
                    return Err(STATUS_END_OF_FILE);
                }
                match descs {
                    None => {
                        let n = avail as usize;
                        self.store
                            .copy_out(tag, handle, r.offset, &mut self.rbuf[..n]);
                        let resp = ReadResponseRepr {
                            data: &self.rbuf[..n],
                            data_remaining: 0,
                            flags: 0,
                        };
                        push(w, &ok(session, tree), &resp);
                        Ok(Step::Done)
                    }
                    Some(descs) => Ok(Step::Rdma(plan(
                        RdmaKind::Write,
                        descs,
                        avail,
                        r.channel,
                        fid,
                        handle,
                        r.offset,
                        if last { MODE_FAST } else { MODE_HELD },
                        tag,
                        ok(session, tree),
                    ))),
                }
            }
            RequestBody::Write(r) => {
                let (fid, o) = Self::lookup_mut(c, r.file_id, &ex.chain, related)?;
                if o.is_dir {
                    return Err(STATUS_INVALID_DEVICE_REQUEST);
                }
                if o.flow_pending {
                    return Ok(Step::Hold(Wait::Flow));
                }
                let (handle, flow, lane) = (o.handle, o.flow, &mut o.lane);
                let len = (r.data.len() as u64).max(u64::from(r.remaining_bytes));
                self.prefetch_flow(flow, lane, len);
                match r.channel {
                    Channel::None => {
                        let len = r.data.len() as u32;
                        if !charge_ok(req, len) {
                            return Err(STATUS_INVALID_PARAMETER);
                        }
                        if !self.admit(flow, lane, ex, u64::from(len))? {
                            return Ok(Step::Hold(Wait::Qos));
                        }
                        let n = match self.store.write(tag, handle, r.offset, r.data) {
                            Poll::Pending => return Ok(Step::Hold(Wait::Store)),
                            Poll::Ready(n) => n.map_err(|e| e.status())?,
                        };
                        push(w, &ok(session, tree), &WriteResponseRepr { count: n });
                        Ok(Step::Done)
                    }
                    ch if ch.is_rdma() => {
                        // 3.3.5.13: the data travels by RDMA; RemainingBytes
                        // is its length and no data may be inline.
                        let len = r.remaining_bytes;
                        if ex.rdma_staged {
                            let n = if ex.rdma_store {
                                match self.store.write(tag, handle, r.offset, &[]) {
                                    Poll::Pending => return Ok(Step::Hold(Wait::Store)),
                                    Poll::Ready(n) => n.map_err(|e| e.status())?,
                                }
                            } else {
                                ex.rdma.take().unwrap_or(Err(STATUS_UNEXPECTED_IO_ERROR))?
                            };
                            if ch == Channel::RdmaV1Invalidate {
                                ex.invalidate = r.channel_info.as_bytes().map(|d| le32(d, 8));
                            }
                            push(w, &ok(session, tree), &WriteResponseRepr { count: n });
                            return Ok(Step::Done);
                        }
                        if !r.data.is_empty() || len == 0 || !charge_ok(req, len) {
                            return Err(STATUS_INVALID_PARAMETER);
                        }
                        let descs = rdma_channel(ch, dialect, r.channel_info, len, max_rw)?;
                        if !self.admit(flow, lane, ex, u64::from(len))? {
                            return Ok(Step::Hold(Wait::Qos));
                        }
                        Ok(Step::Rdma(plan(
                            RdmaKind::Read,
                            descs,
                            len,
                            ch,
                            fid,
                            handle,
                            r.offset,
                            if last { MODE_FAST } else { MODE_HELD },
                            tag,
                            ok(session, tree),
                        )))
                    }
                    _ => Err(STATUS_INVALID_PARAMETER),
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn negotiate<'a>(
        &mut self,
        c: &mut Conn,
        req: &HeaderRepr,
        n: NegotiateRequestRepr<'_>,
        ex: &mut Exec,
        w: &mut CompoundWriter<'_>,
        max_rw: u32,
        grant: u16,
        msg_bytes: &[u8],
    ) -> Result<Step<'a>, NtStatus> {
        let dialect = [Dialect::SMB_3_1_1, Dialect::SMB_3_0_2, Dialect::SMB_3_0]
            .into_iter()
            .find(|d| n.dialects.contains(d.0))
            .ok_or(STATUS_NOT_SUPPORTED)?;
        let mut salt = [0u8; 32];
        random_bytes(&mut salt, &mut self.salt_seed);
        let hashes = [HashAlgorithm::SHA_512.0];
        // 3.3.5.4: SIGNING_CAPABILITIES: the first of the client's
        // algorithms this server implements.
        let signing = n.negotiate_contexts.iter().find_map(|ctx| match ctx {
            NegotiateContext::Signing(sc) => sc
                .signing_algorithms
                .iter()
                .find(|a| *a == SigningAlgorithm::AES_CMAC.0 || *a == SigningAlgorithm::AES_GMAC.0),
            _ => None,
        });
        let signing_algs = [signing.unwrap_or(SigningAlgorithm::AES_CMAC.0)];
        let preauth_ctx = NegotiateContext::PreauthIntegrity(PreauthIntegrityCapabilities {
            hash_algorithms: U16Array::new(&hashes),
            salt: &salt,
        });
        let signing_ctx = NegotiateContext::Signing(SigningCapabilities {
            signing_algorithms: U16Array::new(&signing_algs),
        });
        let ctxs_signing = [preauth_ctx, signing_ctx];
        let n_ctx = if dialect == Dialect::SMB_3_1_1 && signing.is_some() {
            2
        } else {
            1
        };
        let contexts = if dialect == Dialect::SMB_3_1_1 {
            // 3.3.5.4: 3.1.1 requires a preauth integrity context with SHA-512.
            match n
                .negotiate_contexts
                .find(NegotiateContextType::PREAUTH_INTEGRITY_CAPABILITIES)
            {
                Some(NegotiateContext::PreauthIntegrity(p))
                    if p.hash_algorithms.contains(HashAlgorithm::SHA_512.0) => {}
                _ => return Err(STATUS_INVALID_PARAMETER),
            }
            NegotiateContextList::new(&ctxs_signing[..n_ctx])
        } else {
            NegotiateContextList::EMPTY
        };
        c.dialect = Some(dialect);
        let security_mode = if self.cfg.require_signing {
            SecurityMode::SIGNING_ENABLED | SecurityMode::SIGNING_REQUIRED
        } else {
            SecurityMode::SIGNING_ENABLED
        };
        // Truthful capabilities: multi-credit only (no DFS, leasing,
        // multichannel, persistent handles, encryption).
        let capabilities = Capabilities::LARGE_MTU;
        c.neg = Some(NegotiateState {
            client_capabilities: n.capabilities.bits(),
            client_guid: n.client_guid,
            client_security_mode: n.security_mode.bits(),
            client_dialects: n.dialects.iter().collect(),
            server_capabilities: capabilities.bits(),
            server_security_mode: security_mode.bits(),
            signing: if dialect == Dialect::SMB_3_1_1 {
                signing.map(SigningAlgorithm)
            } else {
                None
            },
        });
        // 3.3.5.5: the SPNEGO token offering NTLMSSP when users log on.
        let token = match self.cfg.users {
            Some(_) => auth::Acceptor::negotiate_token(),
            None => Vec::new(),
        };
        let r = NegotiateResponseRepr {
            security_mode,
            dialect_revision: dialect.0,
            server_guid: self.server_guid,
            capabilities,
            max_transact_size: max_rw,
            max_read_size: max_rw,
            max_write_size: max_rw,
            system_time: filetime_now(),
            server_start_time: 0,
            security_buffer: &token,
            negotiate_contexts: contexts,
        };
        let start = if w.is_empty() { 0 } else { (w.len() + 7) & !7 };
        push(w, &resp_header(req, STATUS_SUCCESS, grant, 0, 0), &r);
        if dialect == Dialect::SMB_3_1_1 {
            // 3.3.5.4: Connection.PreauthIntegrityHashValue over the
            // NEGOTIATE request and response.
            let mut h = auth::preauth::PreauthHash::new();
            h.update(msg_bytes);
            c.preauth = Some(h);
            ex.hash_response = Some((start, w.len(), true));
        }
        Ok(Step::Done)
    }

    /// [MS-SMB2] 3.3.5.5 with local users: NTLMSSP (raw or in SPNEGO) over
    /// one or more SESSION_SETUP round trips, then the session's signing key
    /// (3.3.5.5.3).
    #[allow(clippy::too_many_arguments)]
    fn session_setup<'a>(
        &mut self,
        c: &mut Conn,
        req: &HeaderRepr,
        s: &SessionSetupRequestRepr<'_>,
        ex: &mut Exec,
        w: &mut CompoundWriter<'_>,
        grant: u16,
        session: u64,
        tree: u32,
        msg_bytes: &[u8],
    ) -> Result<Step<'a>, NtStatus> {
        let dialect = c.dialect.ok_or(STATUS_INVALID_PARAMETER)?;
        if s.flags.contains(SessionSetupFlags::BINDING) {
            // No multichannel: a session cannot be bound to a second channel.
            return Err(STATUS_REQUEST_NOT_ACCEPTED);
        }
        let id = match c.session {
            Some(id) if session == id => id,
            _ if session != 0 => return Err(STATUS_USER_SESSION_DELETED),
            old => {
                if old.is_some() {
                    // One session per connection: a new one replaces it.
                    self.sessions = self.sessions.saturating_sub(1);
                }
                let id = self.next_session;
                self.next_session += 1;
                self.sessions += 1;
                self.gauges_dirty = true;
                c.session = Some(id);
                c.auth = None;
                id
            }
        };
        ex.chain.session = id;
        let fresh = c.auth.as_ref().map_or(true, |a| a.ready);
        if fresh {
            let mut challenge = [0u8; 8];
            random_bytes(&mut challenge, &mut self.salt_seed);
            let config = auth::ntlm::NtlmServerConfig {
                names: auth::ntlm::TargetNames::standalone(&self.cfg.server_name),
                timestamp: Some(filetime_now()),
                allow_anonymous: self.cfg.guest_ok,
            };
            c.auth = Some(SessionAuth {
                acceptor: Some(auth::Acceptor::new(challenge, config)),
                preauth: c.preauth.clone(),
                key: None,
                signing_required: false,
                ready: false,
            });
        }
        let client_requires = s.security_mode.contains(SecurityMode::SIGNING_REQUIRED);
        let a = c.auth.as_mut().expect("set above");
        if let Some(h) = a.preauth.as_mut() {
            h.update(msg_bytes);
        }
        let fail = |c: &mut Conn, core: &mut Core| {
            c.session = None;
            c.auth = None;
            core.sessions = core.sessions.saturating_sub(1);
            core.gauges_dirty = true;
        };
        if s.security_buffer.is_empty() {
            // No credentials at all: a null session where allowed.
            if !self.cfg.guest_ok {
                fail(c, self);
                return Err(STATUS_ACCESS_DENIED);
            }
            a.acceptor = None;
            a.ready = true;
            let r = SessionSetupResponseRepr {
                session_flags: SessionFlags::IS_NULL,
                security_buffer: &[],
            };
            push(w, &resp_header(req, STATUS_SUCCESS, grant, id, tree), &r);
            return Ok(Step::Done);
        }
        let users = self.cfg.users.clone().expect("checked by the caller");
        let step = match a.acceptor.as_mut() {
            Some(acc) => acc.step(s.security_buffer, |user, _domain| users.nt_hash(user)),
            None => return Err(STATUS_INVALID_PARAMETER),
        };
        match step {
            Ok(auth::Step::Continue(token)) => {
                let start = if w.is_empty() { 0 } else { (w.len() + 7) & !7 };
                let r = SessionSetupResponseRepr {
                    session_flags: SessionFlags::empty(),
                    security_buffer: &token,
                };
                push(
                    w,
                    &resp_header(req, STATUS_MORE_PROCESSING_REQUIRED, grant, id, tree),
                    &r,
                );
                if a.preauth.is_some() {
                    ex.hash_response = Some((start, w.len(), false));
                }
                Ok(Step::Done)
            }
            Ok(auth::Step::Complete { token, auth: ok }) => {
                a.acceptor = None;
                a.ready = true;
                let flags = if ok.anonymous {
                    SessionFlags::IS_NULL
                } else {
                    let key = auth::kdf::signing_key(
                        dialect,
                        &ok.session_key,
                        a.preauth.as_ref().map(|h| h.value()),
                    )
                    .map_err(|_| STATUS_LOGON_FAILURE)?;
                    a.key = Some(key);
                    // 3.3.5.5.3: Session.SigningRequired.
                    a.signing_required = self.cfg.require_signing || client_requires;
                    // The final SESSION_SETUP response is signed (3.3.4.1.1).
                    ex.sign = true;
                    SessionFlags::empty()
                };
                let r = SessionSetupResponseRepr {
                    session_flags: flags,
                    security_buffer: &token,
                };
                push(w, &resp_header(req, STATUS_SUCCESS, grant, id, tree), &r);
                Ok(Step::Done)
            }
            Err(e) => {
                self.warn_once(
                    Warn::Logon,
                    format_args!(
                        "conn {}: SESSION_SETUP refused: {e} ({})",
                        ex.conn,
                        e.status()
                    ),
                );
                fail(c, self);
                Err(e.status())
            }
        }
    }

    /// [MS-SMB2] 3.3.5.15.12: the client checks that NEGOTIATE was not
    /// tampered with; any difference from what this connection negotiated
    /// ends it.
    fn validate_negotiate<'a>(
        &mut self,
        c: &mut Conn,
        r: &IoctlRequestRepr<'_>,
        w: &mut CompoundWriter<'_>,
        ok: HeaderRepr,
    ) -> Result<Step<'a>, NtStatus> {
        let (Some(neg), Some(dialect)) = (c.neg.as_ref(), c.dialect) else {
            return Ok(Step::Disconnect);
        };
        if dialect == Dialect::SMB_3_1_1 {
            // 3.3.5.15.12: not used with 3.1.1 (preauth integrity instead).
            return Ok(Step::Disconnect);
        }
        let Ok(v) = ValidateNegotiateInfoRequest::new_checked(r.input) else {
            return Ok(Step::Disconnect);
        };
        let Ok(v) = ValidateNegotiateInfoRequestRepr::parse(&v) else {
            return Ok(Step::Disconnect);
        };
        let dialects: Vec<u16> = v.dialects.iter().collect();
        if v.capabilities.bits() != neg.client_capabilities
            || v.guid != neg.client_guid
            || v.security_mode.bits() != neg.client_security_mode
            || dialects != neg.client_dialects
        {
            self.warn_once(Warn::Validate, format_args!(
                "conn: FSCTL_VALIDATE_NEGOTIATE_INFO differs from the NEGOTIATE received: disconnecting ([MS-SMB2] 3.3.5.15.12)"
            ));
            return Ok(Step::Disconnect);
        }
        let resp = ValidateNegotiateInfoResponseRepr {
            capabilities: Capabilities::from_bits(neg.server_capabilities),
            guid: self.server_guid,
            security_mode: SecurityMode::from_bits(neg.server_security_mode),
            dialect: dialect.0,
        };
        let mut out = [0u8; 24];
        let n = resp.emit(&mut out).map_err(|_| STATUS_INVALID_PARAMETER)?;
        let ir = IoctlResponseRepr {
            ctl_code: r.ctl_code,
            file_id: r.file_id,
            input: &[],
            output: &out[..n],
            flags: 0,
        };
        push(w, &ok, &ir);
        Ok(Step::Done)
    }

    /// A warning on stderr, at most one a second per kind and worker (a
    /// peer cannot flood the log), saying how many were not printed.
    fn warn_once(&mut self, kind: Warn, msg: core::fmt::Arguments<'_>) {
        if let Some(n) = self.warn_log[kind as usize].hit(std::time::Instant::now()) {
            eprintln!("smbdirectd: warn: {msg}{}", suppressed_note(n));
        }
    }

    /// The data of a last-request RDMA Read (a WRITE's data) is here:
    /// store it and answer, or wait for the store.
    #[allow(clippy::too_many_arguments)]
    fn finish_write(
        &mut self,
        conn: ConnId,
        handle: Handle,
        offset: u64,
        done: &RdmaDone<'_>,
        ctx: &[u8],
        conn_ref: Option<&Conn>,
        out: &mut Replies<'_>,
    ) -> Result<(), Backpressure> {
        let tag = le64(ctx, 40);
        let Ok(h) = HeaderRepr::from_bytes(ctx.get(CTX_HEADER..).unwrap_or(&[])) else {
            return Ok(());
        };
        let written = if done.zero_copy {
            // The RDMA Read placed the data in the store's pinned memory.
            self.copies_due = true;
            self.store.write_pinned(tag, handle, offset, done.len)
        } else {
            self.store.write(tag, handle, offset, done.data)
        };
        let r = match written {
            Poll::Pending => {
                let mut c = [0u8; CTX_LEN];
                c.copy_from_slice(&ctx[..CTX_LEN]);
                self.posts.insert(
                    tag,
                    PostWrite {
                        conn,
                        handle,
                        offset,
                        ctx: c,
                        result: None,
                    },
                );
                return Ok(());
            }
            Poll::Ready(r) => r,
        };
        reply_write_result(&h, r, ctx, conn_ref, out)?;
        self.store_full += u64::from(is_disk_full(&r));
        Ok(())
    }
}

/// Whether a store result is a full store (answered STATUS_DISK_FULL).
fn is_disk_full(r: &Result<u32, store::StoreError>) -> bool {
    matches!(r, Err(e) if e.status() == STATUS_DISK_FULL)
}

/// Answers a WRITE whose data came by RDMA with the store's result.
fn reply_write_result(
    h: &HeaderRepr,
    r: Result<u32, store::StoreError>,
    ctx: &[u8],
    conn: Option<&Conn>,
    out: &mut Replies<'_>,
) -> Result<(), Backpressure> {
    let mut buf = [0u8; HEADER_LEN + 64];
    let n = match r {
        Ok(n) => rdma_response(RdmaKind::Read, h, n, &mut buf),
        Err(e) => error_message(h, e.status(), &mut buf),
    };
    reply_ctx(ctx, n, &mut buf, conn, out)
}

/// Signs every message of a compound response that belongs to the
/// connection's authenticated session ([MS-SMB2] 3.3.4.1.1; each message
/// of a compound is signed on its own, padding included, 3.1.4.1).
///
/// `ended` is the session a LOGOFF in this compound ended (its id, algorithm
/// and key): its responses are signed with that key.
fn sign_compound(c: &Conn, ended: Option<(u64, SigningAlgorithm, [u8; 16])>, buf: &mut [u8]) {
    let live = || {
        let (d, a, sid) = (c.dialect?, c.auth.as_ref()?, c.session?);
        let alg = auth::signing::algorithm_for(d, c.neg.as_ref().and_then(|n| n.signing));
        Some((sid, alg, a.key?))
    };
    let Some((sid, alg, key)) = ended.or_else(live) else {
        return;
    };
    let mut spans = [(0usize, 0usize); 32];
    let mut n = 0;
    for m in compound(buf).flatten() {
        if n < spans.len() && m.header().session_id == sid {
            spans[n] = (m.offset(), m.bytes().len());
            n += 1;
        }
    }
    for &(o, l) in &spans[..n] {
        let _ = auth::signing::sign(alg, &key, &mut buf[o..o + l]);
    }
}

/// Sends a response built from an RDMA context (with Send with Invalidate
/// when the request asked for it).
fn reply_ctx(
    ctx: &[u8],
    n: Option<usize>,
    buf: &mut [u8],
    conn: Option<&Conn>,
    out: &mut Replies<'_>,
) -> Result<(), Backpressure> {
    let Some(n) = n else { return Ok(()) };
    if ctx[2] == 1 {
        if let Some(c) = conn {
            sign_compound(c, None, &mut buf[..n]);
        }
    }
    let buf = &*buf;
    let fill = |b: &mut [u8]| b.copy_from_slice(&buf[..n]);
    if ctx[0] == 1 {
        out.reply_with_invalidate(n, le32(ctx, 4), fill)
    } else {
        out.reply(n, fill)
    }
}

impl UpperLayer for Smb2Server {
    fn name(&self) -> &'static str {
        "smb2"
    }

    fn on_message(
        &mut self,
        conn: ConnId,
        msg: &[u8],
        out: &mut Replies<'_>,
    ) -> Result<(), Backpressure> {
        let c = self.conns.entry(conn).or_insert_with(Conn::new);
        if c.dead {
            return Ok(());
        }
        let token = self.core.token();
        self.core
            .run(c, msg, Exec::new(conn, token), &mut self.scratch, out);
        Ok(())
    }

    fn on_wake(
        &mut self,
        conn: ConnId,
        token: u64,
        msg: Option<&[u8]>,
        out: &mut Replies<'_>,
    ) -> Result<(), Backpressure> {
        let core = &mut self.core;
        if let Some(mut p) = core.posts.remove(&token) {
            let r = match p.result {
                Some(r) => r,
                None => match core.store.write(token, p.handle, p.offset, &[]) {
                    Poll::Pending => {
                        core.posts.insert(token, p);
                        return Ok(());
                    }
                    Poll::Ready(r) => r,
                },
            };
            let Ok(h) = HeaderRepr::from_bytes(&p.ctx[CTX_HEADER..]) else {
                return Ok(());
            };
            if let Err(b) = reply_write_result(&h, r, &p.ctx, self.conns.get(&conn), out) {
                // The store forgot the tag: answer from the kept result.
                p.result = Some(r);
                core.posts.insert(token, p);
                return Err(b);
            }
            core.store_full += u64::from(is_disk_full(&r));
            return Ok(());
        }
        let Some(mut ex) = core.execs.remove(&token) else {
            return Ok(());
        };
        let (Some(msg), Some(c)) = (msg, self.conns.get_mut(&conn)) else {
            return Ok(());
        };
        if let Some((p, inv)) = ex.pending_reply.take() {
            let fill = |b: &mut [u8]| b.copy_from_slice(&p);
            let r = match inv {
                Some(t) => out.reply_with_invalidate(p.len(), t, fill),
                None => out.reply(p.len(), fill),
            };
            if let Err(b) = r {
                ex.pending_reply = Some((p, inv));
                core.execs.insert(token, ex);
                return Err(b);
            }
        }
        if !ex.ready {
            // Woken to flush responses only; still waiting.
            out.hold(token);
            core.execs.insert(token, ex);
            return Ok(());
        }
        ex.ready = false;
        core.run(c, msg, ex, &mut self.scratch, out);
        Ok(())
    }

    fn on_rdma_complete(
        &mut self,
        conn: ConnId,
        done: &RdmaDone<'_>,
        out: &mut Replies<'_>,
    ) -> Result<(), Backpressure> {
        let ctx = done.context;
        if ctx.len() < CTX_LEN {
            return Ok(());
        }
        let tag = le64(ctx, 40);
        let fid = FileId {
            volatile: le64(ctx, 8),
            persistent: le64(ctx, 16),
        };
        let offset = le64(ctx, 32);
        let handle = self
            .conns
            .get(&conn)
            .and_then(|c| c.opens.get(&fid.volatile))
            .filter(|o| o.persistent == fid.persistent)
            .map(|o| o.handle);
        let core = &mut self.core;
        let conn_ref = self.conns.get(&conn);
        if ctx[1] == MODE_HELD {
            let Some(ex) = core.execs.get_mut(&tag) else {
                return Ok(());
            };
            match (done.kind, handle) {
                (RdmaKind::Write, _) => ex.rdma = Some(Ok(done.len)),
                (RdmaKind::Read, None) => ex.rdma = Some(Err(STATUS_FILE_CLOSED)),
                (RdmaKind::Read, Some(h)) => {
                    let written = if done.zero_copy {
                        core.copies_due = true;
                        core.store.write_pinned(tag, h, offset, done.len)
                    } else {
                        core.store.write(tag, h, offset, done.data)
                    };
                    match written {
                        Poll::Pending => {
                            ex.rdma_store = true;
                            return Ok(());
                        }
                        Poll::Ready(r) => ex.rdma = Some(r.map_err(|e| e.status())),
                    }
                }
            }
            ex.ready = true;
            core.wakes.push_back((conn, tag));
            return Ok(());
        }
        let Ok(h) = HeaderRepr::from_bytes(&ctx[CTX_HEADER..]) else {
            return Ok(());
        };
        match done.kind {
            // RDMA Write finished: a READ's data is at the client.
            RdmaKind::Write => {
                let mut buf = [0u8; HEADER_LEN + 64];
                let n = rdma_response(RdmaKind::Write, &h, le32(ctx, 24), &mut buf);
                reply_ctx(ctx, n, &mut buf, conn_ref, out)
            }
            // RDMA Read finished: a WRITE's data is here.
            RdmaKind::Read => match handle {
                Some(hd) => core.finish_write(conn, hd, offset, done, ctx, conn_ref, out),
                None => {
                    let mut buf = [0u8; HEADER_LEN + 64];
                    let n = error_message(&h, STATUS_FILE_CLOSED, &mut buf);
                    reply_ctx(ctx, n, &mut buf, conn_ref, out)
                }
            },
        }
    }

    fn on_close(&mut self, conn: ConnId) {
        let core = &mut self.core;
        if let Some(mut c) = self.conns.remove(&conn) {
            if c.session.is_some() {
                core.sessions = core.sessions.saturating_sub(1);
            }
            for (_, o) in c.opens.drain() {
                // The control plane drops the connection's QoS state itself.
                let o = Open {
                    qos_named: false,
                    flow_pending: false,
                    ..o
                };
                core.close_open(conn, o);
            }
        }
        let gone: Vec<u64> = core
            .execs
            .iter()
            .filter(|(_, e)| e.conn == conn)
            .map(|(t, _)| *t)
            .collect();
        for t in gone {
            core.execs.remove(&t);
            core.store.cancel(t);
        }
        let gone: Vec<u64> = core
            .posts
            .iter()
            .filter(|(_, p)| p.conn == conn)
            .map(|(t, _)| *t)
            .collect();
        for t in gone {
            core.posts.remove(&t);
            core.store.cancel(t);
        }
        core.gauges_dirty = true;
    }

    /// Store operations in flight or requests queued for QoS tokens.
    fn busy(&self) -> bool {
        self.core.store.in_flight() > 0 || !self.core.qos.sched.is_idle()
    }

    fn poll(&mut self, now: PInstant, io: &mut UpperIo<'_>) -> bool {
        let core = &mut self.core;
        core.now = now;
        let mut any = false;
        if core.store.in_flight() > 0 {
            let Core {
                store,
                execs,
                posts,
                wakes,
                ..
            } = core;
            store.poll(&mut |tag| {
                if let Some(ex) = execs.get_mut(&tag) {
                    ex.ready = true;
                    wakes.push_back((ex.conn, tag));
                } else if let Some(p) = posts.get(&tag) {
                    wakes.push_back((p.conn, tag));
                }
            });
        }
        // Storage QoS: dispatch waiting requests, report closed windows.
        let q = &mut core.qos;
        if !q.sched.is_idle() {
            let mut n = 0;
            while n < QOS_DISPATCH_BUDGET {
                let Some((_, tok)) = q.sched.next_ready(now) else {
                    break;
                };
                n += 1;
                if let Some(ex) = core.execs.get_mut(&tok) {
                    ex.admitted = true;
                    ex.queued = false;
                    ex.ready = true;
                    core.wakes.push_back((ex.conn, tok));
                }
            }
            if n == QOS_DISPATCH_BUDGET {
                q.saturated = true;
            }
            core.gauges_dirty = true;
        }
        let unreported = q.sched.closed_window_len().saturating_sub(q.report_next);
        q.sched.tick(now);
        let mut lost = 0;
        if q.sched.window_start() != q.window {
            q.window = q.sched.window_start();
            // A window closed before the last one was reported in full:
            // the control plane's ring stayed full for a whole window.
            lost = unreported;
            q.report_next = 0;
            q.report_saturated = q.saturated;
            q.saturated = false;
        }
        while let Some((c, t)) = core.wakes.pop_front() {
            io.wake(c, t);
            any = true;
        }
        while let Some((c, t)) = core.retries.pop_front() {
            io.wake_when_freed(c, t);
        }
        while let Some(ev) = core.events.pop_front() {
            io.to_control(ev);
            any = true;
        }
        // The closed window's reports, as far as the ring takes them: only
        // flows with I/O in the window or the one before (the others'
        // reports are all zeros, as already reported).
        let q = &mut core.qos;
        let end = q.sched.closed_window_len();
        let mut budget = io.control_room().min(QOS_REPORT_BUDGET);
        while budget > 0 && q.report_next < end {
            let k = q.report_next;
            q.report_next += 1;
            let Some(slot) = q.sched.closed_window_slot(k) else {
                continue;
            };
            if let Some(report) = q.sched.last_window(slot) {
                io.to_control(UpperEvent::QosWindow {
                    flow: q.slot_flow[slot.index()],
                    report,
                    saturated: q.report_saturated,
                });
                budget -= 1;
                any = true;
            }
        }
        if lost > 0 {
            core.warn_once(
                Warn::QosReports,
                format_args!(
                    "Storage QoS: the reports of {lost} flow(s) for one accounting window were not sent: \
                     the control plane did not take this worker's messages for a whole window \
                     (their I/O is missing from `qos flows` rates for that window)"
                ),
            );
        }
        if core.pool_stalls + core.store_full > 0 {
            io.add_counts(
                std::mem::take(&mut core.pool_stalls),
                std::mem::take(&mut core.store_full),
            );
        }
        if core.copies_due {
            core.copies_due = false;
            let c = core.store.take_copy_counts();
            if c != store::CopyCounts::default() {
                io.add_copy_counts(c.away, c.kept);
            }
        }
        if core.gauges_dirty {
            core.gauges_dirty = false;
            io.set_gauges(
                core.sessions,
                core.opens,
                core.qos.sched.total_queued() as u64,
            );
        }
        any
    }

    fn zero_copy_regions(&self) -> Vec<(usize, usize)> {
        self.core
            .store
            .zero_copy()
            .map(|z| z.regions)
            .unwrap_or_default()
    }

    fn set_zero_copy_regions(&mut self, mrs: &[MemoryRegion]) {
        if let Some(z) = self.core.store.zero_copy() {
            if z.regions.len() == mrs.len() {
                self.core.zc = Some(ZeroCopyState {
                    lkeys: mrs.iter().map(|m| m.lkey).collect(),
                    pins: z.pins,
                    pieces: vec![
                        Piece {
                            sge: crate::provider::Sge {
                                addr: 0,
                                len: 0,
                                lkey: 0,
                            },
                            pin: crate::zerocopy::NO_PIN,
                        };
                        ZC_MAX_PIECES
                    ],
                });
            }
        }
    }

    fn on_control(&mut self, msg: UpperControl) {
        let core = &mut self.core;
        match msg {
            UpperControl::QosReply {
                conn,
                token,
                open,
                result,
                flow,
            } => {
                // The Open the request named (FileIds here have volatile ==
                // persistent); it may have closed meanwhile.
                if let Some(o) = self
                    .conns
                    .get_mut(&conn)
                    .and_then(|c| c.opens.get_mut(&open))
                {
                    core.assign(o, flow);
                    if std::mem::take(&mut o.flow_pending) {
                        // Its READs and WRITEs that waited for the flow run
                        // now (those of other pending Opens wait again).
                        for (&t, ex) in core.execs.iter_mut() {
                            if ex.conn == conn && ex.wait == Some(Wait::Flow) && !ex.ready {
                                ex.ready = true;
                                core.wakes.push_back((conn, t));
                            }
                        }
                    }
                }
                let Some(ex) = core.execs.get_mut(&token) else {
                    return;
                };
                ex.ioctl = Some(result);
                ex.queued = false;
                ex.ready = true;
                core.wakes.push_back((conn, token));
            }
            UpperControl::QosRates(f) => {
                if let Some(&(s, _)) = core.qos.by_flow.get(&f.flow) {
                    let _ = core.qos.sched.set_rates(core.now, s, f.rates);
                }
            }
        }
    }
}
