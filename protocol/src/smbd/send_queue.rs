//! Connection.SendQueue ([MS-SMBD] 3.1.1.1, 3.1.5.1): a strict FIFO of
//! upper-layer messages awaiting transmission, each with an optional remote
//! token to invalidate. Fixed capacity, allocated once: a full queue is
//! backpressure to the upper layer, never growth.

/// One upper-layer message in the queue. The bytes stay with the caller and
/// are named by `handle`; the connection only tracks how far it got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueuedMessage {
    /// Caller's name for the bytes the message lies in.
    pub handle: u64,
    /// Where the message starts in them (segments are sliced from here).
    pub base: u32,
    /// Total length.
    pub len: u32,
    /// Bytes already sent in earlier fragments.
    pub sent: u32,
    /// Token to invalidate on the peer with exactly one segment (3.1.5.4).
    pub invalidate_token: Option<u32>,
    /// The [`DATA_TRANSFER_PAYLOAD_OFFSET`](super::config::DATA_TRANSFER_PAYLOAD_OFFSET)
    /// bytes before `base` are the caller's scratch: sent whole, the
    /// message may go as one contiguous Send with its header written there
    /// ([`Connection::next_in_place`](super::Connection::next_in_place)).
    pub header_room: bool,
}

/// Bounded FIFO ring.
#[derive(Debug)]
pub struct SendQueue {
    slots: Box<[QueuedMessage]>,
    head: usize,
    len: usize,
}

impl SendQueue {
    /// A queue of `capacity` messages (allocated here, once).
    pub fn with_capacity(capacity: usize) -> Self {
        let empty = QueuedMessage {
            handle: 0,
            base: 0,
            len: 0,
            sent: 0,
            invalidate_token: None,
            header_room: false,
        };
        SendQueue {
            slots: vec![empty; capacity.max(1)].into_boxed_slice(),
            head: 0,
            len: 0,
        }
    }

    /// Messages queued.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Capacity.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// True when no message can be appended.
    pub fn is_full(&self) -> bool {
        self.len == self.slots.len()
    }

    /// Appends at the tail; gives the message back when full.
    pub fn push(&mut self, m: QueuedMessage) -> Result<(), QueuedMessage> {
        if self.is_full() {
            return Err(m);
        }
        self.slots[self.wrap(self.head + self.len)] = m;
        self.len += 1;
        Ok(())
    }

    /// `i` (below twice the capacity) as a slot index: a compare, not a
    /// division (this runs for every message).
    #[inline]
    fn wrap(&self, i: usize) -> usize {
        if i >= self.slots.len() {
            i - self.slots.len()
        } else {
            i
        }
    }

    /// The head of the queue.
    pub fn front(&self) -> Option<&QueuedMessage> {
        if self.len == 0 {
            None
        } else {
            Some(&self.slots[self.head])
        }
    }

    /// The head of the queue, mutably.
    pub fn front_mut(&mut self) -> Option<&mut QueuedMessage> {
        if self.len == 0 {
            None
        } else {
            Some(&mut self.slots[self.head])
        }
    }

    /// Removes the head.
    pub fn pop(&mut self) -> Option<QueuedMessage> {
        if self.len == 0 {
            return None;
        }
        let m = self.slots[self.head];
        self.head = self.wrap(self.head + 1);
        self.len -= 1;
        Some(m)
    }

    /// Drops everything (connection teardown); yields the handles so the
    /// caller can release their buffers.
    pub fn drain(&mut self) -> impl Iterator<Item = QueuedMessage> + '_ {
        core::iter::from_fn(move || self.pop())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(handle: u64) -> QueuedMessage {
        QueuedMessage {
            handle,
            base: 0,
            len: 1,
            sent: 0,
            invalidate_token: None,
            header_room: false,
        }
    }

    #[test]
    fn send_queue_is_fifo_and_bounded() {
        let mut q = SendQueue::with_capacity(2);
        q.push(m(1)).unwrap();
        q.push(m(2)).unwrap();
        assert_eq!(q.push(m(3)), Err(m(3)));
        assert_eq!(q.pop().map(|x| x.handle), Some(1));
        q.push(m(3)).unwrap();
        assert_eq!(q.drain().map(|x| x.handle).collect::<Vec<_>>(), vec![2, 3]);
        assert!(q.is_empty());
    }
}
