//! A concurrent cuckoo filter in DRAM (Fan et al., CoNEXT'14) with the
//! parameters of the ROPHI paper: 12-bit fingerprints, buckets of four
//! slots, two candidate buckets per key, partial-key cuckoo hashing
//! over any bucket count `n`: `i1` from the hash by multiply-shift, and
//! `i2 = (h(fp) − i1) mod n`, an involution for every `n`, where the
//! paper's `i1 ⊕ hash(fp)` needs a power of two. So a filter can be sized
//! for its real load instead of rounding its memory up to the next power
//! of two (up to 2×).
//!
//! # Layout
//!
//! A bucket is one `AtomicU64` of four 16-bit lanes. The low 12 bits of a
//! lane hold a fingerprint, the high 4 bits are always zero, and a lane of
//! 0 is empty; a computed fingerprint of 0 is stored as 1, so fingerprints
//! are spread over `1..=4095`. One word per bucket lets a reader see a
//! whole bucket with a single load and lets a writer change one lane with a
//! single compare-and-swap.
//!
//! # Concurrency
//!
//! The paper specifies none; this is the contract:
//!
//! - Readers ([`CuckooFilter::contains`], [`CuckooFilter::contains_probe`])
//!   take no lock and never write. They never report a false negative for
//!   a key whose `insert` returned `Ok` (before the reader started) and
//!   whose `remove` has not been called, even while writers move
//!   fingerprints around with kick-outs. The same holds for every key
//!   with that key's fingerprint and bucket pair while the key's copy is
//!   held in a bucket (the exact stash matches whole hashes): kicks keep a
//!   copy in its pair, so on a filter nobody removes from, a reader that
//!   once saw a copy in a pair sees one there from then on (ROPHI relies
//!   on it: an insert that finds a copy in its key's pair adds none).
//! - [`CuckooFilter::insert`] into a free lane takes no lock: a
//!   compare-and-swap on one of the key's two buckets. Inserts that must
//!   kick, and changes of the exact stash, are serialised by one internal
//!   writer lock (a spinlock: a writer holds it for one or two cache
//!   misses, far less than a futex sleep and wake-up). A lock-free insert
//!   only ever turns a free lane into a used one, so the one thing it can
//!   do to a kick is take the free lane at the kick's end, before the
//!   kick's first store; that store is a compare-and-swap from zero, it
//!   fails, nothing has moved, and the kick searches again. (With every
//!   insert on the writer lock, ROPHI's inserts ran at 2.9 Mops/s at 1
//!   thread and 1.3 at 16 on 16 cores, `docs/bench/log.md`, "Scalability:
//!   1 to 16 threads".)
//! - [`CuckooFilter::remove`] takes no lock either while the stash is
//!   empty: a compare-and-swap turns one used lane holding the key's
//!   fingerprint into a free one. The count that matters is, for each
//!   fingerprint and bucket pair, copies against present keys: a remove
//!   takes one of each, and a kick copies a fingerprint forward before it
//!   overwrites the original, so copies never fall below keys. A kick
//!   moves the fingerprint its search read (not what the lane holds by
//!   then), and when a remove took a fingerprint off its path, the copy it
//!   had already made of it is taken out again (`kick`).
//! - The free-lane insert of bulk builds (`place_free`, see [`build`])
//!   takes no lock: it may run concurrently with itself and with readers,
//!   not with `insert` or `remove`.
//!
//! An insert whose two buckets are full takes the writer lock and searches
//! a cuckoo path *without moving anything*: a breadth-first search from both
//! candidate buckets, at most [`MAX_PATH`] moves long, never visiting a
//! bucket twice on one path, and exploring at most [`MAX_NODES`] buckets
//! (Fan et al.'s MaxKicks of 500). If no path ends in a free lane the
//! insert returns [`Full`] with nothing changed (or, below the growth
//! load, keeps the key in the exact stash). Otherwise the moves run
//! backward from the free end, each a single store that copies a
//! fingerprint into the lane its successor has just been copied out of; the
//! last store puts the new fingerprint into the lane the first moved
//! fingerprint left. So every fingerprint in transit is, for a moment, in
//! two places, never in none.
//!
//! That alone does not protect a reader: it loads bucket `i1` and then
//! `i2`, so a fingerprint moved from `i2` to `i1` between the two loads is
//! missed in both. A kick therefore makes the `moves` counter odd before its
//! first store and even again after its last (a seqlock). A reader that
//! found nothing re-reads `moves` after an acquire fence and retries if it
//! was odd or has changed; a reader that found the fingerprint returns at
//! once (a positive answer needs no validation: false positives are allowed
//! anyway). Plain inserts into a free lane and removals do not touch
//! `moves`: neither moves a fingerprint that someone may be looking for.
//!
//! # Sizing and false positives
//!
//! [`CuckooFilter::with_capacity`]`(n)` picks `ceil(n / (4 · SIZE_LOAD))`
//! buckets, so `n` keys fill it to a load of [`SIZE_LOAD`] (0.85); past
//! [`MAX_LOAD`] (0.9) the owner grows it by doubling (load 0.45). With the
//! paper's power-of-two sizing the load of `n` keys would fall anywhere in
//! 0.45..0.9 and the memory up to twice this; at 10M keys 32 MiB against
//! 23.5 MiB, which decides whether negative lookups hit the cache here
//! (`docs/bench/log.md`, "ROPHI", on the Intel host).
//! [`CuckooFilter::expected_fpr`] gives the false-positive rate of a lookup
//! at the current load: the lookup compares its fingerprint with the
//! occupied lanes of two buckets, `8 · load` of them on average, and each
//! matches with probability `1/4095`, so `1 − (1 − 1/4095)^(8·load)`
//! (≈ 0.00176 at load 0.9, ≈ 0.00098 at load 0.5). The ROPHI paper's Eq. 1
//! value of 0.00296 is another quantity: Fan et al.'s `(log2(1/ε) + 3)/α`
//! is the *amortised bits per stored item*, and solving it with 12 as if
//! 12 were bits per item (at α = 0.95) amounts to an 11.4-bit fingerprint.
//! With a real 12-bit fingerprint the bound is `8/2^12 ≈ 0.00195` at full
//! occupancy.

use std::marker::PhantomData;
use std::ops::Deref;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{fence, AtomicPtr, AtomicU64, Ordering};

use crate::gate::{Inside, WriterGate};
use crate::hash::fmix64;

/// Grow beyond this load (fraction of slots in use); doubling brings the
/// load to 0.45.
pub const MAX_LOAD: f64 = 0.9;

/// The load a filter made by [`CuckooFilter::with_capacity`] has when it
/// holds the keys it was sized for.
pub const SIZE_LOAD: f64 = 0.85;

/// Slots (lanes) per bucket.
pub const SLOTS: u64 = 4;
/// Bits of a lane; the fingerprint takes the low [`FP_BITS`].
const LANE_BITS: u32 = 16;
const LANE_MASK: u64 = (1 << LANE_BITS) - 1;
const FP_BITS: u32 = 12;
const FP_MASK: u64 = (1 << FP_BITS) - 1;
/// The low bit and the high bit of every lane (for word-parallel lane
/// comparisons).
const LANE_LO: u64 = 0x0001_0001_0001_0001;
const LANE_HI: u64 = 0x8000_8000_8000_8000;
/// Xored into a key before hashing, so the filter's hash bits are
/// independent of engines that hash with `fmix64(key)` (odd, arbitrary).
const FILTER_SEED: u64 = 0x6a09_e667_f3bc_c909;
/// Keys the exact stash holds (see [`CuckooFilter::insert`]).
pub const STASH: usize = 64;
/// Longest cuckoo path, in moves.
pub(crate) const MAX_PATH: usize = 5;
/// Most buckets one path search explores (Fan et al.'s MaxKicks).
pub const MAX_NODES: usize = 500;
/// Largest bucket count (8 TiB of buckets): keeps the arithmetic from
/// overflowing on absurd capacities; an allocation that large fails anyway.
const MAX_BUCKETS: usize = 1 << 40;

/// An insert found no free lane and no cuckoo path to one; the filter was
/// not changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Full;

impl std::fmt::Display for Full {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("cuckoo filter full")
    }
}

impl std::error::Error for Full {}

/// A key's place in one filter: its two candidate buckets and its
/// fingerprint. It also keeps the key's hash and the bucket count it was
/// computed for, so a probe handed to a filter of another size is
/// recomputed there rather than misread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    hash: u64,
    nb: usize,
    i1: usize,
    i2: usize,
}

impl Probe {
    fn new(hash: u64, nb: usize) -> Probe {
        let fp = fingerprint(hash);
        let i1 = range(hash as u32 as u64, nb);
        Probe {
            hash,
            nb,
            i1,
            i2: alt(i1, fp, nb),
        }
    }
    /// The first candidate bucket.
    pub fn i1(&self) -> usize {
        self.i1
    }
    /// The second candidate bucket (may equal the first in tiny filters).
    pub fn i2(&self) -> usize {
        self.i2
    }
    /// The fingerprint, in `1..=4095`.
    pub fn fp(&self) -> u16 {
        fingerprint(self.hash) as u16
    }
}

/// The fingerprint of a key hash: bits 32..44, with 0 mapped to 1.
#[inline]
fn fingerprint(hash: u64) -> u64 {
    let fp = (hash >> 32) & FP_MASK;
    fp + (fp == 0) as u64
}

/// The other candidate bucket of a fingerprint stored in bucket `i`
/// (an involution: `alt(alt(i)) == i`).
#[inline]
fn alt(i: usize, fp: u64, nb: usize) -> usize {
    // (h − i) mod n is an involution for any n, so the bucket count need
    // not be a power of two. `h` spreads the 4095 fingerprints over
    // `0..n` by Fibonacci hashing: one multiply, and the top 32 bits of
    // `fp · 2^64/φ` for consecutive `fp` fall in gaps of at most three
    // sizes (the three-gap theorem), where a full `fmix64` took about a
    // dozen instructions of every probe.
    let h = range(fp.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32, nb);
    if h >= i {
        h - i
    } else {
        h + nb - i
    }
}

/// `x` (32 bits) mapped onto `0..n` by multiply-shift (Lemire's fast range).
/// The product is taken in 128 bits, so a count past 2^32 buckets (up to
/// [`MAX_BUCKETS`]) maps exactly too; below it the result is the same as a
/// 64-bit product's.
#[inline]
fn range(x: u64, n: usize) -> usize {
    ((x as u128 * n as u128) >> 32) as usize
}

/// The fingerprint in lane `lane` of bucket word `w`.
#[inline]
fn lane(w: u64, lane: usize) -> u64 {
    (w >> (lane as u32 * LANE_BITS)) & LANE_MASK
}

/// A bit set at the top of each lane of `x` that is zero. Exact here:
/// lanes never have their top bit set, so no lane borrows from another.
#[inline]
fn zero_lanes(x: u64) -> u64 {
    x.wrapping_sub(LANE_LO) & !x & LANE_HI
}

/// The first lane of `w` holding `v` (`v` = 0: the first free lane).
#[inline]
fn find_lane(w: u64, v: u64) -> Option<usize> {
    let z = zero_lanes(w ^ v.wrapping_mul(LANE_LO));
    (z != 0).then(|| (z.trailing_zeros() / LANE_BITS) as usize)
}

/// See the module documentation.
pub struct CuckooFilter {
    buckets: crate::hugemem::HugeWords,
    /// The bucket count (any, at least 2).
    nb: usize,
    /// Occupied lanes (sharded: lock-free inserts on many cores do not
    /// contend on one line).
    len: crate::sync::Counter,
    /// The last exact [`needs_growth`](Self::needs_growth) answer
    /// ([`should_grow`](Self::should_grow)).
    grow: AtomicBool,
    /// The kick seqlock: odd while a kick moves fingerprints.
    moves: AtomicU64,
    /// Serialises kicks and stash changes (and a `remove` while the stash
    /// holds keys).
    writer: AtomicBool,
    /// Xored into keys before hashing.
    seed: u64,
    /// Exact key hashes of keys no bucket pair could take (more than eight
    /// keys sharing a fingerprint and a bucket pair); bit `i` of
    /// `stash_used` marks `stash[i]` valid.
    stash: Box<[AtomicU64]>,
    stash_used: AtomicU64,
    /// Set by a build that could not place every key: every lookup
    /// answers "maybe".
    saturated: std::sync::atomic::AtomicBool,
    /// See [`id`](Self::id).
    id: u64,
}

/// The next filter's [`CuckooFilter::id`].
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The filter's writer lock, held; released on drop.
struct WriterGuard<'a>(&'a AtomicBool);

impl Drop for WriterGuard<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// One bucket visited by the path search.
#[derive(Clone, Copy)]
struct Node {
    bucket: usize,
    /// Index of the node this one was reached from (`u32::MAX`: a root).
    parent: u32,
    /// The lane of the parent's bucket whose fingerprint moves here.
    from_lane: u8,
    depth: u8,
    /// That fingerprint, as the search read it (0 for a root).
    fp: u16,
}

impl std::fmt::Debug for CuckooFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CuckooFilter")
            .field("buckets", &self.buckets.len())
            .field("len", &self.len())
            .finish()
    }
}

impl CuckooFilter {
    /// A filter for `keys` keys: `ceil(keys / (4 · SIZE_LOAD))`
    /// buckets, at least 2.
    pub fn with_capacity(keys: u64) -> CuckooFilter {
        let want = (keys as f64 / (SLOTS as f64 * SIZE_LOAD)).ceil();
        let want = if want >= MAX_BUCKETS as f64 {
            MAX_BUCKETS
        } else {
            want as usize
        };
        CuckooFilter::with_buckets(want)
    }

    /// A filter of `buckets` buckets (at least 2; any count).
    pub fn with_buckets(buckets: usize) -> CuckooFilter {
        let n = buckets.clamp(2, MAX_BUCKETS);
        CuckooFilter {
            buckets: crate::hugemem::HugeWords::zeroed(n),
            nb: n,
            len: crate::sync::Counter::default(),
            grow: AtomicBool::new(false),
            moves: AtomicU64::new(0),
            writer: AtomicBool::new(false),
            seed: FILTER_SEED,
            stash: (0..STASH).map(|_| AtomicU64::new(0)).collect(),
            stash_used: AtomicU64::new(0),
            saturated: std::sync::atomic::AtomicBool::new(false),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// A number, never 0, that no other filter made by this process has:
    /// it tells this filter from one made later at the same address (a
    /// caller that keeps work for a filter past the [`FilterRef`] it got
    /// it from checks that the current filter is still this one).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Whether a build gave up placing some keys (see [`build_with_buckets`]).
    pub fn is_saturated(&self) -> bool {
        self.saturated.load(Ordering::Relaxed)
    }

    /// This (empty) filter with its key hash seeded by `seed`: an engine
    /// passes a per-pool secret, so that keys colliding in the filter
    /// cannot be computed without the pool.
    pub fn seeded(mut self, seed: u64) -> CuckooFilter {
        debug_assert!(self.is_empty(), "seeded() on a filter holding keys");
        self.seed = FILTER_SEED ^ seed;
        self
    }

    /// The seed given to [`seeded`](Self::seeded) (0 if none).
    pub fn seed(&self) -> u64 {
        self.seed ^ FILTER_SEED
    }

    /// Whether the exact stash holds `hash` (one copy).
    #[inline]
    fn in_stash(&self, hash: u64) -> bool {
        let mut used = self.stash_used.load(Ordering::Acquire);
        while used != 0 {
            let i = used.trailing_zeros() as usize;
            if self.stash[i].load(Ordering::Relaxed) == hash {
                return true;
            }
            used &= used - 1;
        }
        false
    }

    /// Keys held in the exact stash.
    pub fn stashed(&self) -> u64 {
        self.stash_used.load(Ordering::Relaxed).count_ones() as u64
    }

    /// Where `key` lives in this filter. The hash is
    /// `fmix64(key ^ seed)`: `i1` from its low bits, the fingerprint from
    /// bits 32..44.
    #[inline]
    pub fn probe(&self, key: u64) -> Probe {
        Probe::new(fmix64(key ^ self.seed), self.nb)
    }

    /// `p`, recomputed if it was made by a filter of another size.
    #[inline]
    fn rebase(&self, p: &Probe) -> Probe {
        if p.nb == self.nb {
            *p
        } else {
            Probe::new(p.hash, self.nb)
        }
    }

    /// Asks the CPU to start loading both candidate buckets of `p`.
    #[inline]
    pub fn prefetch(&self, p: &Probe) {
        for i in [p.i1.min(self.nb - 1), p.i2.min(self.nb - 1)] {
            crate::sync::prefetch(&self.buckets[i]);
        }
    }

    /// Whether the fingerprint of `p` is in one of its buckets (no false
    /// negatives for present keys, false positives at about
    /// [`expected_fpr`](Self::expected_fpr)).
    #[inline]
    pub fn contains_probe(&self, p: &Probe) -> bool {
        self.contains_at(&self.rebase(p))
    }

    /// Whether `key` may be present.
    #[inline(always)]
    pub fn contains(&self, key: u64) -> bool {
        self.contains_at(&self.probe(key))
    }

    /// [`contains_probe`](Self::contains_probe) for a probe of this
    /// filter's size. The common answers (a fingerprint found, or none
    /// with no kick under way, nothing stashed and no saturated build)
    /// are inline; the rest is out of line
    /// ([`contains_slow`](Self::contains_slow)). A negative get is the two
    /// bucket loads and a few dozen instructions around them: at 10M keys
    /// its throughput is set by how many gets' misses the core overlaps,
    /// which falls as a get's instructions grow (`docs/engines/rophi.md`,
    /// "A negative get's length").
    #[inline(always)]
    fn contains_at(&self, p: &Probe) -> bool {
        let Some(seq) = self.look(p) else {
            return true;
        };
        if seq & 1 == 0
            && self.moves.load(Ordering::Relaxed) == seq
            && self.stash_used.load(Ordering::Relaxed) == 0
            && !self.saturated.load(Ordering::Relaxed)
        {
            return false;
        }
        self.contains_slow(p)
    }

    /// One look at both buckets of `p`: `None` when one holds its
    /// fingerprint, else the kick counter `moves` as read before the
    /// loads, with an acquire fence after them. The caller's negative
    /// answer holds if `moves` reads the same even value now: if either
    /// load saw a store of a kick, the kick's release fence (after it made
    /// `moves` odd) synchronises with this fence, so a load of `moves`
    /// after it sees `moves` odd or later.
    #[inline(always)]
    fn look(&self, p: &Probe) -> Option<u64> {
        let want = fingerprint(p.hash).wrapping_mul(LANE_LO);
        let seq = self.moves.load(Ordering::Acquire);
        // Both loads before either test: no branch between them, so the
        // two cache misses overlap even when the first test is
        // mispredicted.
        let b1 = self.buckets[p.i1].load(Ordering::Relaxed);
        let b2 = self.buckets[p.i2].load(Ordering::Relaxed);
        if zero_lanes(b1 ^ want) | zero_lanes(b2 ^ want) != 0 {
            return None;
        }
        fence(Ordering::Acquire);
        Some(seq)
    }

    /// Whether one of `p`'s two buckets holds a copy of its fingerprint,
    /// waiting out a kick under way: the lookup without the exact stash
    /// and without a saturated filter's blanket "maybe". On a filter
    /// nobody removes from, a copy this finds stays in the pair.
    pub fn holds_copy(&self, p: &Probe) -> bool {
        self.look_settled(&self.rebase(p))
    }

    /// [`look`](Self::look) repeated until it finds the fingerprint or
    /// no kick moved anything during a look.
    fn look_settled(&self, p: &Probe) -> bool {
        let mut tries = 0u32;
        loop {
            let Some(seq) = self.look(p) else {
                return true;
            };
            if seq & 1 == 0 && self.moves.load(Ordering::Relaxed) == seq {
                return false;
            }
            // A kick is a few stores; one that takes long was preempted.
            tries += 1;
            if tries.is_multiple_of(64) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// The probe loop of [`contains_at`](Self::contains_at) when a kick
    /// was under way, the stash holds keys or a build gave up.
    #[cold]
    #[inline(never)]
    fn contains_slow(&self, p: &Probe) -> bool {
        self.look_settled(p)
            || (self.stash_used.load(Ordering::Relaxed) != 0 && self.in_stash(p.hash))
            || self.saturated.load(Ordering::Relaxed)
    }

    fn lock(&self) -> WriterGuard<'_> {
        let mut spins = 0u32;
        while self
            .writer
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            while self.writer.load(Ordering::Relaxed) {
                spins += 1;
                // A holder preempted mid-kick: let it run.
                if spins.is_multiple_of(256) {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
        WriterGuard(&self.writer)
    }

    /// Puts `fp` into a free lane of bucket `i` (compare-and-swap);
    /// `false` if the bucket is full.
    fn put_free(&self, i: usize, fp: u64) -> bool {
        let b = &self.buckets[i];
        let mut w = b.load(Ordering::Relaxed);
        loop {
            let Some(l) = find_lane(w, 0) else {
                return false;
            };
            let new = w | fp << (l as u32 * LANE_BITS);
            match b.compare_exchange_weak(w, new, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(seen) => w = seen,
            }
        }
    }

    /// Replaces lane `l` of bucket `i` by `new` if it holds `old`, leaving
    /// the other lanes as they are; `false` if it does not hold `old`.
    fn set_lane(&self, i: usize, l: usize, old: u64, new: u64) -> bool {
        let shift = l as u32 * LANE_BITS;
        let b = &self.buckets[i];
        let mut w = b.load(Ordering::Relaxed);
        loop {
            if lane(w, l) != old {
                return false;
            }
            let next = (w & !(LANE_MASK << shift)) | new << shift;
            match b.compare_exchange_weak(w, next, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(seen) => w = seen,
            }
        }
    }

    /// Adds `key`'s fingerprint (a key inserted twice is held twice).
    /// `Err(Full)`, with nothing changed, when neither bucket has a free
    /// lane and no cuckoo path leads to one.
    pub fn insert(&self, key: u64) -> Result<(), Full> {
        let p = self.probe(key);
        let fp = fingerprint(p.hash);
        if self.put_free(p.i1, fp) || self.put_free(p.i2, fp) {
            self.count_insert();
            return Ok(());
        }
        let _w = self.lock();
        loop {
            // A remove may have freed a lane of the pair since.
            if self.put_free(p.i1, fp) || self.put_free(p.i2, fp) {
                break;
            }
            match self.find_path(&p) {
                Some(path) => {
                    if self.kick(&path, fp) {
                        break;
                    }
                    // A lock-free insert took the path's free lane first:
                    // nothing moved; search again (free lanes only run out).
                }
                None => {
                    // No path. At a load the filter can take (under
                    // MAX_LOAD) this means the bucket pair is held by eight
                    // keys of this fingerprint: keep the key exactly. A
                    // filter over its load is full for real, and grows.
                    if self.needs_growth() {
                        return Err(Full);
                    }
                    let used = self.stash_used.load(Ordering::Relaxed);
                    if used == u64::MAX {
                        return Err(Full);
                    }
                    let i = (!used).trailing_zeros() as usize;
                    self.stash[i].store(p.hash, Ordering::Relaxed);
                    self.stash_used.store(used | 1 << i, Ordering::Release);
                    break;
                }
            }
        }
        self.count_insert();
        Ok(())
    }

    /// Counts an insert; every 64th insert of this thread (every one while
    /// the filter is small) refreshes [`should_grow`](Self::should_grow)
    /// from the exact count. Summing the sharded count reads a line per
    /// thread that ever wrote it: too much for every insert.
    #[inline]
    fn count_insert(&self) {
        if self.len.bump().is_multiple_of(64) || self.nb < 1 << 12 {
            self.needs_growth();
        }
    }

    /// Breadth-first search for a bucket with a free lane, from both
    /// candidate buckets of `p`. Returns the path as `(bucket, lane, fp)`
    /// from the root to the free end: each entry's lane holds `fp` (as the
    /// search read it), the fingerprint that moves on to the next bucket;
    /// the last entry's lane is the free one (`fp` 0). Moves nothing.
    fn find_path(&self, p: &Probe) -> Option<Vec<(usize, usize, u64)>> {
        let mut nodes: Vec<Node> = Vec::with_capacity(MAX_NODES);
        for root in [p.i1, p.i2] {
            if nodes.first().map(|n| n.bucket) != Some(root) {
                nodes.push(Node {
                    bucket: root,
                    parent: u32::MAX,
                    from_lane: 0,
                    depth: 0,
                    fp: 0,
                });
            }
        }
        let mut q = 0;
        while q < nodes.len() {
            let node = nodes[q];
            let w = self.buckets[node.bucket].load(Ordering::Relaxed);
            if let Some(free) = find_lane(w, 0) {
                let mut path = vec![(node.bucket, free, 0)];
                let mut at = node;
                while at.parent != u32::MAX {
                    let parent = nodes[at.parent as usize];
                    path.push((parent.bucket, at.from_lane as usize, at.fp as u64));
                    at = parent;
                }
                path.reverse();
                return Some(path);
            }
            if (node.depth as usize) < MAX_PATH {
                for l in 0..SLOTS as usize {
                    if nodes.len() >= MAX_NODES {
                        break;
                    }
                    let fp = lane(w, l);
                    let child = alt(node.bucket, fp, self.nb);
                    if self.on_path(&nodes, q, child) {
                        continue;
                    }
                    // Its load overlaps the ones before it in the queue
                    // (a search is a chain of cache misses otherwise).
                    crate::sync::prefetch(&self.buckets[child]);
                    nodes.push(Node {
                        bucket: child,
                        parent: q as u32,
                        from_lane: l as u8,
                        depth: node.depth + 1,
                        fp: fp as u16,
                    });
                }
            }
            q += 1;
        }
        None
    }

    /// Whether `bucket` is node `at` or one of its ancestors.
    fn on_path(&self, nodes: &[Node], mut at: usize, bucket: usize) -> bool {
        loop {
            if nodes[at].bucket == bucket {
                return true;
            }
            if nodes[at].parent == u32::MAX {
                return false;
            }
            at = nodes[at].parent as usize;
        }
    }

    /// Runs a path found by [`find_path`](Self::find_path) backward and
    /// puts `fp` into the root's lane; `false` if a lane changed under it.
    /// Under the writer lock (one kick at a time), with no
    /// `place_free` running (the contract). Each step copies the
    /// fingerprint the search read into the lane just copied out of, by a
    /// compare-and-swap from the fingerprint that was there (0 at the free
    /// end), so a fingerprint moves only into its own bucket pair and is
    /// overwritten only after its copy is in place. Lock-free writers may
    /// change a lane meanwhile: an insert may take the free end (the first
    /// step fails, nothing has moved), and a `remove` may take a
    /// fingerprint on the path. Then the step that would overwrite it
    /// fails; its copy one step ahead is now one too many, and
    /// [`drop_copy`](Self::drop_copy) takes one copy of it out of its pair
    /// again. Every fingerprint of a present key stays in its pair.
    fn kick(&self, path: &[(usize, usize, u64)], fp: u64) -> bool {
        let Some(&(end, free, _)) = path.last() else {
            return false;
        };
        if path.len() == 1 {
            return self.set_lane(end, free, 0, fp);
        }
        let seq = self.moves.load(Ordering::Relaxed);
        self.moves.store(seq + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        // `dst` holds `dst_old`, a fingerprint already copied onward (0 at
        // the free end).
        let (mut dst, mut dst_lane, mut dst_old) = (end, free, 0);
        let mut ok = true;
        // The path's fingerprints from the free end back, then `fp` into
        // the root's lane (no source left after it).
        let steps = path[..path.len() - 1].iter().rev().copied();
        for (src, src_lane, moving) in steps.chain(std::iter::once((usize::MAX, 0, fp))) {
            if !self.set_lane(dst, dst_lane, dst_old, moving) {
                if dst_old != 0 {
                    // A remove took `dst_old` from `dst` after its copy
                    // onward was made: that copy is the spare.
                    self.drop_copy(dst, dst_old);
                }
                ok = false;
                break;
            }
            (dst, dst_lane, dst_old) = (src, src_lane, moving);
        }
        self.moves.store(seq + 2, Ordering::Release);
        ok
    }

    /// Takes one copy of fingerprint `fp` out of the bucket pair of bucket
    /// `i`, for a kick that left one copy too many there (see
    /// [`kick`](Self::kick)); under the writer lock. The pair holds at
    /// least one more copy of `fp` than there are present keys with that
    /// fingerprint and pair, so whichever copy goes, none is missed.
    fn drop_copy(&self, i: usize, fp: u64) {
        let pair = [i, alt(i, fp, self.nb)];
        // Removes may race for the same lanes; the spare copy cannot go
        // away (only a remove takes copies, one per present key), so a few
        // passes find it.
        for _ in 0..64 {
            for b in pair {
                let w = self.buckets[b].load(Ordering::Relaxed);
                if let Some(l) = find_lane(w, fp) {
                    if self.set_lane(b, l, fp, 0) {
                        return;
                    }
                }
            }
        }
    }

    /// Removes one copy of `key`'s fingerprint from either bucket; `false`
    /// if neither holds it. Remove a key only if it was inserted (and only
    /// once per insert): otherwise the copy removed may be another key's.
    pub fn remove(&self, key: u64) -> bool {
        self.remove_probe(&self.probe(key))
    }

    /// [`remove`](Self::remove) of the key `p` was made for (by this
    /// filter or one of another size).
    ///
    /// Takes no lock while the exact stash is empty: a compare-and-swap
    /// clears the lane. Removes race each other and lock-free inserts
    /// only on single lanes (a failed compare-and-swap looks again), and a
    /// kick in progress on the writer lock (see [`kick`](Self::kick)); a
    /// remove that finds no copy retries while the kick seqlock moved, as
    /// a reader does. The key's insert must have returned before its
    /// remove starts (the caller orders the two), so a key the stash holds
    /// is seen in `stash_used` here.
    fn remove_probe(&self, p: &Probe) -> bool {
        let p = self.rebase(p);
        let fp = fingerprint(p.hash);
        let _w = if self.stash_used.load(Ordering::Acquire) != 0 {
            let w = self.lock();
            // A key in the stash is there by its exact hash: remove that
            // copy (the bucket copies of its fingerprint belong to other
            // keys).
            let used = self.stash_used.load(Ordering::Relaxed);
            let mut u = used;
            while u != 0 {
                let i = u.trailing_zeros() as usize;
                if self.stash[i].load(Ordering::Relaxed) == p.hash {
                    self.stash_used.store(used & !(1 << i), Ordering::Release);
                    self.len.add(-1);
                    return true;
                }
                u &= u - 1;
            }
            Some(w)
        } else {
            None
        };
        let mut spins = 0u32;
        loop {
            let seq = self.moves.load(Ordering::Acquire);
            for i in [p.i1, p.i2] {
                // A lane that changes before the compare-and-swap (another
                // remove took it) is looked for again.
                while let Some(l) = find_lane(self.buckets[i].load(Ordering::Acquire), fp) {
                    if self.set_lane(i, l, fp, 0) {
                        self.len.add(-1);
                        return true;
                    }
                }
            }
            // Nothing found: a kick may have carried the fingerprint from
            // the second bucket to the first between the two loads.
            fence(Ordering::Acquire);
            if seq & 1 == 0 && self.moves.load(Ordering::Relaxed) == seq {
                return false;
            }
            spins += 1;
            if spins.is_multiple_of(256) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// Puts the probed key's fingerprint into a free lane of one of its
    /// buckets without kicking anything out and without the writer lock;
    /// `false` if both are full. May run concurrently with itself and with
    /// readers, not with `insert` or `remove`. Does not count: the caller
    /// adds what it placed to `len` (a bulk build counts once per thread
    /// instead of contending on `len` for every key).
    fn place_free(&self, p: &Probe) -> bool {
        let p = self.rebase(p);
        let fp = fingerprint(p.hash);
        self.put_free(p.i1, fp) || self.put_free(p.i2, fp)
    }

    /// Fingerprints stored.
    pub fn len(&self) -> u64 {
        self.len.get().max(0) as u64
    }

    /// Whether the filter holds no fingerprint.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Lanes in all (4 per bucket).
    pub fn slots(&self) -> u64 {
        self.buckets.len() as u64 * SLOTS
    }

    /// Buckets in all.
    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }

    /// `len / slots`.
    pub fn load(&self) -> f64 {
        self.len() as f64 / self.slots() as f64
    }

    /// Whether the load is above [`MAX_LOAD`] (exact: sums the sharded
    /// count). Also refreshes [`should_grow`](Self::should_grow).
    pub fn needs_growth(&self) -> bool {
        let over = self.len() as f64 > MAX_LOAD * self.slots() as f64;
        if self.grow.load(Ordering::Relaxed) != over {
            self.grow.store(over, Ordering::Relaxed);
        }
        over
    }

    /// [`needs_growth`](Self::needs_growth) as last computed: by an insert
    /// (every 64th of each thread, every one while the filter has under
    /// 4096 buckets) or by a call of `needs_growth`. One load, for the
    /// insert path; it may lag the exact answer by 64 inserts per thread.
    #[inline]
    pub fn should_grow(&self) -> bool {
        self.grow.load(Ordering::Relaxed)
    }

    /// Kicks so far: inserts that moved fingerprints to make room.
    pub fn kicks(&self) -> u64 {
        self.moves.load(Ordering::Relaxed) / 2
    }

    /// DRAM held: the buckets and this header.
    pub fn bytes(&self) -> u64 {
        (self.buckets.len() * std::mem::size_of::<AtomicU64>() + std::mem::size_of::<Self>()) as u64
    }

    /// The expected false-positive rate of a lookup at the current load:
    /// `1 − (1 − 1/4095)^(8 · load)` (see the module documentation).
    pub fn expected_fpr(&self) -> f64 {
        1.0 - (1.0 - 1.0 / FP_MASK as f64).powf(2.0 * SLOTS as f64 * self.load())
    }
}

/// A fresh unpredictable seed for [`CuckooFilter::seeded`] (the filter is
/// rebuilt at every open, so its seed need not be stored).
pub fn random_seed() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(0x5eed_u64)
}

/// What [`build`] takes: `each(t, sink)` feeds thread `t`'s share of the
/// keys into `sink`.
pub(crate) type Feed<'a> = dyn Fn(usize, &mut dyn FnMut(u64)) + Sync + 'a;

/// Keys fed through a sink per batch: hashed and prefetched together, then
/// inserted, so the batch's cache misses overlap.
const BATCH: usize = 16;

/// Builds a filter holding every key that `each` feeds: `each(t, sink)` is
/// called once for each `t` in `0..threads`, each on its own scoped thread,
/// and feeds its share of the keys into `sink`. The sinks insert lock-free
/// into free lanes (`place_free`, in prefetched
/// batches) and keep the keys that found none; those then go through
/// [`CuckooFilter::insert`] (with kicks) on the calling thread.
///
/// The filter is first sized for `capacity` keys. If the keys fed turn out
/// to need more room (the load is over [`MAX_LOAD`]) the build starts over
/// sized for the count fed, and if an insert is still `Full` it starts over
/// at twice the buckets. **`each` may therefore run several times** and
/// must feed the same keys every time.
pub fn build(capacity: u64, threads: usize, each: &Feed) -> CuckooFilter {
    build_with_buckets(
        CuckooFilter::with_capacity(capacity).buckets(),
        0,
        threads,
        each,
    )
}

/// [`build`], starting at `buckets` buckets (at least 2)
/// instead of a key count (for a filter that grows by doubling), with the
/// key hash seeded by `seed` ([`CuckooFilter::seeded`]).
///
/// Keys that share a fingerprint and a bucket pair beyond its eight lanes
/// go to the exact stash; if even that overflows (more than 72 keys
/// colliding on 44 bits of a seeded hash: a pool built to attack the
/// filter) doubling cannot help, and after four doublings the build
/// returns a *saturated* filter, which answers "maybe" to every lookup:
/// correct, just no longer filtering, until the next rebuild.
pub fn build_with_buckets(buckets: usize, seed: u64, threads: usize, each: &Feed) -> CuckooFilter {
    let threads = threads.max(1);
    let mut buckets = buckets;
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let f = CuckooFilter::with_buckets(buckets).seeded(seed);
        let (leftovers, fed) = feed(&f, threads, each);
        let mut full = false;
        for k in leftovers {
            if f.insert(k).is_err() {
                full = true;
                break;
            }
        }
        if full && attempts > 4 {
            f.saturated.store(true, Ordering::Relaxed);
            return f;
        }
        if !full && !f.needs_growth() {
            return f;
        }
        let sized = CuckooFilter::with_capacity(fed).buckets();
        let next = if full {
            buckets.saturating_mul(2)
        } else {
            sized
        };
        buckets = next.max(sized).min(MAX_BUCKETS);
        if buckets <= f.buckets() && !full {
            // Cannot happen (the count fed needs more than this filter),
            // but never loop without making progress.
            return f;
        }
    }
}

/// One pass of `each` into `f`: the keys that found no free lane, and the
/// number of keys fed.
fn feed(f: &CuckooFilter, threads: usize, each: &Feed) -> (Vec<u64>, u64) {
    let run = |t: usize| {
        let mut left = Vec::new();
        let mut fed = 0u64;
        let mut batch = [0u64; BATCH];
        let mut n = 0;
        let placed = std::cell::Cell::new(0u64);
        let flush = |batch: &[u64], left: &mut Vec<u64>| {
            let mut probes = [Probe::new(0, 0); BATCH];
            for (p, &k) in probes.iter_mut().zip(batch) {
                *p = f.probe(k);
                f.prefetch(p);
            }
            for (p, &k) in probes.iter().zip(batch) {
                if f.place_free(p) {
                    placed.set(placed.get() + 1);
                } else {
                    left.push(k);
                }
            }
        };
        each(t, &mut |k| {
            fed += 1;
            batch[n] = k;
            n += 1;
            if n == BATCH {
                flush(&batch, &mut left);
                n = 0;
            }
        });
        flush(&batch[..n], &mut left);
        f.len.add(placed.get() as i64);
        (left, fed)
    };
    if threads == 1 {
        return run(0);
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = (1..threads).map(|t| s.spawn(move || run(t))).collect();
        let (mut left, mut fed) = run(0);
        for h in handles {
            match h.join() {
                Ok((l, n)) => {
                    left.extend(l);
                    fed += n;
                }
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        (left, fed)
    })
}

/// A filter that can be replaced while readers use it: the current filter
/// behind an `AtomicPtr`, and a [`WriterGate`] that the *readers* pass (two
/// plain stores and a load), which [`FilterCell::replace`] closes to wait
/// out every reader that may still hold the old filter before freeing it.
///
/// The gate is not reentrant, so a thread that already holds a
/// [`FilterRef`] (of any cell) and calls [`FilterCell::get`] again is
/// counted on a separate atomic counter instead (a locked add; correct,
/// slower), which `replace` also waits for. A thread-local flag tells the
/// two cases apart; that is why a `FilterRef` cannot be sent to another
/// thread.
pub struct FilterCell {
    ptr: AtomicPtr<CuckooFilter>,
    readers: WriterGate,
    /// Readers inside that did not pass the gate (nested `get`s).
    nested: AtomicU64,
}

thread_local! {
    /// Whether this thread holds a `FilterRef` that passed a gate.
    static IN_GATE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The current filter of a [`FilterCell`], kept alive while held.
pub struct FilterRef<'a> {
    filter: &'a CuckooFilter,
    /// Through the gate (`Some`) or counted in `nested` (`None`).
    inside: Option<Inside<'a>>,
    cell: &'a FilterCell,
    /// Not `Send`: the thread-local flag belongs to the creating thread.
    _not_send: PhantomData<*const ()>,
}

impl Deref for FilterRef<'_> {
    type Target = CuckooFilter;
    fn deref(&self) -> &CuckooFilter {
        self.filter
    }
}

impl Drop for FilterRef<'_> {
    fn drop(&mut self) {
        if self.inside.take().is_some() {
            IN_GATE.with(|g| g.set(false));
        } else {
            self.cell.nested.fetch_sub(1, Ordering::Release);
        }
    }
}

impl FilterCell {
    /// A cell holding `f`.
    pub fn new(f: CuckooFilter) -> FilterCell {
        FilterCell {
            ptr: AtomicPtr::new(Box::into_raw(Box::new(f))),
            readers: WriterGate::new(),
            nested: AtomicU64::new(0),
        }
    }

    /// The current filter.
    #[inline]
    pub fn get(&self) -> FilterRef<'_> {
        if !IN_GATE.with(|g| g.replace(true)) {
            let inside = self.readers.enter();
            let ptr = self.ptr.load(Ordering::Acquire);
            // SAFETY: the pointer came from `Box::into_raw` and is freed
            // only by `replace` after it swapped in another pointer and
            // closed the gate, which waits for every reader inside; this
            // reader was inside before loading (the gate orders its entry
            // before the load), and stays inside while the reference
            // lives (`inside` is dropped with it). Or by `drop`, which
            // needs `&mut self`.
            let filter = unsafe { &*ptr };
            return FilterRef {
                filter,
                inside: Some(inside),
                cell: self,
                _not_send: PhantomData,
            };
        }
        // Already inside some gate on this thread: count on `nested`. The
        // add and the load below are SeqCst, as are `replace`'s swap and its
        // read of `nested`: either `replace` sees this reader, or this
        // reader sees the new pointer.
        self.nested.fetch_add(1, Ordering::SeqCst);
        let ptr = self.ptr.load(Ordering::SeqCst);
        // SAFETY: as above, with `nested` instead of the gate: `replace`
        // frees the old filter only once `nested` read 0 after its swap.
        let filter = unsafe { &*ptr };
        FilterRef {
            filter,
            inside: None,
            cell: self,
            _not_send: PhantomData,
        }
    }

    /// Installs `f` and frees the old filter once no reader can hold it.
    /// The caller guarantees that no `insert` or `remove` runs on the old
    /// filter (they would be lost) and that the calling thread holds no
    /// [`FilterRef`] of this cell (it would wait for itself forever).
    /// Readers that pass the gate are held out for the moment the gate is
    /// closed; nested readers are not, so a steady stream of them can keep
    /// this call waiting.
    pub fn replace(&self, f: CuckooFilter) {
        let new = Box::into_raw(Box::new(f));
        let old = self.ptr.swap(new, Ordering::SeqCst);
        drop(self.readers.close());
        while self.nested.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
        // SAFETY: `old` came from `Box::into_raw` and is no longer
        // reachable: the swap took it out, the gate's close waited for every
        // reader that passed the gate before the swap, and `nested` was 0
        // after it. Only this call got `old` from the swap, so it is freed
        // once.
        drop(unsafe { Box::from_raw(old) });
    }

    /// DRAM held by the current filter.
    pub fn bytes(&self) -> u64 {
        self.get().bytes()
    }
}

impl Drop for FilterCell {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no reader holds a reference, and the pointer
        // came from `Box::into_raw` and was never freed (replace frees only
        // what it swapped out).
        drop(unsafe { Box::from_raw(*self.ptr.get_mut()) });
    }
}

impl std::fmt::Debug for FilterCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("FilterCell").field(&*self.get()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// `range` maps a 32-bit value in proportion onto any count up to
    /// `MAX_BUCKETS`, past 2^32 too (a 64-bit product would wrap there).
    #[test]
    fn range_is_proportional_up_to_the_largest_count() {
        for n in [
            1usize,
            7,
            1 << 20,
            (1 << 32) - 1,
            1 << 32,
            3 << 33,
            MAX_BUCKETS,
        ] {
            assert_eq!(range(0, n), 0);
            assert!(range(u32::MAX as u64, n) < n, "n {n}");
            assert_eq!(range(1 << 31, n), n / 2, "n {n}");
        }
        assert_eq!(range(u32::MAX as u64, MAX_BUCKETS), MAX_BUCKETS - 256);
    }

    /// A remove does not wait for the writer lock (a kick or a stash
    /// change in progress): with the lock held, removes of present keys
    /// still finish, and their fingerprints are gone.
    #[test]
    fn remove_takes_no_writer_lock() {
        let f = CuckooFilter::with_buckets(1 << 10);
        let keys: Vec<u64> = (1..=100u64).map(|k| fmix64(k * 7)).collect();
        for &k in &keys {
            f.insert(k).unwrap();
        }
        let (tx, rx) = mpsc::channel();
        std::thread::scope(|s| {
            let held = f.lock();
            let (f, keys) = (&f, &keys);
            s.spawn(move || {
                let removed = keys.iter().filter(|&&k| f.remove(k)).count();
                tx.send(removed).unwrap();
            });
            let got = rx.recv_timeout(Duration::from_secs(5));
            drop(held);
            assert_eq!(
                got,
                Ok(keys.len()),
                "removes waited for the writer lock (or missed keys)"
            );
        });
        assert!(f.is_empty(), "{} fingerprints left", f.len());
    }
}
