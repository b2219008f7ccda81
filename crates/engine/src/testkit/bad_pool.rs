//! The bad-pool harness: a corrupt or foreign pool file is an `Err` at
//! open, never a panic, and a refused open leaves the file as it was.
//!
//! Each bad image is opened three ways: read-only (the file must stay
//! byte-for-byte the same), writable (only the pool header's state slots,
//! which the pool layer rewrites when it marks the pool open, may change),
//! and writable with the pool image compared right before and right after
//! the refused engine open (the engine itself wrote nothing). Each is
//! tried with the clean flag set and cleared (crash recovery path).

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::Arc;

use pmem::{Mode, Pool, PoolOptions};

use super::image::{clear_clean_flag, STATE_SLOTS};
use super::{strict_config, Subject};
use crate::{Engine, Error};

/// Pool open then engine open of a pool file, in a panic guard:
/// `Err("PANIC")` if either panicked, else the error's message.
pub fn open_guarded<S: Subject>(path: &Path, read_only: bool) -> Result<(Arc<Pool>, S::E), String> {
    catch_unwind(AssertUnwindSafe(|| {
        let opts = PoolOptions {
            mode: Mode::Mapped,
            read_only,
            ..PoolOptions::default()
        };
        let pool = Arc::new(Pool::open(path, &opts).map_err(|e| format!("pool: {e}"))?);
        let e = S::open(pool.clone(), &strict_config(S::OPEN_CAPACITY, 1))
            .map_err(|e| format!("engine: {e}"))?;
        Ok((pool, e))
    }))
    .unwrap_or_else(|_| Err("PANIC".into()))
}

/// Writes `bad` (and `bad` with the clean flag cleared) to the file and
/// opens it read-only, writable, and writable with the pool image compared
/// around `S::open`: each must be an `Err`, never a panic, and leave the
/// bytes as described in the module comment. Leaves `bad` in the file and
/// returns the last refusal's message.
pub fn refused<S: Subject>(path: &Path, bad: &[u8], what: &str) -> String {
    let mut msg = String::new();
    let mut crashed = bad.to_vec();
    clear_clean_flag(&mut crashed);
    for (variant, img) in [("clean", bad), ("crashed", &crashed[..])] {
        let what = format!("{what} [{variant}]");
        for read_only in [true, false] {
            std::fs::write(path, img).unwrap();
            let mode = if read_only { "read-only" } else { "writable" };
            match open_guarded::<S>(path, read_only) {
                Ok((_, e)) => panic!(
                    "{what} ({mode}): open accepted it; len {} check() says {:?}",
                    e.len(),
                    e.check()
                ),
                Err(m) => {
                    assert!(m != "PANIC", "{what} ({mode}): open panicked");
                    msg = m;
                }
            }
            let now = std::fs::read(path).unwrap();
            assert_eq!(now.len(), img.len(), "{what} ({mode}): file length changed");
            if read_only {
                assert!(now == img, "{what} (read-only): the file changed");
            } else {
                let diff: Vec<usize> = (0..now.len())
                    .filter(|&i| now[i] != img[i] && !STATE_SLOTS.contains(&i))
                    .take(4)
                    .collect();
                assert!(
                    diff.is_empty(),
                    "{what} (writable): bytes outside the header state changed at {diff:#x?}"
                );
            }
        }
        // The engine's own refusal writes nothing into the opened pool.
        // (Skipped when the pool layer itself refuses the file, where the
        // engine allows that: `Subject::POOL_MAY_REFUSE`.)
        std::fs::write(path, img).unwrap();
        let pool = match Pool::open(
            path,
            &PoolOptions {
                mode: Mode::Mapped,
                ..PoolOptions::default()
            },
        ) {
            Ok(pool) => Arc::new(pool),
            Err(_) if S::POOL_MAY_REFUSE => continue,
            Err(e) => panic!("{what}: the pool layer refused it: {e}"),
        };
        let before = pool.image();
        let r = catch_unwind(AssertUnwindSafe(|| {
            S::open(pool.clone(), &strict_config(S::OPEN_CAPACITY, 1)).map(|_| ())
        }));
        match r {
            Err(_) => panic!("{what}: {}::open panicked", S::NAME),
            Ok(Ok(())) => panic!("{what}: {}::open accepted it", S::NAME),
            Ok(Err(e)) => assert!(
                matches!(e, Error::Corrupt(_) | Error::Pool(_)),
                "{what}: refused with {e:?}, not a corruption error"
            ),
        }
        let after = pool.image();
        let diff: Vec<usize> = (0..after.len())
            .filter(|&i| after[i] != before[i])
            .take(4)
            .collect();
        assert!(
            diff.is_empty(),
            "{what}: the refused {}::open wrote at {diff:#x?}",
            S::NAME
        );
    }
    std::fs::write(path, bad).unwrap();
    msg
}

/// The untouched file opens (read-only and writable) with every key of
/// `model`, and `check()` counts them with no leaked byte.
pub fn accepted<S: Subject>(path: &Path, good: &[u8], model: &HashMap<u64, u64>, what: &str) {
    for read_only in [true, false] {
        std::fs::write(path, good).unwrap();
        let (pool, e) =
            open_guarded::<S>(path, read_only).unwrap_or_else(|m| panic!("{what}: {m}"));
        assert_eq!(e.len(), model.len() as u64, "{what}");
        for (k, v) in model {
            assert_eq!(e.get(*k), Some(*v), "{what}: key {k:#x}");
        }
        let r = e.check().unwrap();
        assert_eq!(r.keys, model.len() as u64);
        assert_eq!(r.reachable_bytes, pool.stats().bytes_in_use, "{what}: leak");
    }
    std::fs::write(path, good).unwrap();
}
