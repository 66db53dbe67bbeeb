//! Data plane: RDMA providers and pinned poll-mode workers (issues 3, 4).
#![warn(missing_debug_implementations)]

pub mod provider;
