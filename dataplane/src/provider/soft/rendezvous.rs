//! The connection manager: the rendezvous socket, the handshake, and
//! building both ends of a connection.
//!
//! A listener on `ADDR:PORT` binds the abstract-namespace Unix socket
//! `"\0smbdirectd-soft/ADDR:PORT"` (type `SOCK_SEQPACKET`). A connector
//! connects to the same name (falling back to the wildcard listener
//! `0.0.0.0:PORT` or `[::]:PORT`, as TCP would) and sends one request
//! message; the listener answers with one accept or reject message. File
//! descriptors travel with them as `SCM_RIGHTS`:
//!
//! ```text
//! request  hello(kind=1) + [our grant table, our shared regions' memfds...]
//! accept   hello(kind=2) + [connection segment, grant table, regions...]
//! reject   hello(kind=3)
//! ```
//!
//! One `SCM_RIGHTS` message carries at most 253 fds (the kernel's
//! SCM_MAX_FD). A hello with more sends the first 253 with it and the rest
//! right after, 253 at a time, each in a `fds(kind=4, seq)` message
//! (seq 1, 2, ...); the receiver knows from the hello how many to expect
//! (one per region with an fd, plus its own).
//!
//! After the handshake the socket stays open, unused, for the connection's
//! lifetime: its hang-up is how each side learns that the other went away.

use crate::provider::{QueuePair as _, RecvWr};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::conn::{ConnLayout, ConnSegment, Endpoint};
use super::cq::SoftCqHandle;
use super::grant::GrantTable;
use super::qp::SoftQp;
use super::region::{Exported, PeerMemory, RegionExport};
use super::rng::process_nonce;
use super::shm::Padded;
use super::{ProviderInner, SoftProvider};
use crate::provider::{ConnRequest, Listener, ProviderError, QpCaps, QpId};

/// Largest private data carried by connect/accept. (RoCE's CM carries 56
/// bytes in a REQ and 196 in a REP, iWARP 512: keep the upper layer's to
/// what the verbs provider will carry.)
pub const MAX_PRIVATE_DATA: usize = 1024;

const MAGIC: u64 = u64::from_le_bytes(*b"SMBDSOFT");
const VERSION: u32 = 1;
const KIND_REQUEST: u32 = 1;
const KIND_ACCEPT: u32 = 2;
const KIND_REJECT: u32 = 3;
/// The fds of a hello that did not fit its message ([`send_hello`]).
const KIND_FDS: u32 = 4;
const MAX_REGIONS: usize = 1024;
/// The most fds one `SCM_RIGHTS` message carries (the kernel's SCM_MAX_FD).
const FDS_PER_MESSAGE: usize = 253;
/// How long a listener waits for the request after a socket connects.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Connected sockets a listener holds while their requests are on the way
/// (the kernel's backlog, 128, holds the rest).
const MAX_PENDING: usize = 128;

/// The abstract Unix socket name (without its leading NUL) a soft listener
/// on `addr` binds: `smbdirectd-soft/127.0.0.1:4450`, `smbdirectd-soft/[::1]:445`.
pub fn rendezvous_name(addr: SocketAddr) -> String {
    format!("smbdirectd-soft/{addr}")
}

/// One handshake message.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Hello {
    kind: u32,
    nonce: u64,
    pid: u32,
    provider_id: u64,
    grant_slots: u32,
    binding: u32,
    caps: QpCaps,
    private_data: Vec<u8>,
    regions: Vec<RegionExport>,
}

impl Hello {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(96 + self.private_data.len() + 32 * self.regions.len());
        let u32s = |b: &mut Vec<u8>, v: u32| b.extend_from_slice(&v.to_le_bytes());
        let u64s = |b: &mut Vec<u8>, v: u64| b.extend_from_slice(&v.to_le_bytes());
        u64s(&mut b, MAGIC);
        u32s(&mut b, VERSION);
        u32s(&mut b, self.kind);
        u64s(&mut b, self.nonce);
        u32s(&mut b, self.pid);
        u64s(&mut b, self.provider_id);
        u32s(&mut b, self.grant_slots);
        u32s(&mut b, self.binding);
        for v in [
            self.caps.max_send_wr,
            self.caps.max_recv_wr,
            self.caps.max_sge,
            self.caps.ird,
            self.caps.ord,
        ] {
            u32s(&mut b, v);
        }
        u32s(&mut b, self.private_data.len() as u32);
        b.extend_from_slice(&self.private_data);
        u32s(&mut b, self.regions.len() as u32);
        for r in &self.regions {
            u32s(&mut b, r.index);
            u32s(&mut b, u32::from(r.has_fd));
            u64s(&mut b, r.addr);
            u64s(&mut b, r.len);
            u64s(&mut b, r.fd_offset);
        }
        b
    }

    /// The fds that come with this hello, in its own message and the
    /// [`KIND_FDS`] ones after it: the kind's own (a request's grant table;
    /// an accept's connection segment and grant table), then one per
    /// region that has one.
    fn fds_expected(&self) -> usize {
        let own = match self.kind {
            KIND_REQUEST => 1,
            KIND_ACCEPT => 2,
            _ => 0,
        };
        own + self.regions.iter().filter(|r| r.has_fd).count()
    }

    /// Parses a peer's message; never panics on bad input.
    fn decode(b: &[u8]) -> Result<Hello, String> {
        let mut r = Reader { b, pos: 0 };
        if r.u64()? != MAGIC {
            return Err("not a soft provider handshake (bad magic)".into());
        }
        let version = r.u32()?;
        if version != VERSION {
            return Err(format!("handshake version {version}, we speak {VERSION}"));
        }
        let kind = r.u32()?;
        let nonce = r.u64()?;
        let pid = r.u32()?;
        let provider_id = r.u64()?;
        let grant_slots = r.u32()?;
        let binding = r.u32()?;
        let caps = QpCaps {
            max_send_wr: r.u32()?,
            max_recv_wr: r.u32()?,
            max_sge: r.u32()?,
            ird: r.u32()?,
            ord: r.u32()?,
        };
        let plen = r.u32()? as usize;
        if plen > MAX_PRIVATE_DATA {
            return Err(format!(
                "{plen} bytes of private data (max {MAX_PRIVATE_DATA})"
            ));
        }
        let private_data = r.bytes(plen)?.to_vec();
        let n = r.u32()? as usize;
        if n > MAX_REGIONS {
            return Err(format!("{n} regions announced (max {MAX_REGIONS})"));
        }
        let mut regions = Vec::with_capacity(n);
        for _ in 0..n {
            regions.push(RegionExport {
                index: r.u32()?,
                has_fd: r.u32()? != 0,
                addr: r.u64()?,
                len: r.u64()?,
                fd_offset: r.u64()?,
            });
        }
        if r.pos != b.len() {
            return Err(format!("{} trailing bytes", b.len() - r.pos));
        }
        Ok(Hello {
            kind,
            nonce,
            pid,
            provider_id,
            grant_slots,
            binding,
            caps,
            private_data,
            regions,
        })
    }
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or("handshake truncated")?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32, String> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.bytes(4)?);
        Ok(u32::from_le_bytes(a))
    }
    fn u64(&mut self) -> Result<u64, String> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.bytes(8)?);
        Ok(u64::from_le_bytes(a))
    }
}

// ---- sockets ------------------------------------------------------------

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn abstract_addr(name: &str) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain old data; all-zero is a valid value.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = name.as_bytes();
    if bytes.len() + 1 > sa.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("rendezvous name too long: {name}"),
        ));
    }
    // sun_path[0] stays 0: the abstract namespace.
    for (i, &c) in bytes.iter().enumerate() {
        sa.sun_path[i + 1] = c as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + bytes.len();
    Ok((sa, len as libc::socklen_t))
}

fn seqpacket(nonblocking: bool) -> io::Result<OwnedFd> {
    let flags = libc::SOCK_SEQPACKET
        | libc::SOCK_CLOEXEC
        | if nonblocking { libc::SOCK_NONBLOCK } else { 0 };
    // SAFETY: socket() has no memory-safety preconditions.
    let fd = cvt(unsafe { libc::socket(libc::AF_UNIX, flags, 0) })?;
    // SAFETY: a fresh fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn set_nonblocking(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    // SAFETY: fcntl on a valid fd with integer arguments.
    let flags = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
    let flags = if on {
        flags | libc::O_NONBLOCK
    } else {
        flags & !libc::O_NONBLOCK
    };
    // SAFETY: as above.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags) })?;
    Ok(())
}

/// Waits until `fd` is readable or `deadline` passes; true if readable.
fn wait_readable(fd: BorrowedFd<'_>, deadline: Instant) -> io::Result<bool> {
    Ok(poll_in(&mut [pollin(fd.as_raw_fd())], deadline)? > 0)
}

/// A `pollfd` asking whether `fd` is readable.
fn pollin(fd: libc::c_int) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// `poll(2)` on `fds` until one is ready or `deadline` (already past: a
/// look that does not wait), retrying on EINTR; how many are ready.
fn poll_in(fds: &mut [libc::pollfd], deadline: Instant) -> io::Result<usize> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = left.as_millis().min(i32::MAX as u128) as i32
            + i32::from(left.subsec_nanos() % 1_000_000 != 0);
        // SAFETY: `fds` is a valid array of `fds.len()` pollfds.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if r > 0 || Instant::now() >= deadline {
            return Ok(r as usize);
        }
    }
}

/// Sends one message with `fds` attached.
fn send_msg(sock: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    let payload = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(payload as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    // SAFETY: msghdr is plain old data; all-zero is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: `msg_control` points to `space` bytes (8-byte aligned), enough
        // for one header and `fds.len()` ints (CMSG_SPACE), so CMSG_FIRSTHDR is
        // non-null and CMSG_DATA has room for every fd.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(payload as u32) as _;
            let data = libc::CMSG_DATA(c).cast::<libc::c_int>();
            for (i, fd) in fds.iter().enumerate() {
                data.add(i).write_unaligned(fd.as_raw_fd());
            }
        }
    }
    loop {
        // SAFETY: `msg` describes valid buffers that outlive the call.
        let r = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if r as usize != bytes.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "short handshake send",
            ));
        }
        return Ok(());
    }
}

/// The message that carries the `seq`th batch of fds after a hello's own.
fn fds_message(seq: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(20);
    b.extend_from_slice(&MAGIC.to_le_bytes());
    b.extend_from_slice(&VERSION.to_le_bytes());
    b.extend_from_slice(&KIND_FDS.to_le_bytes());
    b.extend_from_slice(&seq.to_le_bytes());
    b
}

/// Sends `hello` with `fds`: the first [`FDS_PER_MESSAGE`] go with it, the
/// rest in [`KIND_FDS`] messages right behind it (the socket is blocking,
/// and a handshake has at most five messages: fewer than a Unix socket
/// queues).
fn send_hello(sock: BorrowedFd<'_>, hello: &Hello, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let (first, rest) = fds.split_at(fds.len().min(FDS_PER_MESSAGE));
    send_msg(sock, &hello.encode(), first)?;
    for (i, batch) in rest.chunks(FDS_PER_MESSAGE).enumerate() {
        send_msg(sock, &fds_message(i as u32 + 1), batch)?;
    }
    Ok(())
}

/// A hello's fds as they arrive: the fds of its own message, then those of
/// each [`KIND_FDS`] message after it, until [`Hello::fds_expected`].
#[derive(Debug)]
struct Arriving {
    hello: Hello,
    fds: Vec<OwnedFd>,
    /// [`KIND_FDS`] messages taken so far.
    batches: u32,
}

impl Arriving {
    /// A hello and the fds its message carried; more fds than it announced
    /// is a malformed handshake.
    fn new(hello: Hello, fds: Vec<OwnedFd>) -> Result<Arriving, String> {
        let a = Arriving {
            hello,
            fds,
            batches: 0,
        };
        a.check()?;
        Ok(a)
    }

    fn check(&self) -> Result<(), String> {
        let want = self.hello.fds_expected();
        if self.fds.len() > want {
            return Err(format!(
                "handshake passed {} fds, announced {want}",
                self.fds.len()
            ));
        }
        Ok(())
    }

    fn complete(&self) -> bool {
        self.fds.len() == self.hello.fds_expected()
    }

    /// Takes the next [`KIND_FDS`] message: its sequence number must be the
    /// next, and it must bring at least one fd and at most the ones missing.
    fn take(&mut self, bytes: &[u8], fds: Vec<OwnedFd>) -> Result<(), String> {
        let seq = self.batches + 1;
        if bytes != fds_message(seq).as_slice() {
            return Err(format!(
                "expected fd batch {seq} of the handshake, got something else"
            ));
        }
        if fds.is_empty() {
            return Err(format!("fd batch {seq} of the handshake carried no fd"));
        }
        self.batches = seq;
        self.fds.extend(fds);
        self.check()
    }
}

/// Receives a whole hello on a blocking socket: its message, then any
/// [`KIND_FDS`] messages its fds need, each by `deadline`.
fn recv_hello(sock: BorrowedFd<'_>, deadline: Instant) -> Result<(Hello, Vec<OwnedFd>), String> {
    let (bytes, fds) = recv_msg(sock).map_err(|e| e.to_string())?;
    let mut a = Arriving::new(Hello::decode(&bytes)?, fds)?;
    while !a.complete() {
        match wait_readable(sock, deadline) {
            Ok(true) => {}
            Ok(false) => {
                return Err(format!(
                    "{} of the {} fds announced arrived in time",
                    a.fds.len(),
                    a.hello.fds_expected()
                ))
            }
            Err(e) => return Err(e.to_string()),
        }
        let (bytes, fds) = recv_msg(sock).map_err(|e| e.to_string())?;
        a.take(&bytes, fds)?;
    }
    Ok((a.hello, a.fds))
}

/// Receives one message and the fds attached to it.
fn recv_msg(sock: BorrowedFd<'_>) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: pure computation.
    let space =
        unsafe { libc::CMSG_SPACE((253 * std::mem::size_of::<libc::c_int>()) as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    // SAFETY: plain old data.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    let n = loop {
        // SAFETY: `msg` describes valid, writable buffers that outlive the call.
        let r = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        break r as usize;
    };
    let mut fds = Vec::new();
    // SAFETY: the kernel filled `msg_control` with well-formed cmsgs of total
    // length `msg_controllen`; the CMSG_* macros walk exactly those, and each
    // SCM_RIGHTS payload is an array of fds now owned by this process.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<libc::c_int>();
                let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<libc::c_int>();
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "peer closed the rendezvous socket",
        ));
    }
    if msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "handshake message or its fds truncated",
        ));
    }
    buf.truncate(n);
    Ok((buf, fds))
}

/// The peer's pid, from the kernel (valid across pid namespaces).
fn peer_pid(sock: BorrowedFd<'_>) -> Option<i32> {
    // SAFETY: plain old data.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred`/`len` are valid for writes of the sizes given.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (r == 0 && cred.pid > 0).then_some(cred.pid)
}

fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: raw syscall with integer arguments.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    // SAFETY: on success, a fresh fd owned by nobody else.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

fn connect_err(addr: SocketAddr, what: impl std::fmt::Display) -> ProviderError {
    ProviderError::Connect(format!(
        "soft connect to {addr} (@{}): {what}",
        rendezvous_name(addr)
    ))
}

// ---- listener -------------------------------------------------------------

/// A soft listener: the bound rendezvous socket, and the sockets accepted
/// from it whose request has not arrived yet. Each waits on its own
/// deadline, never in front of the others: a connector that is slow to
/// send its request (descheduled, or never sending) holds up no one else's
/// connection, and the caller (the control plane) is never blocked past
/// the timeout it asked for.
#[derive(Debug)]
pub struct SoftListener {
    fd: OwnedFd,
    addr: SocketAddr,
    provider: Arc<ProviderInner>,
    /// Accepted sockets whose request has not (wholly) arrived.
    pending: Vec<Pending>,
}

/// A socket the listener accepted, waiting for its request.
#[derive(Debug)]
struct Pending {
    sock: OwnedFd,
    /// When the whole request is due by.
    due: Instant,
    /// The request's hello and the fds so far, when more are to come.
    arriving: Option<Arriving>,
}

impl SoftListener {
    pub(crate) fn bind(
        provider: Arc<ProviderInner>,
        addr: SocketAddr,
    ) -> Result<Self, ProviderError> {
        let try_bind = |a: SocketAddr| -> io::Result<OwnedFd> {
            let fd = seqpacket(true)?;
            let (sa, len) = abstract_addr(&rendezvous_name(a))?;
            // SAFETY: `sa` is a valid sockaddr_un of length `len`.
            cvt(unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    (&sa as *const libc::sockaddr_un).cast(),
                    len,
                )
            })?;
            // SAFETY: listen on our bound socket.
            cvt(unsafe { libc::listen(fd.as_raw_fd(), 128) })?;
            Ok(fd)
        };
        let listen_err = |a: SocketAddr, e: io::Error| {
            ProviderError::Connect(format!("soft listen on {a} (@{}): {e}", rendezvous_name(a)))
        };
        if addr.port() != 0 {
            let fd = try_bind(addr).map_err(|e| listen_err(addr, e))?;
            return Ok(SoftListener {
                fd,
                addr,
                provider,
                pending: Vec::new(),
            });
        }
        // Port 0: pick a free ephemeral port, as the kernel would.
        let mut rng = super::rng::XorShift::from_os();
        for _ in 0..256 {
            let a = SocketAddr::new(addr.ip(), 49152 + (rng.next_u64() % 16384) as u16);
            match try_bind(a) {
                Ok(fd) => {
                    return Ok(SoftListener {
                        fd,
                        addr: a,
                        provider,
                        pending: Vec::new(),
                    })
                }
                Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => continue,
                Err(e) => return Err(listen_err(a, e)),
            }
        }
        Err(listen_err(
            addr,
            io::Error::from_raw_os_error(libc::EADDRINUSE),
        ))
    }
}

impl SoftListener {
    /// Moves every connection waiting in the kernel's backlog to `pending`
    /// (up to [`MAX_PENDING`]), without waiting.
    fn accept_backlog(&mut self) -> Result<(), ProviderError> {
        while self.pending.len() < MAX_PENDING {
            // SAFETY: accept4 on our listening (non-blocking) socket; no
            // address is returned.
            let fd = unsafe {
                libc::accept4(
                    self.fd.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_CLOEXEC,
                )
            };
            if fd < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => return Ok(()),
                    io::ErrorKind::Interrupted => continue,
                    _ if e.raw_os_error() == Some(libc::ECONNABORTED) => continue,
                    _ => return Err(e.into()),
                }
            }
            // SAFETY: a fresh fd owned by nobody else.
            let sock = unsafe { OwnedFd::from_raw_fd(fd) };
            self.pending.push(Pending {
                sock,
                due: Instant::now() + REQUEST_TIMEOUT,
                arriving: None,
            });
        }
        Ok(())
    }

    /// Waits until the listening socket or a pending one is readable, or
    /// `deadline`.
    fn wait_any(&self, deadline: Instant) -> io::Result<()> {
        let mut fds: Vec<libc::pollfd> = std::iter::once(&self.fd)
            .chain(self.pending.iter().map(|p| &p.sock))
            .map(|f| pollin(f.as_raw_fd()))
            .collect();
        // The listening socket is not watched while `pending` is full.
        if self.pending.len() >= MAX_PENDING {
            fds[0].fd = -1;
        }
        poll_in(&mut fds, deadline).map(|_| ())
    }

    /// A request that has wholly arrived on a pending socket, if any (one
    /// poll of them all; others that arrived are taken by the next calls).
    /// A request whose fds follow in more messages waits in `pending` for
    /// them, holding up no other. A socket whose peer sent something else,
    /// or hung up, is dropped.
    fn take_ready(&mut self) -> Option<SoftRequest> {
        if self.pending.is_empty() {
            return None;
        }
        let mut polls: Vec<libc::pollfd> = self
            .pending
            .iter()
            .map(|p| pollin(p.sock.as_raw_fd()))
            .collect();
        // A look that does not wait; an error is a look that found nothing.
        if !poll_in(&mut polls, Instant::now()).is_ok_and(|n| n > 0) {
            return None;
        }
        // Backwards, so swap_remove keeps the indices still to visit valid
        // (and a socket pushed back at the end is not visited again).
        for i in (0..polls.len()).rev() {
            if polls[i].revents == 0 {
                continue;
            }
            let Pending {
                sock,
                due,
                arriving,
            } = self.pending.swap_remove(i);
            let Ok((bytes, fds)) = recv_msg(sock.as_fd()) else {
                continue;
            };
            let arrived = match arriving {
                None => Hello::decode(&bytes)
                    .and_then(|h| match h.kind {
                        KIND_REQUEST => Ok(h),
                        k => Err(format!(
                            "handshake message kind {k} where a request was due"
                        )),
                    })
                    .and_then(|h| Arriving::new(h, fds)),
                Some(mut a) => a.take(&bytes, fds).map(|()| a),
            };
            let Ok(arrived) = arrived else {
                continue;
            };
            if !arrived.complete() {
                self.pending.push(Pending {
                    sock,
                    due,
                    arriving: Some(arrived),
                });
                continue;
            }
            let Arriving { hello, fds, .. } = arrived;
            let pid = peer_pid(sock.as_fd()).unwrap_or(hello.pid as i32);
            let peer_addr = SocketAddr::new(self.addr.ip(), 49152 + (hello.binding % 16384) as u16);
            return Some(SoftRequest {
                sock,
                hello,
                fds,
                pid,
                peer_addr,
                provider: self.provider.clone(),
            });
        }
        None
    }
}

impl Listener<SoftProvider> for SoftListener {
    fn accept_request(&mut self, timeout: Duration) -> Result<Option<SoftRequest>, ProviderError> {
        let deadline = Instant::now() + timeout;
        loop {
            self.accept_backlog()?;
            if let Some(r) = self.take_ready() {
                return Ok(Some(r));
            }
            // A connector that sends no request in time is dropped.
            let now = Instant::now();
            self.pending.retain(|p| p.due > now);
            if now >= deadline {
                return Ok(None);
            }
            let wake = self
                .pending
                .iter()
                .map(|p| p.due)
                .min()
                .map_or(deadline, |d| d.min(deadline));
            self.wait_any(wake)?;
        }
    }

    fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

// ---- request / accept -----------------------------------------------------

/// A connection request at a [`SoftListener`].
#[derive(Debug)]
pub struct SoftRequest {
    sock: OwnedFd,
    hello: Hello,
    fds: Vec<OwnedFd>,
    pid: i32,
    peer_addr: SocketAddr,
    provider: Arc<ProviderInner>,
}

impl SoftRequest {
    /// The connecting process's pid.
    pub fn peer_pid(&self) -> i32 {
        self.pid
    }

    /// Whether the connector lives in this process.
    pub fn is_same_process(&self) -> bool {
        self.hello.nonce == process_nonce()
    }

    /// The fds the request passed (its grant table's and its regions').
    #[cfg(test)]
    pub(crate) fn fds_passed(&self) -> usize {
        self.fds.len()
    }

    fn send_reject(&self) {
        let h = self
            .provider
            .hello(KIND_REJECT, 0, QpCaps::default(), &[], Vec::new());
        let _ = send_msg(self.sock.as_fd(), &h.encode(), &[]);
    }
}

/// `(ird, ord)` of one side: its incoming reads are bounded by the peer's
/// outgoing depth, its outgoing reads by the peer's incoming depth
/// (RFC 6581, rdma_cm). For the connecting side these are exactly the values
/// [MS-SMBD] Appendix A 6.2 has the acceptor send back; the acceptor uses the
/// same pair seen from its side (the spec's "set to the values transmitted"
/// would give it the connector's view; see the module doc).
fn negotiate(mine: QpCaps, peer: QpCaps) -> (u32, u32) {
    (mine.ird.min(peer.ord), mine.ord.min(peer.ird))
}

fn check_caps(c: QpCaps, who: &str) -> Result<(), String> {
    let ok = |v: u32| (1..=1 << 16).contains(&v);
    if !(ok(c.max_send_wr) && ok(c.max_recv_wr) && ok(c.max_sge) && c.max_sge <= 64) {
        return Err(format!(
            "{who} queue pair caps out of range (max_send_wr {}, max_recv_wr {}, max_sge {}; each 1..=65536, max_sge <= 64)",
            c.max_send_wr, c.max_recv_wr, c.max_sge
        ));
    }
    Ok(())
}

impl SoftRequest {
    /// Accepts, posting `recvs` on the new queue pair before the accept
    /// reaches the peer, so its first Send always finds a receive.
    fn accept_posting(
        mut self,
        cq: &SoftCqHandle,
        caps: QpCaps,
        private_data: &[u8],
        recvs: &[RecvWr],
    ) -> Result<SoftQp, ProviderError> {
        let fail = |req: &SoftRequest, e: String| {
            req.send_reject();
            ProviderError::Connect(format!("accepting pid {}: {e}", req.pid))
        };
        check_caps(caps, "our").map_err(|e| fail(&self, e))?;
        check_caps(self.hello.caps, "the connector's").map_err(|e| fail(&self, e))?;
        if private_data.len() > MAX_PRIVATE_DATA {
            return Err(fail(
                &self,
                format!(
                    "{} bytes of private data (max {MAX_PRIVATE_DATA})",
                    private_data.len()
                ),
            ));
        }
        let ird_ord = negotiate(caps, self.hello.caps);
        if ird_ord.0 == 0 || ird_ord.1 == 0 {
            // [MS-SMBD] Appendix A 6.2: a zero IRD or ORD rejects the connection.
            return Err(fail(
                &self,
                format!("IRD/ORD negotiated to {ird_ord:?}: zero rejects the connection"),
            ));
        }
        let p = self.provider.clone();
        let reserved = u64::from(caps.max_send_wr) + u64::from(caps.max_recv_wr);
        cq.0.reserve(reserved)
            .map_err(|e| fail(&self, e.to_string()))?;
        let mut reservation = Reservation {
            cq: &cq.0,
            n: reserved,
            armed: true,
        };
        let same = self.hello.nonce == process_nonce();
        let mut fds = std::mem::take(&mut self.fds).into_iter();
        let peer_table = fds
            .next()
            .ok_or_else(|| "request carried no grant table".to_string())
            .and_then(|fd| {
                p.peer_grant_table(
                    (self.hello.nonce, self.hello.provider_id),
                    fd,
                    self.hello.grant_slots,
                )
            })
            .map_err(|e| fail(&self, e))?;
        let peer_mem = if same {
            PeerMemory::SameProcess
        } else {
            PeerMemory::map(&self.hello.regions, fds.collect(), &p.peer_maps)
                .map_err(|e| fail(&self, e.to_string()))?
        };
        let layout = ConnLayout::new([self.hello.caps.max_recv_wr, caps.max_recv_wr]);
        let seg = ConnSegment::create(layout)
            .map_err(|e| fail(&self, format!("creating the connection segment: {e}")))?;
        let Exported {
            regions,
            fds: region_fds,
            serials,
        } = if same {
            Exported::same_process()
        } else {
            p.regions.export().map_err(|e| fail(&self, e.to_string()))?
        };
        let binding = p.next_binding.fetch_add(1, Ordering::Relaxed);
        let (grant_base, grant_count) = p
            .take_grant_range(caps.max_send_wr.min(p.config.grants_per_qp))
            .map_err(|e| fail(&self, e))?;
        let reply = p.hello(KIND_ACCEPT, binding, caps, private_data, regions.clone());
        let watch_sock = self.sock.try_clone()?;
        let pidfd = if same { None } else { pidfd_open(self.pid) };
        let ep = Arc::new(Endpoint {
            id: QpId(p.next_qp.fetch_add(1, Ordering::Relaxed)),
            me: 1,
            seg,
            peer_mem,
            peer_grants: peer_table,
            peer_binding: self.hello.binding,
            my_binding: binding,
            grant_base,
            grant_count,
            local: super::ring::LocalRing::new(caps.max_send_wr),
            rq_retired: Padded(AtomicU64::new(0)),
            sq_retired: Padded(AtomicU64::new(0)),
            caps,
            ird_ord,
            cross_process: !same,
            peer_pid: self.pid,
            serials_exported: serials,
            dropped: AtomicBool::new(false),
            sock: self.sock.try_clone()?,
            socket_shut: AtomicBool::new(false),
            cq: cq.0.clone(),
            cq_reserved: reserved,
            provider: p.clone(),
        });
        reservation.armed = false; // the endpoint owns it now
        let mut qp = SoftQp::new(ep.clone());
        if !recvs.is_empty() {
            qp.post_recv(recvs)
                .map_err(|e| fail(&self, format!("posting the initial receives: {e}")))?;
        }
        let mut fds: Vec<BorrowedFd<'_>> = vec![ep.seg.fd(), p.grants.segment().fd()];
        fds.extend(region_fds.iter().map(|f| f.as_fd()));
        send_hello(ep.sock.as_fd(), &reply, &fds).map_err(|e| {
            ProviderError::Connect(format!(
                "accepting pid {}: sending the accept: {e}",
                self.pid
            ))
        })?;
        p.watchdog.watch(&ep, watch_sock, pidfd)?;
        p.register_endpoint(&ep);
        cq.0.attach(ep);
        p.counters
            .connections_established
            .fetch_add(1, Ordering::Relaxed);
        Ok(qp)
    }
}

impl ConnRequest<SoftProvider> for SoftRequest {
    fn private_data(&self) -> &[u8] {
        &self.hello.private_data
    }

    fn peer_addr(&self) -> SocketAddr {
        self.peer_addr
    }

    fn accept(
        self,
        cq: &SoftCqHandle,
        caps: QpCaps,
        private_data: &[u8],
    ) -> Result<SoftQp, ProviderError> {
        self.accept_posting(cq, caps, private_data, &[])
    }

    fn accept_with_receives(
        self,
        cq: &SoftCqHandle,
        caps: QpCaps,
        private_data: &[u8],
        recvs: &[RecvWr],
    ) -> Result<SoftQp, ProviderError> {
        self.accept_posting(cq, caps, private_data, recvs)
    }

    fn reject(self) {
        self.send_reject();
    }
}

/// Gives a CQ reservation back unless disarmed.
struct Reservation<'a> {
    cq: &'a super::cq::CqShared,
    n: u64,
    armed: bool,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.cq.release(self.n);
        }
    }
}

// ---- connect --------------------------------------------------------------

fn connect_socket(addr: SocketAddr, deadline: Instant) -> Result<OwnedFd, ProviderError> {
    let wildcard = match addr.ip() {
        IpAddr::V4(ip) if !ip.is_unspecified() => {
            Some(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), addr.port()))
        }
        IpAddr::V6(ip) if !ip.is_unspecified() => {
            Some(SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), addr.port()))
        }
        _ => None,
    };
    loop {
        let mut refused = None;
        for a in std::iter::once(addr).chain(wildcard) {
            let fd = seqpacket(true)?;
            let (sa, len) = abstract_addr(&rendezvous_name(a))?;
            // SAFETY: `sa` is a valid sockaddr_un of length `len`.
            let r = unsafe {
                libc::connect(
                    fd.as_raw_fd(),
                    (&sa as *const libc::sockaddr_un).cast(),
                    len,
                )
            };
            if r == 0 {
                set_nonblocking(fd.as_fd(), false)?;
                return Ok(fd);
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::ECONNREFUSED) | Some(libc::ENOENT) => refused = Some(e),
                // Backlog full: retry until the deadline.
                Some(libc::EAGAIN) | Some(libc::EINTR) => {}
                _ => return Err(connect_err(addr, e)),
            }
        }
        if let Some(e) = refused {
            return Err(connect_err(addr, format!("no soft listener ({e})")));
        }
        if Instant::now() >= deadline {
            return Err(connect_err(addr, "timed out (listener backlog full)"));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

pub(crate) fn connect(
    p: &Arc<ProviderInner>,
    addr: SocketAddr,
    cq: &SoftCqHandle,
    caps: QpCaps,
    private_data: &[u8],
    timeout: Duration,
) -> Result<(SoftQp, Vec<u8>), ProviderError> {
    let deadline = Instant::now() + timeout;
    check_caps(caps, "our").map_err(|e| connect_err(addr, e))?;
    if private_data.len() > MAX_PRIVATE_DATA {
        return Err(connect_err(
            addr,
            format!(
                "{} bytes of private data (max {MAX_PRIVATE_DATA})",
                private_data.len()
            ),
        ));
    }
    let reserved = u64::from(caps.max_send_wr) + u64::from(caps.max_recv_wr);
    cq.0.reserve(reserved)?;
    let mut reservation = Reservation {
        cq: &cq.0,
        n: reserved,
        armed: true,
    };
    let sock = connect_socket(addr, deadline)?;
    // A listener in this process (SO_PEERCRED names our pid) maps none of
    // our regions, so none are passed: a process with more pools than one
    // message carries fds for (bench --loopback with hundreds of
    // connections) can still connect to itself.
    let local = peer_pid(sock.as_fd()) == Some(std::process::id() as i32);
    let Exported {
        regions,
        fds: region_fds,
        serials,
    } = if local {
        Exported::same_process()
    } else {
        p.regions.export()?
    };
    let binding = p.next_binding.fetch_add(1, Ordering::Relaxed);
    let request = p.hello(KIND_REQUEST, binding, caps, private_data, regions.clone());
    let mut fds: Vec<BorrowedFd<'_>> = vec![p.grants.segment().fd()];
    fds.extend(region_fds.iter().map(|f| f.as_fd()));
    send_hello(sock.as_fd(), &request, &fds)
        .map_err(|e| connect_err(addr, format!("sending the request: {e}")))?;
    drop(region_fds);
    if !wait_readable(sock.as_fd(), deadline)? {
        return Err(connect_err(addr, format!("no answer within {timeout:?}")));
    }
    let (reply, fds) = recv_hello(sock.as_fd(), deadline).map_err(|e| connect_err(addr, e))?;
    match reply.kind {
        KIND_ACCEPT => {}
        KIND_REJECT => return Err(connect_err(addr, "rejected by the listener")),
        k => {
            return Err(connect_err(
                addr,
                format!("unexpected handshake message kind {k}"),
            ))
        }
    }
    check_caps(reply.caps, "the acceptor's").map_err(|e| connect_err(addr, e))?;
    let ird_ord = negotiate(caps, reply.caps);
    if ird_ord.0 == 0 || ird_ord.1 == 0 {
        return Err(connect_err(
            addr,
            format!("IRD/ORD negotiated to {ird_ord:?}"),
        ));
    }
    let same = reply.nonce == process_nonce();
    let mut fds = fds.into_iter();
    let (Some(seg_fd), Some(table_fd)) = (fds.next(), fds.next()) else {
        return Err(connect_err(addr, "accept carried too few fds"));
    };
    let layout = ConnLayout::new([caps.max_recv_wr, reply.caps.max_recv_wr]);
    let seg = ConnSegment::open(seg_fd, layout)
        .map_err(|e| connect_err(addr, format!("connection segment: {e}")))?;
    let peer_grants = p
        .peer_grant_table(
            (reply.nonce, reply.provider_id),
            table_fd,
            reply.grant_slots,
        )
        .map_err(|e| connect_err(addr, e))?;
    let peer_mem = if same {
        PeerMemory::SameProcess
    } else {
        PeerMemory::map(&reply.regions, fds.collect(), &p.peer_maps)?
    };
    let (grant_base, grant_count) = p
        .take_grant_range(caps.max_send_wr.min(p.config.grants_per_qp))
        .map_err(|e| connect_err(addr, e))?;
    let pid = peer_pid(sock.as_fd()).unwrap_or(reply.pid as i32);
    let watch_sock = sock.try_clone()?;
    let ep = Arc::new(Endpoint {
        id: QpId(p.next_qp.fetch_add(1, Ordering::Relaxed)),
        me: 0,
        seg,
        peer_mem,
        peer_grants,
        peer_binding: reply.binding,
        my_binding: binding,
        grant_base,
        grant_count,
        local: super::ring::LocalRing::new(caps.max_send_wr),
        rq_retired: Padded(AtomicU64::new(0)),
        sq_retired: Padded(AtomicU64::new(0)),
        caps,
        ird_ord,
        cross_process: !same,
        peer_pid: pid,
        serials_exported: if same { u32::MAX } else { serials },
        dropped: AtomicBool::new(false),
        sock,
        socket_shut: AtomicBool::new(false),
        cq: cq.0.clone(),
        cq_reserved: reserved,
        provider: p.clone(),
    });
    reservation.armed = false;
    let qp = SoftQp::new(ep.clone());
    p.watchdog
        .watch(&ep, watch_sock, if same { None } else { pidfd_open(pid) })?;
    p.register_endpoint(&ep);
    cq.0.attach(ep);
    p.counters
        .connections_established
        .fetch_add(1, Ordering::Relaxed);
    Ok((qp, reply.private_data))
}

impl ProviderInner {
    fn hello(
        &self,
        kind: u32,
        binding: u32,
        caps: QpCaps,
        private_data: &[u8],
        regions: Vec<RegionExport>,
    ) -> Hello {
        Hello {
            kind,
            nonce: process_nonce(),
            pid: std::process::id(),
            provider_id: self.id,
            grant_slots: self.grants.slots(),
            binding,
            caps,
            private_data: private_data.to_vec(),
            regions,
        }
    }

    /// Maps (or reuses the mapping of) a peer provider's grant table.
    fn peer_grant_table(
        &self,
        peer: (u64, u64),
        fd: OwnedFd,
        slots: u32,
    ) -> Result<Arc<GrantTable>, String> {
        let mut cache = self.peer_tables.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = cache.get(&peer).and_then(std::sync::Weak::upgrade) {
            return Ok(t);
        }
        let t = Arc::new(
            GrantTable::open(fd, slots, peer.1).map_err(|e| format!("peer grant table: {e}"))?,
        );
        cache.retain(|_, w| w.strong_count() > 0);
        cache.insert(peer, Arc::downgrade(&t));
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello() -> Hello {
        Hello {
            kind: KIND_REQUEST,
            nonce: 1,
            pid: 2,
            provider_id: 3,
            grant_slots: 1 << 16,
            binding: 4,
            caps: QpCaps::default(),
            private_data: vec![1, 2, 3],
            regions: vec![RegionExport {
                index: 0,
                has_fd: true,
                addr: 0x1000,
                len: 2 << 20,
                fd_offset: 0,
            }],
        }
    }

    #[test]
    fn handshake_round_trips_and_rejects_garbage() {
        let h = hello();
        let b = h.encode();
        assert_eq!(Hello::decode(&b), Ok(h));
        for cut in 0..b.len() {
            assert!(Hello::decode(&b[..cut]).is_err(), "truncated at {cut}");
        }
        let mut bad = b.clone();
        bad[0] ^= 1;
        assert!(Hello::decode(&bad).unwrap_err().contains("magic"));
        let mut long = b.clone();
        long.push(0);
        assert!(Hello::decode(&long).unwrap_err().contains("trailing"));
    }

    /// A connected pair of blocking SOCK_SEQPACKET sockets.
    fn socket_pair() -> (OwnedFd, OwnedFd) {
        let mut sv = [0; 2];
        // SAFETY: `sv` has room for the two fds socketpair(2) returns.
        let r = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                sv.as_mut_ptr(),
            )
        };
        assert_eq!(r, 0, "socketpair: {}", io::Error::last_os_error());
        // SAFETY: two fresh fds owned by nobody else.
        unsafe { (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(sv[1])) }
    }

    /// A request announcing `n` regions with an fd (so `n + 1` fds).
    fn request_with(n: usize) -> Hello {
        let r = hello().regions[0];
        Hello {
            regions: (0..n as u32)
                .map(|index| RegionExport { index, ..r })
                .collect(),
            ..hello()
        }
    }

    #[test]
    fn fds_beyond_one_message_follow_in_batches_and_arrive_in_order() {
        let (a, b) = socket_pair();
        // 301 fds: the hello's message carries 253, one batch the rest.
        // Most are /dev/null; those at `marked` a pipe, so the order shows
        // on arrival.
        let null = std::fs::File::open("/dev/null").unwrap();
        let mut pipe = [0; 2];
        // SAFETY: `pipe` has room for two fds.
        assert_eq!(
            unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) },
            0
        );
        // SAFETY: fresh fds owned by nobody else.
        let (pr, pw) = unsafe { (OwnedFd::from_raw_fd(pipe[0]), OwnedFd::from_raw_fd(pipe[1])) };
        let h = request_with(300);
        let marked = [0, 252, 253, 300];
        let fds: Vec<BorrowedFd<'_>> = (0..301)
            .map(|i| {
                if marked.contains(&i) {
                    pr.as_fd()
                } else {
                    null.as_fd()
                }
            })
            .collect();
        send_hello(a.as_fd(), &h, &fds).unwrap();
        drop(pw);
        let (got, fds) = recv_hello(b.as_fd(), Instant::now() + Duration::from_secs(5)).unwrap();
        assert_eq!(got, h);
        assert_eq!(fds.len(), 301);
        let is_pipe = |fd: &OwnedFd| {
            // SAFETY: fstat into a zeroed stat of our own.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
            st.st_mode & libc::S_IFMT == libc::S_IFIFO
        };
        let pipes: Vec<usize> = (0..301).filter(|&i| is_pipe(&fds[i])).collect();
        assert_eq!(pipes, marked, "the fds arrived in the order sent");
        // Nothing is left on the socket.
        assert!(!wait_readable(b.as_fd(), Instant::now()).unwrap());
    }

    #[test]
    fn a_hello_whose_fds_do_not_all_come_is_refused() {
        let null = std::fs::File::open("/dev/null").unwrap();
        let some = |n: usize| -> Vec<OwnedFd> {
            (0..n)
                .map(|_| null.as_fd().try_clone_to_owned().unwrap())
                .collect()
        };
        // Too few, and no batch in time.
        let (a, b) = socket_pair();
        let h = request_with(300);
        let fds = vec![null.as_fd(); FDS_PER_MESSAGE];
        send_msg(a.as_fd(), &h.encode(), &fds).unwrap();
        let e = recv_hello(b.as_fd(), Instant::now() + Duration::from_millis(50)).unwrap_err();
        assert!(e.contains("253 of the 301 fds"), "{e}");
        // A batch out of sequence, one without fds, one of something else,
        // and more fds than announced.
        let mut x = Arriving::new(request_with(300), some(253)).unwrap();
        assert!(!x.complete());
        let e = x.take(&fds_message(2), some(1)).unwrap_err();
        assert!(e.contains("fd batch 1"), "{e}");
        let e = x.take(&fds_message(1), Vec::new()).unwrap_err();
        assert!(e.contains("carried no fd"), "{e}");
        let e = x.take(&hello().encode(), some(1)).unwrap_err();
        assert!(e.contains("something else"), "{e}");
        let e = x.take(&fds_message(1), some(49)).unwrap_err();
        assert!(e.contains("passed 302 fds, announced 301"), "{e}");
        let e = Arriving::new(request_with(1), some(3)).unwrap_err();
        assert!(e.contains("passed 3 fds, announced 2"), "{e}");
        let mut ok = Arriving::new(request_with(300), some(253)).unwrap();
        ok.take(&fds_message(1), some(48)).unwrap();
        assert!(ok.complete());
    }

    #[test]
    fn rendezvous_name_is_derived_from_the_address() {
        assert_eq!(
            rendezvous_name("127.0.0.1:4450".parse().unwrap()),
            "smbdirectd-soft/127.0.0.1:4450"
        );
        assert_eq!(
            rendezvous_name("[::1]:445".parse().unwrap()),
            "smbdirectd-soft/[::1]:445"
        );
    }

    /// A soft provider listening on a free port of 127.0.0.1, and where.
    fn soft_listener() -> (
        crate::provider::soft::SoftProvider,
        SoftListener,
        SocketAddr,
    ) {
        use crate::provider::{Listener, Provider};
        let provider = crate::provider::soft::SoftProvider::new().expect("soft provider");
        let listener = provider
            .listen("127.0.0.1:0".parse().unwrap())
            .expect("listen");
        let addr = listener.local_addr();
        (provider, listener, addr)
    }

    /// A blocking socket connected to the soft listener on `addr`, with
    /// nothing sent: the test sends what it likes.
    fn raw_connector(addr: SocketAddr) -> OwnedFd {
        let sock = seqpacket(false).expect("socket");
        let (sa, len) = abstract_addr(&rendezvous_name(addr)).expect("name");
        // SAFETY: `sa` is a valid sockaddr_un of length `len`.
        let r = unsafe {
            libc::connect(
                sock.as_raw_fd(),
                (&sa as *const libc::sockaddr_un).cast(),
                len,
            )
        };
        assert_eq!(r, 0, "connect: {}", io::Error::last_os_error());
        sock
    }

    /// A connector that connects and sends no request (descheduled, or
    /// hostile) is first in the backlog: the listener still hands over the
    /// request behind it at once, every call returns within its timeout,
    /// and the silent one is dropped after [`REQUEST_TIMEOUT`].
    #[test]
    fn a_connector_that_sends_nothing_holds_up_no_other_connection() {
        use crate::provider::soft::SoftProvider;
        use crate::provider::{CompletionQueue, ConnRequest, Provider};
        let (_provider, mut listener, addr) = soft_listener();
        let silent = raw_connector(addr);
        let client = SoftProvider::new().expect("client provider");
        let cq = client.create_cq(1024).expect("cq");
        let h = cq.handle();
        std::thread::scope(|s| {
            let c = s.spawn(|| {
                client.connect(addr, &h, QpCaps::default(), &[], Duration::from_secs(10))
            });
            let start = Instant::now();
            let mut got = None;
            while got.is_none() && start.elapsed() < Duration::from_secs(10) {
                let call = Instant::now();
                got = listener
                    .accept_request(Duration::from_millis(20))
                    .expect("accept_request");
                assert!(
                    call.elapsed() < Duration::from_secs(1),
                    "one call blocked for {:?}",
                    call.elapsed()
                );
            }
            let req = got.expect("the real connector's request");
            assert!(
                start.elapsed() < REQUEST_TIMEOUT,
                "the silent connector held the real one up for {:?}",
                start.elapsed()
            );
            req.reject();
            assert!(
                c.join().expect("connector").is_err(),
                "the real connector was rejected"
            );
        });
        assert_eq!(listener.pending.len(), 1, "the silent socket still waits");
        std::thread::sleep(REQUEST_TIMEOUT);
        assert!(listener
            .accept_request(Duration::ZERO)
            .expect("accept_request")
            .is_none());
        assert!(listener.pending.is_empty(), "the silent socket was dropped");
        drop(silent);
    }

    /// A request whose fds follow in a second message waits in `pending`
    /// for them without holding up another connector, and is taken whole
    /// once they come.
    #[test]
    fn a_request_whose_fds_follow_waits_for_them_and_holds_up_no_other() {
        use crate::provider::soft::SoftProvider;
        use crate::provider::{CompletionQueue, ConnRequest, Provider};
        let (_provider, mut listener, addr) = soft_listener();
        let slow = raw_connector(addr);
        let null = std::fs::File::open("/dev/null").unwrap();
        let fds = vec![null.as_fd(); FDS_PER_MESSAGE];
        send_msg(slow.as_fd(), &request_with(300).encode(), &fds).unwrap();
        let client = SoftProvider::new().expect("client provider");
        let cq = client.create_cq(1024).expect("cq");
        let h = cq.handle();
        let accept = |listener: &mut SoftListener| {
            let start = Instant::now();
            let mut got = None;
            while got.is_none() && start.elapsed() < REQUEST_TIMEOUT {
                got = listener
                    .accept_request(Duration::from_millis(20))
                    .expect("accept_request");
            }
            got
        };
        // The slow request's first part (its fds still to come) is read
        // before the other connector arrives, and is not handed out.
        let start = Instant::now();
        while !listener
            .pending
            .first()
            .is_some_and(|p| p.arriving.is_some())
        {
            assert!(
                start.elapsed() < REQUEST_TIMEOUT,
                "the slow request's first part was never read"
            );
            let early = listener
                .accept_request(Duration::from_millis(20))
                .expect("accept_request");
            assert!(
                early.is_none(),
                "a request without all its fds was handed out"
            );
        }
        std::thread::scope(|s| {
            let c = s.spawn(|| {
                client.connect(addr, &h, QpCaps::default(), &[], Duration::from_secs(10))
            });
            let req = accept(&mut listener).expect("the real connector's request");
            assert_eq!(req.fds_passed(), 1);
            req.reject();
            assert!(c.join().expect("connector").is_err(), "rejected");
        });
        assert_eq!(listener.pending.len(), 1, "the slow request still waits");
        assert!(listener.pending[0].arriving.is_some(), "with its first fds");
        send_msg(slow.as_fd(), &fds_message(1), &fds[..48]).unwrap();
        let req = accept(&mut listener).expect("the slow request, whole");
        assert_eq!(req.fds_passed(), 301);
        assert_eq!(req.hello.regions.len(), 300);
        assert!(listener.pending.is_empty());
    }

    #[test]
    fn ird_ord_is_the_minimum_of_each_direction() {
        let c = |ird, ord| QpCaps {
            ird,
            ord,
            ..QpCaps::default()
        };
        // Server offers IRD 8 and wants ORD 4; client offers IRD 2, wants ORD 16.
        assert_eq!(negotiate(c(8, 4), c(2, 16)), (8, 2));
        assert_eq!(negotiate(c(2, 16), c(8, 4)), (2, 8));
    }
}
