//! [MS-SMB2] 2.2.37 SMB2 QUERY_INFO Request and 2.2.38 SMB2 QUERY_INFO
//! Response. The output is an [MS-FSCC] structure ([`super::fscc`]) for
//! InfoType FILE and FILESYSTEM, a security descriptor for SECURITY, quota
//! entries for QUOTA.

use super::error::Smb2Error;
use super::file_id::FileId;
use super::fscc::{FileInfoClass, FsInfoClass};
use super::layout::{fit, hdr, resolve, room, slice, Region};
use super::Command;
use crate::ntstatus::{
    NtStatus, STATUS_BUFFER_OVERFLOW, STATUS_INFO_LENGTH_MISMATCH, STATUS_SUCCESS,
};

wire_enum! {
    /// [MS-SMB2] 2.2.37 / 2.2.39 InfoType.
    pub struct InfoType(u8) {
        /// SMB2_0_INFO_FILE: [MS-FSCC] 2.4 file information.
        FILE = 0x01;
        /// SMB2_0_INFO_FILESYSTEM: [MS-FSCC] 2.5 file system information.
        FILESYSTEM = 0x02;
        /// SMB2_0_INFO_SECURITY: a security descriptor ([MS-DTYP] 2.4.6).
        SECURITY = 0x03;
        /// SMB2_0_INFO_QUOTA: quota entries ([MS-FSCC] 2.4.36).
        QUOTA = 0x04;
    }
}

bitmask! {
    /// [MS-SMB2] 2.2.37 Flags (used with FileFullEaInformation).
    pub struct QueryInfoFlags(u32) {
        /// SL_RESTART_SCAN.
        RESTART_SCAN = 0x0000_0001;
        /// SL_RETURN_SINGLE_ENTRY.
        RETURN_SINGLE_ENTRY = 0x0000_0002;
        /// SL_INDEX_SPECIFIED.
        INDEX_SPECIFIED = 0x0000_0004;
    }
}

bitmask! {
    /// [MS-SMB2] 2.2.37 / 2.2.39 AdditionalInformation for InfoType
    /// SECURITY: which parts of the security descriptor.
    pub struct AdditionalInformation(u32) {
        /// OWNER_SECURITY_INFORMATION.
        OWNER = 0x0000_0001;
        /// GROUP_SECURITY_INFORMATION.
        GROUP = 0x0000_0002;
        /// DACL_SECURITY_INFORMATION.
        DACL = 0x0000_0004;
        /// SACL_SECURITY_INFORMATION.
        SACL = 0x0000_0008;
        /// LABEL_SECURITY_INFORMATION.
        LABEL = 0x0000_0010;
        /// ATTRIBUTE_SECURITY_INFORMATION.
        ATTRIBUTE = 0x0000_0020;
        /// SCOPE_SECURITY_INFORMATION.
        SCOPE = 0x0000_0040;
        /// BACKUP_SECURITY_INFORMATION.
        BACKUP = 0x0001_0000;
    }
}

/// Byte ranges of [MS-SMB2] 2.2.37.
mod req_field {
    use crate::smb2::Field;
    pub const INFO_TYPE: Field = 2..3;
    pub const FILE_INFO_CLASS: Field = 3..4;
    pub const OUTPUT_BUFFER_LENGTH: Field = 4..8;
    pub const INPUT_BUFFER_OFFSET: Field = 8..10;
    pub const RESERVED: Field = 10..12;
    pub const INPUT_BUFFER_LENGTH: Field = 12..16;
    pub const ADDITIONAL_INFORMATION: Field = 16..20;
    pub const FLAGS: Field = 20..24;
    pub const FILE_ID: Field = 24..40;
    /// Buffer starts here.
    pub const BUFFER: usize = 40;
}

body_view! {
    /// A zero-copy view of an SMB2 QUERY_INFO Request body ([MS-SMB2]
    /// 2.2.37). `new_checked` verifies the input buffer (inside the body,
    /// after the fixed part).
    pub struct QueryInfoRequest;
    what: "SMB2 QUERY_INFO request",
    structure_size: 41,
    accessors {
        /// InfoType.
        info_type, set_info_type: InfoType = req_field::INFO_TYPE;
        /// FileInfoClass (a [`FileInfoClass`] or [`FsInfoClass`] by
        /// InfoType; 0 for SECURITY and QUOTA).
        file_info_class, set_file_info_class: u8 = req_field::FILE_INFO_CLASS;
        /// OutputBufferLength: the most output the client accepts.
        output_buffer_length, set_output_buffer_length: u32 = req_field::OUTPUT_BUFFER_LENGTH;
        /// InputBufferOffset, from the header.
        input_buffer_offset, set_input_buffer_offset: u16 = req_field::INPUT_BUFFER_OFFSET;
        /// Reserved.
        reserved, set_reserved: u16 = req_field::RESERVED;
        /// InputBufferLength.
        input_buffer_length, set_input_buffer_length: u32 = req_field::INPUT_BUFFER_LENGTH;
        /// AdditionalInformation (security parts, or the EA index with
        /// SL_INDEX_SPECIFIED).
        additional_information, set_additional_information: u32 = req_field::ADDITIONAL_INFORMATION;
        /// Flags.
        flags, set_flags: QueryInfoFlags = req_field::FLAGS;
        /// FileId.
        file_id, set_file_id: FileId = req_field::FILE_ID;
    }
}

impl<T: AsRef<[u8]>> QueryInfoRequest<T> {
    fn input_region(&self) -> Region {
        Region::new(
            "InputBufferOffset",
            u64::from(self.input_buffer_offset()),
            u64::from(self.input_buffer_length()),
        )
    }

    fn check_variable(&self) -> Result<(), Smb2Error> {
        let b = self.buffer.as_ref();
        resolve(Self::WHAT, b.len(), Self::FIXED_LEN, self.input_region()).map(|_| ())
    }

    /// The input buffer (SMB2_QUERY_QUOTA_INFO, a FILE_GET_EA_INFORMATION
    /// list, or empty).
    pub fn input(&self) -> &[u8] {
        slice(self.buffer.as_ref(), Self::FIXED_LEN, self.input_region())
    }
}

/// The values of an SMB2 QUERY_INFO Request ([MS-SMB2] 2.2.37).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueryInfoRequestRepr<'a> {
    /// InfoType.
    pub info_type: InfoType,
    /// FileInfoClass (see [`file_class`](Self::file_class) and
    /// [`fs_class`](Self::fs_class)).
    pub file_info_class: u8,
    /// OutputBufferLength.
    pub output_buffer_length: u32,
    /// Input buffer.
    pub input: &'a [u8],
    /// AdditionalInformation.
    pub additional_information: u32,
    /// Flags.
    pub flags: QueryInfoFlags,
    /// FileId.
    pub file_id: FileId,
}

impl<'a> QueryInfoRequestRepr<'a> {
    /// Reads a checked view.
    pub fn parse(v: &QueryInfoRequest<&'a [u8]>) -> Result<Self, Smb2Error> {
        v.check()?;
        let b: &'a [u8] = v.buffer;
        Ok(QueryInfoRequestRepr {
            info_type: v.info_type(),
            file_info_class: v.file_info_class(),
            output_buffer_length: v.output_buffer_length(),
            input: slice(b, QueryInfoRequest::<&[u8]>::FIXED_LEN, v.input_region()),
            additional_information: v.additional_information(),
            flags: v.flags(),
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

    /// AdditionalInformation as security-descriptor parts (InfoType
    /// SECURITY).
    pub fn security_information(&self) -> AdditionalInformation {
        AdditionalInformation(self.additional_information)
    }

    /// [MS-SMB2] 3.3.5.20 rules that need connection state: InfoType one of
    /// the four defined values; OutputBufferLength (a SHOULD) and
    /// InputBufferLength at most `max_transact_size`. Failures are
    /// STATUS_INVALID_PARAMETER.
    pub fn check_request_rules(&self, max_transact_size: u32) -> Result<(), Smb2Error> {
        const WHAT: &str = "SMB2 QUERY_INFO request";
        if !self.info_type.is_defined() {
            return Err(Smb2Error::Malformed {
                what: WHAT,
                field: "InfoType (not FILE, FILESYSTEM, SECURITY or QUOTA)",
            });
        }
        if self.output_buffer_length > max_transact_size {
            return Err(Smb2Error::Malformed {
                what: WHAT,
                field: "OutputBufferLength (> MaxTransactSize)",
            });
        }
        if self.input.len() as u64 > u64::from(max_transact_size) {
            return Err(Smb2Error::Malformed {
                what: WHAT,
                field: "InputBufferLength (> MaxTransactSize)",
            });
        }
        Ok(())
    }

    /// Fixed part, then the input at header offset 104 (at least 41
    /// bytes).
    pub fn buffer_len(&self) -> usize {
        (req_field::BUFFER + self.input.len()).max(41)
    }

    /// Writes the request (InputBufferOffset 0 when there is no input).
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        const WHAT: &str = "SMB2 QUERY_INFO request";
        let len = self.buffer_len();
        room(WHAT, buf, len)?;
        let input_len: u32 = fit(WHAT, "InputBufferLength", self.input.len())?;
        let buf = &mut buf[..len];
        buf.fill(0);
        let mut v = QueryInfoRequest::new_unchecked(&mut *buf);
        v.set_structure_size(41);
        v.set_info_type(self.info_type);
        v.set_file_info_class(self.file_info_class);
        v.set_output_buffer_length(self.output_buffer_length);
        if input_len > 0 {
            v.set_input_buffer_offset(hdr(req_field::BUFFER) as u16);
        }
        v.set_input_buffer_length(input_len);
        v.set_additional_information(self.additional_information);
        v.set_flags(self.flags);
        v.set_file_id(self.file_id);
        super::layout::put(buf, req_field::BUFFER, self.input);
        Ok(len)
    }
}

impl_body!(
    QueryInfoRequestRepr<'a>,
    QueryInfoRequest,
    Some(Command::QueryInfo)
);

output_buffer_response! {
    /// A zero-copy view of an SMB2 QUERY_INFO Response body ([MS-SMB2]
    /// 2.2.38).
    view QueryInfoResponse;
    /// The values of an SMB2 QUERY_INFO Response ([MS-SMB2] 2.2.38): the
    /// output buffer (an [MS-FSCC] structure for InfoType FILE and
    /// FILESYSTEM).
    repr QueryInfoResponseRepr;
    what: "SMB2 QUERY_INFO response",
    command: Some(Command::QueryInfo)
}

/// How much of an information class of `needed` bytes (fixed part
/// `fixed_len`) a server returns for a request's OutputBufferLength, and
/// with which status ([MS-SMB2] 3.3.5.20, [MS-FSA] 2.1.5.12): an
/// OutputBufferLength below the fixed part is STATUS_INFO_LENGTH_MISMATCH
/// (an ERROR response); a variable-length class (a name, a list) that does
/// not fit whole is truncated to OutputBufferLength with
/// STATUS_BUFFER_OVERFLOW (a warning: the QUERY_INFO response is still
/// sent); otherwise all of it with STATUS_SUCCESS.
pub fn fit_query_info_output(
    needed: usize,
    fixed_len: usize,
    output_buffer_length: u32,
) -> Result<(usize, NtStatus), NtStatus> {
    let limit = output_buffer_length as usize;
    if limit < fixed_len {
        Err(STATUS_INFO_LENGTH_MISMATCH)
    } else if needed > limit {
        Ok((limit, STATUS_BUFFER_OVERFLOW))
    } else {
        Ok((needed, STATUS_SUCCESS))
    }
}
