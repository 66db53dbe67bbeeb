//! [MS-SMBD] Appendix A (section 6): the IRD/ORD negotiate header, sent as
//! the first 8 bytes of the transport's private data on iWARP providers
//! without [RFC6581] negotiation (port 5445).
//!
//! Byte order: the spec's 2.2 little-endian rule covers SMBD *messages*; this
//! header lives in the iWARP MPA private data and the Linux kernel (cifs
//! smbdirect and ksmbd, `struct smbdirect_ird_ord_hdr`-style handling with
//! `__be32`) sends both values big-endian, network order. We do the same
//! (docs/spec-notes.md, "IRD/ORD byte order").

use super::{be32, set_be32};
use crate::WireError;

mod field {
    use crate::smbd::wire::Field;
    pub const IRD: Field = 0..4;
    pub const ORD: Field = 4..8;
}

/// A zero-copy view of the IRD/ORD negotiate header.
#[derive(Debug, Clone)]
pub struct IrdOrdHeader<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> IrdOrdHeader<T> {
    /// 8 bytes.
    pub const LEN: usize = 8;

    /// Wraps `buffer` without checking it.
    pub const fn new_unchecked(buffer: T) -> Self {
        IrdOrdHeader { buffer }
    }

    /// Wraps the start of the private data; fails when it is shorter than 8
    /// bytes (the header is then absent).
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        super::check_len("SMBD IRD/ORD header", buffer.as_ref().len(), Self::LEN)?;
        Ok(IrdOrdHeader { buffer })
    }

    /// IRD (big-endian on the wire).
    pub fn ird(&self) -> u32 {
        be32(self.buffer.as_ref(), field::IRD)
    }
    /// ORD (big-endian on the wire).
    pub fn ord(&self) -> u32 {
        be32(self.buffer.as_ref(), field::ORD)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> IrdOrdHeader<T> {
    /// Sets IRD.
    pub fn set_ird(&mut self, v: u32) {
        set_be32(self.buffer.as_mut(), field::IRD, v)
    }
    /// Sets ORD.
    pub fn set_ord(&mut self, v: u32) {
        set_be32(self.buffer.as_mut(), field::ORD, v)
    }
}

/// IRD/ORD values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IrdOrdRepr {
    /// Incoming RDMA Read Depth.
    pub ird: u32,
    /// Outgoing RDMA Read Depth.
    pub ord: u32,
}

impl IrdOrdRepr {
    /// Reads a checked view.
    pub fn parse<T: AsRef<[u8]>>(p: &IrdOrdHeader<T>) -> Self {
        IrdOrdRepr {
            ird: p.ird(),
            ord: p.ord(),
        }
    }
    /// 8.
    pub const fn buffer_len(&self) -> usize {
        8
    }
    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut IrdOrdHeader<T>) {
        p.set_ird(self.ird);
        p.set_ord(self.ord);
    }
    /// Emits into a fresh array.
    pub fn to_bytes(&self) -> [u8; 8] {
        let mut b = [0u8; 8];
        self.emit(&mut IrdOrdHeader::new_unchecked(&mut b[..]));
        b
    }
}

/// Why the accepting peer rejects a connection ([MS-SMBD] 6.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IrdOrdError {
    /// The resulting IRD is zero.
    ZeroIrd,
    /// The resulting ORD is zero.
    ZeroOrd,
}

impl core::fmt::Display for IrdOrdError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            IrdOrdError::ZeroIrd => {
                f.write_str("IRD/ORD negotiation: resulting IRD is zero ([MS-SMBD] 6.2)")
            }
            IrdOrdError::ZeroOrd => {
                f.write_str("IRD/ORD negotiation: resulting ORD is zero ([MS-SMBD] 6.2)")
            }
        }
    }
}

/// [MS-SMBD] 6.2, accepting side: "IRD is set to the smaller of the
/// accepting peer's ORD value and the IRD value provided by the peer", "ORD
/// is set to the smaller of the accepting peer's IRD value and the ORD value
/// provided by the peer", and "if either the resulting IRD or ORD is zero,
/// the connection is rejected". The result is what the accepting peer sends
/// back and what *both* providers are then set to.
pub fn negotiate_ird_ord(local: IrdOrdRepr, peer: IrdOrdRepr) -> Result<IrdOrdRepr, IrdOrdError> {
    let ird = local.ord.min(peer.ird);
    let ord = local.ird.min(peer.ord);
    if ird == 0 {
        return Err(IrdOrdError::ZeroIrd);
    }
    if ord == 0 {
        return Err(IrdOrdError::ZeroOrd);
    }
    Ok(IrdOrdRepr { ird, ord })
}
