//! `serve --upper smb2 --capture FILE.pcap` of an SMB2 + Storage QoS session,
//! decoded by tshark (`-T fields`): every SMB2 and [MS-SQOS] field value
//! tshark reports equals what the client sent or received.
//!
//! The session, one connection: NEGOTIATE (3.1.1), SESSION_SETUP, TREE_CONNECT,
//! CREATE, WRITE of 64 KiB through SMB2_CHANNEL_RDMA_V1 with two buffer
//! descriptors, READ of it back through RDMA_V1 with one, IOCTL
//! FSCTL_STORAGE_QOS_CONTROL with SET_LOGICAL_FLOW_ID | SET_POLICY (dialect
//! 1.1, a limit, initiator name and node name) and with GET_STATUS, CLOSE.
//! The daemon finishes the capture file when SIGTERM stops it.
//!
//! What is compared, per message (found by MessageId and the response flag):
//! the command, MessageId, NT status, SessionId and TreeId; the NEGOTIATE
//! dialects, ClientGuid, and the response's ServerGuid, capabilities,
//! security mode and size limits; the tree path and share type; the CREATE
//! file name, FileId and create action; READ/WRITE file offset, lengths,
//! RemainingBytes, channel and every buffer descriptor's Offset, Token and
//! Length; the WRITE Count and READ DataRemaining; the IOCTL function code
//! (0x00090350), FSCTL flag and MaxOutputResponse; and the
//! STORAGE_QOS_CONTROL request (ProtocolVersion, Options, LogicalFlowID,
//! PolicyID, InitiatorID, Limit, Reservation, BandwidthLimit, InitiatorName,
//! InitiatorNodeName) and response (ProtocolVersion, Options, the flow
//! identity, TimeToLive, Status, MaximumIoRate, MinimumIoRate, BaseIoSize,
//! MaximumBandwidth). tshark 4.0 (Debian 12) decodes FSCTL_STORAGE_QOS_CONTROL
//! itself (`smb2.ioctl.sqos.*`), so the QoS fields are compared one by one
//! rather than as raw IOCTL buffers. The capture holds exactly these 18 SMB2
//! messages (no other SMB2 frame, none malformed, no expert item).
//!
//! The buffer descriptors' Tokens are the rkeys of memory windows the soft
//! provider picks at random, and the SMB2 client does not publish its grants;
//! so the client runs on [`Recording`], a provider that is the soft provider
//! except that it keeps each grant its queue pair makes.
//!
//! Not compared because tshark does not decode it from this capture: the
//! pairing of responses with requests (`smb2.response_to` and
//! `smb2.response_in` are empty, so FileIds show as `File: [unknown]` instead
//! of the CREATE's name). tshark 4.0's InfiniBand dissector keys an RC
//! conversation on the destination QP only (the BTH names no source QP), so
//! the two directions of one connection are two conversations to the SMB2
//! dissector.
//!
//! Skipped, saying so, where tshark is not installed
//! (`scripts/install-deps.sh` installs it). `SMBDIRECTD_KEEP_CAPTURE=1` keeps
//! the pcap file.

mod common;
use common::*;

use smbdirect_dataplane::provider::soft::SoftProvider;
use smbdirect_dataplane::provider::{
    Access, CompletionQueue, ConnRequest, Grant, Listener, MemoryRegion, Provider, ProviderError,
    QpCaps, QpId, QpState, QueuePair, RecvWr, SendWr, Sge,
};
use smbdirect_dataplane::smb2::client::{Smb2Client, Smb2ClientOptions, Transfer};
use smbdirect_hugepages::{Backing, PoolConfig, SizeClass};
use smbdirect_protocol::ntstatus::{NtStatus, STATUS_SUCCESS};
use smbdirect_protocol::smb2::{CreateDisposition, CreateOptions, Dialect, FileId};
use smbdirect_protocol::smbd::SmbdConfig;
use smbdirect_protocol::sqos::{
    Dialect as QosDialect, FlowStatus, Guid, Options, StorageQosControlRequestRepr,
    StorageQosControlResponse, StorageQosControlResponseRepr, Utf16Name, FSCTL_STORAGE_QOS_CONTROL,
};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

// ---------------------------------------------------------------------------
// A provider that records grants

/// The provider `P` in every way, except that its queue pairs keep each
/// grant they make (in order): the Offset, Token and Length of every buffer
/// descriptor the SMB2 client puts in a READ or WRITE. Client side only.
struct Recording<P: Provider> {
    inner: P,
    grants: Arc<Mutex<Vec<Grant>>>,
}

impl<P: Provider> Recording<P> {
    fn new(inner: P) -> Self {
        Recording {
            inner,
            grants: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// The grants made so far.
    fn grants(&self) -> Vec<Grant> {
        self.grants
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// A queue pair of [`Recording`].
struct RecordingQp<Q: QueuePair> {
    inner: Q,
    grants: Arc<Mutex<Vec<Grant>>>,
}

/// [`Recording`] connects only: it has no listener and no connection
/// requests.
enum NoListening {}

impl<P: Provider> ConnRequest<Recording<P>> for NoListening {
    fn private_data(&self) -> &[u8] {
        match *self {}
    }
    fn peer_addr(&self) -> SocketAddr {
        match *self {}
    }
    fn accept(
        self,
        _: &<P::Cq as CompletionQueue>::Handle,
        _: QpCaps,
        _: &[u8],
    ) -> Result<RecordingQp<P::Qp>, ProviderError> {
        match self {}
    }
    fn reject(self) {
        match self {}
    }
}

impl<P: Provider> Listener<Recording<P>> for NoListening {
    fn accept_request(&mut self, _: Duration) -> Result<Option<NoListening>, ProviderError> {
        match *self {}
    }
    fn local_addr(&self) -> SocketAddr {
        match *self {}
    }
}

impl<Q: QueuePair> QueuePair for RecordingQp<Q> {
    fn id(&self) -> QpId {
        self.inner.id()
    }
    fn state(&self) -> QpState {
        self.inner.state()
    }
    fn ird_ord(&self) -> (u32, u32) {
        self.inner.ird_ord()
    }
    fn post_recv(&mut self, wrs: &[RecvWr]) -> Result<(), ProviderError> {
        self.inner.post_recv(wrs)
    }
    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<(), ProviderError> {
        self.inner.post_send(wrs)
    }
    fn grant(
        &mut self,
        wr_id: u64,
        sge: Sge,
        access: Access,
        signaled: bool,
    ) -> Result<Grant, ProviderError> {
        let g = self.inner.grant(wr_id, sge, access, signaled)?;
        self.grants
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(g);
        Ok(g)
    }
    fn revoke(&mut self, wr_id: u64, rkey: u32, signaled: bool) -> Result<(), ProviderError> {
        self.inner.revoke(wr_id, rkey, signaled)
    }
    fn disconnect(&mut self) {
        self.inner.disconnect()
    }
    fn drain_send_queue(&mut self, wr_id: u64) -> Result<(), ProviderError> {
        self.inner.drain_send_queue(wr_id)
    }
}

impl<P: Provider> Provider for Recording<P> {
    type Cq = P::Cq;
    type Qp = RecordingQp<P::Qp>;
    type Request = NoListening;
    type Listener = NoListening;

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    unsafe fn register(
        &self,
        addr: *mut u8,
        len: usize,
        shared: Option<(std::os::fd::RawFd, u64)>,
    ) -> Result<MemoryRegion, ProviderError> {
        // SAFETY: the caller's obligations are the inner provider's.
        unsafe { self.inner.register(addr, len, shared) }
    }

    unsafe fn deregister(&self, mr: &MemoryRegion) -> Result<(), ProviderError> {
        // SAFETY: as for `register`.
        unsafe { self.inner.deregister(mr) }
    }

    fn create_cq(&self, entries: u32) -> Result<P::Cq, ProviderError> {
        self.inner.create_cq(entries)
    }

    fn listen(&self, _: SocketAddr) -> Result<NoListening, ProviderError> {
        Err(ProviderError::Unsupported(
            "listening on the grant-recording test provider",
        ))
    }

    fn connect(
        &self,
        addr: SocketAddr,
        cq: &<P::Cq as CompletionQueue>::Handle,
        caps: QpCaps,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<(RecordingQp<P::Qp>, Vec<u8>), ProviderError> {
        let (inner, accepted) = self.inner.connect(addr, cq, caps, private_data, timeout)?;
        let qp = RecordingQp {
            inner,
            grants: self.grants.clone(),
        };
        Ok((qp, accepted))
    }
}

// ---------------------------------------------------------------------------
// What tshark must show

/// Every field asked of tshark, in `-e` order.
const FIELDS: &[&str] = &[
    "frame.number",
    "ip.src",
    "ip.dst",
    "_ws.malformed",
    "_ws.expert",
    "smb2.cmd",
    "smb2.msg_id",
    "smb2.flags.response",
    "smb2.nt_status",
    "smb2.sesid",
    "smb2.tid",
    "smb2.dialect",
    "smb2.client_guid",
    "smb2.server_guid",
    "smb2.capabilities",
    "smb2.sec_mode",
    "smb2.max_trans_size",
    "smb2.max_read_size",
    "smb2.max_write_size",
    "smb2.tree",
    "smb2.share_type",
    "smb2.filename",
    "smb2.create.action",
    "smb2.fid",
    "smb2.file_offset",
    "smb2.write_length",
    "smb2.read_length",
    "smb2.remaining_bytes",
    "smb2.channel",
    "smb2.buffer_descriptor.offset",
    "smb2.buffer_descriptor.token",
    "smb2.buffer_descriptor.length",
    "smb2.write.count",
    "smb2.read_remaining",
    "smb2.ioctl.function",
    "smb2.ioctl.is_fsctl",
    "smb2.max_ioctl_out_size",
    "smb2.ioctl.sqos.protocol_version",
    "smb2.ioctl.sqos.operations",
    "smb2.ioctl.sqos.logical_flow_id",
    "smb2.ioctl.sqos.policy_id",
    "smb2.ioctl.sqos.initiator_id",
    "smb2.ioctl.sqos.limit",
    "smb2.ioctl.sqos.reservation",
    "smb2.ioctl.sqos.bandwidth_limit",
    "smb2.ioctl.sqos.initiator_name",
    "smb2.ioctl.sqos.initiator_node_name",
    "smb2.ioctl.sqos.time_to_live",
    "smb2.ioctl.sqos.status",
    "smb2.ioctl.sqos.maximum_io_rate",
    "smb2.ioctl.sqos.minimum_io_rate",
    "smb2.ioctl.sqos.base_io_size",
    "smb2.ioctl.sqos.maximum_bandwidth",
];

/// One SMB2 message of the session as the client sent or received it: the
/// tshark fields of its frame and the values they must have ("" for a field
/// the message must not have).
struct Expected {
    what: &'static str,
    msg_id: u64,
    response: bool,
    fields: Vec<(&'static str, String)>,
}

impl Expected {
    fn request(what: &'static str, msg_id: u64, cmd: u16) -> Self {
        Expected {
            what,
            msg_id,
            response: false,
            fields: vec![("smb2.cmd", cmd.to_string())],
        }
    }

    fn response(what: &'static str, msg_id: u64, cmd: u16, status: NtStatus) -> Self {
        Expected {
            what,
            msg_id,
            response: true,
            fields: vec![
                ("smb2.cmd", cmd.to_string()),
                ("smb2.nt_status", hex32(status.0)),
            ],
        }
    }

    fn with(mut self, field: &'static str, value: impl Into<String>) -> Self {
        assert!(FIELDS.contains(&field), "{field} is not asked of tshark");
        self.fields.push((field, value.into()));
        self
    }

    /// SessionId and TreeId of a request in the tree.
    fn in_tree(self, session_id: u64, tree_id: u32) -> Self {
        self.with("smb2.sesid", hex64(session_id))
            .with("smb2.tid", hex32(tree_id))
    }
}

/// tshark's forms of the values.
fn hex8(v: u8) -> String {
    format!("{v:#04x}")
}
fn hex16(v: u16) -> String {
    format!("{v:#06x}")
}
fn hex32(v: u32) -> String {
    format!("{v:#010x}")
}
fn hex64(v: u64) -> String {
    format!("{v:#018x}")
}
/// A GUID (FT_GUID, little-endian fields) without braces.
fn guid(g: Guid) -> String {
    format!("{g:#}")
}
/// tshark shows an SMB2_FILEID as a GUID of its 16 wire bytes.
fn fid(f: FileId) -> String {
    guid(Guid::from_bytes(f.to_bytes()))
}
/// Several occurrences of a field, as `-T fields` joins them.
fn list<T: ToString>(values: impl IntoIterator<Item = T>) -> String {
    values
        .into_iter()
        .map(|v| v.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

// ---------------------------------------------------------------------------
// tshark

fn tshark_available() -> bool {
    Command::new("tshark")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The SMB2 frames of `pcap` as field maps, decoded with tshark's default
/// preferences (an empty configuration directory); also tshark's text.
fn decode(pcap: &str) -> (Vec<HashMap<&'static str, String>>, String) {
    let home = std::env::temp_dir().join(format!(
        "smbdirectd-tshark-home-smb2-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&home).expect("tshark home");
    let mut cmd = Command::new("tshark");
    cmd.env("HOME", &home)
        .env("XDG_CONFIG_HOME", &home)
        .args(["-n", "-2", "-r", pcap, "-Y", "smb2"])
        .args(["-T", "fields", "-E", "separator=|", "-E", "occurrence=a"]);
    for f in FIELDS {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().expect("run tshark");
    let _ = std::fs::remove_dir_all(&home);
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("tshark output is UTF-8");
    let rows = text
        .lines()
        .map(|line| {
            let vals: Vec<&str> = line.split('|').collect();
            assert_eq!(vals.len(), FIELDS.len(), "fields of line {line:?}");
            FIELDS
                .iter()
                .copied()
                .zip(vals.into_iter().map(str::to_owned))
                .collect()
        })
        .collect();
    (rows, text)
}

// ---------------------------------------------------------------------------
// The test

#[test]
fn capture_of_smb2_qos_session_decodes_in_tshark_to_the_values_sent() {
    if !tshark_available() {
        eprintln!("SKIP: tshark not installed (scripts/install-deps.sh installs it)");
        return;
    }
    let _serial = serial();
    let port = free_port();
    let pcap = format!("/tmp/smbdirectd-capture-smb2-{port}.pcap");
    let _ = std::fs::remove_file(&pcap);
    let d = spawn(
        port,
        &["--upper", "smb2", "--store-size", "16M", "--capture", &pcap],
    );

    let provider = Recording::new(SoftProvider::new().expect("soft provider"));
    let pool = PoolConfig::new(8 << 20, 1)
        .class(SizeClass::new("send", 1364).per_slice(128))
        .class(SizeClass::new("receive", 8192).per_slice(64))
        .class(SizeClass::new("io64k", 65536).per_slice(8))
        .backing(Backing::SharedMemfd)
        .build()
        .expect("client pool");
    // SAFETY: the pool outlives the provider's use of it (whole test).
    let mr = unsafe { provider.register_pool(&pool) }.expect("register");
    let client_guid = Guid::from_fields(0x5eed_c0de, 0x0311, 0x4c41, *b"capture2");
    let options = Smb2ClientOptions {
        client_guid: Some(client_guid),
        ..Smb2ClientOptions::default()
    };
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut c = Smb2Client::connect(
        &provider,
        addr,
        SmbdConfig::default(),
        pool.claim_slice(0).expect("slice"),
        mr,
        Duration::from_secs(10),
        options,
    )
    .expect("connect");

    let mut want = Vec::new();
    // The MessageId a synchronous call is about to use; `sent` checks that
    // it used exactly that one (no ECHO for credits slipped in between).
    let next = |c: &Smb2Client<_>| c.credits().next_message_id();
    let sent = |c: &Smb2Client<_>, id: u64, what: &str| {
        assert_eq!(
            c.credits().next_message_id(),
            id + 1,
            "{what} was not the single one-credit request expected"
        );
    };

    // NEGOTIATE.
    let id = next(&c);
    let neg = c.negotiate(&[Dialect::SMB_3_1_1]).expect("negotiate");
    sent(&c, id, "NEGOTIATE");
    want.push(
        Expected::request("NEGOTIATE request", id, 0x00)
            .with("smb2.dialect", hex16(Dialect::SMB_3_1_1.0))
            .with("smb2.client_guid", guid(client_guid)),
    );
    want.push(
        Expected::response("NEGOTIATE response", id, 0x00, STATUS_SUCCESS)
            .with("smb2.dialect", hex16(neg.dialect.0))
            .with("smb2.server_guid", guid(neg.server_guid))
            .with("smb2.capabilities", hex32(neg.capabilities.0))
            // tshark shows the first byte of the 2-byte SecurityMode.
            .with(
                "smb2.sec_mode",
                hex8(u8::try_from(neg.security_mode.0).expect("SecurityMode above 0xff")),
            )
            .with("smb2.max_trans_size", neg.max_transact_size.to_string())
            .with("smb2.max_read_size", neg.max_read_size.to_string())
            .with("smb2.max_write_size", neg.max_write_size.to_string()),
    );
    assert_eq!(neg.dialect, Dialect::SMB_3_1_1);

    // SESSION_SETUP (anonymous).
    let id = next(&c);
    let session = c.session_setup_anonymous().expect("session setup");
    sent(&c, id, "SESSION_SETUP");
    let sid = session.session_id;
    want.push(Expected::request("SESSION_SETUP request", id, 0x01).with("smb2.sesid", hex64(0)));
    want.push(
        Expected::response("SESSION_SETUP response", id, 0x01, STATUS_SUCCESS)
            .with("smb2.sesid", hex64(sid)),
    );

    // TREE_CONNECT.
    let id = next(&c);
    let tree = c.tree_connect("data").expect("tree connect");
    sent(&c, id, "TREE_CONNECT");
    let tid = tree.tree_id;
    want.push(
        Expected::request("TREE_CONNECT request", id, 0x03)
            .with("smb2.sesid", hex64(sid))
            .with("smb2.tree", "\\\\127.0.0.1\\data"),
    );
    want.push(
        Expected::response("TREE_CONNECT response", id, 0x03, STATUS_SUCCESS)
            .in_tree(sid, tid)
            .with("smb2.share_type", hex8(tree.share_type.0)),
    );

    // CREATE.
    let name = "qos-capture.bin";
    let id = next(&c);
    let created = c
        .create(
            name,
            CreateDisposition::OVERWRITE_IF,
            CreateOptions::NON_DIRECTORY_FILE,
        )
        .expect("create");
    sent(&c, id, "CREATE");
    let f = created.file_id;
    want.push(
        Expected::request("CREATE request", id, 0x05)
            .in_tree(sid, tid)
            .with("smb2.filename", name),
    );
    want.push(
        Expected::response("CREATE response", id, 0x05, STATUS_SUCCESS)
            .in_tree(sid, tid)
            .with("smb2.fid", fid(f))
            .with("smb2.create.action", created.action.0.to_string()),
    );

    // WRITE 64 KiB at 12288 through RDMA_V1, two buffer descriptors.
    const LEN: u32 = 65536;
    const AT: u64 = 12288;
    let data: Vec<u8> = (0..LEN as usize)
        .map(|i| (i as u8) ^ (i >> 8) as u8)
        .collect();
    let wbuf = c.alloc_io_buf(LEN as usize).expect("write buffer");
    c.io_buf_mut(wbuf).expect("write buffer bytes")[..LEN as usize].copy_from_slice(&data);
    let before = provider.grants().len();
    let wid = c
        .submit_write(
            f,
            AT,
            LEN,
            wbuf,
            Transfer::Rdma {
                descriptors: 2,
                invalidate: false,
            },
        )
        .expect("submit WRITE");
    let wgrants = provider.grants()[before..].to_vec();
    assert_eq!(wgrants.len(), 2, "WRITE grants: {wgrants:?}");
    let done = c.wait(wid).expect("WRITE completion");
    assert_eq!(done.result.as_ref().ok(), Some(&LEN), "{:?}", done.result);
    want.push(
        Expected::request("WRITE request", wid.0, 0x09)
            .in_tree(sid, tid)
            .with("smb2.fid", fid(f))
            .with("smb2.file_offset", AT.to_string())
            // [MS-SMB2] 2.2.21: with an RDMA channel the data is not in the
            // message; RemainingBytes is its length.
            .with("smb2.write_length", "0")
            .with("smb2.remaining_bytes", LEN.to_string())
            .with("smb2.channel", hex32(1))
            .with(
                "smb2.buffer_descriptor.offset",
                list(wgrants.iter().map(|g| g.addr)),
            )
            .with(
                "smb2.buffer_descriptor.token",
                list(wgrants.iter().map(|g| hex32(g.rkey))),
            )
            .with(
                "smb2.buffer_descriptor.length",
                list(wgrants.iter().map(|g| g.len)),
            ),
    );
    want.push(
        Expected::response("WRITE response", wid.0, 0x09, STATUS_SUCCESS)
            .in_tree(sid, tid)
            .with("smb2.write.count", LEN.to_string()),
    );

    // READ it back through RDMA_V1, one buffer descriptor.
    let rbuf = c.alloc_io_buf(LEN as usize).expect("read buffer");
    let before = provider.grants().len();
    let rid = c
        .submit_read(
            f,
            AT,
            LEN,
            rbuf,
            Transfer::Rdma {
                descriptors: 1,
                invalidate: false,
            },
        )
        .expect("submit READ");
    let rgrants = provider.grants()[before..].to_vec();
    assert_eq!(rgrants.len(), 1, "READ grants: {rgrants:?}");
    let done = c.wait(rid).expect("READ completion");
    assert_eq!(done.result.as_ref().ok(), Some(&LEN), "{:?}", done.result);
    assert!(
        c.io_buf(rbuf).expect("read buffer bytes")[..LEN as usize] == data[..],
        "READ returned other bytes than the WRITE wrote"
    );
    let g = rgrants[0];
    want.push(
        Expected::request("READ request", rid.0, 0x08)
            .in_tree(sid, tid)
            .with("smb2.fid", fid(f))
            .with("smb2.file_offset", AT.to_string())
            .with("smb2.read_length", LEN.to_string())
            .with("smb2.remaining_bytes", "0")
            .with("smb2.channel", hex32(1))
            .with("smb2.buffer_descriptor.offset", g.addr.to_string())
            .with("smb2.buffer_descriptor.token", hex32(g.rkey))
            .with("smb2.buffer_descriptor.length", g.len.to_string()),
    );
    // [MS-SMB2] 3.3.5.12: the data went by RDMA; DataRemaining says how much.
    want.push(
        Expected::response("READ response", rid.0, 0x08, STATUS_SUCCESS)
            .in_tree(sid, tid)
            .with("smb2.read_remaining", LEN.to_string()),
    );

    // IOCTL FSCTL_STORAGE_QOS_CONTROL: SET_LOGICAL_FLOW_ID | SET_POLICY.
    let flow = Guid::from_fields(0x9f1e_2d3c, 0x4b5a, 0x6978, *b"qosflow1");
    let initiator = Guid::from_fields(0x0c0f_fee0, 0x1234, 0x5678, *b"vm-guid!");
    let mut set = StorageQosControlRequestRepr::new(
        QosDialect::V1_1,
        Options::from_bits(Options::SET_LOGICAL_FLOW_ID.bits() | Options::SET_POLICY.bits()),
        flow,
    );
    set.initiator_id = initiator;
    set.limit = 1500;
    set.initiator_name = Utf16Name::new("vm-capture-01").expect("initiator name");
    set.initiator_node_name = Utf16Name::new("hyperv-node-7").expect("node name");
    let id = next(&c);
    let (status, out) = c
        .ioctl(f, FSCTL_STORAGE_QOS_CONTROL, &set.to_vec(), 4096)
        .expect("SET_POLICY IOCTL");
    sent(&c, id, "IOCTL SET_POLICY");
    assert_eq!(status, STATUS_SUCCESS);
    assert!(
        out.is_empty(),
        "SET_POLICY without GET_STATUS answered {out:?}"
    );
    want.push(
        qos_request("IOCTL SET_LOGICAL_FLOW_ID|SET_POLICY request", id, &set).in_tree(sid, tid),
    );
    want.push(
        Expected::response(
            "IOCTL SET_LOGICAL_FLOW_ID|SET_POLICY response",
            id,
            0x0b,
            status,
        )
        .in_tree(sid, tid)
        .with("smb2.fid", fid(f))
        .with("smb2.ioctl.function", hex32(FSCTL_STORAGE_QOS_CONTROL))
        // No output buffer: no STORAGE_QOS_CONTROL_RESPONSE to decode.
        .with("smb2.ioctl.sqos.protocol_version", "")
        .with("smb2.ioctl.sqos.status", ""),
    );

    // IOCTL FSCTL_STORAGE_QOS_CONTROL: GET_STATUS.
    let mut get = StorageQosControlRequestRepr::new(QosDialect::V1_1, Options::GET_STATUS, flow);
    get.initiator_id = initiator;
    let id = next(&c);
    let (status, out) = c
        .ioctl(f, FSCTL_STORAGE_QOS_CONTROL, &get.to_vec(), 4096)
        .expect("GET_STATUS IOCTL");
    sent(&c, id, "IOCTL GET_STATUS");
    assert_eq!(status, STATUS_SUCCESS);
    let view = StorageQosControlResponse::new_checked(&out[..]).expect("QoS response");
    let resp = StorageQosControlResponseRepr::parse(&view).expect("QoS response");
    // What the server should have said, before comparing what tshark says it said.
    assert_eq!(resp.status, FlowStatus::Ok, "{resp:?}");
    assert_eq!(resp.maximum_io_rate, 1500, "{resp:?}");
    assert_eq!(resp.logical_flow_id, flow, "{resp:?}");
    want.push(qos_request("IOCTL GET_STATUS request", id, &get).in_tree(sid, tid));
    want.push(
        Expected::response("IOCTL GET_STATUS response", id, 0x0b, status)
            .in_tree(sid, tid)
            .with("smb2.fid", fid(f))
            .with("smb2.ioctl.function", hex32(FSCTL_STORAGE_QOS_CONTROL))
            .with(
                "smb2.ioctl.sqos.protocol_version",
                hex16(resp.dialect.to_wire()),
            )
            .with("smb2.ioctl.sqos.operations", hex32(view.options()))
            .with(
                "smb2.ioctl.sqos.logical_flow_id",
                guid(resp.logical_flow_id),
            )
            .with("smb2.ioctl.sqos.policy_id", guid(resp.policy_id))
            .with("smb2.ioctl.sqos.initiator_id", guid(resp.initiator_id))
            .with(
                "smb2.ioctl.sqos.time_to_live",
                resp.time_to_live.to_string(),
            )
            .with("smb2.ioctl.sqos.status", hex32(resp.status.to_wire()))
            .with(
                "smb2.ioctl.sqos.maximum_io_rate",
                resp.maximum_io_rate.to_string(),
            )
            .with(
                "smb2.ioctl.sqos.minimum_io_rate",
                resp.minimum_io_rate.to_string(),
            )
            .with(
                "smb2.ioctl.sqos.base_io_size",
                resp.base_io_size.to_string(),
            )
            .with(
                "smb2.ioctl.sqos.maximum_bandwidth",
                resp.maximum_bandwidth.to_string(),
            ),
    );

    // CLOSE.
    let id = next(&c);
    c.close(f).expect("close");
    sent(&c, id, "CLOSE");
    want.push(
        Expected::request("CLOSE request", id, 0x06)
            .in_tree(sid, tid)
            .with("smb2.fid", fid(f)),
    );
    want.push(Expected::response("CLOSE response", id, 0x06, STATUS_SUCCESS).in_tree(sid, tid));

    let _ = c.disconnect(Duration::from_secs(2));
    let (out, _) = terminate(d);
    assert!(
        out.contains("capture:"),
        "capture stats line missing:\n{out}"
    );

    let (rows, text) = decode(&pcap);
    assert_eq!(
        rows.len(),
        want.len(),
        "SMB2 frames in the capture, want one per request and response:\n{text}"
    );
    for row in &rows {
        let frame = &row["frame.number"];
        assert!(
            row["_ws.malformed"].is_empty() && row["_ws.expert"].is_empty(),
            "frame {frame} is malformed or has expert info:\n{text}"
        );
    }
    for w in &want {
        let flag = if w.response { "1" } else { "0" };
        let found: Vec<_> = rows
            .iter()
            .filter(|r| {
                r["smb2.msg_id"] == w.msg_id.to_string() && r["smb2.flags.response"] == flag
            })
            .collect();
        assert_eq!(
            found.len(),
            1,
            "{} (MessageId {}) in the capture:\n{text}",
            w.what,
            w.msg_id
        );
        let row = found[0];
        // Requests travel from the client's real address, responses to it.
        let client_side = if w.response { "ip.dst" } else { "ip.src" };
        assert_eq!(
            row[client_side], "127.0.0.1",
            "{} direction:\n{text}",
            w.what
        );
        for (field, value) in &w.fields {
            assert_eq!(
                &row[field], value,
                "{} (MessageId {}, frame {}): tshark's {field}",
                w.what, w.msg_id, row["frame.number"]
            );
        }
    }
    if std::env::var_os("SMBDIRECTD_KEEP_CAPTURE").is_none() {
        let _ = std::fs::remove_file(&pcap);
    } else {
        eprintln!("capture kept: {pcap}");
    }
}

/// An IOCTL FSCTL_STORAGE_QOS_CONTROL request carrying `r`, on the open the
/// caller adds.
fn qos_request(what: &'static str, msg_id: u64, r: &StorageQosControlRequestRepr<'_>) -> Expected {
    Expected::request(what, msg_id, 0x0b)
        .with("smb2.ioctl.function", hex32(FSCTL_STORAGE_QOS_CONTROL))
        .with("smb2.ioctl.is_fsctl", "1")
        .with("smb2.max_ioctl_out_size", "4096")
        .with(
            "smb2.ioctl.sqos.protocol_version",
            hex16(r.dialect.to_wire()),
        )
        .with("smb2.ioctl.sqos.operations", hex32(r.options.bits()))
        .with("smb2.ioctl.sqos.logical_flow_id", guid(r.logical_flow_id))
        .with("smb2.ioctl.sqos.policy_id", guid(r.policy_id))
        .with("smb2.ioctl.sqos.initiator_id", guid(r.initiator_id))
        .with("smb2.ioctl.sqos.limit", r.limit.to_string())
        .with("smb2.ioctl.sqos.reservation", r.reservation.to_string())
        .with(
            "smb2.ioctl.sqos.bandwidth_limit",
            r.bandwidth_limit.to_string(),
        )
        .with(
            "smb2.ioctl.sqos.initiator_name",
            r.initiator_name.to_string_lossy(),
        )
        .with(
            "smb2.ioctl.sqos.initiator_node_name",
            r.initiator_node_name.to_string_lossy(),
        )
        // A request has no status fields.
        .with("smb2.ioctl.sqos.status", "")
        .with("smb2.ioctl.sqos.time_to_live", "")
}
