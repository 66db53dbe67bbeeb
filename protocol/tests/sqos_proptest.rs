//! Property tests for [MS-SQOS]: codecs round-trip; decoders and the server
//! never panic on any input and always answer with a status the
//! specification names; structure-aware mutations of valid requests get the
//! status of the field they break; the flow table's reference counts stay
//! right; client counters lose nothing; the initiation limiter holds its
//! rate.

use std::collections::HashMap;

use proptest::prelude::*;
use smbdirect_protocol::ntstatus::{
    NtStatus, STATUS_INSUFFICIENT_RESOURCES, STATUS_INVALID_DEVICE_REQUEST,
    STATUS_INVALID_PARAMETER, STATUS_NOT_FOUND, STATUS_REVISION_MISMATCH,
};
use smbdirect_protocol::sqos::client::{InitiationLimiter, LogicalFlow};
use smbdirect_protocol::sqos::server::{
    process_request, LogicalFlowTable, OpenKind, OpenQosState, Policy, PolicyKind, ServerConfig,
};
use smbdirect_protocol::sqos::{
    normalized_io_size, Dialect, FlowStatus, Guid, Options, StorageQosControlRequest,
    StorageQosControlRequestRepr, StorageQosControlResponse, StorageQosControlResponseRepr,
    Utf16Name,
};
use smbdirect_protocol::time::{Duration, Instant};

const POOL: [Guid; 3] = [
    Guid::from_fields(1, 1, 1, [1; 8]),
    Guid::from_fields(2, 2, 2, [2; 8]),
    Guid::from_fields(3, 3, 3, [3; 8]),
];
const KNOWN_POLICY: Guid = Guid::from_fields(0x90, 0, 0, [9; 8]);

fn policies() -> HashMap<Guid, Policy> {
    let mut p = HashMap::new();
    p.insert(
        KNOWN_POLICY,
        Policy {
            kind: PolicyKind::Aggregated,
            minimum_iops: 10,
            maximum_iops: 100,
            maximum_bandwidth: 50,
        },
    );
    p
}

/// Every status [MS-SQOS] 3.2.5.1 can answer with, plus the resource-limit
/// status of this implementation.
fn is_spec_status(s: NtStatus) -> bool {
    [
        STATUS_INVALID_DEVICE_REQUEST,
        STATUS_REVISION_MISMATCH,
        STATUS_INVALID_PARAMETER,
        STATUS_NOT_FOUND,
        STATUS_INSUFFICIENT_RESOURCES,
    ]
    .contains(&s)
}

fn arb_guid() -> impl Strategy<Value = Guid> {
    prop_oneof![
        2 => Just(Guid::NULL),
        4 => prop::sample::select(POOL.to_vec()),
        1 => Just(KNOWN_POLICY),
        2 => any::<[u8; 16]>().prop_map(Guid::from_bytes),
    ]
}

fn arb_name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[A-Za-z0-9.-]{1,40}",
        prop::collection::vec(any::<char>(), 0..100)
            .prop_map(|v| v.into_iter().collect::<String>()),
    ]
    .prop_filter("fits STORAGE_QOS_INITIATOR_NAME_SIZE", |s| {
        s.encode_utf16().count() <= 256
    })
}

fn arb_small_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        1u64..1000,
        Just(1_000_000_000),
        Just(1_000_000_001),
        any::<u64>()
    ]
}

/// The owned parts of a request (a Repr borrows its names).
#[derive(Debug, Clone)]
struct Req {
    dialect: Dialect,
    options: u32,
    flow: Guid,
    policy: Guid,
    initiator: Guid,
    limit: u64,
    reservation: u64,
    counters: [u64; 4],
    bandwidth_limit: u64,
    kilobytes: u64,
    name: String,
    node_name: String,
}

impl Req {
    fn repr(&self) -> StorageQosControlRequestRepr<'_> {
        let v11 = self.dialect == Dialect::V1_1;
        StorageQosControlRequestRepr {
            dialect: self.dialect,
            options: Options::from_bits(self.options),
            logical_flow_id: self.flow,
            policy_id: self.policy,
            initiator_id: self.initiator,
            limit: self.limit,
            reservation: self.reservation,
            io_count_increment: self.counters[0],
            normalized_io_count_increment: self.counters[1],
            latency_increment: self.counters[2],
            lower_latency_increment: self.counters[3],
            bandwidth_limit: if v11 { self.bandwidth_limit } else { 0 },
            kilobyte_count_increment: if v11 { self.kilobytes } else { 0 },
            initiator_name: Utf16Name::new(&self.name).expect("filtered"),
            initiator_node_name: Utf16Name::new(&self.node_name).expect("filtered"),
        }
    }
}

fn arb_req() -> impl Strategy<Value = Req> {
    (
        prop_oneof![Just(Dialect::V1_0), Just(Dialect::V1_1)],
        prop_oneof![4 => 1u32..0x20, 1 => any::<u32>()],
        (arb_guid(), arb_guid(), arb_guid()),
        (arb_small_u64(), arb_small_u64(), arb_small_u64()),
        any::<[u64; 4]>(),
        any::<u64>(),
        (arb_name(), arb_name()),
    )
        .prop_map(
            |(
                dialect,
                options,
                (flow, policy, initiator),
                (limit, reservation, bandwidth_limit),
                counters,
                kilobytes,
                (name, node_name),
            )| Req {
                dialect,
                options,
                flow,
                policy,
                initiator,
                limit,
                reservation,
                counters,
                bandwidth_limit,
                kilobytes,
                name,
                node_name,
            },
        )
}

fn arb_response() -> impl Strategy<Value = StorageQosControlResponseRepr> {
    (
        prop_oneof![Just(Dialect::V1_0), Just(Dialect::V1_1)],
        (arb_guid(), arb_guid(), arb_guid()),
        any::<u32>(),
        any::<u32>(),
        any::<[u64; 3]>(),
        any::<u32>(),
    )
        .prop_map(|(dialect, (f, p, i), ttl, status, [max, min, bw], base)| {
            StorageQosControlResponseRepr {
                dialect,
                logical_flow_id: f,
                policy_id: p,
                initiator_id: i,
                time_to_live: ttl,
                status: FlowStatus::from_wire(status),
                maximum_io_rate: max,
                minimum_io_rate: min,
                base_io_size: base,
                maximum_bandwidth: if dialect == Dialect::V1_1 { bw } else { 0 },
            }
        })
}

/// A server whose table holds POOL[0] with one associated Open.
fn server_with_associated_open() -> (LogicalFlowTable, OpenQosState) {
    let mut table = LogicalFlowTable::new(ServerConfig::default());
    let mut open = OpenQosState::new();
    let assoc =
        StorageQosControlRequestRepr::new(Dialect::V1_1, Options::SET_LOGICAL_FLOW_ID, POOL[0])
            .to_vec();
    let r = process_request(
        &mut table,
        &mut open,
        OpenKind::File,
        &assoc,
        96,
        Instant::ZERO,
        &policies(),
    );
    assert_eq!(r, Ok(None));
    (table, open)
}

/// One structure-aware change to an encoded request.
#[derive(Debug, Clone)]
enum Mutation {
    U16 { at: usize, value: u16 },
    U32 { at: usize, value: u32 },
    U64 { at: usize, value: u64 },
    Guid { at: usize, value: [u8; 16] },
    Truncate { len: usize },
    Extend { bytes: Vec<u8> },
    Xor { at: usize, mask: u8 },
}

fn arb_mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (
            prop::sample::select(vec![0usize, 2, 72, 74, 76, 78]),
            any::<u16>()
        )
            .prop_map(|(at, value)| Mutation::U16 { at, value }),
        (Just(4usize), any::<u32>()).prop_map(|(at, value)| Mutation::U32 { at, value }),
        (
            prop::sample::select(vec![56usize, 64, 80, 88, 96, 104, 112, 120]),
            arb_small_u64()
        )
            .prop_map(|(at, value)| Mutation::U64 { at, value }),
        (
            prop::sample::select(vec![8usize, 24, 40]),
            any::<[u8; 16]>()
        )
            .prop_map(|(at, value)| Mutation::Guid { at, value }),
        (0usize..260).prop_map(|len| Mutation::Truncate { len }),
        prop::collection::vec(any::<u8>(), 1..64).prop_map(|bytes| Mutation::Extend { bytes }),
        (0usize..260, 1u8..=255).prop_map(|(at, mask)| Mutation::Xor { at, mask }),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    let mut put = |at: usize, v: &[u8]| {
        if let Some(dst) = bytes.get_mut(at..at + v.len()) {
            dst.copy_from_slice(v);
        }
    };
    match m {
        Mutation::U16 { at, value } => put(*at, &value.to_le_bytes()),
        Mutation::U32 { at, value } => put(*at, &value.to_le_bytes()),
        Mutation::U64 { at, value } => put(*at, &value.to_le_bytes()),
        Mutation::Guid { at, value } => put(*at, value),
        Mutation::Truncate { len } => bytes.truncate(*len),
        Mutation::Extend { bytes: more } => bytes.extend_from_slice(more),
        Mutation::Xor { at, mask } => {
            if let Some(b) = bytes.get_mut(*at) {
                *b ^= mask;
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn request_repr_round_trips(req in arb_req()) {
        let repr = req.repr();
        let bytes = repr.to_vec();
        prop_assert_eq!(bytes.len(), repr.buffer_len());
        let view = StorageQosControlRequest::new_checked(&bytes[..]).unwrap();
        prop_assert_eq!(StorageQosControlRequestRepr::parse(&view).unwrap(), repr);
    }

    #[test]
    fn response_repr_round_trips(rsp in arb_response()) {
        let bytes = rsp.to_vec();
        prop_assert_eq!(bytes.len(), rsp.dialect.response_len());
        let view = StorageQosControlResponse::new_checked(&bytes[..]).unwrap();
        prop_assert_eq!(StorageQosControlResponseRepr::parse(&view).unwrap(), rsp);
    }

    #[test]
    fn random_bytes_never_panic_the_decoders(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        if let Ok(view) = StorageQosControlRequest::new_checked(&bytes[..]) {
            prop_assert!(bytes.len() >= view.dialect().request_fixed_len());
            let _ = view.initiator_name();
            let _ = view.initiator_node_name();
            if let Ok(repr) = StorageQosControlRequestRepr::parse(&view) {
                let _ = repr.initiator_name.to_string_lossy();
                prop_assert!(repr.buffer_len() <= repr.dialect.request_fixed_len() + 1024);
            }
        }
        if let Ok(view) = StorageQosControlResponse::new_checked(&bytes[..]) {
            let repr = StorageQosControlResponseRepr::parse(&view).unwrap();
            prop_assert_eq!(&repr.to_vec()[..56], &bytes[..56].iter().enumerate()
                .map(|(i, &b)| if (2..8).contains(&i) { 0 } else { b }).collect::<Vec<u8>>()[..]);
        }
        // Unchecked views read zeros instead of panicking.
        let v = StorageQosControlRequest::new_unchecked(&bytes[..]);
        let _ = (v.kilobyte_count_increment(), v.initiator_name(), v.logical_flow_id());
        let r = StorageQosControlResponse::new_unchecked(&bytes[..]);
        let _ = (r.maximum_bandwidth(), r.status());
    }

    #[test]
    fn random_bytes_get_a_spec_status(
        bytes in prop::collection::vec(any::<u8>(), 0..300),
        version in prop_oneof![Just(None), Just(Some(0x0100u16)), Just(Some(0x0101u16))],
        max_response in prop_oneof![Just(0u32), 0u32..200, Just(u32::MAX)],
        associated in any::<bool>(),
    ) {
        let mut bytes = bytes;
        if let (Some(v), true) = (version, bytes.len() >= 2) {
            bytes[..2].copy_from_slice(&v.to_le_bytes());
        }
        let (mut table, mut open) = if associated {
            server_with_associated_open()
        } else {
            (LogicalFlowTable::new(ServerConfig::default()), OpenQosState::new())
        };
        let r = process_request(&mut table, &mut open, OpenKind::File, &bytes, max_response, Instant::ZERO, &policies());
        match r {
            Ok(Some(rsp)) => {
                let v = u16::from_le_bytes([bytes[0], bytes[1]]);
                prop_assert_eq!(rsp.dialect.to_wire(), v);
                prop_assert!(max_response as usize >= rsp.buffer_len());
                prop_assert!(rsp.time_to_live > 0);
                prop_assert!(rsp.status.is_defined());
            }
            Ok(None) => {}
            Err(s) => prop_assert!(is_spec_status(s) && s != STATUS_INVALID_DEVICE_REQUEST, "{:?}", s),
        }
    }

    #[test]
    fn one_mutated_field_of_a_valid_request_gets_a_spec_status(
        req in arb_req(),
        m in arb_mutation(),
        associated in any::<bool>(),
    ) {
        let mut bytes = req.repr().to_vec();
        apply(&mut bytes, &m);
        let (mut table, mut open) = if associated {
            server_with_associated_open()
        } else {
            (LogicalFlowTable::new(ServerConfig::default()), OpenQosState::new())
        };
        let before = open.logical_flow_id();
        let r = process_request(&mut table, &mut open, OpenKind::File, &bytes, 96, Instant::ZERO, &policies());
        if let Err(s) = r {
            prop_assert!(is_spec_status(s), "{:?}", s);
            prop_assert_eq!(open.logical_flow_id(), before, "a failed request changes nothing");
        }
        // Oracles for the fields decided first.
        let version = bytes.get(..2).map(|b| u16::from_le_bytes([b[0], b[1]]));
        match version {
            None => prop_assert_eq!(r, Err(STATUS_INVALID_PARAMETER)),
            Some(v) => match Dialect::from_wire(v) {
                None => prop_assert_eq!(r, Err(STATUS_REVISION_MISMATCH)),
                Some(d) if bytes.len() < d.request_fixed_len() => prop_assert_eq!(r, Err(STATUS_INVALID_PARAMETER)),
                Some(_) => {
                    let options = Options::from_bits(u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]));
                    if !options.has_defined_flag() {
                        prop_assert_eq!(r, Err(STATUS_INVALID_PARAMETER));
                    }
                }
            },
        }
        // Table invariant: each flow's open count matches the Open.
        for flow in table.iter() {
            let expected = usize::from(open.logical_flow_id() == Some(flow.logical_flow_id()));
            prop_assert_eq!(flow.open_count(), expected);
        }
    }

    #[test]
    fn normalized_io_size_matches_the_4_1_formula(size in any::<u32>(), base in 1u32..=1 << 20) {
        prop_assert_eq!(normalized_io_size(u64::from(size), base), spec_formula(u64::from(size), u64::from(base)));
    }

    #[test]
    fn guid_text_round_trips(bytes in any::<[u8; 16]>()) {
        let g = Guid::from_bytes(bytes);
        prop_assert_eq!(g.to_string().parse::<Guid>(), Ok(g));
        prop_assert_eq!(format!("{g:#}").to_uppercase().parse::<Guid>(), Ok(g));
    }
}

/// [MS-SQOS] 4.1's formula, spelled as the specification spells it.
#[allow(clippy::manual_div_ceil)]
fn spec_formula(io_size_in_bytes: u64, base_io_size: u64) -> u64 {
    (io_size_in_bytes + base_io_size - 1) / base_io_size
}

/// What a table-level property step does.
#[derive(Debug, Clone)]
enum Op {
    Associate { open: usize, flow: usize },
    Disassociate { open: usize },
    Probe { open: usize, flow: usize },
    Counters { open: usize },
    Status { open: usize },
    Close { open: usize },
    Advance { secs: u64 },
    Expire,
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0usize..4, 0usize..3).prop_map(|(open, flow)| Op::Associate { open, flow }),
        (0usize..4).prop_map(|open| Op::Disassociate { open }),
        (0usize..4, 0usize..3).prop_map(|(open, flow)| Op::Probe { open, flow }),
        (0usize..4).prop_map(|open| Op::Counters { open }),
        (0usize..4).prop_map(|open| Op::Status { open }),
        (0usize..4).prop_map(|open| Op::Close { open }),
        (0u64..90).prop_map(|secs| Op::Advance { secs }),
        Just(Op::Expire),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn flow_table_reference_counts_follow_the_opens(ops in prop::collection::vec(arb_op(), 1..60)) {
        let config = ServerConfig { max_flows: 2, ..ServerConfig::default() };
        let mut table = LogicalFlowTable::new(config);
        let mut opens: Vec<OpenQosState> = (0..4).map(|_| OpenQosState::new()).collect();
        let mut now = Instant::ZERO;
        let p = policies();
        let mut counted = 0u64;
        for op in ops {
            let mut send = |open: &mut OpenQosState, repr: StorageQosControlRequestRepr<'_>, now| {
                process_request(&mut table, open, OpenKind::File, &repr.to_vec(), 96, now, &p)
            };
            let r = match op {
                Op::Associate { open, flow } => send(&mut opens[open],
                    StorageQosControlRequestRepr::new(Dialect::V1_1, Options::SET_LOGICAL_FLOW_ID, POOL[flow]), now),
                Op::Disassociate { open } => send(&mut opens[open],
                    StorageQosControlRequestRepr::new(Dialect::V1_1, Options::SET_LOGICAL_FLOW_ID, Guid::NULL), now),
                Op::Probe { open, flow } => send(&mut opens[open], StorageQosControlRequestRepr {
                    policy_id: KNOWN_POLICY,
                    ..StorageQosControlRequestRepr::new(Dialect::V1_1, Options::PROBE_POLICY | Options::GET_STATUS, POOL[flow])
                }, now),
                Op::Counters { open } => {
                    let r = send(&mut opens[open], StorageQosControlRequestRepr {
                        io_count_increment: 1,
                        ..StorageQosControlRequestRepr::new(Dialect::V1_1, Options::UPDATE_COUNTERS, Guid::NULL)
                    }, now);
                    if r.is_ok() { counted += 1; }
                    r
                }
                Op::Status { open } => send(&mut opens[open],
                    StorageQosControlRequestRepr::new(Dialect::V1_1, Options::GET_STATUS, Guid::NULL), now),
                Op::Close { open } => { table.close_open(&mut opens[open], now); Ok(None) }
                Op::Advance { secs } => { now = now + Duration::from_secs(secs); Ok(None) }
                Op::Expire => { table.expire(now); Ok(None) }
            };
            if let Err(s) = r {
                prop_assert!(is_spec_status(s), "{:?}", s);
            }
            // Every associated Open's flow exists, and every flow counts
            // exactly the Opens associated to it.
            for open in &opens {
                if let Some(id) = open.logical_flow_id() {
                    prop_assert!(table.get(&id).is_some(), "a referenced flow was removed");
                }
            }
            for flow in table.iter() {
                let n = opens.iter().filter(|o| o.logical_flow_id() == Some(flow.logical_flow_id())).count();
                prop_assert_eq!(flow.open_count(), n);
            }
            prop_assert!(table.len() <= 2);
            if let Some(at) = table.poll_timeout() {
                prop_assert!(table.iter().any(|f| f.open_count() == 0));
                let _ = at;
            }
        }
        let total: u64 = table.iter().map(|f| f.counters().io_count).sum();
        prop_assert!(total <= counted);
    }

    #[test]
    fn client_counters_lose_nothing_across_requests(
        ios in prop::collection::vec((0u64..(4 << 20), 0u64..10_000_000, any::<bool>()), 0..80),
    ) {
        let n = ios.len() as u64;
        let mut f = LogicalFlow::new(POOL[0], Dialect::V1_1);
        let (mut ios_sent, mut norm_sent, mut kb_sent, mut lat_sent) = (0u64, 0u64, 0u64, 0u64);
        let (mut bytes_total, mut lat_total, mut norm_total) = (0u64, 0u64, 0u64);
        let mut now = Instant::ZERO;
        for (size, lat_ns, send_after) in ios {
            f.record_io(size, Duration::from_nanos(lat_ns), Duration::from_nanos(lat_ns / 2));
            bytes_total += size;
            lat_total += lat_ns;
            norm_total += normalized_io_size(size, 8192);
            if send_after {
                now = now + Duration::from_millis(1);
                let r = f.status_request(now).repr;
                ios_sent += r.io_count_increment;
                norm_sent += r.normalized_io_count_increment;
                kb_sent += r.kilobyte_count_increment;
                lat_sent += r.latency_increment;
                prop_assert_eq!(f.io_count_increment(), 0);
                prop_assert_eq!(f.kilobyte_count_increment(), 0);
                f.handle_response(Ok(&[]), now).unwrap();
            }
        }
        let r = f.status_request(now).repr;
        ios_sent += r.io_count_increment;
        norm_sent += r.normalized_io_count_increment;
        kb_sent += r.kilobyte_count_increment;
        lat_sent += r.latency_increment;
        prop_assert_eq!(norm_sent, norm_total);
        prop_assert_eq!(kb_sent, bytes_total / 1024);
        prop_assert_eq!(lat_sent, lat_total / 100);
        prop_assert_eq!(ios_sent, n);
    }

    #[test]
    fn initiation_limiter_never_exceeds_its_rate(
        rate in 1u64..5000,
        bandwidth in prop_oneof![Just(0u64), 1u64..100_000],
        sizes in prop::collection::vec(1u64..(1 << 20), 1..40),
        seconds in 1u64..5,
    ) {
        let burst = InitiationLimiter::DEFAULT_BURST;
        let mut l = InitiationLimiter::new(burst);
        l.set_limits(rate, bandwidth, 8192);
        let end = Instant::ZERO + Duration::from_secs(seconds);
        let mut now = Instant::ZERO;
        let (mut normalized, mut bytes, mut count, mut i) = (0u64, 0u64, 0u64, 0usize);
        let mut last_size = 0;
        while now < end && count < 200_000 {
            let size = sizes[i % sizes.len()];
            match l.may_initiate(now, size) {
                Ok(()) => {
                    normalized += normalized_io_size(size, 8192);
                    bytes += size;
                    count += 1;
                    i += 1;
                    last_size = size;
                }
                Err(at) => {
                    prop_assert!(at > now);
                    now = at;
                }
            }
        }
        let elapsed = seconds as f64 + burst.as_secs_f64();
        // At most the rate over the run plus the burst, plus the one I/O
        // that may overdraw the bucket.
        let max_norm = (rate as f64 * elapsed).ceil() as u64 + normalized_io_size(last_size.max(1 << 20), 8192);
        prop_assert!(normalized <= max_norm, "{} > {}", normalized, max_norm);
        if bandwidth > 0 {
            let max_bytes = (bandwidth as f64 * 1024.0 * elapsed).ceil() as u64 + (1 << 20);
            prop_assert!(bytes <= max_bytes, "{} > {}", bytes, max_bytes);
        }
    }
}
