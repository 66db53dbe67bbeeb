//! Registered memory: this provider's regions (local keys, and the memfds a
//! peer process maps), and a connection's view of the peer's regions.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use smbdirect_hugepages::SharedMapping;

use super::rng::XorShift;
use crate::provider::{MemoryRegion, ProviderError};

/// One registered region, readable without locks on the post path.
#[derive(Debug, Default)]
struct RegionSlot {
    /// 0 while unused; written last (Release) when the region is published,
    /// and first (0) when it is given back, so a reader that sees the same
    /// key before and after reading the fields read this region's fields.
    lkey: AtomicU32,
    addr: AtomicU64,
    len: AtomicU64,
    /// Backed by a memfd we can pass to a peer process.
    shared: AtomicBool,
    /// The registration's number in this provider's history (see
    /// [`LocalRegion::serial`]).
    serial: AtomicU32,
}

#[derive(Debug)]
struct Setup {
    /// Slots used so far (`0..used`); freed ones are in `free`.
    used: u32,
    /// Slots given back, reused first.
    free: Vec<u32>,
    /// Live registrations.
    live: u32,
    /// Registrations made so far: the next one's serial.
    serials: u32,
    /// Per slot: the memfd (and offset) of a live shared region.
    fds: Vec<Option<(OwnedFd, u64)>>,
    /// Per slot: the last key it had, which its next one must differ from.
    last_key: Vec<u32>,
    rng: XorShift,
}

/// A region as the post path needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LocalRegion {
    pub(crate) index: u32,
    pub(crate) shared: bool,
    /// Registrations made before this one: a peer process maps the regions
    /// registered before it connected (serials below the connection's
    /// [`Exported::serials`]), so a slot reused after that is not the
    /// region the peer mapped under its index.
    pub(crate) serial: u32,
}

/// What [`LocalRegions::export`] hands a peer process.
#[derive(Debug)]
pub(crate) struct Exported {
    pub(crate) regions: Vec<RegionExport>,
    /// Duplicates of the fds of the regions with one, in order.
    pub(crate) fds: Vec<OwnedFd>,
    /// Registrations made so far: every live region the peer maps has a
    /// smaller serial.
    pub(crate) serials: u32,
}

impl Exported {
    /// What a peer in this process is given: nothing to map, and every
    /// region reachable (it uses our addresses, checked when posted).
    pub(crate) fn same_process() -> Self {
        Exported {
            regions: Vec::new(),
            fds: Vec::new(),
            serials: u32::MAX,
        }
    }
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

/// This provider's registered regions: a fixed table indexed by the low
/// bits of the lkey (the rest random, and never a slot's previous key). A
/// region given back ([`LocalRegions::deregister`]) frees its slot for the
/// next registration, so the table bounds the regions live at once, not the
/// registrations a process makes in its life.
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
                used: 0,
                free: Vec::new(),
                live: 0,
                serials: 0,
                fds: (0..max).map(|_| None).collect(),
                last_key: vec![0; max as usize],
                rng: XorShift::from_os(),
            }),
        }
    }

    /// Regions registered and not given back (for `stats`; takes the
    /// set-up lock).
    pub(crate) fn len(&self) -> usize {
        self.setup.lock().unwrap_or_else(|e| e.into_inner()).live as usize
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
        let index = match setup.free.pop() {
            Some(i) => i,
            None if (setup.used as usize) < self.slots.len() => {
                setup.used += 1;
                setup.used - 1
            }
            None => {
                return Err(ProviderError::Other(format!(
                    "register: all {} memory regions of the soft provider are in use \
                     (SoftConfig::max_regions; deregister the ones no longer needed)",
                    self.slots.len()
                )))
            }
        };
        let last = setup.last_key[index as usize];
        let lkey = loop {
            let k = ((setup.rng.next_u64() >> 32) as u32)
                .checked_shl(self.bits)
                .unwrap_or(0)
                | index;
            if k != 0 && k != last {
                break k;
            }
        };
        // Serials stay below u32::MAX, the "every region" of same-process
        // connections (4 billion registrations in one process's life).
        let serial = setup.serials.min(u32::MAX - 1);
        setup.serials = setup.serials.saturating_add(1);
        let slot = &self.slots[index as usize];
        slot.addr.store(addr as u64, Ordering::Relaxed);
        slot.len.store(len as u64, Ordering::Relaxed);
        slot.shared.store(fd.is_some(), Ordering::Relaxed);
        slot.serial.store(serial, Ordering::Relaxed);
        // Release: the fields above are visible to any thread whose Acquire
        // load of `lkey` sees this key.
        slot.lkey.store(lkey, Ordering::Release);
        setup.fds[index as usize] = fd;
        setup.last_key[index as usize] = lkey;
        setup.live += 1;
        Ok(MemoryRegion {
            addr: addr as u64,
            len: len as u64,
            lkey,
        })
    }

    /// Gives back the region registered as `len` bytes at `addr` under
    /// `lkey` (its slot is reused by a later registration, under another
    /// key). Errors if this table holds no such
    /// live region.
    pub(crate) fn deregister(&self, lkey: u32, addr: u64, len: u64) -> Result<(), ProviderError> {
        let mut setup = self.setup.lock().unwrap_or_else(|e| e.into_inner());
        let index = lkey & ((1 << self.bits) - 1);
        let slot = &self.slots[index as usize];
        if lkey == 0
            || slot.lkey.load(Ordering::Relaxed) != lkey
            || slot.addr.load(Ordering::Relaxed) != addr
            || slot.len.load(Ordering::Relaxed) != len
        {
            return Err(ProviderError::Other(format!(
                "deregister: the soft provider holds no region with lkey {lkey:#x} \
                 ({len} bytes at {addr:#x}); already given back?"
            )));
        }
        // The key goes first: a reader that loaded it before this and
        // checks it again after reading the fields (`find`) sees the change
        // if it may have read a later registration's fields.
        slot.lkey.store(0, Ordering::Relaxed);
        fence(Ordering::Release);
        setup.fds[index as usize] = None;
        setup.free.push(index);
        setup.live -= 1;
        Ok(())
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
        let shared = slot.shared.load(Ordering::Relaxed);
        let serial = slot.serial.load(Ordering::Relaxed);
        // The key again (a seqlock's second read): the fields were this
        // registration's, not those of one made after it was given back.
        // The fence pairs with `deregister`'s.
        fence(Ordering::Acquire);
        if slot.lkey.load(Ordering::Relaxed) != lkey {
            return None;
        }
        match addr.checked_add(len) {
            Some(e) if addr >= base && e <= end => Some(LocalRegion {
                index,
                shared,
                serial,
            }),
            _ => None,
        }
    }

    /// Every live region, and duplicates of the fds of those that have one
    /// (in the same order), for a peer process. However many there are
    /// (up to the table's 1,024), the handshake passes them in as many
    /// messages as they need.
    pub(crate) fn export(&self) -> std::io::Result<Exported> {
        let setup = self.setup.lock().unwrap_or_else(|e| e.into_inner());
        let mut regions = Vec::with_capacity(setup.live as usize);
        let mut fds = Vec::new();
        for (i, fd) in setup.fds.iter().enumerate().take(setup.used as usize) {
            let slot = &self.slots[i];
            if slot.lkey.load(Ordering::Relaxed) == 0 {
                continue; // given back
            }
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
        Ok(Exported {
            regions,
            fds,
            serials: setup.serials,
        })
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

/// Mappings of peers' memfds by the memfd's identity (device and inode),
/// shared by every connection to the same peer so a pool is mapped once per
/// peer, not once per connection. Keyed by the file, not by the peer's
/// region index: a peer reuses the index of a region it gave back for
/// another memfd.
pub(crate) type MapCache = Mutex<HashMap<(u64, u64), Weak<SharedMapping>>>;

impl PeerMemory {
    /// Maps a peer process's exported regions; `fds` are the fds of those
    /// with `has_fd`, in order.
    pub(crate) fn map(
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
            let meta = std::fs::File::from(fd.try_clone().map_err(|e| {
                ProviderError::Connect(format!("peer region {}: dup of its fd: {e}", r.index))
            })?)
            .metadata()
            .map_err(|e| ProviderError::Connect(format!("peer region {}: fstat: {e}", r.index)))?;
            let key = {
                use std::os::unix::fs::MetadataExt;
                (meta.dev(), meta.ino())
            };
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
                shared: false,
                serial: 0
            })
        );
        assert_eq!(regions.find(ra.lkey, ra.addr + 1, 100), None);
        assert_eq!(regions.find(rb.lkey, ra.addr, 1), None);
        assert_eq!(regions.find(ra.lkey ^ 0x100, ra.addr, 1), None);
        assert_eq!(
            regions.find(rb.lkey, rb.addr + 49, 1),
            Some(LocalRegion {
                index: 1,
                shared: false,
                serial: 1
            })
        );
        let x = regions.export().unwrap();
        assert_eq!(x.regions.len(), 2);
        assert!(x.fds.is_empty());
        assert_eq!(x.serials, 2);
    }

    #[test]
    fn more_shared_regions_than_one_message_passes_are_all_exported_in_order() {
        // Each region on its own page of one memfd: the offset names it.
        let seg = super::super::shm::Segment::create(c"region-test", 300 * 4096).unwrap();
        let fd = seg.fd();
        let regions = LocalRegions::new(512);
        let mut a = vec![0u8; 64];
        for i in 0..300u64 {
            regions
                .register(a.as_mut_ptr(), 64, Some((fd.as_raw_fd(), i * 4096)))
                .unwrap();
        }
        // Regions without an fd cost the handshake no fd.
        regions.register(a.as_mut_ptr(), 64, None).unwrap();
        let x = regions.export().unwrap();
        assert_eq!((x.regions.len(), x.fds.len()), (301, 300));
        let offsets: Vec<u64> = x
            .regions
            .iter()
            .filter(|r| r.has_fd)
            .map(|r| r.fd_offset)
            .collect();
        assert_eq!(offsets, (0..300).map(|i| i * 4096).collect::<Vec<_>>());
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
    fn a_region_given_back_frees_its_slot_under_a_new_key() {
        let regions = LocalRegions::new(4);
        let mut a = vec![0u8; 64];
        let mut b = vec![0u8; 64];
        let mut mrs: Vec<MemoryRegion> = (0..4)
            .map(|_| regions.register(a.as_mut_ptr(), 64, None).unwrap())
            .collect();
        assert!(regions.register(a.as_mut_ptr(), 64, None).is_err(), "full");
        // Thousands of registrations through a 4-slot table, each given
        // back: the table bounds what is live, not what a process makes.
        for round in 0..5000u32 {
            let k = (round % 4) as usize;
            let old = mrs[k];
            regions.deregister(old.lkey, old.addr, old.len).unwrap();
            assert_eq!(
                regions.find(old.lkey, old.addr, 1),
                None,
                "a given-back key names nothing"
            );
            assert!(
                regions.deregister(old.lkey, old.addr, old.len).is_err(),
                "given back twice"
            );
            let new = regions.register(b.as_mut_ptr(), 32, None).unwrap();
            assert_eq!(new.lkey & 3, old.lkey & 3, "the freed slot is reused");
            assert_ne!(new.lkey, old.lkey, "under a new key");
            assert_eq!(regions.find(old.lkey, old.addr, 1), None);
            let found = regions.find(new.lkey, new.addr, 32).unwrap();
            assert_eq!(found.serial, 4 + round, "serials count registrations");
            mrs[k] = new;
        }
        assert_eq!(regions.len(), 4);
        // Export lists the live regions only, and the serial watermark.
        let gone = mrs[2];
        regions.deregister(gone.lkey, gone.addr, gone.len).unwrap();
        let x = regions.export().unwrap();
        assert_eq!(x.regions.len(), 3);
        assert!(x.regions.iter().all(|r| r.index != gone.lkey & 3));
        assert_eq!(x.serials, 5004);
        assert_eq!(regions.len(), 3);
        // A deregistration must name the region exactly.
        let m = mrs[0];
        assert!(regions.deregister(m.lkey, m.addr + 1, m.len).is_err());
        assert!(regions.deregister(m.lkey, m.addr, m.len + 1).is_err());
        assert!(regions.deregister(0, 0, 0).is_err());
        regions.deregister(m.lkey, m.addr, m.len).unwrap();
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
