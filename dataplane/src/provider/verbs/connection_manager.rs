//! Connection management over librdmacm: listen, accept, connect
//! ([MS-SMBD] 3.1.4.1, 3.1.7.2, Appendix A), and the CM service thread that
//! turns connection loss into a queue pair in error (3.1.7.1). IRD/ORD (the
//! CM's fields, or the iWARP private-data header) are decided by the pure
//! functions of `ird_ord`; this module applies them.
//!
//! Threads: listening, accepting and connecting block the calling
//! (control-plane) thread on a private event channel. Once a connection is
//! accepted or established, its id moves (`rdma_migrate_id`) to the
//! provider's service channel, read by the `verbs-cm` thread. The ids'
//! `context` points at their [`ConnState`], which that thread uses; the
//! state's lock orders `rdma_disconnect` against the owner's
//! `rdma_destroy_qp`, and `rdma_destroy_id` waits for the thread to
//! acknowledge the id's events, so it never sees a freed state.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::raw::c_void;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdma_sys::*;
use smbdirect_protocol::smbd::wire::IrdOrdRepr;

use super::completion_queue::VerbsCqHandle;
use super::device::Device;
use super::ird_ord::{self, Carrier};
use super::queue_pair::VerbsQp;
use super::VerbsProvider;
use crate::provider::{ConnRequest, Listener, ProviderError, QpCaps, QpState, QueuePair, RecvWr};

/// Largest private data in a connect request (InfiniBand CM REQ, less the
/// rdma_cm header). On iWARP the 8-byte IRD/ORD header counts against it
/// (MPA allows more; we keep one limit for every transport).
pub const MAX_CONNECT_PRIVATE_DATA: usize = 56;
/// Largest private data in an accept (InfiniBand CM REP); on iWARP,
/// including the IRD/ORD header.
pub const MAX_ACCEPT_PRIVATE_DATA: usize = 196;
/// Listen backlog.
const BACKLOG: i32 = 128;

fn cm_err(what: &str) -> ProviderError {
    ProviderError::Other(format!("{what}: {}", io::Error::last_os_error()))
}

fn event_name(e: rdma_cm_event_type::Type) -> String {
    // SAFETY: rdma_event_str returns a static C string for any value.
    unsafe { std::ffi::CStr::from_ptr(rdma_event_str(e)) }
        .to_string_lossy()
        .into_owned()
}

/// `addr` as a C socket address.
pub(super) fn to_sockaddr(addr: &SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large and aligned enough for
            // sockaddr_in.
            let sin = unsafe {
                &mut *(&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>()
            };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
        }
        SocketAddr::V6(a) => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe {
                &mut *(&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            sin6.sin6_scope_id = a.scope_id();
        }
    }
    ss
}

/// A C socket address as a [`SocketAddr`] (None for other families).
///
/// # Safety
/// `sa` must point at a socket address as large as its family says.
pub(super) unsafe fn from_sockaddr(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    // SAFETY: the caller guarantees `sa` is valid.
    match unsafe { (*sa).sa_family } as i32 {
        libc::AF_INET => {
            // SAFETY: the family says it is a sockaddr_in.
            let sin = unsafe { &*sa.cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says it is a sockaddr_in6.
            let sin6 = unsafe { &*sa.cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

fn conn_param(private_data: &[u8], ird: u32, ord: u32, device: &Device) -> rdma_conn_param {
    let cfg = device.config();
    rdma_conn_param {
        private_data: if private_data.is_empty() {
            ptr::null()
        } else {
            private_data.as_ptr().cast()
        },
        private_data_len: private_data.len() as u8,
        responder_resources: ird as u8,
        initiator_depth: ord as u8,
        flow_control: 0,
        retry_count: cfg.retry_count.min(7),
        rnr_retry_count: cfg.rnr_retry.min(7),
        srq: 0,
        qp_num: 0,
    }
}

/// An rdma_cm event channel with a non-blocking descriptor.
pub(super) struct EventChannel(*mut rdma_event_channel);

// SAFETY: the channel is a file descriptor wrapper; librdmacm serialises
// access to it internally, and each channel is read by one thread.
unsafe impl Send for EventChannel {}
// SAFETY: as above.
unsafe impl Sync for EventChannel {}

impl EventChannel {
    pub fn new() -> Result<Self, ProviderError> {
        // SAFETY: plain constructor; destroyed in Drop.
        let ch = unsafe { rdma_create_event_channel() };
        if ch.is_null() {
            return Err(cm_err("rdma_create_event_channel"));
        }
        let ch = EventChannel(ch);
        let fd = ch.fd();
        // SAFETY: fcntl on the channel's own descriptor.
        let ok = unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
        };
        if !ok {
            return Err(cm_err("fcntl(O_NONBLOCK) on the rdma_cm channel"));
        }
        Ok(ch)
    }

    pub fn raw(&self) -> *mut rdma_event_channel {
        self.0
    }

    fn fd(&self) -> i32 {
        // SAFETY: the channel is live.
        unsafe { (*self.0).fd }
    }

    /// The next event, if one is queued.
    fn try_get(&self) -> Result<Option<CmEvent>, ProviderError> {
        let mut ev: *mut rdma_cm_event = ptr::null_mut();
        // SAFETY: the channel is live; `ev` is a valid out-pointer; the
        // event is acknowledged when the CmEvent drops.
        let rc = unsafe { rdma_get_cm_event(self.0, &mut ev) };
        if rc == 0 {
            return Ok(Some(CmEvent(ev)));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
            _ => Err(ProviderError::Other(format!("rdma_get_cm_event: {e}"))),
        }
    }

    /// Waits until `deadline` for an event.
    pub fn wait(&self, deadline: Instant) -> Result<Option<CmEvent>, ProviderError> {
        loop {
            if let Some(ev) = self.try_get()? {
                return Ok(Some(ev));
            }
            // The control plane waits here every 2 ms: crate::clock, not a
            // clock_gettime system call per wake where that is costly.
            let left = deadline.saturating_duration_since(crate::clock::now());
            if left.is_zero() {
                return Ok(None);
            }
            let mut pfd = libc::pollfd {
                fd: self.fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut pfd, 1, ms) };
        }
    }

    /// Waits for the event that follows a resolve/connect on `id`; any other
    /// event type is an error naming it.
    fn expect(
        &self,
        deadline: Instant,
        want: rdma_cm_event_type::Type,
        what: &str,
    ) -> Result<CmEvent, ProviderError> {
        let Some(ev) = self.wait(deadline)? else {
            return Err(ProviderError::Connect(format!(
                "{what}: timed out waiting for {}",
                event_name(want)
            )));
        };
        if ev.kind() != want {
            return Err(ProviderError::Connect(format!(
                "{what}: {} (status {}) instead of {}",
                event_name(ev.kind()),
                ev.status(),
                event_name(want)
            )));
        }
        Ok(ev)
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: every id on the channel was destroyed or migrated (ids are
        // owned by values that drop before their channel).
        unsafe { rdma_destroy_event_channel(self.0) };
    }
}

/// A received CM event, acknowledged on drop.
pub(super) struct CmEvent(*mut rdma_cm_event);

impl CmEvent {
    fn kind(&self) -> rdma_cm_event_type::Type {
        // SAFETY: the event is live until acknowledged in Drop.
        unsafe { (*self.0).event }
    }
    fn status(&self) -> i32 {
        // SAFETY: as above.
        unsafe { (*self.0).status }
    }
    fn id(&self) -> *mut rdma_cm_id {
        // SAFETY: as above.
        unsafe { (*self.0).id }
    }
    /// The connection parameters' private data (valid until the ack).
    fn private_data(&self) -> &[u8] {
        // SAFETY: for connection events the union holds `conn`; its private
        // data pointer and length stay valid until the event is acknowledged.
        unsafe {
            let c = &(*self.0).param.conn;
            if c.private_data.is_null() || c.private_data_len == 0 {
                &[]
            } else {
                std::slice::from_raw_parts(c.private_data.cast::<u8>(), c.private_data_len as usize)
            }
        }
    }
    /// The peer's (IRD, ORD) from its request or reply. The InfiniBand CM
    /// reports them from the receiver's point of view (`responder_resources`
    /// is the peer's initiator depth, what our IRD may use, and vice versa).
    fn peer_ird_ord(&self) -> (u8, u8) {
        // SAFETY: connection events carry `conn` in the union.
        unsafe {
            let c = &(*self.0).param.conn;
            (c.initiator_depth, c.responder_resources)
        }
    }
}

impl Drop for CmEvent {
    fn drop(&mut self) {
        // SAFETY: acknowledging the event we got, once.
        unsafe { rdma_ack_cm_event(self.0) };
    }
}

const CONNECTED: u8 = 0;
const ERROR: u8 = 1;
const DISCONNECTED: u8 = 2;

#[derive(Debug)]
struct Life {
    qp: *mut ibv_qp,
    disconnected: bool,
    /// The CM connection is established (the accepting side learns it after
    /// `accept` returned, when the peer's RTU arrives).
    established: bool,
    /// Disconnected before it was established: the kernel then moves the
    /// QP to error but sends no DREQ (silently), so `rdma_disconnect` is
    /// called again on ESTABLISHED.
    disconnect_pending: bool,
}

/// What the owner of a connection and the CM thread share.
pub(super) struct ConnState {
    id: *mut rdma_cm_id,
    state: AtomicU8,
    life: Mutex<Life>,
}

// SAFETY: `id` is used under `life`'s lock (disconnect, destroy_qp), and
// rdma_disconnect/rdma_destroy_qp are thread-safe librdmacm calls.
unsafe impl Send for ConnState {}
// SAFETY: as above.
unsafe impl Sync for ConnState {}

impl ConnState {
    fn lock(&self) -> std::sync::MutexGuard<'_, Life> {
        self.life.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_qp(&self, qp: *mut ibv_qp) {
        self.lock().qp = qp;
    }

    pub fn qp_state(&self) -> QpState {
        match self.state.load(Ordering::Acquire) {
            CONNECTED => QpState::Connected,
            ERROR => QpState::Error,
            _ => QpState::Disconnected,
        }
    }

    fn disconnect_locked(&self, life: &mut Life) {
        if !life.disconnected {
            life.disconnected = true;
            // SAFETY: the id is live (its owner destroys it only after
            // destroy_qp, under this lock). This moves the QP to the error
            // state (flushing it) and sends DREQ or DREP (if established).
            unsafe { rdma_disconnect(self.id) };
            life.disconnect_pending = !life.established;
        }
    }

    /// The CM connection is established: on the accepting side, by the CM
    /// thread; a disconnect asked for before that is sent now.
    fn established(&self) {
        let mut life = self.lock();
        life.established = true;
        if life.disconnect_pending {
            life.disconnect_pending = false;
            // SAFETY: as in disconnect_locked.
            unsafe { rdma_disconnect(self.id) };
        }
    }

    /// Connection lost (CM thread): flush the queue pair.
    fn lost(&self) {
        let mut life = self.lock();
        self.disconnect_locked(&mut life);
        let _ = self
            .state
            .compare_exchange(CONNECTED, ERROR, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Local disconnect.
    pub fn disconnect_local(&self) {
        let mut life = self.lock();
        self.disconnect_locked(&mut life);
        self.state.store(DISCONNECTED, Ordering::Release);
    }

    /// Disconnects (if still connected) and destroys the queue pair.
    pub fn destroy_qp(&self, id: *mut rdma_cm_id) {
        let mut life = self.lock();
        if life.qp.is_null() {
            return;
        }
        self.disconnect_locked(&mut life);
        self.state.store(DISCONNECTED, Ordering::Release);
        // SAFETY: the QP was created by rdma_create_qp on this id and is
        // destroyed once; the CM thread takes this lock before touching it.
        unsafe { rdma_destroy_qp(id) };
        life.qp = ptr::null_mut();
    }
}

/// Owns an rdma_cm id and the [`ConnState`] its `context` points at.
pub(super) struct CmId {
    id: *mut rdma_cm_id,
    state: Arc<ConnState>,
}

// SAFETY: the id is owned by this value; librdmacm calls on it are
// thread-safe and the shared part is in ConnState.
unsafe impl Send for CmId {}

impl CmId {
    /// Takes ownership of `id`, pointing its context at a new state. Must
    /// be called before any other thread can see the id's events.
    fn adopt(id: *mut rdma_cm_id) -> CmId {
        let state = Arc::new(ConnState {
            id,
            state: AtomicU8::new(CONNECTED),
            life: Mutex::new(Life {
                qp: ptr::null_mut(),
                disconnected: false,
                established: false,
                disconnect_pending: false,
            }),
        });
        // SAFETY: the id is live and not yet visible to the CM thread; the
        // strong count moved into the context is taken back in Drop.
        unsafe { (*id).context = Arc::into_raw(state.clone()) as *mut c_void };
        CmId { id, state }
    }

    /// Creates an id on `channel`.
    fn create(channel: &EventChannel) -> Result<CmId, ProviderError> {
        let mut id = ptr::null_mut();
        // SAFETY: the channel is live; the id is destroyed by CmId::drop.
        let rc = unsafe {
            rdma_create_id(
                channel.raw(),
                &mut id,
                ptr::null_mut(),
                rdma_port_space::RDMA_PS_TCP,
            )
        };
        if rc != 0 {
            return Err(cm_err("rdma_create_id"));
        }
        Ok(CmId::adopt(id))
    }

    pub fn raw(&self) -> *mut rdma_cm_id {
        self.id
    }

    pub fn state(&self) -> &ConnState {
        &self.state
    }

    /// Moves the id's events to `channel`.
    fn migrate(&self, channel: &EventChannel) -> Result<(), ProviderError> {
        // SAFETY: the id is live and none of its events is unacknowledged
        // on this thread.
        if unsafe { rdma_migrate_id(self.id, channel.raw()) } != 0 {
            return Err(cm_err("rdma_migrate_id"));
        }
        Ok(())
    }

    /// Whether the id is bound to the provider's verbs context.
    fn on_device(&self, device: &Device) -> bool {
        // SAFETY: the id is live.
        let verbs = unsafe { (*self.id).verbs };
        verbs == device.ctx()
    }

    fn device_name(&self) -> String {
        // SAFETY: the id is live; a non-null verbs context has a device.
        unsafe {
            let verbs = (*self.id).verbs;
            if verbs.is_null() {
                return "no device".into();
            }
            std::ffi::CStr::from_ptr(ibv_get_device_name((*verbs).device))
                .to_string_lossy()
                .into_owned()
        }
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: the id is live; librdmacm keeps its address storage large
        // enough for the family.
        unsafe { from_sockaddr(rdma_get_local_addr(&*self.id)) }
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: as above.
        unsafe { from_sockaddr(rdma_get_peer_addr(&*self.id)) }
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: destroyed once; rdma_destroy_id returns after every event
        // of the id that was reported has been acknowledged, so the CM
        // thread is done with the context when it is released below.
        unsafe {
            let ctx = (*self.id).context as *const ConnState;
            rdma_destroy_id(self.id);
            if !ctx.is_null() {
                drop(Arc::from_raw(ctx));
            }
        }
    }
}

struct CmShared {
    channel: EventChannel,
    wake: OwnedFd,
    stop: AtomicBool,
}

/// The provider's CM thread and its event channel.
pub(super) struct CmService {
    shared: Arc<CmShared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl CmService {
    pub fn start() -> Result<CmService, ProviderError> {
        let channel = EventChannel::new()?;
        // SAFETY: plain eventfd creation; owned by OwnedFd.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(cm_err("eventfd"));
        }
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        let wake = unsafe { OwnedFd::from_raw_fd(fd) };
        let shared = Arc::new(CmShared {
            channel,
            wake,
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("verbs-cm".into())
            .spawn(move || service(&s))
            .map_err(ProviderError::Io)?;
        Ok(CmService {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    fn channel(&self) -> &EventChannel {
        &self.shared.channel
    }

    /// Stops and joins the thread (idempotent).
    pub fn stop(&self) {
        let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        self.shared.stop.store(true, Ordering::Release);
        let one: u64 = 1;
        // SAFETY: writing 8 bytes to our eventfd.
        unsafe { libc::write(self.shared.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
        let _ = t.join();
    }
}

impl Drop for CmService {
    fn drop(&mut self) {
        self.stop();
    }
}

fn service(s: &CmShared) {
    while !s.stop.load(Ordering::Acquire) {
        match s.channel.try_get() {
            Ok(Some(ev)) => handle(&ev),
            Ok(None) => {
                let mut fds = [
                    libc::pollfd {
                        fd: s.channel.fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    },
                    libc::pollfd {
                        fd: s.wake.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    },
                ];
                // SAFETY: two valid pollfds.
                unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

fn handle(ev: &CmEvent) {
    // SAFETY: the event's id is live until the event is acknowledged (its
    // destroy waits for that), and so is the state its context holds a
    // strong count of.
    let state = unsafe {
        let ctx = (*ev.id()).context as *const ConnState;
        if ctx.is_null() {
            return;
        }
        &*ctx
    };
    match ev.kind() {
        rdma_cm_event_type::RDMA_CM_EVENT_DISCONNECTED
        | rdma_cm_event_type::RDMA_CM_EVENT_DEVICE_REMOVAL
        | rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_ERROR
        | rdma_cm_event_type::RDMA_CM_EVENT_UNREACHABLE
        | rdma_cm_event_type::RDMA_CM_EVENT_REJECTED => state.lost(),
        // The accepting side's (accept returns before it).
        rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED => state.established(),
        // TIMEWAIT_EXIT, ADDR_CHANGE: nothing to do.
        _ => {}
    }
}

/// A listening rdma_cm id.
pub struct VerbsListener {
    // Field order: the id is destroyed before its channel.
    id: CmId,
    channel: EventChannel,
    addr: SocketAddr,
    device: Arc<Device>,
}

impl std::fmt::Debug for VerbsListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsListener")
            .field("addr", &self.addr)
            .field("id", &self.id.raw())
            .finish_non_exhaustive()
    }
}

impl VerbsListener {
    pub(super) fn new(device: &Arc<Device>, addr: SocketAddr) -> Result<Self, ProviderError> {
        let channel = EventChannel::new()?;
        let id = CmId::create(&channel)?;
        let mut sa = to_sockaddr(&addr);
        // SAFETY: the id is live; `sa` is a valid socket address.
        if unsafe { rdma_bind_addr(id.raw(), (&mut sa as *mut libc::sockaddr_storage).cast()) } != 0
        {
            return Err(ProviderError::Connect(format!(
                "rdma_bind_addr({addr}): {} (is it the address of an RDMA device's interface?)",
                io::Error::last_os_error()
            )));
        }
        // SAFETY: the id is live.
        let bound_verbs = unsafe { (*id.raw()).verbs };
        if !bound_verbs.is_null() && !id.on_device(device) {
            return Err(ProviderError::Connect(format!(
                "{addr} belongs to RDMA device {}, but this provider opened {}",
                id.device_name(),
                device.name()
            )));
        }
        // SAFETY: the id is bound.
        if unsafe { rdma_listen(id.raw(), BACKLOG) } != 0 {
            return Err(ProviderError::Connect(format!(
                "rdma_listen({addr}): {}",
                io::Error::last_os_error()
            )));
        }
        let addr = id.local_addr().unwrap_or(addr);
        Ok(VerbsListener {
            id,
            channel,
            addr,
            device: device.clone(),
        })
    }
}

impl Listener<VerbsProvider> for VerbsListener {
    fn accept_request(&mut self, timeout: Duration) -> Result<Option<VerbsRequest>, ProviderError> {
        let deadline = crate::clock::now() + timeout;
        loop {
            let Some(ev) = self.channel.wait(deadline)? else {
                return Ok(None);
            };
            match ev.kind() {
                rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST => {}
                rdma_cm_event_type::RDMA_CM_EVENT_DEVICE_REMOVAL => {
                    return Err(ProviderError::Connect(format!(
                        "listener {}: device {} removed",
                        self.addr,
                        self.device.name()
                    )))
                }
                _ => continue,
            }
            let id = ev.id();
            // [MS-SMBD] 6.2: on iWARP the peer's IRD/ORD header is the start
            // of the private data; the caller sees what follows it.
            let carrier = Carrier::of(self.device.limits().transport);
            let (peer_header, private_data) = ird_ord::split_request(carrier, ev.private_data());
            let private_data = private_data.to_vec();
            let (peer_ird, peer_ord) = ev.peer_ird_ord();
            // Acknowledge before migrating the new id (migration waits for
            // its events to be acknowledged).
            drop(ev);
            let cm_id = CmId::adopt(id);
            let peer = cm_id
                .peer_addr()
                .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
            let req = VerbsRequest {
                cm_id: Some(cm_id),
                device: self.device.clone(),
                private_data,
                peer,
                peer_ird,
                peer_ord,
                peer_header,
            };
            let cm_id = req.cm_id.as_ref().expect("just set");
            if !cm_id.on_device(&self.device) {
                let msg = format!(
                    "connection request from {peer} arrived on RDMA device {}, but this provider opened {}; rejected",
                    cm_id.device_name(),
                    self.device.name()
                );
                drop(req);
                return Err(ProviderError::Connect(msg));
            }
            cm_id.migrate(self.device.cm().channel())?;
            return Ok(Some(req));
        }
    }

    fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The listener's own event channel (rdma_cm's `fd`, readable while an
    /// event is queued).
    fn poll_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(self.channel.fd())
    }
}

/// A connection request waiting at a [`VerbsListener`]. Dropping it rejects.
pub struct VerbsRequest {
    cm_id: Option<CmId>,
    device: Arc<Device>,
    /// The peer's private data after the IRD/ORD header (if any).
    private_data: Vec<u8>,
    peer: SocketAddr,
    /// The peer's (IRD, ORD) as the CM reports them.
    peer_ird: u8,
    peer_ord: u8,
    /// The peer's IRD/ORD negotiate header (iWARP, [MS-SMBD] 6.1).
    peer_header: Option<IrdOrdRepr>,
}

impl std::fmt::Debug for VerbsRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsRequest")
            .field("peer", &self.peer)
            .field("peer_ird", &self.peer_ird)
            .field("peer_ord", &self.peer_ord)
            .field("peer_header", &self.peer_header)
            .finish_non_exhaustive()
    }
}

impl VerbsRequest {
    /// The peer's (IRD, ORD) offer: from its IRD/ORD header on iWARP (when
    /// it sent one), else as the CM reports it.
    pub fn peer_ird_ord(&self) -> (u32, u32) {
        match self.peer_header {
            Some(h) => (h.ird, h.ord),
            None => (self.peer_ird as u32, self.peer_ord as u32),
        }
    }
}

impl ConnRequest<VerbsProvider> for VerbsRequest {
    fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    fn accept(
        self,
        cq: &VerbsCqHandle,
        caps: QpCaps,
        private_data: &[u8],
    ) -> Result<VerbsQp, ProviderError> {
        self.accept_with_receives(cq, caps, private_data, &[])
    }

    /// Posts `recvs` on the new queue pair *before* `rdma_accept` sends the
    /// reply, so the peer's first Send always finds a receive (as ksmbd and
    /// SPDK do), then accepts.
    ///
    /// On iWARP with the peer's IRD/ORD header ([MS-SMBD] 6.2): negotiates,
    /// rejects the request (no accept) when the result is zero, sets the
    /// queue pair's IRD/ORD before `rdma_accept`, and puts the reply's header
    /// first in the accept's private data.
    fn accept_with_receives(
        mut self,
        cq: &VerbsCqHandle,
        caps: QpCaps,
        private_data: &[u8],
        recvs: &[RecvWr],
    ) -> Result<VerbsQp, ProviderError> {
        let header_len = if self.peer_header.is_some() {
            ird_ord::HEADER_LEN
        } else {
            0
        };
        if header_len + private_data.len() > MAX_ACCEPT_PRIVATE_DATA {
            return Err(ProviderError::Connect(format!(
                "accept private data of {} bytes exceeds {} (the limit of {MAX_ACCEPT_PRIVATE_DATA}, less {header_len} for the IRD/ORD header)",
                private_data.len(),
                MAX_ACCEPT_PRIVATE_DATA - header_len
            )));
        }
        let limits = *self.device.limits();
        let offered =
            ird_ord::offered_ird_ord(&caps, limits.max_qp_rd_atom, limits.max_qp_init_rd_atom);
        let plan = match ird_ord::plan_accept(
            offered,
            (self.peer_ird, self.peer_ord),
            self.peer_header,
        ) {
            Ok(plan) => plan,
            Err(e) => {
                let peer = self.peer;
                let theirs = self.peer_header;
                drop(self); // rejects
                return Err(ProviderError::Connect(format!(
                    "connection request from {peer}: {e} (peer header {theirs:?}, our offer (IRD, ORD) = {offered:?}); rejected"
                )));
            }
        };
        let (ird, ord) = (plan.ird, plan.ord);
        let reply = plan.private_data(private_data);
        let cm_id = self.cm_id.take().expect("a request is accepted once");
        let mut qp = match VerbsQp::create(&self.device, cm_id, cq, caps) {
            Ok(qp) => qp,
            Err((e, cm_id)) => {
                self.cm_id = Some(cm_id);
                return Err(e); // dropping `self` rejects
            }
        };
        qp.set_ird_ord(ird, ord);
        if !recvs.is_empty() {
            qp.post_recv(recvs)?;
        }
        let mut param = conn_param(&reply, ird, ord, &self.device);
        // SAFETY: the id has its QP; `param` and the private data it points
        // at outlive the call.
        if unsafe { rdma_accept(qp.cm_id().raw(), &mut param) } != 0 {
            return Err(ProviderError::Connect(format!(
                "rdma_accept from {}: {}",
                self.peer,
                io::Error::last_os_error()
            )));
        }
        Ok(qp)
    }

    fn reject(self) {
        // Drop rejects.
    }
}

impl Drop for VerbsRequest {
    fn drop(&mut self) {
        if let Some(cm_id) = self.cm_id.take() {
            // SAFETY: the id is a live, unanswered connection request.
            unsafe { rdma_reject(cm_id.raw(), ptr::null(), 0) };
        }
    }
}

/// [`Provider::connect`](crate::provider::Provider::connect) for verbs.
pub(super) fn connect(
    device: &Arc<Device>,
    addr: SocketAddr,
    cq: &VerbsCqHandle,
    caps: QpCaps,
    private_data: &[u8],
    timeout: Duration,
) -> Result<(VerbsQp, Vec<u8>), ProviderError> {
    let carrier = Carrier::of(device.limits().transport);
    let header_len = carrier.header_len();
    if header_len + private_data.len() > MAX_CONNECT_PRIVATE_DATA {
        return Err(ProviderError::Connect(format!(
            "connect private data of {} bytes exceeds {} (the limit of {MAX_CONNECT_PRIVATE_DATA}, less {header_len} for the IRD/ORD header)",
            private_data.len(),
            MAX_CONNECT_PRIVATE_DATA - header_len
        )));
    }
    let deadline = Instant::now() + timeout;
    let ms = |d: Instant| {
        d.saturating_duration_since(Instant::now())
            .as_millis()
            .clamp(1, i32::MAX as u128) as i32
    };
    // Declared before the id so it is dropped after it.
    let channel = EventChannel::new()?;
    let cm_id = CmId::create(&channel)?;
    let mut dst = to_sockaddr(&addr);
    // SAFETY: the id is live; `dst` is a valid address.
    if unsafe {
        rdma_resolve_addr(
            cm_id.raw(),
            ptr::null_mut(),
            (&mut dst as *mut libc::sockaddr_storage).cast(),
            ms(deadline),
        )
    } != 0
    {
        return Err(ProviderError::Connect(format!(
            "rdma_resolve_addr({addr}): {}",
            io::Error::last_os_error()
        )));
    }
    drop(channel.expect(
        deadline,
        rdma_cm_event_type::RDMA_CM_EVENT_ADDR_RESOLVED,
        &format!("resolving {addr}"),
    )?);
    if !cm_id.on_device(device) {
        return Err(ProviderError::Connect(format!(
            "{addr} is reached through RDMA device {}, but this provider opened {}",
            cm_id.device_name(),
            device.name()
        )));
    }
    // SAFETY: the id's address is resolved.
    if unsafe { rdma_resolve_route(cm_id.raw(), ms(deadline)) } != 0 {
        return Err(ProviderError::Connect(format!(
            "rdma_resolve_route({addr}): {}",
            io::Error::last_os_error()
        )));
    }
    drop(channel.expect(
        deadline,
        rdma_cm_event_type::RDMA_CM_EVENT_ROUTE_RESOLVED,
        &format!("route to {addr}"),
    )?);
    let limits = *device.limits();
    let offered =
        ird_ord::offered_ird_ord(&caps, limits.max_qp_rd_atom, limits.max_qp_init_rd_atom);
    // [MS-SMBD] 6.1: on iWARP our offer goes first in the private data.
    let request = ird_ord::connect_private_data(carrier, offered, private_data);
    let mut qp = VerbsQp::create(device, cm_id, cq, caps).map_err(|(e, _id)| e)?;
    let mut param = conn_param(&request, offered.0, offered.1, device);
    // SAFETY: the id has its route and QP; `param` and its private data
    // outlive the call.
    if unsafe { rdma_connect(qp.cm_id().raw(), &mut param) } != 0 {
        return Err(ProviderError::Connect(format!(
            "rdma_connect({addr}): {}",
            io::Error::last_os_error()
        )));
    }
    let Some(ev) = channel.wait(deadline)? else {
        return Err(ProviderError::Connect(format!(
            "connecting to {addr}: timed out"
        )));
    };
    match ev.kind() {
        rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED => {}
        rdma_cm_event_type::RDMA_CM_EVENT_REJECTED => {
            return Err(ProviderError::Connect(format!(
                "{addr} rejected the connection (status {})",
                ev.status()
            )))
        }
        other => {
            return Err(ProviderError::Connect(format!(
                "connecting to {addr}: {} (status {})",
                event_name(other),
                ev.status()
            )))
        }
    }
    qp.cm_id().state().established();
    // [MS-SMBD] 6.2: on iWARP, the accepting peer's header decides our
    // IRD/ORD (and is not the caller's private data).
    let established =
        ird_ord::complete_connect(carrier, offered, ev.peer_ird_ord(), ev.private_data());
    let established = match established {
        Ok(e) => e,
        Err(e) => {
            let header = ev
                .private_data()
                .get(..ird_ord::HEADER_LEN)
                .map(|h| h.to_vec());
            drop(ev);
            // Dropping the queue pair disconnects the established connection.
            return Err(ProviderError::Connect(format!(
                "{addr} accepted with an unusable IRD/ORD header {header:02x?}: {e}"
            )));
        }
    };
    let (ird, ord) = (established.ird, established.ord);
    let reply = established.private_data.to_vec();
    drop(ev);
    qp.set_ird_ord(ird, ord);
    qp.cm_id().migrate(device.cm().channel())?;
    Ok((qp, reply))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_addresses_round_trip_through_sockaddr() {
        for a in ["10.0.2.15:445", "[fe80::1%3]:5445", "0.0.0.0:0"] {
            let addr: SocketAddr = a.parse().unwrap();
            let ss = to_sockaddr(&addr);
            // SAFETY: `ss` holds a valid address of its family.
            let back = unsafe { from_sockaddr((&ss as *const libc::sockaddr_storage).cast()) };
            assert_eq!(back, Some(addr), "{a}");
        }
    }
}
