//! Micro-benchmarks of the pieces every operation goes through, one
//! thread, no I/O (the `micro-bench` binary):
//!
//! | case | one operation |
//! |---|---|
//! | `smbd-message` | one upper-layer message of 512 B through the [MS-SMBD] sans-IO state machines, sender and receiver, with the in-memory transport of [`crate::protocol_loopback`] (its copies included): a round trip there is two messages |
//! | `smbd-encode` | emit an SMB Direct data-transfer header and copy a 512 B payload ([MS-SMBD] 2.2.3) |
//! | `smbd-decode` | check and parse that message, locate its payload |
//! | `smb2-read-encode` | emit an SMB2 header plus READ request with one RDMA buffer descriptor ([MS-SMB2] 2.2.19) |
//! | `smb2-read-decode` | delimit that message, parse its header and READ request, walk its descriptor |
//! | `ring` | push one entry into, and pop it from, a control/data-plane ring ([`smbdirect_dataplane::planes::ring`]) |
//! | `token-bucket` | one `try_take` of the Storage QoS token bucket, the clock advancing 100 ns per call |
//!
//! Each case runs `--runs` times (default 5) after a warm-up run and
//! reports the median ns/op (and the spread). With `--callgrind` each case
//! is also run under valgrind's callgrind, counting instructions inside its
//! `hot_*` function only (all cases but `smbd-message`, which is timed by
//! duration).

use crate::protocol_loopback;
use smbdirect_dataplane::planes::ring;
use smbdirect_protocol::ntstatus::STATUS_SUCCESS;
use smbdirect_protocol::smb2::{
    compound, emit_message, Channel, ChannelInfo, Command, FileId, HeaderFlags, HeaderId,
    HeaderRepr, ReadFlags, ReadRequest, ReadRequestRepr,
};
use smbdirect_protocol::smbd::wire::{BufferDescriptorRepr, DataTransfer, DataTransferRepr};
use smbdirect_protocol::smbd::SmbdConfig;
use smbdirect_protocol::sqos::enforcement::TokenBucket;
use smbdirect_protocol::time::Instant as PInstant;
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Payload bytes of the SMB Direct cases.
pub const PAYLOAD: usize = 512;

/// The cases, in report order.
pub const CASES: [&str; 7] = [
    "smbd-message",
    "smbd-encode",
    "smbd-decode",
    "smb2-read-encode",
    "smb2-read-decode",
    "ring",
    "token-bucket",
];

/// Whether `case` can be counted under callgrind (iteration-driven).
pub fn countable(case: &str) -> bool {
    case != "smbd-message"
}

/// Runs `case` for `iters` operations; returns ns/op.
pub fn run(case: &str, iters: u64) -> Result<f64, String> {
    let t = Instant::now();
    let n = match case {
        "smbd-message" => return smbd_message(iters),
        "smbd-encode" => hot_smbd_encode(iters),
        "smbd-decode" => hot_smbd_decode(iters)?,
        "smb2-read-encode" => hot_smb2_read_encode(iters)?,
        "smb2-read-decode" => hot_smb2_read_decode(iters)?,
        "ring" => hot_ring(iters)?,
        "token-bucket" => hot_token_bucket(iters),
        other => return Err(format!("unknown case {other}; cases: {}", CASES.join(", "))),
    };
    black_box(n);
    Ok(t.elapsed().as_nanos() as f64 / iters.max(1) as f64)
}

/// `smbd-message`: echo round trips for as long as `iters` messages take
/// at 2 µs each (at least 50 ms), two messages per round trip.
fn smbd_message(iters: u64) -> Result<f64, String> {
    let d = Duration::from_nanos(iters.saturating_mul(2000)).max(Duration::from_millis(50));
    let r = protocol_loopback::run(SmbdConfig::default(), PAYLOAD, Duration::ZERO, d)?;
    if r.round_trips == 0 {
        return Err("no round trip completed".into());
    }
    Ok(r.elapsed.as_nanos() as f64 / (2 * r.round_trips) as f64)
}

#[inline(never)]
fn hot_smbd_encode(iters: u64) -> u64 {
    let payload = [0x5au8; PAYLOAD];
    let mut buf = [0u8; 1024];
    let mut sum = 0u64;
    for i in 0..iters {
        let mut h = DataTransferRepr::with_payload(PAYLOAD as u32, 0);
        h.credits_requested = 255;
        h.credits_granted = (i & 0xff) as u16;
        sum += black_box(h.emit(black_box(&mut buf), black_box(&payload))) as u64;
    }
    sum
}

fn smbd_message_bytes() -> Vec<u8> {
    let mut buf = vec![0u8; 1024];
    let h = DataTransferRepr {
        credits_requested: 255,
        credits_granted: 7,
        ..DataTransferRepr::with_payload(PAYLOAD as u32, 0)
    };
    let n = h.emit(&mut buf, &[0x5au8; PAYLOAD]);
    buf.truncate(n);
    buf
}

#[inline(never)]
fn hot_smbd_decode(iters: u64) -> Result<u64, String> {
    let msg = smbd_message_bytes();
    let mut sum = 0u64;
    for _ in 0..iters {
        let v = DataTransfer::new_checked(black_box(&msg[..])).map_err(|e| e.to_string())?;
        let r = DataTransferRepr::parse(&v).map_err(|e| e.to_string())?;
        let p = v.payload().map_err(|e| e.to_string())?;
        sum += u64::from(r.credits_granted) + p.len() as u64;
    }
    Ok(sum)
}

fn read_header(message_id: u64) -> HeaderRepr {
    HeaderRepr {
        credit_charge: 1,
        status: STATUS_SUCCESS,
        command: Command::Read,
        credit: 32,
        flags: HeaderFlags::empty(),
        next_command: 0,
        message_id,
        id: HeaderId::Sync {
            process_id: 0xfeff,
            tree_id: 1,
        },
        session_id: 0x1000_0000_0001,
        signature: [0; 16],
    }
}

fn read_request(descs: &[BufferDescriptorRepr]) -> ReadRequestRepr<'_> {
    ReadRequestRepr {
        padding: 0x50,
        flags: ReadFlags::empty(),
        length: 4096,
        offset: 1 << 20,
        file_id: FileId {
            persistent: 1,
            volatile: 2,
        },
        minimum_count: 0,
        channel: Channel::RdmaV1Invalidate,
        remaining_bytes: 0,
        channel_info: ChannelInfo::descriptors(descs),
    }
}

const DESCRIPTOR: [BufferDescriptorRepr; 1] = [BufferDescriptorRepr {
    offset: 0x7f00_1234_5000,
    token: 0x0012_3456,
    length: 4096,
}];

#[inline(never)]
fn hot_smb2_read_encode(iters: u64) -> Result<u64, String> {
    let mut buf = [0u8; 256];
    let mut sum = 0u64;
    for i in 0..iters {
        let h = read_header(i);
        let req = read_request(&DESCRIPTOR);
        sum += emit_message(&h, black_box(&req), black_box(&mut buf)).map_err(|e| e.to_string())?
            as u64;
    }
    Ok(sum)
}

#[inline(never)]
fn hot_smb2_read_decode(iters: u64) -> Result<u64, String> {
    let mut buf = [0u8; 256];
    let n = emit_message(&read_header(1), &read_request(&DESCRIPTOR), &mut buf)
        .map_err(|e| e.to_string())?;
    let msg = &buf[..n];
    let mut sum = 0u64;
    for _ in 0..iters {
        for m in compound(black_box(msg)) {
            let m = m.map_err(|e| e.to_string())?;
            let v = ReadRequest::new_checked(m.body()).map_err(|e| e.to_string())?;
            let r = ReadRequestRepr::parse(&v).map_err(|e| e.to_string())?;
            sum += m.header().message_id + u64::from(r.length);
            for d in r.channel_info.iter_descriptors() {
                sum += u64::from(d.token);
            }
        }
    }
    Ok(sum)
}

#[inline(never)]
fn hot_ring(iters: u64) -> Result<u64, String> {
    let r = ring::<u64>(1024);
    let mut sum = 0u64;
    for i in 0..iters {
        r.push(black_box(i))
            .map_err(|_| "ring full after a pop".to_string())?;
        sum += r.pop().ok_or("ring empty after a push")?;
    }
    Ok(sum)
}

#[inline(never)]
fn hot_token_bucket(iters: u64) -> u64 {
    let start = PInstant::from_nanos(1_000_000_000);
    // 10 M tokens/s, a 1 ms burst: one token per 100 ns, so about every
    // call finds one.
    let mut b = TokenBucket::new(start, 10_000_000, 10_000);
    let mut granted = 0u64;
    for i in 0..iters {
        let now = PInstant::from_nanos(1_000_000_000 + i * 100);
        granted += u64::from(b.try_take(black_box(now), 1).is_ok());
    }
    granted
}

/// The median of `v` (sorted in place).
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Instructions per operation of `case`: runs `exe --only CASE --iters N`
/// under callgrind, collecting inside its `hot_*` function only.
pub fn callgrind_instructions(
    exe: &std::path::Path,
    case: &str,
    iters: u64,
) -> Result<f64, String> {
    let out = std::process::Command::new("valgrind")
        .args([
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            "--toggle-collect=*micro_bench*hot_*",
        ])
        .arg(exe)
        .args(["--only", case, "--iters", &iters.to_string()])
        .output()
        .map_err(|e| format!("running valgrind: {e}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!("valgrind {case} failed ({})", out.status));
    }
    let collected = stderr
        .lines()
        .find_map(|l| {
            let (_, rest) = l.split_once("Collected :")?;
            rest.trim().replace(',', "").parse::<u64>().ok()
        })
        .ok_or("no \"Collected :\" line in callgrind's output")?;
    if collected == 0 {
        return Err("callgrind collected nothing (the hot_* symbol did not match)".into());
    }
    Ok(collected as f64 / iters as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_case_runs_and_costs_something() {
        for c in CASES {
            let ns = run(c, 2000).unwrap_or_else(|e| panic!("{c}: {e}"));
            assert!(ns > 0.0 && ns.is_finite(), "{c}: {ns}");
        }
        assert!(run("nope", 1).is_err());
    }

    #[test]
    fn the_decoded_messages_are_the_encoded_ones() {
        assert_eq!(hot_smbd_decode(3).unwrap(), 3 * (7 + PAYLOAD as u64));
        assert_eq!(
            hot_smb2_read_decode(2).unwrap(),
            2 * (1 + 4096 + u64::from(DESCRIPTOR[0].token))
        );
        assert_eq!(hot_ring(4).unwrap(), 1 + 2 + 3);
        assert!(hot_token_bucket(1000) >= 990);
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
