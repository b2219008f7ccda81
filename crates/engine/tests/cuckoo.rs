//! The DRAM cuckoo filter: exactness (no false negatives, one copy per
//! insert), `Full` leaving the filter unchanged, the measured false-positive
//! rate against the formula, readers racing writers that kick, the parallel
//! build, and replacing a filter under readers.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pmhash_engine::cuckoo::{self, CuckooFilter, FilterCell, Full, MAX_LOAD};
use pmhash_engine::testkit::Rng;

/// `n` distinct random keys (0 and `u64::MAX` among them).
fn keys(seed: u64, n: usize) -> Vec<u64> {
    let mut rng = Rng::new(seed);
    let mut seen = HashSet::with_capacity(n);
    let mut v = Vec::with_capacity(n);
    for k in [0, u64::MAX] {
        if v.len() < n && seen.insert(k) {
            v.push(k);
        }
    }
    while v.len() < n {
        let k = rng.next();
        if seen.insert(k) {
            v.push(k);
        }
    }
    v
}

/// Fills `f` with random keys up to `load` (every insert must succeed) and
/// returns them.
fn fill(f: &CuckooFilter, seed: u64, load: f64) -> Vec<u64> {
    let n = (f.slots() as f64 * load) as usize;
    let ks = keys(seed, n);
    for (i, &k) in ks.iter().enumerate() {
        assert_eq!(
            f.insert(k),
            Ok(()),
            "insert {i} of {n} (load {:.3}) failed",
            f.load()
        );
    }
    ks
}

#[test]
fn sizing_follows_the_formula() {
    use pmhash_engine::cuckoo::SIZE_LOAD;
    assert_eq!(CuckooFilter::with_capacity(0).buckets(), 2);
    assert_eq!(CuckooFilter::with_capacity(1).buckets(), 2);
    // Any bucket count works ((h - i) mod n is an involution): 3400 keys
    // at 4 slots and load 0.85 need exactly 1000 buckets.
    assert_eq!(CuckooFilter::with_capacity(3400).buckets(), 1000);
    assert_eq!(CuckooFilter::with_capacity(3401).buckets(), 1001);
    assert_eq!(CuckooFilter::with_buckets(1000).buckets(), 1000);
    assert_eq!(CuckooFilter::with_buckets(0).buckets(), 2);
    for n in [100u64, 10_000, 1_000_000] {
        let f = CuckooFilter::with_capacity(n);
        let full = n as f64 / f.slots() as f64;
        assert!((full - SIZE_LOAD).abs() < 0.02, "{n}: load {full}");
        assert!(full <= MAX_LOAD, "{n}: load {full}");
    }
}

/// The alternate bucket is an involution at every size, odd ones included,
/// and stays in range.
#[test]
fn alternate_bucket_round_trips_at_any_size() {
    for n in [2usize, 3, 7, 1000, 1001, 65_537, 2_941_177] {
        let f = CuckooFilter::with_buckets(n);
        for k in 0..2000u64 {
            let p = f.probe(k.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            assert!(p.i1() < n && p.i2() < n, "n {n}: {} {}", p.i1(), p.i2());
        }
    }
    // Insert to MAX_LOAD in an odd-sized filter: every key found (kicks
    // move fingerprints to their alternates and back).
    let f = CuckooFilter::with_buckets(1001);
    let n = (f.slots() as f64 * MAX_LOAD) as u64;
    let ks = keys(7, n as usize);
    for &k in &ks {
        f.insert(k).unwrap();
    }
    assert!(f.kicks() > 0);
    assert!(ks.iter().all(|&k| f.contains(k)));
}

#[test]
fn no_false_negatives_up_to_max_load() {
    let f = CuckooFilter::with_buckets(1 << 14);
    let ks = fill(&f, 1, MAX_LOAD);
    assert_eq!(f.len(), ks.len() as u64);
    assert!(f.load() >= MAX_LOAD - 1e-4, "load {}", f.load());
    assert!(!f.needs_growth(), "exactly at MAX_LOAD is not over it");
    assert!(f.kicks() > 0, "filling to 0.9 needs kick-outs");
    for &k in &ks {
        assert!(f.contains(k), "false negative for {k:#x}");
    }
    // One more key puts it over MAX_LOAD.
    let extra = keys(2, 10).into_iter().find(|k| !ks.contains(k)).unwrap();
    f.insert(extra).unwrap();
    assert!(f.needs_growth());
}

#[test]
fn probes_agree_and_rebase_across_sizes() {
    let small = CuckooFilter::with_buckets(64);
    let big = CuckooFilter::with_buckets(1 << 12);
    for &k in &keys(3, 2000) {
        let p = small.probe(k);
        assert!((1..=4095).contains(&p.fp()));
        assert!(p.i1() < 64 && p.i2() < 64);
        assert_eq!(p.fp(), big.probe(k).fp(), "fingerprint is size-independent");
        big.insert(k).unwrap();
        // A probe made by another filter is recomputed, not misread.
        assert!(big.contains_probe(&p));
        big.prefetch(&p);
    }
}

/// Keys whose fingerprints are all different (so no key can answer for
/// another).
fn unique_fp_keys(f: &CuckooFilter, seed: u64, n: usize) -> Vec<u64> {
    let mut fps = HashSet::new();
    keys(seed, 8 * n)
        .into_iter()
        .filter(|&k| fps.insert(f.probe(k).fp()))
        .take(n)
        .collect()
}

#[test]
fn remove_makes_unique_keys_absent() {
    let f = CuckooFilter::with_buckets(1 << 10);
    let ks = unique_fp_keys(&f, 4, 2000);
    assert_eq!(ks.len(), 2000);
    for &k in &ks {
        f.insert(k).unwrap();
    }
    let (gone, kept) = ks.split_at(1000);
    for &k in gone {
        assert!(f.remove(k), "remove of a present key");
    }
    assert_eq!(f.len(), 1000);
    for &k in gone {
        assert!(!f.contains(k), "{k:#x} still present after remove");
        assert!(!f.remove(k), "second remove of {k:#x} found a copy");
    }
    for &k in kept {
        assert!(f.contains(k));
    }
    assert_eq!(f.len(), 1000);
}

#[test]
fn duplicates_are_counted_copies() {
    let f = CuckooFilter::with_buckets(1 << 10);
    let k = keys(5, 50)
        .into_iter()
        .find(|&k| {
            let p = f.probe(k);
            p.i1() != p.i2()
        })
        .unwrap();
    f.insert(k).unwrap();
    f.insert(k).unwrap();
    assert_eq!(f.len(), 2);
    assert!(f.remove(k));
    assert!(f.contains(k), "one copy left");
    assert!(f.remove(k));
    assert!(!f.contains(k));
    assert!(!f.remove(k));
    assert!(f.is_empty());
    // Two buckets of four lanes hold 8 copies; the next ones go to the
    // exact stash, and past it the insert is `Full`.
    let most = 8 + cuckoo::STASH;
    for i in 0..most {
        assert_eq!(f.insert(k), Ok(()), "copy {i}");
    }
    assert_eq!(f.stashed(), cuckoo::STASH as u64);
    assert_eq!(f.insert(k), Err(Full));
    assert_eq!(f.len(), most as u64);
    for _ in 0..most {
        assert!(f.contains(k));
        assert!(f.remove(k));
    }
    assert!(!f.contains(k));
}

#[test]
fn full_changes_nothing() {
    let f = CuckooFilter::with_buckets(64);
    let candidates = keys(6, 1000);
    let mut inserted = Vec::new();
    let mut fulls = 0;
    for &k in &candidates {
        let before = f.len();
        match f.insert(k) {
            Ok(()) => {
                assert_eq!(f.len(), before + 1);
                inserted.push(k);
            }
            Err(Full) => {
                fulls += 1;
                assert_eq!(f.len(), before, "a Full insert changed the count");
                for &p in &inserted {
                    assert!(f.contains(p), "{p:#x} lost by a failed insert");
                }
            }
        }
    }
    assert!(
        fulls > 500,
        "only {fulls} of 1000 inserts into 256 slots failed"
    );
    assert!(
        f.load() > MAX_LOAD,
        "the path search should fill past {MAX_LOAD} before giving up (load {})",
        f.load()
    );
    // Removing one key makes room for exactly one more.
    assert!(f.remove(inserted[0]));
    let again = candidates
        .iter()
        .find(|&&k| !inserted.contains(&k) && f.insert(k).is_ok());
    assert!(again.is_some(), "no key fits into the freed lane");
}

/// Fills a fresh filter to `load` and counts how many of 1M keys it never
/// saw it claims to hold.
fn measured_fpr(load: f64, seed: u64) -> (f64, f64) {
    let f = CuckooFilter::with_buckets(1 << 16);
    let present: HashSet<u64> = fill(&f, seed, load).into_iter().collect();
    let mut rng = Rng::new(seed ^ 0xabcd_ef01);
    let mut tried = 0u64;
    let mut hits = 0u64;
    while tried < 1_000_000 {
        let k = rng.next();
        if present.contains(&k) {
            continue;
        }
        tried += 1;
        hits += f.contains(k) as u64;
    }
    (hits as f64 / tried as f64, f.expected_fpr())
}

#[test]
fn measured_fpr_matches_the_formula() {
    for (load, seed) in [(0.9, 7), (0.5, 8)] {
        let (measured, expected) = measured_fpr(load, seed);
        eprintln!("load {load}: expected fpr {expected:.6}, measured {measured:.6}");
        // 1M lookups see ~1000-1800 false positives: 20% is over 6 sigma.
        assert!(
            (measured - expected).abs() <= 0.2 * expected,
            "load {load}: measured {measured} vs expected {expected}"
        );
    }
    // The formula itself: 1 - (1 - 1/4095)^(8 · load).
    let f = CuckooFilter::with_buckets(2);
    assert_eq!(f.expected_fpr(), 0.0);
    f.insert(1).unwrap();
    let want = 1.0 - (1.0 - 1.0 / 4095.0f64).powf(8.0 / 8.0);
    assert!((f.expected_fpr() - want).abs() < 1e-12);
}

/// Writers insert and remove churn keys at load ≥ 0.85 (forcing kicks)
/// while readers check keys that stay present: no reader may miss one.
/// A large filter (many buckets, few collisions between a reader and a
/// kick) and a small one (nearly every insert kicks through the buckets
/// the readers are looking at).
#[test]
fn readers_never_miss_while_writers_kick() {
    stress(1 << 11, 2, 60_000, 1000);
    stress(16, 2, 500_000, 50_000);
}

/// The same with four writers: their inserts into free lanes take no lock
/// and race the others' kicks and removes. On a large filter, and on a
/// tiny one where every insert's lanes lie on the others' kick paths.
#[test]
fn concurrent_writers_lose_nothing() {
    stress(1 << 14, 4, 60_000, 1000);
    stress(16, 4, 200_000, 20_000);
}

fn stress(buckets: usize, writers: usize, ops: usize, min_kicks: u64) {
    let f = CuckooFilter::with_buckets(buckets);
    let all = keys(9, 2 * f.slots() as usize);
    let stable = &all[..(f.slots() as f64 * 0.5) as usize];
    let churn = &all[stable.len()..];
    for &k in stable {
        f.insert(k).unwrap();
    }
    // The writers, each with its own churn keys, keep it 0.875 full.
    let per_writer = (f.slots() as f64 * 0.375 / writers as f64).ceil() as usize;
    let owned: Vec<&[u64]> = churn.chunks(churn.len() / writers).take(writers).collect();
    for own in &owned {
        for &k in &own[..per_writer] {
            f.insert(k).unwrap();
        }
    }
    assert!(f.load() >= 0.85, "load {}", f.load());
    let kicks_before = f.kicks();
    let done = AtomicBool::new(false);
    let misses = AtomicU64::new(0);
    let reads = AtomicU64::new(0);
    let fulls = AtomicU64::new(0);
    let mut held: Vec<u64> = Vec::new();
    std::thread::scope(|s| {
        for r in 0..2 {
            let (f, done, misses, reads) = (&f, &done, &misses, &reads);
            s.spawn(move || {
                let mut i = r * 7919 % stable.len();
                while !done.load(Ordering::Relaxed) {
                    for _ in 0..1000 {
                        i = (i + 1) % stable.len();
                        if !f.contains(stable[i]) {
                            misses.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    reads.fetch_add(1000, Ordering::Relaxed);
                }
            });
        }
        let writers: Vec<_> = owned
            .iter()
            .enumerate()
            .map(|(w, own)| {
                let (f, fulls) = (&f, &fulls);
                s.spawn(move || {
                    // `own[..per_writer]` are in; cycle: remove the oldest,
                    // insert the next.
                    let mut rng = Rng::new(w as u64);
                    let mut present: Vec<u64> = own[..per_writer].to_vec();
                    let mut spare: Vec<u64> = own[per_writer..].to_vec();
                    for _ in 0..ops {
                        let i = rng.below(present.len() as u64) as usize;
                        let out = present.swap_remove(i);
                        assert!(f.remove(out), "remove of a present churn key");
                        spare.push(out);
                        let j = rng.below(spare.len() as u64) as usize;
                        let inn = spare.swap_remove(j);
                        match f.insert(inn) {
                            Ok(()) => present.push(inn),
                            Err(Full) => {
                                fulls.fetch_add(1, Ordering::Relaxed);
                                spare.push(inn);
                            }
                        }
                    }
                    present
                })
            })
            .collect();
        // Stop the readers before a writer's panic is raised here, or the
        // scope would wait for them forever.
        let joined: Vec<_> = writers.into_iter().map(|w| w.join()).collect();
        done.store(true, Ordering::Relaxed);
        for j in joined {
            held.extend(j.unwrap_or_else(|e| std::panic::resume_unwind(e)));
        }
    });
    let kicks = f.kicks() - kicks_before;
    eprintln!(
        "stress: {} reads, {kicks} kicks, {} fulls, load {:.3}",
        reads.load(Ordering::Relaxed),
        fulls.load(Ordering::Relaxed),
        f.load()
    );
    assert_eq!(misses.load(Ordering::Relaxed), 0, "false negatives");
    assert!(
        kicks > min_kicks,
        "only {kicks} kicks: the test did not stress moves"
    );
    assert!(reads.load(Ordering::Relaxed) > 0);
    for &k in stable.iter().chain(&held) {
        assert!(
            f.contains(k),
            "{k:#x} inserted and never removed, not found"
        );
    }
    // Every fingerprint in place exactly once: the count matches the keys
    // held, and removing them all leaves nothing behind.
    assert_eq!(f.len(), (stable.len() + held.len()) as u64);
    for &k in stable.iter().chain(&held) {
        assert!(f.remove(k), "remove of {k:#x} found no copy");
    }
    assert_eq!(f.len(), 0);
    assert!(f.is_empty());
}

#[test]
fn build_with_two_threads_holds_every_key() {
    let ks = keys(10, 1_000_000);
    let (a, b) = ks.split_at(ks.len() / 2);
    let runs = AtomicUsize::new(0);
    let feed = |t: usize, sink: &mut dyn FnMut(u64)| {
        runs.fetch_add(1, Ordering::Relaxed);
        for &k in if t == 0 { a } else { b } {
            sink(k);
        }
    };
    let started = Instant::now();
    let f = cuckoo::build(ks.len() as u64, 2, &feed);
    let took = started.elapsed();
    eprintln!(
        "build of 1M keys, 2 threads: {:.1} ms, {} buckets, load {:.3}",
        took.as_secs_f64() * 1e3,
        f.buckets(),
        f.load()
    );
    assert_eq!(runs.load(Ordering::Relaxed), 2, "sized right: one pass");
    assert_eq!(f.len(), ks.len() as u64);
    assert!(!f.needs_growth());
    for &k in &ks {
        assert!(f.contains(k), "{k:#x} missing after build");
    }

    // Undersized: the build starts over, bigger, and still holds every key.
    runs.store(0, Ordering::Relaxed);
    let small = &ks[..100_000];
    let (a, b) = small.split_at(small.len() / 2);
    let feed = |t: usize, sink: &mut dyn FnMut(u64)| {
        runs.fetch_add(1, Ordering::Relaxed);
        for &k in if t == 0 { a } else { b } {
            sink(k);
        }
    };
    let f = cuckoo::build(1000, 2, &feed);
    assert!(runs.load(Ordering::Relaxed) >= 4, "a second pass ran");
    assert_eq!(f.len(), small.len() as u64);
    assert!(f.load() <= MAX_LOAD);
    for &k in small {
        assert!(f.contains(k));
    }
}

#[test]
fn build_survives_a_key_fed_many_times() {
    // 20 copies of one key cannot fit in its 8 lanes at any size: the build
    // must still end, holding the key.
    let feed = |_t: usize, sink: &mut dyn FnMut(u64)| {
        for k in 0..1000u64 {
            sink(k);
        }
        for _ in 0..20 {
            sink(12345);
        }
    };
    let f = cuckoo::build(1000, 1, &feed);
    for k in (0..1000u64).chain([12345]) {
        assert!(f.contains(k));
    }
}

#[test]
fn replace_under_readers_never_misses() {
    let stable = keys(11, 20_000);
    let make = |extra: usize| {
        let f = CuckooFilter::with_capacity((stable.len() + extra) as u64);
        for &k in &stable {
            f.insert(k).unwrap();
        }
        f
    };
    let cell = FilterCell::new(make(0));
    let done = AtomicBool::new(false);
    let misses = AtomicU64::new(0);
    let reads = AtomicU64::new(0);
    std::thread::scope(|s| {
        for r in 0..2 {
            let (cell, done, misses, reads, stable) = (&cell, &done, &misses, &reads, &stable);
            s.spawn(move || {
                let mut i = r * 104_729;
                while !done.load(Ordering::Relaxed) {
                    for _ in 0..256 {
                        i = (i + 1) % stable.len();
                        if !cell.get().contains(stable[i]) {
                            misses.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    reads.fetch_add(256, Ordering::Relaxed);
                }
            });
        }
        for round in 0..60 {
            cell.replace(make((round % 3) * 30_000));
        }
        done.store(true, Ordering::Relaxed);
    });
    assert_eq!(misses.load(Ordering::Relaxed), 0);
    assert!(reads.load(Ordering::Relaxed) > 0);
    assert!(cell.bytes() >= cell.get().buckets() as u64 * 8);
}

#[test]
fn nested_refs_keep_the_old_filter_alive() {
    let old = CuckooFilter::with_buckets(64);
    old.insert(42).unwrap();
    let cell = FilterCell::new(old);
    let replaced = AtomicBool::new(false);
    let outer = cell.get();
    let inner = cell.get();
    // Dropping the first reference first must not release the second.
    drop(outer);
    std::thread::scope(|s| {
        s.spawn(|| {
            cell.replace(CuckooFilter::with_buckets(128));
            replaced.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !replaced.load(Ordering::SeqCst),
            "replace freed a filter still referenced"
        );
        assert!(inner.contains(42));
        assert_eq!(inner.buckets(), 64);
        drop(inner);
    });
    assert!(replaced.load(Ordering::SeqCst));
    let now = cell.get();
    assert_eq!(now.buckets(), 128);
    assert!(!now.contains(42));
}

/// `n` keys whose (unseeded) filter hashes agree in their low 44 bits: the
/// same bucket pair and fingerprint at every size up to 2^32 buckets.
fn colliding_keys(f: &CuckooFilter, n: u64) -> Vec<u64> {
    // Find the seed-free hash of key 0 through the public probe: the filter
    // hashes fmix64(key ^ seed); invert with unfmix64 around a chosen hash.
    let seed = f.seed() ^ 0x6a09_e667_f3bc_c909;
    let low = 0x0abc_def1_2345u64 & ((1 << 44) - 1);
    let keys: Vec<u64> = (1..=n)
        .map(|j| pmhash_engine::hash::unfmix64(j << 44 | low) ^ seed)
        .collect();
    let p0 = f.probe(keys[0]);
    for &k in &keys {
        let p = f.probe(k);
        assert_eq!((p.i1(), p.i2(), p.fp()), (p0.i1(), p0.i2(), p0.fp()));
    }
    keys
}

/// More than eight keys sharing a fingerprint and a bucket pair: the ninth
/// on go to the exact stash (no growth, no false negative, exact removal),
/// and only past the stash is the filter `Full`, with nothing changed.
#[test]
fn colliding_keys_go_to_the_exact_stash() {
    let f = CuckooFilter::with_buckets(1 << 10);
    let keys = colliding_keys(&f, 8 + pmhash_engine::cuckoo::STASH as u64 + 1);
    let (fit, over) = keys.split_at(keys.len() - 1);
    for &k in fit {
        assert!(f.insert(k).is_ok());
    }
    assert_eq!(f.stashed(), pmhash_engine::cuckoo::STASH as u64);
    assert_eq!(f.len(), fit.len() as u64);
    assert!(fit.iter().all(|&k| f.contains(k)));
    assert_eq!(f.insert(over[0]), Err(cuckoo::Full));
    assert_eq!(f.len(), fit.len() as u64);
    // Remove the bucket-held ones first, then the stashed ones: every key
    // still present stays found at every step.
    for (i, &k) in fit.iter().enumerate() {
        assert!(f.remove(k), "remove {i}");
        assert!(
            fit[i + 1..].iter().all(|&k| f.contains(k)),
            "false negative after remove {i}"
        );
    }
    assert!(f.is_empty());
    assert_eq!(f.stashed(), 0);
}

/// A seeded filter hashes differently: keys built to collide in the
/// unseeded filter spread out in a seeded one.
#[test]
fn seeding_changes_the_hash() {
    let plain = CuckooFilter::with_buckets(1 << 10);
    let keys = colliding_keys(&plain, 12);
    let seeded = CuckooFilter::with_buckets(1 << 10).seeded(0x1234_5678_9abc_def1);
    let distinct: std::collections::HashSet<_> = keys
        .iter()
        .map(|&k| {
            let p = seeded.probe(k);
            (p.i1(), p.fp())
        })
        .collect();
    assert!(
        distinct.len() > 6,
        "seeded probes still collide: {}",
        distinct.len()
    );
    for &k in &keys {
        assert!(seeded.insert(k).is_ok());
    }
    assert_eq!(seeded.stashed(), 0);
}

/// A build fed one key more often than the bucket pair and the stash can
/// hold gives up after four doublings and returns a saturated filter that
/// answers "maybe" to everything (no false negative, no endless loop).
#[test]
fn a_build_that_cannot_place_a_key_saturates() {
    let key = 42u64;
    let times = 8 + pmhash_engine::cuckoo::STASH + 1;
    let feed = |_t: usize, sink: &mut dyn FnMut(u64)| {
        for _ in 0..times {
            sink(key);
        }
    };
    let f = cuckoo::build_with_buckets(16, 7, 1, &feed);
    assert!(f.is_saturated());
    assert!(f.contains(key));
    assert!(f.contains(key ^ 1), "a saturated filter answers maybe");
    // `holds_copy` answers from the buckets alone: the key's copies are
    // there, another key's fingerprint (almost surely) is not.
    assert!(f.holds_copy(&f.probe(key)));
    let absent = (1u64..)
        .map(|k| key ^ (k << 8))
        .find(|&k| !f.holds_copy(&f.probe(k)))
        .unwrap();
    assert!(f.contains(absent), "still maybe for {absent:#x}");
}

#[test]
fn holds_copy_answers_from_the_pair_as_contains_does_without_a_stash() {
    let f = CuckooFilter::with_capacity(1000);
    for k in 0..500u64 {
        f.insert(k).unwrap();
    }
    for k in 0..500u64 {
        assert!(f.holds_copy(&f.probe(k)), "key {k}");
    }
    // Absent keys: a copy only where the filter has a false positive.
    let fp = (1_000_000..1_100_000u64)
        .filter(|&k| f.holds_copy(&f.probe(k)))
        .count();
    assert!(fp < 1_000, "{fp} absent keys with a copy in their pair");
    for k in 1_000_000..1_100_000u64 {
        assert_eq!(f.holds_copy(&f.probe(k)), f.contains(k), "key {k}");
    }
}
