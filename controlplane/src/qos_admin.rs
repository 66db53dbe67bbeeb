//! The Storage QoS command language of the admin socket ([`crate::admin`]):
//! pure functions from a request line to a reply line, so the control plane
//! only has to call [`handle`] with its [`PolicyStore`] and a snapshot of the
//! flow table.
//!
//! # Requests
//!
//! One line, words separated by blanks; a word may be double-quoted (with
//! `\"` and `\\` inside) to hold blanks:
//!
//! ```text
//! qos policy add ID --type dedicated|aggregated [--name NAME]
//!                [--min-iops N] [--max-iops N] [--max-bandwidth-kbps N] [--replace]
//! qos policy remove ID
//! qos policy list [--json]
//! qos flows [--json]
//! ```
//!
//! `add` refuses an ID the store already has unless `--replace` is given.
//! Numbers default to 0 ("not defined"). `--json` is accepted and changes
//! nothing: the reply is always JSON.
//!
//! # Replies
//!
//! Always one line of JSON (field names are stable, see `docs/qos.md`): an
//! object with `"ok":true` and the result, or `"ok":false` and `"error"`.
//! The `smbdirectd qos` command reads the reply back with [`parse_reply`]
//! and prints tables with [`render_policies_table`] and
//! [`render_flows_table`]; the daemon never formats tables.
//!
//! # Persistence
//!
//! When the store has a backing file (the daemon was started with a policy
//! file), `add` and `remove` rewrite it before they answer; if it cannot be
//! written the change is not made and the reply is an error.

use std::fmt::Write as _;

use smbdirect_protocol::sqos::server::{Policy, PolicyKind};
use smbdirect_protocol::sqos::{FlowStatus, Guid};

use crate::qos_policy::{kind_name, parse_kind, PolicyEntry, PolicyStore};

/// One logical flow ([MS-SQOS] 3.2.1.1) as `qos flows` shows it; the
/// control plane fills these from its flow table and the enforcement
/// engine's measurements.
#[derive(Debug, Clone, PartialEq)]
pub struct FlowRow {
    /// LogicalFlowID.
    pub flow_id: Guid,
    /// InitiatorName (a virtual machine, say); peer-supplied.
    pub initiator_name: String,
    /// InitiatorNodeName (the host it runs on); peer-supplied.
    pub initiator_node_name: String,
    /// PolicyID, `None` for a NULL PolicyID.
    pub policy_id: Option<Guid>,
    /// The policy's operator name, when the store knows one.
    pub policy_name: Option<String>,
    /// Assigned maximum, normalized IOPS (0: none).
    pub limit_iops: u64,
    /// Assigned minimum, normalized IOPS (0: none).
    pub reservation_iops: u64,
    /// Assigned maximum bandwidth, KB/s (0: none).
    pub bandwidth_limit_kbps: u64,
    /// Measured normalized IOPS.
    pub iops: u64,
    /// Measured KB/s.
    pub kbps: u64,
    /// Measured average latency, microseconds (NaN: not measured).
    pub latency_us: f64,
    /// [MS-SQOS] 2.2.2.1 status without its prefix: "Ok",
    /// "InsufficientThroughput", "UnknownPolicyId", "ConfigurationMismatch",
    /// "NotAvailable" (see [`status_name`]).
    pub status: String,
    /// SMB2 Opens associated with the flow.
    pub opens: u32,
    /// Workers the flow's Opens are served on.
    pub workers: u32,
}

/// The word [`FlowRow::status`] uses for a [MS-SQOS] 2.2.2.1 status.
pub fn status_name(status: FlowStatus) -> String {
    match status {
        FlowStatus::Ok => "Ok".into(),
        FlowStatus::InsufficientThroughput => "InsufficientThroughput".into(),
        FlowStatus::UnknownPolicyId => "UnknownPolicyId".into(),
        FlowStatus::ConfigurationMismatch => "ConfigurationMismatch".into(),
        FlowStatus::NotAvailable => "NotAvailable".into(),
        FlowStatus::Unrecognized(v) => format!("Unrecognized({v})"),
    }
}

/// A parsed `qos ...` request line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QosRequest {
    /// `qos policy add`.
    PolicyAdd {
        /// The policy to add.
        entry: PolicyEntry,
        /// Replace a policy with the same ID instead of refusing.
        replace: bool,
    },
    /// `qos policy remove ID`.
    PolicyRemove {
        /// The policy to remove.
        id: Guid,
    },
    /// `qos policy list`.
    PolicyList,
    /// `qos flows`.
    Flows,
}

const USAGE_ADD: &str = "usage: qos policy add ID --type dedicated|aggregated [--name NAME] [--min-iops N] [--max-iops N] [--max-bandwidth-kbps N] [--replace]";
const USAGE_REMOVE: &str = "usage: qos policy remove ID";
const USAGE_LIST: &str = "usage: qos policy list [--json]";
const USAGE_FLOWS: &str = "usage: qos flows [--json]";
const USAGE: &str = "usage: qos policy add|remove|list ..., or qos flows [--json]";

impl QosRequest {
    /// `None` when `line` is not a `qos` command (its first word is not
    /// `qos`); otherwise the request, or what is wrong with it.
    pub fn parse(line: &str) -> Option<Result<QosRequest, String>> {
        if line.split_whitespace().next() != Some("qos") {
            return None;
        }
        Some(tokenize(line).and_then(|t| parse_tokens(t.get(1..).unwrap_or(&[]))))
    }

    /// The request line [`QosRequest::parse`] reads back as `self`.
    pub fn to_line(&self) -> String {
        match self {
            QosRequest::PolicyAdd { entry, replace } => {
                let p = &entry.policy;
                let mut line =
                    format!("qos policy add {:#} --type {}", entry.id, kind_name(p.kind));
                if let Some(name) = &entry.name {
                    line.push_str(" --name ");
                    line.push_str(&quote_word(name));
                }
                let _ = write!(
                    line,
                    " --min-iops {} --max-iops {} --max-bandwidth-kbps {}",
                    p.minimum_iops, p.maximum_iops, p.maximum_bandwidth
                );
                if *replace {
                    line.push_str(" --replace");
                }
                line
            }
            QosRequest::PolicyRemove { id } => format!("qos policy remove {id:#}"),
            QosRequest::PolicyList => "qos policy list".into(),
            QosRequest::Flows => "qos flows".into(),
        }
    }
}

/// Answers `line` when it is a `qos` command (`None` otherwise): changes
/// `store` for `add`/`remove` (and rewrites its backing file), reads it for
/// `list`, and reports `flows` for `qos flows`. The reply is one line of
/// JSON.
pub fn handle(line: &str, store: &mut PolicyStore, flows: &[FlowRow]) -> Option<String> {
    let request = match QosRequest::parse(line)? {
        Ok(r) => r,
        Err(e) => return Some(error_reply(&e)),
    };
    Some(match execute(request, store, flows) {
        Ok(reply) => reply,
        Err(e) => error_reply(&e),
    })
}

fn execute(
    request: QosRequest,
    store: &mut PolicyStore,
    flows: &[FlowRow],
) -> Result<String, String> {
    let mut out = String::from("{\"ok\":true");
    match request {
        QosRequest::PolicyAdd { entry, replace } => {
            // Change a copy, write it out, and only then keep it: a store
            // that differs from its file would lose the change on restart.
            let mut next = store.clone();
            let id = entry.id;
            let replaced = if replace {
                next.replace(entry.clone())?.is_some()
            } else {
                next.add(entry.clone())?;
                false
            };
            next.persist()
                .map_err(|e| format!("policy {id:#} not added: {e}"))?;
            *store = next;
            let _ = write!(
                out,
                ",\"generation\":{},\"replaced\":{replaced}",
                store.generation()
            );
            push_persisted_to(&mut out, store);
            out.push_str(",\"policy\":");
            push_policy(&mut out, &entry);
        }
        QosRequest::PolicyRemove { id } => {
            let mut next = store.clone();
            let removed = next.remove(&id)?;
            next.persist()
                .map_err(|e| format!("policy {id:#} not removed: {e}"))?;
            *store = next;
            let _ = write!(out, ",\"generation\":{}", store.generation());
            push_persisted_to(&mut out, store);
            out.push_str(",\"removed\":");
            push_policy(&mut out, &removed);
        }
        QosRequest::PolicyList => {
            let _ = write!(out, ",\"generation\":{}", store.generation());
            out.push_str(",\"policy_file\":");
            push_opt_string(
                &mut out,
                store
                    .backing_file()
                    .map(|p| p.display().to_string())
                    .as_deref(),
            );
            out.push_str(",\"policies\":[");
            for (i, e) in store.list().iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                push_policy(&mut out, e);
            }
            out.push(']');
        }
        QosRequest::Flows => {
            out.push_str(",\"flows\":[");
            for (i, f) in flows.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                push_flow(&mut out, f);
            }
            out.push(']');
        }
    }
    out.push('}');
    Ok(out)
}

/// `{"ok":false,"error":MESSAGE}`.
pub fn error_reply(message: &str) -> String {
    let mut out = String::from("{\"ok\":false,\"error\":");
    push_json_string(&mut out, message);
    out.push('}');
    out
}

// ---------------------------------------------------------------------------
// Request line: words and options.

/// Splits a line into words: blanks separate, double quotes group (with
/// `\"` and `\\` as the only escapes).
fn tokenize(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Ok(words);
        }
        let mut word = String::new();
        while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
            if c != '"' {
                word.push(c);
                continue;
            }
            loop {
                match chars.next() {
                    None => return Err("unterminated quoted word (a '\"' is missing)".into()),
                    Some('"') => break,
                    Some('\\') => match chars.next() {
                        Some(e @ ('"' | '\\')) => word.push(e),
                        Some(e) => {
                            return Err(format!(
                                "unknown escape '\\{e}' in a quoted word (only \\\" and \\\\)"
                            ))
                        }
                        None => return Err("unterminated quoted word (a '\"' is missing)".into()),
                    },
                    Some(c) => word.push(c),
                }
            }
        }
        words.push(word);
    }
}

/// `word` as [`tokenize`] reads it back: bare when it can be, else quoted.
pub fn quote_word(word: &str) -> String {
    if !word.is_empty()
        && !word
            .chars()
            .any(|c| c.is_whitespace() || c == '"' || c == '\\')
    {
        return word.to_string();
    }
    let mut out = String::from("\"");
    for c in word.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// The words after `qos`.
fn parse_tokens(words: &[String]) -> Result<QosRequest, String> {
    let w: Vec<&str> = words.iter().map(String::as_str).collect();
    match w.as_slice() {
        ["policy", "add", rest @ ..] => parse_add(rest),
        ["policy", "remove", id] => Ok(QosRequest::PolicyRemove {
            id: parse_id(id, USAGE_REMOVE)?,
        }),
        ["policy", "remove", ..] => Err(USAGE_REMOVE.into()),
        ["policy", "list"] | ["policy", "list", "--json"] => Ok(QosRequest::PolicyList),
        ["policy", "list", ..] => Err(USAGE_LIST.into()),
        ["flows"] | ["flows", "--json"] => Ok(QosRequest::Flows),
        ["flows", ..] => Err(USAGE_FLOWS.into()),
        ["policy", other, ..] => Err(format!("unknown qos policy command '{other}'; {USAGE}")),
        [other, ..] => Err(format!("unknown qos command '{other}'; {USAGE}")),
        [] => Err(USAGE.into()),
    }
}

fn parse_id(word: &str, usage: &str) -> Result<Guid, String> {
    word.parse()
        .map_err(|e| format!("'{word}' is not a policy ID: {e}; {usage}"))
}

fn parse_add(words: &[&str]) -> Result<QosRequest, String> {
    let (id, options) = match words {
        [id, rest @ ..] if !id.starts_with("--") => (parse_id(id, USAGE_ADD)?, rest),
        _ => return Err(format!("the policy ID is missing; {USAGE_ADD}")),
    };
    let mut name = None;
    let mut kind: Option<PolicyKind> = None;
    let mut numbers: [Option<u64>; 3] = [None; 3];
    let mut replace = false;
    let mut it = options.iter();
    while let Some(&opt) = it.next() {
        if opt == "--replace" {
            if replace {
                return Err(format!("--replace is given twice; {USAGE_ADD}"));
            }
            replace = true;
            continue;
        }
        if ![
            "--name",
            "--type",
            "--min-iops",
            "--max-iops",
            "--max-bandwidth-kbps",
        ]
        .contains(&opt)
        {
            return Err(if opt.starts_with("--") {
                format!("unknown option '{opt}'; {USAGE_ADD}")
            } else {
                format!("unexpected word '{opt}'; {USAGE_ADD}")
            });
        }
        let value = *it
            .next()
            .ok_or_else(|| format!("{opt} needs a value; {USAGE_ADD}"))?;
        let first = match opt {
            "--name" => name.replace(value.to_string()).is_none(),
            "--type" => {
                let k = parse_kind(value).ok_or_else(|| {
                    format!("--type: unknown type '{value}' (expected dedicated or aggregated)")
                })?;
                kind.replace(k).is_none()
            }
            _ => {
                let n: u64 = value
                    .parse()
                    .map_err(|_| format!("{opt}: '{value}' is not a non-negative integer"))?;
                let i = match opt {
                    "--min-iops" => 0,
                    "--max-iops" => 1,
                    _ => 2,
                };
                numbers[i].replace(n).is_none()
            }
        };
        if !first {
            return Err(format!("{opt} is given twice; {USAGE_ADD}"));
        }
    }
    let kind = kind.ok_or_else(|| format!("--type is missing; {USAGE_ADD}"))?;
    Ok(QosRequest::PolicyAdd {
        entry: PolicyEntry {
            id,
            name,
            policy: Policy {
                kind,
                minimum_iops: numbers[0].unwrap_or(0),
                maximum_iops: numbers[1].unwrap_or(0),
                maximum_bandwidth: numbers[2].unwrap_or(0),
            },
        },
        replace,
    })
}

// ---------------------------------------------------------------------------
// JSON out.

/// `s` as a JSON string, with quotes: `"` and `\` escaped, control
/// characters as `\n`, `\t`, ... or `\u00XX`.
pub fn push_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn push_opt_string(out: &mut String, s: Option<&str>) {
    match s {
        Some(s) => push_json_string(out, s),
        None => out.push_str("null"),
    }
}

fn push_persisted_to(out: &mut String, store: &PolicyStore) {
    out.push_str(",\"persisted_to\":");
    push_opt_string(
        out,
        store
            .backing_file()
            .map(|p| p.display().to_string())
            .as_deref(),
    );
}

fn push_policy(out: &mut String, e: &PolicyEntry) {
    let p = &e.policy;
    let _ = write!(out, "{{\"id\":\"{:#}\",\"name\":", e.id);
    push_opt_string(out, e.name.as_deref());
    let _ = write!(
        out,
        ",\"type\":\"{}\",\"min_iops\":{},\"max_iops\":{},\"max_bandwidth_kbps\":{}}}",
        kind_name(p.kind),
        p.minimum_iops,
        p.maximum_iops,
        p.maximum_bandwidth
    );
}

fn push_flow(out: &mut String, f: &FlowRow) {
    let _ = write!(out, "{{\"flow_id\":\"{:#}\",\"initiator_name\":", f.flow_id);
    push_json_string(out, &f.initiator_name);
    out.push_str(",\"initiator_node_name\":");
    push_json_string(out, &f.initiator_node_name);
    out.push_str(",\"policy_id\":");
    match f.policy_id {
        Some(id) => {
            let _ = write!(out, "\"{id:#}\"");
        }
        None => out.push_str("null"),
    }
    out.push_str(",\"policy_name\":");
    push_opt_string(out, f.policy_name.as_deref());
    let _ = write!(
        out,
        ",\"limit_iops\":{},\"reservation_iops\":{},\"bandwidth_limit_kbps\":{},\"iops\":{},\"kbps\":{},\"latency_us\":",
        f.limit_iops, f.reservation_iops, f.bandwidth_limit_kbps, f.iops, f.kbps
    );
    if f.latency_us.is_finite() {
        let _ = write!(out, "{:.1}", f.latency_us);
    } else {
        out.push_str("null");
    }
    out.push_str(",\"status\":");
    push_json_string(out, &f.status);
    let _ = write!(out, ",\"opens\":{},\"workers\":{}}}", f.opens, f.workers);
}

// ---------------------------------------------------------------------------
// JSON back in (the CLI side).

/// A reply of the daemon, read back.
#[derive(Debug, Clone, PartialEq)]
pub enum QosReply {
    /// To `qos policy add`.
    PolicyAdded {
        /// The policy as stored.
        entry: PolicyEntry,
        /// True when it replaced one with the same ID.
        replaced: bool,
        /// Store generation after the change.
        generation: u64,
        /// The policy file rewritten, if any.
        persisted_to: Option<String>,
    },
    /// To `qos policy remove`.
    PolicyRemoved {
        /// The policy removed.
        entry: PolicyEntry,
        /// Store generation after the change.
        generation: u64,
        /// The policy file rewritten, if any.
        persisted_to: Option<String>,
    },
    /// To `qos policy list`.
    Policies {
        /// The policies.
        entries: Vec<PolicyEntry>,
        /// Store generation.
        generation: u64,
        /// The daemon's policy file, if any.
        policy_file: Option<String>,
    },
    /// To `qos flows`.
    Flows(Vec<FlowRow>),
}

/// Reads a reply line: the result, or the daemon's error message (also for
/// a daemon that does not know `qos` commands), or what is wrong with a
/// malformed reply.
pub fn parse_reply(reply: &str) -> Result<QosReply, String> {
    let malformed = |e: String| format!("malformed reply from smbdirectd ({e}): {reply}");
    let doc = json::parse(reply).map_err(malformed)?;
    let root = doc
        .as_object()
        .ok_or_else(|| malformed("not an object".into()))?;
    if let Some(e) = json::get(root, "error") {
        return Err(e
            .as_str()
            .unwrap_or("(error without a message)")
            .to_string());
    }
    let read = || -> Result<QosReply, String> {
        let generation = || json::u64_field(root, "generation");
        let persisted_to = || json::opt_string_field(root, "persisted_to");
        if let Some(p) = json::get(root, "policy") {
            Ok(QosReply::PolicyAdded {
                entry: policy_from_json(p)?,
                replaced: json::bool_field(root, "replaced")?,
                generation: generation()?,
                persisted_to: persisted_to()?,
            })
        } else if let Some(p) = json::get(root, "removed") {
            Ok(QosReply::PolicyRemoved {
                entry: policy_from_json(p)?,
                generation: generation()?,
                persisted_to: persisted_to()?,
            })
        } else if let Some(list) = json::get(root, "policies") {
            let items = list.as_array().ok_or("'policies' is not an array")?;
            Ok(QosReply::Policies {
                entries: items
                    .iter()
                    .map(policy_from_json)
                    .collect::<Result<_, _>>()?,
                generation: generation()?,
                policy_file: json::opt_string_field(root, "policy_file")?,
            })
        } else if let Some(list) = json::get(root, "flows") {
            let items = list.as_array().ok_or("'flows' is not an array")?;
            Ok(QosReply::Flows(
                items.iter().map(flow_from_json).collect::<Result<_, _>>()?,
            ))
        } else {
            Err("no result field".into())
        }
    };
    read().map_err(malformed)
}

fn guid_field(o: &[(String, json::Value)], key: &str) -> Result<Guid, String> {
    let s = json::string_field(o, key)?;
    s.parse().map_err(|e| format!("'{key}': {e}"))
}

fn policy_from_json(v: &json::Value) -> Result<PolicyEntry, String> {
    let o = v.as_object().ok_or("a policy is not an object")?;
    let kind = json::string_field(o, "type")?;
    Ok(PolicyEntry {
        id: guid_field(o, "id")?,
        name: json::opt_string_field(o, "name")?,
        policy: Policy {
            kind: parse_kind(&kind).ok_or_else(|| format!("unknown policy type '{kind}'"))?,
            minimum_iops: json::u64_field(o, "min_iops")?,
            maximum_iops: json::u64_field(o, "max_iops")?,
            maximum_bandwidth: json::u64_field(o, "max_bandwidth_kbps")?,
        },
    })
}

fn flow_from_json(v: &json::Value) -> Result<FlowRow, String> {
    let o = v.as_object().ok_or("a flow is not an object")?;
    let small = |key: &str| {
        json::u64_field(o, key)
            .and_then(|n| u32::try_from(n).map_err(|_| format!("'{key}' is too large")))
    };
    Ok(FlowRow {
        flow_id: guid_field(o, "flow_id")?,
        initiator_name: json::string_field(o, "initiator_name")?,
        initiator_node_name: json::string_field(o, "initiator_node_name")?,
        policy_id: match json::opt_string_field(o, "policy_id")? {
            Some(s) => Some(s.parse().map_err(|e| format!("'policy_id': {e}"))?),
            None => None,
        },
        policy_name: json::opt_string_field(o, "policy_name")?,
        limit_iops: json::u64_field(o, "limit_iops")?,
        reservation_iops: json::u64_field(o, "reservation_iops")?,
        bandwidth_limit_kbps: json::u64_field(o, "bandwidth_limit_kbps")?,
        iops: json::u64_field(o, "iops")?,
        kbps: json::u64_field(o, "kbps")?,
        latency_us: json::opt_f64_field(o, "latency_us")?.unwrap_or(f64::NAN),
        status: json::string_field(o, "status")?,
        opens: small("opens")?,
        workers: small("workers")?,
    })
}

/// Just enough of a JSON reader for the replies above: values, objects as
/// ordered key/value lists, numbers kept as text until a field is read.
mod json {
    /// A JSON value.
    #[derive(Debug, Clone, PartialEq)]
    pub enum Value {
        Null,
        Bool(bool),
        Number(String),
        String(String),
        Array(Vec<Value>),
        Object(Vec<(String, Value)>),
    }

    impl Value {
        pub fn as_object(&self) -> Option<&[(String, Value)]> {
            match self {
                Value::Object(o) => Some(o),
                _ => None,
            }
        }
        pub fn as_array(&self) -> Option<&[Value]> {
            match self {
                Value::Array(a) => Some(a),
                _ => None,
            }
        }
        pub fn as_str(&self) -> Option<&str> {
            match self {
                Value::String(s) => Some(s),
                _ => None,
            }
        }
    }

    pub fn get<'a>(o: &'a [(String, Value)], key: &str) -> Option<&'a Value> {
        o.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    fn field<'a>(o: &'a [(String, Value)], key: &str) -> Result<&'a Value, String> {
        get(o, key).ok_or_else(|| format!("'{key}' is missing"))
    }

    pub fn string_field(o: &[(String, Value)], key: &str) -> Result<String, String> {
        field(o, key)?
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("'{key}' is not a string"))
    }

    pub fn opt_string_field(o: &[(String, Value)], key: &str) -> Result<Option<String>, String> {
        match field(o, key)? {
            Value::Null => Ok(None),
            Value::String(s) => Ok(Some(s.clone())),
            _ => Err(format!("'{key}' is not a string or null")),
        }
    }

    pub fn u64_field(o: &[(String, Value)], key: &str) -> Result<u64, String> {
        match field(o, key)? {
            Value::Number(n) => n
                .parse()
                .map_err(|_| format!("'{key}' is not a non-negative integer: {n}")),
            _ => Err(format!("'{key}' is not a number")),
        }
    }

    pub fn opt_f64_field(o: &[(String, Value)], key: &str) -> Result<Option<f64>, String> {
        match field(o, key)? {
            Value::Null => Ok(None),
            Value::Number(n) => n
                .parse()
                .map(Some)
                .map_err(|_| format!("'{key}' is not a number: {n}")),
            _ => Err(format!("'{key}' is not a number or null")),
        }
    }

    pub fn bool_field(o: &[(String, Value)], key: &str) -> Result<bool, String> {
        match field(o, key)? {
            Value::Bool(b) => Ok(*b),
            _ => Err(format!("'{key}' is not true or false")),
        }
    }

    /// Deepest nesting accepted.
    const MAX_DEPTH: usize = 32;

    /// Parses one JSON document (surrounding blanks allowed).
    pub fn parse(text: &str) -> Result<Value, String> {
        let mut p = Parser {
            s: text.as_bytes(),
            i: 0,
        };
        let v = p.value(0)?;
        p.blanks();
        if p.i != p.s.len() {
            return Err(format!("trailing characters at byte {}", p.i));
        }
        Ok(v)
    }

    struct Parser<'a> {
        s: &'a [u8],
        i: usize,
    }

    impl Parser<'_> {
        fn blanks(&mut self) {
            while self.s.get(self.i).is_some_and(|b| b" \t\r\n".contains(b)) {
                self.i += 1;
            }
        }

        fn err<T>(&self, what: &str) -> Result<T, String> {
            if self.i >= self.s.len() {
                Err(format!("unexpected end, {what}"))
            } else {
                Err(format!("{what} at byte {}", self.i))
            }
        }

        fn eat(&mut self, b: u8) -> bool {
            if self.s.get(self.i) == Some(&b) {
                self.i += 1;
                true
            } else {
                false
            }
        }

        fn value(&mut self, depth: usize) -> Result<Value, String> {
            if depth > MAX_DEPTH {
                return self.err("nested too deeply");
            }
            self.blanks();
            match self.s.get(self.i) {
                Some(b'{') => {
                    self.i += 1;
                    let mut fields = Vec::new();
                    self.blanks();
                    if self.eat(b'}') {
                        return Ok(Value::Object(fields));
                    }
                    loop {
                        self.blanks();
                        if self.s.get(self.i) != Some(&b'"') {
                            return self.err("expected a key");
                        }
                        let k = self.string()?;
                        self.blanks();
                        if !self.eat(b':') {
                            return self.err("expected ':'");
                        }
                        let v = self.value(depth + 1)?;
                        fields.push((k, v));
                        self.blanks();
                        if self.eat(b'}') {
                            return Ok(Value::Object(fields));
                        }
                        if !self.eat(b',') {
                            return self.err("expected ',' or '}'");
                        }
                    }
                }
                Some(b'[') => {
                    self.i += 1;
                    let mut items = Vec::new();
                    self.blanks();
                    if self.eat(b']') {
                        return Ok(Value::Array(items));
                    }
                    loop {
                        items.push(self.value(depth + 1)?);
                        self.blanks();
                        if self.eat(b']') {
                            return Ok(Value::Array(items));
                        }
                        if !self.eat(b',') {
                            return self.err("expected ',' or ']'");
                        }
                    }
                }
                Some(b'"') => self.string().map(Value::String),
                Some(b'-' | b'0'..=b'9') => {
                    let start = self.i;
                    while self
                        .s
                        .get(self.i)
                        .is_some_and(|b| b"+-.eE0123456789".contains(b))
                    {
                        self.i += 1;
                    }
                    let n = std::str::from_utf8(&self.s[start..self.i]).unwrap_or("");
                    if n.parse::<f64>().is_err() {
                        self.i = start;
                        return self.err("bad number");
                    }
                    Ok(Value::Number(n.to_string()))
                }
                _ => {
                    for (word, v) in [
                        ("true", Value::Bool(true)),
                        ("false", Value::Bool(false)),
                        ("null", Value::Null),
                    ] {
                        if self.s[self.i.min(self.s.len())..].starts_with(word.as_bytes()) {
                            self.i += word.len();
                            return Ok(v);
                        }
                    }
                    self.err("expected a value")
                }
            }
        }

        /// A string; `self.i` is at its opening quote.
        fn string(&mut self) -> Result<String, String> {
            self.i += 1;
            let mut out = String::new();
            loop {
                let start = self.i;
                while self
                    .s
                    .get(self.i)
                    .is_some_and(|&b| b != b'"' && b != b'\\' && b >= 0x20)
                {
                    self.i += 1;
                }
                // The input is a &str and the run stops only at ASCII bytes,
                // so it is whole UTF-8.
                out.push_str(std::str::from_utf8(&self.s[start..self.i]).unwrap_or(""));
                match self.s.get(self.i) {
                    Some(b'"') => {
                        self.i += 1;
                        return Ok(out);
                    }
                    Some(b'\\') => {
                        self.i += 1;
                        let c = match self.s.get(self.i) {
                            Some(b'"') => '"',
                            Some(b'\\') => '\\',
                            Some(b'/') => '/',
                            Some(b'n') => '\n',
                            Some(b'r') => '\r',
                            Some(b't') => '\t',
                            Some(b'b') => '\u{8}',
                            Some(b'f') => '\u{c}',
                            Some(b'u') => {
                                self.i += 1;
                                let hi = self.hex4()?;
                                let code = if (0xD800..0xDC00).contains(&hi) {
                                    if !(self.eat(b'\\') && self.eat(b'u')) {
                                        return self.err("lone surrogate");
                                    }
                                    let lo = self.hex4()?;
                                    if !(0xDC00..0xE000).contains(&lo) {
                                        return self.err("lone surrogate");
                                    }
                                    0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                                } else {
                                    hi
                                };
                                match char::from_u32(code) {
                                    Some(c) => out.push(c),
                                    None => return self.err("lone surrogate"),
                                }
                                continue;
                            }
                            _ => return self.err("bad escape"),
                        };
                        out.push(c);
                        self.i += 1;
                    }
                    _ => return self.err("unterminated string"),
                }
            }
        }

        fn hex4(&mut self) -> Result<u32, String> {
            let digits = self
                .s
                .get(self.i..self.i + 4)
                .and_then(|d| std::str::from_utf8(d).ok())
                .and_then(|d| u32::from_str_radix(d, 16).ok());
            match digits {
                Some(v) => {
                    self.i += 4;
                    Ok(v)
                }
                None => self.err("bad \\u escape"),
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Tables (the CLI side).

/// The policies as a table: PolicyId, Name, Type, MinIOPS, MaxIOPS, MaxKB/s.
pub fn render_policies_table(entries: &[PolicyEntry]) -> String {
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            let p = &e.policy;
            vec![
                format!("{:#}", e.id),
                e.name.as_deref().map_or("-".into(), cell),
                kind_name(p.kind).into(),
                p.minimum_iops.to_string(),
                p.maximum_iops.to_string(),
                p.maximum_bandwidth.to_string(),
            ]
        })
        .collect();
    render_table(
        &[
            ("PolicyId", false),
            ("Name", false),
            ("Type", false),
            ("MinIOPS", true),
            ("MaxIOPS", true),
            ("MaxKB/s", true),
        ],
        &rows,
    )
}

/// The flows as a table in the manner of Windows' `Get-StorageQosFlow`:
/// FlowId, InitiatorName, InitiatorNodeName, PolicyId, Status, IOPS, KB/s,
/// Latency(us), Limit, Reservation.
pub fn render_flows_table(rows: &[FlowRow]) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|f| {
            vec![
                format!("{:#}", f.flow_id),
                cell(&f.initiator_name),
                cell(&f.initiator_node_name),
                f.policy_id.map_or("-".into(), |id| format!("{id:#}")),
                cell(&f.status),
                f.iops.to_string(),
                f.kbps.to_string(),
                if f.latency_us.is_finite() {
                    format!("{:.1}", f.latency_us)
                } else {
                    "-".into()
                },
                f.limit_iops.to_string(),
                f.reservation_iops.to_string(),
            ]
        })
        .collect();
    render_table(
        &[
            ("FlowId", false),
            ("InitiatorName", false),
            ("InitiatorNodeName", false),
            ("PolicyId", false),
            ("Status", false),
            ("IOPS", true),
            ("KB/s", true),
            ("Latency(us)", true),
            ("Limit", true),
            ("Reservation", true),
        ],
        &cells,
    )
}

/// A peer-supplied string made safe for a terminal: control characters
/// become U+FFFD; an empty string becomes `-`.
fn cell(s: &str) -> String {
    if s.is_empty() {
        return "-".into();
    }
    s.chars()
        .map(|c| if c.is_control() { '\u{fffd}' } else { c })
        .collect()
}

/// Columns `(header, right_aligned)`, two blanks apart, headers underlined
/// with dashes; no trailing blanks, no final newline.
fn render_table(columns: &[(&str, bool)], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = columns.iter().map(|(h, _)| h.chars().count()).collect();
    for row in rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = String>| {
        let mut l = String::new();
        for (i, (c, (w, (_, right)))) in cells.zip(widths.iter().zip(columns)).enumerate() {
            if i > 0 {
                l.push_str("  ");
            }
            let pad = w.saturating_sub(c.chars().count());
            if *right {
                l.push_str(&" ".repeat(pad));
                l.push_str(&c);
            } else {
                l.push_str(&c);
                l.push_str(&" ".repeat(pad));
            }
        }
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(l.trim_end());
    };
    line(&mut columns.iter().map(|(h, _)| h.to_string()));
    line(&mut widths.clone().into_iter().map(|w| "-".repeat(w)));
    for row in rows {
        line(&mut row.iter().cloned());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use smbdirect_protocol::sqos::server::PolicyLookup;

    const GOLD: &str = "8d7f0c7e-2f9b-4c58-9a35-1d3c5e6f7a81";
    const FLOW: &str = "b13a32e4-e2ad-5db2-a4f8-5cd3be9d696e";

    fn gold_entry() -> PolicyEntry {
        PolicyEntry {
            id: GOLD.parse().unwrap(),
            name: Some("gold".into()),
            policy: Policy {
                kind: PolicyKind::Dedicated,
                minimum_iops: 1000,
                maximum_iops: 5000,
                maximum_bandwidth: 0,
            },
        }
    }

    fn flow() -> FlowRow {
        FlowRow {
            flow_id: FLOW.parse().unwrap(),
            initiator_name: "vm\"01\"\n".into(),
            initiator_node_name: "host-a".into(),
            policy_id: Some(GOLD.parse().unwrap()),
            policy_name: Some("gold".into()),
            limit_iops: 5000,
            reservation_iops: 1000,
            bandwidth_limit_kbps: 0,
            iops: 4321,
            kbps: 34568,
            latency_us: 250.25,
            status: "Ok".into(),
            opens: 2,
            workers: 1,
        }
    }

    fn parse(line: &str) -> Result<QosRequest, String> {
        QosRequest::parse(line).expect("a qos line")
    }

    #[test]
    fn lines_that_are_not_qos_commands_are_left_alone() {
        let mut store = PolicyStore::new();
        assert_eq!(handle("stats", &mut store, &[]), None);
        assert_eq!(handle("", &mut store, &[]), None);
        assert_eq!(handle("qosx policy list", &mut store, &[]), None);
    }

    #[test]
    fn add_line_parses_every_option_in_any_order() {
        assert_eq!(
            parse(&format!(
                "qos policy add {{{GOLD}}} --max-iops 5000 --name gold --type Dedicated --min-iops 1000"
            )),
            Ok(QosRequest::PolicyAdd {
                entry: gold_entry(),
                replace: false
            })
        );
        let r = parse(&format!(
            "qos  policy add {GOLD} --type aggregated --max-bandwidth-kbps 2048 --replace --name \"gold \\\"tier\\\" 1\""
        ))
        .unwrap();
        let QosRequest::PolicyAdd { entry, replace } = r else {
            panic!("{r:?}")
        };
        assert!(replace);
        assert_eq!(entry.name.as_deref(), Some("gold \"tier\" 1"));
        assert_eq!(entry.policy.kind, PolicyKind::Aggregated);
        assert_eq!(
            (
                entry.policy.minimum_iops,
                entry.policy.maximum_iops,
                entry.policy.maximum_bandwidth
            ),
            (0, 0, 2048)
        );
    }

    #[test]
    fn add_line_errors_say_what_is_wrong() {
        let usage = USAGE_ADD;
        assert_eq!(
            parse("qos policy add --type dedicated"),
            Err(format!("the policy ID is missing; {usage}"))
        );
        assert_eq!(
            parse("qos policy add gold --type dedicated"),
            Err(format!("'gold' is not a policy ID: GUID must be 36 characters (38 with braces), got 4: expected xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx; {usage}"))
        );
        assert_eq!(
            parse(&format!("qos policy add {GOLD}")),
            Err(format!("--type is missing; {usage}"))
        );
        assert_eq!(
            parse(&format!("qos policy add {GOLD} --type shared")),
            Err("--type: unknown type 'shared' (expected dedicated or aggregated)".into())
        );
        assert_eq!(
            parse(&format!(
                "qos policy add {GOLD} --type dedicated --min-iops -5"
            )),
            Err("--min-iops: '-5' is not a non-negative integer".into())
        );
        assert_eq!(
            parse(&format!(
                "qos policy add {GOLD} --type dedicated --max-iops"
            )),
            Err(format!("--max-iops needs a value; {usage}"))
        );
        assert_eq!(
            parse(&format!(
                "qos policy add {GOLD} --type dedicated --type aggregated"
            )),
            Err(format!("--type is given twice; {usage}"))
        );
        assert_eq!(
            parse(&format!("qos policy add {GOLD} --type dedicated --limit 5")),
            Err(format!("unknown option '--limit'; {usage}"))
        );
        assert_eq!(
            parse(&format!("qos policy add {GOLD} --type dedicated extra")),
            Err(format!("unexpected word 'extra'; {usage}"))
        );
        assert_eq!(
            parse(&format!(
                "qos policy add {GOLD} --type dedicated --name \"gold"
            )),
            Err("unterminated quoted word (a '\"' is missing)".into())
        );
    }

    #[test]
    fn remove_list_and_flows_lines_parse() {
        assert_eq!(
            parse(&format!("qos policy remove {GOLD}")),
            Ok(QosRequest::PolicyRemove {
                id: GOLD.parse().unwrap()
            })
        );
        assert_eq!(parse("qos policy remove"), Err(USAGE_REMOVE.into()));
        assert_eq!(
            parse(&format!("qos policy remove {GOLD} {GOLD}")),
            Err(USAGE_REMOVE.into())
        );
        assert_eq!(parse("qos policy list"), Ok(QosRequest::PolicyList));
        assert_eq!(parse("qos policy list --json"), Ok(QosRequest::PolicyList));
        assert_eq!(parse("qos policy list --table"), Err(USAGE_LIST.into()));
        assert_eq!(parse("qos flows"), Ok(QosRequest::Flows));
        assert_eq!(parse("qos flows --json"), Ok(QosRequest::Flows));
        assert_eq!(parse("qos flows all"), Err(USAGE_FLOWS.into()));
        assert_eq!(parse("qos"), Err(USAGE.into()));
        assert_eq!(
            parse("qos policies"),
            Err(format!("unknown qos command 'policies'; {USAGE}"))
        );
        assert_eq!(
            parse("qos policy delete x"),
            Err(format!("unknown qos policy command 'delete'; {USAGE}"))
        );
    }

    #[test]
    fn to_line_is_read_back_as_the_same_request() {
        let mut odd = gold_entry();
        odd.name = Some("a \"quoted\" \\ name".into());
        for r in [
            QosRequest::PolicyAdd {
                entry: gold_entry(),
                replace: false,
            },
            QosRequest::PolicyAdd {
                entry: odd,
                replace: true,
            },
            QosRequest::PolicyAdd {
                entry: PolicyEntry {
                    name: None,
                    ..gold_entry()
                },
                replace: false,
            },
            QosRequest::PolicyRemove {
                id: GOLD.parse().unwrap(),
            },
            QosRequest::PolicyList,
            QosRequest::Flows,
        ] {
            assert_eq!(parse(&r.to_line()), Ok(r.clone()), "{}", r.to_line());
        }
    }

    #[test]
    fn json_strings_escape_quotes_backslashes_and_control_characters() {
        let mut out = String::new();
        push_json_string(&mut out, "a\"b\\c\nd\te\u{1}f\u{7f}é");
        assert_eq!(out, r#""a\"b\\c\nd\te\u0001f"#.to_string() + "\u{7f}é\"");
        // And the reader gives the original back.
        assert_eq!(
            json::parse(&out).unwrap(),
            json::Value::String("a\"b\\c\nd\te\u{1}f\u{7f}é".into())
        );
        assert_eq!(
            json::parse(r#""\ud83d\ude00 \u00e9""#).unwrap(),
            json::Value::String("😀 é".into())
        );
        assert!(json::parse(r#""\ud83d""#).is_err());
        assert!(json::parse(&"[".repeat(100)).is_err());
        assert!(json::parse("{\"a\":1} x").is_err());
    }

    #[test]
    fn add_list_remove_through_handle() {
        let mut store = PolicyStore::new();
        let add = QosRequest::PolicyAdd {
            entry: gold_entry(),
            replace: false,
        }
        .to_line();
        let reply = handle(&add, &mut store, &[]).unwrap();
        assert_eq!(
            reply,
            format!("{{\"ok\":true,\"generation\":1,\"replaced\":false,\"persisted_to\":null,\"policy\":{{\"id\":\"{GOLD}\",\"name\":\"gold\",\"type\":\"dedicated\",\"min_iops\":1000,\"max_iops\":5000,\"max_bandwidth_kbps\":0}}}}")
        );
        assert_eq!(
            parse_reply(&reply),
            Ok(QosReply::PolicyAdded {
                entry: gold_entry(),
                replaced: false,
                generation: 1,
                persisted_to: None
            })
        );
        assert_eq!(
            store.lookup(&GOLD.parse().unwrap()),
            Some(gold_entry().policy)
        );
        // A second add of the same ID is refused; --replace replaces.
        let again = handle(&add, &mut store, &[]).unwrap();
        assert_eq!(
            parse_reply(&again),
            Err(format!(
                "policy {GOLD} already exists (remove it first, or replace it)"
            ))
        );
        let replace = handle(&format!("{add} --replace"), &mut store, &[]).unwrap();
        assert!(matches!(
            parse_reply(&replace),
            Ok(QosReply::PolicyAdded {
                replaced: true,
                generation: 2,
                ..
            })
        ));
        let list = handle("qos policy list --json", &mut store, &[]).unwrap();
        assert_eq!(
            parse_reply(&list),
            Ok(QosReply::Policies {
                entries: vec![gold_entry()],
                generation: 2,
                policy_file: None
            })
        );
        let removed = handle(&format!("qos policy remove {{{GOLD}}}"), &mut store, &[]).unwrap();
        assert_eq!(
            parse_reply(&removed),
            Ok(QosReply::PolicyRemoved {
                entry: gold_entry(),
                generation: 3,
                persisted_to: None
            })
        );
        assert!(store.is_empty());
        assert_eq!(
            parse_reply(&handle(&format!("qos policy remove {GOLD}"), &mut store, &[]).unwrap()),
            Err(format!("no policy {GOLD}"))
        );
    }

    #[test]
    fn add_with_min_above_max_is_kept_as_a_configuration_mismatch() {
        let mut store = PolicyStore::new();
        let reply = handle(
            &format!("qos policy add {GOLD} --type dedicated --min-iops 10 --max-iops 5"),
            &mut store,
            &[],
        )
        .unwrap();
        let Ok(QosReply::PolicyAdded { entry, .. }) = parse_reply(&reply) else {
            panic!("{reply}")
        };
        assert!(entry
            .mismatch()
            .is_some_and(|w| w.contains("configuration mismatch")));
        assert_eq!(store.len(), 1);
        assert_eq!(store.warnings().len(), 1);
    }

    #[test]
    fn changes_are_written_to_the_backing_file_or_not_made() {
        let dir = std::env::temp_dir().join(format!("smbdirectd-qos-admin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("policies.toml");
        let mut store = PolicyStore::new();
        store.set_backing_file(Some(path.clone()));
        let add = QosRequest::PolicyAdd {
            entry: gold_entry(),
            replace: false,
        }
        .to_line();
        let reply = handle(&add, &mut store, &[]).unwrap();
        let Ok(QosReply::PolicyAdded { persisted_to, .. }) = parse_reply(&reply) else {
            panic!("{reply}")
        };
        assert_eq!(persisted_to.as_deref(), Some(path.to_str().unwrap()));
        assert_eq!(PolicyStore::load(&path).unwrap().list(), &[gold_entry()]);

        // A backing file that cannot be written: the change is not made.
        let mut stuck = PolicyStore::new();
        stuck.set_backing_file(Some(dir.join("missing-dir/policies.toml")));
        let reply = handle(&add, &mut stuck, &[]).unwrap();
        let err = parse_reply(&reply).unwrap_err();
        assert!(
            err.starts_with(&format!(
                "policy {GOLD} not added: cannot write policy file "
            )),
            "{err}"
        );
        assert!(stuck.is_empty());
        assert_eq!(stuck.generation(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn flows_reply_round_trips_and_escapes_peer_names() {
        let mut store = PolicyStore::new();
        let mut unmeasured = flow();
        unmeasured.policy_id = None;
        unmeasured.policy_name = None;
        unmeasured.latency_us = f64::NAN;
        unmeasured.status = status_name(FlowStatus::NotAvailable);
        let reply = handle("qos flows", &mut store, &[flow(), unmeasured.clone()]).unwrap();
        assert!(!reply.contains('\n'));
        assert!(reply.starts_with(&format!(
            "{{\"ok\":true,\"flows\":[{{\"flow_id\":\"{FLOW}\",\"initiator_name\":\"vm\\\"01\\\"\\n\",\"initiator_node_name\":\"host-a\",\"policy_id\":\"{GOLD}\",\"policy_name\":\"gold\",\"limit_iops\":5000,\"reservation_iops\":1000,\"bandwidth_limit_kbps\":0,\"iops\":4321,\"kbps\":34568,\"latency_us\":250.2,\"status\":\"Ok\",\"opens\":2,\"workers\":1}}"
        )), "{reply}");
        let Ok(QosReply::Flows(rows)) = parse_reply(&reply) else {
            panic!("{reply}")
        };
        assert_eq!(rows.len(), 2);
        let mut expected = flow();
        expected.latency_us = 250.2;
        assert_eq!(rows[0], expected);
        assert_eq!(rows[1].policy_id, None);
        assert!(rows[1].latency_us.is_nan());
        assert_eq!(rows[1].status, "NotAvailable");
    }

    #[test]
    fn error_replies_carry_the_message() {
        assert_eq!(
            error_reply("bad \"thing\""),
            r#"{"ok":false,"error":"bad \"thing\""}"#
        );
        // What a daemon without qos support answers.
        assert_eq!(
            parse_reply(r#"{"error":"unknown request 'qos flows'"}"#),
            Err("unknown request 'qos flows'".into())
        );
        let e = parse_reply("").unwrap_err();
        assert!(e.starts_with("malformed reply from smbdirectd"), "{e}");
        let e = parse_reply(r#"{"ok":true,"flows":[{"flow_id":"x"}]}"#).unwrap_err();
        assert!(e.contains("'flow_id'"), "{e}");
    }

    #[test]
    fn flows_table_looks_like_get_storageqosflow() {
        let mut unmeasured = flow();
        unmeasured.flow_id = GOLD.parse().unwrap();
        unmeasured.initiator_name = String::new();
        unmeasured.policy_id = None;
        unmeasured.latency_us = f64::NAN;
        unmeasured.status = "NotAvailable".into();
        unmeasured.iops = 0;
        unmeasured.kbps = 0;
        let t = render_flows_table(&[flow(), unmeasured]);
        let expected = [
            "FlowId                                InitiatorName  InitiatorNodeName  PolicyId                              Status        IOPS   KB/s  Latency(us)  Limit  Reservation",
            "------------------------------------  -------------  -----------------  ------------------------------------  ------------  ----  -----  -----------  -----  -----------",
            "b13a32e4-e2ad-5db2-a4f8-5cd3be9d696e  vm\"01\"\u{fffd}        host-a             8d7f0c7e-2f9b-4c58-9a35-1d3c5e6f7a81  Ok            4321  34568        250.2   5000         1000",
            "8d7f0c7e-2f9b-4c58-9a35-1d3c5e6f7a81  -              host-a             -                                     NotAvailable     0      0            -   5000         1000",
        ]
        .join("\n");
        assert_eq!(t, expected, "\n{t}");
    }

    #[test]
    fn policies_table_lists_every_policy() {
        let mut silver = gold_entry();
        silver.id = FLOW.parse().unwrap();
        silver.name = None;
        silver.policy.kind = PolicyKind::Aggregated;
        silver.policy.maximum_bandwidth = 1024;
        let t = render_policies_table(&[gold_entry(), silver]);
        let expected = [
            "PolicyId                              Name  Type        MinIOPS  MaxIOPS  MaxKB/s",
            "------------------------------------  ----  ----------  -------  -------  -------",
            "8d7f0c7e-2f9b-4c58-9a35-1d3c5e6f7a81  gold  dedicated      1000     5000        0",
            "b13a32e4-e2ad-5db2-a4f8-5cd3be9d696e  -     aggregated     1000     5000     1024",
        ]
        .join("\n");
        assert_eq!(t, expected, "\n{t}");
        assert_eq!(
            render_policies_table(&[]),
            "PolicyId  Name  Type  MinIOPS  MaxIOPS  MaxKB/s\n--------  ----  ----  -------  -------  -------"
        );
    }
}
