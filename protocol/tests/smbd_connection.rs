//! One test per rule of [MS-SMBD] 3.1.4–3.1.7 that a peer or a timer can
//! exercise, against the sans-IO [`Connection`]. The test plays the peer:
//! it writes the peer's messages byte for byte, reads what the connection
//! transmits back off the wire, and drives a fake clock.
//!
//! Rules about the RDMA provider itself (registration, RDMA Read/Write,
//! Send with Invalidate on the wire) are outside this crate; see
//! docs/spec-coverage.md for where they are covered.

use smbdirect_protocol::ntstatus::{self, NtStatus};
use smbdirect_protocol::smbd::config::{SmbdConfig, NEGOTIATE_RECEIVE_MIN, SMBD_VERSION_1};
use smbdirect_protocol::smbd::credits::{receive_buffers_required, CountingPoster};
use smbdirect_protocol::smbd::negotiation::{evaluate_negotiate_request, NegotiateDecision};
use smbdirect_protocol::smbd::wire::{
    DataTransfer, DataTransferRepr, NegotiateRequest, NegotiateRequestRepr, NegotiateResponse,
    NegotiateResponseRepr, SMB_DIRECT_RESPONSE_REQUESTED,
};
use smbdirect_protocol::smbd::{
    Connection, KeepaliveState, MessageData, Receive, Role, SendError, TerminateReason, Transmit,
    TransmitKind, MAX_HEADER_LEN, NEGOTIATE_RECEIVES,
};
use smbdirect_protocol::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// The test peer's toolkit.
// ---------------------------------------------------------------------------

/// The fake clock: `ms(n)` is n milliseconds after an arbitrary start.
fn ms(n: u64) -> Instant {
    Instant::from_nanos(7_000_000_000 + n * 1_000_000)
}

fn secs(n: u64) -> Instant {
    ms(n * 1000)
}

/// `d` before `t`.
fn before(t: Instant, d: Duration) -> Instant {
    Instant::from_nanos(t.as_nanos() - d.as_nanos())
}

/// Byte `offset` of upper-layer message `handle`.
fn body_byte(handle: u64, offset: u32) -> u8 {
    (handle as u8).wrapping_mul(37) ^ (offset as u8) ^ ((offset >> 8) as u8).wrapping_mul(3)
}

fn body(handle: u64, len: u32) -> Vec<u8> {
    (0..len).map(|o| body_byte(handle, o)).collect()
}

/// Polls once; returns the transmit and the message as it goes on the wire.
fn poll(c: &mut Connection, now: Instant, p: &mut CountingPoster) -> Option<(Transmit, Vec<u8>)> {
    let mut h = [0u8; MAX_HEADER_LEN];
    let t = c.poll_transmit(now, p, &mut h)?;
    let mut bytes = h[..t.header_len].to_vec();
    if let Some(s) = t.payload {
        bytes.extend((s.offset..s.offset + s.len).map(|o| body_byte(s.handle, o)));
    }
    Some((t, bytes))
}

/// Polls until the connection has nothing more to send.
fn drain(c: &mut Connection, now: Instant, p: &mut CountingPoster) -> Vec<(Transmit, Vec<u8>)> {
    let mut v = Vec::new();
    while let Some(x) = poll(c, now, p) {
        v.push(x);
        assert!(v.len() < 10_000, "endless transmits");
    }
    v
}

fn view(bytes: &[u8]) -> DataTransfer<&[u8]> {
    DataTransfer::new_checked(bytes).expect("a data transfer message")
}

/// A Negotiate Request like [MS-SMBD] 4.1's.
fn request() -> NegotiateRequestRepr {
    NegotiateRequestRepr {
        min_version: SMBD_VERSION_1,
        max_version: SMBD_VERSION_1,
        credits_requested: 10,
        preferred_send_size: 1024,
        max_receive_size: 1024,
        max_fragmented_size: 131_072,
    }
}

/// A Negotiate Response like [MS-SMBD] 4.1's.
fn response() -> NegotiateResponseRepr {
    NegotiateResponseRepr {
        min_version: SMBD_VERSION_1,
        max_version: SMBD_VERSION_1,
        negotiated_version: SMBD_VERSION_1,
        credits_requested: 10,
        credits_granted: 10,
        status: ntstatus::STATUS_SUCCESS,
        max_read_write_size: 1 << 20,
        preferred_send_size: 1024,
        max_receive_size: 1024,
        max_fragmented_size: 131_072,
    }
}

/// A Data Transfer message from the peer, with its payload at offset 24.
fn data(
    credits_requested: u16,
    credits_granted: u16,
    flags: u16,
    remaining: u32,
    payload: &[u8],
) -> Vec<u8> {
    let repr = DataTransferRepr {
        credits_requested,
        credits_granted,
        flags,
        ..DataTransferRepr::with_payload(payload.len() as u32, remaining)
    };
    let mut b = vec![0u8; repr.buffer_len()];
    repr.emit(&mut b, payload);
    b
}

/// An empty (credit-only) Data Transfer message from the peer.
fn empty(credits_requested: u16, credits_granted: u16) -> Vec<u8> {
    data(credits_requested, credits_granted, 0, 0, &[])
}

/// A Data Transfer header with raw DataOffset/DataLength, padded to `len`.
fn raw_data(
    credits_requested: u16,
    remaining: u32,
    offset: u32,
    length: u32,
    len: usize,
) -> Vec<u8> {
    let mut b = vec![0u8; len.max(20)];
    let mut v = DataTransfer::new_unchecked(&mut b[..]);
    v.set_credits_requested(credits_requested);
    v.set_remaining_data_length(remaining);
    v.set_data_offset(offset);
    v.set_data_length(length);
    b.truncate(len);
    b
}

/// A new active connection that has transmitted its Negotiate Request.
fn active(cfg: SmbdConfig) -> (Connection, CountingPoster) {
    let mut p = CountingPoster::default();
    let mut c = Connection::new_active(cfg, ms(0));
    let (t, _) = poll(&mut c, ms(0), &mut p).expect("negotiate request");
    assert_eq!(t.kind, TransmitKind::NegotiateRequest);
    (c, p)
}

/// An active connection that received `rsp` at `ms(10)`.
fn active_negotiated(cfg: SmbdConfig, rsp: NegotiateResponseRepr) -> (Connection, CountingPoster) {
    let (mut c, mut p) = active(cfg);
    assert_eq!(
        c.handle_receive(ms(10), &rsp.to_bytes(), None, &mut p),
        Ok(Receive::Established)
    );
    (c, p)
}

/// An established active connection that has sent its first message (the
/// grant of [MS-SMBD] 4.1 step 3); the test is its peer.
fn established(cfg: SmbdConfig, rsp: NegotiateResponseRepr) -> (Connection, CountingPoster) {
    let (mut c, mut p) = active_negotiated(cfg, rsp);
    let sent = drain(&mut c, ms(10), &mut p);
    assert_eq!(sent.len(), 1, "one grant message");
    assert!(sent[0].0.is_empty());
    (c, p)
}

/// The default established connection: MaxSendSize 1024, 10 credits each way.
fn established_default() -> (Connection, CountingPoster) {
    established(SmbdConfig::default(), response())
}

/// A new passive connection fed `req` at `ms(10)`.
fn passive(
    cfg: SmbdConfig,
    req: &[u8],
) -> (Connection, CountingPoster, Result<Receive, TerminateReason>) {
    let mut p = CountingPoster::default();
    let mut c = Connection::new_passive(cfg, ms(0));
    let r = c.handle_receive(ms(10), req, None, &mut p);
    (c, p, r)
}

/// The Negotiate Response the passive side transmits.
fn passive_response(
    c: &mut Connection,
    p: &mut CountingPoster,
) -> (Transmit, NegotiateResponseRepr) {
    let (t, bytes) = poll(c, ms(10), p).expect("negotiate response");
    assert_eq!(t.kind, TransmitKind::NegotiateResponse);
    assert_eq!(bytes.len(), 32);
    let v = NegotiateResponse::new_checked(&bytes[..]).expect("32 bytes");
    assert_eq!(v.reserved(), 0);
    (t, NegotiateResponseRepr::parse(&v))
}

fn expect_terminated(c: &Connection, r: Result<Receive, TerminateReason>, reason: TerminateReason) {
    assert_eq!(r, Err(reason));
    assert_eq!(c.terminated(), Some(reason));
    assert!(!c.is_established());
    assert_eq!(c.poll_timeout(), None, "no timer survives termination");
}

fn deliver(
    c: &mut Connection,
    p: &mut CountingPoster,
    now: Instant,
    msg: &[u8],
) -> Result<Receive, TerminateReason> {
    c.handle_receive(now, msg, None, p)
}

// ---------------------------------------------------------------------------
// 3.1.4.1 Connecting to the Peer, 3.1.7.2 Connection Arrival: initial values
// ---------------------------------------------------------------------------

#[test]
fn active_connection_initial_values_follow_3_1_4_1() {
    let cfg = SmbdConfig {
        send_credit_target: 33,
        receive_credit_max: 44,
        ..SmbdConfig::default()
    };
    let c = Connection::new_active(cfg.clone(), ms(0));
    assert_eq!(c.role(), Role::Active);
    assert!(!c.is_established());
    let p = c.params();
    assert_eq!(p.protocol, 0, "Connection.Protocol 0");
    assert_eq!(p.max_read_write_size, 0, "Connection.MaxReadWriteSize 0");
    assert_eq!(p.max_send_size, cfg.max_send_size);
    assert_eq!(p.max_receive_size, cfg.max_receive_size);
    assert_eq!(p.max_fragmented_recv_size, cfg.max_fragmented_recv_size);
    let k = c.credits();
    assert_eq!(k.send_credits, 0, "Connection.SendCredits 0");
    assert_eq!(k.send_credit_target, 33);
    assert_eq!(k.receive_credit_max, 44);
    assert_eq!(
        k.recv_posted, NEGOTIATE_RECEIVES,
        "the one receive posted before connecting"
    );
    assert_eq!(k.peer_credits, 0);
    assert_eq!(c.keepalive_state(), KeepaliveState::None);
    assert_eq!(c.send_queue_len(), 0);
    assert_eq!(c.reassembly_buffered(), 0);
    assert_eq!(c.poll_timeout(), Some(secs(120)), "120 s Negotiation Timer");
}

#[test]
fn one_negotiate_receive_of_at_least_512_bytes_is_posted_before_connecting() {
    assert_eq!(NEGOTIATE_RECEIVES, 1);
    assert_eq!(NEGOTIATE_RECEIVE_MIN, 512);
    let too_small = SmbdConfig {
        max_receive_size: 511,
        ..SmbdConfig::default()
    };
    assert!(
        too_small.validate().is_err(),
        "receive buffers are MaxReceiveSize bytes, so at least 512"
    );
}

#[test]
fn active_side_first_sends_the_negotiate_request() {
    let mut p = CountingPoster::default();
    let mut c = Connection::new_active(SmbdConfig::default(), ms(0));
    let (t, _) = poll(&mut c, ms(0), &mut p).expect("negotiate request");
    assert_eq!(t.kind, TransmitKind::NegotiateRequest);
    assert_eq!(
        poll(&mut c, ms(0), &mut p),
        None,
        "nothing else before the response"
    );
}

#[test]
fn passive_connection_initial_values_follow_3_1_7_2() {
    let cfg = SmbdConfig::default();
    let mut p = CountingPoster::default();
    let mut c = Connection::new_passive(cfg.clone(), ms(0));
    assert_eq!(c.role(), Role::Passive);
    assert_eq!(c.params().protocol, 0);
    assert_eq!(
        c.params().max_read_write_size,
        cfg.max_read_write_size,
        "note <7>"
    );
    assert_eq!(c.credits().send_credits, 0);
    assert_eq!(c.credits().recv_posted, NEGOTIATE_RECEIVES);
    assert_eq!(c.keepalive_state(), KeepaliveState::None);
    assert_eq!(c.send_queue_len(), 0);
    assert_eq!(c.reassembly_buffered(), 0);
    assert_eq!(c.poll_timeout(), Some(secs(5)), "5 s Negotiation Timer");
    assert_eq!(
        poll(&mut c, ms(0), &mut p),
        None,
        "the passive side waits for the request"
    );
}

// ---------------------------------------------------------------------------
// 3.1.2.1 / 3.1.6.1 Negotiation Timer
// ---------------------------------------------------------------------------

#[test]
fn negotiation_timer_active_120s() {
    let (mut c, mut p) = active(SmbdConfig::default());
    assert_eq!(c.handle_timeout(ms(119_999)), Ok(()));
    assert_eq!(
        c.handle_timeout(secs(120)),
        Err(TerminateReason::NegotiationTimeout)
    );
    assert_eq!(c.terminated(), Some(TerminateReason::NegotiationTimeout));
    assert_eq!(c.poll_timeout(), None);
    assert_eq!(poll(&mut c, secs(120), &mut p), None);
    assert_eq!(
        c.handle_receive(secs(121), &response().to_bytes(), None, &mut p),
        Err(TerminateReason::NegotiationTimeout)
    );
}

#[test]
fn negotiation_timer_passive_5s() {
    let mut c = Connection::new_passive(SmbdConfig::default(), ms(0));
    assert_eq!(c.handle_timeout(ms(4_999)), Ok(()));
    assert_eq!(
        c.handle_timeout(secs(5)),
        Err(TerminateReason::NegotiationTimeout)
    );
    assert_eq!(c.poll_timeout(), None);
}

#[test]
fn negotiation_timer_is_canceled_once_established() {
    let (mut a, _) = active_negotiated(SmbdConfig::default(), response());
    assert_eq!(
        a.poll_timeout(),
        Some(ms(10) + Duration::from_secs(120)),
        "idle timer, not the negotiation timer"
    );
    assert_eq!(a.handle_timeout(secs(120)), Ok(()));
    let (mut b, _, r) = passive(SmbdConfig::default(), &request().to_bytes());
    assert_eq!(r, Ok(Receive::Established));
    assert_eq!(b.poll_timeout(), Some(ms(10) + Duration::from_secs(120)));
    assert_eq!(b.handle_timeout(secs(5)), Ok(()));
}

// ---------------------------------------------------------------------------
// 3.1.4.2 Send Message
// ---------------------------------------------------------------------------

#[test]
fn message_larger_than_max_fragmented_send_size_is_refused() {
    let (mut c, _) = established_default();
    assert_eq!(c.params().max_fragmented_send_size, 131_072);
    assert_eq!(
        c.send(1, 131_073, None),
        Err(SendError::TooLarge {
            len: 131_073,
            max: 131_072
        })
    );
    assert_eq!(c.send_queue_len(), 0);
    assert_eq!(c.send(2, 131_072, None), Ok(()));
}

#[test]
fn send_before_established_is_refused() {
    let (mut c, _) = active(SmbdConfig::default());
    assert_eq!(c.send(1, 10, None), Err(SendError::NotEstablished));
    let mut b = Connection::new_passive(SmbdConfig::default(), ms(0));
    assert_eq!(b.send(1, 10, None), Err(SendError::NotEstablished));
}

#[test]
fn empty_upper_layer_message_is_refused() {
    let (mut c, _) = established_default();
    assert_eq!(c.send(1, 0, None), Err(SendError::Empty));
}

#[test]
fn full_send_queue_is_backpressure_not_growth() {
    let cfg = SmbdConfig {
        send_queue_capacity: 2,
        ..SmbdConfig::default()
    };
    let (mut c, mut p) = established(cfg, response());
    c.send(1, 10, None).unwrap();
    c.send(2, 10, None).unwrap();
    assert_eq!(c.send_queue_space(), 0);
    assert_eq!(c.send(3, 10, None), Err(SendError::QueueFull));
    assert_eq!(c.send_queue_len(), 2);
    let _ = drain(&mut c, ms(20), &mut p);
    assert_eq!(c.send(3, 10, None), Ok(()), "space again once transmitted");
}

#[test]
fn query_connection_parameters_returns_negotiated_sizes_and_keepalive_interval() {
    let (c, _) = established_default();
    let p = c.params();
    assert_eq!(p.max_send_size, 1024);
    assert_eq!(p.max_fragmented_send_size, 131_072);
    assert_eq!(p.max_receive_size, 1024);
    assert_eq!(p.max_read_write_size, 1 << 20);
    assert_eq!(c.config().keepalive_interval, Duration::from_secs(120));
}

// ---------------------------------------------------------------------------
// 3.1.5.1 Sending Upper Layer Messages
// ---------------------------------------------------------------------------

#[test]
fn send_queue_is_fifo() {
    let (mut c, mut p) = established(
        SmbdConfig::default(),
        NegotiateResponseRepr {
            credits_granted: 100,
            ..response()
        },
    );
    c.send(7, 2500, None).unwrap();
    c.send(3, 10, None).unwrap();
    c.send(5, 1000, None).unwrap();
    let order: Vec<u64> = drain(&mut c, ms(20), &mut p)
        .iter()
        .filter_map(|(t, _)| t.payload.map(|s| s.handle))
        .collect();
    assert_eq!(order, vec![7, 7, 7, 3, 5]);
}

#[test]
fn no_message_is_sent_without_a_send_credit() {
    let (mut c, mut p) = established(
        SmbdConfig::default(),
        NegotiateResponseRepr {
            credits_granted: 3,
            ..response()
        },
    );
    assert_eq!(c.credits().send_credits, 2);
    for h in 0..5 {
        c.send(h, 10, None).unwrap();
    }
    let sent = drain(&mut c, ms(20), &mut p);
    assert_eq!(sent.len(), 2);
    assert_eq!(c.credits().send_credits, 0);
    assert_eq!(c.send_queue_len(), 3);
    assert!(c.stats().credit_stalls > 0);
    // One credit back: exactly one more message.
    assert_eq!(
        deliver(&mut c, &mut p, ms(30), &empty(10, 1)),
        Ok(Receive::Nothing)
    );
    assert_eq!(drain(&mut c, ms(30), &mut p).len(), 1);
    assert_eq!(c.send_queue_len(), 2);
}

#[test]
fn last_send_credit_is_never_spent_without_a_grant() {
    let (mut c, mut p) = established(
        SmbdConfig::default(),
        NegotiateResponseRepr {
            credits_granted: 1,
            ..response()
        },
    );
    // The first message spent the only credit and granted 10.
    assert_eq!(c.credits().send_credits, 0);
    assert_eq!(
        deliver(&mut c, &mut p, ms(20), &empty(10, 1)),
        Ok(Receive::Nothing)
    );
    assert_eq!(c.credits().send_credits, 1);
    assert_eq!(
        c.credits().recv_posted,
        c.credits().peer_credits,
        "nothing unannounced"
    );
    // No receive can be posted: nothing to grant, so the last credit stays.
    p.limit = Some(p.posted);
    c.send(1, 100, None).unwrap();
    assert_eq!(poll(&mut c, ms(20), &mut p), None);
    assert_eq!(c.credits().send_credits, 1);
    // One receive can be posted: the message goes, granting it.
    p.limit = Some(p.posted + 1);
    let (t, bytes) = poll(&mut c, ms(21), &mut p).expect("sent with a grant");
    assert_eq!(t.payload.map(|s| s.handle), Some(1));
    assert_eq!(view(&bytes).credits_granted(), 1);
    assert_eq!(c.credits().send_credits, 0);
}

#[test]
fn credits_requested_is_send_credit_target_on_every_message() {
    let cfg = SmbdConfig {
        send_credit_target: 7,
        ..SmbdConfig::default()
    };
    let (mut c, mut p) = active_negotiated(cfg, response());
    c.send(1, 2000, None).unwrap();
    let sent = drain(&mut c, ms(20), &mut p);
    assert_eq!(sent.len(), 2);
    for (_, b) in &sent {
        assert_eq!(view(b).credits_requested(), 7);
    }
}

#[test]
fn flags_are_zero_unless_a_keepalive_is_pending() {
    let (mut c, mut p) = established_default();
    c.send(1, 10, None).unwrap();
    for (_, b) in drain(&mut c, ms(20), &mut p) {
        assert_eq!(view(&b).flags(), 0);
    }
}

#[test]
fn invalidate_token_is_handed_to_the_provider_with_the_send() {
    let (mut c, mut p) = established_default();
    c.send(1, 10, Some(0xDEAD_BEEF)).unwrap();
    let sent = drain(&mut c, ms(20), &mut p);
    assert_eq!(sent[0].0.invalidate_token, Some(0xDEAD_BEEF));
}

#[test]
fn final_segment_is_marked_so_the_caller_can_release_the_message() {
    let (mut c, mut p) = established_default();
    c.send(1, 2500, None).unwrap();
    let last: Vec<bool> = drain(&mut c, ms(20), &mut p)
        .iter()
        .map(|(t, _)| t.payload.unwrap().last)
        .collect();
    assert_eq!(last, vec![false, false, true]);
}

#[test]
fn a_message_sent_at_an_offset_is_sliced_from_there_and_fragmented_alike() {
    // send_at: the message lies 24 bytes into its buffer (a received
    // message echoed from its receive buffer); 3.1.5.1 fragmentation and
    // the last-segment mark are those of `send`, only the slices move.
    let (mut c, mut p) = established_default();
    c.send_at(5, 24, 2500, None).unwrap();
    let sent = drain(&mut c, ms(20), &mut p);
    let slices: Vec<(u32, u32, bool)> = sent
        .iter()
        .map(|(t, _)| {
            let s = t.payload.unwrap();
            (s.offset, s.len, s.last)
        })
        .collect();
    assert_eq!(
        slices,
        vec![(24, 1000, false), (1024, 1000, false), (2024, 500, true)]
    );
    for (t, b) in &sent {
        assert_eq!(view(b).data_length(), t.payload.unwrap().len);
        assert_eq!(view(b).data_offset(), 24);
    }
    assert_eq!(view(&sent[0].1).remaining_data_length(), 1500);
    // A range past u32 is refused, not wrapped.
    assert!(matches!(
        c.send_at(6, u32::MAX - 10, 100, None),
        Err(SendError::TooLarge { .. })
    ));
}

#[test]
fn next_in_place_names_only_a_whole_message_with_header_room_and_the_header_is_24_bytes() {
    // 3.1.5.1: a message that fits one segment (MaxSendSize 1024 - 24)
    // queued with header room is the next transmit's whole payload, behind
    // a header of exactly DataOffset 24 bytes: the caller may write that
    // header into the room before it.
    let (mut c, mut p) = established_default();
    assert_eq!(c.next_in_place(), None, "nothing queued");
    c.send_at(1, 24, 100, None).unwrap();
    assert_eq!(c.next_in_place(), None, "queued without header room");
    drain(&mut c, ms(20), &mut p);
    c.send_with_header_room(2, 24, 1000, Some(9)).unwrap();
    let ps = c.next_in_place().expect("a whole message with room");
    assert_eq!((ps.handle, ps.offset, ps.len, ps.last), (2, 24, 1000, true));
    // The header buffer starts at the room and runs into the payload: only
    // the 24 header bytes are written.
    let mut buf = [0xaau8; 64];
    let t = c.poll_transmit(ms(20), &mut p, &mut buf).unwrap();
    assert_eq!(t.payload, Some(ps));
    assert_eq!(t.header_len, 24);
    assert_eq!(t.invalidate_token, Some(9));
    assert!(buf[24..].iter().all(|&b| b == 0xaa), "payload untouched");
    assert_eq!(view(&buf[..24 + 40]).data_offset(), 24);
    assert_eq!(view(&buf[..24 + 40]).data_length(), 1000);
    assert_eq!(view(&buf[..24 + 40]).remaining_data_length(), 0);
    // Too long for one segment, or no room before it: the general path.
    c.send_with_header_room(3, 24, 1001, None).unwrap();
    assert_eq!(c.next_in_place(), None, "fragmented");
    drain(&mut c, ms(20), &mut p);
    c.send_with_header_room(4, 23, 10, None).unwrap();
    assert_eq!(c.next_in_place(), None, "fewer than 24 bytes before it");
    drain(&mut c, ms(20), &mut p);
    // Not after termination.
    c.send_with_header_room(5, 24, 10, None).unwrap();
    c.close();
    assert_eq!(c.next_in_place(), None, "terminated");
}

// ---------------------------------------------------------------------------
// 3.1.5.2 Sending a Negotiate Request Message
// ---------------------------------------------------------------------------

#[test]
fn negotiate_request_fields_follow_3_1_5_2() {
    let cfg = SmbdConfig {
        send_credit_target: 42,
        max_send_size: 1000,
        max_receive_size: 4096,
        max_fragmented_recv_size: 262_144,
        ..SmbdConfig::default()
    };
    let mut p = CountingPoster::default();
    let mut c = Connection::new_active(cfg, ms(0));
    let (t, bytes) = poll(&mut c, ms(0), &mut p).unwrap();
    assert_eq!(
        (t.kind, t.header_len, bytes.len()),
        (TransmitKind::NegotiateRequest, 20, 20)
    );
    let v = NegotiateRequest::new_checked(&bytes[..]).unwrap();
    assert_eq!(v.min_version(), 0x0100);
    assert_eq!(v.max_version(), 0x0100);
    assert_eq!(v.reserved(), 0);
    assert_eq!(v.credits_requested(), 42, "SendCreditTarget");
    assert_eq!(v.preferred_send_size(), 1000, "MaxSendSize");
    assert_eq!(v.max_receive_size(), 4096);
    assert_eq!(v.max_fragmented_size(), 262_144, "MaxFragmentedRecvSize");
}

// ---------------------------------------------------------------------------
// 3.1.5.3 Sending a Negotiate Response Message
// ---------------------------------------------------------------------------

#[test]
fn negotiate_response_success_fields_follow_3_1_5_3() {
    let cfg = SmbdConfig {
        send_credit_target: 42,
        ..SmbdConfig::default()
    };
    let (mut c, mut p, r) = passive(cfg, &request().to_bytes());
    assert_eq!(r, Ok(Receive::Established));
    let (t, rsp) = passive_response(&mut c, &mut p);
    assert!(!t.disconnect_after);
    assert_eq!(
        (rsp.min_version, rsp.max_version, rsp.negotiated_version),
        (0x0100, 0x0100, 0x0100)
    );
    assert_eq!(rsp.status, ntstatus::STATUS_SUCCESS);
    assert_eq!(rsp.credits_requested, 42, "SendCreditTarget");
    assert_eq!(
        rsp.credits_granted, 10,
        "ReceiveCredits: the receives posted for the peer's 10"
    );
    assert_eq!(rsp.credits_granted, c.credits().recv_posted);
    assert_eq!(t.credits_granted, 10);
    assert_eq!(rsp.max_read_write_size, 8 << 20);
    assert_eq!(
        rsp.preferred_send_size, 1024,
        "MaxSendSize = min(1364, peer's MaxReceiveSize 1024)"
    );
    assert_eq!(
        rsp.max_receive_size, 1024,
        "MaxReceiveSize = min(8192, peer's PreferredSendSize 1024)"
    );
    assert_eq!(rsp.max_fragmented_size, 1 << 20);
}

#[test]
fn negotiate_response_failure_zeroes_all_other_fields_and_closes_gracefully() {
    let req = NegotiateRequestRepr {
        min_version: 0x0200,
        max_version: 0x0200,
        ..request()
    };
    let (mut c, mut p, r) = passive(SmbdConfig::default(), &req.to_bytes());
    assert_eq!(
        r,
        Ok(Receive::NegotiationFailed(ntstatus::STATUS_NOT_SUPPORTED))
    );
    let (t, bytes) = poll(&mut c, ms(10), &mut p).unwrap();
    assert_eq!(t.kind, TransmitKind::NegotiateResponse);
    assert!(t.disconnect_after, "graceful termination after the send");
    let mut expected = [0u8; 32];
    expected[0..2].copy_from_slice(&0x0100u16.to_le_bytes());
    expected[2..4].copy_from_slice(&0x0100u16.to_le_bytes());
    expected[12..16].copy_from_slice(&ntstatus::STATUS_NOT_SUPPORTED.0.to_le_bytes());
    assert_eq!(bytes, expected);
    assert_eq!(
        c.terminated(),
        Some(TerminateReason::NegotiateFailed {
            status: ntstatus::STATUS_NOT_SUPPORTED
        })
    );
    assert_eq!(poll(&mut c, ms(10), &mut p), None);
    assert_eq!(c.poll_timeout(), None);
}

// ---------------------------------------------------------------------------
// 3.1.5.4 Sending a Data Transfer Message
// ---------------------------------------------------------------------------

#[test]
fn fragmentation_uses_offset_24_and_max_send_size_minus_24() {
    let (mut c, mut p) = established_default();
    assert_eq!(c.params().max_send_size, 1024);
    c.send(9, 2500, None).unwrap();
    let sent = drain(&mut c, ms(20), &mut p);
    let lens: Vec<u32> = sent.iter().map(|(_, b)| view(b).data_length()).collect();
    assert_eq!(lens, vec![1000, 1000, 500]);
    let mut whole = Vec::new();
    for (t, b) in &sent {
        let v = view(b);
        assert_eq!(v.data_offset(), 24);
        assert_eq!(t.header_len, 24);
        assert!(b.len() <= 1024, "DataOffset + DataLength <= MaxSendSize");
        assert_eq!(v.reserved(), 0);
        assert_eq!(
            &b[20..24],
            &[0; 4],
            "Padding is zero for DataOffset - 20 bytes"
        );
        whole.extend_from_slice(v.payload().unwrap());
    }
    assert_eq!(whole, body(9, 2500));
}

#[test]
fn remaining_data_length_is_the_bytes_not_yet_sent() {
    let (mut c, mut p) = established_default();
    c.send(1, 2500, None).unwrap();
    c.send(2, 1000, None).unwrap();
    let rdl: Vec<u32> = drain(&mut c, ms(20), &mut p)
        .iter()
        .map(|(_, b)| view(b).remaining_data_length())
        .collect();
    assert_eq!(rdl, vec![1500, 500, 0, 0]);
}

#[test]
fn empty_message_has_offset_0_length_0_remaining_0_and_no_padding() {
    let (mut c, mut p) = active_negotiated(SmbdConfig::default(), response());
    let (t, b) = poll(&mut c, ms(10), &mut p).expect("first grant");
    assert!(t.is_empty());
    assert_eq!(b.len(), 20);
    let v = view(&b);
    assert_eq!(
        (
            v.data_offset(),
            v.data_length(),
            v.remaining_data_length(),
            v.reserved()
        ),
        (0, 0, 0, 0)
    );
}

#[test]
fn invalidate_token_rides_on_exactly_one_segment_the_last() {
    let (mut c, mut p) = established_default();
    c.send(1, 2500, Some(0x1234)).unwrap();
    let tokens: Vec<Option<u32>> = drain(&mut c, ms(20), &mut p)
        .iter()
        .map(|(t, _)| t.invalidate_token)
        .collect();
    assert_eq!(tokens, vec![None, None, Some(0x1234)]);
}

#[test]
fn control_information_rides_on_the_next_fragment_never_between_fragments() {
    let (mut c, mut p) = established_default();
    c.send(1, 3000, None).unwrap();
    let (_, first) = poll(&mut c, ms(20), &mut p).unwrap();
    assert_eq!(view(&first).remaining_data_length(), 2000);
    // Mid-sequence, the peer asks for a response and our idle timer fires.
    assert_eq!(
        deliver(
            &mut c,
            &mut p,
            ms(21),
            &data(10, 0, SMB_DIRECT_RESPONSE_REQUESTED, 0, &[])
        ),
        Ok(Receive::Nothing)
    );
    let fire = c.poll_timeout().unwrap();
    c.handle_timeout(fire).unwrap();
    assert_eq!(c.keepalive_state(), KeepaliveState::Pending);
    let rest = drain(&mut c, fire, &mut p);
    assert_eq!(
        rest.len(),
        2,
        "no empty message in the middle of the sequence"
    );
    assert!(rest.iter().all(|(t, _)| t.payload.is_some()));
    assert_eq!(
        view(&rest[0].1).flags(),
        SMB_DIRECT_RESPONSE_REQUESTED,
        "the keepalive rides on the next fragment"
    );
    assert_eq!(view(&rest[1].1).flags(), 0);
}

// ---------------------------------------------------------------------------
// 3.1.5.5 Receiving Any Message
// ---------------------------------------------------------------------------

#[test]
fn any_received_message_retriggers_idle_timer_and_clears_keepalive_requested() {
    let (mut c, mut p) = established_default();
    let fire = c.poll_timeout().unwrap();
    c.handle_timeout(fire).unwrap();
    assert_eq!(c.keepalive_state(), KeepaliveState::Pending);
    let later = fire + Duration::from_secs(1);
    assert_eq!(
        deliver(&mut c, &mut p, later, &data(10, 0, 0, 0, b"x")),
        Ok(Receive::Message {
            data: MessageData::InPlace(24..25),
            invalidated_token: None
        })
    );
    assert_eq!(c.keepalive_state(), KeepaliveState::None);
    assert_eq!(c.poll_timeout(), Some(later + Duration::from_secs(120)));
    // Also once the keepalive is SENT.
    let fire = c.poll_timeout().unwrap();
    c.handle_timeout(fire).unwrap();
    let _ = drain(&mut c, fire, &mut p);
    assert_eq!(c.keepalive_state(), KeepaliveState::Sent);
    assert_eq!(
        deliver(&mut c, &mut p, fire + Duration::from_secs(2), &empty(10, 0)),
        Ok(Receive::Nothing)
    );
    assert_eq!(c.keepalive_state(), KeepaliveState::None);
    assert_eq!(c.poll_timeout(), Some(fire + Duration::from_secs(122)));
}

// ---------------------------------------------------------------------------
// 3.1.5.6 Receiving a Negotiate Request Message
// ---------------------------------------------------------------------------

#[test]
fn negotiate_request_shorter_than_20_bytes_terminates() {
    for len in [0usize, 1, 19] {
        let bytes = request().to_bytes();
        let (mut c, mut p, r) = passive(SmbdConfig::default(), &bytes[..len]);
        expect_terminated(&c, r, TerminateReason::NegotiateRequestTooShort { len });
        assert_eq!(poll(&mut c, ms(10), &mut p), None, "no response");
    }
}

#[test]
fn negotiate_request_longer_than_20_bytes_is_accepted() {
    let mut bytes = request().to_bytes().to_vec();
    bytes.extend_from_slice(&[0xAA; 12]);
    let (_, _, r) = passive(SmbdConfig::default(), &bytes);
    assert_eq!(r, Ok(Receive::Established));
}

#[test]
fn version_range_without_0x0100_gets_status_not_supported_and_graceful_close() {
    for (min, max) in [
        (0x0200u16, 0x0300u16),
        (0x0001, 0x00FF),
        (0x0101, 0xFFFF),
        (0x0200, 0x0001),
        (0x0100, 0x00FF),
    ] {
        let req = NegotiateRequestRepr {
            min_version: min,
            max_version: max,
            ..request()
        };
        let (mut c, mut p, r) = passive(SmbdConfig::default(), &req.to_bytes());
        assert_eq!(
            r,
            Ok(Receive::NegotiationFailed(ntstatus::STATUS_NOT_SUPPORTED)),
            "{min:#x}..{max:#x}"
        );
        let (t, rsp) = passive_response(&mut c, &mut p);
        assert_eq!(rsp.status, ntstatus::STATUS_NOT_SUPPORTED);
        assert!(t.disconnect_after);
        assert!(!c.is_established());
    }
}

#[test]
fn version_range_including_0x0100_is_accepted_and_otherwise_ignored() {
    for (min, max) in [(0x0001u16, 0xFFFFu16), (0x0100, 0x0200), (0x0000, 0x0100)] {
        let req = NegotiateRequestRepr {
            min_version: min,
            max_version: max,
            ..request()
        };
        let (mut c, mut p, r) = passive(SmbdConfig::default(), &req.to_bytes());
        assert_eq!(r, Ok(Receive::Established), "{min:#x}..{max:#x}");
        assert_eq!(
            passive_response(&mut c, &mut p).1.negotiated_version,
            0x0100
        );
        assert_eq!(c.params().protocol, 0x0100, "Connection.Protocol");
    }
}

#[test]
fn unsupported_version_is_answered_before_the_other_field_checks() {
    let req = NegotiateRequestRepr {
        min_version: 0x0200,
        max_version: 0x0200,
        credits_requested: 0,
        max_receive_size: 1,
        ..request()
    };
    let (_, _, r) = passive(SmbdConfig::default(), &req.to_bytes());
    assert_eq!(
        r,
        Ok(Receive::NegotiationFailed(ntstatus::STATUS_NOT_SUPPORTED))
    );
}

#[test]
fn negotiate_request_credits_requested_zero_terminates() {
    let req = NegotiateRequestRepr {
        credits_requested: 0,
        ..request()
    };
    let (mut c, mut p, r) = passive(SmbdConfig::default(), &req.to_bytes());
    expect_terminated(&c, r, TerminateReason::NegotiateCreditsRequestedZero);
    assert_eq!(poll(&mut c, ms(10), &mut p), None);
}

#[test]
fn negotiate_request_max_receive_size_below_128_terminates() {
    let req = NegotiateRequestRepr {
        max_receive_size: 127,
        ..request()
    };
    let (c, _, r) = passive(SmbdConfig::default(), &req.to_bytes());
    expect_terminated(
        &c,
        r,
        TerminateReason::NegotiateMaxReceiveSizeTooSmall { value: 127 },
    );
    let req = NegotiateRequestRepr {
        max_receive_size: 128,
        ..request()
    };
    assert_eq!(
        passive(SmbdConfig::default(), &req.to_bytes()).2,
        Ok(Receive::Established)
    );
}

#[test]
fn negotiate_request_max_fragmented_size_below_131072_terminates() {
    let req = NegotiateRequestRepr {
        max_fragmented_size: 131_071,
        ..request()
    };
    let (c, _, r) = passive(SmbdConfig::default(), &req.to_bytes());
    expect_terminated(
        &c,
        r,
        TerminateReason::NegotiateMaxFragmentedSizeTooSmall { value: 131_071 },
    );
    let req = NegotiateRequestRepr {
        max_fragmented_size: 131_072,
        ..request()
    };
    assert_eq!(
        passive(SmbdConfig::default(), &req.to_bytes()).2,
        Ok(Receive::Established)
    );
}

#[test]
fn passive_max_receive_size_is_min_of_ours_and_preferred_send_size_at_least_128() {
    for (preferred, expected) in [(100u32, 128u32), (0, 128), (1000, 1000), (100_000, 8192)] {
        let req = NegotiateRequestRepr {
            preferred_send_size: preferred,
            ..request()
        };
        let (mut c, mut p, r) = passive(SmbdConfig::default(), &req.to_bytes());
        assert_eq!(r, Ok(Receive::Established));
        assert_eq!(
            c.params().max_receive_size,
            expected,
            "PreferredSendSize {preferred}"
        );
        assert_eq!(
            passive_response(&mut c, &mut p).1.max_receive_size,
            expected
        );
    }
}

#[test]
fn note5_strict_preferred_send_size_over_8136_is_insufficient_resources() {
    let strict = SmbdConfig {
        strict_preferred_send_size: true,
        ..SmbdConfig::default()
    };
    let req = NegotiateRequestRepr {
        preferred_send_size: 8137,
        ..request()
    };
    let (mut c, mut p, r) = passive(strict.clone(), &req.to_bytes());
    assert_eq!(
        r,
        Ok(Receive::NegotiationFailed(
            ntstatus::STATUS_INSUFFICIENT_RESOURCES
        ))
    );
    let (t, rsp) = passive_response(&mut c, &mut p);
    assert_eq!(rsp.status, ntstatus::STATUS_INSUFFICIENT_RESOURCES);
    assert!(t.disconnect_after);
    let req = NegotiateRequestRepr {
        preferred_send_size: 8136,
        ..request()
    };
    assert_eq!(passive(strict, &req.to_bytes()).2, Ok(Receive::Established));
    // The normative rule (the default) clamps instead.
    let req = NegotiateRequestRepr {
        preferred_send_size: 8137,
        ..request()
    };
    let (c, _, r) = passive(SmbdConfig::default(), &req.to_bytes());
    assert_eq!(r, Ok(Receive::Established));
    assert_eq!(c.params().max_receive_size, 8137, "min(8192, 8137)");
}

#[test]
fn passive_sets_protocol_receive_credit_target_max_send_size_and_max_fragmented_send_size() {
    let req = NegotiateRequestRepr {
        credits_requested: 77,
        max_receive_size: 600,
        max_fragmented_size: 200_000,
        ..request()
    };
    let (c, _, r) = passive(SmbdConfig::default(), &req.to_bytes());
    assert_eq!(r, Ok(Receive::Established));
    let p = c.params();
    assert_eq!(p.protocol, 0x0100);
    assert_eq!(p.receive_credit_target, 77);
    assert_eq!(c.credits().receive_credit_target, 77);
    assert_eq!(p.max_send_size, 600, "min(1364, 600)");
    assert_eq!(p.max_fragmented_send_size, 200_000);
    let req = NegotiateRequestRepr {
        max_receive_size: 65_536,
        ..request()
    };
    assert_eq!(
        passive(SmbdConfig::default(), &req.to_bytes())
            .0
            .params()
            .max_send_size,
        1364,
        "min(1364, 65536)"
    );
}

#[test]
fn accepted_negotiation_posts_receives_and_grants_them_in_the_response() {
    let (mut c, mut p, r) = passive(SmbdConfig::default(), &request().to_bytes());
    assert_eq!(r, Ok(Receive::Established));
    assert_eq!(
        p.posted, 10,
        "3.1.5.9: posted up to the peer's CreditsRequested"
    );
    assert_eq!(passive_response(&mut c, &mut p).1.credits_granted, 10);
    assert_eq!(c.credits().peer_credits, 10);
}

#[test]
fn no_receive_buffers_at_negotiation_fails_with_severity_error_status() {
    let mut p = CountingPoster {
        posted: 0,
        limit: Some(0),
    };
    let mut c = Connection::new_passive(SmbdConfig::default(), ms(0));
    let r = c.handle_receive(ms(10), &request().to_bytes(), None, &mut p);
    let Ok(Receive::NegotiationFailed(status)) = r else {
        panic!("expected a failure response, got {r:?}")
    };
    assert!(status.is_error(), "{status} has STATUS_SEVERITY_ERROR");
    let (t, rsp) = passive_response(&mut c, &mut p);
    assert_eq!(rsp.status, status);
    assert_eq!(rsp.credits_granted, 0);
    assert!(t.disconnect_after);
    assert!(!c.is_established());
}

#[test]
fn passive_establishes_and_arms_the_idle_timer() {
    let (c, _, r) = passive(SmbdConfig::default(), &request().to_bytes());
    assert_eq!(r, Ok(Receive::Established));
    assert_eq!(c.role(), Role::Established);
    assert!(c.is_established());
    assert_eq!(c.poll_timeout(), Some(ms(10) + Duration::from_secs(120)));
}

#[test]
fn negotiate_decision_taken_elsewhere_is_applied_like_a_received_request() {
    let cfg = SmbdConfig::default();
    let decision = evaluate_negotiate_request(&cfg, &request().to_bytes());
    assert!(matches!(decision, NegotiateDecision::Accept(_)));
    let mut p = CountingPoster::default();
    let mut c = Connection::new_passive(cfg.clone(), ms(0));
    assert_eq!(
        c.apply_negotiate_decision(ms(10), decision, &mut p),
        Ok(Receive::Established)
    );
    let (mut d, mut q, _) = passive(cfg.clone(), &request().to_bytes());
    assert_eq!(
        passive_response(&mut c, &mut p).1,
        passive_response(&mut d, &mut q).1
    );
    let refused = evaluate_negotiate_request(&cfg, &[0u8; 5]);
    let mut c = Connection::new_passive(cfg, ms(0));
    assert_eq!(
        c.apply_negotiate_decision(ms(10), refused, &mut p),
        Err(TerminateReason::NegotiateRequestTooShort { len: 5 })
    );
}

#[test]
fn passive_waits_for_the_active_sides_first_grant_before_sending() {
    let (mut c, mut p, _) = passive(SmbdConfig::default(), &request().to_bytes());
    let _ = passive_response(&mut c, &mut p);
    c.send(1, 10, None).unwrap();
    assert_eq!(poll(&mut c, ms(11), &mut p), None, "no send credits yet");
    assert_eq!(
        deliver(&mut c, &mut p, ms(12), &empty(10, 10)),
        Ok(Receive::Nothing)
    );
    let (t, _) = poll(&mut c, ms(12), &mut p).expect("credits arrived");
    assert_eq!(t.payload.map(|s| s.handle), Some(1));
}

// ---------------------------------------------------------------------------
// 3.1.5.7 Receiving a Negotiate Response Message
// ---------------------------------------------------------------------------

fn active_fed(rsp: &[u8]) -> (Connection, Result<Receive, TerminateReason>) {
    let (mut c, mut p) = active(SmbdConfig::default());
    let r = c.handle_receive(ms(10), rsp, None, &mut p);
    (c, r)
}

#[test]
fn negotiate_response_shorter_than_32_bytes_terminates() {
    for len in [0usize, 20, 31] {
        let (c, r) = active_fed(&response().to_bytes()[..len]);
        expect_terminated(&c, r, TerminateReason::NegotiateResponseTooShort { len });
    }
}

#[test]
fn negotiate_response_nonzero_status_terminates() {
    let (c, r) =
        active_fed(&NegotiateResponseRepr::failure(ntstatus::STATUS_NOT_SUPPORTED).to_bytes());
    expect_terminated(
        &c,
        r,
        TerminateReason::NegotiateResponseStatus {
            status: ntstatus::STATUS_NOT_SUPPORTED,
        },
    );
    let (c, r) = active_fed(
        &NegotiateResponseRepr {
            status: NtStatus(1),
            ..response()
        }
        .to_bytes(),
    );
    expect_terminated(
        &c,
        r,
        TerminateReason::NegotiateResponseStatus {
            status: NtStatus(1),
        },
    );
}

#[test]
fn negotiate_response_version_not_0x0100_terminates() {
    for v in [0x0000u16, 0x0101, 0x0200] {
        let (c, r) = active_fed(
            &NegotiateResponseRepr {
                negotiated_version: v,
                ..response()
            }
            .to_bytes(),
        );
        expect_terminated(
            &c,
            r,
            TerminateReason::NegotiateResponseBadVersion { value: v },
        );
    }
}

#[test]
fn negotiate_response_max_receive_size_below_128_terminates() {
    let (c, r) = active_fed(
        &NegotiateResponseRepr {
            max_receive_size: 127,
            ..response()
        }
        .to_bytes(),
    );
    expect_terminated(
        &c,
        r,
        TerminateReason::NegotiateMaxReceiveSizeTooSmall { value: 127 },
    );
    let (_, r) = active_fed(
        &NegotiateResponseRepr {
            max_receive_size: 128,
            ..response()
        }
        .to_bytes(),
    );
    assert_eq!(r, Ok(Receive::Established));
}

#[test]
fn negotiate_response_max_fragmented_size_below_131072_terminates() {
    let (c, r) = active_fed(
        &NegotiateResponseRepr {
            max_fragmented_size: 131_071,
            ..response()
        }
        .to_bytes(),
    );
    expect_terminated(
        &c,
        r,
        TerminateReason::NegotiateMaxFragmentedSizeTooSmall { value: 131_071 },
    );
}

#[test]
fn negotiate_response_credits_granted_zero_terminates() {
    let (c, r) = active_fed(
        &NegotiateResponseRepr {
            credits_granted: 0,
            ..response()
        }
        .to_bytes(),
    );
    expect_terminated(&c, r, TerminateReason::NegotiateResponseCreditsGrantedZero);
}

#[test]
fn negotiate_response_credits_requested_zero_terminates() {
    let (c, r) = active_fed(
        &NegotiateResponseRepr {
            credits_requested: 0,
            ..response()
        }
        .to_bytes(),
    );
    expect_terminated(&c, r, TerminateReason::NegotiateCreditsRequestedZero);
}

#[test]
fn negotiate_response_preferred_send_size_over_our_max_receive_size_terminates() {
    let (c, r) = active_fed(
        &NegotiateResponseRepr {
            preferred_send_size: 8193,
            ..response()
        }
        .to_bytes(),
    );
    expect_terminated(
        &c,
        r,
        TerminateReason::NegotiateResponsePreferredSendSizeTooLarge {
            value: 8193,
            limit: 8192,
        },
    );
    let (_, r) = active_fed(
        &NegotiateResponseRepr {
            preferred_send_size: 8192,
            ..response()
        }
        .to_bytes(),
    );
    assert_eq!(r, Ok(Receive::Established));
}

#[test]
fn active_applies_negotiated_values_from_response() {
    let rsp = NegotiateResponseRepr {
        credits_requested: 17,
        credits_granted: 5,
        max_read_write_size: 4 << 20,
        preferred_send_size: 900,
        max_receive_size: 700,
        max_fragmented_size: 300_000,
        ..response()
    };
    let (c, p) = active_negotiated(SmbdConfig::default(), rsp);
    let n = c.params();
    assert_eq!(n.protocol, 0x0100);
    assert_eq!(n.receive_credit_target, 17);
    assert_eq!(c.credits().receive_credit_target, 17);
    assert_eq!(n.max_receive_size, 900, "min(8192, PreferredSendSize 900)");
    assert_eq!(n.max_send_size, 700, "min(1364, MaxReceiveSize 700)");
    assert_eq!(n.max_read_write_size, 4 << 20, "min(8 MiB, 4 MiB)");
    assert_eq!(c.credits().send_credits, 5, "SendCredits = CreditsGranted");
    assert_eq!(n.max_fragmented_send_size, 300_000);
    assert_eq!(
        c.credits().recv_posted,
        17,
        "3.1.5.9: receives posted for the peer's 17"
    );
    assert_eq!(p.posted, 17);
}

#[test]
fn active_max_receive_size_is_clamped_to_128() {
    let (c, _) = active_negotiated(
        SmbdConfig::default(),
        NegotiateResponseRepr {
            preferred_send_size: 60,
            ..response()
        },
    );
    assert_eq!(c.params().max_receive_size, 128);
}

#[test]
fn max_read_write_size_is_min_of_ours_and_peers() {
    let small = SmbdConfig {
        max_read_write_size: 1 << 20,
        ..SmbdConfig::default()
    };
    let (c, _) = active_negotiated(
        small,
        NegotiateResponseRepr {
            max_read_write_size: 8 << 20,
            ..response()
        },
    );
    assert_eq!(c.params().max_read_write_size, 1 << 20, "note <6>");
    let (c, _) = active_negotiated(
        SmbdConfig::default(),
        NegotiateResponseRepr {
            max_read_write_size: 65_536,
            ..response()
        },
    );
    assert_eq!(c.params().max_read_write_size, 65_536);
}

#[test]
fn no_receive_buffers_after_negotiate_response_terminates() {
    let (mut c, _) = active(SmbdConfig::default());
    let mut p = CountingPoster {
        posted: 0,
        limit: Some(0),
    };
    let r = c.handle_receive(ms(10), &response().to_bytes(), None, &mut p);
    expect_terminated(&c, r, TerminateReason::NoReceiveCredits);
}

#[test]
fn active_establishes_and_arms_the_idle_timer() {
    let (c, _) = active_negotiated(SmbdConfig::default(), response());
    assert_eq!(c.role(), Role::Established);
    assert!(c.is_established());
    assert_eq!(c.poll_timeout(), Some(ms(10) + Duration::from_secs(120)));
}

#[test]
fn active_first_message_grants_the_passive_side_its_credits() {
    let (mut c, mut p) = active_negotiated(SmbdConfig::default(), response());
    let (t, b) = poll(&mut c, ms(10), &mut p).expect("4.1 step 3");
    assert!(t.is_empty());
    assert_eq!(view(&b).credits_granted(), 10);
    assert_eq!(c.credits().send_credits, 9);
    assert_eq!(poll(&mut c, ms(10), &mut p), None);
}

// ---------------------------------------------------------------------------
// 3.1.5.8 Receiving a Data Transfer Message
// ---------------------------------------------------------------------------

#[test]
fn data_transfer_shorter_than_20_bytes_terminates() {
    for len in [0usize, 19] {
        let (mut c, mut p) = established_default();
        let r = deliver(&mut c, &mut p, ms(20), &empty(10, 0)[..len]);
        expect_terminated(&c, r, TerminateReason::DataTransferTooShort { len });
    }
}

#[test]
fn credits_requested_zero_in_data_transfer_terminates() {
    for msg in [empty(0, 1), data(0, 0, 0, 0, b"abc")] {
        let (mut c, mut p) = established_default();
        let r = deliver(&mut c, &mut p, ms(20), &msg);
        expect_terminated(&c, r, TerminateReason::DataTransferCreditsRequestedZero);
    }
}

#[test]
fn data_offset_not_8_byte_aligned_terminates() {
    for (offset, length) in [(28u32, 4u32), (25, 1), (4, 0), (20, 0)] {
        let (mut c, mut p) = established_default();
        let r = deliver(&mut c, &mut p, ms(20), &raw_data(10, 0, offset, length, 40));
        expect_terminated(&c, r, TerminateReason::DataOffsetUnaligned { offset });
    }
}

#[test]
fn data_offset_plus_length_beyond_message_terminates() {
    let cases = [
        (24u32, 17u32, 40usize),
        (32, 9, 40),
        (0xFFFF_FFF8, 16, 40),
        (24, u32::MAX, 40),
        (48, 0, 40),
    ];
    for (offset, length, len) in cases {
        let (mut c, mut p) = established_default();
        let r = deliver(
            &mut c,
            &mut p,
            ms(20),
            &raw_data(10, 0, offset, length, len),
        );
        expect_terminated(
            &c,
            r,
            TerminateReason::DataBeyondMessage {
                offset,
                length,
                message_len: len,
            },
        );
    }
    let (mut c, mut p) = established_default();
    assert!(matches!(
        deliver(&mut c, &mut p, ms(20), &raw_data(10, 0, 24, 16, 40)),
        Ok(Receive::Message { .. })
    ));
}

#[test]
fn data_offset_inside_header_with_data_terminates() {
    for offset in [0u32, 8, 16] {
        let (mut c, mut p) = established_default();
        let r = deliver(&mut c, &mut p, ms(20), &raw_data(10, 0, offset, 4, 40));
        expect_terminated(&c, r, TerminateReason::DataOffsetInsideHeader { offset });
    }
}

#[test]
fn data_length_plus_remaining_over_max_fragmented_recv_size_terminates() {
    let (mut c, mut p) = established_default();
    let limit = c.params().max_fragmented_recv_size;
    let r = deliver(&mut c, &mut p, ms(20), &data(10, 0, 0, limit - 2, b"abc"));
    expect_terminated(
        &c,
        r,
        TerminateReason::FragmentedSizeExceeded {
            total: limit as u64 + 1,
            limit,
        },
    );
    let (mut c, mut p) = established_default();
    assert_eq!(
        deliver(&mut c, &mut p, ms(20), &data(10, 0, 0, limit - 3, b"abc")),
        Ok(Receive::Nothing)
    );
    let (mut c, mut p) = established_default();
    let r = deliver(&mut c, &mut p, ms(20), &raw_data(10, u32::MAX, 0, 0, 20));
    expect_terminated(
        &c,
        r,
        TerminateReason::FragmentedSizeExceeded {
            total: u32::MAX as u64,
            limit,
        },
    );
}

#[test]
fn receive_decrements_receive_credits() {
    let (mut c, mut p) = established_default();
    let before = *c.credits();
    assert_eq!(
        deliver(&mut c, &mut p, ms(20), &empty(10, 0)),
        Ok(Receive::Nothing)
    );
    assert_eq!(c.credits().recv_posted, before.recv_posted - 1);
    assert_eq!(c.credits().peer_credits, before.peer_credits - 1);
}

#[test]
fn message_arriving_with_no_receive_posted_terminates() {
    let (mut c, mut p) = established(
        SmbdConfig::default(),
        NegotiateResponseRepr {
            credits_requested: 1,
            ..response()
        },
    );
    // The peer asked for 1 credit: one receive is posted and granted.
    let posted = c.credits().recv_posted;
    for _ in 0..posted {
        assert_eq!(
            deliver(&mut c, &mut p, ms(20), &empty(1, 0)),
            Ok(Receive::Nothing)
        );
    }
    assert_eq!(c.credits().recv_posted, 0);
    let r = deliver(&mut c, &mut p, ms(20), &empty(1, 0));
    expect_terminated(&c, r, TerminateReason::SendWithoutCredit);
}

#[test]
fn receive_credit_target_is_updated_from_each_message() {
    let (mut c, mut p) = established_default();
    for cr in [5u16, 300, 1, 65_535] {
        deliver(&mut c, &mut p, ms(20), &empty(cr, 1)).unwrap();
        assert_eq!(c.credits().receive_credit_target, cr);
    }
}

#[test]
fn receive_target_follows_the_peers_latest_credits_requested() {
    let (mut c, mut p) = established_default();
    assert_eq!(c.credits().recv_posted, 10);
    // The peer now asks for 20: the next grant tops up to 20.
    deliver(&mut c, &mut p, ms(20), &data(20, 0, 0, 0, b"x")).unwrap();
    c.send(1, 10, None).unwrap();
    let sent = drain(&mut c, ms(20), &mut p);
    assert_eq!(view(&sent[0].1).credits_granted(), 11);
    assert_eq!(c.credits().peer_credits, 20);
}

#[test]
fn peer_requesting_65535_credits_gets_at_most_receive_credit_max() {
    let cfg = SmbdConfig {
        receive_credit_max: 16,
        ..SmbdConfig::default()
    };
    let rsp = NegotiateResponseRepr {
        credits_requested: 65_535,
        credits_granted: 255,
        ..response()
    };
    let (mut c, mut p) = established(cfg, rsp);
    assert_eq!(c.credits().peer_credits, 16);
    for _ in 0..50 {
        deliver(&mut c, &mut p, ms(20), &data(65_535, 0, 0, 0, b"x")).unwrap();
        c.send(1, 10, None).unwrap();
        let _ = drain(&mut c, ms(20), &mut p);
        assert!(c.credits().peer_credits <= 16, "{:?}", c.credits());
        assert!(c.credits().recv_posted <= 16);
    }
    // Passive side: the negotiate response grants at most ReceiveCreditMax.
    let cfg = SmbdConfig {
        receive_credit_max: 16,
        ..SmbdConfig::default()
    };
    let req = NegotiateRequestRepr {
        credits_requested: 65_535,
        ..request()
    };
    let (mut c, mut p, _) = passive(cfg, &req.to_bytes());
    assert_eq!(passive_response(&mut c, &mut p).1.credits_granted, 16);
}

#[test]
fn response_requested_is_answered_promptly_without_setting_own_keepalive_pending() {
    let (mut c, mut p) = established_default();
    let r = deliver(
        &mut c,
        &mut p,
        ms(20),
        &data(10, 0, SMB_DIRECT_RESPONSE_REQUESTED, 0, &[]),
    );
    assert_eq!(r, Ok(Receive::Nothing));
    assert_eq!(
        c.keepalive_state(),
        KeepaliveState::None,
        "docs/spec-notes.md: no keepalive ping-pong"
    );
    assert_eq!(c.stats().keepalives_received, 1);
    let sent = drain(&mut c, ms(20), &mut p);
    assert_eq!(sent.len(), 1, "one prompt answer");
    assert!(sent[0].0.is_empty());
    assert_eq!(
        view(&sent[0].1).flags(),
        0,
        "the answer does not ask for an answer"
    );
}

#[test]
fn response_requested_is_answered_by_queued_data_when_there_is_some() {
    let (mut c, mut p) = established_default();
    c.send(1, 10, None).unwrap();
    deliver(
        &mut c,
        &mut p,
        ms(20),
        &data(10, 0, SMB_DIRECT_RESPONSE_REQUESTED, 0, &[]),
    )
    .unwrap();
    let sent = drain(&mut c, ms(20), &mut p);
    assert_eq!(sent.len(), 1);
    assert!(sent[0].0.payload.is_some());
}

#[test]
fn credits_granted_increments_send_credits_and_restarts_the_send_queue() {
    let (mut c, mut p) = established(
        SmbdConfig::default(),
        NegotiateResponseRepr {
            credits_granted: 1,
            ..response()
        },
    );
    assert_eq!(c.credits().send_credits, 0);
    c.send(1, 10, None).unwrap();
    c.send(2, 10, None).unwrap();
    assert_eq!(poll(&mut c, ms(20), &mut p), None);
    deliver(&mut c, &mut p, ms(21), &empty(10, 3)).unwrap();
    assert_eq!(c.credits().send_credits, 3);
    let handles: Vec<u64> = drain(&mut c, ms(21), &mut p)
        .iter()
        .filter_map(|(t, _)| t.payload.map(|s| s.handle))
        .collect();
    assert_eq!(handles, vec![1, 2]);
}

#[test]
fn unfragmented_message_is_delivered_in_place() {
    let (mut c, mut p) = established_default();
    let msg = data(10, 0, 0, 0, b"hello");
    let r = deliver(&mut c, &mut p, ms(20), &msg).unwrap();
    assert_eq!(
        r,
        Receive::Message {
            data: MessageData::InPlace(24..29),
            invalidated_token: None
        }
    );
    assert_eq!(&msg[24..29], b"hello");
    assert_eq!(c.stats().messages_delivered, 1);
}

#[test]
fn fragments_are_reassembled_and_delivered_with_the_final_fragment() {
    let (mut c, mut p) = established_default();
    assert_eq!(
        deliver(&mut c, &mut p, ms(20), &data(10, 0, 0, 7, b"abc")),
        Ok(Receive::Nothing)
    );
    assert_eq!(
        deliver(&mut c, &mut p, ms(20), &data(10, 0, 0, 3, b"defg")),
        Ok(Receive::Nothing)
    );
    let r = deliver(&mut c, &mut p, ms(20), &data(10, 0, 0, 0, b"hij")).unwrap();
    assert_eq!(
        r,
        Receive::Message {
            data: MessageData::Reassembled,
            invalidated_token: None
        }
    );
    assert_eq!(c.reassembled(), b"abcdefghij");
    // The buffer is cleared for the next message.
    let r = deliver(&mut c, &mut p, ms(20), &data(10, 0, 0, 1, b"k")).unwrap();
    assert_eq!(r, Receive::Nothing);
    deliver(&mut c, &mut p, ms(20), &data(10, 0, 0, 0, b"l")).unwrap();
    assert_eq!(c.reassembled(), b"kl");
}

#[test]
fn remaining_data_length_must_count_down() {
    let (mut c, mut p) = established_default();
    deliver(&mut c, &mut p, ms(20), &data(10, 0, 0, 10, b"abcd")).unwrap();
    let r = deliver(&mut c, &mut p, ms(20), &data(10, 0, 0, 9, b"efgh"));
    expect_terminated(
        &c,
        r,
        TerminateReason::FragmentCountdownMismatch {
            expected: 6,
            got: 9,
        },
    );
    assert_eq!(
        c.reassembly_buffered(),
        0,
        "the partial message is discarded"
    );
}

#[test]
fn final_fragment_with_bytes_still_expected_terminates() {
    let (mut c, mut p) = established_default();
    deliver(&mut c, &mut p, ms(20), &data(10, 0, 0, 10, b"abcd")).unwrap();
    let r = deliver(&mut c, &mut p, ms(20), &data(10, 0, 0, 0, b"efgh"));
    expect_terminated(
        &c,
        r,
        TerminateReason::FragmentCountdownMismatch {
            expected: 6,
            got: 0,
        },
    );
}

#[test]
fn fragment_longer_than_remaining_terminates() {
    let (mut c, mut p) = established_default();
    deliver(&mut c, &mut p, ms(20), &data(10, 0, 0, 2, b"abcd")).unwrap();
    let r = deliver(&mut c, &mut p, ms(20), &data(10, 0, 0, 0, b"efgh"));
    expect_terminated(
        &c,
        r,
        TerminateReason::FragmentOverrun {
            remaining: 2,
            length: 4,
        },
    );
}

#[test]
fn invalidated_token_is_delivered_with_final_fragment() {
    let (mut c, mut p) = established_default();
    assert_eq!(
        c.handle_receive(ms(20), &data(10, 0, 0, 4, b"ab"), Some(1), &mut p),
        Ok(Receive::Nothing)
    );
    assert_eq!(
        c.handle_receive(ms(20), &data(10, 0, 0, 2, b"cd"), Some(2), &mut p),
        Ok(Receive::Nothing)
    );
    let r = c
        .handle_receive(ms(20), &data(10, 0, 0, 0, b"ef"), None, &mut p)
        .unwrap();
    assert_eq!(
        r,
        Receive::Message {
            data: MessageData::Reassembled,
            invalidated_token: Some(2)
        },
        "the latest overwrites"
    );
    // Cleared once passed up.
    let r = c
        .handle_receive(ms(20), &data(10, 0, 0, 0, b"g"), None, &mut p)
        .unwrap();
    assert_eq!(
        r,
        Receive::Message {
            data: MessageData::InPlace(24..25),
            invalidated_token: None
        }
    );
    let r = c
        .handle_receive(ms(20), &data(10, 0, 0, 0, b"h"), Some(3), &mut p)
        .unwrap();
    assert_eq!(
        r,
        Receive::Message {
            data: MessageData::InPlace(24..25),
            invalidated_token: Some(3)
        }
    );
}

#[test]
fn empty_message_inside_a_fragmented_sequence_is_a_control_message() {
    let (mut c, mut p) = established(
        SmbdConfig::default(),
        NegotiateResponseRepr {
            credits_granted: 2,
            ..response()
        },
    );
    let before = c.credits().send_credits;
    deliver(&mut c, &mut p, ms(20), &data(10, 0, 0, 3, b"abc")).unwrap();
    assert_eq!(
        deliver(&mut c, &mut p, ms(20), &empty(10, 2)),
        Ok(Receive::Nothing)
    );
    assert_eq!(c.credits().send_credits, before + 2, "its grant counts");
    let r = deliver(&mut c, &mut p, ms(20), &data(10, 0, 0, 0, b"def")).unwrap();
    assert_eq!(
        r,
        Receive::Message {
            data: MessageData::Reassembled,
            invalidated_token: None
        }
    );
    assert_eq!(c.reassembled(), b"abcdef");
}

#[test]
fn peer_left_without_credits_is_granted_promptly() {
    let (mut c, mut p) = established_default();
    for i in 0..10 {
        deliver(&mut c, &mut p, ms(20), &empty(10, 0)).unwrap();
        if i < 9 {
            assert_eq!(
                poll(&mut c, ms(20), &mut p),
                None,
                "peer still holds credits"
            );
        }
    }
    assert_eq!(c.credits().peer_credits, 0);
    let (t, b) = poll(&mut c, ms(20), &mut p).expect("prompt grant");
    assert!(t.is_empty());
    assert_eq!(view(&b).credits_granted(), 10);
}

#[test]
fn grant_only_message_waits_until_the_peer_is_down_to_half_its_target() {
    let (mut c, mut p) = established_default();
    for _ in 0..4 {
        deliver(&mut c, &mut p, ms(20), &data(10, 0, 0, 0, b"x")).unwrap();
        assert_eq!(
            poll(&mut c, ms(20), &mut p),
            None,
            "peer holds more than half of 10"
        );
    }
    deliver(&mut c, &mut p, ms(20), &data(10, 0, 0, 0, b"x")).unwrap();
    let (t, b) = poll(&mut c, ms(20), &mut p).expect("refill at 5");
    assert!(t.is_empty());
    assert_eq!(view(&b).credits_granted(), 5);
    assert_eq!(poll(&mut c, ms(20), &mut p), None);
}

#[test]
fn grants_ride_on_data_messages_without_an_extra_empty_message() {
    let (mut c, mut p) = established_default();
    for _ in 0..5 {
        deliver(&mut c, &mut p, ms(20), &data(10, 0, 0, 0, b"x")).unwrap();
    }
    c.send(1, 10, None).unwrap();
    let sent = drain(&mut c, ms(20), &mut p);
    assert_eq!(sent.len(), 1);
    assert!(sent[0].0.payload.is_some());
    assert_eq!(view(&sent[0].1).credits_granted(), 5);
}

// ---------------------------------------------------------------------------
// 3.1.5.9 Managing Credits Prior to Sending
// ---------------------------------------------------------------------------

#[test]
fn sufficient_receive_credits_post_nothing_and_grant_zero() {
    let (mut c, mut p) = established_default();
    let posted = p.posted;
    c.send(1, 10, None).unwrap();
    let sent = drain(&mut c, ms(20), &mut p);
    assert_eq!(view(&sent[0].1).credits_granted(), 0);
    assert_eq!(p.posted, posted);
}

#[test]
fn receive_credits_zero_posts_at_least_one() {
    let rsp = NegotiateResponseRepr {
        credits_requested: 1,
        ..response()
    };
    let (mut c, mut p) = established(SmbdConfig::default(), rsp);
    while c.credits().recv_posted > 0 {
        deliver(&mut c, &mut p, ms(20), &empty(1, 0)).unwrap();
    }
    let posted = p.posted;
    let (_, b) = poll(&mut c, ms(20), &mut p).expect("a grant for the peer at zero");
    assert!(p.posted > posted);
    assert!(view(&b).credits_granted() >= 1);
    assert!(c.credits().recv_posted >= 1);
}

#[test]
fn last_send_credit_with_queued_data_posts_an_extra_receive_beyond_the_target() {
    let (mut c, mut p) = established(
        SmbdConfig::default(),
        NegotiateResponseRepr {
            credits_granted: 3,
            ..response()
        },
    );
    deliver(&mut c, &mut p, ms(20), &data(10, 0, 0, 0, b"x")).unwrap();
    // Not the last credit: top up to the target of 10 and grant.
    c.send(1, 10, None).unwrap();
    let (_, b) = poll(&mut c, ms(20), &mut p).expect("sent");
    assert_eq!(view(&b).credits_granted(), 1);
    let k = *c.credits();
    assert_eq!(
        (k.send_credits, k.recv_posted, k.peer_credits),
        (1, 10, 10),
        "at the target, all granted"
    );
    // The last credit: one receive beyond the target pays for the grant.
    c.send(2, 10, None).unwrap();
    let (_, b) = poll(&mut c, ms(20), &mut p).expect("sent");
    assert_eq!(view(&b).credits_granted(), 1);
    assert_eq!(c.credits().recv_posted, 11);
    assert_eq!(c.credits().send_credits, 0);
}

#[test]
fn receives_are_topped_up_to_the_peers_credit_target() {
    let (mut c, mut p) = established_default();
    for _ in 0..3 {
        deliver(&mut c, &mut p, ms(20), &data(10, 0, 0, 0, b"x")).unwrap();
    }
    assert_eq!(c.credits().recv_posted, 7);
    let posted = p.posted;
    c.send(1, 10, None).unwrap();
    let sent = drain(&mut c, ms(20), &mut p);
    assert_eq!(p.posted - posted, 3, "back up to the target of 10");
    assert_eq!(
        view(&sent[0].1).credits_granted(),
        3,
        "the grant is what was posted"
    );
}

#[test]
fn poster_shortfall_grants_only_the_receives_actually_posted() {
    let (mut c, mut p) = established_default();
    for _ in 0..6 {
        deliver(&mut c, &mut p, ms(20), &data(10, 0, 0, 0, b"x")).unwrap();
    }
    p.limit = Some(p.posted + 2);
    let (_, b) = poll(&mut c, ms(20), &mut p).expect("grant");
    assert_eq!(view(&b).credits_granted(), 2);
    assert_eq!(c.credits().recv_posted, 6);
}

#[test]
fn exhausted_poster_sends_no_grant_only_message() {
    let (mut c, mut p) = established_default();
    p.limit = Some(p.posted);
    for _ in 0..10 {
        deliver(&mut c, &mut p, ms(20), &data(10, 0, 0, 0, b"x")).unwrap();
    }
    assert_eq!(c.credits().peer_credits, 0);
    assert_eq!(
        poll(&mut c, ms(20), &mut p),
        None,
        "an empty message with nothing to grant says nothing"
    );
    p.limit = None;
    let (_, b) = poll(&mut c, ms(21), &mut p).expect("grant once buffers are back");
    assert_eq!(view(&b).credits_granted(), 10);
}

#[test]
fn receive_buffers_required_is_receive_credit_max_plus_one() {
    assert_eq!(receive_buffers_required(255), 256);
    assert_eq!(receive_buffers_required(1), 2);
    // A connection never has more posted, whatever the peer asks.
    let cfg = SmbdConfig {
        receive_credit_max: 3,
        send_credit_target: 1,
        ..SmbdConfig::default()
    };
    let rsp = NegotiateResponseRepr {
        credits_requested: 65_535,
        credits_granted: 1,
        ..response()
    };
    let (mut c, mut p) = established(cfg, rsp);
    for i in 0..20 {
        deliver(&mut c, &mut p, ms(20), &data(65_535, 1, 0, 0, b"x")).unwrap();
        c.send(i, 10, None).unwrap();
        let _ = drain(&mut c, ms(20), &mut p);
        assert!(c.credits().recv_posted as u32 <= receive_buffers_required(3));
    }
}

/// The provisioning rule behind `receive_buffers_required`, pinned: with
/// fewer buffers, a sender at its last credit whose receives are all posted
/// and granted cannot send (3.1.5.1) until the peer sends it something.
#[test]
fn receive_pool_below_receive_credit_max_plus_one_stalls_at_the_last_credit() {
    let cfg = SmbdConfig {
        receive_credit_max: 3,
        ..SmbdConfig::default()
    };
    // The peer asks for 3 credits and grants 2.
    let rsp = NegotiateResponseRepr {
        credits_requested: 3,
        credits_granted: 2,
        ..response()
    };
    let (mut c, _) = active(cfg);
    let mut p = CountingPoster {
        posted: 0,
        limit: Some(3),
    }; // a pool of 3 < 3 + 1
    c.handle_receive(ms(10), &rsp.to_bytes(), None, &mut p)
        .unwrap();
    let sent = drain(&mut c, ms(10), &mut p);
    assert_eq!(
        view(&sent[0].1).credits_granted(),
        3,
        "the whole pool is granted"
    );
    assert_eq!(
        (
            c.credits().send_credits,
            c.credits().recv_posted,
            c.credits().peer_credits
        ),
        (1, 3, 3)
    );
    c.send(1, 10, None).unwrap();
    assert_eq!(
        poll(&mut c, ms(11), &mut p),
        None,
        "stalled at the last credit"
    );
    // The peer's keepalive consumes a receive; its buffer returns to the pool.
    deliver(
        &mut c,
        &mut p,
        ms(12),
        &data(3, 0, SMB_DIRECT_RESPONSE_REQUESTED, 0, &[]),
    )
    .unwrap();
    p.limit = Some(4);
    let (t, b) = poll(&mut c, ms(12), &mut p).expect("unstalled");
    assert_eq!(t.payload.map(|s| s.handle), Some(1));
    assert_eq!(view(&b).credits_granted(), 1);
}

#[test]
fn two_peers_with_one_credit_each_do_not_exchange_grants_forever() {
    for (ta, tb, ma, mb) in [
        (1u16, 1u16, 255u16, 255u16),
        (1, 1, 1, 1),
        (255, 255, 1, 1),
        (1, 2, 1, 255),
    ] {
        let ca = SmbdConfig {
            send_credit_target: ta,
            receive_credit_max: ma,
            ..SmbdConfig::default()
        };
        let cb = SmbdConfig {
            send_credit_target: tb,
            receive_credit_max: mb,
            ..SmbdConfig::default()
        };
        let (mut a, mut pa) = (Connection::new_active(ca, ms(0)), CountingPoster::default());
        let (mut b, mut pb) = (
            Connection::new_passive(cb, ms(0)),
            CountingPoster::default(),
        );
        let mut messages = 0;
        for round in 0..100 {
            let from_a = drain(&mut a, ms(round), &mut pa);
            for (_, m) in &from_a {
                b.handle_receive(ms(round), m, None, &mut pb).unwrap();
            }
            let from_b = drain(&mut b, ms(round), &mut pb);
            for (_, m) in &from_b {
                a.handle_receive(ms(round), m, None, &mut pa).unwrap();
            }
            messages += from_a.len() + from_b.len();
            if from_a.is_empty() && from_b.is_empty() {
                break;
            }
        }
        assert!(
            messages <= 4,
            "targets {ta}/{tb}, max {ma}/{mb}: {messages} messages to settle"
        );
        assert!(
            a.credits().send_credits >= 1 && b.credits().send_credits >= 1,
            "both can send at rest"
        );
    }
}

// ---------------------------------------------------------------------------
// 3.1.2.2 / 3.1.6.2 Idle Connection Timer and keepalives
// ---------------------------------------------------------------------------

#[test]
fn keepalive_fires_after_idle_interval_with_response_requested() {
    let (mut c, mut p) = established_default();
    let idle = ms(10) + Duration::from_secs(120);
    assert_eq!(c.poll_timeout(), Some(idle));
    c.handle_timeout(before(idle, Duration::from_nanos(1)))
        .unwrap();
    assert_eq!(c.keepalive_state(), KeepaliveState::None);
    c.handle_timeout(idle).unwrap();
    assert_eq!(c.keepalive_state(), KeepaliveState::Pending);
    let (t, b) = poll(&mut c, idle, &mut p).expect("keepalive");
    assert!(
        t.is_empty(),
        "no upper-layer message pending: an empty message"
    );
    assert_eq!(view(&b).flags(), SMB_DIRECT_RESPONSE_REQUESTED);
    assert_eq!(c.keepalive_state(), KeepaliveState::Sent);
    assert_eq!(c.stats().keepalives_sent, 1);
    assert_eq!(
        c.poll_timeout(),
        Some(idle + Duration::from_secs(5)),
        "note <3>: 5 s"
    );
}

#[test]
fn unanswered_keepalive_terminates() {
    let (mut c, mut p) = established_default();
    let idle = c.poll_timeout().unwrap();
    c.handle_timeout(idle).unwrap();
    let _ = drain(&mut c, idle, &mut p);
    let answer_by = c.poll_timeout().unwrap();
    assert_eq!(
        c.handle_timeout(before(answer_by, Duration::from_nanos(1))),
        Ok(())
    );
    assert_eq!(
        c.handle_timeout(answer_by),
        Err(TerminateReason::KeepaliveTimeout)
    );
    assert_eq!(c.terminated(), Some(TerminateReason::KeepaliveTimeout));
    assert_eq!(c.poll_timeout(), None);
}

#[test]
fn answered_keepalive_keeps_the_connection_up() {
    let (mut c, mut p) = established_default();
    let idle = c.poll_timeout().unwrap();
    c.handle_timeout(idle).unwrap();
    let _ = drain(&mut c, idle, &mut p);
    let answered = idle + Duration::from_secs(1);
    deliver(&mut c, &mut p, answered, &empty(10, 0)).unwrap();
    assert_eq!(c.keepalive_state(), KeepaliveState::None);
    assert_eq!(c.poll_timeout(), Some(answered + Duration::from_secs(120)));
    assert_eq!(c.handle_timeout(answered + Duration::from_secs(6)), Ok(()));
    assert!(c.is_established());
}

#[test]
fn keepalive_rides_on_queued_data() {
    let (mut c, mut p) = established_default();
    let idle = c.poll_timeout().unwrap();
    c.handle_timeout(idle).unwrap();
    assert_eq!(c.keepalive_state(), KeepaliveState::Pending);
    c.send(1, 10, None).unwrap();
    let sent = drain(&mut c, idle, &mut p);
    assert_eq!(sent.len(), 1, "no separate keepalive message");
    assert!(sent[0].0.payload.is_some());
    assert_eq!(view(&sent[0].1).flags(), SMB_DIRECT_RESPONSE_REQUESTED);
    assert_eq!(c.keepalive_state(), KeepaliveState::Sent);
}

#[test]
fn keepalive_that_cannot_be_sent_for_lack_of_credit_terminates_after_the_response_timeout() {
    let (mut c, mut p) = established(
        SmbdConfig::default(),
        NegotiateResponseRepr {
            credits_granted: 1,
            ..response()
        },
    );
    assert_eq!(c.credits().send_credits, 0);
    let idle = c.poll_timeout().unwrap();
    c.handle_timeout(idle).unwrap();
    assert_eq!(poll(&mut c, idle, &mut p), None);
    assert_eq!(c.keepalive_state(), KeepaliveState::Pending);
    assert_eq!(
        c.handle_timeout(idle + Duration::from_secs(5)),
        Err(TerminateReason::KeepaliveTimeout)
    );
}

// ---------------------------------------------------------------------------
// 3.1.7.1 Connection Loss
// ---------------------------------------------------------------------------

#[test]
fn connection_loss_terminates_and_silences_the_connection() {
    let (mut c, mut p) = established(
        SmbdConfig::default(),
        NegotiateResponseRepr {
            credits_granted: 1,
            ..response()
        },
    );
    c.send(1, 10, None).unwrap();
    c.send(2, 10, None).unwrap();
    c.handle_connection_lost();
    assert_eq!(c.terminated(), Some(TerminateReason::ConnectionLost));
    assert!(!c.is_established());
    assert_eq!(c.poll_timeout(), None);
    assert_eq!(poll(&mut c, ms(20), &mut p), None);
    assert_eq!(
        deliver(&mut c, &mut p, ms(20), &empty(10, 5)),
        Err(TerminateReason::ConnectionLost)
    );
    assert_eq!(c.send(3, 10, None), Err(SendError::NotEstablished));
    let handles: Vec<u64> = c.drain_send_queue().map(|m| m.handle).collect();
    assert_eq!(
        handles,
        vec![1, 2],
        "queued messages are handed back for release"
    );
    assert!(!TerminateReason::ConnectionLost.is_peer_violation());
}

#[test]
fn local_close_terminates_and_first_reason_is_kept() {
    let (mut c, mut p) = established_default();
    c.close();
    c.handle_connection_lost();
    assert_eq!(c.terminated(), Some(TerminateReason::LocalClose));
    assert_eq!(poll(&mut c, ms(20), &mut p), None);
}

// ---------------------------------------------------------------------------
// Connection::transmit_now: the send queue's fast path changes nothing
// ---------------------------------------------------------------------------

/// Two identical connections driven through the same random sends, peer
/// messages and timers: one sends through `transmit_now` where it may (the
/// general path otherwise), its twin always through `send_at` +
/// `poll_transmit`. Every message goes on the wire with the same bytes and
/// both connections end every step in the same state.
#[test]
fn transmit_now_is_send_at_and_poll_transmit_without_the_queue() {
    let (mut a, mut pa) = established_default();
    let (mut b, mut pb) = established_default();
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut rnd = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let (mut fast, mut general) = (0, 0);
    let mut t = 20;
    for step in 0..5_000u64 {
        let now = ms(t);
        match rnd(10) {
            0..=4 => {
                // A message of 1..=1400 bytes (MaxSendSize 1024: some need
                // two segments).
                let len = 1 + rnd(1400) as u32;
                let mut h = [0u8; 24];
                match a.transmit_now(&mut pa, len, &mut h) {
                    Some(grant) => {
                        fast += 1;
                        b.send_at(step, 0, len, None).unwrap();
                        let (tb, bytes) = poll(&mut b, now, &mut pb).expect("the twin sends too");
                        assert_eq!(tb.credits_granted, grant, "step {step}");
                        assert_eq!(tb.header_len, 24);
                        assert_eq!(
                            tb.payload.map(|p| (p.offset, p.len, p.last)),
                            Some((0, len, true))
                        );
                        assert_eq!(&bytes[..24], &h[..], "step {step}: header bytes");
                    }
                    None => {
                        general += 1;
                        let ra = a.send_at(step, 0, len, None);
                        let rb = b.send_at(step, 0, len, None);
                        assert_eq!(ra, rb);
                        let sa = drain(&mut a, now, &mut pa);
                        let sb = drain(&mut b, now, &mut pb);
                        assert_eq!(sa, sb, "step {step}");
                    }
                }
            }
            5..=8 => {
                // The peer sends (only with a credit of ours, as it must):
                // a grant of 0..=5 credits, with or without a payload.
                if a.credits().peer_credits == 0 {
                    let sa = drain(&mut a, now, &mut pa);
                    assert_eq!(sa, drain(&mut b, now, &mut pb));
                    continue;
                }
                let payload = vec![7u8; rnd(3) as usize * 100];
                let flags = if rnd(20) == 0 {
                    SMB_DIRECT_RESPONSE_REQUESTED
                } else {
                    0
                };
                let m = data(1 + rnd(20) as u16, rnd(6) as u16, flags, 0, &payload);
                assert_eq!(
                    deliver(&mut a, &mut pa, now, &m),
                    deliver(&mut b, &mut pb, now, &m)
                );
                // What each says back (grants, a keepalive answer), as an
                // endpoint flushes after its completions.
                let sa = drain(&mut a, now, &mut pa);
                assert_eq!(sa, drain(&mut b, now, &mut pb), "step {step}");
            }
            _ => {
                // Time passes; timers fire: now and then past the idle
                // timer (a keepalive request goes, 3.1.6.2, answered by the
                // peer's next message well within its 5 s).
                t += if rnd(8) == 0 {
                    115_000 + rnd(10_000)
                } else {
                    rnd(1_000)
                };
                let now = ms(t);
                assert_eq!(a.handle_timeout(now), b.handle_timeout(now));
                let sa = drain(&mut a, now, &mut pa);
                assert_eq!(sa, drain(&mut b, now, &mut pb), "step {step}");
            }
        }
        assert_eq!(a.credits(), b.credits(), "step {step}");
        assert_eq!(a.stats(), b.stats(), "step {step}");
        assert_eq!(a.send_queue_len(), b.send_queue_len(), "step {step}");
        assert_eq!(a.keepalive_state(), b.keepalive_state(), "step {step}");
        assert_eq!(a.terminated(), b.terminated(), "step {step}");
        assert_eq!(pa.posted, pb.posted, "step {step}");
        t += 1;
    }
    // Both paths were taken, many times, and the connection lived on.
    assert!(
        fast > 500 && general > 500,
        "fast {fast}, general {general}"
    );
    assert_eq!(a.terminated(), None);
    assert!(a.stats().keepalives_sent > 0);
}
