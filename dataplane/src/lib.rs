//! Data plane: RDMA providers and pinned poll-mode workers (issues 3, 4).
#![warn(missing_debug_implementations)]

pub mod ab;
pub mod capture;
pub mod client;
pub mod clock;
pub mod cores;
pub mod endpoint;
pub mod hint;
pub mod idhash;
pub mod marks;
pub mod planes;
pub mod provider;
pub mod ratelog;
pub mod smb2;
pub mod upper;
pub mod worker;
pub mod zerocopy;
