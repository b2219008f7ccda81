//! Helpers shared by the rophi integration tests: pools in every mode with
//! fixed uuids (so the hash seed, hence every chain, repeats run to run),
//! model checks, reopen and crash-reopen helpers, the table's shape read
//! straight from the pool, and pool image patching.

#![allow(dead_code, unused_imports)]

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use engine::{Durability, Engine, EngineConfig};
use pmem::{Mode, Pool, PoolOptions};
use pmhash_rophi::layout::*;
use pmhash_rophi::Rophi;

use engine::testkit::{reopen, Subject};
pub(crate) use engine::testkit::{val, verify_model, version_of, Rng};

mod spec;
pub(crate) use spec::RophiSubject;

pub(crate) const MIB: u64 = 1 << 20;

/// murmur3's finalizer: a bijection, for spreading test keys.
#[allow(unused_imports)]
pub(crate) use engine::hash::fmix64 as fmix;

/// A uuid made from a seed: the table's hash seed repeats run to run.
pub(crate) fn uuid_of(seed: u64) -> [u8; 16] {
    engine::testkit::test_uuid(&RophiSubject::UUID_TAG, seed)
}

pub(crate) fn pool_opts(mode: Mode, size: u64, max_size: u64, seed: u64) -> PoolOptions {
    engine::testkit::pool_opts::<RophiSubject>(mode, size, max_size, seed)
}

/// An in-memory pool (`Volatile` or `Simulated`).
pub(crate) fn mem_pool(mode: Mode, size: u64, max_size: u64, seed: u64) -> Arc<Pool> {
    engine::testkit::mem_pool(&pool_opts(mode, size, max_size, seed))
}

pub(crate) fn cfg(initial_capacity: u64, threads: usize) -> EngineConfig {
    engine::testkit::strict_config(initial_capacity, threads)
}

/// A unique temp pool path, removed on drop.
pub(crate) struct TempPath(engine::testkit::TempPath);

impl TempPath {
    pub(crate) fn new(tag: &str) -> TempPath {
        TempPath(engine::testkit::TempPath::new(
            RophiSubject::TEMP_PREFIX,
            tag,
        ))
    }
    pub(crate) fn path(&self) -> &Path {
        self.0.path()
    }
}

/// `k` of the live head array (`2^k` head buckets).
pub(crate) fn head_k(e: &Rophi) -> u32 {
    e.tallies().head_buckets.0
}

/// Everything the table holds equals `model` (see
/// `engine::testkit::verify_model`: for_each, len, get of every key and of
/// the absent ones, check() with the model's count and no leaked byte).
/// Also: `get_many` of the model's keys and of `absent` agrees.
pub(crate) fn verify(e: &Rophi, pool: &Pool, model: &HashMap<u64, u64>, absent: &[u64], ctx: &str) {
    verify_model(e, pool, model, absent, ctx);
    let mut keys: Vec<u64> = model.keys().copied().collect();
    keys.extend_from_slice(absent);
    let mut out = vec![Some(0xdead); keys.len()];
    e.get_many(&keys, &mut out);
    for (k, o) in keys.iter().zip(&out) {
        assert_eq!(*o, model.get(k).copied(), "{ctx}: get_many of {k:#x}");
    }
}

// ----- reopen (engine::testkit::reopen) ---------------------------------------------------

/// Clean close of a file-backed table, then the file opened again as a new
/// pool. The engine must have been the only other holder of the pool.
pub(crate) fn reopen_file(
    e: Rophi,
    pool: Arc<Pool>,
    path: &Path,
    popts: &PoolOptions,
) -> (Arc<Pool>, Rophi) {
    reopen::reopen_file::<RophiSubject>(e, pool, path, popts)
}

/// A crash right now: the live image of a pool that was never closed,
/// opened as a new volatile pool (recovery runs).
pub(crate) fn crash_reopen_live(pool: &Pool) -> (Arc<Pool>, Rophi) {
    reopen::crash_reopen_live::<RophiSubject>(pool)
}

/// A crash right now of a simulated pool: only what was persisted
/// survives (strict durability: every acknowledged write).
pub(crate) fn crash_reopen_persisted(pool: &Pool) -> (Arc<Pool>, Rophi) {
    reopen::crash_reopen_persisted::<RophiSubject>(pool)
}

// ----- the table's shape, read from the pool ------------------------------------------

/// Offsets of a built table, read straight from the pool (layout.rs).
#[derive(Clone, Debug)]
pub(crate) struct Shape {
    pub root: u64,
    pub table: Table,
    /// Overflow slabs, newest first: (offset, buckets).
    pub slabs: Vec<(u64, u64)>,
    /// Heads that have a chain: (head bucket offset, chain buckets in order).
    pub chains: Vec<(u64, Vec<u64>)>,
    /// Buckets (heads and chain buckets) holding at least one pair.
    pub full_buckets: Vec<u64>,
    pub pool_size: u64,
}

pub(crate) fn shape(pool: &Pool) -> Shape {
    let root = pool.root();
    assert_ne!(root, 0, "no table in the pool");
    assert_eq!(pool.load_u64(root), ROOT_MAGIC);
    let table = Table::from_desc(pool.load_u64(root + R_TABLE));
    let mut slabs = Vec::new();
    let mut s = pool.load_u64(table.off + T_SLABS);
    while s != 0 {
        slabs.push((s, pool.load_u64(s + S_COUNT)));
        s = pool.load_u64(s + S_NEXT);
    }
    let mut chains = Vec::new();
    let mut full_buckets = Vec::new();
    for h in 0..table.heads() {
        let head = table.head(h);
        let mut chain = Vec::new();
        let mut b = head;
        loop {
            if pool.load_u64(b + 8 * W_TOKENS as u64) != 0 {
                full_buckets.push(b);
            }
            let next = pool.load_u64(b + 8 * W_NEXT as u64);
            if next == 0 {
                break;
            }
            chain.push(next);
            b = next;
        }
        if !chain.is_empty() {
            chains.push((head, chain));
        }
    }
    Shape {
        root,
        table,
        slabs,
        chains,
        full_buckets,
        pool_size: pool.size(),
    }
}

// ----- pool images (engine::testkit::image, engine::testkit::bad_pool) -----------------

pub(crate) use engine::testkit::image::{
    clear_clean_flag, edit_state, patch, patch_byte, word, STATE_SLOTS,
};

/// Pool open then engine open of a pool file, in a panic guard:
/// `Err("PANIC")` if either panicked.
pub(crate) fn open_file(path: &Path, read_only: bool) -> Result<(Arc<Pool>, Rophi), String> {
    engine::testkit::bad_pool::open_guarded::<RophiSubject>(path, read_only)
}
