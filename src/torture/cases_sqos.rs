//! MS-SQOS cases: FSCTL_STORAGE_QOS_CONTROL requests ([MS-SQOS] 2.2.2.2)
//! in SMB2 IOCTL that break a rule of 3.2.5.1 - 3.2.5.1.4 or note <8>,
//! each answered with the NTSTATUS the specification names. A request
//! that fails must also change nothing (docs/spec-notes.md, "Failed
//! requests have no side effects"): where the failing request also asked
//! to associate the Open, a GET_STATUS afterwards must still find it
//! unassociated (STATUS_NOT_FOUND).

use super::rig::Rig;
use super::smb2_peer::Smb2Peer;
use super::{Case, Layer, Observation};
use smbdirect_dataplane::provider::Provider;
use smbdirect_protocol::ntstatus::{
    NtStatus, STATUS_INVALID_DEVICE_REQUEST, STATUS_INVALID_PARAMETER, STATUS_NOT_FOUND,
    STATUS_REVISION_MISMATCH,
};
use smbdirect_protocol::smb2::FileId;
use smbdirect_protocol::sqos::{
    Dialect, Guid, Options, StorageQosControlRequest, StorageQosControlRequestRepr, Utf16Name,
    FSCTL_STORAGE_QOS_CONTROL, STORAGE_QOS_INITIATOR_NAME_SIZE,
};

type Outcome = Result<Observation, String>;

/// MaxOutputResponse of requests that ask for a status (a dialect 1.1
/// response is 96 bytes).
const STATUS_OUTPUT: u32 = 96;
/// Above every limit of note <8>.
const OVER_NOTE_8: u64 = 1_000_000_001;

pub(super) fn cases<P: Provider>() -> Vec<Case<P>> {
    let invalid = "STATUS_INVALID_PARAMETER";
    let invalid_unchanged =
        "STATUS_INVALID_PARAMETER, and the Open stays unassociated (a GET_STATUS then gets STATUS_NOT_FOUND)";
    let note8 = "[MS-SQOS] 3.2.5.1.2, note <8> (docs/spec-notes.md: Note <8> limits)";
    let names = "[MS-SQOS] 3.2.5.1.2";
    vec![
        Case {
            name: "sqos-no-option-flags",
            layer: Layer::Sqos,
            rule: "[MS-SQOS] 3.2.5.1",
            expected: invalid,
            run: no_options::<P>,
        },
        Case {
            name: "sqos-only-undefined-option-flags",
            layer: Layer::Sqos,
            rule: "[MS-SQOS] 3.2.5.1, 2.2.2.2",
            expected: invalid,
            run: undefined_options::<P>,
        },
        Case {
            name: "sqos-unsupported-protocol-version",
            layer: Layer::Sqos,
            rule: "[MS-SQOS] 3.2.5.1, note <7>",
            expected: "STATUS_REVISION_MISMATCH",
            run: bad_version::<P>,
        },
        Case {
            name: "sqos-request-shorter-than-its-fixed-part",
            layer: Layer::Sqos,
            rule: "[MS-SQOS] 2.2.2.2, 3.2.5.1 (docs/spec-notes.md: Requests shorter than the fixed part)",
            expected: invalid,
            run: truncated::<P>,
        },
        Case {
            name: "sqos-probe-policy-with-a-null-flow-id",
            layer: Layer::Sqos,
            rule: "[MS-SQOS] 3.2.5.1.1",
            expected: invalid,
            run: probe_null_flow::<P>,
        },
        Case {
            name: "sqos-set-policy-on-an-unassociated-open",
            layer: Layer::Sqos,
            rule: "[MS-SQOS] 3.2.5.1.2",
            expected: "STATUS_NOT_FOUND",
            run: set_policy_unassociated::<P>,
        },
        Case {
            name: "sqos-update-counters-on-an-unassociated-open",
            layer: Layer::Sqos,
            rule: "[MS-SQOS] 3.2.5.1.3",
            expected: "STATUS_NOT_FOUND",
            run: update_counters_unassociated::<P>,
        },
        Case {
            name: "sqos-get-status-on-an-unassociated-open",
            layer: Layer::Sqos,
            rule: "[MS-SQOS] 3.2.5.1.4",
            expected: "STATUS_NOT_FOUND",
            run: get_status_unassociated::<P>,
        },
        Case {
            name: "sqos-get-status-max-response-size-below-80",
            layer: Layer::Sqos,
            rule: "[MS-SQOS] 3.2.5.1.4 (docs/spec-notes.md: Response size 80 vs 88/96)",
            expected: invalid_unchanged,
            run: max_response_79::<P>,
        },
        Case {
            name: "sqos-initiator-name-longer-than-512-bytes",
            layer: Layer::Sqos,
            rule: names,
            expected: invalid_unchanged,
            run: name_too_long::<P>,
        },
        Case {
            name: "sqos-initiator-name-offset-below-104",
            layer: Layer::Sqos,
            rule: names,
            expected: invalid_unchanged,
            run: name_offset_low::<P>,
        },
        Case {
            name: "sqos-initiator-name-beyond-the-request",
            layer: Layer::Sqos,
            rule: names,
            expected: invalid_unchanged,
            run: name_beyond::<P>,
        },
        Case {
            name: "sqos-initiator-node-name-longer-than-512-bytes",
            layer: Layer::Sqos,
            rule: names,
            expected: invalid_unchanged,
            run: node_name_too_long::<P>,
        },
        Case {
            name: "sqos-initiator-node-name-offset-below-104",
            layer: Layer::Sqos,
            rule: names,
            expected: invalid_unchanged,
            run: node_name_offset_low::<P>,
        },
        Case {
            name: "sqos-initiator-node-name-beyond-the-request",
            layer: Layer::Sqos,
            rule: names,
            expected: invalid_unchanged,
            run: node_name_beyond::<P>,
        },
        Case {
            name: "sqos-limit-over-1000000000",
            layer: Layer::Sqos,
            rule: note8,
            expected: invalid_unchanged,
            run: limit_over::<P>,
        },
        Case {
            name: "sqos-reservation-over-1000000000",
            layer: Layer::Sqos,
            rule: note8,
            expected: invalid_unchanged,
            run: reservation_over::<P>,
        },
        Case {
            name: "sqos-bandwidth-limit-over-1000000000",
            layer: Layer::Sqos,
            rule: note8,
            expected: invalid_unchanged,
            run: bandwidth_over::<P>,
        },
        Case {
            name: "sqos-reservation-above-limit",
            layer: Layer::Sqos,
            rule: note8,
            expected: invalid_unchanged,
            run: reservation_above_limit::<P>,
        },
        Case {
            name: "sqos-limit-with-a-policy-id",
            layer: Layer::Sqos,
            rule: note8,
            expected: invalid_unchanged,
            run: limit_with_policy::<P>,
        },
        Case {
            name: "sqos-bandwidth-limit-with-a-policy-id",
            layer: Layer::Sqos,
            rule: note8,
            expected: invalid_unchanged,
            run: bandwidth_with_policy::<P>,
        },
        Case {
            name: "sqos-reservation-with-a-policy-id",
            layer: Layer::Sqos,
            rule: note8,
            expected: invalid_unchanged,
            run: reservation_with_policy::<P>,
        },
        Case {
            name: "sqos-request-on-a-directory",
            layer: Layer::Sqos,
            rule: "[MS-SQOS] 3.2.5.1 (docs/spec-notes.md: Which Opens support Storage QoS)",
            expected: "STATUS_INVALID_DEVICE_REQUEST",
            run: on_directory::<P>,
        },
    ]
}

fn options(flags: &[Options]) -> Options {
    Options::from_bits(flags.iter().fold(0, |a, o| a | o.bits()))
}

/// A GUID for this run's case number `n` (flows and policies).
fn guid(n: u64, kind: u16) -> Guid {
    Guid::from_fields(n as u32, kind, 0x7ea5, *b"torture!")
}

/// A valid dialect 1.1 SET_LOGICAL_FLOW_ID | SET_POLICY request for a
/// fresh flow, with both names, a client-defined limit and no PolicyID.
fn associate_and_set<P: Provider>(rig: &mut Rig<P>) -> StorageQosControlRequestRepr<'static> {
    let n = rig.next_seq();
    let mut r = StorageQosControlRequestRepr::new(
        Dialect::V1_1,
        options(&[Options::SET_LOGICAL_FLOW_ID, Options::SET_POLICY]),
        guid(n, 0xf10e),
    );
    r.initiator_id = guid(n, 0x1d1d);
    r.limit = 1000;
    r.initiator_name = Utf16Name::new("torture-vm").unwrap_or(Utf16Name::EMPTY);
    r.initiator_node_name = Utf16Name::new("torture-host").unwrap_or(Utf16Name::EMPTY);
    r
}

/// A session with an open file to send requests on.
fn open<P: Provider>(rig: &mut Rig<P>) -> Result<(Smb2Peer<P>, FileId), String> {
    Smb2Peer::with_file(rig, "sqos")
}

/// Sends `input` and expects `want`; with `unchanged`, also checks that
/// the Open is still not associated afterwards.
fn expect<P: Provider>(
    rig: &mut Rig<P>,
    label: &str,
    input: &[u8],
    max_output: u32,
    want: NtStatus,
    unchanged: bool,
) -> Outcome {
    let (mut s, fid) = open(rig)?;
    let o = exchange(&mut s, fid, label, input, max_output, want, unchanged);
    s.close_file(fid);
    s.close();
    o
}

fn exchange<P: Provider>(
    s: &mut Smb2Peer<P>,
    fid: FileId,
    label: &str,
    input: &[u8],
    max_output: u32,
    want: NtStatus,
    unchanged: bool,
) -> Outcome {
    let (st, _) = s.ioctl(fid, FSCTL_STORAGE_QOS_CONTROL, input, max_output)?;
    if st != want {
        return Ok(Observation::fail(format!(
            "{label}: expected {want}, got {st}"
        )));
    }
    let mut text = format!("{label}: {st}");
    if unchanged {
        let probe =
            StorageQosControlRequestRepr::new(Dialect::V1_1, Options::GET_STATUS, Guid::NULL)
                .to_vec();
        let (after, _) = s.ioctl(fid, FSCTL_STORAGE_QOS_CONTROL, &probe, STATUS_OUTPUT)?;
        if after != STATUS_NOT_FOUND {
            return Ok(Observation::fail(format!(
                "{text}, but the failed request left the Open associated (GET_STATUS then got {after})"
            )));
        }
        text.push_str("; GET_STATUS then: STATUS_NOT_FOUND (nothing associated)");
    }
    match s.still_usable() {
        Ok(()) => Ok(Observation::pass(text)),
        Err(e) => Ok(Observation::fail(format!("{text}, but {e}"))),
    }
}

fn no_options<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let n = rig.next_seq();
    let r = StorageQosControlRequestRepr::new(Dialect::V1_1, Options::NONE, guid(n, 0xf10e));
    expect(
        rig,
        "Options 0",
        &r.to_vec(),
        0,
        STATUS_INVALID_PARAMETER,
        false,
    )
}

fn undefined_options<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let n = rig.next_seq();
    let r = StorageQosControlRequestRepr::new(
        Dialect::V1_1,
        Options::from_bits(0x8000_0100),
        guid(n, 0xf10e),
    );
    expect(
        rig,
        "Options 0x80000100 (no defined flag)",
        &r.to_vec(),
        0,
        STATUS_INVALID_PARAMETER,
        false,
    )
}

fn bad_version<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let mut v = associate_and_set(rig).to_vec();
    StorageQosControlRequest::new_unchecked(&mut v[..]).set_protocol_version(0x0200);
    expect(
        rig,
        "ProtocolVersion 0x0200",
        &v,
        0,
        STATUS_REVISION_MISMATCH,
        true,
    )
}

fn truncated<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let mut v = associate_and_set(rig).to_vec();
    v.truncate(100);
    expect(
        rig,
        "a dialect 1.1 request of 100 bytes (fixed part 128)",
        &v,
        0,
        STATUS_INVALID_PARAMETER,
        true,
    )
}

fn probe_null_flow<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let r = StorageQosControlRequestRepr::new(
        Dialect::V1_1,
        options(&[Options::PROBE_POLICY, Options::GET_STATUS]),
        Guid::NULL,
    );
    expect(
        rig,
        "PROBE_POLICY with LogicalFlowID NULL",
        &r.to_vec(),
        STATUS_OUTPUT,
        STATUS_INVALID_PARAMETER,
        true,
    )
}

fn set_policy_unassociated<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let mut r = associate_and_set(rig);
    r.options = Options::SET_POLICY;
    expect(
        rig,
        "SET_POLICY alone on a fresh Open",
        &r.to_vec(),
        0,
        STATUS_NOT_FOUND,
        false,
    )
}

fn update_counters_unassociated<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let mut r =
        StorageQosControlRequestRepr::new(Dialect::V1_1, Options::UPDATE_COUNTERS, Guid::NULL);
    r.io_count_increment = 10;
    r.normalized_io_count_increment = 10;
    expect(
        rig,
        "UPDATE_COUNTERS on a fresh Open",
        &r.to_vec(),
        0,
        STATUS_NOT_FOUND,
        false,
    )
}

fn get_status_unassociated<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let r = StorageQosControlRequestRepr::new(Dialect::V1_1, Options::GET_STATUS, Guid::NULL);
    expect(
        rig,
        "GET_STATUS on a fresh Open",
        &r.to_vec(),
        STATUS_OUTPUT,
        STATUS_NOT_FOUND,
        false,
    )
}

fn max_response_79<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let mut r = associate_and_set(rig);
    r.options = options(&[Options::SET_LOGICAL_FLOW_ID, Options::GET_STATUS]);
    expect(
        rig,
        "SET_LOGICAL_FLOW_ID | GET_STATUS with MaxOutputResponse 79",
        &r.to_vec(),
        79,
        STATUS_INVALID_PARAMETER,
        true,
    )
}

/// Which name a name case breaks.
#[derive(Clone, Copy)]
enum Name {
    Initiator,
    Node,
}

/// Breaks `which` name's offset/length of a valid request with `patch`
/// (`(request size, name offset, name length) -> (offset, length, new
/// request size)`).
fn name_case<P: Provider>(
    rig: &mut Rig<P>,
    which: Name,
    label: &str,
    patch: impl FnOnce(usize, u16, u16) -> (u16, u16, usize),
) -> Outcome {
    let mut v = associate_and_set(rig).to_vec();
    let (off, len) = {
        let view = StorageQosControlRequest::new_unchecked(&v[..]);
        match which {
            Name::Initiator => (view.initiator_name_offset(), view.initiator_name_length()),
            Name::Node => (
                view.initiator_node_name_offset(),
                view.initiator_node_name_length(),
            ),
        }
    };
    let (off, len, size) = patch(v.len(), off, len);
    v.resize(size, 0);
    {
        let mut view = StorageQosControlRequest::new_unchecked(&mut v[..]);
        match which {
            Name::Initiator => {
                view.set_initiator_name_offset(off);
                view.set_initiator_name_length(len);
            }
            Name::Node => {
                view.set_initiator_node_name_offset(off);
                view.set_initiator_node_name_length(len);
            }
        }
    }
    let label = format!("{label} (offset {off}, length {len}, RequestSize {size})");
    expect(rig, &label, &v, 0, STATUS_INVALID_PARAMETER, true)
}

fn too_long(size: usize, off: u16, _len: u16) -> (u16, u16, usize) {
    let len = (STORAGE_QOS_INITIATOR_NAME_SIZE + 2) as u16;
    (off, len, size.max(usize::from(off) + usize::from(len)))
}

fn offset_low(size: usize, _off: u16, len: u16) -> (u16, u16, usize) {
    (100, len, size)
}

fn beyond(size: usize, _off: u16, len: u16) -> (u16, u16, usize) {
    ((size - 4) as u16, len.max(8), size)
}

fn name_too_long<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    name_case(rig, Name::Initiator, "InitiatorNameLength 514", too_long)
}

fn name_offset_low<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    name_case(rig, Name::Initiator, "InitiatorNameOffset 100", offset_low)
}

fn name_beyond<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    name_case(
        rig,
        Name::Initiator,
        "InitiatorName past RequestSize",
        beyond,
    )
}

fn node_name_too_long<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    name_case(rig, Name::Node, "InitiatorNodeNameLength 514", too_long)
}

fn node_name_offset_low<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    name_case(rig, Name::Node, "InitiatorNodeNameOffset 100", offset_low)
}

fn node_name_beyond<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    name_case(
        rig,
        Name::Node,
        "InitiatorNodeName past RequestSize",
        beyond,
    )
}

/// A note <8> case: `f` breaks one field of a valid request.
fn note8<P: Provider>(
    rig: &mut Rig<P>,
    label: &str,
    f: impl FnOnce(&mut StorageQosControlRequestRepr<'static>, Guid),
) -> Outcome {
    let mut r = associate_and_set(rig);
    r.limit = 0;
    let policy = guid(rig.next_seq(), 0x9011);
    f(&mut r, policy);
    expect(rig, label, &r.to_vec(), 0, STATUS_INVALID_PARAMETER, true)
}

fn limit_over<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    note8(rig, "Limit 1000000001", |r, _| r.limit = OVER_NOTE_8)
}

fn reservation_over<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    note8(rig, "Reservation 1000000001, Limit 0", |r, _| {
        r.reservation = OVER_NOTE_8
    })
}

fn bandwidth_over<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    note8(rig, "BandwidthLimit 1000000001", |r, _| {
        r.bandwidth_limit = OVER_NOTE_8
    })
}

fn reservation_above_limit<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    note8(rig, "Limit 100, Reservation 200", |r, _| {
        r.limit = 100;
        r.reservation = 200;
    })
}

fn limit_with_policy<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    note8(rig, "Limit 100 with a PolicyID", |r, p| {
        r.limit = 100;
        r.policy_id = p;
    })
}

fn bandwidth_with_policy<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    note8(rig, "BandwidthLimit 100 with a PolicyID", |r, p| {
        r.bandwidth_limit = 100;
        r.policy_id = p;
    })
}

fn reservation_with_policy<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    note8(rig, "Reservation 100 with a PolicyID", |r, p| {
        r.reservation = 100;
        r.policy_id = p;
    })
}

fn on_directory<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let mut s = Smb2Peer::connect(rig)?;
    s.negotiate()?;
    s.session_setup()?;
    s.tree_connect()?;
    let name = format!("torture-dir-{}-{}", std::process::id(), rig.next_seq());
    let fid = s.create(&name, true)?;
    let r = associate_and_set(rig);
    let o = exchange(
        &mut s,
        fid,
        "SET_LOGICAL_FLOW_ID | SET_POLICY on a directory Open",
        &r.to_vec(),
        0,
        STATUS_INVALID_DEVICE_REQUEST,
        false,
    );
    s.close_file(fid);
    s.close();
    o
}
