//! [MS-SQOS] 3.1 client: initialization, counters, request building,
//! response handling, the StatusRequestTimer and the initiation limit.

use std::collections::HashMap;

use smbdirect_protocol::ntstatus::{
    STATUS_INVALID_PARAMETER, STATUS_NOT_FOUND, STATUS_REVISION_MISMATCH,
};
use smbdirect_protocol::sqos::client::{LogicalFlow, PolicyParams};
use smbdirect_protocol::sqos::server::{
    process_request, LogicalFlowTable, OpenKind, OpenQosState, Policy, PolicyKind, ServerConfig,
};
use smbdirect_protocol::sqos::{
    Dialect, FlowStatus, Guid, Options, StorageQosControlRequest, StorageQosControlResponseRepr,
    Utf16Name,
};
use smbdirect_protocol::time::{Duration, Instant};

const FLOW: Guid = Guid::from_fields(
    0xb13a32e4,
    0xe2ad,
    0x5db2,
    [0xa4, 0xf8, 0x5c, 0xd3, 0xbe, 0x9d, 0x69, 0x6e],
);
const POLICY: Guid = Guid::from_fields(
    0x04b4f24e,
    0xb3e9,
    0x4594,
    [0xad, 0xaa, 0xe3, 0x27, 0x52, 0x8d, 0xe5, 0x4b],
);

fn t(ms: u64) -> Instant {
    Instant::ZERO + Duration::from_millis(ms)
}

fn response(dialect: Dialect, ttl: u32, max_io: u64, max_bw: u64, base: u32) -> Vec<u8> {
    StorageQosControlResponseRepr {
        dialect,
        logical_flow_id: FLOW,
        policy_id: POLICY,
        initiator_id: Guid::NULL,
        time_to_live: ttl,
        status: FlowStatus::Ok,
        maximum_io_rate: max_io,
        minimum_io_rate: 0,
        base_io_size: base,
        maximum_bandwidth: max_bw,
    }
    .to_vec()
}

/// A 1.1 flow whose handle the server has associated.
fn associated_flow() -> LogicalFlow {
    let mut f = LogicalFlow::new(FLOW, Dialect::V1_1);
    let _ = f.status_request(t(0));
    f.handle_response(Ok(&response(Dialect::V1_1, 4000, 0, 0, 8192)), t(0))
        .unwrap();
    assert!(f.is_associated());
    f
}

#[test]
fn new_flow_starts_with_zero_counters_base_io_size_8192_and_no_timer() {
    let f = LogicalFlow::new(FLOW, Dialect::HIGHEST);
    assert_eq!(f.dialect(), Dialect::V1_1);
    assert_eq!(
        (
            f.io_count_increment(),
            f.normalized_io_count_increment(),
            f.latency_increment(),
            f.lower_latency_increment(),
            f.kilobyte_count_increment()
        ),
        (0, 0, 0, 0, 0)
    );
    assert_eq!((f.maximum_io_rate(), f.maximum_bandwidth()), (0, 0));
    assert_eq!(f.base_io_size(), 8192);
    assert_eq!(f.poll_timeout(), None, "StatusRequestTimer never expires");
}

#[test]
fn record_io_accumulates_counters_in_adm_units() {
    let mut f = LogicalFlow::new(FLOW, Dialect::V1_1);
    f.record_io(4096, Duration::from_micros(150), Duration::from_micros(100));
    f.record_io(
        65536,
        Duration::from_micros(250),
        Duration::from_micros(200),
    );
    assert_eq!(f.io_count_increment(), 2);
    assert_eq!(f.normalized_io_count_increment(), 1 + 8);
    assert_eq!(f.latency_increment(), 4000, "400 us in 100 ns units");
    assert_eq!(f.lower_latency_increment(), 3000);
    assert_eq!(f.kilobyte_count_increment(), 68, "69632 bytes / 1024");
}

#[test]
fn counters_reset_after_each_request() {
    let mut f = associated_flow();
    f.record_io(8192, Duration::from_micros(10), Duration::from_micros(5));
    let r = f.status_request(t(10)).repr;
    assert_eq!(
        (
            r.io_count_increment,
            r.normalized_io_count_increment,
            r.latency_increment,
            r.lower_latency_increment
        ),
        (1, 1, 100, 50)
    );
    assert_eq!(r.kilobyte_count_increment, 8);
    assert_eq!(
        (
            f.io_count_increment(),
            f.normalized_io_count_increment(),
            f.latency_increment(),
            f.lower_latency_increment(),
            f.kilobyte_count_increment()
        ),
        (0, 0, 0, 0, 0)
    );
    // The next request carries only what happened since.
    f.handle_response(Ok(&[]), t(11)).unwrap();
    f.record_io(512, Duration::ZERO, Duration::ZERO);
    let r = f.status_request(t(12)).repr;
    assert_eq!(
        (r.io_count_increment, r.normalized_io_count_increment),
        (1, 1)
    );
}

#[test]
fn sub_unit_remainders_carry_to_the_next_request() {
    let mut f = associated_flow();
    f.record_io(1000, Duration::from_nanos(150), Duration::from_nanos(99));
    let r = f.status_request(t(1)).repr;
    assert_eq!(
        (
            r.kilobyte_count_increment,
            r.latency_increment,
            r.lower_latency_increment
        ),
        (0, 1, 0)
    );
    f.handle_response(Ok(&[]), t(1)).unwrap();
    f.record_io(1000, Duration::from_nanos(50), Duration::from_nanos(1));
    let r = f.status_request(t(2)).repr;
    assert_eq!(
        (
            r.kilobyte_count_increment,
            r.latency_increment,
            r.lower_latency_increment
        ),
        (1, 1, 1)
    );
}

#[test]
fn request_on_unassociated_handle_includes_set_logical_flow_id() {
    let mut f = LogicalFlow::new(FLOW, Dialect::V1_1);
    let r = f.status_request(t(0)).repr;
    assert!(r.options.contains(Options::SET_LOGICAL_FLOW_ID));
    assert_eq!(r.logical_flow_id, FLOW);
    assert!(!r.logical_flow_id.is_null());
    // Once the server confirmed it, later requests do not re-associate.
    f.handle_response(Ok(&response(Dialect::V1_1, 4000, 0, 0, 8192)), t(1))
        .unwrap();
    let r = f.status_request(t(2)).repr;
    assert!(!r.options.contains(Options::SET_LOGICAL_FLOW_ID));
}

#[test]
fn every_request_carries_update_counters() {
    let mut f = associated_flow();
    for r in [
        f.status_request(t(1)).repr,
        f.set_policy_request(PolicyParams::default(), t(2)).repr,
        f.probe_policy_request(PolicyParams::default(), t(3)).repr,
        f.request(Options::NONE, None, t(4)).repr,
    ] {
        assert!(
            r.options.contains(Options::UPDATE_COUNTERS),
            "{:?}",
            r.options
        );
        assert!(r.options.has_defined_flag());
    }
}

#[test]
fn probe_policy_request_carries_a_non_empty_logical_flow_id() {
    let mut f = LogicalFlow::new(FLOW, Dialect::V1_1);
    let params = PolicyParams {
        policy_id: POLICY,
        initiator_name: Utf16Name::new("TEST-VM").unwrap(),
        ..PolicyParams::default()
    };
    let r = f.probe_policy_request(params, t(0)).repr;
    assert!(r
        .options
        .contains(Options::PROBE_POLICY | Options::GET_STATUS));
    assert_eq!(r.logical_flow_id, FLOW);
    assert_eq!(r.policy_id, POLICY);
    assert_eq!(r.initiator_name.to_string_lossy(), "TEST-VM");
}

#[test]
fn get_status_request_allows_the_full_response_size() {
    for (dialect, size) in [(Dialect::V1_0, 88), (Dialect::V1_1, 96)] {
        let mut f = LogicalFlow::new(FLOW, dialect);
        let req = f.status_request(t(0));
        assert!(req.repr.options.contains(Options::GET_STATUS));
        assert_eq!(req.max_response_size, size);
        assert!(req.max_response_size >= 80);
    }
}

#[test]
fn request_protocol_version_is_the_client_dialect() {
    for dialect in [Dialect::V1_0, Dialect::V1_1] {
        let mut f = LogicalFlow::new(FLOW, dialect);
        let bytes = f.status_request(t(0)).repr.to_vec();
        let view = StorageQosControlRequest::new_checked(&bytes[..]).unwrap();
        assert_eq!(view.protocol_version(), dialect.to_wire());
        assert_eq!(bytes.len(), dialect.request_fixed_len());
    }
}

#[test]
fn dialect_1_0_request_omits_bandwidth_and_kilobytes() {
    let mut f = LogicalFlow::new(FLOW, Dialect::V1_0);
    f.record_io(1 << 20, Duration::ZERO, Duration::ZERO);
    let params = PolicyParams {
        bandwidth_limit: 500,
        limit: 10,
        ..PolicyParams::default()
    };
    let r = f.set_policy_request(params, t(0)).repr;
    assert_eq!(
        (r.bandwidth_limit, r.kilobyte_count_increment, r.limit),
        (0, 0, 10)
    );
    assert_eq!(r.to_vec().len(), 112);
    assert_eq!(
        f.kilobyte_count_increment(),
        0,
        "reset like the other counters"
    );
}

#[test]
fn successful_response_sets_maximum_io_rate_bandwidth_and_base_io_size() {
    let mut f = associated_flow();
    let _ = f.status_request(t(1));
    let rsp = f
        .handle_response(Ok(&response(Dialect::V1_1, 3981, 100, 200, 4096)), t(2))
        .unwrap()
        .unwrap();
    assert_eq!(rsp.maximum_io_rate, 100);
    assert_eq!(
        (f.maximum_io_rate(), f.maximum_bandwidth(), f.base_io_size()),
        (100, 200, 4096)
    );
    assert_eq!(f.last_status(), Some(FlowStatus::Ok));
}

#[test]
fn dialect_1_0_client_keeps_maximum_bandwidth_zero() {
    let mut f = LogicalFlow::new(FLOW, Dialect::V1_0);
    let _ = f.status_request(t(0));
    f.handle_response(Ok(&response(Dialect::V1_1, 3981, 100, 200, 8192)), t(1))
        .unwrap();
    assert_eq!((f.maximum_io_rate(), f.maximum_bandwidth()), (100, 0));
}

#[test]
fn base_io_size_zero_in_a_response_is_ignored() {
    let mut f = associated_flow();
    let _ = f.status_request(t(1));
    f.handle_response(Ok(&response(Dialect::V1_1, 3981, 100, 0, 0)), t(2))
        .unwrap();
    assert_eq!(f.base_io_size(), 8192);
}

#[test]
fn time_to_live_above_1000_ms_arms_the_timer_for_time_to_live() {
    let mut f = associated_flow();
    let _ = f.status_request(t(100));
    f.handle_response(Ok(&response(Dialect::V1_1, 1001, 0, 0, 8192)), t(200))
        .unwrap();
    assert_eq!(f.poll_timeout(), Some(t(200 + 1001)));
    let _ = f.status_request(t(300));
    f.handle_response(Ok(&response(Dialect::V1_1, 3981, 0, 0, 8192)), t(400))
        .unwrap();
    assert_eq!(f.poll_timeout(), Some(t(400 + 3981)));
}

#[test]
fn time_to_live_of_1000_ms_or_less_arms_the_timer_for_1_second() {
    for ttl in [0, 1, 999, 1000] {
        let mut f = associated_flow();
        let _ = f.status_request(t(100));
        f.handle_response(Ok(&response(Dialect::V1_1, ttl, 0, 0, 8192)), t(200))
            .unwrap();
        assert_eq!(f.poll_timeout(), Some(t(1200)), "TimeToLive {ttl}");
    }
}

#[test]
fn failed_response_arms_the_timer_for_10_seconds() {
    let mut f = associated_flow();
    let _ = f.status_request(t(100));
    assert_eq!(
        f.handle_response(Err(STATUS_INVALID_PARAMETER), t(500)),
        Ok(None)
    );
    assert_eq!(f.poll_timeout(), Some(t(10_500)));
}

#[test]
fn unparseable_response_is_handled_as_a_failure() {
    let mut f = associated_flow();
    let _ = f.status_request(t(100));
    let mut short = response(Dialect::V1_1, 4000, 1, 1, 8192);
    short.truncate(90);
    assert!(f.handle_response(Ok(&short), t(500)).is_err());
    assert_eq!(f.poll_timeout(), Some(t(10_500)));
    assert_eq!(f.maximum_io_rate(), 0);
}

#[test]
fn set_policy_request_includes_get_status() {
    let mut f = associated_flow();
    let r = f
        .set_policy_request(
            PolicyParams {
                policy_id: POLICY,
                ..PolicyParams::default()
            },
            t(1),
        )
        .repr;
    assert!(r
        .options
        .contains(Options::SET_POLICY | Options::GET_STATUS));
}

#[test]
fn set_policy_without_get_status_arms_the_timer_within_1_second() {
    let mut f = associated_flow();
    let _ = f.request(Options::SET_POLICY, Some(PolicyParams::default()), t(5000));
    assert!(f.poll_timeout().unwrap() <= t(6000));
    // An earlier deadline is kept.
    let mut f = associated_flow();
    let _ = f.status_request(t(0));
    f.handle_response(Ok(&response(Dialect::V1_1, 0, 0, 0, 8192)), t(0))
        .unwrap(); // timer at 1000
    let _ = f.request(Options::SET_POLICY, None, t(500));
    assert_eq!(f.poll_timeout(), Some(t(1000)));
}

#[test]
fn expired_timer_issues_get_status_and_update_counters() {
    let mut f = associated_flow();
    let deadline = f.poll_timeout().unwrap();
    assert_eq!(deadline, t(4000));
    assert!(f.handle_timeout(t(3999)).is_none());
    let req = f.handle_timeout(deadline).expect("status request due");
    assert!(req
        .repr
        .options
        .contains(Options::GET_STATUS | Options::UPDATE_COUNTERS));
    assert_eq!(f.poll_timeout(), None, "stopped until the response");
    assert!(f.request_in_flight());
}

#[test]
fn timer_does_not_fire_while_a_request_is_in_flight() {
    let mut f = associated_flow();
    let _ = f.request(Options::SET_POLICY, None, t(100)); // arms the timer at 1100
    assert!(f.handle_timeout(t(2000)).is_none());
    f.handle_response(Ok(&[]), t(2001)).unwrap();
    assert!(f.handle_timeout(t(2001)).is_some());
}

#[test]
fn revision_mismatch_falls_back_to_dialect_1_0() {
    let mut f = LogicalFlow::new(FLOW, Dialect::V1_1);
    let _ = f.status_request(t(0));
    f.handle_response(Err(STATUS_REVISION_MISMATCH), t(1))
        .unwrap();
    assert_eq!(f.dialect(), Dialect::V1_0);
    assert_eq!(f.status_request(t(2)).repr.to_vec().len(), 112);
}

#[test]
fn not_found_makes_the_next_request_reassociate() {
    let mut f = associated_flow();
    let _ = f.status_request(t(1));
    f.handle_response(Err(STATUS_NOT_FOUND), t(2)).unwrap();
    assert!(!f.is_associated());
    assert!(f
        .status_request(t(3))
        .repr
        .options
        .contains(Options::SET_LOGICAL_FLOW_ID));
}

#[test]
fn disassociate_request_uses_an_empty_logical_flow_id() {
    let mut f = associated_flow();
    f.record_io(4096, Duration::ZERO, Duration::ZERO);
    let req = f.disassociate_request(t(1));
    assert_eq!(req.repr.options, Options::SET_LOGICAL_FLOW_ID);
    assert!(req.repr.logical_flow_id.is_null());
    assert_eq!(f.io_count_increment(), 0);
    f.handle_response(Ok(&[]), t(2)).unwrap();
    assert!(!f.is_associated());
}

#[test]
fn initiation_limit_is_the_minimum_of_io_rate_and_bandwidth() {
    let mut f = associated_flow();
    let _ = f.status_request(t(1));
    // 4.3's values: 100 normalized IOPS and 200 KB/s.
    f.handle_response(Ok(&response(Dialect::V1_1, 3981, 100, 200, 8192)), t(2))
        .unwrap();
    assert_eq!(
        f.allowed_ios_per_sec(8192),
        Some(25.0),
        "200 KiB/s of 8 KiB I/Os"
    );
    assert_eq!(
        f.allowed_ios_per_sec(1024),
        Some(100.0),
        "the I/O rate binds"
    );
    assert_eq!(f.allowed_ios_per_sec(65536), Some(3.125));
}

#[test]
fn initiation_is_unlimited_while_both_limits_are_zero() {
    let mut f = LogicalFlow::new(FLOW, Dialect::V1_1);
    assert_eq!(f.allowed_ios_per_sec(8192), None);
    for _ in 0..10_000 {
        assert_eq!(f.may_initiate(t(0), 1 << 20), Ok(()));
    }
}

#[test]
fn may_initiate_paces_ios_to_the_allowed_rate() {
    let mut f = associated_flow();
    let _ = f.status_request(t(1));
    f.handle_response(Ok(&response(Dialect::V1_1, 3981, 100, 200, 8192)), t(0))
        .unwrap();
    // 25 I/Os of 8 KiB per second: over 4 s about 100 (plus the burst).
    let mut now = t(0);
    let mut started = 0;
    while now < t(4000) {
        match f.may_initiate(now, 8192) {
            Ok(()) => started += 1,
            Err(next) => now = next,
        }
    }
    assert!((100..=104).contains(&started), "{started}");
}

/// The client of this module against the server of this module.
#[test]
fn client_and_server_interoperate() {
    let mut table = LogicalFlowTable::new(ServerConfig::default());
    let mut policies = HashMap::new();
    policies.insert(
        POLICY,
        Policy {
            kind: PolicyKind::Dedicated,
            minimum_iops: 10,
            maximum_iops: 100,
            maximum_bandwidth: 200,
        },
    );
    let mut open = OpenQosState::new();
    let mut f = LogicalFlow::new(FLOW, Dialect::V1_1);
    let mut now = t(0);
    let mut exchange =
        |f: &mut LogicalFlow, req: smbdirect_protocol::sqos::client::ClientRequest<'_>, now| {
            let out = process_request(
                &mut table,
                &mut open,
                OpenKind::File,
                &req.repr.to_vec(),
                req.max_response_size,
                now,
                &policies,
            );
            let bytes = out.map(|r| r.map(|r| r.to_vec()).unwrap_or_default());
            let outcome = match &bytes {
                Ok(v) => Ok(&v[..]),
                Err(e) => Err(*e),
            };
            f.handle_response(outcome, now).unwrap();
        };
    let params = PolicyParams {
        policy_id: POLICY,
        initiator_name: Utf16Name::new("TEST-VM").unwrap(),
        initiator_node_name: Utf16Name::new("HYPERV-TEST.contoso.com").unwrap(),
        ..PolicyParams::default()
    };
    let req = f.probe_policy_request(params, now);
    exchange(&mut f, req, now);
    assert!(f.is_associated());
    assert_eq!((f.maximum_io_rate(), f.maximum_bandwidth()), (100, 200));
    for _ in 0..3 {
        f.record_io(8192, Duration::from_micros(300), Duration::from_micros(200));
        now = f.poll_timeout().unwrap();
        let req = f.handle_timeout(now).unwrap();
        exchange(&mut f, req, now);
    }
    assert_eq!(f.last_status(), Some(FlowStatus::Ok));
    let counters = *table.get(&FLOW).unwrap().counters();
    assert_eq!(
        (
            counters.io_count,
            counters.normalized_io_count,
            counters.kilobyte_count
        ),
        (3, 3, 24)
    );
    assert_eq!(counters.latency, 3 * 3000);
    assert_eq!(
        table.get(&FLOW).unwrap().initiator_node_name(),
        "HYPERV-TEST.contoso.com"
    );
}
