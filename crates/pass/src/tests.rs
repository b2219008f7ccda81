//! White-box tests: model runs that look inside (splits, hints, chains)
//! and crash images taken at chosen points.

use std::collections::HashMap;
use std::sync::Arc;

use engine::testkit::Rng;
use engine::{Durability, Engine, EngineConfig};
use pmem::{Mode, Pool, PoolOptions};

use crate::Pass;

fn pool(mode: Mode, size: u64) -> Arc<Pool> {
    Arc::new(
        Pool::create(
            std::path::Path::new(""),
            &PoolOptions {
                mode,
                size,
                max_size: size * 4,
                layout: crate::LAYOUT.into(),
                uuid: Some(*b"pass-white-box-1"),
                ..PoolOptions::default()
            },
        )
        .unwrap(),
    )
}

fn cfg(cap: u64) -> EngineConfig {
    EngineConfig {
        durability: Durability::Strict,
        initial_capacity: cap,
        threads: 1,
    }
}

#[test]
fn smoke_model_with_splits() {
    let p = pool(Mode::Volatile, 8 << 20);
    let ps = Pass::create(p, &cfg(16)).unwrap();
    let mut model = HashMap::new();
    let mut rng = Rng::new(7);
    for i in 0..20_000u64 {
        let k = rng.below(3000).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let v = rng.next();
        let op = rng.below(10);
        match op {
            0..=5 => {
                let fresh = !model.contains_key(&k);
                assert_eq!(ps.insert(k, v).unwrap(), fresh, "insert op {i}");
                if fresh {
                    model.insert(k, v);
                }
            }
            6 => {
                let had = model.contains_key(&k);
                assert_eq!(ps.update(k, v).unwrap(), had, "update op {i}");
                if had {
                    model.insert(k, v);
                }
            }
            7 | 8 => assert_eq!(
                ps.remove(k).unwrap(),
                model.remove(&k).is_some(),
                "remove op {i}"
            ),
            _ => {}
        }
        if i < 3000 || i % 250 == 0 {
            for (&k, &v) in &model {
                assert_eq!(ps.get(k), Some(v), "after op {i} ({op}): key {k:#x}");
            }
            if i % 500 == 0 {
                ps.check()
                    .unwrap_or_else(|e| panic!("check after op {i}: {e}"));
            }
        }
    }
    assert!(ps.tallies().splits > 20);
    assert_eq!(ps.tallies().split_failures, 0);
}

/// A crash at any fence of `create` leaves either no table and no block in
/// use, a complete table, or a root with `first = 0` that open refuses and
/// the next `create` reclaims — never a leaked block.
#[test]
fn a_crash_during_create_leaks_nothing() {
    use pmem::CrashChoice;
    use std::sync::Mutex;
    let p = pool(Mode::Simulated, 4 << 20);
    type Images = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;
    let imgs: Images = Arc::default();
    let sink = imgs.clone();
    p.set_fence_hook(Some(Box::new(move |n, site| {
        let mut v = sink.lock().unwrap();
        for c in [
            CrashChoice::Persisted,
            CrashChoice::Newest,
            CrashChoice::Random(n),
        ] {
            v.push((n, site.image(c)));
        }
    })))
    .unwrap();
    let ps = Pass::create(p.clone(), &cfg(5000)).unwrap();
    p.set_fence_hook(None).unwrap();
    drop(ps);
    let imgs = std::mem::take(&mut *imgs.lock().unwrap());
    assert!(imgs.len() > 30, "create issued {} fences", imgs.len() / 3);
    let (mut none, mut done, mut cut) = (0, 0, 0);
    for (n, img) in imgs {
        let p2 = Arc::new(Pool::from_image(img, Mode::Volatile).unwrap());
        if p2.root() == 0 {
            assert_eq!(
                p2.stats().bytes_in_use,
                0,
                "fence {n}: no table, blocks in use"
            );
            none += 1;
            continue;
        }
        let ps2 = match Pass::open(p2.clone(), &cfg(5000)) {
            Ok(ps2) => {
                done += 1;
                ps2
            }
            Err(e) => {
                assert!(e.to_string().contains("cut short"), "fence {n}: {e}");
                cut += 1;
                Pass::create(p2.clone(), &cfg(5000)).unwrap()
            }
        };
        ps2.insert(7, 7).unwrap();
        let r = ps2.check().unwrap();
        assert_eq!(
            r.reachable_bytes,
            p2.stats().bytes_in_use,
            "fence {n}: leak"
        );
    }
    assert!(none > 0 && done > 0 && cut > 0, "{none} / {done} / {cut}");
}

/// The one inline key whose hash is 0 lives in the root: it works like any
/// other key, survives reopen and crash images, and `for_each` and `check`
/// count it.
#[test]
fn the_zero_hash_key_is_an_ordinary_key() {
    use pmem::CrashChoice;
    use std::sync::Mutex;
    let p = pool(Mode::Simulated, 4 << 20);
    let ps = Pass::create(p.clone(), &cfg(16)).unwrap();
    let k0 = engine::hash::unfmix64(0) ^ crate::seed_of(&p);
    assert_eq!(ps.hash(crate::Key::Word(k0)), 0);
    for k in 0..300u64 {
        ps.insert(k.wrapping_mul(0x9e37_79b9_7f4a_7c15), k).unwrap();
    }
    let imgs: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let sink = imgs.clone();
    p.set_fence_hook(Some(Box::new(move |_, site| {
        let mut v = sink.lock().unwrap();
        v.push(site.image(CrashChoice::Persisted));
        v.push(site.image(CrashChoice::Newest));
    })))
    .unwrap();
    assert_eq!(ps.get(k0), None);
    assert!(ps.insert(k0, 1).unwrap());
    assert!(!ps.insert(k0, 2).unwrap());
    assert_eq!(ps.get(k0), Some(1));
    assert!(ps.update(k0, 3).unwrap());
    assert_eq!(ps.get(k0), Some(3));
    let mut seen = None;
    ps.for_each(&mut |k, v| {
        if k == k0 {
            seen = Some(v);
        }
    });
    assert_eq!(seen, Some(3));
    assert_eq!(ps.len(), 301);
    assert_eq!(ps.check().unwrap().keys, 301);
    assert!(ps.remove(k0).unwrap());
    assert!(!ps.remove(k0).unwrap());
    assert!(!ps.update(k0, 4).unwrap());
    p.set_fence_hook(None).unwrap();
    // Every crash image around those writes holds k0 absent or with a
    // value it had, and recovers to a consistent table.
    let imgs = std::mem::take(&mut *imgs.lock().unwrap());
    assert_eq!(imgs.len(), 6, "one fence per write of k0");
    for img in imgs {
        let p2 = Arc::new(Pool::from_image(img, Mode::Volatile).unwrap());
        let e = Pass::open(p2, &cfg(16)).unwrap();
        assert!(matches!(e.get(k0), None | Some(1) | Some(3)));
        assert_eq!(e.len(), 300 + e.get(k0).is_some() as u64);
        e.check().unwrap();
    }
    assert!(ps.insert(k0, 5).unwrap());
    ps.close().unwrap();
    let img = p.image();
    let p3 = Arc::new(Pool::from_image(img, Mode::Volatile).unwrap());
    let e = Pass::open(p3, &cfg(16)).unwrap();
    assert_eq!(e.get(k0), Some(5));
    assert_eq!(e.len(), 301);
}

/// The DRAM cells give the get the segment the PM tables give, at every
/// state a growth from one segment passes through: each split's step and
/// every growth of `k` (8 → 11 here), and again after a reopen rebuilds
/// them. Hashes near every bucket boundary of the window are checked, on
/// both sides, besides random ones.
#[test]
fn dram_cells_locate_as_the_pm_tables_do() {
    let p = pool(Mode::Volatile, 64 << 20);
    let ps = Pass::create(p.clone(), &cfg(16)).unwrap();
    let mut rng = Rng::new(3);
    let check = |ps: &Pass, rng: &mut Rng| {
        let sn = ps.snap();
        let mut hs: Vec<u64> = (0..200).map(|_| rng.next() | 1).collect();
        for l in sn.first..=2 * sn.first {
            let s = crate::table::fine_log2(l) & ((1 << crate::table::FINE) - 1);
            for d in [-2i64, -1, 0, 1] {
                let x = s.wrapping_add(d as u64) & ((1 << crate::table::FINE) - 1);
                hs.push(x << (64 - crate::table::FINE) | 0x5a5a);
            }
        }
        for h in hs {
            let want = ps.locate(h, &sn);
            let got = ps.locate_once(h).map(|(v, seg)| {
                assert_eq!(v, sn.v);
                seg
            });
            assert_eq!(got, want, "hash {h:#x}, first {}, k {}", sn.first, sn.k);
            // Every position of the window has its segment in the cells.
            assert!(want.is_some(), "hash {h:#x} outside the window");
            const FMASK: u64 = (1 << crate::table::FINE) - 1;
            let pos = sn.cf + ((h >> (64 - crate::table::FINE)).wrapping_sub(sn.cf) & FMASK);
            assert_eq!(ps.mirror.seg(pos, sn.k), want, "position {pos:#x}");
        }
    };
    let mut i = 0u64;
    let mut splits = 0;
    while ps.snap().k < 11 {
        i += 1;
        ps.insert(rng.next() | 1, i).unwrap();
        let s = ps.tallies().splits;
        if s != splits {
            splits = s;
            check(&ps, &mut rng);
        }
    }
    assert!(splits > 300, "only {splits} splits");
    ps.close().unwrap();
    let p2 = Arc::new(Pool::from_image(p.image(), Mode::Volatile).unwrap());
    let ps = Pass::open(p2, &cfg(16)).unwrap();
    check(&ps, &mut rng);
}
