//! Deletes under `Strict` with the DRAM index: a key whose newest entry has
//! no valid history is deleted by marking that entry invalid in place (one
//! line flushed, one fence, no log bytes); a key with valid history still
//! gets a `del` entry. Either way the key stays deleted through a crash
//! (a drop without close: the log scan), a clean reopen, and GC.

mod common;

use common::{small_opts, verify, Model};
use engine::testkit::{mem_pool, test_pool_options};
use pmem::{persist, Mode, Pool};
use pmhash_store::{Options, Store, LAYOUT};
use std::sync::Arc;

fn mem_store(opts: &Options) -> (Arc<Pool>, Store) {
    let pool = mem_pool(&test_pool_options(
        LAYOUT,
        b"store-delete-tst",
        // Simulated: flushes and fences are counted (Volatile has none).
        Mode::Simulated,
        opts.create.pool_size,
        opts.open.max_pool_size,
        5,
    ));
    let s = Store::open_pool(pool.clone(), opts.clone()).expect("open a fresh store");
    (pool, s)
}

/// The store in `pool` reopened as after a crash (its image, no close).
fn crash_reopen(pool: &Pool, opts: &Options) -> (Arc<Pool>, Store) {
    let p = Arc::new(Pool::from_image(pool.image(), Mode::Volatile).unwrap());
    let s = Store::open_pool(p.clone(), opts.clone()).unwrap();
    assert_eq!(s.stats().opened_from, pmhash_store::OpenedFrom::LogScan);
    (p, s)
}

fn key(i: u64) -> Vec<u8> {
    i.to_be_bytes().to_vec()
}

/// Keys put once and then deleted: the deletes write no log bytes, flush
/// one line and fence once each, and the keys stay deleted after a crash
/// and after GC has reclaimed the all-dead files.
#[test]
fn a_delete_of_a_key_without_history_marks_its_entry_in_place() {
    let opts = small_opts();
    let (pool, s) = mem_store(&opts);
    let n = 2000u64;
    let mut m = Model::new();
    for i in 0..n {
        s.put(&key(i), &i.to_le_bytes()).unwrap();
        m.insert(key(i), i.to_le_bytes().to_vec());
    }
    let before = s.stats();
    let c0 = persist::counters();
    for i in (0..n).filter(|i| i % 3 != 0) {
        assert!(s.delete(&key(i)).unwrap(), "delete {i}");
        m.remove(&key(i));
    }
    let deletes = n - n.div_ceil(3);
    let c = persist::counters().since(&c0);
    let after = s.stats();
    assert_eq!(
        after.log_bytes, before.log_bytes,
        "deletes of keys without history appended log entries"
    );
    assert_eq!(c.fences, deletes, "fences for {deletes} deletes: {c:?}");
    assert_eq!(
        c.flushes, deletes,
        "lines flushed for {deletes} deletes: {c:?}"
    );
    verify(&s, &m, "after the deletes");
    // A crash right after: every delete was acknowledged, so durable.
    let (_p, s2) = crash_reopen(&pool, &opts);
    verify(&s2, &m, "crash reopen after the deletes");
    drop(s2);
    // Delete the rest: every file is all dead; GC frees the sealed ones
    // without relocating or marking anything.
    for i in (0..n).filter(|i| i % 3 == 0) {
        assert!(s.delete(&key(i)).unwrap());
        m.remove(&key(i));
    }
    let reclaimed = s.gc(usize::MAX).unwrap();
    assert!(reclaimed > 0, "no all-dead file was reclaimed");
    let st = s.stats();
    assert_eq!(st.entries_relocated, 0, "{st:?}");
    assert_eq!(st.entries_marked, 0, "{st:?}");
    verify(&s, &m, "after GC");
    let (_p, s2) = crash_reopen(&pool, &opts);
    verify(&s2, &m, "crash reopen after GC");
    assert_eq!(s2.len(), 0);
}

/// A key overwritten (its older entry still valid) gets a `del` entry, as
/// before: marking only the newest entry would bring the older value back
/// at the next log scan. A key deleted in place and put again is present
/// with the new value; deleted again, it is gone.
#[test]
fn a_delete_behind_valid_history_writes_a_del_entry() {
    let opts = small_opts();
    let (pool, s) = mem_store(&opts);
    let mut m = Model::new();
    s.put(b"twice", b"old value").unwrap();
    s.put(b"twice", b"new value").unwrap();
    s.put(b"again", b"first").unwrap();
    let before = s.stats().log_bytes;
    assert!(s.delete(b"twice").unwrap());
    assert!(
        s.stats().log_bytes > before,
        "a delete behind a valid older entry wrote no del entry"
    );
    assert!(s.delete(b"again").unwrap());
    s.put(b"again", b"second").unwrap();
    m.insert(b"again".to_vec(), b"second".to_vec());
    let (_p, s2) = crash_reopen(&pool, &opts);
    verify(&s2, &m, "crash reopen");
    drop(s2);
    assert!(s.delete(b"again").unwrap());
    m.remove(&b"again"[..]);
    assert!(
        !s.delete(b"again").unwrap(),
        "a second delete found the key"
    );
    let (_p, s2) = crash_reopen(&pool, &opts);
    verify(&s2, &m, "crash reopen after the second delete");
    s.close().unwrap();
}

/// `value_len` answers what `get` would return's length, without copying:
/// inline 8-byte values, values in the log, overwrites, deletes and
/// absent or impossible keys.
#[test]
fn value_len_agrees_with_get() {
    let opts = small_opts();
    let (_pool, s) = mem_store(&opts);
    s.put(&key(1), &7u64.to_le_bytes()).unwrap();
    s.put(&key(2), &[b'x'; 2000]).unwrap();
    s.put(b"a longer key", b"short").unwrap();
    s.put(b"a longer key", &[b'y'; 3_500]).unwrap();
    s.put(&key(3), b"gone").unwrap();
    assert!(s.delete(&key(3)).unwrap());
    for k in [
        key(1),
        key(2),
        key(3),
        key(4),
        b"a longer key".to_vec(),
        vec![b'k'; 5000],
    ] {
        let want = s.get(&k).ok().flatten().map(|v| v.len());
        assert_eq!(s.value_len(&k).unwrap(), want, "key of {} bytes", k.len());
    }
    assert_eq!(s.value_len(b"a longer key").unwrap(), Some(3_500));
}
