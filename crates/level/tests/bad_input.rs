//! Bad input: foreign and corrupt pools are an `Err` (never a panic), a
//! full pool is `Err(OutOfSpace)` that leaves the engine usable, and skewed
//! (colliding) keys neither hang nor lose keys.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use common::*;
use engine::{Engine, EngineConfig, EngineKind, Error};
use pmem::{CrashChoice, Mode, Pool, PoolOptions};

fn open_result(img: Vec<u8>) -> Result<pmhash_level::Level, Error> {
    let pool = Arc::new(Pool::from_image(img, Mode::Simulated).expect("the pool layer accepts it"));
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        pmhash_level::Level::open(pool, &strict_config(16, 1))
    }))
    .unwrap_or_else(|_| panic!("Level::open panicked"))
}

#[test]
fn open_refuses_another_engines_pool() {
    let EngineKind::Persistent { create, .. } = engine::slotarray::spec().kind else {
        unreachable!()
    };
    // A small and a large slot-array table (root block below and above the
    // level root's 8 KiB).
    for initial in [8u64, 4096] {
        let o = PoolOptions {
            layout: "slotarray".into(),
            ..opts(Mode::Simulated, 2 * MIB, 8 * MIB)
        };
        let pool = Arc::new(Pool::create(Path::new(""), &o).unwrap());
        let sa = create(pool.clone(), &strict_config(initial, 1)).unwrap();
        for k in 0..50u64 {
            sa.insert(k, k).unwrap();
        }
        // Straight on the live pool.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pmhash_level::Level::open(pool.clone(), &strict_config(16, 1))
        }))
        .expect("Level::open panicked on a slotarray pool");
        assert!(r.is_err(), "Level::open accepted a slotarray pool");
        // And on its image.
        let img = pool.crash_image(CrashChoice::Persisted).unwrap();
        assert!(open_result(img).is_err());
        // Level::create on a pool that holds another table refuses too.
        assert!(matches!(
            pmhash_level::Level::create(pool.clone(), &strict_config(16, 1)),
            Err(Error::InvalidArgument(_))
        ));
    }
    // A pool with no root at all.
    let pool = Arc::new(Pool::create(Path::new(""), &opts(Mode::Simulated, 2 * MIB, 0)).unwrap());
    assert!(matches!(
        pmhash_level::Level::open(pool, &strict_config(16, 1)),
        Err(Error::Corrupt(_))
    ));
    // A level pool refuses a second create.
    let (pool, _e) = mem_engine(&opts(Mode::Volatile, 2 * MIB, 0), &strict_config(16, 1));
    assert!(matches!(
        pmhash_level::Level::create(pool, &strict_config(16, 1)),
        Err(Error::InvalidArgument(_))
    ));
}

/// A level pool image with some keys (and an expansion behind it), its root
/// offset and the offset of the current geometry record.
fn level_image() -> (Vec<u8>, u64, u64, HashMap<u64, u64>) {
    let (pool, e) = mem_engine(
        &opts(Mode::Simulated, 2 * MIB, 8 * MIB),
        &strict_config(16, 1),
    );
    let mut model = HashMap::new();
    for k in 0..400u64 {
        e.insert(k * 7919, k).unwrap();
        model.insert(k * 7919, k);
    }
    assert!(e.tallies().expansions > 0);
    let img = pool.crash_image(CrashChoice::Persisted).unwrap();
    let root = pool.root();
    let selector = pool.load_u64(root + 24);
    (img, root, root + 64 + (selector % 2) * 64, model)
}

fn flip(img: &[u8], off: u64, mask: u8) -> Vec<u8> {
    let mut v = img.to_vec();
    v[off as usize] ^= mask;
    v
}

#[test]
fn corrupt_geometry_record_is_err_corrupt() {
    let (img, root, rec, model) = level_image();
    // The untouched image opens and holds every key.
    let e = open_result(img.clone()).expect("the clean image opens");
    for (k, v) in &model {
        assert_eq!(e.get(*k), Some(*v));
    }
    // Every byte of the current record, each flipped on its own.
    for i in 0..64u64 {
        for mask in [0x01u8, 0x80] {
            match open_result(flip(&img, rec + i, mask)) {
                Err(Error::Corrupt(_)) => {}
                Err(other) => panic!("record byte {i} ^ {mask:#x}: {other} (want Corrupt)"),
                Ok(_) => panic!("record byte {i} ^ {mask:#x}: open accepted a corrupt record"),
            }
        }
    }
    // The selector: bits 1 and 7 name a record slot whose sequence number
    // differs. Bit 0 names the previous record, which is intact (the
    // selector has no checksum); its geometry names a freed block, so open
    // must fail somehow, but not necessarily with Corrupt.
    for bit in [0u8, 1, 7] {
        match open_result(flip(&img, root + 24, 1 << bit)) {
            Err(Error::Corrupt(_)) => {}
            Err(other) if bit == 0 => eprintln!("selector bit 0: {other}"),
            Err(other) => panic!("selector bit {bit}: {other}"),
            Ok(e) => panic!(
                "selector bit {bit}: open accepted it; check() says {:?}, len {}",
                e.check(),
                e.len()
            ),
        }
    }
    // The magic.
    assert!(matches!(
        open_result(flip(&img, root, 0x20)),
        Err(Error::Corrupt(_))
    ));
}

#[test]
fn corrupt_seeds_or_tokens_are_found_by_check() {
    let (img, root, _rec, model) = level_image();
    // A changed hash seed: every key now sits in the wrong buckets.
    let e = open_result(flip(&img, root + 8, 0x04)).expect("seeds are not checksummed");
    assert!(
        matches!(e.check(), Err(Error::Corrupt(_))),
        "check() missed wrong seeds"
    );
    // A header word with a bit outside the token mask, in the first bucket
    // of the top level.
    let (pool, e) = {
        let p = Arc::new(Pool::from_image(img.clone(), Mode::Simulated).unwrap());
        let e = pmhash_level::Level::open(p.clone(), &strict_config(16, 1)).unwrap();
        (p, e)
    };
    verify_full(&e, &pool, &model, "reopened image");
    let rec = root + 64 + (pool.load_u64(root + 24) % 2) * 64;
    let top_raw = pool.load_u64(rec + 8);
    let first_line = top_raw.div_ceil(128) * 128;
    drop(e);
    let mut bad = img.clone();
    bad[(first_line + 8 + 7) as usize] |= 0x10;
    match open_result(bad) {
        Ok(e) => assert!(
            matches!(e.check(), Err(Error::Corrupt(_))),
            "check() missed a bad header"
        ),
        Err(Error::Corrupt(_)) => {}
        Err(other) => panic!("{other}"),
    }
}

/// A full pool (no growth): insert fails with OutOfSpace at some point, the
/// failed key is absent, and the engine keeps answering, checking, updating,
/// removing and (once there is room) inserting.
#[test]
fn full_pool_is_out_of_space_and_stays_usable() {
    for mode in [Mode::Simulated, Mode::Volatile] {
        let (pool, e) = mem_engine(&opts(mode, 2 * MIB, 2 * MIB), &strict_config(16, 1));
        let mut model = HashMap::new();
        let mut rng = Rng::new(3);
        let mut failed = None;
        for i in 0..1_000_000u64 {
            let k = rng.next();
            match e.insert(k, i) {
                Ok(true) => {
                    model.insert(k, i);
                }
                Ok(false) => panic!("fresh key reported present"),
                Err(Error::OutOfSpace(_)) => {
                    failed = Some(k);
                    break;
                }
                Err(other) => panic!("insert failed with {other}, not OutOfSpace"),
            }
        }
        let failed = failed.expect("a 2 MiB pool never filled up");
        assert!(
            model.len() > 500,
            "{mode:?}: full after {} keys",
            model.len()
        );
        assert_eq!(e.get(failed), None, "the failed insert left its key");
        verify_full(&e, &pool, &model, "after OutOfSpace");
        // A second attempt fails the same way, and changes nothing.
        assert!(matches!(e.insert(failed, 1), Err(Error::OutOfSpace(_))));
        verify_full(&e, &pool, &model, "after a second OutOfSpace");
        // Updates still work (both paths).
        let keys: Vec<u64> = model.keys().copied().collect();
        for (i, k) in keys.iter().enumerate().take(500) {
            assert!(e.update(*k, !(i as u64)).unwrap());
            model.insert(*k, !(i as u64));
        }
        // Removes work, and make room for inserts again.
        for k in keys.iter().skip(500).step_by(3) {
            assert!(e.remove(*k).unwrap());
            model.remove(k);
        }
        assert!(e.insert(failed, 7).unwrap(), "no room after removes");
        model.insert(failed, 7);
        verify_full(&e, &pool, &model, "after removes and a new insert");
        if mode == Mode::Simulated {
            let (p2, e2) = crash_reopen_persisted::<LevelSubject>(&pool);
            verify_full(&e2, &p2, &model, "recovered after OutOfSpace");
        }
    }
}

/// CRASH-PATTERNS #11: keys that share both bucket indexes modulo 2^8 force
/// expansions until the table is large enough to tell them apart; nothing
/// hangs, panics or gets lost. The first 24 also check the hash replica.
#[test]
fn skewed_keys_expand_until_they_separate() {
    let uuid = *b"skewed-keys-0001";
    let s = seeds(&uuid);
    let mut rng = Rng::new(11);
    let keys = colliding_keys(s, 256, 17, 200, 40, &mut rng);
    let (pool, e) = mem_engine(
        &PoolOptions {
            uuid: Some(uuid),
            ..opts(Mode::Volatile, 2 * MIB, 32 * MIB)
        },
        &strict_config(16, 1),
    );
    let mut model = HashMap::new();
    for (i, &k) in keys.iter().enumerate() {
        assert!(e.insert(k, i as u64).unwrap());
        model.insert(k, i as u64);
        if i == 23 {
            // 24 keys on two top buckets (12 slots) and two bottom ones.
            assert_eq!(e.tallies().expansions, 0, "hash replica out of date");
            assert_eq!(e.tallies().top_items.0, 12, "hash replica out of date");
            assert_eq!(e.tallies().bottom_items.0, 12, "hash replica out of date");
        }
    }
    let top = e.tallies().top_buckets;
    assert!(
        top >= 512,
        "40 keys colliding mod 256 fit in {top} top buckets?"
    );
    verify_full(&e, &pool, &model, "skewed keys");
    for &k in &keys {
        assert!(e.remove(k).unwrap());
    }
    verify_full(&e, &pool, &HashMap::new(), "skewed keys removed");
}

/// Skewed keys that would need a table larger than the pool: OutOfSpace,
/// never a hang or a panic; every key inserted before stays.
#[test]
fn skewed_keys_beyond_the_pool_are_out_of_space() {
    let uuid = *b"skewed-keys-0002";
    let s = seeds(&uuid);
    let mut rng = Rng::new(12);
    // Colliding modulo 2^11 on both hashes: 24 fit in any table, the 25th
    // needs more than 2048 top buckets.
    let keys = colliding_keys(s, 1 << 11, 5, 1000, 26, &mut rng);
    let (pool, e) = mem_engine(
        &PoolOptions {
            uuid: Some(uuid),
            ..opts(Mode::Volatile, MIB, MIB)
        },
        &strict_config(16, 1),
    );
    let mut model = HashMap::new();
    let mut oos = 0;
    for (i, &k) in keys.iter().enumerate() {
        match e.insert(k, i as u64) {
            Ok(true) => {
                model.insert(k, i as u64);
            }
            Err(Error::OutOfSpace(_)) => oos += 1,
            other => panic!("{other:?}"),
        }
    }
    assert!(oos > 0, "a 1 MiB pool held a 4096-bucket table?");
    assert!(model.len() >= 24);
    verify_full(&e, &pool, &model, "skewed keys, full pool");
}

/// Engine configuration corner cases.
#[test]
fn odd_configurations() {
    for (initial, threads) in [(0u64, 0usize), (1, 1), (1 << 40, 1)] {
        let c = EngineConfig {
            initial_capacity: initial,
            threads,
            ..EngineConfig::default()
        };
        let pool =
            Arc::new(Pool::create(Path::new(""), &opts(Mode::Volatile, 2 * MIB, 2 * MIB)).unwrap());
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pmhash_level::Level::create(pool.clone(), &c)
        }))
        .unwrap_or_else(|_| panic!("create panicked for initial {initial}"));
        match r {
            Ok(e) => {
                assert!(e.insert(5, 6).unwrap());
                assert_eq!(e.get(5), Some(6));
                let rep = e.check().unwrap();
                assert_eq!(rep.reachable_bytes, pool.stats().bytes_in_use);
            }
            Err(Error::OutOfSpace(_)) | Err(Error::InvalidArgument(_)) => {
                assert!(initial > 1 << 30, "initial {initial} refused");
                assert_eq!(pool.stats().bytes_in_use, 0, "a refused create leaked");
            }
            Err(other) => panic!("{other}"),
        }
    }
}

/// After `close` the pool is marked clean and its counters are trusted by
/// the next open: writes are refused with an error, reads still work, and
/// a second close is harmless.
#[test]
fn writes_after_close_are_refused() {
    let (pool, e) = mem_engine(
        &opts(Mode::Simulated, 2 * MIB, 8 * MIB),
        &strict_config(64, 1),
    );
    for k in 0..50u64 {
        assert!(e.insert(k, k + 1).unwrap());
    }
    e.close().unwrap();
    assert!(matches!(e.insert(1000, 1), Err(Error::InvalidArgument(_))));
    assert!(matches!(e.update(3, 9), Err(Error::InvalidArgument(_))));
    assert!(matches!(e.remove(4), Err(Error::InvalidArgument(_))));
    assert_eq!(e.get(4), Some(5));
    e.close().unwrap();
    let img = pool.crash_image(CrashChoice::Persisted).unwrap();
    let p2 = Arc::new(Pool::from_image(img, Mode::Simulated).unwrap());
    assert!(p2.was_clean());
    let e2 = pmhash_level::Level::open(p2, &strict_config(64, 1)).unwrap();
    assert_eq!(e2.len(), 50);
    assert_eq!(e2.get(3), Some(4));
}
