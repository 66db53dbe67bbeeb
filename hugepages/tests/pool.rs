//! Single-threaded behaviour of the pool: exhaustion, double free, handles,
//! layout, stats, slice ownership, hugepage fallback.

use std::collections::HashSet;

use smbdirect_hugepages::{
    fallback_warning_emitted, AllocError, Backing, BufId, BufferPool, BuildError, ClaimError,
    ClassId, FreeError, HugepageInfo, HugepagePolicy, PageKind, PoolConfig, SizeClass,
    HUGEPAGE_SIZE,
};

const SMALL: ClassId = ClassId(0);
const LARGE: ClassId = ClassId(1);

/// Two slices; 4 small (100 B) and 2 large (8 KiB) buffers per slice.
fn tiny_pool() -> BufferPool {
    PoolConfig::new(1 << 20, 2)
        .class(SizeClass::new("small", 100).per_slice(4))
        .class(SizeClass::new("large", 8192).per_slice(2))
        .hugepages(HugepagePolicy::Disable)
        .mlock(false)
        .build()
        .expect("tiny pool")
}

#[test]
fn exhaustion_returns_exhausted_and_recovers_after_a_local_free() {
    let pool = tiny_pool();
    let mut w = pool.claim_slice(0).unwrap();
    let ids: Vec<BufId> = (0..4).map(|_| w.alloc(SMALL).unwrap()).collect();
    assert_eq!(
        w.alloc(SMALL),
        Err(AllocError::Exhausted {
            slice: 0,
            class: SMALL
        })
    );
    assert_eq!(
        w.alloc(SMALL),
        Err(AllocError::Exhausted {
            slice: 0,
            class: SMALL
        })
    );
    // Other classes and other slices are unaffected.
    assert!(w.alloc(LARGE).is_ok());
    let mut w1 = pool.claim_slice(1).unwrap();
    assert!(w1.alloc(SMALL).is_ok());

    w.free(ids[2]).unwrap();
    let again = w.alloc(SMALL).unwrap();
    assert_eq!(again.index(), ids[2].index());
    assert_ne!(again, ids[2], "a reallocation gets a new generation");
    assert!(w.alloc(SMALL).is_err());
    let s = pool.class_stats(0, SMALL).unwrap();
    assert_eq!((s.total, s.in_use, s.free, s.exhausted), (4, 4, 0, 3));
}

#[test]
fn exhaustion_recovers_after_a_free_from_another_thread() {
    let pool = tiny_pool();
    let mut w = pool.claim_slice(0).unwrap();
    let ids: Vec<BufId> = (0..2).map(|_| w.alloc(LARGE).unwrap()).collect();
    assert!(matches!(w.alloc(LARGE), Err(AllocError::Exhausted { .. })));
    let remote = pool.clone();
    std::thread::spawn(move || {
        for id in ids {
            remote.free(id).unwrap();
        }
    })
    .join()
    .unwrap();
    assert!(w.alloc(LARGE).is_ok());
    assert!(w.alloc(LARGE).is_ok());
    assert!(w.alloc(LARGE).is_err());
    let s = pool.class_stats(0, LARGE).unwrap();
    assert_eq!(
        (s.allocs, s.remote_frees, s.local_frees, s.in_use),
        (4, 2, 0, 2)
    );
}

#[test]
fn double_free_is_detected_and_leaves_the_free_list_intact() {
    let pool = tiny_pool();
    let mut w = pool.claim_slice(0).unwrap();
    let a = w.alloc(SMALL).unwrap();
    let b = w.alloc(SMALL).unwrap();
    w.free(a).unwrap();
    assert_eq!(w.free(a), Err(FreeError::DoubleFree { id: a }));
    assert_eq!(pool.free(a), Err(FreeError::DoubleFree { id: a }));
    pool.free(b).unwrap();
    assert_eq!(pool.free(b), Err(FreeError::DoubleFree { id: b }));
    assert_eq!(w.free(b), Err(FreeError::DoubleFree { id: b }));

    // A stale handle cannot free the buffer's next allocation.
    let ids: Vec<BufId> = (0..4).map(|_| w.alloc(SMALL).unwrap()).collect();
    let a2 = *ids.iter().find(|i| i.index() == a.index()).unwrap();
    assert_eq!(w.free(a), Err(FreeError::DoubleFree { id: a }));
    assert!(pool.locate(a).is_none(), "stale handle does not resolve");
    assert!(pool.locate(a2).is_some());

    // Still exactly four distinct buffers, each handed out once.
    let distinct: HashSet<u32> = ids.iter().map(|i| i.index()).collect();
    assert_eq!(distinct.len(), 4);
    assert!(w.alloc(SMALL).is_err());
    for id in ids {
        w.free(id).unwrap();
    }
    let s = pool.class_stats(0, SMALL).unwrap();
    assert_eq!((s.in_use, s.free, s.double_frees), (0, 4, 5));
}

#[test]
fn invalid_handles_are_refused() {
    let pool = tiny_pool();
    let mut w = pool.claim_slice(0).unwrap();
    let id = w.alloc(SMALL).unwrap();
    for bad in [
        BufId::from_bits(id.to_bits() | 0xff << 56), // slice 255
        BufId::from_bits(id.to_bits() | 0x7f << 48), // class 127
        BufId::from_bits(id.to_bits() | 1000),       // index out of range
    ] {
        assert_eq!(pool.free(bad), Err(FreeError::InvalidHandle { id: bad }));
        assert_eq!(w.free(bad), Err(FreeError::InvalidHandle { id: bad }));
        assert!(pool.locate(bad).is_none());
    }
    assert_eq!(
        w.alloc(ClassId(9)),
        Err(AllocError::UnknownClass { class: ClassId(9) })
    );
    w.free(id).unwrap();
}

#[test]
fn buf_id_roundtrips_through_u64() {
    let pool = tiny_pool();
    let mut w = pool.claim_slice(1).unwrap();
    let _ = w.alloc(LARGE).unwrap();
    let id = w.alloc(LARGE).unwrap();
    assert_eq!(
        (id.slice(), id.class(), id.index(), id.generation()),
        (1, LARGE, 1, 0)
    );
    assert_eq!(BufId::from_bits(id.to_bits()), id);
    assert_eq!(id.to_bits(), 1 << 56 | 1 << 48 | 1);
    assert_eq!(std::mem::size_of::<BufId>(), 8);
}

#[test]
fn locations_are_disjoint_aligned_and_inside_the_region() {
    let pool = PoolConfig::smbdirect(16 << 20, 2, 8192, 1364, 1 << 20)
        .hugepages(HugepagePolicy::Disable)
        .build()
        .unwrap();
    let mut ranges = Vec::new();
    for slice in 0..2 {
        let mut w = pool.claim_slice(slice).unwrap();
        let slice_range = pool.slice_range(slice).unwrap();
        for class in [ClassId::RECEIVE, ClassId::SEND, ClassId::RDMA] {
            while let Ok(id) = w.alloc(class) {
                let loc = pool.locate(id).unwrap();
                assert_eq!(loc.len, pool.class_layout(class).unwrap().buf_size);
                assert_eq!(
                    loc.addr(),
                    pool.region_base().as_ptr() as u64 + loc.offset as u64
                );
                assert!(slice_range.contains(&loc.offset));
                assert!(loc.offset + loc.len <= slice_range.end);
                let align = if loc.len >= 4096 { 4096 } else { 64 };
                assert_eq!(loc.addr() % align, 0, "{id} misaligned");
                ranges.push(loc.offset..loc.offset + loc.len);
            }
        }
    }
    assert!(pool.region_len() >= 16 << 20 && pool.region_len() % HUGEPAGE_SIZE == 0);
    ranges.sort_by_key(|r| r.start);
    for pair in ranges.windows(2) {
        assert!(
            pair[0].end <= pair[1].start,
            "{:?} overlaps {:?}",
            pair[0],
            pair[1]
        );
    }
    let send = pool.class_layout(ClassId::SEND).unwrap();
    assert_eq!((send.buf_size, send.stride), (1364, 1408));
}

#[test]
fn buffer_bytes_are_writable_and_alloc_len_picks_the_smallest_fit() {
    let pool = tiny_pool();
    let mut w = pool.claim_slice(0).unwrap();
    let id = w.alloc_len(101).unwrap();
    assert_eq!(id.class(), LARGE);
    let small = w.alloc_len(100).unwrap();
    assert_eq!(small.class(), SMALL);
    assert_eq!(
        w.alloc_len(8193),
        Err(AllocError::TooLarge {
            len: 8193,
            largest: 8192
        })
    );
    assert_eq!(pool.class_for_len(0), Some(SMALL));
    assert_eq!(pool.class_by_name("large"), Some(LARGE));
    // SAFETY: `id` was just allocated by this thread and nobody else knows it.
    let bytes = unsafe { pool.bytes_mut(id) }.unwrap();
    assert_eq!(bytes.len(), 8192);
    bytes.fill(0xa5);
    // SAFETY: as above; the mutable borrow has ended.
    assert!(unsafe { pool.bytes(id) }
        .unwrap()
        .iter()
        .all(|&b| b == 0xa5));
    w.free(id).unwrap();
    // SAFETY: `locate` refuses a freed handle, so no slice is produced.
    assert!(unsafe { pool.bytes(id) }.is_none());
}

#[test]
fn a_slice_has_one_owner_at_a_time_and_keeps_its_state_across_owners() {
    let pool = tiny_pool();
    let mut w = pool.claim_slice(0).unwrap();
    assert_eq!(
        pool.claim_slice(0).unwrap_err(),
        ClaimError::AlreadyClaimed { slice: 0 }
    );
    assert_eq!(
        pool.claim_slice(2).unwrap_err(),
        ClaimError::OutOfRange {
            slice: 2,
            slices: 2
        }
    );
    let held: Vec<BufId> = (0..3).map(|_| w.alloc(SMALL).unwrap()).collect();
    drop(w);
    let mut w = std::thread::spawn({
        let pool = pool.clone();
        move || pool.claim_slice(0).unwrap()
    })
    .join()
    .unwrap();
    assert!(w.alloc(SMALL).is_ok());
    assert!(w.alloc(SMALL).is_err(), "3 held + 1 = all 4");
    for id in held {
        w.free(id).unwrap();
    }
}

#[test]
fn stats_cover_every_class_of_every_slice() {
    let pool = tiny_pool();
    let mut w = pool.claim_slice(1).unwrap();
    let id = w.alloc(LARGE).unwrap();
    let stats = pool.stats();
    assert_eq!(stats.len(), 4);
    let s = stats
        .iter()
        .find(|s| s.slice == 1 && s.class == LARGE)
        .unwrap();
    assert_eq!(
        (s.buf_size, s.total, s.in_use, s.free, s.allocs),
        (8192, 2, 1, 1, 1)
    );
    assert!(stats
        .iter()
        .filter(|s| !(s.slice == 1 && s.class == LARGE))
        .all(|s| s.in_use == 0));
    w.free(id).unwrap();
    assert_eq!(pool.class_stats(1, LARGE).unwrap().in_use, 0);
    assert!(pool.class_stats(2, LARGE).is_none());
}

#[test]
fn without_reserved_hugepages_the_pool_falls_back_to_small_pages_and_warns() {
    let before = HugepageInfo::read().unwrap();
    for backing in [Backing::Anonymous, Backing::SharedMemfd] {
        let pool = PoolConfig::new(4 << 20, 1)
            .class(SizeClass::new("receive", 8192))
            .backing(backing)
            .build()
            .expect("Prefer never fails for lack of hugepages");
        let info = pool.backing();
        assert_eq!(info.backing, backing);
        assert_eq!(info.len, 4 << 20);
        assert_eq!(pool.is_hugepage_backed(), !pool.hugepage_fallback());
        if before.available_bytes() == 0 {
            assert_eq!(info.pages, PageKind::Small);
            assert!(pool.hugepage_fallback());
            assert!(
                fallback_warning_emitted(),
                "the fallback printed the warning"
            );
            assert!(info.to_string().contains("FALLBACK"), "{info}");
        }
        // The fallback pool works like any other.
        let mut w = pool.claim_slice(0).unwrap();
        let id = w.alloc(ClassId(0)).unwrap();
        // SAFETY: `id` is exclusively ours.
        unsafe { pool.bytes_mut(id) }.unwrap().fill(7);
        w.free(id).unwrap();
    }
}

#[test]
fn hugepages_disabled_uses_small_pages_without_a_fallback_flag() {
    let pool = tiny_pool();
    let info = pool.backing();
    assert_eq!(info.pages, PageKind::Small);
    assert!(!info.hugepage_fallback && !pool.is_hugepage_backed());
    assert!(pool.shared_fd().is_none());
}

#[test]
fn hugepages_required_without_reserved_pages_is_an_actionable_error() {
    let info = HugepageInfo::read().unwrap();
    if info.available() != 0 {
        eprintln!("skipped: {} hugepages available", info.available());
        return;
    }
    let err = PoolConfig::new(4 << 20, 1)
        .class(SizeClass::new("receive", 8192))
        .hugepages(HugepagePolicy::Require)
        .build()
        .unwrap_err();
    assert!(matches!(err, BuildError::HugepagesUnavailable { len, .. } if len == 4 << 20));
    let msg = err.to_string();
    assert!(
        msg.contains("2 x 2 MiB hugepages") && msg.contains("nr_hugepages"),
        "{msg}"
    );
    assert!(msg.contains("setup-hugepages.sh"), "{msg}");
}

/// Minor page faults taken by the calling thread so far.
fn thread_minor_faults() -> i64 {
    // SAFETY: an all-zero `rusage` is a valid value (plain integers).
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable `rusage`.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    assert_eq!(rc, 0, "getrusage: {}", std::io::Error::last_os_error());
    usage.ru_minflt
}

#[test]
fn the_region_is_prefaulted_so_first_use_takes_no_page_fault() {
    for backing in [Backing::Anonymous, Backing::SharedMemfd] {
        let pool = PoolConfig::new(8 << 20, 1)
            .class(SizeClass::new("page", 4096))
            .backing(backing)
            .mlock(false) // mlock would populate the pages by itself
            .build()
            .unwrap();
        let mut w = pool.claim_slice(0).unwrap();
        // Touched up front so that the test's own bookkeeping does not fault.
        let mut ids = vec![BufId::from_bits(0); 2048];
        let mut n = 0;
        let before = thread_minor_faults();
        while let Ok(id) = w.alloc(ClassId(0)) {
            // SAFETY: `id` was just allocated and is ours alone.
            unsafe { pool.bytes_mut(id) }.unwrap().fill(1);
            ids[n] = id;
            n += 1;
        }
        let faults = thread_minor_faults() - before;
        assert!(n > 1000);
        assert_eq!(faults, 0, "{backing:?}: first touch of {n} pages faulted");
    }
}
