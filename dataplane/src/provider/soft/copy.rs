//! The soft provider's "DMA" into the peer's memory: a Send's gather into
//! the receive buffer the peer posted, an RDMA Write's gather into the
//! granted region. The posting core is the NIC, and the lines it writes
//! were last touched by the peer's core (which read its previous message
//! there, or wrote its own data), so every destination line moves between
//! cores.
//!
//! How the copy writes those lines matters more than its instruction
//! count. Measured on the project's host with `memmove` per SGE (the C
//! library's AVX copy), p50 round trips of `bench --workload raw-send`
//! (one Send each way, nothing read): 512 B 0.67-0.79 µs, but 536 B
//! 0.87-1.03 µs and 1024 B 0.87-1.05 µs, while 576 B took 0.68-0.85 µs:
//! lengths that are not whole lines cost a fifth more than a longer one
//! that is. An SMB Direct message is never whole lines: its 24-byte
//! header ([MS-SMBD] 2.2.3) comes before the payload, in another buffer
//! when the payload is gathered.
//!
//! So [`gather`] writes the destination a line at a time: a line that
//! straddles two SGEs (the header in a send buffer and its payload in the
//! message's buffer) is assembled on the stack and stored whole, whole
//! lines are copied as lines, and only a message's first and last lines,
//! where it starts or ends mid-line, are stored in part. Only the
//! message's bytes are written, as a device writes them. With it, in the
//! same alternated runs: 536 B 0.75-0.76 µs, 1024 B 0.78-0.79 µs, 512 B
//! unchanged; the SMB Direct `send` round trip of 512 B (536 on the wire)
//! 1.06-1.13 µs against 1.15-1.20, 1024 B 1.13-1.22 against 1.25-1.29.
//! Handing the whole lines to `memcpy` instead (aligned destination, a
//! multiple of the line) kept most of the cost: the line loop is what
//! gains, up to [`LOOP_MAX`].
//!
//! Then the message's first line, the one the peer reads first (its
//! header), is demoted ([`demote`]) to the shared cache, as a NIC's DMA
//! lands in the last-level cache. `send` 512 B p50, 6 alternated pairs:
//! 0.95-1.11 µs against 1.08-1.21 without it; `raw-send`, whose client
//! reads nothing it receives, unchanged (0.65-0.68 against 0.63-0.69).
//! Demoting every line of the message gained about half as much: the
//! peer reads the header first, and the rest only when it needs it.

use crate::provider::Sge;
use std::ptr;

/// The cache line the copy is shaped around (x86-64 and most AArch64).
const LINE: usize = 64;

/// Copies the bytes of `sges`, in order, to `dst`.
///
/// # Safety
/// Every SGE must be readable memory of this process and `dst` writable for
/// their total length. Overlap is allowed (it is a caller bug, not UB): the
/// copy then falls back to `memmove` per SGE.
#[inline]
pub(super) unsafe fn gather(sges: &[Sge], dst: *mut u8) {
    let total: usize = sges.iter().map(|s| s.len as usize).sum();
    let d = dst as usize;
    let overlap = sges.iter().any(|s| {
        let a = s.addr as usize;
        a < d.wrapping_add(total) && d < a.wrapping_add(s.len as usize)
    });
    if total < LINE || overlap {
        let mut off = 0usize;
        for s in sges {
            // SAFETY: per the function contract.
            unsafe { ptr::copy(s.addr as *const u8, dst.add(off), s.len as usize) };
            off += s.len as usize;
        }
    } else {
        let mut w = LineWriter::new(dst);
        for s in sges {
            // SAFETY: per the function contract (and no overlap, checked).
            unsafe { w.push(s.addr as *const u8, s.len as usize) };
        }
        // SAFETY: as above.
        unsafe { w.finish() };
    }
    if total > 0 {
        // The line the peer reads first (an SMB Direct or SMB2 header).
        demote(dst);
    }
}

/// Hints that the line at `p`, just written, go from this core's private
/// caches to the shared one (x86 `CLDEMOTE`), where the peer's core, which
/// reads it next, finds it sooner than in ours. A hint: it changes no
/// memory, and processors without it execute it as a NOP (its encoding is
/// in the reserved-NOP space); a no-op on other architectures.
#[inline]
fn demote(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: CLDEMOTE reads and writes no memory and no register; an
    // address that is not mapped is ignored like any hint's.
    unsafe {
        core::arch::asm!("cldemote [{0}]", in(reg) p, options(nostack, preserves_flags, readonly));
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Copies `n` bytes (a multiple of [`LINE`]) to a line-aligned `dst`.
///
/// # Safety
/// `src` readable and `dst` writable for `n` bytes, the two disjoint.
#[inline]
unsafe fn copy_lines(src: *const u8, dst: *mut u8, n: usize) {
    if n > LOOP_MAX {
        // SAFETY: per the contract.
        unsafe { ptr::copy_nonoverlapping(src, dst, n) };
        return;
    }
    let mut k = 0;
    while k < n {
        // SAFETY: `k + LINE <= n` (`n` is a multiple of LINE).
        unsafe { ptr::copy_nonoverlapping(src.add(k), dst.add(k), LINE) };
        k += LINE;
    }
}

/// Above this many bytes of whole lines the C library's `memcpy` copies
/// them (its large-copy strategies win there; at 4 KiB the two measured
/// the same: READ and WRITE 4 KiB at QD 1 and 32 moved within the host's
/// spread either way).
const LOOP_MAX: usize = 2048;

/// Writes a byte stream to consecutive destination addresses, whole lines
/// at a time (see the module documentation).
struct LineWriter {
    /// Where the next byte of the stream goes.
    pos: usize,
    /// The bytes of the line containing `pos` (when `pos` is not at a line
    /// start): `stage[lo..pos % LINE]` are staged, not yet written.
    stage: Stage,
    /// The first staged byte's offset in its line: above 0 only for the
    /// destination's first line, when it starts mid-line.
    lo: usize,
}

#[repr(align(64))]
struct Stage([u8; LINE]);

impl LineWriter {
    fn new(dst: *mut u8) -> Self {
        let pos = dst as usize;
        LineWriter {
            pos,
            stage: Stage([0; LINE]),
            lo: pos % LINE,
        }
    }

    /// Appends `n` bytes at `src` to the stream.
    ///
    /// # Safety
    /// `src..src + n` readable, the destination from `pos` on writable for
    /// them, the two disjoint.
    #[inline]
    unsafe fn push(&mut self, mut src: *const u8, mut n: usize) {
        let at = self.pos % LINE;
        if at != 0 {
            // Finish the staged line first.
            let k = (LINE - at).min(n);
            // SAFETY: `at + k <= LINE`; `src` readable for `k <= n` bytes.
            unsafe { ptr::copy_nonoverlapping(src, self.stage.0.as_mut_ptr().add(at), k) };
            self.pos += k;
            // SAFETY: as above.
            src = unsafe { src.add(k) };
            n -= k;
            if self.pos % LINE != 0 {
                return;
            }
            // SAFETY: the line's staged bytes are destination bytes of this
            // stream (from `lo`), writable per the contract.
            unsafe { self.flush_line(self.pos - LINE) };
        }
        let whole = n & !(LINE - 1);
        if whole > 0 {
            // The destination is at a line start: aligned stores only.
            // SAFETY: per the contract.
            unsafe { copy_lines(src, self.pos as *mut u8, whole) };
            self.pos += whole;
            // SAFETY: within the source.
            src = unsafe { src.add(whole) };
            n -= whole;
        }
        if n > 0 {
            // SAFETY: `n < LINE`.
            unsafe { ptr::copy_nonoverlapping(src, self.stage.0.as_mut_ptr(), n) };
            self.pos += n;
        }
    }

    /// Writes the staged bytes `lo..LINE` of the line at `base`, then
    /// stages from the line start.
    ///
    /// # Safety
    /// `base + lo..base + LINE` writable.
    #[inline]
    unsafe fn flush_line(&mut self, base: usize) {
        let lo = self.lo;
        // SAFETY: per the contract; `lo < LINE`.
        unsafe {
            // The common case as a copy of constant length: the compiler
            // emits the line's stores straight, where the general branch
            // below would call `memcpy` (the copy this module avoids).
            if lo == 0 {
                ptr::copy_nonoverlapping(self.stage.0.as_ptr(), base as *mut u8, LINE);
            } else {
                ptr::copy_nonoverlapping(
                    self.stage.0.as_ptr().add(lo),
                    (base + lo) as *mut u8,
                    LINE - lo,
                );
            }
        }
        self.lo = 0;
    }

    /// Writes what is still staged (the stream's last, partial line).
    ///
    /// # Safety
    /// The staged bytes' destination writable.
    #[inline]
    unsafe fn finish(&mut self) {
        let at = self.pos % LINE;
        if at > self.lo {
            let base = self.pos - at;
            // SAFETY: per the contract; `lo < at <= LINE`.
            unsafe {
                ptr::copy_nonoverlapping(
                    self.stage.0.as_ptr().add(self.lo),
                    (base + self.lo) as *mut u8,
                    at - self.lo,
                )
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::soft::rng::XorShift as Rng;

    fn sge(b: &[u8]) -> Sge {
        Sge {
            addr: b.as_ptr() as u64,
            len: b.len() as u32,
            lkey: 0,
        }
    }

    /// Gathers `parts` to offset `at` of a guarded buffer and checks every
    /// byte: the message where it belongs, nothing written around it.
    fn check(parts: &[Vec<u8>], at: usize) {
        let total: usize = parts.iter().map(Vec::len).sum();
        // A line of guard bytes before the destination: a store of a whole
        // line where only its tail was the message's lands in it.
        let at = LINE + at;
        let mut buf = vec![0xEEu8; at + total + 2 * LINE];
        let sges: Vec<Sge> = parts.iter().map(|p| sge(p)).collect();
        // SAFETY: the parts are live, readable and disjoint from `buf`,
        // which has room for all of them at `at`.
        unsafe { gather(&sges, buf.as_mut_ptr().add(at)) };
        let want: Vec<u8> = parts.concat();
        assert_eq!(
            &buf[at..at + total],
            &want[..],
            "at {at}, parts {:?}",
            parts.iter().map(Vec::len).collect::<Vec<_>>()
        );
        assert!(
            buf[..at].iter().all(|&b| b == 0xEE),
            "wrote before the destination (at {at})"
        );
        assert!(
            buf[at + total..].iter().all(|&b| b == 0xEE),
            "wrote past the message (at {at}, {total} B)"
        );
    }

    fn bytes(rng: &mut Rng, n: usize) -> Vec<u8> {
        (0..n).map(|_| rng.next_u64() as u8).collect()
    }

    #[test]
    fn gather_puts_every_byte_in_place_and_nothing_around_it() {
        let mut rng = Rng::seeded(0x5eed_c0b1);
        // Every destination offset within a line (the buffer's own
        // alignment varies too), the lengths around line multiples, one to
        // four SGEs split at random.
        for at in 0..(2 * LINE) {
            for total in [
                0, 1, 23, 24, 63, 64, 65, 127, 128, 200, 512, 536, 1000, 4096, 4097,
            ] {
                let nparts = 1 + (rng.next_u64() % 4) as usize;
                let mut cuts: Vec<usize> = (1..nparts)
                    .map(|_| (rng.next_u64() as usize) % (total + 1))
                    .collect();
                cuts.sort_unstable();
                let mut parts = Vec::new();
                let mut prev = 0;
                for c in cuts.into_iter().chain([total]) {
                    parts.push(bytes(&mut rng, c - prev));
                    prev = c;
                }
                check(&parts, at);
            }
        }
    }

    #[test]
    fn an_smb_direct_header_and_its_payload_land_as_one_message() {
        let mut rng = Rng::seeded(7);
        let header = bytes(&mut rng, 24);
        for len in [1, 40, 41, 488, 512, 1340] {
            check(&[header.clone(), bytes(&mut rng, len)], 0);
        }
    }

    #[test]
    fn overlapping_source_and_destination_still_copy_like_memmove() {
        let mut buf: Vec<u8> = (0..=255u8).cycle().take(1024).collect();
        let want: Vec<u8> = buf[..600].to_vec();
        let s = Sge {
            addr: buf.as_ptr() as u64,
            len: 600,
            lkey: 0,
        };
        // SAFETY: both ranges are inside `buf`; overlap is the case tested.
        unsafe { gather(&[s], buf.as_mut_ptr().add(100)) };
        assert_eq!(&buf[100..700], &want[..]);
    }
}
