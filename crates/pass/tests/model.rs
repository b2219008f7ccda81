//! Model-based tests: random insert / update / remove / get / upsert runs
//! over small key spaces with tiny segments (4 normal + 2 stash buckets),
//! so the table goes through many spiral expansions, stash placements and
//! overflow chains, compared with a `HashMap` after every operation's
//! return value and, periodically, key by key with `check()` (which also
//! proves no PM block leaked). Both key modes; clean reopen of a file;
//! crash reopen from the live image and from the persisted image; growth
//! to 200k keys with the default geometry and its load factor (at the
//! default split load and at the paper's 0.86).

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use common::*;
use engine::Engine;
use pmem::{Mode, Pool};
use pmhash_pass::{Options, Pass};

/// Structural counters summed over the engine handles of a run.
#[derive(Default, Debug, Clone, Copy)]
struct Seen {
    splits: u64,
    chain_inserts: u64,
    max_chain_buckets: u64,
    stash_inserts: u64,
    displacements: u64,
    moved: u64,
    split_failures: u64,
}

impl Seen {
    /// Samples the live figures of `e` (call before dropping a handle, and
    /// at verification points for the chain-bucket maximum).
    fn sample(&mut self, e: &Pass) {
        self.max_chain_buckets = self.max_chain_buckets.max(e.tallies().chain_buckets);
    }
    /// Adds the counters of a handle that is about to go away.
    fn absorb(&mut self, e: &Pass) {
        self.sample(e);
        self.splits += e.tallies().splits;
        self.chain_inserts += e.tallies().chain_inserts;
        self.stash_inserts += e.tallies().stash_inserts;
        self.displacements += e.tallies().displacements;
        self.moved += e.tallies().moved;
        self.split_failures += e.tallies().split_failures;
    }
}

// ----- inline keys --------------------------------------------------------------------

const EDGE_KEYS: [u64; 6] = [0, u64::MAX, 1, u64::MAX - 1, 1 << 63, (1 << 63) - 1];

/// A key of the run's space: edge keys, small sequential keys, and spread
/// keys.
fn inline_key(rng: &mut Rng, space: u64) -> u64 {
    match rng.below(10) {
        0 => EDGE_KEYS[rng.below(EDGE_KEYS.len() as u64) as usize],
        1..=3 => rng.below(space / 2),
        _ => fmix(rng.below(space) ^ 0xabcd_0000_0000),
    }
}

/// Operation mix of a phase, in percent: insert, upsert, update, remove
/// (the rest is get).
#[derive(Clone, Copy)]
struct Mix(u64, u64, u64, u64);

const GROW: Mix = Mix(50, 10, 10, 15);
const SHRINK: Mix = Mix(15, 5, 10, 55);

/// One random operation on the u64 API, checked against the model.
fn inline_op(e: &Pass, model: &mut HashMap<u64, u64>, rng: &mut Rng, k: u64, mix: Mix, ctx: &str) {
    let Mix(ins, ups, upd, rem) = mix;
    let v = rng.next();
    let r = rng.below(100);
    if r < ins {
        let fresh = !model.contains_key(&k);
        assert_eq!(e.insert(k, v).unwrap(), fresh, "{ctx}: insert({k:#x})");
        if fresh {
            model.insert(k, v);
        } else {
            assert_eq!(
                e.get(k),
                model.get(&k).copied(),
                "{ctx}: a refused insert changed {k:#x}"
            );
        }
    } else if r < ins + ups {
        e.upsert(k, v).unwrap();
        model.insert(k, v);
    } else if r < ins + ups + upd {
        let had = model.contains_key(&k);
        assert_eq!(e.update(k, v).unwrap(), had, "{ctx}: update({k:#x})");
        if had {
            model.insert(k, v);
        } else {
            assert_eq!(
                e.get(k),
                None,
                "{ctx}: update of an absent key inserted {k:#x}"
            );
        }
    } else if r < ins + ups + upd + rem {
        assert_eq!(
            e.remove(k).unwrap(),
            model.remove(&k).is_some(),
            "{ctx}: remove({k:#x})"
        );
        assert_eq!(e.get(k), None, "{ctx}: get after remove({k:#x})");
    } else {
        assert_eq!(e.get(k), model.get(&k).copied(), "{ctx}: get({k:#x})");
    }
}

/// Keys a verification also probes for absence.
fn inline_probe(space: u64) -> Vec<u64> {
    let mut v: Vec<u64> = EDGE_KEYS.to_vec();
    v.extend((0..space / 2).step_by(7));
    v.extend((0..space).step_by(5).map(|i| fmix(i ^ 0xabcd_0000_0000)));
    v
}

/// A random run on a fresh volatile table with tiny segments: grow, shrink,
/// grow again; every key verified every `every` operations.
fn inline_run(seed: u64, space: u64, ops: u64, every: u64) -> Seen {
    let pool = mem_pool(Mode::Volatile, 4 * MIB, 256 * MIB, seed);
    let e = Pass::create(pool.clone(), &cfg(16, 1)).unwrap();
    assert_eq!(e.geometry().n, 4, "initial_capacity 16 gives tiny segments");
    let mut model = HashMap::new();
    let mut rng = Rng::new(seed);
    let probe = inline_probe(space);
    let mut seen = Seen::default();
    for i in 0..ops {
        // Grow for the first half, shrink for a quarter, grow again.
        let mix = if (ops / 2..ops * 3 / 4).contains(&i) {
            SHRINK
        } else {
            GROW
        };
        let k = inline_key(&mut rng, space);
        let ctx = format!("seed {seed} op {i}");
        inline_op(&e, &mut model, &mut rng, k, mix, &ctx);
        if (i + 1) % every == 0 {
            seen.sample(&e);
            verify(&e, &pool, &model, &probe, &ctx);
        }
    }
    verify(&e, &pool, &model, &probe, &format!("seed {seed} end"));
    seen.absorb(&e);
    seen
}

#[test]
fn inline_model_over_many_expansions() {
    let mut total = Seen::default();
    for seed in [1u64, 2, 3, 0xdead_beef] {
        let s = inline_run(seed, 12_000, 150_000, 5000);
        eprintln!("inline seed {seed:#x}: {s:?}");
        assert!(
            s.splits >= 150,
            "seed {seed}: only {} splits: the run did not go through many expansions",
            s.splits
        );
        assert!(s.moved > 0, "seed {seed}: splits moved no record");
        assert_eq!(s.split_failures, 0, "seed {seed}: a split failed");
        total.splits += s.splits;
        total.chain_inserts += s.chain_inserts;
        total.max_chain_buckets = total.max_chain_buckets.max(s.max_chain_buckets);
        total.stash_inserts += s.stash_inserts;
        total.displacements += s.displacements;
    }
    assert!(
        total.chain_inserts > 0 && total.max_chain_buckets > 0,
        "no run put a record into an overflow chain: {total:?}"
    );
    assert!(total.stash_inserts > 0, "no run used the stash: {total:?}");
    assert!(
        total.displacements > 0,
        "no run displaced a record: {total:?}"
    );
}

/// Sequential keys 0..n in order (and in reverse for a second table), the
/// edge keys, then every other key removed: each step verified.
#[test]
fn sequential_and_edge_keys() {
    for (t, rev) in [(0u64, false), (1, true)] {
        let pool = mem_pool(Mode::Volatile, 4 * MIB, 64 * MIB, 40 + t);
        let e = Pass::create(pool.clone(), &cfg(1, 1)).unwrap();
        let n = 6000u64;
        let mut model = HashMap::new();
        for &k in &EDGE_KEYS {
            assert!(e.insert(k, !k).unwrap(), "edge key {k:#x}");
            model.insert(k, !k);
        }
        for i in 0..n {
            let k = if rev { n + 1000 - i } else { i + 2 };
            assert!(e.insert(k, k * 3).unwrap(), "sequential key {k}");
            model.insert(k, k * 3);
            if i % 1500 == 0 {
                verify(
                    &e,
                    &pool,
                    &model,
                    &[n + 5000, n + 5001],
                    &format!("seq {t} at {i}"),
                );
            }
        }
        for &k in &EDGE_KEYS {
            assert!(!e.insert(k, 1).unwrap(), "edge key {k:#x} inserted twice");
            assert_eq!(e.get(k), Some(!k));
        }
        verify(&e, &pool, &model, &[], &format!("seq {t} full"));
        let keys: Vec<u64> = model.keys().copied().collect();
        for (j, &k) in keys.iter().enumerate() {
            if j % 2 == 0 {
                assert!(e.remove(k).unwrap());
                model.remove(&k);
            } else {
                assert!(e.update(k, k ^ 0x55).unwrap());
                model.insert(k, k ^ 0x55);
            }
        }
        verify(&e, &pool, &model, &keys, &format!("seq {t} half removed"));
        assert!(
            e.tallies().splits >= 60,
            "seq {t}: {} splits",
            e.tallies().splits
        );
    }
}

// ----- byte-string keys ---------------------------------------------------------------

/// The bytes-mode key universe: shared prefixes (every prefix of some long
/// random strings), keys that differ only by trailing zero bytes or by
/// length, word-boundary lengths, and random keys of 1..=100 bytes.
fn bytes_universe(seed: u64) -> Vec<Vec<u8>> {
    let mut rng = Rng::new(seed ^ 0x6b65_7973);
    let mut set = HashSet::new();
    let mut out = Vec::new();
    let mut add = |k: Vec<u8>| {
        assert!(!k.is_empty() && k.len() <= 100);
        if set.insert(k.clone()) {
            out.push(k);
        }
    };
    for z in 0..=20 {
        let mut a = b"a".to_vec();
        a.resize(1 + z, 0);
        add(a);
        add(vec![0u8; 1 + z]);
        let mut f = vec![0xffu8; 8];
        f.resize(8 + z, 0);
        add(f);
    }
    add(b"ab".to_vec());
    add(b"ba".to_vec());
    for len in [
        7usize, 8, 9, 15, 16, 17, 24, 31, 32, 33, 63, 64, 65, 99, 100,
    ] {
        add((0..len as u8).collect());
        add(vec![b'x'; len]);
    }
    for _ in 0..30 {
        let len = 60 + rng.below(41) as usize;
        let base: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        for l in 1..=len {
            add(base[..l].to_vec());
        }
    }
    for _ in 0..6000 {
        let len = 1 + rng.below(100) as usize;
        // Small alphabets make many keys share prefixes and fingerprints.
        let alpha = [2u64, 4, 256][rng.below(3) as usize];
        add((0..len).map(|_| rng.below(alpha) as u8).collect());
    }
    out
}

/// One random bytes-mode operation: on a byte key, or (one in five) on a
/// u64 key through the Engine API, which stands for `wide_key(k)`.
fn bytes_op(
    e: &Pass,
    model: &mut HashMap<Vec<u8>, u64>,
    rng: &mut Rng,
    uni: &[Vec<u8>],
    mix: Mix,
    ctx: &str,
) {
    let Mix(ins, ups, upd, rem) = mix;
    let v = rng.next();
    let r = rng.below(100);
    if rng.below(5) == 0 {
        let k = match rng.below(8) {
            0 => EDGE_KEYS[rng.below(EDGE_KEYS.len() as u64) as usize],
            _ => rng.below(600),
        };
        let wk = pmhash_pass::wide_key(k).to_vec();
        if r < ins {
            let fresh = !model.contains_key(&wk);
            assert_eq!(e.insert(k, v).unwrap(), fresh, "{ctx}: insert({k:#x})");
            if fresh {
                model.insert(wk.clone(), v);
            }
        } else if r < ins + ups {
            e.upsert(k, v).unwrap();
            model.insert(wk.clone(), v);
        } else if r < ins + ups + upd {
            let had = model.contains_key(&wk);
            assert_eq!(e.update(k, v).unwrap(), had, "{ctx}: update({k:#x})");
            if had {
                model.insert(wk.clone(), v);
            }
        } else if r < ins + ups + upd + rem {
            assert_eq!(
                e.remove(k).unwrap(),
                model.remove(&wk).is_some(),
                "{ctx}: remove({k:#x})"
            );
        }
        let want = model.get(&wk).copied();
        assert_eq!(e.get(k), want, "{ctx}: get({k:#x})");
        assert_eq!(
            e.get_bytes(&wk).unwrap(),
            want,
            "{ctx}: get_bytes(wide_key({k:#x}))"
        );
        return;
    }
    let k = &uni[rng.below(uni.len() as u64) as usize];
    if r < ins {
        let fresh = !model.contains_key(k);
        assert_eq!(
            e.insert_bytes(k, v).unwrap(),
            fresh,
            "{ctx}: insert_bytes({k:x?})"
        );
        if fresh {
            model.insert(k.clone(), v);
        }
    } else if r < ins + ups + upd {
        let had = model.contains_key(k);
        assert_eq!(
            e.update_bytes(k, v).unwrap(),
            had,
            "{ctx}: update_bytes({k:x?})"
        );
        if had {
            model.insert(k.clone(), v);
        }
    } else if r < ins + ups + upd + rem {
        assert_eq!(
            e.remove_bytes(k).unwrap(),
            model.remove(k).is_some(),
            "{ctx}: remove_bytes({k:x?})"
        );
    }
    assert_eq!(
        e.get_bytes(k).unwrap(),
        model.get(k).copied(),
        "{ctx}: get_bytes({k:x?})"
    );
}

fn bytes_run(seed: u64, ops: u64, every: u64) -> Seen {
    let uni = bytes_universe(seed);
    let pool = mem_pool(Mode::Volatile, 4 * MIB, 256 * MIB, seed);
    let e = Pass::create_with(pool.clone(), &cfg(16, 1), &bytes_opts()).unwrap();
    assert!(e.bytes_keys());
    let mut model = HashMap::new();
    let mut rng = Rng::new(seed);
    let mut seen = Seen::default();
    for i in 0..ops {
        let mix = if (ops / 2..ops * 3 / 4).contains(&i) {
            SHRINK
        } else {
            GROW
        };
        let ctx = format!("bytes seed {seed} op {i}");
        bytes_op(&e, &mut model, &mut rng, &uni, mix, &ctx);
        if (i + 1) % every == 0 {
            seen.sample(&e);
            verify_bytes(&e, &pool, &model, &uni, &ctx);
        }
    }
    verify_bytes(&e, &pool, &model, &uni, &format!("bytes seed {seed} end"));
    seen.absorb(&e);
    seen
}

#[test]
fn bytes_model_over_many_expansions() {
    let mut total = Seen::default();
    for seed in [11u64, 12, 13] {
        let s = bytes_run(seed, 100_000, 5000);
        eprintln!("bytes seed {seed}: {s:?}");
        assert!(s.splits >= 100, "seed {seed}: only {} splits", s.splits);
        assert_eq!(s.split_failures, 0, "seed {seed}: a split failed");
        total.splits += s.splits;
        total.chain_inserts += s.chain_inserts;
        total.max_chain_buckets = total.max_chain_buckets.max(s.max_chain_buckets);
        total.stash_inserts += s.stash_inserts;
    }
    assert!(
        total.chain_inserts > 0 && total.max_chain_buckets > 0,
        "no bytes run used an overflow chain: {total:?}"
    );
    assert!(
        total.stash_inserts > 0,
        "no bytes run used the stash: {total:?}"
    );
}

/// Keys that differ only in length or trailing zero bytes are distinct
/// keys, each with its own value, found only by its exact bytes.
#[test]
fn bytes_keys_differing_only_in_trailing_zeros_are_distinct() {
    let pool = mem_pool(Mode::Volatile, 4 * MIB, 64 * MIB, 77);
    let e = Pass::create_with(pool.clone(), &cfg(16, 1), &bytes_opts()).unwrap();
    let mut model = HashMap::new();
    let mut keys = Vec::new();
    for base in [
        &b"a"[..],
        b"\0",
        b"12345678",
        b"1234567",
        b"123456789",
        &[0xffu8; 16],
    ] {
        for z in 0..=17 {
            let mut k = base.to_vec();
            k.resize(base.len() + z, 0);
            keys.push(k);
        }
    }
    keys.sort();
    keys.dedup();
    for (i, k) in keys.iter().enumerate() {
        assert!(e.insert_bytes(k, i as u64).unwrap(), "insert {k:x?}");
        model.insert(k.clone(), i as u64);
    }
    verify_bytes(&e, &pool, &model, &[], "trailing zeros");
    // Removing one leaves its neighbours.
    for (i, k) in keys.iter().enumerate().filter(|(i, _)| i % 3 == 0) {
        assert!(e.remove_bytes(k).unwrap());
        model.remove(k);
        assert_eq!(e.get_bytes(k).unwrap(), None);
        if let Some(n) = keys.get(i + 1) {
            assert_eq!(
                e.get_bytes(n).unwrap(),
                Some(i as u64 + 1),
                "neighbour {n:x?}"
            );
        }
    }
    // The longest key allowed.
    let big = vec![7u8; pmhash_pass::MAX_KEY_BYTES];
    assert!(e.insert_bytes(&big, 42).unwrap());
    model.insert(big.clone(), 42);
    let mut big2 = big.clone();
    big2[pmhash_pass::MAX_KEY_BYTES - 1] = 8;
    assert_eq!(e.get_bytes(&big2).unwrap(), None);
    verify_bytes(&e, &pool, &model, &keys, "after removes");
}

// ----- reopen -------------------------------------------------------------------------

/// Random ops on either key mode, tracking a model per mode.
struct Driver {
    bytes: bool,
    rng: Rng,
    space: u64,
    uni: Vec<Vec<u8>>,
    words: HashMap<u64, u64>,
    byte_model: HashMap<Vec<u8>, u64>,
    probe: Vec<u64>,
}

impl Driver {
    fn new(bytes: bool, seed: u64, space: u64) -> Driver {
        Driver {
            bytes,
            rng: Rng::new(seed),
            space,
            uni: if bytes {
                bytes_universe(seed)
            } else {
                Vec::new()
            },
            words: HashMap::new(),
            byte_model: HashMap::new(),
            probe: inline_probe(space),
        }
    }
    fn ops(&mut self, e: &Pass, n: u64, mix: Mix, ctx: &str) {
        for i in 0..n {
            let ctx = format!("{ctx} op {i}");
            if self.bytes {
                bytes_op(e, &mut self.byte_model, &mut self.rng, &self.uni, mix, &ctx);
            } else {
                let k = inline_key(&mut self.rng, self.space);
                inline_op(e, &mut self.words, &mut self.rng, k, mix, &ctx);
            }
        }
    }
    fn verify(&self, e: &Pass, pool: &Pool, ctx: &str) {
        if self.bytes {
            verify_bytes(e, pool, &self.byte_model, &self.uni, ctx);
        } else {
            verify(e, pool, &self.words, &self.probe, ctx);
        }
    }
    fn len(&self) -> usize {
        if self.bytes {
            self.byte_model.len()
        } else {
            self.words.len()
        }
    }
}

fn mode_name(bytes: bool) -> &'static str {
    if bytes {
        "bytes"
    } else {
        "inline"
    }
}

/// Clean close and reopen of a mapped file, three times, with expansions
/// before and after each reopen.
#[test]
fn clean_close_and_file_reopen_keep_every_key() {
    for bytes in [false, true] {
        let m = mode_name(bytes);
        let tmp = TempPath::new(m);
        let popts = pool_opts(Mode::Mapped, 2 * MIB, 128 * MIB, 5);
        let mut pool = Arc::new(Pool::create(tmp.path(), &popts).unwrap());
        let mut e = Pass::create_with(pool.clone(), &cfg(16, 1), &mode_opts(bytes)).unwrap();
        let mut d = Driver::new(bytes, 500 + bytes as u64, 3000);
        let mut splits = 0;
        for round in 0..3 {
            d.ops(&e, 6000, GROW, &format!("{m} round {round}"));
            d.ops(&e, 1500, SHRINK, &format!("{m} round {round} shrink"));
            d.verify(&e, &pool, &format!("{m} before reopen {round}"));
            let before = e.tallies().splits;
            assert!(before > 0, "{m} round {round}: no split before the reopen");
            splits += before;
            let first = e.first_segment();
            (pool, e) = reopen_file(e, pool, tmp.path(), &popts);
            assert_eq!(
                e.first_segment(),
                first,
                "{m}: first changed across a clean reopen"
            );
            assert!(e.bytes_keys() == bytes, "{m}: key mode changed");
            assert_eq!(e.tallies().recovery_us, 0, "{m}: a clean open ran recovery");
            d.verify(&e, &pool, &format!("{m} after reopen {round}"));
        }
        eprintln!("{m}: {splits} splits over 3 rounds, {} keys", d.len());
        assert!(splits >= 30, "{m}: only {splits} splits");
        e.close().unwrap();
    }
}

/// No close: the live image of a volatile pool opened as a new pool runs
/// crash recovery, which must find every key; the recovered table keeps
/// working (more expansions) and survives a second crash.
#[test]
fn crash_reopen_from_live_image_keeps_every_key() {
    for bytes in [false, true] {
        let m = mode_name(bytes);
        let mut pool = mem_pool(Mode::Volatile, 4 * MIB, 128 * MIB, 6);
        let mut e = Pass::create_with(pool.clone(), &cfg(16, 1), &mode_opts(bytes)).unwrap();
        let mut d = Driver::new(bytes, 600 + bytes as u64, 3000);
        for round in 0..3 {
            d.ops(&e, 5000, GROW, &format!("{m} crash round {round}"));
            d.ops(&e, 1000, SHRINK, &format!("{m} crash round {round} shrink"));
            assert!(e.tallies().splits > 0, "{m} round {round}: no split");
            let first = e.first_segment();
            let (p2, e2) = crash_reopen_live(&pool);
            assert_eq!(
                e2.first_segment(),
                first,
                "{m}: first changed across recovery"
            );
            assert_eq!(
                e2.tallies().stale_removed + e2.tallies().duplicates_removed,
                0,
                "{m}: recovery of a quiescent image removed records"
            );
            d.verify(&e2, &p2, &format!("{m} after crash {round}"));
            drop(e);
            (pool, e) = (p2, e2);
        }
    }
}

/// Runs `rounds` rounds of 1500 operations on a fresh table in a
/// simulated pool (round `shrink_round` mostly removes); after each, the
/// persisted image alone (no unflushed line) must recover to exactly the
/// model, and the recovered copy must take 1500 more writes and splits of
/// its own. Returns the original table, verified at the end.
fn crash_image_rounds(
    bytes: bool,
    opts: &Options,
    seed: u64,
    key_space: u64,
    rounds: u64,
    shrink_round: u64,
) -> Pass {
    let m = mode_name(bytes);
    let pool = mem_pool(Mode::Simulated, 4 * MIB, 64 * MIB, seed);
    let e = Pass::create_with(pool.clone(), &cfg(16, 1), opts).unwrap();
    let mut d = Driver::new(bytes, 100 * seed + bytes as u64, key_space);
    for round in 0..rounds {
        let mix = if round == shrink_round { SHRINK } else { GROW };
        d.ops(&e, 1500, mix, &format!("{m} sim round {round}"));
        let (p2, e2) = crash_reopen_persisted(&pool);
        d.verify(&e2, &p2, &format!("{m} persisted image {round}"));
        let mut d2 = Driver::new(bytes, 100 * seed + 50 + round, key_space);
        d2.words = d.words.clone();
        d2.byte_model = d.byte_model.clone();
        d2.ops(&e2, 1500, GROW, &format!("{m} recovered copy {round}"));
        d2.verify(&e2, &p2, &format!("{m} recovered copy {round}"));
    }
    d.verify(&e, &pool, &format!("{m} original"));
    e
}

/// A simulated pool crashed every 1500 operations: the persisted image
/// alone recovers to exactly the model, because every acknowledged write
/// is durable under strict durability. The original table goes on after
/// each snapshot.
#[test]
fn persisted_crash_images_hold_every_acknowledged_write() {
    for bytes in [false, true] {
        let e = crash_image_rounds(bytes, &mode_opts(bytes), 7, 2500, 5, 3);
        let splits = e.tallies().splits;
        assert!(splits >= 20, "{}: {splits} splits", mode_name(bytes));
    }
}

/// The same at a dense split load with 16 normal buckets: three chain
/// groups per segment, chains and stash records everywhere (the paths of
/// the overflow filters and filter words).
#[test]
fn dense_crash_images_with_several_chain_groups_recover() {
    for bytes in [false, true] {
        let opts = Options {
            normal_buckets: Some(16),
            split_load: 1.05,
            ..mode_opts(bytes)
        };
        let e = crash_image_rounds(bytes, &opts, 8, 12000, 4, 2);
        assert_eq!(e.geometry().groups(), 3);
        let t = e.tallies();
        for (what, got, least) in [
            ("chain inserts", t.chain_inserts, 50),
            ("stash inserts", t.stash_inserts, 50),
            ("splits", t.splits, 5),
        ] {
            assert!(got >= least, "{}: {what} {got}", mode_name(bytes));
        }
    }
}

// ----- growth -------------------------------------------------------------------------

/// What a growth run saw.
struct Growth {
    load_factor: f64,
    max_lf: f64,
    lowest_sampled: f64,
    highest_sampled: f64,
}

/// 200k keys into the default geometry (56 normal + 4 stash buckets) at
/// `split_load`: hundreds of splits, none failing; the load factor sampled
/// every 1000 keys (after the first 20k) and at the end, and the "max load
/// factor" tally, which must report at least what we sampled.
fn growth(split_load: f64, seed: u64) -> Growth {
    let pool = mem_pool(Mode::Volatile, 16 * MIB, 256 * MIB, seed);
    let opts = Options {
        normal_buckets: Some(56),
        split_load,
        ..Options::default()
    };
    let e = Pass::create_with(pool.clone(), &cfg(1024, 1), &opts).unwrap();
    assert_eq!(e.geometry().n, 56);
    assert_eq!(e.geometry().m, 4);
    let n = 200_000u64;
    let mut highest = 0f64;
    let mut lowest = 1f64;
    for i in 0..n {
        let k = fmix(i ^ 0x1234_5678);
        assert!(e.insert(k, i).unwrap(), "insert {i}");
        if (i + 1) % 1000 == 0 {
            let lf = e.stats().load_factor;
            highest = highest.max(lf);
            if i >= 20_000 {
                lowest = lowest.min(lf);
            }
        }
    }
    let st = e.stats();
    let max_lf = e.tallies().max_load_factor.0;
    eprintln!(
        "growth at split load {split_load}: {} keys, capacity {}, load factor {:.4} (sampled after 20k keys: lowest {lowest:.4}, highest {highest:.4}), max load factor tally {max_lf:.4}, segments {}, splits {}, chain buckets {}, stash inserts {}, split failures {}",
        st.len,
        st.capacity,
        st.load_factor,
        e.tallies().segments,
        e.tallies().splits,
        e.tallies().chain_buckets,
        e.tallies().stash_inserts,
        e.tallies().split_failures,
    );
    assert_eq!(st.len, n);
    assert!(
        e.tallies().splits >= 150,
        "only {} splits",
        e.tallies().splits
    );
    assert_eq!(e.tallies().split_failures, 0);
    assert!(
        max_lf + 1e-4 >= highest,
        "max load factor {max_lf:.4} is below a load factor we sampled ({highest:.4})"
    );
    assert!(max_lf <= 1.0 + 1e-9, "max load factor {max_lf} above 1");
    let mut rng = Rng::new(seed);
    for _ in 0..20_000 {
        let i = rng.below(n);
        assert_eq!(e.get(fmix(i ^ 0x1234_5678)), Some(i));
    }
    assert_eq!(e.check().unwrap().keys, n);
    Growth {
        load_factor: st.load_factor,
        max_lf,
        lowest_sampled: lowest,
        highest_sampled: highest,
    }
}

/// With the default split load the table tracks it: the load factor never
/// sags far below it during growth (no segment is left half empty), and
/// never passes it by more than the keys of one split.
#[test]
fn growth_to_200k_keys_tracks_the_default_split_load() {
    let sl = pmhash_pass::DEFAULT_SPLIT_LOAD;
    let g = growth(sl, 8);
    assert!(
        g.lowest_sampled >= 0.95 * sl && g.load_factor >= 0.95 * sl,
        "load factor fell to {:.4} (end {:.4}) at split load {sl}",
        g.lowest_sampled,
        g.load_factor
    );
    assert!(
        g.highest_sampled <= sl + 0.01,
        "load factor {:.4} well above the split load {sl}",
        g.highest_sampled
    );
    assert!(g.max_lf >= 0.95 * sl);
}

/// At the paper's load (split load 0.86) the table holds 200k keys at a
/// load factor of at least 0.80 all through the growth.
#[test]
fn growth_to_200k_keys_reaches_load_factor_080_at_split_load_086() {
    let g = growth(0.86, 9);
    assert!(
        g.max_lf >= 0.80,
        "max load factor {:.4} below 0.80",
        g.max_lf
    );
    assert!(
        g.load_factor >= 0.80 && g.lowest_sampled >= 0.80,
        "load factor {:.4} (lowest sampled {:.4}) below 0.80",
        g.load_factor,
        g.lowest_sampled
    );
}
