//! The persistent engines behind the DRAM cuckoo filter
//! (`engine::filtered`): a random workload against a model through several
//! filter growths, a reopen that rebuilds the filter from the pool, writers
//! racing a reader through growths, and the registry and CLI wiring (a
//! filtered engine's pool is the inner engine's).
//!
//! `pmhash` is a binary, so these tests build the specs with the same macro
//! the registry uses, from the engine crates the binary depends on.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use engine::filtered::Filtered;
use engine::testkit::{val, verify_model, Rng, TempPath};
use engine::{filtered_spec, Engine, EngineConfig, EngineKind, EngineSpec};
use pmem::{Mode, Pool, PoolOptions};

const MIB: u64 = 1 << 20;

fn specs() -> Vec<EngineSpec> {
    vec![
        filtered_spec!(level::spec, "level+filter"),
        filtered_spec!(hmeh::spec, "hmeh+filter"),
        filtered_spec!(pass::spec, "pass+filter"),
        filtered_spec!(pass::spec_var, "pass-var+filter"),
        filtered_spec!(pass::spec_dense, "pass-dense+filter"),
    ]
}

fn layout(spec: &EngineSpec) -> &'static str {
    match spec.kind {
        EngineKind::Persistent { layout, .. } => layout,
        EngineKind::Volatile { .. } => panic!("{} is not persistent", spec.name),
    }
}

fn opts(spec: &EngineSpec, mode: Mode) -> PoolOptions {
    PoolOptions {
        mode,
        size: 8 * MIB,
        max_size: 256 * MIB,
        layout: layout(spec).to_string(),
        ..PoolOptions::default()
    }
}

fn cfg(initial_capacity: u64, threads: usize) -> EngineConfig {
    EngineConfig {
        initial_capacity,
        threads,
        ..EngineConfig::default()
    }
}

/// The inner engine of a filtered entry of [`specs`].
fn inner_of(spec: &EngineSpec) -> fn() -> EngineSpec {
    match spec.name {
        "level+filter" => level::spec,
        "hmeh+filter" => hmeh::spec,
        "pass+filter" => pass::spec,
        "pass-var+filter" => pass::spec_var,
        "pass-dense+filter" => pass::spec_dense,
        other => panic!("{other} is not a filtered engine of these tests"),
    }
}

/// What the spec's `create` makes, with its type.
fn create(spec: &EngineSpec, pool: &Arc<Pool>, c: &EngineConfig) -> Filtered {
    Filtered::create(inner_of(spec), spec.name, pool.clone(), c)
        .unwrap_or_else(|e| panic!("{}: create: {e}", spec.name))
}

/// What the spec's `open` makes, with its type.
fn open(spec: &EngineSpec, pool: &Arc<Pool>, c: &EngineConfig) -> Filtered {
    Filtered::open(inner_of(spec), spec.name, pool.clone(), c)
        .unwrap_or_else(|e| panic!("{}: open: {e}", spec.name))
}

fn mem_pool(spec: &EngineSpec) -> Arc<Pool> {
    Arc::new(Pool::create(Path::new(""), &opts(spec, Mode::Volatile)).unwrap())
}

#[test]
fn specs_keep_the_inner_layout_and_name() {
    let inner = [
        level::spec(),
        hmeh::spec(),
        pass::spec(),
        pass::spec_var(),
        pass::spec_dense(),
    ];
    for (f, i) in specs().iter().zip(&inner) {
        assert_eq!(f.name, format!("{}+filter", i.name));
        assert_eq!(layout(f), layout(i), "{}: same pool format", f.name);
        assert!(!f.reference);
        let pool = mem_pool(f);
        let e = create(f, &pool, &cfg(16, 1));
        assert_eq!(e.name(), f.name);
    }
    // A DRAM-only engine cannot be filtered: an error, not a panic.
    fn dram() -> EngineSpec {
        bench::baselines()[0]
    }
    let dram = filtered_spec!(dram, "dram+filter");
    let EngineKind::Persistent { create, .. } = dram.kind else {
        unreachable!()
    };
    let pool = Arc::new(
        Pool::create(
            Path::new(""),
            &PoolOptions {
                mode: Mode::Volatile,
                size: 4 * MIB,
                layout: "dram".to_string(),
                ..PoolOptions::default()
            },
        )
        .unwrap(),
    );
    assert!(create(pool, &cfg(16, 1)).is_err());
}

/// Random inserts, removes, updates, upserts and gets against a model,
/// from a filter sized for 4 keys: the filter must grow several times and
/// never hide a key or keep a removed one.
fn model_run(spec: &EngineSpec, seed: u64, ops: usize, key_space: u64) {
    let pool = mem_pool(spec);
    let e = create(spec, &pool, &cfg(4, 1));
    let mut rng = Rng::new(seed);
    let mut model: HashMap<u64, u64> = HashMap::new();
    let key = |rng: &mut Rng| match rng.below(50) {
        0 => 0,
        1 => u64::MAX,
        _ => rng.below(key_space).wrapping_mul(0x9e37_79b9_7f4a_7c15),
    };
    let ctx = |i: usize| format!("{} seed {seed} op {i}", spec.name);
    for i in 0..ops {
        let k = key(&mut rng);
        let v = rng.next();
        match rng.below(10) {
            0..=3 => {
                let fresh = !model.contains_key(&k);
                assert_eq!(e.insert(k, v).unwrap(), fresh, "{}: insert", ctx(i));
                model.entry(k).or_insert(v);
            }
            4..=5 => {
                let had = model.remove(&k).is_some();
                assert_eq!(e.remove(k).unwrap(), had, "{}: remove", ctx(i));
            }
            6 => {
                let had = model.contains_key(&k);
                assert_eq!(e.update(k, v).unwrap(), had, "{}: update", ctx(i));
                if had {
                    model.insert(k, v);
                }
            }
            7 => {
                e.upsert(k, v).unwrap();
                model.insert(k, v);
            }
            _ => assert_eq!(e.get(k), model.get(&k).copied(), "{}: get", ctx(i)),
        }
    }
    let absent: Vec<u64> = (0..2000).map(|_| rng.next()).collect();
    // Also runs check(), which compares the filter with the engine.
    verify_model(&e, &pool, &model, &absent, &ctx(ops));
    let t = e.filter_tallies();
    assert_eq!(
        t.fingerprints as usize,
        model.len(),
        "{}: one fingerprint per key",
        spec.name
    );
    let growths = t.growths;
    eprintln!(
        "{}: {} keys, {growths} filter growths ({} on Full), filter load {}",
        spec.name,
        model.len(),
        t.full_growths,
        t.load.0
    );
    assert!(growths >= 2, "{}: only {growths} growths", spec.name);
    assert_eq!(t.lost_removes, 0);
}

#[test]
fn model_level() {
    model_run(&specs()[0], 1, 30_000, 4000);
}

#[test]
fn model_hmeh() {
    model_run(&specs()[1], 2, 30_000, 4000);
}

#[test]
fn model_pass() {
    model_run(&specs()[2], 3, 30_000, 4000);
}

#[test]
fn model_pass_var() {
    model_run(&specs()[3], 4, 30_000, 4000);
}

#[test]
fn model_pass_dense() {
    model_run(&specs()[4], 5, 30_000, 4000);
}

/// Inserts and removes, a clean close, and a reopen through the spec's
/// `open`: the rebuilt filter has exactly the keys that remain.
#[test]
fn reopen_rebuilds_the_filter() {
    for spec in specs() {
        let path = TempPath::new("pmhash-filtered", spec.name);
        let o = opts(&spec, Mode::Mapped);
        let c = cfg(64, 1);
        let mut model = HashMap::new();
        {
            let pool = Arc::new(Pool::create(path.path(), &o).unwrap());
            let e = create(&spec, &pool, &c);
            for i in 0..6000u64 {
                let k = i.wrapping_mul(0xd6e8_feb8_6659_fd93) ^ 0x55;
                assert!(e.insert(k, val(k, 1)).unwrap());
                model.insert(k, val(k, 1));
            }
            for (n, k) in model
                .keys()
                .copied()
                .collect::<Vec<_>>()
                .into_iter()
                .enumerate()
            {
                if n % 4 == 0 {
                    assert!(e.remove(k).unwrap());
                    model.remove(&k);
                }
            }
            e.close().unwrap();
        }
        let pool = Arc::new(Pool::open(path.path(), &o).unwrap());
        let e = open(&spec, &pool, &c);
        let absent: Vec<u64> = (0..5000u64).map(|i| !i.wrapping_mul(0x9e37_79b9)).collect();
        verify_model(
            &e,
            &pool,
            &model,
            &absent,
            &format!("{} reopened", spec.name),
        );
        let t = e.filter_tallies();
        assert_eq!(t.fingerprints as usize, model.len());
        let load = t.load.0;
        assert!(load > 0.4 && load <= 0.9, "{}: load {load}", spec.name);
        assert!(t.rebuild_ms.0 >= 0.0);
        assert!(e.stats().dram_bytes >= t.bytes);
        e.close().unwrap();
    }
}

/// Two writers on disjoint key ranges (inserting, and removing every third
/// key again) through filter growths from a tiny start, while a reader
/// checks keys that stay present: stable keys inserted before, and each
/// writer's kept keys once their insert returned.
fn concurrent_run(spec: &EngineSpec, per_writer: u64) {
    let pool = mem_pool(spec);
    let e = create(spec, &pool, &cfg(4, 3));
    let stable: Vec<u64> = (0..500u64).map(|i| (1 << 40) | i).collect();
    for &k in &stable {
        assert!(e.insert(k, val(k, 0)).unwrap());
    }
    let key = |w: u64, i: u64| (w << 32) | i;
    // Writer w's inserts of its keys below done[w] have returned.
    let done = [AtomicU64::new(0), AtomicU64::new(0)];
    let stop = AtomicBool::new(false);
    let misses = AtomicU64::new(0);
    let reads = AtomicU64::new(0);
    std::thread::scope(|s| {
        let (e, done, stop, misses, reads, stable) = (&e, &done, &stop, &misses, &reads, &stable);
        s.spawn(move || {
            let mut rng = Rng::new(99);
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..200 {
                    let k = stable[rng.below(stable.len() as u64) as usize];
                    if e.get(k) != Some(val(k, 0)) {
                        misses.fetch_add(1, Ordering::Relaxed);
                    }
                    let w = rng.below(2);
                    let upto = done[w as usize].load(Ordering::Acquire);
                    if upto > 0 {
                        // A kept key (not a multiple of 3) already inserted.
                        let mut i = rng.below(upto);
                        if i.is_multiple_of(3) {
                            i = (i + 1).min(upto - 1);
                        }
                        if !i.is_multiple_of(3) {
                            let k = key(w + 1, i);
                            if e.get(k) != Some(val(k, 0)) {
                                misses.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
                reads.fetch_add(200, Ordering::Relaxed);
            }
        });
        let writers: Vec<_> = (0..2u64)
            .map(|w| {
                s.spawn(move || {
                    for i in 0..per_writer {
                        let k = key(w + 1, i);
                        assert!(e.insert(k, val(k, 0)).unwrap());
                        if i >= 3 && i % 3 == 1 {
                            // Remove the multiple of 3 before: never read as kept.
                            assert!(e.remove(key(w + 1, i - 1)).unwrap());
                        }
                        done[w as usize].store(i + 1, Ordering::Release);
                    }
                })
            })
            .collect();
        for h in writers {
            h.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert_eq!(
        misses.load(Ordering::Relaxed),
        0,
        "{}: false negatives",
        spec.name
    );
    assert!(reads.load(Ordering::Relaxed) > 0);
    let mut model: HashMap<u64, u64> = stable.iter().map(|&k| (k, val(k, 0))).collect();
    for w in 1..=2 {
        for i in 0..per_writer {
            let removed = i % 3 == 0 && i + 1 < per_writer && i >= 3;
            if !removed {
                model.insert(key(w, i), val(key(w, i), 0));
            }
        }
    }
    verify_model(
        &e,
        &pool,
        &model,
        &[7, 8, 9],
        &format!("{} after race", spec.name),
    );
    let growths = e.filter_tallies().growths;
    eprintln!(
        "{}: {} reads during the race, {growths} filter growths",
        spec.name,
        reads.load(Ordering::Relaxed)
    );
    assert!(growths >= 2, "{}: only {growths} growths", spec.name);
}

// Rounds from a fresh engine: every round races through ~12 growths.
#[test]
fn concurrent_level() {
    for _ in 0..16 {
        concurrent_run(&specs()[0], 20_000);
    }
}

#[test]
fn concurrent_pass() {
    for _ in 0..16 {
        concurrent_run(&specs()[2], 20_000);
    }
}

/// The dense table's gets (which prefetch through the spiral mapping)
/// racing its inserts, removes and expansions.
#[test]
fn concurrent_pass_dense() {
    for _ in 0..8 {
        concurrent_run(&specs()[4], 20_000);
    }
}

#[path = "support/run.rs"]
mod run;

/// `pmhash ARGS`: whether it succeeded, and its output.
fn pmhash(args: &[&str]) -> (bool, String) {
    let (code, text) = run::pmhash(args);
    (code == 0, text)
}

/// The binary lists the filtered engines, and its tools open a pool made by
/// `level+filter` as the plain `level` pool it is.
#[test]
fn registry_lists_them_and_tools_open_the_inner_engine() {
    let (ok, out) = pmhash(&["engines"]);
    assert!(ok, "{out}");
    for s in specs() {
        assert!(
            out.lines()
                .any(|l| l.split_whitespace().next() == Some(s.name)),
            "{} missing from `pmhash engines`:\n{out}",
            s.name
        );
    }
    let spec = &specs()[0];
    let path = TempPath::new("pmhash-filtered-cli", "inspect");
    {
        let pool = Arc::new(Pool::create(path.path(), &opts(spec, Mode::Mapped)).unwrap());
        let e = create(spec, &pool, &cfg(64, 1));
        for k in 0..300u64 {
            assert!(e.insert(k, k).unwrap());
        }
        e.close().unwrap();
    }
    let p = path.path().to_str().unwrap();
    let (ok, out) = pmhash(&["inspect", p]);
    assert!(ok, "{out}");
    let engine_line = out.lines().find(|l| l.starts_with("engine ")).unwrap_or("");
    assert_eq!(
        engine_line.split_whitespace().nth(1),
        Some("level"),
        "inspect should open the pool with the unfiltered engine:\n{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("keys") && l.ends_with(" 300")),
        "{out}"
    );
    let (ok, out) = pmhash(&["check", p]);
    assert!(ok, "{out}");
}
