//! Buffer-descriptor slicing for RDMA Write to / Read from a peer buffer
//! ([MS-SMBD] 3.1.4.5 and 3.1.4.6): given the peer's array of Buffer
//! Descriptor V1 elements, an offset into the buffer they describe, and a
//! length, find the first element by consuming Length fields, trim the
//! first element's Offset/Length to its trailing subsegment and the last
//! element's Length to its leading subsegment. Zero-length, overflowing and
//! out-of-range requests are errors, as is a malformed array (an element of
//! length zero, or whose Offset+Length wraps). No allocation: the result is
//! an iterator over the borrowed descriptors.

use super::wire::{BufferDescriptorArray, BufferDescriptorRepr};

/// Random access to a sequence of buffer descriptors, wire view or values.
pub trait DescriptorSource {
    /// Number of elements.
    fn count(&self) -> usize;
    /// Element `i` (`i < count()`).
    fn at(&self, i: usize) -> Option<BufferDescriptorRepr>;
}

impl DescriptorSource for BufferDescriptorArray<'_> {
    fn count(&self) -> usize {
        self.len()
    }
    fn at(&self, i: usize) -> Option<BufferDescriptorRepr> {
        self.get(i)
    }
}

impl DescriptorSource for [BufferDescriptorRepr] {
    fn count(&self) -> usize {
        self.len()
    }
    fn at(&self, i: usize) -> Option<BufferDescriptorRepr> {
        self.get(i).copied()
    }
}

/// One RDMA operation: `length` bytes between the peer's (`remote_offset`,
/// `token`) and the local buffer at `local_offset` (relative to the start of
/// the local buffer passed by the upper layer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdmaSegment {
    /// Peer address/offset to read or write.
    pub remote_offset: u64,
    /// Peer steering tag.
    pub token: u32,
    /// Bytes in this operation (never zero).
    pub length: u32,
    /// Offset into the local buffer.
    pub local_offset: u64,
}

/// Why a slicing request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SliceError {
    /// The array holds no descriptor.
    NoDescriptors,
    /// The transfer length is zero.
    ZeroLength,
    /// Descriptor `index` has Length 0.
    ZeroLengthDescriptor {
        /// Position in the array.
        index: usize,
    },
    /// Descriptor `index`'s Offset + Length overflows 64 bits.
    DescriptorWraps {
        /// Position in the array.
        index: usize,
    },
    /// offset + length overflows.
    Overflow,
    /// The requested range ends past the described buffer.
    OutOfRange {
        /// offset + length requested.
        end: u64,
        /// Total bytes the descriptors describe.
        total: u64,
    },
}

impl core::fmt::Display for SliceError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SliceError::NoDescriptors => f.write_str("no buffer descriptors"),
            SliceError::ZeroLength => f.write_str("zero-length RDMA transfer"),
            SliceError::ZeroLengthDescriptor { index } => {
                write!(f, "buffer descriptor {index} has length 0")
            }
            SliceError::DescriptorWraps { index } => {
                write!(f, "buffer descriptor {index}: Offset+Length overflows")
            }
            SliceError::Overflow => f.write_str("offset+length overflows"),
            SliceError::OutOfRange { end, total } => {
                write!(
                    f,
                    "transfer ends at byte {end}, descriptors cover only {total}"
                )
            }
        }
    }
}

impl std::error::Error for SliceError {}

/// Validates every element and returns the total length they describe.
pub fn validate_descriptors<S: DescriptorSource + ?Sized>(descs: &S) -> Result<u64, SliceError> {
    if descs.count() == 0 {
        return Err(SliceError::NoDescriptors);
    }
    let mut total = 0u64;
    for index in 0..descs.count() {
        let d = descs.at(index).ok_or(SliceError::NoDescriptors)?;
        if d.length == 0 {
            return Err(SliceError::ZeroLengthDescriptor { index });
        }
        if d.offset.checked_add(d.length as u64).is_none() {
            return Err(SliceError::DescriptorWraps { index });
        }
        total += d.length as u64;
    }
    Ok(total)
}

/// [MS-SMBD] 3.1.4.5 / 3.1.4.6: the RDMA operations that move `length`
/// bytes starting `offset` bytes into the buffer `descs` describe.
#[inline]
pub fn slice<'a, S: DescriptorSource + ?Sized>(
    descs: &'a S,
    offset: u64,
    length: u64,
) -> Result<RdmaSegments<'a, S>, SliceError> {
    let total = validate_descriptors(descs)?;
    if length == 0 {
        return Err(SliceError::ZeroLength);
    }
    let end = offset.checked_add(length).ok_or(SliceError::Overflow)?;
    if end > total {
        return Err(SliceError::OutOfRange { end, total });
    }
    // Find the first element by consuming Length fields.
    let mut index = 0;
    let mut skip = offset;
    loop {
        let d = descs
            .at(index)
            .ok_or(SliceError::OutOfRange { end, total })?;
        if skip < d.length as u64 {
            break;
        }
        skip -= d.length as u64;
        index += 1;
    }
    Ok(RdmaSegments {
        descs,
        index,
        skip,
        remaining: length,
        local_offset: 0,
    })
}

/// Iterator of [`RdmaSegment`]s produced by [`slice()`].
#[derive(Debug)]
pub struct RdmaSegments<'a, S: ?Sized> {
    descs: &'a S,
    index: usize,
    skip: u64,
    remaining: u64,
    local_offset: u64,
}

impl<S: DescriptorSource + ?Sized> Iterator for RdmaSegments<'_, S> {
    type Item = RdmaSegment;

    fn next(&mut self) -> Option<RdmaSegment> {
        if self.remaining == 0 {
            return None;
        }
        let d = self.descs.at(self.index)?;
        // `slice` validated skip < d.length and Offset+Length does not wrap.
        let avail = d.length as u64 - self.skip;
        let take = avail.min(self.remaining);
        let seg = RdmaSegment {
            remote_offset: d.offset + self.skip,
            token: d.token,
            length: take as u32,
            local_offset: self.local_offset,
        };
        self.remaining -= take;
        self.local_offset += take;
        self.skip = 0;
        self.index += 1;
        Some(seg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(offset: u64, token: u32, length: u32) -> BufferDescriptorRepr {
        BufferDescriptorRepr {
            offset,
            token,
            length,
        }
    }

    #[test]
    fn slice_trims_first_and_last_elements() {
        let descs = [d(1000, 1, 100), d(5000, 2, 100), d(9000, 3, 100)];
        let segs: Vec<_> = slice(&descs[..], 150, 100).unwrap().collect();
        assert_eq!(
            segs,
            vec![
                RdmaSegment {
                    remote_offset: 5050,
                    token: 2,
                    length: 50,
                    local_offset: 0
                },
                RdmaSegment {
                    remote_offset: 9000,
                    token: 3,
                    length: 50,
                    local_offset: 50
                },
            ]
        );
    }

    #[test]
    fn slice_within_one_element() {
        let descs = [d(0, 7, 4096)];
        let segs: Vec<_> = slice(&descs[..], 10, 20).unwrap().collect();
        assert_eq!(
            segs,
            vec![RdmaSegment {
                remote_offset: 10,
                token: 7,
                length: 20,
                local_offset: 0
            }]
        );
    }

    #[test]
    fn slice_refuses_zero_overflow_and_out_of_range() {
        let descs = [d(0, 7, 4096), d(8192, 8, 4096)];
        assert_eq!(slice(&descs[..], 0, 0).unwrap_err(), SliceError::ZeroLength);
        assert_eq!(
            slice(&descs[..], u64::MAX, 2).unwrap_err(),
            SliceError::Overflow
        );
        assert_eq!(
            slice(&descs[..], 4000, 4197).unwrap_err(),
            SliceError::OutOfRange {
                end: 8197,
                total: 8192
            }
        );
        assert_eq!(slice(&[][..], 0, 1).unwrap_err(), SliceError::NoDescriptors);
        let bad = [d(0, 1, 10), d(5, 2, 0)];
        assert_eq!(
            slice(&bad[..], 0, 1).unwrap_err(),
            SliceError::ZeroLengthDescriptor { index: 1 }
        );
        let wraps = [d(u64::MAX - 3, 1, 10)];
        assert_eq!(
            slice(&wraps[..], 0, 1).unwrap_err(),
            SliceError::DescriptorWraps { index: 0 }
        );
    }
}
