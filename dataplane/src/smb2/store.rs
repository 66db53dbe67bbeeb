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

/// Names one operation of one caller (the SMB2 layer packs connection and
/// request into it).
pub type Tag = u64;

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

/// Attributes and times of a file, as CREATE and CLOSE report them.
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
            StoreError::Io(libc::ENOSPC) => STATUS_DISK_FULL,
            StoreError::Io(libc::EACCES) | StoreError::Io(libc::EPERM) => STATUS_ACCESS_DENIED,
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
