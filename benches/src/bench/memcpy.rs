//! `--workload memcpy`: the same-run baseline of the bulk workloads. One
//! operation copies `--size` bytes between two buffers of the client
//! thread (page-aligned, touched before the run, as big as the source and
//! destination of a `read` / `write` of that size), so `read 1M / memcpy 1M`
//! says how far an SMB2 READ is from the copy any data path pays at least
//! once. With `--verify` each copy's source carries the operation's
//! pattern and the destination is checked.

use super::error::BenchError;
use super::pattern;
use super::workload::{Fifo, Outcome, Session, Workload};

/// Copies of `size` bytes.
pub struct MemcpyWorkload {
    size: usize,
    queue_depth: u32,
    verify: bool,
}

impl MemcpyWorkload {
    /// `size` bytes per operation.
    pub fn new(size: usize, queue_depth: u32, verify: bool) -> Self {
        MemcpyWorkload {
            size,
            queue_depth,
            verify,
        }
    }
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
        let mut src = vec![0u8; self.size].into_boxed_slice();
        pattern::fill(&mut src, u64::MAX >> 8);
        Ok(MemcpySession {
            src,
            dst: vec![0xa5u8; self.size].into_boxed_slice(),
            done: Fifo::with_capacity(self.queue_depth as usize),
            verify: self.verify,
        })
    }
}

/// One thread's pair of buffers.
pub struct MemcpySession {
    src: Box<[u8]>,
    dst: Box<[u8]>,
    /// Copies made, reported by the next poll.
    done: Fifo,
    verify: bool,
}

impl Session for MemcpySession {
    fn start(&mut self, slot: u32, seq: u64) -> Result<(), BenchError> {
        if self.verify {
            pattern::fill(&mut self.src, seq);
        }
        self.dst.copy_from_slice(&self.src);
        // Keep the copy from being optimised away.
        std::hint::black_box(&mut self.dst);
        if !self.done.push(slot, seq) {
            return Err(BenchError::failed(
                "memcpy",
                "more operations started than the queue depth",
            ));
        }
        Ok(())
    }

    fn poll(&mut self, done: &mut dyn FnMut(Outcome)) -> Result<bool, BenchError> {
        let any = !self.done.is_empty();
        while let Some((slot, seq)) = self.done.pop() {
            let ok = !self.verify || pattern::check(&self.dst, seq);
            done(Outcome { slot, ok });
        }
        Ok(any)
    }

    fn close(self) {}
}
