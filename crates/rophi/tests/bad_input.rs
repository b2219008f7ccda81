//! Bad input: pools that hold no ROPHI table, or a corrupt one, are an
//! `Err` at open (never a panic) and a refused open leaves the file as it
//! was; a full pool is `Err(OutOfSpace)` that leaves the table usable; a
//! create cut by a crash is refused by open and finished by the next create
//! without a leaked byte; a second create and writes after `close` are
//! refused without changing anything.
//!
//! Each corrupt file is opened three ways: read-only (the file must stay
//! byte-for-byte the same), writable (only the pool header's state slots,
//! which the pool layer rewrites when it marks the pool open, may change),
//! and writable with the pool image compared right before and right after
//! the refused `Rophi::open` (the engine itself wrote nothing). Each is
//! tried with the clean flag set and cleared (crash recovery path).

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use common::*;
use engine::{Engine, EngineKind, EngineSpec, Error};
use pmem::{CrashChoice, Link, Mode, Pool, PoolOptions};
use pmhash_rophi::layout::*;
use pmhash_rophi::Rophi;

/// A cleanly closed 2 MiB file pool with `n` keys in a table grown from 16
/// heads, so that it has chains. Returns the path, the file's bytes, the
/// model and the shape.
fn built(tag: &str, n: u64) -> (TempPath, Vec<u8>, HashMap<u64, u64>, Shape) {
    let tmp = TempPath::new(tag);
    let popts = pool_opts(Mode::Mapped, 2 * MIB, 0, 0xbad);
    let pool = Arc::new(Pool::create(tmp.path(), &popts).unwrap());
    let e = Rophi::create(pool.clone(), &cfg(16, 1)).unwrap();
    let mut rng = Rng::new(n);
    let mut model = HashMap::new();
    while (model.len() as u64) < n {
        let (k, v) = (rng.next(), rng.next());
        assert!(e.insert(k, v).unwrap());
        model.insert(k, v);
    }
    let sh = shape(&pool);
    assert!(sh.chains.len() >= 4, "want chains: {:?}", sh.chains.len());
    assert!(!sh.slabs.is_empty());
    e.close().unwrap();
    drop(e);
    drop(pool);
    let bytes = std::fs::read(tmp.path()).unwrap();
    (tmp, bytes, model, sh)
}

/// The bad-pool harness (`engine::testkit::bad_pool::refused`): `bad`
/// (and `bad` with the clean flag cleared) opened read-only, writable, and
/// writable with the pool image compared around `Rophi::open`: each must
/// be an `Err`, never a panic, and leave the bytes as described in the
/// module comment. Returns a message.
fn refused(path: &Path, bad: &[u8], what: &str) -> String {
    engine::testkit::bad_pool::refused::<RophiSubject>(path, bad, what)
}

/// The untouched file opens (read-only and writable) with every key
/// (`engine::testkit::bad_pool::accepted`).
fn accepted(path: &Path, good: &[u8], model: &HashMap<u64, u64>, what: &str) {
    engine::testkit::bad_pool::accepted::<RophiSubject>(path, good, model, what)
}

// ----- pools without a ROPHI table -------------------------------------------------------

/// A pool with no root, and a pool whose root is an allocated block of
/// zeros (or of 64 bytes of garbage): open is an `Err`, nothing written.
#[test]
fn empty_and_zeroed_pool_roots_are_refused_untouched() {
    let tmp = TempPath::new("empty");
    let popts = pool_opts(Mode::Mapped, MIB, 0, 1);
    let pool = Pool::create(tmp.path(), &popts).unwrap();
    pool.close().unwrap();
    drop(pool);
    let empty = std::fs::read(tmp.path()).unwrap();
    let m = refused(tmp.path(), &empty, "empty pool");
    assert!(m.contains("no ROPHI table"), "{m}");
    // A volatile pool with no root, straight.
    let vp = mem_pool(Mode::Volatile, MIB, MIB, 2);
    let before = vp.image();
    assert!(Rophi::open(vp.clone(), &cfg(16, 1)).is_err());
    assert!(vp.image() == before);
    // Roots naming a zeroed block and a garbage block.
    for (what, fill) in [("zeroed root block", 0u8), ("garbage root block", 0x5a)] {
        let tmp = TempPath::new("zeroed");
        let pool = Pool::create(tmp.path(), &popts).unwrap();
        let r = pool.reserve(ROOT_BYTES, Link::RootPointer).unwrap();
        let off = r.offset();
        pool.write(off, &[fill; ROOT_BYTES as usize]);
        pool.persist(off, ROOT_BYTES as usize);
        pool.set_root(off).unwrap();
        pool.commit(r);
        pool.close().unwrap();
        drop(pool);
        let bytes = std::fs::read(tmp.path()).unwrap();
        refused(tmp.path(), &bytes, what);
        // And a second create on such a pool is refused, not overwritten.
        let pool = Arc::new(Pool::open(tmp.path(), &popts).unwrap());
        let before = pool.image();
        assert!(
            matches!(
                Rophi::create(pool.clone(), &cfg(16, 1)),
                Err(Error::InvalidArgument(_))
            ),
            "{what}: create over a foreign root"
        );
        assert!(pool.image() == before, "{what}: a refused create wrote");
    }
}

/// Pools made by other engines (their own layout ids): `Rophi::open` of
/// each is an `Err`, never a panic, and leaves the file as it was; a pool
/// opened with the "rophi" layout id is refused by the pool layer.
#[test]
fn pools_of_other_engines_are_refused_untouched() {
    let specs: Vec<EngineSpec> = vec![
        pass::spec(),
        hmeh::spec(),
        level::spec(),
        engine::slotarray::spec(),
    ];
    for spec in specs {
        let EngineKind::Persistent { layout, create, .. } = spec.kind else {
            panic!("{} is not persistent", spec.name);
        };
        let tmp = TempPath::new(spec.name);
        let popts = PoolOptions {
            mode: Mode::Mapped,
            size: 2 * MIB,
            layout: layout.into(),
            uuid: Some(uuid_of(9)),
            ..PoolOptions::default()
        };
        let pool = Arc::new(Pool::create(tmp.path(), &popts).unwrap());
        let e = create(pool.clone(), &cfg(16, 1)).unwrap();
        for k in 0..500u64 {
            assert!(e.insert(fmix(k), k).unwrap());
        }
        e.close().unwrap();
        drop(e);
        drop(pool);
        let bytes = std::fs::read(tmp.path()).unwrap();
        let m = refused(tmp.path(), &bytes, &format!("a {} pool", spec.name));
        eprintln!("{}: {m}", spec.name);
        // With the layout id asked for, the pool layer refuses first.
        let r = Pool::open(
            tmp.path(),
            &PoolOptions {
                mode: Mode::Mapped,
                layout: pmhash_rophi::LAYOUT.into(),
                ..PoolOptions::default()
            },
        );
        assert!(
            r.is_err(),
            "{}: the pool layer accepted layout rophi",
            spec.name
        );
        assert!(std::fs::read(tmp.path()).unwrap() == bytes);
        // And a ROPHI create on it is refused without a write.
        let pool = Arc::new(
            Pool::open(
                tmp.path(),
                &PoolOptions {
                    mode: Mode::Mapped,
                    ..PoolOptions::default()
                },
            )
            .unwrap(),
        );
        let before = pool.image();
        assert!(
            matches!(
                Rophi::create(pool.clone(), &cfg(16, 1)),
                Err(Error::InvalidArgument(_))
            ),
            "{}: create over its table",
            spec.name
        );
        assert!(
            pool.image() == before,
            "{}: a refused create wrote",
            spec.name
        );
    }
}

/// A file cut short anywhere is refused (by the pool layer or the engine),
/// without a panic and without a write.
#[test]
fn truncated_files_are_refused_untouched() {
    let (tmp, good, model, sh) = built("trunc", 600);
    accepted(tmp.path(), &good, &model, "untouched");
    let len = good.len() as u64;
    let last_table_byte = sh.table.off + sh.table.bytes();
    for cut in [
        0,
        100,
        4095,
        4096,
        len / 2,
        last_table_byte - 64,
        len - 4096,
        len - 64,
        len - 1,
    ] {
        let bad = &good[..cut as usize];
        for read_only in [true, false] {
            std::fs::write(tmp.path(), bad).unwrap();
            match open_file(tmp.path(), read_only) {
                Ok(_) => panic!("a file cut to {cut} bytes opened (read-only {read_only})"),
                Err(m) => assert!(m != "PANIC", "cut to {cut}: open panicked"),
            }
            assert!(
                std::fs::read(tmp.path()).unwrap() == bad,
                "cut to {cut} (read-only {read_only}): the file changed"
            );
        }
    }
}

// ----- corrupt ROPHI structures ----------------------------------------------------------

#[test]
fn corrupt_root_block_and_root_pointer_are_refused_untouched() {
    let (tmp, good, model, sh) = built("root", 1000);
    accepted(tmp.path(), &good, &model, "untouched");
    let root = sh.root;
    for (i, m) in [
        ROOT_MAGIC ^ 1,
        ROOT_MAGIC ^ (1 << 63),
        0,
        u64::MAX,
        TABLE_MAGIC,
        SLAB_MAGIC,
    ]
    .into_iter()
    .enumerate()
    {
        let msg = refused(
            tmp.path(),
            &patch(&good, &[(root, m)]),
            &format!("root magic {i}"),
        );
        assert!(msg.contains("magic"), "{msg}");
    }
    // Garbage over the whole root block.
    let mut rng = Rng::new(3);
    let mut bad = good.clone();
    for b in &mut bad[root as usize..(root + ROOT_BYTES) as usize] {
        *b = rng.next() as u8;
    }
    refused(tmp.path(), &bad, "garbage root block");
    // The hash seed (derived from the pool's uuid).
    let seed = word(&good, root + R_SEED);
    for (what, w) in [("one bit flipped", seed ^ 1), ("zero", 0)] {
        let msg = refused(
            tmp.path(),
            &patch(&good, &[(root + R_SEED, w)]),
            &format!("seed {what}"),
        );
        assert!(msg.contains("seed"), "{msg}");
    }
    // The pool root names something that is not a ROPHI root.
    let targets = [
        ("misaligned", root + 8),
        ("the table block", sh.table.off),
        ("a head bucket", sh.table.head(1)),
        ("a slab", sh.slabs[0].0),
        ("the last line", sh.pool_size - 64),
        ("past the end", sh.pool_size + 4096),
    ];
    for (what, to) in targets {
        let mut bad = good.clone();
        edit_state(&mut bad, |s| s.root = to);
        refused(tmp.path(), &bad, &format!("pool root -> {what}"));
    }
}

#[test]
fn corrupt_table_descriptors_are_refused_untouched() {
    let (tmp, good, model, sh) = built("desc", 1000);
    accepted(tmp.path(), &good, &model, "untouched");
    let at = sh.root + R_TABLE;
    let t = sh.table;
    let d = t.desc();
    assert_eq!(word(&good, at), d);
    let slab = sh.slabs[0].0;
    let targets = [
        ("k + 1 (block too small)", t.off | (t.k as u64 + 1)),
        ("k - 1 (header says k)", t.off | (t.k as u64 - 1)),
        ("k = MIN_K - 1", t.off | (MIN_K as u64 - 1)),
        ("k = 0", t.off),
        ("k = 63", t.off | 63),
        ("offset + 64", (t.off + 64) | t.k as u64),
        ("the root block", sh.root | t.k as u64),
        ("a slab", slab | MIN_K as u64),
        ("past the end", (sh.pool_size + (1 << 20)) | t.k as u64),
        ("straddling the end", (sh.pool_size - 4096) | t.k as u64),
        ("u64::MAX", u64::MAX),
        ("offset zero", t.k as u64),
        // 0 = "create not finished".
        ("zero", 0),
    ];
    for (what, w) in targets {
        refused(
            tmp.path(),
            &patch(&good, &[(at, w)]),
            &format!("table descriptor: {what}"),
        );
    }
    // The resize words name no valid table outside a resize.
    for (name, off) in [("next", R_NEXT), ("old", R_OLD)] {
        for (what, w) in [
            ("u64::MAX", u64::MAX),
            ("a slab", slab | MIN_K as u64),
            ("k + 1", t.off | (t.k as u64 + 1)),
            ("the root", sh.root | MIN_K as u64),
            ("past the end", (sh.pool_size + 4096) | 5),
        ] {
            refused(
                tmp.path(),
                &patch(&good, &[(sh.root + off, w)]),
                &format!("root word {name} -> {what}"),
            );
        }
    }
}

#[test]
fn corrupt_table_and_slab_headers_are_refused_untouched() {
    let (tmp, good, model, sh) = built("headers", 1000);
    accepted(tmp.path(), &good, &model, "untouched");
    let t = sh.table;
    for (what, off, w) in [
        ("magic", 0, TABLE_MAGIC ^ 1),
        ("magic = slab magic", 0, SLAB_MAGIC),
        ("k + 1", T_K, t.k as u64 + 1),
        ("k = 0", T_K, 0),
        ("root word", T_ROOT, sh.root + 64),
        ("root word zero", T_ROOT, 0),
    ] {
        refused(
            tmp.path(),
            &patch(&good, &[(t.off + off, w)]),
            &format!("table header {what}"),
        );
    }
    // The table's slab list head.
    let s0 = sh.slabs[0].0;
    for (what, w) in [
        ("misaligned", s0 + 8),
        ("a bucket of the slab", s0 + S_BUCKETS),
        ("the table itself", t.off),
        ("the root", sh.root),
        ("past the end", sh.pool_size + 4096),
        ("the last line", sh.pool_size - 64),
        ("u64::MAX", u64::MAX),
    ] {
        refused(
            tmp.path(),
            &patch(&good, &[(t.off + T_SLABS, w)]),
            &format!("slab list -> {what}"),
        );
    }
    // Each slab's header.
    for &(s, n) in &sh.slabs {
        for (what, off, w) in [
            ("magic", 0, SLAB_MAGIC ^ 1),
            ("magic = table magic", 0, TABLE_MAGIC),
            ("count 0", S_COUNT, 0),
            ("count + 1 (past its block)", S_COUNT, n + 64),
            ("count SLAB_MAX + 1", S_COUNT, SLAB_MAX + 1),
            ("count u64::MAX", S_COUNT, u64::MAX),
            ("next -> itself", S_NEXT, s),
            ("next misaligned", S_NEXT, s + 8),
            ("next past the end", S_NEXT, sh.pool_size + 4096),
            ("next -> the table", S_NEXT, t.off),
        ] {
            refused(
                tmp.path(),
                &patch(&good, &[(s + off, w)]),
                &format!("slab {s:#x} header {what}"),
            );
        }
    }
}

#[test]
fn corrupt_chain_pointers_and_tokens_are_refused_untouched() {
    let (tmp, good, model, sh) = built("chain", 1000);
    accepted(tmp.path(), &good, &model, "untouched");
    assert!(sh.chains.len() >= 2);
    let (head, chain) = sh
        .chains
        .iter()
        .max_by_key(|(_, c)| c.len())
        .unwrap()
        .clone();
    let chain2 = sh
        .chains
        .iter()
        .find(|(h, _)| *h != head)
        .unwrap()
        .1
        .clone();
    let next_of = |b: u64| b + 8 * W_NEXT as u64;
    let first = chain[0];
    let last = *chain.last().unwrap();
    let slab = sh.slabs[0].0;
    // A head's next pointer.
    for (what, to) in [
        ("misaligned", first + 8),
        ("past the end", sh.pool_size + 4096),
        ("the last line", sh.pool_size - 64),
        ("u64::MAX", u64::MAX),
        ("itself (a head, not a chain bucket)", head),
        (
            "another head",
            sh.table.head(if head == sh.table.head(0) { 1 } else { 0 }),
        ),
        ("a slab header", slab),
        ("the root block", sh.root),
        ("another chain's bucket (linked twice)", chain2[0]),
    ] {
        refused(
            tmp.path(),
            &patch(&good, &[(next_of(head), to)]),
            &format!("head next -> {what}"),
        );
    }
    // A chain bucket's next pointer.
    for (what, to) in [
        ("itself", last),
        ("the chain's first bucket (a loop)", first),
        ("its head", head),
        ("another chain's bucket", chain2[0]),
        ("misaligned", last + 16),
        ("past the end", sh.pool_size + 64),
    ] {
        refused(
            tmp.path(),
            &patch(&good, &[(next_of(last), to)]),
            &format!("chain next -> {what}"),
        );
    }
    // Token bytes: only 0 and 1 in bytes 0..3, bytes 3..8 zero.
    let full_head = *sh
        .full_buckets
        .iter()
        .find(|&&b| b < sh.table.off + sh.table.bytes())
        .unwrap();
    let tok = word(&good, full_head);
    assert_ne!(tok, 0);
    for (what, b, off) in [
        ("head token byte 0 = 2", full_head, 0),
        ("head token byte 2 = 2", full_head, 2),
        ("head token byte 3 = 2", full_head, 3),
        ("head token byte 7 = 2", full_head, 7),
        ("chain bucket token byte 1 = 2", first, 1),
        (
            "empty head token byte 0 = 2",
            sh.table.head(sh.table.heads() - 1),
            0,
        ),
    ] {
        refused(tmp.path(), &patch_byte(&good, b + off, 2), what);
    }
    refused(
        tmp.path(),
        &patch_byte(&good, first, 0xff),
        "chain token byte 0xff",
    );
}

/// A wrong item count is only trusted after a clean close (open refuses
/// the contradiction); after a crash, recovery recounts.
#[test]
fn wrong_item_count_is_refused_when_clean_and_recounted_after_a_crash() {
    let (tmp, good, model, sh) = built("len", 600);
    accepted(tmp.path(), &good, &model, "untouched");
    assert_eq!(word(&good, sh.root + R_LEN), 600);
    let bad = patch(&good, &[(sh.root + R_LEN, 5)]);
    std::fs::write(tmp.path(), &bad).unwrap();
    for read_only in [true, false] {
        std::fs::write(tmp.path(), &bad).unwrap();
        let m = open_file(tmp.path(), read_only)
            .err()
            .expect("a clean pool with a wrong count opened");
        assert!(m != "PANIC");
    }
    let mut crashed = bad.clone();
    clear_clean_flag(&mut crashed);
    std::fs::write(tmp.path(), &crashed).unwrap();
    let (pool, e) = open_file(tmp.path(), false).unwrap();
    verify(&e, &pool, &model, &[], "recounted");
    // The next clean close records the right count.
    e.close().unwrap();
    drop(e);
    drop(pool);
    let bytes = std::fs::read(tmp.path()).unwrap();
    assert_eq!(word(&bytes, sh.root + R_LEN), 600);
}

// ----- a full pool ---------------------------------------------------------------------------

/// A 2 MiB pool that cannot grow, filled until insert fails: the failure
/// is `OutOfSpace` and leaves the failed key absent; every acknowledged key
/// reads back, updates and removes work, `check()` passes with no leak,
/// keys fit again after removes, and a crash reopen recovers it all.
#[test]
fn full_pool_is_out_of_space_and_stays_usable() {
    let pool = mem_pool(Mode::Volatile, 2 * MIB, 2 * MIB, 40);
    assert_eq!(pool.max_size(), pool.size());
    let e = Rophi::create(pool.clone(), &cfg(16, 1)).unwrap();
    let mut model = HashMap::new();
    let mut failed = Vec::new();
    let mut i = 0u64;
    while failed.len() < 50 {
        let k = fmix(i ^ 0xf111);
        i += 1;
        assert!(i < 1_000_000, "a 2 MiB pool never filled up");
        match e.insert(k, i) {
            Ok(true) => {
                model.insert(k, i);
            }
            Ok(false) => panic!("fresh key {k:#x} reported present"),
            Err(Error::OutOfSpace(_)) => {
                assert_eq!(e.get(k), None, "a refused insert left {k:#x} behind");
                failed.push(k);
            }
            Err(other) => panic!("insert failed with {other:?}, not OutOfSpace"),
        }
    }
    eprintln!(
        "full at {} keys after {i} inserts: 2^{} heads, {} resize failures, {} slabs added, chain buckets in use {}, load factor {:.3}",
        model.len(),
        head_k(&e),
        e.tallies().resize_failures,
        e.tallies().slabs_added,
        e.tallies().chain_buckets_in_use,
        e.stats().load_factor
    );
    // (The allocator's size classes each hold a chunk of this small pool,
    // so resizes fail early and the table fills up with chains.)
    assert!(model.len() > 5000, "only {} keys fit in 2 MiB", model.len());
    assert!(
        e.stats().load_factor > 0.8,
        "a full pool at load factor {}",
        e.stats().load_factor
    );
    assert!(
        e.tallies().resize_failures > 0,
        "the full pool never refused a resize"
    );
    verify(&e, &pool, &model, &failed, "full");
    // Duplicates, updates and absent removes allocate nothing.
    for (j, (k, v)) in model.iter_mut().enumerate() {
        if j % 2 == 0 {
            *v ^= 0xabc;
            assert!(e.update(*k, *v).unwrap(), "update on a full pool");
        } else if j % 5 == 1 {
            assert!(!e.insert(*k, 0).unwrap(), "duplicate insert on a full pool");
        }
    }
    for &k in &failed {
        assert!(!e.remove(k).unwrap());
        assert!(!e.update(k, 1).unwrap());
    }
    verify(&e, &pool, &model, &failed, "full, updated");
    // Remove a third; the freed slots take new keys again.
    let keys: Vec<u64> = model.keys().copied().collect();
    for k in keys.iter().step_by(3) {
        assert!(e.remove(*k).unwrap(), "remove on a full pool");
        model.remove(k);
    }
    verify(&e, &pool, &model, &keys, "after removes");
    let mut again = 0;
    for &k in &failed {
        match e.insert(k, 5) {
            Ok(true) => {
                model.insert(k, 5);
                again += 1;
            }
            Ok(false) => panic!("{k:#x} reported present"),
            Err(Error::OutOfSpace(_)) => {}
            Err(other) => panic!("{other:?}"),
        }
    }
    assert!(again > 0, "no key fit after removing a third of the table");
    let mut more = 0;
    for j in 0..2000u64 {
        let k = fmix(j ^ 0xf222);
        if let Ok(true) = e.insert(k, j) {
            model.insert(k, j);
            more += 1;
        }
    }
    assert!(more > 100, "only {more} new keys fit after the removes");
    verify(&e, &pool, &model, &failed, "refilled");
    // Crash recovery of a table that ran out of room.
    let (p2, e2) = crash_reopen_live(&pool);
    verify(&e2, &p2, &model, &failed, "full, after a crash");
}

// ----- create -------------------------------------------------------------------------------------

/// A crash at any fence of `create` leaves either no table and no block in
/// use, a complete (empty) table, or a root block whose table word is 0:
/// open refuses that (writing nothing) and the next `create` finishes it,
/// leaking nothing.
#[test]
fn a_crash_during_create_is_refused_then_recreated_without_leaks() {
    for cap in [16u64, 5000] {
        let p = mem_pool(Mode::Simulated, 2 * MIB, 2 * MIB, 60);
        type Images = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;
        let imgs: Images = Arc::default();
        let sink = imgs.clone();
        p.set_fence_hook(Some(Box::new(move |n, site| {
            let mut v = sink.lock().unwrap();
            for c in [
                CrashChoice::Persisted,
                CrashChoice::Newest,
                CrashChoice::Random(n),
                CrashChoice::Random(n ^ 0x55),
            ] {
                v.push((n, site.image(c)));
            }
        })))
        .unwrap();
        let e = Rophi::create(p.clone(), &cfg(cap, 1)).unwrap();
        p.set_fence_hook(None).unwrap();
        drop(e);
        let imgs = std::mem::take(&mut *imgs.lock().unwrap());
        assert!(
            imgs.len() >= 4 * 5,
            "create issued {} fences",
            imgs.len() / 4
        );
        let (mut none, mut done, mut cut) = (0, 0, 0);
        for (n, img) in imgs {
            let ctx = format!("cap {cap} fence {n}");
            let p2 = Arc::new(Pool::from_image(img, Mode::Volatile).unwrap());
            if p2.root() == 0 {
                assert_eq!(
                    p2.stats().bytes_in_use,
                    0,
                    "{ctx}: no table, but blocks in use"
                );
                assert!(Rophi::open(p2.clone(), &cfg(cap, 1)).is_err());
                none += 1;
                continue;
            }
            let before = p2.image();
            let e2 = match Rophi::open(p2.clone(), &cfg(cap, 1)) {
                Ok(e2) => {
                    done += 1;
                    assert_eq!(e2.len(), 0);
                    e2
                }
                Err(err) => {
                    assert!(
                        err.to_string().contains("interrupted create"),
                        "{ctx}: {err}"
                    );
                    assert!(p2.image() == before, "{ctx}: the refused open wrote");
                    cut += 1;
                    Rophi::create(p2.clone(), &cfg(cap, 1))
                        .unwrap_or_else(|e| panic!("{ctx}: create again: {e}"))
                }
            };
            assert!(e2.insert(7, 7).unwrap());
            assert_eq!(e2.get(7), Some(7));
            let r = e2.check().unwrap_or_else(|e| panic!("{ctx}: check: {e}"));
            assert_eq!(r.keys, 1);
            assert_eq!(r.reachable_bytes, p2.stats().bytes_in_use, "{ctx}: leak");
        }
        eprintln!("cap {cap}: {none} images without a table, {done} complete, {cut} cut");
        assert!(none > 0 && done > 0 && cut > 0, "{none} / {done} / {cut}");
    }
}

#[test]
fn create_on_a_pool_that_holds_a_table_is_refused() {
    let tmp = TempPath::new("twice");
    let popts = pool_opts(Mode::Mapped, 2 * MIB, 0, 52);
    let pool = Arc::new(Pool::create(tmp.path(), &popts).unwrap());
    let e = Rophi::create(pool.clone(), &cfg(16, 1)).unwrap();
    let mut model = HashMap::new();
    for k in 0..500u64 {
        assert!(e.insert(fmix(k), k).unwrap());
        model.insert(fmix(k), k);
    }
    let before = pool.image();
    let root = pool.root();
    for cap in [16, 1 << 20] {
        assert!(
            matches!(
                Rophi::create(pool.clone(), &cfg(cap, 1)),
                Err(Error::InvalidArgument(_))
            ),
            "create on a pool with a table"
        );
    }
    assert_eq!(pool.root(), root);
    assert!(pool.image() == before, "a refused create changed the pool");
    verify(&e, &pool, &model, &[], "after refused creates");
    let (pool, e) = reopen_file(e, pool, tmp.path(), &popts);
    assert!(matches!(
        Rophi::create(pool.clone(), &cfg(16, 1)),
        Err(Error::InvalidArgument(_))
    ));
    verify(&e, &pool, &model, &[], "reopened");
    e.close().unwrap();
}

#[test]
fn impossible_sizes_and_read_only_pools_are_refused_without_leaks() {
    let pool = mem_pool(Mode::Volatile, MIB, MIB, 53);
    let in_use = pool.stats().bytes_in_use;
    for cap in [1u64 << 30, u64::MAX] {
        match Rophi::create(pool.clone(), &cfg(cap, 1)) {
            Err(Error::OutOfSpace(_)) => {}
            other => panic!("{cap} keys in 1 MiB: {:?}", other.map(|_| ())),
        }
        assert_eq!(pool.root(), 0);
        assert_eq!(pool.stats().bytes_in_use, in_use, "a refused create leaked");
    }
    // The pool still takes a valid table.
    let e = Rophi::create(pool.clone(), &cfg(0, 1)).unwrap();
    assert!(e.insert(1, 2).unwrap());
    verify(&e, &pool, &HashMap::from([(1, 2)]), &[3], "after refusals");
    // A read-only pool: create refused, open works and reads.
    let (tmp, good, model, _) = built("ro", 300);
    std::fs::write(tmp.path(), &good).unwrap();
    let ro = Arc::new(
        Pool::open(
            tmp.path(),
            &PoolOptions {
                mode: Mode::Mapped,
                read_only: true,
                ..PoolOptions::default()
            },
        )
        .unwrap(),
    );
    assert!(Rophi::create(ro.clone(), &cfg(16, 1)).is_err());
    let e = Rophi::open(ro.clone(), &cfg(16, 1)).unwrap();
    for (k, v) in &model {
        assert_eq!(e.get(*k), Some(*v));
    }
    drop(e);
    drop(ro);
    assert!(
        std::fs::read(tmp.path()).unwrap() == good,
        "a read-only open wrote"
    );
}

#[test]
fn writes_after_close_are_refused() {
    let pool = mem_pool(Mode::Volatile, 2 * MIB, 2 * MIB, 54);
    let e = Rophi::create(pool.clone(), &cfg(16, 1)).unwrap();
    assert!(e.insert(7, 8).unwrap());
    e.close().unwrap();
    assert!(e.insert(9, 1).is_err(), "insert after close");
    assert!(e.update(7, 1).is_err(), "update after close");
    assert!(e.remove(7).is_err(), "remove after close");
    assert!(e.upsert(7, 1).is_err(), "upsert after close");
    assert!(e.close().is_ok(), "a second close");
    assert_eq!(
        pool.header_state().clean,
        1,
        "close did not mark the pool clean"
    );
}

/// Writes on a read-only view (a private copy-on-write mapping): whatever
/// an insert returns, it is all or nothing: an insert that returns `Err`
/// left no pair behind, and the file is never written.
#[test]
fn inserts_on_a_read_only_view_are_all_or_nothing() {
    let (tmp, good, model, _) = built("ro-writes", 600);
    std::fs::write(tmp.path(), &good).unwrap();
    let (pool, e) = open_file(tmp.path(), true).unwrap();
    let mut model = model;
    let (mut ok, mut refused) = (0, Vec::new());
    for i in 0..3000u64 {
        let k = fmix(i ^ 0x0123_4567);
        match e.insert(k, i) {
            Ok(true) => {
                ok += 1;
                model.insert(k, i);
            }
            Ok(false) => panic!("fresh key {k:#x} reported present"),
            Err(err) => {
                if e.get(k).is_some() {
                    refused.push(format!(
                        "insert #{i} returned Err({err}) but {k:#x} is present"
                    ));
                }
            }
        }
    }
    eprintln!(
        "read-only view: {ok} inserts took effect, {} refused inserts left their pair",
        refused.len()
    );
    assert!(
        refused.is_empty(),
        "{} inserts failed but took effect, first: {}",
        refused.len(),
        refused[0]
    );
    for (k, v) in &model {
        assert_eq!(e.get(*k), Some(*v));
    }
    drop(e);
    drop(pool);
    assert!(
        std::fs::read(tmp.path()).unwrap() == good,
        "a read-only view wrote the file"
    );
}
