//! The crash-safe allocator through the public API, in `mapped` mode: every
//! size class and extents, owner links, frees, reuse, accounting, reopen,
//! bad frees, cancel, process crashes between the protocol steps, and
//! concurrent use.

mod common;

use std::collections::BTreeMap;

use common::*;
use pmhash_pmem::CLASSES;
use pmhash_pmem::{Error, Link, Pool, PoolOptions, CHUNK};

const LAYOUT: &str = "alloctest";

/// A live block as the test models it.
#[derive(Clone, Copy, Debug)]
struct Live {
    off: u64,
    size: u64,
    owner: u64,
    tag: u64,
}

/// The usable size the allocator must hand out for a request.
fn expected_size(req: u64) -> u64 {
    match CLASSES.iter().find(|&&c| c >= req) {
        Some(&c) => c,
        None => (req + 64).div_ceil(CHUNK) * CHUNK - 64,
    }
}

/// Bytes of a block the test writes and checks: all of a small block, the
/// first and last 4 KiB of a large one (keeps the tests fast).
fn spans(size: u64) -> Vec<(u64, usize)> {
    if size <= 16 << 10 {
        vec![(0, size as usize)]
    } else {
        vec![(0, 4096), (size - 4096, 4096)]
    }
}

fn fill(pool: &Pool, b: &Live) {
    for (rel, len) in spans(b.size) {
        let data = pattern(b.off + rel, len, b.tag);
        pool.write(b.off + rel, &data);
        pool.persist(b.off + rel, len);
    }
}

#[track_caller]
fn check_contents(pool: &Pool, b: &Live) {
    for (rel, len) in spans(b.size) {
        let mut got = vec![0u8; len];
        pool.read(b.off + rel, &mut got);
        assert!(
            got == pattern(b.off + rel, len, b.tag),
            "contents of block {:#x}+{} at +{rel} changed",
            b.off,
            b.size
        );
    }
    assert_eq!(
        pool.load_u64(b.owner),
        b.off,
        "owner word of block {:#x}",
        b.off
    );
}

/// The full protocol: reserve (pointer link) → fill → persist → link →
/// persist → commit.
fn alloc(pool: &Pool, req: u64, owner: u64, tag: u64) -> pmhash_pmem::Result<Live> {
    let r = pool.reserve(req, Link::Pointer { owner })?;
    let b = Live {
        off: r.offset(),
        size: r.size(),
        owner,
        tag,
    };
    assert!(r.size() >= req);
    assert_eq!(
        r.size(),
        expected_size(req),
        "usable size for a request of {req}"
    );
    fill(pool, &b);
    pool.store_u64(owner, b.off);
    pool.persist(owner, 8);
    pool.commit(r);
    Ok(b)
}

/// begin_free (word link with the block's offset) → unlink → persist → finish.
fn free(pool: &Pool, b: &Live) {
    let t = pool
        .begin_free(
            b.off,
            Link::Word {
                owner: b.owner,
                value: b.off,
            },
        )
        .expect("begin_free of a live block");
    assert_eq!(t.offset(), b.off);
    pool.store_u64(b.owner, 0);
    pool.persist(b.owner, 8);
    pool.finish_free(t);
}

/// No overlap, inside the heap, sizes as reported, contents and owners intact,
/// and the pool's accounting equal to the model's.
#[track_caller]
fn check_all(pool: &Pool, live: &[Live], fixed_bytes: u64, fixed_blocks: u64, what: &str) {
    let mut sorted: Vec<&Live> = live.iter().collect();
    sorted.sort_by_key(|b| b.off);
    for w in sorted.windows(2) {
        assert!(
            w[0].off + w[0].size <= w[1].off,
            "{what}: blocks {:#x}+{} and {:#x}+{} overlap",
            w[0].off,
            w[0].size,
            w[1].off,
            w[1].size
        );
    }
    for b in &sorted {
        assert!(
            b.off >= CHUNK && b.off + b.size <= pool.size(),
            "{what}: block {:#x} outside the heap",
            b.off
        );
        assert_eq!(
            pool.block_size(b.off).unwrap(),
            b.size,
            "{what}: block_size({:#x})",
            b.off
        );
        check_contents(pool, b);
    }
    let st = pool.stats();
    let sum: u64 = live.iter().map(|b| b.size).sum();
    assert_eq!(st.bytes_in_use, fixed_bytes + sum, "{what}: bytes_in_use");
    assert_eq!(
        st.blocks_in_use,
        fixed_blocks + live.len() as u64,
        "{what}: blocks_in_use"
    );
    assert_eq!(st.size, pool.size());
}

const SIZES: &[u64] = &[
    1,
    8,
    63,
    64,
    65,
    100,
    128,
    129,
    200,
    256,
    500,
    512,
    1000,
    1024,
    2000,
    2048,
    3000,
    4096,
    5000,
    8192,
    10_000,
    16384,
    20_000,
    32767,
    32768,
    32769,
    300 << 10,
    1 << 20,
];

/// A pool with a 32 KiB owner table linked from the root; returns the
/// table's offset.
fn pool_with_table(opts: &PoolOptions, path: &std::path::Path) -> (Pool, u64) {
    let pool = Pool::create(path, opts).unwrap();
    let r = pool.reserve(32 << 10, Link::RootPointer).unwrap();
    let table = r.offset();
    pool.zero(table, 32 << 10);
    pool.persist(table, 32 << 10);
    pool.set_root(table).unwrap();
    pool.commit(r);
    (pool, table)
}

#[test]
fn every_size_class_and_extents_round_trip() {
    let tmp = TempPath::new("classes");
    let opts = mapped(4 * MIB, 32 * MIB, LAYOUT);
    let (pool, table) = pool_with_table(&opts, tmp.path());
    let (fixed_bytes, fixed_blocks) = (32 << 10, 1);
    let mut free_slots: Vec<u64> = (0..4096).rev().collect();
    let mut live: Vec<Live> = Vec::new();
    let mut tag = 0;
    let mut rng = Rng::new(1);

    let mut alloc_round =
        |pool: &Pool, live: &mut Vec<Live>, free_slots: &mut Vec<u64>, copies: usize| {
            for &req in SIZES {
                let n = if req > 32 << 10 { 1 } else { copies };
                for _ in 0..n {
                    tag += 1;
                    let owner = table + 8 * free_slots.pop().unwrap();
                    live.push(
                        alloc(pool, req, owner, tag)
                            .unwrap_or_else(|e| panic!("reserve({req}): {e}")),
                    );
                }
            }
        };

    alloc_round(&pool, &mut live, &mut free_slots, 5);
    check_all(&pool, &live, fixed_bytes, fixed_blocks, "first round");
    assert!(pool.size() > 4 * MIB, "the extents made the pool grow");

    // Free every other block, in a shuffled order.
    let mut idx: Vec<usize> = (0..live.len()).filter(|i| i % 2 == 1).collect();
    for i in (1..idx.len()).rev() {
        idx.swap(i, rng.below(i as u64 + 1) as usize);
    }
    for &i in &idx {
        free(&pool, &live[i]);
        free_slots.push((live[i].owner - table) / 8);
        // A freed block cannot be freed again.
        assert!(
            pool.free(live[i].off).is_err(),
            "double free of {:#x}",
            live[i].off
        );
    }
    let gone: Vec<u64> = idx.iter().map(|&i| live[i].off).collect();
    live.retain(|b| !gone.contains(&b.off));
    check_all(
        &pool,
        &live,
        fixed_bytes,
        fixed_blocks,
        "after freeing half",
    );

    // Reserve again: freed space is reused, nothing overlaps.
    alloc_round(&pool, &mut live, &mut free_slots, 3);
    check_all(&pool, &live, fixed_bytes, fixed_blocks, "second round");
    let reused = live.iter().filter(|b| gone.contains(&b.off)).count();
    assert!(reused > 0, "freed blocks are handed out again");

    let stats = pool.stats();
    pool.close().unwrap();
    drop(pool);
    let pool = Pool::open(
        tmp.path(),
        &PoolOptions {
            max_size: 32 * MIB,
            ..opts.clone()
        },
    )
    .unwrap();
    assert!(pool.was_clean());
    assert_eq!(pool.root(), table);
    let st = pool.stats();
    assert_eq!(
        (st.bytes_in_use, st.blocks_in_use, st.size),
        (stats.bytes_in_use, stats.blocks_in_use, stats.size)
    );
    assert_eq!(
        st.free_chunks, stats.free_chunks,
        "the free map is rebuilt the same"
    );
    check_all(&pool, &live, fixed_bytes, fixed_blocks, "after reopen");

    // The rebuilt allocator state is right: free a third, allocate again.
    let third: Vec<Live> = live.iter().step_by(3).copied().collect();
    for b in &third {
        free(&pool, b);
        free_slots.push((b.owner - table) / 8);
    }
    live.retain(|b| !third.iter().any(|t| t.off == b.off));
    alloc_round(&pool, &mut live, &mut free_slots, 2);
    check_all(
        &pool,
        &live,
        fixed_bytes,
        fixed_blocks,
        "after reopen and reuse",
    );
}

#[test]
fn free_of_what_is_not_allocated_is_an_err() {
    let tmp = TempPath::new("badfree");
    let (pool, table) = pool_with_table(&mapped(2 * MIB, 0, LAYOUT), tmp.path());
    let small = alloc(&pool, 128, table, 1).unwrap();
    let ext = alloc(&pool, 300 << 10, table + 8, 2).unwrap();
    let gone = alloc(&pool, 128, table + 16, 3).unwrap();
    free(&pool, &gone);
    let stats = pool.stats();
    let run_chunk = small.off / CHUNK * CHUNK;
    let ext_chunk = ext.off / CHUNK * CHUNK;
    let free_chunk = (1..pool.size() / CHUNK)
        .map(|c| c * CHUNK)
        .find(|&c| {
            c != run_chunk
                && c != table / CHUNK * CHUNK
                && !(ext_chunk..ext.off + ext.size).contains(&c)
        })
        .expect("a free chunk");
    let bad = [
        0,
        8,
        4096,
        CHUNK - 64,
        run_chunk,
        run_chunk + 64,
        small.off + 8,
        small.off + 64,
        gone.off,
        ext.off + 8,
        ext.off - 64,
        ext_chunk + CHUNK + 64,
        free_chunk + 64,
        pool.size(),
        pool.size() + 64,
        u64::MAX - 63,
        u64::MAX,
    ];
    for _round in 0..5 {
        for &off in &bad {
            let err = pool
                .free(off)
                .err()
                .unwrap_or_else(|| panic!("free({off:#x}) succeeded"));
            assert!(
                matches!(err, Error::InvalidArgument(_) | Error::Corrupt(_)),
                "free({off:#x}): {err:?}"
            );
            assert!(!err.to_string().is_empty());
            assert!(
                pool.begin_free(off, Link::Pointer { owner: table })
                    .is_err(),
                "begin_free({off:#x})"
            );
        }
    }
    assert_eq!(pool.stats(), stats, "failed frees change nothing");
    check_all(&pool, &[small, ext], 32 << 10, 1, "after bad frees");
    // Failed frees leaked no lane: more than 64 allocations still work.
    let mut more = Vec::new();
    for i in 0..100 {
        more.push(alloc(&pool, 64, table + 64 + 8 * i, 10 + i).unwrap());
    }
    for b in &more {
        free(&pool, b);
    }
    // A plain `free` of a live block works.
    pool.free(small.off).unwrap();
    assert!(pool.free(small.off).is_err());
}

#[test]
fn cancel_returns_the_space() {
    let tmp = TempPath::new("cancel");
    let opts = mapped(4 * MIB, 0, LAYOUT);
    let (pool, table) = pool_with_table(&opts, tmp.path());
    let keep = alloc(&pool, 512, table, 1).unwrap();
    let before = pool.stats();
    let mut warm = before.clone();
    for round in 0..3 {
        for &req in SIZES.iter().filter(|&&s| s < MIB) {
            let r = pool
                .reserve(req, Link::Pointer { owner: table + 8 })
                .unwrap();
            let (off, size) = (r.offset(), r.size());
            assert_eq!(pool.stats().bytes_in_use, before.bytes_in_use + size);
            assert_eq!(pool.stats().blocks_in_use, before.blocks_in_use + 1);
            pool.write(off, &pattern(off, 64, req));
            pool.cancel(r);
            let st = pool.stats();
            assert_eq!(
                st.bytes_in_use, before.bytes_in_use,
                "round {round}: cancel of {req}"
            );
            assert_eq!(
                st.blocks_in_use, before.blocks_in_use,
                "round {round}: cancel of {req}"
            );
            if round > 0 {
                // Once every class has its run, a cancel returns everything.
                assert_eq!(
                    st, warm,
                    "round {round}: cancel of {req} returns everything"
                );
            }
            assert!(
                pool.free(off).is_err(),
                "a cancelled block is not allocated"
            );
        }
        if round == 0 {
            warm = pool.stats();
        }
    }
    // The biggest extent that fits, cancelled, fits again.
    let big = warm.free_chunks * CHUNK - 64;
    for _ in 0..3 {
        let r = pool
            .reserve(big, Link::Nothing)
            .expect("all free chunks in one extent");
        assert_eq!(pool.stats().free_chunks, 0);
        pool.cancel(r);
        assert_eq!(pool.stats(), warm);
    }
    check_contents(&pool, &keep);
    pool.close().unwrap();
    drop(pool);
    let pool = Pool::open(tmp.path(), &opts).unwrap();
    assert_eq!(pool.stats().bytes_in_use, before.bytes_in_use);
    assert_eq!(pool.stats().blocks_in_use, before.blocks_in_use);
    assert_eq!(pool.stats().recovered_lanes, 0);
}

/// What a process crash (drop without commit or finish) leaves after
/// recovery, for each kind of link.
#[test]
fn process_crash_between_steps_follows_the_link_rule() {
    #[derive(Clone, Copy, Debug)]
    enum Step {
        /// Reserved; the owner never got the value.
        Reserved,
        /// Reserved and linked, not committed.
        Linked,
        /// begin_free; the owner still holds the value.
        FreeBegun,
        /// begin_free and the unlink persisted; not finished.
        Unlinked,
    }
    for link_kind in 0..5 {
        for step in [
            Step::Reserved,
            Step::Linked,
            Step::FreeBegun,
            Step::Unlinked,
        ] {
            let what = format!("link kind {link_kind}, {step:?}");
            let tmp = TempPath::new("crashstep");
            let opts = mapped(2 * MIB, 0, LAYOUT);
            let (off, size, base, owner);
            {
                let (pool, table) = pool_with_table(&opts, tmp.path());
                owner = table + 64;
                base = pool.stats();
                let tag_value = 0x5eed_0000_0000_0001u64;
                // The link, and how to make it hold / stop holding.
                let link_for = |off: u64| match link_kind {
                    0 => Link::Pointer { owner },
                    1 => Link::Word {
                        owner,
                        value: tag_value,
                    },
                    2 => Link::RootPointer,
                    3 => Link::Root(off),
                    _ => Link::AuxRootPointer,
                };
                let set_link = |pool: &Pool, off: u64| match link_kind {
                    0 => {
                        pool.store_u64(owner, off);
                        pool.persist(owner, 8);
                    }
                    1 => {
                        pool.store_u64(owner, tag_value);
                        pool.persist(owner, 8);
                    }
                    2 | 3 => pool.set_root(off).unwrap(),
                    _ => pool.set_aux_root(off).unwrap(),
                };
                let clear_link = |pool: &Pool| match link_kind {
                    0 | 1 => {
                        pool.store_u64(owner, 0);
                        pool.persist(owner, 8);
                    }
                    2 | 3 => pool.set_root(table).unwrap(),
                    _ => pool.set_aux_root(0).unwrap(),
                };
                // Root(v) needs the offset before reserving: learn it from
                // an identical reservation, cancelled.
                let probe = pool.reserve(3000, Link::Nothing).unwrap();
                let predicted = probe.offset();
                pool.cancel(probe);
                let r = pool.reserve(3000, link_for(predicted)).unwrap();
                assert_eq!(r.offset(), predicted, "the allocator is deterministic");
                off = r.offset();
                size = r.size();
                match step {
                    Step::Reserved => {}
                    Step::Linked => set_link(&pool, off),
                    Step::FreeBegun | Step::Unlinked => {
                        set_link(&pool, off);
                        pool.commit(r);
                        let t = pool.begin_free(off, link_for(off)).unwrap();
                        if matches!(step, Step::Unlinked) {
                            clear_link(&pool);
                        }
                        let _abandoned = t;
                    }
                }
                // Dropped here: a process crash.
            }
            let pool = Pool::open(tmp.path(), &opts).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(!pool.was_clean());
            let st = pool.stats();
            assert_eq!(st.recovered_lanes, 1, "{what}");
            let kept = matches!(step, Step::Linked | Step::FreeBegun);
            let want = base.bytes_in_use + if kept { size } else { 0 };
            assert_eq!(st.bytes_in_use, want, "{what}");
            assert_eq!(st.blocks_in_use, base.blocks_in_use + kept as u64, "{what}");
            assert_eq!(
                pool.free(off).is_ok(),
                kept,
                "{what}: block allocated iff linked"
            );
            assert_eq!(pool.stats().bytes_in_use, base.bytes_in_use, "{what}");
        }
    }
}

#[test]
fn invalid_owner_links_are_refused_or_harmless() {
    for owner in [
        3u64,
        0,
        8,
        4090,
        2 * MIB,
        2 * MIB - 4,
        u64::MAX - 7,
        u64::MAX - 2,
    ] {
        let tmp = TempPath::new("badowner");
        let opts = mapped(2 * MIB, 0, LAYOUT);
        {
            let (pool, table) = pool_with_table(&opts, tmp.path());
            let before = pool.stats();
            for link in [Link::Pointer { owner }, Link::Word { owner, value: 77 }] {
                match pool.reserve(64, link) {
                    Err(e) => {
                        assert!(matches!(e, Error::InvalidArgument(_)), "{owner:#x}: {e:?}");
                        assert_eq!(pool.stats(), before);
                    }
                    // Accepted: then a crash now must still leave an openable pool.
                    Ok(r) => {
                        let _abandoned = r;
                        break;
                    }
                }
            }
            // The same for a free.
            let b = alloc(&pool, 64, table, 1).unwrap();
            match pool.begin_free(b.off, Link::Pointer { owner }) {
                Err(e) => assert!(matches!(e, Error::InvalidArgument(_)), "{owner:#x}: {e:?}"),
                Ok(t) => {
                    let _abandoned = t;
                }
            }
        }
        let pool = Pool::open(tmp.path(), &opts).unwrap_or_else(|e| {
            panic!("a link to owner {owner:#x} was accepted, and the pool no longer opens: {e}")
        });
        drop(pool);
    }
}

#[test]
fn concurrent_reserve_commit_free() {
    const THREADS: u64 = 4;
    const SLOTS: u64 = 512;
    let tmp = TempPath::new("concurrent");
    let opts = mapped(4 * MIB, 16 * MIB, LAYOUT);
    let pool = Pool::create(tmp.path(), &opts).unwrap();
    // One owner table per thread, committed before the threads start.
    let tables: Vec<u64> = (0..THREADS)
        .map(|_| {
            let r = pool.reserve(SLOTS * 8, Link::Nothing).unwrap();
            pool.zero(r.offset(), (SLOTS * 8) as usize);
            pool.persist(r.offset(), (SLOTS * 8) as usize);
            let off = r.offset();
            pool.commit(r);
            off
        })
        .collect();
    let fixed = pool.stats();
    let results: Vec<Vec<Live>> = std::thread::scope(|s| {
        let handles: Vec<_> = tables
            .iter()
            .enumerate()
            .map(|(t, &table)| {
                let pool = &pool;
                s.spawn(move || {
                    let mut rng = Rng::new(1000 + t as u64);
                    let mut live: BTreeMap<u64, Live> = BTreeMap::new(); // slot -> block
                    let mut tag = (t as u64) << 32;
                    for _ in 0..1500 {
                        let grow =
                            live.len() < 8 || (live.len() < SLOTS as usize && rng.below(100) < 55);
                        if grow {
                            let slot = (0..SLOTS).find(|s| !live.contains_key(s)).unwrap();
                            let req = match rng.below(20) {
                                0 => (40 << 10) + rng.below(200 << 10),
                                _ => 1 + rng.below(4096),
                            };
                            tag += 1;
                            match alloc(pool, req, table + 8 * slot, tag) {
                                Ok(b) => {
                                    live.insert(slot, b);
                                }
                                Err(Error::OutOfSpace(_)) => {}
                                Err(e) => panic!("thread {t}: {e}"),
                            }
                        } else {
                            let k = rng.below(live.len() as u64) as usize;
                            let slot = *live.keys().nth(k).unwrap();
                            let b = live.remove(&slot).unwrap();
                            check_contents(pool, &b);
                            free(pool, &b);
                        }
                    }
                    live.into_values().collect()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("worker panicked"))
            .collect()
    });
    let all: Vec<Live> = results.into_iter().flatten().collect();
    assert!(all.len() > 20);
    check_all(
        &pool,
        &all,
        fixed.bytes_in_use,
        fixed.blocks_in_use,
        "after the threads",
    );
    pool.close().unwrap();
    drop(pool);
    let pool = Pool::open(tmp.path(), &opts).unwrap();
    assert_eq!(pool.stats().recovered_lanes, 0);
    check_all(
        &pool,
        &all,
        fixed.bytes_in_use,
        fixed.blocks_in_use,
        "after reopen",
    );
}

#[test]
fn space_freed_by_one_size_class_serves_another() {
    // Fill a small pool with 32 KiB blocks, free them all, then the space
    // must be available to another class and to extents: empty runs go back
    // to the free chunks (one empty run per class may stay).
    let tp = common::TempPath::new("classes");
    let pool = Pool::create(tp.path(), &common::mapped(2 * common::MIB, 0, "classes")).unwrap();
    let mut blocks = Vec::new();
    while let Ok(r) = pool.reserve(32 * common::KIB, pmhash_pmem::Link::Nothing) {
        blocks.push(r.offset());
        pool.commit(r);
    }
    assert!(blocks.len() >= 6 * 7, "only {} blocks fit", blocks.len());
    assert!(
        pool.reserve(64, pmhash_pmem::Link::Nothing).is_err(),
        "the pool should be full"
    );
    for off in blocks {
        pool.free(off).unwrap();
    }
    assert_eq!(pool.stats().bytes_in_use, 0);
    assert!(
        pool.stats().free_chunks >= 6,
        "free chunks: {}",
        pool.stats().free_chunks
    );
    let small = pool
        .reserve(64, pmhash_pmem::Link::Nothing)
        .expect("a 64-byte block after the frees");
    pool.commit(small);
    let big = pool
        .reserve(700 * common::KIB, pmhash_pmem::Link::Nothing)
        .expect("an extent after the frees");
    pool.commit(big);
    drop(pool);
    // The conversion is durable: a reopen sees the same free space.
    let pool = Pool::open(tp.path(), &common::mapped(0, 0, "classes")).unwrap();
    assert_eq!(pool.stats().blocks_in_use, 2);
}

/// Reserves `req` bytes linked from `owner`, checks the block reads zero
/// when the reservation says so, dirties all of it, links and commits it.
/// Returns the block and what `is_zeroed` said.
fn alloc_dirty(pool: &Pool, req: u64, owner: u64) -> (Live, bool) {
    let r = pool.reserve(req, Link::Pointer { owner }).expect("reserve");
    let zeroed = r.is_zeroed();
    let b = Live {
        off: r.offset(),
        size: r.size(),
        owner,
        tag: 0,
    };
    if req <= *CLASSES.last().unwrap() {
        assert!(!zeroed, "a run slot at {:#x} said to read zero", b.off);
    }
    if zeroed {
        let mut got = vec![0u8; b.size as usize];
        pool.read(b.off, &mut got);
        let bad = got.iter().position(|&x| x != 0);
        assert!(
            bad.is_none(),
            "block {:#x}+{} is said to read zero but byte +{} is {:#x}",
            b.off,
            b.size,
            bad.unwrap_or(0),
            got[bad.unwrap_or(0)]
        );
    }
    pool.write(b.off, &vec![0xa5u8; b.size as usize]);
    pool.persist(b.off, b.size as usize);
    pool.store_u64(owner, b.off);
    pool.persist(owner, 8);
    pool.commit(r);
    (b, zeroed)
}

#[test]
fn a_block_said_to_read_zero_does_across_reuse_growth_and_reopen() {
    let tmp = TempPath::new("zeroed");
    let opts = mapped(4 * MIB, 256 * MIB, LAYOUT);
    let (pool, table) = pool_with_table(&opts, tmp.path());
    let sizes = [64u64, 700, 5000, 32 << 10, 300 << 10, 1 << 20, 3 << 20];
    let mut rng = Rng::new(7);
    let mut live: Vec<(Live, usize)> = Vec::new();
    let mut free_slots: Vec<usize> = (0..4096).rev().collect();
    let (mut fresh, mut reused) = (0u32, 0u32);
    let mut churn = |pool: &Pool,
                     live: &mut Vec<(Live, usize)>,
                     free_slots: &mut Vec<usize>,
                     rounds: u32,
                     fresh: &mut u32,
                     reused: &mut u32| {
        for _ in 0..rounds {
            if !live.is_empty() && (free_slots.is_empty() || rng.below(5) < 2) {
                let (b, slot) = live.swap_remove(rng.below(live.len() as u64) as usize);
                free(pool, &b);
                free_slots.push(slot);
                continue;
            }
            let slot = free_slots.pop().unwrap();
            let req = sizes[rng.below(sizes.len() as u64) as usize];
            let (b, zeroed) = alloc_dirty(pool, req, table + 8 * slot as u64);
            if req > *CLASSES.last().unwrap() {
                if zeroed {
                    *fresh += 1;
                } else {
                    *reused += 1;
                }
            }
            live.push((b, slot));
        }
    };
    churn(
        &pool,
        &mut live,
        &mut free_slots,
        300,
        &mut fresh,
        &mut reused,
    );
    assert!(
        fresh > 5 && reused > 5,
        "{fresh} extents from fresh space, {reused} reused"
    );
    pool.close().unwrap();
    drop(pool);
    // After a reopen nothing the pool held is known to be zero (a crash
    // leaves no record of which free chunks were written); space it grows
    // into is.
    let pool = Pool::open(tmp.path(), &opts).unwrap();
    let size_at_open = pool.size();
    let (mut fresh2, mut reused2) = (0u32, 0u32);
    for round in 0..40 {
        let slot = free_slots.pop().unwrap();
        let (b, zeroed) = alloc_dirty(&pool, 3 << 20, table + 8 * slot as u64);
        if b.off + b.size <= size_at_open {
            assert!(!zeroed, "round {round}: block {:#x} held at open", b.off);
        }
        if zeroed {
            fresh2 += 1;
        } else {
            reused2 += 1;
        }
        live.push((b, slot));
    }
    assert!(pool.size() > size_at_open, "the pool grew");
    assert!(
        fresh2 > 0 && reused2 > 0,
        "after reopen: {fresh2} fresh, {reused2} reused"
    );
    churn(
        &pool,
        &mut live,
        &mut free_slots,
        200,
        &mut fresh2,
        &mut reused2,
    );
    pool.close().unwrap();
}
