//! A fast hasher for the maps the I/O path looks up by integer id
//! (connection ids, queue-pair numbers, SMB2 FileId.Volatile, message
//! tokens). std's SipHash costs about a thousand instructions per 4 KiB
//! READ over the handful of lookups each one makes; these keys are chosen
//! by the server (a peer can name a key in a lookup but never choose the
//! keys inserted), so hash flooding resistance buys nothing here.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Multiply-and-fold hasher for small integer keys.
#[derive(Debug, Default, Clone, Copy)]
pub struct IdHasher(u64);

const K: u64 = 0x9E37_79B9_7F4A_7C15;

impl Hasher for IdHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(b));
        }
    }

    #[inline]
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(K);
    }

    #[inline]
    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }

    #[inline]
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        // Both ends of the word matter to hashbrown (bucket index from the
        // low bits, control byte from the top 7).
        self.0 ^ (self.0 >> 32)
    }
}

/// A map keyed by integer ids its owner chooses (server-chosen ids, or the
/// MessageIds an SMB2 client assigns).
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// An empty [`IdMap`] with room for `n` entries.
pub fn id_map<K, V>(n: usize) -> IdMap<K, V> {
    HashMap::with_capacity_and_hasher(n, BuildHasherDefault::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_ids_spread_over_buckets_and_control_bytes() {
        let mut low = std::collections::HashSet::new();
        let mut top = std::collections::HashSet::new();
        for i in 0..1024u64 {
            let mut h = IdHasher::default();
            h.write_u64(i);
            let v = h.finish();
            low.insert(v & 1023);
            top.insert(v >> 57);
        }
        assert!(low.len() > 600, "{} distinct buckets of 1024", low.len());
        assert_eq!(top.len(), 128, "every control byte value is used");
        let mut m: IdMap<u64, u64> = id_map(16);
        for i in 0..10_000 {
            m.insert(i * 4096, i);
        }
        assert!((0..10_000).all(|i| m[&(i * 4096)] == i));
    }
}
