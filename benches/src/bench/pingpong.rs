//! `--workload pingpong`: the hardware floor of a cross-core round trip,
//! through the same runner as the real workloads. A connection is one cache
//! line shared with a responder thread pinned to a server core: the client
//! writes `2k+1`, the responder answers `2k+2` (what
//! `crate::baseline::cacheline_pingpong` measures, with the runner's
//! timing, so `raw-send / pingpong` compares like with like).

use super::error::BenchError;
use super::workload::{Outcome, Session, Workload};
use crate::baseline;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

#[repr(align(128))]
struct Line(AtomicU64);

#[repr(align(128))]
struct Flag(AtomicBool);

struct Shared {
    line: Line,
    stop: Flag,
}

/// Cache-line ping-pong between the client core and a server core.
pub struct PingPongWorkload {
    server_cores: Vec<Option<usize>>,
}

impl PingPongWorkload {
    /// Responders pinned round-robin to `server_cores`.
    pub fn new(server_cores: Vec<Option<usize>>) -> Self {
        PingPongWorkload { server_cores }
    }
}

impl Workload for PingPongWorkload {
    type Session = PingPongSession;

    fn name(&self) -> &'static str {
        "pingpong"
    }

    fn bytes_per_op(&self) -> u64 {
        8
    }

    fn open(&self, index: usize) -> Result<PingPongSession, BenchError> {
        let shared = Arc::new(Shared {
            line: Line(AtomicU64::new(0)),
            stop: Flag(AtomicBool::new(false)),
        });
        let core = self
            .server_cores
            .get(index % self.server_cores.len().max(1))
            .copied()
            .flatten();
        let s = shared.clone();
        let responder = std::thread::Builder::new()
            .name(format!("bench-pingpong-{index}"))
            .spawn(move || {
                if let Some(c) = core {
                    baseline::pin(c);
                }
                let mut expect = 1u64;
                while !s.stop.0.load(Ordering::Relaxed) {
                    if s.line.0.load(Ordering::Acquire) == expect {
                        s.line.0.store(expect + 1, Ordering::Release);
                        expect += 2;
                    } else {
                        std::hint::spin_loop();
                    }
                }
            })
            .map_err(|e| {
                BenchError::failed(format!("connection {index}: starting the responder"), e)
            })?;
        Ok(PingPongSession {
            shared,
            responder: Some(responder),
            next: 0,
            waiting: None,
        })
    }
}

/// One ping-pong pair.
pub struct PingPongSession {
    shared: Arc<Shared>,
    responder: Option<JoinHandle<()>>,
    /// Values written so far are `2 * next - 1`.
    next: u64,
    /// The slot in flight.
    waiting: Option<u32>,
}

impl Session for PingPongSession {
    fn start(&mut self, slot: u32, _seq: u64) -> Result<(), BenchError> {
        self.next += 1;
        self.shared
            .line
            .0
            .store(2 * self.next - 1, Ordering::Release);
        self.waiting = Some(slot);
        Ok(())
    }

    fn poll(&mut self, done: &mut dyn FnMut(Outcome)) -> Result<bool, BenchError> {
        match self.waiting {
            Some(slot) if self.shared.line.0.load(Ordering::Acquire) == 2 * self.next => {
                self.waiting = None;
                done(Outcome { slot, ok: true });
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    fn close(mut self) {
        self.shared.stop.0.store(true, Ordering::Relaxed);
        if let Some(t) = self.responder.take() {
            let _ = t.join();
        }
    }
}

impl Drop for PingPongSession {
    fn drop(&mut self) {
        self.shared.stop.0.store(true, Ordering::Relaxed);
        if let Some(t) = self.responder.take() {
            let _ = t.join();
        }
    }
}
