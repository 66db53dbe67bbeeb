//! The `bench` command line ([`BenchArgs`], clap) and what it means once
//! checked ([`BenchOptions`]), including the flags only the SMB2 workloads
//! (`read`, `write`, `mixed`, `qos`) read.

use super::error::BenchError;
use clap::{Args, ValueEnum};
use smbdirect_controlplane::cores;
use smbdirect_hugepages::parse_size;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Largest `--size` of the message workloads: the default
/// Connection.MaxFragmentedRecvSize ([MS-SMBD] 3.1.1.1), so that `send` and
/// `raw-send` cover the same range.
pub const MAX_MESSAGE_SIZE: usize = 1 << 20;

/// Most outstanding requests per connection the message workloads accept
/// (an SMB Direct peer has at most 255 send credits; the client's send
/// queue holds 256 messages).
pub const MAX_QUEUE_DEPTH: u32 = 255;

/// Most connections.
pub const MAX_CONNECTIONS: usize = 256;

/// `--max-send-size` when not given: Windows' MaxSendSize ([MS-SMBD]
/// Appendix B), the value [`SmbdConfig::default`] carries.
///
/// [`SmbdConfig::default`]: smbdirect_protocol::smbd::SmbdConfig
pub const DEFAULT_MAX_SEND_SIZE: u32 = 1364;
/// Smallest `--max-send-size`: [MS-SMBD] 3.1.5.2's minimum receive size.
pub const MIN_MAX_SEND_SIZE: u32 = 128;
/// Largest `--max-send-size`: the MaxReceiveSize both ends post (8192), so
/// a larger value would never be used.
pub const MAX_MAX_SEND_SIZE: u32 = 8192;

/// `--file-size` of the SMB2 workloads when not given.
pub const DEFAULT_FILE_SIZE: &str = "64M";

/// What each operation is (`--workload`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WorkloadKind {
    /// SMB Direct data-transfer round trips of --size bytes against an
    /// `--upper echo` server (fragmented above MaxSendSize - 24).
    Send,
    /// The same round trip over the bare provider, without SMB Direct (the
    /// baseline; --loopback only: the echo peer is a thread of this process).
    RawSend,
    /// `raw-send` with what [MS-SMBD] requires of every message and no
    /// more: a 24-byte Data Transfer header (2.2.3) before the payload that
    /// the receiving end reads and checks (3.1.5.5), and the echo's reply
    /// header written over the request's (one Send from the receive buffer,
    /// as smbdirectd's echo does). No credits, receive policy or upper
    /// layer: the floor under any SMB Direct `send` on the provider
    /// (--loopback only).
    RawSmbd,
    /// SMB2 READ of --size through an RDMA channel (or --inline) against
    /// an `--upper smb2` server, on a file of --file-size.
    Read,
    /// SMB2 WRITE of --size through an RDMA channel (or --inline).
    Write,
    /// READ and WRITE mixed by --read-pct.
    Mixed,
    /// Storage QoS ([MS-SQOS]) flows doing the I/O of `mixed`: --flows,
    /// --limit, --reservation, --bandwidth-limit, --policy-id,
    /// --ignore-limit.
    Qos,
    /// Two pinned threads bouncing one cache line (client core / server
    /// core): the hardware floor `raw-send` is compared with (--loopback
    /// only, queue depth 1).
    Pingpong,
    /// A copy of --size bytes between two buffers of the client thread: the
    /// same-run baseline of read/write (--loopback only). With --file-size,
    /// each copy's source is the next --size block of a region of that
    /// size, mapped as the memory store maps its data (the read/write rows'
    /// footprint); without, one --size buffer that stays in cache.
    Memcpy,
}

impl WorkloadKind {
    /// The `--workload` spelling.
    pub fn name(self) -> &'static str {
        match self {
            WorkloadKind::Send => "send",
            WorkloadKind::RawSend => "raw-send",
            WorkloadKind::RawSmbd => "raw-smbd",
            WorkloadKind::Read => "read",
            WorkloadKind::Write => "write",
            WorkloadKind::Mixed => "mixed",
            WorkloadKind::Qos => "qos",
            WorkloadKind::Pingpong => "pingpong",
            WorkloadKind::Memcpy => "memcpy",
        }
    }

    /// Whether it speaks SMB2 (the `--upper smb2` server's workloads).
    pub fn is_smb2(self) -> bool {
        matches!(
            self,
            WorkloadKind::Read | WorkloadKind::Write | WorkloadKind::Mixed | WorkloadKind::Qos
        )
    }
}

/// `--provider`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProviderChoice {
    /// verbs when an RDMA device is present, else soft.
    Auto,
    /// Real RDMA through rdma-core (libibverbs, librdmacm).
    Verbs,
    /// The embedded software provider (this host only).
    Soft,
}

/// `smbdirectd bench`: load generator and latency meter.
#[derive(Debug, Clone, Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["connect", "loopback"])))]
pub struct BenchArgs {
    /// Drive a running `smbdirectd serve` at ADDR:PORT.
    #[arg(long, value_name = "ADDR:PORT")]
    pub connect: Option<SocketAddr>,
    /// Start the server in this process (on --server-cores, with the upper
    /// layer the workload needs) and drive it.
    #[arg(long)]
    pub loopback: bool,
    /// Address the --loopback server listens on (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0", value_name = "ADDR:PORT")]
    pub listen: SocketAddr,
    /// RDMA provider.
    #[arg(long, value_enum, default_value_t = ProviderChoice::Auto)]
    pub provider: ProviderChoice,
    /// Client worker cores, one pinned thread each (a list 0,2-3 or a mask
    /// 0x5) [default: the first available core].
    #[arg(long)]
    pub cores: Option<String>,
    /// Cores of the --loopback server's workers [default: the second
    /// available core, or the first on a one-core machine].
    #[arg(long)]
    pub server_cores: Option<String>,
    /// Connections, spread round-robin over the client cores.
    #[arg(long, default_value_t = 1)]
    pub connections: usize,
    /// Outstanding requests per connection (like fio's iodepth).
    #[arg(long, default_value_t = 1)]
    pub queue_depth: u32,
    /// Seconds to measure [default: 5 unless --iterations is given].
    #[arg(long, conflicts_with = "iterations")]
    pub duration: Option<f64>,
    /// Measure exactly N operations (over all connections) instead.
    #[arg(long)]
    pub iterations: Option<u64>,
    /// Seconds run before measuring.
    #[arg(long, default_value_t = 0.5)]
    pub warmup: f64,
    /// Fixed-rate mode: start OPS operations per second in all (latency then
    /// counts from each operation's intended start: coordinated omission
    /// corrected).
    #[arg(long, value_name = "OPS")]
    pub rate: Option<f64>,
    /// What each operation is.
    #[arg(long, value_enum, default_value_t = WorkloadKind::Send)]
    pub workload: WorkloadKind,
    /// Bytes per operation (512, 4K, 1M ...).
    #[arg(long, default_value = "512")]
    pub size: String,
    /// read/write: carry the data inside the SMB2 messages instead of an
    /// RDMA channel.
    #[arg(long)]
    pub inline: bool,
    /// [MS-SMBD] Connection.MaxSendSize of both ends: the client's
    /// PreferredSendSize in its Negotiate Request (3.1.5.2) and the
    /// --loopback server's own limit. A message travels in one Send when it
    /// fits the smaller of this and the peer's MaxReceiveSize (8192 here),
    /// else in fragments (3.1.5.1). The default is Windows' 1364.
    #[arg(long, default_value_t = DEFAULT_MAX_SEND_SIZE, value_name = "BYTES")]
    pub max_send_size: u32,
    /// mixed: percentage of READs.
    #[arg(long, default_value_t = 50)]
    pub read_pct: u8,
    /// qos: logical flows (one per connection by default).
    #[arg(long)]
    pub flows: Option<u32>,
    /// qos: the policy's maximum, in normalized IOPS.
    #[arg(long)]
    pub limit: Option<u64>,
    /// qos: the policy's minimum (reservation), in normalized IOPS.
    #[arg(long)]
    pub reservation: Option<u64>,
    /// qos: the policy's BandwidthLimit in KB/s (1 KB = 1024 bytes, as
    /// [MS-SQOS] 2.2.2.2 counts it).
    #[arg(long, value_name = "KBPS")]
    pub bandwidth_limit: Option<u64>,
    /// qos: the policy's GUID.
    #[arg(long)]
    pub policy_id: Option<String>,
    /// qos: send as fast as possible regardless of the limit (to see it
    /// enforced).
    #[arg(long)]
    pub ignore_limit: bool,
    /// read/write/mixed/qos: size of the file the I/O goes to (created and
    /// filled at set-up; with --loopback the server's memory store holds it;
    /// default 64M). memcpy: the region the copies' sources walk through
    /// (default: one --size buffer).
    #[arg(long)]
    pub file_size: Option<String>,
    /// Check every byte moved (off by default for speed); any mismatch is an
    /// error and the exit status 1.
    #[arg(long)]
    pub verify: bool,
    /// No progress line.
    #[arg(long)]
    pub quiet: bool,
    /// Write the result as JSON (fields: README.md, "Benchmarks").
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write the latency distribution in HdrHistogram's percentile format
    /// (values in microseconds; the HdrHistogram plotter reads it).
    #[arg(long, value_name = "FILE")]
    pub hgrm: Option<PathBuf>,
    /// Write a latency-by-percentile plot (SVG).
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
}

/// When the measurement ends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Stop {
    /// After this much measured time (operations started in it finish).
    After(Duration),
    /// After exactly this many measured operations, over all connections.
    Iterations(u64),
}

/// Where the server is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A server started in this process, listening on this address.
    Loopback(SocketAddr),
    /// A running `serve`.
    Connect(SocketAddr),
}

/// Parameters only the SMB2 workloads use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Smb2Options {
    /// `--inline`.
    pub inline: bool,
    /// `--read-pct`.
    pub read_pct: u8,
    /// `--flows`.
    pub flows: Option<u32>,
    /// `--limit`.
    pub limit: Option<u64>,
    /// `--reservation`.
    pub reservation: Option<u64>,
    /// `--bandwidth-limit`, KB/s.
    pub bandwidth_limit: Option<u64>,
    /// `--policy-id`.
    pub policy_id: Option<String>,
    /// `--ignore-limit`.
    pub ignore_limit: bool,
    /// `--file-size`, bytes.
    pub file_size: u64,
}

/// A checked `bench` invocation.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchOptions {
    /// Where the server is.
    pub target: Target,
    /// Requested provider.
    pub provider: ProviderChoice,
    /// Client cores, one thread each (None: not pinned).
    pub client_cores: Vec<Option<usize>>,
    /// Loopback server worker cores (empty with --connect).
    pub server_cores: Vec<Option<usize>>,
    /// Connections.
    pub connections: usize,
    /// Outstanding requests per connection.
    pub queue_depth: u32,
    /// When to stop.
    pub stop: Stop,
    /// Unmeasured run-in.
    pub warmup: Duration,
    /// Fixed rate (operations per second in all).
    pub rate: Option<f64>,
    /// What each operation is.
    pub workload: WorkloadKind,
    /// Bytes per operation.
    pub size: usize,
    /// `--max-send-size`: Connection.MaxSendSize of the client and of the
    /// --loopback server.
    pub max_send_size: u32,
    /// SMB2 workload parameters.
    pub smb2: Smb2Options,
    /// memcpy: bytes the sources walk through (`--file-size`; None: one
    /// `--size` buffer).
    pub memcpy_span: Option<u64>,
    /// Check every byte.
    pub verify: bool,
    /// No progress line.
    pub quiet: bool,
    /// Output files.
    pub json: Option<PathBuf>,
    /// HdrHistogram percentile distribution file.
    pub hgrm: Option<PathBuf>,
    /// SVG plot file.
    pub plot: Option<PathBuf>,
}

fn seconds(name: &str, v: f64, allow_zero: bool) -> Result<Duration, BenchError> {
    let ok = v.is_finite() && v <= 86_400.0 && (v > 0.0 || (allow_zero && v == 0.0));
    if !ok {
        let want = if allow_zero {
            "[0, 86400]"
        } else {
            "(0, 86400]"
        };
        return Err(BenchError::Usage(format!(
            "{name} {v}: want seconds in {want}"
        )));
    }
    Ok(Duration::from_secs_f64(v))
}

fn core_list(flag: &str, spec: &str, available: &[usize]) -> Result<Vec<usize>, BenchError> {
    let list = cores::parse_cores(spec).map_err(|e| BenchError::Usage(format!("{flag}: {e}")))?;
    cores::check_available(&list, available)
        .map_err(|e| BenchError::Usage(format!("{flag}: {e}")))?;
    Ok(list)
}

impl BenchOptions {
    /// Checks the command line; every error is a usage error (exit status 2).
    pub fn from_args(a: &BenchArgs) -> Result<Self, BenchError> {
        let usage = |s: String| Err(BenchError::Usage(s));
        let target = match (a.connect, a.loopback) {
            (Some(addr), false) => Target::Connect(addr),
            (None, true) => Target::Loopback(a.listen),
            _ => return usage("give exactly one of --connect ADDR:PORT and --loopback".into()),
        };
        let loopback = matches!(target, Target::Loopback(_));
        if !loopback
            && matches!(
                a.workload,
                WorkloadKind::RawSend
                    | WorkloadKind::RawSmbd
                    | WorkloadKind::Pingpong
                    | WorkloadKind::Memcpy
            )
        {
            return usage(format!(
                "--workload {} runs against a peer in this process: use --loopback (a running serve speaks SMB Direct only)",
                a.workload.name()
            ));
        }
        let available = cores::available_cores();
        let first = available.first().copied();
        let client: Vec<Option<usize>> = match &a.cores {
            Some(s) => core_list("--cores", s, &available)?
                .into_iter()
                .map(Some)
                .collect(),
            None => vec![first],
        };
        let server: Vec<Option<usize>> = match (&a.server_cores, loopback) {
            (Some(_), false) => {
                return usage("--server-cores applies to --loopback only".into());
            }
            (Some(s), true) => core_list("--server-cores", s, &available)?
                .into_iter()
                .map(Some)
                .collect(),
            (None, true) => vec![available.get(1).copied().or(first)],
            (None, false) => Vec::new(),
        };
        if a.connections == 0 || a.connections > MAX_CONNECTIONS {
            return usage(format!(
                "--connections {}: want 1..={MAX_CONNECTIONS}",
                a.connections
            ));
        }
        if a.queue_depth == 0 || a.queue_depth > MAX_QUEUE_DEPTH {
            return usage(format!(
                "--queue-depth {}: want 1..={MAX_QUEUE_DEPTH}",
                a.queue_depth
            ));
        }
        if a.workload == WorkloadKind::Pingpong && a.queue_depth != 1 {
            return usage(
                "--workload pingpong bounces one cache line: --queue-depth must be 1".into(),
            );
        }
        let stop = match (a.duration, a.iterations) {
            (_, Some(0)) => return usage("--iterations must be at least 1".into()),
            (None, Some(n)) => Stop::Iterations(n),
            (Some(d), None) => Stop::After(seconds("--duration", d, false)?),
            (None, None) => Stop::After(Duration::from_secs(5)),
            (Some(_), Some(_)) => {
                return usage("--duration and --iterations exclude each other".into())
            }
        };
        let warmup = seconds("--warmup", a.warmup, true)?;
        if let Some(r) = a.rate {
            if !(r.is_finite() && r > 0.0 && r <= 1e9) {
                return usage(format!(
                    "--rate {r}: want operations per second in (0, 1e9]"
                ));
            }
        }
        let size = parse_size(&a.size).map_err(|e| BenchError::Usage(format!("--size: {e}")))?;
        if size == 0 || size > MAX_MESSAGE_SIZE {
            return usage(format!(
                "--size {size}: want 1..={MAX_MESSAGE_SIZE} bytes (the default MaxFragmentedSize)"
            ));
        }
        if !(MIN_MAX_SEND_SIZE..=MAX_MAX_SEND_SIZE).contains(&a.max_send_size) {
            return usage(format!(
                "--max-send-size {}: want {MIN_MAX_SEND_SIZE}..={MAX_MAX_SEND_SIZE} bytes ([MS-SMBD] 3.1.5.2: a receive is at least 128 bytes; at most the MaxReceiveSize both ends post)",
                a.max_send_size
            ));
        }
        if a.read_pct > 100 {
            return usage(format!("--read-pct {}: want 0..=100", a.read_pct));
        }
        if a.flows == Some(0) {
            return usage("--flows must be at least 1".into());
        }
        let bandwidth_limit = a.bandwidth_limit;
        if let (WorkloadKind::Qos, Some(f)) = (a.workload, a.flows) {
            if (f as usize) < a.connections {
                return usage(format!(
                    "--flows {f} is fewer than --connections {}: every connection needs a flow",
                    a.connections
                ));
            }
        }
        if let Some(g) = &a.policy_id {
            if g.parse::<smbdirect_protocol::sqos::Guid>().is_err() {
                return usage(format!("--policy-id {g}: not a GUID"));
            }
        }
        let file_size = parse_size(a.file_size.as_deref().unwrap_or(DEFAULT_FILE_SIZE))
            .map_err(|e| BenchError::Usage(format!("--file-size: {e}")))?
            as u64;
        if file_size < size as u64 {
            return usage(format!(
                "--file-size {file_size} is smaller than --size {size}"
            ));
        }
        if let (Some(r), Some(l)) = (a.reservation, a.limit) {
            if r > l {
                return usage(format!("--reservation {r} is above --limit {l}"));
            }
        }
        Ok(BenchOptions {
            target,
            provider: a.provider,
            client_cores: client,
            server_cores: server,
            connections: a.connections,
            queue_depth: a.queue_depth,
            stop,
            warmup,
            rate: a.rate,
            workload: a.workload,
            size,
            max_send_size: a.max_send_size,
            smb2: Smb2Options {
                inline: a.inline,
                read_pct: a.read_pct,
                flows: a.flows,
                limit: a.limit,
                reservation: a.reservation,
                bandwidth_limit,
                policy_id: a.policy_id.clone(),
                ignore_limit: a.ignore_limit,
                file_size,
            },
            memcpy_span: (a.workload == WorkloadKind::Memcpy && a.file_size.is_some())
                .then_some(file_size),
            verify: a.verify,
            quiet: a.quiet,
            json: a.json.clone(),
            hgrm: a.hgrm.clone(),
            plot: a.plot.clone(),
        })
    }

    /// Client threads actually used: no more than connections.
    pub fn client_threads(&self) -> usize {
        self.client_cores.len().min(self.connections).max(1)
    }
}

/// `bench`'s options from arguments, for tests.
#[cfg(test)]
pub(crate) mod test_args {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchArgs,
    }

    /// The options `bench EXTRA...` gives (or its usage error).
    pub(crate) fn parse(extra: &[&str]) -> Result<BenchOptions, BenchError> {
        let mut argv = vec!["bench"];
        argv.extend_from_slice(extra);
        let cli = Cli::try_parse_from(argv).map_err(|e| BenchError::Usage(e.to_string()))?;
        BenchOptions::from_args(&cli.args)
    }
}

#[cfg(test)]
mod tests {
    use super::test_args::parse;
    use super::*;

    #[test]
    fn defaults_measure_five_seconds_of_512_byte_sends() {
        let o = parse(&["--loopback"]).expect("valid");
        assert_eq!(o.workload, WorkloadKind::Send);
        assert_eq!(o.size, 512);
        assert_eq!(o.queue_depth, 1);
        assert_eq!(o.stop, Stop::After(Duration::from_secs(5)));
        assert_eq!(o.client_cores.len(), 1);
        assert_eq!(o.server_cores.len(), 1);
        assert_eq!(o.max_send_size, 1364);
        assert_eq!(
            o.max_send_size,
            smbdirect_protocol::smbd::SmbdConfig::default().max_send_size
        );
    }

    #[test]
    fn a_target_is_required() {
        assert!(parse(&[]).is_err());
        assert!(parse(&["--loopback", "--connect", "127.0.0.1:445"]).is_err());
    }

    #[test]
    fn iterations_and_duration_exclude_each_other() {
        assert!(parse(&["--loopback", "--iterations", "5", "--duration", "1"]).is_err());
        assert_eq!(
            parse(&["--loopback", "--iterations", "5"])
                .expect("valid")
                .stop,
            Stop::Iterations(5)
        );
    }

    #[test]
    fn raw_send_needs_loopback() {
        for w in ["raw-send", "raw-smbd"] {
            let e = parse(&["--connect", "127.0.0.1:445", "--workload", w]).unwrap_err();
            assert!(e.to_string().contains("--loopback"), "{w}: {e}");
            assert_eq!(e.exit_code(), 2);
        }
    }

    #[test]
    fn out_of_range_values_are_usage_errors() {
        for bad in [
            &["--loopback", "--size", "0"][..],
            &["--loopback", "--size", "2M"],
            &["--loopback", "--queue-depth", "0"],
            &["--loopback", "--connections", "0"],
            &["--loopback", "--rate", "-1"],
            &["--loopback", "--duration", "0"],
            &["--loopback", "--read-pct", "101"],
            &["--loopback", "--workload", "pingpong", "--queue-depth", "2"],
            &["--loopback", "--reservation", "10", "--limit", "5"],
            &["--loopback", "--max-send-size", "127"],
            &["--loopback", "--max-send-size", "8193"],
        ] {
            let e = parse(bad).expect_err("rejected");
            assert_eq!(e.exit_code(), 2, "{bad:?}: {e}");
        }
    }

    #[test]
    fn smb2_workloads_flags_parse() {
        let o = parse(&[
            "--loopback",
            "--workload",
            "qos",
            "--flows",
            "4",
            "--limit",
            "1000",
            "--reservation",
            "100",
            "--bandwidth-limit",
            "102400",
            "--policy-id",
            "01234567-89ab-cdef-0123-456789abcdef",
            "--ignore-limit",
            "--file-size",
            "64M",
            "--inline",
            "--read-pct",
            "70",
        ])
        .expect("valid");
        assert_eq!(o.smb2.flows, Some(4));
        assert_eq!(o.smb2.bandwidth_limit, Some(100 << 10));
        assert_eq!(o.smb2.file_size, 64 << 20);
        assert!(o.smb2.inline && o.smb2.ignore_limit);
        assert_eq!(o.memcpy_span, None);
    }

    #[test]
    fn memcpy_walks_a_region_only_when_given_file_size() {
        let memcpy = ["--loopback", "--workload", "memcpy", "--size", "1M"];
        let o = parse(&memcpy).expect("valid");
        assert_eq!(o.memcpy_span, None);
        assert_eq!(o.smb2.file_size, 64 << 20);
        let region = |size: &str| parse(&[&memcpy[..], &["--file-size", size]].concat());
        assert_eq!(region("64M").expect("valid").memcpy_span, Some(64 << 20));
        let e = region("512K").expect_err("smaller than one block");
        assert_eq!(e.exit_code(), 2);
    }
}
