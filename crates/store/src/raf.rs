//! The RAF (remote-access-first) cache: a DRAM hash table of hot items
//! whose replacement favours items that are expensive to read, i.e. remote.
//!
//! - **Buckets** of [`WAYS`] items behind one small lock each. An item holds
//!   key, value, the `v_addr` it was read from (gap F6), its node (where the
//!   newest copy lives, D6) and its TF.
//! - **TF (Eq. 2)** in integer tenths: a local access adds 10, a remote one
//!   `round(10 × remote/local latency)` (16 for the paper's 1.59). When an
//!   add would overflow 16 bits, every TF in the bucket is halved.
//! - **Sampling:** every 32nd get of a thread updates TF on a hit, or
//!   admits the item on a miss, replacing the coldest item of its bucket
//!   (D4, D5: admission is unconditional, the new TF is the access weight).
//!   Other gets only probe.
//! - **Writes keep items current:** an update replaces the cached value,
//!   `v_addr` and node; a delete drops the item. They run after the index
//!   update under the bucket lock, and a fill inserts only if the index
//!   still names the `v_addr` it read, checked under the same lock, so a
//!   fill can never install a value a write has replaced (F6).
//! - **Auto-disable (D7)** at the end of each window of operations:
//!   gets < 10% of operations (write-heavy), hits < 10% of gets, or every
//!   sampled full bucket's TFs within 25% of each other (uniform). The
//!   window ends on whichever operation crosses it, get or write (a
//!   window that only gets could end left a write-only load paying for
//!   the cache forever).
//! - **Off is off.** While disabled, writes skip the cache entirely (a
//!   write-heavy load was paying a bucket lock and an item update per
//!   write: 17% of pipelined SETs' time after a read phase). Items then go
//!   stale, so every re-enable starts a new *generation*, and only items
//!   filled or updated in the current one are served: the rest count as
//!   misses and are refreshed by fills. While disabled, the sampled gets
//!   (1 in 32) still probe and fill, as a shadow that is never served:
//!   their hits tell the next window whether skew has returned. The
//!   argument that no stale item is ever served is at
//!   [`Raf::writes_may_skip`].
//! - Only items whose key and value total at most [`MAX_ITEM`] bytes are
//!   cached; larger values are read from the log every time.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use engine::sync::Counter;

pub(crate) const WAYS: usize = 4;
pub(crate) const MAX_ITEM: usize = 256;
const SAMPLE: u32 = 32;
const LOCAL_WEIGHT: u32 = 10;
/// Estimated DRAM bytes per item (key and value boxes, fields, slack).
const ITEM_BYTES: u64 = 96;

struct Item {
    /// The key, then the value: one allocation, one cache miss.
    data: Box<[u8]>,
    klen: u32,
    vaddr: u64,
    node: u32,
    tf: u16,
    /// The generation it was filled or last updated in (0: a shadow item,
    /// filled while the cache was off, never served).
    gen: u64,
}

impl Item {
    fn new(key: &[u8], value: &[u8], vaddr: u64, node: u32, tf: u16, gen: u64) -> Item {
        let mut data = Vec::with_capacity(key.len() + value.len());
        data.extend_from_slice(key);
        data.extend_from_slice(value);
        Item {
            data: data.into(),
            klen: key.len() as u32,
            vaddr,
            node,
            tf,
            gen,
        }
    }

    fn key(&self) -> &[u8] {
        &self.data[..self.klen as usize]
    }

    fn value(&self) -> &[u8] {
        &self.data[self.klen as usize..]
    }
}

/// `tags[i]` is 16 bits of the hash of `items[i]`'s key (never 0), or 0
/// for an empty way: a probe reads the item (another cache line) only when
/// its tag matches.
#[derive(Default)]
struct Bucket {
    tags: [u16; WAYS],
    items: [Option<Item>; WAYS],
}

fn tag(hash: u64) -> u16 {
    (hash >> 48) as u16 | 1
}

impl Bucket {
    fn find(&self, hash: u64, key: &[u8]) -> Option<usize> {
        let t = tag(hash);
        (0..WAYS).find(|&i| {
            self.tags[i] == t && self.items[i].as_ref().is_some_and(|it| it.key() == key)
        })
    }

    fn clear(&mut self, i: usize) {
        self.tags[i] = 0;
        self.items[i] = None;
    }
}

pub(crate) struct Raf {
    /// Allocated at first use: 64 MiB of buckets cost an open ~12 ms of
    /// page faults otherwise.
    buckets: std::sync::OnceLock<Box<[Mutex<Bucket>]>>,
    /// Set (forever) by the first fill: until then writes have no item to
    /// keep current and skip the cache.
    filled: AtomicBool,
    n: usize,
    remote_weight: u32,
    enabled: AtomicBool,
    /// The current generation (from 1), bumped before every re-enable.
    gen: AtomicU64,
    window: u64,
    ops: Counter,
    gets: Counter,
    sampled_gets: Counter,
    sampled_hits: Counter,
    hits: Counter,
    next_window: AtomicU64,
    pub disables: AtomicU64,
    pub enables: AtomicU64,
}

thread_local! {
    static TICK: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// True for every [`SAMPLE`]th call on this thread (gets and writes share
/// the count).
#[inline]
fn tick() -> bool {
    TICK.with(|t| {
        let v = t.get().wrapping_add(1);
        t.set(v);
        v % SAMPLE == 0
    })
}

/// What a probe found.
pub(crate) enum Probe {
    /// The cached value (copied out).
    Hit(Vec<u8>),
    /// Not cached; `fill` after reading the log when `sampled`.
    Miss { sampled: bool },
    /// The cache is off for this get.
    Off,
}

/// A key's value as a read found it in the log: what [`Raf::fill`] admits.
#[derive(Clone, Copy)]
pub(crate) struct LogRead<'a> {
    pub key: &'a [u8],
    /// `key_hash(key)`.
    pub hash: u64,
    pub value: &'a [u8],
    /// `v_addr` of the entry the value was read from.
    pub vaddr: u64,
    /// The node whose log holds the entry.
    pub node: u32,
}

impl Raf {
    /// `bytes` 0 makes a cache that is never used.
    pub(crate) fn new(bytes: u64, remote_ratio: f64, window: u64) -> Raf {
        let n = if bytes == 0 {
            0
        } else {
            (bytes / (ITEM_BYTES * WAYS as u64)).max(1)
        };
        Raf {
            buckets: std::sync::OnceLock::new(),
            filled: AtomicBool::new(false),
            n: n as usize,
            remote_weight: (LOCAL_WEIGHT as f64 * remote_ratio.max(1.0)).round() as u32,
            enabled: AtomicBool::new(n > 0),
            gen: AtomicU64::new(1),
            window: window.max(1024),
            ops: Counter::default(),
            gets: Counter::default(),
            sampled_gets: Counter::default(),
            sampled_hits: Counter::default(),
            hits: Counter::default(),
            next_window: AtomicU64::new(window.max(1024)),
            disables: AtomicU64::new(0),
            enables: AtomicU64::new(0),
        }
    }

    pub(crate) fn exists(&self) -> bool {
        self.n > 0
    }

    /// True when a write has no served item to keep current: nothing was
    /// ever filled, or the cache is off. The caller holds the key's stripe,
    /// and may ask before or after its index change.
    ///
    /// Why skipping while off never lets a stale item be served: every
    /// fill holds the key's stripe ([`fill`](Self::fill)'s caller
    /// try-locks it), so a fill of the key runs wholly before or wholly
    /// after the write W. A fill before W that stamped its item read
    /// `enabled` and `gen` then; if W reads `false` (or no `filled`), the
    /// cache was switched off (or never filled) after that fill, and a
    /// re-enable bumps `gen` before it stores `enabled = true`, so the
    /// item is of an older generation and never served. A fill after W
    /// finds W's index change and refuses the old value. A probe serves an
    /// item only if, under the bucket lock, `enabled` holds and the item's
    /// generation is the current one. (Writes of one key are serialised by
    /// the stripe, so an update stamps the current generation on a value
    /// nothing newer has replaced.) A `SeqCst` fence on both sides would
    /// also exclude them, but in a write it comes right after the entry's
    /// flush and waits for its write-back.
    #[inline]
    pub(crate) fn writes_may_skip(&self) -> bool {
        !self.exists()
            || !self.filled.load(Ordering::Acquire)
            || !self.enabled.load(Ordering::Acquire)
    }

    pub(crate) fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    pub(crate) fn capacity_items(&self) -> u64 {
        self.n as u64 * WAYS as u64
    }

    fn table(&self) -> &[Mutex<Bucket>] {
        self.buckets
            .get_or_init(|| (0..self.n).map(|_| Mutex::new(Bucket::default())).collect())
    }

    #[inline]
    fn bucket(&self, hash: u64) -> &Mutex<Bucket> {
        let i = ((hash as u32 as u64) * self.n as u64) >> 32;
        &self.table()[i as usize]
    }

    fn weight(&self, item_node: u32, here: u32) -> u32 {
        if item_node == here {
            LOCAL_WEIGHT
        } else {
            self.remote_weight
        }
    }

    /// Counts a non-get operation (for the write-heavy signal).
    #[inline]
    pub(crate) fn note_op(&self) {
        if self.exists() {
            self.ops.add(1);
            if tick() {
                self.maybe_end_window();
            }
        }
    }

    pub(crate) fn probe(&self, key: &[u8], hash: u64, here: u32) -> Probe {
        if !self.exists() {
            return Probe::Off;
        }
        self.ops.add(1);
        self.gets.add(1);
        let sampled = tick();
        if sampled {
            self.sampled_gets.add(1);
            self.maybe_end_window();
        }
        if !self.is_enabled() && !sampled {
            return Probe::Off;
        }
        let mut b = self.bucket(hash).lock().expect("raf bucket");
        let w = &mut *b;
        let Some(pos) = w.find(hash, key) else {
            return Probe::Miss { sampled };
        };
        let it = w.items[pos].as_ref().expect("found");
        // Read under the bucket lock (see `writes_may_skip`).
        let on = self.enabled.load(Ordering::SeqCst);
        let current = on && it.gen == self.gen.load(Ordering::SeqCst);
        if sampled && (current || !on) {
            // A shadow hit while off counts for the next window's verdict.
            self.sampled_hits.add(1);
            let add = self.weight(it.node, here);
            bump(&mut w.items, pos, add);
        }
        if !current {
            return Probe::Miss { sampled };
        }
        self.hits.add(1);
        Probe::Hit(w.items[pos].as_ref().expect("found").value().to_vec())
    }

    /// Admits an item read from the log at `r.vaddr` (after a sampled miss)
    /// if `still_current()` — the index still names `vaddr` — holds under
    /// the bucket lock. The caller holds the key's stripe (see
    /// [`writes_may_skip`](Self::writes_may_skip)).
    pub(crate) fn fill(&self, r: &LogRead<'_>, here: u32, still_current: impl FnOnce() -> bool) {
        let LogRead {
            key,
            hash,
            value,
            vaddr,
            node,
        } = *r;
        if !self.exists() || key.len() + value.len() > MAX_ITEM {
            return;
        }
        let mut b = self.bucket(hash).lock().expect("raf bucket");
        // The caller holds the key's stripe: a writer of the key that
        // takes it later sees `filled` (see `writes_may_skip`).
        self.filled.store(true, Ordering::Release);
        // `enabled`, then `gen`, then the index (see `writes_may_skip`).
        let on = self.enabled.load(Ordering::Acquire);
        let gen = if on {
            self.gen.load(Ordering::Acquire)
        } else {
            0
        };
        let found = b.find(hash, key);
        if let Some(i) = found {
            // Current already, or a shadow item (off): nothing to refresh.
            if !on || b.items[i].as_ref().is_some_and(|it| it.gen == gen) {
                return;
            }
        }
        if !still_current() {
            return;
        }
        let (slot, tf) = match found {
            // A stale item of this key: refreshed in place, its TF kept.
            Some(i) => (i, b.items[i].as_ref().map_or(0, |it| it.tf)),
            None => {
                let slot = match b.items.iter().position(|it| it.is_none()) {
                    Some(s) => s,
                    None => (0..WAYS)
                        .min_by_key(|&i| b.items[i].as_ref().map_or(0, |it| it.tf))
                        .expect("WAYS > 0"),
                };
                (slot, self.weight(node, here) as u16)
            }
        };
        b.tags[slot] = tag(hash);
        b.items[slot] = Some(Item::new(key, value, vaddr, node, tf, gen));
    }

    /// Starts loading the bucket a write of `hash` will lock (its lock and
    /// tags), so that a batch overlaps those misses; nothing when writes
    /// skip the cache (before the first fill, or while it is off).
    #[inline]
    pub(crate) fn prefetch(&self, hash: u64) {
        if self.exists() && self.filled.load(Ordering::Relaxed) && self.is_enabled() {
            engine::sync::prefetch(self.bucket(hash));
        }
    }

    /// A write made `vaddr` (on `node`) the key's newest entry with `value`.
    pub(crate) fn update(&self, key: &[u8], hash: u64, value: &[u8], vaddr: u64, node: u32) {
        if self.writes_may_skip() {
            return;
        }
        let mut b = self.bucket(hash).lock().expect("raf bucket");
        if let Some(i) = b.find(hash, key) {
            if key.len() + value.len() > MAX_ITEM {
                b.clear(i);
            } else if let Some(it) = b.items[i].as_mut() {
                // The newest value of the key (writes of a key are
                // serialised), so current in the current generation.
                let tf = it.tf;
                *it = Item::new(key, value, vaddr, node, tf, self.gen.load(Ordering::SeqCst));
            }
        }
    }

    /// Drops `key` (deleted, or relocated by GC when `vaddr` matches).
    pub(crate) fn remove(&self, key: &[u8], hash: u64) {
        if self.writes_may_skip() {
            return;
        }
        let mut b = self.bucket(hash).lock().expect("raf bucket");
        if let Some(i) = b.find(hash, key) {
            b.clear(i);
        }
    }

    /// GC moved the key's entry from `old` to `new` (same value).
    pub(crate) fn relocate(&self, key: &[u8], hash: u64, old: u64, new: u64, node: u32) {
        if self.writes_may_skip() {
            return;
        }
        let mut b = self.bucket(hash).lock().expect("raf bucket");
        if let Some(i) = b.find(hash, key) {
            if let Some(it) = b.items[i].as_mut().filter(|it| it.vaddr == old) {
                it.vaddr = new;
                it.node = node;
            }
        }
    }

    fn maybe_end_window(&self) {
        let ops = self.ops.get().max(0) as u64;
        let due = self.next_window.load(Ordering::Relaxed);
        if ops < due
            || self
                .next_window
                .compare_exchange(due, ops + self.window, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let gets = self.gets.get().max(0) as u64;
        let sg = self.sampled_gets.get().max(0) as u64;
        let sh = self.sampled_hits.get().max(0) as u64;
        for c in [
            &self.ops,
            &self.gets,
            &self.sampled_gets,
            &self.sampled_hits,
        ] {
            c.set(0);
        }
        self.next_window.store(self.window, Ordering::Relaxed);
        let write_heavy = gets * 10 < ops;
        let low_hits = sg >= 16 && sh * 10 < sg;
        let on = !(write_heavy || low_hits || self.uniform());
        // One thread per window gets here (the exchange above).
        let was = self.enabled.load(Ordering::Relaxed);
        if was && !on {
            self.enabled.store(false, Ordering::SeqCst);
            self.disables.fetch_add(1, Ordering::Relaxed);
        } else if !was && on {
            // A new generation before anyone can see the cache on: what
            // writes skipped while it was off is never served.
            self.gen.fetch_add(1, Ordering::SeqCst);
            self.enabled.store(true, Ordering::SeqCst);
            self.enables.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The "similar TF in every bucket" signal, over a sample of buckets.
    fn uniform(&self) -> bool {
        let n = self.n;
        let Some(buckets) = self.buckets.get() else {
            return false;
        };
        let mut full = 0;
        for k in 0..64usize {
            let i = k.wrapping_mul(0x9e37_79b9) % n;
            let Ok(b) = buckets[i].try_lock() else {
                continue;
            };
            let tfs: Vec<u16> = b.items.iter().flatten().map(|it| it.tf).collect();
            if tfs.len() < WAYS {
                continue;
            }
            full += 1;
            let (lo, hi) = (*tfs.iter().min().unwrap(), *tfs.iter().max().unwrap());
            if (hi as u32) * 4 > (lo as u32) * 5 {
                return false;
            }
        }
        full >= 8
    }

    pub(crate) fn stats(&self) -> (u64, u64) {
        (self.hits.get().max(0) as u64, self.capacity_items())
    }
}

fn bump(items: &mut [Option<Item>; WAYS], pos: usize, add: u32) {
    let cur = items[pos].as_ref().map_or(0, |i| i.tf) as u32;
    if cur + add > u16::MAX as u32 {
        for it in items.iter_mut().flatten() {
            it.tf /= 2;
        }
    }
    if let Some(it) = items[pos].as_mut() {
        it.tf = (it.tf as u32 + add).min(u16::MAX as u32) as u16;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `value` of `key` (hash `hash`) read from `vaddr` on `node`.
    fn read<'a>(key: &'a [u8], hash: u64, value: &'a [u8], vaddr: u64, node: u32) -> LogRead<'a> {
        LogRead {
            key,
            hash,
            value,
            vaddr,
            node,
        }
    }

    #[test]
    fn fill_hit_update_remove() {
        let r = Raf::new(1 << 20, 1.59, 1 << 20);
        assert!(matches!(r.probe(b"k", 7, 0), Probe::Miss { .. }));
        r.fill(&read(b"k", 7, b"v1", 100, 1), 0, || true);
        match r.probe(b"k", 7, 0) {
            Probe::Hit(v) => assert_eq!(v, b"v1"),
            _ => panic!("expected a hit"),
        }
        r.update(b"k", 7, b"v2", 200, 0);
        match r.probe(b"k", 7, 0) {
            Probe::Hit(v) => assert_eq!(v, b"v2"),
            _ => panic!("expected a hit"),
        }
        r.remove(b"k", 7);
        assert!(matches!(r.probe(b"k", 7, 0), Probe::Miss { .. }));
        // A fill whose v_addr is no longer current is refused.
        r.fill(&read(b"k", 7, b"old", 100, 0), 0, || false);
        assert!(matches!(r.probe(b"k", 7, 0), Probe::Miss { .. }));
    }

    #[test]
    fn coldest_item_is_replaced_and_remote_weighs_more() {
        let r = Raf::new(ITEM_BYTES * WAYS as u64, 1.59, 1 << 20);
        assert_eq!(r.capacity_items(), WAYS as u64);
        for i in 0..WAYS as u8 {
            // Node 1 while the reader is on node 0: remote, weight 16.
            let node = if i == 0 { 0 } else { 1 };
            r.fill(&read(&[i], 1, b"v", i as u64, node), 0, || true);
        }
        r.fill(&read(b"new", 1, b"v", 99, 0), 0, || true);
        // The local item (TF 10) went, the remote ones (TF 16) stayed.
        assert!(matches!(r.probe(&[0], 1, 0), Probe::Miss { .. }));
        assert!(matches!(r.probe(&[1], 1, 0), Probe::Hit(_)));
    }

    #[test]
    fn tf_overflow_halves_the_bucket() {
        let mut items: [Option<Item>; WAYS] = Default::default();
        for (i, it) in items.iter_mut().enumerate() {
            *it = Some(Item::new(
                &[i as u8],
                &[],
                0,
                0,
                if i == 0 { u16::MAX - 1 } else { 100 },
                1,
            ));
        }
        bump(&mut items, 0, 16);
        assert_eq!(items[1].as_ref().unwrap().tf, 50);
        assert_eq!(items[0].as_ref().unwrap().tf, (u16::MAX - 1) / 2 + 16);
    }

    /// Gets of one key whose value in the log is `v`, enough for whole
    /// windows of 1024 operations; sampled misses fill, as the store does.
    fn read_phase(r: &Raf, k: &[u8], v: &[u8]) {
        for _ in 0..4096 {
            match r.probe(k, 9, 0) {
                Probe::Hit(got) => assert_eq!(got, v, "a stale value was served"),
                Probe::Miss { sampled: true } => r.fill(&read(k, 9, v, 200, 0), 0, || true),
                _ => {}
            }
        }
    }

    #[test]
    fn writes_skip_an_off_cache_and_what_they_skipped_is_never_served() {
        let r = Raf::new(1 << 20, 1.59, 1024);
        r.fill(&read(b"k", 9, b"v1", 100, 0), 0, || true);
        assert!(matches!(r.probe(b"k", 9, 0), Probe::Hit(v) if v == b"v1"));
        // A write-only window turns the cache off (writes end windows too).
        for _ in 0..4096 {
            r.note_op();
        }
        assert!(!r.is_enabled(), "a write-only window left the cache on");
        // This write skips the cache: the item still holds v1.
        r.update(b"k", 9, b"v2", 200, 0);
        // Reads come back (one hot key) and turn the cache on again; v1,
        // which the write skipped, is never served (a miss until a fill
        // refreshes the item with v2).
        read_phase(&r, b"k", b"v2");
        assert!(
            r.is_enabled(),
            "a read-only window of one hot key left it off"
        );
        assert!(r.enables.load(Ordering::Relaxed) >= 1);
        assert!(matches!(r.probe(b"k", 9, 0), Probe::Hit(v) if v == b"v2"));
        // Writes while it is on keep the item current.
        r.update(b"k", 9, b"v3", 300, 0);
        assert!(matches!(r.probe(b"k", 9, 0), Probe::Hit(v) if v == b"v3"));
    }

    #[test]
    fn write_heavy_window_disables() {
        let r = Raf::new(1 << 20, 1.59, 1024);
        for _ in 0..20_000 {
            r.note_op();
        }
        for i in 0..2048u64 {
            let _ = r.probe(&i.to_le_bytes(), i, 0);
        }
        assert!(!r.is_enabled(), "gets were under 10% of operations");
        assert!(r.disables.load(Ordering::Relaxed) >= 1);
    }
}
