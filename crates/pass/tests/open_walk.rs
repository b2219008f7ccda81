//! The clean open's cross-check walk: a writable open through
//! `engine::open_file` walks the table once (in its read-only check), except
//! in bytes mode, where the writable open needs the walk's count of keys
//! not in the u64 form.

mod common;

use common::{cfg, fmix, pool_opts, PassBytesSubject, PassSubject, Rng, TempPath, MIB};
use engine::testkit::Subject;
use pmem::Mode;
use pmhash_pass::Pass;

/// The segments walked by a read-only open of a cleanly closed pool of
/// `S` with 5000 keys, by the writable open of `open_file` after it,
/// and by a plain writable open.
fn walks<S: Subject<E = Pass>>(tag: &str) -> (u64, u64, u64) {
    let tmp = TempPath::new(tag);
    let mut rng = Rng::new(3);
    let keys: Vec<u64> = (0..5000).map(|_| fmix(rng.next())).collect();
    let w = engine::testkit::clean_open_walks::<S>(
        tmp.path(),
        &pool_opts(Mode::Mapped, 8 * MIB, 64 * MIB, 5),
        &cfg(20_000, 1),
        &keys,
        |e| e.tallies().clean_open_segments_walked,
    );
    (w.read_only, w.prechecked, w.plain)
}

#[test]
fn a_clean_open_through_open_file_walks_the_table_once() {
    let (ro, checked, plain) = walks::<PassSubject>("once");
    assert!(ro > 0, "the read-only open walks");
    assert_eq!(checked, 0, "the prechecked writable open walks again");
    assert_eq!(plain, ro, "a plain writable open walks");
}

#[test]
fn bytes_mode_walks_in_the_writable_open_too() {
    let (ro, checked, plain) = walks::<PassBytesSubject>("bytes");
    assert!(ro > 0);
    assert_eq!(checked, ro, "bytes mode needs the walk's odd-key count");
    assert_eq!(plain, ro);
}
