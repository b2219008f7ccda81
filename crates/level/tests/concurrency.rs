//! Concurrency stress: disjoint writers racing through expansions and
//! shrinks, writers sharing a few hot keys, readers during resizes, and
//! duplicate-insert and duplicate-remove races.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};

use common::*;
use engine::Engine;
use pmem::{Mode, Pool};

/// A pool in `mode` (a temp file for `Mapped`, kept alive by the guard).
fn engine_in(
    mode: Mode,
    initial: u64,
    threads: usize,
) -> (Option<TempPath>, Arc<Pool>, pmhash_level::Level) {
    let o = opts(mode, 4 * MIB, 64 * MIB);
    let (path, pool) = if mode == Mode::Mapped {
        let p = temp_path("conc");
        let pool = Arc::new(Pool::create(p.path(), &o).unwrap());
        (Some(p), pool)
    } else {
        (
            None,
            Arc::new(Pool::create(std::path::Path::new(""), &o).unwrap()),
        )
    };
    let e = pmhash_level::Level::create(pool.clone(), &strict_config(initial, threads)).unwrap();
    (path, pool, e)
}

/// (a) Each thread owns a key range and checks every return value against
/// its own model, while the table grows from 16 buckets and shrinks back.
fn disjoint(mode: Mode, threads: usize, keys_per_thread: u64, seed: u64) {
    let (_path, pool, e) = engine_in(mode, 1, threads);
    let barrier = Barrier::new(threads);
    let models: Vec<HashMap<u64, u64>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads as u64)
            .map(|t| {
                let (e, barrier) = (&e, &barrier);
                s.spawn(move || {
                    let mut rng = Rng::new(seed ^ (t << 40));
                    let mut model: HashMap<u64, u64> = HashMap::new();
                    // Keys of thread t: t in the top byte, 0 and MAX-ish
                    // sentinels for thread 0.
                    let key = |i: u64| -> u64 {
                        match (t, i) {
                            (0, 0) => 0,
                            (0, 1) => u64::MAX,
                            _ => (t << 56) | fmix(i.wrapping_add(seed)) >> 8,
                        }
                    };
                    let step =
                        |w: [u64; 4], rng: &mut Rng, n: u64, model: &mut HashMap<u64, u64>| {
                            let k = key(rng.below(n));
                            let v = rng.next();
                            let present = model.get(&k).copied();
                            let sum: u64 = w.iter().sum();
                            let mut p = rng.below(sum);
                            let mut op = 0;
                            while p >= w[op] {
                                p -= w[op];
                                op += 1;
                            }
                            match op {
                                0 => {
                                    assert_eq!(
                                        e.insert(k, v).unwrap(),
                                        present.is_none(),
                                        "insert {k:#x}"
                                    );
                                    model.entry(k).or_insert(v);
                                }
                                1 => assert_eq!(e.get(k), present, "get {k:#x}"),
                                2 => {
                                    assert_eq!(
                                        e.update(k, v).unwrap(),
                                        present.is_some(),
                                        "update {k:#x}"
                                    );
                                    if present.is_some() {
                                        model.insert(k, v);
                                    }
                                }
                                _ => {
                                    assert_eq!(
                                        e.remove(k).unwrap(),
                                        present.is_some(),
                                        "remove {k:#x}"
                                    );
                                    model.remove(&k);
                                }
                            }
                        };
                    let n = keys_per_thread;
                    // Grow, churn, drain to ~5%, regrow a little; all threads
                    // drain together, so the table shrinks under them.
                    for _ in 0..n * 2 {
                        step([70, 10, 10, 10], &mut rng, n, &mut model);
                    }
                    for _ in 0..n {
                        step([25, 25, 25, 25], &mut rng, n, &mut model);
                    }
                    barrier.wait();
                    while model.len() as u64 > n / 20 {
                        step([0, 5, 5, 90], &mut rng, n, &mut model);
                    }
                    barrier.wait();
                    for _ in 0..n / 2 {
                        step([60, 20, 10, 10], &mut rng, n, &mut model);
                    }
                    // Every own key, read back.
                    for i in 0..n {
                        assert_eq!(e.get(key(i)), model.get(&key(i)).copied());
                    }
                    model
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut all = HashMap::new();
    for m in &models {
        all.extend(m.iter().map(|(k, v)| (*k, *v)));
    }
    verify_full(&e, &pool, &all, &format!("{mode:?} x{threads}"));
    assert!(
        e.tallies().expansions >= 4,
        "expansions: {:?}",
        e.stats().detail
    );
    assert!(e.tallies().shrinks >= 1, "shrinks: {:?}", e.stats().detail);
}

#[test]
fn disjoint_writers_two_threads_volatile() {
    disjoint(Mode::Volatile, 2, 30_000, 1);
}

#[test]
fn disjoint_writers_four_threads_volatile() {
    disjoint(Mode::Volatile, 4, 15_000, 2);
}

#[test]
fn disjoint_writers_four_threads_mapped() {
    disjoint(Mode::Mapped, 4, 10_000, 3);
}

/// Value tag: thread, key index, counter (so a value names its write).
fn tag(t: u64, ki: u64, c: u64) -> u64 {
    (t << 56) | (ki << 40) | c
}

/// (b) All threads hammer 64 shared keys. A present key's value must be
/// one that a *successful* write of that very key wrote; no key twice.
fn shared_keys(mode: Mode, threads: usize, ops: u64) {
    let (_path, pool, e) = engine_in(mode, 1, threads);
    const NK: u64 = 64;
    let keys: Vec<u64> = (0..NK)
        .map(|i| match i {
            0 => 0,
            1 => u64::MAX,
            _ => fmix(i ^ 0xabcdef),
        })
        .collect();
    let results: Vec<(HashSet<u64>, i64)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads as u64)
            .map(|t| {
                let (e, keys) = (&e, &keys);
                s.spawn(move || {
                    let mut rng = Rng::new(t + 100);
                    let mut written = HashSet::new();
                    let mut net = 0i64;
                    for c in 0..ops {
                        let ki = rng.below(NK);
                        let k = keys[ki as usize];
                        let v = tag(t, ki, c);
                        match rng.below(10) {
                            0..=2 => {
                                if e.insert(k, v).unwrap() {
                                    written.insert(v);
                                    net += 1;
                                }
                            }
                            3..=5 => {
                                if e.update(k, v).unwrap() {
                                    written.insert(v);
                                }
                            }
                            6..=7 => {
                                if e.remove(k).unwrap() {
                                    net -= 1;
                                }
                            }
                            _ => {
                                if let Some(got) = e.get(k) {
                                    assert_eq!(
                                        (got >> 40) & 0xffff,
                                        ki,
                                        "get({k:#x}) returned a value written to another key: {got:#x}"
                                    );
                                    assert!(got >> 56 < threads as u64);
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
    let net: i64 = results.iter().map(|(_, n)| n).sum();
    let mut found = HashMap::new();
    e.for_each(&mut |k, v| {
        assert!(found.insert(k, v).is_none(), "key {k:#x} visited twice");
    });
    for (k, v) in &found {
        let ki = keys
            .iter()
            .position(|x| x == k)
            .expect("only the shared keys") as u64;
        assert_eq!(
            (v >> 40) & 0xffff,
            ki,
            "key {k:#x} holds a value of another key"
        );
        assert!(
            written.contains(v),
            "key {k:#x} holds {v:#x}, which no successful insert/update wrote"
        );
        assert_eq!(e.get(*k), Some(*v));
    }
    // Successful inserts minus successful removes = keys present.
    assert_eq!(
        net,
        found.len() as i64,
        "insert/remove results do not add up"
    );
    assert_eq!(e.len(), found.len() as u64);
    let r = e.check().unwrap();
    assert_eq!(r.keys, found.len() as u64);
    assert_eq!(r.reachable_bytes, pool.stats().bytes_in_use);
}

#[test]
fn shared_hot_keys_two_threads() {
    shared_keys(Mode::Volatile, 2, 300_000);
}

#[test]
fn shared_hot_keys_four_threads_mapped() {
    shared_keys(Mode::Mapped, 4, 150_000);
}

/// (b) Readers during expansions and shrinks: keys inserted before the
/// readers start and never deleted are always found with a valid value,
/// while writers grow the table from 16 buckets to thousands and drain it.
fn readers_during_resizes(writers: usize, readers: usize) {
    let (pool, e) = mem_engine(
        &opts(Mode::Volatile, 4 * MIB, 64 * MIB),
        &strict_config(1, writers + readers),
    );
    const STABLE: u64 = 300;
    const N: u64 = 15_000;
    const CHECKPOINT: u64 = 500;
    let stable: Vec<u64> = (0..STABLE).map(|i| fmix(i + 7) | 1).collect();
    // Value = key-derived high half | a 16-bit version.
    let val = |k: u64, c: u64| (fmix(k) & !0xffff) | (c & 0xffff);
    for &k in &stable {
        assert!(e.insert(k, val(k, 0)).unwrap());
    }
    let start_exp = e.tallies().expansions;
    let done = AtomicBool::new(false);
    let reads = AtomicU64::new(0);
    std::thread::scope(|s| {
        for r in 0..readers {
            let (e, stable, done, reads) = (&e, &stable, &done, &reads);
            s.spawn(move || {
                let mut i = r;
                while !done.load(Ordering::Acquire) {
                    let k = stable[i % stable.len()];
                    match e.get(k) {
                        None => panic!("reader lost stable key {k:#x} during a resize"),
                        Some(v) => assert_eq!(
                            v & !0xffff,
                            val(k, 0) & !0xffff,
                            "reader saw a wrong value for {k:#x}"
                        ),
                    }
                    i += 7;
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        let ws: Vec<_> = (0..writers as u64)
            .map(|t| {
                let (e, stable, reads) = (&e, &stable, &reads);
                s.spawn(move || {
                    let fresh = |i: u64| fmix((t << 32) | i) & !1; // even: never a stable key
                                                                   // Every CHECKPOINT operations writer 0 waits for a
                                                                   // read, so reads interleave with the whole resize
                                                                   // sequence however the threads are scheduled.
                    let wait_for_a_read = || {
                        if t == 0 {
                            let seen = reads.load(Ordering::Relaxed);
                            let t0 = std::time::Instant::now();
                            while reads.load(Ordering::Relaxed) == seen
                                && t0.elapsed() < std::time::Duration::from_secs(10)
                            {
                                std::thread::yield_now();
                            }
                        }
                    };
                    for i in 0..N {
                        if i % CHECKPOINT == 0 {
                            wait_for_a_read();
                        }
                        assert!(e.insert(fresh(i), i).unwrap());
                        if i % 16 == 0 {
                            // Writers also update stable keys (log-free and
                            // logged paths) while readers read them.
                            let k = stable[(i / 16 % STABLE) as usize];
                            assert!(e.update(k, val(k, i)).unwrap());
                        }
                    }
                    for i in 0..N {
                        if i % CHECKPOINT == 0 {
                            wait_for_a_read();
                        }
                        assert!(e.remove(fresh(i)).unwrap());
                    }
                })
            })
            .collect();
        engine::testkit::join_then_stop(ws, &done);
    });
    let exp = e.tallies().expansions - start_exp;
    let shr = e.tallies().shrinks;
    assert!(exp >= 5, "only {exp} expansions ran under the readers");
    assert!(shr >= 3, "only {shr} shrinks ran under the readers");
    // Each of writer 0's checkpoints waited for at least one more read.
    let reads = reads.load(Ordering::Relaxed);
    assert!(
        reads >= 2 * N / CHECKPOINT,
        "only {reads} reads ran under the writers"
    );
    assert_eq!(e.len(), STABLE);
    let r = e.check().unwrap();
    assert_eq!(r.keys, STABLE);
    assert_eq!(r.reachable_bytes, pool.stats().bytes_in_use);
}

#[test]
fn readers_see_every_key_during_resizes_1w_1r() {
    readers_during_resizes(1, 1);
}

#[test]
fn readers_see_every_key_during_resizes_2w_2r() {
    readers_during_resizes(2, 2);
}

/// (c) N threads insert the same fresh keys at the same moment: exactly one
/// insert per key succeeds; then they remove them together: exactly one
/// remove per key succeeds. Expansions run in the middle (tiny table).
fn duplicate_race(threads: usize) {
    let (pool, e) = mem_engine(
        &opts(Mode::Volatile, 4 * MIB, 64 * MIB),
        &strict_config(1, threads),
    );
    const ROUNDS: u64 = 40;
    const PER: u64 = 200;
    let barrier = Barrier::new(threads);
    let wins: Vec<Vec<(u64, u64)>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads as u64)
            .map(|t| {
                let (e, barrier) = (&e, &barrier);
                s.spawn(move || {
                    let mut won = Vec::new();
                    for r in 0..ROUNDS {
                        barrier.wait();
                        for i in 0..PER {
                            // Half the threads walk the keys backwards.
                            let j = if t % 2 == 0 { i } else { PER - 1 - i };
                            let k = fmix((r << 20) | j);
                            if e.insert(k, t).unwrap() {
                                won.push((k, 0));
                            }
                        }
                        // Keep 3/4 of the keys so the table keeps growing;
                        // race on removing the other quarter.
                        barrier.wait();
                        for i in 0..PER / 4 {
                            let k = fmix((r << 20) | (i * 4));
                            if e.remove(k).unwrap() {
                                won.push((k, 1));
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
    assert_eq!(rem.len() as u64, ROUNDS * PER / 4);
    if let Some((k, n)) = rem.iter().find(|(_, n)| **n != 1) {
        panic!("key {k:#x}: {n} removes returned Ok(true)");
    }
    let mut model = HashMap::new();
    e.for_each(&mut |k, v| {
        assert!(model.insert(k, v).is_none(), "key {k:#x} twice");
    });
    assert_eq!(model.len() as u64, ROUNDS * PER * 3 / 4);
    assert!(e.tallies().expansions >= 3);
    verify_full(&e, &pool, &model, "after the duplicate races");
}

#[test]
fn duplicate_insert_race_two_threads() {
    duplicate_race(2);
}

#[test]
fn duplicate_insert_race_four_threads() {
    duplicate_race(4);
}
