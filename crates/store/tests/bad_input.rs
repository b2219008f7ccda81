//! Bad input: oversized keys and values and entries larger than a file are
//! an `Err` that changes nothing (the pool image stays byte for byte the
//! same); bad options are refused before anything is created; corrupt,
//! truncated and foreign pool files, and store pools with a flipped byte in
//! the root block, the extent table or an Nlog file header, are refused by
//! `Store::open` (never a panic) and left as they were; read-only opens of
//! a missing store and writes after `close()` or to a read-only store are
//! refused.

use engine::testkit::TempDir;
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use engine::testkit::{mem_pool, test_pool_options, Rng};
use engine::Error;
use pmem::{Mode, Pool, PoolOptions};
use pmhash_store::{
    CreateOptions, GcMode, OpenOptions, Options, Store, LAYOUT, MAX_KEY, MAX_VALUE, POOL_FILE,
};

/// Bytes of the pool header's two state slots, which `Pool::open` rewrites
/// when it marks a pool open for writing (before the store sees the pool).
const STATE_SLOTS: std::ops::Range<usize> = 64..192;

/// A scratch directory, removed on drop.
fn temp_dir(tag: &str) -> TempDir {
    TempDir::new("store-bad", tag)
}

/// The store's pool file inside a scratch directory.
fn pool_file(dir: &TempDir) -> PathBuf {
    dir.path().join(POOL_FILE)
}

fn opts() -> Options {
    Options {
        create: CreateOptions {
            pool_size: 1 << 20,
            clusters: 4,
            extent_size: 4096,
            nodes: Some(1),
            ..Default::default()
        },
        open: OpenOptions {
            mode: Mode::Mapped,
            max_pool_size: 4 << 20,
            gc: GcMode::Manual,
            raf_bytes: 16 << 10,
            recovery_threads: 1,
            ..Default::default()
        },
    }
}

fn ro_opts() -> Options {
    Options {
        create: opts().create,
        open: OpenOptions {
            read_only: true,
            ..opts().open
        },
    }
}

fn mem_store(seed: u64) -> (Arc<Pool>, Store) {
    let o = opts();
    let pool = mem_pool(&test_pool_options(
        LAYOUT,
        b"store-bad-input!",
        Mode::Volatile,
        o.create.pool_size,
        o.open.max_pool_size,
        seed,
    ));
    let s = Store::open_pool(
        pool.clone(),
        Options {
            create: o.create,
            open: OpenOptions {
                mode: Mode::Volatile,
                ..o.open
            },
        },
    )
    .unwrap();
    (pool, s)
}

fn contents(s: &Store) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut m = BTreeMap::new();
    s.for_each(|k, v| {
        m.insert(k.to_vec(), v.to_vec());
    })
    .expect("for_each");
    m
}

/// `Store::open` in a panic guard: `Err("PANIC")` if it panicked.
fn try_open(dir: &Path, o: Options) -> std::result::Result<Store, String> {
    match catch_unwind(AssertUnwindSafe(|| Store::open(dir, o))) {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("PANIC".into()),
    }
}

/// Writes `bad` as the store's pool file and opens it read-only and then
/// writable: both must be an `Err` with a message (never a panic). After
/// the read-only open the file must be byte-for-byte `bad`; after the
/// writable open every byte outside the pool header's state slots must be
/// (the pool layer marks a pool open before the store validates its root,
/// see `writable_refusal_leaves_the_file_byte_identical`). Then the pool is
/// opened by hand and `Store::open_pool` must refuse it without writing a
/// byte. Returns the read-only open's message.
fn refused(dir: &TempDir, bad: &[u8], what: &str) -> String {
    let path = pool_file(dir);
    let mut msg = String::new();
    for read_only in [true, false] {
        std::fs::write(&path, bad).unwrap();
        let how = if read_only { "read-only" } else { "writable" };
        let o = if read_only { ro_opts() } else { opts() };
        match try_open(dir.path(), o) {
            Ok(s) => panic!(
                "{what} ({how}): open accepted it: {} keys, check() says {:?}",
                s.len(),
                s.check()
            ),
            Err(m) => {
                assert_ne!(m, "PANIC", "{what} ({how}): open panicked");
                assert!(!m.is_empty(), "{what} ({how}): an error without a message");
                if read_only {
                    msg = m;
                }
            }
        }
        let now = std::fs::read(&path).unwrap();
        assert_eq!(
            now.len(),
            bad.len(),
            "{what} ({how}): the file length changed"
        );
        let diff: Vec<usize> = (0..now.len())
            .filter(|&i| now[i] != bad[i] && (read_only || !STATE_SLOTS.contains(&i)))
            .take(4)
            .collect();
        assert!(
            diff.is_empty(),
            "{what} ({how}): the refused open wrote at {diff:#x?}"
        );
    }
    // The store's own refusal writes nothing into an opened pool.
    std::fs::write(&path, bad).unwrap();
    if let Ok(pool) = Pool::open(
        &path,
        &PoolOptions {
            mode: Mode::Mapped,
            layout: LAYOUT.into(),
            ..PoolOptions::default()
        },
    ) {
        let pool = Arc::new(pool);
        let before = pool.image();
        let r = catch_unwind(AssertUnwindSafe(|| Store::open_pool(pool.clone(), opts())));
        match r {
            Err(_) => panic!("{what}: Store::open_pool panicked"),
            Ok(Ok(_)) => panic!("{what}: Store::open_pool accepted it"),
            Ok(Err(e)) => assert!(
                matches!(e, Error::Corrupt(_) | Error::Pool(_)),
                "{what}: refused with {e:?}, not a corruption error"
            ),
        }
        assert!(
            pool.image() == before,
            "{what}: the refused Store::open_pool wrote"
        );
    }
    std::fs::write(&path, bad).unwrap();
    msg
}

/// A store file with `n` keys in several small files: cleanly closed, or
/// dropped without close (a crash). Returns its bytes and contents.
fn built(dir: &TempDir, n: u64, clean: bool) -> (Vec<u8>, BTreeMap<Vec<u8>, Vec<u8>>) {
    let s = Store::open(dir.path(), opts()).unwrap();
    let mut rng = Rng::new(n);
    for i in 0..n {
        let k = format!("key{:05}", rng.below(n)).into_bytes();
        s.put(&k, &vec![i as u8; rng.below(300) as usize]).unwrap();
        if i % 5 == 0 {
            let _ = s
                .delete(&format!("key{:05}", rng.below(n)).into_bytes())
                .unwrap();
        }
    }
    assert!(s.stats().files > 4, "want several Nlog files");
    let m = contents(&s);
    if clean {
        s.close().unwrap();
    }
    drop(s);
    (std::fs::read(pool_file(dir)).unwrap(), m)
}

fn word(b: &[u8], off: u64) -> u64 {
    u64::from_le_bytes(b[off as usize..off as usize + 8].try_into().unwrap())
}

/// The store root block's offset, found by its magic and format words on
/// a 64-byte boundary past the pool header (whichever header field links
/// it), the offsets of the occupied extent-table slots with the files they
/// name, and one empty slot, read from a store file's bytes.
fn shape(b: &[u8]) -> (u64, Vec<(u64, u64)>, u64) {
    let roots: Vec<u64> = (pmem::header::HEADER_LEN as u64..b.len() as u64 - 16)
        .step_by(64)
        .filter(|&o| {
            word(b, o) == u64::from_le_bytes(*b"PMHSTOR1") && word(b, o + 8) == pmhash_store::FORMAT
        })
        .collect();
    assert_eq!(roots.len(), 1, "store root blocks found at {roots:#x?}");
    let root = roots[0];
    let table_len = word(b, root + 40);
    let mut used = Vec::new();
    let mut empty = None;
    for slot in 0..table_len {
        let at = root + 128 + 8 * slot;
        let off = word(b, at);
        if off != 0 {
            used.push((at, off));
        } else if empty.is_none() {
            empty = Some(at);
        }
    }
    assert!(!used.is_empty());
    (root, used, empty.expect("an empty table slot"))
}

fn flipped(b: &[u8], at: u64) -> Vec<u8> {
    let mut v = b.to_vec();
    v[at as usize] ^= 0xff;
    v
}

/// The untouched file opens with its contents, read-only and writable.
fn accepted(dir: &TempDir, good: &[u8], m: &BTreeMap<Vec<u8>, Vec<u8>>, what: &str) {
    for o in [ro_opts(), opts()] {
        std::fs::write(pool_file(dir), good).unwrap();
        let s = try_open(dir.path(), o).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(contents(&s) == *m, "{what}: contents differ");
        let (keys, _) = s.check().unwrap();
        assert_eq!(keys, m.len() as u64);
    }
    std::fs::write(pool_file(dir), good).unwrap();
}

#[test]
fn oversized_keys_and_values_are_refused_and_change_nothing() {
    let (pool, s) = mem_store(1);
    for i in 0..50u32 {
        s.put(&i.to_be_bytes(), &[i as u8; 40]).unwrap();
    }
    let m = contents(&s);
    let before = pool.image();
    let big_key = vec![1u8; MAX_KEY + 1];
    let big_val = vec![2u8; MAX_VALUE + 1];
    let k = 7u32.to_be_bytes();
    assert!(matches!(
        s.put(&big_key, b"v"),
        Err(Error::InvalidArgument(_))
    ));
    assert!(s.insert(&big_key, b"v").is_err());
    assert!(s.update(&big_key, b"v").is_err());
    assert!(s.delete(&big_key).is_err());
    assert!(s.get(&big_key).is_err());
    assert!(!s.get_into(&big_key, &mut Vec::new()).unwrap());
    assert!(s.scan(&big_key, None, 10).is_err());
    assert!(s.scan(b"", Some(&big_key), 10).is_err());
    assert!(matches!(
        s.put(&k, &big_val),
        Err(Error::InvalidArgument(_))
    ));
    assert!(s.insert(b"new", &big_val).is_err());
    assert!(s.update(&k, &big_val).is_err());
    // An entry within the limits but larger than a 4096-byte file.
    for (kl, vl) in [
        (0usize, 4000usize),
        (100, 3960),
        (MAX_KEY, 0),
        (8, MAX_VALUE),
    ] {
        let key = vec![3u8; kl];
        assert!(
            matches!(s.put(&key, &vec![4u8; vl]), Err(Error::InvalidArgument(_))),
            "key {kl} + value {vl} bytes in a 4096-byte file"
        );
        assert!(s.update(&k, &vec![4u8; vl + kl]).is_err());
        assert!(s.insert(&key, &vec![4u8; vl]).is_err());
    }
    assert!(pool.image() == before, "a refused write changed the pool");
    assert!(contents(&s) == m, "a refused write changed the contents");
    assert_eq!(s.len(), m.len() as u64);
    // The largest entry that fits is accepted: 4096 bytes less the file's
    // 64-byte header line and the entry's 40-byte header.
    s.put(b"", &vec![5u8; 4096 - 64 - 40]).unwrap();
    assert_eq!(s.get(b"").unwrap().map(|v| v.len()), Some(4096 - 64 - 40));
    let (keys, _) = s.check().unwrap();
    assert_eq!(keys, m.len() as u64 + 1);
}

#[test]
fn bad_options_are_refused_before_anything_is_made() {
    let dir = temp_dir("opts");
    let bad = [
        Options {
            create: CreateOptions {
                clusters: 0,
                ..opts().create
            },
            open: opts().open,
        },
        Options {
            create: CreateOptions {
                clusters: (1 << 16) + 1,
                ..opts().create
            },
            open: opts().open,
        },
        Options {
            create: CreateOptions {
                extent_size: 2048,
                ..opts().create
            },
            open: opts().open,
        },
        Options {
            create: CreateOptions {
                extent_size: 4100,
                ..opts().create
            },
            open: opts().open,
        },
        Options {
            create: CreateOptions {
                nodes: Some(0),
                ..opts().create
            },
            open: opts().open,
        },
        Options {
            create: CreateOptions {
                nodes: Some(65),
                ..opts().create
            },
            open: opts().open,
        },
        Options {
            create: CreateOptions {
                nodes: None,
                ..opts().create
            },
            open: OpenOptions {
                numa_emulate: Some(0),
                ..opts().open
            },
        },
        Options {
            create: opts().create,
            open: OpenOptions {
                gc_threshold: 0.0,
                ..opts().open
            },
        },
        Options {
            create: opts().create,
            open: OpenOptions {
                gc_threshold: 1.5,
                ..opts().open
            },
        },
        Options {
            create: opts().create,
            open: OpenOptions {
                gc_threshold: f64::NAN,
                ..opts().open
            },
        },
    ];
    for (i, o) in bad.into_iter().enumerate() {
        let e = try_open(dir.path(), o.clone())
            .err()
            .unwrap_or_else(|| panic!("options {i} accepted"));
        assert_ne!(e, "PANIC", "options {i}");
        assert!(!dir.path().exists(), "options {i}: the directory was made");
        let pool = mem_pool(&test_pool_options(
            LAYOUT,
            b"store-bad-input!",
            Mode::Volatile,
            1 << 20,
            0,
            i as u64,
        ));
        let before = pool.image();
        assert!(
            Store::open_pool(pool.clone(), o).is_err(),
            "options {i} accepted by open_pool"
        );
        assert!(pool.image() == before, "options {i}: open_pool wrote");
    }
}

#[test]
fn read_only_open_of_a_missing_store_is_refused() {
    let dir = temp_dir("missing");
    let e = try_open(dir.path(), ro_opts())
        .err()
        .expect("opened a missing store");
    assert_ne!(e, "PANIC");
    assert!(!e.is_empty());
    assert!(!dir.path().exists(), "a read-only open made the directory");
    // An existing empty directory: still nothing to open, nothing made.
    std::fs::create_dir_all(dir.path()).unwrap();
    assert!(try_open(dir.path(), ro_opts()).is_err());
    assert!(
        !pool_file(&dir).exists(),
        "a read-only open made the pool file"
    );
}

#[test]
fn random_truncated_and_empty_files_are_refused_untouched() {
    let dir = temp_dir("junk");
    std::fs::create_dir_all(dir.path()).unwrap();
    let mut rng = Rng::new(9);
    for len in [0usize, 100, 4096, 1 << 20] {
        let junk: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        refused(&dir, &junk, &format!("{len} random bytes"));
    }
    // Random bytes behind a copied pool magic.
    let mut junk: Vec<u8> = (0..1 << 20).map(|_| rng.next() as u8).collect();
    junk[..8].copy_from_slice(b"PMHASHPL");
    refused(&dir, &junk, "random bytes after the pool magic");
    std::fs::remove_file(pool_file(&dir)).unwrap();
    for clean in [true, false] {
        let (good, m) = built(&dir, 400, clean);
        for frac in [2usize, 3] {
            let cut = &good[..good.len() / frac];
            refused(
                &dir,
                cut,
                &format!("store file cut to 1/{frac} (clean {clean})"),
            );
        }
        accepted(&dir, &good, &m, &format!("intact file (clean {clean})"));
        std::fs::remove_file(pool_file(&dir)).unwrap();
    }
}

#[test]
fn pools_of_other_layouts_are_refused_untouched() {
    let dir = temp_dir("other");
    std::fs::create_dir_all(dir.path()).unwrap();
    let path = pool_file(&dir);
    let popts = |layout: &str| PoolOptions {
        mode: Mode::Mapped,
        size: 1 << 20,
        layout: layout.into(),
        ..PoolOptions::default()
    };
    // A pool of another engine (with a root block of its own).
    {
        let pool = Pool::create(&path, &popts("other")).unwrap();
        let r = pool.reserve(256, pmem::Link::RootPointer).unwrap();
        pool.write(r.offset(), &[0x5a; 256]);
        pool.persist(r.offset(), 256);
        pool.set_root(r.offset()).unwrap();
        pool.commit(r);
        pool.close().unwrap();
    }
    let bytes = std::fs::read(&path).unwrap();
    let m = refused(&dir, &bytes, "a pool of layout \"other\"");
    assert!(m.contains("other") || m.contains("layout"), "{m}");
    // A store whose root block is overwritten with garbage.
    std::fs::remove_file(&path).unwrap();
    let (good, _) = built(&dir, 100, true);
    let (root, _, _) = shape(&good);
    let mut bad = good.clone();
    bad[root as usize..root as usize + 128].fill(0x5a);
    let m = refused(&dir, &bad, "a store whose root block is garbage");
    assert!(m.contains("root"), "{m}");
    // A zeroed root block.
    bad[root as usize..root as usize + 128].fill(0);
    let m = refused(&dir, &bad, "a store whose root block is zeroed");
    assert!(m.contains("root"), "{m}");
    // A store pool with no root yet: read-only cannot format it (and
    // writes nothing); a writable open formats it.
    std::fs::remove_file(&path).unwrap();
    {
        let pool = Pool::create(&path, &popts(LAYOUT)).unwrap();
        pool.close().unwrap();
    }
    let bytes = std::fs::read(&path).unwrap();
    match try_open(dir.path(), ro_opts()) {
        Ok(s) => assert!(s.is_empty()),
        Err(e) => assert_ne!(e, "PANIC"),
    }
    assert!(
        std::fs::read(&path).unwrap() == bytes,
        "read-only open wrote"
    );
    let s = Store::open(dir.path(), opts()).unwrap();
    assert_eq!(s.stats().opened_from, pmhash_store::OpenedFrom::Created);
    s.put(b"k", b"v").unwrap();
    s.close().unwrap();
    drop(s);
    let s = Store::open(dir.path(), ro_opts()).unwrap();
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
}

/// `Store::open_pool` handed a pool of another engine (its own layout id
/// and root block) refuses it and writes nothing: the pool is not the
/// store's to format.
#[test]
fn open_pool_refuses_a_pool_of_another_layout() {
    for mode in [Mode::Volatile, Mode::Simulated] {
        let pool = mem_pool(&test_pool_options(
            "other",
            b"store-bad-input!",
            mode,
            1 << 20,
            0,
            3,
        ));
        let r = pool.reserve(256, pmem::Link::RootPointer).unwrap();
        pool.write(r.offset(), &[0x5a; 256]);
        pool.persist(r.offset(), 256);
        pool.set_root(r.offset()).unwrap();
        pool.commit(r);
        let before = pool.image();
        let got = catch_unwind(AssertUnwindSafe(|| Store::open_pool(pool.clone(), opts())));
        match got {
            Err(_) => panic!("{mode:?}: Store::open_pool panicked"),
            Ok(Ok(s)) => panic!(
                "{mode:?}: Store::open_pool formatted a store inside a pool of layout {:?} ({} keys)",
                pool.layout(),
                s.len()
            ),
            Ok(Err(e)) => assert!(!e.to_string().is_empty()),
        }
        assert!(
            pool.image() == before,
            "{mode:?}: the refused open_pool wrote"
        );
    }
}

/// Every byte of the root's checked words, of an extent-table slot and of
/// an Nlog file header, flipped one at a time, in a cleanly closed and in
/// a crashed store: each is refused and left as it was; the intact file
/// opens with its contents.
#[test]
fn flipped_bytes_in_root_table_and_file_headers_are_refused() {
    for clean in [true, false] {
        let dir = temp_dir(if clean { "flip-clean" } else { "flip-crash" });
        let (good, m) = built(&dir, 500, clean);
        let (root, used, empty) = shape(&good);
        let (slot_at, file_off) = used[used.len() / 2];
        let tag = |w: &str| format!("{w} (clean {clean})");
        for i in 0..56 {
            let msg = refused(
                &dir,
                &flipped(&good, root + i),
                &tag(&format!("root byte {i}")),
            );
            assert!(
                msg.contains("root") || msg.contains("format"),
                "root byte {i}: {msg}"
            );
        }
        for i in 0..8 {
            let msg = refused(
                &dir,
                &flipped(&good, slot_at + i),
                &tag(&format!("table slot byte {i}")),
            );
            assert!(msg.contains("Nlog file"), "slot byte {i}: {msg}");
        }
        // An empty slot that names a file another slot already holds.
        let mut dup = good.clone();
        dup[empty as usize..empty as usize + 8].copy_from_slice(&file_off.to_le_bytes());
        let msg = refused(&dir, &dup, &tag("a file linked from two slots"));
        assert!(msg.contains("Nlog file"), "{msg}");
        for i in 0..40 {
            let msg = refused(
                &dir,
                &flipped(&good, file_off + i),
                &tag(&format!("Nlog header byte {i}")),
            );
            assert!(msg.contains("Nlog file"), "header byte {i}: {msg}");
        }
        accepted(&dir, &good, &m, &tag("intact file"));
    }
}

/// A store of format 1 (entries 8-aligned, CRC-32) is refused by name,
/// not misread as the current format.
#[test]
fn an_older_format_is_refused_by_name() {
    let dir = temp_dir("format-1");
    let (good, _) = built(&dir, 50, true);
    let (root, _, _) = shape(&good);
    let mut old = good.clone();
    old[root as usize + 8..root as usize + 16].copy_from_slice(&1u64.to_le_bytes());
    let msg = refused(&dir, &old, "format 1");
    assert!(
        msg.contains("format 1") && msg.contains("format 3"),
        "{msg}"
    );
    // Format 2: entries without a durable mark.
    old[root as usize + 8..root as usize + 16].copy_from_slice(&2u64.to_le_bytes());
    let msg = refused(&dir, &old, "format 2");
    assert!(
        msg.contains("format 2") && msg.contains("format 3"),
        "{msg}"
    );
}

/// The brief's stricter promise: a refused *writable* `Store::open` leaves
/// the file byte-identical. `Pool::open` rewrites the header's state slot
/// (clean flag cleared, open count bumped) before the store validates its
/// root, so a store-level refusal leaves those bytes changed.
#[test]

fn writable_refusal_leaves_the_file_byte_identical() {
    let dir = temp_dir("flip-strict");
    let (good, _) = built(&dir, 200, true);
    let (root, _, _) = shape(&good);
    let bad = flipped(&good, root);
    std::fs::write(pool_file(&dir), &bad).unwrap();
    assert!(try_open(dir.path(), opts()).is_err());
    let now = std::fs::read(pool_file(&dir)).unwrap();
    let diff: Vec<usize> = (0..now.len())
        .filter(|&i| now[i] != bad[i])
        .take(8)
        .collect();
    assert!(
        diff.is_empty(),
        "the refused writable open wrote at {diff:#x?}"
    );
}

#[test]
fn crashed_store_opens_read_only_without_writing() {
    let dir = temp_dir("ro-crash");
    let (good, m) = built(&dir, 600, false);
    let s = Store::open(dir.path(), ro_opts()).unwrap();
    assert_eq!(s.stats().opened_from, pmhash_store::OpenedFrom::LogScan);
    assert!(contents(&s) == m);
    s.check().unwrap();
    for (what, r) in [
        ("put", s.put(b"x", b"y").map(|_| ())),
        ("insert", s.insert(b"x", b"y").map(|_| ())),
        ("update", s.update(b"key00001", b"y").map(|_| ())),
        ("delete", s.delete(b"key00001").map(|_| ())),
        ("gc", s.gc(usize::MAX).map(|_| ())),
    ] {
        assert!(r.is_err(), "{what} on a read-only store was accepted");
    }
    s.close().unwrap();
    drop(s);
    assert!(
        std::fs::read(pool_file(&dir)).unwrap() == good,
        "a read-only open changed the file"
    );
}

#[test]
fn writes_after_close_are_refused() {
    let dir = temp_dir("closed");
    let s = Store::open(dir.path(), opts()).unwrap();
    s.put(b"a", b"1").unwrap();
    s.put(b"b", b"2").unwrap();
    s.close().unwrap();
    for (what, r) in [
        ("put", s.put(b"c", b"3").map(|_| ())),
        ("put over", s.put(b"a", b"9").map(|_| ())),
        ("insert", s.insert(b"c", b"3").map(|_| ())),
        ("update", s.update(b"a", b"9").map(|_| ())),
        ("delete", s.delete(b"b").map(|_| ())),
        ("gc", s.gc(usize::MAX).map(|_| ())),
    ] {
        assert!(r.is_err(), "{what} after close() was accepted");
    }
    // A second close is harmless.
    s.close().unwrap();
    drop(s);
    let bytes = std::fs::read(pool_file(&dir)).unwrap();
    let s = Store::open(dir.path(), ro_opts()).unwrap();
    assert_eq!(s.stats().opened_from, pmhash_store::OpenedFrom::Image);
    let mut want = BTreeMap::new();
    want.insert(b"a".to_vec(), b"1".to_vec());
    want.insert(b"b".to_vec(), b"2".to_vec());
    assert!(contents(&s) == want);
    drop(s);
    assert!(std::fs::read(pool_file(&dir)).unwrap() == bytes);
}
