//! Property tests for buffer-descriptor slicing ([MS-SMBD] 3.1.4.5 RDMA
//! Write to Peer Buffer, 3.1.4.6 RDMA Read from Peer Buffer).
//!
//! Small arrays are checked against a naive byte-by-byte model: expand every
//! descriptor into its bytes' (element, remote address), take the requested
//! run, and group it by element. Large arrays (lengths up to u32::MAX,
//! transfers past 4 GiB) are checked against the invariants: segments are
//! non-empty, contiguous in local_offset from 0, sum to the length, each
//! lies within its descriptor, consecutive descriptors are used in order, the
//! first is trimmed to its trailing subsegment and the last to its leading
//! subsegment. Both descriptor sources (`[BufferDescriptorRepr]` and the wire
//! view `BufferDescriptorArray`) must give the same answer.

use proptest::collection::vec;
use proptest::prelude::*;
use smbdirect_protocol::smbd::rdma_slice::{slice, validate_descriptors, RdmaSegment, SliceError};
use smbdirect_protocol::smbd::wire::{BufferDescriptorArray, BufferDescriptorRepr};

fn to_wire(descs: &[BufferDescriptorRepr]) -> Vec<u8> {
    descs.iter().flat_map(|d| d.to_bytes()).collect()
}

/// Slices through both sources; they must agree.
fn slice_both(
    descs: &[BufferDescriptorRepr],
    offset: u64,
    length: u64,
) -> Result<Vec<RdmaSegment>, SliceError> {
    let from_values = slice(descs, offset, length).map(|s| s.collect::<Vec<_>>());
    let bytes = to_wire(descs);
    match BufferDescriptorArray::new_checked(&bytes) {
        Ok(array) => {
            let from_wire = slice(&array, offset, length).map(|s| s.collect::<Vec<_>>());
            assert_eq!(from_values, from_wire, "value and wire sources disagree");
        }
        Err(_) => assert!(descs.is_empty()),
    }
    from_values
}

/// The refusal rules, in the order they are applied: no descriptors; the
/// first element (in array order) of length 0 or whose Offset+Length wraps;
/// zero transfer length; offset+length overflowing u64; a range ending past
/// the described buffer.
fn model_error(descs: &[BufferDescriptorRepr], offset: u64, length: u64) -> Option<SliceError> {
    if descs.is_empty() {
        return Some(SliceError::NoDescriptors);
    }
    for (index, d) in descs.iter().enumerate() {
        if d.length == 0 {
            return Some(SliceError::ZeroLengthDescriptor { index });
        }
        if d.offset.checked_add(u64::from(d.length)).is_none() {
            return Some(SliceError::DescriptorWraps { index });
        }
    }
    if length == 0 {
        return Some(SliceError::ZeroLength);
    }
    let Some(end) = offset.checked_add(length) else {
        return Some(SliceError::Overflow);
    };
    let total: u64 = descs.iter().map(|d| u64::from(d.length)).sum();
    if end > total {
        return Some(SliceError::OutOfRange { end, total });
    }
    None
}

/// Naive model: one entry per described byte, then group the requested run
/// by element.
fn model_byte_by_byte(
    descs: &[BufferDescriptorRepr],
    offset: u64,
    length: u64,
) -> Result<Vec<RdmaSegment>, SliceError> {
    if let Some(e) = model_error(descs, offset, length) {
        return Err(e);
    }
    let bytes: Vec<(usize, u64)> = descs
        .iter()
        .enumerate()
        .flat_map(|(i, d)| (0..u64::from(d.length)).map(move |k| (i, d.offset + k)))
        .collect();
    let run = &bytes[offset as usize..(offset + length) as usize];
    let mut out: Vec<(usize, RdmaSegment)> = Vec::new();
    for (local, &(elem, remote)) in run.iter().enumerate() {
        match out.last_mut() {
            Some((e, seg)) if *e == elem => seg.length += 1,
            _ => out.push((
                elem,
                RdmaSegment {
                    remote_offset: remote,
                    token: descs[elem].token,
                    length: 1,
                    local_offset: local as u64,
                },
            )),
        }
    }
    Ok(out.into_iter().map(|(_, s)| s).collect())
}

/// Small descriptors: lengths 0..40 (0 is refused), offsets mostly low but
/// sometimes within 64 of u64::MAX (which may wrap).
fn small_descriptor() -> impl Strategy<Value = BufferDescriptorRepr> {
    (
        prop_oneof![9 => 0u64..(1 << 20), 1 => (u64::MAX - 64)..=u64::MAX],
        any::<u32>(),
        prop_oneof![1 => Just(0u32), 30 => 1u32..40],
    )
        .prop_map(|(offset, token, length)| BufferDescriptorRepr {
            offset,
            token,
            length,
        })
}

fn request_value() -> impl Strategy<Value = u64> {
    prop_oneof![6 => 0u64..340, 1 => any::<u64>(), 1 => (u64::MAX - 400)..=u64::MAX]
}

/// Large, valid descriptors with token = index, so a segment names its
/// element.
fn large_descriptors() -> impl Strategy<Value = Vec<BufferDescriptorRepr>> {
    vec(
        (0u64..(u64::MAX / 2), prop_oneof![1u32..=u32::MAX, 1u32..8]),
        1..16,
    )
    .prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (offset, length))| BufferDescriptorRepr {
                offset,
                token: i as u32,
                length,
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn slicing_matches_byte_by_byte_model(
        descs in vec(small_descriptor(), 0..9),
        offset in request_value(),
        length in request_value(),
    ) {
        let got = slice_both(&descs, offset, length);
        prop_assert_eq!(got, model_byte_by_byte(&descs, offset, length));
    }

    #[test]
    fn slicing_valid_requests_on_small_arrays_matches_model(
        descs in vec(
            (0u64..(1 << 40), any::<u32>(), 1u32..64)
                .prop_map(|(offset, token, length)| BufferDescriptorRepr { offset, token, length }),
            1..9,
        ),
        a in any::<prop::sample::Index>(),
        b in any::<prop::sample::Index>(),
    ) {
        // Requests drawn inside the buffer so that most cases slice.
        let total: u64 = descs.iter().map(|d| u64::from(d.length)).sum();
        let offset = a.index(total as usize) as u64;
        let length = 1 + b.index((total - offset) as usize) as u64;
        let got = slice_both(&descs, offset, length);
        prop_assert!(got.is_ok());
        prop_assert_eq!(got, model_byte_by_byte(&descs, offset, length));
    }

    #[test]
    fn slicing_large_buffers_keeps_the_invariants(
        descs in large_descriptors(),
        a in any::<prop::sample::Index>(),
        b in any::<prop::sample::Index>(),
    ) {
        let total: u64 = descs.iter().map(|d| u64::from(d.length)).sum();
        prop_assert_eq!(validate_descriptors(&descs[..]), Ok(total));
        // Index over u64 ranges via a fraction of the span.
        let frac = |ix: prop::sample::Index, span: u64| -> u64 {
            ((u128::from(span) * ix.index(1 << 20) as u128) >> 20) as u64
        };
        let offset = frac(a, total - 1);
        let length = 1 + frac(b, total - offset - 1);
        let end = offset + length;
        let segs = slice_both(&descs, offset, length).unwrap();

        // Element boundaries: prefix[i] is where element i starts.
        let prefix: Vec<u64> = descs
            .iter()
            .scan(0u64, |acc, d| {
                let start = *acc;
                *acc += u64::from(d.length);
                Some(start)
            })
            .collect();
        let first = prefix.partition_point(|&p| p <= offset) - 1;
        let last = prefix.partition_point(|&p| p < end) - 1;
        prop_assert_eq!(segs.len(), last - first + 1);

        let mut local = 0u64;
        for (k, s) in segs.iter().enumerate() {
            let elem = first + k;
            let d = descs[elem];
            prop_assert_eq!(s.token, elem as u32, "elements used in order");
            prop_assert!(s.length > 0, "segments are never empty");
            prop_assert_eq!(s.local_offset, local, "contiguous in the local buffer");
            prop_assert!(s.remote_offset >= d.offset);
            prop_assert!(s.remote_offset + u64::from(s.length) <= d.offset + u64::from(d.length));
            // Trailing subsegment of the first element, leading subsegment of
            // the last, whole elements in between.
            let skip = if k == 0 { offset - prefix[elem] } else { 0 };
            prop_assert_eq!(s.remote_offset, d.offset + skip);
            let through = if elem == last { end - prefix[elem] } else { u64::from(d.length) };
            prop_assert_eq!(u64::from(s.length), through - skip);
            local += u64::from(s.length);
        }
        prop_assert_eq!(local, length, "segments sum to the transfer length");
    }

    #[test]
    fn slicing_refuses_exactly_when_the_rules_say(
        descs in vec(small_descriptor(), 0..6),
        offset in request_value(),
        length in request_value(),
    ) {
        let got = slice_both(&descs, offset, length);
        match model_error(&descs, offset, length) {
            Some(e) => prop_assert_eq!(got, Err(e)),
            None => {
                let segs = got.unwrap();
                prop_assert!(!segs.is_empty());
                prop_assert_eq!(segs.iter().map(|s| u64::from(s.length)).sum::<u64>(), length);
            }
        }
    }

    #[test]
    fn wire_array_and_values_validate_alike(descs in vec(small_descriptor(), 1..9)) {
        let bytes = to_wire(&descs);
        let array = BufferDescriptorArray::new_checked(&bytes).unwrap();
        prop_assert_eq!(validate_descriptors(&array), validate_descriptors(&descs[..]));
        if let Ok(total) = validate_descriptors(&array) {
            prop_assert_eq!(total, array.total_length());
        }
    }
}
