//! Reopen: what a clean open's cross-check walk reads in each of the
//! three ways a cleanly closed pool is opened.

use std::path::Path;

use pmem::Pool;

use super::Subject;
use crate::Engine;

/// What a clean open's cross-check walk did, by the engine's tally of it
/// (slots, buckets or segments read), in the three ways a cleanly closed
/// pool is opened.
#[derive(Debug)]
pub struct OpenWalks {
    /// A read-only open (`pmhash check`, `inspect`).
    pub read_only: u64,
    /// The writable open of [`crate::open_file`], after its read-only check
    /// (`Pool::prechecked`).
    pub prechecked: u64,
    /// A plain writable open, with no read-only check before it.
    pub plain: u64,
}

/// Builds a pool of `S` at `path` holding `keys` (value = index), closes
/// it cleanly, and opens it read-only, through [`crate::open_file_with`]
/// (whose engine must serve the keys) and writable, returning what
/// `walked` reads from each opened engine's tallies.
pub fn clean_open_walks<S: Subject>(
    path: &Path,
    popts: &pmem::PoolOptions,
    cfg: &crate::EngineConfig,
    keys: &[u64],
    walked: impl Fn(&S::E) -> u64,
) -> OpenWalks {
    let opened = |e: S::E| {
        let n = walked(&e);
        e.close().unwrap();
        n
    };
    {
        let pool = std::sync::Arc::new(Pool::create(path, popts).unwrap());
        let e = S::create(pool, cfg).unwrap();
        for (i, &k) in keys.iter().enumerate() {
            assert!(e.insert(k, i as u64).unwrap());
        }
        e.close().unwrap();
    }
    let ro = pmem::PoolOptions {
        read_only: true,
        ..popts.clone()
    };
    let pool = std::sync::Arc::new(Pool::open(path, &ro).unwrap());
    assert!(!pool.prechecked());
    let e = S::open(pool, cfg).unwrap();
    let read_only = walked(&e);
    drop(e);
    let (pool, e) = crate::open_file_with(S::open, path, popts, cfg).unwrap();
    assert!(pool.prechecked());
    assert_eq!(e.len(), keys.len() as u64);
    for (i, &k) in keys.iter().enumerate().step_by(7) {
        assert_eq!(e.get(k), Some(i as u64));
    }
    let prechecked = opened(e);
    drop(pool);
    let pool = std::sync::Arc::new(Pool::open(path, popts).unwrap());
    assert!(!pool.prechecked());
    let plain = opened(S::open(pool, cfg).unwrap());
    OpenWalks {
        read_only,
        prechecked,
        plain,
    }
}

/// Clean close of a file-backed table, then the file opened again as a new
/// pool (it must read as cleanly closed). The engine must have been the
/// only other holder of the pool; a write after `close` must be refused.
pub fn reopen_file<S: super::Subject>(
    e: S::E,
    pool: std::sync::Arc<Pool>,
    path: &Path,
    popts: &pmem::PoolOptions,
) -> (std::sync::Arc<Pool>, S::E) {
    let cfg = super::strict_config(S::OPEN_CAPACITY, 1);
    reopen_file_with::<S>(e, pool, path, popts, &cfg)
}

/// [`reopen_file`], opening the table again with `cfg`.
pub fn reopen_file_with<S: super::Subject>(
    e: S::E,
    pool: std::sync::Arc<Pool>,
    path: &Path,
    popts: &pmem::PoolOptions,
    cfg: &crate::EngineConfig,
) -> (std::sync::Arc<Pool>, S::E) {
    e.close().unwrap();
    assert!(
        e.insert(0x5eed, 1).is_err(),
        "insert after close() was accepted"
    );
    drop(e);
    assert_eq!(
        std::sync::Arc::strong_count(&pool),
        1,
        "the engine still holds the pool"
    );
    drop(pool);
    let p2 = std::sync::Arc::new(Pool::open(path, popts).unwrap());
    assert!(p2.was_clean(), "close() did not mark the file clean");
    let e2 = S::open(p2.clone(), cfg).unwrap();
    (p2, e2)
}

/// Clean close of a simulated pool's table, then what that close persisted
/// opened as a new simulated pool with `cfg` (it must read as cleanly
/// closed: the close's writes are durable, not just visible).
pub fn clean_image_reopen<S: super::Subject>(
    e: S::E,
    pool: &Pool,
    cfg: &crate::EngineConfig,
) -> (std::sync::Arc<Pool>, S::E) {
    e.close().unwrap();
    let img = pool.crash_image(pmem::CrashChoice::Persisted).unwrap();
    drop(e);
    let p2 = std::sync::Arc::new(Pool::from_image(img, pmem::Mode::Simulated).unwrap());
    assert!(
        p2.was_clean(),
        "close() did not durably mark the pool clean"
    );
    let e2 = S::open(p2.clone(), cfg).unwrap();
    (p2, e2)
}

/// A crash right now: the live image of a pool that was never closed,
/// opened as a new volatile pool (recovery runs).
pub fn crash_reopen_live<S: super::Subject>(pool: &Pool) -> (std::sync::Arc<Pool>, S::E) {
    let p2 = std::sync::Arc::new(Pool::from_image(pool.image(), pmem::Mode::Volatile).unwrap());
    assert!(!p2.was_clean(), "a crash image reads as cleanly closed");
    let e2 = S::open(p2.clone(), &super::strict_config(S::OPEN_CAPACITY, 1)).unwrap();
    (p2, e2)
}

/// A crash right now of a simulated pool: only what was persisted
/// survives (strict durability: every acknowledged write).
pub fn crash_reopen_persisted<S: super::Subject>(pool: &Pool) -> (std::sync::Arc<Pool>, S::E) {
    let cfg = super::strict_config(S::OPEN_CAPACITY, 1);
    crash_reopen_persisted_with::<S>(pool, &cfg)
}

/// [`crash_reopen_persisted`], opening the table again with `cfg`.
pub fn crash_reopen_persisted_with<S: super::Subject>(
    pool: &Pool,
    cfg: &crate::EngineConfig,
) -> (std::sync::Arc<Pool>, S::E) {
    let img = pool.crash_image(pmem::CrashChoice::Persisted).unwrap();
    let p2 = std::sync::Arc::new(Pool::from_image(img, pmem::Mode::Simulated).unwrap());
    assert!(!p2.was_clean(), "a crash image reads as cleanly closed");
    let e2 = S::open(p2.clone(), cfg).unwrap();
    (p2, e2)
}
