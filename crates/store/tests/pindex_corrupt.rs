//! A corrupt persistent point index (index options b and c: `store-hash`,
//! `store-both`) is never a panic and never a silently missing key: an open
//! refuses, untouched, a pool whose hash slot names an offset outside the
//! pool, off an entry boundary, outside every log file, or an entry of
//! another key; a slot damaged after the open is an error to `get` and
//! to `for_each` (never a key silently absent), reported by `check`,
//! refused by a write to that key,
//! and leaves the store's background thread (which builds the ordered tree
//! from the index) running. A pool whose header lost its store root but that holds
//! data is refused, untouched, instead of being formatted anew.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Once};
use std::time::Duration;

use engine::testkit::TempDir;
use pmem::{Mode, Pool, PoolOptions};
use pmhash_store::{key_hash, lens_word};
use pmhash_store::{CreateOptions, GcMode, IndexKind, OpenOptions, Options, Store, POOL_FILE};

const VICTIM: &[u8] = b"victim-key-0042";
const KEYS: usize = 60;

/// Panics on the store's background threads (named `pmhash-store` and
/// `pmhash-prefault`), seen
/// by a process-wide panic hook: a test fails if any happened.
static BACKGROUND_PANICS: AtomicU64 = AtomicU64::new(0);

fn count_background_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let old = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if matches!(
                std::thread::current().name(),
                Some("pmhash-store" | "pmhash-prefault")
            ) {
                BACKGROUND_PANICS.fetch_add(1, Ordering::SeqCst);
            }
            old(info);
        }));
    });
}

fn opts(index: IndexKind, read_only: bool) -> Options {
    Options {
        create: CreateOptions {
            pool_size: 1 << 20,
            clusters: 2,
            extent_size: 4096,
            nodes: Some(1),
            index,
            ..Default::default()
        },
        open: OpenOptions {
            mode: Mode::Mapped,
            max_pool_size: 4 << 20,
            gc: GcMode::Manual,
            raf_bytes: 0,
            recovery_threads: 1,
            expected_keys: 256,
            read_only,
            ..Default::default()
        },
    }
}

fn hash_index() -> IndexKind {
    IndexKind::Hash(engine::slotarray::spec())
}

fn both_index() -> IndexKind {
    IndexKind::Both(engine::slotarray::spec())
}

fn key(i: usize) -> Vec<u8> {
    format!("key-{i:04}").into_bytes()
}

fn value(i: usize) -> Vec<u8> {
    vec![i as u8; 100]
}

/// Builds a store with `KEYS` keys and `VICTIM`, closes it, and returns
/// the pool file's path, its bytes and the keys other than `VICTIM`.
fn built(dir: &TempDir, index: IndexKind) -> (PathBuf, Vec<u8>, BTreeMap<Vec<u8>, Vec<u8>>) {
    let st = Store::open(dir.path(), opts(index, false)).unwrap();
    let mut m = BTreeMap::new();
    for i in 0..KEYS {
        st.put(&key(i), &value(i)).unwrap();
        m.insert(key(i), value(i));
    }
    st.put(VICTIM, b"the victim's value").unwrap();
    st.close().unwrap();
    drop(st);
    let path = dir.path().join(POOL_FILE);
    let bytes = std::fs::read(&path).unwrap();
    (path, bytes, m)
}

fn word(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}

/// The file offset of the index's value word for `VICTIM`: the slot array
/// holds (meta, key hash, value) per slot, and the value is the `v_addr`
/// of the victim's entry (node 0: its pool offset).
fn victim_value_word(b: &[u8]) -> usize {
    let lens = lens_word(VICTIM.len(), b"the victim's value".len());
    let entries: Vec<usize> = (0..b.len() - 64)
        .step_by(64)
        .filter(|&o| word(b, o + 8) == lens && &b[o + 40..o + 40 + VICTIM.len()] == VICTIM)
        .collect();
    assert_eq!(entries.len(), 1, "the victim's log entry, once");
    let va = entries[0] as u64;
    let h = key_hash(VICTIM);
    let slots: Vec<usize> = (0..b.len() - 16)
        .step_by(8)
        .filter(|&o| word(b, o) == h && word(b, o + 8) == va)
        .map(|o| o + 8)
        .collect();
    assert_eq!(slots.len(), 1, "the index slot naming the victim, once");
    slots[0]
}

/// `bytes` with the victim's index value set to `v`.
fn with_victim_value(bytes: &[u8], v: u64) -> Vec<u8> {
    let mut b = bytes.to_vec();
    let at = victim_value_word(&b);
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
    b
}

fn guarded<T>(what: &str, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(t) => t,
        Err(_) => panic!("{what} panicked"),
    }
}

/// What `for_each` visits, and `get` of every key and of the victim; all
/// under a panic guard. The victim's slot names no entry of its key: its
/// reads are `Err(Corrupt)` naming the slot's value `bad` and pointing at
/// `pmhash check`, never a key silently absent.
fn reads(st: &Store, m: &BTreeMap<Vec<u8>, Vec<u8>>, bad: u64, what: &str) {
    let says = |e: engine::Error, op: &str| {
        let msg = e.to_string();
        assert!(
            matches!(e, engine::Error::Corrupt(_))
                && msg.contains(&format!("{bad:#x}"))
                && msg.contains("pmhash check"),
            "{what}: {op} names the bad slot value and the way out: {msg}"
        );
    };
    let mut seen = BTreeMap::new();
    let r = guarded(&format!("{what}: for_each"), || {
        st.for_each(|k, v| {
            seen.insert(k.to_vec(), v.to_vec());
        })
    });
    says(
        r.expect_err("for_each must report the victim's slot"),
        "for_each",
    );
    for (k, v) in &seen {
        assert_eq!(m.get(k), Some(v), "{what}: for_each visits sound pairs");
    }
    for (k, v) in m {
        let got = guarded(&format!("{what}: get"), || st.get(k)).unwrap();
        assert_eq!(got.as_ref(), Some(v), "{what}: get of a sound key");
    }
    let got = guarded(&format!("{what}: get of the victim"), || st.get(VICTIM));
    says(
        got.expect_err("get of the victim must be an error, not absent"),
        "get",
    );
    let mut out = Vec::new();
    let got = guarded(&format!("{what}: get_many"), || {
        st.get_many(&[VICTIM], &mut out)
    });
    says(got.expect_err("get_many of the victim"), "get_many");
}

/// Waits (bounded) for the store's ordered tree: a scan of every key.
fn scan_all(st: &Arc<Store>, what: &str) -> Vec<Vec<u8>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let s2 = st.clone();
    std::thread::spawn(move || {
        let r = catch_unwind(AssertUnwindSafe(|| s2.scan(b"", None, usize::MAX)));
        let _ = tx.send(r.map(|r| r.map(|v| v.into_iter().map(|(k, _)| k).collect::<Vec<_>>())));
    });
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(Ok(Ok(keys))) => keys,
        Ok(Ok(Err(e))) => panic!("{what}: scan failed: {e}"),
        Ok(Err(_)) => panic!("{what}: scan panicked"),
        Err(_) => panic!("{what}: scan did not return in 10 s (the ordered tree was never built)"),
    }
}

fn assert_no_background_panic(what: &str) {
    assert_eq!(
        BACKGROUND_PANICS.load(Ordering::SeqCst),
        0,
        "{what}: the store's background thread panicked"
    );
}

fn open_ok(dir: &Path, o: Options, what: &str) -> Store {
    guarded(&format!("{what}: open"), || Store::open(dir, o)).unwrap_or_else(|e| {
        panic!("{what}: open refused a store whose root and files are sound: {e}")
    })
}

/// Opens of the pool file `path` holding `bad`, read-only and writable,
/// must be refused with a message that holds each of `says` and points at
/// `pmhash check`, and leave the file byte-for-byte as it was.
fn refused(dir: &Path, path: &Path, bad: &[u8], index: IndexKind, name: &str, says: &[&str]) {
    for read_only in [true, false] {
        std::fs::write(path, bad).unwrap();
        let what = format!(
            "{name}, {}",
            if read_only { "read-only" } else { "writable" }
        );
        let r = guarded(&format!("{what}: open"), || {
            Store::open(dir, opts(index, read_only))
        });
        let msg = match r {
            Ok(st) => {
                let mut n = 0u64;
                let _ = st.for_each(|_, _| n += 1);
                panic!(
                    "{what}: an open accepted a pool whose index names no entry of its key \
                     (len() {}, for_each visits {n})",
                    st.len()
                )
            }
            Err(e) => e.to_string(),
        };
        for s in says.iter().chain(&["pmhash check"]) {
            assert!(msg.contains(s), "{what}: the refusal says {s:?}: {msg}");
        }
        assert!(
            std::fs::read(path).unwrap() == bad,
            "{what}: the refused file changed"
        );
    }
}

#[test]
fn an_open_refuses_an_index_value_outside_the_pool() {
    for (name, index, v) in [
        ("store-hash", hash_index(), 0x1aa0_c000u64),
        ("store-both", both_index(), 0x1_0004_5940),
    ] {
        let dir = TempDir::new("store-pindex", "outside");
        let (path, good, _) = built(&dir, index);
        let bad = with_victim_value(&good, v);
        let slot = format!("{:#x}", key_hash(VICTIM));
        refused(
            dir.path(),
            &path,
            &bad,
            index,
            name,
            &[&format!("{v:#x}"), &slot],
        );
    }
}

#[test]
fn an_open_refuses_an_index_value_off_an_entry_boundary() {
    let dir = TempDir::new("store-pindex", "unaligned");
    let (path, good, _) = built(&dir, hash_index());
    let at = victim_value_word(&good);
    // Inside the pool, inside the victim's entry, on no entry boundary.
    let bad = with_victim_value(&good, word(&good, at) + 7);
    refused(
        dir.path(),
        &path,
        &bad,
        hash_index(),
        "store-hash",
        &["entry boundary"],
    );
}

#[test]
fn an_open_refuses_an_index_value_that_names_another_keys_entry() {
    // On an entry boundary, inside a live file, a well-formed entry: but
    // of another key, so the victim would be silently missing (and the
    // other key listed twice).
    let dir = TempDir::new("store-pindex", "other-key");
    let (path, good, _) = built(&dir, hash_index());
    let lens = lens_word(key(3).len(), value(3).len());
    let other = (0..good.len() - 64)
        .step_by(64)
        .find(|&o| word(&good, o + 8) == lens && good[o + 40..o + 40 + 8] == key(3)[..])
        .expect("key 3's entry") as u64;
    let bad = with_victim_value(&good, other);
    refused(
        dir.path(),
        &path,
        &bad,
        hash_index(),
        "store-hash",
        &["another slot's key"],
    );
}

#[test]
fn an_open_refuses_an_index_value_between_the_log_files() {
    // On an entry boundary and inside the pool, but in no log file (the
    // index's own table, past every file's entries).
    let dir = TempDir::new("store-pindex", "no-file");
    let (path, good, _) = built(&dir, both_index());
    let at = victim_value_word(&good) as u64;
    let bad = with_victim_value(&good, at & !63);
    refused(
        dir.path(),
        &path,
        &bad,
        both_index(),
        "store-both",
        &["outside every log file"],
    );
}

/// Sets the victim's index value in the pool of the open store `st` (the
/// damage a stray write after the open's check could do).
fn damage_open_store(st: &Store, good: &[u8], v: u64) {
    let at = victim_value_word(good) as u64;
    st.pool().store_u64(at, v);
}

#[test]
fn a_slot_damaged_after_the_open_is_skipped_reported_and_refused_for_writes() {
    count_background_panics();
    let dir = TempDir::new("store-pindex", "outside-live");
    let (_, good, m) = built(&dir, hash_index());
    let what = "store-hash, damaged while open";
    let st = open_ok(dir.path(), opts(hash_index(), false), what);
    damage_open_store(&st, &good, 0x1aa0_c000);
    reads(&st, &m, 0x1aa0_c000, what);
    let err = guarded("check", || st.check()).expect_err("check must report the bad slot");
    let msg = err.to_string();
    assert!(
        msg.contains("0x1aa0c000"),
        "{what}: check names the offset: {msg}"
    );
    let err = guarded("put of the victim", || st.put(VICTIM, b"new"))
        .expect_err("a write to the corrupt slot must be refused");
    let msg = err.to_string();
    assert!(
        msg.contains("0x1aa0c000") && msg.contains("pmhash check"),
        "{what}: the refusal names the offset and the way out: {msg}"
    );
    // The rest of the store takes writes.
    st.put(&key(1), b"changed").unwrap();
    assert_eq!(st.get(&key(1)).unwrap().as_deref(), Some(&b"changed"[..]));
    st.close().unwrap();
    assert_no_background_panic(what);
}

#[test]
fn a_slot_damaged_off_an_entry_boundary_after_the_open_is_never_read() {
    count_background_panics();
    let dir = TempDir::new("store-pindex", "unaligned-live");
    let (_, good, m) = built(&dir, hash_index());
    let at = victim_value_word(&good);
    let what = "store-hash, damaged while open";
    let st = open_ok(dir.path(), opts(hash_index(), false), what);
    damage_open_store(&st, &good, word(&good, at) + 7);
    reads(&st, &m, word(&good, at) + 7, what);
    let err = guarded("put of the victim", || st.put(VICTIM, b"new"))
        .expect_err("a write to the corrupt slot must be refused");
    assert!(
        err.to_string().contains("entry boundary"),
        "{what}: the refusal says what is wrong: {err}"
    );
    let del = guarded("delete of the victim", || st.delete(VICTIM));
    assert!(
        !matches!(del, Ok(true)),
        "{what}: a delete cannot find a key the index does not name"
    );
    st.close().unwrap();
    assert_no_background_panic(what);
}

#[test]
fn store_both_builds_its_tree_past_a_slot_damaged_before_the_tree() {
    count_background_panics();
    let dir = TempDir::new("store-pindex", "both");
    let (_, good, m) = built(&dir, both_index());
    let what = "store-both, damaged while open";
    let st = Arc::new(open_ok(dir.path(), opts(both_index(), false), what));
    damage_open_store(&st, &good, 0x1_0004_5940);
    let keys = scan_all(&st, what);
    let mut want: Vec<Vec<u8>> = m.keys().cloned().collect();
    if keys.len() == want.len() + 1 {
        // The tree was built before the damage: it still lists the victim.
        want.push(VICTIM.to_vec());
        want.sort();
    }
    assert_eq!(keys, want, "{what}: the scan lists every sound key");
    reads(&st, &m, 0x1_0004_5940, what);
    assert!(
        guarded("check", || st.check()).is_err(),
        "{what}: check reports it"
    );
    st.close().unwrap();
    assert_no_background_panic(what);
}

/// Zeroes the aux root (the store root) in both pool header state slots
/// and recomputes their checksums: a header that is valid but has lost
/// the store's root.
fn without_store_root(bytes: &[u8]) -> Vec<u8> {
    let mut b = bytes.to_vec();
    for slot in [64usize, 128] {
        if word(&b, slot) == 0 {
            continue;
        }
        b[slot + 40..slot + 48].fill(0);
        let crc = crc32fast::hash(&b[slot..slot + 60]);
        b[slot + 60..slot + 64].copy_from_slice(&crc.to_le_bytes());
    }
    b
}

#[test]
fn a_pool_with_data_but_no_store_root_is_refused_not_formatted() {
    for (name, index) in [
        ("store-hash", hash_index()),
        ("store-both", both_index()),
        ("store", IndexKind::Dram),
    ] {
        let dir = TempDir::new("store-pindex", "noroot");
        let (path, good, _) = built(&dir, index);
        let bad = without_store_root(&good);
        for read_only in [true, false] {
            std::fs::write(&path, &bad).unwrap();
            let what = format!(
                "{name}, {}",
                if read_only { "read-only" } else { "writable" }
            );
            let r = guarded(&format!("{what}: open"), || {
                Store::open(dir.path(), opts(index, read_only))
            });
            let msg = match r {
                Ok(st) => panic!(
                    "{what}: a pool that holds a store but lost its root was opened as a store of {} keys",
                    st.len()
                ),
                Err(e) => e.to_string(),
            };
            assert!(
                msg.contains("no store root") && msg.contains("pmhash check"),
                "{what}: the refusal says what is wrong and what to run: {msg}"
            );
            assert!(
                std::fs::read(&path).unwrap() == bad,
                "{what}: the refused file changed"
            );
        }
        // The same pool handed to `open_pool` (as the engine forms do).
        let pool = Pool::open(
            &path,
            &PoolOptions {
                mode: Mode::Mapped,
                ..PoolOptions::default()
            },
        )
        .unwrap();
        let pool = Arc::new(pool);
        let r = guarded(&format!("{name}: open_pool"), || {
            Store::open_pool(pool.clone(), opts(index, false))
        });
        assert!(
            r.is_err(),
            "{name}: open_pool formatted a pool that holds data"
        );
        assert_eq!(pool.aux_root(), 0, "{name}: open_pool linked a new root");
    }
}

#[test]
fn a_get_through_a_damaged_slot_is_an_error_not_a_missing_key() {
    // Bits no write produces in the victim's slot, written after the open's
    // check: outside the pool, off an entry boundary, and a well-formed
    // entry of a key of another slot. Every read of the victim is an
    // `Err(Corrupt)` that names the value and points at `pmhash check`.
    let dir = TempDir::new("store-pindex", "get-damaged");
    let (_, good, m) = built(&dir, hash_index());
    let at = victim_value_word(&good);
    let lens = lens_word(key(3).len(), value(3).len());
    let other = (0..good.len() - 64)
        .step_by(64)
        .find(|&o| word(&good, o + 8) == lens && good[o + 40..o + 40 + 8] == key(3)[..])
        .expect("key 3's entry") as u64;
    for (name, v) in [
        ("outside the pool", 0x1aa0_c000u64),
        ("off an entry boundary", word(&good, at) + 7),
        ("another slot's key", other),
    ] {
        let what = format!("store-hash, victim's slot {name}");
        std::fs::write(dir.path().join(POOL_FILE), &good).unwrap();
        let st = open_ok(dir.path(), opts(hash_index(), false), &what);
        damage_open_store(&st, &good, v);
        let expect = |r: Result<bool, engine::Error>, op: &str| match r {
            Ok(found) => panic!("{what}: {op} of the victim returned Ok (found: {found})"),
            Err(e) => {
                let msg = e.to_string();
                assert!(
                    matches!(e, engine::Error::Corrupt(_))
                        && msg.contains(&format!("{v:#x}"))
                        && msg.contains("pmhash check"),
                    "{what}: {op} names the slot's value and the way out: {msg}"
                );
            }
        };
        expect(st.get(VICTIM).map(|g| g.is_some()), "get");
        expect(st.get_into(VICTIM, &mut Vec::new()), "get_into");
        expect(
            st.get_into_slice(VICTIM, &mut [0u8; 32])
                .map(|g| g.is_some()),
            "get_into_slice",
        );
        let mut out = Vec::new();
        expect(st.get_many(&[VICTIM], &mut out).map(|_| true), "get_many");
        for (k, want) in &m {
            assert_eq!(
                st.get(k).unwrap().as_ref(),
                Some(want),
                "{what}: a sound key"
            );
        }
        drop(st);
    }
}
