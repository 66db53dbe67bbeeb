//! [MS-SQOS] 3.2.5.1 server processing over a sequence of operations on a
//! small logical-flow table: never panics, and keeps what the table promises
//! whatever the peer sends.
//!
//! Byte 0 picks the table's dialect (low bit: 1.0 or 1.1). Then records of
//! six bytes and a request:
//! - byte 0: operation (bits 0-1: 0 and 1 a request, 2 the Open closes,
//!   3 expiry and an enforcement report), Open (bits 2-3, four Opens), what
//!   the Open is (bits 4-5: 3 a directory, else a file), ProtocolVersion
//!   (bits 6-7: 0x0100, 0x0101, as sent, 0x0101);
//! - byte 1: time advance, 250 ms units;
//! - byte 2: LogicalFlowID (low nibble: 0 as sent, 1 the empty GUID, 2-5
//!   one of four flows) and PolicyID (high nibble: 0 as sent, 1 empty,
//!   2 a known dedicated policy, 3 a known aggregated one, else unknown);
//! - byte 3: MaxOutputResponse (0, 88, 96, 87, else 65,536);
//! - bytes 4-5: request length (u16 LE, modulo 512, cut to what is left),
//!   then the request bytes.
//! The selectors rewrite fields of a request long enough to hold them, so
//! the fuzzer reaches existing flows and known policies.
//!
//! Checked after every operation, against rules written here:
//! - a failed request changes nothing (the table and the Open are as
//!   before: `docs/spec-notes.md`, "Failed requests have no side effects");
//! - the table never holds more than `max_flows` flows;
//! - each flow's Open count is the number of Opens associated to it, and
//!   every associated Open's flow exists (a referenced flow never expires);
//! - a GET_STATUS answer is in the request's dialect and fits
//!   MaxOutputResponse (3.2.5.1.4).
#![no_main]

use libfuzzer_sys::fuzz_target;
use smbdirect_protocol::sqos::server::{
    process_request, FlowReport, LogicalFlowTable, OpenKind, OpenQosState, Policy, PolicyKind,
    PolicyLookup, ServerConfig,
};
use smbdirect_protocol::sqos::{Dialect, FlowStatus, Guid};
use smbdirect_protocol::time::{Duration, Instant};

const MAX_FLOWS: usize = 3;
const OPENS: usize = 4;

fn flow(n: u8) -> Guid {
    Guid::from_bytes([n; 16])
}

const DEDICATED: Guid = Guid::from_bytes([0xd0; 16]);
const AGGREGATED: Guid = Guid::from_bytes([0xa0; 16]);

struct Policies;

impl PolicyLookup for Policies {
    fn lookup(&self, id: &Guid) -> Option<Policy> {
        let kind = if *id == DEDICATED {
            PolicyKind::Dedicated
        } else if *id == AGGREGATED {
            PolicyKind::Aggregated
        } else {
            return None;
        };
        Some(Policy {
            kind,
            minimum_iops: 100,
            maximum_iops: 1_000,
            maximum_bandwidth: 4_096,
        })
    }
}

fn check_invariants(table: &LogicalFlowTable, opens: &[OpenQosState; OPENS]) {
    assert!(table.len() <= MAX_FLOWS, "{} flows", table.len());
    for f in table.iter() {
        let id = f.logical_flow_id();
        let referencing = opens
            .iter()
            .filter(|o| o.logical_flow_id() == Some(id))
            .count();
        assert_eq!(f.open_count(), referencing, "open count of {id:?}");
    }
    for o in opens {
        if let Some(id) = o.logical_flow_id() {
            assert!(table.get(&id).is_some(), "an Open's flow {id:?} is gone");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, mut rest)) = data.split_first() else {
        return;
    };
    let config = ServerConfig {
        dialect: if first & 1 == 0 {
            Dialect::V1_0
        } else {
            Dialect::V1_1
        },
        max_flows: MAX_FLOWS,
        flow_retention: Duration::from_secs(2),
        status_time_to_live: Duration::from_secs(1),
        ..ServerConfig::default()
    };
    let mut table = LogicalFlowTable::new(config);
    let mut opens: [OpenQosState; OPENS] = Default::default();
    let mut now = 0u64;
    while rest.len() >= 6 {
        let (rec, tail) = rest.split_at(6);
        let len = (usize::from(u16::from_le_bytes([rec[4], rec[5]])) % 512).min(tail.len());
        let (req, tail) = tail.split_at(len);
        rest = tail;
        now += u64::from(rec[1]) * 250_000_000;
        let at = Instant::from_nanos(now);
        let open = usize::from((rec[0] >> 2) & 3);
        match rec[0] & 3 {
            0 | 1 => {
                let mut req = req.to_vec();
                let version = match rec[0] >> 6 {
                    0 => Some(0x0100u16),
                    1 | 3 => Some(0x0101),
                    _ => None,
                };
                if let (Some(v), true) = (version, req.len() >= 2) {
                    req[..2].copy_from_slice(&v.to_le_bytes());
                }
                let flow_id = match rec[2] & 0xf {
                    0 => None,
                    1 => Some(Guid::NULL),
                    n @ 2..=5 => Some(flow(n)),
                    _ => None,
                };
                if let (Some(g), true) = (flow_id, req.len() >= 24) {
                    req[8..24].copy_from_slice(g.as_bytes());
                }
                let policy_id = match rec[2] >> 4 {
                    0 => None,
                    1 => Some(Guid::NULL),
                    2 => Some(DEDICATED),
                    3 => Some(AGGREGATED),
                    n => Some(Guid::from_bytes([n; 16])),
                };
                if let (Some(g), true) = (policy_id, req.len() >= 40) {
                    req[24..40].copy_from_slice(g.as_bytes());
                }
                let max_response = match rec[3] {
                    0 => 0,
                    1 => 88,
                    2 => 96,
                    3 => 87,
                    _ => 65_536,
                };
                let kind = if (rec[0] >> 4) & 3 == 3 {
                    OpenKind::Directory
                } else {
                    OpenKind::File
                };
                let table_before = format!("{table:?}");
                let open_before = format!("{:?}", opens[open]);
                let r = process_request(
                    &mut table,
                    &mut opens[open],
                    kind,
                    &req,
                    max_response,
                    at,
                    &Policies,
                );
                match r {
                    Err(status) => {
                        assert_eq!(
                            format!("{table:?}"),
                            table_before,
                            "failed with {status:?}, but the table changed"
                        );
                        assert_eq!(
                            format!("{:?}", opens[open]),
                            open_before,
                            "failed with {status:?}, but the Open changed"
                        );
                    }
                    Ok(Some(resp)) => {
                        assert!(resp.buffer_len() <= max_response as usize);
                        let sent = u16::from_le_bytes([req[0], req[1]]);
                        assert_eq!(resp.dialect.to_wire(), sent, "answered in another dialect");
                    }
                    Ok(None) => {}
                }
            }
            2 => table.close_open(&mut opens[open], at),
            _ => {
                table.expire(at);
                let id = flow(2 + (rec[2] & 3));
                table.report(
                    &id,
                    FlowReport {
                        status: FlowStatus::InsufficientThroughput,
                        maximum_io_rate: u64::from(rec[3]) * 10,
                        minimum_io_rate: u64::from(rec[3]),
                        maximum_bandwidth: 1_024,
                        time_to_live: Duration::from_millis(u64::from(rec[5]) * 10),
                    },
                    at,
                );
            }
        }
        check_invariants(&table, &opens);
    }
    for o in opens.iter_mut() {
        table.close_open(o, Instant::from_nanos(now));
    }
    check_invariants(&table, &opens);
    assert!(table.iter().all(|f| f.open_count() == 0));
});
