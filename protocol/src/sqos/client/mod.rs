//! [MS-SQOS] 3.1 Client Details: the per-logical-flow state of 3.1.1.2, its
//! StatusRequestTimer (3.1.2.1), request building (3.1.4.1, 3.1.6),
//! response handling (3.1.5.1) and the initiation limit (3.1.7.1). Sans-IO:
//! the caller sends what [`LogicalFlow`] builds as an SMB2 IOCTL
//! (FSCTL_STORAGE_QOS_CONTROL) on the flow's handle and feeds the outcome
//! back with [`LogicalFlow::handle_response`]; time is always passed in.

mod initiation_limiter;

pub use initiation_limiter::{allowed_ios_per_sec, InitiationLimiter, KILOBYTE};

use crate::ntstatus::{NtStatus, STATUS_NOT_FOUND, STATUS_REVISION_MISMATCH};
use crate::sqos::{
    normalized_io_size, Dialect, FlowStatus, Guid, Options, StorageQosControlRequestRepr,
    StorageQosControlResponse, StorageQosControlResponseRepr, Utf16Name, DEFAULT_BASE_IO_SIZE,
};
use crate::time::{Duration, Instant};
use crate::WireError;

/// Note <4> ([MS-SQOS] 3.1.5.1): after a failed request the
/// StatusRequestTimer is set to expire in 10 seconds.
pub const FAILURE_RETRY_INTERVAL: Duration = Duration::from_secs(10);

/// Note <5> ([MS-SQOS] 3.1.5.1): when TimeToLive is 1000 ms or less the
/// StatusRequestTimer is set to expire in 1 second.
pub const DEFAULT_STATUS_INTERVAL: Duration = Duration::from_secs(1);

/// [MS-SQOS] 3.1.6: after a SET_POLICY without GET_STATUS, a status request
/// is due within 1 second.
pub const SET_POLICY_STATUS_DEADLINE: Duration = Duration::from_secs(1);

/// The policy parameters of a SET_POLICY or PROBE_POLICY request
/// ([MS-SQOS] 2.2.2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PolicyParams<'a> {
    /// PolicyID (NULL: no policy; then limit/reservation/bandwidth_limit
    /// define the flow's limits).
    pub policy_id: Guid,
    /// InitiatorID.
    pub initiator_id: Guid,
    /// Limit, normalized IOPS (0: not defined).
    pub limit: u64,
    /// Reservation, normalized IOPS.
    pub reservation: u64,
    /// BandwidthLimit, KB/s (1 KB = 1024 bytes; dialect 1.1 only).
    pub bandwidth_limit: u64,
    /// InitiatorName.
    pub initiator_name: Utf16Name<'a>,
    /// InitiatorNodeName.
    pub initiator_node_name: Utf16Name<'a>,
}

/// A request to send: the STORAGE_QOS_CONTROL_REQUEST and the maximum
/// output buffer size to put in the SMB2 IOCTL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientRequest<'a> {
    /// The request; emit it with [`StorageQosControlRequestRepr::to_vec`] or
    /// [`StorageQosControlRequestRepr::emit`].
    pub repr: StorageQosControlRequestRepr<'a>,
    /// MaxOutputResponse: the dialect's response size (88 / 96), which
    /// satisfies 3.1.4.1's "at least 80".
    pub max_response_size: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct InFlight {
    options: Options,
    disassociate: bool,
}

/// [MS-SQOS] 3.1.1.2: the client's state for one logical flow it owns, on
/// one handle (the flow's Open on the server).
///
/// Counters are kept in their ADM units (IoCountIncrement,
/// NormalizedIoCountIncrement, LatencyIncrement and LowerLatencyIncrement in
/// 100 ns units, KilobyteCountIncrement in KB of 1024 bytes). Every request
/// built here carries them (UPDATE_COUNTERS) and zeroes them, as 3.1.4.1
/// requires after sending; a remainder below one unit (< 100 ns, < 1024
/// bytes) is carried over to the next request rather than dropped (see
/// `docs/spec-notes.md`, "Client counters are sent with every request").
#[derive(Debug, Clone, PartialEq)]
pub struct LogicalFlow {
    dialect: Dialect,
    logical_flow_id: Guid,
    io_count_increment: u64,
    normalized_io_count_increment: u64,
    latency_ns: u64,
    lower_latency_ns: u64,
    transferred_bytes: u64,
    maximum_io_rate: u64,
    maximum_bandwidth: u64,
    base_io_size: u32,
    status_request_timer: Option<Instant>,
    associated: bool,
    in_flight: Option<InFlight>,
    last_status: Option<FlowStatus>,
    limiter: InitiationLimiter,
}

impl LogicalFlow {
    /// [MS-SQOS] 3.1.3: a flow with zero counters, MaximumIoRate and
    /// MaximumBandwidth 0, BaseIoSize 8192 and a StatusRequestTimer that
    /// never expires. `dialect` is the highest the client implements
    /// (note <2>: 1.1), or 1.0 to speak to 1.0-only servers.
    pub fn new(logical_flow_id: Guid, dialect: Dialect) -> Self {
        LogicalFlow {
            dialect,
            logical_flow_id,
            io_count_increment: 0,
            normalized_io_count_increment: 0,
            latency_ns: 0,
            lower_latency_ns: 0,
            transferred_bytes: 0,
            maximum_io_rate: 0,
            maximum_bandwidth: 0,
            base_io_size: DEFAULT_BASE_IO_SIZE,
            status_request_timer: None,
            associated: false,
            in_flight: None,
            last_status: None,
            limiter: InitiationLimiter::default(),
        }
    }

    /// Dialect (3.1.1.1).
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }
    /// LogicalFlowID.
    pub fn logical_flow_id(&self) -> Guid {
        self.logical_flow_id
    }
    /// IoCountIncrement: I/Os issued since the last request.
    pub fn io_count_increment(&self) -> u64 {
        self.io_count_increment
    }
    /// NormalizedIoCountIncrement: normalized I/Os since the last request.
    pub fn normalized_io_count_increment(&self) -> u64 {
        self.normalized_io_count_increment
    }
    /// LatencyIncrement, 100 ns units.
    pub fn latency_increment(&self) -> u64 {
        self.latency_ns / 100
    }
    /// LowerLatencyIncrement, 100 ns units.
    pub fn lower_latency_increment(&self) -> u64 {
        self.lower_latency_ns / 100
    }
    /// KilobyteCountIncrement, KB (1024 bytes).
    pub fn kilobyte_count_increment(&self) -> u64 {
        self.transferred_bytes / KILOBYTE
    }
    /// MaximumIoRate, normalized IOPS (0: none).
    pub fn maximum_io_rate(&self) -> u64 {
        self.maximum_io_rate
    }
    /// MaximumBandwidth, KB/s (0: none).
    pub fn maximum_bandwidth(&self) -> u64 {
        self.maximum_bandwidth
    }
    /// BaseIoSize.
    pub fn base_io_size(&self) -> u32 {
        self.base_io_size
    }
    /// True once the server confirmed the association of the handle.
    pub fn is_associated(&self) -> bool {
        self.associated
    }
    /// Status of the latest successful status response.
    pub fn last_status(&self) -> Option<FlowStatus> {
        self.last_status
    }
    /// True while a request built here awaits [`handle_response`](Self::handle_response).
    pub fn request_in_flight(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Records a completed read or write of `size` bytes: `latency` from
    /// when the application issued it (including time queued in the
    /// initiator), `lower_latency` from when it was issued to lower layers
    /// ([MS-SQOS] 2.2.2.2, LatencyIncrement / LowerLatencyIncrement).
    pub fn record_io(&mut self, size: u64, latency: Duration, lower_latency: Duration) {
        self.io_count_increment = self.io_count_increment.saturating_add(1);
        self.normalized_io_count_increment = self
            .normalized_io_count_increment
            .saturating_add(normalized_io_size(size, self.base_io_size));
        self.latency_ns = self.latency_ns.saturating_add(latency.as_nanos());
        self.lower_latency_ns = self
            .lower_latency_ns
            .saturating_add(lower_latency.as_nanos());
        self.transferred_bytes = self.transferred_bytes.saturating_add(size);
    }

    /// [MS-SQOS] 3.1.4.1: builds a request with `options` (plus what the
    /// rules require) and resets the counters, as if it were sent now:
    ///
    /// - UPDATE_COUNTERS is always added and the counters are filled in
    ///   (the counters are zeroed after every request, so a request without
    ///   them would lose counts);
    /// - SET_LOGICAL_FLOW_ID is added while the handle is not associated;
    /// - the policy fields come from `policy` when SET_POLICY or
    ///   PROBE_POLICY is set (BandwidthLimit only in dialect 1.1);
    /// - [MS-SQOS] 3.1.6: SET_POLICY without GET_STATUS arms the
    ///   StatusRequestTimer to expire within 1 second.
    pub fn request<'a>(
        &mut self,
        options: Options,
        policy: Option<PolicyParams<'a>>,
        now: Instant,
    ) -> ClientRequest<'a> {
        let mut options = options | Options::UPDATE_COUNTERS;
        if !self.associated {
            options |= Options::SET_LOGICAL_FLOW_ID;
        }
        let mut repr =
            StorageQosControlRequestRepr::new(self.dialect, options, self.logical_flow_id);
        if options.intersects(Options::SET_POLICY | Options::PROBE_POLICY) {
            let p = policy.unwrap_or_default();
            repr.policy_id = p.policy_id;
            repr.initiator_id = p.initiator_id;
            repr.limit = p.limit;
            repr.reservation = p.reservation;
            if self.dialect == Dialect::V1_1 {
                repr.bandwidth_limit = p.bandwidth_limit;
            }
            repr.initiator_name = p.initiator_name;
            repr.initiator_node_name = p.initiator_node_name;
        }
        self.take_counters(&mut repr);
        if options.contains(Options::SET_POLICY) && !options.contains(Options::GET_STATUS) {
            self.arm_timer(now + SET_POLICY_STATUS_DEADLINE);
        }
        self.in_flight = Some(InFlight {
            options,
            disassociate: false,
        });
        ClientRequest {
            repr,
            max_response_size: self.dialect.response_len() as u32,
        }
    }

    /// [MS-SQOS] 3.1.6: the periodic request: GET_STATUS | UPDATE_COUNTERS.
    pub fn status_request(&mut self, now: Instant) -> ClientRequest<'static> {
        self.request(Options::GET_STATUS, None, now)
    }

    /// SET_POLICY with GET_STATUS in the same request (3.1.6's first choice).
    pub fn set_policy_request<'a>(
        &mut self,
        policy: PolicyParams<'a>,
        now: Instant,
    ) -> ClientRequest<'a> {
        self.request(Options::SET_POLICY | Options::GET_STATUS, Some(policy), now)
    }

    /// PROBE_POLICY with GET_STATUS, as in [MS-SQOS] 4.3.
    pub fn probe_policy_request<'a>(
        &mut self,
        policy: PolicyParams<'a>,
        now: Instant,
    ) -> ClientRequest<'a> {
        self.request(
            Options::PROBE_POLICY | Options::GET_STATUS,
            Some(policy),
            now,
        )
    }

    /// [MS-SQOS] 3.2.5.1.1: SET_LOGICAL_FLOW_ID with an empty LogicalFlowID
    /// removes the handle's association. Carries no counters (the server
    /// would refuse them once the association is gone); they are still
    /// zeroed, as after every request.
    pub fn disassociate_request(&mut self, _now: Instant) -> ClientRequest<'static> {
        let repr = StorageQosControlRequestRepr::new(
            self.dialect,
            Options::SET_LOGICAL_FLOW_ID,
            Guid::NULL,
        );
        let mut scratch = repr;
        self.take_counters(&mut scratch);
        self.in_flight = Some(InFlight {
            options: Options::SET_LOGICAL_FLOW_ID,
            disassociate: true,
        });
        ClientRequest {
            repr,
            max_response_size: self.dialect.response_len() as u32,
        }
    }

    /// Fills the counter fields and zeroes the counters (3.1.4.1), carrying
    /// sub-unit remainders.
    fn take_counters(&mut self, repr: &mut StorageQosControlRequestRepr<'_>) {
        repr.io_count_increment = core::mem::take(&mut self.io_count_increment);
        repr.normalized_io_count_increment =
            core::mem::take(&mut self.normalized_io_count_increment);
        repr.latency_increment = self.latency_ns / 100;
        self.latency_ns %= 100;
        repr.lower_latency_increment = self.lower_latency_ns / 100;
        self.lower_latency_ns %= 100;
        if self.dialect == Dialect::V1_1 {
            repr.kilobyte_count_increment = self.transferred_bytes / KILOBYTE;
        }
        self.transferred_bytes %= KILOBYTE;
    }

    fn arm_timer(&mut self, at: Instant) {
        self.status_request_timer = Some(match self.status_request_timer {
            Some(t) => t.min(at),
            None => at,
        });
    }

    /// [MS-SQOS] 3.1.5.1: the outcome of the last request: `Err(status)`
    /// when the IOCTL failed, `Ok(output)` on STATUS_SUCCESS (`output` is
    /// empty when the request had no GET_STATUS).
    ///
    /// - failure: StatusRequestTimer expires in 10 s (note <4>); after
    ///   STATUS_REVISION_MISMATCH a 1.1 client falls back to 1.0, and after
    ///   STATUS_NOT_FOUND it re-associates on the next request;
    /// - success with a response: MaximumIoRate, MaximumBandwidth (1.1),
    ///   BaseIoSize are taken from it and the timer expires in TimeToLive ms
    ///   if TimeToLive > 1000, else in 1 s (note <5>).
    ///
    /// Returns the parsed response, if any. A response that does not parse
    /// is handled as a failure and its error returned.
    pub fn handle_response(
        &mut self,
        outcome: Result<&[u8], NtStatus>,
        now: Instant,
    ) -> Result<Option<StorageQosControlResponseRepr>, WireError> {
        let sent = self.in_flight.take();
        let output = match outcome {
            Err(status) => {
                self.on_failure(now);
                if status == STATUS_REVISION_MISMATCH && self.dialect == Dialect::V1_1 {
                    self.dialect = Dialect::V1_0;
                }
                if status == STATUS_NOT_FOUND {
                    self.associated = false;
                }
                return Ok(None);
            }
            Ok(output) => output,
        };
        if let Some(sent) = sent {
            if sent.disassociate {
                self.associated = false;
            } else if sent
                .options
                .intersects(Options::SET_LOGICAL_FLOW_ID | Options::PROBE_POLICY)
            {
                self.associated = true;
            }
        }
        if output.is_empty() {
            return Ok(None);
        }
        let response = match StorageQosControlResponse::new_checked(output)
            .and_then(|view| StorageQosControlResponseRepr::parse(&view))
        {
            Ok(r) => r,
            Err(e) => {
                self.on_failure(now);
                return Err(e);
            }
        };
        self.maximum_io_rate = response.maximum_io_rate;
        if self.dialect == Dialect::V1_1 {
            self.maximum_bandwidth = response.maximum_bandwidth;
        }
        self.status_request_timer = Some(if response.time_to_live > 1000 {
            now + Duration::from_millis(u64::from(response.time_to_live))
        } else {
            now + DEFAULT_STATUS_INTERVAL
        });
        // A BaseIoSize of 0 cannot normalize anything: keep the previous one
        // (docs/spec-notes.md, "BaseIoSize 0 in a response").
        if response.base_io_size != 0 {
            self.base_io_size = response.base_io_size;
        }
        self.last_status = Some(response.status);
        self.limiter.set_limits(
            self.maximum_io_rate,
            self.maximum_bandwidth,
            self.base_io_size,
        );
        Ok(Some(response))
    }

    fn on_failure(&mut self, now: Instant) {
        self.status_request_timer = Some(now + FAILURE_RETRY_INTERVAL);
    }

    /// When the StatusRequestTimer expires (`None`: never).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.status_request_timer
    }

    /// [MS-SQOS] 3.1.6: if the StatusRequestTimer has expired, returns the
    /// status request to send (GET_STATUS | UPDATE_COUNTERS) and stops the
    /// timer until the response arrives. While another request is in flight
    /// nothing is returned and the timer stays armed. (The MAY of 3.1.6 —
    /// delaying the request while the flow is idle — is left to the caller,
    /// which may simply not call this while idle.)
    pub fn handle_timeout(&mut self, now: Instant) -> Option<ClientRequest<'static>> {
        match self.status_request_timer {
            Some(t) if now >= t && self.in_flight.is_none() => {
                self.status_request_timer = None;
                Some(self.status_request(now))
            }
            _ => None,
        }
    }

    /// [MS-SQOS] 3.1.7.1: I/Os of `io_size` bytes per second this flow may
    /// start on average (`None`: unlimited). KB = 1024 bytes.
    pub fn allowed_ios_per_sec(&self, io_size: u64) -> Option<f64> {
        allowed_ios_per_sec(
            self.maximum_io_rate,
            self.maximum_bandwidth,
            self.base_io_size,
            io_size,
        )
    }

    /// [MS-SQOS] 3.1.7.1: may an I/O of `io_size` bytes start at `now`?
    /// `Err(t)`: not before `t`. See [`InitiationLimiter`].
    pub fn may_initiate(&mut self, now: Instant, io_size: u64) -> Result<(), Instant> {
        self.limiter.may_initiate(now, io_size)
    }

    /// The flow's initiation limiter.
    pub fn limiter(&self) -> &InitiationLimiter {
        &self.limiter
    }
}
