//! Model-based tests: random insert / upsert / update / remove / get runs
//! over small key spaces from a 16-head table, so the head array doubles
//! many times and the filter grows many times, compared with a `HashMap`
//! after every operation's return value and, periodically, key by key with
//! `get_many` and `check()` (which also proves no PM block leaked).
//! Refused calls (a duplicate insert, an update or remove of an absent
//! key) must leave the pool byte-for-byte unchanged. Clean close and reopen
//! of a file; crash reopen from the live image and from the persisted
//! image of a simulated pool.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::*;
use engine::Engine;
use pmem::{Mode, Pool};
use pmhash_rophi::Rophi;

const EDGE_KEYS: [u64; 6] = [0, 1, u64::MAX, u64::MAX - 1, 1 << 63, (1 << 63) - 1];

/// A key of the run's space: edge keys, small sequential keys, and spread
/// keys.
fn key(rng: &mut Rng, space: u64) -> u64 {
    match rng.below(10) {
        0 => EDGE_KEYS[rng.below(EDGE_KEYS.len() as u64) as usize],
        1..=3 => rng.below(space / 2),
        _ => fmix(rng.below(space) ^ 0xabcd_0000_0000),
    }
}

/// Keys a verification also probes for absence.
fn probe_keys(space: u64) -> Vec<u64> {
    let mut v: Vec<u64> = EDGE_KEYS.to_vec();
    v.extend((0..space / 2).step_by(7));
    v.extend((0..space).step_by(5).map(|i| fmix(i ^ 0xabcd_0000_0000)));
    v
}

/// Operation mix of a phase, in percent: insert, upsert, update, remove
/// (the rest is get).
#[derive(Clone, Copy)]
struct Mix(u64, u64, u64, u64);

const GROW: Mix = Mix(50, 10, 10, 15);
const SHRINK: Mix = Mix(15, 5, 10, 55);

/// What a run saw, for assertions that the paths were exercised.
#[derive(Default, Debug)]
struct Seen {
    refused_checked: u64,
    get_many_batches: u64,
    get_many_keys: u64,
}

/// The model side of a run, which each operation reads and advances: the
/// contents the table must hold, the random source the operations draw
/// from, and the paths checked so far.
struct Run<'a> {
    model: &'a mut HashMap<u64, u64>,
    rng: &'a mut Rng,
    seen: &'a mut Seen,
}

impl<'a> Run<'a> {
    fn of(model: &'a mut HashMap<u64, u64>, rng: &'a mut Rng, seen: &'a mut Seen) -> Self {
        Run { model, rng, seen }
    }
}

/// One random operation, its return value checked against the model.
/// Some refused calls also compare the whole pool image before and after
/// (a refused call writes nothing).
fn op(e: &Rophi, pool: &Pool, run: Run<'_>, k: u64, mix: Mix, ctx: &str) {
    let Run { model, rng, seen } = run;
    let Mix(ins, ups, upd, rem) = mix;
    let v = rng.next();
    let r = rng.below(100);
    let present = model.get(&k).copied();
    // Refused calls (dup insert, absent update/remove): sometimes compare
    // the pool image around them.
    let refused = if r < ins {
        present.is_some()
    } else {
        (ins + ups..ins + ups + upd + rem).contains(&r) && present.is_none()
    };
    // (A pool image is megabytes: one refused call in 64, small pools only.)
    let snap =
        (refused && rng.below(64) == 0 && pool.size() <= 4 * MIB).then(|| (pool.image(), e.len()));
    if r < ins {
        assert_eq!(
            e.insert(k, v).unwrap(),
            present.is_none(),
            "{ctx}: insert({k:#x})"
        );
        if present.is_none() {
            model.insert(k, v);
        }
    } else if r < ins + ups {
        e.upsert(k, v).unwrap();
        model.insert(k, v);
    } else if r < ins + ups + upd {
        assert_eq!(
            e.update(k, v).unwrap(),
            present.is_some(),
            "{ctx}: update({k:#x})"
        );
        if present.is_some() {
            model.insert(k, v);
        }
    } else if r < ins + ups + upd + rem {
        assert_eq!(
            e.remove(k).unwrap(),
            present.is_some(),
            "{ctx}: remove({k:#x})"
        );
        model.remove(&k);
    }
    assert_eq!(
        e.get(k),
        model.get(&k).copied(),
        "{ctx}: get({k:#x}) after the op"
    );
    if let Some((img, len)) = snap {
        assert_eq!(
            e.len(),
            len,
            "{ctx}: a refused call on {k:#x} changed len()"
        );
        assert!(
            pool.image() == img,
            "{ctx}: a refused call on {k:#x} changed the pool"
        );
        seen.refused_checked += 1;
    }
}

/// A `get_many` of a random batch (length 0..100: present keys, absent
/// keys, repeats) against the model.
fn get_many_batch(
    e: &Rophi,
    model: &HashMap<u64, u64>,
    rng: &mut Rng,
    space: u64,
    seen: &mut Seen,
    ctx: &str,
) {
    let present: Vec<u64> = model.keys().copied().collect();
    let n = rng.below(100) as usize;
    let mut keys = Vec::with_capacity(n);
    for _ in 0..n {
        let k = match rng.below(4) {
            0 if !present.is_empty() => present[rng.below(present.len() as u64) as usize],
            1 if !keys.is_empty() => keys[rng.below(keys.len() as u64) as usize],
            2 => fmix(rng.next()) | 1 << 62, // almost surely never inserted
            _ => key(rng, space),
        };
        keys.push(k);
    }
    let mut out = vec![Some(0xdead_beef); n];
    e.get_many(&keys, &mut out);
    for (i, (k, o)) in keys.iter().zip(&out).enumerate() {
        assert_eq!(
            *o,
            model.get(k).copied(),
            "{ctx}: get_many[{i}] of {n}: key {k:#x}"
        );
    }
    seen.get_many_batches += 1;
    seen.get_many_keys += n as u64;
}

/// A random run on a fresh volatile table of 16 heads: grow, shrink, grow
/// again; every key verified every `every` operations.
fn run(seed: u64, space: u64, ops: u64, every: u64, min_resizes: u64) {
    let pool = mem_pool(Mode::Volatile, 4 * MIB, 256 * MIB, seed);
    let e = Rophi::create(pool.clone(), &cfg(16, 1)).unwrap();
    assert_eq!(head_k(&e), 4, "initial_capacity 16 gives 16 heads");
    let mut model = HashMap::new();
    let mut rng = Rng::new(seed);
    let probe = probe_keys(space);
    let mut seen = Seen::default();
    verify(&e, &pool, &model, &probe, &format!("seed {seed} empty"));
    for i in 0..ops {
        let mix = if (ops / 2..ops * 3 / 4).contains(&i) {
            SHRINK
        } else {
            GROW
        };
        let k = key(&mut rng, space);
        let ctx = format!("seed {seed} op {i}");
        op(
            &e,
            &pool,
            Run::of(&mut model, &mut rng, &mut seen),
            k,
            mix,
            &ctx,
        );
        if i % 97 == 0 {
            get_many_batch(&e, &model, &mut rng, space, &mut seen, &ctx);
        }
        if (i + 1) % every == 0 {
            verify(&e, &pool, &model, &probe, &ctx);
        }
    }
    verify(&e, &pool, &model, &probe, &format!("seed {seed} end"));
    let resizes = e.tallies().resizes;
    let growths = e.tallies().filter_growths;
    eprintln!(
        "seed {seed}: {} keys, 2^{} heads, {resizes} resizes, {growths} filter growths, {} chain inserts, {} slabs added, {seen:?}",
        model.len(),
        head_k(&e),
        e.tallies().chain_inserts,
        e.tallies().slabs_added,
    );
    assert!(
        resizes >= min_resizes,
        "seed {seed}: only {resizes} resizes"
    );
    assert!(growths > 0, "seed {seed}: the filter never grew");
    assert_eq!(e.tallies().resize_failures, 0);
    assert!(
        e.tallies().chain_inserts > 0,
        "seed {seed}: no chain bucket used"
    );
    assert!(seen.refused_checked > 10, "seed {seed}: {seen:?}");
    assert!(seen.get_many_batches > 100);
}

#[test]
fn random_ops_match_a_hashmap_through_many_resizes() {
    for seed in 1..=12u64 {
        run(seed, 3000, 25_000, 2500, 4);
    }
}

/// A tiny key space: many duplicate inserts, removes of absent keys and
/// re-inserts into slots lazily deleted.
#[test]
fn small_key_space_churn() {
    for seed in [21u64, 22] {
        run(seed, 64, 30_000, 1000, 2);
    }
}

/// 0, 1, u64::MAX and u64::MAX - 1 (and their neighbours in the hash
/// order) are ordinary keys: insert, duplicate, update, get_many, remove,
/// re-insert, across resizes.
#[test]
fn edge_keys_are_ordinary_keys() {
    let pool = mem_pool(Mode::Volatile, 4 * MIB, 64 * MIB, 3);
    let e = Rophi::create(pool.clone(), &cfg(16, 1)).unwrap();
    let mut model = HashMap::new();
    for (i, &k) in EDGE_KEYS.iter().enumerate() {
        assert_eq!(e.get(k), None);
        assert!(!e.update(k, 1).unwrap(), "update of absent {k:#x}");
        assert!(!e.remove(k).unwrap(), "remove of absent {k:#x}");
        assert!(e.insert(k, i as u64).unwrap(), "insert {k:#x}");
        assert!(!e.insert(k, 99).unwrap(), "duplicate insert {k:#x}");
        assert_eq!(e.get(k), Some(i as u64));
        model.insert(k, i as u64);
    }
    // Values 0 and u64::MAX are values like any other.
    assert!(e.update(0, u64::MAX).unwrap());
    model.insert(0, u64::MAX);
    assert!(e.update(u64::MAX, 0).unwrap());
    model.insert(u64::MAX, 0);
    verify(&e, &pool, &model, &[2, 3, u64::MAX - 2], "edge keys");
    // Many resizes with the edge keys in the table.
    for i in 0..5000u64 {
        let k = fmix(i ^ 0x7777);
        assert!(e.insert(k, i).unwrap());
        model.insert(k, i);
    }
    assert!(e.tallies().resizes >= 6);
    verify(
        &e,
        &pool,
        &model,
        &[2, 3, u64::MAX - 2],
        "edge keys after resizes",
    );
    for &k in &EDGE_KEYS {
        assert!(e.remove(k).unwrap());
        assert!(!e.remove(k).unwrap(), "second remove of {k:#x}");
        assert_eq!(e.get(k), None);
        model.remove(&k);
    }
    verify(&e, &pool, &model, &EDGE_KEYS, "edge keys removed");
    for &k in &EDGE_KEYS {
        assert!(e.insert(k, !k).unwrap(), "re-insert {k:#x}");
        model.insert(k, !k);
    }
    verify(&e, &pool, &model, &[], "edge keys re-inserted");
}

/// Random operations on a file pool, closed cleanly and reopened with
/// `Rophi::open` three times; everything compared with the model before
/// and after each reopen, and the table keeps resizing afterwards.
#[test]
fn clean_close_and_file_reopen_keep_every_key() {
    let tmp = TempPath::new("reopen");
    let popts = pool_opts(Mode::Mapped, 2 * MIB, 128 * MIB, 5);
    let mut pool = Arc::new(Pool::create(tmp.path(), &popts).unwrap());
    let mut e = Rophi::create(pool.clone(), &cfg(16, 1)).unwrap();
    // The key space doubles each round, so every round grows the table.
    let probe = probe_keys(2000 << 2);
    let mut model = HashMap::new();
    let mut rng = Rng::new(500);
    let mut seen = Seen::default();
    let mut resizes = 0;
    let mut last_k = head_k(&e);
    for round in 0..3 {
        let space = 2000 << round;
        for i in 0..6000 {
            let k = key(&mut rng, space);
            let ctx = format!("round {round} op {i}");
            op(
                &e,
                &pool,
                Run::of(&mut model, &mut rng, &mut seen),
                k,
                GROW,
                &ctx,
            );
        }
        for i in 0..1500 {
            let k = key(&mut rng, space);
            let ctx = format!("round {round} shrink op {i}");
            op(
                &e,
                &pool,
                Run::of(&mut model, &mut rng, &mut seen),
                k,
                SHRINK,
                &ctx,
            );
        }
        verify(
            &e,
            &pool,
            &model,
            &probe,
            &format!("round {round} before reopen"),
        );
        resizes += e.tallies().resizes;
        let k = head_k(&e);
        assert!(k > last_k, "round {round}: the table did not grow (2^{k})");
        last_k = k;
        (pool, e) = reopen_file(e, pool, tmp.path(), &popts);
        assert_eq!(
            head_k(&e),
            k,
            "round {round}: the head array changed across a clean reopen"
        );
        verify(
            &e,
            &pool,
            &model,
            &probe,
            &format!("round {round} after reopen"),
        );
        for _ in 0..20 {
            get_many_batch(&e, &model, &mut rng, space, &mut seen, "after reopen");
        }
    }
    assert!(resizes > 3, "only {resizes} resizes over 3 rounds");
    e.close().unwrap();
}

/// No close: the live image of a volatile pool opened as a new pool runs
/// crash recovery, which must find every key; the recovered table keeps
/// working (more resizes) and survives the next crash.
#[test]
fn crash_reopen_from_live_image_keeps_every_key() {
    let mut pool = mem_pool(Mode::Volatile, 4 * MIB, 128 * MIB, 6);
    let mut e = Rophi::create(pool.clone(), &cfg(16, 1)).unwrap();
    let space = 3000;
    let probe = probe_keys(space);
    let mut model = HashMap::new();
    let mut rng = Rng::new(600);
    let mut seen = Seen::default();
    for round in 0..3 {
        for i in 0..5000 {
            let k = key(&mut rng, space);
            op(
                &e,
                &pool,
                Run::of(&mut model, &mut rng, &mut seen),
                k,
                GROW,
                &format!("crash round {round} op {i}"),
            );
        }
        for i in 0..1000 {
            let k = key(&mut rng, space);
            op(
                &e,
                &pool,
                Run::of(&mut model, &mut rng, &mut seen),
                k,
                SHRINK,
                &format!("crash round {round} shrink {i}"),
            );
        }
        let k = head_k(&e);
        let (p2, e2) = crash_reopen_live(&pool);
        assert_eq!(
            head_k(&e2),
            k,
            "round {round}: the head array changed across recovery"
        );
        verify(&e2, &p2, &model, &probe, &format!("after crash {round}"));
        drop(e);
        (pool, e) = (p2, e2);
    }
    assert!(
        head_k(&e) >= 9,
        "the table stayed at 2^{} heads",
        head_k(&e)
    );
}

/// A simulated pool crashed every 1500 operations: the persisted image
/// alone (no unflushed line) recovers to exactly the model, because every
/// acknowledged write is durable under strict durability. The recovered
/// copy accepts writes and resizes on its own; the original goes on.
#[test]
fn persisted_crash_images_hold_every_acknowledged_write() {
    // A crash image cannot grow past its own size: make room up front.
    let pool = mem_pool(Mode::Simulated, 16 * MIB, 64 * MIB, 7);
    let e = Rophi::create(pool.clone(), &cfg(16, 1)).unwrap();
    let space = 2500;
    let probe = probe_keys(space);
    let mut model = HashMap::new();
    let mut rng = Rng::new(700);
    let mut seen = Seen::default();
    for round in 0..5u64 {
        let mix = if round == 3 { SHRINK } else { GROW };
        for i in 0..1500 {
            let k = key(&mut rng, space);
            op(
                &e,
                &pool,
                Run::of(&mut model, &mut rng, &mut seen),
                k,
                mix,
                &format!("sim round {round} op {i}"),
            );
        }
        let (p2, e2) = crash_reopen_persisted(&pool);
        verify(
            &e2,
            &p2,
            &model,
            &probe,
            &format!("persisted image {round}"),
        );
        let mut m2 = model.clone();
        let mut r2 = Rng::new(900 + round);
        let k0 = head_k(&e2);
        for i in 0..3000 {
            let k = key(&mut r2, space * 4);
            op(
                &e2,
                &p2,
                Run::of(&mut m2, &mut r2, &mut seen),
                k,
                GROW,
                &format!("recovered copy {round} op {i}"),
            );
        }
        assert!(
            head_k(&e2) > k0,
            "round {round}: the recovered copy did not resize"
        );
        assert_eq!(e2.tallies().resize_failures, 0);
        verify(&e2, &p2, &m2, &probe, &format!("recovered copy {round}"));
    }
    assert!(e.tallies().resizes > 3);
    verify(&e, &pool, &model, &probe, "original");
}

#[test]
#[should_panic(expected = "differ in length")]
fn get_many_with_unequal_lengths_panics() {
    let pool = mem_pool(Mode::Volatile, MIB, MIB, 8);
    let e = Rophi::create(pool, &cfg(16, 1)).unwrap();
    let mut out = [None; 2];
    e.get_many(&[1, 2, 3], &mut out);
}
