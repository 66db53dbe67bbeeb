//! A memfd-backed pool region mapped a second time (as a software RDMA
//! provider in another process would) shows the same bytes at the same offsets.

use std::fs::OpenOptions;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;

use smbdirect_hugepages::{Backing, BufferPool, ClassId, PoolConfig, SharedMapping, SizeClass};

const CHILD_FD: &str = "SMBD_TEST_POOL_FD";
const CHILD_OFFSET: &str = "SMBD_TEST_POOL_OFFSET";
const CHILD_LEN: &str = "SMBD_TEST_POOL_LEN";

fn shared_pool() -> BufferPool {
    PoolConfig::new(4 << 20, 2)
        .class(SizeClass::new("receive", 8192).per_slice(8))
        .class(SizeClass::new("rdma", 1 << 20).per_slice(1))
        .backing(Backing::SharedMemfd)
        .build()
        .expect("shared pool")
}

#[test]
fn memfd_pool_mapped_twice_sees_the_same_bytes() {
    let pool = shared_pool();
    assert_eq!(pool.backing().backing, Backing::SharedMemfd);
    let fd = pool.shared_fd().expect("memfd-backed pool has an fd");

    // Second view through the fd itself, third through /proc/self/fd (what a
    // process given the path instead of the fd would do), fourth through a dup.
    let direct = SharedMapping::map(fd).unwrap();
    let reopened = OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .unwrap();
    let by_path = SharedMapping::map(&reopened).unwrap();
    let by_dup = SharedMapping::map(fd.try_clone_to_owned().unwrap()).unwrap();
    for view in [&direct, &by_path, &by_dup] {
        assert_eq!(view.len(), pool.region_len());
        assert_ne!(view.base(), pool.region_base(), "a distinct mapping");
    }

    let mut w = pool.claim_slice(1).unwrap();
    let recv = w.alloc(ClassId(0)).unwrap();
    let rdma = w.alloc(ClassId(1)).unwrap();
    for (id, seed) in [(recv, 3u8), (rdma, 11)] {
        let loc = pool.locate(id).unwrap();
        // SAFETY: `id` is ours; the views are only read while this slice lives
        // (the borrow ends before they are used).
        let bytes = unsafe { pool.bytes_mut(id) }.unwrap();
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(seed);
        }
        for view in [&direct, &by_path, &by_dup] {
            // SAFETY: nobody writes the buffer while this slice is alive.
            let seen = unsafe { view.bytes(loc.offset, loc.len) }.unwrap();
            assert!(seen
                .iter()
                .enumerate()
                .all(|(i, &b)| b == (i as u8).wrapping_mul(seed)));
        }
        // Writes through another view are seen by the pool.
        // SAFETY: exclusive for the duration of the fill.
        unsafe { by_path.bytes_mut(loc.offset, loc.len) }
            .unwrap()
            .fill(seed);
        // SAFETY: nobody writes the buffer while this slice is alive.
        assert!(unsafe { pool.bytes(id) }
            .unwrap()
            .iter()
            .all(|&b| b == seed));
    }
    assert!(direct.ptr_at(pool.region_len(), 1).is_none());
    assert!(direct.ptr_at(pool.region_len() - 1, 1).is_some());
    // SAFETY: out of range, so no slice is produced.
    assert!(unsafe { direct.bytes(usize::MAX, 2) }.is_none());
    w.free(recv).unwrap();
    w.free(rdma).unwrap();
}

#[test]
fn memfd_pool_is_shared_with_a_child_process() {
    let pool = shared_pool();
    let mut w = pool.claim_slice(0).unwrap();
    let id = w.alloc(ClassId(1)).unwrap();
    let loc = pool.locate(id).unwrap();
    // SAFETY: `id` is ours and the child has not been started yet.
    unsafe { pool.bytes_mut(id) }.unwrap().fill(0x5a);

    // The pool's memfd is close-on-exec; dup() gives an inheritable copy, as
    // a launcher would (or send it over SCM_RIGHTS).
    let raw = pool.shared_fd().unwrap().as_raw_fd();
    // SAFETY: `raw` is an open fd owned by the pool; dup has no memory-safety
    // preconditions.
    let inheritable = unsafe { libc::dup(raw) };
    assert!(inheritable >= 0, "dup: {}", std::io::Error::last_os_error());
    // SAFETY: `inheritable` was just returned by dup and is owned by nobody else.
    let inheritable = unsafe { OwnedFd::from_raw_fd(inheritable) };

    let child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process_maps_the_inherited_memfd",
            "--nocapture",
        ])
        .env(CHILD_FD, inheritable.as_raw_fd().to_string())
        .env(CHILD_OFFSET, loc.offset.to_string())
        .env(CHILD_LEN, loc.len.to_string())
        .output()
        .unwrap();
    drop(inheritable);
    assert!(
        child.status.success(),
        "child failed: {}\n{}{}",
        child.status,
        String::from_utf8_lossy(&child.stdout),
        String::from_utf8_lossy(&child.stderr)
    );
    // SAFETY: the child has exited; `id` is ours again.
    let bytes = unsafe { pool.bytes(id) }.unwrap();
    assert!(
        bytes.iter().all(|&b| b == 0xa5),
        "child's write not visible"
    );
    w.free(id).unwrap();
}

/// Runs only as the child of `memfd_pool_is_shared_with_a_child_process`:
/// checks the parent's bytes and answers by inverting them.
#[test]
fn child_process_maps_the_inherited_memfd() {
    let Ok(fd) = std::env::var(CHILD_FD) else {
        return; // not the child
    };
    let var = |name| std::env::var(name).unwrap().parse::<usize>().unwrap();
    let (offset, len) = (var(CHILD_OFFSET), var(CHILD_LEN));
    // SAFETY: the parent passed this fd number open (inherited across exec)
    // and nothing else in this process owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd.parse().unwrap()) };
    let view = SharedMapping::map(&fd).unwrap();
    // SAFETY: the parent does not touch the buffer while we run.
    let bytes = unsafe { view.bytes_mut(offset, len) }.unwrap();
    assert!(
        bytes.iter().all(|&b| b == 0x5a),
        "parent's bytes not visible"
    );
    for b in bytes {
        *b = !*b;
    }
}
