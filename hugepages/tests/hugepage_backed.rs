//! The hugetlb path, exercised only when the machine has 2 MiB hugepages
//! reserved (`echo 64 > /proc/sys/vm/nr_hugepages`, or
//! `HUGEMEM=128 scripts/setup-hugepages.sh`). With none reserved the test
//! says so and passes; the fallback path is covered in `tests/pool.rs`.
//!
//! One test in its own binary, so no other test competes for the pages.

use smbdirect_hugepages::{
    Backing, ClassId, HugepageInfo, HugepagePolicy, PageKind, PoolConfig, SharedMapping, SizeClass,
    HUGEPAGE_SIZE,
};

const POOL: usize = 4 << 20;

#[test]
fn reserved_hugepages_back_both_anonymous_and_memfd_pools() {
    let info = HugepageInfo::read().unwrap();
    if info.page_size != HUGEPAGE_SIZE as u64 || info.available_bytes() < 2 * POOL as u64 {
        eprintln!(
            "skipped: needs {} free 2 MiB hugepages, machine has {info:?}",
            2 * POOL / HUGEPAGE_SIZE
        );
        return;
    }
    let mut pools = Vec::new();
    for backing in [Backing::Anonymous, Backing::SharedMemfd] {
        let pool = PoolConfig::new(POOL, 2)
            .class(SizeClass::new("receive", 8192).share(1))
            .class(SizeClass::new("rdma", 1 << 20).per_slice(1))
            .backing(backing)
            .hugepages(HugepagePolicy::Require)
            .build()
            .unwrap_or_else(|e| panic!("{backing:?}: {e}"));
        let b = pool.backing();
        assert_eq!((b.pages, b.backing), (PageKind::Hugetlb2M, backing));
        assert!(pool.is_hugepage_backed() && !pool.hugepage_fallback());
        assert_eq!(pool.region_base().as_ptr() as usize % HUGEPAGE_SIZE, 0);
        assert!(b.to_string().contains("2 MiB hugetlb"), "{b}");

        let mut w = pool.claim_slice(1).unwrap();
        let id = w.alloc(ClassId(1)).unwrap();
        let loc = pool.locate(id).unwrap();
        // SAFETY: `id` is ours alone.
        unsafe { pool.bytes_mut(id) }.unwrap().fill(0x3c);
        if let Some(fd) = pool.shared_fd() {
            let view = SharedMapping::map(fd).unwrap();
            assert_eq!(view.base().as_ptr() as usize % HUGEPAGE_SIZE, 0);
            // SAFETY: nobody writes the buffer meanwhile.
            let seen = unsafe { view.bytes(loc.offset, loc.len) }.unwrap();
            assert!(seen.iter().all(|&b| b == 0x3c));
        }
        w.free(id).unwrap();
        drop(w);
        pools.push(pool);
    }
    // Both regions are faulted in up front: their pages are no longer free.
    let after = HugepageInfo::read().unwrap();
    let used = (2 * POOL / HUGEPAGE_SIZE) as u64;
    assert!(
        info.free - after.free >= used,
        "before {info:?}, after {after:?}"
    );
}
