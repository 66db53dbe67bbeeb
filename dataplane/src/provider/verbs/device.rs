//! The opened device (verbs context, protection domain, registered pools) and
//! the device listing for the CLI.

use std::ffi::CStr;
use std::io;
use std::os::raw::c_int;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rdma_sys::*;

use super::connection_manager::CmService;
use super::{GrantMode, VerbsConfig};
use crate::provider::{MemoryRegion, ProviderError};

/// Transport of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// InfiniBand or RoCE (IB transport; the port's link layer tells which).
    InfiniBand,
    /// iWARP.
    Iwarp,
    /// Anything else (usNIC, unknown), with the raw value.
    Other(i32),
}

impl Transport {
    /// The port SMB Direct listens on by default over this transport: 445
    /// on InfiniBand and RoCE (as Windows and ksmbd use), 5445 on iWARP
    /// ([MS-SMBD] 6.1; ksmbd's `SMB_DIRECT_PORT_IWARP`).
    pub const fn smb_direct_port(self) -> u16 {
        match self {
            Transport::Iwarp => 5445,
            Transport::InfiniBand | Transport::Other(_) => 445,
        }
    }
}

/// State of a port (`ibv_port_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortState {
    /// No link.
    Down,
    /// Link up, not yet configured.
    Init,
    /// Configured, not yet active.
    Armed,
    /// Usable.
    Active,
    /// Active, deferred.
    ActiveDefer,
    /// Anything else, raw.
    Other(u32),
}

/// Link layer of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    /// InfiniBand.
    InfiniBand,
    /// Ethernet (RoCE, iWARP).
    Ethernet,
    /// Not reported.
    Unspecified,
}

/// Which memory windows a device offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryWindowSupport {
    /// Type 2 (2A and/or 2B): bound to one queue pair by a posted work
    /// request. What grants use.
    Type2,
    /// Only type 1 windows (bound by a verb call, usable from any queue
    /// pair): grants fall back to per-I/O registration.
    Type1Only,
    /// No memory windows: grants fall back to per-I/O registration.
    None,
}

/// How grants are implemented on a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrantMechanism {
    /// A type-2 memory window per grant, bound to the queue pair.
    MemoryWindow,
    /// A per-I/O `ibv_reg_mr` of the exact range (no type-2 windows).
    Registration,
}

/// One port of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    /// Port number (from 1).
    pub port: u8,
    /// State.
    pub state: PortState,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// Active MTU in bytes (0 if unknown).
    pub active_mtu: u32,
    /// Largest MTU in bytes.
    pub max_mtu: u32,
    /// LID (InfiniBand only; 0 on Ethernet).
    pub lid: u16,
    /// Entries in the GID table.
    pub gid_table_len: u32,
}

/// One RDMA device, as `ibv_query_device` and `ibv_query_port` describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Name (`mlx5_0`, `rxe0`).
    pub name: String,
    /// Node GUID (host order).
    pub node_guid: u64,
    /// Transport.
    pub transport: Transport,
    /// Firmware version string.
    pub fw_ver: String,
    /// Maximum memory regions.
    pub max_mr: u32,
    /// Largest memory region in bytes.
    pub max_mr_size: u64,
    /// Maximum queue pairs.
    pub max_qp: u32,
    /// Maximum work requests per queue.
    pub max_qp_wr: u32,
    /// Maximum scatter/gather entries per work request.
    pub max_sge: u32,
    /// Maximum completion queues.
    pub max_cq: u32,
    /// Maximum entries per completion queue.
    pub max_cqe: u32,
    /// Maximum memory windows.
    pub max_mw: u32,
    /// Maximum incoming RDMA Reads per queue pair (the IRD limit).
    pub max_qp_rd_atom: u32,
    /// Maximum outgoing RDMA Reads per queue pair (the ORD limit).
    pub max_qp_init_rd_atom: u32,
    /// Memory window support.
    pub memory_windows: MemoryWindowSupport,
    /// What grants use on this device with the default configuration.
    pub grants: GrantMechanism,
    /// Ports.
    pub ports: Vec<PortInfo>,
}

impl DeviceInfo {
    /// The node GUID the way `ibv_devinfo` prints it (`5054:00ff:fe12:3456`).
    pub fn node_guid_string(&self) -> String {
        let g = self.node_guid;
        format!(
            "{:04x}:{:04x}:{:04x}:{:04x}",
            g >> 48,
            (g >> 32) & 0xffff,
            (g >> 16) & 0xffff,
            g & 0xffff
        )
    }
}

/// Lists the RDMA devices of this host and their ports. A host without RDMA
/// devices, or without kernel RDMA support at all, gets an empty list.
pub fn devices() -> Result<Vec<DeviceInfo>, ProviderError> {
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out-pointer; the list is freed below.
    let list = unsafe { ibv_get_device_list(&mut n) };
    if list.is_null() {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            // No uverbs ABI (kernel without RDMA support) or no sysfs class.
            Some(libc::ENOSYS) | Some(libc::ENOENT) | Some(libc::ENODEV) | Some(0) | None => {
                Ok(Vec::new())
            }
            _ => Err(ProviderError::Other(format!("ibv_get_device_list: {e}"))),
        };
    }
    let mut out = Vec::new();
    let mut err = None;
    for i in 0..n.max(0) as usize {
        // SAFETY: the list holds `n` valid device pointers.
        let dev = unsafe { *list.add(i) };
        match describe(dev) {
            Ok(info) => out.push(info),
            Err(e) => {
                err = Some(e);
                break;
            }
        }
    }
    // SAFETY: `list` came from ibv_get_device_list and is freed once.
    unsafe { ibv_free_device_list(list) };
    match err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

fn describe(dev: *mut ibv_device) -> Result<DeviceInfo, ProviderError> {
    // SAFETY: `dev` is a live entry of the device list; the name is a C
    // string inside it.
    let name = unsafe { CStr::from_ptr(ibv_get_device_name(dev)) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: as above.
    let transport = transport_of(unsafe { (*dev).transport_type });
    // SAFETY: opening a listed device; closed below.
    let ctx = unsafe { ibv_open_device(dev) };
    if ctx.is_null() {
        return Err(ProviderError::Other(format!(
            "ibv_open_device({name}): {}",
            io::Error::last_os_error()
        )));
    }
    let result = describe_open(ctx, name, transport);
    // SAFETY: `ctx` was opened above and is not used afterwards.
    unsafe { ibv_close_device(ctx) };
    result
}

fn describe_open(
    ctx: *mut ibv_context,
    name: String,
    transport: Transport,
) -> Result<DeviceInfo, ProviderError> {
    let attr = query_device(ctx)
        .map_err(|e| ProviderError::Other(format!("ibv_query_device({name}): {e}")))?;
    let mut ports = Vec::new();
    for port in 1..=attr.phys_port_cnt {
        // SAFETY: all-zero is a valid ibv_port_attr (plain integers).
        let mut pa: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` is open, `pa` is a valid out-pointer of the size the
        // helper passes to the provider.
        let rc = unsafe { ___ibv_query_port(ctx, port, &mut pa) };
        if rc != 0 {
            return Err(ProviderError::Other(format!(
                "ibv_query_port({name}, port {port}): {}",
                io::Error::from_raw_os_error(rc)
            )));
        }
        ports.push(PortInfo {
            port,
            state: port_state(pa.state),
            link_layer: match pa.link_layer {
                1 => LinkLayer::InfiniBand,
                2 => LinkLayer::Ethernet,
                _ => LinkLayer::Unspecified,
            },
            active_mtu: mtu_bytes(pa.active_mtu),
            max_mtu: mtu_bytes(pa.max_mtu),
            lid: pa.lid,
            gid_table_len: pa.gid_tbl_len.max(0) as u32,
        });
    }
    let memory_windows = mw_support(attr.device_cap_flags);
    // The C string is NUL-terminated within its 64 bytes.
    let fw: Vec<u8> = attr
        .fw_ver
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    Ok(DeviceInfo {
        name,
        node_guid: u64::from_be(attr.node_guid),
        transport,
        fw_ver: String::from_utf8_lossy(&fw).into_owned(),
        max_mr: nonneg(attr.max_mr),
        max_mr_size: attr.max_mr_size,
        max_qp: nonneg(attr.max_qp),
        max_qp_wr: nonneg(attr.max_qp_wr),
        max_sge: nonneg(attr.max_sge),
        max_cq: nonneg(attr.max_cq),
        max_cqe: nonneg(attr.max_cqe),
        max_mw: nonneg(attr.max_mw),
        max_qp_rd_atom: nonneg(attr.max_qp_rd_atom),
        max_qp_init_rd_atom: nonneg(attr.max_qp_init_rd_atom),
        memory_windows,
        grants: if memory_windows == MemoryWindowSupport::Type2 {
            GrantMechanism::MemoryWindow
        } else {
            GrantMechanism::Registration
        },
        ports,
    })
}

fn nonneg(v: c_int) -> u32 {
    v.max(0) as u32
}

fn query_device(ctx: *mut ibv_context) -> io::Result<ibv_device_attr> {
    // SAFETY: all-zero is a valid ibv_device_attr (integers and arrays).
    let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
    // SAFETY: `ctx` is an open context and `attr` a valid out-pointer.
    let rc = unsafe { ibv_query_device(ctx, &mut attr) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(attr)
}

pub(super) fn transport_of(t: ibv_transport_type::Type) -> Transport {
    match t {
        ibv_transport_type::IBV_TRANSPORT_IB => Transport::InfiniBand,
        ibv_transport_type::IBV_TRANSPORT_IWARP => Transport::Iwarp,
        other => Transport::Other(other),
    }
}

fn port_state(s: ibv_port_state::Type) -> PortState {
    match s {
        ibv_port_state::IBV_PORT_DOWN => PortState::Down,
        ibv_port_state::IBV_PORT_INIT => PortState::Init,
        ibv_port_state::IBV_PORT_ARMED => PortState::Armed,
        ibv_port_state::IBV_PORT_ACTIVE => PortState::Active,
        ibv_port_state::IBV_PORT_ACTIVE_DEFER => PortState::ActiveDefer,
        other => PortState::Other(other),
    }
}

/// `ibv_mtu` (1 = 256 … 5 = 4096) in bytes.
pub(super) fn mtu_bytes(m: ibv_mtu::Type) -> u32 {
    match m {
        1..=5 => 128 << m,
        _ => 0,
    }
}

pub(super) fn mw_support(cap_flags: u32) -> MemoryWindowSupport {
    let f = ibv_device_cap_flags(cap_flags);
    let type2 = ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2A
        | ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2B;
    if (f & type2).0 != 0 {
        MemoryWindowSupport::Type2
    } else if (f & ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW).0 != 0 {
        MemoryWindowSupport::Type1Only
    } else {
        MemoryWindowSupport::None
    }
}

/// One registered pool.
#[derive(Debug, Clone, Copy)]
pub(super) struct MrEntry {
    pub addr: u64,
    pub len: u64,
    pub lkey: u32,
    pub mr: *mut ibv_mr,
}

// SAFETY: the pointer is only passed to verbs calls (bind, dereg), which are
// thread-safe; the entry itself is plain data.
unsafe impl Send for MrEntry {}

impl MrEntry {
    /// Whether `[addr, addr + len)` lies inside this registration.
    pub fn covers(&self, addr: u64, len: u32, lkey: u32) -> bool {
        lkey == self.lkey
            && addr >= self.addr
            && addr.saturating_add(len as u64) <= self.addr + self.len
    }
}

/// Device limits the provider checks against.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    pub max_qp_wr: u32,
    pub max_sge: u32,
    pub max_cqe: u32,
    pub max_qp_rd_atom: u32,
    pub max_qp_init_rd_atom: u32,
    pub transport: Transport,
    /// Workarounds for this device.
    pub quirks: Quirks,
}

/// rdma_rxe's vendor id (`RXE_VENDOR_ID`).
const RXE_VENDOR_ID: u32 = 0xff_ffff;

/// Workarounds for rdma_rxe (Soft-RoCE), found running the conformance
/// suite on Linux 6.1; all off on other devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Quirks {
    /// rxe writes the kernel's `IB_WC_WITH_INVALIDATE` (bit 2) into user
    /// completions, where libibverbs has `IBV_WC_WITH_INV` at bit 3 and
    /// `IBV_WC_IP_CSUM_OK` at bit 2. An IP checksum flag cannot occur on a
    /// reliable-connected queue pair, so bit 2 on a receive is read as
    /// "invalidated" too (the rkey itself is in its place).
    pub kernel_wc_flags: bool,
    /// rxe completes a receive too short for the message with
    /// `IBV_WC_LOC_QP_OP_ERR`, not `IBV_WC_LOC_LEN_ERR`.
    pub length_error_as_qp_op_error: bool,
    /// rxe checks an access through a memory window against the range of
    /// the window's memory region, not of the window: a peer could reach
    /// any byte of the pool. Each window is therefore bound onto a
    /// registration of exactly the granted bytes (a registration per grant
    /// on rxe only).
    pub window_bounds_from_region: bool,
}

impl Quirks {
    /// The quirks of the device with these ids.
    pub fn of(vendor_id: u32, vendor_part_id: u32) -> Quirks {
        let rxe = vendor_id == RXE_VENDOR_ID && vendor_part_id == 0;
        Quirks {
            kernel_wc_flags: rxe,
            length_error_as_qp_op_error: rxe,
            window_bounds_from_region: rxe,
        }
    }

    /// The `wc_flags` bits that report a Send with Invalidate on a receive.
    pub fn with_inv_flags(&self) -> u32 {
        let inv = ibv_wc_flags::IBV_WC_WITH_INV.0;
        if self.kernel_wc_flags {
            inv | ibv_wc_flags::IBV_WC_IP_CSUM_OK.0
        } else {
            inv
        }
    }
}

/// An opened device: the verbs context librdmacm uses for it, a protection
/// domain, the pools registered on it and the CM service. Everything made on
/// the device (completion queues, queue pairs, listeners) holds an `Arc` of
/// it, so it is torn down last.
pub struct Device {
    list: *mut *mut ibv_context,
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    name: String,
    limits: Limits,
    grants: GrantMechanism,
    config: VerbsConfig,
    mrs: Mutex<Vec<MrEntry>>,
    mr_generation: AtomicU64,
    mr_removals: AtomicU64,
    cm: CmService,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.name)
            .field("grants", &self.grants)
            .finish_non_exhaustive()
    }
}

// SAFETY: the context and protection domain are used only through verbs
// calls that libibverbs documents as thread-safe (create/destroy of CQs, QPs,
// MRs, MWs); mutable provider state is behind the mutex and atomics.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

impl Device {
    pub(super) fn open(config: VerbsConfig) -> Result<Arc<Device>, ProviderError> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer; the list is kept until drop,
        // since librdmacm's ids point at these contexts.
        let list = unsafe { rdma_get_devices(&mut n) };
        if list.is_null() || n <= 0 {
            if !list.is_null() {
                // SAFETY: freeing the (empty) list we just got.
                unsafe { rdma_free_devices(list) };
            }
            return Err(ProviderError::Unsupported(
                "no RDMA device (librdmacm found none)",
            ));
        }
        let mut chosen: *mut ibv_context = ptr::null_mut();
        let mut names = Vec::new();
        for i in 0..n as usize {
            // SAFETY: the list holds `n` open contexts.
            let ctx = unsafe { *list.add(i) };
            // SAFETY: each context points at its device, whose name is a C string.
            let name = unsafe { CStr::from_ptr(ibv_get_device_name((*ctx).device)) }
                .to_string_lossy()
                .into_owned();
            if chosen.is_null()
                && match config.device.as_deref() {
                    None => true,
                    Some(want) => want == name,
                }
            {
                chosen = ctx;
            }
            names.push(name);
        }
        if chosen.is_null() {
            // SAFETY: freeing the list we got above; nothing refers to it.
            unsafe { rdma_free_devices(list) };
            return Err(ProviderError::Other(format!(
                "RDMA device {:?} not found (devices: {})",
                config.device.as_deref().unwrap_or(""),
                names.join(", ")
            )));
        }
        let ctx = chosen;
        // SAFETY: `ctx` is an open context from the list.
        let name = unsafe { CStr::from_ptr(ibv_get_device_name((*ctx).device)) }
            .to_string_lossy()
            .into_owned();
        let cleanup = |list| {
            // SAFETY: error path: nothing else refers to the list.
            unsafe { rdma_free_devices(list) }
        };
        let attr = match query_device(ctx) {
            Ok(a) => a,
            Err(e) => {
                cleanup(list);
                return Err(ProviderError::Other(format!(
                    "ibv_query_device({name}): {e}"
                )));
            }
        };
        let mw = mw_support(attr.device_cap_flags);
        let grants = match (config.grants, mw) {
            (GrantMode::Registration, _) => GrantMechanism::Registration,
            (_, MemoryWindowSupport::Type2) => GrantMechanism::MemoryWindow,
            (GrantMode::MemoryWindow, _) => {
                cleanup(list);
                return Err(ProviderError::Unsupported(
                    "device has no type-2 memory windows",
                ));
            }
            (GrantMode::Auto, _) => GrantMechanism::Registration,
        };
        // SAFETY: `ctx` is an open context; the PD is freed on drop.
        let pd = unsafe { ibv_alloc_pd(ctx) };
        if pd.is_null() {
            let e = io::Error::last_os_error();
            cleanup(list);
            return Err(ProviderError::Other(format!("ibv_alloc_pd({name}): {e}")));
        }
        let cm = match CmService::start() {
            Ok(cm) => cm,
            Err(e) => {
                // SAFETY: the PD has no dependants yet.
                unsafe { ibv_dealloc_pd(pd) };
                cleanup(list);
                return Err(e);
            }
        };
        // SAFETY: `ctx` is open; `device` points at its ibv_device.
        let transport = transport_of(unsafe { (*(*ctx).device).transport_type });
        Ok(Arc::new(Device {
            list,
            ctx,
            pd,
            name,
            limits: Limits {
                max_qp_wr: nonneg(attr.max_qp_wr),
                max_sge: nonneg(attr.max_sge),
                max_cqe: nonneg(attr.max_cqe),
                max_qp_rd_atom: nonneg(attr.max_qp_rd_atom),
                max_qp_init_rd_atom: nonneg(attr.max_qp_init_rd_atom),
                transport,
                quirks: Quirks::of(attr.vendor_id, attr.vendor_part_id),
            },
            grants,
            config,
            mrs: Mutex::new(Vec::with_capacity(16)),
            mr_generation: AtomicU64::new(0),
            mr_removals: AtomicU64::new(0),
            cm,
        }))
    }

    pub(super) fn name(&self) -> &str {
        &self.name
    }
    pub(super) fn ctx(&self) -> *mut ibv_context {
        self.ctx
    }
    pub(super) fn pd(&self) -> *mut ibv_pd {
        self.pd
    }
    pub(super) fn limits(&self) -> &Limits {
        &self.limits
    }
    pub(super) fn config(&self) -> &VerbsConfig {
        &self.config
    }
    pub(super) fn grant_mechanism(&self) -> GrantMechanism {
        self.grants
    }
    pub(super) fn cm(&self) -> &CmService {
        &self.cm
    }

    /// Registers a pool for local access and window binding.
    ///
    /// # Safety
    /// `[addr, addr + len)` must stay mapped until the device is dropped.
    pub(super) unsafe fn register(
        &self,
        addr: *mut u8,
        len: usize,
    ) -> Result<MemoryRegion, ProviderError> {
        let mut access = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE;
        if self.grants == GrantMechanism::MemoryWindow {
            access |= ibv_access_flags::IBV_ACCESS_MW_BIND;
        }
        // SAFETY: the PD is live; the caller guarantees the range stays
        // mapped; the MR is deregistered on drop.
        let mr = unsafe { ibv_reg_mr(self.pd, addr.cast(), len, access.0 as c_int) };
        if mr.is_null() {
            return Err(ProviderError::Other(format!(
                "ibv_reg_mr({}, {len} bytes at {addr:p}): {}",
                self.name,
                io::Error::last_os_error()
            )));
        }
        // SAFETY: `mr` is the live registration just made.
        let lkey = unsafe { (*mr).lkey };
        let entry = MrEntry {
            addr: addr as u64,
            len: len as u64,
            lkey,
            mr,
        };
        let mut mrs = self.mrs.lock().unwrap_or_else(|e| e.into_inner());
        mrs.push(entry);
        self.mr_generation.fetch_add(1, Ordering::Release);
        Ok(MemoryRegion {
            addr: addr as u64,
            len: len as u64,
            lkey,
        })
    }

    /// Deregisters `mr` (`ibv_dereg_mr`) and drops it from the table the
    /// queue pairs copy (each refreshes its copy at its next lookup after a
    /// removal, [`Device::mr_removals`]).
    ///
    /// # Safety
    /// No work request or memory window uses the registration any more.
    pub(super) unsafe fn deregister(&self, mr: &MemoryRegion) -> Result<(), ProviderError> {
        let mut mrs = self.mrs.lock().unwrap_or_else(|e| e.into_inner());
        let Some(i) = mrs
            .iter()
            .position(|m| m.lkey == mr.lkey && m.addr == mr.addr && m.len == mr.len)
        else {
            return Err(ProviderError::Other(format!(
                "deregister: {} holds no registration with lkey {:#x} ({} bytes at {:#x})",
                self.name, mr.lkey, mr.len, mr.addr
            )));
        };
        // SAFETY: the MR is live (in the table) and, by the caller's
        // guarantee, unused; on failure it stays registered and listed.
        let rc = unsafe { ibv_dereg_mr(mrs[i].mr) };
        if rc != 0 {
            let e = if rc > 0 {
                io::Error::from_raw_os_error(rc)
            } else {
                io::Error::last_os_error()
            };
            return Err(ProviderError::Other(format!(
                "ibv_dereg_mr({}, lkey {:#x}): {e} (a memory window still bound to it?)",
                self.name, mr.lkey
            )));
        }
        mrs.swap_remove(i);
        self.mr_removals.fetch_add(1, Ordering::Release);
        self.mr_generation.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Registrations given back so far ([`Device::deregister`]): a queue
    /// pair that sees this move refreshes its copy of the table and drops
    /// its idle window backings before its next lookup.
    #[inline]
    pub(super) fn mr_removals(&self) -> u64 {
        self.mr_removals.load(Ordering::Acquire)
    }

    /// Copies the registration table into `into` if it changed since
    /// `*seen`; no allocation unless the table outgrew `into`.
    pub(super) fn sync_mrs(&self, into: &mut Vec<MrEntry>, seen: &mut u64) {
        let now = self.mr_generation.load(Ordering::Acquire);
        if now == *seen {
            return;
        }
        let mrs = self.mrs.lock().unwrap_or_else(|e| e.into_inner());
        into.clear();
        into.extend_from_slice(&mrs);
        *seen = self.mr_generation.load(Ordering::Acquire);
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // Everything made on the device holds an Arc of it, so no queue
        // pair, completion queue or cm id is left.
        self.cm.stop();
        let mrs = std::mem::take(self.mrs.get_mut().unwrap_or_else(|e| e.into_inner()));
        for m in mrs {
            // SAFETY: each MR was registered by us and is deregistered once;
            // no queue pair uses it any more.
            unsafe { ibv_dereg_mr(m.mr) };
        }
        // SAFETY: the PD has no dependants left; the list is freed once.
        unsafe {
            ibv_dealloc_pd(self.pd);
            rdma_free_devices(self.list);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_without_rdma_hardware_is_an_empty_list_not_an_error() {
        let list = devices().expect("devices() must not fail");
        // On a host with devices, each has at least one port and a name.
        for d in &list {
            assert!(!d.name.is_empty());
            assert!(!d.ports.is_empty(), "{d:?}");
        }
    }

    #[test]
    fn opening_without_a_device_is_an_error_naming_the_cause() {
        if !devices().expect("devices").is_empty() {
            return; // a host with RDMA devices: covered by tests/verbs_*.rs
        }
        let e = super::super::VerbsProvider::open(VerbsConfig::default())
            .expect_err("no device to open");
        assert!(e.to_string().contains("no RDMA device"), "{e}");
    }

    #[test]
    fn mtu_enum_maps_to_bytes() {
        assert_eq!(mtu_bytes(ibv_mtu::IBV_MTU_256), 256);
        assert_eq!(mtu_bytes(ibv_mtu::IBV_MTU_1024), 1024);
        assert_eq!(mtu_bytes(ibv_mtu::IBV_MTU_4096), 4096);
        assert_eq!(mtu_bytes(0), 0);
    }

    #[test]
    fn memory_window_support_reads_type2_flags() {
        assert_eq!(mw_support(0), MemoryWindowSupport::None);
        assert_eq!(
            mw_support(ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW.0),
            MemoryWindowSupport::Type1Only
        );
        assert_eq!(
            mw_support(
                (ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW
                    | ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2B)
                    .0
            ),
            MemoryWindowSupport::Type2
        );
    }

    #[test]
    fn rxe_kernel_invalidate_flag_is_read_as_with_inv_only_on_rxe() {
        let inv = ibv_wc_flags::IBV_WC_WITH_INV.0;
        let csum = ibv_wc_flags::IBV_WC_IP_CSUM_OK.0;
        assert_eq!(Quirks::of(RXE_VENDOR_ID, 0).with_inv_flags(), inv | csum);
        assert_eq!(
            Quirks::of(0x02c9, 4119).with_inv_flags(),
            inv,
            "mlx5: libibverbs flags only"
        );
        assert_eq!(Quirks::of(0x02c9, 4119), Quirks::default());
    }

    #[test]
    fn smb_direct_port_is_445_except_on_iwarp() {
        assert_eq!(Transport::InfiniBand.smb_direct_port(), 445);
        assert_eq!(Transport::Iwarp.smb_direct_port(), 5445);
        assert_eq!(Transport::Other(4).smb_direct_port(), 445);
    }

    #[test]
    fn node_guid_prints_like_ibv_devinfo() {
        let d = DeviceInfo {
            name: "rxe0".into(),
            node_guid: 0x5054_00ff_fe12_3456,
            transport: Transport::InfiniBand,
            fw_ver: String::new(),
            max_mr: 0,
            max_mr_size: 0,
            max_qp: 0,
            max_qp_wr: 0,
            max_sge: 0,
            max_cq: 0,
            max_cqe: 0,
            max_mw: 0,
            max_qp_rd_atom: 0,
            max_qp_init_rd_atom: 0,
            memory_windows: MemoryWindowSupport::Type2,
            grants: GrantMechanism::MemoryWindow,
            ports: vec![],
        };
        assert_eq!(d.node_guid_string(), "5054:00ff:fe12:3456");
    }
}
