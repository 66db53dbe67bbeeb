//! [MS-SMB2] 2.2.31 SMB2 IOCTL Request and 2.2.32 SMB2 IOCTL Response,
//! with the control codes this server handles: FSCTL_STORAGE_QOS_CONTROL
//! ([MS-SQOS] 2.2.1), FSCTL_VALIDATE_NEGOTIATE_INFO (2.2.31.4),
//! FSCTL_QUERY_NETWORK_INTERFACE_INFO (output: [`super::netif`]) and
//! FSCTL_DFS_GET_REFERRALS (recognised, [`DfsReferralRequest`]).

use super::error::Smb2Error;
use super::file_id::FileId;
use super::layout::{align8, fit, hdr, resolve_all, room, slice, Region};
use super::utf16::Utf16Str;
use super::validate_negotiate::ValidateNegotiateInfoRequest;
use super::Command;
use crate::sqos::StorageQosControlRequest;
use crate::WireError;

pub use crate::sqos::FSCTL_STORAGE_QOS_CONTROL;

/// [MS-SMB2] 2.2.31 / [MS-FSCC] 2.3: FSCTL_DFS_GET_REFERRALS.
pub const FSCTL_DFS_GET_REFERRALS: u32 = 0x0006_0194;
/// [MS-SMB2] 2.2.31 / [MS-FSCC] 2.3: FSCTL_DFS_GET_REFERRALS_EX.
pub const FSCTL_DFS_GET_REFERRALS_EX: u32 = 0x0006_01B0;
/// [MS-SMB2] 2.2.31: FSCTL_PIPE_WAIT.
pub const FSCTL_PIPE_WAIT: u32 = 0x0011_0018;
/// [MS-SMB2] 2.2.31: FSCTL_PIPE_TRANSCEIVE.
pub const FSCTL_PIPE_TRANSCEIVE: u32 = 0x0011_C017;
/// [MS-SMB2] 2.2.31: FSCTL_QUERY_NETWORK_INTERFACE_INFO.
pub const FSCTL_QUERY_NETWORK_INTERFACE_INFO: u32 = 0x0014_01FC;
/// [MS-SMB2] 2.2.31: FSCTL_VALIDATE_NEGOTIATE_INFO.
pub const FSCTL_VALIDATE_NEGOTIATE_INFO: u32 = 0x0014_0204;

bitmask! {
    /// [MS-SMB2] 2.2.31 Flags.
    pub struct IoctlFlags(u32) {
        /// SMB2_0_IOCTL_IS_FSCTL: an FSCTL. [MS-SMB2] 3.3.5.15: without it
        /// the server fails the request with STATUS_NOT_SUPPORTED.
        IS_FSCTL = 0x0000_0001;
    }
}

/// Byte ranges of [MS-SMB2] 2.2.31.
mod req_field {
    use crate::smb2::Field;
    pub const RESERVED: Field = 2..4;
    pub const CTL_CODE: Field = 4..8;
    pub const FILE_ID: Field = 8..24;
    pub const INPUT_OFFSET: Field = 24..28;
    pub const INPUT_COUNT: Field = 28..32;
    pub const MAX_INPUT_RESPONSE: Field = 32..36;
    pub const OUTPUT_OFFSET: Field = 36..40;
    pub const OUTPUT_COUNT: Field = 40..44;
    pub const MAX_OUTPUT_RESPONSE: Field = 44..48;
    pub const FLAGS: Field = 48..52;
    pub const RESERVED2: Field = 52..56;
    /// Buffer starts here.
    pub const BUFFER: usize = 56;
}

body_view! {
    /// A zero-copy view of an SMB2 IOCTL Request body ([MS-SMB2] 2.2.31).
    /// `new_checked` verifies the input and output buffers (inside the body
    /// after the fixed part, not overlapping: 3.3.5.15).
    pub struct IoctlRequest;
    what: "SMB2 IOCTL request",
    structure_size: 57,
    accessors {
        /// Reserved.
        reserved, set_reserved: u16 = req_field::RESERVED;
        /// CtlCode.
        ctl_code, set_ctl_code: u32 = req_field::CTL_CODE;
        /// FileId.
        file_id, set_file_id: FileId = req_field::FILE_ID;
        /// InputOffset, from the header.
        input_offset, set_input_offset: u32 = req_field::INPUT_OFFSET;
        /// InputCount.
        input_count, set_input_count: u32 = req_field::INPUT_COUNT;
        /// MaxInputResponse.
        max_input_response, set_max_input_response: u32 = req_field::MAX_INPUT_RESPONSE;
        /// OutputOffset, from the header.
        output_offset, set_output_offset: u32 = req_field::OUTPUT_OFFSET;
        /// OutputCount.
        output_count, set_output_count: u32 = req_field::OUTPUT_COUNT;
        /// MaxOutputResponse.
        max_output_response, set_max_output_response: u32 = req_field::MAX_OUTPUT_RESPONSE;
        /// Flags.
        flags, set_flags: IoctlFlags = req_field::FLAGS;
        /// Reserved2.
        reserved2, set_reserved2: u32 = req_field::RESERVED2;
    }
}

impl<T: AsRef<[u8]>> IoctlRequest<T> {
    fn regions(&self) -> [Region; 2] {
        [
            Region::new(
                "InputOffset",
                u64::from(self.input_offset()),
                u64::from(self.input_count()),
            ),
            Region::new(
                "OutputOffset",
                u64::from(self.output_offset()),
                u64::from(self.output_count()),
            ),
        ]
    }

    fn check_variable(&self) -> Result<(), Smb2Error> {
        let b = self.buffer.as_ref();
        resolve_all(Self::WHAT, b.len(), Self::FIXED_LEN, self.regions()).map(|_| ())
    }

    /// The input buffer.
    pub fn input(&self) -> &[u8] {
        slice(self.buffer.as_ref(), Self::FIXED_LEN, self.regions()[0])
    }

    /// The output buffer of the request (usually empty).
    pub fn output(&self) -> &[u8] {
        slice(self.buffer.as_ref(), Self::FIXED_LEN, self.regions()[1])
    }

    /// True when SMB2_0_IOCTL_IS_FSCTL is set.
    pub fn is_fsctl(&self) -> bool {
        self.flags().contains(IoctlFlags::IS_FSCTL)
    }

    /// For FSCTL_STORAGE_QOS_CONTROL, the input as a checked
    /// STORAGE_QOS_CONTROL_REQUEST view ([MS-SQOS] 2.2.2.2, 3.2.4.1);
    /// `None` for any other CtlCode.
    pub fn storage_qos_control_request(
        &self,
    ) -> Option<Result<StorageQosControlRequest<&[u8]>, WireError>> {
        (self.ctl_code() == FSCTL_STORAGE_QOS_CONTROL)
            .then(|| StorageQosControlRequest::new_checked(self.input()))
    }

    /// For FSCTL_DFS_GET_REFERRALS, the input as a REQ_GET_DFS_REFERRAL
    /// ([MS-DFSC] 2.2.2); `None` for any other CtlCode. A server that is
    /// not a DFS server fails the request with STATUS_FS_DRIVER_REQUIRED
    /// ([MS-SMB2] 3.3.5.15.2); Linux cifs then treats the share as non-DFS.
    pub fn dfs_referral_request(&self) -> Option<Result<DfsReferralRequest<'_>, Smb2Error>> {
        (self.ctl_code() == FSCTL_DFS_GET_REFERRALS)
            .then(|| DfsReferralRequest::parse(self.input()))
    }

    /// For FSCTL_VALIDATE_NEGOTIATE_INFO, the input as a checked
    /// VALIDATE_NEGOTIATE_INFO request (2.2.31.4); `None` otherwise.
    pub fn validate_negotiate_info(
        &self,
    ) -> Option<Result<ValidateNegotiateInfoRequest<&[u8]>, Smb2Error>> {
        (self.ctl_code() == FSCTL_VALIDATE_NEGOTIATE_INFO)
            .then(|| ValidateNegotiateInfoRequest::new_checked(self.input()))
    }

    /// [MS-SMB2] 3.3.5.15 rules that need connection state or are not
    /// structural: the FSCTLs that have no open (DFS referrals, network
    /// interface info, validate negotiate, pipe wait) carry FileId
    /// 0xFFFFFFFF_FFFFFFFF_FFFFFFFF_FFFFFFFF; InputCount, MaxInputResponse
    /// and MaxOutputResponse are at most `max_transact_size` (a SHOULD).
    /// Failures are STATUS_INVALID_PARAMETER. (Flags without
    /// SMB2_0_IOCTL_IS_FSCTL is STATUS_NOT_SUPPORTED: see
    /// [`is_fsctl`](Self::is_fsctl).)
    pub fn check_request_rules(&self, max_transact_size: u32) -> Result<(), Smb2Error> {
        if ctl_code_has_no_open(self.ctl_code()) && !self.file_id().is_any() {
            return Err(Smb2Error::Malformed {
                what: Self::WHAT,
                field: "FileId (must be all ones for this CtlCode)",
            });
        }
        for (v, field) in [
            (self.input_count(), "InputCount (> MaxTransactSize)"),
            (
                self.max_input_response(),
                "MaxInputResponse (> MaxTransactSize)",
            ),
            (
                self.max_output_response(),
                "MaxOutputResponse (> MaxTransactSize)",
            ),
        ] {
            if v > max_transact_size {
                return Err(Smb2Error::Malformed {
                    what: Self::WHAT,
                    field,
                });
            }
        }
        Ok(())
    }
}

/// [MS-DFSC] 2.2.2 REQ_GET_DFS_REFERRAL, the input of
/// FSCTL_DFS_GET_REFERRALS: MaxReferralLevel (2), RequestFileName (a
/// null-terminated UTF-16LE path, `\\server\\share...`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DfsReferralRequest<'a> {
    /// MaxReferralLevel (1 to 4).
    pub max_referral_level: u16,
    /// RequestFileName without its terminating null (all of the bytes
    /// after MaxReferralLevel when there is no terminator).
    pub request_file_name: Utf16Str<'a>,
}

impl<'a> DfsReferralRequest<'a> {
    /// Decodes the IOCTL input (at least MaxReferralLevel).
    pub fn parse(input: &'a [u8]) -> Result<Self, Smb2Error> {
        if input.len() < 2 {
            return Err(Smb2Error::Truncated {
                what: "REQ_GET_DFS_REFERRAL",
                need: 2,
                have: input.len(),
            });
        }
        let name = &input[2..];
        let end = name
            .chunks_exact(2)
            .position(|c| c == [0, 0])
            .map_or(name.len(), |i| 2 * i);
        Ok(DfsReferralRequest {
            max_referral_level: u16::from_le_bytes([input[0], input[1]]),
            request_file_name: Utf16Str::from_utf16le(&name[..end]),
        })
    }
}

/// [MS-SMB2] 3.3.5.15: the control codes sent without an open (FileId all
/// ones).
pub(crate) const fn ctl_code_has_no_open(ctl_code: u32) -> bool {
    matches!(
        ctl_code,
        FSCTL_DFS_GET_REFERRALS
            | FSCTL_DFS_GET_REFERRALS_EX
            | FSCTL_QUERY_NETWORK_INTERFACE_INFO
            | FSCTL_VALIDATE_NEGOTIATE_INFO
            | FSCTL_PIPE_WAIT
    )
}

/// The values of an SMB2 IOCTL Request ([MS-SMB2] 2.2.31).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoctlRequestRepr<'a> {
    /// CtlCode.
    pub ctl_code: u32,
    /// FileId ([`FileId::ANY`] for the FSCTLs without an open).
    pub file_id: FileId,
    /// Input buffer.
    pub input: &'a [u8],
    /// MaxInputResponse.
    pub max_input_response: u32,
    /// Output buffer (usually empty).
    pub output: &'a [u8],
    /// MaxOutputResponse.
    pub max_output_response: u32,
    /// Flags.
    pub flags: IoctlFlags,
}

impl<'a> IoctlRequestRepr<'a> {
    /// An FSCTL with `input`, no output buffer, MaxInputResponse 0 and the
    /// given MaxOutputResponse ([MS-SMB2] 3.2.4.20).
    pub fn fsctl(
        ctl_code: u32,
        file_id: FileId,
        input: &'a [u8],
        max_output_response: u32,
    ) -> Self {
        IoctlRequestRepr {
            ctl_code,
            file_id,
            input,
            max_input_response: 0,
            output: &[],
            max_output_response,
            flags: IoctlFlags::IS_FSCTL,
        }
    }

    /// Reads a checked view.
    pub fn parse(v: &IoctlRequest<&'a [u8]>) -> Result<Self, Smb2Error> {
        v.check()?;
        let b: &'a [u8] = v.buffer;
        let fixed = IoctlRequest::<&[u8]>::FIXED_LEN;
        let [input, output] = v.regions();
        Ok(IoctlRequestRepr {
            ctl_code: v.ctl_code(),
            file_id: v.file_id(),
            input: slice(b, fixed, input),
            max_input_response: v.max_input_response(),
            output: slice(b, fixed, output),
            max_output_response: v.max_output_response(),
            flags: v.flags(),
        })
    }

    fn layout(&self) -> (usize, usize) {
        let input_end = req_field::BUFFER + self.input.len();
        if self.output.is_empty() {
            (input_end, input_end.max(57))
        } else {
            let start = align8(input_end);
            (start, start + self.output.len())
        }
    }

    /// Fixed part, input at header offset 120, output at the next 8-byte
    /// boundary (at least 57 bytes).
    pub fn buffer_len(&self) -> usize {
        self.layout().1
    }

    /// Writes the request. InputOffset is always 120 (3.2.4.20: the start of
    /// Buffer); OutputOffset is 0 when there is no output (a SHOULD).
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        const WHAT: &str = "SMB2 IOCTL request";
        let (out_start, len) = self.layout();
        room(WHAT, buf, len)?;
        let input_count: u32 = fit(WHAT, "InputCount", self.input.len())?;
        let output_count: u32 = fit(WHAT, "OutputCount", self.output.len())?;
        let out_off: u32 = if output_count == 0 {
            0
        } else {
            fit(WHAT, "OutputOffset", hdr(out_start))?
        };
        let buf = &mut buf[..len];
        buf.fill(0);
        let mut v = IoctlRequest::new_unchecked(&mut *buf);
        v.set_structure_size(57);
        v.set_ctl_code(self.ctl_code);
        v.set_file_id(self.file_id);
        v.set_input_offset(hdr(req_field::BUFFER) as u32);
        v.set_input_count(input_count);
        v.set_max_input_response(self.max_input_response);
        v.set_output_offset(out_off);
        v.set_output_count(output_count);
        v.set_max_output_response(self.max_output_response);
        v.set_flags(self.flags);
        super::layout::put(buf, req_field::BUFFER, self.input);
        super::layout::put(buf, out_start, self.output);
        Ok(len)
    }
}

impl_body!(IoctlRequestRepr<'a>, IoctlRequest, Some(Command::Ioctl));

/// Byte ranges of [MS-SMB2] 2.2.32.
mod rsp_field {
    use crate::smb2::Field;
    pub const RESERVED: Field = 2..4;
    pub const CTL_CODE: Field = 4..8;
    pub const FILE_ID: Field = 8..24;
    pub const INPUT_OFFSET: Field = 24..28;
    pub const INPUT_COUNT: Field = 28..32;
    pub const OUTPUT_OFFSET: Field = 32..36;
    pub const OUTPUT_COUNT: Field = 36..40;
    pub const FLAGS: Field = 40..44;
    pub const RESERVED2: Field = 44..48;
    /// Buffer starts here.
    pub const BUFFER: usize = 48;
}

body_view! {
    /// A zero-copy view of an SMB2 IOCTL Response body ([MS-SMB2] 2.2.32).
    pub struct IoctlResponse;
    what: "SMB2 IOCTL response",
    structure_size: 49,
    accessors {
        /// Reserved.
        reserved, set_reserved: u16 = rsp_field::RESERVED;
        /// CtlCode.
        ctl_code, set_ctl_code: u32 = rsp_field::CTL_CODE;
        /// FileId.
        file_id, set_file_id: FileId = rsp_field::FILE_ID;
        /// InputOffset, from the header.
        input_offset, set_input_offset: u32 = rsp_field::INPUT_OFFSET;
        /// InputCount.
        input_count, set_input_count: u32 = rsp_field::INPUT_COUNT;
        /// OutputOffset, from the header.
        output_offset, set_output_offset: u32 = rsp_field::OUTPUT_OFFSET;
        /// OutputCount.
        output_count, set_output_count: u32 = rsp_field::OUTPUT_COUNT;
        /// Flags (reserved: 0).
        flags, set_flags: u32 = rsp_field::FLAGS;
        /// Reserved2.
        reserved2, set_reserved2: u32 = rsp_field::RESERVED2;
    }
}

impl<T: AsRef<[u8]>> IoctlResponse<T> {
    fn regions(&self) -> [Region; 2] {
        [
            Region::new(
                "InputOffset",
                u64::from(self.input_offset()),
                u64::from(self.input_count()),
            ),
            Region::new(
                "OutputOffset",
                u64::from(self.output_offset()),
                u64::from(self.output_count()),
            ),
        ]
    }

    fn check_variable(&self) -> Result<(), Smb2Error> {
        let b = self.buffer.as_ref();
        resolve_all(Self::WHAT, b.len(), Self::FIXED_LEN, self.regions()).map(|_| ())
    }

    /// The input buffer of the response (usually empty).
    pub fn input(&self) -> &[u8] {
        slice(self.buffer.as_ref(), Self::FIXED_LEN, self.regions()[0])
    }

    /// The output buffer (for FSCTL_STORAGE_QOS_CONTROL a
    /// STORAGE_QOS_CONTROL_RESPONSE, [MS-SQOS] 2.2.2.3).
    pub fn output(&self) -> &[u8] {
        slice(self.buffer.as_ref(), Self::FIXED_LEN, self.regions()[1])
    }
}

/// The values of an SMB2 IOCTL Response ([MS-SMB2] 2.2.32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoctlResponseRepr<'a> {
    /// CtlCode.
    pub ctl_code: u32,
    /// FileId.
    pub file_id: FileId,
    /// Input buffer (usually empty).
    pub input: &'a [u8],
    /// Output buffer.
    pub output: &'a [u8],
    /// Flags (reserved: 0).
    pub flags: u32,
}

impl<'a> IoctlResponseRepr<'a> {
    /// Reads a checked view.
    pub fn parse(v: &IoctlResponse<&'a [u8]>) -> Result<Self, Smb2Error> {
        v.check()?;
        let b: &'a [u8] = v.buffer;
        let fixed = IoctlResponse::<&[u8]>::FIXED_LEN;
        let [input, output] = v.regions();
        Ok(IoctlResponseRepr {
            ctl_code: v.ctl_code(),
            file_id: v.file_id(),
            input: slice(b, fixed, input),
            output: slice(b, fixed, output),
            flags: v.flags(),
        })
    }

    fn layout(&self) -> (usize, usize) {
        let out_start = align8(rsp_field::BUFFER + self.input.len());
        let end = if self.output.is_empty() {
            rsp_field::BUFFER + self.input.len()
        } else {
            out_start + self.output.len()
        };
        (out_start, end.max(49))
    }

    /// Fixed part, input at header offset 112, output at the next 8-byte
    /// boundary (2.2.32: "SHOULD be ... InputOffset + InputCount rounded up
    /// to a multiple of 8"), at least 49 bytes.
    pub fn buffer_len(&self) -> usize {
        self.layout().1
    }

    /// Writes the response; both offsets are set even for empty buffers,
    /// as Windows servers do.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        const WHAT: &str = "SMB2 IOCTL response";
        let (out_start, len) = self.layout();
        room(WHAT, buf, len)?;
        let input_count: u32 = fit(WHAT, "InputCount", self.input.len())?;
        let output_count: u32 = fit(WHAT, "OutputCount", self.output.len())?;
        let out_off: u32 = fit(WHAT, "OutputOffset", hdr(out_start))?;
        let buf = &mut buf[..len];
        buf.fill(0);
        let mut v = IoctlResponse::new_unchecked(&mut *buf);
        v.set_structure_size(49);
        v.set_ctl_code(self.ctl_code);
        v.set_file_id(self.file_id);
        v.set_input_offset(hdr(rsp_field::BUFFER) as u32);
        v.set_input_count(input_count);
        v.set_output_offset(out_off);
        v.set_output_count(output_count);
        v.set_flags(self.flags);
        super::layout::put(buf, rsp_field::BUFFER, self.input);
        if !self.output.is_empty() {
            super::layout::put(buf, out_start, self.output);
        }
        Ok(len)
    }
}

impl_body!(IoctlResponseRepr<'a>, IoctlResponse, Some(Command::Ioctl));
