//! [MS-SMB2] 2.2.17 SMB2 FLUSH Request and 2.2.18 SMB2 FLUSH Response.

use super::error::Smb2Error;
use super::file_id::FileId;
use super::layout::room;
use super::Command;

/// Byte ranges of [MS-SMB2] 2.2.17.
mod req_field {
    use crate::smb2::Field;
    pub const RESERVED1: Field = 2..4;
    pub const RESERVED2: Field = 4..8;
    pub const FILE_ID: Field = 8..24;
}

body_view! {
    /// A zero-copy view of an SMB2 FLUSH Request body ([MS-SMB2] 2.2.17).
    pub struct FlushRequest;
    what: "SMB2 FLUSH request",
    structure_size: 24,
    accessors {
        /// Reserved1.
        reserved1, set_reserved1: u16 = req_field::RESERVED1;
        /// Reserved2.
        reserved2, set_reserved2: u32 = req_field::RESERVED2;
        /// FileId.
        file_id, set_file_id: FileId = req_field::FILE_ID;
    }
}

impl<T: AsRef<[u8]>> FlushRequest<T> {
    fn check_variable(&self) -> Result<(), Smb2Error> {
        Ok(())
    }
}

/// The values of an SMB2 FLUSH Request ([MS-SMB2] 2.2.17).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FlushRequestRepr {
    /// FileId.
    pub file_id: FileId,
}

impl FlushRequestRepr {
    /// Reads a checked view.
    pub fn parse<T: AsRef<[u8]>>(v: &FlushRequest<T>) -> Result<Self, Smb2Error> {
        v.check()?;
        Ok(FlushRequestRepr {
            file_id: v.file_id(),
        })
    }

    /// 24 bytes.
    pub const fn buffer_len(&self) -> usize {
        24
    }

    /// Writes the request.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        room("SMB2 FLUSH request", buf, 24)?;
        let buf = &mut buf[..24];
        buf.fill(0);
        let mut v = FlushRequest::new_unchecked(buf);
        v.set_structure_size(24);
        v.set_file_id(self.file_id);
        Ok(24)
    }
}

impl_body!(FlushRequestRepr, FlushRequest, Some(Command::Flush));

reserved_body! {
    /// A zero-copy view of an SMB2 FLUSH Response body ([MS-SMB2] 2.2.18).
    view FlushResponse;
    /// The SMB2 FLUSH Response ([MS-SMB2] 2.2.18): no values.
    repr FlushResponseRepr;
    what: "SMB2 FLUSH response",
    command: Some(Command::Flush)
}
