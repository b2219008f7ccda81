//! Level hashing (Zuo, Hua, Wu; OSDI'18) on the pmhash pool, with the
//! paper's gaps closed. Design, persist orders and every decision:
//! `docs/engines/level.md`.
//!
//! - Two-level sharing table: top level of N buckets, bottom level of N/2;
//!   two hash functions; buckets of 6 slots (two cache lines of 3 slots,
//!   each line with its own 1-bit tokens in one 8-byte header word).
//! - Insert: direct insert into the less-loaded top bucket, one-item
//!   movement in the top level, bottom-level insert and movement,
//!   bottom-to-top movement; expansion when all fail.
//! - Opportunistic log-free update (new slot + both tokens flipped in one
//!   8-byte store) and an undo-logged update when the line is full.
//! - In-place expansion that rehashes only the interim level (the old
//!   bottom, 1/3 of the buckets), and shrinking.
//! - Readers are optimistic (per-line seqlocks, never a PM write); writers
//!   lock lines, serialise per key through DRAM stripes, and resizes
//!   exclude writers but not readers.

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use engine::gate::WriterGate;

use engine::{CheckReport, Engine, EngineConfig, EngineKind, EngineSpec, Error, Result, Stats};
use pmem::{Link, Pool};

mod layout;

use engine::sync::{Counter, LineLock, Stripes};
use layout::*;
use pmem::SlotSet;

/// Layout id written in the pool header.
pub const LAYOUT: &str = "level";
/// Smallest top level, in buckets.
const MIN_TOP: u64 = 16;
/// Largest level, in buckets (2^50 × 128 bytes: beyond any pool).
const MAX_BUCKETS: u64 = 1 << 50;
/// Interim buckets rehashed per batch (two fences per batch).
const REHASH_BATCH: u64 = 8;
/// Slots of a rehash batch: two lines a bucket.
const BATCH_SLOTS: usize = REHASH_BATCH as usize * 2 * SLOTS_PER_LINE;
/// An expansion's interim level of at least this many buckets is rehashed
/// by several threads (`EngineConfig::threads`, at most 8).
const PARALLEL_REHASH_BUCKETS: u64 = 1024;
/// A table of more than this many top buckets shrinks when its items fall
/// below 1/[`SHRINK_DIVISOR_LARGE`] of the slots; a smaller one below 1/5
/// (the result is at most 2/5 full). Both take the same shrink path.
const SHRINK_LARGE_TOP: u64 = 1024;
/// Shrink when items fall below 1/5 of the slots (tables of at most
/// [`SHRINK_LARGE_TOP`] top buckets: a shrink of at most ~6k items takes
/// well under a millisecond, so giving memory back early costs nothing).
const SHRINK_DIVISOR: u64 = 5;
/// Shrink a larger table when its items fall below 1/10 of the slots (the
/// result is at most 1/5 full). A shrink rehashes the old top level (about
/// 2/3 of the items, ~500 ns each on a 2-vCPU EPYC), so a draining table
/// that waits until it is this sparse moves half as many items per shrink
/// as at 1/5. The cost is memory: a table between 1/10 and 1/5 full keeps
/// twice the slots it needs. Expansion happens only on an insertion
/// failure (0.8 to 0.9 load), far above, so a table never alternates
/// between expanding and shrinking.
const SHRINK_DIVISOR_LARGE: u64 = 10;

/// The registry entry.
pub fn spec() -> EngineSpec {
    EngineSpec {
        reference: false,
        name: "level",
        about: "level hashing: two-level sharing table, log-free tokens, in-place resizing",
        kind: EngineKind::Persistent {
            layout: LAYOUT,
            create: create_boxed,
            open: open_boxed,
        },
    }
}

fn create_boxed(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Box<dyn Engine>> {
    Ok(Box::new(Level::create(pool, cfg)?))
}

fn open_boxed(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Box<dyn Engine>> {
    Ok(Box::new(Level::open(pool, cfg)?))
}

const TOP: usize = 0;
const BOT: usize = 1;
const IL: usize = 2;

/// A geometry snapshot.
#[derive(Clone, Copy, Debug)]
struct Geo {
    seq: u64,
    phase: Phase,
    lv: [Lvl; 3],
}

impl Geo {
    fn from_record(r: &Record) -> Geo {
        Geo {
            seq: r.seq,
            phase: r.phase,
            lv: [r.top, r.bot, r.il],
        }
    }
}

/// A locked line: its words and the lock word as held (for `release`).
type Held<'a> = (&'a [AtomicU64], u64);

/// Where a key was found.
#[derive(Clone, Copy, Debug)]
struct Loc {
    level: usize,
    line: u64,
    slot: usize,
}

/// What one optimistic line read saw.
struct Scan {
    mask: u64,
    vals: [u64; 3],
    ver: u64,
    ok: bool,
}

#[inline]
fn fmix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[inline]
fn free_slot(hdr: u64) -> Option<usize> {
    let free = !hdr & TOKEN_MASK;
    (free != 0).then(|| free.trailing_zeros() as usize)
}

#[inline]
fn free_count(hdr: u64) -> u32 {
    (!hdr & TOKEN_MASK).count_ones()
}

/// The 8-bit fingerprint of a key (from its first hash's top byte).
#[inline]
fn fingerprint(h0: u64) -> u64 {
    h0 >> 56
}

/// Slots of a line whose token is set and whose fingerprint is `fp`.
#[inline(always)]
fn fp_candidates(hdr: u64, fp: u64) -> u64 {
    let x = (hdr >> FP_SHIFT) ^ (fp * 0x01_0101);
    let zero = ((x & 0xff) == 0) as u64
        | (((x >> 8) & 0xff == 0) as u64) << 1
        | (((x >> 16) & 0xff == 0) as u64) << 2;
    zero & hdr & TOKEN_MASK
}

/// `hdr` with slot `s` valid and carrying fingerprint `fp`.
#[inline]
fn with_slot(hdr: u64, s: usize, fp: u64) -> u64 {
    let shift = FP_SHIFT + 8 * s as u32;
    (hdr & !(0xff << shift)) | (fp << shift) | (1 << s)
}

/// Whether a slot write is persisted at once, or flushed and fenced by
/// the caller later (a rehash batch: it flushes the lines it filled after
/// releasing them, then fences once).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fence {
    Now,
    Later,
}

enum Probe {
    Hit((Loc, u64)),
    Miss,
    Retry,
}

/// The level hashing engine.
pub struct Level {
    pool: Arc<Pool>,
    root: u64,
    seeds: (u64, u64),
    lock: LineLock,
    /// Writers share it; resizes take it exclusively. Readers never touch it.
    gate: WriterGate,
    geo_ver: AtomicU64,
    geo: [AtomicU64; 8],
    /// Moves begun and finished (item movements and resize rehashes): a
    /// reader whose probe overlapped no move can trust a miss without
    /// re-reading every line it probed.
    moves_begun: AtomicU64,
    moves_done: AtomicU64,
    stripes: Stripes,
    counts: [Counter; 3],
    ticks: Counter,
    /// Set by `close`: writes are refused from then on.
    closed: AtomicBool,
    /// Removes per thread: every 128th checks whether to shrink.
    removes: Counter,
    bl_first: AtomicBool,
    logs: SlotSet,
    min_top: u64,
    expansions: AtomicU64,
    /// Buckets the clean open's count read (0: no scan at this open).
    clean_scan_buckets: AtomicU64,
    shrinks: AtomicU64,
    /// Expansions and shrinks (each with its rehash of the interim level),
    /// and the time spent in them from closing the writers' gate
    /// (`Stats::structural_*`).
    structural: engine::StructuralClock,
    moves: AtomicU64,
    b2t_moves: AtomicU64,
    logfree_updates: AtomicU64,
    logged_updates: AtomicU64,
    max_lf_bits: AtomicU64,
    /// Threads that rehash a large interim level together (the writers the
    /// engine was configured for, at most 8).
    rehash_threads: usize,
    /// Rehashes that more than one thread shared.
    parallel_rehashes: AtomicU64,
    /// Lowest load factor at which an insertion failed (f64 bits; MAX = none yet).
    min_lf_bits: AtomicU64,
}

fn corrupt(m: String) -> Error {
    Error::Corrupt(m)
}

impl Level {
    fn new_handle(
        pool: Arc<Pool>,
        root: u64,
        seeds: (u64, u64),
        min_top: u64,
        threads: usize,
    ) -> Level {
        let lock = LineLock::new(pool.header_state().opens);
        Level {
            pool,
            root,
            seeds,
            lock,
            gate: WriterGate::new(),
            geo_ver: AtomicU64::new(0),
            geo: Default::default(),
            moves_begun: AtomicU64::new(0),
            moves_done: AtomicU64::new(0),
            stripes: Stripes::new(4096.max(threads * 256)),
            counts: Default::default(),
            ticks: Counter::default(),
            closed: AtomicBool::new(false),
            removes: Counter::default(),
            bl_first: AtomicBool::new(false),
            logs: SlotSet::default(),
            min_top,
            expansions: AtomicU64::new(0),
            clean_scan_buckets: AtomicU64::new(0),
            shrinks: AtomicU64::new(0),
            structural: Default::default(),
            moves: AtomicU64::new(0),
            b2t_moves: AtomicU64::new(0),
            logfree_updates: AtomicU64::new(0),
            logged_updates: AtomicU64::new(0),
            max_lf_bits: AtomicU64::new(0),
            min_lf_bits: AtomicU64::new(f64::MAX.to_bits()),
            rehash_threads: threads.clamp(1, 8),
            parallel_rehashes: AtomicU64::new(0),
        }
    }

    /// Formats a fresh pool: a table whose top level holds
    /// `initial_capacity` keys at about 3/4 load.
    pub fn create(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Level> {
        if pool.root() != 0 {
            return Err(Error::InvalidArgument("pool already holds a table".into()));
        }
        // 1.5 N buckets × 6 slots = 9 N slots; size for 3/4 load.
        let want = cfg.initial_capacity.max(1).saturating_mul(4) / 3;
        let top_n = want.div_ceil(9).next_power_of_two().max(MIN_TOP);
        if top_n > MAX_BUCKETS {
            return Err(Error::OutOfSpace(format!(
                "a table for {} keys needs {top_n} top buckets, more than the {MAX_BUCKETS} a level can have",
                cfg.initial_capacity
            )));
        }
        let uuid = pool.identity().uuid;
        let seeds = (
            fmix(u64::from_le_bytes(uuid[..8].try_into().expect("8 bytes")) | 1),
            fmix(
                u64::from_le_bytes(uuid[8..].try_into().expect("8 bytes")) ^ 0x5851_f42d_4c95_7f2d,
            ),
        );
        // Reserve the root and both levels; link them all through the root.
        let root_r = pool.reserve(ROOT_BYTES, Link::RootPointer)?;
        let root = root_r.offset();
        // The levels are linked by the pool root naming this root block
        // (not by the selector, which is durable before the root is set).
        let top_r = match pool.reserve(level_alloc_bytes(top_n), Link::Root(root)) {
            Ok(r) => r,
            Err(e) => {
                pool.cancel(root_r);
                return Err(e.into());
            }
        };
        let bot_r = match pool.reserve(level_alloc_bytes(top_n / 2), Link::Root(root)) {
            Ok(r) => r,
            Err(e) => {
                pool.cancel(top_r);
                pool.cancel(root_r);
                return Err(e.into());
            }
        };
        for r in [&top_r, &bot_r] {
            pool.zero(r.offset(), r.size() as usize);
            pool.flush(r.offset(), r.size() as usize);
        }
        pool.zero(root, ROOT_BYTES as usize);
        pool.store_u64(root, ROOT_MAGIC);
        pool.store_u64(root + R_SEED1, seeds.0);
        pool.store_u64(root + R_SEED2, seeds.1);
        pool.store_u64(root + R_MIN_TOP, top_n);
        let rec = Record {
            seq: 1,
            top: Lvl {
                raw: top_r.offset(),
                n: top_n,
            },
            bot: Lvl {
                raw: bot_r.offset(),
                n: top_n / 2,
            },
            il: Lvl::default(),
            phase: Phase::Normal,
        };
        for (i, w) in rec.encode().iter().enumerate() {
            pool.store_u64(root + R_RECORDS + 64 + i as u64 * 8, *w);
        }
        pool.store_u64(root + R_SELECTOR, 1);
        // persist: levels, root contents and record 1 (selector = 1) in one
        // fence, then the pool root names the block; until that durable
        // switch every reservation above is unlinked and recovery frees it.
        pool.flush(root, ROOT_BYTES as usize);
        pool.fence();
        if let Err(e) = pool.set_root(root) {
            pool.cancel(bot_r);
            pool.cancel(top_r);
            pool.cancel(root_r);
            return Err(e.into());
        }
        pool.commit(root_r);
        pool.commit(top_r);
        pool.commit(bot_r);
        let lv = Level::new_handle(pool, root, seeds, top_n, cfg.threads);
        lv.publish(&Geo::from_record(&rec));
        Ok(lv)
    }

    /// Opens an existing pool: validates the root and geometry, applies the
    /// logs, finishes an interrupted resize and rebuilds the counters.
    pub fn open(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Level> {
        let root = pool.root();
        if root == 0 {
            return Err(corrupt("pool has no level-hashing root (root is 0)".into()));
        }
        if pool.block_size(root)? < ROOT_BYTES {
            return Err(corrupt(format!(
                "root block at {root:#x} is smaller than {ROOT_BYTES} bytes"
            )));
        }
        if pool.load_u64(root) != ROOT_MAGIC {
            return Err(corrupt(format!(
                "root block at {root:#x} has no level-hashing magic"
            )));
        }
        let seeds = (pool.load_u64(root + R_SEED1), pool.load_u64(root + R_SEED2));
        let selector = pool.load_u64(root + R_SELECTOR);
        let rec_off = root + R_RECORDS + (selector % 2) * 64;
        let mut w = [0u64; 8];
        for (i, x) in w.iter_mut().enumerate() {
            *x = pool.load_u64(rec_off + i as u64 * 8);
        }
        let rec = Record::decode(&w)
            .filter(|r| r.seq == selector)
            .ok_or_else(|| corrupt(format!("geometry record {selector} is missing or torn")))?;
        Self::validate_record(&pool, &rec)?;
        let min_top = pool.load_u64(root + R_MIN_TOP).max(MIN_TOP);
        let lv = Level::new_handle(pool, root, seeds, min_top, cfg.threads);
        let g = Geo::from_record(&rec);
        lv.replay_logs(&g)?;
        lv.publish(&g);
        if lv.pool.was_clean() && rec.phase == Phase::Normal {
            // A clean close recorded each level's count; the buckets must
            // still hold that many items (a page zeroed or overwritten
            // since would otherwise open with keys silently missing). A
            // writable open after a read-only one that passed this scan
            // under the same lock (`Pool::prechecked`) does not scan again.
            let recorded: [u64; 3] =
                std::array::from_fn(|i| lv.pool.load_u64(root + R_COUNTS + i as u64 * 8));
            let found = if lv.pool.prechecked() {
                recorded
            } else {
                let buckets: u64 = g.lv.iter().map(|l| l.n).sum();
                lv.clean_scan_buckets.store(buckets, Ordering::Relaxed);
                lv.scan_counts(&g)
            };
            for (i, c) in lv.counts.iter().enumerate() {
                let recorded = recorded[i];
                if recorded != found[i] {
                    return Err(corrupt(format!(
                        "clean pool records {recorded} items in level {i}, its buckets hold {}: {}",
                        found[i],
                        engine::damaged_after_close(&lv.pool)
                    )));
                }
                c.set(recorded as i64);
            }
        } else {
            let counts = lv.scan_counts(&g);
            for (c, n) in lv.counts.iter().zip(counts) {
                c.set(n as i64);
            }
        }
        lv.bl_first.store(
            lv.counts[BOT].get() > lv.counts[TOP].get(),
            Ordering::Relaxed,
        );
        if rec.phase != Phase::Normal {
            let _w = lv.gate.close();
            match lv.finish_resize(&g, false, None) {
                // A rehash that finds no slot leaves the resize in progress:
                // every key stays reachable (searches probe the interim
                // level) and the table opens; inserts report the lack of room.
                Ok(()) | Err(Error::OutOfSpace(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(lv)
    }

    fn validate_record(pool: &Pool, r: &Record) -> Result<()> {
        let check = |name: &str, l: &Lvl| -> Result<()> {
            if !l.present() {
                return Ok(());
            }
            if !l.n.is_power_of_two() || l.n > MAX_BUCKETS {
                return Err(corrupt(format!(
                    "{name} level has {} buckets, not a power of two",
                    l.n
                )));
            }
            let size = pool.block_size(l.raw)?;
            if size < level_alloc_bytes(l.n) {
                return Err(corrupt(format!(
                    "{name} level block of {size} bytes cannot hold {} buckets",
                    l.n
                )));
            }
            Ok(())
        };
        check("top", &r.top)?;
        check("bottom", &r.bot)?;
        check("interim", &r.il)?;
        let shape_ok = match r.phase {
            Phase::Normal => r.top.n >= 2 && r.bot.n * 2 == r.top.n && !r.il.present(),
            Phase::Expanding => r.bot.n * 2 == r.top.n && r.il.n * 2 == r.bot.n,
            Phase::Shrinking => r.bot.n * 2 == r.top.n && r.il.n == r.top.n * 2,
        };
        if !shape_ok {
            return Err(corrupt(format!(
                "geometry {r:?} has inconsistent level sizes"
            )));
        }
        Ok(())
    }

    // ----- geometry --------------------------------------------------------------

    fn publish(&self, g: &Geo) {
        self.geo_ver.fetch_add(1, Ordering::AcqRel);
        let vals = [
            g.seq,
            g.phase as u64,
            g.lv[0].raw,
            g.lv[0].n,
            g.lv[1].raw,
            g.lv[1].n,
            g.lv[2].raw,
            g.lv[2].n,
        ];
        for (a, v) in self.geo.iter().zip(vals) {
            a.store(v, Ordering::Relaxed);
        }
        self.geo_ver.fetch_add(1, Ordering::Release);
    }

    fn geo_fields(&self) -> Geo {
        let v: [u64; 8] = std::array::from_fn(|i| self.geo[i].load(Ordering::Relaxed));
        let phase = match v[1] {
            1 => Phase::Expanding,
            2 => Phase::Shrinking,
            _ => Phase::Normal,
        };
        Geo {
            seq: v[0],
            phase,
            lv: [
                Lvl { raw: v[2], n: v[3] },
                Lvl { raw: v[4], n: v[5] },
                Lvl { raw: v[6], n: v[7] },
            ],
        }
    }

    /// A consistent geometry snapshot for readers, with its version.
    #[inline]
    fn geo_read(&self) -> (u64, Geo) {
        loop {
            let v1 = self.geo_ver.load(Ordering::Acquire);
            if v1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let g = self.geo_fields();
            std::sync::atomic::fence(Ordering::Acquire);
            if self.geo_ver.load(Ordering::Relaxed) == v1 {
                return (v1, g);
            }
        }
    }

    #[inline]
    fn hashes(&self, key: u64) -> (u64, u64) {
        (
            fmix(key ^ self.seeds.0),
            fmix(key.rotate_left(32) ^ self.seeds.1),
        )
    }

    /// Probe order: the level holding more items first (dynamic search),
    /// then the other, then the interim level.
    #[inline]
    fn order(&self, g: &Geo) -> ([usize; 3], usize) {
        let first_two = if self.bl_first.load(Ordering::Relaxed) {
            [BOT, TOP]
        } else {
            [TOP, BOT]
        };
        let n = if g.lv[IL].present() { 3 } else { 2 };
        ([first_two[0], first_two[1], IL], n)
    }

    #[inline]
    fn cands(l: &Lvl, h: (u64, u64)) -> ([u64; 2], usize) {
        let m = l.n - 1;
        let (a, b) = (h.0 & m, h.1 & m);
        if a == b {
            ([a, a], 1)
        } else {
            ([a, b], 2)
        }
    }

    // ----- reading ---------------------------------------------------------------

    /// One optimistic read of a line, without data-dependent branches:
    /// the valid slots holding `key` (bit mask), the values, the version
    /// seen, and whether no writer held or changed the line meanwhile.
    #[inline(always)]
    fn scan_line(&self, line: u64, key: u64) -> Scan {
        let w = self.pool.words(line, 8);
        let v1 = w[W_LOCK].load(Ordering::Acquire);
        let hdr = w[W_HDR].load(Ordering::Relaxed);
        let keys = [
            w[2].load(Ordering::Relaxed),
            w[4].load(Ordering::Relaxed),
            w[6].load(Ordering::Relaxed),
        ];
        let vals = [
            w[3].load(Ordering::Relaxed),
            w[5].load(Ordering::Relaxed),
            w[7].load(Ordering::Relaxed),
        ];
        std::sync::atomic::fence(Ordering::Acquire);
        let v2 = w[W_LOCK].load(Ordering::Relaxed);
        let eq = (keys[0] == key) as u64
            | ((keys[1] == key) as u64) << 1
            | ((keys[2] == key) as u64) << 2;
        Scan {
            mask: hdr & eq & TOKEN_MASK,
            vals,
            ver: v1,
            ok: v1 == v2 && self.lock.is_free(v1),
        }
    }

    fn prefetch(&self, g: &Geo, h: (u64, u64)) {
        for l in &g.lv {
            if l.present() {
                let (c, n) = Self::cands(l, h);
                for &b in &c[..n] {
                    let off = l.bucket(b);
                    self.pool.prefetch(off);
                    self.pool.prefetch(off + LINE);
                }
            }
        }
    }

    /// Finds `key` with a validated search: a miss is returned only if no
    /// line probed changed while probing (a concurrent move re-probes).
    /// Levels are probed in the dynamic order, the interim level last (and
    /// only with `interim`); all candidate lines are prefetched first.
    fn locate(&self, key: u64, h: (u64, u64), interim: bool) -> (Option<(Loc, u64)>, Geo, u64) {
        'retry: loop {
            let (gv, g) = self.geo_read();
            self.prefetch(&g, h);
            let begun = self.moves_begun.load(Ordering::Acquire);
            let quiet = begun == self.moves_done.load(Ordering::Acquire);
            let (order, mut nlev) = self.order(&g);
            if !interim {
                nlev = nlev.min(2);
            }
            let mut seen = [(0u64, 0u64); 12];
            let mut ns = 0;
            for &li in &order[..nlev] {
                let l = g.lv[li];
                let (c, nc) = Self::cands(&l, h);
                let mut ok = true;
                let mut hit = None;
                for &b in &c[..nc] {
                    for line in [l.bucket(b), l.bucket(b) + LINE] {
                        let sc = self.scan_line(line, key);
                        ok &= sc.ok;
                        if sc.mask != 0 {
                            let slot = sc.mask.trailing_zeros() as usize;
                            hit = Some((
                                Loc {
                                    level: li,
                                    line,
                                    slot,
                                },
                                sc.vals[slot],
                            ));
                        }
                        seen[ns] = (line, sc.ver);
                        ns += 1;
                    }
                }
                if !ok {
                    std::hint::spin_loop();
                    continue 'retry;
                }
                if hit.is_some() {
                    if self.geo_ver.load(Ordering::Acquire) == gv {
                        return (hit, g, gv);
                    }
                    continue 'retry;
                }
            }
            std::sync::atomic::fence(Ordering::Acquire);
            // A miss stands if no move overlapped the probe (the common
            // case: one load), or else if no line probed has changed.
            let unchanged = (quiet && self.moves_begun.load(Ordering::Relaxed) == begun)
                || seen[..ns]
                    .iter()
                    .all(|&(line, ver)| self.pool.words(line, 1)[0].load(Ordering::Relaxed) == ver);
            if unchanged && self.geo_ver.load(Ordering::Acquire) == gv {
                return (None, g, gv);
            }
        }
    }

    /// The fast path of every search: fingerprints select the slots worth
    /// a key compare, and a miss is validated by one load (no move
    /// overlapped the probe) instead of re-reading every line. While a
    /// resize or a move is under way it falls back to
    /// [`locate`](Self::locate).
    fn find(&self, key: u64, h: (u64, u64), expect_hit: bool) -> (Option<(Loc, u64)>, u64) {
        let fp = fingerprint(h.0);
        loop {
            let gv = self.geo_ver.load(Ordering::Acquire);
            let begun = self.moves_begun.load(Ordering::Acquire);
            if gv & 1 == 1
                || begun != self.moves_done.load(Ordering::Acquire)
                || self.geo[7].load(Ordering::Relaxed) != 0
            {
                let (hit, _, gv) = self.locate(key, h, true);
                return (hit, gv);
            }
            let (tb, tm) = (
                level_base(self.geo[2].load(Ordering::Relaxed)),
                self.geo[3].load(Ordering::Relaxed).wrapping_sub(1),
            );
            let (bb, bm) = (
                level_base(self.geo[4].load(Ordering::Relaxed)),
                self.geo[5].load(Ordering::Relaxed).wrapping_sub(1),
            );
            // The fields belong together only if the geometry did not change
            // while they were read.
            std::sync::atomic::fence(Ordering::Acquire);
            if self.geo_ver.load(Ordering::Relaxed) != gv {
                continue;
            }
            let top = [tb + (h.0 & tm) * BUCKET, tb + (h.1 & tm) * BUCKET];
            let bot = [bb + (h.0 & bm) * BUCKET, bb + (h.1 & bm) * BUCKET];
            let ((first, fl), (second, sl)) = if self.bl_first.load(Ordering::Relaxed) {
                ((bot, BOT), (top, TOP))
            } else {
                ((top, TOP), (bot, BOT))
            };
            // Expecting a hit, prefetch the level probed first only: the
            // other level's lines would compete with the hit's and with a
            // writer's flush. Expecting a miss, prefetch both.
            let fetch: &[u64] = if expect_hit {
                &first
            } else {
                &[first[0], first[1], second[0], second[1]]
            };
            for &b in fetch {
                self.pool.prefetch(b);
                self.pool.prefetch(b + LINE);
            }
            match self.probe_fast(first, fl, key, fp) {
                Probe::Hit(hit) if self.geo_ver.load(Ordering::Acquire) == gv => {
                    return (Some(hit), gv)
                }
                Probe::Miss => {}
                _ => continue,
            }
            match self.probe_fast(second, sl, key, fp) {
                Probe::Hit(hit) if self.geo_ver.load(Ordering::Acquire) == gv => {
                    return (Some(hit), gv)
                }
                Probe::Miss => {}
                _ => continue,
            }
            std::sync::atomic::fence(Ordering::Acquire);
            if self.moves_begun.load(Ordering::Relaxed) == begun
                && self.geo_ver.load(Ordering::Relaxed) == gv
            {
                return (None, gv);
            }
        }
    }

    /// Probes the two buckets of one level. A hit is validated by its
    /// line's version; a miss needs no per-line validation: every change
    /// that could hide a present key from a reader is a move (the caller
    /// checks) or publishes through the header word after the slot it
    /// names is written.
    #[inline(always)]
    fn probe_fast(&self, buckets: [u64; 2], level: usize, key: u64, fp: u64) -> Probe {
        for b in buckets {
            for line in [b, b + LINE] {
                let w = self.pool.words(line, 8);
                let v1 = w[W_LOCK].load(Ordering::Acquire);
                let hdr = w[W_HDR].load(Ordering::Acquire);
                if !self.lock.is_free(v1) {
                    // A writer holds the line until its change is durable:
                    // wait rather than act on what a crash could undo
                    // (CRASH-PATTERNS #6).
                    std::hint::spin_loop();
                    return Probe::Retry;
                }
                let mut c = fp_candidates(hdr, fp);
                let compared = c != 0;
                while c != 0 {
                    let slot = c.trailing_zeros() as usize;
                    if w[w_key(slot)].load(Ordering::Relaxed) == key {
                        let v = w[w_val(slot)].load(Ordering::Relaxed);
                        std::sync::atomic::fence(Ordering::Acquire);
                        let ok = w[W_LOCK].load(Ordering::Relaxed) == v1;
                        return if ok {
                            Probe::Hit((Loc { level, line, slot }, v))
                        } else {
                            Probe::Retry
                        };
                    }
                    c &= c - 1;
                }
                // A key compared against a slot that a writer reused since
                // the header was read (a log-free update moved the key to
                // another slot of this line, an insert took the old one)
                // would be a false miss: such a line must be unchanged.
                if compared {
                    std::sync::atomic::fence(Ordering::Acquire);
                    if w[W_LOCK].load(Ordering::Relaxed) != v1 {
                        return Probe::Retry;
                    }
                }
            }
        }
        Probe::Miss
    }

    // ----- writing ---------------------------------------------------------------

    /// Writes `key`/`value` into free `slot` of a locked line and makes it
    /// durable (`Fence::Now`), or leaves the flush to the caller
    /// (`Fence::Later`: a rehash, whose item stays valid in the interim
    /// level until the caller's flush and fence).
    fn fill_slot(
        &self,
        line: u64,
        w: &[AtomicU64],
        slot: usize,
        key: u64,
        value: u64,
        fence: Fence,
    ) {
        let hdr = w[W_HDR].load(Ordering::Relaxed);
        w[w_key(slot)].store(key, Ordering::Relaxed);
        w[w_val(slot)].store(value, Ordering::Relaxed);
        w[W_HDR].store(
            with_slot(hdr, slot, fingerprint(self.hashes(key).0)),
            Ordering::Release,
        );
        // persist: key, value, then the token, all in this one cache line.
        // x86 writes a line back whole, holding its stores in program order,
        // so the token is never durable without the item (CRASH-PATTERNS
        // #1): one flush and one fence per insert.
        match fence {
            Fence::Now => self.pool.persist_line(line),
            Fence::Later => {}
        }
    }

    /// Clears `slot`'s token of a locked line, durably.
    fn clear_slot(&self, line: u64, w: &[AtomicU64], slot: usize) {
        let hdr = w[W_HDR].load(Ordering::Relaxed);
        w[W_HDR].store(hdr & !(1 << slot), Ordering::Release);
        // persist: one 8-byte header store: failure-atomic.
        self.pool.persist_line(line);
    }

    fn bucket_free(&self, l: &Lvl, b: u64) -> u32 {
        let off = l.bucket(b);
        free_count(self.pool.load_u64(off + 8)) + free_count(self.pool.load_u64(off + LINE + 8))
    }

    /// Direct insert into the less-loaded of a level's candidate buckets.
    #[inline(always)]
    fn try_direct(
        &self,
        l: &Lvl,
        h: (u64, u64),
        key: u64,
        value: u64,
        fence: Fence,
    ) -> Option<u64> {
        let (c, nc) = Self::cands(l, h);
        loop {
            let (mut best, mut best_free) = (c[0], self.bucket_free(l, c[0]));
            if nc == 2 {
                let f = self.bucket_free(l, c[1]);
                if f > best_free {
                    (best, best_free) = (c[1], f);
                }
            }
            if best_free == 0 {
                return None;
            }
            if let Some(line) = self.fill_bucket(l, best, key, value, fence) {
                return Some(line);
            }
            // Another writer took the slots we saw free: look again.
        }
    }

    /// Writes `key`/`value` into the first free slot of bucket `b` of
    /// level `l`, under that line's lock (`fill_slot`'s persist order);
    /// the line written, `None` if the bucket has no free slot.
    #[inline(always)]
    fn fill_bucket(&self, l: &Lvl, b: u64, key: u64, value: u64, fence: Fence) -> Option<u64> {
        for line in [l.bucket(b), l.bucket(b) + LINE] {
            let w = self.pool.words(line, 8);
            if free_count(w[W_HDR].load(Ordering::Relaxed)) == 0 {
                continue;
            }
            let held = self.lock.acquire(&w[W_LOCK]);
            if let Some(s) = free_slot(w[W_HDR].load(Ordering::Relaxed)) {
                self.fill_slot(line, w, s, key, value, fence);
                self.lock.release(&w[W_LOCK], held);
                return Some(line);
            }
            self.lock.release(&w[W_LOCK], held);
        }
        None
    }

    /// Moves the item in (`src`, `slot`) to a free slot of bucket `dst_b` of
    /// level `dst`, then writes `key`/`value` into the freed slot. False if
    /// the item or the room is gone by the time both lines are locked.
    #[allow(clippy::too_many_arguments)]
    fn move_and_fill(
        &self,
        src: u64,
        slot: usize,
        item: u64,
        dst: &Lvl,
        dst_b: u64,
        key: u64,
        value: u64,
    ) -> bool {
        let dst_line = [dst.bucket(dst_b), dst.bucket(dst_b) + LINE]
            .into_iter()
            .find(|&d| free_count(self.pool.load_u64(d + 8)) > 0);
        let Some(dline) = dst_line else { return false };
        let sw = self.pool.words(src, 8);
        let dw = self.pool.words(dline, 8);
        let (first, second) = if src < dline { (sw, dw) } else { (dw, sw) };
        let held1 = self.lock.acquire(&first[W_LOCK]);
        let held2 = self.lock.acquire(&second[W_LOCK]);
        let shdr = sw[W_HDR].load(Ordering::Relaxed);
        let ok = shdr & (1 << slot) != 0 && sw[w_key(slot)].load(Ordering::Relaxed) == item;
        let dslot = free_slot(dw[W_HDR].load(Ordering::Relaxed));
        if let (true, Some(ds)) = (ok, dslot) {
            self.move_begin();
            let ival = sw[w_val(slot)].load(Ordering::Relaxed);
            let log = self.logs.claim();
            let rec = LogRecord {
                kind: LogKind::Move,
                src_line: src,
                src_slot: slot as u64,
                key: item,
                value: ival,
                dst_line: dline,
                dst_slot: ds as u64,
            };
            // persist: the move record before the destination copy, so that
            // a crash leaving both copies valid finds the record and clears
            // the source (CRASH-PATTERNS #3: no key twice).
            self.write_log(log, &rec);
            self.fill_slot(dline, dw, ds, item, ival, Fence::Now);
            self.clear_slot(src, sw, slot);
            self.clear_log(log);
            self.move_end();
            // persist: the moved item's old slot is free and durable; the new
            // key goes in with the usual one-line order.
            self.fill_slot(src, sw, slot, key, value, Fence::Now);
            self.lock.release(&second[W_LOCK], held2);
            self.lock.release(&first[W_LOCK], held1);
            self.moves.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        self.lock.release(&second[W_LOCK], held2);
        self.lock.release(&first[W_LOCK], held1);
        false
    }

    /// One-item movement: an item of a candidate bucket in `from` moves to
    /// one of its own buckets in `to` (same level: its alternative bucket;
    /// `to` = top from bottom: bottom-to-top), and `key` takes its slot.
    fn try_move(
        &self,
        from: &Lvl,
        to: &Lvl,
        same_level: bool,
        h: (u64, u64),
        key: u64,
        value: u64,
    ) -> bool {
        let (c, nc) = Self::cands(from, h);
        for &b in &c[..nc] {
            for line in [from.bucket(b), from.bucket(b) + LINE] {
                let w = self.pool.words(line, 8);
                let hdr = w[W_HDR].load(Ordering::Relaxed);
                for s in 0..SLOTS_PER_LINE {
                    if hdr & (1 << s) == 0 {
                        continue;
                    }
                    let item = w[w_key(s)].load(Ordering::Relaxed);
                    let ih = self.hashes(item);
                    let (ic, inc) = Self::cands(to, ih);
                    for &alt in &ic[..inc] {
                        if (same_level && alt == b) || self.bucket_free(to, alt) == 0 {
                            continue;
                        }
                        if self.move_and_fill(line, s, item, to, alt, key, value) {
                            return true;
                        }
                    }
                }
            }
        }
        false
    }

    /// Places a new key in the top two levels; the level it landed in.
    fn place(&self, g: &Geo, h: (u64, u64), key: u64, value: u64) -> Option<usize> {
        let (top, bot) = (&g.lv[TOP], &g.lv[BOT]);
        if self.try_direct(top, h, key, value, Fence::Now).is_some() {
            return Some(TOP);
        }
        if self.try_move(top, top, true, h, key, value) {
            return Some(TOP);
        }
        if self.try_direct(bot, h, key, value, Fence::Now).is_some() {
            return Some(BOT);
        }
        if self.try_move(bot, bot, true, h, key, value) {
            return Some(BOT);
        }
        if self.try_move(bot, top, false, h, key, value) {
            // The moved item went up, the new key took its bottom slot.
            self.b2t_moves.fetch_add(1, Ordering::Relaxed);
            self.counts[TOP].add(1);
            self.counts[BOT].add(-1);
            return Some(BOT);
        }
        None
    }

    /// Placement during a rehash: direct into the top level, then direct
    /// into the bottom level, and only then the full insert algorithm. The
    /// first two steps are what [`shrink_plan`](Self::shrink_plan)
    /// simulates (a shrink started by this handle follows the plan itself:
    /// [`place_planned`](Self::place_planned)).
    ///
    /// A direct placement is neither flushed nor fenced here: the level
    /// it went to and its line, which the rehash flushes and fences once
    /// for a batch of items, before it clears their interim tokens. The
    /// full algorithm's movements persist as they go (no line to flush).
    fn place_rehash(
        &self,
        g: &Geo,
        h: (u64, u64),
        key: u64,
        value: u64,
    ) -> Option<(usize, Option<u64>)> {
        if let Some(line) = self.try_direct(&g.lv[TOP], h, key, value, Fence::Later) {
            return Some((TOP, Some(line)));
        }
        if let Some(line) = self.try_direct(&g.lv[BOT], h, key, value, Fence::Later) {
            return Some((BOT, Some(line)));
        }
        self.place(g, h, key, value).map(|level| (level, None))
    }

    /// Whether every item of the top level would find a slot by direct
    /// placement in the shrunk table (the old bottom as top, a new empty
    /// bottom of N/4), simulated in DRAM on bucket counts. A shrink that
    /// could get stuck is not started (the paper gives no fallback for a
    /// failed rehash). `Some(plan)`: every item fits, and `plan[i]` names
    /// the bucket chosen for the item in slot `i` of the old top level
    /// (bucket × 6 + line × 3 + slot): bit 1 the level (0 top, 1 bottom),
    /// bit 0 the candidate. No bucket is chosen more often than it has
    /// free slots, so the rehash may place the items in any order, on any
    /// number of threads, and never runs out of room.
    fn shrink_plan(&self, g: &Geo) -> Option<Vec<u8>> {
        let (old, top) = (g.lv[TOP], g.lv[BOT]);
        let bot = Lvl {
            raw: 0,
            n: old.n / 4,
        };
        let mut top_free: Vec<u32> = (0..top.n).map(|b| self.bucket_free(&top, b)).collect();
        let mut bot_free: Vec<u32> = vec![SLOTS_PER_BUCKET as u32; bot.n as usize];
        let mut plan = vec![0u8; (old.n * SLOTS_PER_BUCKET) as usize];
        for b in 0..old.n {
            for (half, line) in [old.bucket(b), old.bucket(b) + LINE]
                .into_iter()
                .enumerate()
            {
                let w = self.pool.words(line, 8);
                let hdr = w[W_HDR].load(Ordering::Relaxed);
                for s in 0..SLOTS_PER_LINE {
                    if hdr & (1 << s) == 0 {
                        continue;
                    }
                    let h = self.hashes(w[w_key(s)].load(Ordering::Relaxed));
                    let mut placed = false;
                    for (li, (l, free)) in [(&top, &mut top_free), (&bot, &mut bot_free)]
                        .into_iter()
                        .enumerate()
                    {
                        let (c, nc) = Self::cands(l, h);
                        let mut pick = 0;
                        if nc == 2 && free[c[1] as usize] > free[c[0] as usize] {
                            pick = 1;
                        }
                        let best = c[pick] as usize;
                        if free[best] > 0 {
                            free[best] -= 1;
                            let i = b * SLOTS_PER_BUCKET + (half * SLOTS_PER_LINE + s) as u64;
                            plan[i as usize] = (li << 1 | pick) as u8;
                            placed = true;
                            break;
                        }
                    }
                    if !placed {
                        return None;
                    }
                }
            }
        }
        Some(plan)
    }

    /// Places an interim item in the bucket `code` names (see
    /// [`shrink_plan`](Self::shrink_plan)); the level it went to and the
    /// line to flush, like a rehash's direct placement. The plan guarantees a
    /// free slot; if none is found anyway the full algorithm places it.
    fn place_planned(
        &self,
        g: &Geo,
        code: u8,
        h: (u64, u64),
        key: u64,
        value: u64,
    ) -> Option<(usize, Option<u64>)> {
        let level = if code & 2 == 0 { TOP } else { BOT };
        let l = &g.lv[level];
        let (c, _) = Self::cands(l, h);
        let b = c[(code & 1) as usize];
        // persist: the copy (item before its token, `fill_slot`) is
        // flushed and fenced by `rehash_batch` before the batch clears any
        // interim token, because until that fence the interim copy is the
        // durable one.
        if let Some(line) = self.fill_bucket(l, b, key, value, Fence::Later) {
            return Some((level, Some(line)));
        }
        self.place_rehash(g, h, key, value)
    }

    /// Announces a move to readers (before any line changes).
    fn move_begin(&self) {
        self.moves_begun.fetch_add(1, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    /// The move is complete: its source is cleared.
    fn move_end(&self) {
        self.moves_done.fetch_add(1, Ordering::Release);
    }

    fn write_log(&self, slot: usize, rec: &LogRecord) {
        let off = self.root + R_LOGS + slot as u64 * 64;
        for (i, w) in rec.encode().iter().enumerate() {
            self.pool.store_u64(off + i as u64 * 8, *w);
        }
        self.pool.persist(off, 64);
    }

    fn clear_log(&self, slot: usize) {
        let off = self.root + R_LOGS + slot as u64 * 64;
        self.pool.store_u64(off, 0);
        // persist: flushed here, durable at the caller's next fence (every
        // caller fences before it returns).
        self.pool.flush(off, 8);
        self.logs.release(slot);
    }

    /// Counts this thread's writes to this engine; every 256th refreshes
    /// the dynamic search order. No shared cache line on the write path.
    fn tick(&self) -> u64 {
        let t = self.ticks.bump();
        if t.is_multiple_of(256) {
            self.bl_first.store(
                self.counts[BOT].get() > self.counts[TOP].get(),
                Ordering::Relaxed,
            );
        }
        t
    }

    fn slots(g: &Geo) -> u64 {
        g.lv.iter().map(|l| l.n).sum::<u64>() * SLOTS_PER_BUCKET
    }

    /// Finds `key` and locks its line, holding the writers' gate: `None` if
    /// absent. Updaters and removers need no key stripe: they meet at the
    /// line lock, and the loser finds the key gone or moved and looks again.
    fn lock_found(
        &self,
        key: u64,
        h: (u64, u64),
    ) -> Result<Option<(Loc, Held<'_>, engine::gate::Inside<'_>)>> {
        loop {
            // Look before taking the gate, so the misses overlap the previous
            // operation's persist; then check the geometry did not change.
            let (hit, gv) = self.find(key, h, true);
            let Some((loc, _)) = hit else { return Ok(None) };
            let gate = self.gate.enter();
            self.check_open()?;
            if self.geo_ver.load(Ordering::Acquire) != gv {
                continue;
            }
            if let Some(held) = self.lock_at(&loc, key) {
                return Ok(Some((loc, held, gate)));
            }
        }
    }

    /// Writes after `close` would change a pool already marked clean (whose
    /// counters the next open trusts): they are refused.
    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::InvalidArgument("the engine was closed".into()));
        }
        Ok(())
    }

    /// Locks the line of `loc` and checks that it still holds `key`; the
    /// words and the held lock word on success (line left locked).
    fn lock_at(&self, loc: &Loc, key: u64) -> Option<Held<'_>> {
        let w = self.pool.words(loc.line, 8);
        let held = self.lock.acquire(&w[W_LOCK]);
        let hdr = w[W_HDR].load(Ordering::Relaxed);
        if hdr & (1 << loc.slot) != 0 && w[w_key(loc.slot)].load(Ordering::Relaxed) == key {
            Some((w, held))
        } else {
            self.lock.release(&w[W_LOCK], held);
            None
        }
    }

    // ----- resizing --------------------------------------------------------------

    fn write_record(&self, r: &Record) {
        let off = self.root + R_RECORDS + (r.seq % 2) * 64;
        for (i, w) in r.encode().iter().enumerate() {
            self.pool.store_u64(off + i as u64 * 8, *w);
        }
        // persist: the whole record before the selector names it (CRASH-
        // PATTERNS #2: geometry changes with one 8-byte store).
        self.pool.persist(off, 64);
        self.pool.store_u64(self.root + R_SELECTOR, r.seq);
        self.pool.persist(self.root + R_SELECTOR, 8);
    }

    fn new_level(&self, n: u64, seq: u64) -> Result<pmem::Reservation> {
        let r = self.pool.reserve(
            level_alloc_bytes(n),
            Link::Word {
                owner: self.root + R_SELECTOR,
                value: seq,
            },
        )?;
        self.pool.zero(r.offset(), r.size() as usize);
        // persist: an empty level (all tokens 0) before a record names it.
        self.pool.flush(r.offset(), r.size() as usize);
        self.pool.fence();
        Ok(r)
    }

    /// Expands the table if its geometry is still `seen` (another writer may
    /// have done it already). Writers are excluded, readers are not.
    fn expand(&self, seen: u64) -> Result<()> {
        let start = std::time::Instant::now();
        let _w = self.gate.close();
        let g = self.geo_fields();
        if g.seq != seen {
            return Ok(());
        }
        if g.phase != Phase::Normal {
            return self.finish_resize(&g, false, None);
        }
        let len = self.counts.iter().map(|c| c.get()).sum::<i64>().max(0) as f64;
        let lf = len / Self::slots(&g) as f64;
        if lf > f64::from_bits(self.max_lf_bits.load(Ordering::Relaxed)) {
            self.max_lf_bits.store(lf.to_bits(), Ordering::Relaxed);
        }
        if lf < f64::from_bits(self.min_lf_bits.load(Ordering::Relaxed)) {
            self.min_lf_bits.store(lf.to_bits(), Ordering::Relaxed);
        }
        let top_n = g.lv[TOP].n * 2;
        if top_n > MAX_BUCKETS {
            return Err(Error::OutOfSpace(format!(
                "the top level cannot grow past {MAX_BUCKETS} buckets"
            )));
        }
        let r = self.new_level(top_n, g.seq + 1)?;
        let rec = Record {
            seq: g.seq + 1,
            top: Lvl {
                raw: r.offset(),
                n: top_n,
            },
            bot: g.lv[TOP],
            il: g.lv[BOT],
            phase: Phase::Expanding,
        };
        let (t, b) = (self.counts[TOP].get(), self.counts[BOT].get());
        self.expansions.fetch_add(1, Ordering::Relaxed);
        let done = self.start_resize(r, &rec, [0, t, b], None);
        if done.is_ok() {
            self.structural.record(start);
        }
        done
    }

    /// Shrinks the table if its geometry is still `seen` and it is still
    /// sparse enough.
    fn shrink(&self, seen: u64) -> Result<()> {
        let start = std::time::Instant::now();
        let _w = self.gate.close();
        let g = self.geo_fields();
        let len = self.counts.iter().map(|c| c.get()).sum::<i64>().max(0) as u64;
        if g.seq != seen
            || g.phase != Phase::Normal
            || g.lv[TOP].n / 2 < self.min_top
            || len * Self::shrink_divisor(&g) >= Self::slots(&g)
        {
            return Ok(());
        }
        let Some(plan) = self.shrink_plan(&g) else {
            return Ok(());
        };
        let bot_n = g.lv[TOP].n / 4;
        let r = self.new_level(bot_n, g.seq + 1)?;
        let rec = Record {
            seq: g.seq + 1,
            top: g.lv[BOT],
            bot: Lvl {
                raw: r.offset(),
                n: bot_n,
            },
            il: g.lv[TOP],
            phase: Phase::Shrinking,
        };
        let (t, b) = (self.counts[TOP].get(), self.counts[BOT].get());
        self.shrinks.fetch_add(1, Ordering::Relaxed);
        let done = self.start_resize(r, &rec, [b, 0, t], Some(&plan));
        if done.is_ok() {
            self.structural.record(start);
        }
        done
    }

    /// Makes `rec` (a resize with its new level reserved in `r`) current,
    /// relabels the per-level counts to `counts` (top, bottom, interim),
    /// publishes the geometry to readers, and rehashes the interim level.
    fn start_resize(
        &self,
        r: pmem::Reservation,
        rec: &Record,
        counts: [i64; 3],
        plan: Option<&[u8]>,
    ) -> Result<()> {
        self.write_record(rec);
        self.pool.commit(r);
        for (c, v) in self.counts.iter().zip(counts) {
            c.set(v);
        }
        let g = Geo::from_record(rec);
        self.publish(&g);
        self.finish_resize(&g, true, plan)
    }

    /// Rehashes every item left in the interim level into the top two
    /// levels, then drops the interim level. Callers hold the gate
    /// exclusively (or are `open`). `fresh`: the resize was started by
    /// this handle and nothing interrupted its rehash, so no interim item
    /// can have a copy in the top two levels yet and none is looked for.
    /// `plan`: a shrink's placements ([`shrink_plan`](Self::shrink_plan)),
    /// computed by this handle after it closed the gate.
    fn finish_resize(&self, g: &Geo, fresh: bool, plan: Option<&[u8]>) -> Result<()> {
        let il = g.lv[IL];
        let batches = il.n.div_ceil(REHASH_BATCH);
        // An expansion's rehash is shared, and so is a shrink's that follows
        // its plan (each item goes to the bucket the plan chose, which has
        // room whatever the order). A shrink resumed by `open` has no plan
        // and keeps to one thread.
        let shared = g.phase == Phase::Expanding || plan.is_some();
        let helpers = if shared && il.n >= PARALLEL_REHASH_BUCKETS {
            self.rehash_threads.min(batches as usize)
        } else {
            1
        };
        // Batches are claimed in order from one cursor, by this thread and
        // `helpers - 1` more (the writers the gate holds back would
        // otherwise wait idle). Each batch is rehashed by exactly one
        // thread and keeps its own persist order (`rehash_batch`); batches
        // share nothing but the line locks every writer takes.
        let next = AtomicU64::new(0);
        let stop = AtomicBool::new(false);
        let work = || -> Result<()> {
            while !stop.load(Ordering::Relaxed) {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= batches {
                    break;
                }
                let b = i * REHASH_BATCH;
                let done = self.rehash_batch(g, b..(b + REHASH_BATCH).min(il.n), fresh, plan);
                if done.is_err() {
                    stop.store(true, Ordering::Relaxed);
                    return done;
                }
            }
            Ok(())
        };
        if helpers > 1 {
            self.parallel_rehashes.fetch_add(1, Ordering::Relaxed);
            std::thread::scope(|sc| {
                // A helper's flushes and fences are charged to this
                // thread, whose operation they belong to (per-operation
                // persist counts stay whole).
                let others: Vec<_> = (1..helpers)
                    .map(|_| {
                        sc.spawn(|| {
                            let before = pmem::persist::counters();
                            let done = work();
                            (done, pmem::persist::counters().since(&before))
                        })
                    })
                    .collect();
                let mine = work();
                others
                    .into_iter()
                    .map(|t| {
                        let (done, spent) =
                            t.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
                        pmem::persist::add_counters(&spent);
                        done
                    })
                    .fold(mine, |a, b| a.and(b))
            })?;
        } else {
            work()?;
        }
        let ticket = self.pool.begin_free(
            il.raw,
            Link::Word {
                owner: self.root + R_SELECTOR,
                value: g.seq,
            },
        )?;
        let rec = Record {
            seq: g.seq + 1,
            top: g.lv[TOP],
            bot: g.lv[BOT],
            il: Lvl::default(),
            phase: Phase::Normal,
        };
        self.write_record(&rec);
        self.pool.finish_free(ticket);
        self.counts[IL].set(0);
        self.publish(&Geo::from_record(&rec));
        self.bl_first.store(
            self.counts[BOT].get() > self.counts[TOP].get(),
            Ordering::Relaxed,
        );
        Ok(())
    }

    /// Rehashes the items of interim buckets `range` with two fences for
    /// the batch instead of two per item.
    ///
    /// persist: every copy placed in the top two levels (flushed by its
    /// direct placement, or fenced by a movement) is made durable by one
    /// fence before any interim token of the batch is cleared; the cleared
    /// headers (one 8-byte store per line) are then flushed and fenced
    /// before the next batch starts. A crash in between leaves items valid
    /// in both places, which recovery's non-fresh rehash removes (the
    /// paper's I_first rule). Readers never act on a non-durable copy's
    /// absence or presence alone: until the fence the same item is valid
    /// and durable in the interim level, which readers probe too.
    fn rehash_batch(
        &self,
        g: &Geo,
        range: std::ops::Range<u64>,
        fresh: bool,
        plan: Option<&[u8]>,
    ) -> Result<()> {
        let il = g.lv[IL];
        let top = g.lv[TOP];
        let mut items = [(0u64, 0u64, 0u64, (0u64, 0u64)); BATCH_SLOTS];
        let mut n = 0;
        for b in range.clone() {
            for (half, line) in [il.bucket(b), il.bucket(b) + LINE].into_iter().enumerate() {
                let w = self.pool.words(line, 8);
                let hdr = w[W_HDR].load(Ordering::Relaxed);
                for s in 0..SLOTS_PER_LINE {
                    if hdr & (1 << s) == 0 {
                        continue;
                    }
                    let k = w[w_key(s)].load(Ordering::Relaxed);
                    let h = self.hashes(k);
                    // The top level's candidates are where a direct
                    // placement looks first: start loading them now.
                    let (c, nc) = Self::cands(&top, h);
                    for &tb in &c[..nc] {
                        self.pool.prefetch(top.bucket(tb));
                        self.pool.prefetch(top.bucket(tb) + LINE);
                    }
                    let slot_id =
                        ((b - range.start) * 2 + half as u64) * SLOTS_PER_LINE as u64 + s as u64;
                    items[n] = (slot_id, k, w[w_val(s)].load(Ordering::Relaxed), h);
                    n += 1;
                }
            }
        }
        if n == 0 {
            return Ok(());
        }
        self.move_begin();
        // Bit i: interim slot `slot_id` i is placed (or had a copy already).
        let mut done = [0u64; BATCH_SLOTS.div_ceil(64)];
        let mut failed = None;
        // The lines of the direct placements, flushed after the loop: a
        // line lock taken after a `clwb` would wait for its write-back.
        let mut flush = [0u64; BATCH_SLOTS];
        let mut nf = 0;
        for &(slot_id, k, v, h) in &items[..n] {
            // An item whose copy already sits in the top two levels was
            // being rehashed when a crash hit (the paper's I_first rule,
            // applied to every remaining item).
            if !fresh && self.locate(k, h, false).0.is_some() {
                done[slot_id as usize / 64] |= 1 << (slot_id % 64);
                continue;
            }
            let placed = match plan {
                Some(p) => {
                    let code = p[(range.start * SLOTS_PER_BUCKET + slot_id) as usize];
                    self.place_planned(g, code, h, k, v)
                }
                None => self.place_rehash(g, h, k, v),
            };
            match placed {
                Some((level, line)) => {
                    if let Some(line) = line {
                        flush[nf] = line;
                        nf += 1;
                    }
                    self.counts[level].add(1);
                    done[slot_id as usize / 64] |= 1 << (slot_id % 64);
                }
                None => {
                    failed = Some(k);
                    break;
                }
            }
        }
        // persist: the copies above (flushed here, or persisted by their
        // movements) before the interim tokens below.
        for &line in &flush[..nf] {
            self.pool.flush(line, LINE as usize);
        }
        self.pool.fence();
        // The interim lines to clear, each with its rehashed slots.
        let mut lines = [(0u64, 0u64, 0u64); 2 * REHASH_BATCH as usize];
        let mut nl = 0;
        for b in range.clone() {
            for (half, line) in [il.bucket(b), il.bucket(b) + LINE].into_iter().enumerate() {
                let base = ((b - range.start) * 2 + half as u64) * SLOTS_PER_LINE as u64;
                let mask = (0..SLOTS_PER_LINE as u64)
                    .filter(|s| done[((base + s) / 64) as usize] & (1 << ((base + s) % 64)) != 0)
                    .fold(0u64, |m, s| m | 1 << s);
                if mask != 0 {
                    lines[nl] = (line, mask, 0);
                    nl += 1;
                }
            }
        }
        // All the lines are locked (in address order) before the first
        // `clwb`: a locked instruction waits for every earlier `clwb`, so
        // locking each line after the previous line's flush would wait
        // for one write-back per line.
        for (line, _, held) in &mut lines[..nl] {
            *held = self.lock.acquire(&self.pool.words(*line, 1)[W_LOCK]);
        }
        let mut cleared = 0;
        for &(line, mask, _) in &lines[..nl] {
            let w = self.pool.words(line, 8);
            let hdr = w[W_HDR].load(Ordering::Relaxed);
            // persist: one 8-byte store clears the line's rehashed
            // tokens; flushed here, fenced once for the batch below.
            w[W_HDR].store(hdr & !mask, Ordering::Release);
            self.pool.flush(line, LINE as usize);
            cleared += mask.count_ones() as i64;
        }
        for &(line, _, held) in &lines[..nl] {
            self.lock.release(&self.pool.words(line, 1)[W_LOCK], held);
        }
        self.pool.fence();
        self.move_end();
        self.counts[IL].add(-cleared);
        match failed {
            None => Ok(()),
            Some(k) => Err(Error::OutOfSpace(format!(
                "rehash of key {k:#x} found no slot in the top two levels; the resize stays in progress and every key stays reachable"
            ))),
        }
    }

    // ----- recovery and verification --------------------------------------------

    /// Which level block holds `line`, if it is a line of one.
    fn line_ok(g: &Geo, line: u64, slot: u64) -> bool {
        slot < SLOTS_PER_LINE as u64
            && line.is_multiple_of(LINE)
            && g.lv
                .iter()
                .any(|l| l.present() && line >= l.base() && line < l.base() + l.n * BUCKET)
    }

    /// Applies the undo and move records a crash left behind.
    fn replay_logs(&self, g: &Geo) -> Result<()> {
        let mut touched = false;
        for i in 0..LOG_SLOTS {
            let off = self.root + R_LOGS + i as u64 * 64;
            let mut w = [0u64; 8];
            for (j, x) in w.iter_mut().enumerate() {
                *x = self.pool.load_u64(off + j as u64 * 8);
            }
            if w[0] == 0 {
                continue;
            }
            touched = true;
            let Some(rec) = LogRecord::decode(&w) else {
                self.pool.store_u64(off, 0);
                self.pool.flush(off, 8);
                continue;
            };
            if !Self::line_ok(g, rec.src_line, rec.src_slot)
                || (rec.kind == LogKind::Move && !Self::line_ok(g, rec.dst_line, rec.dst_slot))
            {
                return Err(corrupt(format!(
                    "log slot {i} names lines outside the table: {rec:?}"
                )));
            }
            let sw = self.pool.words(rec.src_line, 8);
            let s = rec.src_slot as usize;
            let src_holds = sw[W_HDR].load(Ordering::Relaxed) & (1 << s) != 0
                && sw[w_key(s)].load(Ordering::Relaxed) == rec.key;
            match rec.kind {
                LogKind::Update if src_holds => {
                    // persist: the old value back, before the log is cleared.
                    sw[w_val(s)].store(rec.value, Ordering::Relaxed);
                    self.pool.flush(rec.src_line, LINE as usize);
                }
                LogKind::Move if src_holds => {
                    let dw = self.pool.words(rec.dst_line, 8);
                    let d = rec.dst_slot as usize;
                    if dw[W_HDR].load(Ordering::Relaxed) & (1 << d) != 0
                        && dw[w_key(d)].load(Ordering::Relaxed) == rec.key
                    {
                        // Both copies valid: drop the source.
                        let hdr = sw[W_HDR].load(Ordering::Relaxed);
                        sw[W_HDR].store(hdr & !(1 << s), Ordering::Relaxed);
                        self.pool.flush(rec.src_line, LINE as usize);
                    }
                }
                _ => {}
            }
        }
        if touched {
            // persist: every repair before any log slot is cleared, so a
            // crash during recovery replays the same idempotent repairs.
            self.pool.fence();
            for i in 0..LOG_SLOTS {
                let off = self.root + R_LOGS + i as u64 * 64;
                if self.pool.load_u64(off) != 0 {
                    self.pool.store_u64(off, 0);
                    self.pool.flush(off, 8);
                }
            }
            self.pool.fence();
        }
        Ok(())
    }

    fn scan_counts(&self, g: &Geo) -> [u64; 3] {
        let mut out = [0u64; 3];
        for (li, l) in g.lv.iter().enumerate() {
            out[li] = engine::par_sum(l.n as usize, |b| {
                let off = l.bucket(b as u64);
                (self.pool.load_u64(off + 8) & TOKEN_MASK).count_ones() as u64
                    + (self.pool.load_u64(off + LINE + 8) & TOKEN_MASK).count_ones() as u64
            });
        }
        out
    }

    fn visit(&self, f: &mut dyn FnMut(usize, u64, u64, u64)) {
        let (_, g) = self.geo_read();
        for (li, l) in g.lv.iter().enumerate() {
            for b in 0..l.n {
                for line in [l.bucket(b), l.bucket(b) + LINE] {
                    let w = self.pool.words(line, 8);
                    let hdr = w[W_HDR].load(Ordering::Acquire);
                    for s in 0..SLOTS_PER_LINE {
                        if hdr & (1 << s) != 0 {
                            f(
                                li,
                                b,
                                w[w_key(s)].load(Ordering::Relaxed),
                                w[w_val(s)].load(Ordering::Relaxed),
                            );
                        }
                    }
                }
            }
        }
    }

    /// Items below 1/this of the slots make the table shrink.
    fn shrink_divisor(g: &Geo) -> u64 {
        if g.lv[TOP].n > SHRINK_LARGE_TOP {
            SHRINK_DIVISOR_LARGE
        } else {
            SHRINK_DIVISOR
        }
    }

    /// Every 128th remove of a thread: refresh the dynamic search order and
    /// shrink if the table became sparse.
    fn maybe_shrink(&self, t: u64) {
        if !t.is_multiple_of(128) {
            return;
        }
        self.bl_first.store(
            self.counts[BOT].get() > self.counts[TOP].get(),
            Ordering::Relaxed,
        );
        let g = self.geo_fields();
        let len = self.counts.iter().map(|c| c.get()).sum::<i64>().max(0) as u64;
        if g.phase == Phase::Normal
            && g.lv[TOP].n / 2 >= self.min_top
            && len * Self::shrink_divisor(&g) < Self::slots(&g)
        {
            // A failed shrink (out of space for the small new level) leaves
            // the table as it was; there is nothing to report to the caller
            // whose delete succeeded.
            let _ = self.shrink(g.seq);
        }
    }
}

impl Engine for Level {
    fn name(&self) -> &str {
        "level"
    }

    fn insert(&self, key: u64, value: u64) -> Result<bool> {
        let h = self.hashes(key);
        loop {
            // An optimistic look first, outside every lock, so its cache
            // misses overlap the previous operation's persist.
            if self.find(key, h, false).0.is_some() {
                return Ok(false);
            }
            let seq = {
                let _gate = self.gate.enter();
                self.check_open()?;
                let _stripe = self.stripes.lock(h.0);
                // Under the key's stripe the answer is final (lines are hot).
                if self.find(key, h, false).0.is_some() {
                    return Ok(false);
                }
                let g = self.geo_fields();
                // Normally no resize is in progress here (they finish behind
                // the closed gate); one that could not finish still takes
                // inserts into its top two levels.
                if let Some(level) = self.place(&g, h, key, value) {
                    self.counts[level].add(1);
                    self.tick();
                    return Ok(true);
                }
                g.seq
            };
            // Insertion failure (or a resize left in progress): resize, retry.
            self.expand(seq)?;
        }
    }

    fn get(&self, key: u64) -> Option<u64> {
        self.find(key, self.hashes(key), false).0.map(|(_, v)| v)
    }

    fn update(&self, key: u64, value: u64) -> Result<bool> {
        let h = self.hashes(key);
        {
            let Some((loc, (w, held), gate)) = self.lock_found(key, h)? else {
                return Ok(false);
            };
            let hdr = w[W_HDR].load(Ordering::Relaxed);
            if let Some(f) = free_slot(hdr) {
                // Opportunistic log-free update: the new item in a free slot
                // of the same line, then both tokens flipped by one store.
                w[w_key(f)].store(key, Ordering::Relaxed);
                w[w_val(f)].store(value, Ordering::Relaxed);
                w[W_HDR].store(
                    with_slot(hdr & !(1 << loc.slot), f, fingerprint(h.0)),
                    Ordering::Release,
                );
                // persist: new item and the token flip share the line and are
                // stored in that order: old or new item, never both or none.
                self.pool.persist_line(loc.line);
                self.logfree_updates.fetch_add(1, Ordering::Relaxed);
            } else {
                // Line full: undo-log the old value, update in place.
                let old = w[w_val(loc.slot)].load(Ordering::Relaxed);
                let log = self.logs.claim();
                let rec = LogRecord {
                    kind: LogKind::Update,
                    src_line: loc.line,
                    src_slot: loc.slot as u64,
                    key,
                    value: old,
                    dst_line: 0,
                    dst_slot: 0,
                };
                // persist: the undo record (fenced) before the in-place
                // write; then the write and the record's clearing share one
                // fence. A crash before that fence may leave either one
                // durable without the other: the value is then the old one
                // (undone, or never written) or the new one, and the call
                // had not returned, so both are allowed. Two fences, not
                // the three of write-clear-clear.
                self.write_log(log, &rec);
                w[w_val(loc.slot)].store(value, Ordering::Release);
                self.pool.flush(loc.line, LINE as usize);
                self.clear_log(log);
                self.pool.fence();
                self.logged_updates.fetch_add(1, Ordering::Relaxed);
            }
            self.lock.release(&w[W_LOCK], held);
            drop(gate);
        }
        Ok(true)
    }

    fn remove(&self, key: u64) -> Result<bool> {
        let h = self.hashes(key);
        let Some((loc, (w, held), gate)) = self.lock_found(key, h)? else {
            return Ok(false);
        };
        let hdr = w[W_HDR].load(Ordering::Relaxed);
        w[W_HDR].store(hdr & !(1 << loc.slot), Ordering::Release);
        // persist: one 8-byte header store clears the token: failure-atomic.
        // The line stays locked until it is durable, so no reader acts on a
        // delete a crash could undo (CRASH-PATTERNS #6).
        self.pool.persist_line(loc.line);
        // The release is a store computed from the held word: a load of
        // the line just written back would wait for a cache miss.
        self.lock.release(&w[W_LOCK], held);
        // The count changes inside the gate, so a resize never relabels
        // the levels between the delete and its count. Leaving the gate is
        // a plain store: nothing after the fence holds back the next
        // operation's loads.
        self.counts[loc.level].add(-1);
        let removes = self.removes.bump();
        drop(gate);
        self.maybe_shrink(removes);
        Ok(true)
    }

    fn len(&self) -> u64 {
        self.counts.iter().map(|c| c.get()).sum::<i64>().max(0) as u64
    }

    fn stats(&self) -> Stats {
        let (_, g) = self.geo_read();
        let len = self.len();
        let capacity = Self::slots(&g);
        let mut pm = ROOT_BYTES;
        for l in g.lv.iter().filter(|l| l.present()) {
            pm += self.pool.block_size(l.raw).unwrap_or(0);
        }
        let c = |a: &AtomicU64| a.load(Ordering::Relaxed).to_string();
        Stats {
            len,
            capacity,
            load_factor: len as f64 / capacity.max(1) as f64,
            pm_bytes: pm,
            dram_bytes: std::mem::size_of::<Self>() as u64 + self.stripes.bytes(),
            structural_changes: self.structural.changes(),
            structural_nanos: self.structural.nanos(),
            detail: vec![
                ("top buckets".into(), g.lv[TOP].n.to_string()),
                ("bottom buckets".into(), g.lv[BOT].n.to_string()),
                ("top items".into(), self.counts[TOP].get().to_string()),
                ("bottom items".into(), self.counts[BOT].get().to_string()),
                ("expansions".into(), c(&self.expansions)),
                (
                    "clean-open buckets read".into(),
                    c(&self.clean_scan_buckets),
                ),
                ("shrinks".into(), c(&self.shrinks)),
                ("parallel rehashes".into(), c(&self.parallel_rehashes)),
                ("movements".into(), c(&self.moves)),
                ("b2t movements".into(), c(&self.b2t_moves)),
                ("log-free updates".into(), c(&self.logfree_updates)),
                ("logged updates".into(), c(&self.logged_updates)),
                (
                    "max load factor".into(),
                    format!(
                        "{:.4}",
                        f64::from_bits(self.max_lf_bits.load(Ordering::Relaxed))
                    ),
                ),
                (
                    // The load at the worst insertion failure: the load the
                    // table is sure to reach before it expands.
                    "min load factor at expansion".into(),
                    match f64::from_bits(self.min_lf_bits.load(Ordering::Relaxed)) {
                        lf if lf <= 1.0 => format!("{lf:.4}"),
                        _ => "none".into(),
                    },
                ),
            ],
        }
    }

    fn for_each(&self, f: &mut dyn FnMut(u64, u64)) {
        self.visit(&mut |_, _, k, v| f(k, v));
    }

    fn check(&self) -> Result<CheckReport> {
        let (_, g) = self.geo_read();
        let mut seen = std::collections::HashSet::new();
        let mut bad = None;
        let mut per_level = [0u64; 3];
        self.visit(&mut |li, b, k, _| {
            let (c, nc) = Self::cands(&g.lv[li], self.hashes(k));
            if !c[..nc].contains(&b) && bad.is_none() {
                bad = Some(format!(
                    "key {k:#x} sits in bucket {b} of level {li}, not one of its candidates"
                ));
            }
            if !seen.insert(k) && bad.is_none() {
                bad = Some(format!("key {k:#x} is stored twice"));
            }
            per_level[li] += 1;
        });
        if let Some(m) = bad {
            return Err(corrupt(m));
        }
        for l in g.lv.iter().filter(|l| l.present()) {
            for b in 0..l.n {
                for line in [l.bucket(b), l.bucket(b) + LINE] {
                    let hdr = self.pool.load_u64(line + 8);
                    if hdr & !(TOKEN_MASK | FP_MASK) != 0 {
                        return Err(corrupt(format!("line {line:#x} has header {hdr:#x}")));
                    }
                    for s in 0..SLOTS_PER_LINE {
                        let k = self.pool.load_u64(line + 16 + 16 * s as u64);
                        if hdr & (1 << s) != 0
                            && fp_candidates(hdr, fingerprint(self.hashes(k).0)) & (1 << s) == 0
                        {
                            return Err(corrupt(format!(
                                "key {k:#x} in line {line:#x} has a wrong fingerprint"
                            )));
                        }
                    }
                }
            }
        }
        for (li, (&found, counter)) in per_level.iter().zip(&self.counts).enumerate() {
            if found as i64 != counter.get() {
                return Err(corrupt(format!(
                    "level {li} holds {found} items, its counter says {}",
                    counter.get()
                )));
            }
        }
        let mut reachable = self.pool.block_size(self.root)?;
        for l in g.lv.iter().filter(|l| l.present()) {
            reachable += self.pool.block_size(l.raw)?;
        }
        Ok(CheckReport {
            keys: seen.len() as u64,
            reachable_bytes: reachable,
        })
    }

    fn close(&self) -> Result<()> {
        let _w = self.gate.close();
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        for (i, c) in self.counts.iter().enumerate() {
            self.pool
                .store_u64(self.root + R_COUNTS + i as u64 * 8, c.get().max(0) as u64);
        }
        // persist: the counters before the clean flag that makes them trusted.
        self.pool.persist(self.root + R_COUNTS, 24);
        self.pool.close()?;
        Ok(())
    }
}
