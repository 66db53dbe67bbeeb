//! The pool, its per-worker slices, and buffer handles.

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;
use std::ops::Range;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::config::{ClassLayout, PoolConfig, PoolLayout};
use crate::error::{AllocError, BuildError, ClaimError, FreeError};
use crate::free_list::FreeList;
use crate::region::{BackingInfo, Region};

/// A size class, by position in [`PoolConfig`] (first class added is 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClassId(pub u8);

impl ClassId {
    /// Receive buffers in a [`PoolConfig::smbdirect`] pool.
    pub const RECEIVE: ClassId = ClassId(0);
    /// Send buffers in a [`PoolConfig::smbdirect`] pool.
    pub const SEND: ClassId = ClassId(1);
    /// RDMA read/write staging buffers in a [`PoolConfig::smbdirect`] pool.
    pub const RDMA: ClassId = ClassId(2);

    /// The class's position, for indexing.
    #[inline]
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// Handle to one allocated buffer: 8 bytes, `Copy`, valid from the allocation
/// that returned it until the matching free.
///
/// It names the slice, the class, the buffer's index within that class and
/// slice, and the allocation's generation; the generation makes a second free
/// through the same handle (or a free through a handle kept from an earlier
/// allocation of the same buffer) detectable. [`to_bits`](Self::to_bits)
/// packs it into a `u64`, e.g. a work request id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufId {
    index: u32,
    generation: u16,
    class: u8,
    slice: u8,
}

impl BufId {
    /// Worker slice the buffer belongs to (and is returned to when freed).
    #[inline]
    pub fn slice(self) -> usize {
        usize::from(self.slice)
    }

    /// Size class.
    #[inline]
    pub fn class(self) -> ClassId {
        ClassId(self.class)
    }

    /// Index within its class and slice.
    #[inline]
    pub fn index(self) -> u32 {
        self.index
    }

    /// Allocation generation (wraps at 65536).
    #[inline]
    pub fn generation(self) -> u16 {
        self.generation
    }

    /// Packs the handle into a `u64`: `slice << 56 | class << 48 | generation << 32 | index`.
    #[inline]
    pub const fn to_bits(self) -> u64 {
        (self.slice as u64) << 56
            | (self.class as u64) << 48
            | (self.generation as u64) << 32
            | self.index as u64
    }

    /// Unpacks [`to_bits`](Self::to_bits). Any `u64` gives some handle; the
    /// pool checks it on use ([`FreeError::InvalidHandle`], `None` from
    /// [`BufferPool::locate`]).
    #[inline]
    pub const fn from_bits(bits: u64) -> Self {
        Self {
            slice: (bits >> 56) as u8,
            class: (bits >> 48) as u8,
            generation: (bits >> 32) as u16,
            index: bits as u32,
        }
    }
}

impl fmt::Display for BufId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "slice {} class {} #{} gen {}",
            self.slice, self.class, self.index, self.generation
        )
    }
}

/// Where an allocated buffer is: what the RDMA layer puts in a scatter/gather
/// entry (address for the local key of the region, or offset for a provider
/// that maps the region itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufLocation {
    /// First byte, in this process's mapping.
    pub ptr: NonNull<u8>,
    /// Byte offset from [`BufferPool::region_base`].
    pub offset: usize,
    /// Usable bytes (the class's buffer size).
    pub len: usize,
}

impl BufLocation {
    /// The address as a verbs SGE wants it.
    #[inline]
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }
}

/// Counters of one size class in one slice; a relaxed snapshot, readable from
/// any thread while the owner allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassStats {
    /// Worker slice.
    pub slice: usize,
    /// Size class.
    pub class: ClassId,
    /// Usable bytes per buffer.
    pub buf_size: usize,
    /// Buffers of this class in this slice.
    pub total: u32,
    /// Buffers free (on either free list).
    pub free: u32,
    /// Buffers handed out.
    pub in_use: u32,
    /// Successful allocations so far.
    pub allocs: u64,
    /// Frees by the owning worker.
    pub local_frees: u64,
    /// Frees from other threads.
    pub remote_frees: u64,
    /// Allocations refused because the class was exhausted.
    pub exhausted: u64,
    /// Frees refused as double frees or stale handles.
    pub double_frees: u64,
}

/// One class's buffers in one slice.
struct ClassArea {
    /// Region offset of buffer 0.
    base_offset: usize,
    stride: usize,
    buf_size: usize,
    list: FreeList,
}

/// One worker's share of the region.
struct Slice {
    claimed: AtomicBool,
    areas: Box<[ClassArea]>,
}

struct PoolInner {
    region: Region,
    layout: PoolLayout,
    slices: Box<[Slice]>,
    /// Class ids sorted by buffer size, for [`BufferPool::class_for_len`].
    by_size: Box<[ClassId]>,
}

/// Fixed-size buffer pools carved out of one pre-faulted (hugepage) region,
/// split into one slice per worker.
///
/// Cloning is cheap (a reference count); the region is unmapped when the last
/// clone and the last [`SliceAllocator`] are gone. Allocation happens through
/// the slice owner's [`SliceAllocator`]; [`free`](Self::free),
/// [`locate`](Self::locate) and the statistics work from any thread. Nothing
/// here allocates memory, takes a lock or makes a system call after
/// [`PoolConfig::build`].
#[derive(Clone)]
pub struct BufferPool {
    inner: Arc<PoolInner>,
}

impl BufferPool {
    /// Builds a pool; same as [`PoolConfig::build`].
    pub fn new(config: &PoolConfig) -> Result<Self, BuildError> {
        let layout = config.layout()?;
        let region = Region::create(
            layout.region_len,
            config.backing_kind(),
            config.hugepage_policy(),
            config.mlock_enabled(),
        )?;
        let slices = (0..layout.slices)
            .map(|s| Slice {
                claimed: AtomicBool::new(false),
                areas: layout
                    .classes
                    .iter()
                    .map(|c| ClassArea {
                        base_offset: s * layout.slice_len + c.offset_in_slice,
                        stride: c.stride,
                        buf_size: c.buf_size,
                        list: FreeList::new(c.per_slice),
                    })
                    .collect(),
            })
            .collect();
        let mut by_size: Vec<ClassId> = (0..layout.classes.len())
            .map(|c| ClassId(c as u8))
            .collect();
        by_size.sort_by_key(|c| layout.classes[c.index()].buf_size);
        Ok(Self {
            inner: Arc::new(PoolInner {
                region,
                layout,
                slices,
                by_size: by_size.into(),
            }),
        })
    }

    /// Takes ownership of slice `slice` for the calling worker. Only one
    /// [`SliceAllocator`] per slice exists at a time; dropping it gives the
    /// slice back (with its free buffers).
    pub fn claim_slice(&self, slice: usize) -> Result<SliceAllocator, ClaimError> {
        let slices = self.inner.slices.len();
        let s = self
            .inner
            .slices
            .get(slice)
            .ok_or(ClaimError::OutOfRange { slice, slices })?;
        // Acquire pairs with the Release in `SliceAllocator::drop`: the previous
        // owner's relaxed free-list writes are visible to the new owner.
        s.claimed
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .map_err(|_| ClaimError::AlreadyClaimed { slice })?;
        Ok(SliceAllocator {
            pool: self.clone(),
            slice,
            _not_sync: PhantomData,
        })
    }

    /// Returns a buffer from any thread. The buffer goes back to its slice's
    /// return stack (one CAS); its owner picks it up when it runs dry.
    #[inline]
    pub fn free(&self, id: BufId) -> Result<(), FreeError> {
        let area = self.area(id).ok_or(FreeError::InvalidHandle { id })?;
        area.list
            .push_remote(id.index, id.generation)
            .map_err(|_| FreeError::DoubleFree { id })
    }

    /// Where the buffer is, or `None` if `id` is not a live allocation of this
    /// pool (freed, stale, or out of range).
    #[inline]
    pub fn locate(&self, id: BufId) -> Option<BufLocation> {
        let area = self.area(id)?;
        if !area.list.is_live(id.index, id.generation) {
            return None;
        }
        let offset = area.base_offset + id.index as usize * area.stride;
        // SAFETY: `id.index < per_slice` (checked by `area`), so by construction
        // of the layout `offset + buf_size <= region_len`: the pointer is inside
        // the mapping.
        let ptr = unsafe { self.inner.region.base().add(offset) };
        Some(BufLocation {
            ptr,
            offset,
            len: area.buf_size,
        })
    }

    /// The bytes of a live buffer, or `None` (see [`locate`](Self::locate)).
    ///
    /// # Safety
    ///
    /// Nobody may write the buffer while the slice is alive: not another
    /// thread, not a device (RDMA), not another process mapping the region.
    /// The slice must not outlive the buffer's allocation.
    #[inline]
    pub unsafe fn bytes(&self, id: BufId) -> Option<&[u8]> {
        let loc = self.locate(id)?;
        // SAFETY: `loc` is inside the mapping, which lives as long as `self`;
        // the caller guarantees there is no concurrent writer.
        Some(unsafe { std::slice::from_raw_parts(loc.ptr.as_ptr(), loc.len) })
    }

    /// The bytes of a live buffer, mutable, or `None` (see [`locate`](Self::locate)).
    ///
    /// # Safety
    ///
    /// The caller must have exclusive access to the buffer while the slice is
    /// alive (it holds the handle and nobody, including a device or another
    /// process, reads or writes the buffer), and the slice must not outlive
    /// the buffer's allocation.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes_mut(&self, id: BufId) -> Option<&mut [u8]> {
        let loc = self.locate(id)?;
        // SAFETY: `loc` is inside the mapping, which lives as long as `self`,
        // and is writable; the caller guarantees exclusive access.
        Some(unsafe { std::slice::from_raw_parts_mut(loc.ptr.as_ptr(), loc.len) })
    }

    /// Smallest class whose buffers hold `len` bytes.
    pub fn class_for_len(&self, len: usize) -> Option<ClassId> {
        self.inner
            .by_size
            .iter()
            .copied()
            .find(|c| self.inner.layout.classes[c.index()].buf_size >= len)
    }

    /// The class with this name.
    pub fn class_by_name(&self, name: &str) -> Option<ClassId> {
        let i = self
            .inner
            .layout
            .classes
            .iter()
            .position(|c| c.name == name)?;
        Some(ClassId(i as u8))
    }

    /// Placement of a class.
    pub fn class_layout(&self, class: ClassId) -> Option<&ClassLayout> {
        self.inner.layout.classes.get(class.index())
    }

    /// The whole layout.
    pub fn layout(&self) -> &PoolLayout {
        &self.inner.layout
    }

    /// Number of worker slices.
    pub fn slice_count(&self) -> usize {
        self.inner.slices.len()
    }

    /// Number of size classes.
    pub fn class_count(&self) -> usize {
        self.inner.layout.classes.len()
    }

    /// Region offsets covered by slice `slice`.
    pub fn slice_range(&self, slice: usize) -> Option<Range<usize>> {
        let len = self.inner.layout.slice_len;
        (slice < self.slice_count()).then(|| slice * len..(slice + 1) * len)
    }

    /// First byte of the region: what gets registered (`ibv_reg_mr`).
    pub fn region_base(&self) -> NonNull<u8> {
        self.inner.region.base()
    }

    /// Length of the region in bytes (a multiple of 2 MiB).
    pub fn region_len(&self) -> usize {
        self.inner.region.len()
    }

    /// How the region is backed.
    pub fn backing(&self) -> BackingInfo {
        self.inner.region.info()
    }

    /// Whether the region is made of 2 MiB hugetlb pages.
    pub fn is_hugepage_backed(&self) -> bool {
        self.backing().is_hugepage_backed()
    }

    /// Whether hugepages were wanted but the region fell back to ordinary pages.
    pub fn hugepage_fallback(&self) -> bool {
        self.backing().hugepage_fallback
    }

    /// The memfd of a [`crate::Backing::SharedMemfd`] region, to pass to
    /// another process (`SCM_RIGHTS`) which maps it with
    /// [`crate::SharedMapping::map`]. Close-on-exec is set.
    pub fn shared_fd(&self) -> Option<BorrowedFd<'_>> {
        self.inner.region.fd()
    }

    /// Counters of one class in one slice. Does not allocate.
    pub fn class_stats(&self, slice: usize, class: ClassId) -> Option<ClassStats> {
        let area = self.inner.slices.get(slice)?.areas.get(class.index())?;
        let c = area.list.counters();
        let total = area.list.len();
        let freed = c.local_frees.saturating_add(c.remote_frees);
        let in_use = c.allocs.saturating_sub(freed).min(u64::from(total)) as u32;
        Some(ClassStats {
            slice,
            class,
            buf_size: area.buf_size,
            total,
            free: total - in_use,
            in_use,
            allocs: c.allocs,
            local_frees: c.local_frees,
            remote_frees: c.remote_frees,
            exhausted: c.exhausted,
            double_frees: c.double_frees,
        })
    }

    /// Counters of every class in every slice, slice-major.
    pub fn stats(&self) -> Vec<ClassStats> {
        (0..self.slice_count())
            .flat_map(|s| (0..self.class_count()).map(move |c| (s, ClassId(c as u8))))
            .filter_map(|(s, c)| self.class_stats(s, c))
            .collect()
    }

    /// The class area `id` points into, if slice, class and index are in range.
    #[inline]
    fn area(&self, id: BufId) -> Option<&ClassArea> {
        let area = self
            .inner
            .slices
            .get(id.slice())?
            .areas
            .get(usize::from(id.class))?;
        (id.index < area.list.len()).then_some(area)
    }
}

impl fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferPool")
            .field("backing", &self.backing())
            .field("base", &self.region_base())
            .field("layout", &self.inner.layout)
            .finish()
    }
}

/// A worker's exclusive handle on its slice: the allocation fast path.
///
/// `Send` (a worker may be moved to its pinned thread) but not `Sync`.
/// Allocating and freeing its own buffers are plain loads and stores plus, for
/// a free, one uncontended CAS on the buffer's state word; buffers freed by
/// other threads are collected with one atomic swap when the slice's own list
/// runs dry.
pub struct SliceAllocator {
    pool: BufferPool,
    slice: usize,
    _not_sync: PhantomData<Cell<()>>,
}

impl SliceAllocator {
    /// The slice this allocator owns.
    #[inline]
    pub fn slice(&self) -> usize {
        self.slice
    }

    /// The pool (for [`BufferPool::locate`] and friends).
    #[inline]
    pub fn pool(&self) -> &BufferPool {
        &self.pool
    }

    /// Takes a free buffer of `class` from this slice, or reports exhaustion.
    #[inline]
    pub fn alloc(&mut self, class: ClassId) -> Result<BufId, AllocError> {
        let area = self.pool.inner.slices[self.slice]
            .areas
            .get(class.index())
            .ok_or(AllocError::UnknownClass { class })?;
        // SAFETY: this allocator holds the slice's claim (taken with Acquire in
        // `claim_slice`, released in `drop`) and is not Sync, and `&mut self`
        // excludes reentrancy: it is the single owner of every free list in the slice.
        match unsafe { area.list.pop_owner() } {
            Some((index, generation)) => Ok(BufId {
                index,
                generation,
                class: class.0,
                slice: self.slice as u8,
            }),
            None => Err(AllocError::Exhausted {
                slice: self.slice,
                class,
            }),
        }
    }

    /// Takes a buffer of the smallest class that holds `len` bytes. Does not
    /// fall through to a larger class when that one is exhausted.
    #[inline]
    pub fn alloc_len(&mut self, len: usize) -> Result<BufId, AllocError> {
        match self.pool.class_for_len(len) {
            Some(class) => self.alloc(class),
            None => Err(AllocError::TooLarge {
                len,
                largest: self
                    .pool
                    .inner
                    .by_size
                    .last()
                    .map_or(0, |c| self.pool.inner.layout.classes[c.index()].buf_size),
            }),
        }
    }

    /// Returns a buffer. One of this slice's goes straight back on the owner
    /// list; any other is handed to [`BufferPool::free`].
    #[inline]
    pub fn free(&mut self, id: BufId) -> Result<(), FreeError> {
        if id.slice() != self.slice {
            return self.pool.free(id);
        }
        let area = self.pool.area(id).ok_or(FreeError::InvalidHandle { id })?;
        // SAFETY: as in `alloc`, this allocator is the single owner of the slice.
        unsafe { area.list.push_owner(id.index, id.generation) }
            .map_err(|_| FreeError::DoubleFree { id })
    }
}

impl Drop for SliceAllocator {
    fn drop(&mut self) {
        // Release pairs with the Acquire in `claim_slice`.
        self.pool.inner.slices[self.slice]
            .claimed
            .store(false, Ordering::Release);
    }
}

impl fmt::Debug for SliceAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SliceAllocator")
            .field("slice", &self.slice)
            .finish_non_exhaustive()
    }
}
