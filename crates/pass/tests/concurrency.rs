//! Concurrency: writers on disjoint key ranges racing spiral expansions
//! (tiny segments: a split every few dozen inserts) while readers check
//! every value they get (no torn or foreign value, no version going back,
//! no false negative for keys that stay, no phantom key); same-key insert,
//! remove and upsert races. Every test ends with a full model check.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use common::*;
use engine::testkit::{val, version_of};
use engine::Engine;
use pmem::{Mode, Pool};
use pmhash_pass::{Options, Pass};

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

/// Checks a value a reader got for `k`: it decodes to a version that
/// could have been written.
fn check_value(k: u64, v: u64, what: &str) -> u64 {
    let ver = version_of(k, v);
    assert!(
        ver < VER_LIMIT,
        "{what}: get({k:#x}) returned {v:#x}, a value never written to that key (torn or foreign)"
    );
    ver
}

/// A tiny-segment table (4 + 2 buckets; first = 1) in a volatile pool.
fn table(bytes: bool, seed: u64) -> (Arc<Pool>, Pass) {
    let (pool, e) = table_with(seed, &mode_opts(bytes));
    assert_eq!(e.geometry().n, 4);
    (pool, e)
}

/// A dense table: 16 + 2 buckets (three chain groups), split load 1.05,
/// so stash and chain records, their filters and compaction are in play
/// on every path.
fn dense_table(seed: u64) -> (Arc<Pool>, Pass) {
    let (pool, e) = table_with(
        seed,
        &Options {
            normal_buckets: Some(16),
            stash_buckets: Some(2),
            split_load: 1.05,
            ..Options::default()
        },
    );
    assert_eq!(e.geometry().groups(), 3);
    (pool, e)
}

fn table_with(seed: u64, opts: &Options) -> (Arc<Pool>, Pass) {
    let pool = mem_pool(Mode::Volatile, 8 * MIB, 256 * MIB, seed);
    let e = Pass::create_with(pool.clone(), &cfg(1, 4), opts).unwrap();
    assert_eq!(e.first_segment(), 1);
    (pool, e)
}

/// Writers own disjoint key ranges (writer 0 also owns 0 and u64::MAX) and
/// check every return value against their own model while the table grows
/// from one segment through many splits, shrinks and grows again; writer
/// `w` also updates its share of the versioned keys with rising versions.
/// Readers run all along: stable keys always hold their value, versioned
/// keys never go back, writer keys hold None or a value once written,
/// never-inserted keys are always None.
fn writers_and_readers(bytes: bool, writers: usize, readers: usize, n: u64, seed: u64) {
    writers_and_readers_on(bytes, table(bytes, seed), writers, readers, n, seed, 0);
}

fn writers_and_readers_on(
    bytes: bool,
    (pool, e): (Arc<Pool>, Pass),
    writers: usize,
    readers: usize,
    n: u64,
    seed: u64,
    min_chain_inserts: u64,
) {
    let started = Instant::now();
    const STABLE: u64 = 300;
    const VERSIONED: u64 = 64;
    let stable: Vec<u64> = (0..STABLE).map(|i| key_of(STABLE_T, i)).collect();
    let versioned: Vec<u64> = (0..VERSIONED).map(|i| key_of(VERSIONED_T, i)).collect();
    let never: Vec<u64> = (0..256).map(|i| key_of(NEVER_T, i)).collect();
    let wkey = |w: u64, i: u64| -> u64 {
        match (w, i) {
            (0, 0) => 0,
            (0, 1) => u64::MAX,
            _ => key_of(w, i),
        }
    };
    let mut all = HashSet::new();
    for k in stable.iter().chain(&versioned).chain(&never) {
        assert!(all.insert(*k));
    }
    for w in 0..writers as u64 {
        for i in 0..n {
            assert!(all.insert(wkey(w, i)), "key {:#x} twice", wkey(w, i));
        }
    }
    for &k in stable.iter().chain(&versioned) {
        assert!(e.insert(k, val(k, 0)).unwrap());
    }
    let splits_before = e.tallies().splits;
    let done = AtomicBool::new(false);
    let reads = AtomicU64::new(0);
    let hits = AtomicU64::new(0);
    let barrier = Barrier::new(writers);
    let e = &e;
    let results: Vec<(HashMap<u64, u64>, HashMap<u64, u64>)> = std::thread::scope(|sc| {
        for r in 0..readers as u64 {
            let (stable, versioned, never, done, reads, hits) =
                (&stable, &versioned, &never, &done, &reads, &hits);
            sc.spawn(move || {
                let mut rng = Rng::new(seed ^ 0xbeef ^ r << 32);
                let mut last = vec![0u64; versioned.len()];
                let (mut nr, mut nh) = (0u64, 0u64);
                while !done.load(Ordering::Acquire) || nr < MIN_READS {
                    for _ in 0..64 {
                        match rng.below(8) {
                            0 | 1 => {
                                let k = stable[rng.below(stable.len() as u64) as usize];
                                assert_eq!(
                                    e.get(k),
                                    Some(val(k, 0)),
                                    "reader {r}: stable key {k:#x} lost or changed"
                                );
                            }
                            2 | 3 => {
                                let i = rng.below(versioned.len() as u64) as usize;
                                let k = versioned[i];
                                let v = e.get(k).unwrap_or_else(|| {
                                    panic!("reader {r}: versioned key {k:#x} missing")
                                });
                                let ver = check_value(k, v, "versioned");
                                assert!(
                                    ver >= last[i],
                                    "reader {r}: {k:#x} went back from version {} to {ver}",
                                    last[i]
                                );
                                last[i] = ver;
                            }
                            4 => {
                                let k = never[rng.below(never.len() as u64) as usize];
                                assert_eq!(e.get(k), None, "reader {r}: phantom key {k:#x}");
                            }
                            _ => {
                                let w = rng.below(writers as u64);
                                let k = wkey(w, rng.below(n));
                                if let Some(v) = e.get(k) {
                                    check_value(k, v, "writer range");
                                    nh += 1;
                                }
                            }
                        }
                        nr += 1;
                    }
                }
                reads.fetch_add(nr, Ordering::Relaxed);
                hits.fetch_add(nh, Ordering::Relaxed);
            });
        }
        let ws: Vec<_> = (0..writers as u64)
            .map(|w| {
                let (versioned, barrier) = (&versioned, &barrier);
                sc.spawn(move || {
                    let mut rng = Rng::new(seed ^ w << 40);
                    let mut model: HashMap<u64, u64> = HashMap::new();
                    let mut vers: HashMap<u64, u64> = HashMap::new();
                    let mut ver = 0u64;
                    let mut step = |wt: [u64; 5], rng: &mut Rng, model: &mut HashMap<u64, u64>| {
                        ver += 1;
                        let k = wkey(w, rng.below(n));
                        let v = val(k, ver);
                        let present = model.get(&k).copied();
                        let sum: u64 = wt.iter().sum();
                        let mut p = rng.below(sum);
                        let mut op = 0;
                        while p >= wt[op] {
                            p -= wt[op];
                            op += 1;
                        }
                        match op {
                            0 => {
                                assert_eq!(
                                    e.insert(k, v).unwrap(),
                                    present.is_none(),
                                    "w{w} insert {k:#x}"
                                );
                                model.entry(k).or_insert(v);
                            }
                            1 => assert_eq!(e.get(k), present, "w{w} get {k:#x}"),
                            2 => {
                                assert_eq!(
                                    e.update(k, v).unwrap(),
                                    present.is_some(),
                                    "w{w} update {k:#x}"
                                );
                                if present.is_some() {
                                    model.insert(k, v);
                                }
                            }
                            3 => {
                                e.upsert(k, v).unwrap();
                                model.insert(k, v);
                            }
                            _ => {
                                assert_eq!(
                                    e.remove(k).unwrap(),
                                    present.is_some(),
                                    "w{w} remove {k:#x}"
                                );
                                model.remove(&k);
                            }
                        }
                        assert_eq!(e.get(k), model.get(&k).copied(), "w{w} read back {k:#x}");
                        if ver.is_multiple_of(8) {
                            let i = (rng.below(versioned.len() as u64 / writers as u64)
                                * writers as u64
                                + w) as usize;
                            let k = versioned[i];
                            let v = val(k, ver);
                            if ver.is_multiple_of(16) {
                                e.upsert(k, v).unwrap();
                            } else {
                                assert!(e.update(k, v).unwrap(), "w{w} update versioned {k:#x}");
                            }
                            vers.insert(k, v);
                        }
                    };
                    for _ in 0..n * 2 {
                        step([65, 10, 10, 5, 10], &mut rng, &mut model);
                    }
                    barrier.wait();
                    while model.len() as u64 > n / 10 {
                        step([0, 5, 5, 0, 90], &mut rng, &mut model);
                    }
                    barrier.wait();
                    for _ in 0..n {
                        step([60, 10, 10, 10, 10], &mut rng, &mut model);
                    }
                    for i in 0..n {
                        assert_eq!(
                            e.get(wkey(w, i)),
                            model.get(&wkey(w, i)).copied(),
                            "w{w} final read of key {i}"
                        );
                    }
                    (model, vers)
                })
            })
            .collect();
        engine::testkit::join_then_stop(ws, &done)
    });
    let mut model = HashMap::new();
    for &k in stable.iter().chain(&versioned) {
        model.insert(k, val(k, 0));
    }
    for (m, vers) in &results {
        model.extend(m.iter().map(|(k, v)| (*k, *v)));
        model.extend(vers.iter().map(|(k, v)| (*k, *v)));
    }
    let ctx = format!(
        "{} {writers}w{readers}r seed {seed}",
        if bytes { "bytes" } else { "inline" }
    );
    // Absent: never-inserted keys and every writer key the model lacks
    // (removed ones included).
    let mut absent = never.clone();
    for w in 0..writers as u64 {
        absent.extend((0..n).map(|i| wkey(w, i)));
    }
    verify(e, &pool, &model, &absent, &ctx);
    let chained = e.tallies().chain_inserts;
    assert!(
        chained >= min_chain_inserts,
        "{ctx}: only {chained} chain inserts"
    );
    let splits = e.tallies().splits - splits_before;
    let (reads, hits) = (reads.load(Ordering::Relaxed), hits.load(Ordering::Relaxed));
    eprintln!(
        "{ctx}: {splits} splits, {} chain inserts, {reads} reads ({hits} writer-range hits), {} keys, {:.2}s",
        e.tallies().chain_inserts,
        model.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        splits >= 30,
        "{ctx}: only {splits} splits raced the readers"
    );
    assert_eq!(e.tallies().split_failures, 0, "{ctx}: a split failed");
    if readers > 0 {
        assert!(
            reads >= MIN_READS,
            "{ctx}: readers barely ran ({reads} reads)"
        );
        assert!(hits > 0, "{ctx}: readers never hit a writer's key");
    }
}

#[test]
fn writers_and_readers_2w_2r_inline() {
    writers_and_readers(false, 2, 2, 30_000, 1);
}

#[test]
fn writers_and_readers_3w_1r_inline() {
    writers_and_readers(false, 3, 1, 20_000, 2);
}

#[test]
fn writers_and_readers_2w_2r_bytes() {
    writers_and_readers(true, 2, 2, 20_000, 3);
}

/// Keys inserted before the readers start and never removed: while
/// writers insert (and remove) others, forcing split after split, every
/// get of a stable key returns exactly its value, never `None`.
fn no_false_negatives(bytes: bool, seed: u64) {
    no_false_negatives_on(bytes, table(bytes, seed), seed, 0);
}

fn no_false_negatives_on(
    bytes: bool,
    (pool, e): (Arc<Pool>, Pass),
    seed: u64,
    min_chain_inserts: u64,
) {
    let stable: Vec<u64> = (0..2000).map(|i| key_of(STABLE_T, i)).collect();
    for &k in &stable {
        assert!(e.insert(k, val(k, 7)).unwrap());
    }
    let before = e.tallies().splits;
    let writers = 2u64;
    let n = 60_000u64;
    let done = AtomicBool::new(false);
    let reads = AtomicU64::new(0);
    let misses = AtomicU64::new(0);
    let e = &e;
    let models: Vec<HashMap<u64, u64>> = std::thread::scope(|sc| {
        for r in 0..2u64 {
            let (stable, done, reads, misses) = (&stable, &done, &reads, &misses);
            sc.spawn(move || {
                let mut rng = Rng::new(seed ^ r << 20);
                let mut nr = 0u64;
                let mut first_miss = None;
                while !done.load(Ordering::Acquire) || nr < MIN_READS {
                    for _ in 0..128 {
                        // Sweep in order half the time: neighbouring keys
                        // land in the segment being split.
                        let i = if nr.is_multiple_of(2) {
                            (nr / 2) % stable.len() as u64
                        } else {
                            rng.below(stable.len() as u64)
                        };
                        let k = stable[i as usize];
                        match e.get(k) {
                            Some(v) => assert_eq!(v, val(k, 7), "reader {r}: {k:#x} changed"),
                            None => {
                                misses.fetch_add(1, Ordering::Relaxed);
                                first_miss.get_or_insert(k);
                            }
                        }
                        nr += 1;
                    }
                }
                reads.fetch_add(nr, Ordering::Relaxed);
                assert_eq!(first_miss, None, "reader {r}: a stable key read as absent");
            });
        }
        let hs: Vec<_> = (0..writers)
            .map(|w| {
                sc.spawn(move || {
                    let mut model = HashMap::new();
                    let mut rng = Rng::new(seed ^ 0x77 ^ w << 30);
                    for i in 0..n {
                        let k = key_of(w, i);
                        assert!(e.insert(k, val(k, 1)).unwrap());
                        model.insert(k, val(k, 1));
                        if rng.below(5) == 0 {
                            let j = rng.below(i + 1);
                            let kj = key_of(w, j);
                            assert_eq!(e.remove(kj).unwrap(), model.remove(&kj).is_some());
                        }
                    }
                    model
                })
            })
            .collect();
        engine::testkit::join_then_stop(hs, &done)
    });
    let splits = e.tallies().splits - before;
    let ctx = format!(
        "no false negatives ({}) seed {seed}",
        if bytes { "bytes" } else { "inline" }
    );
    eprintln!(
        "{ctx}: {splits} splits, {} reads, {} misses",
        reads.load(Ordering::Relaxed),
        misses.load(Ordering::Relaxed)
    );
    assert_eq!(misses.load(Ordering::Relaxed), 0, "{ctx}: false negatives");
    let chained = e.tallies().chain_inserts;
    assert!(
        chained >= min_chain_inserts,
        "{ctx}: only {chained} chain inserts"
    );
    assert!(
        splits >= 100,
        "{ctx}: only {splits} splits during the reads"
    );
    let mut model: HashMap<u64, u64> = stable.iter().map(|&k| (k, val(k, 7))).collect();
    for m in models {
        model.extend(m);
    }
    let absent: Vec<u64> = (0..writers)
        .flat_map(|w| (0..n).map(move |i| key_of(w, i)))
        .collect();
    verify(e, &pool, &model, &absent, &ctx);
}

#[test]
fn stable_keys_never_read_absent_during_splits_dense() {
    no_false_negatives_on(false, dense_table(12), 12, 1000);
}

#[test]
fn writers_and_readers_2w_2r_dense() {
    writers_and_readers_on(false, dense_table(4), 2, 2, 30_000, 4, 1000);
}

#[test]
fn stable_keys_never_read_absent_during_splits_inline() {
    no_false_negatives(false, 10);
}

#[test]
fn stable_keys_never_read_absent_during_splits_bytes() {
    no_false_negatives(true, 11);
}

/// Several threads insert the same keys (each its own value): exactly one
/// insert per key returns true, and the key holds the winner's value; then
/// they all remove the same keys: exactly one remove per key returns true.
/// Two rounds, the first growing the table through many splits.
fn same_key_races(bytes: bool, seed: u64) {
    let (pool, e) = table(bytes, seed);
    let threads = 3u64;
    let n = 20_000u64;
    let keys: Vec<u64> = (0..n)
        .map(|i| match i {
            0 => 0,
            1 => u64::MAX,
            _ => key_of(0x5a, i),
        })
        .collect();
    let e = &e;
    for round in 0..2u64 {
        let before = e.tallies().splits;
        let barrier = Barrier::new(threads as usize);
        // Each thread's successful inserts.
        let wins: Vec<Vec<u64>> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..threads)
                .map(|t| {
                    let (keys, barrier) = (&keys, &barrier);
                    sc.spawn(move || {
                        barrier.wait();
                        let mut won = Vec::new();
                        // Thread t walks from its own offset, so every key
                        // is contended at some point by two threads at once.
                        for j in 0..n {
                            let k = keys[((j + t * 7) % n) as usize];
                            if e.insert(k, val(k, t + 1 + round * 10)).unwrap() {
                                won.push(k);
                            }
                            assert!(e.get(k).is_some(), "t{t}: {k:#x} absent after an insert");
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
            &format!("round {round} after insert race"),
        );
        if round == 0 {
            let s = e.tallies().splits - before;
            assert!(s >= 20, "round 0: only {s} splits during the insert race");
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
            &format!("round {round} after remove race"),
        );
    }
}

#[test]
fn same_key_insert_and_remove_races_inline() {
    same_key_races(false, 20);
}

#[test]
fn same_key_insert_and_remove_races_bytes() {
    same_key_races(true, 21);
}

/// Threads insert, remove and update a small hot key set at random (and
/// race on filler keys that make the table split meanwhile). Per key,
/// successful inserts minus successful removes must be 1 if it is present
/// at the end and 0 if not; a value read is always one some thread wrote.
#[test]
fn hot_key_insert_remove_churn_keeps_counts() {
    for bytes in [false, true] {
        let (pool, e) = table(bytes, 30 + bytes as u64);
        let hot: Vec<u64> = (0..64).map(|i| key_of(0x77, i)).collect();
        // Filler keys so the hot keys live among splits.
        let filler: Vec<u64> = (0..2000).map(|i| key_of(0x78, i)).collect();
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
                        for j in 0..100_000u64 {
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
                            // Every third op also grows the table.
                            if j % 3 == 0 && (j / 3) % threads == t {
                                let f = filler[((j / 3) / threads) as usize % filler.len()];
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
        assert!(e.tallies().splits >= 10);
        verify(e, &pool, &model, &hot, &format!("hot churn bytes={bytes}"));
    }
}
