//! Why a connection ends. Every variant names the rule it enforces so the
//! log line an operator reads says what the peer did wrong.

use crate::ntstatus::NtStatus;

/// The reason a connection was (or must be) terminated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TerminateReason {
    /// 3.1.5.6: Negotiate Request shorter than 20 bytes.
    NegotiateRequestTooShort {
        /// Received length.
        len: usize,
    },
    /// 3.1.5.6/3.1.5.7: CreditsRequested is 0.
    NegotiateCreditsRequestedZero,
    /// 3.1.5.6/3.1.5.7: MaxReceiveSize below 128.
    NegotiateMaxReceiveSizeTooSmall {
        /// Received value.
        value: u32,
    },
    /// 3.1.5.6/3.1.5.7: MaxFragmentedSize below 131072.
    NegotiateMaxFragmentedSizeTooSmall {
        /// Received value.
        value: u32,
    },
    /// 3.1.5.3: we sent a failure Negotiate Response (graceful termination).
    NegotiateFailed {
        /// Status sent.
        status: NtStatus,
    },
    /// 3.1.5.7: Negotiate Response shorter than 32 bytes.
    NegotiateResponseTooShort {
        /// Received length.
        len: usize,
    },
    /// 3.1.5.7: NegotiatedVersion is not 0x0100.
    NegotiateResponseBadVersion {
        /// Received value.
        value: u16,
    },
    /// 3.1.5.7: CreditsGranted is 0.
    NegotiateResponseCreditsGrantedZero,
    /// 3.1.5.7: PreferredSendSize exceeds our MaxReceiveSize.
    NegotiateResponsePreferredSendSizeTooLarge {
        /// Received value.
        value: u32,
        /// Our MaxReceiveSize.
        limit: u32,
    },
    /// 3.1.5.7: Status is not STATUS_SUCCESS.
    NegotiateResponseStatus {
        /// Received status.
        status: NtStatus,
    },
    /// 3.1.5.7: no receive could be posted after negotiation.
    NoReceiveCredits,
    /// 3.1.5.8: Data Transfer message shorter than 20 bytes.
    DataTransferTooShort {
        /// Received length.
        len: usize,
    },
    /// 3.1.5.8: CreditsRequested is 0.
    DataTransferCreditsRequestedZero,
    /// 3.1.5.8: DataOffset is not 8-byte aligned.
    DataOffsetUnaligned {
        /// Received DataOffset.
        offset: u32,
    },
    /// 3.1.5.8: DataOffset + DataLength exceeds the message.
    DataBeyondMessage {
        /// DataOffset.
        offset: u32,
        /// DataLength.
        length: u32,
        /// Message length.
        message_len: usize,
    },
    /// The payload would overlap the 20-byte header (docs/spec-notes.md,
    /// "DataOffset inside the header").
    DataOffsetInsideHeader {
        /// DataOffset.
        offset: u32,
    },
    /// 3.1.5.8: DataLength + RemainingDataLength exceeds our MaxFragmentedRecvSize.
    FragmentedSizeExceeded {
        /// DataLength + RemainingDataLength.
        total: u64,
        /// Our limit.
        limit: u32,
    },
    /// 3.1.5.8: a continuation fragment whose RemainingDataLength does not
    /// count down by its DataLength.
    FragmentCountdownMismatch {
        /// RemainingDataLength expected.
        expected: u32,
        /// RemainingDataLength received.
        got: u32,
    },
    /// 3.1.5.8: a continuation fragment carries more data than remains.
    FragmentOverrun {
        /// Bytes that remained.
        remaining: u32,
        /// DataLength received.
        length: u32,
    },
    /// 3.1.6.1: the Negotiation Timer expired.
    NegotiationTimeout,
    /// 3.1.6.2: the Idle Connection Timer expired with a keepalive outstanding.
    KeepaliveTimeout,
    /// The peer sent a message while holding no credit we granted and no
    /// receive was posted (RNR on the provider).
    SendWithoutCredit,
    /// 3.1.7.1: the RDMA provider reported connection loss.
    ConnectionLost,
    /// The local upper layer closed the connection.
    LocalClose,
}

impl TerminateReason {
    /// True when the peer broke a protocol rule (as opposed to a timer, a
    /// local close or a lost connection).
    pub fn is_peer_violation(&self) -> bool {
        !matches!(
            self,
            TerminateReason::NegotiateFailed { .. }
                | TerminateReason::NoReceiveCredits
                | TerminateReason::NegotiationTimeout
                | TerminateReason::KeepaliveTimeout
                | TerminateReason::ConnectionLost
                | TerminateReason::LocalClose
        )
    }
}

impl core::fmt::Display for TerminateReason {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        use TerminateReason::*;
        match *self {
            NegotiateRequestTooShort { len } => {
                write!(f, "negotiate request is {len} bytes, shorter than 20 ([MS-SMBD] 3.1.5.6)")
            }
            NegotiateCreditsRequestedZero => f.write_str("negotiate CreditsRequested is 0 ([MS-SMBD] 3.1.5.6/3.1.5.7)"),
            NegotiateMaxReceiveSizeTooSmall { value } => {
                write!(f, "negotiate MaxReceiveSize {value} is below 128 ([MS-SMBD] 3.1.5.6/3.1.5.7)")
            }
            NegotiateMaxFragmentedSizeTooSmall { value } => write!(
                f,
                "negotiate MaxFragmentedSize {value} is below 131072 ([MS-SMBD] 3.1.5.6/3.1.5.7)"
            ),
            NegotiateFailed { status } => write!(f, "negotiation refused with {status} ([MS-SMBD] 3.1.5.3)"),
            NegotiateResponseTooShort { len } => {
                write!(f, "negotiate response is {len} bytes, shorter than 32 ([MS-SMBD] 3.1.5.7)")
            }
            NegotiateResponseBadVersion { value } => {
                write!(f, "negotiate response NegotiatedVersion 0x{value:04x} is not 0x0100 ([MS-SMBD] 3.1.5.7)")
            }
            NegotiateResponseCreditsGrantedZero => {
                f.write_str("negotiate response CreditsGranted is 0 ([MS-SMBD] 3.1.5.7)")
            }
            NegotiateResponsePreferredSendSizeTooLarge { value, limit } => write!(
                f,
                "negotiate response PreferredSendSize {value} exceeds our MaxReceiveSize {limit} ([MS-SMBD] 3.1.5.7)"
            ),
            NegotiateResponseStatus { status } => {
                write!(f, "peer refused negotiation with {status} ([MS-SMBD] 3.1.5.7)")
            }
            NoReceiveCredits => f.write_str("no receive buffer could be posted ([MS-SMBD] 3.1.5.7/3.1.5.9)"),
            DataTransferTooShort { len } => {
                write!(f, "data transfer message is {len} bytes, shorter than 20 ([MS-SMBD] 3.1.5.8)")
            }
            DataTransferCreditsRequestedZero => f.write_str("data transfer CreditsRequested is 0 ([MS-SMBD] 3.1.5.8)"),
            DataOffsetUnaligned { offset } => {
                write!(f, "data transfer DataOffset {offset} is not 8-byte aligned ([MS-SMBD] 3.1.5.8)")
            }
            DataBeyondMessage { offset, length, message_len } => write!(
                f,
                "data transfer DataOffset {offset} + DataLength {length} exceeds the {message_len}-byte message ([MS-SMBD] 3.1.5.8)"
            ),
            DataOffsetInsideHeader { offset } => {
                write!(f, "data transfer DataOffset {offset} places data inside the 20-byte header")
            }
            FragmentedSizeExceeded { total, limit } => write!(
                f,
                "DataLength + RemainingDataLength = {total} exceeds MaxFragmentedRecvSize {limit} ([MS-SMBD] 3.1.5.8)"
            ),
            FragmentCountdownMismatch { expected, got } => write!(
                f,
                "fragment RemainingDataLength {got} does not count down (expected {expected}) ([MS-SMBD] 3.1.5.8)"
            ),
            FragmentOverrun { remaining, length } => write!(
                f,
                "fragment DataLength {length} exceeds the {remaining} bytes remaining ([MS-SMBD] 3.1.5.8)"
            ),
            NegotiationTimeout => f.write_str("negotiation timer expired ([MS-SMBD] 3.1.6.1)"),
            KeepaliveTimeout => f.write_str("peer did not answer a keepalive ([MS-SMBD] 3.1.6.2)"),
            SendWithoutCredit => f.write_str("peer sent without a send credit (receiver not ready)"),
            ConnectionLost => f.write_str("RDMA connection lost ([MS-SMBD] 3.1.7.1)"),
            LocalClose => f.write_str("closed locally"),
        }
    }
}
