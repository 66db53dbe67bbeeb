//! [MS-SMB2] 2.2.21 SMB2 WRITE Request and 2.2.22 SMB2 WRITE Response.

use super::channel::{check_channel_for_dialect, check_channel_info, Channel, ChannelInfo};
use super::error::Smb2Error;
use super::file_id::FileId;
use super::layout::{align8, fit, hdr, resolve_all, room, slice, Region};
use super::negotiate::Dialect;
use super::read::emit_channel_check;
use super::Command;
use crate::smbd::wire::BufferDescriptorArray;

bitmask! {
    /// [MS-SMB2] 2.2.21 Flags.
    pub struct WriteFlags(u32) {
        /// SMB2_WRITEFLAG_WRITE_THROUGH (SMB 2.1+).
        WRITE_THROUGH = 0x0000_0001;
        /// SMB2_WRITEFLAG_WRITE_UNBUFFERED (SMB 3.0.2+).
        WRITE_UNBUFFERED = 0x0000_0002;
    }
}

/// Byte ranges of [MS-SMB2] 2.2.21.
mod req_field {
    use crate::smb2::Field;
    pub const DATA_OFFSET: Field = 2..4;
    pub const LENGTH: Field = 4..8;
    pub const OFFSET: Field = 8..16;
    pub const FILE_ID: Field = 16..32;
    pub const CHANNEL: Field = 32..36;
    pub const REMAINING_BYTES: Field = 36..40;
    pub const WRITE_CHANNEL_INFO_OFFSET: Field = 40..42;
    pub const WRITE_CHANNEL_INFO_LENGTH: Field = 42..44;
    pub const FLAGS: Field = 44..48;
    /// Buffer starts here.
    pub const BUFFER: usize = 48;
}

body_view! {
    /// A zero-copy view of an SMB2 WRITE Request body ([MS-SMB2] 2.2.21).
    /// `new_checked` verifies the inline data (DataOffset/Length) and the
    /// channel information (ignored with SMB2_CHANNEL_NONE; with an RDMA
    /// channel present and a whole number of SMB_DIRECT_BUFFER_DESCRIPTOR_V1),
    /// each inside the body after the fixed part, not overlapping.
    pub struct WriteRequest;
    what: "SMB2 WRITE request",
    structure_size: 49,
    accessors {
        /// DataOffset, from the header.
        data_offset, set_data_offset: u16 = req_field::DATA_OFFSET;
        /// Length: bytes of inline data.
        length, set_length: u32 = req_field::LENGTH;
        /// Offset in the file.
        offset, set_offset: u64 = req_field::OFFSET;
        /// FileId.
        file_id, set_file_id: FileId = req_field::FILE_ID;
        /// Channel.
        channel, set_channel: Channel = req_field::CHANNEL;
        /// RemainingBytes: with an RDMA channel, the bytes the server
        /// RDMA-reads from the client's buffers.
        remaining_bytes, set_remaining_bytes: u32 = req_field::REMAINING_BYTES;
        /// WriteChannelInfoOffset, from the header.
        write_channel_info_offset, set_write_channel_info_offset: u16 = req_field::WRITE_CHANNEL_INFO_OFFSET;
        /// WriteChannelInfoLength.
        write_channel_info_length, set_write_channel_info_length: u16 = req_field::WRITE_CHANNEL_INFO_LENGTH;
        /// Flags.
        flags, set_flags: WriteFlags = req_field::FLAGS;
    }
}

impl<T: AsRef<[u8]>> WriteRequest<T> {
    fn regions(&self) -> [Region; 2] {
        let channel = if self.channel() == Channel::None {
            Region::new("WriteChannelInfoOffset", 0, 0)
        } else {
            Region::new(
                "WriteChannelInfoOffset",
                u64::from(self.write_channel_info_offset()),
                u64::from(self.write_channel_info_length()),
            )
        };
        [
            Region::new(
                "DataOffset",
                u64::from(self.data_offset()),
                u64::from(self.length()),
            ),
            channel,
        ]
    }

    fn check_variable(&self) -> Result<(), Smb2Error> {
        let b = self.buffer.as_ref();
        let [_, info] = resolve_all(Self::WHAT, b.len(), Self::FIXED_LEN, self.regions())?;
        check_channel_info(
            Self::WHAT,
            "WriteChannelInfoLength (0 with an RDMA channel)",
            "WriteChannelInfoLength (not a whole number of buffer descriptors)",
            self.channel(),
            info.and_then(|r| b.get(r)),
        )
    }

    /// The inline data.
    pub fn data(&self) -> &[u8] {
        slice(self.buffer.as_ref(), Self::FIXED_LEN, self.regions()[0])
    }

    /// The channel information bytes (empty with SMB2_CHANNEL_NONE).
    pub fn channel_info(&self) -> &[u8] {
        slice(self.buffer.as_ref(), Self::FIXED_LEN, self.regions()[1])
    }

    /// With an RDMA channel, the client buffers the server RDMA-reads the
    /// data from ([MS-SMBD] 3.1.4.6); `None` otherwise.
    pub fn buffer_descriptors(&self) -> Option<BufferDescriptorArray<'_>> {
        if !self.channel().is_rdma() {
            return None;
        }
        BufferDescriptorArray::new_checked(self.channel_info()).ok()
    }

    /// [MS-SMB2] 3.3.5.13, the rules that depend on the connection: the
    /// Channel values of the dialect (as for READ) and, with an RDMA
    /// channel, an RDMA connection and Length and DataOffset both 0 (the
    /// data travels by RDMA; RemainingBytes says how much). Every failure
    /// is STATUS_INVALID_PARAMETER.
    pub fn check_channel_rules(&self, dialect: Dialect, over_rdma: bool) -> Result<(), Smb2Error> {
        check_channel_for_dialect(Self::WHAT, self.channel(), dialect, over_rdma)?;
        if dialect.is_smb3() && self.channel().is_rdma() {
            if self.length() != 0 {
                return Err(Smb2Error::Malformed {
                    what: Self::WHAT,
                    field: "Length (not 0 with an RDMA channel)",
                });
            }
            if self.data_offset() != 0 {
                return Err(Smb2Error::Malformed {
                    what: Self::WHAT,
                    field: "DataOffset (not 0 with an RDMA channel)",
                });
            }
        }
        Ok(())
    }
}

/// The values of an SMB2 WRITE Request ([MS-SMB2] 2.2.21).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteRequestRepr<'a> {
    /// Offset in the file.
    pub offset: u64,
    /// FileId.
    pub file_id: FileId,
    /// Channel.
    pub channel: Channel,
    /// RemainingBytes (with an RDMA channel: the bytes to RDMA-read).
    pub remaining_bytes: u32,
    /// Flags.
    pub flags: WriteFlags,
    /// Inline data (empty for an RDMA write).
    pub data: &'a [u8],
    /// Channel information (empty with [`Channel::None`]).
    pub channel_info: ChannelInfo<'a>,
}

impl<'a> WriteRequestRepr<'a> {
    /// Reads a checked view.
    pub fn parse(v: &WriteRequest<&'a [u8]>) -> Result<Self, Smb2Error> {
        v.check()?;
        let b: &'a [u8] = v.buffer;
        let fixed = WriteRequest::<&[u8]>::FIXED_LEN;
        let [data, info] = v.regions();
        Ok(WriteRequestRepr {
            offset: v.offset(),
            file_id: v.file_id(),
            channel: v.channel(),
            remaining_bytes: v.remaining_bytes(),
            flags: v.flags(),
            data: slice(b, fixed, data),
            channel_info: ChannelInfo::from_bytes(slice(b, fixed, info)),
        })
    }

    fn layout(&self) -> (usize, usize) {
        let data_end = req_field::BUFFER + self.data.len();
        if self.channel_info.is_empty() {
            (data_end, data_end.max(49))
        } else {
            let start = align8(data_end);
            (start, start + self.channel_info.byte_len())
        }
    }

    /// Fixed part, inline data at header offset 112, then the channel
    /// information at the next 8-byte boundary (at least 49 bytes).
    pub fn buffer_len(&self) -> usize {
        self.layout().1
    }

    /// Writes the request. DataOffset is 112, or 0 for an RDMA write with
    /// no inline data (3.3.5.13 requires 0 there). Fails with `Malformed`
    /// for channel information with SMB2_CHANNEL_NONE, or none with an RDMA
    /// channel.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        const WHAT: &str = "SMB2 WRITE request";
        emit_channel_check(WHAT, self.channel, &self.channel_info)?;
        let (info_start, len) = self.layout();
        room(WHAT, buf, len)?;
        let data_len: u32 = fit(WHAT, "Length", self.data.len())?;
        let info_len: u16 = fit(WHAT, "WriteChannelInfoLength", self.channel_info.byte_len())?;
        let info_off: u16 = if info_len == 0 {
            0
        } else {
            fit(WHAT, "WriteChannelInfoOffset", hdr(info_start))?
        };
        let data_off = if self.data.is_empty() && self.channel != Channel::None {
            0
        } else {
            hdr(req_field::BUFFER) as u16
        };
        let buf = &mut buf[..len];
        buf.fill(0);
        let mut v = WriteRequest::new_unchecked(&mut *buf);
        v.set_structure_size(49);
        v.set_data_offset(data_off);
        v.set_length(data_len);
        v.set_offset(self.offset);
        v.set_file_id(self.file_id);
        v.set_channel(self.channel);
        v.set_remaining_bytes(self.remaining_bytes);
        if info_len > 0 {
            v.set_write_channel_info_offset(info_off);
            v.set_write_channel_info_length(info_len);
        }
        v.set_flags(self.flags);
        super::layout::put(buf, req_field::BUFFER, self.data);
        self.channel_info.write_to(&mut buf[info_start..]);
        Ok(len)
    }
}

impl_body!(WriteRequestRepr<'a>, WriteRequest, Some(Command::Write));

/// Byte ranges of [MS-SMB2] 2.2.22.
mod rsp_field {
    use crate::smb2::Field;
    pub const RESERVED: Field = 2..4;
    pub const COUNT: Field = 4..8;
    pub const REMAINING: Field = 8..12;
    pub const WRITE_CHANNEL_INFO_OFFSET: Field = 12..14;
    pub const WRITE_CHANNEL_INFO_LENGTH: Field = 14..16;
}

body_view! {
    /// A zero-copy view of an SMB2 WRITE Response body ([MS-SMB2] 2.2.22).
    pub struct WriteResponse;
    what: "SMB2 WRITE response",
    structure_size: 17,
    accessors {
        /// Reserved.
        reserved, set_reserved: u16 = rsp_field::RESERVED;
        /// Count: bytes written.
        count, set_count: u32 = rsp_field::COUNT;
        /// Remaining (reserved).
        remaining, set_remaining: u32 = rsp_field::REMAINING;
        /// WriteChannelInfoOffset (reserved).
        write_channel_info_offset, set_write_channel_info_offset: u16 = rsp_field::WRITE_CHANNEL_INFO_OFFSET;
        /// WriteChannelInfoLength (reserved).
        write_channel_info_length, set_write_channel_info_length: u16 = rsp_field::WRITE_CHANNEL_INFO_LENGTH;
    }
}

impl<T: AsRef<[u8]>> WriteResponse<T> {
    fn check_variable(&self) -> Result<(), Smb2Error> {
        Ok(())
    }
}

/// The values of an SMB2 WRITE Response ([MS-SMB2] 2.2.22); the reserved
/// fields are emitted as 0 and ignored on receipt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WriteResponseRepr {
    /// Count: bytes written.
    pub count: u32,
}

impl WriteResponseRepr {
    /// Reads a checked view.
    pub fn parse<T: AsRef<[u8]>>(v: &WriteResponse<T>) -> Result<Self, Smb2Error> {
        v.check()?;
        Ok(WriteResponseRepr { count: v.count() })
    }

    /// 17 bytes (the fixed 16 and one byte of Buffer).
    pub const fn buffer_len(&self) -> usize {
        17
    }

    /// Writes the response.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        room("SMB2 WRITE response", buf, 17)?;
        let buf = &mut buf[..17];
        buf.fill(0);
        let mut v = WriteResponse::new_unchecked(buf);
        v.set_structure_size(17);
        v.set_count(self.count);
        Ok(17)
    }
}

impl_body!(WriteResponseRepr, WriteResponse, Some(Command::Write));
