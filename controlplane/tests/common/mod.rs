//! What the in-process service tests share: a server on loopback and a
//! client's registered pool.
#![allow(dead_code)] // each test file uses part of it

use smbdirect_controlplane::ServerConfig;
use smbdirect_dataplane::provider::soft::SoftProvider;
use smbdirect_dataplane::provider::{MemoryRegion, Provider};
use smbdirect_hugepages::{Backing, BufferPool, PoolConfig};
use smbdirect_protocol::smbd::SmbdConfig;

/// SMB Direct parameters with 32 credits each way (the tests' pools hold
/// them comfortably).
pub fn smbd32() -> SmbdConfig {
    SmbdConfig {
        receive_credit_max: 32,
        send_credit_target: 32,
        ..SmbdConfig::default()
    }
}

/// A server on 127.0.0.1 (port chosen by the provider) with `workers`
/// unpinned workers, room for `max_connections`, a 96 MiB pool and no
/// admin socket, stats or capture.
pub fn server_config(workers: usize, max_connections: usize, smbd: SmbdConfig) -> ServerConfig {
    ServerConfig {
        worker_cores: vec![None; workers],
        smbd,
        queue_depth: 8,
        max_connections,
        ..ServerConfig::default()
    }
}

/// A one-slice client pool of `mem` bytes whose largest buffers take
/// `max_rdma` bytes, registered with `provider` (the caller keeps the pool
/// alive as long as the provider may use it).
pub fn client_pool(
    provider: &SoftProvider,
    mem: usize,
    max_rdma: usize,
) -> (BufferPool, MemoryRegion) {
    let cpool = PoolConfig::smbdirect(mem, 1, 8192, 1364, max_rdma)
        .backing(Backing::SharedMemfd)
        .build()
        .expect("client pool");
    // SAFETY: the pool outlives the provider's use of it in these tests.
    let mr = unsafe { provider.register_pool(&cpool) }.unwrap();
    (cpool, mr)
}
