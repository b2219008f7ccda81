//! Faults at open for `slotarray` (the shared check in
//! `pmhash_engine::testkit::faults`), and its clean-open cross-check: a clean
//! pool whose valid slots no longer match the count its close recorded is
//! refused, the file untouched, with an error that points at `pmhash
//! check`; a table with no recorded count (made before the count word
//! existed) still opens.

use std::sync::Arc;

use pmem::{Mode, Pool, PoolOptions};
use pmhash_engine::slotarray;
use pmhash_engine::testkit::{faults, strict_config, test_pool_options, TempPath};
use pmhash_engine::{open_file, EngineKind};

#[test]
fn refused_opens_leave_the_file_untouched() {
    faults::refused_opens_leave_the_file_untouched(&slotarray::spec());
}

fn word(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}

/// A cleanly closed slotarray pool of `n` keys: its path, options, bytes
/// and the file offset of its table.
fn closed_pool(n: u64) -> (TempPath, PoolOptions, Vec<u8>, usize) {
    let EngineKind::Persistent { layout, create, .. } = slotarray::spec().kind else {
        unreachable!("slotarray is persistent")
    };
    let tmp = TempPath::new("slotarray-clean", "open");
    let popts = test_pool_options(layout, b"slotarray-clean!", Mode::Mapped, 1 << 20, 0, 5);
    let pool = Arc::new(Pool::create(tmp.path(), &popts).unwrap());
    let e = create(pool.clone(), &strict_config(2 * n, 1)).unwrap();
    for k in 0..n {
        assert!(e.insert(k * 7 + 1, k).unwrap());
    }
    for k in (0..n).step_by(5) {
        assert!(e.remove(k * 7 + 1).unwrap());
    }
    e.close().unwrap();
    let table = pool.root() as usize;
    drop(e);
    drop(pool);
    let bytes = std::fs::read(tmp.path()).unwrap();
    (tmp, popts, bytes, table)
}

fn open(path: &std::path::Path, popts: &PoolOptions) -> pmhash_engine::Result<u64> {
    let EngineKind::Persistent { open, .. } = slotarray::spec().kind else {
        unreachable!("slotarray is persistent")
    };
    for read_only in [true, false] {
        let o = PoolOptions {
            read_only,
            ..popts.clone()
        };
        let (_pool, e) = open_file(open, path, &o, &strict_config(16, 1))?;
        if !read_only {
            let len = e.len();
            e.close()?;
            return Ok(len);
        }
    }
    unreachable!()
}

#[test]
fn a_clean_pool_with_a_damaged_slot_is_refused_untouched() {
    let n = 200;
    let (tmp, popts, good, table) = closed_pool(n);
    let live = n - n.div_ceil(5);
    // One valid slot's meta word turned into a tombstone (1 -> 2), and one
    // tombstone made valid again (2 -> 1): each alone changes the count of
    // valid slots, and the open would serve one key too few or too many.
    let cap = word(&good, table + 8) as usize;
    let metas: Vec<(usize, u64)> = (0..cap)
        .map(|i| table + 64 + 32 * i)
        .map(|o| (o, word(&good, o)))
        .collect();
    for (from, to) in [(1u64, 2u64), (2, 1)] {
        let at = metas.iter().find(|m| m.1 == from).expect("such a slot").0;
        let mut bad = good.clone();
        bad[at..at + 8].copy_from_slice(&to.to_le_bytes());
        std::fs::write(tmp.path(), &bad).unwrap();
        let r = std::panic::catch_unwind(|| open(tmp.path(), &popts))
            .unwrap_or_else(|_| panic!("meta {from} -> {to}: the open panicked"));
        let msg = match r {
            Ok(len) => panic!("meta {from} -> {to}: a damaged clean pool opened with {len} keys"),
            Err(e) => e.to_string(),
        };
        assert!(
            msg.contains("pmhash check") && msg.contains(&format!("records {live} keys")),
            "meta {from} -> {to}: the refusal says what and where to look: {msg}"
        );
        assert!(
            std::fs::read(tmp.path()).unwrap() == bad,
            "meta {from} -> {to}: the refused file changed"
        );
    }
    // The intact pool opens with every key.
    std::fs::write(tmp.path(), &good).unwrap();
    assert_eq!(open(tmp.path(), &popts).unwrap(), live);
}

#[test]
fn a_table_without_a_recorded_count_still_opens() {
    let n = 50;
    let (tmp, popts, good, table) = closed_pool(n);
    // As a table made before the count word: 0 there.
    let mut old = good.clone();
    old[table + 16..table + 24].fill(0);
    std::fs::write(tmp.path(), &old).unwrap();
    let live = n - n.div_ceil(5);
    assert_eq!(open(tmp.path(), &popts).unwrap(), live);
    // The writable open's clean close recorded the count.
    let now = std::fs::read(tmp.path()).unwrap();
    assert_eq!(word(&now, table + 16), live + 1);
}
