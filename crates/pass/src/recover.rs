//! Open, crash recovery and `check`.
//!
//! Open validates everything it will follow — root, geometry, octave
//! tables of the current window, directory arrays, every live segment's
//! chain and (bytes mode) key pointers — before it writes a byte, so a
//! refused open leaves the file as it was.
//!
//! A clean open walks the live segments (in parallel, reading only) and
//! refuses the pool when the records it finds differ from the count the
//! close recorded, or are not what readers reach (allocation bits that
//! disagree with the key words, a record out of its buckets or with a
//! wrong fingerprint, in bytes mode a key whose hash changed): see
//! [`clean_segment`]. After a crash, recovery walks the
//! live segments (in parallel) and, for each:
//! - drops records whose index maps to another segment: stale copies of an
//!   expansion interrupted after its commit (left alone, the next split of
//!   this segment would resurrect them into the wrong children);
//! - drops the second copy of a key (an interrupted displacement or chain
//!   compaction copies before it clears);
//! - fixes member bits from the key's home and rebuilds every overflow
//!   hint, so a hint lost or half-written by the crash cannot hide a key;
//! - recounts.
//!
//! Unused segments (`≥ first`, in arrays an interrupted split allocated)
//! have their chains freed. Locks need no reset: a LineLock word of an
//! older epoch counts as free.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use engine::{CheckReport, EngineConfig, Result};
use pmem::{Link, Pool};

use crate::layout::*;
use crate::ops::{Kind, Loc};
use crate::{corrupt, spiral, Pass};

/// What [`read_root`] found in the root block, checked: handed on to the
/// phases of [`open`].
#[derive(Clone, Copy)]
struct Root {
    root: u64,
    geo: Geo,
    seed: u64,
    split_load: f64,
    k: u32,
    first: u64,
}

/// Opens a pool in its numbered phases (`docs/engines/pass.md`,
/// "Recovery"): the root is read and checked, then each phase runs in
/// turn; a cleanly closed pool stops after phase 2, a read-only view of a
/// crashed pool after phase 3. Open writes to the table only in phase 4.
pub(crate) fn open(pool: Arc<Pool>, _cfg: &EngineConfig) -> Result<Pass> {
    let r = read_root(&pool)?;
    // 1. Validate everything the table will follow (tables, directory
    // arrays, chains, key pointers), then load the DRAM state.
    let ps = load_validated(pool, &r)?;
    // 2. A clean pool: walk the live segments against the recorded count.
    if ps.pool.was_clean() {
        clean_open(&ps, &r)?;
        return Ok(ps);
    }
    // 3. A read-only view of a crashed pool: count what recovery would
    // keep, repairing nothing.
    if ps.pool.is_read_only() {
        count_crashed(&ps, &r)?;
        return Ok(ps);
    }
    // 4. After a crash: repair every segment, recount.
    repair_crashed(&ps, &r)?;
    Ok(ps)
}

/// Reads and checks the root block: magic, geometry, seed, split load,
/// `k`, `first` and the zero-hash key's flag.
fn read_root(pool: &Pool) -> Result<Root> {
    let root = pool.root();
    if root == 0 {
        return Err(corrupt("pool holds no PASS table (no root)"));
    }
    if !root.is_multiple_of(LINE) {
        return Err(corrupt(format!("root {root:#x} is not line-aligned")));
    }
    pool.check_range(root, ROOT_BYTES)?;
    if pool.load_u64(root) != ROOT_MAGIC {
        return Err(corrupt("root block is not a PASS table (bad magic)"));
    }
    let geo = Geo::decode(pool.load_u64(root + R_GEO))
        .ok_or_else(|| corrupt("root geometry word is invalid"))?;
    let seed = pool.load_u64(root + R_SEED);
    if seed != crate::seed_of(pool) {
        return Err(corrupt("hash seed does not match the pool's identity"));
    }
    let split_load = f64::from_bits(pool.load_u64(root + R_SPLIT_LOAD));
    if !(0.3..=1.5).contains(&split_load) {
        return Err(corrupt(format!("split load {split_load} is invalid")));
    }
    let k = pool.load_u64(root + R_K);
    if !(8..=MAX_K as u64).contains(&k) {
        return Err(corrupt(format!("table k = {k} outside 8..={MAX_K}")));
    }
    let k = k as u32;
    let first = pool.load_u64(root + R_FIRST);
    if first == 0 {
        return Err(corrupt(
            "the table's creation was cut short (first = 0); create it again to reclaim the pool",
        ));
    }
    if first > max_first(k) {
        return Err(corrupt(format!(
            "first = {first} outside 1..={}",
            max_first(k)
        )));
    }
    // The zero-hash key's flag: 0 or 1, and only an inline table has that
    // key (`for_each` of a bytes table never visits it).
    let zero = pool.load_u64(root + R_ZERO);
    if zero > 1 || (zero == 1 && geo.bytes_keys) {
        return Err(corrupt(format!(
            "the zero-hash key's flag is {zero}, not 0{}",
            if geo.bytes_keys { "" } else { " or 1" }
        )));
    }
    Ok(Root {
        root,
        geo,
        seed,
        split_load,
        k,
        first,
    })
}

/// Phase 1: the table's handle, once everything it will follow is
/// validated, with its DRAM state loaded and its chain buckets counted.
fn load_validated(pool: Arc<Pool>, r: &Root) -> Result<Pass> {
    let Root {
        root,
        geo,
        seed,
        split_load,
        k,
        first,
    } = *r;
    let name = crate::engine_name(geo.bytes_keys, split_load);
    let ps = Pass::handle(pool, root, geo, seed, split_load, name);
    // A clean open checks every key block in its walk below (in
    // parallel); after a crash, validation follows them first.
    validate(&ps, first, k, !ps.pool.was_clean())?;
    ps.load_dram();
    let chains: u64 = (0..first)
        .map(|p| ps.chain_of(ps.seg_off(p).expect("validated")).len() as u64)
        .sum();
    ps.t.chain_buckets.store(chains, Ordering::Relaxed);
    Ok(ps)
}

/// Phase 2, a cleanly closed pool: the recorded count checked against
/// the records the walk finds ([`clean_walk`]), and set.
fn clean_open(ps: &Pass, r: &Root) -> Result<()> {
    let Root { root, first, .. } = *r;
    let len = ps.pool.load_u64(root + R_LEN);
    // The count a clean close recorded must match the records the
    // walk finds, and every record must be one that readers and
    // `for_each` reach (a page zeroed or overwritten since would
    // otherwise open with keys silently missing or invented).
    // A writable open after a read-only one that passed this walk
    // under the same lock (`Pool::prechecked`) does not walk again,
    // unless it needs the walk's count of keys not in u64 form (bytes
    // mode: nothing records it at close).
    let odd = if ps.pool.prechecked() && !ps.geo.bytes_keys {
        0
    } else {
        let (found, odd) = clean_walk(ps, first)?;
        ps.t.clean_walked.store(first, Ordering::Relaxed);
        if found != len {
            return Err(corrupt(format!(
                "clean pool records {len} keys, its segments hold {found}: {}",
                engine::damaged_after_close(&ps.pool)
            )));
        }
        odd
    };
    ps.len.set(len as i64);
    ps.odd.set(odd as i64);
    Ok(())
}

/// Phase 3, a read-only view of a crashed pool: counts what recovery
/// would keep, without repairing (the zero-hash key, in the root,
/// included); `for_each` visits the same records.
fn count_crashed(ps: &Pass, r: &Root) -> Result<()> {
    let Root { root, first, .. } = *r;
    let st = ps.snap();
    let mut n = (ps.pool.load_u64(root + R_ZERO) == 1) as u64;
    let mut odd = 0;
    for p in 0..first {
        for r in classify(ps, p, &st)?
            .iter()
            .filter(|r| r.fate == Fate::Keep)
        {
            n += 1;
            odd += r.odd as u64;
        }
    }
    ps.len.set(n as i64);
    ps.odd.set(odd as i64);
    Ok(())
}

/// Phase 4, after a crash (writable opens): every segment repaired
/// ([`repair`]), timed, and the chain buckets counted again.
fn repair_crashed(ps: &Pass, r: &Root) -> Result<()> {
    let first = r.first;
    let t0 = Instant::now();
    repair(ps, first)?;
    ps.t.recovery_us
        .store(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
    let chains: u64 = (0..first)
        .map(|p| ps.chain_of(ps.seg_off(p).expect("validated")).len() as u64)
        .sum();
    ps.t.chain_buckets.store(chains, Ordering::Relaxed);
    Ok(())
}

/// The clean-open cross-check: walks every live segment (in parallel)
/// with [`clean_segment`] and returns the number of keys, the zero-hash
/// key in the root included, and of those the keys not in the form of a
/// u64 key (bytes mode). The first damage found (lowest segment) is an
/// `Err` that points at `pmhash check`.
fn clean_walk(ps: &Pass, first: u64) -> Result<(u64, u64)> {
    let st = ps.snap();
    let bad: std::sync::Mutex<Option<(u64, String)>> = std::sync::Mutex::new(None);
    let odd = AtomicU64::new(0);
    let n = engine::par_sum(first as usize, |p| {
        let p = p as u64;
        match clean_segment(ps, &st, p) {
            Ok((n, o)) => {
                if o != 0 {
                    odd.fetch_add(o, Ordering::Relaxed);
                }
                n
            }
            Err(e) => {
                let mut b = bad.lock().unwrap_or_else(|e| e.into_inner());
                if b.as_ref().is_none_or(|(q, _)| p < *q) {
                    let m = match e {
                        engine::Error::Corrupt(m) => m,
                        e => e.to_string(),
                    };
                    *b = Some((p, m));
                }
                0
            }
        }
    });
    if let Some((p, e)) = bad.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(corrupt(format!(
            "segment {p}: {e}: {}",
            engine::damaged_after_close(&ps.pool)
        )));
    }
    let n = n + (ps.pool.load_u64(ps.root + R_ZERO) == 1) as u64;
    Ok((n, odd.into_inner()))
}

/// Counts the records of live segment `p` of a cleanly closed table (and
/// of those, in bytes mode, the keys not in the form of a u64 key) and
/// checks what readers rely on there. A clean close writes every hint
/// back, so each bucket's allocation bits must name exactly the slots
/// whose key word is set (`for_each` and searches go by the bits, a
/// record is its key word), and each record must sit where its hash sends
/// it, with its fingerprint: this segment, its home bucket or (member bit
/// set) its probe bucket, or its home's chain group. In bytes mode that
/// also reads every key block, so a damaged key (its hash no longer
/// matches) is found. Reads only; the slot, meta and fingerprint lines it
/// reads are the lines the count reads anyway.
fn clean_segment(ps: &Pass, st: &crate::Snap, p: u64) -> Result<(u64, u64)> {
    let geo = ps.geo;
    let pool = &ps.pool;
    let seg = ps.seg_off(p).expect("validated");
    let normal = seg + geo.header();
    let mut n = 0u64;
    let mut odd = 0u64;
    let mut bucket = |bo: u64, chain: Option<u64>| -> Result<()> {
        let meta = pool.load_u64(bo + B_META);
        let fps = [pool.load_u64(bo + B_FP), pool.load_u64(bo + B_FP + 8)];
        let mut used = 0u64;
        for s in 0..SLOTS {
            let kw = pool.load_u64(slot_off(bo, s));
            if kw == 0 {
                continue;
            }
            used |= 1 << s;
            let (h, o) = ps.hash_kw_odd(kw)?;
            odd += o as u64;
            let (fp, bix) = ps.fp_bix(h);
            let placed = match chain {
                Some(g) => g == chain_group(bix),
                None if bo < normal + geo.n * BUCKET => {
                    let b = (bo - normal) / BUCKET;
                    let probe = member(meta) >> s & 1 == 1;
                    if probe {
                        b == geo.probe(bix)
                    } else {
                        b == bix
                    }
                }
                None => true,
            };
            // The segment check costs a table look-up per record; an
            // inline key word that kept its fingerprint and bucket bits
            // through damage is rare, a damaged key block (bytes mode)
            // keeps none of them.
            if !placed || (geo.bytes_keys && ps.phys_of(h, st) != Some(p)) {
                return Err(corrupt(format!(
                    "bucket {bo:#x} slot {s} holds a record its hash does not send there"
                )));
            }
            if (fps[s / 8] >> (8 * (s % 8))) as u8 != fp {
                return Err(corrupt(format!(
                    "bucket {bo:#x} slot {s}: the fingerprint does not match the key"
                )));
            }
        }
        if used != alloc(meta) {
            return Err(corrupt(format!(
                "bucket {bo:#x}: allocation bits {:#x} name other slots than the key words {used:#x}",
                alloc(meta)
            )));
        }
        n += used.count_ones() as u64;
        Ok(())
    };
    for b in 0..geo.n + geo.m {
        bucket(geo.bucket(seg, b), None)?;
    }
    for g in 0..geo.groups() {
        let mut cb = pool.load_u64(chain_head(seg, g));
        while cb != 0 {
            bucket(cb, Some(g))?;
            cb = chain_next(pool.load_u64(cb + B_META));
        }
    }
    Ok((n, odd))
}

/// Whether the pool's root is a PASS root block whose create never
/// finished (`first` still 0).
pub(crate) fn interrupted_create(pool: &Pool) -> bool {
    let root = pool.root();
    root != 0
        && root.is_multiple_of(LINE)
        && pool.check_range(root, ROOT_BYTES).is_ok()
        && pool.block_size(root).is_ok_and(|b| b >= ROOT_BYTES)
        && pool.load_u64(root) == ROOT_MAGIC
        && pool.load_u64(root + R_FIRST) == 0
}

/// Gives back every block an interrupted (or refused) create linked from
/// its root block, then the root block itself. Each free is decided by one
/// persisted store of the word that names the block, so a crash in here
/// leaves a state this function finishes.
pub(crate) fn undo_create(pool: &Pool) -> Result<()> {
    let root = pool.root();
    let words = (0..6)
        .map(|s| R_TABLES + 8 * s)
        .chain((0..DIR_ENTRIES as u64).map(|e| R_DIR + 8 * e));
    for w in words {
        let owner = root + w;
        let blk = pool.load_u64(owner);
        if blk == 0 {
            continue;
        }
        let t = pool.begin_free(blk, Link::Pointer { owner })?;
        // persist: the link is cleared before the block is free.
        pool.store_u64(owner, 0);
        pool.persist(owner, 8);
        pool.finish_free(t);
    }
    let t = pool.begin_free(root, Link::RootPointer)?;
    pool.set_root(0)?;
    pool.finish_free(t);
    Ok(())
}

/// Read-only checks of everything open and recovery follow.
/// `deep`: also every key block (bytes mode), which recovery and `check`
/// follow; a clean open follows them only through checked reads, so it
/// skips that walk.
fn validate(ps: &Pass, first: u64, k: u32, deep: bool) -> Result<()> {
    let pool = &ps.pool;
    let geo = ps.geo;
    let deep = deep && geo.bytes_keys;
    for s in 0..6u64 {
        let blk = pool.load_u64(ps.root + R_TABLES + 8 * s);
        if blk == 0 {
            continue;
        }
        let sk = if blk.is_multiple_of(LINE) && pool.check_range(blk, OCT_HEADER).is_ok() {
            pool.load_u64(blk + 16)
        } else {
            0
        };
        if !(8..=MAX_K as u64).contains(&sk)
            || pool.load_u64(blk) != OCT_MAGIC
            || pool.check_range(blk, octave_bytes(sk as u32)).is_err()
            || sk % 2 != s / 3
        {
            return Err(corrupt(format!(
                "octave table slot {s} holds no valid table"
            )));
        }
    }
    let (lo, hi) = crate::window_octaves(first);
    for o in lo..=hi {
        let blk = pool.load_u64(ps.root + crate::table_slot(o, k));
        if blk == 0 || !blk.is_multiple_of(LINE) || pool.check_range(blk, octave_bytes(k)).is_err()
        {
            return Err(corrupt(format!(
                "octave {o}'s table is missing or out of the pool"
            )));
        }
        if pool.load_u64(blk) != OCT_MAGIC
            || pool.load_u64(blk + 8) != o as u64
            || pool.load_u64(blk + 16) != k as u64
        {
            return Err(corrupt(format!("octave {o}'s table has a bad header")));
        }
        // The table is a cache of a fixed function: check it against the
        // function, so a damaged cell cannot misroute keys (or make
        // recovery drop records as stale copies).
        let want = crate::table::exact_octave(o, k);
        let got = pool.words(blk + OCT_HEADER, want.len());
        if want
            .iter()
            .zip(got)
            .any(|(&w, g)| g.load(Ordering::Relaxed) != w)
        {
            return Err(corrupt(format!("octave {o}'s table has damaged cells")));
        }
    }
    let mut arrays = HashSet::new();
    for e in 0..DIR_ENTRIES {
        let blk = pool.load_u64(ps.root + R_DIR + 8 * e as u64);
        let size = entry_segments(e) * geo.seg_bytes();
        if blk == 0 {
            if entry_first(e) < first {
                return Err(corrupt(format!(
                    "directory entry {e} (a live segment's array) is empty"
                )));
            }
            continue;
        }
        if !blk.is_multiple_of(LINE)
            || pool.check_range(blk, size).is_err()
            || pool.block_size(blk).map_or(true, |b| b < size)
            || !arrays.insert(blk)
        {
            return Err(corrupt(format!(
                "directory entry {e} points outside the pool"
            )));
        }
    }
    let max_chain = pool.size() / BUCKET;
    // One set for every chain: a bucket in two chains would be freed (or
    // repaired) twice.
    let mut seen = HashSet::new();
    for e in 0..DIR_ENTRIES {
        let blk = pool.load_u64(ps.root + R_DIR + 8 * e as u64);
        if blk == 0 {
            continue;
        }
        for i in 0..entry_segments(e) {
            let seg = blk + i * geo.seg_bytes();
            let p = entry_first(e) + i;
            for g in 0..geo.groups() {
                let mut cb = pool.load_u64(chain_head(seg, g));
                let mut steps = 0;
                while cb != 0 {
                    steps += 1;
                    if !cb.is_multiple_of(LINE)
                        || pool.check_range(cb, BUCKET).is_err()
                        || steps > max_chain
                        || !seen.insert(cb)
                    {
                        return Err(corrupt(format!(
                            "segment {p}'s overflow chain {g} is broken at {cb:#x}"
                        )));
                    }
                    if p < first && deep {
                        check_keys(ps, cb)?;
                    }
                    cb = chain_next(pool.load_u64(cb + B_META));
                }
            }
            if p < first {
                // Logical ids agree with `first` (after a crash the split's
                // old segment may still carry `first − 1`, its id before).
                let id = pool.load_u64(seg + H_LOGICAL);
                let ok = id == logical_of(p, first)
                    || (!pool.was_clean() && p == spiral::physical(first - 1) && id == first - 1);
                if !ok {
                    return Err(corrupt(format!(
                        "segment {p} serves logical {id}, not what first = {first} implies"
                    )));
                }
            }
            if p < first && deep {
                for b in 0..geo.n + geo.m {
                    check_keys(ps, geo.bucket(seg, b))?;
                }
            }
        }
    }
    Ok(())
}

fn check_keys(ps: &Pass, bo: u64) -> Result<()> {
    let a = alloc(ps.pool.load_u64(bo + B_META));
    for s in 0..SLOTS {
        let kw = ps.pool.load_u64(slot_off(bo, s));
        if kw != 0 {
            ps.key_block(kw)?;
        }
        // After a clean close the hints are exact; after a crash a slot
        // line and its meta line may disagree (recovery rebuilds).
        if ps.pool.was_clean() && (kw != 0) != (a >> s & 1 == 1) {
            return Err(corrupt(format!(
                "bucket {bo:#x} slot {s}: allocation bit and key word disagree"
            )));
        }
    }
    Ok(())
}

/// Crash repair (after `validate`).
fn repair(ps: &Pass, first: u64) -> Result<()> {
    // Unused segments keep no chains.
    for e in 0..DIR_ENTRIES {
        let base = ps.dir[e].load(Ordering::Relaxed);
        if base == 0 {
            continue;
        }
        for i in 0..entry_segments(e) {
            if entry_first(e) + i >= first {
                ps.free_chain(base + i * ps.geo.seg_bytes())?;
            }
        }
    }
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(first as usize)
        .max(1);
    let total = AtomicU64::new(0);
    let odd = AtomicU64::new(0);
    let next = AtomicU64::new(0);
    let res: Vec<Result<()>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                sc.spawn(|| -> Result<()> {
                    loop {
                        let p = next.fetch_add(1, Ordering::Relaxed);
                        if p >= first {
                            return Ok(());
                        }
                        let (n, o) = repair_segment(ps, p)?;
                        total.fetch_add(n, Ordering::Relaxed);
                        odd.fetch_add(o, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(corrupt("recovery thread panicked")))
            })
            .collect()
    });
    for r in res {
        r?;
    }
    // persist: every repaired segment was flushed by its worker; one fence
    // makes them durable before the table is used.
    ps.pool.fence();
    let zero = ps.pool.load_u64(ps.root + R_ZERO) == 1;
    ps.len
        .set(total.load(Ordering::Relaxed) as i64 + zero as i64);
    ps.odd.set(odd.load(Ordering::Relaxed) as i64);
    Ok(())
}

/// The key of a record, for duplicate detection.
#[derive(Hash, PartialEq, Eq)]
enum KeyId {
    Word(u64),
    Bytes(Vec<u8>),
}

fn key_id(ps: &Pass, kw: u64) -> Result<KeyId> {
    Ok(if ps.geo.bytes_keys {
        KeyId::Bytes(ps.key_bytes(kw)?)
    } else {
        KeyId::Word(kw)
    })
}

/// What recovery does with a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fate {
    Keep,
    /// Its hash sends it to another segment, or out of its home and probe
    /// buckets: a stale copy of a split.
    Stale,
    /// A second copy of a key kept earlier in the walk.
    Duplicate,
}

/// A slot in use after a crash and what recovery does with it.
pub(crate) struct Found {
    pub loc: Loc,
    pub kw: u64,
    pub value: u64,
    pub h: u64,
    /// Bytes mode: the key is not the form of a u64 key.
    pub odd: bool,
    pub fate: Fate,
}

/// Every slot of live segment `p` whose key word is set (the slots
/// decide after a crash, not the hints), each with its fate: the records
/// recovery keeps and the copies it drops. Reads only.
pub(crate) fn classify(ps: &Pass, p: u64, st: &crate::Snap) -> Result<Vec<Found>> {
    let geo = ps.geo;
    let seg = ps.seg_off(p).expect("validated");
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (loc, kw, value) in ps.slots_in_use(seg) {
        let (h, odd) = ps.hash_kw_odd(kw)?;
        let (_, bix) = ps.fp_bix(h);
        // Only meaningful for normal buckets (chain buckets lie anywhere).
        let b = loc.bucket.wrapping_sub(seg + geo.header()) / BUCKET;
        let here = ps.phys_of(h, st) == Some(p);
        let placed = match loc.kind {
            Kind::Normal => b == bix || b == geo.probe(bix),
            Kind::Chain(g) if g != chain_group(bix) => {
                // No write puts a record in another group's chain, and no
                // crash can: this is damage, not a stale copy.
                return Err(corrupt(format!(
                    "segment {p}: a chain record sits in another home's chain"
                )));
            }
            _ => true,
        };
        let fate = if !here || !placed {
            Fate::Stale
        } else if !seen.insert(key_id(ps, kw)?) {
            Fate::Duplicate
        } else {
            Fate::Keep
        };
        out.push(Found {
            loc,
            kw,
            value,
            h,
            odd,
            fate,
        });
    }
    Ok(out)
}

/// Repairs live segment `p`; returns its record count and, of those, the
/// keys not in the form of a u64 key (bytes mode).
fn repair_segment(ps: &Pass, p: u64) -> Result<(u64, u64)> {
    let geo = ps.geo;
    let seg = ps.seg_off(p).expect("validated");
    let st = ps.snap();
    let found = classify(ps, p, &st)?;
    // The slots decide (a key word that is not 0 is a record); every
    // bucket's allocation and member bits and fingerprints are rebuilt.
    let mut buckets: Vec<u64> = (0..geo.n + geo.m).map(|b| geo.bucket(seg, b)).collect();
    buckets.extend(ps.chain_of(seg));
    for &bo in &buckets {
        let mw = ps.pool.atomic_u64(bo + B_META);
        let keep = if bo < seg + geo.header() + geo.n * BUCKET && bo >= seg {
            !(ALLOC_MASK | ALLOC_MASK << MEMBER_SHIFT)
        } else {
            !ALLOC_MASK
        };
        mw.store(mw.load(Ordering::Relaxed) & keep, Ordering::Relaxed);
    }
    let mut kept = 0;
    let mut odd = 0;
    for f in found {
        let loc = f.loc;
        let so = slot_off(loc.bucket, loc.s);
        match f.fate {
            Fate::Keep => {}
            Fate::Stale | Fate::Duplicate => {
                let t = if f.fate == Fate::Stale {
                    &ps.t.stale_removed
                } else {
                    &ps.t.duplicates_removed
                };
                t.fetch_add(1, Ordering::Relaxed);
                // A stale copy or a second copy: its key block (bytes
                // mode) belongs to the copy that stays.
                // persist: the slot's key word is cleared and its line
                // flushed here; the fence after the walk (in `repair`)
                // makes it durable before the table is used.
                ps.pool.store_u64(so, 0);
                ps.pool.flush(so & !(LINE - 1), LINE as usize);
                continue;
            }
        }
        let (fp, bix) = ps.fp_bix(f.h);
        let b = loc.bucket.wrapping_sub(seg + geo.header()) / BUCKET;
        let mut bits = 1u64 << loc.s;
        if loc.kind == Kind::Normal && b != bix {
            bits |= 1 << (MEMBER_SHIFT as usize + loc.s);
        }
        let mw = ps.pool.atomic_u64(loc.bucket + B_META);
        mw.store(mw.load(Ordering::Relaxed) | bits, Ordering::Relaxed);
        ps.pool
            .atomic_u8(loc.bucket + B_FP + loc.s as u64)
            .store(fp, Ordering::Relaxed);
        kept += 1;
        odd += f.odd as u64;
    }
    ps.rebuild_hints(seg)?;
    let logical = logical_of(p, st.first);
    ps.pool.store_u64(seg + H_LOGICAL, logical);
    ps.flush_meta(seg);
    Ok((kept, odd))
}

/// The active logical bucket that physical segment `p` serves.
pub(crate) fn logical_of(p: u64, first: u64) -> u64 {
    // Logical L in first..2·first maps to physical p: L = (2p or the
    // appended bucket) shifted left with trailing ones while ≥ first.
    // Walk up from the bucket appended at p: 2p (or 1 for p = 0).
    let mut l = if p == 0 { 1 } else { 2 * p };
    while l < first {
        l = 2 * l + 1;
    }
    debug_assert_eq!(spiral::physical(l), p);
    l
}

/// Read-only walk of the whole table (the caller keeps writers out).
pub(crate) fn check(ps: &Pass) -> Result<CheckReport> {
    let pool = &ps.pool;
    let geo = ps.geo;
    let st = ps.snap();
    let first = st.first;
    if pool.load_u64(ps.root + R_FIRST) != first || pool.load_u64(ps.root + R_K) != st.k as u64 {
        return Err(corrupt("DRAM state and PM first/k differ"));
    }
    validate(ps, first, st.k, true)?;
    let mut reachable = pool.block_size(ps.root)?;
    for s in 0..6 {
        let blk = pool.load_u64(ps.root + R_TABLES + 8 * s);
        if blk != 0 {
            reachable += pool.block_size(blk)?;
        }
    }
    for e in 0..DIR_ENTRIES {
        let blk = pool.load_u64(ps.root + R_DIR + 8 * e as u64);
        if blk != 0 {
            reachable += pool.block_size(blk)?;
            for i in 0..entry_segments(e) {
                let p = entry_first(e) + i;
                let seg = blk + i * geo.seg_bytes();
                if p >= first && (0..geo.groups()).any(|g| pool.load_u64(chain_head(seg, g)) != 0) {
                    return Err(corrupt(format!("unused segment {p} keeps a chain")));
                }
            }
        }
    }
    let mut keys = HashSet::new();
    let mut odd = 0u64;
    let mut blocks = HashSet::new();
    for p in 0..first {
        let seg = ps.seg_off(p).expect("validated");
        if pool.load_u64(seg + H_LOGICAL) != logical_of(p, first) {
            return Err(corrupt(format!("segment {p} has a stale logical id")));
        }
        for cb in ps.chain_of(seg) {
            reachable += pool.block_size(cb)?;
        }
        let used = ps.slots_in_use(seg);
        if used.len() != ps.records(seg).len() {
            return Err(corrupt(format!(
                "segment {p}: allocation bits disagree with the key words"
            )));
        }
        for (loc, kw, _) in used {
            if alloc(pool.load_u64(loc.bucket + B_META)) >> loc.s & 1 == 0 {
                return Err(corrupt(format!(
                    "segment {p}: a record without its allocation bit"
                )));
            }
            let (h, o) = ps.hash_kw_odd(kw)?;
            odd += o as u64;
            let (fp, bix) = ps.fp_bix(h);
            if ps.phys_of(h, &st) != Some(p) {
                return Err(corrupt(format!(
                    "segment {p} holds a key of another segment"
                )));
            }
            if !keys.insert(key_id(ps, kw)?) {
                return Err(corrupt(format!("segment {p} holds a key twice")));
            }
            if geo.bytes_keys {
                if !blocks.insert(kw) {
                    return Err(corrupt("two records share a key block"));
                }
                reachable += pool.block_size(kw)?;
            }
            let t = geo.bucket(seg, bix);
            let pb = geo.bucket(seg, geo.probe(bix));
            let fpb = pool
                .atomic_u8(loc.bucket + B_FP + loc.s as u64)
                .load(Ordering::Relaxed);
            if fpb != fp {
                return Err(corrupt(format!(
                    "segment {p}: a slot's fingerprint is wrong"
                )));
            }
            match loc.kind {
                Kind::Normal => {
                    let m = pool.load_u64(loc.bucket + B_META);
                    let mem = member(m) >> loc.s & 1 == 1;
                    if !((loc.bucket == t && !mem) || (loc.bucket == pb && mem)) {
                        return Err(corrupt(format!(
                            "segment {p}: a record is out of its buckets"
                        )));
                    }
                }
                Kind::Stash(_) | Kind::Chain(_) => {
                    if let Kind::Chain(g) = loc.kind {
                        if g != chain_group(bix) {
                            return Err(corrupt(format!(
                                "segment {p}: a chain record sits in another home's chain"
                            )));
                        }
                    }
                    // Every stash and chain record is in its home's
                    // filters (fingerprint hints are optional).
                    let fb = filter_bits(h);
                    if pool.load_u64(t + B_META) & overflow_bit(h) == 0
                        || pool.load_u64(chain_filter(seg, bix)) & fb != fb
                    {
                        return Err(corrupt(format!(
                            "segment {p}: an overflow record is missing from its home's filters"
                        )));
                    }
                }
            }
        }
    }
    let n = keys.len() as u64 + (pool.load_u64(ps.root + R_ZERO) == 1) as u64;
    if n != ps.len.get().max(0) as u64 {
        return Err(corrupt(format!(
            "walk found {n} keys, the count says {}",
            ps.len.get()
        )));
    }
    if odd != ps.odd.get().max(0) as u64 {
        return Err(corrupt(format!(
            "walk found {odd} keys not in the form of a u64 key, the count says {}",
            ps.odd.get()
        )));
    }
    // The keys of the u64 view, as `len()` counts them and `for_each`
    // visits them.
    Ok(CheckReport {
        keys: n - odd,
        reachable_bytes: reachable,
    })
}
