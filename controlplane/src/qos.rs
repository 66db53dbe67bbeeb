//! The control plane's Storage QoS engine ([MS-SQOS] 3.2): it owns the
//! LogicalFlowTable (3.2.1.1), the per-Open association (3.2.1.2) and the
//! policy store; it answers the FSCTL_STORAGE_QOS_CONTROL requests workers
//! forward, and every [`ALLOCATION_PERIOD`] (and on every change) divides
//! each active flow's limits among the workers its Opens live on
//! ([`allocate`]) and pushes the rates. Workers enforce them with their own
//! token buckets; what they measure comes back as window reports, from
//! which the engine reports each flow's status (GET_STATUS) and the
//! `qos flows` table.

use crate::qos_admin::{status_name, FlowRow};
use crate::qos_policy::PolicyStore;
use smbdirect_dataplane::clock;
use smbdirect_dataplane::planes::{ConnId, QosFlowAssign, UpperControl};
use smbdirect_protocol::sqos::enforcement::{
    allocate, FlowDemand, FlowRates, WindowReport, WorkerDemand,
};
use smbdirect_protocol::sqos::server::{
    process_request, FlowReport, LogicalFlowTable, OpenKind, OpenQosState, Policy, PolicyKind,
    PolicyLookup, ServerConfig,
};
use smbdirect_protocol::sqos::{FlowStatus, Guid};
use smbdirect_protocol::time::{Duration as PDuration, Instant as PInstant};
use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

/// How often rates are recomputed and pushed (also on every change).
pub const ALLOCATION_PERIOD: std::time::Duration = std::time::Duration::from_millis(100);
/// TimeToLive of the status GET_STATUS reports ([MS-SQOS] 3.2.5.1.4): the
/// rates are refreshed every 100 ms, so a client asking again within ~4 s
/// sees current values.
pub const STATUS_TTL: PDuration = PDuration::from_millis(4000);

#[derive(Debug)]
struct OpenEntry {
    qos: OpenQosState,
    worker: usize,
}

#[derive(Debug, Clone)]
struct FlowMeta {
    index: u32,
    /// Last window report per worker, and whether that worker was saturated.
    windows: Vec<Option<(WindowReport, bool)>>,
}

/// The engine (owned by the `cp` thread).
#[derive(Debug)]
pub struct QosEngine {
    table: LogicalFlowTable,
    /// The policies ([`PolicyStore`]): changed through the admin socket.
    pub policies: PolicyStore,
    opens: HashMap<(ConnId, u64), OpenEntry>,
    flows: HashMap<Guid, FlowMeta>,
    by_index: Vec<Option<Guid>>,
    free: Vec<u32>,
    nworkers: usize,
    origin: Instant,
    last_tick: Instant,
    policy_generation: u64,
    dirty: bool,
    /// The latest allocation.
    last_alloc: Vec<(usize, QosFlowAssign)>,
    /// Flows created for shares' default policies.
    flow_seq: u64,
}

impl QosEngine {
    /// An engine for `nworkers` workers with `policies`.
    pub fn new(nworkers: usize, policies: PolicyStore, max_flows: Option<usize>) -> Self {
        let d = ServerConfig::default();
        let config = ServerConfig {
            status_time_to_live: STATUS_TTL,
            max_flows: max_flows.unwrap_or(65_536).max(1),
            ..d
        };
        QosEngine {
            table: LogicalFlowTable::new(config),
            policy_generation: policies.generation(),
            policies,
            opens: HashMap::new(),
            flows: HashMap::new(),
            by_index: Vec::new(),
            free: Vec::new(),
            nworkers: nworkers.max(1),
            origin: clock::now(),
            last_tick: clock::now(),
            dirty: false,
            last_alloc: Vec::new(),
            flow_seq: 0,
        }
    }

    /// Keeps flows no Open references for `retention` (None: the table's
    /// default, 60 s) before they are removed.
    pub fn with_flow_retention(mut self, retention: Option<std::time::Duration>) -> Self {
        if let Some(r) = retention {
            let config = ServerConfig {
                flow_retention: PDuration::from_nanos(r.as_nanos() as u64),
                ..*self.table.config()
            };
            self.table = LogicalFlowTable::new(config);
        }
        self
    }

    fn now(&self) -> PInstant {
        PInstant::from_nanos(
            clock::now()
                .saturating_duration_since(self.origin)
                .as_nanos() as u64,
        )
    }

    /// Logical flows in the table.
    pub fn flow_count(&self) -> usize {
        self.table.len()
    }

    /// Opens with Storage QoS state.
    pub fn open_count(&self) -> usize {
        self.opens.len()
    }

    fn index_of(&mut self, id: Guid) -> u32 {
        if let Some(m) = self.flows.get(&id) {
            return m.index;
        }
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.by_index.push(None);
                (self.by_index.len() - 1) as u32
            }
        };
        self.by_index[index as usize] = Some(id);
        self.flows.insert(
            id,
            FlowMeta {
                index,
                windows: vec![None; self.nworkers],
            },
        );
        index
    }

    /// [MS-SQOS] 3.2.5.1: a forwarded FSCTL_STORAGE_QOS_CONTROL. Returns
    /// the reply for the worker and, when associations changed, new rates
    /// for other workers.
    #[allow(clippy::too_many_arguments)]
    pub fn request(
        &mut self,
        worker: usize,
        conn: ConnId,
        token: u64,
        open: u64,
        is_file: bool,
        request: &[u8],
        max_output: u32,
    ) -> (UpperControl, Vec<(usize, UpperControl)>) {
        let now = self.now();
        let entry = self.opens.entry((conn, open)).or_insert(OpenEntry {
            qos: OpenQosState::new(),
            worker,
        });
        let before = entry.qos.logical_flow_id();
        let kind = if is_file {
            OpenKind::File
        } else {
            OpenKind::Directory
        };
        let result = process_request(
            &mut self.table,
            &mut entry.qos,
            kind,
            request,
            max_output,
            now,
            &self.policies,
        );
        let after = entry.qos.logical_flow_id();
        if after.is_none() {
            self.opens.remove(&(conn, open));
        }
        let result = result.map(|r| r.map(|repr| repr.to_vec().into_boxed_slice()));
        // SET_POLICY may have changed limits even for the same flow.
        let set_policy = request
            .get(4..8)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()) & 0x2 != 0)
            .unwrap_or(false);
        let changed = before != after || (result.is_ok() && set_policy);
        let mut others = Vec::new();
        let flow = match after {
            Some(id) => {
                let index = self.index_of(id);
                // Rates at once: a new association must not run unlimited
                // until the next period. Other requests (GET_STATUS,
                // UPDATE_COUNTERS) leave the allocation to the period.
                let allocs = if changed {
                    self.dirty = false;
                    self.allocate_and_report(now)
                } else {
                    self.last_alloc.clone()
                };
                let mut mine = FlowRates::UNLIMITED;
                for (w, a) in allocs {
                    if a.flow == index && w == worker {
                        mine = a.rates;
                    } else if changed {
                        others.push((w, UpperControl::QosRates(a)));
                    }
                }
                Some(QosFlowAssign {
                    flow: index,
                    rates: mine,
                })
            }
            None => None,
        };
        (
            UpperControl::QosReply {
                conn,
                token,
                open,
                result,
                flow,
            },
            others,
        )
    }

    /// A file Open on a share with a default policy: it becomes a new
    /// logical flow under `policy`, exactly as if the client had sent
    /// SET_LOGICAL_FLOW_ID | SET_POLICY (InitiatorName "smbdirectd default
    /// policy", InitiatorNodeName the client's address). The reply carries
    /// no IOCTL answer (token 0).
    pub fn default_flow(
        &mut self,
        worker: usize,
        conn: ConnId,
        open: u64,
        policy: Guid,
        peer: &str,
    ) -> (UpperControl, Vec<(usize, UpperControl)>) {
        use smbdirect_protocol::sqos::{Dialect, Options, StorageQosControlRequestRepr, Utf16Name};
        self.flow_seq += 1;
        let nanos = self.origin.elapsed().as_nanos() as u64;
        let id = Guid::from_fields(
            (nanos as u32) ^ 0x5db0_0000,
            (self.flow_seq >> 16) as u16,
            self.flow_seq as u16,
            (conn ^ (open << 20) ^ nanos.rotate_left(29)).to_le_bytes(),
        );
        let mut r = StorageQosControlRequestRepr::new(
            Dialect::V1_1,
            Options::from_bits(Options::SET_LOGICAL_FLOW_ID.bits() | Options::SET_POLICY.bits()),
            id,
        );
        r.policy_id = policy;
        r.initiator_id = Guid::from_fields(0x5db0_d00d, 0, 0, conn.to_le_bytes());
        r.initiator_name = Utf16Name::new("smbdirectd default policy").unwrap_or(Utf16Name::EMPTY);
        let node: String = peer.chars().take(100).collect();
        r.initiator_node_name = Utf16Name::new(&node).unwrap_or(Utf16Name::EMPTY);
        let bytes = r.to_vec();
        let (mut reply, others) = self.request(worker, conn, 0, open, true, &bytes, 4096);
        if let UpperControl::QosReply { result, .. } = &mut reply {
            if let Err(st) = result {
                crate::warn!(
                    "conn {conn}: the share's default Storage QoS policy {policy} could not be applied to a new Open: {st}"
                );
            }
            *result = Ok(None);
        }
        (reply, others)
    }

    /// An Open named by a QoS request closed ([MS-SQOS] 3.2.1.2: it no
    /// longer references its flow).
    pub fn open_closed(&mut self, conn: ConnId, open: u64) {
        let now = self.now();
        if let Some(mut e) = self.opens.remove(&(conn, open)) {
            self.table.close_open(&mut e.qos, now);
            self.dirty = true;
        }
    }

    /// A connection closed: all its Opens are gone.
    pub fn conn_closed(&mut self, conn: ConnId) {
        let now = self.now();
        let keys: Vec<_> = self.opens.keys().filter(|k| k.0 == conn).copied().collect();
        for k in keys {
            if let Some(mut e) = self.opens.remove(&k) {
                self.table.close_open(&mut e.qos, now);
                self.dirty = true;
            }
        }
    }

    /// A worker's window report for flow `index`.
    pub fn window(&mut self, worker: usize, index: u32, report: WindowReport, saturated: bool) {
        let Some(Some(id)) = self.by_index.get(index as usize) else {
            return;
        };
        if let Some(m) = self.flows.get_mut(id) {
            if let Some(w) = m.windows.get_mut(worker) {
                *w = Some((report, saturated));
            }
        }
    }

    /// How long after `now` [`tick`](Self::tick) has periodic work (zero:
    /// at once).
    pub fn next_tick_in(&self, now: Instant) -> std::time::Duration {
        if self.dirty {
            return std::time::Duration::ZERO;
        }
        ALLOCATION_PERIOD.saturating_sub(now.saturating_duration_since(self.last_tick))
    }

    /// Periodic work: expire flows, recompute and push rates. Returns the
    /// messages for the workers (worker index, message).
    pub fn tick(&mut self, force: bool) -> Vec<(usize, UpperControl)> {
        let due = clock::now().saturating_duration_since(self.last_tick) >= ALLOCATION_PERIOD;
        let changed = self.dirty || self.policies.generation() != self.policy_generation;
        if !(due || changed || force) {
            return Vec::new();
        }
        self.last_tick = clock::now();
        self.policy_generation = self.policies.generation();
        self.dirty = false;
        let now = self.now();
        self.table.expire(now);
        // Forget flows the table no longer has.
        let gone: Vec<Guid> = self
            .flows
            .keys()
            .filter(|id| self.table.get(id).is_none())
            .copied()
            .collect();
        for id in gone {
            if let Some(m) = self.flows.remove(&id) {
                self.by_index[m.index as usize] = None;
                self.free.push(m.index);
            }
        }
        self.allocate_and_report(now)
            .into_iter()
            .map(|(w, a)| (w, UpperControl::QosRates(a)))
            .collect()
    }

    /// The policy a flow is governed by: its PolicyID's, or its
    /// client-defined limits (SET_POLICY with an empty PolicyID), or none.
    fn policy_of(&self, id: &Guid) -> (Option<Policy>, bool) {
        let Some(f) = self.table.get(id) else {
            return (None, false);
        };
        if !f.policy_applied() {
            return (None, false);
        }
        if f.policy_id().is_null() {
            return (
                Some(Policy {
                    kind: PolicyKind::Dedicated,
                    minimum_iops: f.reservation(),
                    maximum_iops: f.limit(),
                    maximum_bandwidth: f.bandwidth_limit(),
                }),
                false,
            );
        }
        match self.policies.lookup(&f.policy_id()) {
            // A minimum above the maximum cannot be applied: enforce the
            // maximum, keep no reservation, report ConfigurationMismatch
            // (docs/spec-notes.md, "Configuration mismatch").
            Some(p) if p.is_mismatched() => (
                Some(Policy {
                    minimum_iops: 0,
                    ..p
                }),
                false,
            ),
            Some(p) => (Some(p), false),
            None => (None, true),
        }
    }

    /// Whether the policy the flow names cannot be applied as written.
    fn mismatched(&self, id: &Guid) -> bool {
        self.table
            .get(id)
            .filter(|f| f.policy_applied() && !f.policy_id().is_null())
            .and_then(|f| self.policies.lookup(&f.policy_id()))
            .is_some_and(|p| p.is_mismatched())
    }

    /// Divides every active flow's limits among its workers, reports each
    /// flow's status to the table, returns the per-worker rates.
    fn allocate_and_report(&mut self, now: PInstant) -> Vec<(usize, QosFlowAssign)> {
        // Workers each flow's Opens live on.
        let mut on: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for e in self.opens.values() {
            if let Some(id) = e.qos.logical_flow_id() {
                if let Some(m) = self.flows.get(&id) {
                    let v = on.entry(m.index).or_default();
                    if !v.contains(&e.worker) {
                        v.push(e.worker);
                    }
                }
            }
        }
        let mut policies: Vec<Policy> = Vec::new();
        let mut shared: HashMap<Guid, usize> = HashMap::new();
        let mut demands: Vec<Vec<WorkerDemand>> = Vec::new();
        let mut inputs: Vec<(u32, Guid, Option<usize>, bool)> = Vec::new();
        for (&index, workers) in &on {
            let Some(Some(id)) = self.by_index.get(index as usize) else {
                continue;
            };
            let id = *id;
            let (policy, unknown) = self.policy_of(&id);
            let pidx = policy.map(|p| {
                let pid = self
                    .table
                    .get(&id)
                    .map(|f| f.policy_id())
                    .unwrap_or(Guid::NULL);
                if pid.is_null() || p.kind == PolicyKind::Dedicated {
                    policies.push(p);
                    policies.len() - 1
                } else {
                    // An aggregated policy: one entry shared by its flows.
                    *shared.entry(pid).or_insert_with(|| {
                        policies.push(p);
                        policies.len() - 1
                    })
                }
            });
            let meta = &self.flows[&id];
            let mut sorted = workers.clone();
            sorted.sort_unstable();
            demands.push(
                sorted
                    .iter()
                    .map(|&w| WorkerDemand {
                        worker: w as u16,
                        demand_iops: meta.windows[w]
                            .map(|(r, _)| {
                                r.offered_iops()
                                    .saturating_add(per_sec(r.backlog_ios, r.length.as_nanos()))
                            })
                            .unwrap_or(0),
                    })
                    .collect(),
            );
            inputs.push((index, id, pidx, unknown));
        }
        let flows: Vec<FlowDemand<'_>> = inputs
            .iter()
            .zip(&demands)
            .map(|(&(index, _, pidx, _), d)| FlowDemand {
                flow: index,
                policy: pidx,
                workers: d,
            })
            .collect();
        let allocs = allocate(&policies, &flows);
        // Report each flow's assigned totals and status.
        let mut totals: HashMap<u32, FlowRates> = HashMap::new();
        for a in &allocs {
            let t = totals.entry(a.flow).or_default();
            t.max_iops += a.rates.max_iops;
            t.min_iops += a.rates.min_iops;
            t.max_kbps += a.rates.max_kbps;
        }
        for &(index, id, pidx, unknown) in &inputs {
            if unknown || pidx.is_none() {
                // GET_STATUS derives UnknownPolicyId / NotAvailable from the
                // table itself: retire any earlier report at once.
                self.table.report(
                    &id,
                    FlowReport {
                        status: FlowStatus::NotAvailable,
                        maximum_io_rate: 0,
                        minimum_io_rate: 0,
                        maximum_bandwidth: 0,
                        time_to_live: PDuration::ZERO,
                    },
                    now,
                );
                continue;
            }
            let t = totals.get(&index).copied().unwrap_or_default();
            let meta = &self.flows[&id];
            let starved = meta
                .windows
                .iter()
                .flatten()
                .any(|(r, sat)| *sat && !r.reservation_met);
            let status = if self.mismatched(&id) {
                FlowStatus::ConfigurationMismatch
            } else if starved {
                FlowStatus::InsufficientThroughput
            } else {
                FlowStatus::Ok
            };
            self.table.report(
                &id,
                FlowReport {
                    status,
                    maximum_io_rate: t.max_iops,
                    minimum_io_rate: t.min_iops,
                    maximum_bandwidth: t.max_kbps,
                    time_to_live: STATUS_TTL,
                },
                now,
            );
        }
        let out: Vec<(usize, QosFlowAssign)> = allocs
            .into_iter()
            .map(|a| {
                (
                    a.worker as usize,
                    QosFlowAssign {
                        flow: a.flow,
                        rates: a.rates,
                    },
                )
            })
            .collect();
        self.last_alloc = out.clone();
        out
    }

    /// The `qos flows` table.
    pub fn rows(&self) -> Vec<FlowRow> {
        let now = self.now();
        let mut rows: Vec<FlowRow> = self
            .table
            .iter()
            .map(|f| {
                let id = f.logical_flow_id();
                let st = self.table.flow_status(&id, now, &self.policies);
                let (mut iops, mut kbps, mut workers) = (0u64, 0u64, 0u32);
                if let Some(m) = self.flows.get(&id) {
                    for (r, _) in m.windows.iter().flatten() {
                        iops += r.served_iops();
                        kbps += per_sec(r.served_kb, r.length.as_nanos());
                    }
                }
                let mut ws: Vec<usize> = self
                    .opens
                    .values()
                    .filter(|e| e.qos.logical_flow_id() == Some(id))
                    .map(|e| e.worker)
                    .collect();
                ws.sort_unstable();
                ws.dedup();
                workers += ws.len() as u32;
                let c = f.counters();
                let latency_us = if c.io_count > 0 {
                    c.latency as f64 / c.io_count as f64 / 10.0
                } else {
                    f64::NAN
                };
                let pid = f.policy_id();
                FlowRow {
                    flow_id: id,
                    initiator_name: f.initiator_name().to_string(),
                    initiator_node_name: f.initiator_node_name().to_string(),
                    policy_id: (!pid.is_null()).then_some(pid),
                    policy_name: self.policies.get(&pid).and_then(|e| e.name.clone()),
                    limit_iops: st.map_or(0, |s| s.maximum_io_rate),
                    reservation_iops: st.map_or(0, |s| s.minimum_io_rate),
                    bandwidth_limit_kbps: st.map_or(0, |s| s.maximum_bandwidth),
                    iops,
                    kbps,
                    latency_us,
                    status: status_name(st.map_or(FlowStatus::NotAvailable, |s| s.status)),
                    opens: f.open_count() as u32,
                    workers,
                }
            })
            .collect();
        rows.sort_by_key(|r| r.flow_id.to_string());
        rows
    }
}

fn per_sec(n: u64, nanos: u64) -> u64 {
    if nanos == 0 {
        return 0;
    }
    (n as u128 * 1_000_000_000 / nanos as u128) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use smbdirect_protocol::sqos::{
        Dialect, Options, StorageQosControlRequestRepr, StorageQosControlResponse,
        StorageQosControlResponseRepr,
    };

    const GOLD: &str = "8d7f0c7e-2f9b-4c58-9a35-1d3c5e6f7a81";
    const SHARED: &str = "11111111-2222-3333-4444-555555555555";

    fn store() -> PolicyStore {
        PolicyStore::parse(
            &format!(
                "[[policy]]\nid = \"{GOLD}\"\ntype = \"dedicated\"\nmin_iops = 100\nmax_iops = 2000\n\
                 [[policy]]\nid = \"{SHARED}\"\ntype = \"aggregated\"\nmax_iops = 4000\nmax_bandwidth_kbps = 8000\n"
            ),
            "test",
        )
        .unwrap()
    }

    fn flow(n: u8) -> Guid {
        Guid::from_fields(n as u32, 1, 2, [n; 8])
    }

    fn set_policy(flow_id: Guid, policy: Guid, limit: u64) -> Vec<u8> {
        let mut r = StorageQosControlRequestRepr::new(
            Dialect::V1_1,
            Options::from_bits(Options::SET_LOGICAL_FLOW_ID.bits() | Options::SET_POLICY.bits()),
            flow_id,
        );
        r.policy_id = policy;
        r.initiator_id = Guid::from_fields(9, 9, 9, [9; 8]);
        r.limit = limit;
        r.to_vec()
    }

    fn get_status(flow_id: Guid) -> Vec<u8> {
        StorageQosControlRequestRepr::new(Dialect::V1_1, Options::GET_STATUS, flow_id).to_vec()
    }

    type Answer = Result<Option<Box<[u8]>>, smbdirect_protocol::ntstatus::NtStatus>;

    fn reply(m: UpperControl) -> (Answer, Option<QosFlowAssign>) {
        match m {
            UpperControl::QosReply { result, flow, .. } => (result, flow),
            other => panic!("not a reply: {other:?}"),
        }
    }

    fn status(bytes: &[u8]) -> StorageQosControlResponseRepr {
        StorageQosControlResponseRepr::parse(
            &StorageQosControlResponse::new_checked(bytes).unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn client_defined_limit_becomes_the_workers_rate() {
        let mut e = QosEngine::new(2, PolicyStore::new(), None);
        let (r, f) = reply(
            e.request(
                0,
                1,
                7,
                100,
                true,
                &set_policy(flow(1), Guid::NULL, 2000),
                4096,
            )
            .0,
        );
        assert_eq!(r, Ok(None));
        let f = f.expect("associated");
        assert_eq!(f.rates.max_iops, 2000);
        assert_eq!(e.flow_count(), 1);
        assert_eq!(e.open_count(), 1);
        // GET_STATUS reports what is assigned, TimeToLive about 4 s.
        let (r, _) = reply(e.request(0, 1, 8, 100, true, &get_status(flow(1)), 4096).0);
        let s = status(&r.unwrap().unwrap());
        assert_eq!(s.maximum_io_rate, 2000);
        assert_eq!(s.status, FlowStatus::Ok);
        assert_eq!(s.base_io_size, 8192);
        assert!(
            (3900..=4000).contains(&s.time_to_live),
            "{}",
            s.time_to_live
        );
        e.open_closed(1, 100);
        assert_eq!(e.open_count(), 0);
    }

    #[test]
    fn dedicated_policy_and_unknown_policy() {
        let mut e = QosEngine::new(1, store(), None);
        let gold: Guid = GOLD.parse().unwrap();
        let (r, f) = reply(
            e.request(0, 1, 1, 1, true, &set_policy(flow(1), gold, 0), 4096)
                .0,
        );
        assert_eq!(r, Ok(None));
        let f = f.unwrap();
        assert_eq!((f.rates.max_iops, f.rates.min_iops), (2000, 100));
        let unknown = Guid::from_fields(0xdead, 0, 0, [0; 8]);
        let (r, f) = reply(
            e.request(0, 1, 2, 2, true, &set_policy(flow(2), unknown, 0), 4096)
                .0,
        );
        assert_eq!(r, Ok(None));
        assert_eq!(f.unwrap().rates, FlowRates::UNLIMITED);
        let (r, _) = reply(e.request(0, 1, 3, 2, true, &get_status(flow(2)), 4096).0);
        assert_eq!(
            status(&r.unwrap().unwrap()).status,
            FlowStatus::UnknownPolicyId
        );
    }

    /// [MS-SQOS] 2.2.2.1: a policy whose minimum is above its maximum cannot
    /// be applied as written: the flow gets the maximum, no reservation, and
    /// GET_STATUS says StorageQoSStatusConfigurationMismatch.
    #[test]
    fn policy_with_minimum_above_maximum_reports_configuration_mismatch() {
        let odd: Guid = SHARED.parse().unwrap();
        let policies = PolicyStore::parse(
            &format!("[[policy]]\nid = \"{SHARED}\"\ntype = \"dedicated\"\nmin_iops = 900\nmax_iops = 300\n"),
            "test",
        )
        .unwrap();
        assert_eq!(policies.warnings().len(), 1);
        let mut e = QosEngine::new(1, policies, None);
        let (r, f) = reply(
            e.request(0, 1, 1, 1, true, &set_policy(flow(3), odd, 0), 4096)
                .0,
        );
        assert_eq!(r, Ok(None));
        let f = f.expect("associated");
        assert_eq!((f.rates.max_iops, f.rates.min_iops), (300, 0));
        let (r, _) = reply(e.request(0, 1, 2, 1, true, &get_status(flow(3)), 4096).0);
        let s = status(&r.unwrap().unwrap());
        assert_eq!(s.status, FlowStatus::ConfigurationMismatch);
        assert_eq!((s.maximum_io_rate, s.minimum_io_rate), (300, 0));
        // A sound policy beside it still reports Ok.
        let mut e = QosEngine::new(1, store(), None);
        let gold: Guid = GOLD.parse().unwrap();
        let _ = e.request(0, 1, 1, 1, true, &set_policy(flow(4), gold, 0), 4096);
        let (r, _) = reply(e.request(0, 1, 2, 1, true, &get_status(flow(4)), 4096).0);
        assert_eq!(status(&r.unwrap().unwrap()).status, FlowStatus::Ok);
    }

    /// A flow no Open references is removed once its retention has passed
    /// (60 s by default; `serve --qos-flow-retention`), and not before.
    #[test]
    fn unreferenced_flow_is_removed_after_its_retention() {
        let mut e = QosEngine::new(1, PolicyStore::new(), None)
            .with_flow_retention(Some(std::time::Duration::from_millis(50)));
        let (r, _) = reply(
            e.request(
                0,
                1,
                1,
                7,
                true,
                &set_policy(flow(5), Guid::NULL, 100),
                4096,
            )
            .0,
        );
        assert_eq!(r, Ok(None));
        assert_eq!(e.flow_count(), 1);
        e.open_closed(1, 7);
        let _ = e.tick(true);
        assert_eq!(e.flow_count(), 1, "kept during its retention");
        std::thread::sleep(std::time::Duration::from_millis(80));
        let _ = e.tick(true);
        assert_eq!(e.flow_count(), 0, "removed after it");
        // The default keeps it (60 s).
        let mut e = QosEngine::new(1, PolicyStore::new(), None).with_flow_retention(None);
        let _ = e.request(
            0,
            1,
            1,
            7,
            true,
            &set_policy(flow(5), Guid::NULL, 100),
            4096,
        );
        e.open_closed(1, 7);
        std::thread::sleep(std::time::Duration::from_millis(80));
        let _ = e.tick(true);
        assert_eq!(e.flow_count(), 1);
    }

    #[test]
    fn aggregated_policy_is_divided_and_spread_over_workers() {
        let mut e = QosEngine::new(2, store(), None);
        let shared: Guid = SHARED.parse().unwrap();
        // Flow 1 has opens on both workers, flow 2 on worker 1.
        e.request(0, 1, 1, 1, true, &set_policy(flow(1), shared, 0), 4096);
        e.request(1, 2, 1, 1, true, &set_policy(flow(1), shared, 0), 4096);
        e.request(1, 2, 2, 2, true, &set_policy(flow(2), shared, 0), 4096);
        let msgs = e.tick(true);
        let mut total = 0;
        let mut kb = 0;
        for (_, m) in &msgs {
            if let UpperControl::QosRates(a) = m {
                total += a.rates.max_iops;
                kb += a.rates.max_kbps;
            }
        }
        assert_eq!(msgs.len(), 3, "{msgs:?}");
        assert_eq!(total, 4000);
        assert_eq!(kb, 8000);
        let rows = e.rows();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].workers + rows[1].workers, 3);
    }

    #[test]
    fn errors_are_returned_and_leave_no_state() {
        let mut e = QosEngine::new(1, PolicyStore::new(), None);
        // GET_STATUS on an Open not associated: STATUS_NOT_FOUND.
        let (r, f) = reply(e.request(0, 1, 1, 1, true, &get_status(flow(1)), 4096).0);
        assert_eq!(r, Err(smbdirect_protocol::ntstatus::STATUS_NOT_FOUND));
        assert!(f.is_none());
        assert_eq!(e.open_count(), 0);
        // A directory: STATUS_INVALID_DEVICE_REQUEST.
        let (r, _) = reply(
            e.request(0, 1, 1, 1, false, &set_policy(flow(1), Guid::NULL, 5), 4096)
                .0,
        );
        assert_eq!(
            r,
            Err(smbdirect_protocol::ntstatus::STATUS_INVALID_DEVICE_REQUEST)
        );
        e.conn_closed(1);
        assert_eq!(e.flow_count(), 0);
    }
}

#[cfg(test)]
mod mismatch_tests {
    use super::*;
    use smbdirect_protocol::sqos::{Dialect, Options, StorageQosControlRequestRepr};

    /// A client-defined Reservation above its Limit can never be applied:
    /// the server rules refuse it (note <8>), and nothing is associated.
    #[test]
    fn client_reservation_above_limit_is_refused() {
        let mut e = QosEngine::new(1, PolicyStore::new(), None);
        let flow = Guid::from_fields(7, 7, 7, [7; 8]);
        let mut r = StorageQosControlRequestRepr::new(
            Dialect::V1_1,
            Options::from_bits(Options::SET_LOGICAL_FLOW_ID.bits() | Options::SET_POLICY.bits()),
            flow,
        );
        r.initiator_id = Guid::from_fields(1, 1, 1, [1; 8]);
        r.limit = 100;
        r.reservation = 500;
        let (reply, _) = e.request(0, 1, 1, 1, true, &r.to_vec(), 4096);
        let UpperControl::QosReply { result, flow, .. } = reply else {
            panic!("reply")
        };
        assert_eq!(
            result,
            Err(smbdirect_protocol::ntstatus::STATUS_INVALID_PARAMETER)
        );
        assert!(flow.is_none());
        assert_eq!(e.open_count(), 0);
    }
}
