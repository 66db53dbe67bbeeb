//! [MS-SQOS] 3.2 Server Details, as pure functions.
//!
//! The caller (the control plane) owns a [`LogicalFlowTable`] (3.2.1.1) and
//! stores an [`OpenQosState`] (3.2.1.2) with each SMB2 Open. For every SMB2
//! IOCTL with [`FSCTL_STORAGE_QOS_CONTROL`](crate::sqos::FSCTL_STORAGE_QOS_CONTROL)
//! it calls [`process_request`] with the input buffer and MaxOutputResponse;
//! when the Open closes it calls [`LogicalFlowTable::close_open`]; from time
//! to time (see [`LogicalFlowTable::poll_timeout`]) it calls
//! [`LogicalFlowTable::expire`]. The enforcement engine feeds what it
//! measures back with [`LogicalFlowTable::report`].
//!
//! A request that fails changes nothing: every check of 3.2.5.1.1–3.2.5.1.4
//! is made, in the specification's order, before any state is touched (see
//! `docs/spec-notes.md`, "Failed requests have no side effects").

mod flow_table;
mod policy;

pub use flow_table::{
    FlowCounters, FlowReport, FlowStatusInfo, LogicalFlow, LogicalFlowTable, ServerConfig,
};
pub use policy::{NoPolicies, Policy, PolicyKind, PolicyLookup};

use crate::ntstatus::{
    NtStatus, STATUS_INSUFFICIENT_RESOURCES, STATUS_INVALID_DEVICE_REQUEST,
    STATUS_INVALID_PARAMETER, STATUS_NOT_FOUND, STATUS_REVISION_MISMATCH,
};
use crate::sqos::{
    Dialect, Guid, Options, StorageQosControlRequest, StorageQosControlResponseRepr, Utf16Name,
    MIN_NAME_OFFSET, STORAGE_QOS_INITIATOR_NAME_SIZE,
};
use crate::time::Instant;

/// What an SMB2 Open refers to, as far as Storage QoS cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpenKind {
    /// A data file on a disk share: the only kind Storage QoS applies to.
    File,
    /// A directory.
    Directory,
    /// A named pipe (IPC$).
    NamedPipe,
    /// A printer.
    Printer,
}

/// [MS-SQOS] 3.2.1.2 Per Open: the logical flow the Open is associated to.
/// The caller keeps one with every Open (initially not associated) and hands
/// it back to [`LogicalFlowTable::close_open`] when the Open closes; it is
/// deliberately neither `Clone` nor `Copy`, since the table counts the Opens
/// referencing each flow.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct OpenQosState {
    logical_flow_id: Guid,
}

impl OpenQosState {
    /// Not associated to any logical flow (LogicalFlowID is the empty GUID).
    pub const fn new() -> Self {
        OpenQosState {
            logical_flow_id: Guid::NULL,
        }
    }
    /// The associated flow, `None` when not associated.
    pub fn logical_flow_id(&self) -> Option<Guid> {
        (!self.logical_flow_id.is_null()).then_some(self.logical_flow_id)
    }
    /// True when associated to a logical flow.
    pub fn is_associated(&self) -> bool {
        !self.logical_flow_id.is_null()
    }
}

/// The policy parameters of a SET_POLICY / PROBE_POLICY request that passed
/// [MS-SQOS] 3.2.5.1.2's checks.
struct PolicyUpdate {
    policy_id: Guid,
    initiator_id: Guid,
    limit: u64,
    reservation: u64,
    bandwidth_limit: u64,
    initiator_name: Option<String>,
    initiator_node_name: Option<String>,
}

/// [MS-SQOS] 3.2.4.1 / 3.2.5.1: handles one Storage QoS control request.
///
/// - `open`: the per-Open state of the handle the IOCTL names;
/// - `open_kind`: what the Open is (only files support Storage QoS);
/// - `request`: the IOCTL input buffer (its length is RequestSize);
/// - `max_response_size`: the IOCTL's MaxOutputResponse (MaxResponseSize);
/// - `now`: the current time (counters freshness, flow lifetime, TTLs);
/// - `policies`: where PolicyIDs are resolved.
///
/// Returns `Ok(Some(response))` for STATUS_SUCCESS with an output buffer
/// (GET_STATUS; answered in the request's dialect, 88 or 96 bytes),
/// `Ok(None)` for STATUS_SUCCESS without one, or the failure status:
///
/// | Status | When |
/// |---|---|
/// | STATUS_INVALID_DEVICE_REQUEST | Storage QoS disabled, or the Open is not a file (3.2.5.1, SHOULD) |
/// | STATUS_REVISION_MISMATCH | ProtocolVersion is not 0x0100 / 0x0101, or above the configured dialect (3.2.5.1, note <7>) |
/// | STATUS_INVALID_PARAMETER | shorter than the fixed part of its dialect; no defined Options flag (3.2.5.1); PROBE_POLICY with an empty LogicalFlowID (3.2.5.1.1); a name check or a note <8> limit fails (3.2.5.1.2); MaxResponseSize below the response size with GET_STATUS (3.2.5.1.4) |
/// | STATUS_NOT_FOUND | SET_POLICY, UPDATE_COUNTERS or GET_STATUS on an Open not associated to a flow (3.2.5.1.2–3.2.5.1.4) |
/// | STATUS_INSUFFICIENT_RESOURCES | a new flow is needed, the table is full and every flow is referenced |
pub fn process_request(
    table: &mut LogicalFlowTable,
    open: &mut OpenQosState,
    open_kind: OpenKind,
    request: &[u8],
    max_response_size: u32,
    now: Instant,
    policies: &impl PolicyLookup,
) -> Result<Option<StorageQosControlResponseRepr>, NtStatus> {
    // 3.2.5.1: "If the server does not support the Storage Quality of
    // Service function, it SHOULD fail the request with
    // STATUS_INVALID_DEVICE_REQUEST."
    if !table.config.enabled || open_kind != OpenKind::File {
        return Err(STATUS_INVALID_DEVICE_REQUEST);
    }
    // 3.2.5.1 / note <7>: ProtocolVersion must name a dialect we implement.
    // A buffer too short to hold ProtocolVersion is shorter than any fixed
    // part: STATUS_INVALID_PARAMETER.
    let version = match request {
        [lo, hi, ..] => u16::from_le_bytes([*lo, *hi]),
        _ => return Err(STATUS_INVALID_PARAMETER),
    };
    let dialect = match Dialect::from_wire(version) {
        Some(d) if d <= table.config.dialect => d,
        _ => return Err(STATUS_REVISION_MISMATCH),
    };
    // The fields of the dialect's fixed part must be present
    // (docs/spec-notes.md, "Requests shorter than the fixed part").
    let req =
        StorageQosControlRequest::new_checked(request).map_err(|_| STATUS_INVALID_PARAMETER)?;

    // 3.2.5.1: at least one flag of 2.2.2.2.
    let mut options = req.options();
    if !options.has_defined_flag() {
        return Err(STATUS_INVALID_PARAMETER);
    }
    let current =
        Some(open.logical_flow_id).filter(|id| !id.is_null() && table.flows.contains_key(id));
    // 3.2.5.1: PROBE_POLICY on an associated Open is ignored from here on.
    if options.contains(Options::PROBE_POLICY) && current.is_some() {
        options = options.without(Options::PROBE_POLICY);
    }

    // 3.2.5.1.1: association.
    let request_flow = req.logical_flow_id();
    let mut target = current;
    if options.intersects(Options::SET_LOGICAL_FLOW_ID | Options::PROBE_POLICY)
        && !request_flow.is_null()
    {
        target = Some(request_flow);
    }
    if options.contains(Options::PROBE_POLICY) && request_flow.is_null() {
        return Err(STATUS_INVALID_PARAMETER);
    }
    if options.contains(Options::SET_LOGICAL_FLOW_ID) && request_flow.is_null() {
        target = None;
    }

    // 3.2.5.1.2: set or probe policy.
    if options.contains(Options::SET_POLICY) && target.is_none() {
        return Err(STATUS_NOT_FOUND);
    }
    let policy_update = if options.intersects(Options::SET_POLICY | Options::PROBE_POLICY) {
        Some(check_policy(&req, table.config.max_policy_value)?)
    } else {
        None
    };

    // 3.2.5.1.3: update counters.
    let update_counters = options.contains(Options::UPDATE_COUNTERS);
    if update_counters && target.is_none() {
        return Err(STATUS_NOT_FOUND);
    }

    // 3.2.5.1.4: query status.
    let get_status = options.contains(Options::GET_STATUS);
    if get_status {
        // "less than 80 (size of STORAGE_QOS_CONTROL_RESPONSE)": the size
        // of the response in the request's dialect (docs/spec-notes.md,
        // "Response size 80 vs 88/96").
        if (max_response_size as usize) < dialect.response_len() {
            return Err(STATUS_INVALID_PARAMETER);
        }
        if target.is_none() {
            return Err(STATUS_NOT_FOUND);
        }
    }

    // Room for a new flow (docs/spec-notes.md, "Logical flow lifetime").
    if let Some(id) = target {
        if !table.flows.contains_key(&id) && !table.make_room() {
            return Err(STATUS_INSUFFICIENT_RESOURCES);
        }
    }

    // ---- Every check passed: apply. ----
    if target != current {
        if let Some(old) = current {
            table.detach(&old, now);
        }
        if let Some(new) = target {
            table.attach(new, now);
        }
    }
    open.logical_flow_id = target.unwrap_or(Guid::NULL);
    let Some(id) = target else {
        return Ok(None);
    };
    if let Some(flow) = table.flows.get_mut(&id) {
        flow.last_activity = now;
        if let Some(update) = policy_update {
            // 3.2.5.1.2: names only when their length is non-zero.
            if let Some(name) = update.initiator_name {
                flow.initiator_name = name;
            }
            if let Some(name) = update.initiator_node_name {
                flow.initiator_node_name = name;
            }
            flow.policy_id = update.policy_id;
            flow.initiator_id = update.initiator_id;
            flow.limit = update.limit;
            flow.reservation = update.reservation;
            flow.bandwidth_limit = update.bandwidth_limit;
            flow.policy_applied = true;
            // The enforcement engine's report was about the old parameters.
            flow.report = None;
        }
        if update_counters {
            // 2.2.2.2 UPDATE_COUNTERS: the counters "MUST be used to update
            // corresponding counters maintained by the server".
            let c = &mut flow.counters;
            c.io_count = c.io_count.saturating_add(req.io_count_increment());
            c.normalized_io_count = c
                .normalized_io_count
                .saturating_add(req.normalized_io_count_increment());
            c.latency = c.latency.saturating_add(req.latency_increment());
            c.lower_latency = c
                .lower_latency
                .saturating_add(req.lower_latency_increment());
            c.kilobyte_count = c
                .kilobyte_count
                .saturating_add(req.kilobyte_count_increment().unwrap_or(0));
            c.updates = c.updates.saturating_add(1);
            flow.last_counter_update = Some(now);
        }
    }
    if !get_status {
        return Ok(None);
    }
    // 3.2.5.1.4: construct the response.
    let (Some(info), Some(flow)) = (table.flow_status(&id, now, policies), table.flows.get(&id))
    else {
        return Err(STATUS_NOT_FOUND);
    };
    Ok(Some(StorageQosControlResponseRepr {
        dialect,
        logical_flow_id: id,
        policy_id: flow.policy_id,
        initiator_id: flow.initiator_id,
        time_to_live: info.time_to_live,
        status: info.status,
        maximum_io_rate: info.maximum_io_rate,
        minimum_io_rate: info.minimum_io_rate,
        base_io_size: info.base_io_size,
        maximum_bandwidth: match dialect {
            Dialect::V1_0 => 0,
            Dialect::V1_1 => info.maximum_bandwidth,
        },
    }))
}

/// [MS-SQOS] 3.2.5.1.2: the name checks, then the field checks of note <8>.
fn check_policy(
    req: &StorageQosControlRequest<&[u8]>,
    max_value: u64,
) -> Result<PolicyUpdate, NtStatus> {
    let request_size = req.request_size();
    let name_ok = |offset: u16, length: u16| {
        let (offset, length) = (usize::from(offset), usize::from(length));
        length <= STORAGE_QOS_INITIATOR_NAME_SIZE
            && !(length > 0 && offset < MIN_NAME_OFFSET)
            && length + offset <= request_size
    };
    if !name_ok(req.initiator_name_offset(), req.initiator_name_length())
        || !name_ok(
            req.initiator_node_name_offset(),
            req.initiator_node_name_length(),
        )
    {
        return Err(STATUS_INVALID_PARAMETER);
    }
    let decode = |bytes: Result<&[u8], _>| -> Result<Option<String>, NtStatus> {
        let bytes = bytes.map_err(|_| STATUS_INVALID_PARAMETER)?;
        if bytes.is_empty() {
            return Ok(None);
        }
        let name = Utf16Name::from_utf16le(bytes).map_err(|_| STATUS_INVALID_PARAMETER)?;
        Ok(Some(name.to_string_lossy()))
    };
    let initiator_name = decode(req.initiator_name())?;
    let initiator_node_name = decode(req.initiator_node_name())?;

    // Note <8> (docs/spec-notes.md, "Note <8> limits").
    let policy_id = req.policy_id();
    let limit = req.limit();
    let reservation = req.reservation();
    let bandwidth_limit = req.bandwidth_limit().unwrap_or(0);
    let has_policy = !policy_id.is_null();
    if limit > max_value
        || reservation > max_value
        || bandwidth_limit > max_value
        || (limit > 0 && reservation > limit)
        || (limit > 0 && has_policy)
        || (bandwidth_limit > 0 && has_policy)
        || (reservation > 0 && has_policy)
    {
        return Err(STATUS_INVALID_PARAMETER);
    }
    Ok(PolicyUpdate {
        policy_id,
        initiator_id: req.initiator_id(),
        limit,
        reservation,
        bandwidth_limit,
        initiator_name,
        initiator_node_name,
    })
}
