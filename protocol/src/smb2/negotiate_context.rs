//! [MS-SMB2] 2.2.3.1 SMB2 NEGOTIATE_CONTEXT and the contexts this crate
//! decodes: 2.2.3.1.1 PREAUTH_INTEGRITY_CAPABILITIES, 2.2.3.1.2
//! ENCRYPTION_CAPABILITIES, 2.2.3.1.6 RDMA_TRANSFORM_CAPABILITIES and
//! 2.2.3.1.7 SIGNING_CAPABILITIES. Any other type is kept as opaque
//! ContextType + Data.
//!
//! A list of contexts starts at an 8-byte aligned NegotiateContextOffset and
//! each later context starts at the next 8-byte boundary after the previous
//! one's Data (2.2.3, 2.2.4). All offsets here are body-relative; the body
//! starts at header offset 64, so body alignment is header alignment.

use core::ops::Range;

use super::error::Smb2Error;
use super::layout::{align8, fit};
use super::u16_array::U16Array;
use super::Scalar;

/// Byte ranges of [MS-SMB2] 2.2.3.1 (relative to the context).
mod field {
    use crate::smb2::Field;
    pub const CONTEXT_TYPE: Field = 0..2;
    pub const DATA_LENGTH: Field = 2..4;
    pub const RESERVED: Field = 4..8;
    /// Data starts here.
    pub const DATA: usize = 8;
}

const WHAT: &str = "SMB2 NEGOTIATE_CONTEXT";

wire_enum! {
    /// [MS-SMB2] 2.2.3.1 ContextType values.
    pub struct NegotiateContextType(u16) {
        /// SMB2_PREAUTH_INTEGRITY_CAPABILITIES (2.2.3.1.1).
        PREAUTH_INTEGRITY_CAPABILITIES = 0x0001;
        /// SMB2_ENCRYPTION_CAPABILITIES (2.2.3.1.2).
        ENCRYPTION_CAPABILITIES = 0x0002;
        /// SMB2_COMPRESSION_CAPABILITIES (2.2.3.1.3).
        COMPRESSION_CAPABILITIES = 0x0003;
        /// SMB2_NETNAME_NEGOTIATE_CONTEXT_ID (2.2.3.1.4).
        NETNAME_NEGOTIATE_CONTEXT_ID = 0x0005;
        /// SMB2_TRANSPORT_CAPABILITIES (2.2.3.1.5).
        TRANSPORT_CAPABILITIES = 0x0006;
        /// SMB2_RDMA_TRANSFORM_CAPABILITIES (2.2.3.1.6).
        RDMA_TRANSFORM_CAPABILITIES = 0x0007;
        /// SMB2_SIGNING_CAPABILITIES (2.2.3.1.7).
        SIGNING_CAPABILITIES = 0x0008;
    }
}

wire_enum! {
    /// [MS-SMB2] 2.2.3.1.1 HashAlgorithms values.
    pub struct HashAlgorithm(u16) {
        /// SHA-512.
        SHA_512 = 0x0001;
    }
}

wire_enum! {
    /// [MS-SMB2] 2.2.3.1.2 Ciphers values.
    pub struct Cipher(u16) {
        /// AES-128-CCM.
        AES_128_CCM = 0x0001;
        /// AES-128-GCM.
        AES_128_GCM = 0x0002;
        /// AES-256-CCM.
        AES_256_CCM = 0x0003;
        /// AES-256-GCM.
        AES_256_GCM = 0x0004;
    }
}

wire_enum! {
    /// [MS-SMB2] 2.2.3.1.7 SigningAlgorithms values.
    pub struct SigningAlgorithm(u16) {
        /// HMAC-SHA256.
        HMAC_SHA256 = 0x0000;
        /// AES-CMAC.
        AES_CMAC = 0x0001;
        /// AES-GMAC.
        AES_GMAC = 0x0002;
    }
}

wire_enum! {
    /// [MS-SMB2] 2.2.3.1.6 RDMATransformIds values.
    pub struct RdmaTransformId(u16) {
        /// SMB2_RDMA_TRANSFORM_NONE.
        NONE = 0x0000;
        /// SMB2_RDMA_TRANSFORM_ENCRYPTION.
        ENCRYPTION = 0x0001;
        /// SMB2_RDMA_TRANSFORM_SIGNING.
        SIGNING = 0x0002;
    }
}

/// [MS-SMB2] 2.2.3.1.1: HashAlgorithmCount (2), SaltLength (2),
/// HashAlgorithms (2 each), Salt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PreauthIntegrityCapabilities<'a> {
    /// HashAlgorithms ([`HashAlgorithm`] values); at least one.
    pub hash_algorithms: U16Array<'a>,
    /// Salt.
    pub salt: &'a [u8],
}

/// [MS-SMB2] 2.2.3.1.2: CipherCount (2), Ciphers (2 each).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EncryptionCapabilities<'a> {
    /// Ciphers ([`Cipher`] values), in preference order; at least one.
    pub ciphers: U16Array<'a>,
}

/// [MS-SMB2] 2.2.3.1.7: SigningAlgorithmCount (2), SigningAlgorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SigningCapabilities<'a> {
    /// SigningAlgorithms ([`SigningAlgorithm`] values); at least one.
    pub signing_algorithms: U16Array<'a>,
}

/// [MS-SMB2] 2.2.3.1.6: TransformCount (2), Reserved1 (2), Reserved2 (4),
/// RDMATransformIds (2 each).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RdmaTransformCapabilities<'a> {
    /// RDMATransformIds ([`RdmaTransformId`] values); at least one.
    pub transform_ids: U16Array<'a>,
}

/// One negotiate context ([MS-SMB2] 2.2.3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NegotiateContext<'a> {
    /// SMB2_PREAUTH_INTEGRITY_CAPABILITIES.
    PreauthIntegrity(PreauthIntegrityCapabilities<'a>),
    /// SMB2_ENCRYPTION_CAPABILITIES.
    Encryption(EncryptionCapabilities<'a>),
    /// SMB2_SIGNING_CAPABILITIES.
    Signing(SigningCapabilities<'a>),
    /// SMB2_RDMA_TRANSFORM_CAPABILITIES.
    RdmaTransform(RdmaTransformCapabilities<'a>),
    /// Any other ContextType (compression, netname, transport, or one this
    /// specification version does not define), Data kept as is.
    Other {
        /// ContextType.
        context_type: u16,
        /// Data.
        data: &'a [u8],
    },
}

/// Reads a count-prefixed array of u16 at `at` in `data`, failing on a count
/// of 0 ("MUST be greater than 0") or an array that does not fit.
fn counted_array<'a>(
    what: &'static str,
    data: &'a [u8],
    count: u16,
    at: usize,
) -> Result<(U16Array<'a>, usize), Smb2Error> {
    if count == 0 {
        return Err(Smb2Error::Malformed {
            what,
            field: "count (0; MUST be greater than 0)",
        });
    }
    let end = at + 2 * usize::from(count);
    let bytes = data.get(at..end).ok_or(Smb2Error::Truncated {
        what,
        need: end,
        have: data.len(),
    })?;
    Ok((U16Array::from_le_bytes(bytes), end))
}

fn need(what: &'static str, data: &[u8], n: usize) -> Result<(), Smb2Error> {
    if data.len() < n {
        Err(Smb2Error::Truncated {
            what,
            need: n,
            have: data.len(),
        })
    } else {
        Ok(())
    }
}

impl<'a> NegotiateContext<'a> {
    /// ContextType.
    pub fn context_type(&self) -> u16 {
        match self {
            NegotiateContext::PreauthIntegrity(_) => {
                NegotiateContextType::PREAUTH_INTEGRITY_CAPABILITIES.0
            }
            NegotiateContext::Encryption(_) => NegotiateContextType::ENCRYPTION_CAPABILITIES.0,
            NegotiateContext::Signing(_) => NegotiateContextType::SIGNING_CAPABILITIES.0,
            NegotiateContext::RdmaTransform(_) => {
                NegotiateContextType::RDMA_TRANSFORM_CAPABILITIES.0
            }
            NegotiateContext::Other { context_type, .. } => *context_type,
        }
    }

    /// Decodes the Data of a context of type `context_type`. Trailing bytes
    /// after the structure's own content are ignored.
    pub fn parse_data(context_type: u16, data: &'a [u8]) -> Result<Self, Smb2Error> {
        match NegotiateContextType(context_type) {
            NegotiateContextType::PREAUTH_INTEGRITY_CAPABILITIES => {
                const W: &str = "SMB2_PREAUTH_INTEGRITY_CAPABILITIES";
                need(W, data, 4)?;
                let count = u16::read(data, 0..2);
                let salt_len = usize::from(u16::read(data, 2..4));
                let (hash_algorithms, end) = counted_array(W, data, count, 4)?;
                let salt = data.get(end..end + salt_len).ok_or(Smb2Error::Truncated {
                    what: W,
                    need: end + salt_len,
                    have: data.len(),
                })?;
                Ok(NegotiateContext::PreauthIntegrity(
                    PreauthIntegrityCapabilities {
                        hash_algorithms,
                        salt,
                    },
                ))
            }
            NegotiateContextType::ENCRYPTION_CAPABILITIES => {
                const W: &str = "SMB2_ENCRYPTION_CAPABILITIES";
                need(W, data, 2)?;
                let (ciphers, _) = counted_array(W, data, u16::read(data, 0..2), 2)?;
                Ok(NegotiateContext::Encryption(EncryptionCapabilities {
                    ciphers,
                }))
            }
            NegotiateContextType::SIGNING_CAPABILITIES => {
                const W: &str = "SMB2_SIGNING_CAPABILITIES";
                need(W, data, 2)?;
                let (signing_algorithms, _) = counted_array(W, data, u16::read(data, 0..2), 2)?;
                Ok(NegotiateContext::Signing(SigningCapabilities {
                    signing_algorithms,
                }))
            }
            NegotiateContextType::RDMA_TRANSFORM_CAPABILITIES => {
                const W: &str = "SMB2_RDMA_TRANSFORM_CAPABILITIES";
                need(W, data, 8)?;
                let (transform_ids, _) = counted_array(W, data, u16::read(data, 0..2), 8)?;
                Ok(NegotiateContext::RdmaTransform(RdmaTransformCapabilities {
                    transform_ids,
                }))
            }
            _ => Ok(NegotiateContext::Other { context_type, data }),
        }
    }

    /// Length of Data as `emit` writes it.
    pub fn data_len(&self) -> usize {
        match self {
            NegotiateContext::PreauthIntegrity(p) => {
                4 + p.hash_algorithms.byte_len() + p.salt.len()
            }
            NegotiateContext::Encryption(e) => 2 + e.ciphers.byte_len(),
            NegotiateContext::Signing(s) => 2 + s.signing_algorithms.byte_len(),
            NegotiateContext::RdmaTransform(r) => 8 + r.transform_ids.byte_len(),
            NegotiateContext::Other { data, .. } => data.len(),
        }
    }

    /// Bytes of the whole context (8-byte header + Data).
    pub fn buffer_len(&self) -> usize {
        field::DATA + self.data_len()
    }

    fn check_emit(&self) -> Result<(), Smb2Error> {
        let count_ok = |a: &U16Array<'_>, what: &'static str| -> Result<u16, Smb2Error> {
            if a.is_empty() {
                return Err(Smb2Error::Malformed {
                    what,
                    field: "count (0; MUST be greater than 0)",
                });
            }
            fit(what, "count", a.len())
        };
        match self {
            NegotiateContext::PreauthIntegrity(p) => {
                count_ok(&p.hash_algorithms, "SMB2_PREAUTH_INTEGRITY_CAPABILITIES")?;
                fit::<u16>(
                    "SMB2_PREAUTH_INTEGRITY_CAPABILITIES",
                    "SaltLength",
                    p.salt.len(),
                )?;
            }
            NegotiateContext::Encryption(e) => {
                count_ok(&e.ciphers, "SMB2_ENCRYPTION_CAPABILITIES")?;
            }
            NegotiateContext::Signing(s) => {
                count_ok(&s.signing_algorithms, "SMB2_SIGNING_CAPABILITIES")?;
            }
            NegotiateContext::RdmaTransform(r) => {
                count_ok(&r.transform_ids, "SMB2_RDMA_TRANSFORM_CAPABILITIES")?;
            }
            NegotiateContext::Other { .. } => {}
        }
        fit::<u16>(WHAT, "DataLength", self.data_len())?;
        Ok(())
    }

    /// Writes header and Data into `dst` (exactly [`buffer_len`] bytes,
    /// already zeroed).
    ///
    /// [`buffer_len`]: Self::buffer_len
    fn write(&self, dst: &mut [u8]) {
        let data_len = self.data_len() as u16;
        self.context_type().write(dst, field::CONTEXT_TYPE);
        data_len.write(dst, field::DATA_LENGTH);
        0u32.write(dst, field::RESERVED);
        let d = &mut dst[field::DATA..];
        match self {
            NegotiateContext::PreauthIntegrity(p) => {
                (p.hash_algorithms.len() as u16).write(d, 0..2);
                (p.salt.len() as u16).write(d, 2..4);
                let n = p.hash_algorithms.byte_len();
                p.hash_algorithms.write_to(&mut d[4..4 + n]);
                d[4 + n..4 + n + p.salt.len()].copy_from_slice(p.salt);
            }
            NegotiateContext::Encryption(e) => {
                (e.ciphers.len() as u16).write(d, 0..2);
                e.ciphers.write_to(&mut d[2..]);
            }
            NegotiateContext::Signing(s) => {
                (s.signing_algorithms.len() as u16).write(d, 0..2);
                s.signing_algorithms.write_to(&mut d[2..]);
            }
            NegotiateContext::RdmaTransform(r) => {
                (r.transform_ids.len() as u16).write(d, 0..2);
                r.transform_ids.write_to(&mut d[8..]);
            }
            NegotiateContext::Other { data, .. } => d[..data.len()].copy_from_slice(data),
        }
    }
}

/// Walks `count` negotiate contexts of a body, the first at body offset
/// `start` (already checked to be 8-byte aligned). The first malformed
/// context is yielded as `Err` and ends the walk.
#[derive(Debug, Clone)]
pub struct NegotiateContextIter<'a> {
    body: &'a [u8],
    pos: usize,
    left: u16,
    first: bool,
}

impl<'a> NegotiateContextIter<'a> {
    pub(crate) fn new(body: &'a [u8], start: usize, count: u16) -> Self {
        NegotiateContextIter {
            body,
            pos: start,
            left: count,
            first: true,
        }
    }

    /// Body offset just past the last context read so far.
    pub(crate) fn end(&self) -> usize {
        self.pos
    }
}

impl<'a> Iterator for NegotiateContextIter<'a> {
    type Item = Result<NegotiateContext<'a>, Smb2Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        if !self.first {
            self.pos = align8(self.pos);
        }
        self.first = false;
        let hdr_end = self.pos.saturating_add(field::DATA);
        let Some(h) = self.body.get(self.pos..hdr_end) else {
            self.left = 0;
            return Some(Err(Smb2Error::Truncated {
                what: WHAT,
                need: hdr_end,
                have: self.body.len(),
            }));
        };
        let context_type = u16::read(h, field::CONTEXT_TYPE);
        let data_len = usize::from(u16::read(h, field::DATA_LENGTH));
        let end = hdr_end + data_len;
        let Some(data) = self.body.get(hdr_end..end) else {
            self.left = 0;
            return Some(Err(Smb2Error::Truncated {
                what: WHAT,
                need: end,
                have: self.body.len(),
            }));
        };
        self.pos = end;
        match NegotiateContext::parse_data(context_type, data) {
            Ok(c) => Some(Ok(c)),
            Err(e) => {
                self.left = 0;
                Some(Err(e))
            }
        }
    }
}

/// Checks a context list: NegotiateContextOffset (header-relative) 8-byte
/// aligned and at or after `min` (body offset), every context well formed
/// and inside the body. Returns the list's body range (first context to the
/// end of the last one's Data).
pub(crate) fn check_list(
    what: &'static str,
    body: &[u8],
    offset: u32,
    count: u16,
    min: usize,
) -> Result<Range<usize>, Smb2Error> {
    let hdr = super::header::HEADER_LEN as u64;
    if offset % 8 != 0 {
        return Err(Smb2Error::Misaligned {
            what,
            field: "NegotiateContextOffset",
            offset: u64::from(offset),
        });
    }
    let off = u64::from(offset);
    if off < hdr + min as u64 || off > hdr + body.len() as u64 {
        return Err(Smb2Error::OutOfBounds {
            what,
            field: "NegotiateContextOffset",
            offset: off,
            length: 0,
            min: hdr + min as u64,
            limit: hdr + body.len() as u64,
        });
    }
    let start = (off - hdr) as usize;
    let mut it = NegotiateContextIter::new(body, start, count);
    for c in it.by_ref() {
        c?;
    }
    Ok(start..it.end())
}

/// The negotiate contexts of a NEGOTIATE request or response: either the
/// wire list of a parsed message (zero-copy, already checked) or a slice
/// to emit. Two lists are equal when their contexts are.
#[derive(Clone, Copy)]
pub struct NegotiateContextList<'a>(ListInner<'a>);

#[derive(Clone, Copy)]
enum ListInner<'a> {
    Wire {
        body: &'a [u8],
        start: usize,
        count: u16,
    },
    Slice(&'a [NegotiateContext<'a>]),
}

impl<'a> NegotiateContextList<'a> {
    /// No contexts.
    pub const EMPTY: NegotiateContextList<'static> = NegotiateContextList(ListInner::Slice(&[]));

    /// Contexts to emit.
    pub const fn new(contexts: &'a [NegotiateContext<'a>]) -> Self {
        NegotiateContextList(ListInner::Slice(contexts))
    }

    pub(crate) fn from_wire(body: &'a [u8], start: usize, count: u16) -> Self {
        NegotiateContextList(ListInner::Wire { body, start, count })
    }

    /// Number of contexts.
    pub fn len(&self) -> usize {
        match self.0 {
            ListInner::Wire { count, .. } => usize::from(count),
            ListInner::Slice(s) => s.len(),
        }
    }

    /// True when there is none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The contexts in order.
    pub fn iter(&self) -> impl Iterator<Item = NegotiateContext<'a>> + 'a {
        let (wire, slice): (Option<NegotiateContextIter<'a>>, &'a [NegotiateContext<'a>]) =
            match self.0 {
                ListInner::Wire { body, start, count } => {
                    (Some(NegotiateContextIter::new(body, start, count)), &[])
                }
                ListInner::Slice(s) => (None, s),
            };
        wire.into_iter()
            .flatten()
            .filter_map(Result::ok)
            .chain(slice.iter().copied())
    }

    /// The first context of ContextType `context_type`.
    pub fn find(&self, context_type: NegotiateContextType) -> Option<NegotiateContext<'a>> {
        self.iter().find(|c| c.context_type() == context_type.0)
    }

    /// How many contexts have ContextType `context_type` ([MS-SMB2] 3.3.5.4
    /// fails a request that carries some types more than once).
    pub fn count_of(&self, context_type: NegotiateContextType) -> usize {
        self.iter()
            .filter(|c| c.context_type() == context_type.0)
            .count()
    }

    /// Bytes the list takes when its first context is 8-byte aligned: each
    /// context, padded to 8 bytes except the last.
    pub fn byte_len(&self) -> usize {
        let mut len = 0;
        for (i, c) in self.iter().enumerate() {
            if i > 0 {
                len = align8(len);
            }
            len += c.buffer_len();
        }
        len
    }

    /// Checks every context can be emitted (counts ≥ 1, lengths fit).
    pub(crate) fn check_emit(&self) -> Result<u16, Smb2Error> {
        for c in self.iter() {
            c.check_emit()?;
        }
        fit(WHAT, "NegotiateContextCount", self.len())
    }

    /// Writes the list into `dst` (at least [`byte_len`](Self::byte_len)
    /// bytes, already zeroed, starting 8-byte aligned).
    pub(crate) fn write_to(&self, dst: &mut [u8]) {
        let mut pos = 0;
        for (i, c) in self.iter().enumerate() {
            if i > 0 {
                pos = align8(pos);
            }
            let n = c.buffer_len();
            if let Some(d) = dst.get_mut(pos..pos + n) {
                c.write(d);
            }
            pos += n;
        }
    }
}

impl PartialEq for NegotiateContextList<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for NegotiateContextList<'_> {}

impl core::fmt::Debug for NegotiateContextList<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Default for NegotiateContextList<'_> {
    fn default() -> Self {
        NegotiateContextList::EMPTY
    }
}

// ---------------------------------------------------------------------------
// The contexts the list keeps opaque, decoded on demand
// ---------------------------------------------------------------------------
//
// A server that negotiates neither compression nor transport security
// ignores SMB2_COMPRESSION_CAPABILITIES, SMB2_NETNAME_NEGOTIATE_CONTEXT_ID
// and SMB2_TRANSPORT_CAPABILITIES ([MS-SMB2] 3.3.5.4), so the list walker
// does not validate them: they stay `NegotiateContext::Other` and these
// accessors decode them when wanted.

/// ContextType of the SMB3 POSIX extensions context Linux cifs sends with
/// the `posix` mount option (not an [MS-SMB2] value; Data is a 16-byte
/// GUID, [`POSIX_EXTENSIONS_GUID`]). A server without POSIX extensions
/// does not echo it.
pub const SMB2_POSIX_EXTENSIONS_AVAILABLE: u16 = 0x0100;

/// The Data of the POSIX extensions context: the GUID
/// 93AD2550-9CB4-11E7-B423-83DE968BCD7C as wire bytes.
pub const POSIX_EXTENSIONS_GUID: [u8; 16] = [
    0x93, 0xAD, 0x25, 0x50, 0x9C, 0xB4, 0x11, 0xE7, 0xB4, 0x23, 0x83, 0xDE, 0x96, 0x8B, 0xCD, 0x7C,
];

wire_enum! {
    /// [MS-SMB2] 2.2.3.1.3 CompressionAlgorithms values.
    pub struct CompressionAlgorithm(u16) {
        /// NONE.
        NONE = 0x0000;
        /// LZNT1.
        LZNT1 = 0x0001;
        /// LZ77.
        LZ77 = 0x0002;
        /// LZ77+Huffman.
        LZ77_HUFFMAN = 0x0003;
        /// Pattern_V1.
        PATTERN_V1 = 0x0004;
        /// LZ4.
        LZ4 = 0x0005;
    }
}

bitmask! {
    /// [MS-SMB2] 2.2.3.1.3 Flags.
    pub struct CompressionCapabilityFlags(u32) {
        /// SMB2_COMPRESSION_CAPABILITIES_FLAG_CHAINED.
        CHAINED = 0x0000_0001;
    }
}

bitmask! {
    /// [MS-SMB2] 2.2.3.1.5 Flags.
    pub struct TransportCapabilityFlags(u32) {
        /// SMB2_ACCEPT_TRANSPORT_LEVEL_SECURITY.
        ACCEPT_TRANSPORT_LEVEL_SECURITY = 0x0000_0001;
    }
}

/// [MS-SMB2] 2.2.3.1.3 SMB2_COMPRESSION_CAPABILITIES:
/// CompressionAlgorithmCount (2), Padding (2), Flags (4),
/// CompressionAlgorithms (2 each).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CompressionCapabilities<'a> {
    /// Flags.
    pub flags: CompressionCapabilityFlags,
    /// CompressionAlgorithms ([`CompressionAlgorithm`] values); at least
    /// one.
    pub algorithms: U16Array<'a>,
}

impl<'a> CompressionCapabilities<'a> {
    const WHAT: &'static str = "SMB2_COMPRESSION_CAPABILITIES";

    /// Decodes a context's Data (count 0 is `Malformed`).
    pub fn parse(data: &'a [u8]) -> Result<Self, Smb2Error> {
        need(Self::WHAT, data, 8)?;
        let (algorithms, _) = counted_array(Self::WHAT, data, u16::read(data, 0..2), 8)?;
        Ok(CompressionCapabilities {
            flags: CompressionCapabilityFlags::read(data, 4..8),
            algorithms,
        })
    }

    /// Length of the Data.
    pub fn data_len(&self) -> usize {
        8 + self.algorithms.byte_len()
    }

    /// Writes the Data (for a `NegotiateContext::Other` of type
    /// COMPRESSION_CAPABILITIES).
    pub fn emit_data(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        let len = self.data_len();
        super::layout::room(Self::WHAT, buf, len)?;
        if self.algorithms.is_empty() {
            return Err(Smb2Error::Malformed {
                what: Self::WHAT,
                field: "count (0; MUST be greater than 0)",
            });
        }
        let count: u16 = fit(
            Self::WHAT,
            "CompressionAlgorithmCount",
            self.algorithms.len(),
        )?;
        count.write(buf, 0..2);
        0u16.write(buf, 2..4);
        self.flags.write(buf, 4..8);
        self.algorithms.write_to(&mut buf[8..len]);
        Ok(len)
    }
}

/// [MS-SMB2] 2.2.3.1.5 SMB2_TRANSPORT_CAPABILITIES: Flags (4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TransportCapabilities {
    /// Flags.
    pub flags: TransportCapabilityFlags,
}

impl TransportCapabilities {
    /// Decodes a context's Data.
    pub fn parse(data: &[u8]) -> Result<Self, Smb2Error> {
        need("SMB2_TRANSPORT_CAPABILITIES", data, 4)?;
        Ok(TransportCapabilities {
            flags: TransportCapabilityFlags::read(data, 0..4),
        })
    }

    /// The Data bytes.
    pub fn to_bytes(&self) -> [u8; 4] {
        self.flags.0.to_le_bytes()
    }
}

impl<'a> NegotiateContext<'a> {
    /// For SMB2_COMPRESSION_CAPABILITIES, its decoded Data.
    pub fn compression(&self) -> Option<Result<CompressionCapabilities<'a>, Smb2Error>> {
        match *self {
            NegotiateContext::Other { context_type, data }
                if context_type == NegotiateContextType::COMPRESSION_CAPABILITIES.0 =>
            {
                Some(CompressionCapabilities::parse(data))
            }
            _ => None,
        }
    }

    /// For SMB2_NETNAME_NEGOTIATE_CONTEXT_ID ([MS-SMB2] 2.2.3.1.4), the
    /// NetName the client connects to (UTF-16LE, not terminated).
    pub fn netname(&self) -> Option<super::utf16::Utf16Str<'a>> {
        match *self {
            NegotiateContext::Other { context_type, data }
                if context_type == NegotiateContextType::NETNAME_NEGOTIATE_CONTEXT_ID.0 =>
            {
                Some(super::utf16::Utf16Str::from_utf16le(data))
            }
            _ => None,
        }
    }

    /// For SMB2_TRANSPORT_CAPABILITIES, its decoded Data.
    pub fn transport(&self) -> Option<Result<TransportCapabilities, Smb2Error>> {
        match *self {
            NegotiateContext::Other { context_type, data }
                if context_type == NegotiateContextType::TRANSPORT_CAPABILITIES.0 =>
            {
                Some(TransportCapabilities::parse(data))
            }
            _ => None,
        }
    }

    /// True for the SMB3 POSIX extensions context (ContextType 0x0100 with
    /// the POSIX GUID as Data).
    pub fn is_posix_extensions(&self) -> bool {
        matches!(*self, NegotiateContext::Other { context_type, data }
            if context_type == SMB2_POSIX_EXTENSIONS_AVAILABLE
                && data.get(..16) == Some(&POSIX_EXTENSIONS_GUID[..]))
    }
}
