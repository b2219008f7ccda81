//! White-box tests: the run-of-hits mode of the get path, which skips
//! the filter, checked against exact answers; deleted keys'
//! fingerprints, left in the filter until a rebuild drops them.

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
    // Removes in the run ask PM first, and leave the filter alone.
    let len = t.filter.get().len();
    assert!(!t.remove_key(3 * 5 + 1).unwrap());
    assert_eq!(t.filter.get().len(), len);
    assert!(score() >= RUN_AT, "still in the run: score {}", score());
    assert!(t.remove_key(3 * 7).unwrap());
    assert!(!t.remove_key(3 * 7).unwrap());
    assert_eq!(t.filter.get().len(), len);
    assert_eq!(t.get_key(3 * 7), None);
    assert!(t.update_key(3 * 8, 88).unwrap());
    assert_eq!(t.get_key(3 * 8), Some(88));
    // Put back, the key finds its own fingerprint still there.
    assert!(t.insert_key(3 * 7, 77).unwrap());
    assert_eq!(t.filter.get().len(), len);
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
fn a_deleted_keys_fingerprint_stays_until_a_rebuild_drops_it() {
    let t = small_table(8);
    for k in 1..=200u64 {
        assert!(t.insert_key(k, k).unwrap());
    }
    // At most 200: a key whose fingerprint the filter already held in its
    // pair (a false positive, one in a few hundred) adds none.
    let n = t.filter.get().len();
    assert!((190..=200).contains(&n), "{n} fingerprints for 200 keys");
    for k in 1..=150u64 {
        assert!(t.remove_key(k).unwrap());
    }
    // Still in the filter, and absent all the same.
    assert_eq!(t.filter.get().len(), n);
    for k in 1..=150u64 {
        assert!(t.filter.get().contains(k));
        assert_eq!(t.get_key(k), None);
        assert!(!t.update_key(k, 1).unwrap());
        assert!(!t.remove_key(k).unwrap());
    }
    // A key put back adds no copy: its own is there.
    assert!(t.insert_key(7, 70).unwrap());
    assert_eq!(t.filter.get().len(), n);
    assert_eq!(t.get_key(7), Some(70));
    t.check().unwrap();
    // A rebuild from PM holds the 51 stored keys alone.
    let id = t.filter.get().id();
    assert!(t.grow_filter(Some(id)).unwrap());
    assert_eq!(t.filter.get().len(), 51);
    for k in 1..=200u64 {
        let want = match k {
            7 => Some(70),
            1..=150 => None,
            _ => Some(k),
        };
        assert_eq!(t.get_key(k), want, "key {k}");
    }
    t.check().unwrap();
}

#[test]
fn keys_coming_and_going_refresh_the_filter_in_place() {
    // A stable set of 1000 keys, and 100k others each inserted and
    // deleted: the deleted keys' fingerprints fill the filter, and the
    // rebuilds that drop them keep its size (the stored keys fill at most
    // half its load limit), each after at least 45% of its slots in
    // inserts.
    let t = small_table(11);
    for k in 1..=1000u64 {
        assert!(t.insert_key(k, k).unwrap());
    }
    let tally = |t: &Rophi| {
        (
            t.t.filter_growths.load(Ordering::Relaxed),
            t.t.filter_refreshes.load(Ordering::Relaxed),
        )
    };
    // Let the stable set's own growths happen first.
    let (g0, r0) = tally(&t);
    let slots = t.filter.get().slots();
    let churn = 100_000u64;
    for k in 1_000_000..1_000_000 + churn {
        assert!(t.insert_key(k, k).unwrap());
        assert!(t.remove_key(k).unwrap());
    }
    let (g, r) = tally(&t);
    let slots_after = t.filter.get().slots();
    assert!(r > r0, "no refresh in {churn} inserts of new keys");
    // Each refresh follows at least (0.9 - 0.45) of the slots in inserts.
    let most = churn / (slots_after as f64 * 0.45) as u64 + 1;
    assert!(
        r - r0 <= most,
        "{} refreshes in {churn} inserts, {slots_after} slots (at most {most})",
        r - r0
    );
    assert!(
        g - g0 <= 1 && slots_after <= 2 * slots,
        "the filter grew on deleted keys: {slots} -> {slots_after} slots, {} growths",
        g - g0
    );
    for k in 1..=1000u64 {
        assert_eq!(t.get_key(k), Some(k));
    }
    t.check().unwrap();
}

#[test]
fn a_small_filter_over_a_large_table_grows_before_it_refreshes() {
    // A table grown to 40k keys and emptied keeps its heads; a filter
    // sized for the few keys left (as an open sizes it) would be rebuilt,
    // with a walk of every head, after a few hundred inserts. It doubles
    // until it has a slot per head instead.
    let t = small_table(12);
    for k in 1..=40_000u64 {
        assert!(t.insert_key(k, k).unwrap());
    }
    for k in 11..=40_000u64 {
        assert!(t.remove_key(k).unwrap());
    }
    let heads = t.table().heads();
    {
        let _closed = t.gate.close();
        let seed = t.filter.get().seed();
        t.filter.replace(t.build_filter(t.table(), 2, seed));
    }
    assert!(t.filter.get().slots() < heads);
    let refreshes = || t.t.filter_refreshes.load(Ordering::Relaxed);
    let growths = || t.t.filter_growths.load(Ordering::Relaxed);
    let (r0, g0) = (refreshes(), growths());
    let churn = 50_000u64;
    for k in 1_000_000..1_000_000 + churn {
        assert!(t.insert_key(k, k).unwrap());
        assert!(t.remove_key(k).unwrap());
    }
    let slots = t.filter.get().slots();
    assert!(slots >= heads, "{slots} slots for {heads} heads");
    // One growth, one walk, to a slot per head (not a walk per doubling).
    assert_eq!(growths() - g0, 1, "growths to {slots} slots");
    assert!(refreshes() > r0, "no refresh in {churn} inserts");
    let most = churn / (0.45 * heads as f64) as u64 + 1;
    assert!(
        refreshes() - r0 <= most,
        "{} refreshes over {heads} heads in {churn} inserts (at most {most})",
        refreshes() - r0
    );
    for k in 1..=10u64 {
        assert_eq!(t.get_key(k), Some(k));
    }
    t.check().unwrap();
}

#[test]
fn keys_sharing_a_fingerprint_and_pair_share_one_copy() {
    let t = small_table(14);
    for k in 1..=1000u64 {
        assert!(t.insert_key(k, k).unwrap());
    }
    // A twin of key 500: another key with the same fingerprint and bucket
    // pair in the filter as it stands (no rebuild comes between).
    let (id, twin) = {
        let f = t.filter.get();
        let p = f.probe(500);
        let pair = |q: &engine::cuckoo::Probe| (q.i1().min(q.i2()), q.i1().max(q.i2()));
        let twin = (1_000_000u64..)
            .find(|&c| {
                let q = f.probe(c);
                q.fp() == p.fp() && pair(&q) == pair(&p)
            })
            .unwrap();
        (f.id(), twin)
    };
    let n = t.filter.get().len();
    assert!(t.insert_key(twin, 7).unwrap());
    assert_eq!(t.filter.get().id(), id, "the filter was rebuilt");
    assert_eq!(t.filter.get().len(), n, "the twin added a copy");
    // Key 500 deleted: its copy, the twin's too, stays.
    assert!(t.remove_key(500).unwrap());
    assert_eq!(t.get_key(twin), Some(7));
    assert_eq!(t.get_key(500), None);
    t.check().unwrap();
    // A rebuild gives the twin its own copy.
    assert!(t.grow_filter(Some(id)).unwrap());
    assert_eq!(t.get_key(twin), Some(7));
    assert_eq!(t.filter.get().len(), 1000);
    t.check().unwrap();
}
