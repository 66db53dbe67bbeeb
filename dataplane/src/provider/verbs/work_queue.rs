//! Shadow rings: what the provider remembers of each posted work request.
//!
//! Verbs leaves a completion's opcode undefined when its status is an error,
//! and flushed receives and sends look alike; selective signaling means most
//! send-queue requests never complete at all. So the `wr_id` handed to the
//! device is not the caller's: it is a [`WrTag`] naming the completion
//! queue's slot for the queue pair, which of its two queues, and the
//! request's sequence number. The shadow ring of that queue holds the
//! caller's `wr_id`, the opcode and the length at that sequence number.
//!
//! Both work queues of a reliable-connected queue pair complete in order, so
//! a completion for sequence `s` retires every request before `s` too (the
//! unsignaled ones that succeeded silently). The producer (the queue pair)
//! checks the ring's free room against the retired count before posting,
//! which is exactly the hardware queue's room: nothing ever overruns it.
//!
//! Entries are atomics written with `Relaxed` stores and published by a
//! `Release` fence before the doorbell; the poller reads them after an
//! `Acquire` fence. On x86 these are plain moves.

use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};

use crate::provider::WcOpcode;

/// The device-side `wr_id`: `slot` (16 bits) | `generation` (15 bits) |
/// `recv` (1 bit) | `seq` (32 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct WrTag {
    /// The queue pair's slot in its completion queue's registry.
    pub slot: u16,
    /// The slot's generation (15 bits), so a completion of a destroyed queue
    /// pair is never taken for one of its successor in the same slot.
    pub generation: u16,
    /// Receive queue (else send queue).
    pub recv: bool,
    /// Sequence number within that queue.
    pub seq: u32,
}

const SLOT_SHIFT: u32 = 48;
const GENERATION_SHIFT: u32 = 33;
/// Generations wrap at 15 bits.
pub(super) const GENERATION_MASK: u16 = 0x7fff;
const RECV_BIT: u64 = 1 << 32;

impl WrTag {
    /// Packs the tag.
    pub fn encode(self) -> u64 {
        ((self.slot as u64) << SLOT_SHIFT)
            | (((self.generation & GENERATION_MASK) as u64) << GENERATION_SHIFT)
            | if self.recv { RECV_BIT } else { 0 }
            | self.seq as u64
    }

    /// Unpacks a tag.
    pub fn decode(v: u64) -> Self {
        WrTag {
            slot: (v >> SLOT_SHIFT) as u16,
            generation: ((v >> GENERATION_SHIFT) as u16) & GENERATION_MASK,
            recv: v & RECV_BIT != 0,
            seq: v as u32,
        }
    }
}

fn opcode_code(op: WcOpcode) -> u64 {
    match op {
        WcOpcode::Send => 0,
        WcOpcode::Recv => 1,
        WcOpcode::RdmaWrite => 2,
        WcOpcode::RdmaRead => 3,
        WcOpcode::Bind => 4,
        WcOpcode::Revoke => 5,
    }
}

fn opcode_from(code: u64) -> WcOpcode {
    match code {
        1 => WcOpcode::Recv,
        2 => WcOpcode::RdmaWrite,
        3 => WcOpcode::RdmaRead,
        4 => WcOpcode::Bind,
        5 => WcOpcode::Revoke,
        _ => WcOpcode::Send,
    }
}

#[derive(Debug, Default)]
struct Entry {
    wr_id: AtomicU64,
    /// opcode << 32 | byte length.
    meta: AtomicU64,
}

/// The shadow of one work queue.
#[derive(Debug)]
pub(super) struct ShadowRing {
    entries: Box<[Entry]>,
    mask: u32,
    depth: u32,
    /// Sequence number of the oldest request not yet retired (written by the
    /// poller).
    retired: AtomicU32,
}

impl ShadowRing {
    /// A ring for at most `depth` outstanding requests.
    pub fn new(depth: u32) -> Self {
        let size = depth.max(1).next_power_of_two();
        ShadowRing {
            entries: (0..size).map(|_| Entry::default()).collect(),
            mask: size - 1,
            depth,
            retired: AtomicU32::new(0),
        }
    }

    /// Room for more requests, given the producer's next sequence number.
    pub fn room(&self, head: u32) -> u32 {
        let outstanding = head.wrapping_sub(self.retired.load(Ordering::Acquire));
        self.depth.saturating_sub(outstanding)
    }

    /// Records request `seq` (producer side, before posting).
    pub fn record(&self, seq: u32, wr_id: u64, opcode: WcOpcode, len: u32) {
        let e = &self.entries[(seq & self.mask) as usize];
        e.wr_id.store(wr_id, Ordering::Relaxed);
        e.meta
            .store((opcode_code(opcode) << 32) | len as u64, Ordering::Relaxed);
    }

    /// Reads request `seq` and retires it and everything before it
    /// (consumer side). Returns the caller's `wr_id`, opcode and length.
    pub fn complete(&self, seq: u32) -> (u64, WcOpcode, u32) {
        let e = &self.entries[(seq & self.mask) as usize];
        let wr_id = e.wr_id.load(Ordering::Relaxed);
        let meta = e.meta.load(Ordering::Relaxed);
        self.retired.store(seq.wrapping_add(1), Ordering::Release);
        (wr_id, opcode_from(meta >> 32), meta as u32)
    }
}

/// What the poller saw of one memory window: the rkey a peer's Send with
/// Invalidate invalidated (0: none since the last revoke).
#[derive(Debug)]
pub(super) struct RemoteInvalidation {
    /// The window's rkey without its key byte (fixed for its life).
    index: u32,
    rkey: AtomicU32,
}

/// The two shadow rings of a queue pair, shared by the queue pair (producer)
/// and its completion queue (consumer), and what the poller learnt about the
/// queue pair's memory windows.
#[derive(Debug)]
pub(super) struct QpShadow {
    pub sq: ShadowRing,
    pub rq: ShadowRing,
    /// Set by the poller on any unsuccessful completion: the hardware queue
    /// pair is in the error state.
    pub failed: AtomicBool,
    /// One per memory window of the queue pair, in pool order.
    windows: Box<[RemoteInvalidation]>,
}

impl QpShadow {
    /// Rings of the given depths; `window_rkeys` are the initial rkeys of the
    /// queue pair's memory windows.
    pub fn new(send_depth: u32, recv_depth: u32, window_rkeys: &[u32]) -> Self {
        QpShadow {
            sq: ShadowRing::new(send_depth),
            rq: ShadowRing::new(recv_depth),
            failed: AtomicBool::new(false),
            windows: window_rkeys
                .iter()
                .map(|&k| RemoteInvalidation {
                    index: k >> 8,
                    rkey: AtomicU32::new(0),
                })
                .collect(),
        }
    }

    /// Poller: a receive reported that the peer invalidated `rkey`.
    pub fn note_remote_invalidation(&self, rkey: u32) {
        if let Some(w) = self.windows.iter().find(|w| w.index == rkey >> 8) {
            w.rkey.store(rkey, Ordering::Release);
        }
    }

    /// Queue pair, on revoke of window `window`'s grant `rkey`: whether the
    /// peer already invalidated it (and forgets that).
    pub fn take_remote_invalidation(&self, window: u32, rkey: u32) -> bool {
        match self.windows.get(window as usize) {
            Some(w) => w.rkey.swap(0, Ordering::AcqRel) == rkey,
            None => false,
        }
    }
}

/// Publishes recorded entries before the doorbell.
pub(super) fn publish() {
    fence(Ordering::Release);
}

/// Makes entries recorded before the device wrote a completion visible.
pub(super) fn acquire() {
    fence(Ordering::Acquire);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wr_tag_round_trips_every_field() {
        for tag in [
            WrTag {
                slot: 0,
                generation: 0,
                recv: false,
                seq: 0,
            },
            WrTag {
                slot: 0xffff,
                generation: GENERATION_MASK,
                recv: true,
                seq: u32::MAX,
            },
            WrTag {
                slot: 17,
                generation: 3,
                recv: true,
                seq: 123_456,
            },
        ] {
            assert_eq!(WrTag::decode(tag.encode()), tag);
        }
    }

    #[test]
    fn unsignaled_requests_are_retired_by_a_later_completion() {
        let r = ShadowRing::new(4);
        assert_eq!(r.room(0), 4);
        for seq in 0..4 {
            r.record(seq, 100 + seq as u64, WcOpcode::Send, 8);
        }
        assert_eq!(r.room(4), 0, "four outstanding in a ring of four");
        // Only the last one was signaled: its completion retires all four.
        assert_eq!(r.complete(3), (103, WcOpcode::Send, 8));
        assert_eq!(r.room(4), 4);
    }

    #[test]
    fn remote_invalidation_is_remembered_for_the_current_rkey_only() {
        let sh = QpShadow::new(4, 4, &[0x0001_2300, 0x0001_2400]);
        sh.note_remote_invalidation(0x0001_2405);
        assert!(!sh.take_remote_invalidation(0, 0x0001_2301), "other window");
        assert!(
            !sh.take_remote_invalidation(1, 0x0001_2406),
            "older binding of the window"
        );
        sh.note_remote_invalidation(0x0001_2406);
        assert!(sh.take_remote_invalidation(1, 0x0001_2406));
        assert!(
            !sh.take_remote_invalidation(1, 0x0001_2406),
            "forgotten once taken"
        );
        sh.note_remote_invalidation(0x0009_9901); // not a window of ours: ignored
    }

    #[test]
    fn ring_wraps_sequence_numbers() {
        let r = ShadowRing::new(3);
        let mut head = u32::MAX - 1;
        r.retired.store(head, Ordering::Relaxed);
        for i in 0..3 {
            r.record(head, i, WcOpcode::RdmaRead, 1);
            head = head.wrapping_add(1);
        }
        assert_eq!(r.room(head), 0);
        assert_eq!(r.complete(u32::MAX), (1, WcOpcode::RdmaRead, 1));
        assert_eq!(r.room(head), 2);
        assert_eq!(r.complete(0), (2, WcOpcode::RdmaRead, 1));
        assert_eq!(r.room(head), 3);
    }
}
