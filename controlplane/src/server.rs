//! Starting and running a server: the buffer pool, its registration, one
//! pinned worker per core, and the `cp` thread.

use crate::admin::AdminSocket;
use crate::pressure::{Pressure, PressureLog};
use crate::qos::QosEngine;
use crate::qos_policy::PolicyStore;
use crate::stats::ServerStats;
use smbdirect_dataplane::capture::{CaptureConfig, CaptureHandle};
use smbdirect_dataplane::clock;
use smbdirect_dataplane::endpoint::recv_wr_id;
use smbdirect_dataplane::planes::{
    ring, wait_readable, CloseReason, Doorbell, FromWorker, Ring, ToWorker, UpperEvent,
    WorkerStats, LOANED_RECEIVES,
};
use smbdirect_dataplane::provider::{
    CompletionQueue, ConnRequest, Listener, MemoryRegion, Provider, ProviderError, QpCaps, RecvWr,
};
use smbdirect_dataplane::upper::UpperLayer;
pub use smbdirect_dataplane::worker::IdleMode;
use smbdirect_dataplane::worker::{Worker, WorkerConfig};
use smbdirect_hugepages::{Backing, BufId, PoolConfig};
use smbdirect_protocol::smbd::negotiation::{evaluate_negotiate_request, NegotiateDecision};
use smbdirect_protocol::smbd::{SmbdConfig, TerminateReason};
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Everything `serve` is configured with.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// One worker per entry, pinned to that core (None: not pinned).
    pub worker_cores: Vec<Option<usize>>,
    /// Core for the `cp` thread, when a spare core exists.
    pub cp_core: Option<usize>,
    /// SMB Direct parameters.
    pub smbd: SmbdConfig,
    /// Outstanding upper-layer requests per connection: sizes queue pairs
    /// and each connection's table of RDMA operations in flight.
    pub queue_depth: u32,
    /// Admission limit.
    pub max_connections: usize,
    /// Buffer pool budget in bytes.
    pub pool_mem: usize,
    /// Worker idle policy: busy-poll this long without work, then
    /// `idle`.
    pub idle_park: Duration,
    /// What an idle worker does after `idle_park` (sleep on the completion
    /// queue where the provider can, or nap).
    pub idle: IdleMode,
    /// Admin socket path (None: no admin socket).
    pub admin_socket: Option<PathBuf>,
    /// Print a stats line this often.
    pub stats_interval: Option<Duration>,
    /// How long in-flight work may take after SIGTERM.
    pub shutdown_grace: Duration,
    /// Write every SMB Direct message sent and received to this pcap.
    pub capture: Option<PathBuf>,
    /// Storage QoS policies (`--policy-file`); changed at runtime through
    /// the admin socket (and written back to the file, if any).
    pub policies: PolicyStore,
    /// What the share's store is, for `stats`.
    pub store_description: String,
    /// Capacity of the Storage QoS LogicalFlowTable (None: the default,
    /// 65,536 flows).
    pub qos_max_flows: Option<usize>,
    /// How long a Storage QoS flow no Open references stays in the table
    /// ([MS-SQOS] 3.2.1.2, ServerConfig::flow_retention; None: 60 s).
    pub qos_flow_retention: Option<Duration>,
}

impl Default for ServerConfig {
    /// An in-process server (tests, `bench --loopback`): 127.0.0.1 with
    /// the port left to the provider, one unpinned worker, the [MS-SMBD]
    /// defaults, queue depth 32, 64 connections, a 96 MiB pool, 200 us of
    /// busy-polling before idling, no admin socket, stats line, capture
    /// or policies. `serve` sets every field from its flags.
    fn default() -> Self {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            worker_cores: vec![None],
            cp_core: None,
            smbd: SmbdConfig::default(),
            queue_depth: 32,
            max_connections: 64,
            pool_mem: 96 << 20,
            idle_park: Duration::from_micros(200),
            idle: IdleMode::default(),
            admin_socket: None,
            stats_interval: None,
            shutdown_grace: Duration::from_secs(2),
            capture: None,
            policies: PolicyStore::default(),
            store_description: String::new(),
            qos_max_flows: None,
            qos_flow_retention: None,
        }
    }
}

impl ServerConfig {
    /// Queue-pair sizes for a connection ([MS-SMBD] credits and the queue
    /// depth): every receive credit plus the negotiate and last-credit
    /// receives; sends bounded by the send credit target.
    pub fn qp_caps(&self) -> QpCaps {
        QpCaps {
            max_recv_wr: self.smbd.receive_credit_max as u32 + 2,
            max_send_wr: (self.smbd.send_credit_target as u32)
                .min(self.queue_depth.max(1) * 4 + 16)
                + 4,
            max_sge: 4,
            ird: 16,
            ord: 16,
        }
    }
}

/// Why the server could not start.
#[derive(Debug)]
pub enum ServerError {
    /// An invalid configuration, described for the operator.
    Config(String),
    /// The RDMA provider failed.
    Provider(ProviderError),
    /// The buffer pool could not be built.
    Pool(String),
    /// Other I/O (admin socket, threads).
    Io(std::io::Error),
}

impl core::fmt::Display for ServerError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ServerError::Config(s) => f.write_str(s),
            ServerError::Provider(e) => write!(f, "RDMA provider: {e}"),
            ServerError::Pool(s) => write!(f, "buffer pool: {s}"),
            ServerError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ServerError {}

struct WorkerSide<P: Provider> {
    to: Ring<ToWorker<P::Qp>>,
    /// Upper-layer messages waiting for room in `to` (the control plane
    /// never blocks on them).
    backlog: VecDeque<ToWorker<P::Qp>>,
    from: Ring<FromWorker>,
    loans: Ring<u64>,
    /// The worker's doorbell, rung after every push to `to`.
    bell: Arc<Doorbell>,
    cq: <P::Cq as CompletionQueue>::Handle,
    thread: Option<JoinHandle<()>>,
}

/// Pushes `msg` to a worker's ring, waiting while the ring is full (the
/// worker drains it every loop iteration), and rings its doorbell.
fn push_waiting<Q>(to: &Ring<ToWorker<Q>>, bell: &Doorbell, mut msg: ToWorker<Q>) {
    loop {
        match to.push(msg) {
            Ok(()) => break,
            Err(m) => {
                msg = m;
                bell.ring();
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }
    bell.ring();
}

/// A started server.
#[derive(Debug)]
pub struct RunningServer {
    shutdown: Arc<AtomicBool>,
    /// The control plane's doorbell (rung on shutdown: it may be asleep).
    cp_bell: Arc<Doorbell>,
    cp: Option<JoinHandle<()>>,
    stats: Arc<ServerStats>,
    local_addr: SocketAddr,
    admin_path: Option<PathBuf>,
}

impl RunningServer {
    /// Counters.
    pub fn stats(&self) -> &Arc<ServerStats> {
        &self.stats
    }

    /// The bound address (port 0 resolved).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The admin socket, if any.
    pub fn admin_path(&self) -> Option<&PathBuf> {
        self.admin_path.as_ref()
    }

    /// A flag that, once set, shuts the server down (signal handlers set it).
    pub fn shutdown_flag(&self) -> Arc<AtomicBool> {
        self.shutdown.clone()
    }

    /// Stops accepting, lets in-flight work finish within the grace period,
    /// disconnects everything, returns every buffer, and joins all threads.
    pub fn shutdown(mut self) -> Arc<ServerStats> {
        self.shutdown.store(true, Ordering::Release);
        self.cp_bell.ring();
        self.join()
    }

    /// Waits until the server stops (after the shutdown flag is set).
    pub fn join(&mut self) -> Arc<ServerStats> {
        if let Some(t) = self.cp.take() {
            let _ = t.join();
        }
        self.stats.clone()
    }
}

/// Registers the memory an upper layer moves by RDMA directly
/// ([`UpperLayer::zero_copy_regions`]) with `provider`, once per distinct
/// region (`done` remembers them), and hands the registrations back. A
/// failed registration is logged once and leaves the layer staging its
/// data through pool buffers (slower, same results).
fn register_zero_copy<P: Provider, U: UpperLayer>(
    provider: &P,
    upper: &mut U,
    done: &mut Vec<((usize, usize), Option<MemoryRegion>)>,
) {
    let regions = upper.zero_copy_regions();
    if regions.is_empty() {
        return;
    }
    let mut mrs = Vec::with_capacity(regions.len());
    for r in regions {
        let mr = match done.iter().find(|(k, _)| *k == r) {
            Some((_, mr)) => *mr,
            None => {
                // SAFETY: the upper layer keeps the region mapped while the
                // provider may use it: the memory store's blocks, which the
                // workers' handles share, live as long as any worker; a
                // directory store's staging slab (one per worker's handle)
                // is unmapped only when no transfer holds a pin on it, and
                // leaked otherwise.
                let mr = match unsafe { provider.register(r.0 as *mut u8, r.1, None) } {
                    Ok(mr) => Some(mr),
                    Err(e) => {
                        eprintln!(
                            "[smbdirectd] WARN zero-copy RDMA off: cannot register {} bytes of \
                             store memory with the {} provider ({e}); data is staged through \
                             pool buffers",
                            r.1,
                            provider.name()
                        );
                        None
                    }
                };
                done.push((r, mr));
                mr
            }
        };
        match mr {
            Some(mr) => mrs.push(mr),
            None => return,
        }
    }
    upper.set_zero_copy_regions(&mrs);
}

/// Starts a server on `provider` with one `upper()` per worker.
pub fn start<P: Provider, U: UpperLayer>(
    provider: Arc<P>,
    mut cfg: ServerConfig,
    upper: impl Fn() -> U,
) -> Result<RunningServer, ServerError> {
    cfg.smbd
        .validate()
        .map_err(|e| ServerError::Config(e.to_string()))?;
    if cfg.worker_cores.is_empty() {
        return Err(ServerError::Config(
            "at least one worker core is needed".into(),
        ));
    }
    if cfg.max_connections == 0 {
        return Err(ServerError::Config(
            "--max-connections must be at least 1".into(),
        ));
    }
    let nworkers = cfg.worker_cores.len();
    let pool = PoolConfig::smbdirect(
        cfg.pool_mem,
        nworkers,
        cfg.smbd.max_receive_size as usize,
        cfg.smbd.max_send_size as usize,
        (cfg.smbd.max_read_write_size as usize).max(cfg.smbd.max_fragmented_recv_size as usize),
    )
    .backing(Backing::SharedMemfd)
    .build()
    .map_err(|e| ServerError::Pool(e.to_string()))?;
    // SAFETY: the pool's region stays mapped for as long as the pool (and
    // every clone of it, held by the workers and stats) lives, which outlives
    // the provider's use of the registration.
    let mr = unsafe { provider.register_pool(&pool) }.map_err(ServerError::Provider)?;
    let mut listener = provider.listen(cfg.listen).map_err(ServerError::Provider)?;
    let local_addr = listener.local_addr();
    let caps = cfg.qp_caps();
    let per_worker = admitted_per_worker(&mut cfg, nworkers, provider.max_cq_entries())?;
    let cq_entries = (caps.max_recv_wr + caps.max_send_wr) * per_worker as u32;

    let capture = match &cfg.capture {
        Some(p) => Some(Arc::new(
            CaptureHandle::create(p, CaptureConfig::default())
                .map_err(|e| ServerError::Config(format!("--capture {}: {e}", p.display())))?,
        )),
        None => None,
    };
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    let cp_bell = Doorbell::new().map_err(ServerError::Io)?;
    let mut sides: Vec<WorkerSide<P>> = Vec::with_capacity(nworkers);
    let mut upper_name = "";
    let mut wstats = Vec::with_capacity(nworkers);
    // Zero-copy regions of the upper layers, registered once each (the
    // workers' store handles share one store).
    let mut zero_copy_mrs: Vec<((usize, usize), Option<MemoryRegion>)> = Vec::new();
    for (i, core) in cfg.worker_cores.iter().enumerate() {
        let cq = provider
            .create_cq(cq_entries)
            .map_err(ServerError::Provider)?;
        let alloc = pool
            .claim_slice(i)
            .map_err(|e| ServerError::Pool(e.to_string()))?;
        let to = ring(per_worker * 2 + 16);
        let from = ring(per_worker * 4 + 16);
        let loans = ring(LOANED_RECEIVES);
        let st = Arc::new(WorkerStats::default());
        let bell = Doorbell::new().map_err(ServerError::Io)?;
        let handle = cq.handle();
        let worker = Worker::<P, U>::new(
            WorkerConfig {
                index: i,
                core: *core,
                smbd: cfg.smbd.clone(),
                idle_park: cfg.idle_park,
                idle: cfg.idle,
                max_connections: per_worker,
                shutdown_grace: cfg.shutdown_grace,
                send_depth: caps.max_send_wr,
                max_sge: caps.max_sge,
            },
            cq,
            alloc,
            mr,
            {
                let mut u = upper();
                if i == 0 {
                    upper_name = u.name();
                }
                register_zero_copy(&*provider, &mut u, &mut zero_copy_mrs);
                u
            },
            to.clone(),
            from.clone(),
            loans.clone(),
            st.clone(),
        )
        .with_capture(capture.clone())
        .with_doorbells(bell.clone(), cp_bell.clone())
        // One RDMA operation slot per outstanding request: a connection
        // that keeps its queue depth of READs or WRITEs in flight finds a
        // slot for each (the worker holds further requests back).
        .with_rdma_ops_per_connection(cfg.queue_depth.max(1) as usize);
        let ready = ready_tx.clone();
        let thread = std::thread::Builder::new()
            .name(format!("dp-worker-{i}"))
            .spawn(move || {
                worker.run_reporting(move || {
                    let _ = ready.send(());
                })
            })
            .map_err(ServerError::Io)?;
        sides.push(WorkerSide {
            to,
            backlog: VecDeque::new(),
            from,
            loans,
            bell,
            cq: handle,
            thread: Some(thread),
        });
        wstats.push(st);
    }
    let stats = Arc::new(ServerStats {
        workers: wstats,
        worker_cores: cfg.worker_cores.clone(),
        accepted: Default::default(),
        rejected: Default::default(),
        negotiate_failures: Default::default(),
        pool,
        provider: provider.name(),
        upper: upper_name,
        provider_counters: Default::default(),
        qos_flows: Default::default(),
        qos_opens: Default::default(),
        store: std::sync::Mutex::new(cfg.store_description.clone()),
    });
    // The workers lend the control plane their receive buffers before they
    // report ready: the control plane accepts nothing before that (a
    // connection arriving first would be refused for want of a buffer).
    for _ in 0..nworkers {
        if ready_rx.recv_timeout(Duration::from_secs(10)).is_err() {
            return Err(ServerError::Config("a worker did not start".into()));
        }
    }
    let admin = match &cfg.admin_socket {
        Some(p) => Some(AdminSocket::bind(p).map_err(ServerError::Io)?),
        None => None,
    };
    let admin_path = admin.as_ref().map(|a| a.path().to_path_buf());
    let shutdown = Arc::new(AtomicBool::new(false));
    let cp_bell_cp = cp_bell.clone();
    let cp = {
        let shutdown = shutdown.clone();
        let stats = stats.clone();
        let provider = provider.clone();
        std::thread::Builder::new()
            .name("cp".into())
            .spawn(move || {
                if let Some(c) = cfg.cp_core {
                    core_affinity::set_for_current(core_affinity::CoreId { id: c });
                }
                let _ = ready_tx.send(());
                control_loop(ControlPlane {
                    provider: &*provider,
                    listener: &mut listener,
                    sides,
                    cfg: &cfg,
                    per_worker,
                    stats: &stats,
                    admin,
                    shutdown: &shutdown,
                    bell: cp_bell_cp,
                    mr,
                });
                if let Some(c) = capture {
                    match c.finish() {
                        Ok(s) => println!("smbdirectd: capture: {s}"),
                        Err(e) => crate::error!("capture: writing failed: {e}"),
                    }
                }
            })
            .map_err(ServerError::Io)?
    };
    // Report the server up only once every thread is pinned and running.
    if ready_rx.recv_timeout(Duration::from_secs(10)).is_err() {
        return Err(ServerError::Config(
            "the control plane did not start".into(),
        ));
    }
    Ok(RunningServer {
        shutdown,
        cp_bell,
        cp: Some(cp),
        stats,
        local_addr,
        admin_path,
    })
}

struct ConnInfo {
    peer: SocketAddr,
    worker: usize,
    /// The control plane refused its negotiation (already logged).
    refused: bool,
}

/// What the `cp` thread owns.
struct ControlPlane<'a, P: Provider> {
    provider: &'a P,
    listener: &'a mut P::Listener,
    sides: Vec<WorkerSide<P>>,
    cfg: &'a ServerConfig,
    /// Connections each worker admits ([`admitted_per_worker`]).
    per_worker: usize,
    stats: &'a Arc<ServerStats>,
    admin: Option<AdminSocket>,
    shutdown: &'a AtomicBool,
    /// Rung by the workers after pushing to their rings, and on shutdown.
    bell: Arc<Doorbell>,
    /// The pool's registration (SGEs of the lent negotiate receives).
    mr: MemoryRegion,
}

/// The longest the event-driven control plane sleeps: its periodic work
/// (provider counters, pressure log, QoS reallocation) is due every 100 ms.
const CP_IDLE_MAX: Duration = Duration::from_millis(100);
/// How often the control plane retries pushing a backlog into a full worker
/// ring.
const CP_BACKLOG_RETRY: Duration = Duration::from_millis(1);

fn control_loop<P: Provider>(cp: ControlPlane<'_, P>) {
    let ControlPlane {
        provider,
        listener,
        mut sides,
        cfg,
        per_worker,
        stats,
        admin,
        shutdown,
        bell,
        mr,
    } = cp;
    let caps = cfg.qp_caps();
    let mut qos = QosEngine::new(sides.len(), cfg.policies.clone(), cfg.qos_max_flows)
        .with_flow_retention(cfg.qos_flow_retention);
    let mut conns: HashMap<u64, ConnInfo> = HashMap::new();
    // Connections each worker holds or will hold: from the Attach pushed
    // until the worker reports the close (a slot is in use all that time),
    // so a worker is never sent more than its slots. Exact, unlike the
    // worker's live count plus a guess at what is still in its ring.
    let mut held = vec![0usize; sides.len()];
    let mut next_id = 1u64;
    let mut last_line = clock::now();
    let mut prev = stats.totals();
    let mut last_counters = clock::now();
    let mut pressure = PressureLog::new();
    // Counters are readable from the first stats request on.
    if let Ok(mut pc) = stats.provider_counters.lock() {
        *pc = provider.counters();
    }
    // Where the listener has a descriptor (verbs), sleep in poll(2) on it,
    // the admin socket and the doorbell the workers ring, until the next
    // periodic work is due; else poll the listener every 2 ms (the soft
    // provider). Polling every 2 ms made ~10 system calls per iteration:
    // in the Soft-RoCE guest, where each is expensive, an idle control
    // plane used a quarter of a vCPU.
    let listen_fd = listener.poll_fd();
    let admin_fd = admin.as_ref().map_or(-1, |a| a.fd());
    while !shutdown.load(Ordering::Acquire) {
        let (accepted, admin_ready) = match listen_fd {
            Some(lfd) => {
                bell.arm();
                let timeout = if sides.iter().any(|s| !s.from.is_empty()) {
                    Duration::ZERO
                } else if sides.iter().any(|s| !s.backlog.is_empty()) {
                    CP_BACKLOG_RETRY
                } else {
                    let now = clock::now();
                    let mut t = CP_IDLE_MAX
                        .saturating_sub(now.saturating_duration_since(last_counters))
                        .min(qos.next_tick_in(now));
                    if let Some(iv) = cfg.stats_interval {
                        t = t.min(iv.saturating_sub(now.saturating_duration_since(last_line)));
                    }
                    t
                };
                // (a zero timeout looks without sleeping)
                let woke = wait_readable(&[lfd, bell.fd(), admin_fd], timeout);
                bell.disarm(woke & 2 != 0);
                let accepted = if woke & 1 != 0 {
                    listener.accept_request(Duration::ZERO)
                } else {
                    Ok(None)
                };
                (accepted, woke & 4 != 0)
            }
            None => (listener.accept_request(Duration::from_millis(2)), true),
        };
        match accepted {
            Ok(Some(req)) => {
                let peer = req.peer_addr();
                if conns.len() >= cfg.max_connections {
                    stats.rejected.fetch_add(1, Ordering::Relaxed);
                    pressure.event(
                        Pressure::MaxConnections,
                        format_args!(
                            "refused connection from {peer}: at --max-connections {}",
                            cfg.max_connections
                        ),
                    );
                    req.reject();
                } else if let Some(w) = pick_worker(&held, per_worker) {
                    // Post the negotiate receive before accepting, with a
                    // buffer the worker lent us (3.1.7.2).
                    let loan = sides[w].loans.pop().map(BufId::from_bits);
                    let Some(rbuf) = loan.and_then(|b| stats.pool.locate(b).map(|l| (b, l))) else {
                        stats.rejected.fetch_add(1, Ordering::Relaxed);
                        pressure.event(
                            Pressure::NoReceiveBuffer,
                            format_args!(
                                "refused connection from {peer}: worker {w} has no free receive buffer (buffer pool exhausted: see --pool-mem)"
                            ),
                        );
                        req.reject();
                        continue;
                    };
                    let recv = [RecvWr {
                        wr_id: recv_wr_id(rbuf.0),
                        sge: mr.sge(rbuf.1.offset as u64, rbuf.1.len as u32),
                    }];
                    match req.accept_with_receives(&sides[w].cq, caps, &[], &recv) {
                        Ok(qp) => {
                            let id = next_id;
                            next_id += 1;
                            let msg = ToWorker::Attach {
                                conn: id,
                                qp,
                                peer,
                                negotiate_receive_posted: true,
                            };
                            // A full ring is backpressure: wait for the worker.
                            push_waiting(&sides[w].to, &sides[w].bell, msg);
                            held[w] += 1;
                            conns.insert(
                                id,
                                ConnInfo {
                                    peer,
                                    worker: w,
                                    refused: false,
                                },
                            );
                            stats.accepted.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            // The loaned buffer goes home (remote free into the worker's slice).
                            let _ = stats.pool.free(rbuf.0);
                            crate::warn!("accepting {peer} failed: {e}");
                        }
                    }
                } else {
                    // Every worker holds its share of the slots: not while
                    // `held` sums to `conns.len()`, below --max-connections
                    // here, with ceil(max / workers) slots each; a clean
                    // refusal all the same.
                    stats.rejected.fetch_add(1, Ordering::Relaxed);
                    pressure.event(
                        Pressure::MaxConnections,
                        format_args!(
                            "refused connection from {peer}: every worker holds its {per_worker} connections"
                        ),
                    );
                    req.reject();
                }
            }
            Ok(None) => {}
            Err(e) => {
                crate::error!("listener: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        service_workers(
            &mut sides,
            cfg,
            stats,
            &mut conns,
            &mut held,
            &mut qos,
            &mut pressure,
        );
        for (w, m) in qos.tick(false) {
            sides[w].backlog.push_back(ToWorker::Upper(m));
        }
        flush_backlogs(&mut sides);
        stats
            .qos_flows
            .store(qos.flow_count() as u64, Ordering::Relaxed);
        stats
            .qos_opens
            .store(qos.open_count() as u64, Ordering::Relaxed);
        if clock::now().saturating_duration_since(last_counters) >= Duration::from_millis(100) {
            last_counters = clock::now();
            if let Ok(mut pc) = stats.provider_counters.lock() {
                *pc = provider.counters();
            }
            pressure.tick(stats);
        }
        if let Some(a) = admin.as_ref().filter(|_| admin_ready) {
            a.serve_pending(&mut |req| answer(req, stats, &mut qos));
        }
        if let Some(iv) = cfg.stats_interval {
            let el = clock::now().saturating_duration_since(last_line);
            if el >= iv {
                println!("smbdirectd: {}", stats.line(&prev, el.as_secs_f64()));
                prev = stats.totals();
                last_line = clock::now();
            }
        }
    }
    // Shutdown: stop accepting, let workers finish and return every buffer.
    drop(admin);
    for s in &sides {
        let mut msg = ToWorker::Shutdown;
        let deadline = Instant::now() + Duration::from_secs(5);
        while let Err(m) = s.to.push(msg) {
            msg = m;
            s.bell.ring();
            if Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        s.bell.ring();
    }
    for i in 0..sides.len() {
        while !stats.workers[i].exited.load(Ordering::Acquire) {
            service_workers(
                &mut sides,
                cfg,
                stats,
                &mut conns,
                &mut held,
                &mut qos,
                &mut pressure,
            );
            flush_backlogs(&mut sides);
            std::thread::sleep(Duration::from_millis(1));
        }
        if let Some(t) = sides[i].thread.take() {
            let _ = t.join();
        }
    }
    service_workers(
        &mut sides,
        cfg,
        stats,
        &mut conns,
        &mut held,
        &mut qos,
        &mut pressure,
    );
    if let Ok(mut pc) = stats.provider_counters.lock() {
        *pc = provider.counters();
    }
    pressure.flush(stats);
}

fn flush_backlogs<P: Provider>(sides: &mut [WorkerSide<P>]) {
    for s in sides.iter_mut() {
        let mut pushed = false;
        while let Some(m) = s.backlog.pop_front() {
            if let Err(m) = s.to.push(m) {
                s.backlog.push_front(m);
                break;
            }
            pushed = true;
        }
        if pushed {
            s.bell.ring();
        }
    }
}

fn answer(req: &str, stats: &ServerStats, qos: &mut QosEngine) -> String {
    if req.starts_with("qos") {
        let rows = if req.starts_with("qos flows") {
            qos.rows()
        } else {
            Vec::new()
        };
        if let Some(r) = crate::qos_admin::handle(req, &mut qos.policies, &rows) {
            return r;
        }
    }
    match req {
        "stats" | "stats json" | "stats --json" => stats.to_json(),
        other => format!(
            "{{\"error\":\"unknown request '{}'\"}}",
            other.replace(['"', '\\'], "")
        ),
    }
}

/// Connections each worker admits: `--max-connections` spread over the
/// workers, as many as one completion queue of `max_cqe` entries can serve
/// (each connection's queue pair needs `max_recv_wr + max_send_wr` of them).
/// Where the device's limit is lower (rdma_rxe allows 32,767 entries: 80
/// connections of the default queues a worker, against the default 256),
/// the admission limit is lowered to what the workers can take and said so
/// once, rather than the server refusing to start; a connection beyond it
/// is refused at admission like any over `--max-connections`.
fn admitted_per_worker(
    cfg: &mut ServerConfig,
    nworkers: usize,
    max_cqe: u32,
) -> Result<usize, ServerError> {
    let caps = cfg.qp_caps();
    let per_connection = caps.max_recv_wr + caps.max_send_wr;
    let wanted = cfg.max_connections.div_ceil(nworkers);
    let fit = (max_cqe / per_connection) as usize;
    if fit == 0 {
        return Err(ServerError::Config(format!(
            "a connection's queue pair needs {per_connection} completion queue entries \
             (--receive-credit-max {} + 2 receives, {} sends), the device allows {max_cqe}: \
             lower --receive-credit-max or --queue-depth",
            cfg.smbd.receive_credit_max, caps.max_send_wr
        )));
    }
    if wanted <= fit {
        return Ok(wanted);
    }
    let admitted = fit * nworkers;
    crate::warn!(
        "--max-connections {} lowered to {admitted}: the device's completion queues hold at most \
         {max_cqe} entries, {fit} connections a worker at {per_connection} entries each \
         ({nworkers} worker(s)); more worker cores, or a lower --receive-credit-max or \
         --queue-depth, admit more",
        cfg.max_connections
    );
    cfg.max_connections = admitted;
    Ok(fit)
}

/// The worker a new connection goes to: the one holding the fewest
/// connections (`held`: attached or on their way, until their close is
/// reported) among those with a free slot; `None` when every worker holds
/// `per_worker`.
fn pick_worker(held: &[usize], per_worker: usize) -> Option<usize> {
    (0..held.len())
        .filter(|&i| held[i] < per_worker)
        .min_by_key(|&i| held[i])
}

fn service_workers<P: Provider>(
    sides: &mut [WorkerSide<P>],
    cfg: &ServerConfig,
    stats: &ServerStats,
    conns: &mut HashMap<u64, ConnInfo>,
    held: &mut [usize],
    qos: &mut QosEngine,
    pressure: &mut PressureLog,
) {
    let mut extra: Vec<(usize, ToWorker<P::Qp>)> = Vec::new();
    for (wi, side) in sides.iter_mut().enumerate() {
        while let Some(m) = side.from.pop() {
            match m {
                FromWorker::Upper(UpperEvent::QosRequest {
                    conn,
                    token,
                    open,
                    is_file,
                    request,
                    max_output,
                }) => {
                    let (reply, others) =
                        qos.request(wi, conn, token, open, is_file, &request, max_output);
                    side.backlog.push_back(ToWorker::Upper(reply));
                    extra.extend(others.into_iter().map(|(w, m)| (w, ToWorker::Upper(m))));
                }
                FromWorker::Upper(UpperEvent::QosDefaultFlow { conn, open, policy }) => {
                    let peer = conns
                        .get(&conn)
                        .map(|c| c.peer.to_string())
                        .unwrap_or_default();
                    let (reply, others) = qos.default_flow(wi, conn, open, policy, &peer);
                    side.backlog.push_back(ToWorker::Upper(reply));
                    extra.extend(others.into_iter().map(|(w, m)| (w, ToWorker::Upper(m))));
                }
                FromWorker::Upper(UpperEvent::OpenClosed { conn, open }) => {
                    qos.open_closed(conn, open);
                }
                FromWorker::Upper(UpperEvent::QosWindow {
                    flow,
                    report,
                    saturated,
                }) => qos.window(wi, flow, report, saturated),
                FromWorker::NegotiateRequest { conn, bytes, len } => {
                    let decision =
                        evaluate_negotiate_request(&cfg.smbd, &bytes[..len.min(bytes.len())]);
                    match decision {
                        NegotiateDecision::Fail(status) => {
                            stats.negotiate_failures.fetch_add(1, Ordering::Relaxed);
                            if let Some(c) = conns.get_mut(&conn) {
                                c.refused = true;
                                pressure.event(
                                    Pressure::NegotiateRefused,
                                    format_args!(
                                        "conn {conn} from {}: negotiation refused with {status}",
                                        c.peer
                                    ),
                                );
                            }
                        }
                        // A terminate is logged once, when the worker reports the close.
                        NegotiateDecision::Terminate(_) | NegotiateDecision::Accept(_) => {}
                    }
                    push_waiting(
                        &side.to,
                        &side.bell,
                        ToWorker::Negotiated { conn, decision },
                    );
                }
                FromWorker::Closed {
                    conn,
                    reason,
                    peer_violation,
                } => {
                    qos.conn_closed(conn);
                    if let Some(c) = conns.remove(&conn) {
                        if peer_violation {
                            crate::warn!(
                                "conn {conn} from {}: protocol violation, terminated: {reason}",
                                c.peer
                            );
                        } else if let CloseReason::Protocol(TerminateReason::NegotiateFailed {
                            status,
                        }) = reason
                        {
                            // Refused by the worker: no receive could be
                            // posted for the connection's credits ([MS-SMBD]
                            // 3.1.5.6, STATUS_INSUFFICIENT_RESOURCES).
                            if !c.refused {
                                stats.negotiate_failures.fetch_add(1, Ordering::Relaxed);
                                pressure.event(
                                    Pressure::NoReceiveBuffer,
                                    format_args!(
                                        "conn {conn} from {}: negotiation refused with {status}: no receive buffer could be posted (buffer pool exhausted: see --pool-mem)",
                                        c.peer
                                    ),
                                );
                            }
                        } else if reason == CloseReason::PoolExhausted {
                            pressure.event(
                                Pressure::PoolClosed,
                                format_args!("conn {conn} from {}: closed: {reason}", c.peer),
                            );
                        } else if !matches!(reason, CloseReason::Shutdown) {
                            crate::info!("conn {conn} from {}: closed: {reason}", c.peer);
                        }
                        // Its worker's slot is free again.
                        held[c.worker] = held[c.worker].saturating_sub(1);
                    }
                }
            }
        }
    }
    for (w, m) in extra {
        if let Some(s) = sides.get_mut(w) {
            s.backlog.push_back(m);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{admitted_per_worker, pick_worker, ServerConfig, ServerError};

    #[test]
    fn admission_is_lowered_to_what_the_device_completion_queues_hold() {
        let mut cfg = ServerConfig {
            max_connections: 256,
            ..ServerConfig::default()
        };
        // The default credits and queue depth: 257 receives + 148 sends.
        let caps = cfg.qp_caps();
        assert_eq!(caps.max_recv_wr + caps.max_send_wr, 405);
        // No device limit (the soft provider), or a large one: as asked.
        assert_eq!(admitted_per_worker(&mut cfg, 1, u32::MAX).unwrap(), 256);
        assert_eq!(admitted_per_worker(&mut cfg, 2, 4_194_303).unwrap(), 128);
        assert_eq!(cfg.max_connections, 256);
        // rdma_rxe's 32,767 entries: 80 connections a worker.
        assert_eq!(admitted_per_worker(&mut cfg, 2, 32_767).unwrap(), 80);
        assert_eq!(cfg.max_connections, 160);
        let mut one = ServerConfig {
            max_connections: 256,
            ..ServerConfig::default()
        };
        assert_eq!(admitted_per_worker(&mut one, 1, 32_767).unwrap(), 80);
        assert_eq!(one.max_connections, 80);
        // Exactly enough: nothing lowered.
        let mut exact = ServerConfig {
            max_connections: 80,
            ..ServerConfig::default()
        };
        assert_eq!(admitted_per_worker(&mut exact, 1, 80 * 405).unwrap(), 80);
        assert_eq!(exact.max_connections, 80);
        // Not even one connection's queues fit: a configuration error that
        // names the flags to lower.
        match admitted_per_worker(&mut exact, 1, 404) {
            Err(ServerError::Config(m)) => {
                assert!(
                    m.contains("405") && m.contains("--receive-credit-max"),
                    "{m}"
                )
            }
            other => panic!("expected a configuration error, got {other:?}"),
        }
    }

    #[test]
    fn a_new_connection_goes_to_the_least_loaded_worker_with_a_free_slot() {
        assert_eq!(pick_worker(&[0, 0], 2), Some(0));
        assert_eq!(pick_worker(&[1, 0], 2), Some(1));
        assert_eq!(pick_worker(&[2, 1, 2], 2), Some(1));
        // Never past a worker's slots, however the others are loaded.
        assert_eq!(pick_worker(&[2, 2], 2), None);
        assert_eq!(pick_worker(&[3, 2], 3), Some(1));
        assert_eq!(pick_worker(&[], 2), None);
    }
}
