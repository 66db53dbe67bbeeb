//! Negotiation decisions as pure functions, so that the control plane can
//! decide ([MS-SMBD] 3.1.5.6) while the worker that owns the queue pair posts
//! the receives and the response.

use super::config::{
    SmbdConfig, MIN_FRAGMENTED_SIZE, MIN_RECEIVE_SIZE, SMBD_VERSION_1,
    WINDOWS_MAX_PREFERRED_SEND_SIZE,
};
use super::terminate::TerminateReason;
use super::wire::{
    NegotiateRequest, NegotiateRequestRepr, NegotiateResponse, NegotiateResponseRepr,
};
use crate::ntstatus::{self, NtStatus};

/// Connection parameters settled by negotiation ([MS-SMBD] 3.1.1.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NegotiatedParams {
    /// Connection.Protocol (always 0x0100).
    pub protocol: u16,
    /// Connection.MaxSendSize: our largest message to the peer.
    pub max_send_size: u32,
    /// Connection.MaxReceiveSize: the peer's largest message to us.
    pub max_receive_size: u32,
    /// Connection.MaxFragmentedSendSize: the peer's reassembly limit.
    pub max_fragmented_send_size: u32,
    /// Connection.MaxFragmentedRecvSize: our reassembly limit.
    pub max_fragmented_recv_size: u32,
    /// Connection.MaxReadWriteSize.
    pub max_read_write_size: u32,
    /// Connection.ReceiveCreditTarget: the peer's CreditsRequested.
    pub receive_credit_target: u16,
    /// Send credits granted by the peer in the negotiate response (active
    /// side only; 0 on the passive side, which receives its first credits in
    /// the peer's first Data Transfer message, [MS-SMBD] 4.1 step 3).
    pub initial_send_credits: u16,
}

/// What the passive side does with a Negotiate Request ([MS-SMBD] 3.1.5.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NegotiateDecision {
    /// Terminate the connection without a response.
    Terminate(TerminateReason),
    /// Send a failure Negotiate Response with this status, then terminate
    /// gracefully ([MS-SMBD] 3.1.5.3).
    Fail(NtStatus),
    /// Accept with these parameters; the worker posts receives
    /// ([MS-SMBD] 3.1.5.9) and sends the success response.
    Accept(NegotiatedParams),
}

/// [MS-SMBD] 3.1.5.6: validates a received Negotiate Request against the
/// local configuration. Pure: the control plane calls it.
pub fn evaluate_negotiate_request(cfg: &SmbdConfig, msg: &[u8]) -> NegotiateDecision {
    // "The length of the received message is at least 20 bytes" else terminate.
    let Ok(view) = NegotiateRequest::new_checked(msg) else {
        return NegotiateDecision::Terminate(TerminateReason::NegotiateRequestTooShort {
            len: msg.len(),
        });
    };
    let req = NegotiateRequestRepr::parse(&view);
    // "The range of values between MinVersion and MaxVersion inclusive MUST
    // include 0x0100" else a failure response with STATUS_NOT_SUPPORTED. An
    // inverted range (Min > Max) includes nothing.
    if !(req.min_version <= SMBD_VERSION_1 && SMBD_VERSION_1 <= req.max_version) {
        return NegotiateDecision::Fail(ntstatus::STATUS_NOT_SUPPORTED);
    }
    // "CreditsRequested > 0, MaxReceiveSize >= 128, MaxFragmentedSize >=
    // 131072" else terminate.
    if req.credits_requested == 0 {
        return NegotiateDecision::Terminate(TerminateReason::NegotiateCreditsRequestedZero);
    }
    if req.max_receive_size < MIN_RECEIVE_SIZE {
        return NegotiateDecision::Terminate(TerminateReason::NegotiateMaxReceiveSizeTooSmall {
            value: req.max_receive_size,
        });
    }
    if req.max_fragmented_size < MIN_FRAGMENTED_SIZE {
        return NegotiateDecision::Terminate(TerminateReason::NegotiateMaxFragmentedSizeTooSmall {
            value: req.max_fragmented_size,
        });
    }
    // Note <5> (optional): Windows Server 2012 R2+ refuses PreferredSendSize > 8136.
    if cfg.strict_preferred_send_size && req.preferred_send_size > WINDOWS_MAX_PREFERRED_SEND_SIZE {
        return NegotiateDecision::Fail(ntstatus::STATUS_INSUFFICIENT_RESOURCES);
    }
    // "SHOULD set Connection.MaxReceiveSize to the smaller of
    // Connection.MaxReceiveSize and PreferredSendSize; if the result is less
    // than 128, MUST be set to 128."
    let max_receive_size = cfg
        .max_receive_size
        .min(req.preferred_send_size)
        .max(MIN_RECEIVE_SIZE);
    NegotiateDecision::Accept(NegotiatedParams {
        protocol: SMBD_VERSION_1,
        max_send_size: cfg.max_send_size.min(req.max_receive_size),
        max_receive_size,
        max_fragmented_send_size: req.max_fragmented_size,
        max_fragmented_recv_size: cfg.max_fragmented_recv_size,
        max_read_write_size: cfg.max_read_write_size,
        receive_credit_target: req.credits_requested,
        initial_send_credits: 0,
    })
}

/// [MS-SMBD] 3.1.5.2: the Negotiate Request the active side sends.
pub fn negotiate_request_for(cfg: &SmbdConfig) -> NegotiateRequestRepr {
    NegotiateRequestRepr {
        min_version: SMBD_VERSION_1,
        max_version: SMBD_VERSION_1,
        credits_requested: cfg.send_credit_target,
        preferred_send_size: cfg.max_send_size,
        max_receive_size: cfg.max_receive_size,
        max_fragmented_size: cfg.max_fragmented_recv_size,
    }
}

/// [MS-SMBD] 3.1.5.3: the success response, given the negotiated values
/// and the receive credits posted.
pub fn negotiate_response_for(
    cfg: &SmbdConfig,
    p: &NegotiatedParams,
    credits_granted: u16,
) -> NegotiateResponseRepr {
    NegotiateResponseRepr {
        min_version: SMBD_VERSION_1,
        max_version: SMBD_VERSION_1,
        negotiated_version: p.protocol,
        credits_requested: cfg.send_credit_target,
        credits_granted,
        status: ntstatus::STATUS_SUCCESS,
        max_read_write_size: p.max_read_write_size,
        preferred_send_size: p.max_send_size,
        max_receive_size: p.max_receive_size,
        max_fragmented_size: p.max_fragmented_recv_size,
    }
}

/// [MS-SMBD] 3.1.5.7: validates a received Negotiate Response on the active
/// side. Every failed check terminates the connection.
pub fn evaluate_negotiate_response(
    cfg: &SmbdConfig,
    msg: &[u8],
) -> Result<NegotiatedParams, TerminateReason> {
    let Ok(view) = NegotiateResponse::new_checked(msg) else {
        return Err(TerminateReason::NegotiateResponseTooShort { len: msg.len() });
    };
    let rsp = NegotiateResponseRepr::parse(&view);
    // A failure status is reported first: it explains the zeroed fields.
    if rsp.status != ntstatus::STATUS_SUCCESS {
        return Err(TerminateReason::NegotiateResponseStatus { status: rsp.status });
    }
    if rsp.negotiated_version != SMBD_VERSION_1 {
        return Err(TerminateReason::NegotiateResponseBadVersion {
            value: rsp.negotiated_version,
        });
    }
    if rsp.max_receive_size < MIN_RECEIVE_SIZE {
        return Err(TerminateReason::NegotiateMaxReceiveSizeTooSmall {
            value: rsp.max_receive_size,
        });
    }
    if rsp.max_fragmented_size < MIN_FRAGMENTED_SIZE {
        return Err(TerminateReason::NegotiateMaxFragmentedSizeTooSmall {
            value: rsp.max_fragmented_size,
        });
    }
    if rsp.credits_granted == 0 {
        return Err(TerminateReason::NegotiateResponseCreditsGrantedZero);
    }
    if rsp.credits_requested == 0 {
        return Err(TerminateReason::NegotiateCreditsRequestedZero);
    }
    if rsp.preferred_send_size > cfg.max_receive_size {
        return Err(
            TerminateReason::NegotiateResponsePreferredSendSizeTooLarge {
                value: rsp.preferred_send_size,
                limit: cfg.max_receive_size,
            },
        );
    }
    Ok(NegotiatedParams {
        protocol: SMBD_VERSION_1,
        max_send_size: cfg.max_send_size.min(rsp.max_receive_size),
        max_receive_size: cfg
            .max_receive_size
            .min(rsp.preferred_send_size)
            .max(MIN_RECEIVE_SIZE),
        max_fragmented_send_size: rsp.max_fragmented_size,
        max_fragmented_recv_size: cfg.max_fragmented_recv_size,
        // "the smaller of an implementation-specific value <6> and the
        // received MaxReadWriteSize".
        max_read_write_size: cfg.max_read_write_size.min(rsp.max_read_write_size),
        receive_credit_target: rsp.credits_requested,
        initial_send_credits: rsp.credits_granted,
    })
}
