//! Connection.FragmentReassemblyBuffer and FragmentReassemblyRemaining
//! ([MS-SMBD] 3.1.5.8), with every terminate check on the fragment sequence.

use super::terminate::TerminateReason;

/// Outcome of feeding one data-bearing message into reassembly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fragment {
    /// An unfragmented message (RemainingDataLength 0, no sequence in
    /// progress): deliver it from the receive buffer without copying.
    Whole,
    /// A fragment was appended; more are expected.
    More,
    /// The final fragment was appended: the reassembled message is ready.
    Complete,
}

/// Reassembly state. The buffer is reserved on the first fragmented message
/// at the full MaxFragmentedRecvSize and reused, so steady-state receives do
/// not allocate.
#[derive(Debug, Default)]
pub struct Reassembly {
    buf: Vec<u8>,
    remaining: u32,
    in_progress: bool,
    ready: bool,
}

impl Reassembly {
    /// Empty reassembly state; no memory reserved yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes still expected in the current sequence.
    pub fn remaining(&self) -> u32 {
        self.remaining
    }

    /// True while a fragmented message is partly received.
    pub fn in_progress(&self) -> bool {
        self.in_progress
    }

    /// The reassembled message after [`Fragment::Complete`]; empty otherwise.
    pub fn message(&self) -> &[u8] {
        if self.ready {
            &self.buf
        } else {
            &[]
        }
    }

    /// Bytes held (a peer stopping mid-fragment parks at most
    /// MaxFragmentedRecvSize here).
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// [MS-SMBD] 3.1.5.8 for one message with `data` (DataLength > 0) and
    /// RemainingDataLength `rdl`; `limit` is our MaxFragmentedRecvSize
    /// (the spec's "Connection.MaxFragmentSize", docs/spec-notes.md).
    pub fn push(&mut self, data: &[u8], rdl: u32, limit: u32) -> Result<Fragment, TerminateReason> {
        if self.ready {
            self.buf.clear();
            self.ready = false;
        }
        let dl = data.len() as u64;
        let total = dl + rdl as u64;
        if total > limit as u64 {
            return Err(TerminateReason::FragmentedSizeExceeded { total, limit });
        }
        if !self.in_progress {
            if rdl == 0 {
                return Ok(Fragment::Whole);
            }
            // First fragment: "FragmentReassemblyRemaining MUST be set to
            // RemainingDataLength".
            if self.buf.capacity() < limit as usize {
                self.buf.reserve_exact(limit as usize - self.buf.len());
            }
            self.buf.extend_from_slice(data);
            self.remaining = rdl;
            self.in_progress = true;
            return Ok(Fragment::More);
        }
        // Continuation: "reduced by the received DataLength"; a sequence that
        // does not count down is a protocol violation.
        let len = data.len() as u32;
        if len > self.remaining {
            return Err(TerminateReason::FragmentOverrun {
                remaining: self.remaining,
                length: len,
            });
        }
        let expected = self.remaining - len;
        if rdl != expected {
            return Err(TerminateReason::FragmentCountdownMismatch { expected, got: rdl });
        }
        self.buf.extend_from_slice(data);
        self.remaining = expected;
        if self.remaining == 0 {
            self.in_progress = false;
            self.ready = true;
            Ok(Fragment::Complete)
        } else {
            Ok(Fragment::More)
        }
    }

    /// Discards a partial message (teardown).
    pub fn reset(&mut self) {
        self.buf.clear();
        self.remaining = 0;
        self.in_progress = false;
        self.ready = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reassembly_counts_down_and_completes() {
        let mut r = Reassembly::new();
        assert_eq!(r.push(&[1, 2], 3, 1 << 20), Ok(Fragment::More));
        assert_eq!(r.push(&[3], 2, 1 << 20), Ok(Fragment::More));
        assert_eq!(r.push(&[4, 5], 0, 1 << 20), Ok(Fragment::Complete));
        assert_eq!(r.message(), &[1, 2, 3, 4, 5]);
        assert_eq!(r.push(&[9], 0, 1 << 20), Ok(Fragment::Whole));
        assert!(r.message().is_empty());
    }

    #[test]
    fn reassembly_refuses_bad_countdown_overrun_and_oversize() {
        let mut r = Reassembly::new();
        assert_eq!(r.push(&[0; 10], 10, 1 << 20), Ok(Fragment::More));
        assert_eq!(
            r.push(&[0; 4], 7, 1 << 20),
            Err(TerminateReason::FragmentCountdownMismatch {
                expected: 6,
                got: 7
            })
        );
        let mut r = Reassembly::new();
        r.push(&[0; 10], 3, 1 << 20).unwrap();
        assert_eq!(
            r.push(&[0; 4], 0, 1 << 20),
            Err(TerminateReason::FragmentOverrun {
                remaining: 3,
                length: 4
            })
        );
        let mut r = Reassembly::new();
        assert_eq!(
            r.push(&[0; 10], 131_063, 131_072),
            Err(TerminateReason::FragmentedSizeExceeded {
                total: 131_073,
                limit: 131_072
            })
        );
    }
}
