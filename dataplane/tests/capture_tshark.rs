//! `--capture`: a short SMB Direct session on two connections is captured,
//! decoded with `tshark -T fields`, and every decoded negotiate and
//! data-transfer field (and the RoCEv2 framing under it) is compared with
//! what was recorded. Skipped, with a message, when tshark is not installed
//! (`.ci/run` installs it through `scripts/install-deps.sh`).

use smbdirect_dataplane::capture::{
    CaptureConfig, CaptureConn, CaptureHandle, CaptureOp, Direction, MAX_HEADERS_LEN,
    MAX_TRAILER_LEN,
};
use smbdirect_protocol::ntstatus::NtStatus;
use smbdirect_protocol::smbd::wire::{
    DataTransfer, DataTransferRepr, NegotiateRequest, NegotiateRequestRepr, NegotiateResponse,
    NegotiateResponseRepr, SMB_DIRECT_RESPONSE_REQUESTED,
};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Every field the test reads, in `-e` order.
const FIELDS: &[&str] = &[
    "frame.number",
    "frame.time_epoch",
    "frame.len",
    "frame.cap_len",
    "frame.protocols",
    "ip.src",
    "ip.dst",
    "ip.checksum.status",
    "udp.srcport",
    "udp.dstport",
    "infiniband.bth.opcode",
    "infiniband.bth.padcnt",
    "infiniband.bth.p_key",
    "infiniband.bth.destqp",
    "infiniband.bth.psn",
    "infiniband.ieth",
    "infiniband.invariant.crc",
    "_ws.col.Info",
    "smb_direct.version.min",
    "smb_direct.version.max",
    "smb_direct.version.negotiated",
    "smb_direct.credits.requested",
    "smb_direct.credits.granted",
    "smb_direct.status",
    "smb_direct.max_read_write_size",
    "smb_direct.preferred_send_size",
    "smb_direct.max_receive_size",
    "smb_direct.max_fragmented_size",
    "smb_direct.flags",
    "smb_direct.flags.response_requested",
    "smb_direct.remaining_length",
    "smb_direct.data_offset",
    "smb_direct.data_length",
    "smb_direct.reassembled_in",
    "smb_direct.reassembled.length",
    "smb_direct.fragment.count",
    "data.data",
    "_ws.malformed",
];

/// Snap length of the test capture: the last message is longer.
const SNAP: usize = 1024;

#[derive(Debug, Clone)]
enum Msg {
    NegReq(NegotiateRequestRepr),
    NegRsp(NegotiateResponseRepr),
    Data(DataTransferRepr),
}

#[derive(Debug)]
struct Rec {
    conn: usize,
    dir: Direction,
    op: CaptureOp,
    msg: Msg,
    bytes: Vec<u8>,
    ts: Duration,
    psn: u32,
    /// The upper-layer payload tshark hands to its data dissector in this
    /// frame (a whole message, or the reassembly of the last fragment).
    delivered: Option<Vec<u8>>,
    /// (reassembled length, fragment count) shown in the last fragment.
    reassembled: Option<(usize, usize)>,
    /// Index (in the session) of the frame that completes this fragment.
    reassembled_in: Option<usize>,
}

/// Deterministic filler that no heuristic dissector claims (first byte 0x5A
/// is neither SMB's 0xFF nor SMB2's 0xFE/0xFD/0xFC).
fn payload(seed: u32, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..len)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            if i == 0 {
                0x5A
            } else {
                x as u8
            }
        })
        .collect()
}

fn data_message(cr: u16, cg: u16, flags: u16, remaining: u32, body: &[u8]) -> (Msg, Vec<u8>) {
    let repr = DataTransferRepr {
        credits_requested: cr,
        credits_granted: cg,
        flags,
        ..DataTransferRepr::with_payload(body.len() as u32, remaining)
    };
    let mut buf = vec![0xEE; repr.buffer_len()];
    assert_eq!(repr.emit(&mut buf, body), buf.len());
    // What the receiver's codec makes of it.
    let parsed = DataTransferRepr::parse(&DataTransfer::new_checked(&buf[..]).unwrap()).unwrap();
    assert_eq!(parsed, repr);
    (Msg::Data(repr), buf)
}

struct Session {
    conns: Vec<CaptureConn>,
    recs: Vec<Rec>,
    psn: HashMap<(usize, bool), u32>,
    t: Duration,
}

impl Session {
    fn add(
        &mut self,
        conn: usize,
        dir: Direction,
        op: CaptureOp,
        (msg, bytes): (Msg, Vec<u8>),
    ) -> usize {
        let key = (conn, dir == Direction::Sent);
        let psn = *self.psn.entry(key).or_insert(0);
        self.psn.insert(key, psn + 1);
        self.t += Duration::from_micros(137);
        let delivered = match &msg {
            Msg::Data(r) if r.data_length > 0 && r.remaining_data_length == 0 => {
                Some(bytes[r.data_offset as usize..].to_vec())
            }
            _ => None,
        };
        self.recs.push(Rec {
            conn,
            dir,
            op,
            msg,
            bytes,
            ts: self.t,
            psn,
            delivered,
            reassembled: None,
            reassembled_in: None,
        });
        self.recs.len() - 1
    }

    /// Marks `frags` (session indices, in order) as one fragmented message.
    fn fragmented(&mut self, frags: &[usize]) {
        let last = *frags.last().unwrap();
        let mut whole = Vec::new();
        for &i in frags {
            let Msg::Data(r) = &self.recs[i].msg else {
                panic!("not a data message")
            };
            whole.extend_from_slice(&self.recs[i].bytes[r.data_offset as usize..]);
            if i != last {
                self.recs[i].reassembled_in = Some(last);
            }
        }
        self.recs[last].reassembled = Some((whole.len(), frags.len()));
        self.recs[last].delivered = Some(whole);
    }
}

fn negotiate_request(credits: u16, send: u32, recv: u32, frag: u32) -> (Msg, Vec<u8>) {
    let r = NegotiateRequestRepr {
        min_version: 0x0100,
        max_version: 0x0100,
        credits_requested: credits,
        preferred_send_size: send,
        max_receive_size: recv,
        max_fragmented_size: frag,
    };
    let b = r.to_bytes().to_vec();
    assert_eq!(
        NegotiateRequestRepr::parse(&NegotiateRequest::new_checked(&b[..]).unwrap()),
        r
    );
    (Msg::NegReq(r), b)
}

fn negotiate_response(
    requested: u16,
    granted: u16,
    rw: u32,
    send: u32,
    recv: u32,
    frag: u32,
) -> (Msg, Vec<u8>) {
    let r = NegotiateResponseRepr {
        min_version: 0x0100,
        max_version: 0x0100,
        negotiated_version: 0x0100,
        credits_requested: requested,
        credits_granted: granted,
        status: NtStatus(0),
        max_read_write_size: rw,
        preferred_send_size: send,
        max_receive_size: recv,
        max_fragmented_size: frag,
    };
    let b = r.to_bytes().to_vec();
    assert_eq!(
        NegotiateResponseRepr::parse(&NegotiateResponse::new_checked(&b[..]).unwrap()),
        r
    );
    (Msg::NegRsp(r), b)
}

/// The short session: two connections (an IPv4 and an IPv6 peer) negotiate,
/// exchange whole messages, two interleaved fragmented messages in the same
/// direction, credit-only messages, a send with invalidate and one message
/// longer than the snap length.
fn session() -> Session {
    let mut s = Session {
        conns: vec![
            CaptureConn::new("192.0.2.10:50001".parse().unwrap(), 0x00_0101, 0x00_0A0B),
            CaptureConn::new("[2001:db8::5]:445".parse().unwrap(), 0x00_0202, 0xFF_FFFE),
        ],
        recs: Vec::new(),
        psn: HashMap::new(),
        t: Duration::new(1_700_000_000, 0),
    };
    use CaptureOp::{Send, SendWithInvalidate};
    use Direction::{Received as Rx, Sent as Tx};
    const RR: u16 = SMB_DIRECT_RESPONSE_REQUESTED;

    s.add(0, Rx, Send, negotiate_request(255, 1364, 8192, 1_048_576));
    s.add(1, Rx, Send, negotiate_request(16, 8136, 1364, 131_072));
    s.add(
        0,
        Tx,
        Send,
        negotiate_response(255, 255, 1_048_576, 1364, 8192, 1_048_576),
    );
    s.add(
        1,
        Tx,
        Send,
        negotiate_response(64, 16, 65_536, 1364, 8192, 131_072),
    );
    // Whole messages; 13 and 37 payload bytes need BTH padding.
    s.add(0, Rx, Send, data_message(255, 0, RR, 0, &payload(1, 13)));
    s.add(1, Rx, Send, data_message(16, 0, 0, 0, &payload(2, 100)));
    s.add(0, Tx, Send, data_message(255, 254, 0, 0, &payload(3, 37)));
    // Two fragmented messages, interleaved in the same direction.
    let a1 = s.add(
        0,
        Tx,
        Send,
        data_message(255, 0, 0, 1500, &payload(4, 1000)),
    );
    let b1 = s.add(1, Tx, Send, data_message(64, 3, 0, 300, &payload(5, 800)));
    let a2 = s.add(0, Tx, Send, data_message(255, 0, 0, 500, &payload(6, 1000)));
    let b2 = s.add(1, Tx, Send, data_message(64, 0, RR, 0, &payload(7, 300)));
    let a3 = s.add(0, Tx, Send, data_message(255, 1, 0, 0, &payload(8, 500)));
    s.fragmented(&[a1, a2, a3]);
    s.fragmented(&[b1, b2]);
    // Empty (credit-only) messages, one asking for a response (keepalive).
    s.add(0, Rx, Send, data_message(255, 3, 0, 0, &[]));
    s.add(1, Rx, Send, data_message(16, 2, RR, 0, &[]));
    s.add(1, Tx, Send, data_message(64, 1, 0, 0, &[]));
    // Send with Invalidate of the RKey the peer registered for an RDMA read.
    s.add(
        1,
        Tx,
        SendWithInvalidate(0xCAFE_F00D),
        data_message(64, 5, 0, 0, &payload(9, 77)),
    );
    s.add(0, Rx, Send, data_message(255, 4, 0, 0, &payload(10, 8)));
    // Longer than the snap length: truncated in the file.
    let t = s.add(0, Rx, Send, data_message(255, 0, 0, 0, &payload(11, 2000)));
    s.recs[t].delivered = None;
    s
}

fn tshark_available() -> bool {
    Command::new("tshark")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn temp_pcap(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("smbdirectd-{name}-{}.pcap", std::process::id()))
}

/// Runs tshark with its default preferences (an empty configuration
/// directory, so a personal profile cannot help or hurt), two passes (so
/// fragments show the frame that reassembles them) and IPv4 header checksum
/// validation; returns one field map per frame.
fn decode(path: &Path) -> Vec<HashMap<&'static str, String>> {
    let home = std::env::temp_dir().join(format!("smbdirectd-tshark-home-{}", std::process::id()));
    std::fs::create_dir_all(&home).unwrap();
    let mut cmd = Command::new("tshark");
    cmd.env("HOME", &home)
        .env("XDG_CONFIG_HOME", &home)
        .arg("-n")
        .arg("-r")
        .arg(path)
        .arg("-2")
        .args(["-o", "ip.check_checksum:TRUE"])
        .args(["-T", "fields", "-E", "separator=|", "-E", "occurrence=f"]);
    for f in FIELDS {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().expect("run tshark");
    std::fs::remove_dir_all(&home).ok();
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("tshark output is UTF-8");
    text.lines()
        .map(|line| {
            let vals: Vec<&str> = line.split('|').collect();
            assert_eq!(vals.len(), FIELDS.len(), "fields of line {line:?}");
            FIELDS
                .iter()
                .copied()
                .zip(vals.into_iter().map(str::to_owned))
                .collect()
        })
        .collect()
}

/// A tshark number: decimal, or hex with 0x.
fn num(s: &str) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> String {
    s.chars().filter(|c| *c != ':').collect()
}

#[test]
fn capture_decodes_as_smb_direct_with_tshark() {
    if !tshark_available() {
        // Straight to stderr: the test harness would swallow println!.
        let _ = writeln!(
            std::io::stderr(),
            "skipped: tshark not installed (apt-get install tshark)"
        );
        return;
    }
    let s = session();
    let path = temp_pcap("capture-tshark");
    let cap = CaptureHandle::create(
        &path,
        CaptureConfig {
            snap_len: SNAP,
            slots: 64,
        },
    )
    .unwrap();
    for r in &s.recs {
        assert!(
            cap.record_at(r.ts, &s.conns[r.conn], r.dir, r.op, &r.bytes),
            "record queued"
        );
    }
    let stats = cap.finish().unwrap();
    assert_eq!(stats.records_written, s.recs.len() as u64);
    assert_eq!((stats.records_dropped, stats.records_truncated), (0, 1));
    assert_eq!(stats.bytes_written, std::fs::metadata(&path).unwrap().len());

    let frames = decode(&path);
    if std::env::var_os("SMBDIRECTD_KEEP_CAPTURE").is_some() {
        println!("capture kept: {}", path.display());
    } else {
        std::fs::remove_file(&path).ok();
    }
    assert_eq!(frames.len(), s.recs.len(), "one frame per recorded message");

    for (i, (r, f)) in s.recs.iter().zip(&frames).enumerate() {
        let ctx = format!(
            "frame {} ({:?} {:?} on conn {}): {f:?}",
            i + 1,
            r.dir,
            r.msg,
            r.conn
        );
        let get = |k: &str| f[k].as_str();
        let n = |k: &str| num(get(k));
        let conn = &s.conns[r.conn];
        let (src, dst) = conn.endpoints(r.dir);

        // Framing.
        assert_eq!(n("frame.number"), Some(i as u64 + 1), "{ctx}");
        assert_eq!(
            get("frame.time_epoch"),
            format!("{}.{:09}", r.ts.as_secs(), r.ts.subsec_nanos()),
            "{ctx}"
        );
        assert!(
            get("frame.protocols").starts_with("eth:ethertype:ip:udp:infiniband"),
            "{ctx}"
        );
        assert_eq!(get("ip.src"), src.ip.to_string(), "{ctx}");
        assert_eq!(get("ip.dst"), dst.ip.to_string(), "{ctx}");
        assert_eq!(
            n("ip.checksum.status"),
            Some(1),
            "IPv4 checksum good: {ctx}"
        );
        assert_eq!(n("udp.srcport"), Some(u64::from(src.udp_port)), "{ctx}");
        assert_eq!(n("udp.dstport"), Some(4791), "{ctx}");
        let (opcode, ieth) = match r.op {
            CaptureOp::Send => (4, None),
            CaptureOp::SendWithInvalidate(k) => (0x17, Some(k)),
        };
        assert_eq!(n("infiniband.bth.opcode"), Some(opcode), "{ctx}");
        assert_eq!(n("infiniband.bth.p_key"), Some(0xFFFF), "{ctx}");
        assert_eq!(
            n("infiniband.bth.destqp"),
            Some(u64::from(dst.qpn)),
            "{ctx}"
        );
        assert_eq!(n("infiniband.bth.psn"), Some(u64::from(r.psn)), "{ctx}");
        assert_eq!(
            ieth.map(|k| format!("{k:08x}")),
            Some(unhex(get("infiniband.ieth"))).filter(|s| !s.is_empty()),
            "{ctx}"
        );
        let headers = 14 + 20 + 8 + 12 + if ieth.is_some() { 4 } else { 0 };
        let frame_len = headers + r.bytes.len().div_ceil(4) * 4 + 4;
        assert_eq!(n("frame.len"), Some(frame_len as u64), "{ctx}");
        // A truncated message's frame ends after the kept bytes (padded,
        // with an ICRC); the record's original length is the whole frame's.
        let kept = r.bytes.len().min(SNAP);
        let cap_len = headers + kept.div_ceil(4) * 4 + 4;
        assert_eq!(n("frame.cap_len"), Some(cap_len as u64), "{ctx}");
        assert!(cap_len <= MAX_HEADERS_LEN + SNAP + MAX_TRAILER_LEN, "{ctx}");
        assert_eq!(
            n("infiniband.bth.padcnt"),
            Some(((4 - kept % 4) % 4) as u64),
            "{ctx}"
        );
        assert!(n("infiniband.invariant.crc").is_some(), "{ctx}");
        assert_eq!(get("_ws.malformed"), "", "{ctx}");

        // SMB Direct.
        let info = get("_ws.col.Info");
        let expect_str = |k: &str, v: u64| assert_eq!(n(k), Some(v), "{k}: {ctx}");
        match &r.msg {
            Msg::NegReq(q) => {
                assert!(info.contains("NegotiateRequest"), "{ctx}");
                expect_str("smb_direct.version.min", q.min_version.into());
                expect_str("smb_direct.version.max", q.max_version.into());
                expect_str("smb_direct.credits.requested", q.credits_requested.into());
                expect_str(
                    "smb_direct.preferred_send_size",
                    q.preferred_send_size.into(),
                );
                expect_str("smb_direct.max_receive_size", q.max_receive_size.into());
                expect_str(
                    "smb_direct.max_fragmented_size",
                    q.max_fragmented_size.into(),
                );
                assert_eq!(get("smb_direct.version.negotiated"), "", "{ctx}");
                assert_eq!(get("smb_direct.credits.granted"), "", "{ctx}");
            }
            Msg::NegRsp(p) => {
                assert!(info.contains("NegotiateResponse"), "{ctx}");
                expect_str("smb_direct.version.min", p.min_version.into());
                expect_str("smb_direct.version.max", p.max_version.into());
                expect_str("smb_direct.version.negotiated", p.negotiated_version.into());
                expect_str("smb_direct.credits.requested", p.credits_requested.into());
                expect_str("smb_direct.credits.granted", p.credits_granted.into());
                expect_str("smb_direct.status", p.status.0.into());
                expect_str(
                    "smb_direct.max_read_write_size",
                    p.max_read_write_size.into(),
                );
                expect_str(
                    "smb_direct.preferred_send_size",
                    p.preferred_send_size.into(),
                );
                expect_str("smb_direct.max_receive_size", p.max_receive_size.into());
                expect_str(
                    "smb_direct.max_fragmented_size",
                    p.max_fragmented_size.into(),
                );
            }
            Msg::Data(d) => {
                assert!(info.contains("DataMessage"), "{ctx}");
                expect_str("smb_direct.credits.requested", d.credits_requested.into());
                expect_str("smb_direct.credits.granted", d.credits_granted.into());
                expect_str("smb_direct.flags", d.flags.into());
                expect_str(
                    "smb_direct.flags.response_requested",
                    u64::from(d.flags & SMB_DIRECT_RESPONSE_REQUESTED != 0),
                );
                expect_str(
                    "smb_direct.remaining_length",
                    d.remaining_data_length.into(),
                );
                expect_str("smb_direct.data_offset", d.data_offset.into());
                expect_str("smb_direct.data_length", d.data_length.into());
                assert_eq!(get("smb_direct.version.min"), "", "{ctx}");
            }
        }
        // The upper-layer payload, whole or reassembled, reaches the data
        // dissector byte for byte.
        assert_eq!(
            get("data.data").replace(':', ""),
            r.delivered.as_deref().map(hex).unwrap_or_default(),
            "payload: {ctx}"
        );
        match r.reassembled {
            Some((len, count)) => {
                expect_str("smb_direct.reassembled.length", len as u64);
                expect_str("smb_direct.fragment.count", count as u64);
            }
            None => assert_eq!(get("smb_direct.reassembled.length"), "", "{ctx}"),
        }
        match r.reassembled_in {
            Some(j) => expect_str("smb_direct.reassembled_in", j as u64 + 1),
            None => assert_eq!(get("smb_direct.reassembled_in"), "", "{ctx}"),
        }
    }
}
