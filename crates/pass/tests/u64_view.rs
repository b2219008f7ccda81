//! The u64 view of a bytes-mode table (`pass-var`): `Engine::len()` counts
//! exactly the keys `Engine::for_each` visits, the stored keys in the
//! 16-byte form of a u64 key (`pmhash_pass::wide_key`), whatever else the table
//! holds: byte keys of other shapes inserted with `insert_bytes`, and
//! after a crash a stored key damaged into another shape that recovery
//! (or the read-only view of the crashed pool) keeps because nothing can
//! tell it was damaged. `Pass::len_bytes` counts every stored key. Each
//! way a count is made is covered: the writes, a clean open's walk, crash
//! recovery, the read-only view of a crashed pool, and `check()`.

mod common;

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use common::*;
use engine::Engine;
use pmem::{Mode, Pool};
use pmhash_pass::{wide_key, Pass};

/// Keys `Engine::for_each` visits (each once: duplicates fail).
fn visited(e: &Pass) -> u64 {
    let mut seen = HashSet::new();
    e.for_each(&mut |k, _| assert!(seen.insert(k), "for_each gave {k:#x} twice"));
    seen.len() as u64
}

/// Keys `for_each_bytes` visits.
fn visited_bytes(e: &Pass) -> u64 {
    let mut n = 0;
    e.for_each_bytes(&mut |_, _| n += 1);
    n
}

/// The table serves `wide` keys through the u64 view and `wide + odd`
/// through the byte view, and every count says so (`check()` too, where
/// `check` is set: it refuses a damaged pool that has not been repaired).
fn assert_view(e: &Pass, wide: u64, odd: u64, check: bool, ctx: &str) {
    assert_eq!(visited(e), wide, "{ctx}: keys for_each visits");
    assert_eq!(e.len(), wide, "{ctx}: len() (for_each visits {wide})");
    assert_eq!(
        visited_bytes(e),
        wide + odd,
        "{ctx}: keys for_each_bytes visits"
    );
    assert_eq!(e.len_bytes(), wide + odd, "{ctx}: len_bytes()");
    assert_eq!(e.stats().len, wide, "{ctx}: stats().len");
    if !check {
        return;
    }
    let r = e
        .check()
        .unwrap_or_else(|err| panic!("{ctx}: check() failed: {err}"));
    assert_eq!(r.keys, wide, "{ctx}: check().keys");
}

/// A byte key that is not the form of any u64 key: lengths 1..=40, and
/// at 16 bytes a wide key with its last byte changed.
fn odd_key(i: u64) -> Vec<u8> {
    let len = 1 + (i % 40) as usize;
    let mut k: Vec<u8> = (0..len)
        .map(|j| (fmix(i * 64 + j as u64) >> 8) as u8)
        .collect();
    if len == 16 {
        k = wide_key(fmix(i)).to_vec();
        k[15] ^= 1;
    }
    k
}

fn reopen_read_only(path: &Path, img: &[u8], ctx: &str) -> (Arc<Pool>, Pass) {
    std::fs::write(path, img).unwrap();
    open_file(path, true).unwrap_or_else(|m| panic!("{ctx}: {m}"))
}

/// Byte keys of other shapes are stored and served by the byte API but
/// are no u64 key: the u64 `len()` leaves them out, through inserts and
/// removes of both kinds, a crash and its recovery, the read-only view of
/// the crashed file, and a clean close and open.
#[test]
fn byte_keys_of_other_shapes_are_not_counted_by_the_u64_len() {
    let tmp = TempPath::new("u64-view");
    let popts = pool_opts(Mode::Mapped, 4 * MIB, 0, 0x71e);
    let pool = Arc::new(Pool::create(tmp.path(), &popts).unwrap());
    let e = Pass::create_with(pool.clone(), &cfg(16, 1), &bytes_opts()).unwrap();
    let (mut wide, mut odd) = (0u64, 0u64);
    for i in 0..300u64 {
        let k = fmix(i ^ 0x5eed);
        if i % 3 == 0 {
            // The byte form of a u64 key is that key.
            assert!(e.insert_bytes(&wide_key(k), i).unwrap());
        } else {
            assert!(e.insert(k, i).unwrap());
        }
        wide += 1;
        assert!(e.insert_bytes(&odd_key(i), i).unwrap());
        odd += 1;
    }
    assert_view(&e, wide, odd, true, "after inserts");
    // Second inserts change nothing; removes of either kind count once.
    assert!(!e.insert_bytes(&odd_key(7), 1).unwrap());
    assert!(!e.insert_bytes(&wide_key(fmix(7 ^ 0x5eed)), 1).unwrap());
    for i in (0..300u64).step_by(5) {
        assert!(e.remove_bytes(&odd_key(i)).unwrap());
        odd -= 1;
        if i % 2 == 0 {
            assert!(e.remove_bytes(&wide_key(fmix(i ^ 0x5eed))).unwrap());
        } else {
            assert!(e.remove(fmix(i ^ 0x5eed)).unwrap());
        }
        wide -= 1;
    }
    assert!(!e.remove_bytes(&odd_key(0)).unwrap());
    assert_view(&e, wide, odd, true, "after removes");

    // A crash now: recovery recounts.
    let live = pool.image();
    let (_p2, e2) = crash_reopen_live(&pool);
    assert_view(&e2, wide, odd, true, "after crash recovery");
    assert!(e2.insert_bytes(&odd_key(1000), 1).unwrap());
    assert!(e2.remove_bytes(&odd_key(1)).unwrap());
    assert_view(&e2, wide, odd, true, "writes after crash recovery");
    drop(e2);

    // The same crash seen read-only: counted as recovery would keep it.
    let crash_file = TempPath::new("u64-view-crash");
    let (_p3, e3) = reopen_read_only(crash_file.path(), &live, "read-only crash view");
    assert!(!_p3.was_clean());
    assert_view(&e3, wide, odd, true, "read-only view of the crashed pool");
    drop(e3);

    // A clean close records every key; a clean open walks and splits them.
    let (_p4, e4) = reopen_file(e, pool, tmp.path(), &popts);
    assert_view(&e4, wide, odd, true, "after a clean close and open");
    assert!(e4.remove_bytes(&odd_key(2)).unwrap());
    assert_view(&e4, wide, odd - 1, true, "a remove after a clean open");
}

/// Where the 24 bytes `[16][wide_key(k)]` (a key block of `k`) lie in `img`.
fn key_block_of(img: &[u8], k: u64) -> Option<usize> {
    let mut pat = 16u64.to_le_bytes().to_vec();
    pat.extend_from_slice(&wide_key(k));
    (0..img.len().saturating_sub(24))
        .step_by(8)
        .find(|&i| img[i..i + 24] == pat[..])
}

/// A pool that looks crashed and holds a key whose second word was
/// damaged, to bytes that still hash into a bucket where it is kept: the
/// read-only view and recovery keep it (nothing tells it from a key
/// inserted with those bytes), and the u64 `len()` does not count it,
/// as `for_each` does not visit it.
#[test]
fn a_damaged_key_kept_after_a_crash_is_not_counted_by_the_u64_len() {
    let tmp = TempPath::new("u64-view-damaged");
    let popts = pool_opts(Mode::Mapped, 2 * MIB, 0, 0xda3);
    let pool = Arc::new(Pool::create(tmp.path(), &popts).unwrap());
    let e = Pass::create_with(pool.clone(), &cfg(16, 1), &bytes_opts()).unwrap();
    let n = 40u64;
    let mut rng = Rng::new(0xd00d);
    let keys: Vec<u64> = (0..n).map(|_| rng.next()).collect();
    for &k in &keys {
        assert!(e.insert(k, k ^ 1).unwrap());
    }
    e.close().unwrap();
    drop(e);
    drop(pool);
    let mut img = std::fs::read(tmp.path()).unwrap();
    clear_clean_flag(&mut img);
    let work = TempPath::new("u64-view-damaged-work");
    let mut kept = 0;
    // Damage one key's second word at a time; in a table of one segment
    // and 4 + 2 buckets about half the new hashes keep the record.
    'keys: for &k in &keys {
        let at = key_block_of(&img, k).expect("every key has its block in the image") + 16;
        for c in 1..=8u64 {
            let bad = patch(&img, &[(at as u64, !k ^ c)]);
            let ctx = format!("key {k:#x}, word at {at:#x} xor {c}");
            let (p, e) = reopen_read_only(work.path(), &bad, &ctx);
            if e.len_bytes() != n {
                continue; // dropped as out of place: not the case here
            }
            assert_view(&e, n - 1, 1, false, &format!("{ctx}: read-only crash view"));
            drop(e);
            drop(p);
            // Recovery keeps it too, and counts it the same way.
            std::fs::write(work.path(), &bad).unwrap();
            let (_p, e) = open_file(work.path(), false).unwrap_or_else(|m| panic!("{ctx}: {m}"));
            assert_view(&e, n - 1, 1, true, &format!("{ctx}: after recovery"));
            e.close().unwrap();
            drop(e);
            drop(_p);
            let (_p, e) = open_file(work.path(), true).unwrap_or_else(|m| panic!("{ctx}: {m}"));
            assert_view(
                &e,
                n - 1,
                1,
                true,
                &format!("{ctx}: clean open after recovery"),
            );
            kept += 1;
            if kept == 3 {
                break 'keys;
            }
            continue 'keys;
        }
    }
    assert_eq!(kept, 3, "no damaged key was kept: the case was not reached");
}
