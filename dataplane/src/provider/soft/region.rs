//! Registered memory: this provider's regions (local keys, and the memfds a
//! peer process maps), and a connection's view of the peer's regions.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use smbdirect_hugepages::SharedMapping;

use super::rng::XorShift;
use crate::provider::{MemoryRegion, ProviderError};

/// One registered region, readable without locks on the post path.
#[derive(Debug, Default)]
struct RegionSlot {
    /// 0 while unused; written last (Release) when the region is published.
    lkey: AtomicU32,
    addr: AtomicU64,
    len: AtomicU64,
    /// Backed by a memfd we can pass to a peer process.
    shared: AtomicBool,
}

#[derive(Debug)]
struct Setup {
    count: u32,
    fds: Vec<Option<(OwnedFd, u64)>>,
    rng: XorShift,
}

/// A region as the post path needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LocalRegion {
    pub(crate) index: u32,
    pub(crate) shared: bool,
}

/// A region as described to a peer at connection setup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RegionExport {
    pub(crate) index: u32,
    pub(crate) has_fd: bool,
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) fd_offset: u64,
}

/// The most regions with an fd one handshake message passes: the
/// kernel's SCM_MAX_FD (253 fds per `SCM_RIGHTS` message) less the grant
/// table's segment, sent with them.
pub(crate) const MAX_SHARED_REGIONS: usize = 252;

/// This provider's registered regions: a fixed table indexed by the low
/// bits of the lkey (the rest random). Regions are never deregistered: the
/// [`crate::provider::Provider::register`] contract keeps them mapped for the
/// provider's lifetime.
#[derive(Debug)]
pub(crate) struct LocalRegions {
    slots: Box<[RegionSlot]>,
    bits: u32,
    setup: Mutex<Setup>,
}

impl LocalRegions {
    /// A table of `max` regions (a power of two).
    pub(crate) fn new(max: u32) -> Self {
        debug_assert!(max.is_power_of_two());
        LocalRegions {
            slots: (0..max).map(|_| RegionSlot::default()).collect(),
            bits: max.trailing_zeros(),
            setup: Mutex::new(Setup {
                count: 0,
                fds: Vec::new(),
                rng: XorShift::from_os(),
            }),
        }
    }

    /// Regions registered so far (for `stats`; takes the set-up lock).
    pub(crate) fn len(&self) -> usize {
        self.setup.lock().unwrap_or_else(|e| e.into_inner()).count as usize
    }

    /// Registers `len` bytes at `addr`, optionally backed by `shared`
    /// (fd, offset of `addr` in it); the fd is duplicated.
    pub(crate) fn register(
        &self,
        addr: *mut u8,
        len: usize,
        shared: Option<(RawFd, u64)>,
    ) -> Result<MemoryRegion, ProviderError> {
        if addr.is_null() || len == 0 {
            return Err(ProviderError::Other(format!(
                "register: empty region ({addr:p}, {len} bytes)"
            )));
        }
        let fd = match shared {
            None => None,
            Some((raw, offset)) => {
                // SAFETY: the caller passes an open fd it keeps open for the
                // duration of this call; we only borrow it to duplicate it.
                let borrowed = unsafe { BorrowedFd::borrow_raw(raw) };
                let owned = borrowed.try_clone_to_owned()?;
                let size = std::fs::File::from(owned.try_clone()?).metadata()?.len();
                if offset
                    .checked_add(len as u64)
                    .filter(|&end| end <= size)
                    .is_none()
                {
                    return Err(ProviderError::Other(format!(
                        "register: shared fd {raw} is {size} bytes, too short for {len} bytes at offset {offset}"
                    )));
                }
                Some((owned, offset))
            }
        };
        let mut setup = self.setup.lock().unwrap_or_else(|e| e.into_inner());
        let index = setup.count;
        if index as usize >= self.slots.len() {
            return Err(ProviderError::Other(format!(
                "register: all {} memory regions of the soft provider are in use (SoftConfig::max_regions)",
                self.slots.len()
            )));
        }
        let lkey = loop {
            let k = ((setup.rng.next_u64() >> 32) as u32)
                .checked_shl(self.bits)
                .unwrap_or(0)
                | index;
            if k != 0 {
                break k;
            }
        };
        let slot = &self.slots[index as usize];
        slot.addr.store(addr as u64, Ordering::Relaxed);
        slot.len.store(len as u64, Ordering::Relaxed);
        slot.shared.store(fd.is_some(), Ordering::Relaxed);
        // Release: the fields above are visible to any thread whose Acquire
        // load of `lkey` sees this key.
        slot.lkey.store(lkey, Ordering::Release);
        setup.fds.push(fd);
        setup.count += 1;
        Ok(MemoryRegion {
            addr: addr as u64,
            len: len as u64,
            lkey,
        })
    }

    /// The region `lkey` names, if `[addr, addr + len)` lies inside it.
    #[inline]
    pub(crate) fn find(&self, lkey: u32, addr: u64, len: u64) -> Option<LocalRegion> {
        let index = lkey & ((1 << self.bits) - 1);
        let slot = &self.slots[index as usize];
        // Acquire pairs with `register`'s Release.
        if slot.lkey.load(Ordering::Acquire) != lkey {
            return None;
        }
        let base = slot.addr.load(Ordering::Relaxed);
        let end = base + slot.len.load(Ordering::Relaxed);
        match addr.checked_add(len) {
            Some(e) if addr >= base && e <= end => Some(LocalRegion {
                index,
                shared: slot.shared.load(Ordering::Relaxed),
            }),
            _ => None,
        }
    }

    /// Every region registered so far, and duplicates of the fds of those
    /// that have one (in the same order), for a peer process. More than
    /// [`MAX_SHARED_REGIONS`] with an fd do not fit one handshake message:
    /// an error that says so (the kernel would refuse the message with a
    /// bare EINVAL).
    pub(crate) fn export(&self) -> std::io::Result<(Vec<RegionExport>, Vec<OwnedFd>)> {
        let setup = self.setup.lock().unwrap_or_else(|e| e.into_inner());
        let shared = setup.fds.iter().filter(|f| f.is_some()).count();
        if shared > MAX_SHARED_REGIONS {
            return Err(std::io::Error::other(format!(
                "this process has registered {shared} shared memory regions (one per pool, \
                 e.g. per client connection); a soft-provider handshake passes at most \
                 {MAX_SHARED_REGIONS} (SCM_MAX_FD less the grant table's)"
            )));
        }
        let mut regions = Vec::with_capacity(setup.count as usize);
        let mut fds = Vec::new();
        for (i, fd) in setup.fds.iter().enumerate() {
            let slot = &self.slots[i];
            let (has_fd, fd_offset) = match fd {
                Some((fd, offset)) => {
                    fds.push(fd.try_clone()?);
                    (true, *offset)
                }
                None => (false, 0),
            };
            regions.push(RegionExport {
                index: i as u32,
                has_fd,
                addr: slot.addr.load(Ordering::Relaxed),
                len: slot.len.load(Ordering::Relaxed),
                fd_offset,
            });
        }
        Ok((regions, fds))
    }
}

/// One peer region mapped into this process.
#[derive(Debug)]
pub(crate) struct PeerRegion {
    addr: u64,
    len: u64,
    base: NonNull<u8>,
    _map: Arc<SharedMapping>,
}

/// How this process reaches the memory the peer posts and grants.
#[derive(Debug)]
pub(crate) enum PeerMemory {
    /// The peer shares our address space: its addresses are ours (and its
    /// provider validated them against its regions when they were posted or
    /// granted).
    SameProcess,
    /// The peer is another process: its shared regions, mapped here, by
    /// region index. Every translation is bounds-checked against them, so a
    /// corrupt peer can make us copy garbage but never reach outside them.
    Mapped(Box<[Option<PeerRegion>]>),
}

// SAFETY: `PeerRegion::base` points into a `SharedMapping` kept alive by
// the `Arc` beside it; the pointer is only used for copies whose
// synchronisation is the gate/grant protocol, not Rust references.
unsafe impl Send for PeerMemory {}
// SAFETY: as above; `&PeerMemory` only hands out raw pointers.
unsafe impl Sync for PeerMemory {}

/// Mappings of peers' memfds, shared by every connection to the same peer
/// provider so a pool is mapped once per peer, not once per connection.
pub(crate) type MapCache = Mutex<HashMap<(u64, u64, u32), Weak<SharedMapping>>>;

impl PeerMemory {
    /// Maps a peer process's exported regions; `fds` are the fds of those
    /// with `has_fd`, in order. `peer` = (process nonce, provider id).
    pub(crate) fn map(
        peer: (u64, u64),
        regions: &[RegionExport],
        fds: Vec<OwnedFd>,
        cache: &MapCache,
    ) -> Result<Self, ProviderError> {
        let with_fd = regions.iter().filter(|r| r.has_fd).count();
        if with_fd != fds.len() {
            return Err(ProviderError::Connect(format!(
                "peer announced {with_fd} shared regions but passed {} fds",
                fds.len()
            )));
        }
        let max = regions
            .iter()
            .map(|r| r.index as usize + 1)
            .max()
            .unwrap_or(0);
        if max > 4096 {
            return Err(ProviderError::Connect(format!(
                "peer region index {max} out of range"
            )));
        }
        let mut out: Vec<Option<PeerRegion>> = (0..max).map(|_| None).collect();
        let mut fds = fds.into_iter();
        for r in regions.iter().filter(|r| r.has_fd) {
            let fd = fds.next().expect("counted above");
            let key = (peer.0, peer.1, r.index);
            let map = {
                let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
                match cache.get(&key).and_then(Weak::upgrade) {
                    Some(m) => m,
                    None => {
                        let m = Arc::new(SharedMapping::map(&fd).map_err(|e| {
                            ProviderError::Connect(format!(
                                "mapping peer region {} (fd {}): {e}",
                                r.index,
                                fd.as_raw_fd()
                            ))
                        })?);
                        cache.retain(|_, w| w.strong_count() > 0);
                        cache.insert(key, Arc::downgrade(&m));
                        m
                    }
                }
            };
            let base = r
                .fd_offset
                .checked_add(r.len)
                .filter(|&end| end <= map.len() as u64)
                .and_then(|_| map.ptr_at(r.fd_offset as usize, r.len as usize))
                .ok_or_else(|| {
                    ProviderError::Connect(format!(
                        "peer region {}: {} bytes at offset {} exceed its {}-byte memfd",
                        r.index,
                        r.len,
                        r.fd_offset,
                        map.len()
                    ))
                })?;
            out[r.index as usize] = Some(PeerRegion {
                addr: r.addr,
                len: r.len,
                base,
                _map: map,
            });
        }
        Ok(PeerMemory::Mapped(out.into_boxed_slice()))
    }

    /// Where `len` bytes the peer names at `addr` in its region `region` are
    /// in this process, if they are reachable.
    #[inline]
    pub(crate) fn translate(&self, region: u32, addr: u64, len: u64) -> Option<*mut u8> {
        match self {
            PeerMemory::SameProcess => Some(addr as *mut u8),
            PeerMemory::Mapped(regions) => {
                let r = regions.get(region as usize)?.as_ref()?;
                let end = addr.checked_add(len)?;
                if addr < r.addr || end > r.addr + r.len {
                    return None;
                }
                // SAFETY: `addr - r.addr + len <= r.len` (checked), and
                // `base..base + len` lies inside the mapping (checked in `map`).
                Some(unsafe { r.base.as_ptr().add((addr - r.addr) as usize) })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lkeys_name_their_region_and_bounds_are_checked() {
        let regions = LocalRegions::new(4);
        let mut a = vec![0u8; 100];
        let mut b = vec![0u8; 50];
        let ra = regions.register(a.as_mut_ptr(), a.len(), None).unwrap();
        let rb = regions.register(b.as_mut_ptr(), b.len(), None).unwrap();
        assert_ne!(ra.lkey & 3, rb.lkey & 3);
        assert_eq!(
            regions.find(ra.lkey, ra.addr, 100),
            Some(LocalRegion {
                index: 0,
                shared: false
            })
        );
        assert_eq!(regions.find(ra.lkey, ra.addr + 1, 100), None);
        assert_eq!(regions.find(rb.lkey, ra.addr, 1), None);
        assert_eq!(regions.find(ra.lkey ^ 0x100, ra.addr, 1), None);
        assert_eq!(
            regions.find(rb.lkey, rb.addr + 49, 1),
            Some(LocalRegion {
                index: 1,
                shared: false
            })
        );
        let (exported, fds) = regions.export().unwrap();
        assert_eq!(exported.len(), 2);
        assert!(fds.is_empty());
    }

    #[test]
    fn more_shared_regions_than_a_handshake_passes_is_an_error_that_says_so() {
        let seg = super::super::shm::Segment::create(c"region-test", 4096).unwrap();
        let fd = seg.fd();
        let regions = LocalRegions::new(512);
        let mut a = vec![0u8; 64];
        for _ in 0..MAX_SHARED_REGIONS {
            regions
                .register(a.as_mut_ptr(), 64, Some((fd.as_raw_fd(), 0)))
                .unwrap();
        }
        // Regions without an fd cost the handshake no fd.
        regions.register(a.as_mut_ptr(), 64, None).unwrap();
        let (exported, fds) = regions.export().unwrap();
        assert_eq!(
            (exported.len(), fds.len()),
            (MAX_SHARED_REGIONS + 1, MAX_SHARED_REGIONS)
        );
        drop(fds);
        regions
            .register(a.as_mut_ptr(), 64, Some((fd.as_raw_fd(), 0)))
            .unwrap();
        let e = regions.export().unwrap_err().to_string();
        assert!(
            e.contains("253 shared memory regions") && e.contains("at most 252"),
            "{e}"
        );
    }

    #[test]
    fn the_default_table_holds_a_connection_per_region_beyond_64() {
        let regions = LocalRegions::new(crate::provider::soft::SoftConfig::default().max_regions);
        let mut a = vec![0u8; 8];
        for _ in 0..200 {
            regions.register(a.as_mut_ptr(), 8, None).unwrap();
        }
    }

    #[test]
    fn region_table_capacity_is_reported() {
        let regions = LocalRegions::new(1);
        let mut a = vec![0u8; 8];
        regions.register(a.as_mut_ptr(), 8, None).unwrap();
        let e = regions.register(a.as_mut_ptr(), 8, None).unwrap_err();
        assert!(e.to_string().contains("max_regions"), "{e}");
    }
}
