//! Tests pinning the choices written down in docs/spec-notes.md (MS-SMBD).

use smbdirect_protocol::smbd::wire::{
    negotiate_ird_ord, DataTransfer, DataTransferRepr, IrdOrdHeader, IrdOrdRepr,
    SMB_DIRECT_RESPONSE_REQUESTED,
};
use smbdirect_protocol::smbd::{
    Connection, CountingPoster, KeepaliveState, MessageData, Receive, SmbdConfig, TerminateReason,
    MAX_HEADER_LEN,
};
use smbdirect_protocol::time::Instant;

/// Drives an active and a passive connection through negotiation and
/// returns both established, with the passive side holding send credits.
fn established_pair() -> (Connection, Connection, CountingPoster) {
    let now = Instant::ZERO;
    let mut p = CountingPoster::default();
    let mut a = Connection::new_active(SmbdConfig::default(), now);
    let mut b = Connection::new_passive(SmbdConfig::default(), now);
    let mut hdr = [0u8; MAX_HEADER_LEN];
    let t = a
        .poll_transmit(now, &mut p, &mut hdr)
        .expect("negotiate request");
    assert_eq!(
        b.handle_receive(now, &hdr[..t.len()], None, &mut p),
        Ok(Receive::Established)
    );
    let t = b
        .poll_transmit(now, &mut p, &mut hdr)
        .expect("negotiate response");
    assert_eq!(
        a.handle_receive(now, &hdr[..t.len()], None, &mut p),
        Ok(Receive::Established)
    );
    // The active side's first message grants the passive side its credits.
    let t = a
        .poll_transmit(now, &mut p, &mut hdr)
        .expect("initial grant");
    assert!(t.credits_granted > 0);
    assert_eq!(
        b.handle_receive(now, &hdr[..t.len()], None, &mut p),
        Ok(Receive::Nothing)
    );
    assert!(b.credits().send_credits > 0);
    (a, b, p)
}

fn data_message(repr: DataTransferRepr, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; repr.buffer_len().max(24)];
    let n = repr.emit(&mut buf, payload);
    buf.truncate(n);
    buf
}

#[test]
fn ird_ord_header_is_big_endian() {
    let h = IrdOrdRepr {
        ird: 0x0102_0304,
        ord: 0x0000_0010,
    };
    assert_eq!(h.to_bytes(), [1, 2, 3, 4, 0, 0, 0, 0x10]);
    let v = IrdOrdHeader::new_checked(&[0u8, 0, 0, 8, 0, 0, 0, 4][..]).unwrap();
    assert_eq!(IrdOrdRepr::parse(&v), IrdOrdRepr { ird: 8, ord: 4 });
    // 6.2: reply IRD = min(our ORD, peer IRD); ORD = min(our IRD, peer ORD).
    let local = IrdOrdRepr { ird: 16, ord: 2 };
    assert_eq!(
        negotiate_ird_ord(local, IrdOrdRepr { ird: 8, ord: 4 }),
        Ok(IrdOrdRepr { ird: 2, ord: 4 })
    );
    assert!(negotiate_ird_ord(local, IrdOrdRepr { ird: 0, ord: 4 }).is_err());
}

#[test]
fn fragmented_size_over_max_fragmented_recv_size_terminates() {
    let (_a, mut b, mut p) = established_pair();
    let limit = b.params().max_fragmented_recv_size;
    let repr = DataTransferRepr {
        credits_requested: 1,
        remaining_data_length: limit,
        ..DataTransferRepr::with_payload(8, limit)
    };
    let msg = data_message(
        DataTransferRepr {
            credits_requested: 1,
            ..repr
        },
        &[0u8; 8],
    );
    let r = b.handle_receive(Instant::ZERO, &msg, None, &mut p);
    assert_eq!(
        r,
        Err(TerminateReason::FragmentedSizeExceeded {
            total: limit as u64 + 8,
            limit
        })
    );
}

#[test]
fn data_offset_inside_header_terminates() {
    let (_a, mut b, mut p) = established_pair();
    let mut msg = data_message(
        DataTransferRepr {
            credits_requested: 1,
            ..DataTransferRepr::with_payload(8, 0)
        },
        &[7u8; 8],
    );
    DataTransfer::new_unchecked(&mut msg[..]).set_data_offset(16);
    let r = b.handle_receive(Instant::ZERO, &msg, None, &mut p);
    assert_eq!(
        r,
        Err(TerminateReason::DataOffsetInsideHeader { offset: 16 })
    );
}

#[test]
fn empty_message_inside_fragmented_sequence_is_tolerated() {
    let (_a, mut b, mut p) = established_pair();
    let now = Instant::ZERO;
    let first = data_message(
        DataTransferRepr {
            credits_requested: 1,
            ..DataTransferRepr::with_payload(4, 4)
        },
        b"abcd",
    );
    assert_eq!(
        b.handle_receive(now, &first, None, &mut p),
        Ok(Receive::Nothing)
    );
    let empty = data_message(
        DataTransferRepr {
            credits_requested: 1,
            credits_granted: 3,
            ..DataTransferRepr::default()
        },
        &[],
    );
    assert_eq!(
        b.handle_receive(now, &empty, None, &mut p),
        Ok(Receive::Nothing)
    );
    let last = data_message(
        DataTransferRepr {
            credits_requested: 1,
            ..DataTransferRepr::with_payload(4, 0)
        },
        b"efgh",
    );
    let r = b.handle_receive(now, &last, None, &mut p).unwrap();
    assert_eq!(
        r,
        Receive::Message {
            data: MessageData::Reassembled,
            invalidated_token: None
        }
    );
    assert_eq!(b.reassembled(), b"abcdefgh");
}

#[test]
fn response_requested_is_answered_without_requesting_a_response() {
    let (_a, mut b, mut p) = established_pair();
    let now = Instant::ZERO;
    let ka = data_message(
        DataTransferRepr {
            credits_requested: 1,
            flags: SMB_DIRECT_RESPONSE_REQUESTED,
            ..DataTransferRepr::default()
        },
        &[],
    );
    assert_eq!(
        b.handle_receive(now, &ka, None, &mut p),
        Ok(Receive::Nothing)
    );
    assert_eq!(b.keepalive_state(), KeepaliveState::None);
    let mut hdr = [0u8; MAX_HEADER_LEN];
    let t = b
        .poll_transmit(now, &mut p, &mut hdr)
        .expect("prompt answer");
    let v = DataTransfer::new_checked(&hdr[..t.len()]).unwrap();
    assert_eq!(v.flags() & SMB_DIRECT_RESPONSE_REQUESTED, 0);
    assert!(b.poll_transmit(now, &mut p, &mut hdr).is_none());
}
