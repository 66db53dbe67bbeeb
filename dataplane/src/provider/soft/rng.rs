//! Randomness for keys: per-process identity, and the xorshift generators
//! that make every rkey/lkey unpredictable from the earlier ones.

use std::sync::OnceLock;

/// 64 bits from the kernel (`getrandom(2)`). Setup paths only (a syscall).
pub(crate) fn os_random_u64() -> u64 {
    let mut buf = [0u8; 8];
    let mut filled = 0;
    while filled < buf.len() {
        // SAFETY: the pointer and length describe the unfilled tail of `buf`,
        // which is valid for writes; getrandom writes at most that many bytes.
        let r =
            unsafe { libc::getrandom(buf[filled..].as_mut_ptr().cast(), buf.len() - filled, 0) };
        if r > 0 {
            filled += r as usize;
        } else if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            // No getrandom (ancient kernel, seccomp): fall back to time and
            // addresses, which still differ per process and per call.
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            let local = 0u8;
            return splitmix(t ^ (std::process::id() as u64) << 32 ^ (&local as *const u8 as u64));
        }
    }
    u64::from_ne_bytes(buf)
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Random identity of this process (not its pid: pids repeat, and differ
/// between pid namespaces). Two endpoints with the same nonce share an
/// address space, so peer addresses are used as they are.
pub(crate) fn process_nonce() -> u64 {
    static NONCE: OnceLock<u64> = OnceLock::new();
    *NONCE.get_or_init(|| os_random_u64() | 1)
}

/// xorshift64* seeded from the kernel: a few cycles per key, no syscall.
/// Not cryptographic; what it guarantees is that a key cannot be derived from
/// the previous one by the arithmetic a buggy peer might do (rxe's rkeys
/// randomise only their low 8 bits).
#[derive(Debug, Clone)]
pub(crate) struct XorShift(u64);

impl XorShift {
    /// A generator with a fresh kernel seed.
    pub(crate) fn from_os() -> Self {
        // The state must not be zero (zero is a fixed point).
        XorShift(splitmix(os_random_u64()) | 1)
    }

    /// A generator that repeats its sequence for the same seed (tests).
    #[cfg(test)]
    pub(crate) fn seeded(seed: u64) -> Self {
        XorShift(splitmix(seed) | 1)
    }

    /// Next 64 random bits.
    #[inline]
    pub(crate) fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generators_are_seeded_differently() {
        let mut a = XorShift::from_os();
        let mut b = XorShift::from_os();
        let xs: Vec<u64> = (0..4).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..4).map(|_| b.next_u64()).collect();
        assert_ne!(xs, ys);
        assert_eq!(process_nonce(), process_nonce());
    }
}
