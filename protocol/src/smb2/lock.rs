//! [MS-SMB2] 2.2.26 SMB2 LOCK Request (with 2.2.26.1 SMB2_LOCK_ELEMENT)
//! and 2.2.27 SMB2 LOCK Response.

use super::error::Smb2Error;
use super::file_id::FileId;
use super::layout::{fit, room};
use super::{Command, Scalar};
use crate::ntstatus::{NtStatus, STATUS_INVALID_LOCK_RANGE, STATUS_INVALID_PARAMETER};

bitmask! {
    /// [MS-SMB2] 2.2.26.1 Flags.
    pub struct LockFlags(u32) {
        /// SMB2_LOCKFLAG_SHARED_LOCK.
        SHARED = 0x0000_0001;
        /// SMB2_LOCKFLAG_EXCLUSIVE_LOCK.
        EXCLUSIVE = 0x0000_0002;
        /// SMB2_LOCKFLAG_UNLOCK.
        UNLOCK = 0x0000_0004;
        /// SMB2_LOCKFLAG_FAIL_IMMEDIATELY.
        FAIL_IMMEDIATELY = 0x0000_0010;
    }
}

impl LockFlags {
    /// True for the five combinations [MS-SMB2] 2.2.26.1 defines: SHARED,
    /// EXCLUSIVE, SHARED | FAIL_IMMEDIATELY, EXCLUSIVE | FAIL_IMMEDIATELY,
    /// UNLOCK.
    pub const fn is_valid_combination(self) -> bool {
        matches!(self.0, 0x01 | 0x02 | 0x11 | 0x12 | 0x04)
    }
}

/// Byte ranges of [MS-SMB2] 2.2.26.1 (relative to the element).
mod elem_field {
    use crate::smb2::Field;
    pub const OFFSET: Field = 0..8;
    pub const LENGTH: Field = 8..16;
    pub const FLAGS: Field = 16..20;
    pub const RESERVED: Field = 20..24;
    /// Length of an element.
    pub const LEN: usize = 24;
}

/// One SMB2_LOCK_ELEMENT ([MS-SMB2] 2.2.26.1): Offset (8), Length (8),
/// Flags (4), Reserved (4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LockElement {
    /// Offset: the first byte of the range.
    pub offset: u64,
    /// Length: bytes in the range.
    pub length: u64,
    /// Flags.
    pub flags: LockFlags,
}

impl LockElement {
    /// Encoded length.
    pub const LEN: usize = elem_field::LEN;

    /// From 24 wire bytes (Reserved ignored).
    pub fn from_bytes(b: &[u8]) -> LockElement {
        LockElement {
            offset: u64::read(b, elem_field::OFFSET),
            length: u64::read(b, elem_field::LENGTH),
            flags: LockFlags::read(b, elem_field::FLAGS),
        }
    }

    /// Writes the 24 wire bytes (Reserved 0) to the start of `dst`.
    fn write(&self, dst: &mut [u8]) {
        self.offset.write(dst, elem_field::OFFSET);
        self.length.write(dst, elem_field::LENGTH);
        self.flags.write(dst, elem_field::FLAGS);
        0u32.write(dst, elem_field::RESERVED);
    }

    /// True when the range's last byte (Offset + Length - 1) overflows 64
    /// bits ([MS-FSA], byte-range lock: STATUS_INVALID_LOCK_RANGE). A zero-length
    /// range never does.
    pub const fn range_overflows(&self) -> bool {
        self.length != 0 && self.offset.checked_add(self.length - 1).is_none()
    }
}

/// The Locks array: borrowed wire bytes (a whole number of elements) or a
/// slice to emit. Two arrays are equal when their elements are.
#[derive(Clone, Copy)]
pub struct LockElements<'a>(Inner<'a>);

#[derive(Clone, Copy)]
enum Inner<'a> {
    Wire(&'a [u8]),
    Slice(&'a [LockElement]),
}

impl<'a> LockElements<'a> {
    /// Elements to emit.
    pub const fn new(elements: &'a [LockElement]) -> Self {
        LockElements(Inner::Slice(elements))
    }

    pub(crate) const fn from_wire(bytes: &'a [u8]) -> Self {
        LockElements(Inner::Wire(bytes))
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self.0 {
            Inner::Wire(b) => b.len() / elem_field::LEN,
            Inner::Slice(s) => s.len(),
        }
    }

    /// True when there is none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i`.
    pub fn get(&self, i: usize) -> Option<LockElement> {
        match self.0 {
            Inner::Wire(b) => {
                let at = i.checked_mul(elem_field::LEN)?;
                b.get(at..at.checked_add(elem_field::LEN)?)
                    .map(LockElement::from_bytes)
            }
            Inner::Slice(s) => s.get(i).copied(),
        }
    }

    /// The elements in order.
    pub fn iter(&self) -> impl Iterator<Item = LockElement> + 'a {
        let (b, s): (&'a [u8], &'a [LockElement]) = match self.0 {
            Inner::Wire(b) => (b, &[]),
            Inner::Slice(s) => (&[], s),
        };
        b.chunks_exact(elem_field::LEN)
            .map(LockElement::from_bytes)
            .chain(s.iter().copied())
    }
}

impl PartialEq for LockElements<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for LockElements<'_> {}

impl core::fmt::Debug for LockElements<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Default for LockElements<'_> {
    fn default() -> Self {
        LockElements::new(&[])
    }
}

/// Byte ranges of [MS-SMB2] 2.2.26.
mod req_field {
    use crate::smb2::Field;
    pub const LOCK_COUNT: Field = 2..4;
    pub const LOCK_SEQUENCE: Field = 4..8;
    pub const FILE_ID: Field = 8..24;
    /// Locks start here.
    pub const LOCKS: usize = 24;
}

body_view! {
    /// A zero-copy view of an SMB2 LOCK Request body ([MS-SMB2] 2.2.26).
    /// StructureSize is 48 whatever LockCount is (the fixed part and one
    /// element). `new_checked` verifies LockCount is at least 1 ([MS-SMB2]
    /// 3.3.5.14: 0 is STATUS_INVALID_PARAMETER) and that LockCount
    /// elements are present.
    pub struct LockRequest;
    what: "SMB2 LOCK request",
    structure_size: 48,
    accessors {
        /// LockCount.
        lock_count, set_lock_count: u16 = req_field::LOCK_COUNT;
        /// LockSequenceNumber (low 4 bits) and LockSequenceIndex (high 28
        /// bits); reserved in SMB 2.0.2.
        lock_sequence, set_lock_sequence: u32 = req_field::LOCK_SEQUENCE;
        /// FileId.
        file_id, set_file_id: FileId = req_field::FILE_ID;
    }
}

impl<T: AsRef<[u8]>> LockRequest<T> {
    fn locks_end(&self) -> usize {
        req_field::LOCKS + elem_field::LEN * usize::from(self.lock_count())
    }

    fn check_variable(&self) -> Result<(), Smb2Error> {
        if self.lock_count() == 0 {
            return Err(Smb2Error::Malformed {
                what: Self::WHAT,
                field: "LockCount (0)",
            });
        }
        let have = self.buffer.as_ref().len();
        if have < self.locks_end() {
            return Err(Smb2Error::Truncated {
                what: Self::WHAT,
                need: self.locks_end(),
                have,
            });
        }
        Ok(())
    }

    /// The Locks array.
    pub fn locks(&self) -> LockElements<'_> {
        LockElements::from_wire(
            self.buffer
                .as_ref()
                .get(req_field::LOCKS..self.locks_end())
                .unwrap_or(&[]),
        )
    }
}

/// What a LOCK request asks for ([MS-SMB2] 3.3.5.14: decided by the first
/// element's SMB2_LOCKFLAG_UNLOCK).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockOperation {
    /// Unlock every range (3.3.5.14.1).
    Unlock,
    /// Lock every range (3.3.5.14.2); `fail_immediately` is false only for
    /// a single blocking lock.
    Lock {
        /// SMB2_LOCKFLAG_FAIL_IMMEDIATELY (on every element).
        fail_immediately: bool,
    },
}

/// The values of an SMB2 LOCK Request ([MS-SMB2] 2.2.26).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockRequestRepr<'a> {
    /// LockSequenceNumber/LockSequenceIndex as one 32-bit field.
    pub lock_sequence: u32,
    /// FileId.
    pub file_id: FileId,
    /// Locks (at least one).
    pub locks: LockElements<'a>,
}

impl<'a> LockRequestRepr<'a> {
    /// Reads a checked view.
    pub fn parse(v: &LockRequest<&'a [u8]>) -> Result<Self, Smb2Error> {
        v.check()?;
        let b: &'a [u8] = v.buffer;
        Ok(LockRequestRepr {
            lock_sequence: v.lock_sequence(),
            file_id: v.file_id(),
            locks: LockElements::from_wire(b.get(req_field::LOCKS..v.locks_end()).unwrap_or(&[])),
        })
    }

    /// LockSequenceNumber: the low 4 bits ([MS-SMB2] 2.2.26).
    pub const fn lock_sequence_number(&self) -> u8 {
        (self.lock_sequence & 0xF) as u8
    }

    /// LockSequenceIndex: the high 28 bits (0 reserved, 1..=64 index
    /// Open.LockSequenceArray, 3.3.5.14).
    pub const fn lock_sequence_index(&self) -> u32 {
        self.lock_sequence >> 4
    }

    /// The element checks of [MS-SMB2] 3.3.5.14.1 and 3.3.5.14.2, made
    /// before any range is touched: with UNLOCK on the first element every
    /// element must be a plain UNLOCK (SHARED or EXCLUSIVE is
    /// STATUS_INVALID_PARAMETER); otherwise every element must be one of
    /// the lock combinations of 2.2.26.1 (UNLOCK or another combination is
    /// STATUS_INVALID_PARAMETER) and, with more than one element, carry
    /// FAIL_IMMEDIATELY (a SHOULD: STATUS_INVALID_PARAMETER). A range whose
    /// end overflows is STATUS_INVALID_LOCK_RANGE ([MS-FSA], byte-range lock).
    pub fn operation(&self) -> Result<LockOperation, NtStatus> {
        let first = self.locks.get(0).ok_or(STATUS_INVALID_PARAMETER)?;
        let unlock = first.flags.contains(LockFlags::UNLOCK);
        let many = self.locks.len() > 1;
        let mut fail_immediately = true;
        for e in self.locks.iter() {
            if unlock {
                if e.flags.intersects(LockFlags::SHARED | LockFlags::EXCLUSIVE)
                    || !e.flags.contains(LockFlags::UNLOCK)
                {
                    return Err(STATUS_INVALID_PARAMETER);
                }
            } else {
                if !e.flags.is_valid_combination() || e.flags.contains(LockFlags::UNLOCK) {
                    return Err(STATUS_INVALID_PARAMETER);
                }
                let fi = e.flags.contains(LockFlags::FAIL_IMMEDIATELY);
                if many && !fi {
                    return Err(STATUS_INVALID_PARAMETER);
                }
                fail_immediately &= fi;
            }
            if e.range_overflows() {
                return Err(STATUS_INVALID_LOCK_RANGE);
            }
        }
        Ok(if unlock {
            LockOperation::Unlock
        } else {
            LockOperation::Lock { fail_immediately }
        })
    }

    /// 24 + 24 per element (48 for one).
    pub fn buffer_len(&self) -> usize {
        req_field::LOCKS + elem_field::LEN * self.locks.len()
    }

    /// Writes the request. Fails with `Malformed` for no element.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        const WHAT: &str = "SMB2 LOCK request";
        if self.locks.is_empty() {
            return Err(Smb2Error::Malformed {
                what: WHAT,
                field: "LockCount (0)",
            });
        }
        let len = self.buffer_len();
        room(WHAT, buf, len)?;
        let count: u16 = fit(WHAT, "LockCount", self.locks.len())?;
        let buf = &mut buf[..len];
        let mut v = LockRequest::new_unchecked(&mut *buf);
        v.set_structure_size(48);
        v.set_lock_count(count);
        v.set_lock_sequence(self.lock_sequence);
        v.set_file_id(self.file_id);
        for (i, e) in self.locks.iter().enumerate() {
            let at = req_field::LOCKS + i * elem_field::LEN;
            e.write(&mut buf[at..at + elem_field::LEN]);
        }
        Ok(len)
    }
}

impl_body!(LockRequestRepr<'a>, LockRequest, Some(Command::Lock));

reserved_body! {
    /// A zero-copy view of an SMB2 LOCK Response body ([MS-SMB2] 2.2.27).
    view LockResponse;
    /// The SMB2 LOCK Response ([MS-SMB2] 2.2.27).
    repr LockResponseRepr;
    what: "SMB2 LOCK response",
    command: Some(Command::Lock)
}
