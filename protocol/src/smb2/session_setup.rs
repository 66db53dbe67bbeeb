//! [MS-SMB2] 2.2.5 SMB2 SESSION_SETUP Request and 2.2.6 SMB2 SESSION_SETUP
//! Response.

use super::error::Smb2Error;
use super::layout::{fit, hdr, resolve, room, slice, Region};
use super::negotiate::{Capabilities, SecurityMode};
use super::Command;

bitmask! {
    /// [MS-SMB2] 2.2.5 Flags.
    pub struct SessionSetupFlags(u8) {
        /// SMB2_SESSION_FLAG_BINDING (SMB 3.x): bind an existing session to
        /// a new connection (multichannel).
        BINDING = 0x01;
    }
}

bitmask! {
    /// [MS-SMB2] 2.2.6 SessionFlags.
    pub struct SessionFlags(u16) {
        /// SMB2_SESSION_FLAG_IS_GUEST.
        IS_GUEST = 0x0001;
        /// SMB2_SESSION_FLAG_IS_NULL.
        IS_NULL = 0x0002;
        /// SMB2_SESSION_FLAG_ENCRYPT_DATA (SMB 3.x).
        ENCRYPT_DATA = 0x0004;
    }
}

/// Byte ranges of [MS-SMB2] 2.2.5.
mod req_field {
    use crate::smb2::Field;
    pub const FLAGS: Field = 2..3;
    pub const SECURITY_MODE: Field = 3..4;
    pub const CAPABILITIES: Field = 4..8;
    pub const CHANNEL: Field = 8..12;
    pub const SECURITY_BUFFER_OFFSET: Field = 12..14;
    pub const SECURITY_BUFFER_LENGTH: Field = 14..16;
    pub const PREVIOUS_SESSION_ID: Field = 16..24;
    /// Buffer starts here.
    pub const BUFFER: usize = 24;
}

body_view! {
    /// A zero-copy view of an SMB2 SESSION_SETUP Request body ([MS-SMB2]
    /// 2.2.5).
    pub struct SessionSetupRequest;
    what: "SMB2 SESSION_SETUP request",
    structure_size: 25,
    accessors {
        /// Flags.
        flags, set_flags: SessionSetupFlags = req_field::FLAGS;
        /// SecurityMode (one byte here).
        security_mode_byte, set_security_mode_byte: u8 = req_field::SECURITY_MODE;
        /// Capabilities (only SMB2_GLOBAL_CAP_DFS is meaningful).
        capabilities, set_capabilities: Capabilities = req_field::CAPABILITIES;
        /// Channel (reserved: 0).
        channel, set_channel: u32 = req_field::CHANNEL;
        /// SecurityBufferOffset, from the header.
        security_buffer_offset, set_security_buffer_offset: u16 = req_field::SECURITY_BUFFER_OFFSET;
        /// SecurityBufferLength.
        security_buffer_length, set_security_buffer_length: u16 = req_field::SECURITY_BUFFER_LENGTH;
        /// PreviousSessionId.
        previous_session_id, set_previous_session_id: u64 = req_field::PREVIOUS_SESSION_ID;
    }
}

impl<T: AsRef<[u8]>> SessionSetupRequest<T> {
    fn security_region(&self) -> Region {
        Region::new(
            "SecurityBufferOffset",
            u64::from(self.security_buffer_offset()),
            u64::from(self.security_buffer_length()),
        )
    }
    fn check_variable(&self) -> Result<(), Smb2Error> {
        let b = self.buffer.as_ref();
        resolve(Self::WHAT, b.len(), Self::FIXED_LEN, self.security_region()).map(|_| ())
    }
    /// SecurityMode as flags.
    pub fn security_mode(&self) -> SecurityMode {
        SecurityMode(u16::from(self.security_mode_byte()))
    }
    /// The security buffer (GSS token).
    pub fn security_buffer(&self) -> &[u8] {
        slice(
            self.buffer.as_ref(),
            Self::FIXED_LEN,
            self.security_region(),
        )
    }
}

/// The values of an SMB2 SESSION_SETUP Request ([MS-SMB2] 2.2.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionSetupRequestRepr<'a> {
    /// Flags.
    pub flags: SessionSetupFlags,
    /// SecurityMode (must fit in one byte).
    pub security_mode: SecurityMode,
    /// Capabilities.
    pub capabilities: Capabilities,
    /// Channel (reserved; the client sets 0).
    pub channel: u32,
    /// PreviousSessionId.
    pub previous_session_id: u64,
    /// Security buffer (GSS token).
    pub security_buffer: &'a [u8],
}

impl<'a> SessionSetupRequestRepr<'a> {
    /// Reads a checked view.
    pub fn parse(v: &SessionSetupRequest<&'a [u8]>) -> Result<Self, Smb2Error> {
        v.check()?;
        let b: &'a [u8] = v.buffer;
        Ok(SessionSetupRequestRepr {
            flags: v.flags(),
            security_mode: v.security_mode(),
            capabilities: v.capabilities(),
            channel: v.channel(),
            previous_session_id: v.previous_session_id(),
            security_buffer: slice(
                b,
                SessionSetupRequest::<&[u8]>::FIXED_LEN,
                v.security_region(),
            ),
        })
    }

    /// Fixed part, then the security buffer (at least 25 bytes).
    pub fn buffer_len(&self) -> usize {
        (req_field::BUFFER + self.security_buffer.len()).max(25)
    }

    /// Writes the request; the security buffer at header offset 88.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        const WHAT: &str = "SMB2 SESSION_SETUP request";
        let len = self.buffer_len();
        room(WHAT, buf, len)?;
        let sec_len: u16 = fit(WHAT, "SecurityBufferLength", self.security_buffer.len())?;
        let mode: u8 = fit(WHAT, "SecurityMode", usize::from(self.security_mode.bits()))?;
        let buf = &mut buf[..len];
        buf.fill(0);
        let mut v = SessionSetupRequest::new_unchecked(&mut *buf);
        v.set_structure_size(25);
        v.set_flags(self.flags);
        v.set_security_mode_byte(mode);
        v.set_capabilities(self.capabilities);
        v.set_channel(self.channel);
        v.set_security_buffer_offset(hdr(req_field::BUFFER) as u16);
        v.set_security_buffer_length(sec_len);
        v.set_previous_session_id(self.previous_session_id);
        super::layout::put(buf, req_field::BUFFER, self.security_buffer);
        Ok(len)
    }
}

impl_body!(
    SessionSetupRequestRepr<'a>,
    SessionSetupRequest,
    Some(Command::SessionSetup)
);

/// Byte ranges of [MS-SMB2] 2.2.6.
mod rsp_field {
    use crate::smb2::Field;
    pub const SESSION_FLAGS: Field = 2..4;
    pub const SECURITY_BUFFER_OFFSET: Field = 4..6;
    pub const SECURITY_BUFFER_LENGTH: Field = 6..8;
    /// Buffer starts here.
    pub const BUFFER: usize = 8;
}

body_view! {
    /// A zero-copy view of an SMB2 SESSION_SETUP Response body ([MS-SMB2]
    /// 2.2.6).
    pub struct SessionSetupResponse;
    what: "SMB2 SESSION_SETUP response",
    structure_size: 9,
    accessors {
        /// SessionFlags.
        session_flags, set_session_flags: SessionFlags = rsp_field::SESSION_FLAGS;
        /// SecurityBufferOffset, from the header.
        security_buffer_offset, set_security_buffer_offset: u16 = rsp_field::SECURITY_BUFFER_OFFSET;
        /// SecurityBufferLength.
        security_buffer_length, set_security_buffer_length: u16 = rsp_field::SECURITY_BUFFER_LENGTH;
    }
}

impl<T: AsRef<[u8]>> SessionSetupResponse<T> {
    fn security_region(&self) -> Region {
        Region::new(
            "SecurityBufferOffset",
            u64::from(self.security_buffer_offset()),
            u64::from(self.security_buffer_length()),
        )
    }
    fn check_variable(&self) -> Result<(), Smb2Error> {
        let b = self.buffer.as_ref();
        resolve(Self::WHAT, b.len(), Self::FIXED_LEN, self.security_region()).map(|_| ())
    }
    /// The security buffer (GSS token).
    pub fn security_buffer(&self) -> &[u8] {
        slice(
            self.buffer.as_ref(),
            Self::FIXED_LEN,
            self.security_region(),
        )
    }
}

/// The values of an SMB2 SESSION_SETUP Response ([MS-SMB2] 2.2.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SessionSetupResponseRepr<'a> {
    /// SessionFlags.
    pub session_flags: SessionFlags,
    /// Security buffer (GSS token).
    pub security_buffer: &'a [u8],
}

impl<'a> SessionSetupResponseRepr<'a> {
    /// Reads a checked view.
    pub fn parse(v: &SessionSetupResponse<&'a [u8]>) -> Result<Self, Smb2Error> {
        v.check()?;
        let b: &'a [u8] = v.buffer;
        Ok(SessionSetupResponseRepr {
            session_flags: v.session_flags(),
            security_buffer: slice(
                b,
                SessionSetupResponse::<&[u8]>::FIXED_LEN,
                v.security_region(),
            ),
        })
    }

    /// Fixed part, then the security buffer (at least 9 bytes).
    pub fn buffer_len(&self) -> usize {
        (rsp_field::BUFFER + self.security_buffer.len()).max(9)
    }

    /// Writes the response; the security buffer at header offset 72.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        const WHAT: &str = "SMB2 SESSION_SETUP response";
        let len = self.buffer_len();
        room(WHAT, buf, len)?;
        let sec_len: u16 = fit(WHAT, "SecurityBufferLength", self.security_buffer.len())?;
        let buf = &mut buf[..len];
        buf.fill(0);
        let mut v = SessionSetupResponse::new_unchecked(&mut *buf);
        v.set_structure_size(9);
        v.set_session_flags(self.session_flags);
        v.set_security_buffer_offset(hdr(rsp_field::BUFFER) as u16);
        v.set_security_buffer_length(sec_len);
        super::layout::put(buf, rsp_field::BUFFER, self.security_buffer);
        Ok(len)
    }
}

impl_body!(
    SessionSetupResponseRepr<'a>,
    SessionSetupResponse,
    Some(Command::SessionSetup)
);
