//! Hugepage-backed, pre-faulted buffer pools for the SMB Direct data plane (issue 3).
//!
//! As in SPDK's RDMA transport, all I/O buffers are carved out of one region
//! mapped once at start (2 MiB hugetlb pages, anonymous or memfd-shared: see
//! [`Backing`] and [`SharedMapping`]), pre-faulted, registered once by the
//! RDMA layer, and never allocated on the I/O path:
//!
//! * [`PoolConfig`] splits a memory budget ([`parse_size`]: `--pool-mem 512M`)
//!   into one slice per worker, each holding fixed-size buffers of every size
//!   class (receive, send, RDMA staging: [`PoolConfig::smbdirect`]);
//! * a worker claims its slice as a [`SliceAllocator`] and allocates and frees
//!   with plain loads and stores; any thread can [`BufferPool::free`] a buffer
//!   back to its slice through a lock-free return stack;
//! * buffers are named by an 8-byte [`BufId`] which [`BufferPool::locate`]
//!   turns into a pointer, a byte offset in the region and a length;
//! * exhaustion is an [`AllocError::Exhausted`], a double free a
//!   [`FreeError::DoubleFree`]; neither panics nor touches the free lists;
//! * [`ClassStats`] counters are readable from any thread.
//!
//! Without reserved hugepages the region falls back to ordinary pages (one
//! warning on stderr per process, [`BackingInfo::hugepage_fallback`]); reserve
//! them with `scripts/setup-hugepages.sh`. [`HugepageInfo`] reads the
//! machine's hugepage counters.
//!
//! ```
//! use smbdirect_hugepages::{ClassId, PoolConfig, HugepagePolicy};
//!
//! let pool = PoolConfig::smbdirect(8 << 20, 1, 8192, 1364, 1 << 20)
//!     .hugepages(HugepagePolicy::Disable)
//!     .build()?;
//! let mut worker = pool.claim_slice(0)?;
//! let id = worker.alloc(ClassId::RECEIVE)?;
//! let loc = pool.locate(id).unwrap();
//! assert_eq!(loc.len, 8192);
//! assert!(loc.offset + loc.len <= pool.region_len());
//! worker.free(id)?;
//! assert!(worker.free(id).is_err()); // double free detected
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod config;
mod error;
mod free_list;
mod meminfo;
mod pool;
mod region;
mod size;

pub use config::{ClassLayout, PoolConfig, PoolLayout, SizeClass, Sizing, MAX_CLASSES, MAX_SLICES};
pub use error::{AllocError, BuildError, ClaimError, FreeError};
pub use meminfo::{hugepage_size, hugepages_free, hugepages_total, HugepageInfo, MEMINFO_PATH};
pub use pool::{BufId, BufLocation, BufferPool, ClassId, ClassStats, SliceAllocator};
pub use region::{
    fallback_warning_emitted, Backing, BackingInfo, HugepagePolicy, PageKind, SharedMapping,
    HUGEPAGE_SHIFT, HUGEPAGE_SIZE,
};
pub use size::{format_size, parse_size, ParseSizeError};
