//! Corruption against crashes: a bad entry no crash could have torn (valid
//! entries written after it was durable follow it, or its file is sealed)
//! refuses the open with an error naming the file and the offset, and
//! changes nothing; `Store::repair` (`pmhash check --repair`) drops exactly
//! the bad bytes and says so; a torn tail is still dropped quietly (under
//! `Relaxed` with valid entries behind it that were in flight with it);
//! and a read of a corrupt entry is an error, never the wrong bytes.

use std::collections::BTreeMap;
use std::path::PathBuf;

use engine::testkit::{Rng, TempDir};
use engine::Durability;
use pmem::Mode;
use pmhash_store::{CreateOptions, GcMode, OpenOptions, Options, Store, POOL_FILE};

/// The pool header's state slots, which a writable pool open rewrites
/// before the store looks at its log.
const STATE_SLOTS: std::ops::Range<usize> = 64..192;

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

fn opts() -> Options {
    Options {
        create: CreateOptions {
            pool_size: 1 << 20,
            clusters: 2,
            extent_size: 4096,
            nodes: Some(1),
            ..Default::default()
        },
        open: OpenOptions {
            mode: Mode::Mapped,
            max_pool_size: 4 << 20,
            gc: GcMode::Manual,
            raf_bytes: 0,
            recovery_threads: 1,
            ..Default::default()
        },
    }
}

fn pool_file(dir: &TempDir) -> PathBuf {
    dir.path().join(POOL_FILE)
}

fn word(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}

fn contents(s: &Store) -> Model {
    let mut m = Model::new();
    s.for_each(|k, v| {
        m.insert(k.to_vec(), v.to_vec());
    })
    .expect("for_each");
    m
}

/// Puts `n` keys (values of 20..120 bytes, so reads go to the log), some
/// twice, then drops the store (`clean`: after closing it).
fn built(dir: &TempDir, o: &Options, n: u64, clean: bool) -> (Vec<u8>, Model) {
    let s = Store::open(dir.path(), o.clone()).unwrap();
    let mut rng = Rng::new(n);
    let mut m = Model::new();
    for i in 0..n {
        let k = format!("key{:04}", rng.next() % (n / 2)).into_bytes();
        let v = vec![i as u8; 20 + (rng.next() % 100) as usize];
        s.put(&k, &v).unwrap();
        m.insert(k, v);
    }
    assert!(s.stats().files > 4, "want several Nlog files");
    if clean {
        s.close().unwrap();
    }
    drop(s);
    (std::fs::read(pool_file(dir)).unwrap(), m)
}

/// An entry found in a file image.
#[derive(Clone, Debug)]
struct At {
    off: usize,
    len: usize,
    key: Vec<u8>,
    /// Its file's pool offset.
    file: usize,
    /// Its file's (node, cluster) and sequence number.
    pair: u64,
    seq: u64,
}

/// Every entry of every Nlog file, by file, read from the bytes.
fn entries(b: &[u8]) -> Vec<Vec<At>> {
    let root = (pmem::header::HEADER_LEN..b.len() - 16)
        .step_by(64)
        .find(|&o| {
            word(b, o) == u64::from_le_bytes(*b"PMHSTOR1") && word(b, o + 8) == pmhash_store::FORMAT
        })
        .expect("a store root");
    let table_len = word(b, root + 40) as usize;
    let mut files = Vec::new();
    for slot in 0..table_len {
        let f = word(b, root + 128 + 8 * slot) as usize;
        if f == 0 {
            continue;
        }
        let (pair, seq) = (word(b, f + 8), word(b, f + 16));
        let mut v = Vec::new();
        let mut pos = 64;
        while pos + 64 <= 4096 && word(b, f + pos) != 0 {
            let lens = word(b, f + pos + 8);
            let (klen, vlen) = (
                (lens & 0xffff) as usize,
                ((lens >> 16) & 0xffff_ffff) as usize,
            );
            let len = pmhash_store::entry_len(klen, vlen) as usize;
            let key = b[f + pos + 40..f + pos + 40 + klen].to_vec();
            v.push(At {
                off: f + pos,
                len,
                key,
                file: f,
                pair,
                seq,
            });
            pos += len;
        }
        files.push(v);
    }
    files
}

/// Whether file `es` is the newest of its (node, cluster).
fn newest(all: &[Vec<At>], es: &[At]) -> bool {
    let (pair, seq) = (es[0].pair, es[0].seq);
    all.iter()
        .filter(|f| !f.is_empty() && f[0].pair == pair)
        .all(|f| f[0].seq <= seq)
}

/// Opens `bad` read-only and writable: both must be refused with a message
/// naming the file and `at`, and leave the log bytes as they were.
fn refused(dir: &TempDir, bad: &[u8], at: usize) -> String {
    let mut msg = String::new();
    for read_only in [true, false] {
        std::fs::write(pool_file(dir), bad).unwrap();
        let o = Options {
            create: opts().create,
            open: OpenOptions {
                read_only,
                ..opts().open
            },
        };
        match Store::open(dir.path(), o) {
            Ok(s) => panic!(
                "read_only {read_only}: the open accepted corruption at {at:#x} ({} keys)",
                s.len()
            ),
            Err(e) => msg = e.to_string(),
        }
        assert!(
            msg.contains("Nlog file") && msg.contains(&format!("pool offset {at:#x}")),
            "the error names no file and offset {at:#x}: {msg}"
        );
        let now = std::fs::read(pool_file(dir)).unwrap();
        let diff: Vec<usize> = (0..now.len())
            .filter(|&i| now[i] != bad[i] && (read_only || !STATE_SLOTS.contains(&i)))
            .take(4)
            .collect();
        assert!(diff.is_empty(), "the refused open wrote at {diff:#x?}");
    }
    msg
}

/// After `Store::repair` dropped the entry at `at` (of `key`), the store
/// opens, passes `check`, and holds the model for every other key.
fn repaired(dir: &TempDir, at: &At, m: &Model) {
    let dropped = Store::repair(&pool_file(dir)).unwrap();
    assert_eq!(dropped.len(), 1, "{dropped:?}");
    assert_eq!(
        (dropped[0].offset, dropped[0].len),
        (at.off as u64, at.len as u64),
        "{}",
        dropped[0]
    );
    assert!(
        dropped[0].to_string().contains(&format!("{:#x}", at.off)),
        "{}",
        dropped[0]
    );
    // A second repair finds nothing.
    assert!(Store::repair(&pool_file(dir)).unwrap().is_empty());
    let s = Store::open(dir.path(), opts()).unwrap();
    s.check().unwrap();
    let got = contents(&s);
    for (k, v) in m {
        if *k != at.key {
            assert_eq!(got.get(k), Some(v), "key {:?}", String::from_utf8_lossy(k));
        }
    }
    s.close().unwrap();
}

#[test]
fn a_bad_entry_followed_by_later_entries_refuses_the_crash_open_and_repair_drops_just_it() {
    let dir = TempDir::new("store-corrupt", "mid");
    let (good, m) = built(&dir, &opts(), 400, false);
    let all = entries(&good);
    // An entry with valid entries behind it (in the newest file of its
    // pair, the one a crash could tear, when that one has them).
    let f = all
        .iter()
        .find(|f| f.len() >= 3 && newest(&all, f))
        .or_else(|| all.iter().find(|f| f.len() >= 3))
        .expect("a file with three entries");
    let at = f[1].clone();
    let mut bad = good.clone();
    // One bit of its value.
    bad[at.off + 40 + at.key.len() + 3] ^= 0x10;
    let msg = refused(&dir, &bad, at.off);
    assert!(msg.contains("written after"), "{msg}");
    repaired(&dir, &at, &m);
}

#[test]
fn a_bad_last_entry_of_a_sealed_file_is_corruption() {
    let dir = TempDir::new("store-corrupt", "sealed");
    let (good, m) = built(&dir, &opts(), 400, false);
    let all = entries(&good);
    let f = all
        .iter()
        .find(|f| f.len() >= 2 && !newest(&all, f))
        .expect("a sealed file");
    let at = f.last().unwrap().clone();
    let mut bad = good.clone();
    bad[at.off + 16] ^= 0x01;
    let msg = refused(&dir, &bad, at.off);
    assert!(msg.contains("sealed"), "{msg}");
    repaired(&dir, &at, &m);
}

#[test]
fn a_torn_tail_is_still_dropped_quietly() {
    let dir = TempDir::new("store-corrupt", "torn");
    let (good, m) = built(&dir, &opts(), 400, false);
    let all = entries(&good);
    let f = all
        .iter()
        .find(|f| !f.is_empty() && newest(&all, f))
        .expect("a newest file");
    let last = f.last().unwrap();
    // Half an entry in flight past the tail: its second line only.
    let mut bad = good.clone();
    let next = last.off + last.len;
    if next + 128 <= last.file + 4096 {
        for b in &mut bad[next + 64..next + 128] {
            *b = 0xa5;
        }
    }
    // And the last entry itself torn: it was in flight, unacknowledged.
    bad[last.off + 40] ^= 0x01;
    std::fs::write(pool_file(&dir), &bad).unwrap();
    let s = Store::open(dir.path(), opts()).unwrap();
    s.check().unwrap();
    let got = contents(&s);
    for (k, v) in &m {
        if *k != last.key {
            assert_eq!(got.get(k), Some(v));
        }
    }
}

#[test]
fn relaxed_entries_in_flight_together_are_a_torn_tail() {
    let dir = TempDir::new("store-corrupt", "relaxed");
    let o = Options {
        create: opts().create,
        open: OpenOptions {
            durability: Durability::Relaxed,
            ..opts().open
        },
    };
    let s = Store::open(dir.path(), o.clone()).unwrap();
    let mut synced = Model::new();
    for i in 0..40u32 {
        let k = format!("key{i:04}").into_bytes();
        s.put(&k, &[i as u8; 50]).unwrap();
        synced.insert(k, vec![i as u8; 50]);
    }
    s.sync().unwrap();
    // Unsynced: in flight together at the "crash" below.
    for i in 0..8u32 {
        s.put(format!("new{i:04}").as_bytes(), &[1; 50]).unwrap();
    }
    drop(s);
    let good = std::fs::read(pool_file(&dir)).unwrap();
    let all = entries(&good);
    // The first unsynced entry of a file with another after it.
    let f = all
        .iter()
        .find(|f| f.iter().filter(|e| e.key.starts_with(b"new")).count() >= 2)
        .expect("a file with two unsynced entries");
    let first = f.iter().position(|e| e.key.starts_with(b"new")).unwrap();
    let at = &f[first];
    let mut bad = good.clone();
    bad[at.off + 45] ^= 0x04;
    std::fs::write(pool_file(&dir), &bad).unwrap();
    let s = Store::open(dir.path(), o).unwrap();
    s.check().unwrap();
    let got = contents(&s);
    for (k, v) in &synced {
        assert_eq!(got.get(k), Some(v), "a synced key");
    }
    // The torn entry's file keeps nothing from it on: those entries were
    // in flight with it.
    for e in &f[first..] {
        assert!(!got.contains_key(&e.key), "an entry after the torn one");
    }
}

/// A cleanly closed store of 400 puts with one value byte flipped in the
/// newest (and only) entry of a key written once, written to the pool
/// file: the model, the key and its entry.
fn one_value_flipped(dir: &TempDir) -> (Vec<u8>, Model, Vec<u8>, At) {
    let (good, m) = built(dir, &opts(), 400, true);
    // The newest entry of some key (the one its reads return).
    let all = entries(&good);
    let mut newest_of: BTreeMap<Vec<u8>, At> = BTreeMap::new();
    for f in &all {
        for e in f {
            newest_of.insert(e.key.clone(), e.clone());
        }
    }
    // Versions grow along a file and files are listed in table order, not
    // age order: take a key written once (its only entry is its newest).
    let mut count: BTreeMap<Vec<u8>, usize> = BTreeMap::new();
    for e in all.iter().flatten() {
        *count.entry(e.key.clone()).or_default() += 1;
    }
    let (key, at) = newest_of
        .iter()
        .find(|(k, _)| count[*k] == 1 && m.contains_key(*k))
        .map(|(k, a)| (k.clone(), a.clone()))
        .expect("a key written once");
    let mut bad = good;
    bad[at.off + 40 + key.len() + 5] ^= 0x20;
    std::fs::write(pool_file(dir), &bad).unwrap();
    (bad, m, key, at)
}

#[test]
fn reads_of_a_corrupt_entry_are_errors_never_wrong_bytes() {
    let dir = TempDir::new("store-corrupt", "read");
    let (bad, m, key, at) = one_value_flipped(&dir);
    let s = Store::open(dir.path(), opts()).unwrap();
    assert_eq!(
        s.stats().opened_from,
        pmhash_store::OpenedFrom::Image,
        "a clean open: no log scan"
    );
    let e = s.get(&key).unwrap_err().to_string();
    assert!(e.contains(&format!("{:#x}", at.off)), "{e}");
    assert!(s.get_into(&key, &mut Vec::new()).is_err());
    assert!(s.get_into_slice(&key, &mut [0u8; 16]).is_err());
    let mut out = Vec::new();
    assert!(s.get_many(&[&key[..]], &mut out).is_err());
    // A scan that reaches it too (and one that does not, reads as usual).
    let e = s.scan(&key, None, 4).unwrap_err().to_string();
    assert!(e.contains(&format!("{:#x}", at.off)), "scan: {e}");
    let mut after = key.clone();
    after.push(0);
    if after.len() <= pmhash_store::MAX_KEY {
        for (k, v) in s.scan(&after, None, 4).unwrap() {
            assert_eq!(m.get(&k), Some(&v), "scan past the bad key");
        }
    }
    // Every other key reads its value.
    for (k, v) in &m {
        if *k != key {
            assert_eq!(s.get(k).unwrap().as_ref(), Some(v));
        }
    }
    // `check` finds it too.
    assert!(s.check().is_err());
    drop(s);
    // With verification off the read returns the stored bytes as they are.
    let s = reopen_unverified(&dir, &bad);
    let got = s.get(&key).unwrap().unwrap();
    assert_ne!(&got, &m[&key]);
    assert_eq!(got.len(), m[&key].len());
}

#[test]
fn for_each_over_a_corrupt_entry_is_an_error_never_wrong_bytes() {
    let dir = TempDir::new("store-corrupt", "for-each");
    let (bad, m, key, at) = one_value_flipped(&dir);
    let s = Store::open(dir.path(), opts()).unwrap();
    assert_eq!(
        s.stats().opened_from,
        pmhash_store::OpenedFrom::Image,
        "a clean open: no log scan"
    );
    let mut seen = Model::new();
    let r = s.for_each(|k, v| {
        seen.insert(k.to_vec(), v.to_vec());
    });
    // The flipped bytes never reach the callback; every pair it got is
    // the model's.
    assert!(
        !seen.contains_key(&key),
        "for_each handed the corrupt entry's bytes to its callback"
    );
    for (k, v) in &seen {
        assert_eq!(m.get(k), Some(v), "for_each visited a wrong pair");
    }
    let e = r
        .expect_err("for_each over a corrupt entry must fail")
        .to_string();
    assert!(
        e.contains(&format!("{:#x}", at.off)) && e.contains("checksum"),
        "the error names the entry: {e}"
    );
    assert!(e.contains("Nlog file"), "the error names the file: {e}");
    drop(s);
    let s = reopen_unverified(&dir, &bad);
    // With verification off the walk hands over the stored bytes.
    let mut got = None;
    s.for_each(|k, v| {
        if k == key {
            got = Some(v.to_vec());
        }
    })
    .unwrap();
    let got = got.expect("the key, unverified");
    assert_ne!(&got, &m[&key]);
}

/// The damaged image `bad` written back and opened with checksum
/// verification off.
fn reopen_unverified(dir: &TempDir, bad: &[u8]) -> Store {
    std::fs::write(pool_file(dir), bad).unwrap();
    Store::open(
        dir.path(),
        Options {
            create: opts().create,
            open: OpenOptions {
                verify_checksums: false,
                ..opts().open
            },
        },
    )
    .unwrap()
}
