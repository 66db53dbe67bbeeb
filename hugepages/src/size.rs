//! Byte sizes as operators write them: `--pool-mem 512M`, `HUGEMEM=2048`.

use std::fmt;

/// Why [`parse_size`] rejected its input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseSizeError {
    /// The input was empty (or only whitespace).
    Empty,
    /// The input did not start with a decimal number, or had trailing garbage.
    Malformed(String),
    /// The suffix is not one of `K`, `M`, `G`, `T` (optionally followed by `B` or `iB`).
    UnknownSuffix(String),
    /// The value does not fit in a `usize`.
    Overflow(String),
}

impl fmt::Display for ParseSizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => f.write_str("empty size (expected e.g. 512M, 1G, 4096K or plain bytes)"),
            Self::Malformed(s) => write!(
                f,
                "malformed size {s:?} (expected a whole number with an optional K/M/G/T suffix, e.g. 512M)"
            ),
            Self::UnknownSuffix(s) => write!(
                f,
                "unknown size suffix in {s:?} (accepted: K, M, G, T, optionally followed by B or iB; powers of 1024)"
            ),
            Self::Overflow(s) => write!(f, "size {s:?} does not fit in this machine's address space"),
        }
    }
}

impl std::error::Error for ParseSizeError {}

/// Parses a byte size: `4096`, `4096K`, `512M`, `1G`, `2T`.
///
/// Suffixes are binary (powers of 1024) and case-insensitive; `B`, `iB` after the
/// suffix are accepted (`512MiB`, `512MB` and `512m` all mean 512 * 2^20), as is a
/// bare `B` (`4096B`). Surrounding whitespace is ignored; fractions are not accepted.
pub fn parse_size(input: &str) -> Result<usize, ParseSizeError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(ParseSizeError::Empty);
    }
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    if digits_end == 0 {
        return Err(ParseSizeError::Malformed(input.to_owned()));
    }
    let (number, suffix) = s.split_at(digits_end);
    let value: u128 = number
        .parse()
        .map_err(|_| ParseSizeError::Overflow(input.to_owned()))?;
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ if suffix.starts_with(|c: char| c.is_ascii_alphabetic()) => {
            return Err(ParseSizeError::UnknownSuffix(input.to_owned()))
        }
        _ => return Err(ParseSizeError::Malformed(input.to_owned())),
    };
    value
        .checked_mul(1u128 << shift)
        .and_then(|v| usize::try_from(v).ok())
        .ok_or_else(|| ParseSizeError::Overflow(input.to_owned()))
}

/// Formats a byte count for humans, exact when possible: `512 MiB`, `1364 B`, `1.5 GiB`.
pub fn format_size(bytes: usize) -> String {
    const UNITS: [(&str, u32); 4] = [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)];
    for (unit, shift) in UNITS {
        let one = 1usize << shift;
        if bytes >= one {
            return if bytes % one == 0 {
                format!("{} {unit}", bytes >> shift)
            } else {
                format!("{:.1} {unit}", bytes as f64 / one as f64)
            };
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_size_accepts_suffixes_and_plain_bytes() {
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("4096K"), Ok(4096 << 10));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size(" 2g "), Ok(2 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("512mb"), Ok(512 << 20));
        assert_eq!(parse_size("100B"), Ok(100));
        assert_eq!(parse_size("0"), Ok(0));
    }

    #[test]
    fn parse_size_rejects_garbage_with_a_reason() {
        assert_eq!(parse_size(""), Err(ParseSizeError::Empty));
        assert!(matches!(parse_size("M"), Err(ParseSizeError::Malformed(_))));
        assert!(matches!(
            parse_size("1.5G"),
            Err(ParseSizeError::Malformed(_))
        ));
        assert!(matches!(
            parse_size("-1"),
            Err(ParseSizeError::Malformed(_))
        ));
        assert!(matches!(
            parse_size("12X"),
            Err(ParseSizeError::UnknownSuffix(_))
        ));
        assert!(matches!(
            parse_size("12 M"),
            Err(ParseSizeError::Malformed(_))
        ));
        assert!(matches!(
            parse_size("99999999999999999999999T"),
            Err(ParseSizeError::Overflow(_))
        ));
    }

    #[test]
    fn format_size_is_exact_for_round_values() {
        assert_eq!(format_size(512 << 20), "512 MiB");
        assert_eq!(format_size(1364), "1.3 KiB");
        assert_eq!(format_size(100), "100 B");
        assert_eq!(format_size(3 << 29), "1.5 GiB");
    }
}
