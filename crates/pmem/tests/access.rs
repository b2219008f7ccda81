//! Bounds-checked word access (`words`, `try_words`, `lines`): what they
//! return in the pool, and that a range outside it, a misaligned offset or
//! a length whose byte count overflows is refused (a panic, or `None` for
//! `try_words`), never a slice past the mapping.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;

use pmhash_pmem::Pool;

mod common;

fn pool() -> Pool {
    Pool::create(
        std::path::Path::new(""),
        &common::simulated(common::MIB, 0, "access"),
    )
    .unwrap()
}

fn panics(f: impl FnOnce()) -> bool {
    catch_unwind(AssertUnwindSafe(f)).is_err()
}

#[test]
fn lines_are_the_words_they_cover() {
    let p = pool();
    let off = 4096;
    for i in 0..24u64 {
        p.atomic_u64(off + 8 * i).store(i + 1, Ordering::Relaxed);
    }
    let lines = p.lines(off, 3);
    assert_eq!(lines.len(), 3);
    for (l, line) in lines.iter().enumerate() {
        for (w, word) in line.iter().enumerate() {
            assert_eq!(word.load(Ordering::Relaxed), (8 * l + w) as u64 + 1);
        }
    }
    let words = p.words(off, 24);
    assert!(std::ptr::eq(&words[8], &lines[1][0]));
    assert!(p.lines(off, 0).is_empty());
}

#[test]
fn the_last_line_of_the_pool_is_reachable_and_the_next_is_not() {
    let p = pool();
    let size = p.size();
    assert_eq!(p.lines(size - 64, 1).len(), 1);
    assert_eq!(p.words(size - 8, 1).len(), 1);
    assert!(p.try_words(size - 8, 1).is_some());
    assert!(panics(|| {
        p.lines(size - 64, 2);
    }));
    assert!(panics(|| {
        p.lines(size, 1);
    }));
    assert!(panics(|| {
        p.words(size - 8, 2);
    }));
    assert!(p.try_words(size - 8, 2).is_none());
    assert!(p.try_words(u64::MAX - 7, 1).is_none());
}

#[test]
fn misaligned_offsets_are_refused() {
    let p = pool();
    assert!(panics(|| {
        p.lines(4100, 1);
    }));
    assert!(panics(|| {
        p.words(4100, 1);
    }));
    assert!(p.try_words(4100, 1).is_none());
}

#[test]
fn counts_whose_byte_length_overflows_are_refused() {
    // n * 64 (lines) or n * 8 (words) wraps to a small length: the
    // accessor must refuse it, not check the wrapped length.
    let p = pool();
    let wraps_lines = usize::MAX / 64 + 2; // * 64 wraps to 64
    let wraps_words = usize::MAX / 8 + 2; // * 8 wraps to 8
    assert!(panics(|| {
        p.lines(0, wraps_lines);
    }));
    assert!(panics(|| {
        p.words(0, wraps_words);
    }));
    assert!(p.try_words(0, wraps_words).is_none());
}
