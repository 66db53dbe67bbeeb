//! GUIDs as [MS-SQOS] carries them: 16 bytes in the Windows (mixed-endian)
//! layout of [MS-DTYP] 2.3.4.2 — Data1 (u32), Data2 (u16) and Data3 (u16)
//! little-endian, then Data4 as 8 bytes in order.

use core::fmt;
use core::str::FromStr;

/// A GUID in its 16-byte wire form. The textual form is the Windows one,
/// `{b13a32e4-e2ad-5db2-a4f8-5cd3be9d696e}` for the wire bytes
/// `E4 32 3A B1 AD E2 B2 5D A4 F8 5C D3 BE 9D 69 6E` ([MS-SQOS] 4.2).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Guid([u8; 16]);

impl Guid {
    /// The NULL GUID (all zeros; [MS-SQOS] 1.1), also called the empty GUID.
    pub const NULL: Guid = Guid([0; 16]);

    /// From the 16 wire bytes.
    pub const fn from_bytes(bytes: [u8; 16]) -> Guid {
        Guid(bytes)
    }

    /// From the four [MS-DTYP] fields: `Guid::from_fields(0xb13a32e4, 0xe2ad,
    /// 0x5db2, [0xa4, 0xf8, 0x5c, 0xd3, 0xbe, 0x9d, 0x69, 0x6e])`.
    pub const fn from_fields(data1: u32, data2: u16, data3: u16, data4: [u8; 8]) -> Guid {
        let a = data1.to_le_bytes();
        let b = data2.to_le_bytes();
        let c = data3.to_le_bytes();
        Guid([
            a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], data4[0], data4[1], data4[2], data4[3],
            data4[4], data4[5], data4[6], data4[7],
        ])
    }

    /// The 16 wire bytes.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// True for the NULL (empty) GUID.
    pub const fn is_null(&self) -> bool {
        u128::from_ne_bytes(self.0) == 0
    }

    /// The four [MS-DTYP] fields.
    pub const fn to_fields(&self) -> (u32, u16, u16, [u8; 8]) {
        let b = &self.0;
        (
            u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            u16::from_le_bytes([b[4], b[5]]),
            u16::from_le_bytes([b[6], b[7]]),
            [b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]],
        )
    }
}

impl fmt::Display for Guid {
    /// `{xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx}`, lower-case hex; with the
    /// alternate flag (`{:#}`) the braces are left out.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (d1, d2, d3, d4) = self.to_fields();
        let (open, close) = if f.alternate() { ("", "") } else { ("{", "}") };
        write!(
            f,
            "{open}{d1:08x}-{d2:04x}-{d3:04x}-{:02x}{:02x}-{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}{close}",
            d4[0], d4[1], d4[2], d4[3], d4[4], d4[5], d4[6], d4[7]
        )
    }
}

impl fmt::Debug for Guid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Guid({self})")
    }
}

/// Why a string is not a GUID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuidParseError {
    /// Not 36 characters (or 38 with braces).
    Length(usize),
    /// A brace without its partner.
    Braces,
    /// A hyphen is missing at the given character position (0-based, without braces).
    Hyphen(usize),
    /// A non-hex character at the given position (0-based, without braces).
    NotHex(usize),
}

impl fmt::Display for GuidParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GuidParseError::Length(n) => write!(
                f,
                "GUID must be 36 characters (38 with braces), got {n}: expected xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
            ),
            GuidParseError::Braces => f.write_str("GUID has an unbalanced brace"),
            GuidParseError::Hyphen(i) => write!(f, "GUID needs a '-' at position {i}"),
            GuidParseError::NotHex(i) => write!(f, "GUID has a non-hex character at position {i}"),
        }
    }
}

impl std::error::Error for GuidParseError {}

impl FromStr for Guid {
    type Err = GuidParseError;

    /// Accepts `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, with or without
    /// surrounding braces, in either case.
    fn from_str(s: &str) -> Result<Guid, GuidParseError> {
        let inner = match (s.strip_prefix('{'), s.ends_with('}')) {
            (Some(rest), true) => rest.strip_suffix('}').unwrap_or(rest),
            (None, false) => s,
            _ => return Err(GuidParseError::Braces),
        };
        let b = inner.as_bytes();
        if b.len() != 36 {
            return Err(GuidParseError::Length(s.len()));
        }
        let mut digits = [0u8; 32];
        let mut n = 0;
        for (i, &c) in b.iter().enumerate() {
            if matches!(i, 8 | 13 | 18 | 23) {
                if c != b'-' {
                    return Err(GuidParseError::Hyphen(i));
                }
                continue;
            }
            let v = match c {
                b'0'..=b'9' => c - b'0',
                b'a'..=b'f' => c - b'a' + 10,
                b'A'..=b'F' => c - b'A' + 10,
                _ => return Err(GuidParseError::NotHex(i)),
            };
            if let Some(slot) = digits.get_mut(n) {
                *slot = v;
            }
            n += 1;
        }
        // `digits` now holds the 32 nibbles in textual order.
        let mut text = [0u8; 16];
        for (i, t) in text.iter_mut().enumerate() {
            *t = (digits[2 * i] << 4) | digits[2 * i + 1];
        }
        let data1 = u32::from_be_bytes([text[0], text[1], text[2], text[3]]);
        let data2 = u16::from_be_bytes([text[4], text[5]]);
        let data3 = u16::from_be_bytes([text[6], text[7]]);
        let mut data4 = [0u8; 8];
        data4.copy_from_slice(&text[8..16]);
        Ok(Guid::from_fields(data1, data2, data3, data4))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE_WIRE: [u8; 16] = [
        0xE4, 0x32, 0x3A, 0xB1, 0xAD, 0xE2, 0xB2, 0x5D, 0xA4, 0xF8, 0x5C, 0xD3, 0xBE, 0x9D, 0x69,
        0x6E,
    ];

    #[test]
    fn guid_text_is_windows_mixed_endian() {
        let g = Guid::from_bytes(EXAMPLE_WIRE);
        assert_eq!(g.to_string(), "{b13a32e4-e2ad-5db2-a4f8-5cd3be9d696e}");
        assert_eq!(format!("{g:#}"), "b13a32e4-e2ad-5db2-a4f8-5cd3be9d696e");
        assert_eq!(
            g,
            Guid::from_fields(
                0xb13a32e4,
                0xe2ad,
                0x5db2,
                [0xa4, 0xf8, 0x5c, 0xd3, 0xbe, 0x9d, 0x69, 0x6e]
            )
        );
    }

    #[test]
    fn guid_parses_with_or_without_braces_in_any_case() {
        let g = Guid::from_bytes(EXAMPLE_WIRE);
        assert_eq!(
            "b13a32e4-e2ad-5db2-a4f8-5cd3be9d696e".parse::<Guid>(),
            Ok(g)
        );
        assert_eq!(
            "{B13A32E4-E2AD-5DB2-A4F8-5CD3BE9D696E}".parse::<Guid>(),
            Ok(g)
        );
        assert_eq!(
            "04b4f24e-b3e9-4594-adaa-e327528de54b"
                .parse::<Guid>()
                .map(|g| *g.as_bytes()),
            Ok([
                0x4E, 0xF2, 0xB4, 0x04, 0xE9, 0xB3, 0x94, 0x45, 0xAD, 0xAA, 0xE3, 0x27, 0x52, 0x8D,
                0xE5, 0x4B
            ])
        );
    }

    #[test]
    fn guid_parse_rejects_malformed_text() {
        assert_eq!("".parse::<Guid>(), Err(GuidParseError::Length(0)));
        assert_eq!(
            "{b13a32e4-e2ad-5db2-a4f8-5cd3be9d696e".parse::<Guid>(),
            Err(GuidParseError::Braces)
        );
        assert_eq!(
            "b13a32e4xe2ad-5db2-a4f8-5cd3be9d696e".parse::<Guid>(),
            Err(GuidParseError::Hyphen(8))
        );
        assert_eq!(
            "g13a32e4-e2ad-5db2-a4f8-5cd3be9d696e".parse::<Guid>(),
            Err(GuidParseError::NotHex(0))
        );
        assert!("b13a32e4-e2ad-5db2-a4f8-5cd3be9d696é"
            .parse::<Guid>()
            .is_err());
    }

    #[test]
    fn null_guid_is_all_zeros() {
        assert!(Guid::NULL.is_null());
        assert!(!Guid::from_bytes(EXAMPLE_WIRE).is_null());
        assert_eq!(
            Guid::NULL.to_string(),
            "{00000000-0000-0000-0000-000000000000}"
        );
    }
}
