//! OP-HMEH (Zou et al., JSA 2022) on the pmhash pool: persistent
//! extendible hashing with a DRAM flat directory, a PM radix-tree
//! directory and cross-KV slots, with the paper's gaps closed. Design,
//! persist orders and every decision: `docs/engines/hmeh.md`.
//!
//! - Segments in PM (16 KiB by default: a header line, 239 buckets of
//!   four 16-byte cross-KV slots, a 16-bucket stash); a key lives in its
//!   home bucket, the next three, the stash, or (at the depth cap only) an
//!   overflow chain.
//! - FS-directory in DRAM (`dir`), doubled lazily; RT-directory in PM
//!   (`rt`), grown by one 8-byte switch; recovery rebuilds the first from
//!   the second.
//! - Writers take the segment's version lock; readers are optimistic and
//!   re-validate the version (and the free counter) on hits and misses.
//!
//! The files, as in every engine: `lib.rs` (the type, its spec, options
//! and counters, create, and the helpers every path shares), `tallies.rs`
//! (the typed snapshot of the counters that `stats()` lists), `layout.rs`
//! (the bytes in the pool), `ops.rs` (lookup, insert, update, delete),
//! `split.rs` (split, overflow, merge, backups), `recover.rs` (open in its
//! numbered phases, repair, check), `api.rs` (the `Engine` impl); and one
//! concept each: `dir.rs` (the FS-directory), `rt.rs` (the RT-directory),
//! `head.rs` (the DRAM segment headers), `hash.rs` (the key hash).

use std::collections::HashSet;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use engine::sync::{Counter, LineLock};
use engine::{
    CheckReport, Durability, Engine, EngineConfig, EngineKind, EngineSpec, Error, Result, Stats,
};
use pmem::{Link, Pool, Reservation};

mod api;
mod dir;
mod hash;
mod head;
mod layout;
mod ops;
mod recover;
mod rt;
mod split;
mod tallies;

use dir::{Dir, FsDir};
pub use hash::HashKind;
use hash::Hasher;
use head::*;
use layout::*;
pub use tallies::Tallies;

/// Layout id written in the pool header.
pub const LAYOUT: &str = "hmeh";
/// Default depth cap: a directory of at most 2^24 entries (128 MiB).
pub const DEFAULT_MAX_DEPTH: u32 = 24;

/// The registry entry.
pub fn spec() -> EngineSpec {
    EngineSpec {
        reference: false,
        name: "hmeh",
        about: "OP-HMEH: extendible hashing, DRAM flat + PM radix-tree directories, cross-KV slots",
        kind: EngineKind::Persistent {
            layout: LAYOUT,
            create: create_boxed,
            open: open_boxed,
        },
    }
}

fn create_boxed(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Box<dyn Engine>> {
    Ok(Box::new(Hmeh::create(pool, cfg)?))
}

fn open_boxed(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Box<dyn Engine>> {
    Ok(Box::new(Hmeh::open(pool, cfg)?))
}

/// Create-time choices beyond [`EngineConfig`].
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Segment size in bytes (a power of two, 1 KiB..32 KiB). `None`: 16 KiB,
    /// or smaller for an initial capacity under 1024 keys (the default capacity gets 16 KiB).
    pub segment_bytes: Option<u64>,
    /// Local depth cap (1..=32); a full segment at the cap chains overflow
    /// blocks instead of splitting.
    pub max_depth: u32,
    /// The key hash ([`HashKind::Mixed`] by default; kept in the root).
    pub hash: HashKind,
    /// Fill a segment through its stash and a long displacement search
    /// before it splits: the highest load factor before a split reaches
    /// 0.95 (the paper's Fig. 11), but a growing insert is about 2x slower
    /// and a grown table's misses read the stash. Off by default: a full
    /// window splits after a displacement search, and the stash is used
    /// only at the depth cap. Kept in the pool (the root's geometry word).
    pub stash_before_split: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            segment_bytes: None,
            max_depth: DEFAULT_MAX_DEPTH,
            hash: HashKind::Mixed,
            stash_before_split: false,
        }
    }
}

fn corrupt(m: String) -> Error {
    Error::Corrupt(m)
}

/// The live counters behind [`Tallies`] (DRAM only: they count what
/// this engine handle did since it was opened).
#[derive(Default)]
struct Counters {
    splits: AtomicU64,
    node_splits: AtomicU64,
    delayed_splits: AtomicU64,
    doublings: AtomicU64,
    merges: AtomicU64,
    merge_refusals: AtomicU64,
    overflow_blocks: AtomicU64,
    special_writes: AtomicU64,
    displacements: AtomicU64,
    inplace_updates: AtomicU64,
    line_updates: AtomicU64,
    cross_updates: AtomicU64,
    backups_made: AtomicU64,
    backups_merged: AtomicU64,
    duplicates_removed: AtomicU64,
    /// Slots the clean open's count read (0: no walk at this open).
    clean_walk_slots: AtomicU64,
    segments: AtomicU64,
    nodes: AtomicU64,
    max_lf_bits: AtomicU64,
    /// Lowest load factor at which a split was needed (f64 bits).
    min_split_lf_bits: AtomicU64,
    /// Splits (with any doublings they need), overflow blocks and merges,
    /// and the time spent in them (`Stats::structural_*`).
    structural: engine::StructuralClock,
}

/// A slot's two words and where it sits, as [`Hmeh::each_slot`] names
/// it: its normal bucket (`None` for stash and overflow slots) and whether
/// it is a stash slot.
#[derive(Clone, Copy)]
struct SlotAt {
    w0: u64,
    w1: u64,
    bucket: Option<u64>,
    stash: bool,
}

/// The OP-HMEH engine.
pub struct Hmeh {
    pool: Arc<Pool>,
    root: u64,
    rt_root: u64,
    geo: Geometry,
    hasher: Hasher,
    durability: Durability,
    lock: LineLock,
    dir: FsDir,
    /// Every segment's header words in DRAM (`head.rs`).
    heads: Heads,
    len: Counter,
    /// Bumped before any segment block is freed: an optimistic reader that
    /// sees it move retries (its segment may have been reused).
    frees: AtomicU64,
    zero: Mutex<()>,
    closed: AtomicBool,
    /// Recovery runs: splits are eager (no new backups).
    recovering: AtomicBool,
    /// RT nodes whose delayed-flush backup is live (relaxed durability);
    /// splits inside them may leave their new segment unflushed. Relaxed
    /// splits inside a node hold it shared until their commit point (so a
    /// `sync` cannot drop the backup that covers them in between); splits
    /// that make backups and `sync`, which drops them all, hold it
    /// exclusively. Lock order: segment lock, then this.
    backups: RwLock<HashSet<u64>>,
    t: Counters,
}

impl Hmeh {
    fn handle(
        pool: Arc<Pool>,
        root: u64,
        rt_root: u64,
        geo: Geometry,
        hasher: Hasher,
        durability: Durability,
        dir: FsDir,
    ) -> Hmeh {
        let lock = LineLock::new(pool.header_state().opens);
        let heads = Heads::new(geo.bytes(), pool.max_size().max(pool.size()));
        let t = Counters::default();
        t.min_split_lf_bits
            .store(f64::MAX.to_bits(), Ordering::Relaxed);
        Hmeh {
            pool,
            root,
            rt_root,
            geo,
            hasher,
            durability,
            lock,
            dir,
            heads,
            len: Counter::default(),
            frees: AtomicU64::new(0),
            zero: Mutex::new(()),
            closed: AtomicBool::new(false),
            recovering: AtomicBool::new(false),
            backups: RwLock::new(HashSet::new()),
            t,
        }
    }

    /// Formats a fresh pool with default [`Options`].
    pub fn create(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Hmeh> {
        Self::create_with(pool, cfg, &Options::default())
    }

    /// Formats a fresh pool: a complete tree of segments of equal depth,
    /// sized for `initial_capacity` keys at 3/4 load.
    ///
    /// A crash during `create` leaves a pool without a root (it was never
    /// created); blocks it had linked stay allocated in that file.
    pub fn create_with(pool: Arc<Pool>, cfg: &EngineConfig, opts: &Options) -> Result<Hmeh> {
        if pool.root() != 0 {
            return Err(Error::InvalidArgument("pool already holds a table".into()));
        }
        let lines = match opts.segment_bytes {
            Some(b) => {
                if b % LINE != 0 {
                    return Err(Error::InvalidArgument(format!(
                        "segment size {b} is not a multiple of 64"
                    )));
                }
                b / LINE
            }
            // Full-size segments from the default capacity (1024) up: a
            // table grown from the default keeps its segment size, and 8
            // KiB segments split twice as often and read slower. Smaller
            // ones only for tables sized under that (tests, the crash
            // checker).
            None if cfg.initial_capacity >= 1024 => 256,
            None => (cfg.initial_capacity / 8)
                .next_power_of_two()
                .clamp(16, 256),
        };
        let mut geo = Geometry::new(lines, opts.max_depth).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "segment of {} bytes / depth cap {} (want a power of two from {} to {} bytes, cap 1..=32)",
                lines * LINE,
                opts.max_depth,
                MIN_LINES * LINE,
                MAX_LINES * LINE
            ))
        })?;
        geo.stash_first = opts.stash_before_split;
        let want = (cfg.initial_capacity.max(1) as f64 / (geo.slots() as f64 * 0.75)).max(1.0);
        let d0 = (want.log2().ceil() as u32).clamp(1, geo.max_depth);
        // Refuse at once what cannot fit: 2^d0 segments and their nodes.
        let need = (1u64 << d0) * geo.bytes() + (1u64 << d0) / 4 * LINE;
        let room = pool.max_size().max(pool.size());
        if need > room {
            return Err(Error::OutOfSpace(format!(
                "a table for {} keys needs {need} bytes of segments, the pool can hold {room}",
                cfg.initial_capacity
            )));
        }
        let seed = pool.identity().seed();
        let hasher = Hasher {
            kind: opts.hash,
            seed,
        };
        let root_r = pool.reserve(ROOT_BYTES, Link::RootPointer)?;
        let root = root_r.offset();
        let rt_r = match pool.reserve(
            LINE,
            Link::Pointer {
                owner: root + R_RT_ROOT,
            },
        ) {
            Ok(r) => r,
            Err(e) => {
                pool.cancel(root_r);
                return Err(e.into());
            }
        };
        let rt_root = rt_r.offset();
        pool.zero(root, ROOT_BYTES as usize);
        pool.store_u64(root, ROOT_MAGIC);
        pool.store_u64(root + R_SEED, seed);
        pool.store_u64(root + R_HASH, opts.hash as u64);
        pool.store_u64(root + R_GEOMETRY, geo.encode());
        let mut segs = Vec::new();
        let mut committed = Vec::new();
        let built = Self::build_tree(&pool, &geo, rt_root, d0, &mut segs, &mut committed);
        if let Err(e) = built {
            // Nothing links these blocks durably (the pool has no root):
            // give every one back, so a refused create leaves the pool as
            // it found it.
            for &off in committed.iter().rev() {
                let _ = pool.free(off);
            }
            pool.cancel(rt_r);
            pool.cancel(root_r);
            return Err(e);
        }
        pool.store_u64(root + R_RT_ROOT, rt_root);
        // persist: the whole tree (each level durable and committed by
        // build_tree) and the root block before the pool root names the
        // root block: until then the table does not exist.
        pool.flush(root, ROOT_BYTES as usize);
        pool.flush(rt_root, LINE as usize);
        pool.fence();
        if let Err(e) = pool.set_root(root) {
            pool.cancel(rt_r);
            pool.cancel(root_r);
            return Err(e.into());
        }
        pool.commit(rt_r);
        pool.commit(root_r);
        let dir = FsDir::build(d0, |i| segs[i]);
        let hm = Hmeh::handle(pool, root, rt_root, geo, hasher, cfg.durability, dir);
        hm.t.segments.store(segs.len() as u64, Ordering::Relaxed);
        for &s in &segs {
            hm.load_head(s);
        }
        Ok(hm)
    }

    /// Fills node `rt_root` (already reserved) and everything below it with
    /// segments of local depth `d0`; `segs` gets them in prefix order.
    fn build_tree(
        pool: &Pool,
        geo: &Geometry,
        rt_root: u64,
        d0: u32,
        segs: &mut Vec<u64>,
        committed: &mut Vec<u64>,
    ) -> Result<()> {
        // Breadth first: (node, depth, prefix index of the node's first entry's parent).
        let mut queue = std::collections::VecDeque::from([(rt_root, NODE_BITS, 0u64)]);
        while let Some((node, depth, base)) = queue.pop_front() {
            let mut rs: Vec<Reservation> = Vec::new();
            let mut children = Vec::new();
            let mut entries = [0u64; 8];
            let fail = |rs: Vec<Reservation>, e: pmem::Error| -> Error {
                for r in rs {
                    pool.cancel(r);
                }
                e.into()
            };
            if d0 <= depth {
                let len = 1u64 << (depth - d0);
                for i in (0..NODE_FANOUT).step_by(len as usize) {
                    let r = match pool.reserve(
                        geo.bytes(),
                        Link::Pointer {
                            owner: node + i * 8,
                        },
                    ) {
                        Ok(r) => r,
                        Err(e) => return Err(fail(rs, e)),
                    };
                    let idx = ((base << NODE_BITS) | i) >> (depth - d0);
                    let id = Ident {
                        ld: d0,
                        prefix: ((idx << (32 - d0)) & 0xffff_ffff) as u32,
                    };
                    init_segment_pm(pool, geo, r.offset(), id, false);
                    pool.flush(r.offset(), geo.bytes() as usize);
                    for j in i..i + len {
                        entries[j as usize] = r.offset();
                    }
                    segs.push(r.offset());
                    rs.push(r);
                }
            } else {
                for i in 0..NODE_FANOUT {
                    let r = match pool.reserve(
                        LINE,
                        Link::Tagged {
                            owner: node + i * 8,
                            tag: 1,
                        },
                    ) {
                        Ok(r) => r,
                        Err(e) => return Err(fail(rs, e)),
                    };
                    pool.zero(r.offset(), LINE as usize);
                    entries[i as usize] = r.offset() | 1;
                    children.push((r.offset(), depth + NODE_BITS, (base << NODE_BITS) | i));
                    rs.push(r);
                }
            }
            for (i, e) in entries.iter().enumerate() {
                pool.store_u64(node + i as u64 * 8, *e);
            }
            // persist: the blocks below this node and its entries in one
            // fence, then the reservations commit (their owner words hold
            // them).
            pool.flush(node, LINE as usize);
            pool.fence();
            for r in rs {
                committed.push(r.offset());
                pool.commit(r);
            }
            queue.extend(children);
        }
        Ok(())
    }

    /// Opens an existing pool, repairing it after a crash.
    pub fn open(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Hmeh> {
        recover::open(pool, cfg)
    }

    /// The one key whose hash is 0 (kept in the root block, not in a
    /// segment): every u64 key works, this one included.
    pub fn zero_hash_key(&self) -> u64 {
        self.hasher.key(0)
    }

    /// Bytes per segment.
    pub fn segment_bytes(&self) -> u64 {
        self.geo.bytes()
    }

    /// Items that live in a stash, counted by a walk of every segment (a
    /// read of the whole table: for tests and `inspect`, not a hot path).
    pub fn stash_items(&self) -> Result<u64> {
        let mut n = 0;
        for (seg, id) in self.segments()? {
            self.each_slot(seg, &mut |line, s, bucket, stash| {
                let w = self.words(line);
                if stash
                    && self.valid(
                        id,
                        w[2 * s].load(Ordering::Relaxed),
                        w[2 * s + 1].load(Ordering::Relaxed),
                        bucket,
                    )
                {
                    n += 1;
                }
            });
        }
        Ok(n)
    }

    // ----- helpers ---------------------------------------------------------------

    #[inline]
    fn words(&self, off: u64) -> &[AtomicU64] {
        self.pool.words(off, 8)
    }

    /// Segment `seg`'s header words in DRAM (`head.rs`): lock, identity,
    /// count, spill and stash bits, retired flag, and copies of the chain
    /// pointers.
    #[inline]
    fn head(&self, seg: u64) -> &[AtomicU64; HEAD_WORDS] {
        self.heads.get(seg)
    }

    /// Fills segment `seg`'s head from its PM header (at open and create):
    /// lock free, not retired, no merge refused.
    pub(crate) fn load_head(&self, seg: u64) {
        let hw = self.head(seg);
        let pw = self.words(seg);
        for (h, w) in [
            (HD_IDENT, W_IDENT),
            (HD_COUNT, W_COUNT),
            (HD_STASH, W_STASH_BITS),
            (HD_BACKUP, W_BACKUP),
            (HD_OVERFLOW, W_OVERFLOW),
        ] {
            hw[h].store(pw[w].load(Ordering::Relaxed), Ordering::Relaxed);
        }
        Spill::expand(pw[W_SPILL].load(Ordering::Relaxed)).store(hw);
        hw[HD_RETIRED].store(0, Ordering::Relaxed);
        hw[HD_NO_MERGE].store(0, Ordering::Relaxed);
        hw[HD_LOCK].store(0, Ordering::Release);
    }

    /// Writes a persistent header word (identity, backup or overflow
    /// pointer) to PM and to the head. The caller persists the PM line.
    fn set_header(&self, seg: u64, w: usize, v: u64) {
        self.words(seg)[w].store(v, Ordering::Release);
        let h = match w {
            W_IDENT => HD_IDENT,
            W_BACKUP => HD_BACKUP,
            W_OVERFLOW => HD_OVERFLOW,
            _ => unreachable!("header word {w} is not persistent"),
        };
        self.head(seg)[h].store(v, Ordering::Release);
    }

    /// Segment `seg`'s DRAM-meaning words (count, stash and spill bits)
    /// written back to its PM header, where a clean open reads them. The
    /// caller flushes the line.
    fn store_head(&self, seg: u64) {
        let hw = self.head(seg);
        let pw = self.words(seg);
        for (h, w) in [(HD_COUNT, W_COUNT), (HD_STASH, W_STASH_BITS)] {
            pw[w].store(hw[h].load(Ordering::Relaxed), Ordering::Relaxed);
        }
        pw[W_SPILL].store(Spill::load(hw).fold(), Ordering::Relaxed);
    }

    /// Formats the block at `off` as an empty segment `id` (PM header and
    /// zeroed buckets, see [`init_segment_pm`]) and takes its head's lock:
    /// the caller holds it until the segment is published.
    ///
    /// The lock is taken, not stored: a writer that read this block's
    /// offset before it was freed may still be locking it (it then finds
    /// the directory no longer names the block and lets go), and the two
    /// must not both hold it. The head's old lock word is a segment's (same
    /// block size), so it is free or about to be.
    fn init_segment(&self, off: u64, id: Ident, nt: bool) {
        let hw = self.head(off);
        self.lock.lock(&hw[HD_LOCK]);
        fence(Ordering::Release);
        for (i, x) in hw.iter().enumerate().skip(1) {
            x.store(
                if i == HD_IDENT { id.encode() } else { 0 },
                Ordering::Relaxed,
            );
        }
        init_segment_pm(&self.pool, &self.geo, off, id, nt);
    }

    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::InvalidArgument("the table was closed".into()));
        }
        Ok(())
    }

    /// Whether writes persist before they return (always during recovery).
    #[inline]
    fn strict(&self) -> bool {
        self.durability == Durability::Strict || self.recovering.load(Ordering::Relaxed)
    }

    /// Whether a slot's words form an item valid at this position.
    #[inline]
    fn valid(&self, id: Ident, w0: u64, w1: u64, bucket: Option<u64>) -> bool {
        let h = (w0 >> 32) << 32 | w1 >> 32;
        h != 0
            && id.owns(h)
            && match bucket {
                Some(b) => self.geo.in_window(self.geo.home(h), b),
                None => true,
            }
    }

    /// Whether a slot is an item a lookup of its hash finds: valid at its
    /// position, and where the search looks (DECIDE 4 with the search's
    /// shortcut): its home bucket, a later bucket of its window only with
    /// the home's spill bit set in `spill`, the stash only with the home's
    /// stash bit set in `stash_bits`, or an overflow block. What
    /// `for_each` lists and what a clean open counts, so that an accepted
    /// open never lists a key its `get` cannot find. In a sound table
    /// every valid slot is listed (an insert sets the bit before it places
    /// the item; recovery recomputes the bits; `check` reports a valid
    /// slot without its bit).
    #[inline]
    fn listed(&self, id: Ident, at: SlotAt, spill: &Spill, stash_bits: u64) -> bool {
        let SlotAt {
            w0,
            w1,
            bucket,
            stash,
        } = at;
        if !self.valid(id, w0, w1, bucket) {
            return false;
        }
        let home = self.geo.home(decode_slot(w0, w1).0);
        match bucket {
            Some(b) => self.geo.dist(home, b) < spill.reach(home),
            None if stash => stash_bits & Geometry::spill_bit(home) != 0,
            None => true,
        }
    }

    /// A segment's spill and stash bits, as [`listed`](Self::listed) takes
    /// them.
    #[inline]
    fn search_bits(&self, seg: u64) -> (Spill, u64) {
        let hw = self.head(seg);
        (Spill::load(hw), hw[HD_STASH].load(Ordering::Relaxed))
    }
}

/// Writes a fresh segment's PM header (identity; every other word 0, the
/// lock word included: locks live in the heads) and zeroes its buckets.
/// With `nt`, the zeroes go out by non-temporal stores (durable at the next
/// fence without a flush). The caller flushes and orders.
fn init_segment_pm(pool: &Pool, geo: &Geometry, off: u64, id: Ident, nt: bool) {
    let w = pool.words(off, 8);
    for (i, x) in w.iter().enumerate() {
        x.store(
            if i == W_IDENT { id.encode() } else { 0 },
            Ordering::Relaxed,
        );
    }
    if nt {
        let zeros = vec![0u8; ((geo.lines - 1) * LINE) as usize];
        pool.write_nt(off + LINE, &zeros);
    } else {
        pool.zero(off + LINE, ((geo.lines - 1) * LINE) as usize);
    }
}

#[cfg(test)]
mod tests;
