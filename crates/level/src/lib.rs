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
//!
//! The code, one concern a file:
//!
//! - `ops`: lookup, insert, update, delete.
//! - `resize`: expansion and shrinking, with the interim level's rehash.
//! - `recover`: open (log replay, count check, an interrupted resize
//!   finished) and `check`.
//! - `api`: the [`Engine`](engine::Engine) implementation.
//! - `tallies`: the typed snapshot of the engine's figures ([`Tallies`]).
//! - `layout`: the bytes in the pool.

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use engine::gate::WriterGate;

use engine::{Engine, EngineConfig, EngineKind, EngineSpec, Error, Result};
use pmem::{Link, Pool};

mod api;
mod layout;
mod ops;
mod recover;
mod resize;
mod tallies;

pub use tallies::{Items, Tallies};

use engine::sync::{Counter, LineLock, Stripes};
use layout::*;
use pmem::SlotSet;

/// Layout id written in the pool header.
pub const LAYOUT: &str = "level";
/// Smallest top level, in buckets.
const MIN_TOP: u64 = 16;
/// Largest level, in buckets (2^50 × 128 bytes: beyond any pool).
const MAX_BUCKETS: u64 = 1 << 50;

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

/// Where a key was found.
#[derive(Clone, Copy, Debug)]
struct Loc {
    level: usize,
    line: u64,
    slot: usize,
}

#[inline]
fn fmix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
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

    fn slots(g: &Geo) -> u64 {
        g.lv.iter().map(|l| l.n).sum::<u64>() * SLOTS_PER_BUCKET
    }
}
