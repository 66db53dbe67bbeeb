//! `smbdirectd qos ...`: Storage QoS policies and flows of a running daemon,
//! over its admin socket. The request lines and the JSON replies are
//! `smbdirect_controlplane::qos_admin`'s; this file only maps the command
//! line to a request and the reply to text (docs/qos.md).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};
use smbdirect_controlplane::admin;
use smbdirect_controlplane::qos_admin::{self, QosReply, QosRequest};
use smbdirect_controlplane::qos_policy::{kind_name, PolicyEntry};
use smbdirect_protocol::sqos::server::{Policy, PolicyKind};
use smbdirect_protocol::sqos::Guid;

/// Which daemon to ask.
#[derive(Debug, Args)]
pub struct AdminTarget {
    /// Admin socket of the daemon [default: derived from --port].
    #[arg(long)]
    admin_socket: Option<PathBuf>,
    /// Listen port of the daemon, to derive the admin socket path.
    #[arg(long, default_value_t = 445)]
    port: u16,
}

impl AdminTarget {
    fn path(&self) -> PathBuf {
        self.admin_socket
            .clone()
            .unwrap_or_else(|| admin::default_path(self.port))
    }
}

/// `smbdirectd qos ...`.
#[derive(Debug, Subcommand)]
pub enum QosCommand {
    /// Add, remove or list Storage QoS policies (the PolicyIDs flows name).
    Policy {
        #[command(subcommand)]
        cmd: PolicyCommand,
    },
    /// The logical flows and what they get, like Windows' Get-StorageQosFlow.
    Flows {
        /// Print the daemon's JSON reply (field names: docs/qos.md).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: AdminTarget,
    },
}

/// `smbdirectd qos policy ...`.
#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Add a policy (saved to the daemon's policy file, if it has one).
    Add {
        /// PolicyID, a GUID with or without braces.
        id: Guid,
        /// Name, for operators only.
        #[arg(long)]
        name: Option<String>,
        /// Dedicated: every flow gets the limits; aggregated: the flows share them.
        #[arg(long = "type", value_enum, value_name = "TYPE")]
        kind: KindArg,
        /// Minimum, normalized IOPS (8 KiB units); 0: none.
        #[arg(long, default_value_t = 0)]
        min_iops: u64,
        /// Maximum, normalized IOPS (8 KiB units); 0: unlimited.
        #[arg(long, default_value_t = 0)]
        max_iops: u64,
        /// Maximum bandwidth, KB/s (KB = 1024 bytes); 0: unlimited.
        #[arg(long, default_value_t = 0)]
        max_bandwidth_kbps: u64,
        /// Replace a policy with the same ID instead of refusing.
        #[arg(long)]
        replace: bool,
        #[command(flatten)]
        target: AdminTarget,
    },
    /// Remove a policy; flows that name it report UnknownPolicyId.
    Remove {
        /// PolicyID, a GUID with or without braces.
        id: Guid,
        #[command(flatten)]
        target: AdminTarget,
    },
    /// List the policies.
    List {
        /// Print the daemon's JSON reply (field names: docs/qos.md).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: AdminTarget,
    },
}

/// `--type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KindArg {
    /// Every flow naming the policy gets its full limits.
    Dedicated,
    /// The flows naming the policy share its limits.
    Aggregated,
}

/// Sends the request and prints the reply: exit 0, 1 when the daemon cannot
/// be reached or refuses, 2 for a request that is wrong before it is sent.
pub fn run(cmd: QosCommand) -> ExitCode {
    let (request, target, json) = match cmd {
        QosCommand::Flows { json, target } => (QosRequest::Flows, target, json),
        QosCommand::Policy { cmd } => match cmd {
            PolicyCommand::List { json, target } => (QosRequest::PolicyList, target, json),
            PolicyCommand::Remove { id, target } => {
                (QosRequest::PolicyRemove { id }, target, false)
            }
            PolicyCommand::Add {
                id,
                name,
                kind,
                min_iops,
                max_iops,
                max_bandwidth_kbps,
                replace,
                target,
            } => {
                let entry = PolicyEntry {
                    id,
                    name,
                    policy: Policy {
                        kind: match kind {
                            KindArg::Dedicated => PolicyKind::Dedicated,
                            KindArg::Aggregated => PolicyKind::Aggregated,
                        },
                        minimum_iops: min_iops,
                        maximum_iops: max_iops,
                        maximum_bandwidth: max_bandwidth_kbps,
                    },
                };
                if let Err(e) = entry.validate() {
                    eprintln!("smbdirectd: qos policy add: {e}");
                    return ExitCode::from(2);
                }
                if let Some(w) = entry.mismatch() {
                    eprintln!("smbdirectd: warn: {w}");
                }
                (QosRequest::PolicyAdd { entry, replace }, target, false)
            }
        },
    };
    let path = target.path();
    let reply = match admin::request(&path, &request.to_line()) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("smbdirectd: {e}");
            return ExitCode::FAILURE;
        }
    };
    let parsed = qos_admin::parse_reply(&reply);
    if json {
        println!("{reply}");
    }
    match parsed {
        Err(e) => {
            eprintln!("smbdirectd: {e}");
            if e.starts_with("unknown request") {
                eprintln!(
                    "smbdirectd: the daemon at {} does not serve qos commands",
                    path.display()
                );
            }
            ExitCode::FAILURE
        }
        Ok(_) if json => ExitCode::SUCCESS,
        Ok(r) => {
            println!("{}", describe(&r));
            ExitCode::SUCCESS
        }
    }
}

/// What a reply prints as, without `--json`.
fn describe(reply: &QosReply) -> String {
    match reply {
        QosReply::PolicyAdded {
            entry,
            replaced,
            persisted_to,
            ..
        } => format!(
            "{} policy {}; {}",
            if *replaced { "replaced" } else { "added" },
            summary(entry),
            persistence(persisted_to.as_deref())
        ),
        QosReply::PolicyRemoved {
            entry,
            persisted_to,
            ..
        } => format!(
            "removed policy {}; {}",
            summary(entry),
            persistence(persisted_to.as_deref())
        ),
        QosReply::Policies { entries, .. } if entries.is_empty() => "no policies".into(),
        QosReply::Policies { entries, .. } => qos_admin::render_policies_table(entries),
        QosReply::Flows(rows) if rows.is_empty() => "no flows".into(),
        QosReply::Flows(rows) => qos_admin::render_flows_table(rows),
    }
}

fn summary(e: &PolicyEntry) -> String {
    let p = &e.policy;
    let name = e
        .name
        .as_ref()
        .map_or(String::new(), |n| format!(" ({})", n.escape_debug()));
    format!(
        "{:#}{name}: {}, min_iops {}, max_iops {}, max_bandwidth_kbps {}",
        e.id,
        kind_name(p.kind),
        p.minimum_iops,
        p.maximum_iops,
        p.maximum_bandwidth
    )
}

fn persistence(file: Option<&str>) -> String {
    match file {
        Some(f) => format!("saved to {f}"),
        None => "not saved: the daemon has no policy file, the change lasts until it stops".into(),
    }
}
