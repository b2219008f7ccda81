//! The DRAM index: key → `v_addr` of the key's newest entry, in two parts.
//!
//! - **Point index**: [`PointMap`](crate::point_map::PointMap), a concurrent
//!   hash table of (key hash, `v_addr`) with lock-free reads: a point
//!   operation costs one cache miss in DRAM, not a tree descent. It holds
//!   no keys; a candidate is confirmed against the key in the log entry it
//!   names ([`Keys`]), which a get reads anyway.
//! - **Ordered index**: the set of keys in a concurrent skip list
//!   (a `crossbeam-skiplist` set), for scans. It holds keys only; a scan reads each
//!   key's `v_addr` from the point index, so updates never touch the tree.
//!   Inserts and deletes reach it through per-stripe change queues that a
//!   background thread applies, and a scan first applies whatever is still
//!   queued (so it sees every write that completed before it began). The
//!   tree is built from the point index by the first scan (option a), or by
//!   the background thread right after open (option c, `eager`); until a
//!   build starts, writers queue nothing.
//!
//! Changes of one key are queued in one queue (picked by the key's hash),
//! under the key's stripe lock, so they are applied in the order they
//! happened. Writers of one key are serialised by the stripes
//! ([`Index::stripes`]); the tree build takes them all once to start
//! queueing (see `push`).

use std::hash::{Hash, Hasher};
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_skiplist::SkipSet;
use engine::sync::Stripes;
use pmem::Pool;

use crate::epoch::{Epochs, Pin};
use crate::layout::{key_hash, vaddr_off};
use crate::point_map::{Got, PointMap, Reserved, Who};

const INLINE: usize = 23;
const QUEUES: usize = 64;
/// Key stripes (see [`Index::stripes`]).
const STRIPES: usize = 4096;
/// A queue this long asks the background thread to apply it.
const NUDGE: usize = 1 << 12;

/// A key as the index holds it: up to 23 bytes inline (the 8-byte fast
/// path allocates nothing), longer keys boxed.
#[derive(Clone)]
pub(crate) enum IKey {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<[u8]>),
}

impl IKey {
    pub(crate) fn new(key: &[u8]) -> IKey {
        if key.len() <= INLINE {
            let mut bytes = [0u8; INLINE];
            bytes[..key.len()].copy_from_slice(key);
            IKey::Inline {
                len: key.len() as u8,
                bytes,
            }
        } else {
            IKey::Heap(key.into())
        }
    }

    #[inline]
    pub(crate) fn as_bytes(&self) -> &[u8] {
        match self {
            IKey::Inline { len, bytes } => &bytes[..*len as usize],
            IKey::Heap(b) => b,
        }
    }
}

impl PartialEq for IKey {
    fn eq(&self, o: &Self) -> bool {
        self.as_bytes() == o.as_bytes()
    }
}
impl Eq for IKey {}
impl PartialOrd for IKey {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for IKey {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.as_bytes().cmp(o.as_bytes())
    }
}
impl Hash for IKey {
    // Must equal `[u8]`'s hash: lookups pass `&[u8]`.
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.as_bytes().hash(h)
    }
}
impl std::borrow::Borrow<[u8]> for IKey {
    fn borrow(&self) -> &[u8] {
        self.as_bytes()
    }
}

/// Where the DRAM point map's keys are: in the log entries it names.
pub(crate) enum Keys {
    /// The store's log, read under its epochs (a file is freed only when
    /// no pinned reader can still hold an address in it).
    Log {
        pool: Arc<Pool>,
        epochs: Arc<Epochs>,
    },
    /// Unit tests: each `v_addr`'s key, in DRAM.
    #[cfg(test)]
    Table(Mutex<std::collections::HashMap<u64, Vec<u8>>>),
}

/// Keeps the log's files mapped while held (see [`Keys::pin`]).
pub(crate) enum KeysPin<'a> {
    Log(#[allow(dead_code)] crate::epoch::Pin<'a>),
    #[cfg(test)]
    None,
}

impl Keys {
    /// Pins the log: every `v_addr` read from the point map while the pin
    /// is held stays readable until it is dropped.
    #[inline]
    fn pin(&self) -> KeysPin<'_> {
        match self {
            Keys::Log { epochs, .. } => KeysPin::Log(epochs.pin()),
            #[cfg(test)]
            Keys::Table(_) => KeysPin::None,
        }
    }

    /// Whether the entry at `va` is `key`'s. The caller holds a pin.
    #[inline]
    fn is(&self, va: u64, key: &[u8]) -> bool {
        match self {
            Keys::Log { pool, .. } => crate::nlog::entry_key_is(pool, vaddr_off(va), key),
            #[cfg(test)]
            Keys::Table(t) => t.lock().unwrap().get(&va).is_some_and(|k| k == key),
        }
    }

    /// Starts loading the lines of the entry at `va` that [`is`](Self::is)
    /// reads (its lengths word and its key's first bytes).
    #[inline]
    fn prefetch(&self, va: u64) {
        match self {
            Keys::Log { pool, .. } => {
                let off = vaddr_off(va);
                pool.prefetch(off + 8);
                pool.prefetch(off + crate::layout::ENTRY_HEADER);
            }
            #[cfg(test)]
            Keys::Table(_) => {}
        }
    }

    /// The key of the entry at `va` into `buf`; false if it cannot be
    /// read. The caller holds a pin.
    fn read(&self, va: u64, buf: &mut Vec<u8>) -> bool {
        match self {
            Keys::Log { pool, .. } => crate::nlog::entry_key(pool, vaddr_off(va), buf),
            #[cfg(test)]
            Keys::Table(t) => match t.lock().unwrap().get(&va) {
                Some(k) => {
                    buf.clear();
                    buf.extend_from_slice(k);
                    true
                }
                None => false,
            },
        }
    }
}

/// How the DRAM point map recognises `key`: an 8-byte key by its hash
/// (a bijection on 8-byte keys), any other by the key in its entry.
#[inline]
fn who<'a>(keys: &'a Keys, key: &'a [u8]) -> Who<impl FnMut(u64) -> bool + 'a> {
    if key.len() == 8 {
        Who::Key8
    } else {
        Who::Other(move |va| keys.is(va, key))
    }
}

#[derive(Default)]
struct Queue {
    pending: Mutex<Vec<(IKey, bool)>>,
    /// Held while a drained batch is applied, so batches of one queue are
    /// applied in order.
    apply: Mutex<()>,
    pushed: AtomicU64,
    applied: AtomicU64,
}

/// Where point lookups go.
pub(crate) enum Point {
    /// A DRAM hash table, rebuilt at every open (option (a)), and where
    /// its keys are.
    Dram(PointMap, Keys),
    /// A persistent hash engine in the pool (options (b) and (c)).
    Engine(crate::pindex::PIndex),
}

/// A write's hold on its key in the point index, from before its log
/// entry is durable until the index names it: see [`Index::reserve`].
pub(crate) enum Held<'a> {
    /// The DRAM point map's slot, its shard locked.
    Dram(Reserved<'a>),
    /// The persistent index: the key's `v_addr` as read (the caller's
    /// stripe keeps it current).
    Engine(Option<u64>),
}

impl Held<'_> {
    /// The length of the key's current entry when the index knows it
    /// without reading the entry: an 8-byte key whose 8-byte value the
    /// DRAM point index holds inline.
    pub(crate) fn current_len(&self) -> Option<u64> {
        match self {
            Held::Dram(r) if r.current_is_val8() => Some(crate::layout::entry_len(8, 8)),
            _ => None,
        }
    }

    /// The key's `v_addr` now (`None`: absent).
    pub(crate) fn current(&self) -> Option<u64> {
        match self {
            Held::Dram(r) => r.current(),
            Held::Engine(v) => *v,
        }
    }
}

/// Appends an OVF entry for a hash slot (see `pindex`).
pub(crate) type OvfFn<'a> = &'a mut dyn FnMut(u64, &[u8]) -> engine::Result<u64>;

pub(crate) struct Index {
    point: Point,
    /// Key locks by hash: writers of one key are serialised by its stripe,
    /// held from before the key's lookup until its index change (and its
    /// queueing, and its cache update) is done. The tree build takes them
    /// all once (see [`build_tree`](Self::build_tree)), and a cache fill
    /// holds one (see `Raf::writes_may_skip`).
    pub stripes: Stripes,
    /// `None`: no ordered index (option (b)); scans are refused.
    tree: Option<SkipSet<IKey>>,
    queues: Box<[Queue]>,
    /// The tree has been built from the point index.
    built: AtomicBool,
    /// A build has started: from now on writers queue their changes.
    building: AtomicBool,
    build_lock: Mutex<()>,
    /// Build the tree right after open (option c) rather than at the first
    /// scan (option a).
    pub eager: bool,
    /// Set when a queue grew past `NUDGE`.
    pub nudge: AtomicBool,
    /// 8-byte values of 8-byte keys are kept in the DRAM point index.
    inline: bool,
}

/// One key's new newest version, as a write hands it to the index and
/// the cache.
#[derive(Clone, Copy)]
pub(crate) struct KeyChange<'a> {
    pub key: &'a [u8],
    /// `key_hash(key)`.
    pub hash: u64,
    /// `v_addr` of the entry that makes the change (for a delete: the
    /// `del` entry, or the entry marked invalid in place).
    pub va: u64,
    /// The new value, `None` for a delete.
    pub value: Option<&'a [u8]>,
}

impl Index {
    /// A DRAM point index over `keys` (`engine` None) or a persistent one,
    /// with or without the ordered tree.
    pub(crate) fn new(
        engine: Option<crate::pindex::PIndex>,
        keys: Keys,
        ordered: bool,
        eager: bool,
        capacity: usize,
        inline: bool,
    ) -> Index {
        Index {
            point: match engine {
                None => {
                    let epochs = match &keys {
                        Keys::Log { epochs, .. } => epochs.clone(),
                        #[cfg(test)]
                        Keys::Table(_) => Arc::default(),
                    };
                    Point::Dram(PointMap::with_capacity(capacity, epochs), keys)
                }
                Some(p) => Point::Engine(p),
            },
            stripes: Stripes::new(STRIPES),
            tree: ordered.then(SkipSet::new),
            queues: (0..QUEUES).map(|_| Queue::default()).collect(),
            built: AtomicBool::new(false),
            building: AtomicBool::new(false),
            build_lock: Mutex::new(()),
            eager,
            nudge: AtomicBool::new(false),
            inline,
        }
    }

    pub(crate) fn point(&self) -> &Point {
        &self.point
    }

    /// The point index's structural changes, the nanoseconds spent in
    /// them, and its DRAM bytes: the DRAM map's table rebuilds and tables,
    /// or the persistent engine's own figures (`Stats`).
    pub(crate) fn structural(&self) -> (u64, u64, u64) {
        match &self.point {
            Point::Dram(m, _) => {
                let (n, ns) = m.structural();
                (n, ns, m.table_bytes())
            }
            Point::Engine(p) => {
                let s = p.engine.stats();
                (s.structural_changes, s.structural_nanos, s.dram_bytes)
            }
        }
    }

    pub(crate) fn is_persistent(&self) -> bool {
        matches!(self.point, Point::Engine(_))
    }

    /// The `v_addr` of `key`'s newest entry.
    #[inline]
    pub(crate) fn get(&self, key: &[u8]) -> Option<u64> {
        self.get_hashed(key, key_hash(key))
    }

    /// [`get_hashed`](Self::get_hashed) as a read needs it: a persistent
    /// index's slot that names no well-formed entry of its hash is an
    /// `Err(Corrupt)`, not a miss (see [`PIndex::lookup`](crate::pindex::PIndex::lookup)).
    #[inline]
    pub(crate) fn lookup(&self, key: &[u8], hash: u64) -> engine::Result<Option<u64>> {
        match &self.point {
            Point::Dram(..) => Ok(self.get_hashed(key, hash)),
            Point::Engine(p) => p.lookup(key, hash),
        }
    }

    /// Starts loading what a lookup of `hash` reads first (the DRAM point
    /// index's bucket), for a caller with other work to do before it.
    #[inline]
    pub(crate) fn prefetch(&self, hash: u64) {
        if let Point::Dram(m, _) = &self.point {
            m.prefetch(hash);
        }
    }

    /// [`prefetch`](Self::prefetch) for a write of `hash`, which also
    /// starts loading the two lock lines it takes first (the key's stripe
    /// and its point-map shard's): with keys spread over them by hash,
    /// another writer last wrote either about as often as there are other
    /// writers.
    #[inline]
    pub(crate) fn prefetch_write(&self, hash: u64) {
        self.stripes.prefetch(hash);
        if let Point::Dram(m, _) = &self.point {
            m.prefetch(hash);
            m.prefetch_writer(hash);
        }
    }

    /// [`get`](Self::get) for a caller that has `key_hash(key)`.
    #[inline]
    pub(crate) fn get_hashed(&self, key: &[u8], hash: u64) -> Option<u64> {
        match &self.point {
            Point::Dram(m, keys) => {
                let _p = keys.pin();
                m.get(hash, who(keys, key))
            }
            Point::Engine(p) => p.get(key, hash),
        }
    }

    /// Starts loading what a lookup of `key` will read after the bucket:
    /// the entries of the DRAM point index's candidates for its hash, which
    /// confirm the key (none for an 8-byte key: its hash confirms it). For
    /// batches: after [`prefetch`](Self::prefetch) of every key's bucket,
    /// before the lookups, so that the misses of the batch overlap.
    #[inline]
    pub(crate) fn prefetch_candidates(&self, key: &[u8], hash: u64) {
        if let Point::Dram(m, keys) = &self.point {
            if key.len() != 8 {
                let _p = keys.pin();
                m.get(
                    hash,
                    Who::Other(|va| {
                        keys.prefetch(va);
                        false
                    }),
                );
            }
        }
    }

    /// The newest entry of an 8-byte key, with its value when the DRAM
    /// point index holds it inline. The caller holds the log's epoch pin.
    #[inline]
    pub(crate) fn get8(&self, key: &[u8], hash: u64, p: &Pin<'_>) -> Got {
        debug_assert_eq!(key.len(), 8);
        match &self.point {
            Point::Dram(m, _) => m.get8_pinned(hash, p),
            Point::Engine(p) => p.get(key, hash).map_or(Got::Absent, Got::Addr),
        }
    }

    /// The value word the DRAM point index keeps inline for this pair, if
    /// it keeps one.
    #[inline]
    fn inline_of(&self, key: &[u8], value: Option<&[u8]>) -> Option<u64> {
        match value {
            Some(v) if self.inline && key.len() == 8 && v.len() == 8 => {
                Some(u64::from_le_bytes(v.try_into().expect("8 bytes")))
            }
            _ => None,
        }
    }

    fn queue(&self, hash: u64) -> &Queue {
        &self.queues[(hash >> 40) as usize % QUEUES]
    }

    /// Queues a change of the key set for the tree. The caller holds the
    /// key's stripe: before a build starts nothing is queued (the build
    /// reads the point index), and the build flips `building` while it
    /// holds every stripe, so a writer either sees `building` or finished
    /// its index change before the build read the point index. (A `SeqCst`
    /// fence per insert would do the same, but right after the entry's
    /// flush it waits for the write-back.)
    fn push(&self, hash: u64, key: &[u8], insert: bool) {
        if self.tree.is_none() || !self.building.load(Ordering::Acquire) {
            return;
        }
        let q = self.queue(hash);
        let mut p = q.pending.lock().expect("index queue");
        p.push((IKey::new(key), insert));
        q.pushed.fetch_add(1, Ordering::Release);
        if p.len() >= NUDGE {
            self.nudge.store(true, Ordering::Release);
        }
    }

    /// The first half of a write of `key` (the caller holds its stripe):
    /// its `v_addr` now, and a hold on its slot that
    /// [`commit`](Self::commit) completes. With the DRAM point index the
    /// slot's shard stays locked until then, and what `commit` does is
    /// plain stores: a writer reserves before its entry's fence and
    /// commits after it, with no locked instruction after the fence to
    /// wait for the flush.
    pub(crate) fn reserve(&self, key: &[u8], hash: u64) -> Held<'_> {
        match &self.point {
            Point::Dram(m, keys) => Held::Dram(m.reserve(hash, who(keys, key))),
            Point::Engine(p) => Held::Engine(p.get(key, hash)),
        }
    }

    /// Queues the insertion of `key`, absent per `held`, for the tree now,
    /// before its entry is durable: a scan reads each key's `v_addr` from
    /// the point index, so it skips the key until the commit. Only for the
    /// DRAM point index, whose commit cannot fail. Returns whether it
    /// queued (then `commit` does not queue again).
    pub(crate) fn queue_insert_early(&self, held: &Held<'_>, key: &[u8], hash: u64) -> bool {
        if matches!(held, Held::Dram(_)) && held.current().is_none() {
            self.push(hash, key, true);
            true
        } else {
            false
        }
    }

    /// Completes a write begun with [`reserve`](Self::reserve): sets the
    /// key to `c.va` (`c.value` Some) or removes it, and queues the change
    /// of the key set for the tree unless `queued`. Returns whether the key
    /// set changed (an insert of an absent key, a delete of a present
    /// one).
    pub(crate) fn commit(
        &self,
        held: Held<'_>,
        c: &KeyChange<'_>,
        queued: bool,
        ovf: OvfFn<'_>,
    ) -> engine::Result<bool> {
        let KeyChange {
            key,
            hash,
            va: v,
            value,
        } = *c;
        let changed = match (held, value) {
            (Held::Dram(r), Some(val)) => r.commit(v, self.inline_of(key, Some(val))),
            (Held::Dram(r), None) => r.remove(),
            (Held::Engine(_), Some(_)) => match &self.point {
                Point::Engine(p) => p.set(key, hash, v, ovf)?,
                Point::Dram(..) => unreachable!("held by the index's own kind"),
            },
            (Held::Engine(_), None) => match &self.point {
                Point::Engine(p) => p.remove(key, hash, ovf)?,
                Point::Dram(..) => unreachable!("held by the index's own kind"),
            },
        };
        if changed && !queued {
            self.push(hash, key, value.is_some());
        }
        Ok(changed)
    }

    /// Sets `key` (hash `hash`) to `v`; the caller holds the key's stripe.
    /// Returns whether the key was new.
    pub(crate) fn set(
        &self,
        key: &[u8],
        hash: u64,
        v: u64,
        value: &[u8],
        ovf: OvfFn<'_>,
    ) -> engine::Result<bool> {
        let held = self.reserve(key, hash);
        let c = KeyChange {
            key,
            hash,
            va: v,
            value: Some(value),
        };
        self.commit(held, &c, false, ovf)
    }

    /// Removes `key`; the caller holds the key's stripe.
    pub(crate) fn remove(&self, key: &[u8], hash: u64, ovf: OvfFn<'_>) -> engine::Result<bool> {
        let held = self.reserve(key, hash);
        if held.current().is_none() {
            return Ok(false);
        }
        let c = KeyChange {
            key,
            hash,
            va: 0,
            value: None,
        };
        self.commit(held, &c, false, ovf)
    }

    /// Fills the DRAM point index at open (no queueing: the tree is built
    /// from the point index afterwards). `value`: the entry's value, when
    /// the caller has it at hand (an 8-byte one is then kept inline).
    pub(crate) fn load(&self, key: &[u8], v: u64, value: Option<&[u8]>) {
        if let Point::Dram(m, keys) = &self.point {
            let _p = keys.pin();
            m.set(key_hash(key), v, self.inline_of(key, value), who(keys, key));
        }
    }

    /// Frees the DRAM point index's replaced tables that no reader can
    /// reach any more (the maintenance thread; never under a pin).
    pub(crate) fn collect(&self) -> usize {
        match &self.point {
            Point::Dram(m, _) => m.collect(),
            Point::Engine(_) => 0,
        }
    }

    /// Faults in up to `max_bytes` of the DRAM point index's coming
    /// rebuilds ([`PointMap::warm_up`]); returns the bytes. The prefault
    /// thread's.
    pub(crate) fn warm_up(&self, max_bytes: usize) -> usize {
        match &self.point {
            Point::Dram(m, _) => m.warm_up(max_bytes),
            Point::Engine(_) => 0,
        }
    }

    /// Bytes [`warm_up`](Self::warm_up) has faulted in.
    pub(crate) fn warmed(&self) -> u64 {
        match &self.point {
            Point::Dram(m, _) => m.warmed(),
            Point::Engine(_) => 0,
        }
    }

    /// Whether 8-byte values of 8-byte keys are kept inline.
    pub(crate) fn inlines(&self) -> bool {
        self.inline_map().is_some()
    }

    /// The DRAM point map, when it keeps 8-byte values of 8-byte keys
    /// inline (the 8-byte fast path of a get).
    #[inline]
    pub(crate) fn inline_map(&self) -> Option<&PointMap> {
        match &self.point {
            Point::Dram(m, _) if self.inline => Some(m),
            _ => None,
        }
    }

    /// Builds the tree from the point index (once, after open).
    pub(crate) fn build_tree(&self) {
        if self.built.load(Ordering::Acquire) {
            return;
        }
        let _b = self.build_lock.lock().expect("index build lock");
        if self.built.load(Ordering::Acquire) {
            return;
        }
        {
            // Under every stripe: a writer that holds one now finishes its
            // index change before the walk below, and one that takes one
            // later sees `building` and queues (see `push`).
            let _all = self.stripes.lock_every();
            self.building.store(true, Ordering::Release);
        }
        if let Some(t) = &self.tree {
            self.for_each(|k, _| {
                t.insert(IKey::new(k));
            });
        }
        self.built.store(true, Ordering::Release);
    }

    pub(crate) fn is_built(&self) -> bool {
        self.built.load(Ordering::Acquire)
    }

    /// Applies queued changes to the tree (no-op before it is built).
    pub(crate) fn apply_pending(&self) {
        let Some(tree) = &self.tree else { return };
        if !self.is_built() {
            return;
        }
        self.nudge.store(false, Ordering::Relaxed);
        for q in self.queues.iter() {
            if q.pushed.load(Ordering::Acquire) == q.applied.load(Ordering::Acquire) {
                continue;
            }
            let _a = q.apply.lock().expect("index apply");
            let batch = std::mem::take(&mut *q.pending.lock().expect("index queue"));
            for (k, ins) in &batch {
                if *ins {
                    tree.insert(k.clone());
                } else {
                    tree.remove(k.as_bytes());
                }
            }
            q.applied.fetch_add(batch.len() as u64, Ordering::Release);
        }
    }

    /// Waits until the tree holds every change queued before this call.
    fn catch_up(&self) {
        let want: Vec<u64> = self
            .queues
            .iter()
            .map(|q| q.pushed.load(Ordering::Acquire))
            .collect();
        loop {
            if !self.is_built() {
                // The builder runs in the background; help it instead of
                // waiting (building twice is harmless: inserts are idempotent).
                self.build_tree();
            }
            self.apply_pending();
            if self
                .queues
                .iter()
                .zip(&want)
                .all(|(q, w)| q.applied.load(Ordering::Acquire) >= *w)
            {
                return;
            }
            std::thread::yield_now();
        }
    }

    /// Up to `limit` present keys with `start <= key < end` (`end` None: no
    /// bound), in key order, with their `v_addr`s.
    pub(crate) fn range(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
        out: &mut Vec<(IKey, u64)>,
    ) -> engine::Result<()> {
        let Some(tree) = &self.tree else {
            return Err(engine::Error::InvalidArgument(
                "this store has no ordered index (index option b): scans are not available".into(),
            ));
        };
        self.catch_up();
        let hi = match end {
            Some(e) => Bound::Excluded(e),
            None => Bound::Unbounded,
        };
        for e in tree.range::<[u8], _>((Bound::Included(start), hi)) {
            if out.len() >= limit {
                break;
            }
            let k = e.value();
            if let Some(v) = self.get(k.as_bytes()) {
                out.push((k.clone(), v));
            }
        }
        Ok(())
    }

    /// Every pair, in no particular order. The DRAM point index reads
    /// each key from its entry: one shard's pairs at a time, with the log
    /// pinned from before they are listed until `f` has seen them (`f`
    /// must not wait for GC).
    pub(crate) fn for_each(&self, f: impl FnMut(&[u8], u64)) {
        self.walk(f, false);
    }

    /// [`for_each`](Self::for_each) for a close that is done with the
    /// index: a DRAM point index frees each shard's table once `f` has
    /// seen its pairs, so the index shrinks while the caller's image of it
    /// grows (at 10M keys the index is 512 MiB and the image 305). The
    /// caller must own the store: the index is empty afterwards.
    pub(crate) fn drain_each(&self, f: impl FnMut(&[u8], u64)) {
        self.walk(f, true);
    }

    /// [`for_each`], and with `release` [`drain_each`].
    ///
    /// [`for_each`]: Self::for_each
    /// [`drain_each`]: Self::drain_each
    fn walk(&self, mut f: impl FnMut(&[u8], u64), release: bool) {
        match &self.point {
            Point::Dram(m, keys) => {
                let mut kbuf = Vec::new();
                for i in 0..m.shards() {
                    {
                        let _p = keys.pin();
                        m.for_shard(i, |h, va| {
                            if keys.read(va, &mut kbuf) && key_hash(&kbuf) == h {
                                f(&kbuf, va);
                            }
                        });
                    }
                    // No pin is held here: the release waits for pins.
                    if release {
                        m.release_shard(i);
                        if i % 64 == 63 {
                            m.give_back();
                            give_back_freed_memory();
                        }
                    }
                }
                if release {
                    m.give_back();
                    give_back_freed_memory();
                }
            }
            Point::Engine(p) => p.for_each(&mut f),
        }
    }

    /// [`for_each`](Self::for_each) for a read that must not miss a key: a
    /// persistent index's slot that names no well-formed entry is an
    /// `Err(Corrupt)` (see [`PIndex::for_each_checked`](crate::pindex::PIndex::for_each_checked)).
    pub(crate) fn for_each_checked(&self, mut f: impl FnMut(&[u8], u64)) -> engine::Result<()> {
        match &self.point {
            Point::Dram(..) => {
                self.for_each(f);
                Ok(())
            }
            Point::Engine(p) => p.for_each_checked(&mut f),
        }
    }

    /// Number of keys (a persistent index walks its table: not for hot
    /// paths).
    pub(crate) fn len(&self) -> usize {
        match &self.point {
            Point::Dram(m, _) => m.len(),
            Point::Engine(p) => {
                let mut n = 0;
                p.for_each(&mut |_, _| n += 1);
                n
            }
        }
    }
}

/// Returns the pages of freed heap memory to the system: the point
/// index's tables below 2 MiB come from `malloc`, which keeps freed
/// blocks in the middle of its heap resident.
fn give_back_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free heap pages; it takes no
    // pointers of ours.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A DRAM index whose entries are `(v_addr, key)`, held in DRAM.
    fn index_of(entries: &[(u64, &[u8])]) -> Index {
        let t = entries.iter().map(|(va, k)| (*va, k.to_vec())).collect();
        Index::new(None, Keys::Table(Mutex::new(t)), true, false, 0, true)
    }

    #[test]
    fn scans_see_queued_changes_in_key_order() {
        let long = vec![b'b'; 40];
        let ix = index_of(&[(3, b"c"), (2, &long), (1, b"a"), (4, b"a"), (9, b"c")]);
        ix.build_tree();
        let h = |k: &[u8]| crate::layout::key_hash(k);
        let mut no = |_: u64, _: &[u8]| -> engine::Result<u64> { unreachable!() };
        ix.set(b"c", h(b"c"), 3, b"", &mut no).unwrap();
        ix.set(&long, h(&long), 2, b"", &mut no).unwrap();
        ix.set(b"a", h(b"a"), 1, b"", &mut no).unwrap();
        ix.set(b"a", h(b"a"), 4, b"", &mut no).unwrap();
        let mut out = Vec::new();
        ix.range(b"", None, 10, &mut out).unwrap();
        let keys: Vec<&[u8]> = out.iter().map(|(k, _)| k.as_bytes()).collect();
        assert_eq!(keys, vec![&b"a"[..], &long[..], &b"c"[..]]);
        assert_eq!(out[0].1, 4);
        out.clear();
        ix.range(b"b", Some(b"c"), 10, &mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert!(ix.remove(b"a", h(b"a"), &mut no).unwrap());
        assert_eq!(ix.get(b"a"), None);
        out.clear();
        ix.range(b"", None, 10, &mut out).unwrap();
        assert_eq!(out.len(), 2);
        // Delete then re-insert: the queue keeps the order.
        assert!(ix.remove(b"c", h(b"c"), &mut no).unwrap());
        ix.set(b"c", h(b"c"), 9, b"", &mut no).unwrap();
        out.clear();
        ix.range(b"c", None, 10, &mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].1, 9);
    }

    #[test]
    fn tree_is_built_from_a_loaded_point_index() {
        let keys: Vec<[u8; 8]> = (0u64..100).map(|i| i.to_be_bytes()).collect();
        let entries: Vec<(u64, &[u8])> = (1..).zip(keys.iter().map(|k| &k[..])).collect();
        let ix = index_of(&entries);
        for (va, k) in &entries {
            ix.load(k, *va, None);
        }
        let mut out = Vec::new();
        ix.range(
            &10u64.to_be_bytes(),
            Some(&20u64.to_be_bytes()),
            100,
            &mut out,
        )
        .unwrap();
        let got: Vec<u64> = out.iter().map(|(_, v)| *v).collect();
        assert_eq!(got, (11..21).collect::<Vec<_>>());
        assert_eq!(ix.len(), 100);
    }
}
