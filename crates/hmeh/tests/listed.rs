//! `for_each` and `get` agree on what a table holds: one slot word of a
//! cleanly closed pool rewritten so that its item moves to another
//! valid-looking position (valid by the validity rule, but in a later
//! bucket of its window whose home has no spill bit, where no lookup
//! looks) is refused by the clean open, the file untouched, with an error
//! that points at `pmhash check`; the same damage made after an open is
//! not listed by `for_each`, so every key it lists is one `get` finds.
//! The same holds for an item moved into a stash line whose home has no
//! stash bit.

#[allow(unused_imports)]
mod common;

use std::sync::Arc;

use common::{cfg, open_guarded, temp, word, HmehSubject, TempPath, MIB};
use engine::{Durability, Engine, EngineKind};
use pmem::{Mode, Pool, PoolOptions};
use pmhash_hmeh::{HashKind, Hmeh, Options};

/// As the tools open a pool file (`engine::open_file`: every check
/// read-only first, so that a refused open writes nothing).
fn tool_open(path: &std::path::Path, read_only: bool) -> Result<Box<dyn Engine>, String> {
    let EngineKind::Persistent { open, .. } = pmhash_hmeh::spec().kind else {
        unreachable!("hmeh is persistent")
    };
    let o = PoolOptions {
        mode: Mode::Mapped,
        read_only,
        ..PoolOptions::default()
    };
    std::panic::catch_unwind(|| {
        engine::open_file(open, path, &o, &cfg(Durability::Strict, 16, 1))
            .map(|(_, e)| e)
            .map_err(|e| e.to_string())
    })
    .unwrap_or_else(|_| Err("PANIC".into()))
}

/// 1 KiB segments: 16 lines, 2 of stash, 13 normal buckets.
const BUCKETS: u64 = 13;

fn home(h: u64) -> u64 {
    ((h & 0xffff_ffff) * BUCKETS) >> 32
}

/// The key (identity hash) in the upper segment whose home is bucket `b`.
fn key_at_home(b: u64) -> u64 {
    let lo = ((2 * b + 1) << 31) / BUCKETS; // the bucket's middle
    assert_eq!(home(lo), b);
    0x8000_0001 << 32 | lo
}

struct Built {
    _tmp: TempPath,
    path: std::path::PathBuf,
    good: Vec<u8>,
    keys: Vec<u64>,
    /// File offset of word 1 of the slot that holds `keys[2]`, and the
    /// word that moves it one bucket back (to home 1, in home 2's bucket).
    at: u64,
    moved: u64,
    /// The key the moved slot names.
    ghost: u64,
}

/// A cleanly closed identity-hash table of one key per home bucket 1..=6
/// (each in its home bucket: no spill bits).
fn built() -> Built {
    let tmp = temp("listed");
    let popts = engine::testkit::pool_opts::<HmehSubject>(Mode::Mapped, 2 * MIB, 0, 11);
    let keys: Vec<u64> = (1..=6).map(key_at_home).collect();
    {
        let pool = Arc::new(Pool::create(tmp.path(), &popts).unwrap());
        let o = Options {
            segment_bytes: Some(1024),
            hash: HashKind::Identity,
            ..Options::default()
        };
        let e = Hmeh::create_with(pool.clone(), &cfg(Durability::Strict, 16, 1), &o).unwrap();
        for (i, &k) in keys.iter().enumerate() {
            assert!(e.insert(k, i as u64 + 100).unwrap());
        }
        e.close().unwrap();
    }
    let good = std::fs::read(tmp.path()).unwrap();
    // keys[1] has home 2: its slot's words are (hash hi | value hi, hash
    // lo | value lo).
    let k = keys[1];
    let (w0, w1) = (k >> 32 << 32, k << 32 | 101);
    let slots: Vec<u64> = (0..good.len() as u64 - 16)
        .step_by(16)
        .filter(|&o| word(&good, o) == w0 && word(&good, o + 8) == w1)
        .collect();
    assert_eq!(slots.len(), 1, "the slot of the key with home 2, once");
    // The same hash high word (same segment), a low word whose home is
    // bucket 1: valid in bucket 2 (its window), but bucket 1 has no spill
    // bit, so a lookup reads bucket 1 alone.
    let lo = (3u64 << 31) / BUCKETS + 1;
    assert_eq!(home(lo), 1);
    let ghost = k >> 32 << 32 | lo;
    assert!(!keys.contains(&ghost));
    Built {
        path: tmp.path().to_path_buf(),
        _tmp: tmp,
        good,
        keys,
        at: slots[0] + 8,
        moved: lo << 32 | 101,
        ghost,
    }
}

#[test]
fn a_clean_open_refuses_a_slot_moved_out_of_its_searchs_reach() {
    let b = built();
    let mut bad = b.good.clone();
    bad[b.at as usize..b.at as usize + 8].copy_from_slice(&b.moved.to_le_bytes());
    std::fs::write(&b.path, &bad).unwrap();
    for read_only in [true, false] {
        let what = if read_only { "read-only" } else { "writable" };
        let msg = match tool_open(&b.path, read_only) {
            Ok(e) => {
                let mut listed = Vec::new();
                e.for_each(&mut |k, _| listed.push(k));
                panic!(
                    "{what}: the open accepted it: len {}, for_each lists {} keys, \
                     get of the moved key {:#x}: {:?}",
                    e.len(),
                    listed.len(),
                    b.ghost,
                    e.get(b.ghost)
                );
            }
            Err(m) => m,
        };
        assert!(
            msg.contains("pmhash check"),
            "{what}: the refusal points at pmhash check: {msg}"
        );
        assert!(
            std::fs::read(&b.path).unwrap() == bad,
            "{what}: the refused file changed"
        );
    }
    // The intact file opens with every key.
    std::fs::write(&b.path, &b.good).unwrap();
    let e = tool_open(&b.path, false).unwrap();
    assert_eq!(e.len(), b.keys.len() as u64);
    for (i, &k) in b.keys.iter().enumerate() {
        assert_eq!(e.get(k), Some(i as u64 + 100));
    }
}

#[test]
fn for_each_lists_only_keys_that_get_finds() {
    let b = built();
    let (pool, e) = open_guarded::<HmehSubject>(&b.path, false).unwrap();
    // The damage after the open's checks (a stray write to the mapping).
    pool.store_u64(b.at, b.moved);
    assert_eq!(e.get(b.ghost), None, "no lookup reaches the moved slot");
    let mut listed = Vec::new();
    e.for_each(&mut |k, v| listed.push((k, v)));
    for &(k, v) in &listed {
        assert_eq!(
            e.get(k),
            Some(v),
            "for_each lists key {k:#x}, which get does not find"
        );
    }
    assert_eq!(listed.len(), b.keys.len() - 1, "every other key is listed");
    // `check` reports the slot.
    assert!(e.check().is_err(), "check reports the moved slot");
}

/// The same damage into the stash: the key with home 2 moved from its
/// bucket to the segment's first stash line, and its home has no stash
/// bit, so no lookup reads it there. A clean open refuses it, the file
/// untouched; made after an open, `for_each` does not list it.
#[test]
fn a_slot_moved_into_the_stash_without_its_stash_bit_is_not_listed() {
    let b = built();
    // keys[1]'s slot is in its home bucket 2, line 3 of its segment.
    let slot = b.at - 8;
    let seg = (slot & !63) - 3 * 64;
    assert_eq!(
        word(&b.good, seg + 8) >> 48,
        0x4853,
        "the segment's identity word"
    );
    let stash = seg + (1 + BUCKETS) * 64;
    assert!(
        (0..8).all(|i| word(&b.good, stash + 8 * i) == 0),
        "the stash line is empty"
    );
    let (w0, w1) = (word(&b.good, slot), word(&b.good, slot + 8));
    let moves = [(slot, 0), (slot + 8, 0), (stash + 8, w1), (stash, w0)];
    let mut bad = b.good.clone();
    for (off, w) in moves {
        bad[off as usize..off as usize + 8].copy_from_slice(&w.to_le_bytes());
    }
    std::fs::write(&b.path, &bad).unwrap();
    for read_only in [true, false] {
        let msg = match tool_open(&b.path, read_only) {
            Ok(e) => panic!(
                "read-only {read_only}: the open accepted it: len {}",
                e.len()
            ),
            Err(m) => m,
        };
        assert!(msg.contains("pmhash check"), "{msg}");
        assert!(std::fs::read(&b.path).unwrap() == bad, "the file changed");
    }
    std::fs::write(&b.path, &b.good).unwrap();
    let (pool, e) = open_guarded::<HmehSubject>(&b.path, false).unwrap();
    for (off, w) in moves {
        pool.store_u64(off, w);
    }
    assert_eq!(e.get(b.keys[1]), None, "no lookup reads the stash line");
    let mut listed = Vec::new();
    e.for_each(&mut |k, v| listed.push((k, v)));
    assert!(
        listed.iter().all(|&(k, v)| e.get(k) == Some(v)),
        "every listed key is found: {listed:x?}"
    );
    assert_eq!(listed.len(), b.keys.len() - 1, "every other key is listed");
}
