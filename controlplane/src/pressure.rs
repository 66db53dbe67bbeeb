//! The operator's view of resource pressure: a refused connection at
//! `--max-connections`, no receive buffer for a new connection, a refused
//! negotiation, a connection ended for want of a pool buffer, work waiting
//! for pool buffers, writes refused by a full store. Each can happen once
//! per request, so each is logged at most once per
//! [`PRESSURE_LOG_INTERVAL`] with the number of occurrences since the
//! previous line, and an interval after the last line a summary gives the
//! occurrences that line did not report (so a burst's size is known even
//! when it stopped). Counted events come from the workers' counters
//! (`pool_stalls`, `store_full`), read here: workers never log.

use crate::stats::ServerStats;
use smbdirect_dataplane::ratelog::{suppressed_note, RateLimited, PRESSURE_LOG_INTERVAL};
use std::time::Instant;

/// Kinds of pressure lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pressure {
    /// A connection refused at `--max-connections`.
    MaxConnections = 0,
    /// A connection refused: no receive buffer for it (none to lend for
    /// its negotiate receive, or none to post for its credits).
    NoReceiveBuffer = 1,
    /// A Negotiate Request refused ([MS-SMBD] 3.1.5.6).
    NegotiateRefused = 2,
    /// A connection ended: no pool buffer for a reassembled message.
    PoolClosed = 3,
    /// Work waited for a pool buffer (`pool_stalls`).
    PoolStalls = 4,
    /// Writes refused with STATUS_DISK_FULL (`store_full`).
    StoreFull = 5,
}

const KINDS: usize = 6;

impl Pressure {
    const ALL: [Pressure; KINDS] = [
        Pressure::MaxConnections,
        Pressure::NoReceiveBuffer,
        Pressure::NegotiateRefused,
        Pressure::PoolClosed,
        Pressure::PoolStalls,
        Pressure::StoreFull,
    ];

    /// What the summary line says the occurrences were.
    fn what(self) -> &'static str {
        match self {
            Pressure::MaxConnections => "connection(s) refused at --max-connections",
            Pressure::NoReceiveBuffer => {
                "connection(s) refused for want of a receive buffer (buffer pool exhausted: see --pool-mem)"
            }
            Pressure::NegotiateRefused => "negotiation(s) refused",
            Pressure::PoolClosed => {
                "connection(s) closed for want of a pool buffer for a reassembled message (see --pool-mem)"
            }
            Pressure::PoolStalls => {
                "wait(s) for a free pool buffer (pool_stalls; the pool is exhausted: see --pool-mem)"
            }
            Pressure::StoreFull => {
                "request(s) refused with STATUS_DISK_FULL (no room in the store for them: see --store-size)"
            }
        }
    }
}

/// The rate-limited pressure lines of the control plane.
#[derive(Debug)]
pub struct PressureLog {
    kinds: [RateLimited; KINDS],
    pool_stalls: u64,
    store_full: u64,
}

impl Default for PressureLog {
    fn default() -> Self {
        Self::new()
    }
}

impl PressureLog {
    /// Nothing logged yet.
    pub fn new() -> Self {
        PressureLog {
            kinds: [RateLimited::new(PRESSURE_LOG_INTERVAL); KINDS],
            pool_stalls: 0,
            store_full: 0,
        }
    }

    /// One occurrence of `kind`: logs `line` (at warn, with the count of
    /// occurrences not logged since the previous one) if a line is due.
    pub fn event(&mut self, kind: Pressure, line: std::fmt::Arguments<'_>) {
        if let Some(n) = self.kinds[kind as usize].hit(Instant::now()) {
            crate::warn!("{line}{}", suppressed_note(n));
        }
    }

    /// Reads the workers' counters and logs what grew, then the summaries
    /// that are due. Called from the control loop.
    pub fn tick(&mut self, stats: &ServerStats) {
        let now = Instant::now();
        let t = stats.totals();
        let stalls = t.pool_stalls.saturating_sub(self.pool_stalls);
        self.pool_stalls = t.pool_stalls;
        if let Some(n) = self.kinds[Pressure::PoolStalls as usize].hit_n(now, stalls) {
            crate::warn!(
                "{} wait(s) for a free pool buffer since the last such line: the buffer pool is exhausted (pool_stalls {}; raise --pool-mem or lower --max-connections)",
                n + 1,
                t.pool_stalls
            );
        }
        let full = t.store_full.saturating_sub(self.store_full);
        self.store_full = t.store_full;
        if let Some(n) = self.kinds[Pressure::StoreFull as usize].hit_n(now, full) {
            crate::warn!(
                "{} request(s) refused with STATUS_DISK_FULL since the last such line: the store had no room for them, because it is full or because one asked for more than it holds (store_full {}; raise --store-size or free space)",
                n + 1,
                t.store_full
            );
        }
        for k in Pressure::ALL {
            if let Some(n) = self.kinds[k as usize].summary_due(now) {
                crate::warn!("{n} more {} since the last such line", k.what());
            }
        }
    }

    /// At exit: counts the workers' last events and gives every count
    /// not logged yet, whether or not its interval has passed.
    pub fn flush(&mut self, stats: &ServerStats) {
        self.tick(stats);
        for k in Pressure::ALL {
            let n = self.kinds[k as usize].take_pending();
            if n > 0 {
                crate::warn!("{n} more {} since the last such line", k.what());
            }
        }
    }
}
