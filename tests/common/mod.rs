//! What the end-to-end tests share: `smbdirectd serve` as a child process,
//! one at a time, with its admin socket, stats and a clean SIGTERM exit.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Tests that start servers run one at a time (2 cores; busy-polling workers).
pub static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

pub struct Daemon {
    pub child: Child,
    pub lines: mpsc::Receiver<String>,
    pub stderr: std::sync::Arc<std::sync::Mutex<String>>,
    pub admin: String,
}

pub fn spawn(port: u16, extra: &[&str]) -> Daemon {
    spawn_with(port, extra, |_| {})
}

/// [`spawn`], with `prepare` given the command before it runs.
pub fn spawn_with(port: u16, extra: &[&str], prepare: impl FnOnce(&mut Command)) -> Daemon {
    let admin = format!("/tmp/smbdirectd-test-{port}.sock");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_smbdirectd"));
    prepare(&mut cmd);
    // Defaults for the tests; `extra` is flag/value pairs that override them
    // (value "" for a flag that takes none).
    let listen = format!("127.0.0.1:{port}");
    let mut opts: Vec<(&str, &str)> = vec![
        ("--provider", "soft"),
        ("--upper", "echo"),
        ("--listen", &listen),
        ("--cores", "1"),
        ("--idle-park-us", "200"),
        ("--pool-mem", "128M"),
        ("--max-connections", "16"),
        ("--receive-credit-max", "32"),
        ("--send-credit-target", "32"),
        ("--admin-socket", &admin),
    ];
    for pair in extra.chunks(2) {
        match opts.iter_mut().find(|(k, _)| *k == pair[0]) {
            Some(o) => o.1 = pair[1],
            None => opts.push((pair[0], pair[1])),
        }
    }
    cmd.arg("serve");
    for (k, v) in &opts {
        // An empty value: a flag without one (`--guest-ok`).
        if v.is_empty() {
            cmd.arg(k);
        } else {
            cmd.args([k, v]);
        }
    }
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn smbdirectd");
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let err = child.stderr.take().unwrap();
    let e2 = stderr.clone();
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            e2.lock().unwrap().push_str(&(l + "\n"));
        }
    });
    let d = Daemon {
        child,
        lines: rx,
        stderr,
        admin,
    };
    let l = match d.lines.recv_timeout(Duration::from_secs(20)) {
        Ok(l) => l,
        Err(e) => panic!(
            "daemon did not print its serving line ({e}); stderr:\n{}",
            d.stderr.lock().unwrap()
        ),
    };
    assert!(l.contains("serving on"), "unexpected first line: {l}");
    d
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // A failed test must not leave a daemon holding the port.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `smbdirectd stats --json` against the daemon. A request the daemon did
/// not answer within the CLI's 5 s (its control-plane thread starved on a
/// loaded CI machine) is asked again, up to 30 s in all; any other failure
/// fails the test at once.
pub fn stats_json(d: &Daemon) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match try_stats_json(d) {
            Ok(doc) => return doc,
            Err(err) if err.contains("did not answer within") && Instant::now() < deadline => {}
            Err(err) => panic!("stats failed: {err}"),
        }
    }
}

/// One `smbdirectd stats --json` against the daemon: its output, or what
/// the command said on failure.
pub fn try_stats_json(d: &Daemon) -> Result<String, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_smbdirectd"))
        .args(["stats", "--json", "--admin-socket", &d.admin])
        .output()
        .map_err(|e| format!("running stats: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

pub fn field(doc: &str, key: &str) -> u64 {
    let k = format!("\"{key}\":");
    let i = doc
        .find(&k)
        .unwrap_or_else(|| panic!("{key} missing in {doc}"))
        + k.len();
    doc[i..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect::<String>()
        .parse()
        .unwrap()
}

pub fn terminate(d: Daemon) -> (String, String) {
    let mut d = d;
    // SAFETY: sending SIGTERM to our own child.
    unsafe { libc::kill(d.child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = d.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "daemon did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    while let Ok(l) = d.lines.recv_timeout(Duration::from_millis(200)) {
        out.push_str(&l);
        out.push('\n');
    }
    let err = d.stderr.lock().unwrap().clone();
    assert!(
        status.success(),
        "daemon exit status {status:?}; stderr:\n{err}"
    );
    assert!(!err.contains("panicked"), "daemon panicked:\n{err}");
    (out, err)
}

/// A listen port no other server on this host is using right now (two test
/// runs may share a machine): probes the soft provider's rendezvous name for
/// the port, which is what `serve --provider soft` binds.
pub fn free_port() -> u16 {
    use std::os::linux::net::SocketAddrExt;
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 20_000 + (std::process::id() % 20_000) as u16;
    loop {
        let port = base + NEXT.fetch_add(1, Ordering::Relaxed) % 5_000;
        let name = format!("smbdirectd-soft/127.0.0.1:{port}");
        let Ok(addr) = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()) else {
            continue;
        };
        if std::os::unix::net::UnixListener::bind_addr(&addr).is_ok() {
            return port;
        }
    }
}

/// Polls `stats --json` until `ready` holds for the document (the daemon
/// counts a closed connection on its worker and control-plane threads, a
/// little after the peer sees the connection end), or panics after
/// `timeout` with `what` and the last document. Returns that document.
pub fn wait_for_stats(
    d: &Daemon,
    timeout: Duration,
    what: &str,
    ready: impl Fn(&str) -> bool,
) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let doc = stats_json(d);
        if ready(&doc) {
            return doc;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not reached within {timeout:?}: {doc}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A client-side buffer pool of `slices` slices, each with the `classes`
/// (name, buffer size, buffers per slice), in shareable memfd memory and
/// registered with `provider` (the soft provider passes it to the daemon).
pub fn registered_pool(
    provider: &smbdirect_dataplane::provider::soft::SoftProvider,
    slices: usize,
    classes: &[(&str, usize, u32)],
) -> (
    smbdirect_hugepages::BufferPool,
    smbdirect_dataplane::provider::MemoryRegion,
) {
    use smbdirect_dataplane::provider::Provider;
    use smbdirect_hugepages::{Backing, PoolConfig, SizeClass};
    let per_slice: usize = classes.iter().map(|&(_, s, n)| s * n as usize).sum();
    let mut cfg = PoolConfig::new((per_slice + (2 << 20)) * slices, slices);
    for &(name, size, n) in classes {
        cfg = cfg.class(SizeClass::new(name, size).per_slice(n));
    }
    let pool = cfg.backing(Backing::SharedMemfd).build().unwrap();
    // SAFETY: the pool outlives the provider's use of it (the caller keeps
    // both for the whole test and drops the provider's connections first).
    let mr = unsafe { provider.register_pool(&pool) }.unwrap();
    (pool, mr)
}

/// A CREATE of a plain file for reading and writing (shared read/write,
/// no contexts) with `disposition`.
pub fn create_req(
    name: &str,
    disposition: smbdirect_protocol::smb2::CreateDisposition,
) -> smbdirect_protocol::smb2::CreateRequestRepr<'_> {
    use smbdirect_protocol::smb2::*;
    CreateRequestRepr {
        security_flags: 0,
        requested_oplock_level: OplockLevel::NONE,
        impersonation_level: ImpersonationLevel::IMPERSONATION,
        smb_create_flags: 0,
        desired_access: AccessMask::GENERIC_READ | AccessMask::GENERIC_WRITE,
        file_attributes: FileAttributes::NORMAL,
        share_access: ShareAccess::READ | ShareAccess::WRITE,
        create_disposition: disposition,
        create_options: CreateOptions::NON_DIRECTORY_FILE,
        name: Utf16Str::new(name),
        create_contexts: CreateContextList::EMPTY,
    }
}
