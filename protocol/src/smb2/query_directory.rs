//! [MS-SMB2] 2.2.33 SMB2 QUERY_DIRECTORY Request and 2.2.34 SMB2
//! QUERY_DIRECTORY Response. The response's output is a chain of
//! [MS-FSCC] directory entries: pack it with
//! [`DirectoryEntryWriter`](super::fscc::DirectoryEntryWriter).

use super::error::Smb2Error;
use super::file_id::FileId;
use super::fscc::{DirectoryInfoClass, FileInfoClass};
use super::layout::{fit, hdr, resolve, room, slice, Region};
use super::utf16::Utf16Str;
use super::Command;

bitmask! {
    /// [MS-SMB2] 2.2.33 Flags.
    pub struct QueryDirectoryFlags(u8) {
        /// SMB2_RESTART_SCANS: restart the enumeration from the start.
        RESTART_SCANS = 0x01;
        /// SMB2_RETURN_SINGLE_ENTRY: return at most one entry.
        RETURN_SINGLE_ENTRY = 0x02;
        /// SMB2_INDEX_SPECIFIED: resume at FileIndex.
        INDEX_SPECIFIED = 0x04;
        /// SMB2_REOPEN: restart with a new search pattern.
        REOPEN = 0x10;
    }
}

/// Byte ranges of [MS-SMB2] 2.2.33.
mod req_field {
    use crate::smb2::Field;
    pub const FILE_INFORMATION_CLASS: Field = 2..3;
    pub const FLAGS: Field = 3..4;
    pub const FILE_INDEX: Field = 4..8;
    pub const FILE_ID: Field = 8..24;
    pub const FILE_NAME_OFFSET: Field = 24..26;
    pub const FILE_NAME_LENGTH: Field = 26..28;
    pub const OUTPUT_BUFFER_LENGTH: Field = 28..32;
    /// Buffer starts here.
    pub const BUFFER: usize = 32;
}

body_view! {
    /// A zero-copy view of an SMB2 QUERY_DIRECTORY Request body ([MS-SMB2]
    /// 2.2.33). `new_checked` verifies the search pattern (inside the body,
    /// after the fixed part).
    pub struct QueryDirectoryRequest;
    what: "SMB2 QUERY_DIRECTORY request",
    structure_size: 33,
    accessors {
        /// FileInformationClass.
        file_information_class, set_file_information_class: FileInfoClass = req_field::FILE_INFORMATION_CLASS;
        /// Flags.
        flags, set_flags: QueryDirectoryFlags = req_field::FLAGS;
        /// FileIndex (meaningful with SMB2_INDEX_SPECIFIED).
        file_index, set_file_index: u32 = req_field::FILE_INDEX;
        /// FileId (of a directory open).
        file_id, set_file_id: FileId = req_field::FILE_ID;
        /// FileNameOffset, from the header.
        file_name_offset, set_file_name_offset: u16 = req_field::FILE_NAME_OFFSET;
        /// FileNameLength, in bytes.
        file_name_length, set_file_name_length: u16 = req_field::FILE_NAME_LENGTH;
        /// OutputBufferLength: the most output the client accepts.
        output_buffer_length, set_output_buffer_length: u32 = req_field::OUTPUT_BUFFER_LENGTH;
    }
}

impl<T: AsRef<[u8]>> QueryDirectoryRequest<T> {
    fn name_region(&self) -> Region {
        Region::new(
            "FileNameOffset",
            u64::from(self.file_name_offset()),
            u64::from(self.file_name_length()),
        )
    }

    fn check_variable(&self) -> Result<(), Smb2Error> {
        let b = self.buffer.as_ref();
        resolve(Self::WHAT, b.len(), Self::FIXED_LEN, self.name_region()).map(|_| ())
    }

    /// The search pattern (`*` and `?` are wildcards; empty means `*`,
    /// [MS-FSA] 2.1.5.6).
    pub fn file_name(&self) -> Utf16Str<'_> {
        Utf16Str::from_utf16le(slice(
            self.buffer.as_ref(),
            Self::FIXED_LEN,
            self.name_region(),
        ))
    }
}

/// The values of an SMB2 QUERY_DIRECTORY Request ([MS-SMB2] 2.2.33).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueryDirectoryRequestRepr<'a> {
    /// FileInformationClass.
    pub file_information_class: FileInfoClass,
    /// Flags.
    pub flags: QueryDirectoryFlags,
    /// FileIndex.
    pub file_index: u32,
    /// FileId.
    pub file_id: FileId,
    /// The search pattern.
    pub file_name: Utf16Str<'a>,
    /// OutputBufferLength.
    pub output_buffer_length: u32,
}

impl<'a> QueryDirectoryRequestRepr<'a> {
    /// Reads a checked view.
    pub fn parse(v: &QueryDirectoryRequest<&'a [u8]>) -> Result<Self, Smb2Error> {
        v.check()?;
        let b: &'a [u8] = v.buffer;
        Ok(QueryDirectoryRequestRepr {
            file_information_class: v.file_information_class(),
            flags: v.flags(),
            file_index: v.file_index(),
            file_id: v.file_id(),
            file_name: Utf16Str::from_utf16le(slice(
                b,
                QueryDirectoryRequest::<&[u8]>::FIXED_LEN,
                v.name_region(),
            )),
            output_buffer_length: v.output_buffer_length(),
        })
    }

    /// The entry layout to answer with, `None` for a class this crate does
    /// not encode.
    pub fn directory_class(&self) -> Option<DirectoryInfoClass> {
        DirectoryInfoClass::from_class(self.file_information_class)
    }

    /// True when the enumeration restarts (SMB2_RESTART_SCANS or
    /// SMB2_REOPEN, [MS-SMB2] 3.3.5.18).
    pub fn restarts(&self) -> bool {
        self.flags
            .intersects(QueryDirectoryFlags::RESTART_SCANS | QueryDirectoryFlags::REOPEN)
    }

    /// [MS-SMB2] 3.3.5.18: OutputBufferLength at most `max_transact_size`
    /// (a SHOULD; STATUS_INVALID_PARAMETER).
    pub fn check_request_rules(&self, max_transact_size: u32) -> Result<(), Smb2Error> {
        if self.output_buffer_length > max_transact_size {
            return Err(Smb2Error::Malformed {
                what: "SMB2 QUERY_DIRECTORY request",
                field: "OutputBufferLength (> MaxTransactSize)",
            });
        }
        Ok(())
    }

    /// Fixed part, then the pattern at header offset 96 (at least 33
    /// bytes).
    pub fn buffer_len(&self) -> usize {
        (req_field::BUFFER + self.file_name.byte_len()).max(33)
    }

    /// Writes the request (FileNameOffset 96 even for an empty pattern).
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        const WHAT: &str = "SMB2 QUERY_DIRECTORY request";
        let len = self.buffer_len();
        room(WHAT, buf, len)?;
        let name_len: u16 = fit(WHAT, "FileNameLength", self.file_name.byte_len())?;
        let buf = &mut buf[..len];
        buf.fill(0);
        let mut v = QueryDirectoryRequest::new_unchecked(&mut *buf);
        v.set_structure_size(33);
        v.set_file_information_class(self.file_information_class);
        v.set_flags(self.flags);
        v.set_file_index(self.file_index);
        v.set_file_id(self.file_id);
        v.set_file_name_offset(hdr(req_field::BUFFER) as u16);
        v.set_file_name_length(name_len);
        v.set_output_buffer_length(self.output_buffer_length);
        self.file_name.write_to(&mut buf[req_field::BUFFER..]);
        Ok(len)
    }
}

impl_body!(
    QueryDirectoryRequestRepr<'a>,
    QueryDirectoryRequest,
    Some(Command::QueryDirectory)
);

output_buffer_response! {
    /// A zero-copy view of an SMB2 QUERY_DIRECTORY Response body ([MS-SMB2]
    /// 2.2.34).
    view QueryDirectoryResponse;
    /// The values of an SMB2 QUERY_DIRECTORY Response ([MS-SMB2] 2.2.34):
    /// the packed entries (walk them with
    /// [`DirectoryEntryIter`](super::fscc::DirectoryEntryIter)).
    repr QueryDirectoryResponseRepr;
    what: "SMB2 QUERY_DIRECTORY response",
    command: Some(Command::QueryDirectory)
}
