//! The conformance suite: what every persistent engine must do, run
//! against the engine's [`Subject`]. An engine's `tests/conformance.rs`
//! implements `Subject` for a marker type and calls
//! [`conformance_suite!`](crate::conformance_suite) with it; each check
//! below becomes one `#[test]` there.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use pmem::{Link, Mode, Pool};

use super::bad_pool::{accepted, refused};
use super::reopen::{crash_reopen_persisted, reopen_file};
use super::{join_then_stop, pool_opts, strict_config, val, verify_model, version_of};
use super::{Rng, Subject, TempPath};
use crate::Engine;

const MIB: u64 = 1 << 20;

fn as_hash(model: &BTreeMap<u64, u64>) -> HashMap<u64, u64> {
    model.iter().map(|(&k, &v)| (k, v)).collect()
}

/// Keys drawn from a space of `space` values spread over all of `u64`
/// (0 and `u64::MAX` included), so inserts, updates and removes of the
/// same keys meet.
fn key_of(rng: &mut Rng, space: u64) -> u64 {
    match rng.below(space) {
        0 => 0,
        1 => u64::MAX,
        i => crate::hash::fmix64(i),
    }
}

/// One step of a model run: insert, update, upsert or remove of a key
/// from the space, each result checked against the model.
fn step(e: &dyn Engine, model: &mut BTreeMap<u64, u64>, rng: &mut Rng, space: u64, ctx: &str) {
    let k = key_of(rng, space);
    let v = rng.next();
    let had = model.contains_key(&k);
    match rng.below(10) {
        0..=3 => {
            let fresh = e.insert(k, v).unwrap();
            assert_eq!(fresh, !had, "{ctx}: insert({k:#x}) says new = {fresh}");
            model.entry(k).or_insert(v);
        }
        4..=5 => {
            let found = e.update(k, v).unwrap();
            assert_eq!(found, had, "{ctx}: update({k:#x}) says found = {found}");
            if had {
                model.insert(k, v);
            }
        }
        6 => {
            e.upsert(k, v).unwrap();
            model.insert(k, v);
        }
        _ => {
            let found = e.remove(k).unwrap();
            assert_eq!(found, had, "{ctx}: remove({k:#x}) says found = {found}");
            model.remove(&k);
        }
    }
}

/// A seeded run of 20,000 mixed operations on a table grown from the
/// engine's open capacity in a volatile pool, checked against a
/// `BTreeMap` model: every result as it happens, and the whole contents
/// ([`verify_model`]) every 5,000 operations.
pub fn model_run<S: Subject>() {
    let pool = super::mem_pool(&pool_opts::<S>(Mode::Volatile, 4 * MIB, 64 * MIB, 1));
    let e = S::create(pool.clone(), &strict_config(S::OPEN_CAPACITY, 1)).unwrap();
    let mut model = BTreeMap::new();
    let mut rng = Rng::new(0xc0f0);
    let absent: Vec<u64> = (0..64)
        .map(|i| crate::hash::fmix64(i + (1 << 40)))
        .collect();
    for i in 0..20_000 {
        step(&e, &mut model, &mut rng, 6000, S::NAME);
        if (i + 1) % 5000 == 0 {
            verify_model(
                &e,
                &pool,
                &as_hash(&model),
                &absent,
                &format!("{} model run at {i}", S::NAME),
            );
        }
    }
    assert!(model.len() > 1000, "the run left only {} keys", model.len());
}

/// A file-backed table after a model run is closed and reopened with the
/// same contents; a simulated pool's crash after acknowledged writes
/// (strict durability) reopens, through recovery, with every one of them.
pub fn reopen_and_crash_reopen<S: Subject>() {
    let tmp = TempPath::new(S::TEMP_PREFIX, "suite-reopen");
    let popts = pool_opts::<S>(Mode::Mapped, 2 * MIB, 64 * MIB, 2);
    let pool = Arc::new(Pool::create(tmp.path(), &popts).unwrap());
    let e = S::create(pool.clone(), &strict_config(S::OPEN_CAPACITY, 1)).unwrap();
    let mut model = BTreeMap::new();
    let mut rng = Rng::new(0x5eed);
    for _ in 0..8000 {
        step(&e, &mut model, &mut rng, 4000, S::NAME);
    }
    let (pool, e) = reopen_file::<S>(e, pool, tmp.path(), &popts);
    verify_model(
        &e,
        &pool,
        &as_hash(&model),
        &[],
        &format!("{} after a clean reopen", S::NAME),
    );
    drop(e);
    drop(pool);

    let pool = super::mem_pool(&pool_opts::<S>(Mode::Simulated, 2 * MIB, 64 * MIB, 3));
    let e = S::create(pool.clone(), &strict_config(S::OPEN_CAPACITY, 1)).unwrap();
    let mut model = BTreeMap::new();
    for _ in 0..3000 {
        step(&e, &mut model, &mut rng, 2000, S::NAME);
    }
    let (p2, e2) = crash_reopen_persisted::<S>(&pool);
    verify_model(
        &e2,
        &p2,
        &as_hash(&model),
        &[],
        &format!("{} after a crash", S::NAME),
    );
    // The recovered table takes writes.
    for i in 0..100u64 {
        e2.upsert(i, i).unwrap();
        assert_eq!(e2.get(i), Some(i));
    }
}

/// Four writers insert disjoint keys into a table grown from the open
/// capacity (so the growth runs under them) while two readers read keys
/// the writers have published: no reader sees a wrong value, a published
/// key never goes missing, and the table ends holding every key.
pub fn disjoint_writers_versus_growth<S: Subject>() {
    const WRITERS: u64 = 4;
    const PER: u64 = 6000;
    let pool = super::mem_pool(&pool_opts::<S>(Mode::Volatile, 4 * MIB, 256 * MIB, 4));
    let e = S::create(pool.clone(), &strict_config(S::OPEN_CAPACITY, 6)).unwrap();
    let key = |w: u64, i: u64| crate::hash::fmix64(w << 32 | i);
    let done = AtomicBool::new(false);
    let published: Vec<std::sync::atomic::AtomicU64> = (0..WRITERS)
        .map(|_| std::sync::atomic::AtomicU64::new(0))
        .collect();
    std::thread::scope(|s| {
        let readers: Vec<_> = (0..2u64)
            .map(|r| {
                let (e, done, published) = (&e, &done, &published);
                s.spawn(move || {
                    let mut rng = Rng::new(r + 77);
                    let mut reads = 0u64;
                    while !done.load(Ordering::Acquire) {
                        let w = rng.below(WRITERS);
                        let n = published[w as usize].load(Ordering::Acquire);
                        if n == 0 {
                            std::hint::spin_loop();
                            continue;
                        }
                        let i = rng.below(n);
                        let got = e.get(key(w, i));
                        assert_eq!(
                            got,
                            Some(val(key(w, i), 0)),
                            "{}: reader, key {w}/{i}",
                            S::NAME
                        );
                        reads += 1;
                    }
                    reads
                })
            })
            .collect();
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let (e, published) = (&e, &published);
                s.spawn(move || {
                    for i in 0..PER {
                        assert!(e.insert(key(w, i), val(key(w, i), 0)).unwrap());
                        published[w as usize].store(i + 1, Ordering::Release);
                    }
                })
            })
            .collect();
        join_then_stop(writers, &done);
        for r in readers {
            r.join().unwrap();
        }
    });
    let model: HashMap<u64, u64> = (0..WRITERS)
        .flat_map(|w| (0..PER).map(move |i| (key(w, i), val(key(w, i), 0))))
        .collect();
    verify_model(
        &e,
        &pool,
        &model,
        &[],
        &format!("{} after the race", S::NAME),
    );
}

/// Four threads write rising versions of the same 8 keys (upsert, update,
/// remove and insert back) while two readers read them: every value a
/// reader gets decodes to a version some writer wrote of that key (no
/// torn or foreign value), and at the end each key holds the last version
/// its last writer wrote, or is absent.
pub fn same_key_race<S: Subject>() {
    const KEYS: u64 = 8;
    const ROUNDS: u64 = 3000;
    let pool = super::mem_pool(&pool_opts::<S>(Mode::Volatile, 4 * MIB, 64 * MIB, 5));
    let e = S::create(pool.clone(), &strict_config(S::OPEN_CAPACITY, 6)).unwrap();
    let key = |i: u64| crate::hash::fmix64(i + 0x1234);
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let readers: Vec<_> = (0..2u64)
            .map(|_| {
                let (e, done) = (&e, &done);
                s.spawn(move || {
                    while !done.load(Ordering::Acquire) {
                        for i in 0..KEYS {
                            if let Some(v) = e.get(key(i)) {
                                let ver = version_of(key(i), v);
                                assert!(
                                    ver < 4 * ROUNDS + 4,
                                    "{}: key {i} read a value of no version ({v:#x})",
                                    S::NAME
                                );
                            }
                        }
                    }
                })
            })
            .collect();
        let writers: Vec<_> = (0..4u64)
            .map(|t| {
                let e = &e;
                s.spawn(move || {
                    for r in 0..ROUNDS {
                        let k = key(r % KEYS);
                        let v = val(k, 4 * r + t);
                        match (r + t) % 4 {
                            0 => e.upsert(k, v).unwrap(),
                            1 => drop(e.update(k, v).unwrap()),
                            2 => drop(e.remove(k).unwrap()),
                            _ => drop(e.insert(k, v).unwrap()),
                        }
                    }
                })
            })
            .collect();
        join_then_stop(writers, &done);
        for r in readers {
            r.join().unwrap();
        }
    });
    let mut model = HashMap::new();
    for i in 0..KEYS {
        if let Some(v) = e.get(key(i)) {
            assert!(
                version_of(key(i), v) < 4 * ROUNDS,
                "{}: key {i} ends garbage",
                S::NAME
            );
            model.insert(key(i), v);
        }
    }
    verify_model(
        &e,
        &pool,
        &model,
        &[],
        &format!("{} after the same-key race", S::NAME),
    );
}

/// A pool with no root, and pools whose root names a block of zeros or of
/// garbage, are refused by `open` (never a panic, the file untouched),
/// and `create` on the garbage-rooted pool is refused too without a
/// write.
pub fn foreign_pools_are_refused_untouched<S: Subject>() {
    let popts = pool_opts::<S>(Mode::Mapped, MIB, 0, 6);
    let tmp = TempPath::new(S::TEMP_PREFIX, "suite-empty");
    let pool = Pool::create(tmp.path(), &popts).unwrap();
    pool.close().unwrap();
    drop(pool);
    let empty = std::fs::read(tmp.path()).unwrap();
    refused::<S>(tmp.path(), &empty, "empty pool");
    for (what, fill) in [("zeroed root block", 0u8), ("garbage root block", 0x5a)] {
        let tmp = TempPath::new(S::TEMP_PREFIX, "suite-root");
        let pool = Pool::create(tmp.path(), &popts).unwrap();
        let r = pool.reserve(4096, Link::RootPointer).unwrap();
        let off = r.offset();
        pool.write(off, &[fill; 4096]);
        pool.persist(off, 4096);
        pool.set_root(off).unwrap();
        pool.commit(r);
        pool.close().unwrap();
        drop(pool);
        let bytes = std::fs::read(tmp.path()).unwrap();
        refused::<S>(tmp.path(), &bytes, what);
        let pool = Arc::new(Pool::open(tmp.path(), &popts).unwrap());
        let before = pool.image();
        assert!(
            S::create(pool.clone(), &strict_config(S::OPEN_CAPACITY, 1)).is_err(),
            "{}: {what}: create over a foreign root",
            S::NAME
        );
        assert!(
            pool.image() == before,
            "{}: {what}: a refused create wrote",
            S::NAME
        );
    }
}

/// A cleanly closed file pool of 3,000 keys, damaged by each entry of the
/// engine's corruption list ([`Subject::corruptions`]): every damaged
/// image is refused untouched ([`refused`]), and the intact one opens
/// with every key ([`accepted`]).
pub fn corruptions_are_refused_untouched<S: Subject>() {
    let tmp = TempPath::new(S::TEMP_PREFIX, "suite-corrupt");
    let popts = pool_opts::<S>(Mode::Mapped, 2 * MIB, 64 * MIB, 7);
    let pool = Arc::new(Pool::create(tmp.path(), &popts).unwrap());
    let e = S::create(pool.clone(), &strict_config(S::OPEN_CAPACITY, 1)).unwrap();
    let mut model = HashMap::new();
    let mut rng = Rng::new(0xbad);
    while model.len() < 3000 {
        let (k, v) = (rng.next(), rng.next());
        assert!(e.insert(k, v).unwrap());
        model.insert(k, v);
    }
    let root = pool.root();
    e.close().unwrap();
    drop(e);
    drop(pool);
    let good = std::fs::read(tmp.path()).unwrap();
    let list = S::corruptions(&good, root);
    assert!(!list.is_empty(), "{}: an empty corruption list", S::NAME);
    for (what, bad) in list {
        assert!(bad != good, "{}: {what} changes nothing", S::NAME);
        refused::<S>(tmp.path(), &bad, &what);
    }
    accepted::<S>(tmp.path(), &good, &model, "the intact pool");
}

/// Every check of the suite as a `#[test]`, for the [`Subject`] type given:
/// `engine::conformance_suite!(MySubject);` in an engine's
/// `tests/conformance.rs`.
#[macro_export]
macro_rules! conformance_suite {
    ($subject:ty) => {
        #[test]
        fn suite_model_run() {
            $crate::testkit::suite::model_run::<$subject>();
        }
        #[test]
        fn suite_reopen_and_crash_reopen() {
            $crate::testkit::suite::reopen_and_crash_reopen::<$subject>();
        }
        #[test]
        fn suite_disjoint_writers_versus_growth() {
            $crate::testkit::suite::disjoint_writers_versus_growth::<$subject>();
        }
        #[test]
        fn suite_same_key_race() {
            $crate::testkit::suite::same_key_race::<$subject>();
        }
        #[test]
        fn suite_foreign_pools_are_refused_untouched() {
            $crate::testkit::suite::foreign_pools_are_refused_untouched::<$subject>();
        }
        #[test]
        fn suite_corruptions_are_refused_untouched() {
            $crate::testkit::suite::corruptions_are_refused_untouched::<$subject>();
        }
    };
}
