//! [MS-SMB2] 2.2.19 SMB2 READ Request and 2.2.20 SMB2 READ Response.

use super::channel::{check_channel_for_dialect, check_channel_info, Channel, ChannelInfo};
use super::error::Smb2Error;
use super::file_id::FileId;
use super::layout::{fit, hdr, resolve, room, slice, Region};
use super::negotiate::Dialect;
use super::Command;
use crate::smbd::wire::BufferDescriptorArray;

bitmask! {
    /// [MS-SMB2] 2.2.19 Flags (SMB 3.0.2+).
    pub struct ReadFlags(u8) {
        /// SMB2_READFLAG_READ_UNBUFFERED.
        READ_UNBUFFERED = 0x01;
        /// SMB2_READFLAG_REQUEST_COMPRESSED (SMB 3.1.1).
        REQUEST_COMPRESSED = 0x02;
    }
}

/// Byte ranges of [MS-SMB2] 2.2.19.
mod req_field {
    use crate::smb2::Field;
    pub const PADDING: Field = 2..3;
    pub const FLAGS: Field = 3..4;
    pub const LENGTH: Field = 4..8;
    pub const OFFSET: Field = 8..16;
    pub const FILE_ID: Field = 16..32;
    pub const MINIMUM_COUNT: Field = 32..36;
    pub const CHANNEL: Field = 36..40;
    pub const REMAINING_BYTES: Field = 40..44;
    pub const READ_CHANNEL_INFO_OFFSET: Field = 44..46;
    pub const READ_CHANNEL_INFO_LENGTH: Field = 46..48;
    /// Buffer starts here.
    pub const BUFFER: usize = 48;
}

body_view! {
    /// A zero-copy view of an SMB2 READ Request body ([MS-SMB2] 2.2.19).
    /// `new_checked` verifies the channel information: ignored with
    /// SMB2_CHANNEL_NONE; otherwise inside the body after the fixed part;
    /// with an RDMA channel present and a whole number of
    /// SMB_DIRECT_BUFFER_DESCRIPTOR_V1 (3.3.5.12).
    pub struct ReadRequest;
    what: "SMB2 READ request",
    structure_size: 49,
    accessors {
        /// Padding: the requested DataOffset of the response (a hint).
        padding, set_padding: u8 = req_field::PADDING;
        /// Flags.
        flags, set_flags: ReadFlags = req_field::FLAGS;
        /// Length: bytes to read.
        length, set_length: u32 = req_field::LENGTH;
        /// Offset in the file.
        offset, set_offset: u64 = req_field::OFFSET;
        /// FileId.
        file_id, set_file_id: FileId = req_field::FILE_ID;
        /// MinimumCount: fewer bytes read is STATUS_END_OF_FILE (3.3.5.12).
        minimum_count, set_minimum_count: u32 = req_field::MINIMUM_COUNT;
        /// Channel.
        channel, set_channel: Channel = req_field::CHANNEL;
        /// RemainingBytes (a read-ahead hint).
        remaining_bytes, set_remaining_bytes: u32 = req_field::REMAINING_BYTES;
        /// ReadChannelInfoOffset, from the header.
        read_channel_info_offset, set_read_channel_info_offset: u16 = req_field::READ_CHANNEL_INFO_OFFSET;
        /// ReadChannelInfoLength.
        read_channel_info_length, set_read_channel_info_length: u16 = req_field::READ_CHANNEL_INFO_LENGTH;
    }
}

impl<T: AsRef<[u8]>> ReadRequest<T> {
    fn channel_region(&self) -> Region {
        if self.channel() == Channel::None {
            return Region::new("ReadChannelInfoOffset", 0, 0);
        }
        Region::new(
            "ReadChannelInfoOffset",
            u64::from(self.read_channel_info_offset()),
            u64::from(self.read_channel_info_length()),
        )
    }

    fn check_variable(&self) -> Result<(), Smb2Error> {
        let b = self.buffer.as_ref();
        let info = resolve(Self::WHAT, b.len(), Self::FIXED_LEN, self.channel_region())?;
        check_channel_info(
            Self::WHAT,
            "ReadChannelInfoLength (0 with an RDMA channel)",
            "ReadChannelInfoLength (not a whole number of buffer descriptors)",
            self.channel(),
            info.and_then(|r| b.get(r)),
        )
    }

    /// The channel information bytes (empty with SMB2_CHANNEL_NONE).
    pub fn channel_info(&self) -> &[u8] {
        slice(self.buffer.as_ref(), Self::FIXED_LEN, self.channel_region())
    }

    /// With an RDMA channel, the client buffers the server RDMA-writes the
    /// data to ([MS-SMBD] 3.1.4.5); `None` otherwise.
    pub fn buffer_descriptors(&self) -> Option<BufferDescriptorArray<'_>> {
        if !self.channel().is_rdma() {
            return None;
        }
        BufferDescriptorArray::new_checked(self.channel_info()).ok()
    }

    /// [MS-SMB2] 3.3.5.12, the Channel rules that depend on the connection:
    /// in SMB 3.0 only NONE and RDMA_V1, in 3.0.2 and 3.1.1 also
    /// RDMA_V1_INVALIDATE; RDMA channels only when `over_rdma`. Every
    /// failure is STATUS_INVALID_PARAMETER. (Structural rules were checked
    /// by `new_checked`.)
    pub fn check_channel_rules(&self, dialect: Dialect, over_rdma: bool) -> Result<(), Smb2Error> {
        check_channel_for_dialect(Self::WHAT, self.channel(), dialect, over_rdma)
    }
}

/// The values of an SMB2 READ Request ([MS-SMB2] 2.2.19).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadRequestRepr<'a> {
    /// Padding (the requested response DataOffset).
    pub padding: u8,
    /// Flags.
    pub flags: ReadFlags,
    /// Length.
    pub length: u32,
    /// Offset.
    pub offset: u64,
    /// FileId.
    pub file_id: FileId,
    /// MinimumCount.
    pub minimum_count: u32,
    /// Channel.
    pub channel: Channel,
    /// RemainingBytes.
    pub remaining_bytes: u32,
    /// Channel information (empty with [`Channel::None`]).
    pub channel_info: ChannelInfo<'a>,
}

impl<'a> ReadRequestRepr<'a> {
    /// Reads a checked view.
    pub fn parse(v: &ReadRequest<&'a [u8]>) -> Result<Self, Smb2Error> {
        v.check()?;
        let b: &'a [u8] = v.buffer;
        Ok(ReadRequestRepr {
            padding: v.padding(),
            flags: v.flags(),
            length: v.length(),
            offset: v.offset(),
            file_id: v.file_id(),
            minimum_count: v.minimum_count(),
            channel: v.channel(),
            remaining_bytes: v.remaining_bytes(),
            channel_info: ChannelInfo::from_bytes(slice(
                b,
                ReadRequest::<&[u8]>::FIXED_LEN,
                v.channel_region(),
            )),
        })
    }

    /// Fixed part, then the channel information at header offset 112 (at
    /// least 49 bytes: one byte of Buffer).
    pub fn buffer_len(&self) -> usize {
        (req_field::BUFFER + self.channel_info.byte_len()).max(49)
    }

    /// Writes the request. Fails with `Malformed` for channel information
    /// with SMB2_CHANNEL_NONE, or none with an RDMA channel.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        const WHAT: &str = "SMB2 READ request";
        emit_channel_check(WHAT, self.channel, &self.channel_info)?;
        let len = self.buffer_len();
        room(WHAT, buf, len)?;
        let info_len: u16 = fit(WHAT, "ReadChannelInfoLength", self.channel_info.byte_len())?;
        let buf = &mut buf[..len];
        buf.fill(0);
        let mut v = ReadRequest::new_unchecked(&mut *buf);
        v.set_structure_size(49);
        v.set_padding(self.padding);
        v.set_flags(self.flags);
        v.set_length(self.length);
        v.set_offset(self.offset);
        v.set_file_id(self.file_id);
        v.set_minimum_count(self.minimum_count);
        v.set_channel(self.channel);
        v.set_remaining_bytes(self.remaining_bytes);
        if info_len > 0 {
            v.set_read_channel_info_offset(hdr(req_field::BUFFER) as u16);
            v.set_read_channel_info_length(info_len);
        }
        self.channel_info.write_to(&mut buf[req_field::BUFFER..]);
        Ok(len)
    }
}

/// Emit-side mirror of the receive rules, so that `parse(emit(r)) == r`.
pub(crate) fn emit_channel_check(
    what: &'static str,
    channel: Channel,
    info: &ChannelInfo<'_>,
) -> Result<(), Smb2Error> {
    if channel == Channel::None && !info.is_empty() {
        return Err(Smb2Error::Malformed {
            what,
            field: "channel information with SMB2_CHANNEL_NONE",
        });
    }
    if channel.is_rdma() && (info.is_empty() || info.byte_len() % 16 != 0) {
        return Err(Smb2Error::Malformed {
            what,
            field: "channel information (RDMA channel needs whole buffer descriptors)",
        });
    }
    Ok(())
}

impl_body!(ReadRequestRepr<'a>, ReadRequest, Some(Command::Read));

/// Byte ranges of [MS-SMB2] 2.2.20.
mod rsp_field {
    use crate::smb2::Field;
    pub const DATA_OFFSET: Field = 2..3;
    pub const RESERVED: Field = 3..4;
    pub const DATA_LENGTH: Field = 4..8;
    pub const DATA_REMAINING: Field = 8..12;
    /// Reserved2 before SMB 3.1.1.
    pub const FLAGS: Field = 12..16;
    /// Buffer starts here.
    pub const BUFFER: usize = 16;
}

body_view! {
    /// A zero-copy view of an SMB2 READ Response body ([MS-SMB2] 2.2.20).
    /// DataOffset is one byte, so inline data starts by header offset 255.
    pub struct ReadResponse;
    what: "SMB2 READ response",
    structure_size: 17,
    accessors {
        /// DataOffset, from the header (one byte).
        data_offset, set_data_offset: u8 = rsp_field::DATA_OFFSET;
        /// Reserved.
        reserved, set_reserved: u8 = rsp_field::RESERVED;
        /// DataLength: bytes of inline data (0 when the data went by RDMA).
        data_length, set_data_length: u32 = rsp_field::DATA_LENGTH;
        /// DataRemaining: with an RDMA channel, the bytes RDMA-written.
        data_remaining, set_data_remaining: u32 = rsp_field::DATA_REMAINING;
        /// Flags (SMB 3.1.1: SMB2_READFLAG_RESPONSE_RDMA_TRANSFORM) /
        /// Reserved2.
        flags, set_flags: u32 = rsp_field::FLAGS;
    }
}

impl<T: AsRef<[u8]>> ReadResponse<T> {
    /// Header offset of inline data this crate emits: right after the
    /// fixed part (64 + 16).
    pub const DATA_OFFSET: u8 = 80;

    fn data_region(&self) -> Region {
        Region::new(
            "DataOffset",
            u64::from(self.data_offset()),
            u64::from(self.data_length()),
        )
    }

    fn check_variable(&self) -> Result<(), Smb2Error> {
        let b = self.buffer.as_ref();
        resolve(Self::WHAT, b.len(), Self::FIXED_LEN, self.data_region()).map(|_| ())
    }

    /// The inline data.
    pub fn data(&self) -> &[u8] {
        slice(self.buffer.as_ref(), Self::FIXED_LEN, self.data_region())
    }
}

/// The values of an SMB2 READ Response ([MS-SMB2] 2.2.20).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReadResponseRepr<'a> {
    /// The inline data (empty for an RDMA read).
    pub data: &'a [u8],
    /// DataRemaining (for an RDMA read: the bytes transferred).
    pub data_remaining: u32,
    /// Flags / Reserved2.
    pub flags: u32,
}

impl<'a> ReadResponseRepr<'a> {
    /// Reads a checked view.
    pub fn parse(v: &ReadResponse<&'a [u8]>) -> Result<Self, Smb2Error> {
        v.check()?;
        let b: &'a [u8] = v.buffer;
        Ok(ReadResponseRepr {
            data: slice(b, ReadResponse::<&[u8]>::FIXED_LEN, v.data_region()),
            data_remaining: v.data_remaining(),
            flags: v.flags(),
        })
    }

    /// Fixed part, then the data: exactly 16 bytes when there is none (an
    /// RDMA read). [MS-SMB2] 2.2.20 counts one Buffer byte in StructureSize
    /// 17 but does not require it on the wire; the Linux client's
    /// SMB Direct receive path consumes exactly 16 + DataLength bytes of
    /// an RDMA read's response and takes a 17th byte as the start of the
    /// next message (docs/spec-notes.md, "READ response length").
    pub fn buffer_len(&self) -> usize {
        rsp_field::BUFFER + self.data.len()
    }

    /// Writes the response, DataOffset 80. To send the data from elsewhere
    /// (scatter/gather), emit with empty data and set DataLength on the view.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        const WHAT: &str = "SMB2 READ response";
        let len = self.buffer_len();
        room(WHAT, buf, len)?;
        let data_len: u32 = fit(WHAT, "DataLength", self.data.len())?;
        let buf = &mut buf[..len];
        buf.fill(0);
        let mut v = ReadResponse::new_unchecked(&mut *buf);
        v.set_structure_size(17);
        v.set_data_offset(ReadResponse::<&[u8]>::DATA_OFFSET);
        v.set_data_length(data_len);
        v.set_data_remaining(self.data_remaining);
        v.set_flags(self.flags);
        super::layout::put(buf, rsp_field::BUFFER, self.data);
        Ok(len)
    }
}

impl_body!(ReadResponseRepr<'a>, ReadResponse, Some(Command::Read));
