//! [MS-SMB2] 2.2.15 SMB2 CLOSE Request and 2.2.16 SMB2 CLOSE Response.

use super::create::FileAttributes;
use super::error::Smb2Error;
use super::file_id::FileId;
use super::layout::room;
use super::Command;

bitmask! {
    /// [MS-SMB2] 2.2.15 / 2.2.16 Flags.
    pub struct CloseFlags(u16) {
        /// SMB2_CLOSE_FLAG_POSTQUERY_ATTRIB: return the attributes.
        POSTQUERY_ATTRIB = 0x0001;
    }
}

/// Byte ranges of [MS-SMB2] 2.2.15.
mod req_field {
    use crate::smb2::Field;
    pub const FLAGS: Field = 2..4;
    pub const RESERVED: Field = 4..8;
    pub const FILE_ID: Field = 8..24;
}

body_view! {
    /// A zero-copy view of an SMB2 CLOSE Request body ([MS-SMB2] 2.2.15).
    pub struct CloseRequest;
    what: "SMB2 CLOSE request",
    structure_size: 24,
    accessors {
        /// Flags.
        flags, set_flags: CloseFlags = req_field::FLAGS;
        /// Reserved.
        reserved, set_reserved: u32 = req_field::RESERVED;
        /// FileId.
        file_id, set_file_id: FileId = req_field::FILE_ID;
    }
}

impl<T: AsRef<[u8]>> CloseRequest<T> {
    fn check_variable(&self) -> Result<(), Smb2Error> {
        Ok(())
    }
}

/// The values of an SMB2 CLOSE Request ([MS-SMB2] 2.2.15).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CloseRequestRepr {
    /// Flags.
    pub flags: CloseFlags,
    /// FileId.
    pub file_id: FileId,
}

impl CloseRequestRepr {
    /// Reads a checked view.
    pub fn parse<T: AsRef<[u8]>>(v: &CloseRequest<T>) -> Result<Self, Smb2Error> {
        v.check()?;
        Ok(CloseRequestRepr {
            flags: v.flags(),
            file_id: v.file_id(),
        })
    }

    /// 24 bytes.
    pub const fn buffer_len(&self) -> usize {
        24
    }

    /// Writes the request.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        room("SMB2 CLOSE request", buf, 24)?;
        let buf = &mut buf[..24];
        buf.fill(0);
        let mut v = CloseRequest::new_unchecked(buf);
        v.set_structure_size(24);
        v.set_flags(self.flags);
        v.set_file_id(self.file_id);
        Ok(24)
    }
}

impl_body!(CloseRequestRepr, CloseRequest, Some(Command::Close));

/// Byte ranges of [MS-SMB2] 2.2.16.
mod rsp_field {
    use crate::smb2::Field;
    pub const FLAGS: Field = 2..4;
    pub const RESERVED: Field = 4..8;
    pub const CREATION_TIME: Field = 8..16;
    pub const LAST_ACCESS_TIME: Field = 16..24;
    pub const LAST_WRITE_TIME: Field = 24..32;
    pub const CHANGE_TIME: Field = 32..40;
    pub const ALLOCATION_SIZE: Field = 40..48;
    pub const END_OF_FILE: Field = 48..56;
    pub const FILE_ATTRIBUTES: Field = 56..60;
}

body_view! {
    /// A zero-copy view of an SMB2 CLOSE Response body ([MS-SMB2] 2.2.16).
    pub struct CloseResponse;
    what: "SMB2 CLOSE response",
    structure_size: 60,
    accessors {
        /// Flags.
        flags, set_flags: CloseFlags = rsp_field::FLAGS;
        /// Reserved.
        reserved, set_reserved: u32 = rsp_field::RESERVED;
        /// CreationTime (FILETIME).
        creation_time, set_creation_time: u64 = rsp_field::CREATION_TIME;
        /// LastAccessTime (FILETIME).
        last_access_time, set_last_access_time: u64 = rsp_field::LAST_ACCESS_TIME;
        /// LastWriteTime (FILETIME).
        last_write_time, set_last_write_time: u64 = rsp_field::LAST_WRITE_TIME;
        /// ChangeTime (FILETIME).
        change_time, set_change_time: u64 = rsp_field::CHANGE_TIME;
        /// AllocationSize.
        allocation_size, set_allocation_size: u64 = rsp_field::ALLOCATION_SIZE;
        /// EndofFile.
        end_of_file, set_end_of_file: u64 = rsp_field::END_OF_FILE;
        /// FileAttributes.
        file_attributes, set_file_attributes: FileAttributes = rsp_field::FILE_ATTRIBUTES;
    }
}

impl<T: AsRef<[u8]>> CloseResponse<T> {
    fn check_variable(&self) -> Result<(), Smb2Error> {
        Ok(())
    }
}

/// The values of an SMB2 CLOSE Response ([MS-SMB2] 2.2.16). Without
/// SMB2_CLOSE_FLAG_POSTQUERY_ATTRIB every attribute field is 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CloseResponseRepr {
    /// Flags.
    pub flags: CloseFlags,
    /// CreationTime (FILETIME).
    pub creation_time: u64,
    /// LastAccessTime (FILETIME).
    pub last_access_time: u64,
    /// LastWriteTime (FILETIME).
    pub last_write_time: u64,
    /// ChangeTime (FILETIME).
    pub change_time: u64,
    /// AllocationSize.
    pub allocation_size: u64,
    /// EndofFile.
    pub end_of_file: u64,
    /// FileAttributes.
    pub file_attributes: FileAttributes,
}

impl CloseResponseRepr {
    /// Reads a checked view.
    pub fn parse<T: AsRef<[u8]>>(v: &CloseResponse<T>) -> Result<Self, Smb2Error> {
        v.check()?;
        Ok(CloseResponseRepr {
            flags: v.flags(),
            creation_time: v.creation_time(),
            last_access_time: v.last_access_time(),
            last_write_time: v.last_write_time(),
            change_time: v.change_time(),
            allocation_size: v.allocation_size(),
            end_of_file: v.end_of_file(),
            file_attributes: v.file_attributes(),
        })
    }

    /// 60 bytes.
    pub const fn buffer_len(&self) -> usize {
        60
    }

    /// Writes the response.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        room("SMB2 CLOSE response", buf, 60)?;
        let buf = &mut buf[..60];
        buf.fill(0);
        let mut v = CloseResponse::new_unchecked(buf);
        v.set_structure_size(60);
        v.set_flags(self.flags);
        v.set_creation_time(self.creation_time);
        v.set_last_access_time(self.last_access_time);
        v.set_last_write_time(self.last_write_time);
        v.set_change_time(self.change_time);
        v.set_allocation_size(self.allocation_size);
        v.set_end_of_file(self.end_of_file);
        v.set_file_attributes(self.file_attributes);
        Ok(60)
    }
}

impl_body!(CloseResponseRepr, CloseResponse, Some(Command::Close));
