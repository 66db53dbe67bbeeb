//! [MS-SMBD] 3.1.4.5 / 3.1.4.6 buffer-descriptor slicing. Input layout:
//! bytes 0..8 the offset, 8..16 the length (both little-endian u64), the rest
//! a descriptor array (cut to a multiple of 16). Never panics; the wire and
//! value sources agree; an accepted request yields non-empty segments,
//! contiguous in the local buffer from 0, summing to the length, each inside
//! its descriptor, with the first trimmed to its trailing subsegment and the
//! last to its leading subsegment. When the low bit of byte 0 is clear the
//! request is folded into the described buffer (offset modulo the total),
//! so both the refusals and the slicing itself get explored.
#![no_main]

use libfuzzer_sys::fuzz_target;
use smbdirect_protocol::smbd::rdma_slice::{slice, validate_descriptors, RdmaSegment};
use smbdirect_protocol::smbd::wire::{BufferDescriptorArray, BufferDescriptorRepr};

fuzz_target!(|data: &[u8]| {
    if data.len() < 16 {
        return;
    }
    let u64_at = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&data[at..at + 8]);
        u64::from_le_bytes(b)
    };
    let (offset, length) = (u64_at(0), u64_at(8));
    let rest = &data[16..];
    let rest = &rest[..rest.len() - rest.len() % 16];
    let values: Vec<BufferDescriptorRepr> = match BufferDescriptorArray::new_checked(rest) {
        Ok(array) => array.iter().collect(),
        Err(_) => Vec::new(),
    };

    // Fully random offsets almost never land inside the buffer: when the
    // low bit of byte 0 is clear, fold the request into it.
    let (offset, length) = match (data[0] & 1, validate_descriptors(&values[..])) {
        (0, Ok(total)) => {
            let o = offset % total;
            (o, 1 + length % (total - o))
        }
        _ => (offset, length),
    };

    let from_values = slice(&values[..], offset, length).map(|s| s.collect::<Vec<_>>());
    if let Ok(array) = BufferDescriptorArray::new_checked(rest) {
        let from_wire = slice(&array, offset, length).map(|s| s.collect::<Vec<RdmaSegment>>());
        assert_eq!(from_values, from_wire);
    }
    let Ok(segs) = from_values else {
        return;
    };
    let total = validate_descriptors(&values[..]).expect("sliced, so valid");
    let end = offset.checked_add(length).expect("sliced, so no overflow");
    assert!(length > 0 && end <= total);

    // Walk the elements alongside the segments.
    let mut start = 0u64; // where element i begins in the described buffer
    let mut i = 0usize;
    while start + u64::from(values[i].length) <= offset {
        start += u64::from(values[i].length);
        i += 1;
    }
    let mut local = 0u64;
    let mut elem_start = start;
    for (k, s) in segs.iter().enumerate() {
        let d = values[i + k];
        assert!(s.length > 0);
        assert_eq!(s.token, d.token);
        assert_eq!(s.local_offset, local);
        let skip = if k == 0 { offset - elem_start } else { 0 };
        assert_eq!(s.remote_offset, d.offset + skip);
        let want = (u64::from(d.length) - skip).min(length - local);
        assert_eq!(u64::from(s.length), want);
        local += u64::from(s.length);
        elem_start += u64::from(d.length);
    }
    assert_eq!(local, length);
});
