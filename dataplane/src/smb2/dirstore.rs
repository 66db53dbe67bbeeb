//! The directory store (`--store DIR`): the share's files are files under a
//! directory, and every file operation that may wait on a disk goes through
//! io_uring, so a slow disk never blocks a worker. READ, WRITE and FLUSH of
//! files on a memory file system are plain system calls instead (see
//! "Memory file systems").
//!
//! # Memory file systems
//! When the root is on tmpfs or ramfs (`fstatfs(2)` of the root at factory
//! construction: TMPFS_MAGIC, RAMFS_MAGIC), READ and WRITE of files on the
//! root's device are `pread(2)` and `pwrite(2)` on the worker, and FLUSH is
//! `fsync(2)` (a no-op there). Such a file's data lives in the page cache
//! and nowhere else, so a read or write is a copy to or from memory that
//! never waits on a device: the same work io_uring would do, without its
//! cost. That cost is large: these file systems do not declare
//! non-blocking I/O (no `FMODE_NOWAIT` on Linux 6.1's tmpfs; writes on
//! 6.18's still), so io_uring hands every READ and WRITE to an `iou-wrk`
//! thread, a thread wake-up per I/O (measured: 4 KiB random reads through
//! cifs.ko in the Soft-RoCE guest at 0.4 × ksmbd.ko's rate, which reads and
//! writes tmpfs synchronously from its own thread). Nothing else changes:
//! a READ still lands in a staging run kept in its slot until
//! [`Store::copy_out`] or [`Store::cancel`] (its result is Ready at the
//! first call), a WRITE is copied from the caller's bytes (or a pinned
//! staging run) straight into the file, EINTR is retried, short transfers are continued,
//! errors map as on the ring (an error after some bytes read ends the READ
//! with them), and the O_DIRECT descriptor is chosen as below. Nothing is
//! allocated. Metadata (CREATE, STATX, listings, renames, unlinks,
//! truncation where the ring has it) stays on the ring.
//!
//! Large READs are synchronous too: handing a 1 MiB READ to io_uring (its copy on an
//! `iou-wrk` thread, off the worker) measured worse where the cores are
//! all busy-polling (2-core host, soft provider, 1 MiB READs at QD 4: 2.4
//! to 2.7 GB/s against 3.2 to 3.7 synchronous) and within noise in the
//! Soft-RoCE guest through cifs.ko; `--store-io uring` is there for
//! servers with cores to spare for it.
//!
//! # Copies off the worker
//! On a memory file system the worker's `pread`/`pwrite` is the whole
//! cost of a READ's or WRITE's data: for 1 MiB, the worker polls nothing
//! else while it copies. `serve --store-copy-cores LIST` pins every
//! worker's io_uring workers to LIST (`IORING_REGISTER_IOWQ_AFF`, once,
//! after the worker's first submission) and then sends a copy there
//! ([`squeue::Flags::ASYNC`]: never inline in the submission) when it is
//! at least [`OFFLOAD_MIN_BYTES`] and another transfer is in flight on the
//! worker (a pinned run or an I/O on the ring): the case where the worker
//! has something else to do meanwhile, such as a Soft-RoCE RDMA Read whose
//! packet work runs inside the worker's `ibv_post_send`. A lone copy stays
//! on the worker: handed away it would only wait for the io_uring worker's
//! wake-up. Measured in the Soft-RoCE guest through cifs.ko, 1 MiB at
//! QD 4 and QD 1 (docs/bench-results.md, session 27): with this rule
//! sequential READs at QD 4 gained 8-10 % over copies on the worker in two
//! runs, WRITEs stayed within noise, QD 1 lost nothing; sending every
//! large copy away instead cost QD 1 WRITEs a quarter.
//! Each large copy is counted as sent away or kept
//! ([`Store::take_copy_counts`]; `stats --json`: `store_copies_away`,
//! `store_copies_kept`), so an operator sees the rule at work.
//! Pinning fails on kernels before 5.14: said once per worker, and every
//! copy stays on the worker. With a disk store the pinning keeps the
//! io_uring workers off the polling cores too.
//!
//! # Zero-copy READ
//! The staging slab is registered with the provider
//! ([`Store::zero_copy`]), so an RDMA-channel READ goes out by RDMA Write
//! straight from the run it was read into ([`Store::pin_read`]): no copy to
//! a pool buffer. The run and its slot stay taken until the worker gives
//! the pin back ([`StagePins`]: a bit per slot, freed at the next
//! [`Store::poll`] or READ). Measured on the 2-core host (soft provider,
//! `serve --store /dev/shm/DIR`, `bench --connect`, 3 alternated pairs):
//! 1 MiB READs at QD 4 3.6-3.9 GB/s before, 4.3-5.0 after (two runs);
//! 4 KiB READs at QD 32 and QD 1 within noise of before.
//!
//! Caveats, and why the choice is per file and can be turned off:
//! - *Swap.* tmpfs pages can be swapped out; reading one back waits for
//!   the swap device, and a write may wait for reclaim when memory is
//!   short. On a server that swaps tmpfs, those waits block the worker
//!   (and every connection on it). `serve --store-io uring`
//!   ([`RwPath::Uring`]) keeps every READ and WRITE on io_uring; ramfs
//!   never swaps.
//! - *Mounts beneath the root.* Only files whose device (from the CREATE's
//!   STATX) is the root's are done synchronously; a disk file system
//!   mounted inside the share stays on io_uring.
//! - The start-up line of `serve` says which path the store uses
//!   ([`DirStoreFactory::rw_description`]); `stats` shows it in the store's
//!   description.
//!
//! # Zero-copy WRITE
//! An RDMA-channel WRITE's data goes the other way the same way: the
//! RDMA Read places it straight into a staging run ([`Store::pin_write`]:
//! a slot and run taken under the WRITE's tag), and [`Store::write_pinned`]
//! writes that run out (`pwrite(2)` on a memory file system, else an
//! io_uring WRITE, which with `--store-direct` DMAs it to the device): no
//! copy through a pool buffer, so on a disk store the worker copies no
//! WRITE data at all. Every slot a transfer pinned has `pin_out` set
//! until the pin comes back; whatever ends first (the write, a cancel, a
//! failed transfer the SMB2 layer never completes), the run is freed only
//! after both: a WRITE written and collected before its pin came back
//! stays as [`Kind::Pinned`], and a pin coming back on a run still
//! waiting for `write_pinned` frees it and forgets its tag.
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
//! # Read-only files
//! A file whose mode refuses `O_RDWR` (EACCES, or EROFS on a read-only
//! mount) is opened `O_RDONLY`; WRITE and truncation of it are
//! `Io(EACCES)` (STATUS_ACCESS_DENIED), as for a FILE_ATTRIBUTE_READONLY
//! file on Windows.
//!
//! # Metadata operations
//! Each open file remembers its share-relative path and its identity
//! (device and inode from the CREATE's STATX). Path operations are state
//! machines in a slot like CREATE:
//! - **rename**: OPENAT2 (`O_PATH`, the confined resolution above) of the
//!   old and of the new parent, STATX of the old name in its parent
//!   (`AT_SYMLINK_NOFOLLOW`) to check it still names this file, STATX of
//!   the target when replacing (a directory is never replaced:
//!   `Io(EACCES)`, [MS-FSA] 2.1.5.14.11), then IORING_OP_RENAMEAT between
//!   the two parent descriptors (`RENAME_NOREPLACE` unless replacing; the
//!   last components contain no `/`, so nothing is resolved outside the
//!   confined parents and a symlink target is replaced, never followed).
//!   On success the paths of this worker's opens at or beneath the old
//!   name follow.
//! - **delete on close**: [`Store::set_delete_on_close`] marks the handle;
//!   its close hands the mark to another open of the same file on this
//!   worker if there is one, else unlinks: OPENAT2 of the parent, the
//!   same STATX check, IORING_OP_UNLINKAT (`AT_REMOVEDIR` for a
//!   directory), run in the background without a tag (the handle's
//!   descriptors close after it). "Last close" thus covers the opens of one
//!   worker; an open on another worker keeps the (unlinked) file, as POSIX
//!   does. Marked files sit in a set shared by all workers of the factory,
//!   so no worker opens them again (`DeletePending`, checked against the
//!   identity after the open's STATX; an Overwrite or Supersede of a
//!   delete-pending file has already truncated it by then, and a Create
//!   of its name is `Exists`). Unmarking clears the marks of this worker's
//!   opens only. Creations inside a marked directory are not refused: its
//!   unlink then fails (ENOTEMPTY) and it stays. The CLOSE is answered
//!   before the unlink finishes, so a CREATE of the same file right after
//!   it (`rm f; touch f`) that finds the file still there (or, for a
//!   Create, its name taken) waits for this worker's unlink and opens
//!   again (creating a new file, or NotFound),
//!   instead of answering DeletePending for a file the client already
//!   deleted; and a CREATE whose freshly opened file has lost its last
//!   link by the time it finishes (`fstat(2)`: unlinked meanwhile, here or
//!   from outside) opens again rather than return a handle to a nameless
//!   file.
//! - When a path no longer names the file (renamed through another worker,
//!   or outside the server), the STATX check fails and the current path is
//!   read back from `/proc/self/fd` (`readlink(2)`, synchronous, served
//!   from the dentry cache without disk I/O) once; if that does not lead
//!   to the file either, rename fails with `NotFound` and a pending
//!   deletion is dropped.
//!
//! Synchronous exceptions, each a metadata call with no io_uring opcode:
//! - QUERY_DIRECTORY reads the names with `getdents64(2)` on a duplicate
//!   (`fcntl(F_DUPFD_CLOEXEC)`) of the directory's descriptor, then STATXes
//!   every entry through the ring ([`LIST_WINDOW`] at a time), so the inode
//!   reads that may touch the disk stay asynchronous. A helper thread would
//!   cost a queue, a wake-up and an allocation per request to save one
//!   read of a local directory's entries (from the page cache once read),
//!   off the READ/WRITE path. Symlinks, special files and names that are
//!   not valid SMB names (not UTF-8, `\`, `:`) are not listed.
//! - Marking a directory for deletion checks that it is empty the same way.
//! - SET_INFO: `futimens(2)` for the last access and last write times; the
//!   creation time cannot be set on Linux and the change time is the
//!   kernel's (both ignored). Of the attributes only READONLY is kept, as
//!   the write permission bits of the mode (set: every write bit cleared;
//!   cleared: the owner's write bit set), read by a STATX through the ring
//!   and changed with `fchmod(2)`; the others, and READONLY on a
//!   directory, are ignored. Reported attributes are DIRECTORY, READONLY
//!   (no owner write bit; files only) or NORMAL.
//! - FileFsSizeInformation and friends: `fstatvfs(2)` of the root.
//!
//! # Kernel support
//! OPENAT2, STATX, READ, WRITE, FSYNC and CLOSE (Linux 5.6) are required;
//! the factory probes them and refuses to start without. Where MKDIRAT
//! (5.15), RENAMEAT or UNLINKAT (5.11) or FTRUNCATE (6.9) is missing, that
//! operation alone uses the plain system call (`mkdirat(2)`,
//! `renameat2(2)`, `unlinkat(2)`, `ftruncate(2)`), which completes at once
//! (it may block the worker on a slow disk: upgrade the kernel). A failed
//! io_uring setup (seccomp, `kernel.io_uring_disabled`) is an error: there
//! is no fallback to blocking I/O.

use super::store::{
    attributes, disposition_allows_directory, filetime_from_unix, unix_from_filetime, valid_path,
    Action, CopyCounts, DirEntry, Disposition, FileInfo, FsInfo, Handle, OpenRequest, OpenTable,
    Poll, SetTimes, Store, StoreError, StoreFactory, Tag, ZeroCopy,
};
use crate::provider::Sge;
use crate::zerocopy::{Piece, Pins};
use io_uring::{opcode, squeue, types, IoUring, Probe};
use memmap2::{MmapMut, MmapOptions};
use std::collections::HashMap;
use std::ffi::CString;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
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
/// The smallest READ or WRITE whose copy may leave the worker (`serve
/// --store-copy-cores`): below it the io_uring worker's wake-up costs more
/// than the copy it takes off the worker.
pub const OFFLOAD_MIN_BYTES: u32 = 256 << 10;

/// `cores` as a CPU set.
fn cpu_set(cores: &[usize]) -> libc::cpu_set_t {
    // SAFETY: an all-zero cpu_set_t is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cores {
        if c < libc::CPU_SETSIZE as usize {
            // SAFETY: `c` is inside the set (checked above).
            unsafe { libc::CPU_SET(c, &mut set) };
        }
    }
    set
}
/// `user_data` of fire-and-forget closes.
const CLOSE_DATA: u64 = u64::MAX;
/// Bits of `user_data` naming the slot; the bits above name an entry of a
/// listing (index + 1; 0 for a slot's own step).
const SLOT_BITS: u32 = 32;
/// STATXes one listing keeps in flight.
pub const LIST_WINDOW: usize = 32;
/// Bytes each `getdents64(2)` call may fill.
const DIRENT_BUF: usize = 32 << 10;
/// Offset of `d_name` in a `linux_dirent64`.
const DIRENT_NAME: usize = 19;
/// What every STATX asks for.
const STATX_MASK: u32 = libc::STATX_BASIC_STATS | libc::STATX_BTIME;
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
    /// IORING_OP_RENAMEAT (5.11).
    renameat: bool,
    /// IORING_OP_UNLINKAT (5.11).
    unlinkat: bool,
}

/// Identity of a file: device (major << 32 | minor) and inode number.
type FileKey = (u64, u64);

/// Files marked for deletion on close, shared by the handles of one
/// factory so that no worker opens them again.
#[derive(Debug, Default)]
struct PendingDeletes {
    /// Entries of `files`, read without the lock (usually 0).
    len: AtomicUsize,
    /// Marking workers per file.
    files: Mutex<HashMap<FileKey, u32>>,
}

impl PendingDeletes {
    fn lock(&self) -> MutexGuard<'_, HashMap<FileKey, u32>> {
        // Every change is one insert or update: consistent after a panic.
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn add(&self, key: FileKey) {
        let mut files = self.lock();
        *files.entry(key).or_insert(0) += 1;
        self.len.store(files.len(), Ordering::Release);
    }

    fn remove(&self, key: FileKey) {
        let mut files = self.lock();
        if let Some(n) = files.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                files.remove(&key);
            }
        }
        self.len.store(files.len(), Ordering::Release);
    }

    fn contains(&self, key: FileKey) -> bool {
        self.len.load(Ordering::Acquire) > 0 && self.lock().contains_key(&key)
    }
}

/// Makes [`DirStore`] handles over one directory.
#[derive(Debug, Clone)]
pub struct DirStoreFactory {
    root: Arc<OwnedFd>,
    path: PathBuf,
    direct: bool,
    staging: usize,
    caps: Caps,
    pending: Arc<PendingDeletes>,
    /// The root's file system keeps its data in memory: its name.
    memory_fs: Option<&'static str>,
    /// The root's device ([`FileKey`]'s first half).
    root_dev: u64,
    rw: RwPath,
    /// `serve --store-copy-cores`: CPUs the io_uring workers of every
    /// worker's ring are pinned to (see "Copies off the worker"); empty:
    /// wherever the kernel puts them, and no copy of a memory file system
    /// leaves the worker.
    copy_cores: Arc<[usize]>,
}

/// How READ and WRITE reach the files (`serve --store-io`; see "Memory
/// file systems" in the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RwPath {
    /// Synchronous `pread(2)`/`pwrite(2)` on the worker for files on the
    /// root's file system when that keeps its data in memory (tmpfs,
    /// ramfs); io_uring otherwise.
    #[default]
    Auto,
    /// io_uring for every READ and WRITE.
    Uring,
}

/// The name of a file system that keeps file data in memory, so a read or
/// write of it is a copy to or from the page cache and never waits on a
/// device (swap aside: see the module docs), by `f_type` of `statfs(2)`.
fn memory_fs_name(f_type: i64) -> Option<&'static str> {
    /// TMPFS_MAGIC and RAMFS_MAGIC of `linux/magic.h` (`f_type` is a
    /// `c_long` or a `c_uint` by architecture: compared as i64).
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    match f_type {
        TMPFS_MAGIC => Some("tmpfs"),
        RAMFS_MAGIC => Some("ramfs"),
        _ => None,
    }
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
        // SAFETY: zeroed `statfs` is valid; a descriptor of ours.
        let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: valid descriptor and out-pointer (O_PATH descriptors
        // allow fstatfs).
        let memory_fs = if unsafe { libc::fstatfs(root_fd.as_raw_fd(), &mut sfs) } == 0 {
            memory_fs_name(sfs.f_type as i64)
        } else {
            None
        };
        // SAFETY: zeroed `statx` is valid.
        let mut stx: libc::statx = unsafe { std::mem::zeroed() };
        // SAFETY: valid descriptor, empty path with AT_EMPTY_PATH, out-pointer.
        if unsafe {
            libc::statx(
                root_fd.as_raw_fd(),
                c"".as_ptr(),
                libc::AT_EMPTY_PATH,
                libc::STATX_BASIC_STATS,
                &mut stx,
            )
        } < 0
        {
            return Err(format!(
                "directory store: cannot stat {}: {}",
                root.display(),
                std::io::Error::last_os_error()
            ));
        }
        let root_dev = key_of(&stx).0;
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
            renameat: probe.is_supported(opcode::RenameAt::CODE),
            unlinkat: probe.is_supported(opcode::UnlinkAt::CODE),
        };
        let staging = staging_bytes.max(STAGE_CHUNK).div_ceil(STAGE_CHUNK) * STAGE_CHUNK;
        Ok(DirStoreFactory {
            root: Arc::new(root_fd),
            path: root.to_path_buf(),
            direct,
            staging,
            caps,
            pending: Arc::default(),
            memory_fs,
            root_dev,
            rw: RwPath::Auto,
            copy_cores: Arc::from([]),
        })
    }

    /// Chooses how READ and WRITE reach the files (default
    /// [`RwPath::Auto`]).
    pub fn with_rw_path(mut self, rw: RwPath) -> Self {
        self.rw = rw;
        self
    }

    /// Pins every worker's io_uring workers to `cores`, and lets the copies
    /// of large READs and WRITEs of a memory file system leave the worker
    /// for them (`serve --store-copy-cores`; see "Copies off the worker"
    /// in the module docs). Empty (the default): the kernel places them,
    /// and every such copy stays on the worker.
    pub fn with_copy_cores(mut self, cores: &[usize]) -> Self {
        self.copy_cores = Arc::from(cores);
        self
    }

    /// The memory file system whose files are read and written
    /// synchronously, or None (io_uring for every READ and WRITE).
    pub fn sync_rw(&self) -> Option<&'static str> {
        match self.rw {
            RwPath::Auto => self.memory_fs,
            RwPath::Uring => None,
        }
    }

    /// How READ and WRITE are done, for the start-up log.
    pub fn rw_description(&self) -> String {
        match (self.sync_rw(), self.memory_fs) {
            (Some(fs), _) => {
                let mut d = format!(
                    "{fs}: READ and WRITE synchronous on the worker (memory file system; \
                     io_uring for mounts beneath the root and for metadata)"
                );
                if !self.copy_cores.is_empty() {
                    d.push_str(&format!(
                        ", except copies of {} KiB or more while another transfer is in \
                         flight, which io_uring workers on cores {} make",
                        OFFLOAD_MIN_BYTES >> 10,
                        crate::cores::format_cores(&self.copy_cores)
                    ));
                }
                d
            }
            (None, Some(fs)) => format!(
                "{fs}: READ and WRITE through io_uring (--store-io uring){}",
                self.copy_workers()
            ),
            (None, None) => format!("READ and WRITE through io_uring{}", self.copy_workers()),
        }
    }

    /// Where the io_uring workers run, for the descriptions.
    fn copy_workers(&self) -> String {
        if self.copy_cores.is_empty() {
            String::new()
        } else {
            format!(
                ", its workers on cores {}",
                crate::cores::format_cores(&self.copy_cores)
            )
        }
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
        if let Some(fs) = self.sync_rw() {
            d.push_str(&format!(" ({fs}, synchronous READ/WRITE)"));
        }
        if !self.copy_cores.is_empty() {
            d.push_str(&format!(
                " (io_uring workers on cores {})",
                crate::cores::format_cores(&self.copy_cores)
            ));
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
    /// Opened `O_RDWR` (else `O_RDONLY`: see "Read-only files").
    writable: bool,
    /// Share-relative, `/`-separated ("" for the root), as of the last
    /// rename through this handle's store.
    path: String,
    /// What `path` must name (checked before a rename or unlink).
    key: FileKey,
    /// Unlink at close ([`Store::set_delete_on_close`]).
    delete_on_close: bool,
    /// READ, WRITE and FLUSH by plain system calls (on the root's memory
    /// file system: see "Memory file systems" in the module docs).
    sync_rw: bool,
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
    /// `O_RDONLY`: `O_RDWR` was refused (EACCES, EROFS).
    ReadOnly,
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
    /// `/`-separated path, "" for the root (what the handle remembers).
    share_path: String,
    /// The main open was `O_RDWR`.
    writable: bool,
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
    /// The step the CREATE started with (where it starts again).
    first: Step,
    /// Waiting for this worker's unlink of that file to finish before it
    /// opens again (see [`DirStore::park_behind_unlink`]).
    after_unlink: Option<FileKey>,
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
    /// A staging run a transfer still holds by its pin ([`StagePins`]),
    /// with nothing else left to do: a finished READ an RDMA Write sends
    /// in place ([`Store::pin_read`]), or a WRITE's run whose write ended
    /// (or was cancelled) before its RDMA Read's pin came back. Its tag is
    /// forgotten; the slot and run are freed once the pin comes back.
    Pinned {
        stage: Stage,
    },
    /// A WRITE's staging run an RDMA Read is filling in place
    /// ([`Store::pin_write`]), until [`Store::write_pinned`] writes it out
    /// (it becomes a [`Kind::Write`]) or its pin comes back first (the
    /// transfer failed, or the caller gave up: the slot and tag are freed).
    WritePinned {
        h: Handle,
        stage: Stage,
        offset: u64,
        len: u32,
    },
    Stat,
    Fsync,
    Truncate,
    /// QUERY_DIRECTORY: a STATX per entry, several in flight.
    List(Box<ListOp>),
    /// Rename, or the unlink of a delete-on-close file.
    Path(Box<PathOp>),
    /// SET_INFO of READONLY: STATX for the mode, then `fchmod(2)`.
    Chmod {
        h: Handle,
        read_only: bool,
    },
}

/// A listing in progress: names read, their STATXes in flight.
struct ListOp {
    /// A duplicate of the directory's descriptor, the STATXes' dirfd.
    dirfd: RawFd,
    names: Vec<CString>,
    /// STATX target per name (never resized: the kernel writes into it).
    bufs: Vec<libc::statx>,
    /// STATX result per name.
    res: Vec<i32>,
    /// The next name to STATX.
    next: usize,
    /// STATXes whose CQE is due.
    outstanding: usize,
    /// The snapshot, once complete.
    entries: Vec<DirEntry>,
}

/// What a path operation does once the old name is checked.
enum PathAct {
    Rename {
        h: Handle,
        /// `/`-separated.
        new_path: String,
        new_parent: CString,
        new_name: CString,
        replace: bool,
    },
    /// Delete on close: the closed handle's descriptors, closed after.
    Unlink {
        is_dir: bool,
        fd: RawFd,
        direct_fd: RawFd,
    },
}

/// The step of a path operation whose CQE is awaited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PathStep {
    /// OPENAT2 of the old name's parent.
    OldParent,
    /// OPENAT2 of the new name's parent (rename).
    NewParent,
    /// STATX of the old name: is it still this file?
    Verify,
    /// STATX of the target (rename with replace).
    Target,
    /// RENAMEAT or UNLINKAT.
    Act,
}

/// A rename or unlink in progress (boxed: a metadata path).
struct PathOp {
    act: PathAct,
    /// The file the old name must name.
    key: FileKey,
    /// The old name, `/`-separated, its parent ("." at the top) and last
    /// component.
    path: String,
    parent: CString,
    name: CString,
    /// Read by the kernel when the OPENAT2 SQE is prepared.
    how: types::OpenHow,
    step: PathStep,
    old_pfd: RawFd,
    new_pfd: RawFd,
    /// The path was read back from /proc once already.
    refreshed: bool,
}

/// What a finished operation produced.
#[derive(Debug, Clone, Copy)]
enum Out {
    Open(Handle, Action, FileInfo),
    Count(u32),
    Info(FileInfo),
    Unit,
    /// A listing is complete (the entries wait in its [`ListOp`]).
    Listed,
}

/// One operation.
struct OpSlot {
    tag: Tag,
    kind: Kind,
    /// A CQE is due.
    awaiting: bool,
    /// The tag was cancelled: drop the result when the CQE arrives.
    cancelled: bool,
    /// A transfer's pin on this slot's staging run has not come back: the
    /// run (and the slot) stay taken until it does, whatever else ends.
    pin_out: bool,
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
            pin_out: false,
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

/// The identity of a STATX result.
fn key_of(st: &libc::statx) -> FileKey {
    (
        u64::from(st.stx_dev_major) << 32 | u64::from(st.stx_dev_minor),
        st.stx_ino,
    )
}

/// The errno of the last failed system call.
fn last_errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// A `/`-separated share path's parent ("." at the top) and last
/// component, as C strings.
fn unix_parts(path: &str) -> Result<(CString, CString), StoreError> {
    let (parent, name) = path.rsplit_once('/').unwrap_or((".", path));
    let c = |s: &str| CString::new(s).map_err(|_| StoreError::InvalidName);
    Ok((c(parent)?, c(name)?))
}

/// Calls `visit` with the name and `d_type` of every entry of the open
/// directory `fd` but `.` and `..`, from the start (`getdents64(2)`,
/// synchronous: see the module docs), until it returns false. Errors are
/// errnos.
fn for_each_dirent(fd: RawFd, mut visit: impl FnMut(&[u8], u8) -> bool) -> Result<(), i32> {
    // SAFETY: a descriptor of ours; the result is checked.
    if unsafe { libc::lseek(fd, 0, libc::SEEK_SET) } < 0 {
        return Err(last_errno());
    }
    let mut buf = vec![0u8; DIRENT_BUF];
    loop {
        // SAFETY: `buf` is writable for `buf.len()` bytes; the kernel
        // writes at most that many.
        let n = unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len()) };
        if n < 0 {
            return Err(last_errno());
        }
        if n == 0 {
            return Ok(());
        }
        let filled = &buf[..n as usize];
        let mut off = 0;
        // linux_dirent64: d_ino (8), d_off (8), d_reclen (2), d_type (1),
        // d_name (NUL-terminated, padded to d_reclen).
        while off + DIRENT_NAME <= filled.len() {
            let reclen = usize::from(u16::from_ne_bytes([filled[off + 16], filled[off + 17]]));
            if reclen <= DIRENT_NAME || off + reclen > filled.len() {
                return Err(libc::EIO);
            }
            let d_type = filled[off + 18];
            let raw = &filled[off + DIRENT_NAME..off + reclen];
            let name = &raw[..raw.iter().position(|&b| b == 0).unwrap_or(raw.len())];
            if name != b"." && name != b".." && !visit(name, d_type) {
                return Ok(());
            }
            off += reclen;
        }
    }
}

/// Whether a directory entry is listed: a regular file or directory (or
/// not yet known: STATX decides) whose name a client can use.
fn listable(name: &[u8], d_type: u8) -> Option<&str> {
    if !matches!(d_type, libc::DT_REG | libc::DT_DIR | libc::DT_UNKNOWN) {
        return None;
    }
    let name = std::str::from_utf8(name).ok()?;
    (!name.contains('\\') && valid_path(name)).then_some(name)
}

/// FileInfo of a STATX result (never delete-pending: the caller knows).
fn info_from_statx(st: &libc::statx) -> FileInfo {
    let ft = |t: &libc::statx_timestamp| filetime_from_unix(t.tv_sec, t.tv_nsec);
    let mode = u32::from(st.stx_mode);
    let is_dir = mode & libc::S_IFMT == libc::S_IFDIR;
    let read_only = !is_dir && mode & 0o200 == 0;
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
        file_id: st.stx_ino,
        attributes: attributes::reported(if read_only { attributes::READONLY } else { 0 }, is_dir),
        nlink: st.stx_nlink,
        delete_pending: false,
    }
}

/// A fresh SQE could not be queued.
#[derive(Debug)]
struct QueueFull;

/// The pins of READs sent from the staging slab in place (zero-copy RDMA,
/// [`crate::zerocopy`]): a piece's pin is its slot, and [`Pins::unpin`]
/// (the worker, once the RDMA Write can no longer read the run) sets the
/// slot's bit; the store frees the slots whose bits are set at its next
/// [`Store::poll`] or READ. Lock-free, allocation-free.
#[derive(Debug)]
struct StagePins {
    released: [AtomicU64; MAX_OPS / 64],
}

impl StagePins {
    fn new() -> Self {
        StagePins {
            released: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Pins for StagePins {
    fn unpin(&self, piece: &Piece) {
        let slot = piece.pin as usize;
        if let Some(w) = self.released.get(slot / 64) {
            w.fetch_or(1 << (slot % 64), Ordering::Release);
        }
    }
}

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
    /// Dropped by hand: leaked if the kernel may still write into it, or
    /// an RDMA Write still read a pinned run of it.
    staging: ManuallyDrop<Staging>,
    /// Pins of transfers in place from or into `staging` (the slots'
    /// `pin_out`).
    pins: Arc<StagePins>,
    /// Slots whose `pin_out` is set.
    pinned: usize,
    /// CREATEs waiting for an unlink of their file to finish
    /// ([`DirStore::park_behind_unlink`]).
    parked: usize,
    /// An unlink ended since the parked CREATEs were last looked at: they
    /// are looked at (a walk of the slots) only then, not at every poll.
    unlink_ended: bool,
    /// Operations whose CQE is due (cancelled ones included).
    in_flight: usize,
    /// Fire-and-forget closes whose CQE is due.
    closes: usize,
    /// Delete-on-close marks, shared with the factory's other handles.
    pending: Arc<PendingDeletes>,
    /// Unlinks at close waiting for a free slot.
    deferred: Vec<PathOp>,
    /// VolumeLabel ([`Store::fs_info`]).
    label: String,
    /// The device whose files are read and written synchronously (the
    /// root's, when it is a memory file system).
    sync_dev: Option<u64>,
    /// Whether large copies of those files may leave the worker.
    offload: Offload,
    /// Large copies decided since [`Store::take_copy_counts`] last ran.
    copies: CopyCounts,
}

/// Copies off the worker (see the module docs), per [`DirStore`].
#[derive(Debug, Clone, Copy)]
enum Offload {
    /// No `--store-copy-cores`, or pinning the io_uring workers failed.
    Off,
    /// Configured; this thread's io_uring workers are pinned after its
    /// first submission (they exist from then on). No copy leaves the
    /// worker before that.
    Unpinned(libc::cpu_set_t),
    /// Pinned: large copies may leave the worker.
    On,
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
            .field("sync_dev", &self.sync_dev)
            .finish()
    }
}

/// The volume label of a share over `root`: its last component, at most
/// 32 UTF-16 code units ([MS-FSCC] 2.5.9).
fn volume_label(root: &Path) -> String {
    let name = root.file_name().and_then(|n| n.to_str()).unwrap_or("share");
    let mut units = 0;
    name.chars()
        .take_while(|c| {
            units += c.len_utf16();
            units <= 32
        })
        .collect()
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
            pins: Arc::new(StagePins::new()),
            pinned: 0,
            parked: 0,
            unlink_ended: false,
            in_flight: 0,
            closes: 0,
            pending: Arc::clone(&f.pending),
            deferred: Vec::new(),
            label: volume_label(&f.path),
            sync_dev: f.sync_rw().map(|_| f.root_dev),
            offload: if f.copy_cores.is_empty() {
                Offload::Off
            } else {
                Offload::Unpinned(cpu_set(&f.copy_cores))
            },
            copies: CopyCounts::default(),
        })
    }

    /// Queues an SQE and submits it. A full queue is submitted first; a
    /// submit error leaves the SQE queued for the next `poll`.
    fn push(&mut self, entry: squeue::Entry) -> Result<(), QueueFull> {
        for attempt in 0..2 {
            // SAFETY: every pointer in our SQEs (staging runs, boxed paths
            // and open_how, slot STATX buffers, a listing's names and STATX
            // buffers) stays valid until the CQE: slots and stages are
            // released only after it (a listing's after its last one).
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                let submitted = self.ring.submit().is_ok();
                if submitted {
                    if let Offload::Unpinned(set) = self.offload {
                        self.pin_copy_workers(&set);
                    }
                }
                return Ok(());
            }
            if attempt == 0 {
                let _ = self.ring.submit();
            }
        }
        Err(QueueFull)
    }

    /// Pins the io_uring workers of the calling thread (the worker: a
    /// task's io_uring workers are its own, and exist once it has
    /// submitted) to `set`, once. On failure (a kernel before 5.14, or
    /// cores outside the process's cpuset) says so and keeps every copy on
    /// the worker: unpinned, the io_uring workers could land on a polling
    /// core.
    fn pin_copy_workers(&mut self, set: &libc::cpu_set_t) {
        match self.ring.submitter().register_iowq_aff(set) {
            Ok(()) => self.offload = Offload::On,
            Err(e) => {
                self.offload = Offload::Off;
                eprintln!(
                    "smbdirectd: directory store: cannot pin io_uring workers to the \
                     --store-copy-cores ({e}): READ and WRITE copies stay on the worker"
                );
            }
        }
    }

    /// Whether a READ or WRITE of `len` bytes of a memory file system goes
    /// to an io_uring worker on a copy core instead of being copied here:
    /// copy cores are set and pinned, the copy is large, and `others` (a
    /// transfer besides this one is in flight on this worker: its copy, or
    /// on a NIC-less RDMA provider its packet work, can run meanwhile). Alone,
    /// a copy sent away only waits for a wake-up.
    ///
    /// Each large copy is counted as sent away or kept
    /// ([`Store::take_copy_counts`]).
    fn offload_now(&mut self, len: u32, others: bool) -> bool {
        if !matches!(self.offload, Offload::On) || len < OFFLOAD_MIN_BYTES {
            return false;
        }
        if others {
            self.copies.away += 1;
        } else {
            self.copies.kept += 1;
        }
        others
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

    /// A slot for a READ (`data` None) or WRITE of `len` bytes at `offset`
    /// of `h`, holding a staging run of `len` bytes (`data` copied into it):
    /// the slot and its run, or the run given back when no slot is free.
    fn alloc_staged_slot(
        &mut self,
        tag: Tag,
        h: Handle,
        offset: u64,
        len: u32,
        data: Option<&[u8]>,
    ) -> Result<(usize, Stage), StoreError> {
        if self.pinned > 0 {
            // The SMB2 layer polls only with operations in flight: pins
            // that came back are taken in here too, before they are needed.
            self.reclaim_unpinned();
        }
        let stage = self.staging.alloc(len as usize).ok_or(StoreError::Busy)?;
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
        self.alloc_slot(tag, kind)
            .map(|slot| (slot, stage))
            .inspect_err(|_| self.staging.free(stage))
    }

    /// Takes back the pins that came back: a slot with nothing else left
    /// ([`Kind::Pinned`]) is freed with its run; a [`Kind::WritePinned`]
    /// slot whose pin came back before [`Store::write_pinned`] (the RDMA
    /// Read failed, or its file or request went away) is freed with its
    /// tag; a WRITE being written out is freed when its result is
    /// collected. A bit for a slot without a pin out (none is set twice
    /// per pin) is ignored.
    fn reclaim_unpinned(&mut self) {
        for w in 0..self.pins.released.len() {
            if self.pins.released[w].load(Ordering::Relaxed) == 0 {
                continue;
            }
            let mut bits = self.pins.released[w].swap(0, Ordering::Acquire);
            while bits != 0 {
                let slot = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if !self.ops[slot].pin_out {
                    continue;
                }
                self.ops[slot].pin_out = false;
                self.pinned -= 1;
                match self.ops[slot].kind {
                    Kind::Pinned { .. } => self.release_slot(slot),
                    Kind::WritePinned { .. } => {
                        let tag = self.ops[slot].tag;
                        if self.tags.get(&tag) == Some(&(slot as u32)) {
                            self.tags.remove(&tag);
                        }
                        self.release_slot(slot);
                    }
                    _ => {}
                }
            }
        }
    }

    fn alloc_slot(&mut self, tag: Tag, kind: Kind) -> Result<usize, StoreError> {
        if self.pinned > 0 && self.free_ops.is_empty() {
            self.reclaim_unpinned();
        }
        if self.tags.len() >= MAX_OPS {
            return Err(StoreError::Busy);
        }
        let slot = self.free_ops.pop().ok_or(StoreError::Busy)? as usize;
        let s = &mut self.ops[slot];
        s.tag = tag;
        s.kind = kind;
        s.awaiting = false;
        s.cancelled = false;
        s.pin_out = false;
        s.result = None;
        self.tags.insert(tag, slot as u32);
        Ok(slot)
    }

    /// Releases a slot whose CQE is not due: staging, and the descriptors
    /// of an unfinished CREATE.
    fn release_slot(&mut self, slot: usize) {
        debug_assert!(!self.ops[slot].awaiting);
        if self.ops[slot].pin_out {
            // A transfer still holds the run by its pin: keep the run and
            // the slot until it comes back (reclaim_unpinned).
            if let Kind::Read { stage, .. }
            | Kind::Write { stage, .. }
            | Kind::WritePinned { stage, .. }
            | Kind::Pinned { stage } = self.ops[slot].kind
            {
                self.ops[slot].kind = Kind::Pinned { stage };
                self.ops[slot].result = None;
                return;
            }
        }
        match std::mem::replace(&mut self.ops[slot].kind, Kind::Free) {
            Kind::Read { stage, .. }
            | Kind::Write { stage, .. }
            | Kind::WritePinned { stage, .. }
            | Kind::Pinned { stage } => self.staging.free(stage),
            Kind::Open(op) => {
                if op.after_unlink.is_some() {
                    self.parked -= 1;
                }
                self.close_fd(op.fd);
                self.close_fd(op.direct_fd);
                self.close_fd(op.parent_fd);
            }
            Kind::List(op) => self.close_fd(op.dirfd),
            Kind::Path(op) => {
                self.close_fd(op.old_pfd);
                self.close_fd(op.new_pfd);
                if let PathAct::Unlink { fd, direct_fd, .. } = op.act {
                    self.close_fd(fd);
                    self.close_fd(direct_fd);
                    self.pending.remove(op.key);
                    self.unlink_ended = true;
                }
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
                let e = opcode::Read::new(types::Fd(fd), buf, n).offset(off).build();
                // A file of the synchronous device is here only as a copy
                // sent off the worker: never run inline in the submission.
                if file.sync_rw {
                    e.flags(squeue::Flags::ASYNC)
                } else {
                    e
                }
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
                let e = opcode::Write::new(types::Fd(fd), buf, n)
                    .offset(off)
                    .build();
                if file.sync_rw {
                    e.flags(squeue::Flags::ASYNC)
                } else {
                    e
                }
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
                let st = &self.ops[slot].statx;
                let mut info = info_from_statx(st);
                info.delete_pending = self.pending.contains(key_of(st));
                Ok(Out::Info(info))
            }),
            Kind::Fsync | Kind::Truncate => Some(if res < 0 {
                Err(errno_error(-res))
            } else {
                Ok(Out::Unit)
            }),
            Kind::Open(_) => self.open_advance(slot, res),
            Kind::Path(_) => self.path_advance(slot, res),
            Kind::Chmod { h, read_only } => Some(if res < 0 {
                Err(errno_error(-res))
            } else {
                self.chmod_finish(h, read_only, u32::from(self.ops[slot].statx.stx_mode))
            }),
            // A listing's CQEs carry an entry index: `list_cqe`.
            Kind::List(_) | Kind::Free | Kind::Pinned { .. } | Kind::WritePinned { .. } => None,
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
                    Mode::ReadOnly => libc::O_RDONLY,
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
                .mask(STATX_MASK)
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
                    Ok(false) if self.park_behind_unlink(slot) => return None,
                    Ok(false) if self.reopen_if_unlinked(slot) => {}
                    Ok(false) => return Some(self.open_finish(slot)),
                    // Create (O_EXCL) of a name this worker is unlinking.
                    Err(StoreError::Exists) if self.park_create_behind_unlink(slot) => return None,
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
                    op.writable = !matches!(mode, Mode::ReadOnly | Mode::Dir);
                    op.step = if direct && op.writable {
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
                    // No write permission, or a read-only mount.
                    (Mode::ReadWrite, libc::EACCES | libc::EROFS) => {
                        op.step = Step::Main(Mode::ReadOnly)
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

    /// The file a CREATE opened is marked for deletion and this worker is
    /// unlinking it now (its last handle was closed with delete-on-close:
    /// the CLOSE was answered, the unlink runs in the background): to the
    /// client the file is already gone, so the CREATE closes what it
    /// opened and starts again once the unlink has finished
    /// ([`DirStore::resume_parked`]), instead of answering
    /// STATUS_DELETE_PENDING for a file it just deleted (`rm f; touch f`).
    /// Files only (directories and a file still open elsewhere keep
    /// DeletePending); at most [`OPEN_RETRIES`] times.
    fn park_behind_unlink(&mut self, slot: usize) -> bool {
        let key = key_of(&self.ops[slot].statx);
        if !self.pending.contains(key) || !self.unlinking(key) {
            return false;
        }
        let op = self.open_op(slot);
        if op.directory || !Self::may_restart(op) {
            return false;
        }
        op.after_unlink = Some(key);
        self.restart_open(slot);
        self.parked += 1;
        true
    }

    /// The object a CREATE opened was unlinked since (its last link is
    /// gone: deleted on close by this worker a moment ago, or from
    /// outside): open again, as if the CREATE had come a moment later
    /// (the name is free, or names another file), rather than answer
    /// with a handle to a file that no longer has a name. `fstat(2)` of
    /// the descriptor just opened: the inode is in memory, nothing waits
    /// on a device.
    fn reopen_if_unlinked(&mut self, slot: usize) -> bool {
        let op = self.open_op(slot);
        if !Self::may_restart(op) || op.fd < 0 {
            return false;
        }
        // SAFETY: zeroed `stat` is valid; an open descriptor of ours and
        // an out-pointer.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(op.fd, &mut st) } < 0 || st.st_nlink > 0 {
            return false;
        }
        self.restart_open(slot);
        true
    }

    /// Whether the CREATE may start again from its first step (a plain
    /// open through the ring, retries left).
    fn may_restart(op: &OpenOp) -> bool {
        op.retries < OPEN_RETRIES && matches!(op.first, Step::Main(_))
    }

    /// Closes what the CREATE opened and takes it back to its first step.
    fn restart_open(&mut self, slot: usize) {
        let op = self.open_op(slot);
        op.retries += 1;
        op.step = op.first;
        op.action = match op.first {
            Step::Main(Mode::CreateExcl) => Action::Created,
            Step::Main(Mode::Truncate) => Action::Overwritten,
            _ => Action::Opened,
        };
        let fds = [op.fd, op.direct_fd, op.parent_fd];
        (op.fd, op.direct_fd, op.parent_fd) = (-1, -1, -1);
        for fd in fds {
            self.close_fd(fd);
        }
    }

    /// [`DirStore::park_behind_unlink`] for a Create (`O_EXCL`) that found
    /// the name taken by a file this worker is unlinking (by its share
    /// path: the CREATE opened nothing to compare).
    fn park_create_behind_unlink(&mut self, slot: usize) -> bool {
        let op = match &self.ops[slot].kind {
            Kind::Open(op) => op,
            _ => return false,
        };
        if op.directory || op.disposition != Disposition::Create || !Self::may_restart(op) {
            return false;
        }
        let key = self.ops.iter().find_map(|s| match &s.kind {
            Kind::Path(p) if matches!(p.act, PathAct::Unlink { .. }) && p.path == op.share_path => {
                Some(p.key)
            }
            _ => None,
        });
        let Some(key) = key else {
            return false;
        };
        self.open_op(slot).after_unlink = Some(key);
        self.restart_open(slot);
        self.parked += 1;
        true
    }

    /// Whether this worker is unlinking the file `key` (a delete-on-close
    /// unlink in a slot).
    fn unlinking(&self, key: FileKey) -> bool {
        self.ops.iter().any(|s| {
            matches!(&s.kind, Kind::Path(op) if op.key == key
                && matches!(op.act, PathAct::Unlink { .. }))
        })
    }

    /// Starts again the CREATEs parked behind an unlink that has finished,
    /// reporting those that end at once.
    fn resume_parked(&mut self, done: &mut dyn FnMut(Tag)) {
        for slot in 0..self.ops.len() {
            let key = match &self.ops[slot].kind {
                Kind::Open(op) if !self.ops[slot].awaiting => match op.after_unlink {
                    Some(key) => key,
                    None => continue,
                },
                _ => continue,
            };
            if self.unlinking(key) {
                continue;
            }
            self.open_op(slot).after_unlink = None;
            self.parked -= 1;
            let result = match self.open_submit(slot) {
                Ok(None) => None,
                Ok(Some(r)) => self.open_advance(slot, r),
                Err(e) => Some(Err(self.open_fail(slot, e))),
            };
            if let Some(r) = result {
                self.ops[slot].result = Some(r);
                done(self.ops[slot].tag);
            }
            if self.parked == 0 {
                return;
            }
        }
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
        let key = key_of(&self.ops[slot].statx);
        if self.pending.contains(key) {
            return Err(self.open_fail(slot, StoreError::DeletePending));
        }
        let sync_rw = !info.is_dir && self.sync_dev == Some(key.0);
        let op = self.open_op(slot);
        let file = File {
            fd: op.fd,
            direct_fd: op.direct_fd,
            is_dir: info.is_dir,
            writable: op.writable,
            path: std::mem::take(&mut op.share_path),
            key,
            delete_on_close: false,
            sync_rw,
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
            share_path: unix.clone(),
            writable: false,
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
            first: step,
            after_unlink: None,
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
                let slot = (user_data & ((1 << SLOT_BITS) - 1)) as usize;
                let entry = (user_data >> SLOT_BITS) as usize;
                if slot >= MAX_OPS {
                    continue;
                }
                if entry > 0 {
                    self.list_cqe(slot, entry - 1, res, done);
                    continue;
                }
                if !self.ops[slot].awaiting {
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
                                .mask(STATX_MASK)
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

    /// The staging slab: READ data goes out by RDMA Write from the run it
    /// was read into, instead of being copied to a pool buffer first.
    fn zero_copy(&self) -> Option<ZeroCopy> {
        Some(ZeroCopy {
            regions: vec![(self.staging.base.as_ptr() as usize, self.staging.len())],
            pins: Arc::clone(&self.pins) as Arc<dyn Pins>,
        })
    }

    /// One piece: the READ's own staging run, pinned by its slot (the tag
    /// is forgotten; the slot and run are freed once the pin comes back).
    fn pin_read(
        &mut self,
        tag: Tag,
        h: Handle,
        offset: u64,
        len: u32,
        lkeys: &[u32],
        out: &mut [Piece],
    ) -> Option<usize> {
        let &slot = self.tags.get(&tag)?;
        let slot = slot as usize;
        let s = &self.ops[slot];
        let stage = match (&s.kind, s.result) {
            (
                &Kind::Read {
                    h: rh,
                    stage,
                    offset: ro,
                    ..
                },
                Some(Ok(Out::Count(n))),
            ) if rh == h && ro == offset && len > 0 && len <= n => stage,
            _ => return None,
        };
        let (&lkey, first) = (lkeys.first()?, out.first_mut()?);
        *first = Piece {
            sge: Sge {
                addr: self.staging.ptr(stage) as u64,
                len,
                lkey,
            },
            pin: slot as u32,
        };
        self.tags.remove(&tag);
        self.ops[slot].kind = Kind::Pinned { stage };
        self.ops[slot].result = None;
        self.ops[slot].pin_out = true;
        self.pinned += 1;
        Some(1)
    }

    /// One piece: a staging run of `len` bytes the RDMA Read fills, pinned
    /// by its slot under `tag` until [`Store::write_pinned`] writes it out
    /// (on the worker for a memory file system, else through io_uring).
    /// None (nothing taken: the caller stages the data through a pool
    /// buffer, and `write` gives the error) for what `write` would refuse
    /// or when no run or slot is free.
    fn pin_write(
        &mut self,
        tag: Tag,
        h: Handle,
        offset: u64,
        len: u32,
        lkeys: &[u32],
        out: &mut [Piece],
    ) -> Option<usize> {
        match self.files.get(h) {
            Ok(f) if !f.is_dir && f.writable => {}
            _ => return None,
        }
        let end = offset.checked_add(u64::from(len))?;
        if len == 0 || end > i64::MAX as u64 || self.tags.contains_key(&tag) {
            return None;
        }
        let (&lkey, first) = (lkeys.first()?, out.first_mut()?);
        if self.pinned > 0 {
            self.reclaim_unpinned();
        }
        let stage = self.staging.alloc(len as usize)?;
        let kind = Kind::WritePinned {
            h,
            stage,
            offset,
            len,
        };
        let Ok(slot) = self.alloc_slot(tag, kind) else {
            self.staging.free(stage);
            return None;
        };
        *first = Piece {
            sge: Sge {
                addr: self.staging.ptr(stage) as u64,
                len,
                lkey,
            },
            pin: slot as u32,
        };
        self.ops[slot].pin_out = true;
        self.pinned += 1;
        Some(1)
    }

    fn take_copy_counts(&mut self) -> CopyCounts {
        std::mem::take(&mut self.copies)
    }

    fn write_pinned(&mut self, tag: Tag, h: Handle, offset: u64, len: u32) -> Poll<u32> {
        let Some(&slot) = self.tags.get(&tag) else {
            return Poll::Ready(Err(StoreError::Io(libc::EINVAL)));
        };
        let slot = slot as usize;
        let stage = match self.ops[slot].kind {
            Kind::WritePinned {
                h: wh,
                stage,
                offset: wo,
                len: wl,
            } if wh == h && wo == offset && wl == len => stage,
            _ => return Poll::Ready(Err(StoreError::Io(libc::EINVAL))),
        };
        let sync = match self.files.get(h) {
            Ok(f) => f.sync_rw,
            Err(e) => {
                self.tags.remove(&tag);
                self.release_slot(slot);
                return Poll::Ready(Err(e));
            }
        };
        // This WRITE's own pin may still be out: another transfer is a
        // second pin, or an I/O on the ring.
        let others = self.pinned > usize::from(self.ops[slot].pin_out) || self.in_flight > 0;
        if sync && !self.offload_now(len, others) {
            // SAFETY: the run holds the `len` bytes the RDMA Read placed
            // (its completion came before this call) and nothing writes it
            // while the slot holds it; it is not `self`'s memory, so the
            // slice does not borrow `self`.
            let data = unsafe { std::slice::from_raw_parts(self.staging.ptr(stage), len as usize) };
            let r = self.write_now(h, offset, data);
            self.tags.remove(&tag);
            self.release_slot(slot);
            return narrow(r, |o| match o {
                Out::Count(n) => Some(n),
                _ => None,
            });
        }
        self.ops[slot].kind = Kind::Write {
            h,
            stage,
            offset,
            len,
            put: 0,
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
                Ok(f) if !f.writable => Poll::Ready(Err(StoreError::Io(libc::EACCES))),
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
                Ok(f) if f.sync_rw => {
                    // A memory file system: nothing to make durable, no
                    // device to wait on (fsync(2) returns at once).
                    // SAFETY: an open descriptor of ours.
                    if unsafe { libc::fsync(f.fd) } < 0 {
                        Poll::Ready(Err(errno_error(last_errno())))
                    } else {
                        Poll::Ready(Ok(Out::Unit))
                    }
                }
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
    /// after a short transfer ends with what it has). A file marked for
    /// deletion is unlinked in the background, unless another open of it
    /// on this worker takes the mark over (see the module docs).
    fn close(&mut self, h: Handle) {
        let Ok(f) = self.files.remove(h) else {
            return;
        };
        if f.delete_on_close {
            let other = self.files.iter_mut().find(|(_, o)| o.key == f.key);
            if let Some((_, other)) = other {
                other.delete_on_close = true;
            } else {
                match unix_parts(&f.path) {
                    Ok((parent, name)) => {
                        self.start_unlink(Box::new(PathOp {
                            act: PathAct::Unlink {
                                is_dir: f.is_dir,
                                fd: f.fd,
                                direct_fd: f.direct_fd,
                            },
                            key: f.key,
                            path: f.path,
                            parent,
                            name,
                            how: types::OpenHow::new(),
                            step: PathStep::OldParent,
                            old_pfd: -1,
                            new_pfd: -1,
                            refreshed: false,
                        }));
                        return;
                    }
                    Err(_) => self.pending.remove(f.key),
                }
            }
        }
        self.close_fd(f.fd);
        self.close_fd(f.direct_fd);
    }

    fn poll(&mut self, done: &mut dyn FnMut(Tag)) {
        if self.pinned > 0 {
            self.reclaim_unpinned();
        }
        self.start_deferred();
        if self.in_flight == 0 && self.closes == 0 && self.parked == 0 {
            return;
        }
        if !self.ring.submission().is_empty() {
            let _ = self.ring.submit();
        }
        self.reap(done);
        if self.parked > 0 && std::mem::take(&mut self.unlink_ended) {
            self.resume_parked(done);
        }
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
        self.in_flight + self.parked
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

    /// Names by `getdents64(2)`, attributes by STATX through the ring (see
    /// the module docs).
    fn list(&mut self, tag: Tag, h: Handle) -> Poll<Vec<DirEntry>> {
        if let Some(&slot) = self.tags.get(&tag) {
            let slot = slot as usize;
            let Some(result) = self.ops[slot].result else {
                return Poll::Pending;
            };
            let out = match (result, &mut self.ops[slot].kind) {
                (Ok(Out::Listed), Kind::List(op)) => Ok(std::mem::take(&mut op.entries)),
                (Ok(_), _) => Err(StoreError::Io(libc::EINVAL)),
                (Err(e), _) => Err(e),
            };
            self.tags.remove(&tag);
            self.release_slot(slot);
            return Poll::Ready(out);
        }
        match self.list_start(tag, h) {
            Ok(Some(entries)) => Poll::Ready(Ok(entries)),
            Ok(None) => Poll::Pending,
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    /// OPENAT2 of both parents, STATX checks, RENAMEAT (see the module
    /// docs). Case-sensitive, as the directory is.
    fn rename(&mut self, tag: Tag, h: Handle, new_path: &str, replace: bool) -> Poll<()> {
        let p = match self.repeated(tag, false) {
            Some(p) => p,
            None => match self.rename_start(tag, h, new_path, replace) {
                Ok(None) => Poll::Pending,
                Ok(Some(out)) => Poll::Ready(Ok(out)),
                Err(e) => Poll::Ready(Err(e)),
            },
        };
        narrow(p, |o| matches!(o, Out::Unit).then_some(()))
    }

    /// Marks or unmarks this worker's opens of the file; the file is
    /// delete pending for every worker while marked (see the module docs).
    /// A directory's emptiness is read with `getdents64(2)`.
    fn set_delete_on_close(&mut self, h: Handle, on: bool) -> Result<(), StoreError> {
        let f = self.files.get(h)?;
        if f.path.is_empty() {
            return Err(StoreError::Io(libc::EACCES));
        }
        let key = f.key;
        if on {
            if f.is_dir {
                let mut empty = true;
                for_each_dirent(f.fd, |_, _| {
                    empty = false;
                    false
                })
                .map_err(errno_error)?;
                if !empty {
                    return Err(StoreError::NotEmpty);
                }
            }
            let marked = self
                .files
                .iter()
                .any(|(_, o)| o.key == key && o.delete_on_close);
            self.files.get_mut(h)?.delete_on_close = true;
            if !marked {
                self.pending.add(key);
            }
        } else {
            let mut marked = false;
            for (_, o) in self.files.iter_mut() {
                if o.key == key && o.delete_on_close {
                    o.delete_on_close = false;
                    marked = true;
                }
            }
            if marked {
                self.pending.remove(key);
            }
        }
        Ok(())
    }

    /// `futimens(2)` at once; READONLY through a STATX then `fchmod(2)`
    /// (see the module docs).
    fn set_info(&mut self, tag: Tag, h: Handle, times: SetTimes, attrs: Option<u32>) -> Poll<()> {
        let p = match self.repeated(tag, false) {
            Some(p) => p,
            None => match self.set_info_start(tag, h, times, attrs) {
                Ok(None) => Poll::Pending,
                Ok(Some(out)) => Poll::Ready(Ok(out)),
                Err(e) => Poll::Ready(Err(e)),
            },
        };
        narrow(p, |o| matches!(o, Out::Unit).then_some(()))
    }

    /// `fstatvfs(2)` of the root (synchronous: no io_uring opcode).
    fn fs_info(&self) -> FsInfo {
        const SECTOR: u32 = 512;
        // SAFETY: zeroed `statvfs` is valid; the root descriptor is open.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: valid descriptor and out-pointer.
        let ok = unsafe { libc::fstatvfs(self.root.as_raw_fd(), &mut st) } == 0;
        let unit = if st.f_frsize > 0 {
            st.f_frsize as u64
        } else {
            st.f_bsize as u64
        };
        let block = u32::try_from(unit).unwrap_or(u32::MAX).max(SECTOR) / SECTOR * SECTOR;
        let fsid = st.f_fsid as u64;
        FsInfo {
            total_bytes: if ok {
                (st.f_blocks as u64).saturating_mul(unit)
            } else {
                0
            },
            free_bytes: if ok {
                (st.f_bavail as u64).saturating_mul(unit)
            } else {
                0
            },
            block_size: block,
            sector_size: SECTOR,
            serial: (fsid ^ (fsid >> 32)) as u32,
            label: self.label.clone(),
        }
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
        let sync = match self.files.get(h) {
            Err(e) => return Poll::Ready(Err(e)),
            Ok(f) if f.is_dir => return Poll::Ready(Err(StoreError::IsADirectory)),
            Ok(f) if data.is_some() && !f.writable => {
                return Poll::Ready(Err(StoreError::Io(libc::EACCES)))
            }
            Ok(f) => f.sync_rw,
        };
        if len == 0 {
            return Poll::Ready(Ok(Out::Count(0)));
        }
        if offset
            .checked_add(u64::from(len))
            .map_or(true, |end| end > i64::MAX as u64)
        {
            return Poll::Ready(Err(StoreError::Io(libc::EINVAL)));
        }
        // A WRITE given its bytes stays synchronous: on the ring it would
        // cost a second copy (into a staging run first).
        let others = self.pinned > 0 || self.in_flight > 0;
        if sync && (data.is_some() || !self.offload_now(len, others)) {
            return match data {
                Some(d) => self.write_now(h, offset, d),
                None => self.read_now(tag, h, offset, len),
            };
        }
        let slot = match self.alloc_staged_slot(tag, h, offset, len, data) {
            Ok((s, _)) => s,
            Err(e) => return Poll::Ready(Err(e)),
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

/// Repeats `op(done)` (a `pread(2)` or `pwrite(2)` of what follows the
/// first `done` bytes) until `len` bytes are done, it returns 0 (the end
/// of the file, or a write that wrote nothing) or fails with an errno other
/// than EINTR; returns the bytes done and that errno.
fn transfer(len: usize, mut op: impl FnMut(usize) -> isize) -> (usize, Option<i32>) {
    let mut done = 0;
    while done < len {
        let n = op(done);
        if n < 0 {
            match last_errno() {
                libc::EINTR => continue,
                e => return (done, Some(e)),
            }
        }
        if n == 0 {
            break;
        }
        done += n as usize;
    }
    (done, None)
}

/// READ and WRITE by plain system calls, for files on a memory file system
/// (see "Memory file systems" in the module docs).
impl DirStore {
    /// `pread(2)` into a staging run kept in a slot until `copy_out` (or
    /// `cancel`), as a finished io_uring READ is; EINTR is retried, a
    /// short read is continued until the end of the file, and an error
    /// after some bytes ends the read with them (as on the ring).
    fn read_now(&mut self, tag: Tag, h: Handle, offset: u64, len: u32) -> Poll<Out> {
        let (slot, stage) = match self.alloc_staged_slot(tag, h, offset, len, None) {
            Ok(s) => s,
            Err(e) => return Poll::Ready(Err(e)),
        };
        let buf = self.staging.ptr(stage);
        let (got, failed) = match self.files.get(h) {
            Ok(file) => {
                let fd = Self::io_fd(file, offset, len, buf);
                transfer(len as usize, |done| {
                    // SAFETY: the run holds at least `len` bytes and no I/O
                    // uses it; the offset fits an off_t (checked by the
                    // caller).
                    unsafe {
                        libc::pread(
                            fd,
                            buf.add(done).cast(),
                            len as usize - done,
                            (offset + done as u64) as libc::off_t,
                        )
                    }
                })
            }
            Err(_) => (0, None),
        };
        let got = got as u32;
        if let Kind::Read { got: g, .. } = &mut self.ops[slot].kind {
            *g = got;
        }
        let result = match failed {
            Some(e) if got == 0 => Err(errno_error(e)),
            _ => Ok(Out::Count(got)),
        };
        if result.is_ok() {
            self.ops[slot].result = Some(result);
        } else {
            self.tags.remove(&tag);
            self.release_slot(slot);
        }
        Poll::Ready(result)
    }

    /// `pwrite(2)` straight from the caller's bytes (no staging); EINTR is
    /// retried, a short write continued; errors are the ring's.
    fn write_now(&mut self, h: Handle, offset: u64, data: &[u8]) -> Poll<Out> {
        let fd = match self.files.get(h) {
            Ok(file) => Self::io_fd(file, offset, data.len() as u32, data.as_ptr()),
            Err(e) => return Poll::Ready(Err(e)),
        };
        let (put, failed) = transfer(data.len(), |done| {
            // SAFETY: `data[done..]` is readable caller memory; the offset
            // fits an off_t (checked by the caller).
            unsafe {
                libc::pwrite(
                    fd,
                    data.as_ptr().add(done).cast(),
                    data.len() - done,
                    (offset + done as u64) as libc::off_t,
                )
            }
        });
        if let Some(e) = failed {
            return Poll::Ready(Err(errno_error(e)));
        }
        if put < data.len() {
            // pwrite(2) wrote nothing: as a WRITE CQE of 0 on the ring.
            return Poll::Ready(Err(StoreError::Io(libc::EIO)));
        }
        Poll::Ready(Ok(Out::Count(put as u32)))
    }
}

/// Metadata operations: listings, renames, unlinks at close, SET_INFO.
impl DirStore {
    /// Reads the names of the directory `h` and starts their STATXes;
    /// `Some` when there is nothing to STATX.
    fn list_start(&mut self, tag: Tag, h: Handle) -> Result<Option<Vec<DirEntry>>, StoreError> {
        let file = self.files.get(h)?;
        if !file.is_dir {
            return Err(StoreError::NotADirectory);
        }
        // The STATXes outlive a close of `h`: they use their own
        // descriptor (a synchronous fcntl, no I/O).
        // SAFETY: an open descriptor of ours; the result is checked.
        let dirfd = unsafe { libc::fcntl(file.fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dirfd < 0 {
            return Err(errno_error(last_errno()));
        }
        let mut names = Vec::new();
        let read = for_each_dirent(dirfd, |name, d_type| {
            if let Some(c) = listable(name, d_type).and_then(|n| CString::new(n).ok()) {
                names.push(c);
            }
            true
        });
        if let Err(e) = read {
            self.close_fd(dirfd);
            return Err(errno_error(e));
        }
        if names.is_empty() {
            self.close_fd(dirfd);
            return Ok(Some(Vec::new()));
        }
        let n = names.len();
        let op = ListOp {
            dirfd,
            names,
            // SAFETY: `statx` is plain integers; all zeros is valid.
            bufs: vec![unsafe { std::mem::zeroed() }; n],
            res: vec![-libc::ENOENT; n],
            next: 0,
            outstanding: 0,
            entries: Vec::new(),
        };
        let slot = match self.alloc_slot(tag, Kind::List(Box::new(op))) {
            Ok(s) => s,
            Err(e) => {
                self.close_fd(dirfd);
                return Err(e);
            }
        };
        self.list_pump(slot);
        if !self.ops[slot].awaiting {
            self.tags.remove(&tag);
            self.release_slot(slot);
            return Err(StoreError::Busy);
        }
        Ok(None)
    }

    /// Submits STATXes of the listing in `slot` up to [`LIST_WINDOW`] in
    /// flight; the slot is in flight while any is.
    fn list_pump(&mut self, slot: usize) {
        loop {
            let Kind::List(op) = &mut self.ops[slot].kind else {
                return;
            };
            if op.outstanding >= LIST_WINDOW || op.next >= op.names.len() {
                break;
            }
            let i = op.next;
            let buf = std::ptr::addr_of_mut!(op.bufs[i]).cast::<types::statx>();
            let e = opcode::Statx::new(types::Fd(op.dirfd), op.names[i].as_ptr(), buf)
                .flags(libc::AT_SYMLINK_NOFOLLOW)
                .mask(STATX_MASK)
                .build()
                .user_data(slot as u64 | (i as u64 + 1) << SLOT_BITS);
            if self.push(e).is_err() {
                break;
            }
            if let Kind::List(op) = &mut self.ops[slot].kind {
                op.next += 1;
                op.outstanding += 1;
            }
        }
        let busy = matches!(&self.ops[slot].kind, Kind::List(op) if op.outstanding > 0);
        if busy && !self.ops[slot].awaiting {
            self.ops[slot].awaiting = true;
            self.in_flight += 1;
        }
    }

    /// The CQE of entry `i` of the listing in `slot`.
    fn list_cqe(&mut self, slot: usize, i: usize, res: i32, done: &mut dyn FnMut(Tag)) {
        let cancelled = self.ops[slot].cancelled;
        let Kind::List(op) = &mut self.ops[slot].kind else {
            return;
        };
        if i >= op.res.len() || op.outstanding == 0 {
            return;
        }
        op.res[i] = res;
        op.outstanding -= 1;
        if cancelled {
            op.next = op.names.len();
        } else {
            self.list_pump(slot);
        }
        let Kind::List(op) = &mut self.ops[slot].kind else {
            return;
        };
        if op.outstanding > 0 {
            return;
        }
        let complete = op.next >= op.names.len();
        self.ops[slot].awaiting = false;
        self.in_flight -= 1;
        if cancelled {
            self.release_slot(slot);
            return;
        }
        let result = if complete {
            self.list_finish(slot);
            Ok(Out::Listed)
        } else {
            // The ring refused every further STATX.
            Err(StoreError::Busy)
        };
        self.ops[slot].result = Some(result);
        done(self.ops[slot].tag);
    }

    /// Builds the sorted snapshot of a listing whose STATXes are done.
    fn list_finish(&mut self, slot: usize) {
        let Kind::List(op) = &mut self.ops[slot].kind else {
            return;
        };
        let mut entries = Vec::with_capacity(op.names.len());
        for ((name, st), &res) in op.names.iter().zip(&op.bufs).zip(&op.res) {
            let kind = u32::from(st.stx_mode) & libc::S_IFMT;
            if res < 0 || (kind != libc::S_IFREG && kind != libc::S_IFDIR) {
                // Gone since it was read, a symlink or a special file.
                continue;
            }
            let Ok(name) = name.to_str() else {
                continue;
            };
            let mut info = info_from_statx(st);
            info.delete_pending = self.pending.contains(key_of(st));
            entries.push(DirEntry {
                name: name.to_owned(),
                info,
            });
        }
        entries.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        op.entries = entries;
    }

    fn rename_start(
        &mut self,
        tag: Tag,
        h: Handle,
        new_path: &str,
        replace: bool,
    ) -> Result<Option<Out>, StoreError> {
        let f = self.files.get(h)?;
        if new_path.is_empty() || !valid_path(new_path) {
            return Err(StoreError::InvalidName);
        }
        if f.path.is_empty() {
            return Err(StoreError::Io(libc::EACCES));
        }
        let new_path = new_path.replace('\\', "/");
        if new_path == f.path {
            return Ok(Some(Out::Unit));
        }
        let (parent, name) = unix_parts(&f.path)?;
        let (new_parent, new_name) = unix_parts(&new_path)?;
        let op = PathOp {
            act: PathAct::Rename {
                h,
                new_path,
                new_parent,
                new_name,
                replace,
            },
            key: f.key,
            path: f.path.clone(),
            parent,
            name,
            how: types::OpenHow::new(),
            step: PathStep::OldParent,
            old_pfd: -1,
            new_pfd: -1,
            refreshed: false,
        };
        let slot = self.alloc_slot(tag, Kind::Path(Box::new(op)))?;
        match self.path_begin(slot) {
            None => Ok(None),
            Some(result) => {
                self.tags.remove(&tag);
                self.release_slot(slot);
                result.map(Some)
            }
        }
    }

    /// Starts the unlink of a closed delete-on-close file, without a tag
    /// (its result is dropped); waits for a slot if none is free.
    fn start_unlink(&mut self, op: Box<PathOp>) {
        let Some(slot) = self.free_ops.pop() else {
            self.deferred.push(*op);
            return;
        };
        let slot = slot as usize;
        let s = &mut self.ops[slot];
        s.tag = 0;
        s.kind = Kind::Path(op);
        s.awaiting = false;
        s.cancelled = true;
        s.result = None;
        if self.path_begin(slot).is_some() {
            self.release_slot(slot);
        }
    }

    /// Starts the unlinks that waited for a slot.
    fn start_deferred(&mut self) {
        while !self.free_ops.is_empty() {
            let Some(op) = self.deferred.pop() else {
                return;
            };
            self.start_unlink(Box::new(op));
        }
    }

    fn path_op(&mut self, slot: usize) -> &mut PathOp {
        match &mut self.ops[slot].kind {
            Kind::Path(op) => op,
            _ => unreachable!("slot {slot} holds no path operation"),
        }
    }

    /// Issues the first step of the path operation in `slot` and runs it
    /// as far as it goes; `Some` when finished.
    fn path_begin(&mut self, slot: usize) -> Option<Result<Out, StoreError>> {
        match self.path_submit(slot) {
            Ok(None) => None,
            Ok(Some(res)) => self.path_advance(slot, res),
            Err(e) => Some(Err(self.path_end(slot, e))),
        }
    }

    /// Runs the path operation in `slot` from the result `res` of its
    /// current step until a step is in flight or it is finished.
    fn path_advance(&mut self, slot: usize, res: i32) -> Option<Result<Out, StoreError>> {
        let mut res = res;
        loop {
            match self.path_transition(slot, res) {
                Ok(true) => {}
                Ok(false) => {
                    self.path_finish(slot);
                    return Some(Ok(self.path_end(slot, Out::Unit)));
                }
                Err(e) => return Some(Err(self.path_end(slot, e))),
            }
            match self.path_submit(slot) {
                Ok(None) => return None,
                Ok(Some(r)) => res = r,
                Err(e) => return Some(Err(self.path_end(slot, e))),
            }
        }
    }

    /// Closes the parent descriptors of a finished path operation; returns
    /// `v`.
    fn path_end<V>(&mut self, slot: usize, v: V) -> V {
        let op = self.path_op(slot);
        let fds = [op.old_pfd, op.new_pfd];
        (op.old_pfd, op.new_pfd) = (-1, -1);
        for fd in fds {
            self.close_fd(fd);
        }
        v
    }

    /// Issues the SQE of the current step of the path operation in `slot`.
    /// `Ok(Some(res))` when the step ran at once (a plain-syscall
    /// fallback).
    fn path_submit(&mut self, slot: usize) -> Result<Option<i32>, StoreError> {
        let root = self.root.as_raw_fd();
        let caps = self.caps;
        let statx_buf = std::ptr::addr_of_mut!(self.ops[slot].statx).cast::<types::statx>();
        let op = self.path_op(slot);
        let open_parent = |op: &mut PathOp, path: *const libc::c_char| {
            op.how = types::OpenHow::new()
                .flags((libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64)
                .resolve(RESOLVE);
            opcode::OpenAt2::new(types::Fd(root), path, &op.how).build()
        };
        let entry = match (op.step, &op.act) {
            (PathStep::OldParent, _) => {
                let path = op.parent.as_ptr();
                open_parent(op, path)
            }
            (PathStep::NewParent, PathAct::Rename { new_parent, .. }) => {
                let path = new_parent.as_ptr();
                open_parent(op, path)
            }
            (PathStep::Verify, _) => {
                opcode::Statx::new(types::Fd(op.old_pfd), op.name.as_ptr(), statx_buf)
                    .flags(libc::AT_SYMLINK_NOFOLLOW)
                    .mask(libc::STATX_TYPE | libc::STATX_INO)
                    .build()
            }
            (PathStep::Target, PathAct::Rename { new_name, .. }) => {
                opcode::Statx::new(types::Fd(op.new_pfd), new_name.as_ptr(), statx_buf)
                    .flags(libc::AT_SYMLINK_NOFOLLOW)
                    .mask(libc::STATX_TYPE | libc::STATX_INO)
                    .build()
            }
            (
                PathStep::Act,
                PathAct::Rename {
                    new_name, replace, ..
                },
            ) => {
                let flags = if *replace { 0 } else { libc::RENAME_NOREPLACE };
                if !caps.renameat {
                    // No IORING_OP_RENAMEAT (Linux < 5.11): the plain call.
                    // SAFETY: valid descriptors and NUL-terminated names.
                    let r = unsafe {
                        libc::renameat2(
                            op.old_pfd,
                            op.name.as_ptr(),
                            op.new_pfd,
                            new_name.as_ptr(),
                            flags,
                        )
                    };
                    return Ok(Some(if r < 0 { -last_errno() } else { 0 }));
                }
                opcode::RenameAt::new(
                    types::Fd(op.old_pfd),
                    op.name.as_ptr(),
                    types::Fd(op.new_pfd),
                    new_name.as_ptr(),
                )
                .flags(flags)
                .build()
            }
            (PathStep::Act, PathAct::Unlink { is_dir, .. }) => {
                let flags = if *is_dir { libc::AT_REMOVEDIR } else { 0 };
                if !caps.unlinkat {
                    // No IORING_OP_UNLINKAT (Linux < 5.11): the plain call.
                    // SAFETY: a valid descriptor and NUL-terminated name.
                    let r = unsafe { libc::unlinkat(op.old_pfd, op.name.as_ptr(), flags) };
                    return Ok(Some(if r < 0 { -last_errno() } else { 0 }));
                }
                opcode::UnlinkAt::new(types::Fd(op.old_pfd), op.name.as_ptr())
                    .flags(flags)
                    .build()
            }
            // Steps only a rename has.
            (PathStep::NewParent | PathStep::Target, PathAct::Unlink { .. }) => {
                return Err(StoreError::Io(libc::EINVAL))
            }
        };
        self.push_op(slot, entry)?;
        Ok(None)
    }

    /// Applies the result of the current step: `Ok(true)` when a next step
    /// must be issued, `Ok(false)` when the rename or unlink is done.
    fn path_transition(&mut self, slot: usize, res: i32) -> Result<bool, StoreError> {
        let err = -res;
        let (found, found_dir) = {
            let st = &self.ops[slot].statx;
            (
                key_of(st),
                u32::from(st.stx_mode) & libc::S_IFMT == libc::S_IFDIR,
            )
        };
        let op = self.path_op(slot);
        let renaming = matches!(op.act, PathAct::Rename { .. });
        match op.step {
            PathStep::OldParent if res >= 0 => {
                op.old_pfd = res;
                // After a refresh the new parent is open already.
                op.step = if renaming && op.new_pfd < 0 {
                    PathStep::NewParent
                } else {
                    PathStep::Verify
                };
            }
            PathStep::OldParent => match err {
                // The old name's directories moved or were replaced.
                libc::ENOENT | libc::ENOTDIR | libc::ELOOP | libc::EXDEV => {
                    return self.path_stale(slot)
                }
                e => return Err(errno_error(e)),
            },
            PathStep::NewParent if res >= 0 => {
                op.new_pfd = res;
                op.step = PathStep::Verify;
            }
            PathStep::NewParent => {
                return Err(match err {
                    libc::ENOENT | libc::ENOTDIR => StoreError::PathNotFound,
                    // ELOOP, EXDEV: a symlink or `..` escape (InvalidName).
                    e => errno_error(e),
                });
            }
            PathStep::Verify => {
                if res < 0 && err != libc::ENOENT {
                    return Err(errno_error(err));
                }
                if res < 0 || found != op.key {
                    return self.path_stale(slot);
                }
                let replace = matches!(op.act, PathAct::Rename { replace: true, .. });
                op.step = if replace {
                    PathStep::Target
                } else {
                    PathStep::Act
                };
            }
            PathStep::Target => {
                if res < 0 && err != libc::ENOENT {
                    return Err(errno_error(err));
                }
                if res >= 0 && found_dir && found != op.key {
                    // [MS-FSA] 2.1.5.14.11: a directory is never replaced.
                    return Err(StoreError::Io(libc::EACCES));
                }
                op.step = PathStep::Act;
            }
            PathStep::Act => {
                if res >= 0 {
                    return Ok(false);
                }
                return Err(match err {
                    libc::EEXIST => StoreError::Exists,
                    libc::ENOENT => StoreError::NotFound,
                    // A directory target (appeared since the STATX), or a
                    // directory replacing a file.
                    libc::ENOTEMPTY | libc::EISDIR | libc::ENOTDIR if renaming => {
                        StoreError::Io(libc::EACCES)
                    }
                    libc::ENOTEMPTY => StoreError::NotEmpty,
                    // Another mount beneath the root; a directory beneath
                    // itself.
                    libc::EXDEV | libc::EINVAL => StoreError::Io(err),
                    e => errno_error(e),
                });
            }
        }
        Ok(true)
    }

    /// The old name no longer leads to the file: read its path back from
    /// /proc once and start over from there, else `NotFound`.
    fn path_stale(&mut self, slot: usize) -> Result<bool, StoreError> {
        let fd = match self.path_op(slot).act {
            PathAct::Rename { h, .. } => self.files.get(h).map_or(-1, |f| f.fd),
            PathAct::Unlink { fd, .. } => fd,
        };
        let op = self.path_op(slot);
        if op.refreshed {
            return Err(StoreError::NotFound);
        }
        op.refreshed = true;
        let fresh = match self.current_path(fd) {
            Some(p) if !p.is_empty() && p != self.path_op(slot).path => p,
            _ => return Err(StoreError::NotFound),
        };
        let (parent, name) = unix_parts(&fresh)?;
        let op = self.path_op(slot);
        (op.path, op.parent, op.name) = (fresh, parent, name);
        op.step = PathStep::OldParent;
        let old = std::mem::replace(&mut op.old_pfd, -1);
        self.close_fd(old);
        Ok(true)
    }

    /// The share-relative path `fd` has now, from /proc/self/fd (see the
    /// module docs); None if it is unlinked, outside the root or not a
    /// valid share path.
    fn current_path(&self, fd: RawFd) -> Option<String> {
        if fd < 0 {
            return None;
        }
        let link = |fd: RawFd| std::fs::read_link(format!("/proc/self/fd/{fd}")).ok();
        let root = link(self.root.as_raw_fd())?;
        let file = link(fd)?;
        let rel = file.strip_prefix(&root).ok()?.to_str()?;
        let valid = !rel.contains('\\') && valid_path(&rel.replace('/', "\\"));
        (valid && !rel.ends_with(" (deleted)")).then(|| rel.to_owned())
    }

    /// A rename is done: this worker's opens at or beneath the old name
    /// follow it.
    fn path_finish(&mut self, slot: usize) {
        let op = self.path_op(slot);
        let PathAct::Rename { h, new_path, .. } = &op.act else {
            return;
        };
        let (h, key, old, new) = (*h, op.key, op.path.clone(), new_path.clone());
        for (oh, f) in self.files.iter_mut() {
            if oh == h || (f.path == old && f.key == key) {
                f.path.clone_from(&new);
            } else if let Some(rest) = f.path.strip_prefix(old.as_str()) {
                if rest.starts_with('/') {
                    f.path = format!("{new}{rest}");
                }
            }
        }
    }

    /// Sets the times at once; starts the STATX of a READONLY change.
    fn set_info_start(
        &mut self,
        tag: Tag,
        h: Handle,
        times: SetTimes,
        attrs: Option<u32>,
    ) -> Result<Option<Out>, StoreError> {
        let f = self.files.get(h)?;
        let spec = |t: Option<u64>| match SetTimes::effective(t) {
            Some(ft) => {
                let (secs, nanos) = unix_from_filetime(ft);
                libc::timespec {
                    tv_sec: secs as libc::time_t,
                    tv_nsec: nanos as libc::c_long,
                }
            }
            None => libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_OMIT,
            },
        };
        let ts = [spec(times.last_access), spec(times.last_write)];
        if ts.iter().any(|t| t.tv_nsec != libc::UTIME_OMIT) {
            // No io_uring opcode sets times: futimens(2) (module docs).
            // SAFETY: an open descriptor of ours and two timespecs.
            if unsafe { libc::futimens(f.fd, ts.as_ptr()) } < 0 {
                return Err(errno_error(last_errno()));
            }
        }
        // [MS-FSA] 2.1.5.14.2: FileAttributes 0 leaves them unchanged;
        // READONLY alone is kept, on files only.
        let Some(a) = attrs.filter(|&a| a != 0 && !f.is_dir) else {
            return Ok(Some(Out::Unit));
        };
        let fd = f.fd;
        let read_only = a & attributes::READONLY != 0;
        let slot = self.alloc_slot(tag, Kind::Chmod { h, read_only })?;
        let buf = std::ptr::addr_of_mut!(self.ops[slot].statx).cast::<types::statx>();
        let e = opcode::Statx::new(types::Fd(fd), c"".as_ptr(), buf)
            .flags(libc::AT_EMPTY_PATH)
            .mask(libc::STATX_MODE)
            .build();
        match self.push_op(slot, e) {
            Ok(()) => Ok(None),
            Err(e) => {
                self.tags.remove(&tag);
                self.release_slot(slot);
                Err(e)
            }
        }
    }

    /// READONLY as the write bits of `mode` (module docs).
    fn chmod_finish(&self, h: Handle, read_only: bool, mode: u32) -> Result<Out, StoreError> {
        let f = self.files.get(h)?;
        let mode = mode & 0o7777;
        let new = if read_only {
            mode & !0o222
        } else {
            mode | 0o200
        };
        if new != mode {
            // No io_uring opcode changes a mode: fchmod(2) (module docs).
            // SAFETY: an open descriptor of ours.
            if unsafe { libc::fchmod(f.fd, new) } < 0 {
                return Err(errno_error(last_errno()));
            }
        }
        Ok(Out::Unit)
    }
}

impl Drop for DirStore {
    /// Closes every open file (unlinking those marked for deletion), waits
    /// (bounded) for operations the kernel still runs. If the kernel has not finished by then, the staging slab
    /// and the slot table are leaked rather than unmapped under it.
    fn drop(&mut self) {
        // Closing deletes what is marked for deletion, as a CLOSE would.
        let open: Vec<Handle> = self.files.iter().map(|(h, _)| h).collect();
        for h in open {
            self.close(h);
        }
        let deadline = Instant::now() + DROP_WAIT;
        self.reclaim_unpinned();
        let busy = |s: &Self| s.in_flight > 0 || s.closes > 0 || !s.deferred.is_empty();
        while busy(self) && Instant::now() < deadline {
            let _ = self.ring.submit();
            self.reap(&mut |_| {});
            self.start_deferred();
            if busy(self) {
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
        if self.in_flight > 0 || self.pinned > 0 {
            eprintln!(
                "[smbdirectd] WARN directory store: {} operations still running and {} RDMA \
                 transfers still holding their staging runs at teardown; leaking their buffers",
                self.in_flight, self.pinned
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

    /// Which READ/WRITE path a test's store uses.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Backing {
        /// A directory of the system temp dir, `RwPath::Uring`: every READ
        /// and WRITE through io_uring whatever the file system.
        Uring,
        /// A directory on /dev/shm (tmpfs), `RwPath::Auto`: READ and WRITE
        /// synchronous.
        Memory,
    }

    /// Where memory-backed test directories go.
    const SHM: &str = "/dev/shm";

    /// Whether /dev/shm is a memory file system here (else the Memory
    /// variants say they are skipped and pass).
    /// io_uring, and the synchronous path where /dev/shm is a memory file
    /// system (said when it is not).
    fn both_paths() -> impl Iterator<Item = Backing> {
        [Backing::Uring, Backing::Memory]
            .into_iter()
            .filter(|&b| b == Backing::Uring || shm_is_memory())
    }

    fn shm_is_memory() -> bool {
        let c = CString::new(SHM).unwrap();
        // SAFETY: zeroed statfs is valid; a valid path and out-pointer.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        let ok = unsafe { libc::statfs(c.as_ptr(), &mut st) } == 0;
        let memory = ok && memory_fs_name(st.f_type as i64).is_some();
        if !memory {
            eprintln!(
                "skipped: {SHM} is not a tmpfs or ramfs here: the synchronous path is not tested"
            );
        }
        memory
    }

    /// A test directory, removed on drop.
    struct TempDir(PathBuf, Backing);

    impl TempDir {
        fn new(b: Backing, name: &str) -> Self {
            static N: AtomicU32 = AtomicU32::new(0);
            let base = match b {
                Backing::Uring => std::env::temp_dir(),
                Backing::Memory => PathBuf::from(SHM),
            };
            let p = base.join(format!(
                "smbdirectd-dirstore-{}-{}-{name}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&p).unwrap();
            TempDir(p, b)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn factory(dir: &TempDir, direct: bool) -> DirStoreFactory {
        let f = DirStoreFactory::with_staging(&dir.0, direct, 4 << 20).unwrap();
        match dir.1 {
            Backing::Uring => f.with_rw_path(RwPath::Uring),
            Backing::Memory => {
                assert!(
                    f.sync_rw().is_some(),
                    "{}: {}",
                    dir.0.display(),
                    f.rw_description()
                );
                f
            }
        }
    }

    fn store(dir: &TempDir, direct: bool) -> DirStore {
        factory(dir, direct).store().unwrap()
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

    fn every_disposition_on_missing_and_existing_files(b: Backing) {
        use Disposition::*;
        let dir = TempDir::new(b, "dispositions");
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

    fn write_then_read_back(b: Backing) {
        let dir = TempDir::new(b, "rw");
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

    fn direct_io_round_trip_when_the_file_system_allows_it(b: Backing) {
        let dir = TempDir::new(b, "direct");
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

    fn paths_leaving_the_root_are_refused(b: Backing) {
        let dir = TempDir::new(b, "confine");
        let outside = TempDir::new(b, "outside");
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

    fn directories_and_missing_parents(b: Backing) {
        use Disposition::*;
        let dir = TempDir::new(b, "dirs");
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

    fn truncate_through_the_ring_and_through_the_fallback(b: Backing) {
        let dir = TempDir::new(b, "truncate");
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
        let dir = TempDir::new(Backing::Uring, "pending");
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
        let dir = TempDir::new(Backing::Uring, "cancel");
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

    fn stale_handles_and_exhausted_staging(b: Backing) {
        let dir = TempDir::new(b, "stale");
        let mut s = store(&dir, false);
        let (h, _) = open(&mut s, "x", Disposition::Create).unwrap();
        // Larger than the slab, then two reads that fill it.
        assert_eq!(s.read(1, h, 0, 5 << 20), Poll::Ready(Err(StoreError::Busy)));
        // Running on the ring; done at once (the run held until copy_out)
        // on the synchronous path.
        let first = s.read(1, h, 0, 3 << 20);
        match b {
            Backing::Uring => assert_eq!(first, Poll::Pending),
            Backing::Memory => assert_eq!(first, Poll::Ready(Ok(0))),
        }
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
        // Something on the file system (an empty tmpfs uses no blocks).
        let (y, _) = open(&mut s, "y", Disposition::Create).unwrap();
        assert_eq!(write(&mut s, y, 0, &[1; 4096]), Ok(4096));
        s.close(y);
        assert_idle(&s);
        assert!(s.usage().0 > 0 && s.usage().1.is_none());
    }

    /// Polls until nothing is in flight (background unlinks and closes).
    fn settle(s: &mut DirStore) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while s.in_flight() > 0 || s.closes > 0 || !s.deferred.is_empty() {
            s.poll(&mut |_| {});
            assert!(Instant::now() < deadline, "background work never finished");
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    fn rename(s: &mut DirStore, h: Handle, to: &str, replace: bool) -> Result<(), StoreError> {
        drive(s, 7, |s| s.rename(7, h, to, replace))
    }

    fn list(s: &mut DirStore, h: Handle) -> Result<Vec<DirEntry>, StoreError> {
        drive(s, 8, |s| s.list(8, h))
    }

    fn root(s: &mut DirStore) -> Handle {
        mkdir(s, "", Disposition::Open).unwrap().0
    }

    fn rename_refuses_an_existing_target_unless_replacing(b: Backing) {
        let dir = TempDir::new(b, "rename");
        let mut s = store(&dir, false);
        for ring in [true, false] {
            // Through IORING_OP_RENAMEAT, then through renameat2(2).
            s.caps.renameat = ring && s.caps.renameat;
            let (a, _) = open(&mut s, "a", Disposition::OverwriteIf).unwrap();
            write(&mut s, a, 0, b"from a").unwrap();
            let (b, _) = open(&mut s, "b", Disposition::OverwriteIf).unwrap();
            write(&mut s, b, 0, b"from b").unwrap();
            s.close(b);
            let ino = drive(&mut s, 4, |s| s.stat(4, a)).unwrap().file_id;
            assert_eq!(rename(&mut s, a, "b", false), Err(StoreError::Exists));
            assert_eq!(rename(&mut s, a, "b", true), Ok(()));
            assert_eq!(std::fs::read(dir.0.join("b")).unwrap(), b"from a");
            assert!(!dir.0.join("a").exists());
            // The handle names the file under its new name.
            assert_eq!(s.files.get(a).unwrap().path, "b");
            assert_eq!(drive(&mut s, 4, |s| s.stat(4, a)).unwrap().file_id, ino);
            write(&mut s, a, 6, b"!").unwrap();
            assert_eq!(std::fs::read(dir.0.join("b")).unwrap(), b"from a!");
            // Onto its own name: nothing to do.
            assert_eq!(rename(&mut s, a, "b", false), Ok(()));
            s.close(a);
        }
        let r = root(&mut s);
        assert_eq!(
            rename(&mut s, r, "x", false),
            Err(StoreError::Io(libc::EACCES))
        );
        s.close(r);
        assert_idle(&s);
    }

    fn rename_across_directories_carries_open_paths_along(b: Backing) {
        let dir = TempDir::new(b, "rename-dirs");
        let mut s = store(&dir, false);
        let (d1, _) = mkdir(&mut s, "d1", Disposition::Create).unwrap();
        let (d2, _) = mkdir(&mut s, "d2", Disposition::Create).unwrap();
        let (f, _) = open(&mut s, "d1\\f", Disposition::Create).unwrap();
        write(&mut s, f, 0, b"x").unwrap();
        assert_eq!(
            rename(&mut s, f, "missing\\f", false),
            Err(StoreError::PathNotFound)
        );
        assert_eq!(rename(&mut s, f, "d2\\g", false), Ok(()));
        assert!(dir.0.join("d2/g").is_file() && !dir.0.join("d1/f").exists());
        // Moving a directory moves the paths of the opens beneath it.
        assert_eq!(rename(&mut s, d2, "d1\\sub", false), Ok(()));
        assert_eq!(s.files.get(f).unwrap().path, "d1/sub/g");
        assert_eq!(
            rename(&mut s, d1, "d1\\sub\\x", false),
            Err(StoreError::Io(libc::EINVAL)),
            "not beneath itself"
        );
        // A directory target is never replaced, empty or not.
        let (e, _) = mkdir(&mut s, "e", Disposition::Create).unwrap();
        assert_eq!(
            rename(&mut s, f, "e", true),
            Err(StoreError::Io(libc::EACCES))
        );
        assert_eq!(
            rename(&mut s, e, "d1", true),
            Err(StoreError::Io(libc::EACCES))
        );
        assert_eq!(rename(&mut s, f, "d1", false), Err(StoreError::Exists));
        // The tracked path is right: delete on close finds the file.
        s.set_delete_on_close(f, true).unwrap();
        s.close(f);
        settle(&mut s);
        assert!(!dir.0.join("d1/sub/g").exists());
        for h in [d1, d2, e] {
            s.close(h);
        }
        settle(&mut s);
        assert_idle(&s);
    }

    fn rename_targets_stay_beneath_the_root(b: Backing) {
        let dir = TempDir::new(b, "rename-confine");
        let outside = TempDir::new(b, "rename-outside");
        std::fs::write(outside.0.join("secret"), b"keep").unwrap();
        std::os::unix::fs::symlink(&outside.0, dir.0.join("out")).unwrap();
        std::os::unix::fs::symlink(outside.0.join("secret"), dir.0.join("s")).unwrap();
        let mut s = store(&dir, false);
        let (f, _) = open(&mut s, "f", Disposition::Create).unwrap();
        write(&mut s, f, 0, b"mine").unwrap();
        let invalid = Err(StoreError::InvalidName);
        assert_eq!(rename(&mut s, f, "out\\f", true), invalid);
        assert_eq!(rename(&mut s, f, "..\\f", true), invalid);
        assert_eq!(rename(&mut s, f, "a\\..\\..\\f", true), invalid);
        assert_eq!(rename(&mut s, f, "/tmp/f", true), invalid);
        assert_eq!(rename(&mut s, f, "", true), invalid);
        // A symlink target is replaced, never followed.
        assert_eq!(rename(&mut s, f, "s", false), Err(StoreError::Exists));
        assert_eq!(rename(&mut s, f, "s", true), Ok(()));
        let meta = std::fs::symlink_metadata(dir.0.join("s")).unwrap();
        assert!(meta.is_file());
        assert_eq!(std::fs::read(dir.0.join("s")).unwrap(), b"mine");
        assert_eq!(std::fs::read(outside.0.join("secret")).unwrap(), b"keep");
        assert_eq!(std::fs::read_dir(&outside.0).unwrap().count(), 1);
        s.close(f);
        assert_idle(&s);
    }

    fn a_stale_path_is_read_back_from_proc(b: Backing) {
        let dir = TempDir::new(b, "stale-path");
        let f1 = DirStoreFactory::with_staging(&dir.0, false, 4 << 20).unwrap();
        let mut s = f1.store().unwrap();
        let mut other = f1.store().unwrap();
        let (h, _) = open(&mut s, "a", Disposition::Create).unwrap();
        let (h2, _) = open(&mut other, "a", Disposition::Open).unwrap();
        // Renamed through another worker, then outside the server.
        assert_eq!(rename(&mut other, h2, "b", false), Ok(()));
        assert_eq!(rename(&mut s, h, "c", false), Ok(()));
        assert!(dir.0.join("c").is_file());
        std::fs::rename(dir.0.join("c"), dir.0.join("d")).unwrap();
        s.set_delete_on_close(h, true).unwrap();
        // Delete pending for every worker of the factory.
        assert_eq!(
            open(&mut other, "d", Disposition::Open),
            Err(StoreError::DeletePending)
        );
        s.close(h);
        settle(&mut s);
        assert_eq!(
            std::fs::read_dir(&dir.0).unwrap().count(),
            0,
            "d was unlinked"
        );
        other.close(h2);
        settle(&mut other);
        assert_idle(&s);
    }

    fn listing_a_thousand_files_is_sorted_and_skips_what_cannot_be_named(b: Backing) {
        let dir = TempDir::new(b, "list");
        let many = dir.0.join("many");
        std::fs::create_dir(&many).unwrap();
        for i in 0..1000u32 {
            std::fs::write(many.join(format!("f{:04}", (i * 7919) % 1000)), b"").unwrap();
        }
        std::fs::create_dir(many.join("Sub")).unwrap();
        std::fs::write(many.join("big"), vec![1; 5000]).unwrap();
        std::os::unix::fs::symlink("big", many.join("link")).unwrap();
        std::fs::write(many.join("back\\slash"), b"").unwrap();
        std::fs::write(many.join("co:lon"), b"").unwrap();
        let mut s = store(&dir, false);
        let (d, _) = mkdir(&mut s, "many", Disposition::Open).unwrap();
        let entries = list(&mut s, d).unwrap();
        assert_eq!(
            entries.len(),
            1002,
            "files, Sub and big; no link, no odd names"
        );
        assert!(entries.windows(2).all(|w| w[0].name < w[1].name), "sorted");
        assert_eq!(entries[0].name, "Sub");
        assert!(entries[0].info.is_dir);
        assert_eq!(entries[0].info.attributes, attributes::DIRECTORY);
        assert_eq!(entries[1].name, "big");
        assert_eq!(entries[1].info.size, 5000);
        assert_eq!(entries[1].info.attributes, attributes::NORMAL);
        assert_eq!(
            (entries[2].name.as_str(), entries[1001].name.as_str()),
            ("f0000", "f0999")
        );
        use std::os::unix::fs::MetadataExt;
        let ino = std::fs::metadata(many.join("big")).unwrap().ino();
        assert_eq!((entries[1].info.file_id, entries[1].info.nlink), (ino, 1));
        // Twice on the same handle: the same snapshot.
        assert_eq!(list(&mut s, d).unwrap(), entries);
        let (f, _) = open(&mut s, "many\\big", Disposition::Open).unwrap();
        assert_eq!(list(&mut s, f), Err(StoreError::NotADirectory));
        let (e, _) = mkdir(&mut s, "empty", Disposition::Create).unwrap();
        assert_eq!(list(&mut s, e), Ok(Vec::new()));
        // A listing cancelled in flight leaks nothing.
        assert_eq!(s.list(20, d), Poll::Pending);
        s.cancel(20);
        settle(&mut s);
        for h in [d, f, e] {
            s.close(h);
        }
        settle(&mut s);
        assert_idle(&s);
    }

    fn delete_on_close_waits_for_the_last_handle(b: Backing) {
        let dir = TempDir::new(b, "doc");
        let mut s = store(&dir, false);
        for ring in [true, false] {
            // Through IORING_OP_UNLINKAT, then through unlinkat(2).
            s.caps.unlinkat = ring && s.caps.unlinkat;
            let (h1, _) = open(&mut s, "doomed", Disposition::Create).unwrap();
            let (h2, _) = open(&mut s, "doomed", Disposition::Open).unwrap();
            write(&mut s, h1, 0, b"bye").unwrap();
            assert_eq!(s.set_delete_on_close(h1, true), Ok(()));
            assert_eq!(
                open(&mut s, "doomed", Disposition::OpenIf),
                Err(StoreError::DeletePending)
            );
            assert!(drive(&mut s, 4, |s| s.stat(4, h2)).unwrap().delete_pending);
            let r = root(&mut s);
            let listed = list(&mut s, r).unwrap();
            assert!(listed.len() == 1 && listed[0].info.delete_pending);
            s.close(h1);
            settle(&mut s);
            assert!(dir.0.join("doomed").exists(), "h2 is still open");
            assert_eq!(
                open(&mut s, "doomed", Disposition::Open),
                Err(StoreError::DeletePending)
            );
            assert_eq!(read(&mut s, h2, 0, 10).unwrap(), b"bye");
            s.close(h2);
            settle(&mut s);
            assert!(!dir.0.join("doomed").exists(), "gone at the last close");
            let (h3, a) = open(&mut s, "doomed", Disposition::OpenIf).unwrap();
            assert_eq!(a, Action::Created);
            // Unmarked before the close: kept.
            s.set_delete_on_close(h3, true).unwrap();
            s.set_delete_on_close(h3, false).unwrap();
            s.close(h3);
            settle(&mut s);
            assert!(dir.0.join("doomed").exists());
            std::fs::remove_file(dir.0.join("doomed")).unwrap();
            assert_eq!(
                s.set_delete_on_close(r, true),
                Err(StoreError::Io(libc::EACCES))
            );
            s.close(r);
        }
        assert!(s.pending.lock().is_empty());
        settle(&mut s);
        assert_idle(&s);
    }

    fn delete_on_close_of_empty_and_non_empty_directories(b: Backing) {
        let dir = TempDir::new(b, "doc-dirs");
        let mut s = store(&dir, false);
        let (full, _) = mkdir(&mut s, "full", Disposition::Create).unwrap();
        let (f, _) = open(&mut s, "full\\f", Disposition::Create).unwrap();
        assert_eq!(s.set_delete_on_close(full, true), Err(StoreError::NotEmpty));
        s.set_delete_on_close(f, true).unwrap();
        s.close(f);
        settle(&mut s);
        assert_eq!(s.set_delete_on_close(full, true), Ok(()));
        assert_eq!(
            mkdir(&mut s, "full", Disposition::Open),
            Err(StoreError::DeletePending)
        );
        s.close(full);
        let (empty, _) = mkdir(&mut s, "empty", Disposition::Create).unwrap();
        s.set_delete_on_close(empty, true).unwrap();
        s.close(empty);
        settle(&mut s);
        assert_eq!(std::fs::read_dir(&dir.0).unwrap().count(), 0);
        // Dropping a store closes its opens, deleting what is marked.
        let (g, _) = open(&mut s, "g", Disposition::Create).unwrap();
        s.set_delete_on_close(g, true).unwrap();
        drop(s);
        assert!(!dir.0.join("g").exists());
    }

    fn set_info_times_and_readonly_show_in_stat(b: Backing) {
        let dir = TempDir::new(b, "set-info");
        let mut s = store(&dir, false);
        let (h, _) = open(&mut s, "t", Disposition::Create).unwrap();
        let before = drive(&mut s, 4, |s| s.stat(4, h)).unwrap();
        assert_eq!(before.attributes, attributes::NORMAL);
        // 2001-01-01 and a second later, with 100 ns resolution.
        let (atime, mtime) = (126_227_808_000_000_000, 126_227_808_010_000_001);
        let times = SetTimes {
            creation: Some(5),
            last_access: Some(atime),
            last_write: Some(mtime),
            change: Some(7),
        };
        assert_eq!(drive(&mut s, 9, |s| s.set_info(9, h, times, None)), Ok(()));
        let after = drive(&mut s, 4, |s| s.stat(4, h)).unwrap();
        assert_eq!(
            (after.last_access_time, after.last_write_time),
            (atime, mtime)
        );
        assert_eq!(after.creation_time, before.creation_time, "cannot be set");
        let keep = SetTimes {
            last_access: Some(0),
            last_write: Some(u64::MAX),
            ..SetTimes::default()
        };
        assert_eq!(
            drive(&mut s, 9, |s| s.set_info(9, h, keep, Some(0))),
            Ok(())
        );
        let same = drive(&mut s, 4, |s| s.stat(4, h)).unwrap();
        assert_eq!(
            (same.last_access_time, same.last_write_time),
            (atime, mtime)
        );
        // READONLY is the mode's write bits.
        let ro = attributes::READONLY | attributes::HIDDEN;
        let none = SetTimes::default();
        assert_eq!(
            drive(&mut s, 9, |s| s.set_info(9, h, none, Some(ro))),
            Ok(())
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.0.join("t"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o222, 0);
        let info = drive(&mut s, 4, |s| s.stat(4, h)).unwrap();
        assert_eq!(info.attributes, attributes::READONLY, "HIDDEN is not kept");
        let normal = Some(attributes::NORMAL);
        assert_eq!(drive(&mut s, 9, |s| s.set_info(9, h, none, normal)), Ok(()));
        let mode = std::fs::metadata(dir.0.join("t"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o200, 0o200);
        assert_eq!(
            drive(&mut s, 4, |s| s.stat(4, h)).unwrap().attributes,
            attributes::NORMAL
        );
        s.close(h);
        assert_eq!(
            s.set_info(9, h, times, None),
            Poll::Ready(Err(StoreError::Closed))
        );
        assert_idle(&s);
    }

    fn fs_info_describes_the_root_file_system(b: Backing) {
        let dir = TempDir::new(b, "fs-info");
        let s = store(&dir, false);
        let fs = s.fs_info();
        assert!(
            fs.total_bytes > 0 && fs.free_bytes <= fs.total_bytes,
            "{fs:?}"
        );
        assert_eq!(fs.sector_size, 512);
        assert!(fs.block_size >= 512 && fs.block_size % 512 == 0, "{fs:?}");
        assert!(fs.label.starts_with("smbdirectd-dirstore-"), "{fs:?}");
        assert!(fs.label.encode_utf16().count() <= 32);
        assert_eq!(volume_label(Path::new("/")), "share");
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
        let dir = TempDir::new(Backing::Uring, "factory");
        assert!(DirStoreFactory::new(&dir.0.join("missing"), false).is_err());
        std::fs::write(dir.0.join("file"), b"").unwrap();
        let e = DirStoreFactory::new(&dir.0.join("file"), false).unwrap_err();
        assert!(e.contains("not a directory"), "{e}");
        let f = DirStoreFactory::new(&dir.0, true).unwrap();
        assert!(f.describe().ends_with("(O_DIRECT)"));
        let s = f.handle(0);
        assert_eq!(s.in_flight(), 0);
    }

    #[test]
    fn memory_file_systems_are_read_and_written_synchronously_unless_told_otherwise() {
        let disk = TempDir::new(Backing::Uring, "path-disk");
        let f = DirStoreFactory::new(&disk.0, false).unwrap();
        match f.memory_fs {
            None => {
                assert_eq!(f.sync_rw(), None);
                assert!(
                    f.rw_description().contains("io_uring"),
                    "{}",
                    f.rw_description()
                );
                assert!(!f.describe().contains("synchronous"), "{}", f.describe());
            }
            Some(fs) => eprintln!("note: the temp dir is on {fs}: its Auto case is the memory one"),
        }
        if !shm_is_memory() {
            return;
        }
        let shm = TempDir::new(Backing::Memory, "path-shm");
        let f = DirStoreFactory::new(&shm.0, false).unwrap();
        assert!(matches!(f.sync_rw(), Some("tmpfs" | "ramfs")), "{f:?}");
        assert!(
            f.describe().ends_with(", synchronous READ/WRITE)"),
            "{}",
            f.describe()
        );
        assert!(f.rw_description().contains("synchronous"));
        let s = f.store().unwrap();
        assert_eq!(s.sync_dev, Some(f.root_dev));
        // The override keeps io_uring.
        let f = f.with_rw_path(RwPath::Uring);
        assert_eq!(f.sync_rw(), None);
        assert!(f.rw_description().contains("--store-io uring"));
        assert_eq!(f.store().unwrap().sync_dev, None);
        assert_eq!(memory_fs_name(0x0102_1994), Some("tmpfs"));
        assert_eq!(memory_fs_name(0x8584_58f6), Some("ramfs"));
        assert_eq!(memory_fs_name(0xEF53), None); // ext2/3/4
    }

    #[test]
    fn zero_copy_reads_keep_their_staging_run_until_unpinned() {
        for b in both_paths() {
            let dir = TempDir::new(b, "zero-copy");
            let mut s = store(&dir, false);
            let zc = s.zero_copy().expect("the staging slab is offered");
            assert_eq!(zc.regions.len(), 1);
            let (base, len) = zc.regions[0];
            assert_eq!(len, s.staging.len());
            let (h, _) = open(&mut s, "f", Disposition::Create).unwrap();
            let data: Vec<u8> = (0..150_000u32).map(|i| (i % 249) as u8).collect();
            write(&mut s, h, 0, &data).unwrap();
            let n = drive(&mut s, 10, |s| s.read(10, h, 5, 100_000)).unwrap();
            assert_eq!(n, 100_000, "{b:?}");
            let mut out = [Piece {
                sge: Sge {
                    addr: 0,
                    len: 0,
                    lkey: 0,
                },
                pin: 0,
            }; 2];
            // Another handle, offset or a longer transfer than was read:
            // nothing pinned, the tag kept.
            assert_eq!(s.pin_read(10, Handle(h.0 + 1), 5, n, &[7], &mut out), None);
            assert_eq!(s.pin_read(10, h, 6, n, &[7], &mut out), None);
            assert_eq!(s.pin_read(10, h, 5, n + 1, &[7], &mut out), None);
            assert_eq!(s.pin_read(11, h, 5, n, &[7], &mut out), None);
            assert!(s.tags.contains_key(&10));
            // One piece: the run the data was read into, inside the region.
            assert_eq!(s.pin_read(10, h, 5, n, &[7], &mut out), Some(1));
            let p = out[0];
            assert_eq!((p.sge.len, p.sge.lkey), (n, 7));
            let at = p.sge.addr as usize;
            assert!(at >= base && at + n as usize <= base + len);
            // SAFETY: the pinned run holds n bytes the read wrote.
            let bytes = unsafe { std::slice::from_raw_parts(at as *const u8, n as usize) };
            assert_eq!(bytes, &data[5..100_005]);
            // The tag is forgotten; the slot and run stay taken while
            // pinned, polls or not.
            assert!(!s.tags.contains_key(&10));
            assert_eq!(s.pin_read(10, h, 5, n, &[7], &mut out), None);
            s.poll(&mut |_| {});
            assert_eq!(s.free_ops.len(), MAX_OPS - 1);
            // Other I/O meanwhile lands elsewhere.
            assert_eq!(read(&mut s, h, 0, 10).unwrap(), &data[..10]);
            assert_eq!(bytes, &data[5..100_005]);
            // Closing the file does not free it either.
            s.close(h);
            s.poll(&mut |_| {});
            assert_eq!(s.free_ops.len(), MAX_OPS - 1);
            // The pin comes back: freed at the next poll.
            zc.pins.unpin(&p);
            s.poll(&mut |_| {});
            assert_idle(&s);
            assert_eq!(s.pinned, 0);
            // Or at the next READ, with no poll between (the SMB2 layer
            // polls only while something is in flight): more round trips
            // than there are slots never run out of them.
            let (h, _) = open(&mut s, "f", Disposition::Open).unwrap();
            for i in 0..(MAX_OPS as u64 + 100) {
                let tag = 100 + i;
                let n = drive(&mut s, tag, |s| s.read(tag, h, i, 4096)).unwrap();
                assert_eq!(n, 4096, "{b:?} read {i}");
                assert_eq!(
                    s.pin_read(tag, h, i, n, &[7], &mut out),
                    Some(1),
                    "{b:?} read {i}"
                );
                zc.pins.unpin(&out[0]);
            }
            assert!(s.pinned <= 1, "{}", s.pinned);
            s.poll(&mut |_| {});
            s.close(h);
            assert_idle(&s);
        }
    }

    #[test]
    fn zero_copy_writes_go_out_from_their_staging_run_which_stays_pinned_until_unpinned() {
        for b in both_paths() {
            let dir = TempDir::new(b, "zero-copy-write");
            let mut s = store(&dir, false);
            let zc = s.zero_copy().expect("the staging slab is offered");
            let (base, len) = zc.regions[0];
            let (h, _) = open(&mut s, "f", Disposition::Create).unwrap();
            let mut out = [Piece {
                sge: Sge {
                    addr: 0,
                    len: 0,
                    lkey: 0,
                },
                pin: 0,
            }; 2];
            // Refused (nothing taken, `write` answers): another handle,
            // nothing to write, an offset beyond an off_t.
            assert_eq!(s.pin_write(1, Handle(h.0 + 1), 0, 10, &[7], &mut out), None);
            assert_eq!(s.pin_write(1, h, 0, 0, &[7], &mut out), None);
            assert_eq!(s.pin_write(1, h, i64::MAX as u64, 10, &[7], &mut out), None);
            assert_idle(&s);
            // One piece inside the slab; what the RDMA Read does: fill it.
            let data: Vec<u8> = (0..200_000u32).map(|i| (i % 241) as u8).collect();
            assert_eq!(s.pin_write(20, h, 3, 200_000, &[7], &mut out), Some(1));
            let p = out[0];
            assert_eq!((p.sge.len, p.sge.lkey), (200_000, 7));
            let at = p.sge.addr as usize;
            assert!(at >= base && at + 200_000 <= base + len);
            // SAFETY: the pinned run of 200,000 bytes, ours to fill.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), at as *mut u8, data.len()) };
            // A mismatched completion is refused and changes nothing.
            assert_eq!(
                s.write_pinned(20, h, 4, 200_000),
                Poll::Ready(Err(StoreError::Io(libc::EINVAL)))
            );
            // Written out at once on a memory file system, else through
            // io_uring and collected as a WRITE is.
            let n = match s.write_pinned(20, h, 3, 200_000) {
                Poll::Ready(r) => {
                    assert_eq!(b, Backing::Memory);
                    r
                }
                Poll::Pending => {
                    assert_eq!(b, Backing::Uring);
                    drive(&mut s, 20, |s| s.write(20, h, 3, &[]))
                }
            };
            assert_eq!(n, Ok(200_000), "{b:?}");
            let file = std::fs::read(dir.0.join("f")).unwrap();
            assert_eq!(file.len(), 200_003);
            assert_eq!(&file[3..], &data[..], "{b:?}");
            // Written and collected, but the pin is out: the run and slot
            // stay taken, polls or not; the tag is gone.
            assert!(!s.tags.contains_key(&20));
            s.poll(&mut |_| {});
            assert_eq!(s.free_ops.len(), MAX_OPS - 1);
            assert_eq!(s.pinned, 1);
            zc.pins.unpin(&p);
            s.poll(&mut |_| {});
            assert_idle(&s);
            assert_eq!(s.pinned, 0);
            // The pin comes back before write_pinned (the RDMA Read failed,
            // or the file went away): slot, run and tag are freed, and a
            // late write_pinned is refused.
            assert_eq!(s.pin_write(21, h, 0, 4096, &[7], &mut out), Some(1));
            zc.pins.unpin(&out[0]);
            s.poll(&mut |_| {});
            assert_idle(&s);
            assert_eq!(
                s.write_pinned(21, h, 0, 4096),
                Poll::Ready(Err(StoreError::Io(libc::EINVAL)))
            );
            // Cancelled with the pin out: kept until the pin comes back.
            assert_eq!(s.pin_write(22, h, 0, 4096, &[7], &mut out), Some(1));
            s.cancel(22);
            s.poll(&mut |_| {});
            assert!(s.tags.is_empty());
            assert_eq!(s.free_ops.len(), MAX_OPS - 1);
            zc.pins.unpin(&out[0]);
            s.poll(&mut |_| {});
            assert_idle(&s);
            // A pin that comes back for a slot with none out is ignored.
            zc.pins.unpin(&p);
            s.poll(&mut |_| {});
            assert_idle(&s);
            assert_eq!(s.pinned, 0);
            // The data went to the file; the slab is free for what follows.
            assert_eq!(read(&mut s, h, 3, 10).unwrap(), &data[..10]);
            s.close(h);
            s.poll(&mut |_| {});
            assert_idle(&s);
        }
    }

    /// `--store-copy-cores`: on a memory file system a large READ or
    /// WRITE goes to the ring (Pending) only while another transfer is in
    /// flight, a lone one or a small one is copied at once, and either way
    /// the file gets the bytes and every slot, run and pin comes home.
    #[test]
    fn large_copies_leave_the_worker_only_beside_another_transfer() {
        if !shm_is_memory() {
            return;
        }
        let dir = TempDir::new(Backing::Memory, "copy-cores");
        // The io_uring workers may run on any core this test may use.
        let mut allowed = Vec::new();
        // SAFETY: a zeroed set, filled by the call for this thread.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        assert_eq!(
            unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) },
            0
        );
        for c in 0..libc::CPU_SETSIZE as usize {
            // SAFETY: `c` is inside the set.
            if unsafe { libc::CPU_ISSET(c, &set) } {
                allowed.push(c);
            }
        }
        let f = factory(&dir, false).with_copy_cores(&allowed);
        assert!(
            f.rw_description().contains("io_uring workers on cores"),
            "{}",
            f.rw_description()
        );
        let mut s = f.store().unwrap();
        let zc = s.zero_copy().expect("the staging slab is offered");
        let (h, _) = open(&mut s, "f", Disposition::Create).unwrap();
        // The CREATE went through the ring: the workers are pinned now.
        match s.offload {
            Offload::On => {}
            Offload::Off => {
                eprintln!(
                    "skipped: this kernel cannot pin io_uring workers (IORING_REGISTER_IOWQ_AFF)"
                );
                return;
            }
            Offload::Unpinned(_) => panic!("not pinned after the first submission"),
        }
        let mb = 1u32 << 20;
        let data: Vec<u8> = (0..mb).map(|i| (i % 251) as u8).collect();
        // A WRITE given its bytes: synchronous whatever its size.
        assert_eq!(s.write(2, h, 0, &data), Poll::Ready(Ok(mb)));
        // A lone READ, and a small one: copied at once.
        assert_eq!(s.read(3, h, 0, mb), Poll::Ready(Ok(mb)));
        s.cancel(3);
        // Counted: the inline WRITE was never eligible, the READ was kept.
        let counts = |away, kept| CopyCounts { away, kept };
        assert_eq!(s.take_copy_counts(), counts(0, 1));
        assert_eq!(s.take_copy_counts(), counts(0, 0), "taken");
        let mut piece = [Piece {
            sge: Sge {
                addr: 0,
                len: 0,
                lkey: 0,
            },
            pin: 0,
        }; 1];
        // Two WRITEs whose RDMA Reads placed their data.
        let mut pins = Vec::new();
        for (tag, fill) in [(10u64, 0x11u8), (11, 0x22)] {
            assert_eq!(
                s.pin_write(tag, h, u64::from(mb) * (tag - 9), mb, &[7], &mut piece),
                Some(1)
            );
            // SAFETY: the pinned run of `mb` bytes, ours to fill.
            unsafe { std::ptr::write_bytes(piece[0].sge.addr as *mut u8, fill, mb as usize) };
            pins.push(piece[0]);
        }
        // A small READ beside them stays synchronous.
        assert_eq!(s.read(4, h, 0, 4096), Poll::Ready(Ok(4096)));
        s.cancel(4);
        assert_eq!(s.take_copy_counts(), counts(0, 0), "too small to count");
        // A large READ beside them goes to the ring.
        assert_eq!(s.read(5, h, 0, mb), Poll::Pending);
        assert_eq!(drive(&mut s, 5, |s| s.read(5, h, 0, mb)), Ok(mb));
        let mut out = vec![0u8; mb as usize];
        s.copy_out(5, h, 0, &mut out);
        assert!(out == data, "the READ from the ring holds the file's bytes");
        // Counted once, not again for the repeated call that collected it.
        assert_eq!(s.take_copy_counts(), counts(1, 0));
        // The first pinned WRITE has the second beside it: to the ring.
        assert_eq!(s.write_pinned(10, h, u64::from(mb), mb), Poll::Pending);
        assert_eq!(
            drive(&mut s, 10, |s| s.write(10, h, u64::from(mb), &[])),
            Ok(mb)
        );
        // Its pin back, the second is alone: written at once.
        zc.pins.unpin(&pins[0]);
        s.poll(&mut |_| {});
        assert_eq!(
            s.write_pinned(11, h, 2 * u64::from(mb), mb),
            Poll::Ready(Ok(mb))
        );
        zc.pins.unpin(&pins[1]);
        s.poll(&mut |_| {});
        assert_eq!(s.take_copy_counts(), counts(1, 1));
        assert_idle(&s);
        assert_eq!(s.pinned, 0);
        let file = std::fs::read(dir.0.join("f")).unwrap();
        assert_eq!(file.len(), 3 * mb as usize);
        assert!(file[..mb as usize] == data[..]);
        assert!(file[mb as usize..2 * mb as usize]
            .iter()
            .all(|&b| b == 0x11));
        assert!(file[2 * mb as usize..].iter().all(|&b| b == 0x22));
        s.close(h);
        s.poll(&mut |_| {});
        assert_idle(&s);
    }

    /// `rm f; touch f` through a client: the CLOSE of a delete-on-close
    /// file is answered while its unlink still runs, and the next CREATE
    /// of the name (OpenIf, or Create, which finds the name taken) must
    /// not find it "delete pending" or existing: it waits for the unlink
    /// and creates a new file (or, for Open, finds none).
    #[test]
    fn a_create_right_after_a_delete_on_close_waits_for_the_unlink() {
        for b in both_paths() {
            let dir = TempDir::new(b, "recreate");
            let mut s = store(&dir, false);
            for round in 0..50 {
                let (h, _) = open(&mut s, "f", Disposition::OpenIf).unwrap();
                write(&mut s, h, 0, b"old contents").unwrap();
                s.set_delete_on_close(h, true).unwrap();
                s.close(h);
                // No poll between: the unlink has only been started.
                let d = if round % 2 == 0 {
                    Disposition::OpenIf
                } else {
                    Disposition::Create
                };
                let (h, action, info) = open_req(&mut s, &req("f", d))
                    .unwrap_or_else(|e| panic!("{b:?} round {round} ({d:?}): {e:?}"));
                assert_eq!(action, Action::Created, "{b:?} round {round}");
                assert_eq!(info.size, 0, "{b:?} round {round}");
                assert!(!info.delete_pending);
                s.set_delete_on_close(h, true).unwrap();
                s.close(h);
                assert_eq!(
                    open(&mut s, "f", Disposition::Open),
                    Err(StoreError::NotFound),
                    "{b:?} round {round}"
                );
            }
            settle(&mut s);
            assert_idle(&s);
            assert_eq!(s.parked, 0);
            assert_eq!(std::fs::read_dir(&dir.0).unwrap().count(), 0);
        }
    }

    #[test]
    fn synchronous_reads_and_writes_finish_at_once_with_short_reads_at_the_end() {
        if !shm_is_memory() {
            return;
        }
        let dir = TempDir::new(Backing::Memory, "sync-rw");
        let mut s = store(&dir, false);
        let (h, _) = open(&mut s, "f", Disposition::Create).unwrap();
        assert!(s.files.get(h).unwrap().sync_rw);
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
        // WRITE: Ready at the first call, nothing in flight, no staging.
        assert_eq!(s.write(5, h, 0, &data), Poll::Ready(Ok(100_000)));
        assert_eq!(s.in_flight(), 0);
        assert_idle(&s);
        assert_eq!(std::fs::read(dir.0.join("f")).unwrap(), data);
        // A write past the end grows the file, zero-filled.
        assert_eq!(s.write(5, h, 200_000, b"end"), Poll::Ready(Ok(3)));
        assert_eq!(size(&mut s, h), 200_003);
        // READ: Ready at once; its staging run waits for copy_out.
        assert_eq!(s.read(6, h, 99_990, 20), Poll::Ready(Ok(20)));
        assert_eq!(s.in_flight(), 0);
        assert!(s.tags.contains_key(&6), "the result waits for copy_out");
        // A repeated call returns the same result.
        assert_eq!(s.read(6, h, 99_990, 20), Poll::Ready(Ok(20)));
        let mut out = [0xAAu8; 20];
        s.copy_out(6, h, 99_990, &mut out);
        assert_eq!(&out[..10], &data[99_990..]);
        assert_eq!(&out[10..], &[0; 10]);
        assert_idle(&s);
        // Short at the end of file, 0 at and past it.
        assert_eq!(s.read(7, h, 200_000, 4096), Poll::Ready(Ok(3)));
        let mut out = [0u8; 3];
        s.copy_out(7, h, 200_000, &mut out);
        assert_eq!(&out, b"end");
        assert_eq!(s.read(7, h, 200_003, 4096), Poll::Ready(Ok(0)));
        s.cancel(7);
        assert_eq!(s.read(7, h, 1 << 40, 4096), Poll::Ready(Ok(0)));
        s.cancel(7);
        assert_eq!(s.read(7, h, 0, 0), Poll::Ready(Ok(0)));
        // Beyond the largest offset: EINVAL, as on the ring.
        assert_eq!(
            s.read(8, h, i64::MAX as u64, 2),
            Poll::Ready(Err(StoreError::Io(libc::EINVAL)))
        );
        // FLUSH completes at once.
        assert_eq!(s.flush(9, h), Poll::Ready(Ok(())));
        assert_idle(&s);
        // A read-only open refuses WRITE before any system call.
        let ro = dir.0.join("ro");
        std::fs::write(&ro, b"x").unwrap();
        std::fs::set_permissions(&ro, std::os::unix::fs::PermissionsExt::from_mode(0o444)).unwrap();
        let (r, _) = open(&mut s, "ro", Disposition::Open).unwrap();
        if !s.files.get(r).unwrap().writable {
            assert_eq!(
                s.write(10, r, 0, b"y"),
                Poll::Ready(Err(StoreError::Io(libc::EACCES)))
            );
        } else {
            eprintln!("note: running as root: the read-only file opened O_RDWR");
        }
        s.close(r);
        s.close(h);
        settle(&mut s);
        assert_idle(&s);
    }

    #[test]
    fn synchronous_errors_map_as_on_the_ring_and_cancel_releases_at_once() {
        if !shm_is_memory() {
            return;
        }
        let dir = TempDir::new(Backing::Memory, "sync-err");
        let mut s = store(&dir, false);
        let (h, _) = open(&mut s, "f", Disposition::Create).unwrap();
        assert_eq!(s.write(1, h, 0, &[3; 8192]), Poll::Ready(Ok(8192)));
        // Swap in a directory's descriptor: pread(2) fails with EISDIR and
        // pwrite(2) with EBADF (opened read-only), mapped by errno_error.
        let c = CString::new(dir.0.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid path; the result is checked.
        let dfd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        assert!(dfd >= 0);
        let fd = std::mem::replace(&mut s.files.get_mut(h).unwrap().fd, dfd);
        assert_eq!(
            s.read(2, h, 0, 4096),
            Poll::Ready(Err(StoreError::IsADirectory))
        );
        assert_eq!(
            s.write(3, h, 0, b"z"),
            Poll::Ready(Err(StoreError::Io(libc::EBADF)))
        );
        assert_idle(&s); // a failed read keeps nothing
        s.files.get_mut(h).unwrap().fd = fd;
        // SAFETY: ours, closed once.
        unsafe { libc::close(dfd) };
        // A Ready read holds its staging run until copy_out or cancel:
        // the slab (4 MiB) cannot take a second 2 MiB run meanwhile.
        assert_eq!(s.read(4, h, 0, 3 << 20), Poll::Ready(Ok(8192)));
        assert_eq!(s.read(5, h, 0, 2 << 20), Poll::Ready(Err(StoreError::Busy)));
        // Cancelled (its result never collected): released at once, the
        // tag free for a new operation.
        s.cancel(4);
        assert_idle(&s);
        assert_eq!(s.read(5, h, 0, 2 << 20), Poll::Ready(Ok(8192)));
        assert_eq!(s.read(4, h, 4096, 10), Poll::Ready(Ok(10)));
        let mut out = [0u8; 10];
        s.copy_out(4, h, 4096, &mut out);
        assert_eq!(out, [3; 10]);
        s.cancel(5);
        // A stale handle and a directory.
        let (d, _) = mkdir(&mut s, "d", Disposition::Create).unwrap();
        assert_eq!(
            s.read(6, d, 0, 1),
            Poll::Ready(Err(StoreError::IsADirectory))
        );
        s.close(d);
        s.close(h);
        assert_eq!(s.read(6, h, 0, 1), Poll::Ready(Err(StoreError::Closed)));
        assert_eq!(s.write(6, h, 0, b"x"), Poll::Ready(Err(StoreError::Closed)));
        settle(&mut s);
        assert_idle(&s);
    }

    /// Each test over a directory runs on both READ/WRITE paths:
    /// `...::uring` through io_uring, `...::memory` synchronously on tmpfs.
    macro_rules! on_both_paths {
        ($($name:ident),* $(,)?) => {
            mod on_both_paths {
                $(
                    mod $name {
                        #[test]
                        fn uring() {
                            super::super::$name(super::super::Backing::Uring);
                        }
                        #[test]
                        fn memory() {
                            if super::super::shm_is_memory() {
                                super::super::$name(super::super::Backing::Memory);
                            }
                        }
                    }
                )*
            }
        };
    }

    on_both_paths!(
        every_disposition_on_missing_and_existing_files,
        write_then_read_back,
        direct_io_round_trip_when_the_file_system_allows_it,
        paths_leaving_the_root_are_refused,
        directories_and_missing_parents,
        truncate_through_the_ring_and_through_the_fallback,
        stale_handles_and_exhausted_staging,
        rename_refuses_an_existing_target_unless_replacing,
        rename_across_directories_carries_open_paths_along,
        rename_targets_stay_beneath_the_root,
        a_stale_path_is_read_back_from_proc,
        listing_a_thousand_files_is_sorted_and_skips_what_cannot_be_named,
        delete_on_close_waits_for_the_last_handle,
        delete_on_close_of_empty_and_non_empty_directories,
        set_info_times_and_readonly_show_in_stat,
        fs_info_describes_the_root_file_system,
    );
}
