//! [MS-SMBD] 2.2.3.1 Buffer Descriptor V1 structure and arrays of it.

use super::{le32, le64, set_le32, set_le64};
use crate::WireError;

mod field {
    use crate::smbd::wire::Field;
    pub const OFFSET: Field = 0..8;
    pub const TOKEN: Field = 8..12;
    pub const LENGTH: Field = 12..16;
}

/// A zero-copy view of one SMB_DIRECT_BUFFER_DESCRIPTOR_V1.
#[derive(Debug, Clone)]
pub struct BufferDescriptor<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> BufferDescriptor<T> {
    /// Encoded length: 16 bytes.
    pub const LEN: usize = 16;

    /// Wraps `buffer` without checking it.
    pub const fn new_unchecked(buffer: T) -> Self {
        BufferDescriptor { buffer }
    }

    /// Wraps `buffer`, failing unless it holds 16 bytes.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        super::check_len("SMBD buffer descriptor", buffer.as_ref().len(), Self::LEN)?;
        Ok(BufferDescriptor { buffer })
    }

    /// Offset: provider-specific address of the first byte.
    pub fn offset(&self) -> u64 {
        le64(self.buffer.as_ref(), field::OFFSET)
    }
    /// Token: the steering tag.
    pub fn token(&self) -> u32 {
        le32(self.buffer.as_ref(), field::TOKEN)
    }
    /// Length in bytes.
    pub fn length(&self) -> u32 {
        le32(self.buffer.as_ref(), field::LENGTH)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> BufferDescriptor<T> {
    /// Sets Offset.
    pub fn set_offset(&mut self, v: u64) {
        set_le64(self.buffer.as_mut(), field::OFFSET, v)
    }
    /// Sets Token.
    pub fn set_token(&mut self, v: u32) {
        set_le32(self.buffer.as_mut(), field::TOKEN, v)
    }
    /// Sets Length.
    pub fn set_length(&mut self, v: u32) {
        set_le32(self.buffer.as_mut(), field::LENGTH, v)
    }
}

/// The values of one Buffer Descriptor V1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct BufferDescriptorRepr {
    /// Offset (remote address or offset, provider-specific).
    pub offset: u64,
    /// Token (steering tag / rkey).
    pub token: u32,
    /// Length in bytes.
    pub length: u32,
}

impl BufferDescriptorRepr {
    /// Reads a checked view.
    pub fn parse<T: AsRef<[u8]>>(p: &BufferDescriptor<T>) -> Self {
        BufferDescriptorRepr {
            offset: p.offset(),
            token: p.token(),
            length: p.length(),
        }
    }
    /// 16.
    pub const fn buffer_len(&self) -> usize {
        16
    }
    /// Writes the descriptor.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut BufferDescriptor<T>) {
        p.set_offset(self.offset);
        p.set_token(self.token);
        p.set_length(self.length);
    }
    /// Emits into a fresh array.
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        self.emit(&mut BufferDescriptor::new_unchecked(&mut b[..]));
        b
    }
}

/// A zero-copy view of an array of Buffer Descriptor V1 structures, as the
/// upper layer embeds them (e.g. an SMB2 READ/WRITE channel info).
#[derive(Debug, Clone, Copy)]
pub struct BufferDescriptorArray<'a> {
    bytes: &'a [u8],
}

impl<'a> BufferDescriptorArray<'a> {
    /// Wraps `bytes`, which must be a whole number (≥ 1) of 16-byte
    /// descriptors. Fewer than 16 bytes is `Truncated` (not even one
    /// descriptor); a longer length that is not a multiple of 16 is
    /// `Malformed`.
    pub fn new_checked(bytes: &'a [u8]) -> Result<Self, WireError> {
        const WHAT: &str = "SMBD buffer descriptor array";
        if bytes.len() < BufferDescriptor::<&[u8]>::LEN {
            return Err(WireError::Truncated {
                what: WHAT,
                need: 16,
                have: bytes.len(),
            });
        }
        if bytes.len() % BufferDescriptor::<&[u8]>::LEN != 0 {
            return Err(WireError::Malformed {
                what: WHAT,
                field: "length (not a multiple of 16)",
            });
        }
        Ok(BufferDescriptorArray { bytes })
    }

    /// Number of descriptors.
    pub fn len(&self) -> usize {
        self.bytes.len() / 16
    }

    /// Never true for a checked array.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Descriptor `i`, if present.
    pub fn get(&self, i: usize) -> Option<BufferDescriptorRepr> {
        let b = self
            .bytes
            .get(i.checked_mul(16)?..i.checked_mul(16)?.checked_add(16)?)?;
        Some(BufferDescriptorRepr::parse(
            &BufferDescriptor::new_unchecked(b),
        ))
    }

    /// Iterates the descriptors in order.
    pub fn iter(&self) -> impl Iterator<Item = BufferDescriptorRepr> + 'a {
        self.bytes
            .chunks_exact(16)
            .map(|c| BufferDescriptorRepr::parse(&BufferDescriptor::new_unchecked(c)))
    }

    /// Sum of the descriptors' Length fields (u64: cannot overflow for any
    /// array that fits in memory).
    pub fn total_length(&self) -> u64 {
        self.iter().map(|d| d.length as u64).sum()
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }
}
