//! The protocol core end to end, in one thread: an active and a passive
//! [MS-SMBD] connection exchange upper-layer messages through an in-memory
//! reliable-connected transport that is as strict as the soft provider
//! (a send that finds no posted receive at the peer is an RNR failure). The
//! passive side echoes every message. This measures what the sans-IO state
//! machines cost per round trip — it is not a network benchmark; `bench`
//! (issue 6) measures the providers.

use hdrhistogram::Histogram;
use smbdirect_protocol::smbd::{
    Connection, MessageData, Receive, ReceivePoster, SmbdConfig, Transmit, MAX_HEADER_LEN,
};
use smbdirect_protocol::time::Instant as PInstant;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Receive buffers posted by one side: the strict transport refuses a send
/// that finds none.
#[derive(Debug, Default)]
struct Posted {
    count: u64,
}

impl ReceivePoster for Posted {
    fn post_receives(&mut self, want: u16) -> u16 {
        self.count += want as u64;
        want
    }
}

/// One side of the loopback.
#[derive(Debug)]
struct Side {
    conn: Connection,
    posted: Posted,
    /// Upper-layer messages by handle (the bytes the connection refers to).
    outgoing: VecDeque<(u64, Vec<u8>)>,
    next_handle: u64,
}

/// Results of a run.
#[derive(Debug)]
pub struct LoopbackReport {
    /// Round-trip latency in nanoseconds.
    pub histogram: Histogram<u64>,
    /// Round trips completed.
    pub round_trips: u64,
    /// Payload bytes each way.
    pub bytes: u64,
    /// Wall time of the measured phase.
    pub elapsed: Duration,
    /// Empty (credit-only or keepalive) messages sent by client / server.
    pub empty_messages: (u64, u64),
    /// Credit stalls seen by client / server.
    pub credit_stalls: (u64, u64),
}

fn clock(origin: Instant) -> PInstant {
    PInstant::from_nanos(origin.elapsed().as_nanos() as u64)
}

/// Moves every pending transmit from `from` into `wire`, gathering payloads.
fn flush(from: &mut Side, now: PInstant, wire: &mut VecDeque<Vec<u8>>) {
    let mut hdr = [0u8; MAX_HEADER_LEN];
    while let Some(t) = from.conn.poll_transmit(now, &mut from.posted, &mut hdr) {
        wire.push_back(assemble(&t, &hdr, &mut from.outgoing));
    }
}

fn assemble(t: &Transmit, hdr: &[u8], outgoing: &mut VecDeque<(u64, Vec<u8>)>) -> Vec<u8> {
    let mut msg = Vec::with_capacity(t.len());
    msg.extend_from_slice(&hdr[..t.header_len]);
    if let Some(p) = t.payload {
        let (h, bytes) = outgoing.front().expect("payload of a queued message");
        debug_assert_eq!(*h, p.handle);
        msg.extend_from_slice(&bytes[p.offset as usize..(p.offset + p.len) as usize]);
        if p.last {
            outgoing.pop_front();
        }
    }
    msg
}

/// Delivers `wire` to `to`; returns the upper-layer messages it completed.
fn deliver(
    to: &mut Side,
    now: PInstant,
    wire: &mut VecDeque<Vec<u8>>,
) -> Result<Vec<Vec<u8>>, String> {
    let mut out = Vec::new();
    while let Some(msg) = wire.pop_front() {
        if to.posted.count == 0 {
            return Err("RNR: a message arrived with no receive posted".into());
        }
        to.posted.count -= 1;
        match to.conn.handle_receive(now, &msg, None, &mut to.posted) {
            Ok(Receive::Message {
                data: MessageData::InPlace(r),
                ..
            }) => out.push(msg[r].to_vec()),
            Ok(Receive::Message {
                data: MessageData::Reassembled,
                ..
            }) => out.push(to.conn.reassembled().to_vec()),
            Ok(_) => {}
            Err(e) => return Err(format!("connection terminated: {e}")),
        }
    }
    Ok(out)
}

/// Runs `warmup` then `duration` of echo round trips of `size` bytes.
pub fn run(
    cfg: SmbdConfig,
    size: usize,
    warmup: Duration,
    duration: Duration,
) -> Result<LoopbackReport, String> {
    cfg.validate().map_err(|e| e.to_string())?;
    let origin = Instant::now();
    let mut client = Side {
        conn: Connection::new_active(cfg.clone(), clock(origin)),
        posted: Posted { count: 1 },
        outgoing: VecDeque::new(),
        next_handle: 0,
    };
    let mut server = Side {
        conn: Connection::new_passive(cfg, clock(origin)),
        posted: Posted { count: 1 },
        outgoing: VecDeque::new(),
        next_handle: 0,
    };
    let mut c2s = VecDeque::new();
    let mut s2c = VecDeque::new();
    // Negotiate.
    flush(&mut client, clock(origin), &mut c2s);
    deliver(&mut server, clock(origin), &mut c2s)?;
    flush(&mut server, clock(origin), &mut s2c);
    deliver(&mut client, clock(origin), &mut s2c)?;
    if !client.conn.is_established() || !server.conn.is_established() {
        return Err("negotiation did not complete".into());
    }
    let payload: Vec<u8> = (0..size).map(|i| (i * 31 + 7) as u8).collect();
    let mut hist =
        Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).map_err(|e| e.to_string())?;
    let mut round_trips = 0u64;
    let start = Instant::now();
    let mut measured_from = None;
    loop {
        let elapsed = start.elapsed();
        if elapsed >= warmup + duration {
            break;
        }
        if measured_from.is_none() && elapsed >= warmup {
            measured_from = Some(Instant::now());
            hist.reset();
            round_trips = 0;
        }
        let t0 = Instant::now();
        let h = client.next_handle;
        client.next_handle += 1;
        client.outgoing.push_back((h, payload.clone()));
        client
            .conn
            .send(h, size as u32, None)
            .map_err(|e| e.to_string())?;
        let mut echoed = None;
        for _ in 0..1_000_000 {
            let now = clock(origin);
            flush(&mut client, now, &mut c2s);
            for m in deliver(&mut server, now, &mut c2s)? {
                let h = server.next_handle;
                server.next_handle += 1;
                let len = m.len() as u32;
                server.outgoing.push_back((h, m));
                server.conn.send(h, len, None).map_err(|e| e.to_string())?;
            }
            flush(&mut server, now, &mut s2c);
            if let Some(m) = deliver(&mut client, now, &mut s2c)?.pop() {
                echoed = Some(m);
            }
            if echoed.is_some() && c2s.is_empty() && s2c.is_empty() {
                break;
            }
        }
        let m = echoed.ok_or("round trip did not complete (deadlock)")?;
        if m != payload {
            return Err("echoed bytes differ from what was sent".into());
        }
        hist.saturating_record(t0.elapsed().as_nanos().max(1) as u64);
        round_trips += 1;
    }
    let elapsed = measured_from.map_or(Duration::ZERO, |t| t.elapsed());
    Ok(LoopbackReport {
        histogram: hist,
        round_trips,
        bytes: round_trips * size as u64,
        elapsed,
        empty_messages: (
            client.conn.stats().empty_sent,
            server.conn.stats().empty_sent,
        ),
        credit_stalls: (
            client.conn.stats().credit_stalls,
            server.conn.stats().credit_stalls,
        ),
    })
}

impl LoopbackReport {
    /// The human table.
    pub fn table(&self, size: usize) -> String {
        let h = &self.histogram;
        let us = |v: u64| v as f64 / 1000.0;
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        format!(
            "protocol-core loopback (two SMB Direct state machines, in-process, no RDMA provider)\n\
             size {size} B, {rt} round trips in {secs:.2} s: {ops:.0} round trips/s, {mbs:.1} MB/s each way\n\
             latency us: min {min:.2}  p50 {p50:.2}  p90 {p90:.2}  p99 {p99:.2}  p99.9 {p999:.2}  p99.99 {p9999:.2}  max {max:.2}\n\
             empty messages client/server: {ec}/{es}   credit stalls client/server: {cc}/{cs}",
            rt = self.round_trips,
            ops = self.round_trips as f64 / secs,
            mbs = self.bytes as f64 / secs / 1e6,
            min = us(h.min()),
            p50 = us(h.value_at_quantile(0.50)),
            p90 = us(h.value_at_quantile(0.90)),
            p99 = us(h.value_at_quantile(0.99)),
            p999 = us(h.value_at_quantile(0.999)),
            p9999 = us(h.value_at_quantile(0.9999)),
            max = us(h.max()),
            ec = self.empty_messages.0,
            es = self.empty_messages.1,
            cc = self.credit_stalls.0,
            cs = self.credit_stalls.1,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_echoes_fragmented_messages_intact() {
        let r = run(
            SmbdConfig::default(),
            200_000,
            Duration::ZERO,
            Duration::from_millis(50),
        )
        .unwrap();
        assert!(r.round_trips > 0);
        assert_eq!(r.histogram.len(), r.round_trips);
    }
}
