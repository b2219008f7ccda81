//! Bad input: truncated, foreign and corrupt pool files are an `Err` with
//! a message that says what is wrong (never a panic), and the file is left
//! as it was; a full pool is `Err(OutOfSpace)` that leaves the table
//! usable; invalid options, a second create and writes after `close` are
//! refused.
//!
//! Engine-level corruption is opened read-only (copy-on-write, as `pmhash
//! check` and `inspect` do): the file must stay byte-for-byte the same. A
//! writable open of such a pool may rewrite the pool header's state slots
//! (the pool layer marks the pool open before the engine looks at it), and
//! nothing else.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::Arc;

use engine::{Durability, Engine, EngineConfig, EngineKind, Error};
use pmem::{CrashChoice, Mode, Pool, PoolOptions};
use pmhash_hmeh::{Hmeh, Options};
mod common;
use common::off::*;
use common::{
    clear_clean_flag, open_guarded, patch, temp, word, HmehSubject, Rng, TempPath, MIB, STATE_SLOTS,
};

const CHUNK: u64 = 256 << 10;
fn cfg(d: Durability) -> EngineConfig {
    EngineConfig {
        durability: d,
        initial_capacity: 16,
        threads: 1,
    }
}

fn seg_opts(bytes: u64) -> Options {
    Options {
        segment_bytes: Some(bytes),
        ..Options::default()
    }
}

fn pool_opts(mode: Mode, size: u64, max_size: u64, read_only: bool) -> PoolOptions {
    PoolOptions {
        mode,
        size,
        max_size,
        layout: pmhash_hmeh::LAYOUT.into(),
        read_only,
        ..PoolOptions::default()
    }
}

/// Offsets of a built table, read from the pool.
#[derive(Clone, Debug)]
struct Shape {
    root: u64,
    rt_root: u64,
    /// Every segment, in tree order.
    segs: Vec<u64>,
    /// Every RT node but the root.
    children: Vec<u64>,
    /// An offset inside a free chunk (not an allocated block).
    free_off: u64,
}

fn shape(pool: &Pool) -> Shape {
    let root = pool.root();
    let rt_root = pool.load_u64(root + R_RT_ROOT);
    let (mut segs, mut children) = (Vec::new(), Vec::new());
    let mut stack = vec![rt_root];
    while let Some(n) = stack.pop() {
        for i in 0..8 {
            let e = pool.load_u64(n + i * 8);
            if e & 1 == 1 {
                children.push(e & !1);
                stack.push(e & !1);
            } else if !segs.contains(&e) {
                segs.push(e);
            }
        }
    }
    assert!(
        pool.stats().free_chunks > 0,
        "the test pool needs a free chunk"
    );
    let free_off = pool.size() - CHUNK + 1024;
    assert!(pool.block_size(free_off).is_err());
    Shape {
        root,
        rt_root,
        segs,
        children,
        free_off,
    }
}

/// A cleanly closed file pool with `n` keys in 1 KiB segments (2 MiB,
/// fixed size). Returns the file's bytes, the keys and the shape.
fn built(tag: &str, n: u64, seg_bytes: u64) -> (TempPath, Vec<u8>, HashMap<u64, u64>, Shape) {
    let tmp = temp(tag);
    let pool =
        Arc::new(Pool::create(tmp.path(), &pool_opts(Mode::Mapped, 2 * MIB, 0, false)).unwrap());
    let hm =
        Hmeh::create_with(pool.clone(), &cfg(Durability::Strict), &seg_opts(seg_bytes)).unwrap();
    let mut rng = Rng(n);
    let mut model = HashMap::new();
    while (model.len() as u64) < n {
        let (k, v) = (rng.next(), rng.next());
        assert!(hm.insert(k, v).unwrap());
        model.insert(k, v);
    }
    let sh = shape(&pool);
    hm.close().unwrap();
    drop(hm);
    drop(pool);
    let bytes = std::fs::read(tmp.path()).unwrap();
    (tmp, bytes, model, sh)
}

/// Writes `bad` to the file and opens it read-only and writable: each must
/// be an `Err` whose message contains one of `needles` (case-insensitive),
/// never a panic. After the read-only open the file is byte-for-byte
/// `bad`; after the writable one, everything but the pool header's state
/// slots is. Returns the writable open's message.
fn refused(path: &Path, bad: &[u8], what: &str, needles: &[&str]) -> String {
    std::fs::write(path, bad).unwrap();
    let mut msg = String::new();
    for read_only in [true, false] {
        let mode = if read_only { "read-only" } else { "writable" };
        match open_guarded::<HmehSubject>(path, read_only) {
            Ok((_, hm)) => panic!(
                "{what} ({mode}): open accepted it; check() says {:?}",
                hm.check()
            ),
            Err(e) => {
                assert!(e != "PANIC", "{what} ({mode}): open panicked");
                let low = e.to_lowercase();
                assert!(
                    needles.iter().any(|n| low.contains(&n.to_lowercase())),
                    "{what} ({mode}): message {e:?} names none of {needles:?}"
                );
                msg = e;
            }
        }
        let now = std::fs::read(path).unwrap();
        assert_eq!(now.len(), bad.len(), "{what} ({mode}): file length changed");
        if read_only {
            assert!(now == bad, "{what} (read-only): the file changed");
        } else {
            let diff: Vec<usize> = (0..now.len())
                .filter(|&i| now[i] != bad[i] && !STATE_SLOTS.contains(&i))
                .take(4)
                .collect();
            assert!(
                diff.is_empty(),
                "{what} (writable): bytes outside the header state changed at {diff:#x?}"
            );
            std::fs::write(path, bad).unwrap();
        }
    }
    msg
}

/// Pool-level refusals leave the file byte-for-byte untouched even when
/// opened for writing.
fn refused_by_pool(path: &Path, bad: &[u8], what: &str, needles: &[&str]) {
    std::fs::write(path, bad).unwrap();
    for read_only in [false, true] {
        let r = catch_unwind(AssertUnwindSafe(|| {
            Pool::open(path, &pool_opts(Mode::Mapped, 0, 0, read_only)).map(|_| ())
        }))
        .unwrap_or_else(|_| panic!("{what}: Pool::open panicked"));
        let e = r
            .err()
            .unwrap_or_else(|| panic!("{what}: the pool layer accepted it"))
            .to_string();
        let low = e.to_lowercase();
        assert!(
            needles.iter().any(|n| low.contains(&n.to_lowercase())),
            "{what}: message {e:?} names none of {needles:?}"
        );
        assert!(
            std::fs::read(path).unwrap() == bad,
            "{what}: the file changed"
        );
    }
}

// ----- pool-level bad files ----------------------------------------------------------

#[test]
fn truncated_zeroed_and_corrupt_headers_are_refused_untouched() {
    let (tmp, good, model, _) = built("header", 300, 1024);
    // The untouched file opens with every key.
    {
        let (_p, hm) = open_guarded::<HmehSubject>(tmp.path(), true).unwrap();
        assert_eq!(hm.len(), model.len() as u64);
        for (k, v) in &model {
            assert_eq!(hm.get(*k), Some(*v));
        }
        hm.check().unwrap();
    }
    for len in [
        0usize,
        7,
        64,
        4095,
        4096,
        512 << 10,
        good.len() / 2,
        good.len() - 1,
    ] {
        refused_by_pool(
            tmp.path(),
            &good[..len],
            &format!("truncated to {len} bytes"),
            &["truncated", "not a pmhash pool", "short", "size"],
        );
    }
    let mut zeroed = good.clone();
    zeroed[..4096].fill(0);
    refused_by_pool(tmp.path(), &zeroed, "zeroed header", &["not a pmhash pool"]);
    let mut zeroed_all_state = good.clone();
    zeroed_all_state[64..192].fill(0);
    refused_by_pool(
        tmp.path(),
        &zeroed_all_state,
        "both state slots zeroed",
        &["state", "corrupt"],
    );
    // Random corruption of the identity line: the CRC catches every flip.
    let mut rng = Rng(77);
    for _ in 0..40 {
        let mut bad = good.clone();
        let i = (rng.next() % 64) as usize;
        bad[i] ^= 1 << (rng.next() % 8);
        refused_by_pool(
            tmp.path(),
            &bad,
            &format!("identity byte {i} flipped"),
            &[
                "not a pmhash pool",
                "corrupt",
                "version",
                "layout",
                "crc",
                "checksum",
            ],
        );
    }
    // Random corruption of both state slots.
    for _ in 0..20 {
        let mut bad = good.clone();
        for base in [64usize, 128] {
            let i = base + (rng.next() % 64) as usize;
            bad[i] ^= 1 << (rng.next() % 8);
        }
        refused_by_pool(
            tmp.path(),
            &bad,
            "both state slots flipped",
            &["state", "corrupt"],
        );
    }
    // One state slot flipped: the other (older) slot may take over. Read-only:
    // an Err, or an open whose engine sees a consistent table.
    for _ in 0..20 {
        let mut bad = good.clone();
        let i = 64 + (rng.next() % 128) as usize;
        bad[i] ^= 1 << (rng.next() % 8);
        std::fs::write(tmp.path(), &bad).unwrap();
        match open_guarded::<HmehSubject>(tmp.path(), true) {
            Ok((_p, hm)) => {
                let r = hm
                    .check()
                    .expect("an older state slot opens a consistent table");
                assert_eq!(r.keys, model.len() as u64);
            }
            Err(e) => assert!(e != "PANIC", "state byte {i}: open panicked"),
        }
        assert!(std::fs::read(tmp.path()).unwrap() == bad);
    }
    std::fs::write(tmp.path(), &good).unwrap();
    assert!(
        open_guarded::<HmehSubject>(tmp.path(), true).is_ok(),
        "the restored file opens"
    );
}

/// Another engine's pool: the pool header's layout check refuses it by
/// name; opened with any layout, the engine refuses its root.
#[test]
fn foreign_layouts_are_refused() {
    let EngineKind::Persistent { create, .. } = engine::slotarray::spec().kind else {
        unreachable!()
    };
    for (layout, initial) in [("slotarray", 8u64), ("slotarray", 4096), ("level", 0)] {
        let tmp = temp("foreign");
        let o = PoolOptions {
            layout: layout.into(),
            ..pool_opts(Mode::Mapped, 2 * MIB, 0, false)
        };
        let pool = Arc::new(Pool::create(tmp.path(), &o).unwrap());
        if initial > 0 {
            let sa = create(pool.clone(), &cfg(Durability::Strict)).unwrap();
            for k in 0..50u64 {
                sa.insert(k, k).unwrap();
            }
            sa.close().unwrap();
        } else {
            // A pool named "level" whose root is a block of noise.
            let r = pool.reserve(8192, pmem::Link::RootPointer).unwrap();
            let noise: Vec<u8> = (0..8192u32)
                .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
                .collect();
            pool.write(r.offset(), &noise);
            pool.persist(r.offset(), 8192);
            pool.set_root(r.offset()).unwrap();
            pool.commit(r);
            pool.close().unwrap();
        }
        drop(pool);
        let bytes = std::fs::read(tmp.path()).unwrap();
        refused_by_pool(
            tmp.path(),
            &bytes,
            &format!("a {layout} pool"),
            &[layout, "layout"],
        );
        // Any layout accepted by the pool layer: the engine refuses.
        let any = PoolOptions {
            layout: String::new(),
            read_only: true,
            ..pool_opts(Mode::Mapped, 0, 0, true)
        };
        let pool = Arc::new(Pool::open(tmp.path(), &any).unwrap());
        let r = catch_unwind(AssertUnwindSafe(|| {
            Hmeh::open(pool.clone(), &cfg(Durability::Strict))
        }))
        .unwrap_or_else(|_| panic!("Hmeh::open panicked on a {layout} pool"));
        match r {
            Err(Error::Corrupt(m)) => assert!(m.contains("magic") || m.contains("root"), "{m}"),
            Err(other) => panic!("{layout}: {other} (want Corrupt)"),
            Ok(_) => panic!("Hmeh::open accepted a {layout} pool"),
        }
        drop(pool);
        assert!(std::fs::read(tmp.path()).unwrap() == bytes);
    }
    // A pool without any root.
    let pool =
        Arc::new(Pool::create(Path::new(""), &pool_opts(Mode::Simulated, MIB, 0, false)).unwrap());
    assert!(matches!(
        Hmeh::open(pool, &cfg(Durability::Strict)),
        Err(Error::Corrupt(m)) if m.contains("root")
    ));
}

// ----- engine-level corruption -----------------------------------------------------

#[test]
fn corrupt_root_block_is_refused_untouched() {
    let (tmp, good, _, sh) = built("root", 300, 1024);
    let p = tmp.path();
    let root = sh.root;
    refused(
        p,
        &patch(&good, &[(root, word(&good, root) ^ 0x20)]),
        "root magic",
        &["magic"],
    );
    for g in [
        0u64,
        100,
        8,
        1024,
        16 | 40 << 16,
        16 | 1 << 24,
        16,
        u64::MAX,
    ] {
        // 16 alone has depth cap 0.
        refused(
            p,
            &patch(&good, &[(root + R_GEOMETRY, g)]),
            &format!("geometry {g:#x}"),
            &["geometry"],
        );
    }
    for h in [2u64, 7, 1 << 40, u64::MAX] {
        refused(
            p,
            &patch(&good, &[(root + R_HASH, h)]),
            &format!("hash kind {h}"),
            &["hash kind"],
        );
    }
    refused(
        p,
        &patch(&good, &[(root + R_ZERO_PRESENT, 2)]),
        "zero-hash flag 2",
        &["zero-hash"],
    );
    for (what, rt) in [
        ("misaligned", sh.rt_root + 8),
        ("zero", 0),
        ("in a free chunk", sh.free_off),
        ("past the pool", 1 << 40),
        ("in the header", 4096),
    ] {
        refused(
            p,
            &patch(&good, &[(root + R_RT_ROOT, rt)]),
            &format!("RT root {what}"),
            &["RT root", "not allocated", "outside"],
        );
    }
    // RT root naming a segment: its header words read as entries.
    refused(
        p,
        &patch(&good, &[(root + R_RT_ROOT, sh.segs[0])]),
        "RT root naming a segment",
        &["segment", "entry", "RT", "depth"],
    );
}

#[test]
fn corrupt_rt_directory_is_refused_untouched() {
    // Enough keys for a node split: a second RT level.
    let (tmp, good, _, sh) = built("rt", 1500, 1024);
    assert!(!sh.children.is_empty(), "no child node: {sh:?}");
    let p = tmp.path();
    let rt = sh.rt_root;
    let e0 = word(&good, rt);
    refused(
        p,
        &patch(&good, &[(rt, sh.free_off)]),
        "entry naming an unallocated block",
        &["not allocated", "not the start of a block"],
    );
    refused(
        p,
        &patch(&good, &[(rt, sh.root)]),
        "entry naming the root block",
        &["bytes"],
    );
    refused(
        p,
        &patch(&good, &[(rt, rt)]),
        "entry naming an RT node",
        &["bytes"],
    );
    refused(p, &patch(&good, &[(rt, 0)]), "entry 0", &["not a segment"]);
    refused(
        p,
        &patch(&good, &[(rt, sh.segs[0] + 64)]),
        "entry inside a segment",
        &["not allocated", "not the start of a block", "not a slot"],
    );
    refused(
        p,
        &patch(&good, &[(rt, sh.free_off | 1)]),
        "child naming an unallocated block",
        &["RT node", "not allocated", "not the start of a block"],
    );
    // Cycles: the root as its own child; a child naming the root. The walk
    // must end (the depth limit, or a run or depth check on the way).
    let cycle: &[&str] = &[
        "deepest level",
        "sits in an RT node",
        "starts a run",
        "inconsistent",
        "reached twice",
        "sits at entry",
    ];
    refused(
        p,
        &patch(&good, &[(rt, rt | 1)]),
        "root node as its own child",
        cycle,
    );
    let child = sh.children[0];
    for i in 0..8 {
        refused(
            p,
            &patch(&good, &[(child + i * 8, rt | 1)]),
            &format!("child entry {i} naming the root"),
            cycle,
        );
    }
    // An inconsistent run in a cleanly closed pool: the second entry of a
    // run names another segment.
    let (node, i, other) = std::iter::once(rt)
        .chain(sh.children.iter().copied())
        .find_map(|n| {
            let run: Vec<u64> = (0..8).map(|i| word(&good, n + i * 8)).collect();
            (1..8).find_map(|i| {
                let first = run[i - 1];
                (run[i] == first && first & 1 == 0).then(|| {
                    let other = sh.segs.iter().copied().find(|&s| s != first).unwrap();
                    (n, i as u64, other)
                })
            })
        })
        .expect("a run of two or more entries in some node");
    refused(
        p,
        &patch(&good, &[(node + i * 8, other)]),
        "inconsistent run in a clean pool",
        &[
            "inconsistent",
            "claim the same",
            "starts a run",
            "sits in an RT node",
            "sits at entry",
        ],
    );
    assert_ne!(e0, 0);
}

#[test]
fn corrupt_segment_headers_are_refused_untouched() {
    let (tmp, good, model, sh) = built("seg", 300, 1024);
    let p = tmp.path();
    let s = sh.segs[1];
    let id = word(&good, s + H_IDENT);
    refused(
        p,
        &patch(&good, &[(s + H_IDENT, 0)]),
        "identity zeroed",
        &["identity"],
    );
    refused(
        p,
        &patch(&good, &[(s + H_IDENT, id ^ 1 << 50)]),
        "identity magic",
        &["identity"],
    );
    refused(
        p,
        &patch(&good, &[(s + H_IDENT, id & !(0xffff << 32) | 40 << 32)]),
        "local depth 40",
        &["identity"],
    );
    // A valid identity that does not fit the tree.
    let deeper = id & !(0xffff << 32) | 9 << 32;
    refused(
        p,
        &patch(&good, &[(s + H_IDENT, deeper)]),
        "local depth 9 in the root node",
        &["local depth", "depth"],
    );
    let other = word(&good, sh.segs[0] + H_IDENT);
    refused(
        p,
        &patch(&good, &[(s + H_IDENT, other)]),
        "another segment's identity",
        &[
            "claim the same",
            "no segment owns",
            "starts a run",
            "inconsistent",
            "sits at entry",
        ],
    );
    refused(
        p,
        &patch(&good, &[(s + H_BACKUP, sh.segs[0])]),
        "backup left in a clean pool",
        &["backups"],
    );
    // A crashed pool (clean flag cleared) with a garbage backup pointer:
    // a writable open (which merges backups) refuses it; a read-only open
    // (which leaves backups alone) may show the table, whose check()
    // reports the bad backup.
    let mut crashed = patch(&good, &[(s + H_BACKUP, sh.free_off)]);
    clear_clean_flag(&mut crashed);
    std::fs::write(p, &crashed).unwrap();
    match open_guarded::<HmehSubject>(p, true) {
        Err(e) => assert!(e != "PANIC" && e.contains("block"), "{e}"),
        Ok((_pool, hm)) => {
            let e = hm
                .check()
                .expect_err("check() missed a backup in a free chunk");
            assert!(e.to_string().contains("block"), "{e}");
            assert_eq!(hm.len(), model.len() as u64);
        }
    }
    assert!(
        std::fs::read(p).unwrap() == crashed,
        "read-only open changed the file"
    );
    match open_guarded::<HmehSubject>(p, false) {
        Err(e) => assert!(e != "PANIC" && e.contains("block"), "{e}"),
        Ok(_) => panic!("a writable open accepted a backup in a free chunk"),
    }
    let _ = model;
}

/// A garbage overflow pointer (segment header word 40) must not crash
/// the process: open refuses the pool, or the table it opens reports the
/// corruption from `check()` and survives its own operations.
#[test]
fn garbage_overflow_pointer_is_not_a_panic() {
    let (tmp, good, model, sh) = built("ovf", 300, 1024);
    let p = tmp.path();
    let s = sh.segs[0];
    let mut outcomes = Vec::new();
    let mut panics = Vec::new();
    for (what, ovf) in [
        ("past the pool", 1u64 << 40),
        ("in a free chunk", sh.free_off),
        ("misaligned", s + 12),
    ] {
        for crashed in [false, true] {
            let mut bad = patch(&good, &[(s + H_OVERFLOW, ovf)]);
            if crashed {
                clear_clean_flag(&mut bad);
            }
            std::fs::write(p, &bad).unwrap();
            let ctx = format!(
                "overflow pointer {what} ({})",
                if crashed {
                    "crashed pool"
                } else {
                    "clean pool"
                }
            );
            match open_guarded::<HmehSubject>(p, true) {
                Err(e) if e == "PANIC" => panics.push(format!("{ctx}: open panicked")),
                Err(e) => outcomes.push(format!("{ctx}: open refused: {e}")),
                Ok((_pool, hm)) => {
                    let mut step = "check";
                    let r = catch_unwind(AssertUnwindSafe(|| {
                        let c = hm.check();
                        step = "for_each";
                        let mut n = 0;
                        hm.for_each(&mut |_, _| n += 1);
                        step = "get";
                        for k in model.keys() {
                            let _ = hm.get(*k);
                        }
                        step = "update";
                        for (k, v) in model.iter().take(50) {
                            let _ = hm.update(*k, !*v);
                        }
                        step = "insert";
                        let _ = hm.insert(0x1234_5678, 1);
                        c
                    }));
                    match r {
                        Err(_) => {
                            panics.push(format!("{ctx}: open accepted it, then {step} panicked"))
                        }
                        Ok(Ok(_)) => {
                            panics.push(format!("{ctx}: open accepted it and check() passed"))
                        }
                        Ok(Err(e)) => outcomes.push(format!("{ctx}: opened, check() says {e}")),
                    }
                }
            }
            assert!(std::fs::read(p).unwrap() == bad, "{ctx}: the file changed");
        }
    }
    for o in &outcomes {
        eprintln!("{o}");
    }
    assert!(panics.is_empty(), "{}", panics.join("\n"));
}

/// A backup word naming a live segment (one the RT directory names). In a
/// cleanly closed pool the first open refuses it ("still holds
/// backups"), but a writable open has already cleared the pool's clean
/// flag by then, so the next open runs crash recovery: that recovery, and
/// the recovery of a crashed pool with the same word, must refuse it (or
/// open a sound table), not free the live segment as a backup.
#[test]
fn backup_naming_a_live_segment_is_never_freed() {
    let (tmp, good, model, sh) = built("live-backup", 300, 1024);
    let p = tmp.path();
    let bad = patch(&good, &[(sh.segs[1] + H_BACKUP, sh.segs[0])]);
    let mut crashed = bad.clone();
    clear_clean_flag(&mut crashed);
    let mut problems = Vec::new();
    let mut judge = |what: &str, r: Result<(Arc<Pool>, Hmeh), String>| match r {
        Err(e) => assert!(e != "PANIC", "{what}: open panicked"),
        Ok((pool, hm)) => {
            if let Err(e) = hm.check() {
                problems.push(format!("{what}: open accepted it, then check() says: {e}"));
            }
            let lost = model
                .iter()
                .filter(|(k, v)| hm.get(**k) != Some(**v))
                .count();
            if lost > 0 {
                problems.push(format!("{what}: {lost} keys lost"));
            }
            if pool.block_size(sh.segs[0]).is_err() {
                problems.push(format!("{what}: live segment {:#x} was freed", sh.segs[0]));
            }
        }
    };
    std::fs::write(p, &crashed).unwrap();
    judge("crashed pool", open_guarded::<HmehSubject>(p, false));
    std::fs::write(p, &bad).unwrap();
    match open_guarded::<HmehSubject>(p, false) {
        Err(e) => assert!(e.contains("backups"), "{e}"),
        Ok(_) => panic!("a clean pool with a backup left was accepted"),
    }
    judge(
        "second writable open of the refused clean pool",
        open_guarded::<HmehSubject>(p, false),
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ----- full pool ---------------------------------------------------------------------

/// A pool that cannot grow: insert fails with OutOfSpace at some point,
/// the failed key is absent, and the table keeps answering, checking,
/// updating, removing and (once removes made room) inserting; a crash
/// image of it recovers to the same keys.
#[test]
fn full_pool_is_out_of_space_and_stays_usable() {
    for (mode, d) in [
        (Mode::Volatile, Durability::Strict),
        (Mode::Simulated, Durability::Strict),
        (Mode::Simulated, Durability::Relaxed),
    ] {
        let ctx = format!("{mode:?} {}", d.name());
        let pool =
            Arc::new(Pool::create(Path::new(""), &pool_opts(mode, MIB, MIB, false)).unwrap());
        let hm = Hmeh::create_with(pool.clone(), &cfg(d), &seg_opts(1024)).unwrap();
        let mut model = HashMap::new();
        let mut rng = Rng(5);
        let mut failed = None;
        for i in 0..1_000_000u64 {
            let k = rng.next();
            match hm.insert(k, i) {
                Ok(true) => {
                    model.insert(k, i);
                }
                Ok(false) => panic!("{ctx}: fresh key reported present"),
                Err(Error::OutOfSpace(m)) => {
                    assert!(!m.is_empty());
                    failed = Some(k);
                    break;
                }
                Err(other) => panic!("{ctx}: insert failed with {other}, not OutOfSpace"),
            }
        }
        let failed = failed.unwrap_or_else(|| panic!("{ctx}: a 1 MiB pool never filled up"));
        assert!(model.len() > 5000, "{ctx}: full after {} keys", model.len());
        let verify = |hm: &Hmeh, pool: &Pool, model: &HashMap<u64, u64>, what: &str| {
            assert_eq!(
                hm.get(failed),
                model.get(&failed).copied(),
                "{ctx} {what}: the failed key"
            );
            assert_eq!(hm.len(), model.len() as u64, "{ctx} {what}: len");
            for (k, v) in model {
                assert_eq!(hm.get(*k), Some(*v), "{ctx} {what}: get({k:#x})");
            }
            let r = hm
                .check()
                .unwrap_or_else(|e| panic!("{ctx} {what}: check() failed: {e}"));
            assert_eq!(r.keys, model.len() as u64, "{ctx} {what}");
            assert_eq!(
                r.reachable_bytes,
                pool.stats().bytes_in_use,
                "{ctx} {what}: leak"
            );
        };
        verify(&hm, &pool, &model, "after OutOfSpace");
        assert!(
            matches!(hm.insert(failed, 1), Err(Error::OutOfSpace(_))),
            "{ctx}: second try"
        );
        verify(&hm, &pool, &model, "after a second OutOfSpace");
        // Updates: one that changes one half of the value is one store in
        // place and always works; one that changes both halves writes a
        // new copy and may need a split (OutOfSpace, nothing changed).
        let keys: Vec<u64> = model.keys().copied().collect();
        let mut oos = 0;
        for (i, k) in keys.iter().enumerate().take(2000) {
            let v = model[k];
            let half = v ^ (i as u64 + 1);
            assert!(hm.update(*k, half).unwrap(), "{ctx}: in-place update");
            model.insert(*k, half);
            let both = !half;
            match hm.update(*k, both) {
                Ok(true) => {
                    model.insert(*k, both);
                }
                Err(Error::OutOfSpace(_)) => oos += 1,
                other => panic!("{ctx}: update {other:?}"),
            }
            assert_eq!(hm.get(*k), model.get(k).copied(), "{ctx}: update of {k:#x}");
        }
        eprintln!(
            "{ctx}: {} keys, {oos} of 2000 full-value updates out of space",
            model.len()
        );
        verify(&hm, &pool, &model, "after updates");
        // Removes work; the emptied segments take new keys again. (Merges
        // cannot free blocks here: a merge reserves the merged segment
        // before it frees the two old ones, and the pool has no block left.)
        for k in keys.iter().skip(200) {
            assert!(hm.remove(*k).unwrap(), "{ctx}: remove");
            model.remove(k);
        }
        verify(&hm, &pool, &model, "after removes");
        assert!(
            hm.insert(failed, 7).unwrap(),
            "{ctx}: no room after removes"
        );
        model.insert(failed, 7);
        for i in 0..5000u64 {
            let k = rng.next();
            assert!(hm.insert(k, i).unwrap(), "{ctx}: insert {i} after removes");
            model.insert(k, i);
        }
        verify(&hm, &pool, &model, "after removes and new inserts");
        if mode == Mode::Simulated {
            hm.sync().unwrap();
            let img = pool.crash_image(CrashChoice::Persisted).unwrap();
            let p2 = Arc::new(Pool::from_image(img, Mode::Simulated).unwrap());
            let h2 = Hmeh::open(p2.clone(), &cfg(d)).unwrap();
            verify(&h2, &p2, &model, "recovered");
        }
    }
}

// ----- caller errors -----------------------------------------------------------------

#[test]
fn invalid_options_are_refused_without_a_trace() {
    let bad = [
        (Some(1000u64), 24u32),
        (Some(1536), 24),
        (Some(0), 24),
        (Some(512), 24),
        (Some(64 << 10), 24),
        (Some(1 << 40), 24),
        (Some(u64::MAX), 24),
        (Some(1024), 0),
        (Some(1024), 33),
        (None, 0),
        (None, 64),
    ];
    for (segment_bytes, max_depth) in bad {
        let pool = Arc::new(
            Pool::create(Path::new(""), &pool_opts(Mode::Simulated, MIB, 0, false)).unwrap(),
        );
        let o = Options {
            segment_bytes,
            max_depth,
            ..Options::default()
        };
        let r = catch_unwind(AssertUnwindSafe(|| {
            Hmeh::create_with(pool.clone(), &cfg(Durability::Strict), &o)
        }))
        .unwrap_or_else(|_| panic!("{o:?}: create panicked"));
        match r {
            Err(Error::InvalidArgument(m)) => assert!(!m.is_empty()),
            Err(other) => panic!("{o:?}: {other} (want InvalidArgument)"),
            Ok(_) => panic!("{o:?}: create accepted it"),
        }
        assert_eq!(pool.root(), 0, "{o:?}: a refused create set a root");
        assert_eq!(
            pool.stats().bytes_in_use,
            0,
            "{o:?}: a refused create leaked"
        );
    }
    // The edges that are valid.
    for (segment_bytes, max_depth) in [(Some(1024u64), 1u32), (Some(32 << 10), 32), (None, 24)] {
        let pool = Arc::new(
            Pool::create(
                Path::new(""),
                &pool_opts(Mode::Simulated, MIB, 8 * MIB, false),
            )
            .unwrap(),
        );
        let o = Options {
            segment_bytes,
            max_depth,
            ..Options::default()
        };
        let hm = Hmeh::create_with(pool.clone(), &cfg(Durability::Strict), &o)
            .unwrap_or_else(|e| panic!("{o:?}: {e}"));
        for k in 0..200u64 {
            assert!(hm.insert(k, k + 1).unwrap());
        }
        let r = hm.check().unwrap();
        assert_eq!(r.keys, 200);
        assert_eq!(r.reachable_bytes, pool.stats().bytes_in_use);
    }
}

/// A create the pool cannot hold (a huge initial capacity) is refused,
/// never a panic, and leaves no block allocated and no root.
#[test]
fn refused_create_leaves_nothing_allocated() {
    for initial in [0u64, 1, 1 << 30, 1 << 40, u64::MAX] {
        let pool = Arc::new(
            Pool::create(
                Path::new(""),
                &pool_opts(Mode::Volatile, MIB, 4 * MIB, false),
            )
            .unwrap(),
        );
        let c = EngineConfig {
            initial_capacity: initial,
            ..cfg(Durability::Strict)
        };
        let r = catch_unwind(AssertUnwindSafe(|| Hmeh::create(pool.clone(), &c)))
            .unwrap_or_else(|_| panic!("initial capacity {initial}: create panicked"));
        match r {
            Ok(hm) => {
                assert!(hm.insert(5, 6).unwrap());
                assert_eq!(hm.get(5), Some(6));
                assert_eq!(
                    hm.check().unwrap().reachable_bytes,
                    pool.stats().bytes_in_use
                );
            }
            Err(Error::OutOfSpace(_)) | Err(Error::InvalidArgument(_)) => {
                assert!(initial > 1 << 20, "initial capacity {initial} refused");
                assert_eq!(pool.root(), 0);
                assert_eq!(
                    pool.stats().bytes_in_use,
                    0,
                    "initial capacity {initial}: the refused create left {} blocks allocated",
                    pool.stats().blocks_in_use
                );
            }
            Err(other) => panic!("initial capacity {initial}: {other}"),
        }
    }
}

#[test]
fn second_create_is_refused() {
    let pool =
        Arc::new(Pool::create(Path::new(""), &pool_opts(Mode::Simulated, MIB, 0, false)).unwrap());
    let hm = Hmeh::create_with(pool.clone(), &cfg(Durability::Strict), &seg_opts(1024)).unwrap();
    assert!(hm.insert(1, 2).unwrap());
    let in_use = pool.stats().bytes_in_use;
    let root = pool.root();
    for o in [seg_opts(1024), seg_opts(4096), Options::default()] {
        assert!(matches!(
            Hmeh::create_with(pool.clone(), &cfg(Durability::Strict), &o),
            Err(Error::InvalidArgument(_))
        ));
    }
    assert_eq!(pool.root(), root);
    assert_eq!(pool.stats().bytes_in_use, in_use);
    assert_eq!(hm.get(1), Some(2));
    hm.check().unwrap();
    // Another engine's create on it refuses too.
    let EngineKind::Persistent { create, .. } = engine::slotarray::spec().kind else {
        unreachable!()
    };
    assert!(create(pool.clone(), &cfg(Durability::Strict)).is_err());
}

/// After `close` writes are refused, reads still work, a second close is
/// harmless, and the pool reopens clean with every key.
#[test]
fn writes_after_close_are_refused() {
    for d in [Durability::Strict, Durability::Relaxed] {
        let pool = Arc::new(
            Pool::create(
                Path::new(""),
                &pool_opts(Mode::Simulated, MIB, 8 * MIB, false),
            )
            .unwrap(),
        );
        let hm = Hmeh::create_with(pool.clone(), &cfg(d), &seg_opts(1024)).unwrap();
        let zero = hm.zero_hash_key();
        for k in (0..300u64).chain([zero]) {
            assert!(hm.insert(k, k + 1).unwrap());
        }
        hm.close().unwrap();
        for k in [1000u64, zero] {
            assert!(matches!(
                hm.insert(k + 1, 1),
                Err(Error::InvalidArgument(_))
            ));
            assert!(matches!(hm.update(k, 9), Err(Error::InvalidArgument(_))));
            assert!(matches!(hm.remove(k), Err(Error::InvalidArgument(_))));
            assert!(matches!(hm.upsert(k, 9), Err(Error::InvalidArgument(_))));
        }
        assert!(matches!(hm.update(4, 9), Err(Error::InvalidArgument(_))));
        assert!(matches!(hm.remove(4), Err(Error::InvalidArgument(_))));
        assert_eq!(hm.get(4), Some(5));
        assert_eq!(hm.get(zero), Some(zero + 1));
        assert_eq!(hm.len(), 301);
        hm.close().unwrap();
        let img = pool.crash_image(CrashChoice::Persisted).unwrap();
        let p2 = Arc::new(Pool::from_image(img, Mode::Simulated).unwrap());
        assert!(p2.was_clean());
        let h2 = Hmeh::open(p2.clone(), &cfg(d)).unwrap();
        assert_eq!(h2.len(), 301);
        for k in 0..300u64 {
            assert_eq!(h2.get(k), Some(k + 1));
        }
        assert_eq!(h2.get(zero), Some(zero + 1));
        let r = h2.check().unwrap();
        assert_eq!(r.keys, 301);
        assert_eq!(r.reachable_bytes, p2.stats().bytes_in_use);
    }
}
