//! The clean open's scan of the table: a writable open through
//! `engine::open_file` reads the buckets once (in its read-only check, not
//! again in the writable open).

mod common;

use std::sync::Arc;

use common::{cfg, detail_u, fmix, opts, Rng, TempPath, MIB};
use engine::EngineKind;
use pmem::{Mode, Pool, PoolOptions};

#[test]
fn a_clean_open_through_open_file_reads_the_table_once() {
    let EngineKind::Persistent { create, open, .. } = level::spec().kind else {
        unreachable!("level is persistent")
    };
    let tmp = TempPath::new("open-once");
    let popts = opts(Mode::Mapped, 4 * MIB, 64 * MIB);
    let c = cfg(20_000, 1);
    let mut rng = Rng::new(3);
    let keys: Vec<u64> = (0..5000).map(|_| fmix(rng.next())).collect();
    {
        let pool = Arc::new(Pool::create(tmp.path(), &popts).unwrap());
        let e = create(pool, &c).unwrap();
        for (i, &k) in keys.iter().enumerate() {
            assert!(e.insert(k, i as u64).unwrap());
        }
        e.close().unwrap();
    }
    // A read-only open scans every bucket.
    let ro = PoolOptions {
        read_only: true,
        ..popts.clone()
    };
    let pool = Arc::new(Pool::open(tmp.path(), &ro).unwrap());
    let e = open(pool, &c).unwrap();
    let buckets = detail_u(e.as_ref(), "clean-open buckets read");
    assert!(buckets > 0);
    drop(e);
    // `open_file` runs that open read-only first, then the writable one,
    // which is told so and scans no bucket again.
    let (pool, e) = engine::open_file(open, tmp.path(), &popts, &c).unwrap();
    assert!(pool.prechecked());
    assert_eq!(detail_u(e.as_ref(), "clean-open buckets read"), 0);
    assert_eq!(e.len(), keys.len() as u64);
    for (i, &k) in keys.iter().enumerate().step_by(7) {
        assert_eq!(e.get(k), Some(i as u64));
    }
    e.close().unwrap();
    drop((pool, e));
    // A plain writable open (no read-only check before it) scans.
    let pool = Arc::new(Pool::open(tmp.path(), &popts).unwrap());
    let e = open(pool, &c).unwrap();
    assert_eq!(detail_u(e.as_ref(), "clean-open buckets read"), buckets);
    e.close().unwrap();
}
