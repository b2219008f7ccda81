//! What every engine's tests share: a seeded RNG, unique temp files, an
//! engine's whole contents checked against a model, and its `stats()`
//! figures by name.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use pmem::Pool;

use crate::Engine;

/// splitmix64: small, seeded, good enough for workloads.
pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x853c_49e6_748f_ea9b)
    }
    /// The next value (an endless stream, so not an `Iterator`).
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// A uniform float in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// An index in 0..n, log-uniform (Zipf-like with exponent ~1): index 0
    /// is drawn about as often as all of 1..e together.
    pub fn skewed(&mut self, n: u64) -> u64 {
        let x = (n as f64).powf(self.unit()) - 1.0;
        (x as u64).min(n - 1)
    }
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A unique path under the temp dir (`{prefix}-{pid}-{tag}-{n}.pool`),
/// removed (if it exists) on drop.
pub struct TempPath(PathBuf);

impl TempPath {
    pub fn new(prefix: &str, tag: &str) -> TempPath {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let p =
            std::env::temp_dir().join(format!("{prefix}-{}-{tag}-{n}.pool", std::process::id()));
        let _ = std::fs::remove_file(&p);
        TempPath(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A unique scratch directory path under the temp dir (not created),
/// removed with its contents on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(prefix: &str, tag: &str) -> TempDir {
        let p = TempPath::new(prefix, tag);
        let dir = p.path().with_extension("d");
        let _ = std::fs::remove_dir_all(&dir);
        TempDir(dir)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A figure from `stats().detail`, parsed (panics if absent or not a number).
pub fn detail(e: &dyn Engine, name: &str) -> f64 {
    e.stats()
        .detail
        .iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("stats().detail has no {name:?}"))
        .1
        .parse()
        .unwrap_or_else(|_| panic!("detail {name:?} is not a number"))
}

/// Everything the engine holds must equal `model`: `for_each` visits each
/// pair exactly once, `len` and `get` of every key agree, `get` of each key
/// in `absent` that the model lacks is `None`, and `check()` passes with
/// the model's key count and no leaked byte (reachable = the allocator's
/// bytes in use).
pub fn verify_model(
    e: &dyn Engine,
    pool: &Pool,
    model: &HashMap<u64, u64>,
    absent: &[u64],
    ctx: &str,
) {
    let mut seen: HashMap<u64, u64> = HashMap::with_capacity(model.len());
    let mut dup = None;
    e.for_each(&mut |k, v| {
        if seen.insert(k, v).is_some() && dup.is_none() {
            dup = Some(k);
        }
    });
    assert_eq!(dup, None, "{ctx}: for_each visited a key twice");
    if seen != *model {
        let missing: Vec<_> = model
            .keys()
            .filter(|k| !seen.contains_key(k))
            .take(5)
            .collect();
        let extra: Vec<_> = seen
            .keys()
            .filter(|k| !model.contains_key(k))
            .take(5)
            .collect();
        let wrong: Vec<_> = model
            .iter()
            .filter(|(k, v)| seen.get(k).is_some_and(|s| s != *v))
            .take(5)
            .collect();
        panic!(
            "{ctx}: for_each differs from the model ({} vs {} keys): missing {missing:x?}, extra {extra:x?}, wrong (key, model value) {wrong:x?}",
            seen.len(),
            model.len()
        );
    }
    assert_eq!(e.len(), model.len() as u64, "{ctx}: len()");
    for (&k, &v) in model {
        assert_eq!(e.get(k), Some(v), "{ctx}: get({k:#x})");
    }
    for &k in absent {
        if !model.contains_key(&k) {
            assert_eq!(e.get(k), None, "{ctx}: get({k:#x}) of an absent key");
        }
    }
    let r = e
        .check()
        .unwrap_or_else(|err| panic!("{ctx}: check() failed: {err}"));
    assert_eq!(r.keys, model.len() as u64, "{ctx}: check().keys");
    assert_eq!(
        r.reachable_bytes,
        pool.stats().bytes_in_use,
        "{ctx}: reachable bytes differ from the allocator's bytes in use (leak)"
    );
}

/// Versioned values for concurrent tests: `key.rotate_left(17) ^ ver · M`.
/// Any value a reader gets decodes back to a version with [`version_of`];
/// a torn value (halves of two writes) or one of another key decodes to
/// garbage.
pub const VER_MUL: u64 = 0x9e37_79b9_7f4a_7c15;
const VER_INV: u64 = crate::hash::inverse(VER_MUL);

/// Value number `ver` of `key`.
pub fn val(key: u64, ver: u64) -> u64 {
    key.rotate_left(17) ^ ver.wrapping_mul(VER_MUL)
}

/// The version a value of `key` was made with (garbage for a value that
/// was never made for `key`).
pub fn version_of(key: u64, v: u64) -> u64 {
    (v ^ key.rotate_left(17)).wrapping_mul(VER_INV)
}

/// A uuid made of a 16-byte tag with `seed` in its first 8 bytes: a test
/// pool's identity, hence its engine's hash seed, repeats run to run.
pub fn test_uuid(tag: &[u8; 16], seed: u64) -> [u8; 16] {
    let mut u = *tag;
    u[..8].copy_from_slice(&seed.to_le_bytes());
    u
}

/// Options of a test pool of `layout` whose uuid is [`test_uuid`]`(tag, seed)`.
pub fn test_pool_options(
    layout: &str,
    tag: &[u8; 16],
    mode: pmem::Mode,
    size: u64,
    max_size: u64,
    seed: u64,
) -> pmem::PoolOptions {
    pmem::PoolOptions {
        mode,
        size,
        max_size,
        layout: layout.into(),
        uuid: Some(test_uuid(tag, seed)),
        ..pmem::PoolOptions::default()
    }
}

/// An in-memory pool (`Volatile` or `Simulated`) made from `opts`.
pub fn mem_pool(opts: &pmem::PoolOptions) -> std::sync::Arc<Pool> {
    assert!(
        opts.mode == pmem::Mode::Volatile || opts.mode == pmem::Mode::Simulated,
        "mem_pool wants an in-memory mode"
    );
    std::sync::Arc::new(Pool::create(Path::new(""), opts).expect("in-memory pool"))
}

/// A strict engine configuration.
pub fn strict_config(initial_capacity: u64, threads: usize) -> crate::EngineConfig {
    crate::EngineConfig {
        durability: crate::Durability::Strict,
        initial_capacity,
        threads,
    }
}

/// Joins every writer thread, then raises `done` (the flag readers loop
/// on) before passing on the first writer's panic: a failing writer fails
/// its test instead of leaving the readers spinning and the test hung.
pub fn join_then_stop<T>(
    writers: Vec<std::thread::ScopedJoinHandle<'_, T>>,
    done: &AtomicBool,
) -> Vec<T> {
    let joined: Vec<_> = writers.into_iter().map(|h| h.join()).collect();
    done.store(true, Ordering::Release);
    joined
        .into_iter()
        .map(|r| r.unwrap_or_else(|p| std::panic::resume_unwind(p)))
        .collect()
}

/// Checks shared by every persistent engine's fault tests: a refused
/// writable open leaves the file byte for byte as it was, and a full file
/// system is `Err(OutOfSpace)` with the engine still usable.
pub mod faults {
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
}

/// What a clean open's cross-check walk did, by the engine's `stat` in
/// `stats().detail` (slots, buckets or segments read), in the three ways
/// a cleanly closed pool is opened.
#[derive(Debug)]
pub struct OpenWalks {
    /// A read-only open (`pmhash check`, `inspect`).
    pub read_only: u64,
    /// The writable open of `crate::open_file`, after its read-only check
    /// (`Pool::prechecked`).
    pub prechecked: u64,
    /// A plain writable open, with no read-only check before it.
    pub plain: u64,
}

/// Builds a pool of `spec` at `path` holding `keys` (value = index),
/// closes it cleanly, and opens it read-only, through `crate::open_file`
/// (whose engine must serve the keys) and writable, returning the `stat`
/// each open reports.
pub fn clean_open_walks(
    spec: &crate::EngineSpec,
    path: &Path,
    popts: &pmem::PoolOptions,
    cfg: &crate::EngineConfig,
    keys: &[u64],
    stat: &str,
) -> OpenWalks {
    let crate::EngineKind::Persistent { create, open, .. } = spec.kind else {
        panic!("{} is not persistent", spec.name)
    };
    let opened = |e: Box<dyn Engine>| {
        let n = detail(e.as_ref(), stat) as u64;
        e.close().unwrap();
        n
    };
    {
        let pool = std::sync::Arc::new(Pool::create(path, popts).unwrap());
        let e = create(pool, cfg).unwrap();
        for (i, &k) in keys.iter().enumerate() {
            assert!(e.insert(k, i as u64).unwrap());
        }
        e.close().unwrap();
    }
    let ro = pmem::PoolOptions {
        read_only: true,
        ..popts.clone()
    };
    let pool = std::sync::Arc::new(Pool::open(path, &ro).unwrap());
    assert!(!pool.prechecked());
    let e = open(pool, cfg).unwrap();
    let read_only = detail(e.as_ref(), stat) as u64;
    drop(e);
    let (pool, e) = crate::open_file(open, path, popts, cfg).unwrap();
    assert!(pool.prechecked());
    assert_eq!(e.len(), keys.len() as u64);
    for (i, &k) in keys.iter().enumerate().step_by(7) {
        assert_eq!(e.get(k), Some(i as u64));
    }
    let prechecked = opened(e);
    drop(pool);
    let pool = std::sync::Arc::new(Pool::open(path, popts).unwrap());
    assert!(!pool.prechecked());
    let plain = opened(open(pool, cfg).unwrap());
    OpenWalks {
        read_only,
        prechecked,
        plain,
    }
}
