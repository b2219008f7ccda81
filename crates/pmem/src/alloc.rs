//! The crash-safe allocator.
//!
//! # Protocol
//!
//! Every allocation and every free goes through a *lane*: a 64-byte record
//! in the metadata chunk naming the block, and the 8-byte *owner word* that
//! links the block into its structure together with the *value* that word
//! holds while the block is linked.
//!
//! ```text
//! reserve(size, link)  lane persisted → allocation bit set (not yet flushed)
//! ... caller fills the block, persists it, then stores link.value into link.owner and persists it
//! commit(r)            allocation bit persisted → lane cleared and persisted
//!
//! begin_free(off, link) lane persisted
//! ... caller unlinks (owner gets another value) and persists
//! finish_free(t)       bit cleared and persisted → lane cleared and persisted
//! ```
//!
//! Recovery applies one rule to every lane it finds: **the block is
//! allocated if and only if its owner word holds the lane's value.** A crash
//! between reserve and link frees the block; between link and commit keeps
//! it; between begin_free and the unlink keeps it; after the unlink frees it.
//! Nothing is leaked and nothing linked is ever freed.
//!
//! # Layout
//!
//! The pool is cut into 256 KiB chunks; chunk 0 holds the header and the
//! lanes. Every other chunk starts with an 8-byte *chunk word*:
//!
//! ```text
//! bits 0..4   kind: 0 free, 1 run, 2 extent
//! bits 4..8   size class (runs)
//! bits 8..40  chunk count (free and extent heads)
//! bits 40..64 check: 24 bits of a hash of bits 0..40 and the chunk index
//! ```
//!
//! An all-zero word is a free chunk (fresh or grown file space). A *run*
//! serves one size class (64 B .. 32 KiB): a bitmap after the first cache
//! line, then the slots. An *extent* is one block of whole chunks for larger
//! requests; its payload starts 64 bytes into its first chunk. Free space
//! is a walk of free heads; the DRAM free map is rebuilt by that walk.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::header::HEADER_LEN;
use crate::region::Region;

/// Growth of the space under the heap to at least the given size; returns
/// the new size. The pool's growth, which also records the size in its
/// header.
pub(crate) type Grow<'a> = &'a dyn Fn(u64) -> Result<u64>;

/// Allocation and recovery figures of a pool, for `inspect` and leak checks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Pool size in bytes.
    pub size: u64,
    /// Bytes in allocated blocks (usable sizes).
    pub bytes_in_use: u64,
    /// Allocated blocks.
    pub blocks_in_use: u64,
    /// Chunks not used by any run or extent.
    pub free_chunks: u64,
    /// Reservations and frees that recovery completed or rolled back at open.
    pub recovered_lanes: u64,
}
use crate::slots::SlotSet;

/// Allocation granule of the heap.
pub const CHUNK: u64 = 256 << 10;
/// Number of lanes: reservations and frees in flight at once.
pub(crate) const LANES: usize = 64;
/// Offset of lane 0 in the metadata chunk.
pub(crate) const LANE_OFFSET: u64 = HEADER_LEN as u64;
const LANE_LEN: u64 = 64;
/// Run size classes; larger requests get an extent.
pub const CLASSES: [u64; 10] = [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768];
const RUN_BITMAP_OFFSET: u64 = 64;

const KIND_FREE: u64 = 0;
const KIND_RUN: u64 = 1;
const KIND_EXTENT: u64 = 2;

const LANE_RESERVE: u64 = 1;
const LANE_FREE: u64 = 2;
const INFO_EXTENT: u64 = 1 << 63;
const OWNER_ROOT: u64 = u64::MAX;
const OWNER_NOTHING: u64 = u64::MAX - 1;
const OWNER_AUX: u64 = u64::MAX - 2;

/// Where a block is linked from. Recovery keeps a block whose reservation or
/// free was in flight if and only if the link holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    /// The 8-byte word at `owner` (8-aligned pool offset) holds `value`.
    Word {
        /// Pool offset of the owning word.
        owner: u64,
        /// The value the word holds when the link holds.
        value: u64,
    },
    /// The word at `owner` holds the block's own offset: a plain pointer.
    Pointer {
        /// Pool offset of the owning word.
        owner: u64,
    },
    /// The word at `owner` holds the block's offset with `tag` or'ed in (a
    /// tagged pointer; the tag uses bits the block's alignment leaves 0).
    Tagged {
        /// Pool offset of the owning word.
        owner: u64,
        /// The tag or'ed into the block's offset.
        tag: u64,
    },
    /// The pool header's root offset equals the value ([`Pool::set_root`](crate::Pool::set_root)).
    Root(u64),
    /// The pool header's root offset is the block itself.
    RootPointer,
    /// The pool header's auxiliary root offset is the block itself
    /// ([`Pool::set_aux_root`](crate::Pool::set_aux_root)).
    AuxRootPointer,
    /// Never linked: recovery always frees the block.
    Nothing,
}

impl Link {
    fn encode(self, block: u64) -> (u64, u64) {
        match self {
            Link::Word { owner, value } => (owner, value),
            Link::Pointer { owner } => (owner, block),
            Link::Tagged { owner, tag } => (owner, block | tag),
            Link::Root(v) => (OWNER_ROOT, v),
            Link::RootPointer => (OWNER_ROOT, block),
            Link::AuxRootPointer => (OWNER_AUX, block),
            Link::Nothing => (OWNER_NOTHING, 0),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Block {
    Slot { chunk: u64, class: usize, idx: u64 },
    Extent { chunk: u64, n: u64 },
}

/// A reserved block: fill it, link it, then [`Pool::commit`](crate::Pool::commit) (or
/// [`Pool::cancel`](crate::Pool::cancel) if it was never linked).
#[must_use = "a reservation must be committed or cancelled"]
#[derive(Debug)]
pub struct Reservation {
    off: u64,
    size: u64,
    lane: usize,
    block: Block,
    zeroed: bool,
}

impl Reservation {
    /// Offset of the block's first byte.
    pub fn offset(&self) -> u64 {
        self.off
    }
    /// Usable bytes (at least what was asked).
    pub fn size(&self) -> u64 {
        self.size
    }
    /// Whether every byte of the block reads zero: an extent taken wholly
    /// from chunks no block has used since this `Pool` was created or grew
    /// into them (above the heap's high-water mark). `false` for reused
    /// space, for run slots, and for everything a pool held when it was
    /// opened (the mark is not persisted; see `LargeState::fresh`).
    pub fn is_zeroed(&self) -> bool {
        self.zeroed
    }
}

/// A free in progress: unlink the block, then [`Pool::finish_free`](crate::Pool::finish_free).
#[must_use = "a free must be finished"]
#[derive(Debug)]
pub struct FreeTicket {
    off: u64,
    size: u64,
    lane: usize,
    block: Block,
}

impl FreeTicket {
    /// Offset of the block being freed.
    pub fn offset(&self) -> u64 {
        self.off
    }
}

struct Run {
    bits: Vec<u64>,
    free: u64,
}

#[derive(Default)]
struct ClassState {
    runs: HashMap<u64, Run>,
    /// Runs that may have a free slot (checked when popped).
    avail: Vec<u64>,
}

#[derive(Default)]
struct LargeState {
    free: BTreeMap<u64, u64>,
    total: u64,
    /// High-water mark: chunks at and above it have never been part of a
    /// run or an extent since the pool file was made, so they read zero
    /// except for the 8-byte free head `take_chunks` writes at the start
    /// of the remainder it leaves (always at the mark itself, where the
    /// next extent's header goes, never inside a payload). `Pool::create`
    /// sets it to 1 (a new file is zero); an open sets it to the pool's
    /// size, because a crash leaves no record of which free chunks were
    /// written, and growth adds chunks above it. Kept in DRAM only.
    fresh: u64,
}

pub(crate) struct Heap {
    large: Mutex<LargeState>,
    classes: Vec<Mutex<ClassState>>,
    lanes: SlotSet,
    in_use: AtomicU64,
    blocks: AtomicU64,
    recovered: AtomicU64,
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn chunk_word(kind: u64, class: u64, n: u64, chunk: u64) -> u64 {
    let low = kind | (class << 4) | (n << 8);
    let check = mix(low ^ chunk.wrapping_mul(0x9e37_79b9_7f4a_7c15)) & 0xff_ffff;
    low | (check << 40)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ChunkKind {
    Free(u64),
    Run(usize),
    Extent(u64),
}

fn parse_chunk_word(word: u64, chunk: u64) -> Option<ChunkKind> {
    if word == 0 {
        return Some(ChunkKind::Free(1));
    }
    let low = word & ((1 << 40) - 1);
    if chunk_word(low & 0xf, (low >> 4) & 0xf, low >> 8, chunk) != word {
        return None;
    }
    let (kind, class, n) = (low & 0xf, (low >> 4) & 0xf, low >> 8);
    match kind {
        KIND_FREE if n >= 1 && class == 0 => Some(ChunkKind::Free(n)),
        KIND_RUN if (class as usize) < CLASSES.len() && n == 0 => {
            Some(ChunkKind::Run(class as usize))
        }
        KIND_EXTENT if n >= 1 && class == 0 => Some(ChunkKind::Extent(n)),
        _ => None,
    }
}

/// Slots of a run of `class` and the byte offset of slot 0 in the chunk.
fn run_geometry(class: usize) -> (u64, u64) {
    let size = CLASSES[class];
    let mut n = (CHUNK - RUN_BITMAP_OFFSET) / size;
    loop {
        let bitmap = n.div_ceil(64) * 8;
        let first = RUN_BITMAP_OFFSET + bitmap.div_ceil(64) * 64;
        if first + n * size <= CHUNK {
            return (n, first);
        }
        n -= 1;
    }
}

fn class_of(size: u64) -> Option<usize> {
    CLASSES.iter().position(|&c| c >= size)
}

fn lane_off(lane: usize) -> u64 {
    LANE_OFFSET + lane as u64 * LANE_LEN
}

/// `Err(InvalidArgument)` unless recovery accepts the link's owner word (8-aligned,
/// past the header, inside the pool): a lane it rejects would make the pool
/// unopenable after a crash.
fn check_link(pool: &Region, link: Link) -> Result<()> {
    if let Link::Word { owner, .. } | Link::Pointer { owner } | Link::Tagged { owner, .. } = link {
        let in_pool = owner.checked_add(8).is_some_and(|end| end <= pool.size());
        if !owner.is_multiple_of(8) || owner < HEADER_LEN as u64 || !in_pool {
            return Err(Error::InvalidArgument(format!(
                "owner word {owner:#x} must be 8-aligned, past the header and inside the pool"
            )));
        }
    }
    Ok(())
}

struct LaneRecord {
    state: u64,
    block_off: u64,
    info: u64,
    owner: u64,
    value: u64,
}

impl LaneRecord {
    fn encode(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        for (i, w) in [
            self.state,
            self.block_off,
            self.info,
            self.owner,
            self.value,
        ]
        .iter()
        .enumerate()
        {
            b[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        let c = crc32fast::hash(&b[0..60]);
        b[60..64].copy_from_slice(&c.to_le_bytes());
        b
    }

    fn decode(b: &[u8; 64]) -> Option<LaneRecord> {
        let w = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        let state = w(0);
        if state == 0 {
            return None;
        }
        // A lane whose checksum fails was torn while being written: the
        // metadata change it announces had not started, so it is ignored.
        if u32::from_le_bytes(b[60..64].try_into().expect("4 bytes")) != crc32fast::hash(&b[0..60])
        {
            return None;
        }
        Some(LaneRecord {
            state,
            block_off: w(1),
            info: w(2),
            owner: w(3),
            value: w(4),
        })
    }
}

impl Heap {
    pub(crate) fn empty() -> Heap {
        Heap {
            large: Mutex::new(LargeState::default()),
            classes: (0..CLASSES.len())
                .map(|_| Mutex::new(ClassState::default()))
                .collect(),
            lanes: SlotSet::default(),
            in_use: AtomicU64::new(0),
            blocks: AtomicU64::new(0),
            recovered: AtomicU64::new(0),
        }
    }

    /// Walks every chunk (read-only) and rebuilds the DRAM state.
    pub(crate) fn rebuild(&self, pool: &Region) -> Result<()> {
        let total = pool.size() / CHUNK;
        let mut free = BTreeMap::new();
        let mut classes: Vec<ClassState> =
            (0..CLASSES.len()).map(|_| ClassState::default()).collect();
        let (mut in_use, mut blocks) = (0u64, 0u64);
        let mut last_free: Option<(u64, u64)> = None;
        let mut c = 1;
        while c < total {
            let word = pool.load_u64(c * CHUNK);
            let kind = parse_chunk_word(word, c).ok_or_else(|| {
                Error::Corrupt(format!("chunk {c}: invalid chunk word {word:#018x}"))
            })?;
            let n = match kind {
                ChunkKind::Free(n) | ChunkKind::Extent(n) if c + n > total => {
                    return Err(Error::Corrupt(format!(
                        "chunk {c}: {n} chunks run past the pool's {total}"
                    )));
                }
                ChunkKind::Free(n) => {
                    last_free = match last_free {
                        Some((s, m)) if s + m == c => Some((s, m + n)),
                        Some((s, m)) => {
                            free.insert(s, m);
                            Some((c, n))
                        }
                        None => Some((c, n)),
                    };
                    n
                }
                ChunkKind::Extent(n) => {
                    in_use += n * CHUNK - 64;
                    blocks += 1;
                    n
                }
                ChunkKind::Run(class) => {
                    let (nslots, _) = run_geometry(class);
                    let words = nslots.div_ceil(64);
                    let mut bits = Vec::with_capacity(words as usize);
                    for i in 0..words {
                        bits.push(pool.load_u64(c * CHUNK + RUN_BITMAP_OFFSET + i * 8));
                    }
                    let tail = nslots % 64;
                    if tail != 0 && bits[words as usize - 1] >> tail != 0 {
                        return Err(Error::Corrupt(format!(
                            "chunk {c}: run bitmap has bits past slot {nslots}"
                        )));
                    }
                    let used: u64 = bits.iter().map(|b| b.count_ones() as u64).sum();
                    in_use += used * CLASSES[class];
                    blocks += used;
                    let st = &mut classes[class];
                    if used < nslots {
                        st.avail.push(c);
                    }
                    st.runs.insert(
                        c,
                        Run {
                            bits,
                            free: nslots - used,
                        },
                    );
                    1
                }
            };
            c += n;
        }
        if let Some((s, m)) = last_free {
            free.insert(s, m);
        }
        // Everything the pool holds now may have been written: only space
        // taken from growth counts as fresh (`Pool::create` lowers it).
        *self.large.lock().expect("heap lock") = LargeState {
            free,
            total,
            fresh: total,
        };
        for (slot, st) in self.classes.iter().zip(classes) {
            *slot.lock().expect("class lock") = st;
        }
        self.in_use.store(in_use, Ordering::Relaxed);
        self.blocks.store(blocks, Ordering::Relaxed);
        Ok(())
    }

    /// Open-time recovery: validate the heap and every lane (reading only),
    /// then settle each in-flight reservation or free by the link rule.
    pub(crate) fn recover(&self, pool: &Region, root: u64, aux: u64) -> Result<()> {
        self.rebuild(pool)?;
        let total = pool.size() / CHUNK;
        let mut fixes = Vec::new();
        for lane in 0..LANES {
            let mut b = [0u8; 64];
            pool.read(lane_off(lane), &mut b);
            let Some(rec) = LaneRecord::decode(&b) else {
                continue;
            };
            let bad = |why: &str| Error::Corrupt(format!("allocator lane {lane}: {why}"));
            if rec.state != LANE_RESERVE && rec.state != LANE_FREE {
                return Err(bad(&format!("unknown state {}", rec.state)));
            }
            let block = self
                .block_at(pool, rec.block_off, total)
                .map_err(|e| bad(&e))?;
            let lane_block = if rec.info & INFO_EXTENT != 0 {
                match block {
                    // A reservation's head word may still say free: recovery rewrites it.
                    Block::Extent { chunk, .. } => Block::Extent {
                        chunk,
                        n: rec.info & !INFO_EXTENT,
                    },
                    Block::Slot { .. } => return Err(bad("extent lane points into a run")),
                }
            } else {
                match block {
                    Block::Slot { class, .. } if class as u64 == rec.info => block,
                    _ => return Err(bad("slot lane does not match its run")),
                }
            };
            if let Block::Extent { chunk, n } = lane_block {
                if n == 0 || chunk + n > total {
                    return Err(bad("extent length outside the pool"));
                }
            }
            let linked = match rec.owner {
                OWNER_ROOT => root == rec.value,
                OWNER_AUX => aux == rec.value,
                OWNER_NOTHING => false,
                o if o.is_multiple_of(8)
                    && o >= HEADER_LEN as u64
                    && o.checked_add(8).is_some_and(|end| end <= pool.size()) =>
                {
                    pool.load_u64(o) == rec.value
                }
                o => return Err(bad(&format!("owner offset {o:#x} is invalid"))),
            };
            fixes.push((lane, lane_block, linked));
        }
        if fixes.is_empty() {
            return Ok(());
        }
        // persist: every block's state before any lane is cleared, so a
        // crash during recovery finds the lanes again and redoes the same,
        // idempotent, fixes.
        for &(_, block, linked) in &fixes {
            self.set_block_state(pool, block, linked);
        }
        pool.fence();
        for &(lane, _, _) in &fixes {
            pool.store_u64(lane_off(lane), 0);
            pool.flush(lane_off(lane), 8);
        }
        pool.fence();
        self.recovered.store(fixes.len() as u64, Ordering::Relaxed);
        self.rebuild(pool)
    }

    /// Identifies the block at `off` from the chunk words (read-only).
    fn block_at(&self, pool: &Region, off: u64, total: u64) -> std::result::Result<Block, String> {
        let chunk = off / CHUNK;
        if chunk == 0 || chunk >= total {
            return Err(format!("offset {off:#x} is outside the heap"));
        }
        let word = pool.load_u64(chunk * CHUNK);
        match parse_chunk_word(word, chunk) {
            Some(ChunkKind::Run(class)) => {
                let (nslots, first) = run_geometry(class);
                let rel = off - chunk * CHUNK;
                let size = CLASSES[class];
                if rel < first
                    || !(rel - first).is_multiple_of(size)
                    || (rel - first) / size >= nslots
                {
                    return Err(format!("offset {off:#x} is not a slot of its run"));
                }
                Ok(Block::Slot {
                    chunk,
                    class,
                    idx: (rel - first) / size,
                })
            }
            Some(ChunkKind::Extent(n)) | Some(ChunkKind::Free(n)) if off == chunk * CHUNK + 64 => {
                Ok(Block::Extent { chunk, n })
            }
            _ => Err(format!("offset {off:#x} is not the start of a block")),
        }
    }

    /// Writes and flushes the allocation state of a block (no fence).
    fn set_block_state(&self, pool: &Region, block: Block, allocated: bool) {
        match block {
            Block::Slot { chunk, idx, .. } => {
                let w = chunk * CHUNK + RUN_BITMAP_OFFSET + (idx / 64) * 8;
                let bit = 1u64 << (idx % 64);
                if allocated {
                    pool.atomic_u64(w).fetch_or(bit, Ordering::AcqRel);
                } else {
                    pool.atomic_u64(w).fetch_and(!bit, Ordering::AcqRel);
                }
                pool.flush(w, 8);
            }
            Block::Extent { chunk, n } => {
                let kind = if allocated { KIND_EXTENT } else { KIND_FREE };
                pool.store_u64(chunk * CHUNK, chunk_word(kind, 0, n, chunk));
                pool.flush(chunk * CHUNK, 8);
            }
        }
    }

    fn acquire_lane(&self) -> usize {
        self.lanes.claim()
    }

    fn release_lane(&self, lane: usize) {
        self.lanes.release(lane);
    }

    fn write_lane(
        &self,
        pool: &Region,
        lane: usize,
        state: u64,
        block: Block,
        off: u64,
        link: Link,
    ) {
        let info = match block {
            Block::Slot { class, .. } => class as u64,
            Block::Extent { n, .. } => n | INFO_EXTENT,
        };
        let (owner, value) = link.encode(off);
        let rec = LaneRecord {
            state,
            block_off: off,
            info,
            owner,
            value,
        };
        pool.write(lane_off(lane), &rec.encode());
        pool.persist(lane_off(lane), 64);
    }

    fn clear_lane(&self, pool: &Region, lane: usize) {
        pool.store_u64(lane_off(lane), 0);
        pool.persist(lane_off(lane), 8);
        self.release_lane(lane);
    }

    /// Marks the heap of a just-created pool (a zero-filled file) as never
    /// used past its metadata chunk.
    pub(crate) fn mark_all_fresh(&self) {
        self.large.lock().expect("heap lock").fresh = 1;
    }

    /// Takes `n` contiguous free chunks, growing the pool if allowed. The
    /// caller holds the large lock. Persists the remainder's free header.
    /// Returns the first chunk and whether all `n` lay above the
    /// high-water mark (never used: they read zero past their chunk word).
    fn take_chunks(
        &self,
        pool: &Region,
        grow: Grow<'_>,
        large: &mut LargeState,
        n: u64,
    ) -> Result<(u64, bool)> {
        loop {
            if let Some((&start, &len)) = large.free.iter().find(|(_, &len)| len >= n) {
                large.free.remove(&start);
                let fresh = start >= large.fresh;
                large.fresh = large.fresh.max(start + n);
                if len > n {
                    let rest = start + n;
                    // persist: the remainder's free head before the taken
                    // chunks change, so every walk stays well-formed.
                    pool.store_u64(rest * CHUNK, chunk_word(KIND_FREE, 0, len - n, rest));
                    pool.persist(rest * CHUNK, 8);
                    large.free.insert(rest, len - n);
                }
                return Ok((start, fresh));
            }
            // A free range at the end of the pool joins the grown space.
            let tail = match large.free.iter().next_back() {
                Some((&s, &l)) if s + l == large.total => l,
                _ => 0,
            };
            let want = (large.total + n - tail) * CHUNK;
            let grown = grow(want).map_err(|e| match e {
                Error::OutOfSpace(m) => {
                    Error::OutOfSpace(format!("no {n} free chunk(s) of {CHUNK} bytes: {m}"))
                }
                other => other,
            })?;
            let new_total = grown / CHUNK;
            let old_total = large.total;
            // New chunks are zero (free); merge with a free tail in DRAM.
            let tail = large.free.iter().next_back().map(|(&s, &l)| (s, l));
            match tail {
                Some((s, l)) if s + l == old_total => {
                    large.free.insert(s, l + new_total - old_total);
                }
                _ => {
                    large.free.insert(old_total, new_total - old_total);
                }
            }
            large.total = new_total;
        }
    }

    fn give_back_chunks(large: &mut LargeState, start: u64, n: u64) {
        let (mut s, mut len) = (start, n);
        if let Some((&ps, &pl)) = large.free.range(..start).next_back() {
            if ps + pl == start {
                large.free.remove(&ps);
                s = ps;
                len += pl;
            }
        }
        if let Some(&nl) = large.free.get(&(start + n)) {
            large.free.remove(&(start + n));
            len += nl;
        }
        large.free.insert(s, len);
    }

    fn pick_slot(&self, pool: &Region, grow: Grow<'_>, class: usize) -> Result<Block> {
        let mut st = self.classes[class].lock().expect("class lock");
        while let Some(&chunk) = st.avail.last() {
            let Some(run) = st.runs.get_mut(&chunk) else {
                st.avail.pop();
                continue;
            };
            if run.free == 0 {
                st.avail.pop();
                continue;
            }
            let (w, word) = run
                .bits
                .iter()
                .enumerate()
                .find(|(_, &b)| b != u64::MAX)
                .expect("run has a free slot");
            let idx = w as u64 * 64 + (!word).trailing_zeros() as u64;
            run.bits[w] |= 1 << (idx % 64);
            run.free -= 1;
            if run.free == 0 {
                st.avail.pop();
            }
            return Ok(Block::Slot { chunk, class, idx });
        }
        // A new run: zero its bitmap, then make the chunk a run.
        let chunk = {
            let mut large = self.large.lock().expect("heap lock");
            self.take_chunks(pool, grow, &mut large, 1)?.0
        };
        let (nslots, first) = run_geometry(class);
        let base = chunk * CHUNK;
        pool.zero(
            base + RUN_BITMAP_OFFSET,
            (first - RUN_BITMAP_OFFSET) as usize,
        );
        // persist: a zero bitmap before the chunk word says "run", so a
        // recovered run never shows stale bits as allocations.
        pool.persist(
            base + RUN_BITMAP_OFFSET,
            (first - RUN_BITMAP_OFFSET) as usize,
        );
        pool.store_u64(base, chunk_word(KIND_RUN, class as u64, 0, chunk));
        pool.persist(base, 8);
        let mut bits = vec![0u64; nslots.div_ceil(64) as usize];
        bits[0] = 1;
        st.runs.insert(
            chunk,
            Run {
                bits,
                free: nslots - 1,
            },
        );
        if nslots > 1 {
            st.avail.push(chunk);
        }
        Ok(Block::Slot {
            chunk,
            class,
            idx: 0,
        })
    }

    fn block_off_size(block: Block) -> (u64, u64) {
        match block {
            Block::Slot { chunk, class, idx } => {
                let (_, first) = run_geometry(class);
                (chunk * CHUNK + first + idx * CLASSES[class], CLASSES[class])
            }
            Block::Extent { chunk, n } => (chunk * CHUNK + 64, n * CHUNK - 64),
        }
    }

    fn release_dram(&self, pool: &Region, block: Block) {
        match block {
            Block::Slot { chunk, class, idx } => {
                let mut st = self.classes[class].lock().expect("class lock");
                let run = st.runs.get_mut(&chunk).expect("slot of a known run");
                run.bits[(idx / 64) as usize] &= !(1 << (idx % 64));
                run.free += 1;
                let (nslots, _) = run_geometry(class);
                let empty = run.free == nslots;
                if run.free == 1 {
                    st.avail.push(chunk);
                }
                // An empty run goes back to the free chunks when its class
                // has another run with room, so space freed by one size
                // class serves the others; one empty run per class stays,
                // so alternating alloc/free does not convert chunks back and
                // forth.
                let other_room = st
                    .avail
                    .iter()
                    .any(|&c| c != chunk && st.runs.get(&c).is_some_and(|r| r.free > 0));
                if empty && other_room {
                    st.runs.remove(&chunk);
                    st.avail.retain(|&c| c != chunk);
                    // persist: every bit of this run is already durably
                    // clear (finish_free and cancel persist them), so one
                    // 8-byte chunk word turns the run into a free chunk.
                    pool.store_u64(chunk * CHUNK, chunk_word(KIND_FREE, 0, 1, chunk));
                    pool.persist(chunk * CHUNK, 8);
                    let mut large = self.large.lock().expect("heap lock");
                    Self::give_back_chunks(&mut large, chunk, 1);
                }
            }
            Block::Extent { chunk, n } => {
                let mut large = self.large.lock().expect("heap lock");
                Self::give_back_chunks(&mut large, chunk, n);
            }
        }
    }

    pub(crate) fn stats(&self, pool: &Region) -> PoolStats {
        PoolStats {
            size: pool.size(),
            bytes_in_use: self.in_use.load(Ordering::Relaxed),
            blocks_in_use: self.blocks.load(Ordering::Relaxed),
            free_chunks: self.large.lock().expect("heap lock").free.values().sum(),
            recovered_lanes: self.recovered.load(Ordering::Relaxed),
        }
    }
}

impl Heap {
    /// Reserves a block of at least `size` bytes that will be linked by
    /// `link`. Contents are unspecified (stale). `Err(OutOfSpace)` leaves
    /// the pool unchanged.
    pub(crate) fn reserve(
        &self,
        pool: &Region,
        grow: Grow<'_>,
        size: u64,
        link: Link,
    ) -> Result<Reservation> {
        if size == 0 {
            return Err(Error::InvalidArgument("cannot allocate 0 bytes".into()));
        }
        if pool.is_read_only() {
            return Err(Error::InvalidArgument("pool is read-only".into()));
        }
        if size > pool.max_size() {
            return Err(Error::OutOfSpace(format!(
                "{size} bytes exceed the pool's size limit of {}",
                pool.max_size()
            )));
        }
        check_link(pool, link)?;
        let lane = self.acquire_lane();
        let block = match class_of(size) {
            Some(class) => self.pick_slot(pool, grow, class).map(|b| (b, false)),
            None => {
                let n = (size + 64).div_ceil(CHUNK);
                let mut large = self.large.lock().expect("heap lock");
                self.take_chunks(pool, grow, &mut large, n)
                    .map(|(chunk, fresh)| (Block::Extent { chunk, n }, fresh))
            }
        };
        let (block, zeroed) = match block {
            Ok(b) => b,
            Err(e) => {
                self.release_lane(lane);
                return Err(e);
            }
        };
        let (off, usable) = Heap::block_off_size(block);
        // persist: the lane before the allocation state changes, because
        // recovery decides the block's fate from the lane alone.
        self.write_lane(pool, lane, LANE_RESERVE, block, off, link);
        match block {
            Block::Slot { chunk, idx, .. } => {
                let w = chunk * CHUNK + RUN_BITMAP_OFFSET + (idx / 64) * 8;
                pool.atomic_u64(w)
                    .fetch_or(1 << (idx % 64), Ordering::AcqRel);
            }
            Block::Extent { chunk, n } => {
                pool.store_u64(chunk * CHUNK, chunk_word(KIND_EXTENT, 0, n, chunk))
            }
        }
        self.in_use.fetch_add(usable, Ordering::Relaxed);
        self.blocks.fetch_add(1, Ordering::Relaxed);
        Ok(Reservation {
            off,
            size: usable,
            lane,
            block,
            zeroed,
        })
    }

    /// Commits a reservation whose link is durable: after this the block
    /// stays allocated whatever happens to the owner word.
    pub(crate) fn commit(&self, pool: &Region, r: Reservation) {
        // persist: the allocation state before the lane is cleared, because
        // without the lane the state alone says "allocated".
        self.set_block_state(pool, r.block, true);
        pool.fence();
        self.clear_lane(pool, r.lane);
    }

    /// Returns a reservation that was never linked.
    pub(crate) fn cancel(&self, pool: &Region, r: Reservation) {
        // persist: state before lane, as in commit; a crash in between is
        // settled by the lane (not linked → free).
        self.set_block_state(pool, r.block, false);
        pool.fence();
        self.clear_lane(pool, r.lane);
        self.in_use.fetch_sub(r.size, Ordering::Relaxed);
        self.blocks.fetch_sub(1, Ordering::Relaxed);
        self.release_dram(pool, r.block);
    }

    /// Starts freeing the allocated block at `off`, which `link` links while
    /// it is reachable. Unlink it and persist the unlink, then call
    /// [`finish_free`](Heap::finish_free).
    pub(crate) fn begin_free(&self, pool: &Region, off: u64, link: Link) -> Result<FreeTicket> {
        if pool.is_read_only() {
            return Err(Error::InvalidArgument("pool is read-only".into()));
        }
        check_link(pool, link)?;
        let total = pool.size() / CHUNK;
        let block = self
            .block_at(pool, off, total)
            .map_err(Error::InvalidArgument)?;
        let allocated = match block {
            Block::Slot { chunk, class, idx } => {
                let st = self.classes[class].lock().expect("class lock");
                st.runs
                    .get(&chunk)
                    .is_some_and(|r| r.bits[(idx / 64) as usize] & (1 << (idx % 64)) != 0)
            }
            Block::Extent { chunk, .. } => parse_chunk_word(pool.load_u64(chunk * CHUNK), chunk)
                .is_some_and(|k| matches!(k, ChunkKind::Extent(_))),
        };
        if !allocated {
            return Err(Error::InvalidArgument(format!(
                "block {off:#x} is not allocated"
            )));
        }
        let (_, size) = Heap::block_off_size(block);
        let lane = self.acquire_lane();
        // persist: the lane before the caller unlinks, so a crash after the
        // unlink finds the lane and frees the block.
        self.write_lane(pool, lane, LANE_FREE, block, off, link);
        Ok(FreeTicket {
            off,
            size,
            lane,
            block,
        })
    }

    /// Completes a free whose unlink is durable.
    pub(crate) fn finish_free(&self, pool: &Region, t: FreeTicket) {
        // persist: the cleared state before the lane is cleared.
        self.set_block_state(pool, t.block, false);
        pool.fence();
        self.clear_lane(pool, t.lane);
        self.in_use.fetch_sub(t.size, Ordering::Relaxed);
        self.blocks.fetch_sub(1, Ordering::Relaxed);
        self.release_dram(pool, t.block);
    }

    /// Abandons a free whose unlink never happened: the block stays
    /// allocated and the lane is released.
    pub(crate) fn cancel_free(&self, pool: &Region, t: FreeTicket) {
        self.clear_lane(pool, t.lane);
    }

    /// Frees a block that nothing links any more (durably).
    pub(crate) fn free(&self, pool: &Region, off: u64) -> Result<()> {
        let t = self.begin_free(pool, off, Link::Nothing)?;
        self.finish_free(pool, t);
        Ok(())
    }

    /// Usable size of the allocated block at `off`.
    /// `Err(Corrupt)` unless `off` is the start of an allocated block: an
    /// engine validating offsets read from PM learns that a pointer names
    /// free space.
    pub(crate) fn block_size(&self, pool: &Region, off: u64) -> Result<u64> {
        let block = self
            .block_at(pool, off, pool.size() / CHUNK)
            .map_err(Error::Corrupt)?;
        let allocated = match block {
            Block::Slot { chunk, idx, .. } => {
                let w = chunk * CHUNK + RUN_BITMAP_OFFSET + (idx / 64) * 8;
                pool.load_u64(w) & (1 << (idx % 64)) != 0
            }
            Block::Extent { chunk, .. } => matches!(
                parse_chunk_word(pool.load_u64(chunk * CHUNK), chunk),
                Some(ChunkKind::Extent(_))
            ),
        };
        if !allocated {
            return Err(Error::Corrupt(format!("block {off:#x} is not allocated")));
        }
        Ok(Heap::block_off_size(block).1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_words_round_trip_and_reject_noise() {
        for (k, class, n) in [(KIND_FREE, 0, 1), (KIND_RUN, 3, 0), (KIND_EXTENT, 0, 77)] {
            let w = chunk_word(k, class, n, 5);
            assert!(parse_chunk_word(w, 5).is_some());
            assert!(
                parse_chunk_word(w, 6).is_none(),
                "check binds the chunk index"
            );
            assert!(parse_chunk_word(w ^ (1 << 9), 5).is_none());
        }
        assert_eq!(parse_chunk_word(0, 9), Some(ChunkKind::Free(1)));
    }

    #[test]
    fn run_geometry_fits() {
        for (class, &size) in CLASSES.iter().enumerate() {
            let (n, first) = run_geometry(class);
            assert!(n >= 7, "class {class} has {n} slots");
            assert!(first.is_multiple_of(64) && first >= RUN_BITMAP_OFFSET + n.div_ceil(64) * 8);
            assert!(first + n * size <= CHUNK);
        }
    }

    #[test]
    fn run_geometry_matches_docs_format_md() {
        let documented = [
            (4087, 576),
            (2045, 320),
            (1023, 192),
            (511, 128),
            (255, 128),
            (127, 128),
            (63, 128),
            (31, 128),
            (15, 128),
            (7, 128),
        ];
        for (class, want) in documented.iter().enumerate() {
            assert_eq!(run_geometry(class), *want, "class {class}");
        }
    }
}
