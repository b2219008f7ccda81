//! The engine conformance suite and what every engine's tests share
//! (built with the `testkit` feature; engines take it as a
//! dev-dependency): a seeded RNG and unique temp files, model runs
//! against a model ([`model`]), concurrent races ([`races`]), reopen and
//! crash-reopen ([`reopen`]), the "bad pool: `Err`, never a panic, file
//! untouched" harness ([`bad_pool`], [`faults`]), pool-image patch helpers
//! ([`image`]), and the whole suite for an engine's [`Subject`] in one
//! macro call ([`conformance_suite!`](crate::conformance_suite)).

use std::path::Path;
use std::sync::Arc;

use pmem::Pool;

use crate::{Engine, EngineConfig, Result};

pub mod bad_pool;
pub mod faults;
pub mod image;
pub mod model;
pub mod races;
pub mod reopen;
pub mod suite;

pub use crate::scratch::{Rng, TempDir, TempPath};
pub use model::{val, verify_model, version_of, VER_MUL};
pub use races::join_then_stop;
pub use reopen::{clean_open_walks, OpenWalks};

/// An engine under test, as the suite sees it: its concrete type, how a
/// table is made and opened, and what its tests' pools look like. A
/// marker type implements it in the engine's `tests/` (one file gets the
/// engine the whole suite: see [`conformance_suite!`](crate::conformance_suite)).
pub trait Subject: 'static {
    /// The engine type (its own methods stay reachable to its tests).
    type E: Engine + 'static;
    /// The engine's type name in messages (`"Rophi::open panicked"`).
    const NAME: &'static str;
    /// The pool layout id the engine's pools carry.
    const LAYOUT: &'static str;
    /// The 16-byte tag test pools' uuids are made from ([`test_uuid`]).
    const UUID_TAG: [u8; 16];
    /// The prefix of the engine's temp pool files.
    const TEMP_PREFIX: &'static str;
    /// The initial capacity a table is opened with by the reopen helpers.
    const OPEN_CAPACITY: u64 = 16;
    /// Whether the pool layer itself may refuse a file the engine's bad
    /// pool tests corrupt (then the engine-only open check is skipped for
    /// that file); where `false`, the pool layer must accept every one.
    const POOL_MAY_REFUSE: bool = true;
    /// A new table in `pool`.
    fn create(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Self::E>;
    /// The table in `pool`.
    fn open(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Self::E>;
    /// The engine's corruption list: named damaged copies of `good`, the
    /// image of a cleanly closed pool of 3,000 keys whose root block is at
    /// `root`; each must be refused untouched ([`bad_pool::refused`]).
    fn corruptions(good: &[u8], root: u64) -> Vec<(String, Vec<u8>)>;
}

/// Options of a test pool of `S` (uuid from `S::UUID_TAG` and `seed`).
pub fn pool_opts<S: Subject>(
    mode: pmem::Mode,
    size: u64,
    max_size: u64,
    seed: u64,
) -> pmem::PoolOptions {
    test_pool_options(S::LAYOUT, &S::UUID_TAG, mode, size, max_size, seed)
}

/// A uuid made of a 16-byte tag with `seed` in its first 8 bytes: a test
/// pool's identity, hence its engine's hash seed, repeats run to run.
pub fn test_uuid(tag: &[u8; 16], seed: u64) -> [u8; 16] {
    let mut u = *tag;
    u[..8].copy_from_slice(&seed.to_le_bytes());
    u
}

/// Options of a test pool of `layout` whose uuid is [`test_uuid`]`(tag, seed)`.
pub fn test_pool_options(
    layout: &str,
    tag: &[u8; 16],
    mode: pmem::Mode,
    size: u64,
    max_size: u64,
    seed: u64,
) -> pmem::PoolOptions {
    pmem::PoolOptions {
        mode,
        size,
        max_size,
        layout: layout.into(),
        uuid: Some(test_uuid(tag, seed)),
        ..pmem::PoolOptions::default()
    }
}

/// An in-memory pool (`Volatile` or `Simulated`) made from `opts`.
pub fn mem_pool(opts: &pmem::PoolOptions) -> std::sync::Arc<Pool> {
    assert!(
        opts.mode == pmem::Mode::Volatile || opts.mode == pmem::Mode::Simulated,
        "mem_pool wants an in-memory mode"
    );
    std::sync::Arc::new(Pool::create(Path::new(""), opts).expect("in-memory pool"))
}

/// A strict engine configuration.
pub fn strict_config(initial_capacity: u64, threads: usize) -> crate::EngineConfig {
    crate::EngineConfig {
        durability: crate::Durability::Strict,
        initial_capacity,
        threads,
    }
}
