//! Zero-copy RDMA from and to memory outside a worker's buffer pool (the
//! memory store's blocks).
//!
//! An upper layer whose data lives in memory of its own (a store) can have
//! that memory registered with the provider once, at start
//! ([`crate::upper::UpperLayer::zero_copy_regions`]), and then ask for RDMA
//! Writes *from* it and RDMA Reads *into* it with a scatter list of
//! [`Piece`]s ([`crate::upper::Replies::rdma_write_pieces`],
//! [`crate::upper::Replies::rdma_read_pieces`]) instead of a staging pool
//! buffer: one copy fewer per byte moved, the provider's.
//!
//! The memory of a piece must not be reused for something else while the
//! provider may still read or write it. The owner *pins* each piece before
//! handing it over (the memory store pins blocks: a pinned block that is
//! freed goes back to the free list only when its last pin goes), and the
//! endpoint calls [`Pins::unpin`] with the piece once no work request
//! of the operation can touch it any more: when the operation is freed
//! (completed and handed to the upper layer, failed and flushed, refused, or
//! undone by backpressure). Pins are plain numbers so that nothing is
//! allocated per operation.

use crate::provider::Sge;

/// The pin of a piece that needs none (memory that is never reused, e.g. a
/// shared all-zero block standing for a hole).
pub const NO_PIN: u32 = u32::MAX;

/// Releases pins; implemented by the owner of the memory. Called by the
/// worker that posted the transfer, possibly while other workers pin and
/// unpin the same memory: implementations are lock-free.
pub trait Pins: Send + Sync + 'static {
    /// Drops the pin(s) `piece` holds (its `pin` is never [`NO_PIN`]; the
    /// owner may identify what to release by the piece's address and
    /// length as well as by `pin`, e.g. one pin per block it spans).
    fn unpin(&self, piece: &Piece);
}

impl core::fmt::Debug for dyn Pins {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("Pins")
    }
}

/// One local piece of a zero-copy transfer: registered memory and the pin
/// keeping it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// The bytes (in a region registered with this worker's provider).
    pub sge: Sge,
    /// What to give [`Pins::unpin`] once the transfer is over, or
    /// [`NO_PIN`].
    pub pin: u32,
}

/// Bytes one [`Piece`] takes in an operation's auxiliary buffer.
pub(crate) const PIECE_BYTES: usize = 20;

impl Piece {
    /// Encodes into `b` (at least [`PIECE_BYTES`]).
    #[inline]
    pub(crate) fn encode(&self, b: &mut [u8]) {
        let Some(b) = b.first_chunk_mut::<PIECE_BYTES>() else {
            panic!("a piece needs {PIECE_BYTES} bytes, got {}", b.len());
        };
        let mut out = [0u8; PIECE_BYTES];
        out[0..8].copy_from_slice(&self.sge.addr.to_le_bytes());
        out[8..12].copy_from_slice(&self.sge.len.to_le_bytes());
        out[12..16].copy_from_slice(&self.sge.lkey.to_le_bytes());
        out[16..20].copy_from_slice(&self.pin.to_le_bytes());
        *b = out;
    }

    /// Decodes what [`Piece::encode`] wrote (the first [`PIECE_BYTES`] of
    /// `b`). On the I/O path (twice per zero-copy READ), so it works on a
    /// fixed-size array: no per-byte bounds checks.
    #[inline]
    pub(crate) fn decode(b: &[u8]) -> Piece {
        let Some(b) = b.first_chunk::<PIECE_BYTES>() else {
            panic!("an encoded piece is {PIECE_BYTES} bytes, got {}", b.len());
        };
        let [a0, a1, a2, a3, a4, a5, a6, a7, l0, l1, l2, l3, k0, k1, k2, k3, p0, p1, p2, p3] = *b;
        Piece {
            sge: Sge {
                addr: u64::from_le_bytes([a0, a1, a2, a3, a4, a5, a6, a7]),
                len: u32::from_le_bytes([l0, l1, l2, l3]),
                lkey: u32::from_le_bytes([k0, k1, k2, k3]),
            },
            pin: u32::from_le_bytes([p0, p1, p2, p3]),
        }
    }
}

/// Releases the pins of `pieces` (encoded, [`PIECE_BYTES`] each).
pub(crate) fn unpin_encoded(pins: &dyn Pins, pieces: &[u8]) {
    for b in pieces.chunks_exact(PIECE_BYTES) {
        let p = Piece::decode(b);
        if p.pin != NO_PIN {
            pins.unpin(&p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_round_trip_through_their_encoding() {
        let p = Piece {
            sge: Sge {
                addr: 0x1234_5678_9abc,
                len: 65536,
                lkey: 0xdead_beef,
            },
            pin: 42,
        };
        let mut b = [0u8; PIECE_BYTES];
        p.encode(&mut b);
        assert_eq!(Piece::decode(&b), p);
    }
}
