//! The stores behind a share, as the SMB2 layer of one worker sees them.
//!
//! Every operation may complete at once or later: a worker never blocks.
//! The caller names each operation with a [`Tag`] (unique among its
//! operations in flight on this store handle). An operation that returns
//! [`Poll::Pending`] is finished in the background (the directory store's
//! io_uring); [`Store::poll`] reports its tag once it has completed, and the
//! caller then repeats *the same call with the same tag and arguments* to
//! collect the result ([`Poll::Ready`]), which also forgets the tag. A store
//! that always completes at once (the memory store) never returns `Pending`.
//! [`Store::cancel`] forgets a tag whose result will never be collected (its
//! connection closed); a background operation still finishes, its result is
//! dropped.
//!
//! Reads are two-step so the data can land directly in a reply or an RDMA
//! buffer: [`Store::read`] makes `len` bytes at `offset` ready (returns how
//! many exist), then [`Store::copy_out`] copies them into the destination and
//! forgets the tag.
//!
//! Paths are share-relative, components separated by `\` (as on the wire,
//! [MS-SMB2] 2.2.13), already checked by [`valid_path`]; the empty path is
//! the share root. Stores must confine every path to their root.
//!
//! # Metadata
//! Beyond CREATE, READ and WRITE, a store serves what QUERY_INFO, SET_INFO
//! and QUERY_DIRECTORY need ([MS-SMB2] 3.3.5.18, 3.3.5.20, 3.3.5.21):
//! [`Store::stat`] (basic, standard and internal information),
//! [`Store::list`] (a sorted snapshot of a directory), [`Store::rename`],
//! [`Store::set_delete_on_close`] (the disposition), [`Store::set_info`]
//! (times and attributes), [`Store::truncate`] (end of file) and
//! [`Store::fs_info`] (the volume). These may allocate (they are not on the
//! READ/WRITE path); they follow the same tag contract.
//!
//! Delete on close ([MS-FSA] 2.1.5.14.3, 2.1.5.4): once marked, the file is
//! *delete pending*: it still appears in listings, opens of it fail with
//! [`StoreError::DeletePending`], and it disappears when the last handle
//! to it closes (see each store for what "last" covers). A directory can
//! be marked only while it is empty ([`StoreError::NotEmpty`]). CREATE
//! with FILE_DELETE_ON_CLOSE is served by the SMB2 layer as an open
//! followed by [`Store::set_delete_on_close`] (so the file is delete
//! pending from then on rather than from the close of that open).

/// Names one operation of one caller (the SMB2 layer packs connection and
/// request into it).
pub type Tag = u64;

/// What a store offers for zero-copy RDMA ([`crate::zerocopy`]): the memory
/// its data lives in, to register with the provider, and how pins taken by
/// [`Store::pin_read`] / [`Store::pin_write`] are released.
pub struct ZeroCopy {
    /// `(address, length)` of each region; [`Store::pin_read`] and
    /// [`Store::pin_write`] take their lkeys in this order.
    pub regions: Vec<(usize, usize)>,
    /// Releases the pins of the pieces they return.
    pub pins: std::sync::Arc<dyn crate::zerocopy::Pins>,
}

impl std::fmt::Debug for ZeroCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZeroCopy")
            .field("regions", &self.regions)
            .finish()
    }
}

/// Default bound of the memory store (`--store-size`).
pub const DEFAULT_STORE_BYTES: u64 = 1 << 30;

/// Why a store operation failed. [`StoreError::status`] maps each to the
/// NTSTATUS the SMB2 layer answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreError {
    /// No such file or directory (STATUS_OBJECT_NAME_NOT_FOUND).
    NotFound,
    /// A parent directory does not exist (STATUS_OBJECT_PATH_NOT_FOUND).
    PathNotFound,
    /// Exists, and the disposition forbids that (STATUS_OBJECT_NAME_COLLISION).
    Exists,
    /// The store's byte bound would be exceeded, or the disk is full
    /// (STATUS_DISK_FULL).
    Full,
    /// A file was expected and this is a directory (STATUS_FILE_IS_A_DIRECTORY).
    IsADirectory,
    /// A directory was expected (STATUS_NOT_A_DIRECTORY).
    NotADirectory,
    /// The path is not acceptable or would leave the root
    /// (STATUS_OBJECT_NAME_INVALID).
    InvalidName,
    /// The handle is stale (STATUS_FILE_CLOSED).
    Closed,
    /// Too many operations in flight or open files (STATUS_INSUFFICIENT_RESOURCES).
    Busy,
    /// A directory that must be empty is not (STATUS_DIRECTORY_NOT_EMPTY):
    /// delete on close of a non-empty directory.
    NotEmpty,
    /// The file is marked for deletion at its last close and cannot be
    /// opened again (STATUS_DELETE_PENDING).
    DeletePending,
    /// Any other operating-system error, as errno (STATUS_UNEXPECTED_IO_ERROR,
    /// or the closest match).
    Io(i32),
}

/// What CREATE asks for ([MS-SMB2] 2.2.13 CreateDisposition).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Replace if it exists, else create.
    Supersede,
    /// Open if it exists, else fail.
    Open,
    /// Fail if it exists, else create.
    Create,
    /// Open if it exists, else create.
    OpenIf,
    /// Truncate if it exists, else fail.
    Overwrite,
    /// Truncate if it exists, else create.
    OverwriteIf,
}

/// What CREATE did ([MS-SMB2] 2.2.14 CreateAction).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Replaced.
    Superseded,
    /// Opened.
    Opened,
    /// Created.
    Created,
    /// Truncated.
    Overwritten,
}

/// Attributes and times of a file, as CREATE, CLOSE, QUERY_INFO and
/// QUERY_DIRECTORY report them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FileInfo {
    /// End of file, bytes.
    pub size: u64,
    /// Allocation size, bytes.
    pub allocation: u64,
    /// A directory.
    pub is_dir: bool,
    /// Times as FILETIME (100 ns since 1601-01-01 UTC).
    pub creation_time: u64,
    /// Last access.
    pub last_access_time: u64,
    /// Last write.
    pub last_write_time: u64,
    /// Last change.
    pub change_time: u64,
    /// Stable identity of the file while it exists ([MS-FSCC] 2.4.20
    /// FileInternalInformation IndexNumber): the inode number on a
    /// directory store, a per-file counter on the memory store.
    pub file_id: u64,
    /// FILE_ATTRIBUTE_* ([MS-FSCC] 2.6): DIRECTORY for directories,
    /// NORMAL (0x80) alone when no other attribute is set.
    pub attributes: u32,
    /// Hard links ([MS-FSCC] 2.4.41 FileStandardInformation NumberOfLinks).
    pub nlink: u32,
    /// Marked for deletion at its last close
    /// (FileStandardInformation DeletePending).
    pub delete_pending: bool,
}

/// FILE_ATTRIBUTE_* values ([MS-FSCC] 2.6) the stores use.
pub mod attributes {
    use smbdirect_protocol::smb2::FileAttributes;

    /// FILE_ATTRIBUTE_READONLY.
    pub const READONLY: u32 = FileAttributes::READONLY.bits();
    /// FILE_ATTRIBUTE_HIDDEN.
    pub const HIDDEN: u32 = FileAttributes::HIDDEN.bits();
    /// FILE_ATTRIBUTE_SYSTEM.
    pub const SYSTEM: u32 = FileAttributes::SYSTEM.bits();
    /// FILE_ATTRIBUTE_DIRECTORY.
    pub const DIRECTORY: u32 = FileAttributes::DIRECTORY.bits();
    /// FILE_ATTRIBUTE_ARCHIVE.
    pub const ARCHIVE: u32 = FileAttributes::ARCHIVE.bits();
    /// FILE_ATTRIBUTE_NORMAL: reported when no other attribute is set.
    pub const NORMAL: u32 = FileAttributes::NORMAL.bits();
    /// FILE_ATTRIBUTE_TEMPORARY.
    pub const TEMPORARY: u32 = FileAttributes::TEMPORARY.bits();
    /// FILE_ATTRIBUTE_OFFLINE.
    pub const OFFLINE: u32 = FileAttributes::OFFLINE.bits();
    /// FILE_ATTRIBUTE_NOT_CONTENT_INDEXED.
    pub const NOT_CONTENT_INDEXED: u32 = FileAttributes::NOT_CONTENT_INDEXED.bits();
    /// What SET_INFO may change ([MS-FSA] 2.1.5.14.2: DIRECTORY, NORMAL
    /// and the attributes a file system owns are not set this way).
    pub const SETTABLE: u32 =
        READONLY | HIDDEN | SYSTEM | ARCHIVE | TEMPORARY | OFFLINE | NOT_CONTENT_INDEXED;

    /// `attrs` as reported: DIRECTORY added for a directory, NORMAL when
    /// nothing else is set.
    pub fn reported(attrs: u32, is_dir: bool) -> u32 {
        let a = if is_dir { attrs | DIRECTORY } else { attrs };
        if a == 0 {
            NORMAL
        } else {
            a
        }
    }
}

/// One entry of a directory snapshot ([`Store::list`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// The name in its directory (no path), as created or renamed.
    pub name: String,
    /// Its attributes and times.
    pub info: FileInfo,
}

/// Times SET_INFO asks for ([MS-FSCC] 2.4.7 FileBasicInformation), as
/// FILETIME. `None`, 0, -1 ("stop updating") and -2 ("resume updating")
/// leave a time unchanged (see [`SetTimes::effective`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SetTimes {
    /// CreationTime.
    pub creation: Option<u64>,
    /// LastAccessTime.
    pub last_access: Option<u64>,
    /// LastWriteTime.
    pub last_write: Option<u64>,
    /// ChangeTime.
    pub change: Option<u64>,
}

impl SetTimes {
    /// The time to set, or None to leave it: 0 means "do not change" and
    /// the negative values -1 and -2 (above `i64::MAX` as `u64`) are the
    /// update-mode requests of [MS-FSA] 2.1.5.14.2, treated as "do not
    /// change" too.
    pub fn effective(t: Option<u64>) -> Option<u64> {
        t.filter(|&v| v != 0 && v <= i64::MAX as u64)
    }

    /// Whether any time would change.
    pub fn any(&self) -> bool {
        [
            self.creation,
            self.last_access,
            self.last_write,
            self.change,
        ]
        .into_iter()
        .any(|t| Self::effective(t).is_some())
    }
}

/// The volume behind a share ([MS-FSCC] 2.5 FileFsSizeInformation,
/// FileFsFullSizeInformation, FileFsVolumeInformation).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FsInfo {
    /// Size of the volume, bytes.
    pub total_bytes: u64,
    /// Bytes a new file could use.
    pub free_bytes: u64,
    /// Allocation unit, bytes (a multiple of `sector_size`).
    pub block_size: u32,
    /// Bytes per sector.
    pub sector_size: u32,
    /// VolumeSerialNumber.
    pub serial: u32,
    /// VolumeLabel (at most 32 UTF-16 code units).
    pub label: String,
}

/// An open file of a store (the store's own index; opaque to callers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Handle(pub u64);

/// The result of a store operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Poll<T> {
    /// Done (the tag is forgotten, except after [`Store::read`], which
    /// [`Store::copy_out`] completes).
    Ready(Result<T, StoreError>),
    /// Running in the background; [`Store::poll`] reports the tag.
    Pending,
}

/// CREATE parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenRequest<'a> {
    /// Share-relative path ("" is the root).
    pub path: &'a str,
    /// Disposition.
    pub disposition: Disposition,
    /// FILE_DIRECTORY_FILE: must be (or create) a directory.
    pub directory: bool,
    /// FILE_NON_DIRECTORY_FILE: must not be a directory.
    pub non_directory: bool,
}

/// A store as one worker uses it. Not shared between threads: each worker
/// gets its own handle from a [`StoreFactory`] (the data behind the handles
/// is shared).
pub trait Store: Send + 'static {
    /// CREATE ([MS-SMB2] 3.3.5.9): open or create per disposition.
    fn open(&mut self, tag: Tag, req: &OpenRequest<'_>) -> Poll<(Handle, Action, FileInfo)>;
    /// Current attributes of an open file.
    fn stat(&mut self, tag: Tag, h: Handle) -> Poll<FileInfo>;
    /// Makes up to `len` bytes at `offset` ready; returns how many exist
    /// (fewer at the end of the file, 0 at or past it).
    fn read(&mut self, tag: Tag, h: Handle, offset: u64, len: u32) -> Poll<u32>;
    /// Copies the bytes a Ready [`Store::read`] with this tag made ready into
    /// `dst` (`dst.len()` ≤ what it returned) and forgets the tag.
    fn copy_out(&mut self, tag: Tag, h: Handle, offset: u64, dst: &mut [u8]);
    /// Writes `data` at `offset` (growing the file, zero-filled), returns
    /// the bytes written. On a repeated call after `Pending`, `data` is
    /// ignored (the store copied it on the first call).
    fn write(&mut self, tag: Tag, h: Handle, offset: u64, data: &[u8]) -> Poll<u32>;
    /// Sets the end of file.
    fn truncate(&mut self, tag: Tag, h: Handle, size: u64) -> Poll<()>;
    /// FLUSH: makes written data durable (no-op for memory).
    fn flush(&mut self, tag: Tag, h: Handle) -> Poll<()>;
    /// Closes an open file (never fails, never blocks; a directory store
    /// may finish the close in the background).
    fn close(&mut self, h: Handle);
    /// Reaps finished background operations, calling `done` with each tag.
    /// Cheap when nothing is in flight.
    fn poll(&mut self, done: &mut dyn FnMut(Tag));
    /// Forgets `tag` (its result will not be collected).
    fn cancel(&mut self, tag: Tag);
    /// Operations in flight.
    fn in_flight(&self) -> usize;
    /// Bytes used and the bound (None: unbounded, e.g. a directory).
    fn usage(&self) -> (u64, Option<u64>);
    /// QUERY_DIRECTORY ([MS-SMB2] 3.3.5.18): the entries of the directory
    /// open `h` (without `.` and `..`), sorted by name (code point order).
    /// `NotADirectory` for a file.
    fn list(&mut self, tag: Tag, h: Handle) -> Poll<Vec<DirEntry>>;
    /// FileRenameInformation ([MS-FSA] 2.1.5.14.11): gives the file or
    /// directory open as `h` the share-relative `new_path`; `h` stays valid
    /// and names the file under its new name. An existing target is
    /// `Exists` unless `replace`; a directory target, or (where the store
    /// can tell) an open one, is never replaced (`Io(EACCES)`, which maps
    /// to STATUS_ACCESS_DENIED). A missing target parent is
    /// `PathNotFound`; moving a directory beneath itself is `Io(EINVAL)`;
    /// the root cannot be renamed (`Io(EACCES)`).
    fn rename(&mut self, tag: Tag, h: Handle, new_path: &str, replace: bool) -> Poll<()>;
    /// FileDispositionInformation ([MS-FSA] 2.1.5.14.3): marks (`on`) or
    /// unmarks the file open as `h` for deletion at its last close (see
    /// the module docs). `NotEmpty` for a non-empty directory; the root
    /// cannot be deleted (`Io(EACCES)`). Completes at once.
    fn set_delete_on_close(&mut self, h: Handle, on: bool) -> Result<(), StoreError>;
    /// FileBasicInformation ([MS-FSA] 2.1.5.14.2): sets the times given
    /// (see [`SetTimes::effective`]) and, when `attributes` is `Some` and
    /// not 0, the FILE_ATTRIBUTE_* bits of [`attributes::SETTABLE`] (what a
    /// store can keep of them is documented per store).
    fn set_info(
        &mut self,
        tag: Tag,
        h: Handle,
        times: SetTimes,
        attributes: Option<u32>,
    ) -> Poll<()>;
    /// The volume (QUERY_INFO of the FileSystem class). Completes at once.
    fn fs_info(&self) -> FsInfo;

    /// Zero-copy RDMA ([`crate::zerocopy`]): the store's memory, if its
    /// data can be moved by RDMA in place. None (the default): READ and
    /// WRITE data is staged through pool buffers with [`Store::copy_out`]
    /// and [`Store::write`].
    fn zero_copy(&self) -> Option<ZeroCopy> {
        None
    }

    /// Zero-copy READ: after a Ready [`Store::read`] with this tag (instead
    /// of [`Store::copy_out`]), fills `out` with pinned pieces covering the
    /// `len` bytes at `offset` in order (`lkeys`: the registrations of
    /// [`ZeroCopy::regions`]); holes are pieces of a shared zero region.
    /// Returns how many (and, like `copy_out`, forgets the tag), or None
    /// when they do not fit `out` or the store cannot (then nothing is
    /// pinned, the tag is kept and the caller copies).
    fn pin_read(
        &mut self,
        _tag: Tag,
        _h: Handle,
        _offset: u64,
        _len: u32,
        _lkeys: &[u32],
        _out: &mut [crate::zerocopy::Piece],
    ) -> Option<usize> {
        None
    }

    /// Zero-copy WRITE: pinned pieces of memory the `len` bytes at
    /// `offset` go to (the file's own blocks, or a staging run the store
    /// writes to the file from), for an RDMA Read to fill in place;
    /// complete the write with [`Store::write_pinned`] and this tag once
    /// the data is there. None when the store cannot write this range in
    /// place (then nothing is pinned and the caller stages the data and
    /// calls [`Store::write`]). The pieces stay the store's until their
    /// pins come back ([`crate::zerocopy::Pins`]), whether or not
    /// `write_pinned` was called (a failed transfer, a closed file).
    fn pin_write(
        &mut self,
        _tag: Tag,
        _h: Handle,
        _offset: u64,
        _len: u32,
        _lkeys: &[u32],
        _out: &mut [crate::zerocopy::Piece],
    ) -> Option<usize> {
        None
    }

    /// Completes a WRITE whose data an RDMA Read placed in the pieces
    /// [`Store::pin_write`] returned for `tag` (writes the staging run out,
    /// or sets the end of file and times); returns the bytes written. A
    /// `Pending` result is collected as [`Store::write`]'s is: a repeated
    /// `write` with this tag (its data ignored) after the tag was reported
    /// by [`Store::poll`].
    fn write_pinned(&mut self, _tag: Tag, _h: Handle, _offset: u64, _len: u32) -> Poll<u32> {
        Poll::Ready(Err(StoreError::Io(libc::EINVAL)))
    }

    /// The large copies the store placed since the last call: with copy
    /// cores set (`serve --store-copy-cores`), how many READ and WRITE
    /// copies went to them and how many stayed on the worker (see the
    /// directory store's "Copies off the worker"). Zero (the default) for
    /// a store that never sends a copy away.
    fn take_copy_counts(&mut self) -> CopyCounts {
        CopyCounts::default()
    }
}

/// What [`Store::take_copy_counts`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CopyCounts {
    /// Copies sent to a thread on a copy core (an io_uring worker).
    pub away: u64,
    /// Copies eligible to go (large enough) made on the worker, because
    /// nothing else of the worker's was in flight to overlap with.
    pub kept: u64,
}

/// Makes one [`Store`] handle per worker.
pub trait StoreFactory: Send + Sync + 'static {
    /// The handle worker `index` uses.
    fn handle(&self, worker: usize) -> Box<dyn Store>;
    /// For logs and `stats`: "mem (1 GiB)" or the directory.
    fn describe(&self) -> String;
}

impl StoreError {
    /// The NTSTATUS an SMB2 server answers with.
    pub fn status(self) -> smbdirect_protocol::ntstatus::NtStatus {
        use smbdirect_protocol::ntstatus::*;
        match self {
            StoreError::NotFound => STATUS_OBJECT_NAME_NOT_FOUND,
            StoreError::PathNotFound => STATUS_OBJECT_PATH_NOT_FOUND,
            StoreError::Exists => STATUS_OBJECT_NAME_COLLISION,
            StoreError::Full => STATUS_DISK_FULL,
            StoreError::IsADirectory => STATUS_FILE_IS_A_DIRECTORY,
            StoreError::NotADirectory => STATUS_NOT_A_DIRECTORY,
            StoreError::InvalidName => STATUS_OBJECT_NAME_INVALID,
            StoreError::Closed => STATUS_FILE_CLOSED,
            StoreError::Busy => STATUS_INSUFFICIENT_RESOURCES,
            StoreError::NotEmpty | StoreError::Io(libc::ENOTEMPTY) => STATUS_DIRECTORY_NOT_EMPTY,
            StoreError::DeletePending => STATUS_DELETE_PENDING,
            StoreError::Io(libc::ENOSPC) => STATUS_DISK_FULL,
            StoreError::Io(libc::EACCES) | StoreError::Io(libc::EPERM) => STATUS_ACCESS_DENIED,
            StoreError::Io(libc::EINVAL) => STATUS_INVALID_PARAMETER,
            // A rename across mount points beneath the root.
            StoreError::Io(libc::EXDEV) => STATUS_NOT_SAME_DEVICE,
            StoreError::Io(_) => STATUS_UNEXPECTED_IO_ERROR,
        }
    }
}

/// A share-relative path as CREATE may name it: no leading `\`, no empty,
/// `.` or `..` components, no `:` (streams), `/` or NUL, at most 255 UTF-16
/// code units per component. The empty path (the root) is valid.
pub fn valid_path(path: &str) -> bool {
    path.is_empty()
        || path.split('\\').all(|c| {
            !c.is_empty()
                && c != "."
                && c != ".."
                && c.encode_utf16().count() <= 255
                && !c.contains([':', '/', '\0'])
        })
}

pub use super::dirstore::{DirStore, DirStoreFactory, RwPath};
pub use super::memstore::{MemStore, MemStoreFactory};

/// Whether a directory may be opened or created with `disposition`.
///
/// [MS-FSA] 2.1.5.1: a directory cannot be superseded or overwritten
/// (FILE_DIRECTORY_FILE with FILE_SUPERSEDE, FILE_OVERWRITE or
/// FILE_OVERWRITE_IF is STATUS_INVALID_PARAMETER). The SMB2 layer should
/// reject those requests before calling a store; the stores answer them
/// with `StoreError::Io(EINVAL)`.
pub fn disposition_allows_directory(disposition: Disposition) -> bool {
    matches!(
        disposition,
        Disposition::Open | Disposition::Create | Disposition::OpenIf
    )
}

/// FILETIME of the Unix epoch (1970-01-01 in 100 ns units since 1601-01-01).
pub const FILETIME_UNIX_EPOCH: u64 = 116_444_736_000_000_000;

/// A Unix time (seconds and nanoseconds since 1970) as FILETIME (100 ns
/// since 1601-01-01 UTC, [MS-DTYP] 2.3.3); times before 1601 give 0.
pub fn filetime_from_unix(secs: i64, nanos: u32) -> u64 {
    let ticks =
        i128::from(secs) * 10_000_000 + i128::from(nanos / 100) + i128::from(FILETIME_UNIX_EPOCH);
    ticks.clamp(0, i128::from(u64::MAX)) as u64
}

/// A FILETIME as Unix seconds and nanoseconds (the inverse of
/// [`filetime_from_unix`]; FILETIMEs above `i64::MAX` are clamped to it).
pub fn unix_from_filetime(ft: u64) -> (i64, u32) {
    let ticks = i128::from(ft.min(i64::MAX as u64)) - i128::from(FILETIME_UNIX_EPOCH);
    let secs = ticks.div_euclid(10_000_000) as i64;
    let nanos = (ticks.rem_euclid(10_000_000) * 100) as u32;
    (secs, nanos)
}

/// The current time as FILETIME (a vDSO clock read: no lock, no allocation).
pub fn filetime_now() -> u64 {
    match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => filetime_from_unix(d.as_secs() as i64, d.subsec_nanos()),
        Err(_) => FILETIME_UNIX_EPOCH,
    }
}

/// Bits of a [`Handle`] naming the slot of an [`OpenTable`].
const HANDLE_SLOT_BITS: u32 = 24;
/// Bits of a [`Handle`] holding the slot's generation.
const HANDLE_GEN_BITS: u32 = 32;
/// Most open files one store handle may hold.
pub const MAX_OPEN_FILES: usize = 1 << HANDLE_SLOT_BITS;

/// The open files of one store handle (one worker), named by [`Handle`]s.
///
/// A handle packs the slot index (24 bits), the slot's generation (32 bits,
/// bumped on every close, so a closed handle is stale: `Closed`) and the
/// table's instance number (8 bits, so a handle of another worker's table
/// is, with high probability, refused too). Lookups neither lock nor
/// allocate; `insert` may grow the table (CREATE path only).
#[derive(Debug)]
pub struct OpenTable<T> {
    slots: Vec<OpenSlot<T>>,
    free: Vec<u32>,
    instance: u64,
    len: usize,
}

#[derive(Debug)]
struct OpenSlot<T> {
    generation: u32,
    value: Option<T>,
}

impl<T> Default for OpenTable<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> OpenTable<T> {
    /// An empty table with its own instance number.
    pub fn new() -> Self {
        static NEXT_INSTANCE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let instance = NEXT_INSTANCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed) & 0xff;
        OpenTable {
            slots: Vec::new(),
            free: Vec::new(),
            instance,
            len: 0,
        }
    }

    /// Stores `value`, returns its handle; `Busy` past [`MAX_OPEN_FILES`].
    pub fn insert(&mut self, value: T) -> Result<Handle, StoreError> {
        let index = match self.free.pop() {
            Some(i) => i as usize,
            None if self.slots.len() < MAX_OPEN_FILES => {
                self.slots.push(OpenSlot {
                    generation: 0,
                    value: None,
                });
                self.slots.len() - 1
            }
            None => return Err(StoreError::Busy),
        };
        let slot = &mut self.slots[index];
        slot.value = Some(value);
        let generation = slot.generation;
        self.len += 1;
        Ok(self.handle_of(index, generation))
    }

    fn index(&self, h: Handle) -> Result<usize, StoreError> {
        let index = (h.0 & ((1 << HANDLE_SLOT_BITS) - 1)) as usize;
        let generation = (h.0 >> HANDLE_SLOT_BITS) as u32;
        let instance = h.0 >> (HANDLE_SLOT_BITS + HANDLE_GEN_BITS);
        match self.slots.get(index) {
            Some(s)
                if s.generation == generation && instance == self.instance && s.value.is_some() =>
            {
                Ok(index)
            }
            _ => Err(StoreError::Closed),
        }
    }

    /// The open file `h` names; `Closed` if it is stale.
    pub fn get(&self, h: Handle) -> Result<&T, StoreError> {
        let i = self.index(h)?;
        self.slots[i].value.as_ref().ok_or(StoreError::Closed)
    }

    /// The open file `h` names, mutably; `Closed` if it is stale.
    pub fn get_mut(&mut self, h: Handle) -> Result<&mut T, StoreError> {
        let i = self.index(h)?;
        self.slots[i].value.as_mut().ok_or(StoreError::Closed)
    }

    /// Forgets `h` (it becomes stale) and returns its value.
    pub fn remove(&mut self, h: Handle) -> Result<T, StoreError> {
        let i = self.index(h)?;
        let slot = &mut self.slots[i];
        let value = slot.value.take().ok_or(StoreError::Closed)?;
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(i as u32);
        self.len -= 1;
        Ok(value)
    }

    /// Open files.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No open files.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every open file with its handle (metadata paths: a scan of the
    /// table).
    pub fn iter(&self) -> impl Iterator<Item = (Handle, &T)> + '_ {
        self.slots.iter().enumerate().filter_map(|(i, s)| {
            s.value
                .as_ref()
                .map(|v| (self.handle_of(i, s.generation), v))
        })
    }

    /// Every open file with its handle, mutably.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (Handle, &mut T)> + '_ {
        let instance = self.instance;
        self.slots.iter_mut().enumerate().filter_map(move |(i, s)| {
            let h = Self::pack(i, s.generation, instance);
            s.value.as_mut().map(|v| (h, v))
        })
    }

    fn pack(index: usize, generation: u32, instance: u64) -> Handle {
        Handle(
            index as u64
                | u64::from(generation) << HANDLE_SLOT_BITS
                | instance << (HANDLE_SLOT_BITS + HANDLE_GEN_BITS),
        )
    }

    fn handle_of(&self, index: usize, generation: u32) -> Handle {
        Self::pack(index, generation, self.instance)
    }

    /// Removes every open file (store teardown), making all handles stale.
    pub fn drain(&mut self) -> Vec<T> {
        let mut out = Vec::with_capacity(self.len);
        for (i, s) in self.slots.iter_mut().enumerate() {
            if let Some(v) = s.value.take() {
                s.generation = s.generation.wrapping_add(1);
                self.free.push(i as u32);
                out.push(v);
            }
        }
        self.len = 0;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_handles_go_stale_and_slots_are_reused() {
        let mut t = OpenTable::new();
        let a = t.insert("a").unwrap();
        let b = t.insert("b").unwrap();
        assert_eq!(t.get(a), Ok(&"a"));
        assert_eq!(t.remove(a), Ok("a"));
        assert_eq!(t.get(a), Err(StoreError::Closed));
        assert_eq!(t.remove(a), Err(StoreError::Closed));
        let c = t.insert("c").unwrap();
        assert_ne!(a, c, "a reused slot has a new generation");
        assert_eq!(t.get(c), Ok(&"c"));
        assert_eq!(t.len(), 2);
        let mut seen: Vec<_> = t.iter().collect();
        seen.sort_by_key(|&(_, v)| *v);
        assert_eq!(seen, [(b, &"b"), (c, &"c")]);
        for (h, v) in t.iter_mut() {
            if h == c {
                *v = "c2";
            }
        }
        assert_eq!(t.get(c), Ok(&"c2"));
        assert_eq!(t.drain().len(), 2);
        assert_eq!(t.get(b), Err(StoreError::Closed));
        assert!(t.is_empty());
    }

    #[test]
    fn handles_of_another_table_are_refused() {
        let mut t1 = OpenTable::new();
        let mut t2 = OpenTable::new();
        let h1 = t1.insert(1).unwrap();
        let _h2 = t2.insert(2).unwrap();
        assert_eq!(t2.get(h1), Err(StoreError::Closed));
    }

    #[test]
    fn filetime_of_known_instants() {
        assert_eq!(filetime_from_unix(0, 0), FILETIME_UNIX_EPOCH);
        assert_eq!(filetime_from_unix(1, 500), FILETIME_UNIX_EPOCH + 10_000_005);
        assert_eq!(filetime_from_unix(-20_000_000_000, 0), 0);
        assert!(filetime_now() > filetime_from_unix(1_700_000_000, 0));
    }

    #[test]
    fn filetimes_convert_back_to_unix_times() {
        assert_eq!(unix_from_filetime(FILETIME_UNIX_EPOCH), (0, 0));
        assert_eq!(
            unix_from_filetime(FILETIME_UNIX_EPOCH + 10_000_005),
            (1, 500)
        );
        assert_eq!(
            unix_from_filetime(FILETIME_UNIX_EPOCH - 5),
            (-1, 999_999_500)
        );
        let ft = filetime_from_unix(1_700_000_000, 123_456_700);
        assert_eq!(unix_from_filetime(ft), (1_700_000_000, 123_456_700));
    }

    #[test]
    fn zero_and_negative_filetimes_leave_times_unchanged() {
        assert_eq!(SetTimes::effective(None), None);
        assert_eq!(SetTimes::effective(Some(0)), None);
        assert_eq!(SetTimes::effective(Some(u64::MAX)), None);
        assert_eq!(SetTimes::effective(Some(u64::MAX - 1)), None);
        assert_eq!(SetTimes::effective(Some(5)), Some(5));
        assert!(!SetTimes::default().any());
        let t = SetTimes {
            change: Some(7),
            ..SetTimes::default()
        };
        assert!(t.any());
    }

    #[test]
    fn new_errors_map_to_their_statuses() {
        use smbdirect_protocol::ntstatus::*;
        assert_eq!(StoreError::NotEmpty.status(), STATUS_DIRECTORY_NOT_EMPTY);
        assert_eq!(StoreError::DeletePending.status(), STATUS_DELETE_PENDING);
        assert_eq!(
            StoreError::Io(libc::EINVAL).status(),
            STATUS_INVALID_PARAMETER
        );
        assert_eq!(StoreError::Io(libc::EXDEV).status(), STATUS_NOT_SAME_DEVICE);
    }

    #[test]
    fn reported_attributes_are_never_zero() {
        assert_eq!(attributes::reported(0, false), attributes::NORMAL);
        assert_eq!(attributes::reported(0, true), attributes::DIRECTORY);
        assert_eq!(
            attributes::reported(attributes::READONLY, true),
            attributes::READONLY | attributes::DIRECTORY
        );
    }

    #[test]
    fn directories_are_never_superseded_or_overwritten() {
        assert!(disposition_allows_directory(Disposition::OpenIf));
        assert!(!disposition_allows_directory(Disposition::Supersede));
        assert!(!disposition_allows_directory(Disposition::OverwriteIf));
    }
}
