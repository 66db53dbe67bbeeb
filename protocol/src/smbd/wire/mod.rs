//! [MS-SMBD] section 2.2 message syntax, smoltcp-style: a checked zero-copy
//! view over untrusted bytes (`new_checked` validates the length once, so no
//! accessor can panic afterwards) and a `Repr` value struct with
//! `parse`/`emit`/`buffer_len`. Field ranges are named after the spec's tables.
//!
//! All multi-byte fields are little-endian ([MS-SMBD] 2.2) except the IRD/ORD
//! negotiate header of Appendix A, whose values are big-endian (see
//! `docs/spec-notes.md`, "IRD/ORD byte order").

mod buffer_descriptor;
mod data_transfer;
mod ird_ord;
mod negotiate;

pub use buffer_descriptor::{BufferDescriptor, BufferDescriptorArray, BufferDescriptorRepr};
pub use data_transfer::{
    DataTransfer, DataTransferRepr, PayloadError, SMB_DIRECT_RESPONSE_REQUESTED,
};
pub use ird_ord::{negotiate_ird_ord, IrdOrdError, IrdOrdHeader, IrdOrdRepr};
pub use negotiate::{
    NegotiateRequest, NegotiateRequestRepr, NegotiateResponse, NegotiateResponseRepr,
};

/// A byte range of a fixed-layout field.
pub(crate) type Field = core::ops::Range<usize>;

// The views only call these after `new_checked` (or `check_len`) verified the
// buffer covers every fixed field; indexing a verified range cannot fail.
#[inline]
pub(crate) fn le16(b: &[u8], f: Field) -> u16 {
    let mut a = [0u8; 2];
    a.copy_from_slice(&b[f]);
    u16::from_le_bytes(a)
}
#[inline]
pub(crate) fn le32(b: &[u8], f: Field) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[f]);
    u32::from_le_bytes(a)
}
#[inline]
pub(crate) fn le64(b: &[u8], f: Field) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[f]);
    u64::from_le_bytes(a)
}
#[inline]
pub(crate) fn be32(b: &[u8], f: Field) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[f]);
    u32::from_be_bytes(a)
}
#[inline]
pub(crate) fn set_le16(b: &mut [u8], f: Field, v: u16) {
    b[f].copy_from_slice(&v.to_le_bytes());
}
#[inline]
pub(crate) fn set_le32(b: &mut [u8], f: Field, v: u32) {
    b[f].copy_from_slice(&v.to_le_bytes());
}
#[inline]
pub(crate) fn set_le64(b: &mut [u8], f: Field, v: u64) {
    b[f].copy_from_slice(&v.to_le_bytes());
}
#[inline]
pub(crate) fn set_be32(b: &mut [u8], f: Field, v: u32) {
    b[f].copy_from_slice(&v.to_be_bytes());
}

/// Fails with `Truncated` unless `have >= need`.
#[inline]
pub(crate) fn check_len(
    what: &'static str,
    have: usize,
    need: usize,
) -> Result<(), crate::WireError> {
    if have < need {
        Err(crate::WireError::Truncated { what, need, have })
    } else {
        Ok(())
    }
}
