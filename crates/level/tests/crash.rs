//! Crash tests of the level engine beyond the CLI checker:
//!
//! - `engine::crashtest::run` on level for several seeds and key spaces,
//!   with the paths its workload exercised read from the report's `detail`
//!   (the engine's `stats().detail` after the checker's own dry run);
//! - a phased crash checker of our own (grow, churn, drain; crafted
//!   colliding keys) that takes a crash state at *every* fence of every
//!   resize and movement: the checker spreads its states evenly over all
//!   fences, so the few fences of a resize are often skipped.

mod common;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use common::*;
use engine::crashtest::{self, Config};
use engine::{Durability, Engine, EngineConfig};
use pmem::{CrashChoice, Mode, Pool, PoolOptions};

// ----- operations ----------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Insert,
    Update,
    Upsert,
    Remove,
    Get,
}

#[derive(Clone, Copy, Debug)]
struct Op {
    kind: Kind,
    key: u64,
    value: u64,
}

/// Path counters of a dry run.
#[derive(Debug, Default, Clone)]
struct Paths {
    expansions: u64,
    shrinks: u64,
    movements: u64,
    b2t: u64,
    logfree: u64,
    logged: u64,
}

fn paths(e: &pmhash_level::Level) -> Paths {
    Paths {
        expansions: e.tallies().expansions,
        shrinks: e.tallies().shrinks,
        movements: e.tallies().movements,
        b2t: e.tallies().b2t_movements,
        logfree: e.tallies().logfree_updates,
        logged: e.tallies().logged_updates,
    }
}

fn apply(e: &dyn Engine, op: &Op, model: &mut HashMap<u64, u64>) {
    let present = model.get(&op.key).copied();
    match op.kind {
        Kind::Insert => {
            assert_eq!(e.insert(op.key, op.value).unwrap(), present.is_none());
            model.entry(op.key).or_insert(op.value);
        }
        Kind::Update => {
            assert_eq!(e.update(op.key, op.value).unwrap(), present.is_some());
            if present.is_some() {
                model.insert(op.key, op.value);
            }
        }
        Kind::Upsert => {
            e.upsert(op.key, op.value).unwrap();
            model.insert(op.key, op.value);
        }
        Kind::Remove => {
            assert_eq!(e.remove(op.key).unwrap(), present.is_some());
            model.remove(&op.key);
        }
        Kind::Get => assert_eq!(e.get(op.key), present),
    }
}

/// The paths the checker's dry run took, from the engine's tallies after
/// it (`Report::detail` is its `stats().detail`).
fn report_paths(r: &crashtest::Report) -> Paths {
    let t = pmhash_level::Tallies::from_detail(&r.detail)
        .unwrap_or_else(|| panic!("the report's detail is not level's tallies: {:?}", r.detail));
    Paths {
        expansions: t.expansions,
        shrinks: t.shrinks,
        movements: t.movements,
        b2t: t.b2t_movements,
        logfree: t.logfree_updates,
        logged: t.logged_updates,
    }
}

fn checker_cfg(seed: u64, key_space: u64, ops: u64, states: u64) -> Config {
    Config {
        ops,
        states,
        seed,
        durability: Durability::Strict,
        key_space,
        initial_capacity: 16,
        pool_size: 2 * MIB,
        ..Config::default()
    }
}

fn assert_clean(c: &Config) -> crashtest::Report {
    let r = crashtest::run(&pmhash_level::spec(), c).expect("the crash test runs");
    assert_eq!(
        r.violations, 0,
        "seed {} key space {}: {:#?}",
        c.seed, c.key_space, r.messages
    );
    assert_eq!(r.leaked_bytes, 0);
    assert!(r.states >= c.states * 9 / 10, "only {} states", r.states);
    r
}

/// Few keys, many ops: full lines, so logged updates; duplicate inserts and
/// updates of absent keys.
#[test]
fn checker_small_key_space_logged_updates() {
    for seed in [1, 2] {
        let c = checker_cfg(seed, 40, 3000, 700);
        let r = assert_clean(&c);
        let p = report_paths(&r);
        eprintln!(
            "checker ks 40 seed {seed}: {p:?}, {} states, {} fences",
            r.states, r.fences
        );
        assert!(p.logged > 0, "seed {seed}: no logged update in {p:?}");
        assert!(p.logfree > 0, "seed {seed}: no log-free update in {p:?}");
    }
}

/// Many keys: growth from 16 buckets, movements, b2t, and (with the
/// checker's grow/churn/drain phases) shrinks.
#[test]
fn checker_large_key_space_expansions_and_movements() {
    for seed in [3, 4] {
        let c = checker_cfg(seed, 2000, 4000, 900);
        let r = assert_clean(&c);
        let p = report_paths(&r);
        eprintln!(
            "checker ks 2000 seed {seed}: {p:?}, {} states, {} fences",
            r.states, r.fences
        );
        assert!(p.expansions >= 3, "seed {seed}: {p:?}");
        assert!(p.movements > 0, "seed {seed}: {p:?}");
    }
}

/// Middle-sized key space: the checker's grow/churn/drain workload
/// expands and then shrinks the table, so crash states fall in shrinks too.
#[test]
fn checker_medium_key_space_shrinks() {
    for seed in [1, 2] {
        let c = checker_cfg(seed, 400, 4000, 800);
        let r = assert_clean(&c);
        let p = report_paths(&r);
        eprintln!(
            "checker ks 400 seed {seed}: {p:?}, {} states, {} fences",
            r.states, r.fences
        );
        assert!(p.expansions >= 1 && p.shrinks >= 1, "seed {seed}: {p:?}");
    }
}

/// Relaxed durability must hold too (level is strict in both modes).
#[test]
fn checker_relaxed_mode() {
    let c = Config {
        durability: Durability::Relaxed,
        ..checker_cfg(5, 300, 2000, 500)
    };
    assert_clean(&c);
}

/// A crash image taken while the pool could still grow must recover to a
/// pool that can: the checker's new insert after recovery expands the
/// table here, which needs the pool to grow past its created 2 MiB (seed
/// 9248 failed CI with "recovered engine refused a new insert: out of
/// space" while the checker recovered images with no room to grow).
#[test]
fn a_recovered_table_that_must_expand_can_grow_its_pool() {
    let r = assert_clean(&checker_cfg(9248, 20_000, 20_000, 2100));
    // The run still reaches the table sizes that need the growth.
    assert!(report_paths(&r).expansions >= 6, "{:?}", report_paths(&r));
}

// ----- a phased crash checker -------------------------------------------------------

/// What a recovered state may hold (strict): the committed map, except the
/// in-flight op's key, which may hold its value before or after the op.
#[derive(Default)]
struct Model {
    committed: HashMap<u64, u64>,
    in_flight: Option<Op>,
}

fn after(before: Option<u64>, op: &Op) -> Option<u64> {
    match op.kind {
        Kind::Insert => before.or(Some(op.value)),
        Kind::Update => before.map(|_| op.value),
        Kind::Upsert => Some(op.value),
        Kind::Remove => None,
        Kind::Get => before,
    }
}

/// Recovers `img` and checks it against `m`; a description of the first
/// violation.
fn verify_image(img: Vec<u8>, m: &Model, c: &EngineConfig) -> Result<(), String> {
    let pool = Arc::new(Pool::from_image(img, Mode::Simulated).map_err(|e| format!("pool: {e}"))?);
    let e = pmhash_level::Level::open(pool.clone(), c).map_err(|e| format!("open: {e}"))?;
    let mut found = HashMap::new();
    let mut twice = None;
    e.for_each(&mut |k, v| {
        if found.insert(k, v).is_some() {
            twice = Some(k);
        }
    });
    if let Some(k) = twice {
        return Err(format!("key {k:#x} twice"));
    }
    let mut keys: HashSet<u64> = found.keys().copied().collect();
    keys.extend(m.committed.keys());
    for k in keys {
        let cur = m.committed.get(&k).copied();
        let got = found.get(&k).copied();
        let ok = got == cur
            || m.in_flight
                .is_some_and(|op| op.key == k && got == after(cur, &op));
        if !ok {
            return Err(format!(
                "key {k:#x}: recovered {got:x?}, committed {cur:x?}, in flight {:?}",
                m.in_flight
            ));
        }
        if e.get(k) != got {
            return Err(format!("get({k:#x}) disagrees with for_each"));
        }
    }
    if e.len() != found.len() as u64 {
        return Err(format!("len {} but {} keys", e.len(), found.len()));
    }
    let r = e.check().map_err(|e| format!("check: {e}"))?;
    let in_use = pool.stats().bytes_in_use;
    if r.reachable_bytes != in_use {
        return Err(format!(
            "reachable {} bytes, allocator has {in_use} in use",
            r.reachable_bytes
        ));
    }
    let fresh = (0u64..)
        .map(|i| 0x5eed_0000_0000_0000 ^ i)
        .find(|k| !found.contains_key(k))
        .unwrap();
    match e.insert(fresh, 42) {
        Ok(true) if e.get(fresh) == Some(42) => Ok(()),
        other => Err(format!("recovered engine refused a new insert: {other:?}")),
    }
}

#[derive(Default)]
struct CheckOut {
    states: u64,
    violations: Vec<String>,
    paths: Paths,
}

/// Runs `ops` on a simulated level table, taking a crash state at every
/// fence of the ops listed in `dense` and at every `sparse`-th fence
/// elsewhere; each state is recovered and checked against the model.
fn phased_check(
    ops: &[Op],
    initial: u64,
    dense: &HashSet<usize>,
    sparse: u64,
    uuid: [u8; 16],
) -> CheckOut {
    let c = strict_config(initial, 1);
    let o = PoolOptions {
        uuid: Some(uuid),
        ..opts(Mode::Simulated, MIB, 8 * MIB)
    };
    let pool = Arc::new(Pool::create(Path::new(""), &o).unwrap());
    let e = pmhash_level::Level::create(pool.clone(), &c).unwrap();
    let model = Arc::new(Mutex::new(Model::default()));
    let out = Arc::new(Mutex::new(CheckOut::default()));
    let cur_op = Arc::new(Mutex::new(0usize));
    let dense = Arc::new(dense.clone());
    {
        let (model, out, cur_op, dense, c) = (
            model.clone(),
            out.clone(),
            cur_op.clone(),
            dense.clone(),
            c.clone(),
        );
        let mut n = 0u64;
        pool.set_fence_hook(Some(Box::new(move |_fence, site| {
            n += 1;
            let op = *cur_op.lock().unwrap();
            if !dense.contains(&op) && !n.is_multiple_of(sparse) {
                return;
            }
            // A fence of a resize op closes a batch of rehashed items (many
            // undecided lines, each of which may or may not have been
            // written back): take every kind of state there, ten random
            // ones included. Elsewhere one state, the kind in rotation.
            let rotation = [match n % 3 {
                0 => CrashChoice::Persisted,
                1 => CrashChoice::Newest,
                _ => CrashChoice::Random(n),
            }];
            let every: Vec<CrashChoice> = [CrashChoice::Persisted, CrashChoice::Newest]
                .into_iter()
                .chain((0..10u64).map(|i| CrashChoice::Random(n ^ i << 40)))
                .collect();
            let choices: &[CrashChoice] = if dense.contains(&op) {
                &every
            } else {
                &rotation
            };
            for &choice in choices {
                let img = site.image(choice);
                let m = model.lock().unwrap();
                let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    verify_image(img, &m, &c)
                }))
                .unwrap_or_else(|_| Err("recovery panicked".into()));
                let mut o = out.lock().unwrap();
                o.states += 1;
                if let Err(msg) = res {
                    o.violations.push(format!(
                        "op {op} ({:?}) fence {n} {choice:?}: {msg}",
                        m.in_flight
                    ));
                }
            }
        })))
        .unwrap();
    }
    // The engine runs on `local`; the hook reads the shared model, which
    // holds the state before the op until the op returns.
    let mut local = HashMap::new();
    for (i, op) in ops.iter().enumerate() {
        *cur_op.lock().unwrap() = i;
        model.lock().unwrap().in_flight = Some(*op);
        let before = local.get(&op.key).copied();
        apply(&e, op, &mut local);
        let now = local.get(&op.key).copied();
        assert_eq!(now, after(before, op));
        let mut m = model.lock().unwrap();
        match now {
            Some(v) => m.committed.insert(op.key, v),
            None => m.committed.remove(&op.key),
        };
        m.in_flight = None;
    }
    pool.set_fence_hook(None).unwrap();
    let committed = model.lock().unwrap().committed.clone();
    verify_full(&e, &pool, &committed, "end of the phased run");
    let mut o = std::mem::take(&mut *out.lock().unwrap());
    o.paths = paths(&e);
    o
}

/// Ops whose run changed the expansion or shrink counters (a dry run with
/// the same uuid, hence the same hashing and the same resizes).
fn resize_ops(ops: &[Op], initial: u64, uuid: [u8; 16]) -> (HashSet<usize>, Paths) {
    let ops = ops.to_vec();
    std::thread::spawn(move || resize_ops_here(&ops, initial, uuid))
        .join()
        .unwrap()
}

fn resize_ops_here(ops: &[Op], initial: u64, uuid: [u8; 16]) -> (HashSet<usize>, Paths) {
    let (_pool, e) = mem_engine(
        &PoolOptions {
            uuid: Some(uuid),
            ..opts(Mode::Volatile, MIB, 8 * MIB)
        },
        &strict_config(initial, 1),
    );
    let mut model = HashMap::new();
    let mut set = HashSet::new();
    let mut last = (0, 0);
    for (i, op) in ops.iter().enumerate() {
        apply(&e, op, &mut model);
        let now = (e.tallies().expansions, e.tallies().shrinks);
        if now != last {
            set.insert(i);
            last = now;
        }
    }
    (set, paths(&e))
}

fn op(kind: Kind, key: u64, value: u64) -> Op {
    Op { kind, key, value }
}

/// Grow to 1,500 keys, churn (updates of both kinds), drain to 40: crash
/// states at every fence of every expansion and every shrink.
#[test]
fn phased_grow_churn_drain_crashes_in_every_resize() {
    let mut rng = Rng::new(4242);
    let keys: Vec<u64> = [0, u64::MAX, 1, u64::MAX - 1]
        .into_iter()
        .chain((0..1496).map(|_| rng.next()))
        .collect();
    let mut ops = Vec::new();
    for (i, &k) in keys.iter().enumerate() {
        ops.push(op(Kind::Insert, k, i as u64));
    }
    for i in 0..1500u64 {
        let k = keys[rng.below(keys.len() as u64) as usize];
        let kind = [Kind::Update, Kind::Upsert, Kind::Insert, Kind::Get][(i % 4) as usize];
        ops.push(op(kind, k, rng.next()));
    }
    for &k in &keys[40..] {
        ops.push(op(Kind::Remove, k, 0));
    }
    // Churn at low occupancy: the shrink check runs in every k-th write of
    // a thread, so the table shrinks step by step during this phase.
    for r in 0..2500u64 {
        for i in 0..3 {
            ops.push(op(Kind::Insert, (r << 8 | i) ^ 0x7777_0000_0000_0000, r));
        }
        for i in 0..3 {
            ops.push(op(Kind::Remove, (r << 8 | i) ^ 0x7777_0000_0000_0000, 0));
        }
    }
    let uuid = *b"phased-crash-001";
    let (dense, dry) = resize_ops(&ops, 16, uuid);
    assert!(dry.expansions >= 4 && dry.shrinks >= 3, "{dry:?}");
    let out = phased_check(&ops, 16, &dense, 150, uuid);
    eprintln!(
        "phased run: {} states over {} resize ops, paths {:?}",
        out.states,
        dense.len(),
        out.paths
    );
    assert!(out.states > 1000, "only {} states", out.states);
    assert!(
        out.violations.is_empty(),
        "{} violations: {:#?}",
        out.violations.len(),
        &out.violations[..out.violations.len().min(10)]
    );
    assert!(out.paths.shrinks >= 3 && out.paths.logged > 0 && out.paths.logfree > 0);
}

/// Crafted keys that all share their two candidate buckets (white-box hash
/// replica): the table must use movements and bottom-to-top movements, and
/// every crash state in them must recover.
#[test]
fn phased_colliding_keys_crash_in_movements() {
    let uuid = *b"phased-crash-002";
    let s = seeds(&uuid);
    let mut rng = Rng::new(77);
    // 16 top buckets, 8 bottom ones. X keys hash to top (3, 9), Y keys to
    // top (11, 9); both to bottom (3, 1).
    let x = colliding_keys(s, 16, 3, 9, 24, &mut rng);
    let y = colliding_keys(s, 16, 11, 9, 9, &mut rng);
    let mut ops: Vec<Op> = Vec::new();
    // 12 X fill top 3 and 9; 6 Y fill top 11; 3 more Y go to the bottom.
    ops.extend(x[..12].iter().map(|&k| op(Kind::Insert, k, k ^ 1)));
    ops.extend(y.iter().map(|&k| op(Kind::Insert, k, k ^ 1)));
    // Room in top 11 again.
    ops.extend(y[..3].iter().map(|&k| op(Kind::Remove, k, 0)));
    // 9 X fill the bottom; the 10th X needs a bottom-to-top movement of a
    // Y (its top bucket 11 has room); the rest force an expansion.
    ops.extend(x[12..].iter().map(|&k| op(Kind::Insert, k, k ^ 1)));
    // Random keys: movements in a fuller table, updates of both kinds.
    let r: Vec<u64> = (0..150).map(|_| rng.next()).collect();
    ops.extend(r.iter().map(|&k| op(Kind::Insert, k, k ^ 1)));
    for &k in x.iter().chain(&r) {
        ops.push(op(Kind::Update, k, k ^ 2));
    }
    for &k in x.iter().chain(&r).step_by(2) {
        ops.push(op(Kind::Remove, k, 0));
    }
    let (dense, dry) = resize_ops(&ops, 16, uuid);
    assert!(
        dry.movements > 0 && dry.b2t > 0 && dry.expansions > 0,
        "{dry:?}"
    );
    // Every fence of every op.
    let all: HashSet<usize> = (0..ops.len()).collect();
    let out = phased_check(&ops, 16, &all, 1, uuid);
    eprintln!(
        "colliding keys: {} states, {} resize ops, paths {:?}",
        out.states,
        dense.len(),
        out.paths
    );
    assert!(
        out.violations.is_empty(),
        "{:#?}",
        &out.violations[..out.violations.len().min(10)]
    );
    assert!(out.paths.movements > 0 && out.paths.b2t > 0);
}
