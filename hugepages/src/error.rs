//! What can go wrong building a pool, claiming a slice, allocating and freeing.

use std::fmt;
use std::io;

use crate::meminfo::HugepageInfo;
use crate::pool::{BufId, ClassId};
use crate::size::format_size;

/// [`crate::PoolConfig::build`] failed. Every variant names the limit that was hit.
#[derive(Debug)]
#[non_exhaustive]
pub enum BuildError {
    /// Zero worker slices were asked for.
    NoSlices,
    /// More slices than a [`BufId`] can name.
    TooManySlices {
        /// Slices asked for.
        slices: usize,
        /// Largest supported count.
        max: usize,
    },
    /// No size class was configured.
    NoClasses,
    /// More size classes than a [`BufId`] can name.
    TooManyClasses {
        /// Classes configured.
        classes: usize,
        /// Largest supported count.
        max: usize,
    },
    /// A size class is unusable (zero size, zero share, duplicate name, ...).
    InvalidClass {
        /// The class's name.
        class: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The budget cannot hold one buffer of every class in every slice.
    BudgetTooSmall {
        /// The configured budget in bytes.
        budget: usize,
        /// The number of worker slices it is split into.
        slices: usize,
        /// Bytes each slice gets.
        per_slice: usize,
        /// Bytes each slice needs for one buffer of each class (plus any
        /// explicit counts and alignment).
        needed_per_slice: usize,
    },
    /// A class would need more buffers per slice than a [`BufId`] index holds.
    TooManyBuffers {
        /// The class's name.
        class: String,
        /// Buffers per slice it would get.
        per_slice: u64,
    },
    /// [`crate::HugepagePolicy::Require`] and no hugepages could be reserved.
    HugepagesUnavailable {
        /// Bytes the region needs.
        len: usize,
        /// The machine's hugepage state, if readable.
        info: Option<HugepageInfo>,
        /// The mmap/memfd error.
        source: io::Error,
    },
    /// Mapping ordinary memory failed (out of memory, address space, memfd limits).
    Map {
        /// The failing step.
        what: &'static str,
        /// Bytes being mapped.
        len: usize,
        /// The OS error.
        source: io::Error,
    },
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoSlices => f.write_str("buffer pool needs at least one worker slice"),
            Self::TooManySlices { slices, max } => {
                write!(
                    f,
                    "buffer pool asked for {slices} worker slices; at most {max} are supported"
                )
            }
            Self::NoClasses => f.write_str("buffer pool needs at least one size class"),
            Self::TooManyClasses { classes, max } => {
                write!(
                    f,
                    "buffer pool has {classes} size classes; at most {max} are supported"
                )
            }
            Self::InvalidClass { class, reason } => {
                write!(f, "buffer pool size class {class:?}: {reason}")
            }
            Self::BudgetTooSmall {
                budget,
                slices,
                per_slice,
                needed_per_slice,
            } => write!(
                f,
                "buffer pool budget {} split over {slices} worker slice(s) gives {} per slice, \
                 but one buffer of every size class needs {} per slice; raise --pool-mem to at \
                 least {} or use fewer workers",
                format_size(*budget),
                format_size(*per_slice),
                format_size(*needed_per_slice),
                format_size(needed_per_slice.saturating_mul(*slices)),
            ),
            Self::TooManyBuffers { class, per_slice } => write!(
                f,
                "buffer pool size class {class:?} would get {per_slice} buffers per slice; at most \
                 {} are supported (lower its share, raise its buffer size, or add workers)",
                u32::MAX - 1
            ),
            Self::HugepagesUnavailable { len, info, source } => {
                write!(
                    f,
                    "cannot reserve {} x 2 MiB hugepages for a {} buffer pool ({source})",
                    len.div_ceil(crate::HUGEPAGE_SIZE),
                    format_size(*len)
                )?;
                if let Some(i) = info {
                    write!(
                        f,
                        "; HugePages_Total={} HugePages_Free={} HugePages_Rsvd={}",
                        i.total, i.free, i.reserved
                    )?;
                }
                f.write_str(
                    "; reserve them with `echo N > /proc/sys/vm/nr_hugepages` or \
                     `sudo HUGEMEM=<MiB> scripts/setup-hugepages.sh`",
                )
            }
            Self::Map { what, len, source } => {
                write!(
                    f,
                    "{what} of a {} buffer pool failed: {source}",
                    format_size(*len)
                )
            }
        }
    }
}

impl std::error::Error for BuildError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::HugepagesUnavailable { source, .. } | Self::Map { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// [`crate::BufferPool::claim_slice`] failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimError {
    /// No such slice.
    OutOfRange {
        /// The slice asked for.
        slice: usize,
        /// Slices in the pool.
        slices: usize,
    },
    /// Another [`crate::SliceAllocator`] for this slice is alive.
    AlreadyClaimed {
        /// The slice asked for.
        slice: usize,
    },
}

impl fmt::Display for ClaimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::OutOfRange { slice, slices } => {
                write!(
                    f,
                    "buffer pool slice {slice} does not exist (pool has {slices})"
                )
            }
            Self::AlreadyClaimed { slice } => {
                write!(
                    f,
                    "buffer pool slice {slice} is already owned by another worker"
                )
            }
        }
    }
}

impl std::error::Error for ClaimError {}

/// An allocation failed. Never panics, never falls back to the heap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocError {
    /// Every buffer of this class in this slice is in use.
    Exhausted {
        /// The worker slice.
        slice: usize,
        /// The size class.
        class: ClassId,
    },
    /// The pool has no such class.
    UnknownClass {
        /// The class asked for.
        class: ClassId,
    },
    /// No class has buffers of at least `len` bytes.
    TooLarge {
        /// Bytes asked for.
        len: usize,
        /// Largest buffer size in the pool.
        largest: usize,
    },
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exhausted { slice, class } => {
                write!(
                    f,
                    "buffer pool slice {slice} has no free buffer of class {}",
                    class.0
                )
            }
            Self::UnknownClass { class } => write!(f, "buffer pool has no size class {}", class.0),
            Self::TooLarge { len, largest } => {
                write!(
                    f,
                    "no buffer pool class holds {len} bytes (largest buffer is {largest})"
                )
            }
        }
    }
}

impl std::error::Error for AllocError {}

/// A free was refused; the free lists are untouched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreeError {
    /// The buffer is not allocated under this handle: it was already freed
    /// through it (double free), possibly reallocated since (stale handle).
    DoubleFree {
        /// The handle passed in.
        id: BufId,
    },
    /// The handle names no buffer of this pool (slice, class or index out of range).
    InvalidHandle {
        /// The handle passed in.
        id: BufId,
    },
}

impl fmt::Display for FreeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::DoubleFree { id } => write!(
                f,
                "double free of buffer {id} (not allocated under this handle)"
            ),
            Self::InvalidHandle { id } => {
                write!(f, "buffer handle {id} does not name a buffer of this pool")
            }
        }
    }
}

impl std::error::Error for FreeError {}
