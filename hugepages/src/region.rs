//! The one memory region a pool is carved from, and views of it from elsewhere.
//!
//! A region is mapped once at start, either anonymous and private (only this
//! process sees it; what the verbs provider registers) or backed by a memfd and
//! shared (the fd can be passed to another process, e.g. over `SCM_RIGHTS`, and
//! mapped there with [`SharedMapping`], which is what a software RDMA provider
//! needs). Either way it is made of 2 MiB hugetlb pages when the machine has
//! them reserved, and of ordinary pages with a `MADV_HUGEPAGE` hint otherwise,
//! after one loud warning on stderr. Every page is faulted in before the region
//! is handed to the pool so the I/O path never takes a page fault.

use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};

use memmap2::{Advice, MmapOptions, MmapRaw};

use crate::error::BuildError;
use crate::meminfo::HugepageInfo;
use crate::size::format_size;

/// Size of the hugepages the pools ask for (`MAP_HUGE_2MB`, `MFD_HUGE_2MB`).
pub const HUGEPAGE_SIZE: usize = 1 << HUGEPAGE_SHIFT;

/// log2 of [`HUGEPAGE_SIZE`].
pub const HUGEPAGE_SHIFT: u8 = 21;

/// Size of an ordinary page, the prefault stride on the fallback path.
const SMALL_PAGE_SIZE: usize = 4096;

/// Name the memfd shows under `/proc/<pid>/fd` and in `/proc/<pid>/maps`.
const MEMFD_NAME: &std::ffi::CStr = c"smbdirectd-pool";

/// Who can see the region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backing {
    /// Anonymous private mapping (`MAP_PRIVATE | MAP_ANONYMOUS`): this process only.
    #[default]
    Anonymous,
    /// `memfd_create` (with `MFD_HUGETLB` when hugepages are used) mapped
    /// `MAP_SHARED`; [`crate::BufferPool::shared_fd`] gives the fd to pass on.
    SharedMemfd,
}

/// What to do about hugepages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HugepagePolicy {
    /// Use 2 MiB hugetlb pages; if none can be reserved, fall back to ordinary
    /// pages with `MADV_HUGEPAGE` and print one warning per process.
    #[default]
    Prefer,
    /// Use 2 MiB hugetlb pages or fail with [`BuildError::HugepagesUnavailable`].
    Require,
    /// Use ordinary pages (with the `MADV_HUGEPAGE` hint), silently.
    Disable,
}

/// Which pages actually back the region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageKind {
    /// 2 MiB hugetlb pages: never swapped, never split, one TLB entry per 2 MiB.
    Hugetlb2M,
    /// Ordinary pages with the `MADV_HUGEPAGE` hint (transparent hugepages may
    /// or may not be used, depending on `/sys/kernel/mm/transparent_hugepage`).
    Small,
}

/// How a pool's region is backed, for `stats` and `devices` output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackingInfo {
    /// Anonymous private or memfd shared.
    pub backing: Backing,
    /// Hugetlb or ordinary pages.
    pub pages: PageKind,
    /// Mapped length in bytes (a multiple of [`HUGEPAGE_SIZE`]).
    pub len: usize,
    /// Whether `mlock` succeeded.
    pub mlocked: bool,
    /// Hugepages were wanted ([`HugepagePolicy::Prefer`]) but none could be
    /// reserved, so the region fell back to ordinary pages.
    pub hugepage_fallback: bool,
}

impl BackingInfo {
    /// Whether the region is made of hugetlb pages.
    pub fn is_hugepage_backed(&self) -> bool {
        self.pages == PageKind::Hugetlb2M
    }
}

impl fmt::Display for BackingInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let backing = match self.backing {
            Backing::Anonymous => "anonymous",
            Backing::SharedMemfd => "memfd-shared",
        };
        let pages = match self.pages {
            PageKind::Hugetlb2M => "2 MiB hugetlb pages",
            PageKind::Small => "4 KiB pages + MADV_HUGEPAGE",
        };
        write!(f, "{} {backing}, {pages}", format_size(self.len))?;
        if self.hugepage_fallback {
            f.write_str(" (FALLBACK: no hugepages reserved)")?;
        }
        if self.mlocked {
            f.write_str(", mlocked")?;
        }
        Ok(())
    }
}

static FALLBACK_WARNED: AtomicBool = AtomicBool::new(false);
static MLOCK_WARNED: AtomicBool = AtomicBool::new(false);

/// Whether this process has printed the "no hugepages, falling back" warning.
pub fn fallback_warning_emitted() -> bool {
    FALLBACK_WARNED.load(Ordering::Relaxed)
}

fn warn_fallback_once(len: usize, backing: Backing, cause: &io::Error) {
    if FALLBACK_WARNED.swap(true, Ordering::Relaxed) {
        return;
    }
    let needed = len.div_ceil(HUGEPAGE_SIZE) as u64;
    let info = HugepageInfo::read().ok();
    let (state, target) = match info {
        Some(i) => (
            format!(
                "HugePages_Total={} HugePages_Free={} HugePages_Rsvd={} Hugepagesize={}",
                i.total,
                i.free,
                i.reserved,
                format_size(i.page_size as usize)
            ),
            i.total + needed.saturating_sub(i.available()),
        ),
        None => ("/proc/meminfo unreadable".to_owned(), needed),
    };
    let hugemem_mib = (target * (HUGEPAGE_SIZE as u64 >> 20)).max(2048);
    let kind = match backing {
        Backing::Anonymous => "anonymous",
        Backing::SharedMemfd => "shared memfd",
    };
    let rule = "=".repeat(78);
    eprintln!(
        "{rule}\n\
         WARNING: smbdirect-hugepages: no hugepages for the {size} {kind} buffer pool:\n\
         reserving {needed} x 2 MiB hugepages failed ({cause}).\n\
         Machine: {state}.\n\
         FALLING BACK to ordinary 4 KiB pages (MADV_HUGEPAGE hint set). Expect more TLB\n\
         misses and RDMA memory-registration translation overhead on the I/O path.\n\
         Reserve hugepages before starting smbdirectd, as root:\n\
         \x20   echo {target} > /proc/sys/vm/nr_hugepages\n\
         or\n\
         \x20   sudo HUGEMEM={hugemem_mib} scripts/setup-hugepages.sh\n\
         {rule}",
        size = format_size(len),
    );
}

/// A mapping of a whole region: the pool's own, or another process's view.
pub(crate) struct Region {
    map: MmapRaw,
    file: Option<File>,
    info: BackingInfo,
}

impl Region {
    /// Maps `len` bytes (a multiple of [`HUGEPAGE_SIZE`]), faults every page
    /// in and optionally mlocks it.
    pub(crate) fn create(
        len: usize,
        backing: Backing,
        policy: HugepagePolicy,
        mlock: bool,
    ) -> Result<Self, BuildError> {
        debug_assert!(len > 0 && len % HUGEPAGE_SIZE == 0);
        let mut fallback = false;
        let (map, file, pages) = match policy {
            HugepagePolicy::Disable => {
                let (m, f) = map_small(len, backing)?;
                (m, f, PageKind::Small)
            }
            HugepagePolicy::Prefer | HugepagePolicy::Require => match map_hugetlb(len, backing) {
                Ok((m, f)) => (m, f, PageKind::Hugetlb2M),
                Err(source) if policy == HugepagePolicy::Require => {
                    return Err(BuildError::HugepagesUnavailable {
                        len,
                        info: HugepageInfo::read().ok(),
                        source,
                    })
                }
                Err(cause) => {
                    warn_fallback_once(len, backing, &cause);
                    fallback = true;
                    let (m, f) = map_small(len, backing)?;
                    (m, f, PageKind::Small)
                }
            },
        };
        let stride = match pages {
            PageKind::Hugetlb2M => HUGEPAGE_SIZE,
            PageKind::Small => SMALL_PAGE_SIZE,
        };
        let base = map.as_mut_ptr();
        for offset in (0..len).step_by(stride) {
            // SAFETY: `offset < len` and the mapping is `len` bytes, readable and
            // writable; it was created above and nobody else has a pointer to it
            // yet (the memfd has not been handed out), so this volatile
            // read-then-write of the same byte changes nothing but faults the
            // page in writable.
            unsafe {
                let p = base.add(offset);
                p.write_volatile(p.read_volatile());
            }
        }
        let mlocked = mlock && lock(&map, len);
        Ok(Self {
            map,
            file,
            info: BackingInfo {
                backing,
                pages,
                len,
                mlocked,
                hugepage_fallback: fallback,
            },
        })
    }

    /// First byte of the region.
    #[inline]
    pub(crate) fn base(&self) -> NonNull<u8> {
        // A successful mmap never returns null (MAP_FAILED is -1, checked by memmap2).
        NonNull::new(self.map.as_mut_ptr()).expect("mmap returned null")
    }

    /// Length in bytes.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.info.len
    }

    /// The memfd, for [`Backing::SharedMemfd`].
    pub(crate) fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.file.as_ref().map(|f| f.as_fd())
    }

    pub(crate) fn info(&self) -> BackingInfo {
        self.info
    }
}

fn lock(map: &MmapRaw, len: usize) -> bool {
    match map.lock() {
        Ok(()) => true,
        Err(e) => {
            if !MLOCK_WARNED.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "WARNING: smbdirect-hugepages: mlock of the {} buffer pool failed ({e}); \
                     its pages may be swapped out. Raise RLIMIT_MEMLOCK (`ulimit -l unlimited`, \
                     or LimitMEMLOCK=infinity in the systemd unit) or run with CAP_IPC_LOCK.",
                    format_size(len)
                );
            }
            false
        }
    }
}

fn memfd(flags: libc::c_uint) -> io::Result<File> {
    // SAFETY: MEMFD_NAME is a valid NUL-terminated string; memfd_create has no
    // other memory-safety preconditions.
    let fd = unsafe { libc::memfd_create(MEMFD_NAME.as_ptr(), flags | libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by memfd_create, is open, and is owned by
    // nobody else.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

fn map_hugetlb(len: usize, backing: Backing) -> io::Result<(MmapRaw, Option<File>)> {
    match backing {
        Backing::Anonymous => {
            let map = MmapOptions::new()
                .len(len)
                .huge(Some(HUGEPAGE_SHIFT))
                .populate()
                .map_anon()?;
            Ok((map.into(), None))
        }
        Backing::SharedMemfd => {
            let file = memfd(libc::MFD_HUGETLB | libc::MFD_HUGE_2MB)?;
            file.set_len(len as u64)?;
            // Hugetlb pages are reserved here (no MAP_NORESERVE), so a machine
            // without enough free hugepages fails now with ENOMEM, not later
            // with SIGBUS.
            let map = MmapOptions::new().len(len).populate().map_raw(&file)?;
            Ok((map, Some(file)))
        }
    }
}

fn map_small(len: usize, backing: Backing) -> Result<(MmapRaw, Option<File>), BuildError> {
    let (map, file): (MmapRaw, _) = match backing {
        Backing::Anonymous => {
            let map = MmapOptions::new()
                .len(len)
                .map_anon()
                .map_err(|source| BuildError::Map {
                    what: "anonymous mmap",
                    len,
                    source,
                })?;
            (map.into(), None)
        }
        Backing::SharedMemfd => {
            let file = memfd(0).map_err(|source| BuildError::Map {
                what: "memfd_create",
                len,
                source,
            })?;
            file.set_len(len as u64).map_err(|source| BuildError::Map {
                what: "memfd ftruncate",
                len,
                source,
            })?;
            let map = MmapOptions::new()
                .len(len)
                .map_raw(&file)
                .map_err(|source| BuildError::Map {
                    what: "memfd mmap",
                    len,
                    source,
                })?;
            (map, Some(file))
        }
    };
    // Only a hint: EINVAL when THP is compiled out. Must precede the prefault
    // so the first touch of each 2 MiB range can get a transparent hugepage.
    let _ = map.advise(Advice::HugePage);
    Ok((map, file))
}

/// Another mapping of a [`Backing::SharedMemfd`] region, as a second process
/// (e.g. a software RDMA provider) would create from the passed fd.
///
/// Offsets are the same as in the pool ([`crate::BufLocation::offset`]); the
/// bytes are the same bytes.
pub struct SharedMapping {
    map: MmapRaw,
    len: usize,
}

impl SharedMapping {
    /// Maps the whole file behind `fd` (`MAP_SHARED`, read-write, pre-faulted).
    /// `fd` may be the pool's memfd, a dup of it, one received over a unix
    /// socket, or `/proc/<pid>/fd/<n>` reopened read-write.
    pub fn map(fd: impl AsFd) -> io::Result<Self> {
        let fd = fd.as_fd();
        let map = MmapOptions::new().populate().map_raw(&fd)?;
        let len = map.len();
        Ok(Self { map, len })
    }

    /// Length of the mapping in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never, for a pool region).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// First byte of this mapping (differs from the pool's own base address).
    #[inline]
    pub fn base(&self) -> NonNull<u8> {
        NonNull::new(self.map.as_mut_ptr()).expect("mmap returned null")
    }

    /// Pointer to `len` bytes at `offset`, or `None` if that range is outside.
    #[inline]
    pub fn ptr_at(&self, offset: usize, len: usize) -> Option<NonNull<u8>> {
        let end = offset.checked_add(len)?;
        if end > self.len {
            return None;
        }
        // SAFETY: `offset <= self.len`, so the result stays inside (or one past
        // the end of) the mapping.
        Some(unsafe { self.base().add(offset) })
    }

    /// The bytes at `offset..offset + len`, or `None` if out of range.
    ///
    /// # Safety
    ///
    /// Nobody (in any process mapping the region) may write these bytes while
    /// the returned slice is alive.
    pub unsafe fn bytes(&self, offset: usize, len: usize) -> Option<&[u8]> {
        let p = self.ptr_at(offset, len)?;
        // SAFETY: in bounds (checked by `ptr_at`), mapped for the lifetime of
        // `self`; the caller guarantees no concurrent writer.
        Some(unsafe { std::slice::from_raw_parts(p.as_ptr(), len) })
    }

    /// The bytes at `offset..offset + len`, mutable, or `None` if out of range.
    ///
    /// # Safety
    ///
    /// Nobody (in any process mapping the region) may read or write these
    /// bytes while the returned slice is alive.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes_mut(&self, offset: usize, len: usize) -> Option<&mut [u8]> {
        let p = self.ptr_at(offset, len)?;
        // SAFETY: in bounds (checked by `ptr_at`), mapped read-write for the
        // lifetime of `self`; the caller guarantees exclusive access.
        Some(unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), len) })
    }
}

impl fmt::Debug for SharedMapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedMapping")
            .field("base", &self.base())
            .field("len", &self.len)
            .finish()
    }
}
