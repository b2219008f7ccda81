//! This thread's recent lookups: a speed hint for read paths that can be
//! fast for a hit or fast for a miss, but not both at once.
//!
//! A score goes up by 1 for a key found and down by [`MISS_COST`] for one
//! absent, within `0..=`[`MAX`]; a thread is *in a run of hits* while the
//! score is at least [`RUN_AT`]. The score climbs while more than
//! `MISS_COST / (MISS_COST + 1)` (7/8) of the lookups find their key.
//! One score is shared by every table the thread reads. It only chooses
//! between paths that answer exactly the same: never use it for anything
//! that changes a result.
//!
//! Users: rophi skips its DRAM filter in a run of hits (a hit needs the
//! chain in PM anyway); pass requests a bucket's slot lines with its
//! fingerprints only in a run of hits (a miss needs the fingerprints
//! alone).

use std::cell::Cell;

/// Score from which a thread is in a run of hits.
pub const RUN_AT: u32 = 32;
/// Highest score: a run of hits ends after five misses at most.
pub const MAX: u32 = 64;
/// What a miss takes off the score.
pub(crate) const MISS_COST: u32 = 7;

thread_local! {
    static SCORE: Cell<u32> = const { Cell::new(0) };
}

/// Whether this thread's recent lookups nearly all found their key.
#[inline(always)]
pub fn in_run() -> bool {
    score() >= RUN_AT
}

/// Records a lookup's outcome.
#[inline(always)]
pub fn record(found: bool) {
    let s = score();
    let n = if found {
        (s + 1).min(MAX)
    } else {
        s.saturating_sub(MISS_COST)
    };
    // A store to the slot is an out-of-line call (`LocalKey::set`, about
    // 17 instructions, measured with callgrind), a read is one load: in a
    // steady run (all hits at MAX, all misses at 0) nothing changes, and
    // nothing is stored.
    if n != s {
        SCORE.set(n);
    }
}

/// This thread's score (tests and diagnostics).
#[inline(always)]
pub fn score() -> u32 {
    SCORE.get()
}

/// Forgets this thread's lookups (tests).
pub fn reset() {
    SCORE.set(0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_needs_nearly_all_hits_and_a_few_misses_end_it() {
        reset();
        for _ in 0..RUN_AT - 1 {
            record(true);
        }
        assert!(!in_run());
        record(true);
        assert!(in_run());
        for _ in 0..100 {
            record(true);
        }
        assert_eq!(score(), MAX);
        // 7 hits and 1 miss keep the score where it is: 7/8 hits is the
        // edge; fewer hits than that and the run ends.
        for _ in 0..10 {
            for _ in 0..6 {
                record(true);
            }
            record(false);
        }
        assert!(score() < MAX - 5);
        for _ in 0..5 {
            record(false);
        }
        assert!(!in_run());
        reset();
        assert_eq!(score(), 0);
    }
}
