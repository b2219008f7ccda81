//! Property tests of the store against a `BTreeMap` model: random puts,
//! inserts, updates, deletes (with their bool results), gets, scans and
//! explicit GC over byte keys of mixed lengths (empty, 1, 8, the 23/24-byte
//! inline/heap boundary of the index, up to 4096 bytes), checked after each
//! phase with `for_each`, `len`, `get`, a full scan and `check()` (which must
//! also account for every PM byte in use). Reopens: a clean close (the
//! index comes from the image), a drop without close (a log scan), and
//! recovery with different thread counts. A crash image taken in the middle
//! of a GC reclaim must not let a deleted key come back.

mod common;

use common::{crash_then_clean_reopen, small_opts, verify, Model};
use engine::testkit::TempDir;
use std::ops::Bound;

use std::sync::{Arc, Mutex};

use engine::testkit::{mem_pool, test_pool_options, Rng};
use pmem::{CrashChoice, Mode, Pool};
use pmhash_store::{CreateOptions, OpenOptions, Options, Store, LAYOUT};

type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// A scratch directory, removed on drop.
fn temp_dir(tag: &str) -> TempDir {
    TempDir::new("store-model", tag)
}

fn mem_store(opts: &Options, seed: u64) -> (Arc<Pool>, Store) {
    let pool = mem_pool(&test_pool_options(
        LAYOUT,
        b"store-model-test",
        Mode::Volatile,
        opts.create.pool_size,
        opts.open.max_pool_size,
        seed,
    ));
    let s = Store::open_pool(pool.clone(), opts.clone()).expect("open a fresh store");
    assert_eq!(s.stats().opened_from, pmhash_store::OpenedFrom::Created);
    (pool, s)
}

/// One cluster (so every entry goes to the same files), no RAF cache, GC
/// at `gc_threshold`.
fn one_cluster_opts(gc_threshold: f64) -> Options {
    Options {
        create: CreateOptions {
            clusters: 1,
            ..small_opts().create
        },
        open: OpenOptions {
            gc_threshold,
            raf_bytes: 0,
            ..small_opts().open
        },
    }
}

/// A simulated pool (crash images at fences) sized for `opts`.
fn sim_pool(opts: &Options, seed: u64) -> Arc<Pool> {
    mem_pool(&test_pool_options(
        LAYOUT,
        b"store-model-test",
        Mode::Simulated,
        opts.create.pool_size,
        opts.open.max_pool_size,
        seed,
    ))
}

/// Key lengths drawn in turn: the empty key, 1 byte, 8 bytes (the point
/// index's fast path, twice), around the 23-byte inline limit of the
/// index, and long heap keys.
const KEY_LENS: [usize; 11] = [0, 1, 8, 8, 22, 23, 24, 25, 40, 200, 1000];

/// A universe of `n` keys (the empty key and 1-byte keys repeat, which is
/// fine: the model is keyed by bytes). `max_len` caps the lengths.
fn key_universe(n: usize, seed: u64, max_len: usize) -> Vec<Vec<u8>> {
    let mut rng = Rng::new(seed ^ 0x6b65_7973);
    (0..n)
        .map(|i| {
            let len = KEY_LENS[i % KEY_LENS.len()].min(max_len);
            let mut k: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            // Common prefixes make the order and scans interesting.
            if len >= 2 && i % 3 == 0 {
                k[0] = b'p';
                k[1] = (i % 7) as u8;
            }
            k
        })
        .collect()
}

/// A value of `len` bytes that names the op that wrote it.
fn value(op: u64, len: usize) -> Vec<u8> {
    let mut r = Rng::new(op);
    let mut v: Vec<u8> = (0..len).map(|_| r.next() as u8).collect();
    let tag = op.to_le_bytes();
    let n = tag.len().min(len);
    v[..n].copy_from_slice(&tag[..n]);
    v
}

/// A value length: 0 bytes sometimes, small mostly, up to `max` rarely.
fn value_len(rng: &mut Rng, max: usize) -> usize {
    match rng.below(10) {
        0 => 0,
        // 8 bytes: an 8-byte key's value is then inline in the point index.
        1..=2 => 8,
        3..=5 => rng.below(64) as usize,
        6..=8 => rng.below(512) as usize,
        _ => rng.below(max as u64 + 1) as usize,
    }
}

/// What the model says a scan returns (empty when `end <= start`).
fn model_scan(
    m: &Model,
    start: &[u8],
    end: Option<&[u8]>,
    limit: usize,
) -> Vec<(Vec<u8>, Vec<u8>)> {
    if let Some(e) = end {
        if e <= start {
            return Vec::new();
        }
    }
    let hi = match end {
        Some(e) => Bound::Excluded(e.to_vec()),
        None => Bound::Unbounded,
    };
    m.range((Bound::Included(start.to_vec()), hi))
        .take(limit)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Counts of what `run_ops` did, so a test can assert that the workload
/// really exercised each path.
#[derive(Default, Debug)]
struct Done {
    inserts_true: u64,
    inserts_false: u64,
    updates_true: u64,
    updates_false: u64,
    deletes_true: u64,
    deletes_false: u64,
    scans_nonempty: u64,
    too_big: u64,
    reclaimed: u64,
}

/// A run of random operations.
struct Run {
    /// How many.
    n: usize,
    /// The longest value.
    max_v: usize,
    /// A key/value pair whose entry exceeds a file (or `None` if the files
    /// are big enough for anything).
    too_big: Option<(usize, usize)>,
    /// The first operation's number (values are made from it).
    op0: u64,
}

/// The operations of `run` on `s`, mirrored in `m` and checked op by op.
fn run_ops(s: &Store, m: &mut Model, keys: &[Vec<u8>], rng: &mut Rng, run: &Run, done: &mut Done) {
    let Run {
        n,
        max_v,
        too_big,
        op0,
    } = *run;
    for i in 0..n {
        let op = op0 + i as u64;
        let k = &keys[rng.below(keys.len() as u64) as usize];
        match rng.below(100) {
            0..=29 => {
                let v = value(op, value_len(rng, max_v));
                s.put(k, &v).unwrap();
                m.insert(k.clone(), v);
            }
            30..=39 => {
                let v = value(op, value_len(rng, max_v));
                let r = s.insert(k, &v).unwrap();
                assert_eq!(r, !m.contains_key(k), "op {op}: insert result");
                if r {
                    m.insert(k.clone(), v);
                    done.inserts_true += 1;
                } else {
                    done.inserts_false += 1;
                }
            }
            40..=49 => {
                let v = value(op, value_len(rng, max_v));
                let r = s.update(k, &v).unwrap();
                assert_eq!(r, m.contains_key(k), "op {op}: update result");
                if r {
                    m.insert(k.clone(), v);
                    done.updates_true += 1;
                } else {
                    done.updates_false += 1;
                }
            }
            50..=64 => {
                let r = s.delete(k).unwrap();
                assert_eq!(r, m.remove(k).is_some(), "op {op}: delete result");
                if r {
                    done.deletes_true += 1;
                } else {
                    done.deletes_false += 1;
                }
            }
            65..=84 => {
                assert_eq!(s.get(k).unwrap().as_ref(), m.get(k), "op {op}: get");
            }
            85..=94 => {
                let start: Vec<u8> = if rng.below(4) == 0 {
                    (0..rng.below(4)).map(|_| rng.next() as u8).collect()
                } else {
                    keys[rng.below(keys.len() as u64) as usize].clone()
                };
                let end: Option<Vec<u8>> = match rng.below(3) {
                    0 => None,
                    1 => Some(keys[rng.below(keys.len() as u64) as usize].clone()),
                    _ => Some((0..1 + rng.below(3)).map(|_| rng.next() as u8).collect()),
                };
                let limit = match rng.below(4) {
                    0 => 0,
                    1 => usize::MAX,
                    _ => 1 + rng.below(40) as usize,
                };
                let got = s.scan(&start, end.as_deref(), limit).unwrap();
                let want = model_scan(m, &start, end.as_deref(), limit);
                assert_eq!(
                    got.len(),
                    want.len(),
                    "op {op}: scan length (start {} bytes, end {:?} bytes, limit {limit})",
                    start.len(),
                    end.as_ref().map(|e| e.len())
                );
                assert!(got == want, "op {op}: scan contents differ from the model");
                if !got.is_empty() {
                    done.scans_nonempty += 1;
                }
            }
            95..=97 => {
                done.reclaimed += s.gc(usize::MAX).unwrap() as u64;
            }
            _ => {
                if let Some((kl, vl)) = too_big {
                    let big_k = vec![0xa5u8; kl];
                    let r = s.put(&big_k, &vec![1u8; vl]);
                    assert!(
                        r.is_err(),
                        "op {op}: an entry larger than a file was accepted"
                    );
                    assert_eq!(s.get(&big_k).unwrap(), None);
                    // An existing key keeps its value when the new one fails.
                    let r = s.put(k, &vec![2u8; kl + vl]);
                    assert!(
                        r.is_err(),
                        "op {op}: an entry larger than a file was accepted"
                    );
                    assert_eq!(
                        s.get(k).unwrap().as_ref(),
                        m.get(k),
                        "op {op}: a refused put changed the key"
                    );
                    done.too_big += 1;
                }
            }
        }
    }
}

/// Several seeds of the random workload on small files with explicit GC,
/// checked after each phase; GC must have reclaimed files.
#[test]
fn random_ops_match_the_model_with_gc() {
    let mut total_reclaimed = 0;
    for seed in 1..=8u64 {
        let opts = small_opts();
        let (_pool, s) = mem_store(&opts, seed);
        let keys = key_universe(160 + 40 * seed as usize, seed, 1000);
        let mut rng = Rng::new(seed);
        let mut m = Model::new();
        let mut done = Done::default();
        for phase in 0..6 {
            let run = Run {
                n: 1500,
                max_v: 2000,
                too_big: Some((1000, 3100)),
                op0: seed << 32 | phase << 16,
            };
            run_ops(&s, &mut m, &keys, &mut rng, &run, &mut done);
            verify(&s, &m, &format!("seed {seed} phase {phase}"));
            done.reclaimed += s.gc(usize::MAX).unwrap() as u64;
            verify(&s, &m, &format!("seed {seed} phase {phase} after gc"));
        }
        let st = s.stats();
        assert!(
            st.files > 1,
            "seed {seed}: the workload never filled a file"
        );
        assert_eq!(
            st.files_reclaimed, done.reclaimed,
            "seed {seed}: files_reclaimed vs gc() results"
        );
        assert!(done.inserts_true > 0 && done.inserts_false > 0, "{done:?}");
        assert!(done.updates_true > 0 && done.updates_false > 0, "{done:?}");
        assert!(done.deletes_true > 0 && done.deletes_false > 0, "{done:?}");
        assert!(done.scans_nonempty > 0 && done.too_big > 0, "{done:?}");
        total_reclaimed += st.files_reclaimed;
        // Right after a full GC no sealed file is past the threshold, so
        // the log is at most about twice the live data plus the active files.
        assert!(st.live_bytes <= st.log_bytes, "{st:?}");
        s.close().unwrap();
    }
    assert!(total_reclaimed > 0, "GC never reclaimed a file");
}

/// A workload that only overwrites a few keys: almost every file is dead,
/// GC must reclaim most of them and the store must still match.
#[test]
fn gc_reclaims_overwritten_files() {
    let (pool, s) = mem_store(&small_opts(), 77);
    let keys = key_universe(20, 77, 200);
    let mut m = Model::new();
    let mut rng = Rng::new(77);
    for op in 0..4000u64 {
        let k = &keys[rng.below(keys.len() as u64) as usize];
        let v = value(op, rng.below(300) as usize);
        s.put(k, &v).unwrap();
        m.insert(k.clone(), v);
    }
    let before = s.stats();
    assert!(before.files > 20, "{before:?}");
    assert!(before.space_amplification > 2.0, "{before:?}");
    let n = s.gc(usize::MAX).unwrap();
    let after = s.stats();
    assert!(n > 0, "gc() reclaimed nothing: {after:?}");
    assert_eq!(after.files_reclaimed, n as u64);
    assert!(after.files < before.files, "{before:?} -> {after:?}");
    assert!(after.pm_bytes < before.pm_bytes, "{before:?} -> {after:?}");
    assert!(
        after.log_bytes < before.log_bytes,
        "{before:?} -> {after:?}"
    );
    verify(&s, &m, "after gc");
    // The relocated copies survive a crash (log scan) and a clean reopen.
    drop(s);
    crash_then_clean_reopen(&pool, &m, "after gc");
}

/// `n` distinct 16-byte keys with one `key_hash` (the hash chains two
/// `fmix64` rounds, so the second word can cancel any difference in the
/// first): the DRAM point index holds hashes, not keys, and must tell them
/// apart by their log entries.
fn colliding_keys(n: u64) -> Vec<Vec<u8>> {
    use engine::hash::fmix64;
    let h0 = fmix64(16 ^ 0x9e37_79b9_7f4a_7c15);
    let target = fmix64(h0 ^ 1) ^ 0xabcd;
    let keys: Vec<Vec<u8>> = (1..=n)
        .map(|a: u64| {
            let b = fmix64(h0 ^ a) ^ target ^ 0xabcd;
            [a.to_le_bytes(), b.to_le_bytes()].concat()
        })
        .collect();
    let h = pmhash_store::key_hash(&keys[0]);
    assert!(keys.iter().all(|k| pmhash_store::key_hash(k) == h));
    keys
}

#[test]
fn keys_with_one_hash_stay_apart_through_deletes_gc_and_reopen() {
    let (pool, s) = mem_store(&small_opts(), 78);
    let keys = colliding_keys(40);
    let mut m = Model::new();
    let mut rng = Rng::new(78);
    for op in 0..3000u64 {
        let k = &keys[rng.below(keys.len() as u64) as usize];
        if rng.below(4) == 0 {
            assert_eq!(s.delete(k).unwrap(), m.remove(k).is_some(), "op {op}");
        } else {
            let v = value(op, rng.below(40) as usize);
            s.put(k, &v).unwrap();
            m.insert(k.clone(), v);
        }
        if op % 500 == 0 {
            s.gc(usize::MAX).unwrap();
        }
    }
    assert!(m.len() > 10, "too few keys left to show anything");
    verify(&s, &m, "colliding keys");
    drop(s);
    crash_then_clean_reopen(&pool, &m, "colliding keys");
}

/// File-backed store: clean close and reopen (image), drop without close
/// and reopen (log scan), each followed by more random work; several seeds.
#[test]
fn reopen_clean_and_after_drop() {
    for seed in 10..13u64 {
        let dir = temp_dir(&format!("reopen{seed}"));
        let opts = Options {
            create: small_opts().create,
            open: OpenOptions {
                mode: Mode::Mapped,
                ..small_opts().open
            },
        };
        let keys = key_universe(150, seed, 1000);
        let mut rng = Rng::new(seed);
        let mut m = Model::new();
        let mut done = Done::default();
        let mut op0 = seed << 40;
        for round in 0..4 {
            let s = Store::open(dir.path(), opts.clone()).unwrap();
            let from = s.stats().opened_from;
            match round {
                0 => assert_eq!(from, pmhash_store::OpenedFrom::Created),
                1 | 3 => assert_eq!(
                    from,
                    pmhash_store::OpenedFrom::Image,
                    "round {round}: after a clean close"
                ),
                _ => assert_eq!(
                    from,
                    pmhash_store::OpenedFrom::LogScan,
                    "round {round}: after a drop without close"
                ),
            }
            if round > 0 {
                assert!(s.stats().open_ms >= 0.0);
                if from == pmhash_store::OpenedFrom::LogScan {
                    assert!(s.stats().recovered_entries > 0);
                }
            }
            verify(&s, &m, &format!("seed {seed} round {round} after open"));
            let run = Run {
                n: 1500,
                max_v: 1500,
                too_big: None,
                op0,
            };
            run_ops(&s, &mut m, &keys, &mut rng, &run, &mut done);
            op0 += 1 << 20;
            verify(&s, &m, &format!("seed {seed} round {round} after ops"));
            if round % 2 == 0 {
                s.close().unwrap();
                assert!(
                    s.put(b"after close", b"x").is_err(),
                    "a put after close() was accepted"
                );
                assert!(
                    s.delete(&keys[0]).is_err(),
                    "a delete after close() was accepted"
                );
            }
            // Odd rounds: dropped without close, like a crash of the process.
            drop(s);
        }
        let s = Store::open(dir.path(), opts.clone()).unwrap();
        assert_eq!(s.stats().opened_from, pmhash_store::OpenedFrom::LogScan);
        verify(&s, &m, &format!("seed {seed} final"));
        assert!(done.reclaimed > 0 || s.stats().files > 1);
    }
}

/// Recovery with 1 and with 3 threads (log scan and image) gives the same
/// content, equal to the model, and the same reachable bytes.
#[test]
fn recovery_thread_count_does_not_change_the_content() {
    let dir = temp_dir("threads");
    let opts = Options {
        create: CreateOptions {
            clusters: 7,
            ..small_opts().create
        },
        open: OpenOptions {
            mode: Mode::Mapped,
            ..small_opts().open
        },
    };
    let keys = key_universe(400, 5, 1000);
    let mut rng = Rng::new(5);
    let mut m = Model::new();
    let mut done = Done::default();
    {
        let s = Store::open(dir.path(), opts.clone()).unwrap();
        let run = Run {
            n: 5000,
            max_v: 1500,
            too_big: None,
            op0: 0,
        };
        run_ops(&s, &mut m, &keys, &mut rng, &run, &mut done);
        verify(&s, &m, "before the drop");
    }
    let content = |threads: usize| -> (Pairs, pmhash_store::OpenedFrom, u64) {
        let s = Store::open(
            dir.path(),
            Options {
                create: opts.create.clone(),
                open: OpenOptions {
                    recovery_threads: threads,
                    ..opts.open.clone()
                },
            },
        )
        .unwrap();
        let from = s.stats().opened_from;
        verify(&s, &m, &format!("{threads} recovery threads ({from})"));
        let (_, reach) = s.check().unwrap();
        let all = s.scan(b"", None, usize::MAX).unwrap();
        (all, from, reach)
    };
    // Both opens below are log scans (the store is dropped, not closed).
    let (a, fa, ra) = content(1);
    let (b, fb, rb) = content(3);
    assert_eq!(
        (fa, fb),
        (
            pmhash_store::OpenedFrom::LogScan,
            pmhash_store::OpenedFrom::LogScan
        )
    );
    assert!(a == b, "1 and 3 recovery threads disagree");
    assert_eq!(ra, rb);
    // Now through the image.
    let s = Store::open(dir.path(), opts.clone()).unwrap();
    s.close().unwrap();
    drop(s);
    let (c, fc, _) = content(3);
    assert_eq!(fc, pmhash_store::OpenedFrom::Image);
    assert!(
        a == c,
        "image open with 3 threads disagrees with the log scan"
    );
    let s = Store::open(dir.path(), opts.clone()).unwrap();
    s.close().unwrap();
    drop(s);
    let (d, fd, _) = content(1);
    assert_eq!(fd, pmhash_store::OpenedFrom::Image);
    assert!(a == d, "image open with 1 thread disagrees");
}

/// Keys up to 4096 bytes and values up to 1 MiB, in 2 MiB files: every
/// boundary length goes in, comes back, scans in order and survives both
/// kinds of reopen.
#[test]
fn largest_keys_and_values() {
    let dir = temp_dir("large");
    let opts = Options {
        create: CreateOptions {
            pool_size: 16 << 20,
            extent_size: 2 << 20,
            ..small_opts().create
        },
        open: OpenOptions {
            mode: Mode::Mapped,
            max_pool_size: 128 << 20,
            ..small_opts().open
        },
    };
    let mut m = Model::new();
    {
        let s = Store::open(dir.path(), opts.clone()).unwrap();
        let big_key = vec![0x7fu8; pmhash_store::MAX_KEY];
        let big_val = value(1, pmhash_store::MAX_VALUE);
        s.put(&big_key, &big_val).unwrap();
        m.insert(big_key.clone(), big_val);
        for (i, kl) in [0usize, 1, 8, 23, 24, 4095, 4096].into_iter().enumerate() {
            let mut k = vec![i as u8; kl];
            if kl > 0 {
                k[0] = 0x10 + i as u8;
            }
            for vl in [0usize, 1, 4096, 100_000] {
                let v = value(kl as u64 * 7 + vl as u64, vl);
                s.put(&k, &v).unwrap();
                m.insert(k.clone(), v);
                assert_eq!(s.get(&k).unwrap().as_ref(), m.get(&k));
            }
        }
        // Overwrite the biggest pair with another 1 MiB value.
        let v2 = value(2, pmhash_store::MAX_VALUE);
        assert!(s.update(&big_key, &v2).unwrap());
        m.insert(big_key.clone(), v2);
        verify(&s, &m, "large, live");
        s.gc(usize::MAX).unwrap();
        verify(&s, &m, "large, after gc");
        s.close().unwrap();
    }
    let s = Store::open(dir.path(), opts.clone()).unwrap();
    assert_eq!(s.stats().opened_from, pmhash_store::OpenedFrom::Image);
    verify(&s, &m, "large, clean reopen");
    let v3 = value(3, pmhash_store::MAX_VALUE);
    s.put(&[0x7f; 4096], &v3).unwrap();
    m.insert(vec![0x7f; 4096], v3);
    assert!(s.delete(&[]).unwrap());
    m.remove(&Vec::new());
    drop(s);
    let s = Store::open(dir.path(), opts).unwrap();
    assert_eq!(s.stats().opened_from, pmhash_store::OpenedFrom::LogScan);
    verify(&s, &m, "large, reopen after drop");
}

/// `get_into_slice` copies what fits and reports the whole length: 8-byte keys
/// with inline 8-byte values (the fast path), with longer and shorter
/// values (the log), other keys, deletes and overwrites that change a
/// value's length both ways, with inline values on and off, before and
/// after a reopen.
#[test]
fn get_in_copies_what_fits_and_reports_the_length() {
    for inline in [true, false] {
        let opts = Options {
            create: small_opts().create,
            open: OpenOptions {
                inline_values: inline,
                ..small_opts().open
            },
        };
        let (pool, s) = mem_store(&opts, 41);
        let k8 = 0x0102_0304_0506_0708u64.to_be_bytes();
        let long = value(5, 100);
        let cases: [(&[u8], &[u8]); 5] = [
            (&k8, b"eightval"),
            (b"\x00\x00\x00\x00\x00\x00\x00\x09", &long),
            (b"\x00\x00\x00\x00\x00\x00\x00\x0a", b"abc"),
            (b"a longer key of 24 bytes", b"12345678"),
            (b"\x00\x00\x00\x00\x00\x00\x00\x0b", b""),
        ];
        for (k, v) in cases {
            s.put(k, v).unwrap();
        }
        let check = |s: &Store, ctx: &str| {
            for (k, v) in cases {
                for cap in [0usize, 3, 8, 200] {
                    let mut buf = vec![0xeeu8; cap];
                    assert_eq!(
                        s.get_into_slice(k, &mut buf).unwrap(),
                        Some(v.len()),
                        "{ctx}: length, cap {cap}"
                    );
                    let n = cap.min(v.len());
                    assert_eq!(&buf[..n], &v[..n], "{ctx}: bytes, cap {cap}");
                    assert!(
                        buf[n..].iter().all(|&b| b == 0xee),
                        "{ctx}: wrote past the value"
                    );
                }
            }
            assert_eq!(
                s.get_into_slice(&[0xff; 8], &mut [0u8; 8]).unwrap(),
                None,
                "{ctx}: absent 8-byte key"
            );
            assert_eq!(
                s.get_into_slice(b"absent", &mut [0u8; 8]).unwrap(),
                None,
                "{ctx}: absent key"
            );
            let too_long = vec![1u8; pmhash_store::MAX_KEY + 1];
            assert_eq!(
                s.get_into_slice(&too_long, &mut [0u8; 8]).unwrap(),
                None,
                "{ctx}: oversized key"
            );
        };
        let ctx = format!("inline {inline}");
        check(&s, &ctx);
        // An inline value becomes a long one and back; a delete.
        s.put(&k8, &long).unwrap();
        assert_eq!(
            s.get_into_slice(&k8, &mut [0u8; 8]).unwrap(),
            Some(100),
            "{ctx}: 8 -> 100 bytes"
        );
        s.put(&k8, b"eightval").unwrap();
        let mut b = [0u8; 8];
        assert_eq!(
            s.get_into_slice(&k8, &mut b).unwrap(),
            Some(8),
            "{ctx}: 100 -> 8 bytes"
        );
        assert_eq!(&b, b"eightval");
        assert!(s.delete(b"\x00\x00\x00\x00\x00\x00\x00\x0b").unwrap());
        assert_eq!(
            s.get_into_slice(b"\x00\x00\x00\x00\x00\x00\x00\x0b", &mut b)
                .unwrap(),
            None,
            "{ctx}: deleted"
        );
        s.put(b"\x00\x00\x00\x00\x00\x00\x00\x0b", b"").unwrap();
        s.close().unwrap();
        drop(s);
        let s = Store::open_pool(pool, opts).unwrap();
        assert_ne!(s.stats().opened_from, pmhash_store::OpenedFrom::Created);
        check(&s, &format!("{ctx}, reopened"));
    }
}

/// A crash at every fence of a GC reclaim that relocates a live entry,
/// followed (after recovery) by a delete of that key and enough GC to
/// reclaim the relocated copy: a second crash must not bring the deleted
/// key back.
///
/// Relocated originals are not marked invalid (the file is freed instead),
/// so a crash between the relocation and the free leaves two valid copies;
/// the delete's history then names only the copy.
#[test]
fn crash_during_gc_then_delete_does_not_resurrect() {
    let opts = one_cluster_opts(0.3);
    let pool = sim_pool(&opts, 99);
    let s = Store::open_pool(pool.clone(), opts.clone()).unwrap();
    let key = |i: u64| format!("key-{i:04}").into_bytes();
    let mut m = Model::new();
    // 504-byte entries (8-byte key, 450-byte value): exactly 8 fill a
    // 4096-byte file. File A: keys 0..8; then keys 1, 3, 5, 7 are
    // overwritten into file B, which seals A half dead.
    for i in 0..8u64 {
        let v = value(i, 450);
        s.put(&key(i), &v).unwrap();
        m.insert(key(i), v);
    }
    for i in (0..8u64).filter(|i| i % 2 == 1) {
        let v = value(100 + i, 450);
        s.put(&key(i), &v).unwrap();
        m.insert(key(i), v);
    }
    assert_eq!(s.stats().files, 2);
    // Crash images at every fence of the reclaim.
    let images: Arc<Mutex<Vec<Vec<u8>>>> = Arc::new(Mutex::new(Vec::new()));
    let im = images.clone();
    pool.set_fence_hook(Some(Box::new(move |_, site| {
        im.lock().unwrap().push(site.image(CrashChoice::Persisted));
    })))
    .unwrap();
    let n = s.gc(1).unwrap();
    pool.set_fence_hook(None).unwrap();
    assert_eq!(n, 1, "the overwritten file was not reclaimed");
    assert!(s.stats().entries_relocated > 0);
    verify(&s, &m, "after the reclaim");
    drop(s);
    let images = std::mem::take(&mut *images.lock().unwrap());
    assert!(
        images.len() > 4,
        "only {} fences in a reclaim",
        images.len()
    );
    for (i, img) in images.into_iter().enumerate() {
        let ctx = format!("crash at fence {i} of the reclaim");
        let p = Arc::new(Pool::from_image(img, Mode::Volatile).unwrap());
        let s = Store::open_pool(p.clone(), opts.clone()).unwrap();
        verify(&s, &m, &ctx);
        let mut m2 = m.clone();
        // Delete the keys whose newest entries are in B (0, relocated there,
        // and the overwritten ones), keep 2, 4, 6 live in A, and churn one
        // filler key until B is sealed: B is then all dead, more dead than
        // A, so GC takes it first. Collect one file at a time, crashing
        // before each.
        for i in [0u64, 1, 3, 5, 7] {
            assert!(s.delete(&key(i)).unwrap(), "{ctx}: delete {i}");
            m2.remove(&key(i));
        }
        for j in 0..40u64 {
            let v = value(1000 + j, 450);
            s.put(b"filler", &v).unwrap();
            m2.insert(b"filler".to_vec(), v);
        }
        for step in 0..40 {
            let img = p.image();
            let p2 = Arc::new(Pool::from_image(img, Mode::Volatile).unwrap());
            let s2 = Store::open_pool(p2, opts.clone()).unwrap();
            for i in [0u64, 1, 3, 5, 7] {
                assert!(
                    s2.get(&key(i)).unwrap().is_none(),
                    "{ctx}, gc step {step}: deleted key {i} came back after a crash"
                );
            }
            verify(&s2, &m2, &format!("{ctx}, gc step {step}, crashed"));
            drop(s2);
            if s.gc(1).unwrap() == 0 {
                break;
            }
        }
        verify(&s, &m2, &format!("{ctx}, after gc"));
    }
}

/// GC marks a `del` entry's history invalid before it frees the `del`'s
/// file, oldest entry first with a fence between (I3): a crash that keeps
/// a newer mark but loses an older one would let a later GC stop its walk
/// at the newer mark and free the `del` with the older value still valid,
/// and the key would come back at the next open. The history here spans
/// three files, so its marks are three lines; every crash state that keeps
/// any one line of the reclaim written since its last fence is recovered,
/// collected again, and reopened from the log.
#[test]
fn history_marks_become_durable_oldest_first() {
    let opts = one_cluster_opts(0.5);
    let pool = sim_pool(&opts, 7);
    let s = Store::open_pool(pool.clone(), opts.clone()).unwrap();
    let mut m = Model::new();
    let victim = b"victim!!".to_vec();
    // 8-byte keys, 450-byte values: 504-byte entries, 8 to a file. Files
    // A, B, C: one version of the victim and 7 keys that stay live (so
    // none of them is worth collecting).
    for round in 0..3u64 {
        s.put(&victim, &value(round, 450)).unwrap();
        for i in 0..7u64 {
            let k = format!("live{round}-{i}").into_bytes();
            let v = value(10 * round + i + 100, 450);
            s.put(&k, &v).unwrap();
            m.insert(k, v);
        }
    }
    // File D: the delete and a churned filler, all dead once E takes the
    // filler's newest version.
    assert!(s.delete(&victim).unwrap());
    for j in 0..12u64 {
        let v = value(1000 + j, 450);
        s.put(b"filler!!", &v).unwrap();
        m.insert(b"filler!!".to_vec(), v);
    }
    verify(&s, &m, "before the reclaim");
    let images: Arc<Mutex<Vec<Vec<u8>>>> = Arc::new(Mutex::new(Vec::new()));
    let im = images.clone();
    pool.set_fence_hook(Some(Box::new(move |_, site| {
        let mut im = im.lock().unwrap();
        for line in site.recent_lines() {
            im.push(site.image(CrashChoice::OnlyNew(line)));
        }
    })))
    .unwrap();
    assert_eq!(s.gc(1).unwrap(), 1, "file D was not reclaimed");
    pool.set_fence_hook(None).unwrap();
    assert!(
        s.stats().entries_marked >= 3,
        "the victim's history was not marked: {:?}",
        s.stats()
    );
    drop(s);
    let images = std::mem::take(&mut *images.lock().unwrap());
    assert!(images.len() > 4, "only {} crash states", images.len());
    for (i, img) in images.into_iter().enumerate() {
        let ctx = format!("crash state {i} of the reclaim");
        let p = Arc::new(Pool::from_image(img, Mode::Volatile).unwrap());
        let s = Store::open_pool(p.clone(), opts.clone()).unwrap();
        verify(&s, &m, &ctx);
        while s.gc(usize::MAX).unwrap() > 0 {}
        drop(s);
        let again = Arc::new(Pool::from_image(p.image(), Mode::Volatile).unwrap());
        let s = Store::open_pool(again, opts.clone()).unwrap();
        assert_eq!(
            s.get(&victim).unwrap(),
            None,
            "{ctx}: the deleted key came back after a second GC and a crash"
        );
        verify(&s, &m, &format!("{ctx}, collected again and reopened"));
    }
}

/// One operation of the crash workload.
#[derive(Clone)]
enum Op {
    Put(Vec<u8>, Vec<u8>),
    Insert(Vec<u8>, Vec<u8>),
    Update(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
    Gc,
}

fn apply_op(m: &mut Model, op: &Op) {
    match op {
        Op::Put(k, v) => {
            m.insert(k.clone(), v.clone());
        }
        Op::Insert(k, v) => {
            if !m.contains_key(k) {
                m.insert(k.clone(), v.clone());
            }
        }
        Op::Update(k, v) => {
            if let Some(x) = m.get_mut(k) {
                *x = v.clone();
            }
        }
        Op::Delete(k) => {
            m.remove(k);
        }
        Op::Gc => {}
    }
}

/// Crash states taken at random fences of a random workload with GC (a
/// simulated pool; each dirty cache line independently old, flushed or
/// new): recovery gives every operation acknowledged before the crash, and
/// the one in flight either happened or not.
#[test]
fn crash_at_random_fences_keeps_acknowledged_writes() {
    let opts = Options {
        create: CreateOptions {
            pool_size: 1 << 20,
            ..small_opts().create
        },
        open: OpenOptions {
            max_pool_size: 32 << 20,
            raf_bytes: 0,
            ..small_opts().open
        },
    };
    let pool = sim_pool(&opts, 7);
    let s = Store::open_pool(pool.clone(), opts.clone()).unwrap();
    let cur = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    type Images = Arc<Mutex<Vec<(usize, Vec<u8>)>>>;
    let images: Images = Arc::new(Mutex::new(Vec::new()));
    {
        let (cur, images) = (cur.clone(), images.clone());
        pool.set_fence_hook(Some(Box::new(move |n, site| {
            if engine::hash::fmix64(n ^ 0x51).is_multiple_of(61) {
                let op = cur.load(std::sync::atomic::Ordering::SeqCst);
                images
                    .lock()
                    .unwrap()
                    .push((op, site.image(CrashChoice::Random(n))));
            }
        })))
        .unwrap();
    }
    let keys = key_universe(120, 7, 300);
    let mut rng = Rng::new(7);
    let mut ops: Vec<Op> = Vec::new();
    let mut m = Model::new();
    for i in 0..2500usize {
        let k = keys[rng.below(keys.len() as u64) as usize].clone();
        let v = value(i as u64, value_len(&mut rng, 1500));
        let op = match rng.below(20) {
            0..=9 => Op::Put(k, v),
            10..=11 => Op::Insert(k, v),
            12..=13 => Op::Update(k, v),
            14..=18 => Op::Delete(k),
            _ => Op::Gc,
        };
        cur.store(i, std::sync::atomic::Ordering::SeqCst);
        match &op {
            Op::Put(k, v) => s.put(k, v).unwrap(),
            Op::Insert(k, v) => assert_eq!(s.insert(k, v).unwrap(), !m.contains_key(k)),
            Op::Update(k, v) => assert_eq!(s.update(k, v).unwrap(), m.contains_key(k)),
            Op::Delete(k) => assert_eq!(s.delete(k).unwrap(), m.contains_key(k)),
            Op::Gc => {
                s.gc(usize::MAX).unwrap();
            }
        }
        apply_op(&mut m, &op);
        ops.push(op);
    }
    pool.set_fence_hook(None).unwrap();
    assert!(s.stats().files_reclaimed > 0);
    drop(s);
    let images = std::mem::take(&mut *images.lock().unwrap());
    assert!(images.len() >= 20, "only {} crash states", images.len());
    let mut before = Model::new();
    let mut done = 0;
    for (op, img) in images {
        while done < op {
            apply_op(&mut before, &ops[done]);
            done += 1;
        }
        let mut after = before.clone();
        apply_op(&mut after, &ops[op]);
        let ctx = format!("crash during op {op}");
        let p = Arc::new(Pool::from_image(img, Mode::Volatile).unwrap());
        let s = Store::open_pool(p, opts.clone()).unwrap();
        assert_eq!(
            s.stats().opened_from,
            pmhash_store::OpenedFrom::LogScan,
            "{ctx}"
        );
        let mut got = Model::new();
        s.for_each(|k, v| {
            got.insert(k.to_vec(), v.to_vec());
        })
        .unwrap_or_else(|e| panic!("{ctx}: for_each: {e}"));
        if got == after {
            verify(&s, &after, &ctx);
        } else {
            assert!(
                got == before,
                "{ctx}: recovered neither the state before nor after it"
            );
            verify(&s, &before, &ctx);
        }
    }
}

/// `Relaxed` durability: what `sync()` returned for survives a crash.
#[test]
fn relaxed_writes_survive_a_crash_after_sync() {
    let opts = Options {
        create: small_opts().create,
        open: OpenOptions {
            durability: engine::Durability::Relaxed,
            ..small_opts().open
        },
    };
    let pool = sim_pool(&opts, 8);
    let s = Store::open_pool(pool.clone(), opts.clone()).unwrap();
    let keys = key_universe(100, 8, 300);
    let mut rng = Rng::new(8);
    let mut m = Model::new();
    let mut done = Done::default();
    for phase in 0..3u64 {
        let run = Run {
            n: 800,
            max_v: 1000,
            too_big: None,
            op0: phase << 20,
        };
        run_ops(&s, &mut m, &keys, &mut rng, &run, &mut done);
        s.sync().unwrap();
        let img = pool.crash_image(CrashChoice::Persisted).unwrap();
        let p = Arc::new(Pool::from_image(img, Mode::Volatile).unwrap());
        let s2 = Store::open_pool(p, opts.clone()).unwrap();
        verify(
            &s2,
            &m,
            &format!("relaxed, phase {phase}, crash after sync"),
        );
    }
}
