//! The file-system commands of the `smb2` upper layer: QUERY_INFO
//! ([MS-SMB2] 3.3.5.20), SET_INFO (3.3.5.21), QUERY_DIRECTORY (3.3.5.18) and
//! LOCK (3.3.5.14), over the share's [`Store`](super::store::Store), and the
//! create contexts CREATE answers (3.3.5.9.5, 3.3.5.9.9) with CREATE's
//! FILE_DELETE_ON_CLOSE.
//!
//! None of this is on the READ/WRITE path: it may allocate (a directory
//! snapshot, an information class's bytes) and LOCK takes the share-wide
//! [`LockTable`]'s mutex.
//!
//! # Requests that wait
//! A store call that returns `Pending` holds the request
//! (`Step::Hold(Wait::Store)`) and the request runs again from the top when
//! the store reports its tag, repeating *the same* call. Each request here
//! therefore makes at most one store call that can be pending, except
//! QUERY_DIRECTORY, which makes two (a stat of the directory for `.` and
//! `..`, then the listing) and keeps what the first returned in the Open's
//! [`DirCursor`], so a rerun goes straight to the second. SET_INFO of
//! FileDispositionInformation stats the file, then marks it with the
//! store's synchronous [`set_delete_on_close`](super::store::Store::set_delete_on_close).
//!
//! # Choices (docs/spec-notes.md)
//! - QUERY_INFO: SECURITY and QUOTA are STATUS_NOT_SUPPORTED (the stores
//!   keep no security descriptors or quotas); a FILE or FILESYSTEM class
//!   [MS-FSCC] defines for queries but not served here is
//!   STATUS_NOT_SUPPORTED, any other class STATUS_INVALID_INFO_CLASS.
//!   FileFsAttributeInformation names the file system "NTFS" (what Windows
//!   applications test for; Samba does the same) while its attribute bits
//!   claim only what is served: case-preserved names and Unicode names.
//! - SET_INFO: FileAllocationInformation is accepted and changes nothing
//!   (stores allocate on write; a value below EndOfFile does not truncate,
//!   unlike [MS-FSA] 2.1.5.14.1); FilePositionInformation and
//!   FileModeInformation are accepted and ignored; FILESYSTEM, SECURITY
//!   and QUOTA are STATUS_NOT_SUPPORTED.
//! - QUERY_DIRECTORY: `.` and `..` come first in every directory, the share
//!   root included, when the pattern matches them; `..` carries the
//!   directory's own attributes (its parent is not at hand). FileIndex is
//!   0 and SMB2_INDEX_SPECIFIED is ignored. A restart (RESTART_SCANS or
//!   REOPEN) takes a fresh snapshot and the request's pattern.
//! - LOCK: a blocking lock that conflicts is not queued: it fails with
//!   STATUS_LOCK_NOT_GRANTED like a FAIL_IMMEDIATELY one. Locks are
//!   advisory: READ and WRITE do not check them (as POSIX locks).

use super::store::{attributes, DirEntry, FileInfo, Handle, Poll, SetTimes, Store, StoreError};
use super::{push, Conn, Core, Exec, Step, Wait, MAX_INLINE};
use crate::planes::ConnId;
use smbdirect_protocol::ntstatus::*;
use smbdirect_protocol::smb2::fscc::*;
use smbdirect_protocol::smb2::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Maximal access of every Open (FILE_ALL_ACCESS: the share grants all).
const FILE_ALL_ACCESS: u32 = 0x001F_01FF;
/// FileFsAttributeInformation MaximumComponentNameLength (characters; what
/// `store::valid_path` accepts).
const MAX_COMPONENT: u32 = 255;

// ---------------------------------------------------------------------------
// Byte-range locks

/// Who holds a byte-range lock ([MS-FSA] 2.1.1.2 ByteRangeLock.OwnerOpen):
/// an Open, named by its connection and persistent FileId. SMB2 carries no
/// LockKey, so the Open alone is the owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LockOwner {
    conn: ConnId,
    open: u64,
}

impl LockOwner {
    pub(super) fn new(conn: ConnId, open: u64) -> Self {
        LockOwner { conn, open }
    }
}

/// One granted byte-range lock.
#[derive(Debug, Clone, Copy)]
struct RangeLock {
    offset: u64,
    length: u64,
    exclusive: bool,
    owner: LockOwner,
}

impl RangeLock {
    /// [MS-FSA] 2.1.4.10 with LockIntent TRUE: whether a lock request
    /// (`offset`, `length`, `exclusive`, by `owner`) conflicts with this
    /// granted lock. The range {0, 0} overlaps nothing; other zero-length
    /// ranges overlap by the section's arithmetic (a range strictly inside
    /// another). A shared request stacks on the same owner's exclusive
    /// lock; everything else that overlaps an exclusive lock, and an
    /// exclusive request over a shared one, conflicts.
    fn conflicts(&self, offset: u64, length: u64, exclusive: bool, owner: LockOwner) -> bool {
        if (offset == 0 && length == 0) || (self.offset == 0 && self.length == 0) {
            return false;
        }
        // Lengths were checked not to overflow (`range_overflows`); a
        // zero length gives "last = offset - 1" as in the section.
        let last1 = offset.wrapping_add(length).wrapping_sub(1);
        let last2 = self.offset.wrapping_add(self.length).wrapping_sub(1);
        if !(offset <= last2 && last1 >= self.offset) {
            return false;
        }
        if self.exclusive {
            exclusive || self.owner != owner
        } else {
            exclusive
        }
    }
}

/// Byte-range locks ([MS-SMB2] 3.3.5.14, [MS-FSA] 2.1.5.8, 2.1.5.9) of
/// every file of the share, keyed by the store's file id and shared by all
/// workers (LOCK is not on the READ/WRITE path: one mutex). A close
/// releases the Open's locks ([MS-FSA] 2.1.5.4); with no lock anywhere it
/// does not touch the mutex.
#[derive(Debug, Default)]
pub struct LockTable {
    files: Mutex<HashMap<u64, Vec<RangeLock>>>,
    /// Locks granted, all files together.
    held: AtomicUsize,
}

impl LockTable {
    fn files(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Vec<RangeLock>>> {
        // A panic while holding it cannot leave the map half-updated in a
        // way that matters more than losing the locks.
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// [MS-SMB2] 3.3.5.14.2: takes every range in order, or none: the
    /// first conflict (with locks held, this request's earlier ranges
    /// included) releases what this request took and fails with
    /// STATUS_LOCK_NOT_GRANTED.
    pub(super) fn lock(
        &self,
        file: u64,
        owner: LockOwner,
        ranges: impl Iterator<Item = LockElement>,
    ) -> Result<(), NtStatus> {
        let mut files = self.files();
        let list = files.entry(file).or_default();
        let before = list.len();
        for e in ranges {
            let exclusive = e.flags.contains(LockFlags::EXCLUSIVE);
            if list
                .iter()
                .any(|l| l.conflicts(e.offset, e.length, exclusive, owner))
            {
                list.truncate(before);
                if list.is_empty() {
                    files.remove(&file);
                }
                return Err(STATUS_LOCK_NOT_GRANTED);
            }
            list.push(RangeLock {
                offset: e.offset,
                length: e.length,
                exclusive,
                owner,
            });
        }
        self.held.fetch_add(list.len() - before, Ordering::Relaxed);
        Ok(())
    }

    /// [MS-SMB2] 3.3.5.14.1 with [MS-FSA] 2.1.5.9: releases each range in
    /// order; a range this owner does not hold with exactly that offset and
    /// length is STATUS_RANGE_NOT_LOCKED, and the ranges released before it
    /// stay released. Of a shared and an exclusive lock on the same range,
    /// the exclusive one goes first.
    pub(super) fn unlock(
        &self,
        file: u64,
        owner: LockOwner,
        ranges: impl Iterator<Item = LockElement>,
    ) -> Result<(), NtStatus> {
        let mut files = self.files();
        let Some(list) = files.get_mut(&file) else {
            return Err(STATUS_RANGE_NOT_LOCKED);
        };
        let mut result = Ok(());
        for e in ranges {
            let mut found = None;
            for (i, l) in list.iter().enumerate() {
                if l.offset == e.offset && l.length == e.length && l.owner == owner {
                    found = Some(i);
                    if l.exclusive {
                        break;
                    }
                }
            }
            match found {
                Some(i) => {
                    list.remove(i);
                    self.held.fetch_sub(1, Ordering::Relaxed);
                }
                None => {
                    result = Err(STATUS_RANGE_NOT_LOCKED);
                    break;
                }
            }
        }
        if list.is_empty() {
            files.remove(&file);
        }
        result
    }

    /// Releases every lock `owner` holds on `file` (its close).
    pub(super) fn release(&self, file: u64, owner: LockOwner) {
        if self.held.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut files = self.files();
        if let Some(list) = files.get_mut(&file) {
            let before = list.len();
            list.retain(|l| l.owner != owner);
            self.held.fetch_sub(before - list.len(), Ordering::Relaxed);
            if list.is_empty() {
                files.remove(&file);
            }
        }
    }

    /// Locks granted on `file` (tests, stats).
    pub fn count(&self, file: u64) -> usize {
        self.files().get(&file).map_or(0, Vec::len)
    }
}

// ---------------------------------------------------------------------------
// Directory enumeration

/// QUERY_DIRECTORY enumeration state of a directory Open ([MS-SMB2]
/// 3.3.1.10 Open.EnumerationLocation and Open.EnumerationSearchPattern).
#[derive(Debug, Default)]
pub(super) struct DirCursor {
    /// The search pattern, fixed by the first query after a (re)start.
    pattern: Option<Vec<char>>,
    /// The directory's own attributes, for `.` and `..` (collected before
    /// the listing; kept so a rerun does not stat again).
    own: Option<FileInfo>,
    /// The entries matching the pattern, `.` and `..` first; `None` until
    /// listed.
    entries: Option<Vec<DirEntry>>,
    /// The next entry to return.
    pos: usize,
    /// A query completed since the (re)start: an empty result is then
    /// STATUS_NO_MORE_FILES rather than STATUS_NO_SUCH_FILE.
    queried: bool,
    /// The request (message token, index in its compound) running on this
    /// cursor, while it waits for the store.
    running: Option<(u64, usize)>,
}

impl DirCursor {
    fn restart(&mut self) {
        *self = DirCursor::default();
    }
}

/// [MS-FSA] 2.1.4.4: whether `name` matches `expr`, case-insensitively
/// (as the stores open names). `*` matches any run of characters, `?` any
/// one; the DOS wildcards: `>` (DOS_QM) any one character except that at a
/// `.` or at the end it matches nothing, `<` (DOS_STAR) any run that does
/// not take the name's last `.`, `"` (DOS_DOT) a `.`, or nothing at the
/// end. Everything else matches itself.
pub(super) fn name_matches(expr: &[char], name: &[char]) -> bool {
    if expr == ['*'] {
        return true;
    }
    let n = name.len();
    let last_dot = name.iter().rposition(|&c| c == '.');
    // reach[i]: the expression so far can match name[..i].
    let mut reach = vec![false; n + 1];
    reach[0] = true;
    let mut next = vec![false; n + 1];
    for &e in expr {
        next.iter_mut().for_each(|b| *b = false);
        match e {
            '*' => {
                let mut any = false;
                for i in 0..=n {
                    any |= reach[i];
                    next[i] = any;
                }
            }
            '<' => {
                for i in (0..=n).filter(|&i| reach[i]) {
                    let end = match last_dot {
                        Some(d) if i <= d => d,
                        _ => n,
                    };
                    next[i..=end].iter_mut().for_each(|b| *b = true);
                }
            }
            _ => {
                for i in (0..=n).filter(|&i| reach[i]) {
                    let c = name.get(i).copied();
                    match (e, c) {
                        ('?', Some(_)) => next[i + 1] = true,
                        ('>', Some(ch)) if ch != '.' => next[i + 1] = true,
                        ('>', _) => next[i] = true,
                        ('"', Some('.')) => next[i + 1] = true,
                        ('"', None) => next[i] = true,
                        ('?' | '"', _) => {}
                        (lit, Some(ch)) if same_char(lit, ch) => next[i + 1] = true,
                        _ => {}
                    }
                }
            }
        }
        std::mem::swap(&mut reach, &mut next);
        if !reach.iter().any(|&b| b) {
            return false;
        }
    }
    reach[n]
}

fn same_char(a: char, b: char) -> bool {
    a == b || a.to_lowercase().eq(b.to_lowercase())
}

/// A QUERY_DIRECTORY response body whose entries are written straight into
/// the response ([MS-SMB2] 2.2.34): the entries chosen by
/// [`Core::query_directory`], which already knows they fit in `len` bytes.
struct DirectoryOutput<'e> {
    class: DirectoryInfoClass,
    entries: Vec<&'e DirEntry>,
    len: usize,
}

impl Smb2Body for DirectoryOutput<'_> {
    fn command(&self) -> Option<Command> {
        Some(Command::QueryDirectory)
    }

    fn buffer_len(&self) -> usize {
        (QueryDirectoryResponseRepr::BUFFER_OFFSET + self.len).max(9)
    }

    fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        const WHAT: &str = "SMB2 QUERY_DIRECTORY response";
        let at = QueryDirectoryResponseRepr::BUFFER_OFFSET;
        let need = self.buffer_len();
        if buf.len() < need {
            return Err(Smb2Error::BufferTooSmall {
                what: WHAT,
                need,
                have: buf.len(),
            });
        }
        let mut w = DirectoryEntryWriter::new(self.class, &mut buf[at..at + self.len]);
        for e in &self.entries {
            if !w.push(&directory_entry(e))? {
                return Err(Smb2Error::BufferTooSmall {
                    what: WHAT,
                    need: self.len + 1,
                    have: self.len,
                });
            }
        }
        QueryDirectoryResponseRepr::emit_fixed(buf, self.len)
    }
}

/// One [MS-FSCC] directory entry for `e` (no short name, FileIndex 0,
/// FileId the store's file id).
fn directory_entry(e: &DirEntry) -> DirectoryEntry<'_> {
    let i = &e.info;
    DirectoryEntry {
        file_index: 0,
        creation_time: i.creation_time,
        last_access_time: i.last_access_time,
        last_write_time: i.last_write_time,
        change_time: i.change_time,
        end_of_file: i.size,
        allocation_size: i.allocation,
        file_attributes: file_attributes(i),
        ea_size: 0,
        short_name: Utf16Str::EMPTY,
        file_id: i.file_id,
        file_name: Utf16Str::new(&e.name),
    }
}

fn file_attributes(i: &FileInfo) -> FileAttributes {
    FileAttributes::from_bits(attributes::reported(i.attributes, i.is_dir))
}

fn align8(n: usize) -> usize {
    (n + 7) & !7
}

/// Bytes a response body may use after what `w` already holds: the
/// compound must fit one SMB Direct message ([`MAX_INLINE`]).
fn room(w: &CompoundWriter<'_>) -> usize {
    let used = if w.is_empty() { 0 } else { align8(w.len()) };
    (MAX_INLINE as usize).saturating_sub(used + HEADER_LEN + 8)
}

// ---------------------------------------------------------------------------
// CREATE contexts

/// The create contexts a CREATE answers ([MS-SMB2] 3.3.5.9.5 maximal
/// access, 3.3.5.9.9 on-disk id). Leases, durable handles and the POSIX
/// context are declined by not answering them (3.3.5.9.8, 3.3.5.9.10:
/// the client then holds none); other contexts are ignored.
#[derive(Debug, Default)]
pub(super) struct CreateAnswers {
    maximal_access: Option<[u8; MaximalAccessResponse::LEN]>,
    on_disk_id: Option<[u8; QueryOnDiskIdResponse::LEN]>,
}

impl CreateAnswers {
    /// What the request's contexts ask for; a recognised context whose data
    /// is malformed is STATUS_INVALID_PARAMETER (checked before the open).
    pub(super) fn of(list: &CreateContextList<'_>) -> Result<Self, NtStatus> {
        let mut a = CreateAnswers::default();
        for c in list.requests() {
            match c.map_err(|_| STATUS_INVALID_PARAMETER)? {
                CreateContextRequest::MaximalAccess(_) => {
                    // 3.3.5.9.5: MaximalAccess with QueryStatus SUCCESS
                    // (the share grants everything; Timestamp is moot).
                    a.maximal_access = Some(
                        MaximalAccessResponse {
                            query_status: STATUS_SUCCESS,
                            maximal_access: AccessMask::from_bits(FILE_ALL_ACCESS),
                        }
                        .to_bytes(),
                    );
                }
                CreateContextRequest::QueryOnDiskId => {
                    a.on_disk_id = Some([0; QueryOnDiskIdResponse::LEN]);
                }
                _ => {}
            }
        }
        Ok(a)
    }

    /// Fills the on-disk id with the opened file's id and the volume's.
    pub(super) fn opened(&mut self, file_id: u64, volume_id: u64) {
        if let Some(b) = &mut self.on_disk_id {
            *b = QueryOnDiskIdResponse {
                disk_file_id: file_id,
                volume_id,
            }
            .to_bytes();
        }
    }

    /// The response contexts: the first `n` of the array.
    pub(super) fn contexts(&self) -> ([CreateContext<'_>; 2], usize) {
        let mut out = [CreateContext::new(b"", b""); 2];
        let mut n = 0;
        if let Some(b) = &self.maximal_access {
            out[n] = CreateContext::new(SMB2_CREATE_QUERY_MAXIMAL_ACCESS_RESPONSE, b);
            n += 1;
        }
        if let Some(b) = &self.on_disk_id {
            out[n] = CreateContext::new(SMB2_CREATE_QUERY_ON_DISK_ID, b);
            n += 1;
        }
        (out, n)
    }
}

/// Marks a file for deletion at its last close (FileDispositionInformation,
/// [MS-FSA] 2.1.5.14.3, and CREATE's FILE_DELETE_ON_CLOSE, 2.1.5.1): a
/// read-only file is STATUS_CANNOT_DELETE, as is what the store refuses to
/// delete (the share root); a non-empty directory is
/// STATUS_DIRECTORY_NOT_EMPTY.
fn mark_for_deletion(store: &mut dyn Store, h: Handle, info: &FileInfo) -> Result<(), NtStatus> {
    if !info.is_dir && info.attributes & attributes::READONLY != 0 {
        return Err(STATUS_CANNOT_DELETE);
    }
    store.set_delete_on_close(h, true).map_err(|e| match e {
        StoreError::Io(libc::EACCES) | StoreError::Io(libc::EPERM) => STATUS_CANNOT_DELETE,
        e => e.status(),
    })
}

impl Core {
    /// The VolumeId CREATE's on-disk id reports ([MS-SMB2] 2.2.14.2.9): a
    /// constant of the share (FNV-1a of its name).
    pub(super) fn volume_id(&self) -> u64 {
        self.cfg
            .share
            .to_ascii_lowercase()
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
            })
    }

    /// CREATE with FILE_DELETE_ON_CLOSE ([MS-SMB2] 3.3.5.9): marks the file
    /// just opened as `h`; on failure closes `h` and returns the status
    /// to answer with.
    pub(super) fn delete_on_close_at_create(
        &mut self,
        h: Handle,
        info: &FileInfo,
    ) -> Result<(), NtStatus> {
        mark_for_deletion(&mut *self.store, h, info).inspect_err(|_| self.store.close(h))
    }

    // -----------------------------------------------------------------------
    // QUERY_INFO

    /// [MS-SMB2] 3.3.5.20.
    pub(super) fn query_info<'a>(
        &mut self,
        c: &mut Conn,
        fid: FileId,
        r: &QueryInfoRequestRepr<'_>,
        ex: &mut Exec,
        w: &mut CompoundWriter<'_>,
        ok: HeaderRepr,
    ) -> Result<Step<'a>, NtStatus> {
        let o = c.opens.get(&fid.volatile).ok_or(STATUS_FILE_CLOSED)?;
        let (out, fixed) = match r.info_type {
            InfoType::FILE => {
                let class = FileInfoClass(r.file_info_class);
                let info = if file_class_needs_stat(class)? {
                    match self.store.stat(ex.token, o.handle) {
                        Poll::Pending => return Ok(Step::Hold(Wait::Store)),
                        Poll::Ready(i) => Some(i.map_err(|e| e.status())?),
                    }
                } else {
                    None
                };
                file_info_bytes(class, &o.path, o.file_id, info.as_ref())?
            }
            InfoType::FILESYSTEM => self.fs_info_bytes(FsInfoClass(r.file_info_class))?,
            // 3.3.5.20.3, 3.3.5.20.4: the stores keep neither security
            // descriptors nor quotas.
            InfoType::SECURITY | InfoType::QUOTA => return Err(STATUS_NOT_SUPPORTED),
            _ => return Err(STATUS_INVALID_PARAMETER),
        };
        // 3.3.5.20.1/.2 with [MS-FSA] 2.1.5.11/2.1.5.12: too small for the
        // fixed part is an error, a variable part cut short a warning.
        let (n, status) = fit_query_info_output(out.len(), fixed, r.output_buffer_length)?;
        let mut h = ok;
        h.status = status;
        push(w, &h, &QueryInfoResponseRepr { output: &out[..n] });
        Ok(Step::Done)
    }

    /// A FILESYSTEM class ([MS-FSCC] 2.5) as bytes, with its fixed length.
    fn fs_info_bytes(&self, class: FsInfoClass) -> Result<(Vec<u8>, usize), NtStatus> {
        let fs = self.store.fs_info();
        let block = u64::from(fs.block_size.max(1));
        let sector = fs.sector_size.max(1);
        let units = |bytes: u64| bytes / block;
        let per_unit = (fs.block_size / sector).max(1);
        Ok(match class {
            FsInfoClass::FILE_FS_VOLUME_INFORMATION => {
                let label: String = fs
                    .label
                    .chars()
                    .scan(0, |n, ch| {
                        *n += ch.len_utf16();
                        (*n <= 32).then_some(ch)
                    })
                    .collect();
                let v = FileFsVolumeInformationRepr {
                    volume_creation_time: 0,
                    volume_serial_number: fs.serial,
                    supports_objects: false,
                    volume_label: Utf16Str::new(&label),
                };
                (
                    emit_vec(v.buffer_len(), |b| v.emit(b))?,
                    FileFsVolumeInformationRepr::FIXED_LEN,
                )
            }
            FsInfoClass::FILE_FS_SIZE_INFORMATION => fixed(
                FileFsSizeInformationRepr {
                    total_allocation_units: units(fs.total_bytes),
                    available_allocation_units: units(fs.free_bytes),
                    sectors_per_allocation_unit: per_unit,
                    bytes_per_sector: sector,
                }
                .to_bytes(),
            ),
            FsInfoClass::FILE_FS_FULL_SIZE_INFORMATION => fixed(
                FileFsFullSizeInformationRepr {
                    total_allocation_units: units(fs.total_bytes),
                    caller_available_allocation_units: units(fs.free_bytes),
                    actual_available_allocation_units: units(fs.free_bytes),
                    sectors_per_allocation_unit: per_unit,
                    bytes_per_sector: sector,
                }
                .to_bytes(),
            ),
            FsInfoClass::FILE_FS_DEVICE_INFORMATION => fixed(
                FileFsDeviceInformationRepr {
                    device_type: FILE_DEVICE_DISK,
                    characteristics: FsDeviceCharacteristics::DEVICE_IS_MOUNTED,
                }
                .to_bytes(),
            ),
            FsInfoClass::FILE_FS_ATTRIBUTE_INFORMATION => {
                // Names keep their case and are Unicode; no ACLs, streams,
                // sparse-file FSCTLs, hard links, object ids or EAs. The
                // memory store matches names case-insensitively; a
                // directory store as its file system does (not claimed).
                let a = FileFsAttributeInformationRepr {
                    file_system_attributes: FileSystemAttributes::CASE_PRESERVED_NAMES
                        | FileSystemAttributes::UNICODE_ON_DISK,
                    maximum_component_name_length: MAX_COMPONENT,
                    file_system_name: Utf16Str::new("NTFS"),
                };
                (
                    emit_vec(a.buffer_len(), |b| a.emit(b))?,
                    FileFsAttributeInformationRepr::FIXED_LEN,
                )
            }
            FsInfoClass::FILE_FS_SECTOR_SIZE_INFORMATION => fixed(
                FileFsSectorSizeInformationRepr {
                    logical_bytes_per_sector: sector,
                    physical_bytes_per_sector_for_atomicity: sector,
                    physical_bytes_per_sector_for_performance: fs.block_size.max(sector),
                    effective_physical_bytes_per_sector_for_atomicity: sector,
                    flags: SectorSizeFlags::ALIGNED_DEVICE
                        | SectorSizeFlags::PARTITION_ALIGNED_ON_DEVICE,
                    byte_offset_for_sector_alignment: 0,
                    byte_offset_for_partition_alignment: 0,
                }
                .to_bytes(),
            ),
            FsInfoClass::FILE_FS_OBJECT_ID_INFORMATION => {
                // The volume's GUID: its serial and the share's id.
                let mut g = [0u8; 16];
                g[..4].copy_from_slice(&fs.serial.to_le_bytes());
                g[8..].copy_from_slice(&self.volume_id().to_le_bytes());
                let o = FileFsObjectIdInformationRepr {
                    object_id: Guid::from_bytes(g),
                    extended_info: [0; 48],
                };
                let b = emit_vec(o.buffer_len(), |b| o.emit(b))?;
                let n = b.len();
                (b, n)
            }
            FsInfoClass::FILE_FS_CONTROL_INFORMATION
            | FsInfoClass::FILE_FS_DRIVER_PATH_INFORMATION
            | FsInfoClass::FILE_FS_VOLUME_FLAGS_INFORMATION => return Err(STATUS_NOT_SUPPORTED),
            _ => return Err(STATUS_INVALID_INFO_CLASS),
        })
    }

    // -----------------------------------------------------------------------
    // SET_INFO

    /// [MS-SMB2] 3.3.5.21.
    pub(super) fn set_info<'a>(
        &mut self,
        c: &mut Conn,
        fid: FileId,
        r: &SetInfoRequestRepr<'_>,
        ex: &mut Exec,
        w: &mut CompoundWriter<'_>,
        ok: HeaderRepr,
    ) -> Result<Step<'a>, NtStatus> {
        let tag = ex.token;
        let o = c.opens.get(&fid.volatile).ok_or(STATUS_FILE_CLOSED)?;
        let (h, is_dir) = (o.handle, o.is_dir);
        let class = match r.info_type {
            InfoType::FILE => FileInfoClass(r.file_info_class),
            InfoType::FILESYSTEM | InfoType::SECURITY | InfoType::QUOTA => {
                return Err(STATUS_NOT_SUPPORTED)
            }
            _ => return Err(STATUS_INVALID_PARAMETER),
        };
        let bad = |e: Smb2Error| info_length_status(&e);
        match class {
            // [MS-FSA] 2.1.5.14.2.
            FileInfoClass::FILE_BASIC_INFORMATION => {
                let b = FileBasicInformationRepr::from_bytes(r.data).map_err(bad)?;
                let attrs = b.file_attributes;
                if (attrs.contains(FileAttributes::DIRECTORY) && !is_dir)
                    || (attrs.contains(FileAttributes::TEMPORARY) && is_dir)
                {
                    return Err(STATUS_INVALID_PARAMETER);
                }
                let times = SetTimes {
                    creation: Some(b.creation_time),
                    last_access: Some(b.last_access_time),
                    last_write: Some(b.last_write_time),
                    change: Some(b.change_time),
                };
                let attrs = (!attrs.is_empty()).then_some(attrs.bits());
                if times.any() || attrs.is_some() {
                    if let Poll::Pending = ready(self.store.set_info(tag, h, times, attrs))? {
                        return Ok(Step::Hold(Wait::Store));
                    }
                }
            }
            // 2.1.5.14.4.
            FileInfoClass::FILE_END_OF_FILE_INFORMATION => {
                let e = FileEndOfFileInformationRepr::from_bytes(r.data).map_err(bad)?;
                if is_dir {
                    return Err(STATUS_INVALID_PARAMETER);
                }
                if let Poll::Pending = ready(self.store.truncate(tag, h, e.end_of_file))? {
                    return Ok(Step::Hold(Wait::Store));
                }
            }
            // 2.1.5.14.1: accepted, nothing changes (module docs).
            FileInfoClass::FILE_ALLOCATION_INFORMATION => {
                FileAllocationInformationRepr::from_bytes(r.data).map_err(bad)?;
                if is_dir {
                    return Err(STATUS_INVALID_PARAMETER);
                }
            }
            FileInfoClass::FILE_RENAME_INFORMATION => {
                let n = FileRenameInformationRepr::from_bytes(r.data).map_err(bad)?;
                return self.rename(c, fid, &n, tag, w, ok);
            }
            // 2.1.5.14.3.
            FileInfoClass::FILE_DISPOSITION_INFORMATION => {
                let d = FileDispositionInformationRepr::from_bytes(r.data).map_err(bad)?;
                if d.delete_pending {
                    let info = match self.store.stat(tag, h) {
                        Poll::Pending => return Ok(Step::Hold(Wait::Store)),
                        Poll::Ready(i) => i.map_err(|e| e.status())?,
                    };
                    mark_for_deletion(&mut *self.store, h, &info)?;
                } else {
                    self.store
                        .set_delete_on_close(h, false)
                        .map_err(|e| e.status())?;
                }
            }
            // 2.1.5.14.7, 2.1.5.14.9: accepted and ignored (no file
            // position or mode is kept per Open over SMB2).
            FileInfoClass::FILE_POSITION_INFORMATION => {
                FilePositionInformationRepr::from_bytes(r.data).map_err(bad)?;
            }
            FileInfoClass::FILE_MODE_INFORMATION => {
                FileModeInformationRepr::from_bytes(r.data).map_err(bad)?;
            }
            FileInfoClass::FILE_LINK_INFORMATION
            | FileInfoClass::FILE_FULL_EA_INFORMATION
            | FileInfoClass::FILE_PIPE_INFORMATION
            | FileInfoClass::FILE_VALID_DATA_LENGTH_INFORMATION
            | FileInfoClass::FILE_SHORT_NAME_INFORMATION
            | FileInfoClass::FILE_DISPOSITION_INFORMATION_EX
            | FileInfoClass::FILE_RENAME_INFORMATION_EX => return Err(STATUS_NOT_SUPPORTED),
            _ => return Err(STATUS_INVALID_INFO_CLASS),
        }
        push(w, &ok, &SetInfoResponseRepr);
        Ok(Step::Done)
    }

    /// [MS-SMB2] 3.3.5.21.1 FileRenameInformation: FileName is the new path
    /// from the share root (a leading `\` is tolerated), RootDirectory 0.
    /// On success the Open, and this connection's other Opens of the file
    /// or beneath it (a directory), carry the new path.
    fn rename<'a>(
        &mut self,
        c: &mut Conn,
        fid: FileId,
        n: &FileRenameInformationRepr<'_>,
        tag: u64,
        w: &mut CompoundWriter<'_>,
        ok: HeaderRepr,
    ) -> Result<Step<'a>, NtStatus> {
        if n.root_directory != 0 {
            return Err(STATUS_INVALID_PARAMETER);
        }
        let name = n
            .file_name
            .decode()
            .map_err(|_| STATUS_OBJECT_NAME_INVALID)?;
        let new = name.strip_prefix('\\').unwrap_or(&name);
        if new.is_empty() || !super::store::valid_path(new) {
            return Err(STATUS_OBJECT_NAME_INVALID);
        }
        let o = c.opens.get(&fid.volatile).ok_or(STATUS_FILE_CLOSED)?;
        let (h, file_id) = (o.handle, o.file_id);
        let old = o.path.clone();
        if let Poll::Pending = ready(self.store.rename(tag, h, new, n.replace_if_exists))? {
            return Ok(Step::Hold(Wait::Store));
        }
        let old_prefix = format!("{old}\\");
        for o in c.opens.values_mut() {
            if o.file_id == file_id {
                o.path = new.to_string();
            } else if let Some(rest) = o.path.strip_prefix(&old_prefix) {
                o.path = format!("{new}\\{rest}");
            }
        }
        push(w, &ok, &SetInfoResponseRepr);
        Ok(Step::Done)
    }

    // -----------------------------------------------------------------------
    // QUERY_DIRECTORY

    /// [MS-SMB2] 3.3.5.18, with [MS-FSA] 2.1.5.6.
    pub(super) fn query_directory<'a>(
        &mut self,
        c: &mut Conn,
        fid: FileId,
        r: &QueryDirectoryRequestRepr<'_>,
        ex: &mut Exec,
        w: &mut CompoundWriter<'_>,
        ok: HeaderRepr,
    ) -> Result<Step<'a>, NtStatus> {
        let me = (ex.token, ex.next);
        let o = c.opens.get_mut(&fid.volatile).ok_or(STATUS_FILE_CLOSED)?;
        if !o.is_dir {
            // 3.3.5.18: also with SMB2_REOPEN (implementation-specific).
            return Err(STATUS_INVALID_PARAMETER);
        }
        let class = match r.directory_class() {
            Some(c) => c,
            None if r.file_information_class
                == FileInfoClass::FILE_ID_EXTD_DIRECTORY_INFORMATION =>
            {
                return Err(STATUS_NOT_SUPPORTED)
            }
            None => return Err(STATUS_INVALID_INFO_CLASS),
        };
        // [MS-FSA] 2.1.5.6.3: a buffer too small for one entry's fixed part.
        if (r.output_buffer_length as usize) < class.fixed_len() {
            return Err(STATUS_INFO_LENGTH_MISMATCH);
        }
        let handle = o.handle;
        let cur = o.dir.get_or_insert_with(DirCursor::default);
        if cur.running != Some(me) {
            if cur.running.is_some() {
                // Another query on this Open waits for the store.
                return Err(STATUS_INSUFFICIENT_RESOURCES);
            }
            if r.restarts() {
                cur.restart();
            }
            if cur.pattern.is_none() {
                let p = r
                    .file_name
                    .decode()
                    .map_err(|_| STATUS_OBJECT_NAME_INVALID)?;
                let p: Vec<char> = if p.is_empty() {
                    vec!['*']
                } else {
                    p.chars().collect()
                };
                cur.pattern = Some(p);
            }
            cur.running = Some(me);
        }
        let r0 = self.fill_cursor(cur, handle, ex.token);
        let filled = match r0 {
            Ok(filled) => filled,
            Err(st) => {
                cur.running = None;
                return Err(st);
            }
        };
        if !filled {
            return Ok(Step::Hold(Wait::Store));
        }
        cur.running = None;
        let entries = cur.entries.as_deref().unwrap_or(&[]);
        if cur.pos >= entries.len() {
            // 2.1.5.6.3: nothing matched at all on the first query.
            let first = !cur.queried;
            cur.queried = true;
            return Err(if first {
                STATUS_NO_SUCH_FILE
            } else {
                STATUS_NO_MORE_FILES
            });
        }
        // Pack what fits: min(OutputBufferLength, the response's room),
        // one entry with SMB2_RETURN_SINGLE_ENTRY.
        let cap = (r.output_buffer_length as usize).min(room(w));
        let single = r.flags.contains(QueryDirectoryFlags::RETURN_SINGLE_ENTRY);
        let mut chosen = Vec::new();
        let mut end = 0;
        for e in &entries[cur.pos..] {
            let len = class.fixed_len() + 2 * e.name.encode_utf16().count();
            let start = if chosen.is_empty() { 0 } else { align8(end) };
            if start + len > cap {
                break;
            }
            end = start + len;
            chosen.push(e);
            if single {
                break;
            }
        }
        cur.queried = true;
        if chosen.is_empty() {
            // 2.1.5.6.3: the first entry does not fit; it stays next.
            if cap < class.fixed_len() {
                return Err(STATUS_INFO_LENGTH_MISMATCH);
            }
            let mut h = ok;
            h.status = STATUS_BUFFER_OVERFLOW;
            push(w, &h, &QueryDirectoryResponseRepr { output: &[] });
            return Ok(Step::Done);
        }
        cur.pos += chosen.len();
        let body = DirectoryOutput {
            class,
            entries: chosen,
            len: end,
        };
        push(w, &ok, &body);
        Ok(Step::Done)
    }

    /// Takes the cursor's snapshot if it has none: the directory's own
    /// attributes when the pattern matches `.` or `..`, then the listing.
    /// False: the store is still working (same call again on the wake).
    fn fill_cursor(&mut self, cur: &mut DirCursor, h: Handle, tag: u64) -> Result<bool, NtStatus> {
        if cur.entries.is_some() {
            return Ok(true);
        }
        let pattern = cur.pattern.clone().unwrap_or_else(|| vec!['*']);
        let dots: Vec<&str> = [".", ".."]
            .into_iter()
            .filter(|d| name_matches(&pattern, &d.chars().collect::<Vec<_>>()))
            .collect();
        if !dots.is_empty() && cur.own.is_none() {
            match self.store.stat(tag, h) {
                Poll::Pending => return Ok(false),
                Poll::Ready(i) => cur.own = Some(i.map_err(|e| e.status())?),
            }
        }
        let listed = match self.store.list(tag, h) {
            Poll::Pending => return Ok(false),
            Poll::Ready(l) => l.map_err(|e| e.status())?,
        };
        let own = cur.own.unwrap_or_default();
        let mut entries: Vec<DirEntry> = dots
            .iter()
            .map(|d| DirEntry {
                name: d.to_string(),
                info: own,
            })
            .collect();
        let mut name = Vec::new();
        entries.extend(listed.into_iter().filter(|e| {
            name.clear();
            name.extend(e.name.chars());
            name_matches(&pattern, &name)
        }));
        cur.entries = Some(entries);
        cur.pos = 0;
        Ok(true)
    }

    // -----------------------------------------------------------------------
    // LOCK

    /// [MS-SMB2] 3.3.5.14.
    pub(super) fn lock<'a>(
        &mut self,
        c: &mut Conn,
        fid: FileId,
        r: &LockRequestRepr<'_>,
        ex: &mut Exec,
        w: &mut CompoundWriter<'_>,
        ok: HeaderRepr,
    ) -> Result<Step<'a>, NtStatus> {
        let o = c.opens.get(&fid.volatile).ok_or(STATUS_FILE_CLOSED)?;
        // [MS-FSA] 2.1.5.8, 2.1.5.9: no byte-range locks on directories.
        if o.is_dir {
            return Err(STATUS_INVALID_PARAMETER);
        }
        let owner = LockOwner::new(ex.conn, o.persistent);
        match r.operation()? {
            LockOperation::Unlock => self.cfg.locks.unlock(o.file_id, owner, r.locks.iter())?,
            // A blocking lock that conflicts is not queued (module docs).
            LockOperation::Lock { .. } => self.cfg.locks.lock(o.file_id, owner, r.locks.iter())?,
        }
        push(w, &ok, &LockResponseRepr);
        Ok(Step::Done)
    }
}

/// A store result: `Pending`, `Ready(())`, or the failure's status.
fn ready(p: Poll<()>) -> Result<Poll<()>, NtStatus> {
    match p {
        Poll::Ready(Err(e)) => Err(e.status()),
        p => Ok(p),
    }
}

/// Emits into a fresh vector of exactly `len` bytes.
fn emit_vec(
    len: usize,
    emit: impl FnOnce(&mut [u8]) -> Result<usize, Smb2Error>,
) -> Result<Vec<u8>, NtStatus> {
    let mut b = vec![0u8; len];
    let n = emit(&mut b).map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
    b.truncate(n);
    Ok(b)
}

/// A fixed-size class: its bytes, and all of them are the fixed part.
fn fixed<const N: usize>(b: [u8; N]) -> (Vec<u8>, usize) {
    (b.to_vec(), N)
}

/// Whether a FILE class needs the file's attributes; the classes not served
/// fail here, before any store call ([MS-SMB2] 3.3.5.20.1).
fn file_class_needs_stat(class: FileInfoClass) -> Result<bool, NtStatus> {
    Ok(match class {
        FileInfoClass::FILE_BASIC_INFORMATION
        | FileInfoClass::FILE_STANDARD_INFORMATION
        | FileInfoClass::FILE_ALL_INFORMATION
        | FileInfoClass::FILE_NETWORK_OPEN_INFORMATION
        | FileInfoClass::FILE_ATTRIBUTE_TAG_INFORMATION
        | FileInfoClass::FILE_STREAM_INFORMATION
        | FileInfoClass::FILE_COMPRESSION_INFORMATION => true,
        FileInfoClass::FILE_INTERNAL_INFORMATION
        | FileInfoClass::FILE_EA_INFORMATION
        | FileInfoClass::FILE_ACCESS_INFORMATION
        | FileInfoClass::FILE_NAME_INFORMATION
        | FileInfoClass::FILE_POSITION_INFORMATION
        | FileInfoClass::FILE_MODE_INFORMATION
        | FileInfoClass::FILE_ALIGNMENT_INFORMATION => false,
        // Defined for queries, not served: no EAs, pipes, 8.3 names or
        // 128-bit ids here.
        FileInfoClass::FILE_FULL_EA_INFORMATION
        | FileInfoClass::FILE_ALTERNATE_NAME_INFORMATION
        | FileInfoClass::FILE_PIPE_INFORMATION
        | FileInfoClass::FILE_PIPE_LOCAL_INFORMATION
        | FileInfoClass::FILE_PIPE_REMOTE_INFORMATION
        | FileInfoClass::FILE_NORMALIZED_NAME_INFORMATION
        | FileInfoClass::FILE_ID_INFORMATION => return Err(STATUS_NOT_SUPPORTED),
        _ => return Err(STATUS_INVALID_INFO_CLASS),
    })
}

/// A FILE class ([MS-FSCC] 2.4) as bytes, with its fixed length. `info` is
/// there when [`file_class_needs_stat`] said so.
fn file_info_bytes(
    class: FileInfoClass,
    path: &str,
    file_id: u64,
    info: Option<&FileInfo>,
) -> Result<(Vec<u8>, usize), NtStatus> {
    let i = info.copied().unwrap_or_default();
    let basic = FileBasicInformationRepr {
        creation_time: i.creation_time,
        last_access_time: i.last_access_time,
        last_write_time: i.last_write_time,
        change_time: i.change_time,
        file_attributes: file_attributes(&i),
    };
    let standard = FileStandardInformationRepr {
        allocation_size: i.allocation,
        end_of_file: i.size,
        number_of_links: i.nlink.max(1),
        delete_pending: i.delete_pending,
        directory: i.is_dir,
    };
    // FileNameInformation's name: the path from the share root with a
    // leading `\` (`\` alone for the root).
    let name = format!("\\{path}");
    Ok(match class {
        FileInfoClass::FILE_BASIC_INFORMATION => fixed(basic.to_bytes()),
        FileInfoClass::FILE_STANDARD_INFORMATION => fixed(standard.to_bytes()),
        FileInfoClass::FILE_INTERNAL_INFORMATION => fixed(
            FileInternalInformationRepr {
                index_number: file_id,
            }
            .to_bytes(),
        ),
        FileInfoClass::FILE_EA_INFORMATION => {
            fixed(FileEaInformationRepr { ea_size: 0 }.to_bytes())
        }
        FileInfoClass::FILE_ACCESS_INFORMATION => fixed(
            FileAccessInformationRepr {
                access_flags: AccessMask::from_bits(FILE_ALL_ACCESS),
            }
            .to_bytes(),
        ),
        // [MS-SMB2] 3.3.5.20.1: CurrentByteOffset 0.
        FileInfoClass::FILE_POSITION_INFORMATION => fixed(
            FilePositionInformationRepr {
                current_byte_offset: 0,
            }
            .to_bytes(),
        ),
        FileInfoClass::FILE_MODE_INFORMATION => {
            fixed(FileModeInformationRepr { mode: 0 }.to_bytes())
        }
        FileInfoClass::FILE_ALIGNMENT_INFORMATION => fixed(
            FileAlignmentInformationRepr {
                alignment_requirement: 0,
            }
            .to_bytes(),
        ),
        FileInfoClass::FILE_NAME_INFORMATION => {
            let n = FileNameInformationRepr {
                file_name: Utf16Str::new(&name),
            };
            (
                emit_vec(n.buffer_len(), |b| n.emit(b))?,
                FileNameInformationRepr::FIXED_LEN,
            )
        }
        FileInfoClass::FILE_ALL_INFORMATION => {
            let a = FileAllInformationRepr {
                basic,
                standard,
                internal: FileInternalInformationRepr {
                    index_number: i.file_id,
                },
                ea: FileEaInformationRepr { ea_size: 0 },
                access: FileAccessInformationRepr {
                    access_flags: AccessMask::from_bits(FILE_ALL_ACCESS),
                },
                position: FilePositionInformationRepr::default(),
                mode: FileModeInformationRepr::default(),
                alignment: FileAlignmentInformationRepr::default(),
                file_name: Utf16Str::new(&name),
            };
            (
                emit_vec(a.buffer_len(), |b| a.emit(b))?,
                FileAllInformationRepr::FIXED_LEN,
            )
        }
        FileInfoClass::FILE_NETWORK_OPEN_INFORMATION => fixed(
            FileNetworkOpenInformationRepr {
                creation_time: i.creation_time,
                last_access_time: i.last_access_time,
                last_write_time: i.last_write_time,
                change_time: i.change_time,
                allocation_size: i.allocation,
                end_of_file: i.size,
                file_attributes: file_attributes(&i),
            }
            .to_bytes(),
        ),
        FileInfoClass::FILE_ATTRIBUTE_TAG_INFORMATION => fixed(
            FileAttributeTagInformationRepr {
                file_attributes: file_attributes(&i),
                reparse_tag: 0,
            }
            .to_bytes(),
        ),
        // [MS-FSCC] FileStreamInformation: the default data stream of a
        // file; a directory has none (an empty buffer).
        FileInfoClass::FILE_STREAM_INFORMATION => {
            let entry = [StreamEntry {
                stream_size: i.size,
                stream_allocation_size: i.allocation,
                stream_name: Utf16Str::new(DEFAULT_DATA_STREAM_NAME),
            }];
            let s = FileStreamInformationRepr {
                entries: if i.is_dir { &[] } else { &entry },
            };
            (emit_vec(s.buffer_len(), |b| s.emit(b))?, 24)
        }
        FileInfoClass::FILE_COMPRESSION_INFORMATION => fixed(
            FileCompressionInformationRepr {
                compressed_file_size: i.size,
                compression_format: 0,
                ..FileCompressionInformationRepr::default()
            }
            .to_bytes(),
        ),
        _ => return Err(STATUS_INVALID_INFO_CLASS),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(expr: &str, name: &str) -> bool {
        let e: Vec<char> = expr.chars().collect();
        let n: Vec<char> = name.chars().collect();
        name_matches(&e, &n)
    }

    #[test]
    fn star_and_question_mark_match_case_insensitively() {
        assert!(m("*", "anything.at.all"));
        assert!(m("*.txt", "Notes.TXT"));
        assert!(!m("*.txt", "notes.txt.bak"));
        assert!(m("a?c", "ABC"));
        assert!(!m("a?c", "ac"));
        assert!(m("*a*b*", "xxaYYbzz"));
        assert!(!m("*a*b*", "xxbYYazz"));
        assert!(m("file", "FILE"));
        assert!(!m("file", "files"));
        assert!(m("*", "."));
        assert!(!m("*.txt", ".."));
    }

    #[test]
    fn dos_wildcards_follow_ms_fsa() {
        // DOS_STAR stops at the last dot.
        assert!(m("<.txt", "a.b.txt"));
        assert!(m("<", "noext"));
        assert!(!m("<", "a.b"));
        assert!(m("<.*", "a.b"));
        // DOS_QM matches nothing at a dot or at the end.
        assert!(m("ab>>>", "ab"));
        assert!(m("a>>.txt", "a.txt"));
        assert!(m("a>>.txt", "abc.txt"));
        assert!(!m("a>.txt", "abc.txt"));
        // DOS_DOT is a dot, or nothing at the end.
        assert!(m("name\"", "name"));
        assert!(m("name\"txt", "name.txt"));
        assert!(!m("name\"txt", "namextxt"));
    }

    fn el(offset: u64, length: u64, flags: LockFlags) -> LockElement {
        LockElement {
            offset,
            length,
            flags,
        }
    }

    const X: LockFlags = LockFlags::EXCLUSIVE;
    const S: LockFlags = LockFlags::SHARED;

    #[test]
    fn shared_locks_share_and_exclusive_locks_exclude() {
        let t = LockTable::default();
        let a = LockOwner::new(1, 1);
        let b = LockOwner::new(2, 7);
        t.lock(9, a, [el(0, 10, S)].into_iter()).unwrap();
        t.lock(9, b, [el(5, 10, S)].into_iter()).unwrap();
        assert_eq!(
            t.lock(9, b, [el(9, 1, X)].into_iter()),
            Err(STATUS_LOCK_NOT_GRANTED)
        );
        assert_eq!(
            t.lock(9, a, [el(9, 1, X)].into_iter()),
            Err(STATUS_LOCK_NOT_GRANTED),
            "an exclusive lock over one's own shared lock conflicts too"
        );
        t.lock(9, b, [el(100, 10, X)].into_iter()).unwrap();
        assert_eq!(
            t.lock(9, a, [el(105, 1, S)].into_iter()),
            Err(STATUS_LOCK_NOT_GRANTED)
        );
        // A shared lock stacks on the owner's own exclusive lock.
        t.lock(9, b, [el(105, 1, S)].into_iter()).unwrap();
        // Adjacent ranges do not overlap.
        t.lock(9, a, [el(110, 5, X)].into_iter()).unwrap();
        assert_eq!(t.count(9), 5);
        t.release(9, b);
        assert_eq!(t.count(9), 2);
        t.release(9, a);
        assert_eq!(t.count(9), 0);
        assert_eq!(t.held.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn zero_length_ranges_follow_ms_fsa_overlap() {
        let t = LockTable::default();
        let a = LockOwner::new(1, 1);
        let b = LockOwner::new(2, 2);
        t.lock(1, a, [el(10, 10, X)].into_iter()).unwrap();
        // {0, 0} never conflicts; at the start of a range neither.
        t.lock(1, b, [el(0, 0, X)].into_iter()).unwrap();
        t.lock(1, b, [el(10, 0, X)].into_iter()).unwrap();
        // Strictly inside an exclusive range it does.
        assert_eq!(
            t.lock(1, b, [el(15, 0, S)].into_iter()),
            Err(STATUS_LOCK_NOT_GRANTED)
        );
    }

    #[test]
    fn a_failed_element_rolls_back_the_request_and_unlock_is_exact() {
        let t = LockTable::default();
        let a = LockOwner::new(1, 1);
        let b = LockOwner::new(2, 2);
        t.lock(3, a, [el(50, 10, X)].into_iter()).unwrap();
        let fi = LockFlags::FAIL_IMMEDIATELY;
        assert_eq!(
            t.lock(
                3,
                b,
                [el(0, 10, X | fi), el(20, 10, S | fi), el(55, 1, S | fi)].into_iter()
            ),
            Err(STATUS_LOCK_NOT_GRANTED)
        );
        assert_eq!(t.count(3), 1, "the first two ranges were released");
        // Two ranges of one request conflict with each other.
        assert_eq!(
            t.lock(3, b, [el(0, 10, X | fi), el(5, 1, X | fi)].into_iter()),
            Err(STATUS_LOCK_NOT_GRANTED)
        );
        let u = LockFlags::UNLOCK;
        assert_eq!(
            t.unlock(3, b, [el(50, 10, u)].into_iter()),
            Err(STATUS_RANGE_NOT_LOCKED),
            "another owner's range"
        );
        assert_eq!(
            t.unlock(3, a, [el(50, 5, u)].into_iter()),
            Err(STATUS_RANGE_NOT_LOCKED),
            "not the exact range"
        );
        t.unlock(3, a, [el(50, 10, u)].into_iter()).unwrap();
        assert_eq!(t.count(3), 0);
        assert_eq!(
            t.unlock(3, a, [el(50, 10, u)].into_iter()),
            Err(STATUS_RANGE_NOT_LOCKED)
        );
    }

    #[test]
    fn unlock_takes_the_exclusive_lock_of_a_stacked_range_first() {
        let t = LockTable::default();
        let a = LockOwner::new(1, 1);
        let b = LockOwner::new(2, 2);
        t.lock(4, a, [el(0, 10, X)].into_iter()).unwrap();
        t.lock(4, a, [el(0, 10, S)].into_iter()).unwrap();
        t.unlock(4, a, [el(0, 10, LockFlags::UNLOCK)].into_iter())
            .unwrap();
        // What is left is shared: another owner may share it.
        t.lock(4, b, [el(0, 10, S)].into_iter()).unwrap();
    }

    #[test]
    fn create_answers_maximal_access_and_on_disk_id() {
        let ctxs = [
            CreateContext::new(SMB2_CREATE_QUERY_MAXIMAL_ACCESS_REQUEST, &[]),
            CreateContext::new(SMB2_CREATE_QUERY_ON_DISK_ID, &[]),
            CreateContext::new(SMB2_CREATE_REQUEST_LEASE, &[0; 32]),
        ];
        let mut a = CreateAnswers::of(&CreateContextList::new(&ctxs)).unwrap();
        a.opened(77, 5);
        let (out, n) = a.contexts();
        assert_eq!(n, 2, "the lease is declined by silence");
        let mx = MaximalAccessResponse::parse(out[0].data).unwrap();
        assert_eq!(mx.query_status, STATUS_SUCCESS);
        assert_eq!(mx.maximal_access.bits(), FILE_ALL_ACCESS);
        let q = QueryOnDiskIdResponse::parse(out[1].data).unwrap();
        assert_eq!((q.disk_file_id, q.volume_id), (77, 5));
        let bad = [CreateContext::new(
            SMB2_CREATE_QUERY_MAXIMAL_ACCESS_REQUEST,
            &[1, 2],
        )];
        assert_eq!(
            CreateAnswers::of(&CreateContextList::new(&bad)).unwrap_err(),
            STATUS_INVALID_PARAMETER
        );
    }
}
