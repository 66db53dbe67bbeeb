//! The local user store: the accounts SESSION_SETUP authenticates against
//! (NTLMv2, `smbdirect_protocol::smb2::auth`), kept in a text file that
//! `smbdirectd user add|remove|list` edits.
//!
//! # File format
//! One user per line, `NAME:NTHASH` or `NAME:NTHASH:FLAGS`: NTHASH is the
//! 32 hex digits of the NT hash, MD4(UTF-16LE(password)) ([MS-NLMP] 3.3.1
//! NTOWFv1); FLAGS a comma-separated list (`disabled` keeps the account but
//! refuses its logons; unknown flags are kept and ignored). Blank lines and
//! lines starting with `#` are ignored. Names are unique ignoring case,
//! as Windows account names are.
//!
//! # Protection
//! For NTLM the NT hash is as good as the password, so the file is always
//! written with mode 0600, by writing a temporary file beside it and
//! renaming it over (a reader sees the old file or the new one, never half
//! of either). Loading a file that group or others may access yields a
//! warning ([`UserStore::warnings`]).

use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::{self, BufRead, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use smbdirect_protocol::smb2::auth::ntlm;

/// The flag that disables an account.
pub const FLAG_DISABLED: &str = "disabled";

/// Longest accepted user name, in characters (Windows allows 20 for local
/// accounts and 104 for UPN prefixes; this leaves room).
pub const MAX_NAME_CHARS: usize = 256;

/// Characters Windows forbids in account names, plus the file's separator.
const FORBIDDEN: &[char] = &[
    '"', '/', '\\', '[', ']', ':', ';', '|', '=', ',', '+', '*', '?', '<', '>',
];

/// One account.
#[derive(Clone, PartialEq, Eq)]
pub struct UserEntry {
    /// The name as it was added (compared ignoring case).
    pub name: String,
    /// MD4(UTF-16LE(password)).
    pub nt_hash: [u8; 16],
    /// Flags after the second `:`.
    pub flags: Vec<String>,
}

impl UserEntry {
    /// True when the `disabled` flag is set.
    pub fn disabled(&self) -> bool {
        self.flags.iter().any(|f| f == FLAG_DISABLED)
    }
}

impl fmt::Debug for UserEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UserEntry")
            .field("name", &self.name)
            .field("nt_hash", &"<redacted>")
            .field("flags", &self.flags)
            .finish()
    }
}

/// What went wrong, with the file and line where there is one.
#[derive(Debug)]
pub enum UserStoreError {
    /// Reading or writing the file failed.
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The cause.
        source: io::Error,
    },
    /// A line of the file is not `NAME:NTHASH[:FLAGS]`.
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// `add` of a name that exists (ignoring case).
    Exists(String),
    /// `remove` of a name that does not exist.
    NotFound(String),
    /// A name the store refuses.
    InvalidName {
        /// The name.
        name: String,
        /// Why.
        reason: &'static str,
    },
    /// An empty password.
    EmptyPassword,
}

impl fmt::Display for UserStoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UserStoreError::Io { path, op, source } => {
                write!(f, "{}: cannot {op}: {source}", path.display())
            }
            UserStoreError::Parse { path, line, reason } => {
                write!(f, "{}:{line}: {reason}", path.display())
            }
            UserStoreError::Exists(n) => write!(f, "user '{n}' already exists"),
            UserStoreError::NotFound(n) => write!(f, "no user '{n}'"),
            UserStoreError::InvalidName { name, reason } => {
                write!(f, "invalid user name '{name}': {reason}")
            }
            UserStoreError::EmptyPassword => write!(f, "the password is empty"),
        }
    }
}

impl std::error::Error for UserStoreError {}

/// Checks a user name: not empty, at most [`MAX_NAME_CHARS`], no control
/// characters, none of `"/\[]:;|=,+*?<>`, no leading or trailing blank, not
/// starting with `#`.
pub fn validate_name(name: &str) -> Result<(), UserStoreError> {
    let bad = |reason| {
        Err(UserStoreError::InvalidName {
            name: name.to_string(),
            reason,
        })
    };
    if name.is_empty() {
        return bad("empty");
    }
    if name.chars().count() > MAX_NAME_CHARS {
        return bad("longer than 256 characters");
    }
    if name.chars().any(char::is_control) {
        return bad("control character");
    }
    if name.contains(FORBIDDEN) {
        return bad("contains one of \"/\\[]:;|=,+*?<>");
    }
    if name.trim() != name {
        return bad("leading or trailing blank");
    }
    if name.starts_with('#') {
        return bad("starts with '#'");
    }
    Ok(())
}

fn same_name(a: &str, b: &str) -> bool {
    a == b || a.to_uppercase() == b.to_uppercase()
}

fn hex(b: &[u8; 16]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex16(s: &str) -> Option<[u8; 16]> {
    if s.len() != 32 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// The accounts of one file.
#[derive(Debug, Clone)]
pub struct UserStore {
    path: PathBuf,
    users: Vec<UserEntry>,
    warnings: Vec<String>,
}

impl UserStore {
    /// An empty store that [`save`](Self::save) writes to `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        UserStore {
            path: path.into(),
            users: Vec::new(),
            warnings: Vec::new(),
        }
    }

    /// Reads `path`, which must exist.
    pub fn load(path: impl Into<PathBuf>) -> Result<Self, UserStoreError> {
        let path = path.into();
        let io_err = |op, source| UserStoreError::Io {
            path: path.clone(),
            op,
            source,
        };
        let file = fs::File::open(&path).map_err(|e| io_err("open", e))?;
        let mut warnings = Vec::new();
        let mode = file
            .metadata()
            .map_err(|e| io_err("stat", e))?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            warnings.push(format!(
                "{}: mode {:o} lets group or others access the NT hashes (password equivalents); chmod 600 it",
                path.display(),
                mode & 0o777
            ));
        }
        let mut users: Vec<UserEntry> = Vec::new();
        for (i, line) in io::BufReader::new(file).lines().enumerate() {
            let line = line.map_err(|e| io_err("read", e))?;
            let n = i + 1;
            let parse_err = |reason: String| UserStoreError::Parse {
                path: path.clone(),
                line: n,
                reason,
            };
            let line = line.strip_suffix('\r').unwrap_or(&line);
            if line.trim().is_empty() || line.starts_with('#') {
                continue;
            }
            let mut parts = line.splitn(3, ':');
            let name = parts.next().unwrap_or_default();
            let Some(hash) = parts.next() else {
                return Err(parse_err("expected NAME:NTHASH[:FLAGS]".into()));
            };
            validate_name(name).map_err(|e| parse_err(e.to_string()))?;
            let nt_hash = unhex16(hash)
                .ok_or_else(|| parse_err(format!("NT hash of '{name}' is not 32 hex digits")))?;
            let flags = match parts.next() {
                Some(f) if f.contains(':') => {
                    return Err(parse_err("more than three ':'-separated fields".into()))
                }
                Some(f) => f
                    .split(',')
                    .map(str::trim)
                    .filter(|f| !f.is_empty())
                    .map(String::from)
                    .collect(),
                None => Vec::new(),
            };
            if users.iter().any(|u| same_name(&u.name, name)) {
                return Err(parse_err(format!(
                    "user '{name}' appears twice (names ignore case)"
                )));
            }
            users.push(UserEntry {
                name: name.to_string(),
                nt_hash,
                flags,
            });
        }
        Ok(UserStore {
            path,
            users,
            warnings,
        })
    }

    /// [`load`](Self::load), or an empty store when `path` does not exist.
    pub fn load_or_new(path: impl Into<PathBuf>) -> Result<Self, UserStoreError> {
        let path = path.into();
        match fs::symlink_metadata(&path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Self::new(path)),
            _ => Self::load(path),
        }
    }

    /// Problems found while loading that do not stop it (file mode).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Adds `name` with the NT hash of `password` (in memory; [`save`](Self::save) writes).
    pub fn add(&mut self, name: &str, password: &str) -> Result<(), UserStoreError> {
        validate_name(name)?;
        if password.is_empty() {
            return Err(UserStoreError::EmptyPassword);
        }
        if self.find(name).is_some() {
            return Err(UserStoreError::Exists(name.to_string()));
        }
        self.users.push(UserEntry {
            name: name.to_string(),
            nt_hash: ntlm::nt_hash(password),
            flags: Vec::new(),
        });
        Ok(())
    }

    /// Removes `name` (ignoring case) in memory.
    pub fn remove(&mut self, name: &str) -> Result<UserEntry, UserStoreError> {
        let i = self
            .find(name)
            .ok_or_else(|| UserStoreError::NotFound(name.to_string()))?;
        Ok(self.users.remove(i))
    }

    /// The accounts, in file order.
    pub fn list(&self) -> &[UserEntry] {
        &self.users
    }

    /// The account `name` (ignoring case).
    pub fn get(&self, name: &str) -> Option<&UserEntry> {
        self.find(name).map(|i| &self.users[i])
    }

    /// The NT hash of `name` (ignoring case), if it exists and is not
    /// disabled: the lookup SESSION_SETUP authenticates with.
    pub fn nt_hash(&self, name: &str) -> Option<[u8; 16]> {
        self.get(name).filter(|u| !u.disabled()).map(|u| u.nt_hash)
    }

    fn find(&self, name: &str) -> Option<usize> {
        self.users.iter().position(|u| same_name(&u.name, name))
    }

    /// The file's text.
    fn render(&self) -> String {
        let mut s = String::from(
            "# smbdirectd users: NAME:NTHASH[:FLAGS], NTHASH = MD4(UTF-16LE(password)).\n\
             # Password equivalents: keep this file mode 600. Edit with `smbdirectd user`.\n",
        );
        for u in &self.users {
            s.push_str(&u.name);
            s.push(':');
            s.push_str(&hex(&u.nt_hash));
            if !u.flags.is_empty() {
                s.push(':');
                s.push_str(&u.flags.join(","));
            }
            s.push('\n');
        }
        s
    }

    /// Writes the file atomically with mode 0600: a temporary file in the
    /// same directory (created 0600, written, synced), renamed over the
    /// file, then the directory synced.
    pub fn save(&self) -> Result<(), UserStoreError> {
        let io_err = |op, source| UserStoreError::Io {
            path: self.path.clone(),
            op,
            source,
        };
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let file_name = self
            .path
            .file_name()
            .ok_or_else(|| io_err("save", io::ErrorKind::InvalidInput.into()))?;
        let tmp = dir.join(format!(
            ".{}.tmp.{}",
            file_name.to_string_lossy(),
            std::process::id()
        ));
        let open = || {
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)
        };
        let mut f = match open() {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                // A leftover of a crashed run with our pid: replace it.
                fs::remove_file(&tmp).map_err(|e| io_err("remove a stale temporary file", e))?;
                open()
            }
            r => r,
        }
        .map_err(|e| io_err("create a temporary file", e))?;
        let write = (|| {
            // The umask can only clear bits; make it exactly 0600.
            f.set_permissions(fs::Permissions::from_mode(0o600))?;
            f.write_all(self.render().as_bytes())?;
            f.sync_all()?;
            fs::rename(&tmp, &self.path)
        })();
        if let Err(e) = write {
            let _ = fs::remove_file(&tmp);
            return Err(io_err("write", e));
        }
        if let Ok(d) = fs::File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

/// Reads one line from standard input with terminal echo off (for a
/// password typed at a terminal), restoring the terminal afterwards, even
/// on error. `prompt` goes to standard error. The line ending is removed.
pub fn read_password_no_echo(prompt: &str) -> io::Result<Option<String>> {
    let mut err = io::stderr();
    write!(err, "{prompt}")?;
    err.flush()?;
    let guard = EchoOff::new(libc::STDIN_FILENO)?;
    let line = read_line(&mut io::stdin().lock());
    drop(guard);
    writeln!(err)?;
    line
}

/// One line of `r` without its line ending; `None` at end of input.
pub fn read_line(r: &mut impl BufRead) -> io::Result<Option<String>> {
    let mut s = String::new();
    if r.read_line(&mut s)? == 0 {
        return Ok(None);
    }
    if s.ends_with('\n') {
        s.pop();
        if s.ends_with('\r') {
            s.pop();
        }
    }
    Ok(Some(s))
}

/// True when standard input is a terminal.
pub fn stdin_is_tty() -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(libc::STDIN_FILENO) == 1 }
}

/// Terminal echo switched off on `fd` until dropped.
struct EchoOff {
    fd: libc::c_int,
    saved: libc::termios,
}

impl EchoOff {
    fn new(fd: libc::c_int) -> io::Result<Self> {
        // SAFETY: termios is plain data; tcgetattr fills it or fails.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: a valid pointer to a termios.
        if unsafe { libc::tcgetattr(fd, &mut saved) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut quiet = saved;
        quiet.c_lflag &= !(libc::ECHO | libc::ECHOE | libc::ECHOK | libc::ECHONL);
        // SAFETY: a valid termios derived from the current one.
        if unsafe { libc::tcsetattr(fd, libc::TCSAFLUSH, &quiet) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(EchoOff { fd, saved })
    }
}

impl Drop for EchoOff {
    fn drop(&mut self) {
        // SAFETY: restores the attributes read in `new`.
        unsafe {
            libc::tcsetattr(self.fd, libc::TCSAFLUSH, &self.saved);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> Self {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos();
            let p = std::env::temp_dir().join(format!(
                "smbdirectd-users-{tag}-{}-{nanos}",
                std::process::id()
            ));
            fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn add_save_load_round_trip_keeps_the_nt_hash() {
        let d = TempDir::new("rt");
        let path = d.0.join("users");
        let mut s = UserStore::load_or_new(&path).unwrap();
        assert!(s.list().is_empty());
        s.add("Alice", "Password").unwrap();
        s.add("bob", "hunter2").unwrap();
        s.save().unwrap();
        let text = fs::read_to_string(&path).unwrap();
        // [MS-NLMP] 4.2.2.1.2: NTOWFv1("Password").
        assert!(
            text.contains("Alice:a4f49c406510bdcab6824ee7c30fd852\n"),
            "{text}"
        );
        let l = UserStore::load(&path).unwrap();
        assert!(l.warnings().is_empty(), "{:?}", l.warnings());
        assert_eq!(l.list().len(), 2);
        assert_eq!(l.nt_hash("ALICE"), Some(ntlm::nt_hash("Password")));
        assert_eq!(l.nt_hash("Bob"), Some(ntlm::nt_hash("hunter2")));
        assert_eq!(l.nt_hash("carol"), None);
    }

    #[test]
    fn saved_file_is_mode_0600_even_over_a_wider_file() {
        let d = TempDir::new("mode");
        let path = d.0.join("users");
        fs::write(&path, "x:00000000000000000000000000000000\n").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let s = UserStore::load(&path).unwrap();
        assert_eq!(s.warnings().len(), 1, "a 0644 file is warned about");
        assert!(s.warnings()[0].contains("chmod 600"));
        s.save().unwrap();
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(UserStore::load(&path).unwrap().warnings().is_empty());
        // No temporary file is left behind.
        assert_eq!(fs::read_dir(&d.0).unwrap().count(), 1);
    }

    #[test]
    fn names_are_case_insensitive_and_unique() {
        let mut s = UserStore::new("/nonexistent/users");
        s.add("Alice", "a").unwrap();
        assert!(matches!(
            s.add("ALICE", "b"),
            Err(UserStoreError::Exists(_))
        ));
        assert_eq!(s.remove("alice").unwrap().name, "Alice");
        assert!(matches!(
            s.remove("alice"),
            Err(UserStoreError::NotFound(_))
        ));
        // Unicode case folding too.
        s.add("Émile", "x").unwrap();
        assert!(s.nt_hash("éMILE").is_some());
    }

    #[test]
    fn bad_names_and_empty_passwords_are_refused() {
        let mut s = UserStore::new("/nonexistent/users");
        for n in [
            "",
            "a:b",
            "a\nb",
            " a",
            "a ",
            "#a",
            "a/b",
            "a\\b",
            &"x".repeat(257),
        ] {
            assert!(
                matches!(s.add(n, "pw"), Err(UserStoreError::InvalidName { .. })),
                "{n:?}"
            );
        }
        assert!(matches!(
            s.add("ok", ""),
            Err(UserStoreError::EmptyPassword)
        ));
        s.add("first last", "pw").unwrap();
    }

    #[test]
    fn parse_errors_name_the_line() {
        let d = TempDir::new("parse");
        let path = d.0.join("users");
        for (text, line, what) in [
            ("# c\n\nalice\n", 3, "NAME:NTHASH"),
            ("alice:xyz\n", 1, "32 hex"),
            (
                "a:00000000000000000000000000000000\nA:00000000000000000000000000000000\n",
                2,
                "twice",
            ),
            ("a:00000000000000000000000000000000:x:y\n", 1, "three"),
        ] {
            fs::write(&path, text).unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
            match UserStore::load(&path) {
                Err(UserStoreError::Parse {
                    line: l, reason, ..
                }) => {
                    assert_eq!(l, line, "{text:?}");
                    assert!(reason.contains(what), "{reason}");
                }
                other => panic!("{text:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn flags_are_kept_and_disabled_refuses_the_hash() {
        let d = TempDir::new("flags");
        let path = d.0.join("users");
        fs::write(
            &path,
            "carol:a4f49c406510bdcab6824ee7c30fd852:disabled,future\r\n",
        )
        .unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        let s = UserStore::load(&path).unwrap();
        assert!(s.get("carol").unwrap().disabled());
        assert_eq!(s.nt_hash("carol"), None);
        s.save().unwrap();
        assert!(fs::read_to_string(&path)
            .unwrap()
            .contains("carol:a4f49c406510bdcab6824ee7c30fd852:disabled,future\n"));
    }

    #[test]
    fn load_of_a_missing_file_fails_but_load_or_new_does_not() {
        let d = TempDir::new("missing");
        assert!(matches!(
            UserStore::load(d.0.join("nope")),
            Err(UserStoreError::Io { .. })
        ));
        assert!(UserStore::load_or_new(d.0.join("nope"))
            .unwrap()
            .list()
            .is_empty());
    }

    #[test]
    fn read_line_strips_the_line_ending_only() {
        let mut r = io::Cursor::new(b" pass word \r\nsecond\n".to_vec());
        assert_eq!(read_line(&mut r).unwrap().as_deref(), Some(" pass word "));
        assert_eq!(read_line(&mut r).unwrap().as_deref(), Some("second"));
        assert_eq!(read_line(&mut r).unwrap(), None);
    }

    #[test]
    fn debug_output_hides_the_hash() {
        let mut s = UserStore::new("/x/users");
        s.add("alice", "Password").unwrap();
        let dbg = format!("{:?}", s.list());
        assert!(!dbg.contains("a4f49c"), "{dbg}");
    }
}
