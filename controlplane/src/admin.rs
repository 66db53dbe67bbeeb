//! The admin socket: a Unix stream socket served by the control plane.
//! One request line per connection (`stats`), one JSON document back.
//! Non-blocking: the control plane polls it between connection arrivals.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Default admin socket path for a listen port.
pub fn default_path(port: u16) -> PathBuf {
    PathBuf::from(format!("/run/smbdirectd/smbdirectd-{port}.sock"))
}

/// The listening admin socket; removes its path when dropped.
#[derive(Debug)]
pub struct AdminSocket {
    listener: UnixListener,
    path: PathBuf,
}

impl AdminSocket {
    /// Binds `path` (creating its directory; replacing a stale socket file
    /// that nobody answers on).
    pub fn bind(path: &Path) -> std::io::Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        if path.exists() {
            if UnixStream::connect(path).is_ok() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    format!(
                        "admin socket {} is in use by a running smbdirectd",
                        path.display()
                    ),
                ));
            }
            let _ = std::fs::remove_file(path);
        }
        let listener = UnixListener::bind(path)?;
        listener.set_nonblocking(true)?;
        Ok(AdminSocket {
            listener,
            path: path.to_path_buf(),
        })
    }

    /// Path.
    /// The listening socket's descriptor (readable: a request is waiting).
    pub fn fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.listener.as_raw_fd()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Answers every pending request with `answer(request_line)`.
    pub fn serve_pending(&self, answer: &mut dyn FnMut(&str) -> String) {
        while let Ok((stream, _)) = self.listener.accept() {
            let _ = stream.set_nonblocking(false);
            let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
            let _ = stream.set_write_timeout(Some(Duration::from_millis(500)));
            let mut line = String::new();
            let mut r = BufReader::new(&stream);
            if r.read_line(&mut line).is_err() {
                continue;
            }
            let reply = answer(line.trim());
            let mut w = &stream;
            let _ = w.write_all(reply.as_bytes());
            let _ = w.write_all(b"\n");
        }
    }
}

impl Drop for AdminSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// How long [`request`] waits for the daemon's answer.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// Client side: sends `request` to the daemon at `path`, returns its answer.
pub fn request(path: &Path, request: &str) -> std::io::Result<String> {
    let mut s = UnixStream::connect(path).map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!(
                "cannot reach smbdirectd admin socket {}: {e}",
                path.display()
            ),
        )
    })?;
    s.set_read_timeout(Some(ANSWER_TIMEOUT))?;
    s.write_all(request.as_bytes())?;
    s.write_all(b"\n")?;
    let mut out = String::new();
    BufReader::new(s).read_line(&mut out).map_err(|e| {
        if matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ) {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "smbdirectd at admin socket {} did not answer within {} s (is its control-plane thread starved of CPU?)",
                    path.display(),
                    ANSWER_TIMEOUT.as_secs()
                ),
            )
        } else {
            e
        }
    })?;
    Ok(out.trim_end().to_string())
}
