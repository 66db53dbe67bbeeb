//! `smbdirectd user add|remove|list` as an operator runs it: the binary,
//! passwords piped on standard input, a real file in a temporary directory.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let p = std::env::temp_dir().join(format!(
            "smbdirectd-user-cli-{tag}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `smbdirectd user ARGS... --users FILE` with `stdin` piped in.
fn user(file: &Path, args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_smbdirectd"))
        .arg("user")
        .args(args)
        .arg("--users")
        .arg(file)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn smbdirectd");
    // The child may exit before reading (a refused name): ignore EPIPE.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    child.wait_with_output().unwrap()
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exited")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn add_list_remove_with_the_password_on_stdin() {
    let d = TempDir::new("cycle");
    let f = d.0.join("users");

    let o = user(&f, &["add", "alice"], "s3cret\n");
    assert_eq!(code(&o), 0, "stderr: {}", text(&o.stderr));
    // [MS-NLMP] 4.2.2.1.2: NTOWFv1("Password") = a4f49c40...d852.
    let o = user(&f, &["add", "Bob"], "Password\n");
    assert_eq!(code(&o), 0, "stderr: {}", text(&o.stderr));

    let meta = std::fs::metadata(&f).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let content = std::fs::read_to_string(&f).unwrap();
    assert!(
        content.contains("Bob:a4f49c406510bdcab6824ee7c30fd852\n"),
        "{content}"
    );
    assert!(!content.contains("s3cret") && !content.contains("Password\n"));

    let o = user(&f, &["list"], "");
    assert_eq!(code(&o), 0);
    assert_eq!(text(&o.stdout), "alice\nBob\n");

    let o = user(&f, &["remove", "ALICE"], "");
    assert_eq!(code(&o), 0, "stderr: {}", text(&o.stderr));
    let o = user(&f, &["list"], "");
    assert_eq!(text(&o.stdout), "Bob\n");
    assert_eq!(
        std::fs::metadata(&f).unwrap().permissions().mode() & 0o777,
        0o600
    );
}

#[test]
fn duplicate_and_unknown_users_fail_with_status_1() {
    let d = TempDir::new("dup");
    let f = d.0.join("users");
    assert_eq!(code(&user(&f, &["add", "alice"], "one\n")), 0);

    // Names ignore case; the file is unchanged.
    let before = std::fs::read(&f).unwrap();
    let o = user(&f, &["add", "ALICE"], "two\n");
    assert_eq!(code(&o), 1);
    assert!(
        text(&o.stderr).contains("already exists"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(std::fs::read(&f).unwrap(), before);

    let o = user(&f, &["remove", "carol"], "");
    assert_eq!(code(&o), 1);
    assert!(
        text(&o.stderr).contains("no user 'carol'"),
        "{}",
        text(&o.stderr)
    );

    // A missing file has no users to list or remove.
    let missing = d.0.join("missing");
    assert_eq!(code(&user(&missing, &["list"], "")), 1);
    assert_eq!(code(&user(&missing, &["remove", "alice"], "")), 1);
}

#[test]
fn usage_errors_exit_2_and_write_nothing() {
    let d = TempDir::new("usage");
    let f = d.0.join("users");
    // No password on stdin, an empty one, a bad name.
    assert_eq!(code(&user(&f, &["add", "alice"], "")), 2);
    assert_eq!(code(&user(&f, &["add", "alice"], "\n")), 2);
    assert_eq!(code(&user(&f, &["add", "a:b"], "pw\n")), 2);
    assert!(!f.exists());
    // The password is never taken from the command line.
    assert_eq!(
        code(&user(&f, &["add", "alice", "--password", "pw"], "")),
        2
    );
    assert!(!f.exists());
}

#[test]
fn a_file_readable_by_others_is_warned_about_and_rewritten_0600() {
    let d = TempDir::new("mode");
    let f = d.0.join("users");
    assert_eq!(code(&user(&f, &["add", "alice"], "pw\n")), 0);
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = user(&f, &["list"], "");
    assert_eq!(code(&o), 0);
    assert!(text(&o.stderr).contains("warning"), "{}", text(&o.stderr));
    assert_eq!(code(&user(&f, &["add", "bob"], "pw2\n")), 0);
    assert_eq!(
        std::fs::metadata(&f).unwrap().permissions().mode() & 0o777,
        0o600
    );
}
