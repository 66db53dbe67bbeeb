//! [MS-FSCC] 2.4 file information classes a server returns to QUERY_INFO
//! (InfoType SMB2_0_INFO_FILE) and accepts in SET_INFO.
//!
//! Times are FILETIME values (100 ns since 1601-01-01 UTC, [MS-DTYP]
//! 2.3.3). In a SET_INFO FileBasicInformation a time of 0 means "do not
//! change", and -1 (all ones) "stop updating it on this handle" ([MS-FSCC]
//! FileBasicInformation; [MS-FSA] 2.1.5.14.2).

use super::super::create::{AccessMask, FileAttributes};
use super::super::error::Smb2Error;
use super::super::layout::{align8, fit, room};
use super::super::utf16::Utf16Str;
use super::super::Scalar;
use super::{need, Chain, ChainWriter};

fscc_fixed! {
    /// A zero-copy view of FILE_BASIC_INFORMATION ([MS-FSCC] 2.4.7
    /// FileBasicInformation, class 4): 40 bytes.
    view FileBasicInformation;
    /// The values of FILE_BASIC_INFORMATION (query and set).
    repr FileBasicInformationRepr;
    what: "FILE_BASIC_INFORMATION",
    len: 40,
    fields {
        /// CreationTime (FILETIME).
        creation_time, set_creation_time: u64 = 0..8;
        /// LastAccessTime (FILETIME).
        last_access_time, set_last_access_time: u64 = 8..16;
        /// LastWriteTime (FILETIME).
        last_write_time, set_last_write_time: u64 = 16..24;
        /// ChangeTime (FILETIME).
        change_time, set_change_time: u64 = 24..32;
        /// FileAttributes ([MS-FSCC] 2.6; 0 in a SET_INFO: do not change).
        file_attributes, set_file_attributes: FileAttributes = 32..36;
    }
}

fscc_fixed! {
    /// A zero-copy view of FILE_STANDARD_INFORMATION ([MS-FSCC] 2.4.45
    /// FileStandardInformation, class 5): 24 bytes.
    view FileStandardInformation;
    /// The values of FILE_STANDARD_INFORMATION.
    repr FileStandardInformationRepr;
    what: "FILE_STANDARD_INFORMATION",
    len: 24,
    fields {
        /// AllocationSize.
        allocation_size, set_allocation_size: u64 = 0..8;
        /// EndOfFile.
        end_of_file, set_end_of_file: u64 = 8..16;
        /// NumberOfLinks.
        number_of_links, set_number_of_links: u32 = 16..20;
        /// DeletePending.
        delete_pending, set_delete_pending: bool = 20..21;
        /// Directory.
        directory, set_directory: bool = 21..22;
    }
}

fscc_fixed! {
    /// A zero-copy view of FILE_INTERNAL_INFORMATION ([MS-FSCC] 2.4.26
    /// FileInternalInformation, class 6): 8 bytes.
    view FileInternalInformation;
    /// The values of FILE_INTERNAL_INFORMATION. Linux cifs uses IndexNumber
    /// as the inode number (mount option `serverino`).
    repr FileInternalInformationRepr;
    what: "FILE_INTERNAL_INFORMATION",
    len: 8,
    fields {
        /// IndexNumber: the file's 64-bit identifier on its volume.
        index_number, set_index_number: u64 = 0..8;
    }
}

fscc_fixed! {
    /// A zero-copy view of FILE_EA_INFORMATION ([MS-FSCC]
    /// FileEaInformation, class 7): 4 bytes.
    view FileEaInformation;
    /// The values of FILE_EA_INFORMATION.
    repr FileEaInformationRepr;
    what: "FILE_EA_INFORMATION",
    len: 4,
    fields {
        /// EaSize: bytes of the file's extended attributes (0: none).
        ea_size, set_ea_size: u32 = 0..4;
    }
}

fscc_fixed! {
    /// A zero-copy view of FILE_ACCESS_INFORMATION ([MS-FSCC]
    /// FileAccessInformation, class 8): 4 bytes.
    view FileAccessInformation;
    /// The values of FILE_ACCESS_INFORMATION.
    repr FileAccessInformationRepr;
    what: "FILE_ACCESS_INFORMATION",
    len: 4,
    fields {
        /// AccessFlags: the access granted to the open.
        access_flags, set_access_flags: AccessMask = 0..4;
    }
}

fscc_fixed! {
    /// A zero-copy view of FILE_POSITION_INFORMATION ([MS-FSCC]
    /// FilePositionInformation, class 14): 8 bytes.
    view FilePositionInformation;
    /// The values of FILE_POSITION_INFORMATION. [MS-SMB2] 3.3.5.20.1: a
    /// server SHOULD return CurrentByteOffset 0.
    repr FilePositionInformationRepr;
    what: "FILE_POSITION_INFORMATION",
    len: 8,
    fields {
        /// CurrentByteOffset.
        current_byte_offset, set_current_byte_offset: u64 = 0..8;
    }
}

fscc_fixed! {
    /// A zero-copy view of FILE_MODE_INFORMATION ([MS-FSCC]
    /// FileModeInformation, class 16): 4 bytes.
    view FileModeInformation;
    /// The values of FILE_MODE_INFORMATION.
    repr FileModeInformationRepr;
    what: "FILE_MODE_INFORMATION",
    len: 4,
    fields {
        /// Mode: FILE_WRITE_THROUGH (0x2), FILE_SEQUENTIAL_ONLY (0x4),
        /// FILE_NO_INTERMEDIATE_BUFFERING (0x8), FILE_SYNCHRONOUS_IO_ALERT
        /// (0x10), FILE_SYNCHRONOUS_IO_NONALERT (0x20),
        /// FILE_DELETE_ON_CLOSE (0x1000): the CreateOptions bits of the
        /// open.
        mode, set_mode: u32 = 0..4;
    }
}

fscc_fixed! {
    /// A zero-copy view of FILE_ALIGNMENT_INFORMATION ([MS-FSCC]
    /// FileAlignmentInformation, class 17): 4 bytes.
    view FileAlignmentInformation;
    /// The values of FILE_ALIGNMENT_INFORMATION.
    repr FileAlignmentInformationRepr;
    what: "FILE_ALIGNMENT_INFORMATION",
    len: 4,
    fields {
        /// AlignmentRequirement: FILE_BYTE_ALIGNMENT (0) ...
        /// FILE_512_BYTE_ALIGNMENT (0x1FF).
        alignment_requirement, set_alignment_requirement: u32 = 0..4;
    }
}

fscc_fixed! {
    /// A zero-copy view of FILE_NETWORK_OPEN_INFORMATION ([MS-FSCC]
    /// FileNetworkOpenInformation, class 34): 56 bytes.
    view FileNetworkOpenInformation;
    /// The values of FILE_NETWORK_OPEN_INFORMATION.
    repr FileNetworkOpenInformationRepr;
    what: "FILE_NETWORK_OPEN_INFORMATION",
    len: 56,
    fields {
        /// CreationTime (FILETIME).
        creation_time, set_creation_time: u64 = 0..8;
        /// LastAccessTime (FILETIME).
        last_access_time, set_last_access_time: u64 = 8..16;
        /// LastWriteTime (FILETIME).
        last_write_time, set_last_write_time: u64 = 16..24;
        /// ChangeTime (FILETIME).
        change_time, set_change_time: u64 = 24..32;
        /// AllocationSize.
        allocation_size, set_allocation_size: u64 = 32..40;
        /// EndOfFile.
        end_of_file, set_end_of_file: u64 = 40..48;
        /// FileAttributes.
        file_attributes, set_file_attributes: FileAttributes = 48..52;
    }
}

fscc_fixed! {
    /// A zero-copy view of FILE_ATTRIBUTE_TAG_INFORMATION ([MS-FSCC]
    /// FileAttributeTagInformation, class 35): 8 bytes.
    view FileAttributeTagInformation;
    /// The values of FILE_ATTRIBUTE_TAG_INFORMATION.
    repr FileAttributeTagInformationRepr;
    what: "FILE_ATTRIBUTE_TAG_INFORMATION",
    len: 8,
    fields {
        /// FileAttributes.
        file_attributes, set_file_attributes: FileAttributes = 0..4;
        /// ReparseTag ([MS-FSCC] 2.1.2.1; 0 unless REPARSE_POINT is set).
        reparse_tag, set_reparse_tag: u32 = 4..8;
    }
}

fscc_fixed! {
    /// A zero-copy view of FILE_COMPRESSION_INFORMATION ([MS-FSCC]
    /// FileCompressionInformation, class 28): 16 bytes.
    view FileCompressionInformation;
    /// The values of FILE_COMPRESSION_INFORMATION.
    repr FileCompressionInformationRepr;
    what: "FILE_COMPRESSION_INFORMATION",
    len: 16,
    fields {
        /// CompressedFileSize (EndOfFile for an uncompressed file).
        compressed_file_size, set_compressed_file_size: u64 = 0..8;
        /// CompressionFormat: COMPRESSION_FORMAT_NONE (0),
        /// COMPRESSION_FORMAT_LZNT1 (2).
        compression_format, set_compression_format: u16 = 8..10;
        /// CompressionUnitShift.
        compression_unit_shift, set_compression_unit_shift: u8 = 10..11;
        /// ChunkShift.
        chunk_shift, set_chunk_shift: u8 = 11..12;
        /// ClusterShift.
        cluster_shift, set_cluster_shift: u8 = 12..13;
    }
}

fscc_fixed! {
    /// A zero-copy view of FILE_DISPOSITION_INFORMATION ([MS-FSCC]
    /// FileDispositionInformation, class 13, SET_INFO): 1 byte.
    view FileDispositionInformation;
    /// The values of FILE_DISPOSITION_INFORMATION: mark the file for
    /// deletion when its last handle closes (or clear the mark).
    repr FileDispositionInformationRepr;
    what: "FILE_DISPOSITION_INFORMATION",
    len: 1,
    fields {
        /// DeletePending.
        delete_pending, set_delete_pending: bool = 0..1;
    }
}

fscc_fixed! {
    /// A zero-copy view of FILE_END_OF_FILE_INFORMATION ([MS-FSCC]
    /// FileEndOfFileInformation, class 20, SET_INFO): 8 bytes.
    view FileEndOfFileInformation;
    /// The values of FILE_END_OF_FILE_INFORMATION (truncate or extend).
    repr FileEndOfFileInformationRepr;
    what: "FILE_END_OF_FILE_INFORMATION",
    len: 8,
    fields {
        /// EndOfFile: the new file size.
        end_of_file, set_end_of_file: u64 = 0..8;
    }
}

fscc_fixed! {
    /// A zero-copy view of FILE_ALLOCATION_INFORMATION ([MS-FSCC]
    /// FileAllocationInformation, class 19, SET_INFO): 8 bytes.
    view FileAllocationInformation;
    /// The values of FILE_ALLOCATION_INFORMATION.
    repr FileAllocationInformationRepr;
    what: "FILE_ALLOCATION_INFORMATION",
    len: 8,
    fields {
        /// AllocationSize: bytes to reserve (a file shrinks to it when
        /// smaller than EndOfFile).
        allocation_size, set_allocation_size: u64 = 0..8;
    }
}

/// Reads a name of `len` bytes at `at`, failing with `Truncated`.
fn name_at<'a>(
    what: &'static str,
    b: &'a [u8],
    at: usize,
    len: u32,
) -> Result<Utf16Str<'a>, Smb2Error> {
    let end = at.saturating_add(len as usize);
    need(what, b, end)?;
    Ok(Utf16Str::from_utf16le(&b[at..end]))
}

/// FILE_NAME_INFORMATION ([MS-FSCC] FileNameInformation, class 9; the
/// same layout serves FileAlternateNameInformation, class 21, and
/// FileNormalizedNameInformation): FileNameLength (4), FileName.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FileNameInformationRepr<'a> {
    /// FileName: the path from the share root, starting with a backslash
    /// ("\\" for the root itself).
    pub file_name: Utf16Str<'a>,
}

impl<'a> FileNameInformationRepr<'a> {
    const WHAT: &'static str = "FILE_NAME_INFORMATION";
    /// Length of the fixed part.
    pub const FIXED_LEN: usize = 4;

    /// Checks and reads `b` (FileNameLength bytes of name must follow).
    pub fn from_bytes(b: &'a [u8]) -> Result<Self, Smb2Error> {
        need(Self::WHAT, b, Self::FIXED_LEN)?;
        Ok(FileNameInformationRepr {
            file_name: name_at(Self::WHAT, b, 4, u32::read(b, 0..4))?,
        })
    }

    /// 4 + the name.
    pub fn buffer_len(&self) -> usize {
        Self::FIXED_LEN + self.file_name.byte_len()
    }

    /// Writes the structure.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        let len = self.buffer_len();
        room(Self::WHAT, buf, len)?;
        let n: u32 = fit(Self::WHAT, "FileNameLength", self.file_name.byte_len())?;
        n.write(buf, 0..4);
        self.file_name.write_to(&mut buf[4..len]);
        Ok(len)
    }
}

/// FILE_ALL_INFORMATION ([MS-FSCC] 2.4.2 FileAllInformation, class 18):
/// Basic (40), Standard (24), Internal (8), Ea (4), Access (4), Position
/// (8), Mode (4), Alignment (4), then FILE_NAME_INFORMATION at offset 96.
/// Linux cifs fetches it (compounded CREATE + QUERY_INFO + CLOSE) for every
/// stat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FileAllInformationRepr<'a> {
    /// BasicInformation.
    pub basic: FileBasicInformationRepr,
    /// StandardInformation.
    pub standard: FileStandardInformationRepr,
    /// InternalInformation.
    pub internal: FileInternalInformationRepr,
    /// EaInformation.
    pub ea: FileEaInformationRepr,
    /// AccessInformation.
    pub access: FileAccessInformationRepr,
    /// PositionInformation.
    pub position: FilePositionInformationRepr,
    /// ModeInformation.
    pub mode: FileModeInformationRepr,
    /// AlignmentInformation.
    pub alignment: FileAlignmentInformationRepr,
    /// NameInformation's FileName.
    pub file_name: Utf16Str<'a>,
}

/// Offsets of the members of FILE_ALL_INFORMATION.
mod all_field {
    pub const BASIC: usize = 0;
    pub const STANDARD: usize = 40;
    pub const INTERNAL: usize = 64;
    pub const EA: usize = 72;
    pub const ACCESS: usize = 76;
    pub const POSITION: usize = 80;
    pub const MODE: usize = 88;
    pub const ALIGNMENT: usize = 92;
    pub const NAME: usize = 96;
}

impl<'a> FileAllInformationRepr<'a> {
    const WHAT: &'static str = "FILE_ALL_INFORMATION";
    /// Length of the fixed part (through FileNameLength): 100.
    pub const FIXED_LEN: usize = 100;

    /// Checks and reads `b`.
    pub fn from_bytes(b: &'a [u8]) -> Result<Self, Smb2Error> {
        use all_field::*;
        need(Self::WHAT, b, Self::FIXED_LEN)?;
        Ok(FileAllInformationRepr {
            basic: FileBasicInformationRepr::from_bytes(&b[BASIC..])?,
            standard: FileStandardInformationRepr::from_bytes(&b[STANDARD..])?,
            internal: FileInternalInformationRepr::from_bytes(&b[INTERNAL..])?,
            ea: FileEaInformationRepr::from_bytes(&b[EA..])?,
            access: FileAccessInformationRepr::from_bytes(&b[ACCESS..])?,
            position: FilePositionInformationRepr::from_bytes(&b[POSITION..])?,
            mode: FileModeInformationRepr::from_bytes(&b[MODE..])?,
            alignment: FileAlignmentInformationRepr::from_bytes(&b[ALIGNMENT..])?,
            file_name: name_at(Self::WHAT, b, NAME + 4, u32::read(b, NAME..NAME + 4))?,
        })
    }

    /// 100 + the name.
    pub fn buffer_len(&self) -> usize {
        Self::FIXED_LEN + self.file_name.byte_len()
    }

    /// Writes the structure.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        use all_field::*;
        let len = self.buffer_len();
        room(Self::WHAT, buf, len)?;
        let buf = &mut buf[..len];
        self.basic.emit(&mut buf[BASIC..])?;
        self.standard.emit(&mut buf[STANDARD..])?;
        self.internal.emit(&mut buf[INTERNAL..])?;
        self.ea.emit(&mut buf[EA..])?;
        self.access.emit(&mut buf[ACCESS..])?;
        self.position.emit(&mut buf[POSITION..])?;
        self.mode.emit(&mut buf[MODE..])?;
        self.alignment.emit(&mut buf[ALIGNMENT..])?;
        FileNameInformationRepr {
            file_name: self.file_name,
        }
        .emit(&mut buf[NAME..])?;
        Ok(len)
    }
}

/// FILE_RENAME_INFORMATION_TYPE_2 ([MS-FSCC] FileRenameInformation, the
/// SMB2 form; class 10, SET_INFO): ReplaceIfExists (1), Reserved (7),
/// RootDirectory (8), FileNameLength (4), FileName. FileLinkInformation
/// (class 11) has the same layout ([`FileLinkInformationRepr`]).
///
/// [MS-SMB2] 3.3.5.21.1: FileName is the full new path relative to the
/// share root; RootDirectory is reserved for SMB2 (the client sets 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FileRenameInformationRepr<'a> {
    /// ReplaceIfExists.
    pub replace_if_exists: bool,
    /// RootDirectory (0 over SMB2).
    pub root_directory: u64,
    /// FileName: the target path.
    pub file_name: Utf16Str<'a>,
}

/// FILE_LINK_INFORMATION_TYPE_2 ([MS-FSCC] FileLinkInformation, class 11):
/// the layout of [`FileRenameInformationRepr`] (ReplaceIfExists,
/// RootDirectory, the new link's path).
pub type FileLinkInformationRepr<'a> = FileRenameInformationRepr<'a>;

impl<'a> FileRenameInformationRepr<'a> {
    const WHAT: &'static str = "FILE_RENAME_INFORMATION";
    /// Length of the fixed part (through FileNameLength): 20.
    pub const FIXED_LEN: usize = 20;

    /// Checks and reads `b` (FileNameLength bytes of name must follow).
    pub fn from_bytes(b: &'a [u8]) -> Result<Self, Smb2Error> {
        need(Self::WHAT, b, Self::FIXED_LEN)?;
        Ok(FileRenameInformationRepr {
            replace_if_exists: bool::read(b, 0..1),
            root_directory: u64::read(b, 8..16),
            file_name: name_at(Self::WHAT, b, 20, u32::read(b, 16..20))?,
        })
    }

    /// 20 + the name.
    pub fn buffer_len(&self) -> usize {
        Self::FIXED_LEN + self.file_name.byte_len()
    }

    /// Writes the structure (Reserved zero).
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        let len = self.buffer_len();
        room(Self::WHAT, buf, len)?;
        let n: u32 = fit(Self::WHAT, "FileNameLength", self.file_name.byte_len())?;
        let buf = &mut buf[..len];
        buf[..Self::FIXED_LEN].fill(0);
        self.replace_if_exists.write(buf, 0..1);
        self.root_directory.write(buf, 8..16);
        n.write(buf, 16..20);
        self.file_name.write_to(&mut buf[20..]);
        Ok(len)
    }
}

/// The name of a file's default data stream as FileStreamInformation
/// reports it ([MS-FSCC] 2.1.4: `::$DATA`).
pub const DEFAULT_DATA_STREAM_NAME: &str = "::$DATA";

/// One FILE_STREAM_INFORMATION entry ([MS-FSCC] FileStreamInformation,
/// class 22): NextEntryOffset (4), StreamNameLength (4), StreamSize (8),
/// StreamAllocationSize (8), StreamName.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamEntry<'a> {
    /// StreamSize.
    pub stream_size: u64,
    /// StreamAllocationSize.
    pub stream_allocation_size: u64,
    /// StreamName (`::$DATA` for the default stream, `:name:$DATA` for a
    /// named one).
    pub stream_name: Utf16Str<'a>,
}

const STREAM_WHAT: &str = "FILE_STREAM_INFORMATION";
const STREAM_FIXED: usize = 24;

impl StreamEntry<'_> {
    fn len(&self) -> usize {
        STREAM_FIXED + self.stream_name.byte_len()
    }
}

/// FileStreamInformation to emit: the entries chained by NextEntryOffset,
/// each 8-byte aligned. A regular file on a store without named streams
/// has one entry, [`DEFAULT_DATA_STREAM_NAME`] with the file's size; a
/// directory has none (an empty buffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FileStreamInformationRepr<'a> {
    /// The streams.
    pub entries: &'a [StreamEntry<'a>],
}

impl<'a> FileStreamInformationRepr<'a> {
    /// Bytes `emit` writes (no padding after the last entry).
    pub fn buffer_len(&self) -> usize {
        let mut end = 0;
        for (i, e) in self.entries.iter().enumerate() {
            if i > 0 {
                end = align8(end);
            }
            end += e.len();
        }
        end
    }

    /// Writes the chain.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        let len = self.buffer_len();
        room(STREAM_WHAT, buf, len)?;
        let mut w = ChainWriter::default();
        for e in self.entries {
            let n: u32 = fit(STREAM_WHAT, "StreamNameLength", e.stream_name.byte_len())?;
            let elen = e.len();
            let start = w.place(elen, len).ok_or(Smb2Error::BufferTooSmall {
                what: STREAM_WHAT,
                need: len,
                have: buf.len(),
            })?;
            let d = &mut buf[start..start + elen];
            0u32.write(d, 0..4);
            n.write(d, 4..8);
            e.stream_size.write(d, 8..16);
            e.stream_allocation_size.write(d, 16..24);
            e.stream_name.write_to(&mut d[24..]);
            w.commit(buf, start, elen);
        }
        Ok(len)
    }

    /// Walks a received FileStreamInformation buffer.
    pub fn iter(bytes: &'a [u8]) -> StreamEntryIter<'a> {
        StreamEntryIter {
            chain: Chain::new(STREAM_WHAT, bytes),
        }
    }
}

/// Walks FILE_STREAM_INFORMATION entries; the first malformed one is
/// yielded as `Err` and ends the walk.
#[derive(Debug, Clone)]
pub struct StreamEntryIter<'a> {
    chain: Chain<'a>,
}

impl<'a> Iterator for StreamEntryIter<'a> {
    type Item = Result<StreamEntry<'a>, Smb2Error>;

    fn next(&mut self) -> Option<Self::Item> {
        let e = self.chain.next_entry(STREAM_FIXED, |e| {
            STREAM_FIXED.saturating_add(u32::read(e, 4..8) as usize)
        })?;
        Some(e.map(|e| StreamEntry {
            stream_size: u64::read(e, 8..16),
            stream_allocation_size: u64::read(e, 16..24),
            stream_name: Utf16Str::from_utf16le(&e[STREAM_FIXED..]),
        }))
    }
}
