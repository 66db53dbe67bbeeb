//! The extension point: what a `--workload` is to the runner.
//!
//! A [`Workload`] opens connections ([`Session`]s); the runner
//! ([`super::runner`]) owns the schedule (queue depth, warm-up, duration or
//! iterations, fixed rate) and the clock, and a session only starts the
//! operations it is told to and reports the ones that finished. Each
//! session lives on the client thread that opened it, so it may hold the
//! provider's queue pair and completion queue and busy-poll them without
//! locks.
//!
//! Adding a workload (as `read`, `write`, `mixed`, `qos` were, over the
//! SMB2 client of `smbdirect_dataplane::smb2::client`):
//! 1. a type implementing [`Workload`] (its set-up: connect, negotiate,
//!    session and tree connect, open the file) whose [`Session`] starts one
//!    SMB2 request per [`Session::start`] and reports its response in
//!    [`Session::poll`], never allocating in either;
//! 2. its arm in `super::run_on` (which server the `--loopback` target
//!    starts, and the workload value handed to [`super::runner::run`]).

use super::error::BenchError;

/// One finished operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// The slot [`Session::start`] was given.
    pub slot: u32,
    /// False when the operation failed in a way that does not end the
    /// connection (with `--verify`: a byte that differs); counted as an
    /// error.
    pub ok: bool,
}

/// One connection of a workload, driven by one client thread.
///
/// The runner calls [`Session::start`] only with a free slot
/// (`slot < queue_depth`, not started since its last [`Outcome`]) and
/// sequence numbers increasing by one per connection. Neither method may
/// allocate once the session is open: the measured loop is
/// allocation-free.
pub trait Session {
    /// Starts operation `seq` in `slot`. An error ends the run.
    fn start(&mut self, slot: u32, seq: u64) -> Result<(), BenchError>;

    /// Polls once, calling `done` for every operation that finished (in any
    /// order). Returns whether anything happened. An error (the connection
    /// ended, the peer answered something the workload cannot use) ends the
    /// run.
    fn poll(&mut self, done: &mut dyn FnMut(Outcome)) -> Result<bool, BenchError>;

    /// Called once before the first operation: operations started at or
    /// after `measure_start` are the measured ones (for sessions that keep
    /// their own per-operation figures, like the `qos` flows).
    fn begin(&mut self, measure_start: std::time::Instant) {
        let _ = measure_start;
    }

    /// Times the session had to wait for send credits ([MS-SMBD] 3.1.5.1).
    fn credit_stalls(&self) -> u64 {
        0
    }

    /// The session's state in a few words, for the error that reports a
    /// stalled connection (credits, queues).
    fn describe(&self) -> String {
        String::new()
    }

    /// Ends the connection (after every outstanding operation finished).
    fn close(self);
}

/// A kind of operation: how to open its connections.
pub trait Workload: Sync {
    /// Its connections.
    type Session: Session;

    /// The `--workload` name.
    fn name(&self) -> &'static str;

    /// Payload bytes one operation moves in each direction (for MB/s).
    fn bytes_per_op(&self) -> u64;

    /// Opens connection `index` (0-based, over all client threads) on the
    /// calling thread, which is already pinned and will drive it.
    fn open(&self, index: usize) -> Result<Self::Session, BenchError>;
}

/// A fixed-capacity FIFO of operations in flight (slot, sequence number),
/// for sessions whose peer answers in order. Never allocates after
/// [`Fifo::with_capacity`].
#[derive(Debug)]
pub struct Fifo {
    items: Box<[(u32, u64)]>,
    head: usize,
    len: usize,
}

impl Fifo {
    /// Room for `cap` operations.
    pub fn with_capacity(cap: usize) -> Self {
        Fifo {
            items: vec![(0, 0); cap.max(1)].into_boxed_slice(),
            head: 0,
            len: 0,
        }
    }

    /// Appends; false when full.
    pub fn push(&mut self, slot: u32, seq: u64) -> bool {
        if self.len == self.items.len() {
            return false;
        }
        let i = (self.head + self.len) % self.items.len();
        self.items[i] = (slot, seq);
        self.len += 1;
        true
    }

    /// The oldest operation, removed.
    pub fn pop(&mut self) -> Option<(u32, u64)> {
        if self.len == 0 {
            return None;
        }
        let v = self.items[self.head];
        self.head = (self.head + 1) % self.items.len();
        self.len -= 1;
        Some(v)
    }

    /// The oldest operation.
    pub fn front(&self) -> Option<(u32, u64)> {
        (self.len > 0).then(|| self.items[self.head])
    }

    /// Operations in flight.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether none are.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_keeps_order_across_wraparound_and_refuses_when_full() {
        let mut f = Fifo::with_capacity(3);
        for round in 0..5u64 {
            assert!(f.push(0, round * 10));
            assert!(f.push(1, round * 10 + 1));
            assert_eq!(f.front(), Some((0, round * 10)));
            assert_eq!(f.pop(), Some((0, round * 10)));
            assert_eq!(f.pop(), Some((1, round * 10 + 1)));
            assert!(f.is_empty());
        }
        assert!(f.push(0, 1) && f.push(1, 2) && f.push(2, 3));
        assert!(!f.push(3, 4));
        assert_eq!(f.len(), 3);
    }
}
