//! The memory store (`--store mem --store-size N`): every file of the share
//! lives in one pool of `N` bytes reserved up front and shared by all
//! workers.
//!
//! # Layout
//! The pool is one anonymous mapping (2 MiB hugepages when the size is a
//! multiple of 2 MiB and the machine has them reserved, else ordinary pages
//! with a `MADV_HUGEPAGE` hint), cut into [`BLOCK_SIZE`] blocks. Free
//! blocks sit in a lock-free queue; a counter of *available* blocks is
//! decremented (reserved) before a block is taken, so a write knows it will
//! fit before it touches anything.
//!
//! Each file maps block numbers to pool blocks through a two-level map:
//! a top-level array of [`AtomicU32`] (allocated at CREATE, one entry per
//! [`CHUNK_ENTRIES`] blocks of the largest file the pool can hold) naming
//! *chunks*, and the chunks themselves, tables of [`CHUNK_ENTRIES`] block
//! numbers taken from a chunk pool mapped at start. Entries hold `index + 1`
//! (0 is "none": a hole, which reads as zeros). Entries are only ever
//! published with a compare-and-swap from 0, so the READ/WRITE path takes
//! no lock and performs no heap allocation: it walks the map with atomic
//! loads and copies with raw pointers.
//!
//! The chunk pool holds one chunk per pool block plus [`CHUNK_SLACK`]: a
//! chunk in use always maps at least one block, except for the moment
//! between a writer publishing a new chunk and the block in it, so chunks
//! cannot run out before blocks do.
//!
//! # Concurrency
//! - Two workers writing the same bytes at the same time race, as on a disk:
//!   the result is some interleaving of the two writes. Reads concurrent
//!   with writes may see part of a write. The store stays consistent (no
//!   block is mapped twice, accounting is exact); only the bytes are racy.
//! - Two writers filling the same hole race to publish a block; the loser
//!   returns its block to the pool and writes into the winner's.
//! - A fresh block is filled (data and zeros) *before* it is published, so
//!   no reader ever sees bytes of a previous file.
//!
//! # Freeing rule
//! Blocks are freed only when no other open could be using them. The open
//! count of a file changes under the namespace lock (CREATE and CLOSE).
//! Truncation (`truncate`, Overwrite, Supersede) holds that lock and:
//! - when the truncating open is the file's only one, releases the blocks
//!   past the new end of file at once;
//! - otherwise zeroes them (so they read as holes) and marks the file; its
//!   last CLOSE releases every block past the end of file then.
//!
//! Invariant: bytes of mapped blocks at or past the end of file are zero,
//! so growing a file (truncate up, or a write past the end) exposes zeros.
//!
//! # Space accounting
//! [`Store::usage`] reports pool blocks in use × [`BLOCK_SIZE`] (the
//! allocation, not the sum of file sizes: a 1-byte file uses one block),
//! and the bound, the store size rounded down to whole blocks.
//!
//! # Namespace
//! The tree of names lives behind a `Mutex`, touched by CREATE, CLOSE,
//! truncation and the metadata operations (rename, delete, listing), never
//! by READ or WRITE. Each file or directory is an entry of an arena keyed
//! by its file id (a counter, never reused: [`FileInfo::file_id`]); a
//! directory's entry maps the case-folded names of its children to their
//! ids. Names compare case-insensitively, as a Windows server opens them
//! ([MS-FSA] 2.1.5.1, IsCaseInsensitive; folded with Unicode lower-casing
//! here), and keep the case they were created or renamed with. The root
//! `""` is a directory.
//!
//! Renaming moves one entry between directories (a directory takes its
//! subtree along; open handles anywhere keep working, as they name the
//! node, not the path). Replacing an existing file frees its blocks at
//! once: a target that is open, or a directory, is never replaced
//! ([MS-FSA] 2.1.5.14.11: STATUS_ACCESS_DENIED).
//!
//! # Delete on close
//! [`Store::set_delete_on_close`] marks the file itself (so every worker
//! sees it): opens of it, and creations in a marked directory, fail with
//! `DeletePending`; the last CLOSE of the file (on any worker) unlinks the
//! name and frees every block, following the freeing rule. A marked
//! directory that got children after all (marked while empty, not
//! possible through this store, but kept safe) is left in place.
//!
//! # Attributes and times
//! The FILE_ATTRIBUTE_* bits SET_INFO may set are kept as given (files
//! start with ARCHIVE, as NTFS creates them); READONLY is recorded, not
//! enforced (access checks belong to the SMB2 layer). All four times are
//! kept and may be set; a write updates last write, change and last access
//! time (reads do not, as with NtfsDisableLastAccessUpdate).
//!
//! Open files are named by [`Handle`]s of a per-worker [`OpenTable`], so a
//! lookup on the I/O path touches only the worker's own memory and the
//! file's atomics.
//!
//! # Zero-copy RDMA
//! The data region (and a separate all-zero block standing for holes) can
//! be registered with the RDMA provider ([`Store::zero_copy`]): READ then
//! RDMA-writes straight from the file's blocks and WRITE RDMA-reads straight
//! into them ([`Store::pin_read`], [`Store::pin_write`]), a scatter list of
//! blocks (neighbouring pool blocks merged into one piece).
//!
//! A transfer outlives the request that started it, and the freeing rule
//! above does not cover that: the open may be closed, or truncate its file,
//! while the provider still reads or writes the blocks. So every block a
//! transfer uses is *pinned*, and a pinned block is never handed to another
//! file. Each block has a pin word (`Pool::pins`): a count of pins in the
//! low bits and a FREED bit.
//! - Pinning (I/O path, lock-free, no allocation): read the block number
//!   from the file's map, increment its pin count, then read the map entry
//!   again; if it no longer names that block (it was unmapped in between),
//!   drop the pin and look again. Both steps are sequentially consistent,
//!   and unmapping swaps the entry to 0 *before* freeing (also sequentially
//!   consistent), so either the pinner sees the entry gone or the freer
//!   sees the pin.
//! - Freeing a mapped block (`Pool::free_block`): with no pin it goes to the
//!   free queue at once; with pins it only gets the FREED bit.
//! - Unpinning (`Pool::unpin`): the holder of the last pin of a FREED block
//!   clears the word and puts the block on the free queue.
//!
//! A pin taken on a block that was already free (a reader that lost the race
//! above) is harmless: the re-check fails, and the pin is dropped before the
//! block can be freed again, or else defers that free like any pin. Blocks
//! are filled when taken, so a deferred block never shows its old bytes to
//! another file. A transfer concurrent with a truncation of its own file may
//! see zeros (as with the copy path: same-file races are disk-like).
//!
//! WRITE goes in place only when the whole range is inside the end of file
//! and already mapped (overwrites); anything else (holes, extending writes)
//! is staged and copied as before, so a failed RDMA Read (the connection
//! ends, [MS-SMBD] 3.1.5.3: the client sees no response and treats the
//! write as failed) can leave torn bytes only inside the end of file, within
//! the range the client asked to write (docs/spec-notes.md).

use super::store::{
    attributes, disposition_allows_directory, filetime_now, valid_path, Action, DirEntry,
    Disposition, FileInfo, FsInfo, Handle, OpenRequest, OpenTable, Poll, SetTimes, Store,
    StoreError, StoreFactory, Tag, ZeroCopy,
};
use crate::provider::Sge;
use crate::zerocopy::{Piece, Pins, NO_PIN};
use crossbeam_queue::ArrayQueue;
use memmap2::{Advice, MmapMut, MmapOptions};
use std::collections::HashMap;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// log2 of [`BLOCK_SIZE`].
pub const BLOCK_SHIFT: u32 = 16;
/// Allocation unit of the pool (64 KiB).
pub const BLOCK_SIZE: u64 = 1 << BLOCK_SHIFT;
/// log2 of [`CHUNK_ENTRIES`].
const CHUNK_SHIFT: u32 = 6;
/// Block numbers per second-level table (a chunk maps 4 MiB of a file).
pub const CHUNK_ENTRIES: usize = 1 << CHUNK_SHIFT;
/// Chunks beyond one per block: at most one chunk per concurrent writer can
/// be momentarily empty, so this bounds the writers that may race.
pub const CHUNK_SLACK: usize = 4096;
/// Most blocks a pool may have (entries store `index + 1` in a `u32`).
const MAX_BLOCKS: u64 = u32::MAX as u64 - 1;
/// Size of the hugepages the pool asks for.
const HUGEPAGE: u64 = 2 << 20;
/// Pin word: set once a pinned block was freed (the last unpin frees it).
const PIN_FREED: u32 = 1 << 31;

/// The block pool: data region, free blocks, chunk tables.
struct Pool {
    /// Start of the data region (`blocks` × [`BLOCK_SIZE`] bytes).
    data: NonNull<u8>,
    /// Keeps the data region mapped; never accessed through references.
    _data_map: MmapMut,
    blocks: u32,
    /// Free block numbers.
    free_blocks: ArrayQueue<u32>,
    /// Free blocks not yet reserved by a writer. A block is pushed to
    /// `free_blocks` before this is incremented, and this is decremented
    /// before a block is popped, so a successful reservation guarantees the
    /// pop.
    available: AtomicU64,
    /// Start of the chunk tables (`chunk_count` × [`CHUNK_ENTRIES`]).
    chunks: NonNull<AtomicU32>,
    _chunk_map: MmapMut,
    chunk_count: u32,
    /// Free chunk numbers; every free chunk is all zeros.
    free_chunks: ArrayQueue<u32>,
    hugepages: bool,
    /// Per block: pins of zero-copy transfers, and [`PIN_FREED`] (see the
    /// module docs).
    pins: Box<[AtomicU32]>,
    /// One block of zeros, never written: what a zero-copy READ sends for
    /// holes.
    zero: NonNull<u8>,
    _zero_map: MmapMut,
}

// SAFETY: `data` and `chunks` point into mappings owned by the pool and
// living as long as it; all shared mutation of chunk tables goes through
// atomics, and data bytes are written only with raw-pointer copies whose
// races are the documented disk-like races on file contents (plain bytes,
// no invariants of Rust types depend on them).
unsafe impl Send for Pool {}
// SAFETY: see `Send` above.
unsafe impl Sync for Pool {}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("blocks", &self.blocks)
            .field("available", &self.available.load(Ordering::Relaxed))
            .field("chunks", &self.chunk_count)
            .field("hugepages", &self.hugepages)
            .finish()
    }
}

/// Maps `len` bytes of anonymous memory, trying 2 MiB hugepages first when
/// `hugepages` (and `len` is a multiple of 2 MiB), else ordinary pages with
/// a `MADV_HUGEPAGE` hint. Returns the mapping and whether it is
/// hugepage-backed. The store's data region is mapped with
/// `hugepages = true`; the bench's same-footprint `memcpy` baseline maps its
/// sources with this too, so both read the same kind of memory.
pub fn map_region(len: usize, hugepages: bool) -> Result<(MmapMut, bool), String> {
    if hugepages && len as u64 % HUGEPAGE == 0 {
        if let Ok(m) = MmapOptions::new().len(len).huge(Some(21)).map_anon() {
            return Ok((m, true));
        }
    }
    let m = MmapOptions::new()
        .len(len)
        .map_anon()
        .map_err(|e| format!("memory store: cannot map {len} bytes: {e}"))?;
    if hugepages {
        // A hint only: transparent hugepages where the kernel allows.
        let _ = m.advise(Advice::HugePage);
    }
    Ok((m, false))
}

impl Pool {
    fn new(blocks: u32) -> Result<Self, String> {
        let data_len = blocks as usize * BLOCK_SIZE as usize;
        let (mut data_map, hugepages) = map_region(data_len, true)?;
        if !hugepages {
            static WARNED: AtomicBool = AtomicBool::new(false);
            if !WARNED.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "[smbdirectd] WARN memory store: no 2 MiB hugepages for {data_len} bytes \
                     (size not a multiple of 2 MiB or none reserved: see \
                     scripts/setup-hugepages.sh); using ordinary pages"
                );
            }
        }
        let chunk_count = blocks as usize + CHUNK_SLACK;
        // Lazily faulted: only chunks ever used cost memory.
        let (mut chunk_map, _) = map_region(chunk_count * CHUNK_ENTRIES * 4, false)?;
        let free_blocks = ArrayQueue::new(blocks as usize);
        for b in 0..blocks {
            let _ = free_blocks.push(b);
        }
        let free_chunks = ArrayQueue::new(chunk_count);
        for c in 0..chunk_count as u32 {
            let _ = free_chunks.push(c);
        }
        let data = NonNull::new(data_map.as_mut_ptr()).ok_or("memory store: null mapping")?;
        let chunks = NonNull::new(chunk_map.as_mut_ptr().cast::<AtomicU32>())
            .ok_or("memory store: null mapping")?;
        let (mut zero_map, _) = map_region(BLOCK_SIZE as usize, false)?;
        let zero = NonNull::new(zero_map.as_mut_ptr()).ok_or("memory store: null mapping")?;
        Ok(Pool {
            data,
            _data_map: data_map,
            blocks,
            free_blocks,
            available: AtomicU64::new(u64::from(blocks)),
            chunks,
            _chunk_map: chunk_map,
            chunk_count: chunk_count as u32,
            free_chunks,
            hugepages,
            pins: (0..blocks).map(|_| AtomicU32::new(0)).collect(),
            zero,
            _zero_map: zero_map,
        })
    }

    /// Frees block `b`, which a file mapped until now (its map entry is
    /// already 0): at once, or when its last pin goes.
    fn free_block(&self, b: u32) {
        let word = &self.pins[b as usize];
        let mut cur = word.load(Ordering::SeqCst);
        loop {
            if cur & !PIN_FREED == 0 {
                // No pin. A pinner arriving now re-checks the map, finds
                // the entry gone and drops its pin without freeing.
                self.give_block(b);
                return;
            }
            match word.compare_exchange(cur, cur | PIN_FREED, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return,
                Err(now) => cur = now,
            }
        }
    }

    /// Pins block `b` (the caller re-checks that it is still mapped).
    fn pin(&self, b: u32) {
        self.pins[b as usize].fetch_add(1, Ordering::SeqCst);
    }

    /// Drops a pin of block `b`; the last pin of a freed block frees it.
    fn unpin(&self, b: u32) {
        let word = &self.pins[b as usize];
        let mut cur = word.load(Ordering::Relaxed);
        loop {
            debug_assert!(cur & !PIN_FREED > 0, "unpin of an unpinned block");
            let (new, give) = if cur == PIN_FREED | 1 {
                (0, true)
            } else {
                (cur.wrapping_sub(1), false)
            };
            match word.compare_exchange(cur, new, Ordering::SeqCst, Ordering::Relaxed) {
                Ok(_) => {
                    if give {
                        self.give_block(b);
                    }
                    return;
                }
                Err(now) => cur = now,
            }
        }
    }

    /// The pool block holding address `addr` of the data region.
    fn block_of(&self, addr: u64) -> Option<u32> {
        let off = addr.checked_sub(self.data.as_ptr() as u64)?;
        let b = off >> BLOCK_SHIFT;
        (b < u64::from(self.blocks)).then_some(b as u32)
    }

    /// The table of chunk `c`.
    fn chunk(&self, c: u32) -> &[AtomicU32] {
        assert!(c < self.chunk_count);
        // SAFETY: chunk `c` lies inside the chunk mapping (checked above),
        // which lives as long as `self`; the mapping is page-aligned and
        // zero-initialised, a valid bit pattern for `AtomicU32`, and all
        // accesses are atomic.
        unsafe {
            std::slice::from_raw_parts(
                self.chunks.as_ptr().add(c as usize * CHUNK_ENTRIES),
                CHUNK_ENTRIES,
            )
        }
    }

    /// Start of block `b`.
    fn block_ptr(&self, b: u32) -> *mut u8 {
        assert!(b < self.blocks);
        // SAFETY: `b < blocks`, so the offset stays inside the data mapping.
        unsafe { self.data.as_ptr().add(b as usize * BLOCK_SIZE as usize) }
    }

    /// Reserves `n` blocks; false if fewer are available.
    fn reserve(&self, n: u64) -> bool {
        if n == 0 {
            return true;
        }
        self.available
            .fetch_update(Ordering::Acquire, Ordering::Relaxed, |a| a.checked_sub(n))
            .is_ok()
    }

    /// Returns `n` reserved blocks that were not taken.
    fn unreserve(&self, n: u64) {
        if n > 0 {
            self.available.fetch_add(n, Ordering::Release);
        }
    }

    /// Takes one block of a reservation.
    fn take_block(&self) -> Option<u32> {
        self.free_blocks.pop()
    }

    /// Frees a block (its contents do not matter: blocks are filled when
    /// taken).
    fn give_block(&self, b: u32) {
        let pushed = self.free_blocks.push(b);
        debug_assert!(pushed.is_ok(), "more blocks freed than exist");
        self.available.fetch_add(1, Ordering::Release);
    }

    /// Blocks in use or reserved.
    fn used_blocks(&self) -> u64 {
        u64::from(self.blocks) - self.available.load(Ordering::Relaxed)
    }
}

/// A file or directory: its data and the attributes READ and WRITE touch
/// (its name and place live in the [`Namespace`]).
#[derive(Debug)]
struct Node {
    /// File id ([`FileInfo::file_id`]); the key of its namespace entry.
    id: u64,
    is_dir: bool,
    /// End of file.
    size: AtomicU64,
    /// Pool blocks this file maps.
    mapped: AtomicU64,
    /// Chunk number + 1 per [`CHUNK_ENTRIES`] blocks (0: none). Empty for
    /// directories.
    top: Box<[AtomicU32]>,
    creation_time: AtomicU64,
    last_access_time: AtomicU64,
    last_write_time: AtomicU64,
    change_time: AtomicU64,
    /// FILE_ATTRIBUTE_* of [`attributes::SETTABLE`] (never DIRECTORY or
    /// NORMAL: see [`attributes::reported`]).
    attributes: AtomicU32,
    /// Opens, changed under the namespace lock.
    opens: AtomicU32,
    /// Blocks past the end of file are still mapped (zeroed): a truncation
    /// shared with other opens. The last close releases them.
    trim_pending: AtomicBool,
    /// Deleted at the last close; changed under the namespace lock.
    delete_pending: AtomicBool,
}

impl Node {
    fn new(id: u64, is_dir: bool, top_len: usize) -> Self {
        let now = filetime_now();
        Node {
            id,
            is_dir,
            size: AtomicU64::new(0),
            mapped: AtomicU64::new(0),
            top: if is_dir {
                Box::new([])
            } else {
                (0..top_len).map(|_| AtomicU32::new(0)).collect()
            },
            creation_time: AtomicU64::new(now),
            last_access_time: AtomicU64::new(now),
            last_write_time: AtomicU64::new(now),
            change_time: AtomicU64::new(now),
            attributes: AtomicU32::new(if is_dir { 0 } else { attributes::ARCHIVE }),
            opens: AtomicU32::new(0),
            trim_pending: AtomicBool::new(false),
            delete_pending: AtomicBool::new(false),
        }
    }

    /// Largest number of blocks the map can hold.
    fn max_blocks(&self) -> u64 {
        (self.top.len() as u64) << CHUNK_SHIFT
    }

    /// The pool block behind file block `b`, if mapped.
    fn block(&self, pool: &Pool, b: u64) -> Option<u32> {
        let t = self
            .top
            .get((b >> CHUNK_SHIFT) as usize)?
            .load(Ordering::Acquire);
        if t == 0 {
            return None;
        }
        let e = pool.chunk(t - 1)[(b as usize) & (CHUNK_ENTRIES - 1)].load(Ordering::Acquire);
        e.checked_sub(1)
    }

    fn info(&self) -> FileInfo {
        FileInfo {
            size: self.size.load(Ordering::Acquire),
            allocation: self.mapped.load(Ordering::Relaxed) * BLOCK_SIZE,
            is_dir: self.is_dir,
            creation_time: self.creation_time.load(Ordering::Relaxed),
            last_access_time: self.last_access_time.load(Ordering::Relaxed),
            last_write_time: self.last_write_time.load(Ordering::Relaxed),
            change_time: self.change_time.load(Ordering::Relaxed),
            file_id: self.id,
            attributes: attributes::reported(self.attributes.load(Ordering::Relaxed), self.is_dir),
            nlink: 1,
            delete_pending: self.delete_pending.load(Ordering::Relaxed),
        }
    }

    /// A write: the file was accessed, written and changed now.
    fn touch(&self) {
        let now = filetime_now();
        self.last_access_time.store(now, Ordering::Relaxed);
        self.last_write_time.store(now, Ordering::Relaxed);
        self.change_time.store(now, Ordering::Relaxed);
    }
}

/// File id of the root directory.
const ROOT_ID: u64 = 1;

/// A name of the tree.
#[derive(Debug)]
struct Entry {
    node: Arc<Node>,
    /// Name in the parent, as created or renamed ("" for the root).
    name: String,
    /// The parent directory's id (the root's is its own).
    parent: u64,
    /// Case-folded name → id of each child (directories only).
    children: HashMap<String, u64>,
}

/// The tree of names, under the store's mutex.
#[derive(Debug)]
struct Namespace {
    /// Every file and directory by id.
    entries: HashMap<u64, Entry>,
    /// The id the next file gets.
    next_id: u64,
}

/// Where a path leads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lookup {
    /// An existing file or directory.
    Found(u64),
    /// The last component is missing from this existing directory.
    Missing(u64),
    /// A parent is missing or is not a directory.
    NoParent,
}

impl Namespace {
    fn new() -> Self {
        let root = Entry {
            node: Arc::new(Node::new(ROOT_ID, true, 0)),
            name: String::new(),
            parent: ROOT_ID,
            children: HashMap::new(),
        };
        Namespace {
            entries: HashMap::from([(ROOT_ID, root)]),
            next_id: ROOT_ID + 1,
        }
    }

    /// The entry of `id`. Every id reachable from an open handle or from a
    /// directory's children has an entry (entries go only at the last
    /// close, with their name).
    fn entry(&self, id: u64) -> &Entry {
        &self.entries[&id]
    }

    fn entry_mut(&mut self, id: u64) -> &mut Entry {
        self.entries
            .get_mut(&id)
            .expect("namespace entry of a live id")
    }

    /// Walks `path` (valid, `\`-separated) from the root.
    fn lookup(&self, path: &str) -> Lookup {
        if path.is_empty() {
            return Lookup::Found(ROOT_ID);
        }
        let mut cur = ROOT_ID;
        let mut parts = path.split('\\').peekable();
        while let Some(part) = parts.next() {
            let e = self.entry(cur);
            if !e.node.is_dir {
                return Lookup::NoParent;
            }
            match e.children.get(&fold(part)) {
                Some(&id) => cur = id,
                None if parts.peek().is_none() => return Lookup::Missing(cur),
                None => return Lookup::NoParent,
            }
        }
        Lookup::Found(cur)
    }

    /// The path of `id` with the case of each name.
    fn path_of(&self, mut id: u64) -> String {
        let mut names = Vec::new();
        while id != ROOT_ID {
            let e = self.entry(id);
            names.push(e.name.as_str());
            id = e.parent;
        }
        names.reverse();
        names.join("\\")
    }

    /// Adds a new file or directory `name` to the directory `parent`.
    fn insert(&mut self, parent: u64, name: &str, is_dir: bool, top_len: usize) -> Arc<Node> {
        let id = self.next_id;
        self.next_id += 1;
        let node = Arc::new(Node::new(id, is_dir, top_len));
        self.entries.insert(
            id,
            Entry {
                node: Arc::clone(&node),
                name: name.to_owned(),
                parent,
                children: HashMap::new(),
            },
        );
        self.entry_mut(parent).children.insert(fold(name), id);
        node
    }

    /// Unlinks `id` (not the root) from its parent and forgets it.
    fn remove(&mut self, id: u64) -> Entry {
        let e = self
            .entries
            .remove(&id)
            .expect("namespace entry of a live id");
        self.entry_mut(e.parent).children.remove(&fold(&e.name));
        e
    }

    /// Whether `ancestor` is `id` or one of its parents.
    fn is_within(&self, mut id: u64, ancestor: u64) -> bool {
        loop {
            if id == ancestor {
                return true;
            }
            if id == ROOT_ID {
                return false;
            }
            id = self.entry(id).parent;
        }
    }
}

/// What all handles of one memory store share.
#[derive(Debug)]
struct Shared {
    pool: Pool,
    namespace: Mutex<Namespace>,
    /// Length of every file's top-level map.
    top_len: usize,
    /// VolumeSerialNumber ([`Store::fs_info`]).
    serial: u32,
}

/// Case-insensitive key of a name.
fn fold(name: &str) -> String {
    name.to_lowercase()
}

/// A path's parent and last component.
fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('\\').unwrap_or(("", path))
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Namespace> {
        // A panic while holding the lock leaves the namespace consistent
        // (every change is a single insert or counter update).
        self.namespace.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Copies `data` into the file at `offset`, mapping holes first. All
    /// needed blocks are reserved before anything is written: `Full` leaves
    /// the file unchanged.
    fn write(&self, node: &Node, offset: u64, data: &[u8]) -> Result<u32, StoreError> {
        if node.is_dir {
            return Err(StoreError::IsADirectory);
        }
        let len = u32::try_from(data.len()).map_err(|_| StoreError::Io(libc::EINVAL))?;
        if len == 0 {
            return Ok(0);
        }
        let end = offset.checked_add(u64::from(len)).ok_or(StoreError::Full)?;
        let first = offset >> BLOCK_SHIFT;
        let last = (end - 1) >> BLOCK_SHIFT;
        if last >= node.max_blocks() {
            return Err(StoreError::Full);
        }
        let pool = &self.pool;
        let holes = (first..=last)
            .filter(|&b| node.block(pool, b).is_none())
            .count() as u64;
        if !pool.reserve(holes) {
            return Err(StoreError::Full);
        }
        let mut reserved = holes;
        for b in first..=last {
            let start = b << BLOCK_SHIFT;
            let lo = offset.max(start) - start;
            let hi = end.min(start + BLOCK_SIZE) - start;
            let src = &data[(start + lo - offset) as usize..(start + hi - offset) as usize];
            let target = match node.block(pool, b) {
                Some(blk) => blk,
                None => match self.map_block(node, b, lo as usize, src, &mut reserved) {
                    Ok(None) => continue, // filled while publishing
                    Ok(Some(blk)) => blk, // another writer published first
                    Err(e) => {
                        // Only when more than CHUNK_SLACK writers race:
                        // keep what was written visible (bytes past the
                        // end of file must stay zero).
                        pool.unreserve(reserved);
                        if start > offset {
                            node.size.fetch_max(start, Ordering::AcqRel);
                        }
                        return Err(e);
                    }
                },
            };
            // SAFETY: `target` is a block of the pool mapped by this file
            // (never freed while this open exists: freeing rule), and
            // `lo + src.len() <= BLOCK_SIZE`; `src` is caller memory, which
            // cannot overlap the pool. Concurrent writers of the same bytes
            // race as documented (plain bytes).
            unsafe {
                ptr::copy_nonoverlapping(
                    src.as_ptr(),
                    pool.block_ptr(target).add(lo as usize),
                    src.len(),
                )
            };
        }
        pool.unreserve(reserved);
        node.size.fetch_max(end, Ordering::AcqRel);
        node.touch();
        Ok(len)
    }

    /// Maps a reserved block at file block `b`, filled with `src` at `lo`
    /// and zeros elsewhere. `Ok(None)`: published (and consumed one
    /// reservation); `Ok(Some(blk))`: another writer published `blk` first
    /// (the caller writes into it).
    fn map_block(
        &self,
        node: &Node,
        b: u64,
        lo: usize,
        src: &[u8],
        reserved: &mut u64,
    ) -> Result<Option<u32>, StoreError> {
        let pool = &self.pool;
        let slot = &node.top[(b >> CHUNK_SHIFT) as usize];
        let mut chunk = slot.load(Ordering::Acquire);
        if chunk == 0 {
            let c = pool.take_chunk().ok_or(StoreError::Full)?;
            match slot.compare_exchange(0, c + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => chunk = c + 1,
                Err(winner) => {
                    pool.give_chunk(c);
                    chunk = winner;
                }
            }
        }
        let entry = &pool.chunk(chunk - 1)[(b as usize) & (CHUNK_ENTRIES - 1)];
        if *reserved == 0 {
            // Not reached while the freeing rule holds (a block counted as
            // mapped stays mapped during the write); reserve to stay exact.
            if !pool.reserve(1) {
                return Err(StoreError::Full);
            }
            *reserved = 1;
        }
        let Some(blk) = pool.take_block() else {
            return Err(StoreError::Full);
        };
        *reserved -= 1;
        let p = pool.block_ptr(blk);
        let hi = lo + src.len();
        // SAFETY: `blk` was just taken from the free queue, so no one else
        // can reach it until it is published below; `lo <= hi <= BLOCK_SIZE`.
        unsafe {
            ptr::write_bytes(p, 0, lo);
            ptr::copy_nonoverlapping(src.as_ptr(), p.add(lo), src.len());
            ptr::write_bytes(p.add(hi), 0, BLOCK_SIZE as usize - hi);
        }
        match entry.compare_exchange(0, blk + 1, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                node.mapped.fetch_add(1, Ordering::Relaxed);
                Ok(None)
            }
            Err(winner) => {
                pool.give_block(blk);
                Ok(Some(winner - 1))
            }
        }
    }

    /// Copies `dst.len()` bytes at `offset` (holes and unmapped ranges give
    /// zeros).
    fn copy_out(&self, node: &Node, offset: u64, dst: &mut [u8]) {
        let pool = &self.pool;
        let mut done = 0usize;
        while done < dst.len() {
            let pos = offset.saturating_add(done as u64);
            let b = pos >> BLOCK_SHIFT;
            let lo = (pos & (BLOCK_SIZE - 1)) as usize;
            let n = (BLOCK_SIZE as usize - lo).min(dst.len() - done);
            let out = &mut dst[done..done + n];
            match node.block(pool, b) {
                // SAFETY: `blk` is mapped by this file and not freed while
                // this open exists (freeing rule); `lo + n <= BLOCK_SIZE`;
                // `out` is caller memory, disjoint from the pool. A
                // concurrent writer may change the bytes as we copy (racy by
                // design, plain bytes).
                Some(blk) => unsafe {
                    ptr::copy_nonoverlapping(pool.block_ptr(blk).add(lo), out.as_mut_ptr(), n)
                },
                None => out.fill(0),
            }
            done += n;
        }
    }

    /// Pins the pool block behind file block `b` (module docs), if mapped.
    fn pin_block(&self, node: &Node, b: u64) -> Option<u32> {
        let pool = &self.pool;
        loop {
            let blk = node.block(pool, b)?;
            pool.pin(blk);
            // The re-check (SeqCst after the SeqCst increment).
            let again = node
                .top
                .get((b >> CHUNK_SHIFT) as usize)
                .map(|t| t.load(Ordering::SeqCst))
                .filter(|&t| t != 0)
                .map(|t| {
                    pool.chunk(t - 1)[(b as usize) & (CHUNK_ENTRIES - 1)].load(Ordering::SeqCst)
                });
            if again == Some(blk + 1) {
                return Some(blk);
            }
            pool.unpin(blk);
        }
    }

    /// Pinned pieces for `len` bytes at `offset` of `node` (holes from the
    /// zero block when `holes`, else None at the first hole). Neighbouring
    /// pool blocks share a piece. None if `out` is too short; nothing stays
    /// pinned then.
    fn pin_range(
        &self,
        node: &Node,
        offset: u64,
        len: u32,
        lkeys: &[u32],
        out: &mut [Piece],
        holes: bool,
    ) -> Option<usize> {
        let (&data_key, &zero_key) = (lkeys.first()?, lkeys.get(1)?);
        let pool = &self.pool;
        let end = offset.checked_add(u64::from(len))?;
        let mut n = 0usize;
        let mut pos = offset;
        let mut ok = true;
        while pos < end {
            let b = pos >> BLOCK_SHIFT;
            let lo = pos & (BLOCK_SIZE - 1);
            let take = (BLOCK_SIZE - lo).min(end - pos);
            let piece = match self.pin_block(node, b) {
                Some(blk) => Piece {
                    sge: Sge {
                        addr: pool.block_ptr(blk) as u64 + lo,
                        len: take as u32,
                        lkey: data_key,
                    },
                    pin: blk,
                },
                None if holes => Piece {
                    sge: Sge {
                        addr: pool.zero.as_ptr() as u64 + lo,
                        len: take as u32,
                        lkey: zero_key,
                    },
                    pin: NO_PIN,
                },
                None => {
                    ok = false;
                    break;
                }
            };
            pos += take;
            // Merge with the previous piece when contiguous in the pool.
            if let Some(prev) = n.checked_sub(1).map(|i| &mut out[i]) {
                if prev.pin != NO_PIN
                    && piece.pin != NO_PIN
                    && prev.sge.addr + u64::from(prev.sge.len) == piece.sge.addr
                {
                    prev.sge.len += piece.sge.len;
                    continue;
                }
            }
            if n == out.len() {
                if piece.pin != NO_PIN {
                    pool.unpin(piece.pin);
                }
                ok = false;
                break;
            }
            out[n] = piece;
            n += 1;
        }
        if !ok {
            for p in &out[..n] {
                self.unpin_piece(p);
            }
            return None;
        }
        Some(n)
    }

    /// Drops the pins of every block `p` covers.
    fn unpin_piece(&self, p: &Piece) {
        if p.pin == NO_PIN || p.sge.len == 0 {
            return;
        }
        let pool = &self.pool;
        if let (Some(first), Some(last)) = (
            pool.block_of(p.sge.addr),
            pool.block_of(p.sge.addr + u64::from(p.sge.len) - 1),
        ) {
            for b in first..=last {
                pool.unpin(b);
            }
        }
    }

    /// Sets the end of file of `node`. Called with the namespace lock held;
    /// `sole`: the caller's open is the only one, so blocks past the end
    /// can be freed at once.
    fn truncate(&self, node: &Node, size: u64, sole: bool) {
        let old = node.size.load(Ordering::Acquire);
        node.size.store(size, Ordering::Release);
        if size < old {
            let pool = &self.pool;
            let cut = (size & (BLOCK_SIZE - 1)) as usize;
            if cut != 0 {
                if let Some(blk) = node.block(pool, size >> BLOCK_SHIFT) {
                    // SAFETY: a block of this file, `cut < BLOCK_SIZE`.
                    unsafe {
                        ptr::write_bytes(pool.block_ptr(blk).add(cut), 0, BLOCK_SIZE as usize - cut)
                    };
                }
            }
            let keep = size.div_ceil(BLOCK_SIZE);
            if sole {
                self.release_past(node, keep);
            } else {
                self.zero_past(node, keep);
                node.trim_pending.store(true, Ordering::Relaxed);
            }
        }
        node.touch();
    }

    /// Frees every block of `node` from file block `keep` on, and chunks
    /// left empty. Only when no other open of the node exists.
    fn release_past(&self, node: &Node, keep: u64) {
        let pool = &self.pool;
        for (ci, slot) in node
            .top
            .iter()
            .enumerate()
            .skip((keep >> CHUNK_SHIFT) as usize)
        {
            let chunk = slot.load(Ordering::Acquire);
            if chunk == 0 {
                continue;
            }
            let table = pool.chunk(chunk - 1);
            let base = (ci as u64) << CHUNK_SHIFT;
            for (i, e) in table.iter().enumerate() {
                if base + i as u64 >= keep {
                    // SeqCst: ordered against a zero-copy pinner's re-check
                    // (module docs).
                    let blk = e.swap(0, Ordering::SeqCst);
                    if blk != 0 {
                        pool.free_block(blk - 1);
                        node.mapped.fetch_sub(1, Ordering::Relaxed);
                    }
                }
            }
            if table.iter().all(|e| e.load(Ordering::Relaxed) == 0) {
                slot.store(0, Ordering::Release);
                pool.give_chunk(chunk - 1);
            }
        }
    }

    /// Zeroes (keeps mapped) every block of `node` from file block `keep`
    /// on.
    fn zero_past(&self, node: &Node, keep: u64) {
        let pool = &self.pool;
        for (ci, slot) in node
            .top
            .iter()
            .enumerate()
            .skip((keep >> CHUNK_SHIFT) as usize)
        {
            let chunk = slot.load(Ordering::Acquire);
            if chunk == 0 {
                continue;
            }
            let base = (ci as u64) << CHUNK_SHIFT;
            for (i, e) in pool.chunk(chunk - 1).iter().enumerate() {
                let blk = e.load(Ordering::Acquire);
                if blk != 0 && base + i as u64 >= keep {
                    // SAFETY: a block of this file, zeroed whole; other
                    // opens may race on its bytes (documented).
                    unsafe { ptr::write_bytes(pool.block_ptr(blk - 1), 0, BLOCK_SIZE as usize) };
                }
            }
        }
    }

    /// Forgets one open of `node`. The last one deletes a delete-pending
    /// file (name and blocks), or releases the blocks a shared truncation
    /// left past the end of file.
    fn release_open(&self, node: &Node) {
        let mut ns = self.lock();
        if node.opens.fetch_sub(1, Ordering::Relaxed) != 1 {
            return;
        }
        if node.delete_pending.load(Ordering::Relaxed) {
            if node.id != ROOT_ID && ns.entry(node.id).children.is_empty() {
                ns.remove(node.id);
                drop(ns);
                // Unreachable now (no name, no open): every block goes.
                node.trim_pending.store(false, Ordering::Relaxed);
                self.release_past(node, 0);
                return;
            }
            node.delete_pending.store(false, Ordering::Relaxed);
        }
        if node.trim_pending.swap(false, Ordering::Relaxed) {
            let keep = node.size.load(Ordering::Acquire).div_ceil(BLOCK_SIZE);
            self.release_past(node, keep);
        }
    }
}

impl Pins for Shared {
    fn unpin(&self, piece: &Piece) {
        self.unpin_piece(piece);
    }
}

impl Pool {
    fn take_chunk(&self) -> Option<u32> {
        self.free_chunks.pop()
    }

    /// Frees an all-zero chunk.
    fn give_chunk(&self, c: u32) {
        let pushed = self.free_chunks.push(c);
        debug_assert!(pushed.is_ok(), "more chunks freed than exist");
    }
}

/// Makes [`MemStore`] handles over one shared pool.
#[derive(Debug, Clone)]
pub struct MemStoreFactory {
    shared: Arc<Shared>,
}

impl MemStoreFactory {
    /// A store of `size_bytes` (rounded down to whole [`BLOCK_SIZE`]
    /// blocks, at least one), all reserved now.
    pub fn new(size_bytes: u64) -> Result<Self, String> {
        let blocks = size_bytes / BLOCK_SIZE;
        if blocks == 0 {
            return Err(format!(
                "memory store: --store-size {size_bytes} is below one {BLOCK_SIZE}-byte block"
            ));
        }
        if blocks > MAX_BLOCKS
            || blocks
                .checked_mul(BLOCK_SIZE)
                .and_then(|b| usize::try_from(b).ok())
                .is_none()
        {
            return Err(format!(
                "memory store: --store-size {size_bytes} is too large"
            ));
        }
        let pool = Pool::new(blocks as u32)?;
        let top_len = (blocks as usize).div_ceil(CHUNK_ENTRIES);
        let now = filetime_now();
        Ok(MemStoreFactory {
            shared: Arc::new(Shared {
                pool,
                namespace: Mutex::new(Namespace::new()),
                top_len,
                serial: (now ^ (now >> 32)) as u32,
            }),
        })
    }

    /// A handle (what [`StoreFactory::handle`] boxes).
    pub fn store(&self) -> MemStore {
        MemStore {
            shared: Arc::clone(&self.shared),
            opens: OpenTable::new(),
        }
    }

    /// Bound of the store, bytes (whole blocks).
    pub fn capacity(&self) -> u64 {
        u64::from(self.shared.pool.blocks) * BLOCK_SIZE
    }

    /// Whether the pool got 2 MiB hugepages.
    pub fn hugepages(&self) -> bool {
        self.shared.pool.hugepages
    }
}

impl StoreFactory for MemStoreFactory {
    fn handle(&self, _worker: usize) -> Box<dyn Store> {
        Box::new(self.store())
    }

    fn describe(&self) -> String {
        let cap = self.capacity();
        let size = if cap % (1 << 30) == 0 {
            format!("{} GiB", cap >> 30)
        } else if cap % (1 << 20) == 0 {
            format!("{} MiB", cap >> 20)
        } else {
            format!("{} KiB", cap >> 10)
        };
        let pages = if self.hugepages() {
            "2 MiB hugepages"
        } else {
            "4 KiB pages"
        };
        format!("mem ({size}, {pages})")
    }
}

/// One worker's handle on the memory store. Every operation completes at
/// once ([`Poll::Ready`]); handles are valid only on the `MemStore` that
/// returned them.
#[derive(Debug)]
pub struct MemStore {
    shared: Arc<Shared>,
    opens: OpenTable<Arc<Node>>,
}

impl MemStore {
    /// The path of an open file, with the case of each name (as created
    /// or renamed).
    pub fn path(&self, h: Handle) -> Result<String, StoreError> {
        let node = self.opens.get(h)?;
        Ok(self.shared.lock().path_of(node.id))
    }

    fn open_now(
        &mut self,
        req: &OpenRequest<'_>,
    ) -> Result<(Handle, Action, FileInfo), StoreError> {
        if !valid_path(req.path) {
            return Err(StoreError::InvalidName);
        }
        if req.directory && (req.non_directory || !disposition_allows_directory(req.disposition)) {
            // [MS-SMB2] 3.3.5.9 / [MS-FSA] 2.1.5.1: STATUS_INVALID_PARAMETER.
            return Err(StoreError::Io(libc::EINVAL));
        }
        let shared = Arc::clone(&self.shared);
        let mut ns = shared.lock();
        let (node, action) = match ns.lookup(req.path) {
            Lookup::Found(id) => {
                let node = Arc::clone(&ns.entry(id).node);
                if node.delete_pending.load(Ordering::Relaxed) {
                    return Err(StoreError::DeletePending);
                }
                let truncating = matches!(
                    req.disposition,
                    Disposition::Supersede | Disposition::Overwrite | Disposition::OverwriteIf
                );
                if req.disposition == Disposition::Create {
                    return Err(StoreError::Exists);
                }
                if node.is_dir && (req.non_directory || truncating) {
                    return Err(StoreError::IsADirectory);
                }
                if !node.is_dir && req.directory {
                    return Err(StoreError::NotADirectory);
                }
                let sole = node.opens.load(Ordering::Relaxed) == 0;
                let action = match req.disposition {
                    Disposition::Supersede => {
                        shared.truncate(&node, 0, sole);
                        node.creation_time.store(filetime_now(), Ordering::Relaxed);
                        Action::Superseded
                    }
                    Disposition::Overwrite | Disposition::OverwriteIf => {
                        shared.truncate(&node, 0, sole);
                        Action::Overwritten
                    }
                    _ => Action::Opened,
                };
                (node, action)
            }
            Lookup::Missing(parent) => {
                if matches!(req.disposition, Disposition::Open | Disposition::Overwrite) {
                    return Err(StoreError::NotFound);
                }
                if ns.entry(parent).node.delete_pending.load(Ordering::Relaxed) {
                    return Err(StoreError::DeletePending);
                }
                let (_, name) = split(req.path);
                let node = ns.insert(parent, name, req.directory, shared.top_len);
                (node, Action::Created)
            }
            Lookup::NoParent => return Err(StoreError::PathNotFound),
        };
        let h = self.opens.insert(Arc::clone(&node))?;
        node.opens.fetch_add(1, Ordering::Relaxed);
        drop(ns);
        Ok((h, action, node.info()))
    }

    /// [MS-FSA] 2.1.5.14.11, under the namespace lock.
    fn rename_now(&mut self, h: Handle, new_path: &str, replace: bool) -> Result<(), StoreError> {
        let node = Arc::clone(self.opens.get(h)?);
        if new_path.is_empty() || !valid_path(new_path) {
            return Err(StoreError::InvalidName);
        }
        if node.id == ROOT_ID {
            return Err(StoreError::Io(libc::EACCES));
        }
        let shared = Arc::clone(&self.shared);
        let mut ns = shared.lock();
        let (parent_path, name) = split(new_path);
        let parent = match ns.lookup(parent_path) {
            Lookup::Found(id) if ns.entry(id).node.is_dir => id,
            _ => return Err(StoreError::PathNotFound),
        };
        if ns.entry(parent).node.delete_pending.load(Ordering::Relaxed) {
            return Err(StoreError::DeletePending);
        }
        if ns.is_within(parent, node.id) {
            // A directory cannot move beneath itself.
            return Err(StoreError::Io(libc::EINVAL));
        }
        let key = fold(name);
        match ns.entry(parent).children.get(&key).copied() {
            // The same file: a change of case, or no change at all.
            Some(target) if target == node.id => {}
            Some(_) if !replace => return Err(StoreError::Exists),
            Some(target) => {
                let t = Arc::clone(&ns.entry(target).node);
                if t.is_dir || t.opens.load(Ordering::Relaxed) > 0 {
                    return Err(StoreError::Io(libc::EACCES));
                }
                ns.remove(target);
                shared.release_past(&t, 0);
            }
            None => {}
        }
        let (old_parent, old_key) = {
            let e = ns.entry(node.id);
            (e.parent, fold(&e.name))
        };
        ns.entry_mut(old_parent).children.remove(&old_key);
        ns.entry_mut(parent).children.insert(key, node.id);
        let e = ns.entry_mut(node.id);
        e.name = name.to_owned();
        e.parent = parent;
        node.change_time.store(filetime_now(), Ordering::Relaxed);
        Ok(())
    }

    fn list_now(&self, h: Handle) -> Result<Vec<DirEntry>, StoreError> {
        let node = self.opens.get(h)?;
        if !node.is_dir {
            return Err(StoreError::NotADirectory);
        }
        let ns = self.shared.lock();
        let mut out: Vec<DirEntry> = ns
            .entry(node.id)
            .children
            .values()
            .map(|&id| {
                let e = ns.entry(id);
                DirEntry {
                    name: e.name.clone(),
                    info: e.node.info(),
                }
            })
            .collect();
        drop(ns);
        out.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn set_info_now(
        &self,
        h: Handle,
        times: SetTimes,
        attrs: Option<u32>,
    ) -> Result<(), StoreError> {
        let node = self.opens.get(h)?;
        for (t, field) in [
            (times.creation, &node.creation_time),
            (times.last_access, &node.last_access_time),
            (times.last_write, &node.last_write_time),
            (times.change, &node.change_time),
        ] {
            if let Some(v) = SetTimes::effective(t) {
                field.store(v, Ordering::Relaxed);
            }
        }
        // [MS-FSA] 2.1.5.14.2: FileAttributes 0 leaves them unchanged.
        if let Some(a) = attrs.filter(|&a| a != 0) {
            let mut keep = a & attributes::SETTABLE;
            if node.is_dir {
                keep &= !attributes::TEMPORARY;
            }
            node.attributes.store(keep, Ordering::Relaxed);
            if SetTimes::effective(times.change).is_none() {
                node.change_time.store(filetime_now(), Ordering::Relaxed);
            }
        }
        Ok(())
    }
}

impl Store for MemStore {
    /// [MS-SMB2] 3.3.5.9 with the dispositions of 2.2.13 (see the module
    /// docs for names and directories).
    fn open(&mut self, _tag: Tag, req: &OpenRequest<'_>) -> Poll<(Handle, Action, FileInfo)> {
        Poll::Ready(self.open_now(req))
    }

    fn stat(&mut self, _tag: Tag, h: Handle) -> Poll<FileInfo> {
        Poll::Ready(self.opens.get(h).map(|n| n.info()))
    }

    fn read(&mut self, _tag: Tag, h: Handle, offset: u64, len: u32) -> Poll<u32> {
        Poll::Ready(self.opens.get(h).and_then(|n| {
            if n.is_dir {
                return Err(StoreError::IsADirectory);
            }
            let avail = n.size.load(Ordering::Acquire).saturating_sub(offset);
            Ok(avail.min(u64::from(len)) as u32)
        }))
    }

    fn copy_out(&mut self, _tag: Tag, h: Handle, offset: u64, dst: &mut [u8]) {
        if let Ok(n) = self.opens.get(h) {
            self.shared.copy_out(n, offset, dst);
        }
    }

    fn write(&mut self, _tag: Tag, h: Handle, offset: u64, data: &[u8]) -> Poll<u32> {
        Poll::Ready(
            self.opens
                .get(h)
                .and_then(|n| self.shared.write(n, offset, data)),
        )
    }

    fn truncate(&mut self, _tag: Tag, h: Handle, size: u64) -> Poll<()> {
        let node = match self.opens.get(h) {
            Ok(n) => Arc::clone(n),
            Err(e) => return Poll::Ready(Err(e)),
        };
        if node.is_dir {
            return Poll::Ready(Err(StoreError::IsADirectory));
        }
        let _ns = self.shared.lock();
        let sole = node.opens.load(Ordering::Relaxed) == 1;
        self.shared.truncate(&node, size, sole);
        Poll::Ready(Ok(()))
    }

    fn flush(&mut self, _tag: Tag, h: Handle) -> Poll<()> {
        Poll::Ready(self.opens.get(h).map(|_| ()))
    }

    fn close(&mut self, h: Handle) {
        if let Ok(node) = self.opens.remove(h) {
            self.shared.release_open(&node);
        }
    }

    fn poll(&mut self, _done: &mut dyn FnMut(Tag)) {}

    fn cancel(&mut self, _tag: Tag) {}

    fn in_flight(&self) -> usize {
        0
    }

    fn usage(&self) -> (u64, Option<u64>) {
        let pool = &self.shared.pool;
        (
            pool.used_blocks() * BLOCK_SIZE,
            Some(u64::from(pool.blocks) * BLOCK_SIZE),
        )
    }

    /// A snapshot under the namespace lock.
    fn list(&mut self, _tag: Tag, h: Handle) -> Poll<Vec<DirEntry>> {
        Poll::Ready(self.list_now(h))
    }

    /// Case-insensitive, like every name here; a change of case alone is
    /// a rename too.
    fn rename(&mut self, _tag: Tag, h: Handle, new_path: &str, replace: bool) -> Poll<()> {
        Poll::Ready(self.rename_now(h, new_path, replace))
    }

    /// Marks the file itself, for every worker (see the module docs).
    fn set_delete_on_close(&mut self, h: Handle, on: bool) -> Result<(), StoreError> {
        let node = self.opens.get(h)?;
        if node.id == ROOT_ID {
            return Err(StoreError::Io(libc::EACCES));
        }
        let ns = self.shared.lock();
        if on && node.is_dir && !ns.entry(node.id).children.is_empty() {
            return Err(StoreError::NotEmpty);
        }
        node.delete_pending.store(on, Ordering::Relaxed);
        Ok(())
    }

    /// Every time is kept; attributes are kept as given (see the module
    /// docs).
    fn set_info(
        &mut self,
        _tag: Tag,
        h: Handle,
        times: SetTimes,
        attributes: Option<u32>,
    ) -> Poll<()> {
        Poll::Ready(self.set_info_now(h, times, attributes))
    }

    /// The pool: its bound and the blocks not in use; one 64 KiB block is
    /// the allocation unit (128 sectors of 512 bytes).
    fn fs_info(&self) -> FsInfo {
        let pool = &self.shared.pool;
        FsInfo {
            total_bytes: u64::from(pool.blocks) * BLOCK_SIZE,
            free_bytes: pool.available.load(Ordering::Relaxed) * BLOCK_SIZE,
            block_size: BLOCK_SIZE as u32,
            sector_size: 512,
            serial: self.shared.serial,
            label: "mem".to_owned(),
        }
    }

    /// The data region and the zero block (module docs, Zero-copy RDMA).
    fn zero_copy(&self) -> Option<ZeroCopy> {
        let pool = &self.shared.pool;
        Some(ZeroCopy {
            regions: vec![
                (
                    pool.data.as_ptr() as usize,
                    pool.blocks as usize * BLOCK_SIZE as usize,
                ),
                (pool.zero.as_ptr() as usize, BLOCK_SIZE as usize),
            ],
            pins: Arc::clone(&self.shared) as Arc<dyn Pins>,
        })
    }

    /// Holes are pieces of the zero block. (A READ keeps no state here:
    /// there is no tag to forget.)
    fn pin_read(
        &mut self,
        _tag: Tag,
        h: Handle,
        offset: u64,
        len: u32,
        lkeys: &[u32],
        out: &mut [Piece],
    ) -> Option<usize> {
        let node = self.opens.get(h).ok()?;
        if node.is_dir || len == 0 {
            return None;
        }
        self.shared.pin_range(node, offset, len, lkeys, out, true)
    }

    /// Only inside the end of file and over mapped blocks (module docs).
    fn pin_write(
        &mut self,
        _tag: Tag,
        h: Handle,
        offset: u64,
        len: u32,
        lkeys: &[u32],
        out: &mut [Piece],
    ) -> Option<usize> {
        let node = self.opens.get(h).ok()?;
        let end = offset.checked_add(u64::from(len))?;
        if node.is_dir || len == 0 || end > node.size.load(Ordering::Acquire) {
            return None;
        }
        self.shared.pin_range(node, offset, len, lkeys, out, false)
    }

    fn write_pinned(&mut self, _tag: Tag, h: Handle, offset: u64, len: u32) -> Poll<u32> {
        let node = match self.opens.get(h) {
            Ok(n) => n,
            Err(e) => return Poll::Ready(Err(e)),
        };
        let Some(end) = offset.checked_add(u64::from(len)) else {
            return Poll::Ready(Err(StoreError::Io(libc::EINVAL)));
        };
        // Inside the end of file when pinned; a truncation since then is
        // undone the way a copied write after it would be.
        node.size.fetch_max(end, Ordering::AcqRel);
        node.touch();
        Poll::Ready(Ok(len))
    }
}

impl Drop for MemStore {
    fn drop(&mut self) {
        for node in self.opens.drain() {
            self.shared.release_open(&node);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn ready<T>(p: Poll<T>) -> Result<T, StoreError> {
        match p {
            Poll::Ready(r) => r,
            Poll::Pending => panic!("the memory store never returns Pending"),
        }
    }

    fn req(path: &str, disposition: Disposition) -> OpenRequest<'_> {
        OpenRequest {
            path,
            disposition,
            directory: false,
            non_directory: false,
        }
    }

    fn dir_req(path: &str, disposition: Disposition) -> OpenRequest<'_> {
        OpenRequest {
            directory: true,
            ..req(path, disposition)
        }
    }

    fn open(s: &mut MemStore, path: &str, d: Disposition) -> Result<(Handle, Action), StoreError> {
        ready(s.open(0, &req(path, d))).map(|(h, a, _)| (h, a))
    }

    fn write(s: &mut MemStore, h: Handle, offset: u64, data: &[u8]) -> Result<u32, StoreError> {
        ready(s.write(1, h, offset, data))
    }

    fn read(s: &mut MemStore, h: Handle, offset: u64, len: u32) -> Vec<u8> {
        let n = ready(s.read(2, h, offset, len)).unwrap();
        let mut v = vec![0xAA; n as usize];
        s.copy_out(2, h, offset, &mut v);
        v
    }

    fn size(s: &mut MemStore, h: Handle) -> u64 {
        ready(s.stat(3, h)).unwrap().size
    }

    fn store(bytes: u64) -> MemStore {
        MemStoreFactory::new(bytes).unwrap().store()
    }

    #[test]
    fn every_disposition_on_missing_and_existing_files() {
        use Disposition::*;
        let mut s = store(4 * MIB);
        // Missing file.
        assert_eq!(open(&mut s, "a", Open), Err(StoreError::NotFound));
        assert_eq!(open(&mut s, "a", Overwrite), Err(StoreError::NotFound));
        for (i, d) in [Supersede, Create, OpenIf, OverwriteIf]
            .into_iter()
            .enumerate()
        {
            let name = format!("new{i}");
            let (h, a) = open(&mut s, &name, d).unwrap();
            assert_eq!(a, Action::Created, "{d:?}");
            s.close(h);
        }
        // Existing file with data: each disposition's action and effect.
        let (h, _) = open(&mut s, "f", Create).unwrap();
        write(&mut s, h, 0, b"hello").unwrap();
        s.close(h);
        assert_eq!(open(&mut s, "f", Create), Err(StoreError::Exists));
        for (d, action, len) in [
            (Open, Action::Opened, 5),
            (OpenIf, Action::Opened, 5),
            (Overwrite, Action::Overwritten, 0),
            (OverwriteIf, Action::Overwritten, 0),
            (Supersede, Action::Superseded, 0),
        ] {
            let (h, a) = open(&mut s, "f", d).unwrap();
            assert_eq!((a, size(&mut s, h)), (action, len), "{d:?}");
            write(&mut s, h, 0, b"hello").unwrap();
            s.close(h);
        }
    }

    #[test]
    fn round_trip_across_block_boundaries_and_holes() {
        let mut s = store(16 * MIB);
        let (h, _) = open(&mut s, "data.bin", Disposition::Create).unwrap();
        let data: Vec<u8> = (0..3 * BLOCK_SIZE as usize + 1234)
            .map(|i| (i * 7 + 3) as u8)
            .collect();
        let at = BLOCK_SIZE - 100;
        assert_eq!(write(&mut s, h, at, &data), Ok(data.len() as u32));
        assert_eq!(read(&mut s, h, at, data.len() as u32), data);
        // The hole before the data reads as zeros.
        assert_eq!(read(&mut s, h, 0, at as u32), vec![0; at as usize]);
        // A write far past the end leaves a hole of zeros in between.
        let far = 10 * BLOCK_SIZE + 5;
        write(&mut s, h, far, b"tail").unwrap();
        assert_eq!(size(&mut s, h), far + 4);
        let end_of_data = at + data.len() as u64;
        let gap = read(&mut s, h, end_of_data, (far - end_of_data) as u32);
        assert!(gap.iter().all(|&b| b == 0));
        assert_eq!(read(&mut s, h, far, 100), b"tail");
        // Only blocks written are allocated: blocks 0..=4 for the data
        // (it ends 1134 bytes into block 4), block 10 for the tail.
        assert_eq!(s.usage().0, 6 * BLOCK_SIZE);
        assert_eq!(ready(s.stat(0, h)).unwrap().allocation, 6 * BLOCK_SIZE);
    }

    #[test]
    fn reads_stop_at_end_of_file_and_writes_grow_it() {
        let mut s = store(4 * MIB);
        let (h, _) = open(&mut s, "x", Disposition::OpenIf).unwrap();
        assert_eq!(ready(s.read(0, h, 0, 10)), Ok(0));
        write(&mut s, h, 0, &[1; 10]).unwrap();
        assert_eq!(size(&mut s, h), 10);
        write(&mut s, h, 5, &[2; 10]).unwrap();
        assert_eq!(size(&mut s, h), 15);
        write(&mut s, h, 0, &[3; 2]).unwrap();
        assert_eq!(
            size(&mut s, h),
            15,
            "a write inside the file keeps its size"
        );
        assert_eq!(ready(s.read(0, h, 12, 100)), Ok(3));
        assert_eq!(ready(s.read(0, h, 15, 100)), Ok(0));
        assert_eq!(ready(s.read(0, h, 1 << 40, 100)), Ok(0));
        assert_eq!(
            read(&mut s, h, 0, 15),
            [3, 3, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2]
        );
    }

    #[test]
    fn the_bound_is_exact_and_a_refused_write_changes_nothing() {
        let mut s = store(4 * BLOCK_SIZE + 1000); // rounds down to 4 blocks
        assert_eq!(s.usage(), (0, Some(4 * BLOCK_SIZE)));
        let (a, _) = open(&mut s, "a", Disposition::Create).unwrap();
        let (b, _) = open(&mut s, "b", Disposition::Create).unwrap();
        write(&mut s, a, 0, &vec![1; 3 * BLOCK_SIZE as usize]).unwrap();
        // Two blocks needed, one left: refused, nothing written.
        let two = vec![2; BLOCK_SIZE as usize + 1];
        assert_eq!(write(&mut s, b, 0, &two), Err(StoreError::Full));
        assert_eq!(size(&mut s, b), 0);
        assert_eq!(s.usage(), (3 * BLOCK_SIZE, Some(4 * BLOCK_SIZE)));
        // Exactly the last block fits.
        write(&mut s, b, 0, &two[..BLOCK_SIZE as usize]).unwrap();
        assert_eq!(s.usage(), (4 * BLOCK_SIZE, Some(4 * BLOCK_SIZE)));
        assert_eq!(write(&mut s, b, BLOCK_SIZE, &[9]), Err(StoreError::Full));
        // Rewriting mapped blocks needs no space.
        write(&mut s, a, 10, &[7; 100]).unwrap();
        // A write past the largest file offset is refused too.
        assert_eq!(
            write(&mut s, a, u64::MAX - 1, &[1, 2]),
            Err(StoreError::Full)
        );
    }

    #[test]
    fn truncate_frees_blocks_at_once_only_for_the_sole_opener() {
        let mut s = store(4 * MIB);
        let (h, _) = open(&mut s, "t", Disposition::Create).unwrap();
        write(&mut s, h, 0, &vec![5; 3 * BLOCK_SIZE as usize]).unwrap();
        assert_eq!(s.usage().0, 3 * BLOCK_SIZE);
        // Sole opener: freed at once; the cut block's tail reads as zeros
        // when the file grows again.
        ready(s.truncate(0, h, 100)).unwrap();
        assert_eq!(s.usage().0, BLOCK_SIZE);
        ready(s.truncate(0, h, 200)).unwrap();
        let back = read(&mut s, h, 0, 200);
        assert_eq!(&back[..100], &[5; 100][..]);
        assert_eq!(&back[100..], &[0; 100][..]);
        write(&mut s, h, 0, &vec![6; 3 * BLOCK_SIZE as usize]).unwrap();
        // Another open (another worker): zeroed, kept until the last close.
        let mut other = MemStoreFactory {
            shared: Arc::clone(&s.shared),
        }
        .store();
        let (h2, _) = open(&mut other, "T", Disposition::Open).unwrap();
        ready(s.truncate(0, h, 10)).unwrap();
        assert_eq!(s.usage().0, 3 * BLOCK_SIZE);
        ready(other.truncate(0, h2, 3 * BLOCK_SIZE)).unwrap();
        assert_eq!(read(&mut other, h2, 10, 100), vec![0; 100]);
        ready(other.truncate(0, h2, 10)).unwrap();
        s.close(h);
        assert_eq!(other.usage().0, 3 * BLOCK_SIZE, "still open elsewhere");
        other.close(h2);
        assert_eq!(other.usage().0, BLOCK_SIZE, "the last close frees them");
        // Overwrite by the only opener frees everything.
        let (h3, a) = open(&mut other, "t", Disposition::Overwrite).unwrap();
        assert_eq!(a, Action::Overwritten);
        assert_eq!(other.usage().0, 0);
        other.close(h3);
    }

    #[test]
    fn stale_and_foreign_handles_are_closed() {
        let mut s = store(MIB);
        let (h, _) = open(&mut s, "f", Disposition::Create).unwrap();
        s.close(h);
        assert_eq!(ready(s.stat(0, h)), Err(StoreError::Closed));
        assert_eq!(write(&mut s, h, 0, b"x"), Err(StoreError::Closed));
        assert_eq!(ready(s.read(0, h, 0, 1)), Err(StoreError::Closed));
        assert_eq!(ready(s.truncate(0, h, 0)), Err(StoreError::Closed));
        assert_eq!(ready(s.flush(0, h)), Err(StoreError::Closed));
        s.close(h); // a second close is ignored
        let (h2, _) = open(&mut s, "f", Disposition::Open).unwrap();
        assert_ne!(h, h2);
        assert_eq!(ready(s.stat(0, h)), Err(StoreError::Closed));
        assert_eq!(ready(s.flush(0, h2)), Ok(()));
        assert_eq!((s.in_flight(), s.usage().0), (0, 0));
    }

    #[test]
    fn two_workers_write_different_files_concurrently() {
        let f = MemStoreFactory::new(64 * MIB).unwrap();
        let threads: Vec<_> = (0..2u8)
            .map(|t| {
                let mut s = f.store();
                std::thread::spawn(move || {
                    let name = format!("file{t}");
                    let (h, _) = open(&mut s, &name, Disposition::Create).unwrap();
                    let chunk: Vec<u8> = (0..100_000u32).map(|i| (i as u8) ^ t).collect();
                    for i in 0..100u64 {
                        // Interleaved offsets so both files grow block by block.
                        write(&mut s, h, i * chunk.len() as u64, &chunk).unwrap();
                    }
                    for i in 0..100u64 {
                        let off = i * chunk.len() as u64;
                        assert_eq!(read(&mut s, h, off, chunk.len() as u32), chunk);
                    }
                    s.close(h);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let mut s = f.store();
        for t in 0..2u8 {
            let (h, _) = open(&mut s, &format!("FILE{t}"), Disposition::Open).unwrap();
            assert_eq!(size(&mut s, h), 10_000_000);
            assert_eq!(read(&mut s, h, 100_001, 3), [1 ^ t, 2 ^ t, 3 ^ t]);
        }
        assert_eq!(
            s.usage().0,
            2 * 10_000_000u64.div_ceil(BLOCK_SIZE) * BLOCK_SIZE
        );
    }

    #[test]
    fn racing_writers_filling_the_same_holes_map_each_block_once() {
        let f = MemStoreFactory::new(64 * MIB).unwrap();
        let mut s = f.store();
        let (h, _) = open(&mut s, "shared", Disposition::Create).unwrap();
        let threads: Vec<_> = (0..2u8)
            .map(|t| {
                let mut s = f.store();
                std::thread::spawn(move || {
                    let (h, _) = open(&mut s, "shared", Disposition::Open).unwrap();
                    let data = vec![t + 1; BLOCK_SIZE as usize / 2];
                    // Both threads fill the same holes, half a block each.
                    for b in 0..200u64 {
                        let off = b * BLOCK_SIZE + u64::from(t) * BLOCK_SIZE / 2;
                        write(&mut s, h, off, &data).unwrap();
                    }
                    s.close(h);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(
            s.usage().0,
            200 * BLOCK_SIZE,
            "each block mapped exactly once"
        );
        assert_eq!(ready(s.stat(0, h)).unwrap().allocation, 200 * BLOCK_SIZE);
        let half = BLOCK_SIZE as u32 / 2;
        for b in [0u64, 99, 199] {
            assert_eq!(
                read(&mut s, h, b * BLOCK_SIZE, half),
                vec![1; half as usize]
            );
            let second = b * BLOCK_SIZE + u64::from(half);
            assert_eq!(read(&mut s, h, second, half), vec![2; half as usize]);
        }
    }

    #[test]
    fn names_compare_case_insensitively_and_keep_their_case() {
        let mut s = store(MIB);
        assert_eq!(
            open(&mut s, "Dir\\ReadMe.TXT", Disposition::Create),
            Err(StoreError::PathNotFound)
        );
        ready(s.open(0, &dir_req("Dir", Disposition::Create))).unwrap();
        let (h, a) = open(&mut s, "dir\\ReadMe.TXT", Disposition::Create).unwrap();
        assert_eq!(a, Action::Created);
        assert_eq!(s.path(h).as_deref(), Ok("Dir\\ReadMe.TXT"));
        write(&mut s, h, 0, b"abc").unwrap();
        assert_eq!(
            open(&mut s, "dIR\\readme.txt", Disposition::Create),
            Err(StoreError::Exists)
        );
        let (h2, _) = open(&mut s, "DIR\\README.TXT", Disposition::Open).unwrap();
        assert_eq!(read(&mut s, h2, 0, 3), b"abc");
        assert_eq!(s.path(h2).as_deref(), Ok("Dir\\ReadMe.TXT"));
        // Unicode folding too.
        open(&mut s, "Ärger", Disposition::Create).unwrap();
        assert!(open(&mut s, "äRGER", Disposition::Open).is_ok());
    }

    #[test]
    fn directories_and_missing_parents() {
        use Disposition::*;
        let mut s = store(MIB);
        // The root is a directory.
        let (root, a, info) = ready(s.open(0, &dir_req("", Open))).unwrap();
        assert!(info.is_dir && a == Action::Opened);
        assert_eq!(ready(s.read(0, root, 0, 1)), Err(StoreError::IsADirectory));
        assert_eq!(open(&mut s, "", Create), Err(StoreError::Exists));
        // Missing parents.
        assert_eq!(open(&mut s, "d\\f", Create), Err(StoreError::PathNotFound));
        assert_eq!(open(&mut s, "d\\f", Open), Err(StoreError::PathNotFound));
        assert_eq!(
            ready(s.open(0, &dir_req("d\\e", OpenIf))).err(),
            Some(StoreError::PathNotFound)
        );
        // Create directories with Create and OpenIf.
        let (_, a, info) = ready(s.open(0, &dir_req("d", Create))).unwrap();
        assert!(info.is_dir && a == Action::Created);
        let (_, a, _) = ready(s.open(0, &dir_req("d\\e", OpenIf))).unwrap();
        assert_eq!(a, Action::Created);
        let (_, a, _) = ready(s.open(0, &dir_req("D\\E", OpenIf))).unwrap();
        assert_eq!(a, Action::Opened);
        let (f, _) = open(&mut s, "d\\e\\f", Create).unwrap();
        assert_eq!(write(&mut s, f, 0, b"x"), Ok(1));
        // A file is not a directory, a directory is not a file.
        assert_eq!(
            ready(s.open(0, &dir_req("d\\e\\f", Open))).err(),
            Some(StoreError::NotADirectory)
        );
        let nondir = OpenRequest {
            non_directory: true,
            ..req("d", Open)
        };
        assert_eq!(
            ready(s.open(0, &nondir)).err(),
            Some(StoreError::IsADirectory)
        );
        assert_eq!(open(&mut s, "d", Overwrite), Err(StoreError::IsADirectory));
        assert_eq!(
            open(&mut s, "d\\e\\f\\g", Create),
            Err(StoreError::PathNotFound)
        );
        // A directory cannot be superseded or overwritten ([MS-FSA] 2.1.5.1).
        assert_eq!(
            ready(s.open(0, &dir_req("z", OverwriteIf))).err(),
            Some(StoreError::Io(libc::EINVAL))
        );
        let (d, _) = open(&mut s, "d", Open).unwrap();
        assert_eq!(write(&mut s, d, 0, b"x"), Err(StoreError::IsADirectory));
        assert_eq!(ready(s.truncate(0, d, 0)), Err(StoreError::IsADirectory));
    }

    #[test]
    fn invalid_paths_are_refused() {
        let mut s = store(MIB);
        for p in ["..", "a\\..\\b", "\\a", "a:stream", "a/b", "a\\\\b"] {
            assert_eq!(
                open(&mut s, p, Disposition::OpenIf),
                Err(StoreError::InvalidName),
                "{p}"
            );
        }
    }

    fn other_worker(s: &MemStore) -> MemStore {
        MemStoreFactory {
            shared: Arc::clone(&s.shared),
        }
        .store()
    }

    fn mkdir(s: &mut MemStore, path: &str) -> Handle {
        ready(s.open(0, &dir_req(path, Disposition::Create)))
            .unwrap()
            .0
    }

    fn rename(s: &mut MemStore, h: Handle, to: &str, replace: bool) -> Result<(), StoreError> {
        ready(s.rename(4, h, to, replace))
    }

    fn names(s: &mut MemStore, dir: Handle) -> Vec<String> {
        ready(s.list(5, dir))
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect()
    }

    #[test]
    fn rename_refuses_an_existing_target_unless_replacing() {
        let mut s = store(4 * MIB);
        let (a, _) = open(&mut s, "a", Disposition::Create).unwrap();
        write(&mut s, a, 0, b"from a").unwrap();
        let (b, _) = open(&mut s, "b", Disposition::Create).unwrap();
        write(&mut s, b, 0, &vec![1; 2 * BLOCK_SIZE as usize]).unwrap();
        assert_eq!(rename(&mut s, a, "B", false), Err(StoreError::Exists));
        // An open target is never replaced ([MS-FSA] 2.1.5.14.11).
        assert_eq!(
            rename(&mut s, a, "B", true),
            Err(StoreError::Io(libc::EACCES))
        );
        s.close(b);
        let id = ready(s.stat(0, a)).unwrap().file_id;
        assert_eq!(rename(&mut s, a, "B", true), Ok(()));
        // The handle follows the file; the replaced file's blocks are free.
        assert_eq!(s.path(a).as_deref(), Ok("B"));
        assert_eq!(ready(s.stat(0, a)).unwrap().file_id, id);
        assert_eq!(s.usage().0, BLOCK_SIZE);
        write(&mut s, a, 6, b"!").unwrap();
        assert_eq!(
            open(&mut s, "a", Disposition::Open),
            Err(StoreError::NotFound)
        );
        let (b2, _) = open(&mut s, "b", Disposition::Open).unwrap();
        assert_eq!(read(&mut s, b2, 0, 100), b"from a!");
        // A change of case alone, and a rename onto its own name.
        assert_eq!(rename(&mut s, b2, "b", false), Ok(()));
        assert_eq!(s.path(a).as_deref(), Ok("b"));
        assert_eq!(rename(&mut s, b2, "b", false), Ok(()));
        // Not the root, not an invalid name.
        let (root, ..) = ready(s.open(0, &dir_req("", Disposition::Open))).unwrap();
        assert_eq!(
            rename(&mut s, root, "r", false),
            Err(StoreError::Io(libc::EACCES))
        );
        for bad in ["", "..\\x", "x\\..\\y", "a:s", "\\x"] {
            assert_eq!(
                rename(&mut s, a, bad, true),
                Err(StoreError::InvalidName),
                "{bad}"
            );
        }
    }

    #[test]
    fn rename_moves_files_and_directories_across_directories() {
        let mut s = store(4 * MIB);
        let d1 = mkdir(&mut s, "D1");
        let d2 = mkdir(&mut s, "d2");
        let (f, _) = open(&mut s, "d1\\f", Disposition::Create).unwrap();
        write(&mut s, f, 0, b"x").unwrap();
        assert_eq!(
            rename(&mut s, f, "missing\\f", false),
            Err(StoreError::PathNotFound)
        );
        assert_eq!(
            rename(&mut s, f, "d1\\f\\g", false),
            Err(StoreError::PathNotFound),
            "a file is no parent"
        );
        assert_eq!(rename(&mut s, f, "D2\\File", false), Ok(()));
        assert_eq!(s.path(f).as_deref(), Ok("d2\\File"));
        assert_eq!(names(&mut s, d1), Vec::<String>::new());
        assert_eq!(names(&mut s, d2), ["File"]);
        // A directory takes its subtree (and the open file in it) along.
        assert_eq!(rename(&mut s, d2, "d1\\Sub", false), Ok(()));
        assert_eq!(s.path(f).as_deref(), Ok("D1\\Sub\\File"));
        let (f2, _) = open(&mut s, "d1\\sub\\file", Disposition::Open).unwrap();
        assert_eq!(read(&mut s, f2, 0, 10), b"x");
        assert_eq!(
            open(&mut s, "d2\\file", Disposition::Open),
            Err(StoreError::PathNotFound)
        );
        // Never beneath itself; a directory target is never replaced.
        assert_eq!(
            rename(&mut s, d1, "d1\\Sub\\x", false),
            Err(StoreError::Io(libc::EINVAL))
        );
        let x = mkdir(&mut s, "x");
        assert_eq!(
            rename(&mut s, f, "x", true),
            Err(StoreError::Io(libc::EACCES))
        );
        s.close(x);
        // Another worker sees the new names at once.
        let mut other = other_worker(&s);
        assert!(open(&mut other, "D1\\SUB\\FILE", Disposition::Open).is_ok());
    }

    #[test]
    fn listing_a_thousand_files_is_sorted_and_complete() {
        let mut s = store(4 * MIB);
        let d = mkdir(&mut s, "many");
        for i in 0..1000u32 {
            // Created out of order.
            let name = format!("many\\f{:04}", (i * 7919) % 1000);
            let (h, _) = open(&mut s, &name, Disposition::Create).unwrap();
            s.close(h);
        }
        mkdir(&mut s, "many\\Sub");
        let list = ready(s.list(0, d)).unwrap();
        assert_eq!(list.len(), 1001);
        assert!(list.windows(2).all(|w| w[0].name < w[1].name), "sorted");
        assert_eq!(list[0].name, "Sub");
        assert!(list[0].info.is_dir);
        assert_eq!(list[0].info.attributes, attributes::DIRECTORY);
        assert_eq!(
            (list[1].name.as_str(), list[1000].name.as_str()),
            ("f0000", "f0999")
        );
        assert_eq!(list[1].info.attributes, attributes::ARCHIVE);
        let mut ids: Vec<u64> = list.iter().map(|e| e.info.file_id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 1001, "file ids are unique");
        let (f, _) = open(&mut s, "many\\f0001", Disposition::Open).unwrap();
        assert_eq!(ready(s.list(0, f)), Err(StoreError::NotADirectory));
        let (root, ..) = ready(s.open(0, &dir_req("", Disposition::Open))).unwrap();
        assert_eq!(names(&mut s, root), ["many"]);
    }

    #[test]
    fn delete_on_close_waits_for_the_last_handle_on_any_worker() {
        let mut s = store(4 * MIB);
        let mut other = other_worker(&s);
        let (h1, _) = open(&mut s, "doomed", Disposition::Create).unwrap();
        write(&mut s, h1, 0, &[3; 1000]).unwrap();
        let (h2, _) = open(&mut other, "DOOMED", Disposition::Open).unwrap();
        assert_eq!(s.set_delete_on_close(h1, true), Ok(()));
        assert_eq!(
            open(&mut s, "doomed", Disposition::OpenIf),
            Err(StoreError::DeletePending)
        );
        assert_eq!(
            open(&mut other, "doomed", Disposition::Create),
            Err(StoreError::DeletePending)
        );
        s.close(h1);
        // Still there for the other open, and listed as delete pending.
        assert!(ready(other.stat(0, h2)).unwrap().delete_pending);
        assert_eq!(read(&mut other, h2, 0, 3), [3, 3, 3]);
        let (root, ..) = ready(s.open(0, &dir_req("", Disposition::Open))).unwrap();
        let list = ready(s.list(0, root)).unwrap();
        assert!(list.len() == 1 && list[0].info.delete_pending);
        assert_eq!(s.usage().0, BLOCK_SIZE);
        other.close(h2);
        assert_eq!(names(&mut s, root), Vec::<String>::new());
        assert_eq!(s.usage().0, 0, "its blocks are free");
        let (h3, a) = open(&mut s, "doomed", Disposition::OpenIf).unwrap();
        assert_eq!(a, Action::Created, "the name is free again");
        // Unmarking before the last close keeps the file.
        s.set_delete_on_close(h3, true).unwrap();
        s.set_delete_on_close(h3, false).unwrap();
        s.close(h3);
        assert_eq!(names(&mut s, root), ["doomed"]);
        assert_eq!(
            s.set_delete_on_close(root, true),
            Err(StoreError::Io(libc::EACCES))
        );
    }

    #[test]
    fn delete_on_close_of_empty_and_non_empty_directories() {
        let mut s = store(MIB);
        let full = mkdir(&mut s, "full");
        let (f, _) = open(&mut s, "full\\f", Disposition::Create).unwrap();
        assert_eq!(s.set_delete_on_close(full, true), Err(StoreError::NotEmpty));
        assert_eq!(
            StoreError::NotEmpty.status(),
            smbdirect_protocol::ntstatus::STATUS_DIRECTORY_NOT_EMPTY
        );
        // Emptied, it can go; nothing can be created in it meanwhile.
        s.set_delete_on_close(f, true).unwrap();
        s.close(f);
        assert_eq!(s.set_delete_on_close(full, true), Ok(()));
        assert_eq!(
            open(&mut s, "full\\g", Disposition::Create),
            Err(StoreError::DeletePending)
        );
        let (g, _) = open(&mut s, "g", Disposition::Create).unwrap();
        assert_eq!(
            rename(&mut s, g, "full\\g", false),
            Err(StoreError::DeletePending)
        );
        s.close(full);
        assert_eq!(
            ready(s.open(0, &dir_req("full", Disposition::Open))).err(),
            Some(StoreError::NotFound)
        );
        let empty = mkdir(&mut s, "empty");
        s.set_delete_on_close(empty, true).unwrap();
        s.close(empty);
        let (root, ..) = ready(s.open(0, &dir_req("", Disposition::Open))).unwrap();
        assert_eq!(names(&mut s, root), ["g"]);
    }

    #[test]
    fn set_info_times_and_attributes_show_in_stat() {
        let mut s = store(MIB);
        let (h, _) = open(&mut s, "t", Disposition::Create).unwrap();
        let before = ready(s.stat(0, h)).unwrap();
        let times = SetTimes {
            creation: Some(FILETIME_2001),
            last_access: Some(FILETIME_2001 + 1),
            last_write: Some(FILETIME_2001 + 2),
            change: Some(FILETIME_2001 + 3),
        };
        ready(s.set_info(0, h, times, None)).unwrap();
        let after = ready(s.stat(0, h)).unwrap();
        assert_eq!(
            (
                after.creation_time,
                after.last_access_time,
                after.last_write_time,
                after.change_time
            ),
            (
                FILETIME_2001,
                FILETIME_2001 + 1,
                FILETIME_2001 + 2,
                FILETIME_2001 + 3
            )
        );
        assert_eq!(after.attributes, before.attributes);
        // 0, -1 and None leave times alone.
        let keep = SetTimes {
            creation: Some(0),
            last_access: Some(u64::MAX),
            last_write: None,
            change: None,
        };
        ready(s.set_info(0, h, keep, Some(0))).unwrap();
        assert_eq!(ready(s.stat(0, h)).unwrap(), after);
        let hidden_ro = attributes::HIDDEN | attributes::READONLY;
        ready(s.set_info(
            0,
            h,
            SetTimes::default(),
            Some(hidden_ro | attributes::DIRECTORY),
        ))
        .unwrap();
        assert_eq!(ready(s.stat(0, h)).unwrap().attributes, hidden_ro);
        ready(s.set_info(0, h, SetTimes::default(), Some(attributes::NORMAL))).unwrap();
        assert_eq!(ready(s.stat(0, h)).unwrap().attributes, attributes::NORMAL);
        let d = mkdir(&mut s, "d");
        ready(s.set_info(0, d, SetTimes::default(), Some(attributes::HIDDEN))).unwrap();
        assert_eq!(
            ready(s.stat(0, d)).unwrap().attributes,
            attributes::HIDDEN | attributes::DIRECTORY
        );
        s.close(h);
        assert_eq!(
            ready(s.set_info(0, h, times, None)),
            Err(StoreError::Closed)
        );
    }

    /// 2001-01-01 as FILETIME.
    const FILETIME_2001: u64 = 126_227_808_000_000_000;

    #[test]
    fn fs_info_reports_the_pool() {
        let mut s = store(4 * MIB);
        let fs = s.fs_info();
        assert_eq!((fs.total_bytes, fs.free_bytes), (4 * MIB, 4 * MIB));
        assert_eq!((fs.block_size, fs.sector_size), (BLOCK_SIZE as u32, 512));
        assert_eq!(fs.label, "mem");
        let (h, _) = open(&mut s, "f", Disposition::Create).unwrap();
        write(&mut s, h, 0, b"x").unwrap();
        assert_eq!(s.fs_info().free_bytes, 4 * MIB - BLOCK_SIZE);
        assert_eq!(s.fs_info().serial, fs.serial);
    }

    #[test]
    fn factory_sizes_and_description() {
        assert!(MemStoreFactory::new(1000).is_err());
        let f = MemStoreFactory::new(2 * MIB).unwrap();
        assert_eq!(f.capacity(), 2 * MIB);
        assert!(f.describe().starts_with("mem (2 MiB, "), "{}", f.describe());
        let s = f.handle(0);
        assert_eq!(s.usage(), (0, Some(2 * MIB)));
    }

    // ---- zero-copy RDMA: pins -------------------------------------------

    const DATA_KEY: u32 = 0x11;
    const ZERO_KEY: u32 = 0x22;

    fn no_pieces() -> Vec<Piece> {
        vec![
            Piece {
                sge: Sge {
                    addr: 0,
                    len: 0,
                    lkey: 0,
                },
                pin: NO_PIN,
            };
            64
        ]
    }

    /// What the provider would read from `pieces` (an RDMA Write's gather).
    fn gather(pieces: &[Piece]) -> Vec<u8> {
        let mut v = Vec::new();
        for p in pieces {
            // SAFETY: the pieces are pinned store memory (or the zero
            // block), mapped while the store lives.
            let b =
                unsafe { std::slice::from_raw_parts(p.sge.addr as *const u8, p.sge.len as usize) };
            v.extend_from_slice(b);
        }
        v
    }

    fn unpin_all(s: &MemStore, pieces: &[Piece]) {
        let pins = s.zero_copy().unwrap().pins;
        for p in pieces.iter().filter(|p| p.pin != NO_PIN) {
            pins.unpin(p);
        }
    }

    #[test]
    fn zero_copy_pieces_cover_data_holes_and_the_end_of_file() {
        let mut s = store(4 * MIB);
        let z = s.zero_copy().expect("the memory store offers zero-copy");
        assert_eq!(z.regions.len(), 2);
        assert_eq!(z.regions[0].1 as u64, 4 * MIB);
        let (h, _) = open(&mut s, "f", Disposition::Create).unwrap();
        // Blocks 0 and 1 written (neighbours in the pool), block 2 a hole,
        // block 3 written; the end of file inside block 3.
        let a = (0..100_000u32)
            .map(|i| (i % 251) as u8 + 1)
            .collect::<Vec<_>>();
        write(&mut s, h, 1000, &a).unwrap();
        let b = vec![7u8; 30_000];
        write(&mut s, h, 3 * BLOCK_SIZE + 500, &b).unwrap();
        let eof = 3 * BLOCK_SIZE + 500 + 30_000;
        assert_eq!(size(&mut s, h), eof);
        let mut out = no_pieces();
        // A READ of more than the file: `read` clips it to the end of file.
        let avail = ready(s.read(9, h, 10, 1 << 20)).unwrap();
        assert_eq!(u64::from(avail), eof - 10);
        let n = s
            .pin_read(0, h, 10, avail, &[DATA_KEY, ZERO_KEY], &mut out)
            .expect("pieces");
        let pieces = &out[..n].to_vec();
        assert_eq!(gather(pieces), read(&mut s, h, 10, avail));
        // Holes come from the zero block, unpinned; data pieces are pinned.
        assert!(pieces
            .iter()
            .any(|p| p.pin == NO_PIN && p.sge.lkey == ZERO_KEY));
        assert!(pieces
            .iter()
            .all(|p| (p.pin == NO_PIN) == (p.sge.lkey == ZERO_KEY)));
        assert_eq!(
            pieces.iter().map(|p| u64::from(p.sge.len)).sum::<u64>(),
            u64::from(avail)
        );
        // Blocks 0 and 1 were taken in order: one piece for both.
        assert_eq!(pieces[0].sge.len as u64, 2 * BLOCK_SIZE - 10);
        // Too few slots: nothing, and nothing left pinned (the file can be
        // truncated and its blocks reused below).
        assert_eq!(
            s.pin_read(0, h, 0, avail, &[DATA_KEY, ZERO_KEY], &mut out[..1]),
            None
        );
        unpin_all(&s, pieces);
        ready(s.truncate(1, h, 0)).unwrap();
        assert_eq!(s.usage().0, 0, "every block freed: no pin left behind");
        s.close(h);
    }

    #[test]
    fn a_pinned_block_is_not_reused_until_its_last_pin_goes() {
        // Two blocks in all.
        let mut s = store(2 * BLOCK_SIZE);
        let (a, _) = open(&mut s, "a", Disposition::Create).unwrap();
        write(&mut s, a, 0, &vec![b'A'; BLOCK_SIZE as usize]).unwrap();
        let mut out = no_pieces();
        let n = s
            .pin_read(0, a, 0, BLOCK_SIZE as u32, &[DATA_KEY, ZERO_KEY], &mut out)
            .unwrap();
        let pieces = out[..n].to_vec();
        // A second transfer pins the same block again.
        let n2 = s
            .pin_read(0, a, 0, 100, &[DATA_KEY, ZERO_KEY], &mut out)
            .unwrap();
        let second = out[..n2].to_vec();
        // The file goes (its last close, delete pending) while both
        // transfers are in flight: the block is freed, but held back.
        s.set_delete_on_close(a, true).unwrap();
        s.close(a);
        assert_eq!(
            open(&mut s, "a", Disposition::Open),
            Err(StoreError::NotFound)
        );
        assert_eq!(s.usage().0, BLOCK_SIZE, "a pinned freed block stays in use");
        let (b, _) = open(&mut s, "b", Disposition::Create).unwrap();
        assert_eq!(
            write(&mut s, b, 0, &vec![b'B'; 2 * BLOCK_SIZE as usize]),
            Err(StoreError::Full),
            "only the free block is available"
        );
        write(&mut s, b, 0, &vec![b'B'; BLOCK_SIZE as usize]).unwrap();
        assert!(
            gather(&pieces).iter().all(|&x| x == b'A'),
            "never B's bytes"
        );
        unpin_all(&s, &pieces);
        assert_eq!(s.usage().0, 2 * BLOCK_SIZE, "one pin is left");
        assert_eq!(
            write(&mut s, b, BLOCK_SIZE, &[b'B'; 10]),
            Err(StoreError::Full)
        );
        unpin_all(&s, &second);
        // The last pin freed it: now B can have it.
        assert_eq!(s.usage().0, BLOCK_SIZE);
        write(&mut s, b, BLOCK_SIZE, &[b'B'; 10]).unwrap();
        s.close(b);
    }

    #[test]
    fn pinned_writes_go_in_place_only_over_mapped_blocks_inside_the_end_of_file() {
        let mut s = store(MIB);
        let (h, _) = open(&mut s, "w", Disposition::Create).unwrap();
        write(&mut s, h, 0, &[1u8; 10_000]).unwrap();
        write(&mut s, h, 2 * BLOCK_SIZE, &[2u8; 100]).unwrap();
        let keys = [DATA_KEY, ZERO_KEY];
        let mut out = no_pieces();
        // Past the end of file, or over the hole of block 1: staged.
        assert_eq!(
            s.pin_write(1, h, 2 * BLOCK_SIZE + 50, 100, &keys, &mut out),
            None
        );
        assert_eq!(s.pin_write(1, h, 9_000, 60_000, &keys, &mut out), None);
        assert_eq!(s.pin_write(1, h, BLOCK_SIZE, 10, &keys, &mut out), None);
        // Inside the first block: in place.
        let n = s.pin_write(1, h, 100, 5_000, &keys, &mut out).unwrap();
        assert_eq!(n, 1);
        assert_eq!(out[0].sge.lkey, DATA_KEY);
        // What an RDMA Read does: fill the piece.
        // SAFETY: a pinned piece of the store's memory, 5,000 bytes.
        unsafe { ptr::write_bytes(out[0].sge.addr as *mut u8, 9, 5_000) };
        assert_eq!(s.write_pinned(1, h, 100, 5_000), Poll::Ready(Ok(5_000)));
        unpin_all(&s, &out[..n]);
        let back = read(&mut s, h, 0, 10_000);
        assert!(back[..100].iter().all(|&x| x == 1));
        assert!(back[100..5_100].iter().all(|&x| x == 9));
        assert!(back[5_100..].iter().all(|&x| x == 1));
        assert_eq!(size(&mut s, h), 2 * BLOCK_SIZE + 100);
        s.close(h);
    }

    /// Readers pin a file's blocks, *close the file* and only then read the
    /// pinned bytes (a CLOSE, truncation or delete processed while the RDMA
    /// Write of an earlier READ is still in flight), while other threads
    /// overwrite, truncate and delete that file and fill another file with
    /// a byte the first one never holds. The pinned bytes must never be
    /// the other file's.
    #[test]
    fn truncate_and_delete_during_pinned_reads_never_expose_another_files_bytes() {
        use std::sync::atomic::AtomicBool;
        const OTHER: u8 = 0xEE;
        let f = MemStoreFactory::new(64 * BLOCK_SIZE).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(1500);
        let mut threads = Vec::new();
        // The mutator: rewrites "x" (bytes 1..=200) whole, truncates it,
        // deletes it.
        {
            let mut s = f.store();
            let stop = Arc::clone(&stop);
            threads.push(std::thread::spawn(move || {
                let mut gen = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    gen += 1;
                    let tag = (gen % 200) as u8 + 1;
                    let Ok((h, _)) = open(&mut s, "x", Disposition::OverwriteIf) else {
                        continue;
                    };
                    let _ = write(&mut s, h, 0, &vec![tag; 4 * BLOCK_SIZE as usize]);
                    match gen % 3 {
                        0 => {
                            let _ = ready(s.truncate(1, h, BLOCK_SIZE / 2));
                        }
                        1 => {
                            let _ = s.set_delete_on_close(h, true);
                        }
                        _ => {}
                    }
                    s.close(h);
                }
                gen
            }));
        }
        // The other file: takes whatever blocks are free and fills them
        // with OTHER, then gives them back.
        {
            let mut s = f.store();
            let stop = Arc::clone(&stop);
            threads.push(std::thread::spawn(move || {
                let mut rounds = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    rounds += 1;
                    let (h, _) = open(&mut s, "y", Disposition::OverwriteIf).unwrap();
                    for b in 0..16 {
                        if write(&mut s, h, b * BLOCK_SIZE, &[OTHER; BLOCK_SIZE as usize]).is_err()
                        {
                            break;
                        }
                    }
                    s.set_delete_on_close(h, true).unwrap();
                    s.close(h);
                }
                rounds
            }));
        }
        let mut readers = Vec::new();
        for r in 0..2u64 {
            let mut s = f.store();
            let stop = Arc::clone(&stop);
            readers.push(std::thread::spawn(move || {
                let mut out = no_pieces();
                let (mut checked, mut bytes) = (0u64, 0u64);
                let mut x = r + 1;
                while !stop.load(Ordering::Relaxed) {
                    let Ok((h, _)) = open(&mut s, "x", Disposition::Open) else {
                        std::thread::yield_now();
                        continue;
                    };
                    let len = ready(s.read(1, h, 0, 4 * BLOCK_SIZE as u32)).unwrap_or(0);
                    let pinned = if len > 0 {
                        s.pin_read(0, h, 0, len, &[DATA_KEY, ZERO_KEY], &mut out)
                    } else {
                        None
                    };
                    s.close(h);
                    let Some(n) = pinned else { continue };
                    // The transfer is still "in flight" for a while.
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    for _ in 0..(x % 64) {
                        std::thread::yield_now();
                    }
                    let got = gather(&out[..n]);
                    assert!(
                        !got.contains(&OTHER),
                        "a pinned read of x saw the other file's bytes"
                    );
                    unpin_all(&s, &out[..n]);
                    checked += 1;
                    bytes += got.len() as u64;
                }
                (checked, bytes)
            }));
        }
        while std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        stop.store(true, Ordering::Relaxed);
        let mut total = 0;
        for t in readers {
            let (checked, bytes) = t.join().expect("reader");
            total += checked;
            assert!(checked == 0 || bytes > 0);
        }
        let gens = threads
            .into_iter()
            .map(|t| t.join().expect("writer"))
            .sum::<u64>();
        assert!(
            total > 0 && gens > 0,
            "the race ran ({total} reads, {gens} rounds)"
        );
        // Every pin went: only what is still mapped is in use.
        let mut s = f.store();
        if let Ok((h, _)) = open(&mut s, "x", Disposition::Open) {
            ready(s.truncate(1, h, 0)).unwrap();
            s.close(h);
        }
        assert_eq!(s.usage().0, 0, "no block leaked by a pin");
    }
}
