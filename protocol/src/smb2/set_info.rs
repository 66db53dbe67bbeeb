//! [MS-SMB2] 2.2.39 SMB2 SET_INFO Request and 2.2.40 SMB2 SET_INFO
//! Response. The buffer is an [MS-FSCC] structure ([`super::fscc`]) for
//! InfoType FILE and FILESYSTEM: decode it with the class's `from_bytes`,
//! and answer a decode failure with
//! [`info_length_status`](super::fscc::info_length_status).

use super::error::Smb2Error;
use super::file_id::FileId;
use super::fscc::{FileInfoClass, FsInfoClass};
use super::layout::{fit, hdr, resolve, room, slice, Region};
use super::query_info::{AdditionalInformation, InfoType};
use super::Command;

/// Byte ranges of [MS-SMB2] 2.2.39.
mod req_field {
    use crate::smb2::Field;
    pub const INFO_TYPE: Field = 2..3;
    pub const FILE_INFO_CLASS: Field = 3..4;
    pub const BUFFER_LENGTH: Field = 4..8;
    pub const BUFFER_OFFSET: Field = 8..10;
    pub const RESERVED: Field = 10..12;
    pub const ADDITIONAL_INFORMATION: Field = 12..16;
    pub const FILE_ID: Field = 16..32;
    /// Buffer starts here.
    pub const BUFFER: usize = 32;
}

body_view! {
    /// A zero-copy view of an SMB2 SET_INFO Request body ([MS-SMB2]
    /// 2.2.39). `new_checked` verifies the buffer (inside the body, after
    /// the fixed part).
    pub struct SetInfoRequest;
    what: "SMB2 SET_INFO request",
    structure_size: 33,
    accessors {
        /// InfoType.
        info_type, set_info_type: InfoType = req_field::INFO_TYPE;
        /// FileInfoClass (by InfoType; 0 for SECURITY and QUOTA).
        file_info_class, set_file_info_class: u8 = req_field::FILE_INFO_CLASS;
        /// BufferLength.
        buffer_length, set_buffer_length: u32 = req_field::BUFFER_LENGTH;
        /// BufferOffset, from the header.
        buffer_offset, set_buffer_offset: u16 = req_field::BUFFER_OFFSET;
        /// Reserved.
        reserved, set_reserved: u16 = req_field::RESERVED;
        /// AdditionalInformation (security parts for InfoType SECURITY).
        additional_information, set_additional_information: u32 = req_field::ADDITIONAL_INFORMATION;
        /// FileId.
        file_id, set_file_id: FileId = req_field::FILE_ID;
    }
}

impl<T: AsRef<[u8]>> SetInfoRequest<T> {
    fn buffer_region(&self) -> Region {
        Region::new(
            "BufferOffset",
            u64::from(self.buffer_offset()),
            u64::from(self.buffer_length()),
        )
    }

    fn check_variable(&self) -> Result<(), Smb2Error> {
        let b = self.buffer.as_ref();
        resolve(Self::WHAT, b.len(), Self::FIXED_LEN, self.buffer_region()).map(|_| ())
    }

    /// The information to set.
    pub fn data(&self) -> &[u8] {
        slice(self.buffer.as_ref(), Self::FIXED_LEN, self.buffer_region())
    }
}

/// The values of an SMB2 SET_INFO Request ([MS-SMB2] 2.2.39).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetInfoRequestRepr<'a> {
    /// InfoType.
    pub info_type: InfoType,
    /// FileInfoClass.
    pub file_info_class: u8,
    /// The buffer (BufferOffset/BufferLength).
    pub data: &'a [u8],
    /// AdditionalInformation.
    pub additional_information: u32,
    /// FileId.
    pub file_id: FileId,
}

impl<'a> SetInfoRequestRepr<'a> {
    /// Reads a checked view.
    pub fn parse(v: &SetInfoRequest<&'a [u8]>) -> Result<Self, Smb2Error> {
        v.check()?;
        let b: &'a [u8] = v.buffer;
        Ok(SetInfoRequestRepr {
            info_type: v.info_type(),
            file_info_class: v.file_info_class(),
            data: slice(b, SetInfoRequest::<&[u8]>::FIXED_LEN, v.buffer_region()),
            additional_information: v.additional_information(),
            file_id: v.file_id(),
        })
    }

    /// The file information class, for InfoType FILE.
    pub fn file_class(&self) -> Option<FileInfoClass> {
        (self.info_type == InfoType::FILE).then_some(FileInfoClass(self.file_info_class))
    }

    /// The file system information class, for InfoType FILESYSTEM.
    pub fn fs_class(&self) -> Option<FsInfoClass> {
        (self.info_type == InfoType::FILESYSTEM).then_some(FsInfoClass(self.file_info_class))
    }

    /// AdditionalInformation as security-descriptor parts.
    pub fn security_information(&self) -> AdditionalInformation {
        AdditionalInformation(self.additional_information)
    }

    /// [MS-SMB2] 3.3.5.21 rules that need connection state: InfoType one of
    /// the four defined values and BufferLength at most
    /// `max_transact_size`. Failures are STATUS_INVALID_PARAMETER.
    pub fn check_request_rules(&self, max_transact_size: u32) -> Result<(), Smb2Error> {
        const WHAT: &str = "SMB2 SET_INFO request";
        if !self.info_type.is_defined() {
            return Err(Smb2Error::Malformed {
                what: WHAT,
                field: "InfoType (not FILE, FILESYSTEM, SECURITY or QUOTA)",
            });
        }
        if self.data.len() as u64 > u64::from(max_transact_size) {
            return Err(Smb2Error::Malformed {
                what: WHAT,
                field: "BufferLength (> MaxTransactSize)",
            });
        }
        Ok(())
    }

    /// Fixed part, then the buffer at header offset 96 (at least 33 bytes).
    pub fn buffer_len(&self) -> usize {
        (req_field::BUFFER + self.data.len()).max(33)
    }

    /// Writes the request (BufferOffset 96 even for an empty buffer).
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        const WHAT: &str = "SMB2 SET_INFO request";
        let len = self.buffer_len();
        room(WHAT, buf, len)?;
        let data_len: u32 = fit(WHAT, "BufferLength", self.data.len())?;
        let buf = &mut buf[..len];
        buf.fill(0);
        let mut v = SetInfoRequest::new_unchecked(&mut *buf);
        v.set_structure_size(33);
        v.set_info_type(self.info_type);
        v.set_file_info_class(self.file_info_class);
        v.set_buffer_length(data_len);
        v.set_buffer_offset(hdr(req_field::BUFFER) as u16);
        v.set_additional_information(self.additional_information);
        v.set_file_id(self.file_id);
        super::layout::put(buf, req_field::BUFFER, self.data);
        Ok(len)
    }
}

impl_body!(
    SetInfoRequestRepr<'a>,
    SetInfoRequest,
    Some(Command::SetInfo)
);

body_view! {
    /// A zero-copy view of an SMB2 SET_INFO Response body ([MS-SMB2]
    /// 2.2.40): StructureSize 2 and nothing else.
    pub struct SetInfoResponse;
    what: "SMB2 SET_INFO response",
    structure_size: 2,
    accessors {}
}

impl<T: AsRef<[u8]>> SetInfoResponse<T> {
    fn check_variable(&self) -> Result<(), Smb2Error> {
        Ok(())
    }
}

/// The SMB2 SET_INFO Response ([MS-SMB2] 2.2.40): no values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SetInfoResponseRepr;

impl SetInfoResponseRepr {
    /// Reads a checked view.
    pub fn parse<T: AsRef<[u8]>>(v: &SetInfoResponse<T>) -> Result<Self, Smb2Error> {
        v.check()?;
        Ok(SetInfoResponseRepr)
    }

    /// 2 bytes.
    pub const fn buffer_len(&self) -> usize {
        2
    }

    /// Writes StructureSize 2.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        room("SMB2 SET_INFO response", buf, 2)?;
        SetInfoResponse::new_unchecked(&mut buf[..2]).set_structure_size(2);
        Ok(2)
    }
}

impl_body!(SetInfoResponseRepr, SetInfoResponse, Some(Command::SetInfo));
