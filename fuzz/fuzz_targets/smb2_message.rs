//! [MS-SMB2] 2.2.1 / 3.3.5.2.7 compound chains and every request and
//! response body a peer can send: never panics, and what decodes is what
//! our encoder writes back. Byte 0 picks the direction (low bit: 0 the
//! server's view of requests, 1 the client's view of responses); the rest
//! is one received SMB2 message or compound.
//!
//! Checked against rules written here, not taken from the decoder:
//! - the walk delimits by NextCommand ([MS-SMB2] 2.2.1): every message but
//!   the last spans exactly NextCommand bytes, a multiple of 8 and at least
//!   the 64-byte header; the messages tile the input from offset 0; the
//!   walk stops at the first error;
//! - a body that decodes, written out again by `emit_message` under its
//!   header (NextCommand 0) and decoded again, gives the same header and the
//!   same body: a value we accept is one we can send and read back
//!   unchanged;
//! - the nested lists the server walks (create contexts, [MS-SMB2] 2.2.13.2,
//!   and each known one's Data; negotiate contexts, 2.2.3.1) iterate without
//!   panicking; a Storage QoS IOCTL input ([MS-SQOS] 2.2.2.2) is read as the
//!   server reads it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use smbdirect_protocol::smb2::{
    compound, emit_message, HeaderRepr, Message, RequestBody, HEADER_LEN,
};
use smbdirect_protocol::sqos::{StorageQosControlRequest, FSCTL_STORAGE_QOS_CONTROL};

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Emits `header` (NextCommand 0) and `body`: the bytes.
fn round_trip(header: &HeaderRepr, body: &dyn smbdirect_protocol::smb2::Smb2Body) -> Vec<u8> {
    let mut h = *header;
    h.next_command = 0;
    let mut buf = vec![0u8; HEADER_LEN + body.buffer_len()];
    let n = match emit_message(&h, body, &mut buf) {
        Ok(n) => n,
        Err(e) => panic!("a decoded body did not encode again: {e:?}\n{h:?}"),
    };
    buf.truncate(n);
    buf
}

/// Decodes `again` (what [`round_trip`] wrote for `header`) as one message
/// and checks its header is `header` with NextCommand 0.
fn reread<'b>(header: &HeaderRepr, again: &'b [u8]) -> Message<'b> {
    let m = compound(again)
        .next()
        .expect("one message")
        .unwrap_or_else(|e| panic!("re-emitted header refused: {e:?}"));
    let mut h = *header;
    h.next_command = 0;
    assert_eq!(h, *m.header(), "header changed by a round trip");
    m
}

fn walk_request(body: &RequestBody<'_>) {
    match body {
        RequestBody::Create(c) => {
            for ctx in c.create_contexts.requests() {
                if ctx.is_err() {
                    break;
                }
            }
        }
        RequestBody::Negotiate(n) => {
            for ctx in n.negotiate_contexts.iter() {
                let _ = ctx.data_len();
            }
            let _ = n.dialects.iter().count();
        }
        RequestBody::Ioctl(i) if i.ctl_code == FSCTL_STORAGE_QOS_CONTROL => {
            if let Ok(q) = StorageQosControlRequest::new_checked(i.input) {
                let _ = (q.initiator_name(), q.initiator_node_name());
                let _ = (q.bandwidth_limit(), q.kilobyte_count_increment());
            }
        }
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&dir, bytes)) = data.split_first() else {
        return;
    };
    let responses = dir & 1 == 1;
    let mut pos = 0usize;
    for item in compound(bytes) {
        let msg = match item {
            Ok(m) => m,
            Err(_) => break,
        };
        assert_eq!(msg.offset(), pos, "messages tile the compound");
        let next = le32(bytes, pos + 20) as usize;
        assert_eq!(next, msg.header().next_command as usize);
        if next == 0 {
            assert_eq!(msg.bytes().len(), bytes.len() - pos);
        } else {
            assert!(next % 8 == 0 && next >= HEADER_LEN && next < bytes.len() - pos);
            assert_eq!(msg.bytes().len(), next);
        }
        pos += msg.bytes().len();
        let header = *msg.header();
        if responses {
            let Ok(body) = msg.response_body() else {
                continue;
            };
            let again = round_trip(&header, body.as_body());
            let b2 = reread(&header, &again)
                .response_body()
                .unwrap_or_else(|e| panic!("re-emitted response refused: {e:?}\n{body:?}"));
            assert_eq!(body, b2, "response body changed by a round trip");
        } else {
            let Ok(body) = msg.request_body() else {
                continue;
            };
            walk_request(&body);
            let again = round_trip(&header, body.as_body());
            let b2 = reread(&header, &again)
                .request_body()
                .unwrap_or_else(|e| panic!("re-emitted request refused: {e:?}\n{body:?}"));
            assert_eq!(body, b2, "request body changed by a round trip");
        }
    }
});
