//! ROPHI (Xiao et al., *Read-Optimized Persistent Hash Index for Query
//! Acceleration through Fingerprint Filtering and Lock-Free Prefetching*)
//! on the pmhash pool: a chained hash table of 64-byte buckets in PM behind
//! a DRAM cuckoo filter ([`engine::cuckoo`]). Negative gets end in the
//! filter and touch no PM; positive gets walk the chain without locks and
//! with the next bucket prefetched as soon as its address is known.
//! Design, persist orders and every decision: `docs/engines/rophi.md`;
//! on-disk format: [`layout`].
//!
//! The files, as in every engine: `lib.rs` (the type, its spec, tallies,
//! create, and the helpers every path shares), [`layout`] (the bytes in
//! the pool), `ops.rs` (get, get_many, insert, update, remove), `grow.rs`
//! (doubling of the head array, committed by one 8-byte store, and the
//! filter's rebuilds from PM with every thread), `recover.rs` (open in its
//! numbered phases, crash recovery, the filter rebuild, `check`), `api.rs`
//! (the `Engine` impl).

#![forbid(unsafe_code)]

use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use engine::cuckoo::{CuckooFilter, FilterCell};
use engine::gate::WriterGate;
use engine::sync::Counter;
use engine::{EngineConfig, EngineKind, EngineSpec, Error, Result};
use pmem::{Link, Pool};

mod api;
mod grow;
pub mod layout;
mod ops;
mod recover;

use layout::*;

/// Layout id written in the pool header.
pub const LAYOUT: &str = "rophi";

/// Region locks (DRAM seqlocks); head bucket `bn` uses lock `bn mod LOCKS`,
/// so a lock covers `heads / LOCKS` head buckets and their chains (the
/// paper's `LockSize`). 4096 words: 32 KiB, cache-resident for readers.
pub(crate) const LOCKS: usize = 4096;

/// The registry entry.
pub fn spec() -> EngineSpec {
    EngineSpec {
        reference: false,
        name: "rophi",
        about: "ROPHI: PM chained table (64-byte buckets) behind a DRAM cuckoo filter, lock-free prefetching reads",
        kind: EngineKind::Persistent {
            layout: LAYOUT,
            create: |pool, cfg| Ok(Box::new(Rophi::create(pool, cfg)?)),
            open: |pool, cfg| Ok(Box::new(Rophi::open(pool, cfg)?)),
        },
    }
}

/// The live counters behind [`Tallies`] (what [`Rophi::tallies`]
/// snapshots).
#[derive(Default)]
pub(crate) struct Counters {
    pub resizes: AtomicU64,
    /// Head-array doublings and filter rebuilds, and the time spent in
    /// them (`Stats::structural_*`).
    pub structural: engine::StructuralClock,
    pub filter_growths: AtomicU64,
    pub filter_refreshes: AtomicU64,
    pub filter_full: AtomicU64,
    pub chain_inserts: AtomicU64,
    pub slabs_added: AtomicU64,
    pub released: AtomicU64,
    pub retries: AtomicU64,
    pub recovery_us: AtomicU64,
    pub filter_build_us: AtomicU64,
    pub filter_build_threads: AtomicU64,
    pub resize_us: AtomicU64,
    pub resize_failures: AtomicU64,
    pub prepared: AtomicU64,
    pub ahead_taken: AtomicU64,
    pub ahead_given_back: AtomicU64,
    pub ahead_failures: AtomicU64,
    /// Bytes faulted in ahead, added to by the thread that faults them in.
    pub prefaulted: Arc<AtomicU64>,
}

engine::tallies! {
    /// A snapshot of what a ROPHI table holds and has done since it was
    /// opened ([`Rophi::tallies`]); `Stats::detail` lists it.
    pub struct Tallies {
        /// Buckets of the live head array.
        head_buckets: engine::Pow2 => "head buckets",
        /// Overflow-slab buckets in chains.
        chain_buckets_in_use: u64 => "chain buckets in use",
        /// Overflow-slab buckets on the free list.
        chain_buckets_free: u64 => "chain buckets free",
        /// Keys per head bucket.
        keys_per_head: engine::Fixed<3> => "keys per head",
        /// Head buckets each region lock covers.
        heads_per_region_lock: u64 => "heads per region lock",
        /// Buckets of the DRAM filter.
        filter_buckets: u64 => "filter buckets",
        /// The filter's load.
        filter_load: engine::Fixed<4> => "filter load",
        /// The filter's expected false-positive rate.
        filter_expected_fpr: engine::Fixed<5> => "filter expected fpr",
        /// Bytes of the filter.
        filter_bytes: u64 => "filter bytes",
        /// Filter doublings.
        filter_growths: u64 => "filter growths",
        /// Filter rebuilds at the same size, which drop deleted keys'
        /// fingerprints.
        filter_refreshes: u64 => "filter refreshes",
        /// Inserts that found the filter full.
        filter_full_on_insert: u64 => "filter full on insert",
        /// Milliseconds spent building the filter.
        filter_build_ms: engine::Fixed<1> => "filter build ms",
        /// Threads the last filter build used.
        filter_build_threads: u64 => "filter build threads",
        /// Head-array doublings.
        resizes: u64 => "resizes",
        /// Milliseconds spent in resizes.
        resize_ms: engine::Fixed<1> => "resize ms",
        /// Resizes that failed for room in the pool.
        resize_failures: u64 => "resize failures (pool full)",
        /// Tables reserved ahead of their doubling (`PREPARE_AT`).
        tables_prepared: u64 => "tables prepared ahead",
        /// Doublings that took the table reserved ahead for them.
        ahead_taken: u64 => "doublings into a table prepared ahead",
        /// Tables reserved ahead given back for room a slab needed.
        ahead_given_back: u64 => "tables prepared ahead given back for room",
        /// Reservations ahead, or their faulting threads, that failed.
        ahead_failures: u64 => "preparations ahead failed",
        /// MiB of those tables' pages faulted in before their doubling.
        prefaulted_mib: engine::Fixed<2> => "pages faulted in ahead MiB",
        /// Inserts that went to a chain bucket.
        chain_inserts: u64 => "chain inserts",
        /// Overflow slabs added.
        slabs_added: u64 => "slabs added",
        /// Empty chain buckets the open gave back to the free list.
        released_at_open: u64 => "empty chain buckets released at open",
        /// Reads retried because a writer held their region.
        reader_retries: u64 => "reader retries",
        /// Milliseconds the last open took.
        open_ms: engine::Fixed<1> => "open ms",
    }
}

/// A ROPHI table in a pool. See the crate documentation.
pub struct Rophi {
    pub(crate) pool: Arc<Pool>,
    pub(crate) root: u64,
    pub(crate) seed: u64,
    /// The live table's descriptor; readers validate against it.
    pub(crate) desc: AtomicU64,
    /// Region seqlocks: odd while a writer holds the region.
    pub(crate) locks: Box<[AtomicU64]>,
    /// Every mutating call is inside; a resize or a filter rebuild closes it.
    pub(crate) gate: WriterGate,
    /// Serialises resizes, filter rebuilds and `for_each`.
    pub(crate) resize_mx: Mutex<()>,
    /// The next doubling's table, reserved ahead (`grow::Ahead`).
    pub(crate) ahead: Mutex<Option<grow::Ahead>>,
    /// The head-array size (k) the last preparation was for, tried or done.
    pub(crate) ahead_k: AtomicU64,
    /// Whether a table reserved ahead gets a thread that faults its pages
    /// in: only for several writers (`EngineConfig::threads`), whom a
    /// doubling stops all at once (`docs/engines/rophi.md`, "The next
    /// table, ahead").
    pub(crate) fault_ahead: bool,
    /// Free buckets of the live table's overflow slabs (DRAM; rebuilt by
    /// open from what the chains reach).
    pub(crate) free: Mutex<Vec<u64>>,
    pub(crate) slab_total: AtomicU64,
    /// After a resize failed for room, the count at which to try again.
    pub(crate) resize_retry_at: AtomicU64,
    /// The DRAM filter: a fingerprint of every stored key, and of keys
    /// deleted since it was last rebuilt from PM (deletes leave theirs).
    pub(crate) filter: FilterCell,
    pub(crate) len: Counter,
    pub(crate) closed: AtomicBool,
    pub(crate) t: Counters,
}

pub(crate) fn corrupt(m: impl Into<String>) -> Error {
    Error::Corrupt(m.into())
}

/// The hash seed of a pool: derived from its uuid (and checked at open).
pub(crate) fn seed_of(pool: &Pool) -> u64 {
    pool.identity().seed() ^ 0x524f_5048_4900_0001
}

/// A held region lock; released (made even again) on drop.
pub(crate) struct Region<'a> {
    w: &'a AtomicU64,
}

impl Drop for Region<'_> {
    #[inline]
    fn drop(&mut self) {
        let v = self.w.load(Ordering::Relaxed);
        self.w.store(v + 1, Ordering::Release);
    }
}

impl Rophi {
    /// Formats a fresh pool with a head array for `initial_capacity` keys.
    ///
    /// A crash during `create` leaves a root block whose table word is 0:
    /// open refuses it and the next `create` gives its blocks back.
    pub fn create(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Rophi> {
        if pool.is_read_only() {
            return Err(Error::InvalidArgument("pool is read-only".into()));
        }
        if pool.root() != 0 {
            if !recover::interrupted_create(&pool) {
                return Err(Error::InvalidArgument("pool already holds a table".into()));
            }
            recover::undo_create(&pool)?;
        }
        let want = (cfg.initial_capacity as f64 / CREATE_LOAD).ceil().max(1.0) as u64;
        let k = want
            .next_power_of_two()
            .trailing_zeros()
            .clamp(MIN_K, MAX_K);
        let need = ROOT_BYTES + T_HEADS + (BUCKET << k);
        let room = pool.max_size().max(pool.size());
        if need > room {
            return Err(Error::OutOfSpace(format!(
                "a table for {} keys needs {need} bytes, the pool can hold {room}",
                cfg.initial_capacity
            )));
        }
        let seed = seed_of(&pool);
        let root_r = pool.reserve(ROOT_BYTES, Link::RootPointer)?;
        let root = root_r.offset();
        pool.zero(root, ROOT_BYTES as usize);
        pool.store_u64(root, ROOT_MAGIC);
        pool.store_u64(root + R_SEED, seed);
        // persist: the root block (table word 0 = "under construction")
        // before the pool root names it; every block create takes after
        // this is linked from it, so a crash leaks nothing.
        pool.persist(root, ROOT_BYTES as usize);
        if let Err(e) = pool.set_root(root) {
            pool.cancel(root_r);
            return Err(e.into());
        }
        pool.commit(root_r);
        let table = match grow::new_table(&pool, root, k, root + R_TABLE, true) {
            Ok(t) => t,
            Err(e) => {
                recover::undo_create(&pool)?;
                return Err(e);
            }
        };
        let rp = Rophi::handle(
            pool,
            root,
            seed,
            table,
            CuckooFilter::with_capacity(cfg.initial_capacity.min(room / BUCKET))
                .seeded(engine::cuckoo::random_seed()),
            cfg,
        );
        Ok(rp)
    }

    /// Opens a table: crash recovery unless the pool was closed cleanly,
    /// then the filter rebuilt from PM with every available thread. A
    /// refused open writes nothing.
    pub fn open(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Rophi> {
        recover::open(pool, cfg)
    }

    pub(crate) fn handle(
        pool: Arc<Pool>,
        root: u64,
        seed: u64,
        table: Table,
        filter: CuckooFilter,
        cfg: &EngineConfig,
    ) -> Rophi {
        Rophi {
            pool,
            root,
            seed,
            desc: AtomicU64::new(table.desc()),
            locks: (0..LOCKS).map(|_| AtomicU64::new(0)).collect(),
            gate: WriterGate::new(),
            resize_mx: Mutex::new(()),
            ahead: Mutex::new(None),
            ahead_k: AtomicU64::new(0),
            fault_ahead: cfg.threads > 1,
            free: Mutex::new(Vec::new()),
            slab_total: AtomicU64::new(0),
            resize_retry_at: AtomicU64::new(0),
            filter: FilterCell::new(filter),
            len: Counter::default(),
            closed: AtomicBool::new(false),
            t: Counters::default(),
        }
    }

    #[inline]
    pub(crate) fn hash(&self, key: u64) -> u64 {
        engine::hash::fmix64(key ^ self.seed)
    }

    #[inline]
    pub(crate) fn table(&self) -> Table {
        Table::from_desc(self.desc.load(Ordering::Acquire))
    }

    #[inline]
    pub(crate) fn lock_word(&self, bn: u64) -> &AtomicU64 {
        &self.locks[bn as usize & (LOCKS - 1)]
    }

    /// Takes the region lock of head bucket `bn` (spins while held).
    #[inline]
    pub(crate) fn lock_region(&self, bn: u64) -> Region<'_> {
        let w = self.lock_word(bn);
        loop {
            let v = w.load(Ordering::Relaxed);
            if v & 1 == 0
                && w.compare_exchange_weak(v, v + 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                // The odd version is visible before any store to the region.
                fence(Ordering::Release);
                return Region { w };
            }
            std::hint::spin_loop();
        }
    }

    pub(crate) fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::InvalidArgument("the table was closed".into()));
        }
        if self.pool.is_read_only() {
            return Err(Error::InvalidArgument("the pool is open read-only".into()));
        }
        Ok(())
    }

    /// The eight words of the bucket at `off`, if `off` names a line of the
    /// pool (a stale reader may follow a pointer of a freed table).
    #[inline]
    pub(crate) fn bucket_checked(&self, off: u64) -> Option<&[std::sync::atomic::AtomicU64]> {
        if off.is_multiple_of(LINE)
            && off
                .checked_add(BUCKET)
                .is_some_and(|e| e <= self.pool.size())
        {
            Some(self.pool.words(off, 8))
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests;
