//! `Store::put_batch` and `write_batch` (puts and deletes): the same
//! result as the writes one by one (repeated
//! keys included, through GC and both kinds of reopen), a bad pair fails
//! the batch before anything is written, concurrent batches over shared
//! keys neither deadlock nor lose a key, and a crash at any fence of a
//! batch (each unfenced line kept old, new or anything between) recovers
//! to the acknowledged state plus some of the batch in flight.

mod common;

use std::sync::{Arc, Mutex};

use common::{contents, crash_then_clean_reopen, small_opts, verify, Model};
use engine::testkit::{mem_pool, test_pool_options, Rng};
use pmem::{CrashChoice, Mode, Pool};
use pmhash_store::{Store, LAYOUT};

fn store(mode: Mode, seed: u64) -> (Arc<Pool>, Store) {
    let o = small_opts();
    let pool = mem_pool(&test_pool_options(
        LAYOUT,
        b"store-batch-test",
        mode,
        o.create.pool_size,
        o.open.max_pool_size,
        seed,
    ));
    let s = Store::open_pool(pool.clone(), o).expect("open a fresh store");
    (pool, s)
}

fn key(i: u64) -> Vec<u8> {
    // Mixed lengths: inline and heap keys of the DRAM index.
    let mut k = format!("k{i:03}").into_bytes();
    if i.is_multiple_of(3) {
        k.resize(k.len() + 30, b'x');
    }
    k
}

fn value(rng: &mut Rng, tag: u64) -> Vec<u8> {
    let len = [0usize, 3, 8, 40, 300][rng.below(5) as usize];
    let mut v = tag.to_le_bytes().to_vec();
    v.resize(len.max(8), b'v');
    v
}

/// A batch of 1..=max pairs over `keys` keys, repeats likely.
fn batch(rng: &mut Rng, keys: u64, max: u64, tag: &mut u64) -> Vec<(Vec<u8>, Vec<u8>)> {
    (0..1 + rng.below(max))
        .map(|_| {
            *tag += 1;
            (key(rng.below(keys)), value(rng, *tag))
        })
        .collect()
}

fn refs(b: &[(Vec<u8>, Vec<u8>)]) -> Vec<(&[u8], &[u8])> {
    b.iter().map(|(k, v)| (&k[..], &v[..])).collect()
}

#[test]
fn batches_equal_puts_one_by_one() {
    let (pool, s) = store(Mode::Volatile, 1);
    let mut rng = Rng::new(7);
    let mut m = Model::new();
    let mut tag = 0;
    for round in 0..400 {
        let b = batch(&mut rng, 60, 40, &mut tag);
        s.put_batch(&refs(&b)).unwrap();
        for (k, v) in b {
            m.insert(k, v);
        }
        if round % 7 == 0 {
            // Deletes between batches, so batches also re-insert.
            let k = key(rng.below(60));
            assert_eq!(s.delete(&k).unwrap(), m.remove(&k).is_some());
        }
        if round % 50 == 49 {
            s.gc(4).unwrap();
            verify(&s, &m, &format!("round {round}"));
        }
    }
    assert!(s.stats().files_reclaimed > 0, "GC never ran");
    verify(&s, &m, "end");
    // A crash (log scan) and a clean reopen (image) agree.
    drop(s);
    crash_then_clean_reopen(&pool, &m, "end");
}

/// `b` with one pair in `1 + rng.below(3)` turned into a delete when
/// `deletes` is 1.
fn ops(rng: &mut Rng, b: Vec<(Vec<u8>, Vec<u8>)>, deletes: u64) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
    b.into_iter()
        .map(|(k, v)| {
            if deletes == 1 && rng.below(3) == 0 {
                (k, None)
            } else {
                (k, Some(v))
            }
        })
        .collect()
}

fn op_refs(b: &[(Vec<u8>, Option<Vec<u8>>)]) -> Vec<(&[u8], Option<&[u8]>)> {
    b.iter().map(|(k, v)| (&k[..], v.as_deref())).collect()
}

#[test]
fn write_batches_with_deletes_equal_the_writes_one_by_one() {
    let (pool, s) = store(Mode::Volatile, 6);
    let mut rng = Rng::new(17);
    let mut m = Model::new();
    let mut tag = 0;
    for round in 0..400 {
        // Repeated keys: a put then a delete of one key, a delete then a
        // put, deletes of absent keys.
        let b = batch(&mut rng, 60, 40, &mut tag);
        let b = ops(&mut rng, b, 1);
        s.write_batch(&op_refs(&b)).unwrap();
        for (k, v) in b {
            match v {
                Some(v) => m.insert(k, v),
                None => m.remove(&k),
            };
        }
        if round % 50 == 49 {
            s.gc(4).unwrap();
            verify(&s, &m, &format!("round {round}"));
        }
    }
    assert!(s.stats().files_reclaimed > 0, "GC never ran");
    verify(&s, &m, "end");
    drop(s);
    crash_then_clean_reopen(&pool, &m, "end");
}

#[test]
fn a_bad_pair_fails_the_batch_before_anything_is_written() {
    let (pool, s) = store(Mode::Volatile, 2);
    s.put(b"a", b"1").unwrap();
    let before = pool.image();
    let big_key = vec![b'k'; pmhash_store::MAX_KEY + 1];
    let big_value = vec![b'v'; pmhash_store::MAX_VALUE + 1];
    for bad in [
        vec![(&b"a"[..], &b"2"[..]), (&big_key[..], &b"x"[..])],
        vec![(&b"b"[..], &b"2"[..]), (&b"c"[..], &big_value[..])],
    ] {
        let e = s.put_batch(&bad).unwrap_err();
        assert_eq!(e.done, 0, "{e}");
        assert!(matches!(e.error, engine::Error::InvalidArgument(_)), "{e}");
    }
    assert_eq!(pool.image(), before, "a refused batch changed the pool");
    assert_eq!(s.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
    assert_eq!(s.get(b"b").unwrap(), None);
    // An empty batch is a no-op.
    s.put_batch(&[]).unwrap();
    assert_eq!(s.len(), 1);
}

#[test]
fn concurrent_batches_over_shared_keys() {
    let (_pool, s) = store(Mode::Volatile, 3);
    let s = Arc::new(s);
    const KEYS: u64 = 50;
    std::thread::scope(|sc| {
        for t in 0..4u64 {
            let s = s.clone();
            sc.spawn(move || {
                let mut rng = Rng::new(100 + t);
                let mut tag = t << 40;
                for _ in 0..300 {
                    // Keys in random order: the stripes and files must be
                    // locked in a fixed order or two batches deadlock.
                    let b = batch(&mut rng, KEYS, 24, &mut tag);
                    s.put_batch(&refs(&b)).unwrap();
                }
            });
        }
        let s = s.clone();
        sc.spawn(move || {
            for _ in 0..200 {
                for i in 0..KEYS {
                    if let Some(v) = s.get(&key(i)).unwrap() {
                        assert!(v.len() >= 8, "a torn value");
                    }
                }
            }
        });
    });
    s.gc(8).unwrap();
    let m = contents(&s);
    assert!(m.len() as u64 <= KEYS && m.len() as u64 > KEYS / 2);
    verify(&s, &m, "after concurrent batches");
}

/// What a crash may keep: the acknowledged state plus, for each key of the
/// batch in flight, any of its values in that batch (`None`: a delete, so
/// the key may be gone).
struct Expect {
    acked: Model,
    pending: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

fn check_crash(img: Vec<u8>, e: &Expect) -> Result<(), String> {
    let p = Arc::new(Pool::from_image(img, Mode::Volatile).map_err(|x| x.to_string())?);
    let s = Store::open_pool(p, small_opts()).map_err(|x| format!("reopen: {x}"))?;
    let got = contents(&s);
    for (k, v) in &got {
        let ok = e.acked.get(k) == Some(v)
            || e.pending
                .iter()
                .any(|(pk, pv)| pk == k && pv.as_ref() == Some(v));
        if !ok {
            return Err(format!(
                "key {k:?} has a value never acknowledged nor in flight"
            ));
        }
    }
    for k in e.acked.keys() {
        let deleting = e.pending.iter().any(|(pk, pv)| pk == k && pv.is_none());
        if !got.contains_key(k) && !deleting {
            return Err(format!("acknowledged key {k:?} lost"));
        }
    }
    s.check().map_err(|x| format!("check: {x}"))?;
    Ok(())
}

#[test]
fn a_crash_at_any_fence_of_a_batch_keeps_what_was_acknowledged() {
    let (pool, s) = store(Mode::Simulated, 4);
    let expect = Arc::new(Mutex::new(Expect {
        acked: Model::new(),
        pending: Vec::new(),
    }));
    let failures: Arc<Mutex<Vec<String>>> = Arc::default();
    let fences = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (e2, f2, n2) = (expect.clone(), failures.clone(), fences.clone());
    pool.set_fence_hook(Some(Box::new(move |_, site| {
        let n = n2.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let e = e2.lock().unwrap();
        for choice in [
            CrashChoice::Persisted,
            CrashChoice::Newest,
            CrashChoice::Random(n),
        ] {
            if let Err(m) = check_crash(site.image(choice), &e) {
                f2.lock()
                    .unwrap()
                    .push(format!("fence {n} ({choice:?}): {m}"));
            }
        }
    })))
    .unwrap();
    let mut rng = Rng::new(11);
    let mut tag = 0;
    for round in 0..60 {
        // Every other batch also deletes (write_batch, as EXEC does).
        let b = batch(&mut rng, 30, 12, &mut tag);
        let b = ops(&mut rng, b, round % 2);
        expect.lock().unwrap().pending = b.clone();
        s.write_batch(&op_refs(&b)).unwrap();
        let mut e = expect.lock().unwrap();
        for (k, v) in b {
            match v {
                Some(v) => e.acked.insert(k, v),
                None => e.acked.remove(&k),
            };
        }
        e.pending.clear();
        drop(e);
        if round % 10 == 9 {
            // Single puts between batches share the files with them.
            let k = key(rng.below(30));
            tag += 1;
            let v = value(&mut rng, tag);
            expect.lock().unwrap().pending = vec![(k.clone(), Some(v.clone()))];
            s.put(&k, &v).unwrap();
            let mut e = expect.lock().unwrap();
            e.acked.insert(k, v);
            e.pending.clear();
        }
    }
    pool.set_fence_hook(None).unwrap();
    let n = fences.load(std::sync::atomic::Ordering::Relaxed);
    assert!(n >= 60, "only {n} fences");
    let f = failures.lock().unwrap();
    assert!(
        f.is_empty(),
        "{} of {} crash states failed: {:#?}",
        f.len(),
        3 * n,
        &f[..f.len().min(10)]
    );
}

#[test]
fn get_many_answers_as_get_does() {
    let (_pool, s) = store(Mode::Volatile, 5);
    let mut rng = Rng::new(21);
    let mut tag = 0;
    for _ in 0..50 {
        let b = batch(&mut rng, 80, 30, &mut tag);
        s.put_batch(&refs(&b)).unwrap();
    }
    for k in (0..80).step_by(9) {
        s.delete(&key(k)).unwrap();
    }
    let huge = vec![b'k'; pmhash_store::MAX_KEY + 1];
    let mut out = Vec::new();
    // Many rounds, so sampled gets fill the RAF cache and later ones hit.
    for round in 0..200 {
        let keys: Vec<Vec<u8>> = (0..1 + rng.below(40))
            .map(|_| match rng.below(20) {
                0 => huge.clone(),
                1 => b"absent".to_vec(),
                _ => key(rng.below(90)),
            })
            .collect();
        let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
        s.get_many(&refs, &mut out).unwrap();
        assert_eq!(out.len(), keys.len());
        for (k, got) in keys.iter().zip(&out) {
            let want = s.get(k).unwrap_or(None);
            assert_eq!(got, &want, "round {round}: key {k:?}");
        }
    }
    assert!(s.stats().raf_hits > 0, "the cache never answered");
}
