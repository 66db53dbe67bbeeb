//! Directory enumeration classes ([MS-FSCC] 2.4; the FileInformationClass
//! values [MS-SMB2] 2.2.33 allows) and the packing of a QUERY_DIRECTORY
//! output buffer ([MS-SMB2] 3.3.5.18).
//!
//! Every class is a list of entries chained by NextEntryOffset: "each MUST
//! be aligned on an 8-byte boundary", NextEntryOffset is 0 on the last and
//! "no padding is required following the last data element" ([MS-FSCC]
//! 2.4.10 FileDirectoryInformation and its siblings). Layouts, by byte
//! offset (all little-endian):
//!
//! | class (value)                 | common 0..64 | EaSize | ShortName | FileId | FileName |
//! |-------------------------------|--------------|--------|-----------|--------|----------|
//! | FileDirectoryInformation (1)  | yes          | -      | -         | -      | 64       |
//! | FileFullDirectoryInformation (2) | yes       | 64     | -         | -      | 68       |
//! | FileBothDirectoryInformation (3) | yes       | 64     | 68..94    | -      | 94       |
//! | FileNamesInformation (12)     | see below    | -      | -         | -      | 12       |
//! | FileIdBothDirectoryInformation (37) | yes    | 64     | 68..94    | 96     | 104      |
//! | FileIdFullDirectoryInformation (38) | yes    | 64     | -         | 72     | 80       |
//!
//! The common part is NextEntryOffset (0), FileIndex (4), CreationTime (8),
//! LastAccessTime (16), LastWriteTime (24), ChangeTime (32), EndOfFile
//! (40), AllocationSize (48), FileAttributes (56), FileNameLength (60).
//! FileNamesInformation is NextEntryOffset (0), FileIndex (4),
//! FileNameLength (8), FileName (12). ShortName is ShortNameLength (1),
//! Reserved (1), ShortName (24 bytes, 12 UTF-16 units); FileIdBoth has 2
//! reserved bytes before its FileId, FileIdFull 4.

use super::super::create::FileAttributes;
use super::super::error::Smb2Error;
use super::super::layout::fit;
use super::super::utf16::Utf16Str;
use super::super::Scalar;
use super::classes::FileInfoClass;
use super::{Chain, ChainWriter};

/// The directory enumeration classes this crate encodes ([MS-SMB2] 2.2.33
/// FileInformationClass).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DirectoryInfoClass {
    /// FileDirectoryInformation ([MS-FSCC] 2.4.10, class 1).
    Directory,
    /// FileFullDirectoryInformation ([MS-FSCC] 2.4.14, class 2).
    FullDirectory,
    /// FileBothDirectoryInformation ([MS-FSCC] 2.4.8, class 3).
    BothDirectory,
    /// FileNamesInformation ([MS-FSCC] 2.4.32, class 12).
    Names,
    /// FileIdBothDirectoryInformation ([MS-FSCC] FileIdBothDirectoryInformation, class 37).
    IdBothDirectory,
    /// FileIdFullDirectoryInformation ([MS-FSCC] 2.4.23, class 38).
    IdFullDirectory,
}

impl DirectoryInfoClass {
    /// The class a QUERY_DIRECTORY FileInformationClass names, or `None`
    /// for one this crate does not encode (a server answers
    /// STATUS_INVALID_INFO_CLASS for a class [MS-FSCC] does not define for
    /// directories, STATUS_NOT_SUPPORTED otherwise).
    pub const fn from_class(c: FileInfoClass) -> Option<Self> {
        Some(match c {
            FileInfoClass::FILE_DIRECTORY_INFORMATION => DirectoryInfoClass::Directory,
            FileInfoClass::FILE_FULL_DIRECTORY_INFORMATION => DirectoryInfoClass::FullDirectory,
            FileInfoClass::FILE_BOTH_DIRECTORY_INFORMATION => DirectoryInfoClass::BothDirectory,
            FileInfoClass::FILE_NAMES_INFORMATION => DirectoryInfoClass::Names,
            FileInfoClass::FILE_ID_BOTH_DIRECTORY_INFORMATION => {
                DirectoryInfoClass::IdBothDirectory
            }
            FileInfoClass::FILE_ID_FULL_DIRECTORY_INFORMATION => {
                DirectoryInfoClass::IdFullDirectory
            }
            _ => return None,
        })
    }

    /// The wire class number.
    pub const fn class(self) -> FileInfoClass {
        match self {
            DirectoryInfoClass::Directory => FileInfoClass::FILE_DIRECTORY_INFORMATION,
            DirectoryInfoClass::FullDirectory => FileInfoClass::FILE_FULL_DIRECTORY_INFORMATION,
            DirectoryInfoClass::BothDirectory => FileInfoClass::FILE_BOTH_DIRECTORY_INFORMATION,
            DirectoryInfoClass::Names => FileInfoClass::FILE_NAMES_INFORMATION,
            DirectoryInfoClass::IdBothDirectory => {
                FileInfoClass::FILE_ID_BOTH_DIRECTORY_INFORMATION
            }
            DirectoryInfoClass::IdFullDirectory => {
                FileInfoClass::FILE_ID_FULL_DIRECTORY_INFORMATION
            }
        }
    }

    /// Offset of FileName: the length of an entry without its name.
    /// [MS-FSA] 2.1.5.6.3.x: an OutputBufferLength below this is
    /// STATUS_INFO_LENGTH_MISMATCH.
    pub const fn fixed_len(self) -> usize {
        match self {
            DirectoryInfoClass::Directory => 64,
            DirectoryInfoClass::FullDirectory => 68,
            DirectoryInfoClass::BothDirectory => 94,
            DirectoryInfoClass::Names => 12,
            DirectoryInfoClass::IdBothDirectory => 104,
            DirectoryInfoClass::IdFullDirectory => 80,
        }
    }

    const fn what(self) -> &'static str {
        match self {
            DirectoryInfoClass::Directory => "FILE_DIRECTORY_INFORMATION",
            DirectoryInfoClass::FullDirectory => "FILE_FULL_DIR_INFORMATION",
            DirectoryInfoClass::BothDirectory => "FILE_BOTH_DIR_INFORMATION",
            DirectoryInfoClass::Names => "FILE_NAMES_INFORMATION",
            DirectoryInfoClass::IdBothDirectory => "FILE_ID_BOTH_DIR_INFORMATION",
            DirectoryInfoClass::IdFullDirectory => "FILE_ID_FULL_DIR_INFORMATION",
        }
    }

    /// Offset of FileNameLength.
    const fn name_length_at(self) -> usize {
        match self {
            DirectoryInfoClass::Names => 8,
            _ => 60,
        }
    }

    const fn has_times(self) -> bool {
        !matches!(self, DirectoryInfoClass::Names)
    }

    const fn has_ea_size(self) -> bool {
        !matches!(
            self,
            DirectoryInfoClass::Directory | DirectoryInfoClass::Names
        )
    }

    const fn has_short_name(self) -> bool {
        matches!(
            self,
            DirectoryInfoClass::BothDirectory | DirectoryInfoClass::IdBothDirectory
        )
    }

    /// Offset of the 8-byte FileId, for the two Id classes.
    const fn file_id_at(self) -> Option<usize> {
        match self {
            DirectoryInfoClass::IdBothDirectory => Some(96),
            DirectoryInfoClass::IdFullDirectory => Some(72),
            _ => None,
        }
    }
}

/// Byte ranges of the common part.
mod field {
    use crate::smb2::Field;
    pub const FILE_INDEX: Field = 4..8;
    pub const CREATION_TIME: Field = 8..16;
    pub const LAST_ACCESS_TIME: Field = 16..24;
    pub const LAST_WRITE_TIME: Field = 24..32;
    pub const CHANGE_TIME: Field = 32..40;
    pub const END_OF_FILE: Field = 40..48;
    pub const ALLOCATION_SIZE: Field = 48..56;
    pub const FILE_ATTRIBUTES: Field = 56..60;
    pub const EA_SIZE: Field = 64..68;
    pub const SHORT_NAME_LENGTH: Field = 68..69;
    pub const SHORT_NAME: usize = 70;
    /// ShortName is 24 bytes (12 UTF-16 code units).
    pub const SHORT_NAME_MAX: usize = 24;
}

/// One directory entry, the union of what the six classes carry. On emit a
/// class writes only its own fields; on parse the fields a class lacks are
/// zero / empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DirectoryEntry<'a> {
    /// FileIndex (0 on stores where a file's position in its directory is
    /// not fixed).
    pub file_index: u32,
    /// CreationTime (FILETIME).
    pub creation_time: u64,
    /// LastAccessTime (FILETIME).
    pub last_access_time: u64,
    /// LastWriteTime (FILETIME).
    pub last_write_time: u64,
    /// ChangeTime (FILETIME).
    pub change_time: u64,
    /// EndOfFile.
    pub end_of_file: u64,
    /// AllocationSize.
    pub allocation_size: u64,
    /// FileAttributes.
    pub file_attributes: FileAttributes,
    /// EaSize (the reparse tag instead when FileAttributes has
    /// REPARSE_POINT).
    pub ea_size: u32,
    /// ShortName (8.3 name, at most 24 bytes; empty when there is none).
    pub short_name: Utf16Str<'a>,
    /// FileId: the 8-byte file reference number (FileInternalInformation's
    /// IndexNumber).
    pub file_id: u64,
    /// FileName (the entry's name, not a path).
    pub file_name: Utf16Str<'a>,
}

impl<'a> DirectoryEntry<'a> {
    /// Bytes of this entry in `class` (without trailing alignment).
    pub fn buffer_len(&self, class: DirectoryInfoClass) -> usize {
        class.fixed_len() + self.file_name.byte_len()
    }

    /// Checks the entry can be written in `class`.
    fn check_emit(&self, class: DirectoryInfoClass) -> Result<u32, Smb2Error> {
        let what = class.what();
        if class.has_short_name() && self.short_name.byte_len() > field::SHORT_NAME_MAX {
            return Err(Smb2Error::TooLarge {
                what,
                field: "ShortNameLength",
                value: self.short_name.byte_len() as u64,
                max: field::SHORT_NAME_MAX as u64,
            });
        }
        fit(what, "FileNameLength", self.file_name.byte_len())
    }

    /// Writes the entry at the start of `dst` (exactly `buffer_len` bytes)
    /// with NextEntryOffset 0.
    fn write(&self, class: DirectoryInfoClass, dst: &mut [u8], name_len: u32) {
        let fixed = class.fixed_len();
        dst[..fixed].fill(0);
        self.file_index.write(dst, field::FILE_INDEX);
        let nl = class.name_length_at();
        name_len.write(dst, nl..nl + 4);
        if class.has_times() {
            self.creation_time.write(dst, field::CREATION_TIME);
            self.last_access_time.write(dst, field::LAST_ACCESS_TIME);
            self.last_write_time.write(dst, field::LAST_WRITE_TIME);
            self.change_time.write(dst, field::CHANGE_TIME);
            self.end_of_file.write(dst, field::END_OF_FILE);
            self.allocation_size.write(dst, field::ALLOCATION_SIZE);
            self.file_attributes.write(dst, field::FILE_ATTRIBUTES);
        }
        if class.has_ea_size() {
            self.ea_size.write(dst, field::EA_SIZE);
        }
        if class.has_short_name() {
            let n = self.short_name.byte_len();
            (n as u8).write(dst, field::SHORT_NAME_LENGTH);
            self.short_name
                .write_to(&mut dst[field::SHORT_NAME..field::SHORT_NAME + n]);
        }
        if let Some(at) = class.file_id_at() {
            self.file_id.write(dst, at..at + 8);
        }
        self.file_name.write_to(&mut dst[fixed..]);
    }

    /// Reads one entry (the bytes the chain walker delimited: fixed part
    /// and name present).
    fn read(class: DirectoryInfoClass, e: &'a [u8]) -> Result<Self, Smb2Error> {
        let fixed = class.fixed_len();
        let mut d = DirectoryEntry {
            file_index: u32::read(e, field::FILE_INDEX),
            file_name: Utf16Str::from_utf16le(e.get(fixed..).unwrap_or(&[])),
            ..DirectoryEntry::default()
        };
        if class.has_times() {
            d.creation_time = u64::read(e, field::CREATION_TIME);
            d.last_access_time = u64::read(e, field::LAST_ACCESS_TIME);
            d.last_write_time = u64::read(e, field::LAST_WRITE_TIME);
            d.change_time = u64::read(e, field::CHANGE_TIME);
            d.end_of_file = u64::read(e, field::END_OF_FILE);
            d.allocation_size = u64::read(e, field::ALLOCATION_SIZE);
            d.file_attributes = FileAttributes::read(e, field::FILE_ATTRIBUTES);
        }
        if class.has_ea_size() {
            d.ea_size = u32::read(e, field::EA_SIZE);
        }
        if class.has_short_name() {
            let n = usize::from(u8::read(e, field::SHORT_NAME_LENGTH));
            if n > field::SHORT_NAME_MAX {
                return Err(Smb2Error::Malformed {
                    what: class.what(),
                    field: "ShortNameLength (> 24)",
                });
            }
            d.short_name = Utf16Str::from_utf16le(&e[field::SHORT_NAME..field::SHORT_NAME + n]);
        }
        if let Some(at) = class.file_id_at() {
            d.file_id = u64::read(e, at..at + 8);
        }
        Ok(d)
    }
}

/// Packs directory entries into a QUERY_DIRECTORY output buffer
/// ([MS-SMB2] 3.3.5.18): each entry 8-byte aligned, the previous entry's
/// NextEntryOffset pointing at it, the last one's 0, and an entry that
/// does not fit in the remaining room is not written at all. Allocation
/// free: it writes into the caller's buffer.
///
/// Give it a buffer of `min(OutputBufferLength, room in the response)`
/// bytes; [`len`](Self::len) is then the response's OutputBufferLength.
#[derive(Debug)]
pub struct DirectoryEntryWriter<'b> {
    buf: &'b mut [u8],
    class: DirectoryInfoClass,
    chain: ChainWriter,
}

impl<'b> DirectoryEntryWriter<'b> {
    /// A writer of `class` entries into `buf`.
    pub fn new(class: DirectoryInfoClass, buf: &'b mut [u8]) -> Self {
        DirectoryEntryWriter {
            buf,
            class,
            chain: ChainWriter::default(),
        }
    }

    /// Appends `entry` if it fits: `Ok(true)` when written, `Ok(false)`
    /// when it does not fit (nothing written; the enumeration resumes with
    /// this entry next time). `Err` only for an entry no buffer could hold
    /// (a ShortName over 24 bytes, a name over 4 GiB).
    ///
    /// When the very first entry does not fit, the caller answers per
    /// [MS-FSA] 2.1.5.6.3: STATUS_INFO_LENGTH_MISMATCH if the buffer is
    /// shorter than [`DirectoryInfoClass::fixed_len`], otherwise
    /// STATUS_BUFFER_OVERFLOW.
    pub fn push(&mut self, entry: &DirectoryEntry<'_>) -> Result<bool, Smb2Error> {
        let name_len = entry.check_emit(self.class)?;
        let len = entry.buffer_len(self.class);
        let Some(start) = self.chain.place(len, self.buf.len()) else {
            return Ok(false);
        };
        entry.write(self.class, &mut self.buf[start..start + len], name_len);
        self.chain.commit(self.buf, start, len);
        Ok(true)
    }

    /// Entries written.
    pub fn count(&self) -> usize {
        self.chain.count
    }

    /// Bytes used: the end of the last entry (no trailing padding).
    pub fn len(&self) -> usize {
        self.chain.end
    }

    /// True when nothing was written.
    pub fn is_empty(&self) -> bool {
        self.chain.count == 0
    }

    /// The class being written.
    pub fn class(&self) -> DirectoryInfoClass {
        self.class
    }

    /// The bytes written so far.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.chain.end]
    }
}

/// Packs as many of `entries` as fit into `buf` (at most one when
/// `return_single_entry`, [MS-SMB2] 2.2.33 SMB2_RETURN_SINGLE_ENTRY),
/// stopping at the first that does not fit. Returns (entries written,
/// bytes used).
pub fn pack_directory_entries<'e, I>(
    class: DirectoryInfoClass,
    entries: I,
    buf: &mut [u8],
    return_single_entry: bool,
) -> Result<(usize, usize), Smb2Error>
where
    I: IntoIterator<Item = DirectoryEntry<'e>>,
{
    let mut w = DirectoryEntryWriter::new(class, buf);
    for e in entries {
        if !w.push(&e)? || return_single_entry {
            break;
        }
    }
    Ok((w.count(), w.len()))
}

/// Walks a received directory enumeration buffer of `class` entries; the
/// first malformed entry (NextEntryOffset not a multiple of 8 or past the
/// buffer, a name past the entry's end, ShortNameLength over 24) is
/// yielded as `Err` and ends the walk.
#[derive(Debug, Clone)]
pub struct DirectoryEntryIter<'a> {
    class: DirectoryInfoClass,
    chain: Chain<'a>,
}

impl<'a> DirectoryEntryIter<'a> {
    /// Walks `bytes` (a QUERY_DIRECTORY response's output buffer).
    pub fn new(class: DirectoryInfoClass, bytes: &'a [u8]) -> Self {
        DirectoryEntryIter {
            class,
            chain: Chain::new(class.what(), bytes),
        }
    }
}

impl<'a> Iterator for DirectoryEntryIter<'a> {
    type Item = Result<DirectoryEntry<'a>, Smb2Error>;

    fn next(&mut self) -> Option<Self::Item> {
        let class = self.class;
        let fixed = class.fixed_len();
        let nl = class.name_length_at();
        let e = self.chain.next_entry(fixed, |e| {
            fixed.saturating_add(u32::read(e, nl..nl + 4) as usize)
        })?;
        let r = e.and_then(|e| DirectoryEntry::read(class, e));
        if r.is_err() {
            // A bad ShortNameLength ends the walk too.
            self.chain = Chain::new(class.what(), &[]);
        }
        Some(r)
    }
}
