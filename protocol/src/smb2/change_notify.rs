//! [MS-SMB2] 2.2.35 SMB2 CHANGE_NOTIFY Request and 2.2.36 SMB2
//! CHANGE_NOTIFY Response. A server without change notification decodes
//! the request (so a malformed one is STATUS_INVALID_PARAMETER) and
//! answers STATUS_NOT_SUPPORTED.

use super::error::Smb2Error;
use super::file_id::FileId;
use super::layout::room;
use super::Command;

bitmask! {
    /// [MS-SMB2] 2.2.35 Flags.
    pub struct ChangeNotifyFlags(u16) {
        /// SMB2_WATCH_TREE: watch the subtree, not only the directory.
        WATCH_TREE = 0x0001;
    }
}

bitmask! {
    /// [MS-SMB2] 2.2.35 CompletionFilter.
    pub struct CompletionFilter(u32) {
        /// FILE_NOTIFY_CHANGE_FILE_NAME.
        FILE_NAME = 0x0000_0001;
        /// FILE_NOTIFY_CHANGE_DIR_NAME.
        DIR_NAME = 0x0000_0002;
        /// FILE_NOTIFY_CHANGE_ATTRIBUTES.
        ATTRIBUTES = 0x0000_0004;
        /// FILE_NOTIFY_CHANGE_SIZE.
        SIZE = 0x0000_0008;
        /// FILE_NOTIFY_CHANGE_LAST_WRITE.
        LAST_WRITE = 0x0000_0010;
        /// FILE_NOTIFY_CHANGE_LAST_ACCESS.
        LAST_ACCESS = 0x0000_0020;
        /// FILE_NOTIFY_CHANGE_CREATION.
        CREATION = 0x0000_0040;
        /// FILE_NOTIFY_CHANGE_EA.
        EA = 0x0000_0080;
        /// FILE_NOTIFY_CHANGE_SECURITY.
        SECURITY = 0x0000_0100;
        /// FILE_NOTIFY_CHANGE_STREAM_NAME.
        STREAM_NAME = 0x0000_0200;
        /// FILE_NOTIFY_CHANGE_STREAM_SIZE.
        STREAM_SIZE = 0x0000_0400;
        /// FILE_NOTIFY_CHANGE_STREAM_WRITE.
        STREAM_WRITE = 0x0000_0800;
    }
}

/// Byte ranges of [MS-SMB2] 2.2.35.
mod req_field {
    use crate::smb2::Field;
    pub const FLAGS: Field = 2..4;
    pub const OUTPUT_BUFFER_LENGTH: Field = 4..8;
    pub const FILE_ID: Field = 8..24;
    pub const COMPLETION_FILTER: Field = 24..28;
    pub const RESERVED: Field = 28..32;
}

body_view! {
    /// A zero-copy view of an SMB2 CHANGE_NOTIFY Request body ([MS-SMB2]
    /// 2.2.35): 32 bytes, no variable part.
    pub struct ChangeNotifyRequest;
    what: "SMB2 CHANGE_NOTIFY request",
    structure_size: 32,
    accessors {
        /// Flags.
        flags, set_flags: ChangeNotifyFlags = req_field::FLAGS;
        /// OutputBufferLength.
        output_buffer_length, set_output_buffer_length: u32 = req_field::OUTPUT_BUFFER_LENGTH;
        /// FileId (of a directory open).
        file_id, set_file_id: FileId = req_field::FILE_ID;
        /// CompletionFilter.
        completion_filter, set_completion_filter: CompletionFilter = req_field::COMPLETION_FILTER;
        /// Reserved.
        reserved, set_reserved: u32 = req_field::RESERVED;
    }
}

impl<T: AsRef<[u8]>> ChangeNotifyRequest<T> {
    fn check_variable(&self) -> Result<(), Smb2Error> {
        Ok(())
    }
}

/// The values of an SMB2 CHANGE_NOTIFY Request ([MS-SMB2] 2.2.35).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChangeNotifyRequestRepr {
    /// Flags.
    pub flags: ChangeNotifyFlags,
    /// OutputBufferLength.
    pub output_buffer_length: u32,
    /// FileId.
    pub file_id: FileId,
    /// CompletionFilter.
    pub completion_filter: CompletionFilter,
}

impl ChangeNotifyRequestRepr {
    /// Reads a checked view.
    pub fn parse<T: AsRef<[u8]>>(v: &ChangeNotifyRequest<T>) -> Result<Self, Smb2Error> {
        v.check()?;
        Ok(ChangeNotifyRequestRepr {
            flags: v.flags(),
            output_buffer_length: v.output_buffer_length(),
            file_id: v.file_id(),
            completion_filter: v.completion_filter(),
        })
    }

    /// 32 bytes.
    pub const fn buffer_len(&self) -> usize {
        32
    }

    /// Writes the request.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        room("SMB2 CHANGE_NOTIFY request", buf, 32)?;
        let buf = &mut buf[..32];
        buf.fill(0);
        let mut v = ChangeNotifyRequest::new_unchecked(buf);
        v.set_structure_size(32);
        v.set_flags(self.flags);
        v.set_output_buffer_length(self.output_buffer_length);
        v.set_file_id(self.file_id);
        v.set_completion_filter(self.completion_filter);
        Ok(32)
    }
}

impl_body!(
    ChangeNotifyRequestRepr,
    ChangeNotifyRequest,
    Some(Command::ChangeNotify)
);

output_buffer_response! {
    /// A zero-copy view of an SMB2 CHANGE_NOTIFY Response body ([MS-SMB2]
    /// 2.2.36).
    view ChangeNotifyResponse;
    /// The values of an SMB2 CHANGE_NOTIFY Response ([MS-SMB2] 2.2.36):
    /// FILE_NOTIFY_INFORMATION entries ([MS-FSCC] 2.7.1), kept opaque.
    repr ChangeNotifyResponseRepr;
    what: "SMB2 CHANGE_NOTIFY response",
    command: Some(Command::ChangeNotify)
}
