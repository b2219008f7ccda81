//! The contract every pmhash hash engine implements, the registry entry that
//! lets tools build engines by name, and the crash checker.
//!
//! Keys and values are `u64`; every `u64` key works, 0 and `u64::MAX`
//! included. Engines are `Send + Sync`; readers never write to PM.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use pmem::{Mode, Pool, PoolLock, PoolOptions};

mod bytes;
pub mod crashtest;
pub mod cuckoo;
pub mod filtered;
pub mod gate;
pub mod hash;
pub mod hits;
pub mod hugemem;
pub mod scratch;
pub mod slotarray;
pub mod sync;
mod tally;
#[cfg(feature = "testkit")]
pub mod testkit;

pub use bytes::eq_mask16;
pub use tally::{Figure, Fixed, Pow2};

/// What an engine promises about a mutating call that has returned
/// (ARCHITECTURE.md, "Durability contract").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Durability {
    /// When a mutating call returns its effect survives a crash; a call cut
    /// by a crash is all or nothing.
    #[default]
    Strict,
    /// No fence on the write path: after a crash the structure is
    /// consistent and every key holds a value once written to it, but recent
    /// acknowledged writes may be missing. `sync()` makes all before it durable.
    Relaxed,
}

impl Durability {
    /// The contract's name, as [`Durability::parse`] reads it.
    pub fn name(self) -> &'static str {
        match self {
            Durability::Strict => "strict",
            Durability::Relaxed => "relaxed",
        }
    }
    /// Reads `strict` or `relaxed`.
    pub fn parse(s: &str) -> Result<Durability> {
        match s {
            "strict" => Ok(Durability::Strict),
            "relaxed" => Ok(Durability::Relaxed),
            _ => Err(Error::InvalidArgument(format!(
                "unknown durability {s:?} (expected strict or relaxed)"
            ))),
        }
    }
}

/// Errors an engine returns. Never a panic for bad input or a full pool.
#[derive(Debug)]
pub enum Error {
    /// The pool has no room left; the engine is unchanged and still usable.
    OutOfSpace(String),
    /// The pool layer refused (corrupt, truncated, foreign file, I/O).
    Pool(pmem::Error),
    /// The engine's own structure in the pool is inconsistent.
    Corrupt(String),
    /// A caller error: unknown option, bad parameter.
    InvalidArgument(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::OutOfSpace(m) => write!(f, "out of space: {m}"),
            Error::Pool(e) => write!(f, "{e}"),
            Error::Corrupt(m) => write!(f, "corrupt engine structure: {m}"),
            Error::InvalidArgument(m) => write!(f, "invalid argument: {m}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<pmem::Error> for Error {
    fn from(e: pmem::Error) -> Self {
        match e {
            pmem::Error::OutOfSpace(m) => Error::OutOfSpace(m),
            other => Error::Pool(other),
        }
    }
}

/// A result whose error is the engines' [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Size and shape of an engine, as reported by `stats()`.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Number of keys stored.
    pub len: u64,
    /// Number of key slots the structure has now.
    pub capacity: u64,
    /// `len / capacity`.
    pub load_factor: f64,
    /// Bytes of PM the engine holds (allocated blocks it owns).
    pub pm_bytes: u64,
    /// Bytes of DRAM the engine holds beyond the pool (directories, filters).
    pub dram_bytes: u64,
    /// Structural changes since the engine was created or opened: the
    /// operations that reshape the table rather than store a key (splits,
    /// merges, directory doublings, overflow blocks, level resizes,
    /// expansions, rehashes, filter rebuilds). `docs/benchmarks.md` lists
    /// what each engine counts; 0 for structures that never reshape.
    pub structural_changes: u64,
    /// Wall time spent inside those changes, in nanoseconds, summed over
    /// the threads that made them (see [`StructuralClock`]).
    pub structural_nanos: u64,
    /// Engine-specific figures (levels, segments, resizes, ...), for `inspect`.
    pub detail: Vec<(String, String)>,
}

/// Counts an engine's structural changes and the time spent in them, for
/// [`Stats::structural_changes`] and [`Stats::structural_nanos`]. Meant
/// for rare events only: a change costs two clock reads and two relaxed
/// atomic adds, and nothing on the per-operation path.
#[derive(Debug, Default)]
pub struct StructuralClock {
    changes: std::sync::atomic::AtomicU64,
    nanos: std::sync::atomic::AtomicU64,
}

impl StructuralClock {
    /// Records one change that began at `start` and ends now.
    pub fn record(&self, start: std::time::Instant) {
        self.record_n(1, start);
    }

    /// Records `n` changes (made in one go) that began at `start`.
    pub fn record_n(&self, n: u64, start: std::time::Instant) {
        use std::sync::atomic::Ordering::Relaxed;
        let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.changes.fetch_add(n, Relaxed);
        self.nanos.fetch_add(ns, Relaxed);
    }

    /// Changes recorded so far.
    pub fn changes(&self) -> u64 {
        self.changes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Nanoseconds recorded so far.
    pub fn nanos(&self) -> u64 {
        self.nanos.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// What `check()` found: a read-only walk of the whole structure.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckReport {
    /// Keys found by the walk.
    pub keys: u64,
    /// Bytes of PM blocks reachable from the engine's root. The crash
    /// checker compares this with the allocator's bytes in use: any
    /// difference is a leak.
    pub reachable_bytes: u64,
}

/// One hash index with u64 keys and values.
pub trait Engine: Send + Sync {
    /// Short name, as given to `--engine`.
    fn name(&self) -> &str;
    /// Inserts a new key. `Ok(false)` if the key is already present (nothing
    /// is changed).
    fn insert(&self, key: u64, value: u64) -> Result<bool>;
    /// The value of `key`, if present.
    fn get(&self, key: u64) -> Option<u64>;
    /// Looks up `keys[i]` into `out[i]` for every `i` (equal lengths).
    /// Engines that can overlap the cache misses of many keys override it;
    /// the default is one `get` after another.
    fn get_many(&self, keys: &[u64], out: &mut [Option<u64>]) {
        assert_eq!(
            keys.len(),
            out.len(),
            "get_many: keys and out differ in length"
        );
        for (k, o) in keys.iter().zip(out.iter_mut()) {
            *o = self.get(*k);
        }
    }
    /// Replaces the value of an existing key. `Ok(false)` if absent.
    fn update(&self, key: u64, value: u64) -> Result<bool>;
    /// Removes `key`. `Ok(false)` if absent.
    fn remove(&self, key: u64) -> Result<bool>;
    /// Inserts or replaces. The default retries until one of update and
    /// insert takes effect, so a concurrent insert or remove of the same key
    /// cannot make it return without writing.
    fn upsert(&self, key: u64, value: u64) -> Result<()> {
        loop {
            if self.update(key, value)? || self.insert(key, value)? {
                return Ok(());
            }
        }
    }
    /// Number of keys.
    fn len(&self) -> u64;
    /// Whether the engine holds no key.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Capacity, load factor, memory.
    fn stats(&self) -> Stats;
    /// Makes every completed call durable (a no-op under `Strict`).
    fn sync(&self) -> Result<()> {
        Ok(())
    }
    /// Calls `f` for every stored pair, straight from the structure: a key
    /// stored twice is visited twice. Not linearizable with writers.
    fn for_each(&self, f: &mut dyn FnMut(u64, u64));
    /// [`for_each`](Self::for_each) split into `parts` parts: calls `f` for
    /// the pairs of part `part` (`0..parts`), so that the parts, run on
    /// threads at once, together visit what one `for_each` visits. The
    /// default puts every pair in part 0.
    fn for_each_part(&self, part: usize, parts: usize, f: &mut dyn FnMut(u64, u64)) {
        let _ = parts;
        if part == 0 {
            self.for_each(f);
        }
    }
    /// Read-only verification of the whole structure.
    fn check(&self) -> Result<CheckReport>;
    /// Clean shutdown: persists everything and marks the pool clean so the
    /// next open can skip crash recovery. Further calls are not allowed.
    fn close(&self) -> Result<()> {
        self.sync()
    }
}

/// Options that every engine understands.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// What a returned mutating call promises.
    pub durability: Durability,
    /// Expected number of keys; engines size their first table from it.
    pub initial_capacity: u64,
    /// Threads that will use the engine (a sizing hint for locks, shards
    /// and per-thread structures).
    pub threads: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            durability: Durability::Strict,
            initial_capacity: 1024,
            threads: 1,
        }
    }
}

/// Formats a fresh pool for an engine (a registry entry's `create`).
pub type CreateFn = fn(Arc<Pool>, &EngineConfig) -> Result<Box<dyn Engine>>;
/// Opens (and recovers) an existing pool (a registry entry's `open`).
pub type OpenFn = fn(Arc<Pool>, &EngineConfig) -> Result<Box<dyn Engine>>;
type VolatileFn = fn(&EngineConfig) -> Box<dyn Engine>;

/// How to build an engine: the tools keep a list of these.
#[derive(Clone, Copy)]
pub enum EngineKind {
    /// A persistent engine living in a pool.
    Persistent {
        /// Layout id written into the pool header.
        layout: &'static str,
        /// Formats a fresh pool.
        create: CreateFn,
        /// Opens (and recovers) an existing pool.
        open: OpenFn,
    },
    /// A DRAM-only structure (baselines): no pool.
    Volatile {
        /// Builds the structure.
        create: VolatileFn,
    },
}

/// A named engine for the registry.
#[derive(Clone, Copy)]
pub struct EngineSpec {
    /// The name tools know the engine by.
    pub name: &'static str,
    /// One line saying what the engine is.
    pub about: &'static str,
    /// How to build it.
    pub kind: EngineKind,
    /// A structure for testing the tools (the crash checker's reference and
    /// its deliberately broken twin), not an index to use: left out of the
    /// default benchmark.
    pub reference: bool,
}

impl EngineSpec {
    /// Whether the engine lives in a pool.
    pub fn is_persistent(&self) -> bool {
        matches!(self.kind, EngineKind::Persistent { .. })
    }
}

/// Opens the pool file at `path` and the engine in it with `open` (a
/// registry entry's `open`, or an engine's own), so that a refused open
/// leaves the file byte for byte as it was.
///
/// A writable file open takes the pool's exclusive lock first, then opens
/// the pool read-only (a copy-on-write mapping) and runs `open` on it:
/// every check of the header, the allocator and the engine's structure
/// (the clean-shutdown cross-checks included), and in-memory recovery.
/// Only when that succeeds does it open the pool writable under the same
/// lock and run `open` again, this time for real; that second open is
/// told the checks passed ([`Pool::prechecked`]), so a clean open reads
/// the whole table once, not twice. A crash recovery is done twice (once
/// in memory).
/// A read-only or in-memory open runs `open` once.
pub fn open_file(
    open: OpenFn,
    path: &Path,
    popts: &PoolOptions,
    cfg: &EngineConfig,
) -> Result<(Arc<Pool>, Box<dyn Engine>)> {
    open_file_with(open, path, popts, cfg)
}

/// [`open_file`] for any open function, e.g. an engine's own typed
/// `open`, so the caller keeps the concrete engine type.
pub fn open_file_with<E>(
    open: impl Fn(Arc<Pool>, &EngineConfig) -> Result<E>,
    path: &Path,
    popts: &PoolOptions,
    cfg: &EngineConfig,
) -> Result<(Arc<Pool>, E)> {
    if popts.read_only || !matches!(popts.mode, Mode::Dax | Mode::Mapped) {
        let pool = Arc::new(Pool::open(path, popts)?);
        let e = open(pool.clone(), cfg)?;
        return Ok((pool, e));
    }
    let lock = PoolLock::exclusive(path)?;
    {
        let ro = PoolOptions {
            read_only: true,
            ..popts.clone()
        };
        let probe = Arc::new(Pool::open(path, &ro)?);
        drop(open(probe, cfg)?);
    }
    // The probe passed under this lock: the writable open may skip the
    // walks that only check (`Pool::prechecked`).
    let pool = Arc::new(Pool::open_locked_checked(lock, popts)?);
    let e = open(pool.clone(), cfg)?;
    Ok((pool, e))
}

/// `f(0) + f(1) + ... + f(n - 1)`, split over the machine's threads (up
/// to 8): the item counts a clean open checks walk a whole table.
pub fn par_sum(n: usize, f: impl Fn(usize) -> u64 + Sync) -> u64 {
    let threads = std::thread::available_parallelism()
        .map(|t| t.get())
        .unwrap_or(1)
        .clamp(1, 8)
        .min(n.div_ceil(1024).max(1));
    if threads == 1 {
        return (0..n).map(&f).sum();
    }
    let per = n.div_ceil(threads);
    let f = &f;
    std::thread::scope(|sc| {
        let parts: Vec<_> = (0..threads)
            .map(|t| sc.spawn(move || (t * per..((t + 1) * per).min(n)).map(f).sum::<u64>()))
            .collect();
        parts
            .into_iter()
            .map(|p| p.join().expect("a counting thread panicked"))
            .sum()
    })
}

/// The message tail of a clean-shutdown cross-check that failed: the pool
/// was damaged after its clean close, and `pmhash check` says where.
pub fn damaged_after_close(pool: &Pool) -> String {
    let file = pool
        .path()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "POOL".into());
    format!("the pool was damaged after its clean close; run `pmhash check {file}` for details")
}

/// The persistent engines of this crate (the crash checker's reference
/// structures). The binary's registry adds the hash engines and baselines.
pub fn reference_engines() -> Vec<EngineSpec> {
    vec![slotarray::spec(), slotarray::misordered_spec()]
}
