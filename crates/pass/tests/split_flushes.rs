//! A split's persist cost: every line it dirties is flushed once. The new
//! segment is flushed whole; in the old segment, the lines whose slots
//! lost a moved record are flushed once each, however many movers shared
//! them, besides the header and every bucket's line 0 (the meta).

mod common;

use common::*;
use engine::Engine;
use pmem::{persist, Mode};
use pmhash_pass::Pass;

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
        let before_splits = e.tallies().splits;
        let before = persist::counters();
        assert!(e.insert(fmix(rng.next() | 1), i).unwrap());
        let after_splits = e.tallies().splits;
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

/// A split that starts a new segment array in never-used pool space does
/// not zero the array: that space reads zero already, and the split zeroes
/// and flushes its new segment anyway. Zeroing an array of 8 segments
/// wrote 8 × 249 lines non-temporally, each counted as a flush.
#[test]
fn a_new_array_in_fresh_space_is_not_zeroed_again() {
    let pool = mem_pool(Mode::Simulated, 96 * MIB, 96 * MIB, 12);
    let e = Pass::create(pool, &cfg(4096, 1)).unwrap();
    let seg_lines = e.geometry().seg_bytes() / 64;
    let mut rng = Rng::new(6);
    let mut arrays = Vec::new();
    let mut i = 0u64;
    while e.first_segment() < 130 {
        i += 1;
        assert!(i < 1_000_000, "first stuck at {}", e.first_segment());
        let f = e.first_segment();
        let (entry, at) = pmhash_pass::layout::dir_pos(f);
        let starts_array = at == 0 && pmhash_pass::layout::entry_segments(entry) >= 8;
        let before = persist::counters();
        assert!(e.insert(fmix(rng.next() | 1), i).unwrap());
        if starts_array && e.first_segment() == f + 1 {
            arrays.push(persist::counters().since(&before).flushes);
        }
    }
    // Segments 56, 64, .., 128 start arrays of 8 segments each.
    assert!(arrays.len() >= 8, "splits that made an array: {arrays:?}");
    let bound = 4 * seg_lines;
    assert!(
        arrays.iter().all(|&f| f < bound),
        "splits that made an 8-segment array flushed {arrays:?} lines (bound {bound}, segment of {seg_lines} lines)"
    );
    e.check().unwrap();
}
