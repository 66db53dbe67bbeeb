//! [MS-SMBD] 2.2.3.1 Buffer Descriptor V1 and arrays of it: never panics;
//! an array decodes exactly when it is a whole, non-zero number of 16-byte
//! elements; every element re-emits to its own bytes; the single-descriptor
//! view agrees with the array; validation never panics and its total is the
//! sum of the Length fields.
#![no_main]

use libfuzzer_sys::fuzz_target;
use smbdirect_protocol::smbd::rdma_slice::validate_descriptors;
use smbdirect_protocol::smbd::wire::{
    BufferDescriptor, BufferDescriptorArray, BufferDescriptorRepr,
};
use smbdirect_protocol::WireError;

fuzz_target!(|data: &[u8]| {
    if let Ok(view) = BufferDescriptor::new_checked(data) {
        let d = BufferDescriptorRepr::parse(&view);
        assert_eq!(&d.to_bytes()[..], &data[..16]);
    } else {
        assert!(data.len() < 16);
    }

    match BufferDescriptorArray::new_checked(data) {
        Ok(array) => {
            assert!(data.len() >= 16 && data.len() % 16 == 0);
            assert_eq!(array.len(), data.len() / 16);
            for (i, (d, chunk)) in array.iter().zip(data.chunks_exact(16)).enumerate() {
                assert_eq!(&d.to_bytes()[..], chunk);
                assert_eq!(array.get(i), Some(d));
            }
            assert_eq!(array.get(array.len()), None);
            if let Ok(total) = validate_descriptors(&array) {
                assert_eq!(total, array.total_length());
                assert!(array.iter().all(|d| d.length > 0));
            }
        }
        Err(WireError::Truncated { need, have, .. }) => {
            assert_eq!((need, have), (16, data.len()));
            assert!(data.len() < 16);
        }
        Err(WireError::Malformed { .. }) => {
            assert!(data.len() >= 16 && data.len() % 16 != 0);
        }
    }
});
