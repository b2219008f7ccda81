//! The store under faults: a full file system is `Err(OutOfSpace)` with
//! reads working and writes resuming after DEL + GC; one writer at a time;
//! a refused open leaves the pool byte for byte as it was, and a cleanly
//! closed store whose log was damaged since is refused with an error that
//! points at `pmhash check`.

use engine::testkit::TempDir;
use engine::Error;
use pmem::testfs::SmallFs;
use pmhash_store::{CreateOptions, GcMode, OpenOptions, Options, Store, POOL_FILE};

fn opts() -> Options {
    Options {
        create: CreateOptions {
            pool_size: 4 << 20,
            clusters: 4,
            extent_size: 1 << 20,
            nodes: Some(1),
            ..Default::default()
        },
        open: OpenOptions {
            max_pool_size: 256 << 20,
            gc: GcMode::Manual,
            raf_bytes: 0,
            recovery_threads: 2,
            expected_keys: 4096,
            ..Default::default()
        },
    }
}

fn value(i: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    for (j, b) in v.iter_mut().enumerate() {
        *b = (i as usize * 31 + j * 7) as u8;
    }
    v
}

#[test]
fn full_file_system_is_out_of_space_and_gc_makes_room() {
    let fs = match SmallFs::mount(24 << 20) {
        Ok(fs) => fs,
        Err(why) => {
            eprintln!("skipped: needs a small tmpfs ({why})");
            return;
        }
    };
    let dir = fs.path("db");
    let s = Store::open(&dir, opts()).unwrap();
    const V: usize = 100_000;
    let mut n = 0u64;
    let err = loop {
        assert!(
            n < 2000,
            "2000 values of 100 KB fit in a 24 MiB file system"
        );
        match s.put(format!("key-{n:06}").as_bytes(), &value(n, V)) {
            Ok(()) => n += 1,
            Err(e) => break e,
        }
    };
    assert!(
        matches!(err, Error::OutOfSpace(_)),
        "a full file system gave {err}"
    );
    assert!(err.to_string().contains(POOL_FILE), "{err} names no file");
    assert!(n >= 20, "only {n} puts before the file system filled");
    // Reads keep working, and so does the error.
    for i in 0..n {
        let got = s.get(format!("key-{i:06}").as_bytes()).unwrap();
        assert_eq!(got.as_deref(), Some(&value(i, V)[..]), "key {i}");
    }
    // Other keys meet the same error (their clusters' files fill too),
    // and nothing else.
    let mut refused = 0;
    for i in 0..50u64 {
        match s.put(format!("more-{i}").as_bytes(), &value(i, V)) {
            Ok(()) => {}
            Err(Error::OutOfSpace(_)) => refused += 1,
            Err(e) => panic!("put after the file system filled: {e}"),
        }
    }
    assert!(refused > 0, "50 more puts of 100 KB on a full file system");
    // DEL + GC give log files back to the pool, and writes resume there:
    // the pool file does not grow.
    let size = s.pool().size();
    for i in 0..n - 5 {
        assert!(s.delete(format!("key-{i:06}").as_bytes()).unwrap());
    }
    let mut reclaimed = 0;
    loop {
        let r = s.gc(usize::MAX).unwrap();
        if r == 0 {
            break;
        }
        reclaimed += r;
    }
    assert!(reclaimed > 0, "GC reclaimed no file");
    for i in 0..n / 2 {
        s.put(format!("new-{i:06}").as_bytes(), &value(i + 7, V))
            .unwrap_or_else(|e| panic!("put {i} after GC: {e}"));
    }
    assert_eq!(s.pool().size(), size, "writes after GC reuse the pool");
    for i in n - 5..n {
        let got = s.get(format!("key-{i:06}").as_bytes()).unwrap();
        assert_eq!(got.as_deref(), Some(&value(i, V)[..]));
    }
    s.close().unwrap();
    drop(s);
    let s = Store::open(&dir, opts()).unwrap();
    assert_eq!(s.len(), 5 + n / 2 + (50 - refused));
}

fn key(i: u64) -> Vec<u8> {
    format!("fault-key-{i:08}").into_bytes()
}

/// A cleanly closed store of `n` keys in `dir`; its pool file's bytes.
fn closed_store(dir: &std::path::Path, n: u64) -> Vec<u8> {
    let s = Store::open(dir, opts()).unwrap();
    for i in 0..n {
        s.put(&key(i), &value(i, 100)).unwrap();
    }
    s.close().unwrap();
    drop(s);
    std::fs::read(dir.join(POOL_FILE)).unwrap()
}

#[test]
fn one_writer_at_a_time() {
    let tmp = TempDir::new("store-faults", "writer");
    let dir = tmp.path();
    let n = 300;
    closed_store(dir, n);
    {
        // One writer at a time; readers come in beside it.
        let s = Store::open(dir, opts()).unwrap();
        match Store::open(dir, opts()) {
            Err(Error::Pool(pmem::Error::Locked(m))) => {
                assert!(m.contains(POOL_FILE), "{m}")
            }
            Err(e) => panic!("a second writer got {e}"),
            Ok(_) => panic!("a second writer got in"),
        }
        let ro = Store::open(
            dir,
            Options {
                create: opts().create,
                open: OpenOptions {
                    read_only: true,
                    ..opts().open
                },
            },
        )
        .unwrap();
        assert!(ro.pool().writer_active());
        assert_eq!(ro.len(), n);
        s.close().unwrap();
    }
    // The lock went with the first store.
    Store::open(dir, opts()).unwrap().close().unwrap();
}

#[test]
fn a_clean_store_damaged_after_close_is_refused_untouched() {
    let tmp = TempDir::new("store-faults", "refused");
    let dir = tmp.path();
    let path = dir.join(POOL_FILE);
    let good = closed_store(dir, 3000);
    // A zeroed page of log entries (a key followed by its value, which
    // the clean-shutdown image, holding keys alone, never has) in a
    // cleanly closed store.
    let mut img = good.clone();
    let entries_in = |p: usize| {
        let page = &img[p * 4096..(p + 1) * 4096];
        (0..4096 - 26)
            .filter(|&at| {
                page[at..at + 10] == *b"fault-key-"
                    && std::str::from_utf8(&page[at + 10..at + 18])
                        .ok()
                        .and_then(|d| d.parse::<u64>().ok())
                        .is_some_and(|i| page[at + 18..at + 26] == value(i, 100)[..8])
            })
            .count()
    };
    let page = (good.len() / 4096 / 8..img.len() / 4096)
        .max_by_key(|&p| entries_in(p))
        .unwrap();
    assert!(entries_in(page) > 5);
    img[page * 4096..(page + 1) * 4096].fill(0);
    std::fs::write(&path, &img).unwrap();
    match Store::open(dir, opts()) {
        Err(e) => assert!(e.to_string().contains("pmhash check"), "{e}"),
        Ok(_) => panic!("a store with a zeroed log page was accepted"),
    }
    assert!(
        std::fs::read(&path).unwrap() == img,
        "the refused open wrote the pool"
    );
}
