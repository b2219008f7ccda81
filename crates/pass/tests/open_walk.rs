//! The clean open's cross-check walk: a writable open through
//! `engine::open_file` walks the table once (in its read-only check), except
//! in bytes mode, where the writable open needs the walk's count of keys
//! not in the u64 form.

mod common;

use std::sync::Arc;

use common::{cfg, detail_u, fmix, pool_opts, Rng, TempPath, MIB};
use engine::{EngineKind, EngineSpec};
use pmem::{Mode, Pool, PoolOptions};

/// Builds a cleanly closed pool of `spec` with 5000 keys, then returns
/// the segments walked by a read-only open, a writable open through
/// `open_file` (checking it serves the keys), and a plain writable open.
fn walks(spec: EngineSpec, tag: &str) -> (u64, u64, u64) {
    let EngineKind::Persistent { create, open, .. } = spec.kind else {
        unreachable!("pass is persistent")
    };
    let tmp = TempPath::new(tag);
    let popts = pool_opts(Mode::Mapped, 8 * MIB, 64 * MIB, 5);
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
    let ro = PoolOptions {
        read_only: true,
        ..popts.clone()
    };
    let e = open(Arc::new(Pool::open(tmp.path(), &ro).unwrap()), &c).unwrap();
    let read_only = detail_u(e.as_ref(), "clean-open segments walked");
    drop(e);
    let (pool, e) = engine::open_file(open, tmp.path(), &popts, &c).unwrap();
    assert!(pool.prechecked());
    let checked = detail_u(e.as_ref(), "clean-open segments walked");
    assert_eq!(e.len(), keys.len() as u64);
    for (i, &k) in keys.iter().enumerate().step_by(7) {
        assert_eq!(e.get(k), Some(i as u64));
    }
    e.close().unwrap();
    drop((pool, e));
    let e = open(Arc::new(Pool::open(tmp.path(), &popts).unwrap()), &c).unwrap();
    let plain = detail_u(e.as_ref(), "clean-open segments walked");
    e.close().unwrap();
    (read_only, checked, plain)
}

#[test]
fn a_clean_open_through_open_file_walks_the_table_once() {
    let (ro, checked, plain) = walks(pass::spec(), "once");
    assert!(ro > 0, "the read-only open walks");
    assert_eq!(checked, 0, "the prechecked writable open walks again");
    assert_eq!(plain, ro, "a plain writable open walks");
}

#[test]
fn bytes_mode_walks_in_the_writable_open_too() {
    let (ro, checked, plain) = walks(pass::spec_var(), "bytes");
    assert!(ro > 0);
    assert_eq!(checked, ro, "bytes mode needs the walk's odd-key count");
    assert_eq!(plain, ro);
}
