//! [MS-SQOS] 3.2 server processing: every NTSTATUS a request can earn, and
//! the state changes of 3.2.5.1.1–3.2.5.1.4 (association, PROBE_POLICY,
//! policy, counters, status) and of a flow's lifetime.

use std::collections::HashMap;

use smbdirect_protocol::ntstatus::{
    NtStatus, STATUS_INSUFFICIENT_RESOURCES, STATUS_INVALID_DEVICE_REQUEST,
    STATUS_INVALID_PARAMETER, STATUS_NOT_FOUND, STATUS_REVISION_MISMATCH,
};
use smbdirect_protocol::sqos::server::{
    process_request, FlowReport, LogicalFlowTable, OpenKind, OpenQosState, Policy, PolicyKind,
    ServerConfig,
};
use smbdirect_protocol::sqos::{
    Dialect, FlowStatus, Guid, Options, StorageQosControlRequestRepr,
    StorageQosControlResponseRepr, Utf16Name,
};
use smbdirect_protocol::time::{Duration, Instant};

const FLOW_A: Guid = Guid::from_fields(0xAAAA_0001, 1, 1, [1; 8]);
const FLOW_B: Guid = Guid::from_fields(0xBBBB_0002, 2, 2, [2; 8]);
const POLICY_GOLD: Guid = Guid::from_fields(0x601D, 0, 0, [7; 8]);
const POLICY_SHARED: Guid = Guid::from_fields(0x5A4E, 0, 0, [8; 8]);
const POLICY_UNKNOWN: Guid = Guid::from_fields(0xDEAD, 0, 0, [9; 8]);
const INITIATOR: Guid = Guid::from_fields(0x1717, 0, 0, [3; 8]);

type Outcome = Result<Option<StorageQosControlResponseRepr>, NtStatus>;

struct Server {
    table: LogicalFlowTable,
    policies: HashMap<Guid, Policy>,
    now: Instant,
}

impl Server {
    fn new() -> Self {
        Server::with(ServerConfig::default())
    }
    fn with(config: ServerConfig) -> Self {
        let mut policies = HashMap::new();
        policies.insert(
            POLICY_GOLD,
            Policy {
                kind: PolicyKind::Dedicated,
                minimum_iops: 50,
                maximum_iops: 500,
                maximum_bandwidth: 1000,
            },
        );
        policies.insert(
            POLICY_SHARED,
            Policy {
                kind: PolicyKind::Aggregated,
                minimum_iops: 100,
                maximum_iops: 1001,
                maximum_bandwidth: 3,
            },
        );
        Server {
            table: LogicalFlowTable::new(config),
            policies,
            now: Instant::ZERO,
        }
    }
    fn send(&mut self, open: &mut OpenQosState, bytes: &[u8], max_response: u32) -> Outcome {
        process_request(
            &mut self.table,
            open,
            OpenKind::File,
            bytes,
            max_response,
            self.now,
            &self.policies,
        )
    }
    fn repr(
        &mut self,
        open: &mut OpenQosState,
        repr: &StorageQosControlRequestRepr<'_>,
    ) -> Outcome {
        self.send(open, &repr.to_vec(), 96)
    }
    fn associate(&mut self, open: &mut OpenQosState, flow: Guid) {
        assert_eq!(
            self.repr(open, &req(Options::SET_LOGICAL_FLOW_ID, flow)),
            Ok(None)
        );
    }
    fn status(&mut self, open: &mut OpenQosState) -> StorageQosControlResponseRepr {
        self.repr(open, &req(Options::GET_STATUS, Guid::NULL))
            .unwrap()
            .unwrap()
    }
    fn advance(&mut self, d: Duration) {
        self.now = self.now + d;
    }
}

fn req(options: Options, flow: Guid) -> StorageQosControlRequestRepr<'static> {
    StorageQosControlRequestRepr::new(Dialect::V1_1, options, flow)
}

fn policy_req(options: Options, flow: Guid, policy: Guid) -> StorageQosControlRequestRepr<'static> {
    StorageQosControlRequestRepr {
        policy_id: policy,
        initiator_id: INITIATOR,
        initiator_name: Utf16Name::new("vm-01").unwrap(),
        initiator_node_name: Utf16Name::new("host-01.example").unwrap(),
        ..req(options, flow)
    }
}

fn limits_req(
    limit: u64,
    reservation: u64,
    bandwidth: u64,
) -> StorageQosControlRequestRepr<'static> {
    StorageQosControlRequestRepr {
        limit,
        reservation,
        bandwidth_limit: bandwidth,
        ..policy_req(Options::SET_POLICY, FLOW_A, Guid::NULL)
    }
}

/// An Open associated to FLOW_A.
fn associated(server: &mut Server) -> OpenQosState {
    let mut open = OpenQosState::new();
    server.associate(&mut open, FLOW_A);
    open
}

fn set_u16(bytes: &mut [u8], at: usize, v: u16) {
    bytes[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

// ---- STATUS_INVALID_DEVICE_REQUEST (3.2.5.1) -----------------------------

#[test]
fn request_on_a_non_file_open_is_invalid_device_request() {
    let mut s = Server::new();
    let bytes = req(Options::SET_LOGICAL_FLOW_ID, FLOW_A).to_vec();
    for kind in [OpenKind::Directory, OpenKind::NamedPipe, OpenKind::Printer] {
        let mut open = OpenQosState::new();
        let r = process_request(
            &mut s.table,
            &mut open,
            kind,
            &bytes,
            96,
            s.now,
            &s.policies,
        );
        assert_eq!(r, Err(STATUS_INVALID_DEVICE_REQUEST), "{kind:?}");
    }
    assert!(s.table.is_empty());
}

#[test]
fn request_when_storage_qos_is_disabled_is_invalid_device_request() {
    let mut s = Server::with(ServerConfig {
        enabled: false,
        ..ServerConfig::default()
    });
    let mut open = OpenQosState::new();
    assert_eq!(
        s.repr(&mut open, &req(Options::SET_LOGICAL_FLOW_ID, FLOW_A)),
        Err(STATUS_INVALID_DEVICE_REQUEST)
    );
    // Even garbage: the function is not supported at all.
    assert_eq!(
        s.send(&mut open, &[], 96),
        Err(STATUS_INVALID_DEVICE_REQUEST)
    );
}

// ---- STATUS_REVISION_MISMATCH (3.2.5.1, note <7>) -------------------------

#[test]
fn server_dialect_is_the_highest_implemented() {
    // 3.2.3 / note <6>: 1.1; a 1.1 server serves 1.0 requests too.
    assert_eq!(ServerConfig::default().dialect, Dialect::V1_1);
    let mut s = Server::new();
    for dialect in [Dialect::V1_0, Dialect::V1_1] {
        let mut open = OpenQosState::new();
        let r = StorageQosControlRequestRepr::new(dialect, Options::SET_LOGICAL_FLOW_ID, FLOW_A);
        assert_eq!(s.repr(&mut open, &r), Ok(None));
    }
}

#[test]
fn unknown_protocol_version_is_revision_mismatch() {
    let mut s = Server::new();
    for version in [0x0000u16, 0x0001, 0x00FF, 0x0102, 0x0200, 0x1001, 0xFFFF] {
        let mut bytes = req(Options::SET_LOGICAL_FLOW_ID, FLOW_A).to_vec();
        set_u16(&mut bytes, 0, version);
        let mut open = OpenQosState::new();
        assert_eq!(
            s.send(&mut open, &bytes, 96),
            Err(STATUS_REVISION_MISMATCH),
            "0x{version:04X}"
        );
        // Only the two version bytes are needed to decide.
        assert_eq!(
            s.send(&mut open, &bytes[..2], 96),
            Err(STATUS_REVISION_MISMATCH)
        );
    }
}

#[test]
fn dialect_1_1_request_to_a_1_0_server_is_revision_mismatch() {
    let mut s = Server::with(ServerConfig {
        dialect: Dialect::V1_0,
        ..ServerConfig::default()
    });
    let mut open = OpenQosState::new();
    assert_eq!(
        s.repr(&mut open, &req(Options::SET_LOGICAL_FLOW_ID, FLOW_A)),
        Err(STATUS_REVISION_MISMATCH)
    );
    let v10 =
        StorageQosControlRequestRepr::new(Dialect::V1_0, Options::SET_LOGICAL_FLOW_ID, FLOW_A);
    assert_eq!(s.repr(&mut open, &v10), Ok(None));
}

// ---- STATUS_INVALID_PARAMETER ----------------------------------------------

#[test]
fn request_shorter_than_protocol_version_is_invalid_parameter() {
    let mut s = Server::new();
    let mut open = OpenQosState::new();
    assert_eq!(s.send(&mut open, &[], 96), Err(STATUS_INVALID_PARAMETER));
    assert_eq!(
        s.send(&mut open, &[0x01], 96),
        Err(STATUS_INVALID_PARAMETER)
    );
}

#[test]
fn request_shorter_than_its_dialect_fixed_part_is_invalid_parameter() {
    let mut s = Server::new();
    let mut open = OpenQosState::new();
    for dialect in [Dialect::V1_0, Dialect::V1_1] {
        let bytes =
            StorageQosControlRequestRepr::new(dialect, Options::SET_LOGICAL_FLOW_ID, FLOW_A)
                .to_vec();
        for len in [2, 8, 80, dialect.request_fixed_len() - 1] {
            assert_eq!(
                s.send(&mut open, &bytes[..len], 96),
                Err(STATUS_INVALID_PARAMETER),
                "{dialect} {len}"
            );
        }
    }
    // A 1.1 request cut to the 1.0 size is still short.
    let bytes = req(Options::SET_LOGICAL_FLOW_ID, FLOW_A).to_vec();
    assert_eq!(
        s.send(&mut open, &bytes[..112], 96),
        Err(STATUS_INVALID_PARAMETER)
    );
    assert!(!open.is_associated());
}

#[test]
fn options_without_a_defined_flag_is_invalid_parameter() {
    let mut s = Server::new();
    let mut open = OpenQosState::new();
    for bits in [0, 0x20, 0x40, 0x8000_0000, 0xFFFF_FFE0] {
        let r = s.repr(&mut open, &req(Options::from_bits(bits), FLOW_A));
        assert_eq!(r, Err(STATUS_INVALID_PARAMETER), "0x{bits:08X}");
    }
    // Undefined bits next to a defined flag are ignored.
    assert_eq!(
        s.repr(&mut open, &req(Options::from_bits(0x8000_0001), FLOW_A)),
        Ok(None)
    );
}

#[test]
fn probe_policy_with_empty_logical_flow_id_is_invalid_parameter() {
    let mut s = Server::new();
    let mut open = OpenQosState::new();
    assert_eq!(
        s.repr(
            &mut open,
            &policy_req(Options::PROBE_POLICY, Guid::NULL, Guid::NULL)
        ),
        Err(STATUS_INVALID_PARAMETER)
    );
}

/// A SET_POLICY request on an associated Open with one name field patched.
fn name_case(patch: impl FnOnce(&mut Vec<u8>)) -> Outcome {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    let mut bytes = policy_req(Options::SET_POLICY, FLOW_A, Guid::NULL).to_vec();
    patch(&mut bytes);
    s.send(&mut open, &bytes, 96)
}

#[test]
fn initiator_name_longer_than_name_size_is_invalid_parameter() {
    assert_eq!(
        name_case(|b| {
            b.resize(128 + 0x202, 0x41);
            set_u16(b, 72, 128);
            set_u16(b, 74, 0x202);
        }),
        Err(STATUS_INVALID_PARAMETER)
    );
    // Exactly STORAGE_QOS_INITIATOR_NAME_SIZE is fine.
    assert_eq!(
        name_case(|b| {
            b.resize(128 + 0x200, 0x41);
            set_u16(b, 72, 128);
            set_u16(b, 74, 0x200);
        }),
        Ok(None)
    );
}

#[test]
fn initiator_name_offset_below_104_is_invalid_parameter() {
    assert_eq!(
        name_case(|b| set_u16(b, 72, 103)),
        Err(STATUS_INVALID_PARAMETER)
    );
    assert_eq!(
        name_case(|b| set_u16(b, 72, 0)),
        Err(STATUS_INVALID_PARAMETER)
    );
}

#[test]
fn initiator_name_past_request_size_is_invalid_parameter() {
    assert_eq!(
        name_case(|b| {
            let len = b.len() as u16;
            set_u16(b, 72, len - 9); // 10 bytes long
        }),
        Err(STATUS_INVALID_PARAMETER)
    );
}

#[test]
fn initiator_node_name_longer_than_name_size_is_invalid_parameter() {
    assert_eq!(
        name_case(|b| {
            b.resize(128 + 10 + 0x201, 0x41);
            set_u16(b, 76, 138);
            set_u16(b, 78, 0x201);
        }),
        Err(STATUS_INVALID_PARAMETER)
    );
}

#[test]
fn initiator_node_name_offset_below_104_is_invalid_parameter() {
    assert_eq!(
        name_case(|b| set_u16(b, 76, 50)),
        Err(STATUS_INVALID_PARAMETER)
    );
}

#[test]
fn initiator_node_name_past_request_size_is_invalid_parameter() {
    assert_eq!(
        name_case(|b| {
            let len = b.len() as u16;
            set_u16(b, 76, len - 29); // 30 bytes long
        }),
        Err(STATUS_INVALID_PARAMETER)
    );
}

#[test]
fn empty_name_with_offset_past_request_size_is_invalid_parameter() {
    // 3.2.5.1.2 sums length and offset whatever the length.
    assert_eq!(
        name_case(|b| {
            set_u16(b, 76, 0xFFFF);
            set_u16(b, 78, 0);
        }),
        Err(STATUS_INVALID_PARAMETER)
    );
}

#[test]
fn name_offset_104_is_accepted_even_inside_the_fixed_part() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    let mut bytes = policy_req(Options::SET_POLICY, FLOW_A, Guid::NULL).to_vec();
    set_u16(&mut bytes, 72, 104); // over LowerLatencyIncrement (zero)
    assert_eq!(s.send(&mut open, &bytes, 96), Ok(None));
    assert_eq!(s.table.get(&FLOW_A).unwrap().initiator_name(), "\0\0\0\0\0");
    assert_eq!(
        s.table.get(&FLOW_A).unwrap().initiator_node_name(),
        "host-01.example"
    );
}

#[test]
fn names_are_ignored_without_set_or_probe_policy() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    let mut bytes = req(Options::GET_STATUS | Options::UPDATE_COUNTERS, Guid::NULL).to_vec();
    set_u16(&mut bytes, 72, 3);
    set_u16(&mut bytes, 74, 0xFFFF);
    set_u16(&mut bytes, 76, 0xFFFF);
    set_u16(&mut bytes, 78, 0xFFFF);
    assert!(s.send(&mut open, &bytes, 96).unwrap().is_some());
}

#[test]
fn limit_above_note_8_maximum_is_invalid_parameter() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    assert_eq!(
        s.repr(&mut open, &limits_req(1_000_000_001, 0, 0)),
        Err(STATUS_INVALID_PARAMETER)
    );
    assert_eq!(
        s.repr(&mut open, &limits_req(1_000_000_000, 0, 0)),
        Ok(None)
    );
}

#[test]
fn reservation_above_note_8_maximum_is_invalid_parameter() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    assert_eq!(
        s.repr(&mut open, &limits_req(0, 1_000_000_001, 0)),
        Err(STATUS_INVALID_PARAMETER)
    );
    assert_eq!(
        s.repr(&mut open, &limits_req(0, 1_000_000_000, 0)),
        Ok(None)
    );
}

#[test]
fn bandwidth_limit_above_note_8_maximum_is_invalid_parameter() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    assert_eq!(
        s.repr(&mut open, &limits_req(0, 0, 1_000_000_001)),
        Err(STATUS_INVALID_PARAMETER)
    );
    assert_eq!(
        s.repr(&mut open, &limits_req(0, 0, 1_000_000_000)),
        Ok(None)
    );
}

#[test]
fn reservation_above_limit_is_invalid_parameter() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    assert_eq!(
        s.repr(&mut open, &limits_req(1, 2, 0)),
        Err(STATUS_INVALID_PARAMETER)
    );
    assert_eq!(s.repr(&mut open, &limits_req(2, 2, 0)), Ok(None));
    // With no limit, any reservation up to the maximum is fine.
    assert_eq!(s.repr(&mut open, &limits_req(0, 2, 0)), Ok(None));
}

fn with_policy(r: StorageQosControlRequestRepr<'static>) -> StorageQosControlRequestRepr<'static> {
    StorageQosControlRequestRepr {
        policy_id: POLICY_GOLD,
        ..r
    }
}

#[test]
fn limit_with_policy_id_is_invalid_parameter() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    assert_eq!(
        s.repr(&mut open, &with_policy(limits_req(1, 0, 0))),
        Err(STATUS_INVALID_PARAMETER)
    );
}

#[test]
fn bandwidth_limit_with_policy_id_is_invalid_parameter() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    assert_eq!(
        s.repr(&mut open, &with_policy(limits_req(0, 0, 1))),
        Err(STATUS_INVALID_PARAMETER)
    );
}

#[test]
fn reservation_with_policy_id_is_invalid_parameter() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    assert_eq!(
        s.repr(&mut open, &with_policy(limits_req(0, 1, 0))),
        Err(STATUS_INVALID_PARAMETER)
    );
    assert_eq!(
        s.repr(&mut open, &with_policy(limits_req(0, 0, 0))),
        Ok(None)
    );
}

#[test]
fn note_8_checks_apply_to_probe_policy_too() {
    let mut s = Server::new();
    let mut open = OpenQosState::new();
    let probe = StorageQosControlRequestRepr {
        limit: 5,
        ..policy_req(Options::PROBE_POLICY, FLOW_A, POLICY_GOLD)
    };
    assert_eq!(s.repr(&mut open, &probe), Err(STATUS_INVALID_PARAMETER));
    assert!(!open.is_associated() && s.table.is_empty());
}

#[test]
fn get_status_with_max_response_size_below_80_is_invalid_parameter() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    let bytes = req(Options::GET_STATUS, Guid::NULL).to_vec();
    for max in [0, 1, 79] {
        assert_eq!(
            s.send(&mut open, &bytes, max),
            Err(STATUS_INVALID_PARAMETER),
            "{max}"
        );
    }
}

#[test]
fn get_status_with_max_response_size_below_dialect_response_is_invalid_parameter() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    let v11 = req(Options::GET_STATUS, Guid::NULL).to_vec();
    for max in [80, 88, 95] {
        assert_eq!(
            s.send(&mut open, &v11, max),
            Err(STATUS_INVALID_PARAMETER),
            "{max}"
        );
    }
    assert!(s.send(&mut open, &v11, 96).unwrap().is_some());
    let v10 =
        StorageQosControlRequestRepr::new(Dialect::V1_0, Options::GET_STATUS, Guid::NULL).to_vec();
    assert_eq!(s.send(&mut open, &v10, 87), Err(STATUS_INVALID_PARAMETER));
    assert!(s.send(&mut open, &v10, 88).unwrap().is_some());
}

#[test]
fn max_response_size_is_not_checked_without_get_status() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    assert_eq!(
        s.send(
            &mut open,
            &req(Options::UPDATE_COUNTERS, Guid::NULL).to_vec(),
            0
        ),
        Ok(None)
    );
}

// ---- STATUS_NOT_FOUND -------------------------------------------------------

#[test]
fn set_policy_on_unassociated_open_is_not_found() {
    let mut s = Server::new();
    let mut open = OpenQosState::new();
    assert_eq!(
        s.repr(
            &mut open,
            &policy_req(Options::SET_POLICY, FLOW_A, Guid::NULL)
        ),
        Err(STATUS_NOT_FOUND)
    );
}

#[test]
fn update_counters_on_unassociated_open_is_not_found() {
    let mut s = Server::new();
    let mut open = OpenQosState::new();
    assert_eq!(
        s.repr(&mut open, &req(Options::UPDATE_COUNTERS, FLOW_A)),
        Err(STATUS_NOT_FOUND)
    );
}

#[test]
fn get_status_on_unknown_flow_is_not_found() {
    let mut s = Server::new();
    let mut open = OpenQosState::new();
    assert_eq!(
        s.repr(&mut open, &req(Options::GET_STATUS, FLOW_A)),
        Err(STATUS_NOT_FOUND)
    );
}

#[test]
fn set_policy_after_disassociation_in_same_request_is_not_found() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    let r = policy_req(
        Options::SET_LOGICAL_FLOW_ID | Options::SET_POLICY,
        Guid::NULL,
        Guid::NULL,
    );
    assert_eq!(s.repr(&mut open, &r), Err(STATUS_NOT_FOUND));
    // A failed request changes nothing: still associated.
    assert_eq!(open.logical_flow_id(), Some(FLOW_A));
}

// ---- STATUS_INSUFFICIENT_RESOURCES ------------------------------------------

#[test]
fn new_flow_when_table_is_full_of_referenced_flows_is_insufficient_resources() {
    let mut s = Server::with(ServerConfig {
        max_flows: 1,
        ..ServerConfig::default()
    });
    let _a = associated(&mut s);
    let mut other = OpenQosState::new();
    assert_eq!(
        s.repr(&mut other, &req(Options::SET_LOGICAL_FLOW_ID, FLOW_B)),
        Err(STATUS_INSUFFICIENT_RESOURCES)
    );
    // Joining the existing flow needs no room.
    s.associate(&mut other, FLOW_A);
    assert_eq!(s.table.get(&FLOW_A).unwrap().open_count(), 2);
}

#[test]
fn full_table_evicts_the_oldest_unreferenced_flow() {
    let mut s = Server::with(ServerConfig {
        max_flows: 2,
        ..ServerConfig::default()
    });
    let mut o1 = associated(&mut s);
    s.table.close_open(&mut o1, s.now);
    s.advance(Duration::from_secs(1));
    let mut o2 = OpenQosState::new();
    s.associate(&mut o2, FLOW_B);
    s.table.close_open(&mut o2, s.now);
    let third = Guid::from_fields(3, 3, 3, [3; 8]);
    let mut o3 = OpenQosState::new();
    s.associate(&mut o3, third);
    assert!(
        s.table.get(&FLOW_A).is_none(),
        "the oldest unreferenced flow goes"
    );
    assert!(s.table.get(&FLOW_B).is_some() && s.table.get(&third).is_some());
}

// ---- Association (3.2.5.1.1) and PROBE_POLICY --------------------------------

#[test]
fn set_logical_flow_id_creates_and_associates_a_flow() {
    let mut s = Server::new();
    let open = associated(&mut s);
    assert_eq!(open.logical_flow_id(), Some(FLOW_A));
    let flow = s.table.get(&FLOW_A).unwrap();
    assert_eq!(flow.open_count(), 1);
    assert_eq!(flow.base_io_size(), 8192);
    assert!(!flow.policy_applied());
}

#[test]
fn set_logical_flow_id_with_empty_guid_removes_the_association() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    assert_eq!(
        s.repr(&mut open, &req(Options::SET_LOGICAL_FLOW_ID, Guid::NULL)),
        Ok(None)
    );
    assert!(!open.is_associated());
    assert_eq!(s.table.get(&FLOW_A).unwrap().open_count(), 0);
    assert_eq!(
        s.repr(&mut open, &req(Options::GET_STATUS, Guid::NULL)),
        Err(STATUS_NOT_FOUND)
    );
}

#[test]
fn reassociating_moves_the_open_to_the_new_flow() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    s.associate(&mut open, FLOW_B);
    assert_eq!(open.logical_flow_id(), Some(FLOW_B));
    assert_eq!(s.table.get(&FLOW_A).unwrap().open_count(), 0);
    assert_eq!(s.table.get(&FLOW_B).unwrap().open_count(), 1);
    // Associating again to the same flow does not count twice.
    s.associate(&mut open, FLOW_B);
    assert_eq!(s.table.get(&FLOW_B).unwrap().open_count(), 1);
}

#[test]
fn opens_share_a_flow_by_logical_flow_id() {
    let mut s = Server::new();
    let mut a = associated(&mut s);
    let mut b = associated(&mut s);
    assert_eq!(s.table.len(), 1);
    assert_eq!(s.table.get(&FLOW_A).unwrap().open_count(), 2);
    s.table.close_open(&mut a, s.now);
    s.table.close_open(&mut b, s.now);
    assert_eq!(s.table.get(&FLOW_A).unwrap().open_count(), 0);
}

#[test]
fn probe_policy_on_unassociated_open_associates_and_sets_policy() {
    let mut s = Server::new();
    let mut open = OpenQosState::new();
    let probe = policy_req(
        Options::PROBE_POLICY | Options::GET_STATUS,
        FLOW_A,
        POLICY_GOLD,
    );
    let rsp = s.repr(&mut open, &probe).unwrap().unwrap();
    assert_eq!(open.logical_flow_id(), Some(FLOW_A));
    assert_eq!(rsp.policy_id, POLICY_GOLD);
    assert_eq!(rsp.initiator_id, INITIATOR);
    let flow = s.table.get(&FLOW_A).unwrap();
    assert_eq!(flow.policy_id(), POLICY_GOLD);
    assert_eq!(flow.initiator_name(), "vm-01");
}

#[test]
fn probe_policy_on_associated_open_is_ignored() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    // A probe naming another flow and policy changes nothing.
    let probe = policy_req(Options::PROBE_POLICY, FLOW_B, POLICY_GOLD);
    assert_eq!(s.repr(&mut open, &probe), Ok(None));
    assert_eq!(open.logical_flow_id(), Some(FLOW_A));
    assert!(s.table.get(&FLOW_B).is_none());
    assert!(!s.table.get(&FLOW_A).unwrap().policy_applied());
    // Ignored means ignored: an empty LogicalFlowID is not an error then,
    // and neither are bad names or note <8> values.
    let mut bad = StorageQosControlRequestRepr {
        limit: 7,
        ..policy_req(Options::PROBE_POLICY, Guid::NULL, POLICY_GOLD)
    }
    .to_vec();
    set_u16(&mut bad, 72, 1);
    assert_eq!(s.send(&mut open, &bad, 96), Ok(None));
}

// ---- Policy (3.2.5.1.2) ------------------------------------------------------

#[test]
fn any_initiator_id_is_accepted() {
    // Note <8> names no invalid InitiatorID.
    let mut s = Server::new();
    let mut open = associated(&mut s);
    for id in [Guid::NULL, INITIATOR, Guid::from_bytes([0xFF; 16])] {
        let r = StorageQosControlRequestRepr {
            initiator_id: id,
            ..limits_req(1, 0, 0)
        };
        assert_eq!(s.repr(&mut open, &r), Ok(None));
        assert_eq!(s.table.get(&FLOW_A).unwrap().initiator_id(), id);
    }
}

#[test]
fn set_policy_updates_policy_parameters_and_names() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    assert_eq!(s.repr(&mut open, &limits_req(300, 20, 4000)), Ok(None));
    let flow = s.table.get(&FLOW_A).unwrap();
    assert_eq!(flow.policy_id(), Guid::NULL);
    assert_eq!(flow.initiator_id(), INITIATOR);
    assert_eq!(
        (flow.limit(), flow.reservation(), flow.bandwidth_limit()),
        (300, 20, 4000)
    );
    assert_eq!(flow.initiator_name(), "vm-01");
    assert_eq!(flow.initiator_node_name(), "host-01.example");
    assert!(flow.policy_applied());
}

#[test]
fn empty_names_keep_previous_names() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    assert_eq!(s.repr(&mut open, &limits_req(1, 0, 0)), Ok(None));
    let unnamed = StorageQosControlRequestRepr {
        initiator_name: Utf16Name::EMPTY,
        initiator_node_name: Utf16Name::EMPTY,
        ..limits_req(2, 0, 0)
    };
    assert_eq!(s.repr(&mut open, &unnamed), Ok(None));
    let flow = s.table.get(&FLOW_A).unwrap();
    assert_eq!(flow.limit(), 2);
    assert_eq!(
        (flow.initiator_name(), flow.initiator_node_name()),
        ("vm-01", "host-01.example")
    );
}

#[test]
fn set_policy_from_a_1_0_request_clears_the_bandwidth_limit() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    assert_eq!(s.repr(&mut open, &limits_req(10, 0, 500)), Ok(None));
    let v10 = StorageQosControlRequestRepr {
        dialect: Dialect::V1_0,
        bandwidth_limit: 0,
        ..limits_req(10, 0, 0)
    };
    assert_eq!(s.repr(&mut open, &v10), Ok(None));
    assert_eq!(s.table.get(&FLOW_A).unwrap().bandwidth_limit(), 0);
}

// ---- Counters (3.2.5.1.3) ----------------------------------------------------

fn counters_req(
    dialect: Dialect,
    options: Options,
    n: u64,
) -> StorageQosControlRequestRepr<'static> {
    StorageQosControlRequestRepr {
        io_count_increment: n,
        normalized_io_count_increment: 2 * n,
        latency_increment: 3 * n,
        lower_latency_increment: n,
        kilobyte_count_increment: if dialect == Dialect::V1_1 { 8 * n } else { 0 },
        ..StorageQosControlRequestRepr::new(dialect, options, Guid::NULL)
    }
}

#[test]
fn counters_accumulate_across_update_counters_requests() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    for n in [399, 1, 100] {
        s.advance(Duration::from_secs(1));
        assert_eq!(
            s.repr(
                &mut open,
                &counters_req(Dialect::V1_1, Options::UPDATE_COUNTERS, n)
            ),
            Ok(None)
        );
    }
    let flow = s.table.get(&FLOW_A).unwrap();
    let c = flow.counters();
    assert_eq!(
        (
            c.io_count,
            c.normalized_io_count,
            c.latency,
            c.lower_latency,
            c.kilobyte_count
        ),
        (500, 1000, 1500, 500, 4000)
    );
    assert_eq!(c.updates, 3);
    assert_eq!(
        flow.last_counter_update(),
        Some(Instant::ZERO + Duration::from_secs(3))
    );
}

#[test]
fn counters_saturate_instead_of_wrapping() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    for _ in 0..2 {
        let r = StorageQosControlRequestRepr {
            io_count_increment: u64::MAX,
            ..counters_req(Dialect::V1_1, Options::UPDATE_COUNTERS, 0)
        };
        assert_eq!(s.repr(&mut open, &r), Ok(None));
    }
    assert_eq!(s.table.get(&FLOW_A).unwrap().counters().io_count, u64::MAX);
}

#[test]
fn counters_are_ignored_without_update_counters() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    assert!(s
        .repr(
            &mut open,
            &counters_req(Dialect::V1_1, Options::GET_STATUS, 50)
        )
        .unwrap()
        .is_some());
    assert_eq!(s.table.get(&FLOW_A).unwrap().counters().io_count, 0);
    assert_eq!(s.table.get(&FLOW_A).unwrap().last_counter_update(), None);
}

#[test]
fn dialect_1_0_counters_have_no_kilobytes() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    assert_eq!(
        s.repr(
            &mut open,
            &counters_req(Dialect::V1_0, Options::UPDATE_COUNTERS, 5)
        ),
        Ok(None)
    );
    let c = *s.table.get(&FLOW_A).unwrap().counters();
    assert_eq!((c.io_count, c.kilobyte_count), (5, 0));
}

// ---- Status (3.2.5.1.4) -------------------------------------------------------

#[test]
fn get_status_answers_in_the_request_dialect() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    assert_eq!(s.repr(&mut open, &limits_req(100, 0, 200)), Ok(None));
    for (dialect, len) in [(Dialect::V1_0, 88), (Dialect::V1_1, 96)] {
        let r = StorageQosControlRequestRepr::new(dialect, Options::GET_STATUS, Guid::NULL);
        let rsp = s.repr(&mut open, &r).unwrap().unwrap();
        assert_eq!(rsp.dialect, dialect);
        assert_eq!(rsp.to_vec().len(), len);
        assert_eq!(
            rsp.maximum_bandwidth,
            if dialect == Dialect::V1_1 { 200 } else { 0 }
        );
    }
}

#[test]
fn get_status_response_carries_options_zero_and_the_flow_identity() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    assert_eq!(s.repr(&mut open, &limits_req(100, 10, 0)), Ok(None));
    let rsp = s.status(&mut open);
    assert_eq!(rsp.logical_flow_id, FLOW_A);
    assert_eq!(rsp.policy_id, Guid::NULL);
    assert_eq!(rsp.initiator_id, INITIATOR);
    let bytes = rsp.to_vec();
    assert_eq!(&bytes[2..8], &[0; 6], "Reserved and Options are zero");
    assert_eq!(&bytes[84..88], &[0; 4], "second Reserved is zero");
}

#[test]
fn get_status_time_to_live_is_positive() {
    let mut s = Server::with(ServerConfig {
        status_time_to_live: Duration::ZERO,
        ..ServerConfig::default()
    });
    let mut open = associated(&mut s);
    assert_eq!(s.status(&mut open).time_to_live, 1);
    let mut s = Server::new();
    let mut open = associated(&mut s);
    assert_eq!(s.status(&mut open).time_to_live, 4000);
}

#[test]
fn get_status_base_io_size_is_the_flow_base_io_size() {
    let mut s = Server::with(ServerConfig {
        base_io_size: 4096,
        ..ServerConfig::default()
    });
    let mut open = associated(&mut s);
    assert_eq!(s.status(&mut open).base_io_size, 4096);
    let mut s = Server::new();
    let mut open = associated(&mut s);
    assert_eq!(s.status(&mut open).base_io_size, 8192);
}

#[test]
fn flow_without_policy_reports_status_not_available() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    let rsp = s.status(&mut open);
    assert_eq!(rsp.status, FlowStatus::NotAvailable);
    assert_eq!(
        (
            rsp.maximum_io_rate,
            rsp.minimum_io_rate,
            rsp.maximum_bandwidth
        ),
        (0, 0, 0)
    );
}

#[test]
fn unknown_policy_id_reports_unknown_policy_id() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    assert_eq!(
        s.repr(
            &mut open,
            &policy_req(Options::SET_POLICY, FLOW_A, POLICY_UNKNOWN)
        ),
        Ok(None)
    );
    let rsp = s.status(&mut open);
    assert_eq!(rsp.status, FlowStatus::UnknownPolicyId);
    assert_eq!(rsp.policy_id, POLICY_UNKNOWN);
    assert_eq!(rsp.maximum_io_rate, 0);
}

#[test]
fn client_defined_limits_are_reported_as_assigned_rates() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    assert_eq!(s.repr(&mut open, &limits_req(300, 20, 4000)), Ok(None));
    let rsp = s.status(&mut open);
    assert_eq!(rsp.status, FlowStatus::Ok);
    assert_eq!(
        (
            rsp.maximum_io_rate,
            rsp.minimum_io_rate,
            rsp.maximum_bandwidth
        ),
        (300, 20, 4000)
    );
}

#[test]
fn dedicated_policy_limits_are_reported_per_flow() {
    let mut s = Server::new();
    let mut a = associated(&mut s);
    assert_eq!(
        s.repr(
            &mut a,
            &policy_req(Options::SET_POLICY, FLOW_A, POLICY_GOLD)
        ),
        Ok(None)
    );
    let mut b = OpenQosState::new();
    s.associate(&mut b, FLOW_B);
    assert_eq!(
        s.repr(
            &mut b,
            &policy_req(Options::SET_POLICY, FLOW_B, POLICY_GOLD)
        ),
        Ok(None)
    );
    for open in [&mut a, &mut b] {
        let rsp = s.status(open);
        assert_eq!(rsp.status, FlowStatus::Ok);
        assert_eq!(
            (
                rsp.maximum_io_rate,
                rsp.minimum_io_rate,
                rsp.maximum_bandwidth
            ),
            (500, 50, 1000)
        );
    }
}

#[test]
fn aggregated_policy_limits_are_shared_among_flows() {
    let mut s = Server::new();
    let mut a = OpenQosState::new();
    assert!(s
        .repr(
            &mut a,
            &policy_req(Options::PROBE_POLICY, FLOW_A, POLICY_SHARED)
        )
        .is_ok());
    let one = s.status(&mut a);
    assert_eq!(
        (
            one.maximum_io_rate,
            one.minimum_io_rate,
            one.maximum_bandwidth
        ),
        (1001, 100, 3)
    );
    let mut b = OpenQosState::new();
    assert!(s
        .repr(
            &mut b,
            &policy_req(Options::PROBE_POLICY, FLOW_B, POLICY_SHARED)
        )
        .is_ok());
    // Two sharers: maxima rounded up (never 0 = unlimited), minimum down.
    let two = s.status(&mut a);
    assert_eq!(
        (
            two.maximum_io_rate,
            two.minimum_io_rate,
            two.maximum_bandwidth
        ),
        (501, 50, 2)
    );
}

#[test]
fn unsupported_reservation_reports_configuration_mismatch() {
    let mut s = Server::with(ServerConfig {
        supports_reservations: false,
        ..ServerConfig::default()
    });
    let mut open = associated(&mut s);
    assert_eq!(s.repr(&mut open, &limits_req(300, 20, 0)), Ok(None));
    let rsp = s.status(&mut open);
    assert_eq!(rsp.status, FlowStatus::ConfigurationMismatch);
    assert_eq!((rsp.maximum_io_rate, rsp.minimum_io_rate), (300, 0));
}

#[test]
fn bandwidth_limit_on_a_1_0_server_reports_configuration_mismatch() {
    let mut s = Server::with(ServerConfig {
        dialect: Dialect::V1_0,
        ..ServerConfig::default()
    });
    let mut open = OpenQosState::new();
    let v10 = |o, p| StorageQosControlRequestRepr {
        dialect: Dialect::V1_0,
        ..policy_req(o, FLOW_A, p)
    };
    assert!(s
        .repr(&mut open, &v10(Options::PROBE_POLICY, POLICY_GOLD))
        .is_ok());
    let rsp = s
        .repr(&mut open, &v10(Options::GET_STATUS, Guid::NULL))
        .unwrap()
        .unwrap();
    assert_eq!(rsp.status, FlowStatus::ConfigurationMismatch);
    assert_eq!(rsp.maximum_io_rate, 500);
}

#[test]
fn policy_with_minimum_above_maximum_reports_configuration_mismatch() {
    let mut s = Server::new();
    s.policies.insert(
        POLICY_UNKNOWN,
        Policy {
            kind: PolicyKind::Dedicated,
            minimum_iops: 10,
            maximum_iops: 5,
            maximum_bandwidth: 0,
        },
    );
    let mut open = associated(&mut s);
    assert!(s
        .repr(
            &mut open,
            &policy_req(Options::SET_POLICY, FLOW_A, POLICY_UNKNOWN)
        )
        .is_ok());
    assert_eq!(
        s.status(&mut open).status,
        FlowStatus::ConfigurationMismatch
    );
}

fn report(status: FlowStatus, ttl_ms: u64) -> FlowReport {
    FlowReport {
        status,
        maximum_io_rate: 77,
        minimum_io_rate: 7,
        maximum_bandwidth: 777,
        time_to_live: Duration::from_millis(ttl_ms),
    }
}

#[test]
fn fresh_enforcement_report_is_returned_by_get_status() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    assert!(s
        .repr(
            &mut open,
            &policy_req(Options::SET_POLICY, FLOW_A, POLICY_GOLD)
        )
        .is_ok());
    for status in [
        FlowStatus::InsufficientThroughput,
        FlowStatus::ConfigurationMismatch,
        FlowStatus::NotAvailable,
        FlowStatus::UnknownPolicyId,
        FlowStatus::Ok,
    ] {
        assert!(s.table.report(&FLOW_A, report(status, 5000), s.now));
        s.advance(Duration::from_millis(1500));
        let rsp = s.status(&mut open);
        assert_eq!(rsp.status, status);
        assert_eq!(
            (
                rsp.maximum_io_rate,
                rsp.minimum_io_rate,
                rsp.maximum_bandwidth
            ),
            (77, 7, 777)
        );
        assert_eq!(rsp.time_to_live, 3500, "the remaining validity");
    }
    assert!(
        !s.table.report(&FLOW_B, report(FlowStatus::Ok, 1), s.now),
        "no such flow"
    );
}

#[test]
fn stale_enforcement_report_falls_back_to_policy() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    assert!(s
        .repr(
            &mut open,
            &policy_req(Options::SET_POLICY, FLOW_A, POLICY_GOLD)
        )
        .is_ok());
    assert!(s.table.report(
        &FLOW_A,
        report(FlowStatus::InsufficientThroughput, 1000),
        s.now
    ));
    s.advance(Duration::from_millis(1000));
    let rsp = s.status(&mut open);
    assert_eq!(rsp.status, FlowStatus::Ok);
    assert_eq!(rsp.maximum_io_rate, 500);
}

#[test]
fn set_policy_discards_the_enforcement_report() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    assert!(s.table.report(
        &FLOW_A,
        report(FlowStatus::InsufficientThroughput, 60_000),
        s.now
    ));
    assert!(s.repr(&mut open, &limits_req(9, 0, 0)).is_ok());
    let rsp = s.status(&mut open);
    assert_eq!((rsp.status, rsp.maximum_io_rate), (FlowStatus::Ok, 9));
}

// ---- Atomicity ------------------------------------------------------------------

#[test]
fn failed_request_changes_nothing() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    let before = s.table.get(&FLOW_A).unwrap().clone();
    s.advance(Duration::from_secs(5));
    // Associates to FLOW_B and adds counters, but fails 3.2.5.1.4.
    let r = StorageQosControlRequestRepr {
        io_count_increment: 5,
        ..req(
            Options::SET_LOGICAL_FLOW_ID | Options::UPDATE_COUNTERS | Options::GET_STATUS,
            FLOW_B,
        )
    };
    assert_eq!(
        s.send(&mut open, &r.to_vec(), 10),
        Err(STATUS_INVALID_PARAMETER)
    );
    assert_eq!(open.logical_flow_id(), Some(FLOW_A));
    assert!(s.table.get(&FLOW_B).is_none());
    assert_eq!(s.table.get(&FLOW_A).unwrap(), &before);
}

// ---- Lifetime ----------------------------------------------------------------------

#[test]
fn flow_lives_while_an_open_references_it() {
    let mut s = Server::new();
    let _open = associated(&mut s);
    s.advance(Duration::from_secs(24 * 3600));
    assert_eq!(s.table.expire(s.now), 0);
    assert!(s.table.get(&FLOW_A).is_some());
    assert_eq!(s.table.poll_timeout(), None);
}

#[test]
fn closing_the_last_open_starts_the_retention_period() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    s.advance(Duration::from_secs(100));
    s.table.close_open(&mut open, s.now);
    assert!(!open.is_associated());
    let closed_at = s.now;
    assert_eq!(
        s.table.poll_timeout(),
        Some(closed_at + Duration::from_secs(60))
    );
    s.advance(Duration::from_secs(59));
    assert_eq!(s.table.expire(s.now), 0);
    s.advance(Duration::from_secs(1));
    assert_eq!(s.table.expire(s.now), 1);
    assert!(s.table.is_empty());
}

#[test]
fn reassociation_within_retention_keeps_the_flow_and_its_state() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    assert!(s
        .repr(
            &mut open,
            &counters_req(Dialect::V1_1, Options::UPDATE_COUNTERS, 10)
        )
        .is_ok());
    assert!(s.repr(&mut open, &limits_req(42, 0, 0)).is_ok());
    s.table.close_open(&mut open, s.now);
    s.advance(Duration::from_secs(30));
    assert_eq!(s.table.expire(s.now), 0);
    let mut reopened = associated(&mut s);
    let rsp = s.status(&mut reopened);
    assert_eq!(rsp.maximum_io_rate, 42);
    assert_eq!(s.table.get(&FLOW_A).unwrap().counters().io_count, 10);
}

#[test]
fn enforcement_reports_do_not_keep_a_flow_alive() {
    let mut s = Server::new();
    let mut open = associated(&mut s);
    s.table.close_open(&mut open, s.now);
    for _ in 0..6 {
        s.advance(Duration::from_secs(10));
        assert!(s
            .table
            .report(&FLOW_A, report(FlowStatus::Ok, 10_000), s.now));
    }
    assert_eq!(s.table.expire(s.now), 1);
}

#[test]
fn close_open_is_idempotent() {
    let mut s = Server::new();
    let mut a = associated(&mut s);
    let _b = associated(&mut s);
    s.table.close_open(&mut a, s.now);
    s.table.close_open(&mut a, s.now);
    assert_eq!(s.table.get(&FLOW_A).unwrap().open_count(), 1);
}

#[test]
fn open_state_naming_a_flow_missing_from_the_table_counts_as_unassociated() {
    // An OpenQosState used with a table that does not hold its flow (for
    // instance a table rebuilt after a restart) is treated as not associated.
    let mut first = Server::new();
    let mut open = associated(&mut first);
    let mut second = Server::new();
    assert_eq!(
        second.repr(&mut open, &req(Options::GET_STATUS, Guid::NULL)),
        Err(STATUS_NOT_FOUND)
    );
    assert_eq!(
        second.repr(&mut open, &req(Options::UPDATE_COUNTERS, Guid::NULL)),
        Err(STATUS_NOT_FOUND)
    );
    second.associate(&mut open, FLOW_B);
    assert_eq!(second.table.get(&FLOW_B).unwrap().open_count(), 1);
    assert_eq!(first.table.get(&FLOW_A).unwrap().open_count(), 1);
}
