//! In-run A/B: two variants of a code path measured in one run.
//!
//! Built only with the `ab-phases` feature (`cargo build --release
//! --features ab-phases`); without it [`variant_b`] is a constant `false`
//! and [`set_variant_b`] does nothing, so code that asks costs nothing.
//!
//! Why: in the Soft-RoCE guest (TCG) one run's p50 round trip sits in a
//! regime that lasts the whole run and moves by up to a half from run to
//! run of the same binary (`send` 512 B: 77-146 us in one boot; turning
//! address-space randomisation off does not narrow it). An A/B of two builds, or of an environment
//! switch read at start, alternated run by run, cannot see anything smaller
//! than that: a PAUSE-less worker loop looked 19 % faster in one boot and
//! 20 % slower in the next. Alternating the variants *within* a run puts
//! both under the same regime: `smbdirectd bench` (with the feature) flips
//! the switch every [`PHASE_OPS`] measured operations and keeps a latency
//! histogram per variant; the same PAUSE A/B measured 0.96-1.03 run after
//! run that way (docs/bench-results.md, session 33; `scripts/ab-rxe.sh`).
//!
//! An experiment is a throw-away diff that asks [`variant_b`] where the two
//! variants part (the worker's loop, the client's path, the provider): the
//! server and the client of a loopback run share the process, so one
//! switch serves both. Variant A is what runs with the switch off, so the
//! warm-up and set-up always run A.

/// Measured operations per phase: the variant changes after every
/// `PHASE_OPS` of them (A first).
pub const PHASE_OPS: u64 = 100;

/// Operations at the start of each phase left out of its histogram: they
/// may have started, or met a server that read the switch, before it
/// flipped.
pub const SETTLE_OPS: u64 = 5;

/// Which variant the `n`-th measured operation (from 0) ran under, 0 for A
/// and 1 for B; None for one of the first [`SETTLE_OPS`] of its phase.
pub fn phase_of(n: u64) -> Option<usize> {
    (n % PHASE_OPS >= SETTLE_OPS).then_some(usize::from(b_after(n)))
}

/// The variant the next operation runs under, once `done` measured
/// operations have finished.
pub fn b_after(done: u64) -> bool {
    (done / PHASE_OPS) % 2 == 1
}

#[cfg(feature = "ab-phases")]
mod imp {
    use std::sync::atomic::{AtomicBool, Ordering};

    static B: AtomicBool = AtomicBool::new(false);

    /// Whether this build alternates variants (the `ab-phases` feature).
    pub const ENABLED: bool = true;

    /// Whether code under experiment runs its variant B now.
    #[inline(always)]
    pub fn variant_b() -> bool {
        B.load(Ordering::Relaxed)
    }

    /// Switches every thread to variant B (`true`) or A.
    pub fn set_variant_b(b: bool) {
        B.store(b, Ordering::Relaxed);
    }
}

#[cfg(not(feature = "ab-phases"))]
mod imp {
    /// Whether this build alternates variants (the `ab-phases` feature).
    pub const ENABLED: bool = false;

    /// Whether code under experiment runs its variant B now: never.
    #[inline(always)]
    pub fn variant_b() -> bool {
        false
    }

    /// Does nothing without the `ab-phases` feature.
    #[inline(always)]
    pub fn set_variant_b(_b: bool) {}
}

pub use imp::*;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_alternate_and_leave_out_their_first_operations() {
        // A, then B, then A again, each PHASE_OPS long.
        assert_eq!(phase_of(SETTLE_OPS), Some(0));
        assert_eq!(phase_of(PHASE_OPS - 1), Some(0));
        assert_eq!(phase_of(PHASE_OPS + SETTLE_OPS), Some(1));
        assert_eq!(phase_of(2 * PHASE_OPS - 1), Some(1));
        assert_eq!(phase_of(2 * PHASE_OPS + SETTLE_OPS), Some(0));
        for start in [0, PHASE_OPS, 2 * PHASE_OPS] {
            for k in 0..SETTLE_OPS {
                assert_eq!(phase_of(start + k), None, "operation {}", start + k);
            }
        }
        // Over whole phase pairs the two variants get as many samples.
        let counts = (0..10 * PHASE_OPS)
            .filter_map(phase_of)
            .fold([0u32; 2], |mut c, p| {
                c[p] += 1;
                c
            });
        assert_eq!(counts, [5 * (PHASE_OPS - SETTLE_OPS) as u32; 2]);
    }

    #[test]
    fn the_switch_set_after_an_operation_is_the_next_ones_phase() {
        // Operation n + 1 runs under the switch set once n + 1 are done.
        for n in 0..5 * PHASE_OPS {
            assert_eq!(b_after(n + 1), (n + 1) / PHASE_OPS % 2 == 1);
            if let Some(p) = phase_of(n + 1) {
                assert_eq!(b_after(n + 1), p == 1, "operation {}", n + 1);
            }
        }
        assert!(!b_after(0), "the first measured operation runs A");
    }

    #[test]
    fn without_the_feature_the_switch_is_always_a() {
        set_variant_b(true);
        assert_eq!(variant_b(), ENABLED);
        set_variant_b(false);
        assert!(!variant_b());
    }
}
