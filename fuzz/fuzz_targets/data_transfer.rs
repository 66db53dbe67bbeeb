//! [MS-SMBD] 2.2.3 Data Transfer decoder: never panics; the verdict is the
//! one the 3.1.5.8 layout rules give (DataOffset 8-byte aligned,
//! DataOffset + DataLength within the message, a non-empty payload not inside
//! the 20-byte header); an accepted message's payload lies inside it, and
//! re-emitting the decoded Repr with that payload reproduces the message up
//! to the end of the payload (Reserved and Padding zeroed, 3.1.5.4).
#![no_main]

use libfuzzer_sys::fuzz_target;
use smbdirect_protocol::smbd::wire::{DataTransfer, DataTransferRepr};
use smbdirect_protocol::WireError;

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The rules, written independently of the decoder.
fn acceptable(msg_len: usize, off: u32, len: u32) -> bool {
    off % 8 == 0 && u64::from(off) + u64::from(len) <= msg_len as u64 && (len == 0 || off >= 20)
}

fuzz_target!(|data: &[u8]| {
    let view = match DataTransfer::new_checked(data) {
        Ok(view) => view,
        Err(WireError::Truncated { need, have, .. }) => {
            assert_eq!((need, have), (20, data.len()));
            assert!(data.len() < 20);
            return;
        }
        Err(e) => panic!("unexpected verdict {e:?} for {} bytes", data.len()),
    };
    let (off, len) = (le32(data, 12), le32(data, 16));
    let parsed = DataTransferRepr::parse(&view);
    if !acceptable(data.len(), off, len) {
        assert!(
            matches!(parsed, Err(WireError::Malformed { .. })),
            "{parsed:?}"
        );
        assert!(view.payload().is_err());
        return;
    }
    let repr = parsed.expect("the rules accept this message");
    let payload = view.payload().expect("accepted payload");
    assert_eq!(payload.len(), len as usize);
    if len == 0 {
        return;
    }
    assert_eq!(payload, &data[off as usize..(off + len) as usize]);

    let mut out = vec![0xFFu8; repr.buffer_len()];
    let n = repr.emit(&mut out, payload);
    assert_eq!(n, off as usize + len as usize);
    let mut expected = data[..n].to_vec();
    expected[6..8].fill(0); // Reserved
    expected[20..off as usize].fill(0); // Padding
    assert_eq!(out, expected);
});
