//! The directory store (`--store DIR`): the share's files are files under a
//! directory, and every file operation goes through io_uring, so a slow disk
//! never blocks a worker.
//!
//! # Rings and operations
//! Each worker's [`DirStore`] owns one ring ([`RING_ENTRIES`] submission
//! entries). An operation takes a slot of a table preallocated at
//! construction (at most [`MAX_OPS`] in flight); the slot index is the
//! SQE's `user_data` (never the caller's tag, which may be reused after a
//! `cancel` while the old CQE is still due). A multi-step operation (CREATE)
//! is a small state machine in its slot that submits its next step from
//! [`Store::poll`] when a step's CQE arrives. READ, WRITE, FLUSH, truncate
//! and stat allocate nothing: data is staged in a per-handle slab.
//!
//! # Confinement
//! The root is opened once (`O_PATH | O_DIRECTORY`); every path is opened
//! relative to it with `IORING_OP_OPENAT2` and `RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`, so the kernel refuses `..`
//! escapes and every symlink (ELOOP / EXDEV → `InvalidName`) on top of
//! [`valid_path`]. Directories are created with MKDIRAT relative to a
//! parent that was itself opened that way (MKDIRAT follows no symlink in
//! its last component). Special files (FIFOs, devices, sockets) are
//! refused (`Io(EACCES)`).
//!
//! # CREATE ([MS-SMB2] 3.3.5.9, dispositions of 2.2.13)
//! Creating dispositions first try `O_CREAT | O_EXCL` (Created); on EEXIST
//! they reopen without `O_CREAT` (Opened) or with `O_TRUNC` (Overwritten,
//! Superseded: supersede truncates the existing file rather than replacing
//! it). Open and Overwrite never create. A file is opened `O_RDWR`; EISDIR
//! reopens it as a directory (`O_RDONLY | O_DIRECTORY`). ENOENT without
//! `O_CREAT` is told apart (NotFound vs PathNotFound) by opening the parent.
//! The result is STATX'd for [`FileInfo`].
//!
//! # Staging
//! Reads land in, and writes are copied to, a page-aligned per-handle slab
//! (anonymous mapping, [`DEFAULT_STAGING_BYTES`] unless configured) cut into
//! [`STAGE_CHUNK`] chunks; an operation takes a run of contiguous chunks
//! (first fit over a bitmap) and gives it back when its result is
//! collected, or, for a cancelled operation, when its CQE arrives (the
//! kernel may write into it until then). No run free: `Busy`.
//!
//! # O_DIRECT
//! With `direct`, each open file also gets an `O_DIRECT` descriptor, used
//! when the offset, length and buffer of an I/O are 4096-aligned (buffers
//! always are); other I/O uses the buffered descriptor. A file system that
//! refuses O_DIRECT (EINVAL) gets buffered I/O only, noted once on stderr.
//! The second descriptor is opened by path: a rename racing with CREATE may
//! give it another file (accepted; the path is confined either way).
//!
//! # Kernel support
//! OPENAT2, STATX, READ, WRITE, FSYNC and CLOSE (Linux 5.6) are required;
//! the factory probes them and refuses to start without. Where MKDIRAT
//! (5.15) or FTRUNCATE (6.9) is missing, that operation alone uses the
//! plain system call (`mkdirat(2)`, `ftruncate(2)`), which completes at
//! once (it may block the worker on a slow disk: upgrade the kernel). A
//! failed io_uring setup (seccomp, `kernel.io_uring_disabled`) is an error:
//! there is no fallback to blocking I/O.

use super::store::{
    disposition_allows_directory, filetime_from_unix, valid_path, Action, Disposition, FileInfo,
    Handle, OpenRequest, OpenTable, Poll, Store, StoreError, StoreFactory, Tag,
};
use io_uring::{opcode, squeue, types, IoUring, Probe};
use memmap2::{MmapMut, MmapOptions};
use std::collections::HashMap;
use std::ffi::CString;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Submission queue entries of each handle's ring.
pub const RING_ENTRIES: u32 = 256;
/// Operations one handle may have in flight (or done and not collected).
pub const MAX_OPS: usize = 512;
/// Default staging slab of each handle.
pub const DEFAULT_STAGING_BYTES: usize = 64 << 20;
/// Allocation unit of the staging slab.
pub const STAGE_CHUNK: usize = 64 << 10;
/// Alignment O_DIRECT I/O needs (offset, length, buffer).
pub const DIRECT_ALIGN: u64 = 4096;
/// `user_data` of fire-and-forget closes.
const CLOSE_DATA: u64 = u64::MAX;
/// Retries of an open racing with renames or deletes (EAGAIN from
/// RESOLVE_BENEATH, a file deleted between two steps).
const OPEN_RETRIES: u8 = 4;
/// How long dropping a handle waits for its operations to finish.
const DROP_WAIT: Duration = Duration::from_secs(10);
/// Path resolution of every open: stay beneath the root, follow nothing.
const RESOLVE: u64 =
    libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;

/// Optional opcodes the kernel has.
#[derive(Debug, Clone, Copy)]
struct Caps {
    /// IORING_OP_MKDIRAT (5.15).
    mkdirat: bool,
    /// IORING_OP_FTRUNCATE (6.9).
    ftruncate: bool,
}

/// Makes [`DirStore`] handles over one directory.
#[derive(Debug, Clone)]
pub struct DirStoreFactory {
    root: Arc<OwnedFd>,
    path: PathBuf,
    direct: bool,
    staging: usize,
    caps: Caps,
}

/// Why io_uring cannot be used, for an operator.
fn uring_unavailable(e: &std::io::Error) -> String {
    let disabled = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .map(|s| format!("kernel.io_uring_disabled = {}", s.trim()))
        .unwrap_or_else(|_| "kernel.io_uring_disabled unreadable".to_owned());
    format!(
        "directory store: io_uring is not usable here ({e}; {disabled}). The directory \
         store needs io_uring (it has no blocking fallback): allow io_uring_setup in the \
         seccomp/container policy, set kernel.io_uring_disabled=0, or use --store mem"
    )
}

impl DirStoreFactory {
    /// A store over the directory `root`, with `O_DIRECT` for aligned I/O
    /// when `direct`. Checks that `root` is a directory and that io_uring
    /// works and has the opcodes needed.
    pub fn new(root: &Path, direct: bool) -> Result<Self, String> {
        Self::with_staging(root, direct, DEFAULT_STAGING_BYTES)
    }

    /// As [`DirStoreFactory::new`], with `staging_bytes` of staging slab per
    /// handle (rounded up to [`STAGE_CHUNK`]; the largest READ or WRITE).
    pub fn with_staging(root: &Path, direct: bool, staging_bytes: usize) -> Result<Self, String> {
        let meta = std::fs::metadata(root)
            .map_err(|e| format!("directory store: {}: {e}", root.display()))?;
        if !meta.is_dir() {
            return Err(format!(
                "directory store: {} is not a directory",
                root.display()
            ));
        }
        let c = CString::new(root.as_os_str().as_bytes())
            .map_err(|_| format!("directory store: {} contains NUL", root.display()))?;
        // SAFETY: `c` is a valid NUL-terminated path; the result is checked.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(format!(
                "directory store: cannot open {}: {}",
                root.display(),
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: `fd` was just opened and is owned by nobody else.
        let root_fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let ring = IoUring::new(8).map_err(|e| uring_unavailable(&e))?;
        let mut probe = Probe::new();
        ring.submitter()
            .register_probe(&mut probe)
            .map_err(|e| format!("directory store: io_uring probe failed: {e}"))?;
        for (code, name) in [
            (opcode::OpenAt2::CODE, "OPENAT2"),
            (opcode::Statx::CODE, "STATX"),
            (opcode::Read::CODE, "READ"),
            (opcode::Write::CODE, "WRITE"),
            (opcode::Fsync::CODE, "FSYNC"),
            (opcode::Close::CODE, "CLOSE"),
        ] {
            if !probe.is_supported(code) {
                return Err(format!(
                    "directory store: this kernel's io_uring lacks IORING_OP_{name} \
                     (Linux 5.6 or later is needed)"
                ));
            }
        }
        let caps = Caps {
            mkdirat: probe.is_supported(opcode::MkDirAt::CODE),
            ftruncate: probe.is_supported(opcode::Ftruncate::CODE),
        };
        let staging = staging_bytes.max(STAGE_CHUNK).div_ceil(STAGE_CHUNK) * STAGE_CHUNK;
        Ok(DirStoreFactory {
            root: Arc::new(root_fd),
            path: root.to_path_buf(),
            direct,
            staging,
            caps,
        })
    }

    /// A handle (what [`StoreFactory::handle`] boxes), or why its ring or
    /// staging slab could not be set up.
    pub fn store(&self) -> Result<DirStore, String> {
        DirStore::new(self)
    }
}

impl StoreFactory for DirStoreFactory {
    /// Panics if the worker's ring cannot be created (the factory already
    /// created one, so this is resource exhaustion); use
    /// [`DirStoreFactory::store`] to handle that.
    fn handle(&self, worker: usize) -> Box<dyn Store> {
        match self.store() {
            Ok(s) => Box::new(s),
            Err(e) => panic!("worker {worker}: {e}"),
        }
    }

    fn describe(&self) -> String {
        let mut d = self.path.display().to_string();
        if self.direct {
            d.push_str(" (O_DIRECT)");
        }
        d
    }
}

/// An open file of a handle.
#[derive(Debug)]
struct File {
    fd: RawFd,
    /// The O_DIRECT descriptor, or -1.
    direct_fd: RawFd,
    is_dir: bool,
}

/// A run of staging chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stage {
    first: u32,
    count: u32,
}

/// The staging slab: page-aligned chunks, a bitmap of the used ones.
struct Staging {
    base: NonNull<u8>,
    map: MmapMut,
    used: Vec<u64>,
    chunks: usize,
}

// SAFETY: `base` points into `map`, which the slab owns and moves with it;
// it is used only through `&mut self` (or `&self` for reads of runs whose
// I/O finished), so moving the slab to another thread is sound.
unsafe impl Send for Staging {}

impl Staging {
    fn new(bytes: usize) -> Result<Self, String> {
        let mut map = MmapOptions::new()
            .len(bytes)
            .map_anon()
            .map_err(|e| format!("directory store: cannot map {bytes} staging bytes: {e}"))?;
        let base = NonNull::new(map.as_mut_ptr()).ok_or("directory store: null mapping")?;
        let chunks = bytes / STAGE_CHUNK;
        Ok(Staging {
            base,
            map,
            used: vec![0; chunks.div_ceil(64)],
            chunks,
        })
    }

    fn is_used(&self, i: usize) -> bool {
        self.used[i / 64] & (1 << (i % 64)) != 0
    }

    fn set(&mut self, s: Stage, used: bool) {
        for i in s.first as usize..(s.first + s.count) as usize {
            if used {
                self.used[i / 64] |= 1 << (i % 64);
            } else {
                self.used[i / 64] &= !(1 << (i % 64));
            }
        }
    }

    /// First fit of `len` bytes (at least one chunk).
    fn alloc(&mut self, len: usize) -> Option<Stage> {
        let count = len.max(1).div_ceil(STAGE_CHUNK);
        if count > self.chunks {
            return None;
        }
        let mut start = 0;
        while start + count <= self.chunks {
            if self.used[start / 64] == u64::MAX {
                start = (start / 64 + 1) * 64;
                continue;
            }
            match (start..start + count).find(|&i| self.is_used(i)) {
                Some(busy) => start = busy + 1,
                None => {
                    let s = Stage {
                        first: start as u32,
                        count: count as u32,
                    };
                    self.set(s, true);
                    return Some(s);
                }
            }
        }
        None
    }

    fn free(&mut self, s: Stage) {
        self.set(s, false);
    }

    /// Start of a run.
    fn ptr(&self, s: Stage) -> *mut u8 {
        debug_assert!((s.first + s.count) as usize <= self.chunks);
        // SAFETY: runs lie inside the mapping (`alloc` checks the bound).
        unsafe { self.base.as_ptr().add(s.first as usize * STAGE_CHUNK) }
    }

    fn len(&self) -> usize {
        self.map.len()
    }
}

/// Which open a CREATE step issues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `O_RDWR | O_CREAT | O_EXCL`.
    CreateExcl,
    /// `O_RDWR`.
    ReadWrite,
    /// `O_RDWR | O_TRUNC`.
    Truncate,
    /// `O_RDONLY | O_DIRECTORY`.
    Dir,
}

/// The step of a CREATE whose CQE is awaited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Opening the parent (`O_PATH`) to create a directory in it.
    ParentForMkdir,
    /// MKDIRAT in the parent.
    Mkdir,
    /// Opening the object itself.
    Main(Mode),
    /// Opening the O_DIRECT companion.
    Direct,
    /// STATX of the opened object.
    Statx,
    /// Opening the parent to tell a missing object (this error) from a
    /// missing parent (PathNotFound).
    ProbeParent(StoreError),
}

/// A CREATE in progress (boxed: the CREATE path may allocate).
struct OpenOp {
    /// `/`-separated path, "." for the root.
    path: CString,
    /// Parent path (None: the root).
    parent: Option<CString>,
    /// Last component.
    name: CString,
    disposition: Disposition,
    directory: bool,
    non_directory: bool,
    /// Read by the kernel when the OPENAT2 SQE is prepared.
    how: types::OpenHow,
    step: Step,
    action: Action,
    fd: RawFd,
    direct_fd: RawFd,
    parent_fd: RawFd,
    retries: u8,
}

/// What a slot's operation is.
enum Kind {
    Free,
    Open(Box<OpenOp>),
    Read {
        h: Handle,
        stage: Stage,
        offset: u64,
        len: u32,
        got: u32,
    },
    Write {
        h: Handle,
        stage: Stage,
        offset: u64,
        len: u32,
        put: u32,
    },
    Stat,
    Fsync,
    Truncate,
}

/// What a finished operation produced.
#[derive(Debug, Clone, Copy)]
enum Out {
    Open(Handle, Action, FileInfo),
    Count(u32),
    Info(FileInfo),
    Unit,
}

/// One operation.
struct OpSlot {
    tag: Tag,
    kind: Kind,
    /// A CQE is due.
    awaiting: bool,
    /// The tag was cancelled: drop the result when the CQE arrives.
    cancelled: bool,
    result: Option<Result<Out, StoreError>>,
    /// STATX target (stable: the slot table never moves).
    statx: libc::statx,
}

impl OpSlot {
    fn free() -> Self {
        OpSlot {
            tag: 0,
            kind: Kind::Free,
            awaiting: false,
            cancelled: false,
            result: None,
            // SAFETY: `statx` is plain integers; all zeros is valid.
            statx: unsafe { std::mem::zeroed() },
        }
    }
}

/// The store error for an errno of a file operation.
fn errno_error(e: i32) -> StoreError {
    match e {
        libc::ENOENT => StoreError::NotFound,
        libc::EEXIST => StoreError::Exists,
        libc::EISDIR => StoreError::IsADirectory,
        libc::ENOTDIR => StoreError::NotADirectory,
        libc::ENOSPC | libc::EDQUOT => StoreError::Full,
        libc::ELOOP | libc::EXDEV | libc::ENAMETOOLONG => StoreError::InvalidName,
        libc::EMFILE | libc::ENFILE | libc::ENOMEM => StoreError::Busy,
        e => StoreError::Io(e),
    }
}

/// FileInfo of a STATX result.
fn info_from_statx(st: &libc::statx) -> FileInfo {
    let ft = |t: &libc::statx_timestamp| filetime_from_unix(t.tv_sec, t.tv_nsec);
    let is_dir = u32::from(st.stx_mode) & libc::S_IFMT == libc::S_IFDIR;
    let last_write = ft(&st.stx_mtime);
    let change = ft(&st.stx_ctime);
    FileInfo {
        size: if is_dir { 0 } else { st.stx_size },
        allocation: st.stx_blocks * 512,
        is_dir,
        creation_time: if st.stx_mask & libc::STATX_BTIME != 0 {
            ft(&st.stx_btime)
        } else {
            last_write.min(change)
        },
        last_access_time: ft(&st.stx_atime),
        last_write_time: last_write,
        change_time: change,
    }
}

/// A fresh SQE could not be queued.
#[derive(Debug)]
struct QueueFull;

/// One worker's handle on a directory store.
pub struct DirStore {
    ring: IoUring,
    root: Arc<OwnedFd>,
    direct: bool,
    caps: Caps,
    files: OpenTable<File>,
    /// [`MAX_OPS`] slots, never resized (STATX buffers live in them).
    ops: Vec<OpSlot>,
    free_ops: Vec<u32>,
    /// Tag → slot; capacity 2 × [`MAX_OPS`] so inserts never allocate.
    tags: HashMap<Tag, u32>,
    /// Dropped by hand: leaked if the kernel may still write into it.
    staging: ManuallyDrop<Staging>,
    /// Operations whose CQE is due (cancelled ones included).
    in_flight: usize,
    /// Fire-and-forget closes whose CQE is due.
    closes: usize,
}

impl std::fmt::Debug for DirStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirStore")
            .field("root", &self.root.as_raw_fd())
            .field("direct", &self.direct)
            .field("caps", &self.caps)
            .field("open_files", &self.files.len())
            .field("in_flight", &self.in_flight)
            .field("staging_bytes", &self.staging.len())
            .finish()
    }
}

/// Noted once: a file system refused O_DIRECT.
static DIRECT_REFUSED: AtomicBool = AtomicBool::new(false);

impl DirStore {
    fn new(f: &DirStoreFactory) -> Result<Self, String> {
        let ring = IoUring::builder()
            .setup_cqsize(2 * MAX_OPS as u32)
            .build(RING_ENTRIES)
            .map_err(|e| uring_unavailable(&e))?;
        Ok(DirStore {
            ring,
            root: Arc::clone(&f.root),
            direct: f.direct,
            caps: f.caps,
            files: OpenTable::new(),
            ops: (0..MAX_OPS).map(|_| OpSlot::free()).collect(),
            free_ops: (0..MAX_OPS as u32).rev().collect(),
            tags: HashMap::with_capacity(2 * MAX_OPS),
            staging: ManuallyDrop::new(Staging::new(f.staging)?),
            in_flight: 0,
            closes: 0,
        })
    }

    /// Queues an SQE and submits it. A full queue is submitted first; a
    /// submit error leaves the SQE queued for the next `poll`.
    fn push(&mut self, entry: squeue::Entry) -> Result<(), QueueFull> {
        for attempt in 0..2 {
            // SAFETY: every pointer in our SQEs (staging runs, boxed paths
            // and open_how, slot STATX buffers) stays valid until the CQE:
            // slots and stages are released only after it.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                let _ = self.ring.submit();
                return Ok(());
            }
            if attempt == 0 {
                let _ = self.ring.submit();
            }
        }
        Err(QueueFull)
    }

    /// Pushes an SQE for slot `slot` and counts it in flight.
    fn push_op(&mut self, slot: usize, entry: squeue::Entry) -> Result<(), StoreError> {
        self.push(entry.user_data(slot as u64))
            .map_err(|_| StoreError::Busy)?;
        self.ops[slot].awaiting = true;
        self.in_flight += 1;
        Ok(())
    }

    /// Closes a descriptor in the background (or at once if the ring is
    /// full).
    fn close_fd(&mut self, fd: RawFd) {
        if fd < 0 {
            return;
        }
        let e = opcode::Close::new(types::Fd(fd)).build();
        if self.push(e.user_data(CLOSE_DATA)).is_ok() {
            self.closes += 1;
        } else {
            // SAFETY: `fd` is ours and forgotten by the caller.
            unsafe { libc::close(fd) };
        }
    }

    fn alloc_slot(&mut self, tag: Tag, kind: Kind) -> Result<usize, StoreError> {
        if self.tags.len() >= MAX_OPS {
            return Err(StoreError::Busy);
        }
        let slot = self.free_ops.pop().ok_or(StoreError::Busy)? as usize;
        let s = &mut self.ops[slot];
        s.tag = tag;
        s.kind = kind;
        s.awaiting = false;
        s.cancelled = false;
        s.result = None;
        self.tags.insert(tag, slot as u32);
        Ok(slot)
    }

    /// Releases a slot whose CQE is not due: staging, and the descriptors
    /// of an unfinished CREATE.
    fn release_slot(&mut self, slot: usize) {
        debug_assert!(!self.ops[slot].awaiting);
        match std::mem::replace(&mut self.ops[slot].kind, Kind::Free) {
            Kind::Read { stage, .. } | Kind::Write { stage, .. } => self.staging.free(stage),
            Kind::Open(op) => {
                self.close_fd(op.fd);
                self.close_fd(op.direct_fd);
                self.close_fd(op.parent_fd);
            }
            _ => {}
        }
        self.ops[slot].result = None;
        self.free_ops.push(slot as u32);
    }

    /// A repeated call: `Pending` while running, else the result (the slot
    /// is released unless `keep`, used by READ until `copy_out`).
    fn collect(&mut self, tag: Tag, keep: bool) -> Option<Poll<Out>> {
        let slot = *self.tags.get(&tag)? as usize;
        let result = self.ops[slot].result?;
        if !(keep && result.is_ok()) {
            self.tags.remove(&tag);
            self.release_slot(slot);
        }
        Some(Poll::Ready(result))
    }

    /// Starts a one-step operation; Ready on failure to queue.
    fn start(&mut self, tag: Tag, kind: Kind, entry: squeue::Entry) -> Poll<Out> {
        let slot = match self.alloc_slot(tag, kind) {
            Ok(s) => s,
            Err(e) => {
                return Poll::Ready(Err(e));
            }
        };
        match self.push_op(slot, entry) {
            Ok(()) => Poll::Pending,
            Err(e) => {
                self.tags.remove(&tag);
                self.release_slot(slot);
                Poll::Ready(Err(e))
            }
        }
    }

    /// The descriptor for I/O of `len` bytes at `offset` from `buf`.
    fn io_fd(file: &File, offset: u64, len: u32, buf: *const u8) -> RawFd {
        let aligned = offset % DIRECT_ALIGN == 0
            && u64::from(len) % DIRECT_ALIGN == 0
            && buf as u64 % DIRECT_ALIGN == 0;
        if file.direct_fd >= 0 && aligned {
            file.direct_fd
        } else {
            file.fd
        }
    }

    /// Submits the (rest of the) READ or WRITE in `slot`.
    fn submit_rw(&mut self, slot: usize) -> Result<(), StoreError> {
        let entry = match self.ops[slot].kind {
            Kind::Read {
                h,
                stage,
                offset,
                len,
                got,
            } => {
                let file = self.files.get(h)?;
                // SAFETY: `got < len <= run length`.
                let buf = unsafe { self.staging.ptr(stage).add(got as usize) };
                let (off, n) = (offset + u64::from(got), len - got);
                let fd = Self::io_fd(file, off, n, buf);
                opcode::Read::new(types::Fd(fd), buf, n).offset(off).build()
            }
            Kind::Write {
                h,
                stage,
                offset,
                len,
                put,
            } => {
                let file = self.files.get(h)?;
                // SAFETY: `put < len <= run length`.
                let buf = unsafe { self.staging.ptr(stage).add(put as usize) };
                let (off, n) = (offset + u64::from(put), len - put);
                let fd = Self::io_fd(file, off, n, buf);
                opcode::Write::new(types::Fd(fd), buf, n)
                    .offset(off)
                    .build()
            }
            _ => return Err(StoreError::Io(libc::EINVAL)),
        };
        self.push_op(slot, entry)
    }

    /// Handles the CQE of `slot`; returns the result once the operation is
    /// finished.
    fn complete(&mut self, slot: usize, res: i32) -> Option<Result<Out, StoreError>> {
        match self.ops[slot].kind {
            Kind::Read {
                h,
                stage,
                offset,
                len,
                got,
            } => {
                if res < 0 {
                    return Some(if got > 0 {
                        Ok(Out::Count(got))
                    } else {
                        Err(errno_error(-res))
                    });
                }
                let got = got + res as u32;
                if res == 0 || got >= len {
                    return Some(Ok(Out::Count(got)));
                }
                // Short read inside the file: read the rest.
                self.ops[slot].kind = Kind::Read {
                    h,
                    stage,
                    offset,
                    len,
                    got,
                };
                self.submit_rw(slot).err().map(|_| Ok(Out::Count(got)))
            }
            Kind::Write {
                h,
                stage,
                offset,
                len,
                put,
            } => {
                if res < 0 {
                    return Some(Err(errno_error(-res)));
                }
                if res == 0 {
                    return Some(Err(StoreError::Io(libc::EIO)));
                }
                let put = put + res as u32;
                if put >= len {
                    return Some(Ok(Out::Count(put)));
                }
                self.ops[slot].kind = Kind::Write {
                    h,
                    stage,
                    offset,
                    len,
                    put,
                };
                self.submit_rw(slot).err().map(Err)
            }
            Kind::Stat => Some(if res < 0 {
                Err(errno_error(-res))
            } else {
                Ok(Out::Info(info_from_statx(&self.ops[slot].statx)))
            }),
            Kind::Fsync | Kind::Truncate => Some(if res < 0 {
                Err(errno_error(-res))
            } else {
                Ok(Out::Unit)
            }),
            Kind::Open(_) => self.open_advance(slot, res),
            Kind::Free => None,
        }
    }

    fn open_op(&mut self, slot: usize) -> &mut OpenOp {
        match &mut self.ops[slot].kind {
            Kind::Open(op) => op,
            _ => unreachable!("slot {slot} holds no CREATE"),
        }
    }

    /// Issues the SQE of the current step of the CREATE in `slot`. Returns
    /// `Ok(None)` when submitted, `Ok(Some(res))` when the step ran at once
    /// (a plain-syscall fallback).
    fn open_submit(&mut self, slot: usize) -> Result<Option<i32>, StoreError> {
        let root = self.root.as_raw_fd();
        let mkdirat = self.caps.mkdirat;
        let statx_buf = std::ptr::addr_of_mut!(self.ops[slot].statx).cast::<types::statx>();
        let op = self.open_op(slot);
        let open2 = |op: &mut OpenOp, dirfd: RawFd, path: *const libc::c_char, flags: i32| {
            // openat2 refuses any flag but O_CLOEXEC and O_DIRECTORY with O_PATH.
            let extra = if flags & libc::O_PATH != 0 {
                0
            } else {
                libc::O_NOCTTY
            };
            let mut how = types::OpenHow::new()
                .flags((flags | extra | libc::O_CLOEXEC) as u64)
                .resolve(RESOLVE);
            if flags & libc::O_CREAT != 0 {
                how = how.mode(0o666);
            }
            op.how = how;
            opcode::OpenAt2::new(types::Fd(dirfd), path, &op.how).build()
        };
        let entry = match op.step {
            Step::ParentForMkdir | Step::ProbeParent(_) => {
                let parent = op.parent.as_ref().map_or(c".".as_ptr(), |p| p.as_ptr());
                open2(op, root, parent, libc::O_PATH | libc::O_DIRECTORY)
            }
            Step::Mkdir => {
                let dirfd = if op.parent_fd >= 0 {
                    op.parent_fd
                } else {
                    root
                };
                if !mkdirat {
                    // SAFETY: a valid descriptor and NUL-terminated name.
                    let r = unsafe { libc::mkdirat(dirfd, op.name.as_ptr(), 0o777) };
                    let errno = std::io::Error::last_os_error()
                        .raw_os_error()
                        .unwrap_or(libc::EIO);
                    return Ok(Some(if r < 0 { -errno } else { 0 }));
                }
                opcode::MkDirAt::new(types::Fd(dirfd), op.name.as_ptr())
                    .mode(0o777)
                    .build()
            }
            Step::Main(mode) => {
                let flags = match mode {
                    Mode::CreateExcl => libc::O_RDWR | libc::O_CREAT | libc::O_EXCL,
                    Mode::ReadWrite => libc::O_RDWR,
                    Mode::Truncate => libc::O_RDWR | libc::O_TRUNC,
                    Mode::Dir => libc::O_RDONLY | libc::O_DIRECTORY,
                };
                let path = op.path.as_ptr();
                open2(op, root, path, flags)
            }
            Step::Direct => {
                let path = op.path.as_ptr();
                open2(op, root, path, libc::O_RDWR | libc::O_DIRECT)
            }
            Step::Statx => opcode::Statx::new(types::Fd(op.fd), c"".as_ptr(), statx_buf)
                .flags(libc::AT_EMPTY_PATH)
                .mask(libc::STATX_BASIC_STATS | libc::STATX_BTIME)
                .build(),
        };
        self.push_op(slot, entry)?;
        Ok(None)
    }

    /// Runs the CREATE in `slot` from the result `res` of its current step
    /// (`None`: not started) until a step is in flight or it is finished.
    fn open_advance(&mut self, slot: usize, res: i32) -> Option<Result<Out, StoreError>> {
        let mut res = Some(res);
        loop {
            if let Some(r) = res {
                match self.open_transition(slot, r) {
                    Ok(true) => {}
                    Ok(false) => return Some(self.open_finish(slot)),
                    Err(e) => return Some(Err(self.open_fail(slot, e))),
                }
            }
            match self.open_submit(slot) {
                Ok(None) => return None,
                Ok(Some(r)) => res = Some(r),
                Err(e) => return Some(Err(self.open_fail(slot, e))),
            }
        }
    }

    /// Closes what a failed CREATE had opened.
    fn open_fail(&mut self, slot: usize, e: StoreError) -> StoreError {
        let op = self.open_op(slot);
        let fds = [op.fd, op.direct_fd, op.parent_fd];
        (op.fd, op.direct_fd, op.parent_fd) = (-1, -1, -1);
        for fd in fds {
            self.close_fd(fd);
        }
        e
    }

    /// Applies the result of the current step: `Ok(true)` when a next step
    /// must be issued, `Ok(false)` when the object is open and STATX'd.
    fn open_transition(&mut self, slot: usize, res: i32) -> Result<bool, StoreError> {
        let direct = self.direct;
        let op = self.open_op(slot);
        let err = -res;
        match op.step {
            Step::ParentForMkdir => {
                if res < 0 {
                    return Err(match err {
                        libc::ENOENT | libc::ENOTDIR => StoreError::PathNotFound,
                        e => errno_error(e),
                    });
                }
                op.parent_fd = res;
                op.step = Step::Mkdir;
            }
            Step::Mkdir => {
                match err {
                    0 => op.action = Action::Created,
                    libc::EEXIST if op.disposition == Disposition::Create => {
                        return Err(StoreError::Exists)
                    }
                    libc::EEXIST => op.action = Action::Opened,
                    libc::ENOENT | libc::ENOTDIR => return Err(StoreError::PathNotFound),
                    e => return Err(errno_error(e)),
                }
                let parent = std::mem::replace(&mut op.parent_fd, -1);
                op.step = Step::Main(Mode::Dir);
                self.close_fd(parent);
            }
            Step::Main(mode) => {
                if res >= 0 {
                    op.fd = res;
                    op.step = if direct && mode != Mode::Dir {
                        Step::Direct
                    } else {
                        Step::Statx
                    };
                    return Ok(true);
                }
                let creates = matches!(
                    op.disposition,
                    Disposition::OpenIf | Disposition::OverwriteIf | Disposition::Supersede
                );
                let missing = |op: &mut OpenOp, missing: StoreError| {
                    if op.parent.is_some() {
                        op.step = Step::ProbeParent(missing);
                        Ok(true)
                    } else {
                        Err(missing)
                    }
                };
                match (mode, err) {
                    (_, libc::ELOOP | libc::EXDEV) => return Err(StoreError::InvalidName),
                    (_, libc::EAGAIN) if op.retries < OPEN_RETRIES => op.retries += 1,
                    (Mode::CreateExcl, libc::EEXIST) => {
                        let (action, next) = match op.disposition {
                            Disposition::OpenIf => (Action::Opened, Mode::ReadWrite),
                            Disposition::OverwriteIf => (Action::Overwritten, Mode::Truncate),
                            Disposition::Supersede => (Action::Superseded, Mode::Truncate),
                            _ => return Err(StoreError::Exists),
                        };
                        op.action = action;
                        op.step = Step::Main(next);
                    }
                    (Mode::CreateExcl, libc::ENOENT | libc::ENOTDIR) => {
                        return Err(StoreError::PathNotFound)
                    }
                    (Mode::ReadWrite, libc::EISDIR) if !op.non_directory => {
                        op.step = Step::Main(Mode::Dir)
                    }
                    (Mode::ReadWrite | Mode::Truncate, libc::EISDIR) => {
                        return Err(StoreError::IsADirectory)
                    }
                    // Deleted between our steps: create it after all.
                    (Mode::ReadWrite | Mode::Truncate, libc::ENOENT)
                        if creates && op.retries < OPEN_RETRIES =>
                    {
                        op.retries += 1;
                        op.action = Action::Created;
                        op.step = Step::Main(Mode::CreateExcl);
                    }
                    (_, libc::ENOENT) => return missing(op, StoreError::NotFound),
                    // O_DIRECTORY on a file, or a file in the path.
                    (Mode::Dir, libc::ENOTDIR) => return missing(op, StoreError::NotADirectory),
                    (_, libc::ENOTDIR) => return Err(StoreError::PathNotFound),
                    (_, e) => return Err(errno_error(e)),
                }
            }
            Step::Direct => {
                if res >= 0 {
                    op.direct_fd = res;
                } else if err == libc::EINVAL && !DIRECT_REFUSED.swap(true, Ordering::Relaxed) {
                    eprintln!(
                        "[smbdirectd] NOTE directory store: the file system refuses O_DIRECT \
                         (EINVAL); its files use buffered I/O"
                    );
                }
                op.step = Step::Statx;
            }
            Step::Statx => {
                if res < 0 {
                    return Err(errno_error(err));
                }
                return Ok(false);
            }
            Step::ProbeParent(missing) => {
                if res >= 0 {
                    self.close_fd(res);
                    return Err(missing);
                }
                return Err(match err {
                    libc::ENOENT | libc::ENOTDIR => StoreError::PathNotFound,
                    e => errno_error(e),
                });
            }
        }
        Ok(true)
    }

    /// The object is open and STATX'd: check its type, make the handle.
    fn open_finish(&mut self, slot: usize) -> Result<Out, StoreError> {
        let info = info_from_statx(&self.ops[slot].statx);
        let kind = u32::from(self.ops[slot].statx.stx_mode) & libc::S_IFMT;
        let op = self.open_op(slot);
        let check = if info.is_dir {
            if op.non_directory {
                Err(StoreError::IsADirectory)
            } else {
                Ok(())
            }
        } else if kind != libc::S_IFREG {
            // FIFOs, devices, sockets are not shared.
            Err(StoreError::Io(libc::EACCES))
        } else if op.directory {
            Err(StoreError::NotADirectory)
        } else {
            Ok(())
        };
        if let Err(e) = check {
            return Err(self.open_fail(slot, e));
        }
        let file = File {
            fd: op.fd,
            direct_fd: op.direct_fd,
            is_dir: info.is_dir,
        };
        let action = op.action;
        match self.files.insert(file) {
            Ok(h) => {
                let op = self.open_op(slot);
                (op.fd, op.direct_fd) = (-1, -1);
                Ok(Out::Open(h, action, info))
            }
            Err(e) => Err(self.open_fail(slot, e)),
        }
    }

    fn open_start(&mut self, tag: Tag, req: &OpenRequest<'_>) -> Result<Option<Out>, StoreError> {
        if !valid_path(req.path) {
            return Err(StoreError::InvalidName);
        }
        if req.directory && (req.non_directory || !disposition_allows_directory(req.disposition)) {
            // [MS-SMB2] 3.3.5.9 / [MS-FSA] 2.1.5.1: STATUS_INVALID_PARAMETER.
            return Err(StoreError::Io(libc::EINVAL));
        }
        let unix = req.path.replace('\\', "/");
        let (parent, name) = match unix.rsplit_once('/') {
            Some((p, n)) => (Some(p), n),
            None => (None, unix.as_str()),
        };
        let cstr = |s: &str| CString::new(s).map_err(|_| StoreError::InvalidName);
        let root = req.path.is_empty();
        let step = if root {
            match req.disposition {
                Disposition::Create => return Err(StoreError::Exists),
                Disposition::Open | Disposition::OpenIf if !req.non_directory => {
                    Step::Main(Mode::Dir)
                }
                _ => return Err(StoreError::IsADirectory),
            }
        } else if req.directory {
            match req.disposition {
                Disposition::Open => Step::Main(Mode::Dir),
                _ if parent.is_some() => Step::ParentForMkdir,
                _ => Step::Mkdir,
            }
        } else {
            match req.disposition {
                Disposition::Open => Step::Main(Mode::ReadWrite),
                Disposition::Overwrite => Step::Main(Mode::Truncate),
                _ => Step::Main(Mode::CreateExcl),
            }
        };
        let op = OpenOp {
            path: cstr(if root { "." } else { &unix })?,
            parent: parent.map(cstr).transpose()?,
            name: cstr(name)?,
            disposition: req.disposition,
            directory: req.directory,
            non_directory: req.non_directory,
            how: types::OpenHow::new(),
            step,
            action: match step {
                Step::Main(Mode::CreateExcl) => Action::Created,
                Step::Main(Mode::Truncate) => Action::Overwritten,
                _ => Action::Opened,
            },
            fd: -1,
            direct_fd: -1,
            parent_fd: -1,
            retries: 0,
        };
        let slot = self.alloc_slot(tag, Kind::Open(Box::new(op)))?;
        let first = match self.open_submit(slot) {
            Ok(None) => return Ok(None),
            // The first step ran at once (plain-syscall fallback).
            Ok(Some(r)) => r,
            Err(e) => {
                let e = self.open_fail(slot, e);
                self.tags.remove(&tag);
                self.release_slot(slot);
                return Err(e);
            }
        };
        match self.open_advance(slot, first) {
            None => Ok(None),
            Some(result) => {
                self.tags.remove(&tag);
                self.release_slot(slot);
                result.map(Some)
            }
        }
    }

    /// Reaps available CQEs, reporting finished tags.
    fn reap(&mut self, done: &mut dyn FnMut(Tag)) {
        loop {
            let mut batch = [(0u64, 0i32); 32];
            let mut n = 0;
            for cqe in self.ring.completion() {
                batch[n] = (cqe.user_data(), cqe.result());
                n += 1;
                if n == batch.len() {
                    break;
                }
            }
            if n == 0 {
                return;
            }
            for &(user_data, res) in &batch[..n] {
                if user_data == CLOSE_DATA {
                    self.closes -= 1;
                    continue;
                }
                let slot = user_data as usize;
                if slot >= MAX_OPS || !self.ops[slot].awaiting {
                    continue;
                }
                self.ops[slot].awaiting = false;
                self.in_flight -= 1;
                let result = self.complete(slot, res);
                let s = &mut self.ops[slot];
                if s.cancelled {
                    if !s.awaiting {
                        if let Some(Ok(Out::Open(h, ..))) = result {
                            self.close(h);
                        }
                        self.release_slot(slot);
                    }
                } else if let Some(r) = result {
                    s.result = Some(r);
                    done(s.tag);
                }
            }
        }
    }

    /// The output of a repeated call, or `None` for a new operation.
    fn repeated(&mut self, tag: Tag, keep: bool) -> Option<Poll<Out>> {
        if !self.tags.contains_key(&tag) {
            return None;
        }
        Some(self.collect(tag, keep).unwrap_or(Poll::Pending))
    }
}

/// Narrows a generic result to the variant an operation produces.
fn narrow<T>(p: Poll<Out>, f: impl FnOnce(Out) -> Option<T>) -> Poll<T> {
    match p {
        Poll::Pending => Poll::Pending,
        Poll::Ready(r) => Poll::Ready(r.and_then(|o| f(o).ok_or(StoreError::Io(libc::EINVAL)))),
    }
}

impl Store for DirStore {
    /// [MS-SMB2] 3.3.5.9 with the dispositions of 2.2.13 (see the module
    /// docs).
    fn open(&mut self, tag: Tag, req: &OpenRequest<'_>) -> Poll<(Handle, Action, FileInfo)> {
        let p = match self.repeated(tag, false) {
            Some(p) => p,
            None => match self.open_start(tag, req) {
                Ok(None) => Poll::Pending,
                Ok(Some(out)) => Poll::Ready(Ok(out)),
                Err(e) => Poll::Ready(Err(e)),
            },
        };
        narrow(p, |o| match o {
            Out::Open(h, a, i) => Some((h, a, i)),
            _ => None,
        })
    }

    fn stat(&mut self, tag: Tag, h: Handle) -> Poll<FileInfo> {
        let p = match self.repeated(tag, false) {
            Some(p) => p,
            None => match self.files.get(h) {
                Err(e) => Poll::Ready(Err(e)),
                Ok(file) => {
                    let fd = file.fd;
                    match self.alloc_slot(tag, Kind::Stat) {
                        Err(e) => Poll::Ready(Err(e)),
                        Ok(slot) => {
                            let buf =
                                std::ptr::addr_of_mut!(self.ops[slot].statx).cast::<types::statx>();
                            let e = opcode::Statx::new(types::Fd(fd), c"".as_ptr(), buf)
                                .flags(libc::AT_EMPTY_PATH)
                                .mask(libc::STATX_BASIC_STATS | libc::STATX_BTIME)
                                .build();
                            match self.push_op(slot, e) {
                                Ok(()) => Poll::Pending,
                                Err(e) => {
                                    self.tags.remove(&tag);
                                    self.release_slot(slot);
                                    Poll::Ready(Err(e))
                                }
                            }
                        }
                    }
                }
            },
        };
        narrow(p, |o| match o {
            Out::Info(i) => Some(i),
            _ => None,
        })
    }

    fn read(&mut self, tag: Tag, h: Handle, offset: u64, len: u32) -> Poll<u32> {
        let p = match self.repeated(tag, true) {
            Some(p) => p,
            None => self.start_rw(tag, h, offset, len, None),
        };
        narrow(p, |o| match o {
            Out::Count(n) => Some(n),
            _ => None,
        })
    }

    fn copy_out(&mut self, tag: Tag, _h: Handle, _offset: u64, dst: &mut [u8]) {
        let Some(&slot) = self.tags.get(&tag) else {
            return;
        };
        let slot = slot as usize;
        let s = &self.ops[slot];
        if let (Kind::Read { stage, .. }, Some(Ok(Out::Count(n)))) = (&s.kind, s.result) {
            let n = dst.len().min(n as usize);
            // SAFETY: the run holds `n` bytes the kernel wrote (its CQE
            // arrived, so it no longer writes); `dst` is caller memory,
            // disjoint from the slab.
            unsafe { std::ptr::copy_nonoverlapping(self.staging.ptr(*stage), dst.as_mut_ptr(), n) };
        }
        // Finished: release now; still running (a caller bug): cancel.
        self.cancel(tag);
    }

    fn write(&mut self, tag: Tag, h: Handle, offset: u64, data: &[u8]) -> Poll<u32> {
        let p = match self.repeated(tag, false) {
            Some(p) => p,
            None => match u32::try_from(data.len()) {
                Ok(len) => self.start_rw(tag, h, offset, len, Some(data)),
                Err(_) => Poll::Ready(Err(StoreError::Busy)),
            },
        };
        narrow(p, |o| match o {
            Out::Count(n) => Some(n),
            _ => None,
        })
    }

    fn truncate(&mut self, tag: Tag, h: Handle, size: u64) -> Poll<()> {
        let p = match self.repeated(tag, false) {
            Some(p) => p,
            None => match self.files.get(h) {
                Err(e) => Poll::Ready(Err(e)),
                Ok(f) if f.is_dir => Poll::Ready(Err(StoreError::IsADirectory)),
                Ok(f) if !self.caps.ftruncate => {
                    // No IORING_OP_FTRUNCATE (Linux < 6.9): the plain call.
                    let size = libc::off_t::try_from(size).unwrap_or(libc::off_t::MAX);
                    // SAFETY: an open descriptor of ours.
                    if unsafe { libc::ftruncate(f.fd, size) } < 0 {
                        let e = std::io::Error::last_os_error()
                            .raw_os_error()
                            .unwrap_or(libc::EIO);
                        Poll::Ready(Err(errno_error(e)))
                    } else {
                        Poll::Ready(Ok(Out::Unit))
                    }
                }
                Ok(f) => {
                    let e = opcode::Ftruncate::new(types::Fd(f.fd), size).build();
                    self.start(tag, Kind::Truncate, e)
                }
            },
        };
        narrow(p, |o| matches!(o, Out::Unit).then_some(()))
    }

    fn flush(&mut self, tag: Tag, h: Handle) -> Poll<()> {
        let p = match self.repeated(tag, false) {
            Some(p) => p,
            None => match self.files.get(h) {
                Err(e) => Poll::Ready(Err(e)),
                Ok(f) => {
                    let e = opcode::Fsync::new(types::Fd(f.fd)).build();
                    self.start(tag, Kind::Fsync, e)
                }
            },
        };
        narrow(p, |o| matches!(o, Out::Unit).then_some(()))
    }

    /// Operations in flight on `h` keep the file alive in the kernel; their
    /// results are still collected (a READ or WRITE not yet resubmitted
    /// after a short transfer ends with what it has).
    fn close(&mut self, h: Handle) {
        if let Ok(f) = self.files.remove(h) {
            self.close_fd(f.fd);
            self.close_fd(f.direct_fd);
        }
    }

    fn poll(&mut self, done: &mut dyn FnMut(Tag)) {
        if self.in_flight == 0 && self.closes == 0 {
            return;
        }
        if !self.ring.submission().is_empty() {
            let _ = self.ring.submit();
        }
        self.reap(done);
    }

    /// The result is dropped when the CQE arrives; the staging run (the
    /// kernel may still write into it) is freed only then.
    fn cancel(&mut self, tag: Tag) {
        let Some(slot) = self.tags.remove(&tag) else {
            return;
        };
        let slot = slot as usize;
        if self.ops[slot].awaiting {
            self.ops[slot].cancelled = true;
            return;
        }
        if let Some(Ok(Out::Open(h, ..))) = self.ops[slot].result {
            self.close(h);
        }
        self.release_slot(slot);
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Bytes used on the file system holding the root (statvfs), unbounded.
    fn usage(&self) -> (u64, Option<u64>) {
        // SAFETY: zeroed `statvfs` is valid; the root descriptor is open.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: valid descriptor and out-pointer.
        if unsafe { libc::fstatvfs(self.root.as_raw_fd(), &mut st) } < 0 {
            return (0, None);
        }
        let used = (st.f_blocks as u64).saturating_sub(st.f_bfree as u64);
        (used.saturating_mul(st.f_frsize as u64), None)
    }
}

impl DirStore {
    /// Starts a READ (`data` None) or WRITE.
    fn start_rw(
        &mut self,
        tag: Tag,
        h: Handle,
        offset: u64,
        len: u32,
        data: Option<&[u8]>,
    ) -> Poll<Out> {
        match self.files.get(h) {
            Err(e) => return Poll::Ready(Err(e)),
            Ok(f) if f.is_dir => return Poll::Ready(Err(StoreError::IsADirectory)),
            Ok(_) => {}
        }
        if len == 0 {
            return Poll::Ready(Ok(Out::Count(0)));
        }
        if offset
            .checked_add(u64::from(len))
            .map_or(true, |end| end > i64::MAX as u64)
        {
            return Poll::Ready(Err(StoreError::Io(libc::EINVAL)));
        }
        let Some(stage) = self.staging.alloc(len as usize) else {
            return Poll::Ready(Err(StoreError::Busy));
        };
        let kind = match data {
            Some(d) => {
                // SAFETY: the run was just allocated, holds at least `len`
                // bytes and no I/O uses it yet; `d` is caller memory.
                unsafe {
                    std::ptr::copy_nonoverlapping(d.as_ptr(), self.staging.ptr(stage), d.len())
                };
                Kind::Write {
                    h,
                    stage,
                    offset,
                    len,
                    put: 0,
                }
            }
            None => Kind::Read {
                h,
                stage,
                offset,
                len,
                got: 0,
            },
        };
        let slot = match self.alloc_slot(tag, kind) {
            Ok(s) => s,
            Err(e) => {
                self.staging.free(stage);
                return Poll::Ready(Err(e));
            }
        };
        match self.submit_rw(slot) {
            Ok(()) => Poll::Pending,
            Err(e) => {
                self.tags.remove(&tag);
                self.release_slot(slot);
                Poll::Ready(Err(e))
            }
        }
    }
}

impl Drop for DirStore {
    /// Waits (bounded) for operations the kernel still runs, closes every
    /// open file. If the kernel has not finished by then, the staging slab
    /// and the slot table are leaked rather than unmapped under it.
    fn drop(&mut self) {
        let deadline = Instant::now() + DROP_WAIT;
        while (self.in_flight > 0 || self.closes > 0) && Instant::now() < deadline {
            let _ = self.ring.submit();
            self.reap(&mut |_| {});
            if self.in_flight > 0 || self.closes > 0 {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        for f in self.files.drain() {
            for fd in [f.fd, f.direct_fd] {
                if fd >= 0 {
                    // SAFETY: descriptors of ours, closed once.
                    unsafe { libc::close(fd) };
                }
            }
        }
        if self.in_flight > 0 {
            eprintln!(
                "[smbdirectd] WARN directory store: {} operations still running at teardown; \
                 leaking their buffers",
                self.in_flight
            );
            std::mem::forget(std::mem::take(&mut self.ops));
        } else {
            // SAFETY: dropped once, here, and never used again.
            unsafe { ManuallyDrop::drop(&mut self.staging) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    /// A directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            static N: AtomicU32 = AtomicU32::new(0);
            let p = std::env::temp_dir().join(format!(
                "smbdirectd-dirstore-{}-{}-{name}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
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

    fn store(dir: &TempDir, direct: bool) -> DirStore {
        DirStoreFactory::with_staging(&dir.0, direct, 4 << 20)
            .unwrap()
            .store()
            .unwrap()
    }

    /// Repeats `call` until Ready, polling until `tag` is reported between
    /// calls (10 s at most).
    fn drive<T>(
        s: &mut DirStore,
        tag: Tag,
        mut call: impl FnMut(&mut DirStore) -> Poll<T>,
    ) -> Result<T, StoreError> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Poll::Ready(r) = call(s) {
                return r;
            }
            let mut seen = false;
            while !seen {
                s.poll(&mut |t| seen |= t == tag);
                if !seen {
                    assert!(Instant::now() < deadline, "tag {tag} never completed");
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
        }
    }

    fn req(path: &str, disposition: Disposition) -> OpenRequest<'_> {
        OpenRequest {
            path,
            disposition,
            directory: false,
            non_directory: false,
        }
    }

    fn open_req(
        s: &mut DirStore,
        r: &OpenRequest<'_>,
    ) -> Result<(Handle, Action, FileInfo), StoreError> {
        drive(s, 1, |s| s.open(1, r))
    }

    fn open(s: &mut DirStore, path: &str, d: Disposition) -> Result<(Handle, Action), StoreError> {
        open_req(s, &req(path, d)).map(|(h, a, _)| (h, a))
    }

    fn mkdir(s: &mut DirStore, path: &str, d: Disposition) -> Result<(Handle, Action), StoreError> {
        let r = OpenRequest {
            directory: true,
            ..req(path, d)
        };
        open_req(s, &r).map(|(h, a, _)| (h, a))
    }

    fn write(s: &mut DirStore, h: Handle, offset: u64, data: &[u8]) -> Result<u32, StoreError> {
        drive(s, 2, |s| s.write(2, h, offset, data))
    }

    fn read(s: &mut DirStore, h: Handle, offset: u64, len: u32) -> Result<Vec<u8>, StoreError> {
        let n = drive(s, 3, |s| s.read(3, h, offset, len))?;
        let mut v = vec![0xAA; n as usize];
        s.copy_out(3, h, offset, &mut v);
        Ok(v)
    }

    fn size(s: &mut DirStore, h: Handle) -> u64 {
        drive(s, 4, |s| s.stat(4, h)).unwrap().size
    }

    /// No slot, staging run or CQE is left behind.
    fn assert_idle(s: &DirStore) {
        assert_eq!(s.in_flight(), 0);
        assert_eq!(s.free_ops.len(), MAX_OPS, "slots leaked");
        assert!(s.tags.is_empty(), "tags leaked");
        assert!(s.staging.used.iter().all(|&w| w == 0), "staging leaked");
    }

    #[test]
    fn every_disposition_on_missing_and_existing_files() {
        use Disposition::*;
        let dir = TempDir::new("dispositions");
        let mut s = store(&dir, false);
        assert_eq!(open(&mut s, "a", Open), Err(StoreError::NotFound));
        assert_eq!(open(&mut s, "a", Overwrite), Err(StoreError::NotFound));
        for (i, d) in [Supersede, Create, OpenIf, OverwriteIf]
            .into_iter()
            .enumerate()
        {
            let (h, a) = open(&mut s, &format!("new{i}"), d).unwrap();
            assert_eq!(a, Action::Created, "{d:?}");
            s.close(h);
        }
        let (h, _) = open(&mut s, "f", Create).unwrap();
        write(&mut s, h, 0, b"hello").unwrap();
        s.close(h);
        assert_eq!(open(&mut s, "f", Create), Err(StoreError::Exists));
        for (d, action, len) in [
            (Open, Action::Opened, 5),
            (OpenIf, Action::Opened, 5),
            (Overwrite, Action::Overwritten, 0),
            (OverwriteIf, Action::Overwritten, 0),
            (Supersede, Action::Superseded, 0),
        ] {
            let (h, a) = open(&mut s, "f", d).unwrap();
            assert_eq!((a, size(&mut s, h)), (action, len), "{d:?}");
            write(&mut s, h, 0, b"hello").unwrap();
            s.close(h);
        }
        assert_eq!(std::fs::read(dir.0.join("f")).unwrap(), b"hello");
        assert_idle(&s);
    }

    #[test]
    fn write_then_read_back() {
        let dir = TempDir::new("rw");
        let mut s = store(&dir, false);
        let (h, _, info) = open_req(&mut s, &req("data.bin", Disposition::Create)).unwrap();
        assert!(!info.is_dir && info.size == 0 && info.creation_time > 0);
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 13) as u8).collect();
        assert_eq!(write(&mut s, h, 1000, &data), Ok(data.len() as u32));
        assert_eq!(read(&mut s, h, 1000, data.len() as u32).unwrap(), data);
        assert_eq!(
            read(&mut s, h, 0, 1000).unwrap(),
            vec![0; 1000],
            "the gap is zeros"
        );
        assert_eq!(size(&mut s, h), 301_000);
        // At and past the end of file.
        assert_eq!(read(&mut s, h, 300_990, 100).unwrap().len(), 10);
        assert_eq!(read(&mut s, h, 301_000, 100).unwrap(), b"");
        assert_eq!(read(&mut s, h, 1 << 40, 100).unwrap(), b"");
        assert_eq!(drive(&mut s, 5, |s| s.flush(5, h)), Ok(()));
        s.close(h);
        let on_disk = std::fs::read(dir.0.join("data.bin")).unwrap();
        assert_eq!(&on_disk[1000..], &data[..]);
        assert_idle(&s);
    }

    #[test]
    fn direct_io_round_trip_when_the_file_system_allows_it() {
        let dir = TempDir::new("direct");
        let mut s = store(&dir, true);
        let (h, _) = open(&mut s, "d.bin", Disposition::Create).unwrap();
        let file = s.files.get(h).unwrap();
        if file.direct_fd >= 0 {
            // Aligned I/O takes the O_DIRECT descriptor, the rest does not.
            let page = s.staging.ptr(Stage { first: 0, count: 1 });
            assert_eq!(DirStore::io_fd(file, 8192, 4096, page), file.direct_fd);
            assert_eq!(DirStore::io_fd(file, 8192, 100, page), file.fd);
            assert_eq!(DirStore::io_fd(file, 8193, 4096, page), file.fd);
        } else {
            eprintln!(
                "note: {} refuses O_DIRECT; buffered I/O tested",
                dir.0.display()
            );
        }
        let data: Vec<u8> = (0..3 * 4096u32).map(|i| (i % 251) as u8).collect();
        assert_eq!(write(&mut s, h, 8192, &data), Ok(data.len() as u32)); // aligned
        assert_eq!(write(&mut s, h, 3, b"unaligned"), Ok(9)); // buffered fd
        assert_eq!(read(&mut s, h, 8192, data.len() as u32).unwrap(), data);
        assert_eq!(read(&mut s, h, 3, 9).unwrap(), b"unaligned");
        // An aligned read reaching past the end of file.
        assert_eq!(read(&mut s, h, 8192, 4 * 4096).unwrap(), data);
        s.close(h);
        assert_idle(&s);
    }

    #[test]
    fn paths_leaving_the_root_are_refused() {
        let dir = TempDir::new("confine");
        let outside = TempDir::new("outside");
        std::fs::write(outside.0.join("secret"), b"x").unwrap();
        std::os::unix::fs::symlink(&outside.0, dir.0.join("out")).unwrap();
        std::os::unix::fs::symlink(outside.0.join("secret"), dir.0.join("s")).unwrap();
        std::fs::write(dir.0.join("inner"), b"y").unwrap();
        std::os::unix::fs::symlink("inner", dir.0.join("in")).unwrap();
        let mut s = store(&dir, false);
        let invalid = Err(StoreError::InvalidName);
        assert_eq!(open(&mut s, "out\\secret", Disposition::Open), invalid);
        assert_eq!(open(&mut s, "out\\new", Disposition::Create), invalid);
        assert_eq!(open(&mut s, "s", Disposition::Open), invalid);
        assert_eq!(open(&mut s, "s", Disposition::OverwriteIf), invalid);
        assert_eq!(
            open(&mut s, "in", Disposition::Open),
            invalid,
            "no symlink at all"
        );
        assert_eq!(mkdir(&mut s, "out\\d", Disposition::Create), invalid);
        assert_eq!(mkdir(&mut s, "out", Disposition::Open), invalid);
        assert_eq!(open(&mut s, "..", Disposition::Open), invalid);
        assert_eq!(open(&mut s, "a\\..\\..\\x", Disposition::OpenIf), invalid);
        assert_eq!(open(&mut s, "/etc/passwd", Disposition::Open), invalid);
        assert!(!outside.0.join("new").exists() && !outside.0.join("d").exists());
        assert_eq!(std::fs::read(outside.0.join("secret")).unwrap(), b"x");
        assert_idle(&s);
    }

    #[test]
    fn directories_and_missing_parents() {
        use Disposition::*;
        let dir = TempDir::new("dirs");
        let mut s = store(&dir, false);
        let (root, a, info) = open_req(
            &mut s,
            &OpenRequest {
                directory: true,
                ..req("", Open)
            },
        )
        .unwrap();
        assert!(info.is_dir && a == Action::Opened);
        assert_eq!(
            drive(&mut s, 9, |s| s.read(9, root, 0, 1)),
            Err(StoreError::IsADirectory)
        );
        assert_eq!(open(&mut s, "", Create), Err(StoreError::Exists));
        assert_eq!(open(&mut s, "d\\f", Create), Err(StoreError::PathNotFound));
        assert_eq!(open(&mut s, "d\\f", Open), Err(StoreError::PathNotFound));
        assert_eq!(mkdir(&mut s, "d\\e", OpenIf), Err(StoreError::PathNotFound));
        assert_eq!(mkdir(&mut s, "d", Create).map(|x| x.1), Ok(Action::Created));
        assert_eq!(mkdir(&mut s, "d", Create), Err(StoreError::Exists));
        assert_eq!(
            mkdir(&mut s, "d\\e", OpenIf).map(|x| x.1),
            Ok(Action::Created)
        );
        assert_eq!(
            mkdir(&mut s, "d\\e", OpenIf).map(|x| x.1),
            Ok(Action::Opened)
        );
        assert!(dir.0.join("d/e").is_dir());
        let (f, a) = open(&mut s, "d\\e\\f", Create).unwrap();
        assert_eq!(a, Action::Created);
        assert_eq!(write(&mut s, f, 0, b"x"), Ok(1));
        assert_eq!(
            open(&mut s, "d\\e\\missing", Open),
            Err(StoreError::NotFound)
        );
        assert_eq!(
            mkdir(&mut s, "d\\e\\f", Open),
            Err(StoreError::NotADirectory)
        );
        assert_eq!(
            mkdir(&mut s, "d\\e\\f", OpenIf),
            Err(StoreError::NotADirectory)
        );
        assert_eq!(
            open(&mut s, "d\\e\\f\\g", Create),
            Err(StoreError::PathNotFound)
        );
        assert_eq!(
            open(&mut s, "d\\e\\f\\g", Open),
            Err(StoreError::PathNotFound)
        );
        let nondir = OpenRequest {
            non_directory: true,
            ..req("d", Open)
        };
        assert_eq!(
            open_req(&mut s, &nondir).err(),
            Some(StoreError::IsADirectory)
        );
        assert_eq!(open(&mut s, "d", Overwrite), Err(StoreError::IsADirectory));
        assert_eq!(open(&mut s, "d", Create), Err(StoreError::Exists));
        // Opened without FILE_DIRECTORY_FILE, a directory is still one.
        let (d, a, info) = open_req(&mut s, &req("d", OpenIf)).unwrap();
        assert!(info.is_dir && a == Action::Opened);
        assert_eq!(write(&mut s, d, 0, b"x"), Err(StoreError::IsADirectory));
        assert_eq!(
            drive(&mut s, 9, |s| s.truncate(9, d, 0)),
            Err(StoreError::IsADirectory)
        );
        // [MS-FSA] 2.1.5.1: no superseding or overwriting a directory.
        assert_eq!(
            mkdir(&mut s, "z", OverwriteIf),
            Err(StoreError::Io(libc::EINVAL))
        );
        for h in [root, f, d] {
            s.close(h);
        }
        assert_idle(&s);
    }

    #[test]
    fn truncate_through_the_ring_and_through_the_fallback() {
        let dir = TempDir::new("truncate");
        let mut s = store(&dir, false);
        for ring in [true, false] {
            s.caps.ftruncate = ring && s.caps.ftruncate;
            let (h, _) = open(&mut s, "t", Disposition::OverwriteIf).unwrap();
            write(&mut s, h, 0, &[7; 5000]).unwrap();
            assert_eq!(drive(&mut s, 6, |s| s.truncate(6, h, 10)), Ok(()));
            assert_eq!(size(&mut s, h), 10);
            assert_eq!(drive(&mut s, 6, |s| s.truncate(6, h, 20)), Ok(()));
            assert_eq!(
                read(&mut s, h, 0, 100).unwrap(),
                [[7; 10], [0; 10]].concat()
            );
            s.close(h);
        }
        // The MKDIRAT fallback too.
        s.caps.mkdirat = false;
        assert_eq!(
            mkdir(&mut s, "m", Disposition::Create).map(|x| x.1),
            Ok(Action::Created)
        );
        assert_idle(&s);
    }

    #[test]
    fn pending_then_poll_reports_the_tag_then_ready() {
        let dir = TempDir::new("pending");
        let mut s = store(&dir, false);
        let (h, _) = open(&mut s, "p", Disposition::Create).unwrap();
        assert_eq!(s.write(77, h, 0, b"abc"), Poll::Pending);
        assert_eq!(s.in_flight(), 1);
        // Repeating before completion stays Pending (data ignored).
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut reported = Vec::new();
        while reported.is_empty() {
            s.poll(&mut |t| reported.push(t));
            assert!(Instant::now() < deadline);
        }
        assert_eq!(reported, [77]);
        assert_eq!(s.in_flight(), 0);
        assert_eq!(s.write(77, h, 0, b"ignored"), Poll::Ready(Ok(3)));
        // The tag is forgotten: the same tag starts a new operation.
        assert_eq!(s.read(77, h, 0, 10), Poll::Pending);
        assert_eq!(drive(&mut s, 77, |s| s.read(77, h, 0, 10)), Ok(3));
        let mut out = [0u8; 3];
        s.copy_out(77, h, 0, &mut out);
        assert_eq!(&out, b"abc");
        s.close(h);
        assert_idle(&s);
    }

    #[test]
    fn cancel_with_an_operation_in_flight_leaks_nothing() {
        let dir = TempDir::new("cancel");
        let mut s = store(&dir, false);
        let (h, _) = open(&mut s, "c", Disposition::Create).unwrap();
        write(&mut s, h, 0, &[1; 100_000]).unwrap();
        assert_eq!(s.read(10, h, 0, 100_000), Poll::Pending);
        assert_eq!(s.write(11, h, 0, &[2; 10]), Poll::Pending);
        assert_eq!(s.open(12, &req("c2", Disposition::Create)), Poll::Pending);
        for t in [10, 11, 12] {
            s.cancel(t);
        }
        s.cancel(99); // unknown: ignored
                      // The tags are free for new operations at once.
        assert_eq!(s.read(10, h, 0, 10), Poll::Pending);
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut reported = Vec::new();
        while s.in_flight() > 0 {
            s.poll(&mut |t| reported.push(t));
            assert!(Instant::now() < deadline);
        }
        assert_eq!(reported, [10], "cancelled tags are never reported");
        assert_eq!(drive(&mut s, 10, |s| s.read(10, h, 0, 10)), Ok(10));
        s.cancel(10); // a result that will not be collected
                      // A finished CREATE that is cancelled closes its file.
        assert_eq!(s.open(13, &req("c3", Disposition::Create)), Poll::Pending);
        while s.in_flight() > 0 {
            s.poll(&mut |_| {});
        }
        assert_eq!(s.files.len(), 2, "c (ours) and c3 (uncollected)");
        s.cancel(13);
        assert_eq!(s.files.len(), 1);
        s.close(h);
        assert_idle(&s);
        assert!(dir.0.join("c2").exists(), "the cancelled CREATE still ran");
    }

    #[test]
    fn stale_handles_and_exhausted_staging() {
        let dir = TempDir::new("stale");
        let mut s = store(&dir, false);
        let (h, _) = open(&mut s, "x", Disposition::Create).unwrap();
        // Larger than the slab, then two reads that fill it.
        assert_eq!(s.read(1, h, 0, 5 << 20), Poll::Ready(Err(StoreError::Busy)));
        assert_eq!(s.read(1, h, 0, 3 << 20), Poll::Pending);
        assert_eq!(s.read(2, h, 0, 2 << 20), Poll::Ready(Err(StoreError::Busy)));
        assert_eq!(drive(&mut s, 1, |s| s.read(1, h, 0, 3 << 20)), Ok(0));
        s.copy_out(1, h, 0, &mut []);
        s.close(h);
        assert_eq!(s.read(3, h, 0, 1), Poll::Ready(Err(StoreError::Closed)));
        assert_eq!(s.write(3, h, 0, b"x"), Poll::Ready(Err(StoreError::Closed)));
        assert_eq!(s.stat(3, h), Poll::Ready(Err(StoreError::Closed)));
        assert_eq!(s.flush(3, h), Poll::Ready(Err(StoreError::Closed)));
        assert_eq!(s.truncate(3, h, 0), Poll::Ready(Err(StoreError::Closed)));
        s.close(h);
        assert_idle(&s);
        assert!(s.usage().0 > 0 && s.usage().1.is_none());
    }

    #[test]
    fn staging_is_first_fit_over_chunks() {
        let mut st = Staging::new(8 * STAGE_CHUNK).unwrap();
        let a = st.alloc(1).unwrap();
        let b = st.alloc(3 * STAGE_CHUNK).unwrap();
        let c = st.alloc(STAGE_CHUNK + 1).unwrap();
        assert_eq!((a.first, b.first, c.first), (0, 1, 4));
        assert!(st.alloc(3 * STAGE_CHUNK).is_none());
        st.free(b);
        assert_eq!(st.alloc(2 * STAGE_CHUNK).unwrap().first, 1);
        assert_eq!(st.ptr(c) as usize % 4096, 0);
    }

    #[test]
    fn factory_refuses_what_is_not_a_directory() {
        let dir = TempDir::new("factory");
        assert!(DirStoreFactory::new(&dir.0.join("missing"), false).is_err());
        std::fs::write(dir.0.join("file"), b"").unwrap();
        let e = DirStoreFactory::new(&dir.0.join("file"), false).unwrap_err();
        assert!(e.contains("not a directory"), "{e}");
        let f = DirStoreFactory::new(&dir.0, true).unwrap();
        assert!(f.describe().ends_with("(O_DIRECT)"));
        let s = f.handle(0);
        assert_eq!(s.in_flight(), 0);
    }
}
