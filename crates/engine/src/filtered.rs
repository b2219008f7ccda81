//! [`Filtered`]: any engine behind a DRAM cuckoo filter ([`crate::cuckoo`]),
//! so a lookup of an absent key is answered from DRAM without touching the
//! engine (the ROPHI paper's filter, as a layer). The pool format is the
//! inner engine's; the filter lives only in DRAM and is rebuilt from the
//! engine's keys at open.
//!
//! # Exactness
//!
//! The filter holds one fingerprint per key of the engine, no more (no
//! stale fingerprints accumulate) and no fewer (no false negatives). Each
//! mutating call for a key runs under that key's stripe lock
//! ([`Stripes`]), so the engine's change and the filter's change form one
//! critical section per key:
//!
//! - insert: the engine's insert, then, if it took, the filter's insert;
//! - remove: the engine's remove, then, if it took, the filter's remove;
//! - update: the engine's update only (the key set does not change);
//! - upsert: update, else insert, and the filter's insert when the insert
//!   took.
//!
//! Readers see this order: a key enters the filter only after the engine's
//! insert returned, so a `get` that runs concurrently with the insert may
//! answer `None`, which is allowed because the insert has not returned (the
//! insert linearizes when its key reaches the filter). A key leaves the
//! filter only after the engine's remove returned, so a `get` overlapping a
//! remove may still find the key in the engine, or pass the filter and miss
//! the key in the engine; both are answers the overlapping remove allows.
//!
//! # Growth
//!
//! When the filter passes [`MAX_LOAD`](crate::cuckoo::MAX_LOAD), or an
//! insert finds it [`Full`], a new filter with twice the buckets is built
//! from the engine's `for_each` and swapped in ([`FilterCell::replace`]).
//! The rebuild must see every key and no writer may change the old filter
//! meanwhile, so every mutating call passes a [`WriterGate`] and growth
//! closes it. Lock order: stripe, then gate. A writer whose filter insert
//! was `Full` keeps its stripe (the key's filter state is unresolved, so no
//! other writer of that key may run), leaves the gate, and grows: it closes
//! the gate, which waits only for writers inside, and those already hold
//! their own stripes, so none waits for its. The rebuild reads the key from
//! the engine, so the writer does not insert it again. If another writer
//! installed a new filter first (the generation moved since the `Full`),
//! that filter was built after the engine's insert and holds the key
//! already.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use pmem::Pool;

use crate::cuckoo::{self, CuckooFilter, FilterCell};
use crate::gate::{Inside, WriterGate};
use crate::hash::fmix64;
use crate::sync::Stripes;
use crate::{
    CheckReport, Engine, EngineConfig, EngineKind, EngineSpec, Error, Fixed, Result, Stats,
};

/// Stripe locks serialising the writers of one key.
const STRIPES: usize = 1024;
/// A key-value pair takes at least 16 bytes of PM, so a pool of `n` bytes
/// holds fewer than `n / 16` keys: the first filter is never sized beyond
/// that, whatever `initial_capacity` says.
const MIN_PAIR_BYTES: u64 = 16;

/// A persistent engine's constructor (create or open).
pub(crate) type PoolFn = fn(Arc<Pool>, &EngineConfig) -> Result<Box<dyn Engine>>;

/// See the module documentation.
pub struct Filtered {
    inner: Box<dyn Engine>,
    filter: FilterCell,
    name: &'static str,
    stripes: Stripes,
    writers: WriterGate,
    /// Filters installed by growth (changes only with the writers' gate
    /// closed).
    generation: AtomicU64,
    /// Time spent rebuilding the filter at open, and in growth.
    open_rebuild_ns: u64,
    grow_ns: AtomicU64,
    /// Growths forced by a `Full` insert (the rest were load-triggered).
    full_growths: AtomicU64,
    /// Engine removes whose key had no fingerprint (0 unless exactness was
    /// broken).
    lost: AtomicU64,
}

crate::tallies! {
    /// The filter's figures ([`Filtered::filter_tallies`]).
    pub struct FilterTallies {
        /// Buckets of the filter now.
        buckets: u64 => "filter buckets",
        /// Fingerprints it holds (one per key of the engine).
        fingerprints: u64 => "filter fingerprints",
        /// Fingerprints per slot.
        load: Fixed<4> => "filter load",
        /// The false-positive rate its load and fingerprint width predict.
        expected_fpr: Fixed<6> => "filter expected fpr",
        /// DRAM the filter takes.
        bytes: u64 => "filter bytes",
        /// Cuckoo kicks made by inserts.
        kicks: u64 => "filter kicks",
        /// Filters installed by growth since this handle was made.
        growths: u64 => "filter growths",
        /// Growths forced by a full filter (the rest were load-triggered).
        full_growths: u64 => "filter full growths",
        /// Time to build the filter from the engine's keys at open.
        rebuild_ms: Fixed<3> => "filter rebuild ms",
        /// Time spent growing the filter.
        grow_ms: Fixed<3> => "filter grow ms",
        /// Engine removes whose key had no fingerprint (0 unless exactness
        /// was broken).
        lost_removes: u64 => "filter lost removes",
    }
}

/// The registry entry of a filtered engine: the inner engine's layout (the
/// pool format does not change) and the given constructors. Called by
/// [`filtered_spec!`](crate::filtered_spec), which writes the constructors
/// (plain `fn` pointers cannot capture `inner`).
pub fn spec(
    inner: fn() -> EngineSpec,
    name: &'static str,
    about: &'static str,
    create: PoolFn,
    open: PoolFn,
) -> EngineSpec {
    let layout = match inner().kind {
        EngineKind::Persistent { layout, .. } => layout,
        // Not a pool engine: the constructors refuse it.
        EngineKind::Volatile { .. } => "",
    };
    EngineSpec {
        name,
        about,
        kind: EngineKind::Persistent {
            layout,
            create,
            open,
        },
        reference: false,
    }
}

/// The registry entry for `$inner` (a path to a persistent engine's
/// `fn() -> EngineSpec`) behind a cuckoo filter, named `$name`:
/// `engine::filtered_spec!(level::spec, "level+filter")`.
#[macro_export]
macro_rules! filtered_spec {
    ($inner:path, $name:literal) => {
        $crate::filtered::spec(
            $inner,
            $name,
            "the same engine behind a DRAM cuckoo filter: absent keys answered from DRAM; same pool format, filter rebuilt at open",
            |pool, cfg| $crate::filtered::Filtered::create_boxed($inner, $name, pool, cfg),
            |pool, cfg| $crate::filtered::Filtered::open_boxed($inner, $name, pool, cfg),
        )
    };
}

/// The inner engine's constructors, or an error for a DRAM-only engine.
fn constructors(inner: fn() -> EngineSpec) -> Result<(PoolFn, PoolFn)> {
    let s = inner();
    match s.kind {
        EngineKind::Persistent { create, open, .. } => Ok((create, open)),
        EngineKind::Volatile { .. } => Err(Error::InvalidArgument(format!(
            "{} is not a persistent engine: it cannot be filtered",
            s.name
        ))),
    }
}

impl Filtered {
    /// Formats `pool` with `inner`'s engine and puts an empty filter sized
    /// for `cfg.initial_capacity` (at most what the pool can hold) in front.
    pub fn create(
        inner: fn() -> EngineSpec,
        name: &'static str,
        pool: Arc<Pool>,
        cfg: &EngineConfig,
    ) -> Result<Filtered> {
        let (create, _) = constructors(inner)?;
        let most = pool.max_size().max(pool.size()) / MIN_PAIR_BYTES;
        let e = create(pool, cfg)?;
        let f = CuckooFilter::with_capacity(cfg.initial_capacity.min(most))
            .seeded(cuckoo::random_seed());
        Ok(Filtered::from_parts(e, f, name, 0))
    }

    /// Opens (and recovers) `pool` with `inner`'s engine and builds the
    /// filter from its keys.
    pub fn open(
        inner: fn() -> EngineSpec,
        name: &'static str,
        pool: Arc<Pool>,
        cfg: &EngineConfig,
    ) -> Result<Filtered> {
        let (_, open) = constructors(inner)?;
        Ok(Filtered::wrap(open(pool, cfg)?, name))
    }

    /// [`Filtered::create`], boxed (a registry entry's `create`).
    pub fn create_boxed(
        inner: fn() -> EngineSpec,
        name: &'static str,
        pool: Arc<Pool>,
        cfg: &EngineConfig,
    ) -> Result<Box<dyn Engine>> {
        Ok(Box::new(Filtered::create(inner, name, pool, cfg)?))
    }

    /// [`Filtered::open`], boxed (a registry entry's `open`).
    pub fn open_boxed(
        inner: fn() -> EngineSpec,
        name: &'static str,
        pool: Arc<Pool>,
        cfg: &EngineConfig,
    ) -> Result<Box<dyn Engine>> {
        Ok(Box::new(Filtered::open(inner, name, pool, cfg)?))
    }

    /// Puts a filter in front of `inner`, built from the keys it holds.
    pub fn wrap(inner: Box<dyn Engine>, name: &'static str) -> Filtered {
        let started = Instant::now();
        let f = {
            let e = &*inner;
            let buckets = CuckooFilter::with_capacity(e.len()).buckets();
            cuckoo::build_with_buckets(buckets, cuckoo::random_seed(), 1, &|_, sink| {
                e.for_each(&mut |k, _| sink(k))
            })
        };
        let ns = started.elapsed().as_nanos() as u64;
        Filtered::from_parts(inner, f, name, ns)
    }

    fn from_parts(
        inner: Box<dyn Engine>,
        f: CuckooFilter,
        name: &'static str,
        open_rebuild_ns: u64,
    ) -> Filtered {
        Filtered {
            inner,
            filter: FilterCell::new(f),
            name,
            stripes: Stripes::new(STRIPES),
            writers: WriterGate::new(),
            generation: AtomicU64::new(0),
            open_rebuild_ns,
            grow_ns: AtomicU64::new(0),
            full_growths: AtomicU64::new(0),
            lost: AtomicU64::new(0),
        }
    }

    /// The engine behind the filter, for reading: a write through it
    /// bypasses the filter and breaks its exactness.
    pub fn inner(&self) -> &dyn Engine {
        &*self.inner
    }

    /// Filters installed by growth since this handle was made.
    pub fn growths(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// The filter's own figures now (the inner engine's are its
    /// `tallies()`); `Stats::detail` lists them after the engine's.
    pub fn filter_tallies(&self) -> FilterTallies {
        let f = self.filter.get();
        let ms = |ns: u64| Fixed(ns as f64 / 1e6);
        FilterTallies {
            buckets: f.buckets() as u64,
            fingerprints: f.len(),
            load: Fixed(f.load()),
            expected_fpr: Fixed(f.expected_fpr()),
            bytes: f.bytes(),
            kicks: f.kicks(),
            growths: self.growths(),
            full_growths: self.full_growths.load(Ordering::Relaxed),
            rebuild_ms: ms(self.open_rebuild_ns),
            grow_ms: ms(self.grow_ns.load(Ordering::Relaxed)),
            lost_removes: self.lost.load(Ordering::Relaxed),
        }
    }

    fn stripe(key: u64) -> u64 {
        fmix64(key)
    }

    /// Puts `key`, which the engine has just inserted, into the filter. The
    /// caller holds the key's stripe (kept until the key's filter state is
    /// settled, growth included) and is inside the writers' gate: `gate` is
    /// given up here, before any growth closes the gate.
    fn add(&self, key: u64, gate: Inside<'_>) {
        // No filter is installed while this writer is inside the gate, so
        // the generation read here is the one of the filter it inserts into.
        let seen = self.generation.load(Ordering::Relaxed);
        let (full, over) = {
            let f = self.filter.get();
            match f.insert(key) {
                Ok(()) => (false, f.should_grow()),
                Err(cuckoo::Full) => (true, true),
            }
        };
        drop(gate);
        if over {
            self.grow(seen, full);
        }
    }

    /// Installs a filter with twice the buckets, built from the engine's
    /// keys, unless another writer did since generation `seen` (or, for a
    /// load-triggered growth, the load is no longer too high). The caller
    /// is outside the writers' gate and holds no `FilterRef`.
    fn grow(&self, seen: u64, full: bool) {
        let _closed = self.writers.close();
        if self.generation.load(Ordering::Relaxed) != seen {
            return;
        }
        let (buckets, seed) = {
            let f = self.filter.get();
            if !full && !f.needs_growth() {
                return;
            }
            (f.buckets(), f.seed())
        };
        let started = Instant::now();
        let e = &*self.inner;
        let f = cuckoo::build_with_buckets(buckets.saturating_mul(2), seed, 1, &|_, sink| {
            e.for_each(&mut |k, _| sink(k))
        });
        self.filter.replace(f);
        self.generation.fetch_add(1, Ordering::Relaxed);
        if full {
            self.full_growths.fetch_add(1, Ordering::Relaxed);
        }
        self.grow_ns
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }
}

impl Engine for Filtered {
    fn name(&self) -> &str {
        self.name
    }

    fn insert(&self, key: u64, value: u64) -> Result<bool> {
        let _stripe = self.stripes.lock(Self::stripe(key));
        let gate = self.writers.enter();
        if !self.inner.insert(key, value)? {
            return Ok(false);
        }
        self.add(key, gate);
        Ok(true)
    }

    fn get(&self, key: u64) -> Option<u64> {
        if !self.filter.get().contains(key) {
            return None;
        }
        self.inner.get(key)
    }

    fn update(&self, key: u64, value: u64) -> Result<bool> {
        // The key set does not change, but the engine may move the pair,
        // and a rebuild's `for_each` must not run meanwhile.
        let _gate = self.writers.enter();
        self.inner.update(key, value)
    }

    fn remove(&self, key: u64) -> Result<bool> {
        let _stripe = self.stripes.lock(Self::stripe(key));
        let _gate = self.writers.enter();
        if !self.inner.remove(key)? {
            return Ok(false);
        }
        if !self.filter.get().remove(key) {
            self.lost.fetch_add(1, Ordering::Relaxed);
        }
        Ok(true)
    }

    fn upsert(&self, key: u64, value: u64) -> Result<()> {
        let _stripe = self.stripes.lock(Self::stripe(key));
        loop {
            let gate = self.writers.enter();
            if self.inner.update(key, value)? {
                return Ok(());
            }
            if self.inner.insert(key, value)? {
                self.add(key, gate);
                return Ok(());
            }
            // Under the stripe no other writer of this key runs, so the
            // engine answered "absent" and then "present": try again, as the
            // trait's default does.
        }
    }

    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn stats(&self) -> Stats {
        let mut s = self.inner.stats();
        let f = self.filter.get();
        s.dram_bytes += f.bytes() + self.stripes.bytes();
        // The engine's own changes plus the filter's doublings (rebuilds).
        s.structural_changes += self.growths();
        s.structural_nanos += self.grow_ns.load(Ordering::Relaxed);
        s.detail.extend(self.filter_tallies().detail());
        s
    }

    fn sync(&self) -> Result<()> {
        self.inner.sync()
    }

    fn for_each(&self, f: &mut dyn FnMut(u64, u64)) {
        self.inner.for_each(f)
    }

    /// The engine's check, then the filter against it: every key's
    /// fingerprint present and exactly one fingerprint per key. Writers are
    /// held out meanwhile so the two agree.
    fn check(&self) -> Result<CheckReport> {
        let _closed = self.writers.close();
        let report = self.inner.check()?;
        let f = self.filter.get();
        let mut missing = 0u64;
        let mut example = None;
        self.inner.for_each(&mut |k, _| {
            if !f.contains(k) {
                missing += 1;
                example.get_or_insert(k);
            }
        });
        if let Some(k) = example {
            return Err(Error::Corrupt(format!(
                "the filter misses {missing} keys of the engine (e.g. {k:#x})"
            )));
        }
        if f.len() != report.keys {
            return Err(Error::Corrupt(format!(
                "the filter holds {} fingerprints for {} keys",
                f.len(),
                report.keys
            )));
        }
        Ok(report)
    }

    fn close(&self) -> Result<()> {
        self.inner.close()
    }
}
