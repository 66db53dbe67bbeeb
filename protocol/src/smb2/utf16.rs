//! UTF-16LE strings as SMB2 carries them (TREE_CONNECT path, CREATE name):
//! not null-terminated, length in bytes ([MS-SMB2] 2.2.9, 2.2.13).

use super::error::Smb2Error;

/// A UTF-16LE string: either borrowed wire bytes (what `parse` yields,
/// zero-copy, not validated) or a borrowed `&str` (what a builder takes,
/// encoded on emit). Two values are equal when their wire bytes are.
#[derive(Clone, Copy)]
pub struct Utf16Str<'a>(Inner<'a>);

#[derive(Clone, Copy)]
enum Inner<'a> {
    Le(&'a [u8]),
    Str(&'a str),
}

impl<'a> Utf16Str<'a> {
    /// The empty string.
    pub const EMPTY: Utf16Str<'static> = Utf16Str(Inner::Le(&[]));

    /// Wire bytes, kept as they are (an odd length or an unpaired surrogate
    /// is only reported by [`decode`](Self::decode)).
    pub const fn from_utf16le(bytes: &'a [u8]) -> Self {
        Utf16Str(Inner::Le(bytes))
    }

    /// A string to encode as UTF-16LE.
    pub const fn new(s: &'a str) -> Self {
        Utf16Str(Inner::Str(s))
    }

    /// Length in bytes on the wire.
    pub fn byte_len(&self) -> usize {
        match self.0 {
            Inner::Le(b) => b.len(),
            Inner::Str(s) => s.encode_utf16().count() * 2,
        }
    }

    /// True for a zero-length string.
    pub fn is_empty(&self) -> bool {
        self.byte_len() == 0
    }

    /// The wire bytes, in order.
    pub fn bytes(&self) -> impl Iterator<Item = u8> + 'a {
        let (b, s): (&'a [u8], &'a str) = match self.0 {
            Inner::Le(b) => (b, ""),
            Inner::Str(s) => (&[], s),
        };
        b.iter()
            .copied()
            .chain(s.encode_utf16().flat_map(|u| u.to_le_bytes()))
    }

    /// The UTF-16 code units (a trailing odd byte is not one).
    pub fn code_units(&self) -> impl Iterator<Item = u16> + 'a {
        let (b, s): (&'a [u8], &'a str) = match self.0 {
            Inner::Le(b) => (b, ""),
            Inner::Str(s) => (&[], s),
        };
        b.chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .chain(s.encode_utf16())
    }

    /// Strict decoding: fails (`Malformed`, which a server answers with
    /// STATUS_INVALID_PARAMETER) on an odd byte length or an unpaired
    /// surrogate.
    pub fn decode(&self) -> Result<String, Smb2Error> {
        if self.byte_len() % 2 != 0 {
            return Err(Smb2Error::Malformed {
                what: "UTF-16LE string",
                field: "length (odd number of bytes)",
            });
        }
        char::decode_utf16(self.code_units())
            .collect::<Result<String, _>>()
            .map_err(|_| Smb2Error::Malformed {
                what: "UTF-16LE string",
                field: "code units (unpaired surrogate)",
            })
    }

    /// Lossy decoding (U+FFFD for anything invalid), for logs.
    pub fn to_string_lossy(&self) -> String {
        let mut s: String = char::decode_utf16(self.code_units())
            .map(|r| r.unwrap_or(char::REPLACEMENT_CHARACTER))
            .collect();
        if self.byte_len() % 2 != 0 {
            s.push(char::REPLACEMENT_CHARACTER);
        }
        s
    }

    /// Writes the wire bytes to the start of `dst` (which holds at least
    /// [`byte_len`](Self::byte_len) bytes; extra bytes are left alone).
    pub(crate) fn write_to(&self, dst: &mut [u8]) {
        for (d, b) in dst.iter_mut().zip(self.bytes()) {
            *d = b;
        }
    }
}

impl PartialEq for Utf16Str<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.bytes().eq(other.bytes())
    }
}

impl Eq for Utf16Str<'_> {}

impl core::fmt::Debug for Utf16Str<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:?}", self.to_string_lossy())
    }
}

impl Default for Utf16Str<'_> {
    fn default() -> Self {
        Utf16Str::EMPTY
    }
}

impl<'a> From<&'a str> for Utf16Str<'a> {
    fn from(s: &'a str) -> Self {
        Utf16Str::new(s)
    }
}
