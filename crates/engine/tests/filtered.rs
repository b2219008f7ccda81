//! `Filtered` over the crate's own slot array: the growth forced by a
//! `Full` filter insert (the key is found afterwards, with exactly one
//! fingerprint), growth forced by load, and absent keys stopped before the
//! engine, deterministically.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use pmem::{Mode, Pool, PoolOptions};
use pmhash_engine::filtered::Filtered;
use pmhash_engine::{slotarray, Engine, EngineConfig};

fn engine(initial_capacity: u64) -> (Arc<Pool>, Filtered) {
    let layout = slotarray::LAYOUT;
    let pool = Arc::new(
        Pool::create(
            Path::new(""),
            &PoolOptions {
                mode: Mode::Volatile,
                size: 4 << 20,
                layout: layout.to_string(),
                ..PoolOptions::default()
            },
        )
        .unwrap(),
    );
    let e = Filtered::create(
        slotarray::spec,
        "slotarray+filter",
        pool.clone(),
        &EngineConfig {
            initial_capacity,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    (pool, e)
}

#[test]
fn load_growth_doubles_and_keeps_every_key() {
    let (_pool, e) = engine(4);
    // 2 buckets: the 8th fingerprint is over 0.9 · 8 slots.
    let mut growths = 0;
    for k in 0..200u64 {
        assert!(e.insert(k, k).unwrap());
        let t = e.filter_tallies();
        assert!(t.growths >= growths);
        growths = t.growths;
        let load = t.load.0;
        assert!(load <= 0.9, "after insert {k}: load {load}");
    }
    // 200 keys need 200 / 3.6 -> 64 buckets: 2 -> 4 -> ... -> 64 is 5 doublings.
    assert_eq!(e.filter_tallies().buckets, 64);
    assert!(growths >= 5, "{growths} growths");
    for k in 0..200u64 {
        assert_eq!(e.get(k), Some(k));
    }
    let absent_hits = (1000..101_000u64).filter(|&k| e.get(k).is_some()).count();
    assert_eq!(absent_hits, 0);
    assert_eq!(e.check().unwrap().keys, 200);
    assert!(e.stats().dram_bytes >= 64 * 8);
}

/// An engine that counts the `get` calls that reach it.
struct Counting {
    inner: Box<dyn Engine>,
    gets: Arc<AtomicU64>,
}

impl Engine for Counting {
    fn name(&self) -> &str {
        "counting"
    }
    fn insert(&self, key: u64, value: u64) -> pmhash_engine::Result<bool> {
        self.inner.insert(key, value)
    }
    fn get(&self, key: u64) -> Option<u64> {
        self.gets.fetch_add(1, Ordering::Relaxed);
        self.inner.get(key)
    }
    fn update(&self, key: u64, value: u64) -> pmhash_engine::Result<bool> {
        self.inner.update(key, value)
    }
    fn remove(&self, key: u64) -> pmhash_engine::Result<bool> {
        self.inner.remove(key)
    }
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn stats(&self) -> pmhash_engine::Stats {
        self.inner.stats()
    }
    fn for_each(&self, f: &mut dyn FnMut(u64, u64)) {
        self.inner.for_each(f)
    }
    fn check(&self) -> pmhash_engine::Result<pmhash_engine::CheckReport> {
        self.inner.check()
    }
}

#[test]
fn absent_keys_rarely_reach_the_engine() {
    let (_pool, plain) = engine(4);
    // Keys already in the engine are picked up by `wrap`'s rebuild.
    for k in 0..3000u64 {
        assert!(plain.insert(k, k).unwrap());
    }
    let gets = Arc::new(AtomicU64::new(0));
    let e = Filtered::wrap(
        Box::new(Counting {
            inner: Box::new(plain),
            gets: gets.clone(),
        }),
        "counting+filter",
    );
    assert_eq!(e.name(), "counting+filter");
    assert_eq!(e.filter_tallies().fingerprints, 3000);
    for k in 0..3000u64 {
        assert_eq!(e.get(k), Some(k));
    }
    assert_eq!(gets.load(Ordering::Relaxed), 3000, "present keys reach it");
    gets.store(0, Ordering::Relaxed);
    let n = 200_000u64;
    for k in (1 << 32)..(1 << 32) + n {
        assert_eq!(e.get(k), None);
    }
    let reached = gets.load(Ordering::Relaxed) as f64 / n as f64;
    let expected = e.filter_tallies().expected_fpr.0;
    assert!(
        reached < 2.0 * expected + 1e-4,
        "{reached} of absent gets reached the engine (expected fpr {expected})"
    );
}
