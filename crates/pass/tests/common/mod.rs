//! Helpers shared by the pass integration tests: pools in every mode with
//! fixed uuids (so the hash seed, hence every path, repeats), versioned
//! values, model comparison for both key modes, reopen helpers and pool
//! image patching.

#![allow(dead_code, unused_imports)]

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use engine::{Engine, EngineConfig};
use pmem::{Mode, Pool, PoolOptions};
use pmhash_pass::{Options, Pass};

use engine::testkit::{reopen, Subject};
pub(crate) use engine::testkit::{verify_model, Rng};

mod spec;
pub(crate) use spec::{PassBytesSubject, PassSubject};

pub(crate) const MIB: u64 = 1 << 20;

/// murmur3's finalizer: a bijection, for spreading test keys.
#[allow(unused_imports)]
pub(crate) use engine::hash::fmix64 as fmix;

/// A uuid made from a seed: the table's hash seed repeats run to run.
pub(crate) fn uuid_of(seed: u64) -> [u8; 16] {
    engine::testkit::test_uuid(&PassSubject::UUID_TAG, seed)
}

pub(crate) fn pool_opts(mode: Mode, size: u64, max_size: u64, seed: u64) -> PoolOptions {
    engine::testkit::pool_opts::<PassSubject>(mode, size, max_size, seed)
}

/// An in-memory pool (`Volatile` or `Simulated`).
pub(crate) fn mem_pool(mode: Mode, size: u64, max_size: u64, seed: u64) -> Arc<Pool> {
    engine::testkit::mem_pool(&pool_opts(mode, size, max_size, seed))
}

pub(crate) fn cfg(initial_capacity: u64, threads: usize) -> EngineConfig {
    engine::testkit::strict_config(initial_capacity, threads)
}

/// Default options, byte-string keys.
pub(crate) fn bytes_opts() -> Options {
    Options {
        bytes_keys: true,
        ..Options::default()
    }
}

/// Options for inline or bytes mode.
pub(crate) fn mode_opts(bytes: bool) -> Options {
    Options {
        bytes_keys: bytes,
        ..Options::default()
    }
}

/// A unique temp pool path, removed on drop.
pub(crate) struct TempPath(engine::testkit::TempPath);

impl TempPath {
    pub(crate) fn new(tag: &str) -> TempPath {
        TempPath(engine::testkit::TempPath::new(
            PassSubject::TEMP_PREFIX,
            tag,
        ))
    }
    pub(crate) fn path(&self) -> &Path {
        self.0.path()
    }
}

// ----- versioned values ---------------------------------------------------------------

// ----- model checks -------------------------------------------------------------------

/// Everything the table holds equals `model` (u64 API; see
/// `engine::testkit::verify_model`: for_each, len, get of every key and of
/// the absent ones, check() with the model's count and no leaked byte).
pub(crate) fn verify(e: &Pass, pool: &Pool, model: &HashMap<u64, u64>, absent: &[u64], ctx: &str) {
    verify_model(e, pool, model, absent, ctx);
}

/// The bytes-mode twin of [`verify`]: `for_each_bytes` visits each pair of
/// `model` exactly once, `len_bytes`, `get_bytes` of every key, `None` for
/// the `absent` keys the model lacks, `check()` with no leaked byte. Also:
/// the u64 `for_each` yields exactly the model's keys that have the shape
/// of a `wide_key`, and `len()` and `check().keys` count those.
pub(crate) fn verify_bytes(
    e: &Pass,
    pool: &Pool,
    model: &HashMap<Vec<u8>, u64>,
    absent: &[Vec<u8>],
    ctx: &str,
) {
    let mut seen: HashMap<Vec<u8>, u64> = HashMap::with_capacity(model.len());
    let mut dup = None;
    e.for_each_bytes(&mut |k, v| {
        if seen.insert(k.to_vec(), v).is_some() && dup.is_none() {
            dup = Some(k.to_vec());
        }
    });
    assert_eq!(dup, None, "{ctx}: for_each_bytes visited a key twice");
    if seen != *model {
        let missing: Vec<_> = model
            .keys()
            .filter(|k| !seen.contains_key(*k))
            .take(5)
            .collect();
        let extra: Vec<_> = seen
            .keys()
            .filter(|k| !model.contains_key(*k))
            .take(5)
            .collect();
        let wrong: Vec<_> = model
            .iter()
            .filter(|(k, v)| seen.get(*k).is_some_and(|s| s != *v))
            .take(5)
            .collect();
        panic!(
            "{ctx}: for_each_bytes differs from the model ({} vs {} keys): missing {missing:x?}, extra {extra:x?}, wrong {wrong:x?}",
            seen.len(),
            model.len()
        );
    }
    assert_eq!(e.len_bytes(), model.len() as u64, "{ctx}: len_bytes()");
    for (k, &v) in model {
        assert_eq!(e.get_bytes(k).unwrap(), Some(v), "{ctx}: get_bytes({k:x?})");
    }
    for k in absent {
        if !model.contains_key(k) {
            assert_eq!(
                e.get_bytes(k).unwrap(),
                None,
                "{ctx}: get_bytes({k:x?}) of an absent key"
            );
        }
    }
    // The u64 view: exactly the wide keys.
    let mut wide: HashMap<u64, u64> = HashMap::new();
    e.for_each(&mut |k, v| {
        assert!(
            wide.insert(k, v).is_none(),
            "{ctx}: for_each gave {k:#x} twice"
        );
    });
    let want: HashMap<u64, u64> = model
        .iter()
        .filter(|(k, _)| {
            k.len() == 16 && {
                let w = u64::from_le_bytes(k[..8].try_into().unwrap());
                k[..] == pmhash_pass::wide_key(w)
            }
        })
        .map(|(k, &v)| (u64::from_le_bytes(k[..8].try_into().unwrap()), v))
        .collect();
    assert_eq!(wide, want, "{ctx}: for_each (u64 view of bytes mode)");
    assert_eq!(e.len(), want.len() as u64, "{ctx}: len() (the u64 view)");
    let r = e
        .check()
        .unwrap_or_else(|err| panic!("{ctx}: check() failed: {err}"));
    assert_eq!(
        r.keys,
        want.len() as u64,
        "{ctx}: check().keys (the u64 view)"
    );
    assert_eq!(
        r.reachable_bytes,
        pool.stats().bytes_in_use,
        "{ctx}: reachable bytes differ from the allocator's bytes in use (leak)"
    );
}

// ----- reopen -------------------------------------------------------------------------

/// Clean close of a mapped table, then the file opened again as a new
/// pool (`engine::testkit::reopen`). The engine must have been the only
/// other holder of the pool.
pub(crate) fn reopen_file(
    e: Pass,
    pool: Arc<Pool>,
    path: &Path,
    popts: &PoolOptions,
) -> (Arc<Pool>, Pass) {
    reopen::reopen_file::<PassSubject>(e, pool, path, popts)
}

/// A crash right now: the live image of a pool that was never closed,
/// opened as a new volatile pool (recovery runs).
pub(crate) fn crash_reopen_live(pool: &Pool) -> (Arc<Pool>, Pass) {
    reopen::crash_reopen_live::<PassSubject>(pool)
}

/// A crash right now of a simulated pool: only what was persisted
/// survives (strict durability: every acknowledged write).
pub(crate) fn crash_reopen_persisted(pool: &Pool) -> (Arc<Pool>, Pass) {
    reopen::crash_reopen_persisted::<PassSubject>(pool)
}

// ----- pool images (engine::testkit::image, engine::testkit::bad_pool) -----------------

pub(crate) use engine::testkit::image::{clear_clean_flag, edit_state, patch, word, STATE_SLOTS};

/// Pool open then engine open of a pool file, in a panic guard:
/// `Err("PANIC")` if either panicked.
pub(crate) fn open_file(path: &Path, read_only: bool) -> Result<(Arc<Pool>, Pass), String> {
    engine::testkit::bad_pool::open_guarded::<PassSubject>(path, read_only)
}
