//! [MS-SMB2] 2.2.3 SMB2 NEGOTIATE Request and 2.2.4 SMB2 NEGOTIATE Response.

use super::error::Smb2Error;
use super::layout::{align8, fit, hdr, resolve, room, Region};
use super::negotiate_context::{check_list, NegotiateContextList};
use super::u16_array::U16Array;
use super::HEADER_LEN;
use crate::sqos::Guid;

wire_enum! {
    /// [MS-SMB2] 2.2.3 Dialects values (and 2.2.4 DialectRevision).
    pub struct Dialect(u16) {
        /// SMB 2.0.2.
        SMB_2_0_2 = 0x0202;
        /// SMB 2.1.
        SMB_2_1 = 0x0210;
        /// SMB2 wildcard revision (2.2.4, multi-protocol negotiate only).
        SMB_2_WILDCARD = 0x02FF;
        /// SMB 3.0.
        SMB_3_0 = 0x0300;
        /// SMB 3.0.2.
        SMB_3_0_2 = 0x0302;
        /// SMB 3.1.1.
        SMB_3_1_1 = 0x0311;
    }
}

impl Dialect {
    /// True for the SMB 3.x dialect family (the dialects SMB Direct carries:
    /// [MS-SMB2] 3.3.5.4 refuses RDMA for earlier ones).
    pub const fn is_smb3(self) -> bool {
        matches!(self.0, 0x0300 | 0x0302 | 0x0311)
    }
}

bitmask! {
    /// [MS-SMB2] 2.2.3 / 2.2.4 SecurityMode (16 bits; the SESSION_SETUP
    /// request carries the same bits in one byte).
    pub struct SecurityMode(u16) {
        /// SMB2_NEGOTIATE_SIGNING_ENABLED.
        SIGNING_ENABLED = 0x0001;
        /// SMB2_NEGOTIATE_SIGNING_REQUIRED.
        SIGNING_REQUIRED = 0x0002;
    }
}

bitmask! {
    /// [MS-SMB2] 2.2.3 / 2.2.4 Capabilities (SMB2_GLOBAL_CAP_*).
    pub struct Capabilities(u32) {
        /// SMB2_GLOBAL_CAP_DFS.
        DFS = 0x0000_0001;
        /// SMB2_GLOBAL_CAP_LEASING.
        LEASING = 0x0000_0002;
        /// SMB2_GLOBAL_CAP_LARGE_MTU: multi-credit operations.
        LARGE_MTU = 0x0000_0004;
        /// SMB2_GLOBAL_CAP_MULTI_CHANNEL.
        MULTI_CHANNEL = 0x0000_0008;
        /// SMB2_GLOBAL_CAP_PERSISTENT_HANDLES.
        PERSISTENT_HANDLES = 0x0000_0010;
        /// SMB2_GLOBAL_CAP_DIRECTORY_LEASING.
        DIRECTORY_LEASING = 0x0000_0020;
        /// SMB2_GLOBAL_CAP_ENCRYPTION.
        ENCRYPTION = 0x0000_0040;
        /// SMB2_GLOBAL_CAP_NOTIFICATIONS (SMB 3.1.1).
        NOTIFICATIONS = 0x0000_0080;
    }
}

/// Byte ranges of [MS-SMB2] 2.2.3.
mod req_field {
    use crate::smb2::Field;
    pub const DIALECT_COUNT: Field = 2..4;
    pub const SECURITY_MODE: Field = 4..6;
    pub const RESERVED: Field = 6..8;
    pub const CAPABILITIES: Field = 8..12;
    pub const CLIENT_GUID: Field = 12..28;
    /// With 0x0311 among the dialects.
    pub const NEGOTIATE_CONTEXT_OFFSET: Field = 28..32;
    /// With 0x0311 among the dialects.
    pub const NEGOTIATE_CONTEXT_COUNT: Field = 32..34;
    /// With 0x0311 among the dialects.
    pub const RESERVED2: Field = 34..36;
    /// Without 0x0311: ClientStartTime (reserved, 0) over the three above.
    pub const CLIENT_START_TIME: Field = 28..36;
    /// Dialects start here.
    pub const DIALECTS: usize = 36;
}

body_view! {
    /// A zero-copy view of an SMB2 NEGOTIATE Request body ([MS-SMB2] 2.2.3).
    /// `new_checked` verifies DialectCount ≥ 1 (3.3.5.4) and that the
    /// Dialects array fits, and, when 0x0311 is offered, the negotiate
    /// context list (8-byte aligned, after the dialects, inside the body,
    /// each context well formed).
    pub struct NegotiateRequest;
    what: "SMB2 NEGOTIATE request",
    structure_size: 36,
    accessors {
        /// DialectCount.
        dialect_count, set_dialect_count: u16 = req_field::DIALECT_COUNT;
        /// SecurityMode.
        security_mode, set_security_mode: SecurityMode = req_field::SECURITY_MODE;
        /// Reserved.
        reserved, set_reserved: u16 = req_field::RESERVED;
        /// Capabilities.
        capabilities, set_capabilities: Capabilities = req_field::CAPABILITIES;
        /// ClientGuid.
        client_guid, set_client_guid: Guid = req_field::CLIENT_GUID;
        /// NegotiateContextOffset (with 0x0311), from the header.
        negotiate_context_offset, set_negotiate_context_offset: u32 = req_field::NEGOTIATE_CONTEXT_OFFSET;
        /// NegotiateContextCount (with 0x0311).
        negotiate_context_count, set_negotiate_context_count: u16 = req_field::NEGOTIATE_CONTEXT_COUNT;
        /// Reserved2 (with 0x0311).
        reserved2, set_reserved2: u16 = req_field::RESERVED2;
        /// ClientStartTime (without 0x0311; reserved).
        client_start_time, set_client_start_time: u64 = req_field::CLIENT_START_TIME;
    }
}

impl<T: AsRef<[u8]>> NegotiateRequest<T> {
    fn dialects_end(&self) -> usize {
        req_field::DIALECTS + 2 * usize::from(self.dialect_count())
    }

    fn check_variable(&self) -> Result<(), Smb2Error> {
        let b = self.buffer.as_ref();
        if self.dialect_count() == 0 {
            return Err(Smb2Error::Malformed {
                what: Self::WHAT,
                field: "DialectCount (0; [MS-SMB2] 3.3.5.4)",
            });
        }
        let end = self.dialects_end();
        if b.len() < end {
            return Err(Smb2Error::Truncated {
                what: Self::WHAT,
                need: end,
                have: b.len(),
            });
        }
        if self.offers_3_1_1() && self.negotiate_context_count() > 0 {
            check_list(
                Self::WHAT,
                b,
                self.negotiate_context_offset(),
                self.negotiate_context_count(),
                end,
            )?;
        }
        Ok(())
    }

    /// Dialects.
    pub fn dialects(&self) -> U16Array<'_> {
        let b = self.buffer.as_ref();
        U16Array::from_le_bytes(
            b.get(req_field::DIALECTS..self.dialects_end())
                .unwrap_or(&[]),
        )
    }

    /// True when 0x0311 is among the dialects, which gives bytes 28..36 their
    /// NegotiateContextOffset/Count meaning.
    pub fn offers_3_1_1(&self) -> bool {
        self.dialects().contains(Dialect::SMB_3_1_1.0)
    }

    /// The negotiate contexts (empty without 0x0311).
    pub fn negotiate_contexts(&self) -> NegotiateContextList<'_> {
        contexts(
            self.buffer.as_ref(),
            self.offers_3_1_1(),
            self.negotiate_context_offset(),
            self.negotiate_context_count(),
        )
    }
}

fn contexts(body: &[u8], present: bool, offset: u32, count: u16) -> NegotiateContextList<'_> {
    if !present || count == 0 {
        return NegotiateContextList::EMPTY;
    }
    let start = (offset as usize).saturating_sub(HEADER_LEN);
    NegotiateContextList::from_wire(body, start, count)
}

/// The values of an SMB2 NEGOTIATE Request ([MS-SMB2] 2.2.3). Reserved
/// fields and ClientStartTime are emitted as 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NegotiateRequestRepr<'a> {
    /// SecurityMode.
    pub security_mode: SecurityMode,
    /// Capabilities.
    pub capabilities: Capabilities,
    /// ClientGuid.
    pub client_guid: Guid,
    /// Dialects ([`Dialect`] values), at least one.
    pub dialects: U16Array<'a>,
    /// NegotiateContextList: only with 0x0311 among the dialects.
    pub negotiate_contexts: NegotiateContextList<'a>,
}

impl<'a> NegotiateRequestRepr<'a> {
    /// Reads a checked view.
    pub fn parse(v: &NegotiateRequest<&'a [u8]>) -> Result<Self, Smb2Error> {
        v.check()?;
        let b: &'a [u8] = v.buffer;
        let dialects =
            U16Array::from_le_bytes(b.get(req_field::DIALECTS..v.dialects_end()).unwrap_or(&[]));
        Ok(NegotiateRequestRepr {
            security_mode: v.security_mode(),
            capabilities: v.capabilities(),
            client_guid: v.client_guid(),
            dialects,
            negotiate_contexts: contexts(
                b,
                dialects.contains(Dialect::SMB_3_1_1.0),
                v.negotiate_context_offset(),
                v.negotiate_context_count(),
            ),
        })
    }

    fn layout(&self) -> (usize, usize) {
        let dialects_end = req_field::DIALECTS + self.dialects.byte_len();
        if self.negotiate_contexts.is_empty() {
            (dialects_end, dialects_end)
        } else {
            let start = align8(dialects_end);
            (start, start + self.negotiate_contexts.byte_len())
        }
    }

    /// Bytes [`emit`](Self::emit) writes: fixed part, dialects, then the
    /// contexts at the next 8-byte boundary.
    pub fn buffer_len(&self) -> usize {
        self.layout().1
    }

    /// Writes the request. Fails with `Malformed` for an empty dialect list
    /// or contexts without 0x0311.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        const WHAT: &str = "SMB2 NEGOTIATE request";
        let count: u16 = fit(WHAT, "DialectCount", self.dialects.len())?;
        if count == 0 {
            return Err(Smb2Error::Malformed {
                what: WHAT,
                field: "DialectCount (0; [MS-SMB2] 3.3.5.4)",
            });
        }
        let has_311 = self.dialects.contains(Dialect::SMB_3_1_1.0);
        if !self.negotiate_contexts.is_empty() && !has_311 {
            return Err(Smb2Error::Malformed {
                what: WHAT,
                field: "NegotiateContextList (without dialect 0x0311)",
            });
        }
        let ctx_count = self.negotiate_contexts.check_emit()?;
        let (ctx_start, len) = self.layout();
        room(WHAT, buf, len)?;
        let ctx_offset: u32 = fit(WHAT, "NegotiateContextOffset", hdr(ctx_start))?;
        let buf = &mut buf[..len];
        buf.fill(0);
        let mut v = NegotiateRequest::new_unchecked(&mut *buf);
        v.set_structure_size(36);
        v.set_dialect_count(count);
        v.set_security_mode(self.security_mode);
        v.set_capabilities(self.capabilities);
        v.set_client_guid(self.client_guid);
        if ctx_count > 0 {
            v.set_negotiate_context_offset(ctx_offset);
            v.set_negotiate_context_count(ctx_count);
        }
        self.dialects.write_to(
            &mut buf[req_field::DIALECTS..req_field::DIALECTS + self.dialects.byte_len()],
        );
        self.negotiate_contexts.write_to(&mut buf[ctx_start..]);
        Ok(len)
    }
}

impl_body!(
    NegotiateRequestRepr<'a>,
    NegotiateRequest,
    Some(super::Command::Negotiate)
);

/// Byte ranges of [MS-SMB2] 2.2.4.
mod rsp_field {
    use crate::smb2::Field;
    pub const SECURITY_MODE: Field = 2..4;
    pub const DIALECT_REVISION: Field = 4..6;
    /// With DialectRevision 0x0311; reserved otherwise.
    pub const NEGOTIATE_CONTEXT_COUNT: Field = 6..8;
    pub const SERVER_GUID: Field = 8..24;
    pub const CAPABILITIES: Field = 24..28;
    pub const MAX_TRANSACT_SIZE: Field = 28..32;
    pub const MAX_READ_SIZE: Field = 32..36;
    pub const MAX_WRITE_SIZE: Field = 36..40;
    pub const SYSTEM_TIME: Field = 40..48;
    pub const SERVER_START_TIME: Field = 48..56;
    pub const SECURITY_BUFFER_OFFSET: Field = 56..58;
    pub const SECURITY_BUFFER_LENGTH: Field = 58..60;
    /// With DialectRevision 0x0311; reserved otherwise.
    pub const NEGOTIATE_CONTEXT_OFFSET: Field = 60..64;
    /// Buffer starts here.
    pub const BUFFER: usize = 64;
}

body_view! {
    /// A zero-copy view of an SMB2 NEGOTIATE Response body ([MS-SMB2]
    /// 2.2.4). `new_checked` verifies the security buffer and, for
    /// DialectRevision 0x0311, the negotiate context list (8-byte aligned,
    /// inside the body, not overlapping the security buffer).
    pub struct NegotiateResponse;
    what: "SMB2 NEGOTIATE response",
    structure_size: 65,
    accessors {
        /// SecurityMode.
        security_mode, set_security_mode: SecurityMode = rsp_field::SECURITY_MODE;
        /// DialectRevision.
        dialect_revision, set_dialect_revision: u16 = rsp_field::DIALECT_REVISION;
        /// NegotiateContextCount (DialectRevision 0x0311).
        negotiate_context_count, set_negotiate_context_count: u16 = rsp_field::NEGOTIATE_CONTEXT_COUNT;
        /// ServerGuid.
        server_guid, set_server_guid: Guid = rsp_field::SERVER_GUID;
        /// Capabilities.
        capabilities, set_capabilities: Capabilities = rsp_field::CAPABILITIES;
        /// MaxTransactSize.
        max_transact_size, set_max_transact_size: u32 = rsp_field::MAX_TRANSACT_SIZE;
        /// MaxReadSize.
        max_read_size, set_max_read_size: u32 = rsp_field::MAX_READ_SIZE;
        /// MaxWriteSize.
        max_write_size, set_max_write_size: u32 = rsp_field::MAX_WRITE_SIZE;
        /// SystemTime (FILETIME).
        system_time, set_system_time: u64 = rsp_field::SYSTEM_TIME;
        /// ServerStartTime (FILETIME; 0).
        server_start_time, set_server_start_time: u64 = rsp_field::SERVER_START_TIME;
        /// SecurityBufferOffset, from the header.
        security_buffer_offset, set_security_buffer_offset: u16 = rsp_field::SECURITY_BUFFER_OFFSET;
        /// SecurityBufferLength.
        security_buffer_length, set_security_buffer_length: u16 = rsp_field::SECURITY_BUFFER_LENGTH;
        /// NegotiateContextOffset (DialectRevision 0x0311), from the header.
        negotiate_context_offset, set_negotiate_context_offset: u32 = rsp_field::NEGOTIATE_CONTEXT_OFFSET;
    }
}

impl<T: AsRef<[u8]>> NegotiateResponse<T> {
    fn security_region(&self) -> Region {
        Region::new(
            "SecurityBufferOffset",
            u64::from(self.security_buffer_offset()),
            u64::from(self.security_buffer_length()),
        )
    }

    fn has_contexts(&self) -> bool {
        self.dialect_revision() == Dialect::SMB_3_1_1.0 && self.negotiate_context_count() > 0
    }

    fn check_variable(&self) -> Result<(), Smb2Error> {
        let b = self.buffer.as_ref();
        let sec = resolve(Self::WHAT, b.len(), Self::FIXED_LEN, self.security_region())?;
        if self.has_contexts() {
            let list = check_list(
                Self::WHAT,
                b,
                self.negotiate_context_offset(),
                self.negotiate_context_count(),
                Self::FIXED_LEN,
            )?;
            super::layout::check_disjoint(
                Self::WHAT,
                ("SecurityBufferOffset", &sec),
                ("NegotiateContextOffset", &Some(list)),
            )?;
        }
        Ok(())
    }

    /// The security buffer (GSS token).
    pub fn security_buffer(&self) -> &[u8] {
        super::layout::slice(
            self.buffer.as_ref(),
            Self::FIXED_LEN,
            self.security_region(),
        )
    }

    /// The negotiate contexts (empty unless DialectRevision is 0x0311).
    pub fn negotiate_contexts(&self) -> NegotiateContextList<'_> {
        contexts(
            self.buffer.as_ref(),
            self.has_contexts(),
            self.negotiate_context_offset(),
            self.negotiate_context_count(),
        )
    }
}

/// The values of an SMB2 NEGOTIATE Response ([MS-SMB2] 2.2.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NegotiateResponseRepr<'a> {
    /// SecurityMode.
    pub security_mode: SecurityMode,
    /// DialectRevision.
    pub dialect_revision: u16,
    /// ServerGuid.
    pub server_guid: Guid,
    /// Capabilities.
    pub capabilities: Capabilities,
    /// MaxTransactSize.
    pub max_transact_size: u32,
    /// MaxReadSize.
    pub max_read_size: u32,
    /// MaxWriteSize.
    pub max_write_size: u32,
    /// SystemTime (FILETIME).
    pub system_time: u64,
    /// ServerStartTime (FILETIME; [MS-SMB2] says 0).
    pub server_start_time: u64,
    /// Security buffer (GSS token).
    pub security_buffer: &'a [u8],
    /// NegotiateContextList: only with DialectRevision 0x0311.
    pub negotiate_contexts: NegotiateContextList<'a>,
}

impl<'a> NegotiateResponseRepr<'a> {
    /// Reads a checked view.
    pub fn parse(v: &NegotiateResponse<&'a [u8]>) -> Result<Self, Smb2Error> {
        v.check()?;
        let b: &'a [u8] = v.buffer;
        Ok(NegotiateResponseRepr {
            security_mode: v.security_mode(),
            dialect_revision: v.dialect_revision(),
            server_guid: v.server_guid(),
            capabilities: v.capabilities(),
            max_transact_size: v.max_transact_size(),
            max_read_size: v.max_read_size(),
            max_write_size: v.max_write_size(),
            system_time: v.system_time(),
            server_start_time: v.server_start_time(),
            security_buffer: super::layout::slice(
                b,
                NegotiateResponse::<&[u8]>::FIXED_LEN,
                v.security_region(),
            ),
            negotiate_contexts: contexts(
                b,
                v.has_contexts(),
                v.negotiate_context_offset(),
                v.negotiate_context_count(),
            ),
        })
    }

    fn layout(&self) -> (usize, usize) {
        let sec_end = rsp_field::BUFFER + self.security_buffer.len();
        let (start, end) = if self.negotiate_contexts.is_empty() {
            (sec_end, sec_end)
        } else {
            let start = align8(sec_end);
            (start, start + self.negotiate_contexts.byte_len())
        };
        (start, end.max(65))
    }

    /// Bytes [`emit`](Self::emit) writes: the fixed part, the security
    /// buffer at header offset 128, the contexts at the next 8-byte boundary
    /// (at least 65 bytes).
    pub fn buffer_len(&self) -> usize {
        self.layout().1
    }

    /// Writes the response. Fails with `Malformed` for contexts with a
    /// DialectRevision other than 0x0311.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        const WHAT: &str = "SMB2 NEGOTIATE response";
        if !self.negotiate_contexts.is_empty() && self.dialect_revision != Dialect::SMB_3_1_1.0 {
            return Err(Smb2Error::Malformed {
                what: WHAT,
                field: "NegotiateContextList (DialectRevision is not 0x0311)",
            });
        }
        let ctx_count = self.negotiate_contexts.check_emit()?;
        let sec_len: u16 = fit(WHAT, "SecurityBufferLength", self.security_buffer.len())?;
        let (ctx_start, len) = self.layout();
        room(WHAT, buf, len)?;
        let ctx_offset: u32 = fit(WHAT, "NegotiateContextOffset", hdr(ctx_start))?;
        let buf = &mut buf[..len];
        buf.fill(0);
        let mut v = NegotiateResponse::new_unchecked(&mut *buf);
        v.set_structure_size(65);
        v.set_security_mode(self.security_mode);
        v.set_dialect_revision(self.dialect_revision);
        v.set_server_guid(self.server_guid);
        v.set_capabilities(self.capabilities);
        v.set_max_transact_size(self.max_transact_size);
        v.set_max_read_size(self.max_read_size);
        v.set_max_write_size(self.max_write_size);
        v.set_system_time(self.system_time);
        v.set_server_start_time(self.server_start_time);
        v.set_security_buffer_offset(hdr(rsp_field::BUFFER) as u16);
        v.set_security_buffer_length(sec_len);
        if ctx_count > 0 {
            v.set_negotiate_context_count(ctx_count);
            v.set_negotiate_context_offset(ctx_offset);
        }
        super::layout::put(buf, rsp_field::BUFFER, self.security_buffer);
        self.negotiate_contexts.write_to(&mut buf[ctx_start..]);
        Ok(len)
    }
}

impl_body!(
    NegotiateResponseRepr<'a>,
    NegotiateResponse,
    Some(super::Command::Negotiate)
);
