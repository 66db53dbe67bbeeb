//! What every torture case runs on: the client side's RDMA provider, one
//! registered buffer pool cut into slices (each connection a case opens
//! claims one and gives it back when it ends), the server's address and
//! what the tool knows about the server (its upper layer, its keepalive
//! interval, its admin socket).
//!
//! Also the healthy peer ([`Healthy`]): the connection that, after every
//! case, must still negotiate and complete a round trip, and that timer
//! and flood cases keep open beside the hostile one to show that nothing
//! else was affected.

use super::smb2_peer::Smb2Peer;
use smbdirect_controlplane::admin;
use smbdirect_dataplane::client::{buffer_descriptor, Client};
use smbdirect_dataplane::provider::{Access, MemoryRegion, Provider};
use smbdirect_hugepages::{
    Backing, BufId, BufferPool, HugepagePolicy, PoolConfig, SizeClass, SliceAllocator,
};
use smbdirect_protocol::smbd::wire::BufferDescriptorRepr;
use smbdirect_protocol::smbd::SmbdConfig;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Slices of the client pool: the most connections a case holds at once.
const SLICES: usize = 8;

/// The server's upper layer, as detected by [`detect_upper`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upper {
    /// `serve --upper echo`: every message comes back.
    Echo,
    /// `serve --upper smb2`: SMB2 over SMB Direct.
    Smb2,
}

impl Upper {
    /// The `--upper` value naming it.
    pub fn name(self) -> &'static str {
        match self {
            Upper::Echo => "echo",
            Upper::Smb2 => "smb2",
        }
    }
}

/// The SMB Direct settings of the tool's own well-behaved connections
/// (small credit targets: a torture run opens many connections, and the
/// server's defaults must not be what makes a case pass).
pub fn healthy_config() -> SmbdConfig {
    SmbdConfig {
        receive_credit_max: 32,
        send_credit_target: 32,
        ..SmbdConfig::default()
    }
}

/// The client side of a torture run.
pub struct Rig<P: Provider> {
    /// The RDMA provider connections are made with.
    pub provider: P,
    /// The server.
    pub addr: SocketAddr,
    /// The registered pool every connection's buffers come from.
    pub pool: BufferPool,
    /// Its registration.
    pub mr: MemoryRegion,
    /// The server's upper layer.
    pub upper: Upper,
    /// How long a case waits for a reaction the spec prescribes to be
    /// immediate (a termination, a response).
    pub timeout: Duration,
    /// The server's Connection.KeepaliveInterval, when the operator told us
    /// (`--keepalive-interval`); timer cases that need it are skipped
    /// otherwise.
    pub keepalive: Option<Duration>,
    /// The SMB2 share to connect to.
    pub share: String,
    /// The daemon's admin socket, when reachable: server-side evidence
    /// (live connections, error counters) for the observations.
    pub admin: Option<PathBuf>,
    seq: u64,
}

impl<P: Provider> Rig<P> {
    /// Builds and registers the client pool.
    pub fn new(
        provider: P,
        addr: SocketAddr,
        timeout: Duration,
        keepalive: Option<Duration>,
        share: String,
        admin: Option<PathBuf>,
    ) -> Result<Self, String> {
        let pool = PoolConfig::new(SLICES * (6 << 20), SLICES)
            .class(SizeClass::new("receive", 8192).per_slice(96))
            .class(SizeClass::new("send", 1364).per_slice(320))
            .class(SizeClass::new("io64k", 65536).per_slice(8))
            .class(SizeClass::new("io1m", 1 << 20).per_slice(2))
            .backing(Backing::SharedMemfd)
            .hugepages(HugepagePolicy::Disable)
            .mlock(false)
            .build()
            .map_err(|e| format!("client buffer pool: {e}"))?;
        // SAFETY: `pool` is stored next to the provider in the rig and
        // outlives every connection made with it (they borrow the rig).
        let mr = unsafe { provider.register_pool(&pool) }
            .map_err(|e| format!("registering the client buffer pool: {e}"))?;
        Ok(Rig {
            provider,
            addr,
            pool,
            mr,
            upper: Upper::Echo,
            timeout,
            keepalive,
            share,
            admin,
            seq: 0,
        })
    }

    /// A free slice of the pool for one connection.
    pub fn slice(&self) -> Result<SliceAllocator, String> {
        (0..SLICES)
            .find_map(|i| self.pool.claim_slice(i).ok())
            .ok_or_else(|| format!("all {SLICES} client pool slices are in use"))
    }

    /// A number unique within this run (file names, GUIDs, seeds).
    pub fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// A well-behaved SMB Direct connection (negotiated).
    pub fn client(&self) -> Result<Client<P>, String> {
        Client::connect(
            &self.provider,
            self.addr,
            healthy_config(),
            self.slice()?,
            self.mr,
            self.timeout.max(Duration::from_secs(5)),
        )
        .map_err(|e| format!("SMB Direct connect: {e}"))
    }

    /// A healthy peer of the server's upper layer: negotiated at the SMB
    /// Direct level and, for SMB2, with SMB2 NEGOTIATE done.
    pub fn healthy(&self) -> Result<Healthy<P>, String> {
        match self.upper {
            Upper::Echo => Ok(Healthy::Echo(Box::new(self.client()?))),
            Upper::Smb2 => {
                let mut s = Smb2Peer::connect(self)?;
                s.negotiate()?;
                Ok(Healthy::Smb2(Box::new(s)))
            }
        }
    }

    /// The server's totals from its admin socket (`None` without one).
    pub fn stats(&self) -> Option<ServerTotals> {
        let path = self.admin.as_ref()?;
        let doc = admin::request(path, "stats").ok()?;
        ServerTotals::parse(&doc)
    }
}

/// The counters of the `total` object of `stats --json` a case looks at.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerTotals {
    /// Live connections.
    pub connections: u64,
    /// Peer violations that terminated a connection.
    pub protocol_errors: u64,
    /// Connections ended by the negotiation or keepalive timer.
    pub timeouts: u64,
    /// Failed RDMA operations.
    pub rdma_errors: u64,
}

impl ServerTotals {
    fn parse(doc: &str) -> Option<Self> {
        let total = &doc[doc.find("\"total\":{")?..];
        let total = &total[..total.find('}')?];
        let field = |key: &str| -> Option<u64> {
            let k = format!("\"{key}\":");
            let at = total.find(&k)? + k.len();
            let digits: String = total[at..]
                .chars()
                .take_while(|c| c.is_ascii_digit())
                .collect();
            digits.parse().ok()
        };
        Some(ServerTotals {
            connections: field("connections")?,
            protocol_errors: field("protocol_errors")?,
            timeouts: field("timeouts")?,
            rdma_errors: field("rdma_errors")?,
        })
    }

    /// What changed from `before` to `self`, for an observation
    /// (`protocol_errors +1`); empty when nothing did.
    pub fn delta(&self, before: &ServerTotals) -> String {
        let mut parts = Vec::new();
        for (name, a, b) in [
            (
                "protocol_errors",
                before.protocol_errors,
                self.protocol_errors,
            ),
            ("timeouts", before.timeouts, self.timeouts),
            ("rdma_errors", before.rdma_errors, self.rdma_errors),
        ] {
            if b != a {
                parts.push(format!("{name} +{}", b.saturating_sub(a)));
            }
        }
        parts.join(", ")
    }
}

/// A well-behaved peer of either upper layer.
pub enum Healthy<P: Provider> {
    /// Echo server: a payload comes back.
    Echo(Box<Client<P>>),
    /// SMB2 server: an SMB2 ECHO is answered.
    Smb2(Box<Smb2Peer<P>>),
}

impl<P: Provider> Healthy<P> {
    /// One round trip: an echoed message, or SMB2 ECHO with STATUS_SUCCESS.
    pub fn round_trip(&mut self, timeout: Duration) -> Result<Duration, String> {
        let t0 = Instant::now();
        match self {
            Healthy::Echo(c) => {
                let msg: Vec<u8> = (0..96u8).map(|i| i.wrapping_mul(7) ^ 0x5a).collect();
                c.send(&msg).map_err(|e| format!("echo send: {e}"))?;
                let same = c
                    .recv_with(timeout, |m| m == &msg[..])
                    .map_err(|e| format!("echo: {e}"))?;
                if !same {
                    return Err("echo came back different".into());
                }
            }
            Healthy::Smb2(s) => {
                let st = s.echo(timeout)?;
                if st != smbdirect_protocol::ntstatus::STATUS_SUCCESS {
                    return Err(format!("SMB2 ECHO answered {st}"));
                }
            }
        }
        Ok(t0.elapsed())
    }

    /// Polls once without expecting anything, so that the server's
    /// keepalive requests are answered while a case waits.
    pub fn idle_step(&mut self) -> Result<(), String> {
        let c = match self {
            Healthy::Echo(c) => c,
            Healthy::Smb2(s) => s.client_mut(),
        };
        c.step(&mut |_, _| {})
            .map(|_| ())
            .map_err(|e| format!("healthy connection: {e}"))
    }

    /// Closes the connection.
    pub fn close(self) {
        match self {
            Healthy::Echo(c) => {
                let _ = c.close(Duration::from_secs(2));
            }
            Healthy::Smb2(s) => s.close(),
        }
    }
}

/// Busy-waits `d` while keeping `peers` answering keepalives; the first
/// peer error ends the wait with it.
pub fn idle<P: Provider>(peers: &mut [&mut Healthy<P>], d: Duration) -> Result<(), String> {
    let until = Instant::now() + d;
    while Instant::now() < until {
        for p in peers.iter_mut() {
            p.idle_step()?;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(())
}

/// Finds out which upper layer the server runs: an SMB2 NEGOTIATE is
/// answered by an SMB2 server and returned verbatim by an echo server.
pub fn detect_upper<P: Provider>(rig: &Rig<P>) -> Result<Upper, String> {
    let mut c = rig.client()?;
    let probe = super::smb2_peer::negotiate_request_bytes(0);
    c.send(&probe).map_err(|e| format!("send: {e}"))?;
    let reply = c
        .recv_with(rig.timeout.max(Duration::from_secs(5)), |m| m.to_vec())
        .map_err(|e| format!("no answer to an SMB2 NEGOTIATE: {e}"))?;
    let _ = c.close(Duration::from_secs(2));
    if reply == probe {
        return Ok(Upper::Echo);
    }
    match smbdirect_protocol::smb2::HeaderRepr::from_bytes(&reply) {
        Ok(h) if h.is_response() => Ok(Upper::Smb2),
        _ => Err(format!(
            "the answer to an SMB2 NEGOTIATE ({} bytes) is neither an SMB2 response nor an echo",
            reply.len()
        )),
    }
}

/// Buffers a case granted to the server: each grant revoked and each
/// buffer freed by [`Grants::release`].
#[derive(Debug, Default)]
pub struct Grants {
    pub bufs: Vec<BufId>,
    pub rkeys: Vec<u32>,
}

impl Grants {
    /// A fresh pool buffer of `buf_len` bytes with `access` granted over
    /// its first `len`: the descriptor naming it.
    pub fn grant<P: Provider>(
        &mut self,
        c: &mut Client<P>,
        buf_len: usize,
        len: usize,
        access: Access,
    ) -> Result<BufferDescriptorRepr, String> {
        let id = c
            .alloc_buffer(buf_len)
            .map_err(|e| format!("buffer: {e}"))?;
        self.bufs.push(id);
        let g = c
            .grant(id, 0, len, access)
            .map_err(|e| format!("grant: {e}"))?;
        self.rkeys.push(g.rkey);
        Ok(buffer_descriptor(&g))
    }

    /// Revokes every grant and frees every buffer (whether or not the
    /// connection still stands).
    pub fn release<P: Provider>(&mut self, c: &mut Client<P>) {
        for rkey in self.rkeys.drain(..) {
            let _ = c.revoke(rkey);
        }
        for id in self.bufs.drain(..) {
            c.free_buffer(id);
        }
    }
}
