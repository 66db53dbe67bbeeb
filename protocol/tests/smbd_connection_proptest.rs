//! Property tests of the SMB Direct connection state machine ([MS-SMBD]
//! 3.1.5.6–3.1.5.8) against untrusted input.
//!
//! (a) Random bytes delivered to a connection in any role never panic; the
//!     outcome is delivery, nothing, or termination with a
//!     [`TerminateReason`], and for an established connection it equals an
//!     independent model of 3.1.5.8 written from the spec text. Once
//!     terminated, a connection stays terminated with the same reason.
//! (b) Structure-aware: a valid fragmented message is delivered intact; the
//!     same sequence with one field of one fragment mutated terminates with
//!     exactly the matching reason.
//! (c) Negotiate Request / Response mutations get the outcome 3.1.5.6 /
//!     3.1.5.7 prescribe (failure response, or termination with the
//!     matching reason); valid ones establish with the values the spec
//!     computes.

use proptest::collection::vec;
use proptest::prelude::*;
use smbdirect_protocol::ntstatus::{self, NtStatus};
use smbdirect_protocol::smbd::config::{SmbdConfig, SMBD_VERSION_1};
use smbdirect_protocol::smbd::credits::CountingPoster;
use smbdirect_protocol::smbd::wire::{
    DataTransferRepr, NegotiateRequestRepr, NegotiateResponse, NegotiateResponseRepr,
};
use smbdirect_protocol::smbd::{Connection, MessageData, Receive, TerminateReason, MAX_HEADER_LEN};
use smbdirect_protocol::time::Instant;

const LIMIT: u32 = 131_072;

fn now() -> Instant {
    Instant::from_nanos(1_000_000_000)
}

fn cfg() -> SmbdConfig {
    SmbdConfig {
        max_fragmented_recv_size: LIMIT,
        ..SmbdConfig::default()
    }
}

fn response() -> NegotiateResponseRepr {
    NegotiateResponseRepr {
        min_version: SMBD_VERSION_1,
        max_version: SMBD_VERSION_1,
        negotiated_version: SMBD_VERSION_1,
        credits_requested: 255,
        credits_granted: 255,
        status: ntstatus::STATUS_SUCCESS,
        max_read_write_size: 1 << 20,
        preferred_send_size: 1364,
        max_receive_size: 8192,
        max_fragmented_size: LIMIT,
    }
}

/// An established active connection (255 receives posted for the peer)
/// that has sent its first grant.
fn established() -> (Connection, CountingPoster) {
    let mut p = CountingPoster::default();
    let mut c = Connection::new_active(cfg(), now());
    let mut h = [0u8; MAX_HEADER_LEN];
    c.poll_transmit(now(), &mut p, &mut h)
        .expect("negotiate request");
    c.handle_receive(now(), &response().to_bytes(), None, &mut p)
        .expect("established");
    while c.poll_transmit(now(), &mut p, &mut h).is_some() {}
    (c, p)
}

fn drain(c: &mut Connection, p: &mut CountingPoster) {
    let mut h = [0u8; MAX_HEADER_LEN];
    let mut n = 0;
    while c.poll_transmit(now(), p, &mut h).is_some() {
        n += 1;
        assert!(n < 1000);
    }
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from(b[at]) | u16::from(b[at + 1]) << 8
}

fn le32(b: &[u8], at: usize) -> u32 {
    (0..4).fold(0u32, |v, i| v | u32::from(b[at + i]) << (8 * i))
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

/// [MS-SMBD] 3.1.5.8 for one message arriving at an established connection
/// with no fragmented message in progress, from the spec text alone.
fn model_first_message(msg: &[u8]) -> Result<Receive, TerminateReason> {
    if msg.len() < 20 {
        return Err(TerminateReason::DataTransferTooShort { len: msg.len() });
    }
    if le16(msg, 0) == 0 {
        return Err(TerminateReason::DataTransferCreditsRequestedZero);
    }
    let (rdl, off, len) = (le32(msg, 8), le32(msg, 12), le32(msg, 16));
    if off % 8 != 0 {
        return Err(TerminateReason::DataOffsetUnaligned { offset: off });
    }
    if len > 0 && off < 20 {
        return Err(TerminateReason::DataOffsetInsideHeader { offset: off });
    }
    if off as u64 + len as u64 > msg.len() as u64 {
        return Err(TerminateReason::DataBeyondMessage {
            offset: off,
            length: len,
            message_len: msg.len(),
        });
    }
    if len as u64 + rdl as u64 > LIMIT as u64 {
        return Err(TerminateReason::FragmentedSizeExceeded {
            total: len as u64 + rdl as u64,
            limit: LIMIT,
        });
    }
    if rdl == 0 && len > 0 {
        let r = off as usize..(off + len) as usize;
        return Ok(Receive::Message {
            data: MessageData::InPlace(r),
            invalidated_token: None,
        });
    }
    Ok(Receive::Nothing)
}

/// Random bytes, or a Data Transfer header with plausible fields and
/// random bytes after it (so that later checks are reached too).
fn data_transfer_like() -> impl Strategy<Value = Vec<u8>> {
    let plausible = (
        0u16..4,
        any::<u16>(),
        prop_oneof![Just(0u32), 0u32..64, Just(LIMIT), any::<u32>()],
        prop_oneof![
            Just(0u32),
            Just(24u32),
            (0u32..8).prop_map(|k| k * 8),
            0u32..64,
            any::<u32>()
        ],
        prop_oneof![Just(0u32), 0u32..200, any::<u32>()],
        vec(any::<u8>(), 0..200),
    )
        .prop_map(|(cr, cg, rdl, off, len, tail)| {
            let mut b = vec![0u8; 20];
            put16(&mut b, 0, cr);
            put16(&mut b, 2, cg);
            put32(&mut b, 8, rdl);
            put32(&mut b, 12, off);
            put32(&mut b, 16, len);
            b.extend_from_slice(&tail);
            b
        });
    prop_oneof![vec(any::<u8>(), 0..80), plausible]
}

fn is_data_transfer_violation(r: &TerminateReason) -> bool {
    use TerminateReason::*;
    matches!(
        r,
        DataTransferTooShort { .. }
            | DataTransferCreditsRequestedZero
            | DataOffsetUnaligned { .. }
            | DataOffsetInsideHeader { .. }
            | DataBeyondMessage { .. }
            | FragmentedSizeExceeded { .. }
            | FragmentCountdownMismatch { .. }
            | FragmentOverrun { .. }
            | SendWithoutCredit
    )
}

// ---------------------------------------------------------------------------
// (a) Random input
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_data_transfer_gets_the_verdict_of_3_1_5_8(msg in data_transfer_like()) {
        let (mut c, mut p) = established();
        let got = c.handle_receive(now(), &msg, None, &mut p);
        prop_assert_eq!(&got, &model_first_message(&msg));
        if let Err(r) = got {
            prop_assert!(r.is_peer_violation());
            prop_assert_eq!(c.terminated(), Some(r));
        }
    }

    #[test]
    fn random_message_sequences_never_panic_and_termination_is_final(
        msgs in vec(data_transfer_like(), 1..24),
        tokens in vec(proptest::option::of(any::<u32>()), 24),
        poll_between in any::<bool>(),
    ) {
        let (mut c, mut p) = established();
        let mut ended: Option<TerminateReason> = None;
        for (m, t) in msgs.iter().zip(tokens) {
            let r = c.handle_receive(now(), m, t, &mut p);
            match (ended, r) {
                (Some(e), r) => prop_assert_eq!(r, Err(e), "terminated stays terminated"),
                (None, Err(e)) => {
                    prop_assert!(is_data_transfer_violation(&e), "{:?}", e);
                    prop_assert_eq!(c.poll_timeout(), None);
                    ended = Some(e);
                }
                (None, Ok(Receive::Message { data: MessageData::InPlace(r), .. })) => {
                    prop_assert!(r.end <= m.len() && r.start >= 20);
                }
                (None, Ok(Receive::Message { data: MessageData::Reassembled, .. })) => {
                    prop_assert!(!c.reassembled().is_empty());
                    prop_assert!(c.reassembled().len() <= LIMIT as usize);
                }
                (None, Ok(Receive::Nothing)) => {}
                (None, Ok(other)) => prop_assert!(false, "unexpected {:?}", other),
            }
            if poll_between {
                drain(&mut c, &mut p);
            }
            prop_assert!(c.reassembly_buffered() <= LIMIT as usize);
        }
    }

    #[test]
    fn random_negotiate_request_never_panics(msg in vec(any::<u8>(), 0..40)) {
        let mut p = CountingPoster::default();
        let mut c = Connection::new_passive(cfg(), now());
        match c.handle_receive(now(), &msg, None, &mut p) {
            Ok(Receive::Established) => prop_assert!(c.is_established()),
            Ok(Receive::NegotiationFailed(s)) => prop_assert!(s.is_error()),
            Ok(other) => prop_assert!(false, "unexpected {:?}", other),
            Err(r) => prop_assert_eq!(c.terminated(), Some(r)),
        }
        let mut h = [0u8; MAX_HEADER_LEN];
        while c.poll_transmit(now(), &mut p, &mut h).is_some() {}
    }

    #[test]
    fn random_negotiate_response_never_panics(msg in vec(any::<u8>(), 0..48)) {
        let mut p = CountingPoster::default();
        let mut c = Connection::new_active(cfg(), now());
        let mut h = [0u8; MAX_HEADER_LEN];
        c.poll_transmit(now(), &mut p, &mut h).expect("negotiate request");
        match c.handle_receive(now(), &msg, None, &mut p) {
            Ok(Receive::Established) => prop_assert!(c.is_established()),
            Ok(other) => prop_assert!(false, "unexpected {:?}", other),
            Err(r) => prop_assert_eq!(c.terminated(), Some(r)),
        }
    }
}

// ---------------------------------------------------------------------------
// (b) A valid fragmented message, then one field of one fragment mutated
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Mutation {
    None,
    CreditsRequestedZero,
    DataOffsetUnaligned(u32),
    /// DataLength grows past the end of the message by this much (≥ 1).
    DataBeyondMessage(u32),
    /// RemainingDataLength grows so that DataLength + it exceeds the limit by this much (≥ 1).
    FragmentedSizeExceeded(u32),
    /// RemainingDataLength of a continuation fragment is off by this (non-zero) amount.
    BrokenCountdown(i64),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        2 => Just(Mutation::None),
        1 => Just(Mutation::CreditsRequestedZero),
        1 => (1u32..8).prop_map(|k| Mutation::DataOffsetUnaligned(24 + k)),
        1 => prop_oneof![1u32..16, Just(u32::MAX / 2)].prop_map(Mutation::DataBeyondMessage),
        1 => prop_oneof![1u32..16, Just(1_000_000)].prop_map(Mutation::FragmentedSizeExceeded),
        1 => prop_oneof![-4000i64..-1, 1i64..4000].prop_map(Mutation::BrokenCountdown),
    ]
}

/// Splits `total` bytes into fragments of the given sizes (the last takes the rest).
fn fragments(total: u32, sizes: &[u32]) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    let mut sent = 0;
    for &s in sizes {
        if sent == total {
            break;
        }
        let n = s.min(total - sent);
        sent += n;
        out.push((n, total - sent));
    }
    if sent < total {
        out.push((total - sent, 0));
    }
    out
}

fn message_byte(i: u32) -> u8 {
    (i as u8).wrapping_mul(13) ^ (i >> 8) as u8
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn one_mutated_field_terminates_with_exactly_the_matching_reason(
        total in 1u32..6000,
        sizes in vec(1u32..1340, 1..40),
        grants in vec(0u16..3, 40),
        which in any::<prop::sample::Index>(),
        m in mutation(),
    ) {
        let (mut c, mut p) = established();
        let frags = fragments(total, &sizes);
        let target = which.index(frags.len());
        // A countdown can only break on a continuation fragment.
        let m = match m {
            Mutation::BrokenCountdown(_) if target == 0 => Mutation::None,
            Mutation::BrokenCountdown(d) => {
                let (dl, rdl) = frags[target];
                let got = rdl as i64 + d;
                if got < 0 || dl as i64 + got > LIMIT as i64 { Mutation::None } else { Mutation::BrokenCountdown(d) }
            }
            other => other,
        };
        let mut offset = 0u32;
        let mut whole = Vec::new();
        for (i, &(dl, rdl)) in frags.iter().enumerate() {
            let payload: Vec<u8> = (offset..offset + dl).map(message_byte).collect();
            offset += dl;
            whole.extend_from_slice(&payload);
            let repr = DataTransferRepr {
                credits_requested: 255,
                credits_granted: grants[i % grants.len()],
                ..DataTransferRepr::with_payload(dl, rdl)
            };
            let mut b = vec![0u8; repr.buffer_len()];
            repr.emit(&mut b, &payload);
            let mut expected = None;
            if i == target {
                match m {
                    Mutation::None => {}
                    Mutation::CreditsRequestedZero => {
                        put16(&mut b, 0, 0);
                        expected = Some(TerminateReason::DataTransferCreditsRequestedZero);
                    }
                    Mutation::DataOffsetUnaligned(off) => {
                        put32(&mut b, 12, off);
                        expected = Some(TerminateReason::DataOffsetUnaligned { offset: off });
                    }
                    Mutation::DataBeyondMessage(k) => {
                        let length = dl + k;
                        put32(&mut b, 16, length);
                        expected = Some(TerminateReason::DataBeyondMessage { offset: 24, length, message_len: b.len() });
                    }
                    Mutation::FragmentedSizeExceeded(k) => {
                        let r = LIMIT - dl + k;
                        put32(&mut b, 8, r);
                        expected = Some(TerminateReason::FragmentedSizeExceeded { total: LIMIT as u64 + k as u64, limit: LIMIT });
                    }
                    Mutation::BrokenCountdown(d) => {
                        let got = (rdl as i64 + d) as u32;
                        put32(&mut b, 8, got);
                        expected = Some(TerminateReason::FragmentCountdownMismatch { expected: rdl, got });
                    }
                }
            }
            let r = c.handle_receive(now(), &b, None, &mut p);
            if let Some(e) = expected {
                prop_assert_eq!(r, Err(e));
                prop_assert_eq!(c.terminated(), Some(e));
                prop_assert_eq!(c.reassembly_buffered(), 0, "partial message discarded");
                return Ok(());
            }
            let last = i + 1 == frags.len();
            match (last, frags.len(), r) {
                (false, _, Ok(Receive::Nothing)) => {}
                (true, 1, Ok(Receive::Message { data: MessageData::InPlace(range), invalidated_token: None })) => {
                    prop_assert_eq!(&b[range], &whole[..]);
                }
                (true, _, Ok(Receive::Message { data: MessageData::Reassembled, invalidated_token: None })) => {
                    prop_assert_eq!(c.reassembled(), &whole[..]);
                }
                (_, _, other) => prop_assert!(false, "fragment {} of {}: {:?}", i, frags.len(), other),
            }
            // The peer keeps within its credits: let the connection grant.
            drain(&mut c, &mut p);
        }
        prop_assert!(matches!(m, Mutation::None));
        prop_assert!(c.is_established());
    }
}

// ---------------------------------------------------------------------------
// (c) Negotiate Request and Response mutations
// ---------------------------------------------------------------------------

fn valid_request() -> impl Strategy<Value = NegotiateRequestRepr> {
    (
        prop_oneof![Just(0x0100u16), 0u16..=0x0100],
        prop_oneof![Just(0x0100u16), 0x0100u16..=u16::MAX],
        1u16..=u16::MAX,
        any::<u32>(),
        128u32..=u32::MAX,
        131_072u32..=u32::MAX,
    )
        .prop_map(
            |(
                min_version,
                max_version,
                credits_requested,
                preferred_send_size,
                max_receive_size,
                max_fragmented_size,
            )| {
                NegotiateRequestRepr {
                    min_version,
                    max_version,
                    credits_requested,
                    preferred_send_size,
                    max_receive_size,
                    max_fragmented_size,
                }
            },
        )
}

#[derive(Debug, Clone)]
enum RequestMutation {
    None,
    Truncate(usize),
    VersionRangeWithout0100(u16, u16),
    CreditsRequestedZero,
    MaxReceiveSizeBelow128(u32),
    MaxFragmentedSizeBelowMinimum(u32),
}

fn request_mutation() -> impl Strategy<Value = RequestMutation> {
    prop_oneof![
        2 => Just(RequestMutation::None),
        1 => (0usize..20).prop_map(RequestMutation::Truncate),
        1 => prop_oneof![
            (0x0101u16..=u16::MAX, any::<u16>()),
            (any::<u16>(), 0u16..0x0100),
        ].prop_map(|(a, b)| RequestMutation::VersionRangeWithout0100(a, b)),
        1 => Just(RequestMutation::CreditsRequestedZero),
        1 => (0u32..128).prop_map(RequestMutation::MaxReceiveSizeBelow128),
        1 => (0u32..131_072).prop_map(RequestMutation::MaxFragmentedSizeBelowMinimum),
    ]
}

fn valid_response(our_max_receive: u32) -> impl Strategy<Value = NegotiateResponseRepr> {
    (
        1u16..=u16::MAX,
        1u16..=u16::MAX,
        any::<u32>(),
        0u32..=our_max_receive,
        128u32..=u32::MAX,
        131_072u32..=u32::MAX,
        any::<(u16, u16)>(),
    )
        .prop_map(
            |(cr, cg, rw, pss, mrs, mfs, (minv, maxv))| NegotiateResponseRepr {
                // MinVersion/MaxVersion are informational for the receiver.
                min_version: minv,
                max_version: maxv,
                negotiated_version: SMBD_VERSION_1,
                credits_requested: cr,
                credits_granted: cg,
                status: ntstatus::STATUS_SUCCESS,
                max_read_write_size: rw,
                preferred_send_size: pss,
                max_receive_size: mrs,
                max_fragmented_size: mfs,
            },
        )
}

#[derive(Debug, Clone)]
enum ResponseMutation {
    None,
    Truncate(usize),
    Status(u32),
    Version(u16),
    MaxReceiveSizeBelow128(u32),
    MaxFragmentedSizeBelowMinimum(u32),
    CreditsGrantedZero,
    CreditsRequestedZero,
    PreferredSendSizeOverOurMaxReceiveSize(u32),
}

fn response_mutation() -> impl Strategy<Value = ResponseMutation> {
    prop_oneof![
        2 => Just(ResponseMutation::None),
        1 => (0usize..32).prop_map(ResponseMutation::Truncate),
        1 => (1u32..=u32::MAX).prop_map(ResponseMutation::Status),
        1 => any::<u16>().prop_filter("not 0x0100", |v| *v != SMBD_VERSION_1).prop_map(ResponseMutation::Version),
        1 => (0u32..128).prop_map(ResponseMutation::MaxReceiveSizeBelow128),
        1 => (0u32..131_072).prop_map(ResponseMutation::MaxFragmentedSizeBelowMinimum),
        1 => Just(ResponseMutation::CreditsGrantedZero),
        1 => Just(ResponseMutation::CreditsRequestedZero),
        1 => (1u32..1_000_000).prop_map(ResponseMutation::PreferredSendSizeOverOurMaxReceiveSize),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn negotiate_request_mutations_get_the_outcome_of_3_1_5_6(
        req in valid_request(),
        m in request_mutation(),
        reserved in any::<u16>(),
        strict in any::<bool>(),
    ) {
        let cfg = SmbdConfig { strict_preferred_send_size: strict, ..cfg() };
        let mut r = req;
        let mut len = 20;
        match m {
            RequestMutation::None => {}
            RequestMutation::Truncate(n) => len = n,
            RequestMutation::VersionRangeWithout0100(a, b) => {
                r.min_version = a;
                r.max_version = b;
            }
            RequestMutation::CreditsRequestedZero => r.credits_requested = 0,
            RequestMutation::MaxReceiveSizeBelow128(v) => r.max_receive_size = v,
            RequestMutation::MaxFragmentedSizeBelowMinimum(v) => r.max_fragmented_size = v,
        }
        let mut bytes = r.to_bytes();
        put16(&mut bytes, 4, reserved); // Reserved: MUST be ignored
        let mut p = CountingPoster::default();
        let mut c = Connection::new_passive(cfg.clone(), now());
        let got = c.handle_receive(now(), &bytes[..len], None, &mut p);
        let expected = match m {
            RequestMutation::Truncate(n) => Err(TerminateReason::NegotiateRequestTooShort { len: n }),
            RequestMutation::VersionRangeWithout0100(..) => Ok(Receive::NegotiationFailed(ntstatus::STATUS_NOT_SUPPORTED)),
            RequestMutation::CreditsRequestedZero => Err(TerminateReason::NegotiateCreditsRequestedZero),
            RequestMutation::MaxReceiveSizeBelow128(v) => Err(TerminateReason::NegotiateMaxReceiveSizeTooSmall { value: v }),
            RequestMutation::MaxFragmentedSizeBelowMinimum(v) => {
                Err(TerminateReason::NegotiateMaxFragmentedSizeTooSmall { value: v })
            }
            RequestMutation::None if strict && r.preferred_send_size > 8136 => {
                Ok(Receive::NegotiationFailed(ntstatus::STATUS_INSUFFICIENT_RESOURCES))
            }
            RequestMutation::None => Ok(Receive::Established),
        };
        prop_assert_eq!(&got, &expected);
        let mut h = [0u8; MAX_HEADER_LEN];
        let sent = c.poll_transmit(now(), &mut p, &mut h);
        match got {
            Err(reason) => {
                prop_assert_eq!(c.terminated(), Some(reason));
                prop_assert!(sent.is_none(), "no response on termination");
            }
            Ok(Receive::NegotiationFailed(status)) => {
                let t = sent.expect("failure response");
                prop_assert!(t.disconnect_after);
                let rsp = NegotiateResponseRepr::parse(&NegotiateResponse::new_checked(&h[..32]).unwrap());
                prop_assert_eq!(rsp, NegotiateResponseRepr::failure(status));
                prop_assert_eq!(c.terminated(), Some(TerminateReason::NegotiateFailed { status }));
            }
            Ok(_) => {
                sent.expect("success response");
                let rsp = NegotiateResponseRepr::parse(&NegotiateResponse::new_checked(&h[..32]).unwrap());
                let n = c.params();
                prop_assert_eq!(n.protocol, SMBD_VERSION_1);
                prop_assert_eq!(n.receive_credit_target, r.credits_requested);
                prop_assert_eq!(n.max_receive_size, cfg.max_receive_size.min(r.preferred_send_size).max(128));
                prop_assert_eq!(n.max_send_size, cfg.max_send_size.min(r.max_receive_size));
                prop_assert_eq!(n.max_fragmented_send_size, r.max_fragmented_size);
                prop_assert_eq!(rsp.status, ntstatus::STATUS_SUCCESS);
                prop_assert_eq!(rsp.negotiated_version, SMBD_VERSION_1);
                prop_assert_eq!(rsp.credits_granted, r.credits_requested.min(cfg.receive_credit_max));
                prop_assert_eq!(rsp.preferred_send_size, n.max_send_size);
                prop_assert_eq!(rsp.max_receive_size, n.max_receive_size);
                prop_assert_eq!(rsp.max_fragmented_size, cfg.max_fragmented_recv_size);
            }
        }
    }

    #[test]
    fn negotiate_response_mutations_get_the_outcome_of_3_1_5_7(
        rsp in valid_response(8192),
        m in response_mutation(),
        reserved in any::<u16>(),
    ) {
        let cfg = cfg();
        let mut r = rsp;
        let mut len = 32;
        let expected = match m {
            ResponseMutation::None => None,
            ResponseMutation::Truncate(n) => {
                len = n;
                Some(TerminateReason::NegotiateResponseTooShort { len: n })
            }
            ResponseMutation::Status(s) => {
                r.status = NtStatus(s);
                Some(TerminateReason::NegotiateResponseStatus { status: NtStatus(s) })
            }
            ResponseMutation::Version(v) => {
                r.negotiated_version = v;
                Some(TerminateReason::NegotiateResponseBadVersion { value: v })
            }
            ResponseMutation::MaxReceiveSizeBelow128(v) => {
                r.max_receive_size = v;
                Some(TerminateReason::NegotiateMaxReceiveSizeTooSmall { value: v })
            }
            ResponseMutation::MaxFragmentedSizeBelowMinimum(v) => {
                r.max_fragmented_size = v;
                Some(TerminateReason::NegotiateMaxFragmentedSizeTooSmall { value: v })
            }
            ResponseMutation::CreditsGrantedZero => {
                r.credits_granted = 0;
                Some(TerminateReason::NegotiateResponseCreditsGrantedZero)
            }
            ResponseMutation::CreditsRequestedZero => {
                r.credits_requested = 0;
                Some(TerminateReason::NegotiateCreditsRequestedZero)
            }
            ResponseMutation::PreferredSendSizeOverOurMaxReceiveSize(k) => {
                r.preferred_send_size = cfg.max_receive_size + k;
                Some(TerminateReason::NegotiateResponsePreferredSendSizeTooLarge {
                    value: cfg.max_receive_size + k,
                    limit: cfg.max_receive_size,
                })
            }
        };
        let mut bytes = r.to_bytes();
        put16(&mut bytes, 6, reserved); // Reserved: MUST be ignored
        let mut p = CountingPoster::default();
        let mut c = Connection::new_active(cfg.clone(), now());
        let mut h = [0u8; MAX_HEADER_LEN];
        c.poll_transmit(now(), &mut p, &mut h).expect("negotiate request");
        let got = c.handle_receive(now(), &bytes[..len], None, &mut p);
        match expected {
            Some(reason) => {
                prop_assert_eq!(got, Err(reason));
                prop_assert_eq!(c.terminated(), Some(reason));
                prop_assert!(c.poll_transmit(now(), &mut p, &mut h).is_none());
            }
            None => {
                prop_assert_eq!(got, Ok(Receive::Established));
                let n = c.params();
                prop_assert_eq!(n.protocol, SMBD_VERSION_1);
                prop_assert_eq!(n.receive_credit_target, r.credits_requested);
                prop_assert_eq!(n.max_receive_size, cfg.max_receive_size.min(r.preferred_send_size).max(128));
                prop_assert_eq!(n.max_send_size, cfg.max_send_size.min(r.max_receive_size));
                prop_assert_eq!(n.max_read_write_size, cfg.max_read_write_size.min(r.max_read_write_size));
                prop_assert_eq!(c.credits().send_credits, r.credits_granted);
                prop_assert_eq!(n.max_fragmented_send_size, r.max_fragmented_size);
                prop_assert_eq!(c.credits().recv_posted, r.credits_requested.min(cfg.receive_credit_max));
            }
        }
    }
}
