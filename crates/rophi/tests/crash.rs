//! Targeted crash tests of the resize and of recovery, on the pmem
//! simulator's fence hook: a crash image at EVERY fence of a run of
//! operations that doubles a 16-head table (new table, slabs, rehash,
//! flush, commit, freeing the old table and its slabs), each opened with
//! `Rophi::open` and checked: every acknowledged write present with its
//! value, the operation in flight all or nothing, no key twice, `check()`
//! passes, no leaked byte, and the recovered table takes new inserts. Images
//! cut in the middle of a resize are also crashed again at every fence of
//! their own recovery. Plus: chain buckets emptied by deletes are released
//! at open and reused before any new slab.

mod common;

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use common::*;
use engine::Engine;
use pmem::{CrashChoice, Link, Mode, Pool};
use pmhash_rophi::layout::*;
use pmhash_rophi::Rophi;

/// Pool size of the crash runs: every crash image is a copy of it, so it
/// is small (the allocator's size classes each take a 256 KiB chunk).
const POOL: u64 = 6 * 256 * 1024;

/// Crash images collected by a fence hook: (fence number, image).
type Images = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;

/// What a crash image must recover to.
#[derive(Clone, Default)]
struct Expect {
    /// Every acknowledged write.
    acked: HashMap<u64, u64>,
    /// The operation in flight: key, value before, value after.
    in_flight: Option<(u64, Option<u64>, Option<u64>)>,
    /// Bytes the test holds in the pool outside the table (blocks it
    /// allocated itself): the allocator's bytes in use minus these must
    /// equal what the table reaches.
    extra: u64,
}

/// What the checked images showed.
#[derive(Default, Debug)]
struct Tally {
    images: u64,
    /// Images whose root named a table being built (`next`) or given back
    /// (`old`) when they were opened.
    next_pending: u64,
    old_pending: u64,
    /// Images taken during the recovery of another image.
    nested: u64,
    /// The in-flight operation found done / not done.
    in_flight_done: u64,
    in_flight_undone: u64,
    /// Largest "empty chain buckets released at open" seen, and how many
    /// images released any.
    released_max: u64,
    released_images: u64,
    failures: Vec<String>,
}

fn released(e: &Rophi) -> u64 {
    e.tallies().released_at_open
}

/// Opens one crash image and checks it against `ex`; with `nested`, also
/// crashes its recovery at every fence and checks those images. Panics
/// (caught by the caller) on a violation.
fn check_image(img: Vec<u8>, ex: &Expect, nested: bool, t: &mut Tally, ctx: &str) {
    t.images += 1;
    let copy = nested.then(|| img.clone());
    let pool = Arc::new(
        Pool::from_image(img, Mode::Volatile).unwrap_or_else(|e| panic!("{ctx}: pool: {e}")),
    );
    let root = pool.root();
    assert_ne!(root, 0, "{ctx}: no root");
    let (next, old) = (pool.load_u64(root + R_NEXT), pool.load_u64(root + R_OLD));
    let table = pool.load_u64(root + R_TABLE);
    let pending = (next != 0 && next != table) || (old != 0 && old != table);
    if next != 0 {
        t.next_pending += 1;
    }
    if old != 0 {
        t.old_pending += 1;
    }
    let e = Rophi::open(pool.clone(), &cfg(16, 1))
        .unwrap_or_else(|e| panic!("{ctx}: open refused: {e}"));
    let r = released(&e);
    t.released_max = t.released_max.max(r);
    t.released_images += (r > 0) as u64;
    // The walk: no key twice, nothing invented, every acknowledged write.
    let mut found: HashMap<u64, u64> = HashMap::new();
    let mut dup = None;
    e.for_each(&mut |k, v| {
        if found.insert(k, v).is_some() {
            dup.get_or_insert(k);
        }
    });
    assert_eq!(dup, None, "{ctx}: a key is stored twice");
    let fk = ex.in_flight.map(|f| f.0);
    for (&k, &v) in &ex.acked {
        if Some(k) != fk {
            assert_eq!(
                found.get(&k),
                Some(&v),
                "{ctx}: acknowledged {k:#x} lost or wrong"
            );
        }
    }
    if let Some((k, before, after)) = ex.in_flight {
        let got = found.get(&k).copied();
        assert!(
            got == before || got == after,
            "{ctx}: in-flight key {k:#x} recovered as {got:?}, allowed {before:?} or {after:?}"
        );
        if before != after {
            if got == after {
                t.in_flight_done += 1;
            } else {
                t.in_flight_undone += 1;
            }
        }
    }
    for &k in found.keys() {
        assert!(
            ex.acked.contains_key(&k) || Some(k) == fk,
            "{ctx}: invented key {k:#x}"
        );
    }
    for (&k, &v) in &found {
        assert_eq!(
            e.get(k),
            Some(v),
            "{ctx}: get({k:#x}) disagrees with the walk"
        );
    }
    assert_eq!(e.len(), found.len() as u64, "{ctx}: len()");
    let rep = e
        .check()
        .unwrap_or_else(|err| panic!("{ctx}: check(): {err}"));
    assert_eq!(rep.keys, found.len() as u64, "{ctx}: check().keys");
    assert_eq!(
        rep.reachable_bytes + ex.extra,
        pool.stats().bytes_in_use,
        "{ctx}: leaked bytes"
    );
    // The recovered table takes new writes (and can remove them).
    let k = 0x5eed_0000_0000_0000;
    assert!(
        e.insert(k, 1)
            .unwrap_or_else(|err| panic!("{ctx}: insert: {err}")),
        "{ctx}: fresh insert"
    );
    assert_eq!(e.get(k), Some(1), "{ctx}: fresh key");
    assert!(e.remove(k).unwrap());
    let rep = e
        .check()
        .unwrap_or_else(|err| panic!("{ctx}: check() after inserts: {err}"));
    assert_eq!(
        rep.reachable_bytes + ex.extra,
        pool.stats().bytes_in_use,
        "{ctx}: leak after inserts"
    );
    drop(e);
    // A crash at every fence of this image's own recovery.
    if let (Some(img), true) = (copy, pending) {
        let sink: Images = Arc::default();
        let s2 = sink.clone();
        let p = Pool::from_image_hooked(
            img,
            0, // no room to grow: the pool's recorded size is the limit
            Box::new(move |n, site| {
                let mut v = s2.lock().unwrap();
                v.push((n, site.image(CrashChoice::Persisted)));
                v.push((n, site.image(CrashChoice::Newest)));
            }),
        )
        .unwrap_or_else(|e| panic!("{ctx}: hooked pool: {e}"));
        let p = Arc::new(p);
        let e = Rophi::open(p.clone(), &cfg(16, 1))
            .unwrap_or_else(|e| panic!("{ctx}: hooked open: {e}"));
        drop(e);
        p.set_fence_hook(None).unwrap();
        let imgs = std::mem::take(&mut *sink.lock().unwrap());
        assert!(
            !imgs.is_empty(),
            "{ctx}: recovery of a cut resize issued no fence"
        );
        for (n, img) in imgs {
            t.nested += 1;
            check_image(img, ex, false, t, &format!("{ctx}, recovery fence {n}"));
        }
    }
}

/// The state the fence hook shares with the test.
struct Shared {
    ex: Expect,
    t: Tally,
    /// Random seeds per fence.
    randoms: u64,
    /// Also OnlyNew / AllButOld of up to this many recent lines per fence.
    line_choices: usize,
    /// Crash the recovery of the images of these choices that were cut in
    /// the middle of a resize.
    nested: Vec<CrashChoice>,
}

/// Installs a hook on `pool` that checks crash images at every fence.
fn install(pool: &Pool, shared: &Arc<Mutex<Shared>>) {
    let sh = shared.clone();
    pool.set_fence_hook(Some(Box::new(move |n, site| {
        let mut g = sh.lock().unwrap();
        let g = &mut *g;
        let mut choices = vec![CrashChoice::Persisted, CrashChoice::Newest];
        for r in 0..g.randoms {
            choices.push(CrashChoice::Random(n ^ r << 32));
        }
        if g.line_choices > 0 {
            let lines = site.recent_lines();
            let step = lines.len().div_ceil(g.line_choices).max(1);
            for &l in lines.iter().step_by(step) {
                choices.push(CrashChoice::OnlyNew(l));
                choices.push(CrashChoice::AllButOld(l));
            }
        }
        for c in choices {
            let img = site.image(c);
            let ctx = format!("fence {n} {c:?}");
            let nested = g.nested.contains(&c);
            let r = catch_unwind(AssertUnwindSafe(|| {
                check_image(img, &g.ex, nested, &mut g.t, &ctx)
            }));
            if let Err(p) = r {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                g.t.failures.push(format!("{ctx}: {msg}"));
            }
        }
    })))
    .unwrap();
}

/// One operation of a crash run.
#[derive(Clone, Copy, Debug)]
enum Op {
    Insert(u64, u64),
    Update(u64, u64),
    Upsert(u64, u64),
    Remove(u64),
}

/// Runs `op` with the hook checking every fence, then records its result.
fn run_op(e: &Rophi, shared: &Arc<Mutex<Shared>>, op: Op) {
    let (k, after) = {
        let mut g = shared.lock().unwrap();
        let (k, after) = match op {
            Op::Insert(k, v) => (k, g.ex.acked.get(&k).copied().or(Some(v))),
            Op::Update(k, v) => (k, g.ex.acked.get(&k).map(|_| v)),
            Op::Upsert(k, v) => (k, Some(v)),
            Op::Remove(k) => (k, None),
        };
        let before = g.ex.acked.get(&k).copied();
        g.ex.in_flight = Some((k, before, after));
        (k, after)
    };
    let r = match op {
        Op::Insert(k, v) => e.insert(k, v).map(|_| ()),
        Op::Update(k, v) => e.update(k, v).map(|_| ()),
        Op::Upsert(k, v) => e.upsert(k, v),
        Op::Remove(k) => e.remove(k).map(|_| ()),
    };
    r.unwrap_or_else(|err| panic!("{op:?}: {err}"));
    assert_eq!(e.get(k), after, "{op:?}");
    let mut g = shared.lock().unwrap();
    match after {
        Some(v) => g.ex.acked.insert(k, v),
        None => g.ex.acked.remove(&k),
    };
    g.ex.in_flight = None;
}

fn failures_report(t: &Tally) -> String {
    let n = t.failures.len();
    let first: Vec<&String> = t.failures.iter().take(8).collect();
    format!("{n} crash images failed; first: {first:#?}")
}

/// Inserts into a 16-head table until it has doubled twice (16 → 32 → 64
/// heads), with a crash image at every fence: Persisted, Newest, three
/// Random choices, and OnlyNew / AllButOld of recent lines. Images cut in
/// the middle of a resize (the root's `next` or `old` set) are crashed
/// again at every fence of their recovery.
#[test]
fn resize_crash_at_every_fence_keeps_every_acknowledged_insert() {
    let pool = mem_pool(Mode::Simulated, POOL, POOL, 70);
    let e = Rophi::create(pool.clone(), &cfg(16, 1)).unwrap();
    assert_eq!(head_k(&e), 4);
    let shared = Arc::new(Mutex::new(Shared {
        ex: Expect::default(),
        t: Tally::default(),
        randoms: 3,
        line_choices: 4,
        nested: vec![CrashChoice::Persisted, CrashChoice::Newest],
    }));
    install(&pool, &shared);
    let f0 = pool.fence_count();
    let mut i = 0u64;
    let edge = [0, u64::MAX, 1, u64::MAX - 1];
    while head_k(&e) < 6 || i < 72 {
        let k = edge
            .get(i as usize)
            .copied()
            .unwrap_or_else(|| fmix(i ^ 0xc0ffee));
        run_op(&e, &shared, Op::Insert(k, val(k, i)));
        i += 1;
        assert!(i < 1000);
    }
    pool.set_fence_hook(None).unwrap();
    let fences = pool.fence_count() - f0;
    let g = shared.lock().unwrap();
    let t = &g.t;
    eprintln!(
        "{i} inserts, {fences} fences, 2^{} heads, {} resizes, {} chain inserts: {t:?}",
        head_k(&e),
        e.tallies().resizes,
        e.tallies().chain_inserts
    );
    assert!(t.failures.is_empty(), "{}", failures_report(t));
    assert_eq!(e.tallies().resizes, 2);
    assert!(fences > i + 20, "only {fences} fences");
    assert!(
        t.images >= 5 * fences,
        "{} images for {fences} fences",
        t.images
    );
    assert!(
        t.next_pending > 0,
        "no image was cut while a new table was being built"
    );
    assert!(
        t.old_pending > 0,
        "no image was cut while the old table was being given back"
    );
    assert!(t.nested > 0, "no recovery was crashed");
    assert!(t.in_flight_done > 0 && t.in_flight_undone > 0, "{t:?}");
    drop(g);
    verify(
        &e,
        &pool,
        &shared.lock().unwrap().ex.acked,
        &[],
        "the original after the run",
    );
}

/// The doubling of a 1024-head table, which every available thread
/// rehashes (each zeroes, fills, flushes and fences its own range of new
/// heads, then the resizing thread fences the slabs and commits), with a
/// crash image at every fence of the insert that triggers it, the
/// helpers' fences included. Images cut in the middle of it recover the
/// old table with every key, and their recovery is crashed again.
#[test]
fn parallel_rehash_crash_at_every_fence_keeps_every_acknowledged_insert() {
    let pool = mem_pool(Mode::Simulated, 4 * MIB, 4 * MIB, 71);
    let e = Rophi::create(pool.clone(), &cfg(16, 1)).unwrap();
    let shared = Arc::new(Mutex::new(Shared {
        ex: Expect::default(),
        t: Tally::default(),
        randoms: 1,
        line_choices: 2,
        nested: vec![CrashChoice::Persisted],
    }));
    let key = |i: u64| fmix(i ^ 0x9a11e1);
    // Every key up to the last before the 1024-head table doubles (at more
    // than 2.0 keys per head), without the hook.
    let mut i = 0u64;
    while !(head_k(&e) == 10 && e.len() == 2048) {
        assert!(e.insert(key(i), val(key(i), i)).unwrap());
        shared
            .lock()
            .unwrap()
            .ex
            .acked
            .insert(key(i), val(key(i), i));
        i += 1;
        assert!(i < 3000, "the table never held 2048 keys in 2^10 heads");
    }
    install(&pool, &shared);
    let f0 = pool.fence_count();
    run_op(&e, &shared, Op::Insert(key(i), val(key(i), i)));
    pool.set_fence_hook(None).unwrap();
    let fences = pool.fence_count() - f0;
    assert_eq!(head_k(&e), 11, "the insert did not double the table");
    let g = shared.lock().unwrap();
    let t = &g.t;
    eprintln!("{fences} fences in the doubling insert: {t:?}");
    assert!(t.failures.is_empty(), "{}", failures_report(t));
    assert!(
        t.images >= 4 * fences,
        "{} images for {fences} fences",
        t.images
    );
    assert!(t.next_pending > 0, "no image was cut during the rehash");
    assert!(t.old_pending > 0, "no image was cut while giving back");
    assert!(t.nested > 0, "no recovery was crashed");
    drop(g);
    verify(
        &e,
        &pool,
        &shared.lock().unwrap().ex.acked,
        &[],
        "the original after the doubling",
    );
}

/// Inserts, updates, upserts and removes on a small key space around two
/// resizes, with a crash image at every fence; the removes empty chain
/// buckets, which some recovered image must release at open.
#[test]
fn mixed_ops_crash_at_every_fence_and_empty_chain_buckets_are_released() {
    let pool = mem_pool(Mode::Simulated, POOL, POOL, 71);
    let e = Rophi::create(pool.clone(), &cfg(16, 1)).unwrap();
    let shared = Arc::new(Mutex::new(Shared {
        ex: Expect::default(),
        t: Tally::default(),
        randoms: 1,
        line_choices: 0,
        nested: vec![CrashChoice::Persisted],
    }));
    install(&pool, &shared);
    let mut rng = Rng::new(71);
    let space = 90u64;
    let k_of = |i: u64| if i == 0 { u64::MAX } else { fmix(i ^ 0x1234) };
    // Grow past two resizes.
    for i in 0..space {
        run_op(&e, &shared, Op::Insert(k_of(i), val(k_of(i), 0)));
    }
    assert!(e.tallies().resizes >= 2);
    assert!(e.tallies().chain_inserts > 0, "no chain bucket to empty");
    // Mixed ops, then removes of most keys (emptying chain buckets).
    for j in 1..150u64 {
        let k = k_of(rng.below(space));
        let op = match rng.below(4) {
            0 => Op::Insert(k, val(k, j)),
            1 => Op::Update(k, val(k, j)),
            2 => Op::Upsert(k, val(k, j)),
            _ => Op::Remove(k),
        };
        run_op(&e, &shared, op);
    }
    for i in 0..space {
        if i % 8 != 0 {
            run_op(&e, &shared, Op::Remove(k_of(i)));
        }
    }
    pool.set_fence_hook(None).unwrap();
    let g = shared.lock().unwrap();
    let t = &g.t;
    eprintln!("mixed: {} resizes: {t:?}", e.tallies().resizes);
    assert!(t.failures.is_empty(), "{}", failures_report(t));
    assert!(t.images > 1000);
    assert!(t.in_flight_done > 0 && t.in_flight_undone > 0, "{t:?}");
    assert!(
        t.released_images > 0 && t.released_max > 0,
        "no recovered image released an empty chain bucket"
    );
    drop(g);
    verify(
        &e,
        &pool,
        &shared.lock().unwrap().ex.acked,
        &[],
        "the original after the run",
    );
}

/// `n` keys whose hash puts them in head `h` of a table of 2^k heads
/// (the seed read from the root block).
fn keys_in_head(pool: &Pool, k: u32, h: u64, n: usize, salt: u64) -> Vec<u64> {
    let seed = pool.load_u64(pool.root() + R_SEED);
    (0..n as u64)
        .map(|i| {
            let low = fmix(i ^ salt << 32) >> k;
            let hash = h << (64 - k) | low;
            let key = engine::hash::unfmix64(hash) ^ seed;
            assert_eq!(engine::hash::fmix64(key ^ seed), hash);
            key
        })
        .collect()
}

/// The keys in a bucket (tokens set), read from the pool.
fn bucket_keys(pool: &Pool, b: u64) -> Vec<u64> {
    let tok = pool.load_u64(b);
    (0..SLOTS)
        .filter(|&i| tok & token(i) != 0)
        .map(|i| pool.load_u64(b + 8 * w_key(i) as u64))
        .collect()
}

/// Deletes empty chain buckets (lazy deletion leaves them linked); after a
/// crash, open unlinks every one of them ("empty chain buckets released at
/// open" = their count) and puts them on the free list, and inserts reuse
/// them before any new slab is added. A clean close and reopen releases
/// them the same way.
#[test]
fn empty_chain_buckets_are_released_at_open_and_reused_before_new_slabs() {
    for crash in [true, false] {
        let tmp = TempPath::new("release");
        let popts = pool_opts(
            if crash { Mode::Simulated } else { Mode::Mapped },
            2 * MIB,
            0,
            72,
        );
        let pool = Arc::new(Pool::create(tmp.path(), &popts).unwrap());
        // 1024 heads: no resize below 2048 keys.
        let e = Rophi::create(pool.clone(), &cfg(2048, 1)).unwrap();
        let k = head_k(&e);
        assert_eq!(k, 10);
        let mut model = HashMap::new();
        // Head 5: the head bucket and 20 chain buckets; head 9: 3 chain
        // buckets; head 700: the head bucket only. Plus filler.
        let mut ins = |keys: &[u64]| {
            for &key in keys {
                assert!(e.insert(key, key ^ 1).unwrap());
                model.insert(key, key ^ 1);
            }
        };
        let h5 = keys_in_head(&pool, k, 5, 3 + 3 * 20, 1);
        let h9 = keys_in_head(&pool, k, 9, 3 + 3 * 3, 2);
        let h700 = keys_in_head(&pool, k, 700, 3, 3);
        ins(&h5);
        ins(&h9);
        ins(&h700);
        for i in 0..500u64 {
            let key = fmix(i ^ 0xf00d);
            if e.insert(key, key ^ 1).unwrap() {
                model.insert(key, key ^ 1);
            }
        }
        let sh = shape(&pool);
        let chain5 = sh
            .chains
            .iter()
            .find(|(hd, _)| *hd == sh.table.head(5))
            .unwrap()
            .1
            .clone();
        let chain9 = sh
            .chains
            .iter()
            .find(|(hd, _)| *hd == sh.table.head(9))
            .unwrap()
            .1
            .clone();
        assert!(chain5.len() >= 20 && chain9.len() >= 3);
        let in_use0: usize = sh.chains.iter().map(|(_, c)| c.len()).sum();
        let slab_total: u64 = sh.slabs.iter().map(|&(_, n)| n).sum();
        assert_eq!(e.tallies().chain_buckets_in_use, in_use0 as u64);
        // Empty every chain bucket of head 5 except its 3rd and last, and
        // every chain bucket of head 9 (the tail of the chain).
        let mut emptied = 0;
        for (j, &b) in chain5.iter().enumerate() {
            if j != 2 && j != chain5.len() - 1 {
                for key in bucket_keys(&pool, b) {
                    assert!(e.remove(key).unwrap());
                    model.remove(&key);
                }
                emptied += 1;
            }
        }
        for &b in &chain9 {
            for key in bucket_keys(&pool, b) {
                assert!(e.remove(key).unwrap());
                model.remove(&key);
            }
            emptied += 1;
        }
        // Lazy deletion: still linked.
        assert_eq!(
            shape(&pool)
                .chains
                .iter()
                .map(|(_, c)| c.len())
                .sum::<usize>(),
            in_use0
        );
        verify(&e, &pool, &model, &h5, "after the removes");
        let (p2, e2) = if crash {
            crash_reopen_persisted(&pool)
        } else {
            e.close().unwrap();
            drop(e);
            drop(pool);
            let p2 = Arc::new(Pool::open(tmp.path(), &popts).unwrap());
            let e2 = Rophi::open(p2.clone(), &cfg(16, 1)).unwrap();
            (p2, e2)
        };
        let what = if crash { "crash" } else { "clean reopen" };
        assert_eq!(released(&e2), emptied, "{what}: released at open");
        let sh2 = shape(&p2);
        let in_use: usize = sh2.chains.iter().map(|(_, c)| c.len()).sum();
        assert_eq!(
            in_use as u64,
            in_use0 as u64 - emptied,
            "{what}: chain buckets still linked"
        );
        assert!(
            sh2.chains
                .iter()
                .all(|(_, c)| c.iter().all(|&b| p2.load_u64(b) != 0)),
            "{what}: an empty chain bucket is still linked"
        );
        let free0 = e2.tallies().chain_buckets_free;
        assert_eq!(
            free0,
            slab_total - in_use as u64,
            "{what}: free list after open"
        );
        assert_eq!(e2.tallies().chain_buckets_in_use, in_use as u64);
        verify(&e2, &p2, &model, &h5, &format!("{what}: recovered"));
        // Every insert that needs a chain bucket takes one from the free
        // list (the released ones included) until it is empty: no new slab.
        let bytes0 = p2.stats().bytes_in_use;
        let more = keys_in_head(&p2, k, 300, 3 + 3 * (free0 as usize + 1), 4);
        let mut n = 0;
        for &key in &more {
            assert!(e2.insert(key, key ^ 1).unwrap());
            model.insert(key, key ^ 1);
            n += 1;
            let ci = e2.tallies().chain_inserts;
            if ci <= free0 {
                assert_eq!(
                    e2.tallies().slabs_added,
                    0,
                    "{what}: a slab added with {} free buckets left",
                    free0 - ci
                );
                assert_eq!(p2.stats().bytes_in_use, bytes0);
            }
            if ci == free0 {
                break;
            }
        }
        assert_eq!(e2.tallies().chain_buckets_free, 0);
        assert_eq!(head_k(&e2), k, "{what}: a resize interfered");
        // Every bucket of the old slabs is linked again: the released ones
        // were reused.
        let sh3 = shape(&p2);
        let linked: std::collections::HashSet<u64> = sh3
            .chains
            .iter()
            .flat_map(|(_, c)| c.iter().copied())
            .collect();
        for &(s, cnt) in &sh2.slabs {
            for b in 0..cnt {
                assert!(
                    linked.contains(&(s + S_BUCKETS + b * BUCKET)),
                    "{what}: slab bucket {b} of {s:#x} unused"
                );
            }
        }
        // The next chain insert adds a slab.
        for &key in &more[n..] {
            assert!(e2.insert(key, key ^ 1).unwrap());
            model.insert(key, key ^ 1);
        }
        assert_eq!(
            e2.tallies().slabs_added,
            1,
            "{what}: the free list ran dry without a new slab"
        );
        verify(&e2, &p2, &model, &[], &format!("{what}: after refilling"));
    }
}

/// A resize that runs out of room half way (its new table allocated, an
/// overflow slab for the rehash refused) gives the new table back and
/// leaves the old one working; a crash at every fence of it recovers the
/// old table with every key and leaks nothing. The pool is filled by the
/// test itself (blocks it holds) so that exactly the rehash's slab fails.
#[test]
fn resize_failing_for_room_mid_rehash_crash_at_every_fence() {
    let pool = mem_pool(Mode::Simulated, POOL, POOL, 73);
    let e = Rophi::create(pool.clone(), &cfg(16, 1)).unwrap();
    assert_eq!(head_k(&e), 4);
    // 33 keys that all hash to head 0 of 32 heads (so to head 0 of 16):
    // the rehash needs chain buckets, hence a new slab.
    let keys = keys_in_head(&pool, 5, 0, 33, 9);
    let mut acked = HashMap::new();
    for &k in &keys[..32] {
        assert!(e.insert(k, val(k, 1)).unwrap());
        acked.insert(k, val(k, 1));
    }
    assert_eq!(head_k(&e), 4);
    assert_eq!(e.tallies().slabs_added, 1);
    // The new table's size class gets a run with room; then every other
    // block of the pool is taken by 8 KiB blocks (the slab's class).
    let mut extra = 0;
    let r = pool
        .reserve(T_HEADS + (BUCKET << 5), Link::Nothing)
        .unwrap();
    extra += r.size();
    pool.commit(r);
    let slab_bytes = S_BUCKETS + slab_buckets(32) * BUCKET;
    while let Ok(r) = pool.reserve(slab_bytes, Link::Nothing) {
        extra += r.size();
        pool.commit(r);
    }
    let shared = Arc::new(Mutex::new(Shared {
        ex: Expect {
            acked,
            in_flight: None,
            extra,
        },
        t: Tally::default(),
        randoms: 3,
        line_choices: 4,
        nested: vec![CrashChoice::Persisted, CrashChoice::Newest],
    }));
    install(&pool, &shared);
    let f0 = pool.fence_count();
    run_op(&e, &shared, Op::Insert(keys[32], val(keys[32], 1)));
    pool.set_fence_hook(None).unwrap();
    let fences = pool.fence_count() - f0;
    let g = shared.lock().unwrap();
    let t = &g.t;
    eprintln!("failed resize: {fences} fences: {t:?}");
    assert!(t.failures.is_empty(), "{}", failures_report(t));
    assert_eq!(
        e.tallies().resize_failures,
        1,
        "the resize did not fail for room"
    );
    assert_eq!(e.tallies().resizes, 0);
    assert_eq!(head_k(&e), 4, "the old table is no longer live");
    assert!(
        fences >= 6,
        "only {fences} fences: the new table was never allocated"
    );
    assert!(t.next_pending > 0, "no image held the half-built table");
    assert!(t.nested > 0);
    let model = g.ex.acked.clone();
    drop(g);
    let r = e.check().unwrap();
    assert_eq!(r.keys, 33);
    assert_eq!(r.reachable_bytes + extra, pool.stats().bytes_in_use, "leak");
    for (k, v) in &model {
        assert_eq!(e.get(*k), Some(*v));
    }
}

/// A read-only open (what `pmhash check` and `inspect` do) of a pool cut in
/// the middle of a resize: every key reads back, and `check()` passes with
/// no leaked byte, as it does for the other engines' read-only views of a
/// crashed pool (recovery runs in memory only). The file is not written.
#[test]
fn read_only_open_of_a_pool_cut_mid_resize_reads_and_checks() {
    let pool = mem_pool(Mode::Simulated, POOL, POOL, 74);
    let e = Rophi::create(pool.clone(), &cfg(16, 1)).unwrap();
    let mut model = HashMap::new();
    for i in 0..32u64 {
        let k = fmix(i ^ 0xabc);
        assert!(e.insert(k, i).unwrap());
        model.insert(k, i);
    }
    let imgs: Images = Arc::default();
    let sink = imgs.clone();
    pool.set_fence_hook(Some(Box::new(move |n, site| {
        sink.lock()
            .unwrap()
            .push((n, site.image(CrashChoice::Persisted)));
    })))
    .unwrap();
    let k33 = fmix(32 ^ 0xabc);
    assert!(e.insert(k33, 32).unwrap());
    pool.set_fence_hook(None).unwrap();
    assert_eq!(e.tallies().resizes, 1);
    let root = pool.root();
    let tmp = TempPath::new("ro-cut");
    let (mut cut_next, mut cut_old, mut bad) = (0, 0, Vec::new());
    for (n, img) in std::mem::take(&mut *imgs.lock().unwrap()) {
        let (next, old) = (word(&img, root + R_NEXT), word(&img, root + R_OLD));
        if next == 0 && old == 0 {
            continue;
        }
        cut_next += (next != 0) as u32;
        cut_old += (old != 0) as u32;
        std::fs::write(tmp.path(), &img).unwrap();
        let (p, e) = open_file(tmp.path(), true).unwrap_or_else(|m| panic!("fence {n}: {m}"));
        for (k, v) in &model {
            assert_eq!(e.get(*k), Some(*v), "fence {n}: key {k:#x}");
        }
        match e.check() {
            Ok(r) if r.reachable_bytes == p.stats().bytes_in_use => {}
            Ok(r) => bad.push(format!(
                "fence {n} (next {next:#x}, old {old:#x}): check() reaches {} bytes, the allocator has {} in use",
                r.reachable_bytes,
                p.stats().bytes_in_use
            )),
            Err(err) => bad.push(format!("fence {n} (next {next:#x}, old {old:#x}): check(): {err}")),
        }
        drop(e);
        drop(p);
        assert!(
            std::fs::read(tmp.path()).unwrap() == img,
            "fence {n}: a read-only open wrote"
        );
    }
    assert!(cut_next > 0 && cut_old > 0, "{cut_next} / {cut_old}");
    assert!(
        bad.is_empty(),
        "{} of {} cut images fail check() read-only:\n{}",
        bad.len(),
        cut_next + cut_old,
        bad.join("\n")
    );
}

// ----- the generic crash checker ------------------------------------------------------------

/// The crash checker (`engine::crashtest::run`) on ROPHI: random
/// insert / update / remove workloads from a 16-head table over small key
/// spaces, crash states sampled at fences (and during recovery): zero
/// violations, zero leaked bytes, and resizes in the workload.
#[test]
fn crash_checker_finds_no_violation() {
    use engine::crashtest::{self, Config};
    let mut resizes = 0;
    for (seed, key_space) in [(1u64, 300u64), (2, 40)] {
        let c = Config {
            ops: 800,
            states: 300,
            seed,
            key_space,
            pool_size: 2 * MIB,
            initial_capacity: 16,
            ..Config::default()
        };
        let t = std::time::Instant::now();
        let r = crashtest::run(&pmhash_rophi::spec(), &c).expect("the crash checker runs");
        eprintln!(
            "rophi seed {seed} key space {key_space}: {} states ({} during recovery), {} fences, {:.1}s; {:?}",
            r.states,
            r.recovery_crashes,
            r.fences,
            t.elapsed().as_secs_f64(),
            r.detail
        );
        assert_eq!(r.violations, 0, "seed {seed}: {:#?}", r.messages);
        assert_eq!(r.leaked_bytes, 0, "seed {seed}: leaked bytes");
        assert!(
            r.states >= c.states,
            "only {} of {} states",
            r.states,
            c.states
        );
        resizes += pmhash_rophi::Tallies::from_detail(&r.detail)
            .unwrap_or_else(|| panic!("the report's detail is not rophi's tallies: {:?}", r.detail))
            .resizes;
    }
    assert!(resizes > 0, "no resize in the checker's workloads");
}

/// The table of the next doubling, reserved ahead once a 2^11-head table
/// holds 1.5 keys per head: a crash image at every fence of the inserts
/// up to its reservation (each recovery gives it back, without a leak),
/// a live `check` that counts it, the doubling that takes it as its new
/// table with a crash image at every fence, and a clean close that gives
/// back a table reserved ahead and not used yet.
#[test]
fn table_reserved_ahead_crash_at_every_fence_and_given_back_at_close() {
    let pool = mem_pool(Mode::Simulated, 4 * MIB, 8 * MIB, 74);
    let e = Rophi::create(pool.clone(), &cfg(16, 1)).unwrap();
    let shared = Arc::new(Mutex::new(Shared {
        ex: Expect::default(),
        t: Tally::default(),
        randoms: 0,
        line_choices: 0,
        nested: vec![CrashChoice::Persisted],
    }));
    let key = |i: u64| fmix(i ^ 0xa4ead);
    let heads = 1u64 << PREPARE_MIN_K;
    let root = pool.root();
    // Inserts without the hook up to `stop`.
    let mut i = 0u64;
    let fill = |e: &Rophi, i: &mut u64, stop: &dyn Fn(&Rophi) -> bool| {
        while !stop(e) {
            assert!(e.insert(key(*i), val(key(*i), *i)).unwrap());
            shared
                .lock()
                .unwrap()
                .ex
                .acked
                .insert(key(*i), val(key(*i), *i));
            *i += 1;
            assert!(*i < 10_000, "the table never reached its mark");
        }
    };
    fill(&e, &mut i, &|e| {
        head_k(e) == PREPARE_MIN_K && e.len() as f64 >= PREPARE_AT * heads as f64
    });
    assert_eq!(e.tallies().tables_prepared, 0, "reserved too early");
    assert_eq!(pool.load_u64(root + R_NEXT), 0);

    // The inserts up to the reservation, crashed at every fence.
    install(&pool, &shared);
    while e.tallies().tables_prepared == 0 {
        run_op(&e, &shared, Op::Insert(key(i), val(key(i), i)));
        i += 1;
        assert!(i < 4_000, "no table was reserved ahead");
    }
    pool.set_fence_hook(None).unwrap();
    let ahead = pool.load_u64(root + R_NEXT);
    assert_ne!(ahead, 0, "the root does not name the table reserved ahead");
    assert_eq!(Table::from_desc(ahead).k, PREPARE_MIN_K + 1);
    {
        let g = shared.lock().unwrap();
        eprintln!("reserving ahead: {:?}", g.t);
        assert!(g.t.failures.is_empty(), "{}", failures_report(&g.t));
        assert!(
            g.t.next_pending > 0,
            "no image held the table reserved ahead"
        );
        assert!(g.t.nested > 0, "no recovery giving it back was crashed");
    }
    // A live check counts it: no byte leaked, no corruption reported.
    let model = shared.lock().unwrap().ex.acked.clone();
    verify(&e, &pool, &model, &[], "with a table reserved ahead");

    // The doubling takes it, crashed at every fence.
    fill(&e, &mut i, &|e| e.len() == 2 * heads);
    assert_eq!(head_k(&e), PREPARE_MIN_K);
    let before = shared.lock().unwrap().t.next_pending;
    // A thread looks at the count every 64th insert of its own.
    install(&pool, &shared);
    while head_k(&e) == PREPARE_MIN_K {
        run_op(&e, &shared, Op::Insert(key(i), val(key(i), i)));
        i += 1;
        assert!(e.len() < 2 * heads + 65, "the table did not double");
    }
    pool.set_fence_hook(None).unwrap();
    assert_eq!(head_k(&e), PREPARE_MIN_K + 1);
    assert_eq!(pool.load_u64(root + R_TABLE), ahead);
    assert_eq!(
        e.tallies().ahead_taken,
        1,
        "the doubling did not take the table reserved ahead"
    );
    assert_eq!(pool.load_u64(root + R_NEXT), 0);
    {
        let g = shared.lock().unwrap();
        eprintln!("doubling into it: {:?}", g.t);
        assert!(g.t.failures.is_empty(), "{}", failures_report(&g.t));
        assert!(
            g.t.next_pending > before,
            "no image was cut in the doubling"
        );
        assert!(g.t.old_pending > 0, "no image was cut while giving back");
    }

    // The next one, reserved and never used: a clean close gives it back.
    fill(&e, &mut i, &|e| e.tallies().tables_prepared == 2);
    assert_ne!(pool.load_u64(root + R_NEXT), 0);
    let model = shared.lock().unwrap().ex.acked.clone();
    // A crash now, opened read-only (what `pmhash check` does): every key
    // reads back, `check` counts the reserved table, and nothing is written.
    let img = pool.crash_image(CrashChoice::Persisted).unwrap();
    let tmp = TempPath::new("ro-ahead");
    std::fs::write(tmp.path(), &img).unwrap();
    {
        let (p, ro) = open_file(tmp.path(), true).unwrap();
        for (k, v) in &model {
            assert_eq!(ro.get(*k), Some(*v), "read-only: key {k:#x}");
        }
        let r = ro.check().unwrap();
        assert_eq!(r.reachable_bytes, p.stats().bytes_in_use, "read-only: leak");
    }
    assert!(
        std::fs::read(tmp.path()).unwrap() == img,
        "a read-only open wrote"
    );
    // The close, crashed at every fence.
    let before = shared.lock().unwrap().t.images;
    install(&pool, &shared);
    e.close().unwrap();
    pool.set_fence_hook(None).unwrap();
    {
        let g = shared.lock().unwrap();
        assert!(g.t.failures.is_empty(), "{}", failures_report(&g.t));
        assert!(g.t.images > before, "the close issued no fence");
    }
    drop(e);
    assert_eq!(
        pool.load_u64(root + R_NEXT),
        0,
        "a clean close left the table reserved ahead"
    );
    let img = pool.crash_image(CrashChoice::Persisted).unwrap();
    let p2 = Arc::new(Pool::from_image(img, Mode::Simulated).unwrap());
    assert!(p2.was_clean());
    let e2 = Rophi::open(p2.clone(), &cfg(16, 1)).unwrap();
    verify(&e2, &p2, &model, &[key(i)], "reopened after a clean close");
}

/// A table reserved ahead in a pool that cannot grow must not cost an
/// insert its room: the pool is filled up (blocks of a slab's size taken
/// by the test) right after the reservation, so the next chain that needs
/// a slab finds none; the reserved table is given back, the slab takes its
/// room, the insert succeeds, and nothing leaks.
#[test]
fn table_reserved_ahead_is_given_back_when_a_slab_needs_its_room() {
    let size = 8 * MIB;
    let pool = mem_pool(Mode::Volatile, size, size, 75);
    let e = Rophi::create(pool.clone(), &cfg(16, 1)).unwrap();
    let root = pool.root();
    let key = |i: u64| fmix(i ^ 0xf011);
    let mut model = HashMap::new();
    let mut i = 0u64;
    while e.tallies().tables_prepared == 0 {
        assert!(e.insert(key(i), i).unwrap());
        model.insert(key(i), i);
        i += 1;
        assert!(i < 20_000, "no table was reserved ahead");
    }
    assert_ne!(pool.load_u64(root + R_NEXT), 0);
    let k = head_k(&e);
    let slab_bytes = S_BUCKETS + slab_buckets(1 << k) * BUCKET;
    let mut extra = 0;
    while let Ok(r) = pool.reserve(slab_bytes, Link::Nothing) {
        extra += r.size();
        pool.commit(r);
    }
    let slabs = e.tallies().slabs_added;
    while e.tallies().slabs_added == slabs {
        let r = e.insert(key(i), i);
        assert!(
            matches!(r, Ok(true)),
            "insert {i} needing a slab: {r:?} (given back {})",
            e.tallies().ahead_given_back
        );
        model.insert(key(i), i);
        i += 1;
        assert!(i < 40_000, "no insert needed a slab");
    }
    let t = e.tallies();
    assert_eq!(
        t.ahead_given_back, 1,
        "the reserved table was not given back"
    );
    assert_eq!(pool.load_u64(root + R_NEXT), 0);
    assert_eq!(head_k(&e), k, "the table doubled meanwhile");
    let r = e.check().unwrap();
    assert_eq!(r.keys, model.len() as u64);
    assert_eq!(r.reachable_bytes + extra, pool.stats().bytes_in_use, "leak");
    for (k, v) in &model {
        assert_eq!(e.get(*k), Some(*v));
    }
}
