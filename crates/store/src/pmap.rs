//! The DRAM point map: a concurrent hash table from a key's 64-bit hash to
//! the `v_addr` of its newest log entry. Reads take no lock and write
//! nothing; a lookup costs one cache line in the common case.
//!
//! - **Keys are not stored.** A slot holds `(hash, v_addr)`. A slot with
//!   the right hash is a candidate, and the caller confirms it against the
//!   key in the entry it names (`is`), an entry a get reads anyway. Two
//!   keys with one hash are two slots, each confirmed by its own entry, so
//!   every key works; they only cost the second a longer probe.
//! - **Shards.** The top [`SHARD_BITS`] bits of the hash pick a shard: its
//!   own table, a writer mutex and its counts. A table grows (or is
//!   rebuilt without its tombstones) under its shard's mutex, so a resize
//!   pauses one shard's writers for a small table's copy, never the map.
//! - **Tables.** Open addressing over 64-byte buckets of [`SLOTS`] slots,
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
//!   shard still has the same table: a resize copies under the mutex and
//!   publishes the new table before any write reaches it, so a read that
//!   saw the old table throughout returned what was current before the
//!   swap. Old tables are freed through `crossbeam-epoch` once no reader
//!   can hold them.
//! - **Updates** of a present key store the new `v_addr` in place (one
//!   atomic store: a reader sees the old or the new entry); deletes store
//!   [`TOMB`]. Both hold the shard mutex, so that a resize never copies a
//!   slot while it changes.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use crossbeam_epoch::{self as epoch, Atomic, Guard, Owned, Shared};

/// A slot that was never used (the whole table starts zeroed).
pub const EMPTY: u64 = 0;
/// A deleted slot: skipped by lookups, reused by inserts.
pub const TOMB: u64 = u64::MAX;
/// Slots per 64-byte bucket.
pub const SLOTS: usize = 4;
/// log2 of the shard count.
pub const SHARD_BITS: u32 = 10;
const SHARDS: usize = 1 << SHARD_BITS;
/// A table is rebuilt when an insert would take its used slots (live and
/// tombstones) past this fraction of its slots.
const MAX_USED: f64 = 0.85;
/// A rebuilt table is sized for its live slots at this load (or less).
const REBUILT_LOAD: f64 = 0.5;

#[repr(align(64))]
#[derive(Default)]
struct Bucket {
    /// Slot `s` is words `2s` (hash) and `2s + 1` (`v_addr`).
    w: [AtomicU64; 2 * SLOTS],
}

struct Table {
    mask: usize,
    buckets: Box<[Bucket]>,
}

/// Where a key is, or where it would go.
enum Probe {
    Found {
        bucket: usize,
        slot: usize,
        va: u64,
    },
    /// Absent; the first free slot of its probe and whether it is empty
    /// (not a tombstone). `None` only in a table with no free slot, which
    /// the writers never let happen.
    Absent(Option<(usize, usize, bool)>),
}

impl Table {
    fn new(buckets: usize) -> Table {
        let n = buckets.next_power_of_two().max(1);
        Table {
            mask: n - 1,
            buckets: (0..n).map(|_| Bucket::default()).collect(),
        }
    }

    fn slots(&self) -> usize {
        self.buckets.len() * SLOTS
    }

    /// The `v_addr` of the first live slot with hash `h` that `is` accepts.
    #[inline]
    fn get(&self, h: u64, is: &mut impl FnMut(u64) -> bool) -> Option<u64> {
        match self.probe(h, is) {
            Probe::Found { va, .. } => Some(va),
            Probe::Absent(_) => None,
        }
    }

    /// The slot of the key (`h`, accepted by `is`), or the first free slot
    /// of its probe (what a writer, holding the shard mutex, fills).
    /// Readers use it too: each `v_addr` is loaded (acquire) before its
    /// hash.
    #[inline]
    fn probe(&self, h: u64, is: &mut impl FnMut(u64) -> bool) -> Probe {
        let mut b = h as usize & self.mask;
        let mut free = None;
        for _ in 0..self.buckets.len() {
            let w = &self.buckets[b].w;
            let mut open = false;
            for s in 0..SLOTS {
                let va = w[2 * s + 1].load(Ordering::Acquire);
                if va == EMPTY || va == TOMB {
                    open |= va == EMPTY;
                    if free.is_none() {
                        free = Some((b, s, va == EMPTY));
                    }
                } else if w[2 * s].load(Ordering::Relaxed) == h && is(va) {
                    return Probe::Found {
                        bucket: b,
                        slot: s,
                        va,
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

    /// Fills a free slot: hash first, then `v_addr` (release), so a reader
    /// that sees the `v_addr` sees its hash.
    fn fill(&self, bucket: usize, slot: usize, h: u64, va: u64) {
        let w = &self.buckets[bucket].w;
        w[2 * slot].store(h, Ordering::Relaxed);
        w[2 * slot + 1].store(va, Ordering::Release);
    }

    /// Places a pair known to be absent, in a table no reader sees yet.
    fn place(&self, h: u64, va: u64) {
        match self.probe(h, &mut |_| false) {
            Probe::Absent(Some((b, s, _))) => self.fill(b, s, h, va),
            _ => unreachable!("a rebuilt table has room for every live slot"),
        }
    }

    fn for_each(&self, f: &mut impl FnMut(u64, u64)) {
        for bk in self.buckets.iter() {
            for s in 0..SLOTS {
                let va = bk.w[2 * s + 1].load(Ordering::Acquire);
                if va != EMPTY && va != TOMB {
                    f(bk.w[2 * s].load(Ordering::Relaxed), va);
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
}

/// A shard's writer side, one cache line each: every write locks it, so it
/// must not share a line with what readers load.
#[repr(align(64))]
#[derive(Default)]
struct Writer {
    counts: Mutex<Counts>,
    /// `Counts::live`, readable without the mutex.
    live: AtomicUsize,
}

/// A concurrent map from 64-bit hashes to `v_addr`s; see the module doc.
pub struct PointMap {
    /// Each shard's table: read by every lookup, written only when a table
    /// is replaced, so eight shards share a line.
    tables: Box<[Atomic<Table>]>,
    writers: Box<[Writer]>,
}

impl PointMap {
    /// A map sized for `capacity` keys without a resize.
    pub fn with_capacity(capacity: usize) -> PointMap {
        let per_shard = capacity.div_ceil(SHARDS);
        let buckets = ((per_shard as f64 / (MAX_USED * 0.9)) as usize).div_ceil(SLOTS);
        PointMap {
            tables: (0..SHARDS)
                .map(|_| Atomic::new(Table::new(buckets)))
                .collect(),
            writers: (0..SHARDS).map(|_| Writer::default()).collect(),
        }
    }

    /// The shard of hash `h`.
    #[inline]
    fn shard(h: u64) -> usize {
        (h >> (64 - SHARD_BITS)) as usize
    }

    /// The table of a shard (`sh`: its entry in `tables`) under `g`.
    #[inline]
    fn table<'g>(sh: &Atomic<Table>, g: &'g Guard) -> (Shared<'g, Table>, &'g Table) {
        let t = sh.load(Ordering::Acquire, g);
        // SAFETY: a shard's table is never null (set at creation, replaced
        // only by another table), and a replaced table is destroyed only
        // through `defer_destroy`, after every guard that could load it,
        // `g` included, is gone.
        (t, unsafe { t.deref() })
    }

    /// The `v_addr` of the key with hash `h` that `is` accepts (`is` gets
    /// each candidate `v_addr` of hash `h`; it may see one more than once).
    #[inline]
    pub fn get(&self, h: u64, mut is: impl FnMut(u64) -> bool) -> Option<u64> {
        let sh = &self.tables[Self::shard(h)];
        let g = epoch::pin();
        loop {
            let (t, tab) = Self::table(sh, &g);
            let r = tab.get(h, &mut is);
            // A resize meanwhile: the answer may predate a write to the new
            // table, so look again there.
            if sh.load(Ordering::Acquire, &g) == t {
                return r;
            }
        }
    }

    /// Starts loading the bucket where a lookup of `h` begins, so that a
    /// lookup after other work finds it in cache.
    #[inline]
    pub fn prefetch(&self, h: u64) {
        let sh = &self.tables[Self::shard(h)];
        let g = epoch::pin();
        let (_, tab) = Self::table(sh, &g);
        engine::sync::prefetch(&tab.buckets[h as usize & tab.mask]);
    }

    /// Sets the key (`h`, accepted by `is`) to `va`. True if it was absent.
    pub fn set(&self, h: u64, va: u64, mut is: impl FnMut(u64) -> bool) -> bool {
        assert!(va != EMPTY && va != TOMB, "v_addr {va:#x} is reserved");
        let (sh, w) = (&self.tables[Self::shard(h)], &self.writers[Self::shard(h)]);
        let mut c = w.counts.lock().expect("point map shard");
        let g = epoch::pin();
        let (_, tab) = Self::table(sh, &g);
        let (b, s, empty) = match tab.probe(h, &mut is) {
            Probe::Found { bucket, slot, .. } => {
                tab.buckets[bucket].w[2 * slot + 1].store(va, Ordering::Release);
                return false;
            }
            Probe::Absent(Some(free)) => free,
            Probe::Absent(None) => unreachable!("tables never fill up"),
        };
        if !empty || (c.used + 1) as f64 <= MAX_USED * tab.slots() as f64 {
            tab.fill(b, s, h, va);
        } else {
            let bigger = Self::rebuild(sh, &c, &g, c.live + 1);
            bigger.place(h, va);
            c.used = c.live;
        }
        c.used += empty as usize;
        c.live += 1;
        w.live.store(c.live, Ordering::Relaxed);
        true
    }

    /// Copies the live slots of `sh` into a new table sized for `want`
    /// live slots and publishes it; returns the new table. The shard's
    /// mutex is held (`_c`).
    fn rebuild<'g>(sh: &Atomic<Table>, _c: &Counts, g: &'g Guard, want: usize) -> &'g Table {
        let (old, tab) = Self::table(sh, g);
        let buckets = ((want as f64 / REBUILT_LOAD) as usize).div_ceil(SLOTS);
        let new = Table::new(buckets.max(tab.buckets.len() / 2));
        tab.for_each(&mut |h, va| new.place(h, va));
        let new = Owned::new(new).into_shared(g);
        sh.store(new, Ordering::Release);
        // SAFETY: `old` was just unlinked (the mutex keeps every other
        // writer out), so only guards that loaded it before can reach it,
        // and the destruction waits for all of them.
        unsafe { g.defer_destroy(old) };
        // SAFETY: `new` is the shard's table, freed only after `g` is gone.
        unsafe { new.deref() }
    }

    /// Removes the key (`h`, accepted by `is`). True if it was present.
    pub fn remove(&self, h: u64, mut is: impl FnMut(u64) -> bool) -> bool {
        let (sh, w) = (&self.tables[Self::shard(h)], &self.writers[Self::shard(h)]);
        let mut c = w.counts.lock().expect("point map shard");
        let g = epoch::pin();
        let (_, tab) = Self::table(sh, &g);
        let Probe::Found { bucket, slot, .. } = tab.probe(h, &mut is) else {
            return false;
        };
        tab.buckets[bucket].w[2 * slot + 1].store(TOMB, Ordering::Release);
        c.live -= 1;
        w.live.store(c.live, Ordering::Relaxed);
        true
    }

    /// Number of shards (for [`for_shard`](Self::for_shard)).
    pub fn shards(&self) -> usize {
        self.tables.len()
    }

    /// Calls `f(hash, v_addr)` for every pair of shard `i`, from one of its
    /// tables, under an epoch guard but no lock (`f` may write to the map).
    /// A pair present throughout the call is visited once; one written
    /// meanwhile may be visited with its old or its new `v_addr`, or not
    /// at all.
    pub fn for_shard(&self, i: usize, mut f: impl FnMut(u64, u64)) {
        let g = epoch::pin();
        let (_, tab) = Self::table(&self.tables[i], &g);
        tab.for_each(&mut f);
    }

    /// Live keys (a sum over the shards' counts: no walk).
    pub fn len(&self) -> usize {
        self.writers
            .iter()
            .map(|w| w.live.load(Ordering::Relaxed))
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for PointMap {
    fn drop(&mut self) {
        for sh in self.tables.iter() {
            // SAFETY: `&mut self`: no reader or writer holds this map, so
            // no guard can reach its tables; replaced tables were handed to
            // `defer_destroy` already.
            unsafe {
                let t = sh.load(Ordering::Relaxed, epoch::unprotected());
                drop(t.into_owned());
            }
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

    #[test]
    fn agrees_with_a_model_through_growth_deletes_and_tombstone_rebuilds() {
        let m = PointMap::with_capacity(0);
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
                    assert_eq!(m.set(h, va, is), model.insert(k, va).is_none());
                }
                2 => assert_eq!(m.remove(h, is), model.remove(&k).is_some()),
                _ => assert_eq!(m.get(h, is), model.get(&k).copied()),
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
            assert_eq!(m.get(hash(*k), |v| key_of(v) == *k), Some(*va));
        }
    }

    #[test]
    fn a_full_collision_is_two_keys() {
        let m = PointMap::with_capacity(10);
        assert!(m.set(42, 1 << 8 | 1, |va| key_of(va) == 1));
        assert!(m.set(42, 2 << 8 | 1, |va| key_of(va) == 2));
        assert_eq!(m.get(42, |va| key_of(va) == 2), Some(2 << 8 | 1));
        assert!(m.remove(42, |va| key_of(va) == 1));
        assert_eq!(m.get(42, |va| key_of(va) == 1), None);
        assert_eq!(m.get(42, |va| key_of(va) == 2), Some(2 << 8 | 1));
        assert_eq!(m.len(), 1);
    }

    /// Writers insert, update and delete their own keys while readers look
    /// up keys that stay present with a known value throughout: a reader
    /// must always find them, through every resize of every shard.
    #[test]
    fn readers_never_lose_a_stable_key_while_writers_resize() {
        let m = PointMap::with_capacity(0);
        let stable: Vec<u64> = (0..2_000u64).map(|i| i * 4).collect();
        for &k in &stable {
            assert!(m.set(hash(k), k << 8 | 1, |va| key_of(va) == k));
        }
        let done = AtomicBool::new(false);
        let reads = AtomicU64::new(0);
        std::thread::scope(|sc| {
            for r in 0..2 {
                let (m, done, stable, reads) = (&m, &done, &stable, &reads);
                sc.spawn(move || {
                    let mut i = r;
                    while !done.load(Ordering::Acquire) {
                        let k = stable[i % stable.len()];
                        assert_eq!(m.get(hash(k), |va| key_of(va) == k), Some(k << 8 | 1));
                        i += 7;
                        reads.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
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
                                assert!(m.set(h, k << 8 | 2, |va| key_of(va) == k));
                                assert!(!m.set(h, k << 8 | 3, |va| key_of(va) == k));
                                assert_eq!(m.get(h, |va| key_of(va) == k), Some(k << 8 | 3));
                            }
                            for k in keys {
                                assert!(m.remove(hash(k), |va| key_of(va) == k), "round {round}");
                            }
                        }
                    })
                })
                .collect();
            engine::testkit::join_then_stop(writers, &done);
        });
        assert!(reads.load(Ordering::Relaxed) > 0);
        assert_eq!(m.len(), stable.len());
    }
}
