//! Credit accounting ([MS-SMBD] 3.1.1.1, 3.1.5.1, 3.1.5.8, 3.1.5.9).
//!
//! The spec's Connection.ReceiveCredits counts posted receives, but a receive
//! posted by 3.1.5.9 is only usable by the peer once a message announcing it
//! (CreditsGranted) has been sent. We therefore keep both numbers:
//! `recv_posted` (= Connection.ReceiveCredits) and `peer_credits`, the posted
//! receives the peer has been told about and not yet consumed. The
//! difference is what the next outgoing message grants. See
//! docs/spec-notes.md, "Receive credits: posted versus granted".
//!
//! All counters are owned by the connection's worker thread: lock-free by
//! ownership.

/// Posts receive buffers on behalf of the connection ([MS-SMBD] 3.1.5.9
/// "allocate and post ... receive of size Connection.MaxReceiveSize"). The
/// data plane implements it over its buffer pool and queue pair; it returns
/// how many it actually posted (fewer when the pool is short).
pub trait ReceivePoster {
    /// Posts up to `want` receives; returns the number posted.
    fn post_receives(&mut self, want: u16) -> u16;
}

/// The receive buffers a [`ReceivePoster`] must be able to post for one
/// connection, beyond those the upper layer is still handling: the most a
/// connection ever has posted, ReceiveCreditMax plus the one extra receive
/// that pays for the grant accompanying the last send credit ([MS-SMBD]
/// 3.1.5.1, 3.1.5.9 "post at least one receive").
///
/// With fewer, a sender can stall at its last send credit: all its
/// receives are posted and already granted to a peer that has nothing to
/// send, so it has nothing to grant and 3.1.5.1 forbids the send. Only the
/// peer's keepalive ends the stall (pinned by
/// `receive_pool_below_receive_credit_max_plus_one_stalls_at_the_last_credit`
/// in `protocol/tests/smbd_connection.rs`).
pub const fn receive_buffers_required(receive_credit_max: u16) -> u32 {
    match receive_credit_max {
        0 => 2,
        max => max as u32 + 1,
    }
}

/// A poster with an unlimited supply, counting what it posted (tests, and
/// callers that account buffers elsewhere).
#[derive(Debug, Default, Clone, Copy)]
pub struct CountingPoster {
    /// Receives posted so far.
    pub posted: u64,
    /// If set, the most it will post in total (exhaustion tests).
    pub limit: Option<u64>,
}

impl ReceivePoster for CountingPoster {
    fn post_receives(&mut self, want: u16) -> u16 {
        let allowed = match self.limit {
            Some(l) => (l.saturating_sub(self.posted)).min(want as u64) as u16,
            None => want,
        };
        self.posted += allowed as u64;
        allowed
    }
}

/// Per-connection credit state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Credits {
    /// Connection.SendCredits: messages we may still send.
    pub send_credits: u16,
    /// Connection.SendCreditTarget: what we ask the peer to let us hold.
    pub send_credit_target: u16,
    /// Connection.ReceiveCreditMax.
    pub receive_credit_max: u16,
    /// Connection.ReceiveCreditTarget: the peer's latest CreditsRequested.
    pub receive_credit_target: u16,
    /// Connection.ReceiveCredits: receives currently posted.
    pub recv_posted: u16,
    /// Posted receives the peer knows about and has not consumed: the peer's
    /// SendCredits as far as we can tell.
    pub peer_credits: u16,
}

impl Credits {
    /// How many receives we aim to keep posted: the peer's request, capped
    /// by our maximum, and never less than one.
    pub fn receive_target(&self) -> u16 {
        self.receive_credit_target
            .min(self.receive_credit_max)
            .max(1)
    }

    /// Posted receives not yet announced to the peer.
    pub fn unannounced(&self) -> u16 {
        self.recv_posted.saturating_sub(self.peer_credits)
    }

    /// Below this many credits the peer gets an unsolicited grant after it
    /// sent us data (half the target: refills in bulk, never ping-pongs).
    pub fn low_watermark(&self) -> u16 {
        self.receive_target() / 2
    }

    /// The smallest receive deficit [`Self::top_up`] reposts while the
    /// peer is not short of credits: an eighth of the target, between 1
    /// (small targets repost every receive, as the spec's example does) and
    /// 16.
    pub fn repost_batch(&self) -> u16 {
        (self.receive_target() / 8).clamp(1, 16)
    }

    /// [MS-SMBD] 3.1.5.9: post receives to bring the posted count up to the
    /// target. `need_one` forces at least one new receive (ReceiveCredits is
    /// zero, or our last send credit is about to be spent and nothing is
    /// left to grant). Returns the number newly posted.
    ///
    /// Receives are reposted in batches of [`Self::repost_batch`]: while
    /// the peer holds more than [`Self::low_watermark`] credits, none is
    /// forced and some are posted, a smaller deficit waits (3.1.5.9 leaves
    /// how many are posted, "at least one and less than or equal to" the
    /// target, to the implementation). One post of many receives instead of
    /// one per message, and one grant announcing them.
    pub fn top_up<P: ReceivePoster + ?Sized>(&mut self, poster: &mut P, need_one: bool) -> u16 {
        let mut want = self.receive_target().saturating_sub(self.recv_posted);
        if !need_one
            && self.recv_posted > 0
            && want < self.repost_batch()
            && self.peer_credits > self.low_watermark()
        {
            return 0;
        }
        if want == 0 && (need_one || self.recv_posted == 0) {
            want = 1;
        }
        // Never post more than ReceiveCreditMax + 1 (the one extra is the
        // last-credit grant of 3.1.5.9) nor overflow the counter.
        let ceiling = self.receive_credit_max.saturating_add(1);
        want = want.min(ceiling.saturating_sub(self.recv_posted));
        if want == 0 {
            return 0;
        }
        let posted = poster.post_receives(want).min(want);
        self.recv_posted += posted;
        posted
    }

    /// Announces every unannounced receive: the CreditsGranted value of the
    /// message about to be sent.
    pub fn take_grant(&mut self) -> u16 {
        let g = self.unannounced();
        self.peer_credits += g;
        g
    }

    /// A message arrived: it consumed one posted receive. Returns false when
    /// no receive was posted (the provider would have reported RNR).
    pub fn on_receive(&mut self) -> bool {
        if self.recv_posted == 0 {
            return false;
        }
        self.recv_posted -= 1;
        // A peer that used a posted-but-unannounced receive (peer_credits
        // already 0) is tolerated: the buffer was there, as on hardware.
        self.peer_credits = self.peer_credits.saturating_sub(1).min(self.recv_posted);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_up_posts_to_target_and_grant_announces_them() {
        let mut c = Credits {
            receive_credit_max: 255,
            receive_credit_target: 10,
            ..Default::default()
        };
        let mut p = CountingPoster::default();
        assert_eq!(c.top_up(&mut p, false), 10);
        assert_eq!(c.take_grant(), 10);
        assert_eq!(c.top_up(&mut p, false), 0);
        assert_eq!(c.take_grant(), 0);
        assert!(c.on_receive());
        assert_eq!((c.recv_posted, c.peer_credits), (9, 9));
        assert_eq!(c.top_up(&mut p, false), 1);
        assert_eq!(c.take_grant(), 1);
    }

    #[test]
    fn receives_are_reposted_in_batches_while_the_peer_has_credits() {
        let mut c = Credits {
            receive_credit_max: 255,
            receive_credit_target: 255,
            ..Default::default()
        };
        let mut p = CountingPoster::default();
        assert_eq!(c.top_up(&mut p, false), 255);
        assert_eq!(c.take_grant(), 255);
        assert_eq!(c.repost_batch(), 16);
        // 15 messages consumed: nothing reposted yet, nothing to grant.
        for _ in 0..15 {
            assert!(c.on_receive());
            assert_eq!(c.top_up(&mut p, false), 0);
        }
        assert_eq!(c.take_grant(), 0);
        // The 16th: all 16 at once.
        assert!(c.on_receive());
        assert_eq!(c.top_up(&mut p, false), 16);
        assert_eq!(c.take_grant(), 16);
        // A forced top-up (last send credit) never waits for a batch.
        assert!(c.on_receive());
        assert_eq!(c.top_up(&mut p, true), 1);
        // Nor does one for a peer at or below its low watermark.
        assert_eq!(c.take_grant(), 1);
        while c.peer_credits > c.low_watermark() {
            assert!(c.on_receive());
        }
        let before = c.recv_posted;
        assert_eq!(c.top_up(&mut p, false), 255 - before);
        assert_eq!(c.recv_posted, 255);
        // Small targets repost every receive.
        let mut s = Credits {
            receive_credit_max: 255,
            receive_credit_target: 4,
            ..Default::default()
        };
        assert_eq!(s.top_up(&mut p, false), 4);
        s.take_grant();
        assert!(s.on_receive());
        assert_eq!(s.top_up(&mut p, false), 1);
    }

    #[test]
    fn top_up_is_capped_by_receive_credit_max_plus_one() {
        let mut c = Credits {
            receive_credit_max: 4,
            receive_credit_target: 65535,
            ..Default::default()
        };
        let mut p = CountingPoster::default();
        assert_eq!(c.top_up(&mut p, false), 4);
        assert_eq!(c.top_up(&mut p, true), 1);
        assert_eq!(c.top_up(&mut p, true), 0);
        assert_eq!(c.recv_posted, 5);
    }

    #[test]
    fn receive_with_nothing_posted_is_refused() {
        let mut c = Credits::default();
        assert!(!c.on_receive());
    }
}
