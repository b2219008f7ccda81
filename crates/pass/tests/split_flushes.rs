//! A split's persist cost: every line it dirties is flushed once. The new
//! segment is flushed whole; in the old segment, the lines whose slots
//! lost a moved record are flushed once each, however many movers shared
//! them, besides the header and every bucket's line 0 (the meta).

mod common;

use common::*;
use engine::Engine;
use pass::Pass;
use pmem::{persist, Mode};

#[test]
fn a_split_flushes_each_dirty_line_once() {
    let pool = mem_pool(Mode::Simulated, 64 * MIB, 64 * MIB, 11);
    let e = Pass::create(pool, &cfg(4096, 1)).unwrap();
    let seg_lines = e.geometry().seg_bytes() / 64;
    // The new segment (each line once), the old segment (each line at
    // most once), the root's commit word and the insert's own slot line.
    // A split that also builds a segment array or a mapping-table octave
    // writes those too (non-temporal lines), and one whose home chain
    // compacts flushes chain lines: those are over this bound, and the
    // plain ones must be under it. With a flush per moved record no split
    // was (707 flushes at least, for 249-line segments).
    let bound = 2 * seg_lines + 16;
    let mut rng = Rng::new(5);
    let mut per_split = Vec::new();
    let mut i = 0u64;
    while per_split.len() < 40 {
        i += 1;
        assert!(i < 1_000_000, "no splits after {i} inserts");
        let before_splits = detail_u(&e, "splits");
        let before = persist::counters();
        assert!(e.insert(fmix(rng.next() | 1), i).unwrap());
        let after_splits = detail_u(&e, "splits");
        if after_splits == before_splits {
            continue;
        }
        assert_eq!(after_splits, before_splits + 1, "one split per insert here");
        per_split.push(persist::counters().since(&before).flushes);
    }
    let plain = per_split.iter().filter(|&&f| f <= bound).count();
    assert!(
        plain >= per_split.len() / 5,
        "only {plain} of {} splits flushed at most {bound} lines (segment of {seg_lines} lines): {per_split:?}",
        per_split.len()
    );
}
