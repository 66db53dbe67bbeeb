//! `--capture FILE.pcap`: every SMB Direct message sent and received, written
//! as a pcap file that Wireshark and tshark decode as SMB Direct.
//!
//! # What is in the file
//!
//! tshark's `smb_direct` dissector is a heuristic on the payload of InfiniBand
//! RC SEND packets, and Debian 12's tshark 4.0 cannot read
//! `LINKTYPE_INFINIBAND` files. So each message is framed as RoCEv2, which
//! tshark decodes with default settings:
//!
//! ```text
//! pcap LINKTYPE_ETHERNET (1), nanosecond timestamps (magic 0xa1b23c4d)
//!  Ethernet II   locally administered MACs 02:00:<IPv4 address>, type 0x0800
//!  IPv4          20 bytes, DF, TTL 64, valid header checksum, protocol UDP
//!  UDP           dst port 4791 (RoCEv2), src port ≥ 49152 or the peer's
//!                real port when > 4791, checksum 0 (allowed for RoCEv2)
//!  IB BTH        opcode 0x04 RC SEND Only, or 0x17 RC SEND Only with
//!                Invalidate; P_Key 0xFFFF; PadCnt; DestQP = the receiving
//!                side's QPN; PSN counting up per direction per connection
//!  IB IETH       4 bytes, the invalidated RKey (opcode 0x17 only)
//!  payload       the SMB Direct message exactly as sent or received
//!  pad           0-3 zero bytes to a 4-byte multiple (BTH PadCnt)
//!  ICRC          the real RoCEv2 invariant CRC (IBA Annex A17: CRC-32 over
//!                8 bytes of 0xFF, the IPv4/UDP/BTH headers with the
//!                variant fields masked to 1s, and the rest of the packet)
//! ```
//!
//! Each connection ([`CaptureConn`]) gets its own address pair, UDP source
//! ports and QP numbers, derived from the real peer address and QP numbers:
//!
//! * peer side: the peer's real IPv4 address (an IPv4-mapped IPv6 address is
//!   unmapped; any other IPv6 peer gets a stable synthetic address in
//!   100.64.0.0/10), its UDP port is the peer's real port when > 4791 (so
//!   tshark's lower-port-first rule still picks RoCEv2) and `49152 + port %
//!   16384` otherwise, and its QPN is the peer's QP number;
//! * server side: a per-connection synthetic address in 198.18.0.0/15
//!   (RFC 2544 benchmarking space, never routed) hashed from the peer address
//!   and both QP numbers, a UDP port hashed from the local QPN, and the local
//!   QP number. Log [`CaptureConn`]'s `Display` at connection set-up to map
//!   the capture back to the real connection.
//!
//! PSNs are taken when a message is recorded, also for a message dropped
//! because the capture could not keep up, so a gap in `infiniband.bth.psn`
//! shows where records are missing.
//!
//! A message longer than [`CaptureConfig::snap_len`] is truncated: its frame
//! ends after the kept prefix (padded, with the ICRC of what is there, and
//! IPv4/UDP lengths to match), so tshark still decodes its SMB Direct header
//! (a DataLength beyond the captured bytes is simply not followed), while the
//! pcap record's original length is that of the frame that would carry the
//! whole message. (A frame cut inside its payload would be no better:
//! tshark 4.0's InfiniBand dissector then refuses the payload as "Invalid
//! Packet Length" and decodes nothing of it.)
//!
//! The ICRC is computed for real; tshark 4.0 shows it (`Invariant CRC`) but
//! does not check it. It was checked against an independent implementation
//! (Scapy's RoCEv2 ICRC) and the unit tests keep that frame as a vector.
//!
//! # Reading a capture
//!
//! tshark 4.0 (Debian 12) decodes a capture with its default settings (UDP
//! port 4791 is RoCEv2 (`infiniband.rroce.port: 4791`), the `smb_direct`
//! heuristic on InfiniBand payloads (`smb_direct_infiniband`) is enabled and
//! `infiniband.try_heuristic_first` is on); `-2` (two passes) also marks each
//! fragment with the frame that reassembles it:
//!
//! ```text
//! tshark -r FILE.pcap
//! tshark -r FILE.pcap -2 -Y smb_direct -T fields -e frame.number -e ip.src -e ip.dst \
//!     -e infiniband.bth.destqp -e infiniband.bth.psn -e _ws.col.Info \
//!     -e smb_direct.credits.requested -e smb_direct.credits.granted -e smb_direct.flags \
//!     -e smb_direct.remaining_length -e smb_direct.data_offset -e smb_direct.data_length \
//!     -e smb_direct.reassembled.length
//! ```
//!
//! With a Wireshark profile that changed those defaults, this restores them:
//!
//! ```text
//! tshark -r FILE.pcap -o infiniband.rroce.port:4791 --enable-heuristic smb_direct_infiniband
//! ```
//!
//! The heuristic recognises only what Windows and Linux send:
//!
//! * a Negotiate Request of exactly 20 bytes with MinVersion and MaxVersion
//!   0x0100;
//! * a Negotiate Response of exactly 32 bytes with MinVersion, MaxVersion
//!   and NegotiatedVersion 0x0100 (so a failure response, NegotiatedVersion
//!   0, shows as raw InfiniBand payload);
//! * a Data Transfer message with CreditsRequested and CreditsGranted ≤ 255,
//!   Flags ≤ 1, and either DataOffset 24 with a non-zero DataLength, or no
//!   payload at all (exactly 20 bytes, RemainingDataLength, DataOffset and
//!   DataLength 0).
//!
//! Fragmented messages are reassembled per connection and direction
//! (`smb_direct.reassembled.length`, `smb_direct.fragment.count`), and the
//! reassembled payload goes to tshark's SMB2/SMB heuristics (else `data`).
//!
//! # Hot path
//!
//! [`CaptureHandle::record`] never blocks, locks, allocates or makes a
//! syscall: it takes a preallocated slot from a bounded lock-free queue of
//! free slots, copies the message into it and pushes it on a bounded
//! lock-free queue that a writer thread drains into the file. With no free
//! slot the record is counted as dropped ([`CaptureStats::records_dropped`])
//! and the worker goes on. The timestamp is `CLOCK_REALTIME` read through
//! `SystemTime::now()` (one vDSO call), or the caller's with
//! [`CaptureHandle::record_at`].

use crossbeam_queue::ArrayQueue;
use std::fmt;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// UDP destination port of RoCEv2 (IANA).
pub const ROCEV2_UDP_PORT: u16 = 4791;
/// BTH opcode: RC SEND Only.
pub const OPCODE_RC_SEND_ONLY: u8 = 0x04;
/// BTH opcode: RC SEND Only with Invalidate (followed by an IETH).
pub const OPCODE_RC_SEND_ONLY_INVALIDATE: u8 = 0x17;
/// pcap magic for nanosecond-resolution timestamps.
pub const PCAP_MAGIC_NANOS: u32 = 0xa1b2_3c4d;
/// pcap link type: Ethernet.
pub const LINKTYPE_ETHERNET: u32 = 1;

const ETH_LEN: usize = 14;
const IPV4_LEN: usize = 20;
const UDP_LEN: usize = 8;
const BTH_LEN: usize = 12;
const IETH_LEN: usize = 4;
const ICRC_LEN: usize = 4;
/// Longest header stack before the payload (Ethernet to IETH).
pub const MAX_HEADERS_LEN: usize = ETH_LEN + IPV4_LEN + UDP_LEN + BTH_LEN + IETH_LEN;
/// Bytes a frame can have after the payload: up to 3 pad bytes and the ICRC.
pub const MAX_TRAILER_LEN: usize = 3 + ICRC_LEN;
const PCAP_GLOBAL_HEADER_LEN: usize = 24;
const PCAP_RECORD_HEADER_LEN: usize = 16;
/// Smallest snap length: every Negotiate message and the Data Transfer
/// header with its padding to DataOffset 24 fit.
pub const MIN_SNAP_LEN: usize = 32;
/// Largest snap length: the longest payload of a RoCEv2 packet in one IPv4
/// datagram (65535 bytes) with the IETH, pad and ICRC.
pub const MAX_SNAP_LEN: usize = 65535 - (IPV4_LEN + UDP_LEN + BTH_LEN + IETH_LEN) - MAX_TRAILER_LEN;
/// Initial content of the slots (never written to the file).
const PREFAULT_FILL: u8 = 0x5A;
/// How long the writer sleeps when it has found nothing to write for
/// [`WRITER_SPIN_POLLS`] polls (it flushes the file first).
const WRITER_IDLE: Duration = Duration::from_millis(1);
/// Polls (each a `sched_yield`) the writer makes after its last record
/// before it sleeps.
const WRITER_SPIN_POLLS: u32 = 256;

/// Sizing of a capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaptureConfig {
    /// Bytes of each SMB Direct message kept ([`MIN_SNAP_LEN`] to
    /// [`MAX_SNAP_LEN`]); longer messages are truncated (the pcap record
    /// keeps the original length). The pcap snaplen is this plus
    /// [`MAX_HEADERS_LEN`] and [`MAX_TRAILER_LEN`]. Default 8192, a whole
    /// message of the usual MaxReceiveSize.
    pub snap_len: usize,
    /// Record slots preallocated, each `snap_len` bytes: how many messages
    /// may wait for the writer before records are dropped. Default 1024.
    pub slots: usize,
}

impl Default for CaptureConfig {
    fn default() -> Self {
        CaptureConfig {
            snap_len: 8192,
            slots: 1024,
        }
    }
}

impl CaptureConfig {
    /// The pcap global header's snaplen for this configuration.
    pub fn pcap_snaplen(&self) -> usize {
        self.snap_len + MAX_HEADERS_LEN + MAX_TRAILER_LEN
    }

    fn validate(&self) -> io::Result<()> {
        if self.slots == 0 {
            return Err(invalid("capture slots must be at least 1"));
        }
        if !(MIN_SNAP_LEN..=MAX_SNAP_LEN).contains(&self.snap_len) {
            return Err(invalid("capture snap length must be 32..=65484 bytes"));
        }
        Ok(())
    }
}

fn invalid(msg: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// Which way a message went, seen from this server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Sent by us to the peer.
    Sent,
    /// Received from the peer.
    Received,
}

/// The RDMA operation that carried the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CaptureOp {
    /// SEND (BTH opcode RC SEND Only).
    Send,
    /// SEND with Invalidate of this RKey (RC SEND Only with Invalidate + IETH).
    SendWithInvalidate(u32),
}

impl CaptureOp {
    /// The BTH opcode this operation is framed with.
    pub fn opcode(self) -> u8 {
        match self {
            CaptureOp::Send => OPCODE_RC_SEND_ONLY,
            CaptureOp::SendWithInvalidate(_) => OPCODE_RC_SEND_ONLY_INVALIDATE,
        }
    }
}

/// One side of a connection as it appears in the capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CaptureEndpoint {
    /// Ethernet address (locally administered: 02:00 and the IPv4 address).
    pub mac: [u8; 6],
    /// IPv4 address.
    pub ip: Ipv4Addr,
    /// UDP source port of this side's packets.
    pub udp_port: u16,
    /// Queue pair number (24 bits): the BTH DestQP of packets to this side.
    pub qpn: u32,
}

impl CaptureEndpoint {
    fn new(ip: Ipv4Addr, udp_port: u16, qpn: u32) -> Self {
        let o = ip.octets();
        CaptureEndpoint {
            mac: [0x02, 0x00, o[0], o[1], o[2], o[3]],
            ip,
            udp_port,
            qpn: qpn & 0x00FF_FFFF,
        }
    }
}

/// A connection's identity in the capture, plus its PSN counters. Create
/// one per connection when its QP is set up (not on the I/O path) and pass
/// it to every [`CaptureHandle::record`] for that connection.
#[derive(Debug)]
pub struct CaptureConn {
    peer: CaptureEndpoint,
    local: CaptureEndpoint,
    real_peer: SocketAddr,
    psn_sent: AtomicU32,
    psn_received: AtomicU32,
}

/// 64-bit FNV-1a: stable across runs and platforms, so the same connection
/// gets the same synthetic addresses in every capture.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in *part {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

impl CaptureConn {
    /// Derives the capture addressing of the connection with `peer` (its
    /// real address), our QP number `local_qpn` and the peer's
    /// `remote_qpn` (both truncated to 24 bits). QP numbers 0 and 1 are the
    /// InfiniBand management QPs (SMI/GSI), which Wireshark decodes as MADs,
    /// not as SMB Direct: a provider's QP 0 or 1 (the soft provider numbers
    /// from 1) is recorded as 0x10000 or 0x10001.
    pub fn new(peer: SocketAddr, local_qpn: u32, remote_qpn: u32) -> Self {
        let fix = |q: u32| {
            if q & 0x00ff_ffff < 2 {
                (q & 0x00ff_ffff) | 0x0001_0000
            } else {
                q
            }
        };
        let (local_qpn, remote_qpn) = (fix(local_qpn), fix(remote_qpn));
        let mut ip_buf = [0u8; 16];
        let ip_bytes: &[u8] = match peer.ip() {
            IpAddr::V4(a) => {
                ip_buf[..4].copy_from_slice(&a.octets());
                &ip_buf[..4]
            }
            IpAddr::V6(a) => {
                ip_buf.copy_from_slice(&a.octets());
                &ip_buf[..]
            }
        };
        let h = fnv1a(&[
            ip_bytes,
            &peer.port().to_be_bytes(),
            &local_qpn.to_le_bytes(),
            &remote_qpn.to_le_bytes(),
        ]);
        let peer_ip = match peer.ip() {
            IpAddr::V4(a) => a,
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => v4,
                None => {
                    let hv = fnv1a(&[&a.octets()]) as u32;
                    Ipv4Addr::from(0x6440_0000 | (hv & 0x003F_FFFF))
                }
            },
        };
        let peer_port = if peer.port() > ROCEV2_UDP_PORT {
            peer.port()
        } else {
            49152 + peer.port() % 16384
        };
        let local_ip = Ipv4Addr::from(0xC612_0000 | (h as u32 & 0x0001_FFFF));
        let local_port = 49152 | (fnv1a(&[&local_qpn.to_le_bytes()]) as u16 & 0x3FFF);
        CaptureConn {
            peer: CaptureEndpoint::new(peer_ip, peer_port, remote_qpn),
            local: CaptureEndpoint::new(local_ip, local_port, local_qpn),
            real_peer: peer,
            psn_sent: AtomicU32::new(0),
            psn_received: AtomicU32::new(0),
        }
    }

    /// The peer as it appears in the capture.
    pub fn peer(&self) -> CaptureEndpoint {
        self.peer
    }

    /// This server's side as it appears in the capture.
    pub fn local(&self) -> CaptureEndpoint {
        self.local
    }

    /// The (source, destination) endpoints of a message going `dir`.
    pub fn endpoints(&self, dir: Direction) -> (CaptureEndpoint, CaptureEndpoint) {
        match dir {
            Direction::Sent => (self.local, self.peer),
            Direction::Received => (self.peer, self.local),
        }
    }

    /// Takes the next PSN (24 bits, wrapping) of direction `dir`.
    fn next_psn(&self, dir: Direction) -> u32 {
        let c = match dir {
            Direction::Sent => &self.psn_sent,
            Direction::Received => &self.psn_received,
        };
        c.fetch_add(1, Ordering::Relaxed) & 0x00FF_FFFF
    }
}

impl fmt::Display for CaptureConn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "capture {}:{} qp {:#08x} <-> {}:{} qp {:#08x} is peer {} (our qp {:#08x}, peer qp {:#08x})",
            self.peer.ip,
            self.peer.udp_port,
            self.peer.qpn,
            self.local.ip,
            self.local.udp_port,
            self.local.qpn,
            self.real_peer,
            self.local.qpn,
            self.peer.qpn
        )
    }
}

/// Everything the writer needs besides the bytes: fixed-size, `Copy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameMeta {
    /// Sending side.
    pub src: CaptureEndpoint,
    /// Receiving side (its QPN is the BTH DestQP).
    pub dst: CaptureEndpoint,
    /// The RDMA operation.
    pub op: CaptureOp,
    /// BTH PSN (24 bits).
    pub psn: u32,
}

impl FrameMeta {
    /// The frame of a message going `dir` on `conn`, with PSN `psn`.
    pub fn new(conn: &CaptureConn, dir: Direction, op: CaptureOp, psn: u32) -> Self {
        let (src, dst) = conn.endpoints(dir);
        FrameMeta {
            src,
            dst,
            op,
            psn: psn & 0x00FF_FFFF,
        }
    }
}

/// Sizes of one framed message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLayout {
    /// Ethernet through BTH (and IETH).
    pub headers_len: usize,
    /// Payload bytes in the frame: the message, or its kept prefix.
    pub payload_len: usize,
    /// Pad bytes after the payload (BTH PadCnt).
    pub pad: usize,
    /// Bytes of the frame in the file (pcap incl_len).
    pub captured_len: usize,
    /// Bytes of the frame that would carry the whole message (pcap
    /// orig_len); more than `captured_len` when the message was truncated.
    pub original_len: usize,
}

impl FrameLayout {
    /// Layout of a `msg_len`-byte message of which `kept` bytes are framed.
    pub fn new(op: CaptureOp, msg_len: usize, kept: usize) -> Self {
        let ieth = match op {
            CaptureOp::Send => 0,
            CaptureOp::SendWithInvalidate(_) => IETH_LEN,
        };
        let headers_len = ETH_LEN + IPV4_LEN + UDP_LEN + BTH_LEN + ieth;
        let pad_of = |n: usize| (4 - n % 4) % 4;
        let payload_len = kept.min(msg_len);
        let pad = pad_of(payload_len);
        FrameLayout {
            headers_len,
            payload_len,
            pad,
            captured_len: headers_len + payload_len + pad + ICRC_LEN,
            original_len: headers_len + msg_len + pad_of(msg_len) + ICRC_LEN,
        }
    }
}

/// RFC 1071 Internet checksum of `data` (even length).
pub fn internet_checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for w in data.chunks(2) {
        let hi = u32::from(w[0]) << 8;
        let lo = w.get(1).copied().map_or(0, u32::from);
        sum += hi | lo;
    }
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}

/// Writes the Ethernet, IPv4, UDP, BTH (and IETH) headers of a frame
/// carrying `payload_len` bytes (at most [`MAX_SNAP_LEN`]) into `out`;
/// returns the headers' length.
pub fn write_headers(
    out: &mut [u8; MAX_HEADERS_LEN],
    meta: &FrameMeta,
    payload_len: usize,
) -> usize {
    let lay = FrameLayout::new(meta.op, payload_len, payload_len);
    let h = &mut out[..];
    // Ethernet II.
    h[0..6].copy_from_slice(&meta.dst.mac);
    h[6..12].copy_from_slice(&meta.src.mac);
    h[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    // IPv4.
    let ip_len = lay.captured_len - ETH_LEN;
    let ip = &mut h[ETH_LEN..ETH_LEN + IPV4_LEN];
    ip[0] = 0x45; // version 4, IHL 5
    ip[1] = 0; // DSCP/ECN
    ip[2..4].copy_from_slice(&sat16(ip_len).to_be_bytes());
    ip[4..6].copy_from_slice(&(meta.psn as u16).to_be_bytes()); // identification
    ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes()); // DF
    ip[8] = 64; // TTL
    ip[9] = 17; // UDP
    ip[10..12].fill(0);
    ip[12..16].copy_from_slice(&meta.src.ip.octets());
    ip[16..20].copy_from_slice(&meta.dst.ip.octets());
    let csum = internet_checksum(ip);
    ip[10..12].copy_from_slice(&csum.to_be_bytes());
    // UDP.
    let u = ETH_LEN + IPV4_LEN;
    let udp = &mut h[u..u + UDP_LEN];
    udp[0..2].copy_from_slice(&meta.src.udp_port.to_be_bytes());
    udp[2..4].copy_from_slice(&ROCEV2_UDP_PORT.to_be_bytes());
    udp[4..6].copy_from_slice(&sat16(ip_len - IPV4_LEN).to_be_bytes());
    udp[6..8].fill(0); // no checksum (RoCEv2 allows 0 over IPv4)
                       // BTH.
    let b = u + UDP_LEN;
    let bth = &mut h[b..b + BTH_LEN];
    bth[0] = meta.op.opcode();
    bth[1] = (lay.pad as u8) << 4; // SE 0, M 0, PadCnt, TVer 0
    bth[2..4].copy_from_slice(&0xFFFFu16.to_be_bytes()); // default P_Key
    bth[4..8].copy_from_slice(&(meta.dst.qpn & 0x00FF_FFFF).to_be_bytes()); // resv8 + DestQP
    bth[8..12].copy_from_slice(&(meta.psn & 0x00FF_FFFF).to_be_bytes()); // A 0 + resv7 + PSN
                                                                         // IETH.
    if let CaptureOp::SendWithInvalidate(rkey) = meta.op {
        h[b + BTH_LEN..b + BTH_LEN + IETH_LEN].copy_from_slice(&rkey.to_be_bytes());
    }
    lay.headers_len
}

/// Lengths fit: payloads are at most [`MAX_SNAP_LEN`]; saturate otherwise.
fn sat16(v: usize) -> u16 {
    u16::try_from(v).unwrap_or(u16::MAX)
}

/// Slicing-by-8 tables of the reflected CRC-32 (IEEE 802.3 polynomial):
/// `CRC32_TABLES[0]` is the classic byte table.
const CRC32_TABLES: [[u32; 256]; 8] = {
    let mut t = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        t[0][i] = c;
        i += 1;
    }
    let mut j = 1;
    while j < 8 {
        let mut i = 0;
        while i < 256 {
            let prev = t[j - 1][i];
            t[j][i] = (prev >> 8) ^ t[0][(prev & 0xFF) as usize];
            i += 1;
        }
        j += 1;
    }
    t
};

/// Continues a reflected CRC-32 (IEEE 802.3 polynomial) over `data`, without
/// the initial and final inversions. Runs on the writer thread, eight bytes
/// at a time.
pub fn crc32_update(mut crc: u32, data: &[u8]) -> u32 {
    let t = &CRC32_TABLES;
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let lo = crc ^ u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        crc = t[7][(lo & 0xFF) as usize]
            ^ t[6][(lo >> 8 & 0xFF) as usize]
            ^ t[5][(lo >> 16 & 0xFF) as usize]
            ^ t[4][(lo >> 24) as usize]
            ^ t[3][c[4] as usize]
            ^ t[2][c[5] as usize]
            ^ t[1][c[6] as usize]
            ^ t[0][c[7] as usize];
    }
    for &b in chunks.remainder() {
        crc = t[0][((crc ^ u32::from(b)) & 0xFF) as usize] ^ (crc >> 8);
    }
    crc
}

/// The RoCEv2 invariant CRC of a frame whose Ethernet-to-IETH headers are
/// `headers` (as [`write_headers`] wrote them) followed by `payload` and
/// `pad` zero bytes: CRC-32 over 8 bytes of 0xFF (the masked LRH stand-in),
/// the IPv4 header with TOS, TTL and checksum set to 1s, the UDP header with
/// its checksum set to 1s, the BTH with its reserved byte before DestQP set
/// to 1s, then the rest unmodified. Written little-endian (as the FCS).
pub fn rocev2_icrc(headers: &[u8], payload: &[u8], pad: usize) -> u32 {
    let mut masked = [0u8; MAX_HEADERS_LEN - ETH_LEN];
    let m = &mut masked[..headers.len() - ETH_LEN];
    m.copy_from_slice(&headers[ETH_LEN..]);
    m[1] = 0xFF; // TOS
    m[8] = 0xFF; // TTL
    m[10] = 0xFF; // header checksum
    m[11] = 0xFF;
    m[IPV4_LEN + 6] = 0xFF; // UDP checksum
    m[IPV4_LEN + 7] = 0xFF;
    m[IPV4_LEN + UDP_LEN + 4] = 0xFF; // BTH resv8a
    let mut crc = crc32_update(!0, &[0xFF; 8]);
    crc = crc32_update(crc, m);
    crc = crc32_update(crc, payload);
    crc = crc32_update(crc, &[0u8; 3][..pad]);
    !crc
}

/// The pcap global header (nanosecond magic, Ethernet link type).
pub fn pcap_global_header(snaplen: usize) -> [u8; PCAP_GLOBAL_HEADER_LEN] {
    let mut g = [0u8; PCAP_GLOBAL_HEADER_LEN];
    g[0..4].copy_from_slice(&PCAP_MAGIC_NANOS.to_le_bytes());
    g[4..6].copy_from_slice(&2u16.to_le_bytes());
    g[6..8].copy_from_slice(&4u16.to_le_bytes());
    // thiszone 0, sigfigs 0
    g[16..20].copy_from_slice(&(snaplen as u32).to_le_bytes());
    g[20..24].copy_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
    g
}

/// Writes one pcap record of a `msg_len`-byte message of which `kept` (a
/// prefix, all of it unless truncated) is available. A truncated message's
/// frame ends after the kept prefix, pad and ICRC (its IPv4/UDP lengths and
/// ICRC describe that frame, so tshark still decodes the SMB Direct header),
/// while the record's original length is that of the whole message's frame.
/// Returns the bytes written.
pub fn write_record<W: Write>(
    w: &mut W,
    ts: Duration,
    meta: &FrameMeta,
    kept: &[u8],
    msg_len: usize,
) -> io::Result<usize> {
    let lay = FrameLayout::new(meta.op, msg_len, kept.len());
    let payload = &kept[..lay.payload_len];
    let mut hdr = [0u8; MAX_HEADERS_LEN];
    let headers_len = write_headers(&mut hdr, meta, payload.len());
    let headers = &hdr[..headers_len];
    let mut rec = [0u8; PCAP_RECORD_HEADER_LEN];
    let secs = u32::try_from(ts.as_secs()).unwrap_or(u32::MAX);
    rec[0..4].copy_from_slice(&secs.to_le_bytes());
    rec[4..8].copy_from_slice(&ts.subsec_nanos().to_le_bytes());
    rec[8..12].copy_from_slice(&(lay.captured_len as u32).to_le_bytes());
    let orig = u32::try_from(lay.original_len).unwrap_or(u32::MAX);
    rec[12..16].copy_from_slice(&orig.to_le_bytes());
    w.write_all(&rec)?;
    w.write_all(headers)?;
    w.write_all(payload)?;
    w.write_all(&[0u8; 3][..lay.pad])?;
    w.write_all(&rocev2_icrc(headers, payload, lay.pad).to_le_bytes())?;
    Ok(PCAP_RECORD_HEADER_LEN + lay.captured_len)
}

/// A preallocated record: moved between the free and filled queues, never
/// allocated or freed after start-up.
struct Slot {
    ts: Duration,
    meta: FrameMeta,
    msg_len: usize,
    captured: usize,
    data: Box<[u8]>,
}

/// Keeps a hot atomic on its own cache line.
#[repr(align(128))]
#[derive(Default)]
struct Padded<T>(T);

struct Shared {
    free: ArrayQueue<Slot>,
    filled: ArrayQueue<Slot>,
    closing: Padded<AtomicBool>,
    in_flight: Padded<AtomicUsize>,
    dropped: Padded<AtomicU64>,
    truncated: AtomicU64,
    written: AtomicU64,
    bytes: AtomicU64,
}

impl Shared {
    fn new(cfg: &CaptureConfig) -> Self {
        let free = ArrayQueue::new(cfg.slots);
        for _ in 0..cfg.slots {
            // Filled with a non-zero byte so the allocation is written (a
            // zero fill may become calloc's untouched pages): every page is
            // faulted in now rather than on a worker's first copy.
            let data = vec![PREFAULT_FILL; cfg.snap_len];
            let slot = Slot {
                ts: Duration::ZERO,
                meta: FrameMeta {
                    src: CaptureEndpoint::new(Ipv4Addr::UNSPECIFIED, 0, 0),
                    dst: CaptureEndpoint::new(Ipv4Addr::UNSPECIFIED, 0, 0),
                    op: CaptureOp::Send,
                    psn: 0,
                },
                msg_len: 0,
                captured: 0,
                data: data.into_boxed_slice(),
            };
            if free.push(slot).is_err() {
                unreachable!("free queue holds every slot");
            }
        }
        Shared {
            free,
            filled: ArrayQueue::new(cfg.slots),
            closing: Padded::default(),
            in_flight: Padded::default(),
            dropped: Padded::default(),
            truncated: AtomicU64::new(0),
            written: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        }
    }

    fn stats(&self) -> CaptureStats {
        CaptureStats {
            records_written: self.written.load(Ordering::Relaxed),
            records_dropped: self.dropped.0.load(Ordering::Relaxed),
            records_truncated: self.truncated.load(Ordering::Relaxed),
            bytes_written: self.bytes.load(Ordering::Relaxed),
        }
    }
}

/// Counters of a capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CaptureStats {
    /// Records in the file.
    pub records_written: u64,
    /// Records lost: no free slot, recorded after [`CaptureHandle::finish`],
    /// or not written after a write error.
    pub records_dropped: u64,
    /// Records whose message was longer than the snap length.
    pub records_truncated: u64,
    /// Bytes in the file, pcap headers included.
    pub bytes_written: u64,
}

impl fmt::Display for CaptureStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} records ({} bytes) written, {} dropped, {} truncated",
            self.records_written, self.bytes_written, self.records_dropped, self.records_truncated
        )
    }
}

/// A running capture: share it (`Arc<CaptureHandle>` or a reference) with
/// the workers, which call [`Self::record`]; call [`Self::finish`] at
/// shutdown, after the workers stopped (a record racing with `finish` is
/// counted as dropped, never lost silently). Dropping the handle finishes the
/// capture too, ignoring a write error.
pub struct CaptureHandle {
    shared: Arc<Shared>,
    writer: Mutex<Option<JoinHandle<io::Result<()>>>>,
    final_stats: Mutex<Option<CaptureStats>>,
}

impl fmt::Debug for CaptureHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CaptureHandle")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl CaptureHandle {
    /// Creates (truncates) `path`, writes the pcap global header, allocates
    /// the slots and starts the writer thread `smbd-capture`.
    pub fn create(path: impl AsRef<Path>, config: CaptureConfig) -> io::Result<CaptureHandle> {
        config.validate()?;
        let file = File::create(path.as_ref())?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        let global = pcap_global_header(config.pcap_snaplen());
        out.write_all(&global)?;
        out.flush()?;
        let shared = Arc::new(Shared::new(&config));
        shared
            .bytes
            .store(PCAP_GLOBAL_HEADER_LEN as u64, Ordering::Relaxed);
        let s = Arc::clone(&shared);
        let writer = std::thread::Builder::new()
            .name("smbd-capture".into())
            .spawn(move || writer_loop(&s, out))?;
        Ok(CaptureHandle {
            shared,
            writer: Mutex::new(Some(writer)),
            final_stats: Mutex::new(None),
        })
    }

    /// Records `msg` going `dir` on `conn`, carried by `op`, timestamped
    /// now (`CLOCK_REALTIME`, read only once a slot is taken). Returns false
    /// when the record was dropped. Never blocks, locks, allocates or makes
    /// a syscall.
    #[inline]
    pub fn record(&self, conn: &CaptureConn, dir: Direction, op: CaptureOp, msg: &[u8]) -> bool {
        self.record_parts(conn, dir, op, &[msg])
    }

    /// [`Self::record`] of a message gathered from `parts`, in order (a
    /// Send's header and the payload it gathers from elsewhere).
    #[inline]
    pub fn record_parts(
        &self,
        conn: &CaptureConn,
        dir: Direction,
        op: CaptureOp,
        parts: &[&[u8]],
    ) -> bool {
        self.record_with(conn, dir, op, parts, || {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
        })
    }

    /// [`Self::record`] with the caller's timestamp (time since the Unix
    /// epoch).
    #[inline]
    pub fn record_at(
        &self,
        ts: Duration,
        conn: &CaptureConn,
        dir: Direction,
        op: CaptureOp,
        msg: &[u8],
    ) -> bool {
        self.record_with(conn, dir, op, &[msg], || ts)
    }

    #[inline]
    fn record_with(
        &self,
        conn: &CaptureConn,
        dir: Direction,
        op: CaptureOp,
        parts: &[&[u8]],
        now: impl FnOnce() -> Duration,
    ) -> bool {
        let msg_len: usize = parts.iter().map(|p| p.len()).sum();
        // Taken even when the record is dropped: the PSN gap shows the loss.
        let psn = conn.next_psn(dir);
        let s = &*self.shared;
        // finish() waits for in_flight to reach 0 after setting closing, so
        // a record either sees closing or is queued before the last drain.
        s.in_flight.0.fetch_add(1, Ordering::SeqCst);
        let queued = !s.closing.0.load(Ordering::SeqCst)
            && match s.free.pop() {
                Some(mut slot) => {
                    let mut n = 0;
                    for p in parts {
                        let k = p.len().min(slot.data.len() - n);
                        slot.data[n..n + k].copy_from_slice(&p[..k]);
                        n += k;
                    }
                    if n < msg_len {
                        s.truncated.fetch_add(1, Ordering::Relaxed);
                    }
                    slot.ts = now();
                    slot.meta = FrameMeta::new(conn, dir, op, psn);
                    slot.msg_len = msg_len;
                    slot.captured = n;
                    match s.filled.push(slot) {
                        Ok(()) => true,
                        // Cannot happen (the queues hold every slot between
                        // them); never free a slot on the I/O path.
                        Err(slot) => {
                            if let Err(slot) = s.free.push(slot) {
                                std::mem::forget(slot);
                            }
                            false
                        }
                    }
                }
                None => false,
            };
        s.in_flight.0.fetch_sub(1, Ordering::Release);
        if !queued {
            s.dropped.0.fetch_add(1, Ordering::Relaxed);
        }
        queued
    }

    /// Counters so far (the writer updates them as it goes).
    pub fn stats(&self) -> CaptureStats {
        self.shared.stats()
    }

    /// Stops recording (later records count as dropped), lets the writer
    /// write every queued record, flushes the file, joins the writer and
    /// returns the final counters (an error if the writer failed: its
    /// message includes the counters). Later calls return the final counters.
    pub fn finish(&self) -> io::Result<CaptureStats> {
        let writer = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(writer) = writer else {
            let done = *self.final_stats.lock().unwrap_or_else(|e| e.into_inner());
            return Ok(done.unwrap_or_else(|| self.stats()));
        };
        self.shared.closing.0.store(true, Ordering::SeqCst);
        writer.thread().unpark();
        let result = match writer.join() {
            Ok(r) => r,
            Err(_) => Err(io::Error::other("capture writer thread panicked")),
        };
        let stats = self.stats();
        *self.final_stats.lock().unwrap_or_else(|e| e.into_inner()) = Some(stats);
        result
            .map(|()| stats)
            .map_err(|e| io::Error::new(e.kind(), format!("writing capture: {e} ({stats})")))
    }
}

impl Drop for CaptureHandle {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

/// Drains the filled queue into `out` until [`CaptureHandle::finish`].
/// After a write error it keeps draining (so workers never run out of
/// slots for long) and counts the records as dropped.
fn writer_loop(s: &Shared, mut out: BufWriter<File>) -> io::Result<()> {
    let mut error: Option<io::Error> = None;
    let write_one = |slot: Slot, out: &mut BufWriter<File>, error: &mut Option<io::Error>| {
        if error.is_none() {
            match write_record(
                out,
                slot.ts,
                &slot.meta,
                &slot.data[..slot.captured],
                slot.msg_len,
            ) {
                Ok(n) => {
                    s.written.fetch_add(1, Ordering::Relaxed);
                    s.bytes.fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(e) => *error = Some(e),
            }
        }
        if error.is_some() {
            s.dropped.0.fetch_add(1, Ordering::Relaxed);
        }
        if s.free.push(slot).is_err() {
            unreachable!("free queue holds every slot");
        }
    };
    let mut idle_polls = 0u32;
    loop {
        if let Some(slot) = s.filled.pop() {
            write_one(slot, &mut out, &mut error);
            idle_polls = 0;
            continue;
        }
        if s.closing.0.load(Ordering::SeqCst) && s.in_flight.0.load(Ordering::SeqCst) == 0 {
            // Every record that will ever be queued is queued now.
            while let Some(slot) = s.filled.pop() {
                write_one(slot, &mut out, &mut error);
            }
            break;
        }
        // Busy: poll again soon, so a burst does not wait for a sleep.
        if idle_polls < WRITER_SPIN_POLLS {
            idle_polls += 1;
            std::thread::yield_now();
            continue;
        }
        if error.is_none() {
            if let Err(e) = out.flush() {
                error = Some(e);
            }
        }
        std::thread::park_timeout(WRITER_IDLE);
    }
    if let Some(e) = error {
        return Err(e);
    }
    out.flush()?;
    out.get_ref().sync_data()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn_a() -> CaptureConn {
        CaptureConn::new("192.0.2.10:50001".parse().unwrap(), 0x11, 0x22)
    }

    fn frame_of(meta: &FrameMeta, msg: &[u8], snap: usize) -> (Vec<u8>, u32, u32) {
        let mut v = Vec::new();
        let n = msg.len().min(snap);
        let written =
            write_record(&mut v, Duration::new(5, 7), meta, &msg[..n], msg.len()).unwrap();
        assert_eq!(written, v.len());
        let incl = u32::from_le_bytes(v[8..12].try_into().unwrap());
        let orig = u32::from_le_bytes(v[12..16].try_into().unwrap());
        assert_eq!(incl as usize, v.len() - PCAP_RECORD_HEADER_LEN);
        (v[PCAP_RECORD_HEADER_LEN..].to_vec(), incl, orig)
    }

    #[test]
    fn internet_checksum_known_vector() {
        // The usual worked example: 45 00 00 73 00 00 40 00 40 11 [b8 61] c0 a8 00 01 c0 a8 00 c7.
        let mut h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(internet_checksum(&h), 0xb861);
        h[10] = 0xb8;
        h[11] = 0x61;
        assert_eq!(internet_checksum(&h), 0);
    }

    #[test]
    fn ipv4_udp_headers_valid() {
        let c = conn_a();
        let meta = FrameMeta::new(&c, Direction::Received, CaptureOp::Send, 3);
        let msg = [7u8; 37];
        let (f, _, _) = frame_of(&meta, &msg, 8192);
        assert_eq!(&f[0..6], &c.local().mac);
        assert_eq!(&f[6..12], &c.peer().mac);
        assert_eq!(&f[12..14], &[0x08, 0x00]);
        let ip = &f[14..34];
        assert_eq!(ip[0], 0x45);
        assert_eq!(ip[9], 17);
        assert_eq!(internet_checksum(ip), 0, "IPv4 header checksum");
        let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
        assert_eq!(total, f.len() - ETH_LEN);
        assert_eq!(&ip[12..16], &[192, 0, 2, 10]);
        assert_eq!(Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]), c.local().ip);
        let udp = &f[34..42];
        assert_eq!(u16::from_be_bytes([udp[0], udp[1]]), 50001);
        assert_eq!(u16::from_be_bytes([udp[2], udp[3]]), ROCEV2_UDP_PORT);
        assert_eq!(
            usize::from(u16::from_be_bytes([udp[4], udp[5]])),
            total - IPV4_LEN
        );
        assert_eq!(&udp[6..8], &[0, 0]);
    }

    #[test]
    fn bth_layout_send_and_invalidate() {
        let c = conn_a();
        let msg = [0xABu8; 37]; // pad 3
        let meta = FrameMeta::new(&c, Direction::Sent, CaptureOp::Send, 0x12_3456);
        let (f, _, _) = frame_of(&meta, &msg, 8192);
        let bth = &f[42..54];
        assert_eq!(bth[0], OPCODE_RC_SEND_ONLY);
        assert_eq!(bth[1], 3 << 4, "SE 0, M 0, PadCnt 3, TVer 0");
        assert_eq!(&bth[2..4], &[0xFF, 0xFF], "P_Key");
        assert_eq!(&bth[4..8], &[0x00, 0x00, 0x00, 0x22], "DestQP = peer's QPN");
        assert_eq!(&bth[8..12], &[0x00, 0x12, 0x34, 0x56], "PSN");
        assert_eq!(&f[54..54 + 37], &msg[..]);
        assert_eq!(&f[91..94], &[0, 0, 0], "pad");
        assert_eq!(f.len(), 54 + 37 + 3 + 4);

        let meta = FrameMeta::new(
            &c,
            Direction::Received,
            CaptureOp::SendWithInvalidate(0x1234_ABCD),
            1,
        );
        let (f, _, _) = frame_of(&meta, &msg[..20], 8192);
        assert_eq!(f[42], OPCODE_RC_SEND_ONLY_INVALIDATE);
        assert_eq!(f[43], 0, "no pad for 20 bytes");
        assert_eq!(&f[46..50], &[0x00, 0x00, 0x00, 0x11], "DestQP = our QPN");
        assert_eq!(&f[54..58], &[0x12, 0x34, 0xAB, 0xCD], "IETH RKey");
        assert_eq!(&f[58..78], &msg[..20]);
        assert_eq!(f.len(), 58 + 20 + 4);
    }

    #[test]
    fn crc32_and_icrc() {
        // CRC-32 check value.
        assert_eq!(!crc32_update(!0, b"123456789"), 0xCBF4_3926);
        // Slicing-by-8 agrees with the bytewise loop at every length and
        // split point.
        let data: Vec<u8> = (0..300u32).map(|i| (i * 7 + i / 13) as u8).collect();
        let bytewise = |mut crc: u32, d: &[u8]| {
            for &b in d {
                crc = CRC32_TABLES[0][((crc ^ u32::from(b)) & 0xFF) as usize] ^ (crc >> 8);
            }
            crc
        };
        for len in 0..data.len() {
            let d = &data[..len];
            assert_eq!(crc32_update(!0, d), bytewise(!0, d), "len {len}");
            let (a, b) = d.split_at(len / 3);
            assert_eq!(crc32_update(crc32_update(!0, a), b), bytewise(!0, d));
        }
        // Linux rxe seeds the ICRC with the CRC state after the 8 bytes of
        // 1s that stand in for the LRH.
        assert_eq!(crc32_update(!0, &[0xFF; 8]), 0xDEBB_20E3);
        // The ICRC ignores the masked (variant) fields.
        let c = conn_a();
        let meta = FrameMeta::new(&c, Direction::Sent, CaptureOp::Send, 9);
        let mut h = [0u8; MAX_HEADERS_LEN];
        let hl = write_headers(&mut h, &meta, 21);
        let a = rocev2_icrc(&h[..hl], &[1; 21], 3);
        h[ETH_LEN + 8] = 1; // TTL
        h[ETH_LEN + 1] = 0x2e; // DSCP
        h[ETH_LEN + IPV4_LEN + 6] = 0x12; // UDP checksum
        h[ETH_LEN + IPV4_LEN + UDP_LEN + 4] = 0x80; // resv8a
        assert_eq!(rocev2_icrc(&h[..hl], &[1; 21], 3), a);
        h[ETH_LEN + 12] ^= 1; // source address is covered
        assert_ne!(rocev2_icrc(&h[..hl], &[1; 21], 3), a);
    }

    /// Unhexes a test vector.
    fn bytes(hex: &str) -> Vec<u8> {
        let hex: String = hex.split_whitespace().collect();
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn icrc_matches_independent_implementation() {
        // An RC SEND Only with Invalidate frame (IETH, 37-byte SMB Direct
        // data message, 3 pad bytes) whose ICRC was computed by Scapy's
        // RoCEv2 implementation (scapy.contrib.roce, BTH.compute_icrc).
        let frame = bytes(
            "0200c6131fba 0200c000020a 0800
             4500005800014000401192bc c000020a c6131fba
             c35112b7 0044 0000
             1730ffff 00000011 00000001
             1234abcd
             0a000300 01000000 00000000 18000000 0d000000 00000000
             41414141 41414141 41414141 41
             000000
             697d96d2",
        );
        let hl = MAX_HEADERS_LEN;
        let (payload, icrc) = (&frame[hl..hl + 37], &frame[hl + 40..]);
        assert_eq!(rocev2_icrc(&frame[..hl], payload, 3).to_le_bytes(), icrc);
        assert_eq!(internet_checksum(&frame[14..34]), 0);
        // And we write that very frame for that message.
        let c = conn_a();
        let meta = FrameMeta {
            psn: 1,
            ..FrameMeta::new(
                &c,
                Direction::Received,
                CaptureOp::SendWithInvalidate(0x1234_ABCD),
                1,
            )
        };
        let mut meta = meta;
        // The vector's synthetic server address and QPN.
        meta.dst = CaptureEndpoint::new(Ipv4Addr::new(198, 19, 31, 186), 57460, 0x11);
        let (f, _, _) = frame_of(&meta, &frame[hl..hl + 37], 8192);
        assert_eq!(f, frame);
    }

    #[test]
    fn psn_counts_per_direction_per_connection_and_wraps() {
        let a = conn_a();
        let b = CaptureConn::new("192.0.2.10:50002".parse().unwrap(), 0x33, 0x44);
        assert_eq!(a.next_psn(Direction::Sent), 0);
        assert_eq!(a.next_psn(Direction::Sent), 1);
        assert_eq!(a.next_psn(Direction::Received), 0);
        assert_eq!(b.next_psn(Direction::Sent), 0);
        assert_eq!(a.next_psn(Direction::Sent), 2);
        assert_eq!(a.next_psn(Direction::Received), 1);
        a.psn_sent.store(0x00FF_FFFF, Ordering::Relaxed);
        assert_eq!(a.next_psn(Direction::Sent), 0x00FF_FFFF);
        assert_eq!(a.next_psn(Direction::Sent), 0);
    }

    #[test]
    fn truncation_keeps_original_length() {
        let c = conn_a();
        let meta = FrameMeta::new(&c, Direction::Sent, CaptureOp::Send, 0);
        let msg: Vec<u8> = (0..1001u32).map(|i| i as u8).collect();
        let (f, incl, orig) = frame_of(&meta, &msg, 98);
        // The kept prefix, padded, with its ICRC: a frame tshark decodes.
        assert_eq!(incl as usize, 54 + 98 + 2 + 4);
        assert_eq!(f[43] >> 4 & 3, 2, "PadCnt of the kept payload");
        assert_eq!(&f[54..54 + 98], &msg[..98]);
        assert_eq!(
            u32::from_le_bytes(f[f.len() - 4..].try_into().unwrap()),
            rocev2_icrc(&f[..54], &msg[..98], 2)
        );
        assert_eq!(
            usize::from(u16::from_be_bytes([f[16], f[17]])),
            20 + 8 + 12 + 98 + 2 + 4
        );
        assert_eq!(
            usize::from(u16::from_be_bytes([f[38], f[39]])),
            8 + 12 + 98 + 2 + 4
        );
        // The original length is the whole message's frame.
        assert_eq!(orig as usize, 54 + 1001 + 3 + 4);
        // Not truncated: identical lengths.
        let (_, incl, orig) = frame_of(&meta, &msg, 1001);
        assert_eq!((incl, orig), (54 + 1004 + 4, 54 + 1004 + 4));
        // The largest snap length still fits one IPv4 datagram.
        let mut h = [0u8; MAX_HEADERS_LEN];
        let inv = FrameMeta::new(&c, Direction::Sent, CaptureOp::SendWithInvalidate(1), 0);
        write_headers(&mut h, &inv, MAX_SNAP_LEN);
        assert_eq!(u16::from_be_bytes([h[16], h[17]]), 65532);
        assert_eq!(
            CaptureConfig {
                snap_len: MAX_SNAP_LEN,
                slots: 1
            }
            .pcap_snaplen(),
            14 + 65535
        );
    }

    #[test]
    fn connections_get_distinct_addresses() {
        let a = conn_a();
        let b = CaptureConn::new("192.0.2.10:50002".parse().unwrap(), 0x33, 0x44);
        assert_eq!(a.peer().ip, b.peer().ip, "the peer's real IPv4 address");
        assert_ne!(a.local().ip, b.local().ip);
        assert_ne!(a.local().mac, b.local().mac);
        assert_ne!(
            (a.peer().udp_port, a.local().udp_port),
            (b.peer().udp_port, b.local().udp_port)
        );
        assert_eq!(a.peer().qpn, 0x22);
        assert_eq!(a.local().qpn, 0x11);
        // Stable.
        assert_eq!(conn_a().local(), a.local());
        // IPv6 peers get a synthetic IPv4 address; low ports move up.
        let v6 = CaptureConn::new("[2001:db8::5]:445".parse().unwrap(), 0x1_000_001, 7);
        assert_eq!(v6.peer().ip.octets()[0], 100);
        assert_eq!(v6.peer().udp_port, 49152 + 445);
        assert_eq!(
            v6.local().qpn,
            0x1_0001,
            "24-bit QPN, moved off the GSI QP 1"
        );
        let mapped = CaptureConn::new("[::ffff:192.0.2.7]:60000".parse().unwrap(), 1, 2);
        assert_eq!(mapped.peer().ip, Ipv4Addr::new(192, 0, 2, 7));
        for c in [&a, &b, &v6, &mapped] {
            assert!(c.peer().udp_port > ROCEV2_UDP_PORT && c.local().udp_port > ROCEV2_UDP_PORT);
            assert_eq!(c.local().ip.octets()[0], 198);
        }
        assert!(a.to_string().contains("192.0.2.10:50001"));
    }

    #[test]
    fn no_free_slot_drops_without_blocking() {
        let cfg = CaptureConfig {
            snap_len: 64,
            slots: 2,
        };
        // No writer thread: nothing returns the slots.
        let h = CaptureHandle {
            shared: Arc::new(Shared::new(&cfg)),
            writer: Mutex::new(None),
            final_stats: Mutex::new(None),
        };
        let c = conn_a();
        assert!(h.record(&c, Direction::Sent, CaptureOp::Send, &[0; 20]));
        assert!(h.record(&c, Direction::Sent, CaptureOp::Send, &[0; 200]));
        assert!(!h.record(&c, Direction::Sent, CaptureOp::Send, &[0; 20]));
        let st = h.stats();
        assert_eq!((st.records_dropped, st.records_truncated), (1, 1));
        // The dropped record still used PSN 2.
        assert_eq!(c.next_psn(Direction::Sent), 3);
    }

    #[test]
    fn file_round_trip() {
        let path = std::env::temp_dir().join(format!("capture-unit-{}.pcap", std::process::id()));
        let cfg = CaptureConfig {
            snap_len: 100,
            slots: 4,
        };
        let h = CaptureHandle::create(&path, cfg).unwrap();
        let c = conn_a();
        let mut queued = 0;
        for i in 0..50u8 {
            let len = 20 + usize::from(i) * 3;
            if h.record(&c, Direction::Received, CaptureOp::Send, &vec![i; len]) {
                queued += 1;
            } else {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        let st = h.finish().unwrap();
        assert!(
            !h.record(&c, Direction::Received, CaptureOp::Send, &[0; 20]),
            "after finish"
        );
        assert_eq!(h.finish().unwrap(), st, "finish is idempotent");
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).ok();
        assert_eq!(st.records_written, queued);
        assert_eq!(st.bytes_written, bytes.len() as u64);
        assert_eq!(
            &bytes[..PCAP_GLOBAL_HEADER_LEN],
            &pcap_global_header(cfg.pcap_snaplen())
        );
        // Walk the records.
        let mut at = PCAP_GLOBAL_HEADER_LEN;
        let mut n = 0;
        while at < bytes.len() {
            let incl = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
            assert!(incl <= cfg.pcap_snaplen());
            at += PCAP_RECORD_HEADER_LEN + incl;
            n += 1;
        }
        assert_eq!(at, bytes.len());
        assert_eq!(n, queued);
        assert!(st.records_truncated > 0);
    }

    #[test]
    fn concurrent_records_are_written_or_counted() {
        // Four producers race each other and finish(): every record is in
        // the file or counted as dropped, and the file stays well-formed.
        let path = std::env::temp_dir().join(format!("capture-race-{}.pcap", std::process::id()));
        let cfg = CaptureConfig {
            snap_len: 64,
            slots: 16,
        };
        let h = Arc::new(CaptureHandle::create(&path, cfg).unwrap());
        let per_thread = 5_000u64;
        let threads: Vec<_> = (0..4u32)
            .map(|t| {
                let h = Arc::clone(&h);
                std::thread::spawn(move || {
                    let c = CaptureConn::new("192.0.2.1:60000".parse().unwrap(), t, 100 + t);
                    let mut ok = 0u64;
                    for i in 0..per_thread {
                        ok += u64::from(h.record(
                            &c,
                            Direction::Sent,
                            CaptureOp::Send,
                            &[i as u8; 40],
                        ));
                        // Leave the writer some CPU on a small machine.
                        std::thread::yield_now();
                    }
                    ok
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(20));
        let st = h.finish().unwrap();
        let queued: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        let st_after = h.stats();
        assert_eq!(
            st_after.records_written, st.records_written,
            "nothing written after finish"
        );
        assert_eq!(st.records_written, queued);
        assert_eq!(
            st_after.records_written + st_after.records_dropped,
            4 * per_thread
        );
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).ok();
        assert_eq!(bytes.len() as u64, st.bytes_written);
        let rec = PCAP_RECORD_HEADER_LEN + 54 + 40 + 4;
        assert_eq!((bytes.len() - PCAP_GLOBAL_HEADER_LEN) % rec, 0);
        assert_eq!(
            ((bytes.len() - PCAP_GLOBAL_HEADER_LEN) / rec) as u64,
            queued
        );
    }

    #[test]
    fn config_validation() {
        let bad = |snap_len, slots| {
            let r =
                CaptureHandle::create("/nonexistent-dir/x.pcap", CaptureConfig { snap_len, slots });
            r.unwrap_err().kind()
        };
        assert_eq!(bad(8192, 0), io::ErrorKind::InvalidInput);
        assert_eq!(bad(MIN_SNAP_LEN - 1, 8), io::ErrorKind::InvalidInput);
        assert_eq!(bad(MAX_SNAP_LEN + 1, 8), io::ErrorKind::InvalidInput);
        assert_eq!(bad(8192, 8), io::ErrorKind::NotFound);
    }
}
