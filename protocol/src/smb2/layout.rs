//! Where variable-length buffers may lie, checked once for every structure
//! (see the receive and emit rules in the module documentation).

use core::ops::Range;

use super::error::Smb2Error;
use super::header::HEADER_LEN;

/// A variable-length buffer named by an offset/length pair.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Region {
    /// The offset field's name, for errors.
    pub field: &'static str,
    /// Offset as received.
    pub offset: u64,
    /// Length as received.
    pub length: u64,
}

impl Region {
    pub(crate) const fn new(field: &'static str, offset: u64, length: u64) -> Region {
        Region {
            field,
            offset,
            length,
        }
    }
}

/// Checks the first two bytes (StructureSize) and that the fixed part is
/// present: `StructureSize & !1` bytes (an odd StructureSize counts one byte
/// of Buffer that may be absent).
pub(crate) fn check_fixed(
    what: &'static str,
    body: &[u8],
    structure_size: u16,
) -> Result<(), Smb2Error> {
    let fixed = usize::from(structure_size & !1);
    let Some(ss) = body.get(0..2) else {
        return Err(Smb2Error::Truncated {
            what,
            need: fixed,
            have: body.len(),
        });
    };
    let found = u16::from_le_bytes([ss[0], ss[1]]);
    if found != structure_size {
        return Err(Smb2Error::StructureSize {
            what,
            expected: structure_size,
            found,
        });
    }
    if body.len() < fixed {
        return Err(Smb2Error::Truncated {
            what,
            need: fixed,
            have: body.len(),
        });
    }
    Ok(())
}

/// Resolves a region whose offset counts from `base` inside a structure of
/// `len` bytes: `Ok(None)` for length 0 (offset ignored), else the byte
/// range, which must start at or after `min` and end by `len`.
pub(crate) fn resolve_in(
    what: &'static str,
    base: u64,
    len: usize,
    min: usize,
    r: Region,
) -> Result<Option<Range<usize>>, Smb2Error> {
    if r.length == 0 {
        return Ok(None);
    }
    let lo = base + min as u64;
    let hi = base + len as u64;
    match r.offset.checked_add(r.length) {
        Some(end) if r.offset >= lo && end <= hi => {
            // Both fit in `len` (a usize), so the casts are exact.
            Ok(Some((r.offset - base) as usize..(end - base) as usize))
        }
        _ => Err(Smb2Error::OutOfBounds {
            what,
            field: r.field,
            offset: r.offset,
            length: r.length,
            min: lo,
            limit: hi,
        }),
    }
}

/// Resolves a header-relative region of a body of `body.len()` bytes whose
/// fixed part is `fixed_len` bytes.
pub(crate) fn resolve(
    what: &'static str,
    body_len: usize,
    fixed_len: usize,
    r: Region,
) -> Result<Option<Range<usize>>, Smb2Error> {
    resolve_in(what, HEADER_LEN as u64, body_len, fixed_len, r)
}

/// Fails with `Overlap` when two non-empty ranges share a byte.
pub(crate) fn check_disjoint(
    what: &'static str,
    a: (&'static str, &Option<Range<usize>>),
    b: (&'static str, &Option<Range<usize>>),
) -> Result<(), Smb2Error> {
    if let (Some(x), Some(y)) = (a.1, b.1) {
        if x.start < y.end && y.start < x.end {
            return Err(Smb2Error::Overlap {
                what,
                first: a.0,
                second: b.0,
            });
        }
    }
    Ok(())
}

/// Resolves every region of a body and checks that no two overlap.
pub(crate) fn resolve_all<const N: usize>(
    what: &'static str,
    body_len: usize,
    fixed_len: usize,
    regions: [Region; N],
) -> Result<[Option<Range<usize>>; N], Smb2Error> {
    let mut out: [Option<Range<usize>>; N] = [(); N].map(|_| None);
    for (slot, r) in out.iter_mut().zip(regions.iter()) {
        *slot = resolve(what, body_len, fixed_len, *r)?;
    }
    for i in 0..N {
        for j in i + 1..N {
            check_disjoint(
                what,
                (regions[i].field, &out[i]),
                (regions[j].field, &out[j]),
            )?;
        }
    }
    Ok(out)
}

/// The bytes of a header-relative region, or empty when the region is empty
/// or does not resolve (which `new_checked` rules out).
pub(crate) fn slice(body: &[u8], fixed_len: usize, r: Region) -> &[u8] {
    match resolve("", body.len(), fixed_len, r) {
        Ok(Some(range)) => body.get(range).unwrap_or(&[]),
        _ => &[],
    }
}

/// `n` rounded up to a multiple of 8.
pub(crate) const fn align8(n: usize) -> usize {
    n.saturating_add(7) & !7
}

/// Fails with `BufferTooSmall` unless `buf` holds `need` bytes.
pub(crate) fn room(what: &'static str, buf: &[u8], need: usize) -> Result<(), Smb2Error> {
    if buf.len() < need {
        Err(Smb2Error::BufferTooSmall {
            what,
            need,
            have: buf.len(),
        })
    } else {
        Ok(())
    }
}

/// `v` as a wire integer of type `I`, or `TooLarge`.
pub(crate) fn fit<I: TryFrom<usize> + Bounded>(
    what: &'static str,
    field: &'static str,
    v: usize,
) -> Result<I, Smb2Error> {
    I::try_from(v).map_err(|_| Smb2Error::TooLarge {
        what,
        field,
        value: v as u64,
        max: I::MAX_U64,
    })
}

/// The largest value of a wire integer type.
pub(crate) trait Bounded {
    const MAX_U64: u64;
}
impl Bounded for u8 {
    const MAX_U64: u64 = u8::MAX as u64;
}
impl Bounded for u16 {
    const MAX_U64: u64 = u16::MAX as u64;
}
impl Bounded for u32 {
    const MAX_U64: u64 = u32::MAX as u64;
}

/// Header-relative offset of a body position.
pub(crate) const fn hdr(body_pos: usize) -> usize {
    HEADER_LEN + body_pos
}

/// Copies `src` to `buf[at..]` (the caller checked the room).
pub(crate) fn put(buf: &mut [u8], at: usize, src: &[u8]) {
    if let Some(dst) = buf.get_mut(at..at + src.len()) {
        dst.copy_from_slice(src);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: &str = "test";

    #[test]
    fn empty_region_ignores_its_offset() {
        assert_eq!(resolve(W, 10, 8, Region::new("X", u64::MAX, 0)), Ok(None));
    }

    #[test]
    fn region_must_start_after_the_fixed_part_and_end_in_the_body() {
        // Body of 40 bytes, fixed part 24: header offsets 88..104 are usable.
        assert_eq!(
            resolve(W, 40, 24, Region::new("X", 88, 16)),
            Ok(Some(24..40))
        );
        assert!(matches!(
            resolve(W, 40, 24, Region::new("X", 87, 1)),
            Err(Smb2Error::OutOfBounds {
                min: 88,
                limit: 104,
                ..
            })
        ));
        assert!(resolve(W, 40, 24, Region::new("X", 88, 17)).is_err());
        assert!(resolve(W, 40, 24, Region::new("X", u64::MAX, 2)).is_err());
    }

    #[test]
    fn regions_that_share_a_byte_overlap_and_adjacent_ones_do_not() {
        let a = Region::new("A", 88, 8);
        assert!(resolve_all(W, 40, 24, [a, Region::new("B", 96, 8)]).is_ok());
        assert_eq!(
            resolve_all(W, 40, 24, [a, Region::new("B", 95, 8)]),
            Err(Smb2Error::Overlap {
                what: W,
                first: "A",
                second: "B"
            })
        );
    }

    #[test]
    fn fixed_part_check_orders_structure_size_before_length() {
        assert!(matches!(
            check_fixed(W, &[9], 9),
            Err(Smb2Error::Truncated { need: 8, .. })
        ));
        assert!(matches!(
            check_fixed(W, &[8, 0], 9),
            Err(Smb2Error::StructureSize {
                expected: 9,
                found: 8,
                ..
            })
        ));
        assert!(matches!(
            check_fixed(W, &[9, 0, 0], 9),
            Err(Smb2Error::Truncated {
                need: 8,
                have: 3,
                ..
            })
        ));
        assert_eq!(check_fixed(W, &[9, 0, 0, 0, 0, 0, 0, 0], 9), Ok(()));
    }

    #[test]
    fn helpers_round_and_fit() {
        assert_eq!(align8(0), 0);
        assert_eq!(align8(1), 8);
        assert_eq!(align8(8), 8);
        assert_eq!(align8(usize::MAX), usize::MAX & !7);
        assert_eq!(fit::<u16>(W, "F", 65535), Ok(65535));
        assert_eq!(
            fit::<u16>(W, "F", 65536),
            Err(Smb2Error::TooLarge {
                what: W,
                field: "F",
                value: 65536,
                max: 65535
            })
        );
        assert!(matches!(
            room(W, &[0; 3], 4),
            Err(Smb2Error::BufferTooSmall {
                need: 4,
                have: 3,
                ..
            })
        ));
        assert_eq!(slice(&[1, 2, 3, 4], 2, Region::new("X", 66, 2)), &[3, 4]);
        assert_eq!(
            slice(&[1, 2, 3, 4], 2, Region::new("X", 65, 2)),
            &[] as &[u8]
        );
    }
}
