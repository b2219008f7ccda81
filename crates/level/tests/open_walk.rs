//! The clean open's scan of the table: a writable open through
//! `engine::open_file` reads the buckets once (in its read-only check, not
//! again in the writable open).

mod common;

use common::{fmix, opts, strict_config, temp_path, LevelSubject, Rng, MIB};
use pmem::Mode;

#[test]
fn a_clean_open_through_open_file_reads_the_table_once() {
    let tmp = temp_path("open-once");
    let mut rng = Rng::new(3);
    let keys: Vec<u64> = (0..5000).map(|_| fmix(rng.next())).collect();
    // A read-only open scans every bucket; `open_file` runs that open
    // read-only first, then the writable one, which is told so and scans
    // no bucket again; a plain writable open scans.
    let w = engine::testkit::clean_open_walks::<LevelSubject>(
        tmp.path(),
        &opts(Mode::Mapped, 4 * MIB, 64 * MIB),
        &strict_config(20_000, 1),
        &keys,
        |e| e.tallies().clean_open_buckets_read,
    );
    assert!(w.read_only > 0);
    assert_eq!(w.prechecked, 0);
    assert_eq!(w.plain, w.read_only);
}
