//! The provider conformance suite (`provider::conformance`) against the verbs
//! provider: two providers (as a server and a client process would have) on
//! the same RDMA device, connecting over rdma_cm to `$RXE_IP` (or
//! `$SMBD_VERBS_TEST_IP`). Run for real inside the rxe VM by
//! `scripts/rxe-tests.sh`; without a device every case says "skipped: ..." on
//! stderr (uncaptured) and passes.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::Duration;

use smbdirect_dataplane::provider::conformance::{Fixture, FixtureRegion};
use smbdirect_dataplane::provider::verbs::{devices, VerbsConfig, VerbsProvider};

struct VerbsFixture {
    // Providers first: they are dropped (and deregister) before the memory.
    server: VerbsProvider,
    client: VerbsProvider,
    ip: IpAddr,
    /// Every anonymous mapping handed out (last: dropped last).
    maps: Maps,
}

impl VerbsFixture {
    /// The fixture, or `None` (having said why) where there is no device or
    /// no address to use.
    fn new() -> Option<Self> {
        let case = std::thread::current()
            .name()
            .unwrap_or("verbs conformance case")
            .to_string();
        let say = |why: &str| {
            let _ = writeln!(std::io::stderr(), "{case}: skipped: {why}");
        };
        let devs = devices().expect("devices() failed");
        if devs.is_empty() {
            say("no RDMA device");
            return None;
        }
        let var = std::env::var("RXE_IP").or_else(|_| std::env::var("SMBD_VERBS_TEST_IP"));
        let Some(ip) = var.ok().and_then(|v| v.parse().ok()) else {
            say(&format!(
                "RDMA device {} present but neither RXE_IP nor SMBD_VERBS_TEST_IP names its address",
                devs[0].name
            ));
            return None;
        };
        let open = || VerbsProvider::open(VerbsConfig::default()).expect("open verbs provider");
        Some(VerbsFixture {
            server: open(),
            client: open(),
            ip,
            maps: Maps::default(),
        })
    }
}

impl Fixture for VerbsFixture {
    type P = VerbsProvider;

    fn server(&self) -> &VerbsProvider {
        &self.server
    }

    fn client(&self) -> &VerbsProvider {
        &self.client
    }

    fn listen_addr(&self) -> SocketAddr {
        SocketAddr::new(self.ip, 0)
    }

    fn region(&self, len: usize) -> FixtureRegion {
        let len = len.max(1).next_multiple_of(4096);
        // SAFETY: a fresh private anonymous mapping (zero-filled, page
        // aligned), unmapped when the fixture drops, after its providers.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(
            ptr,
            libc::MAP_FAILED,
            "mmap {len} bytes: {}",
            std::io::Error::last_os_error()
        );
        self.maps.0.lock().unwrap().push((ptr as usize, len));
        FixtureRegion {
            ptr: ptr.cast(),
            len,
            shared: None,
        }
    }

    fn fatal_errors_reach_the_peer(&self) -> bool {
        // The responder of an RNR or a refused access stays up until the
        // requester disconnects (it may or may not go to error by itself).
        false
    }

    fn timeout(&self) -> Duration {
        // The rxe VM emulates its CPU.
        Duration::from_secs(20)
    }
}

/// Anonymous mappings, unmapped on drop: the fixture's last field, so it
/// drops after the providers that registered the memory.
#[derive(Default)]
struct Maps(Mutex<Vec<(usize, usize)>>);

impl Drop for Maps {
    fn drop(&mut self) {
        for &(addr, len) in self.0.get_mut().unwrap().iter() {
            // SAFETY: mapped by `region`, unmapped once; the providers that
            // registered it are gone.
            unsafe { libc::munmap(addr as *mut libc::c_void, len) };
        }
    }
}

smbdirect_dataplane::provider_conformance_tests!(match VerbsFixture::new() {
    Some(f) => f,
    None => return,
});
