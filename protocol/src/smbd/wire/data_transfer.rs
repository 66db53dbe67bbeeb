//! [MS-SMBD] 2.2.3 Data Transfer message.

use super::{check_len, le16, le32, set_le16, set_le32};
use crate::WireError;

mod field {
    use crate::smbd::wire::Field;
    pub const CREDITS_REQUESTED: Field = 0..2;
    pub const CREDITS_GRANTED: Field = 2..4;
    pub const FLAGS: Field = 4..6;
    pub const RESERVED: Field = 6..8;
    pub const REMAINING_DATA_LENGTH: Field = 8..12;
    pub const DATA_OFFSET: Field = 12..16;
    pub const DATA_LENGTH: Field = 16..20;
}

/// [MS-SMBD] 2.2.3 Flags: the peer is asked to respond promptly (keepalive).
pub const SMB_DIRECT_RESPONSE_REQUESTED: u16 = 0x0001;

const WHAT: &str = "SMBD data transfer";

/// Which payload rule a Data Transfer message breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadError {
    /// DataOffset is not 8-byte aligned ([MS-SMBD] 2.2.3, 3.1.5.8).
    Unaligned,
    /// A payload would overlap the 20-byte header.
    InsideHeader,
    /// DataOffset + DataLength exceeds the message ([MS-SMBD] 3.1.5.8).
    BeyondMessage,
}

impl PayloadError {
    /// The field description used in [`WireError::Malformed`].
    pub fn field(self) -> &'static str {
        match self {
            PayloadError::Unaligned => "DataOffset (not 8-byte aligned)",
            PayloadError::InsideHeader => "DataOffset (inside the header)",
            PayloadError::BeyondMessage => "DataOffset+DataLength (beyond the message)",
        }
    }
}

/// A zero-copy view of a Data Transfer message ([MS-SMBD] 2.2.3).
#[derive(Debug, Clone)]
pub struct DataTransfer<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> DataTransfer<T> {
    /// Fixed header length; [MS-SMBD] 3.1.5.8 requires at least this many bytes.
    pub const HEADER_LEN: usize = 20;

    /// Wraps `buffer` without checking it.
    pub const fn new_unchecked(buffer: T) -> Self {
        DataTransfer { buffer }
    }

    /// Wraps `buffer`, failing unless it holds the 20-byte header. The
    /// payload fields are checked by [`Self::check_payload`].
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        check_len(WHAT, buffer.as_ref().len(), Self::HEADER_LEN)?;
        Ok(DataTransfer { buffer })
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Length of the received message.
    pub fn len(&self) -> usize {
        self.buffer.as_ref().len()
    }

    /// Never true for a checked view.
    pub fn is_empty(&self) -> bool {
        self.buffer.as_ref().is_empty()
    }

    /// CreditsRequested: the total credits the sender asks to hold.
    pub fn credits_requested(&self) -> u16 {
        le16(self.buffer.as_ref(), field::CREDITS_REQUESTED)
    }
    /// CreditsGranted: credits the sender adds to ours.
    pub fn credits_granted(&self) -> u16 {
        le16(self.buffer.as_ref(), field::CREDITS_GRANTED)
    }
    /// Flags.
    pub fn flags(&self) -> u16 {
        le16(self.buffer.as_ref(), field::FLAGS)
    }
    /// Reserved (ignored on receipt).
    pub fn reserved(&self) -> u16 {
        le16(self.buffer.as_ref(), field::RESERVED)
    }
    /// RemainingDataLength.
    pub fn remaining_data_length(&self) -> u32 {
        le32(self.buffer.as_ref(), field::REMAINING_DATA_LENGTH)
    }
    /// DataOffset.
    pub fn data_offset(&self) -> u32 {
        le32(self.buffer.as_ref(), field::DATA_OFFSET)
    }
    /// DataLength.
    pub fn data_length(&self) -> u32 {
        le32(self.buffer.as_ref(), field::DATA_LENGTH)
    }

    /// [MS-SMBD] 3.1.5.8: "The received DataOffset field is 8-byte aligned"
    /// and "the sum of the received DataOffset and DataLength fields are less
    /// than or equal to the length of the received message" (checked for
    /// every message, including one with DataLength 0). Also refuses a
    /// non-empty payload that overlaps the 20-byte header (see
    /// docs/spec-notes.md, "DataOffset inside the header"). On success
    /// returns the payload's byte range within the message (`0..0` when
    /// DataLength is 0).
    pub fn check_payload(&self) -> Result<core::ops::Range<usize>, WireError> {
        self.payload_range().map_err(|e| WireError::Malformed {
            what: WHAT,
            field: e.field(),
        })
    }

    /// [`Self::check_payload`] with the failed rule as a value, for callers
    /// that act on which rule broke (the connection's terminate reason).
    pub fn payload_range(&self) -> Result<core::ops::Range<usize>, PayloadError> {
        let off = self.data_offset() as u64;
        let len = self.data_length() as u64;
        if off % 8 != 0 {
            return Err(PayloadError::Unaligned);
        }
        if len != 0 && off < Self::HEADER_LEN as u64 {
            return Err(PayloadError::InsideHeader);
        }
        if off + len > self.len() as u64 {
            return Err(PayloadError::BeyondMessage);
        }
        if len == 0 {
            return Ok(0..0);
        }
        // Both fit in the message length, which is a usize.
        Ok(off as usize..(off + len) as usize)
    }

    /// The payload, after [`Self::check_payload`] succeeds.
    pub fn payload(&self) -> Result<&[u8], WireError> {
        let r = self.check_payload()?;
        Ok(&self.buffer.as_ref()[r])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> DataTransfer<T> {
    fn b(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }
    /// Sets CreditsRequested.
    pub fn set_credits_requested(&mut self, v: u16) {
        set_le16(self.b(), field::CREDITS_REQUESTED, v)
    }
    /// Sets CreditsGranted.
    pub fn set_credits_granted(&mut self, v: u16) {
        set_le16(self.b(), field::CREDITS_GRANTED, v)
    }
    /// Sets Flags.
    pub fn set_flags(&mut self, v: u16) {
        set_le16(self.b(), field::FLAGS, v)
    }
    /// Sets Reserved.
    pub fn set_reserved(&mut self, v: u16) {
        set_le16(self.b(), field::RESERVED, v)
    }
    /// Sets RemainingDataLength.
    pub fn set_remaining_data_length(&mut self, v: u32) {
        set_le32(self.b(), field::REMAINING_DATA_LENGTH, v)
    }
    /// Sets DataOffset.
    pub fn set_data_offset(&mut self, v: u32) {
        set_le32(self.b(), field::DATA_OFFSET, v)
    }
    /// Sets DataLength.
    pub fn set_data_length(&mut self, v: u32) {
        set_le32(self.b(), field::DATA_LENGTH, v)
    }
}

/// The header values of a Data Transfer message ([MS-SMBD] 2.2.3). The
/// payload itself is not part of the Repr: on receive it stays in the
/// receive buffer (zero-copy), on send the caller places it at
/// `data_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DataTransferRepr {
    /// CreditsRequested.
    pub credits_requested: u16,
    /// CreditsGranted.
    pub credits_granted: u16,
    /// Flags.
    pub flags: u16,
    /// RemainingDataLength.
    pub remaining_data_length: u32,
    /// DataOffset (0 when there is no payload, else 8-aligned and ≥ 24).
    pub data_offset: u32,
    /// DataLength.
    pub data_length: u32,
}

impl DataTransferRepr {
    /// Parses a checked view, applying the structural checks of
    /// [`DataTransfer::check_payload`].
    pub fn parse<T: AsRef<[u8]>>(p: &DataTransfer<T>) -> Result<Self, WireError> {
        p.check_payload()?;
        Ok(DataTransferRepr {
            credits_requested: p.credits_requested(),
            credits_granted: p.credits_granted(),
            flags: p.flags(),
            remaining_data_length: p.remaining_data_length(),
            data_offset: p.data_offset(),
            data_length: p.data_length(),
        })
    }

    /// A header for `data_length` payload bytes at the usual offset 24 (or an
    /// empty message with offset and length 0, [MS-SMBD] 3.1.5.4).
    pub fn with_payload(data_length: u32, remaining_data_length: u32) -> Self {
        DataTransferRepr {
            data_offset: if data_length == 0 {
                0
            } else {
                crate::smbd::config::DATA_TRANSFER_PAYLOAD_OFFSET as u32
            },
            data_length,
            remaining_data_length,
            ..Default::default()
        }
    }

    /// Message length: the header alone for an empty message, else through
    /// the end of the payload.
    pub fn buffer_len(&self) -> usize {
        if self.data_length == 0 {
            DataTransfer::<&[u8]>::HEADER_LEN
        } else {
            self.data_offset as usize + self.data_length as usize
        }
    }

    /// Writes the header and zeroes Reserved and the padding up to
    /// `data_offset` ([MS-SMBD] 3.1.5.4: "Padding MUST be set to 0x00000000
    /// for the length indicated by DataOffset - 20"). Returns the header
    /// length written (where the payload goes). `buf` must hold
    /// `max(20, data_offset)` bytes.
    pub fn emit_header(&self, buf: &mut [u8]) -> usize {
        let mut p = DataTransfer::new_unchecked(&mut *buf);
        p.set_credits_requested(self.credits_requested);
        p.set_credits_granted(self.credits_granted);
        p.set_flags(self.flags);
        p.set_reserved(0);
        p.set_remaining_data_length(self.remaining_data_length);
        p.set_data_offset(self.data_offset);
        p.set_data_length(self.data_length);
        let hdr = DataTransfer::<&[u8]>::HEADER_LEN;
        let end = (self.data_offset as usize).max(hdr);
        if end > hdr {
            buf[hdr..end].fill(0);
        }
        end
    }

    /// The 24 bytes [`Self::emit_header`] writes for a whole message of
    /// `data_length` bytes (Flags 0, RemainingDataLength 0, DataOffset 24,
    /// zero padding), built in registers for the per-message fast path
    /// (`Connection::transmit_now`). The same bytes: see the wire tests.
    #[inline]
    pub fn whole_message_header(
        credits_requested: u16,
        credits_granted: u16,
        data_length: u32,
    ) -> [u8; 24] {
        let mut h = [0u8; 24];
        h[field::CREDITS_REQUESTED].copy_from_slice(&credits_requested.to_le_bytes());
        h[field::CREDITS_GRANTED].copy_from_slice(&credits_granted.to_le_bytes());
        h[field::DATA_OFFSET].copy_from_slice(&24u32.to_le_bytes());
        h[field::DATA_LENGTH].copy_from_slice(&data_length.to_le_bytes());
        h
    }

    /// Writes header, padding and `payload` (which must be `data_length`
    /// bytes) into `buf`; returns the message length.
    pub fn emit(&self, buf: &mut [u8], payload: &[u8]) -> usize {
        debug_assert_eq!(payload.len(), self.data_length as usize);
        let at = self.emit_header(buf);
        buf[at..at + payload.len()].copy_from_slice(payload);
        self.buffer_len()
    }
}
