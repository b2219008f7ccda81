//! Concurrency stress: writers on disjoint key ranges racing splits,
//! doublings and merges while readers check every value they get (no torn
//! or invented value, no false negative for stable keys, no version going
//! back), overflow chains growing under readers, same-key insert/remove
//! races and shared hot keys. Every test ends with a full model check.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use common::*;
use engine::testkit::{val, version_of};
use engine::{Durability, Engine};
use pmem::Mode;
use pmhash_hmeh::{Hmeh, Options};

/// Each reader reads at least this often (on after the writers if need be).
const MIN_READS: u64 = 20_000;

/// Versions written by the tests stay below this; a value that decodes to
/// a larger version was never written to that key.
const VER_LIMIT: u64 = 1 << 32;

/// Key `i` of writer `t` (`t` < 0xfff0), of the stable set (`STABLE_T`)
/// or of the versioned set (`VERSIONED_T`).
fn key_of(t: u64, i: u64) -> u64 {
    fmix(t << 48 | i)
}
const STABLE_T: u64 = 0xffff;
const VERSIONED_T: u64 = 0xfffe;

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

struct Shape {
    mode: Mode,
    durability: Durability,
    writers: usize,
    readers: usize,
    /// Keys per writer.
    n: u64,
    seed: u64,
    /// A thread that calls `sync()` over and over while the others run.
    syncer: bool,
    options: Options,
}

/// Writers own disjoint key ranges (writer 0 also owns 0, u64::MAX and the
/// zero-hash key) and check every return value against their own model,
/// while the table grows from one 1 KiB segment, drains (merges) and grows
/// again. Readers run all along.
fn writers_and_readers(s: Shape) {
    let started = Instant::now();
    let threads = s.writers + s.readers + s.syncer as usize;
    let c = cfg(s.durability, 1, threads);
    let mut t = Table::create(s.mode, 256 * MIB, &c, &s.options, s.seed);
    let z = t.e().zero_hash_key();
    const STABLE: u64 = 400;
    const VERSIONED: u64 = 128;
    let stable: Vec<u64> = (0..STABLE).map(|i| key_of(STABLE_T, i)).collect();
    let versioned: Vec<u64> = (0..VERSIONED).map(|i| key_of(VERSIONED_T, i)).collect();
    let wkey = |w: u64, i: u64| -> u64 {
        match (w, i) {
            (0, 0) => 0,
            (0, 1) => u64::MAX,
            (0, 2) => z,
            _ => key_of(w, i),
        }
    };
    // Every key distinct (fmix is a bijection; the edge keys are checked).
    let mut all = HashSet::new();
    for k in stable.iter().chain(&versioned) {
        assert!(all.insert(*k));
    }
    for w in 0..s.writers as u64 {
        for i in 0..s.n {
            assert!(all.insert(wkey(w, i)), "key {:#x} twice", wkey(w, i));
        }
    }
    for &k in stable.iter().chain(&versioned) {
        assert!(t.e().insert(k, val(k, 0)).unwrap());
    }
    let before = (
        t.e().tallies().splits,
        t.e().tallies().doublings,
        t.e().tallies().merges,
    );
    let done = AtomicBool::new(false);
    let reads = AtomicU64::new(0);
    let hits = AtomicU64::new(0);
    let syncs = AtomicU64::new(0);
    let barrier = Barrier::new(s.writers);
    let e: &Hmeh = t.e();
    let results: Vec<(HashMap<u64, u64>, HashMap<u64, u64>)> = std::thread::scope(|sc| {
        for r in 0..s.readers as u64 {
            let (stable, versioned, done, reads, hits) =
                (&stable, &versioned, &done, &reads, &hits);
            let (writers, n, seed) = (s.writers as u64, s.n, s.seed);
            sc.spawn(move || {
                let mut rng = Rng::new(seed ^ 0xbeef ^ r << 32);
                let mut last = vec![0u64; versioned.len()];
                let (mut nr, mut nh) = (0u64, 0u64);
                // Readers race the writers, then read on to a minimum count
                // (so the checks below never depend on scheduling).
                while !done.load(Ordering::Acquire) || nr < MIN_READS {
                    for _ in 0..64 {
                        match rng.below(4) {
                            0 => {
                                let k = stable[rng.below(stable.len() as u64) as usize];
                                assert_eq!(
                                    e.get(k),
                                    Some(val(k, 0)),
                                    "reader {r}: stable key {k:#x} lost or changed"
                                );
                            }
                            1 => {
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
                            _ => {
                                let w = rng.below(writers);
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
        if s.syncer {
            let (done, syncs) = (&done, &syncs);
            sc.spawn(move || {
                while !done.load(Ordering::Acquire) {
                    e.sync().unwrap();
                    syncs.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_micros(300));
                }
            });
        }
        let ws: Vec<_> = (0..s.writers as u64)
            .map(|w| {
                let (versioned, barrier) = (&versioned, &barrier);
                let (writers, n, seed) = (s.writers as u64, s.n, s.seed);
                sc.spawn(move || {
                    let mut rng = Rng::new(seed ^ w << 40);
                    let mut model: HashMap<u64, u64> = HashMap::new();
                    // Versioned keys of this writer: index i with i % writers == w.
                    let mut vers: HashMap<u64, u64> = HashMap::new();
                    let mut ver = 0u64;
                    let mut step = |wt: [u64; 4], rng: &mut Rng, model: &mut HashMap<u64, u64>| {
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
                            _ => {
                                assert_eq!(
                                    e.remove(k).unwrap(),
                                    present.is_some(),
                                    "w{w} remove {k:#x}"
                                );
                                model.remove(&k);
                            }
                        }
                        if ver.is_multiple_of(8) {
                            let i = (rng.below(versioned.len() as u64 / writers) * writers + w)
                                as usize;
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
                        step([70, 10, 10, 10], &mut rng, &mut model);
                    }
                    for _ in 0..n {
                        step([25, 25, 25, 25], &mut rng, &mut model);
                    }
                    barrier.wait();
                    while model.len() as u64 > n / 20 {
                        step([0, 5, 5, 90], &mut rng, &mut model);
                    }
                    barrier.wait();
                    for _ in 0..n / 2 {
                        step([60, 20, 10, 10], &mut rng, &mut model);
                    }
                    for i in 0..n {
                        assert_eq!(e.get(wkey(w, i)), model.get(&wkey(w, i)).copied());
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
        "{:?} {:?} {}w{}r seed {}",
        s.mode, s.durability, s.writers, s.readers, s.seed
    );
    let absent: Vec<u64> = (0..64).map(|i| key_of(0xfff0, i)).collect();
    verify_model(t.e(), t.pool(), &model, &absent, &ctx);
    let (splits, doublings, merges) = (
        t.e().tallies().splits - before.0,
        t.e().tallies().doublings - before.1,
        t.e().tallies().merges - before.2,
    );
    let (reads, hits, syncs) = (
        reads.load(Ordering::Relaxed),
        hits.load(Ordering::Relaxed),
        syncs.load(Ordering::Relaxed),
    );
    eprintln!(
        "{ctx}: {splits} splits, {doublings} doublings, {merges} merges, {reads} reads ({hits} writer-range hits), {syncs} syncs, {:.2}s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        splits >= 20,
        "{ctx}: only {splits} splits raced the readers"
    );
    assert!(doublings >= 2, "{ctx}: only {doublings} doublings");
    assert!(merges >= 1, "{ctx}: no merge raced the readers");
    if s.readers > 0 {
        assert!(
            reads >= MIN_READS,
            "{ctx}: readers barely ran ({reads} reads)"
        );
        assert!(hits > 0, "{ctx}: readers never hit a writer's key");
    }
    if s.syncer {
        assert!(syncs > 0, "{ctx}: the syncer never ran");
    }
    // Everything survives a close and reopen.
    let how = if s.mode == Mode::Mapped {
        Reopen::File
    } else {
        Reopen::SamePool
    };
    t.reopen(how);
    verify_model(
        t.e(),
        t.pool(),
        &model,
        &absent,
        &format!("{ctx} after {how:?}"),
    );
}

#[test]
fn writers_and_readers_1w_1r_strict() {
    writers_and_readers(Shape {
        mode: Mode::Volatile,
        durability: Durability::Strict,
        writers: 1,
        readers: 1,
        n: 300_000,
        seed: 1,
        syncer: false,
        options: small_segments(),
    });
}

#[test]
fn writers_and_readers_2w_2r_strict() {
    writers_and_readers(Shape {
        mode: Mode::Volatile,
        durability: Durability::Strict,
        writers: 2,
        readers: 2,
        n: 150_000,
        seed: 2,
        syncer: false,
        options: small_segments(),
    });
}

#[test]
fn writers_and_readers_2w_1r_relaxed_with_syncer() {
    writers_and_readers(Shape {
        mode: Mode::Volatile,
        durability: Durability::Relaxed,
        writers: 2,
        readers: 1,
        n: 150_000,
        seed: 3,
        syncer: true,
        options: small_segments(),
    });
}

#[test]
fn writers_and_readers_3w_1r_relaxed() {
    writers_and_readers(Shape {
        mode: Mode::Volatile,
        durability: Durability::Relaxed,
        writers: 3,
        readers: 1,
        n: 100_000,
        seed: 4,
        syncer: false,
        options: small_segments(),
    });
}

#[test]
fn writers_and_readers_mapped_file_relaxed_with_syncer() {
    writers_and_readers(Shape {
        mode: Mode::Mapped,
        durability: Durability::Relaxed,
        writers: 2,
        readers: 1,
        n: 60_000,
        seed: 5,
        syncer: true,
        options: small_segments(),
    });
}

#[test]
fn writers_and_readers_mapped_file_strict() {
    writers_and_readers(Shape {
        mode: Mode::Mapped,
        durability: Durability::Strict,
        writers: 2,
        readers: 1,
        n: 60_000,
        seed: 6,
        syncer: false,
        options: small_segments(),
    });
}

/// Identity hash capped at depth 4: writers fill one cluster of keys (one
/// high word, so one segment) past its capacity while readers look up the
/// cluster's stable keys: overflow blocks are chained under the readers.
fn overflow_chains_under_readers(durability: Durability, writers: usize, readers: usize) {
    let c = cfg(durability, 1, writers + readers);
    let t = Table::create(Mode::Volatile, 128 * MIB, &c, &identity_capped(4), 7);
    let hi = 0x5a00_0000u64 << 32;
    // Stable keys in the cluster (odd low words); writers use even ones.
    let stable: Vec<u64> = (0..100u64)
        .map(|i| hi | (fmix(i) & 0xffff_fffe) | 1)
        .collect();
    let mut model = HashMap::new();
    for &k in &stable {
        if t.e().insert(k, val(k, 0)).unwrap() {
            model.insert(k, val(k, 0));
        }
    }
    const N: u64 = 6000;
    let wkey = |w: u64, i: u64| hi | (w << 24 | i) << 1;
    let done = AtomicBool::new(false);
    let reads = AtomicU64::new(0);
    let during = AtomicU64::new(0);
    let e = t.e();
    let models: Vec<HashMap<u64, u64>> = std::thread::scope(|sc| {
        for r in 0..readers {
            let (stable, done, reads, during) = (&stable, &done, &reads, &during);
            sc.spawn(move || {
                let mut rng = Rng::new(r as u64 + 70);
                let (mut n, mut racing) = (0, 0);
                loop {
                    let running = !done.load(Ordering::Acquire);
                    if !running && n >= 200 {
                        break;
                    }
                    let k = stable[rng.below(stable.len() as u64) as usize];
                    assert_eq!(
                        e.get(k),
                        Some(val(k, 0)),
                        "reader {r}: stable {k:#x} in the chain"
                    );
                    let w = rng.below(writers as u64);
                    let k = wkey(w, rng.below(N));
                    if let Some(v) = e.get(k) {
                        check_value(k, v, "chain");
                    }
                    n += 1;
                    racing += running as u64;
                }
                reads.fetch_add(n, Ordering::Relaxed);
                during.fetch_add(racing, Ordering::Relaxed);
            });
        }
        let ws: Vec<_> = (0..writers as u64)
            .map(|w| {
                sc.spawn(move || {
                    let mut m = HashMap::new();
                    for i in 0..N {
                        let k = wkey(w, i);
                        assert!(e.insert(k, val(k, i)).unwrap(), "w{w} insert {k:#x}");
                        m.insert(k, val(k, i));
                    }
                    for i in (0..N).step_by(3) {
                        let k = wkey(w, i);
                        assert!(e.remove(k).unwrap(), "w{w} remove {k:#x}");
                        m.remove(&k);
                    }
                    for i in (1..N).step_by(3) {
                        let k = wkey(w, i);
                        assert!(e.update(k, val(k, i + N)).unwrap(), "w{w} update {k:#x}");
                        m.insert(k, val(k, i + N));
                    }
                    m
                })
            })
            .collect();
        engine::testkit::join_then_stop(ws, &done)
    });
    for m in models {
        model.extend(m);
    }
    let blocks = t.e().tallies().overflow_blocks;
    assert!(
        blocks as usize >= model.len() / 60,
        "{blocks} overflow blocks for {} keys in one capped segment",
        model.len()
    );
    // Optimistic readers of one hot capped segment retry while its writers
    // hold it; how many reads completed while they ran is reported only.
    eprintln!(
        "overflow {durability:?}: {blocks} overflow blocks, {} reads, {} while the writers ran",
        reads.load(Ordering::Relaxed),
        during.load(Ordering::Relaxed)
    );
    let absent = [hi | 0x7fff_fffe, hi ^ 1 << 40 | 2];
    verify_model(
        t.e(),
        t.pool(),
        &model,
        &absent,
        &format!("overflow {durability:?}"),
    );
}

#[test]
fn overflow_chains_grow_under_readers_strict() {
    overflow_chains_under_readers(Durability::Strict, 2, 1);
}

#[test]
fn overflow_chains_grow_under_readers_relaxed() {
    overflow_chains_under_readers(Durability::Relaxed, 2, 2);
}

/// N threads insert the same fresh keys at the same moment: exactly one
/// insert per key returns Ok(true); then they remove a quarter together:
/// exactly one remove per key succeeds; then they upsert the rest together:
/// each ends with one of the upserted values. Splits and doublings run in
/// the middle (one 1 KiB segment at the start).
fn same_key_race(threads: usize, durability: Durability) {
    let c = cfg(durability, 1, threads);
    let t = Table::create(Mode::Volatile, 128 * MIB, &c, &small_segments(), 8);
    let z = t.e().zero_hash_key();
    const ROUNDS: u64 = 160;
    const PER: u64 = 256;
    let key = |r: u64, j: u64| match (r, j) {
        (0, 0) => 0,
        (0, 1) => u64::MAX,
        (0, 2) => z,
        _ => fmix(r << 20 | j),
    };
    let barrier = Barrier::new(threads);
    let e = t.e();
    let wins: Vec<Vec<(u64, u8)>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads as u64)
            .map(|th| {
                let barrier = &barrier;
                sc.spawn(move || {
                    let mut won = Vec::new();
                    for r in 0..ROUNDS {
                        barrier.wait();
                        for i in 0..PER {
                            let j = if th.is_multiple_of(2) { i } else { PER - 1 - i };
                            let k = key(r, j);
                            if e.insert(k, val(k, th)).unwrap() {
                                won.push((k, 0));
                            }
                        }
                        barrier.wait();
                        for i in 0..PER / 4 {
                            let k = key(r, i * 4);
                            if e.remove(k).unwrap() {
                                won.push((k, 1));
                            }
                        }
                        barrier.wait();
                        for i in 0..PER {
                            if !i.is_multiple_of(4) {
                                let k = key(r, i);
                                e.upsert(k, val(k, 100 + th)).unwrap();
                            }
                        }
                    }
                    won
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut ins: HashMap<u64, u32> = HashMap::new();
    let mut rem: HashMap<u64, u32> = HashMap::new();
    for (k, what) in wins.iter().flatten() {
        *if *what == 0 { &mut ins } else { &mut rem }
            .entry(*k)
            .or_default() += 1;
    }
    assert_eq!(
        ins.len() as u64,
        ROUNDS * PER,
        "some key was inserted by nobody"
    );
    if let Some((k, n)) = ins.iter().find(|(_, n)| **n != 1) {
        panic!("key {k:#x}: {n} inserts returned Ok(true)");
    }
    assert_eq!(
        rem.len() as u64,
        ROUNDS * PER / 4,
        "some key was removed by nobody"
    );
    if let Some((k, n)) = rem.iter().find(|(_, n)| **n != 1) {
        panic!("key {k:#x}: {n} removes returned Ok(true)");
    }
    let mut model = HashMap::new();
    e.for_each(&mut |k, v| {
        assert!(model.insert(k, v).is_none(), "key {k:#x} twice");
    });
    assert_eq!(model.len() as u64, ROUNDS * PER * 3 / 4);
    for r in 0..ROUNDS {
        for i in 0..PER {
            let k = key(r, i);
            let got = model.get(&k).copied();
            if i.is_multiple_of(4) {
                assert_eq!(got, None, "removed key {k:#x} is back");
            } else {
                let v = got.unwrap_or_else(|| panic!("key {k:#x} lost"));
                let ver = version_of(k, v);
                assert!(
                    (100..100 + threads as u64).contains(&ver),
                    "key {k:#x} holds {v:#x}, not one of the upserted values"
                );
            }
        }
    }
    assert!(e.tallies().splits >= 20, "{:?}", e.tallies());
    assert!(e.tallies().doublings >= 2, "{:?}", e.tallies());
    verify_model(
        e,
        t.pool(),
        &model,
        &[],
        &format!("same-key race x{threads} {durability:?}"),
    );
}

#[test]
fn same_key_insert_race_two_threads() {
    same_key_race(2, Durability::Strict);
}

#[test]
fn same_key_insert_race_four_threads_relaxed() {
    same_key_race(4, Durability::Relaxed);
}

/// All threads hammer 64 shared keys (0, MAX and the zero-hash key among
/// them) with every operation. A present key's value must be one a
/// successful write of that very key wrote; successful inserts minus
/// successful removes equal the keys present; no key is stored twice.
fn shared_hot_keys(threads: usize, durability: Durability, ops: u64) {
    let c = cfg(durability, 1, threads);
    let t = Table::create(Mode::Volatile, 64 * MIB, &c, &small_segments(), 9);
    let z = t.e().zero_hash_key();
    const NK: u64 = 64;
    let keys: Vec<u64> = (0..NK)
        .map(|i| match i {
            0 => 0,
            1 => u64::MAX,
            2 => z,
            _ => fmix(i ^ 0xabcdef),
        })
        .collect();
    let e = t.e();
    let results: Vec<(HashSet<u64>, i64)> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads as u64)
            .map(|th| {
                let keys = &keys;
                sc.spawn(move || {
                    let mut rng = Rng::new(th + 100);
                    let mut written = HashSet::new();
                    let mut net = 0i64;
                    for c in 0..ops {
                        let k = keys[rng.below(NK) as usize];
                        // Thread and counter in the version: unique per write.
                        let v = val(k, th << 24 | c);
                        match rng.below(10) {
                            0..=2 => {
                                if e.insert(k, v).unwrap() {
                                    written.insert(v);
                                    net += 1;
                                }
                            }
                            3..=4 => {
                                if e.update(k, v).unwrap() {
                                    written.insert(v);
                                }
                            }
                            5 => {
                                // An upsert that tells which way it went.
                                if e.update(k, v).unwrap() {
                                    written.insert(v);
                                } else if e.insert(k, v).unwrap() {
                                    written.insert(v);
                                    net += 1;
                                }
                            }
                            6..=7 => {
                                if e.remove(k).unwrap() {
                                    net -= 1;
                                }
                            }
                            _ => {
                                if let Some(got) = e.get(k) {
                                    check_value(k, got, "hot key");
                                }
                            }
                        }
                    }
                    (written, net)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let written: HashSet<u64> = results
        .iter()
        .flat_map(|(w, _)| w.iter().copied())
        .collect();
    let mut found = HashMap::new();
    e.for_each(&mut |k, v| {
        assert!(found.insert(k, v).is_none(), "key {k:#x} visited twice");
    });
    for (k, v) in &found {
        assert!(keys.contains(k), "key {k:#x} was never written");
        check_value(*k, *v, "final");
        assert!(
            written.contains(v),
            "key {k:#x} holds {v:#x}, which no successful write wrote"
        );
    }
    let net: i64 = results.iter().map(|(_, n)| n).sum();
    assert_eq!(
        net,
        found.len() as i64,
        "insert/remove results do not add up"
    );
    verify_model(
        e,
        t.pool(),
        &found,
        &[],
        &format!("shared hot keys x{threads} {durability:?}"),
    );
}

#[test]
fn shared_hot_keys_two_threads_strict() {
    shared_hot_keys(2, Durability::Strict, 1_500_000);
}

#[test]
fn shared_hot_keys_four_threads_relaxed() {
    shared_hot_keys(4, Durability::Relaxed, 750_000);
}
