//! [MS-SMBD] 2.2.2 Negotiate Response decoder: never panics, decodes exactly
//! when at least 32 bytes are present, and re-emitting the decoded Repr
//! reproduces the first 32 bytes (with Reserved zeroed, 3.1.5.3).
#![no_main]

use libfuzzer_sys::fuzz_target;
use smbdirect_protocol::smbd::wire::{NegotiateResponse, NegotiateResponseRepr};
use smbdirect_protocol::WireError;

fuzz_target!(|data: &[u8]| {
    match NegotiateResponse::new_checked(data) {
        Ok(view) => {
            assert!(data.len() >= 32);
            let repr = NegotiateResponseRepr::parse(&view);
            let mut expected = [0u8; 32];
            expected.copy_from_slice(&data[..32]);
            expected[6..8].fill(0); // Reserved
            assert_eq!(repr.to_bytes(), expected);
        }
        Err(WireError::Truncated { need, have, .. }) => {
            assert_eq!((need, have), (32, data.len()));
            assert!(data.len() < 32);
        }
        Err(e) => panic!("unexpected verdict {e:?} for {} bytes", data.len()),
    }
});
