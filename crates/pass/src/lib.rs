//! PASS (Peng, Xie, Siegel: *Persistent Spiral Storage*) on the pmhash
//! pool: spiral storage with growth factor 2 over a directory of segment
//! arrays, Dash-style 256-byte buckets, and the paper's fused mapping table
//! kept in PM one octave at a time. Design, persist orders and every
//! decision: `docs/engines/pass.md`; on-disk format: [`layout`].
//!
//! The files, as in every engine: `lib.rs` (the type, its spec, options
//! and tallies, create, the spiral state and the helpers every path
//! shares), [`layout`] (the bytes in the pool), `ops.rs` (the lookup path
//! from a hash to its segment; search, insert, update, delete with
//! optimistic readers and bucket locks), `split.rs` (expansion of the
//! leftmost segment, committed by one 8-byte store of `first`; publishing
//! a spiral state; new octave tables and directory arrays), `recover.rs`
//! (open in its numbered phases, crash recovery of stale copies,
//! duplicates and hints, `check`), `api.rs` (the `Engine` impl and byte
//! keys); and one concept each: `spiral.rs` (the address math, Algorithm 1
//! and the corrected Algorithm 2), [`table`] (one octave of the fused
//! mapping table), `mirror.rs` (the DRAM copy of the window's mapping
//! cells).

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use engine::sync::{Counter, LineLock};
use engine::{EngineConfig, EngineKind, EngineSpec, Error, Result};
use pmem::{Link, Pool};

mod api;
pub mod layout;
mod mirror;
mod ops;
mod recover;
mod spiral;
mod split;
pub mod table;

use layout::*;

/// Layout id written in the pool header (both key modes).
pub const LAYOUT: &str = "pass";
/// The longest key the bytes mode stores.
pub const MAX_KEY_BYTES: usize = 4096;
/// Default split load: expand `first` while the table holds more than this
/// fraction of its normal and stash slots.
pub const DEFAULT_SPLIT_LOAD: f64 = 0.7;
/// Split loads above this make lookups fetch the filter word with the
/// home bucket: at 0.7 a third of misses read it and the extra line costs
/// 1–4% of get throughput; at 1.05 four in five do, and it gains about 4%
/// (10M keys).
pub(crate) const DENSE_SPLIT_LOAD: f64 = 0.85;

/// A registry entry of this layout (every entry opens with [`Pass::open`]:
/// the options are in the pool).
fn entry(name: &'static str, about: &'static str, create: engine::CreateFn) -> EngineSpec {
    EngineSpec {
        reference: false,
        name,
        about,
        kind: EngineKind::Persistent {
            layout: LAYOUT,
            create,
            open: |pool, cfg| Ok(Box::new(Pass::open(pool, cfg)?)),
        },
    }
}

/// The registry entry: inline 8-byte keys.
pub fn spec() -> EngineSpec {
    entry(
        "pass",
        "PASS: persistent spiral storage, fused mapping table, Dash buckets (8-byte keys inline)",
        |pool, cfg| Ok(Box::new(Pass::create(pool, cfg)?)),
    )
}

/// The split load of the `pass-dense` registry entry: load factor about
/// 0.91 (the "max load factor ≥ 90%"), at the cost of overflow.
pub(crate) const DENSE_ENTRY_SPLIT_LOAD: f64 = 1.05;

/// The registry entry for a dense table: inline keys, split load
/// `DENSE_ENTRY_SPLIT_LOAD`.
pub fn spec_dense() -> EngineSpec {
    entry(
        "pass-dense",
        "PASS at split load 1.05 (load factor about 0.91; more stash and chain records)",
        |pool, cfg| {
            let opts = Options {
                split_load: DENSE_ENTRY_SPLIT_LOAD,
                ..Options::default()
            };
            Ok(Box::new(Pass::create_with(pool, cfg, &opts)?))
        },
    )
}

/// The engine name a table reports: by key mode and split load.
pub(crate) fn engine_name(bytes_keys: bool, split_load: f64) -> &'static str {
    match (bytes_keys, split_load > DENSE_SPLIT_LOAD) {
        (true, _) => "pass-var",
        (false, true) => "pass-dense",
        (false, false) => "pass",
    }
}

/// The registry entry for the paper's variable-length-key run: keys live
/// out of line behind a pointer + fingerprint slot; the u64 key `k` of the
/// [`engine::Engine`] API is stored as the 16 bytes [`wide_key`]`(k)`.
pub fn spec_var() -> EngineSpec {
    entry(
        "pass-var",
        "PASS with 16-byte keys stored out of line (pointer + fingerprint slots)",
        |pool, cfg| {
            let opts = Options {
                bytes_keys: true,
                ..Options::default()
            };
            Ok(Box::new(Pass::create_with(pool, cfg, &opts)?))
        },
    )
}

/// The 16-byte key a u64 key stands for in bytes mode: its little-endian
/// bytes, then those of its complement.
pub fn wide_key(k: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&k.to_le_bytes());
    b[8..].copy_from_slice(&(!k).to_le_bytes());
    b
}

/// Whether a byte key is the form of a u64 key ([`wide_key`]): the keys
/// the u64 `Engine` calls of a bytes-mode table count and visit.
pub(crate) fn is_wide(key: &[u8]) -> bool {
    key.len() == 16 && key[..8].iter().zip(&key[8..]).all(|(&a, &b)| b == !a)
}

/// Create-time choices beyond [`EngineConfig`].
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Normal buckets per segment (4..=1024). `None`: 56 (a 15 KiB
    /// segment), or 4 for an initial capacity under 1024 keys.
    pub normal_buckets: Option<u64>,
    /// Stash buckets per segment (1..=4). `None`: 4, or 2 with 4 normal.
    pub stash_buckets: Option<u64>,
    /// Cells per octave of the mapping table at create, as `k` (8..=24).
    /// `None`: the smallest that resolves the initial segments. It grows
    /// by itself; a larger start only skips those rebuilds.
    pub scalar_bits: Option<u32>,
    /// Split `first` while len exceeds this fraction of the normal and
    /// stash slots (0.3..=1.5; above 1 the overflow chains take the rest).
    pub split_load: f64,
    /// Keys are byte strings stored out of line (pointer + fingerprint).
    pub bytes_keys: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            normal_buckets: None,
            stash_buckets: None,
            scalar_bits: None,
            split_load: DEFAULT_SPLIT_LOAD,
            bytes_keys: false,
        }
    }
}

/// The live counters behind [`Tallies`] (what [`Pass::tallies`]
/// snapshots).
#[derive(Default)]
pub(crate) struct Counters {
    pub splits: AtomicU64,
    /// Splits (with the mapping-table octaves they build), and the time
    /// spent in them (`Stats::structural_*`).
    pub structural: engine::StructuralClock,
    pub split_failures: AtomicU64,
    pub moved: AtomicU64,
    pub displacements: AtomicU64,
    pub stash_inserts: AtomicU64,
    pub chain_inserts: AtomicU64,
    pub chain_buckets: AtomicU64,
    pub chain_freed: AtomicU64,
    pub octaves_built: AtomicU64,
    pub stale_removed: AtomicU64,
    pub duplicates_removed: AtomicU64,
    pub recovery_us: AtomicU64,
    /// Segments the clean open's cross-check walked (0 when a read-only
    /// open already ran it: `Pool::prechecked`).
    pub clean_walked: AtomicU64,
    pub max_lf_bits: AtomicU64,
}

/// A segment's bucket counts, printed `"{n} normal + {m} stash"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buckets {
    /// Normal buckets per segment.
    pub normal: u64,
    /// Stash buckets per segment.
    pub stash: u64,
}

impl engine::Figure for Buckets {
    fn show(&self) -> String {
        format!("{} normal + {} stash", self.normal, self.stash)
    }
    fn read(s: &str) -> Option<Self> {
        let (normal, stash) = s.strip_suffix(" stash")?.split_once(" normal + ")?;
        Some(Buckets {
            normal: normal.parse().ok()?,
            stash: stash.parse().ok()?,
        })
    }
}

/// How a table stores its keys, printed `inline` or `bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyMode {
    /// 8-byte keys stored inline as their hash.
    Inline,
    /// Keys stored out of line in key blocks.
    Bytes,
}

impl engine::Figure for KeyMode {
    fn show(&self) -> String {
        match self {
            KeyMode::Inline => "inline",
            KeyMode::Bytes => "bytes",
        }
        .to_string()
    }
    fn read(s: &str) -> Option<Self> {
        match s {
            "inline" => Some(KeyMode::Inline),
            "bytes" => Some(KeyMode::Bytes),
            _ => None,
        }
    }
}

engine::tallies! {
    /// A snapshot of what a PASS table holds and has done since it was
    /// opened ([`Pass::tallies`]); `Stats::detail` lists it.
    pub struct Tallies {
        /// Segments in use (the leftmost live bucket's index).
        segments: u64 => "segments",
        /// Bytes of one segment.
        segment_bytes: u64 => "segment bytes",
        /// Buckets of a segment.
        buckets: Buckets => "buckets",
        /// Cells per octave of the mapping table.
        table_cells_per_octave: engine::Pow2 => "table cells per octave",
        /// Bytes of the mapping table's octave blocks.
        table_bytes: u64 => "table bytes",
        /// `bytes` (keys out of line) or `inline`.
        key_mode: KeyMode => "key mode",
        /// Every stored key (in bytes mode, the ones not of a u64 key too).
        stored_keys: u64 => "stored keys",
        /// The load factor a split is made at.
        split_load: engine::Fixed<2> => "split load",
        /// Splits made.
        splits: u64 => "splits",
        /// Records splits moved to the new segment.
        moved: u64 => "records moved by splits",
        /// Splits that failed (the pool was full).
        split_failures: u64 => "split failures",
        /// Records displaced to their other bucket to make room.
        displacements: u64 => "displacements",
        /// Inserts that went to a stash bucket.
        stash_inserts: u64 => "stash inserts",
        /// Inserts that went to a chain bucket.
        chain_inserts: u64 => "chain inserts",
        /// Chain buckets in use.
        chain_buckets: u64 => "chain buckets",
        /// Chain buckets freed (emptied by splits or removes).
        chain_buckets_freed: u64 => "chain buckets freed",
        /// Mapping-table octaves built.
        octaves_built: u64 => "octaves built",
        /// Stale copies of moved records removed by recovery.
        stale_removed: u64 => "stale copies removed",
        /// Duplicate records removed by recovery.
        duplicates_removed: u64 => "duplicates removed",
        /// Microseconds the last open's recovery took.
        recovery_us: u64 => "recovery us",
        /// Segments the clean open's cross-check walked (0 when a
        /// read-only open already ran it: `Pool::prechecked`).
        clean_open_segments_walked: u64 => "clean-open segments walked",
        /// The highest load factor seen (by any `stats` or `tallies`).
        max_load_factor: engine::Fixed<4> => "max load factor",
    }
}

/// What readers and writers compute with (see [`Pass::snap`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Snap {
    pub v: u64,
    pub first: u64,
    pub cf: u64,
    pub k: u32,
    pub tables: [u64; 3],
}

/// Octaves a window of leftmost bucket `first` spans (fine positions
/// `S(first) .. S(first) + 2^40`).
pub(crate) fn window_octaves(first: u64) -> (u32, u32) {
    let cf = table::fine_log2(first);
    (
        (cf >> table::FINE) as u32,
        ((cf + (1 << table::FINE) - 1) >> table::FINE) as u32,
    )
}

/// Offset in the root of the slot of octave `o` at `2^k` cells: tables of
/// even and odd `k` keep separate slots, so growing `k` never frees a table
/// a reader may be using.
pub(crate) fn table_slot(o: u32, k: u32) -> u64 {
    R_TABLES + 8 * (3 * (k as u64 % 2) + (o % 3) as u64)
}

/// A key as the operations see it.
#[derive(Clone, Copy)]
pub(crate) enum Key<'a> {
    Word(u64),
    Bytes(&'a [u8]),
}

/// The PASS engine.
pub struct Pass {
    pub(crate) pool: Arc<Pool>,
    pub(crate) root: u64,
    pub(crate) geo: Geo,
    pub(crate) seed: u64,
    pub(crate) lock: LineLock,
    /// The spiral state readers compute with, under a version (odd while
    /// a split publishes): `first`, the window start `S(first)` in fine
    /// units, the table's `k` and its three octave blocks. Published only
    /// after `first` is durable.
    pub(crate) sv: AtomicU64,
    pub(crate) s_first: AtomicU64,
    pub(crate) s_cf: AtomicU64,
    pub(crate) s_k: AtomicU64,
    pub(crate) tables: [AtomicU64; 3],
    /// Segment arrays (DRAM copy of the root's directory).
    pub(crate) dir: Vec<AtomicU64>,
    /// The live window's mapping cells with their segments' offsets
    /// (DRAM; kept by `publish`, read by the 8-byte-key get).
    pub(crate) mirror: mirror::Mirror,
    /// Every stored key (the zero-hash key in the root included).
    pub(crate) len: Counter,
    /// Bytes mode: the stored keys that are not the form of a u64 key
    /// (see [`is_wide`]), which the u64 `Engine` view neither counts nor
    /// visits. Kept by `insert_bytes` and `remove_bytes`, recounted at
    /// open (DRAM only: a clean close records `len`, and the clean-open
    /// walk reads every key anyway).
    pub(crate) odd: Counter,
    /// Split when len exceeds this.
    pub(crate) threshold: AtomicU64,
    pub(crate) split_load: f64,
    pub(crate) split_mx: Mutex<()>,
    /// Serialises the zero-hash key (kept in the root).
    pub(crate) zero: Mutex<()>,
    pub(crate) closed: AtomicBool,
    pub(crate) name: &'static str,
    pub(crate) t: Counters,
}

/// The hash seed of a pool: derived from its uuid (and checked at open).
pub(crate) fn seed_of(pool: &Pool) -> u64 {
    pool.identity().seed()
}

pub(crate) fn corrupt(m: impl Into<String>) -> Error {
    Error::Corrupt(m.into())
}

pub(crate) use engine::hash::fmix64 as fmix;

impl Pass {
    /// Formats a fresh pool with default [`Options`].
    pub fn create(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Pass> {
        Self::create_with(pool, cfg, &Options::default())
    }

    /// Formats a fresh pool: `first` = enough segments for
    /// `initial_capacity` keys at the split load, the octave tables of that
    /// window, and the directory arrays that hold the segments.
    ///
    /// A crash during `create` leaves a root block with `first = 0`: open
    /// refuses it, and the next `create` gives its blocks back and starts
    /// over. A refused create gives back every block it took.
    pub fn create_with(pool: Arc<Pool>, cfg: &EngineConfig, opts: &Options) -> Result<Pass> {
        if pool.is_read_only() {
            return Err(Error::InvalidArgument("pool is read-only".into()));
        }
        if pool.root() != 0 {
            if !recover::interrupted_create(&pool) {
                return Err(Error::InvalidArgument("pool already holds a table".into()));
            }
            // A create cut by a crash: give its blocks back, then start over.
            recover::undo_create(&pool)?;
        }
        if !(0.3..=1.5).contains(&opts.split_load) {
            return Err(Error::InvalidArgument(format!(
                "split load {} outside 0.3..=1.5",
                opts.split_load
            )));
        }
        // Full-size segments from the default capacity (1024) up: a table
        // keeps its geometry as it grows, and small segments split ten
        // times as often.
        let small = cfg.initial_capacity < 1024;
        let n = opts.normal_buckets.unwrap_or(if small { 4 } else { 56 });
        let m = opts.stash_buckets.unwrap_or(if n <= 4 { 2 } else { 4 });
        let room = pool.max_size().max(pool.size());
        let geo = Geo::new(n, m, opts.bytes_keys);
        if !geo.valid() {
            return Err(Error::InvalidArgument(format!(
                "geometry {n} normal + {m} stash buckets (want 4..=1024 and 1..=4)"
            )));
        }
        let want = cfg.initial_capacity as f64 / (geo.seg_slots() as f64 * opts.split_load);
        let first = (want.ceil() as u64).clamp(1, max_first(MAX_K));
        if let Some(k) = opts.scalar_bits {
            if !(8..=MAX_K).contains(&k) {
                return Err(Error::InvalidArgument(format!(
                    "k = {k} outside 8..={MAX_K}"
                )));
            }
        }
        let k = table::cells_for(first).max(opts.scalar_bits.unwrap_or(0));
        if !(8..=MAX_K).contains(&k) {
            return Err(Error::InvalidArgument(format!(
                "k = {k} outside 8..={MAX_K}"
            )));
        }
        let need = first * geo.seg_bytes() + 3 * octave_bytes(k) + ROOT_BYTES;
        if need > room {
            return Err(Error::OutOfSpace(format!(
                "a table for {} keys needs {need} bytes, the pool can hold {room}",
                cfg.initial_capacity
            )));
        }
        let seed = seed_of(&pool);
        let root_r = pool.reserve(ROOT_BYTES, Link::RootPointer)?;
        let root = root_r.offset();
        pool.zero(root, ROOT_BYTES as usize);
        pool.store_u64(root, ROOT_MAGIC);
        pool.store_u64(root + R_GEO, geo.encode());
        pool.store_u64(root + R_SEED, seed);
        pool.store_u64(root + R_SPLIT_LOAD, opts.split_load.to_bits());
        pool.store_u64(root + R_K, k as u64);
        // `first` stays 0 ("under construction") until the end.
        // persist: the root block before the pool root names it; from then
        // on every block create takes is linked from it and committed, so a
        // crash leaves a root with first = 0 whose blocks the next create
        // (or a refused one, now) gives back: nothing leaks.
        pool.persist(root, ROOT_BYTES as usize);
        if let Err(e) = pool.set_root(root) {
            pool.cancel(root_r);
            return Err(e.into());
        }
        pool.commit(root_r);
        let built = (|| -> Result<()> {
            let (lo, hi) = window_octaves(first);
            for o in lo..=hi {
                Self::write_octave(&pool, root, o, k, 0)?;
            }
            let mut p = 0;
            while p < first {
                let (e, _) = dir_pos(p);
                let blk = Self::new_array(&pool, &geo, root, e)?;
                for i in 0..entry_segments(e).min(first - p) {
                    let seg = blk + i * geo.seg_bytes();
                    pool.store_u64(seg + H_LOGICAL, recover::logical_of(p + i, first));
                    pool.flush(seg, LINE as usize);
                }
                p = entry_first(e) + entry_segments(e);
            }
            pool.fence();
            Ok(())
        })();
        if let Err(e) = built {
            recover::undo_create(&pool)?;
            return Err(e);
        }
        // persist: every block (each persisted and linked) before `first`,
        // the store that makes the table exist.
        pool.store_u64(root + R_FIRST, first);
        pool.persist(root + R_FIRST, 8);
        let name = engine_name(opts.bytes_keys, opts.split_load);
        let ps = Pass::handle(pool, root, geo, seed, opts.split_load, name);
        ps.load_dram();
        Ok(ps)
    }

    /// Opens a table; runs crash recovery unless the pool was closed
    /// cleanly. A refused open writes nothing.
    pub fn open(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Pass> {
        recover::open(pool, cfg)
    }

    pub(crate) fn handle(
        pool: Arc<Pool>,
        root: u64,
        geo: Geo,
        seed: u64,
        split_load: f64,
        name: &'static str,
    ) -> Pass {
        let lock = LineLock::new(pool.header_state().opens);
        Pass {
            pool,
            root,
            geo,
            seed,
            lock,
            sv: AtomicU64::new(0),
            s_first: AtomicU64::new(0),
            s_cf: AtomicU64::new(0),
            s_k: AtomicU64::new(0),
            tables: Default::default(),
            dir: (0..DIR_ENTRIES).map(|_| AtomicU64::new(0)).collect(),
            mirror: mirror::Mirror::new(),
            len: Counter::default(),
            odd: Counter::default(),
            threshold: AtomicU64::new(0),
            split_load,
            split_mx: Mutex::new(()),
            zero: Mutex::new(()),
            closed: AtomicBool::new(false),
            name,
            t: Counters::default(),
        }
    }

    /// Loads the DRAM copies (state, tables, directory) from the root.
    pub(crate) fn load_dram(&self) {
        let first = self.pool.load_u64(self.root + R_FIRST);
        let k = self.pool.load_u64(self.root + R_K) as u32;
        let tables: [u64; 3] = std::array::from_fn(|s| {
            self.pool
                .load_u64(self.root + R_TABLES + 8 * (3 * (k as u64 % 2) + s as u64))
        });
        for (e, d) in self.dir.iter().enumerate() {
            d.store(
                self.pool.load_u64(self.root + R_DIR + 8 * e as u64),
                Ordering::Relaxed,
            );
        }
        self.publish(first, k, tables);
        self.set_threshold(first);
    }

    /// A snapshot of the spiral state; valid while `sv` still equals `v`.
    #[inline]
    pub(crate) fn snap(&self) -> Snap {
        loop {
            let v = self.sv.load(Ordering::Acquire);
            if v & 1 == 0 {
                let s = Snap {
                    v,
                    first: self.s_first.load(Ordering::Relaxed),
                    cf: self.s_cf.load(Ordering::Relaxed),
                    k: self.s_k.load(Ordering::Relaxed) as u32,
                    tables: std::array::from_fn(|i| self.tables[i].load(Ordering::Relaxed)),
                };
                std::sync::atomic::fence(Ordering::Acquire);
                if self.sv.load(Ordering::Relaxed) == v {
                    return s;
                }
            }
            std::hint::spin_loop();
        }
    }

    /// Whether no split published since `s` was taken.
    #[inline]
    pub(crate) fn still(&self, s: &Snap) -> bool {
        self.still_at(s.v)
    }

    /// Whether no split published since the spiral state's version was `v`.
    #[inline]
    pub(crate) fn still_at(&self, v: u64) -> bool {
        std::sync::atomic::fence(Ordering::Acquire);
        self.sv.load(Ordering::Relaxed) == v
    }

    pub(crate) fn set_threshold(&self, first: u64) {
        let slots = first * self.geo.seg_slots();
        self.threshold
            .store((slots as f64 * self.split_load) as u64, Ordering::Relaxed);
    }

    // ----- address computation ----------------------------------------------------

    #[inline]
    pub(crate) fn hash(&self, k: Key) -> u64 {
        match k {
            Key::Word(w) => fmix(w ^ self.seed),
            Key::Bytes(b) => self.hash_words(
                b.len() as u64,
                b.chunks(8).map(|c| {
                    let mut w = [0u8; 8];
                    w[..c.len()].copy_from_slice(c);
                    u64::from_le_bytes(w)
                }),
            ),
        }
    }

    /// The hash of a byte key given as its length and its little-endian
    /// words, zero-padded (as a key block stores it).
    #[inline]
    pub(crate) fn hash_words(&self, len: u64, words: impl Iterator<Item = u64>) -> u64 {
        let mut h = self.seed ^ len.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        for w in words {
            h = fmix(h ^ w).rotate_left(23);
        }
        fmix(h)
    }

    /// Fingerprint and home bucket: hash bits 0..24, independent of the
    /// spiral bits (the top 40), so a record that stays in its segment
    /// through a split keeps its place.
    #[inline]
    pub(crate) fn fp_bix(&self, h: u64) -> (u8, u64) {
        (h as u8, (((h >> 8) & 0xffff) * self.geo.n) >> 16)
    }

    #[inline]
    pub(crate) fn first(&self) -> u64 {
        self.snap().first
    }

    pub(crate) fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::InvalidArgument("the table was closed".into()));
        }
        Ok(())
    }

    /// Whether keys are byte strings (the table was created with
    /// `bytes_keys`).
    pub fn bytes_keys(&self) -> bool {
        self.geo.bytes_keys
    }

    /// The table's shape.
    pub fn geometry(&self) -> Geo {
        self.geo
    }

    /// Current leftmost logical segment (= number of physical segments).
    pub fn first_segment(&self) -> u64 {
        self.first()
    }
}

#[cfg(test)]
mod tests;
