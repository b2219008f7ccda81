//! Open, crash recovery, the filter rebuild, and `check`.
//!
//! Open validates everything it will follow (root, tables, slab lists,
//! every chain) before it writes anything, so a refused open leaves the
//! file as it was. Then, on a writable pool, it finishes what a crash cut:
//!
//! - a resize: `resolve` reads the root's `table`, `next`, `old` words,
//!   which the resize commit stores in that order into one line, so the
//!   line holds a prefix of {old := T, table := N, next := 0}:
//!
//!   | old | table | next | meaning | action |
//!   |---|---|---|---|---|
//!   | 0 | T | N | not committed | give N back |
//!   | T | T | N | not committed | clear old, give N back |
//!   | T | N | N | committed | clear next, give T back |
//!   | T | N | 0 | committed | give T back |
//!
//! - chain buckets a crash left unreachable go back on the free list (it
//!   is rebuilt from what the chains reach), and chain buckets with no
//!   pair left (lazy deletion) are unlinked and freed;
//! - the filter, which lives in DRAM only, is rebuilt from PM.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use engine::{CheckReport, EngineConfig, Result};
use pmem::{Link, Pool};

use crate::grow::free_table;
use crate::layout::*;
use crate::{corrupt, seed_of, Rophi};

/// A root block whose table word is still 0: a create cut by a crash.
pub(crate) fn interrupted_create(pool: &Pool) -> bool {
    let root = pool.root();
    root != 0
        && root.is_multiple_of(LINE)
        && pool.check_range(root, ROOT_BYTES).is_ok()
        && pool.block_size(root).is_ok_and(|b| b >= ROOT_BYTES)
        && pool.load_u64(root) == ROOT_MAGIC
        && pool.load_u64(root + R_TABLE) == 0
}

/// Gives back the root block of an interrupted create. (Its table block,
/// reserved but never named by the root, was freed by the allocator's own
/// recovery.)
pub(crate) fn undo_create(pool: &Pool) -> Result<()> {
    let root = pool.root();
    let t = pool.begin_free(root, Link::RootPointer)?;
    pool.set_root(0)?;
    pool.finish_free(t);
    Ok(())
}

/// The overflow slabs of a table, sorted by offset, with one reachability
/// bit per bucket.
pub(crate) struct SlabMap {
    slabs: Vec<(u64, u64)>,
    base: Vec<u64>,
    bits: Vec<AtomicU64>,
}

impl SlabMap {
    fn new(mut slabs: Vec<(u64, u64)>) -> SlabMap {
        slabs.sort_unstable();
        let mut base = Vec::with_capacity(slabs.len());
        let mut n = 0;
        for &(_, c) in &slabs {
            base.push(n);
            n += c;
        }
        SlabMap {
            slabs,
            base,
            bits: (0..n.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The bucket index of `off`, if it is a bucket of one of the slabs.
    fn index(&self, off: u64) -> Option<u64> {
        let i = self
            .slabs
            .partition_point(|&(s, _)| s <= off)
            .checked_sub(1)?;
        let (s, n) = self.slabs[i];
        let rel = off.checked_sub(s + S_BUCKETS)?;
        (rel.is_multiple_of(BUCKET) && rel / BUCKET < n).then(|| self.base[i] + rel / BUCKET)
    }

    /// Marks bucket `i` reached; false if it already was.
    fn mark(&self, i: u64) -> bool {
        let bit = 1 << (i % 64);
        self.bits[(i / 64) as usize].fetch_or(bit, Ordering::Relaxed) & bit == 0
    }

    fn unmark(&self, i: u64) {
        self.bits[(i / 64) as usize].fetch_and(!(1 << (i % 64)), Ordering::Relaxed);
    }

    /// Buckets no chain reaches.
    fn free(&self) -> Vec<u64> {
        let mut v = Vec::new();
        for (j, &(s, n)) in self.slabs.iter().enumerate() {
            for b in 0..n {
                let i = self.base[j] + b;
                if self.bits[(i / 64) as usize].load(Ordering::Relaxed) & (1 << (i % 64)) == 0 {
                    v.push(s + S_BUCKETS + b * BUCKET);
                }
            }
        }
        v.reverse();
        v
    }

    fn total(&self) -> u64 {
        self.slabs.iter().map(|&(_, n)| n).sum()
    }
}

/// Checks the root block; returns its offset.
fn read_root(pool: &Pool) -> Result<u64> {
    let root = pool.root();
    if root == 0 {
        return Err(corrupt("the pool holds no ROPHI table (empty root)"));
    }
    if !root.is_multiple_of(LINE)
        || pool.check_range(root, ROOT_BYTES).is_err()
        || !pool.block_size(root).is_ok_and(|b| b >= ROOT_BYTES)
    {
        return Err(corrupt(format!(
            "root block {root:#x} is not an allocated 64-byte block"
        )));
    }
    if pool.load_u64(root) != ROOT_MAGIC {
        return Err(corrupt(format!("root block {root:#x} has no ROPHI magic")));
    }
    if pool.load_u64(root + R_SEED) != seed_of(pool) {
        return Err(corrupt("hash seed does not match the pool's identity"));
    }
    if pool.load_u64(root + R_TABLE) == 0 {
        return Err(corrupt(
            "an interrupted create (no table yet); create the table again",
        ));
    }
    Ok(root)
}

/// Checks a table block and its slab list (not the chains).
fn validate_table(pool: &Pool, root: u64, d: u64, what: &str) -> Result<(Table, Vec<(u64, u64)>)> {
    let t = Table::from_desc(d);
    if !(MIN_K..=MAX_K).contains(&t.k) || t.off == 0 {
        return Err(corrupt(format!(
            "{what} table descriptor {d:#x} is invalid"
        )));
    }
    if pool.check_range(t.off, t.bytes()).is_err()
        || !pool.block_size(t.off).is_ok_and(|b| b >= t.bytes())
    {
        return Err(corrupt(format!(
            "{what} table at {:#x} (2^{} heads) is not an allocated block of {} bytes",
            t.off,
            t.k,
            t.bytes()
        )));
    }
    if pool.load_u64(t.off) != TABLE_MAGIC
        || pool.load_u64(t.off + T_K) != t.k as u64
        || pool.load_u64(t.off + T_ROOT) != root
    {
        return Err(corrupt(format!(
            "{what} table at {:#x} has a bad header",
            t.off
        )));
    }
    let mut v = Vec::new();
    let mut seen = HashSet::new();
    let mut s = pool.load_u64(t.off + T_SLABS);
    while s != 0 {
        if !seen.insert(s)
            || !s.is_multiple_of(LINE)
            || pool.check_range(s, S_BUCKETS).is_err()
            || pool.load_u64(s) != SLAB_MAGIC
        {
            return Err(corrupt(format!("{what} table: bad overflow slab {s:#x}")));
        }
        let n = pool.load_u64(s + S_COUNT);
        let bytes = n.checked_mul(BUCKET).and_then(|b| b.checked_add(S_BUCKETS));
        if !(1..=SLAB_MAX).contains(&n)
            || !bytes.is_some_and(|b| pool.block_size(s).is_ok_and(|a| a >= b))
        {
            return Err(corrupt(format!(
                "{what} table: slab {s:#x} claims {n} buckets"
            )));
        }
        v.push((s, n));
        s = pool.load_u64(s + S_NEXT);
    }
    Ok((t, v))
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Runs `f(lo, hi)` over `heads` split into one range per thread.
fn par_heads<R: Send>(heads: u64, f: impl Fn(u64, u64) -> R + Sync) -> Vec<R> {
    let n = threads() as u64;
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|i| {
                let f = &f;
                s.spawn(move || f(heads * i / n, heads * (i + 1) / n))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("scan thread"))
            .collect()
    })
}

/// Walks every chain of `t`: tokens well formed, every link a bucket of
/// the table's slabs reached once. Returns the number of pairs.
fn validate_chains(pool: &Pool, t: Table, map: &SlabMap) -> Result<u64> {
    let parts = par_heads(t.heads(), |lo, hi| -> Result<u64> {
        let mut n = 0;
        for h in lo..hi {
            let mut b = t.head(h);
            loop {
                let w = pool.words(b, 8);
                let tok = w[W_TOKENS].load(Ordering::Relaxed);
                if tok & !(token(0) | token(1) | token(2)) != 0 {
                    return Err(corrupt(format!("bucket {b:#x}: bad tokens {tok:#x}")));
                }
                n += tok.count_ones() as u64;
                let next = w[W_NEXT].load(Ordering::Relaxed);
                if next == 0 {
                    break;
                }
                let Some(i) = map.index(next) else {
                    return Err(corrupt(format!(
                        "bucket {b:#x}: next {next:#x} is not a chain bucket"
                    )));
                };
                if !map.mark(i) {
                    return Err(corrupt(format!("chain bucket {next:#x} is linked twice")));
                }
                b = next;
            }
        }
        Ok(n)
    });
    parts.into_iter().sum()
}

/// Finishes a resize a crash cut (see the module table). Runs on a pool
/// whose tables were all validated.
fn resolve(pool: &Pool, root: u64) -> Result<()> {
    let table = pool.load_u64(root + R_TABLE);
    if pool.load_u64(root + R_OLD) == table {
        pool.store_u64(root + R_OLD, 0);
        // persist: `old` must not name the live table.
        pool.persist(root + R_OLD, 8);
    }
    let next = pool.load_u64(root + R_NEXT);
    if next == table {
        pool.store_u64(root + R_NEXT, 0);
        // persist: the committed table is no longer "being built".
        pool.persist(root + R_NEXT, 8);
    } else if next != 0 {
        free_table(pool, Table::from_desc(next), root + R_NEXT)?;
    }
    let old = pool.load_u64(root + R_OLD);
    if old != 0 {
        free_table(pool, Table::from_desc(old), root + R_OLD)?;
    }
    Ok(())
}

/// Unlinks chain buckets that hold no pair (the paper's "release unused
/// space" at recovery). Returns how many.
fn release_empty(pool: &Pool, t: Table, map: &SlabMap) -> u64 {
    par_heads(t.heads(), |lo, hi| {
        let mut n = 0;
        for h in lo..hi {
            let mut prev = t.head(h);
            let mut b = pool.load_u64(prev + 8 * W_NEXT as u64);
            while b != 0 {
                let next = pool.load_u64(b + 8 * W_NEXT as u64);
                if pool.load_u64(b) & (token(0) | token(1) | token(2)) == 0 {
                    pool.store_u64(prev + 8 * W_NEXT as u64, next);
                    // persist: the unlink before the bucket is reused; a
                    // crash before it leaves the bucket linked and empty.
                    pool.persist_line(prev);
                    if let Some(i) = map.index(b) {
                        map.unmark(i);
                    }
                    n += 1;
                } else {
                    prev = b;
                }
                b = next;
            }
        }
        n
    })
    .into_iter()
    .sum()
}

/// What phase 1 of [`open`] hands on: the live table, its slabs, and the
/// pairs its chains hold.
struct Validated {
    t: Table,
    map: SlabMap,
    len: u64,
}

/// Opens a pool in its numbered phases (`docs/engines/rophi.md`,
/// "Recovery (open)"): the root is read and checked, then each phase runs
/// in turn; a read-only open skips phase 2, the only one that writes.
pub(crate) fn open(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Rophi> {
    let start = Instant::now();
    let root = read_root(&pool)?;
    // 1. Validate every table the root names and the live table's chains;
    // a clean pool's recorded count must match them.
    let Validated { t, map, len } = validate_all(&pool, root)?;
    // 2. Everything followed below was validated: writes start here.
    // Finish a resize a crash cut, and release empty chain buckets.
    let mut released = 0;
    if !pool.is_read_only() {
        resolve(&pool, root)?;
        released = release_empty(&pool, t, &map);
    }
    // 3. The handle, its filter rebuilt from PM, and its free list.
    let rp = build_handle(&pool, cfg, root, Validated { t, map, len });
    rp.t.released.store(released, Ordering::Relaxed);
    rp.t.recovery_us
        .store(start.elapsed().as_micros() as u64, Ordering::Relaxed);
    Ok(rp)
}

/// Phase 1: the live table (and a resize's new and old ones, if the root
/// names them) and every chain of the live table validated; in a clean
/// pool, the count the close recorded checked against the chains.
fn validate_all(pool: &Pool, root: u64) -> Result<Validated> {
    let d = pool.load_u64(root + R_TABLE);
    let (t, slab_list) = validate_table(pool, root, d, "live")?;
    for (w, what) in [
        (R_NEXT, "resize's new (or reserved ahead)"),
        (R_OLD, "resize's old"),
    ] {
        let x = pool.load_u64(root + w);
        if x != 0 && x != d {
            validate_table(pool, root, x, what)?;
        }
    }
    let map = SlabMap::new(slab_list);
    let len = validate_chains(pool, t, &map)?;
    if pool.was_clean() && pool.load_u64(root + R_LEN) != len {
        return Err(corrupt(format!(
            "clean pool records {} pairs, its chains hold {len}: {}",
            pool.load_u64(root + R_LEN),
            engine::damaged_after_close(pool)
        )));
    }
    Ok(Validated { t, map, len })
}

/// Phase 3: the table's handle, with its filter rebuilt from PM (sized
/// for the larger of the pairs found and the configured capacity), its
/// count, and its free list and slab total from the slab map.
fn build_handle(pool: &Arc<Pool>, cfg: &EngineConfig, root: u64, v: Validated) -> Rophi {
    let Validated { t, map, len } = v;
    let seed = seed_of(pool);
    let rp = Rophi::handle(
        pool.clone(),
        root,
        seed,
        t,
        engine::cuckoo::CuckooFilter::with_buckets(2),
        cfg,
    );
    let buckets = engine::cuckoo::CuckooFilter::with_capacity(
        len.max(
            cfg.initial_capacity
                .min(pool.max_size().max(pool.size()) / BUCKET),
        ),
    )
    .buckets();
    let f = rp.build_filter(t, buckets, engine::cuckoo::random_seed());
    rp.filter.replace(f);
    rp.len.set(len as i64);
    *rp.free.lock().unwrap_or_else(|e| e.into_inner()) = map.free();
    rp.slab_total.store(map.total(), Ordering::Relaxed);
    rp
}

/// Read-only walk of the whole table: pairs well formed, no key twice,
/// every key in the filter (which may hold more: deleted keys'
/// fingerprints stay until it is rebuilt, and keys with the same
/// fingerprint and bucket pair share a copy), the count right, and the
/// bytes reachable.
pub(crate) fn check(rp: &Rophi) -> Result<CheckReport> {
    let _m = rp.resize_mx.lock().unwrap_or_else(|e| e.into_inner());
    let pool = &*rp.pool;
    let root = read_root(pool)?;
    let d = pool.load_u64(root + R_TABLE);
    if d != rp.desc.load(Ordering::Acquire) {
        return Err(corrupt("the root's table word differs from the open table"));
    }
    let (t, slab_list) = validate_table(pool, root, d, "live")?;
    let mut reachable = pool.block_size(root)? + pool.block_size(t.off)?;
    for &(s, _) in &slab_list {
        reachable += pool.block_size(s)?;
    }
    let ahead = rp.ahead_desc();
    for w in [R_NEXT, R_OLD] {
        let x = pool.load_u64(root + w);
        if x == 0 || x == d {
            continue;
        }
        // Outside a resize only the table reserved ahead of the next one
        // and a read-only open (which cannot finish a cut resize) leave
        // these set: the blocks are still held.
        if !(pool.is_read_only() || w == R_NEXT && x == ahead) {
            return Err(corrupt(format!(
                "root word {w} names table {x:#x} outside a resize"
            )));
        }
        let (xt, xs) = validate_table(pool, root, x, "resize's")?;
        reachable += pool.block_size(xt.off)?;
        for (s, _) in xs {
            reachable += pool.block_size(s)?;
        }
    }
    let map = SlabMap::new(slab_list);
    let n = validate_chains(pool, t, &map)?;
    let f = rp.filter.get();
    let mut keys = HashSet::with_capacity(n as usize);
    for h in 0..t.heads() {
        let mut b = t.head(h);
        while b != 0 {
            let w = pool.words(b, 8);
            let tok = w[W_TOKENS].load(Ordering::Relaxed);
            for s in 0..SLOTS {
                if tok & token(s) != 0 {
                    let k = w[w_key(s)].load(Ordering::Relaxed);
                    if !keys.insert(k) {
                        return Err(corrupt(format!("key {k} is stored twice")));
                    }
                    if !f.contains(k) {
                        return Err(corrupt(format!("key {k} is missing from the filter")));
                    }
                }
            }
            b = w[W_NEXT].load(Ordering::Relaxed);
        }
    }
    if rp.len.get() != n as i64 {
        return Err(corrupt(format!(
            "count {} but the chains hold {n}",
            rp.len.get()
        )));
    }
    Ok(CheckReport {
        keys: n,
        reachable_bytes: reachable,
    })
}
