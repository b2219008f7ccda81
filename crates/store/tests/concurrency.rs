//! Concurrency: writers doing puts, deletes and gets on overlapping keys
//! while the background GC reclaims small files and a reader checks that
//! every value it gets is one some writer wrote for that key; at the end the
//! store holds, for each key, the last operation of one of the writers, and
//! a crash reopen and a clean reopen agree. Scans running during writes
//! return sorted keys without duplicates, inside their bounds, each with a
//! value written for it (with and without the per-node scan readers).

use engine::testkit::TempDir;
use std::collections::{BTreeMap, HashMap, HashSet};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use engine::testkit::{mem_pool, test_pool_options, Rng};
use pmem::{Mode, Pool};
use pmhash_store::{CreateOptions, GcMode, OpenOptions, Options, Store, LAYOUT};

const WRITERS: u32 = 3;

/// A scratch directory, removed on drop.
fn temp_dir(tag: &str) -> TempDir {
    TempDir::new("store-conc", tag)
}
const KEYS: u32 = 48;

fn opts() -> Options {
    Options {
        create: CreateOptions {
            pool_size: 8 << 20,
            clusters: 4,
            extent_size: 4096,
            nodes: Some(2),
            ..Default::default()
        },
        open: OpenOptions {
            mode: Mode::Volatile,
            max_pool_size: 128 << 20,
            numa_emulate: Some(2),
            gc: GcMode::Background,
            gc_threshold: 0.5,
            raf_bytes: 32 << 10,
            raf_window: 1024,
            recovery_threads: 2,
            // The DRAM point index starts at its smallest and grows while
            // readers, writers and GC run.
            expected_keys: 0,
            ..Default::default()
        },
    }
}

fn new_store(o: &Options, seed: u64) -> (Arc<Pool>, Arc<Store>) {
    let pool = mem_pool(&test_pool_options(
        LAYOUT,
        b"store-concurrent",
        Mode::Volatile,
        o.create.pool_size,
        o.open.max_pool_size,
        seed,
    ));
    let s = Store::open_pool(pool.clone(), o.clone()).unwrap();
    (pool, Arc::new(s))
}

/// Key `id`: lengths 5, 23, 24 and 40 bytes in turn (both sides of the
/// index's inline limit), all starting with the id so they sort by id
/// within a length class.
fn key(id: u32) -> Vec<u8> {
    let mut k = format!("{id:05}").into_bytes();
    let len = [5usize, 23, 24, 40][id as usize % 4];
    k.resize(len, b'.');
    k
}

fn fill_byte(id: u32, w: u32, seq: u64, i: usize) -> u8 {
    (id as u64)
        .wrapping_mul(0x9e37_79b9)
        .wrapping_add(w as u64 * 131 + seq * 7 + i as u64) as u8
}

/// Value `seq` of writer `w` for key `id`: a 16-byte header naming all
/// three, then 0..300 bytes that depend on all three (so a torn value or
/// one of another key does not decode).
fn val(id: u32, w: u32, seq: u64) -> Vec<u8> {
    let len = ((id as u64 * 31 + w as u64 * 17 + seq * 13) % 300) as usize;
    let mut v = Vec::with_capacity(16 + len);
    v.extend_from_slice(&id.to_le_bytes());
    v.extend_from_slice(&w.to_le_bytes());
    v.extend_from_slice(&seq.to_le_bytes());
    v.extend((0..len).map(|i| fill_byte(id, w, seq, i)));
    v
}

/// `(writer, seq)` of a value of key `id`, or `None` if it is not one.
fn decode(id: u32, v: &[u8]) -> Option<(u32, u64)> {
    if v.len() < 16 || u32::from_le_bytes(v[0..4].try_into().unwrap()) != id {
        return None;
    }
    let w = u32::from_le_bytes(v[4..8].try_into().unwrap());
    let seq = u64::from_le_bytes(v[8..16].try_into().unwrap());
    (val(id, w, seq) == v).then_some((w, seq))
}

fn id_of(k: &[u8]) -> u32 {
    std::str::from_utf8(&k[..5]).unwrap().parse().unwrap()
}

/// What each writer did: every `(key, seq)` it put, and its last op per key
/// (`Some(seq)` a put, `None` a delete).
#[derive(Default)]
struct Log {
    puts: HashSet<(u32, u64)>,
    last: HashMap<u32, Option<u64>>,
    ops: u64,
}

fn contents(s: &Store) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut m = BTreeMap::new();
    let mut dup = false;
    s.for_each(|k, v| {
        dup |= m.insert(k.to_vec(), v.to_vec()).is_some();
    })
    .expect("for_each");
    assert!(!dup, "for_each visited a key twice");
    m
}

/// Writers and a reader on overlapping keys with the background GC; runs
/// until GC has reclaimed files and every writer did `min_ops`.
fn mixed_run(seed: u64, min_ops: u64) {
    // File-backed, so that the pool can grow for the clean-shutdown image
    // at the end (an image-made pool cannot grow).
    let dir = temp_dir(&format!("mixed{seed}"));
    let o = Options {
        create: opts().create,
        open: OpenOptions {
            mode: Mode::Mapped,
            ..opts().open
        },
    };
    let s = Arc::new(Store::open(dir.path(), o.clone()).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let done_ops = Arc::new(AtomicU64::new(0));
    let observed: Arc<Mutex<Vec<(u32, u32, u64)>>> = Arc::new(Mutex::new(Vec::new()));
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (s, stop, done_ops) = (s.clone(), stop.clone(), done_ops.clone());
        let observed = observed.clone();
        writers.push(std::thread::spawn(move || {
            let mut rng = Rng::new(seed * 100 + w as u64);
            let mut log = Log::default();
            let mut seq = 0u64;
            let mut buf = Vec::new();
            while !(stop.load(Ordering::Relaxed) && log.ops >= min_ops) {
                let id = rng.below(KEYS as u64) as u32;
                let k = key(id);
                match rng.below(10) {
                    0..=5 => {
                        seq += 1;
                        s.put(&k, &val(id, w, seq)).unwrap();
                        log.puts.insert((id, seq));
                        log.last.insert(id, Some(seq));
                    }
                    6..=7 => {
                        s.delete(&k).unwrap();
                        log.last.insert(id, None);
                    }
                    _ => {
                        if s.get_into(&k, &mut buf).unwrap() {
                            let (ow, oseq) = decode(id, &buf).unwrap_or_else(|| {
                                panic!("writer {w}: get of key {id} returned a value not written for it")
                            });
                            observed.lock().unwrap().push((id, ow, oseq));
                        }
                    }
                }
                log.ops += 1;
                if log.ops == min_ops {
                    done_ops.fetch_add(1, Ordering::Relaxed);
                }
            }
            log
        }));
    }
    let reader = {
        let (s, stop, observed) = (s.clone(), stop.clone(), observed.clone());
        std::thread::spawn(move || {
            let mut rng = Rng::new(seed ^ 0xfeed);
            let mut n = 0u64;
            let mut seen = Vec::new();
            while !stop.load(Ordering::Relaxed) || n < 1000 {
                // Skewed: a few hot keys, so the RAF cache gets hits.
                let id = rng.skewed(KEYS as u64) as u32;
                if let Some(v) = s.get(&key(id)).unwrap() {
                    let (w, seq) = decode(id, &v).unwrap_or_else(|| {
                        panic!("reader: get of key {id} returned a value not written for it")
                    });
                    assert!(w < WRITERS, "reader: writer {w} does not exist");
                    seen.push((id, w, seq));
                }
                n += 1;
            }
            observed.lock().unwrap().extend(seen);
            n
        })
    };
    // Run until the background GC has reclaimed files and every writer
    // did its share (polling; the deadline only bounds a hung test).
    let deadline = Instant::now() + Duration::from_secs(30);
    while (s.stats().files_reclaimed < 4 || done_ops.load(Ordering::Relaxed) < WRITERS as u64)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(2));
    }
    stop.store(true, Ordering::Relaxed);
    let logs: Vec<Log> = writers.into_iter().map(|t| t.join().unwrap()).collect();
    let reads = reader.join().unwrap();
    assert!(reads >= 1000);
    let st = s.stats();
    assert!(
        st.files_reclaimed >= 4,
        "the background GC reclaimed {} files in 30 s: {st:?}",
        st.files_reclaimed
    );
    assert!(st.entries_relocated + st.entries_marked > 0, "{st:?}");
    // Every value anyone read was put by the writer it names.
    let observed = std::mem::take(&mut *observed.lock().unwrap());
    assert!(!observed.is_empty(), "no get found a value");
    for (id, w, seq) in observed {
        assert!(
            logs[w as usize].puts.contains(&(id, seq)),
            "a get returned value {seq} of writer {w} for key {id}, which that writer never put"
        );
    }
    // The final state of each key is the last op of one of the writers.
    let m = contents(&s);
    for id in 0..KEYS {
        let k = key(id);
        let now = m.get(&k).map(|v| {
            decode(id, v).unwrap_or_else(|| panic!("final value of key {id} is not a value of it"))
        });
        let candidates: Vec<Option<(u32, u64)>> = (0..WRITERS)
            .filter_map(|w| {
                logs[w as usize]
                    .last
                    .get(&id)
                    .map(|l| l.map(|seq| (w, seq)))
            })
            .collect();
        if candidates.is_empty() {
            assert_eq!(now, None, "key {id}: never written, yet present");
        } else {
            assert!(
                candidates.contains(&now),
                "key {id}: final {now:?} is none of the writers' last ops {candidates:?}"
            );
        }
        assert_eq!(
            s.get(&k).unwrap().as_ref(),
            m.get(&k),
            "key {id}: get vs for_each"
        );
    }
    assert_eq!(s.len(), m.len() as u64);
    assert!(s.scan(b"", None, usize::MAX).unwrap() == m.clone().into_iter().collect::<Vec<_>>());
    // A crash now (the GC thread stops with the store) and a log scan.
    drop(s);
    let o2 = Options {
        create: o.create,
        open: OpenOptions {
            gc: GcMode::Manual,
            ..o.open
        },
    };
    let s2 = Store::open(dir.path(), o2.clone()).unwrap();
    assert_eq!(s2.stats().opened_from, pmhash_store::OpenedFrom::LogScan);
    assert!(
        contents(&s2) == m,
        "log scan after the concurrent run differs"
    );
    let (keys, reach) = s2.check().unwrap();
    assert_eq!(keys, m.len() as u64);
    assert_eq!(reach, s2.pool().stats().bytes_in_use, "leaked PM bytes");
    assert_eq!(
        s2.stats().live_bytes,
        true_live(&m),
        "live bytes after the log scan"
    );
    // A full GC leaves no sealed file past the threshold: the log is at
    // most twice the live bytes plus the active files.
    s2.gc(usize::MAX).unwrap();
    let st = s2.stats();
    let active_max = (st.nodes * st.clusters) as u64 * (o2.create.extent_size - 64);
    assert!(
        st.log_bytes <= 2 * true_live(&m) + active_max,
        "after a full GC the log still holds {} bytes for {} live: {st:?}",
        st.log_bytes,
        true_live(&m)
    );
    s2.close().unwrap();
    drop(s2);
    let s3 = Store::open(dir.path(), o2).unwrap();
    assert_eq!(s3.stats().opened_from, pmhash_store::OpenedFrom::Image);
    assert!(contents(&s3) == m, "clean reopen differs");
    assert_eq!(
        s3.stats().live_bytes,
        true_live(&m),
        "live bytes after the image open"
    );
    s3.check().unwrap();
}

/// PM bytes of the entries holding `m` (40-byte header, key, value, padded to 8).
fn true_live(m: &BTreeMap<Vec<u8>, Vec<u8>>) -> u64 {
    m.iter()
        .map(|(k, v)| (40 + k.len() as u64 + v.len() as u64).next_multiple_of(64))
        .sum()
}

#[test]
fn mixed_writers_readers_and_background_gc() {
    for seed in 1..=2 {
        mixed_run(seed, 40_000);
    }
}

/// Scans during puts and deletes: keys strictly increasing (sorted, no
/// duplicate), inside `[start, end)`, at most `limit`, each value one
/// written for its key.
fn scans_during_writes(scan_readers: usize) {
    let o = Options {
        create: opts().create,
        open: OpenOptions {
            scan_readers,
            ..opts().open
        },
    };
    let (_pool, s) = new_store(&o, 40 + scan_readers as u64);
    const N: u32 = 300;
    for id in 0..N {
        s.put(&key(id), &val(id, 9, 0)).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..2u32 {
        let (s, stop) = (s.clone(), stop.clone());
        writers.push(std::thread::spawn(move || {
            let mut rng = Rng::new(700 + w as u64);
            let mut seq = 0;
            while !stop.load(Ordering::Relaxed) {
                let id = rng.below(N as u64) as u32;
                if rng.below(4) == 0 {
                    s.delete(&key(id)).unwrap();
                } else {
                    seq += 1;
                    s.put(&key(id), &val(id, w, seq)).unwrap();
                }
            }
            seq
        }));
    }
    let mut rng = Rng::new(scan_readers as u64);
    let mut nonempty = 0;
    let mut long = 0;
    for i in 0..1500 {
        let start = if rng.below(4) == 0 {
            Vec::new()
        } else {
            key(rng.below(N as u64) as u32)
        };
        let end = if rng.below(3) == 0 {
            None
        } else {
            Some(key(rng.below(N as u64) as u32))
        };
        let limit = match rng.below(3) {
            0 => usize::MAX,
            _ => 1 + rng.below(100) as usize,
        };
        let got = s.scan(&start, end.as_deref(), limit).unwrap();
        assert!(
            got.len() <= limit,
            "scan {i}: {} pairs over the limit {limit}",
            got.len()
        );
        for w in got.windows(2) {
            assert!(w[0].0 < w[1].0, "scan {i}: keys out of order or repeated");
        }
        for (k, v) in &got {
            assert!(
                k.as_slice() >= start.as_slice(),
                "scan {i}: a key below start"
            );
            if let Some(e) = &end {
                assert!(k < e, "scan {i}: a key at or past end");
            }
            let id = id_of(k);
            assert_eq!(*k, key(id), "scan {i}: a key that was never written");
            assert!(
                decode(id, v).is_some(),
                "scan {i}: key {id} with a value not written for it"
            );
        }
        nonempty += !got.is_empty() as u32;
        long += (got.len() > 16) as u32;
    }
    stop.store(true, Ordering::Relaxed);
    let seqs: Vec<u64> = writers.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(seqs.iter().all(|&n| n > 0), "a writer never wrote");
    assert!(
        nonempty > 100 && long > 10,
        "scans found too little: {nonempty} non-empty, {long} long"
    );
    // Quiescent: a full scan equals for_each.
    let all = s.scan(b"", None, usize::MAX).unwrap();
    assert!(all == contents(&s).into_iter().collect::<Vec<_>>());
}

#[test]
fn scans_during_writes_are_sorted_without_duplicates() {
    scans_during_writes(0);
}

#[test]
fn scans_with_node_readers_during_writes() {
    scans_during_writes(2);
}
