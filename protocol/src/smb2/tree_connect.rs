//! [MS-SMB2] 2.2.9 SMB2 TREE_CONNECT Request and 2.2.10 SMB2 TREE_CONNECT
//! Response.

use super::create::AccessMask;
use super::error::Smb2Error;
use super::layout::{fit, hdr, resolve, room, slice, Region};
use super::utf16::Utf16Str;
use super::Command;

bitmask! {
    /// [MS-SMB2] 2.2.9 Flags (SMB 3.1.1; Reserved before).
    pub struct TreeConnectFlags(u16) {
        /// SMB2_TREE_CONNECT_FLAG_CLUSTER_RECONNECT.
        CLUSTER_RECONNECT = 0x0001;
        /// SMB2_TREE_CONNECT_FLAG_REDIRECT_TO_OWNER.
        REDIRECT_TO_OWNER = 0x0002;
        /// SMB2_TREE_CONNECT_FLAG_EXTENSION_PRESENT: Buffer holds a
        /// TREE_CONNECT Request Extension (2.2.9.1), which this crate does
        /// not decode (the Path is still found through PathOffset).
        EXTENSION_PRESENT = 0x0004;
    }
}

wire_enum! {
    /// [MS-SMB2] 2.2.10 ShareType.
    pub struct ShareType(u8) {
        /// SMB2_SHARE_TYPE_DISK.
        DISK = 0x01;
        /// SMB2_SHARE_TYPE_PIPE.
        PIPE = 0x02;
        /// SMB2_SHARE_TYPE_PRINT.
        PRINT = 0x03;
    }
}

bitmask! {
    /// [MS-SMB2] 2.2.10 ShareFlags. Bits 0x30 are the caching policy, a
    /// 2-bit value: 0x00 manual, 0x10 auto, 0x20 VDO, 0x30 none.
    pub struct ShareFlags(u32) {
        /// SMB2_SHAREFLAG_AUTO_CACHING.
        AUTO_CACHING = 0x0000_0010;
        /// SMB2_SHAREFLAG_VDO_CACHING.
        VDO_CACHING = 0x0000_0020;
        /// SMB2_SHAREFLAG_DFS.
        DFS = 0x0000_0001;
        /// SMB2_SHAREFLAG_DFS_ROOT.
        DFS_ROOT = 0x0000_0002;
        /// SMB2_SHAREFLAG_RESTRICT_EXCLUSIVE_OPENS.
        RESTRICT_EXCLUSIVE_OPENS = 0x0000_0100;
        /// SMB2_SHAREFLAG_FORCE_SHARED_DELETE.
        FORCE_SHARED_DELETE = 0x0000_0200;
        /// SMB2_SHAREFLAG_ALLOW_NAMESPACE_CACHING.
        ALLOW_NAMESPACE_CACHING = 0x0000_0400;
        /// SMB2_SHAREFLAG_ACCESS_BASED_DIRECTORY_ENUM.
        ACCESS_BASED_DIRECTORY_ENUM = 0x0000_0800;
        /// SMB2_SHAREFLAG_FORCE_LEVELII_OPLOCK.
        FORCE_LEVELII_OPLOCK = 0x0000_1000;
        /// SMB2_SHAREFLAG_ENABLE_HASH_V1.
        ENABLE_HASH_V1 = 0x0000_2000;
        /// SMB2_SHAREFLAG_ENABLE_HASH_V2.
        ENABLE_HASH_V2 = 0x0000_4000;
        /// SMB2_SHAREFLAG_ENCRYPT_DATA.
        ENCRYPT_DATA = 0x0000_8000;
        /// SMB2_SHAREFLAG_IDENTITY_REMOTING.
        IDENTITY_REMOTING = 0x0004_0000;
        /// SMB2_SHAREFLAG_COMPRESS_DATA.
        COMPRESS_DATA = 0x0010_0000;
        /// SMB2_SHAREFLAG_ISOLATED_TRANSPORT.
        ISOLATED_TRANSPORT = 0x0020_0000;
    }
}

impl ShareFlags {
    /// The caching-policy bits.
    pub const CACHING_MASK: u32 = 0x30;
}

bitmask! {
    /// [MS-SMB2] 2.2.10 Capabilities (SMB2_SHARE_CAP_*).
    pub struct ShareCapabilities(u32) {
        /// SMB2_SHARE_CAP_DFS.
        DFS = 0x0000_0008;
        /// SMB2_SHARE_CAP_CONTINUOUS_AVAILABILITY.
        CONTINUOUS_AVAILABILITY = 0x0000_0010;
        /// SMB2_SHARE_CAP_SCALEOUT.
        SCALEOUT = 0x0000_0020;
        /// SMB2_SHARE_CAP_CLUSTER.
        CLUSTER = 0x0000_0040;
        /// SMB2_SHARE_CAP_ASYMMETRIC.
        ASYMMETRIC = 0x0000_0080;
        /// SMB2_SHARE_CAP_REDIRECT_TO_OWNER.
        REDIRECT_TO_OWNER = 0x0000_0100;
    }
}

/// Byte ranges of [MS-SMB2] 2.2.9.
mod req_field {
    use crate::smb2::Field;
    pub const FLAGS: Field = 2..4;
    pub const PATH_OFFSET: Field = 4..6;
    pub const PATH_LENGTH: Field = 6..8;
    /// Buffer starts here.
    pub const BUFFER: usize = 8;
}

body_view! {
    /// A zero-copy view of an SMB2 TREE_CONNECT Request body ([MS-SMB2]
    /// 2.2.9).
    pub struct TreeConnectRequest;
    what: "SMB2 TREE_CONNECT request",
    structure_size: 9,
    accessors {
        /// Flags (SMB 3.1.1) / Reserved.
        flags, set_flags: TreeConnectFlags = req_field::FLAGS;
        /// PathOffset, from the header.
        path_offset, set_path_offset: u16 = req_field::PATH_OFFSET;
        /// PathLength, in bytes.
        path_length, set_path_length: u16 = req_field::PATH_LENGTH;
    }
}

impl<T: AsRef<[u8]>> TreeConnectRequest<T> {
    fn path_region(&self) -> Region {
        Region::new(
            "PathOffset",
            u64::from(self.path_offset()),
            u64::from(self.path_length()),
        )
    }
    fn check_variable(&self) -> Result<(), Smb2Error> {
        let b = self.buffer.as_ref();
        resolve(Self::WHAT, b.len(), Self::FIXED_LEN, self.path_region()).map(|_| ())
    }
    /// The share path, UTF-16LE (`\\server\share`).
    pub fn path(&self) -> Utf16Str<'_> {
        Utf16Str::from_utf16le(slice(
            self.buffer.as_ref(),
            Self::FIXED_LEN,
            self.path_region(),
        ))
    }
}

/// The values of an SMB2 TREE_CONNECT Request ([MS-SMB2] 2.2.9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeConnectRequestRepr<'a> {
    /// Flags.
    pub flags: TreeConnectFlags,
    /// Path (`\\server\share`).
    pub path: Utf16Str<'a>,
}

impl<'a> TreeConnectRequestRepr<'a> {
    /// Reads a checked view.
    pub fn parse(v: &TreeConnectRequest<&'a [u8]>) -> Result<Self, Smb2Error> {
        v.check()?;
        let b: &'a [u8] = v.buffer;
        Ok(TreeConnectRequestRepr {
            flags: v.flags(),
            path: Utf16Str::from_utf16le(slice(
                b,
                TreeConnectRequest::<&[u8]>::FIXED_LEN,
                v.path_region(),
            )),
        })
    }

    /// Fixed part, then the path (at least 9 bytes).
    pub fn buffer_len(&self) -> usize {
        (req_field::BUFFER + self.path.byte_len()).max(9)
    }

    /// Writes the request; the path at header offset 72.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        const WHAT: &str = "SMB2 TREE_CONNECT request";
        let len = self.buffer_len();
        room(WHAT, buf, len)?;
        let path_len: u16 = fit(WHAT, "PathLength", self.path.byte_len())?;
        let buf = &mut buf[..len];
        buf.fill(0);
        let mut v = TreeConnectRequest::new_unchecked(&mut *buf);
        v.set_structure_size(9);
        v.set_flags(self.flags);
        v.set_path_offset(hdr(req_field::BUFFER) as u16);
        v.set_path_length(path_len);
        self.path.write_to(&mut buf[req_field::BUFFER..]);
        Ok(len)
    }
}

impl_body!(
    TreeConnectRequestRepr<'a>,
    TreeConnectRequest,
    Some(Command::TreeConnect)
);

/// Byte ranges of [MS-SMB2] 2.2.10.
mod rsp_field {
    use crate::smb2::Field;
    pub const SHARE_TYPE: Field = 2..3;
    pub const RESERVED: Field = 3..4;
    pub const SHARE_FLAGS: Field = 4..8;
    pub const CAPABILITIES: Field = 8..12;
    pub const MAXIMAL_ACCESS: Field = 12..16;
}

body_view! {
    /// A zero-copy view of an SMB2 TREE_CONNECT Response body ([MS-SMB2]
    /// 2.2.10).
    pub struct TreeConnectResponse;
    what: "SMB2 TREE_CONNECT response",
    structure_size: 16,
    accessors {
        /// ShareType.
        share_type, set_share_type: ShareType = rsp_field::SHARE_TYPE;
        /// Reserved.
        reserved, set_reserved: u8 = rsp_field::RESERVED;
        /// ShareFlags.
        share_flags, set_share_flags: ShareFlags = rsp_field::SHARE_FLAGS;
        /// Capabilities.
        capabilities, set_capabilities: ShareCapabilities = rsp_field::CAPABILITIES;
        /// MaximalAccess.
        maximal_access, set_maximal_access: AccessMask = rsp_field::MAXIMAL_ACCESS;
    }
}

impl<T: AsRef<[u8]>> TreeConnectResponse<T> {
    fn check_variable(&self) -> Result<(), Smb2Error> {
        Ok(())
    }
}

/// The values of an SMB2 TREE_CONNECT Response ([MS-SMB2] 2.2.10).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeConnectResponseRepr {
    /// ShareType.
    pub share_type: ShareType,
    /// ShareFlags.
    pub share_flags: ShareFlags,
    /// Capabilities.
    pub capabilities: ShareCapabilities,
    /// MaximalAccess.
    pub maximal_access: AccessMask,
}

impl TreeConnectResponseRepr {
    /// Reads a checked view.
    pub fn parse<T: AsRef<[u8]>>(v: &TreeConnectResponse<T>) -> Result<Self, Smb2Error> {
        v.check()?;
        Ok(TreeConnectResponseRepr {
            share_type: v.share_type(),
            share_flags: v.share_flags(),
            capabilities: v.capabilities(),
            maximal_access: v.maximal_access(),
        })
    }

    /// 16 bytes.
    pub const fn buffer_len(&self) -> usize {
        16
    }

    /// Writes the response.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        room("SMB2 TREE_CONNECT response", buf, 16)?;
        let mut v = TreeConnectResponse::new_unchecked(&mut buf[..16]);
        v.set_structure_size(16);
        v.set_share_type(self.share_type);
        v.set_reserved(0);
        v.set_share_flags(self.share_flags);
        v.set_capabilities(self.capabilities);
        v.set_maximal_access(self.maximal_access);
        Ok(16)
    }
}

impl_body!(
    TreeConnectResponseRepr,
    TreeConnectResponse,
    Some(Command::TreeConnect)
);
