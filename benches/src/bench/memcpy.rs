//! `--workload memcpy`: the same-run baseline of the bulk workloads. One
//! operation copies `--size` bytes between two buffers of the client
//! thread (page-aligned, touched before the run, as big as the source and
//! destination of a `read` / `write` of that size), so `read 1M / memcpy 1M`
//! says how far an SMB2 READ is from the copy any data path pays at least
//! once. With `--verify` each copy's source carries the operation's
//! pattern and the destination is checked.
//!
//! With `--file-size N` (`memcpy_span`) each copy goes between one `--size`
//! buffer and the next `--size` block of a region of `N` bytes, walked in
//! order and mapped as the memory store maps its data region
//! ([`memstore::map_region`]: 2 MiB hugepages when reserved, else ordinary
//! pages with the `MADV_HUGEPAGE` hint): from the block into the buffer
//! for `--read-pct` percent of the copies (as a READ's data moves, chosen
//! per operation as `mixed` chooses READs), from the buffer into the block
//! for the rest (as a WRITE's). That is the footprint of a `read` / `write`
//! of the same `--size` and `--file-size`, whose data moves between the
//! store's blocks of a file of `N` bytes and one client buffer: one side of
//! the copy too big for the core's caches, instead of both staying in them.
//! The region's blocks carry [`block_seed`] patterns (written once, before
//! the run); with `--verify` a copy out of a block is checked against the
//! block's pattern, and a copy into a block carries the operation's
//! pattern, checked in the block.

use super::error::BenchError;
use super::pattern;
use super::smb2::{block_seed, is_read};
use super::workload::{Fifo, Outcome, Session, Workload};
use memmap2::MmapMut;
use smbdirect_dataplane::smb2::memstore;

/// Copies of `size` bytes.
pub struct MemcpyWorkload {
    size: usize,
    span: Option<u64>,
    read_pct: u8,
    queue_depth: u32,
    verify: bool,
}

impl MemcpyWorkload {
    /// `size` bytes per operation between two buffers, or (`span`) between
    /// a buffer and blocks walking through `span` bytes, `read_pct` percent
    /// of them out of the blocks.
    pub fn new(
        size: usize,
        span: Option<u64>,
        read_pct: u8,
        queue_depth: u32,
        verify: bool,
    ) -> Self {
        MemcpyWorkload {
            size,
            span,
            read_pct,
            queue_depth,
            verify,
        }
    }
}

/// The other side of the copies.
enum Source {
    /// One buffer the copies read from, refilled with the operation's
    /// pattern under `--verify`.
    Hot(Box<[u8]>),
    /// `blocks` blocks of `size` in a store-like mapping, walked in order.
    Region {
        map: MmapMut,
        blocks: u64,
        next: u64,
        read_pct: u8,
    },
}

impl Workload for MemcpyWorkload {
    type Session = MemcpySession;

    fn name(&self) -> &'static str {
        "memcpy"
    }

    fn bytes_per_op(&self) -> u64 {
        self.size as u64
    }

    fn open(&self, _index: usize) -> Result<MemcpySession, BenchError> {
        let src = match self.span {
            None => {
                let mut src = vec![0u8; self.size].into_boxed_slice();
                pattern::fill(&mut src, u64::MAX >> 8);
                Source::Hot(src)
            }
            Some(span) => {
                let blocks = span / self.size as u64;
                let len = blocks as usize * self.size;
                let (mut map, _hugepages) = memstore::map_region(len, true)
                    .map_err(|e| BenchError::failed("memcpy: mapping the source region", e))?;
                for (k, block) in map.chunks_exact_mut(self.size).enumerate() {
                    pattern::fill(block, block_seed(k as u64));
                }
                Source::Region {
                    map,
                    blocks,
                    next: 0,
                    read_pct: self.read_pct,
                }
            }
        };
        Ok(MemcpySession {
            src,
            dst: vec![0xa5u8; self.size].into_boxed_slice(),
            done: Fifo::with_capacity(self.queue_depth as usize),
            verify: self.verify,
        })
    }
}

/// One thread's buffers.
pub struct MemcpySession {
    src: Source,
    dst: Box<[u8]>,
    /// Copies made (slot, and 1 if verified or not checked, else 0),
    /// reported by the next poll.
    done: Fifo,
    verify: bool,
}

impl Session for MemcpySession {
    fn start(&mut self, slot: u32, seq: u64) -> Result<(), BenchError> {
        let size = self.dst.len();
        let verify = self.verify;
        let ok = match &mut self.src {
            Source::Hot(src) => {
                if verify {
                    pattern::fill(src, seq);
                }
                self.dst.copy_from_slice(src);
                !verify || pattern::check(&self.dst, seq)
            }
            Source::Region {
                map,
                blocks,
                next,
                read_pct,
            } => {
                let k = *next % *blocks;
                *next += 1;
                let block = &mut map[k as usize * size..(k as usize + 1) * size];
                if is_read(seq, *read_pct) {
                    self.dst.copy_from_slice(block);
                    !verify || pattern::check(&self.dst, block_seed(k))
                } else {
                    if verify {
                        pattern::fill(&mut self.dst, seq);
                    }
                    block.copy_from_slice(&self.dst);
                    // The block now holds this operation's pattern; a later
                    // copy out of it expects its own seed again.
                    let ok = !verify || pattern::check(block, seq);
                    if verify {
                        pattern::fill(block, block_seed(k));
                    }
                    ok
                }
            }
        };
        // Keep the copy from being optimised away.
        std::hint::black_box(&mut self.dst);
        std::hint::black_box(&mut self.src);
        if !self.done.push(slot, u64::from(ok)) {
            return Err(BenchError::failed(
                "memcpy",
                "more operations started than the queue depth",
            ));
        }
        Ok(())
    }

    fn poll(&mut self, done: &mut dyn FnMut(Outcome)) -> Result<bool, BenchError> {
        let any = !self.done.is_empty();
        while let Some((slot, ok)) = self.done.pop() {
            done(Outcome { slot, ok: ok == 1 });
        }
        Ok(any)
    }

    fn close(self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `n` copies on `s`, returning how many verified.
    fn run(s: &mut MemcpySession, n: u64) -> u64 {
        let mut ok = 0;
        for seq in 0..n {
            s.start(0, seq).expect("started");
            s.poll(&mut |o| ok += u64::from(o.ok)).expect("polled");
        }
        ok
    }

    #[test]
    fn region_copies_both_ways_verify_and_corruption_is_caught() {
        let size = 4096;
        // 50 % of the copies out of the blocks, the rest into them.
        let w = MemcpyWorkload::new(size, Some(64 * 4096 + 100), 50, 1, true);
        let mut s = w.open(0).expect("opened");
        assert_eq!(run(&mut s, 300), 300);
        let Source::Region { map, next, .. } = &mut s.src else {
            panic!("a --file-size memcpy walks a region");
        };
        assert_eq!(map.len(), 64 * size, "whole blocks only");
        // Corrupt every block: each copy out of one fails now (a copy into
        // one rewrites it, so walk the 64 blocks once).
        for b in map.chunks_exact_mut(size) {
            b[size / 2] ^= 0xff;
        }
        *next = 0;
        let reads = (300..364).filter(|&q| is_read(q, 50)).count() as u64;
        assert!(
            reads > 10 && reads < 54,
            "{reads} of 64 copies out of blocks"
        );
        let ok = (300..364).fold(0, |ok, seq| {
            let mut got = 0;
            s.start(0, seq).expect("started");
            s.poll(&mut |o| got += u64::from(o.ok)).expect("polled");
            ok + got
        });
        assert_eq!(ok, 64 - reads, "only the copies into blocks verify");
    }

    #[test]
    fn hot_copies_verify() {
        let w = MemcpyWorkload::new(1000, None, 50, 1, true);
        let mut s = w.open(0).expect("opened");
        assert_eq!(run(&mut s, 50), 50);
    }
}
