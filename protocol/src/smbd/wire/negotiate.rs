//! [MS-SMBD] 2.2.1 Negotiate Request and 2.2.2 Negotiate Response.

use super::{check_len, le16, le32, set_le16, set_le32};
use crate::ntstatus::NtStatus;
use crate::WireError;

mod req_field {
    use crate::smbd::wire::Field;
    pub const MIN_VERSION: Field = 0..2;
    pub const MAX_VERSION: Field = 2..4;
    pub const RESERVED: Field = 4..6;
    pub const CREDITS_REQUESTED: Field = 6..8;
    pub const PREFERRED_SEND_SIZE: Field = 8..12;
    pub const MAX_RECEIVE_SIZE: Field = 12..16;
    pub const MAX_FRAGMENTED_SIZE: Field = 16..20;
}

mod rsp_field {
    use crate::smbd::wire::Field;
    pub const MIN_VERSION: Field = 0..2;
    pub const MAX_VERSION: Field = 2..4;
    pub const NEGOTIATED_VERSION: Field = 4..6;
    pub const RESERVED: Field = 6..8;
    pub const CREDITS_REQUESTED: Field = 8..10;
    pub const CREDITS_GRANTED: Field = 10..12;
    pub const STATUS: Field = 12..16;
    pub const MAX_READ_WRITE_SIZE: Field = 16..20;
    pub const PREFERRED_SEND_SIZE: Field = 20..24;
    pub const MAX_RECEIVE_SIZE: Field = 24..28;
    pub const MAX_FRAGMENTED_SIZE: Field = 28..32;
}

/// A zero-copy view of a Negotiate Request ([MS-SMBD] 2.2.1).
#[derive(Debug, Clone)]
pub struct NegotiateRequest<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> NegotiateRequest<T> {
    /// Length of the message: 20 bytes ([MS-SMBD] 3.1.5.6 requires at least 20).
    pub const LEN: usize = 20;

    /// Wraps `buffer` without checking its length.
    pub const fn new_unchecked(buffer: T) -> Self {
        NegotiateRequest { buffer }
    }

    /// Wraps `buffer`, failing unless it holds at least [`Self::LEN`] bytes.
    /// Longer messages are accepted: the receive buffer may be larger and
    /// trailing bytes are ignored.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        check_len("SMBD negotiate request", buffer.as_ref().len(), Self::LEN)?;
        Ok(NegotiateRequest { buffer })
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// MinVersion.
    pub fn min_version(&self) -> u16 {
        le16(self.buffer.as_ref(), req_field::MIN_VERSION)
    }
    /// MaxVersion.
    pub fn max_version(&self) -> u16 {
        le16(self.buffer.as_ref(), req_field::MAX_VERSION)
    }
    /// Reserved (ignored on receipt).
    pub fn reserved(&self) -> u16 {
        le16(self.buffer.as_ref(), req_field::RESERVED)
    }
    /// CreditsRequested.
    pub fn credits_requested(&self) -> u16 {
        le16(self.buffer.as_ref(), req_field::CREDITS_REQUESTED)
    }
    /// PreferredSendSize.
    pub fn preferred_send_size(&self) -> u32 {
        le32(self.buffer.as_ref(), req_field::PREFERRED_SEND_SIZE)
    }
    /// MaxReceiveSize.
    pub fn max_receive_size(&self) -> u32 {
        le32(self.buffer.as_ref(), req_field::MAX_RECEIVE_SIZE)
    }
    /// MaxFragmentedSize.
    pub fn max_fragmented_size(&self) -> u32 {
        le32(self.buffer.as_ref(), req_field::MAX_FRAGMENTED_SIZE)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> NegotiateRequest<T> {
    fn b(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }
    /// Sets MinVersion.
    pub fn set_min_version(&mut self, v: u16) {
        set_le16(self.b(), req_field::MIN_VERSION, v)
    }
    /// Sets MaxVersion.
    pub fn set_max_version(&mut self, v: u16) {
        set_le16(self.b(), req_field::MAX_VERSION, v)
    }
    /// Sets Reserved.
    pub fn set_reserved(&mut self, v: u16) {
        set_le16(self.b(), req_field::RESERVED, v)
    }
    /// Sets CreditsRequested.
    pub fn set_credits_requested(&mut self, v: u16) {
        set_le16(self.b(), req_field::CREDITS_REQUESTED, v)
    }
    /// Sets PreferredSendSize.
    pub fn set_preferred_send_size(&mut self, v: u32) {
        set_le32(self.b(), req_field::PREFERRED_SEND_SIZE, v)
    }
    /// Sets MaxReceiveSize.
    pub fn set_max_receive_size(&mut self, v: u32) {
        set_le32(self.b(), req_field::MAX_RECEIVE_SIZE, v)
    }
    /// Sets MaxFragmentedSize.
    pub fn set_max_fragmented_size(&mut self, v: u32) {
        set_le32(self.b(), req_field::MAX_FRAGMENTED_SIZE, v)
    }
}

/// The values of a Negotiate Request ([MS-SMBD] 2.2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NegotiateRequestRepr {
    /// MinVersion.
    pub min_version: u16,
    /// MaxVersion.
    pub max_version: u16,
    /// CreditsRequested.
    pub credits_requested: u16,
    /// PreferredSendSize.
    pub preferred_send_size: u32,
    /// MaxReceiveSize.
    pub max_receive_size: u32,
    /// MaxFragmentedSize.
    pub max_fragmented_size: u32,
}

impl NegotiateRequestRepr {
    /// Reads the fields of a checked view. Value rules (version range,
    /// minimum sizes) are the receiver's business ([MS-SMBD] 3.1.5.6), not
    /// the codec's, because they have different outcomes.
    pub fn parse<T: AsRef<[u8]>>(p: &NegotiateRequest<T>) -> Self {
        NegotiateRequestRepr {
            min_version: p.min_version(),
            max_version: p.max_version(),
            credits_requested: p.credits_requested(),
            preferred_send_size: p.preferred_send_size(),
            max_receive_size: p.max_receive_size(),
            max_fragmented_size: p.max_fragmented_size(),
        }
    }

    /// Bytes [`Self::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        NegotiateRequest::<&[u8]>::LEN
    }

    /// Writes the message into the first [`Self::buffer_len`] bytes of `p`,
    /// with Reserved set to 0.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut NegotiateRequest<T>) {
        p.set_min_version(self.min_version);
        p.set_max_version(self.max_version);
        p.set_reserved(0);
        p.set_credits_requested(self.credits_requested);
        p.set_preferred_send_size(self.preferred_send_size);
        p.set_max_receive_size(self.max_receive_size);
        p.set_max_fragmented_size(self.max_fragmented_size);
    }

    /// Emits into a fresh array.
    pub fn to_bytes(&self) -> [u8; 20] {
        let mut b = [0u8; 20];
        self.emit(&mut NegotiateRequest::new_unchecked(&mut b[..]));
        b
    }
}

/// A zero-copy view of a Negotiate Response ([MS-SMBD] 2.2.2).
#[derive(Debug, Clone)]
pub struct NegotiateResponse<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> NegotiateResponse<T> {
    /// Length of the message: 32 bytes ([MS-SMBD] 3.1.5.7 requires at least 32).
    pub const LEN: usize = 32;

    /// Wraps `buffer` without checking its length.
    pub const fn new_unchecked(buffer: T) -> Self {
        NegotiateResponse { buffer }
    }

    /// Wraps `buffer`, failing unless it holds at least [`Self::LEN`] bytes.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        check_len("SMBD negotiate response", buffer.as_ref().len(), Self::LEN)?;
        Ok(NegotiateResponse { buffer })
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// MinVersion.
    pub fn min_version(&self) -> u16 {
        le16(self.buffer.as_ref(), rsp_field::MIN_VERSION)
    }
    /// MaxVersion.
    pub fn max_version(&self) -> u16 {
        le16(self.buffer.as_ref(), rsp_field::MAX_VERSION)
    }
    /// NegotiatedVersion.
    pub fn negotiated_version(&self) -> u16 {
        le16(self.buffer.as_ref(), rsp_field::NEGOTIATED_VERSION)
    }
    /// Reserved (ignored on receipt).
    pub fn reserved(&self) -> u16 {
        le16(self.buffer.as_ref(), rsp_field::RESERVED)
    }
    /// CreditsRequested.
    pub fn credits_requested(&self) -> u16 {
        le16(self.buffer.as_ref(), rsp_field::CREDITS_REQUESTED)
    }
    /// CreditsGranted.
    pub fn credits_granted(&self) -> u16 {
        le16(self.buffer.as_ref(), rsp_field::CREDITS_GRANTED)
    }
    /// Status.
    pub fn status(&self) -> NtStatus {
        NtStatus(le32(self.buffer.as_ref(), rsp_field::STATUS))
    }
    /// MaxReadWriteSize.
    pub fn max_read_write_size(&self) -> u32 {
        le32(self.buffer.as_ref(), rsp_field::MAX_READ_WRITE_SIZE)
    }
    /// PreferredSendSize.
    pub fn preferred_send_size(&self) -> u32 {
        le32(self.buffer.as_ref(), rsp_field::PREFERRED_SEND_SIZE)
    }
    /// MaxReceiveSize.
    pub fn max_receive_size(&self) -> u32 {
        le32(self.buffer.as_ref(), rsp_field::MAX_RECEIVE_SIZE)
    }
    /// MaxFragmentedSize.
    pub fn max_fragmented_size(&self) -> u32 {
        le32(self.buffer.as_ref(), rsp_field::MAX_FRAGMENTED_SIZE)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> NegotiateResponse<T> {
    fn b(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }
    /// Sets MinVersion.
    pub fn set_min_version(&mut self, v: u16) {
        set_le16(self.b(), rsp_field::MIN_VERSION, v)
    }
    /// Sets MaxVersion.
    pub fn set_max_version(&mut self, v: u16) {
        set_le16(self.b(), rsp_field::MAX_VERSION, v)
    }
    /// Sets NegotiatedVersion.
    pub fn set_negotiated_version(&mut self, v: u16) {
        set_le16(self.b(), rsp_field::NEGOTIATED_VERSION, v)
    }
    /// Sets Reserved.
    pub fn set_reserved(&mut self, v: u16) {
        set_le16(self.b(), rsp_field::RESERVED, v)
    }
    /// Sets CreditsRequested.
    pub fn set_credits_requested(&mut self, v: u16) {
        set_le16(self.b(), rsp_field::CREDITS_REQUESTED, v)
    }
    /// Sets CreditsGranted.
    pub fn set_credits_granted(&mut self, v: u16) {
        set_le16(self.b(), rsp_field::CREDITS_GRANTED, v)
    }
    /// Sets Status.
    pub fn set_status(&mut self, v: NtStatus) {
        set_le32(self.b(), rsp_field::STATUS, v.0)
    }
    /// Sets MaxReadWriteSize.
    pub fn set_max_read_write_size(&mut self, v: u32) {
        set_le32(self.b(), rsp_field::MAX_READ_WRITE_SIZE, v)
    }
    /// Sets PreferredSendSize.
    pub fn set_preferred_send_size(&mut self, v: u32) {
        set_le32(self.b(), rsp_field::PREFERRED_SEND_SIZE, v)
    }
    /// Sets MaxReceiveSize.
    pub fn set_max_receive_size(&mut self, v: u32) {
        set_le32(self.b(), rsp_field::MAX_RECEIVE_SIZE, v)
    }
    /// Sets MaxFragmentedSize.
    pub fn set_max_fragmented_size(&mut self, v: u32) {
        set_le32(self.b(), rsp_field::MAX_FRAGMENTED_SIZE, v)
    }
}

/// The values of a Negotiate Response ([MS-SMBD] 2.2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NegotiateResponseRepr {
    /// MinVersion.
    pub min_version: u16,
    /// MaxVersion.
    pub max_version: u16,
    /// NegotiatedVersion.
    pub negotiated_version: u16,
    /// CreditsRequested.
    pub credits_requested: u16,
    /// CreditsGranted.
    pub credits_granted: u16,
    /// Status.
    pub status: NtStatus,
    /// MaxReadWriteSize.
    pub max_read_write_size: u32,
    /// PreferredSendSize.
    pub preferred_send_size: u32,
    /// MaxReceiveSize.
    pub max_receive_size: u32,
    /// MaxFragmentedSize.
    pub max_fragmented_size: u32,
}

impl NegotiateResponseRepr {
    /// Reads the fields of a checked view (value rules are 3.1.5.7's).
    pub fn parse<T: AsRef<[u8]>>(p: &NegotiateResponse<T>) -> Self {
        NegotiateResponseRepr {
            min_version: p.min_version(),
            max_version: p.max_version(),
            negotiated_version: p.negotiated_version(),
            credits_requested: p.credits_requested(),
            credits_granted: p.credits_granted(),
            status: p.status(),
            max_read_write_size: p.max_read_write_size(),
            preferred_send_size: p.preferred_send_size(),
            max_receive_size: p.max_receive_size(),
            max_fragmented_size: p.max_fragmented_size(),
        }
    }

    /// [MS-SMBD] 3.1.5.3: a failure response carries MinVersion/MaxVersion
    /// 0x0100, the Status, and zero in every other field.
    pub fn failure(status: NtStatus) -> Self {
        NegotiateResponseRepr {
            min_version: crate::smbd::config::SMBD_VERSION_1,
            max_version: crate::smbd::config::SMBD_VERSION_1,
            negotiated_version: 0,
            credits_requested: 0,
            credits_granted: 0,
            status,
            max_read_write_size: 0,
            preferred_send_size: 0,
            max_receive_size: 0,
            max_fragmented_size: 0,
        }
    }

    /// Bytes [`Self::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        NegotiateResponse::<&[u8]>::LEN
    }

    /// Writes the message, with Reserved set to 0.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut NegotiateResponse<T>) {
        p.set_min_version(self.min_version);
        p.set_max_version(self.max_version);
        p.set_negotiated_version(self.negotiated_version);
        p.set_reserved(0);
        p.set_credits_requested(self.credits_requested);
        p.set_credits_granted(self.credits_granted);
        p.set_status(self.status);
        p.set_max_read_write_size(self.max_read_write_size);
        p.set_preferred_send_size(self.preferred_send_size);
        p.set_max_receive_size(self.max_receive_size);
        p.set_max_fragmented_size(self.max_fragmented_size);
    }

    /// Emits into a fresh array.
    pub fn to_bytes(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        self.emit(&mut NegotiateResponse::new_unchecked(&mut b[..]));
        b
    }
}
