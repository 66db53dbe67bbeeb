//! The Channel field of SMB2 READ and WRITE requests ([MS-SMB2] 2.2.19,
//! 2.2.21) and the channel information it qualifies: over SMB Direct, an
//! array of SMB_DIRECT_BUFFER_DESCRIPTOR_V1 ([MS-SMBD] 2.2.3.1) naming the
//! client buffers the server reads from or writes to with RDMA.

use super::error::Smb2Error;
use super::negotiate::Dialect;
use super::{Field, Scalar};
use crate::smbd::wire::{BufferDescriptor, BufferDescriptorArray, BufferDescriptorRepr};

/// [MS-SMB2] 2.2.19 / 2.2.21 Channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Channel {
    /// SMB2_CHANNEL_NONE (0): no channel information; the offset and length
    /// fields are ignored on receipt.
    #[default]
    None,
    /// SMB2_CHANNEL_RDMA_V1 (1): one or more buffer descriptors.
    RdmaV1,
    /// SMB2_CHANNEL_RDMA_V1_INVALIDATE (2, SMB 3.0.2+): descriptors, and the
    /// server invalidates the token when it responds ([MS-SMBD] 3.1.4.2).
    RdmaV1Invalidate,
    /// SMB2_CHANNEL_RDMA_TRANSFORM (3, SMB 3.1.1 with RDMA transforms): an
    /// SMB2_RDMA_TRANSFORM (2.2.43), kept opaque by this crate.
    RdmaTransform,
    /// Any other value; refused by [`ReadRequest::check_channel_rules`]
    /// and [`WriteRequest::check_channel_rules`].
    ///
    /// [`ReadRequest::check_channel_rules`]: super::ReadRequest::check_channel_rules
    /// [`WriteRequest::check_channel_rules`]: super::WriteRequest::check_channel_rules
    Unknown(u32),
}

impl Channel {
    /// From the wire value.
    pub const fn from_wire(v: u32) -> Channel {
        match v {
            0 => Channel::None,
            1 => Channel::RdmaV1,
            2 => Channel::RdmaV1Invalidate,
            3 => Channel::RdmaTransform,
            other => Channel::Unknown(other),
        }
    }

    /// The wire value.
    pub const fn to_wire(self) -> u32 {
        match self {
            Channel::None => 0,
            Channel::RdmaV1 => 1,
            Channel::RdmaV1Invalidate => 2,
            Channel::RdmaTransform => 3,
            Channel::Unknown(v) => v,
        }
    }

    /// True for SMB2_CHANNEL_RDMA_V1 and SMB2_CHANNEL_RDMA_V1_INVALIDATE,
    /// whose channel information is an array of buffer descriptors.
    pub const fn is_rdma(self) -> bool {
        matches!(self, Channel::RdmaV1 | Channel::RdmaV1Invalidate)
    }
}

impl Scalar for Channel {
    fn read(b: &[u8], f: Field) -> Self {
        Channel::from_wire(u32::read(b, f))
    }
    fn write(self, b: &mut [u8], f: Field) {
        self.to_wire().write(b, f)
    }
}

/// Channel information: the wire bytes of a parsed request (zero-copy), or
/// descriptors to emit. Two values are equal when their bytes are.
#[derive(Clone, Copy)]
pub struct ChannelInfo<'a>(Inner<'a>);

#[derive(Clone, Copy)]
enum Inner<'a> {
    Bytes(&'a [u8]),
    Descriptors(&'a [BufferDescriptorRepr]),
}

impl<'a> ChannelInfo<'a> {
    /// No channel information.
    pub const EMPTY: ChannelInfo<'static> = ChannelInfo(Inner::Bytes(&[]));

    /// Raw bytes (for SMB2_CHANNEL_RDMA_TRANSFORM, or as received).
    pub const fn from_bytes(bytes: &'a [u8]) -> Self {
        ChannelInfo(Inner::Bytes(bytes))
    }

    /// An array of SMB_DIRECT_BUFFER_DESCRIPTOR_V1 to emit.
    pub const fn descriptors(descriptors: &'a [BufferDescriptorRepr]) -> Self {
        ChannelInfo(Inner::Descriptors(descriptors))
    }

    /// Length in bytes on the wire.
    pub fn byte_len(&self) -> usize {
        match self.0 {
            Inner::Bytes(b) => b.len(),
            Inner::Descriptors(d) => d.len() * BufferDescriptor::<&[u8]>::LEN,
        }
    }

    /// True when there is none.
    pub fn is_empty(&self) -> bool {
        self.byte_len() == 0
    }

    /// The wire bytes when this value holds them (a parsed request).
    pub fn as_bytes(&self) -> Option<&'a [u8]> {
        match self.0 {
            Inner::Bytes(b) => Some(b),
            Inner::Descriptors(_) => None,
        }
    }

    /// The buffer descriptor array of a parsed request ([MS-SMBD]
    /// 2.2.3.1), when the bytes are a whole, non-zero number of descriptors.
    pub fn descriptor_array(&self) -> Option<BufferDescriptorArray<'a>> {
        self.as_bytes()
            .and_then(|b| BufferDescriptorArray::new_checked(b).ok())
    }

    /// The descriptors, in order (whole 16-byte units; a trailing partial
    /// one is not a descriptor).
    pub fn iter_descriptors(&self) -> impl Iterator<Item = BufferDescriptorRepr> + 'a {
        let (b, d): (&'a [u8], &'a [BufferDescriptorRepr]) = match self.0 {
            Inner::Bytes(b) => (b, &[]),
            Inner::Descriptors(d) => (&[], d),
        };
        b.chunks_exact(BufferDescriptor::<&[u8]>::LEN)
            .map(|c| BufferDescriptorRepr::parse(&BufferDescriptor::new_unchecked(c)))
            .chain(d.iter().copied())
    }

    /// Sum of the descriptors' Length fields.
    pub fn total_length(&self) -> u64 {
        self.iter_descriptors().map(|d| u64::from(d.length)).sum()
    }

    fn bytes(&self) -> impl Iterator<Item = u8> + 'a {
        let (b, d): (&'a [u8], &'a [BufferDescriptorRepr]) = match self.0 {
            Inner::Bytes(b) => (b, &[]),
            Inner::Descriptors(d) => (&[], d),
        };
        b.iter().copied().chain(d.iter().flat_map(|x| x.to_bytes()))
    }

    /// Writes the bytes to the start of `dst`.
    pub(crate) fn write_to(&self, dst: &mut [u8]) {
        for (d, b) in dst.iter_mut().zip(self.bytes()) {
            *d = b;
        }
    }
}

impl PartialEq for ChannelInfo<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.bytes().eq(other.bytes())
    }
}

impl Eq for ChannelInfo<'_> {}

impl core::fmt::Debug for ChannelInfo<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.byte_len() % BufferDescriptor::<&[u8]>::LEN == 0 {
            f.debug_list().entries(self.iter_descriptors()).finish()
        } else {
            write!(f, "ChannelInfo({} bytes)", self.byte_len())
        }
    }
}

impl Default for ChannelInfo<'_> {
    fn default() -> Self {
        ChannelInfo::EMPTY
    }
}

/// Structural rule shared by READ and WRITE: with an RDMA channel the
/// channel information is present and is a whole, non-zero number of
/// buffer descriptors ([MS-SMB2] 3.3.5.12 / 3.3.5.13: offset or length 0
/// fails with STATUS_INVALID_PARAMETER).
pub(crate) fn check_channel_info(
    what: &'static str,
    missing: &'static str,
    partial: &'static str,
    channel: Channel,
    info: Option<&[u8]>,
) -> Result<(), Smb2Error> {
    if !channel.is_rdma() {
        return Ok(());
    }
    let info = info.ok_or(Smb2Error::Malformed {
        what,
        field: missing,
    })?;
    BufferDescriptorArray::new_checked(info).map_err(|_| Smb2Error::Malformed {
        what,
        field: partial,
    })?;
    Ok(())
}

/// [MS-SMB2] 3.3.5.12 / 3.3.5.13: the Channel values a server accepts in
/// an SMB 3.x dialect (SMB2_CHANNEL_RDMA_V1_INVALIDATE from 3.0.2 on), and
/// only on an RDMA connection for the RDMA ones. Before 3.0 Channel is
/// reserved and ignored. SMB2_CHANNEL_RDMA_TRANSFORM is refused: this crate
/// does not negotiate RDMA transforms.
pub(crate) fn check_channel_for_dialect(
    what: &'static str,
    channel: Channel,
    dialect: Dialect,
    over_rdma: bool,
) -> Result<(), Smb2Error> {
    if !dialect.is_smb3() {
        return Ok(());
    }
    let allowed = match channel {
        Channel::None | Channel::RdmaV1 => true,
        Channel::RdmaV1Invalidate => dialect != Dialect::SMB_3_0,
        Channel::RdmaTransform | Channel::Unknown(_) => false,
    };
    if !allowed {
        return Err(Smb2Error::Malformed {
            what,
            field: "Channel (not allowed in this dialect)",
        });
    }
    if channel.is_rdma() && !over_rdma {
        return Err(Smb2Error::Malformed {
            what,
            field: "Channel (RDMA on a connection that is not RDMA)",
        });
    }
    Ok(())
}
