//! `--verify`: every operation's payload is a pattern derived from its
//! sequence number (the first eight bytes carry the number itself, little
//! endian), so an echo is checked byte for byte against the pattern it
//! should hold, and one that carries another operation's bytes (reordered,
//! stale, from another connection) fails as surely as a corrupted one.
//!
//! The pattern never begins with the echo upper layer's `RDMAECHO` magic:
//! read as a little-endian number that is 0x4f48_4345_4d41_4452, and
//! sequence numbers stay below 2^56 ([`seq_base`]), so the echo server
//! always returns the payload verbatim.

/// The connection's share of the pattern: sequence numbers of different
/// connections differ in their top bits.
pub fn seq_base(connection: usize) -> u64 {
    (connection as u64) << 40
}

#[inline]
fn key(seq: u64) -> u8 {
    (seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8
}

#[inline]
fn tail_byte(key: u8, i: usize) -> u8 {
    (i as u8).wrapping_mul(31) ^ key ^ ((i >> 8) as u8)
}

/// Fills `buf` with operation `seq`'s pattern.
pub fn fill(buf: &mut [u8], seq: u64) {
    stamp(buf, seq);
    let k = key(seq);
    for (i, b) in buf.iter_mut().enumerate().skip(8) {
        *b = tail_byte(k, i);
    }
}

/// Writes operation `seq`'s number over the first eight bytes of `buf` (the
/// head of its pattern): what every `send` round trip sends, `--verify` or
/// not, so that each echo is matched to its operation ([`stamped`]).
#[inline]
pub fn stamp(buf: &mut [u8], seq: u64) {
    let head = buf.len().min(8);
    buf[..head].copy_from_slice(&seq.to_le_bytes()[..head]);
}

/// Whether `buf` begins with operation `seq`'s number ([`stamp`]): the
/// check every `send` echo gets, on the cache line its SMB Direct header
/// already brought in (the `raw-send` baseline reads nothing it receives
/// unless `--verify`: see its module documentation).
#[inline]
pub fn stamped(buf: &[u8], seq: u64) -> bool {
    let head = buf.len().min(8);
    buf[..head] == seq.to_le_bytes()[..head]
}

/// Whether `buf` holds operation `seq`'s pattern.
pub fn check(buf: &[u8], seq: u64) -> bool {
    if !stamped(buf, seq) {
        return false;
    }
    let k = key(seq);
    buf.iter()
        .enumerate()
        .skip(8)
        .all(|(i, &b)| b == tail_byte(k, i))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filled_patterns_check_and_differ_between_operations() {
        for len in [1usize, 7, 8, 9, 512, 70_000] {
            let mut a = vec![0u8; len];
            fill(&mut a, 41);
            assert!(check(&a, 41), "len {len}");
            assert!(!check(&a, 42), "len {len}");
            if len > 9 {
                a[len - 1] ^= 1;
                assert!(!check(&a, 41), "a flipped last byte, len {len}");
            }
        }
    }

    #[test]
    fn stamps_match_their_operation_only() {
        for len in [1usize, 7, 8, 9, 512] {
            let mut a = vec![0xa5u8; len];
            stamp(&mut a, seq_base(2) + 41);
            assert!(stamped(&a, seq_base(2) + 41), "len {len}");
            assert!(!stamped(&a, seq_base(2) + 42), "len {len}");
            assert!(!stamped(&a, seq_base(3) + 41) || len < 6, "len {len}");
            if len > 8 {
                assert_eq!(a[8], 0xa5, "only the head is written");
            }
        }
        // A stamped pattern is still the pattern.
        let mut b = vec![0u8; 100];
        fill(&mut b, 7);
        stamp(&mut b, 7);
        assert!(check(&b, 7));
    }

    #[test]
    fn patterns_never_start_with_the_rdma_echo_magic() {
        let mut b = [0u8; 16];
        for seq in [0, 1, 255, seq_base(3) + 7, (1 << 56) - 1] {
            fill(&mut b, seq);
            assert_ne!(&b[..8], smbdirect_dataplane::upper::RDMA_ECHO_MAGIC);
        }
    }
}
