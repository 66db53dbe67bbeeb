//! `smbdirectd`: wires the command line to the crates.

mod qos_cli;
mod torture;
mod user_cli;

use clap::{Parser, Subcommand, ValueEnum};
use smbdirect_controlplane::qos_policy::PolicyStore;
use smbdirect_controlplane::users::UserStore;
use smbdirect_controlplane::{admin, cores, signals, start, IdleMode, ServerConfig};
use smbdirect_dataplane::provider::soft::SoftProvider;
use smbdirect_dataplane::provider::verbs::{self, VerbsConfig, VerbsProvider};
use smbdirect_dataplane::provider::Provider;
use smbdirect_dataplane::smb2::store::{DirStoreFactory, MemStoreFactory, RwPath, StoreFactory};
use smbdirect_dataplane::smb2::{Smb2Config, Smb2Server};
use smbdirect_dataplane::upper::Echo;
use smbdirect_hugepages::{parse_size, HugepageInfo};
use smbdirect_protocol::smbd::SmbdConfig;
use smbdirect_protocol::time::Duration as PDuration;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// Kernel-bypass SMB Direct ([MS-SMBD]) and Storage QoS ([MS-SQOS]) data-plane service.
#[derive(Debug, Parser)]
#[command(name = "smbdirectd", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ProviderKind {
    /// verbs when an RDMA device is present, else soft.
    Auto,
    /// Real RDMA through rdma-core (libibverbs, librdmacm).
    Verbs,
    /// The embedded software provider (shared memory, this host only).
    Soft,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum IdleArg {
    /// Sleep on the completion queue (verbs), else nap.
    Sleep,
    /// Nap 50 us at a time.
    Nap,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum StoreIo {
    /// Synchronous on memory file systems, io_uring elsewhere.
    Auto,
    /// io_uring for every READ and WRITE.
    Uring,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum UpperKind {
    /// Return every message to its sender (transport benchmark server).
    Echo,
    /// SMB2 over SMB Direct: the `data` share from a memory store.
    Smb2,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon: listen for SMB Direct connections and serve them from
    /// pinned poll-mode workers.
    Serve(ServeArgs),
    /// Ask a running daemon for its counters (over its admin socket).
    Stats {
        /// Print the JSON document (field names: README.md, "stats --json").
        #[arg(long)]
        json: bool,
        /// Admin socket of the daemon [default: derived from --port].
        #[arg(long)]
        admin_socket: Option<PathBuf>,
        /// Listen port of the daemon, to derive the admin socket path.
        #[arg(long, default_value_t = 445)]
        port: u16,
    },
    /// Storage QoS ([MS-SQOS]) of a running daemon, over its admin socket:
    /// add, remove and list policies; show flows (docs/qos.md).
    Qos {
        #[command(subcommand)]
        cmd: qos_cli::QosCommand,
    },
    /// Local users for SESSION_SETUP (NTLMv2): add, remove, list the
    /// accounts of a user store file; passwords are read from standard input.
    User {
        #[command(subcommand)]
        cmd: user_cli::UserCommand,
    },
    /// List usable providers, RDMA devices and ports, hugepages, and what
    /// `--provider auto` would choose.
    Devices,
    /// Load generator and latency meter: drive a running `serve`
    /// (`--connect`) or one started in this process (`--loopback`) with a
    /// workload; print ops/s, MB/s and latency percentiles, optionally as
    /// JSON, HdrHistogram text and an SVG plot (README.md, "Benchmarks").
    Bench(smbdirect_benches::bench::BenchArgs),
    /// Hostile and faulty peers against a running `serve` (`--connect
    /// ADDR:PORT`), in the spirit of Samba's smbtorture: each case breaks
    /// one rule of [MS-SMBD], [MS-SMB2] or [MS-SQOS] and checks the
    /// server's reaction against the outcome the specification prescribes,
    /// then that a fresh connection is still served. `--list` shows the
    /// cases, `--case NAME` (repeatable) picks some, `--json FILE` writes
    /// the results, `--keepalive-interval SECS` tells the keepalive cases
    /// the server's interval (skipped without it), `--timeout SECS` bounds
    /// every wait. Exit status 0 when every case passed, 1 when one failed,
    /// 2 for bad usage (docs/reliability.md).
    Torture(torture::TortureArgs),
    /// The main job on a machine without RDMA hardware: `serve` (control
    /// plane + a pinned worker, echo upper layer) on the soft RDMA provider
    /// and an SMB Direct client on another core, exchanging echo round trips;
    /// prints latency percentiles. `--protocol-only` runs just the two
    /// protocol state machines in one thread (no provider).
    Loopback {
        /// Run only the protocol core (no provider, no worker).
        #[arg(long)]
        protocol_only: bool,
        /// Check every echoed byte.
        #[arg(long)]
        verify: bool,
        /// Upper-layer message size in bytes (fragmented above MaxSendSize - 24).
        #[arg(long, default_value_t = 512)]
        size: usize,
        /// Seconds to measure.
        #[arg(long, default_value_t = 3.0)]
        duration: f64,
        /// Seconds to run before measuring.
        #[arg(long, default_value_t = 0.5)]
        warmup: f64,
    },
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// Address and port to listen on (445 is the SMB Direct port on
    /// InfiniBand and RoCE; iWARP uses 5445).
    #[arg(long, default_value = "0.0.0.0:445")]
    listen: SocketAddr,
    /// RDMA provider.
    #[arg(long, value_enum, default_value_t = ProviderKind::Auto)]
    provider: ProviderKind,
    /// Worker cores: a list like 2,3,6-9 or an SPDK-style mask like 0xC.
    /// One pinned worker per core [default: all cores but the first].
    #[arg(long)]
    cores: Option<String>,
    /// Outstanding upper-layer requests per connection; sizes queue pairs
    /// and each connection's table of RDMA operations in flight (a request
    /// beyond it waits for a transfer to finish).
    #[arg(long, default_value_t = 32)]
    queue_depth: u32,
    /// Connections admitted at once; more are refused.
    #[arg(long, default_value_t = 256)]
    max_connections: usize,
    /// Buffer pool memory (e.g. 512M, 2G); hugepage-backed when reserved
    /// (scripts/setup-hugepages.sh).
    #[arg(long, default_value = "512M")]
    pool_mem: String,
    /// [MS-SMBD] Connection.ReceiveCreditMax.
    #[arg(long, default_value_t = 255)]
    receive_credit_max: u16,
    /// [MS-SMBD] Connection.SendCreditTarget.
    #[arg(long, default_value_t = 255)]
    send_credit_target: u16,
    /// [MS-SMBD] Connection.MaxSendSize.
    #[arg(long, default_value_t = 1364)]
    max_send_size: u32,
    /// [MS-SMBD] Connection.MaxReceiveSize.
    #[arg(long, default_value_t = 8192)]
    max_receive_size: u32,
    /// [MS-SMBD] Connection.MaxFragmentedRecvSize.
    #[arg(long, default_value_t = 1_048_576)]
    max_fragmented_size: u32,
    /// [MS-SMBD] Connection.MaxReadWriteSize.
    #[arg(long, default_value_t = 8_388_608)]
    max_read_write_size: u32,
    /// [MS-SMBD] Connection.KeepaliveInterval, seconds.
    #[arg(long, default_value_t = 120)]
    keepalive_interval: u64,
    /// Workers busy-poll, and nap only after this many microseconds without
    /// work (a dedicated storage node keeps the default; shared test hosts
    /// set it small).
    #[arg(long, default_value_t = 10_000)]
    idle_park_us: u64,
    /// What an idle worker does after --idle-park-us: `sleep` until the
    /// next completion (1 ms at most; verbs, through a completion channel;
    /// the soft provider naps) or `nap` 50 us at a time.
    #[arg(long, value_enum, default_value_t = IdleArg::Sleep)]
    idle: IdleArg,
    /// Upper layer handed each reassembled message: `smb2` (SMB2 over SMB
    /// Direct with Storage QoS; sessions are anonymous/guest only — no
    /// authentication yet) or `echo` (transport benchmark server, also RDMA
    /// echo).
    #[arg(long, value_enum, default_value_t = UpperKind::Smb2)]
    upper: UpperKind,
    /// The share's store: `mem` (memory, bounded by --store-size, shared by
    /// all workers) or a directory (files under it, read and written through
    /// io_uring; paths confined to it).
    #[arg(long, default_value = "mem")]
    store: String,
    /// Bound of the memory store (e.g. 1G, 512M).
    #[arg(long, default_value = "1G")]
    store_size: String,
    /// Directory store: use O_DIRECT for aligned I/O.
    #[arg(long)]
    store_direct: bool,
    /// Directory store: how READ and WRITE reach the files. `auto` reads
    /// and writes synchronously on the worker when the directory is on a
    /// memory file system (tmpfs, ramfs: a copy to or from the page cache,
    /// as ksmbd does), else through io_uring; `uring` always uses io_uring
    /// (e.g. for a tmpfs that may swap).
    #[arg(long, value_enum, default_value_t = StoreIo::Auto)]
    store_io: StoreIo,
    /// Directory store: cores (a list like 0,4-5 or a mask like 0x11) for
    /// its io_uring worker threads, which then also make the copies of
    /// READs and WRITEs of 256 KiB or more on a memory file system while
    /// another transfer is in flight on the worker (off the polling core).
    /// Cores the workers do not poll on; default: none (the kernel places
    /// io_uring workers, every such copy stays on the worker).
    #[arg(long, value_name = "CORES")]
    store_copy_cores: Option<String>,
    /// The share's name (clients connect to \\SERVER\NAME), optionally with
    /// a default Storage QoS policy: `NAME:policy=GUID` makes every file
    /// Open on the share a flow under that policy (for clients that send no
    /// FSCTL_STORAGE_QOS_CONTROL, such as Linux cifs).
    #[arg(long, default_value = "data")]
    share: String,
    /// Storage QoS policies (TOML, see docs/qos.md); `smbdirectd qos policy
    /// add|remove` changes are written back to it.
    #[arg(long, value_name = "FILE")]
    policy_file: Option<PathBuf>,
    /// Storage QoS: capacity of the logical-flow table (flows no Open
    /// references are evicted first; when every flow is referenced a new one
    /// is refused with STATUS_INSUFFICIENT_RESOURCES).
    #[arg(long, default_value_t = 65_536)]
    qos_max_flows: usize,
    /// Storage QoS: seconds a logical flow that no Open references is kept
    /// (statistics and policy survive a client reopening its file) before it
    /// is removed from the flow table.
    #[arg(long, default_value_t = 60, value_name = "SECS")]
    qos_flow_retention: u64,
    /// Local users (`smbdirectd user add ... --users FILE`): SESSION_SETUP
    /// then authenticates with NTLMSSP (NTLMv2), raw or in SPNEGO. Without
    /// it every session is anonymous/guest. The file is re-read when it
    /// changes.
    #[arg(long, value_name = "FILE")]
    users: Option<PathBuf>,
    /// With --users: also accept anonymous (null) sessions.
    #[arg(long)]
    guest_ok: bool,
    /// Require signed requests and sign every response of authenticated
    /// sessions (SMB2_NEGOTIATE_SIGNING_REQUIRED).
    #[arg(long)]
    require_signing: bool,
    /// Admin socket path [default: /run/smbdirectd/smbdirectd-PORT.sock].
    #[arg(long)]
    admin_socket: Option<PathBuf>,
    /// Print one stats line every SECS seconds (0: never).
    #[arg(long, default_value_t = 0)]
    stats_interval: u64,
    /// Seconds in-flight work may take after SIGINT/SIGTERM.
    #[arg(long, default_value_t = 5)]
    shutdown_grace: u64,
    /// Write every SMB Direct message sent and received to FILE.pcap, framed
    /// as RoCEv2 so that tshark/Wireshark decode it as SMB Direct
    /// (`tshark -r FILE.pcap -2 -Y smb_direct`).
    #[arg(long, value_name = "FILE.pcap")]
    capture: Option<PathBuf>,
    /// Log verbosity: error, warn, info.
    #[arg(long, default_value = "info")]
    log_level: String,
}

/// The `--users` file as SESSION_SETUP sees it: re-read (at most once a
/// second) when its modification time changes, so `smbdirectd user add`
/// takes effect without a restart.
#[derive(Debug)]
struct UsersFile {
    path: PathBuf,
    state: std::sync::Mutex<(Option<std::time::SystemTime>, std::time::Instant, UserStore)>,
}

impl UsersFile {
    fn open(path: &std::path::Path) -> Result<Self, String> {
        let store = UserStore::load(path).map_err(|e| e.to_string())?;
        for w in store.warnings() {
            eprintln!("smbdirectd: warn: {w}");
        }
        let mtime = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        Ok(UsersFile {
            path: path.to_path_buf(),
            state: std::sync::Mutex::new((mtime, std::time::Instant::now(), store)),
        })
    }
}

impl smbdirect_dataplane::smb2::UserLookup for UsersFile {
    fn nt_hash(&self, user: &str) -> Option<[u8; 16]> {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if g.1.elapsed() >= Duration::from_secs(1) {
            g.1 = std::time::Instant::now();
            let mtime = std::fs::metadata(&self.path)
                .and_then(|m| m.modified())
                .ok();
            if mtime != g.0 {
                match UserStore::load(&self.path) {
                    Ok(s) => {
                        g.0 = mtime;
                        g.2 = s;
                    }
                    Err(e) => eprintln!(
                        "smbdirectd: warn: --users {}: keeping the previous users: {e}",
                        self.path.display()
                    ),
                }
            }
        }
        g.2.nt_hash(user)
    }
}

/// `NAME` or `NAME:policy=GUID`.
fn parse_share(arg: &str) -> Result<(String, Option<smbdirect_protocol::sqos::Guid>), String> {
    let (name, opts) = arg.split_once(':').unwrap_or((arg, ""));
    if name.is_empty() || name.contains(['\\', '/']) || name.len() > 80 {
        return Err(format!("'{name}' is not a plain share name"));
    }
    let mut policy = None;
    for o in opts.split(',').filter(|o| !o.is_empty()) {
        match o.split_once('=') {
            Some(("policy", g)) => {
                policy = Some(
                    g.parse()
                        .map_err(|_| format!("policy '{g}' is not a GUID"))?,
                )
            }
            _ => return Err(format!("unknown share option '{o}' (expected policy=GUID)")),
        }
    }
    Ok((name.to_string(), policy))
}

fn usage_error(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("smbdirectd: {msg}");
    ExitCode::from(2)
}

/// Most open files asked for: the kernel's default `fs.nr_open`, above
/// which setrlimit(2) fails.
const NOFILE_CEILING: libc::rlim_t = 1 << 20;

/// Raises this process's soft limit on open files to its hard limit (at
/// most [`NOFILE_CEILING`]). The soft limit is commonly 1,024, kept low
/// for programs that use select(2), which nothing here does; the hard
/// limit is what the operator allows. A connection holds a few
/// descriptors (on the soft provider: its rendezvous socket and the
/// watchdog's, the peer's pidfd, a bench client's pool memfd; a handshake
/// passes every shared pool's memfd for a moment), so a `serve` or a
/// `bench --connections 256` outgrows 1,024 long before its hard limit.
/// A limit that cannot be raised is left as it is, with a warning.
fn raise_open_file_limit() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit, ours.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return;
    }
    let want = r.rlim_max.min(NOFILE_CEILING);
    if r.rlim_cur >= want {
        return;
    }
    let raised = libc::rlimit {
        rlim_cur: want,
        rlim_max: r.rlim_max,
    };
    // SAFETY: setrlimit reads one rlimit, ours.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        eprintln!(
            "smbdirectd: warning: open files stay limited to {} (raising the soft limit to {want}: {})",
            r.rlim_cur,
            std::io::Error::last_os_error()
        );
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    raise_open_file_limit();
    match cli.command {
        Command::Serve(a) => serve(a),
        Command::Stats {
            json,
            admin_socket,
            port,
        } => stats(json, admin_socket, port),
        Command::Qos { cmd } => qos_cli::run(cmd),
        Command::User { cmd } => user_cli::run(cmd),
        Command::Devices => devices(),
        Command::Bench(a) => smbdirect_benches::bench::main(&a),
        Command::Torture(a) => torture::run(a),
        Command::Loopback {
            size,
            duration,
            warmup,
            protocol_only,
            verify,
        } => loopback(size, duration, warmup, protocol_only, verify),
    }
}

fn serve(a: ServeArgs) -> ExitCode {
    let available = cores::available_cores();
    let worker_cores = match &a.cores {
        Some(s) => match cores::parse_cores(s) {
            Ok(c) => c,
            Err(e) => return usage_error(format!("--cores: {e}")),
        },
        None => cores::default_worker_cores(&available),
    };
    if let Err(e) = cores::check_available(&worker_cores, &available) {
        return usage_error(format!("--cores: {e}"));
    }
    let cp_core = available
        .iter()
        .copied()
        .find(|c| !worker_cores.contains(c));
    let copy_cores = match &a.store_copy_cores {
        None => Vec::new(),
        Some(s) => {
            let c = match cores::parse_cores(s) {
                Ok(c) => c,
                Err(e) => return usage_error(format!("--store-copy-cores: {e}")),
            };
            if let Err(e) = cores::check_available(&c, &available) {
                return usage_error(format!("--store-copy-cores: {e}"));
            }
            if let Some(w) = c.iter().find(|c| worker_cores.contains(c)) {
                return usage_error(format!(
                    "--store-copy-cores: core {w} is a worker core (--cores {}): a copy there \
                     would stall that worker's polling; give cores the workers do not use",
                    cores::format_cores(&worker_cores)
                ));
            }
            if a.upper != UpperKind::Smb2 || a.store == "mem" {
                return usage_error(
                    "--store-copy-cores applies to a directory store (--store DIR)",
                );
            }
            c
        }
    };
    let pool_mem = match parse_size(&a.pool_mem) {
        Ok(v) => v,
        Err(e) => return usage_error(format!("--pool-mem: {e}")),
    };
    if a.queue_depth == 0 {
        return usage_error("--queue-depth must be at least 1");
    }
    if a.max_connections == 0 {
        return usage_error("--max-connections must be at least 1");
    }
    let smbd = SmbdConfig {
        receive_credit_max: a.receive_credit_max,
        send_credit_target: a.send_credit_target,
        max_send_size: a.max_send_size,
        max_receive_size: a.max_receive_size,
        max_fragmented_recv_size: a.max_fragmented_size,
        max_read_write_size: a.max_read_write_size,
        keepalive_interval: PDuration::from_secs(a.keepalive_interval),
        ..SmbdConfig::default()
    };
    if let Err(e) = smbd.validate() {
        return usage_error(e);
    }
    let policies = match &a.policy_file {
        Some(p) if p.exists() => match PolicyStore::load(p) {
            Ok(s) => {
                for w in s.warnings() {
                    eprintln!("smbdirectd: warn: --policy-file {}: {w}", p.display());
                }
                s
            }
            Err(e) => return usage_error(format!("--policy-file: {e}")),
        },
        Some(p) => {
            let mut s = PolicyStore::new();
            s.set_backing_file(Some(p.clone()));
            s
        }
        None => PolicyStore::new(),
    };
    let (share_name, default_policy) = match parse_share(&a.share) {
        Ok(v) => v,
        Err(e) => return usage_error(format!("--share: {e}")),
    };
    let users: Option<Arc<dyn smbdirect_dataplane::smb2::UserLookup>> = match &a.users {
        Some(p) => match UsersFile::open(p) {
            Ok(u) => Some(Arc::new(u)),
            Err(e) => return usage_error(format!("--users: {e}")),
        },
        None => None,
    };
    let guest_ok = users.is_none() || a.guest_ok;
    let smb2 = Smb2Config {
        users,
        guest_ok,
        require_signing: a.require_signing,
        share: share_name,
        default_policy,
        // FSCTL_QUERY_NETWORK_INTERFACE_INFO reports the listen address
        // when it names one (a wildcard has nothing to report).
        interfaces: if a.listen.ip().is_unspecified() {
            Vec::new()
        } else {
            vec![a.listen.ip()]
        },
        ..Smb2Config::default()
    };
    let mut cfg = ServerConfig {
        listen: a.listen,
        worker_cores: worker_cores.iter().map(|&c| Some(c)).collect(),
        cp_core,
        smbd,
        queue_depth: a.queue_depth,
        max_connections: a.max_connections,
        pool_mem,
        idle_park: Duration::from_micros(a.idle_park_us),
        idle: match a.idle {
            IdleArg::Sleep => IdleMode::Sleep,
            IdleArg::Nap => IdleMode::Nap,
        },
        admin_socket: Some(
            a.admin_socket
                .clone()
                .unwrap_or_else(|| admin::default_path(a.listen.port())),
        ),
        stats_interval: (a.stats_interval > 0).then(|| Duration::from_secs(a.stats_interval)),
        shutdown_grace: Duration::from_secs(a.shutdown_grace),
        capture: a.capture.clone(),
        policies,
        store_description: String::new(),
        qos_max_flows: Some(a.qos_max_flows),
        qos_flow_retention: Some(Duration::from_secs(a.qos_flow_retention)),
    };
    if !matches!(a.log_level.as_str(), "error" | "warn" | "info") {
        return usage_error(format!(
            "--log-level must be error, warn or info, not '{}'",
            a.log_level
        ));
    }
    let store: Option<Arc<dyn StoreFactory>> = if a.upper != UpperKind::Smb2 {
        None // the echo upper layer has no share
    } else if a.store == "mem" {
        let size = match parse_size(&a.store_size) {
            Ok(v) => v as u64,
            Err(e) => return usage_error(format!("--store-size: {e}")),
        };
        match MemStoreFactory::new(size) {
            Ok(f) => Some(Arc::new(f)),
            Err(e) => return usage_error(format!("--store mem: {e}")),
        }
    } else {
        match DirStoreFactory::new(std::path::Path::new(&a.store), a.store_direct) {
            Ok(f) => {
                let f = f
                    .with_rw_path(match a.store_io {
                        StoreIo::Auto => RwPath::Auto,
                        StoreIo::Uring => RwPath::Uring,
                    })
                    .with_copy_cores(&copy_cores);
                eprintln!("smbdirectd: store {}: {}", a.store, f.rw_description());
                Some(Arc::new(f))
            }
            Err(e) => return usage_error(format!("--store {}: {e}", a.store)),
        }
    };
    cfg.store_description = store.as_ref().map_or("none".into(), |s| s.describe());
    let upper = UpperSetup {
        kind: a.upper,
        store,
        smb2,
    };
    let kind = match a.provider {
        ProviderKind::Auto => {
            if verbs::devices().map(|d| !d.is_empty()).unwrap_or(false) {
                ProviderKind::Verbs
            } else {
                ProviderKind::Soft
            }
        }
        k => k,
    };
    match kind {
        ProviderKind::Verbs => match VerbsProvider::open(VerbsConfig::default()) {
            Ok(p) => run_server(Arc::new(p), cfg, upper),
            Err(e) => {
                eprintln!("smbdirectd: cannot open an RDMA device: {e} (use --provider soft on hosts without one)");
                ExitCode::FAILURE
            }
        },
        _ => match SoftProvider::new() {
            Ok(p) => run_server(Arc::new(p), cfg, upper),
            Err(e) => {
                eprintln!("smbdirectd: cannot start the soft provider: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

/// Which upper layer `serve` runs, with what it needs.
struct UpperSetup {
    kind: UpperKind,
    store: Option<Arc<dyn StoreFactory>>,
    smb2: Smb2Config,
}

fn run_server<P: Provider>(provider: Arc<P>, cfg: ServerConfig, setup: UpperSetup) -> ExitCode {
    let upper = setup.kind;
    if let Err(e) = signals::install() {
        eprintln!("smbdirectd: cannot install signal handlers: {e}");
        return ExitCode::FAILURE;
    }
    let name = provider.name();
    let cores_desc: Vec<String> = cfg
        .worker_cores
        .iter()
        .map(|c| c.map_or("-".to_string(), |c| c.to_string()))
        .collect();
    // Chosen (and the TSC calibrated) before the workers read it.
    let clock = smbdirect_dataplane::clock::describe();
    let server = match upper {
        UpperKind::Echo => start(provider, cfg, || Echo),
        UpperKind::Smb2 => {
            let next = std::sync::atomic::AtomicUsize::new(0);
            let Some(store) = setup.store.clone() else {
                eprintln!("smbdirectd: no store for the smb2 upper layer");
                return ExitCode::FAILURE;
            };
            let smb2 = setup.smb2.clone();
            start(provider, cfg, move || {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Smb2Server::new(smb2.clone(), store.handle(i))
            })
        }
    };
    let server = match server {
        Ok(s) => s,
        Err(e) => {
            eprintln!("smbdirectd: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "smbdirectd: serving on {} (provider {name}, upper {:?}, workers on cores {}, admin socket {})",
        server.local_addr(),
        upper,
        cores_desc.join(","),
        server.admin_path().map_or("none".into(), |p| p.display().to_string())
    );
    println!("smbdirectd: {clock}");
    if let Some(store) = &setup.store {
        println!(
            "smbdirectd: share '{}' on store {}",
            setup.smb2.share,
            store.describe()
        );
    }
    // (a signal also cuts the sleep short when it lands on this thread)
    while !signals::stop_requested() {
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("smbdirectd: shutting down");
    let stats = server.shutdown();
    let t = stats.totals();
    println!(
        "smbdirectd: final: {} connections served, {} messages in, {} out, {} protocol errors, {} RDMA errors",
        t.connections_total, t.messages_in, t.messages_out, t.protocol_errors, t.rdma_errors
    );
    for c in stats.pool_classes() {
        println!(
            "smbdirectd: final: pool {}: {}/{} buffers free",
            c.name, c.free, c.total
        );
    }
    println!("smbdirectd: final stats: {}", stats.to_json());
    ExitCode::SUCCESS
}

fn stats(json: bool, admin_socket: Option<PathBuf>, port: u16) -> ExitCode {
    let path = admin_socket.unwrap_or_else(|| admin::default_path(port));
    match admin::request(&path, "stats") {
        Ok(doc) => {
            if json {
                println!("{doc}");
            } else {
                println!("{}", human_stats(&doc));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("smbdirectd: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A readable rendering of the stats JSON without a JSON library: one
/// `key: value` per line for the totals, then the rest verbatim.
fn human_stats(doc: &str) -> String {
    let mut out = String::new();
    if let Some(i) = doc.find("\"total\":{") {
        let rest = &doc[i + 9..];
        if let Some(end) = rest.find('}') {
            out.push_str("totals:\n");
            for kv in rest[..end].split(',') {
                out.push_str("  ");
                out.push_str(&kv.replace('"', "").replace(':', ": "));
                out.push('\n');
            }
        }
    }
    out.push_str("full document (stats --json):\n");
    out.push_str(doc);
    out
}

fn devices() -> ExitCode {
    println!("providers:");
    println!("  soft: usable (embedded software provider, this host only)");
    let devs = verbs::devices();
    match &devs {
        Ok(d) if d.is_empty() => println!("  verbs: no RDMA device found (rdma-core sees none)"),
        Ok(d) => println!("  verbs: usable, {} device(s)", d.len()),
        Err(e) => println!("  verbs: unavailable: {e}"),
    }
    if let Ok(d) = &devs {
        for dev in d {
            println!(
                "device {}: node GUID {}, {:?}, max_qp {}, max_mr {}, memory windows {:?}, grants by {:?}",
                dev.name,
                dev.node_guid_string(),
                dev.transport,
                dev.max_qp,
                dev.max_mr,
                dev.memory_windows,
                dev.grants
            );
            for p in &dev.ports {
                println!(
                    "  port {}: {:?}, link {:?}, active MTU {}",
                    p.port, p.state, p.link_layer, p.active_mtu
                );
            }
        }
    }
    match HugepageInfo::read() {
        Ok(h) => println!(
            "hugepages: {} reserved, {} free, page size {} bytes{}",
            h.total,
            h.free,
            h.page_size,
            if h.total == 0 {
                " (pools will use ordinary pages; reserve with scripts/setup-hugepages.sh)"
            } else {
                ""
            }
        ),
        Err(e) => println!("hugepages: cannot read /proc/meminfo: {e}"),
    }
    let auto = match &devs {
        Ok(d) if !d.is_empty() => "verbs (an RDMA device is present)",
        _ => "soft (no RDMA device)",
    };
    println!("--provider auto would choose: {auto}");
    ExitCode::SUCCESS
}

fn loopback(
    size: usize,
    duration: f64,
    warmup: f64,
    protocol_only: bool,
    verify: bool,
) -> ExitCode {
    if size == 0 || size > SmbdConfig::default().max_fragmented_recv_size as usize {
        return usage_error("--size must be between 1 and 1048576 bytes");
    }
    if !(duration > 0.0 && warmup >= 0.0) {
        return usage_error("--duration must be positive and --warmup non-negative");
    }
    if protocol_only {
        return match smbdirect_benches::protocol_loopback::run(
            SmbdConfig::default(),
            size,
            Duration::from_secs_f64(warmup),
            Duration::from_secs_f64(duration),
        ) {
            Ok(r) => {
                println!("{}", r.table(size));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("smbdirectd: loopback failed: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let available = cores::available_cores();
    // Client on the first core, the server's worker on the second (both
    // pinned) when there are two; unpinned otherwise.
    let (client_core, server_core) = match available.as_slice() {
        [a, b, ..] => (Some(*a), Some(*b)),
        _ => (None, None),
    };
    let opts = smbdirect_benches::service_loopback::LoopbackOptions {
        size,
        duration: Duration::from_secs_f64(duration),
        warmup: Duration::from_secs_f64(warmup),
        client_core,
        server_core,
        idle_park: Duration::from_millis(100),
        verify,
    };
    match smbdirect_benches::service_loopback::run(&opts) {
        Ok(r) => {
            println!("{}", r.table(size));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("smbdirectd: loopback failed: {e}");
            ExitCode::FAILURE
        }
    }
}
