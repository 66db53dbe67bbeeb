//! [MS-SQOS] 3.2.1.1 LogicalFlowTable and 3.2.1.3 Per Logical Flow state.

use std::collections::HashMap;

use super::policy::{PolicyKind, PolicyLookup};
use super::OpenQosState;
use crate::sqos::{Dialect, FlowStatus, Guid, DEFAULT_BASE_IO_SIZE};
use crate::time::{Duration, Instant};

/// Server settings: the Global ADM element Dialect ([MS-SQOS] 3.2.1.1) and
/// the implementation-defined values the specification leaves open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerConfig {
    /// Whether this server supports the Storage QoS function at all
    /// ([MS-SQOS] 3.2.5.1: if not, requests fail with
    /// STATUS_INVALID_DEVICE_REQUEST).
    pub enabled: bool,
    /// [MS-SQOS] 3.2.3: the highest dialect the server implements (note <6>:
    /// 1.1). Requests naming a higher dialect fail with
    /// STATUS_REVISION_MISMATCH.
    pub dialect: Dialect,
    /// BaseIoSize of every new flow (note <9>: Windows uses 8192 for all
    /// flows). 0 is replaced by 8192.
    pub base_io_size: u32,
    /// TimeToLive returned when the status is derived from the flow's policy
    /// (no fresh enforcement report): "the expected period of validity"
    /// ([MS-SQOS] 3.2.5.1.4). Clamped to 1 ms .. u32::MAX ms.
    pub status_time_to_live: Duration,
    /// How long a flow no Open references survives after its last activity;
    /// see `docs/spec-notes.md`, "Logical flow lifetime".
    pub flow_retention: Duration,
    /// Bound on LogicalFlowTable's size (peers create flows).
    pub max_flows: usize,
    /// Largest Limit, Reservation and BandwidthLimit accepted (note <8>:
    /// 1 000 000 000 on Windows).
    pub max_policy_value: u64,
    /// Whether the enforcement engine can honour a minimum rate
    /// (Reservation / a policy's minimum); if not, a flow asking for one
    /// reports StorageQoSStatusConfigurationMismatch.
    pub supports_reservations: bool,
    /// Whether the enforcement engine can honour a bandwidth limit; always
    /// false when `dialect` is 1.0 (no BandwidthLimit / MaximumBandwidth).
    pub supports_bandwidth_limits: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            enabled: true,
            dialect: Dialect::HIGHEST,
            base_io_size: DEFAULT_BASE_IO_SIZE,
            status_time_to_live: Duration::from_secs(4),
            flow_retention: Duration::from_secs(60),
            max_flows: 65_536,
            max_policy_value: 1_000_000_000,
            supports_reservations: true,
            supports_bandwidth_limits: true,
        }
    }
}

/// Counters a flow accumulates from UPDATE_COUNTERS requests ([MS-SQOS]
/// 2.2.2.2, flag STORAGE_QOS_CONTROL_FLAG_UPDATE_COUNTERS). Totals since the
/// flow was created, saturating; the enforcement engine computes rates from
/// the difference between two readings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FlowCounters {
    /// Sum of IoCountIncrement.
    pub io_count: u64,
    /// Sum of NormalizedIoCountIncrement.
    pub normalized_io_count: u64,
    /// Sum of LatencyIncrement (100 ns units).
    pub latency: u64,
    /// Sum of LowerLatencyIncrement (100 ns units).
    pub lower_latency: u64,
    /// Sum of KilobyteCountIncrement (KB = 1024 bytes; dialect 1.1 requests only).
    pub kilobyte_count: u64,
    /// Number of UPDATE_COUNTERS requests applied.
    pub updates: u64,
}

/// What the enforcement engine measured and decided for a flow, reported
/// with [`LogicalFlowTable::report`]. While fresh (`time_to_live` after
/// the report) it is what GET_STATUS returns, in place of the values derived
/// from the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowReport {
    /// Status ([MS-SQOS] 2.2.2.1), e.g. InsufficientThroughput when the
    /// engine cannot meet the minimum.
    pub status: FlowStatus,
    /// MaximumIoRate assigned, normalized IOPS.
    pub maximum_io_rate: u64,
    /// MinimumIoRate assigned, normalized IOPS.
    pub minimum_io_rate: u64,
    /// MaximumBandwidth assigned, KB/s.
    pub maximum_bandwidth: u64,
    /// How long the report stays valid; GET_STATUS returns the remaining
    /// part as TimeToLive.
    pub time_to_live: Duration,
}

/// The status part of a STORAGE_QOS_CONTROL_RESPONSE for one flow
/// ([MS-SQOS] 3.2.5.1.4), as [`LogicalFlowTable::flow_status`] computes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowStatusInfo {
    /// Status.
    pub status: FlowStatus,
    /// MaximumIoRate, normalized IOPS.
    pub maximum_io_rate: u64,
    /// MinimumIoRate, normalized IOPS.
    pub minimum_io_rate: u64,
    /// MaximumBandwidth, KB/s.
    pub maximum_bandwidth: u64,
    /// TimeToLive, milliseconds (always positive).
    pub time_to_live: u32,
    /// BaseIoSize.
    pub base_io_size: u32,
}

/// A logical flow ([MS-SQOS] 3.2.1.3), plus the bookkeeping this server
/// adds: counters, the Opens referencing it, its last activity and the
/// latest enforcement report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogicalFlow {
    pub(super) logical_flow_id: Guid,
    pub(super) policy_id: Guid,
    pub(super) initiator_id: Guid,
    pub(super) limit: u64,
    pub(super) reservation: u64,
    pub(super) bandwidth_limit: u64,
    pub(super) initiator_name: String,
    pub(super) initiator_node_name: String,
    pub(super) base_io_size: u32,
    pub(super) policy_applied: bool,
    pub(super) counters: FlowCounters,
    pub(super) last_counter_update: Option<Instant>,
    pub(super) last_activity: Instant,
    pub(super) open_count: usize,
    pub(super) report: Option<(FlowReport, Instant)>,
}

impl LogicalFlow {
    fn new(logical_flow_id: Guid, base_io_size: u32, now: Instant) -> Self {
        LogicalFlow {
            logical_flow_id,
            policy_id: Guid::NULL,
            initiator_id: Guid::NULL,
            limit: 0,
            reservation: 0,
            bandwidth_limit: 0,
            initiator_name: String::new(),
            initiator_node_name: String::new(),
            base_io_size,
            policy_applied: false,
            counters: FlowCounters::default(),
            last_counter_update: None,
            last_activity: now,
            open_count: 0,
            report: None,
        }
    }

    /// LogicalFlowID.
    pub fn logical_flow_id(&self) -> Guid {
        self.logical_flow_id
    }
    /// PolicyID (NULL: client-defined limits, or none).
    pub fn policy_id(&self) -> Guid {
        self.policy_id
    }
    /// InitiatorID.
    pub fn initiator_id(&self) -> Guid {
        self.initiator_id
    }
    /// Limit, normalized IOPS (client-defined; 0: not defined).
    pub fn limit(&self) -> u64 {
        self.limit
    }
    /// Reservation, normalized IOPS (client-defined).
    pub fn reservation(&self) -> u64 {
        self.reservation
    }
    /// BandwidthLimit, KB/s (client-defined; 0: not defined).
    pub fn bandwidth_limit(&self) -> u64 {
        self.bandwidth_limit
    }
    /// InitiatorName, decoded lossily from UTF-16LE.
    pub fn initiator_name(&self) -> &str {
        &self.initiator_name
    }
    /// InitiatorNodeName, decoded lossily from UTF-16LE.
    pub fn initiator_node_name(&self) -> &str {
        &self.initiator_node_name
    }
    /// BaseIoSize.
    pub fn base_io_size(&self) -> u32 {
        self.base_io_size
    }
    /// True once a SET_POLICY or PROBE_POLICY has been applied.
    pub fn policy_applied(&self) -> bool {
        self.policy_applied
    }
    /// Accumulated counters.
    pub fn counters(&self) -> &FlowCounters {
        &self.counters
    }
    /// When counters were last updated.
    pub fn last_counter_update(&self) -> Option<Instant> {
        self.last_counter_update
    }
    /// Last activity (creation, association, detachment, policy change or
    /// counter update); enforcement reports do not count.
    pub fn last_activity(&self) -> Instant {
        self.last_activity
    }
    /// Number of Opens associated to the flow.
    pub fn open_count(&self) -> usize {
        self.open_count
    }
    /// The latest enforcement report and when it was made.
    pub fn report(&self) -> Option<&(FlowReport, Instant)> {
        self.report.as_ref()
    }

    /// When the flow becomes removable by [`LogicalFlowTable::expire`], if
    /// no Open references it.
    fn expiry(&self, retention: Duration) -> Option<Instant> {
        (self.open_count == 0).then(|| self.last_activity + retention)
    }
}

/// [MS-SQOS] 3.2.1.1 LogicalFlowTable: the logical flows that exist,
/// indexed by LogicalFlowID, with the server's [`ServerConfig`].
///
/// Lifetime of a flow (`docs/spec-notes.md`, "Logical flow lifetime"): it
/// is created by the first SET_LOGICAL_FLOW_ID / PROBE_POLICY naming it, and
/// it stays while at least one Open is associated to it; once none is, it
/// stays for [`ServerConfig::flow_retention`] after its last activity and is
/// then removed by [`expire`](Self::expire).
#[derive(Debug, Clone)]
pub struct LogicalFlowTable {
    pub(super) config: ServerConfig,
    pub(super) flows: HashMap<Guid, LogicalFlow>,
}

impl LogicalFlowTable {
    /// An empty table.
    pub fn new(mut config: ServerConfig) -> Self {
        if config.base_io_size == 0 {
            config.base_io_size = DEFAULT_BASE_IO_SIZE;
        }
        if config.dialect == Dialect::V1_0 {
            config.supports_bandwidth_limits = false;
        }
        LogicalFlowTable {
            config,
            flows: HashMap::new(),
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// Number of flows.
    pub fn len(&self) -> usize {
        self.flows.len()
    }

    /// True when no flow exists.
    pub fn is_empty(&self) -> bool {
        self.flows.is_empty()
    }

    /// The flow with this LogicalFlowID.
    pub fn get(&self, logical_flow_id: &Guid) -> Option<&LogicalFlow> {
        self.flows.get(logical_flow_id)
    }

    /// Every flow, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &LogicalFlow> {
        self.flows.values()
    }

    /// The enforcement engine reports what it measured and decided for a
    /// flow (its status — e.g. InsufficientThroughput,
    /// ConfigurationMismatch, NotAvailable — and the rates it assigned).
    /// GET_STATUS returns this until `report.time_to_live` has passed.
    /// Returns false when no such flow exists. A report is not activity: it
    /// does not keep an unreferenced flow alive.
    pub fn report(&mut self, logical_flow_id: &Guid, report: FlowReport, now: Instant) -> bool {
        match self.flows.get_mut(logical_flow_id) {
            Some(flow) => {
                flow.report = Some((report, now));
                true
            }
            None => false,
        }
    }

    /// The Open is closed: it no longer references its logical flow (the
    /// flow's retention period starts). Idempotent.
    pub fn close_open(&mut self, open: &mut OpenQosState, now: Instant) {
        let id = core::mem::replace(&mut open.logical_flow_id, Guid::NULL);
        self.detach(&id, now);
    }

    /// Removes every flow that no Open references and whose last activity
    /// is at least [`ServerConfig::flow_retention`] old. Returns how many
    /// were removed.
    pub fn expire(&mut self, now: Instant) -> usize {
        let retention = self.config.flow_retention;
        let before = self.flows.len();
        self.flows.retain(|_, f| match f.expiry(retention) {
            Some(at) => now < at,
            None => true,
        });
        before - self.flows.len()
    }

    /// The earliest instant at which [`expire`](Self::expire) would remove
    /// a flow, if any is unreferenced.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let retention = self.config.flow_retention;
        self.flows
            .values()
            .filter_map(|f| f.expiry(retention))
            .min()
    }

    /// [MS-SQOS] 3.2.5.1.4: the Status, MaximumIoRate, MinimumIoRate,
    /// MaximumBandwidth, TimeToLive and BaseIoSize a GET_STATUS on this flow
    /// returns now; `None` when no such flow exists. See
    /// `docs/spec-notes.md`, "Which flow status is reported".
    pub fn flow_status(
        &self,
        logical_flow_id: &Guid,
        now: Instant,
        policies: &impl PolicyLookup,
    ) -> Option<FlowStatusInfo> {
        let flow = self.flows.get(logical_flow_id)?;
        let default_ttl = duration_to_ttl_ms(self.config.status_time_to_live);
        let base_io_size = flow.base_io_size;

        // 1. A fresh report from the enforcement engine.
        if let Some((report, at)) = flow.report {
            let valid_until = at + report.time_to_live;
            if now < valid_until {
                return Some(FlowStatusInfo {
                    status: report.status,
                    maximum_io_rate: report.maximum_io_rate,
                    minimum_io_rate: report.minimum_io_rate,
                    maximum_bandwidth: report.maximum_bandwidth,
                    time_to_live: duration_to_ttl_ms(valid_until - now),
                    base_io_size,
                });
            }
        }
        let unavailable = |status| FlowStatusInfo {
            status,
            maximum_io_rate: 0,
            minimum_io_rate: 0,
            maximum_bandwidth: 0,
            time_to_live: default_ttl,
            base_io_size,
        };
        // 2. Nothing to derive a status from yet.
        if !flow.policy_applied {
            return Some(unavailable(FlowStatus::NotAvailable));
        }
        // 3. Derived from the policy, or from the client-defined limits.
        let mut mismatch = false;
        let (max, mut min, mut bandwidth) = if flow.policy_id.is_null() {
            (flow.limit, flow.reservation, flow.bandwidth_limit)
        } else {
            let Some(policy) = policies.lookup(&flow.policy_id) else {
                return Some(unavailable(FlowStatus::UnknownPolicyId));
            };
            mismatch |= policy.is_mismatched();
            let sharers = match policy.kind {
                PolicyKind::Dedicated => 1,
                PolicyKind::Aggregated => self
                    .flows
                    .values()
                    .filter(|f| f.policy_applied && f.policy_id == flow.policy_id)
                    .count()
                    .max(1) as u64,
            };
            (
                policy.maximum_iops.div_ceil(sharers),
                if mismatch {
                    0
                } else {
                    policy.minimum_iops / sharers
                },
                policy.maximum_bandwidth.div_ceil(sharers),
            )
        };
        if min > 0 && !self.config.supports_reservations {
            min = 0;
            mismatch = true;
        }
        if bandwidth > 0 && !self.config.supports_bandwidth_limits {
            bandwidth = 0;
            mismatch = true;
        }
        Some(FlowStatusInfo {
            status: if mismatch {
                FlowStatus::ConfigurationMismatch
            } else {
                FlowStatus::Ok
            },
            maximum_io_rate: max,
            minimum_io_rate: min,
            maximum_bandwidth: bandwidth,
            time_to_live: default_ttl,
            base_io_size,
        })
    }

    // ---- used by process_request -------------------------------------

    /// Drops a reference from `id` (if the flow exists).
    pub(super) fn detach(&mut self, id: &Guid, now: Instant) {
        if id.is_null() {
            return;
        }
        if let Some(flow) = self.flows.get_mut(id) {
            flow.open_count = flow.open_count.saturating_sub(1);
            flow.last_activity = now;
        }
    }

    /// Adds a reference to `id`, creating the flow if needed (the caller
    /// made room with `make_room_for`).
    pub(super) fn attach(&mut self, id: Guid, now: Instant) -> &mut LogicalFlow {
        let base = self.config.base_io_size;
        let flow = self
            .flows
            .entry(id)
            .or_insert_with(|| LogicalFlow::new(id, base, now));
        flow.open_count = flow.open_count.saturating_add(1);
        flow.last_activity = now;
        flow
    }

    /// Ensures one more flow fits: at capacity, evicts the unreferenced
    /// flow with the oldest activity. False when every flow is referenced.
    pub(super) fn make_room(&mut self) -> bool {
        if self.flows.len() < self.config.max_flows {
            return true;
        }
        let victim = self
            .flows
            .values()
            .filter(|f| f.open_count == 0)
            .min_by_key(|f| (f.last_activity, f.logical_flow_id))
            .map(|f| f.logical_flow_id);
        match victim {
            Some(id) => {
                self.flows.remove(&id);
                self.flows.len() < self.config.max_flows
            }
            None => false,
        }
    }
}

/// Milliseconds, clamped to 1 ..= u32::MAX: TimeToLive "MUST be set to a
/// positive value" ([MS-SQOS] 3.2.5.1.4).
fn duration_to_ttl_ms(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX).max(1)
}
