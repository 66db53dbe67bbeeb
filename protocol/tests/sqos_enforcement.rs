//! Storage QoS enforcement arithmetic, tested exactly with a fake clock.

use proptest::prelude::*;
use smbdirect_protocol::sqos::enforcement::*;
use smbdirect_protocol::sqos::server::{Policy, PolicyKind};
use smbdirect_protocol::sqos::FlowStatus;
use smbdirect_protocol::time::{Duration, Instant};

const SEC: u64 = 1_000_000_000;
const KIB8: u64 = 8192;

fn at(ns: u64) -> Instant {
    Instant::from_nanos(ns)
}

/// A closed-loop simulation: each flow keeps `depth` requests of `bytes`
/// queued; the worker's device serves `capacity` normalized IOPS (0 =
/// infinitely fast). Returns normalized I/Os and bytes served per flow.
fn simulate(
    s: &mut Scheduler,
    flows: &[(FlowSlot, u64, usize)],
    capacity: u64,
    secs: u64,
) -> Vec<(u64, u64)> {
    let mut served = vec![(0u64, 0u64); flows.len()];
    let mut next_id = 0u64;
    for (i, &(slot, bytes, depth)) in flows.iter().enumerate() {
        for _ in 0..depth {
            s.enqueue(slot, (i as u64) << 48 | next_id, bytes).unwrap();
            next_id += 1;
        }
    }
    let end = secs * SEC;
    let mut now = 0u64;
    while now < end {
        match s.next_ready(at(now)) {
            Some((slot, req)) => {
                let i = (req >> 48) as usize;
                assert_eq!(flows[i].0, slot);
                let bytes = flows[i].1;
                let ios = io_cost(bytes, 8192);
                served[i].0 += ios;
                served[i].1 += bytes;
                s.enqueue(slot, (i as u64) << 48 | next_id, bytes).unwrap();
                next_id += 1;
                now += (ios * SEC).checked_div(capacity).unwrap_or(0);
            }
            None => {
                let w = s.next_wakeup().expect("requests are queued").as_nanos();
                assert!(
                    w > now,
                    "next_wakeup {w} not after {now} with nothing ready"
                );
                now = w;
            }
        }
    }
    served
}

fn sched() -> Scheduler {
    Scheduler::new(
        SchedulerConfig {
            max_flows: 16,
            max_queued: 256,
            ..SchedulerConfig::default()
        },
        Instant::ZERO,
    )
}

fn limit(max_iops: u64) -> FlowRates {
    FlowRates {
        max_iops,
        ..FlowRates::UNLIMITED
    }
}

#[test]
fn one_mib_io_is_charged_128_normalized_ios() {
    assert_eq!(io_cost(1 << 20, 8192), 128);
    assert_eq!(io_cost(0, 8192), 1);
    assert_eq!(io_cost(512, 8192), 1);
    assert_eq!(io_cost(12288, 8192), 2);
    assert_eq!(kb_cost(1 << 20), 1024);
    assert_eq!(kb_cost(1500), 2);
    // A 1,280-IOPS flow: ten 1 MiB I/Os per second.
    let mut l = FlowLimiter::new(Instant::ZERO, limit(1280));
    // Burst is 20 ms = 25.6 → 25 units: a full bucket admits one oversized
    // I/O, then its debt (128 - 25) is paid back at 1,280/s.
    assert_eq!(l.try_take(Instant::ZERO, 1 << 20), Ok(()));
    let e = l.try_take(Instant::ZERO, 1 << 20).unwrap_err();
    // Needs the credit back at min(128, 25) = 25: from -103 → +25 = 128 units.
    assert_eq!(e, at(100_000_000));
    assert!(l.try_take(at(99_999_999), 1 << 20).is_err());
    assert_eq!(l.try_take(at(100_000_000), 1 << 20), Ok(()));
}

#[test]
fn limited_flow_offered_double_gets_at_most_its_limit() {
    let mut s = sched();
    let f = s.open_flow(Instant::ZERO, limit(2000)).unwrap();
    let served = simulate(&mut s, &[(f, KIB8, 64)], 0, 5);
    let ios = served[0].0;
    assert!(ios <= 10_000 * 103 / 100, "{ios}");
    assert!(ios >= 10_000 * 97 / 100, "{ios}");
}

#[test]
fn limiter_alone_offered_4000_iops_admits_2000() {
    let mut l = FlowLimiter::new(Instant::ZERO, limit(2000));
    let mut admitted = 0u64;
    // Offered 4,000 IOPS: one 8 KiB attempt every 250 µs, for 5 s.
    for k in 0..20_000u64 {
        if l.try_take(at(k * 250_000), KIB8).is_ok() {
            admitted += 1;
        }
    }
    assert!((9_700..=10_300).contains(&admitted), "{admitted}");
}

#[test]
fn aggregated_policy_split_between_two_flows_stays_within_it() {
    let policies = [Policy {
        kind: PolicyKind::Aggregated,
        minimum_iops: 0,
        maximum_iops: 4000,
        maximum_bandwidth: 0,
    }];
    let w_a = [WorkerDemand {
        worker: 0,
        demand_iops: 3000,
    }];
    let w_b = [WorkerDemand {
        worker: 0,
        demand_iops: 1000,
    }];
    let flows = [
        FlowDemand {
            flow: 1,
            policy: Some(0),
            workers: &w_a,
        },
        FlowDemand {
            flow: 2,
            policy: Some(0),
            workers: &w_b,
        },
    ];
    let alloc = allocate(&policies, &flows);
    assert_eq!(alloc.len(), 2);
    assert_eq!(alloc.iter().map(|a| a.rates.max_iops).sum::<u64>(), 4000);
    assert_eq!((alloc[0].flow, alloc[1].flow), (1, 2));
    // 1 + 2998.5 and 1 + 999.5: the tied remainder goes to the lower index.
    assert_eq!(alloc[0].rates.max_iops, 3000);
    let mut s = sched();
    let a = s.open_flow(Instant::ZERO, alloc[0].rates).unwrap();
    let b = s.open_flow(Instant::ZERO, alloc[1].rates).unwrap();
    let served = simulate(&mut s, &[(a, KIB8, 64), (b, 64 * 1024, 64)], 0, 5);
    let total = served[0].0 + served[1].0;
    assert!(total <= 20_000 * 103 / 100, "{served:?}");
    assert!(total >= 20_000 * 97 / 100, "{served:?}");
}

#[test]
fn reservation_beside_greedy_unlimited_flow_on_saturated_worker() {
    // Worker capacity 10,000 normalized IOPS. The greedy flow issues 1 MiB
    // (128 normalized) I/Os; the reserved flow 8 KiB ones. Per-request
    // round-robin alone would give the small flow ~10,000/129 ≈ 77 IOPS.
    let run = |min_iops: u64| {
        let mut s = sched();
        let r = s
            .open_flow(
                Instant::ZERO,
                FlowRates {
                    min_iops,
                    ..FlowRates::UNLIMITED
                },
            )
            .unwrap();
        let g = s.open_flow(Instant::ZERO, FlowRates::UNLIMITED).unwrap();
        let served = simulate(&mut s, &[(r, KIB8, 32), (g, 1 << 20, 32)], 10_000, 5);
        (served, s.flow_status(r, true), s.last_window(r).unwrap())
    };
    let (without, status, _) = run(0);
    assert!(without[0].0 < 950 * 5, "{without:?}");
    assert_eq!(status, FlowStatus::Ok); // no reservation, nothing to miss
    let (with, status, window) = run(1000);
    assert!(with[0].0 >= 950 * 5, "{with:?}");
    assert!(with[1].0 > 0, "{with:?}");
    assert!(window.reservation_met, "{window:?}");
    assert_eq!(status, FlowStatus::Ok);
}

#[test]
fn unmet_reservation_reports_insufficient_throughput_when_saturated() {
    // A 20,000-IOPS reservation on a 10,000-IOPS worker cannot be met.
    let mut s = sched();
    let r = s
        .open_flow(
            Instant::ZERO,
            FlowRates {
                min_iops: 20_000,
                ..FlowRates::UNLIMITED
            },
        )
        .unwrap();
    simulate(&mut s, &[(r, KIB8, 32)], 10_000, 1);
    let w = s.last_window(r).unwrap();
    assert!(!w.reservation_met, "{w:?}");
    assert!(
        w.served_iops() >= 9_900 && w.served_iops() <= 10_100,
        "{w:?}"
    );
    assert_eq!(s.flow_status(r, true), FlowStatus::InsufficientThroughput);
    assert_eq!(s.flow_status(r, false), FlowStatus::Ok);
}

#[test]
fn bandwidth_limit_counts_kb_of_1024_bytes() {
    let mut l = FlowLimiter::new(
        Instant::ZERO,
        FlowRates {
            max_kbps: 1000,
            ..FlowRates::UNLIMITED
        },
    );
    let mut bytes = 0u64;
    for k in 0..50_000u64 {
        // 4 KiB every 100 µs = 40,960 KB/s offered, for 5 s.
        if l.try_take(at(k * 100_000), 4096).is_ok() {
            bytes += 4096;
        }
    }
    let kb = bytes / 1024;
    assert!((4_850..=5_150).contains(&kb), "{kb}");
    // Exactly: 1,000 KB/s with burst 20 KB; 1500-byte I/Os cost 2 KB each.
    let mut l = FlowLimiter::new(
        Instant::ZERO,
        FlowRates {
            max_kbps: 1000,
            ..FlowRates::UNLIMITED
        },
    );
    for _ in 0..10 {
        assert_eq!(l.try_take(Instant::ZERO, 1500), Ok(()));
    }
    assert_eq!(l.try_take(Instant::ZERO, 1500), Err(at(2_000_000)));
}

#[test]
fn set_rate_takes_effect_without_bursting() {
    let mut l = FlowLimiter::new(Instant::ZERO, limit(10_000));
    // Idle 1 s at 10,000: credit capped at the 200-unit burst.
    // Lower to 100 IOPS: credit clamped to the new 2-unit burst.
    l.set_rates(at(SEC), limit(100));
    let mut admitted = 0;
    for k in 0..=100_000u64 {
        if l.try_take(at(SEC + k * 10_000), KIB8).is_ok() {
            admitted += 1;
        }
    }
    assert!(admitted <= 100 + 2, "{admitted}");
    assert!(admitted >= 100, "{admitted}");
    // Raise to 10,000: no credit appears from the change itself.
    let t = 2 * SEC + 10_000;
    l.set_rates(at(t), limit(10_000));
    let mut now_ok = 0;
    while l.try_take(at(t), KIB8).is_ok() {
        now_ok += 1;
    }
    assert!(now_ok <= 2, "{now_ok}");

    // The raw bucket: set_rate keeps the burst and settles credit first.
    let mut b = TokenBucket::new(Instant::ZERO, 1000, 10);
    assert_eq!(b.try_take(Instant::ZERO, 10), Ok(()));
    b.set_rate(at(SEC), 1); // earned 10 (capped) at the old rate
    assert_eq!(b.available(at(SEC)), 10);
    assert_eq!(b.try_take(at(SEC), 10), Ok(()));
    assert_eq!(b.try_take(at(SEC), 1), Err(at(2 * SEC)));
}

#[test]
fn zero_limit_is_unlimited() {
    let mut l = FlowLimiter::new(Instant::ZERO, FlowRates::UNLIMITED);
    for _ in 0..100_000 {
        assert_eq!(l.try_take(Instant::ZERO, 1 << 20), Ok(()));
    }
    let mut b = TokenBucket::new(Instant::ZERO, 0, 1);
    assert!(b.is_unlimited());
    assert_eq!(b.try_take(Instant::ZERO, u64::MAX), Ok(()));
    // Only the KB/s limit set: IOPS unlimited.
    let mut l = FlowLimiter::new(
        Instant::ZERO,
        FlowRates {
            max_kbps: 1_000_000,
            ..FlowRates::UNLIMITED
        },
    );
    for _ in 0..1000 {
        assert_eq!(l.try_take(Instant::ZERO, 0), Ok(()));
    }
}

#[test]
fn dedicated_policy_and_worker_spread() {
    let policies = [Policy {
        kind: PolicyKind::Dedicated,
        minimum_iops: 100,
        maximum_iops: 1000,
        maximum_bandwidth: 5000,
    }];
    let w1 = [WorkerDemand {
        worker: 3,
        demand_iops: 0,
    }];
    let w2 = [
        WorkerDemand {
            worker: 0,
            demand_iops: 300,
        },
        WorkerDemand {
            worker: 1,
            demand_iops: 100,
        },
    ];
    let flows = [
        FlowDemand {
            flow: 7,
            policy: Some(0),
            workers: &w1,
        },
        FlowDemand {
            flow: 8,
            policy: Some(0),
            workers: &w2,
        },
        FlowDemand {
            flow: 9,
            policy: None,
            workers: &w1,
        },
        FlowDemand {
            flow: 10,
            policy: Some(0),
            workers: &[],
        },
    ];
    let a = allocate(&policies, &flows);
    assert_eq!(a.len(), 4);
    assert_eq!(
        a[0],
        Allocation {
            flow: 7,
            worker: 3,
            rates: FlowRates {
                max_iops: 1000,
                min_iops: 100,
                max_kbps: 5000
            }
        }
    );
    assert_eq!(
        (a[1].flow, a[1].worker, a[2].flow, a[2].worker),
        (8, 0, 8, 1)
    );
    assert_eq!(a[1].rates.max_iops + a[2].rates.max_iops, 1000);
    assert_eq!(a[1].rates.max_iops, 750);
    assert_eq!(a[1].rates.min_iops + a[2].rates.min_iops, 100);
    assert_eq!(a[1].rates.max_kbps + a[2].rates.max_kbps, 5000);
    assert_eq!(a[3].rates, FlowRates::UNLIMITED);
    assert_eq!(allocate(&policies, &flows), a, "deterministic");
}

#[test]
fn aggregated_idle_flows_get_equal_shares_and_never_nothing() {
    let mut out = [0u64; 3];
    split(4000, &[0, 0, 0], &mut out);
    assert_eq!(out, [1334, 1333, 1333]);
    split(4000, &[1_000_000, 0, 0], &mut out);
    assert_eq!(out, [3998, 1, 1]);
    split(0, &[1, 2, 3], &mut out);
    assert_eq!(out, [0, 0, 0]);
    split(2, &[1, 2, 3], &mut out);
    assert_eq!(out, [1, 1, 1]);
}

#[test]
fn scheduler_fixed_capacity_and_slots() {
    let mut s = Scheduler::new(
        SchedulerConfig {
            max_flows: 1,
            max_queued: 2,
            ..SchedulerConfig::default()
        },
        Instant::ZERO,
    );
    let f = s.open_flow(Instant::ZERO, FlowRates::UNLIMITED).unwrap();
    assert!(s.open_flow(Instant::ZERO, FlowRates::UNLIMITED).is_none());
    assert_eq!(s.next_wakeup(), None);
    s.enqueue(f, 1, 10).unwrap();
    s.enqueue(f, 2, 10).unwrap();
    assert_eq!(s.enqueue(f, 3, 10), Err(SchedulerError::QueueFull));
    assert!(!s.close_flow(f));
    assert_eq!(s.next_ready(Instant::ZERO), Some((f, 1)));
    assert_eq!(s.next_ready(Instant::ZERO), Some((f, 2)));
    assert_eq!(s.next_ready(Instant::ZERO), None);
    assert!(s.close_flow(f));
    assert_eq!(s.enqueue(f, 4, 10), Err(SchedulerError::NoSuchFlow));
}

#[test]
fn round_robin_between_ready_flows() {
    let mut s = sched();
    let a = s.open_flow(Instant::ZERO, FlowRates::UNLIMITED).unwrap();
    let b = s.open_flow(Instant::ZERO, FlowRates::UNLIMITED).unwrap();
    for i in 0..3 {
        s.enqueue(a, i, 10).unwrap();
        s.enqueue(b, 100 + i, 10).unwrap();
    }
    let order: Vec<_> = std::iter::from_fn(|| s.next_ready(Instant::ZERO))
        .map(|(_, r)| r)
        .collect();
    assert_eq!(order, [0, 100, 1, 101, 2, 102]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn bucket_never_admits_more_than_rate_times_t_plus_burst(
        rate in 1u64..200_000,
        burst in 1u64..1_000,
        steps in proptest::collection::vec((0u64..2_000_000, 1u64..1_000), 1..400),
    ) {
        let mut b = TokenBucket::new(Instant::ZERO, rate, burst);
        let mut now = 0u64;
        let mut admitted: u128 = 0;
        for (dt, cost) in steps {
            now += dt;
            let cost = cost.min(burst);
            match b.try_take(at(now), cost) {
                Ok(()) => admitted += cost as u128,
                Err(t) => {
                    prop_assert!(t.as_nanos() > now);
                    // Succeeds exactly when announced, not a nanosecond before.
                    let mut probe = b;
                    prop_assert!(probe.try_take(at(t.as_nanos() - 1), cost).is_err());
                    prop_assert!(probe.try_take(t, cost).is_ok());
                }
            }
            prop_assert!(
                admitted * 1_000_000_000
                    <= rate as u128 * now as u128 + burst as u128 * 1_000_000_000
            );
        }
    }

    #[test]
    fn flow_limiter_never_admits_more_than_rate_times_t_plus_burst(
        iops in 1u64..50_000,
        kbps in 0u64..500_000,
        steps in proptest::collection::vec((0u64..1_000_000, 0u64..(64 * 1024)), 1..300),
    ) {
        let rates = FlowRates { max_iops: iops, min_iops: 0, max_kbps: kbps };
        let mut l = FlowLimiter::new(Instant::ZERO, rates);
        let (bi, bk) = (l.iops_bucket().burst(), l.kbps_bucket().burst());
        let (mut now, mut ios, mut kb, mut max_io, mut max_kb) = (0u64, 0u128, 0u128, 0u128, 0u128);
        for (dt, bytes) in steps {
            now += dt;
            if l.try_take(at(now), bytes).is_ok() {
                let (c, k) = (io_cost(bytes, 8192) as u128, kb_cost(bytes) as u128);
                ios += c; kb += k; max_io = max_io.max(c); max_kb = max_kb.max(k);
            }
            // Oversized I/Os (cost > burst) may overdraw by one I/O.
            prop_assert!(ios * 1_000_000_000 <= iops as u128 * now as u128 + (bi as u128).max(max_io) * 1_000_000_000);
            if kbps > 0 {
                prop_assert!(kb * 1_000_000_000 <= kbps as u128 * now as u128 + (bk as u128).max(max_kb) * 1_000_000_000);
            }
        }
    }

    #[test]
    fn split_sums_exactly_and_gives_everyone_something(
        total in 0u64..1_000_000,
        weights in proptest::collection::vec(0u64..100_000, 1..20),
    ) {
        let mut out = vec![0; weights.len()];
        split(total, &weights, &mut out);
        if total == 0 {
            prop_assert!(out.iter().all(|&o| o == 0));
        } else if total >= weights.len() as u64 {
            prop_assert_eq!(out.iter().sum::<u64>(), total);
            prop_assert!(out.iter().all(|&o| o >= 1));
        } else {
            prop_assert!(out.iter().all(|&o| o == 1));
        }
    }
}

#[test]
fn try_now_admits_within_limits_only_when_nothing_waits() {
    let mut s = sched();
    let a = s.open_flow(at(0), limit(1000)).unwrap();
    let b = s.open_flow(at(0), FlowRates::UNLIMITED).unwrap();
    // The 20 ms burst of 1,000 IOPS is 20 I/Os: the 21st waits.
    for _ in 0..20 {
        assert!(s.try_now(at(0), a, 8192));
    }
    assert!(!s.try_now(at(0), a, 8192));
    s.enqueue(a, 1, 8192).unwrap();
    // Something waits: even an unlimited flow goes through the queue, so
    // the reservation-first order decides.
    assert!(!s.try_now(at(0), b, 1));
    assert!(!s.is_idle());
    // 1 ms later one more normalized I/O is allowed.
    assert_eq!(s.next_ready(at(1_000_000)), Some((a, 1)));
    assert!(s.is_idle());
    assert!(s.try_now(at(1_000_000), b, 1));
    // A 1 MiB I/O is charged 128 normalized I/Os on the fast path too.
    let c = s.open_flow(at(0), limit(128 * 50)).unwrap();
    assert!(s.try_now(at(0), c, 1 << 20));
    assert!(
        !s.try_now(at(0), c, 1 << 20),
        "128 of a 128-I/O burst are spent"
    );
}

/// A reference limiter: two independent [`TokenBucket`]s, each refilled
/// only when it is looked at (what `FlowLimiter` was before its buckets
/// shared one refill instant and 64-bit credit).
#[derive(Debug, Clone, Copy)]
struct TwoBuckets {
    iops: TokenBucket,
    kbps: TokenBucket,
}

impl TwoBuckets {
    fn new(now: Instant, r: FlowRates) -> Self {
        let bw = DEFAULT_BURST_WINDOW;
        TwoBuckets {
            iops: TokenBucket::new(now, r.max_iops, burst_for(r.max_iops, bw)),
            kbps: TokenBucket::new(now, r.max_kbps, burst_for(r.max_kbps, bw)),
        }
    }
    fn try_take(&mut self, now: Instant, bytes: u64) -> Result<(), Instant> {
        let (ios, kb) = (io_cost(bytes, 8192), kb_cost(bytes));
        match (self.iops.check(now, ios), self.kbps.check(now, kb)) {
            (Ok(()), Ok(())) => {
                self.iops.try_take(now, ios).unwrap();
                self.kbps.try_take(now, kb).unwrap();
                Ok(())
            }
            (Err(x), Err(y)) => Err(x.max(y)),
            (Err(x), Ok(())) | (Ok(()), Err(x)) => Err(x),
        }
    }
    fn set_rates(&mut self, now: Instant, r: FlowRates) {
        let bw = DEFAULT_BURST_WINDOW;
        self.iops
            .set_limits(now, r.max_iops, burst_for(r.max_iops, bw));
        self.kbps
            .set_limits(now, r.max_kbps, burst_for(r.max_kbps, bw));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// The flow limiter (the scheduler's per-flow hot record) decides
    /// exactly as two separate buckets do, including the instant a refused
    /// I/O would pass, across rate changes and unlimited buckets.
    #[test]
    fn flow_limiter_matches_two_separate_buckets(
        rates in proptest::collection::vec((0u64..20_000, 0u64..200_000), 1..4),
        steps in proptest::collection::vec((0u64..3_000_000, 0u64..(2 << 20), 0u8..16), 1..300),
    ) {
        let r = |i: usize| FlowRates {
            max_iops: rates[i % rates.len()].0,
            min_iops: 0,
            max_kbps: rates[i % rates.len()].1,
        };
        let mut l = FlowLimiter::new(Instant::ZERO, r(0));
        let mut two = TwoBuckets::new(Instant::ZERO, r(0));
        let mut now = 0u64;
        for (k, (dt, bytes, op)) in steps.into_iter().enumerate() {
            now += dt;
            if op == 0 {
                l.set_rates(at(now), r(k));
                two.set_rates(at(now), r(k));
            } else {
                prop_assert_eq!(l.try_take(at(now), bytes), two.try_take(at(now), bytes));
            }
        }
    }
}

#[test]
fn bursts_and_charges_beyond_max_burst_neither_overflow_nor_admit_more() {
    // A rate whose 20 ms burst exceeds MAX_BURST keeps MAX_BURST.
    let mut b = TokenBucket::new(Instant::ZERO, u64::MAX, u64::MAX);
    assert_eq!(b.burst(), MAX_BURST);
    assert_eq!(b.try_take(Instant::ZERO, u64::MAX), Ok(()));
    // Charged MAX_BURST units: empty, then refilled after hours of idle
    // time without overflow, capped at the burst.
    assert_eq!(b.available(Instant::ZERO), 0);
    assert_eq!(b.available(at(u64::MAX)), MAX_BURST);
    let mut small = TokenBucket::new(Instant::ZERO, 1, 1);
    assert_eq!(small.try_take(Instant::ZERO, u64::MAX), Ok(()));
    // In debt of MAX_BURST - 1 units at 1 unit/s: back to 1 unit after
    // MAX_BURST seconds.
    assert_eq!(small.try_take(Instant::ZERO, 1), Err(at(MAX_BURST * SEC)));
    let mut l = FlowLimiter::new(
        Instant::ZERO,
        FlowRates {
            max_iops: u64::MAX,
            min_iops: 0,
            max_kbps: u64::MAX,
        },
    );
    assert_eq!(l.try_take(Instant::ZERO, u64::MAX), Ok(()));
    assert!(l.try_take(Instant::ZERO, 1).is_err());
    assert_eq!(l.try_take(at(SEC), 1), Ok(()));
}

fn window_cfg(max_flows: usize) -> Scheduler {
    Scheduler::new(
        SchedulerConfig {
            max_flows,
            max_queued: 64,
            ..SchedulerConfig::default()
        },
        Instant::ZERO,
    )
}

const WINDOW: u64 = 100_000_000;

#[test]
fn window_close_reports_only_flows_with_io_and_idle_flows_read_as_zero() {
    let mut s = window_cfg(1000);
    let slots: Vec<FlowSlot> = (0..1000)
        .map(|_| s.open_flow(Instant::ZERO, limit(1_000_000)).unwrap())
        .collect();
    let (a, b, quiet) = (slots[10], slots[500], slots[999]);
    // Window 1: a and b do I/O (b through the queue too).
    assert!(s.try_now(at(1), a, 8192));
    assert!(s.try_now(at(2), b, 16384));
    s.enqueue(b, 7, 8192).unwrap();
    assert_eq!(s.next_ready(at(3)), Some((b, 7)));
    // Window 2 (closed at 100 ms): only a does I/O.
    s.tick(at(WINDOW));
    let listed: Vec<FlowSlot> = s.closed_window_slots().collect();
    assert_eq!(listed, [a, b]);
    let wa = s.last_window(a).unwrap();
    assert_eq!((wa.offered_ios, wa.served_ios, wa.served_kb), (1, 1, 8));
    assert_eq!(wa.length.as_nanos(), WINDOW);
    let wb = s.last_window(b).unwrap();
    assert_eq!((wb.offered_ios, wb.served_ios, wb.served_kb), (3, 3, 24));
    assert!(s.try_now(at(WINDOW + 5), a, 8192));
    // Closing window 2: b is listed once more, with its all-zero report.
    s.tick(at(2 * WINDOW + 1));
    let listed: Vec<FlowSlot> = s.closed_window_slots().collect();
    assert_eq!(listed, [a, b]);
    let zero = |w: WindowReport, len: u64| {
        w.offered_ios == 0
            && w.served_ios == 0
            && w.served_kb == 0
            && w.backlog_ios == 0
            && w.reservation_met
            && w.length.as_nanos() == len
    };
    let wb = s.last_window(b).unwrap();
    assert!(zero(wb, WINDOW + 1), "{wb:?}");
    assert_eq!(s.last_window(a).unwrap().served_ios, 1);
    // Window 3: nothing at all. Only a (busy in window 2) is listed; b
    // and the flow that never did I/O read as idle windows all the same.
    s.tick(at(3 * WINDOW + 1));
    let listed: Vec<FlowSlot> = s.closed_window_slots().collect();
    assert_eq!(listed, [a]);
    for f in [a, b, quiet] {
        let w = s.last_window(f).unwrap();
        assert!(zero(w, WINDOW), "{f:?} {w:?}");
    }
    s.tick(at(4 * WINDOW + 1));
    assert_eq!(s.closed_window_slots().count(), 0);
}

#[test]
fn queued_flow_stays_accounted_across_windows_and_reopened_slot_starts_clean() {
    let mut s = window_cfg(4);
    let q = s.open_flow(Instant::ZERO, limit(10)).unwrap();
    // A burst of 1 at 10 IOPS: the first I/O passes, the second waits
    // 100 ms, past the end of the window.
    assert!(s.try_now(at(0), q, 8192));
    s.enqueue(q, 1, 8192).unwrap();
    assert_eq!(s.next_ready(at(1)), None);
    s.tick(at(WINDOW));
    let w = s.last_window(q).unwrap();
    assert_eq!((w.offered_ios, w.served_ios, w.backlog_ios), (2, 1, 0));
    s.tick(at(2 * WINDOW));
    // Still queued at the start of window 2: listed, backlog 1.
    assert_eq!(s.closed_window_slots().collect::<Vec<_>>(), [q]);
    assert_eq!(s.last_window(q).unwrap().backlog_ios, 1);
    assert_eq!(s.next_ready(at(2 * WINDOW + 1)), Some((q, 1)));
    // A slot closed and reopened within a window reports the new flow
    // only.
    let r = s
        .open_flow(at(2 * WINDOW + 2), FlowRates::UNLIMITED)
        .unwrap();
    assert!(s.try_now(at(2 * WINDOW + 3), r, 1 << 20));
    assert!(s.close_flow(r));
    let r2 = s
        .open_flow(at(2 * WINDOW + 4), FlowRates::UNLIMITED)
        .unwrap();
    assert_eq!(r2, r);
    assert_eq!(s.last_window(r2).unwrap().length.as_nanos(), 0);
    assert!(s.try_now(at(2 * WINDOW + 5), r2, 8192));
    s.tick(at(3 * WINDOW + 2));
    assert_eq!(s.last_window(r2).unwrap().served_ios, 1);
    assert_eq!(
        s.closed_window_slots().filter(|&x| x == r2).count(),
        1,
        "listed once"
    );
}

#[test]
fn window_close_with_most_flows_listed_reports_the_same() {
    // 10 of 16 flows with I/O: the close sweeps the slots in order instead
    // of walking the list; the reports and the listed slots are the same.
    let mut s = window_cfg(16);
    let slots: Vec<FlowSlot> = (0..16)
        .map(|_| s.open_flow(Instant::ZERO, limit(1_000_000)).unwrap())
        .collect();
    let busy: Vec<FlowSlot> = [9, 3, 15, 0, 7, 12, 1, 5, 10, 14]
        .iter()
        .map(|&i| slots[i])
        .collect();
    for (k, &f) in busy.iter().enumerate() {
        for _ in 0..=k {
            assert!(s.try_now(at(k as u64 + 1), f, 4096));
        }
    }
    s.tick(at(WINDOW));
    let mut want = busy.clone();
    want.sort();
    let listed: Vec<FlowSlot> = s.closed_window_slots().collect();
    assert_eq!(listed, want);
    for (k, &f) in busy.iter().enumerate() {
        let w = s.last_window(f).unwrap();
        assert_eq!(
            (w.served_ios, w.served_kb),
            (k as u64 + 1, 4 * (k as u64 + 1))
        );
    }
    // Next window: one flow busy; all ten get their closing report (the
    // list is still long), then only the busy one stays listed.
    assert!(s.try_now(at(WINDOW + 1), busy[0], 4096));
    s.tick(at(2 * WINDOW));
    assert_eq!(s.closed_window_slots().collect::<Vec<_>>(), want);
    assert_eq!(s.last_window(busy[0]).unwrap().served_ios, 1);
    assert_eq!(s.last_window(busy[1]).unwrap().served_ios, 0);
    s.tick(at(3 * WINDOW));
    assert_eq!(s.closed_window_slots().collect::<Vec<_>>(), [busy[0]]);
}

/// A scheduler of 4 flows lending lanes `loan` at a time.
fn loan_sched(loan: Duration) -> Scheduler {
    Scheduler::new(
        SchedulerConfig {
            max_flows: 4,
            max_queued: 64,
            lane_loan: loan,
            ..SchedulerConfig::default()
        },
        Instant::ZERO,
    )
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// Largest sum of `cost` over admissions (time, cost) sorted by time falling
/// in any closed interval of `len` ns.
fn max_in_interval(admitted: &[(u64, u64)], len: u64) -> u64 {
    let (mut lo, mut sum, mut best) = (0usize, 0u64, 0u64);
    for &(t, c) in admitted {
        sum += c;
        while admitted[lo].0 + len < t {
            sum -= admitted[lo].1;
            lo += 1;
        }
        best = best.max(sum);
    }
    best
}

#[test]
fn lanes_of_one_flow_keep_its_limits_over_every_interval_and_reach_them() {
    // (max_iops, max_kbps, lanes, largest I/O, bursty): offered about
    // twice what the limits allow, from several Opens' lanes at once,
    // through the fast path and, when refused, the queue (as the server
    // does). Bursty: 100 ms at a twentieth of that (the lanes take loans
    // and spend them slowly while the flow's buckets fill up), then 100 ms
    // at twice that, and so on.
    let cases = [
        (100_000, 0, 1, 4096, false),
        (2000, 0, 1, 4096, false),
        (2000, 0, 6, 4096, false),
        (50_000, 160_000, 4, 65536, false),
        (0, 80_000, 3, 16384, false),
        (300, 0, 2, 1 << 20, false),
        (100_000, 0, 8, 4096, true),
        (40_000, 100_000, 5, 16384, true),
    ];
    // With loans (lanes) and without (every I/O on the flow's records).
    let runs = cases
        .iter()
        .enumerate()
        .flat_map(|(i, c)| [DEFAULT_LANE_LOAN, Duration::ZERO].map(move |l| (i, c, l)));
    for (case, &(max_iops, max_kbps, lanes, max_bytes, bursty), loan) in runs {
        let rates = FlowRates {
            max_iops,
            min_iops: 0,
            max_kbps,
        };
        let mut s = loan_sched(loan);
        let f = s.open_flow(at(0), rates).unwrap();
        let mut lane = vec![Lane::EMPTY; lanes];
        let mut rng = 0x2545_F491_4F6C_DD1Du64 + case as u64;
        let mut admitted: Vec<(u64, u64, u64)> = Vec::new();
        let mut queued: Vec<u64> = Vec::new();
        let (mut now, end) = (0u64, 3 * SEC);
        // I/Os average max_bytes / 2: offer twice what the tighter limit
        // allows.
        let mean = max_bytes as f64 / 2.0;
        let mut allowed = f64::MAX;
        if max_iops != 0 {
            allowed = allowed.min(max_iops as f64 / (mean / 8192.0).ceil().max(1.0));
        }
        if max_kbps != 0 {
            allowed = allowed.min(max_kbps as f64 * 1024.0 / mean);
        }
        let gap = (SEC as f64 / (2.0 * allowed)) as u64;
        let mut arrival = 0u64;
        while now < end {
            // Dispatch waiting requests when the limits allow them (the
            // server polls at its next wakeup), until the next arrival.
            if let Some(w) = s.next_wakeup().filter(|w| w.as_nanos() <= arrival) {
                now = now.max(w.as_nanos());
                while let Some((slot, id)) = s.next_ready(at(now)) {
                    assert_eq!(slot, f);
                    let bytes = queued[id as usize];
                    admitted.push((now, io_cost(bytes, 8192), kb_cost(bytes)));
                }
                if s.next_wakeup().is_some_and(|w| w.as_nanos() <= now) {
                    now += 1;
                }
                continue;
            }
            now = arrival;
            let gap = match (bursty, (now / 100_000_000) % 2) {
                (false, _) => gap,
                (true, 0) => gap * 20,
                (true, _) => gap / 2,
            };
            arrival += xorshift(&mut rng) % (2 * gap).max(1);
            let bytes = 1 + xorshift(&mut rng) % max_bytes;
            let l = (xorshift(&mut rng) % lanes as u64) as usize;
            if s.try_lane(at(now), f, &mut lane[l], bytes) {
                admitted.push((now, io_cost(bytes, 8192), kb_cost(bytes)));
            } else if s.total_queued() < 64 {
                queued.push(bytes);
                s.enqueue(f, queued.len() as u64 - 1, bytes).unwrap();
            }
        }
        let ios: Vec<(u64, u64)> = admitted.iter().map(|a| (a.0, a.1)).collect();
        let kbs: Vec<(u64, u64)> = admitted.iter().map(|a| (a.0, a.2)).collect();
        let (ib, kbb) = (
            burst_for(max_iops, DEFAULT_BURST_WINDOW),
            burst_for(max_kbps, DEFAULT_BURST_WINDOW),
        );
        // An I/O larger than the burst is admitted on a full bucket and
        // its debt paid back after: allow one such I/O beyond the bound.
        let (big_i, big_k) = (io_cost(max_bytes, 8192), kb_cost(max_bytes));
        for len in [1_000_000, 20_000_000, 100_000_000, 700_000_000, end] {
            if max_iops != 0 {
                let bound = max_iops * len / SEC + ib + big_i.saturating_sub(ib);
                let got = max_in_interval(&ios, len);
                assert!(
                    got <= bound,
                    "case {case} (loan {loan:?}): {got} I/Os in {len} ns > {bound}"
                );
            }
            if max_kbps != 0 {
                let bound = max_kbps * len / SEC + kbb + big_k.saturating_sub(kbb);
                let got = max_in_interval(&kbs, len);
                assert!(
                    got <= bound,
                    "case {case} (loan {loan:?}): {got} KB in {len} ns > {bound}"
                );
            }
        }
        // Offered twice the limit: it gets (nearly) all of it.
        let total: (u64, u64) = admitted.iter().fold((0, 0), |a, x| (a.0 + x.1, a.1 + x.2));
        let secs = end / SEC;
        let reached = bursty
            || (max_iops != 0 && total.0 * 100 >= max_iops * secs * 97)
            || (max_kbps != 0 && total.1 * 100 >= max_kbps * secs * 97);
        assert!(
            reached,
            "case {case} (loan {loan:?}): {total:?} (I/Os, KB) in {secs} s, limits {max_iops} / {max_kbps}"
        );
    }
}

#[test]
fn lane_loans_are_charged_to_the_flow_and_come_back_unspent() {
    // 100,000 IOPS: a burst of 2,000, a loan of 100 (1 ms).
    let mut s = window_cfg(4);
    let f = s.open_flow(at(0), limit(100_000)).unwrap();
    let mut a = Lane::EMPTY;
    assert!(s.try_lane(at(0), f, &mut a, 4096));
    assert_eq!(a.unspent().0, 100);
    assert!(s.lane_covers(&a, 4096));
    // The loan covers 100 more I/Os without the flow.
    for _ in 0..100 {
        assert!(s.try_lane(at(0), f, &mut a, 4096));
    }
    assert_eq!(a.unspent().0, 0);
    assert!(!s.lane_covers(&a, 4096));
    // The next one comes back to the flow and takes a new loan: 1 + 100 +
    // 1 + 100 of the 2,000 are gone; the rest is the flow's.
    assert!(s.try_lane(at(0), f, &mut a, 4096));
    let mut rest = 0;
    while s.try_now(at(0), f, 4096) {
        rest += 1;
    }
    assert_eq!(rest, 2000 - 202);
    // Released, the 100 unspent are the flow's again, and no longer
    // accounted as served.
    s.release_lane(f, &mut a);
    assert!(a.is_empty());
    for _ in 0..100 {
        assert!(s.try_now(at(0), f, 4096));
    }
    assert!(!s.try_now(at(0), f, 4096));
    s.tick(at(WINDOW));
    assert_eq!(s.last_window(f).unwrap().served_ios, 2000);
}

#[test]
fn window_close_ends_loans_and_reports_them_served_until_returned() {
    let mut s = window_cfg(4);
    let f = s.open_flow(at(0), limit(100_000)).unwrap();
    let (mut a, mut b) = (Lane::EMPTY, Lane::EMPTY);
    assert!(s.try_lane(at(1), f, &mut a, 4096));
    assert!(s.try_lane(at(2), f, &mut b, 4096));
    assert!(s.try_lane(at(3), f, &mut a, 4096));
    // Served: 3 I/Os, plus the 99 + 100 lent and not spent.
    s.tick(at(WINDOW + 3));
    assert_eq!(s.last_window(f).unwrap().served_ios, 3 + 99 + 100);
    // The loans ended with the window: the next I/O of each lane goes to
    // the flow, which gets the unspent credit back (capped at its burst,
    // here already full) and lends anew.
    assert!(!s.lane_covers(&a, 4096));
    assert!(s.try_lane(at(WINDOW + 4), f, &mut a, 4096));
    assert_eq!(a.unspent().0, 100);
    s.release_lane(f, &mut a);
    s.release_lane(f, &mut b);
    s.tick(at(2 * WINDOW + 4));
    assert_eq!(s.last_window(f).unwrap().served_ios, 1);
    // A flow limited in neither dimension lends its lanes a fixed loan
    // (accounting only).
    let u = s
        .open_flow(at(2 * WINDOW + 5), FlowRates::UNLIMITED)
        .unwrap();
    let mut c = Lane::EMPTY;
    assert!(s.try_lane(at(2 * WINDOW + 5), u, &mut c, 1 << 20));
    assert!(c.unspent().0 > 0 && s.lane_covers(&c, 4096));
}

#[test]
fn lanes_are_not_used_while_requests_wait_and_zero_loan_disables_them() {
    let mut s = window_cfg(4);
    let f = s.open_flow(at(0), limit(100_000)).unwrap();
    let g = s.open_flow(at(0), limit(1)).unwrap();
    let mut a = Lane::EMPTY;
    assert!(s.try_lane(at(0), f, &mut a, 4096));
    // g's queue is not empty: no fast path, the lane's loan is kept.
    assert!(s.try_now(at(0), g, 4096));
    s.enqueue(g, 7, 4096).unwrap();
    assert!(!s.try_lane(at(1), f, &mut a, 4096));
    assert_eq!(a.unspent().0, 100);
    let mut s = loan_sched(Duration::ZERO);
    let f = s.open_flow(at(0), limit(100_000)).unwrap();
    let mut a = Lane::EMPTY;
    assert!(s.try_lane(at(0), f, &mut a, 4096));
    assert!(a.is_empty());
}

#[test]
fn a_client_paced_at_the_limit_is_admitted_at_once_through_its_lane() {
    // 8 reads of 4 KiB every 4 ms: exactly 2,000 IOPS, the flow's limit
    // (what `bench --workload qos` offers when it limits itself). The
    // 40-I/O burst absorbs the groups: none waits, with loans or without.
    for loan in [DEFAULT_LANE_LOAN, Duration::ZERO] {
        let mut s = loan_sched(loan);
        let f = s.open_flow(at(0), limit(2000)).unwrap();
        let mut lane = Lane::EMPTY;
        let mut refused = 0;
        for group in 0..750u64 {
            for k in 0..8 {
                let now = at(group * 4_000_000 + k * 1000);
                if !s.try_lane(now, f, &mut lane, 4096) {
                    refused += 1;
                }
            }
        }
        assert_eq!(refused, 0, "loan {loan:?}");
    }
}
