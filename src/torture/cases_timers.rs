//! Timer and credit-abuse cases: a peer that never negotiates, one that
//! goes quiet, one that floods keepalive requests, one that never grants
//! the server a credit, one that vanishes mid-message, one that asks for
//! 65535 credits ([MS-SMBD] 3.1.5.1, 3.1.5.8, 3.1.5.9, 3.1.6). Keepalive
//! cases need the server's interval (`--keepalive-interval`): they check
//! the server's timing against it, and are skipped without it.

use super::cases_smbd::{ms, server_released};
use super::raw_peer::{negotiate_request, Dt, RawPeer, Wait};
use super::rig::{idle, Rig, Upper};
use super::smb2_peer::negotiate_request_bytes;
use super::{Case, Layer, Observation};
use smbdirect_dataplane::provider::Provider;
use smbdirect_protocol::smb2::{Command, EchoRequestRepr, HeaderRepr};
use smbdirect_protocol::smbd::wire::{DataTransfer, SMB_DIRECT_RESPONSE_REQUESTED};
use std::time::{Duration, Instant};

type Outcome = Result<Observation, String>;

/// [MS-SMBD] 3.1.7.2: the passive side's Negotiation Timer.
const NEGOTIATION_TIMER: Duration = Duration::from_secs(5);
/// [MS-SMBD] note <3>: how long a peer has to answer a keepalive request.
const KEEPALIVE_ANSWER: Duration = Duration::from_secs(5);
/// Slack allowed after a timer's expiry (polling, and scheduling on
/// shared cores: a busy host delays a wake-up by a second or more; a
/// timer running at the wrong interval is still far outside it).
const SLACK: Duration = Duration::from_secs(3);

pub(super) fn cases<P: Provider>() -> Vec<Case<P>> {
    vec![
        Case {
            name: "silent-peer-dropped-by-the-negotiation-timer",
            layer: Layer::Smbd,
            rule: "[MS-SMBD] 3.1.7.2 (5 s Negotiation Timer), 3.1.6.1",
            expected: "a peer that connects and never sends its Negotiate Request is disconnected 5 s after it connected",
            run: silent_peer::<P>,
        },
        Case {
            name: "idle-peer-keepalive-answered-or-dropped",
            layer: Layer::Smbd,
            rule: "[MS-SMBD] 3.1.6.2, 3.1.5.1, note <3>",
            expected: "after KeepaliveInterval of silence the server sends SMB_DIRECT_RESPONSE_REQUESTED; a peer that answers stays connected, a peer that never answers is disconnected about 5 s after the request",
            run: keepalive::<P>,
        },
        Case {
            name: "keepalive-request-flood",
            layer: Layer::Smbd,
            rule: "[MS-SMBD] 3.1.5.8 (answer SMB_DIRECT_RESPONSE_REQUESTED promptly), 3.1.5.1",
            expected: "keepalive requests sent as fast as credits allow are answered, the flooder stays connected, and another connection is not starved (at least 10 round trips in 2 s, median under 50 ms)",
            run: keepalive_flood::<P>,
        },
        Case {
            name: "peer-never-grants-credits",
            layer: Layer::Smbd,
            rule: "[MS-SMBD] 3.1.5.1 (no Send without a credit), 3.1.6.2 (docs/spec-notes.md: Keepalive that cannot be sent)",
            expected: "the server sends nothing to a peer that granted it no credit (its requests stay queued), other connections are unaffected, and the keepalive timer ends it after KeepaliveInterval + 5 s",
            run: never_grants::<P>,
        },
        Case {
            name: "peer-stops-mid-fragment-and-disconnects",
            layer: Layer::Smbd,
            rule: "[MS-SMBD] 3.1.7.1, 3.1.5.8 (reassembly)",
            expected: "the server drops the half-reassembled message with the connection and releases it; other connections are unaffected",
            run: stops_mid_fragment::<P>,
        },
        Case {
            name: "peer-requests-65535-credits",
            layer: Layer::Smbd,
            rule: "[MS-SMBD] 3.1.5.6, 3.1.5.9 (receives posted up to min(ReceiveCreditTarget, ReceiveCreditMax))",
            expected: "negotiation succeeds; every credit granted is backed by a posted receive (that many back-to-back messages are accepted); the connection keeps working",
            run: credits_65535::<P>,
        },
    ]
}

fn skip_without_interval() -> Observation {
    Observation::skip(
        "needs the server's keepalive interval: pass --keepalive-interval SECS (serve's value; \
         the default 120 s would make this case wait minutes)",
    )
}

fn silent_peer<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    // From before the connect: the server's timer starts at its accept,
    // which the connect waits for.
    let t0 = Instant::now();
    let mut p = RawPeer::connect(rig, 2)?;
    Ok(
        match p.wait_broken(NEGOTIATION_TIMER + SLACK + rig.timeout) {
            Ok((b, msgs)) => {
                let after = b.at.saturating_duration_since(t0);
                let ok = msgs.is_empty() && on_time(after, NEGOTIATION_TIMER);
                Observation::judge(
                    ok,
                    format!(
                        "disconnected {:.2} s after connecting ({:?}), {} message(s) received",
                        after.as_secs_f64(),
                        b.status,
                        msgs.len()
                    ),
                )
            }
            Err(_) => Observation::fail(format!(
                "still connected {:?} after connecting without a Negotiate Request",
                NEGOTIATION_TIMER + SLACK + rig.timeout
            )),
        },
    )
}

/// A negotiated peer that granted the server credits once (an empty
/// message), so the server can send it keepalive requests.
fn granted_peer<P: Provider>(rig: &Rig<P>) -> Result<(RawPeer<P>, Instant), String> {
    let mut p = RawPeer::negotiated(rig, 16, negotiate_request(16))?;
    p.send_dt(Dt::empty(), &[])?;
    Ok((p, Instant::now()))
}

/// Whether `after` is the timer's `interval`: at most a second early (we
/// time events from our side, and a busy host delays when we notice the
/// one that starts the timer), at most [`SLACK`] late.
fn on_time(after: Duration, interval: Duration) -> bool {
    after + Duration::from_secs(1) >= interval && after <= interval + SLACK
}

/// True when `m` carries SMB_DIRECT_RESPONSE_REQUESTED.
fn is_keepalive_request(m: &[u8]) -> bool {
    DataTransfer::new_checked(m).is_ok_and(|v| v.flags() & SMB_DIRECT_RESPONSE_REQUESTED != 0)
}

/// Two idle peers side by side: one answers every keepalive request, the
/// other never does.
fn keepalive<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let Some(interval) = rig.keepalive else {
        return Ok(skip_without_interval());
    };
    let (mut answers, ta) = granted_peer(rig)?;
    let (mut silent, tb) = granted_peer(rig)?;
    let deadline = tb + interval + KEEPALIVE_ANSWER + SLACK + rig.timeout;
    let (mut first, mut answered) = (None::<Instant>, 0u32);
    let (mut request, mut other) = (None::<Instant>, 0usize);
    while Instant::now() < deadline {
        answers.poll();
        for m in answers.take_inbox() {
            if is_keepalive_request(&m) {
                first.get_or_insert_with(Instant::now);
                answers.send_dt(Dt::empty(), &[])?;
                answered += 1;
            }
        }
        silent.poll();
        for m in silent.take_inbox() {
            if is_keepalive_request(&m) {
                request.get_or_insert_with(Instant::now);
            } else {
                other += 1;
            }
        }
        // Done once the silent one is gone and the answering one has
        // outlived the 5 s it would have had without answers.
        let outlived =
            first.is_some_and(|f| f.elapsed() >= KEEPALIVE_ANSWER + Duration::from_millis(500));
        if (silent.broken().is_some() && outlived) || answers.broken().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    let secs = |d: Duration| format!("{:.2} s", d.as_secs_f64());
    let mut problems = Vec::new();
    let a_text = match first {
        Some(f) => {
            let after = f.saturating_duration_since(ta);
            if !on_time(after, interval) {
                problems.push("the first keepalive request was not on time");
            }
            if answers.broken().is_some() {
                problems.push("the answering peer was disconnected");
            }
            format!(
                "answering peer: first request {} after its last message, {answered} answered, {} after the first",
                secs(after),
                match answers.broken() {
                    Some(b) => format!("disconnected ({:?}) {}", b.status, secs(b.at.saturating_duration_since(f))),
                    None => format!("still connected {}", secs(f.elapsed())),
                }
            )
        }
        None => {
            problems.push("the answering peer got no keepalive request");
            "answering peer: no keepalive request".into()
        }
    };
    let b_text = match request {
        Some(r) => {
            let after = r.saturating_duration_since(tb);
            if !on_time(after, interval) {
                problems.push("the silent peer's keepalive request was not on time");
            }
            match silent.broken() {
                Some(b) => {
                    let dropped = b.at.saturating_duration_since(r);
                    if !on_time(dropped, KEEPALIVE_ANSWER) {
                        problems.push("the silent peer was not disconnected 5 s after the request");
                    }
                    format!(
                        "silent peer: request {} after its last message, disconnected {} after it",
                        secs(after),
                        secs(dropped)
                    )
                }
                None => {
                    problems.push("the silent peer was never disconnected");
                    format!(
                        "silent peer: request {} after its last message, still connected {} after it",
                        secs(after),
                        secs(r.elapsed())
                    )
                }
            }
        }
        None => {
            problems.push("the silent peer got no keepalive request");
            "silent peer: no keepalive request".into()
        }
    };
    if other > 0 {
        problems.push("the silent peer got other messages");
    }
    let text = format!("interval {} s; {a_text}; {b_text}", interval.as_secs());
    Ok(if problems.is_empty() {
        Observation::pass(text)
    } else {
        Observation::fail(format!("{}: {text}", problems.join(", ")))
    })
}

fn keepalive_flood<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    const FLOOD: Duration = Duration::from_secs(2);
    /// A bystander whose median round trip during the flood is slower than
    /// this is starved (the median, not the maximum: a busy shared host
    /// stalls every process now and then, flooder and bystander alike).
    const STARVED: Duration = Duration::from_millis(50);
    /// Round trips the bystander must complete during the flood.
    const MIN_ROUND_TRIPS: usize = 10;
    /// The flood runs in bursts this long, each followed by one bystander
    /// round trip. Without the bound a server fast enough to hand credits
    /// back as quickly as they are spent keeps a burst going for hundreds
    /// of milliseconds, and the bystander's count would measure this loop
    /// rather than the server (CI saw 5 round trips in 2.3 s, each 0.2 ms).
    const BURST: Duration = Duration::from_millis(20);
    let mut bystander = rig.healthy()?;
    let (mut p, _) = granted_peer(rig)?;
    let t0 = Instant::now();
    let (mut sent, mut rtts) = (0u64, Vec::new());
    while t0.elapsed() < FLOOD {
        // Spend every credit but the last on keepalive requests (3.1.5.1:
        // the last one only with a grant, which `send_dt` adds).
        let burst = Instant::now();
        while p.send_credits > 1 && p.broken().is_none() && burst.elapsed() < BURST {
            p.send_dt(Dt::keepalive(), &[])?;
            sent += 1;
            p.poll();
        }
        for _ in 0..64 {
            p.poll();
        }
        if let Some(b) = p.broken() {
            return Ok(Observation::fail(format!(
                "the flooding peer was disconnected ({:?}) after {sent} keepalive requests",
                b.status
            )));
        }
        rtts.push(bystander.round_trip(rig.timeout)?);
    }
    // The last request must still be answered promptly.
    let before = p.received;
    while p.send_credits < 1 && p.broken().is_none() && t0.elapsed() < FLOOD + rig.timeout {
        p.poll();
    }
    p.send_dt(Dt::keepalive(), &[])?;
    sent += 1;
    let deadline = Instant::now() + rig.timeout;
    while p.received == before && Instant::now() < deadline && p.broken().is_none() {
        p.poll();
    }
    let answered_last = p.received > before;
    let _ = p.take_inbox();
    bystander.close();
    rtts.sort_unstable();
    let max = rtts.last().copied().unwrap_or_default();
    let p50 = rtts.get(rtts.len() / 2).copied().unwrap_or_default();
    let ok =
        answered_last && p.broken().is_none() && rtts.len() >= MIN_ROUND_TRIPS && p50 < STARVED;
    Ok(Observation::judge(
        ok,
        format!(
            "{sent} keepalive requests in {:.1} s, {} messages back{}; a bystander completed {} round trips meanwhile (median {}, max {})",
            t0.elapsed().as_secs_f64(),
            p.received,
            if answered_last { "" } else { ", the last request NOT answered" },
            rtts.len(),
            ms(p50),
            ms(max)
        ),
    ))
}

/// What a peer sends to the server's upper layer as requests: an echo
/// payload, or SMB2 NEGOTIATE then ECHOs (MessageIds 0, 1, ...).
fn upper_requests(upper: Upper, n: usize) -> Result<Vec<Vec<u8>>, String> {
    (0..n)
        .map(|i| match upper {
            Upper::Echo => {
                Ok(format!("torture request {i} that will wait for a credit").into_bytes())
            }
            Upper::Smb2 if i == 0 => Ok(negotiate_request_bytes(0)),
            Upper::Smb2 => {
                let mut h = HeaderRepr::request(Command::Echo, i as u64);
                h.credit = 8;
                super::smb2_peer::message_bytes(&h, &EchoRequestRepr)
            }
        })
        .collect()
}

fn never_grants<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let mut bystander = rig.healthy()?;
    let mut p = RawPeer::negotiated(rig, 16, negotiate_request(16))?;
    let k = (p.send_credits as usize).clamp(1, 4);
    for req in upper_requests(rig.upper, k)? {
        let dt = Dt {
            grant: Some(0),
            ..Dt::data(req.len() as u32, 0)
        };
        p.send_dt(dt, &req)?;
    }
    let last = Instant::now();
    // The server holds no send credit: nothing may arrive, and others go on.
    let quiet = Duration::from_secs(1);
    let mut peers = [&mut bystander];
    idle(&mut peers, quiet)?;
    let rtt = bystander.round_trip(rig.timeout)?;
    let early = p.take_inbox();
    p.poll();
    if !early.is_empty() {
        bystander.close();
        return Ok(Observation::fail(format!(
            "{} message(s) arrived although the peer granted no credit",
            early.len() + p.take_inbox().len()
        )));
    }
    let Some(interval) = rig.keepalive else {
        bystander.close();
        return Ok(Observation::pass(format!(
            "{k} requests sent granting no credit: nothing came back in {:.1} s, a bystander's round trip took {} (keepalive interval not given: the timer's end of the connection was not awaited)",
            last.elapsed().as_secs_f64(),
            ms(rtt)
        )));
    };
    // The server's keepalive cannot be sent either: 3.1.6.2 ends it.
    let expect = interval + KEEPALIVE_ANSWER;
    let wait = (expect + SLACK + rig.timeout).saturating_sub(last.elapsed());
    let deadline = Instant::now() + wait;
    let mut broke = None;
    while Instant::now() < deadline {
        let mut peers = [&mut bystander];
        idle(&mut peers, Duration::from_millis(20))?;
        p.poll();
        if let Some(b) = p.broken() {
            broke = Some(b);
            break;
        }
    }
    let msgs = p.take_inbox();
    bystander.close();
    Ok(match broke {
        Some(b) => {
            let after = b.at.saturating_duration_since(last);
            Observation::judge(
                msgs.is_empty() && on_time(after, expect),
                format!(
                    "{k} requests sent granting no credit: nothing came back; disconnected {:.2} s after the last (interval {} s + 5 s), {} message(s) received; a bystander's round trip took {}",
                    after.as_secs_f64(),
                    interval.as_secs(),
                    msgs.len(),
                    ms(rtt)
                ),
            )
        }
        None => Observation::fail(format!(
            "{k} requests sent granting no credit: still connected {:.1} s later ({} message(s) received)",
            last.elapsed().as_secs_f64(),
            msgs.len()
        )),
    })
}

fn stops_mid_fragment<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let before = rig.stats();
    let mut p = RawPeer::negotiated(rig, 16, negotiate_request(16))?;
    // The first 1000 bytes of a 100 000-byte message, then nothing more.
    p.send_dt(Dt::data(1000, 99_000), &[0x33; 1000])?;
    if let Wait::Broken(b) = p.wait_message(Duration::from_millis(100)) {
        return Ok(Observation::fail(format!(
            "terminated after a valid first fragment ({:?})",
            b.status
        )));
    }
    let gone = Instant::now();
    p.disconnect();
    drop(p);
    let mut bystander = rig.healthy()?;
    let rtt = bystander.round_trip(rig.timeout)?;
    bystander.close();
    Ok(match server_released(rig, before, gone, rig.timeout) {
        Ok(t) => Observation::pass(format!(
            "disconnected after the first of 100 000 bytes; {t}; a fresh connection's round trip took {}",
            ms(rtt)
        )),
        Err(t) => Observation::fail(format!(
            "disconnected after the first of 100 000 bytes; {t}"
        )),
    })
}

fn credits_65535<P: Provider>(rig: &mut Rig<P>) -> Outcome {
    let mut p = RawPeer::negotiated(rig, 64, negotiate_request(65535))?;
    let granted = p.send_credits;
    if granted == 0 {
        return Ok(Observation::fail("negotiated with CreditsGranted 0"));
    }
    // Spend every credit back to back; the first grants our receives.
    let sent = Instant::now();
    let g = granted;
    for i in 0..g {
        let dt = Dt {
            credits_requested: 65535,
            ..Dt::empty()
        };
        if let Err(e) = p.send_dt(dt, &[]) {
            return Ok(Observation::fail(format!("message {i} of {g}: {e}")));
        }
    }
    if let Wait::Broken(b) = p.wait_message(Duration::from_millis(200)) {
        return Ok(Observation::fail(format!(
            "CreditsGranted {g}; sending {g} messages broke the connection ({:?}) {} after the first: a granted credit had no posted receive",
            b.status,
            ms(b.at.saturating_duration_since(sent))
        )));
    }
    // Holding no credit now, we must be granted more (3.1.5.8), and a
    // keepalive request must be answered.
    let deadline = Instant::now() + rig.timeout;
    while p.send_credits == 0 && p.broken().is_none() && Instant::now() < deadline {
        p.poll();
    }
    if p.send_credits == 0 {
        return Ok(Observation::fail(format!(
            "CreditsGranted {g}; after spending them no credit was granted back in {:?}",
            rig.timeout
        )));
    }
    let refill = p.send_credits;
    let before = p.received;
    p.send_dt(
        Dt {
            credits_requested: 65535,
            ..Dt::keepalive()
        },
        &[],
    )?;
    let deadline = Instant::now() + rig.timeout;
    while p.received == before && p.broken().is_none() && Instant::now() < deadline {
        p.poll();
    }
    let answered = p.received > before && p.broken().is_none();
    Ok(Observation::judge(
        answered,
        format!(
            "CreditsGranted {g} for 65535 requested; {g} back-to-back messages accepted; {refill} credit(s) granted back; keepalive request {}",
            if answered { "answered" } else { "NOT answered" }
        ),
    ))
}
