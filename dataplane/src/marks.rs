//! Latency marks: where a QD-1 round trip's time goes, segment by segment.
//!
//! Built only with the `latency-marks` feature (`cargo build --release
//! --features latency-marks`); without it every function here is an empty
//! inline stub and nothing is recorded. With it, the `send` and `raw-send`
//! workloads of `smbdirectd bench --loopback` stamp the time stamp counter
//! at seven points of each round trip ([`Point`]) and the bench prints the
//! median of each segment between consecutive points ([`report`]). A
//! segment is a difference of two stamps taken on the same or on two cores
//! (the TSC is synchronised across cores on the hosts this runs on), so
//! "to server" and "to client" hold the transport and the polling delay,
//! while "client post", "server proc", "client proc" are our code alone:
//! figures that move with a change to the message path and hardly with the
//! host's placement of the two threads, unlike a p50 round trip (see
//! docs/bench-results.md, "Where a `send` round trip goes").
//!
//! The stamps are plain stores into preallocated static arrays (an atomic
//! counter per point), made only at QD 1 by one client and one server
//! thread; the k-th stamp of every point belongs to the k-th round trip.

/// A stamped point of a round trip, in the order they happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// The client is about to build and post a request.
    ClientPostBegin = 0,
    /// The client's `post_send` returned.
    ClientPostEnd = 1,
    /// The server's poll returned the request's receive completion (stamped
    /// for completions that deliver a message).
    ServerDetect = 2,
    /// The server is about to call `post_send` with the reply.
    ServerPostBegin = 3,
    /// The server's `post_send` returned.
    ServerPostEnd = 4,
    /// The client's poll returned the reply's receive completion.
    ClientDetect = 5,
    /// The client has checked the reply and hands it to the runner.
    ClientDone = 6,
}

const POINTS: usize = 7;

/// Segment names: from point `i` to point `i + 1`, and from `ClientDone`
/// to the next round trip's `ClientPostBegin`.
const SEGMENTS: [&str; POINTS] = [
    "client post",
    "to server",
    "server proc",
    "server post",
    "to client",
    "client proc",
    "runner to next",
];

#[cfg(all(feature = "latency-marks", target_arch = "x86_64"))]
mod imp {
    use super::{Point, POINTS};
    use std::cell::Cell;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Round trips recorded per point (the rest are counted, not stored).
    const CAP: usize = 1 << 20;

    struct Stamps(std::cell::UnsafeCell<[[u64; CAP]; POINTS]>);
    // SAFETY: each index of each point is written once, by the one thread
    // that took it from `COUNT`; `report` reads after the run has stopped.
    unsafe impl Sync for Stamps {}

    static COUNT: [AtomicU64; POINTS] = [const { AtomicU64::new(0) }; POINTS];
    static STAMPS: Stamps = Stamps(std::cell::UnsafeCell::new([[0; CAP]; POINTS]));

    thread_local! {
        static SERVER: Cell<bool> = const { Cell::new(false) };
    }

    #[inline(always)]
    pub fn now() -> u64 {
        // SAFETY: RDTSC has no preconditions on x86_64.
        unsafe { core::arch::x86_64::_rdtsc() }
    }

    #[inline(always)]
    pub fn mark_at(p: Point, t: u64) {
        let p = p as usize;
        let i = COUNT[p].fetch_add(1, Ordering::Relaxed) as usize;
        if i < CAP {
            // SAFETY: index `i` of point `p` is this call's alone (above).
            unsafe { (*STAMPS.0.get())[p][i] = t };
        }
    }

    pub fn set_server_thread() {
        SERVER.with(|s| s.set(true));
    }

    pub fn on_server_thread() -> bool {
        SERVER.with(|s| s.get())
    }

    pub fn report() -> Option<String> {
        let counts: Vec<usize> = COUNT
            .iter()
            .map(|c| c.load(Ordering::Relaxed) as usize)
            .collect();
        let n = counts.iter().copied().min().unwrap_or(0).min(CAP);
        // The SMB2 workloads' set-up (NEGOTIATE to CREATE) stamps the
        // server's points before the first measured request: up to
        // SETUP_STAMPS leading stamps of a point are set-up's, dropped.
        const SETUP_STAMPS: usize = 64;
        let max = counts.iter().copied().max().unwrap_or(0);
        if max - n > SETUP_STAMPS || max > CAP {
            return Some(format!(
                "latency marks: the points were stamped {counts:?} times, not once per round trip \
                 (only `send`, `raw-send`, `read` and `write` at --queue-depth 1 with one connection are stamped)"
            ));
        }
        if n < 1000 {
            return Some(format!("latency marks: {n} round trips stamped, too few"));
        }
        // SAFETY: the run is over: no thread stamps any more.
        let t = unsafe { &*STAMPS.0.get() };
        // Which of a point's stamps belong to the measured requests: the
        // first offset at which they come after the client began the same
        // request, in the middle of the run (set-up and tear-down
        // exchanges, stamped by the server and the client's receive path
        // only, come before and after them; the client's own points are
        // stamped for measured requests only).
        let first = counts
            .iter()
            .position(|&c| c == n)
            .expect("the minimum is some point's count");
        let mut offsets = [0usize; POINTS];
        for p in 0..POINTS {
            offsets[p] = (0..=counts[p] - n)
                .find(|&o| {
                    [n / 4, n / 2, 3 * n / 4]
                        .iter()
                        .all(|&i| t[p][o + i] >= t[first][i])
                })
                .unwrap_or(0);
        }
        let points: [&[u64]; POINTS] = std::array::from_fn(|p| &t[p][offsets[p]..offsets[p] + n]);
        Some(super::summarize(&points))
    }
}

#[cfg(not(all(feature = "latency-marks", target_arch = "x86_64")))]
mod imp {
    use super::Point;

    #[inline(always)]
    pub fn now() -> u64 {
        0
    }

    #[inline(always)]
    pub fn mark_at(_p: Point, _t: u64) {}

    #[inline(always)]
    pub fn set_server_thread() {}

    #[inline(always)]
    pub fn on_server_thread() -> bool {
        false
    }

    pub fn report() -> Option<String> {
        None
    }
}

/// The report of stamps `t[point][round trip]` (every point the same
/// length): per segment, the median, p25 and p75 of its durations over the
/// round trips after the first fifth (warm-up), in TSC cycles.
#[cfg_attr(
    not(all(feature = "latency-marks", target_arch = "x86_64")),
    allow(dead_code)
)]
fn summarize(t: &[&[u64]; POINTS]) -> String {
    let n = t[0].len();
    if n < 10 || t.iter().any(|p| p.len() != n) {
        return format!("latency marks: {n} round trips stamped, too few");
    }
    let ks = n / 5..n - 1;
    let mut out = format!(
        "latency marks: median TSC cycles per segment over {} round trips\n",
        ks.len()
    );
    let mut total = 0i64;
    for (seg, name) in SEGMENTS.iter().enumerate() {
        let mut v: Vec<i64> = ks
            .clone()
            .map(|k| {
                let (a, b) = if seg + 1 == POINTS {
                    (t[seg][k], t[0][k + 1])
                } else {
                    (t[seg][k], t[seg + 1][k])
                };
                b.wrapping_sub(a) as i64
            })
            .collect();
        v.sort_unstable();
        let (p25, p50, p75) = (v[v.len() / 4], v[v.len() / 2], v[v.len() * 3 / 4]);
        total += p50;
        out.push_str(&format!(
            "  {name:<15} p50 {p50:>6}  (p25 {p25:>6}, p75 {p75:>6})\n"
        ));
    }
    let mut rt: Vec<i64> = ks
        .map(|k| t[0][k + 1].wrapping_sub(t[0][k]) as i64)
        .collect();
    rt.sort_unstable();
    out.push_str(&format!(
        "  sum of medians {total}, median round trip (start to start) {}",
        rt[rt.len() / 2]
    ));
    out
}

/// Whether this build stamps (the `latency-marks` feature, on x86_64).
pub const ENABLED: bool = cfg!(all(feature = "latency-marks", target_arch = "x86_64"));

/// The time stamp counter now (0 without the feature).
#[inline(always)]
pub fn now() -> u64 {
    imp::now()
}

/// Stamps `p` with a time read earlier ([`now`]).
#[inline(always)]
pub fn mark_at(p: Point, t: u64) {
    imp::mark_at(p, t)
}

/// Stamps `p` now.
#[inline(always)]
pub fn mark(p: Point) {
    if ENABLED {
        imp::mark_at(p, imp::now())
    }
}

/// Marks the calling thread as the server's (its whole-message posts are
/// the server's `post_send`s).
#[inline(always)]
pub fn set_server_thread() {
    imp::set_server_thread()
}

/// Whether [`set_server_thread`] was called on this thread.
#[inline(always)]
pub fn on_server_thread() -> bool {
    imp::on_server_thread()
}

/// Runs `post` (a reply's `post_send`), stamped as the server's post when
/// `reply` and called on the server's thread; without the feature, just
/// runs it.
#[inline(always)]
pub fn server_post<R>(reply: bool, post: impl FnOnce() -> R) -> R {
    let server = ENABLED && reply && on_server_thread();
    if server {
        mark(Point::ServerPostBegin);
    }
    let r = post();
    if server {
        mark(Point::ServerPostEnd);
    }
    r
}

/// The per-segment medians of the round trips stamped so far (None without
/// the feature).
pub fn report() -> Option<String> {
    imp::report()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_segment_is_the_median_gap_between_its_two_points() {
        // 100 round trips of 100 cycles; segment i takes i + 1 cycles (the
        // last, runner to next, takes what is left: 100 - 21 = 79), and one
        // round trip in ten is slow in "server proc" (a median ignores it).
        let mut t: [Vec<u64>; POINTS] = Default::default();
        for k in 0..100u64 {
            let mut at = 1_000 + k * 100;
            for (p, v) in t.iter_mut().enumerate() {
                v.push(at);
                at += p as u64 + 1;
                if p == 2 && k % 10 == 0 {
                    at += 1; // stays inside the same round trip's budget
                }
            }
        }
        let points: [&[u64]; POINTS] = std::array::from_fn(|p| &t[p][..]);
        let r = summarize(&points);
        for (i, name) in SEGMENTS.iter().enumerate().take(POINTS - 1) {
            let want = format!("{name:<15} p50 {:>6}", i + 1);
            assert!(r.contains(&want), "{want:?} not in\n{r}");
        }
        assert!(
            r.contains(&format!("{:<15} p50 {:>6}", "runner to next", 79)),
            "{r}"
        );
        assert!(r.contains("median round trip (start to start) 100"), "{r}");
        // stamps of unequal length are refused, not misaligned
        let short: [&[u64]; POINTS] =
            std::array::from_fn(|p| &t[p][..if p == 3 { 50 } else { 100 }]);
        assert!(summarize(&short).contains("too few"));
    }
}
