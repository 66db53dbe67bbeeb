//! Pool configuration and the layout it produces.
//!
//! The budget is split evenly into one slice per worker; each slice holds the
//! same number of buffers of each size class, laid out one class after the
//! other:
//!
//! ```text
//! region: | slice 0                          | slice 1                          | ... | pad to 2 MiB
//! slice:  | class 0 bufs | class 1 bufs | class 2 bufs | unused tail |
//! ```
//!
//! Buffers of 4 KiB and more are page aligned (their stride is a multiple of
//! 4096), smaller ones are cache-line aligned (stride a multiple of 64), so no
//! two buffers share a cache line.

use crate::error::BuildError;
use crate::pool::BufferPool;
use crate::region::{Backing, HugepagePolicy, HUGEPAGE_SIZE};

/// Most worker slices a pool can have ([`crate::BufId`] stores the slice in a byte).
pub const MAX_SLICES: usize = 256;

/// Most size classes a pool can have ([`crate::BufId`] stores the class in a byte).
pub const MAX_CLASSES: usize = 256;

/// Every slice starts on a 4 KiB boundary.
const SLICE_ALIGN: usize = 4096;

/// Alignment of a buffer of `buf_size` bytes: page for 4 KiB and up, else cache line.
fn buffer_align(buf_size: usize) -> usize {
    if buf_size >= 4096 {
        4096
    } else {
        64
    }
}

/// How many buffers of a class each slice gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sizing {
    /// A relative weight: what is left of each slice after the explicit
    /// counts and one buffer of every class is split among the `Share`
    /// classes in proportion to their weights.
    Share(u32),
    /// Exactly this many buffers per slice.
    PerSlice(u32),
}

/// One size class: buffers of `buf_size` bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeClass {
    name: String,
    buf_size: usize,
    sizing: Sizing,
}

impl SizeClass {
    /// A class of `buf_size`-byte buffers with [`Sizing::Share`]`(1)`.
    pub fn new(name: impl Into<String>, buf_size: usize) -> Self {
        Self {
            name: name.into(),
            buf_size,
            sizing: Sizing::Share(1),
        }
    }

    /// Gives the class a relative share of the budget.
    pub fn share(mut self, weight: u32) -> Self {
        self.sizing = Sizing::Share(weight);
        self
    }

    /// Gives the class exactly `count` buffers per slice.
    pub fn per_slice(mut self, count: u32) -> Self {
        self.sizing = Sizing::PerSlice(count);
        self
    }

    /// The class's name (for stats).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Usable bytes per buffer.
    pub fn buf_size(&self) -> usize {
        self.buf_size
    }

    /// How the class is sized.
    pub fn sizing(&self) -> Sizing {
        self.sizing
    }
}

/// Builder for a [`BufferPool`].
///
/// ```
/// use smbdirect_hugepages::{parse_size, HugepagePolicy, PoolConfig, SizeClass};
///
/// let pool = PoolConfig::new(parse_size("8M").unwrap(), 2)
///     .class(SizeClass::new("receive", 8192).share(3))
///     .class(SizeClass::new("send", 1364).share(1))
///     .class(SizeClass::new("rdma", 1 << 20).per_slice(1))
///     .hugepages(HugepagePolicy::Disable)
///     .build()
///     .unwrap();
/// assert_eq!(pool.slice_count(), 2);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    budget: usize,
    slices: usize,
    classes: Vec<SizeClass>,
    backing: Backing,
    hugepages: HugepagePolicy,
    mlock: bool,
}

impl PoolConfig {
    /// `budget` bytes (see [`crate::parse_size`]) split into `slices` worker
    /// slices; no classes yet, anonymous backing, hugepages preferred, mlock on.
    pub fn new(budget: usize, slices: usize) -> Self {
        Self {
            budget,
            slices,
            classes: Vec::new(),
            backing: Backing::Anonymous,
            hugepages: HugepagePolicy::Prefer,
            mlock: true,
        }
    }

    /// The three classes an SMB Direct worker needs, as class ids
    /// [`crate::ClassId::RECEIVE`], [`crate::ClassId::SEND`] and
    /// [`crate::ClassId::RDMA`]:
    ///
    /// * receive buffers of `max_receive_size` bytes ([MS-SMBD] 3.1.1.1
    ///   MaxReceiveSize, 8192 by default), 25 % of the budget;
    /// * send buffers of `max_send_size` bytes (MaxSendSize, 1364 by
    ///   default; the stride is rounded up to 1408), 10 %;
    /// * RDMA staging buffers of `max_read_write_size` bytes
    ///   (MaxReadWriteSize, e.g. 1 MiB or 8 MiB), 65 %, less what goes to
    /// * intermediate classes of 64 KiB (10 %) and 1 MiB (20 %), where they
    ///   lie strictly between the receive and the RDMA sizes (appended after
    ///   the three, so the ids above stay put): transfers and reassembled
    ///   messages take the smallest class that holds them.
    pub fn smbdirect(
        budget: usize,
        slices: usize,
        max_receive_size: usize,
        max_send_size: usize,
        max_read_write_size: usize,
    ) -> Self {
        let c = Self::new(budget, slices)
            .class(SizeClass::new("receive", max_receive_size).share(25))
            .class(SizeClass::new("send", max_send_size).share(10));
        // Intermediate classes so a 64 KiB transfer or reassembled message
        // does not take a MaxReadWriteSize buffer (appended: the ClassId
        // constants keep their positions).
        let mid = [(64usize << 10, "rdma64k", 10u32), (1 << 20, "rdma1m", 20)];
        let mids: Vec<_> = mid
            .iter()
            .filter(|(size, _, _)| *size > max_receive_size && *size < max_read_write_size)
            .collect();
        let rdma_share = 65 - mids.iter().map(|m| m.2).sum::<u32>();
        let mut c = c.class(SizeClass::new("rdma", max_read_write_size).share(rdma_share));
        for (size, name, share) in mids {
            c = c.class(SizeClass::new(*name, *size).share(*share));
        }
        c
    }

    /// Adds a size class; its [`crate::ClassId`] is its position (0, 1, ...).
    pub fn class(mut self, class: SizeClass) -> Self {
        self.classes.push(class);
        self
    }

    /// Anonymous private or memfd shared mapping.
    pub fn backing(mut self, backing: Backing) -> Self {
        self.backing = backing;
        self
    }

    /// Whether hugepages are preferred, required or not used.
    pub fn hugepages(mut self, policy: HugepagePolicy) -> Self {
        self.hugepages = policy;
        self
    }

    /// Whether to mlock the region (best effort: a failure only warns).
    pub fn mlock(mut self, mlock: bool) -> Self {
        self.mlock = mlock;
        self
    }

    /// Total memory budget in bytes.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Number of worker slices.
    pub fn slices(&self) -> usize {
        self.slices
    }

    /// Configured size classes, in [`crate::ClassId`] order.
    pub fn classes(&self) -> &[SizeClass] {
        &self.classes
    }

    /// Chosen backing.
    pub fn backing_kind(&self) -> Backing {
        self.backing
    }

    /// Chosen hugepage policy.
    pub fn hugepage_policy(&self) -> HugepagePolicy {
        self.hugepages
    }

    /// Whether the region will be mlocked.
    pub fn mlock_enabled(&self) -> bool {
        self.mlock
    }

    /// Computes where every buffer goes, without mapping anything.
    pub fn layout(&self) -> Result<PoolLayout, BuildError> {
        if self.slices == 0 {
            return Err(BuildError::NoSlices);
        }
        if self.slices > MAX_SLICES {
            return Err(BuildError::TooManySlices {
                slices: self.slices,
                max: MAX_SLICES,
            });
        }
        if self.classes.is_empty() {
            return Err(BuildError::NoClasses);
        }
        if self.classes.len() > MAX_CLASSES {
            return Err(BuildError::TooManyClasses {
                classes: self.classes.len(),
                max: MAX_CLASSES,
            });
        }
        let invalid = |c: &SizeClass, reason| {
            Err(BuildError::InvalidClass {
                class: c.name.clone(),
                reason,
            })
        };
        for (i, c) in self.classes.iter().enumerate() {
            if c.buf_size == 0 {
                return invalid(c, "buffer size is zero");
            }
            if c.buf_size > isize::MAX as usize / 2 {
                return invalid(c, "buffer size is larger than the address space");
            }
            match c.sizing {
                Sizing::Share(0) => return invalid(c, "share is zero"),
                Sizing::PerSlice(0) => return invalid(c, "explicit count is zero"),
                _ => {}
            }
            if self.classes[..i].iter().any(|o| o.name == c.name) {
                return invalid(c, "name used by two classes");
            }
        }

        let per_slice = (self.budget / self.slices) & !(SLICE_ALIGN - 1);
        let stride = |c: &SizeClass| c.buf_size.next_multiple_of(buffer_align(c.buf_size)) as u128;
        // Bytes needed before the shares are split: the explicit counts, one
        // buffer of each share class, and worst-case alignment padding.
        let mut minimum: u128 = 0;
        let mut weights: u128 = 0;
        for c in &self.classes {
            minimum += buffer_align(c.buf_size) as u128;
            match c.sizing {
                Sizing::PerSlice(n) => minimum += u128::from(n) * stride(c),
                Sizing::Share(w) => {
                    minimum += stride(c);
                    weights += u128::from(w);
                }
            }
        }
        if minimum > per_slice as u128 {
            return Err(BuildError::BudgetTooSmall {
                budget: self.budget,
                slices: self.slices,
                per_slice,
                needed_per_slice: usize::try_from(minimum)
                    .unwrap_or(usize::MAX)
                    .next_multiple_of(SLICE_ALIGN),
            });
        }
        let spare = per_slice as u128 - minimum;

        let mut classes = Vec::with_capacity(self.classes.len());
        let mut offset = 0usize;
        for c in &self.classes {
            let count: u128 = match c.sizing {
                Sizing::PerSlice(n) => n.into(),
                Sizing::Share(w) => 1 + spare * u128::from(w) / weights / stride(c),
            };
            if count >= u128::from(crate::free_list::NIL) {
                return Err(BuildError::TooManyBuffers {
                    class: c.name.clone(),
                    per_slice: u64::try_from(count).unwrap_or(u64::MAX),
                });
            }
            // Fits: the sum of counts * strides plus padding is at most
            // `per_slice`, which is a usize.
            let stride = stride(c) as usize;
            offset = offset.next_multiple_of(buffer_align(c.buf_size));
            classes.push(ClassLayout {
                name: c.name.clone(),
                buf_size: c.buf_size,
                stride,
                per_slice: count as u32,
                offset_in_slice: offset,
            });
            offset += count as usize * stride;
        }
        debug_assert!(offset <= per_slice);
        let region_len = (per_slice * self.slices).next_multiple_of(HUGEPAGE_SIZE);
        Ok(PoolLayout {
            slices: self.slices,
            slice_len: per_slice,
            region_len,
            classes,
        })
    }

    /// Maps the region and builds the pool.
    pub fn build(&self) -> Result<BufferPool, BuildError> {
        BufferPool::new(self)
    }
}

/// Where a size class's buffers sit inside each slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassLayout {
    /// The class's name.
    pub name: String,
    /// Usable bytes per buffer.
    pub buf_size: usize,
    /// Distance between consecutive buffers (`buf_size` rounded up to 64 or 4096).
    pub stride: usize,
    /// Buffers of this class in each slice.
    pub per_slice: u32,
    /// Offset of the class's first buffer from the start of its slice.
    pub offset_in_slice: usize,
}

/// Result of [`PoolConfig::layout`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolLayout {
    /// Number of worker slices.
    pub slices: usize,
    /// Bytes per slice; slice `s` starts at offset `s * slice_len`.
    pub slice_len: usize,
    /// Bytes mapped (all slices, rounded up to 2 MiB).
    pub region_len: usize,
    /// Per-class placement, in [`crate::ClassId`] order.
    pub classes: Vec<ClassLayout>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_split_the_budget_and_strides_are_aligned() {
        let layout = PoolConfig::smbdirect(64 << 20, 2, 8192, 1364, 1 << 20)
            .layout()
            .unwrap();
        assert_eq!(layout.slice_len, 32 << 20);
        assert_eq!(layout.region_len, 64 << 20);
        // MaxReadWriteSize 1 MiB: the 64 KiB intermediate class is added
        // (the 1 MiB one would equal the RDMA class and is not).
        let [recv, send, rdma, mid] = &layout.classes[..] else {
            panic!("four classes")
        };
        assert_eq!(mid.stride, 64 << 10);
        assert!((45..=52).contains(&mid.per_slice), "{}", mid.per_slice);
        assert_eq!(
            (recv.stride, send.stride, rdma.stride),
            (8192, 1408, 1 << 20)
        );
        assert_eq!(recv.offset_in_slice, 0);
        assert_eq!(send.offset_in_slice % 64, 0);
        assert_eq!(rdma.offset_in_slice % 4096, 0);
        // 25 / 10 / 55 (+ 10 for 64 KiB) of ~32 MiB, each at least one.
        assert!((900..=1024).contains(&recv.per_slice), "{}", recv.per_slice);
        assert!(
            (2000..=2400).contains(&send.per_slice),
            "{}",
            send.per_slice
        );
        assert!((15..=18).contains(&rdma.per_slice), "{}", rdma.per_slice);
        let end = mid.offset_in_slice + mid.per_slice as usize * mid.stride;
        assert!(end <= layout.slice_len);
    }

    #[test]
    fn explicit_counts_are_exact() {
        let layout = PoolConfig::new(4 << 20, 1)
            .class(SizeClass::new("a", 100).per_slice(10))
            .class(SizeClass::new("b", 5000).share(1))
            .layout()
            .unwrap();
        assert_eq!(layout.classes[0].per_slice, 10);
        assert_eq!(layout.classes[0].stride, 128);
        assert_eq!(layout.classes[1].stride, 8192);
        assert_eq!(layout.classes[1].offset_in_slice, 4096);
        assert!(layout.classes[1].per_slice >= 500);
    }

    #[test]
    fn tiny_weight_still_gets_one_buffer() {
        let layout = PoolConfig::new(4 << 20, 1)
            .class(SizeClass::new("big", 1 << 20).share(1000))
            .class(SizeClass::new("small", 64).share(1))
            .layout()
            .unwrap();
        assert!(layout.classes[1].per_slice >= 1);
    }

    #[test]
    fn budget_that_cannot_hold_one_buffer_per_class_per_slice_is_a_clear_error() {
        let err = PoolConfig::smbdirect(4 << 20, 4, 8192, 1364, 1 << 20)
            .layout()
            .unwrap_err();
        match &err {
            BuildError::BudgetTooSmall {
                budget,
                slices,
                per_slice,
                needed_per_slice,
            } => {
                assert_eq!((*budget, *slices, *per_slice), (4 << 20, 4, 1 << 20));
                assert!(*needed_per_slice > 1 << 20);
            }
            other => panic!("unexpected {other:?}"),
        }
        let msg = err.to_string();
        assert!(
            msg.contains("4 MiB") && msg.contains("4 worker slice"),
            "{msg}"
        );
        assert!(msg.contains("--pool-mem"), "{msg}");
    }

    #[test]
    fn invalid_configs_are_rejected_with_the_class_named() {
        let base = || PoolConfig::new(4 << 20, 1);
        assert!(matches!(base().layout(), Err(BuildError::NoClasses)));
        assert!(matches!(
            PoolConfig::new(4 << 20, 0)
                .class(SizeClass::new("a", 1))
                .layout(),
            Err(BuildError::NoSlices)
        ));
        assert!(matches!(
            PoolConfig::new(1 << 30, 300)
                .class(SizeClass::new("a", 1))
                .layout(),
            Err(BuildError::TooManySlices { slices: 300, .. })
        ));
        for (class, reason) in [
            (SizeClass::new("z", 0), "buffer size is zero"),
            (SizeClass::new("z", 10).share(0), "share is zero"),
            (
                SizeClass::new("z", 10).per_slice(0),
                "explicit count is zero",
            ),
        ] {
            match base().class(class).layout() {
                Err(BuildError::InvalidClass { class, reason: r }) => {
                    assert_eq!((class.as_str(), r), ("z", reason))
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(matches!(
            base()
                .class(SizeClass::new("d", 64))
                .class(SizeClass::new("d", 128))
                .layout(),
            Err(BuildError::InvalidClass {
                reason: "name used by two classes",
                ..
            })
        ));
    }

    #[test]
    fn more_buffers_than_an_index_holds_is_an_error() {
        let err = PoolConfig::new(1 << 40, 1)
            .class(SizeClass::new("tiny", 1))
            .layout();
        assert!(
            matches!(err, Err(BuildError::TooManyBuffers { .. })),
            "{err:?}"
        );
    }
}
