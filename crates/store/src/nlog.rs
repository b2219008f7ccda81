//! Nlog: per (node, cluster) append logs made of fixed-size files
//! (allocator blocks listed in the root's extent table).
//!
//! One active file per (node, cluster) takes appends under that pair's
//! lock. The lock is held through the entry's persist, so only the newest
//! entry of a file can be torn or missing (gap F1): recovery reads a file
//! from its start and stops at the first zero word or bad checksum.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use engine::sync::{SpinGuard, SpinMutex};
use engine::{Durability, Error, Result};
use pmem::{Link, Pool};

use crate::epoch::{Epochs, Pin};
use crate::files::FileTable;
pub(crate) use crate::files::LogFile;
use crate::layout::*;
use crate::numa::Numa;

/// How the scan of a file ended (see [`Nlog::classify_end`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum End {
    /// Zeros to the end of the file.
    Clean,
    /// Entries in flight at a crash, from `at` (relative) on.
    Torn { at: u64 },
    /// A bad entry at `at` no crash could have torn; `proof`: a valid
    /// entry after it written when `at` was durable (none: the file is
    /// sealed, so nothing in it was in flight).
    Corrupt { at: u64, proof: Option<u64> },
}

/// Whether the entry `e` (header parsed, key and value read into `key`
/// and `value`) of the file numbered `seq` passes its checksum.
#[inline]
pub(crate) fn entry_checks(pool: &Pool, seq: u64, e: &Entry, key: &[u8], value: &[u8]) -> bool {
    let w = CrcWords {
        seq,
        off: e.off,
        version: e.version,
        lens: lens_word(e.klen, e.vlen),
        h_addr: e.h_addr,
        h_seq: e.h_seq,
        durable: e.durable / ENTRY_ALIGN,
    };
    let crc = entry_crc(&w, key, value);
    pool.load_u64(e.off + 32) as u32 == crc
}

/// An entry as read back from the log.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    pub off: u64,
    pub op: u64,
    pub version: u64,
    pub klen: usize,
    pub vlen: usize,
    pub h_addr: u64,
    pub h_seq: u64,
    pub len: u64,
    /// Its durable mark: the file's durable prefix (relative bytes) when
    /// it was written.
    pub durable: u64,
}

/// An entry to append: everything but where it goes.
pub(crate) struct NewEntry<'a> {
    pub cluster: u32,
    pub op: u64,
    pub version: u64,
    pub key: &'a [u8],
    pub value: &'a [u8],
    pub h_addr: u64,
    pub h_seq: u64,
}

/// Where `append_locked` wrote an entry: its `v_addr`, its file (by the
/// file's pool offset) and its bytes, still to be flushed.
struct Appended {
    va: u64,
    file: u64,
    off: u64,
    len: u64,
    /// Written with non-temporal stores: durable at the next fence, no
    /// flush needed.
    nt: bool,
}

/// A cache line: an entry of exactly this length is written
/// non-temporally (under `Strict`).
const LINE: u64 = 64;

/// An entry written and flushed by [`Nlog::append_flushed`], its file
/// still locked.
pub(crate) struct Staged<'a> {
    log: &'a Nlog,
    g: SpinGuard<'a, Option<Arc<LogFile>>>,
    /// The entry's `v_addr`.
    pub va: u64,
}

impl Staged<'_> {
    /// The entry's file (the active one: a full file was replaced before
    /// the entry was written). An `Arc` clone is a locked instruction: take
    /// it before [`commit`](Self::commit), where it does not wait for the
    /// flush.
    pub(crate) fn file(&self) -> Arc<LogFile> {
        self.g.clone().expect("active file after an append")
    }

    /// Fences the entry and unlocks its file; returns its `v_addr`.
    pub(crate) fn commit(self) -> u64 {
        // persist: the entry, crc included, before the index names it (I1),
        // with the file lock held through the fence, so only the newest
        // entry of a file can be torn (F1, F10). The unlock after it is a
        // plain store: it does not wait for the flush, and the fence keeps
        // it (and every store after it) from being seen before the flush
        // completes.
        self.log.fence();
        self.log.fenced(self.g.as_deref());
        self.va
    }
}

/// The active file of a (node, cluster) pair, under its append lock.
pub(crate) type ActiveFile = SpinMutex<Option<Arc<LogFile>>>;

/// What a write changes of its (node, cluster) pair, in one cache line:
/// the cluster's version counter, the append lock and the hints that let
/// a writer start its misses early ([`Nlog::prefetch_tail`]). Keys reach
/// the pairs by hash, so with two writers the line a write needs was last
/// written by the other one about half the time: in three lines (as
/// counter, lock and hint were) a write waited for up to three such
/// transfers, one after another, and then for a fourth, the active file's
/// `tail`, which only the lock's holder could name. Now the writer
/// prefetches this line and the `tail` line (through `file_at`) before
/// its pin's fence, so both misses overlap the previous write's
/// write-back (docs/store.md, "Two writers").
#[repr(align(64))]
pub(crate) struct Pair {
    /// The active file; the lock is the append lock. Its unlock is a
    /// plain store, so a writer unlocks right after its entry's fence
    /// without waiting for the flush (see [`Staged`]).
    pub active: ActiveFile,
    /// The pool offset where the pair's next entry goes, as of the last
    /// append (0: none yet). A hint read without the lock.
    next_at: AtomicU64,
    /// The address of the active file's DRAM state (its `tail`), set with
    /// the active file (0: none yet). A hint for a prefetch only, never
    /// dereferenced: the file may be gone by the time it is read.
    file_at: AtomicUsize,
    /// Only in node 0's pair of each cluster: the cluster's next version
    /// ([`Nlog::version`]).
    version: AtomicU64,
}

impl Pair {
    /// Points the `file_at` hint at `f`, about to become the active file.
    fn set_file(&self, f: &LogFile) {
        self.file_at
            .store(std::ptr::from_ref(&f.tail) as usize, Ordering::Relaxed);
    }
}

const _: () = assert!(
    std::mem::size_of::<Pair>() == 64,
    "a Pair is one cache line"
);

pub(crate) struct Nlog {
    pub pool: Arc<Pool>,
    pub root: u64,
    pub nodes: u32,
    pub clusters: u32,
    pub extent_size: u64,
    pub table_len: u64,
    pub durability: Durability,
    /// All live files by offset.
    pub files: FileTable,
    /// Per (node, cluster): what its writers change, in one line
    /// ([`Pair`]).
    pub pairs: Box<[Pair]>,
    /// Free extent-table slots.
    free_slots: Mutex<Vec<u64>>,
    /// DRAM copy of root.next_seq; `seq_lock` serialises its bumps.
    next_seq: AtomicU64,
    seq_lock: Mutex<()>,
    pub files_made: AtomicU64,
    /// Bytes [`prefault_tails`](Self::prefault_tails) faulted in.
    pub prefaulted: AtomicU64,
    pub files_freed: AtomicU64,
    /// Sealed files GC may have to reclaim that no GC run has seen yet,
    /// plus those the last run left: writers help GC (or wait for it)
    /// while this reaches [`GC_BACKLOG`].
    pub backlog: AtomicU64,
}

/// How far past a pair's next entry the prefault thread keeps its log
/// pages faulted in ([`Nlog::prefault_tails`]): 256 pairs of one node hold
/// 8 MiB ahead at most. A pair's tail moves about 0.4 KiB between two of
/// its 2 ms runs at one writer (10M 8-byte puts over 256 pairs), so half
/// the window lasts well over a run even at many writers.
pub(crate) const PREFAULT_AHEAD: u64 = 32 << 10;

/// Reclaimable files past which writers help GC (see [`Nlog::backlog`]).
pub(crate) const GC_BACKLOG: u64 = 4;

/// A store's root block as the log reads it: where it is and the words
/// the log works from (its shape, fixed at create, and the next extent
/// sequence number).
pub(crate) struct LogRoot {
    /// Pool offset of the root block.
    pub root: u64,
    pub nodes: u32,
    pub clusters: u32,
    pub extent_size: u64,
    pub table_len: u64,
    pub next_seq: u64,
}

impl Nlog {
    /// A log whose file lookups are pinned with `epochs`.
    pub(crate) fn new(
        pool: Arc<Pool>,
        r: &LogRoot,
        durability: Durability,
        epochs: Arc<Epochs>,
    ) -> Nlog {
        let LogRoot {
            root,
            nodes,
            clusters,
            extent_size,
            table_len,
            next_seq,
        } = *r;
        Nlog {
            pool,
            root,
            nodes,
            clusters,
            extent_size,
            table_len,
            durability,
            files: FileTable::new(epochs),
            pairs: (0..nodes as usize * clusters as usize)
                .map(|_| Pair {
                    active: SpinMutex::new(None),
                    next_at: AtomicU64::new(0),
                    file_at: AtomicUsize::new(0),
                    version: AtomicU64::new(1),
                })
                .collect(),
            free_slots: Mutex::new(Vec::new()),
            next_seq: AtomicU64::new(next_seq),
            seq_lock: Mutex::new(()),
            files_made: AtomicU64::new(0),
            prefaulted: AtomicU64::new(0),
            files_freed: AtomicU64::new(0),
            backlog: AtomicU64::new(0),
        }
    }

    /// Cluster `cluster`'s next version (D9: one counter per cluster, in
    /// node 0's pair line, where a one-node store's writer takes its
    /// append lock right after drawing it).
    #[inline]
    pub(crate) fn version(&self, cluster: usize) -> &AtomicU64 {
        &self.pairs[cluster].version
    }

    /// Every cluster's next version, in cluster order.
    pub(crate) fn versions(&self) -> impl Iterator<Item = &AtomicU64> {
        self.pairs[..self.clusters as usize]
            .iter()
            .map(|p| &p.version)
    }

    #[inline]
    pub(crate) fn pair(&self, node: u32, cluster: u32) -> usize {
        node as usize * self.clusters as usize + cluster as usize
    }

    /// Starts loading what the next append of (node, cluster),
    /// `len` bytes long, writes: the pair's line (its lock), the active
    /// file's tail, and the log lines where the entry will most likely go
    /// (up to two), so that an append about to take the lock does not wait
    /// for them there. No log lines for a one-line entry under `Strict`:
    /// it is written non-temporally, and a cached copy would only have to
    /// be evicted first. A hint: the lines may have moved on, or the file
    /// may be gone (a prefetch never faults).
    #[inline]
    pub(crate) fn prefetch_tail(&self, node: u32, cluster: u32, len: u64) {
        let pair = &self.pairs[self.pair(node, cluster)];
        engine::sync::prefetch(pair);
        engine::sync::prefetch_addr(pair.file_at.load(Ordering::Relaxed));
        if len == LINE && self.durability == Durability::Strict {
            return;
        }
        let at = pair.next_at.load(Ordering::Relaxed);
        if at != 0 && at + 2 * LINE <= self.pool.size() {
            self.pool.prefetch_write(at);
            self.pool.prefetch_write(at + LINE);
        }
    }

    /// Faults in, for every pair that has appended, the pages up to
    /// [`PREFAULT_AHEAD`] past its next entry (within its file), so that
    /// the writers' first stores into fresh log pages take no page fault:
    /// on tmpfs each is a page allocated and zeroed, 13% of the samples of
    /// a growing 8-byte load at one thread. Run by the store's prefault
    /// thread; `ahead[pair]` is where the pair's pages are known faulted
    /// up to (the caller's, one per pair, starting at 0). A pair is topped
    /// up once less than half the window is left, so most calls read the
    /// hints and nothing else. Returns the bytes faulted in.
    ///
    /// No byte changes ([`Pool::prefault`]), so a hint that moved on costs
    /// only resident pages.
    pub(crate) fn prefault_tails(&self, ahead: &mut [u64]) -> u64 {
        let mut done = 0;
        for (pair, known) in self.pairs.iter().zip(ahead.iter_mut()) {
            let at = pair.next_at.load(Ordering::Relaxed);
            // `known` belongs to this file and run of the tail when it
            // lies within the window past it; a pair that moved to a new
            // file (higher or lower in the pool) starts again from `at`.
            let fresh = *known > at && *known <= at + PREFAULT_AHEAD;
            if at == 0 || (fresh && *known - at >= PREFAULT_AHEAD / 2) {
                continue;
            }
            // The file holding the last entry written (`at` itself is its
            // end when the file is full), read under the pin: GC frees a
            // file, and punches a hole over its pages for reuse, only
            // after every pin from before its unlinking is gone, and a
            // read fault on a hole of a full tmpfs would be SIGBUS. A
            // sealed file takes no more entries.
            let p = self.files.pin();
            let end = match self.files.get(at - 1, &p) {
                Some(f) if !f.sealed.load(Ordering::Acquire) => f.off + f.size,
                _ => continue,
            };
            let from = if fresh && *known < end { *known } else { at };
            let to = (at + PREFAULT_AHEAD).min(end);
            if to > from {
                done += self.pool.prefault(from & !4095, to - (from & !4095));
            }
            drop(p);
            *known = to;
        }
        self.prefaulted.fetch_add(done, Ordering::Relaxed);
        done
    }

    /// Pairs, as [`prefault_tails`](Self::prefault_tails) counts them.
    pub(crate) fn pair_count(&self) -> usize {
        self.pairs.len()
    }

    /// Registers a file found at open; `free` lists the empty table slots.
    pub(crate) fn install(&self, files: Vec<Arc<LogFile>>, free: Vec<u64>) {
        self.files.insert(files);
        *self.free_slots.lock().expect("slots lock") = free;
    }

    /// Makes `f` the active file of its pair (at open).
    pub(crate) fn set_active(&self, f: Arc<LogFile>) {
        let pair = &self.pairs[self.pair(f.node, f.cluster)];
        pair.set_file(&f);
        *pair.active.lock() = Some(f);
    }

    /// The live file holding pool offset `off`.
    pub(crate) fn file_at(&self, off: u64) -> Option<Arc<LogFile>> {
        self.files.get(off, &self.files.pin()).cloned()
    }

    /// The live file holding pool offset `off`, without a reference count
    /// taken: valid while `p` (a pin of the store's epochs) is held.
    #[inline]
    pub(crate) fn file_in<'p>(&self, off: u64, p: &'p Pin<'_>) -> Option<&'p Arc<LogFile>> {
        self.files.get(off, p)
    }

    pub(crate) fn snapshot(&self) -> Vec<Arc<LogFile>> {
        self.files.all()
    }

    /// Creates a zeroed file for (node, cluster) and links it into the
    /// extent table.
    fn new_file(&self, node: u32, cluster: u32, numa: &Numa) -> Result<Arc<LogFile>> {
        let pool = &self.pool;
        let slot = self.free_slots.lock().expect("slots lock").pop();
        let Some(slot) = slot else {
            return Err(Error::OutOfSpace(format!(
                "the extent table's {} slots are all in use",
                self.table_len
            )));
        };
        let owner = self.root + R_TABLE + 8 * slot;
        let r = match pool.reserve(self.extent_size, Link::Pointer { owner }) {
            Ok(r) => r,
            Err(e) => {
                self.free_slots.lock().expect("slots lock").push(slot);
                return Err(e.into());
            }
        };
        let off = r.offset();
        let seq = {
            let _g = self.seq_lock.lock().expect("seq lock");
            let s = self.next_seq.fetch_add(1, Ordering::AcqRel);
            // persist: next_seq before any file carries `s`, so a crash can
            // never hand the same number out twice (F7).
            pool.store_u64(self.root + R_NEXT_SEQ, s + 1);
            pool.persist(self.root + R_NEXT_SEQ, 8);
            s
        };
        // SAFETY-free: placement is a hint on our own mapping.
        numa.place(
            pool.words(off, 1).as_ptr() as *const u8,
            self.extent_size as usize,
            node,
        );
        // A block from never-used pool space already reads zero
        // (`is_zeroed`: above the allocator's high-water mark, whose pages
        // the file system reserved when the pool was made or grew), so it
        // needs no zeroing and its pages join this process only when
        // written. A reused block is zeroed without touching its pages
        // where the pool file allows (`zero_release`: a hole punched and
        // reserved again); elsewhere with non-temporal stores (8 MB of
        // zeros through the cache would evict a quarter of a 32 MiB L3 and
        // need a flush per line). On an error the block stays reserved and
        // unlinked: the next open frees it (and backs any hole first).
        if !r.is_zeroed() {
            if let Err(e) = pool.zero_release(off, self.extent_size as usize) {
                self.free_slots.lock().expect("slots lock").push(slot);
                return Err(e.into());
            }
        }
        let head = [EXT_MAGIC, node as u64 | ((cluster as u64) << 32), seq, slot];
        for (i, w) in head.iter().enumerate() {
            pool.store_u64(off + 8 * i as u64, *w);
        }
        pool.store_u64(off + X_CHECK, words_crc(&head) as u64);
        // persist: the zeroed file (zero since the file system backed it,
        // for a fresh block; the hole, in the file once `zero_release`
        // returned, and non-temporal stores, ordered by this fence, for a
        // reused one) and its header before the table links it (F11): a
        // linked file never holds garbage where entries go.
        pool.persist(off, X_DATA as usize);
        pool.store_u64(owner, off);
        // persist: the link before commit (allocator protocol).
        pool.persist(owner, 8);
        pool.commit(r);
        let f = Arc::new(LogFile::new(
            off,
            node,
            cluster,
            seq,
            slot,
            self.extent_size,
        ));
        self.files.insert([f.clone()]);
        self.files_made.fetch_add(1, Ordering::Relaxed);
        Ok(f)
    }

    /// Appends entry `e` to the active file of (node, `e.cluster`) and makes it
    /// durable (under `Strict`). Returns its `v_addr` and file.
    pub(crate) fn append(
        &self,
        node: u32,
        e: &NewEntry<'_>,
        numa: &Numa,
    ) -> Result<(u64, Arc<LogFile>)> {
        let staged = self.append_flushed(node, e, numa)?;
        let file = staged.file();
        Ok((staged.commit(), file))
    }

    /// Writes one entry into the active file of (node, cluster) and
    /// flushes it, keeping the file locked: [`Staged::commit`] fences it
    /// and unlocks. Between the two the caller can do work that must
    /// precede the fence or that would otherwise wait for the flush.
    /// Inline: its result, returned through memory, was read back with a
    /// load wider than the stores that wrote it (5% of a put's samples).
    #[inline]
    pub(crate) fn append_flushed(
        &self,
        node: u32,
        e: &NewEntry<'_>,
        numa: &Numa,
    ) -> Result<Staged<'_>> {
        let mut g = self.pairs[self.pair(node, e.cluster)].active.lock();
        let a = self.append_locked(&mut g, node, e, numa, &mut Vec::new())?;
        if !a.nt {
            self.pool.flush(a.off, a.len as usize);
        }
        Ok(Staged {
            log: self,
            g,
            va: a.va,
        })
    }

    /// Appends entries of one node (several clusters) with one fence for
    /// all. Pushes each appended entry's `v_addr` and file to `out`, in
    /// order; on an error the entries before it are appended (and fenced).
    pub(crate) fn append_batch(
        &self,
        node: u32,
        entries: &[NewEntry<'_>],
        out: &mut Vec<(u64, Arc<LogFile>)>,
        numa: &Numa,
    ) -> Result<()> {
        let mut pairs: Vec<usize> = entries.iter().map(|e| self.pair(node, e.cluster)).collect();
        pairs.sort_unstable();
        pairs.dedup();
        // Every active file the batch touches stays locked until the fence:
        // no other writer can append (and acknowledge) an entry behind an
        // entry of ours that a crash could still tear. Locks are taken in
        // pair order, so two batches cannot deadlock.
        let mut guards: Vec<_> = pairs.iter().map(|&p| self.pairs[p].active.lock()).collect();
        let mut r = Ok(());
        // What each entry's append returned, and the files it replaced.
        let mut done: Vec<(usize, Appended)> = Vec::with_capacity(entries.len());
        let mut replaced: Vec<Arc<LogFile>> = Vec::new();
        for e in entries {
            let i = pairs
                .binary_search(&self.pair(node, e.cluster))
                .expect("pair locked");
            match self.append_locked(&mut guards[i], node, e, numa, &mut replaced) {
                Ok(a) => done.push((i, a)),
                Err(err) => {
                    r = Err(err);
                    break;
                }
            }
        }
        // Entries are flushed after the last one is written, adjacent ones
        // merged, and their files' `Arc`s cloned after the fence: a locked
        // instruction (an `Arc` clone is a `lock inc`) waits for every
        // earlier `clwb` to finish and for the store buffer to drain, so a
        // flush or a clone per entry made each entry wait for the one
        // before it (16% of pipelined SETs' time).
        let mut span: Option<(u64, u64)> = None;
        for (_, a) in done.iter().filter(|(_, a)| !a.nt) {
            span = match span {
                Some((off, len)) if off + len == a.off => Some((off, len + a.len)),
                Some((off, len)) => {
                    self.pool.flush(off, len as usize);
                    Some((a.off, a.len))
                }
                None => Some((a.off, a.len)),
            };
        }
        if let Some((off, len)) = span {
            self.pool.flush(off, len as usize);
        }
        // persist: every entry of the batch (flushed just above), before the
        // index names any of them (I1) and before the files are unlocked
        // (F1, F10): only the entries of this batch, at the tails of their
        // files, can be torn.
        self.fence();
        for g in &guards {
            self.fenced(g.as_deref());
        }
        for f in &replaced {
            self.fenced(Some(f));
        }
        for (i, a) in done {
            let f = guards[i]
                .as_ref()
                .filter(|f| f.off == a.file)
                .or_else(|| replaced.iter().find(|f| f.off == a.file))
                .expect("an appended entry's file is active or replaced");
            out.push((a.va, f.clone()));
        }
        r
    }

    /// Writes (does not flush or fence) one entry into the active file the
    /// caller holds locked, opening a new file when it is full (the full
    /// one is pushed to `replaced`). The caller flushes and fences the
    /// entry before it unlocks the file.
    fn append_locked(
        &self,
        g: &mut SpinGuard<'_, Option<Arc<LogFile>>>,
        node: u32,
        e: &NewEntry<'_>,
        numa: &Numa,
        replaced: &mut Vec<Arc<LogFile>>,
    ) -> Result<Appended> {
        let (key, value) = (e.key, e.value);
        let len = entry_len(key.len(), value.len());
        if len > self.extent_size - X_DATA {
            return Err(Error::InvalidArgument(format!(
                "an entry of {len} bytes does not fit a {}-byte Nlog file",
                self.extent_size
            )));
        }
        let pool = &self.pool;
        if !matches!(&**g, Some(f) if f.tail.load(Ordering::Relaxed) + len <= f.size) {
            if let Some(old) = &**g {
                // persist: the full file is synced before the next file of
                // its pair exists, so a file that is not the newest of its
                // pair holds no entry a crash could tear, and recovery
                // takes any bad entry in it for corruption. Under `Strict`
                // only a batch leaves entries unfenced here (one fence per
                // file it fills, besides the batch's own).
                self.sync_file(old);
            }
            let nf = self.new_file(node, e.cluster, numa)?;
            if let Some(old) = g.take() {
                old.sealed.store(true, Ordering::Release);
                self.backlog.fetch_add(1, Ordering::Relaxed);
                replaced.push(old);
            }
            self.pairs[self.pair(node, e.cluster)].set_file(&nf);
            **g = Some(nf);
        }
        let f: &LogFile = g.as_deref().expect("an active file");
        let tail = f.tail.load(Ordering::Relaxed);
        let off = f.off + tail;
        let lens = lens_word(key.len(), value.len());
        // The file's durable prefix now: everything before it was fenced
        // (under `Strict` that is this entry's own position, unless an
        // earlier entry of the same batch precedes it).
        let durable = f.synced.load(Ordering::Relaxed) / ENTRY_ALIGN;
        let w = CrcWords {
            seq: f.seq,
            off,
            version: e.version,
            lens,
            h_addr: e.h_addr,
            h_seq: e.h_seq,
            durable,
        };
        let crc = entry_crc(&w, key, value);
        let check = check_word(crc, durable);
        let w0 = (e.op << OP_SHIFT) | e.version;
        // Only under `Strict`: non-temporal stores are weakly ordered, and
        // it is the entry's fence that keeps the index (and the unlock)
        // from being seen before them. `Relaxed` has no fence per write,
        // so there a reader on another core could find the entry through
        // the index before its bytes arrive.
        let nt = len == LINE && self.durability == Durability::Strict;
        if nt {
            // One line: assembled here and written with non-temporal
            // stores, so the line is never read for ownership (it is not
            // in the cache: the file was zeroed non-temporally) and needs
            // no flush; the caller's fence orders it like a flushed line.
            let mut line = [0u8; LINE as usize];
            for (i, w) in [w0, lens, e.h_addr, e.h_seq, check].iter().enumerate() {
                line[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
            }
            let k = ENTRY_HEADER as usize;
            line[k..k + key.len()].copy_from_slice(key);
            line[k + key.len()..k + key.len() + value.len()].copy_from_slice(value);
            pool.write_nt(off, &line);
        } else {
            pool.store_u64(off + 8, lens);
            pool.store_u64(off + 16, e.h_addr);
            pool.store_u64(off + 24, e.h_seq);
            pool.store_u64(off + 32, check);
            pool.write(off + ENTRY_HEADER, key);
            pool.write(off + ENTRY_HEADER + key.len() as u64, value);
            pool.store_u64(off, w0);
        }
        // persist: the whole entry with one flush (none for a line written
        // non-temporally), by the caller, which fences while it still
        // holds the file (`append`, `append_batch`).
        numa.count_write(node, numa.current());
        f.tail.store(tail + len, Ordering::Release);
        self.pairs[self.pair(node, e.cluster)]
            .next_at
            .store(off + len, Ordering::Relaxed);
        Ok(Appended {
            va: vaddr(node, off),
            file: f.off,
            off,
            len,
            nt,
        })
    }

    /// The fence that makes flushed entries durable (none under `Relaxed`).
    pub(crate) fn fence(&self) {
        if self.durability == Durability::Strict {
            self.pool.fence();
        }
    }

    /// After [`fence`](Self::fence) under `Strict`, with `f` still locked:
    /// its whole written part is durable (the next entry's durable mark).
    /// A plain store: nothing locked after the fence.
    #[inline]
    pub(crate) fn fenced(&self, f: Option<&LogFile>) {
        if let (Some(f), Durability::Strict) = (f, self.durability) {
            f.synced
                .store(f.tail.load(Ordering::Relaxed), Ordering::Release);
        }
    }

    /// Flushes and fences what `Relaxed` appends left unfenced in `f`.
    pub(crate) fn sync_file(&self, f: &LogFile) {
        let tail = f.tail.load(Ordering::Acquire);
        let from = f.synced.load(Ordering::Acquire);
        if tail > from {
            self.pool.flush(f.off + from, (tail - from) as usize);
            self.pool.fence();
            f.synced.fetch_max(tail, Ordering::AcqRel);
        }
    }

    /// Reads the entry header at `off` (no validation beyond lengths).
    #[inline]
    pub(crate) fn header(&self, off: u64) -> Option<Entry> {
        let pool = &self.pool;
        let w0 = pool.load_u64(off);
        let (klen, vlen) = parse_lens(pool.load_u64(off + 8))?;
        Some(Entry {
            off,
            op: w0 >> OP_SHIFT,
            version: w0 & VERSION_MASK,
            klen,
            vlen,
            h_addr: pool.load_u64(off + 16),
            h_seq: pool.load_u64(off + 24),
            len: entry_len(klen, vlen),
            durable: (pool.load_u64(off + 32) >> 32) * ENTRY_ALIGN,
        })
    }

    /// Loads the first line of the entry at `off` into the cache (a
    /// prefetch: the value read is not used).
    #[inline]
    pub(crate) fn touch(&self, off: u64) {
        std::hint::black_box(self.pool.load_u64(off + 8));
    }

    pub(crate) fn read_key(&self, e: &Entry, buf: &mut Vec<u8>) {
        buf.resize(e.klen, 0);
        self.pool.read(e.off + ENTRY_HEADER, buf);
    }

    pub(crate) fn read_value(&self, e: &Entry, buf: &mut Vec<u8>) {
        buf.resize(e.vlen, 0);
        self.pool.read(e.off + ENTRY_HEADER + e.klen as u64, buf);
    }

    /// Parses and checks the entry at relative position `pos` of `f`:
    /// `None` at the end of the written part (zero word, bad lengths,
    /// overrun or bad checksum).
    pub(crate) fn parse(
        &self,
        f: &LogFile,
        pos: u64,
        kbuf: &mut Vec<u8>,
        vbuf: &mut Vec<u8>,
    ) -> Option<Entry> {
        // Entries start on ENTRY_ALIGN boundaries: a position off one came
        // from a corrupt word (an index slot, a length), not from the log.
        if !pos.is_multiple_of(ENTRY_ALIGN) || pos + ENTRY_HEADER > f.size {
            return None;
        }
        let off = f.off + pos;
        if self.pool.load_u64(off) == 0 {
            return None;
        }
        let e = self.header(off)?;
        if pos + e.len > f.size || e.version == 0 {
            return None;
        }
        self.read_key(&e, kbuf);
        self.read_value(&e, vbuf);
        entry_checks(&self.pool, f.seq, &e, kbuf, vbuf).then_some(e)
    }

    /// Where the scan of `f` from its start ends, and whether that end is
    /// a torn tail or corruption. `end` is the position (relative) of the
    /// first entry that did not parse; `newest`: `f` is the newest file of
    /// its pair (the only one that may hold entries in flight).
    ///
    /// The end is clean when nothing but zeros is left in the file. It is
    /// a torn tail when the bytes there could be an entry in flight:
    /// `f` is the newest file and no valid entry after `end` was written
    /// when `end` was already durable (an entry after it under `Relaxed`,
    /// also in flight, is dropped with it: it was never synced). Anything
    /// else is corruption. Every line after `end` is looked at: entries
    /// are 64-aligned, so a valid one is found wherever it starts.
    pub(crate) fn classify_end(&self, f: &LogFile, end: u64, newest: bool) -> End {
        let (mut kbuf, mut vbuf) = (Vec::new(), Vec::new());
        let mut nonzero = None;
        let mut pos = end;
        while pos + ENTRY_HEADER <= f.size {
            let off = f.off + pos;
            if (0..8).all(|i| self.pool.load_u64(off + 8 * i) == 0) {
                pos += ENTRY_ALIGN;
                continue;
            }
            nonzero.get_or_insert(pos);
            if pos > end {
                if let Some(e) = self.parse(f, pos, &mut kbuf, &mut vbuf) {
                    if e.durable > end {
                        return End::Corrupt {
                            at: end,
                            proof: Some(pos),
                        };
                    }
                    pos += e.len;
                    continue;
                }
            }
            pos += ENTRY_ALIGN;
        }
        match nonzero {
            None => End::Clean,
            Some(_) if !newest => End::Corrupt {
                at: end,
                proof: None,
            },
            Some(_) => End::Torn { at: end },
        }
    }

    /// Marks the entry at `off` invalid (op 00) and flushes the mark (the
    /// caller fences).
    pub(crate) fn mark_invalid(&self, off: u64) {
        let w = self.pool.atomic_u64(off);
        let v = w.load(Ordering::Acquire);
        w.store(v & VERSION_MASK, Ordering::Release);
        // persist: flushed here; the caller fences each level of marks
        // before the next, oldest first, so a durable mark always has a
        // durable history (I3).
        self.pool.flush(off, 8);
    }

    /// Unlinks and frees file `f` (already out of every DRAM map and past an
    /// epoch, so no reader holds an address into it).
    pub(crate) fn free_file(&self, f: &LogFile) -> Result<()> {
        let owner = self.root + R_TABLE + 8 * f.slot;
        let t = self.pool.begin_free(f.off, Link::Pointer { owner })?;
        self.pool.store_u64(owner, 0);
        // persist: the unlink before finish_free (allocator protocol); every
        // entry still live in `f` was relocated durably before this call.
        self.pool.persist(owner, 8);
        self.pool.finish_free(t);
        self.free_slots.lock().expect("slots lock").push(f.slot);
        self.files_freed.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Removes `f` from the DRAM maps (the first step of freeing it).
    pub(crate) fn forget(&self, f: &LogFile) {
        self.files.remove(f.off);
    }
}

/// Whether the entry at `off` holds `key` (the DRAM point index confirms a
/// candidate with it; the caller keeps the file mapped). An 8-byte key,
/// the fast path, is one word compare.
#[inline]
pub(crate) fn entry_key_is(pool: &Pool, off: u64, key: &[u8]) -> bool {
    match parse_lens(pool.load_u64(off + 8)) {
        Some((klen, _)) if klen == key.len() => {}
        _ => return false,
    }
    let at = off + ENTRY_HEADER;
    if let Ok(k) = <[u8; 8]>::try_from(key) {
        return pool.load_u64(at) == u64::from_le_bytes(k);
    }
    let mut buf = [0u8; 64];
    key.chunks(64).enumerate().all(|(i, c)| {
        pool.read(at + 64 * i as u64, &mut buf[..c.len()]);
        buf[..c.len()] == *c
    })
}

/// The key of the entry at `off` into `buf`; false if its lengths word is
/// not an entry's (the caller keeps the file mapped).
pub(crate) fn entry_key(pool: &Pool, off: u64, buf: &mut Vec<u8>) -> bool {
    let Some((klen, _)) = parse_lens(pool.load_u64(off + 8)) else {
        return false;
    };
    buf.resize(klen, 0);
    pool.read(off + ENTRY_HEADER, buf);
    true
}
