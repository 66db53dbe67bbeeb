//! Deterministic simulation of two SMB Direct connections ([MS-SMBD] 3.1)
//! talking through a simulated reliable-connected (RC) RDMA transport.
//!
//! The transport is deliberately unforgiving, like RC hardware:
//! - each side owns a finite pool of receive buffers; the connection posts
//!   them through [`ReceivePoster`], a received message consumes one posted
//!   buffer, and the upper layer returns it to the pool after handling the
//!   message (sometimes later, so the pool can run dry); each pool holds
//!   `receive_buffers_required(ReceiveCreditMax)` buffers, sometimes with no
//!   slack at all (with fewer, a sender can stall at its last credit: see
//!   `receive_pool_below_receive_credit_max_plus_one_stalls_at_the_last_credit`
//!   in smbd_connection.rs);
//! - a Send arriving when the receiver has no posted receive is a
//!   receiver-not-ready (RNR) error and fails the test, as does a message
//!   longer than the receive buffer;
//! - messages are delivered in order per direction, after random delays, and
//!   each direction can be paused for a while (longer than the keepalive
//!   interval, so idle timers fire in the middle of fragmented messages).
//!
//! Both directions carry upper-layer traffic at the same time: messages of
//! random sizes from 1 byte to the peer's MaxFragmentedSize, whose bytes are
//! derived from (direction, sequence number), with an occasional remote
//! token to invalidate. The simulation checks, independently of the
//! connections' own counters:
//! - every message arrives once, in order, intact, with its token;
//! - no Data Transfer message is sent without a send credit, tracked from
//!   the CreditsGranted fields on the wire, and the last credit is never
//!   spent without a grant ([MS-SMBD] 3.1.5.1);
//! - the transport sees exactly the receives the connection counts;
//! - no deadlock: whenever nothing is in flight and no buffer is held, a
//!   side with queued data must be able to send (no waiting on a timer);
//! - once upper-layer traffic stops, each side sends at most two empty
//!   messages, and afterwards the idle connection exchanges only a
//!   keepalive and its answer per interval.
//!
//! The pseudo-random generator is SplitMix64, written here so that a seed
//! reproduces a run exactly on every platform.

use std::collections::{HashMap, VecDeque};

use smbdirect_protocol::smbd::credits::receive_buffers_required;
use smbdirect_protocol::smbd::wire::{
    DataTransfer, NegotiateResponse, SMB_DIRECT_RESPONSE_REQUESTED,
};
use smbdirect_protocol::smbd::{
    Connection, KeepaliveState, MessageData, Receive, ReceivePoster, SendError, SmbdConfig,
    TerminateReason, TransmitKind, MAX_HEADER_LEN, NEGOTIATE_RECEIVES,
};
use smbdirect_protocol::time::{Duration, Instant};

/// SplitMix64 (Steele, Lea, Flood 2014).
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
    /// True with probability `num/den`.
    fn chance(&mut self, num: u64, den: u64) -> bool {
        self.next() % den < num
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[(self.next() % xs.len() as u64) as usize]
    }
}

/// The bytes of upper-layer message `seq` sent by side `dir`: anyone can
/// recompute them, so the receiver checks content without trusting the
/// sender's buffers.
fn message_bytes(dir: usize, seq: u64, len: usize) -> Vec<u8> {
    let mut r = Rng((dir as u64) << 62 ^ seq.wrapping_mul(0x2545_F491_4F6C_DD1D));
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        v.extend_from_slice(&r.next().to_le_bytes());
    }
    v.truncate(len);
    v
}

/// The remote token (if any) sent with message `seq` of side `dir`.
fn message_token(dir: usize, seq: u64) -> Option<u32> {
    let h = Rng(seq ^ ((dir as u64) << 40) ^ 0x5EED).next();
    (h % 8 == 0).then_some((h >> 32) as u32)
}

/// One side's receive buffers as the queue pair and its buffer pool see
/// them: `posted` on the receive queue, `free` in the pool.
#[derive(Debug)]
struct RecvBuffers {
    free: u32,
    posted: u32,
}

impl ReceivePoster for RecvBuffers {
    fn post_receives(&mut self, want: u16) -> u16 {
        let n = (want as u32).min(self.free);
        self.free -= n;
        self.posted += n;
        n as u16
    }
}

#[derive(Debug)]
struct Frame {
    kind: TransmitKind,
    bytes: Vec<u8>,
    token: Option<u32>,
    ready_at: Instant,
}

/// One direction of the RC connection: in-order, reliable.
#[derive(Debug, Default)]
struct Link {
    frames: VecDeque<Frame>,
    paused_until: Instant,
}

/// Figures of one side, counted from the wire.
#[derive(Debug, Default, Clone, Copy)]
struct Figures {
    data_messages: u64,
    empty_messages: u64,
    keepalives: u64,
    payload_bytes: u64,
    upper_messages_delivered: u64,
    upper_bytes_delivered: u64,
    rnr_near_misses: u64,
    /// Idle timer expiries while this side was sending or receiving a
    /// fragmented message.
    idle_timer_mid_fragment: u64,
    /// Keepalives (SMB_DIRECT_RESPONSE_REQUESTED) carried on a non-final fragment.
    keepalive_on_fragment: u64,
}

#[derive(Debug)]
struct Side {
    conn: Connection,
    bufs: RecvBuffers,
    /// Buffers the upper layer still holds, returned to the pool at these instants.
    held: Vec<Instant>,
    /// Upper-layer messages to send in total.
    quota: u64,
    /// Upper-layer messages handed to `Connection::send`.
    submitted: u64,
    /// Bytes of messages queued in the connection, by handle (= sequence).
    queued: HashMap<u64, Vec<u8>>,
    /// Credits this side holds, computed from CreditsGranted on the wire
    /// minus the messages it sent: independent of `Connection`'s counters.
    credits_held: i64,
    /// Receive buffer size the peer sends into after negotiation.
    recv_buffer_len: usize,
    /// The last fragment sent was not its message's last.
    sending_partial: bool,
    /// The last fragment received was not its message's last.
    receiving_partial: bool,
    fig: Figures,
}

impl Side {
    fn new(conn: Connection, pool: u32, quota: u64) -> Self {
        let n = NEGOTIATE_RECEIVES as u32;
        Side {
            conn,
            bufs: RecvBuffers {
                free: pool - n,
                posted: n,
            },
            held: Vec::new(),
            quota,
            submitted: 0,
            queued: HashMap::new(),
            credits_held: 0,
            recv_buffer_len: 512,
            sending_partial: false,
            receiving_partial: false,
            fig: Figures::default(),
        }
    }
    fn check_receive_accounting(&self, name: &str) {
        assert_eq!(
            self.bufs.posted as u64,
            self.conn.credits().recv_posted as u64,
            "{name}: receives on the queue pair differ from Connection.ReceiveCredits"
        );
        // Every Data Transfer message sent spent one credit the peer
        // granted ([MS-SMBD] 3.1.5.1): the books balance at every step.
        let (st, cr) = (self.conn.stats(), self.conn.credits());
        assert_eq!(
            st.messages_sent + u64::from(cr.send_credits),
            st.credits_granted,
            "{name}: messages sent + send credits held != credits granted"
        );
    }
}

/// What one simulated run is made of.
#[derive(Debug, Clone)]
struct Scenario {
    seed: u64,
    cfg: [SmbdConfig; 2],
    pool: [u32; 2],
    quota: [u64; 2],
    /// Largest upper-layer message, capped for run time.
    max_message: u32,
    /// Return received buffers late, sometimes (exhausts the pool).
    hold_buffers: bool,
}

impl Scenario {
    fn random(seed: u64) -> Self {
        let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1CE);
        let mut cfg = || {
            let max_send_size = if r.chance(1, 2) {
                r.pick(&[128u32, 160, 256, 512, 1364])
            } else {
                r.range(128, 1364) as u32
            };
            SmbdConfig {
                receive_credit_max: r.pick(&[1u16, 2, 3, 10, 255]),
                send_credit_target: r.pick(&[1u16, 2, 3, 10, 255]),
                max_send_size,
                max_receive_size: r.pick(&[512u32, 1024, 8192]),
                max_fragmented_recv_size: r.pick(&[131_072u32, 1 << 20]),
                keepalive_interval: Duration::from_millis(r.range(1, 50)),
                send_queue_capacity: r.pick(&[1u16, 2, 8, 64]),
                ..SmbdConfig::default()
            }
        };
        let cfg = [cfg(), cfg()];
        for c in &cfg {
            c.validate().expect("scenario config is valid");
        }
        // Enough receive buffers for liveness (see `receive_buffers_required`),
        // sometimes with no slack at all.
        let pool = [0, 1].map(|i| {
            receive_buffers_required(cfg[i].receive_credit_max) + r.pick(&[0u32, 0, 1, 2, 16])
        });
        Scenario {
            seed,
            cfg,
            pool,
            quota: [r.range(100, 250), r.range(100, 250)],
            max_message: 131_072,
            hold_buffers: r.chance(1, 2),
        }
    }
}

const NAMES: [&str; 2] = ["active", "passive"];

struct Sim {
    sc: Scenario,
    rng: Rng,
    now: Instant,
    sides: [Side; 2],
    /// `links[i]` carries frames sent by side `i`.
    links: [Link; 2],
    /// Per direction: (sequence, length, token) of messages sent and not yet delivered.
    expected: [VecDeque<(u64, usize, Option<u32>)>; 2],
    header: [u8; MAX_HEADER_LEN],
    /// After traffic stops: empty messages sent without the keepalive flag.
    quiet_empties: [u64; 2],
    /// After traffic stops: keepalives received.
    quiet_keepalives_received: [u64; 2],
    traffic_stopped: bool,
    steps: u64,
}

impl Sim {
    fn new(sc: Scenario) -> Self {
        let now = Instant::from_nanos(1_000_000_000);
        let a = Connection::new_active(sc.cfg[0].clone(), now);
        let b = Connection::new_passive(sc.cfg[1].clone(), now);
        Sim {
            rng: Rng(sc.seed),
            now,
            sides: [
                Side::new(a, sc.pool[0], sc.quota[0]),
                Side::new(b, sc.pool[1], sc.quota[1]),
            ],
            links: [Link::default(), Link::default()],
            expected: [VecDeque::new(), VecDeque::new()],
            header: [0; MAX_HEADER_LEN],
            quiet_empties: [0; 2],
            quiet_keepalives_received: [0; 2],
            traffic_stopped: false,
            steps: 0,
            sc,
        }
    }

    fn ctx(&self) -> String {
        format!(
            "seed {} step {} t={}ns\n  active:  {:?} q={} ka={:?}\n  passive: {:?} q={} ka={:?}\n  cfg: {:?}",
            self.sc.seed,
            self.steps,
            self.now.as_nanos(),
            self.sides[0].conn.credits(),
            self.sides[0].conn.send_queue_len(),
            self.sides[0].conn.keepalive_state(),
            self.sides[1].conn.credits(),
            self.sides[1].conn.send_queue_len(),
            self.sides[1].conn.keepalive_state(),
            self.sc.cfg,
        )
    }

    /// Polls side `i` once; puts what it transmits on its link. Returns
    /// false when it had nothing to send.
    fn transmit(&mut self, i: usize) -> bool {
        let now = self.now;
        let side = &mut self.sides[i];
        // `transmit_pending` (the data plane's cheap pre-check) never hides
        // a transmit, and when it says nothing is pending, poll_transmit
        // changes nothing either (no receive posted, no stall counted).
        let pending = side.conn.transmit_pending();
        let before = (*side.conn.credits(), *side.conn.stats());
        let t = side
            .conn
            .poll_transmit(now, &mut side.bufs, &mut self.header);
        if !pending {
            assert!(
                t.is_none(),
                "{}: transmit_pending() was false but poll_transmit sent {t:?}",
                NAMES[i]
            );
            assert_eq!(
                (*side.conn.credits(), *side.conn.stats()),
                before,
                "{}: poll_transmit changed state although transmit_pending() was false",
                NAMES[i]
            );
        }
        side.check_receive_accounting(NAMES[i]);
        let Some(t) = t else { return false };
        let mut bytes = self.header[..t.header_len].to_vec();
        if let Some(p) = t.payload {
            let msg = side
                .queued
                .get(&p.handle)
                .unwrap_or_else(|| panic!("unknown handle {}", p.handle));
            bytes.extend_from_slice(&msg[p.offset as usize..(p.offset + p.len) as usize]);
            if p.last {
                side.queued.remove(&p.handle);
            }
            side.sending_partial = !p.last;
        }
        if t.kind == TransmitKind::DataTransfer {
            let v = DataTransfer::new_checked(&bytes[..]).expect("we emit at least 20 bytes");
            // 3.1.5.1, checked from the wire alone.
            let held = self.sides[i].credits_held;
            if held < 1 {
                panic!("{} sent without a send credit\n{}", NAMES[i], self.ctx());
            }
            if held == 1 && v.credits_granted() == 0 {
                panic!(
                    "{} spent its last credit without a grant\n{}",
                    NAMES[i],
                    self.ctx()
                );
            }
            let quiet = self.traffic_stopped;
            let side = &mut self.sides[i];
            side.credits_held -= 1;
            assert!(
                bytes.len() <= side.conn.params().max_send_size as usize,
                "longer than MaxSendSize"
            );
            let keepalive = v.flags() & SMB_DIRECT_RESPONSE_REQUESTED != 0;
            if v.data_length() == 0 {
                side.fig.empty_messages += 1;
                if quiet && !keepalive {
                    self.quiet_empties[i] += 1;
                }
            } else {
                side.fig.data_messages += 1;
                side.fig.payload_bytes += v.data_length() as u64;
                assert_eq!(v.data_offset(), 24, "3.1.5.4: DataOffset SHOULD be 24");
            }
            if keepalive {
                side.fig.keepalives += 1;
                if v.remaining_data_length() > 0 {
                    side.fig.keepalive_on_fragment += 1;
                }
            }
        }
        let delay = if self.rng.chance(1, 4) {
            Duration::from_micros(self.rng.range(0, 200))
        } else {
            Duration::ZERO
        };
        let link = &mut self.links[i];
        let ready_at = link
            .frames
            .back()
            .map_or(now + delay, |f| f.ready_at.max(now + delay));
        link.frames.push_back(Frame {
            kind: t.kind,
            bytes,
            token: t.invalidate_token,
            ready_at,
        });
        true
    }

    /// Delivers the next frame sent by side `from`, if it is due.
    fn deliver(&mut self, from: usize) -> bool {
        let now = self.now;
        let link = &mut self.links[from];
        if link.paused_until > now || link.frames.front().map_or(true, |f| f.ready_at > now) {
            return false;
        }
        let Some(frame) = link.frames.pop_front() else {
            return false;
        };
        let to = 1 - from;
        // The RC transport: no posted receive is RNR, a short buffer a length error.
        if self.sides[to].bufs.posted == 0 {
            panic!(
                "RNR: {} sent to {} with no receive posted\n{}",
                NAMES[from],
                NAMES[to],
                self.ctx()
            );
        }
        {
            let rx = &mut self.sides[to];
            if rx.bufs.posted == 1 {
                rx.fig.rnr_near_misses += 1;
            }
            rx.bufs.posted -= 1;
            let limit = if frame.kind == TransmitKind::DataTransfer {
                rx.recv_buffer_len
            } else {
                512
            };
            assert!(
                frame.bytes.len() <= limit,
                "{}-byte message into a {limit}-byte receive buffer",
                frame.bytes.len()
            );
        }
        match frame.kind {
            TransmitKind::DataTransfer => {
                let v = DataTransfer::new_checked(&frame.bytes[..]).expect("20 bytes");
                self.sides[to].credits_held += v.credits_granted() as i64;
                if v.data_length() > 0 {
                    self.sides[to].receiving_partial = v.remaining_data_length() > 0;
                }
                if self.traffic_stopped && v.flags() & SMB_DIRECT_RESPONSE_REQUESTED != 0 {
                    self.quiet_keepalives_received[to] += 1;
                }
            }
            TransmitKind::NegotiateResponse => {
                let v = NegotiateResponse::new_checked(&frame.bytes[..]).expect("32 bytes");
                self.sides[to].credits_held += v.credits_granted() as i64;
            }
            TransmitKind::NegotiateRequest => {}
        }
        let rx = &mut self.sides[to];
        let r = rx
            .conn
            .handle_receive(now, &frame.bytes, frame.token, &mut rx.bufs);
        rx.check_receive_accounting(NAMES[to]);
        let r = r.unwrap_or_else(|e| panic!("{} terminated: {e}\n{}", NAMES[to], self.ctx()));
        let rx = &mut self.sides[to];
        match r {
            Receive::Nothing => {}
            Receive::Established => {
                let rx = &mut self.sides[to];
                let p = *rx.conn.params();
                rx.recv_buffer_len = p.max_receive_size as usize;
            }
            Receive::NegotiationFailed(s) => panic!("negotiation failed: {s}"),
            Receive::Message {
                data,
                invalidated_token,
            } => {
                let got: Vec<u8> = match data {
                    MessageData::InPlace(r) => frame.bytes[r].to_vec(),
                    MessageData::Reassembled => rx.conn.reassembled().to_vec(),
                };
                let Some((seq, len, token)) = self.expected[from].pop_front() else {
                    panic!(
                        "{} delivered a message nobody sent\n{}",
                        NAMES[to],
                        self.ctx()
                    )
                };
                assert_eq!(got.len(), len, "message {seq} from {}: length", NAMES[from]);
                assert!(
                    got == message_bytes(from, seq, len),
                    "message {seq} from {}: content",
                    NAMES[from]
                );
                assert_eq!(
                    invalidated_token, token,
                    "message {seq} from {}: invalidated token",
                    NAMES[from]
                );
                let rx = &mut self.sides[to];
                rx.fig.upper_messages_delivered += 1;
                rx.fig.upper_bytes_delivered += len as u64;
            }
        }
        // The upper layer hands the buffer back now or a little later.
        let rx = &mut self.sides[to];
        if self.sc.hold_buffers && self.rng.chance(1, 3) {
            rx.held
                .push(now + Duration::from_micros(self.rng.range(1, 300)));
        } else {
            rx.bufs.free += 1;
        }
        true
    }

    fn submit(&mut self, i: usize) {
        let max_seg = (self.sides[i].conn.params().max_send_size - 24) as u64;
        let side = &mut self.sides[i];
        if !side.conn.is_established()
            || side.submitted == side.quota
            || side.conn.send_queue_space() == 0
        {
            return;
        }
        let limit = (side
            .conn
            .params()
            .max_fragmented_send_size
            .min(self.sc.max_message)) as u64;
        let len = match self.rng.range(0, 99) {
            0..=49 => self.rng.range(1, 2 * max_seg),
            50..=79 => self.rng.range(1, 8192),
            80..=96 => self.rng.range(1, 32768),
            _ => {
                if self.rng.chance(1, 2) {
                    limit
                } else {
                    self.rng.range(1, limit)
                }
            }
        }
        .min(limit);
        let seq = side.submitted;
        let token = message_token(i, seq);
        match side.conn.send(seq, len as u32, token) {
            Ok(()) => {
                side.queued.insert(seq, message_bytes(i, seq, len as usize));
                side.submitted += 1;
                self.expected[i].push_back((seq, len as usize, token));
            }
            Err(SendError::QueueFull) => {}
            Err(e) => panic!("send refused: {e}"),
        }
    }

    fn return_held(&mut self) {
        let now = self.now;
        for s in &mut self.sides {
            let before = s.held.len();
            s.held.retain(|&t| t > now);
            s.bufs.free += (before - s.held.len()) as u32;
        }
    }

    fn timers(&mut self) {
        for (i, name) in NAMES.iter().enumerate() {
            let now = self.now;
            let side = &mut self.sides[i];
            if side.conn.poll_timeout().is_some_and(|t| now >= t) {
                let before = side.conn.keepalive_state();
                if let Err(e) = side.conn.handle_timeout(now) {
                    panic!("{name} terminated by a timer: {e}\n{}", self.ctx());
                }
                let side = &mut self.sides[i];
                if before == KeepaliveState::None
                    && side.conn.keepalive_state() == KeepaliveState::Pending
                    && (side.sending_partial || side.receiving_partial)
                {
                    side.fig.idle_timer_mid_fragment += 1;
                }
            }
        }
    }

    fn nothing_in_flight(&self) -> bool {
        self.links.iter().all(|l| l.frames.is_empty())
            && self.sides.iter().all(|s| s.held.is_empty())
    }

    /// No deadlock: with nothing in flight and no buffer held, nobody will
    /// ever send again without a timer, so no data may be left queued.
    fn check_progress(&mut self) {
        if !self.nothing_in_flight() {
            return;
        }
        let a = self.transmit(0);
        let b = self.transmit(1);
        if a || b {
            return;
        }
        for (i, s) in self.sides.iter().enumerate() {
            assert!(
                s.conn.send_queue_len() == 0,
                "deadlock: {} has {} queued messages and nothing is in flight\n{}",
                NAMES[i],
                s.conn.send_queue_len(),
                self.ctx()
            );
        }
    }

    fn traffic_done(&self) -> bool {
        self.sides
            .iter()
            .all(|s| s.submitted == s.quota && s.queued.is_empty())
    }

    fn all_delivered(&self) -> bool {
        self.traffic_done() && self.expected.iter().all(|e| e.is_empty())
    }

    /// Negotiation, then traffic until every message is delivered.
    fn run_traffic(&mut self, max_steps: u64) {
        while !self.all_delivered() {
            self.steps += 1;
            assert!(
                self.steps <= max_steps,
                "no completion within {max_steps} steps\n{}",
                self.ctx()
            );
            let interval = self.sc.cfg[0]
                .keepalive_interval
                .as_nanos()
                .min(self.sc.cfg[1].keepalive_interval.as_nanos());
            // Time.
            let dt = if self.rng.chance(1, 400) {
                Duration::from_nanos(self.rng.range(0, 2 * interval))
            } else {
                Duration::from_micros(self.rng.range(0, 40))
            };
            self.now = self.now + dt;
            if self.rng.chance(1, 300) {
                // Pause one direction for up to four keepalive intervals
                // (well within the 5 s keepalive response time).
                let d = self.rng.range(0, 1) as usize;
                self.links[d].paused_until =
                    self.now + Duration::from_nanos(self.rng.range(interval / 2, 4 * interval));
            }
            self.timers();
            self.return_held();
            for i in 0..2 {
                let n = self.rng.range(0, 2);
                for _ in 0..n {
                    self.submit(i);
                }
            }
            let first = self.rng.range(0, 1) as usize;
            for i in [first, 1 - first] {
                for _ in 0..self.rng.range(0, 4) {
                    if !self.transmit(i) {
                        break;
                    }
                }
                for _ in 0..self.rng.range(0, 4) {
                    if !self.deliver(i) {
                        break;
                    }
                }
            }
            if !self.traffic_stopped && self.traffic_done() {
                self.traffic_stopped = true;
            }
            self.check_progress();
        }
    }

    /// Runs without advancing timers until nothing moves; returns the
    /// number of messages sent per side. Fails on an endless exchange.
    fn settle(&mut self) -> [u64; 2] {
        let before = [self.sides[0].fig, self.sides[1].fig];
        for _ in 0..64 {
            self.now = self.now + Duration::from_micros(1);
            for l in &mut self.links {
                l.paused_until = Instant::ZERO;
                if let Some(f) = l.frames.back() {
                    // Everything in flight is now due.
                    let due = f.ready_at;
                    if due > self.now {
                        self.now = due;
                    }
                }
            }
            for side in &mut self.sides {
                side.bufs.free += side.held.len() as u32;
                side.held.clear();
            }
            let mut moved = false;
            for i in 0..2 {
                while self.transmit(i) {
                    moved = true;
                }
                while self.deliver(i) {
                    moved = true;
                }
            }
            if !moved && self.nothing_in_flight() {
                let f = [self.sides[0].fig, self.sides[1].fig];
                return [0, 1].map(|i| {
                    (f[i].data_messages + f[i].empty_messages)
                        - (before[i].data_messages + before[i].empty_messages)
                });
            }
        }
        panic!(
            "messages keep flowing on an idle connection (ping-pong)\n{}",
            self.ctx()
        );
    }
}

#[derive(Debug, Default)]
struct Totals {
    runs: u64,
    upper_messages: u64,
    upper_bytes: u64,
    data_messages: [u64; 2],
    empty_messages: [u64; 2],
    keepalives: [u64; 2],
    max_quiet_empties: [u64; 2],
    rnr_near_misses: u64,
    idle_timer_mid_fragment: u64,
    keepalive_on_fragment: u64,
}

/// One full run: negotiation, two-way traffic with timers firing, the quiet
/// period, then keepalive rounds on the idle connection.
fn run(sc: Scenario, totals: &mut Totals) {
    let mut sim = Sim::new(sc);
    sim.run_traffic(3_000_000);
    for s in &sim.sides {
        assert!(s.conn.is_established());
    }
    // Traffic has stopped: everything settles with a bounded number of
    // empty messages (keepalive answers aside).
    sim.settle();
    for (i, name) in NAMES.iter().enumerate() {
        let allowed = 2 + sim.quiet_keepalives_received[i];
        assert!(
            sim.quiet_empties[i] <= allowed,
            "{name} sent {} empty messages after traffic stopped (allowed {allowed})\n{}",
            sim.quiet_empties[i],
            sim.ctx()
        );
        let unprompted = sim.quiet_empties[i].saturating_sub(sim.quiet_keepalives_received[i]);
        totals.max_quiet_empties[i] = totals.max_quiet_empties[i].max(unprompted);
    }
    // Idle: each keepalive interval costs one keepalive and its answer (two
    // when both timers fire at once), plus at most one grant per side.
    for round in 0..6 {
        let next = [0, 1].map(|i| sim.sides[i].conn.poll_timeout().expect("idle timer armed"));
        sim.now = next[0].min(next[1]);
        let ka_before = [sim.sides[0].fig.keepalives, sim.sides[1].fig.keepalives];
        sim.timers();
        let sent = sim.settle();
        let kas = (sim.sides[0].fig.keepalives - ka_before[0])
            + (sim.sides[1].fig.keepalives - ka_before[1]);
        assert!(
            (1..=2).contains(&kas),
            "round {round}: {kas} keepalives\n{}",
            sim.ctx()
        );
        assert!(
            sent[0] + sent[1] <= 2 * kas + 2,
            "round {round}: {sent:?} messages for {kas} keepalive(s)\n{}",
            sim.ctx()
        );
        for s in &sim.sides {
            assert!(s.conn.is_established());
            assert_eq!(
                s.conn.keepalive_state(),
                KeepaliveState::None,
                "keepalive answered"
            );
        }
    }
    totals.runs += 1;
    for i in 0..2 {
        let f = sim.sides[i].fig;
        totals.upper_messages += f.upper_messages_delivered;
        totals.upper_bytes += f.upper_bytes_delivered;
        totals.data_messages[i] += f.data_messages;
        totals.empty_messages[i] += f.empty_messages;
        totals.keepalives[i] += f.keepalives;
        totals.rnr_near_misses += f.rnr_near_misses;
        totals.idle_timer_mid_fragment += f.idle_timer_mid_fragment;
        totals.keepalive_on_fragment += f.keepalive_on_fragment;
        assert_eq!(f.upper_messages_delivered, sim.sc.quota[1 - i]);
    }
}

fn report(name: &str, t: &Totals) {
    println!(
        "{name}: {} runs, {} upper-layer messages ({} bytes) delivered; data messages active/passive {}/{}, \
         empty {}/{}, keepalives {}/{}; worst empties after traffic stopped (keepalive answers aside) {}/{}; \
         deliveries into the last posted receive {}; idle timer fired mid-fragment {} times, \
         keepalives riding on a non-final fragment {}",
        t.runs,
        t.upper_messages,
        t.upper_bytes,
        t.data_messages[0],
        t.data_messages[1],
        t.empty_messages[0],
        t.empty_messages[1],
        t.keepalives[0],
        t.keepalives[1],
        t.max_quiet_empties[0],
        t.max_quiet_empties[1],
        t.rnr_near_misses,
        t.idle_timer_mid_fragment,
        t.keepalive_on_fragment,
    );
}

#[test]
fn random_two_way_traffic_is_delivered_in_order_without_rnr_or_deadlock() {
    let mut t = Totals::default();
    // SMBD_SIM_SEEDS=1000 runs a longer soak with the same checks.
    let seeds = std::env::var("SMBD_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(24u64);
    for seed in 1..=seeds {
        run(Scenario::random(seed), &mut t);
    }
    report("random configurations", &t);
    assert!(
        t.idle_timer_mid_fragment > 0,
        "idle timers must fire in the middle of fragmented messages"
    );
    assert!(
        t.keepalive_on_fragment > 0,
        "keepalives must ride on non-final fragments"
    );
}

#[test]
fn credit_targets_of_one_on_both_sides_neither_deadlock_nor_ping_pong() {
    let mut t = Totals::default();
    for seed in 100..106 {
        let mut sc = Scenario::random(seed);
        for c in &mut sc.cfg {
            c.send_credit_target = 1;
        }
        sc.cfg[(seed % 2) as usize].receive_credit_max = 1;
        run(sc, &mut t);
    }
    report("credit targets 1/1", &t);
}

#[test]
fn windows_defaults_with_held_receive_buffers_exhaust_the_pool_and_recover() {
    let mut t = Totals::default();
    for seed in 200..206 {
        let mut sc = Scenario::random(seed);
        sc.cfg = [SmbdConfig::default(), SmbdConfig::default()];
        for c in &mut sc.cfg {
            c.keepalive_interval = Duration::from_millis(5);
        }
        // Exactly what a connection can have posted: every buffer the upper
        // layer holds leaves the pool short until it comes back.
        sc.pool = [receive_buffers_required(255), receive_buffers_required(255)];
        sc.hold_buffers = true;
        // Messages up to the full 1 MiB MaxFragmentedSize.
        sc.max_message = u32::MAX;
        run(sc, &mut t);
    }
    report("defaults, pools of ReceiveCreditMax + 1, buffers held", &t);
}

#[test]
fn mixed_credit_targets_and_send_sizes_on_either_side() {
    let mut t = Totals::default();
    let targets = [
        (1u16, 255u16),
        (255, 1),
        (2, 3),
        (3, 10),
        (10, 2),
        (255, 255),
    ];
    for (k, &(ta, tb)) in targets.iter().enumerate() {
        let mut sc = Scenario::random(300 + k as u64);
        sc.cfg[0].send_credit_target = ta;
        sc.cfg[1].send_credit_target = tb;
        sc.cfg[0].max_send_size = 128;
        sc.cfg[1].max_send_size = 1364;
        run(sc, &mut t);
    }
    report("mixed targets", &t);
}

// ---------------------------------------------------------------------------
// Keepalive scenarios on an idle connection ([MS-SMBD] 3.1.6.2).
// ---------------------------------------------------------------------------

fn idle_pair(seed: u64) -> Sim {
    let mut sc = Scenario::random(seed);
    sc.quota = [0, 0];
    for c in &mut sc.cfg {
        c.keepalive_interval = Duration::from_secs(120);
        c.keepalive_response_timeout = Duration::from_secs(5);
    }
    let mut sim = Sim::new(sc);
    sim.run_traffic(10_000);
    sim.settle();
    sim
}

#[test]
fn idle_connection_with_answering_peer_stays_up_across_keepalive_intervals() {
    let mut sim = idle_pair(7);
    let start = sim.now;
    for _ in 0..10 {
        let next = [0, 1].map(|i| sim.sides[i].conn.poll_timeout().expect("idle timer"));
        assert!(
            next[0].min(next[1]) >= sim.now + Duration::from_secs(119),
            "fires after the idle interval"
        );
        sim.now = next[0].min(next[1]);
        sim.timers();
        sim.settle();
    }
    assert!(sim.now - start >= Duration::from_secs(1190));
    for s in &sim.sides {
        assert!(s.conn.is_established());
    }
    let kas = sim.sides[0].fig.keepalives + sim.sides[1].fig.keepalives;
    assert!((10..=20).contains(&kas), "{kas} keepalives in 10 intervals");
    println!(
        "idle 10 intervals: keepalives {}/{}, empty messages {}/{}",
        sim.sides[0].fig.keepalives,
        sim.sides[1].fig.keepalives,
        sim.sides[0].fig.empty_messages,
        sim.sides[1].fig.empty_messages
    );
}

#[test]
fn silent_peer_is_terminated_by_keepalive_timeout() {
    for silent in 0..2 {
        let mut sim = idle_pair(11 + silent as u64);
        let live = 1 - silent;
        let t0 = sim.sides[live].conn.poll_timeout().expect("idle timer");
        // The silent side's transport swallows everything from now on.
        sim.now = t0;
        sim.sides[live]
            .conn
            .handle_timeout(sim.now)
            .expect("first expiry sends a keepalive");
        assert_eq!(
            sim.sides[live].conn.keepalive_state(),
            KeepaliveState::Pending
        );
        assert!(sim.transmit(live), "keepalive sent");
        assert_eq!(sim.sides[live].conn.keepalive_state(), KeepaliveState::Sent);
        sim.links[live].frames.clear();
        let deadline = sim.sides[live].conn.poll_timeout().expect("response timer");
        assert_eq!(
            deadline,
            t0 + Duration::from_secs(5),
            "note <3>: 5 s to answer"
        );
        assert_eq!(
            sim.sides[live].conn.handle_timeout(deadline),
            Err(TerminateReason::KeepaliveTimeout)
        );
        assert_eq!(
            sim.sides[live].conn.terminated(),
            Some(TerminateReason::KeepaliveTimeout)
        );
        assert_eq!(sim.sides[live].conn.poll_timeout(), None);
    }
}
