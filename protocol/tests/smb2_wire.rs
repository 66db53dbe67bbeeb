//! [MS-SMB2] section 2 codecs: field offsets pinned with hand-written byte
//! arrays (NEGOTIATE request with contexts, CREATE request, READ request
//! with an RDMA_V1 channel and two buffer descriptors, WRITE request with
//! RDMA_V1_INVALIDATE, IOCTL request carrying FSCTL_STORAGE_QOS_CONTROL),
//! round trips (Repr → emit → new_checked → parse == Repr) for every
//! message, and the receive rules: StructureSize, truncation, offsets out of
//! range, overlapping buffers, misalignment, channel rules, and the NTSTATUS
//! or disconnect each failure maps to.

use smbdirect_protocol::ntstatus::{
    STATUS_BUFFER_OVERFLOW, STATUS_INVALID_PARAMETER, STATUS_MORE_PROCESSING_REQUIRED,
    STATUS_NOT_SUPPORTED, STATUS_PENDING, STATUS_SUCCESS,
};
use smbdirect_protocol::smb2::*;
use smbdirect_protocol::smbd::wire::BufferDescriptorRepr;
use smbdirect_protocol::sqos::{
    Dialect as SqosDialect, Options, StorageQosControlRequestRepr, FSCTL_STORAGE_QOS_CONTROL as QOS,
};

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Emits a body `Repr` into a buffer prefilled with 0xEE (so unwritten
/// padding would show) and checks the returned length.
fn emit<B: Smb2Body + ?Sized>(r: &B) -> Vec<u8> {
    let mut buf = vec![0xEEu8; r.buffer_len()];
    let n = r.emit(&mut buf).expect("emit");
    assert_eq!(n, buf.len(), "emit length == buffer_len");
    buf
}

/// Round trip through bytes: emit, decode, compare; also emit into a
/// buffer one byte short (must fail, not panic).
macro_rules! round_trip {
    ($repr_ty:ident, $value:expr) => {{
        let value = $value;
        let bytes = emit(&value);
        let back = $repr_ty::from_body(&bytes).expect("decode emitted bytes");
        assert_eq!(back, value);
        let mut short = vec![0u8; bytes.len() - 1];
        assert!(matches!(
            value.emit(&mut short),
            Err(Smb2Error::BufferTooSmall { .. })
        ));
        bytes
    }};
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn utf16(s: &str) -> Vec<u8> {
    s.encode_utf16().flat_map(u16::to_le_bytes).collect()
}

fn guid(seed: u8) -> Guid {
    let mut b = [0u8; 16];
    for (i, x) in b.iter_mut().enumerate() {
        *x = seed.wrapping_add(i as u8);
    }
    Guid::from_bytes(b)
}

const FILE_ID: FileId = FileId {
    persistent: 0x1122_3344_5566_7788,
    volatile: 0x99AA_BBCC_DDEE_FF00,
};

/// FileId as the wire carries it: Persistent then Volatile, little-endian.
const FILE_ID_BYTES: [u8; 16] = [
    0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, 0x00, 0xFF, 0xEE, 0xDD, 0xCC, 0xBB, 0xAA, 0x99,
];

fn is_invalid_parameter(e: &Smb2Error) -> bool {
    e.status() == STATUS_INVALID_PARAMETER
        && e.server_action() == ServerAction::FailRequest(STATUS_INVALID_PARAMETER)
}

// ---------------------------------------------------------------------------
// 2.2.1 header
// ---------------------------------------------------------------------------

/// A SYNC NEGOTIATE request header as Windows sends it: CreditRequest 31,
/// Reserved 0xFEFF.
const NEGOTIATE_HEADER: [u8; 64] = [
    0xFE, b'S', b'M', b'B', // ProtocolId
    0x40, 0x00, // StructureSize 64
    0x00, 0x00, // CreditCharge
    0x00, 0x00, 0x00, 0x00, // ChannelSequence / Reserved
    0x00, 0x00, // Command NEGOTIATE
    0x1F, 0x00, // CreditRequest 31
    0x00, 0x00, 0x00, 0x00, // Flags
    0x00, 0x00, 0x00, 0x00, // NextCommand
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // MessageId
    0xFF, 0xFE, 0x00, 0x00, // Reserved (ProcessId)
    0x00, 0x00, 0x00, 0x00, // TreeId
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // SessionId
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // Signature
];

#[test]
fn header_sync_fields_sit_at_2_2_1_2_offsets() {
    let h = HeaderRepr::from_bytes(&NEGOTIATE_HEADER).unwrap();
    assert_eq!(h.command, Command::Negotiate);
    assert_eq!(h.credit, 31);
    assert_eq!(
        h.id,
        HeaderId::Sync {
            process_id: 0xFEFF,
            tree_id: 0
        }
    );
    let mut out = [0xEEu8; 64];
    assert_eq!(h.emit(&mut out), Ok(64));
    assert_eq!(out, NEGOTIATE_HEADER);
}

#[test]
fn header_async_form_carries_async_id_at_32() {
    let h = HeaderRepr {
        credit_charge: 4,
        status: STATUS_PENDING,
        command: Command::Read,
        credit: 9,
        flags: HeaderFlags::SERVER_TO_REDIR,
        next_command: 0,
        message_id: 0x0102_0304_0506_0708,
        id: HeaderId::Async {
            async_id: 0xA1A2_A3A4_A5A6_A7A8,
        },
        session_id: 0x1111_2222_3333_4444,
        signature: [0x5A; 16],
    };
    let mut b = [0u8; 64];
    h.emit(&mut b).unwrap();
    assert_eq!(&b[8..12], &[0x03, 0x01, 0x00, 0x00]); // STATUS_PENDING
    assert_eq!(le16(&b, 12), 0x0008);
    assert_eq!(le32(&b, 16), 0x0000_0003); // SERVER_TO_REDIR | ASYNC_COMMAND
    assert_eq!(&b[24..32], &0x0102_0304_0506_0708u64.to_le_bytes());
    assert_eq!(&b[32..40], &0xA1A2_A3A4_A5A6_A7A8u64.to_le_bytes());
    assert_eq!(&b[40..48], &0x1111_2222_3333_4444u64.to_le_bytes());
    assert_eq!(&b[48..64], &[0x5A; 16]);
    let back = HeaderRepr::from_bytes(&b).unwrap();
    assert_eq!(back.async_id(), Some(0xA1A2_A3A4_A5A6_A7A8));
    assert_eq!(back.tree_id(), None);
    assert!(back.flags.contains(HeaderFlags::ASYNC_COMMAND));
    assert_eq!(back.status, STATUS_PENDING);
}

#[test]
fn header_channel_sequence_is_low_half_of_status() {
    let mut b = NEGOTIATE_HEADER;
    b[8] = 0x34;
    b[9] = 0x12;
    let h = Header::new_checked(&b[..]).unwrap();
    assert_eq!(h.channel_sequence(), 0x1234);
    assert_eq!(HeaderRepr::parse(&h).unwrap().channel_sequence(), 0x1234);
}

#[test]
fn header_rejections_map_to_disconnect() {
    let e = HeaderRepr::from_bytes(&NEGOTIATE_HEADER[..63]).unwrap_err();
    assert_eq!(e, Smb2Error::ShortMessage { have: 63 });
    assert_eq!(e.server_action(), ServerAction::Disconnect);

    let mut b = NEGOTIATE_HEADER;
    b[0] = 0xFD;
    let e = HeaderRepr::from_bytes(&b).unwrap_err();
    assert_eq!(
        e,
        Smb2Error::ProtocolId {
            found: TRANSFORM_PROTOCOL_ID
        }
    );
    assert_eq!(e.server_action(), ServerAction::Disconnect);

    let mut b = NEGOTIATE_HEADER;
    b[4] = 65;
    let e = HeaderRepr::from_bytes(&b).unwrap_err();
    assert!(matches!(
        e,
        Smb2Error::StructureSize {
            expected: 64,
            found: 65,
            ..
        }
    ));
    assert_eq!(e.server_action(), ServerAction::Disconnect);

    let mut b = NEGOTIATE_HEADER;
    b[12] = 0x14;
    let e = HeaderRepr::from_bytes(&b).unwrap_err();
    assert_eq!(e, Smb2Error::UnknownCommand { command: 0x14 });
    assert_eq!(e.server_action(), ServerAction::Disconnect);
    assert_eq!(e.status(), STATUS_NOT_SUPPORTED);
}

#[test]
fn command_codes_follow_2_2_1() {
    for (i, c) in Command::ALL.iter().enumerate() {
        assert_eq!(c.to_wire(), i as u16);
        assert_eq!(Command::from_wire(i as u16), Some(*c));
    }
    assert_eq!(Command::Ioctl.to_wire(), 0x000B);
    assert_eq!(Command::Echo.to_wire(), 0x000D);
    assert_eq!(Command::from_wire(0x0014), None);
}

#[test]
fn response_header_mirrors_request() {
    let mut req = HeaderRepr::request(Command::Create, 77);
    req.flags = HeaderFlags::RELATED_OPERATIONS | HeaderFlags::SIGNED;
    req.session_id = 5;
    req.id = HeaderId::Sync {
        process_id: 0xFEFF,
        tree_id: 3,
    };
    let rsp = req.response_to(STATUS_SUCCESS);
    assert_eq!(rsp.message_id, 77);
    assert_eq!(rsp.session_id, 5);
    assert_eq!(rsp.tree_id(), Some(3));
    assert!(rsp.is_response());
    assert!(rsp.is_related());
    assert!(!rsp.flags.contains(HeaderFlags::SIGNED));
}

#[test]
fn credit_charge_follows_3_1_5_2() {
    assert_eq!(HeaderRepr::credit_charge_for(0), 1);
    assert_eq!(HeaderRepr::credit_charge_for(65536), 1);
    assert_eq!(HeaderRepr::credit_charge_for(65537), 2);
    assert_eq!(HeaderRepr::credit_charge_for(1 << 20), 16);
}

// ---------------------------------------------------------------------------
// 2.2.3 NEGOTIATE request with negotiate contexts (pinned)
// ---------------------------------------------------------------------------

const SALT: [u8; 32] = [
    0xA0, 0xA1, 0xA2, 0xA3, 0xA4, 0xA5, 0xA6, 0xA7, 0xA8, 0xA9, 0xAA, 0xAB, 0xAC, 0xAD, 0xAE, 0xAF,
    0xB0, 0xB1, 0xB2, 0xB3, 0xB4, 0xB5, 0xB6, 0xB7, 0xB8, 0xB9, 0xBA, 0xBB, 0xBC, 0xBD, 0xBE, 0xBF,
];

/// Body of a NEGOTIATE request offering 3.0, 3.0.2 and 3.1.1 with four
/// contexts, written field by field from [MS-SMB2] 2.2.3 and 2.2.3.1.x.
fn negotiate_request_body() -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&[0x24, 0x00]); // StructureSize 36
    b.extend_from_slice(&[0x03, 0x00]); // DialectCount 3
    b.extend_from_slice(&[0x01, 0x00]); // SecurityMode SIGNING_ENABLED
    b.extend_from_slice(&[0x00, 0x00]); // Reserved
    b.extend_from_slice(&[0x7F, 0x00, 0x00, 0x00]); // Capabilities
    b.extend_from_slice(guid(1).as_bytes()); // ClientGuid (12..28)
    b.extend_from_slice(&[0x70, 0x00, 0x00, 0x00]); // NegotiateContextOffset 112
    b.extend_from_slice(&[0x04, 0x00]); // NegotiateContextCount 4
    b.extend_from_slice(&[0x00, 0x00]); // Reserved2
    b.extend_from_slice(&[0x00, 0x03, 0x02, 0x03, 0x11, 0x03]); // Dialects (36..42)
    b.extend_from_slice(&[0; 6]); // padding to body 48 = header 112
                                  // PREAUTH_INTEGRITY_CAPABILITIES (body 48)
    b.extend_from_slice(&[0x01, 0x00, 0x26, 0x00, 0, 0, 0, 0]);
    b.extend_from_slice(&[0x01, 0x00, 0x20, 0x00, 0x01, 0x00]);
    b.extend_from_slice(&SALT);
    b.extend_from_slice(&[0; 2]); // 94 -> 96
                                  // ENCRYPTION_CAPABILITIES (body 96)
    b.extend_from_slice(&[0x02, 0x00, 0x06, 0x00, 0, 0, 0, 0]);
    b.extend_from_slice(&[0x02, 0x00, 0x02, 0x00, 0x01, 0x00]);
    b.extend_from_slice(&[0; 2]); // 110 -> 112
                                  // SIGNING_CAPABILITIES (body 112)
    b.extend_from_slice(&[0x08, 0x00, 0x06, 0x00, 0, 0, 0, 0]);
    b.extend_from_slice(&[0x02, 0x00, 0x02, 0x00, 0x01, 0x00]);
    b.extend_from_slice(&[0; 2]); // 126 -> 128
                                  // RDMA_TRANSFORM_CAPABILITIES (body 128)
    b.extend_from_slice(&[0x07, 0x00, 0x0A, 0x00, 0, 0, 0, 0]);
    b.extend_from_slice(&[0x01, 0x00, 0x00, 0x00, 0, 0, 0, 0, 0x01, 0x00]);
    assert_eq!(b.len(), 146);
    b
}

const DIALECTS: [u16; 3] = [0x0300, 0x0302, 0x0311];
const CIPHERS: [u16; 2] = [0x0002, 0x0001];
const SIGNING: [u16; 2] = [0x0002, 0x0001];
const HASHES: [u16; 1] = [0x0001];
const TRANSFORMS: [u16; 1] = [0x0001];

fn negotiate_contexts() -> [NegotiateContext<'static>; 4] {
    [
        NegotiateContext::PreauthIntegrity(PreauthIntegrityCapabilities {
            hash_algorithms: U16Array::new(&HASHES),
            salt: &SALT,
        }),
        NegotiateContext::Encryption(EncryptionCapabilities {
            ciphers: U16Array::new(&CIPHERS),
        }),
        NegotiateContext::Signing(SigningCapabilities {
            signing_algorithms: U16Array::new(&SIGNING),
        }),
        NegotiateContext::RdmaTransform(RdmaTransformCapabilities {
            transform_ids: U16Array::new(&TRANSFORMS),
        }),
    ]
}

#[test]
fn negotiate_request_with_contexts_matches_hand_written_bytes() {
    let ctx = negotiate_contexts();
    let repr = NegotiateRequestRepr {
        security_mode: SecurityMode::SIGNING_ENABLED,
        capabilities: Capabilities::from_bits(0x7F),
        client_guid: guid(1),
        dialects: U16Array::new(&DIALECTS),
        negotiate_contexts: NegotiateContextList::new(&ctx),
    };
    let expected = negotiate_request_body();
    assert_eq!(emit(&repr), expected);

    let v = NegotiateRequest::new_checked(&expected[..]).unwrap();
    assert_eq!(v.dialect_count(), 3);
    assert_eq!(v.negotiate_context_offset(), 112);
    assert!(v.offers_3_1_1());
    let parsed = NegotiateRequestRepr::parse(&v).unwrap();
    assert_eq!(parsed, repr);
    let list = parsed.negotiate_contexts;
    assert_eq!(list.len(), 4);
    assert_eq!(
        list.count_of(NegotiateContextType::PREAUTH_INTEGRITY_CAPABILITIES),
        1
    );
    match list.find(NegotiateContextType::ENCRYPTION_CAPABILITIES) {
        Some(NegotiateContext::Encryption(e)) => {
            assert_eq!(e.ciphers.get(0), Some(Cipher::AES_128_GCM.0))
        }
        other => panic!("{other:?}"),
    }

    // The whole message decodes through the header.
    let mut msg = NEGOTIATE_HEADER.to_vec();
    msg.extend_from_slice(&expected);
    let m = compound(&msg).next().unwrap().unwrap();
    assert_eq!(m.request_body().unwrap(), RequestBody::Negotiate(repr));
}

#[test]
fn negotiate_request_without_3_1_1_ignores_context_fields() {
    // Bytes 28..36 are ClientStartTime when 0x0311 is not offered: garbage
    // there is not a context list.
    let repr = NegotiateRequestRepr {
        security_mode: SecurityMode::SIGNING_REQUIRED,
        capabilities: Capabilities::LARGE_MTU,
        client_guid: guid(9),
        dialects: U16Array::new(&[0x0300, 0x0302]),
        negotiate_contexts: NegotiateContextList::EMPTY,
    };
    let mut b = round_trip!(NegotiateRequestRepr, repr);
    assert_eq!(b.len(), 40);
    b[28..36].copy_from_slice(&[0xFF; 8]);
    assert_eq!(NegotiateRequestRepr::from_body(&b).unwrap(), repr);
}

#[test]
fn negotiate_request_rejects_malformed_dialects_and_contexts() {
    let good = negotiate_request_body();

    let mut b = good.clone();
    put16(&mut b, 2, 0);
    let e = NegotiateRequestRepr::from_body(&b).unwrap_err();
    assert!(matches!(e, Smb2Error::Malformed { .. }) && is_invalid_parameter(&e));

    let mut b = good.clone();
    put16(&mut b, 2, 60); // 120 bytes of dialects: past the body
    assert!(matches!(
        NegotiateRequestRepr::from_body(&b),
        Err(Smb2Error::Truncated { .. })
    ));

    let mut b = good.clone();
    put32(&mut b, 28, 116); // not 8-byte aligned
    assert!(matches!(
        NegotiateRequestRepr::from_body(&b),
        Err(Smb2Error::Misaligned {
            field: "NegotiateContextOffset",
            ..
        })
    ));

    let mut b = good.clone();
    put32(&mut b, 28, 96); // inside the dialects
    assert!(matches!(
        NegotiateRequestRepr::from_body(&b),
        Err(Smb2Error::OutOfBounds {
            field: "NegotiateContextOffset",
            ..
        })
    ));

    let mut b = good.clone();
    put32(&mut b, 28, 0xFFFF_FFF8);
    assert!(matches!(
        NegotiateRequestRepr::from_body(&b),
        Err(Smb2Error::OutOfBounds { .. })
    ));

    let mut b = good.clone();
    put16(&mut b, 32, 5); // one context more than present
    assert!(matches!(
        NegotiateRequestRepr::from_body(&b),
        Err(Smb2Error::Truncated { .. })
    ));

    let mut b = good.clone();
    put16(&mut b, 104, 0); // CipherCount 0
    let e = NegotiateRequestRepr::from_body(&b).unwrap_err();
    assert!(matches!(
        e,
        Smb2Error::Malformed {
            what: "SMB2_ENCRYPTION_CAPABILITIES",
            ..
        }
    ));

    let mut b = good.clone();
    put16(&mut b, 50, 0x0100); // PREAUTH DataLength past the body
    assert!(NegotiateRequestRepr::from_body(&b).is_err());

    let mut b = good;
    put16(&mut b, 58, 0x0040); // SaltLength 64 > DataLength
    assert!(matches!(
        NegotiateRequestRepr::from_body(&b),
        Err(Smb2Error::Truncated {
            what: "SMB2_PREAUTH_INTEGRITY_CAPABILITIES",
            ..
        })
    ));
}

#[test]
fn negotiate_request_emit_refuses_what_parse_would_refuse() {
    let ctx = negotiate_contexts();
    let mut repr = NegotiateRequestRepr {
        security_mode: SecurityMode::empty(),
        capabilities: Capabilities::empty(),
        client_guid: Guid::NULL,
        dialects: U16Array::new(&[0x0302]),
        negotiate_contexts: NegotiateContextList::new(&ctx),
    };
    let mut buf = [0u8; 512];
    assert!(matches!(
        repr.emit(&mut buf),
        Err(Smb2Error::Malformed { .. })
    ));
    repr.dialects = U16Array::EMPTY;
    repr.negotiate_contexts = NegotiateContextList::EMPTY;
    assert!(matches!(
        repr.emit(&mut buf),
        Err(Smb2Error::Malformed { .. })
    ));
    let bad = [NegotiateContext::Encryption(EncryptionCapabilities {
        ciphers: U16Array::EMPTY,
    })];
    repr.dialects = U16Array::new(&[0x0311]);
    repr.negotiate_contexts = NegotiateContextList::new(&bad);
    assert!(matches!(
        repr.emit(&mut buf),
        Err(Smb2Error::Malformed { .. })
    ));
}

#[test]
fn negotiate_context_of_unknown_type_is_kept_opaque() {
    let ctx = [
        NegotiateContext::Other {
            context_type: 0x0005,
            data: &[0x41, 0x00, 0x42, 0x00],
        },
        NegotiateContext::Other {
            context_type: 0x0100,
            data: &[1, 2, 3],
        },
    ];
    let repr = NegotiateRequestRepr {
        security_mode: SecurityMode::empty(),
        capabilities: Capabilities::empty(),
        client_guid: guid(3),
        dialects: U16Array::new(&[0x0311]),
        negotiate_contexts: NegotiateContextList::new(&ctx),
    };
    let b = round_trip!(NegotiateRequestRepr, repr);
    // 36 + 2 = 38 -> contexts at 40; first is 8 + 4 = 12 -> second at 56.
    assert_eq!(le32(&b, 28), 64 + 40);
    assert_eq!(le16(&b, 56), 0x0100);
}

// ---------------------------------------------------------------------------
// 2.2.4 NEGOTIATE response
// ---------------------------------------------------------------------------

fn negotiate_response<'a>(
    sec: &'a [u8],
    ctx: &'a [NegotiateContext<'a>],
    dialect: u16,
) -> NegotiateResponseRepr<'a> {
    NegotiateResponseRepr {
        security_mode: SecurityMode::SIGNING_ENABLED,
        dialect_revision: dialect,
        server_guid: guid(0x40),
        capabilities: Capabilities::LARGE_MTU | Capabilities::MULTI_CHANNEL,
        max_transact_size: 8 << 20,
        max_read_size: 8 << 20,
        max_write_size: 8 << 20,
        system_time: 0x01D9_0000_0000_0000,
        server_start_time: 0,
        security_buffer: sec,
        negotiate_contexts: NegotiateContextList::new(ctx),
    }
}

#[test]
fn negotiate_response_places_security_buffer_then_aligned_contexts() {
    let sec = [0x60u8; 74];
    let ctx = [
        NegotiateContext::PreauthIntegrity(PreauthIntegrityCapabilities {
            hash_algorithms: U16Array::new(&HASHES),
            salt: &SALT,
        }),
        NegotiateContext::Encryption(EncryptionCapabilities {
            ciphers: U16Array::new(&[0x0002]),
        }),
    ];
    let repr = negotiate_response(&sec, &ctx, 0x0311);
    let b = round_trip!(NegotiateResponseRepr, repr);
    assert_eq!(le16(&b, 0), 65);
    assert_eq!(le16(&b, 4), 0x0311);
    assert_eq!(le16(&b, 6), 2); // NegotiateContextCount
    assert_eq!(le32(&b, 28), 8 << 20); // MaxTransactSize
    assert_eq!(le16(&b, 56), 128); // SecurityBufferOffset
    assert_eq!(le16(&b, 58), 74);
    assert_eq!(le32(&b, 60), 64 + 144); // 64 + 74 = 138 -> 144
    assert_eq!(&b[64..138], &sec[..]);
    assert_eq!(&b[138..144], &[0; 6]);

    // Security buffer overlapping the contexts.
    let mut bad = b.clone();
    put16(&mut bad, 58, 90);
    assert!(matches!(
        NegotiateResponseRepr::from_body(&bad),
        Err(Smb2Error::Overlap { .. })
    ));
    // Security buffer reaching into the fixed part.
    let mut bad = b;
    put16(&mut bad, 56, 100);
    assert!(matches!(
        NegotiateResponseRepr::from_body(&bad),
        Err(Smb2Error::OutOfBounds {
            field: "SecurityBufferOffset",
            ..
        })
    ));
}

#[test]
fn negotiate_response_without_3_1_1_has_no_contexts_and_pads_to_65() {
    let repr = negotiate_response(&[], &[], 0x0302);
    let b = round_trip!(NegotiateResponseRepr, repr);
    assert_eq!(b.len(), 65);
    let ctx = negotiate_contexts();
    let mut buf = [0u8; 512];
    assert!(matches!(
        negotiate_response(&[], &ctx, 0x0302).emit(&mut buf),
        Err(Smb2Error::Malformed { .. })
    ));
}

// ---------------------------------------------------------------------------
// 2.2.5 - 2.2.12: session, tree
// ---------------------------------------------------------------------------

#[test]
fn session_setup_request_round_trips_with_buffer_at_88() {
    let token = [0x4E, 0x54, 0x4C, 0x4D, 0x53, 0x53, 0x50, 0x00, 1, 2, 3];
    let repr = SessionSetupRequestRepr {
        flags: SessionSetupFlags::BINDING,
        security_mode: SecurityMode::SIGNING_REQUIRED,
        capabilities: Capabilities::DFS,
        channel: 0,
        previous_session_id: 0x0102_0304_0506_0708,
        security_buffer: &token,
    };
    let b = round_trip!(SessionSetupRequestRepr, repr);
    assert_eq!(b[2], 0x01);
    assert_eq!(b[3], 0x02);
    assert_eq!(le16(&b, 12), 88);
    assert_eq!(le16(&b, 14), 11);
    assert_eq!(&b[24..], &token);
}

#[test]
fn session_setup_response_round_trips_and_is_not_an_error_with_more_processing() {
    let token = [7u8; 20];
    let repr = SessionSetupResponseRepr {
        session_flags: SessionFlags::IS_GUEST,
        security_buffer: &token,
    };
    let b = round_trip!(SessionSetupResponseRepr, repr);
    assert_eq!(le16(&b, 4), 72);
    let mut h =
        HeaderRepr::request(Command::SessionSetup, 1).response_to(STATUS_MORE_PROCESSING_REQUIRED);
    assert_eq!(
        ResponseBody::parse(&h, &b).unwrap(),
        ResponseBody::SessionSetup(repr)
    );
    h.status = smbdirect_protocol::ntstatus::STATUS_LOGON_FAILURE;
    let err = emit(&ErrorResponseRepr::EMPTY);
    assert_eq!(
        ResponseBody::parse(&h, &err).unwrap(),
        ResponseBody::Error(ErrorResponseRepr::EMPTY)
    );
}

#[test]
fn empty_bodies_round_trip_as_structure_size_4() {
    let expect = [0x04, 0x00, 0x00, 0x00];
    assert_eq!(round_trip!(LogoffRequestRepr, LogoffRequestRepr), expect);
    assert_eq!(round_trip!(LogoffResponseRepr, LogoffResponseRepr), expect);
    assert_eq!(
        round_trip!(TreeDisconnectRequestRepr, TreeDisconnectRequestRepr),
        expect
    );
    assert_eq!(
        round_trip!(TreeDisconnectResponseRepr, TreeDisconnectResponseRepr),
        expect
    );
    assert_eq!(round_trip!(EchoRequestRepr, EchoRequestRepr), expect);
    assert_eq!(round_trip!(EchoResponseRepr, EchoResponseRepr), expect);
    assert_eq!(round_trip!(CancelRequestRepr, CancelRequestRepr), expect);
    assert_eq!(round_trip!(FlushResponseRepr, FlushResponseRepr), expect);
    // Reserved is ignored on receipt.
    assert!(EchoRequestRepr::from_body(&[0x04, 0x00, 0xAB, 0xCD]).is_ok());
}

#[test]
fn tree_connect_request_carries_utf16_path_at_72() {
    let path = utf16(r"\\server\share");
    let repr = TreeConnectRequestRepr {
        flags: TreeConnectFlags::empty(),
        path: Utf16Str::new(r"\\server\share"),
    };
    let b = round_trip!(TreeConnectRequestRepr, repr);
    assert_eq!(le16(&b, 4), 72);
    assert_eq!(le16(&b, 6) as usize, path.len());
    assert_eq!(&b[8..], &path[..]);
    let v = TreeConnectRequest::new_checked(&b[..]).unwrap();
    assert_eq!(v.path().decode().unwrap(), r"\\server\share");
    assert_eq!(
        TreeConnectRequestRepr::from_body(&b).unwrap().path,
        Utf16Str::from_utf16le(&path)
    );
}

#[test]
fn tree_connect_response_round_trips() {
    let repr = TreeConnectResponseRepr {
        share_type: ShareType::DISK,
        share_flags: ShareFlags::from_bits(0x0000_0800) | ShareFlags::ENCRYPT_DATA,
        capabilities: ShareCapabilities::CONTINUOUS_AVAILABILITY,
        maximal_access: AccessMask::from_bits(0x001F_01FF),
    };
    let b = round_trip!(TreeConnectResponseRepr, repr);
    assert_eq!(
        b,
        [
            0x10, 0x00, 0x01, 0x00, 0x00, 0x88, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0xFF, 0x01,
            0x1F, 0x00
        ]
    );
}

// ---------------------------------------------------------------------------
// 2.2.13 CREATE request (pinned), 2.2.14 response
// ---------------------------------------------------------------------------

/// A CREATE request for `a\b.txt` with two create contexts (AlSi with 8
/// bytes of data, MxAc without), written from 2.2.13 and 2.2.13.2.
fn create_request_body() -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&[0x39, 0x00]); // StructureSize 57
    b.push(0x00); // SecurityFlags
    b.push(0x09); // RequestedOplockLevel BATCH
    b.extend_from_slice(&[0x02, 0x00, 0x00, 0x00]); // Impersonation
    b.extend_from_slice(&[0; 8]); // SmbCreateFlags
    b.extend_from_slice(&[0; 8]); // Reserved
    b.extend_from_slice(&[0x9F, 0x01, 0x12, 0x00]); // DesiredAccess 0x0012019F
    b.extend_from_slice(&[0x80, 0x00, 0x00, 0x00]); // FileAttributes NORMAL
    b.extend_from_slice(&[0x07, 0x00, 0x00, 0x00]); // ShareAccess R|W|D
    b.extend_from_slice(&[0x03, 0x00, 0x00, 0x00]); // CreateDisposition OPEN_IF
    b.extend_from_slice(&[0x40, 0x00, 0x00, 0x00]); // CreateOptions NON_DIRECTORY_FILE
    b.extend_from_slice(&[0x78, 0x00]); // NameOffset 120
    b.extend_from_slice(&[0x0E, 0x00]); // NameLength 14
    b.extend_from_slice(&[0x88, 0x00, 0x00, 0x00]); // CreateContextsOffset 136
    b.extend_from_slice(&[0x34, 0x00, 0x00, 0x00]); // CreateContextsLength 52
    b.extend_from_slice(&[
        0x61, 0, 0x5C, 0, 0x62, 0, 0x2E, 0, 0x74, 0, 0x78, 0, 0x74, 0,
    ]); // a\b.txt
    b.extend_from_slice(&[0; 2]); // 70 -> 72
                                  // AlSi (body 72)
    b.extend_from_slice(&[0x20, 0x00, 0x00, 0x00]); // Next 32
    b.extend_from_slice(&[0x10, 0x00, 0x04, 0x00]); // NameOffset 16, NameLength 4
    b.extend_from_slice(&[0x00, 0x00, 0x18, 0x00]); // Reserved, DataOffset 24
    b.extend_from_slice(&[0x08, 0x00, 0x00, 0x00]); // DataLength 8
    b.extend_from_slice(b"AlSi");
    b.extend_from_slice(&[0; 4]);
    b.extend_from_slice(&[0x00, 0x00, 0x10, 0x00, 0, 0, 0, 0]); // 1 MiB
                                                                // MxAc (body 104)
    b.extend_from_slice(&[0x00, 0x00, 0x00, 0x00]); // Next 0
    b.extend_from_slice(&[0x10, 0x00, 0x04, 0x00]);
    b.extend_from_slice(&[0x00, 0x00, 0x00, 0x00]); // DataOffset 0
    b.extend_from_slice(&[0x00, 0x00, 0x00, 0x00]); // DataLength 0
    b.extend_from_slice(b"MxAc");
    assert_eq!(b.len(), 124);
    b
}

const ALLOC: [u8; 8] = [0x00, 0x00, 0x10, 0x00, 0, 0, 0, 0];

fn create_contexts() -> [CreateContext<'static>; 2] {
    [
        CreateContext::new(SMB2_CREATE_ALLOCATION_SIZE, &ALLOC),
        CreateContext::new(SMB2_CREATE_QUERY_MAXIMAL_ACCESS_REQUEST, &[]),
    ]
}

fn create_request<'a>(ctx: &'a [CreateContext<'a>]) -> CreateRequestRepr<'a> {
    CreateRequestRepr {
        security_flags: 0,
        requested_oplock_level: OplockLevel::BATCH,
        impersonation_level: ImpersonationLevel::IMPERSONATION,
        smb_create_flags: 0,
        desired_access: AccessMask::from_bits(0x0012_019F),
        file_attributes: FileAttributes::NORMAL,
        share_access: ShareAccess::READ | ShareAccess::WRITE | ShareAccess::DELETE,
        create_disposition: CreateDisposition::OPEN_IF,
        create_options: CreateOptions::NON_DIRECTORY_FILE,
        name: Utf16Str::new(r"a\b.txt"),
        create_contexts: CreateContextList::new(ctx),
    }
}

#[test]
fn create_request_matches_hand_written_bytes() {
    let ctx = create_contexts();
    let repr = create_request(&ctx);
    let expected = create_request_body();
    assert_eq!(emit(&repr), expected);
    let v = CreateRequest::new_checked(&expected[..]).unwrap();
    assert_eq!(v.name().decode().unwrap(), r"a\b.txt");
    assert_eq!(v.create_disposition(), CreateDisposition::OPEN_IF);
    let contexts = v.create_contexts();
    assert_eq!(contexts.len(), 2);
    assert_eq!(contexts.find(b"AlSi").unwrap().data, &ALLOC);
    assert!(contexts.find(b"MxAc").unwrap().data.is_empty());
    assert_eq!(CreateRequestRepr::parse(&v).unwrap(), repr);
}

#[test]
fn create_request_rejects_bad_name_and_context_placement() {
    let good = create_request_body();

    let mut b = good.clone();
    put16(&mut b, 44, 100); // name starts inside the fixed part
    assert!(matches!(
        CreateRequestRepr::from_body(&b),
        Err(Smb2Error::OutOfBounds {
            field: "NameOffset",
            ..
        })
    ));

    let mut b = good.clone();
    put16(&mut b, 46, 0xFFFF); // name past the body
    let e = CreateRequestRepr::from_body(&b).unwrap_err();
    assert!(matches!(
        e,
        Smb2Error::OutOfBounds {
            field: "NameOffset",
            ..
        }
    ));
    assert!(is_invalid_parameter(&e));

    let mut b = good.clone();
    put16(&mut b, 46, 20); // name runs into the contexts
    assert!(matches!(
        CreateRequestRepr::from_body(&b),
        Err(Smb2Error::Overlap { .. })
    ));

    let mut b = good.clone();
    put32(&mut b, 48, 140); // contexts not 8-byte aligned
    put32(&mut b, 52, 48);
    assert!(matches!(
        CreateRequestRepr::from_body(&b),
        Err(Smb2Error::Misaligned {
            field: "CreateContextsOffset",
            ..
        })
    ));

    let mut b = good.clone();
    put32(&mut b, 52, 0xFFFF_FFFF); // length overflows
    assert!(matches!(
        CreateRequestRepr::from_body(&b),
        Err(Smb2Error::OutOfBounds { .. })
    ));

    let mut b = good.clone();
    put32(&mut b, 72, 12); // Next not a multiple of 8
    assert!(matches!(
        CreateRequestRepr::from_body(&b),
        Err(Smb2Error::Misaligned {
            what: "SMB2_CREATE_CONTEXT",
            field: "Next",
            ..
        })
    ));

    let mut b = good.clone();
    put32(&mut b, 72, 64); // Next past the list
    assert!(matches!(
        CreateRequestRepr::from_body(&b),
        Err(Smb2Error::OutOfBounds { field: "Next", .. })
    ));

    let mut b = good.clone();
    put16(&mut b, 72 + 10, 20); // DataOffset misaligned
    assert!(matches!(
        CreateRequestRepr::from_body(&b),
        Err(Smb2Error::Misaligned {
            field: "DataOffset",
            ..
        })
    ));

    let mut b = good.clone();
    put16(&mut b, 72 + 10, 16); // Data over the Name
    assert!(matches!(
        CreateRequestRepr::from_body(&b),
        Err(Smb2Error::Overlap { .. })
    ));

    let mut b = good.clone();
    put32(&mut b, 72 + 12, 16); // Data past Next
    assert!(matches!(
        CreateRequestRepr::from_body(&b),
        Err(Smb2Error::OutOfBounds {
            field: "DataOffset",
            ..
        })
    ));

    let mut b = good.clone();
    put16(&mut b, 104 + 6, 0); // unnamed context
    assert!(matches!(
        CreateRequestRepr::from_body(&b),
        Err(Smb2Error::Malformed {
            field: "NameLength (0)",
            ..
        })
    ));

    let mut b = good;
    put32(&mut b, 52, 40); // the list ends inside the second context
    assert!(matches!(
        CreateRequestRepr::from_body(&b),
        Err(Smb2Error::Truncated { .. })
    ));
}

#[test]
fn create_request_without_name_or_contexts_is_57_bytes() {
    let mut repr = create_request(&[]);
    repr.name = Utf16Str::EMPTY;
    let b = round_trip!(CreateRequestRepr, repr);
    assert_eq!(b.len(), 57);
    assert_eq!(le16(&b, 44), 120);
    assert_eq!(le32(&b, 48), 0);
    assert_eq!(le32(&b, 52), 0);
}

#[test]
fn create_response_round_trips_with_contexts_at_152() {
    let mxac = [0u8, 0, 0, 0, 0xFF, 0x01, 0x1F, 0x00];
    let qfid = [0x11u8; 32];
    let ctx = [
        CreateContext::new(SMB2_CREATE_QUERY_MAXIMAL_ACCESS_REQUEST, &mxac),
        CreateContext::new(SMB2_CREATE_QUERY_ON_DISK_ID, &qfid),
    ];
    let repr = CreateResponseRepr {
        oplock_level: OplockLevel::NONE,
        flags: CreateResponseFlags::empty(),
        create_action: CreateAction::CREATED,
        creation_time: 1,
        last_access_time: 2,
        last_write_time: 3,
        change_time: 4,
        allocation_size: 4096,
        end_of_file: 17,
        file_attributes: FileAttributes::ARCHIVE,
        file_id: FILE_ID,
        create_contexts: CreateContextList::new(&ctx),
    };
    let b = round_trip!(CreateResponseRepr, repr);
    assert_eq!(&b[64..80], &FILE_ID_BYTES);
    assert_eq!(le32(&b, 80), 152);
    assert_eq!(le32(&b, 84), 32 + 24 + 32);
    let no_ctx = CreateResponseRepr {
        create_contexts: CreateContextList::EMPTY,
        ..repr
    };
    let b = round_trip!(CreateResponseRepr, no_ctx);
    assert_eq!(b.len(), 89);
    assert_eq!(le32(&b, 80), 0);
}

// ---------------------------------------------------------------------------
// 2.2.15 - 2.2.18 CLOSE, FLUSH
// ---------------------------------------------------------------------------

#[test]
fn close_and_flush_round_trip_with_file_id_at_8() {
    let b = round_trip!(
        CloseRequestRepr,
        CloseRequestRepr {
            flags: CloseFlags::POSTQUERY_ATTRIB,
            file_id: FILE_ID,
        }
    );
    assert_eq!(&b[..8], &[0x18, 0, 0x01, 0, 0, 0, 0, 0]);
    assert_eq!(&b[8..24], &FILE_ID_BYTES);

    let b = round_trip!(FlushRequestRepr, FlushRequestRepr { file_id: FILE_ID });
    assert_eq!(&b[..8], &[0x18, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(&b[8..24], &FILE_ID_BYTES);

    let b = round_trip!(
        CloseResponseRepr,
        CloseResponseRepr {
            flags: CloseFlags::POSTQUERY_ATTRIB,
            creation_time: 10,
            last_access_time: 11,
            last_write_time: 12,
            change_time: 13,
            allocation_size: 14,
            end_of_file: 15,
            file_attributes: FileAttributes::DIRECTORY,
        }
    );
    assert_eq!(b.len(), 60);
    assert_eq!(le32(&b, 56), 0x10);
}

// ---------------------------------------------------------------------------
// 2.2.19 READ request with an RDMA_V1 channel (pinned), 2.2.20 response
// ---------------------------------------------------------------------------

fn read_request_rdma_body() -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&[0x31, 0x00]); // StructureSize 49
    b.push(0x50); // Padding
    b.push(0x00); // Flags
    b.extend_from_slice(&[0x00, 0x00, 0x10, 0x00]); // Length 1 MiB
    b.extend_from_slice(&[0, 0, 0, 0, 0x02, 0, 0, 0]); // Offset 8 GiB
    b.extend_from_slice(&FILE_ID_BYTES);
    b.extend_from_slice(&[0; 4]); // MinimumCount
    b.extend_from_slice(&[0x01, 0x00, 0x00, 0x00]); // Channel RDMA_V1
    b.extend_from_slice(&[0; 4]); // RemainingBytes
    b.extend_from_slice(&[0x70, 0x00]); // ReadChannelInfoOffset 112
    b.extend_from_slice(&[0x20, 0x00]); // ReadChannelInfoLength 32
                                        // SMB_DIRECT_BUFFER_DESCRIPTOR_V1 x2 ([MS-SMBD] 2.2.3.1)
    b.extend_from_slice(&[0x00, 0x10, 0x00, 0x00, 0x00, 0x7F, 0x00, 0x00]);
    b.extend_from_slice(&[0xEF, 0xBE, 0xAD, 0xDE]);
    b.extend_from_slice(&[0x00, 0x00, 0x08, 0x00]);
    b.extend_from_slice(&[0x00, 0x00, 0x20, 0x00, 0x00, 0x7F, 0x00, 0x00]);
    b.extend_from_slice(&[0x04, 0x03, 0x02, 0x01]);
    b.extend_from_slice(&[0x00, 0x00, 0x08, 0x00]);
    assert_eq!(b.len(), 80);
    b
}

const READ_DESCRIPTORS: [BufferDescriptorRepr; 2] = [
    BufferDescriptorRepr {
        offset: 0x0000_7F00_0000_1000,
        token: 0xDEAD_BEEF,
        length: 0x8_0000,
    },
    BufferDescriptorRepr {
        offset: 0x0000_7F00_0020_0000,
        token: 0x0102_0304,
        length: 0x8_0000,
    },
];

fn read_request(channel: Channel, info: ChannelInfo<'_>) -> ReadRequestRepr<'_> {
    ReadRequestRepr {
        padding: 0x50,
        flags: ReadFlags::empty(),
        length: 1 << 20,
        offset: 8 << 30,
        file_id: FILE_ID,
        minimum_count: 0,
        channel,
        remaining_bytes: 0,
        channel_info: info,
    }
}

#[test]
fn read_request_with_rdma_v1_and_two_descriptors_matches_hand_written_bytes() {
    let repr = read_request(Channel::RdmaV1, ChannelInfo::descriptors(&READ_DESCRIPTORS));
    let expected = read_request_rdma_body();
    assert_eq!(emit(&repr), expected);

    let v = ReadRequest::new_checked(&expected[..]).unwrap();
    assert_eq!(v.channel(), Channel::RdmaV1);
    let d = v
        .buffer_descriptors()
        .expect("RDMA channel has descriptors");
    assert_eq!(d.len(), 2);
    assert_eq!(d.get(0), Some(READ_DESCRIPTORS[0]));
    assert_eq!(d.get(1), Some(READ_DESCRIPTORS[1]));
    assert_eq!(d.total_length(), 1 << 20);
    assert_eq!(v.check_channel_rules(Dialect::SMB_3_0, true), Ok(()));

    let parsed = ReadRequestRepr::parse(&v).unwrap();
    assert_eq!(parsed, repr);
    assert_eq!(parsed.channel_info.descriptor_array().unwrap().len(), 2);
    assert_eq!(
        parsed.channel_info.iter_descriptors().collect::<Vec<_>>(),
        READ_DESCRIPTORS
    );
}

#[test]
fn read_request_channel_info_is_checked_strictly_with_rdma_and_ignored_without() {
    let good = read_request_rdma_body();

    for (len, what) in [(0u16, "0"), (24, "24"), (8, "8")] {
        let mut b = good.clone();
        put16(&mut b, 46, len);
        let e = ReadRequestRepr::from_body(&b).unwrap_err();
        assert!(
            matches!(e, Smb2Error::Malformed { .. }) && is_invalid_parameter(&e),
            "length {what}: {e:?}"
        );
    }
    let mut b = good.clone();
    put16(&mut b, 44, 0);
    assert!(matches!(
        ReadRequestRepr::from_body(&b),
        Err(Smb2Error::OutOfBounds {
            field: "ReadChannelInfoOffset",
            ..
        })
    ));
    let mut b = good.clone();
    put16(&mut b, 44, 104); // inside the fixed part
    assert!(matches!(
        ReadRequestRepr::from_body(&b),
        Err(Smb2Error::OutOfBounds { .. })
    ));
    let mut b = good.clone();
    put16(&mut b, 46, 48); // one descriptor past the body
    assert!(matches!(
        ReadRequestRepr::from_body(&b),
        Err(Smb2Error::OutOfBounds { .. })
    ));
    assert!(ReadRequestRepr::from_body(&good[..79]).is_err());

    // SMB2_CHANNEL_NONE: offset and length are ignored ([MS-SMB2] 2.2.19).
    let mut b = good[..49].to_vec();
    put32(&mut b, 36, 0);
    put16(&mut b, 44, 0xFFFF);
    put16(&mut b, 46, 0xFFFF);
    let r = ReadRequestRepr::from_body(&b).unwrap();
    assert!(r.channel_info.is_empty());
    assert!(ReadRequest::new_checked(&b[..])
        .unwrap()
        .buffer_descriptors()
        .is_none());
}

#[test]
fn read_request_channel_rules_depend_on_dialect_and_transport() {
    let inv = read_request(
        Channel::RdmaV1Invalidate,
        ChannelInfo::descriptors(&READ_DESCRIPTORS[..1]),
    );
    let b = round_trip!(ReadRequestRepr, inv);
    let v = ReadRequest::new_checked(&b[..]).unwrap();
    assert!(v.check_channel_rules(Dialect::SMB_3_0, true).is_err());
    assert!(v.check_channel_rules(Dialect::SMB_3_0_2, true).is_ok());
    assert!(v.check_channel_rules(Dialect::SMB_3_1_1, true).is_ok());
    let e = v
        .check_channel_rules(Dialect::SMB_3_1_1, false)
        .unwrap_err();
    assert!(is_invalid_parameter(&e));

    let mut b = b;
    put32(&mut b, 36, 7);
    let v = ReadRequest::new_checked(&b[..]).unwrap();
    assert_eq!(v.channel(), Channel::Unknown(7));
    assert!(v.check_channel_rules(Dialect::SMB_3_1_1, true).is_err());
    assert!(v.check_channel_rules(Dialect::SMB_2_1, true).is_ok());
}

#[test]
fn read_request_without_channel_is_49_bytes() {
    let b = round_trip!(
        ReadRequestRepr,
        read_request(Channel::None, ChannelInfo::EMPTY)
    );
    assert_eq!(b.len(), 49);
    assert_eq!(le16(&b, 44), 0);
    let mut buf = [0u8; 128];
    assert!(
        read_request(Channel::None, ChannelInfo::descriptors(&READ_DESCRIPTORS))
            .emit(&mut buf)
            .is_err()
    );
    assert!(read_request(Channel::RdmaV1, ChannelInfo::EMPTY)
        .emit(&mut buf)
        .is_err());
}

#[test]
fn read_response_places_data_at_80_and_checks_data_offset() {
    let data = [0xC3u8; 100];
    let repr = ReadResponseRepr {
        data: &data,
        data_remaining: 0,
        flags: 0,
    };
    let b = round_trip!(ReadResponseRepr, repr);
    assert_eq!(b[2], 80);
    assert_eq!(le32(&b, 4), 100);
    assert_eq!(&b[16..], &data);

    let rdma = ReadResponseRepr {
        data: &[],
        data_remaining: 1 << 20,
        flags: 0,
    };
    let b2 = round_trip!(ReadResponseRepr, rdma);
    // No Buffer byte after the fixed part: the Linux client reads exactly
    // 64 + 16 bytes of an RDMA read's response (docs/spec-notes.md).
    assert_eq!(b2.len(), 16);
    assert_eq!(le32(&b2, 8), 1 << 20);

    let mut bad = b.clone();
    bad[2] = 72; // inside the fixed part
    assert!(matches!(
        ReadResponseRepr::from_body(&bad),
        Err(Smb2Error::OutOfBounds {
            field: "DataOffset",
            ..
        })
    ));
    let mut bad = b;
    put32(&mut bad, 4, 101);
    assert!(ReadResponseRepr::from_body(&bad).is_err());

    // STATUS_BUFFER_OVERFLOW still carries a READ response (3.3.4.4).
    let h = HeaderRepr::request(Command::Read, 3).response_to(STATUS_BUFFER_OVERFLOW);
    assert_eq!(
        ResponseBody::parse(&h, &b2).unwrap(),
        ResponseBody::Read(rdma)
    );
}

// ---------------------------------------------------------------------------
// 2.2.21 WRITE request with RDMA_V1_INVALIDATE (pinned), 2.2.22 response
// ---------------------------------------------------------------------------

fn write_request_rdma_invalidate_body() -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&[0x31, 0x00]); // StructureSize 49
    b.extend_from_slice(&[0x00, 0x00]); // DataOffset 0
    b.extend_from_slice(&[0; 4]); // Length 0
    b.extend_from_slice(&[0x00, 0x10, 0, 0, 0, 0, 0, 0]); // Offset 4096
    b.extend_from_slice(&FILE_ID_BYTES);
    b.extend_from_slice(&[0x02, 0x00, 0x00, 0x00]); // Channel RDMA_V1_INVALIDATE
    b.extend_from_slice(&[0x00, 0x00, 0x01, 0x00]); // RemainingBytes 64 KiB
    b.extend_from_slice(&[0x70, 0x00]); // WriteChannelInfoOffset 112
    b.extend_from_slice(&[0x10, 0x00]); // WriteChannelInfoLength 16
    b.extend_from_slice(&[0x01, 0x00, 0x00, 0x00]); // Flags WRITE_THROUGH
    b.extend_from_slice(&[0x00, 0x00, 0x30, 0x00, 0x00, 0x7F, 0x00, 0x00]);
    b.extend_from_slice(&[0x0D, 0xF0, 0xFE, 0xCA]);
    b.extend_from_slice(&[0x00, 0x00, 0x01, 0x00]);
    assert_eq!(b.len(), 64);
    b
}

const WRITE_DESCRIPTOR: [BufferDescriptorRepr; 1] = [BufferDescriptorRepr {
    offset: 0x0000_7F00_0030_0000,
    token: 0xCAFE_F00D,
    length: 0x1_0000,
}];

fn write_request<'a>(
    channel: Channel,
    data: &'a [u8],
    info: ChannelInfo<'a>,
) -> WriteRequestRepr<'a> {
    WriteRequestRepr {
        offset: 4096,
        file_id: FILE_ID,
        channel,
        remaining_bytes: if channel.is_rdma() { 0x1_0000 } else { 0 },
        flags: WriteFlags::WRITE_THROUGH,
        data,
        channel_info: info,
    }
}

#[test]
fn write_request_with_rdma_v1_invalidate_matches_hand_written_bytes() {
    let repr = write_request(
        Channel::RdmaV1Invalidate,
        &[],
        ChannelInfo::descriptors(&WRITE_DESCRIPTOR),
    );
    let expected = write_request_rdma_invalidate_body();
    assert_eq!(emit(&repr), expected);
    let v = WriteRequest::new_checked(&expected[..]).unwrap();
    assert_eq!(v.data_offset(), 0);
    assert_eq!(v.length(), 0);
    assert_eq!(v.remaining_bytes(), 0x1_0000);
    let d = v.buffer_descriptors().unwrap();
    assert_eq!(d.iter().collect::<Vec<_>>(), WRITE_DESCRIPTOR);
    assert_eq!(v.check_channel_rules(Dialect::SMB_3_0_2, true), Ok(()));
    assert!(v.check_channel_rules(Dialect::SMB_3_0, true).is_err());
    assert_eq!(WriteRequestRepr::parse(&v).unwrap(), repr);
}

#[test]
fn write_request_rdma_rules_of_3_3_5_13() {
    // Inline data together with an RDMA channel: structurally fine, but
    // Length and DataOffset must be 0.
    let data = [0x55u8; 10];
    let repr = write_request(
        Channel::RdmaV1,
        &data,
        ChannelInfo::descriptors(&WRITE_DESCRIPTOR),
    );
    let b = round_trip!(WriteRequestRepr, repr);
    assert_eq!(le16(&b, 2), 112);
    assert_eq!(le16(&b, 40), 64 + 64); // 48 + 10 = 58 -> 64
    let v = WriteRequest::new_checked(&b[..]).unwrap();
    let e = v.check_channel_rules(Dialect::SMB_3_1_1, true).unwrap_err();
    assert!(matches!(
        e,
        Smb2Error::Malformed {
            field: "Length (not 0 with an RDMA channel)",
            ..
        }
    ));

    let mut b = write_request_rdma_invalidate_body();
    put16(&mut b, 2, 112); // DataOffset without data
    let v = WriteRequest::new_checked(&b[..]).unwrap();
    assert!(v.check_channel_rules(Dialect::SMB_3_1_1, true).is_err());
    assert!(v.check_channel_rules(Dialect::SMB_2_1, false).is_ok());
}

#[test]
fn write_request_rejects_out_of_range_and_overlapping_buffers() {
    let data = [1u8; 40];
    let repr = write_request(Channel::None, &data, ChannelInfo::EMPTY);
    let b = round_trip!(WriteRequestRepr, repr);
    assert_eq!(le16(&b, 2), 112);
    assert_eq!(b.len(), 88);

    let mut bad = b.clone();
    put32(&mut bad, 4, 41);
    assert!(matches!(
        WriteRequestRepr::from_body(&bad),
        Err(Smb2Error::OutOfBounds {
            field: "DataOffset",
            ..
        })
    ));
    let mut bad = b.clone();
    put16(&mut bad, 2, 0xFFFF);
    assert!(matches!(
        WriteRequestRepr::from_body(&bad),
        Err(Smb2Error::OutOfBounds { .. })
    ));

    // Channel info laid over the data.
    let mut bad = b.clone();
    put32(&mut bad, 32, 1);
    put16(&mut bad, 40, 112);
    put16(&mut bad, 42, 16);
    let e = WriteRequestRepr::from_body(&bad).unwrap_err();
    assert!(matches!(e, Smb2Error::Overlap { .. }) && is_invalid_parameter(&e));

    // Truncations never panic and are errors once a buffer is cut.
    for k in 0..b.len() {
        let r = WriteRequestRepr::from_body(&b[..k]);
        assert!(r.is_err(), "prefix of {k} bytes accepted");
    }
}

#[test]
fn write_request_with_large_inline_data_round_trips() {
    // Inline data past 64 KiB: only DataOffset (112) is a 16-bit offset.
    let data = vec![0x3Cu8; 200 * 1024];
    let repr = write_request(Channel::None, &data, ChannelInfo::EMPTY);
    let b = round_trip!(WriteRequestRepr, repr);
    assert_eq!(le32(&b, 4), 200 * 1024);
    assert_eq!(le16(&b, 40), 0);
    // Channel information after such data cannot be addressed.
    let big = write_request(
        Channel::RdmaV1,
        &data,
        ChannelInfo::descriptors(&WRITE_DESCRIPTOR),
    );
    let mut buf = vec![0u8; big.buffer_len()];
    assert!(matches!(
        big.emit(&mut buf),
        Err(Smb2Error::TooLarge {
            field: "WriteChannelInfoOffset",
            ..
        })
    ));
}

#[test]
fn write_response_round_trips() {
    let b = round_trip!(WriteResponseRepr, WriteResponseRepr { count: 65536 });
    assert_eq!(b, [0x11, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    // The 16 fixed bytes alone are accepted (the Buffer byte may be absent).
    assert_eq!(
        WriteResponseRepr::from_body(&b[..16]).unwrap(),
        WriteResponseRepr { count: 65536 }
    );
}

// ---------------------------------------------------------------------------
// 2.2.31 IOCTL carrying FSCTL_STORAGE_QOS_CONTROL (pinned), 2.2.32
// ---------------------------------------------------------------------------

/// A dialect 1.1 STORAGE_QOS_CONTROL_REQUEST ([MS-SQOS] 2.2.2.2): GET_STATUS
/// | UPDATE_COUNTERS, flow 0x11.., IoCountIncrement 5, no names.
fn qos_request_bytes() -> Vec<u8> {
    let mut p = vec![0u8; 128];
    p[0..2].copy_from_slice(&[0x01, 0x01]); // ProtocolVersion 1.1
    p[4..8].copy_from_slice(&[0x18, 0, 0, 0]); // Options
    p[8..24].copy_from_slice(&[0x11; 16]); // LogicalFlowID
    p[80..88].copy_from_slice(&[5, 0, 0, 0, 0, 0, 0, 0]); // IoCountIncrement
    p
}

fn ioctl_qos_body(payload: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&[0x39, 0x00]); // StructureSize 57
    b.extend_from_slice(&[0x00, 0x00]); // Reserved
    b.extend_from_slice(&[0x50, 0x03, 0x09, 0x00]); // CtlCode 0x00090350
    b.extend_from_slice(&FILE_ID_BYTES);
    b.extend_from_slice(&[0x78, 0x00, 0x00, 0x00]); // InputOffset 120
    b.extend_from_slice(&[0x80, 0x00, 0x00, 0x00]); // InputCount 128
    b.extend_from_slice(&[0; 4]); // MaxInputResponse
    b.extend_from_slice(&[0; 4]); // OutputOffset
    b.extend_from_slice(&[0; 4]); // OutputCount
    b.extend_from_slice(&[0x60, 0x00, 0x00, 0x00]); // MaxOutputResponse 96
    b.extend_from_slice(&[0x01, 0x00, 0x00, 0x00]); // Flags IS_FSCTL
    b.extend_from_slice(&[0; 4]); // Reserved2
    b.extend_from_slice(payload);
    b
}

#[test]
fn ioctl_request_with_storage_qos_control_matches_hand_written_bytes() {
    assert_eq!(FSCTL_STORAGE_QOS_CONTROL, QOS);
    let payload = qos_request_bytes();
    let repr = IoctlRequestRepr::fsctl(FSCTL_STORAGE_QOS_CONTROL, FILE_ID, &payload, 96);
    let expected = ioctl_qos_body(&payload);
    assert_eq!(expected.len(), 184);
    assert_eq!(emit(&repr), expected);

    let v = IoctlRequest::new_checked(&expected[..]).unwrap();
    assert!(v.is_fsctl());
    assert_eq!(v.input(), &payload[..]);
    assert_eq!(v.check_request_rules(65536), Ok(()));
    let qos = v
        .storage_qos_control_request()
        .expect("FSCTL_STORAGE_QOS_CONTROL")
        .expect("valid SQoS request");
    let q = StorageQosControlRequestRepr::parse(&qos).unwrap();
    assert_eq!(q.dialect, SqosDialect::V1_1);
    assert_eq!(q.options, Options::GET_STATUS | Options::UPDATE_COUNTERS);
    assert_eq!(q.io_count_increment, 5);
    assert!(v.validate_negotiate_info().is_none());
    assert_eq!(IoctlRequestRepr::parse(&v).unwrap(), repr);

    // A truncated SQoS payload is the SQoS codec's error, not an SMB2 one.
    let short = ioctl_qos_body(&payload[..100]);
    let mut short = short;
    put32(&mut short, 28, 100);
    let v = IoctlRequest::new_checked(&short[..]).unwrap();
    assert!(v.storage_qos_control_request().unwrap().is_err());
}

#[test]
fn ioctl_request_rejects_bad_input_output_buffers() {
    let payload = qos_request_bytes();
    let good = ioctl_qos_body(&payload);

    let mut b = good.clone();
    put32(&mut b, 24, 0); // InputOffset 0 with InputCount > 0 (3.3.5.15)
    assert!(matches!(
        IoctlRequestRepr::from_body(&b),
        Err(Smb2Error::OutOfBounds {
            field: "InputOffset",
            ..
        })
    ));
    let mut b = good.clone();
    put32(&mut b, 24, 119); // one byte inside the fixed part
    assert!(IoctlRequestRepr::from_body(&b).is_err());
    let mut b = good.clone();
    put32(&mut b, 28, 129);
    assert!(IoctlRequestRepr::from_body(&b).is_err());
    let mut b = good.clone();
    put32(&mut b, 24, 0xFFFF_FFF0); // offset + count overflows u32
    put32(&mut b, 28, 0x20);
    assert!(matches!(
        IoctlRequestRepr::from_body(&b),
        Err(Smb2Error::OutOfBounds { .. })
    ));
    let mut b = good.clone();
    put32(&mut b, 36, 120 + 64); // output inside the input
    put32(&mut b, 40, 8);
    assert!(matches!(
        IoctlRequestRepr::from_body(&b),
        Err(Smb2Error::Overlap {
            first: "InputOffset",
            second: "OutputOffset",
            ..
        })
    ));

    let mut b = good.clone();
    put32(&mut b, 48, 0);
    let v = IoctlRequest::new_checked(&b[..]).unwrap();
    assert!(!v.is_fsctl());
    assert!(v.check_request_rules(64).is_err());

    // The FSCTLs without an open need FileId all ones.
    let vni = IoctlRequestRepr::fsctl(FSCTL_VALIDATE_NEGOTIATE_INFO, FILE_ID, &[0; 26], 24);
    let b = emit(&vni);
    assert!(IoctlRequest::new_checked(&b[..])
        .unwrap()
        .check_request_rules(65536)
        .is_err());
    let vni = IoctlRequestRepr::fsctl(FSCTL_VALIDATE_NEGOTIATE_INFO, FileId::ANY, &[0; 26], 24);
    let b = emit(&vni);
    assert_eq!(
        IoctlRequest::new_checked(&b[..])
            .unwrap()
            .check_request_rules(65536),
        Ok(())
    );
}

#[test]
fn ioctl_request_with_output_buffer_aligns_it() {
    let repr = IoctlRequestRepr {
        ctl_code: FSCTL_PIPE_TRANSCEIVE,
        file_id: FILE_ID,
        input: &[1, 2, 3],
        max_input_response: 0,
        output: &[9, 9],
        max_output_response: 1024,
        flags: IoctlFlags::IS_FSCTL,
    };
    let b = round_trip!(IoctlRequestRepr, repr);
    assert_eq!(le32(&b, 36), 64 + 64); // 56 + 3 = 59 -> 64
    let empty =
        IoctlRequestRepr::fsctl(FSCTL_QUERY_NETWORK_INTERFACE_INFO, FileId::ANY, &[], 65536);
    let b = round_trip!(IoctlRequestRepr, empty);
    assert_eq!(b.len(), 57);
    assert_eq!(le32(&b, 24), 120);
    assert_eq!(le32(&b, 36), 0);
}

#[test]
fn ioctl_response_round_trips_with_output_at_112() {
    let out = [0xABu8; 96];
    let repr = IoctlResponseRepr {
        ctl_code: FSCTL_STORAGE_QOS_CONTROL,
        file_id: FILE_ID,
        input: &[],
        output: &out,
        flags: 0,
    };
    let b = round_trip!(IoctlResponseRepr, repr);
    assert_eq!(le32(&b, 24), 112);
    assert_eq!(le32(&b, 28), 0);
    assert_eq!(le32(&b, 32), 112);
    assert_eq!(le32(&b, 36), 96);
    assert_eq!(&b[48..], &out);
    let with_input = IoctlResponseRepr {
        input: &[1, 2, 3, 4, 5],
        ..repr
    };
    let b = round_trip!(IoctlResponseRepr, with_input);
    assert_eq!(le32(&b, 32), 64 + 56);
    let v = IoctlResponse::new_checked(&b[..]).unwrap();
    assert_eq!(v.output(), &out);
}

#[test]
fn validate_negotiate_info_payloads_round_trip() {
    let dialects = [0x0300u16, 0x0302];
    let req = ValidateNegotiateInfoRequestRepr {
        capabilities: Capabilities::LARGE_MTU,
        guid: guid(5),
        security_mode: SecurityMode::SIGNING_ENABLED,
        dialects: U16Array::new(&dialects),
    };
    let mut buf = [0u8; 28];
    assert_eq!(req.emit(&mut buf), Ok(28));
    assert_eq!(le16(&buf, 20), 1);
    assert_eq!(le16(&buf, 22), 2);
    assert_eq!(&buf[24..28], &[0x00, 0x03, 0x02, 0x03]);
    let v = ValidateNegotiateInfoRequest::new_checked(&buf[..]).unwrap();
    assert_eq!(ValidateNegotiateInfoRequestRepr::parse(&v).unwrap(), req);
    assert!(ValidateNegotiateInfoRequest::new_checked(&buf[..27]).is_err());
    assert!(ValidateNegotiateInfoRequest::new_checked(&buf[..10]).is_err());

    let ioctl = IoctlRequestRepr::fsctl(FSCTL_VALIDATE_NEGOTIATE_INFO, FileId::ANY, &buf, 24);
    let body = emit(&ioctl);
    let v = IoctlRequest::new_checked(&body[..]).unwrap();
    let vn = v.validate_negotiate_info().unwrap().unwrap();
    assert_eq!(vn.dialects(), U16Array::new(&dialects));

    let rsp = ValidateNegotiateInfoResponseRepr {
        capabilities: Capabilities::LARGE_MTU,
        guid: guid(6),
        security_mode: SecurityMode::SIGNING_REQUIRED,
        dialect: 0x0302,
    };
    let mut out = [0u8; 24];
    assert_eq!(rsp.emit(&mut out), Ok(24));
    let v = ValidateNegotiateInfoResponse::new_checked(&out[..]).unwrap();
    assert_eq!(ValidateNegotiateInfoResponseRepr::parse(&v).unwrap(), rsp);
    assert!(ValidateNegotiateInfoResponse::new_checked(&out[..23]).is_err());
}

// ---------------------------------------------------------------------------
// 2.2.2 ERROR response
// ---------------------------------------------------------------------------

#[test]
fn error_response_has_one_byte_of_error_data_when_empty() {
    let b = round_trip!(ErrorResponseRepr, ErrorResponseRepr::EMPTY);
    assert_eq!(b, [0x09, 0, 0, 0, 0, 0, 0, 0, 0]);
    // Receivers also accept the 8 fixed bytes alone.
    assert_eq!(
        ErrorResponseRepr::from_body(&b[..8]).unwrap(),
        ErrorResponseRepr::EMPTY
    );
    let needed = 0x1234u32.to_le_bytes();
    let r = ErrorResponseRepr {
        error_context_count: 0,
        error_data: &needed,
    };
    let b = round_trip!(ErrorResponseRepr, r);
    assert_eq!(le32(&b, 4), 4);
    let mut bad = b;
    put32(&mut bad, 4, 5);
    assert!(matches!(
        ErrorResponseRepr::from_body(&bad),
        Err(Smb2Error::OutOfBounds {
            field: "ByteCount",
            ..
        })
    ));
}

#[test]
fn error_response_contexts_are_walked_with_8_byte_alignment() {
    let mut data = Vec::new();
    data.extend_from_slice(&3u32.to_le_bytes());
    data.extend_from_slice(&0u32.to_le_bytes());
    data.extend_from_slice(&[1, 2, 3]);
    data.extend_from_slice(&[0; 5]);
    data.extend_from_slice(&4u32.to_le_bytes());
    data.extend_from_slice(&ErrorContext::ERROR_ID_SHARE_REDIRECT.to_le_bytes());
    data.extend_from_slice(&[4, 5, 6, 7]);
    let r = ErrorResponseRepr {
        error_context_count: 2,
        error_data: &data,
    };
    let b = round_trip!(ErrorResponseRepr, r);
    let v = ErrorResponse::new_checked(&b[..]).unwrap();
    let ctx: Vec<_> = v.error_contexts().map(Result::unwrap).collect();
    assert_eq!(ctx.len(), 2);
    assert_eq!(ctx[0].data, &[1, 2, 3]);
    assert_eq!(ctx[1].error_id, ErrorContext::ERROR_ID_SHARE_REDIRECT);
    let mut bad = b;
    bad[2] = 3; // one context more than present
    assert!(ErrorResponseRepr::from_body(&bad).is_err());
}

// ---------------------------------------------------------------------------
// StructureSize and truncation, for every body
// ---------------------------------------------------------------------------

/// (name, command, StructureSize, decoder) for every request body.
type Decode = fn(&[u8]) -> Result<(), Smb2Error>;

fn request_decoders() -> Vec<(Command, u16, Decode)> {
    vec![
        (Command::Negotiate, 36, |b| {
            NegotiateRequestRepr::from_body(b).map(drop)
        }),
        (Command::SessionSetup, 25, |b| {
            SessionSetupRequestRepr::from_body(b).map(drop)
        }),
        (Command::Logoff, 4, |b| {
            LogoffRequestRepr::from_body(b).map(drop)
        }),
        (Command::TreeConnect, 9, |b| {
            TreeConnectRequestRepr::from_body(b).map(drop)
        }),
        (Command::TreeDisconnect, 4, |b| {
            TreeDisconnectRequestRepr::from_body(b).map(drop)
        }),
        (Command::Create, 57, |b| {
            CreateRequestRepr::from_body(b).map(drop)
        }),
        (Command::Close, 24, |b| {
            CloseRequestRepr::from_body(b).map(drop)
        }),
        (Command::Flush, 24, |b| {
            FlushRequestRepr::from_body(b).map(drop)
        }),
        (Command::Read, 49, |b| {
            ReadRequestRepr::from_body(b).map(drop)
        }),
        (Command::Write, 49, |b| {
            WriteRequestRepr::from_body(b).map(drop)
        }),
        (Command::Ioctl, 57, |b| {
            IoctlRequestRepr::from_body(b).map(drop)
        }),
        (Command::Cancel, 4, |b| {
            CancelRequestRepr::from_body(b).map(drop)
        }),
        (Command::Echo, 4, |b| {
            EchoRequestRepr::from_body(b).map(drop)
        }),
    ]
}

fn response_decoders() -> Vec<(&'static str, u16, Decode)> {
    vec![
        ("ERROR", 9, |b| ErrorResponseRepr::from_body(b).map(drop)),
        ("NEGOTIATE", 65, |b| {
            NegotiateResponseRepr::from_body(b).map(drop)
        }),
        ("SESSION_SETUP", 9, |b| {
            SessionSetupResponseRepr::from_body(b).map(drop)
        }),
        ("LOGOFF", 4, |b| LogoffResponseRepr::from_body(b).map(drop)),
        ("TREE_CONNECT", 16, |b| {
            TreeConnectResponseRepr::from_body(b).map(drop)
        }),
        ("TREE_DISCONNECT", 4, |b| {
            TreeDisconnectResponseRepr::from_body(b).map(drop)
        }),
        ("CREATE", 89, |b| CreateResponseRepr::from_body(b).map(drop)),
        ("CLOSE", 60, |b| CloseResponseRepr::from_body(b).map(drop)),
        ("FLUSH", 4, |b| FlushResponseRepr::from_body(b).map(drop)),
        ("READ", 17, |b| ReadResponseRepr::from_body(b).map(drop)),
        ("WRITE", 17, |b| WriteResponseRepr::from_body(b).map(drop)),
        ("IOCTL", 49, |b| IoctlResponseRepr::from_body(b).map(drop)),
        ("ECHO", 4, |b| EchoResponseRepr::from_body(b).map(drop)),
    ]
}

/// The smallest body with the right StructureSize: zeros otherwise (for
/// NEGOTIATE request: one dialect).
fn minimal_body(structure_size: u16, command: Option<Command>) -> Vec<u8> {
    let mut b = vec![0u8; usize::from(structure_size)];
    put16(&mut b, 0, structure_size);
    if command == Some(Command::Negotiate) {
        put16(&mut b, 2, 1);
        b.extend_from_slice(&[0x02, 0x03]);
    }
    b
}

#[test]
fn every_body_checks_its_structure_size_first() {
    for (cmd, ss, decode) in request_decoders() {
        let good = minimal_body(ss, Some(cmd));
        assert_eq!(decode(&good), Ok(()), "{cmd:?} minimal body");
        for wrong in [0u16, ss - 1, ss + 1, ss ^ 0x8000, 64] {
            let mut b = good.clone();
            put16(&mut b, 0, wrong);
            let e = decode(&b).unwrap_err();
            assert_eq!(
                e,
                Smb2Error::StructureSize {
                    what: match e {
                        Smb2Error::StructureSize { what, .. } => what,
                        _ => "",
                    },
                    expected: ss,
                    found: wrong
                },
                "{cmd:?}"
            );
            assert!(is_invalid_parameter(&e), "{cmd:?}: {e:?}");
        }
    }
    for (name, ss, decode) in response_decoders() {
        let good = minimal_body(ss, None);
        assert_eq!(decode(&good), Ok(()), "{name} minimal body");
        let mut b = good.clone();
        put16(&mut b, 0, ss + 2);
        assert!(
            matches!(decode(&b), Err(Smb2Error::StructureSize { expected, .. }) if expected == ss),
            "{name}"
        );
    }
}

#[test]
fn every_body_reports_truncation_below_its_fixed_part() {
    for (cmd, ss, decode) in request_decoders() {
        let good = minimal_body(ss, Some(cmd));
        let fixed = usize::from(ss & !1);
        for k in 0..fixed {
            let e = decode(&good[..k]).unwrap_err();
            assert!(
                matches!(e, Smb2Error::Truncated { .. }),
                "{cmd:?} at {k}: {e:?}"
            );
            assert!(is_invalid_parameter(&e));
        }
        if cmd != Command::Negotiate {
            // An odd StructureSize's Buffer byte may be absent.
            assert_eq!(
                decode(&good[..fixed]),
                Ok(()),
                "{cmd:?} without Buffer byte"
            );
        }
    }
    for (name, ss, decode) in response_decoders() {
        let good = minimal_body(ss, None);
        let fixed = usize::from(ss & !1);
        for k in 0..fixed {
            assert!(
                matches!(decode(&good[..k]), Err(Smb2Error::Truncated { .. })),
                "{name} at {k}"
            );
        }
        assert_eq!(decode(&good[..fixed]), Ok(()), "{name}");
    }
}

#[test]
fn unsupported_commands_map_to_not_supported() {
    // SERVER_TO_CLIENT_NOTIFICATION is never a request: not decoded.
    let cmd = Command::ServerToClientNotification;
    let e = RequestBody::parse(cmd, &[0; 64]).unwrap_err();
    assert_eq!(e, Smb2Error::UnsupportedCommand { command: cmd });
    assert_eq!(
        e.server_action(),
        ServerAction::FailRequest(STATUS_NOT_SUPPORTED)
    );
    // The commands a server may not implement still decode, so a malformed
    // body is STATUS_INVALID_PARAMETER (the server answers a well-formed
    // one STATUS_NOT_SUPPORTED itself); see tests/smb2_fscc.rs.
    for cmd in [
        Command::Lock,
        Command::QueryDirectory,
        Command::ChangeNotify,
        Command::QueryInfo,
        Command::SetInfo,
        Command::OplockBreak,
    ] {
        let e = RequestBody::parse(cmd, &[0; 64]).unwrap_err();
        assert!(
            matches!(e, Smb2Error::StructureSize { .. }),
            "{cmd:?}: {e:?}"
        );
        assert!(is_invalid_parameter(&e), "{cmd:?}");
    }
}

#[test]
fn request_body_dispatch_covers_every_decoded_command() {
    for (cmd, ss, _) in request_decoders() {
        let b = minimal_body(ss, Some(cmd));
        let body = RequestBody::parse(cmd, &b).unwrap();
        assert_eq!(body.command(), cmd);
        assert_eq!(body.as_body().command(), Some(cmd));
    }
}

#[test]
fn emit_message_writes_header_then_body_and_checks_the_command() {
    let mut h = HeaderRepr::request(Command::Echo, 9);
    let mut buf = [0u8; 68];
    assert_eq!(emit_message(&h, &EchoRequestRepr, &mut buf), Ok(68));
    assert_eq!(&buf[64..], &[4, 0, 0, 0]);
    h.command = Command::Close;
    assert!(matches!(
        emit_message(&h, &EchoRequestRepr, &mut buf),
        Err(Smb2Error::Malformed { .. })
    ));
    // An ERROR body goes with any command.
    let mut buf = [0u8; 73];
    assert_eq!(
        emit_message(
            &h.response_to(STATUS_INVALID_PARAMETER),
            &ErrorResponseRepr::EMPTY,
            &mut buf
        ),
        Ok(73)
    );
    assert!(matches!(
        emit_message(&h, &ErrorResponseRepr::EMPTY, &mut buf[..72]),
        Err(Smb2Error::BufferTooSmall { need: 73, .. })
    ));
}

#[test]
fn flags_debug_names_bits_and_undefined_ones() {
    let f = HeaderFlags::SERVER_TO_REDIR | HeaderFlags::SIGNED | HeaderFlags::from_bits(0x100);
    let s = format!("{f:?}");
    assert!(
        s.contains("SERVER_TO_REDIR") && s.contains("SIGNED") && s.contains("undefined 0x100"),
        "{s}"
    );
    assert_eq!(
        format!("{:?}", CreateDisposition::OPEN_IF),
        "CreateDisposition::OPEN_IF"
    );
    assert!(!CreateDisposition(6).is_defined());
    assert!(Dialect::SMB_3_0_2.is_smb3() && !Dialect::SMB_2_1.is_smb3());
}

#[test]
fn utf16_strict_decoding_rejects_odd_lengths_and_lone_surrogates() {
    assert!(Utf16Str::from_utf16le(&[0x41, 0x00, 0x42])
        .decode()
        .is_err());
    assert!(Utf16Str::from_utf16le(&[0x00, 0xD8]).decode().is_err());
    assert_eq!(Utf16Str::from_utf16le(&[0x41, 0x00]).decode().unwrap(), "A");
    assert_eq!(Utf16Str::new("é𝄞"), Utf16Str::from_utf16le(&utf16("é𝄞")));
    assert_eq!(
        Utf16Str::from_utf16le(&[0x41, 0x00, 0x42]).to_string_lossy(),
        "A\u{FFFD}"
    );
}
