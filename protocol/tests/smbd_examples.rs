//! The protocol examples of [MS-SMBD] section 4 (4.1–4.5) as tests: each
//! message is written out byte by byte as the example implies (all fields
//! little-endian, 2.2), decoded, every field value the example lists is
//! checked, and the Repr is emitted again and compared byte for byte.
//!
//! Where an example disagrees with itself or with the normative sections,
//! the normative rule wins and the test says so (see the inconsistencies
//! listed in docs/spec-notes.md):
//! - 4.3 gives DataLength as "0x000003F8 (1000 = MaxReceiveSize - 24)", but
//!   0x3F8 is 1016; 1000 is 0x3E8, and 1016 + 24 would exceed the peer's
//!   MaxReceiveSize of 1024 (3.1.5.4). We use 1000 = 0x3E8.
//! - 4.3 says the sequence needs 65 credits; 65536 bytes in 1000-byte
//!   fragments take 66 messages (65 × 1000 + 536).
//! - 4.3's RemainingDataLength values ("63KiB", "62KiB") are rounded; 3.1.5.4
//!   makes them the bytes not yet sent: 64536 and 63536.
//! - 4.5's Offset "0x00000000DCBA024" has 15 hex digits; we read it as the
//!   value it spells, 0x0DCBA024.
//! - RemainingDataLength is printed with 6 (4.1, 4.2, 4.4, 4.5) or 9 (4.3)
//!   hex digits for a 4-byte field; the value is 0 (or as computed above).
//! - 4.1's first Data Transfer leaves DataLength as "0x00000xxx"; any value
//!   up to MaxSendSize - 24 = 1000 is valid there, and several are tested.

use smbdirect_protocol::ntstatus::STATUS_SUCCESS;
use smbdirect_protocol::smbd::config::{
    SmbdConfig, DATA_TRANSFER_PAYLOAD_OFFSET, MIN_FRAGMENTED_SIZE, MIN_RECEIVE_SIZE, SMBD_VERSION_1,
};
use smbdirect_protocol::smbd::rdma_slice::{slice, RdmaSegment};
use smbdirect_protocol::smbd::wire::{
    BufferDescriptor, BufferDescriptorArray, BufferDescriptorRepr, DataTransfer, DataTransferRepr,
    NegotiateRequest, NegotiateRequestRepr, NegotiateResponse, NegotiateResponseRepr,
};

/// Where an SMB2 READ or WRITE request carries its channel info (the Buffer
/// Descriptor V1 array): after the 64-byte SMB2 header and the 48-byte fixed
/// part of the request.
const CHANNEL_INFO_OFFSET: usize = 64 + 48;

/// A recognisable upper-layer message of `len` bytes.
fn upper_layer_message(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// The 24 header+padding bytes of a Data Transfer message with the field
/// values written out, little-endian, exactly as an example lists them.
fn data_transfer_header(
    credits_requested: u16,
    credits_granted: u16,
    flags: u16,
    remaining_data_length: u32,
    data_offset: u32,
    data_length: u32,
) -> [u8; 24] {
    let cr = credits_requested.to_le_bytes();
    let cg = credits_granted.to_le_bytes();
    let fl = flags.to_le_bytes();
    let rem = remaining_data_length.to_le_bytes();
    let off = data_offset.to_le_bytes();
    let len = data_length.to_le_bytes();
    #[rustfmt::skip]
    let h = [
        cr[0], cr[1],                   // CreditsRequested
        cg[0], cg[1],                   // CreditsGranted
        fl[0], fl[1],                   // Flags
        0x00, 0x00,                     // Reserved
        rem[0], rem[1], rem[2], rem[3], // RemainingDataLength
        off[0], off[1], off[2], off[3], // DataOffset
        len[0], len[1], len[2], len[3], // DataLength
        0x00, 0x00, 0x00, 0x00,         // Padding
    ];
    h
}

/// Decodes `message`, checks every field an example lists, the payload, and
/// that emitting the decoded Repr reproduces `message`.
fn check_data_transfer(message: &[u8], expected: DataTransferRepr, payload: &[u8]) {
    let view = DataTransfer::new_checked(message).expect("at least 20 bytes");
    assert_eq!(view.credits_requested(), expected.credits_requested);
    assert_eq!(view.credits_granted(), expected.credits_granted);
    assert_eq!(view.flags(), expected.flags);
    assert_eq!(view.reserved(), 0x0000);
    assert_eq!(view.remaining_data_length(), expected.remaining_data_length);
    assert_eq!(view.data_offset(), expected.data_offset);
    assert_eq!(view.data_length(), expected.data_length);
    assert_eq!(&message[20..24], &[0, 0, 0, 0], "4 bytes of 0x00 padding");
    assert_eq!(view.payload().expect("payload in bounds"), payload);
    let repr = DataTransferRepr::parse(&view).expect("passes 3.1.5.8's checks");
    assert_eq!(repr, expected);

    let mut emitted = vec![0xFFu8; repr.buffer_len()];
    let n = repr.emit(&mut emitted, payload);
    assert_eq!(&emitted[..n], message);
}

// ---------------------------------------------------------------------------
// 4.1 Establishing a Connection
// ---------------------------------------------------------------------------

#[rustfmt::skip]
const EXAMPLE_4_1_NEGOTIATE_REQUEST: [u8; 20] = [
    0x00, 0x01,             // MinVersion: 0x0100
    0x00, 0x01,             // MaxVersion: 0x0100
    0x00, 0x00,             // Reserved: 0x0000
    0x0A, 0x00,             // CreditsRequested: 0x000A (10)
    0x00, 0x04, 0x00, 0x00, // PreferredSendSize: 0x00000400 (1 KiB)
    0x00, 0x04, 0x00, 0x00, // MaxReceiveSize: 0x00000400 (1 KiB)
    0x00, 0x00, 0x02, 0x00, // MaxFragmentedSize: 0x00020000 (128 KiB)
];

#[rustfmt::skip]
const EXAMPLE_4_1_NEGOTIATE_RESPONSE: [u8; 32] = [
    0x00, 0x01,             // MinVersion: 0x0100
    0x00, 0x01,             // MaxVersion: 0x0100
    0x00, 0x01,             // NegotiatedVersion: 0x0100
    0x00, 0x00,             // Reserved: 0x0000
    0x0A, 0x00,             // CreditsRequested: 0x000A (10)
    0x0A, 0x00,             // CreditsGranted: 0x000A (10)
    0x00, 0x00, 0x00, 0x00, // Status: 0x00000000
    0x00, 0x00, 0x10, 0x00, // MaxReadWriteSize: 0x00100000 (1 MiB)
    0x00, 0x04, 0x00, 0x00, // PreferredSendSize: 0x00000400 (1 KiB)
    0x00, 0x04, 0x00, 0x00, // MaxReceiveSize: 0x00000400 (1 KiB)
    0x00, 0x00, 0x02, 0x00, // MaxFragmentedSize: 0x00020000 (128 KiB)
];

fn example_4_1_request_repr() -> NegotiateRequestRepr {
    NegotiateRequestRepr {
        min_version: 0x0100,
        max_version: 0x0100,
        credits_requested: 10,
        preferred_send_size: 1024,
        max_receive_size: 1024,
        max_fragmented_size: 128 * 1024,
    }
}

fn example_4_1_response_repr() -> NegotiateResponseRepr {
    NegotiateResponseRepr {
        min_version: 0x0100,
        max_version: 0x0100,
        negotiated_version: 0x0100,
        credits_requested: 10,
        credits_granted: 10,
        status: STATUS_SUCCESS,
        max_read_write_size: 1024 * 1024,
        preferred_send_size: 1024,
        max_receive_size: 1024,
        max_fragmented_size: 128 * 1024,
    }
}

#[test]
fn example_4_1_negotiate_request_fields() {
    let view = NegotiateRequest::new_checked(&EXAMPLE_4_1_NEGOTIATE_REQUEST[..]).unwrap();
    assert_eq!(view.min_version(), 0x0100);
    assert_eq!(view.max_version(), 0x0100);
    assert_eq!(view.reserved(), 0x0000);
    assert_eq!(view.credits_requested(), 0x000A);
    assert_eq!(view.preferred_send_size(), 0x0000_0400);
    assert_eq!(view.max_receive_size(), 0x0000_0400);
    assert_eq!(view.max_fragmented_size(), 0x0002_0000);
    let repr = NegotiateRequestRepr::parse(&view);
    assert_eq!(repr, example_4_1_request_repr());
    assert_eq!(repr.to_bytes(), EXAMPLE_4_1_NEGOTIATE_REQUEST);
}

#[test]
fn example_4_1_negotiate_response_fields() {
    let view = NegotiateResponse::new_checked(&EXAMPLE_4_1_NEGOTIATE_RESPONSE[..]).unwrap();
    assert_eq!(view.min_version(), 0x0100);
    assert_eq!(view.max_version(), 0x0100);
    assert_eq!(view.negotiated_version(), 0x0100);
    assert_eq!(view.reserved(), 0x0000);
    assert_eq!(view.credits_requested(), 0x000A);
    assert_eq!(view.credits_granted(), 0x000A);
    assert_eq!(view.status(), STATUS_SUCCESS);
    assert_eq!(view.max_read_write_size(), 0x0010_0000);
    assert_eq!(view.preferred_send_size(), 0x0000_0400);
    assert_eq!(view.max_receive_size(), 0x0000_0400);
    assert_eq!(view.max_fragmented_size(), 0x0002_0000);
    let repr = NegotiateResponseRepr::parse(&view);
    assert_eq!(repr, example_4_1_response_repr());
    assert_eq!(repr.to_bytes(), EXAMPLE_4_1_NEGOTIATE_RESPONSE);
}

#[test]
fn example_4_1_values_pass_the_receivers_checks() {
    let req = example_4_1_request_repr();
    let rsp = example_4_1_response_repr();
    // 3.1.5.6 on the request.
    assert!((req.min_version..=req.max_version).contains(&SMBD_VERSION_1));
    assert!(req.credits_requested > 0);
    assert!(req.max_receive_size >= MIN_RECEIVE_SIZE);
    assert!(req.max_fragmented_size >= MIN_FRAGMENTED_SIZE);
    // 2.2.2: response PreferredSendSize <= the request's MaxReceiveSize; and
    // 3.1.5.7 on the response (the initiator's MaxReceiveSize is 1 KiB).
    assert!(rsp.preferred_send_size <= req.max_receive_size);
    assert_eq!(rsp.negotiated_version, SMBD_VERSION_1);
    assert!(rsp.max_receive_size >= MIN_RECEIVE_SIZE);
    assert!(rsp.max_fragmented_size >= MIN_FRAGMENTED_SIZE);
    assert!(rsp.credits_granted > 0 && rsp.credits_requested > 0);
    assert_eq!(rsp.status, STATUS_SUCCESS);
}

#[test]
fn example_4_1_first_data_transfer_fields() {
    // DataLength "0x00000xxx (length of Buffer)": any length the connection
    // allows. MaxSendSize = min(our 1364, the peer's MaxReceiveSize 1024);
    // DataOffset + DataLength must not exceed it (3.1.5.4).
    let max_send = SmbdConfig::default().max_send_size.min(1024);
    let max_len = max_send - DATA_TRANSFER_PAYLOAD_OFFSET as u32;
    assert_eq!(max_len, 0x3E8);
    for data_length in [0x001u32, 0x0E4, 0x1F4, max_len] {
        let payload = upper_layer_message(data_length as usize, 0x41);
        let mut message = data_transfer_header(10, 10, 0, 0, 24, data_length).to_vec();
        message.extend_from_slice(&payload);
        check_data_transfer(
            &message,
            DataTransferRepr {
                credits_requested: 0x000A,
                credits_granted: 0x000A,
                flags: 0x0000,
                remaining_data_length: 0,
                data_offset: 0x18,
                data_length,
            },
            &payload,
        );
        assert!(message.len() <= 1024, "fits the peer's MaxReceiveSize");
    }
}

// ---------------------------------------------------------------------------
// 4.2 Peer Transmits 500 Bytes of Data
// ---------------------------------------------------------------------------

#[test]
fn example_4_2_peer_transmits_500_bytes() {
    #[rustfmt::skip]
    let header: [u8; 24] = [
        0x0A, 0x00,             // CreditsRequested: 0x000A (10)
        0x01, 0x00,             // CreditsGranted: 0x0001
        0x00, 0x00,             // Flags: 0x0000
        0x00, 0x00,             // Reserved: 0x0000
        0x00, 0x00, 0x00, 0x00, // RemainingDataLength: 0 (nonfragmented)
        0x18, 0x00, 0x00, 0x00, // DataOffset: 0x00000018 (24)
        0xF4, 0x01, 0x00, 0x00, // DataLength: 0x000001F4 (500)
        0x00, 0x00, 0x00, 0x00, // Padding: 4 bytes of 0x00
    ];
    assert_eq!(header, data_transfer_header(10, 1, 0, 0, 24, 500));
    let payload = upper_layer_message(500, 0x42);
    let mut message = header.to_vec();
    message.extend_from_slice(&payload);
    assert_eq!(message.len(), 524);
    let expected = DataTransferRepr {
        credits_requested: 0x000A,
        credits_granted: 0x0001,
        ..DataTransferRepr::with_payload(0x1F4, 0)
    };
    check_data_transfer(&message, expected, &payload);
}

// ---------------------------------------------------------------------------
// 4.3 Peer Transmits 64 KiB of Data
// ---------------------------------------------------------------------------

const EXAMPLE_4_3_TOTAL: u32 = 64 * 1024;
/// "1000 = MaxReceiveSize - 24" (the example's hex, 0x3F8, is 1016).
const EXAMPLE_4_3_FRAGMENT: u32 = 1024 - 24;

/// The fragments 3.1.5.4 produces for the 64 KiB message: (RemainingDataLength,
/// DataLength) for each.
fn example_4_3_fragments() -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    let mut unsent = EXAMPLE_4_3_TOTAL;
    while unsent > 0 {
        let len = unsent.min(EXAMPLE_4_3_FRAGMENT);
        unsent -= len;
        out.push((unsent, len));
    }
    out
}

#[test]
fn example_4_3_fragment_data_length_is_1000_which_is_0x3e8() {
    // "DataLength: 0x000003F8 (1000 = MaxReceiveSize - 24)": the decimal
    // and the formula agree, the hex does not (0x3F8 is 1016).
    let peer_max_receive = example_4_1_response_repr().max_receive_size;
    let max_send = SmbdConfig::default().max_send_size.min(peer_max_receive);
    let fragment = max_send - DATA_TRANSFER_PAYLOAD_OFFSET as u32;
    assert_eq!(fragment, EXAMPLE_4_3_FRAGMENT);
    assert_eq!(fragment, 1000);
    assert_eq!(fragment, 0x3E8);
    let printed_hex = u32::from_str_radix("000003F8", 16).unwrap();
    assert_eq!(printed_hex, 1016);
    // 0x3F8 bytes at offset 24 would not fit the peer's 1024-byte receive
    // (3.1.5.4: DataOffset + DataLength must not exceed MaxSendSize).
    assert!(24 + printed_hex > max_send);
    assert_eq!(24 + fragment, max_send);
}

#[test]
fn example_4_3_first_fragment_has_63_kib_remaining() {
    let (remaining, len) = example_4_3_fragments()[0];
    assert_eq!((remaining, len), (64_536, 1000));
    assert_eq!(remaining / 1024, 63, "\"63KiB remaining\"");
    let payload = upper_layer_message(1000, 0x43);
    #[rustfmt::skip]
    let mut message = vec![
        0x0A, 0x00,             // CreditsRequested: 0x000A (10)
        0x01, 0x00,             // CreditsGranted: 0x0001
        0x00, 0x00,             // Flags: 0x0000
        0x00, 0x00,             // Reserved: 0x0000
        0x18, 0xFC, 0x00, 0x00, // RemainingDataLength: 64536 (63 KiB)
        0x18, 0x00, 0x00, 0x00, // DataOffset: 0x00000018 (24)
        0xE8, 0x03, 0x00, 0x00, // DataLength: 0x000003E8 (1000)
        0x00, 0x00, 0x00, 0x00, // Padding: 4 bytes of 0x00
    ];
    message.extend_from_slice(&payload);
    assert_eq!(message.len(), 1024, "exactly the peer's MaxReceiveSize");
    check_data_transfer(
        &message,
        DataTransferRepr {
            credits_requested: 10,
            credits_granted: 1,
            ..DataTransferRepr::with_payload(1000, 64_536)
        },
        &payload,
    );
}

#[test]
fn example_4_3_second_fragment_has_62_kib_remaining() {
    let (remaining, len) = example_4_3_fragments()[1];
    assert_eq!((remaining, len), (63_536, 1000));
    assert_eq!(remaining / 1024, 62, "\"62KiB remaining\"");
    let payload = upper_layer_message(1000, 0x44);
    let mut message = data_transfer_header(10, 1, 0, 63_536, 24, 1000).to_vec();
    assert_eq!(&message[8..12], &[0x30, 0xF8, 0x00, 0x00]);
    message.extend_from_slice(&payload);
    check_data_transfer(
        &message,
        DataTransferRepr {
            credits_requested: 10,
            credits_granted: 1,
            ..DataTransferRepr::with_payload(1000, 63_536)
        },
        &payload,
    );
}

#[test]
fn example_4_3_final_fragment_carries_536_bytes() {
    let fragments = example_4_3_fragments();
    assert_eq!(*fragments.last().unwrap(), (0, 536));
    #[rustfmt::skip]
    let mut message = vec![
        0x0A, 0x00,             // CreditsRequested: 0x000A (10)
        0x01, 0x00,             // CreditsGranted: 0x0001
        0x00, 0x00,             // Flags: 0x0000
        0x00, 0x00,             // Reserved: 0x0000
        0x00, 0x00, 0x00, 0x00, // RemainingDataLength: 0 (final fragment)
        0x18, 0x00, 0x00, 0x00, // DataOffset: 0x00000018 (24)
        0x18, 0x02, 0x00, 0x00, // DataLength: 0x00000218 (536)
        0x00, 0x00, 0x00, 0x00, // Padding: 4 bytes of 0x00
    ];
    let payload = upper_layer_message(536, 0x45);
    message.extend_from_slice(&payload);
    check_data_transfer(
        &message,
        DataTransferRepr {
            credits_requested: 10,
            credits_granted: 1,
            ..DataTransferRepr::with_payload(0x218, 0)
        },
        &payload,
    );
}

#[test]
fn example_4_3_sequence_is_66_fragments_not_65() {
    let fragments = example_4_3_fragments();
    assert_eq!(fragments.len(), 66);
    assert_eq!(65 * 1000 + 536, EXAMPLE_4_3_TOTAL);
    assert!(fragments[..65].iter().all(|&(_, len)| len == 1000));
}

#[test]
fn example_4_3_fragments_reassemble_under_3_1_5_8() {
    // Send the whole sequence through the codec and the 3.1.5.8 reassembly
    // bookkeeping: every message passes the receiver's checks against the
    // negotiated MaxFragmentedSize (128 KiB), FragmentReassemblyRemaining
    // reaches 0 exactly on the final fragment, and the upper-layer message
    // comes out whole.
    let max_fragmented = 128 * 1024u32;
    let upper = upper_layer_message(EXAMPLE_4_3_TOTAL as usize, 0x46);
    let mut sent = 0usize;
    let mut reassembly = Vec::new();
    let mut reassembly_remaining = 0u32;
    let mut delivered = None;
    for (remaining, len) in example_4_3_fragments() {
        let repr = DataTransferRepr {
            credits_requested: 10,
            credits_granted: 1,
            ..DataTransferRepr::with_payload(len, remaining)
        };
        let mut buf = vec![0u8; repr.buffer_len()];
        let n = repr.emit(&mut buf, &upper[sent..sent + len as usize]);
        sent += len as usize;
        assert!(n <= 1024, "fits the peer's MaxReceiveSize");

        let view = DataTransfer::new_checked(&buf[..n]).unwrap();
        let got = DataTransferRepr::parse(&view).unwrap();
        assert!(got.credits_requested >= 1);
        assert!(
            u64::from(got.data_length) + u64::from(got.remaining_data_length)
                <= u64::from(max_fragmented)
        );
        reassembly.extend_from_slice(view.payload().unwrap());
        if reassembly_remaining == 0 {
            reassembly_remaining = got.remaining_data_length;
        } else {
            reassembly_remaining -= got.data_length;
        }
        assert_eq!(reassembly_remaining, got.remaining_data_length);
        if got.remaining_data_length == 0 {
            assert_eq!(reassembly_remaining, 0);
            delivered = Some(std::mem::take(&mut reassembly));
        }
    }
    assert_eq!(delivered.as_deref(), Some(&upper[..]));
}

// ---------------------------------------------------------------------------
// 4.4 Peer Transmits 1 MiB of Data Via Upper Layer
// ---------------------------------------------------------------------------

#[rustfmt::skip]
const EXAMPLE_4_4_DESCRIPTOR: [u8; 16] = [
    0x12, 0xE0, 0xCD, 0xAB, 0x00, 0x00, 0x00, 0x00, // Offset: 0x00000000ABCDE012
    0x56, 0xBC, 0x00, 0x1A,                         // Token: 0x1A00BC56
    0x00, 0x00, 0x10, 0x00,                         // Length: 0x00100000 (1 MiB)
];

const EXAMPLE_4_4: BufferDescriptorRepr = BufferDescriptorRepr {
    offset: 0x0000_0000_ABCD_E012,
    token: 0x1A00_BC56,
    length: 0x0010_0000,
};

#[test]
fn example_4_4_buffer_descriptor_fields() {
    let view = BufferDescriptor::new_checked(&EXAMPLE_4_4_DESCRIPTOR[..]).unwrap();
    assert_eq!(view.offset(), 0x0000_0000_ABCD_E012);
    assert_eq!(view.length(), 0x0010_0000);
    assert_eq!(view.token(), 0x1A00_BC56);
    assert_eq!(BufferDescriptorRepr::parse(&view), EXAMPLE_4_4);
    assert_eq!(EXAMPLE_4_4.to_bytes(), EXAMPLE_4_4_DESCRIPTOR);
}

#[test]
fn example_4_4_write_request_carries_the_descriptor_in_500_bytes() {
    let mut payload = upper_layer_message(500, 0x47);
    payload[CHANNEL_INFO_OFFSET..CHANNEL_INFO_OFFSET + 16].copy_from_slice(&EXAMPLE_4_4_DESCRIPTOR);
    let mut message = data_transfer_header(10, 1, 0, 0, 24, 500).to_vec();
    message.extend_from_slice(&payload);
    check_data_transfer(
        &message,
        DataTransferRepr {
            credits_requested: 0x000A,
            credits_granted: 0x0001,
            ..DataTransferRepr::with_payload(0x1F4, 0)
        },
        &payload,
    );
    // The upper layer finds the single-element array in the payload.
    let view = DataTransfer::new_checked(&message[..]).unwrap();
    let upper = view.payload().unwrap();
    let array =
        BufferDescriptorArray::new_checked(&upper[CHANNEL_INFO_OFFSET..CHANNEL_INFO_OFFSET + 16])
            .unwrap();
    assert_eq!(array.len(), 1);
    assert_eq!(array.get(0), Some(EXAMPLE_4_4));
    assert_eq!(array.total_length(), 1024 * 1024);
}

#[test]
fn example_4_4_rdma_read_of_the_whole_buffer_is_one_operation() {
    // Step 3/4: one RDMA Read of the whole 1 MiB (within the negotiated
    // MaxReadWriteSize of 1 MiB from 4.1).
    let segs: Vec<_> = slice(&[EXAMPLE_4_4][..], 0, 1024 * 1024).unwrap().collect();
    assert_eq!(
        segs,
        vec![RdmaSegment {
            remote_offset: 0xABCD_E012,
            token: 0x1A00_BC56,
            length: 0x0010_0000,
            local_offset: 0,
        }]
    );
    assert!(
        u64::from(segs[0].length) <= u64::from(example_4_1_response_repr().max_read_write_size)
    );
}

// ---------------------------------------------------------------------------
// 4.5 Peer Receives 1 MiB of Data Via Upper Layer
// ---------------------------------------------------------------------------

/// "Offset: 0x00000000DCBA024" has 15 hex digits; its value is 0x0DCBA024.
#[rustfmt::skip]
const EXAMPLE_4_5_DESCRIPTOR: [u8; 16] = [
    0x24, 0xA0, 0xCB, 0x0D, 0x00, 0x00, 0x00, 0x00, // Offset: 0x000000000DCBA024
    0x57, 0xBC, 0x00, 0x1A,                         // Token: 0x1A00BC57
    0x00, 0x00, 0x10, 0x00,                         // Length: 0x00100000 (1 MiB)
];

const EXAMPLE_4_5: BufferDescriptorRepr = BufferDescriptorRepr {
    offset: 0x0DCB_A024,
    token: 0x1A00_BC57,
    length: 0x0010_0000,
};

#[test]
fn example_4_5_buffer_descriptor_fields() {
    let view = BufferDescriptor::new_checked(&EXAMPLE_4_5_DESCRIPTOR[..]).unwrap();
    assert_eq!(view.offset(), 0x0DCB_A024);
    assert_eq!(view.length(), 0x0010_0000);
    assert_eq!(view.token(), 0x1A00_BC57);
    assert_eq!(BufferDescriptorRepr::parse(&view), EXAMPLE_4_5);
    assert_eq!(EXAMPLE_4_5.to_bytes(), EXAMPLE_4_5_DESCRIPTOR);
}

#[test]
fn example_4_5_read_request_carries_the_descriptor_in_500_bytes() {
    let mut payload = upper_layer_message(500, 0x48);
    payload[CHANNEL_INFO_OFFSET..CHANNEL_INFO_OFFSET + 16].copy_from_slice(&EXAMPLE_4_5_DESCRIPTOR);
    #[rustfmt::skip]
    let mut message = vec![
        0x0A, 0x00,             // CreditsRequested: 0x000A (10)
        0x01, 0x00,             // CreditsGranted: 0x0001
        0x00, 0x00,             // Flags: 0x0000
        0x00, 0x00,             // Reserved: 0x0000
        0x00, 0x00, 0x00, 0x00, // RemainingDataLength: 0 (nonfragmented)
        0x18, 0x00, 0x00, 0x00, // DataOffset: 0x00000018 (24)
        0xF4, 0x01, 0x00, 0x00, // DataLength: 0x000001F4 (500)
        0x00, 0x00, 0x00, 0x00, // Padding: 4 bytes of 0x00
    ];
    message.extend_from_slice(&payload);
    check_data_transfer(
        &message,
        DataTransferRepr {
            credits_requested: 0x000A,
            credits_granted: 0x0001,
            ..DataTransferRepr::with_payload(0x1F4, 0)
        },
        &payload,
    );
    let view = DataTransfer::new_checked(&message[..]).unwrap();
    let upper = view.payload().unwrap();
    let array =
        BufferDescriptorArray::new_checked(&upper[CHANNEL_INFO_OFFSET..CHANNEL_INFO_OFFSET + 16])
            .unwrap();
    assert_eq!(array.iter().collect::<Vec<_>>(), vec![EXAMPLE_4_5]);
}

#[test]
fn example_4_5_rdma_write_of_the_whole_buffer_is_one_operation() {
    let bytes = EXAMPLE_4_5_DESCRIPTOR;
    let array = BufferDescriptorArray::new_checked(&bytes[..]).unwrap();
    let segs: Vec<_> = slice(&array, 0, 1024 * 1024).unwrap().collect();
    assert_eq!(
        segs,
        vec![RdmaSegment {
            remote_offset: 0x0DCB_A024,
            token: 0x1A00_BC57,
            length: 0x0010_0000,
            local_offset: 0,
        }]
    );
}

#[test]
fn example_4_5_rdma_write_of_the_second_half_trims_the_element() {
    // An upper layer writing the 1 MiB in two 512 KiB halves: the second
    // half's operation starts 512 KiB into the element (first-element
    // trimming of 3.1.4.5).
    let half = 512 * 1024u64;
    let second: Vec<_> = slice(&[EXAMPLE_4_5][..], half, half).unwrap().collect();
    assert_eq!(
        second,
        vec![RdmaSegment {
            remote_offset: 0x0DCB_A024 + half,
            token: 0x1A00_BC57,
            length: half as u32,
            local_offset: 0,
        }]
    );
}
