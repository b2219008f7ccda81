//! The DRAM point map: a concurrent hash table from a key's 64-bit hash to
//! the `v_addr` of its newest log entry (and, for 8-byte keys with 8-byte
//! values, the value). Reads take no lock and write nothing; a lookup costs
//! one cache miss in the common case.
//!
//! - **Keys are not stored.** A slot holds `(hash, v_addr)`. A slot with
//!   the right hash is a candidate, and the caller confirms it against the
//!   key in the entry it names (`is`), an entry a get reads anyway. Two
//!   keys with one hash are two slots, each confirmed by its own entry, so
//!   every key works; they only cost the second a longer probe.
//! - **Shards.** The top [`SHARD_BITS`] bits of the hash pick a shard: its
//!   own table, a writer lock and its counts. A table grows (or is
//!   rebuilt without its tombstones) under its shard's lock, so a resize
//!   pauses one shard's writers for a small table's copy, never the map.
//! - **Tables.** Open addressing over 64-byte buckets of [`SLOTS`] slots,
//!   one cache line each (hashes and `v_addr` words, then inline values),
//!   linear probing from bucket `hash & mask`. A slot's `v_addr` word says
//!   what it is: [`EMPTY`] (never used), [`TOMB`] (deleted), or live. A key
//!   lives before the first bucket of its probe that has an empty slot: an
//!   insert takes the first free slot up to that bucket, and slots never
//!   become empty again in a table. So a lookup stops at the first bucket
//!   with an empty slot, and a concurrent insert or delete can neither
//!   hide a key nor end another key's probe early.
//! - **Reads.** A reader loads a slot's `v_addr` (acquire), then its hash;
//!   a writer fills a slot's hash, then its `v_addr` (release). So a reader
//!   that sees a live `v_addr` sees the hash written with it; a hash from a
//!   later reuse of the slot can pair with an older `v_addr`, and the
//!   caller's key check rejects that pair. A reader then checks that its
//!   shard still has the same table: a resize copies under the lock and
//!   publishes the new table before any write reaches it, so a read that
//!   saw the old table throughout returned what was current before the
//!   swap. Every access holds a pin of the store's log epochs (`epoch.rs`;
//!   nested in the pin of the store operation around it, so it costs no
//!   fence). A replaced table is freed by [`PointMap::collect`] (the
//!   maintenance thread, every few milliseconds) after
//!   `Epochs::synchronize` has waited out every pin that could hold it.
//!   An 8-byte get reaches its table through the shard's `Hint` instead
//!   (bucket 0's address and the table's size in one word, published
//!   with the table and replaced before the old one is retired), and
//!   checks after its probe that the hint is unchanged: while the pin is
//!   held the old table is not freed, so no new table can have its
//!   address.
//! - **Updates** of a present key store the new `v_addr` in place (one
//!   atomic store: a reader sees the old or the new entry); deletes store
//!   [`TOMB`]. Both hold the shard lock, so that a resize never copies a
//!   slot while it changes.
//! - **Reserve, then commit.** A write can split itself:
//!   [`PointMap::reserve`] takes the shard's lock and probes (the key's
//!   current `v_addr`, or the free slot it would take), and
//!   [`Reserved::commit`] fills the slot with plain stores and unlocks with
//!   a plain store (`engine::sync::SpinMutex`). The store reserves before
//!   its log entry's fence and commits after it, so nothing after the
//!   fence waits for the entry's write-back (a locked instruction would).
//!   The table cannot be replaced in between: a rebuild needs the lock.
//! - **The 8-byte fast path.** A slot's `v_addr` word carries two tags in
//!   bits 48..50, which a `v_addr` never uses (offsets stay below 2^48):
//!   [`KEY8`], the key is 8 bytes long, and [`VAL8`], its value is 8 bytes
//!   long and sits in the slot's value word (a parallel array, four words
//!   per bucket, so a bucket's values share one line). `key_hash` is a
//!   bijection on 8-byte keys, so a [`KEY8`] slot's hash *is* its key:
//!   such keys are found without reading the log, and with [`VAL8`] a get
//!   never touches the log at all. Keys of other lengths never match a
//!   [`KEY8`] slot, and 8-byte keys match nothing else.
//! - **Reading an inline value** ([`PointMap::get8`]): the bucket's
//!   hashes first, then the word of each slot whose hash is the key's
//!   (nearly always one; the others' words are not loaded), then the
//!   value, the word again and the hash again, all acquire; accepted when
//!   both words are equal and the hash is the key's. A writer stores hash,
//!   then value, then word (release), and a delete stores [`TOMB`] first,
//!   so a word loaded after a matching hash is that fill's or a later
//!   one's, and a value or hash from a later reuse of the slot comes with
//!   a visible change of the word. (This loop, with the store's pin
//!   passed in rather than taken again, took a benchmark get from 391 to
//!   341 instructions, harness included (callgrind), and gets of 2M keys
//!   from 5.7 to 9.3 Mops/s on the AMD host: with fewer instructions per
//!   get, the next get's miss enters the out-of-order window while this
//!   one's is still pending.) The caller holds the log's epoch pin, so a
//!   `v_addr` is not handed out twice while it reads (GC frees a file only
//!   after every pin older than its unlinking is gone): equal words are
//!   one write. The value read may be from an update newer than the first
//!   word, which is a durable value of the same key, written concurrently
//!   with the get.

use std::ops::Deref;
use std::sync::atomic::{fence, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use engine::hugemem::HugeWords;
use engine::sync::{SpinGuard, SpinMutex};

use crate::blocks::{Block, BlockPool};
use crate::epoch::{Epochs, Pin};

/// A slot that was never used (the whole table starts zeroed).
pub(crate) const EMPTY: u64 = 0;
/// A deleted slot: skipped by lookups, reused by inserts.
pub(crate) const TOMB: u64 = u64::MAX;
/// Slots per bucket.
pub(crate) const SLOTS: usize = 2;
/// Tag in a slot's `v_addr` word: the key is 8 bytes long (its hash
/// identifies it).
pub(crate) const KEY8: u64 = 1 << 48;
/// Tag in a slot's `v_addr` word: the value is 8 bytes long and held in
/// the slot's value word.
pub(crate) const VAL8: u64 = 1 << 49;
/// Bits of a `v_addr` word that are tags, never address: a `v_addr` given
/// to the map must have them clear.
pub(crate) const TAG_BITS: u64 = 0xff << 48;
/// log2 of the shard count.
pub(crate) const SHARD_BITS: u32 = 10;
const SHARDS: usize = 1 << SHARD_BITS;
/// A table is rebuilt when an insert would take its used slots (live and
/// tombstones) past this fraction of its slots.
const MAX_USED: f64 = 0.85;
/// A rebuilt table is sized for its live slots at this load (or less).
const REBUILT_LOAD: f64 = 0.5;
/// A table whose used slots reach this fraction of its slots counts its
/// bytes into [`PointMap::wave`]: its rebuild is near, and its new
/// table's memory can be faulted in ahead ([`PointMap::warm_up`]). Keys
/// reach the shards by hash, so the shards pass this mark at nearly the
/// same key count (at 10M keys, 8k a shard, within a few percent of each
/// other), some 12% of the keys before their rebuilds: the lead the
/// faults ahead get. 0.68 measured the same at 10M keys (rebuild time
/// 344–387 ms against 353–693 in four alternating pairs), and holds the
/// faulted memory longer before it is used.
const WARN_USED: f64 = 0.75;

/// Words per bucket (64 bytes, one cache line): slot `s` is words `2s`
/// (hash) and `2s + 1` (`v_addr` word); its inline value is word
/// [`VAL`]` + s`; the rest is padding.
///
/// Two slots to a line rather than four over two lines: an 8-byte get
/// then waits for one line, not two. On the AMD host get-pos at 2M keys
/// is 9.6–10.9 Mops/s at 1 thread against 9.3–10.0 with four slots over
/// two lines, and 19.5–21.6 against 17.9–18.9 at 2; 16-byte keys and
/// inserts are the same with either; get-neg at 1.5M keys (load 0.72,
/// where two-slot buckets probe further) is 6.8–7.6 against 7.3–8.3.
const BUCKET_WORDS: usize = 8;
/// The word of slot 0's inline value.
const VAL: usize = 2 * SLOTS;

/// A shard's table: `mask + 1` buckets at word `base` of `words`.
struct Table {
    mask: usize,
    /// Used slots (live and tombstones) past which an insert rebuilds:
    /// [`MAX_USED`] of the slots, computed once.
    max_used: usize,
    /// Used slots at which the table counts itself into the map's
    /// [`wave`](PointMap::wave): [`WARN_USED`] of the slots.
    warn_used: usize,
    words: Words,
    base: usize,
    /// Unit tests do not free a collected table: they mark it here, and a
    /// reader that finds the mark after its probe fails.
    #[cfg(test)]
    collected: std::sync::atomic::AtomicBool,
}

/// A table's words: a part of the array that every shard's first table
/// shares (one huge-page-advised array: with 4 KiB pages every probe would
/// be a TLB miss as well as a cache miss), a block of the map's
/// [`BlockPool`] (a rebuilt table), or an array of its own (a table below
/// the pool's smallest block).
enum Words {
    Shared(Arc<HugeWords>),
    Block(Block),
    Own(HugeWords),
}

impl Deref for Words {
    type Target = [AtomicU64];
    #[inline]
    fn deref(&self) -> &[AtomicU64] {
        match self {
            Words::Shared(w) => w,
            Words::Block(b) => b,
            Words::Own(w) => w,
        }
    }
}

/// How a caller names the key it looks for.
#[derive(Clone, Copy)]
pub(crate) enum Who<F> {
    /// An 8-byte key: its hash is enough.
    Key8,
    /// Any other key: candidates (their `v_addr`s) are confirmed by `F`.
    Other(F),
}

/// What [`PointMap::get8`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Got {
    Absent,
    /// The key's `v_addr`; its value is not inline.
    Addr(u64),
    /// The key's `v_addr` and inline value.
    Value(u64, u64),
}

/// Where a key is, or where it would go.
enum Probe {
    Found {
        bucket: usize,
        slot: usize,
        word: u64,
    },
    /// Absent; the first free slot of its probe and whether it is empty
    /// (not a tombstone). `None` only in a table with no free slot, which
    /// the writers never let happen.
    Absent(Option<(usize, usize, bool)>),
}

/// Zeroed words for `buckets` buckets and the word where bucket 0 starts,
/// bucket-aligned (64 bytes).
fn arena(buckets: usize) -> (HugeWords, usize) {
    let words = HugeWords::zeroed(buckets * BUCKET_WORDS + BUCKET_WORDS);
    fault_in(&words);
    let misalign = (words.as_ptr() as usize / 8) % BUCKET_WORDS;
    let base = (BUCKET_WORDS - misalign) % BUCKET_WORDS;
    (words, base)
}

/// Faults every page of `words` in now (at open, or in a rebuild under
/// its shard's lock) rather than in the first writes to them.
fn fault_in(words: &[AtomicU64]) {
    for w in words.iter().step_by(512) {
        w.store(0, Ordering::Relaxed);
    }
}

/// A table as its readers see it: bucket 0's address (64-byte aligned)
/// with log2 of the bucket count in the low six bits ([`Table::hint`]).
/// A shard publishes its table's hint next to the table ([`PointMap`]'s
/// `hints`), so an 8-byte get reaches its bucket with one load instead of
/// four dependent ones (the table pointer, the table, its words, their
/// base) and no bounds checks.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Hint(usize);

impl Hint {
    #[inline]
    fn mask(self) -> usize {
        (1usize << (self.0 & 63)) - 1
    }

    /// The address of the bucket where a probe of `h` starts.
    #[inline]
    fn first(self, h: u64) -> usize {
        (self.0 & !63) + (h as usize & self.mask()) * 64
    }

    /// The bucket after the one at `addr` (wrapping at the table's end).
    #[inline]
    fn next(self, addr: usize) -> usize {
        let base = self.0 & !63;
        base + ((addr - base + 64) & (self.mask() * 64 + 63))
    }

    /// The words of the bucket at `addr`, one of this table's.
    #[inline]
    fn bucket<'p>(self, addr: usize, _p: &'p Pin<'_>) -> &'p [AtomicU64; BUCKET_WORDS] {
        debug_assert_eq!(addr % 64, 0);
        // SAFETY: `self` was loaded from a shard's `hints` under the pin
        // `_p`, so it names a table that is not freed while `_p` is held:
        // a table is retired after its hint is replaced, and freed only
        // after `Epochs::synchronize` waited out every pin from before
        // that (see `PointMap::table`). `addr` is one of its buckets
        // (`first` and `next` stay inside `mask + 1` buckets from the
        // base), 64-byte aligned words that the table's `HugeWords` owns.
        unsafe { &*(addr as *const [AtomicU64; BUCKET_WORDS]) }
    }

    /// The 8-byte key of hash `h`, with its inline value when it has one;
    /// `None`: a writer changed the slot while it was read (look again).
    /// The read protocol is in the module doc. The first bucket is looked
    /// at here, inlined into the caller; the rest of a longer probe out of
    /// line: a get's instructions between its miss and the next get's
    /// decide how many misses overlap (see `get8_pinned`).
    #[inline(always)]
    fn get8(self, h: u64, p: &Pin<'_>) -> Option<Got> {
        let at = self.first(h);
        match Self::in_bucket8(self.bucket(at, p), h) {
            Some(r) => r,
            None => self.get8_from(self.next(at), h, p),
        }
    }

    /// [`get8`](Self::get8) from the probe's second bucket on.
    #[cold]
    #[inline(never)]
    fn get8_from(self, mut at: usize, h: u64, p: &Pin<'_>) -> Option<Got> {
        for _ in 0..self.mask() {
            if let Some(r) = Self::in_bucket8(self.bucket(at, p), h) {
                return r;
            }
            at = self.next(at);
        }
        Some(Got::Absent)
    }

    /// One bucket of a [`get8`](Self::get8) probe: `Some` with the answer
    /// (`Some(None)`: look again), `None`: the probe goes on to the next
    /// bucket.
    #[inline(always)]
    fn in_bucket8(w: &[AtomicU64; BUCKET_WORDS], h: u64) -> Option<Option<Got>> {
        // Hashes first (acquire): a slot whose hash is `h` was filled
        // (hash, then word) for this key, so its word, loaded after, is
        // this key's or a later one (a delete's TOMB, a reuse's). Only the
        // candidates' words are loaded: one slot, nearly always. The value
        // is in the same line.
        let mut cand = 0u32;
        for s in 0..SLOTS {
            cand |= ((w[2 * s].load(Ordering::Acquire) == h) as u32) << s;
        }
        while cand != 0 {
            let s = cand.trailing_zeros() as usize;
            cand &= cand - 1;
            let word = w[2 * s + 1].load(Ordering::Acquire);
            if word & KEY8 == 0 || word == TOMB {
                continue;
            }
            if word & VAL8 == 0 {
                return Some(Some(Got::Addr(word & !TAG_BITS)));
            }
            let v = w[VAL + s].load(Ordering::Acquire);
            fence(Ordering::Acquire);
            let again = w[2 * s + 1].load(Ordering::Acquire);
            if again != word || w[2 * s].load(Ordering::Acquire) != h {
                return Some(None);
            }
            return Some(Some(Got::Value(word & !TAG_BITS, v)));
        }
        // The key lives before the first bucket with an empty slot.
        if (0..SLOTS).any(|s| w[2 * s + 1].load(Ordering::Acquire) == EMPTY) {
            return Some(Some(Got::Absent));
        }
        None
    }
}

/// [`Table::max_used`] of a table of `buckets` buckets.
fn max_used(buckets: usize) -> usize {
    (MAX_USED * (buckets * SLOTS) as f64) as usize
}

/// The buckets of the table that replaces one of `len` buckets holding
/// `want` live slots (before [`Table::new`] rounds it up).
fn rebuilt_buckets(want: usize, len: usize) -> usize {
    ((want as f64 / REBUILT_LOAD) as usize)
        .div_ceil(SLOTS)
        .max(len / 2)
}

/// The bytes a new table of `buckets` buckets takes from the map's
/// [`BlockPool`] (0 when the pool does not serve its size).
fn taken_from_pool(buckets: usize) -> usize {
    BlockPool::serves(buckets.next_power_of_two().max(1) * BUCKET_WORDS).unwrap_or(0)
}

/// [`Table::warn_used`] of a table of `buckets` buckets.
fn warn_used(buckets: usize) -> usize {
    (WARN_USED * (buckets * SLOTS) as f64) as usize
}

impl Table {
    /// A table of `buckets` (rounded up to a power of two) buckets, its
    /// words from `pool` where it serves the size.
    fn new(buckets: usize, pool: &Arc<BlockPool>) -> Table {
        let n = buckets.next_power_of_two().max(1);
        let (words, base) = match pool.take(n * BUCKET_WORDS) {
            Some(b) => {
                fault_in(&b);
                (Words::Block(b), 0)
            }
            None => {
                let (w, base) = arena(n);
                (Words::Own(w), base)
            }
        };
        Table {
            mask: n - 1,
            max_used: max_used(n),
            warn_used: warn_used(n),
            words,
            base,
            #[cfg(test)]
            collected: Default::default(),
        }
    }

    /// The words of bucket `b`.
    #[inline]
    fn bucket(&self, b: usize) -> &[AtomicU64] {
        let i = self.base + b * BUCKET_WORDS;
        &self.words[i..i + BUCKET_WORDS]
    }

    fn len(&self) -> usize {
        self.mask + 1
    }

    /// The bytes its drop gives back to the map's [`BlockPool`].
    fn pool_bytes(&self) -> usize {
        match self.words {
            Words::Block(ref b) => b.len() * 8,
            _ => 0,
        }
    }

    /// Bucket 0's address (64-byte aligned) with log2 of the bucket count
    /// in its low six bits: where [`PointMap::prefetch`] finds a bucket.
    fn hint(&self) -> Hint {
        let base = self.bucket(0).as_ptr() as usize;
        debug_assert_eq!(base % 64, 0, "buckets are line-aligned");
        Hint(base | self.len().trailing_zeros() as usize)
    }

    /// The `v_addr` of the key (`h`, `who`).
    #[inline]
    fn get(&self, h: u64, who: &mut Who<impl FnMut(u64) -> bool>) -> Option<u64> {
        match self.probe(h, who) {
            Probe::Found { word, .. } => Some(word & !TAG_BITS),
            Probe::Absent(_) => None,
        }
    }

    /// The slot of the key (`h`, `who`), or the first free slot of its
    /// probe (what a writer, holding the shard lock, fills). Readers use
    /// it too: each `v_addr` word is loaded (acquire) before its hash.
    #[inline]
    fn probe(&self, h: u64, who: &mut Who<impl FnMut(u64) -> bool>) -> Probe {
        let mut b = h as usize & self.mask;
        let mut free = None;
        for _ in 0..self.len() {
            let w = self.bucket(b);
            let mut open = false;
            for s in 0..SLOTS {
                let word = w[2 * s + 1].load(Ordering::Acquire);
                if word == EMPTY || word == TOMB {
                    open |= word == EMPTY;
                    if free.is_none() {
                        free = Some((b, s, word == EMPTY));
                    }
                } else if w[2 * s].load(Ordering::Acquire) == h
                    && match who {
                        Who::Key8 => word & KEY8 != 0,
                        Who::Other(is) => word & KEY8 == 0 && is(word & !TAG_BITS),
                    }
                {
                    return Probe::Found {
                        bucket: b,
                        slot: s,
                        word,
                    };
                }
            }
            if open {
                break;
            }
            b = (b + 1) & self.mask;
        }
        Probe::Absent(free)
    }

    /// Stores the value word, then the `v_addr` word of a live slot (the
    /// order `get8` relies on).
    fn store(&self, bucket: usize, slot: usize, word: u64, val: u64) {
        if word & VAL8 != 0 {
            self.bucket(bucket)[VAL + slot].store(val, Ordering::Release);
        }
        self.bucket(bucket)[2 * slot + 1].store(word, Ordering::Release);
    }

    /// Fills a free slot: hash first, then value, then the `v_addr` word
    /// (all release), so a reader that sees the word sees its hash and
    /// value, and one that sees the hash sees the delete before it.
    fn fill(&self, bucket: usize, slot: usize, h: u64, word: u64, val: u64) {
        self.bucket(bucket)[2 * slot].store(h, Ordering::Release);
        self.store(bucket, slot, word, val);
    }

    /// Places a slot known to be absent, in a table no reader sees yet.
    fn place(&self, h: u64, word: u64, val: u64) {
        match self.probe(h, &mut Who::Other(|_| false)) {
            Probe::Absent(Some((b, s, _))) => self.fill(b, s, h, word, val),
            _ => unreachable!("a rebuilt table has room for every live slot"),
        }
    }

    /// Calls `f(hash, word, value word)` for every live slot.
    fn for_each(&self, f: &mut impl FnMut(u64, u64, u64)) {
        for b in 0..self.len() {
            let bk = self.bucket(b);
            for s in 0..SLOTS {
                let word = bk[2 * s + 1].load(Ordering::Acquire);
                if word != EMPTY && word != TOMB {
                    let val = bk[VAL + s].load(Ordering::Acquire);
                    f(bk[2 * s].load(Ordering::Acquire), word, val);
                }
            }
        }
    }
}

#[derive(Default)]
struct Counts {
    /// Live slots.
    live: usize,
    /// Live slots and tombstones.
    used: usize,
    /// What the table added to [`PointMap::wave`] when its used slots
    /// passed [`WARN_USED`] (`None`: not yet).
    warned: Option<usize>,
}

/// A shard's writer side, one cache line each: every write locks it, so it
/// must not share a line with what readers load.
#[repr(align(64))]
#[derive(Default)]
struct Writer {
    counts: SpinMutex<Counts>,
    /// `Counts::live`, readable without the lock.
    live: AtomicUsize,
}

/// A key's slot in the point map, with its shard locked: see
/// [`PointMap::reserve`].
pub(crate) struct Reserved<'m> {
    map: &'m PointMap,
    shard: usize,
    counts: SpinGuard<'m, Counts>,
    pin: Pin<'m>,
    at: Probe,
    h: u64,
    key8: bool,
}

impl Reserved<'_> {
    /// The key's `v_addr` now (`None`: absent). It cannot change while
    /// this is held.
    pub(crate) fn current(&self) -> Option<u64> {
        match self.at {
            Probe::Found { word, .. } => Some(word & !TAG_BITS),
            Probe::Absent(_) => None,
        }
    }

    /// Whether the key's current value is 8 bytes, held inline (then its
    /// entry is an 8-byte key's with an 8-byte value).
    pub(crate) fn current_is_val8(&self) -> bool {
        matches!(self.at, Probe::Found { word, .. } if word & VAL8 != 0)
    }

    /// Sets the key to `va`, with `inline` as its value word (8-byte keys
    /// only), and unlocks the shard. True if it was absent. Plain stores
    /// and a plain unlock, unless the table has to grow.
    pub(crate) fn commit(mut self, va: u64, inline: Option<u64>) -> bool {
        assert!(
            va != EMPTY && va & TAG_BITS == 0,
            "v_addr {va:#x} is reserved or too large"
        );
        assert!(
            inline.is_none() || self.key8,
            "inline values need 8-byte keys"
        );
        let word = va | if self.key8 { KEY8 } else { 0 } | if inline.is_some() { VAL8 } else { 0 };
        let val = inline.unwrap_or(0);
        let map = self.map;
        let (_, tab) = map.table(self.shard, &self.pin);
        let (b, s, empty) = match self.at {
            Probe::Found { bucket, slot, .. } => {
                tab.store(bucket, slot, word, val);
                return false;
            }
            Probe::Absent(Some(free)) => free,
            Probe::Absent(None) => unreachable!("tables never fill up"),
        };
        let c = &mut *self.counts;
        if !empty || c.used < tab.max_used {
            tab.fill(b, s, self.h, word, val);
            if empty && c.warned.is_none() && c.used + 1 >= tab.warn_used {
                // The rebuild to come, if every slot it waits for takes a
                // new key: the pool memory it takes beyond what it frees.
                let want = c.live + 1 + (tab.max_used - c.used - 1);
                let net = taken_from_pool(rebuilt_buckets(want, tab.len()))
                    .saturating_sub(tab.pool_bytes());
                c.warned = Some(net);
                map.wave.fetch_add(net, Ordering::Relaxed);
            }
        } else {
            let start = std::time::Instant::now();
            let bigger = map.rebuild(self.shard, c, &self.pin, c.live + 1);
            bigger.place(self.h, word, val);
            map.structural.record(start);
            c.used = c.live;
        }
        c.used += empty as usize;
        c.live += 1;
        map.writers[self.shard]
            .live
            .store(c.live, Ordering::Relaxed);
        true
    }

    /// Removes the key and unlocks the shard. True if it was present.
    pub(crate) fn remove(mut self) -> bool {
        let Probe::Found { bucket, slot, .. } = self.at else {
            return false;
        };
        let (_, tab) = self.map.table(self.shard, &self.pin);
        tab.bucket(bucket)[2 * slot + 1].store(TOMB, Ordering::Release);
        let c = &mut *self.counts;
        c.live -= 1;
        self.map.writers[self.shard]
            .live
            .store(c.live, Ordering::Relaxed);
        true
    }
}

/// A concurrent map from 64-bit hashes to `v_addr`s; see the module doc.
pub(crate) struct PointMap {
    /// Each shard's table: read by every lookup, written only when a table
    /// is replaced, so eight shards share a line. Never null.
    tables: Box<[AtomicPtr<Table>; SHARDS]>,
    /// Each shard's table as a [`Hint`] (bucket 0's address and the
    /// table's log2 size in one word), replaced right after `tables`: what
    /// `get8` reads under a pin, and [`prefetch`](Self::prefetch) without
    /// one (a hint read during a resize may name a freed table, and
    /// prefetching a freed address is harmless).
    hints: Box<[AtomicUsize; SHARDS]>,
    writers: Box<[Writer]>,
    /// Every access to a table holds a pin of these (the store's log
    /// epochs: a store operation's own pin covers the map's, which then
    /// costs no fence).
    epochs: Arc<Epochs>,
    /// Replaced tables, freed by [`collect`](Self::collect).
    retired: Mutex<Vec<Retired>>,
    /// Where rebuilt tables take their words, and freed ones leave them.
    pool: Arc<BlockPool>,
    /// Table rebuilds (growths and tombstone purges) and the time spent in
    /// them.
    structural: engine::StructuralClock,
    /// What the rebuilds of the tables that have passed [`WARN_USED`] and
    /// not yet been rebuilt will take from the pool beyond what they give
    /// back: a doubled table takes twice its old bytes and frees them once
    /// (a first table, part of one array, frees nothing to the pool); a
    /// rebuild that only drops tombstones takes what it frees. So what
    /// [`warm_up`](Self::warm_up) may fault in.
    wave: AtomicUsize,
    /// The bytes the retired tables (and the one a rebuild is replacing)
    /// will give back to the pool when [`collect`](Self::collect) frees
    /// them: warm memory to come, which `warm_up` counts as there already.
    retiring: AtomicUsize,
    /// Bytes [`warm_up`](Self::warm_up) faulted in.
    warmed: AtomicU64,
    /// Unit tests keep collected tables (marked) unless this is set.
    #[cfg(test)]
    free_collected: std::sync::atomic::AtomicBool,
}

/// A table no longer linked from its shard.
struct Retired(*mut Table);

// SAFETY: a retired table is only dropped, once, by `collect` or the map's
// drop, when no other thread can reach it.
unsafe impl Send for Retired {}

impl PointMap {
    /// A map sized for `capacity` keys without a resize, whose tables are
    /// read under pins of `epochs`.
    pub(crate) fn with_capacity(capacity: usize, epochs: Arc<Epochs>) -> PointMap {
        let per_shard = capacity.div_ceil(SHARDS);
        let n = ((per_shard as f64 / (MAX_USED * 0.9)) as usize)
            .div_ceil(SLOTS)
            .next_power_of_two();
        // One array for every shard's first table.
        let (words, base) = arena(SHARDS * n);
        let words = Arc::new(words);
        let first: Vec<Table> = (0..SHARDS)
            .map(|i| Table {
                mask: n - 1,
                max_used: max_used(n),
                warn_used: warn_used(n),
                words: Words::Shared(words.clone()),
                base: base + i * n * BUCKET_WORDS,
                #[cfg(test)]
                collected: Default::default(),
            })
            .collect();
        PointMap {
            // A table's hint names its words, which do not move when the
            // table is boxed.
            hints: first
                .iter()
                .map(|t| AtomicUsize::new(t.hint().0))
                .collect::<Box<[_]>>()
                .try_into()
                .expect("one hint per shard"),
            tables: first
                .into_iter()
                .map(|t| AtomicPtr::new(Box::into_raw(Box::new(t))))
                .collect::<Box<[_]>>()
                .try_into()
                .expect("one table per shard"),
            writers: (0..SHARDS).map(|_| Writer::default()).collect(),
            epochs,
            retired: Mutex::new(Vec::new()),
            pool: Default::default(),
            structural: Default::default(),
            wave: AtomicUsize::new(0),
            retiring: AtomicUsize::new(0),
            warmed: AtomicU64::new(0),
            #[cfg(test)]
            free_collected: Default::default(),
        }
    }

    /// Table rebuilds so far (a shard's table grown, or rebuilt without
    /// its tombstones) and the nanoseconds spent in them.
    pub(crate) fn structural(&self) -> (u64, u64) {
        (self.structural.changes(), self.structural.nanos())
    }

    /// Bytes of the shards' current tables (replaced tables waiting for
    /// [`collect`](Self::collect) not counted).
    pub(crate) fn table_bytes(&self) -> u64 {
        let p = self.epochs.pin();
        (0..SHARDS)
            .map(|i| (self.table(i, &p).1.len() * BUCKET_WORDS * 8) as u64)
            .sum()
    }

    /// The shard of hash `h`.
    #[inline]
    fn shard(h: u64) -> usize {
        (h >> (64 - SHARD_BITS)) as usize
    }

    /// Shard `i`'s table, readable while `_p` is held.
    #[inline]
    fn table<'p>(&self, i: usize, _p: &'p Pin<'_>) -> (*mut Table, &'p Table) {
        let t = self.tables[i].load(Ordering::Acquire);
        // SAFETY: a shard's table is never null (set at creation, replaced
        // only by another table), and a replaced table is freed only by
        // `collect`, after `Epochs::synchronize` has waited out every pin
        // taken before its replacement was published; a pin taken later
        // cannot load it (see `epoch.rs`). `_p` is held for `'p`.
        (t, unsafe { &*t })
    }

    /// Frees the tables replaced since the last call, once no pin can
    /// still reach them. Waits for every pinned operation: never call it
    /// while holding a pin. Returns how many it freed.
    pub(crate) fn collect(&self) -> usize {
        let list = std::mem::take(&mut *self.retired.lock().expect("retired tables"));
        if list.is_empty() {
            return 0;
        }
        self.epochs.synchronize();
        let n = list.len();
        for r in list {
            // SAFETY: `r` was unlinked before `synchronize` began, so no
            // pin can reach it any more, and it is freed only here.
            let t = unsafe { Box::from_raw(r.0) };
            let back = t.pool_bytes();
            #[cfg(test)]
            if !self.free_collected.load(Ordering::Relaxed) {
                t.collected.store(true, Ordering::SeqCst);
                std::mem::forget(t);
                self.retiring.fetch_sub(back, Ordering::Release);
                continue;
            }
            drop(t);
            // After the drop has given the memory back: `warm_up` reads
            // this first, so it counts the memory once or twice, never
            // not at all.
            self.retiring.fetch_sub(back, Ordering::Release);
        }
        n
    }

    /// The `v_addr` of the key (`h`, `who`); an [`Who::Other`] check gets
    /// each candidate `v_addr` of hash `h` and may see one more than once.
    #[inline]
    pub(crate) fn get(&self, h: u64, mut who: Who<impl FnMut(u64) -> bool>) -> Option<u64> {
        let i = Self::shard(h);
        let p = self.epochs.pin();
        loop {
            let (t, tab) = self.table(i, &p);
            let r = tab.get(h, &mut who);
            #[cfg(test)]
            assert!(
                !tab.collected.load(Ordering::SeqCst),
                "read a collected table"
            );
            // A resize meanwhile: the answer may predate a write to the new
            // table, so look again there.
            if self.tables[i].load(Ordering::Acquire) == t {
                return r;
            }
        }
    }

    /// The 8-byte key of hash `h`: its `v_addr`, and its value when inline.
    /// The caller holds the log's epoch pin (see the module doc).
    #[cfg(test)]
    pub(crate) fn get8(&self, h: u64) -> Got {
        self.get8_pinned(h, &self.epochs.pin())
    }

    /// [`get8`](Self::get8) under the caller's pin of the store's epochs
    /// (`p` proves it is held), for a path that pins once. Inlined whole
    /// into the caller, with the first bucket's probe: gets of 2M keys
    /// overlap their misses only while one get, from its miss to the next
    /// get's, fits the CPU's out-of-order window (see docs/bench/log.md,
    /// "Why a get's length matters: the out-of-order window").
    #[inline(always)]
    pub(crate) fn get8_pinned(&self, h: u64, p: &Pin<'_>) -> Got {
        // Crate-private: its callers pass the store's own pin.
        debug_assert!(p.belongs_to(&self.epochs), "a pin of other epochs");
        let i = Self::shard(h);
        let hint = &self.hints[i];
        loop {
            let t = Hint(hint.load(Ordering::Acquire));
            #[cfg(test)]
            let tab = self.table(i, p).1;
            let r = t.get8(h, p);
            #[cfg(test)]
            assert!(
                tab.hint() != t || !tab.collected.load(Ordering::SeqCst),
                "read a collected table"
            );
            // A resize meanwhile: the answer may predate a write to the new
            // table, so look again there. (While the pin is held, the old
            // table is not freed, so no new table has its address.)
            if let Some(r) = r {
                if hint.load(Ordering::Acquire) == t.0 {
                    return r;
                }
            }
        }
    }

    /// Starts loading the bucket where a lookup of `h` begins, so that a
    /// lookup after other work finds it in cache. Takes no pin (a pin is a
    /// full fence): a writer calls it before anything else, so the miss is
    /// in flight while the fence waits for the previous write's flush.
    #[inline]
    pub(crate) fn prefetch(&self, h: u64) {
        let hint = Hint(self.hints[Self::shard(h)].load(Ordering::Relaxed));
        // The table may have been freed since the hint: a prefetch of a
        // freed address is harmless.
        engine::sync::prefetch_addr(hint.first(h));
    }

    /// Starts loading the line of the lock a write of `h` takes
    /// ([`reserve`](Self::reserve)).
    #[inline]
    pub(crate) fn prefetch_writer(&self, h: u64) {
        engine::sync::prefetch(&self.writers[Self::shard(h)]);
    }

    /// Sets the key (`h`, `who`) to `va`, with `inline` as its value word
    /// (8-byte keys only). True if it was absent.
    pub(crate) fn set(
        &self,
        h: u64,
        va: u64,
        inline: Option<u64>,
        who: Who<impl FnMut(u64) -> bool>,
    ) -> bool {
        self.reserve(h, who).commit(va, inline)
    }

    /// Locks the shard of the key (`h`, `who`) and finds its slot, or the
    /// slot it would take: the first half of a write, which a caller can
    /// do before its log entry is durable, so that what remains after the
    /// entry's fence ([`Reserved::commit`], [`Reserved::remove`]) is plain
    /// stores and no locked instruction. The shard's writers wait until
    /// the [`Reserved`] is committed or dropped; its table cannot be
    /// replaced meanwhile (a rebuild needs the shard's lock).
    pub(crate) fn reserve(&self, h: u64, mut who: Who<impl FnMut(u64) -> bool>) -> Reserved<'_> {
        let i = Self::shard(h);
        let counts = self.writers[i].counts.lock();
        let pin = self.epochs.pin();
        let (_, tab) = self.table(i, &pin);
        let at = tab.probe(h, &mut who);
        let key8 = matches!(who, Who::Key8);
        Reserved {
            map: self,
            shard: i,
            counts,
            pin,
            at,
            h,
            key8,
        }
    }

    /// Copies the live slots of `sh` into a new table sized for `want`
    /// live slots and publishes it; returns the new table. The shard's
    /// lock is held (`c`), and the table leaves the [`wave`](Self::wave).
    fn rebuild<'p>(&self, i: usize, c: &mut Counts, p: &'p Pin<'_>, want: usize) -> &'p Table {
        let (old, tab) = self.table(i, p);
        self.replacing(c, tab);
        let new = Table::new(rebuilt_buckets(want, tab.len()), &self.pool);
        tab.for_each(&mut |h, word, val| new.place(h, word, val));
        let new = self.install(i, new, old);
        // SAFETY: `new` is the shard's table now; a later replacement is
        // freed only after every pin from before it, `p` included, is gone.
        unsafe { &*new }
    }

    /// Counts table `tab`, about to be replaced under its shard's lock
    /// (`c`), out of the [`wave`](Self::wave) and its memory into
    /// [`retiring`](Self::retiring): before the new table is taken, so that
    /// `warm_up` never sees the take without the free to come.
    fn replacing(&self, c: &mut Counts, tab: &Table) {
        self.retiring.fetch_add(tab.pool_bytes(), Ordering::Relaxed);
        if let Some(net) = c.warned.take() {
            self.wave.fetch_sub(net, Ordering::Relaxed);
        }
    }

    /// Publishes `new` as shard `i`'s table in place of `old` and retires
    /// `old`; the caller holds the shard's lock, so no other writer can
    /// reach `old` after this, only pins taken before (which `collect`
    /// waits for). Returns the new table.
    fn install(&self, i: usize, new: Table, old: *mut Table) -> *mut Table {
        let hint = new.hint();
        let new = Box::into_raw(Box::new(new));
        // The hint is a table pointer too (`get8` reads through it): its
        // release publishes the filled table, so the table goes first.
        self.tables[i].store(new, Ordering::Release);
        self.hints[i].store(hint.0, Ordering::Release);
        self.retired
            .lock()
            .expect("retired tables")
            .push(Retired(old));
        new
    }

    /// Removes the key (`h`, `who`). True if it was present (tests; the
    /// store removes through [`reserve`](Self::reserve)).
    #[cfg(test)]
    pub(crate) fn remove(&self, h: u64, who: Who<impl FnMut(u64) -> bool>) -> bool {
        self.reserve(h, who).remove()
    }

    /// Number of shards (for [`for_shard`](Self::for_shard)).
    pub(crate) fn shards(&self) -> usize {
        self.tables.len()
    }

    /// Calls `f(hash, v_addr)` for every pair of shard `i`, from one of its
    /// tables, under an epoch guard but no lock (`f` may write to the map).
    /// A pair present throughout the call is visited once; one written
    /// meanwhile may be visited with its old or its new `v_addr`, or not
    /// at all.
    pub(crate) fn for_shard(&self, i: usize, mut f: impl FnMut(u64, u64)) {
        let p = self.epochs.pin();
        let (_, tab) = self.table(i, &p);
        tab.for_each(&mut |h, word, _| f(h, word & !TAG_BITS));
    }

    /// Empties shard `i` and frees its table: a one-bucket empty table
    /// takes its place, and the old one is freed once no pin can reach it
    /// (this waits for every pinned operation: never call it while holding
    /// a pin). For a close that is done with the map (the index image
    /// written from this shard); a later get or put on the shard works on
    /// the empty table.
    pub(crate) fn release_shard(&self, i: usize) {
        let shared = {
            let mut c = self.writers[i].counts.lock();
            let p = self.epochs.pin();
            let (old, tab) = self.table(i, &p);
            let span = match &tab.words {
                Words::Shared(w) => {
                    Some((w.clone(), tab.base, tab.base + tab.len() * BUCKET_WORDS))
                }
                _ => None,
            };
            self.replacing(&mut c, tab);
            self.install(i, Table::new(1, &self.pool), old);
            *c = Counts::default();
            self.writers[i].live.store(0, Ordering::Relaxed);
            span
        };
        self.collect();
        // No pin reaches the old table now. Its words may be one part of
        // an array every shard's first table shares (`with_capacity`),
        // freed only with the last of them: its pages go back now.
        if let Some((words, from, to)) = shared {
            if Arc::strong_count(&words) > 1 {
                words.discard(from, to);
            }
        }
    }

    /// Faults in at most `max_bytes` of the memory that the coming
    /// rebuilds will take and find cold: the bytes of the tables near
    /// their rebuild ([`wave`](Self::wave)) less the warm free memory the
    /// pool already holds or is about to get back. Returns the bytes
    /// faulted in now.
    ///
    /// Run on a CPU that no writer wants (the store's idle-class prefault
    /// thread): otherwise the faults come out of a writer's time either
    /// way. Counting the wave's frees (each rebuild frees its old table
    /// after taking one twice its size) keeps what is faulted in at most
    /// what the rebuilds then use, so no resident memory is added beyond
    /// the tables the map is about to hold (docs/store.md, "The point
    /// index's memory, faulted in ahead of its rebuilds").
    pub(crate) fn warm_up(&self, max_bytes: usize) -> usize {
        let mut done = 0;
        while done < max_bytes {
            let wave = self.wave.load(Ordering::Relaxed);
            if wave == 0 {
                break;
            }
            let retiring = self.retiring.load(Ordering::Acquire);
            let need = wave
                .saturating_sub(retiring)
                .saturating_sub(self.pool.warm_bytes());
            if need == 0 {
                break;
            }
            let n = self.pool.warm_up(need.min(max_bytes - done));
            if n == 0 {
                break;
            }
            done += n;
        }
        self.warmed.fetch_add(done as u64, Ordering::Relaxed);
        done
    }

    /// Bytes [`warm_up`](Self::warm_up) has faulted in.
    pub(crate) fn warmed(&self) -> u64 {
        self.warmed.load(Ordering::Relaxed)
    }

    /// Gives the pages of freed tables' memory back to the system (for a
    /// close that releases the map shard by shard); returns the bytes.
    pub(crate) fn give_back(&self) -> usize {
        self.pool.trim()
    }

    /// Live keys (a sum over the shards' counts: no walk).
    pub(crate) fn len(&self) -> usize {
        self.writers
            .iter()
            .map(|w| w.live.load(Ordering::Relaxed))
            .sum()
    }
}

impl Drop for PointMap {
    fn drop(&mut self) {
        let retired = std::mem::take(&mut *self.retired.lock().expect("retired tables"));
        let current = self.tables.iter().map(|t| t.load(Ordering::Relaxed));
        for t in current.chain(retired.into_iter().map(|r| r.0)) {
            // SAFETY: `&mut self`: no reader or writer holds this map any
            // more; each table is linked or retired once, and freed here
            // once.
            drop(unsafe { Box::from_raw(t) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::atomic::AtomicBool;

    /// Keys are u64s, `v_addr`s name them as `key << 8 | version`; the
    /// hash is a narrow function of the key, so that many keys share one
    /// and probes cross buckets and shards.
    fn hash(k: u64) -> u64 {
        engine::hash::fmix64(k % 5_000) // 5,000 distinct hashes
    }
    fn key_of(va: u64) -> u64 {
        va >> 8
    }

    /// Sets every key of `stable` (hash `h`) to `v_addr` `k << 8 | 1`,
    /// and 8-byte key `k` (hash `h8`, one per key) to `v_addr` `k << 8 |
    /// 4` with the inline value `!k` (what `get8` reads).
    fn load_stable(m: &PointMap, h: fn(u64) -> u64, h8: fn(u64) -> u64, stable: &[u64]) {
        for &k in stable {
            assert!(m.set(h(k), k << 8 | 1, None, Who::Other(|va| key_of(va) == k)));
            assert!(m.set(h8(k), k << 8 | 4, Some(!k), Who::<fn(u64) -> bool>::Key8));
        }
    }

    /// The keys `load_stable` put in `m` (hashed with `h`, and as 8-byte
    /// keys with `h8`), which stay present with the same values.
    #[derive(Clone, Copy)]
    struct Stable<'a> {
        m: &'a PointMap,
        h: fn(u64) -> u64,
        h8: fn(u64) -> u64,
        stable: &'a [u64],
    }

    /// Two readers that look up the `stable` keys (reader `r` from index
    /// `r`, every `step`-th) until `done`, each expecting what
    /// `load_stable` set (both kinds of key); `reads` counts the lookups.
    fn spawn_stable_readers<'scope>(
        sc: &'scope std::thread::Scope<'scope, '_>,
        keys: Stable<'scope>,
        step: usize,
        done: &'scope AtomicBool,
        reads: &'scope AtomicU64,
    ) {
        let Stable { m, h, h8, stable } = keys;
        for r in 0..2 {
            sc.spawn(move || {
                let mut i = r;
                while !done.load(Ordering::Acquire) {
                    let k = stable[i % stable.len()];
                    assert_eq!(
                        m.get(h(k), Who::Other(|va| key_of(va) == k)),
                        Some(k << 8 | 1),
                        "a stable key was lost"
                    );
                    assert_eq!(
                        m.get8(h8(k)),
                        Got::Value(k << 8 | 4, !k),
                        "a stable 8-byte key was lost"
                    );
                    i += step;
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    }

    /// A hint's probe starts at `hash & mask` and visits every bucket of
    /// its table once, wrapping at the end, and never leaves the table.
    #[test]
    fn a_hint_probe_visits_each_bucket_once_and_wraps() {
        let base = 0x7f00_0000_1000usize;
        for bits in [0usize, 1, 3, 10] {
            let n = 1usize << bits;
            let hint = Hint(base | bits);
            assert_eq!(hint.mask(), n - 1);
            for h in [0u64, 5, u64::MAX, 0x1234_5678_9abc_def0] {
                let first = hint.first(h);
                assert_eq!(first, base + (h as usize & (n - 1)) * 64);
                let mut seen = std::collections::HashSet::new();
                let mut at = first;
                for _ in 0..n {
                    assert!(at >= base && at < base + n * 64, "left the table");
                    assert_eq!(at % 64, 0);
                    assert!(seen.insert(at), "bucket visited twice");
                    at = hint.next(at);
                }
                assert_eq!(at, first, "the probe wraps to where it began");
            }
        }
        // A table's own hint names its buckets.
        let t = Table::new(8, &Arc::default());
        let hint = t.hint();
        assert_eq!(hint.mask(), t.mask);
        assert_eq!(hint.first(3), t.bucket(3).as_ptr() as usize);
    }

    /// Three doubling waves of every shard, from a map sized for 64k keys:
    /// every rebuild is announced ([`PointMap::wave`]) before it, `warm_up`
    /// faults in what the rebuilds then take and no more (their frees
    /// counted), and nothing once they are done.
    #[test]
    fn warm_up_faults_in_a_wave_ahead_and_no_more() {
        const KEYS: u64 = 600_000;
        let m = PointMap::with_capacity(64 << 10, Arc::default());
        m.free_collected.store(true, Ordering::Relaxed);
        let first = m.table_bytes() as usize;
        let mut warmed = 0;
        let mut rebuilds = 0;
        for k in 1..=KEYS {
            let h = engine::hash::fmix64(k);
            let warned = m.writers[PointMap::shard(h)].counts.lock().warned;
            assert!(m.set(h, k << 8, Some(!k), Who::<fn(u64) -> bool>::Key8));
            let (n, _) = m.structural();
            if n > rebuilds {
                assert!(
                    warned.is_some_and(|net| net > 0),
                    "the rebuild at key {k} was not announced"
                );
                rebuilds = n;
            }
            if k % 512 == 0 {
                m.collect();
                warmed += m.warm_up(usize::MAX);
            }
        }
        assert_eq!(rebuilds, 3 * 1024, "three waves of every shard");
        // The first wave's old tables were the shared array, which gives
        // nothing back to the pool: it took its new tables' bytes (twice
        // the first tables'); each later wave took its old tables' bytes
        // more than it freed. Together, the last tables' bytes.
        let last = m.table_bytes() as usize;
        assert_eq!(last, 8 * first);
        assert!(warmed > last / 2, "warmed {warmed} of {last}");
        assert!(warmed <= last, "warmed {warmed} of {last}");
        // Warmed up every 512 keys, the rebuilds found their memory warm:
        // without it they would take about `last` cold.
        let cold = m.pool.cold_taken();
        assert!(cold <= last / 16, "{cold} bytes taken cold");
        assert_eq!(m.wave.load(Ordering::Relaxed), 0, "no wave pending");
        assert_eq!(m.warm_up(usize::MAX), 0);
        assert_eq!(m.warmed(), warmed as u64);
        for k in (1..=KEYS).step_by(997) {
            assert_eq!(m.get8(engine::hash::fmix64(k)), Got::Value(k << 8, !k));
        }
    }

    /// Rebuilds that only drop tombstones (deletes and new keys, the live
    /// count steady) take what they free: nothing is announced or faulted
    /// in for them.
    #[test]
    fn tombstone_rebuilds_fault_nothing_in_ahead() {
        use std::collections::VecDeque;
        let m = PointMap::with_capacity(64 << 10, Arc::default());
        m.free_collected.store(true, Ordering::Relaxed);
        let h = engine::hash::fmix64;
        let set = |k: u64| m.set(h(k), k << 8, Some(!k), Who::<fn(u64) -> bool>::Key8);
        let del = |k: u64| m.remove(h(k), Who::<fn(u64) -> bool>::Key8);
        let from_pool = |i: usize| {
            let p = m.epochs.pin();
            matches!(m.table(i, &p).1.words, Words::Block(_))
        };
        // Every shard grown once (from its part of the shared array to a
        // 256-slot table from the pool), no further: a key whose shard has
        // grown is skipped.
        let mut keys = vec![VecDeque::new(); SHARDS];
        let (mut k, mut grown) = (1u64, 0);
        while grown < SHARDS {
            let i = PointMap::shard(h(k));
            if !from_pool(i) {
                assert!(set(k));
                keys[i].push_back(k);
                grown += from_pool(i) as usize;
            }
            k += 1;
        }
        assert_eq!(m.structural().0, SHARDS as u64);
        let bytes = m.table_bytes();
        // Down to 97 keys a shard, then each new key paired with a delete
        // in its shard: its used slots climb to the rebuild, which keeps
        // the size (97 keys fit half of 256 slots).
        for q in keys.iter_mut() {
            while q.len() > 97 {
                assert!(del(q.pop_front().unwrap()));
            }
        }
        let mut warmed = 0;
        for n in 0..400_000u64 {
            let i = PointMap::shard(h(k));
            assert!(del(keys[i].pop_front().unwrap()));
            assert!(set(k));
            keys[i].push_back(k);
            k += 1;
            assert_eq!(m.wave.load(Ordering::Relaxed), 0, "after {n} pairs");
            if n % 512 == 0 {
                m.collect();
                warmed += m.warm_up(usize::MAX);
            }
        }
        let purges = m.structural().0 - SHARDS as u64;
        assert!(purges >= SHARDS as u64 / 2, "{purges} tombstone rebuilds");
        assert_eq!(m.table_bytes(), bytes, "sizes kept");
        assert_eq!(warmed, 0);
    }

    #[test]
    fn agrees_with_a_model_through_growth_deletes_and_tombstone_rebuilds() {
        let m = PointMap::with_capacity(0, Arc::default());
        let mut model: HashMap<u64, u64> = HashMap::new();
        let mut x = 7u64;
        for i in 0..200_000u64 {
            x = engine::hash::fmix64(x + i);
            let k = x % 30_000;
            let h = hash(k);
            let is = |va: u64| key_of(va) == k;
            match x >> 62 {
                0 | 1 => {
                    let va = k << 8 | (i & 0xff) | 1;
                    assert_eq!(
                        m.set(h, va, None, Who::Other(is)),
                        model.insert(k, va).is_none()
                    );
                }
                2 => assert_eq!(m.remove(h, Who::Other(is)), model.remove(&k).is_some()),
                _ => assert_eq!(m.get(h, Who::Other(is)), model.get(&k).copied()),
            }
        }
        assert_eq!(m.len(), model.len());
        let mut seen = HashMap::new();
        for i in 0..m.shards() {
            m.for_shard(i, |h, va| {
                assert_eq!(h, hash(key_of(va)));
                assert!(seen.insert(key_of(va), va).is_none(), "visited twice");
            });
        }
        assert_eq!(seen, model);
        for (k, va) in &model {
            assert_eq!(m.get(hash(*k), Who::Other(|v| key_of(v) == *k)), Some(*va));
        }
    }

    #[test]
    fn a_full_collision_is_two_keys() {
        let m = PointMap::with_capacity(10, Arc::default());
        assert!(m.set(42, 1 << 8 | 1, None, Who::Other(|va| key_of(va) == 1)));
        assert!(m.set(42, 2 << 8 | 1, None, Who::Other(|va| key_of(va) == 2)));
        assert_eq!(
            m.get(42, Who::Other(|va| key_of(va) == 2)),
            Some(2 << 8 | 1)
        );
        assert!(m.remove(42, Who::Other(|va| key_of(va) == 1)));
        assert_eq!(m.get(42, Who::Other(|va| key_of(va) == 1)), None);
        assert_eq!(
            m.get(42, Who::Other(|va| key_of(va) == 2)),
            Some(2 << 8 | 1)
        );
        assert_eq!(m.len(), 1);
    }

    /// Writers insert, update and delete their own keys while readers look
    /// up keys that stay present with a known value throughout: a reader
    /// must always find them, through every resize of every shard.
    #[test]
    fn readers_never_lose_a_stable_key_while_writers_resize() {
        let m = PointMap::with_capacity(0, Arc::default());
        let stable: Vec<u64> = (0..2_000u64).map(|i| i * 4).collect();
        load_stable(&m, hash, engine::hash::fmix64, &stable);
        let done = AtomicBool::new(false);
        let reads = AtomicU64::new(0);
        std::thread::scope(|sc| {
            let keys = Stable {
                m: &m,
                h: hash,
                h8: engine::hash::fmix64,
                stable: &stable,
            };
            spawn_stable_readers(sc, keys, 7, &done, &reads);
            let writers: Vec<_> = (0..2u64)
                .map(|w| {
                    let m = &m;
                    sc.spawn(move || {
                        // This writer's keys (4i + 2 + w: never a stable
                        // key): inserts that grow the shards, updates,
                        // then deletes that leave tombstones, four times.
                        for round in 0..4 {
                            let keys = (0..30_000u64).map(|i| 4 * i + 2 + w);
                            for k in keys.clone() {
                                let h = hash(k);
                                assert!(m.set(
                                    h,
                                    k << 8 | 2,
                                    None,
                                    Who::Other(|va| key_of(va) == k)
                                ));
                                assert!(!m.set(
                                    h,
                                    k << 8 | 3,
                                    None,
                                    Who::Other(|va| key_of(va) == k)
                                ));
                                assert_eq!(
                                    m.get(h, Who::Other(|va| key_of(va) == k)),
                                    Some(k << 8 | 3)
                                );
                            }
                            for k in keys {
                                assert!(
                                    m.remove(hash(k), Who::Other(|va| key_of(va) == k)),
                                    "round {round}"
                                );
                            }
                        }
                    })
                })
                .collect();
            // Replaced tables are freed while the readers run (as the
            // store's maintenance thread does): a reader that still held
            // one would read freed memory and lose its key.
            let collector = {
                let (m, done) = (&m, &done);
                sc.spawn(move || {
                    let mut freed = 0;
                    while !done.load(Ordering::Acquire) {
                        freed += m.collect();
                        std::thread::yield_now();
                    }
                    freed + m.collect()
                })
            };
            engine::testkit::join_then_stop(writers, &done);
            assert!(collector.join().unwrap() > 0, "no table was replaced");
        });
        assert!(reads.load(Ordering::Relaxed) > 0);
        assert_eq!(m.len(), 2 * stable.len());
    }

    /// 8-byte keys (found by hash alone, values inline or not) and other
    /// keys with the very same hashes, through growth, deletes and
    /// tombstone rebuilds: neither kind ever answers for the other.
    #[test]
    fn eight_byte_keys_and_inline_values_agree_with_a_model() {
        let m = PointMap::with_capacity(0, Arc::default());
        // key -> (v_addr, inline value)
        let mut eight: HashMap<u64, (u64, Option<u64>)> = HashMap::new();
        let mut other: HashMap<u64, u64> = HashMap::new();
        let mut x = 11u64;
        for i in 1..150_000u64 {
            x = engine::hash::fmix64(x + i);
            let k = x % 20_000;
            // An 8-byte key's hash is a bijection of it; the "other" key k
            // has the same hash as 8-byte key k.
            let h = engine::hash::fmix64(k);
            let va = (k << 20) | (i & 0xf_ffff);
            let is = |v: u64| key_of(v >> 12) == k;
            match (x >> 60, x & 1 == 0) {
                (0..=5, true) => {
                    let inline = (x & 2 == 0).then_some(x ^ k);
                    let fresh = eight.insert(k, (va, inline)).is_none();
                    assert_eq!(m.set(h, va, inline, Who::<fn(u64) -> bool>::Key8), fresh);
                }
                (0..=5, false) => {
                    let fresh = other.insert(k, va).is_none();
                    assert_eq!(m.set(h, va, None, Who::Other(is)), fresh);
                }
                (6..=8, true) => assert_eq!(
                    m.remove(h, Who::<fn(u64) -> bool>::Key8),
                    eight.remove(&k).is_some()
                ),
                (6..=8, false) => {
                    assert_eq!(m.remove(h, Who::Other(is)), other.remove(&k).is_some())
                }
                _ => {
                    let want = match eight.get(&k) {
                        None => Got::Absent,
                        Some(&(va, None)) => Got::Addr(va),
                        Some(&(va, Some(v))) => Got::Value(va, v),
                    };
                    assert_eq!(m.get8(h), want);
                    assert_eq!(
                        m.get(h, Who::<fn(u64) -> bool>::Key8),
                        eight.get(&k).map(|e| e.0)
                    );
                    assert_eq!(m.get(h, Who::Other(is)), other.get(&k).copied());
                }
            }
        }
        assert_eq!(m.len(), eight.len() + other.len());
        for (k, &(va, v)) in &eight {
            let want = v.map_or(Got::Addr(va), |v| Got::Value(va, v));
            assert_eq!(m.get8(engine::hash::fmix64(*k)), want);
        }
    }

    /// Readers of inline values race writers that update, delete and
    /// re-insert keys sharing a few buckets (so slots are reused by other
    /// keys all the time) and resize the shard: a value read is always
    /// one of the key's own, never older than the `v_addr` read with it.
    #[test]
    fn inline_values_are_never_torn_or_another_keys() {
        // v_addr and value of write `seq` of key `k` both encode (k, seq).
        let enc = |k: u64, seq: u64| (k << 28) | seq;
        // 64 keys of one shard: its table is small, so they share buckets
        // and take over each other's slots.
        let keys: Vec<u64> = (1u64..)
            .filter(|&k| PointMap::shard(engine::hash::fmix64(k)) == 7)
            .take(64)
            .collect();
        let m = PointMap::with_capacity(0, Arc::default());
        let done = AtomicBool::new(false);
        let reads = AtomicU64::new(0);
        std::thread::scope(|sc| {
            let (m, done, reads, keys) = (&m, &done, &reads, &keys);
            sc.spawn(move || {
                let mut i = 0u64;
                while !done.load(Ordering::Acquire) {
                    let k = keys[i as usize % 64];
                    i += 1;
                    match m.get8(engine::hash::fmix64(k)) {
                        Got::Value(va, v) => {
                            assert_eq!(v >> 28, k, "a value of another key");
                            assert_eq!(va >> 28, k, "a v_addr of another key");
                            assert!(
                                v & 0xfff_ffff >= va & 0xfff_ffff,
                                "a value older than its v_addr"
                            );
                            reads.fetch_add(1, Ordering::Relaxed);
                        }
                        Got::Addr(va) => panic!("key {k} lost its inline value ({va:#x})"),
                        Got::Absent => {}
                    }
                }
            });
            let writer = sc.spawn(move || {
                let mut x = 5u64;
                for seq in 1..300_000u64 {
                    x = engine::hash::fmix64(x + seq);
                    let k = keys[(x % 64) as usize];
                    let h = engine::hash::fmix64(k);
                    if x >> 61 == 0 {
                        m.remove(h, Who::<fn(u64) -> bool>::Key8);
                    } else {
                        m.set(
                            h,
                            enc(k, seq),
                            Some(enc(k, seq)),
                            Who::<fn(u64) -> bool>::Key8,
                        );
                    }
                }
            });
            sc.spawn(move || {
                while !done.load(Ordering::Acquire) {
                    m.collect();
                    std::thread::yield_now();
                }
            });
            engine::testkit::join_then_stop(vec![writer], done);
        });
        assert!(reads.load(Ordering::Relaxed) > 0);
    }

    /// One shard, rebuilt over and over by a writer that inserts and
    /// deletes, while readers look up keys that stay and a collector frees
    /// every replaced table as soon as it may: a reader that finishes a
    /// probe of a table `collect` has freed fails (unit tests mark what
    /// `collect` frees instead of freeing it).
    #[test]
    fn collected_tables_are_never_read() {
        // Top bits zero: every key of this test is in shard 0.
        fn h(k: u64) -> u64 {
            engine::hash::fmix64(k) >> SHARD_BITS
        }
        // The 8-byte keys': shard 0 too, and none shared by two keys here.
        fn h8(k: u64) -> u64 {
            engine::hash::fmix64(k ^ 0x5555) >> SHARD_BITS
        }
        let m = PointMap::with_capacity(0, Arc::default());
        let stable: Vec<u64> = (0..64u64).map(|i| i * 2).collect();
        load_stable(&m, h, h8, &stable);
        let done = AtomicBool::new(false);
        let freed = AtomicU64::new(0);
        let reads = AtomicU64::new(0);
        std::thread::scope(|sc| {
            let keys = Stable {
                m: &m,
                h,
                h8,
                stable: &stable,
            };
            spawn_stable_readers(sc, keys, 1, &done, &reads);
            {
                let (m, done, freed) = (&m, &done, &freed);
                sc.spawn(move || {
                    while !done.load(Ordering::Acquire) {
                        freed.fetch_add(m.collect() as u64, Ordering::Relaxed);
                    }
                });
            }
            let writer = {
                let m = &m;
                sc.spawn(move || {
                    let start = std::time::Instant::now();
                    let mut round = 0u64;
                    while start.elapsed() < std::time::Duration::from_millis(600) {
                        // Odd keys, never stable: a growth, then deletes
                        // whose tombstones force rebuilds.
                        for i in 0..2_000u64 {
                            let k = (round * 2_000 + i) * 2 + 1;
                            m.set(h(k), k << 8 | 2, None, Who::Other(|va| key_of(va) == k));
                        }
                        for i in 0..2_000u64 {
                            let k = (round * 2_000 + i) * 2 + 1;
                            m.remove(h(k), Who::Other(|va| key_of(va) == k));
                        }
                        round += 1;
                    }
                })
            };
            engine::testkit::join_then_stop(vec![writer], &done);
        });
        assert!(
            freed.load(Ordering::Relaxed) > 10,
            "too few tables replaced"
        );
    }
}
