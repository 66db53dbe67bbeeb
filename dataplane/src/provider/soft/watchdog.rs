//! Peer-loss detection, off the data path: one thread per provider blocks in
//! `poll(2)` on every connection's rendezvous socket and, for peers in other
//! processes, a pidfd of the peer process.
//!
//! * The socket reports hang-up when the peer disconnects, drops its queue
//!   pair, or dies (the kernel closes its fds): if the connection was still
//!   up, it breaks with [`BreakReason::PeerLost`](super::BreakReason::PeerLost)
//!   and both sides' posted work flushes.
//! * The pidfd reports that the peer process has exited, after its address
//!   space is gone: an access it left "in flight" (it died between entering
//!   our gate and leaving it) will never finish and cannot touch anything,
//!   so revokes and queue-pair teardown stop waiting for it.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;

use super::conn::Endpoint;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Socket,
    Process,
}

#[derive(Debug)]
struct Watch {
    fd: OwnedFd,
    kind: Kind,
    ep: Weak<Endpoint>,
}

#[derive(Debug)]
struct Shared {
    event: OwnedFd,
    pending: Mutex<Vec<Watch>>,
    stop: AtomicBool,
}

/// The watchdog of one provider.
#[derive(Debug)]
pub(crate) struct Watchdog {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Watchdog {
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: eventfd has no memory-safety preconditions.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh fd owned by nobody else.
        let event = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Watchdog {
            shared: Arc::new(Shared {
                event,
                pending: Mutex::new(Vec::new()),
                stop: AtomicBool::new(false),
            }),
            thread: Mutex::new(None),
        })
    }

    /// Watches an endpoint's socket (a duplicate: the endpoint keeps its own)
    /// and, for a cross-process peer, its pidfd.
    pub(crate) fn watch(
        &self,
        ep: &Arc<Endpoint>,
        socket: OwnedFd,
        pidfd: Option<OwnedFd>,
    ) -> io::Result<()> {
        {
            let mut p = self
                .shared
                .pending
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            p.push(Watch {
                fd: socket,
                kind: Kind::Socket,
                ep: Arc::downgrade(ep),
            });
            if let Some(fd) = pidfd {
                p.push(Watch {
                    fd,
                    kind: Kind::Process,
                    ep: Arc::downgrade(ep),
                });
            }
        }
        let mut t = self.thread.lock().unwrap_or_else(|e| e.into_inner());
        if t.is_none() {
            let shared = self.shared.clone();
            *t = Some(
                std::thread::Builder::new()
                    .name("smbd-soft-watchdog".into())
                    .spawn(move || run(&shared))?,
            );
        }
        self.kick();
        Ok(())
    }

    fn kick(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a valid u64 to our eventfd.
        unsafe {
            libc::write(
                self.shared.event.as_raw_fd(),
                (&one as *const u64).cast(),
                8,
            )
        };
    }

    /// Stops and joins the thread.
    pub(crate) fn stop(&self) {
        self.shared.stop.store(true, Ordering::Release);
        self.kick();
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

fn run(shared: &Shared) {
    let mut watched: Vec<Watch> = Vec::new();
    let mut fds: Vec<libc::pollfd> = Vec::new();
    loop {
        fds.clear();
        fds.push(libc::pollfd {
            fd: shared.event.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        for w in &watched {
            let events = match w.kind {
                Kind::Socket => libc::POLLIN | libc::POLLRDHUP,
                Kind::Process => libc::POLLIN,
            };
            fds.push(libc::pollfd {
                fd: w.fd.as_raw_fd(),
                events,
                revents: 0,
            });
        }
        // SAFETY: `fds` is a valid array of `fds.len()` pollfds.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if r < 0 {
            if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            continue;
        }
        if fds[0].revents != 0 {
            let mut buf = 0u64;
            // SAFETY: reads 8 bytes into a valid u64 from our eventfd.
            unsafe { libc::read(shared.event.as_raw_fd(), (&mut buf as *mut u64).cast(), 8) };
            if shared.stop.load(Ordering::Acquire) {
                return;
            }
        }
        // Backwards, so swap_remove keeps the indices still to visit valid.
        for i in (0..watched.len()).rev() {
            let revents = fds[i + 1].revents;
            if revents == 0 {
                continue;
            }
            let w = &watched[i];
            let lost = match w.kind {
                Kind::Process => true,
                Kind::Socket => {
                    revents & (libc::POLLHUP | libc::POLLERR | libc::POLLRDHUP) != 0
                        || socket_eof(&w.fd)
                }
            };
            if lost {
                let w = watched.swap_remove(i);
                if let Some(ep) = w.ep.upgrade() {
                    match w.kind {
                        Kind::Socket => ep.peer_hung_up(),
                        Kind::Process => ep.peer_exited(),
                    }
                }
            }
        }
        watched.retain(|w| w.ep.strong_count() > 0);
        watched.append(&mut shared.pending.lock().unwrap_or_else(|e| e.into_inner()));
    }
}

/// Reads (and discards) whatever arrived; true at end of file. Nothing is
/// sent on an established connection's socket, so data is ignored.
fn socket_eof(fd: &OwnedFd) -> bool {
    let mut buf = [0u8; 64];
    // SAFETY: receives at most 64 bytes into a valid buffer.
    let r = unsafe {
        libc::recv(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    };
    r == 0 || (r < 0 && io::Error::last_os_error().kind() != io::ErrorKind::WouldBlock)
}
