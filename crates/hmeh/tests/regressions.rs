//! Regression tests for bugs fixed in review (each failed, hung or panicked
//! on the code before the fix):
//!
//! 1. A merge whose items did not fit the merged segment cancelled the
//!    reserved block while still holding its lock: the next allocation of
//!    that block (another merge attempt, or a split) spun forever.
//! 2. A cleanly closed pool whose live segment had a nonzero retired word
//!    made every writer of that segment's keys spin forever.
//! 3. A backup whose overflow pointer was garbage panicked a crashed open
//!    (or had a live segment's items read as the backup's).
//! 4. A backup named by two live segments, or a live segment named as a
//!    backup: open must refuse before it writes anything.
//! 5. RT cycles and shared subtrees: open refuses quickly.
//! 6. RT entries (or identities) of two segments swapped, and identities
//!    whose depth does not fit their node: open refuses.
//!
//! Workloads that could hang run in a spawned thread under a watchdog: a
//! timeout fails the test instead of stalling the run.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use engine::{Durability, Engine, EngineConfig};
use pmem::{CrashChoice, Link, Mode, Pool, PoolOptions};
use pmhash_hmeh::{HashKind, Hmeh, Options};
/// The segment identity magic ("HS", bits 48..64).
mod common;
use common::off::*;
use common::{
    clear_clean_flag, open_guarded, patch, temp, word, HmehSubject, Rng, TempPath, MIB, STATE_SLOTS,
};

const SEG_MAGIC: u64 = 0x4853;

// ----- helpers (copied from bad_input.rs, trimmed) ---------------------------------

fn cfg(d: Durability, initial_capacity: u64) -> EngineConfig {
    EngineConfig {
        durability: d,
        initial_capacity,
        threads: 1,
    }
}

fn opts(segment_bytes: u64, hash: HashKind) -> Options {
    Options {
        segment_bytes: Some(segment_bytes),
        max_depth: pmhash_hmeh::DEFAULT_MAX_DEPTH,
        hash,
        stash_before_split: false,
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

/// Runs `f` on its own thread and waits at most `secs` seconds for it: a
/// hang (a writer spinning on a lock nobody will release) fails the test
/// instead of stalling the run. A panic in `f` is passed on.
fn within<T: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        let r = f();
        let _ = tx.send(());
        r
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
        Err(mpsc::RecvTimeoutError::Disconnected) => match h.join() {
            Ok(r) => r,
            Err(p) => std::panic::resume_unwind(p),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => {
            // The worker is left spinning; the test process ends anyway.
            panic!("{what}: not done after {secs} s (a hang)")
        }
    }
}

/// A segment's identity word.
fn ident(ld: u32, prefix: u32) -> u64 {
    SEG_MAGIC << 48 | (ld as u64) << 32 | prefix as u64
}

/// (LD, prefix) of an identity word (no validation).
fn decode_ident(w: u64) -> (u32, u32) {
    (((w >> 32) & 0xffff) as u32, w as u32)
}

/// Whether a segment of identity (`ld`, `prefix`) owns hash `h`.
fn owns(ld: u32, prefix: u32, h: u64) -> bool {
    let m = if ld == 0 { 0 } else { u32::MAX << (32 - ld) };
    ((h >> 32) as u32 ^ prefix) & m == 0
}

/// One segment's run of entries in an RT node.
#[derive(Clone, Copy, Debug)]
struct Run {
    node: u64,
    depth: u32,
    start: u64,
    len: u64,
    seg: u64,
    ld: u32,
    prefix: u32,
}

/// The RT directory of a table, read from its pool.
#[derive(Clone, Debug)]
struct Tree {
    rt_root: u64,
    /// Every node: (offset, depth, parent node).
    nodes: Vec<(u64, u32, Option<u64>)>,
    runs: Vec<Run>,
}

impl Tree {
    fn segs(&self) -> Vec<u64> {
        self.runs.iter().map(|r| r.seg).collect()
    }
    fn run_of(&self, seg: u64) -> Run {
        *self
            .runs
            .iter()
            .find(|r| r.seg == seg)
            .expect("a live segment")
    }
    /// Whether entry `off` is the tail of a segment's run whose first
    /// entry `words` leaves alone: a crash repair rewrites it.
    fn rescued(&self, off: u64, words: &[(u64, u64)]) -> bool {
        self.runs.iter().any(|r| {
            let head = r.node + r.start * 8;
            off > head && off < head + r.len * 8 && words.iter().all(|w| w.0 != head)
        })
    }
}

fn tree(pool: &Pool) -> Tree {
    let rt_root = pool.load_u64(pool.root() + R_RT_ROOT);
    let mut nodes = Vec::new();
    let mut runs = Vec::new();
    let mut stack = vec![(rt_root, 3u32, None)];
    while let Some((node, depth, parent)) = stack.pop() {
        nodes.push((node, depth, parent));
        let mut i = 0;
        while i < 8 {
            let e = pool.load_u64(node + i * 8);
            if e & 1 == 1 {
                stack.push((e & !1, depth + 3, Some(node)));
                i += 1;
                continue;
            }
            let (ld, prefix) = decode_ident(pool.load_u64(e + H_IDENT));
            let len = 1u64 << (depth - ld);
            runs.push(Run {
                node,
                depth,
                start: i,
                len,
                seg: e,
                ld,
                prefix,
            });
            i += len;
        }
    }
    Tree {
        rt_root,
        nodes,
        runs,
    }
}

/// A cleanly closed file pool (2 MiB, fixed size) holding `n` random keys
/// in segments of `seg_bytes`. Returns the file's bytes, the keys and the
/// tree.
fn built(
    tag: &str,
    n: u64,
    seg_bytes: u64,
    hash: HashKind,
) -> (TempPath, Vec<u8>, HashMap<u64, u64>, Tree) {
    let tmp = temp(tag);
    let pool =
        Arc::new(Pool::create(tmp.path(), &pool_opts(Mode::Mapped, 2 * MIB, 0, false)).unwrap());
    let hm = Hmeh::create_with(
        pool.clone(),
        &cfg(Durability::Strict, 16),
        &opts(seg_bytes, hash),
    )
    .unwrap();
    let mut rng = Rng(n ^ seg_bytes);
    let mut model = HashMap::new();
    while (model.len() as u64) < n {
        let (k, v) = (rng.next(), rng.next());
        assert!(hm.insert(k, v).unwrap());
        model.insert(k, v);
    }
    let t = tree(&pool);
    hm.close().unwrap();
    drop(hm);
    drop(pool);
    let bytes = std::fs::read(tmp.path()).unwrap();
    (tmp, bytes, model, t)
}

/// Writes `bad` to the file and opens it read-only and writable, each
/// within `secs` seconds: each must be an `Err` (never a panic, never a
/// hang). After the read-only open the file is byte-for-byte `bad`; after
/// the writable one, everything but the pool header's state slots is.
/// Returns the writable open's message.
fn refused(path: &Path, bad: &[u8], what: &str, secs: u64) -> String {
    std::fs::write(path, bad).unwrap();
    let mut msg = String::new();
    for read_only in [true, false] {
        let mode = if read_only { "read-only" } else { "writable" };
        let p = path.to_path_buf();
        let t0 = Instant::now();
        let r = within(secs, &format!("{what} ({mode}) open"), move || {
            open_guarded::<HmehSubject>(&p, read_only).map(|(_, hm)| format!("{:?}", hm.check()))
        });
        match r {
            Ok(check) => panic!("{what} ({mode}): open accepted it; check() says {check}"),
            Err(e) => {
                assert!(e != "PANIC", "{what} ({mode}): open panicked");
                msg = e;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(secs),
            "{what} ({mode}): open took {:?}",
            t0.elapsed()
        );
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

// ----- 1. a merge that does not fit ------------------------------------------------

/// 4 KiB segments: 59 buckets + 4 stash buckets = 252 slots. A merge is
/// tried when a segment holds at most 252/8 = 31 items and the buddies
/// together at most 252/4 = 63; but the merged segment places the items
/// of one home bucket only in that bucket's window (4 buckets, 16 slots)
/// and the stash (16 slots): 32 at most. Buddies of local depth 2 holding
/// 20 keys each, every one of home bucket 0 (identity hash: low word
/// small), cannot merge until they hold 32 together.
///
/// Every remove down to that point tries the merge and fails; then
/// splits elsewhere allocate blocks of the same size (the failed merge's
/// block first). Before the fix the failed merge left its block locked and
/// the second attempt (or the first split) spun forever.
#[test]
fn failed_merge_leaves_its_block_usable() {
    let (merges_failed, lock_after, merged, splits) =
        within(20, "failed merges, then splits", move || {
            let pool = Arc::new(
                Pool::create(
                    Path::new(""),
                    &pool_opts(Mode::Volatile, 4 * MIB, 64 * MIB, false),
                )
                .unwrap(),
            );
            // 600 keys at 3/4 load of 252 slots: 4 segments of depth 2,
            // whose full windows go to the stash (not to a split).
            let hm = Hmeh::create_with(
                pool.clone(),
                &cfg(Durability::Strict, 600),
                &Options {
                    stash_before_split: true,
                    ..opts(4096, HashKind::Identity)
                },
            )
            .unwrap();
            assert_eq!(hm.tallies().segments, 4);
            assert_eq!(hm.tallies().global_depth, 2);
            // Identity hash: a key is its hash. Top two bits pick the
            // segment (00 and 01 are buddies), a low word of 7 puts every
            // key in home bucket 0 (7 * 59 >> 32 = 0).
            let key = |top: u64, i: u64| ((top << 30 | i) << 32) | 7;
            let a: Vec<u64> = (1..=20).map(|i| key(0, i)).collect();
            let b: Vec<u64> = (1..=20).map(|i| key(1, i)).collect();
            let mut model = HashMap::new();
            for &k in a.iter().chain(&b) {
                assert!(hm.insert(k, !k).unwrap());
                model.insert(k, !k);
            }
            assert_eq!(hm.tallies().splits, 0, "40 keys fit without a split");
            // The block the next 4 KiB reservation gets: the merge's M.
            let probe = pool.reserve(4096, Link::Nothing).unwrap();
            let m = probe.offset();
            let before = pool.load_u64(m + H_IDENT);
            pool.cancel(probe);
            // 39 items of one home, 32 places: the merge is tried and fails.
            assert!(hm.remove(a[0]).unwrap());
            model.remove(&a[0]);
            let failed = hm.tallies().merges;
            let probe = pool.reserve(4096, Link::Nothing).unwrap();
            // The attempt wrote M's identity. Its lock lives in DRAM (the
            // segment's head): the splits below reuse M, and would spin
            // forever (failing the time limit) had the attempt kept it.
            let lock_after = (probe.offset() == m).then(|| {
                let w = pool.load_u64(m + H_IDENT);
                (w != before, w == ident(1, 0))
            });
            pool.cancel(probe);
            // More removes (each tries again: 38, 37, 36 items), then
            // enough keys under prefix 10 to split that segment many times
            // over (each split allocates a 4 KiB block).
            for k in &a[1..4] {
                assert!(hm.remove(*k).unwrap());
                model.remove(k);
            }
            let mut rng = Rng(1);
            while model.len() < 40 + 2000 {
                let k = (2 << 62) | (rng.next() >> 2);
                if hm.insert(k, k ^ 1).unwrap() {
                    model.insert(k, k ^ 1);
                }
            }
            let splits = hm.tallies().splits;
            // Down to 32 items: the merge fits and happens.
            for k in &a[4..8] {
                assert!(hm.remove(*k).unwrap());
                model.remove(k);
            }
            let merged = hm.tallies().merges;
            for (k, v) in &model {
                assert_eq!(hm.get(*k), Some(*v), "get({k:#x})");
            }
            let r = hm.check().expect("check() after the merges");
            assert_eq!(r.keys, model.len() as u64);
            assert_eq!(r.reachable_bytes, pool.stats().bytes_in_use, "leak");
            (failed, lock_after, merged, splits)
        });
    assert_eq!(
        merges_failed, 0,
        "39 keys of one home bucket cannot merge into 32 places"
    );
    let (touched, mid) =
        lock_after.expect("the failed merge's block was not the next one allocated");
    assert!(
        touched && mid,
        "the failed merge never reserved and initialized the block: no attempt was made"
    );
    assert!(splits >= 4, "only {splits} splits reused blocks");
    assert_eq!(merged, 1, "at 32 items the buddies merge");
}

// ----- 2. a retired word in a cleanly closed pool ----------------------------------

/// The retired word has DRAM meaning only; a cleanly closed file whose
/// live segments carry one (0 expected) must not make their writers wait
/// forever. Every write to those segments' keys completes, including ones
/// that split them; the table checks clean and reopens with every key.
#[test]
fn retired_word_in_a_clean_pool_does_not_block_writers() {
    let (tmp, good, mut model, t) = built("retired", 400, 1024, HashKind::Identity);
    // The two segments holding the most keys.
    let held = |r: &Run| model.keys().filter(|&&k| owns(r.ld, r.prefix, k)).count();
    let mut runs = t.runs.clone();
    runs.sort_by_key(|r| std::cmp::Reverse(held(r)));
    let (s1, s2) = (runs[0], runs[1]);
    assert!(held(&s1) > 10 && held(&s2) > 10);
    let bad = patch(&good, &[(s1.seg + H_RETIRED, 1), (s2.seg + H_RETIRED, !0)]);
    std::fs::write(tmp.path(), &bad).unwrap();
    // Read-only: opens, reads, checks, and leaves the file alone.
    {
        let (_p, hm) = open_guarded::<HmehSubject>(tmp.path(), true).expect("read-only open");
        for (k, v) in &model {
            assert_eq!(hm.get(*k), Some(*v));
        }
        assert_eq!(hm.check().unwrap().keys, model.len() as u64);
    }
    assert!(std::fs::read(tmp.path()).unwrap() == bad);
    // Writable: every writer of the flagged segments' keys gets through.
    let path = tmp.path().to_path_buf();
    let m0 = model.clone();
    model = within(20, "writes to segments with a retired word", move || {
        let mut model = m0;
        let (pool, hm) = open_guarded::<HmehSubject>(&path, false).expect("writable open");
        let mut rng = Rng(2);
        for r in [s1, s2] {
            let mut mine: Vec<u64> = model
                .keys()
                .copied()
                .filter(|&k| owns(r.ld, r.prefix, k))
                .collect();
            mine.sort_unstable();
            for (i, k) in mine.iter().enumerate() {
                let v = rng.next();
                match i % 3 {
                    0 => {
                        assert!(hm.update(*k, v).unwrap(), "update {k:#x}");
                        model.insert(*k, v);
                    }
                    1 => {
                        assert!(hm.remove(*k).unwrap(), "remove {k:#x}");
                        model.remove(k);
                    }
                    _ => assert!(!hm.insert(*k, v).unwrap(), "insert of present {k:#x}"),
                }
            }
            // New keys of this segment, enough to split it.
            let span = 1u64 << (64 - r.ld);
            let base = (r.prefix as u64) << 32;
            let mut added = 0;
            while added < 80 {
                let k = base | (rng.next() % span);
                if k != 0 && !model.contains_key(&k) {
                    assert!(hm.insert(k, k).unwrap(), "insert {k:#x}");
                    model.insert(k, k);
                    added += 1;
                }
            }
        }
        assert!(hm.tallies().splits > 0, "the flagged segments never split");
        for (k, v) in &model {
            assert_eq!(hm.get(*k), Some(*v), "get({k:#x})");
        }
        let r = hm.check().expect("check() after the writes");
        assert_eq!(r.keys, model.len() as u64);
        assert_eq!(r.reachable_bytes, pool.stats().bytes_in_use);
        hm.close().unwrap();
        model
    });
    // The next clean open again takes writes and has every key.
    let path = tmp.path().to_path_buf();
    within(20, "reopen after the writes", move || {
        let (_pool, hm) = open_guarded::<HmehSubject>(&path, false).expect("reopen");
        for (k, v) in &model {
            assert_eq!(hm.get(*k), Some(*v));
        }
        for k in model.keys().take(50) {
            assert!(hm.update(*k, 5).unwrap());
        }
        assert_eq!(hm.check().unwrap().keys, model.len() as u64);
    });
}

// ----- 3, 4. backups in a crash image ----------------------------------------------

/// A relaxed table just after its first node-creating split, which kept
/// the old segment as the backup of the new node's first segment.
struct Backup {
    /// Persisted crash image: the new segments' items are lost, the
    /// backup holds them.
    img: Vec<u8>,
    rt_root: u64,
    /// The live segment naming the backup (the lower half) and its buddy.
    seg_a: u64,
    seg_b: u64,
    backup: u64,
    /// Another live segment, outside the new node.
    other: u64,
}

fn with_backup() -> Backup {
    let pool = Arc::new(
        Pool::create(
            Path::new(""),
            &pool_opts(Mode::Simulated, MIB, 8 * MIB, false),
        )
        .unwrap(),
    );
    let hm = Hmeh::create_with(
        pool.clone(),
        &cfg(Durability::Relaxed, 16),
        &opts(1024, HashKind::Mixed),
    )
    .unwrap();
    let mut rng = Rng(3);
    for _ in 0..20_000 {
        assert!(hm.insert(rng.next(), rng.next()).unwrap());
        if hm.tallies().backups_made > 0 {
            break;
        }
    }
    assert_eq!(hm.tallies().backups_made, 1, "no backup was made");
    let t = tree(&pool);
    let named: Vec<u64> = t
        .segs()
        .into_iter()
        .filter(|&s| pool.load_u64(s + H_BACKUP) != 0)
        .collect();
    assert_eq!(named.len(), 1, "one segment names the backup");
    let seg_a = named[0];
    let backup = pool.load_u64(seg_a + H_BACKUP);
    let ra = t.run_of(seg_a);
    let seg_b = t
        .runs
        .iter()
        .find(|r| r.node == ra.node && r.ld == ra.ld && r.prefix == ra.prefix | 1 << (32 - ra.ld))
        .expect("the buddy in the new node")
        .seg;
    let other = t
        .runs
        .iter()
        .find(|r| r.node != ra.node)
        .expect("a segment outside the new node")
        .seg;
    let (bld, bprefix) = decode_ident(pool.load_u64(backup + H_IDENT));
    assert_eq!(
        (bld + 1, bprefix),
        (ra.ld, ra.prefix),
        "the backup is S_a's parent"
    );
    assert_eq!(pool.load_u64(backup + H_OVERFLOW), 0);
    let img = pool.crash_image(CrashChoice::Persisted).unwrap();
    Backup {
        img,
        rt_root: t.rt_root,
        seg_a,
        seg_b,
        backup,
        other,
    }
}

/// Recovers `img` (panics caught): the engine open's result, and whether
/// it left the pool byte-for-byte as the pool layer handed it over.
fn open_image(img: Vec<u8>) -> Result<(Result<Hmeh, String>, bool), String> {
    catch_unwind(AssertUnwindSafe(|| {
        let pool = Arc::new(Pool::from_image(img, Mode::Simulated).expect("pool recovery"));
        let before = pool.image();
        let r = Hmeh::open(pool.clone(), &cfg(Durability::Relaxed, 16)).map_err(|e| e.to_string());
        let untouched = r.is_err() && pool.image() == before;
        (r, untouched)
    }))
    .map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    })
}

/// The backup as built recovers: its items are merged back, the backup
/// dropped, and the table checks clean. (Guards the constructions below.)
#[test]
fn backup_image_recovers_untouched() {
    let b = with_backup();
    let pool = Arc::new(Pool::from_image(b.img.clone(), Mode::Simulated).unwrap());
    let hm = Hmeh::open(pool.clone(), &cfg(Durability::Relaxed, 16)).unwrap();
    assert!(hm.tallies().backups_merged > 0);
    let r = hm.check().unwrap();
    assert_eq!(r.reachable_bytes, pool.stats().bytes_in_use, "leak");
    assert_eq!(pool.load_u64(b.seg_a + H_BACKUP), 0);
}

/// A backup's overflow word (header word 40) is garbage: past the pool,
/// misaligned, inside a block, a live segment, the backup itself, an RT
/// node. A crashed open must refuse (backups never chain overflow blocks),
/// never panic, and write nothing. Before the fix, recovery followed the
/// pointer while merging the backup: a panic out of bounds, or a live
/// segment's slots read as the backup's items.
#[test]
fn garbage_backup_overflow_pointer_is_refused() {
    let b = with_backup();
    let len = b.img.len() as u64;
    let cases = [
        ("past the pool", 1u64 << 40),
        ("at the pool's end", len),
        ("the last line of the pool", len - 64),
        ("huge", !63u64),
        ("misaligned", b.backup + 12),
        ("inside the backup", b.backup + 64),
        ("the backup itself", b.backup),
        ("a live segment of the same node", b.seg_b),
        ("a live segment elsewhere", b.other),
        ("the RT root", b.rt_root),
    ];
    let mut bad = Vec::new();
    for (what, w) in cases {
        let img = patch(&b.img, &[(b.backup + H_OVERFLOW, w)]);
        match open_image(img) {
            Err(p) => bad.push(format!("{what} ({w:#x}): open panicked: {p}")),
            Ok((Ok(hm), _)) => bad.push(format!(
                "{what} ({w:#x}): open accepted it; check() says {:?}",
                hm.check().map(|r| r.keys)
            )),
            Ok((Err(e), untouched)) => {
                if !untouched {
                    bad.push(format!("{what} ({w:#x}): refused ({e}) after writing"));
                }
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// A backup named by two live segments (both halves of the split), a live
/// segment named as a backup (by a live segment, or down a backup chain):
/// a crashed open refuses before it writes anything. Before the fix the
/// shared backup was merged twice and freed by the first segment's drop,
/// then the second drop failed: an `Err` after recovery had written.
#[test]
fn shared_or_live_backups_are_refused_before_any_write() {
    let b = with_backup();
    let cases = [
        (
            "a backup named by both halves",
            vec![(b.seg_b + H_BACKUP, b.backup)],
        ),
        (
            "a backup named by a segment of another node too",
            vec![(b.other + H_BACKUP, b.backup)],
        ),
        (
            "the buddy named as a backup",
            vec![(b.seg_a + H_BACKUP, b.seg_b)],
        ),
        (
            "a segment named as its buddy's backup",
            vec![(b.seg_b + H_BACKUP, b.seg_a)],
        ),
        (
            "a live segment down the backup chain",
            vec![(b.backup + H_BACKUP, b.seg_b)],
        ),
        (
            "a backup whose backup is itself",
            vec![(b.backup + H_BACKUP, b.backup)],
        ),
    ];
    let mut bad = Vec::new();
    for (what, words) in cases {
        let img = patch(&b.img, &words);
        match open_image(img) {
            Err(p) => bad.push(format!("{what}: open panicked: {p}")),
            Ok((Ok(hm), _)) => bad.push(format!(
                "{what}: open accepted it; check() says {:?}",
                hm.check().map(|r| r.keys)
            )),
            Ok((Err(e), untouched)) => {
                if !untouched {
                    bad.push(format!("{what}: refused ({e}) after writing to the pool"));
                }
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

// ----- 5. RT cycles and shared subtrees --------------------------------------------

/// Loops and shared subtrees in the RT directory of a clean pool, and of
/// the same file marked crashed: open refuses within a few seconds (no
/// hang, no runaway walk), read-only and writable, leaving the file as it
/// was.
#[test]
fn rt_cycles_and_shared_subtrees_are_refused_quickly() {
    // Enough keys for a third RT level.
    let (tmp, good, _, t) = built("cycles", 6000, 1024, HashKind::Mixed);
    let p = tmp.path();
    let rt = t.rt_root;
    let children: Vec<(u64, u32, u64)> = t
        .nodes
        .iter()
        .filter_map(|&(n, d, parent)| parent.map(|pa| (n, d, pa)))
        .collect();
    let depth6: Vec<u64> = children.iter().filter(|c| c.1 == 6).map(|c| c.0).collect();
    let deep = children
        .iter()
        .find(|c| c.1 == 9)
        .copied()
        .expect("a node at depth 9");
    assert!(depth6.len() >= 2);
    let root_children: Vec<u64> = (0..8)
        .filter(|&i| word(&good, rt + i * 8) & 1 == 1)
        .collect();
    assert!(root_children.len() >= 2);
    let (c0, c1) = (depth6[0], depth6[1]);
    let mut cases: Vec<(String, Vec<(u64, u64)>)> = vec![
        ("the root as its own child".into(), vec![(rt, rt | 1)]),
        ("a child naming itself".into(), vec![(c0 + 3 * 8, c0 | 1)]),
        (
            "every entry of a child naming itself".into(),
            (0..8).map(|i| (c0 + i * 8, c0 | 1)).collect(),
        ),
        (
            "a depth-9 node naming its parent".into(),
            vec![(deep.0 + 7 * 8, deep.2 | 1)],
        ),
        (
            "a depth-9 node naming the root".into(),
            vec![(deep.0, rt | 1)],
        ),
        (
            "two root entries naming one child".into(),
            vec![(
                rt + root_children[1] * 8,
                word(&good, rt + root_children[0] * 8),
            )],
        ),
        (
            "every root entry naming one child".into(),
            (0..8).map(|i| (rt + i * 8, c0 | 1)).collect(),
        ),
        (
            "a child's entries all naming another child".into(),
            (0..8).map(|i| (c0 + i * 8, c1 | 1)).collect(),
        ),
    ];
    for i in 0..8 {
        cases.push((
            format!("child entry {i} naming the root"),
            vec![(c0 + i * 8, rt | 1)],
        ));
    }
    // A chain of depth-6 nodes, each naming the next with all 8 entries
    // (8^k paths through k nodes) and the last one naming the first.
    let chain: Vec<(u64, u64)> = depth6
        .iter()
        .enumerate()
        .flat_map(|(j, &n)| {
            let next = depth6[(j + 1) % depth6.len()];
            (0..8).map(move |i| (n + i * 8, next | 1))
        })
        .collect();
    cases.push((
        "every depth-6 node naming the next, in a ring".into(),
        chain,
    ));
    let mut crashed_cases = 0;
    for (what, words) in cases {
        let bad = patch(&good, &words);
        refused(p, &bad, &what, 5);
        // After a crash the repair points a run's tail entries back at the
        // run's segment (what a crash mid-split leaves): a patched tail is
        // repaired, not refused. The crashed variant only where no patched
        // entry is such a tail.
        if words.iter().all(|&(off, _)| !t.rescued(off, &words)) {
            let mut crashed = bad;
            clear_clean_flag(&mut crashed);
            refused(p, &crashed, &format!("{what} (crashed pool)"), 5);
            crashed_cases += 1;
        }
    }
    assert!(crashed_cases >= 8, "only {crashed_cases} crashed variants");
}

// ----- 6. segments in the wrong place ----------------------------------------------

/// Two segments of equal local depth whose RT runs are swapped (or whose
/// identity words are): every run is well formed, the identities cover the
/// hash space, but each prefix disagrees with the position that holds it.
/// Before the fix a clean open accepted it (the FS directory is built from
/// the identities) while the RT directory, which splits and merges follow,
/// pointed elsewhere. Also identities whose depth does not fit their node
/// (deeper than the node, shallower than its parent). Refused read-only
/// and writable, clean and crashed, with the file left as it was.
#[test]
fn segments_out_of_place_are_refused() {
    let (tmp, good, model, t) = built("swap", 1500, 1024, HashKind::Mixed);
    let p = tmp.path();
    // The untouched file opens with every key.
    {
        let (_p, hm) = open_guarded::<HmehSubject>(p, true).unwrap();
        assert_eq!(hm.check().unwrap().keys, model.len() as u64);
    }
    let mut cases: Vec<(String, Vec<(u64, u64)>)> = Vec::new();
    // Pairs of equal-LD segments: in one node, and in two nodes.
    let same_node = t
        .runs
        .iter()
        .enumerate()
        .find_map(|(i, a)| {
            t.runs[i + 1..]
                .iter()
                .find(|b| b.node == a.node && b.ld == a.ld)
                .map(|b| (*a, *b))
        })
        .expect("two segments of one depth in one node");
    let two_nodes = t
        .runs
        .iter()
        .enumerate()
        .find_map(|(i, a)| {
            t.runs[i + 1..]
                .iter()
                .find(|b| b.node != a.node && b.depth == a.depth && b.ld == a.ld)
                .map(|b| (*a, *b))
        })
        .expect("two segments of one depth in two nodes");
    for (tag, (a, b)) in [("one node", same_node), ("two nodes", two_nodes)] {
        assert_eq!(a.len, b.len);
        let mut swap = Vec::new();
        for j in 0..a.len {
            swap.push((a.node + (a.start + j) * 8, b.seg));
            swap.push((b.node + (b.start + j) * 8, a.seg));
        }
        cases.push((format!("RT runs of two segments swapped ({tag})"), swap));
        cases.push((
            format!("identities of two segments swapped ({tag})"),
            vec![
                (a.seg + H_IDENT, word(&good, b.seg + H_IDENT)),
                (b.seg + H_IDENT, word(&good, a.seg + H_IDENT)),
            ],
        ));
    }
    // Local depths that do not fit the node.
    let child = t
        .runs
        .iter()
        .find(|r| r.depth == 6)
        .copied()
        .expect("a segment in a depth-6 node");
    let root_seg = t.runs.iter().find(|r| r.depth == 3).copied();
    cases.push((
        "local depth 7 in a depth-6 node".into(),
        vec![(child.seg + H_IDENT, ident(7, child.prefix))],
    ));
    cases.push((
        "local depth 2 in a depth-6 node".into(),
        vec![(child.seg + H_IDENT, ident(2, child.prefix & 0xc000_0000))],
    ));
    if let Some(r) = root_seg {
        cases.push((
            "local depth 4 in the root node".into(),
            vec![(r.seg + H_IDENT, ident(4, r.prefix))],
        ));
    }
    // A deeper, position-consistent identity on a run too long for it: the
    // run's second half names a segment whose prefix is not its own.
    if let Some(r) = t.runs.iter().find(|r| r.len >= 2) {
        cases.push((
            "local depth one deeper than its run".into(),
            vec![(r.seg + H_IDENT, ident(r.ld + 1, r.prefix))],
        ));
    }
    for (what, words) in cases {
        let bad = patch(&good, &words);
        refused(p, &bad, &what, 10);
        let mut crashed = bad;
        clear_clean_flag(&mut crashed);
        refused(p, &crashed, &format!("{what} (crashed pool)"), 10);
    }
    // Still the original file: it opens.
    std::fs::write(p, &good).unwrap();
    assert!(open_guarded::<HmehSubject>(p, false).is_ok());
}

// ----- still present: found while writing the tests above --------------------------

/// Sets the clean flag of the pool header's current state slot (and fixes
/// its CRC), as a clean close would have left it.
fn set_clean_flag(bytes: &mut [u8]) {
    engine::testkit::image::edit_state(bytes, |s| s.clean = 1);
}

/// A "cleanly closed" image that still holds a backup is refused ("still
/// holds backups"); with a retired word set on a live segment as well the
/// refusal must still come before any write (the clean path must not
/// clear the retired words before it refuses).
#[test]
fn clean_pool_with_a_backup_is_refused_before_any_write() {
    let b = with_backup();
    for retired in [false, true] {
        let mut img = b.img.clone();
        if retired {
            img = patch(&img, &[(b.seg_a + H_RETIRED, 1)]);
        }
        set_clean_flag(&mut img);
        match open_image(img) {
            Err(p) => panic!("retired word {retired}: open panicked: {p}"),
            Ok((Ok(_), _)) => panic!("retired word {retired}: a clean pool with a backup opened"),
            Ok((Err(e), untouched)) => {
                assert!(e.contains("backups"), "{e}");
                assert!(
                    untouched,
                    "retired word {retired}: refused ({e}) after writing to the pool"
                );
            }
        }
    }
}

/// Backups may not be shared (fixed); overflow blocks neither. A block in
/// two segments' overflow chains is accepted by open and `check()`; the
/// second segment's writers then take the first one's items in that block
/// for free slots (they are not valid for them) and overwrite them, so
/// open must refuse it (`validate_chains` keeps the set of overflow blocks
/// seen across segments). A loop in one chain is refused within a few
/// seconds.
#[test]
fn overflow_block_in_two_chains_is_refused() {
    let tmp = temp("shared-ovf");
    let pool =
        Arc::new(Pool::create(tmp.path(), &pool_opts(Mode::Mapped, 2 * MIB, 0, false)).unwrap());
    // Depth cap 2: four 1 KiB segments, each with an overflow chain.
    let o = Options {
        segment_bytes: Some(1024),
        max_depth: 2,
        hash: HashKind::Identity,
        stash_before_split: false,
    };
    let hm = Hmeh::create_with(pool.clone(), &cfg(Durability::Strict, 16), &o).unwrap();
    let mut rng = Rng(9);
    let mut n = 0;
    while n < 600 {
        if hm.insert(rng.next(), rng.next()).unwrap() {
            n += 1;
        }
    }
    let t = tree(&pool);
    hm.close().unwrap();
    drop(hm);
    drop(pool);
    let good = std::fs::read(tmp.path()).unwrap();
    let chain = |s: u64| {
        let mut v = Vec::new();
        let mut b = word(&good, s + H_OVERFLOW);
        while b != 0 {
            v.push(b);
            b = word(&good, b + H_OVERFLOW);
        }
        v
    };
    let (x, y) = (t.runs[0].seg, t.runs[1].seg);
    let (cx, cy) = (chain(x), chain(y));
    assert!(cx.len() >= 2 && !cy.is_empty(), "chains {cx:x?} {cy:x?}");
    let p = tmp.path();
    refused(
        p,
        &patch(&good, &[(*cx.last().unwrap() + H_OVERFLOW, cx[0])]),
        "an overflow chain looping back to its first block",
        5,
    );
    refused(
        p,
        &patch(&good, &[(*cy.last().unwrap() + H_OVERFLOW, cx[0])]),
        "a chain continuing into another segment's chain",
        5,
    );
    refused(
        p,
        &patch(&good, &[(y + H_OVERFLOW, cx[1])]),
        "two segments naming one overflow block",
        5,
    );
}

/// A lock word of a live segment tagged with the epoch of the next open
/// (bits 40..64 = the pool's open count) and odd reads as held by a
/// writer of this session: every reader and writer of the segment's keys
/// waits forever (the hang bug 2 fixed for the retired word). Only a
/// corrupt file (or 2^24 opens of wrap-around) has one. A hang fails the
/// test: the watchdog ends it after 5 s.
#[test]
fn lock_word_tagged_with_the_next_epoch_does_not_block() {
    let (tmp, good, model, t) = built("epoch", 300, 1024, HashKind::Identity);
    let opens = pmem::header::State::current(&good[..4096]).unwrap().0.opens;
    let s = t.runs[0];
    let mine: Vec<u64> = model
        .keys()
        .copied()
        .filter(|&k| owns(s.ld, s.prefix, k))
        .collect();
    assert!(!mine.is_empty());
    let bad = patch(&good, &[(s.seg, ((opens + 1) & 0xff_ffff) << 40 | 1)]);
    std::fs::write(tmp.path(), &bad).unwrap();
    let path = tmp.path().to_path_buf();
    within(
        5,
        "readers and writers of a segment whose lock word carries the next epoch",
        move || match open_guarded::<HmehSubject>(&path, false) {
            Err(e) => assert!(e != "PANIC", "open panicked"),
            Ok((_p, hm)) => {
                for k in &mine {
                    assert_eq!(hm.get(*k), model.get(k).copied());
                    assert!(hm.update(*k, 1).unwrap());
                }
                hm.check().unwrap();
            }
        },
    );
}
