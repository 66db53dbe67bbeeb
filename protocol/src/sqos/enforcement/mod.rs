//! Storage QoS enforcement arithmetic ([MS-SQOS] 1.1 normalized IOPS, 3.2
//! MaximumIoRate / MinimumIoRate / MaximumBandwidth), pure and driven by a
//! caller-supplied clock:
//!
//! - [`TokenBucket`] / [`FlowLimiter`]: per-worker, per-flow limits in
//!   normalized IOPS (BaseIoSize 8192, rounded up, at least 1 per I/O) and
//!   KB/s (KB = 1024 bytes); 0 = unlimited. Exact integer arithmetic.
//! - [`allocate`]: the control plane's division of policy limits into
//!   per-(flow, worker) rates (dedicated, aggregated by demand, spread over
//!   workers by demand).
//! - [`Scheduler`]: the worker's queue of waiting requests, serving flows
//!   below their reservation first, then round-robin, and reporting
//!   reservations not met (StorageQoSStatusInsufficientThroughput).

mod allocate;
mod bucket;
mod scheduler;

pub use allocate::{allocate, split, Allocation, FlowDemand, FlowId, WorkerDemand, WorkerId};
pub use bucket::{
    burst_for, io_cost, kb_cost, FlowLimiter, FlowRates, TokenBucket, DEFAULT_BURST_WINDOW,
    MAX_BURST, MAX_RATE,
};
pub use scheduler::{
    FlowSlot, Lane, RequestId, Scheduler, SchedulerConfig, SchedulerError, WindowReport,
    DEFAULT_LANE_LOAN,
};
