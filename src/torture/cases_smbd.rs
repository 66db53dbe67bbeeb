//! SMB Direct cases: Negotiate Requests and Data Transfer messages that
//! break a rule of [MS-SMBD] 3.1.5.6 / 3.1.5.8, sends without a credit,
//! RDMA accesses the client never granted, and random bytes. They run
//! against either upper layer.

use super::raw_peer::{negotiate_request, Dt, RawPeer, Wait};
use super::rig::{Grants, Rig, ServerTotals, Upper};
use super::smb2_peer::{Reply, Smb2Peer};
use super::{Case, Layer, Observation};
use smbdirect_dataplane::client::Client;
use smbdirect_dataplane::provider::{Access, Provider};
use smbdirect_dataplane::upper::{parse_rdma_done, rdma_echo_request};
use smbdirect_protocol::ntstatus::STATUS_NOT_SUPPORTED;
use smbdirect_protocol::smb2::{
    Channel, ChannelInfo, Command, FileId, ReadFlags, ReadRequestRepr, WriteFlags, WriteRequestRepr,
};
use smbdirect_protocol::smbd::wire::{
    BufferDescriptorRepr, DataTransfer, NegotiateRequestRepr, NegotiateResponse,
    NegotiateResponseRepr,
};
use std::time::{Duration, Instant};

type Outcome = Result<Observation, String>;

pub(super) fn cases<P: Provider>() -> Vec<Case<P>> {
    vec![
        Case {
            name: "negotiate-request-shorter-than-20-bytes",
            layer: Layer::Smbd,
            rule: "[MS-SMBD] 3.1.5.6",
            expected: "connection terminated without a Negotiate Response",
            run: negotiate_short::<P>,
        },
        Case {
            name: "negotiate-credits-requested-zero",
            layer: Layer::Smbd,
            rule: "[MS-SMBD] 3.1.5.6",
            expected: "connection terminated without a Negotiate Response",
            run: negotiate_credits_zero::<P>,
        },
        Case {
            name: "negotiate-max-receive-size-below-128",
            layer: Layer::Smbd,
            rule: "[MS-SMBD] 3.1.5.6",
            expected: "connection terminated without a Negotiate Response",
            run: negotiate_max_receive_127::<P>,
        },
        Case {
            name: "negotiate-max-fragmented-size-below-131072",
            layer: Layer::Smbd,
            rule: "[MS-SMBD] 3.1.5.6",
            expected: "connection terminated without a Negotiate Response",
            run: negotiate_max_fragmented_131071::<P>,
        },
        Case {
            name: "negotiate-version-range-without-0x0100",
            layer: Layer::Smbd,
            rule: "[MS-SMBD] 3.1.5.6, 3.1.5.3",
            expected: "Negotiate Response with Status STATUS_NOT_SUPPORTED, then the connection is terminated",
            run: negotiate_versions_above::<P>,
        },
        Case {
            name: "negotiate-version-range-inverted",
            layer: Layer::Smbd,
            rule: "[MS-SMBD] 3.1.5.6, 3.1.5.3 (docs/spec-notes.md: Inverted version range)",
            expected: "Negotiate Response with Status STATUS_NOT_SUPPORTED, then the connection is terminated",
            run: negotiate_versions_inverted::<P>,
        },
        Case {
            name: "data-transfer-shorter-than-20-bytes",
            layer: Layer::Smbd,
            rule: "[MS-SMBD] 3.1.5.8",
            expected: "connection terminated, nothing sent to the peer",
            run: dt_short::<P>,
        },
        Case {
            name: "data-transfer-credits-requested-zero",
            layer: Layer::Smbd,
            rule: "[MS-SMBD] 3.1.5.8",
            expected: "connection terminated, nothing sent to the peer",
            run: dt_credits_zero::<P>,
        },
        Case {
            name: "data-offset-not-8-byte-aligned",
            layer: Layer::Smbd,
            rule: "[MS-SMBD] 3.1.5.8",
            expected: "connection terminated, nothing sent to the peer",
            run: dt_unaligned::<P>,
        },
        Case {
            name: "data-offset-inside-the-header",
            layer: Layer::Smbd,
            rule: "[MS-SMBD] 3.1.5.8 (docs/spec-notes.md: DataOffset inside the header)",
            expected: "connection terminated, nothing sent to the peer",
            run: dt_inside_header::<P>,
        },
        Case {
            name: "data-offset-plus-length-beyond-message",
            layer: Layer::Smbd,
            rule: "[MS-SMBD] 3.1.5.8",
            expected: "connection terminated, nothing sent to the peer",
            run: dt_beyond_message::<P>,
        },
        Case {
            name: "data-length-plus-remaining-over-max-fragmented-size",
            layer: Layer::Smbd,
            rule: "[MS-SMBD] 3.1.5.8 (docs/spec-notes.md: Connection.MaxFragmentSize)",
            expected: "connection terminated, nothing sent to the peer",
            run: dt_over_max_fragmented::<P>,
        },
        Case {
            name: "fragment-sequence-ends-with-bytes-missing",
            layer: Layer::Smbd,
            rule: "[MS-SMBD] 3.1.5.8 (RemainingDataLength 0 while FragmentReassemblyRemaining > 0)",
            expected: "connection terminated, nothing delivered or sent to the peer",
            run: fragment_ends_early::<P>,
        },
        Case {
            name: "fragment-remaining-does-not-count-down",
            layer: Layer::Smbd,
            rule: "[MS-SMBD] 3.1.5.8 (docs/spec-notes.md: Empty messages inside a fragmented sequence)",
            expected: "connection terminated, nothing delivered or sent to the peer",
            run: fragment_no_countdown::<P>,
        },
        Case {
            name: "fragment-longer-than-remaining",
            layer: Layer::Smbd,
            rule: "[MS-SMBD] 3.1.5.8 (docs/spec-notes.md: Empty messages inside a fragmented sequence)",
            expected: "connection terminated, nothing delivered or sent to the peer",
            run: fragment_overrun::<P>,
        },
        Case {
            name: "send-without-a-credit",
            layer: Layer::Smbd,
            rule: "[MS-SMBD] 3.1.5.1, 3.1.5.9 (a Send needs a posted receive: RNR)",
            expected: "connection terminated (the soft provider reports RNR to the sender; or the receiver terminates)",
            run: send_without_credit::<P>,
        },
        Case {
            name: "rdma-read-with-a-wrong-token",
            layer: Layer::Smbd,
            rule: "[MS-SMBD] 3.1.4.3, 3.1.4.6, 3.1.7.1; RFC 5042",
            expected: "the server's RDMA Read fails at the provider and the connection is terminated; no reply",
            run: rdma_wrong_token::<P>,
        },
        Case {
            name: "rdma-read-with-a-revoked-token",
            layer: Layer::Smbd,
            rule: "[MS-SMBD] 3.1.4.4, 3.1.4.6, 3.1.7.1; RFC 5042",
            expected: "the server's RDMA Read fails at the provider and the connection is terminated; no reply",
            run: rdma_revoked_token::<P>,
        },
        Case {
            name: "rdma-read-of-a-write-only-grant",
            layer: Layer::Smbd,
            rule: "[MS-SMBD] 3.1.4.3 (only the permissions registered), 3.1.4.6, 3.1.7.1",
            expected: "the server's RDMA Read fails at the provider and the connection is terminated; no reply",
            run: rdma_wrong_direction::<P>,
        },
        Case {
            name: "rdma-write-beyond-the-grant",
            layer: Layer::Smbd,
            rule: "[MS-SMBD] 3.1.4.3, 3.1.4.5, 3.1.7.1; RFC 5042",
            expected: "the server's RDMA Write fails at the provider and the connection is terminated; no reply",
            run: rdma_beyond_grant::<P>,
        },
        Case {
            name: "rdma-token-of-another-connection",
            layer: Layer::Smbd,
            rule: "[MS-SMBD] 3.1.4.3 (registered on the specified Connection), 3.1.4.6, 3.1.7.1",
            expected: "the connection that used the foreign token is terminated; the granting connection still works",
            run: rdma_other_connection::<P>,
        },
        Case {
            name: "random-bytes-after-negotiation",
            layer: Layer::Smbd,
            rule: "[MS-SMBD] 3.1.5.8",
            expected: "each connection sending random bytes is terminated, nothing sent to it; a bystander connection keeps working",
            run: random_bytes::<P>,
        },
    ]
}

/// Milliseconds, for observations.
pub(super) fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// The server must end the connection within `timeout` of `sent` without
/// sending anything (a terminating violation: no response is prescribed,
/// and after negotiation the peer granted the server no credit to send
/// with).
pub(super) fn terminated_silently<P: Provider>(
    p: &mut RawPeer<P>,
    sent: Instant,
    timeout: Duration,
) -> Observation {
    match p.wait_broken(timeout) {
        Ok((b, msgs)) if msgs.is_empty() => Observation::pass(format!(
            "terminated {} after the message ({:?}), nothing received",
            ms(b.at.saturating_duration_since(sent)),
            b.status
        )),
        Ok((b, msgs)) => Observation::fail(format!(
            "terminated {} after the message, but {} message(s) arrived first (the first {} bytes)",
            ms(b.at.saturating_duration_since(sent)),
            msgs.len(),
            msgs[0].len()
        )),
        Err(msgs) => Observation::fail(format!(
            "still connected {:?} after the message; {} message(s) received",
            timeout,
            msgs.len()
        )),
    }
}

/// With the admin socket: waits up to `within` for the server's live
/// connections to come back to `before` (a peer it lost must be released
/// promptly, not when a timer finally notices). `Ok` with what was seen,
/// `Err` when the server still holds the connection.
pub(super) fn server_released<P: Provider>(
    rig: &Rig<P>,
    before: Option<ServerTotals>,
    since: Instant,
    within: Duration,
) -> Result<String, String> {
    let Some(b) = before else {
        return Ok(
            "no admin socket: the server's release of the connection was not observed".into(),
        );
    };
    let deadline = Instant::now() + within;
    loop {
        match rig.stats() {
            Some(a) if a.connections <= b.connections => {
                return Ok(format!(
                    "the server released the connection within {} (live connections back to {})",
                    ms(since.elapsed()),
                    a.connections
                ))
            }
            Some(a) if Instant::now() >= deadline => {
                return Err(format!(
                    "the server still counts {} live connection(s) {:.1} s later (was {}): it did not notice the connection was gone",
                    a.connections,
                    since.elapsed().as_secs_f64(),
                    b.connections
                ))
            }
            None => return Err("the admin socket stopped answering".into()),
            _ => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

fn negotiate_violation<P: Provider>(rig: &Rig<P>, bytes: &[u8]) -> Outcome {
    let mut p = RawPeer::connect(rig, 4)?;
    let sent = Instant::now();
    p.send_raw(bytes)?;
    Ok(terminated_silently(&mut p, sent, rig.timeout))
}

fn negotiate_short<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let req = negotiate_request(32).to_bytes();
    negotiate_violation(rig, &req[..19])
}

fn negotiate_credits_zero<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    negotiate_violation(rig, &negotiate_request(0).to_bytes())
}

fn negotiate_max_receive_127<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let req = NegotiateRequestRepr {
        max_receive_size: 127,
        ..negotiate_request(32)
    };
    negotiate_violation(rig, &req.to_bytes())
}

fn negotiate_max_fragmented_131071<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let req = NegotiateRequestRepr {
        max_fragmented_size: 131_071,
        ..negotiate_request(32)
    };
    negotiate_violation(rig, &req.to_bytes())
}

/// A version range without 0x0100: a failure response with
/// STATUS_NOT_SUPPORTED, then a (graceful) termination.
fn negotiate_refused<P: Provider>(rig: &Rig<P>, min: u16, max: u16) -> Outcome {
    let req = NegotiateRequestRepr {
        min_version: min,
        max_version: max,
        ..negotiate_request(32)
    };
    let mut p = RawPeer::connect(rig, 4)?;
    let sent = Instant::now();
    p.send_raw(&req.to_bytes())?;
    let m = match p.wait_message(rig.timeout) {
        Wait::Message(m) => m,
        Wait::Broken(b) => {
            return Ok(Observation::fail(format!(
                "terminated {} later without a Negotiate Response ({:?})",
                ms(b.at.saturating_duration_since(sent)),
                b.status
            )))
        }
        Wait::Silent => {
            return Ok(Observation::fail(format!(
                "no Negotiate Response in {:?}",
                rig.timeout
            )))
        }
    };
    let Ok(v) = NegotiateResponse::new_checked(&m[..]) else {
        return Ok(Observation::fail(format!(
            "answered with {} bytes, not a Negotiate Response",
            m.len()
        )));
    };
    let r = NegotiateResponseRepr::parse(&v);
    if r.status != STATUS_NOT_SUPPORTED {
        return Ok(Observation::fail(format!(
            "Negotiate Response with Status {} (CreditsGranted {})",
            r.status, r.credits_granted
        )));
    }
    let zeroed = r.negotiated_version == 0
        && r.credits_granted == 0
        && r.credits_requested == 0
        && r.max_read_write_size == 0
        && r.preferred_send_size == 0
        && r.max_receive_size == 0
        && r.max_fragmented_size == 0
        && r.min_version == 0x0100
        && r.max_version == 0x0100;
    if !zeroed {
        return Ok(Observation::fail(format!(
            "STATUS_NOT_SUPPORTED, but the other fields are not as 3.1.5.3 sets them: {r:?}"
        )));
    }
    Ok(match p.wait_broken(rig.timeout) {
        Ok((b, more)) if more.is_empty() => Observation::pass(format!(
            "Negotiate Response STATUS_NOT_SUPPORTED (other fields zero), then terminated {} after the request",
            ms(b.at.saturating_duration_since(sent))
        )),
        Ok((_, more)) => Observation::fail(format!(
            "STATUS_NOT_SUPPORTED, then {} more message(s) before the termination",
            more.len()
        )),
        Err(_) => Observation::fail(format!(
            "STATUS_NOT_SUPPORTED, but the connection was still up {:?} later",
            rig.timeout
        )),
    })
}

fn negotiate_versions_above<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    negotiate_refused(rig, 0x0101, 0x0200)
}

fn negotiate_versions_inverted<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    negotiate_refused(rig, 0x0200, 0x0001)
}

/// A negotiated raw peer that has granted the server no credit: the
/// server cannot send it anything, so whatever arrives is a violation too.
fn negotiated_peer<P: Provider>(rig: &Rig<P>, credits: u16) -> Result<RawPeer<P>, String> {
    RawPeer::negotiated(rig, 16, negotiate_request(credits))
}

fn dt_violation<P: Provider>(rig: &Rig<P>, dt: Dt, payload: &[u8]) -> Outcome {
    let mut p = negotiated_peer(rig, 16)?;
    let sent = Instant::now();
    p.send_dt(
        Dt {
            grant: Some(0),
            ..dt
        },
        payload,
    )?;
    Ok(terminated_silently(&mut p, sent, rig.timeout))
}

fn dt_short<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    dt_violation(
        rig,
        Dt {
            len: 12,
            ..Dt::empty()
        },
        &[],
    )
}

fn dt_credits_zero<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let dt = Dt {
        credits_requested: 0,
        ..Dt::data(8, 0)
    };
    dt_violation(rig, dt, b"torture!")
}

fn dt_unaligned<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let dt = Dt {
        data_offset: 28,
        data_length: 4,
        len: 32,
        ..Dt::empty()
    };
    dt_violation(rig, dt, b"bad!")
}

fn dt_inside_header<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let dt = Dt {
        data_offset: 8,
        data_length: 8,
        len: 24,
        ..Dt::empty()
    };
    dt_violation(rig, dt, &[])
}

fn dt_beyond_message<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let dt = Dt {
        data_length: 100,
        len: 40,
        ..Dt::data(100, 0)
    };
    dt_violation(rig, dt, &[0xab; 16])
}

fn dt_over_max_fragmented<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let mut p = negotiated_peer(rig, 16)?;
    let limit = p.negotiated.map_or(1 << 20, |n| n.max_fragmented_size);
    let dt = Dt {
        grant: Some(0),
        ..Dt::data(64, limit.saturating_sub(63))
    };
    let sent = Instant::now();
    p.send_dt(dt, &[0x11; 64])?;
    let mut o = terminated_silently(&mut p, sent, rig.timeout);
    o.text = format!(
        "DataLength 64 + RemainingDataLength {} = MaxFragmentedSize {limit} + 1: {}",
        limit.saturating_sub(63),
        o.text
    );
    Ok(o)
}

/// Two fragments: the first announces `remaining` bytes after its 100;
/// the second carries `second_len` bytes and says `second_remaining` are
/// left.
fn fragments<P: Provider>(rig: &Rig<P>, second_len: u32, second_remaining: u32) -> Outcome {
    let mut p = negotiated_peer(rig, 16)?;
    p.send_dt(
        Dt {
            grant: Some(0),
            ..Dt::data(100, 1000)
        },
        &[0x21; 100],
    )?;
    // The first fragment is fine: nothing may happen.
    if let Wait::Broken(b) = p.wait_message(Duration::from_millis(100)) {
        return Ok(Observation::fail(format!(
            "terminated after the first, valid fragment ({:?})",
            b.status
        )));
    }
    let sent = Instant::now();
    p.send_dt(
        Dt {
            grant: Some(0),
            ..Dt::data(second_len, second_remaining)
        },
        &vec![0x22; second_len as usize],
    )?;
    let mut o = terminated_silently(&mut p, sent, rig.timeout);
    o.text = format!(
        "100 + 1000 remaining, then {second_len} + {second_remaining} remaining: {}",
        o.text
    );
    Ok(o)
}

fn fragment_ends_early<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    fragments(rig, 100, 0)
}

fn fragment_no_countdown<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    fragments(rig, 100, 950)
}

fn fragment_overrun<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    fragments(rig, 1200, 0)
}

fn send_without_credit<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    // Ask for 4 credits: the server posts (about) that many receives and,
    // holding no send credit of its own, can post no more.
    let before = rig.stats();
    let mut p = negotiated_peer(rig, 4)?;
    let granted = p.send_credits;
    let sent = Instant::now();
    let mut n = 0;
    for _ in 0..granted + 32 {
        if p.broken().is_some() {
            break;
        }
        if p.send_dt(
            Dt {
                grant: Some(0),
                ..Dt::empty()
            },
            &[],
        )
        .is_err()
        {
            break;
        }
        n += 1;
        p.poll();
    }
    let mut o = terminated_silently(&mut p, sent, rig.timeout);
    o.text = format!(
        "{granted} credits granted, {n} empty messages sent granting none back: {}",
        o.text
    );
    if o.verdict == super::Verdict::Pass {
        let broke = p.broken().map_or_else(Instant::now, |b| b.at);
        drop(p);
        match server_released(rig, before, broke, rig.timeout) {
            Ok(t) => o.text.push_str(&format!("; {t}")),
            Err(t) => {
                o.verdict = super::Verdict::Fail;
                o.text.push_str(&format!("; but {t}"));
            }
        }
    }
    Ok(o)
}

// ---------------------------------------------------------------------------
// RDMA access

/// Bytes each RDMA case moves.
const RDMA_LEN: usize = 8192;

/// A connection on which the server can be asked to RDMA Read from, or
/// RDMA Write to, a descriptor of ours: an RDMA echo request (`--upper
/// echo`) or an SMB2 WRITE / READ with SMB2_CHANNEL_RDMA_V1.
enum RdmaSession<P: Provider> {
    Echo(Box<Client<P>>),
    Smb2(Box<Smb2Peer<P>>, FileId),
}

/// Our buffers and grants, given back when the case ends.
impl<P: Provider> RdmaSession<P> {
    fn open(rig: &mut Rig<P>) -> Result<Self, String> {
        match rig.upper {
            Upper::Echo => Ok(RdmaSession::Echo(Box::new(rig.client()?))),
            Upper::Smb2 => {
                let (mut s, fid) = Smb2Peer::with_file(rig, "rdma")?;
                s.write_inline(fid, 0, &[0x5au8; RDMA_LEN])?;
                Ok(RdmaSession::Smb2(Box::new(s), fid))
            }
        }
    }

    fn client(&mut self) -> &mut Client<P> {
        match self {
            RdmaSession::Echo(c) => c,
            RdmaSession::Smb2(s, _) => s.client_mut(),
        }
    }

    /// A fresh buffer of [`RDMA_LEN`] bytes with `access` granted over its
    /// first `len` bytes.
    fn grant(
        &mut self,
        g: &mut Grants,
        len: usize,
        access: Access,
    ) -> Result<BufferDescriptorRepr, String> {
        g.grant(self.client(), RDMA_LEN, len, access)
    }

    /// Asks the server to RDMA Read `len` bytes from `d`.
    fn server_reads(
        &mut self,
        g: &mut Grants,
        d: BufferDescriptorRepr,
        len: u32,
    ) -> Result<(), String> {
        match self {
            RdmaSession::Echo(_) => {
                let w = self.grant(g, len as usize, Access::RemoteWrite)?;
                let req = rdma_echo_request(len, &[d.to_bytes()], &[w.to_bytes()], 0);
                self.client().send(&req).map_err(|e| format!("send: {e}"))
            }
            RdmaSession::Smb2(s, fid) => {
                let descs = [d];
                let req = WriteRequestRepr {
                    offset: 0,
                    file_id: *fid,
                    channel: Channel::RdmaV1,
                    remaining_bytes: len,
                    flags: WriteFlags::empty(),
                    data: &[],
                    channel_info: ChannelInfo::descriptors(&descs),
                };
                let bytes = s.build(Command::Write, 1, &req)?;
                s.send(&bytes)
            }
        }
    }

    /// Asks the server to RDMA Write `len` bytes into `d`.
    fn server_writes(
        &mut self,
        g: &mut Grants,
        d: BufferDescriptorRepr,
        len: u32,
    ) -> Result<(), String> {
        match self {
            RdmaSession::Echo(_) => {
                let r = self.grant(g, len as usize, Access::RemoteRead)?;
                let req = rdma_echo_request(len, &[r.to_bytes()], &[d.to_bytes()], 0);
                self.client().send(&req).map_err(|e| format!("send: {e}"))
            }
            RdmaSession::Smb2(s, fid) => {
                let descs = [d];
                let req = ReadRequestRepr {
                    padding: 0x50,
                    flags: ReadFlags::empty(),
                    length: len,
                    offset: 0,
                    file_id: *fid,
                    minimum_count: 0,
                    channel: Channel::RdmaV1,
                    remaining_bytes: 0,
                    channel_info: ChannelInfo::descriptors(&descs),
                };
                let bytes = s.build(Command::Read, 1, &req)?;
                s.send(&bytes)
            }
        }
    }

    /// After a request naming memory the server may not touch: the
    /// connection must end without a reply.
    fn expect_terminated(&mut self, sent: Instant, timeout: Duration) -> Observation {
        let reply = match self {
            RdmaSession::Echo(c) => match c.recv_with(timeout, |m| m.to_vec()) {
                Ok(m) => Err(match parse_rdma_done(&m) {
                    Some((st, n)) => format!("RDMADONE {st}, {n} bytes"),
                    None => format!("a {}-byte message", m.len()),
                }),
                Err(smbdirect_dataplane::client::ClientError::Timeout(_)) => Err("nothing".into()),
                Err(e) => Ok(e.to_string()),
            },
            RdmaSession::Smb2(s, _) => match s.recv(timeout) {
                Reply::Closed(e) => Ok(e),
                other => Err(other.describe()),
            },
        };
        match reply {
            Ok(why) => Observation::pass(format!(
                "connection terminated {} after the request, no reply ({why})",
                ms(sent.elapsed())
            )),
            Err(got) => Observation::fail(format!(
                "the connection was not terminated: {got} within {timeout:?}"
            )),
        }
    }

    /// A full RDMA round trip with valid grants (the control of the
    /// foreign-token case).
    fn round_trip(&mut self, g: &mut Grants, timeout: Duration) -> Result<(), String> {
        let w = self.grant(g, RDMA_LEN, Access::RemoteWrite)?;
        self.server_writes(g, w, RDMA_LEN as u32)?;
        match self {
            RdmaSession::Echo(c) => {
                let m = c
                    .recv_with(timeout, |m| m.to_vec())
                    .map_err(|e| format!("RDMA echo: {e}"))?;
                match parse_rdma_done(&m) {
                    Some((st, n)) if st.0 == 0 && n as usize == RDMA_LEN => Ok(()),
                    other => Err(format!("RDMA echo answered {other:?}")),
                }
            }
            RdmaSession::Smb2(s, _) => match s.recv(timeout) {
                Reply::Response(r) if r.header.status.0 == 0 => Ok(()),
                other => Err(format!("READ by RDMA: {}", other.describe())),
            },
        }
    }

    fn close(mut self, mut g: Grants) {
        g.release(self.client());
        match self {
            RdmaSession::Echo(c) => {
                let _ = c.close(Duration::from_secs(2));
            }
            RdmaSession::Smb2(s, _) => s.close(),
        }
    }
}

/// Opens a session, lets `hostile` send one request naming memory the
/// server may not access, and expects the connection to end.
fn rdma_case<P: Provider>(
    rig: &mut Rig<P>,
    hostile: impl FnOnce(&mut RdmaSession<P>, &mut Grants) -> Result<String, String>,
) -> Outcome {
    let mut s = RdmaSession::open(rig)?;
    let mut g = Grants::default();
    let sent = Instant::now();
    let what = match hostile(&mut s, &mut g) {
        Ok(w) => w,
        Err(e) => {
            s.close(g);
            return Err(e);
        }
    };
    let mut o = s.expect_terminated(sent, rig.timeout);
    o.text = format!("{what}: {}", o.text);
    s.close(g);
    Ok(o)
}

fn rdma_wrong_token<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    rdma_case(rig, |s, g| {
        let mut d = s.grant(g, RDMA_LEN, Access::RemoteRead)?;
        d.token ^= 0x00a5_5a00;
        s.server_reads(g, d, RDMA_LEN as u32)?;
        Ok(format!(
            "descriptor token {:#010x} (not the grant's)",
            d.token
        ))
    })
}

fn rdma_revoked_token<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    rdma_case(rig, |s, g| {
        let d = s.grant(g, RDMA_LEN, Access::RemoteRead)?;
        s.client()
            .revoke(d.token)
            .map_err(|e| format!("revoke: {e}"))?;
        // Settle the revoke's completion before the request goes out.
        let _ = s.client().step(&mut |_, _| {});
        s.server_reads(g, d, RDMA_LEN as u32)?;
        Ok(format!(
            "descriptor token {:#010x} revoked before the request",
            d.token
        ))
    })
}

fn rdma_wrong_direction<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    rdma_case(rig, |s, g| {
        let d = s.grant(g, RDMA_LEN, Access::RemoteWrite)?;
        s.server_reads(g, d, RDMA_LEN as u32)?;
        Ok("descriptor granted RemoteWrite only, server asked to read it".into())
    })
}

fn rdma_beyond_grant<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    rdma_case(rig, |s, g| {
        let mut d = s.grant(g, RDMA_LEN / 2, Access::RemoteWrite)?;
        d.length = RDMA_LEN as u32;
        s.server_writes(g, d, RDMA_LEN as u32)?;
        Ok(format!(
            "{} bytes granted, descriptor claims {}",
            RDMA_LEN / 2,
            RDMA_LEN
        ))
    })
}

fn rdma_other_connection<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let mut owner = RdmaSession::open(rig)?;
    let mut og = Grants::default();
    let d = match owner.grant(&mut og, RDMA_LEN, Access::RemoteRead) {
        Ok(d) => d,
        Err(e) => {
            owner.close(og);
            return Err(e);
        }
    };
    let o = rdma_case(rig, |s, g| {
        s.server_reads(g, d, RDMA_LEN as u32)?;
        Ok(format!(
            "token {:#010x} granted on another connection",
            d.token
        ))
    });
    let control = owner.round_trip(&mut og, rig.timeout.max(Duration::from_secs(5)));
    owner.close(og);
    let mut o = o?;
    match control {
        Ok(()) => o
            .text
            .push_str("; the granting connection still completes an RDMA round trip"),
        Err(e) => {
            o.verdict = super::Verdict::Fail;
            o.text
                .push_str(&format!("; but the granting connection was harmed: {e}"));
        }
    }
    Ok(o)
}

// ---------------------------------------------------------------------------
// Random bytes

/// xorshift64*: deterministic bytes from a seed.
fn next_random(x: &mut u64) -> u64 {
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    x.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// Which 3.1.5.8 check `msg` fails, if any (the receiver's limits given).
fn data_transfer_violation(msg: &[u8], max_fragmented: u32) -> Option<&'static str> {
    let Ok(v) = DataTransfer::new_checked(msg) else {
        return Some("shorter than 20 bytes");
    };
    let (off, len) = (u64::from(v.data_offset()), u64::from(v.data_length()));
    if v.credits_requested() == 0 {
        Some("CreditsRequested 0")
    } else if off % 8 != 0 {
        Some("DataOffset not 8-byte aligned")
    } else if len != 0 && off < 20 {
        Some("DataOffset inside the header")
    } else if off + len > msg.len() as u64 {
        Some("DataOffset + DataLength beyond the message")
    } else if len + u64::from(v.remaining_data_length()) > u64::from(max_fragmented) {
        Some("DataLength + RemainingDataLength over MaxFragmentedSize")
    } else {
        None
    }
}

/// Random bytes hit the first check (DataOffset alignment) 7 times in 8;
/// every other trial keeps some fields plausible so that the later checks
/// of 3.1.5.8 are reached too: odd trials align DataOffset, every fourth
/// places the payload at 24 and inside the message (so only the
/// fragment-size rule, or nothing, is left to fail).
fn shape_random(msg: &mut [u8], trial: usize) {
    if msg.len() < 20 {
        return;
    }
    if trial % 2 == 1 {
        msg[12] &= !7;
    }
    if trial % 4 == 3 {
        let room = (msg.len().saturating_sub(24)) as u32;
        let len = u32::from_le_bytes([msg[16], msg[17], msg[18], msg[19]]) % room.max(1);
        msg[12..16].copy_from_slice(&24u32.to_le_bytes());
        msg[16..20].copy_from_slice(&len.to_le_bytes());
    }
}

fn random_bytes<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    const TRIALS: usize = 8;
    let mut bystander = rig.healthy()?;
    bystander.round_trip(rig.timeout)?;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ rig.next_seq().wrapping_mul(0x1000_0000_01b3);
    let mut kinds = Vec::new();
    for trial in 0..TRIALS {
        let mut p = negotiated_peer(rig, 8)?;
        let n = p.negotiated.unwrap_or(NegotiateResponseRepr {
            min_version: 0,
            max_version: 0,
            negotiated_version: 0,
            credits_requested: 0,
            credits_granted: 0,
            status: smbdirect_protocol::ntstatus::STATUS_SUCCESS,
            max_read_write_size: 0,
            preferred_send_size: 0,
            max_receive_size: 128,
            max_fragmented_size: 131_072,
        });
        let (msg, why) = loop {
            let len = 1 + (next_random(&mut seed) % u64::from(n.max_receive_size.max(1))) as usize;
            let mut msg: Vec<u8> = (0..len).map(|_| next_random(&mut seed) as u8).collect();
            shape_random(&mut msg, trial);
            if let Some(why) = data_transfer_violation(&msg, n.max_fragmented_size) {
                break (msg, why);
            }
        };
        let sent = Instant::now();
        p.send_raw(&msg)?;
        let o = terminated_silently(&mut p, sent, rig.timeout);
        drop(p);
        if o.verdict != super::Verdict::Pass {
            let head: String = msg.iter().take(24).map(|b| format!("{b:02x}")).collect();
            return Ok(Observation::fail(format!(
                "trial {trial}: {} random bytes ({why}; first bytes {head}): {}",
                msg.len(),
                o.text
            )));
        }
        kinds.push(why);
        bystander.idle_step()?;
    }
    let rtt = bystander.round_trip(rig.timeout)?;
    bystander.close();
    kinds.sort_unstable();
    kinds.dedup();
    Ok(Observation::pass(format!(
        "{TRIALS} connections sent random bytes ({}): each terminated with nothing received; the bystander's round trip took {}",
        kinds.join(", "),
        ms(rtt)
    )))
}
