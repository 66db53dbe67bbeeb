//! Shared-memory segments: the memfd-backed mappings that carry a
//! connection's rings and a provider's grant table between processes.
//!
//! Segments this provider creates are sealed against shrinking and growing
//! (`F_SEAL_SHRINK | F_SEAL_GROW`), and a segment received from a peer is
//! mapped only if it carries the shrink seal, so a peer can never make our
//! accesses fault with `SIGBUS` by truncating the file under us.

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64};

use smbdirect_hugepages::SharedMapping;

/// A 64-byte aligned wrapper keeping one writer's atomics off other writers'
/// cache lines.
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub(crate) struct Padded<T>(pub T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        &self.0
    }
}

/// Marker for types that may be viewed in shared memory: `repr(C)`, made of
/// atomics only (so every bit pattern is valid and concurrent writes by a
/// peer are not a data race), and valid when zero-filled.
///
/// # Safety
/// Implementors must satisfy exactly that.
pub(crate) unsafe trait ShmSafe {}

// SAFETY: atomics of plain integers: any bit pattern, zero valid, no races.
unsafe impl ShmSafe for AtomicU64 {}
// SAFETY: as above.
unsafe impl ShmSafe for AtomicU32 {}
// SAFETY: `Padded` is repr(C) around a ShmSafe value plus padding bytes,
// which are never read.
unsafe impl<T: ShmSafe> ShmSafe for Padded<T> {}
// SAFETY: an array of ShmSafe values.
unsafe impl<T: ShmSafe, const N: usize> ShmSafe for [T; N] {}

/// One mapping of a memfd, shared with a peer process (or with another
/// provider of this process, through a second mapping of the same file).
pub(crate) struct Segment {
    map: SharedMapping,
    fd: OwnedFd,
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("fd", &self.fd.as_raw_fd())
            .field("len", &self.map.len())
            .finish()
    }
}

impl Segment {
    /// Creates a zero-filled, sealed segment of `len` bytes (rounded up to a page).
    pub(crate) fn create(name: &CStr, len: usize) -> io::Result<Self> {
        let len = len.div_ceil(4096).max(1) * 4096;
        // SAFETY: `name` is NUL-terminated; memfd_create has no other
        // memory-safety preconditions.
        let fd = unsafe {
            libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by memfd_create and is owned by no one else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let file = File::from(fd);
        file.set_len(len as u64)?;
        let fd = OwnedFd::from(file);
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: fcntl on an fd we own, with an integer argument.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let map = SharedMapping::map(&fd)?;
        Ok(Segment { map, fd })
    }

    /// Maps a segment a peer created; refuses one that could shrink under us
    /// or is shorter than `min_len`.
    pub(crate) fn open(fd: OwnedFd, min_len: usize) -> io::Result<Self> {
        // SAFETY: fcntl(F_GET_SEALS) on an fd we own.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "peer's shared segment is not sealed against shrinking",
            ));
        }
        let map = SharedMapping::map(&fd)?;
        if map.len() < min_len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "peer's shared segment is {} bytes, expected at least {min_len}",
                    map.len()
                ),
            ));
        }
        Ok(Segment { map, fd })
    }

    /// The memfd, to pass to a peer.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Length in bytes.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// A `T` at `offset`.
    ///
    /// Panics if it does not fit or is misaligned: offsets come from layouts
    /// this module computed and checked against the mapping length, never
    /// from the peer.
    #[inline]
    pub(crate) fn at<T: ShmSafe>(&self, offset: usize) -> &T {
        &self.slice::<T>(offset, 1)[0]
    }

    /// `count` consecutive `T`s at `offset` (same rules as [`Self::at`]).
    #[inline]
    pub(crate) fn slice<T: ShmSafe>(&self, offset: usize, count: usize) -> &[T] {
        let size = std::mem::size_of::<T>()
            .checked_mul(count)
            .and_then(|s| s.checked_add(offset))
            .expect("segment layout overflow");
        assert!(size <= self.map.len(), "segment layout exceeds mapping");
        let ptr = self
            .map
            .ptr_at(offset, size - offset)
            .expect("checked above");
        assert_eq!(
            ptr.as_ptr() as usize % std::mem::align_of::<T>(),
            0,
            "misaligned segment layout"
        );
        // SAFETY: the range is inside the mapping (checked), aligned (checked),
        // and the mapping lives as long as `self`. `T: ShmSafe` makes any bit
        // pattern valid and concurrent modification by a peer process sound
        // (atomics only); shared references to atomics are what we hand out.
        unsafe { std::slice::from_raw_parts(ptr.as_ptr().cast::<T>(), count) }
    }
}

/// Rounds `x` up to a multiple of 64.
pub(crate) const fn align64(x: usize) -> usize {
    (x + 63) & !63
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn created_segment_is_sealed_zeroed_and_shared_between_mappings() {
        let a = Segment::create(c"test-seg", 10_000).unwrap();
        assert_eq!(a.len(), 12_288);
        let dup = a.fd().try_clone_to_owned().unwrap();
        let b = Segment::open(dup, 12_288).unwrap();
        let x: &AtomicU64 = a.at(64);
        let y: &AtomicU64 = b.at(64);
        assert_eq!(y.load(Ordering::Relaxed), 0);
        x.store(42, Ordering::Relaxed);
        assert_eq!(y.load(Ordering::Relaxed), 42);
        let dup = a.fd().try_clone_to_owned().unwrap();
        assert!(Segment::open(dup, 1 << 20).is_err(), "too short is refused");
    }

    #[test]
    fn unsealed_memfd_is_refused() {
        // SAFETY: valid NUL-terminated name.
        let fd = unsafe { libc::memfd_create(c"unsealed".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: fresh fd owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        File::from(fd.try_clone().unwrap()).set_len(4096).unwrap();
        assert!(Segment::open(fd, 4096).is_err());
    }
}
