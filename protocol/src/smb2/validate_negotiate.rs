//! FSCTL_VALIDATE_NEGOTIATE_INFO payloads: [MS-SMB2] 2.2.31.4
//! VALIDATE_NEGOTIATE_INFO Request (the IOCTL input) and 2.2.32.6
//! VALIDATE_NEGOTIATE_INFO Response (the IOCTL output). Used by SMB 3.0 and
//! 3.0.2 clients (3.3.5.15.12); 3.1.1 relies on preauthentication integrity.

use super::error::Smb2Error;
use super::layout::{fit, room};
use super::negotiate::{Capabilities, SecurityMode};
use super::u16_array::U16Array;
use super::Scalar;
use crate::sqos::Guid;

/// Byte ranges of [MS-SMB2] 2.2.31.4.
mod req_field {
    use crate::smb2::Field;
    pub const CAPABILITIES: Field = 0..4;
    pub const GUID: Field = 4..20;
    pub const SECURITY_MODE: Field = 20..22;
    pub const DIALECT_COUNT: Field = 22..24;
    /// Dialects start here.
    pub const DIALECTS: usize = 24;
}

const REQ_WHAT: &str = "VALIDATE_NEGOTIATE_INFO request";
const RSP_WHAT: &str = "VALIDATE_NEGOTIATE_INFO response";

/// A zero-copy view of a VALIDATE_NEGOTIATE_INFO Request ([MS-SMB2]
/// 2.2.31.4): the fixed 24 bytes and DialectCount dialects must be present.
#[derive(Debug, Clone)]
pub struct ValidateNegotiateInfoRequest<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ValidateNegotiateInfoRequest<T> {
    /// Length of the fixed part.
    pub const FIXED_LEN: usize = 24;

    /// Wraps `buffer` without checking it.
    pub const fn new_unchecked(buffer: T) -> Self {
        ValidateNegotiateInfoRequest { buffer }
    }

    /// Wraps `buffer` (the IOCTL input), failing with `Truncated` unless the
    /// fixed part and the dialects are present.
    pub fn new_checked(buffer: T) -> Result<Self, Smb2Error> {
        let v = Self::new_unchecked(buffer);
        let have = v.buffer.as_ref().len();
        let need = if have < Self::FIXED_LEN {
            Self::FIXED_LEN
        } else {
            v.dialects_end()
        };
        if have < need {
            return Err(Smb2Error::Truncated {
                what: REQ_WHAT,
                need,
                have,
            });
        }
        Ok(v)
    }

    fn dialects_end(&self) -> usize {
        req_field::DIALECTS + 2 * usize::from(self.dialect_count())
    }

    /// Capabilities.
    pub fn capabilities(&self) -> Capabilities {
        Capabilities::read(self.buffer.as_ref(), req_field::CAPABILITIES)
    }
    /// Guid (the client's ClientGuid).
    pub fn guid(&self) -> Guid {
        Guid::read(self.buffer.as_ref(), req_field::GUID)
    }
    /// SecurityMode.
    pub fn security_mode(&self) -> SecurityMode {
        SecurityMode::read(self.buffer.as_ref(), req_field::SECURITY_MODE)
    }
    /// DialectCount.
    pub fn dialect_count(&self) -> u16 {
        u16::read(self.buffer.as_ref(), req_field::DIALECT_COUNT)
    }
    /// Dialects.
    pub fn dialects(&self) -> U16Array<'_> {
        U16Array::from_le_bytes(
            self.buffer
                .as_ref()
                .get(req_field::DIALECTS..self.dialects_end())
                .unwrap_or(&[]),
        )
    }
}

/// The values of a VALIDATE_NEGOTIATE_INFO Request ([MS-SMB2] 2.2.31.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValidateNegotiateInfoRequestRepr<'a> {
    /// Capabilities.
    pub capabilities: Capabilities,
    /// Guid.
    pub guid: Guid,
    /// SecurityMode.
    pub security_mode: SecurityMode,
    /// Dialects.
    pub dialects: U16Array<'a>,
}

impl<'a> ValidateNegotiateInfoRequestRepr<'a> {
    /// Reads a view (checking it again).
    pub fn parse(v: &ValidateNegotiateInfoRequest<&'a [u8]>) -> Result<Self, Smb2Error> {
        let b: &'a [u8] = v.buffer;
        let v = ValidateNegotiateInfoRequest::new_checked(b)?;
        Ok(ValidateNegotiateInfoRequestRepr {
            capabilities: v.capabilities(),
            guid: v.guid(),
            security_mode: v.security_mode(),
            dialects: U16Array::from_le_bytes(
                b.get(req_field::DIALECTS..v.dialects_end()).unwrap_or(&[]),
            ),
        })
    }

    /// [MS-SMB2] 3.3.5.15.12: true when the request repeats what the
    /// client sent in NEGOTIATE (Connection.ClientCapabilities, ClientGuid,
    /// ClientSecurityMode and ClientDialects, the dialects in the same
    /// order). On a mismatch the server terminates the connection; on a
    /// match it answers with a [`ValidateNegotiateInfoResponseRepr`] of its
    /// own NEGOTIATE response values.
    pub fn matches_negotiate(
        &self,
        capabilities: Capabilities,
        guid: Guid,
        security_mode: SecurityMode,
        dialects: U16Array<'_>,
    ) -> bool {
        self.capabilities == capabilities
            && self.guid == guid
            && self.security_mode == security_mode
            && self.dialects == dialects
    }

    /// 24 + 2 per dialect.
    pub fn buffer_len(&self) -> usize {
        req_field::DIALECTS + self.dialects.byte_len()
    }

    /// Writes the request.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        let len = self.buffer_len();
        room(REQ_WHAT, buf, len)?;
        let count: u16 = fit(REQ_WHAT, "DialectCount", self.dialects.len())?;
        let buf = &mut buf[..len];
        self.capabilities.write(buf, req_field::CAPABILITIES);
        self.guid.write(buf, req_field::GUID);
        self.security_mode.write(buf, req_field::SECURITY_MODE);
        count.write(buf, req_field::DIALECT_COUNT);
        self.dialects.write_to(&mut buf[req_field::DIALECTS..]);
        Ok(len)
    }
}

/// Byte ranges of [MS-SMB2] 2.2.32.6.
mod rsp_field {
    use crate::smb2::Field;
    pub const CAPABILITIES: Field = 0..4;
    pub const GUID: Field = 4..20;
    pub const SECURITY_MODE: Field = 20..22;
    pub const DIALECT: Field = 22..24;
}

/// A zero-copy view of a VALIDATE_NEGOTIATE_INFO Response ([MS-SMB2]
/// 2.2.32.6): 24 bytes.
#[derive(Debug, Clone)]
pub struct ValidateNegotiateInfoResponse<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ValidateNegotiateInfoResponse<T> {
    /// Length.
    pub const LEN: usize = 24;

    /// Wraps `buffer` without checking it.
    pub const fn new_unchecked(buffer: T) -> Self {
        ValidateNegotiateInfoResponse { buffer }
    }

    /// Wraps `buffer` (the IOCTL output), failing unless it holds 24 bytes.
    pub fn new_checked(buffer: T) -> Result<Self, Smb2Error> {
        let have = buffer.as_ref().len();
        if have < Self::LEN {
            return Err(Smb2Error::Truncated {
                what: RSP_WHAT,
                need: Self::LEN,
                have,
            });
        }
        Ok(Self::new_unchecked(buffer))
    }

    /// Capabilities.
    pub fn capabilities(&self) -> Capabilities {
        Capabilities::read(self.buffer.as_ref(), rsp_field::CAPABILITIES)
    }
    /// Guid (the ServerGuid).
    pub fn guid(&self) -> Guid {
        Guid::read(self.buffer.as_ref(), rsp_field::GUID)
    }
    /// SecurityMode.
    pub fn security_mode(&self) -> SecurityMode {
        SecurityMode::read(self.buffer.as_ref(), rsp_field::SECURITY_MODE)
    }
    /// Dialect.
    pub fn dialect(&self) -> u16 {
        u16::read(self.buffer.as_ref(), rsp_field::DIALECT)
    }
}

/// The values of a VALIDATE_NEGOTIATE_INFO Response ([MS-SMB2] 2.2.32.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValidateNegotiateInfoResponseRepr {
    /// Capabilities.
    pub capabilities: Capabilities,
    /// Guid.
    pub guid: Guid,
    /// SecurityMode.
    pub security_mode: SecurityMode,
    /// Dialect.
    pub dialect: u16,
}

impl ValidateNegotiateInfoResponseRepr {
    /// Reads a view (checking it again).
    pub fn parse<T: AsRef<[u8]>>(v: &ValidateNegotiateInfoResponse<T>) -> Result<Self, Smb2Error> {
        let v = ValidateNegotiateInfoResponse::new_checked(v.buffer.as_ref())?;
        Ok(ValidateNegotiateInfoResponseRepr {
            capabilities: v.capabilities(),
            guid: v.guid(),
            security_mode: v.security_mode(),
            dialect: v.dialect(),
        })
    }

    /// 24.
    pub const fn buffer_len(&self) -> usize {
        24
    }

    /// Writes the response.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        room(RSP_WHAT, buf, 24)?;
        let buf = &mut buf[..24];
        self.capabilities.write(buf, rsp_field::CAPABILITIES);
        self.guid.write(buf, rsp_field::GUID);
        self.security_mode.write(buf, rsp_field::SECURITY_MODE);
        self.dialect.write(buf, rsp_field::DIALECT);
        Ok(24)
    }
}
