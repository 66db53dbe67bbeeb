//! [MS-SQOS] section 4 examples, byte for byte. The hex is taken from
//! MS-SQOS-v8.0-2024-diff.txt (the only copy with the complete 4.3 response
//! dump; the plain copy's OCR turned some zeros into the letter O). Where an
//! example contradicts itself the test follows the bytes and the normative
//! sections 2 and 3 — see docs/spec-notes.md, section "MS-SQOS".

use smbdirect_protocol::ntstatus::STATUS_INVALID_PARAMETER;
use smbdirect_protocol::sqos::server::{
    process_request, LogicalFlowTable, OpenKind, OpenQosState, Policy, PolicyKind, ServerConfig,
};
use smbdirect_protocol::sqos::{
    normalized_io_size, Dialect, FlowStatus, Guid, Options, StorageQosControlRequest,
    StorageQosControlRequestRepr, StorageQosControlResponse, StorageQosControlResponseRepr,
    Utf16Name,
};
use smbdirect_protocol::time::{Duration, Instant};
use smbdirect_protocol::WireError;
use std::collections::HashMap;

fn hex(s: &str) -> Vec<u8> {
    s.split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).expect("test vector hex"))
        .collect()
}

/// 4.2 step 3, exactly as printed: 96 bytes (PolicyID and InitiatorID are
/// missing from the dump; the annotation says "[all other fields zero]").
const EX_4_2_ASSOCIATE_AS_PRINTED: &str = "
01 01
00 00
01 00 00 00
E4 32 3A B1 AD E2 B2 5D A4 F8 5C D3 BE 9D 69 6E
00 00 00 00 00 00 00 00
00 00 00 00 00 00 00 00
00 00 00 00
00 00 00 00
00 00 00 00 00 00 00 00
00 00 00 00 00 00 00 00
00 00 00 00 00 00 00 00
00 00 00 00 00 00 00 00
00 00 00 00 00 00 00 00
00 00 00 00 00 00 00 00";

/// 4.2 step 5: SET_POLICY, 214 bytes.
const EX_4_2_SET_POLICY: &str = "
01 01
00 00
02 00 00 00
E4 32 3A B1 AD E2 B2 5D A4 F8 5C D3 BE 9D 69 6E
4E F2 B4 04 E9 B3 94 45 AD AA E3 27 52 8D E5 4B
C6 4D 9E 1B C0 F8 9F 41 87 85 80 65 BC FF 72 84
00 00 00 00 00 00 00 00
00 00 00 00 00 00 00 00
68 00 0E 00
76 00 48 00
00 00 00 00 00 00 00 00
00 00 00 00 00 00 00 00
00 00 00 00 00 00 00 00
00 00 00 00 00 00 00 00
00 00 00 00 00 00 00 00
00 00 00 00 00 00 00 00
54 00 45 00 53 00 54 00 2D 00 56 00 4D 00
48 00 59 00 50 00 45 00 52 00 56 00 2D 00 54 00 45 00 53 00 54 00 2E 00 6E 00 74 00 64 00 65
00 76 00 2E 00 63 00 6F 00 72 00 70 00 2E 00 6D 00 69 00 63 00 72 00 6F 00 73 00 6F 00 66 00
74 00 2E 00 63 00 6F 00 6D 00";

/// 4.3 step 1: PROBE_POLICY | GET_STATUS | UPDATE_COUNTERS, 128 bytes.
const EX_4_3_REQUEST: &str = "
01 01
00 00
1C 00 00 00
E4 32 3A B1 AD E2 B2 5D A4 F8 5C D3 BE 9D 69 6E
4E F2 B4 04 E9 B3 94 45 AD AA E3 27 52 8D E5 4B
C6 4D 9E 1B C0 F8 9F 41 87 85 80 65 BC FF 72 84
00 00 00 00 00 00 00 00
00 00 00 00 00 00 00 00
00 00 00 00
00 00 00 00
8F 01 00 00 00 00 00 00
8F 01 00 00 00 00 00 00
E0 3E 47 02 00 00 00 00
E0 3E 47 02 00 00 00 00
00 00 00 00 00 00 00 00
00 00 00 00 00 00 00 00";

/// 4.3 step 2: the response, 96 bytes (MS-SQOS-v8.0-2024-diff.txt).
const EX_4_3_RESPONSE: &str = "
01 01
00 00
00 00 00 00
E4 32 3A B1 AD E2 B2 5D A4 F8 5C D3 BE 9D 69 6E
4E F2 B4 04 E9 B3 94 45 AD AA E3 27 52 8D E5 4B
C6 4D 9E 1B C0 F8 9F 41 87 85 80 65 BC FF 72 84
8D 0F 00 00
00 00 00 00
64 00 00 00 00 00 00 00
00 00 00 00 00 00 00 00
C8 00 00 00 00 00 00 00
00 20 00 00
00 00 00 00";

fn flow_id() -> Guid {
    "b13a32e4-e2ad-5db2-a4f8-5cd3be9d696e".parse().unwrap()
}
fn policy_id() -> Guid {
    "04b4f24e-b3e9-4594-adaa-e327528de54b".parse().unwrap()
}
fn initiator_id() -> Guid {
    "1b9e4dc6-f8c0-419f-8785-8065bcff7284".parse().unwrap()
}

#[test]
fn example_4_1_normalized_io_size_table() {
    for (bytes, normalized) in [
        (512, 1),
        (4096, 1),
        (8192, 1),
        (12288, 2),
        (16384, 2),
        (65536, 8),
        (1_048_576, 128),
    ] {
        assert_eq!(normalized_io_size(bytes, 8192), normalized, "{bytes} bytes");
    }
}

#[test]
fn example_4_2_association_dump_as_printed_is_truncated_and_rejected() {
    let bytes = hex(EX_4_2_ASSOCIATE_AS_PRINTED);
    assert_eq!(bytes.len(), 96);
    assert!(matches!(
        StorageQosControlRequest::new_checked(&bytes[..]),
        Err(WireError::Truncated {
            need: 128,
            have: 96,
            ..
        })
    ));
    let mut table = LogicalFlowTable::new(ServerConfig::default());
    let mut open = OpenQosState::new();
    let r = process_request(
        &mut table,
        &mut open,
        OpenKind::File,
        &bytes,
        0,
        Instant::ZERO,
        &HashMap::new(),
    );
    assert_eq!(r, Err(STATUS_INVALID_PARAMETER));
    assert!(!open.is_associated());
}

#[test]
fn example_4_2_association_request_emits_as_the_dump_with_its_zero_fields() {
    let printed = hex(EX_4_2_ASSOCIATE_AS_PRINTED);
    let repr =
        StorageQosControlRequestRepr::new(Dialect::V1_1, Options::SET_LOGICAL_FLOW_ID, flow_id());
    let bytes = repr.to_vec();
    assert_eq!(bytes.len(), 128);
    assert_eq!(&bytes[..24], &printed[..24]);
    assert!(bytes[24..].iter().all(|&b| b == 0));

    let mut table = LogicalFlowTable::new(ServerConfig::default());
    let mut open = OpenQosState::new();
    let r = process_request(
        &mut table,
        &mut open,
        OpenKind::File,
        &bytes,
        0,
        Instant::ZERO,
        &HashMap::new(),
    );
    assert_eq!(
        r,
        Ok(None),
        "4.2 step 4: STATUS_SUCCESS and no output buffer"
    );
    assert_eq!(open.logical_flow_id(), Some(flow_id()));
}

#[test]
fn example_4_2_set_policy_dump_decodes_by_its_bytes() {
    let bytes = hex(EX_4_2_SET_POLICY);
    assert_eq!(bytes.len(), 214);
    let view = StorageQosControlRequest::new_checked(&bytes[..]).unwrap();
    assert_eq!(view.dialect(), Dialect::V1_1);
    assert_eq!(view.options(), Options::SET_POLICY);
    assert_eq!(view.logical_flow_id(), flow_id());
    assert_eq!(view.policy_id(), policy_id());
    assert_eq!(view.initiator_id(), initiator_id());
    assert_eq!((view.limit(), view.reservation()), (0, 0));
    // The offsets say 104 and 118 ...
    assert_eq!(view.initiator_name_offset(), 104);
    assert_eq!(view.initiator_node_name_offset(), 118);
    // ... the lengths are 14 and 72 (the annotation's "46" is wrong) ...
    assert_eq!(view.initiator_name_length(), 14);
    assert_eq!(view.initiator_node_name_length(), 72);
    // ... and the names themselves follow the 128-byte fixed part.
    let at = |off: usize, len: usize| {
        Utf16Name::from_utf16le(&bytes[off..off + len])
            .unwrap()
            .to_string_lossy()
    };
    assert_eq!(at(128, 14), "TEST-VM");
    assert_eq!(at(142, 72), "HYPERV-TEST.ntdev.corp.microsoft.com");
    // Read where the offsets point, as the normative rules say, the names
    // are the zero counter fields and a shifted copy of the real names.
    let repr = StorageQosControlRequestRepr::parse(&view).unwrap();
    assert_eq!(repr.initiator_name.to_string_lossy(), "\0".repeat(7));
    assert_eq!(
        repr.initiator_node_name.to_string_lossy(),
        format!("{}TEST-VMHYPERV-TEST.ntdev.corp.m", "\0".repeat(5))
    );
    assert_eq!(
        (repr.bandwidth_limit, repr.kilobyte_count_increment),
        (0, 0)
    );
}

#[test]
fn example_4_2_set_policy_emits_as_the_dump_with_names_at_their_true_offsets() {
    let dump = hex(EX_4_2_SET_POLICY);
    let repr = StorageQosControlRequestRepr {
        policy_id: policy_id(),
        initiator_id: initiator_id(),
        initiator_name: Utf16Name::new("TEST-VM").unwrap(),
        initiator_node_name: Utf16Name::new("HYPERV-TEST.ntdev.corp.microsoft.com").unwrap(),
        ..StorageQosControlRequestRepr::new(Dialect::V1_1, Options::SET_POLICY, flow_id())
    };
    let emitted = repr.to_vec();
    let mut expected = dump.clone();
    expected[72..74].copy_from_slice(&128u16.to_le_bytes()); // 104 in the dump
    expected[76..78].copy_from_slice(&142u16.to_le_bytes()); // 118 in the dump
    assert_eq!(emitted, expected);
    // Everything but the two offset fields is the dump's bytes.
    let differing: Vec<usize> = (0..dump.len()).filter(|&i| emitted[i] != dump[i]).collect();
    assert_eq!(differing, vec![72, 76]);
}

#[test]
fn example_4_3_request_dump_decodes_and_round_trips_byte_exact() {
    let bytes = hex(EX_4_3_REQUEST);
    assert_eq!(bytes.len(), 128);
    let view = StorageQosControlRequest::new_checked(&bytes[..]).unwrap();
    let repr = StorageQosControlRequestRepr::parse(&view).unwrap();
    assert_eq!(
        repr.options,
        Options::PROBE_POLICY | Options::GET_STATUS | Options::UPDATE_COUNTERS
    );
    assert_eq!(repr.logical_flow_id, flow_id());
    assert_eq!(repr.policy_id, policy_id());
    assert_eq!(repr.initiator_id, initiator_id());
    assert_eq!(repr.io_count_increment, 399);
    assert_eq!(repr.normalized_io_count_increment, 399);
    assert_eq!(repr.latency_increment, 38_223_584);
    assert_eq!(repr.lower_latency_increment, 38_223_584);
    assert_eq!(
        (repr.bandwidth_limit, repr.kilobyte_count_increment),
        (0, 0)
    );
    assert!(repr.initiator_name.is_empty() && repr.initiator_node_name.is_empty());
    assert_eq!(repr.to_vec(), bytes);
}

#[test]
fn example_4_3_response_dump_decodes_by_the_section_2_2_2_3_layout() {
    let bytes = hex(EX_4_3_RESPONSE);
    assert_eq!(bytes.len(), 96);
    let view = StorageQosControlResponse::new_checked(&bytes[..]).unwrap();
    let repr = StorageQosControlResponseRepr::parse(&view).unwrap();
    assert_eq!(repr.dialect, Dialect::V1_1);
    assert_eq!(repr.logical_flow_id, flow_id());
    assert_eq!(repr.policy_id, policy_id());
    assert_eq!(repr.initiator_id, initiator_id());
    assert_eq!(repr.time_to_live, 3981);
    assert_eq!(repr.status, FlowStatus::Ok);
    assert_eq!(repr.maximum_io_rate, 100);
    assert_eq!(repr.minimum_io_rate, 0);
    // The dump puts MaximumBandwidth (200) where 2.2.2.3 puts BaseIoSize
    // and Reserved, and BaseIoSize (8192) where 2.2.2.3 puts
    // MaximumBandwidth. Decoded by the normative layout:
    assert_eq!(repr.base_io_size, 200);
    assert_eq!(repr.maximum_bandwidth, 8192);
}

fn example_4_3_response_repr() -> StorageQosControlResponseRepr {
    StorageQosControlResponseRepr {
        dialect: Dialect::V1_1,
        logical_flow_id: flow_id(),
        policy_id: policy_id(),
        initiator_id: initiator_id(),
        time_to_live: 3981,
        status: FlowStatus::Ok,
        maximum_io_rate: 100,
        minimum_io_rate: 0,
        base_io_size: 8192,
        maximum_bandwidth: 200,
    }
}

#[test]
fn example_4_3_response_emits_as_the_dump_with_maximum_bandwidth_last() {
    let dump = hex(EX_4_3_RESPONSE);
    let emitted = example_4_3_response_repr().to_vec();
    let mut expected = dump.clone();
    // Swap the dump's 8-byte groups at 80 and 88 to get 2.2.2.3's order.
    expected[80..96].rotate_left(8);
    assert_eq!(emitted, expected);
    assert_eq!(&emitted[..80], &dump[..80]);
}

/// The two examples as one conversation with the server: 4.2's association
/// and SET_POLICY, then 4.3's probe/status/counters request, answered with
/// 4.3's response values.
#[test]
fn examples_4_2_and_4_3_replay_through_the_server() {
    let config = ServerConfig {
        status_time_to_live: Duration::from_millis(3981),
        ..ServerConfig::default()
    };
    let mut table = LogicalFlowTable::new(config);
    let mut policies = HashMap::new();
    policies.insert(
        policy_id(),
        Policy {
            kind: PolicyKind::Dedicated,
            minimum_iops: 0,
            maximum_iops: 100,
            maximum_bandwidth: 200,
        },
    );
    let mut open = OpenQosState::new();
    let now = Instant::ZERO;

    // 4.2 steps 3-4.
    let associate =
        StorageQosControlRequestRepr::new(Dialect::V1_1, Options::SET_LOGICAL_FLOW_ID, flow_id())
            .to_vec();
    assert_eq!(
        process_request(
            &mut table,
            &mut open,
            OpenKind::File,
            &associate,
            0,
            now,
            &policies
        ),
        Ok(None)
    );
    // 4.2 steps 5-6, the dump's bytes as they are (offsets 104/118 pass
    // 3.2.5.1.2's checks).
    let set_policy = hex(EX_4_2_SET_POLICY);
    assert_eq!(
        process_request(
            &mut table,
            &mut open,
            OpenKind::File,
            &set_policy,
            0,
            now,
            &policies
        ),
        Ok(None)
    );
    let flow = table.get(&flow_id()).unwrap();
    assert_eq!(flow.policy_id(), policy_id());
    assert_eq!(flow.initiator_id(), initiator_id());
    assert_eq!(flow.initiator_name(), "\0".repeat(7));

    // 4.3: PROBE_POLICY is ignored (the Open is associated), counters are
    // added, the status is returned.
    let t = now + Duration::from_secs(1);
    let response = process_request(
        &mut table,
        &mut open,
        OpenKind::File,
        &hex(EX_4_3_REQUEST),
        96,
        t,
        &policies,
    )
    .unwrap()
    .expect("GET_STATUS answers with a response");
    assert_eq!(response, example_4_3_response_repr());
    let flow = table.get(&flow_id()).unwrap();
    assert_eq!(flow.counters().io_count, 399);
    assert_eq!(flow.counters().latency, 38_223_584);
    assert_eq!(flow.last_counter_update(), Some(t));
}
