//! Several threads allocating and freeing concurrently, with cross-thread
//! frees: no buffer is ever handed out twice, and no buffer is lost.
//!
//! Each allocation writes an owner tag into its buffer and flips a shared
//! "handed out" flag that must have been clear; the freer (possibly another
//! thread) checks the tag is intact and clears the flag before freeing.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Barrier};

use smbdirect_hugepages::{
    AllocError, BufId, BufferPool, ClassId, FreeError, HugepagePolicy, PoolConfig, SizeClass,
    SliceAllocator,
};

const THREADS: usize = 4;
const OPS_PER_THREAD: usize = 100_000;
const CLASSES: [(&str, usize, u32); 2] = [("small", 64, 128), ("large", 4096, 32)];
const MAX_PER_SLICE: usize = 128;

fn pool(slices: usize) -> BufferPool {
    let mut config = PoolConfig::new(4 << 20, slices).hugepages(HugepagePolicy::Disable);
    for (name, size, count) in CLASSES {
        config = config.class(SizeClass::new(name, size).per_slice(count));
    }
    config.build().unwrap()
}

/// One flag per buffer of the pool: set while the buffer is handed out.
struct Ledger(Vec<AtomicBool>);

impl Ledger {
    fn new(slices: usize) -> Self {
        Self(
            (0..slices * CLASSES.len() * MAX_PER_SLICE)
                .map(|_| AtomicBool::new(false))
                .collect(),
        )
    }

    fn flag(&self, id: BufId) -> &AtomicBool {
        let slot = (id.slice() * CLASSES.len() + id.class().index()) * MAX_PER_SLICE;
        &self.0[slot + id.index() as usize]
    }

    fn handed_out(&self, id: BufId) {
        assert!(
            !self.flag(id).swap(true, Ordering::AcqRel),
            "{id} handed out twice"
        );
    }

    fn returned(&self, id: BufId) {
        assert!(
            self.flag(id).swap(false, Ordering::AcqRel),
            "{id} freed while not held"
        );
    }
}

/// Writes `tag` at the start and end of the buffer.
fn stamp(pool: &BufferPool, id: BufId, tag: u64) {
    // SAFETY: `id` was just allocated by the calling thread; the ledger proves
    // nobody else holds it.
    let bytes = unsafe { pool.bytes_mut(id) }.unwrap();
    let n = bytes.len();
    bytes[..8].copy_from_slice(&tag.to_le_bytes());
    bytes[n - 8..].copy_from_slice(&tag.to_le_bytes());
}

/// Checks the tag written by [`stamp`] survived.
fn check(pool: &BufferPool, id: BufId, tag: u64) {
    // SAFETY: the calling thread holds `id` exclusively (received it over a
    // channel from the thread that stamped it, or stamped it itself).
    let bytes = unsafe { pool.bytes(id) }.unwrap();
    let n = bytes.len();
    assert_eq!(bytes[..8], tag.to_le_bytes(), "{id} head tag overwritten");
    assert_eq!(
        bytes[n - 8..],
        tag.to_le_bytes(),
        "{id} tail tag overwritten"
    );
}

/// xorshift64*: deterministic per-thread randomness without dependencies.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[test]
fn concurrent_alloc_and_cross_thread_free_never_hand_a_buffer_out_twice() {
    let pool = pool(THREADS);
    let ledger = Arc::new(Ledger::new(THREADS));
    let done = Arc::new(AtomicUsize::new(0));
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..THREADS)
        .map(|_| mpsc::channel::<(BufId, u64)>())
        .unzip();

    let handles: Vec<_> = receivers
        .into_iter()
        .enumerate()
        .map(|(me, inbox)| {
            let (pool, ledger, done) = (pool.clone(), ledger.clone(), done.clone());
            let peers = senders.clone();
            std::thread::spawn(move || {
                let mut worker = pool.claim_slice(me).unwrap();
                let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (me as u64 + 1));
                let mut held: Vec<(BufId, u64)> = Vec::new();
                let (mut seq, mut ops, mut remote_frees) = (0u64, 0usize, 0u64);
                // Frees everything other threads handed us: remote frees,
                // since those buffers belong to other slices.
                let drain = |worker: &mut SliceAllocator, remote_frees: &mut u64| {
                    while let Ok((id, tag)) = inbox.try_recv() {
                        assert_ne!(id.slice(), me);
                        check(&pool, id, tag);
                        ledger.returned(id);
                        worker.free(id).unwrap();
                        *remote_frees += 1;
                    }
                };
                while ops < OPS_PER_THREAD {
                    let r = rng.next();
                    match r % 8 {
                        // Allocate (more often than free, so classes run dry).
                        0..=3 => {
                            let class = ClassId((r >> 8) as u8 % CLASSES.len() as u8);
                            match worker.alloc(class) {
                                Ok(id) => {
                                    ledger.handed_out(id);
                                    seq += 1;
                                    let tag = (me as u64) << 48 | seq;
                                    stamp(&pool, id, tag);
                                    held.push((id, tag));
                                    ops += 1;
                                }
                                Err(AllocError::Exhausted { slice, .. }) => {
                                    assert_eq!(slice, me);
                                    // Our buffers may sit in a descheduled
                                    // peer's inbox: let it run.
                                    drain(&mut worker, &mut remote_frees);
                                    std::thread::yield_now();
                                }
                                Err(e) => panic!("{e}"),
                            }
                        }
                        // Free one of ours locally.
                        4 | 5 if !held.is_empty() => {
                            let (id, tag) = held.swap_remove((r >> 8) as usize % held.len());
                            check(&pool, id, tag);
                            ledger.returned(id);
                            worker.free(id).unwrap();
                            ops += 1;
                        }
                        // Hand one to another thread, which frees it.
                        6 if !held.is_empty() => {
                            let (id, tag) = held.swap_remove((r >> 8) as usize % held.len());
                            let peer = (me + 1 + (r >> 16) as usize % (THREADS - 1)) % THREADS;
                            peers[peer].send((id, tag)).unwrap();
                            ops += 1;
                        }
                        _ => drain(&mut worker, &mut remote_frees),
                    }
                }
                for (id, tag) in held.drain(..) {
                    check(&pool, id, tag);
                    ledger.returned(id);
                    worker.free(id).unwrap();
                }
                // Keep returning buffers to threads still working; once all
                // are done no more sends happen and one last drain empties
                // the inbox.
                done.fetch_add(1, Ordering::AcqRel);
                while done.load(Ordering::Acquire) < THREADS {
                    drain(&mut worker, &mut remote_frees);
                    std::thread::yield_now();
                }
                drain(&mut worker, &mut remote_frees);
                remote_frees
            })
        })
        .collect();
    drop(senders);
    let remote_frees: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(
        remote_frees > 20_000,
        "too few cross-thread frees: {remote_frees}"
    );

    // Nothing leaked, nothing duplicated: every buffer of every slice can be
    // allocated exactly once again.
    let stats = pool.stats();
    assert!(
        stats.iter().all(|s| s.in_use == 0 && s.double_frees == 0),
        "{stats:#?}"
    );
    assert!(
        stats.iter().any(|s| s.exhausted > 0),
        "the test never exhausted a class"
    );
    assert_eq!(
        stats.iter().map(|s| s.remote_frees).sum::<u64>(),
        remote_frees
    );
    let allocs: u64 = stats.iter().map(|s| s.allocs).sum();
    assert!(
        allocs > (THREADS * OPS_PER_THREAD / 3) as u64,
        "only {allocs} allocations"
    );
    eprintln!("{allocs} allocations, {remote_frees} cross-thread frees");
    for slice in 0..THREADS {
        let mut w = pool.claim_slice(slice).unwrap();
        for (class, (_, _, count)) in CLASSES.iter().enumerate() {
            let mut seen = std::collections::HashSet::new();
            while let Ok(id) = w.alloc(ClassId(class as u8)) {
                assert!(seen.insert(id.index()));
            }
            assert_eq!(seen.len(), *count as usize, "slice {slice} class {class}");
        }
    }
}

#[test]
fn remote_frees_racing_the_owners_allocations_lose_nothing() {
    // One owner allocating as fast as it can from a tiny class; three threads
    // returning everything it hands them. The return stack is pushed to while
    // the owner takes it whole.
    const FREERS: usize = 3;
    const ALLOCS: u64 = 200_000;
    let pool = pool(1);
    let ledger = Arc::new(Ledger::new(1));
    let (senders, freers): (Vec<_>, Vec<_>) = (0..FREERS)
        .map(|_| {
            let (tx, rx) = mpsc::sync_channel::<BufId>(64);
            let (pool, ledger) = (pool.clone(), ledger.clone());
            let handle = std::thread::spawn(move || {
                let mut n = 0u64;
                for id in rx {
                    check(&pool, id, id.to_bits());
                    ledger.returned(id);
                    pool.free(id).unwrap();
                    n += 1;
                }
                n
            });
            (tx, handle)
        })
        .unzip();
    let mut worker = pool.claim_slice(0).unwrap();
    let mut allocated = 0u64;
    let mut spins = 0u64;
    while allocated < ALLOCS {
        match worker.alloc(ClassId(0)) {
            Ok(id) => {
                ledger.handed_out(id);
                stamp(&pool, id, id.to_bits());
                senders[(allocated % FREERS as u64) as usize]
                    .send(id)
                    .unwrap();
                allocated += 1;
            }
            Err(AllocError::Exhausted { .. }) => {
                spins += 1;
                std::hint::spin_loop();
            }
            Err(e) => panic!("{e}"),
        }
    }
    drop(senders);
    let freed: u64 = freers.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(freed, ALLOCS);
    let s = pool.class_stats(0, ClassId(0)).unwrap();
    assert_eq!(
        (s.allocs, s.remote_frees, s.in_use, s.free),
        (ALLOCS, ALLOCS, 0, 128)
    );
    assert_eq!(s.exhausted, spins);
}

#[test]
fn racing_frees_of_one_handle_let_exactly_one_through() {
    // The owner and three other threads free the same handle at once, round
    // after round: the state CAS lets exactly one win, the free lists stay
    // consistent.
    const RACERS: usize = 3;
    const ROUNDS: usize = 2_000;
    let pool = pool(1);
    let shared = Arc::new(AtomicU64::new(0));
    let wins = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(RACERS + 1));
    let racers: Vec<_> = (0..RACERS)
        .map(|_| {
            let (pool, shared, wins, barrier) =
                (pool.clone(), shared.clone(), wins.clone(), barrier.clone());
            std::thread::spawn(move || {
                for _ in 0..ROUNDS {
                    barrier.wait();
                    let id = BufId::from_bits(shared.load(Ordering::Acquire));
                    match pool.free(id) {
                        Ok(()) => _ = wins.fetch_add(1, Ordering::AcqRel),
                        Err(FreeError::DoubleFree { id: refused }) => assert_eq!(refused, id),
                        Err(e) => panic!("{e}"),
                    }
                    barrier.wait();
                }
            })
        })
        .collect();
    let mut worker = pool.claim_slice(0).unwrap();
    for round in 0..ROUNDS {
        let id = worker.alloc(ClassId((round % 2) as u8)).unwrap();
        shared.store(id.to_bits(), Ordering::Release);
        barrier.wait();
        if worker.free(id).is_ok() {
            wins.fetch_add(1, Ordering::AcqRel);
        }
        barrier.wait();
        assert_eq!(wins.swap(0, Ordering::AcqRel), 1, "round {round}");
    }
    for r in racers {
        r.join().unwrap();
    }
    for (class, (_, _, count)) in CLASSES.iter().enumerate() {
        let s = pool.class_stats(0, ClassId(class as u8)).unwrap();
        assert_eq!(s.in_use, 0);
        assert_eq!(s.double_frees, (ROUNDS / 2 * RACERS) as u64);
        let mut seen = std::collections::HashSet::new();
        while let Ok(id) = worker.alloc(ClassId(class as u8)) {
            assert!(seen.insert(id.index()), "{id} handed out twice");
        }
        assert_eq!(seen.len(), *count as usize);
    }
}
