//! InitiatorName / InitiatorNodeName ([MS-SQOS] 2.2.2.2): UTF-16LE strings,
//! not null-terminated, at most STORAGE_QOS_INITIATOR_NAME_SIZE bytes.

use super::STORAGE_QOS_INITIATOR_NAME_SIZE;
use crate::WireError;

/// A name as [MS-SQOS] 2.2.2.2 carries it. Either borrowed UTF-16LE bytes
/// (what [`StorageQosControlRequestRepr::parse`] yields, zero-copy) or a
/// borrowed `&str` (what a client builds requests from); both compare equal
/// when their UTF-16 code units are equal.
///
/// A `Utf16Name` is never longer than [`STORAGE_QOS_INITIATOR_NAME_SIZE`]
/// bytes on the wire: the constructors refuse longer names, so emitting one
/// can never overflow a 16-bit length or offset field.
///
/// [`StorageQosControlRequestRepr::parse`]: super::StorageQosControlRequestRepr::parse
#[derive(Clone, Copy)]
pub struct Utf16Name<'a>(Inner<'a>);

#[derive(Clone, Copy)]
enum Inner<'a> {
    Utf16Le(&'a [u8]),
    Str(&'a str),
}

impl<'a> Utf16Name<'a> {
    /// The empty name (length 0; its offset is not meaningful).
    pub const EMPTY: Utf16Name<'static> = Utf16Name(Inner::Utf16Le(&[]));

    /// A name from UTF-16LE bytes as found on the wire. An odd length is
    /// kept as is (the specification does not forbid it; see
    /// `docs/spec-notes.md`, "Names with an odd byte length"); the trailing
    /// byte is not a code unit and decodes as U+FFFD.
    pub fn from_utf16le(bytes: &'a [u8]) -> Result<Self, WireError> {
        if bytes.len() > STORAGE_QOS_INITIATOR_NAME_SIZE {
            return Err(WireError::Malformed {
                what: "SQoS initiator name",
                field: "length > 0x200",
            });
        }
        Ok(Utf16Name(Inner::Utf16Le(bytes)))
    }

    /// A name from a string, encoded as UTF-16LE when emitted. Fails when the
    /// encoding is longer than STORAGE_QOS_INITIATOR_NAME_SIZE (512 bytes,
    /// i.e. 256 UTF-16 code units).
    pub fn new(s: &'a str) -> Result<Self, WireError> {
        if s.encode_utf16().count() * 2 > STORAGE_QOS_INITIATOR_NAME_SIZE {
            return Err(WireError::Malformed {
                what: "SQoS initiator name",
                field: "length > 0x200",
            });
        }
        Ok(Utf16Name(Inner::Str(s)))
    }

    /// Length in bytes on the wire (the InitiatorNameLength value).
    pub fn byte_len(&self) -> usize {
        match self.0 {
            Inner::Utf16Le(b) => b.len(),
            Inner::Str(s) => s.encode_utf16().count() * 2,
        }
    }

    /// True for a zero-length name.
    pub fn is_empty(&self) -> bool {
        self.byte_len() == 0
    }

    /// The UTF-16 code units (a trailing odd byte is not one).
    pub fn code_units(&self) -> impl Iterator<Item = u16> + 'a {
        let (bytes, s): (&'a [u8], &'a str) = match self.0 {
            Inner::Utf16Le(b) => (b, ""),
            Inner::Str(s) => (&[], s),
        };
        bytes
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .chain(s.encode_utf16())
    }

    /// True when the wire form has an odd number of bytes.
    pub fn has_odd_length(&self) -> bool {
        self.byte_len() % 2 == 1
    }

    /// The name decoded lossily: unpaired surrogates and a trailing odd byte
    /// become U+FFFD.
    pub fn to_string_lossy(&self) -> String {
        if let Inner::Str(s) = self.0 {
            return s.to_owned();
        }
        let mut out: String = char::decode_utf16(self.code_units())
            .map(|r| r.unwrap_or(char::REPLACEMENT_CHARACTER))
            .collect();
        if self.has_odd_length() {
            out.push(char::REPLACEMENT_CHARACTER);
        }
        out
    }

    /// Writes the UTF-16LE form into `out` (which must be at least
    /// [`Self::byte_len`] bytes; extra bytes are left untouched, missing
    /// ones are not written).
    pub fn write_utf16le(&self, out: &mut [u8]) {
        match self.0 {
            Inner::Utf16Le(b) => {
                for (d, s) in out.iter_mut().zip(b) {
                    *d = *s;
                }
            }
            Inner::Str(s) => {
                for (d, u) in out.chunks_exact_mut(2).zip(s.encode_utf16()) {
                    d.copy_from_slice(&u.to_le_bytes());
                }
            }
        }
    }
}

impl Default for Utf16Name<'_> {
    fn default() -> Self {
        Utf16Name::EMPTY
    }
}

impl PartialEq for Utf16Name<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.has_odd_length() == other.has_odd_length()
            && self.byte_len() == other.byte_len()
            && self.code_units().eq(other.code_units())
            && match (self.0, other.0) {
                // A trailing odd byte is compared too.
                (Inner::Utf16Le(a), Inner::Utf16Le(b)) => a.last() == b.last(),
                _ => true,
            }
    }
}

impl Eq for Utf16Name<'_> {}

impl core::fmt::Debug for Utf16Name<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Utf16Name({:?})", self.to_string_lossy())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf16le_bytes_and_str_compare_by_code_units() {
        let wire = [
            0x54, 0, 0x45, 0, 0x53, 0, 0x54, 0, 0x2D, 0, 0x56, 0, 0x4D, 0,
        ];
        let a = Utf16Name::from_utf16le(&wire).unwrap();
        let b = Utf16Name::new("TEST-VM").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.byte_len(), 14);
        assert_eq!(a.to_string_lossy(), "TEST-VM");
        let mut out = [0u8; 14];
        b.write_utf16le(&mut out);
        assert_eq!(out, wire);
    }

    #[test]
    fn names_longer_than_initiator_name_size_are_refused() {
        let ok = "x".repeat(256);
        let too_long = "x".repeat(257);
        assert_eq!(Utf16Name::new(&ok).unwrap().byte_len(), 512);
        assert!(Utf16Name::new(&too_long).is_err());
        assert!(Utf16Name::from_utf16le(&[0u8; 513]).is_err());
    }

    #[test]
    fn lossy_decoding_replaces_unpaired_surrogates_and_odd_bytes() {
        let n = Utf16Name::from_utf16le(&[0x00, 0xD8, 0x41, 0x00, 0x42]).unwrap();
        assert!(n.has_odd_length());
        assert_eq!(n.to_string_lossy(), "\u{FFFD}A\u{FFFD}");
        assert_eq!(n.code_units().count(), 2);
    }
}
