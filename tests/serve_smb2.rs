//! The `smb2` upper layer end to end: `smbdirectd serve --provider soft
//! --upper smb2` as a child process and an SMB2 client (test-only, built
//! from `smbdirect_protocol::smb2` reprs over the SMB Direct client of
//! `smbdirect_dataplane::client`) that grants the server access to its own
//! pool memory for READ/WRITE through SMB2_CHANNEL_RDMA_V1(_INVALIDATE)
//! ([MS-SMB2] 3.3.5.12, 3.3.5.13; [MS-SMBD] 3.1.4.5, 3.1.4.6).

mod common;
use common::*;

use smbdirect_dataplane::client::{buffer_descriptor, client_caps, Client};
use smbdirect_dataplane::provider::soft::SoftProvider;
use smbdirect_dataplane::provider::{Access, Grant, MemoryRegion, Provider};
use smbdirect_hugepages::{Backing, BufId, BufferPool, PoolConfig, SizeClass};
use smbdirect_protocol::ntstatus::*;
use smbdirect_protocol::smb2::*;
use smbdirect_protocol::smbd::wire::BufferDescriptorRepr;
use smbdirect_protocol::smbd::SmbdConfig;
use std::time::Duration;

fn cfg() -> SmbdConfig {
    SmbdConfig {
        receive_credit_max: 32,
        send_credit_target: 32,
        ..SmbdConfig::default()
    }
}

fn client_pool(provider: &SoftProvider) -> (BufferPool, MemoryRegion) {
    let pool = PoolConfig::new(24 << 20, 1)
        .class(SizeClass::new("receive", 8192).per_slice(64))
        .class(SizeClass::new("send", 1364).per_slice(128))
        .class(SizeClass::new("mid", 1 << 20).per_slice(2))
        .class(SizeClass::new("big", 8 << 20).per_slice(2))
        .backing(Backing::SharedMemfd)
        .build()
        .unwrap();
    // SAFETY: the pool outlives the provider's use of it (whole test).
    let mr = unsafe { provider.register_pool(&pool) }.unwrap();
    (pool, mr)
}

/// Deterministic test bytes.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A response: header, body bytes, and the token its Send with Invalidate
/// invalidated.
struct Resp {
    header: HeaderRepr,
    body: Vec<u8>,
    token: Option<u32>,
}

impl Resp {
    fn body(&self) -> ResponseBody<'_> {
        ResponseBody::parse(&self.header, &self.body).expect("response body")
    }
}

/// The test-only SMB2 client.
struct Smb2Client {
    c: Client<SoftProvider>,
    next_id: u64,
    session: u64,
    tree: u32,
}

impl Smb2Client {
    fn request(&mut self, command: Command, charge: u16) -> HeaderRepr {
        let mut h = HeaderRepr::request(command, self.next_id);
        self.next_id += u64::from(charge.max(1));
        h.credit_charge = charge;
        h.credit = 8;
        h.session_id = self.session;
        h.id = HeaderId::Sync {
            process_id: 0xFEFF,
            tree_id: self.tree,
        };
        h
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        self.c.send(bytes).expect("send");
    }

    fn recv(&mut self, timeout: Duration) -> Option<Resp> {
        self.c
            .recv_with_token(timeout, |m, token| {
                let msg = compound(m)
                    .next()
                    .expect("a message")
                    .expect("valid header");
                assert!(msg.header().is_response());
                Resp {
                    header: *msg.header(),
                    body: msg.body().to_vec(),
                    token,
                }
            })
            .ok()
    }

    fn call<B: Smb2Body + ?Sized>(&mut self, command: Command, charge: u16, body: &B) -> Resp {
        let h = self.request(command, charge);
        let mut buf = vec![0u8; HEADER_LEN + body.buffer_len()];
        let n = emit_message(&h, body, &mut buf).expect("emit");
        self.send_raw(&buf[..n]);
        let r = self.recv(Duration::from_secs(30)).expect("a response");
        assert_eq!(r.header.message_id, h.message_id);
        assert_eq!(r.header.command, command);
        assert!(r.header.credit >= 1, "credits granted");
        r
    }
}

fn ok(r: &Resp) -> ResponseBody<'_> {
    assert_eq!(r.header.status, STATUS_SUCCESS, "{:?}", r.header.command);
    r.body()
}

fn write_req<'a>(
    fid: FileId,
    offset: u64,
    data: &'a [u8],
    channel: Channel,
    remaining: u32,
    descs: &'a [BufferDescriptorRepr],
) -> WriteRequestRepr<'a> {
    WriteRequestRepr {
        offset,
        file_id: fid,
        channel,
        remaining_bytes: remaining,
        flags: WriteFlags::empty(),
        data,
        channel_info: ChannelInfo::descriptors(descs),
    }
}

fn read_req<'a>(
    fid: FileId,
    offset: u64,
    length: u32,
    channel: Channel,
    descs: &'a [BufferDescriptorRepr],
) -> ReadRequestRepr<'a> {
    ReadRequestRepr {
        padding: 0x50,
        flags: ReadFlags::empty(),
        length,
        offset,
        file_id: fid,
        minimum_count: 0,
        channel,
        remaining_bytes: 0,
        channel_info: ChannelInfo::descriptors(descs),
    }
}

fn grants(c: &mut Client<SoftProvider>, buf: BufId, sizes: &[usize], access: Access) -> Vec<Grant> {
    let mut off = 0;
    sizes
        .iter()
        .map(|&s| {
            let g = c.grant(buf, off, s, access).expect("grant");
            off += s;
            g
        })
        .collect()
}

fn descs(g: &[Grant]) -> Vec<BufferDescriptorRepr> {
    g.iter().map(buffer_descriptor).collect()
}

#[test]
fn smb2_negotiate_session_tree_create_read_write_inline_and_rdma_close() {
    let _serial = serial();
    let port = free_port();
    let d = spawn(port, &["--upper", "smb2"]);
    let provider = SoftProvider::new().unwrap();
    let (pool, mr) = client_pool(&provider);
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let c = Client::connect_with_caps(
        &provider,
        addr,
        cfg(),
        pool.claim_slice(0).unwrap(),
        mr,
        Duration::from_secs(10),
        client_caps(&cfg()),
    )
    .expect("connect");
    let mut s = Smb2Client {
        c,
        next_id: 0,
        session: 0,
        tree: 0,
    };

    // NEGOTIATE 3.1.1 with a preauth integrity context.
    let salt = [7u8; 32];
    let hashes = [HashAlgorithm::SHA_512.0];
    let ctxs = [NegotiateContext::PreauthIntegrity(
        PreauthIntegrityCapabilities {
            hash_algorithms: U16Array::new(&hashes),
            salt: &salt,
        },
    )];
    let dialects = [0x0300, 0x0302, 0x0311];
    let neg = NegotiateRequestRepr {
        security_mode: SecurityMode::SIGNING_ENABLED,
        capabilities: Capabilities::LARGE_MTU,
        client_guid: Guid::from_bytes([3; 16]),
        dialects: U16Array::new(&dialects),
        negotiate_contexts: NegotiateContextList::new(&ctxs),
    };
    let r = s.call(Command::Negotiate, 0, &neg);
    let ResponseBody::Negotiate(n) = ok(&r) else {
        panic!("negotiate response")
    };
    assert_eq!(n.dialect_revision, 0x0311);
    assert_eq!(n.max_read_size, 8_388_608);
    assert_eq!(n.max_write_size, 8_388_608);
    assert!(!n.capabilities.intersects(
        Capabilities::DFS
            | Capabilities::LEASING
            | Capabilities::MULTI_CHANNEL
            | Capabilities::ENCRYPTION
    ));
    assert!(matches!(
        n.negotiate_contexts
            .find(NegotiateContextType::PREAUTH_INTEGRITY_CAPABILITIES),
        Some(NegotiateContext::PreauthIntegrity(_))
    ));

    // SESSION_SETUP (guest: any blob).
    let ss = SessionSetupRequestRepr {
        flags: SessionSetupFlags::empty(),
        security_mode: SecurityMode::SIGNING_ENABLED,
        capabilities: Capabilities::empty(),
        channel: 0,
        previous_session_id: 0,
        security_buffer: b"NTLMSSP-anonymous",
    };
    let r = s.call(Command::SessionSetup, 1, &ss);
    let ResponseBody::SessionSetup(b) = ok(&r) else {
        panic!("session setup response")
    };
    assert!(b.session_flags.contains(SessionFlags::IS_GUEST));
    assert_ne!(r.header.session_id, 0);
    s.session = r.header.session_id;

    // TREE_CONNECT: an unknown share, then `data`.
    let tc = TreeConnectRequestRepr {
        flags: TreeConnectFlags::empty(),
        path: Utf16Str::new("\\\\127.0.0.1\\nope"),
    };
    let r = s.call(Command::TreeConnect, 1, &tc);
    assert_eq!(r.header.status, STATUS_BAD_NETWORK_NAME);
    let tc = TreeConnectRequestRepr {
        flags: TreeConnectFlags::empty(),
        path: Utf16Str::new("\\\\127.0.0.1\\data"),
    };
    let r = s.call(Command::TreeConnect, 1, &tc);
    let ResponseBody::TreeConnect(t) = ok(&r) else {
        panic!("tree connect response")
    };
    assert_eq!(t.share_type, ShareType::DISK);
    s.tree = r.header.tree_id().unwrap();
    assert_ne!(s.tree, 0);

    // CREATE the directory, then a file in it.
    let dir = CreateRequestRepr {
        security_flags: 0,
        requested_oplock_level: OplockLevel::NONE,
        impersonation_level: ImpersonationLevel::IMPERSONATION,
        smb_create_flags: 0,
        desired_access: AccessMask::GENERIC_READ,
        file_attributes: FileAttributes::DIRECTORY,
        share_access: ShareAccess::READ | ShareAccess::WRITE,
        create_disposition: CreateDisposition::OPEN_IF,
        create_options: CreateOptions::DIRECTORY_FILE,
        name: Utf16Str::new("dir"),
        create_contexts: CreateContextList::EMPTY,
    };
    let r = s.call(Command::Create, 1, &dir);
    let ResponseBody::Create(dresp) = ok(&r) else {
        panic!("create response")
    };
    assert_eq!(dresp.create_action, CreateAction::CREATED);
    assert!(dresp.file_attributes.contains(FileAttributes::DIRECTORY));
    let cr = create_req("dir\\f.bin", CreateDisposition::OVERWRITE_IF);
    let r = s.call(Command::Create, 1, &cr);
    let ResponseBody::Create(cresp) = ok(&r) else {
        panic!("create response")
    };
    assert_eq!(cresp.create_action, CreateAction::CREATED);
    let fid = cresp.file_id;
    // `..` is refused.
    let bad = CreateRequestRepr {
        name: Utf16Str::new("..\\x"),
        ..cr
    };
    assert_eq!(
        s.call(Command::Create, 1, &bad).header.status,
        STATUS_OBJECT_NAME_INVALID
    );

    // WRITE inline 1000 B, READ inline.
    let inline = pattern(1000, 1);
    let r = s.call(
        Command::Write,
        1,
        &write_req(fid, 0, &inline, Channel::None, 0, &[]),
    );
    let ResponseBody::Write(w) = ok(&r) else {
        panic!("write response")
    };
    assert_eq!(w.count, 1000);
    let r = s.call(
        Command::Read,
        1,
        &read_req(fid, 0, 1000, Channel::None, &[]),
    );
    let ResponseBody::Read(rd) = ok(&r) else {
        panic!("read response")
    };
    assert_eq!(rd.data, &inline[..]);

    // WRITE via RDMA_V1, 64 KiB through 1 and then 2 descriptors.
    let len = 65_536usize;
    let src = s.c.alloc_buffer(1 << 20).unwrap();
    let dst = s.c.alloc_buffer(1 << 20).unwrap();
    let data1 = pattern(len, 2);
    let data2 = pattern(len, 3);
    for (i, (data, sizes)) in [(&data1, vec![len]), (&data2, vec![20_000, len - 20_000])]
        .into_iter()
        .enumerate()
    {
        assert!(s.c.write_buffer(src, 0, data));
        let g = grants(&mut s.c, src, &sizes, Access::RemoteRead);
        let ds = descs(&g);
        let off = 4096 + (i as u64) * len as u64;
        let r = s.call(
            Command::Write,
            1,
            &write_req(fid, off, &[], Channel::RdmaV1, len as u32, &ds),
        );
        let ResponseBody::Write(w) = ok(&r) else {
            panic!("write response")
        };
        assert_eq!(w.count as usize, len);
        assert_eq!(r.token, None);
        for g in &g {
            s.c.revoke(g.rkey).unwrap();
        }
    }

    // READ both back via RDMA_V1_INVALIDATE: the reply invalidates the
    // first descriptor's token.
    let total = 2 * len;
    assert!(s.c.write_buffer(dst, 0, &vec![0x5a; total]));
    let g = grants(
        &mut s.c,
        dst,
        &[50_000, total - 50_000],
        Access::RemoteWrite,
    );
    let ds = descs(&g);
    let r = s.call(
        Command::Read,
        HeaderRepr::credit_charge_for(total as u64),
        &read_req(fid, 4096, total as u32, Channel::RdmaV1Invalidate, &ds),
    );
    let ResponseBody::Read(rd) = ok(&r) else {
        panic!("read response")
    };
    assert_eq!(rd.data.len(), 0);
    assert_eq!(rd.data_remaining as usize, total);
    assert_eq!(r.token, Some(g[0].rkey));
    let mut back = vec![0u8; total];
    assert!(s.c.read_buffer(dst, 0, &mut back));
    assert!(back[..len] == data1[..], "first RDMA write differs");
    assert!(back[len..] == data2[..], "second RDMA write differs");
    for g in &g[1..] {
        s.c.revoke(g.rkey).unwrap();
    }

    // A large READ that does not pay its CreditCharge is refused.
    let r = s.call(
        Command::Read,
        1,
        &read_req(fid, 0, 200_000, Channel::None, &[]),
    );
    assert_eq!(r.header.status, STATUS_INVALID_PARAMETER);

    // A malformed descriptor list (a zero-length descriptor) fails the
    // request; the connection goes on.
    let g = grants(&mut s.c, dst, &[4096], Access::RemoteWrite);
    let mut ds = descs(&g);
    ds.push(BufferDescriptorRepr {
        offset: ds[0].offset + 4096,
        token: ds[0].token,
        length: 0,
    });
    let r = s.call(
        Command::Read,
        1,
        &read_req(fid, 0, 4096, Channel::RdmaV1, &ds),
    );
    assert_eq!(r.header.status, STATUS_INVALID_PARAMETER);
    let r = s.call(
        Command::Read,
        1,
        &read_req(fid, 0, 1000, Channel::None, &[]),
    );
    let ResponseBody::Read(rd) = ok(&r) else {
        panic!("read response")
    };
    assert_eq!(rd.data, &inline[..]);
    s.c.revoke(g[0].rkey).unwrap();

    // FLUSH, ECHO, IOCTL (QoS: not yet).
    assert!(matches!(
        ok(&s.call(Command::Flush, 1, &FlushRequestRepr { file_id: fid })),
        ResponseBody::Flush(_)
    ));
    assert!(matches!(
        ok(&s.call(Command::Echo, 1, &EchoRequestRepr)),
        ResponseBody::Echo(_)
    ));

    // A defined command this server does not implement: STATUS_NOT_SUPPORTED
    // (CHANGE_NOTIFY, [MS-SMB2] 3.3.5.19 lets a server refuse it); a
    // malformed body of a defined command: STATUS_INVALID_PARAMETER.
    let cn = ChangeNotifyRequestRepr {
        flags: ChangeNotifyFlags::empty(),
        output_buffer_length: 4096,
        file_id: fid,
        completion_filter: CompletionFilter::from_bits(0x1),
    };
    let r = s.call(Command::ChangeNotify, 1, &cn);
    assert_eq!(r.header.status, STATUS_NOT_SUPPORTED);
    let r = s.call(Command::QueryInfo, 1, &ErrorResponseRepr::EMPTY);
    assert_eq!(r.header.status, STATUS_INVALID_PARAMETER);

    // CLOSE, then the handle is gone.
    let r = s.call(
        Command::Close,
        1,
        &CloseRequestRepr {
            flags: CloseFlags::empty(),
            file_id: fid,
        },
    );
    assert!(matches!(ok(&r), ResponseBody::Close(_)));
    let r = s.call(Command::Read, 1, &read_req(fid, 0, 10, Channel::None, &[]));
    assert_eq!(r.header.status, STATUS_FILE_CLOSED);

    // A related compound: CREATE, then WRITE, READ and CLOSE inheriting
    // the FileId ([MS-SMB2] 3.3.5.2.7.2); one compounded response.
    let cr2 = CreateRequestRepr {
        name: Utf16Str::new("g.bin"),
        ..cr
    };
    let payload = pattern(300, 9);
    let mut buf = vec![0u8; 4096];
    let mut w = CompoundWriter::new(&mut buf);
    let h = s.request(Command::Create, 1);
    w.push(&h, &cr2).unwrap();
    let related = |mut h: HeaderRepr| {
        h.flags |= HeaderFlags::RELATED_OPERATIONS;
        h
    };
    let h = related(s.request(Command::Write, 1));
    w.push(
        &h,
        &write_req(FileId::ANY, 0, &payload, Channel::None, 0, &[]),
    )
    .unwrap();
    let h = related(s.request(Command::Read, 1));
    w.push(&h, &read_req(FileId::ANY, 0, 300, Channel::None, &[]))
        .unwrap();
    let h = related(s.request(Command::Close, 1));
    w.push(
        &h,
        &CloseRequestRepr {
            flags: CloseFlags::empty(),
            file_id: FileId::ANY,
        },
    )
    .unwrap();
    let n = w.finish();
    s.send_raw(&buf[..n]);
    let (statuses, read_back) =
        s.c.recv_with(Duration::from_secs(30), |m| {
            let mut st = Vec::new();
            let mut data = Vec::new();
            for msg in compound(m) {
                let msg = msg.expect("compound response");
                st.push((msg.header().command, msg.header().status));
                if let Ok(ResponseBody::Read(r)) = msg.response_body() {
                    data = r.data.to_vec();
                }
            }
            (st, data)
        })
        .expect("compound response");
    assert_eq!(
        statuses,
        [
            (Command::Create, STATUS_SUCCESS),
            (Command::Write, STATUS_SUCCESS),
            (Command::Read, STATUS_SUCCESS),
            (Command::Close, STATUS_SUCCESS)
        ]
    );
    assert_eq!(read_back, payload);

    // A Command code [MS-SMB2] 2.2.1 does not define: the server
    // disconnects without a response (Smb2Error::server_action, 3.3.5.2).
    let h = s.request(Command::Echo, 1);
    let mut buf = vec![0u8; HEADER_LEN + 4];
    let n = emit_message(&h, &EchoRequestRepr, &mut buf).unwrap();
    Header::new_unchecked(&mut buf[..]).set_command(0x0099);
    s.send_raw(&buf[..n]);
    assert!(s.recv(Duration::from_millis(500)).is_none(), "no response");
    // The connection is terminated and counted as a peer protocol error.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let doc = stats_json(&d);
        if field(&doc, "protocol_errors") == 1 && field(&doc, "connections") == 0 {
            assert_eq!(field(&doc, "rdma_errors"), 0, "{doc}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not disconnected: {doc}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = s.c.close(Duration::from_secs(2));
    let (_out, err) = terminate(d);
    assert!(err.contains("upper-layer protocol violation"), "{err}");
}
