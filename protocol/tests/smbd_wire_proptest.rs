//! Property tests for every [MS-SMBD] decoder.
//!
//! (a) Random bytes of random length: the decoder never panics, and its
//!     verdict (and every decoded value) equals an independent model written
//!     from the spec's tables: fields read little-endian at their 2.2
//!     offsets (big-endian for the Appendix A IRD/ORD header), `Truncated`
//!     exactly below the fixed length, and for Data Transfer the 3.1.5.8
//!     layout rules.
//! (b) Structure-aware: a valid message is generated from a Repr, emitted,
//!     then exactly one thing is changed (one field, a truncation, an
//!     extension) and the decoder's verdict must be the one the rules give
//!     for that change.

use core::ops::Range;

use proptest::collection::vec;
use proptest::prelude::*;
use smbdirect_protocol::ntstatus::NtStatus;
use smbdirect_protocol::smbd::wire::{
    negotiate_ird_ord, BufferDescriptor, BufferDescriptorArray, BufferDescriptorRepr, DataTransfer,
    DataTransferRepr, IrdOrdError, IrdOrdHeader, IrdOrdRepr, NegotiateRequest,
    NegotiateRequestRepr, NegotiateResponse, NegotiateResponseRepr,
};
use smbdirect_protocol::WireError;

// ---------------------------------------------------------------------------
// The independent model
// ---------------------------------------------------------------------------

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from(b[at]) | u16::from(b[at + 1]) << 8
}

fn le32(b: &[u8], at: usize) -> u32 {
    (0..4).fold(0u32, |v, i| v | u32::from(b[at + i]) << (8 * i))
}

fn le64(b: &[u8], at: usize) -> u64 {
    (0..8).fold(0u64, |v, i| v | u64::from(b[at + i]) << (8 * i))
}

fn be32(b: &[u8], at: usize) -> u32 {
    (0..4).fold(0u32, |v, i| v << 8 | u32::from(b[at + i]))
}

/// Writes the low `width` bytes of `v`, little-endian, at `at`.
fn put_le(b: &mut [u8], at: usize, width: usize, v: u64) {
    for i in 0..width {
        b[at + i] = (v >> (8 * i)) as u8;
    }
}

fn truncated(what: &'static str, need: usize, have: usize) -> WireError {
    WireError::Truncated { what, need, have }
}

/// [MS-SMBD] 3.1.5.8 layout rules for a Data Transfer message of `msg_len`
/// bytes (at least 20): DataOffset 8-byte aligned; DataOffset + DataLength
/// within the message; and (docs/spec-notes.md, "DataOffset inside the
/// header") a non-empty payload does not start inside the 20-byte header.
/// `Ok` holds the payload's range.
fn data_transfer_rules(msg_len: usize, off: u32, len: u32) -> Result<Range<usize>, ()> {
    if off % 8 != 0 {
        return Err(());
    }
    if u64::from(off) + u64::from(len) > msg_len as u64 {
        return Err(());
    }
    if len == 0 {
        return Ok(0..0);
    }
    if off < 20 {
        return Err(());
    }
    Ok(off as usize..off as usize + len as usize)
}

// ---------------------------------------------------------------------------
// Field tables (offset, width) straight from 2.2.1 / 2.2.2 / 2.2.3 / 2.2.3.1
// ---------------------------------------------------------------------------

const REQ_FIELDS: [(&str, usize, usize); 7] = [
    ("MinVersion", 0, 2),
    ("MaxVersion", 2, 2),
    ("Reserved", 4, 2),
    ("CreditsRequested", 6, 2),
    ("PreferredSendSize", 8, 4),
    ("MaxReceiveSize", 12, 4),
    ("MaxFragmentedSize", 16, 4),
];

fn request_with(mut r: NegotiateRequestRepr, field: &str, v: u64) -> NegotiateRequestRepr {
    match field {
        "MinVersion" => r.min_version = v as u16,
        "MaxVersion" => r.max_version = v as u16,
        "Reserved" => {}
        "CreditsRequested" => r.credits_requested = v as u16,
        "PreferredSendSize" => r.preferred_send_size = v as u32,
        "MaxReceiveSize" => r.max_receive_size = v as u32,
        "MaxFragmentedSize" => r.max_fragmented_size = v as u32,
        _ => unreachable!("{field}"),
    }
    r
}

const RSP_FIELDS: [(&str, usize, usize); 11] = [
    ("MinVersion", 0, 2),
    ("MaxVersion", 2, 2),
    ("NegotiatedVersion", 4, 2),
    ("Reserved", 6, 2),
    ("CreditsRequested", 8, 2),
    ("CreditsGranted", 10, 2),
    ("Status", 12, 4),
    ("MaxReadWriteSize", 16, 4),
    ("PreferredSendSize", 20, 4),
    ("MaxReceiveSize", 24, 4),
    ("MaxFragmentedSize", 28, 4),
];

fn response_with(mut r: NegotiateResponseRepr, field: &str, v: u64) -> NegotiateResponseRepr {
    match field {
        "MinVersion" => r.min_version = v as u16,
        "MaxVersion" => r.max_version = v as u16,
        "NegotiatedVersion" => r.negotiated_version = v as u16,
        "Reserved" => {}
        "CreditsRequested" => r.credits_requested = v as u16,
        "CreditsGranted" => r.credits_granted = v as u16,
        "Status" => r.status = NtStatus(v as u32),
        "MaxReadWriteSize" => r.max_read_write_size = v as u32,
        "PreferredSendSize" => r.preferred_send_size = v as u32,
        "MaxReceiveSize" => r.max_receive_size = v as u32,
        "MaxFragmentedSize" => r.max_fragmented_size = v as u32,
        _ => unreachable!("{field}"),
    }
    r
}

const DESC_FIELDS: [(&str, usize, usize); 3] =
    [("Offset", 0, 8), ("Token", 8, 4), ("Length", 12, 4)];

fn descriptor_with(mut d: BufferDescriptorRepr, field: &str, v: u64) -> BufferDescriptorRepr {
    match field {
        "Offset" => d.offset = v,
        "Token" => d.token = v as u32,
        "Length" => d.length = v as u32,
        _ => unreachable!("{field}"),
    }
    d
}

// ---------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------

fn request_repr() -> impl Strategy<Value = NegotiateRequestRepr> {
    (
        any::<u16>(),
        any::<u16>(),
        any::<u16>(),
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
    )
        .prop_map(|(a, b, c, d, e, f)| NegotiateRequestRepr {
            min_version: a,
            max_version: b,
            credits_requested: c,
            preferred_send_size: d,
            max_receive_size: e,
            max_fragmented_size: f,
        })
}

fn response_repr() -> impl Strategy<Value = NegotiateResponseRepr> {
    (
        (
            any::<u16>(),
            any::<u16>(),
            any::<u16>(),
            any::<u16>(),
            any::<u16>(),
        ),
        (
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
        ),
    )
        .prop_map(|((a, b, c, d, e), (f, g, h, i, j))| NegotiateResponseRepr {
            min_version: a,
            max_version: b,
            negotiated_version: c,
            credits_requested: d,
            credits_granted: e,
            status: NtStatus(f),
            max_read_write_size: g,
            preferred_send_size: h,
            max_receive_size: i,
            max_fragmented_size: j,
        })
}

fn descriptor_repr() -> impl Strategy<Value = BufferDescriptorRepr> {
    (any::<u64>(), any::<u32>(), any::<u32>()).prop_map(|(offset, token, length)| {
        BufferDescriptorRepr {
            offset,
            token,
            length,
        }
    })
}

/// What happens to an emitted fixed-layout structure of `len` bytes with
/// `fields` fields.
#[derive(Debug, Clone)]
enum Mutation {
    None,
    Field { index: usize, value: u64 },
    Truncate(usize),
    Extend(Vec<u8>),
}

fn mutation(fields: usize, len: usize) -> impl Strategy<Value = Mutation> {
    prop_oneof![
        1 => Just(Mutation::None),
        4 => (0..fields, any::<u64>()).prop_map(|(index, value)| Mutation::Field { index, value }),
        2 => (0..len).prop_map(Mutation::Truncate),
        2 => vec(any::<u8>(), 1..64).prop_map(Mutation::Extend),
    ]
}

/// A valid Data Transfer message: its Repr, payload and trailing bytes past
/// the payload (a receive buffer may hold more than the message says).
#[derive(Debug, Clone)]
struct ValidDataTransfer {
    repr: DataTransferRepr,
    payload: Vec<u8>,
    trailing: Vec<u8>,
}

impl ValidDataTransfer {
    fn bytes(&self) -> Vec<u8> {
        let mut buf = vec![0xA5u8; self.repr.buffer_len()];
        let n = self.repr.emit(&mut buf, &self.payload);
        buf.truncate(n);
        buf.extend_from_slice(&self.trailing);
        buf
    }
}

fn valid_data_transfer() -> impl Strategy<Value = ValidDataTransfer> {
    (
        (any::<u16>(), any::<u16>(), any::<u16>(), any::<u32>()),
        prop_oneof![Just(0usize), 1usize..1500],
        0u32..4,
        any::<u8>(),
        vec(any::<u8>(), 0..24),
    )
        .prop_map(
            |(
                (credits_requested, credits_granted, flags, remaining),
                len,
                pad8,
                seed,
                trailing,
            )| {
                let payload: Vec<u8> = (0..len).map(|i| (i as u8) ^ seed).collect();
                let data_offset = if len == 0 { 0 } else { 24 + 8 * pad8 };
                ValidDataTransfer {
                    repr: DataTransferRepr {
                        credits_requested,
                        credits_granted,
                        flags,
                        remaining_data_length: remaining,
                        data_offset,
                        data_length: len as u32,
                    },
                    payload,
                    trailing,
                }
            },
        )
}

#[derive(Debug, Clone)]
enum DtMutation {
    None,
    CreditsRequested(u16),
    CreditsGranted(u16),
    Flags(u16),
    Reserved(u16),
    RemainingDataLength(u32),
    DataOffset(u32),
    DataLength(u32),
    /// Byte `.0` (modulo the padding length) of the padding set to `.1`.
    Padding(usize, u8),
    Truncate(usize),
    Extend(Vec<u8>),
}

fn offset_value() -> impl Strategy<Value = u32> {
    prop_oneof![
        any::<u32>(),
        0u32..80,
        (0u32..200).prop_map(|k| k * 8),
        (0u32..200).prop_map(|k| k * 8 + 1 + k % 7),
        Just(u32::MAX),
        Just(u32::MAX - 7),
    ]
}

fn length_value() -> impl Strategy<Value = u32> {
    prop_oneof![any::<u32>(), 0u32..1600, Just(u32::MAX)]
}

fn dt_mutation() -> impl Strategy<Value = DtMutation> {
    prop_oneof![
        1 => Just(DtMutation::None),
        1 => any::<u16>().prop_map(DtMutation::CreditsRequested),
        1 => any::<u16>().prop_map(DtMutation::CreditsGranted),
        1 => any::<u16>().prop_map(DtMutation::Flags),
        1 => any::<u16>().prop_map(DtMutation::Reserved),
        1 => any::<u32>().prop_map(DtMutation::RemainingDataLength),
        3 => offset_value().prop_map(DtMutation::DataOffset),
        3 => length_value().prop_map(DtMutation::DataLength),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(i, v)| DtMutation::Padding(i, v)),
        2 => any::<usize>().prop_map(DtMutation::Truncate),
        1 => vec(any::<u8>(), 1..64).prop_map(DtMutation::Extend),
    ]
}

/// Decodes a Data Transfer message the way a receiver would: view, Repr and
/// payload.
fn decode_data_transfer(bytes: &[u8]) -> Result<(DataTransferRepr, Vec<u8>), WireError> {
    let view = DataTransfer::new_checked(bytes)?;
    let repr = DataTransferRepr::parse(&view)?;
    let payload = view.payload()?.to_vec();
    Ok((repr, payload))
}

// ---------------------------------------------------------------------------
// (a) random bytes
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn random_bytes_negotiate_request_decodes_iff_20_bytes(bytes in vec(any::<u8>(), 0..64)) {
        match NegotiateRequest::new_checked(&bytes[..]) {
            Ok(view) => {
                prop_assert!(bytes.len() >= 20);
                let r = NegotiateRequestRepr::parse(&view);
                prop_assert_eq!(r.min_version, le16(&bytes, 0));
                prop_assert_eq!(r.max_version, le16(&bytes, 2));
                prop_assert_eq!(view.reserved(), le16(&bytes, 4));
                prop_assert_eq!(r.credits_requested, le16(&bytes, 6));
                prop_assert_eq!(r.preferred_send_size, le32(&bytes, 8));
                prop_assert_eq!(r.max_receive_size, le32(&bytes, 12));
                prop_assert_eq!(r.max_fragmented_size, le32(&bytes, 16));
            }
            Err(e) => prop_assert_eq!(e, truncated("SMBD negotiate request", 20, bytes.len())),
        }
    }

    #[test]
    fn random_bytes_negotiate_response_decodes_iff_32_bytes(bytes in vec(any::<u8>(), 0..80)) {
        match NegotiateResponse::new_checked(&bytes[..]) {
            Ok(view) => {
                prop_assert!(bytes.len() >= 32);
                let r = NegotiateResponseRepr::parse(&view);
                prop_assert_eq!(r.min_version, le16(&bytes, 0));
                prop_assert_eq!(r.max_version, le16(&bytes, 2));
                prop_assert_eq!(r.negotiated_version, le16(&bytes, 4));
                prop_assert_eq!(view.reserved(), le16(&bytes, 6));
                prop_assert_eq!(r.credits_requested, le16(&bytes, 8));
                prop_assert_eq!(r.credits_granted, le16(&bytes, 10));
                prop_assert_eq!(r.status, NtStatus(le32(&bytes, 12)));
                prop_assert_eq!(r.max_read_write_size, le32(&bytes, 16));
                prop_assert_eq!(r.preferred_send_size, le32(&bytes, 20));
                prop_assert_eq!(r.max_receive_size, le32(&bytes, 24));
                prop_assert_eq!(r.max_fragmented_size, le32(&bytes, 28));
            }
            Err(e) => prop_assert_eq!(e, truncated("SMBD negotiate response", 32, bytes.len())),
        }
    }

    #[test]
    fn random_bytes_data_transfer_verdict_follows_3_1_5_8(
        mut bytes in vec(any::<u8>(), 0..256),
        plant in proptest::option::of((0u32..64, prop_oneof![Just(0u32), 0u32..256])),
    ) {
        // Fully random offsets/lengths are almost never valid; half the
        // cases plant small ones so both verdicts are exercised.
        if let (Some((off, len)), true) = (plant, bytes.len() >= 20) {
            put_le(&mut bytes, 12, 4, u64::from(off));
            put_le(&mut bytes, 16, 4, u64::from(len));
        }
        let got = decode_data_transfer(&bytes);
        if bytes.len() < 20 {
            prop_assert_eq!(got, Err(truncated("SMBD data transfer", 20, bytes.len())));
            return Ok(());
        }
        let view = DataTransfer::new_checked(&bytes[..]).unwrap();
        prop_assert_eq!(view.credits_requested(), le16(&bytes, 0));
        prop_assert_eq!(view.credits_granted(), le16(&bytes, 2));
        prop_assert_eq!(view.flags(), le16(&bytes, 4));
        prop_assert_eq!(view.reserved(), le16(&bytes, 6));
        prop_assert_eq!(view.remaining_data_length(), le32(&bytes, 8));
        let (off, len) = (le32(&bytes, 12), le32(&bytes, 16));
        prop_assert_eq!((view.data_offset(), view.data_length()), (off, len));
        match data_transfer_rules(bytes.len(), off, len) {
            Ok(range) => {
                prop_assert_eq!(view.check_payload(), Ok(range.clone()));
                let (repr, payload) = got.unwrap();
                prop_assert_eq!(repr.data_offset, off);
                prop_assert_eq!(repr.data_length, len);
                prop_assert_eq!(&payload[..], &bytes[range]);
            }
            Err(()) => prop_assert!(
                matches!(got, Err(WireError::Malformed { what: "SMBD data transfer", .. })),
                "expected Malformed, got {:?}", got
            ),
        }
    }

    #[test]
    fn random_bytes_buffer_descriptor_decodes_iff_16_bytes(bytes in vec(any::<u8>(), 0..40)) {
        match BufferDescriptor::new_checked(&bytes[..]) {
            Ok(view) => {
                prop_assert!(bytes.len() >= 16);
                let d = BufferDescriptorRepr::parse(&view);
                prop_assert_eq!(d.offset, le64(&bytes, 0));
                prop_assert_eq!(d.token, le32(&bytes, 8));
                prop_assert_eq!(d.length, le32(&bytes, 12));
            }
            Err(e) => prop_assert_eq!(e, truncated("SMBD buffer descriptor", 16, bytes.len())),
        }
    }

    #[test]
    fn random_bytes_buffer_descriptor_array_decodes_iff_whole_descriptors(
        bytes in prop_oneof![
            vec(any::<u8>(), 0..200),
            (1usize..12).prop_flat_map(|n| vec(any::<u8>(), n * 16)),
        ],
    ) {
        match BufferDescriptorArray::new_checked(&bytes) {
            Ok(array) => {
                prop_assert!(bytes.len() >= 16 && bytes.len() % 16 == 0);
                prop_assert_eq!(array.len(), bytes.len() / 16);
                let mut total = 0u64;
                for (i, d) in array.iter().enumerate() {
                    let at = 16 * i;
                    prop_assert_eq!(d.offset, le64(&bytes, at));
                    prop_assert_eq!(d.token, le32(&bytes, at + 8));
                    prop_assert_eq!(d.length, le32(&bytes, at + 12));
                    prop_assert_eq!(array.get(i), Some(d));
                    total += u64::from(d.length);
                }
                prop_assert_eq!(array.get(array.len()), None);
                prop_assert_eq!(array.total_length(), total);
            }
            Err(e) if bytes.len() < 16 => {
                prop_assert_eq!(e, truncated("SMBD buffer descriptor array", 16, bytes.len()));
            }
            Err(e) => {
                prop_assert!(bytes.len() % 16 != 0);
                prop_assert!(matches!(e, WireError::Malformed { .. }), "{:?}", e);
            }
        }
    }

    #[test]
    fn random_bytes_ird_ord_header_decodes_big_endian_iff_8_bytes(bytes in vec(any::<u8>(), 0..24)) {
        match IrdOrdHeader::new_checked(&bytes[..]) {
            Ok(view) => {
                prop_assert!(bytes.len() >= 8);
                let r = IrdOrdRepr::parse(&view);
                prop_assert_eq!(r.ird, be32(&bytes, 0));
                prop_assert_eq!(r.ord, be32(&bytes, 4));
            }
            Err(e) => prop_assert_eq!(e, truncated("SMBD IRD/ORD header", 8, bytes.len())),
        }
    }
}

// ---------------------------------------------------------------------------
// (b) structure-aware: emit a valid Repr, change one thing
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn negotiate_request_one_mutation_verdict(repr in request_repr(), m in mutation(REQ_FIELDS.len(), 20)) {
        let mut bytes = repr.to_bytes().to_vec();
        let expected = match &m {
            Mutation::None => Ok(repr),
            Mutation::Field { index, value } => {
                let (name, at, width) = REQ_FIELDS[*index];
                put_le(&mut bytes, at, width, *value);
                // No value rule is the codec's (3.1.5.6 belongs to the
                // receiver): every field change round-trips; Reserved is
                // ignored.
                Ok(request_with(repr, name, *value))
            }
            Mutation::Truncate(n) => {
                bytes.truncate(*n);
                Err(truncated("SMBD negotiate request", 20, *n))
            }
            Mutation::Extend(tail) => {
                bytes.extend_from_slice(tail);
                Ok(repr)
            }
        };
        let got = NegotiateRequest::new_checked(&bytes[..]).map(|v| NegotiateRequestRepr::parse(&v));
        prop_assert_eq!(got, expected);
    }

    #[test]
    fn negotiate_response_one_mutation_verdict(repr in response_repr(), m in mutation(RSP_FIELDS.len(), 32)) {
        let mut bytes = repr.to_bytes().to_vec();
        let expected = match &m {
            Mutation::None => Ok(repr),
            Mutation::Field { index, value } => {
                let (name, at, width) = RSP_FIELDS[*index];
                put_le(&mut bytes, at, width, *value);
                Ok(response_with(repr, name, *value))
            }
            Mutation::Truncate(n) => {
                bytes.truncate(*n);
                Err(truncated("SMBD negotiate response", 32, *n))
            }
            Mutation::Extend(tail) => {
                bytes.extend_from_slice(tail);
                Ok(repr)
            }
        };
        let got = NegotiateResponse::new_checked(&bytes[..]).map(|v| NegotiateResponseRepr::parse(&v));
        prop_assert_eq!(got, expected);
    }

    #[test]
    fn negotiate_response_failure_round_trips_with_zeroes(status in any::<u32>()) {
        let repr = NegotiateResponseRepr::failure(NtStatus(status));
        let bytes = repr.to_bytes();
        prop_assert_eq!(&bytes[..4], &[0x00, 0x01, 0x00, 0x01]);
        prop_assert!(bytes[4..12].iter().chain(&bytes[16..]).all(|&b| b == 0));
        prop_assert_eq!(le32(&bytes, 12), status);
        let view = NegotiateResponse::new_checked(&bytes[..]).unwrap();
        prop_assert_eq!(NegotiateResponseRepr::parse(&view), repr);
    }

    #[test]
    fn data_transfer_one_mutation_verdict(msg in valid_data_transfer(), m in dt_mutation()) {
        let original = msg.bytes();
        let mut bytes = original.clone();
        let repr = msg.repr;
        // What the decoder must say: Ok((repr, payload)) or Err(kind).
        enum Want {
            Ok(DataTransferRepr, Vec<u8>),
            Malformed,
            Truncated(usize),
        }
        let by_rules = |bytes: &[u8], r: DataTransferRepr| -> Want {
            match data_transfer_rules(bytes.len(), r.data_offset, r.data_length) {
                Ok(range) => Want::Ok(r, bytes[range].to_vec()),
                Err(()) => Want::Malformed,
            }
        };
        let want = match m {
            DtMutation::None => Want::Ok(repr, msg.payload.clone()),
            DtMutation::CreditsRequested(v) => {
                put_le(&mut bytes, 0, 2, v.into());
                Want::Ok(DataTransferRepr { credits_requested: v, ..repr }, msg.payload.clone())
            }
            DtMutation::CreditsGranted(v) => {
                put_le(&mut bytes, 2, 2, v.into());
                Want::Ok(DataTransferRepr { credits_granted: v, ..repr }, msg.payload.clone())
            }
            DtMutation::Flags(v) => {
                put_le(&mut bytes, 4, 2, v.into());
                Want::Ok(DataTransferRepr { flags: v, ..repr }, msg.payload.clone())
            }
            DtMutation::Reserved(v) => {
                put_le(&mut bytes, 6, 2, v.into());
                Want::Ok(repr, msg.payload.clone())
            }
            DtMutation::RemainingDataLength(v) => {
                put_le(&mut bytes, 8, 4, v.into());
                Want::Ok(DataTransferRepr { remaining_data_length: v, ..repr }, msg.payload.clone())
            }
            DtMutation::DataOffset(v) => {
                put_le(&mut bytes, 12, 4, v.into());
                let r = DataTransferRepr { data_offset: v, ..repr };
                if v % 8 != 0 {
                    // "The received DataOffset field is 8-byte aligned."
                    Want::Malformed
                } else {
                    by_rules(&bytes, r)
                }
            }
            DtMutation::DataLength(v) => {
                put_le(&mut bytes, 16, 4, v.into());
                let r = DataTransferRepr { data_length: v, ..repr };
                if u64::from(repr.data_offset) + u64::from(v) > bytes.len() as u64 {
                    // "DataOffset + DataLength <= length of the message".
                    Want::Malformed
                } else {
                    by_rules(&bytes, r)
                }
            }
            DtMutation::Padding(i, v) => {
                // Padding "MUST be ignored by the receiver".
                let pad = (repr.data_offset as usize).saturating_sub(20);
                if pad > 0 {
                    bytes[20 + i % pad] = v;
                }
                Want::Ok(repr, msg.payload.clone())
            }
            DtMutation::Truncate(i) => {
                let n = i % original.len();
                bytes.truncate(n);
                if n < 20 {
                    Want::Truncated(n)
                } else {
                    by_rules(&bytes, repr)
                }
            }
            DtMutation::Extend(tail) => {
                bytes.extend_from_slice(&tail);
                Want::Ok(repr, msg.payload.clone())
            }
        };
        let got = decode_data_transfer(&bytes);
        match want {
            Want::Ok(r, p) => prop_assert_eq!(got, Ok((r, p))),
            Want::Malformed => prop_assert!(
                matches!(got, Err(WireError::Malformed { .. })),
                "expected Malformed, got {:?}", got
            ),
            Want::Truncated(n) => prop_assert_eq!(got, Err(truncated("SMBD data transfer", 20, n))),
        }
    }

    #[test]
    fn data_offset_not_multiple_of_8_is_always_malformed(
        msg in valid_data_transfer(),
        off in any::<u32>().prop_filter("unaligned", |o| o % 8 != 0),
    ) {
        let mut bytes = msg.bytes();
        put_le(&mut bytes, 12, 4, off.into());
        let got = decode_data_transfer(&bytes);
        prop_assert!(matches!(got, Err(WireError::Malformed { .. })), "expected Malformed, got {:?}", got);
    }

    #[test]
    fn data_length_past_the_end_is_always_malformed(msg in valid_data_transfer(), extra in 1u32..10_000) {
        let mut bytes = msg.bytes();
        let room = bytes.len() as u32 - msg.repr.data_offset;
        let past = room.saturating_add(extra);
        put_le(&mut bytes, 16, 4, past.into());
        let got = decode_data_transfer(&bytes);
        prop_assert!(matches!(got, Err(WireError::Malformed { .. })), "expected Malformed, got {:?}", got);
    }

    #[test]
    fn data_transfer_emit_then_parse_round_trips(msg in valid_data_transfer()) {
        let bytes = msg.bytes();
        prop_assert_eq!(bytes.len(), msg.repr.buffer_len() + msg.trailing.len());
        let (repr, payload) = decode_data_transfer(&bytes).unwrap();
        prop_assert_eq!(repr, msg.repr);
        prop_assert_eq!(payload, msg.payload);
        // Reserved and padding are zero on the wire (3.1.5.4).
        prop_assert_eq!(&bytes[6..8], &[0, 0]);
        let pad_end = (msg.repr.data_offset as usize).max(20);
        prop_assert!(bytes[20..pad_end].iter().all(|&b| b == 0));
    }

    #[test]
    fn buffer_descriptor_one_mutation_verdict(d in descriptor_repr(), m in mutation(DESC_FIELDS.len(), 16)) {
        let mut bytes = d.to_bytes().to_vec();
        let expected = match &m {
            Mutation::None => Ok(d),
            Mutation::Field { index, value } => {
                let (name, at, width) = DESC_FIELDS[*index];
                put_le(&mut bytes, at, width, *value);
                Ok(descriptor_with(d, name, *value))
            }
            Mutation::Truncate(n) => {
                bytes.truncate(*n);
                Err(truncated("SMBD buffer descriptor", 16, *n))
            }
            Mutation::Extend(tail) => {
                bytes.extend_from_slice(tail);
                Ok(d)
            }
        };
        let got = BufferDescriptor::new_checked(&bytes[..]).map(|v| BufferDescriptorRepr::parse(&v));
        prop_assert_eq!(got, expected);
    }

    #[test]
    fn buffer_descriptor_array_one_mutation_verdict(
        descs in vec(descriptor_repr(), 1..12),
        which in any::<usize>(),
        m in mutation(DESC_FIELDS.len(), 16 * 12),
    ) {
        let mut bytes: Vec<u8> = descs.iter().flat_map(|d| d.to_bytes()).collect();
        let mut want_descs = descs.clone();
        match &m {
            Mutation::None => {}
            Mutation::Field { index, value } => {
                let i = which % descs.len();
                let (name, at, width) = DESC_FIELDS[*index];
                put_le(&mut bytes, 16 * i + at, width, *value);
                want_descs[i] = descriptor_with(descs[i], name, *value);
            }
            Mutation::Truncate(n) => {
                let n = n % bytes.len();
                bytes.truncate(n);
                want_descs.truncate(n / 16);
            }
            Mutation::Extend(tail) => {
                bytes.extend_from_slice(tail);
                for c in tail.chunks_exact(16) {
                    want_descs.push(BufferDescriptorRepr {
                        offset: le64(c, 0),
                        token: le32(c, 8),
                        length: le32(c, 12),
                    });
                }
            }
        }
        match BufferDescriptorArray::new_checked(&bytes) {
            Ok(array) => {
                prop_assert!(bytes.len() >= 16 && bytes.len() % 16 == 0);
                prop_assert_eq!(array.iter().collect::<Vec<_>>(), want_descs);
            }
            Err(WireError::Truncated { need: 16, have, .. }) => {
                prop_assert!(bytes.len() < 16);
                prop_assert_eq!(have, bytes.len());
            }
            Err(e) => {
                prop_assert!(bytes.len() % 16 != 0, "{:?}", e);
                prop_assert!(matches!(e, WireError::Malformed { .. }), "{:?}", e);
            }
        }
    }

    #[test]
    fn ird_ord_header_one_mutation_verdict(
        ird in any::<u32>(),
        ord in any::<u32>(),
        field in 0usize..2,
        value in any::<u32>(),
        cut in prop_oneof![Just(None), (0usize..8).prop_map(Some)],
        tail in vec(any::<u8>(), 0..40),
    ) {
        let repr = IrdOrdRepr { ird, ord };
        let mut bytes = repr.to_bytes().to_vec();
        bytes[4 * field..4 * field + 4].copy_from_slice(&value.to_be_bytes());
        let mut want = repr;
        if field == 0 { want.ird = value } else { want.ord = value }
        let expected = match cut {
            Some(n) => {
                bytes.truncate(n);
                Err(truncated("SMBD IRD/ORD header", 8, n))
            }
            None => {
                bytes.extend_from_slice(&tail); // the rest of the private data
                Ok(want)
            }
        };
        let got = IrdOrdHeader::new_checked(&bytes[..]).map(|v| IrdOrdRepr::parse(&v));
        prop_assert_eq!(got, expected);
    }

    #[test]
    fn ird_ord_negotiation_follows_6_2(
        local in (0u32..40, 0u32..40),
        peer in (0u32..40, 0u32..40),
    ) {
        let local = IrdOrdRepr { ird: local.0, ord: local.1 };
        let peer = IrdOrdRepr { ird: peer.0, ord: peer.1 };
        let ird = local.ord.min(peer.ird);
        let ord = local.ird.min(peer.ord);
        let got = negotiate_ird_ord(local, peer);
        if ird == 0 {
            prop_assert_eq!(got, Err(IrdOrdError::ZeroIrd));
        } else if ord == 0 {
            prop_assert_eq!(got, Err(IrdOrdError::ZeroOrd));
        } else {
            let r = got.unwrap();
            prop_assert_eq!(r, IrdOrdRepr { ird, ord });
            // Never more than either side offered.
            prop_assert!(r.ird <= peer.ird && r.ird <= local.ord);
            prop_assert!(r.ord <= peer.ord && r.ord <= local.ird);
            // What the accepting peer sends back survives the wire.
            let bytes = r.to_bytes();
            prop_assert_eq!(IrdOrdRepr::parse(&IrdOrdHeader::new_checked(&bytes[..]).unwrap()), r);
        }
    }
}
