//! The server's view of Storage QoS policies: an interface, so the policy
//! store (a later component) can sit behind it.

use std::collections::{BTreeMap, HashMap};

use crate::sqos::Guid;

/// How a policy's limits apply to the flows that name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyKind {
    /// Every flow gets the full limits.
    Dedicated,
    /// All flows naming the policy share the limits.
    Aggregated,
}

/// A Storage QoS policy ([MS-SQOS] 1.1 "QoS Policy"), as the server applies
/// it to flows whose PolicyID names it. Zero means "not defined" for every
/// limit, as for Request.Limit in [MS-SQOS] 2.2.2.2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Policy {
    /// Dedicated or aggregated.
    pub kind: PolicyKind,
    /// Minimum throughput, normalized IOPS (becomes MinimumIoRate).
    pub minimum_iops: u64,
    /// Maximum throughput, normalized IOPS (becomes MaximumIoRate).
    pub maximum_iops: u64,
    /// Maximum bandwidth, KB/s with KB = 1024 bytes (becomes
    /// MaximumBandwidth).
    pub maximum_bandwidth: u64,
}

impl Policy {
    /// A minimum above a defined maximum: the policy cannot be applied as
    /// written, so flows under it report StorageQoSStatusConfigurationMismatch
    /// ([MS-SQOS] 2.2.2.1), are limited to the maximum and keep no
    /// reservation (docs/spec-notes.md, "Configuration mismatch").
    pub fn is_mismatched(&self) -> bool {
        self.maximum_iops > 0 && self.minimum_iops > self.maximum_iops
    }
}

/// Where the server finds the policy a PolicyID names.
pub trait PolicyLookup {
    /// The policy `policy_id` names, or `None` when it is unknown (the flow
    /// then reports StorageQoSUnknownPolicyId).
    fn lookup(&self, policy_id: &Guid) -> Option<Policy>;
}

/// A policy store that knows no policy.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoPolicies;

impl PolicyLookup for NoPolicies {
    fn lookup(&self, _: &Guid) -> Option<Policy> {
        None
    }
}

impl<S: std::hash::BuildHasher> PolicyLookup for HashMap<Guid, Policy, S> {
    fn lookup(&self, policy_id: &Guid) -> Option<Policy> {
        self.get(policy_id).copied()
    }
}

impl PolicyLookup for BTreeMap<Guid, Policy> {
    fn lookup(&self, policy_id: &Guid) -> Option<Policy> {
        self.get(policy_id).copied()
    }
}

impl<P: PolicyLookup + ?Sized> PolicyLookup for &P {
    fn lookup(&self, policy_id: &Guid) -> Option<Policy> {
        (**self).lookup(policy_id)
    }
}
