//! The store: writes go to the writer's node's Nlog, the DRAM index names
//! each key's newest entry, gets go through the RAF cache.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use engine::{Durability, Error, Result};
use pmem::{Link, Pool};

use crate::epoch::Pin;
use crate::inner::Inner;
use crate::layout::*;
use crate::nlog::LogFile;
use crate::numa::detect_nodes;
use crate::options::{GcMode, Options};
use crate::point_map::Got;
use crate::raf::Probe;
use crate::stats::StoreStats;

/// The background GC thread and its stop flag.
type GcThread = (JoinHandle<()>, Arc<(Mutex<bool>, Condvar)>);

/// A persistent key-value store (see the crate docs).
pub struct Store {
    pub(crate) inner: Arc<Inner>,
    gc_thread: Mutex<Option<GcThread>>,
    dir: Option<PathBuf>,
}

fn check_key(key: &[u8]) -> Result<()> {
    if key.len() > MAX_KEY {
        return Err(Error::InvalidArgument(format!(
            "key of {} bytes exceeds the {MAX_KEY}-byte limit",
            key.len()
        )));
    }
    Ok(())
}

fn check_value(v: &[u8]) -> Result<()> {
    if v.len() > MAX_VALUE {
        return Err(Error::InvalidArgument(format!(
            "value of {} bytes exceeds the {MAX_VALUE}-byte limit",
            v.len()
        )));
    }
    Ok(())
}

impl Store {
    /// Opens the store in `dir`, creating the directory and the store if
    /// they do not exist.
    pub fn open(dir: &Path, opts: Options) -> Result<Store> {
        opts.validate()?;
        let path = dir.join(POOL_FILE);
        let pool = if path.exists() {
            if opts.read_only {
                Pool::open(&path, &opts.pool_options())?
            } else {
                // One writer at a time: the pool's exclusive lock is taken
                // first and held from the check to the open.
                let lock = pmem::PoolLock::exclusive(&path)?;
                // A writable pool open updates the pool header (clean flag,
                // open count) at once; check the store read-only first, so
                // a store that will be refused leaves its file untouched.
                let mut ro = opts.pool_options();
                ro.read_only = true;
                let probe = Arc::new(Pool::open(&path, &ro)?);
                if !crate::recover::validate(probe.clone(), &opts)? {
                    // An open that scans the log (after a crash, or with
                    // no usable image) may refuse the store for corruption
                    // no crash tore: run the whole open on the read-only
                    // mapping first, so a refusal comes before the writable
                    // open touches the header. The scan runs twice, once
                    // in memory.
                    let ro_opts = Options {
                        read_only: true,
                        ..opts.clone()
                    };
                    let dry = Store::open_pool_with(probe, ro_opts, false)?;
                    let _ = dry.close();
                } else {
                    // Unmapped before the writable open: the check read
                    // every record of the image and every key's log entry
                    // through this mapping, and its pages would otherwise
                    // stay in the process beside the writable mapping's
                    // while the image loads (932 MiB at 10M keys).
                    drop(probe);
                }
                // Every check passed on the read-only open, under the lock
                // held since: the writable open's engine skips the walks
                // that only check (`Pool::prechecked`).
                let pool = Pool::open_locked_checked(lock, &opts.pool_options())?;
                // The image's records were checked by `validate`, under
                // the lock held since.
                let mut s = Store::open_pool_with(Arc::new(pool), opts, true)?;
                s.dir = Some(dir.to_path_buf());
                return Ok(s);
            }
        } else {
            if opts.read_only {
                return Err(Error::InvalidArgument(format!(
                    "no store at {} to open read-only",
                    dir.display()
                )));
            }
            std::fs::create_dir_all(dir).map_err(|e| {
                Error::Pool(pmem::Error::Io {
                    what: "creating the store directory".into(),
                    path: Some(dir.to_path_buf()),
                    source: e,
                })
            })?;
            Pool::create(&path, &opts.pool_options())?
        };
        let mut s = Store::open_pool(Arc::new(pool), opts)?;
        s.dir = Some(dir.to_path_buf());
        Ok(s)
    }

    /// Opens (or formats, if it has no root) a store in `pool`.
    pub fn open_pool(pool: Arc<Pool>, opts: Options) -> Result<Store> {
        Store::open_pool_with(pool, opts, false)
    }

    fn open_pool_with(pool: Arc<Pool>, opts: Options, image_checked: bool) -> Result<Store> {
        opts.validate()?;
        if pool.layout() != LAYOUT {
            return Err(Error::InvalidArgument(format!(
                "the pool holds a {:?}, not a store",
                pool.layout()
            )));
        }
        let t0 = std::time::Instant::now();
        let fresh = pool.aux_root() == 0;
        let root = if fresh {
            crate::pindex::check_unformatted(&pool)?;
            create_root(&pool, &opts)?
        } else {
            pool.aux_root()
        };
        let (inner, from, entries) = crate::recover::open(pool, root, opts, fresh, image_checked)?;
        let mut inner = inner;
        inner.opened_from = from;
        inner.recovered_entries = entries;
        inner.open_ms = t0.elapsed().as_secs_f64() * 1e3;
        let store = Store {
            inner: Arc::new(inner),
            gc_thread: Mutex::new(None),
            dir: None,
        };
        store.start_background();
        Ok(store)
    }

    /// The salvage path behind `pmhash check --repair`: opens the store
    /// pool file at `path` writable (no store may have it open) and drops
    /// every stretch of corrupt log bytes that makes an open refuse the
    /// store, as invalid filler entries (or zeros at the end of a sealed
    /// file). Returns exactly what was dropped (nothing: the file is not
    /// written). The next open rebuilds the index from the log.
    pub fn repair(path: &Path) -> Result<Vec<crate::recover::Dropped>> {
        let mut o = Options::default().pool_options();
        o.read_only = true;
        let probe = Arc::new(Pool::open(path, &o)?);
        if probe.layout() != LAYOUT {
            return Err(Error::InvalidArgument(format!(
                "{} holds a {:?} pool, not a store",
                path.display(),
                probe.layout()
            )));
        }
        // A dry run on the read-only (copy-on-write) mapping: a store with
        // nothing to drop is never opened writable.
        if crate::recover::repair(probe, true)?.is_empty() {
            return Ok(Vec::new());
        }
        o.read_only = false;
        crate::recover::repair(Arc::new(Pool::open(path, &o)?), false)
    }

    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The durability the store was opened with.
    pub fn durability(&self) -> Durability {
        self.inner.opts.durability
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.inner.pool
    }

    /// The maintenance thread: builds the ordered index after an open,
    /// applies its queued changes, and runs GC in `GcMode::Background`.
    fn start_background(&self) {
        let weak = Arc::downgrade(&self.inner);
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let stop2 = stop.clone();
        let h = std::thread::Builder::new()
            .name("pmhash-store".into())
            .spawn(move || {
                let mut tick = 0u64;
                let mut busy = false;
                loop {
                    {
                        let (m, cv) = &*stop2;
                        let g = m.lock().expect("gc stop lock");
                        let (g, _) = cv
                            .wait_timeout(g, std::time::Duration::from_millis(2))
                            .expect("gc stop lock");
                        if *g {
                            return;
                        }
                    }
                    let Some(inner) = weak.upgrade() else { return };
                    if inner.closed.load(Ordering::Acquire) {
                        return;
                    }
                    if inner.index.eager {
                        inner.index.build_tree();
                    }
                    inner.index.apply_pending();
                    inner.index.collect();
                    for _ in 0..8 {
                        if !crate::recover::account_one(&inner) {
                            break;
                        }
                    }
                    tick += 1;
                    // Every 50 ms, and at once again while the last run
                    // found work: under overwrite-heavy load files fill
                    // faster than one run every 50 ms reclaims them.
                    if (busy || tick.is_multiple_of(25))
                        && inner.opts.gc == GcMode::Background
                        && !inner.pool.is_read_only()
                    {
                        busy = matches!(crate::gc::run(&inner, usize::MAX, true), Ok(n) if n > 0);
                    }
                }
            })
            .expect("spawn gc thread");
        *self.gc_thread.lock().expect("gc thread lock") = Some((h, stop));
    }

    fn stop_background(&self) {
        if let Some((h, stop)) = self.gc_thread.lock().expect("gc thread lock").take() {
            self.inner.stopping.store(true, Ordering::Release);
            let (m, cv) = &*stop;
            *m.lock().expect("gc stop lock") = true;
            cv.notify_all();
            let _ = h.join();
        }
    }

    fn writable(&self) -> Result<()> {
        if self.inner.pool.is_read_only() {
            return Err(Error::InvalidArgument("store is open read-only".into()));
        }
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::InvalidArgument("store is closed".into()));
        }
        Ok(())
    }

    /// Inserts or replaces.
    #[inline]
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.write(key, Some(value), Want::Any)
            .map(|_| ())
            .map_err(|e| *e)
    }

    /// Inserts a new key; `Ok(false)` (nothing written) if it is present.
    #[inline]
    pub fn insert(&self, key: &[u8], value: &[u8]) -> Result<bool> {
        self.write(key, Some(value), Want::Absent).map_err(|e| *e)
    }

    /// Replaces the value of a present key; `Ok(false)` if absent.
    #[inline]
    pub fn update(&self, key: &[u8], value: &[u8]) -> Result<bool> {
        self.write(key, Some(value), Want::Present).map_err(|e| *e)
    }

    /// Removes `key`; `Ok(false)` if absent.
    #[inline]
    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        self.write(key, None, Want::Present).map_err(|e| *e)
    }

    /// One write. Its order is built so that nothing after the entry's
    /// fence is a locked instruction or a fence: such an instruction waits
    /// for the entry's write-back to finish, while plain stores after an
    /// `sfence` retire at once (the fence only keeps them from being seen
    /// before the write-back). The write-back then overlaps the rest of
    /// this write and the start of the next one, whose index miss is
    /// issued before its first fence (the pin). What needs a locked
    /// instruction — the stripe, the point map's shard (reserved), the
    /// version, the active file's lock, the tree's queue, the old entry's
    /// accounting — comes before the fence; after it come the index
    /// commit (plain stores), the unlocks (plain stores), and the cache
    /// update only when the cache is on.
    ///
    /// The error is boxed so that the result fits two registers: a result
    /// returned through memory, read back by the caller with a wider load
    /// than the stores that wrote it, cannot be forwarded from the store
    /// buffer and waits for those stores to reach the cache, which after
    /// the `sfence` means waiting for the entry's write-back (perf put 15%
    /// of a put's samples there, in the benchmark's caller).
    fn write(
        &self,
        key: &[u8],
        value: Option<&[u8]>,
        want: Want,
    ) -> std::result::Result<bool, Box<Error>> {
        check_key(key)?;
        if let Some(v) = value {
            check_value(v)?;
        }
        self.writable()?;
        let s = &*self.inner;
        crate::gc::pace(s);
        let hash = key_hash(key);
        let here = s.numa.current();
        // The index bucket's miss and the log tail's start before the pin,
        // whose fence waits for the previous write's flush: they overlap
        // that wait, each other, and the stripe lock.
        s.index.prefetch(hash);
        s.log.prefetch_tail(
            here,
            cluster_of(hash, s.log.clusters),
            entry_len(key.len(), value.map_or(0, <[u8]>::len)),
        );
        // One pin for the whole write: the point map's and the log's own
        // pins nest in it and cost no fence each.
        let _p = s.epochs.pin();
        s.raf.note_op();
        let _k = s.index.stripes.lock(hash);
        let held = s.index.reserve(key, hash);
        let old = held.current();
        match (want, old) {
            (Want::Absent, Some(_)) | (Want::Present, None) => return Ok(false),
            _ => {}
        }
        if value.is_none() && s.in_place_deletes {
            if let Some(o) = old.filter(|&o| s.history_is_dead(o)) {
                // A delete of an entry with no valid history marks the
                // entry itself invalid: no `del` entry, so no new log bytes
                // and nothing for GC to mark later (its file is all dead
                // once every key in it is deleted). Recovery keeps the
                // highest-version valid entry of a key; with this one
                // invalid and nothing older valid, the key is absent.
                if let Some(f) = s.log.file_at(vaddr_off(o)) {
                    s.account_replaced(&f, o, held.current_len());
                }
                s.numa.count_write(vaddr_node(o), here);
                let cache = !s.raf.writes_may_skip();
                // persist: the mark (flushed in mark_invalid) before the
                // index forgets the key and before the delete returns
                // (acknowledged => durable); the one fence orders it.
                s.log.mark_invalid(vaddr_off(o));
                s.log.pool.fence();
                let changed = s
                    .index
                    .commit(held, key, hash, o, None, false, &mut |h, p| {
                        s.append_ovf(h, p)
                    })?;
                s.after_index(key, hash, None, o, here, changed, cache);
                return Ok(true);
            }
        }
        let (e, old_file) = s.stage(key, hash, value, old)?;
        let staged = s.log.append_flushed(here, &e, &s.numa)?;
        // Before the fence (see above): the accounting of the old entry
        // and of a del entry (never live data), the tree's queue, and
        // whether the cache needs this write.
        if let (Some(f), Some(o)) = (&old_file, old) {
            s.account_replaced(f, o, held.current_len());
        }
        drop(old_file);
        if value.is_none() {
            staged
                .file()
                .dead
                .fetch_add(entry_len(key.len(), 0), Ordering::Relaxed);
        }
        let queued = value.is_some() && s.index.queue_insert_early(&held, key, hash);
        let cache = !s.raf.writes_may_skip();
        // persist: the entry (flushed in append_flushed) before the index
        // and the cache name it, so a reader never returns a value a crash
        // could take back (I1, CRASH-PATTERNS #6); the commit fences it.
        let va = staged.commit();
        let changed = s
            .index
            .commit(held, key, hash, va, value, queued, &mut |h, p| {
                s.append_ovf(h, p)
            })?;
        s.after_index(key, hash, value, va, here, changed, cache);
        Ok(true)
    }

    /// Puts every pair, in order (a later pair of the same key wins), with
    /// one fence for the whole batch instead of one per pair: the group
    /// commit `pmhash serve` uses for pipelined `SET`s and `MSET`.
    ///
    /// Every pair is checked before anything is written. When the call
    /// returns `Ok`, every pair is durable (under `Strict`) and visible.
    /// The batch is not atomic: a crash during the call may keep any subset
    /// of its pairs, and a reader may see some pairs before others. On an
    /// error the pairs before the failing one are put, and the error says
    /// how many ([`BatchError::done`]); a bad key or value fails the batch
    /// before anything is written.
    pub fn put_batch(&self, pairs: &[(&[u8], &[u8])]) -> std::result::Result<(), BatchError> {
        let ops: Vec<(&[u8], Option<&[u8]>)> = pairs.iter().map(|&(k, v)| (k, Some(v))).collect();
        self.write_batch(&ops)
    }

    /// As [`put_batch`](Self::put_batch), with deletes: `(key, None)`
    /// deletes `key` (nothing is written for a key that is absent at that
    /// point of the batch). One fence for all of them: `pmhash serve`'s
    /// `EXEC` commits a transaction's writes with it.
    pub fn write_batch(
        &self,
        ops: &[(&[u8], Option<&[u8]>)],
    ) -> std::result::Result<(), BatchError> {
        let pairs = ops;
        let none = |error| BatchError { done: 0, error };
        for (k, v) in pairs {
            check_key(k).map_err(none)?;
            if let Some(v) = v {
                check_value(v).map_err(none)?;
            }
        }
        self.writable().map_err(none)?;
        let s = &*self.inner;
        crate::gc::pace(s);
        let here = s.numa.current();
        let hashes: Vec<u64> = pairs.iter().map(|(k, _)| key_hash(k)).collect();
        // Every key's stripe is held until the index names its new entry,
        // as a single write holds its key's (taken sorted: no deadlock with
        // another batch; GC holds one stripe at a time).
        let _k = s.index.stripes.lock_all(hashes.iter().copied());
        let _p = s.epochs.pin();
        let mut done: Vec<Unpublished> = Vec::with_capacity(pairs.len());
        // What pair i left the index naming: its entry's address (None
        // for a delete, or a pair not reached yet).
        let mut addr_of: Vec<Option<u64>> = vec![None; pairs.len()];
        // Where pair i's key appeared before in the batch, if it did.
        let earlier: Vec<Option<usize>> = if pairs.len() <= 32 {
            (0..pairs.len())
                .map(|i| (0..i).rev().find(|&j| pairs[j].0 == pairs[i].0))
                .collect()
        } else {
            let mut last: HashMap<&[u8], usize> = HashMap::with_capacity(pairs.len());
            (0..pairs.len())
                .map(|i| last.insert(pairs[i].0, i))
                .collect()
        };
        let mut r = Ok(());
        let mut start = 0;
        while start < pairs.len() && r.is_ok() {
            // A run ends before the first key it already holds: a repeated
            // key's entry must name (h_addr) the one before it, whose
            // address is known only once appended.
            let mut end = start + 1;
            while end < pairs.len() && !matches!(earlier[end], Some(j) if j >= start) {
                end += 1;
            }
            // Independent misses the CPU can overlap, where one key at a
            // time would wait for each in turn: every key's index bucket,
            // log tail (the append's stores would otherwise miss) and cache
            // bucket (locked after the fence, one key after another), then
            // every candidate entry that confirms a key, then the lookups
            // (current addresses), then a touch of each old entry's header
            // (read again when the old entry is accounted dead).
            for i in (start..end).filter(|&i| earlier[i].is_none()) {
                s.index.prefetch(hashes[i]);
                s.log.prefetch_tail(
                    here,
                    cluster_of(hashes[i], s.log.clusters),
                    entry_len(pairs[i].0.len(), pairs[i].1.map_or(0, <[u8]>::len)),
                );
                s.raf.prefetch(hashes[i]);
            }
            for i in (start..end).filter(|&i| earlier[i].is_none()) {
                s.index.prefetch_candidates(pairs[i].0, hashes[i]);
            }
            let cur: Vec<Option<u64>> = (start..end)
                .map(|i| match earlier[i] {
                    // Written in an earlier run.
                    Some(j) => addr_of[j],
                    None => s.index.get_hashed(pairs[i].0, hashes[i]),
                })
                .collect();
            for o in cur.iter().flatten() {
                s.log.touch(vaddr_off(*o));
            }
            let mut staged = Vec::with_capacity(end - start);
            let mut olds = Vec::with_capacity(end - start);
            let mut which = Vec::with_capacity(end - start);
            for (i, &old) in (start..end).zip(&cur) {
                let (k, v) = pairs[i];
                if v.is_none() && old.is_none() {
                    // A delete of an absent key writes nothing.
                    continue;
                }
                s.raf.note_op();
                match s.stage(k, hashes[i], v, old) {
                    Ok((e, f)) => {
                        staged.push(e);
                        olds.push((old, f));
                        which.push(i);
                    }
                    Err(e) => {
                        r = Err(e);
                        break;
                    }
                }
            }
            let mut out = Vec::with_capacity(staged.len());
            // persist: every entry of the run with one fence (inside
            // append_batch) before the index and the cache name any of
            // them (I1, CRASH-PATTERNS #6).
            let appended = s.log.append_batch(here, &staged, &mut out, &s.numa);
            if r.is_ok() {
                r = appended;
            }
            for (((va, file), (old, old_file)), i) in out.into_iter().zip(olds).zip(which) {
                addr_of[i] = pairs[i].1.map(|_| va);
                done.push((i, old, old_file, va, file));
            }
            start = end;
        }
        // Pairs before the first one not written: every pair of the runs
        // done (a skipped delete counts as done).
        let n = if r.is_ok() {
            pairs.len()
        } else {
            done.last().map_or(0, |d| d.0 + 1)
        };
        for (i, old, old_file, va, file) in done {
            let (k, v) = pairs[i];
            s.publish(k, hashes[i], v, old, old_file.as_deref(), va, &file, here)
                .map_err(|error| BatchError { done: i, error })?;
        }
        r.map_err(|error| BatchError { done: n, error })
    }

    /// The value of `key`. A value whose log entry fails its checksum is
    /// an `Err(Corrupt)` naming the entry (see `Options::verify_checksums`).
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        check_key(key)?;
        let mut out = Vec::new();
        Ok(self.get_into(key, &mut out)?.then_some(out))
    }

    /// Copies the value of `key` into `out`; false if absent (an `Err`
    /// as [`get`](Self::get)'s).
    pub fn get_into(&self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        if key.len() > MAX_KEY {
            return Ok(false);
        }
        let s = &*self.inner;
        let hash = key_hash(key);
        // The bucket's miss starts before the pin, whose fence would hold
        // it back until the fence completes.
        s.index.prefetch(hash);
        let p = s.epochs.pin();
        let mut known = None;
        if let (8, Some(m)) = (key.len(), s.index.inline_map()) {
            // The 8-byte fast path: one probe of the point index, which
            // holds an 8-byte value inline; the cache and the log only for
            // a longer value.
            match m.get8_pinned(hash, &p) {
                Got::Absent => return Ok(false),
                Got::Value(_, v) => {
                    out.clear();
                    out.extend_from_slice(&v.to_le_bytes());
                    return Ok(true);
                }
                Got::Addr(va) => known = Some(va),
            }
        }
        self.get_slow(key, hash, known, out, &p)
    }

    /// Copies the value of `key` into the front of `out` and returns the
    /// value's length; `None` if absent. A value longer than `out` fills
    /// it and is cut there (the length returned is still the whole
    /// value's). Allocates nothing: an 8-byte key whose 8-byte value the
    /// point index holds inline is one probe and one copy, and any other
    /// value goes through a buffer the thread keeps.
    ///
    /// The fast path is [`get_into`](Self::get_into)'s with nothing
    /// around it: with 2M keys a get waits for one cache miss, and gets
    /// overlap their misses only while the instructions between two of
    /// them fit the CPU's out-of-order window (docs/benchmarks.md,
    /// "Why a get's length matters: the out-of-order window").
    #[inline]
    pub fn get_into_slice(&self, key: &[u8], out: &mut [u8]) -> Result<Option<usize>> {
        let s = &*self.inner;
        if let (Ok(k), Some(m)) = (<&[u8; 8]>::try_from(key), s.index.inline_map()) {
            let hash = key_hash(k);
            m.prefetch(hash);
            let p = s.epochs.pin();
            match m.get8_pinned(hash, &p) {
                Got::Absent => return Ok(None),
                Got::Value(_, v) => {
                    let n = out.len().min(8);
                    out[..n].copy_from_slice(&v.to_le_bytes()[..n]);
                    return Ok(Some(8));
                }
                // A longer value, in the log: the general path below.
                Got::Addr(_) => {}
            }
        }
        self.get_into_slice_slow(key, out)
    }

    /// [`get_into_slice`](Self::get_into_slice) of a value not inline, through the
    /// thread's buffer.
    #[cold]
    #[inline(never)]
    fn get_into_slice_slow(&self, key: &[u8], out: &mut [u8]) -> Result<Option<usize>> {
        thread_local!(static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) });
        BUF.with(|b| {
            let mut v = b.borrow_mut();
            if !self.get_into(key, &mut v)? {
                return Ok(None);
            }
            let n = out.len().min(v.len());
            out[..n].copy_from_slice(&v[..n]);
            Ok(Some(v.len()))
        })
    }

    /// A get past the point index's inline values: the RAF cache, then the
    /// log entry (at `known` when the point index gave it). `_p` pins the
    /// log while the entry is read.
    fn get_slow(
        &self,
        key: &[u8],
        hash: u64,
        known: Option<u64>,
        out: &mut Vec<u8>,
        _p: &Pin<'_>,
    ) -> Result<bool> {
        let s = &*self.inner;
        let here = s.numa.current();
        let sampled = match s.raf.probe(key, hash, here) {
            Probe::Hit(v) => {
                *out = v;
                return Ok(true);
            }
            Probe::Miss { sampled } => sampled,
            Probe::Off => false,
        };
        let va = match known {
            Some(va) => va,
            None => match s.index.lookup(key, hash)? {
                Some(va) => va,
                None => return Ok(false),
            },
        };
        s.read_entry(key, hash, va, sampled, here, out)
    }

    /// The values of `keys`, in order, into `out` (cleared first): what
    /// `get` would return for each. Looks every key up in the index, then
    /// touches every entry, then reads them, so the cache misses of a batch
    /// overlap instead of queueing (`pmhash serve` uses it for pipelined
    /// GETs). A corrupt entry fails the call (as [`get`](Self::get)).
    pub fn get_many(&self, keys: &[&[u8]], out: &mut Vec<Option<Vec<u8>>>) -> Result<()> {
        out.clear();
        let s = &*self.inner;
        let here = s.numa.current();
        let inlines = s.index.inlines();
        let _p = s.epochs.pin();
        // None: a key too long to be present.
        let hashes: Vec<Option<u64>> = keys
            .iter()
            .map(|k| (k.len() <= MAX_KEY).then(|| key_hash(k)))
            .collect();
        // The lookups' misses overlap: every bucket, then every candidate
        // entry that confirms a key, then the lookups below.
        for h in hashes.iter().flatten() {
            s.index.prefetch(*h);
        }
        for (key, h) in keys.iter().zip(&hashes) {
            if let Some(h) = h {
                s.index.prefetch_candidates(key, *h);
            }
        }
        // (position, hash, sampled, v_addr if known) of the keys the index
        // and the cache did not answer.
        let mut todo = Vec::with_capacity(keys.len());
        for (i, (key, hash)) in keys.iter().zip(&hashes).enumerate() {
            out.push(None);
            let Some(hash) = *hash else {
                continue;
            };
            let mut known = None;
            if key.len() == 8 && inlines {
                match s.index.get8(key, hash, &_p) {
                    Got::Absent => continue,
                    Got::Value(_, v) => {
                        out[i] = Some(v.to_le_bytes().to_vec());
                        continue;
                    }
                    Got::Addr(va) => known = Some(va),
                }
            }
            match s.raf.probe(key, hash, here) {
                Probe::Hit(v) => out[i] = Some(v),
                Probe::Miss { sampled } => todo.push((i, hash, sampled, known)),
                Probe::Off => todo.push((i, hash, false, known)),
            }
        }
        let vas: Vec<Option<u64>> = todo
            .iter()
            .map(|&(i, h, _, known)| match known {
                Some(va) => Ok(Some(va)),
                None => s.index.lookup(keys[i], h),
            })
            .collect::<Result<_>>()?;
        for va in vas.iter().flatten() {
            s.log.touch(vaddr_off(*va));
        }
        for (&(i, hash, sampled, _), va) in todo.iter().zip(vas) {
            let Some(va) = va else { continue };
            let mut v = Vec::new();
            if s.read_entry(keys[i], hash, va, sampled, here, &mut v)? {
                out[i] = Some(v);
            }
        }
        Ok(())
    }

    /// Up to `limit` pairs with `start <= key < end` (`end` None: to the
    /// last key), in key order. Values are read by the reader threads of
    /// the node that holds each entry when `scan_readers` > 0.
    pub fn scan(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        check_key(start)?;
        if let Some(e) = end {
            check_key(e)?;
        }
        crate::scan::scan(&self.inner, start, end, limit)
    }

    /// Up to `limit` keys with `start <= key < end` (`end` None: to the
    /// last key), in key order, without reading their values.
    pub fn scan_keys(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>> {
        check_key(start)?;
        if let Some(e) = end {
            check_key(e)?;
        }
        crate::scan::keys(&self.inner, start, end, limit)
    }

    /// Makes every completed write durable (a no-op under `Strict`).
    pub fn sync(&self) -> Result<()> {
        let s = &*self.inner;
        if s.opts.durability == Durability::Relaxed && !s.pool.is_read_only() {
            for f in s.log.snapshot() {
                let _g = s.log.active[s.log.pair(f.node, f.cluster)].lock();
                s.log.sync_file(&f);
            }
        }
        if let crate::index::Point::Engine(p) = s.index.point() {
            p.engine.sync()?;
        }
        Ok(())
    }

    /// Runs GC now: reclaims up to `max_files` files past the threshold.
    /// Returns how many were reclaimed.
    pub fn gc(&self, max_files: usize) -> Result<usize> {
        self.writable()?;
        crate::gc::run(&self.inner, max_files, false)
    }

    /// Clean shutdown: writes the index image so the next open skips the
    /// log scan, then marks the pool clean. The store refuses writes after.
    pub fn close(&self) -> Result<()> {
        self.close_with(false)
    }

    /// [`close`](Self::close) for an owner that is done with the store: the
    /// DRAM point index is freed shard by shard as the image is written,
    /// so the close never holds the whole index and the whole image at
    /// once (at 10M 8-byte keys: 512 MiB of index, 305 of image).
    pub fn close_and_free(self) -> Result<()> {
        self.close_with(true)
    }

    fn close_with(&self, release: bool) -> Result<()> {
        self.stop_background();
        if self.inner.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        if self.inner.pool.is_read_only() {
            return Ok(());
        }
        self.sync()?;
        match self.inner.index.point() {
            // The engine's clean close is the store's: nothing to rebuild.
            crate::index::Point::Engine(p) => p.engine.close()?,
            crate::index::Point::Dram(..) => {
                crate::recover::write_image(&self.inner, release)?;
                self.inner.pool.close()?;
            }
        }
        Ok(())
    }

    pub fn len(&self) -> u64 {
        self.inner.keys.get().max(0) as u64
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn stats(&self) -> StoreStats {
        let s = &*self.inner;
        let files = s.log.snapshot();
        let log_bytes: u64 = files.iter().map(|f| f.used()).sum();
        let dead: u64 = files.iter().map(|f| f.dead.load(Ordering::Relaxed)).sum();
        let live = log_bytes.saturating_sub(dead);
        let (lr, rr, lw, rw) = s.numa.counts();
        let (hits, items) = s.raf.stats();
        let (changes, nanos, index_dram) = s.index.structural();
        StoreStats {
            keys: self.len(),
            files: files.len() as u64,
            log_bytes,
            live_bytes: live,
            // Undefined (infinite) when the log holds only dead entries.
            space_amplification: match (log_bytes, live) {
                (0, _) => 1.0,
                (_, 0) => f64::INFINITY,
                (l, v) => l as f64 / v as f64,
            },
            pm_bytes: s.pool.stats().bytes_in_use,
            gc_runs: s.gc_runs.load(Ordering::Relaxed),
            files_reclaimed: s.log.files_freed.load(Ordering::Relaxed),
            entries_relocated: s.relocated.load(Ordering::Relaxed),
            entries_marked: s.marked.load(Ordering::Relaxed),
            raf_enabled: s.raf.is_enabled(),
            raf_hits: hits,
            raf_items: items,
            local_reads: lr,
            remote_reads: rr,
            local_writes: lw,
            remote_writes: rw,
            nodes: s.log.nodes,
            clusters: s.log.clusters,
            opened_from: s.opened_from,
            open_ms: s.open_ms,
            recovered_entries: s.recovered_entries,
            structural_changes: changes,
            structural_nanos: nanos,
            index_dram_bytes: index_dram,
        }
    }

    /// Read-only verification: every file and entry parses, the index
    /// names each key's newest valid entry. Returns keys and reachable PM
    /// bytes.
    pub fn check(&self) -> Result<(u64, u64)> {
        crate::recover::check(&self.inner)
    }

    /// Visits every pair, in no particular order (not a snapshot: a key
    /// written meanwhile may show its old or its new value). `f` may write
    /// to the store: the keys are listed first (about 32 bytes of DRAM
    /// per key), then visited with no lock held, each with its value at
    /// that moment. Each value is read as [`get`](Self::get) reads it: an
    /// entry that fails its checksum (when reads verify:
    /// `Options::verify_checksums`) stops the walk with that `Err(Corrupt)`
    /// naming the file and offset, and its bytes never reach `f`; so does
    /// an index slot of a persistent index that names no well-formed entry.
    pub fn for_each(&self, mut f: impl FnMut(&[u8], &[u8])) -> Result<()> {
        let s = &*self.inner;
        let mut keys = Vec::new();
        {
            // Pinned while the slots are read and their entries confirmed:
            // no file they name is freed and reused meanwhile.
            let _p = s.epochs.pin();
            s.index
                .for_each_checked(|k, _| keys.push(crate::index::IKey::new(k)))?;
        }
        let here = s.numa.current();
        let mut v = Vec::new();
        for k in keys {
            let key = k.as_bytes();
            let hash = key_hash(key);
            // The key's address now (it may have moved or gone since it was
            // listed), read under an epoch so its file stays mapped; `f`
            // runs unpinned.
            let found = {
                let _p = s.epochs.pin();
                match s.index.lookup(key, hash)? {
                    Some(va) => s.read_entry(key, hash, va, false, here, &mut v)?,
                    None => false,
                }
            };
            if found {
                f(key, &v);
            }
        }
        Ok(())
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.stop_background();
    }
}

/// An entry of a batch, appended and not yet published: (pair, old
/// address, old file, address, file).
type Unpublished = (usize, Option<u64>, Option<Arc<LogFile>>, u64, Arc<LogFile>);

/// A [`Store::put_batch`] that stopped: its first `done` pairs are put,
/// the rest are not.
#[derive(Debug)]
pub struct BatchError {
    pub done: usize,
    pub error: Error,
}

impl std::fmt::Display for BatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (after {} pairs of the batch)", self.error, self.done)
    }
}

impl std::error::Error for BatchError {}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Want {
    Any,
    Absent,
    Present,
}

/// Formats the root block of a fresh pool.
fn create_root(pool: &Pool, opts: &Options) -> Result<u64> {
    let nodes = opts
        .nodes
        .or(opts.numa_emulate)
        .unwrap_or_else(detect_nodes)
        .clamp(1, MAX_NODES as u32) as u64;
    let max = pool.max_size().max(pool.size());
    let table_len = (max / opts.extent_size + nodes * opts.clusters as u64 + 16).min(1 << 22);
    let len = root_len(table_len);
    let r = pool.reserve(len, Link::AuxRootPointer)?;
    let off = r.offset();
    pool.zero(off, len as usize);
    let head = [
        ROOT_MAGIC,
        FORMAT,
        nodes,
        opts.clusters as u64,
        opts.extent_size,
        table_len,
        opts.index.code(),
    ];
    for (i, w) in head.iter().enumerate() {
        pool.store_u64(off + 8 * i as u64, *w);
    }
    let name = name_words(opts.index.spec().map_or("", |s| s.name));
    pool.store_u64(off + R_ENGINE, name[0]);
    pool.store_u64(off + R_ENGINE + 8, name[1]);
    pool.store_u64(
        off + R_CHECK,
        words_crc(&root_check_words(pool, off)) as u64,
    );
    pool.store_u64(off + R_NEXT_SEQ, 1);
    pool.store_u64(off + R_VBASE, 1);
    // persist: the whole root before the pool header names it; a crash
    // before set_aux_root leaves the reservation unlinked, and the
    // allocator frees it at the next open.
    pool.persist(off, len as usize);
    pool.set_aux_root(off)?;
    pool.commit(r);
    Ok(off)
}
