//! The store facade: the [`Store`] type, open (create, check, recover),
//! repair, the background thread, sync, GC, close and the figures. Writes
//! go to the writer's node's Nlog (`write.rs`), the DRAM index names each
//! key's newest entry, gets go through the RAF cache (`read.rs`).

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use engine::{Durability, Error, Result};
use pmem::{Link, Pool};

use crate::inner::Inner;
use crate::layout::*;
use crate::numa::detect_nodes;
use crate::options::{GcMode, OpenOptions, Options};
use crate::stats::StoreStats;

/// The most the prefault thread faults in of the point index's coming
/// tables per tick (2 ms): 8 MiB, four huge pages, a few milliseconds of
/// faults on the hosts measured. A doubling wave of every shard comes
/// some 12% of the keys after the first shard passes its warning mark
/// (`point_map.rs`), so this keeps ahead of a wave of up to a few hundred
/// MiB at one writer's insert rate.
const INDEX_WARM_UP_STEP: usize = 8 << 20;

/// The background threads and their stop flag.
struct Background {
    threads: Vec<JoinHandle<()>>,
    stop: Arc<(Mutex<bool>, Condvar)>,
}

/// Moves the calling thread to Linux's idle scheduling class
/// (`SCHED_IDLE`): it runs when a CPU has nothing else to run. Where that
/// is refused, the thread keeps its class.
fn run_only_on_idle_cpus() {
    let p = libc::sched_param { sched_priority: 0 };
    // SAFETY: `p` is a valid sched_param for the call's duration; pid 0 is
    // the calling thread, whose scheduling class only is changed.
    let _ = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &p) };
}

/// A persistent key-value store (see the crate docs).
pub struct Store {
    pub(crate) inner: Arc<Inner>,
    background: Mutex<Option<Background>>,
    dir: Option<PathBuf>,
}

pub(crate) fn check_key(key: &[u8]) -> Result<()> {
    if key.len() > MAX_KEY {
        return Err(Error::InvalidArgument(format!(
            "key of {} bytes exceeds the {MAX_KEY}-byte limit",
            key.len()
        )));
    }
    Ok(())
}

pub(crate) fn check_value(v: &[u8]) -> Result<()> {
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
            if opts.open.read_only {
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
                        create: opts.create.clone(),
                        open: OpenOptions {
                            read_only: true,
                            ..opts.open.clone()
                        },
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
            if opts.open.read_only {
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
            background: Mutex::new(None),
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

    /// The store's directory, `None` for a store on a pool opened directly.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The durability the store was opened with.
    pub fn durability(&self) -> Durability {
        self.inner.opts.open.durability
    }

    /// The pool the store lives in.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.inner.pool
    }

    /// The background threads. The maintenance thread builds the ordered
    /// index after an open, applies its queued changes, frees retired
    /// tables and files, and runs GC in `GcMode::Background`. The prefault
    /// thread, on a writable file-backed pool, faults in the log's pages
    /// ahead of the writers' tails ([`Nlog::prefault_tails`]) at the idle
    /// scheduling class, so that it takes only a CPU no writer wants
    /// (docs/store.md, "The log's pages, faulted in ahead of the writers",
    /// has the forms measured and not kept), and the memory of the DRAM
    /// point index's coming rebuilds ([`Index::warm_up`](crate::index::Index::warm_up)).
    ///
    /// [`Nlog::prefault_tails`]: crate::nlog::Nlog::prefault_tails
    fn start_background(&self) {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let mut threads = vec![self.spawn_ticking("pmhash-store", false, &stop, {
            let mut tick = 0u64;
            let mut busy = false;
            move |inner: &Inner| {
                if inner.index.eager {
                    inner.index.build_tree();
                }
                inner.index.apply_pending();
                inner.index.collect();
                inner.log.files.collect(crate::files::GATHER);
                for _ in 0..8 {
                    if !crate::recover::account_one(inner) {
                        break;
                    }
                }
                tick += 1;
                // Every 50 ms, and at once again while the last run
                // found work: under overwrite-heavy load files fill
                // faster than one run every 50 ms reclaims them.
                if (busy || tick.is_multiple_of(25))
                    && inner.opts.open.gc == GcMode::Background
                    && !inner.pool.is_read_only()
                {
                    busy = matches!(crate::gc::run(inner, usize::MAX, true), Ok(n) if n > 0);
                }
            }
        })];
        let pool = &self.inner.pool;
        if !pool.is_read_only() && matches!(pool.mode(), pmem::Mode::Mapped | pmem::Mode::Dax) {
            let mut ahead = vec![0; self.inner.log.pair_count()];
            threads.push(self.spawn_ticking(
                "pmhash-prefault",
                true,
                &stop,
                move |inner: &Inner| {
                    inner.log.prefault_tails(&mut ahead);
                    inner.index.warm_up(INDEX_WARM_UP_STEP);
                },
            ));
        }
        *self.background.lock().expect("background lock") = Some(Background { threads, stop });
    }

    /// A thread that runs `step` every 2 ms until the store stops or
    /// closes; `idle`: in the idle scheduling class.
    fn spawn_ticking(
        &self,
        name: &str,
        idle: bool,
        stop: &Arc<(Mutex<bool>, Condvar)>,
        mut step: impl FnMut(&Inner) + Send + 'static,
    ) -> JoinHandle<()> {
        let weak = Arc::downgrade(&self.inner);
        let stop = stop.clone();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                if idle {
                    run_only_on_idle_cpus();
                }
                loop {
                    {
                        let (m, cv) = &*stop;
                        let g = m.lock().expect("background stop lock");
                        let (g, _) = cv
                            .wait_timeout(g, std::time::Duration::from_millis(2))
                            .expect("background stop lock");
                        if *g {
                            return;
                        }
                    }
                    let Some(inner) = weak.upgrade() else { return };
                    if inner.closed.load(Ordering::Acquire) {
                        return;
                    }
                    step(&inner);
                }
            })
            .expect("spawn a store background thread")
    }

    fn stop_background(&self) {
        if let Some(b) = self.background.lock().expect("background lock").take() {
            self.inner.stopping.store(true, Ordering::Release);
            let (m, cv) = &*b.stop;
            *m.lock().expect("background stop lock") = true;
            cv.notify_all();
            for h in b.threads {
                let _ = h.join();
            }
        }
    }

    pub(crate) fn writable(&self) -> Result<()> {
        if self.inner.pool.is_read_only() {
            return Err(Error::InvalidArgument("store is open read-only".into()));
        }
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::InvalidArgument("store is closed".into()));
        }
        Ok(())
    }

    /// Makes every completed write durable (a no-op under `Strict`).
    pub fn sync(&self) -> Result<()> {
        let s = &*self.inner;
        if s.opts.open.durability == Durability::Relaxed && !s.pool.is_read_only() {
            for f in s.log.snapshot() {
                let _g = s.log.pairs[s.log.pair(f.node, f.cluster)].active.lock();
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

    /// Keys present.
    pub fn len(&self) -> u64 {
        self.inner.keys.get().max(0) as u64
    }

    /// Whether no key is present.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The store's figures now.
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
            log_prefaulted_bytes: s.log.prefaulted.load(Ordering::Relaxed),
            index_prefaulted_bytes: s.index.warmed(),
        }
    }

    /// Read-only verification: every file and entry parses, the index
    /// names each key's newest valid entry. Returns keys and reachable PM
    /// bytes.
    pub fn check(&self) -> Result<(u64, u64)> {
        crate::recover::check(&self.inner)
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.stop_background();
    }
}

/// Formats the root block of a fresh pool.
fn create_root(pool: &Pool, opts: &Options) -> Result<u64> {
    let nodes = opts
        .create
        .nodes
        .or(opts.open.numa_emulate)
        .unwrap_or_else(detect_nodes)
        .clamp(1, MAX_NODES as u32) as u64;
    let max = pool.max_size().max(pool.size());
    let table_len =
        (max / opts.create.extent_size + nodes * opts.create.clusters as u64 + 16).min(1 << 22);
    let len = root_len(table_len);
    let r = pool.reserve(len, Link::AuxRootPointer)?;
    let off = r.offset();
    pool.zero(off, len as usize);
    let head = [
        ROOT_MAGIC,
        FORMAT,
        nodes,
        opts.create.clusters as u64,
        opts.create.extent_size,
        table_len,
        opts.create.index.code(),
    ];
    for (i, w) in head.iter().enumerate() {
        pool.store_u64(off + 8 * i as u64, *w);
    }
    let name = name_words(opts.create.index.spec().map_or("", |s| s.name));
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
