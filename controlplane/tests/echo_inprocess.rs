//! The service in one process: a server on the soft provider with the echo
//! upper layer, a client connection driven from the test thread.

mod common;

use smbdirect_controlplane::{start, ServerConfig};
use smbdirect_dataplane::client::Client;
use smbdirect_dataplane::provider::soft::SoftProvider;
use smbdirect_dataplane::provider::MemoryRegion;
use smbdirect_dataplane::upper::Echo;
use smbdirect_hugepages::BufferPool;
use smbdirect_protocol::smbd::SmbdConfig;
use std::sync::Arc;
use std::time::Duration;

fn server_config() -> ServerConfig {
    common::server_config(2, 8, common::smbd32())
}

fn client_pool(provider: &SoftProvider) -> (BufferPool, MemoryRegion) {
    common::client_pool(provider, 48 << 20, 1 << 20)
}

#[test]
fn echo_server_returns_every_message_intact_and_every_buffer_on_shutdown() {
    let provider = Arc::new(SoftProvider::new().expect("soft provider"));
    // Port 0: the soft provider picks a free one (local_addr tells which).
    let cfg = server_config();
    let server = start(provider.clone(), cfg, || Echo).expect("server starts");
    let addr = server.local_addr();

    let (cpool, mr) = client_pool(&provider);
    let ccfg = common::smbd32();
    let mut client = match Client::connect(
        &*provider,
        addr,
        ccfg,
        cpool.claim_slice(0).unwrap(),
        mr,
        Duration::from_secs(5),
    ) {
        Ok(c) => c,
        Err(e) => panic!(
            "connect failed: {e}; server stats: {}",
            server.stats().to_json()
        ),
    };

    for &size in &[1usize, 100, 1340, 1341, 5000, 65_536, 300_000, 1 << 20] {
        let msg: Vec<u8> = (0..size).map(|i| (i * 7 + size) as u8).collect();
        client.send(&msg).unwrap();
        let ok = client
            .recv_with(Duration::from_secs(10), |m| m == &msg[..])
            .unwrap();
        assert!(ok, "echo of {size} bytes differs");
    }
    let t = server.stats().totals();
    assert_eq!(t.messages_in, 8);
    assert_eq!(t.messages_out, 8);
    // The poll loop charged the echoes' iterations to busy and the waits
    // between them to idle; both sums only grow. With nothing arriving
    // for a while, idle grows and busy does not (an iteration with no
    // completion, message or timer does no work: the timer scan runs
    // every few ms, so busy may move by a few of those, not by more than
    // idle).
    assert!(t.busy_cycles > 0 && t.idle_cycles > 0, "{t:?}");
    std::thread::sleep(Duration::from_millis(50));
    let later = server.stats().totals();
    assert!(later.idle_cycles > t.idle_cycles, "{t:?} then {later:?}");
    assert!(later.busy_cycles >= t.busy_cycles, "{t:?} then {later:?}");
    assert!(
        later.idle_cycles - t.idle_cycles > later.busy_cycles - t.busy_cycles,
        "idle for 50 ms yet more busy cycles than idle ones: {t:?} then {later:?}"
    );
    let f = later.busy_fraction_since(&t).expect("cycles were counted");
    assert!((0.0..0.9).contains(&f), "{f}");
    let _alloc = client.close(Duration::from_secs(2));
    let stats = server.shutdown();
    for c in stats.pool_classes() {
        assert_eq!(
            c.free, c.total,
            "pool class {} has buffers outstanding after shutdown",
            c.name
        );
    }
}

#[test]
fn a_client_dropped_without_close_gives_every_buffer_back_to_its_slice() {
    let provider = Arc::new(SoftProvider::new().expect("soft provider"));
    let server = start(provider.clone(), server_config(), || Echo).expect("server starts");
    let addr = server.local_addr();
    let (cpool, mr) = client_pool(&provider);
    let in_use = |pool: &BufferPool| -> Vec<u32> {
        (0..pool.class_count())
            .map(|c| {
                let s = pool
                    .class_stats(0, smbdirect_hugepages::ClassId(c as u8))
                    .unwrap();
                s.total - s.free
            })
            .collect()
    };
    assert!(in_use(&cpool).iter().all(|&n| n == 0));
    let mut client = Client::connect(
        &*provider,
        addr,
        SmbdConfig::default(),
        cpool.claim_slice(0).unwrap(),
        mr,
        Duration::from_secs(5),
    )
    .expect("connect");
    client.send(b"one message in flight").unwrap();
    assert!(
        in_use(&cpool).iter().any(|&n| n > 0),
        "receives are posted while connected"
    );
    // An error path drops the client: its connection closes, its posted
    // receives come home, then its slice is un-claimed.
    drop(client);
    assert_eq!(in_use(&cpool), vec![0; cpool.class_count()]);
    let again = cpool
        .claim_slice(0)
        .expect("the slice is free to claim again");
    drop(again);
    let stats = server.shutdown();
    assert_eq!(stats.totals().connections, 0);
}
