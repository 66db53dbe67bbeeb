//! [MS-SMBD] 2.2.1 Negotiate Request decoder: never panics, decodes exactly
//! when at least 20 bytes are present, and re-emitting the decoded Repr
//! reproduces the first 20 bytes (with Reserved zeroed, 3.1.5.2).
#![no_main]

use libfuzzer_sys::fuzz_target;
use smbdirect_protocol::smbd::wire::{NegotiateRequest, NegotiateRequestRepr};
use smbdirect_protocol::WireError;

fuzz_target!(|data: &[u8]| {
    match NegotiateRequest::new_checked(data) {
        Ok(view) => {
            assert!(data.len() >= 20);
            let repr = NegotiateRequestRepr::parse(&view);
            let mut expected = [0u8; 20];
            expected.copy_from_slice(&data[..20]);
            expected[4..6].fill(0); // Reserved
            assert_eq!(repr.to_bytes(), expected);
        }
        Err(WireError::Truncated { need, have, .. }) => {
            assert_eq!((need, have), (20, data.len()));
            assert!(data.len() < 20);
        }
        Err(e) => panic!("unexpected verdict {e:?} for {} bytes", data.len()),
    }
});
