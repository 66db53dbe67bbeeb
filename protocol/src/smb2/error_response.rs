//! [MS-SMB2] 2.2.2 SMB2 ERROR Response and 2.2.2.1 SMB2 ERROR Context
//! Response.

use super::error::Smb2Error;
use super::layout::{align8, room};
use super::Scalar;

/// Byte ranges of [MS-SMB2] 2.2.2.
mod field {
    use crate::smb2::Field;
    pub const ERROR_CONTEXT_COUNT: Field = 2..3;
    pub const RESERVED: Field = 3..4;
    pub const BYTE_COUNT: Field = 4..8;
    /// ErrorData starts here.
    pub const ERROR_DATA: usize = 8;
}

/// Byte ranges of [MS-SMB2] 2.2.2.1 (relative to the context).
mod ctx_field {
    use crate::smb2::Field;
    pub const ERROR_DATA_LENGTH: Field = 0..4;
    pub const ERROR_ID: Field = 4..8;
    pub const HEADER_LEN: usize = 8;
}

body_view! {
    /// A zero-copy view of an SMB2 ERROR Response body ([MS-SMB2] 2.2.2).
    /// `new_checked` verifies that ByteCount bytes of ErrorData are present
    /// and, when ErrorContextCount is not 0 (SMB 3.1.1), that ErrorData holds
    /// that many well-formed, 8-byte aligned ERROR Contexts (2.2.2.1).
    pub struct ErrorResponse;
    what: "SMB2 ERROR response",
    structure_size: 9,
    accessors {
        /// ErrorContextCount (SMB 3.1.1; 0 otherwise).
        error_context_count, set_error_context_count: u8 = field::ERROR_CONTEXT_COUNT;
        /// Reserved.
        reserved, set_reserved: u8 = field::RESERVED;
        /// ByteCount: bytes of ErrorData.
        byte_count, set_byte_count: u32 = field::BYTE_COUNT;
    }
}

impl<T: AsRef<[u8]>> ErrorResponse<T> {
    fn check_variable(&self) -> Result<(), Smb2Error> {
        let b = self.buffer.as_ref();
        let need = (field::ERROR_DATA as u64).saturating_add(u64::from(self.byte_count()));
        if need > b.len() as u64 {
            return Err(Smb2Error::OutOfBounds {
                what: Self::WHAT,
                field: "ByteCount",
                offset: field::ERROR_DATA as u64 + super::header::HEADER_LEN as u64,
                length: u64::from(self.byte_count()),
                min: (field::ERROR_DATA + super::header::HEADER_LEN) as u64,
                limit: (b.len() + super::header::HEADER_LEN) as u64,
            });
        }
        for c in self.error_contexts() {
            c?;
        }
        Ok(())
    }

    /// ErrorData: ByteCount bytes after the fixed part (empty when ByteCount
    /// is 0, even though a sender then puts one zero byte there).
    pub fn error_data(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        let end = field::ERROR_DATA.saturating_add(self.byte_count() as usize);
        b.get(field::ERROR_DATA..end).unwrap_or(&[])
    }

    /// The ERROR Contexts of ErrorData (none when ErrorContextCount is 0).
    pub fn error_contexts(&self) -> ErrorContextIter<'_> {
        ErrorContextIter {
            data: self.error_data(),
            pos: 0,
            left: self.error_context_count(),
            first: true,
        }
    }
}

/// [MS-SMB2] 2.2.2.1: one ERROR Context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorContext<'a> {
    /// ErrorId: SMB2_ERROR_ID_DEFAULT (0) or SMB2_ERROR_ID_SHARE_REDIRECT
    /// (0x72645253).
    pub error_id: u32,
    /// ErrorContextData (ErrorDataLength bytes).
    pub data: &'a [u8],
}

impl ErrorContext<'_> {
    /// SMB2_ERROR_ID_DEFAULT.
    pub const ERROR_ID_DEFAULT: u32 = 0;
    /// SMB2_ERROR_ID_SHARE_REDIRECT.
    pub const ERROR_ID_SHARE_REDIRECT: u32 = 0x7264_5253;
}

/// Iterator over the ERROR Contexts of an ERROR response; each starts
/// 8-byte aligned relative to ErrorData (2.2.2). The first malformed one is
/// yielded as `Err` and ends the walk.
#[derive(Debug, Clone)]
pub struct ErrorContextIter<'a> {
    data: &'a [u8],
    pos: usize,
    left: u8,
    first: bool,
}

impl<'a> Iterator for ErrorContextIter<'a> {
    type Item = Result<ErrorContext<'a>, Smb2Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        if !self.first {
            self.pos = align8(self.pos);
        }
        self.first = false;
        const WHAT: &str = "SMB2 ERROR Context";
        let need = self.pos.saturating_add(ctx_field::HEADER_LEN);
        let Some(h) = self.data.get(self.pos..need) else {
            self.left = 0;
            return Some(Err(Smb2Error::Truncated {
                what: WHAT,
                need,
                have: self.data.len(),
            }));
        };
        let len = u32::read(h, ctx_field::ERROR_DATA_LENGTH);
        let error_id = u32::read(h, ctx_field::ERROR_ID);
        let end = need.saturating_add(len as usize);
        let Some(data) = self.data.get(need..end) else {
            self.left = 0;
            return Some(Err(Smb2Error::Truncated {
                what: WHAT,
                need: end,
                have: self.data.len(),
            }));
        };
        self.pos = end;
        Some(Ok(ErrorContext { error_id, data }))
    }
}

/// The values of an SMB2 ERROR Response ([MS-SMB2] 2.2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ErrorResponseRepr<'a> {
    /// ErrorContextCount.
    pub error_context_count: u8,
    /// ErrorData (ByteCount bytes): for most statuses empty; for
    /// STATUS_BUFFER_TOO_SMALL a 4-byte required size; for
    /// STATUS_STOPPED_ON_SYMLINK a Symbolic Link Error Response (2.2.2.2);
    /// with contexts, the contexts.
    pub error_data: &'a [u8],
}

impl<'a> ErrorResponseRepr<'a> {
    /// The common ERROR response: no contexts, no data.
    pub const EMPTY: ErrorResponseRepr<'static> = ErrorResponseRepr {
        error_context_count: 0,
        error_data: &[],
    };

    /// Reads a checked view.
    pub fn parse(v: &ErrorResponse<&'a [u8]>) -> Result<Self, Smb2Error> {
        v.check()?;
        let b: &'a [u8] = v.buffer;
        let end = field::ERROR_DATA.saturating_add(v.byte_count() as usize);
        Ok(ErrorResponseRepr {
            error_context_count: v.error_context_count(),
            error_data: b.get(field::ERROR_DATA..end).unwrap_or(&[]),
        })
    }

    /// 8 + ErrorData, and at least 9: [MS-SMB2] 2.2.2 requires one byte of
    /// ErrorData when ByteCount is 0.
    pub fn buffer_len(&self) -> usize {
        field::ERROR_DATA + self.error_data.len().max(1)
    }

    /// Writes the response.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Smb2Error> {
        const WHAT: &str = "SMB2 ERROR response";
        let len = self.buffer_len();
        room(WHAT, buf, len)?;
        let byte_count: u32 = super::layout::fit(WHAT, "ByteCount", self.error_data.len())?;
        let buf = &mut buf[..len];
        buf.fill(0);
        let mut v = ErrorResponse::new_unchecked(&mut *buf);
        v.set_structure_size(9);
        v.set_error_context_count(self.error_context_count);
        v.set_byte_count(byte_count);
        super::layout::put(buf, field::ERROR_DATA, self.error_data);
        Ok(len)
    }
}

impl_body!(ErrorResponseRepr<'a>, ErrorResponse, None);
