//! Control plane: one thread (`cp`), not busy-polling, that owns connection
//! arrival (admission, choice of the least-loaded worker, creation of the
//! queue pair on that worker's completion queue), the negotiation decision
//! ([MS-SMBD] 3.1.5.6, taken here with the protocol core and passed back to
//! the worker), the admin socket, and (with the SMB2+QoS issue) the Storage
//! QoS flow table. It talks to workers only through bounded lock-free rings.

pub mod admin;
pub mod pressure;
pub mod qos;
pub mod qos_admin;
pub mod qos_policy;
pub mod server;
pub mod stats;
pub mod users;

pub use server::{start, IdleMode, RunningServer, ServerConfig, ServerError};
pub use stats::ServerStats;
pub mod cores;
pub mod log;
pub mod signals;
