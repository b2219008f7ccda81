//! Bad input: corrupt PASS structures in a pool file are an `Err` (never a
//! panic) and a refused open leaves the file as it was; a full pool is
//! `Err(OutOfSpace)` that leaves the table usable; bad byte keys, invalid
//! options, a second create and writes after `close` are refused without
//! changing anything.
//!
//! Each corrupt file is opened three ways: read-only (the file must stay
//! byte-for-byte the same), writable (only the pool header's state slots,
//! which the pool layer rewrites when it marks the pool open, may change),
//! and writable with the pool image compared right before and right after
//! the refused `Pass::open` (the engine itself wrote nothing). Each is
//! tried with the clean flag set and cleared (crash recovery path).

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use common::*;
use engine::{Engine, Error};
use pmem::{Mode, Pool, PoolOptions};
use pmhash_pass::layout::*;
use pmhash_pass::{Options, Pass};

/// Offsets of a built table, read from the pool.
#[derive(Clone, Debug)]
struct Shape {
    root: u64,
    first: u64,
    geo: Geo,
    /// The mapping table's cells per octave, as `k` (root word `R_K`).
    k: u64,
    /// Octave table slots in use (of six): (slot, block).
    tables: Vec<(u64, u64)>,
    /// Directory entries in use: (entry, block).
    dir: Vec<(usize, u64)>,
    /// Live segments (physical order).
    segs: Vec<u64>,
    /// Non-empty chains of live segments: (head word, chain buckets head
    /// first).
    chains: Vec<(u64, Vec<u64>)>,
    /// Bytes mode: (slot offset, key block) of some records.
    key_slots: Vec<(u64, u64)>,
    pool_size: u64,
}

fn chain_of(pool: &Pool, head: u64) -> Vec<u64> {
    let mut v = Vec::new();
    let mut cb = pool.load_u64(head);
    while cb != 0 {
        v.push(cb);
        cb = chain_next(pool.load_u64(cb + B_META));
    }
    v
}

fn shape(pool: &Pool, e: &Pass) -> Shape {
    let root = pool.root();
    let geo = e.geometry();
    let first = pool.load_u64(root + R_FIRST);
    assert_eq!(first, e.first_segment());
    let k = pool.load_u64(root + R_K);
    let tables = (0..6u64)
        .map(|s| (s, pool.load_u64(root + R_TABLES + 8 * s)))
        .filter(|&(_, b)| b != 0)
        .collect();
    let dir: Vec<(usize, u64)> = (0..DIR_ENTRIES)
        .map(|e| (e, pool.load_u64(root + R_DIR + 8 * e as u64)))
        .filter(|&(_, b)| b != 0)
        .collect();
    let segs: Vec<u64> = (0..first)
        .map(|p| {
            let (e, i) = dir_pos(p);
            let base = pool.load_u64(root + R_DIR + 8 * e as u64);
            assert_ne!(base, 0);
            base + i * geo.seg_bytes()
        })
        .collect();
    let chains = segs
        .iter()
        .flat_map(|&s| (0..geo.groups()).map(move |g| chain_head(s, g)))
        .map(|h| (h, chain_of(pool, h)))
        .filter(|(_, c)| !c.is_empty())
        .collect();
    let mut key_slots = Vec::new();
    if geo.bytes_keys {
        for &seg in &segs {
            for b in 0..geo.n + geo.m {
                let bo = geo.bucket(seg, b);
                let a = alloc(pool.load_u64(bo + B_META));
                if a != 0 {
                    let s = a.trailing_zeros() as usize;
                    key_slots.push((slot_off(bo, s), pool.load_u64(slot_off(bo, s))));
                }
            }
        }
    }
    Shape {
        root,
        first,
        geo,
        k,
        tables,
        dir,
        segs,
        chains,
        key_slots,
        pool_size: pool.size(),
    }
}

/// A cleanly closed 2 MiB file pool with `n` keys in tiny segments.
/// Returns the path, the file's bytes, the model and the shape.
fn built(tag: &str, n: u64, opts: &Options) -> (TempPath, Vec<u8>, HashMap<u64, u64>, Shape) {
    let tmp = TempPath::new(tag);
    let popts = pool_opts(Mode::Mapped, 2 * MIB, 0, 0xbad);
    let pool = Arc::new(Pool::create(tmp.path(), &popts).unwrap());
    let e = Pass::create_with(pool.clone(), &cfg(16, 1), opts).unwrap();
    let mut rng = Rng::new(n);
    let mut model = HashMap::new();
    while (model.len() as u64) < n {
        let (k, v) = (rng.next(), rng.next());
        assert!(e.insert(k, v).unwrap());
        model.insert(k, v);
    }
    let sh = shape(&pool, &e);
    e.close().unwrap();
    drop(e);
    drop(pool);
    let bytes = std::fs::read(tmp.path()).unwrap();
    (tmp, bytes, model, sh)
}

/// The bad-pool harness (`engine::testkit::bad_pool::refused`): `bad`
/// (and `bad` with the clean flag cleared) opened read-only, writable, and
/// writable with the pool image compared around `Pass::open`: each must
/// be an `Err`, never a panic, and leave the bytes as described in the
/// module comment. Returns a message.
fn refused(path: &Path, bad: &[u8], what: &str) -> String {
    engine::testkit::bad_pool::refused::<PassSubject>(path, bad, what)
}

/// The untouched file opens (read-only and writable) with every key
/// (`engine::testkit::bad_pool::accepted`).
fn accepted(path: &Path, good: &[u8], model: &HashMap<u64, u64>, what: &str) {
    engine::testkit::bad_pool::accepted::<PassSubject>(path, good, model, what)
}

/// The octaves the window of `first` spans and their root slots (of
/// six): octave `o` of a table of `2^k` cells lives in slot
/// `3·(k mod 2) + o mod 3` (layout.rs); the window starts at fine position
/// `fine_log2(first)` and is `2^FINE` wide.
fn live_octaves(first: u64, k: u64) -> Vec<(u64, u64)> {
    use pmhash_pass::table::{fine_log2, FINE};
    let cf = fine_log2(first);
    let (lo, hi) = (cf >> FINE, (cf + (1 << FINE) - 1) >> FINE);
    (lo..=hi).map(|o| (o, 3 * (k % 2) + o % 3)).collect()
}

fn chain_opts() -> Options {
    // Over 1: every segment overflows into chains before it splits.
    Options {
        split_load: 1.3,
        ..Options::default()
    }
}

#[test]
fn corrupt_root_block_and_root_pointer_are_refused_untouched() {
    let (tmp, good, model, sh) = built("root", 1500, &chain_opts());
    accepted(tmp.path(), &good, &model, "untouched");
    let root = sh.root;
    // Garbage over the whole root block.
    let mut rng = Rng::new(3);
    let mut bad = good.clone();
    for b in &mut bad[root as usize..(root + ROOT_BYTES) as usize] {
        *b = rng.next() as u8;
    }
    refused(tmp.path(), &bad, "garbage root block");
    // Magic.
    for (i, m) in [ROOT_MAGIC ^ 1, 0, u64::MAX, OCT_MAGIC]
        .into_iter()
        .enumerate()
    {
        refused(
            tmp.path(),
            &patch(&good, &[(root, m)]),
            &format!("magic {i}"),
        );
    }
    // The pool root names something that is not a PASS root: misaligned,
    // a segment, an octave table, near the end of the pool.
    let targets = [
        ("misaligned", root + 8),
        ("a segment", sh.segs[0]),
        ("an octave table", sh.tables[0].1),
        ("the last line", sh.pool_size - 64),
    ];
    for (what, to) in targets {
        let mut bad = good.clone();
        edit_state(&mut bad, |s| s.root = to);
        refused(tmp.path(), &bad, &format!("pool root -> {what}"));
    }
}

#[test]
fn corrupt_geometry_split_load_and_first_are_refused_untouched() {
    let (tmp, good, model, sh) = built("geo", 1500, &chain_opts());
    accepted(tmp.path(), &good, &model, "untouched");
    let root = sh.root;
    let g = word(&good, root + R_GEO);
    assert_eq!(Geo::decode(g), Some(sh.geo));
    let geo_words = [
        ("n = 3", (g & !0xffff) | 3),
        ("n = 1025", (g & !0xffff) | 1025),
        ("n = 0", g & !0xffff),
        ("m = 0", g & !(0xff << 16)),
        ("m = 5", (g & !(0xff << 16)) | 5 << 16),
        ("bits 24..32 set", g | 1 << 24),
        ("key mode 2", (g & 0xffff_ffff) | 2 << 32),
        ("all ones", u64::MAX),
        ("zero", 0),
        // A valid word of the other key mode: the inline keys are no key
        // blocks.
        ("bytes mode", g | 1 << 32),
    ];
    for (what, w) in geo_words {
        refused(
            tmp.path(),
            &patch(&good, &[(root + R_GEO, w)]),
            &format!("geometry {what}"),
        );
    }
    for (what, w) in [
        ("NaN", f64::NAN.to_bits()),
        ("0.1", 0.1f64.to_bits()),
        ("2.0", 2.0f64.to_bits()),
        ("-1", (-1.0f64).to_bits()),
    ] {
        refused(
            tmp.path(),
            &patch(&good, &[(root + R_SPLIT_LOAD, w)]),
            &format!("split load {what}"),
        );
    }
    // The mapping table's size word.
    for (what, w) in [
        ("0", 0),
        ("7", 7),
        ("MAX_K + 1", MAX_K as u64 + 1),
        ("k + 1", sh.k + 1),
        ("k + 2", sh.k + 2),
        ("k - 2", sh.k - 2),
        ("u64::MAX", u64::MAX),
    ] {
        refused(
            tmp.path(),
            &patch(&good, &[(root + R_K, w)]),
            &format!("k = {what}"),
        );
    }
    let max_first = max_first(sh.k as u32);
    for (what, f) in [
        ("0", 0),
        ("max_first + 1", max_first + 1),
        ("2^32", 1 << 32),
        ("u64::MAX", u64::MAX),
        // Beyond the segments whose arrays exist.
        ("past the arrays", {
            let (e, _) = sh.dir.last().copied().unwrap();
            entry_first(e) + entry_segments(e) + 1
        }),
    ] {
        refused(
            tmp.path(),
            &patch(&good, &[(root + R_FIRST, f)]),
            &format!("first = {what}"),
        );
    }
}

#[test]
fn corrupt_octave_table_pointers_and_headers_are_refused_untouched() {
    let (tmp, good, model, sh) = built("octave", 1500, &chain_opts());
    accepted(tmp.path(), &good, &model, "untouched");
    let root = sh.root;
    // Octave slots the current window uses.
    let k = sh.k;
    let live = live_octaves(sh.first, k);
    assert!(!live.is_empty());
    for &(o, slot) in &live {
        let at = root + R_TABLES + 8 * slot;
        let blk = word(&good, at);
        assert_ne!(blk, 0, "slot {slot} of live octave {o} is empty");
        assert_eq!(word(&good, blk + 8), o, "slot {slot} holds another octave");
        assert_eq!(word(&good, blk + 16), k, "slot {slot} holds another k");
        let other = sh.tables.iter().map(|t| t.1).find(|&b| b != blk);
        let mut targets = vec![
            ("zero", 0),
            ("misaligned", blk + 8),
            ("outside the pool", sh.pool_size + 4096),
            ("straddling the end", sh.pool_size - 64),
            ("u64::MAX", u64::MAX),
            ("the root block", root),
            ("a segment", sh.segs[0]),
        ];
        if let Some(o) = other {
            targets.push(("another octave's table", o));
        }
        for (what, to) in targets {
            refused(
                tmp.path(),
                &patch(&good, &[(at, to)]),
                &format!("octave slot {slot} -> {what}"),
            );
        }
        // The table's own header.
        for (what, off, w) in [
            ("magic", 0, 0),
            ("octave number", 8, word(&good, blk + 8) + 3),
            ("k", 16, k + 2),
        ] {
            refused(
                tmp.path(),
                &patch(&good, &[(blk + off, w)]),
                &format!("octave slot {slot} header {what}"),
            );
        }
    }
}

#[test]
fn corrupt_directory_entries_are_refused_untouched() {
    let (tmp, good, model, sh) = built("dir", 1500, &chain_opts());
    accepted(tmp.path(), &good, &model, "untouched");
    let root = sh.root;
    assert!(sh.dir.len() >= 9, "want arrays of both sizes: {:?}", sh.dir);
    let unused = sh.dir.len(); // the first entry with no array
    for &(e, blk) in sh.dir.iter().step_by(3).chain(sh.dir.last()) {
        let at = root + R_DIR + 8 * e as u64;
        let size = entry_segments(e) * sh.geo.seg_bytes();
        for (what, to) in [
            ("zero", 0),
            ("misaligned", blk + 8),
            ("outside the pool", sh.pool_size + (1 << 20)),
            ("straddling the end", sh.pool_size - size + 64),
            ("u64::MAX", u64::MAX),
            ("u64::MAX - 63", u64::MAX - 63),
        ] {
            if what == "zero" && entry_first(e) >= sh.first {
                continue; // an entry past first may be empty
            }
            refused(
                tmp.path(),
                &patch(&good, &[(at, to)]),
                &format!("directory entry {e} -> {what}"),
            );
        }
    }
    // An unused entry pointing outside the pool is refused too (a later
    // split would write there).
    refused(
        tmp.path(),
        &patch(
            &good,
            &[(root + R_DIR + 8 * unused as u64, sh.pool_size + 4096)],
        ),
        &format!("unused directory entry {unused} -> outside"),
    );
}

#[test]
fn corrupt_chain_pointers_are_refused_untouched() {
    let (tmp, good, model, sh) = built("chain", 1500, &chain_opts());
    accepted(tmp.path(), &good, &model, "untouched");
    assert!(
        sh.chains.len() >= 2,
        "the table needs overflow chains: {} segments, chains {:?}",
        sh.first,
        sh.chains
    );
    let (hw, chain) = sh
        .chains
        .iter()
        .max_by_key(|(_, c)| c.len())
        .unwrap()
        .clone();
    let head = chain[0];
    for (what, to) in [
        ("misaligned", head + 8),
        ("outside the pool", sh.pool_size + 4096),
        ("straddling the end", sh.pool_size - 64),
        ("u64::MAX", u64::MAX),
    ] {
        refused(
            tmp.path(),
            &patch(&good, &[(hw, to)]),
            &format!("chain head -> {what}"),
        );
    }
    // A chain bucket's next link (bits 16..64 of its meta word, in lines).
    let last = *chain.last().unwrap();
    let meta = word(&good, last + B_META);
    let link = |to: u64| (meta & ((1 << CHAIN_NEXT_SHIFT) - 1)) | (to >> 6) << CHAIN_NEXT_SHIFT;
    refused(
        tmp.path(),
        &patch(&good, &[(last + B_META, link(last))]),
        "chain bucket linked to itself",
    );
    refused(
        tmp.path(),
        &patch(&good, &[(last + B_META, link(head))]),
        "chain bucket linked back to the head",
    );
    refused(
        tmp.path(),
        &patch(&good, &[(last + B_META, link(sh.pool_size + 4096))]),
        "chain bucket linked outside the pool",
    );
    refused(
        tmp.path(),
        &patch(
            &good,
            &[(last + B_META, meta | ((1u64 << 48) - 1) << CHAIN_NEXT_SHIFT)],
        ),
        "chain bucket linked to the top of the address space",
    );
}

#[test]
fn corrupt_key_pointers_are_refused_untouched() {
    let (tmp, good, model, sh) = built("keys", 800, &pass_bytes_chain());
    assert!(sh.geo.bytes_keys);
    assert!(sh.key_slots.len() >= 4);
    {
        // The untouched bytes table opens; its u64 keys are the wide keys.
        let (_p, e) = open_file(tmp.path(), true).unwrap();
        assert_eq!(e.len(), model.len() as u64);
        for (k, v) in model.iter().take(200) {
            assert_eq!(e.get(*k), Some(*v));
        }
        e.check().unwrap();
    }
    let (slot, kb) = sh.key_slots[1];
    let len = word(&good, kb);
    assert_eq!(len, 16, "a wide key's block");
    // A key word of 0 is a free slot. After a clean close the allocation
    // bit that still names it is a contradiction, refused; after a crash
    // it is a state a delete cut short can leave (the slot line and the
    // meta line persist under one fence, in either order), so recovery
    // takes the slot as free.
    {
        let mut bad = patch(&good, &[(slot, 0)]);
        std::fs::write(tmp.path(), &bad).unwrap();
        assert!(
            open_file(tmp.path(), true).is_err(),
            "key pointer zero after a clean close"
        );
        clear_clean_flag(&mut bad);
        std::fs::write(tmp.path(), &bad).unwrap();
        let (_p, e) = open_file(tmp.path(), false).unwrap();
        assert_eq!(e.len(), model.len() as u64 - 1, "the zeroed slot is free");
        e.check().unwrap();
    }
    for (what, words) in [
        ("pointer misaligned", vec![(slot, kb + 4)]),
        (
            "pointer outside the pool",
            vec![(slot, sh.pool_size + 4096)],
        ),
        ("pointer at the last word", vec![(slot, sh.pool_size - 8)]),
        ("pointer u64::MAX", vec![(slot, u64::MAX - 7)]),
        ("length zero", vec![(kb, 0)]),
        (
            "length over the maximum",
            vec![(kb, pmhash_pass::MAX_KEY_BYTES as u64 + 1)],
        ),
        ("length u64::MAX", vec![(kb, u64::MAX)]),
    ] {
        refused(tmp.path(), &patch(&good, &words), &format!("key {what}"));
    }
    // A chain record's key pointer too.
    if let Some((_, chain)) = sh.chains.first() {
        let cb = chain[0];
        let a = alloc(word(&good, cb + B_META));
        assert_ne!(a, 0);
        let so = slot_off(cb, a.trailing_zeros() as usize);
        refused(
            tmp.path(),
            &patch(&good, &[(so, sh.pool_size + 64)]),
            "chain record key pointer outside the pool",
        );
    }
}

fn pass_bytes_chain() -> Options {
    Options {
        bytes_keys: true,
        ..chain_opts()
    }
}

// ----- plausible corruptions ------------------------------------------------------------

/// For corruptions that leave every word in range (so that range checks
/// cannot see them): open of the file, clean and with the clean flag
/// cleared, must either refuse (an `Err`, the file as it was but for the
/// header state slots) or give a table that still has every key and passes
/// `check()`. Never an open that silently loses keys, and never a crash
/// recovery that rewrites the file around a corrupt root.
fn refused_or_intact(
    path: &Path,
    bad: &[u8],
    model: &HashMap<u64, u64>,
    what: &str,
) -> Vec<String> {
    let mut crashed = bad.to_vec();
    clear_clean_flag(&mut crashed);
    let mut wrong = Vec::new();
    for (variant, img) in [("clean", bad), ("crashed", &crashed[..])] {
        std::fs::write(path, img).unwrap();
        match open_file(path, false) {
            Err(m) => {
                assert!(m != "PANIC", "{what} [{variant}]: open panicked");
                let now = std::fs::read(path).unwrap();
                let diff = (0..now.len())
                    .filter(|&i| now[i] != img[i] && !STATE_SLOTS.contains(&i))
                    .count();
                assert_eq!(
                    diff, 0,
                    "{what} [{variant}]: a refused open changed {diff} bytes"
                );
            }
            Ok((pool, e)) => {
                let found = model
                    .iter()
                    .filter(|(k, v)| e.get(**k) == Some(**v))
                    .count();
                let check = e.check().map(|r| r.keys);
                let removed = e.tallies().stale_removed + e.tallies().duplicates_removed;
                drop(e);
                drop(pool);
                let now = std::fs::read(path).unwrap();
                let changed = (0..now.len())
                    .filter(|&i| now[i] != img[i] && !STATE_SLOTS.contains(&i))
                    .count();
                if found != model.len() || check.is_err() {
                    wrong.push(format!(
                        "{what} [{variant}]: open accepted the file, but only {found} of {} keys read back; check() says {check:?}; recovery removed {removed} records and changed {changed} bytes of the file",
                        model.len()
                    ));
                }
            }
        }
    }
    std::fs::write(path, bad).unwrap();
    wrong
}

fn assert_none_wrong(wrong: Vec<String>) {
    assert!(wrong.is_empty(), "\n  {}", wrong.join("\n  "));
}

/// The hash seed word (root + 16) is derived from the pool uuid at create.
/// A different seed sends every key elsewhere: open must not accept it
/// (after a crash, recovery would drop nearly every record as a "stale
/// copy" and write that back to the file).
#[test]
fn corrupt_hash_seed_is_refused() {
    let (tmp, good, model, sh) = built("seed", 1500, &chain_opts());
    accepted(tmp.path(), &good, &model, "untouched");
    let seed = word(&good, sh.root + R_SEED);
    let mut wrong = Vec::new();
    for (what, w) in [("one bit flipped", seed ^ 1), ("zero", 0)] {
        wrong.extend(refused_or_intact(
            tmp.path(),
            &patch(&good, &[(sh.root + R_SEED, w)]),
            &model,
            &format!("seed {what}"),
        ));
    }
    assert_none_wrong(wrong);
}

/// `first` (the commit word of every split) rolled back by one: the
/// segments' logical ids (segment header + 16) show that the split of
/// `first - 1` committed; open must not accept the older state and drop
/// the keys that split moved.
#[test]
fn first_rolled_back_by_one_is_refused() {
    let (tmp, good, model, sh) = built("first1", 1500, &chain_opts());
    assert_none_wrong(refused_or_intact(
        tmp.path(),
        &patch(&good, &[(sh.root + R_FIRST, sh.first - 1)]),
        &model,
        "first - 1",
    ));
}

/// Directory entries that stay inside the pool but name no segment array:
/// unallocated space, or another entry's array. Open must not follow them
/// (and crash recovery must not "repair" the segments it finds there).
#[test]
fn directory_entry_naming_no_array_is_refused() {
    let (tmp, good, model, sh) = built("dirblk", 1500, &chain_opts());
    assert!(sh.dir.len() >= 3);
    let (e1, _) = sh.dir[1];
    let (_, b0) = sh.dir[0];
    // A line in the heap that no block covers: past everything allocated
    // in the last chunk (the 2 MiB pool is mostly free).
    let free = {
        let pool = Pool::open(
            tmp.path(),
            &PoolOptions {
                mode: Mode::Mapped,
                read_only: true,
                ..PoolOptions::default()
            },
        )
        .unwrap();
        let off = sh.pool_size - 256 * 1024 + 4096;
        assert!(pool.block_size(off).is_err(), "{off:#x} is a block");
        off
    };
    let mut wrong = Vec::new();
    for (what, to) in [("unallocated space", free), ("entry 0's array", b0)] {
        wrong.extend(refused_or_intact(
            tmp.path(),
            &patch(&good, &[(sh.root + R_DIR + 8 * e1 as u64, to)]),
            &model,
            &format!("directory entry {e1} -> {what}"),
        ));
    }
    assert_none_wrong(wrong);
}

/// A wrong item count after a clean close is refused at open (the clean
/// open counts the slots), pointing at `pmhash check`; after a crash,
/// recovery recounts.
#[test]
fn wrong_item_count_is_refused_at_a_clean_open_and_recounted_by_recovery() {
    let (tmp, good, model, sh) = built("len", 600, &chain_opts());
    let bad = patch(&good, &[(sh.root + R_LEN, 5)]);
    std::fs::write(tmp.path(), &bad).unwrap();
    match open_file(tmp.path(), true) {
        Err(e) => assert!(e.contains("pmhash check"), "{e}"),
        Ok(_) => panic!("a clean open accepted a count of 5 for 600 keys"),
    }
    let mut crashed = bad.clone();
    clear_clean_flag(&mut crashed);
    std::fs::write(tmp.path(), &crashed).unwrap();
    let (pool, e) = open_file(tmp.path(), false).unwrap();
    verify(&e, &pool, &model, &[], "recounted");
}

/// The keys `for_each` visits.
fn visited(e: &Pass) -> u64 {
    let mut n = 0;
    e.for_each(&mut |_, _| n += 1);
    n
}

/// Allocation bits that disagree with the key words in a cleanly closed
/// image (a stash bucket's meta word zeroed, as a zeroed range of the
/// file does; or a bit set over an empty slot): the count of key words
/// still matches the recorded count, but `for_each` and searches go by
/// the bits, so keys would go missing (or one be invented). A clean open
/// refuses it, pointing at `pmhash check`, and writes nothing; a read-only
/// view of the same image after a crash counts and visits what recovery
/// keeps, and recovery gives every key back.
#[test]
fn allocation_bits_that_disagree_with_the_slots_are_refused_at_a_clean_open() {
    let (tmp, good, model, sh) = built("allocbits", 600, &chain_opts());
    // A stash bucket that holds records, and a bucket with a free slot.
    let buckets = sh
        .segs
        .iter()
        .flat_map(|&seg| (0..sh.geo.n + sh.geo.m).map(move |b| (b, sh.geo.bucket(seg, b))));
    let stash = buckets
        .clone()
        .find(|&(b, bo)| b >= sh.geo.n && alloc(word(&good, bo + B_META)) != 0)
        .expect("a stash bucket with records")
        .1;
    let free = buckets
        .map(|(_, bo)| bo)
        .chain(sh.chains.iter().flat_map(|(_, c)| c.iter().copied()))
        .find(|&bo| alloc(word(&good, bo + B_META)) != ALLOC_MASK)
        .expect("a bucket with a free slot");
    let free_meta = word(&good, free + B_META);
    let free_slot = first_free(free_meta).unwrap();
    for (what, bad) in [
        (
            "a stash bucket's allocation bits cleared",
            patch(&good, &[(stash + B_META, 0)]),
        ),
        (
            "an allocation bit set over an empty slot",
            patch(&good, &[(free + B_META, free_meta | 1 << free_slot)]),
        ),
    ] {
        for read_only in [true, false] {
            std::fs::write(tmp.path(), &bad).unwrap();
            match open_file(tmp.path(), read_only) {
                Ok((_p, e)) => panic!(
                    "{what} (read-only {read_only}): a clean open accepted it; len {}, for_each visits {}",
                    e.len(),
                    visited(&e)
                ),
                Err(m) => assert!(m.contains("pmhash check"), "{what}: {m}"),
            }
            let now = std::fs::read(tmp.path()).unwrap();
            let changed = (0..now.len())
                .filter(|&i| now[i] != bad[i] && (read_only || !STATE_SLOTS.contains(&i)))
                .count();
            assert_eq!(changed, 0, "{what}: the refused open changed the file");
        }
        let mut crashed = bad.clone();
        clear_clean_flag(&mut crashed);
        std::fs::write(tmp.path(), &crashed).unwrap();
        {
            let (_p, e) = open_file(tmp.path(), true).unwrap();
            assert_eq!(
                e.len(),
                model.len() as u64,
                "{what}: read-only crashed view"
            );
            assert_eq!(visited(&e), e.len(), "{what}: read-only crashed view");
        }
        assert_eq!(std::fs::read(tmp.path()).unwrap(), crashed);
        let (pool, e) = open_file(tmp.path(), false).unwrap();
        verify(&e, &pool, &model, &[], what);
    }
}

/// A key block whose bytes changed after a clean close (bytes mode): the
/// record's hash no longer sends it to its bucket, and the u64 `for_each`
/// skips a key that is no longer a `wide_key`, while the count still
/// names it. A clean open refuses it, pointing at `pmhash check`.
#[test]
fn damaged_key_bytes_are_refused_at_a_clean_open() {
    let (tmp, good, _model, sh) = built("keybytes", 800, &pass_bytes_chain());
    for &(_, kb) in sh.key_slots.iter().take(8) {
        assert_eq!(word(&good, kb), 16);
        for (what, at, w) in [
            ("second half", kb + 16, word(&good, kb + 16) ^ 0xff00),
            ("length 15", kb, 15),
        ] {
            let bad = patch(&good, &[(at, w)]);
            for read_only in [true, false] {
                std::fs::write(tmp.path(), &bad).unwrap();
                match open_file(tmp.path(), read_only) {
                    Ok((_p, e)) => panic!(
                        "key block {kb:#x} {what}: a clean open accepted it; len {}, for_each visits {}",
                        e.len(),
                        visited(&e)
                    ),
                    Err(m) => assert!(m.contains("pmhash check"), "{what}: {m}"),
                }
            }
            let now = std::fs::read(tmp.path()).unwrap();
            let changed = (0..now.len())
                .filter(|&i| now[i] != bad[i] && !STATE_SLOTS.contains(&i))
                .count();
            assert_eq!(changed, 0, "{what}: the refused open changed the file");
        }
    }
}

/// Overflow filters cleared in a cleanly closed image (every home's meta
/// bits and filter word): the hints are trusted after a clean close, so
/// stash and chain records go missing from gets, and `check()` must say
/// so; after a crash, recovery rebuilds the filters and every key reads
/// back.
#[test]
fn cleared_overflow_filters_are_reported_by_check_and_rebuilt_by_recovery() {
    let (tmp, good, model, sh) = built("filters", 600, &chain_opts());
    assert!(!sh.chains.is_empty(), "the table needs overflow chains");
    let mut words = Vec::new();
    for &seg in &sh.segs {
        for bix in 0..sh.geo.n {
            let meta = sh.geo.bucket(seg, bix) + B_META;
            words.push((meta, word(&good, meta) & !OFILTER_MASK));
            words.push((chain_filter(seg, bix), 0));
        }
    }
    let bad = patch(&good, &words);
    std::fs::write(tmp.path(), &bad).unwrap();
    let (_p, e) = open_file(tmp.path(), true).unwrap();
    let missing = model.iter().filter(|(k, _)| e.get(**k).is_none()).count();
    assert!(missing > 0, "no overflow record went missing");
    let err = e.check().expect_err("check() accepted cleared filters");
    assert!(err.to_string().contains("filters"), "{err}");
    drop(e);
    let mut crashed = bad.clone();
    clear_clean_flag(&mut crashed);
    std::fs::write(tmp.path(), &crashed).unwrap();
    let (pool, e) = open_file(tmp.path(), false).unwrap();
    verify(&e, &pool, &model, &[], "filters rebuilt");
}

// ----- a full pool ---------------------------------------------------------------------

/// A 4 MiB pool that cannot grow, filled until insert fails: the failure
/// is `OutOfSpace`, the failed key is absent, every acknowledged key reads
/// back, updates and removes work, `check()` passes with no leak, keys
/// fit again after removes, and a crash reopen recovers it all.
#[test]
fn full_pool_is_out_of_space_and_stays_usable() {
    for bytes in [false, true] {
        let m = if bytes { "bytes" } else { "inline" };
        let pool = mem_pool(Mode::Volatile, 4 * MIB, 4 * MIB, 40 + bytes as u64);
        assert_eq!(pool.max_size(), pool.size());
        let e = Pass::create_with(pool.clone(), &cfg(16, 1), &mode_opts(bytes)).unwrap();
        let mut model = HashMap::new();
        let mut failed = Vec::new();
        let mut i = 0u64;
        while failed.len() < 50 {
            let k = fmix(i ^ 0xf111);
            i += 1;
            assert!(i < 1_000_000, "{m}: a 4 MiB pool never filled up");
            match e.insert(k, i) {
                Ok(true) => {
                    model.insert(k, i);
                }
                Ok(false) => panic!("{m}: fresh key {k:#x} reported present"),
                Err(Error::OutOfSpace(_)) => {
                    assert_eq!(e.get(k), None, "{m}: a refused insert left {k:#x} behind");
                    failed.push(k);
                }
                Err(other) => panic!("{m}: insert failed with {other:?}, not OutOfSpace"),
            }
        }
        eprintln!(
            "{m}: full at {} keys after {i} inserts; segments {}, splits {}, split failures {}, chain buckets {}, load factor {:.3}",
            model.len(),
            e.tallies().segments,
            e.tallies().splits,
            e.tallies().split_failures,
            e.tallies().chain_buckets,
            e.stats().load_factor
        );
        assert!(model.len() > 1000, "{m}: only {} keys fit", model.len());
        verify(&e, &pool, &model, &failed, &format!("{m} full"));
        // Updates allocate nothing.
        for (j, (k, v)) in model.iter_mut().enumerate() {
            if j % 2 == 0 {
                *v ^= 0xabc;
                assert!(e.update(*k, *v).unwrap(), "{m}: update on a full pool");
            }
        }
        verify(&e, &pool, &model, &failed, &format!("{m} full, updated"));
        // Remove a third; the freed room takes new keys again.
        let keys: Vec<u64> = model.keys().copied().collect();
        for k in keys.iter().step_by(3) {
            assert!(e.remove(*k).unwrap(), "{m}: remove on a full pool");
            model.remove(k);
        }
        verify(&e, &pool, &model, &keys, &format!("{m} after removes"));
        let mut again = 0;
        for &k in &failed {
            match e.insert(k, 5) {
                Ok(true) => {
                    model.insert(k, 5);
                    again += 1;
                }
                Ok(false) => panic!("{m}: {k:#x} reported present"),
                Err(Error::OutOfSpace(_)) => {}
                Err(other) => panic!("{m}: {other:?}"),
            }
        }
        assert!(
            again > 0,
            "{m}: no key fit after removing a third of the table"
        );
        verify(&e, &pool, &model, &failed, &format!("{m} refilled"));
        // Crash recovery of a table that ran out of room.
        let (p2, e2) = crash_reopen_live(&pool);
        verify(
            &e2,
            &p2,
            &model,
            &failed,
            &format!("{m} full, after a crash"),
        );
    }
}

// ----- bad arguments --------------------------------------------------------------------

fn assert_invalid<T>(r: engine::Result<T>, what: &str) {
    match r {
        Err(Error::InvalidArgument(_)) => {}
        Err(other) => panic!("{what}: got Err({other:?}), want Err(InvalidArgument)"),
        Ok(_) => panic!("{what}: accepted, want Err(InvalidArgument)"),
    }
}

#[test]
fn empty_and_oversized_byte_keys_are_refused_and_change_nothing() {
    let pool = mem_pool(Mode::Volatile, 4 * MIB, 4 * MIB, 50);
    let e = Pass::create_with(pool.clone(), &cfg(16, 1), &bytes_opts()).unwrap();
    let mut model = HashMap::new();
    for i in 0..300u64 {
        let k = format!("key-{i}").into_bytes();
        assert!(e.insert_bytes(&k, i).unwrap());
        model.insert(k, i);
    }
    let max = vec![b'm'; pmhash_pass::MAX_KEY_BYTES];
    assert!(e.insert_bytes(&max, 1).unwrap(), "a key of MAX_KEY_BYTES");
    model.insert(max.clone(), 1);
    let before = pool.image();
    let len = e.len();
    let mut over = max.clone();
    over.push(b'm');
    for (what, k) in [
        ("empty", Vec::new()),
        ("MAX_KEY_BYTES + 1", over),
        ("64 KiB", vec![0u8; 64 << 10]),
    ] {
        assert_invalid(e.insert_bytes(&k, 9), &format!("insert_bytes {what}"));
        assert_invalid(e.get_bytes(&k), &format!("get_bytes {what}"));
        assert_invalid(e.update_bytes(&k, 9), &format!("update_bytes {what}"));
        assert_invalid(e.remove_bytes(&k), &format!("remove_bytes {what}"));
    }
    assert_eq!(e.len(), len);
    assert!(
        pool.image() == before,
        "a refused byte key changed the pool"
    );
    verify_bytes(&e, &pool, &model, &[b"key-300".to_vec()], "after bad keys");
}

#[test]
fn byte_key_calls_on_an_inline_table_are_refused() {
    let pool = mem_pool(Mode::Volatile, 4 * MIB, 4 * MIB, 51);
    let e = Pass::create(pool.clone(), &cfg(16, 1)).unwrap();
    assert!(!e.bytes_keys());
    let mut model = HashMap::new();
    for k in 0..200u64 {
        assert!(e.insert(k, k + 1).unwrap());
        model.insert(k, k + 1);
    }
    let before = pool.image();
    let k8 = 5u64.to_le_bytes();
    for k in [&b"abc"[..], &k8[..], &pmhash_pass::wide_key(5)[..]] {
        assert_invalid(e.insert_bytes(k, 1), "insert_bytes on inline");
        assert_invalid(e.get_bytes(k), "get_bytes on inline");
        assert_invalid(e.update_bytes(k, 1), "update_bytes on inline");
        assert_invalid(e.remove_bytes(k), "remove_bytes on inline");
    }
    let mut n = 0;
    e.for_each_bytes(&mut |_, _| n += 1);
    assert_eq!(n, 0, "for_each_bytes on an inline table yielded pairs");
    assert!(pool.image() == before);
    verify(&e, &pool, &model, &[1000], "inline after byte calls");
}

#[test]
fn create_on_a_pool_that_holds_a_table_is_refused() {
    let tmp = TempPath::new("twice");
    let popts = pool_opts(Mode::Mapped, 2 * MIB, 0, 52);
    let pool = Arc::new(Pool::create(tmp.path(), &popts).unwrap());
    let e = Pass::create(pool.clone(), &cfg(16, 1)).unwrap();
    let mut model = HashMap::new();
    for k in 0..500u64 {
        assert!(e.insert(fmix(k), k).unwrap());
        model.insert(fmix(k), k);
    }
    let before = pool.image();
    let root = pool.root();
    for opts in [Options::default(), bytes_opts()] {
        assert_invalid(
            Pass::create_with(pool.clone(), &cfg(16, 1), &opts),
            "create on a pool with a table",
        );
    }
    assert_eq!(pool.root(), root);
    assert!(pool.image() == before, "a refused create changed the pool");
    verify(&e, &pool, &model, &[], "after refused creates");
    // Also after a clean reopen from the file.
    let (pool, e) = reopen_file(e, pool, tmp.path(), &popts);
    assert_invalid(
        Pass::create(pool.clone(), &cfg(16, 1)),
        "create after reopen",
    );
    verify(&e, &pool, &model, &[], "reopened");
    e.close().unwrap();
}

#[test]
fn invalid_options_and_impossible_sizes_leave_the_pool_empty() {
    let pool = mem_pool(Mode::Volatile, MIB, MIB, 53);
    let in_use = pool.stats().bytes_in_use;
    let bad = [
        Options {
            split_load: 0.2,
            ..Options::default()
        },
        Options {
            split_load: 1.6,
            ..Options::default()
        },
        Options {
            split_load: f64::NAN,
            ..Options::default()
        },
        Options {
            normal_buckets: Some(3),
            ..Options::default()
        },
        Options {
            normal_buckets: Some(1025),
            ..Options::default()
        },
        Options {
            stash_buckets: Some(0),
            ..Options::default()
        },
        Options {
            stash_buckets: Some(5),
            ..Options::default()
        },
        Options {
            scalar_bits: Some(25),
            ..Options::default()
        },
        Options {
            scalar_bits: Some(u32::MAX),
            ..Options::default()
        },
    ];
    for o in &bad {
        assert_invalid(
            Pass::create_with(pool.clone(), &cfg(16, 1), o),
            &format!("{o:?}"),
        );
        assert_eq!(pool.root(), 0, "{o:?}: a refused create set the root");
        assert_eq!(
            pool.stats().bytes_in_use,
            in_use,
            "{o:?}: a refused create leaked"
        );
    }
    // A table that cannot fit the pool.
    match Pass::create(pool.clone(), &cfg(1 << 30, 1)) {
        Err(Error::OutOfSpace(_)) => {}
        other => panic!("a billion keys in 1 MiB: {:?}", other.map(|_| ())),
    }
    assert_eq!(pool.root(), 0);
    assert_eq!(pool.stats().bytes_in_use, in_use, "a refused create leaked");
    // Open of a pool without a table.
    assert!(Pass::open(pool.clone(), &cfg(16, 1)).is_err());
    // The pool still takes a valid table.
    let e = Pass::create(pool.clone(), &cfg(16, 1)).unwrap();
    assert!(e.insert(1, 2).unwrap());
    verify(&e, &pool, &HashMap::from([(1, 2)]), &[3], "after refusals");
}

/// `Options::scalar_bits` is documented as "`k` (8..=24)": a value below
/// the range is refused like one above it, not silently raised.
#[test]
fn scalar_bits_below_8_are_refused() {
    let pool = mem_pool(Mode::Volatile, MIB, MIB, 55);
    let in_use = pool.stats().bytes_in_use;
    for k in [0u32, 7] {
        let o = Options {
            scalar_bits: Some(k),
            ..Options::default()
        };
        assert_invalid(
            Pass::create_with(pool.clone(), &cfg(16, 1), &o),
            &format!("scalar_bits Some({k})"),
        );
        assert_eq!(pool.root(), 0);
        assert_eq!(pool.stats().bytes_in_use, in_use);
    }
}

#[test]
fn writes_after_close_are_refused() {
    for bytes in [false, true] {
        let pool = mem_pool(Mode::Volatile, 2 * MIB, 2 * MIB, 54);
        let e = Pass::create_with(pool.clone(), &cfg(16, 1), &mode_opts(bytes)).unwrap();
        assert!(e.insert(7, 8).unwrap());
        e.close().unwrap();
        assert!(e.insert(9, 1).is_err(), "insert after close");
        assert!(e.update(7, 1).is_err(), "update after close");
        assert!(e.remove(7).is_err(), "remove after close");
        assert!(e.upsert(7, 1).is_err(), "upsert after close");
        if bytes {
            assert!(e.insert_bytes(b"x", 1).is_err(), "insert_bytes after close");
            assert!(e.update_bytes(&pmhash_pass::wide_key(7), 1).is_err());
            assert!(e.remove_bytes(&pmhash_pass::wide_key(7)).is_err());
        }
        assert!(e.close().is_ok(), "a second close");
    }
}
