//! The upper layer a worker hands reassembled messages to ([MS-SMBD] 3.1.5.8
//! "passed to the upper layer"). `echo` returns every message to its sender
//! (the transport benchmark server, like perftest's); the SMB2 layer comes
//! with the SMB2+QoS issue.

use crate::planes::ConnId;
use smbdirect_hugepages::{BufId, BufferPool, SliceAllocator};

/// Why a reply could not be queued now. The worker keeps the message and
/// calls the upper layer again later; nothing is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backpressure {
    /// No pool buffer large enough is free.
    PoolExhausted,
    /// The connection's send queue is full.
    SendQueueFull,
    /// The reply is larger than the peer can reassemble.
    TooLarge,
}

/// Where an upper layer writes its replies: pool buffers, queued on the
/// connection the message came from.
#[derive(Debug)]
pub struct Replies<'a> {
    pub(crate) alloc: &'a mut SliceAllocator,
    pub(crate) pool: &'a BufferPool,
    pub(crate) queued: &'a mut [(BufId, u32)],
    pub(crate) count: usize,
}

impl Replies<'_> {
    /// Queues a reply of `len` bytes written by `fill`.
    pub fn reply(&mut self, len: usize, fill: impl FnOnce(&mut [u8])) -> Result<(), Backpressure> {
        if self.count == self.queued.len() {
            return Err(Backpressure::SendQueueFull);
        }
        let id = self
            .alloc
            .alloc_len(len.max(1))
            .map_err(|_| Backpressure::PoolExhausted)?;
        // SAFETY: `id` was just allocated and is exclusively ours.
        match unsafe { self.pool.bytes_mut(id) } {
            Some(b) if b.len() >= len => fill(&mut b[..len]),
            _ => {
                let _ = self.alloc.free(id);
                return Err(Backpressure::TooLarge);
            }
        }
        self.queued[self.count] = (id, len as u32);
        self.count += 1;
        Ok(())
    }
}

/// An upper layer served by a worker.
pub trait UpperLayer: Send + 'static {
    /// Name for logs and `stats`.
    fn name(&self) -> &'static str;

    /// Handles one complete message from `conn`. On `Err` the worker keeps
    /// the message and calls again later with the same bytes, so the
    /// handler must not have acted on it.
    fn on_message(
        &mut self,
        conn: ConnId,
        msg: &[u8],
        out: &mut Replies<'_>,
    ) -> Result<(), Backpressure>;

    /// The connection closed.
    fn on_close(&mut self, _conn: ConnId) {}
}

/// Returns every message to its sender.
#[derive(Debug, Default, Clone, Copy)]
pub struct Echo;

impl UpperLayer for Echo {
    fn name(&self) -> &'static str {
        "echo"
    }

    fn on_message(
        &mut self,
        _conn: ConnId,
        msg: &[u8],
        out: &mut Replies<'_>,
    ) -> Result<(), Backpressure> {
        out.reply(msg.len(), |b| b.copy_from_slice(msg))
    }
}
