//! Helpers shared by the level integration tests. The generic ones (seeded
//! RNG, temp files, in-memory pools, crash reopen, the strict config) are
//! the conformance kit's (`engine::testkit`), re-exported; level's own are
//! random-uuid pool options, a full model comparison with the level item
//! counts, and a white-box replica of the engine's bucket hashing (for
//! crafted keys).

#![allow(dead_code, unused_imports)]

use std::collections::HashMap;
use std::sync::Arc;

use engine::{Engine, EngineConfig};
use pmem::{Mode, Pool};

pub(crate) const MIB: u64 = 1 << 20;

use engine::testkit::Subject;
pub(crate) use engine::testkit::{Rng, TempPath};

mod spec;
pub(crate) use spec::LevelSubject;

pub(crate) use engine::testkit::reopen::crash_reopen_persisted;
pub(crate) use engine::testkit::strict_config;
pub(crate) use pmem::PoolOptions;

/// A unique temp pool path, removed on drop.
pub(crate) fn temp_path(tag: &str) -> engine::testkit::TempPath {
    engine::testkit::TempPath::new(LevelSubject::TEMP_PREFIX, tag)
}

/// Options of a level pool with a fresh random uuid (so each run hashes
/// differently); set `uuid` for fixed hash seeds.
pub(crate) fn opts(mode: Mode, size: u64, max_size: u64) -> PoolOptions {
    PoolOptions {
        mode,
        size,
        max_size,
        layout: LevelSubject::LAYOUT.into(),
        ..PoolOptions::default()
    }
}

/// An in-memory pool (`Volatile` or `Simulated`) with a level table.
pub(crate) fn mem_engine(o: &PoolOptions, c: &EngineConfig) -> (Arc<Pool>, pmhash_level::Level) {
    let pool = engine::testkit::mem_pool(o);
    let e = LevelSubject::create(pool.clone(), c).unwrap();
    (pool, e)
}

/// Everything the engine holds must equal `model`: for_each (each pair
/// exactly once), len, get, check() with no leak, and the level item counts
/// (top + bottom = len: no resize left in progress).
pub(crate) fn verify_full(
    e: &pmhash_level::Level,
    pool: &Pool,
    model: &HashMap<u64, u64>,
    ctx: &str,
) {
    engine::testkit::verify_model(e, pool, model, &[], ctx);
    let t = e.tallies();
    assert_eq!(
        t.top_items.0 + t.bottom_items.0,
        model.len() as i64,
        "{ctx}: top + bottom items"
    );
}

// ----- white-box replica of the engine's hashing ---------------------------------
// Only used to craft colliding keys; every test that uses it first checks
// through the public API that the replica still predicts the engine.

pub(crate) fn fmix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

pub(crate) fn seeds(uuid: &[u8; 16]) -> (u64, u64) {
    (
        fmix(u64::from_le_bytes(uuid[..8].try_into().unwrap()) | 1),
        fmix(u64::from_le_bytes(uuid[8..].try_into().unwrap()) ^ 0x5851_f42d_4c95_7f2d),
    )
}

pub(crate) fn hashes(seeds: (u64, u64), key: u64) -> (u64, u64) {
    (fmix(key ^ seeds.0), fmix(key.rotate_left(32) ^ seeds.1))
}

/// `n` keys (from `rng`) whose two bucket indexes are exactly (`a`, `b`)
/// modulo `modulus` (a power of two).
pub(crate) fn colliding_keys(
    seeds: (u64, u64),
    modulus: u64,
    a: u64,
    b: u64,
    n: usize,
    rng: &mut Rng,
) -> Vec<u64> {
    let m = modulus - 1;
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let k = rng.next();
        let (h1, h2) = hashes(seeds, k);
        if h1 & m == a && h2 & m == b && !out.contains(&k) {
            out.push(k);
        }
    }
    out
}

pub(crate) const UUID: [u8; 16] = LevelSubject::UUID_TAG;
