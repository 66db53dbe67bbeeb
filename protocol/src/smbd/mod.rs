//! [MS-SMBD] SMB2 RDMA Transport Protocol, version 1.0 (0x0100).

pub mod config;
pub mod connection;
pub mod credits;
pub mod negotiation;
pub mod rdma_slice;
pub mod read_depth;
pub mod reassembly;
pub mod send_queue;
pub mod terminate;
pub mod wire;

pub use config::SmbdConfig;
pub use connection::{
    Connection, ConnectionStats, KeepaliveState, MessageData, PayloadSlice, Receive, Role,
    SendError, Transmit, TransmitKind, MAX_HEADER_LEN, NEGOTIATE_RECEIVES,
};
pub use credits::{CountingPoster, Credits, ReceivePoster};
pub use negotiation::{NegotiateDecision, NegotiatedParams};
pub use terminate::TerminateReason;
