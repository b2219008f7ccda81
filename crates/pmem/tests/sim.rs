//! The crash simulator: its line semantics, and the allocator's crash safety
//! checked on crash images taken at every fence of the allocation protocol.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};

use common::*;
use pmhash_pmem::{CrashChoice, CrashSite, Error, Link, Mode, Pool, CHUNK};

const LAYOUT: &str = "simtest";
const LINE: u64 = 64;
/// Random crash images taken at every fence (besides Persisted and Newest).
const RANDOM_PER_FENCE: u64 = 12;
const IMAGES_PER_FENCE: u64 = RANDOM_PER_FENCE + 2;

/// A crash image stored as the lines where it differs from a reference
/// image (keeps hundreds of images cheap).
struct Delta {
    /// Position among the images taken at its fence.
    index: u64,
    fence: u64,
    choice: CrashChoice,
    len: usize,
    lines: Vec<(usize, [u8; 64])>,
}

fn delta(reference: &[u8], img: &[u8], index: u64, fence: u64, choice: CrashChoice) -> Delta {
    let mut lines = Vec::new();
    for (i, line) in img.chunks_exact(64).enumerate() {
        let start = i * 64;
        if reference.get(start..start + 64) != Some(line) {
            lines.push((i, line.try_into().unwrap()));
        }
    }
    Delta {
        index,
        fence,
        choice,
        len: img.len(),
        lines,
    }
}

fn rebuild(reference: &[u8], d: &Delta) -> Vec<u8> {
    let mut img = reference.to_vec();
    img.resize(d.len, 0);
    img.truncate(d.len);
    for (i, line) in &d.lines {
        img[i * 64..i * 64 + 64].copy_from_slice(line);
    }
    img
}

/// Installs a hook that records Persisted, Newest and `RANDOM_PER_FENCE` Random images
/// at every fence; returns where they accumulate.
fn record_images(pool: &Pool, reference: Arc<Vec<u8>>, seed: u64) -> Arc<Mutex<Vec<Delta>>> {
    let out = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&out);
    pool.set_fence_hook(Some(Box::new(move |fence_no, site: &CrashSite| {
        let mut v = sink.lock().unwrap();
        // Persisted, Newest, then RANDOM_PER_FENCE random subsets.
        let choices = [CrashChoice::Persisted, CrashChoice::Newest]
            .into_iter()
            .chain((0..RANDOM_PER_FENCE).map(|i| {
                CrashChoice::Random(seed.wrapping_mul(0x9e37_79b9) ^ (fence_no << 8) ^ i)
            }));
        for (index, choice) in choices.enumerate() {
            let img = site.image(choice);
            assert_eq!(img.len(), site.len());
            v.push(delta(&reference, &img, index as u64, fence_no, choice));
        }
    })))
    .unwrap();
    out
}

fn sim_pool(size: u64, max_size: u64) -> (Pool, u64) {
    let pool = Pool::create(Path::new(""), &simulated(size, max_size, LAYOUT)).unwrap();
    assert_eq!(pool.mode(), Mode::Simulated);
    // An owner table linked from the root.
    let r = pool.reserve(4096, Link::RootPointer).unwrap();
    let table = r.offset();
    pool.zero(table, 4096);
    pool.persist(table, 4096);
    pool.set_root(table).unwrap();
    pool.commit(r);
    (pool, table)
}

/// Runs reserve → fill → persist → link → persist → commit → begin_free →
/// unlink → persist → finish_free for a block of `req` bytes whose owner is
/// `owner`, with crash images at every fence, and checks every image.
fn crash_check_alloc_and_free(pool: &Pool, owner: u64, req: u64, seed: u64) -> usize {
    let base = pool.stats();
    let reference = Arc::new(pool.crash_image(CrashChoice::Persisted).unwrap());
    let images = record_images(pool, Arc::clone(&reference), seed);
    let fences_before = pool.fence_count();

    let r = pool.reserve(req, Link::Pointer { owner }).unwrap();
    let (off, size) = (r.offset(), r.size());
    let data = pattern(off, size.min(8192) as usize, seed);
    pool.write(off, &data);
    pool.persist(off, data.len());
    pool.store_u64(owner, off);
    pool.persist(owner, 8);
    pool.commit(r);
    let t = pool
        .begin_free(off, Link::Word { owner, value: off })
        .unwrap();
    pool.store_u64(owner, 0);
    pool.persist(owner, 8);
    pool.finish_free(t);

    pool.set_fence_hook(None).unwrap();
    let fences = pool.fence_count() - fences_before;
    let images = std::mem::take(&mut *images.lock().unwrap());
    assert_eq!(
        images.len() as u64,
        IMAGES_PER_FENCE * fences,
        "one set of images per fence"
    );
    assert!(
        fences >= 8,
        "the protocol fences at least 8 times, saw {fences}"
    );
    let mut linked_seen = (0, 0);
    for d in &images {
        let what = format!(
            "req {req}, fence {} ({:?}), block {off:#x}",
            d.fence, d.choice
        );
        let img = rebuild(&reference, d);
        let rec = Pool::from_image(img, Mode::Simulated)
            .unwrap_or_else(|e| panic!("{what}: recovery failed: {e}"));
        let st = rec.stats();
        let word = rec.load_u64(owner);
        assert!(word == 0 || word == off, "{what}: owner holds {word:#x}");
        let linked = word == off;
        if linked {
            linked_seen.0 += 1;
            let mut got = vec![0u8; data.len()];
            rec.read(off, &mut got);
            assert!(
                got == data,
                "{what}: linked block's contents are not durable"
            );
        } else {
            linked_seen.1 += 1;
        }
        let want = base.bytes_in_use + if linked { size } else { 0 };
        assert_eq!(
            st.bytes_in_use, want,
            "{what}: bytes_in_use (linked: {linked})"
        );
        assert_eq!(
            st.blocks_in_use,
            base.blocks_in_use + linked as u64,
            "{what}"
        );
        assert!(st.size >= base.size);
        // Recovery is durable: crash the recovered pool at once, recover
        // again (for a third of the images, to keep the test fast).
        if d.index % 3 == 0 {
            let again = Pool::from_image(
                rec.crash_image(CrashChoice::Persisted).unwrap(),
                Mode::Simulated,
            )
            .unwrap_or_else(|e| panic!("{what}: second recovery failed: {e}"));
            let st2 = again.stats();
            assert_eq!(st2.recovered_lanes, 0, "{what}: recovery left lanes behind");
            assert_eq!(
                (st2.bytes_in_use, st2.blocks_in_use, st2.free_chunks),
                (st.bytes_in_use, st.blocks_in_use, st.free_chunks),
                "{what}: second recovery disagrees"
            );
        }
        // The allocation state matches the link; the pool takes new work.
        assert_eq!(
            rec.free(off).is_ok(),
            linked,
            "{what}: allocated iff linked"
        );
        assert_eq!(rec.stats().bytes_in_use, base.bytes_in_use, "{what}");
        let r = rec
            .reserve(req, Link::Nothing)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        rec.cancel(r);
    }
    assert!(
        linked_seen.0 > 0 && linked_seen.1 > 0,
        "{req}: both outcomes occur ({linked_seen:?})"
    );
    images.len()
}

#[test]
fn allocator_crash_images_follow_the_link_rule() {
    let (pool, table) = sim_pool(5 * CHUNK, 0);
    let mut n = 0;
    // First block of a class (a new run), then one in an existing run.
    n += crash_check_alloc_and_free(&pool, table, 64, 1);
    let keep = pool.reserve(64, Link::Nothing).unwrap();
    pool.commit(keep);
    n += crash_check_alloc_and_free(&pool, table + 8, 64, 2);
    n += crash_check_alloc_and_free(&pool, table + 16, 3000, 3);
    // An extent.
    n += crash_check_alloc_and_free(&pool, table + 24, 300 << 10, 4);
    assert!(n > 100, "{n} images checked");
}

#[test]
fn allocator_crash_images_during_growth() {
    // Three heap chunks; the extent needs four: the pool grows while the
    // hook records images.
    let (pool, table) = sim_pool(MIB, 4 * MIB);
    let before = pool.size();
    let owner = table + 32;
    let base = pool.stats();
    let reference = Arc::new(pool.crash_image(CrashChoice::Persisted).unwrap());
    let images = record_images(&pool, Arc::clone(&reference), 77);
    let r = pool
        .reserve(4 * CHUNK - 64, Link::Pointer { owner })
        .unwrap();
    assert!(pool.size() > before, "the pool grew");
    let (off, size) = (r.offset(), r.size());
    pool.write(off, &pattern(off, 256, 5));
    pool.persist(off, 256);
    pool.store_u64(owner, off);
    pool.persist(owner, 8);
    pool.commit(r);
    pool.set_fence_hook(None).unwrap();
    let images = std::mem::take(&mut *images.lock().unwrap());
    assert!(images.len() >= 15);
    let mut sizes = Vec::new();
    for d in &images {
        let what = format!("fence {} ({:?})", d.fence, d.choice);
        let rec = Pool::from_image(rebuild(&reference, d), Mode::Simulated)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        sizes.push(rec.size());
        let linked = rec.load_u64(owner) == off;
        let st = rec.stats();
        assert_eq!(
            st.bytes_in_use,
            base.bytes_in_use + if linked { size } else { 0 },
            "{what}"
        );
        if linked {
            assert_eq!(
                rec.size(),
                pool.size(),
                "{what}: a linked block lies inside the pool"
            );
        }
        assert_eq!(rec.free(off).is_ok(), linked, "{what}");
    }
    assert!(sizes.iter().all(|&s| s == before || s == pool.size()));
}

#[test]
fn an_image_recovers_with_the_room_to_grow_it_is_given() {
    // A pool that may grow to 4 MiB, imaged before it grew: recovered with
    // that limit it can still grow; recovered by `from_image`, whose
    // limit is the image's size, the same reservation is refused.
    let (pool, table) = sim_pool(MIB, 4 * MIB);
    let owner = table + 32;
    let img = pool.crash_image(CrashChoice::Persisted).unwrap();
    let need = 4 * CHUNK - 64;
    let fixed = Pool::from_image(img.clone(), Mode::Simulated).unwrap();
    let refused = fixed.reserve(need, Link::Pointer { owner });
    assert!(
        refused.is_err(),
        "from_image keeps the image's size as the limit"
    );
    let rec = Pool::from_image_growable(img, Mode::Simulated, 4 * MIB).unwrap();
    let r = rec
        .reserve(need, Link::Pointer { owner })
        .expect("the recovered pool grows within its limit");
    assert_eq!(rec.max_size(), 4 * MIB);
    assert!(rec.size() > MIB && rec.size() <= 4 * MIB, "{}", rec.size());
    rec.commit(r);
    let too_big = rec.reserve(8 * MIB, Link::Pointer { owner: owner + 8 });
    assert!(too_big.is_err(), "nor past it");
}

#[test]
fn set_root_crash_images_hold_the_old_or_the_new_root() {
    let (pool, table) = sim_pool(MIB, 0);
    let a = pool.reserve(64, Link::Nothing).unwrap();
    let b = pool.reserve(64, Link::Nothing).unwrap();
    let (a_off, b_off) = (a.offset(), b.offset());
    pool.commit(a);
    pool.commit(b);
    let reference = Arc::new(pool.crash_image(CrashChoice::Persisted).unwrap());
    let images = record_images(&pool, Arc::clone(&reference), 9);
    let mut roots = vec![table];
    for r in [a_off, b_off, a_off, table] {
        pool.set_root(r).unwrap();
        roots.push(r);
        // Once set_root returns, the new root is durable.
        let img = pool.crash_image(CrashChoice::Persisted).unwrap();
        assert_eq!(Pool::from_image(img, Mode::Simulated).unwrap().root(), r);
    }
    pool.set_fence_hook(None).unwrap();
    let images = std::mem::take(&mut *images.lock().unwrap());
    assert_eq!(
        images.len() as u64,
        IMAGES_PER_FENCE * 4,
        "one fence per set_root"
    );
    let mut saw = (false, false);
    for (i, d) in images.iter().enumerate() {
        let rec = Pool::from_image(rebuild(&reference, d), Mode::Simulated).unwrap();
        // Images i were taken at the fence of set_root number i / IMAGES_PER_FENCE: the
        // state slot is written whole or not at all.
        let k = i / IMAGES_PER_FENCE as usize;
        let (old, new) = (roots[k], roots[k + 1]);
        let root = rec.root();
        assert!(
            root == old || root == new,
            "fence {}: root {root:#x}",
            d.fence
        );
        match d.choice {
            CrashChoice::Persisted => assert_eq!(root, old, "fence {}", d.fence),
            CrashChoice::Newest => assert_eq!(root, new, "fence {}", d.fence),
            CrashChoice::Random(_) | CrashChoice::OnlyNew(_) | CrashChoice::AllButOld(_) => {}
        }
        saw.0 |= root == old;
        saw.1 |= root == new;
    }
    assert!(saw.0 && saw.1);
}

// ----- simulator semantics ----------------------------------------------------------

fn bytes_at(img: &[u8], off: u64, len: u64) -> Vec<u8> {
    img[off as usize..(off + len) as usize].to_vec()
}

#[test]
fn simulator_keeps_flushed_fenced_stores_and_decides_nothing_else() {
    let pool = Pool::create(Path::new(""), &simulated(MIB, 0, LAYOUT)).unwrap();
    let r = pool.reserve(4096, Link::Nothing).unwrap();
    let a = r.offset();
    pool.commit(r);
    assert_eq!(a % LINE, 0);
    let old = pool.crash_image(CrashChoice::Persisted).unwrap();
    assert_eq!(old.len() as u64, pool.size());
    let line = |k: u64| (a + k * LINE) / LINE;
    let p = |k: u64| pattern(a + k * LINE, LINE as usize, 100 + k);

    // Line 0: written, flushed, fenced → durable.
    pool.write(a, &p(0));
    let fences = pool.fence_count();
    pool.persist(a, LINE as usize);
    assert_eq!(pool.fence_count(), fences + 1);
    // Line 1: written, never flushed.
    pool.write(a + LINE, &p(1));
    // Line 2: written and flushed, not fenced.
    pool.write(a + 2 * LINE, &p(2));
    pool.flush(a + 2 * LINE, LINE as usize);
    assert_eq!(pool.fence_count(), fences + 1, "a flush is not a fence");
    // Line 3: flushed, then written again (the flush snapshotted p(3)).
    pool.write(a + 3 * LINE, &p(3));
    pool.flush(a + 3 * LINE, LINE as usize);
    pool.write(a + 3 * LINE, &p(4));

    let persisted = pool.crash_image(CrashChoice::Persisted).unwrap();
    let newest = pool.crash_image(CrashChoice::Newest).unwrap();
    assert_eq!(
        bytes_at(&persisted, a, LINE),
        p(0),
        "flushed + fenced is durable"
    );
    assert_eq!(bytes_at(&newest, a, LINE), p(0));
    for k in 1..4 {
        assert_eq!(
            bytes_at(&persisted, a + k * LINE, LINE),
            bytes_at(&old, a + k * LINE, LINE),
            "line {k}: not fenced, so not in the persisted image"
        );
    }
    assert_eq!(
        bytes_at(&newest, a + LINE, LINE),
        p(1),
        "a dirty line may be evicted"
    );
    assert_eq!(bytes_at(&newest, a + 2 * LINE, LINE), p(2));
    assert_eq!(bytes_at(&newest, a + 3 * LINE, LINE), p(4));
    let undecided = pool.undecided_lines().unwrap();
    assert!(!undecided.contains(&line(0)), "line 0 is decided");
    for k in 1..4 {
        assert!(
            undecided.contains(&line(k)),
            "line {k} is undecided: {undecided:?}"
        );
    }
    // Nothing else in the pool is undecided.
    assert_eq!(undecided.len(), 3, "{undecided:?}");

    // Random images draw each undecided line independently among old,
    // flushed snapshot and newest.
    let mut seen: [Vec<Vec<u8>>; 4] = Default::default();
    for seed in 0..200 {
        let img = pool.crash_image(CrashChoice::Random(seed)).unwrap();
        assert_eq!(bytes_at(&img, a, LINE), p(0), "seed {seed}: decided line");
        for (k, s) in seen.iter_mut().enumerate().skip(1) {
            let got = bytes_at(&img, a + k as u64 * LINE, LINE);
            if !s.contains(&got) {
                s.push(got);
            }
        }
        assert_eq!(
            pool.crash_image(CrashChoice::Random(seed)).unwrap(),
            img,
            "a seed gives one image"
        );
    }
    assert_eq!(seen[1].len(), 2, "never-flushed line: old or newest");
    assert!(seen[1].contains(&p(1)) && seen[1].contains(&bytes_at(&old, a + LINE, LINE)));
    assert_eq!(seen[2].len(), 2, "flushed line: old or flushed");
    assert_eq!(
        seen[3].len(),
        3,
        "flushed then rewritten line: old, snapshot or newest"
    );
    assert!(seen[3].contains(&p(3)) && seen[3].contains(&p(4)));

    // A fence makes the snapshots durable, not the stores after them.
    pool.fence();
    let persisted = pool.crash_image(CrashChoice::Persisted).unwrap();
    assert_eq!(bytes_at(&persisted, a + 2 * LINE, LINE), p(2));
    assert_eq!(
        bytes_at(&persisted, a + 3 * LINE, LINE),
        p(3),
        "the flushed snapshot"
    );
    assert_eq!(
        bytes_at(&persisted, a + LINE, LINE),
        bytes_at(&old, a + LINE, LINE),
        "a fence does not write back unflushed lines"
    );
    let undecided = pool.undecided_lines().unwrap();
    assert_eq!(undecided, vec![line(1), line(3)]);

    // Non-temporal stores are durable at the next fence.
    pool.write_nt(a + 4 * LINE, &p(5));
    assert!(pool.undecided_lines().unwrap().contains(&line(4)));
    assert_eq!(
        bytes_at(
            &pool.crash_image(CrashChoice::Persisted).unwrap(),
            a + 4 * LINE,
            LINE
        ),
        bytes_at(&old, a + 4 * LINE, LINE)
    );
    pool.fence();
    assert_eq!(
        bytes_at(
            &pool.crash_image(CrashChoice::Persisted).unwrap(),
            a + 4 * LINE,
            LINE
        ),
        p(5)
    );

    // Persisting everything leaves nothing undecided, and every image agrees.
    pool.persist(a, 4096);
    assert!(pool.undecided_lines().unwrap().is_empty());
    let p1 = pool.crash_image(CrashChoice::Persisted).unwrap();
    assert_eq!(p1, pool.crash_image(CrashChoice::Newest).unwrap());
    assert_eq!(p1, pool.crash_image(CrashChoice::Random(5)).unwrap());
    assert_eq!(p1, pool.image());
    // A persisted image is a pool.
    let rec = Pool::from_image(p1, Mode::Simulated).unwrap();
    assert_eq!(bytes_at(&rec.image(), a + 3 * LINE, LINE), p(4));
}

#[test]
fn fence_hook_sees_every_fence_in_order() {
    let pool = Pool::create(Path::new(""), &simulated(MIB, 0, LAYOUT)).unwrap();
    let seen: Arc<Mutex<Vec<(u64, usize, usize)>>> = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    let start = pool.fence_count();
    pool.set_fence_hook(Some(Box::new(move |n, site: &CrashSite| {
        sink.lock()
            .unwrap()
            .push((n, site.len(), site.undecided_lines().len()));
    })))
    .unwrap();
    let r = pool.reserve(128, Link::Nothing).unwrap();
    let off = r.offset();
    pool.commit(r);
    pool.write(off, &[7u8; 128]);
    pool.persist(off, 128);
    pool.fence();
    let end = pool.fence_count();
    pool.set_fence_hook(None).unwrap();
    pool.fence();
    let seen = seen.lock().unwrap().clone();
    let numbers: Vec<u64> = seen.iter().map(|s| s.0).collect();
    assert_eq!(
        numbers,
        (start + 1..=end).collect::<Vec<_>>(),
        "one call per fence"
    );
    assert!(
        seen.iter().all(|s| s.1 as u64 == pool.size()),
        "a site covers the pool"
    );
    assert_eq!(
        seen.last().unwrap().2,
        0,
        "after a bare fence nothing is undecided"
    );
    assert_eq!(
        pool.fence_count(),
        end + 1,
        "fences still count without a hook"
    );
}

#[test]
fn simulator_calls_need_simulated_mode() {
    let tmp = TempPath::new("sim-mapped");
    let pool = Pool::create(tmp.path(), &mapped(MIB, 0, LAYOUT)).unwrap();
    let hook = pool.set_fence_hook(Some(Box::new(|_, _: &CrashSite| {})));
    assert!(matches!(hook, Err(Error::InvalidArgument(_))));
    assert!(matches!(
        pool.crash_image(CrashChoice::Persisted),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        pool.undecided_lines(),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(pool.fence_count(), 0);
    // Images open only in memory modes.
    let img = pool.image();
    assert!(matches!(
        Pool::from_image(img.clone(), Mode::Mapped),
        Err(Error::InvalidArgument(_))
    ));
    let rec = Pool::from_image(img, Mode::Volatile).unwrap();
    assert_eq!(rec.layout(), LAYOUT);
    assert!(matches!(
        rec.set_fence_hook(None),
        Err(Error::InvalidArgument(_))
    ));
    // Garbage images are errors, not panics.
    for len in [0usize, 100, 4096, MIB as usize] {
        let mut junk = vec![0u8; len];
        Rng::new(len as u64).fill(&mut junk);
        assert!(Pool::from_image(junk, Mode::Simulated).is_err(), "{len}");
    }
}

/// Collects `Random` images at every fence of `f`, for many seeds.
fn images_at_fences(pool: &Pool, f: impl FnOnce(&Pool)) -> Vec<Vec<u8>> {
    let out = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&out);
    pool.set_fence_hook(Some(Box::new(move |n, site: &CrashSite| {
        let mut v = sink.lock().unwrap();
        v.push(site.image(CrashChoice::Persisted));
        v.push(site.image(CrashChoice::Newest));
        for seed in 0..32 {
            v.push(site.image(CrashChoice::Random(seed * 1000 + n)));
        }
    })))
    .unwrap();
    f(pool);
    pool.set_fence_hook(None).unwrap();
    let v = std::mem::take(&mut *out.lock().unwrap());
    v
}

/// Pattern 1 of CRASH-PATTERNS.md, "publish before persist": data and the
/// flag that publishes it flushed under one fence. The CPU may write the
/// flag's line back before the data's, so a crash state with the flag and
/// without the data exists; the fence hooks must offer it, or the crash
/// checker can never catch this bug. The correct order (data fenced before
/// the flag is stored) must never show that state.
#[test]
fn crash_states_between_fences_are_offered() {
    for correct in [false, true] {
        let pool = Pool::create(Path::new(""), &simulated(MIB, 0, LAYOUT)).unwrap();
        let r = pool.reserve(4096, Link::Nothing).unwrap();
        let a = r.offset();
        pool.commit(r);
        let (data, flag) = (a, a + 1024);
        let payload = pattern(data, 256, 1);
        let images = images_at_fences(&pool, |pool| {
            pool.write(data, &payload);
            if correct {
                pool.persist(data, payload.len());
                pool.store_u64(flag, 1);
                pool.persist(flag, 8);
            } else {
                pool.flush(data, payload.len());
                pool.store_u64(flag, 1);
                pool.flush(flag, 8);
                pool.fence();
            }
        });
        assert!(!images.is_empty());
        let torn = images.iter().filter(|img| {
            let published = bytes_at(img, flag, 8) == 1u64.to_le_bytes();
            published && bytes_at(img, data, 256) != payload
        });
        if correct {
            assert_eq!(torn.count(), 0, "fenced data cannot be missing");
        } else {
            assert!(
                torn.count() > 0,
                "no crash state shows the flag without its data: the states \
                 between two fences are never offered to the hook"
            );
        }
    }
}
