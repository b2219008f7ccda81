//! The clean open's walk of the table: a writable open through
//! `engine::open_file` reads the table once (in its read-only check, not
//! again in the writable open), and `Engine::for_each_part` splits exactly
//! what `for_each` visits.

mod common;

use std::collections::HashMap;

use common::{cfg, identity_capped, temp, HmehSubject, Rng, Table, MIB};
use engine::{Durability, Engine};
use pmem::Mode;

#[test]
fn a_clean_open_through_open_file_reads_the_table_once() {
    let tmp = temp("open-once");
    let popts = engine::testkit::pool_opts::<HmehSubject>(Mode::Mapped, 4 * MIB, 64 * MIB, 0);
    let c = cfg(Durability::Strict, 20_000, 1);
    let keys: Vec<u64> = (0..5000).map(common::fmix).collect();
    // A read-only open walks every slot of the table; `open_file` runs
    // that open read-only first, then the writable one, which is told so
    // and reads no slot again; a plain writable open walks.
    let w = engine::testkit::clean_open_walks::<HmehSubject>(tmp.path(), &popts, &c, &keys, |e| {
        e.tallies().clean_open_slots_read
    });
    assert!(w.read_only >= 5000, "the read-only open read {w:?}");
    assert_eq!(w.prechecked, 0);
    assert_eq!(w.plain, w.read_only);
}

/// Every pair `for_each` visits, with its multiplicity.
fn pairs(visit: impl FnOnce(&mut dyn FnMut(u64, u64))) -> HashMap<(u64, u64), u32> {
    let mut m = HashMap::new();
    visit(&mut |k, v| *m.entry((k, v)).or_insert(0) += 1);
    m
}

#[test]
fn for_each_parts_visit_what_for_each_visits() {
    // Identity hash with a depth cap: keys that share their top bits pile
    // into a segment that chains overflow blocks; key 0 is the zero-hash
    // key kept in the root.
    let c = cfg(Durability::Strict, 16, 1);
    let t = Table::create(Mode::Volatile, 64 * MIB, &c, &identity_capped(2), 11);
    let e = t.e();
    let mut keys: Vec<u64> = (0..3000u64).map(|i| i << 20).collect();
    let mut rng = Rng::new(5);
    keys.extend((0..2000).map(|_| rng.next() | 1 << 40));
    for (i, &k) in keys.iter().enumerate() {
        e.insert(k, i as u64).unwrap();
    }
    assert!(e.tallies().overflow_blocks > 0, "no overflow chain made");
    let whole = pairs(|f| e.for_each(f));
    assert_eq!(whole.values().sum::<u32>() as u64, e.len());
    assert!(whole.contains_key(&(0, 0)), "the zero-hash key");
    for parts in [1, 2, 3, 8, 1000] {
        let split = pairs(|f| {
            for p in 0..parts {
                e.for_each_part(p, parts, f);
            }
        });
        assert_eq!(split, whole, "{parts} parts");
    }
}
