//! [MS-SMBD] 2.2 and Appendix A wire codecs: round trips (Repr → emit →
//! new_checked → parse == Repr), byte layout and byte order pinned with
//! hand-written bytes, truncation, the structural checks of 3.1.5.8 on Data
//! Transfer messages, the IRD/ORD rules of 6.2, and buffer-descriptor
//! slicing for 3.1.4.5 / 3.1.4.6.

use smbdirect_protocol::ntstatus::{NtStatus, STATUS_NOT_SUPPORTED, STATUS_SUCCESS};
use smbdirect_protocol::smbd::config::{DATA_TRANSFER_PAYLOAD_OFFSET, SMBD_VERSION_1};
use smbdirect_protocol::smbd::wire::{
    negotiate_ird_ord, BufferDescriptor, BufferDescriptorArray, BufferDescriptorRepr, DataTransfer,
    DataTransferRepr, IrdOrdError, IrdOrdHeader, IrdOrdRepr, NegotiateRequest,
    NegotiateRequestRepr, NegotiateResponse, NegotiateResponseRepr, SMB_DIRECT_RESPONSE_REQUESTED,
};
use smbdirect_protocol::WireError;

fn is_malformed<T: core::fmt::Debug>(r: Result<T, WireError>) -> bool {
    matches!(r, Err(WireError::Malformed { .. }))
}

fn sample_request() -> NegotiateRequestRepr {
    NegotiateRequestRepr {
        min_version: 0x0100,
        max_version: 0x0100,
        credits_requested: 0x1234,
        preferred_send_size: 0x0102_0304,
        max_receive_size: 0x0506_0708,
        max_fragmented_size: 0x090A_0B0C,
    }
}

fn sample_response() -> NegotiateResponseRepr {
    NegotiateResponseRepr {
        min_version: 0x0100,
        max_version: 0x0100,
        negotiated_version: 0x0100,
        credits_requested: 0x1122,
        credits_granted: 0x3344,
        status: NtStatus(0xC000_1234),
        max_read_write_size: 0x0102_0304,
        preferred_send_size: 0x0506_0708,
        max_receive_size: 0x090A_0B0C,
        max_fragmented_size: 0x0D0E_0F10,
    }
}

/// Builds a data transfer message: the header, padding up to `data_offset`,
/// then `payload`.
fn data_transfer_bytes(repr: &DataTransferRepr, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0xEEu8; repr.buffer_len()];
    let n = repr.emit(&mut buf, payload);
    assert_eq!(n, buf.len());
    buf
}

// ---------------------------------------------------------------------------
// 2.2.1 Negotiate Request
// ---------------------------------------------------------------------------

#[test]
fn negotiate_request_round_trips() {
    let repr = sample_request();
    let mut buf = [0xFFu8; 20];
    repr.emit(&mut NegotiateRequest::new_unchecked(&mut buf[..]));
    assert_eq!(buf, repr.to_bytes());
    assert_eq!(repr.buffer_len(), 20);
    let view = NegotiateRequest::new_checked(&buf[..]).expect("20 bytes is a whole request");
    assert_eq!(NegotiateRequestRepr::parse(&view), repr);
}

#[test]
fn negotiate_request_fields_are_little_endian_at_spec_offsets() {
    let bytes = sample_request().to_bytes();
    #[rustfmt::skip]
    let expected: [u8; 20] = [
        0x00, 0x01,             // MinVersion
        0x00, 0x01,             // MaxVersion
        0x00, 0x00,             // Reserved
        0x34, 0x12,             // CreditsRequested
        0x04, 0x03, 0x02, 0x01, // PreferredSendSize
        0x08, 0x07, 0x06, 0x05, // MaxReceiveSize
        0x0C, 0x0B, 0x0A, 0x09, // MaxFragmentedSize
    ];
    assert_eq!(bytes, expected);
}

#[test]
fn negotiate_request_shorter_than_20_bytes_is_truncated() {
    let bytes = sample_request().to_bytes();
    for have in 0..20 {
        assert_eq!(
            NegotiateRequest::new_checked(&bytes[..have]).unwrap_err(),
            WireError::Truncated {
                what: "SMBD negotiate request",
                need: 20,
                have
            },
            "length {have}"
        );
    }
}

#[test]
fn negotiate_request_trailing_bytes_are_ignored() {
    let repr = sample_request();
    let mut buf = repr.to_bytes().to_vec();
    buf.extend_from_slice(&[0xAB; 492]); // a 512-byte negotiate receive buffer
    let view = NegotiateRequest::new_checked(&buf[..]).unwrap();
    assert_eq!(NegotiateRequestRepr::parse(&view), repr);
}

#[test]
fn negotiate_request_reserved_is_ignored_on_receipt_and_zeroed_on_emit() {
    let repr = sample_request();
    let mut buf = repr.to_bytes();
    buf[4] = 0xDE;
    buf[5] = 0xAD;
    let view = NegotiateRequest::new_checked(&buf[..]).unwrap();
    assert_eq!(view.reserved(), 0xADDE);
    assert_eq!(NegotiateRequestRepr::parse(&view), repr);

    let mut dirty = [0xFFu8; 20];
    repr.emit(&mut NegotiateRequest::new_unchecked(&mut dirty[..]));
    assert_eq!(&dirty[4..6], &[0, 0]);
}

#[test]
fn negotiate_request_codec_leaves_version_and_size_rules_to_the_receiver() {
    // 3.1.5.6's value checks have different outcomes (failure response vs
    // termination), so the codec decodes any 20 bytes.
    let repr = NegotiateRequestRepr {
        min_version: 0x0200,
        max_version: 0x0001,
        credits_requested: 0,
        preferred_send_size: 0,
        max_receive_size: 1,
        max_fragmented_size: 0,
    };
    let bytes = repr.to_bytes();
    let view = NegotiateRequest::new_checked(&bytes[..]).unwrap();
    assert_eq!(NegotiateRequestRepr::parse(&view), repr);
}

// ---------------------------------------------------------------------------
// 2.2.2 Negotiate Response
// ---------------------------------------------------------------------------

#[test]
fn negotiate_response_round_trips() {
    let repr = sample_response();
    let mut buf = [0xFFu8; 32];
    repr.emit(&mut NegotiateResponse::new_unchecked(&mut buf[..]));
    assert_eq!(buf, repr.to_bytes());
    assert_eq!(repr.buffer_len(), 32);
    let view = NegotiateResponse::new_checked(&buf[..]).expect("32 bytes is a whole response");
    assert_eq!(NegotiateResponseRepr::parse(&view), repr);
}

#[test]
fn negotiate_response_fields_are_little_endian_at_spec_offsets() {
    let bytes = sample_response().to_bytes();
    #[rustfmt::skip]
    let expected: [u8; 32] = [
        0x00, 0x01,             // MinVersion
        0x00, 0x01,             // MaxVersion
        0x00, 0x01,             // NegotiatedVersion
        0x00, 0x00,             // Reserved
        0x22, 0x11,             // CreditsRequested
        0x44, 0x33,             // CreditsGranted
        0x34, 0x12, 0x00, 0xC0, // Status
        0x04, 0x03, 0x02, 0x01, // MaxReadWriteSize
        0x08, 0x07, 0x06, 0x05, // PreferredSendSize
        0x0C, 0x0B, 0x0A, 0x09, // MaxReceiveSize
        0x10, 0x0F, 0x0E, 0x0D, // MaxFragmentedSize
    ];
    assert_eq!(bytes, expected);
}

#[test]
fn negotiate_response_shorter_than_32_bytes_is_truncated() {
    let bytes = sample_response().to_bytes();
    for have in 0..32 {
        assert_eq!(
            NegotiateResponse::new_checked(&bytes[..have]).unwrap_err(),
            WireError::Truncated {
                what: "SMBD negotiate response",
                need: 32,
                have
            },
            "length {have}"
        );
    }
}

#[test]
fn negotiate_response_trailing_bytes_are_ignored() {
    let repr = sample_response();
    let mut buf = repr.to_bytes().to_vec();
    buf.extend_from_slice(&[0x5A; 480]);
    let view = NegotiateResponse::new_checked(&buf[..]).unwrap();
    assert_eq!(NegotiateResponseRepr::parse(&view), repr);
}

#[test]
fn negotiate_response_reserved_is_ignored_on_receipt_and_zeroed_on_emit() {
    let repr = sample_response();
    let mut buf = repr.to_bytes();
    buf[6] = 0x77;
    buf[7] = 0x88;
    let view = NegotiateResponse::new_checked(&buf[..]).unwrap();
    assert_eq!(view.reserved(), 0x8877);
    assert_eq!(NegotiateResponseRepr::parse(&view), repr);

    let mut dirty = [0xFFu8; 32];
    repr.emit(&mut NegotiateResponse::new_unchecked(&mut dirty[..]));
    assert_eq!(&dirty[6..8], &[0, 0]);
}

#[test]
fn negotiate_response_failure_sets_versions_status_and_zeroes_the_rest() {
    // [MS-SMBD] 3.1.5.3: MinVersion/MaxVersion 0x0100, Status as passed, "all
    // fields in the message not set above MUST be set to 0x0000".
    let repr = NegotiateResponseRepr::failure(STATUS_NOT_SUPPORTED);
    let bytes = repr.to_bytes();
    #[rustfmt::skip]
    let expected: [u8; 32] = [
        0x00, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0xBB, 0x00, 0x00, 0xC0,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
    assert_eq!(bytes, expected);
    let view = NegotiateResponse::new_checked(&bytes[..]).unwrap();
    assert_eq!(NegotiateResponseRepr::parse(&view), repr);
    assert_eq!(view.status(), STATUS_NOT_SUPPORTED);
    assert_eq!(view.min_version(), SMBD_VERSION_1);
    assert_eq!(view.max_version(), SMBD_VERSION_1);
}

#[test]
fn negotiate_response_codec_leaves_value_rules_to_the_receiver() {
    // 3.1.5.7's checks (NegotiatedVersion, minima, Status) belong to the
    // state machine; the codec decodes any 32 bytes.
    let repr = NegotiateResponseRepr {
        negotiated_version: 0x0300,
        credits_granted: 0,
        credits_requested: 0,
        max_receive_size: 0,
        status: STATUS_SUCCESS,
        ..sample_response()
    };
    let bytes = repr.to_bytes();
    let view = NegotiateResponse::new_checked(&bytes[..]).unwrap();
    assert_eq!(NegotiateResponseRepr::parse(&view), repr);
}

// ---------------------------------------------------------------------------
// 2.2.3 Data Transfer
// ---------------------------------------------------------------------------

#[test]
fn data_transfer_with_payload_round_trips() {
    let payload: Vec<u8> = (0..=255u8).cycle().take(777).collect();
    let repr = DataTransferRepr {
        credits_requested: 0x0102,
        credits_granted: 0x0304,
        flags: SMB_DIRECT_RESPONSE_REQUESTED,
        remaining_data_length: 0x0506_0708,
        data_offset: 24,
        data_length: payload.len() as u32,
    };
    let bytes = data_transfer_bytes(&repr, &payload);
    assert_eq!(bytes.len(), 24 + 777);
    let view = DataTransfer::new_checked(&bytes[..]).unwrap();
    assert_eq!(DataTransferRepr::parse(&view), Ok(repr));
    assert_eq!(view.payload().unwrap(), &payload[..]);
    assert_eq!(view.check_payload(), Ok(24..24 + 777));
}

#[test]
fn data_transfer_empty_message_round_trips() {
    // [MS-SMBD] 3.1.5.4: an empty message has DataOffset and DataLength 0
    // and no Padding or Buffer: 20 bytes.
    let repr = DataTransferRepr {
        credits_requested: 255,
        credits_granted: 7,
        ..Default::default()
    };
    assert_eq!(repr.buffer_len(), 20);
    let bytes = data_transfer_bytes(&repr, &[]);
    assert_eq!(bytes.len(), 20);
    let view = DataTransfer::new_checked(&bytes[..]).unwrap();
    assert_eq!(DataTransferRepr::parse(&view), Ok(repr));
    assert_eq!(view.payload().unwrap(), &[] as &[u8]);
}

#[test]
fn data_transfer_header_fields_are_little_endian_at_spec_offsets() {
    let repr = DataTransferRepr {
        credits_requested: 0x0102,
        credits_granted: 0x0304,
        flags: 0x0506,
        remaining_data_length: 0x0708_090A,
        data_offset: 32,
        data_length: 3,
    };
    let bytes = data_transfer_bytes(&repr, &[0xA1, 0xA2, 0xA3]);
    #[rustfmt::skip]
    let expected: [u8; 35] = [
        0x02, 0x01,             // CreditsRequested
        0x04, 0x03,             // CreditsGranted
        0x06, 0x05,             // Flags
        0x00, 0x00,             // Reserved
        0x0A, 0x09, 0x08, 0x07, // RemainingDataLength
        0x20, 0x00, 0x00, 0x00, // DataOffset
        0x03, 0x00, 0x00, 0x00, // DataLength
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // Padding (DataOffset - 20)
        0xA1, 0xA2, 0xA3,       // Buffer
    ];
    assert_eq!(bytes, expected);
}

#[test]
fn data_transfer_shorter_than_20_bytes_is_truncated() {
    let bytes = data_transfer_bytes(&DataTransferRepr::with_payload(8, 0), &[1; 8]);
    for have in 0..20 {
        assert_eq!(
            DataTransfer::new_checked(&bytes[..have]).unwrap_err(),
            WireError::Truncated {
                what: "SMBD data transfer",
                need: 20,
                have
            },
            "length {have}"
        );
    }
}

#[test]
fn data_transfer_with_payload_uses_offset_24_and_empty_uses_offset_0() {
    // [MS-SMBD] 3.1.5.4: "The value of DataOffset SHOULD be 24"; for an
    // empty buffer "DataOffset MUST be set to 0x00000000".
    let full = DataTransferRepr::with_payload(500, 1000);
    assert_eq!(full.data_offset as usize, DATA_TRANSFER_PAYLOAD_OFFSET);
    assert_eq!(full.data_offset, 24);
    assert_eq!(full.data_length, 500);
    assert_eq!(full.remaining_data_length, 1000);
    assert_eq!(full.buffer_len(), 524);
    let empty = DataTransferRepr::with_payload(0, 0);
    assert_eq!((empty.data_offset, empty.data_length), (0, 0));
    assert_eq!(empty.buffer_len(), 20);
}

#[test]
fn data_transfer_emit_zeroes_reserved_and_padding() {
    // [MS-SMBD] 3.1.5.4: "Padding MUST be set to 0x00000000 for the length
    // indicated by DataOffset - 20"; Reserved MUST be 0x0000.
    let repr = DataTransferRepr {
        data_offset: 40,
        data_length: 4,
        ..Default::default()
    };
    let mut buf = vec![0xFFu8; 44];
    assert_eq!(repr.emit_header(&mut buf), 40);
    assert_eq!(&buf[6..8], &[0, 0]);
    assert!(buf[20..40].iter().all(|&b| b == 0));
    assert_eq!(repr.emit(&mut buf, &[9, 9, 9, 9]), 44);
    assert_eq!(&buf[40..44], &[9, 9, 9, 9]);
}

#[test]
fn data_transfer_reserved_and_padding_are_ignored_on_receipt() {
    let repr = DataTransferRepr::with_payload(4, 0);
    let mut bytes = data_transfer_bytes(&repr, &[1, 2, 3, 4]);
    bytes[6] = 0xAA; // Reserved
    bytes[7] = 0xBB;
    bytes[20..24].copy_from_slice(&[0xCC; 4]); // Padding
    let view = DataTransfer::new_checked(&bytes[..]).unwrap();
    assert_eq!(view.reserved(), 0xBBAA);
    assert_eq!(DataTransferRepr::parse(&view), Ok(repr));
    assert_eq!(view.payload().unwrap(), &[1, 2, 3, 4]);
}

#[test]
fn data_offset_not_8_aligned_is_malformed() {
    // [MS-SMBD] 3.1.5.8: "The received DataOffset field is 8-byte aligned."
    for off in [1u32, 4, 12, 20, 25, 26, 27, 28, 29, 30, 31, 36, 0xFFFF_FFFF] {
        let mut bytes = [0u8; 128];
        let mut view = DataTransfer::new_unchecked(&mut bytes[..]);
        view.set_credits_requested(1);
        view.set_data_offset(off);
        view.set_data_length(1);
        let view = DataTransfer::new_checked(&bytes[..]).unwrap();
        assert_eq!(
            view.check_payload(),
            Err(WireError::Malformed {
                what: "SMBD data transfer",
                field: "DataOffset (not 8-byte aligned)"
            }),
            "offset {off}"
        );
        assert!(is_malformed(DataTransferRepr::parse(&view)));
    }
}

#[test]
fn data_offset_not_8_aligned_is_malformed_even_without_payload() {
    let mut bytes = [0u8; 20];
    DataTransfer::new_unchecked(&mut bytes[..]).set_data_offset(4);
    let view = DataTransfer::new_checked(&bytes[..]).unwrap();
    assert!(is_malformed(view.check_payload()));
}

#[test]
fn data_offset_plus_length_beyond_message_is_malformed() {
    // [MS-SMBD] 3.1.5.8: "The sum of the received DataOffset and DataLength
    // fields are less than or equal to the length of the received message."
    let repr = DataTransferRepr::with_payload(100, 0);
    let bytes = data_transfer_bytes(&repr, &[7; 100]);
    assert!(DataTransfer::new_checked(&bytes[..])
        .unwrap()
        .check_payload()
        .is_ok());
    // One byte short.
    let short = DataTransfer::new_checked(&bytes[..bytes.len() - 1]).unwrap();
    assert_eq!(
        short.check_payload(),
        Err(WireError::Malformed {
            what: "SMBD data transfer",
            field: "DataOffset+DataLength (beyond the message)"
        })
    );
    // DataLength one larger than what is present.
    let mut longer = bytes.clone();
    DataTransfer::new_unchecked(&mut longer[..]).set_data_length(101);
    assert!(is_malformed(
        DataTransfer::new_checked(&longer[..]).unwrap().payload()
    ));
}

#[test]
fn data_offset_plus_length_ending_exactly_at_message_end_is_accepted() {
    let repr = DataTransferRepr {
        data_offset: 48,
        data_length: 16,
        ..Default::default()
    };
    let bytes = data_transfer_bytes(&repr, &[3; 16]);
    assert_eq!(bytes.len(), 64);
    let view = DataTransfer::new_checked(&bytes[..]).unwrap();
    assert_eq!(view.check_payload(), Ok(48..64));
}

#[test]
fn data_offset_plus_length_overflowing_u32_is_malformed_not_wrapped() {
    // 0xFFFF_FFF8 + 0x10 wraps to 8 in 32-bit arithmetic.
    let mut bytes = [0u8; 64];
    let mut view = DataTransfer::new_unchecked(&mut bytes[..]);
    view.set_data_offset(0xFFFF_FFF8);
    view.set_data_length(0x10);
    assert!(is_malformed(
        DataTransfer::new_checked(&bytes[..])
            .unwrap()
            .check_payload()
    ));
    let mut view = DataTransfer::new_unchecked(&mut bytes[..]);
    view.set_data_offset(24);
    view.set_data_length(u32::MAX);
    assert!(is_malformed(
        DataTransfer::new_checked(&bytes[..])
            .unwrap()
            .check_payload()
    ));
}

#[test]
fn data_payload_overlapping_header_is_malformed() {
    // docs/spec-notes.md, "DataOffset inside the header": a payload at an
    // 8-aligned offset below 20 would alias header fields.
    for off in [0u32, 8, 16] {
        let mut bytes = [0u8; 64];
        let mut view = DataTransfer::new_unchecked(&mut bytes[..]);
        view.set_data_offset(off);
        view.set_data_length(4);
        let view = DataTransfer::new_checked(&bytes[..]).unwrap();
        assert_eq!(
            view.check_payload(),
            Err(WireError::Malformed {
                what: "SMBD data transfer",
                field: "DataOffset (inside the header)"
            }),
            "offset {off}"
        );
    }
}

#[test]
fn empty_message_with_offset_0_and_length_0_is_accepted() {
    let bytes = [
        0x01, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    let view = DataTransfer::new_checked(&bytes[..]).unwrap();
    assert_eq!(view.check_payload(), Ok(0..0));
    assert_eq!(
        DataTransferRepr::parse(&view),
        Ok(DataTransferRepr {
            credits_requested: 1,
            ..Default::default()
        })
    );
    assert!(view.payload().unwrap().is_empty());
}

#[test]
fn empty_payload_with_offset_beyond_the_message_is_malformed() {
    // 3.1.5.8 checks DataOffset + DataLength <= message length for every
    // message, so DataLength 0 does not exempt a DataOffset past the end.
    let mut bytes = [0u8; 20];
    DataTransfer::new_unchecked(&mut bytes[..]).set_data_offset(24);
    assert!(is_malformed(
        DataTransfer::new_checked(&bytes[..])
            .unwrap()
            .check_payload()
    ));
    DataTransfer::new_unchecked(&mut bytes[..]).set_data_offset(0xFFFF_FFF8);
    assert!(is_malformed(DataTransferRepr::parse(
        &DataTransfer::new_checked(&bytes[..]).unwrap()
    )));
}

#[test]
fn empty_payload_with_aligned_offset_inside_the_message_is_accepted() {
    // DataOffset + DataLength <= length holds, and there is no payload to
    // alias the header: nothing in 3.1.5.8 is violated.
    for off in [8u32, 16, 24] {
        let mut bytes = [0u8; 24];
        DataTransfer::new_unchecked(&mut bytes[..]).set_data_offset(off);
        let view = DataTransfer::new_checked(&bytes[..]).unwrap();
        assert_eq!(view.check_payload(), Ok(0..0), "offset {off}");
        assert!(view.payload().unwrap().is_empty());
    }
}

#[test]
fn data_transfer_payload_may_start_at_any_aligned_offset_past_the_header() {
    for off in [24u32, 32, 40, 64, 1024] {
        let repr = DataTransferRepr {
            data_offset: off,
            data_length: 5,
            ..Default::default()
        };
        let bytes = data_transfer_bytes(&repr, b"hello");
        let view = DataTransfer::new_checked(&bytes[..]).unwrap();
        assert_eq!(view.payload().unwrap(), b"hello", "offset {off}");
        assert_eq!(DataTransferRepr::parse(&view), Ok(repr));
    }
}

#[test]
fn data_transfer_trailing_bytes_after_payload_are_accepted() {
    let repr = DataTransferRepr::with_payload(10, 0);
    let mut bytes = data_transfer_bytes(&repr, &[4; 10]);
    bytes.extend_from_slice(&[0x99; 50]);
    let view = DataTransfer::new_checked(&bytes[..]).unwrap();
    assert_eq!(view.len(), 84);
    assert!(!view.is_empty());
    assert_eq!(view.payload().unwrap(), &[4; 10]);
    assert_eq!(DataTransferRepr::parse(&view), Ok(repr));
}

#[test]
fn data_transfer_codec_leaves_credits_requested_zero_to_the_receiver() {
    // "CreditsRequested is at least 1" (3.1.5.8) terminates the connection
    // in the state machine; the codec only checks the payload layout.
    let repr = DataTransferRepr::with_payload(1, 0);
    let bytes = data_transfer_bytes(&repr, &[0]);
    let view = DataTransfer::new_checked(&bytes[..]).unwrap();
    assert_eq!(view.credits_requested(), 0);
    assert_eq!(DataTransferRepr::parse(&view), Ok(repr));
}

#[test]
fn response_requested_flag_is_bit_0_of_flags() {
    assert_eq!(SMB_DIRECT_RESPONSE_REQUESTED, 0x0001);
    let repr = DataTransferRepr {
        credits_requested: 1,
        flags: SMB_DIRECT_RESPONSE_REQUESTED,
        ..Default::default()
    };
    let bytes = data_transfer_bytes(&repr, &[]);
    assert_eq!(&bytes[4..6], &[0x01, 0x00]);
    let view = DataTransfer::new_checked(&bytes[..]).unwrap();
    assert_eq!(view.flags() & SMB_DIRECT_RESPONSE_REQUESTED, 1);
}

// ---------------------------------------------------------------------------
// 2.2.3.1 Buffer Descriptor V1
// ---------------------------------------------------------------------------

#[test]
fn buffer_descriptor_round_trips() {
    let repr = BufferDescriptorRepr {
        offset: 0x0102_0304_0506_0708,
        token: 0x090A_0B0C,
        length: 0x0D0E_0F10,
    };
    let mut buf = [0xFFu8; 16];
    repr.emit(&mut BufferDescriptor::new_unchecked(&mut buf[..]));
    assert_eq!(buf, repr.to_bytes());
    assert_eq!(repr.buffer_len(), 16);
    let view = BufferDescriptor::new_checked(&buf[..]).unwrap();
    assert_eq!(BufferDescriptorRepr::parse(&view), repr);
}

#[test]
fn buffer_descriptor_fields_are_little_endian_offset_token_length() {
    let repr = BufferDescriptorRepr {
        offset: 0x0102_0304_0506_0708,
        token: 0x090A_0B0C,
        length: 0x0D0E_0F10,
    };
    #[rustfmt::skip]
    let expected: [u8; 16] = [
        0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, // Offset
        0x0C, 0x0B, 0x0A, 0x09,                         // Token
        0x10, 0x0F, 0x0E, 0x0D,                         // Length
    ];
    assert_eq!(repr.to_bytes(), expected);
}

#[test]
fn buffer_descriptor_shorter_than_16_bytes_is_truncated() {
    let bytes = [0u8; 16];
    for have in 0..16 {
        assert_eq!(
            BufferDescriptor::new_checked(&bytes[..have]).unwrap_err(),
            WireError::Truncated {
                what: "SMBD buffer descriptor",
                need: 16,
                have
            }
        );
    }
}

#[test]
fn buffer_descriptor_array_round_trips() {
    let descs: Vec<BufferDescriptorRepr> = (0..5u32)
        .map(|i| BufferDescriptorRepr {
            offset: 0x1000_0000_0000 * u64::from(i + 1),
            token: 0xA000 + i,
            length: 4096 * (i + 1),
        })
        .collect();
    let bytes: Vec<u8> = descs.iter().flat_map(|d| d.to_bytes()).collect();
    let array = BufferDescriptorArray::new_checked(&bytes).unwrap();
    assert_eq!(array.len(), 5);
    assert!(!array.is_empty());
    assert_eq!(array.as_bytes(), &bytes[..]);
    assert_eq!(array.iter().collect::<Vec<_>>(), descs);
    for (i, d) in descs.iter().enumerate() {
        assert_eq!(array.get(i), Some(*d));
    }
    assert_eq!(array.get(5), None);
    assert_eq!(array.get(usize::MAX), None);
    assert_eq!(array.total_length(), 4096 * (1 + 2 + 3 + 4 + 5));
}

#[test]
fn buffer_descriptor_array_shorter_than_one_descriptor_is_truncated() {
    let bytes = [0u8; 16];
    for have in 0..16 {
        assert_eq!(
            BufferDescriptorArray::new_checked(&bytes[..have]).unwrap_err(),
            WireError::Truncated {
                what: "SMBD buffer descriptor array",
                need: 16,
                have
            },
            "length {have}"
        );
    }
}

#[test]
fn buffer_descriptor_array_not_a_multiple_of_16_is_malformed() {
    let bytes = [0u8; 80];
    for len in (17..80).filter(|l| l % 16 != 0) {
        assert_eq!(
            BufferDescriptorArray::new_checked(&bytes[..len]).unwrap_err(),
            WireError::Malformed {
                what: "SMBD buffer descriptor array",
                field: "length (not a multiple of 16)"
            },
            "length {len}"
        );
    }
}

#[test]
fn buffer_descriptor_array_total_length_does_not_overflow_u32() {
    let d = BufferDescriptorRepr {
        offset: 0,
        token: 1,
        length: u32::MAX,
    };
    let bytes: Vec<u8> = std::iter::repeat(d.to_bytes()).take(4).flatten().collect();
    let array = BufferDescriptorArray::new_checked(&bytes).unwrap();
    assert_eq!(array.total_length(), 4 * u64::from(u32::MAX));
}

// ---------------------------------------------------------------------------
// Appendix A (6.1, 6.2) IRD/ORD negotiate header
// ---------------------------------------------------------------------------

#[test]
fn ird_ord_header_round_trips() {
    let repr = IrdOrdRepr { ird: 16, ord: 8 };
    let mut buf = [0xFFu8; 8];
    repr.emit(&mut IrdOrdHeader::new_unchecked(&mut buf[..]));
    assert_eq!(buf, repr.to_bytes());
    assert_eq!(repr.buffer_len(), 8);
    let view = IrdOrdHeader::new_checked(&buf[..]).unwrap();
    assert_eq!(IrdOrdRepr::parse(&view), repr);
}

#[test]
fn ird_ord_values_are_big_endian_on_the_wire() {
    // Linux cifs.ko / ksmbd: `__be32 ird_ord_hdr[2]`, filled with
    // cpu_to_be32(responder_resources) then cpu_to_be32(initiator_depth).
    let repr = IrdOrdRepr {
        ird: 0x0102_0304,
        ord: 0x0506_0708,
    };
    assert_eq!(
        repr.to_bytes(),
        [0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08]
    );
    // What Linux sends for responder_resources 16, initiator_depth 8.
    let linux = [0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x08];
    let view = IrdOrdHeader::new_checked(&linux[..]).unwrap();
    assert_eq!((view.ird(), view.ord()), (16, 8));
    // The little-endian reading would be 0x1000_0000: pin that we do not.
    assert_ne!(view.ird(), 0x1000_0000);
}

#[test]
fn ird_ord_header_shorter_than_8_bytes_is_truncated() {
    let bytes = [1u8; 8];
    for have in 0..8 {
        assert_eq!(
            IrdOrdHeader::new_checked(&bytes[..have]).unwrap_err(),
            WireError::Truncated {
                what: "SMBD IRD/ORD header",
                need: 8,
                have
            }
        );
    }
}

#[test]
fn ird_ord_header_trailing_private_data_is_ignored() {
    let mut private = IrdOrdRepr { ird: 2, ord: 3 }.to_bytes().to_vec();
    private.extend_from_slice(&[0xEE; 48]);
    let view = IrdOrdHeader::new_checked(&private[..]).unwrap();
    assert_eq!(IrdOrdRepr::parse(&view), IrdOrdRepr { ird: 2, ord: 3 });
}

#[test]
fn ird_ord_negotiation_takes_min_of_local_ord_and_peer_ird_and_of_local_ird_and_peer_ord() {
    // [MS-SMBD] 6.2: "IRD is set to the smaller of the accepting peer's ORD
    // value and the IRD value provided by the peer", "ORD is set to the
    // smaller of the accepting peer's IRD value and the ORD value provided
    // by the peer".
    let local = IrdOrdRepr { ird: 16, ord: 4 };
    let peer = IrdOrdRepr { ird: 8, ord: 32 };
    assert_eq!(
        negotiate_ird_ord(local, peer),
        Ok(IrdOrdRepr { ird: 4, ord: 16 })
    );
    let peer = IrdOrdRepr { ird: 2, ord: 3 };
    assert_eq!(
        negotiate_ird_ord(local, peer),
        Ok(IrdOrdRepr { ird: 2, ord: 3 })
    );
}

#[test]
fn ird_ord_negotiation_accepts_one_and_one() {
    let one = IrdOrdRepr { ird: 1, ord: 1 };
    assert_eq!(negotiate_ird_ord(one, one), Ok(one));
}

#[test]
fn ird_ord_negotiation_rejects_a_zero_result() {
    // [MS-SMBD] 6.2: "If either the resulting IRD or ORD is zero, the
    // connection is rejected."
    let local = IrdOrdRepr { ird: 16, ord: 16 };
    assert_eq!(
        negotiate_ird_ord(local, IrdOrdRepr { ird: 0, ord: 8 }),
        Err(IrdOrdError::ZeroIrd)
    );
    assert_eq!(
        negotiate_ird_ord(local, IrdOrdRepr { ird: 8, ord: 0 }),
        Err(IrdOrdError::ZeroOrd)
    );
    // Our own zero ORD bounds the resulting IRD, our zero IRD the ORD.
    assert_eq!(
        negotiate_ird_ord(
            IrdOrdRepr { ird: 16, ord: 0 },
            IrdOrdRepr { ird: 8, ord: 8 }
        ),
        Err(IrdOrdError::ZeroIrd)
    );
    assert_eq!(
        negotiate_ird_ord(
            IrdOrdRepr { ird: 0, ord: 16 },
            IrdOrdRepr { ird: 8, ord: 8 }
        ),
        Err(IrdOrdError::ZeroOrd)
    );
    let err = negotiate_ird_ord(local, IrdOrdRepr { ird: 0, ord: 0 }).unwrap_err();
    assert!(err.to_string().contains("6.2"), "{err}");
}

// ---------------------------------------------------------------------------
// 3.1.4.5 / 3.1.4.6 buffer-descriptor slicing
// ---------------------------------------------------------------------------

mod slicing {
    use smbdirect_protocol::smbd::rdma_slice::{
        slice, validate_descriptors, DescriptorSource, RdmaSegment, SliceError,
    };
    use smbdirect_protocol::smbd::wire::{BufferDescriptorArray, BufferDescriptorRepr};

    fn d(offset: u64, token: u32, length: u32) -> BufferDescriptorRepr {
        BufferDescriptorRepr {
            offset,
            token,
            length,
        }
    }

    fn seg(remote_offset: u64, token: u32, length: u32, local_offset: u64) -> RdmaSegment {
        RdmaSegment {
            remote_offset,
            token,
            length,
            local_offset,
        }
    }

    fn wire(descs: &[BufferDescriptorRepr]) -> Vec<u8> {
        descs.iter().flat_map(|d| d.to_bytes()).collect()
    }

    /// Slices through both sources and checks they agree.
    fn both(
        descs: &[BufferDescriptorRepr],
        offset: u64,
        length: u64,
    ) -> Result<Vec<RdmaSegment>, SliceError> {
        let from_values = slice(descs, offset, length).map(|s| s.collect::<Vec<_>>());
        let bytes = wire(descs);
        if let Ok(array) = BufferDescriptorArray::new_checked(&bytes) {
            let from_wire = slice(&array, offset, length).map(|s| s.collect::<Vec<_>>());
            assert_eq!(from_values, from_wire, "value and wire sources disagree");
        }
        from_values
    }

    /// Three 100-byte elements at scattered remote addresses.
    fn three() -> [BufferDescriptorRepr; 3] {
        [d(1000, 1, 100), d(5000, 2, 100), d(9000, 3, 100)]
    }

    #[test]
    fn whole_buffer_is_one_segment_per_element() {
        assert_eq!(
            both(&three(), 0, 300),
            Ok(vec![
                seg(1000, 1, 100, 0),
                seg(5000, 2, 100, 100),
                seg(9000, 3, 100, 200),
            ])
        );
    }

    #[test]
    fn first_element_is_trimmed_to_its_trailing_subsegment() {
        // "adjust the Offset and Length fields of the first element to
        // indicate the trailing subsegment".
        assert_eq!(
            both(&three(), 30, 170),
            Ok(vec![seg(1030, 1, 70, 0), seg(5000, 2, 100, 70)])
        );
    }

    #[test]
    fn last_element_is_trimmed_to_its_leading_subsegment() {
        // "adjust the Length field of the last element to indicate the
        // leading subsegment".
        assert_eq!(
            both(&three(), 0, 130),
            Ok(vec![seg(1000, 1, 100, 0), seg(5000, 2, 30, 100)])
        );
    }

    #[test]
    fn first_and_last_elements_are_both_trimmed() {
        assert_eq!(
            both(&three(), 150, 100),
            Ok(vec![seg(5050, 2, 50, 0), seg(9000, 3, 50, 50)])
        );
        assert_eq!(
            both(&three(), 99, 102),
            Ok(vec![
                seg(1099, 1, 1, 0),
                seg(5000, 2, 100, 1),
                seg(9000, 3, 1, 101),
            ])
        );
    }

    #[test]
    fn range_inside_one_element_is_trimmed_at_both_ends() {
        assert_eq!(both(&three(), 110, 80), Ok(vec![seg(5010, 2, 80, 0)]));
    }

    #[test]
    fn offset_on_an_element_boundary_starts_at_that_element_untrimmed() {
        // Consuming Length fields: offset 100 is byte 0 of element 1, not
        // byte 100 of element 0.
        assert_eq!(both(&three(), 100, 100), Ok(vec![seg(5000, 2, 100, 0)]));
        assert_eq!(both(&three(), 200, 100), Ok(vec![seg(9000, 3, 100, 0)]));
        assert_eq!(both(&three(), 100, 1), Ok(vec![seg(5000, 2, 1, 0)]));
    }

    #[test]
    fn end_on_an_element_boundary_does_not_touch_the_next_element() {
        assert_eq!(both(&three(), 50, 50), Ok(vec![seg(1050, 1, 50, 0)]));
        assert_eq!(
            both(&three(), 50, 150),
            Ok(vec![seg(1050, 1, 50, 0), seg(5000, 2, 100, 50)])
        );
    }

    #[test]
    fn last_byte_of_the_buffer_is_reachable() {
        assert_eq!(both(&three(), 299, 1), Ok(vec![seg(9099, 3, 1, 0)]));
    }

    #[test]
    fn many_elements_are_sliced_in_order_with_contiguous_local_offsets() {
        // 64 pages of 4 KiB, each registered separately.
        let descs: Vec<_> = (0..64u32)
            .map(|i| d(0x7f00_0000_0000 + u64::from(i) * 0x10_0000, 0x100 + i, 4096))
            .collect();
        let segs = both(&descs, 4096 * 10 + 17, 4096 * 20).unwrap();
        assert_eq!(segs.len(), 21);
        assert_eq!(
            segs[0],
            seg(0x7f00_0000_0000 + 10 * 0x10_0000 + 17, 0x10A, 4079, 0)
        );
        for (k, s) in segs[1..20].iter().enumerate() {
            let i = 11 + k as u32;
            assert_eq!(
                *s,
                seg(
                    0x7f00_0000_0000 + u64::from(i) * 0x10_0000,
                    0x100 + i,
                    4096,
                    4079 + 4096 * k as u64
                )
            );
        }
        assert_eq!(
            segs[20],
            seg(
                0x7f00_0000_0000 + 30 * 0x10_0000,
                0x100 + 30,
                17,
                4096 * 20 - 17
            )
        );
        assert_eq!(
            segs.iter().map(|s| u64::from(s.length)).sum::<u64>(),
            4096 * 20
        );
    }

    #[test]
    fn elements_of_different_lengths_are_consumed_by_their_length_fields() {
        let descs = [d(0, 1, 1), d(100, 2, 2), d(200, 3, 3), d(300, 4, 4)];
        // Offset 4 is element 2's second byte (1 + 2 + 1).
        assert_eq!(
            both(&descs, 4, 5),
            Ok(vec![seg(201, 3, 2, 0), seg(300, 4, 3, 2)])
        );
    }

    #[test]
    fn zero_length_transfer_is_refused() {
        assert_eq!(both(&three(), 0, 0), Err(SliceError::ZeroLength));
        assert_eq!(both(&three(), 300, 0), Err(SliceError::ZeroLength));
    }

    #[test]
    fn range_past_the_described_buffer_is_out_of_range() {
        assert_eq!(
            both(&three(), 0, 301),
            Err(SliceError::OutOfRange {
                end: 301,
                total: 300
            })
        );
        assert_eq!(
            both(&three(), 300, 1),
            Err(SliceError::OutOfRange {
                end: 301,
                total: 300
            })
        );
        assert_eq!(
            both(&three(), 250, 51),
            Err(SliceError::OutOfRange {
                end: 301,
                total: 300
            })
        );
    }

    #[test]
    fn offset_plus_length_overflowing_u64_is_refused() {
        assert_eq!(both(&three(), u64::MAX, 1), Err(SliceError::Overflow));
        assert_eq!(both(&three(), 1, u64::MAX), Err(SliceError::Overflow));
    }

    #[test]
    fn empty_descriptor_array_is_refused() {
        let none: [BufferDescriptorRepr; 0] = [];
        assert_eq!(
            slice(&none[..], 0, 1).map(|s| s.count()),
            Err(SliceError::NoDescriptors)
        );
        assert_eq!(
            validate_descriptors(&none[..]),
            Err(SliceError::NoDescriptors)
        );
    }

    #[test]
    fn zero_length_descriptor_is_refused_wherever_it_is() {
        // Even outside the requested range: the array as a whole is bad.
        let descs = [d(0, 1, 100), d(500, 2, 100), d(900, 3, 0)];
        assert_eq!(
            both(&descs, 0, 10),
            Err(SliceError::ZeroLengthDescriptor { index: 2 })
        );
        assert_eq!(
            validate_descriptors(&descs[..]),
            Err(SliceError::ZeroLengthDescriptor { index: 2 })
        );
    }

    #[test]
    fn descriptor_whose_offset_plus_length_wraps_is_refused() {
        let descs = [d(0, 1, 100), d(u64::MAX - 10, 2, 11)];
        assert_eq!(
            both(&descs, 0, 1),
            Err(SliceError::DescriptorWraps { index: 1 })
        );
        // Ending exactly at u64::MAX does not wrap.
        let descs = [d(u64::MAX - 10, 2, 10)];
        assert_eq!(both(&descs, 9, 1), Ok(vec![seg(u64::MAX - 1, 2, 1, 0)]));
    }

    #[test]
    fn validate_descriptors_returns_the_total_described_length() {
        let descs = [d(0, 1, u32::MAX), d(0, 2, u32::MAX), d(0, 3, 2)];
        assert_eq!(
            validate_descriptors(&descs[..]),
            Ok(2 * u64::from(u32::MAX) + 2)
        );
        let bytes = wire(&descs);
        let array = BufferDescriptorArray::new_checked(&bytes).unwrap();
        assert_eq!(validate_descriptors(&array), Ok(array.total_length()));
        assert_eq!(DescriptorSource::count(&array), 3);
        assert_eq!(DescriptorSource::at(&array, 2), Some(descs[2]));
        assert_eq!(DescriptorSource::at(&array, 3), None);
    }

    #[test]
    fn transfer_longer_than_u32_spans_elements_without_truncation() {
        let descs = [d(0, 1, u32::MAX), d(1 << 40, 2, u32::MAX)];
        let len = u64::from(u32::MAX) + 5;
        assert_eq!(
            both(&descs, 0, len),
            Ok(vec![
                seg(0, 1, u32::MAX, 0),
                seg(1 << 40, 2, 5, u64::from(u32::MAX)),
            ])
        );
    }

    #[test]
    fn slice_errors_name_what_is_wrong() {
        assert!(SliceError::ZeroLengthDescriptor { index: 3 }
            .to_string()
            .contains('3'));
        let s = SliceError::OutOfRange {
            end: 301,
            total: 300,
        }
        .to_string();
        assert!(s.contains("301") && s.contains("300"), "{s}");
    }
}

/// The fast path's header is `emit_header`'s for a whole message, for
/// every length and credit value that matters.
#[test]
fn whole_message_header_is_emit_header_of_a_whole_message() {
    use smbdirect_protocol::smbd::wire::DataTransferRepr;
    for (req, granted, len) in [
        (1, 0, 1),
        (255, 17, 512),
        (65535, 65535, 1340),
        (10, 1, u32::MAX - 24),
    ] {
        let repr = DataTransferRepr {
            credits_requested: req,
            credits_granted: granted,
            ..DataTransferRepr::with_payload(len, 0)
        };
        let mut b = [0xAAu8; 24];
        assert_eq!(repr.emit_header(&mut b), 24);
        assert_eq!(DataTransferRepr::whole_message_header(req, granted, len), b);
    }
}
