//! Concurrency: writers on disjoint key ranges racing head-array doublings
//! and filter growths (a 16-head table and a filter sized for one key),
//! while lock-free readers check every answer: a stable key is always found
//! with its value (no false negative, from `get` or `get_many`), a key never
//! inserted is never found, any value read was written for that key; updates
//! racing readers (a reader sees only written values, never going back);
//! same-key insert, remove and upsert races; hot-key churn. Every test ends
//! with a full model check (`check()`, no leaked byte).

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use common::*;
use engine::Engine;
use pmem::{Mode, Pool};
use pmhash_rophi::Rophi;

/// Each reader reads at least this often (on after the writers if need be).
const MIN_READS: u64 = 20_000;

/// Versions written by the tests stay below this; a value that decodes to
/// a larger version was never written to that key.
const VER_LIMIT: u64 = 1 << 32;

/// Key `i` of writer `t` (`t` < 0xfff0), of the stable set, of the
/// versioned set, or of keys never inserted.
fn key_of(t: u64, i: u64) -> u64 {
    fmix(t << 48 | i)
}
const STABLE_T: u64 = 0xffff;
const VERSIONED_T: u64 = 0xfffe;
const NEVER_T: u64 = 0xfffd;

/// The version a value read for `k` was written with (panics on a value
/// never written to `k`: torn, stale garbage or another key's).
fn check_value(k: u64, v: u64, what: &str) -> u64 {
    let ver = version_of(k, v);
    assert!(
        ver < VER_LIMIT,
        "{what}: get({k:#x}) returned {v:#x}, a value never written to that key"
    );
    ver
}

/// A 16-head table (initial capacity 1) in a volatile pool.
fn table(seed: u64) -> (Arc<Pool>, Rophi) {
    let pool = mem_pool(Mode::Volatile, 8 * MIB, 256 * MIB, seed);
    let e = Rophi::create(pool.clone(), &cfg(1, 4)).unwrap();
    assert_eq!(head_k(&e), 4);
    (pool, e)
}

/// Growth counters of a handle.
fn growth(e: &Rophi) -> (u64, u64) {
    (e.tallies().resizes, e.tallies().filter_growths)
}

/// (a) Writers own disjoint key ranges (writer 0 also owns 0 and u64::MAX)
/// and insert, remove, update and upsert them, checking every return value
/// against their own model, while the table doubles from 16 heads and the
/// filter from its smallest size. Readers run all along: every `get` and
/// `get_many` of a stable key returns exactly its value, never-inserted keys
/// are always absent, and writer keys hold absent or a value once written.
#[test]
fn stable_keys_never_read_absent_or_wrong_during_resizes_and_filter_growths() {
    for seed in [1, 11, 21] {
        writers_and_readers(seed);
    }
}

fn writers_and_readers(seed: u64) {
    let started = Instant::now();
    let (pool, e) = table(seed);
    let writers = 2u64;
    let n = 60_000u64;
    let stable: Vec<u64> = (0..100).map(|i| key_of(STABLE_T, i)).collect();
    let never: Vec<u64> = (0..400).map(|i| key_of(NEVER_T, i)).collect();
    let wkey = |w: u64, i: u64| -> u64 {
        match (w, i) {
            (0, 0) => 0,
            (0, 1) => u64::MAX,
            _ => key_of(w, i),
        }
    };
    for &k in &stable {
        assert!(e.insert(k, val(k, 7)).unwrap());
    }
    let (r0, g0) = growth(&e);
    let done = AtomicBool::new(false);
    let reads = AtomicU64::new(0);
    let misses = AtomicU64::new(0);
    let wrong = AtomicU64::new(0);
    let phantoms = AtomicU64::new(0);
    let hits = AtomicU64::new(0);
    let e = &e;
    let models: Vec<HashMap<u64, u64>> = std::thread::scope(|sc| {
        for r in 0..2u64 {
            let (stable, never, done, reads, misses, wrong, phantoms, hits) = (
                &stable, &never, &done, &reads, &misses, &wrong, &phantoms, &hits,
            );
            sc.spawn(move || {
                let mut rng = Rng::new(seed ^ 0xbeef ^ r << 32);
                let mut nr = 0u64;
                let mut first_bad: Option<String> = None;
                let mut keys = Vec::new();
                let mut wants = Vec::new();
                let mut out = Vec::new();
                while !done.load(Ordering::Acquire) || nr < MIN_READS {
                    for _ in 0..64 {
                        match rng.below(8) {
                            0..=2 => {
                                // Sweep in order half the time: neighbouring
                                // heads are rehashed together.
                                let i = if nr.is_multiple_of(2) {
                                    (nr / 2) % stable.len() as u64
                                } else {
                                    rng.below(stable.len() as u64)
                                };
                                let k = stable[i as usize];
                                match e.get(k) {
                                    Some(v) if v == val(k, 7) => {}
                                    Some(v) => {
                                        wrong.fetch_add(1, Ordering::Relaxed);
                                        first_bad
                                            .get_or_insert(format!("stable {k:#x} read {v:#x}"));
                                    }
                                    None => {
                                        misses.fetch_add(1, Ordering::Relaxed);
                                        first_bad
                                            .get_or_insert(format!("stable {k:#x} read absent"));
                                    }
                                }
                            }
                            3 => {
                                let k = never[rng.below(never.len() as u64) as usize];
                                if let Some(v) = e.get(k) {
                                    phantoms.fetch_add(1, Ordering::Relaxed);
                                    first_bad.get_or_insert(format!(
                                        "never-inserted {k:#x} read {v:#x}"
                                    ));
                                }
                            }
                            4 => {
                                // A batch of stable and never-inserted keys.
                                keys.clear();
                                wants.clear();
                                for _ in 0..rng.below(40) {
                                    if rng.below(2) == 0 {
                                        let k = stable[rng.below(stable.len() as u64) as usize];
                                        keys.push(k);
                                        wants.push(Some(val(k, 7)));
                                    } else {
                                        keys.push(never[rng.below(never.len() as u64) as usize]);
                                        wants.push(None);
                                    }
                                }
                                out.clear();
                                out.resize(keys.len(), Some(0));
                                e.get_many(&keys, &mut out);
                                for ((k, o), &want) in keys.iter().zip(&out).zip(&wants) {
                                    if *o != want {
                                        match o {
                                            None => misses.fetch_add(1, Ordering::Relaxed),
                                            Some(_) if want.is_none() => {
                                                phantoms.fetch_add(1, Ordering::Relaxed)
                                            }
                                            Some(_) => wrong.fetch_add(1, Ordering::Relaxed),
                                        };
                                        first_bad.get_or_insert(format!(
                                            "get_many {k:#x}: {o:?}, want {want:?}"
                                        ));
                                    }
                                }
                            }
                            _ => {
                                let k = wkey(rng.below(writers), rng.below(n));
                                if let Some(v) = e.get(k) {
                                    if version_of(k, v) >= VER_LIMIT {
                                        wrong.fetch_add(1, Ordering::Relaxed);
                                        first_bad.get_or_insert(format!(
                                            "writer key {k:#x} read {v:#x}"
                                        ));
                                    }
                                    hits.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                        nr += 1;
                    }
                }
                reads.fetch_add(nr, Ordering::Relaxed);
                assert_eq!(first_bad, None, "reader {r}");
            });
        }
        let hs: Vec<_> = (0..writers)
            .map(|w| {
                sc.spawn(move || {
                    let mut model: HashMap<u64, u64> = HashMap::new();
                    let mut rng = Rng::new(seed ^ 0x77 ^ w << 30);
                    let mut ver = 0;
                    for i in 0..n {
                        ver += 1;
                        let k = wkey(w, i);
                        assert!(e.insert(k, val(k, ver)).unwrap(), "w{w} insert {k:#x}");
                        model.insert(k, val(k, ver));
                        // Now and then another op on an earlier key.
                        let j = wkey(w, rng.below(i + 1));
                        let present = model.get(&j).copied();
                        ver += 1;
                        match rng.below(10) {
                            0 | 1 => {
                                assert_eq!(
                                    e.remove(j).unwrap(),
                                    present.is_some(),
                                    "w{w} remove {j:#x}"
                                );
                                model.remove(&j);
                            }
                            2 => {
                                assert_eq!(
                                    e.update(j, val(j, ver)).unwrap(),
                                    present.is_some(),
                                    "w{w} update {j:#x}"
                                );
                                if present.is_some() {
                                    model.insert(j, val(j, ver));
                                }
                            }
                            3 => {
                                e.upsert(j, val(j, ver)).unwrap();
                                model.insert(j, val(j, ver));
                            }
                            4 => {
                                let v = val(j, ver);
                                assert_eq!(
                                    e.insert(j, v).unwrap(),
                                    present.is_none(),
                                    "w{w} re-insert {j:#x}"
                                );
                                model.entry(j).or_insert(v);
                            }
                            _ => assert_eq!(e.get(j), present, "w{w} get {j:#x}"),
                        }
                    }
                    for i in 0..n {
                        let k = wkey(w, i);
                        assert_eq!(
                            e.get(k),
                            model.get(&k).copied(),
                            "w{w} final read of key {i}"
                        );
                    }
                    model
                })
            })
            .collect();
        engine::testkit::join_then_stop(hs, &done)
    });
    let (r1, g1) = growth(e);
    let ctx = &format!("writers and readers, seed {seed}");
    eprintln!(
        "{ctx}: {} resizes and {} filter growths during the race, 2^{} heads, {} reads ({} writer-key hits), {} reader retries, {:.2}s",
        r1 - r0,
        g1 - g0,
        head_k(e),
        reads.load(Ordering::Relaxed),
        hits.load(Ordering::Relaxed),
        e.tallies().reader_retries,
        started.elapsed().as_secs_f64()
    );
    assert_eq!(misses.load(Ordering::Relaxed), 0, "{ctx}: false negatives");
    assert_eq!(wrong.load(Ordering::Relaxed), 0, "{ctx}: wrong values");
    assert_eq!(phantoms.load(Ordering::Relaxed), 0, "{ctx}: phantom keys");
    assert!(
        r1 - r0 >= 8,
        "{ctx}: only {} resizes raced the readers",
        r1 - r0
    );
    assert!(
        g1 - g0 >= 4,
        "{ctx}: only {} filter growths raced the readers",
        g1 - g0
    );
    assert!(reads.load(Ordering::Relaxed) >= 2 * MIN_READS);
    assert!(
        hits.load(Ordering::Relaxed) > 0,
        "{ctx}: readers never hit a writer's key"
    );
    let mut model: HashMap<u64, u64> = stable.iter().map(|&k| (k, val(k, 7))).collect();
    for m in models {
        model.extend(m);
    }
    let mut absent = never.clone();
    for w in 0..writers {
        absent.extend((0..n).map(|i| wkey(w, i)));
    }
    verify(e, &pool, &model, &absent, ctx);
}

/// (b) Updates racing readers: each versioned key has one updater, which
/// writes rising versions (update and upsert); a filler thread inserts keys
/// meanwhile so that resizes and filter growths interleave. Readers see
/// only values written for the key, and never an older version than one
/// they saw before; the final value of every key is its last write.
#[test]
fn readers_see_only_written_values_never_going_back() {
    let seed = 2;
    let (pool, e) = table(seed);
    let versioned: Vec<u64> = (0..128).map(|i| key_of(VERSIONED_T, i)).collect();
    for &k in &versioned {
        assert!(e.insert(k, val(k, 0)).unwrap());
    }
    let updaters = 2usize;
    let rounds = 300u64;
    let filler_n = 40_000u64;
    let (r0, g0) = growth(&e);
    let done = AtomicBool::new(false);
    let reads = AtomicU64::new(0);
    let changes = AtomicU64::new(0);
    let e = &e;
    let finals: Vec<HashMap<u64, u64>> = std::thread::scope(|sc| {
        for r in 0..2u64 {
            let (versioned, done, reads, changes) = (&versioned, &done, &reads, &changes);
            sc.spawn(move || {
                let mut rng = Rng::new(seed ^ r << 16);
                let mut last = vec![0u64; versioned.len()];
                let mut nr = 0u64;
                let mut seen_change = 0u64;
                while !done.load(Ordering::Acquire) || nr < MIN_READS {
                    for _ in 0..64 {
                        let i = rng.below(versioned.len() as u64) as usize;
                        let k = versioned[i];
                        let v = e.get(k).unwrap_or_else(|| {
                            panic!("reader {r}: versioned key {k:#x} read absent")
                        });
                        let ver = check_value(k, v, "versioned");
                        assert!(
                            ver >= last[i],
                            "reader {r}: {k:#x} went back from version {} to {ver}",
                            last[i]
                        );
                        if ver > last[i] {
                            seen_change += 1;
                        }
                        last[i] = ver;
                        nr += 1;
                    }
                }
                reads.fetch_add(nr, Ordering::Relaxed);
                changes.fetch_add(seen_change, Ordering::Relaxed);
            });
        }
        let filler = sc.spawn(move || {
            let mut m = HashMap::new();
            for i in 0..filler_n {
                let k = key_of(0x1111, i);
                assert!(e.insert(k, val(k, 1)).unwrap());
                m.insert(k, val(k, 1));
            }
            m
        });
        let mut hs: Vec<_> = (0..updaters)
            .map(|u| {
                let versioned = &versioned;
                sc.spawn(move || {
                    let mut fin = HashMap::new();
                    for ver in 1..=rounds {
                        for (i, &k) in versioned.iter().enumerate() {
                            if i % updaters != u {
                                continue;
                            }
                            if ver % 3 == 0 {
                                e.upsert(k, val(k, ver)).unwrap();
                            } else {
                                assert!(e.update(k, val(k, ver)).unwrap(), "update {k:#x}");
                            }
                            fin.insert(k, val(k, ver));
                        }
                    }
                    fin
                })
            })
            .collect();
        hs.push(filler);
        engine::testkit::join_then_stop(hs, &done)
    });
    let (r1, g1) = growth(e);
    eprintln!(
        "updates racing readers: {} resizes, {} filter growths, {} reads, {} version changes seen",
        r1 - r0,
        g1 - g0,
        reads.load(Ordering::Relaxed),
        changes.load(Ordering::Relaxed)
    );
    assert!(r1 - r0 >= 6, "only {} resizes during the updates", r1 - r0);
    assert!(
        changes.load(Ordering::Relaxed) > 0,
        "readers never saw an update"
    );
    let mut model = HashMap::new();
    for m in finals {
        model.extend(m);
    }
    for &k in &versioned {
        assert_eq!(model[&k], val(k, rounds), "the last write of {k:#x}");
    }
    verify(e, &pool, &model, &[], "updates racing readers");
}

/// (c) Several threads insert the same keys (each its own value), from a
/// 16-head table so that the inserts race resizes: exactly one insert per
/// key returns true, and the key holds the winner's value; `check()` finds
/// no key twice. Then they all remove the same keys: exactly one remove per
/// key returns true. Then they all upsert the same keys: every key holds
/// one of the values written. Two rounds.
#[test]
fn same_key_insert_remove_and_upsert_races() {
    let seed = 3;
    let (pool, e) = table(seed);
    let threads = 3u64;
    let n = 12_000u64;
    let keys: Vec<u64> = (0..n)
        .map(|i| match i {
            0 => 0,
            1 => u64::MAX,
            2 => 1,
            3 => u64::MAX - 1,
            _ => key_of(0x5a, i),
        })
        .collect();
    let e = &e;
    for round in 0..2u64 {
        let r0 = e.tallies().resizes;
        let barrier = Barrier::new(threads as usize);
        let wins: Vec<Vec<u64>> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..threads)
                .map(|t| {
                    let (keys, barrier) = (&keys, &barrier);
                    sc.spawn(move || {
                        barrier.wait();
                        let mut won = Vec::new();
                        for j in 0..n {
                            // Thread t starts at its own offset, so every key
                            // is contended by two threads at some point.
                            let k = keys[((j + t * 7) % n) as usize];
                            if e.insert(k, val(k, t + 1 + round * 10)).unwrap() {
                                won.push(k);
                            }
                            let v = e
                                .get(k)
                                .unwrap_or_else(|| panic!("t{t}: {k:#x} absent after an insert"));
                            let ver = version_of(k, v);
                            assert!(
                                (round * 10 + 1..=round * 10 + threads).contains(&ver),
                                "t{t}: {k:#x} holds {v:#x}, never written"
                            );
                        }
                        won
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut winner: HashMap<u64, u64> = HashMap::new();
        for (t, won) in wins.iter().enumerate() {
            for &k in won {
                assert!(
                    winner.insert(k, t as u64).is_none(),
                    "round {round}: two inserts of {k:#x} returned true"
                );
            }
        }
        assert_eq!(
            winner.len() as u64,
            n,
            "round {round}: some key had no successful insert"
        );
        let model: HashMap<u64, u64> = winner
            .iter()
            .map(|(&k, &t)| (k, val(k, t + 1 + round * 10)))
            .collect();
        verify(
            e,
            &pool,
            &model,
            &[],
            &format!("round {round} after the insert race"),
        );
        if round == 0 {
            let r = e.tallies().resizes - r0;
            assert!(r >= 6, "round 0: only {r} resizes during the insert race");
        }
        // Remove race.
        let barrier = Barrier::new(threads as usize);
        let removed: Vec<u64> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..threads)
                .map(|t| {
                    let (keys, barrier) = (&keys, &barrier);
                    sc.spawn(move || {
                        barrier.wait();
                        let mut c = 0u64;
                        for j in 0..n {
                            let k = keys[((j + t * 5) % n) as usize];
                            if e.remove(k).unwrap() {
                                c += 1;
                            }
                            assert_eq!(e.get(k), None, "t{t}: {k:#x} present after a remove");
                        }
                        c
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(
            removed.iter().sum::<u64>(),
            n,
            "round {round}: successful removes {removed:?} do not add up to {n}"
        );
        verify(
            e,
            &pool,
            &HashMap::new(),
            &keys,
            &format!("round {round} after the remove race"),
        );
        // Upsert race: every key ends with one of the values written.
        let barrier = Barrier::new(threads as usize);
        std::thread::scope(|sc| {
            for t in 0..threads {
                let (keys, barrier) = (&keys, &barrier);
                sc.spawn(move || {
                    barrier.wait();
                    for j in 0..n {
                        let k = keys[((j + t * 3) % n) as usize];
                        e.upsert(k, val(k, 100 + t)).unwrap();
                    }
                });
            }
        });
        let mut model = HashMap::new();
        for &k in &keys {
            let v = e
                .get(k)
                .unwrap_or_else(|| panic!("round {round}: {k:#x} absent after upserts"));
            let ver = version_of(k, v);
            assert!(
                (100..100 + threads).contains(&ver),
                "round {round}: {k:#x} holds {v:#x}"
            );
            model.insert(k, v);
        }
        verify(
            e,
            &pool,
            &model,
            &[],
            &format!("round {round} after the upsert race"),
        );
        for &k in &keys {
            assert!(e.remove(k).unwrap());
        }
        verify(
            e,
            &pool,
            &HashMap::new(),
            &keys,
            &format!("round {round} emptied"),
        );
    }
}

/// Threads insert, remove and update a small hot key set at random (and
/// insert filler keys that make the table and the filter grow meanwhile).
/// Per key, successful inserts minus successful removes must be 1 if it is
/// present at the end and 0 if not; a value read is always one some thread
/// wrote; `check()` proves every stored key's fingerprint is in the
/// filter.
#[test]
fn hot_key_insert_remove_churn_keeps_counts() {
    let (pool, e) = table(4);
    let hot: Vec<u64> = (0..64).map(|i| key_of(0x77, i)).collect();
    let filler: Vec<u64> = (0..6000).map(|i| key_of(0x78, i)).collect();
    let threads = 3u64;
    let e = &e;
    let per: Vec<(Vec<i64>, HashMap<u64, u64>)> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (hot, filler) = (&hot, &filler);
                sc.spawn(move || {
                    let mut rng = Rng::new(0x4040 ^ t);
                    let mut net = vec![0i64; hot.len()];
                    let mut mine = HashMap::new();
                    for j in 0..60_000u64 {
                        let i = rng.below(hot.len() as u64) as usize;
                        let k = hot[i];
                        match rng.below(3) {
                            0 => {
                                if e.insert(k, val(k, t)).unwrap() {
                                    net[i] += 1;
                                }
                            }
                            1 => {
                                if e.remove(k).unwrap() {
                                    net[i] -= 1;
                                }
                            }
                            _ => {
                                // An update never changes presence.
                                let _ = e.update(k, val(k, t + 100)).unwrap();
                            }
                        }
                        if let Some(v) = e.get(k) {
                            let ver = version_of(k, v);
                            assert!(
                                ver < threads || (100..100 + threads).contains(&ver),
                                "t{t}: {k:#x} holds a value never written"
                            );
                        }
                        if j % 10 == 0 && (j / 10) % threads == t {
                            let f = filler[((j / 10) / threads) as usize % filler.len()];
                            if e.insert(f, val(f, 9)).unwrap() {
                                mine.insert(f, val(f, 9));
                            }
                        }
                    }
                    (net, mine)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut model: HashMap<u64, u64> = HashMap::new();
    for (_, mine) in &per {
        model.extend(mine.iter().map(|(k, v)| (*k, *v)));
    }
    for (i, &k) in hot.iter().enumerate() {
        let net: i64 = per.iter().map(|(n, _)| n[i]).sum();
        match e.get(k) {
            Some(v) => {
                assert_eq!(
                    net, 1,
                    "hot key {i}: present, but inserts - removes = {net}"
                );
                model.insert(k, v);
            }
            None => assert_eq!(net, 0, "hot key {i}: absent, but inserts - removes = {net}"),
        }
    }
    assert!(e.tallies().resizes >= 5);
    verify(e, &pool, &model, &hot, "hot churn");
}

/// A table reserved ahead of its doubling, on a file pool, for several
/// writers: the thread that faults its heads' pages in runs beside the
/// inserts and reaches every whole page of them (by the tally), the
/// doubling takes that very table, and every key is there, before and
/// after a clean reopen. For one writer the table is reserved ahead and
/// taken the same way, and nothing is faulted in ahead.
#[test]
fn table_reserved_ahead_on_a_file_pool_is_faulted_in_for_several_writers() {
    reserved_ahead_on_a_file_pool(2);
    reserved_ahead_on_a_file_pool(1);
}

fn reserved_ahead_on_a_file_pool(writers: usize) {
    use pmhash_rophi::layout::{BUCKET, PREPARE_MIN_K, R_NEXT, R_TABLE};
    let tmp = TempPath::new("ahead");
    let popts = pool_opts(Mode::Mapped, 4 * MIB, 128 * MIB, 0xa4ead);
    let pool = Arc::new(Pool::create(tmp.path(), &popts).unwrap());
    let e = Rophi::create(pool.clone(), &cfg(16, writers)).unwrap();
    let root = pool.root();
    // A table of 2^16 heads (4 MiB, so the thread's 2 MiB steps end inside
    // it) reserved ahead of a 2^15-head one.
    let k = PREPARE_MIN_K + 4;
    let key = |i: u64| fmix(i ^ 0xfa17);
    let mut model = HashMap::new();
    let mut i = 0u64;
    let mut fill = |e: &Rophi, stop: &dyn Fn(&Rophi) -> bool| {
        while !stop(e) {
            assert!(e.insert(key(i), i).unwrap());
            model.insert(key(i), i);
            i += 1;
            assert!(i < 200_000, "the table never reached its mark");
        }
    };
    // Every earlier table's thread has been stopped by its doubling.
    fill(&e, &|e| head_k(e) == k);
    let before = e.tallies().prefaulted_mib.0;
    let prepared = e.tallies().tables_prepared;
    assert!(prepared >= 4, "only {prepared} tables were reserved ahead");
    assert_eq!(e.tallies().ahead_taken, prepared);
    fill(&e, &|e| e.tallies().tables_prepared > prepared);
    let ahead = pool.load_u64(root + R_NEXT);
    assert_ne!(ahead, 0);
    if writers > 1 {
        // Its heads start one line into the block: every whole page but
        // the first.
        let want = ((BUCKET << (k + 1)) - 4096) as f64 / MIB as f64;
        let start = Instant::now();
        while e.tallies().prefaulted_mib.0 - before < want {
            assert!(
                start.elapsed().as_secs() < 60,
                "{} MiB faulted in ahead, {want} wanted",
                e.tallies().prefaulted_mib.0 - before
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(
            e.tallies().prefaulted_mib.0 - before,
            want,
            "faulted past the heads"
        );
    }
    fill(&e, &|e| head_k(e) == k + 1);
    assert_eq!(pool.load_u64(root + R_TABLE), ahead);
    assert_eq!(
        e.tallies().ahead_taken,
        prepared + 1,
        "the doubling took another table"
    );
    if writers == 1 {
        assert_eq!(
            e.tallies().prefaulted_mib.0,
            0.0,
            "one writer, yet faulted in ahead"
        );
    }
    verify(&e, &pool, &model, &[key(i)], "after the doubling");
    let (pool, e) = reopen_file(e, pool, tmp.path(), &popts);
    verify(&e, &pool, &model, &[key(i)], "after a clean reopen");
}
