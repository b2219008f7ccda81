//! Checks shared by every persistent engine's fault tests: a refused
//! writable open leaves the file byte for byte as it was, and a full file
//! system is `Err(OutOfSpace)` with the engine still usable.

use std::sync::Arc;

use pmem::testfs::SmallFs;
use pmem::{Mode, Pool, PoolOptions, CHUNK};

use super::{strict_config, test_pool_options, TempPath};
use crate::{open_file, EngineKind, EngineSpec, Error};

const PAGE: usize = 4096;

fn parts(spec: &EngineSpec) -> (&'static str, crate::CreateFn, crate::OpenFn) {
    match spec.kind {
        EngineKind::Persistent {
            layout,
            create,
            open,
        } => (layout, create, open),
        EngineKind::Volatile { .. } => panic!("{} is not persistent", spec.name),
    }
}

fn key(i: u64) -> u64 {
    i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1
}

/// The 4 KiB page past the pool's metadata chunk that holds the most
/// of the keys `0..n` as raw words, or (an engine that stores keys
/// transformed) the one with the most nonzero words: in a table sized
/// for its keys, a page of items.
fn item_page(img: &[u8], n: u64) -> usize {
    let keys: std::collections::HashSet<u64> = (0..n).map(key).collect();
    let pages = CHUNK as usize / PAGE..img.len() / PAGE;
    let words = |p: usize| {
        img[p * PAGE..(p + 1) * PAGE]
            .chunks(8)
            .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
    };
    let with_keys = |p: usize| words(p).filter(|w| keys.contains(w)).count();
    let best = pages.clone().max_by_key(|&p| with_keys(p)).expect("pages");
    if with_keys(best) > 0 {
        return best;
    }
    pages
        .max_by_key(|&p| words(p).filter(|&w| w != 0).count())
        .expect("pages")
}

#[track_caller]
fn assert_refused_untouched(
    spec: &EngineSpec,
    path: &std::path::Path,
    popts: &PoolOptions,
    what: &str,
    needle: &str,
) {
    let (_, _, open) = parts(spec);
    let before = std::fs::read(path).unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        open_file(open, path, popts, &strict_config(1024, 1)).map(|_| ())
    }))
    .unwrap_or_else(|_| panic!("{}: {what}: the open panicked", spec.name));
    // The file first: a refused open must not have written it.
    let after = std::fs::read(path).unwrap();
    assert_eq!(after.len(), before.len(), "{}: {what}: length", spec.name);
    if let Some(i) = after.iter().zip(&before).position(|(a, b)| a != b) {
        panic!(
            "{}: {what}: the open wrote the file (first change at byte {i})",
            spec.name
        );
    }
    match r {
        Err(e) => {
            let m = e.to_string();
            assert!(
                m.contains(needle),
                "{}: {what}: error {m:?} does not say {needle:?}",
                spec.name
            );
        }
        Ok(()) => panic!("{}: {what}: a writable open accepted it", spec.name),
    }
}

/// A cleanly closed pool of 5,000 keys, then: a zeroed 4 KiB page of
/// items is refused with an error that points at `pmhash check`, a
/// root block with a bad first word is refused, both leaving the file
/// byte for byte as it was, and the intact file opens with every key.
pub fn refused_opens_leave_the_file_untouched(spec: &EngineSpec) {
    let (layout, create, open) = parts(spec);
    let tmp = TempPath::new("faults", spec.name);
    let popts = test_pool_options(
        layout,
        b"refused-open-pmh",
        Mode::Mapped,
        4 << 20,
        64 << 20,
        7,
    );
    let n = 5000u64;
    let root = {
        let pool = Arc::new(Pool::create(tmp.path(), &popts).unwrap());
        // Sized for the keys: no resize, so no freed table with stale
        // items can be the densest page.
        let e = create(pool.clone(), &strict_config(4 * n, 1)).unwrap();
        for i in 0..n {
            assert!(e.insert(key(i), i).unwrap());
        }
        e.close().unwrap();
        pool.root()
    };
    let good = std::fs::read(tmp.path()).unwrap();

    let mut img = good.clone();
    let p = item_page(&img, n);
    img[p * PAGE..(p + 1) * PAGE].fill(0);
    std::fs::write(tmp.path(), &img).unwrap();
    assert_refused_untouched(spec, tmp.path(), &popts, "zeroed page", "pmhash check");

    let mut img = good.clone();
    let r = root as usize;
    img[r..r + 8].copy_from_slice(&0xdead_beef_u64.to_le_bytes());
    std::fs::write(tmp.path(), &img).unwrap();
    assert_refused_untouched(spec, tmp.path(), &popts, "bad root word", "");

    std::fs::write(tmp.path(), &good).unwrap();
    let (_pool, e) = open_file(open, tmp.path(), &popts, &strict_config(1024, 1))
        .unwrap_or_else(|e| panic!("{}: the intact pool: {e}", spec.name));
    assert_eq!(e.len(), n);
    for i in (0..n).step_by(97) {
        assert_eq!(e.get(key(i)), Some(i));
    }
}

/// On an 8 MiB tmpfs, a pool that may grow to 64 MiB: inserts until
/// one fails, which must be `OutOfSpace` (not a SIGBUS); every key put
/// before still reads back, removed keys can be put again, and the pool
/// closes and reopens. Skips (saying why) where no tmpfs can be mounted.
pub fn full_file_system_is_out_of_space(spec: &EngineSpec) {
    let (layout, create, open) = parts(spec);
    let fs = match SmallFs::mount(8 << 20) {
        Ok(fs) => fs,
        Err(why) => {
            eprintln!("skipped: needs a small tmpfs ({why})");
            return;
        }
    };
    let path = fs.path("full.pool");
    let popts = test_pool_options(
        layout,
        b"full-filesystem!",
        Mode::Mapped,
        1 << 20,
        64 << 20,
        3,
    );
    let cfg = strict_config(64, 1);
    let pool = Arc::new(Pool::create(&path, &popts).unwrap());
    let e = create(pool.clone(), &cfg).unwrap();
    let mut n = 0u64;
    let err = loop {
        assert!(
            n < 4_000_000,
            "{}: 4M keys fit in an 8 MiB file system",
            spec.name
        );
        match e.insert(key(n), n) {
            Ok(true) => n += 1,
            Ok(false) => panic!("{}: key {n} reported present", spec.name),
            Err(err) => break err,
        }
    };
    assert!(
        matches!(err, Error::OutOfSpace(_)),
        "{}: a full file system gave {err}",
        spec.name
    );
    assert!(
        n > 1000,
        "{}: only {n} keys before the file system filled",
        spec.name
    );
    assert!(pool.size() <= 8 << 20);
    // Reads keep working; the engine stays usable.
    assert_eq!(e.len(), n);
    for i in (0..n).step_by(13) {
        assert_eq!(
            e.get(key(i)),
            Some(i),
            "{}: key {i} after the error",
            spec.name
        );
    }
    assert!(matches!(e.insert(key(n), n), Err(Error::OutOfSpace(_))));
    // Space freed inside the pool is used again.
    for i in n - 100..n {
        assert!(e.remove(key(i)).unwrap());
    }
    for i in n - 100..n {
        assert!(
            e.insert(key(i), i + 1).unwrap(),
            "{}: re-put {i}",
            spec.name
        );
    }
    e.close().unwrap();
    drop(e);
    drop(pool);
    let (_pool, e) = open_file(open, &path, &popts, &cfg).unwrap();
    assert_eq!(e.len(), n);
    assert_eq!(e.get(key(n - 1)), Some(n));
}
