//! Pool lifecycle in `mapped` mode, growth, and the open path's defence
//! against bad input: every bad file gives a clear `Err`, never a panic, and
//! is never modified.

mod common;

use std::os::unix::fs::FileExt;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use pmhash_pmem::header::{State, HEADER_LEN, SLOT_LEN, SLOT_OFFSET};
use pmhash_pmem::{Error, Link, Pool, PoolOptions, CHUNK};

const LAYOUT: &str = "pooltest";

/// Reserves, fills, persists, links (a pointer in `owner`, or nothing when
/// `owner` is 0) and commits a block; returns its offset and usable size.
fn alloc_filled(pool: &Pool, size: u64, owner: u64, tag: u64) -> (u64, u64) {
    let link = if owner == 0 {
        Link::Nothing
    } else {
        Link::Pointer { owner }
    };
    let r = pool.reserve(size, link).expect("reserve");
    let off = r.offset();
    let data = pattern(off, size as usize, tag);
    pool.write(off, &data);
    pool.persist(off, data.len());
    if owner != 0 {
        pool.store_u64(owner, off);
        pool.persist(owner, 8);
    }
    let usable = r.size();
    pool.commit(r);
    (off, usable)
}

fn read_vec(pool: &Pool, off: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    pool.read(off, &mut v);
    v
}

#[test]
fn close_then_open_restores_data_root_and_clean_flag() {
    let tmp = TempPath::new("lifecycle");
    let opts = mapped(MIB, 0, LAYOUT);
    let (off, root_off);
    {
        let pool = Pool::create(tmp.path(), &opts).unwrap();
        assert_eq!(pool.layout(), LAYOUT);
        assert!(!pool.was_clean(), "a new pool was never closed");
        assert_eq!(pool.root(), 0);
        (root_off, _) = alloc_filled(&pool, 256, 0, 1);
        pool.set_root(root_off).unwrap();
        (off, _) = alloc_filled(&pool, 1000, root_off, 2);
        pool.close().unwrap();
    }
    let pool = Pool::open(tmp.path(), &opts).unwrap();
    assert!(pool.was_clean(), "closed pool must report a clean shutdown");
    assert_eq!(pool.root(), root_off);
    assert_eq!(pool.load_u64(root_off), off, "owner word survives");
    assert_eq!(read_vec(&pool, off, 1000), pattern(off, 1000, 2));
    assert_eq!(pool.stats().blocks_in_use, 2);
    assert_eq!(pool.stats().bytes_in_use, 256 + 1024);
    assert_eq!(pool.size(), MIB);
    assert_eq!(
        pool.header_state().clean,
        0,
        "an open pool is marked not clean"
    );
    drop(pool);
    // An empty layout accepts any pool.
    let any = PoolOptions {
        layout: String::new(),
        ..opts.clone()
    };
    let pool = Pool::open(tmp.path(), &any).unwrap();
    assert_eq!(pool.layout(), LAYOUT);
    assert!(
        !pool.was_clean(),
        "the previous open was dropped without close"
    );
}

#[test]
fn drop_without_close_is_not_clean_but_keeps_data() {
    let tmp = TempPath::new("dirty");
    let opts = mapped(MIB, 0, LAYOUT);
    let off;
    {
        let pool = Pool::create(tmp.path(), &opts).unwrap();
        (off, _) = alloc_filled(&pool, 4096, 0, 3);
        pool.set_root(off).unwrap();
        // No close: a process crash after persisting.
    }
    let pool = Pool::open(tmp.path(), &opts).unwrap();
    assert!(!pool.was_clean());
    assert_eq!(pool.root(), off);
    assert_eq!(read_vec(&pool, off, 4096), pattern(off, 4096, 3));
    pool.close().unwrap();
    drop(pool);
    let pool = Pool::open(tmp.path(), &opts).unwrap();
    assert!(pool.was_clean());
}

#[test]
fn create_refuses_an_existing_file() {
    let tmp = TempPath::new("exists");
    let opts = mapped(MIB, 0, LAYOUT);
    {
        let pool = Pool::create(tmp.path(), &opts).unwrap();
        pool.close().unwrap();
    }
    let before = file_bytes(tmp.path());
    let err = Pool::create(tmp.path(), &opts)
        .err()
        .expect("create over an existing pool must fail");
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains(&tmp.path().display().to_string()),
        "message names the file: {msg}"
    );
    assert_file_is(tmp.path(), &before, "create over existing pool");

    // Also a file that is not a pool at all.
    let other = TempPath::new("exists-other");
    std::fs::write(other.path(), b"precious user data").unwrap();
    assert!(Pool::create(other.path(), &opts).is_err());
    assert_eq!(std::fs::read(other.path()).unwrap(), b"precious user data");
}

#[test]
fn create_and_open_reject_invalid_arguments() {
    let tmp = TempPath::new("badargs");
    for layout in ["", "has space", "seventeen-chars!!"] {
        let err = Pool::create(tmp.path(), &mapped(MIB, 0, layout))
            .err()
            .expect("bad layout");
        assert!(
            matches!(err, Error::InvalidArgument(_)),
            "{layout:?}: {err:?}"
        );
        assert!(!tmp.path().exists(), "a refused create leaves no file");
    }
    let err = Pool::create(tmp.path(), &mapped(4 * MIB, 2 * MIB, LAYOUT))
        .err()
        .expect("max < size");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert!(!tmp.path().exists());
    let ro = PoolOptions {
        read_only: true,
        ..mapped(MIB, 0, LAYOUT)
    };
    assert!(matches!(
        Pool::create(tmp.path(), &ro),
        Err(Error::InvalidArgument(_))
    ));
    assert!(!tmp.path().exists());

    let missing = TempPath::new("missing");
    let err = Pool::open(missing.path(), &mapped(MIB, 0, LAYOUT))
        .err()
        .expect("missing file");
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    assert!(err.to_string().contains("cannot open"), "{err}");
    assert!(!missing.path().exists(), "open never creates a file");
}

#[test]
fn growth_keeps_offsets_data_and_base_address() {
    let tmp = TempPath::new("grow");
    let opts = mapped(MIB, 8 * MIB, LAYOUT);
    let pool = Pool::create(tmp.path(), &opts).unwrap();
    assert_eq!(pool.size(), MIB);
    assert_eq!(pool.max_size(), 8 * MIB);
    let base = pool.base_addr();
    let (small, _) = alloc_filled(&pool, 512, 0, 10);
    pool.set_root(small).unwrap();
    let free_before = pool.stats().free_chunks;
    assert!(
        free_before * CHUNK < 2 * MIB,
        "the request must not fit without growth"
    );

    let big = 2 * MIB;
    let owner = small + 512 - 8;
    let r = pool
        .reserve(big, Link::Pointer { owner })
        .expect("growth makes room");
    let grown = pool.size();
    assert!(grown > MIB && grown <= 8 * MIB, "grew to {grown}");
    assert_eq!(grown % CHUNK, 0);
    assert!(r.size() >= big);
    assert!(r.offset() + r.size() <= grown);
    let now = pool.base_addr();
    assert_eq!(now, base, "the base address never moves");
    assert_eq!(pool.stats().size, grown);
    assert_eq!(
        std::fs::metadata(tmp.path()).unwrap().len(),
        grown,
        "file extended"
    );
    assert_eq!(
        read_vec(&pool, small, 512),
        pattern(small, 512, 10),
        "old data intact"
    );
    let head = pattern(small, 512, 10)[..504].to_vec();
    assert_eq!(pool.root(), small);

    // The new block is usable end to end.
    let (boff, bsize) = (r.offset(), r.size());
    let data = pattern(boff, bsize as usize, 11);
    pool.write(boff, &data);
    pool.persist(boff, data.len());
    pool.store_u64(owner, boff);
    pool.persist(owner, 8);
    pool.commit(r);
    assert_eq!(pool.stats().blocks_in_use, 2);
    pool.close().unwrap();
    drop(pool);

    // Reopen without a growth limit: the grown size is the size.
    let pool = Pool::open(tmp.path(), &mapped(0, 0, LAYOUT)).unwrap();
    assert_eq!(pool.size(), grown, "reopen sees the grown size");
    assert!(pool.was_clean());
    assert_eq!(pool.load_u64(owner), boff);
    assert_eq!(read_vec(&pool, small, 504), head);
    assert_eq!(read_vec(&pool, boff, bsize as usize), data);
    assert_eq!(pool.stats().bytes_in_use, 512 + bsize);
}

#[test]
fn growth_counts_the_free_tail_near_the_limit() {
    // 1 MiB = chunk 0 + 3 free heap chunks; the limit of 2 MiB gives 7 heap
    // chunks, so a 5-chunk extent fits once the pool has grown.
    let tmp = TempPath::new("grow-tail");
    let pool = Pool::create(tmp.path(), &mapped(MIB, 2 * MIB, LAYOUT)).unwrap();
    assert_eq!(pool.stats().free_chunks, 3);
    let want = 5 * CHUNK - 64;
    let r = pool.reserve(want, Link::Nothing).unwrap_or_else(|e| {
        panic!("a 5-chunk extent fits in a 2 MiB pool with 7 heap chunks: {e}")
    });
    assert_eq!(pool.size(), 2 * MIB);
    assert!(r.size() >= want);
    pool.cancel(r);
    assert_eq!(pool.stats().bytes_in_use, 0);
    assert_eq!(pool.stats().free_chunks, 7);
    // Now a request larger than the limit fails cleanly.
    let err = pool
        .reserve(8 * CHUNK, Link::Nothing)
        .expect_err("beyond the limit");
    assert!(matches!(err, Error::OutOfSpace(_)), "{err:?}");
    assert_eq!(pool.size(), 2 * MIB);
}

#[test]
fn without_growth_out_of_space_is_an_err_and_the_pool_stays_usable() {
    let tmp = TempPath::new("nogrow");
    let opts = mapped(MIB, 0, LAYOUT);
    let pool = Pool::create(tmp.path(), &opts).unwrap();
    assert_eq!(pool.max_size(), MIB);
    let (keep, _) = alloc_filled(&pool, 2048, 0, 20);
    pool.set_root(keep).unwrap();
    let stats = pool.stats();
    for size in [2 * MIB, MIB, 3 * CHUNK] {
        let err = pool.reserve(size, Link::Nothing).expect_err("does not fit");
        assert!(matches!(err, Error::OutOfSpace(_)), "{size}: {err:?}");
        let msg = err.to_string();
        assert!(msg.contains("out of space"), "{msg}");
        assert_eq!(pool.stats(), stats, "a failed reserve changes nothing");
    }
    assert_eq!(pool.size(), MIB);
    assert_eq!(std::fs::metadata(tmp.path()).unwrap().len(), MIB);
    // Smaller requests still work, old data intact.
    let (a, _) = alloc_filled(&pool, 64, keep, 21);
    assert_eq!(
        pool.stats().free_chunks,
        1,
        "two runs took two of the three heap chunks"
    );
    let r = pool
        .reserve(CHUNK - 64, Link::Nothing)
        .expect("one free chunk remains");
    pool.cancel(r);
    assert_eq!(
        read_vec(&pool, keep + 8, 2040),
        pattern(keep, 2048, 20)[8..].to_vec()
    );
    assert_eq!(read_vec(&pool, a, 64), pattern(a, 64, 21));
    // Run every class until the pool is full: no panic, a clean Err.
    let mut n = 0;
    loop {
        match pool.reserve(32 << 10, Link::Nothing) {
            Ok(r) => {
                pool.commit(r);
                n += 1;
            }
            Err(Error::OutOfSpace(_)) => break,
            Err(e) => panic!("unexpected {e:?}"),
        }
        assert!(n < 1000, "a 1 MiB pool cannot hold 1000 blocks of 32 KiB");
    }
    assert!(n >= 7);
    assert_eq!(read_vec(&pool, a, 64), pattern(a, 64, 21));
    pool.close().unwrap();
    drop(pool);
    let pool = Pool::open(tmp.path(), &opts).unwrap();
    assert_eq!(pool.stats().blocks_in_use, 2 + n);
}

#[test]
fn huge_requests_are_errors_not_panics_or_hangs() {
    let tmp = TempPath::new("huge");
    let pool = Arc::new(Pool::create(tmp.path(), &mapped(MIB, 4 * MIB, LAYOUT)).unwrap());
    let (tx, rx) = mpsc::channel();
    let p = Arc::clone(&pool);
    // A worker thread, so a hang fails the test instead of stalling it.
    std::thread::spawn(move || {
        for size in [u64::MAX, u64::MAX - 100, 1 << 62, 1 << 40, 64 * MIB] {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                p.reserve(size, Link::Nothing).err()
            }));
            let _ = tx.send((
                size,
                r.map(|e| e.map(|e| matches!(e, Error::OutOfSpace(_) | Error::InvalidArgument(_)))),
            ));
        }
    });
    for _ in 0..5 {
        let (size, got) = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("reserve of a huge size hangs");
        match got {
            Ok(Some(true)) => {}
            Ok(Some(false)) => panic!("reserve({size}): wrong error kind"),
            Ok(None) => panic!("reserve({size}) succeeded"),
            Err(_) => panic!("reserve({size}) panicked"),
        }
    }
    assert_eq!(pool.stats().bytes_in_use, 0);
    assert!(matches!(
        pool.reserve(0, Link::Nothing),
        Err(Error::InvalidArgument(_))
    ));
    let r = pool.reserve(64, Link::Nothing).expect("still usable");
    pool.cancel(r);
}

// ----- bad files ------------------------------------------------------------------

/// Opens `path` writable and read-only; both must fail with an error that
/// `check` accepts, and the file must not change.
#[track_caller]
fn assert_open_fails(
    path: &std::path::Path,
    opts: &PoolOptions,
    what: &str,
    check: impl Fn(&Error) -> bool,
) -> String {
    let before = file_bytes(path);
    let mut msg = String::new();
    for read_only in [false, true] {
        let o = PoolOptions {
            read_only,
            ..opts.clone()
        };
        let err = Pool::open(path, &o)
            .err()
            .unwrap_or_else(|| panic!("{what}: open succeeded"));
        assert!(check(&err), "{what}: unexpected error {err:?}");
        msg = err.to_string();
        assert!(!msg.is_empty());
        assert_file_is(path, &before, what);
    }
    msg
}

fn make_pool_file(tag: &str, size: u64) -> (TempPath, Vec<u8>) {
    let tmp = TempPath::new(tag);
    {
        let pool = Pool::create(tmp.path(), &mapped(size, 0, LAYOUT)).unwrap();
        let (a, _) = alloc_filled(&pool, 128, 0, 30);
        pool.set_root(a).unwrap();
        let (_b, _) = alloc_filled(&pool, 300 << 10, a, 31);
        pool.close().unwrap();
    }
    let bytes = file_bytes(tmp.path());
    (tmp, bytes)
}

#[test]
fn short_files_are_truncated() {
    let (_pool_tmp, good) = make_pool_file("short-src", MIB);
    let opts = mapped(MIB, 0, LAYOUT);
    for len in [0usize, 10, 4095] {
        for (kind, content) in [
            ("zeros", vec![0u8; len]),
            ("pool prefix", good[..len].to_vec()),
        ] {
            let tmp = TempPath::new("short");
            std::fs::write(tmp.path(), &content).unwrap();
            let msg = assert_open_fails(tmp.path(), &opts, &format!("{len}-byte {kind}"), |e| {
                matches!(e, Error::Truncated(_))
            });
            assert!(msg.contains("truncated"), "{msg}");
            assert!(
                msg.contains(&len.to_string()),
                "message says how long the file is: {msg}"
            );
        }
    }
    // A full header but nothing after it.
    let tmp = TempPath::new("short-hdr");
    std::fs::write(tmp.path(), &good[..HEADER_LEN]).unwrap();
    assert_open_fails(tmp.path(), &opts, "header only", |e| {
        matches!(e, Error::Truncated(_))
    });
}

#[test]
fn random_bytes_are_foreign() {
    let tmp = TempPath::new("foreign");
    let mut bytes = vec![0u8; MIB as usize];
    Rng::new(7).fill(&mut bytes);
    std::fs::write(tmp.path(), &bytes).unwrap();
    let msg = assert_open_fails(tmp.path(), &mapped(MIB, 0, LAYOUT), "random file", |e| {
        matches!(e, Error::Foreign(_))
    });
    assert!(msg.contains("not a pmhash pool"), "{msg}");
    // A text file that happens to be long enough.
    let text = "hello, world\n".repeat(10_000);
    std::fs::write(tmp.path(), text).unwrap();
    assert_open_fails(tmp.path(), &mapped(MIB, 0, ""), "text file", |e| {
        matches!(e, Error::Foreign(_))
    });
}

#[test]
fn other_format_version_is_rejected() {
    let (tmp, mut bytes) = make_pool_file("version", MIB);
    bytes[8..12].copy_from_slice(&2u32.to_le_bytes());
    std::fs::write(tmp.path(), &bytes).unwrap();
    let msg = assert_open_fails(tmp.path(), &mapped(MIB, 0, LAYOUT), "version 2", |e| {
        matches!(
            e,
            Error::Version {
                found: 2,
                supported: 1
            }
        )
    });
    assert!(msg.contains("version 2"), "{msg}");
}

#[test]
fn truncated_pool_is_rejected() {
    let (tmp, bytes) = make_pool_file("trunc", MIB);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(tmp.path())
        .unwrap();
    f.set_len(bytes.len() as u64 / 2).unwrap();
    drop(f);
    let msg = assert_open_fails(tmp.path(), &mapped(MIB, 0, LAYOUT), "half a pool", |e| {
        matches!(e, Error::Truncated(_))
    });
    assert!(
        msg.contains(&MIB.to_string()),
        "message gives the expected size: {msg}"
    );
    // One byte short.
    std::fs::write(tmp.path(), &bytes[..bytes.len() - 1]).unwrap();
    assert_open_fails(tmp.path(), &mapped(MIB, 0, LAYOUT), "one byte short", |e| {
        matches!(e, Error::Truncated(_))
    });
}

#[test]
fn wrong_layout_is_rejected() {
    let (tmp, _) = make_pool_file("layout", MIB);
    let msg = assert_open_fails(
        tmp.path(),
        &mapped(MIB, 0, "otherengine"),
        "wrong layout",
        |e| matches!(e, Error::WrongLayout { found, expected } if found == LAYOUT && expected == "otherengine"),
    );
    assert!(msg.contains(LAYOUT) && msg.contains("otherengine"), "{msg}");
}

#[test]
fn single_byte_header_corruption_is_detected_or_harmless() {
    // Two base files: one left open after two set_root calls (the slots hold
    // different roots), one closed cleanly.
    for (case, close) in [("dirty", false), ("clean", true)] {
        let tmp = TempPath::new("hdrfuzz");
        let opts = mapped(2 * CHUNK, 0, LAYOUT);
        {
            let pool = Pool::create(tmp.path(), &opts).unwrap();
            let (a, _) = alloc_filled(&pool, 64, 0, 40);
            let (b, _) = alloc_filled(&pool, 64, 0, 41);
            pool.set_root(a).unwrap();
            pool.set_root(b).unwrap();
            if close {
                pool.close().unwrap();
            }
        }
        let good = file_bytes(tmp.path());
        let (cur, cur_slot) = State::current(&good[..HEADER_LEN]).unwrap();
        let stale_slot = 1 - cur_slot;
        let stale_range =
            SLOT_OFFSET + stale_slot * SLOT_LEN..SLOT_OFFSET + (stale_slot + 1) * SLOT_LEN;
        let cur_range = SLOT_OFFSET + cur_slot * SLOT_LEN..SLOT_OFFSET + (cur_slot + 1) * SLOT_LEN;
        let stale = State::decode(&good[stale_range.clone()]).expect("both slots valid");
        assert!(stale.seq < cur.seq);

        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(tmp.path())
            .unwrap();
        let mut rng = Rng::new(0xc0ffee ^ close as u64);
        let (mut errs, mut oks) = (0, 0);
        for i in 0..400 {
            let pos = rng.below(192) as usize;
            let val = good[pos] ^ (1 + rng.below(255) as u8);
            file.write_all_at(&[val], pos as u64).unwrap();
            let mut expect = good.clone();
            expect[pos] = val;
            let what = format!("{case} #{i}: byte {pos} {:#04x} -> {val:#04x}", good[pos]);
            match Pool::open(tmp.path(), &opts) {
                Err(e) => {
                    errs += 1;
                    assert_file_is(tmp.path(), &expect, &what);
                    assert!(!e.to_string().is_empty());
                    match pos {
                        0..=7 => assert!(matches!(e, Error::Foreign(_)), "{what}: {e:?}"),
                        8..=11 => assert!(matches!(e, Error::Version { .. }), "{what}: {e:?}"),
                        12..=63 => assert!(matches!(e, Error::Corrupt(_)), "{what}: {e:?}"),
                        _ => panic!(
                            "{what}: one torn state slot must not make the pool unopenable: {e}"
                        ),
                    }
                }
                Ok(pool) => {
                    oks += 1;
                    if stale_range.contains(&pos) {
                        assert_eq!(pool.root(), cur.root, "{what}");
                        assert_eq!(pool.was_clean(), cur.clean == 1, "{what}");
                    } else if cur_range.contains(&pos) {
                        // The newest slot fails its checksum: the previous
                        // state is in force (as after a torn update).
                        assert_eq!(pool.root(), stale.root, "{what}");
                        assert_eq!(pool.was_clean(), stale.clean == 1, "{what}");
                    } else {
                        panic!("{what}: a corrupt identity line was accepted");
                    }
                    assert_eq!(pool.size(), 2 * CHUNK);
                    assert_eq!(pool.stats().blocks_in_use, 2, "{what}");
                    drop(pool);
                }
            }
            // Restore the pristine file for the next round.
            file.write_all_at(&good, 0).unwrap();
        }
        assert!(
            errs > 100 && oks > 100,
            "{case}: {errs} errors, {oks} opens"
        );
    }
}

#[test]
fn corrupt_chunk_words_are_detected_and_leave_the_file_alone() {
    let tmp = TempPath::new("chunkword");
    let opts = mapped(MIB, 0, LAYOUT);
    let (run_off, ext_off);
    {
        let pool = Pool::create(tmp.path(), &opts).unwrap();
        (run_off, _) = alloc_filled(&pool, 64, 0, 50);
        (ext_off, _) = alloc_filled(&pool, 300 << 10, 0, 51);
        pool.close().unwrap();
    }
    let good = file_bytes(tmp.path());
    let used: Vec<u64> = vec![run_off / CHUNK, ext_off / CHUNK];
    assert_ne!(used[0], used[1]);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(tmp.path())
        .unwrap();
    let mut rng = Rng::new(99);
    for &k in &used {
        for byte in 0..8u64 {
            for _ in 0..4 {
                let pos = (k * CHUNK + byte) as usize;
                let val = good[pos] ^ (1 + rng.below(255) as u8);
                file.write_all_at(&[val], pos as u64).unwrap();
                let mut expect = good.clone();
                expect[pos] = val;
                let what = format!("chunk {k} byte {byte} -> {val:#04x}");
                for read_only in [false, true] {
                    let o = PoolOptions {
                        read_only,
                        ..opts.clone()
                    };
                    let err = Pool::open(tmp.path(), &o)
                        .err()
                        .unwrap_or_else(|| panic!("{what}: opened"));
                    assert!(matches!(err, Error::Corrupt(_)), "{what}: {err:?}");
                    let msg = err.to_string();
                    assert!(
                        msg.contains("corrupt") && msg.contains(&format!("chunk {k}")),
                        "{msg}"
                    );
                    assert_file_is(tmp.path(), &expect, &what);
                }
                file.write_all_at(&good, 0).unwrap();
            }
        }
    }
    // The pristine file still opens.
    let pool = Pool::open(tmp.path(), &opts).unwrap();
    assert_eq!(pool.stats().blocks_in_use, 2);
}

#[test]
fn read_only_open_recovers_in_memory_and_never_writes() {
    let tmp = TempPath::new("readonly");
    let opts = mapped(2 * MIB, 0, LAYOUT);
    let (table, base, pending, linked, linked_size);
    {
        let pool = Pool::create(tmp.path(), &opts).unwrap();
        (table, _) = alloc_filled(&pool, 256, 0, 60);
        pool.zero(table, 256);
        pool.persist(table, 256);
        pool.set_root(table).unwrap();
        base = pool.stats();
        // Reserved, never linked: recovery must free it.
        let r = pool.reserve(1000, Link::Pointer { owner: table }).unwrap();
        pending = r.offset();
        // Reserved and linked, never committed: recovery must keep it.
        let r2 = pool
            .reserve(
                300 << 10,
                Link::Word {
                    owner: table + 8,
                    value: 0,
                },
            )
            .unwrap();
        linked = r2.offset();
        linked_size = r2.size();
        // The owner word already holds the lane's value (0): linked.
        assert_eq!(pool.stats().blocks_in_use, base.blocks_in_use + 2);
        // Dropped without commit or close: a crash.
    }
    let before = file_bytes(tmp.path());
    for round in 0..2 {
        let ro = PoolOptions {
            read_only: true,
            ..opts.clone()
        };
        let pool = Pool::open(tmp.path(), &ro).unwrap();
        assert!(pool.is_read_only());
        let st = pool.stats();
        assert_eq!(st.recovered_lanes, 2, "round {round}: recovery ran");
        assert_eq!(
            st.bytes_in_use,
            base.bytes_in_use + linked_size,
            "round {round}"
        );
        assert_eq!(st.blocks_in_use, base.blocks_in_use + 1);
        assert!(matches!(
            pool.reserve(64, Link::Nothing),
            Err(Error::InvalidArgument(_))
        ));
        assert!(pool.begin_free(table, Link::Nothing).is_err());
        pool.close().unwrap();
        pool.sync().unwrap();
        drop(pool);
        assert_file_is(tmp.path(), &before, "read-only open");
    }
    let pool = Pool::open(tmp.path(), &opts).unwrap();
    let st = pool.stats();
    assert_eq!(st.recovered_lanes, 2);
    assert_eq!(
        st.bytes_in_use,
        base.bytes_in_use + linked_size,
        "the unlinked block is reclaimed"
    );
    assert!(
        pool.free(pending).is_err(),
        "the unlinked reservation is free"
    );
    pool.close().unwrap();
    drop(pool);
    let pool = Pool::open(tmp.path(), &opts).unwrap();
    assert_eq!(pool.stats().recovered_lanes, 0, "recovery was durable");
    assert_eq!(pool.stats().bytes_in_use, base.bytes_in_use + linked_size);
    // The kept block can be freed normally.
    let t = pool
        .begin_free(
            linked,
            Link::Word {
                owner: table + 8,
                value: 0,
            },
        )
        .unwrap();
    pool.store_u64(table + 8, 1);
    pool.persist(table + 8, 8);
    pool.finish_free(t);
    assert_eq!(pool.stats().bytes_in_use, base.bytes_in_use);
}

// ----- header state double-buffering -------------------------------------------------

fn slot_range(slot: usize) -> std::ops::Range<usize> {
    SLOT_OFFSET + slot * SLOT_LEN..SLOT_OFFSET + (slot + 1) * SLOT_LEN
}

#[test]
fn torn_newest_state_slot_falls_back_to_the_previous_root() {
    let tmp = TempPath::new("slots");
    let opts = mapped(MIB, 0, LAYOUT);
    let pool = Pool::create(tmp.path(), &opts).unwrap();
    let roots: Vec<u64> = (0..4)
        .map(|i| alloc_filled(&pool, 64, 0, 70 + i).0)
        .collect();
    for &r in &roots {
        pool.set_root(r).unwrap();
    }
    // The mapping is shared: the file holds the latest stores.
    let dirty = file_bytes(tmp.path());
    pool.close().unwrap();
    drop(pool);
    let clean = file_bytes(tmp.path());

    let copy = TempPath::new("slots-copy");
    for (what, image, want_root, want_clean) in [
        // Newest slot = last set_root; previous = the set_root before it.
        ("dirty", &dirty, roots[2], false),
        // Newest slot = the close; previous = the last set_root (not clean).
        ("clean", &clean, roots[3], false),
    ] {
        let (_, newest) = State::current(&image[..HEADER_LEN]).unwrap();
        let mut torn = image.clone();
        torn[slot_range(newest).start + 20] ^= 0x40;
        std::fs::write(copy.path(), &torn).unwrap();
        let pool = Pool::open(copy.path(), &opts).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(pool.root(), want_root, "{what}");
        assert_eq!(pool.was_clean(), want_clean, "{what}");
        // The pool works and its next state update is durable.
        pool.set_root(roots[1]).unwrap();
        pool.close().unwrap();
        drop(pool);
        let pool = Pool::open(copy.path(), &opts).unwrap();
        assert_eq!(pool.root(), roots[1], "{what}");
        assert!(pool.was_clean());
        drop(pool);
        std::fs::remove_file(copy.path()).unwrap();

        // Both slots torn: no state to trust.
        let mut both = image.clone();
        both[slot_range(0).start + 3] ^= 1;
        both[slot_range(1).start + 40] ^= 0x80;
        std::fs::write(copy.path(), &both).unwrap();
        let msg = assert_open_fails(
            copy.path(),
            &opts,
            &format!("{what}: both slots torn"),
            |e| matches!(e, Error::Corrupt(_)),
        );
        assert!(msg.contains("state slot"), "{msg}");
        std::fs::remove_file(copy.path()).unwrap();
    }
}

#[test]
fn set_root_never_makes_the_pool_unopenable() {
    for bad in [8u64, 100, CHUNK - 8, CHUNK + 4, MIB - 4, MIB] {
        let tmp = TempPath::new("badroot");
        let opts = mapped(MIB, 0, LAYOUT);
        let pool = Pool::create(tmp.path(), &opts).unwrap();
        let (good, _) = alloc_filled(&pool, 64, 0, 80);
        pool.set_root(good).unwrap();
        match pool.set_root(bad) {
            Err(e) => {
                assert!(
                    matches!(e, Error::InvalidArgument(_) | Error::Corrupt(_)),
                    "{bad:#x}: {e:?}"
                );
                assert_eq!(pool.root(), good, "a refused root changes nothing");
            }
            Ok(()) => assert_eq!(pool.root(), bad),
        }
        pool.close().unwrap();
        drop(pool);
        let pool = Pool::open(tmp.path(), &opts).unwrap_or_else(|e| {
            panic!("set_root({bad:#x}) was accepted but the pool no longer opens: {e}")
        });
        drop(pool);
    }
}

#[test]
fn crafted_lanes_are_corrupt_errors_not_panics() {
    const LANE0: u64 = 4096;
    const EXT: u64 = 1 << 63;
    let tmp = TempPath::new("lanes");
    let opts = mapped(MIB, 0, LAYOUT);
    let (slot, ext, owner);
    {
        let pool = Pool::create(tmp.path(), &opts).unwrap();
        (owner, _) = alloc_filled(&pool, 64, 0, 90);
        pool.set_root(owner).unwrap();
        (slot, _) = alloc_filled(&pool, 64, owner, 91);
        (ext, _) = alloc_filled(&pool, 300 << 10, 0, 92);
        pool.close().unwrap();
    }
    // Our CRC agrees with the pool's: a copy of the identity line checks.
    let good = file_bytes(tmp.path());
    assert_eq!(
        crc32(&good[..60]).to_le_bytes(),
        good[60..64],
        "test CRC matches the format's"
    );
    let size = MIB;
    let cases: Vec<(&str, [u8; 64])> = vec![
        ("unknown state", lane_record(3, slot, 0, owner, slot)),
        ("block in chunk 0", lane_record(1, 64, 0, owner, 1)),
        (
            "block past the pool",
            lane_record(1, size + 64, 0, owner, 1),
        ),
        ("block u64::MAX", lane_record(2, u64::MAX, 0, owner, 1)),
        ("not a slot boundary", lane_record(1, slot + 8, 0, owner, 1)),
        ("wrong class", lane_record(1, slot, 5, owner, 1)),
        (
            "extent lane in a run",
            lane_record(1, slot, EXT | 1, owner, 1),
        ),
        ("slot lane on an extent", lane_record(1, ext, 0, owner, 1)),
        (
            "extent past the pool",
            lane_record(1, ext, EXT | 1000, owner, 1),
        ),
        ("extent of 0 chunks", lane_record(1, ext, EXT, owner, 1)),
        ("unaligned owner", lane_record(1, slot, 0, owner + 3, slot)),
        ("owner past the pool", lane_record(1, slot, 0, size, slot)),
        ("owner in the header", lane_record(1, slot, 0, 64, slot)),
        (
            "owner u64::MAX - 7",
            lane_record(1, slot, 0, u64::MAX - 7, slot),
        ),
        (
            "owner u64::MAX - 15",
            lane_record(2, slot, 0, u64::MAX - 15, slot),
        ),
    ];
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(tmp.path())
        .unwrap();
    for lane in [0u64, 63] {
        for (what, rec) in &cases {
            let what = format!("lane {lane}: {what}");
            file.write_all_at(rec, LANE0 + 64 * lane).unwrap();
            let before = file_bytes(tmp.path());
            for read_only in [false, true] {
                let o = PoolOptions {
                    read_only,
                    ..opts.clone()
                };
                let got = std::panic::catch_unwind(|| Pool::open(tmp.path(), &o).err());
                let err = match got {
                    Ok(Some(e)) => e,
                    Ok(None) => panic!("{what}: opened"),
                    Err(_) => panic!("{what}: open panicked"),
                };
                assert!(matches!(err, Error::Corrupt(_)), "{what}: {err:?}");
                assert!(err.to_string().contains("lane"), "{what}: {err}");
                assert_file_is(tmp.path(), &before, &what);
            }
            file.write_all_at(&good, 0).unwrap();
        }
    }
    // A torn lane (bad CRC) is ignored: the change it announces never began.
    let mut torn = lane_record(1, slot, 0, owner, 12345);
    torn[61] ^= 1;
    file.write_all_at(&torn, LANE0 + 64 * 5).unwrap();
    let pool = Pool::open(tmp.path(), &opts).unwrap();
    assert_eq!(pool.stats().recovered_lanes, 0);
    assert_eq!(pool.stats().blocks_in_use, 3);
    drop(pool);
    // A well-formed lane for an unlinked reservation of the slot frees it.
    file.write_all_at(&good, 0).unwrap();
    file.write_all_at(&lane_record(1, slot, 0, owner, 12345), LANE0 + 64 * 7)
        .unwrap();
    let pool = Pool::open(tmp.path(), &opts).unwrap();
    assert_eq!(pool.stats().recovered_lanes, 1);
    assert_eq!(pool.stats().blocks_in_use, 2, "the unlinked slot is freed");
    assert!(pool.free(slot).is_err());
}
