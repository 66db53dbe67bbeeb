//! Control-plane allocation: policy limits → per-(flow, worker) rates.
//! Pure and deterministic (output order follows input order; ties go to the
//! lower index).

use std::collections::BTreeMap;

use super::bucket::FlowRates;
use crate::sqos::server::{Policy, PolicyKind};

/// Identifies a flow to the control plane (e.g. its slot in the flow table).
pub type FlowId = u32;
/// Identifies a worker (poll-mode thread).
pub type WorkerId = u16;

/// A flow's measured demand on one worker where it has opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WorkerDemand {
    /// The worker.
    pub worker: WorkerId,
    /// Recent *offered* normalized IOPS on that worker (served plus queued,
    /// so a throttled flow can show that it wants more); 0 = unknown/idle.
    pub demand_iops: u64,
}

/// One active flow (one with at least one open) as allocation input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowDemand<'a> {
    /// The flow.
    pub flow: FlowId,
    /// Index into the `policies` slice; `None` (or out of range) = not
    /// limited.
    pub policy: Option<usize>,
    /// The workers the flow's opens live on, with demand. A flow with no
    /// worker gets no allocation.
    pub workers: &'a [WorkerDemand],
}

impl FlowDemand<'_> {
    /// Total demand over the flow's workers.
    pub fn demand_iops(&self) -> u64 {
        self.workers
            .iter()
            .fold(0u64, |a, w| a.saturating_add(w.demand_iops))
    }
}

/// The rates one worker enforces for one flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Allocation {
    /// The flow.
    pub flow: FlowId,
    /// The worker.
    pub worker: WorkerId,
    /// Its share.
    pub rates: FlowRates,
}

/// Splits `total` among `weights.len()` parties: each gets 1, the rest in
/// proportion to the weights (equal shares when all weights are 0), with
/// largest-remainder rounding so the shares add up to exactly `total`.
/// `total == 0` (not limited / no reservation) gives every party 0. When
/// `total` is smaller than the number of parties each still gets 1 (0 would
/// mean "unlimited"), so only then does the sum exceed `total`.
pub fn split(total: u64, weights: &[u64], out: &mut [u64]) {
    debug_assert_eq!(weights.len(), out.len());
    let n = weights.len() as u64;
    if n == 0 {
        return;
    }
    if total == 0 {
        out.iter_mut().for_each(|o| *o = 0);
        return;
    }
    if total <= n {
        out.iter_mut().for_each(|o| *o = 1);
        return;
    }
    let rest = (total - n) as u128;
    let sum_w: u128 = weights.iter().map(|&w| w as u128).sum();
    let w = |i: usize| {
        if sum_w == 0 {
            1u128
        } else {
            weights[i] as u128
        }
    };
    let denom = if sum_w == 0 { n as u128 } else { sum_w };
    let mut given: u128 = 0;
    for (i, o) in out.iter_mut().enumerate() {
        let share = rest * w(i) / denom;
        given += share;
        *o = 1 + share as u64;
    }
    // Largest remainders first, lower index on ties; `left` < n.
    let mut left = (rest - given) as usize;
    if left > 0 {
        let mut order: Vec<usize> = (0..out.len()).collect();
        order.sort_by(|&a, &b| {
            let ra = rest * w(a) % denom;
            let rb = rest * w(b) % denom;
            rb.cmp(&ra).then(a.cmp(&b))
        });
        for i in order {
            if left == 0 {
                break;
            }
            out[i] += 1;
            left -= 1;
        }
    }
}

fn split_rates(total: FlowRates, weights: &[u64]) -> Vec<FlowRates> {
    let n = weights.len();
    let (mut mx, mut mn, mut bw) = (vec![0; n], vec![0; n], vec![0; n]);
    split(total.max_iops, weights, &mut mx);
    split(total.min_iops, weights, &mut mn);
    split(total.max_kbps, weights, &mut bw);
    (0..n)
        .map(|i| FlowRates {
            max_iops: mx[i],
            // Rounding must not put a share's reservation above its limit.
            min_iops: if mx[i] > 0 { mn[i].min(mx[i]) } else { mn[i] },
            max_kbps: bw[i],
        })
        .collect()
}

fn policy_rates(p: &Policy) -> FlowRates {
    FlowRates {
        max_iops: p.maximum_iops,
        min_iops: p.minimum_iops,
        max_kbps: p.maximum_bandwidth,
    }
}

/// Computes every (flow, worker) share:
///
/// - a flow with no (known) policy: unlimited on each of its workers;
/// - dedicated policy: the flow gets the policy's MaximumIoRate,
///   MinimumIoRate and MaximumBandwidth;
/// - aggregated policy: each limit is divided among the policy's flows in
///   proportion to their demand ([`split`]: every flow at least 1, equal
///   shares when no demand is known, sums exactly the limit);
/// - then each flow's rates are divided among its workers the same way, in
///   proportion to per-worker demand.
///
/// Output: flows in input order, each flow's workers in input order.
pub fn allocate(policies: &[Policy], flows: &[FlowDemand<'_>]) -> Vec<Allocation> {
    let policy_of = |f: &FlowDemand<'_>| f.policy.and_then(|i| policies.get(i).map(|p| (i, p)));

    // Per-flow totals.
    let mut totals = vec![FlowRates::UNLIMITED; flows.len()];
    let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (fi, f) in flows.iter().enumerate() {
        if f.workers.is_empty() {
            continue;
        }
        match policy_of(f) {
            None => {}
            Some((_, p)) if p.kind == PolicyKind::Dedicated => totals[fi] = policy_rates(p),
            Some((pi, _)) => groups.entry(pi).or_default().push(fi),
        }
    }
    for (pi, members) in &groups {
        let weights: Vec<u64> = members.iter().map(|&fi| flows[fi].demand_iops()).collect();
        for (share, &fi) in split_rates(policy_rates(&policies[*pi]), &weights)
            .into_iter()
            .zip(members)
        {
            totals[fi] = share;
        }
    }

    // Per-worker shares.
    let mut out = Vec::with_capacity(flows.iter().map(|f| f.workers.len()).sum());
    for (fi, f) in flows.iter().enumerate() {
        if f.workers.is_empty() {
            continue;
        }
        let weights: Vec<u64> = f.workers.iter().map(|w| w.demand_iops).collect();
        for (rates, w) in split_rates(totals[fi], &weights).into_iter().zip(f.workers) {
            out.push(Allocation {
                flow: f.flow,
                worker: w.worker,
                rates,
            });
        }
    }
    out
}
