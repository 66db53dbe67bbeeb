//! Runtime tests of the verbs provider on a real RDMA device (Soft-RoCE in
//! the rxe VM: `scripts/rxe-tests.sh`). Both ends run in this process and
//! connect over rdma_cm to `$RXE_IP` (or `$SMBD_VERBS_TEST_IP`).
//!
//! Without a device, or without an address to use, every test says
//! "skipped: ..." on stderr (uncaptured) and passes.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use smbdirect_dataplane::provider::verbs::{
    devices, GrantMechanism, GrantMode, PortState, VerbsConfig, VerbsCq, VerbsProvider, VerbsQp,
};
use smbdirect_dataplane::provider::{
    Access, Completion, CompletionQueue, ConnRequest, Listener, MemoryRegion, Provider, QpCaps,
    QpState, QueuePair, RecvWr, RemoteBuf, SendOp, SendWr, WcOpcode, WcStatus,
};

const TIMEOUT: Duration = Duration::from_secs(20);
const BUF: usize = 64 * 1024;

/// Writes past the test harness's output capture, so a skip is never silent.
fn say(msg: &str) {
    let _ = writeln!(std::io::stderr(), "{msg}");
}

fn test_ip(test: &str) -> Option<IpAddr> {
    let devs = devices().expect("devices() failed");
    if devs.is_empty() {
        say(&format!("{test}: skipped: no RDMA device"));
        return None;
    }
    let var = std::env::var("RXE_IP").or_else(|_| std::env::var("SMBD_VERBS_TEST_IP"));
    match var.ok().and_then(|v| v.parse().ok()) {
        Some(ip) => Some(ip),
        None => {
            say(&format!(
                "{test}: skipped: RDMA device {} present but neither RXE_IP nor SMBD_VERBS_TEST_IP names its address",
                devs[0].name
            ));
            None
        }
    }
}

fn open(mode: GrantMode) -> VerbsProvider {
    VerbsProvider::open(VerbsConfig {
        grants: mode,
        ..VerbsConfig::default()
    })
    .expect("open verbs provider")
}

/// One end of a connection: its completion queue, queue pair and a
/// registered buffer (leaked: registrations must outlive the provider's use).
struct End {
    cq: VerbsCq,
    qp: VerbsQp,
    mr: MemoryRegion,
}

impl End {
    fn buf(&mut self) -> &mut [u8] {
        // SAFETY: the region is a leaked, live allocation of `len` bytes
        // that only this End touches from the CPU.
        unsafe { std::slice::from_raw_parts_mut(self.mr.addr as *mut u8, self.mr.len as usize) }
    }

    fn poll(&mut self, n: usize, what: &str) -> Vec<Completion> {
        let deadline = Instant::now() + TIMEOUT;
        let mut got = Vec::new();
        let mut out = [Completion::EMPTY; 16];
        while got.len() < n {
            let k = self.cq.poll(&mut out);
            got.extend_from_slice(&out[..k]);
            if Instant::now() > deadline {
                panic!(
                    "{what}: {} of {n} completions after {TIMEOUT:?}: {got:?}",
                    got.len()
                );
            }
            if k == 0 {
                std::thread::yield_now();
            }
        }
        got
    }

    fn recv(&mut self, wr_id: u64, offset: u64, len: u32) {
        let sge = self.mr.sge(offset, len);
        self.qp
            .post_recv(&[RecvWr { wr_id, sge }])
            .expect("post_recv");
    }

    fn send(&mut self, wr_id: u64, offset: u64, len: u32, invalidate: Option<u32>) {
        let sge = [self.mr.sge(offset, len)];
        let wr = SendWr {
            wr_id,
            op: SendOp::Send {
                sges: &sge,
                invalidate,
            },
            signaled: true,
        };
        self.qp.post_send(&[wr]).expect("post_send");
    }
}

/// The test's address and a provider granting through memory windows, or
/// None (said why: no device, or `why` when the device has no type-2
/// windows).
fn window_provider(test: &str, why: &str) -> Option<(IpAddr, VerbsProvider)> {
    let ip = test_ip(test)?;
    let p = open(GrantMode::Auto);
    if p.grant_mechanism() != GrantMechanism::MemoryWindow {
        say(&format!("{test}: skipped: {why}"));
        return None;
    }
    Some((ip, p))
}

fn region(p: &VerbsProvider) -> MemoryRegion {
    let buf: &'static mut [u8] = Box::leak(vec![0u8; BUF].into_boxed_slice());
    // SAFETY: leaked, so it stays mapped for the life of the process.
    unsafe { p.register(buf.as_mut_ptr(), buf.len(), None) }.expect("register")
}

struct Pair {
    server: End,
    client: End,
    /// What each side saw of the other's private data.
    request_data: Vec<u8>,
    reply_data: Vec<u8>,
}

/// Connects a client to a server on `ip`, the server posting `server_recvs`
/// receives of 4 KiB (wr_id = index) before it accepts.
fn pair(p: &VerbsProvider, ip: IpAddr, server_recvs: usize) -> Pair {
    let caps = QpCaps {
        max_send_wr: 64,
        max_recv_wr: 32,
        max_sge: 2,
        ird: 8,
        ord: 8,
    };
    let mut listener = p.listen(SocketAddr::new(ip, 0)).expect("listen");
    let addr = listener.local_addr();
    assert_ne!(addr.port(), 0, "listener has a port");
    let client_cq = p.create_cq(256).expect("client cq");
    let handle = client_cq.handle();
    let pc = p.clone();
    let client = std::thread::spawn(move || pc.connect(addr, &handle, caps, b"hello-req", TIMEOUT));
    let req = listener
        .accept_request(TIMEOUT)
        .expect("accept_request")
        .expect("a connection request");
    let request_data = req.private_data().to_vec();
    let server_cq = p.create_cq(256).expect("server cq");
    let server_mr = region(p);
    let recvs: Vec<RecvWr> = (0..server_recvs)
        .map(|i| RecvWr {
            wr_id: i as u64,
            sge: server_mr.sge(i as u64 * 4096, 4096),
        })
        .collect();
    let server_qp = req
        .accept_with_receives(&server_cq.handle(), caps, b"hello-rep", &recvs)
        .expect("accept");
    let (client_qp, reply_data) = client.join().expect("client thread").expect("connect");
    Pair {
        server: End {
            cq: server_cq,
            qp: server_qp,
            mr: server_mr,
        },
        client: End {
            cq: client_cq,
            qp: client_qp,
            mr: region(p),
        },
        request_data,
        reply_data,
    }
}

#[test]
fn verbs_devices_lists_the_device_its_port_and_window_support() {
    let Some(_) = test_ip("verbs_devices_lists_the_device_its_port_and_window_support") else {
        return;
    };
    let devs = devices().expect("devices");
    for d in &devs {
        say(&format!(
            "verbs: device {} guid {} {:?} max_qp {} max_mr {} max_mw {} windows {:?} grants {:?} ports {:?}",
            d.name,
            d.node_guid_string(),
            d.transport,
            d.max_qp,
            d.max_mr,
            d.max_mw,
            d.memory_windows,
            d.grants,
            d.ports
        ));
        assert!(!d.ports.is_empty());
        assert!(d.max_qp > 0 && d.max_mr > 0);
    }
    let p = open(GrantMode::Auto);
    let d = devs
        .iter()
        .find(|d| d.name == p.device_name())
        .expect("the opened device is listed");
    assert_eq!(p.grant_mechanism(), d.grants);
    assert!(
        d.ports.iter().any(|port| port.state == PortState::Active),
        "{d:?}"
    );
}

#[test]
fn verbs_connect_exchanges_private_data_and_ird_ord() {
    let Some(ip) = test_ip("verbs_connect_exchanges_private_data_and_ird_ord") else {
        return;
    };
    let p = open(GrantMode::Auto);
    let pr = pair(&p, ip, 0);
    // InfiniBand CM private data arrives zero-padded to the message's size.
    assert!(
        pr.request_data.starts_with(b"hello-req"),
        "{:?}",
        pr.request_data
    );
    assert!(
        pr.reply_data.starts_with(b"hello-rep"),
        "{:?}",
        pr.reply_data
    );
    assert_eq!(pr.server.qp.state(), QpState::Connected);
    assert_eq!(pr.client.qp.state(), QpState::Connected);
    let (ird, ord) = pr.server.qp.ird_ord();
    assert!(
        ird > 0 && ord > 0 && ird <= 8 && ord <= 8,
        "server ird/ord {ird}/{ord}"
    );
    assert_eq!(
        pr.client.qp.ird_ord(),
        (ord, ird),
        "each side's IRD is the other's ORD"
    );
    say(&format!(
        "verbs: device {} grants via {:?}; ird/ord server {:?} client {:?}",
        p.device_name(),
        p.grant_mechanism(),
        pr.server.qp.ird_ord(),
        pr.client.qp.ird_ord()
    ));
}

#[test]
fn verbs_sends_arrive_in_order_and_unsignaled_sends_are_retired() {
    let Some(ip) = test_ip("verbs_sends_arrive_in_order_and_unsignaled_sends_are_retired") else {
        return;
    };
    let p = open(GrantMode::Auto);
    let mut pr = pair(&p, ip, 8);
    let c = &mut pr.client;
    for i in 0..8u8 {
        c.buf()[i as usize * 64..(i as usize + 1) * 64].fill(i + 1);
    }
    let sges: Vec<_> = (0..8).map(|i| [c.mr.sge(i * 64, 64)]).collect();
    // One chain, only the last signaled.
    let wrs: Vec<SendWr> = sges
        .iter()
        .enumerate()
        .map(|(i, s)| SendWr {
            wr_id: 100 + i as u64,
            op: SendOp::Send {
                sges: s,
                invalidate: None,
            },
            signaled: i == 7,
        })
        .collect();
    c.qp.post_send(&wrs).expect("post_send chain");
    let sent = c.poll(1, "client send");
    assert_eq!(sent[0].wr_id, 107);
    assert_eq!(sent[0].status, WcStatus::Success);
    assert_eq!(sent[0].opcode, WcOpcode::Send);
    let got = pr.server.poll(8, "server recv");
    for (i, wc) in got.iter().enumerate() {
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
            (i as u64, WcStatus::Success, WcOpcode::Recv, 64)
        );
        assert_eq!(wc.invalidated_rkey, None);
        assert!(
            pr.server.buf()[i * 4096..i * 4096 + 64]
                .iter()
                .all(|&b| b == i as u8 + 1),
            "message {i}"
        );
    }
    // The ring took 8 requests and retired them all: a full queue's worth
    // of unsignaled sends posts again.
    let s = [pr.client.mr.sge(0, 8)];
    let many: Vec<SendWr> = (0..64)
        .map(|i| SendWr {
            wr_id: i,
            op: SendOp::RdmaWrite {
                sges: &s,
                remote: RemoteBuf { addr: 0, rkey: 0 },
            },
            signaled: false,
        })
        .collect();
    assert!(matches!(
        pr.client
            .qp
            .post_send(&[many.as_slice(), &many[..1]].concat()),
        Err(smbdirect_dataplane::provider::ProviderError::QueueFull)
    ));
}

#[test]
fn verbs_inline_and_fetched_sends_deliver_their_bytes() {
    let Some(ip) = test_ip("verbs_inline_and_fetched_sends_deliver_their_bytes") else {
        return;
    };
    let p = open(GrantMode::Auto);
    let mut pr = pair(&p, ip, 6);
    let inline = pr.client.qp.max_inline();
    say(&format!(
        "client queue pair takes sends of up to {inline} bytes inline"
    ));
    // The SMB2 response to a READ or WRITE through RDMA (24 + 64 + 16
    // bytes) must go inline wherever the device grants what we ask.
    assert!(inline >= 104, "max_inline {inline}");
    // Around the boundary, one gathered from two SGEs, and a large one.
    let sizes = [1, inline - 1, inline, inline + 1, 4096];
    let c = &mut pr.client;
    for (i, &n) in sizes.iter().enumerate() {
        let at = i * 4096;
        for (k, b) in c.buf()[at..at + n as usize].iter_mut().enumerate() {
            *b = (k as u8).wrapping_mul(31).wrapping_add(i as u8 + 1);
        }
        c.send(10 + i as u64, at as u64, n, None);
    }
    let at = sizes.len() * 4096;
    c.buf()[at..at + 40].fill(0xa1);
    c.buf()[at + 100..at + 140].fill(0xb2);
    let two = [c.mr.sge(at as u64, 40), c.mr.sge(at as u64 + 100, 40)];
    c.qp.post_send(&[SendWr {
        wr_id: 20,
        op: SendOp::Send {
            sges: &two,
            invalidate: None,
        },
        signaled: true,
    }])
    .expect("post_send of two SGEs");
    let sent = c.poll(sizes.len() + 1, "client sends");
    assert!(
        sent.iter().all(|wc| wc.status == WcStatus::Success),
        "{sent:?}"
    );
    let got = pr.server.poll(sizes.len() + 1, "server receives");
    for (i, wc) in got.iter().enumerate() {
        assert_eq!((wc.wr_id, wc.status), (i as u64, WcStatus::Success));
        let b = &pr.server.buf()[i * 4096..];
        if i < sizes.len() {
            assert_eq!(wc.byte_len, sizes[i], "message {i}");
            for (k, &x) in b[..sizes[i] as usize].iter().enumerate() {
                assert_eq!(
                    x,
                    (k as u8).wrapping_mul(31).wrapping_add(i as u8 + 1),
                    "message {i} byte {k}"
                );
            }
        } else {
            assert_eq!(wc.byte_len, 80);
            assert!(b[..40].iter().all(|&x| x == 0xa1) && b[40..80].iter().all(|&x| x == 0xb2));
        }
    }
}

#[test]
fn verbs_send_without_posted_receive_fails_with_rnr() {
    let Some(ip) = test_ip("verbs_send_without_posted_receive_fails_with_rnr") else {
        return;
    };
    let p = open(GrantMode::Auto);
    let mut pr = pair(&p, ip, 0);
    pr.client.send(7, 0, 16, None);
    let wc = pr.client.poll(1, "client send to a peer without receives");
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].opcode),
        (7, WcStatus::RnrRetryExceeded, WcOpcode::Send)
    );
    assert_eq!(pr.client.qp.state(), QpState::Error);
}

#[test]
fn verbs_rdma_write_is_visible_before_the_following_send_and_read_returns_granted_bytes() {
    let Some(ip) = test_ip(
        "verbs_rdma_write_is_visible_before_the_following_send_and_read_returns_granted_bytes",
    ) else {
        return;
    };
    for mode in [GrantMode::Auto, GrantMode::Registration] {
        let p = open(mode);
        let mut pr = pair(&p, ip, 1);
        let (s, c) = (&mut pr.server, &mut pr.client);
        // The server grants 8 KiB at offset 16 KiB for writing, signaled.
        let wsge = s.mr.sge(16384, 8192);
        let wgrant =
            s.qp.grant(900, wsge, Access::RemoteWrite, true)
                .expect("grant write");
        let b = s.poll(1, "bind");
        assert_eq!(
            (b[0].wr_id, b[0].status, b[0].opcode),
            (900, WcStatus::Success, WcOpcode::Bind)
        );
        // The client writes (unsignaled) then sends (signaled) on one chain.
        c.buf()[..8192]
            .iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = (i % 251) as u8);
        let data = [c.mr.sge(0, 8192)];
        let msg = [c.mr.sge(8192, 32)];
        let chain = [
            SendWr {
                wr_id: 1,
                op: SendOp::RdmaWrite {
                    sges: &data,
                    remote: RemoteBuf {
                        addr: wgrant.addr,
                        rkey: wgrant.rkey,
                    },
                },
                signaled: false,
            },
            SendWr {
                wr_id: 2,
                op: SendOp::Send {
                    sges: &msg,
                    invalidate: None,
                },
                signaled: true,
            },
        ];
        c.qp.post_send(&chain).expect("write + send");
        assert_eq!(c.poll(1, "client")[0].status, WcStatus::Success);
        let r = s.poll(1, "server recv");
        assert_eq!(r[0].status, WcStatus::Success);
        // [MS-SMBD] 1.5: the written data is in place when the Send arrives.
        assert!(
            s.buf()[16384..16384 + 8192]
                .iter()
                .enumerate()
                .all(|(i, &x)| x == (i % 251) as u8),
            "{mode:?}"
        );
        s.qp.revoke(901, wgrant.rkey, true)
            .expect("revoke write grant");
        assert_eq!(s.poll(1, "revoke")[0].opcode, WcOpcode::Revoke);

        // The server grants 4 KiB for reading; the client reads them.
        s.buf()[32768..32768 + 4096].fill(0xa5);
        let rgrant =
            s.qp.grant(902, s.mr.sge(32768, 4096), Access::RemoteRead, true)
                .expect("grant read");
        s.poll(1, "bind");
        let dst = [c.mr.sge(40960, 4096)];
        let rd = SendWr {
            wr_id: 3,
            op: SendOp::RdmaRead {
                sges: &dst,
                remote: RemoteBuf {
                    addr: rgrant.addr,
                    rkey: rgrant.rkey,
                },
            },
            signaled: true,
        };
        c.qp.post_send(&[rd]).expect("read");
        let wc = c.poll(1, "client read");
        assert_eq!(
            (wc[0].wr_id, wc[0].status, wc[0].opcode, wc[0].byte_len),
            (3, WcStatus::Success, WcOpcode::RdmaRead, 4096)
        );
        assert!(
            c.buf()[40960..40960 + 4096].iter().all(|&x| x == 0xa5),
            "{mode:?}"
        );
        s.qp.revoke(903, rgrant.rkey, false)
            .expect("revoke read grant");
        say(&format!(
            "verbs: write-before-send and read through {:?} grants ok",
            p.grant_mechanism()
        ));
    }
}

/// Connects, lets the server grant `access` on 4 KiB (then revoke it if
/// `revoke`), and has the client RDMA Write through `rkey(grant)`; returns the
/// client's completion.
fn write_through(
    p: &VerbsProvider,
    ip: IpAddr,
    access: Access,
    revoke: bool,
    rkey: impl Fn(u32) -> u32,
) -> Completion {
    let mut pr = pair(p, ip, 0);
    // Signaled and awaited: the token travels out of band here, not in a
    // Send ordered after the bind.
    let g = pr
        .server
        .qp
        .grant(1, pr.server.mr.sge(0, 4096), access, true)
        .expect("grant");
    pr.server.poll(1, "bind");
    if revoke {
        pr.server.qp.revoke(2, g.rkey, true).expect("revoke");
        pr.server.poll(1, "revoke");
    }
    let src = [pr.client.mr.sge(0, 64)];
    let wr = SendWr {
        wr_id: 77,
        op: SendOp::RdmaWrite {
            sges: &src,
            remote: RemoteBuf {
                addr: g.addr,
                rkey: rkey(g.rkey),
            },
        },
        signaled: true,
    };
    pr.client.qp.post_send(&[wr]).expect("post write");
    let wc = pr.client.poll(1, "client write")[0];
    assert_eq!(pr.client.qp.state(), QpState::Error);
    wc
}

#[test]
fn verbs_bad_wrong_direction_and_revoked_tokens_are_remote_access_errors() {
    let Some(ip) = test_ip("verbs_bad_wrong_direction_and_revoked_tokens_are_remote_access_errors")
    else {
        return;
    };
    let p = open(GrantMode::Auto);
    // (what, grant direction, revoke first, token used for the grant's rkey)
    type Case = (&'static str, Access, bool, fn(u32) -> u32);
    let cases: [Case; 3] = [
        ("bad token", Access::RemoteWrite, false, |k| k ^ 0x5a5a_5a00),
        ("read-only grant written", Access::RemoteRead, false, |k| k),
        ("revoked token", Access::RemoteWrite, true, |k| k),
    ];
    for (what, access, revoke, rkey) in cases {
        let wc = write_through(&p, ip, access, revoke, rkey);
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode),
            (77, WcStatus::RemoteAccessError, WcOpcode::RdmaWrite),
            "{what}"
        );
    }
}

#[test]
fn verbs_window_grant_is_usable_through_its_queue_pair_only() {
    let Some((ip, p)) = window_provider(
        "verbs_window_grant_is_usable_through_its_queue_pair_only",
        "device has no type-2 memory windows",
    ) else {
        return;
    };
    let mut a = pair(&p, ip, 0);
    let mut b = pair(&p, ip, 0);
    let g = a
        .server
        .qp
        .grant(1, a.server.mr.sge(0, 4096), Access::RemoteWrite, true)
        .expect("grant");
    a.server.poll(1, "bind");
    // The same provider registered both servers' regions in one protection
    // domain: only the window's queue-pair binding keeps b out.
    let src = [b.client.mr.sge(0, 64)];
    let wr = SendWr {
        wr_id: 5,
        op: SendOp::RdmaWrite {
            sges: &src,
            remote: RemoteBuf {
                addr: g.addr,
                rkey: g.rkey,
            },
        },
        signaled: true,
    };
    b.client.qp.post_send(&[wr]).expect("post write");
    assert_eq!(
        b.client.poll(1, "write through the other QP")[0].status,
        WcStatus::RemoteAccessError
    );
    // Through its own queue pair it works.
    let src = [a.client.mr.sge(0, 64)];
    let wr = SendWr {
        wr_id: 6,
        op: SendOp::RdmaWrite {
            sges: &src,
            remote: RemoteBuf {
                addr: g.addr,
                rkey: g.rkey,
            },
        },
        signaled: true,
    };
    a.client.qp.post_send(&[wr]).expect("post write");
    assert_eq!(
        a.client.poll(1, "write through the granted QP")[0].status,
        WcStatus::Success
    );
}

#[test]
fn verbs_regranting_a_range_reuses_its_window_backing_and_keeps_its_bounds() {
    let Some((ip, p)) = window_provider(
        "verbs_regranting_a_range_reuses_its_window_backing_and_keeps_its_bounds",
        "no memory windows",
    ) else {
        return;
    };
    let mut pr = pair(&p, ip, 0);
    // As an SMB client does with its I/O buffers: grant the same 4 KiB,
    // revoke it, again and again (and a second range in between).
    let mut wr_id = 1;
    let mut cycle = |s: &mut End, off: u64| {
        let g =
            s.qp.grant(wr_id, s.mr.sge(off, 4096), Access::RemoteWrite, true)
                .expect("grant");
        s.poll(1, "bind");
        s.qp.revoke(wr_id + 1, g.rkey, true).expect("revoke");
        s.poll(1, "revoke");
        wr_id += 2;
    };
    for i in 0..20 {
        cycle(&mut pr.server, 0);
        if i % 5 == 0 {
            cycle(&mut pr.server, 8192);
        }
    }
    let made = pr.server.qp.backing_registrations();
    // rxe: one registration per distinct range (two), not one per grant
    // (24); a device that checks windows itself needs none.
    assert!(
        made <= 2,
        "{made} backing registrations for 2 distinct ranges"
    );
    say(&format!(
        "verbs_regranting_a_range_reuses_its_window_backing_and_keeps_its_bounds: {made} backing registration(s) for 24 grants of 2 ranges"
    ));
    // The reused backing still bounds the window: inside the grant a write
    // lands, across its end it is a remote access error.
    let g = pr
        .server
        .qp
        .grant(900, pr.server.mr.sge(0, 4096), Access::RemoteWrite, true)
        .expect("grant");
    pr.server.poll(1, "bind");
    assert!(pr.server.qp.backing_registrations() <= 2);
    pr.client.buf()[..64].fill(0x5e);
    let src = [pr.client.mr.sge(0, 64)];
    for (wr_id, offset, want) in [
        (78, 4096 - 64, WcStatus::Success),
        (79, 4096 - 32, WcStatus::RemoteAccessError),
    ] {
        let wr = SendWr {
            wr_id,
            op: SendOp::RdmaWrite {
                sges: &src,
                remote: RemoteBuf {
                    addr: g.addr + offset,
                    rkey: g.rkey,
                },
            },
            signaled: true,
        };
        pr.client.qp.post_send(&[wr]).expect("post write");
        let wc = pr.client.poll(1, "client write")[0];
        assert_eq!((wc.wr_id, wc.status), (wr_id, want), "write at +{offset}");
    }
    assert!(pr.server.buf()[4096 - 64..4096].iter().all(|&x| x == 0x5e));
    assert!(pr.server.buf()[4096..4096 + 64].iter().all(|&x| x == 0));
}

#[test]
fn verbs_send_with_invalidate_revokes_the_receivers_grant() {
    let Some((ip, p)) = window_provider(
        "verbs_send_with_invalidate_revokes_the_receivers_grant",
        "per-I/O registrations cannot be remotely invalidated",
    ) else {
        return;
    };
    let mut pr = pair(&p, ip, 0);
    let (s, c) = (&mut pr.server, &mut pr.client);
    // The client grants (as an SMB client does for a READ) and waits for a
    // message; the server writes, then sends with invalidate.
    let g =
        c.qp.grant(10, c.mr.sge(0, 4096), Access::RemoteWrite, true)
            .expect("grant");
    c.poll(1, "bind");
    c.recv(11, 8192, 256);
    s.buf()[..4096].fill(0x3c);
    let data = [s.mr.sge(0, 4096)];
    let msg = [s.mr.sge(4096, 24)];
    let chain = [
        SendWr {
            wr_id: 20,
            op: SendOp::RdmaWrite {
                sges: &data,
                remote: RemoteBuf {
                    addr: g.addr,
                    rkey: g.rkey,
                },
            },
            signaled: false,
        },
        SendWr {
            wr_id: 21,
            op: SendOp::Send {
                sges: &msg,
                invalidate: Some(g.rkey),
            },
            signaled: true,
        },
    ];
    s.qp.post_send(&chain)
        .expect("write + send with invalidate");
    assert_eq!(s.poll(1, "server")[0].status, WcStatus::Success);
    let r = c.poll(1, "client recv")[0];
    assert_eq!(
        (r.wr_id, r.status, r.invalidated_rkey),
        (11, WcStatus::Success, Some(g.rkey))
    );
    assert!(c.buf()[..4096].iter().all(|&x| x == 0x3c));
    // The upper layer deregisters anyway: not an error.
    c.qp.revoke(12, g.rkey, false)
        .expect("revoke after remote invalidation");
    // The token is dead.
    let wr = SendWr {
        wr_id: 22,
        op: SendOp::RdmaWrite {
            sges: &data,
            remote: RemoteBuf {
                addr: g.addr,
                rkey: g.rkey,
            },
        },
        signaled: true,
    };
    s.qp.post_send(&[wr]).expect("post write");
    assert_eq!(
        s.poll(1, "write after invalidate")[0].status,
        WcStatus::RemoteAccessError
    );
}

#[test]
fn verbs_disconnect_flushes_both_sides() {
    let Some(ip) = test_ip("verbs_disconnect_flushes_both_sides") else {
        return;
    };
    let p = open(GrantMode::Auto);
    let mut pr = pair(&p, ip, 4);
    pr.client.recv(50, 0, 256);
    pr.client.recv(51, 256, 256);
    pr.client.qp.disconnect();
    assert_eq!(pr.client.qp.state(), QpState::Disconnected);
    let mine = pr.client.poll(2, "client flush");
    assert!(
        mine.iter()
            .all(|w| w.status == WcStatus::Flushed && w.opcode == WcOpcode::Recv),
        "{mine:?}"
    );
    assert_eq!(
        mine.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        vec![50, 51]
    );
    // The server learns through rdma_cm (DISCONNECTED) and is flushed.
    let theirs = pr.server.poll(4, "server flush");
    assert!(
        theirs
            .iter()
            .all(|w| w.status == WcStatus::Flushed && w.opcode == WcOpcode::Recv),
        "{theirs:?}"
    );
    assert_eq!(pr.server.qp.state(), QpState::Error);
    assert!(pr
        .server
        .qp
        .post_recv(&[RecvWr {
            wr_id: 9,
            sge: pr.server.mr.sge(0, 64)
        }])
        .is_err());
}

#[test]
fn verbs_rejected_connection_reports_the_rejection() {
    let Some(ip) = test_ip("verbs_rejected_connection_reports_the_rejection") else {
        return;
    };
    let p = open(GrantMode::Auto);
    let mut listener = p.listen(SocketAddr::new(ip, 0)).expect("listen");
    let addr = listener.local_addr();
    let cq = p.create_cq(1024).expect("cq");
    let handle = cq.handle();
    let pc = p.clone();
    let (tx, rx) = mpsc::channel();
    let client = std::thread::spawn(move || {
        let r = pc.connect(addr, &handle, QpCaps::default(), &[], TIMEOUT);
        tx.send(r.err().map(|e| e.to_string())).ok();
    });
    let req = listener
        .accept_request(TIMEOUT)
        .expect("accept_request")
        .expect("request");
    req.reject();
    client.join().expect("client thread");
    let err = rx.recv().expect("result").expect("connect must fail");
    assert!(err.contains("rejected"), "{err}");
}
