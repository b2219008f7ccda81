//! White-box tests: the run-of-hits mode of the get path, which skips
//! the filter, checked against exact answers; the deferred removal of a
//! deleted key's fingerprint.

use super::*;
use engine::testkit::{mem_pool, strict_config, test_pool_options};
use pmem::Mode;

use engine::hits::{score, RUN_AT};
use engine::Engine;

#[test]
fn a_run_of_hits_skips_the_filter_and_every_answer_stays_exact() {
    let t = small_table(7);
    // Keys 3k (present) and 3k + 1 (never inserted); the table grows
    // from 16 heads, so chains and doublings are both exercised.
    for k in 1..=3000u64 {
        assert!(t.insert_key(3 * k, k).unwrap());
    }
    engine::hits::reset();
    for k in 1..=100u64 {
        assert_eq!(t.get_key(3 * k), Some(k));
    }
    assert!(score() >= RUN_AT, "a run of hits: score {}", score());
    // Without the filter: absent, removed, updated and re-inserted
    // keys all answer from PM exactly.
    assert_eq!(t.get_key(3 * 5 + 1), None);
    // Removes in the run ask PM first; the fingerprint leaves the
    // filter only for a key that was there (at this thread's next write).
    let len = t.filter.get().len();
    assert!(!t.remove_key(3 * 5 + 1).unwrap());
    assert_eq!(t.filter.get().len(), len);
    assert!(score() >= RUN_AT, "still in the run: score {}", score());
    assert!(t.remove_key(3 * 7).unwrap());
    assert!(!t.remove_key(3 * 7).unwrap());
    assert_eq!(t.filter.get().len(), len - 1);
    assert_eq!(t.get_key(3 * 7), None);
    assert!(t.update_key(3 * 8, 88).unwrap());
    assert_eq!(t.get_key(3 * 8), Some(88));
    assert!(t.insert_key(3 * 7, 77).unwrap());
    assert_eq!(t.get_key(3 * 7), Some(77));
    assert!(score() >= RUN_AT, "still in the run: score {}", score());
    for k in 1..=3000u64 {
        let want = match k {
            7 => Some(77),
            8 => Some(88),
            _ => Some(k),
        };
        assert_eq!(t.get_key(3 * k), want, "key {}", 3 * k);
        assert_eq!(t.get_key(3 * k + 1), None, "key {}", 3 * k + 1);
    }
    // A run of misses hands the gets back to the filter.
    for k in 5000..5010u64 {
        assert_eq!(t.get_key(3 * k + 1), None);
    }
    assert!(score() < RUN_AT, "a run of misses: score {}", score());
    assert_eq!(t.get_key(3 * 9), Some(9));
    assert_eq!(t.get_key(3 * 9 + 1), None);
}

/// A volatile table of 16 heads (it grows), pool seeded by `seed`.
fn small_table(seed: u64) -> Rophi {
    let opts = test_pool_options(
        crate::LAYOUT,
        b"rophi-unit-uuid!",
        Mode::Volatile,
        1 << 20,
        64 << 20,
        seed,
    );
    Rophi::create(mem_pool(&opts), &strict_config(16, 1)).unwrap()
}

#[test]
fn a_deleted_keys_fingerprint_leaves_the_filter_at_the_threads_next_write() {
    let t = small_table(8);
    for k in 1..=200u64 {
        assert!(t.insert_key(k, k).unwrap());
    }
    let n = t.filter.get().len();
    assert_eq!(n, 200);
    assert!(t.remove_key(5).unwrap());
    // Still in the filter, counted stale, and absent all the same.
    assert_eq!(t.filter.get().len(), n);
    assert_eq!(t.stale(&t.filter.get()), 1);
    assert_eq!(t.get_key(5), None);
    assert!(!t.update_key(5, 1).unwrap());
    assert_eq!(t.filter.get().len(), n);
    // The next delete takes it out, even one that finds nothing.
    assert!(!t.remove_key(5).unwrap());
    assert_eq!(t.filter.get().len(), n - 1);
    assert_eq!(t.stale(&t.filter.get()), 0);
    assert!(t.insert_key(1000, 1).unwrap());
    assert_eq!(t.filter.get().len(), n);
    // The next insert takes it out before it puts its own in.
    assert!(t.remove_key(9).unwrap());
    assert!(t.insert_key(1001, 1).unwrap());
    assert_eq!(t.filter.get().len(), n);
    assert!(t.remove_key(1001).unwrap());
    assert!(t.insert_key(9, 9).unwrap());
    assert!(t.remove_key(6).unwrap());
    assert!(t.remove_key(7).unwrap());
    assert_eq!(t.filter.get().len(), n - 1);
    // Re-inserting the key whose removal waits: one copy goes, one comes.
    assert!(t.insert_key(7, 70).unwrap());
    assert_eq!(t.filter.get().len(), n - 1);
    assert_eq!(t.get_key(7), Some(70));
    // Another thread's writes leave this thread's removal alone.
    assert!(t.remove_key(8).unwrap());
    std::thread::scope(|s| {
        s.spawn(|| assert!(t.insert_key(2000, 2).unwrap()));
    });
    assert_eq!(t.filter.get().len(), n);
    assert!(t.insert_key(3000, 3).unwrap());
    assert_eq!(t.filter.get().len(), n);
    assert_eq!(t.filter.get().len() as i64, t.len.get());
    t.check().unwrap();
}

#[test]
fn a_removal_left_waiting_never_takes_a_fingerprint_out_of_a_rebuilt_filter() {
    let t = small_table(9);
    for k in 1..=200u64 {
        assert!(t.insert_key(k, k).unwrap());
    }
    // Key 6's fingerprint is left in the filter; then the filter is
    // rebuilt from PM, without it.
    assert!(t.remove_key(6).unwrap());
    let b = t.filter.get().buckets();
    t.grow_filter(Some(b)).unwrap();
    let (nb, seed) = {
        let f = t.filter.get();
        (f.buckets(), f.seed())
    };
    assert_eq!(nb, 2 * b);
    assert_eq!(t.filter.get().len(), 199);
    assert_eq!(t.stale(&t.filter.get()), 0);
    // A key whose fingerprint sits where key 6's would in the new
    // filter (found with a filter of the same size and seed), put in by
    // another thread, so that this thread's waiting removal is still
    // there when it writes next.
    let scratch = engine::cuckoo::CuckooFilter::with_buckets(nb).seeded(seed);
    let twin = (10_000u64..)
        .find(|&c| {
            scratch.insert(c).unwrap();
            let same = scratch.remove(6);
            if !same {
                assert!(scratch.remove(c));
            }
            same
        })
        .unwrap();
    std::thread::scope(|s| {
        s.spawn(|| assert!(t.insert_key(twin, 42).unwrap()));
    });
    // This thread's next write: the waiting removal belongs to the old
    // filter, and must not take the twin's fingerprint out of the new one.
    assert!(t.insert_key(5000, 5).unwrap());
    assert_eq!(
        t.get_key(twin),
        Some(42),
        "the twin {twin} lost its fingerprint"
    );
    assert_eq!(t.filter.get().len(), 201);
    t.check().unwrap();
}

#[test]
fn a_thread_deleting_from_two_tables_in_turn_leaves_no_fingerprint_behind() {
    let (a, b) = (small_table(11), small_table(12));
    for k in 1..=1000u64 {
        assert!(a.insert_key(k, k).unwrap());
        assert!(b.insert_key(k, k).unwrap());
    }
    let grown = |t: &Rophi| t.t.filter_growths.load(Ordering::Relaxed);
    let (ga, gb) = (grown(&a), grown(&b));
    for k in 10_000..30_000u64 {
        assert!(a.insert_key(k, k).unwrap());
        assert!(b.insert_key(k, k).unwrap());
        assert!(a.remove_key(k).unwrap());
        assert!(b.remove_key(k).unwrap());
    }
    for t in [&a, &b] {
        let f = t.filter.get();
        assert_eq!(t.stale(&f), 1, "one removal waits in each table");
        assert_eq!(f.len() - t.stale(&f), 1000);
        drop(f);
        t.check().unwrap();
    }
    assert_eq!((grown(&a), grown(&b)), (ga, gb), "the filters grew");
}

#[test]
fn a_thread_that_exits_hands_its_waiting_removal_to_the_next_one() {
    let t = small_table(13);
    for k in 1..=1000u64 {
        assert!(t.insert_key(k, k).unwrap());
    }
    let grown = || t.t.filter_growths.load(Ordering::Relaxed);
    let g = grown();
    // Each thread deletes a key and exits before its next write; the next
    // thread, given the same index, takes the fingerprint out.
    for i in 0..3000u64 {
        std::thread::scope(|s| {
            s.spawn(|| {
                assert!(t.insert_key(1_000_000 + i, i).unwrap());
                assert!(t.remove_key(1_000_000 + i).unwrap());
            });
        });
    }
    let stale = t.stale(&t.filter.get());
    assert!(
        (1..=engine::sync::OWNED as u64).contains(&stale),
        "stale fingerprints: {stale}"
    );
    assert_eq!(grown(), g, "the filter grew on left-behind fingerprints");
    for k in 1..=1000 {
        assert_eq!(t.get_key(k), Some(k));
    }
    t.check().unwrap();
}
