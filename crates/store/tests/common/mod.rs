//! Helpers shared by the store's test files.

// Each test file includes this module and uses part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;

use pmem::{Mode, Pool};
use pmhash_store::{CreateOptions, GcMode, OpenOptions, Options, Store};

/// What a store should hold.
pub(crate) type Model = BTreeMap<Vec<u8>, Vec<u8>>;

/// Every pair of the store, from `for_each` (each key once).
pub(crate) fn contents(s: &Store) -> Model {
    let mut m = Model::new();
    s.for_each(|k, v| {
        assert!(m.insert(k.to_vec(), v.to_vec()).is_none(), "key twice");
    })
    .expect("for_each");
    m
}

/// Small files and few clusters, so that files fill and GC has work.
pub(crate) fn small_opts() -> Options {
    Options {
        create: CreateOptions {
            pool_size: 4 << 20,
            clusters: 4,
            extent_size: 4096,
            nodes: Some(1),
            ..Default::default()
        },
        open: OpenOptions {
            max_pool_size: 64 << 20,
            gc: GcMode::Manual,
            raf_bytes: 64 << 10,
            recovery_threads: 2,
            // The DRAM point index starts at its smallest, so tests grow it.
            expected_keys: 0,
            ..Default::default()
        },
    }
}

/// The store holds exactly the model: `for_each` (each key once), `len`,
/// `stats().keys`, `get` of every key, a full scan, and `check()` with the
/// model's key count and every PM byte in use reachable (no leak).
pub(crate) fn verify(s: &Store, m: &Model, ctx: &str) {
    let mut seen: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(m.len());
    s.for_each(|k, v| seen.push((k.to_vec(), v.to_vec())))
        .unwrap_or_else(|e| panic!("{ctx}: for_each: {e}"));
    // for_each visits in no particular order; each key once.
    seen.sort();
    let dups = seen.windows(2).filter(|w| w[0].0 == w[1].0).count();
    assert_eq!(dups, 0, "{ctx}: for_each visited keys twice");
    let want: Vec<(Vec<u8>, Vec<u8>)> = m.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    if seen != want {
        let missing = m
            .keys()
            .filter(|k| !seen.iter().any(|(sk, _)| sk == *k))
            .count();
        let wrong = seen
            .iter()
            .filter(|(k, v)| m.get(k).is_some_and(|mv| mv != v))
            .count();
        panic!(
            "{ctx}: for_each differs from the model: {} pairs vs {}, {missing} missing, {wrong} wrong values",
            seen.len(),
            m.len()
        );
    }
    assert_eq!(s.len(), m.len() as u64, "{ctx}: len()");
    assert_eq!(s.stats().keys, m.len() as u64, "{ctx}: stats().keys");
    let mut buf = Vec::new();
    for (k, v) in m {
        assert_eq!(
            s.get(k).unwrap().as_ref(),
            Some(v),
            "{ctx}: get of a key of {} bytes",
            k.len()
        );
        assert!(
            s.get_into(k, &mut buf).unwrap(),
            "{ctx}: get_into of a present key"
        );
        assert_eq!(&buf, v, "{ctx}: get_into value");
        // get_into_slice: the whole value into a buffer of its size, a prefix
        // into a shorter one, and the whole length either way.
        let mut whole = vec![0u8; v.len()];
        assert_eq!(
            s.get_into_slice(k, &mut whole).unwrap(),
            Some(v.len()),
            "{ctx}: get_into_slice length"
        );
        assert_eq!(&whole, v, "{ctx}: get_into_slice value");
        let mut three = [0u8; 3];
        let n = v.len().min(3);
        assert_eq!(
            s.get_into_slice(k, &mut three).unwrap(),
            Some(v.len()),
            "{ctx}: get_into_slice of a prefix"
        );
        assert_eq!(&three[..n], &v[..n], "{ctx}: get_into_slice prefix");
    }
    for absent in [&b"\xffabsent!"[..], b"\xff-absent-key-\xff"] {
        if !m.contains_key(absent) {
            assert_eq!(
                s.get_into_slice(absent, &mut [0u8; 8]).unwrap(),
                None,
                "{ctx}: get_into_slice of an absent key"
            );
        }
    }
    assert_eq!(
        s.scan(b"", None, usize::MAX).unwrap(),
        want,
        "{ctx}: full scan"
    );
    let live: u64 = m
        .iter()
        .map(|(k, v)| (40 + k.len() as u64 + v.len() as u64).next_multiple_of(64))
        .sum();
    let st = s.stats();
    assert_eq!(
        st.live_bytes, live,
        "{ctx}: stats().live_bytes vs the model's entry bytes"
    );
    assert!(st.log_bytes >= live, "{ctx}: {st:?}");
    check_without_leak(s, m.len() as u64, ctx);
}

/// `check()` passes, counts `keys` keys, and reaches every PM byte the
/// pool has in use (no leak).
pub(crate) fn check_without_leak(s: &Store, keys: u64, ctx: &str) {
    let (found, reach) = s
        .check()
        .unwrap_or_else(|e| panic!("{ctx}: check() failed: {e}"));
    assert_eq!(found, keys, "{ctx}: check().keys");
    assert_eq!(
        reach,
        s.pool().stats().bytes_in_use,
        "{ctx}: check() reachable bytes differ from the pool's bytes in use (leak)"
    );
}

/// The image of `pool` (a store dropped without close) opened as after a
/// crash (log scan) and then, closed cleanly, opened again (image): both
/// hold exactly `m`.
pub(crate) fn crash_then_clean_reopen(pool: &Pool, m: &Model, ctx: &str) {
    let p2 = Arc::new(Pool::from_image(pool.image(), Mode::Volatile).unwrap());
    let s2 = Store::open_pool(p2.clone(), small_opts()).unwrap();
    assert_eq!(s2.stats().opened_from, pmhash_store::OpenedFrom::LogScan);
    verify(&s2, m, &format!("{ctx}, crash reopen"));
    s2.close().unwrap();
    let p3 = Arc::new(Pool::from_image(p2.image(), Mode::Volatile).unwrap());
    let s3 = Store::open_pool(p3, small_opts()).unwrap();
    assert_eq!(s3.stats().opened_from, pmhash_store::OpenedFrom::Image);
    verify(&s3, m, &format!("{ctx}, clean reopen"));
}
