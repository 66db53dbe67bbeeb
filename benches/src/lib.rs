//! Benchmarks and load generators (issue 6 grows this into `smbdirectd bench`).

pub mod baseline;
pub mod bench;
pub mod dispatch_bench;
pub mod micro_bench;
pub mod protocol_loopback;
pub mod provider_bench;
pub mod qos_path_bench;
pub mod service_loopback;
