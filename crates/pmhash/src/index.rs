//! [`Index`]: a persistent hash index from `u64` keys to `u64` values in
//! one pool file, run by an engine chosen by name ([`AnyEngine`]) or by
//! type ([`engines`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use engine::{
    CheckReport, Durability, Engine, EngineConfig, EngineKind, EngineSpec, Error, Result, Stats,
};
use pmem::{Mode, Pool, PoolOptions};

/// The engines an [`Index`] can be given by type: `Index<Hmeh>` calls the
/// engine directly, with no dynamic dispatch.
pub mod engines {
    pub use hmeh::Hmeh;
    pub use level::Level;
    pub use pass::Pass;
    pub use rophi::Rophi;
}

/// The persistent index engines, by name: each engine's plain entry, then
/// the same behind a DRAM cuckoo filter (same pool layout; the unfiltered
/// entry of a layout comes first, so it is the one a nameless open takes).
fn specs() -> Vec<EngineSpec> {
    vec![
        pass::spec(),
        pass::spec_var(),
        pass::spec_dense(),
        hmeh::spec(),
        rophi::spec(),
        level::spec(),
        engine::filtered_spec!(pass::spec, "pass+filter"),
        engine::filtered_spec!(pass::spec_var, "pass-var+filter"),
        engine::filtered_spec!(pass::spec_dense, "pass-dense+filter"),
        engine::filtered_spec!(hmeh::spec, "hmeh+filter"),
        engine::filtered_spec!(level::spec, "level+filter"),
    ]
}

/// The engine names [`IndexOptions::engine`] takes, each with one line
/// saying what it is.
pub fn index_engines() -> Vec<(&'static str, &'static str)> {
    specs().iter().map(|s| (s.name, s.about)).collect()
}

fn find(name: &str) -> Result<EngineSpec> {
    let all = specs();
    all.iter().find(|s| s.name == name).copied().ok_or_else(|| {
        let names: Vec<&str> = all.iter().map(|s| s.name).collect();
        Error::InvalidArgument(format!(
            "unknown index engine {name:?}; known: {}",
            names.join(", ")
        ))
    })
}

fn constructors(spec: &EngineSpec) -> (&'static str, engine::CreateFn, engine::OpenFn) {
    match spec.kind {
        EngineKind::Persistent {
            layout,
            create,
            open,
        } => (layout, create, open),
        // `specs()` lists persistent engines only.
        EngineKind::Volatile { .. } => unreachable!("index engines are persistent"),
    }
}

mod sealed {
    use super::*;

    /// What [`IndexEngine`](super::IndexEngine) needs of an engine type;
    /// private, so that only this crate's engine types implement it.
    #[allow(unreachable_pub)] // the sealed-trait pattern: public, unnameable
    pub trait Sealed: Engine + Sized {
        /// The pool layout the engine writes; `None`: any (chosen at open).
        fn layout() -> Option<&'static str>;
        fn create(name: Option<&str>, pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Self>;
        fn open(name: Option<&str>, pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Self>;
    }
}

/// An engine an [`Index`] can run: [`AnyEngine`] (chosen by name) or one
/// of the [`engines`] (chosen by type). Implemented by this crate only.
pub trait IndexEngine: sealed::Sealed {}

macro_rules! typed_engine {
    ($ty:ty, $krate:ident) => {
        impl sealed::Sealed for $ty {
            fn layout() -> Option<&'static str> {
                Some($krate::LAYOUT)
            }
            fn create(_: Option<&str>, pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Self> {
                <$ty>::create(pool, cfg)
            }
            fn open(_: Option<&str>, pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Self> {
                <$ty>::open(pool, cfg)
            }
        }
        impl IndexEngine for $ty {}
    };
}

typed_engine!(engines::Hmeh, hmeh);
typed_engine!(engines::Level, level);
typed_engine!(engines::Pass, pass);
typed_engine!(engines::Rophi, rophi);

/// An engine chosen at run time by name ([`IndexOptions::engine`]) or by
/// the pool it opens: calls go through a `dyn` engine.
pub struct AnyEngine(Box<dyn Engine>);

impl Engine for AnyEngine {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn insert(&self, key: u64, value: u64) -> Result<bool> {
        self.0.insert(key, value)
    }
    fn get(&self, key: u64) -> Option<u64> {
        self.0.get(key)
    }
    fn get_many(&self, keys: &[u64], out: &mut [Option<u64>]) {
        self.0.get_many(keys, out)
    }
    fn update(&self, key: u64, value: u64) -> Result<bool> {
        self.0.update(key, value)
    }
    fn remove(&self, key: u64) -> Result<bool> {
        self.0.remove(key)
    }
    fn upsert(&self, key: u64, value: u64) -> Result<()> {
        self.0.upsert(key, value)
    }
    fn len(&self) -> u64 {
        self.0.len()
    }
    fn stats(&self) -> Stats {
        self.0.stats()
    }
    fn sync(&self) -> Result<()> {
        self.0.sync()
    }
    fn for_each(&self, f: &mut dyn FnMut(u64, u64)) {
        self.0.for_each(f)
    }
    fn for_each_part(&self, part: usize, parts: usize, f: &mut dyn FnMut(u64, u64)) {
        self.0.for_each_part(part, parts, f)
    }
    fn check(&self) -> Result<CheckReport> {
        self.0.check()
    }
    fn close(&self) -> Result<()> {
        self.0.close()
    }
}

impl sealed::Sealed for AnyEngine {
    fn layout() -> Option<&'static str> {
        None
    }
    fn create(name: Option<&str>, pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Self> {
        let spec = find(name.unwrap_or(DEFAULT_ENGINE))?;
        let (layout, create, _) = constructors(&spec);
        debug_assert_eq!(pool.layout(), layout);
        Ok(AnyEngine(create(pool, cfg)?))
    }
    fn open(name: Option<&str>, pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Self> {
        let spec = match name {
            Some(n) => find(n)?,
            None => specs()
                .into_iter()
                .find(|s| constructors(s).0 == pool.layout())
                .ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "the pool holds a {:?} structure, which is not an index engine's",
                        pool.layout()
                    ))
                })?,
        };
        let (layout, _, open) = constructors(&spec);
        if layout != pool.layout() {
            return Err(Error::InvalidArgument(format!(
                "the pool holds a {:?} structure, not engine {}'s ({layout:?})",
                pool.layout(),
                spec.name
            )));
        }
        Ok(AnyEngine(open(pool, cfg)?))
    }
}
impl IndexEngine for AnyEngine {}

/// The engine a nameless [`IndexOptions::create`] uses.
const DEFAULT_ENGINE: &str = "pass";

/// How an [`Index`] is created or opened: a builder.
///
/// ```
/// use pmhash::{Durability, Index, Mode};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let path = std::env::temp_dir().join(format!("pmhash-opts-{}.pool", std::process::id()));
/// # let _ = std::fs::remove_file(&path);
/// let index = Index::options()
///     .engine("hmeh")
///     .durability(Durability::Relaxed)
///     .expected_keys(100_000)
///     .pool_size(128 << 20)
///     .max_pool_size(4 << 30)
///     .mode(Mode::Mapped)
///     .create(&path)?;
/// for k in 0..1000 {
///     index.insert(k, k * k)?;
/// }
/// index.sync()?; // Relaxed: durable from here on
/// index.close()?;
/// # std::fs::remove_file(&path)?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct IndexOptions {
    engine: Option<String>,
    cfg: EngineConfig,
    pool: PoolOptions,
}

impl Default for IndexOptions {
    fn default() -> Self {
        IndexOptions {
            engine: None,
            cfg: EngineConfig::default(),
            pool: PoolOptions {
                max_size: DEFAULT_MAX_POOL,
                ..PoolOptions::default()
            },
        }
    }
}

/// The size a pool may grow to unless [`IndexOptions::max_pool_size`] says
/// otherwise: the file is extended as the table grows, never beyond this.
const DEFAULT_MAX_POOL: u64 = 64 << 30;

impl IndexOptions {
    /// The defaults: engine `pass` at create (at open, the pool's own),
    /// strict durability, a table sized for 1024 keys that grows, a 64 MiB
    /// pool file that grows up to 64 GiB, [`Mode::Mapped`].
    pub fn new() -> IndexOptions {
        IndexOptions::default()
    }

    /// The engine, by name (see [`index_engines`](crate::index_engines)).
    /// At create it picks the engine (default `pass`); at open it must be
    /// one that reads the pool's layout (`E+filter` puts a filter in front
    /// of engine `E`'s pool); unset, an open takes the pool's own engine.
    /// A name is checked when the index is created or opened.
    pub fn engine(mut self, name: &str) -> Self {
        self.engine = Some(name.to_string());
        self
    }

    /// What a returned mutating call promises (default strict).
    pub fn durability(mut self, d: Durability) -> Self {
        self.cfg.durability = d;
        self
    }

    /// Keys the table is sized for at create (it grows past them).
    pub fn expected_keys(mut self, n: u64) -> Self {
        self.cfg.initial_capacity = n;
        self
    }

    /// Threads that will use the index (a sizing hint).
    pub fn threads(mut self, n: usize) -> Self {
        self.cfg.threads = n.max(1);
        self
    }

    /// Pool file size at create, in bytes (default 64 MiB).
    pub fn pool_size(mut self, bytes: u64) -> Self {
        self.pool.size = bytes;
        self
    }

    /// The pool file grows up to this size (default 64 GiB); a table that
    /// needs more gets [`Error::OutOfSpace`].
    pub fn max_pool_size(mut self, bytes: u64) -> Self {
        self.pool.max_size = bytes;
        self
    }

    /// How the pool is mapped (default [`Mode::Mapped`]).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.pool.mode = mode;
        self
    }

    /// Opens without ever writing the file (a private copy-on-write
    /// mapping; crash recovery runs in memory). Writes are refused.
    pub fn read_only(mut self, yes: bool) -> Self {
        self.pool.read_only = yes;
        self
    }

    /// Creates a new pool file at `path` (refused if one exists) with the
    /// engine named by [`engine`](Self::engine).
    pub fn create(&self, path: impl AsRef<Path>) -> Result<Index> {
        self.create_as(path)
    }

    /// Opens the pool file at `path` and recovers it if it was not closed.
    pub fn open(&self, path: impl AsRef<Path>) -> Result<Index> {
        self.open_as(path)
    }

    /// Opens the pool at `path` if the file exists, else creates it.
    pub fn open_or_create(&self, path: impl AsRef<Path>) -> Result<Index> {
        if path.as_ref().exists() {
            self.open(path)
        } else {
            self.create(path)
        }
    }

    /// [`create`](Self::create) with the engine given by type:
    /// `create_as::<Hmeh>(path)`.
    pub fn create_as<E: IndexEngine>(&self, path: impl AsRef<Path>) -> Result<Index<E>> {
        let path = path.as_ref();
        self.check_typed::<E>()?;
        if self.pool.read_only {
            return Err(Error::InvalidArgument(
                "a read-only index cannot be created".into(),
            ));
        }
        let layout = match E::layout() {
            Some(l) => l,
            None => constructors(&find(self.engine.as_deref().unwrap_or(DEFAULT_ENGINE))?).0,
        };
        let popts = PoolOptions {
            layout: layout.to_string(),
            ..self.pool.clone()
        };
        // persist: the pool's header (layout, clean state) is written by
        // `Pool::create` before the engine formats its root in it, and the
        // engine publishes its root last (each engine's own create order).
        let pool = Arc::new(Pool::create(path, &popts)?);
        let engine = match E::create(self.engine.as_deref(), pool, &self.cfg) {
            Ok(e) => e,
            Err(e) => {
                // A pool this call created and could not format is removed,
                // so a retry does not meet a half-made file.
                let _ = std::fs::remove_file(path);
                return Err(e);
            }
        };
        Ok(Index::new(engine, path, false))
    }

    /// [`open`](Self::open) with the engine given by type: the pool must
    /// hold that engine's layout.
    pub fn open_as<E: IndexEngine>(&self, path: impl AsRef<Path>) -> Result<Index<E>> {
        let path = path.as_ref();
        self.check_typed::<E>()?;
        let popts = PoolOptions {
            layout: E::layout().unwrap_or("").to_string(),
            ..self.pool.clone()
        };
        let name = self.engine.as_deref();
        let (_, engine) = engine::open_file_with(
            |pool, cfg| E::open(name, pool, cfg),
            path,
            &popts,
            &self.cfg,
        )?;
        Ok(Index::new(engine, path, self.pool.read_only))
    }

    fn check_typed<E: IndexEngine>(&self) -> Result<()> {
        match (E::layout(), &self.engine) {
            (Some(_), Some(name)) => Err(Error::InvalidArgument(format!(
                "engine {name:?} named, but the index's type chooses its engine"
            ))),
            _ => Ok(()),
        }
    }
}

/// A persistent hash index from `u64` keys to `u64` values, in one pool
/// file. Every `u64` is a valid key (0 and `u64::MAX` included).
///
/// `Index` (that is, `Index<AnyEngine>`) runs the engine chosen by name or
/// by the pool; `Index<E>` for a type of [`engines`] calls that engine
/// directly. Create or open one with [`Index::options`] or [`Index::open`].
pub struct Index<E: IndexEngine = AnyEngine> {
    engine: E,
    path: PathBuf,
    read_only: bool,
    closed: AtomicBool,
}

impl Index {
    /// The builder, with the defaults of [`IndexOptions::new`].
    pub fn options() -> IndexOptions {
        IndexOptions::new()
    }

    /// Opens the pool file at `path` with the engine that wrote it and the
    /// default options (recovering it if it was not closed).
    pub fn open(path: impl AsRef<Path>) -> Result<Index> {
        IndexOptions::new().open(path)
    }
}

impl<E: IndexEngine> Index<E> {
    fn new(engine: E, path: &Path, read_only: bool) -> Index<E> {
        Index {
            engine,
            path: path.to_path_buf(),
            read_only,
            closed: AtomicBool::new(false),
        }
    }

    /// Refuses a write to a closed or read-only index: a read-only pool is
    /// a private mapping, so a write there would be lost, not persisted.
    fn writable(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::InvalidArgument(format!(
                "{} was opened read-only",
                self.path.display()
            )));
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::InvalidArgument("the index is closed".into()));
        }
        Ok(())
    }

    /// The engine's name (`"pass"`, `"hmeh+filter"`, ...).
    pub fn engine_name(&self) -> &str {
        self.engine.name()
    }

    /// The pool file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Inserts a new key: `Ok(false)` (and nothing changed) if it is
    /// already present.
    pub fn insert(&self, key: u64, value: u64) -> Result<bool> {
        self.writable()?;
        self.engine.insert(key, value)
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: u64) -> Option<u64> {
        self.engine.get(key)
    }

    /// Whether `key` is present.
    pub fn contains_key(&self, key: u64) -> bool {
        self.engine.get(key).is_some()
    }

    /// Looks up every key of `keys` at once, into a vector of the same
    /// length: engines that can overlap the memory misses of many keys
    /// (`rophi`) do.
    pub fn get_many(&self, keys: &[u64]) -> Vec<Option<u64>> {
        let mut out = vec![None; keys.len()];
        self.engine.get_many(keys, &mut out);
        out
    }

    /// Replaces the value of a present key: `Ok(false)` if it is absent.
    pub fn update(&self, key: u64, value: u64) -> Result<bool> {
        self.writable()?;
        self.engine.update(key, value)
    }

    /// Inserts `key` or replaces its value.
    pub fn upsert(&self, key: u64, value: u64) -> Result<()> {
        self.writable()?;
        self.engine.upsert(key, value)
    }

    /// Removes `key`: `Ok(false)` if it is absent.
    pub fn remove(&self, key: u64) -> Result<bool> {
        self.writable()?;
        self.engine.remove(key)
    }

    /// Number of keys.
    pub fn len(&self) -> u64 {
        self.engine.len()
    }

    /// Whether the index holds no key.
    pub fn is_empty(&self) -> bool {
        self.engine.is_empty()
    }

    /// Calls `f` for every pair, in no particular order. Not a snapshot:
    /// a pair written while it runs may or may not be visited.
    pub fn for_each(&self, mut f: impl FnMut(u64, u64)) {
        self.engine.for_each(&mut f)
    }

    /// Size, load factor and memory of the table.
    pub fn stats(&self) -> Stats {
        self.engine.stats()
    }

    /// Walks the whole structure read-only and checks it: `Err` names the
    /// first inconsistency found.
    pub fn check(&self) -> Result<u64> {
        Ok(self.engine.check()?.keys)
    }

    /// Makes every completed call durable (under [`Durability::Strict`]
    /// each already is).
    pub fn sync(&self) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        self.writable()?;
        self.engine.sync()
    }

    /// Persists everything and marks the pool clean, so the next open
    /// skips crash recovery; the index is closed after, even on `Err`.
    pub fn close(self) -> Result<()> {
        self.close_inner()
    }

    fn close_inner(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::AcqRel) || self.read_only {
            return Ok(());
        }
        self.engine.close()
    }
}

impl<E: IndexEngine> Drop for Index<E> {
    /// Closes the index (as [`Index::close`], errors ignored: call `close`
    /// to see them).
    fn drop(&mut self) {
        let _ = self.close_inner();
    }
}

impl<E: IndexEngine> std::fmt::Debug for Index<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Index")
            .field("engine", &self.engine.name())
            .field("path", &self.path)
            .field("len", &self.engine.len())
            .finish()
    }
}
