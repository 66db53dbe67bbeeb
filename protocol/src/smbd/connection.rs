//! The SMB Direct connection as one sans-IO state machine ([MS-SMBD]
//! 3.1.1–3.1.7), quinn-proto style: the caller feeds received messages
//! ([`Connection::handle_receive`]), upper-layer sends ([`Connection::send`])
//! and time ([`Connection::handle_timeout`]), and drains what must go on the
//! wire ([`Connection::poll_transmit`]). It never touches a queue pair and
//! never reads a clock. Receives are posted through a [`ReceivePoster`]
//! because [MS-SMBD] 3.1.5.9 needs to know synchronously how many were
//! posted.
//!
//! Invariants (pinned by `protocol/tests/smbd_simulation.rs`):
//! - no message is ever transmitted without a send credit;
//! - the last send credit is never spent without granting the peer at least
//!   one credit back (3.1.5.1), so both sides can never sit at zero credits;
//!   and the peer is left holding at least two, so that the grant it owes us
//!   in return is not its own last credit (otherwise two peers holding one
//!   credit each exchange grant-only messages forever);
//! - a peer left with no credits is granted some as soon as we hold a send
//!   credit and a receive buffer;
//! - empty credit-only messages are sent only when the peer's credits are
//!   exhausted, or when the peer sent data and is at or below half its
//!   target: once upper-layer traffic stops, each side sends at most two
//!   empty messages until the keepalive fires;
//! - no deadlock, provided the [`ReceivePoster`] can post
//!   [`receive_buffers_required`](super::credits::receive_buffers_required)
//!   receives beyond those the upper layer still holds: with fewer, a sender
//!   at its last credit may have nothing left to grant and must wait for the
//!   peer's keepalive;
//! - an empty message never interleaves with a fragmented message: the
//!   send queue is strictly FIFO and control information (grants, flags)
//!   rides on the next fragment instead.

use super::config::{
    SmbdConfig, DATA_TRANSFER_HEADER_LEN, DATA_TRANSFER_PAYLOAD_OFFSET, SMBD_VERSION_1,
};
use super::credits::{Credits, ReceivePoster};
use super::negotiation::{
    evaluate_negotiate_request, evaluate_negotiate_response, negotiate_request_for,
    negotiate_response_for, NegotiateDecision, NegotiatedParams,
};
use super::reassembly::{Fragment, Reassembly};
use super::send_queue::{QueuedMessage, SendQueue};
use super::terminate::TerminateReason;
use super::wire::{
    DataTransfer, DataTransferRepr, NegotiateResponseRepr, PayloadError,
    SMB_DIRECT_RESPONSE_REQUESTED,
};
use crate::ntstatus::{self, NtStatus};
use crate::time::Instant;

/// Connection.Role ([MS-SMBD] 3.1.1.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// We initiated; a Negotiate Response is expected.
    Active,
    /// We accepted; a Negotiate Request is expected.
    Passive,
    /// Negotiation is complete; Data Transfer messages flow.
    Established,
}

/// Connection.KeepaliveRequested ([MS-SMBD] 3.1.1.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepaliveState {
    /// No keepalive outstanding.
    None,
    /// The idle timer fired; the next message carries SMB_DIRECT_RESPONSE_REQUESTED.
    Pending,
    /// A message with SMB_DIRECT_RESPONSE_REQUESTED was sent; awaiting any message.
    Sent,
}

/// Largest header [`Connection::poll_transmit`] writes (a Negotiate Response).
pub const MAX_HEADER_LEN: usize = 32;

/// Number of receive buffers (each at least 512 bytes) the caller posts
/// before connecting or accepting ([MS-SMBD] 3.1.4.1, 3.1.7.2).
pub const NEGOTIATE_RECEIVES: u16 = 1;

/// What a received message meant for the upper layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Receive {
    /// Nothing to deliver (credit-only, keepalive, or a non-final fragment).
    Nothing,
    /// Negotiation completed and the connection is ESTABLISHED (on the
    /// passive side the success response is queued for transmission).
    Established,
    /// The passive side refused the negotiation: a failure response is
    /// queued; transmit it, then disconnect ([MS-SMBD] 3.1.5.3).
    NegotiationFailed(NtStatus),
    /// A complete upper-layer message.
    Message {
        /// Where the bytes are.
        data: MessageData,
        /// Connection.InvalidatedToken, passed up with the message and
        /// cleared ([MS-SMBD] 3.1.5.8).
        invalidated_token: Option<u32>,
    },
}

/// Where a delivered message's bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageData {
    /// Unfragmented: this byte range of the receive buffer just handled
    /// (zero-copy).
    InPlace(core::ops::Range<usize>),
    /// Reassembled from fragments: read [`Connection::reassembled`] before
    /// the next call to `handle_receive`.
    Reassembled,
}

/// What kind of message a [`Transmit`] carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransmitKind {
    /// [MS-SMBD] 2.2.1 (20 bytes, all in the header buffer).
    NegotiateRequest,
    /// [MS-SMBD] 2.2.2 (32 bytes, all in the header buffer).
    NegotiateResponse,
    /// [MS-SMBD] 2.2.3.
    DataTransfer,
}

/// A slice of a queued upper-layer message to place after the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayloadSlice {
    /// The handle given to [`Connection::send`] / [`Connection::send_at`].
    pub handle: u64,
    /// Offset into the handle's bytes (the message's `offset` given to
    /// [`Connection::send_at`] plus the bytes of earlier segments).
    pub offset: u32,
    /// Bytes.
    pub len: u32,
    /// True for the message's final segment: once this send completes, the
    /// caller may release the message's bytes.
    pub last: bool,
}

/// One message to post as an RDMA Send: `header_len` bytes written into the
/// caller's header buffer, followed by `payload` (if any).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Message type.
    pub kind: TransmitKind,
    /// Header bytes written (20, 24 or 32).
    pub header_len: usize,
    /// Upper-layer bytes following the header.
    pub payload: Option<PayloadSlice>,
    /// Remote token to invalidate with this send (Send with Invalidate).
    pub invalidate_token: Option<u32>,
    /// Disconnect once this send completes (failure negotiate response).
    pub disconnect_after: bool,
    /// CreditsGranted carried (0 for negotiate request).
    pub credits_granted: u16,
}

impl Transmit {
    /// Total message length.
    pub fn len(&self) -> usize {
        self.header_len + self.payload.map_or(0, |p| p.len as usize)
    }
    /// True for a Data Transfer message without payload.
    pub fn is_empty(&self) -> bool {
        self.kind == TransmitKind::DataTransfer && self.payload.is_none()
    }
}

/// Why an upper-layer send was refused (3.1.4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendError {
    /// Not ESTABLISHED (or already terminated).
    NotEstablished,
    /// Zero-length message.
    Empty,
    /// Longer than Connection.MaxFragmentedSendSize.
    TooLarge {
        /// Requested length.
        len: u32,
        /// The peer's limit.
        max: u32,
    },
    /// The send queue is full: retry after transmits complete.
    QueueFull,
}

impl core::fmt::Display for SendError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SendError::NotEstablished => f.write_str("connection not established"),
            SendError::Empty => f.write_str("empty upper-layer message"),
            SendError::TooLarge { len, max } => {
                write!(f, "message of {len} bytes exceeds the peer's MaxFragmentedSize {max} ([MS-SMBD] 3.1.4.2)")
            }
            SendError::QueueFull => f.write_str("send queue full"),
        }
    }
}

impl std::error::Error for SendError {}

/// Counters for stats and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnectionStats {
    /// Data Transfer messages sent.
    pub messages_sent: u64,
    /// Of which carried no payload.
    pub empty_sent: u64,
    /// Data Transfer messages received.
    pub messages_received: u64,
    /// Of which carried no payload.
    pub empty_received: u64,
    /// Upper-layer payload bytes sent.
    pub bytes_sent: u64,
    /// Upper-layer payload bytes received.
    pub bytes_received: u64,
    /// Upper-layer messages delivered.
    pub messages_delivered: u64,
    /// Times a transmit was held back for lack of a send credit.
    pub credit_stalls: u64,
    /// Keepalive requests sent.
    pub keepalives_sent: u64,
    /// Keepalive requests received.
    pub keepalives_received: u64,
    /// Send credits the peer granted in all: the Negotiate Response's
    /// CreditsGranted plus every Data Transfer message's ([MS-SMBD]
    /// 3.1.5.7, 3.1.5.8). Every Data Transfer message sent spends one
    /// (3.1.5.1), so `messages_sent + send_credits == credits_granted`
    /// unless the peer granted beyond 65535 held credits (the soak test
    /// checks this continuously).
    pub credits_granted: u64,
}

#[derive(Debug, Clone, Copy)]
enum Control {
    Request,
    Response(NegotiateResponseRepr, bool),
}

/// One SMB Direct connection.
#[derive(Debug)]
pub struct Connection {
    cfg: SmbdConfig,
    role: Role,
    params: NegotiatedParams,
    credits: Credits,
    send_queue: SendQueue,
    reassembly: Reassembly,
    invalidated_token: Option<u32>,
    keepalive: KeepaliveState,
    send_immediate: bool,
    grant_wanted: bool,
    negotiation_deadline: Option<Instant>,
    idle_deadline: Option<Instant>,
    control: Option<Control>,
    terminated: Option<TerminateReason>,
    stats: ConnectionStats,
}

impl Connection {
    fn new(cfg: SmbdConfig, role: Role, deadline: Instant) -> Self {
        let params = NegotiatedParams {
            protocol: 0,
            max_send_size: cfg.max_send_size,
            max_receive_size: cfg.max_receive_size,
            max_fragmented_send_size: 0,
            max_fragmented_recv_size: cfg.max_fragmented_recv_size,
            // 3.1.4.1: "Set Connection.MaxReadWriteSize to 0" (active);
            // 3.1.7.2 initialises it (passive).
            max_read_write_size: if role == Role::Active {
                0
            } else {
                cfg.max_read_write_size
            },
            receive_credit_target: 0,
            initial_send_credits: 0,
        };
        let credits = Credits {
            send_credit_target: cfg.send_credit_target,
            receive_credit_max: cfg.receive_credit_max,
            recv_posted: NEGOTIATE_RECEIVES,
            ..Credits::default()
        };
        Connection {
            send_queue: SendQueue::with_capacity(cfg.send_queue_capacity as usize),
            cfg,
            role,
            params,
            credits,
            reassembly: Reassembly::new(),
            invalidated_token: None,
            keepalive: KeepaliveState::None,
            send_immediate: false,
            grant_wanted: false,
            negotiation_deadline: Some(deadline),
            idle_deadline: None,
            control: None,
            terminated: None,
            stats: ConnectionStats::default(),
        }
    }

    /// [MS-SMBD] 3.1.4.1: a connection we initiate. The caller has posted
    /// [`NEGOTIATE_RECEIVES`] receive (≥ 512 bytes) and, once the transport
    /// connects, transmits the Negotiate Request from `poll_transmit`.
    /// Starts the 120 s Negotiation Timer.
    pub fn new_active(cfg: SmbdConfig, now: Instant) -> Self {
        let deadline = now + cfg.negotiate_timeout_active;
        let mut c = Self::new(cfg, Role::Active, deadline);
        c.control = Some(Control::Request);
        c
    }

    /// [MS-SMBD] 3.1.7.2: a connection that arrived at our listener. The
    /// caller has posted [`NEGOTIATE_RECEIVES`] receive. Starts the 5 s
    /// Negotiation Timer.
    pub fn new_passive(cfg: SmbdConfig, now: Instant) -> Self {
        let deadline = now + cfg.negotiate_timeout_passive;
        Self::new(cfg, Role::Passive, deadline)
    }

    /// Connection.Role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// True once ESTABLISHED and not terminated.
    pub fn is_established(&self) -> bool {
        self.role == Role::Established && self.terminated.is_none()
    }

    /// Why the connection ended, once it has.
    pub fn terminated(&self) -> Option<TerminateReason> {
        self.terminated
    }

    /// The negotiated parameters (3.1.4.7 Query Connection Parameters).
    pub fn params(&self) -> &NegotiatedParams {
        &self.params
    }

    /// The configuration this connection started with.
    pub fn config(&self) -> &SmbdConfig {
        &self.cfg
    }

    /// Credit state (for stats and invariant checks).
    pub fn credits(&self) -> &Credits {
        &self.credits
    }

    /// Connection.KeepaliveRequested.
    pub fn keepalive_state(&self) -> KeepaliveState {
        self.keepalive
    }

    /// Counters.
    pub fn stats(&self) -> &ConnectionStats {
        &self.stats
    }

    /// Messages waiting in Connection.SendQueue.
    pub fn send_queue_len(&self) -> usize {
        self.send_queue.len()
    }

    /// Free slots in the send queue.
    pub fn send_queue_space(&self) -> usize {
        self.send_queue.capacity() - self.send_queue.len()
    }

    /// Bytes parked in the reassembly buffer.
    pub fn reassembly_buffered(&self) -> usize {
        self.reassembly.buffered()
    }

    /// The message completed by the last `handle_receive` that returned
    /// [`MessageData::Reassembled`].
    pub fn reassembled(&self) -> &[u8] {
        self.reassembly.message()
    }

    fn terminate(&mut self, reason: TerminateReason) -> TerminateReason {
        if self.terminated.is_none() {
            self.terminated = Some(reason);
        }
        self.negotiation_deadline = None;
        self.idle_deadline = None;
        self.reassembly.reset();
        reason
    }

    /// [MS-SMBD] 3.1.7.1: the provider reported connection loss.
    pub fn handle_connection_lost(&mut self) {
        self.terminate(TerminateReason::ConnectionLost);
    }

    /// The upper layer closes the connection.
    pub fn close(&mut self) {
        self.terminate(TerminateReason::LocalClose);
    }

    /// Empties the send queue after termination, yielding each message so
    /// its bytes can be released.
    pub fn drain_send_queue(&mut self) -> impl Iterator<Item = QueuedMessage> + '_ {
        self.send_queue.drain()
    }

    /// [MS-SMBD] 3.1.4.2 / 3.1.5.1: queue an upper-layer message of `len`
    /// bytes, named by `handle`, with an optional remote token to
    /// invalidate. Transmission happens through `poll_transmit`.
    pub fn send(
        &mut self,
        handle: u64,
        len: u32,
        invalidate_token: Option<u32>,
    ) -> Result<(), SendError> {
        self.send_at(handle, 0, len, invalidate_token)
    }

    /// [`Connection::send`] of a message lying `offset` bytes into the
    /// bytes `handle` names (e.g. a received message answered from its own
    /// receive buffer): every [`PayloadSlice`] of it is offset accordingly.
    pub fn send_at(
        &mut self,
        handle: u64,
        offset: u32,
        len: u32,
        invalidate_token: Option<u32>,
    ) -> Result<(), SendError> {
        self.queue(handle, offset, len, invalidate_token, false)
    }

    /// [`Connection::send_at`] of a message whose handle's bytes have room
    /// for a header before it: the [`DATA_TRANSFER_PAYLOAD_OFFSET`] bytes
    /// before `offset` are the caller's scratch (e.g. the header of the
    /// received message it answers in place). A message sent whole (one
    /// segment, [MS-SMBD] 3.1.5.1) may then be posted as one contiguous
    /// Send, header and payload, without a separate header buffer: see
    /// [`Connection::next_in_place`]. On the wire nothing differs.
    pub fn send_with_header_room(
        &mut self,
        handle: u64,
        offset: u32,
        len: u32,
        invalidate_token: Option<u32>,
    ) -> Result<(), SendError> {
        let room = offset as usize >= DATA_TRANSFER_PAYLOAD_OFFSET;
        self.queue(handle, offset, len, invalidate_token, room)
    }

    fn queue(
        &mut self,
        handle: u64,
        offset: u32,
        len: u32,
        invalidate_token: Option<u32>,
        header_room: bool,
    ) -> Result<(), SendError> {
        if !self.is_established() {
            return Err(SendError::NotEstablished);
        }
        if len == 0 {
            return Err(SendError::Empty);
        }
        if len > self.params.max_fragmented_send_size {
            return Err(SendError::TooLarge {
                len,
                max: self.params.max_fragmented_send_size,
            });
        }
        if offset.checked_add(len).is_none() {
            return Err(SendError::TooLarge {
                len,
                max: u32::MAX - offset,
            });
        }
        self.send_queue
            .push(QueuedMessage {
                handle,
                base: offset,
                len,
                sent: 0,
                invalidate_token,
                header_room,
            })
            .map_err(|_| SendError::QueueFull)
    }

    /// The payload of the next Data Transfer message when it will carry a
    /// whole upper-layer message queued by
    /// [`Connection::send_with_header_room`]: no control message goes
    /// first, the message is at the front of the send queue, nothing of it
    /// is sent yet and it fits one segment (MaxSendSize - 24, [MS-SMBD]
    /// 3.1.5.1). Then, if [`Connection::poll_transmit`] returns a message
    /// now, it carries exactly this payload at DataOffset
    /// [`DATA_TRANSFER_PAYLOAD_OFFSET`] and writes a header of exactly that
    /// many bytes: the caller may hand it the header room (the bytes before
    /// `offset`, through the end of the handle's bytes) as its header
    /// buffer and post header and payload as one contiguous Send. `None`
    /// otherwise (the general path: a separate header buffer).
    #[inline]
    pub fn next_in_place(&self) -> Option<PayloadSlice> {
        if self.control.is_some() || self.terminated.is_some() || self.role != Role::Established {
            return None;
        }
        let m = self.send_queue.front()?;
        if !m.header_room || m.sent != 0 || m.len > self.max_segment() {
            return None;
        }
        Some(PayloadSlice {
            handle: m.handle,
            offset: m.base,
            len: m.len,
            last: true,
        })
    }

    /// [MS-SMBD] 3.1.5.1 without the send queue, for the common case: a
    /// whole upper-layer message of `len` bytes (one segment) that may go
    /// out right now. When it may, this does exactly what
    /// [`Connection::send_at`] followed by [`Connection::poll_transmit`]
    /// would (3.1.5.9 credit processing, the grant, one send credit spent,
    /// the 24-byte Data Transfer header with DataOffset 24 written into
    /// `header`) and returns the credits granted; the caller posts header
    /// and payload as one Send. `None`, with nothing changed, when the
    /// general path is needed: not established, a control message or a
    /// queued message goes first, a keepalive request is due, the message
    /// needs fragments, or this would spend the last send credit (3.1.5.1's
    /// rule for that one lives in `poll_transmit`).
    #[inline]
    pub fn transmit_now<P: ReceivePoster + ?Sized>(
        &mut self,
        poster: &mut P,
        len: u32,
        header: &mut [u8; DATA_TRANSFER_PAYLOAD_OFFSET],
    ) -> Option<u16> {
        if self.role != Role::Established
            || self.control.is_some()
            || self.terminated.is_some()
            || !self.send_queue.is_empty()
            || self.keepalive == KeepaliveState::Pending
            || len == 0
            || len > self.max_segment()
            || self.credits.send_credits < 2
        {
            return None;
        }
        self.credits.top_up(poster, false);
        let grant = self.spend_send_credit();
        self.stats.bytes_sent += u64::from(len);
        // [MS-SMBD] 2.2.3 / 3.1.5.4: the header poll_transmit would write.
        *header =
            DataTransferRepr::whole_message_header(self.credits.send_credit_target, grant, len);
        Some(grant)
    }

    /// [MS-SMBD] 3.1.5.1 for the Data Transfer message about to go (its
    /// credit checks passed, its receives topped up): the receives posted
    /// since the last grant are granted (3.1.5.9), one send credit is
    /// spent, SendImmediate is cleared. Returns CreditsGranted.
    #[inline]
    fn spend_send_credit(&mut self) -> u16 {
        let grant = self.credits.take_grant();
        self.credits.send_credits -= 1;
        if grant > 0 {
            self.grant_wanted = false;
        }
        self.send_immediate = false;
        self.stats.messages_sent += 1;
        grant
    }

    /// The most payload one Data Transfer message carries ([MS-SMBD]
    /// 3.1.5.1: MaxSendSize less the header and its padding).
    #[inline]
    fn max_segment(&self) -> u32 {
        (self.params.max_send_size as usize)
            .saturating_sub(DATA_TRANSFER_PAYLOAD_OFFSET)
            .max(1) as u32
    }

    /// [MS-SMBD] 3.1.5.5: handle one received message. `msg` is exactly the
    /// bytes received (the completion's byte length), `invalidated_token` the
    /// local token the provider reports invalidated by this receive.
    pub fn handle_receive<P: ReceivePoster + ?Sized>(
        &mut self,
        now: Instant,
        msg: &[u8],
        invalidated_token: Option<u32>,
        poster: &mut P,
    ) -> Result<Receive, TerminateReason> {
        if let Some(r) = self.terminated {
            return Err(r);
        }
        match self.role {
            Role::Passive => {
                let decision = evaluate_negotiate_request(&self.cfg, msg);
                self.apply_negotiate_decision(now, decision, poster)
            }
            Role::Active => self.receive_negotiate_response(now, msg, poster),
            Role::Established => self.receive_data_transfer(now, msg, invalidated_token),
        }
    }

    /// Passive side, when the negotiation decision was taken elsewhere
    /// (the control plane runs [`evaluate_negotiate_request`] on the bytes
    /// the worker received): consumes the negotiate receive and applies the
    /// decision ([MS-SMBD] 3.1.5.6, 3.1.5.3).
    pub fn apply_negotiate_decision<P: ReceivePoster + ?Sized>(
        &mut self,
        now: Instant,
        decision: NegotiateDecision,
        poster: &mut P,
    ) -> Result<Receive, TerminateReason> {
        if let Some(r) = self.terminated {
            return Err(r);
        }
        if self.role != Role::Passive {
            return Ok(Receive::Nothing);
        }
        self.credits.on_receive();
        match decision {
            NegotiateDecision::Terminate(r) => Err(self.terminate(r)),
            NegotiateDecision::Fail(status) => Ok(self.fail_negotiation(status)),
            NegotiateDecision::Accept(params) => {
                self.params = params;
                self.credits.receive_credit_target = params.receive_credit_target;
                // 3.1.5.6: "The receive operations and credits MUST be
                // initialized as specified in section 3.1.5.9."
                self.credits.top_up(poster, true);
                if self.credits.recv_posted == 0 {
                    // "... a Status ... with a Severity of STATUS_SEVERITY_ERROR."
                    return Ok(self.fail_negotiation(ntstatus::STATUS_INSUFFICIENT_RESOURCES));
                }
                let granted = self.credits.take_grant();
                let rsp = negotiate_response_for(&self.cfg, &self.params, granted);
                self.control = Some(Control::Response(rsp, false));
                self.establish(now);
                Ok(Receive::Established)
            }
        }
    }

    fn fail_negotiation(&mut self, status: NtStatus) -> Receive {
        self.control = Some(Control::Response(
            NegotiateResponseRepr::failure(status),
            true,
        ));
        self.negotiation_deadline = None;
        Receive::NegotiationFailed(status)
    }

    fn establish(&mut self, now: Instant) {
        // "the Negotiation Timer MUST be canceled, the idle Connection Timer
        // MUST be set to Connection.KeepaliveInterval, Role ESTABLISHED".
        self.role = Role::Established;
        self.negotiation_deadline = None;
        self.idle_deadline = Some(now + self.cfg.keepalive_interval);
        self.keepalive = KeepaliveState::None;
    }

    fn receive_negotiate_response<P: ReceivePoster + ?Sized>(
        &mut self,
        now: Instant,
        msg: &[u8],
        poster: &mut P,
    ) -> Result<Receive, TerminateReason> {
        self.credits.on_receive();
        let params = match evaluate_negotiate_response(&self.cfg, msg) {
            Ok(p) => p,
            Err(r) => return Err(self.terminate(r)),
        };
        self.params = params;
        self.credits.receive_credit_target = params.receive_credit_target;
        self.credits.send_credits = params.initial_send_credits;
        self.stats.credits_granted += u64::from(params.initial_send_credits);
        self.credits.top_up(poster, true);
        if self.credits.recv_posted == 0 {
            return Err(self.terminate(TerminateReason::NoReceiveCredits));
        }
        self.establish(now);
        Ok(Receive::Established)
    }

    fn receive_data_transfer(
        &mut self,
        now: Instant,
        msg: &[u8],
        invalidated_token: Option<u32>,
    ) -> Result<Receive, TerminateReason> {
        // 3.1.5.5: retrigger the idle timer, KeepaliveRequested = NONE.
        self.idle_deadline = Some(now + self.cfg.keepalive_interval);
        self.keepalive = KeepaliveState::None;

        let view = match DataTransfer::new_checked(msg) {
            Ok(v) => v,
            Err(_) => {
                return Err(self.terminate(TerminateReason::DataTransferTooShort { len: msg.len() }))
            }
        };
        if view.credits_requested() == 0 {
            return Err(self.terminate(TerminateReason::DataTransferCreditsRequestedZero));
        }
        let range = match view.payload_range() {
            Ok(r) => r,
            Err(e) => {
                let r = match e {
                    PayloadError::Unaligned => TerminateReason::DataOffsetUnaligned {
                        offset: view.data_offset(),
                    },
                    PayloadError::InsideHeader => TerminateReason::DataOffsetInsideHeader {
                        offset: view.data_offset(),
                    },
                    PayloadError::BeyondMessage => TerminateReason::DataBeyondMessage {
                        offset: view.data_offset(),
                        length: view.data_length(),
                        message_len: msg.len(),
                    },
                };
                return Err(self.terminate(r));
            }
        };
        let rdl = view.remaining_data_length();
        let total = view.data_length() as u64 + rdl as u64;
        if total > self.params.max_fragmented_recv_size as u64 {
            return Err(self.terminate(TerminateReason::FragmentedSizeExceeded {
                total,
                limit: self.params.max_fragmented_recv_size,
            }));
        }
        // "Connection.ReceiveCredits MUST be decremented by one."
        if !self.credits.on_receive() {
            return Err(self.terminate(TerminateReason::SendWithoutCredit));
        }
        self.stats.messages_received += 1;
        // "Connection.ReceiveCreditTarget MUST be set to the received CreditsRequested."
        self.credits.receive_credit_target = view.credits_requested();
        if view.flags() & SMB_DIRECT_RESPONSE_REQUESTED != 0 {
            // Answer promptly; our own KeepaliveRequested is untouched (see
            // docs/spec-notes.md, "Answering SMB_DIRECT_RESPONSE_REQUESTED").
            self.send_immediate = true;
            self.stats.keepalives_received += 1;
        }
        let granted = view.credits_granted();
        if granted > 0 {
            self.stats.credits_granted += u64::from(granted);
            self.credits.send_credits = self.credits.send_credits.saturating_add(granted);
        }
        if let Some(t) = invalidated_token {
            self.invalidated_token = Some(t);
        }
        if range.is_empty() && rdl == 0 {
            // A credit/keepalive-only message: no effect on reassembly (see
            // docs/spec-notes.md, "Empty messages inside a fragmented sequence").
            self.stats.empty_received += 1;
            return Ok(Receive::Nothing);
        }
        self.grant_wanted = true;
        self.stats.bytes_received += range.len() as u64;
        let limit = self.params.max_fragmented_recv_size;
        match self.reassembly.push(&msg[range.clone()], rdl, limit) {
            Err(r) => Err(self.terminate(r)),
            Ok(Fragment::More) => Ok(Receive::Nothing),
            Ok(Fragment::Whole) => {
                self.stats.messages_delivered += 1;
                Ok(Receive::Message {
                    data: MessageData::InPlace(range),
                    invalidated_token: self.invalidated_token.take(),
                })
            }
            Ok(Fragment::Complete) => {
                self.stats.messages_delivered += 1;
                Ok(Receive::Message {
                    data: MessageData::Reassembled,
                    invalidated_token: self.invalidated_token.take(),
                })
            }
        }
    }

    /// True when the peer should be sent credits even with nothing else to
    /// say: it has none left, or it sent data and sits at or below half its
    /// target.
    fn grant_needed(&self) -> bool {
        let c = &self.credits;
        c.peer_credits == 0 || (self.grant_wanted && c.peer_credits <= c.low_watermark())
    }

    /// Whether [`Self::poll_transmit`] can return a message now (or the
    /// connection ended, which the caller learns from it). False means it
    /// would return `None` and change nothing, so a caller may skip
    /// preparing a send buffer: the check every idle poll of a busy loop
    /// makes.
    #[inline]
    pub fn transmit_pending(&self) -> bool {
        if self.control.is_some() || self.terminated.is_some() {
            return true;
        }
        self.role == Role::Established
            && (!self.send_queue.is_empty()
                || self.keepalive == KeepaliveState::Pending
                || self.send_immediate
                || self.grant_needed())
    }

    /// [MS-SMBD] 3.1.5.1–3.1.5.4: the next message to post, if any. Writes
    /// the message header (or the whole negotiate message) into `header`,
    /// which must hold [`MAX_HEADER_LEN`] bytes. Call repeatedly until it
    /// returns `None`, after every event.
    pub fn poll_transmit<P: ReceivePoster + ?Sized>(
        &mut self,
        now: Instant,
        poster: &mut P,
        header: &mut [u8],
    ) -> Option<Transmit> {
        if header.len() < MAX_HEADER_LEN {
            return None;
        }
        if let Some(ctrl) = self.control.take() {
            return Some(self.transmit_control(ctrl, header));
        }
        if self.terminated.is_some() || self.role != Role::Established {
            return None;
        }
        let has_data = !self.send_queue.is_empty();
        let want_empty = !has_data
            && (self.keepalive == KeepaliveState::Pending
                || self.send_immediate
                || self.grant_needed());
        if !has_data && !want_empty {
            return None;
        }
        if self.credits.send_credits == 0 {
            self.stats.credit_stalls += 1;
            return None;
        }
        // 3.1.5.9 credit processing before every send; on the last send
        // credit, make sure there is something to grant.
        let last = self.credits.send_credits == 1;
        self.credits
            .top_up(poster, last && self.credits.unannounced() == 0);
        if last && self.credits.recv_posted < 2 {
            // Spending our last credit obliges the peer to send us a grant.
            // Leave it at least two credits so that its grant is not its
            // own last credit: with one credit each (targets of 1, or
            // ReceiveCreditMax 1) two peers would otherwise exchange
            // grant-only messages forever. 3.1.5.9 allows posting beyond
            // the target here ("at least one receive").
            self.credits.top_up(poster, true);
        }
        let grant = self.credits.unannounced();
        // 3.1.5.1: "If Connection.SendCredits is 1 and the CreditsGranted
        // field of the message is 0, stop processing."
        if last && grant == 0 {
            self.stats.credit_stalls += 1;
            return None;
        }
        let only_grant =
            !has_data && self.keepalive != KeepaliveState::Pending && !self.send_immediate;
        if only_grant && grant == 0 {
            // Nothing could be posted: an empty message would say nothing.
            return None;
        }
        let grant = self.spend_send_credit();
        let mut flags = 0;
        if self.keepalive == KeepaliveState::Pending {
            flags = SMB_DIRECT_RESPONSE_REQUESTED;
            self.keepalive = KeepaliveState::Sent;
            // Note <3>: the peer has 5 s to answer.
            self.idle_deadline = Some(now + self.cfg.keepalive_response_timeout);
            self.stats.keepalives_sent += 1;
        }

        let mut repr = DataTransferRepr {
            credits_requested: self.credits.send_credit_target,
            credits_granted: grant,
            flags,
            ..DataTransferRepr::default()
        };
        let max_seg = self.max_segment();
        let (payload, invalidate_token) = match self.send_queue.front_mut() {
            None => {
                self.stats.empty_sent += 1;
                (None, None)
            }
            Some(m) => {
                let remaining = m.len - m.sent;
                let seg = remaining.min(max_seg);
                // No overflow: `send_at` checked base + len.
                let offset = m.base + m.sent;
                m.sent += seg;
                let last_seg = m.sent == m.len;
                repr.data_offset = DATA_TRANSFER_PAYLOAD_OFFSET as u32;
                repr.data_length = seg;
                repr.remaining_data_length = m.len - m.sent;
                // 3.1.5.4: the token goes with exactly one segment: the last.
                let token = if last_seg { m.invalidate_token } else { None };
                let slice = PayloadSlice {
                    handle: m.handle,
                    offset,
                    len: seg,
                    last: last_seg,
                };
                if last_seg {
                    self.send_queue.pop();
                }
                self.stats.bytes_sent += seg as u64;
                (Some(slice), token)
            }
        };
        let header_len = repr.emit_header(header);
        debug_assert!(payload.is_some() || header_len == DATA_TRANSFER_HEADER_LEN);
        Some(Transmit {
            kind: TransmitKind::DataTransfer,
            header_len,
            payload,
            invalidate_token,
            disconnect_after: false,
            credits_granted: grant,
        })
    }

    fn transmit_control(&mut self, ctrl: Control, header: &mut [u8]) -> Transmit {
        match ctrl {
            Control::Request => {
                let req = negotiate_request_for(&self.cfg);
                header[..20].copy_from_slice(&req.to_bytes());
                Transmit {
                    kind: TransmitKind::NegotiateRequest,
                    header_len: 20,
                    payload: None,
                    invalidate_token: None,
                    disconnect_after: false,
                    credits_granted: 0,
                }
            }
            Control::Response(rsp, fail) => {
                header[..32].copy_from_slice(&rsp.to_bytes());
                if fail {
                    // 3.1.5.3: "a graceful termination of the connection SHOULD be performed".
                    self.terminate(TerminateReason::NegotiateFailed { status: rsp.status });
                }
                Transmit {
                    kind: TransmitKind::NegotiateResponse,
                    header_len: 32,
                    payload: None,
                    invalidate_token: None,
                    disconnect_after: fail,
                    credits_granted: rsp.credits_granted,
                }
            }
        }
    }

    /// The earliest instant at which [`Self::handle_timeout`] must be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.terminated.is_some() {
            return None;
        }
        match (self.negotiation_deadline, self.idle_deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// [MS-SMBD] 3.1.6: timers. Returns the termination reason if a timer
    /// ended the connection.
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), TerminateReason> {
        if let Some(r) = self.terminated {
            return Err(r);
        }
        if self.negotiation_deadline.is_some_and(|d| now >= d) {
            // 3.1.6.1: "the local peer SHOULD terminate the connection".
            return Err(self.terminate(TerminateReason::NegotiationTimeout));
        }
        if self.idle_deadline.is_some_and(|d| now >= d) {
            // 3.1.6.2: a keepalive still outstanding ends the connection;
            // otherwise request a response from the peer.
            if self.keepalive != KeepaliveState::None {
                return Err(self.terminate(TerminateReason::KeepaliveTimeout));
            }
            self.keepalive = KeepaliveState::Pending;
            self.idle_deadline = Some(now + self.cfg.keepalive_response_timeout);
        }
        Ok(())
    }
}

/// The protocol version as a constant for callers that build messages.
pub const PROTOCOL_VERSION: u16 = SMBD_VERSION_1;
