//! `smbdirectd`: wires the command line to the crates.

use clap::{Parser, Subcommand};
use smbdirect_protocol::smbd::SmbdConfig;
use std::process::ExitCode;
use std::time::Duration;

/// Kernel-bypass SMB Direct ([MS-SMBD]) and Storage QoS ([MS-SQOS]) data-plane service.
#[derive(Debug, Parser)]
#[command(name = "smbdirectd", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs two SMB Direct protocol state machines against each other in
    /// this process (no RDMA provider, no network) and prints round-trip
    /// latency percentiles. A self-check of the protocol core; the service
    /// (`serve`) and the load generator (`bench`) are not built yet.
    Loopback {
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Loopback { size, duration, warmup } => {
            if size == 0 || size > SmbdConfig::default().max_fragmented_recv_size as usize {
                eprintln!("smbdirectd: --size must be between 1 and 1048576 bytes");
                return ExitCode::from(2);
            }
            if !(duration > 0.0 && warmup >= 0.0) {
                eprintln!("smbdirectd: --duration must be positive and --warmup non-negative");
                return ExitCode::from(2);
            }
            match smbdirect_benches::protocol_loopback::run(
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
            }
        }
    }
}
