//! The Storage QoS policy store: the policies a PolicyID ([MS-SQOS] 2.2.2.2)
//! can name, as the operator configured them. The control plane owns one
//! [`PolicyStore`]; the [MS-SQOS] 3.2 server logic reads it through
//! [`PolicyLookup`], and the admin socket changes it
//! ([`crate::qos_admin`]). Every change bumps [`PolicyStore::generation`],
//! which is how the control plane knows to re-allocate rates.
//!
//! # Policy file
//!
//! A TOML file (`serve --policy-file PATH`), one `[[policy]]` table per
//! policy and nothing else:
//!
//! ```toml
//! [[policy]]
//! id = "8d7f0c7e-2f9b-4c58-9a35-1d3c5e6f7a81"   # PolicyID ([MS-SQOS] 2.2.2.2)
//! name = "gold"                                 # optional
//! type = "dedicated"                            # or "aggregated"
//! min_iops = 1000                               # normalized IOPS, 8 KiB (BaseIoSize 8192)
//! max_iops = 5000                               # 0 = unlimited
//! max_bandwidth_kbps = 0                        # KB/s, KB = 1024 bytes; 0 = unlimited
//! ```
//!
//! - `id` (required): the GUID, with or without braces, any case. The NULL
//!   GUID is refused: a flow with a NULL PolicyID has no policy.
//! - `type` (required): `dedicated` (every flow gets the full limits) or
//!   `aggregated` (the flows naming the policy share them); any case.
//! - `min_iops`, `max_iops`, `max_bandwidth_kbps` (optional, default 0):
//!   integers from 0 to [`MAX_POLICY_VALUE`]; 0 means "not defined".
//!   `min_iops` above a non-zero `max_iops` is a configuration mismatch: the
//!   policy is accepted with a warning, its flows get `max_iops` and no
//!   reservation, and report StorageQoSStatusConfigurationMismatch
//!   ([MS-SQOS] 2.2.2.1; docs/spec-notes.md, "Configuration mismatch").
//! - `name` (optional): for operators only, 1 to [`MAX_NAME_CHARS`]
//!   characters, no control characters.
//!
//! Any other key, a repeated `id`, a negative or non-integer number, or an
//! unknown `type` is an error that names the file, the line and the field.
//! An empty file is an empty store.
//!
//! A store loaded from a file remembers it ([`PolicyStore::backing_file`]);
//! [`PolicyStore::persist`] rewrites it, atomically, in the same format.
//! Comments and layout of the original are not kept. `docs/qos.md` has the
//! operator's view of all this.

use std::fmt::Write as _;
use std::io::Write as _;
use std::ops::Range;
use std::path::{Path, PathBuf};

use smbdirect_protocol::sqos::server::{Policy, PolicyKind, PolicyLookup};
use smbdirect_protocol::sqos::Guid;
use toml::de::{DeTable, DeValue};
use toml::Spanned;

/// Largest `min_iops`, `max_iops` and `max_bandwidth_kbps` accepted: the
/// bound Windows puts on Limit and Reservation ([MS-SQOS] note <8>), also
/// the default `ServerConfig::max_policy_value` of the flow table.
pub const MAX_POLICY_VALUE: u64 = 1_000_000_000;

/// Longest policy name, in characters.
pub const MAX_NAME_CHARS: usize = 256;

/// The keys a `[[policy]]` table may have.
const POLICY_KEYS: [&str; 6] = [
    "id",
    "name",
    "type",
    "min_iops",
    "max_iops",
    "max_bandwidth_kbps",
];

/// One policy: its PolicyID, an optional name for operators, and the limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyEntry {
    /// PolicyID ([MS-SQOS] 2.2.2.2); never NULL.
    pub id: Guid,
    /// Operator's name ("gold"); not used by the protocol.
    pub name: Option<String>,
    /// Kind and limits.
    pub policy: Policy,
}

impl PolicyEntry {
    /// Checks what the policy file's loader checks beyond syntax: a non-NULL
    /// id, values within [`MAX_POLICY_VALUE`] and a printable name. A
    /// minimum above the maximum is not an error but a
    /// [`PolicyEntry::mismatch`].
    pub fn validate(&self) -> Result<(), String> {
        if self.id.is_null() {
            return Err("the NULL GUID cannot name a policy (a NULL PolicyID means no policy, [MS-SQOS] 2.2.2.2)".into());
        }
        if let Some(name) = &self.name {
            check_name(name)?;
        }
        let p = &self.policy;
        for (field, v) in [
            ("min_iops", p.minimum_iops),
            ("max_iops", p.maximum_iops),
            ("max_bandwidth_kbps", p.maximum_bandwidth),
        ] {
            if v > MAX_POLICY_VALUE {
                return Err(format!(
                    "{field} {v} is above the largest accepted value {MAX_POLICY_VALUE}"
                ));
            }
        }
        Ok(())
    }

    /// The operator's warning for a policy that cannot be applied as
    /// written: a `minimum_iops` above a defined `maximum_iops` can never be
    /// met. Such a policy is kept; its flows are limited to the maximum, get
    /// no reservation, and report StorageQoSStatusConfigurationMismatch
    /// ([MS-SQOS] 2.2.2.1: "doesn't support one or more of the requested
    /// parameters").
    pub fn mismatch(&self) -> Option<String> {
        let p = &self.policy;
        p.is_mismatched().then(|| {
            format!(
                "policy {:#}: min_iops {} is above max_iops {}: configuration mismatch; its flows are limited to max_iops {}, get no reservation and report StorageQoSStatusConfigurationMismatch (max_iops 0 means no maximum)",
                self.id, p.minimum_iops, p.maximum_iops, p.maximum_iops
            )
        })
    }
}

fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("name is empty (leave it out for no name)".into());
    }
    if name.chars().count() > MAX_NAME_CHARS {
        return Err(format!("name is longer than {MAX_NAME_CHARS} characters"));
    }
    if name.chars().any(char::is_control) {
        return Err("name contains a control character".into());
    }
    Ok(())
}

/// The lower-case word the policy file and the admin socket use for a kind.
pub fn kind_name(kind: PolicyKind) -> &'static str {
    match kind {
        PolicyKind::Dedicated => "dedicated",
        PolicyKind::Aggregated => "aggregated",
    }
}

/// `dedicated` or `aggregated`, in any case.
pub fn parse_kind(s: &str) -> Option<PolicyKind> {
    if s.eq_ignore_ascii_case("dedicated") {
        Some(PolicyKind::Dedicated)
    } else if s.eq_ignore_ascii_case("aggregated") {
        Some(PolicyKind::Aggregated)
    } else {
        None
    }
}

/// The policies, in file order and then in the order they were added.
///
/// Lookups are linear: a store holds the handful of policies an operator
/// configures, and only the control plane reads it.
#[derive(Debug, Clone, Default)]
pub struct PolicyStore {
    entries: Vec<PolicyEntry>,
    generation: u64,
    backing_file: Option<PathBuf>,
}

impl PolicyStore {
    /// An empty store with no backing file.
    pub fn new() -> Self {
        PolicyStore::default()
    }

    /// Reads the policy file at `path`; the store remembers `path` as its
    /// backing file. Errors name the file, the line and the field.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read policy file {}: {e}", path.display()))?;
        let mut store = PolicyStore::parse(&text, &path.display().to_string())?;
        store.backing_file = Some(path.to_path_buf());
        Ok(store)
    }

    /// Parses policy-file text; `origin` (a file name) starts every error
    /// message. The store has no backing file.
    pub fn parse(text: &str, origin: &str) -> Result<Self, String> {
        let doc = DeTable::parse(text).map_err(|e| {
            let (line, col) = e
                .span()
                .map_or((1, 1), |s| line_col(text, s.start.min(text.len())));
            format!(
                "{origin}:{line}:{col}: not valid TOML: {}",
                e.message().trim_end()
            )
        })?;
        let at = |span: Range<usize>| line_col(text, span.start.min(text.len())).0;
        let root = doc.get_ref();
        let mut keys: Vec<_> = root.iter().collect();
        keys.sort_by_key(|(k, _)| k.span().start);
        let mut tables: &[Spanned<DeValue<'_>>] = &[];
        for (key, value) in keys {
            if key.get_ref() != "policy" {
                return Err(format!(
                    "{origin}:{}: unknown key '{}' (the file holds only [[policy]] tables)",
                    at(key.span()),
                    key.get_ref()
                ));
            }
            match value.get_ref() {
                DeValue::Array(a) => tables = a,
                other => {
                    return Err(format!(
                        "{origin}:{}: 'policy' must be an array of tables ([[policy]]), not a {}",
                        at(key.span()),
                        other.type_str()
                    ))
                }
            }
        }
        let mut store = PolicyStore::new();
        let mut defined_at: Vec<usize> = Vec::new();
        for (i, table) in tables.iter().enumerate() {
            let n = i + 1;
            let line = at(table.span());
            let DeValue::Table(t) = table.get_ref() else {
                return Err(format!(
                    "{origin}:{line}: [[policy]] #{n}: must be a table, not a {}",
                    table.get_ref().type_str()
                ));
            };
            let entry = parse_entry(t, n, line, origin, &at)?;
            if let Some(j) = store.entries.iter().position(|e| e.id == entry.id) {
                let id_line = t.get("id").map_or(line, |v| at(v.span()));
                return Err(format!(
                    "{origin}:{id_line}: [[policy]] #{n} id: {:#} is already defined by [[policy]] #{} at line {}",
                    entry.id,
                    j + 1,
                    defined_at[j]
                ));
            }
            defined_at.push(line);
            store.entries.push(entry);
        }
        Ok(store)
    }

    /// The warnings of the policies that cannot be applied as written
    /// ([`PolicyEntry::mismatch`]), one line each, for the operator's log.
    pub fn warnings(&self) -> Vec<String> {
        self.entries
            .iter()
            .filter_map(PolicyEntry::mismatch)
            .collect()
    }

    /// Adds `entry`. A policy with the same id is an error (use
    /// [`PolicyStore::replace`] to change one), and so is an entry that
    /// [`PolicyEntry::validate`] refuses. Bumps the generation.
    pub fn add(&mut self, entry: PolicyEntry) -> Result<(), String> {
        entry.validate()?;
        if self.get(&entry.id).is_some() {
            return Err(format!(
                "policy {:#} already exists (remove it first, or replace it)",
                entry.id
            ));
        }
        self.entries.push(entry);
        self.generation += 1;
        Ok(())
    }

    /// Adds `entry`, or replaces the policy with its id in place (keeping its
    /// position); returns the replaced one. Bumps the generation.
    pub fn replace(&mut self, entry: PolicyEntry) -> Result<Option<PolicyEntry>, String> {
        entry.validate()?;
        self.generation += 1;
        match self.entries.iter_mut().find(|e| e.id == entry.id) {
            Some(slot) => Ok(Some(std::mem::replace(slot, entry))),
            None => {
                self.entries.push(entry);
                Ok(None)
            }
        }
    }

    /// Removes the policy `id` names and returns it. Bumps the generation.
    /// Flows that name it report StorageQoSUnknownPolicyId from then on.
    pub fn remove(&mut self, id: &Guid) -> Result<PolicyEntry, String> {
        let i = self
            .entries
            .iter()
            .position(|e| e.id == *id)
            .ok_or_else(|| format!("no policy {id:#}"))?;
        self.generation += 1;
        Ok(self.entries.remove(i))
    }

    /// All policies, in file order and then in the order they were added.
    pub fn list(&self) -> &[PolicyEntry] {
        &self.entries
    }

    /// The policy `id` names.
    pub fn get(&self, id: &Guid) -> Option<&PolicyEntry> {
        self.entries.iter().find(|e| e.id == *id)
    }

    /// Number of policies.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when the store holds no policy.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bumped by every change (add, replace, remove); 0 for a new or freshly
    /// loaded store.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The file [`PolicyStore::persist`] writes: the one the store was
    /// loaded from, or the one set with [`PolicyStore::set_backing_file`].
    pub fn backing_file(&self) -> Option<&Path> {
        self.backing_file.as_deref()
    }

    /// Sets (or clears) the backing file.
    pub fn set_backing_file(&mut self, path: Option<PathBuf>) {
        self.backing_file = path;
    }

    /// Writes the store to its backing file, if it has one.
    pub fn persist(&self) -> Result<(), String> {
        match &self.backing_file {
            Some(p) => self.save(p),
            None => Ok(()),
        }
    }

    /// The store in the policy-file format.
    pub fn to_toml(&self) -> String {
        let mut out = String::from(
            "# Storage QoS policies ([MS-SQOS]) of smbdirectd; format: docs/qos.md.\n\
             # Rewritten by smbdirectd when policies change at run time.\n",
        );
        for e in &self.entries {
            let p = &e.policy;
            out.push_str("\n[[policy]]\n");
            let _ = writeln!(out, "id = \"{:#}\"", e.id);
            if let Some(name) = &e.name {
                out.push_str("name = ");
                push_toml_string(&mut out, name);
                out.push('\n');
            }
            let _ = writeln!(out, "type = \"{}\"", kind_name(p.kind));
            let _ = writeln!(out, "min_iops = {}", p.minimum_iops);
            let _ = writeln!(out, "max_iops = {}", p.maximum_iops);
            let _ = writeln!(out, "max_bandwidth_kbps = {}", p.maximum_bandwidth);
        }
        out
    }

    /// Writes the store to `path` atomically: a temporary file in the same
    /// directory, synced, then renamed over `path` (which keeps its
    /// permissions). A reader sees the old file or the new one, never half.
    pub fn save(&self, path: &Path) -> Result<(), String> {
        let file_name = path.file_name().ok_or_else(|| {
            format!(
                "cannot write policy file {}: not a file name",
                path.display()
            )
        })?;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let tmp = dir.join(format!(
            ".{}.tmp-{}",
            file_name.to_string_lossy(),
            std::process::id()
        ));
        let fail = |what: &str, e: std::io::Error| {
            let _ = std::fs::remove_file(&tmp);
            format!("cannot write policy file {}: {what}: {e}", path.display())
        };
        let mut f = std::fs::File::create(&tmp)
            .map_err(|e| fail(&format!("create {}", tmp.display()), e))?;
        if let Ok(meta) = std::fs::metadata(path) {
            let _ = f.set_permissions(meta.permissions());
        }
        f.write_all(self.to_toml().as_bytes())
            .map_err(|e| fail("write", e))?;
        f.sync_all().map_err(|e| fail("sync", e))?;
        drop(f);
        std::fs::rename(&tmp, path).map_err(|e| fail("rename", e))?;
        // The rename is durable once the directory is synced; best effort.
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

impl PolicyLookup for PolicyStore {
    fn lookup(&self, policy_id: &Guid) -> Option<Policy> {
        self.get(policy_id).map(|e| e.policy)
    }
}

/// One `[[policy]]` table (number `n`, starting at `line`) to an entry.
fn parse_entry(
    t: &DeTable<'_>,
    n: usize,
    line: usize,
    origin: &str,
    at: &dyn Fn(Range<usize>) -> usize,
) -> Result<PolicyEntry, String> {
    let mut keys: Vec<_> = t.iter().collect();
    keys.sort_by_key(|(k, _)| k.span().start);
    for (key, _) in &keys {
        if !POLICY_KEYS.contains(&key.get_ref().as_ref()) {
            return Err(format!(
                "{origin}:{}: [[policy]] #{n}: unknown key '{}' (known keys: {})",
                at(key.span()),
                key.get_ref(),
                POLICY_KEYS.join(", ")
            ));
        }
    }
    let field_err = |field: &str, v: &Spanned<DeValue<'_>>, msg: String| {
        format!("{origin}:{}: [[policy]] #{n} {field}: {msg}", at(v.span()))
    };
    let string = |field: &str| -> Result<Option<(&str, &Spanned<DeValue<'_>>)>, String> {
        match t.get(field) {
            None => Ok(None),
            Some(v) => match v.get_ref() {
                DeValue::String(s) => Ok(Some((s.as_ref(), v))),
                other => Err(field_err(
                    field,
                    v,
                    format!("must be a string, not a {}", other.type_str()),
                )),
            },
        }
    };
    let integer = |field: &str| -> Result<u64, String> {
        let Some(v) = t.get(field) else {
            return Ok(0);
        };
        match v.get_ref() {
            DeValue::Integer(i) => match i128::from_str_radix(i.as_str(), i.radix()) {
                Ok(x) if x < 0 => Err(field_err(
                    field,
                    v,
                    format!("must not be negative, got {x}"),
                )),
                Ok(x) if x > i128::from(MAX_POLICY_VALUE) => Err(field_err(
                    field,
                    v,
                    format!("{x} is above the largest accepted value {MAX_POLICY_VALUE}"),
                )),
                Ok(x) => Ok(x as u64),
                Err(_) => Err(field_err(field, v, format!("'{i}' is not an integer"))),
            },
            DeValue::Float(f) => Err(field_err(
                field,
                v,
                format!("must be a non-negative integer, got the float {f}"),
            )),
            other => Err(field_err(
                field,
                v,
                format!("must be a non-negative integer, not a {}", other.type_str()),
            )),
        }
    };
    let (id_text, id_value) = string("id")?
        .ok_or_else(|| format!("{origin}:{line}: [[policy]] #{n}: 'id' is missing"))?;
    let id: Guid = id_text
        .parse()
        .map_err(|e| field_err("id", id_value, format!("'{id_text}' is not a GUID: {e}")))?;
    if id.is_null() {
        return Err(field_err(
            "id",
            id_value,
            "the NULL GUID cannot name a policy (a NULL PolicyID means no policy, [MS-SQOS] 2.2.2.2)"
                .into(),
        ));
    }
    let name = match string("name")? {
        Some((s, v)) => {
            check_name(s).map_err(|e| field_err("name", v, e))?;
            Some(s.to_string())
        }
        None => None,
    };
    let (kind_text, kind_value) = string("type")?.ok_or_else(|| {
        format!("{origin}:{line}: [[policy]] #{n}: 'type' is missing (dedicated or aggregated)")
    })?;
    let kind = parse_kind(kind_text).ok_or_else(|| {
        field_err(
            "type",
            kind_value,
            format!("unknown type '{kind_text}' (expected dedicated or aggregated)"),
        )
    })?;
    let entry = PolicyEntry {
        id,
        name,
        policy: Policy {
            kind,
            minimum_iops: integer("min_iops")?,
            maximum_iops: integer("max_iops")?,
            maximum_bandwidth: integer("max_bandwidth_kbps")?,
        },
    };
    // What is left to check is the relation between min_iops and max_iops.
    entry.validate().map_err(|e| {
        let l = t.get("min_iops").map_or(line, |v| at(v.span()));
        format!("{origin}:{l}: [[policy]] #{n} ({id:#}): {e}")
    })?;
    Ok(entry)
}

/// 1-based line and column (in characters) of byte `offset` of `text`.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

/// `s` as a TOML basic string, with quotes.
fn push_toml_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOLD: &str = "8d7f0c7e-2f9b-4c58-9a35-1d3c5e6f7a81";
    const SILVER: &str = "04b4f24e-b3e9-4594-adaa-e327528de54b";

    fn gold() -> Guid {
        GOLD.parse().unwrap()
    }

    fn entry(
        id: &str,
        name: Option<&str>,
        kind: PolicyKind,
        min: u64,
        max: u64,
        bw: u64,
    ) -> PolicyEntry {
        PolicyEntry {
            id: id.parse().unwrap(),
            name: name.map(str::to_string),
            policy: Policy {
                kind,
                minimum_iops: min,
                maximum_iops: max,
                maximum_bandwidth: bw,
            },
        }
    }

    fn parse_err(text: &str) -> String {
        PolicyStore::parse(text, "p.toml").unwrap_err()
    }

    #[test]
    fn documented_example_file_loads() {
        let text = format!(
            r#"
[[policy]]
id = "{GOLD}"   # PolicyID ([MS-SQOS] 2.2.2.2)
name = "gold"                                 # optional
type = "dedicated"                            # or "aggregated"
min_iops = 1000                               # normalized IOPS, 8 KiB (BaseIoSize 8192)
max_iops = 5000                               # 0 = unlimited
max_bandwidth_kbps = 0                        # KB/s, KB = 1024 bytes; 0 = unlimited

[[policy]]
id = "{{{SILVER}}}"
type = "Aggregated"
max_iops = 1_000
max_bandwidth_kbps = 0x400
"#
        );
        let s = PolicyStore::parse(&text, "p.toml").unwrap();
        assert_eq!(
            s.list(),
            &[
                entry(GOLD, Some("gold"), PolicyKind::Dedicated, 1000, 5000, 0),
                entry(SILVER, None, PolicyKind::Aggregated, 0, 1000, 1024),
            ]
        );
        assert_eq!(s.generation(), 0);
        assert_eq!(s.lookup(&gold()).map(|p| p.maximum_iops), Some(5000));
        assert_eq!(s.lookup(&Guid::NULL), None);
    }

    #[test]
    fn empty_file_is_an_empty_store() {
        assert!(PolicyStore::parse("", "p.toml").unwrap().is_empty());
        assert!(PolicyStore::parse("# nothing yet\n", "p.toml")
            .unwrap()
            .is_empty());
    }

    #[test]
    fn toml_syntax_error_names_file_line_and_column() {
        let e = parse_err("[[policy]]\nid = \"x\nname = 1\n");
        assert!(e.starts_with("p.toml:2:"), "{e}");
        assert!(e.contains("not valid TOML"), "{e}");
    }

    #[test]
    fn unknown_top_level_key_is_refused() {
        assert_eq!(
            parse_err("version = 2\n"),
            "p.toml:1: unknown key 'version' (the file holds only [[policy]] tables)"
        );
        assert_eq!(
            parse_err("[policy]\nid = \"x\"\n"),
            "p.toml:1: 'policy' must be an array of tables ([[policy]]), not a table"
        );
    }

    #[test]
    fn unknown_policy_key_is_refused_with_its_line() {
        let e = parse_err(&format!(
            "[[policy]]\nid = \"{GOLD}\"\ntype = \"dedicated\"\nmax_iosp = 5\n"
        ));
        assert_eq!(
            e,
            "p.toml:4: [[policy]] #1: unknown key 'max_iosp' (known keys: id, name, type, min_iops, max_iops, max_bandwidth_kbps)"
        );
    }

    #[test]
    fn negative_and_non_integer_numbers_are_refused() {
        let base = format!("[[policy]]\nid = \"{GOLD}\"\ntype = \"dedicated\"\n");
        assert_eq!(
            parse_err(&format!("{base}min_iops = -5\n")),
            "p.toml:4: [[policy]] #1 min_iops: must not be negative, got -5"
        );
        assert_eq!(
            parse_err(&format!("{base}max_iops = 5.5\n")),
            "p.toml:4: [[policy]] #1 max_iops: must be a non-negative integer, got the float 5.5"
        );
        assert_eq!(
            parse_err(&format!("{base}max_bandwidth_kbps = \"10\"\n")),
            "p.toml:4: [[policy]] #1 max_bandwidth_kbps: must be a non-negative integer, not a string"
        );
        assert_eq!(
            parse_err(&format!("{base}max_iops = 1000000001\n")),
            "p.toml:4: [[policy]] #1 max_iops: 1000000001 is above the largest accepted value 1000000000"
        );
    }

    #[test]
    fn unknown_type_and_missing_fields_are_refused() {
        assert_eq!(
            parse_err(&format!("[[policy]]\nid = \"{GOLD}\"\ntype = \"shared\"\n")),
            "p.toml:3: [[policy]] #1 type: unknown type 'shared' (expected dedicated or aggregated)"
        );
        assert_eq!(
            parse_err(&format!("[[policy]]\nid = \"{GOLD}\"\n")),
            "p.toml:1: [[policy]] #1: 'type' is missing (dedicated or aggregated)"
        );
        assert_eq!(
            parse_err("\n[[policy]]\ntype = \"dedicated\"\n"),
            "p.toml:2: [[policy]] #1: 'id' is missing"
        );
    }

    #[test]
    fn bad_and_null_ids_are_refused() {
        assert_eq!(
            parse_err("[[policy]]\nid = \"gold\"\ntype = \"dedicated\"\n"),
            "p.toml:2: [[policy]] #1 id: 'gold' is not a GUID: GUID must be 36 characters (38 with braces), got 4: expected xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
        );
        assert_eq!(
            parse_err("[[policy]]\nid = \"00000000-0000-0000-0000-000000000000\"\ntype = \"dedicated\"\n"),
            "p.toml:2: [[policy]] #1 id: the NULL GUID cannot name a policy (a NULL PolicyID means no policy, [MS-SQOS] 2.2.2.2)"
        );
    }

    #[test]
    fn duplicate_ids_are_refused_even_in_other_spelling() {
        let text = format!(
            "[[policy]]\nid = \"{GOLD}\"\ntype = \"dedicated\"\n\n[[policy]]\ntype = \"aggregated\"\nid = \"{{{}}}\"\n",
            GOLD.to_uppercase()
        );
        assert_eq!(
            parse_err(&text),
            format!(
                "p.toml:7: [[policy]] #2 id: {GOLD} is already defined by [[policy]] #1 at line 1"
            )
        );
    }

    #[test]
    fn minimum_above_maximum_is_kept_with_a_configuration_mismatch_warning() {
        let s = PolicyStore::parse(
            &format!("[[policy]]\nid = \"{GOLD}\"\ntype = \"dedicated\"\nmax_iops = 100\nmin_iops = 200\n"),
            "p.toml",
        )
        .unwrap();
        assert_eq!(s.len(), 1);
        assert_eq!(
            s.warnings(),
            vec![format!("policy {GOLD}: min_iops 200 is above max_iops 100: configuration mismatch; its flows are limited to max_iops 100, get no reservation and report StorageQoSStatusConfigurationMismatch (max_iops 0 means no maximum)")]
        );
        // A minimum with no maximum, or equal to it, is fine.
        for body in ["min_iops = 200\n", "min_iops = 100\nmax_iops = 100\n"] {
            let s = PolicyStore::parse(
                &format!("[[policy]]\nid = \"{GOLD}\"\ntype = \"dedicated\"\n{body}"),
                "p.toml",
            )
            .unwrap();
            assert!(s.warnings().is_empty(), "{body}");
        }
    }

    #[test]
    fn names_with_control_characters_are_refused() {
        let e = parse_err(&format!(
            "[[policy]]\nid = \"{GOLD}\"\nname = \"a\\nb\"\ntype = \"dedicated\"\n"
        ));
        assert_eq!(
            e,
            "p.toml:3: [[policy]] #1 name: name contains a control character"
        );
    }

    #[test]
    fn add_remove_list_round_trip_bumps_generation() {
        let mut s = PolicyStore::new();
        let g = entry(GOLD, Some("gold"), PolicyKind::Dedicated, 10, 20, 0);
        let v = entry(SILVER, None, PolicyKind::Aggregated, 0, 0, 512);
        s.add(g.clone()).unwrap();
        s.add(v.clone()).unwrap();
        assert_eq!(s.generation(), 2);
        assert_eq!(s.list(), &[g.clone(), v.clone()]);
        assert_eq!(
            s.add(g.clone()).unwrap_err(),
            format!("policy {GOLD} already exists (remove it first, or replace it)")
        );
        assert_eq!(s.generation(), 2, "a refused add changes nothing");
        let g2 = entry(GOLD, Some("gold2"), PolicyKind::Aggregated, 1, 2, 3);
        assert_eq!(s.replace(g2.clone()).unwrap(), Some(g.clone()));
        assert_eq!(
            s.list(),
            &[g2.clone(), v.clone()],
            "replace keeps the position"
        );
        assert_eq!(s.remove(&gold()).unwrap(), g2);
        assert_eq!(s.remove(&gold()).unwrap_err(), format!("no policy {GOLD}"));
        assert_eq!(s.list(), &[v]);
        assert_eq!(s.generation(), 4);
        assert!(s.get(&gold()).is_none());
    }

    #[test]
    fn add_refuses_what_the_file_refuses() {
        let mut s = PolicyStore::new();
        let mut null = entry(GOLD, None, PolicyKind::Dedicated, 0, 0, 0);
        null.id = Guid::NULL;
        assert!(s.add(null).unwrap_err().contains("NULL GUID"));
        assert!(s.is_empty());
        assert_eq!(s.generation(), 0);
    }

    #[test]
    fn add_keeps_a_mismatched_policy_and_warns() {
        let mut s = PolicyStore::new();
        let e = entry(GOLD, None, PolicyKind::Dedicated, 9, 8, 0);
        assert!(e.mismatch().unwrap().contains("configuration mismatch"));
        s.add(e).unwrap();
        assert_eq!(s.len(), 1);
        assert_eq!(s.warnings().len(), 1);
    }

    #[test]
    fn save_then_load_gives_the_same_store() {
        let dir =
            std::env::temp_dir().join(format!("smbdirectd-qos-policy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("policies.toml");
        let mut s = PolicyStore::new();
        s.add(entry(
            GOLD,
            Some("gold \"tier\" \\ é"),
            PolicyKind::Dedicated,
            1000,
            5000,
            0,
        ))
        .unwrap();
        s.add(entry(SILVER, None, PolicyKind::Aggregated, 0, 0, 2048))
            .unwrap();
        s.save(&path).unwrap();
        let back = PolicyStore::load(&path).unwrap();
        assert_eq!(back.list(), s.list());
        assert_eq!(back.backing_file(), Some(path.as_path()));
        // persist() rewrites the backing file; no temporary file is left.
        let mut back = back;
        back.remove(&gold()).unwrap();
        back.persist().unwrap();
        assert_eq!(PolicyStore::load(&path).unwrap().list(), back.list());
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers, vec![std::ffi::OsString::from("policies.toml")]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn load_of_a_missing_file_names_it() {
        let e = PolicyStore::load(Path::new("/nonexistent/smbdirectd/p.toml")).unwrap_err();
        assert!(
            e.starts_with("cannot read policy file /nonexistent/smbdirectd/p.toml: "),
            "{e}"
        );
    }

    #[test]
    fn save_into_a_missing_directory_fails_with_the_path() {
        let e = PolicyStore::new()
            .save(Path::new("/nonexistent/smbdirectd/p.toml"))
            .unwrap_err();
        assert!(
            e.starts_with("cannot write policy file /nonexistent/smbdirectd/p.toml: create "),
            "{e}"
        );
    }
}
