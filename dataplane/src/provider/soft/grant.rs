//! The grant table: one per provider, in a shared segment the provider's
//! peers map, holding every per-I/O remote access grant (the soft
//! equivalent of a type-2 memory window bound to one queue pair).
//!
//! Each queue pair owns a contiguous range of slots (reserved at connection
//! setup) and is the only writer of their contents; the peer of that
//! connection is the only party that may *use* them. A slot is one control
//! word plus the grant's fields:
//!
//! ```text
//! ctl = rkey:32 | state:2 | generation:6 | refs:24
//! ```
//!
//! * `rkey` (the token) = slot index in the low `log2(slots)` bits, fresh
//!   random bits above (never equal to the slot's previous token), so a token
//!   cannot be derived from an earlier one;
//! * `state` FREE -> LIVE (grant) -> DEAD (revoke, or the peer's Send with
//!   Invalidate) -> FREE (the owner reclaims the slot);
//! * `refs` counts accesses in flight that passed validation.
//!
//! An accessor validates everything (token, state, QP binding, direction,
//! bounds) from one snapshot of `ctl`, then takes a reference with a CAS that
//! succeeds only if `ctl` is still that snapshot, copies, and drops the
//! reference. Revoking CASes LIVE -> DEAD, after which no new reference can
//! be taken, and then waits for `refs` to reach zero: when revoke returns, no
//! access can touch the memory, including one that had already validated.
//! Accessors that fail validation never take a reference, so a stray access
//! through the wrong queue pair cannot stall a revoke.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use super::shm::{Padded, Segment, ShmSafe};
use crate::provider::Access;

const MAGIC: u64 = u64::from_le_bytes(*b"SMBDGRNT");

/// Slot states.
const FREE: u64 = 0;
const LIVE: u64 = 1;
const DEAD: u64 = 2;

const REFS_MASK: u64 = (1 << 24) - 1;
const GEN_SHIFT: u32 = 24;
const GEN_MASK: u64 = 0x3f;
const STATE_SHIFT: u32 = 30;

#[inline]
fn token(ctl: u64) -> u32 {
    (ctl >> 32) as u32
}
#[inline]
fn state(ctl: u64) -> u64 {
    (ctl >> STATE_SHIFT) & 3
}
#[inline]
fn refs(ctl: u64) -> u64 {
    ctl & REFS_MASK
}
#[inline]
fn generation(ctl: u64) -> u64 {
    (ctl >> GEN_SHIFT) & GEN_MASK
}
#[inline]
fn make(rkey: u32, st: u64, gen: u64, refs: u64) -> u64 {
    u64::from(rkey) << 32 | st << STATE_SHIFT | (gen & GEN_MASK) << GEN_SHIFT | refs
}
#[inline]
fn with_state(ctl: u64, st: u64) -> u64 {
    ctl & !(3 << STATE_SHIFT) | st << STATE_SHIFT
}

/// One grant.
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct GrantSlot {
    ctl: AtomicU64,
    /// First granted byte, in the grantor's address space (the Buffer
    /// Descriptor's Offset).
    addr: AtomicU64,
    /// `len | binding << 32`.
    len_binding: AtomicU64,
    /// `region | access << 32`.
    region_access: AtomicU64,
}

// SAFETY: repr(C) of atomics.
unsafe impl ShmSafe for GrantSlot {}

#[repr(C)]
#[derive(Debug, Default)]
struct Header {
    magic: AtomicU64,
    slots: AtomicU64,
    provider: AtomicU64,
}

// SAFETY: repr(C) of atomics.
unsafe impl ShmSafe for Header {}

const SLOTS_OFFSET: usize = std::mem::size_of::<Padded<Header>>();

/// Why an access through a grant was refused ([MS-SMBD] 3.1.4.3: only the
/// permissions appropriate, on the specified Connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No grant ever had this token (or it names a slot of nobody's).
    BadToken,
    /// The grant existed and was revoked or invalidated.
    Revoked,
    /// The grant is bound to another queue pair.
    WrongQp,
    /// The access exceeds the granted bytes.
    OutOfRange,
    /// Read through a write grant or the reverse.
    WrongDirection,
}

impl Refusal {
    /// Index into the per-kind counters.
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// What the owner's revoke found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RevokeOutcome {
    /// It was live; now it is dead and idle.
    Revoked,
    /// The peer had already invalidated it.
    AlreadyDead,
    /// No grant with this rkey in the slot (already reclaimed, or never).
    Unknown,
}

/// A validated access holding a reference on its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Acquired {
    pub(crate) slot: u32,
    pub(crate) region: u32,
}

fn access_code(a: Access) -> u64 {
    match a {
        Access::RemoteRead => 1,
        Access::RemoteWrite => 2,
    }
}

/// A grant table: ours, or a peer provider's mapped here.
#[derive(Debug)]
pub(crate) struct GrantTable {
    seg: Segment,
    slots: u32,
    bits: u32,
}

impl GrantTable {
    /// Bytes of a table with `slots` slots.
    fn segment_len(slots: u32) -> usize {
        SLOTS_OFFSET + slots as usize * std::mem::size_of::<GrantSlot>()
    }

    /// Creates a provider's table (`slots` a power of two).
    pub(crate) fn create(slots: u32, provider: u64) -> io::Result<Self> {
        debug_assert!(slots.is_power_of_two());
        let seg = Segment::create(c"smbdirectd-soft-grants", Self::segment_len(slots))?;
        let h: &Padded<Header> = seg.at(0);
        h.magic.store(MAGIC, Ordering::Relaxed);
        h.slots.store(u64::from(slots), Ordering::Relaxed);
        h.provider.store(provider, Ordering::Relaxed);
        Ok(GrantTable {
            seg,
            slots,
            bits: slots.trailing_zeros(),
        })
    }

    /// Maps a peer's table, checking it is the one the handshake announced.
    pub(crate) fn open(fd: std::os::fd::OwnedFd, slots: u32, provider: u64) -> io::Result<Self> {
        if !slots.is_power_of_two() || slots > 1 << 24 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "bad grant table size",
            ));
        }
        let seg = Segment::open(fd, Self::segment_len(slots))?;
        let h: &Padded<Header> = seg.at(0);
        if h.magic.load(Ordering::Relaxed) != MAGIC
            || h.slots.load(Ordering::Relaxed) != u64::from(slots)
            || h.provider.load(Ordering::Relaxed) != provider
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "peer's grant table header does not match the handshake",
            ));
        }
        Ok(GrantTable {
            seg,
            slots,
            bits: slots.trailing_zeros(),
        })
    }

    /// The memfd, to pass to peers.
    pub(crate) fn segment(&self) -> &Segment {
        &self.seg
    }

    /// Number of slots.
    pub(crate) fn slots(&self) -> u32 {
        self.slots
    }

    /// The slot an rkey names.
    #[inline]
    pub(crate) fn index_of(&self, rkey: u32) -> u32 {
        rkey & (self.slots - 1)
    }

    #[inline]
    fn slot(&self, index: u32) -> &GrantSlot {
        // The slice accessor checks bounds against the mapping; the index is
        // masked so it is always in range.
        &self
            .seg
            .slice::<GrantSlot>(SLOTS_OFFSET, self.slots as usize)
            [(index & (self.slots - 1)) as usize]
    }

    /// A fresh rkey for `index`: random bits above the index, different from
    /// the slot's previous token (so a just-revoked key is never re-issued)
    /// and never zero.
    pub(crate) fn new_rkey(&self, index: u32, mut random: impl FnMut() -> u32) -> u32 {
        let prev = token(self.slot(index).ctl.load(Ordering::Relaxed));
        loop {
            let rkey = random().checked_shl(self.bits).unwrap_or(0) | index;
            if rkey != prev && rkey != 0 {
                return rkey;
            }
        }
    }

    /// Owner: publishes a grant in a FREE slot.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn publish(
        &self,
        index: u32,
        rkey: u32,
        addr: u64,
        len: u32,
        binding: u32,
        region: u32,
        access: Access,
    ) {
        let s = self.slot(index);
        // Relaxed: the owner is the only writer of a FREE slot.
        let ctl = s.ctl.load(Ordering::Relaxed);
        debug_assert_eq!(state(ctl), FREE);
        debug_assert_eq!(refs(ctl), 0);
        s.addr.store(addr, Ordering::Relaxed);
        s.len_binding
            .store(u64::from(len) | u64::from(binding) << 32, Ordering::Relaxed);
        s.region_access.store(
            u64::from(region) | access_code(access) << 32,
            Ordering::Relaxed,
        );
        // Release: the field stores above happen-before any accessor's
        // Acquire load that sees LIVE with this token.
        s.ctl
            .store(make(rkey, LIVE, generation(ctl) + 1, 0), Ordering::Release);
    }

    /// Accessor: validates an access of `len` bytes at `addr` needing
    /// `access`, by the connection whose grants carry `binding`, and takes a
    /// reference. Release it with [`Self::release`].
    #[inline]
    pub(crate) fn acquire(
        &self,
        rkey: u32,
        binding: u32,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<Acquired, Refusal> {
        let index = self.index_of(rkey);
        let s = self.slot(index);
        loop {
            // Acquire pairs with `publish`'s Release: the fields below are
            // the ones published with this token.
            let ctl = s.ctl.load(Ordering::Acquire);
            if token(ctl) != rkey {
                return Err(Refusal::BadToken);
            }
            if state(ctl) != LIVE {
                return Err(Refusal::Revoked);
            }
            let lb = s.len_binding.load(Ordering::Relaxed);
            let ra = s.region_access.load(Ordering::Relaxed);
            let base = s.addr.load(Ordering::Relaxed);
            if (lb >> 32) as u32 != binding {
                return Err(Refusal::WrongQp);
            }
            if ra >> 32 != access_code(access) {
                return Err(Refusal::WrongDirection);
            }
            let end = base + (lb & 0xffff_ffff);
            match addr.checked_add(len) {
                Some(e) if addr >= base && e <= end => {}
                _ => return Err(Refusal::OutOfRange),
            }
            if refs(ctl) == REFS_MASK {
                std::hint::spin_loop();
                continue;
            }
            // AcqRel. Release: our field loads above cannot be reordered
            // after this CAS, so if any of them saw a later grant's store
            // (which the owner makes only after its own AcqRel CAS to DEAD),
            // that CAS precedes ours in `ctl`'s modification order and ours
            // fails. Acquire: the copy that follows is ordered after it.
            // Success therefore means the fields were this grant's, and the
            // slot cannot leave LIVE-with-refs until we release.
            if s.ctl
                .compare_exchange_weak(ctl, ctl + 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return Ok(Acquired {
                    slot: index,
                    region: ra as u32,
                });
            }
        }
    }

    /// Accessor: drops the reference taken by [`Self::acquire`].
    #[inline]
    pub(crate) fn release(&self, a: Acquired) {
        // Release: our copy to/from the granted memory happens-before a
        // revoker's Acquire load that sees the count drop.
        self.slot(a.slot).ctl.fetch_sub(1, Ordering::Release);
    }

    /// The peer's Send with Invalidate ([MS-SMBD] 3.1.5.1 / 3.1.4.4): kills
    /// a live grant bound to `binding`. Only the bound connection's peer
    /// takes references, and it is the caller, so no access is in flight.
    pub(crate) fn invalidate(&self, rkey: u32, binding: u32) -> Result<(), Refusal> {
        let s = self.slot(self.index_of(rkey));
        loop {
            // Acquire: as in `acquire`.
            let ctl = s.ctl.load(Ordering::Acquire);
            if token(ctl) != rkey {
                return Err(Refusal::BadToken);
            }
            if state(ctl) != LIVE {
                return Err(Refusal::Revoked);
            }
            if (s.len_binding.load(Ordering::Relaxed) >> 32) as u32 != binding {
                return Err(Refusal::WrongQp);
            }
            // AcqRel: as in `acquire` (the binding load is not reordered after it).
            if s.ctl
                .compare_exchange_weak(
                    ctl,
                    with_state(ctl, DEAD),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                return Ok(());
            }
        }
    }

    /// Owner: revokes `rkey` in slot `index`; on return no access can touch
    /// the granted memory. `gone` says the only possible accessor (the peer
    /// process) has exited, so references it still holds will never drop.
    pub(crate) fn revoke(&self, index: u32, rkey: u32, gone: impl Fn() -> bool) -> RevokeOutcome {
        let s = self.slot(index);
        loop {
            let ctl = s.ctl.load(Ordering::Relaxed);
            if token(ctl) != rkey {
                return RevokeOutcome::Unknown;
            }
            match state(ctl) {
                LIVE => {
                    // AcqRel: Acquire keeps the owner's later field stores
                    // (a re-grant) after this transition, which is what
                    // `acquire`'s CAS argument relies on.
                    if s.ctl
                        .compare_exchange_weak(
                            ctl,
                            with_state(ctl, DEAD),
                            Ordering::AcqRel,
                            Ordering::Relaxed,
                        )
                        .is_ok()
                    {
                        self.wait_idle(index, &gone);
                        return RevokeOutcome::Revoked;
                    }
                }
                DEAD => {
                    self.wait_idle(index, &gone);
                    return RevokeOutcome::AlreadyDead;
                }
                _ => return RevokeOutcome::Unknown,
            }
        }
    }

    /// Waits until no access holds a reference on slot `index`.
    fn wait_idle(&self, index: u32, gone: &impl Fn() -> bool) {
        let s = self.slot(index);
        let mut spins = 0u32;
        // Acquire pairs with `release`'s Release: the accessor's copy is
        // complete before we return.
        while refs(s.ctl.load(Ordering::Acquire)) != 0 {
            if gone() {
                return;
            }
            spins += 1;
            if spins < 1000 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Owner: whether slot `index` is DEAD (revoked by the peer, not yet
    /// reclaimed).
    pub(crate) fn is_dead(&self, index: u32) -> bool {
        state(self.slot(index).ctl.load(Ordering::Relaxed)) == DEAD
    }

    /// Whether slot `index` is LIVE; returns its rkey.
    pub(crate) fn live_rkey(&self, index: u32) -> Option<u32> {
        let ctl = self.slot(index).ctl.load(Ordering::Relaxed);
        (state(ctl) == LIVE).then_some(token(ctl))
    }

    /// Owner: makes a DEAD, idle slot FREE (its token stays, so the stale
    /// rkey keeps failing as "revoked" until the slot is re-granted).
    pub(crate) fn reclaim(&self, index: u32) {
        let s = self.slot(index);
        let ctl = s.ctl.load(Ordering::Relaxed);
        if state(ctl) == DEAD {
            // Relaxed: accessors ignore non-LIVE slots; the next `publish`
            // is by this same owner thread.
            s.ctl.store(with_state(ctl, FREE), Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    fn table() -> GrantTable {
        GrantTable::create(256, 7).unwrap()
    }

    #[test]
    fn validation_refuses_each_violation_kind() {
        let t = table();
        let mut r = 0x1234_5678u32;
        let rkey = t.new_rkey(5, || {
            r = r.wrapping_mul(2_654_435_761);
            r
        });
        assert_eq!(t.index_of(rkey), 5);
        t.publish(5, rkey, 0x1000, 100, 9, 3, Access::RemoteWrite);
        let a = t
            .acquire(rkey, 9, 0x1000, 100, Access::RemoteWrite)
            .unwrap();
        assert_eq!(a, Acquired { slot: 5, region: 3 });
        t.release(a);
        assert_eq!(
            t.acquire(rkey ^ 0x100, 9, 0x1000, 1, Access::RemoteWrite),
            Err(Refusal::BadToken)
        );
        assert_eq!(
            t.acquire(rkey, 8, 0x1000, 1, Access::RemoteWrite),
            Err(Refusal::WrongQp)
        );
        assert_eq!(
            t.acquire(rkey, 9, 0x1000, 1, Access::RemoteRead),
            Err(Refusal::WrongDirection)
        );
        assert_eq!(
            t.acquire(rkey, 9, 0x1000, 101, Access::RemoteWrite),
            Err(Refusal::OutOfRange)
        );
        assert_eq!(
            t.acquire(rkey, 9, 0xfff, 1, Access::RemoteWrite),
            Err(Refusal::OutOfRange)
        );
        assert_eq!(
            t.acquire(rkey, 9, u64::MAX, 2, Access::RemoteWrite),
            Err(Refusal::OutOfRange)
        );
        assert_eq!(t.revoke(5, rkey, || false), RevokeOutcome::Revoked);
        assert_eq!(
            t.acquire(rkey, 9, 0x1000, 1, Access::RemoteWrite),
            Err(Refusal::Revoked)
        );
        t.reclaim(5);
        assert_eq!(
            t.acquire(rkey, 9, 0x1000, 1, Access::RemoteWrite),
            Err(Refusal::Revoked)
        );
        let again = t.new_rkey(5, || 0);
        assert_ne!(again, rkey, "a just-revoked token is never re-issued");
        assert_eq!(t.revoke(5, rkey, || false), RevokeOutcome::Unknown);
    }

    #[test]
    fn invalidate_then_revoke_is_not_an_error() {
        let t = table();
        let rkey = t.new_rkey(1, || 77);
        t.publish(1, rkey, 0, 10, 4, 0, Access::RemoteRead);
        assert_eq!(t.invalidate(rkey, 3), Err(Refusal::WrongQp));
        assert_eq!(t.invalidate(rkey, 4), Ok(()));
        assert_eq!(t.invalidate(rkey, 4), Err(Refusal::Revoked));
        assert!(t.is_dead(1));
        assert_eq!(t.revoke(1, rkey, || false), RevokeOutcome::AlreadyDead);
    }

    #[test]
    fn revoke_waits_for_an_access_in_flight() {
        let t = Arc::new(table());
        let rkey = t.new_rkey(2, || 99);
        t.publish(2, rkey, 0, 10, 1, 0, Access::RemoteWrite);
        let a = t.acquire(rkey, 1, 0, 10, Access::RemoteWrite).unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let h = {
            let (t, done) = (t.clone(), done.clone());
            std::thread::spawn(move || {
                assert_eq!(t.revoke(2, rkey, || false), RevokeOutcome::Revoked);
                done.store(true, Ordering::SeqCst);
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(30));
        assert!(
            !done.load(Ordering::SeqCst),
            "revoke returned while an access was in flight"
        );
        // New accesses are already refused while revoke waits.
        assert_eq!(
            t.acquire(rkey, 1, 0, 10, Access::RemoteWrite),
            Err(Refusal::Revoked)
        );
        t.release(a);
        h.join().unwrap();
        assert!(done.load(Ordering::SeqCst));
    }
}
