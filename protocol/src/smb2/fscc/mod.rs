//! [MS-FSCC] information classes the server writes into QUERY_INFO,
//! QUERY_DIRECTORY and reads from SET_INFO payloads ([MS-SMB2] 2.2.37,
//! 2.2.33, 2.2.39): file classes ([MS-FSCC] 2.4), file system classes
//! ([MS-FSCC] 2.5) and the directory enumeration classes with their
//! NextEntryOffset chaining.
//!
//! [MS-FSCC] section numbers move between revisions; each type names its
//! class by title and gives the number of the revision checked when known.
//! All fields are little-endian; every `Repr` has `parse` (over a checked
//! view) / `from_bytes`, `buffer_len` and `emit` (which zeroes reserved
//! fields and fails with [`Smb2Error::BufferTooSmall`] instead of
//! panicking). A buffer longer than a fixed-size class is accepted (the
//! trailing bytes are ignored); a shorter one is
//! [`Smb2Error::Truncated`], which a server answers with
//! STATUS_INFO_LENGTH_MISMATCH ([`info_length_status`]).

use super::error::Smb2Error;
use super::{Field, Scalar};
use crate::ntstatus::{NtStatus, STATUS_INFO_LENGTH_MISMATCH};

/// A one-byte BOOLEAN of [MS-FSCC]: 0 is FALSE, anything else TRUE;
/// written as 0 or 1.
impl Scalar for bool {
    fn read(b: &[u8], f: Field) -> Self {
        u8::read(b, f) != 0
    }
    fn write(self, b: &mut [u8], f: Field) {
        u8::from(self).write(b, f)
    }
}

/// The NTSTATUS for a SET_INFO (or QUERY_INFO input) payload that failed to
/// decode: [MS-FSA] 2.1.5.14 fails an InputBufferSize below the class's
/// size with STATUS_INFO_LENGTH_MISMATCH; anything else malformed is
/// STATUS_INVALID_PARAMETER ([`Smb2Error::status`]).
pub fn info_length_status(e: &Smb2Error) -> NtStatus {
    match e {
        Smb2Error::Truncated { .. } => STATUS_INFO_LENGTH_MISMATCH,
        other => other.status(),
    }
}

/// Fails with `Truncated` unless `b` holds `need` bytes.
pub(crate) fn need(what: &'static str, b: &[u8], need: usize) -> Result<(), Smb2Error> {
    if b.len() < need {
        Err(Smb2Error::Truncated {
            what,
            need,
            have: b.len(),
        })
    } else {
        Ok(())
    }
}

/// Entries chained by a 4-byte NextEntryOffset at their start ([MS-FSCC]
/// 2.4: "each MUST be aligned on an 8-byte boundary", NextEntryOffset 0 on
/// the last, no padding after it): the receive side. Each step yields the
/// bytes from the entry's start to the next entry (or the end of the
/// buffer for the last); `min_len` says how long the entry itself is
/// (fixed part plus its name) and that must fit. The first malformed entry
/// ends the walk.
#[derive(Debug, Clone)]
pub(crate) struct Chain<'a> {
    what: &'static str,
    buf: &'a [u8],
    pos: usize,
    done: bool,
}

impl<'a> Chain<'a> {
    pub(crate) fn new(what: &'static str, buf: &'a [u8]) -> Self {
        Chain {
            what,
            buf,
            pos: 0,
            done: buf.is_empty(),
        }
    }

    /// The next entry (`fixed` bytes at least, then `min_len(entry)`).
    pub(crate) fn next_entry(
        &mut self,
        fixed: usize,
        min_len: impl Fn(&[u8]) -> usize,
    ) -> Option<Result<&'a [u8], Smb2Error>> {
        if self.done {
            return None;
        }
        let r = self.step(fixed, min_len);
        if r.is_err() {
            self.done = true;
        }
        Some(r)
    }

    fn step(
        &mut self,
        fixed: usize,
        min_len: impl Fn(&[u8]) -> usize,
    ) -> Result<&'a [u8], Smb2Error> {
        let what = self.what;
        let rest = self.buf.get(self.pos..).unwrap_or(&[]);
        need(what, rest, fixed)?;
        let next = u32::read(rest, 0..4);
        let extent = if next == 0 {
            rest.len()
        } else {
            if next % 8 != 0 {
                return Err(Smb2Error::Misaligned {
                    what,
                    field: "NextEntryOffset",
                    offset: u64::from(next),
                });
            }
            if next as usize > rest.len() {
                return Err(Smb2Error::OutOfBounds {
                    what,
                    field: "NextEntryOffset",
                    offset: u64::from(next),
                    length: 0,
                    min: fixed as u64,
                    limit: rest.len() as u64,
                });
            }
            next as usize
        };
        let entry = &rest[..extent];
        let len = min_len(entry);
        if len > extent {
            return Err(Smb2Error::Truncated {
                what,
                need: len,
                have: extent,
            });
        }
        if next == 0 {
            self.done = true;
        } else {
            self.pos += extent;
        }
        Ok(&entry[..len])
    }
}

/// The emit side of [`Chain`]: where the next entry goes in a buffer of
/// `cap` bytes and the patching of the previous entry's NextEntryOffset.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ChainWriter {
    /// End of the last entry written (no trailing padding).
    pub end: usize,
    /// Start of the last entry written.
    last: Option<usize>,
    /// Entries written.
    pub count: usize,
}

impl ChainWriter {
    /// Where an entry of `len` bytes would start, if it fits in `cap`.
    pub(crate) fn place(&self, len: usize, cap: usize) -> Option<usize> {
        let start = if self.count == 0 {
            0
        } else {
            super::layout::align8(self.end)
        };
        (start.checked_add(len)? <= cap).then_some(start)
    }

    /// Records an entry of `len` bytes written at `start` (its
    /// NextEntryOffset already 0): zeroes the alignment padding before it and
    /// links the previous entry to it.
    pub(crate) fn commit(&mut self, buf: &mut [u8], start: usize, len: usize) {
        if let Some(pad) = buf.get_mut(self.end.min(start)..start) {
            pad.fill(0);
        }
        if let Some(prev) = self.last {
            ((start - prev) as u32).write(buf, prev..prev + 4);
        }
        self.last = Some(start);
        self.end = start + len;
        self.count += 1;
    }
}

/// Generates a fixed-size [MS-FSCC] structure: a zero-copy view
/// (`new_checked` checks the length once; getters and setters per field)
/// and a `Repr` with the same field names, `parse`, `from_bytes`,
/// `buffer_len`, `emit` and `to_bytes`. Bytes no field covers are reserved:
/// `emit` writes them as zero.
macro_rules! fscc_fixed {
    (
        $(#[$vmeta:meta])*
        view $view:ident;
        $(#[$rmeta:meta])*
        repr $repr:ident;
        what: $what:expr,
        len: $len:expr,
        fields {
            $( $(#[$fmeta:meta])* $get:ident, $set:ident: $ty:ty = $field:expr; )*
        }
    ) => {
        $(#[$vmeta])*
        #[derive(Debug, Clone)]
        pub struct $view<T: AsRef<[u8]>> {
            buffer: T,
        }

        #[allow(dead_code)]
        impl<T: AsRef<[u8]>> $view<T> {
            /// Length of the structure.
            pub const LEN: usize = $len;
            /// Name used in errors.
            pub const WHAT: &'static str = $what;

            /// Wraps `buffer` without checking it (short reads yield zero).
            pub const fn new_unchecked(buffer: T) -> Self {
                $view { buffer }
            }

            /// Wraps `buffer`, failing with `Truncated` when it is shorter
            /// than the structure.
            pub fn new_checked(buffer: T) -> Result<Self, $crate::smb2::Smb2Error> {
                $crate::smb2::fscc::need($what, buffer.as_ref(), $len)?;
                Ok(Self::new_unchecked(buffer))
            }

            /// The underlying buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }

            $(
                $(#[$fmeta])*
                #[inline]
                pub fn $get(&self) -> $ty {
                    <$ty as $crate::smb2::Scalar>::read(self.buffer.as_ref(), $field)
                }
            )*
        }

        #[allow(dead_code)]
        impl<T: AsRef<[u8]> + AsMut<[u8]>> $view<T> {
            $(
                #[doc = concat!("Sets the field [`", stringify!($get), "`](Self::", stringify!($get), ") reads.")]
                #[inline]
                pub fn $set(&mut self, v: $ty) {
                    <$ty as $crate::smb2::Scalar>::write(v, self.buffer.as_mut(), $field)
                }
            )*
        }

        $(#[$rmeta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
        pub struct $repr {
            $( $(#[$fmeta])* pub $get: $ty, )*
        }

        impl $repr {
            /// Length of the structure.
            pub const LEN: usize = $len;

            /// Reads a view (checking its length again).
            pub fn parse<T: AsRef<[u8]>>(v: &$view<T>) -> Result<Self, $crate::smb2::Smb2Error> {
                let v = $view::new_checked(v.buffer.as_ref())?;
                Ok($repr { $( $get: v.$get(), )* })
            }

            /// Checks and reads `bytes` (trailing bytes are ignored).
            pub fn from_bytes(bytes: &[u8]) -> Result<Self, $crate::smb2::Smb2Error> {
                Self::parse(&$view::new_checked(bytes)?)
            }

            /// Bytes `emit` writes.
            pub const fn buffer_len(&self) -> usize {
                $len
            }

            /// Writes the structure (reserved bytes zero); returns its length.
            pub fn emit(&self, buf: &mut [u8]) -> Result<usize, $crate::smb2::Smb2Error> {
                $crate::smb2::layout::room($what, buf, $len)?;
                let buf = &mut buf[..$len];
                buf.fill(0);
                #[allow(unused_mut, unused_variables)]
                let mut v = $view::new_unchecked(buf);
                $( v.$set(self.$get); )*
                Ok($len)
            }

            /// The wire bytes.
            pub fn to_bytes(&self) -> [u8; $len] {
                let mut b = [0u8; $len];
                // Cannot fail: the array has exactly the room needed.
                let _ = self.emit(&mut b);
                b
            }
        }
    };
}

mod classes;
mod dir_info;
mod file_info;
mod fs_info;

pub use classes::{FileInfoClass, FsInfoClass};
pub use dir_info::{
    pack_directory_entries, DirectoryEntry, DirectoryEntryIter, DirectoryEntryWriter,
    DirectoryInfoClass,
};
pub use file_info::{
    FileAccessInformation, FileAccessInformationRepr, FileAlignmentInformation,
    FileAlignmentInformationRepr, FileAllInformationRepr, FileAllocationInformation,
    FileAllocationInformationRepr, FileAttributeTagInformation, FileAttributeTagInformationRepr,
    FileBasicInformation, FileBasicInformationRepr, FileCompressionInformation,
    FileCompressionInformationRepr, FileDispositionInformation, FileDispositionInformationRepr,
    FileEaInformation, FileEaInformationRepr, FileEndOfFileInformation,
    FileEndOfFileInformationRepr, FileInternalInformation, FileInternalInformationRepr,
    FileLinkInformationRepr, FileModeInformation, FileModeInformationRepr, FileNameInformationRepr,
    FileNetworkOpenInformation, FileNetworkOpenInformationRepr, FilePositionInformation,
    FilePositionInformationRepr, FileRenameInformationRepr, FileStandardInformation,
    FileStandardInformationRepr, FileStreamInformationRepr, StreamEntry, StreamEntryIter,
    DEFAULT_DATA_STREAM_NAME,
};
pub use fs_info::{
    FileFsAttributeInformationRepr, FileFsDeviceInformation, FileFsDeviceInformationRepr,
    FileFsFullSizeInformation, FileFsFullSizeInformationRepr, FileFsObjectIdInformationRepr,
    FileFsSectorSizeInformation, FileFsSectorSizeInformationRepr, FileFsSizeInformation,
    FileFsSizeInformationRepr, FileFsVolumeInformationRepr, FileSystemAttributes,
    FsDeviceCharacteristics, SectorSizeFlags, FILE_DEVICE_DISK,
};
