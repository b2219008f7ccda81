//! White-box tests: the run-of-hits mode of the get path, which skips
//! the filter, checked against exact answers.

use super::*;
use engine::testkit::{mem_pool, strict_config, test_pool_options};
use pmem::Mode;

use engine::hits::{score, RUN_AT};

#[test]
fn a_run_of_hits_skips_the_filter_and_every_answer_stays_exact() {
    let opts = test_pool_options(
        crate::LAYOUT,
        b"rophi-unit-uuid!",
        Mode::Volatile,
        1 << 20,
        64 << 20,
        7,
    );
    let t = Rophi::create(mem_pool(&opts), &strict_config(16, 1)).unwrap();
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
    // filter only for a key that was there.
    let len = t.filter.get().len();
    assert!(!t.remove_key(3 * 5 + 1).unwrap());
    assert_eq!(t.filter.get().len(), len);
    assert!(score() >= RUN_AT, "still in the run: score {}", score());
    assert!(t.remove_key(3 * 7).unwrap());
    assert_eq!(t.filter.get().len(), len - 1);
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
