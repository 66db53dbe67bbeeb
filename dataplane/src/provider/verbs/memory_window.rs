//! Per-I/O grants ([MS-SMBD] 3.1.4.3 Register Buffer, 3.1.4.4 Deregister
//! Buffer): a pool of type-2 memory windows per queue pair, or per-I/O
//! registrations on a device without them.

use std::collections::HashMap;
use std::io;
use std::os::raw::c_int;

use rdma_sys::*;

use crate::provider::{Access, ProviderError};

/// `ibv_inc_rkey`: the next value of the rkey's 8-bit key.
pub(super) fn next_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

/// Access flags of a window bound for `access`: exactly one remote right.
pub(super) fn window_access(access: Access) -> ibv_access_flags {
    match access {
        Access::RemoteRead => ibv_access_flags::IBV_ACCESS_REMOTE_READ,
        Access::RemoteWrite => ibv_access_flags::IBV_ACCESS_REMOTE_WRITE,
    }
}

/// Access flags of a per-I/O registration for `access` (verbs requires
/// local write along with remote write).
pub(super) fn registration_access(access: Access) -> ibv_access_flags {
    match access {
        Access::RemoteRead => ibv_access_flags::IBV_ACCESS_REMOTE_READ,
        Access::RemoteWrite => {
            ibv_access_flags::IBV_ACCESS_REMOTE_WRITE | ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
        }
    }
}

#[derive(Debug)]
struct Window {
    mw: *mut ibv_mw,
    /// The rkey of the current (or last) binding.
    rkey: u32,
    bound: bool,
    /// rxe quirk: the exact-range registration the window is bound onto
    /// (its key in [`WindowPool::backings`]).
    backing: Option<(u64, u32)>,
}

/// rxe quirk: a registration of exactly one granted range, kept for the
/// next grant of the same range.
#[derive(Debug)]
struct Backing {
    mr: *mut ibv_mr,
    /// Windows bound (or being bound) onto it now.
    users: u32,
    /// When it was last taken ([`WindowPool::uses`]): the least recently
    /// used idle one goes first when the cache is full.
    last_use: u64,
}

/// The queue pair's memory windows. The index part of an rkey (its upper 24
/// bits) names the window for good; binds only change the key byte.
#[derive(Debug)]
pub(super) struct WindowPool {
    pd: *mut ibv_pd,
    windows: Vec<Window>,
    free: Vec<u32>,
    by_index: HashMap<u32, u32>,
    /// Bind each window onto a registration of exactly the granted bytes
    /// (the device checks windows against their region's bounds only).
    exact_backing: bool,
    /// Those registrations by (address, length), kept while idle: a client
    /// grants the same I/O buffers over and over, and a registration per
    /// grant cost two system calls per I/O (`ibv_reg_mr`, `ibv_dereg_mr`:
    /// page pinning in the kernel). A registration made for backing has
    /// local rights only (`LOCAL_WRITE | MW_BIND`), so an idle one gives a
    /// peer nothing; only a window bound onto it does, and only to its
    /// exact range. At most [`WindowPool::backing_cap`] are kept; beyond
    /// that an idle one is deregistered.
    backings: HashMap<(u64, u32), Backing>,
    /// Backings taken so far (the clock of `Backing::last_use`).
    uses: u64,
    /// Backing registrations made (`ibv_reg_mr` calls) so far.
    registrations: u64,
    /// Backing registrations whose window was not yet invalidated when
    /// they were released; deregistered later.
    stale: Vec<*mut ibv_mr>,
}

impl WindowPool {
    /// A pool with `n` windows allocated up front.
    pub fn new(pd: *mut ibv_pd, n: u32, exact_backing: bool) -> Result<Self, ProviderError> {
        let mut p = WindowPool {
            pd,
            windows: Vec::with_capacity(n as usize),
            free: Vec::with_capacity(n as usize),
            by_index: HashMap::with_capacity(n as usize),
            exact_backing,
            backings: HashMap::with_capacity(if exact_backing { 2 * n as usize } else { 0 }),
            uses: 0,
            registrations: 0,
            stale: Vec::with_capacity(n as usize),
        };
        for _ in 0..n {
            let i = p.allocate()?;
            p.free.push(i);
        }
        Ok(p)
    }

    fn allocate(&mut self) -> Result<u32, ProviderError> {
        // SAFETY: the PD is live (the device outlives the queue pair); the
        // window is deallocated in Drop.
        let mw = unsafe { ibv_alloc_mw(self.pd, ibv_mw_type::IBV_MW_TYPE_2) };
        let mw = match mw {
            Some(mw) if !mw.is_null() => mw,
            _ => {
                return Err(ProviderError::GrantFailed(format!(
                    "ibv_alloc_mw(type 2): {}",
                    io::Error::last_os_error()
                )))
            }
        };
        // SAFETY: `mw` is the live window just allocated.
        let rkey = unsafe { (*mw).rkey };
        let i = self.windows.len() as u32;
        self.windows.push(Window {
            mw,
            rkey,
            bound: false,
            backing: None,
        });
        self.by_index.insert(rkey >> 8, i);
        Ok(i)
    }

    /// The windows' initial rkeys, in pool order.
    pub fn rkeys(&self) -> Vec<u32> {
        self.windows.iter().map(|w| w.rkey).collect()
    }

    /// Takes a free window and returns it with the rkey its next bind must
    /// use. The pool does not grow: the completion queue's poller records
    /// remote invalidations per window in a table sized when the queue pair
    /// was created.
    pub fn take(&mut self) -> Result<(u32, *mut ibv_mw, u32), ProviderError> {
        let Some(i) = self.free.pop() else {
            return Err(ProviderError::GrantFailed(format!(
                "all {} memory windows of the queue pair are granted (VerbsConfig::mws_per_qp)",
                self.windows.len()
            )));
        };
        let w = &self.windows[i as usize];
        Ok((i, w.mw, next_rkey(w.rkey)))
    }

    /// Exact-range backing registrations made so far (0 where the device
    /// checks windows against their own bounds).
    pub fn backing_registrations(&self) -> u64 {
        self.registrations
    }

    /// Idle backings kept: twice the windows (at most one backing per
    /// window is in use, so a full cache always has an idle one to drop).
    fn backing_cap(&self) -> usize {
        2 * self.windows.len()
    }

    /// The registration window `i` is to be bound onto for `[addr, addr +
    /// len)`: `pool_mr` itself, or (exact backing) a registration of
    /// exactly those bytes, reused from an earlier grant of the same range
    /// where there is one, held by the window until it is revoked.
    pub fn backing(
        &mut self,
        i: u32,
        pool_mr: *mut ibv_mr,
        addr: u64,
        len: u32,
    ) -> Result<*mut ibv_mr, ProviderError> {
        if !self.exact_backing {
            return Ok(pool_mr);
        }
        self.uses += 1;
        let now = self.uses;
        let key = (addr, len);
        if let Some(b) = self.backings.get_mut(&key) {
            b.users += 1;
            b.last_use = now;
            self.windows[i as usize].backing = Some(key);
            return Ok(b.mr);
        }
        self.retry_stale();
        if self.backings.len() >= self.backing_cap() {
            self.evict_idle();
        }
        let access =
            ibv_access_flags::IBV_ACCESS_LOCAL_WRITE | ibv_access_flags::IBV_ACCESS_MW_BIND;
        // SAFETY: the bytes lie inside a pool registered with the provider,
        // which the caller of `register` keeps mapped; deregistered when
        // evicted, or on drop.
        let mr = unsafe { ibv_reg_mr(self.pd, addr as *mut _, len as usize, access.0 as c_int) };
        if mr.is_null() {
            return Err(ProviderError::GrantFailed(format!(
                "ibv_reg_mr (exact window backing, {len} bytes at {addr:#x}): {}",
                io::Error::last_os_error()
            )));
        }
        self.registrations += 1;
        self.backings.insert(
            key,
            Backing {
                mr,
                users: 1,
                last_use: now,
            },
        );
        self.windows[i as usize].backing = Some(key);
        Ok(mr)
    }

    /// Deregisters the least recently used idle backing (later, if the
    /// device still counts a window as bound to it).
    fn evict_idle(&mut self) {
        let Some(key) = self
            .backings
            .iter()
            .filter(|(_, b)| b.users == 0)
            .min_by_key(|(_, b)| b.last_use)
            .map(|(k, _)| *k)
        else {
            return;
        };
        if let Some(b) = self.backings.remove(&key) {
            self.deregister(b.mr);
        }
    }

    /// Deregisters every idle backing: called when a pool registration was
    /// given back ([`crate::provider::Provider::deregister`]), so that no
    /// cached registration keeps pinning the pages of memory that may be
    /// unmapped, or names them when other memory is later mapped at the
    /// same address and granted.
    pub fn drop_idle_backings(&mut self) {
        let stale = &mut self.stale;
        self.backings.retain(|_, b| {
            if b.users > 0 {
                return true;
            }
            // SAFETY: an idle backing registration made by `backing`, taken
            // out of the cache here: released once (kept in `stale` if the
            // device refuses for now).
            if unsafe { ibv_dereg_mr(b.mr) } != 0 {
                stale.push(b.mr);
            }
            false
        });
    }

    /// Deregisters a backing registration now, or keeps it in `stale` for
    /// later if the device refuses (a window still bound onto it).
    fn deregister(&mut self, mr: *mut ibv_mr) {
        // SAFETY: `mr` is a backing registration made by `backing`, out of
        // the cache: released once (kept in `stale` if refused for now).
        if unsafe { ibv_dereg_mr(mr) } != 0 {
            self.stale.push(mr);
        }
    }

    /// Window `i` no longer uses its backing (which stays registered for
    /// the next grant of its range).
    fn release_backing(&mut self, i: u32) {
        let Some(key) = self.windows[i as usize].backing.take() else {
            return;
        };
        if let Some(b) = self.backings.get_mut(&key) {
            b.users = b.users.saturating_sub(1);
        }
    }

    fn retry_stale(&mut self) {
        // SAFETY: each entry is a backing registration not yet deregistered;
        // kept if the device still refuses.
        self.stale.retain(|&mr| unsafe { ibv_dereg_mr(mr) } != 0);
    }

    /// Puts back a window whose bind could not be posted.
    pub fn untake(&mut self, i: u32) {
        self.release_backing(i);
        self.free.push(i);
    }

    /// Records a posted bind.
    pub fn bound(&mut self, i: u32, rkey: u32) {
        let w = &mut self.windows[i as usize];
        w.rkey = rkey;
        w.bound = true;
    }

    /// Finds the window currently granted under `rkey`.
    pub fn find_bound(&self, rkey: u32) -> Option<u32> {
        let i = *self.by_index.get(&(rkey >> 8))?;
        let w = &self.windows[i as usize];
        (w.bound && w.rkey == rkey).then_some(i)
    }

    /// Records a posted local invalidate: the window is free for the next
    /// bind (which the send queue orders after the invalidate).
    pub fn revoked(&mut self, i: u32) {
        self.windows[i as usize].bound = false;
        self.release_backing(i);
        self.free.push(i);
    }
}

impl Drop for WindowPool {
    fn drop(&mut self) {
        for w in &self.windows {
            // SAFETY: each window was allocated by us and is freed once.
            unsafe { ibv_dealloc_mw(w.mw) };
        }
        // The windows are gone, so their backings are no longer bound.
        for (_, b) in std::mem::take(&mut self.backings) {
            self.deregister(b.mr);
        }
        self.retry_stale();
    }
}

/// Grants as per-I/O registrations of the exact range.
#[derive(Debug)]
pub(super) struct RegistrationGrants {
    pd: *mut ibv_pd,
    by_rkey: HashMap<u32, *mut ibv_mr>,
}

impl RegistrationGrants {
    pub fn new(pd: *mut ibv_pd) -> Self {
        RegistrationGrants {
            pd,
            by_rkey: HashMap::with_capacity(64),
        }
    }

    /// Registers `[addr, addr + len)` for `access`; returns the rkey.
    pub fn grant(&mut self, addr: u64, len: u32, access: Access) -> Result<u32, ProviderError> {
        // SAFETY: the range lies inside a pool registered with the provider,
        // which the caller of `register` keeps mapped; the MR is
        // deregistered on revoke or drop.
        let mr = unsafe {
            ibv_reg_mr(
                self.pd,
                addr as *mut _,
                len as usize,
                registration_access(access).0 as c_int,
            )
        };
        if mr.is_null() {
            return Err(ProviderError::GrantFailed(format!(
                "ibv_reg_mr({len} bytes at {addr:#x}): {}",
                io::Error::last_os_error()
            )));
        }
        // SAFETY: `mr` is the live registration just made.
        let rkey = unsafe { (*mr).rkey };
        self.by_rkey.insert(rkey, mr);
        Ok(rkey)
    }

    /// Deregisters the grant `rkey`; false if there is none.
    pub fn revoke(&mut self, rkey: u32) -> Result<bool, ProviderError> {
        let Some(mr) = self.by_rkey.remove(&rkey) else {
            return Ok(false);
        };
        // SAFETY: `mr` was registered by `grant` and is deregistered once.
        let rc = unsafe { ibv_dereg_mr(mr) };
        if rc != 0 {
            return Err(ProviderError::GrantFailed(format!(
                "ibv_dereg_mr(rkey {rkey:#x}): {}",
                io::Error::from_raw_os_error(rc)
            )));
        }
        Ok(true)
    }
}

impl Drop for RegistrationGrants {
    fn drop(&mut self) {
        for (_, mr) in self.by_rkey.drain() {
            // SAFETY: registered by `grant`, deregistered once.
            unsafe { ibv_dereg_mr(mr) };
        }
    }
}

/// How a queue pair grants.
#[derive(Debug)]
pub(super) enum Grants {
    Windows(WindowPool),
    Registrations(RegistrationGrants),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rkey_key_byte_wraps_and_index_stays() {
        assert_eq!(next_rkey(0x1234_56fe), 0x1234_56ff);
        assert_eq!(next_rkey(0x1234_56ff), 0x1234_5600);
        assert_eq!(next_rkey(0xffff_ffff), 0xffff_ff00);
    }

    #[test]
    fn grant_directions_have_exactly_their_remote_right() {
        assert_eq!(
            window_access(Access::RemoteRead),
            ibv_access_flags::IBV_ACCESS_REMOTE_READ
        );
        assert_eq!(
            window_access(Access::RemoteWrite),
            ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
        );
        assert_eq!(
            registration_access(Access::RemoteRead),
            ibv_access_flags::IBV_ACCESS_REMOTE_READ
        );
        let w = registration_access(Access::RemoteWrite);
        assert_eq!((w & ibv_access_flags::IBV_ACCESS_REMOTE_READ).0, 0);
        assert_ne!((w & ibv_access_flags::IBV_ACCESS_REMOTE_WRITE).0, 0);
    }
}
