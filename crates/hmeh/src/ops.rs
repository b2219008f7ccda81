//! The operation paths: lookup (optimistic, version-checked), insert,
//! update and delete (under the segment's lock), with the slot scans,
//! writes and displacement they share.

use super::*;

/// A slot a writer found.
#[derive(Clone, Copy, Debug)]
struct Slot {
    line: u64,
    s: usize,
    /// Normal bucket index; `None` for stash and overflow slots.
    bucket: Option<u64>,
    stash: bool,
}

/// What a writer's scan looks for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Want {
    /// The key only.
    Find,
    /// The key, or else a free slot.
    Insert,
    /// The key and a free slot.
    Both,
}

/// What a writer's scan of a locked segment found.
struct Scan {
    found: Option<(Slot, u64, u64)>,
    free: Option<Slot>,
}

impl Hmeh {
    /// The segment the current directory names for `h`.
    #[inline]
    pub(crate) fn locate(&self, h: u64) -> (&Dir, u64) {
        let d = self.dir.current();
        let i = d.index(h);
        let s = d.load(i);
        if s != 0 {
            (d, s)
        } else {
            (d, self.dir.resolve(d, i))
        }
    }

    /// Locks the segment that owns `h`: its offset, identity and head.
    pub(crate) fn lock_owner(&self, h: u64) -> (u64, Ident, &[AtomicU64; HEAD_WORDS]) {
        let home = self.geo.home(h);
        loop {
            let (d, seg) = self.locate(h);
            // The bucket's miss overlaps the head's.
            self.pool.prefetch(self.geo.bucket(seg, home));
            let hw = self.head(seg);
            self.lock.lock(&hw[HD_LOCK]);
            // Under the lock the directory entry can only change by our
            // hand, so entry == seg plus a matching identity proves that
            // `seg` owns `h` now (a freed and reused block fails the first).
            let id = Ident::decode(hw[HD_IDENT].load(Ordering::Relaxed));
            let again = self.dir.current();
            let now = if std::ptr::eq(again, d) {
                d.load(d.index(h))
            } else {
                self.locate(h).1
            };
            if let Some(id) = id {
                if now == seg && id.owns(h) && hw[HD_RETIRED].load(Ordering::Relaxed) == 0 {
                    return (seg, id, hw);
                }
            }
            self.lock.unlock(&hw[HD_LOCK]);
            std::hint::spin_loop();
        }
    }

    pub(crate) fn unlock(&self, seg: u64) {
        self.lock.unlock(&self.head(seg)[HD_LOCK]);
    }

    // ----- reads -----------------------------------------------------------------

    /// Scans the slots of one line for hash halves (`hi`, `lo`).
    #[inline(always)]
    fn probe_line(w: &[AtomicU64; 8], hi: u64, lo: u64) -> Option<u64> {
        for s in 0..SLOTS {
            let w1 = w[2 * s + 1].load(Ordering::Relaxed);
            if w1 >> 32 == lo {
                let w0 = w[2 * s].load(Ordering::Relaxed);
                if w0 >> 32 == hi {
                    return Some(decode_slot(w0, w1).1);
                }
            }
        }
        None
    }

    /// Optimistic lookup (paper Alg. 2 with the §4.1 fixes: version read,
    /// then ownership verified, value copied, version re-read on hits and
    /// misses alike).
    ///
    /// Kept short: a get on a grown table waits on one memory miss, and how
    /// many gets' misses overlap is set by how many instructions each runs
    /// (`docs/engines/hmeh.md`, "A get's length"). So one attempt is inline
    /// and the retries are out of line, the segment's lines are
    /// bounds-checked once (`Region::lines`), ownership is one test
    /// (`Ident::word_owns`), and the stash and overflow scans, which most
    /// gets skip, are out of line.
    #[inline(always)]
    pub(crate) fn lookup(&self, h: u64) -> Option<u64> {
        match self.lookup_once(h) {
            Some(res) => res,
            None => self.lookup_retry(h),
        }
    }

    /// Lookups whose first attempt met a writer or a split.
    #[cold]
    #[inline(never)]
    fn lookup_retry(&self, h: u64) -> Option<u64> {
        loop {
            std::hint::spin_loop();
            if let Some(res) = self.lookup_once(h) {
                return res;
            }
        }
    }

    /// One optimistic attempt: `None` when it must be retried (the segment
    /// was locked, did not own `h`, or changed while read, or a block was
    /// freed anywhere meanwhile: the table's free counter moved).
    #[inline(always)]
    fn lookup_once(&self, h: u64) -> Option<Option<u64>> {
        let (hi, lo) = (h >> 32, h & 0xffff_ffff);
        let home = self.geo.home(h);
        let f0 = self.frees.load(Ordering::Acquire);
        let (_, seg) = self.locate(h);
        self.pool.prefetch(self.geo.bucket(seg, home));
        let hw = self.head(seg);
        let v1 = hw[HD_LOCK].load(Ordering::Acquire);
        if !self.lock.is_free(v1) || !Ident::word_owns(hw[HD_IDENT].load(Ordering::Relaxed), h) {
            return None;
        }
        // Line 0 is the header; normal bucket b is line 1 + b.
        let lines = self.pool.lines(seg, self.geo.lines as usize);
        let mut res = None;
        // Without the home's spill bit the key can only be in its home
        // bucket (or the stash, or an overflow block).
        let probe = Spill::head_reach(hw, home);
        let mut b = home;
        for _ in 0..probe {
            res = Self::probe_line(&lines[1 + b as usize], hi, lo);
            if res.is_some() {
                break;
            }
            b += 1;
            if b == self.geo.buckets {
                b = 0;
            }
        }
        if res.is_none() {
            let stashed = hw[HD_STASH].load(Ordering::Relaxed) & Geometry::spill_bit(home) != 0;
            let ovf = hw[HD_OVERFLOW].load(Ordering::Relaxed);
            if stashed || ovf != 0 {
                res = self.lookup_beyond(lines, stashed, ovf, hi, lo);
            }
        }
        fence(Ordering::Acquire);
        (hw[HD_LOCK].load(Ordering::Relaxed) == v1 && self.frees.load(Ordering::Relaxed) == f0)
            .then_some(res)
    }

    /// The rest of a lookup's probe: the stash (where the home's stash bit
    /// is set) and the overflow chain from `ovf`. The caller validates the
    /// result with the segment's version, as for the window.
    #[cold]
    #[inline(never)]
    fn lookup_beyond(
        &self,
        lines: &[[AtomicU64; 8]],
        stashed: bool,
        mut ovf: u64,
        hi: u64,
        lo: u64,
    ) -> Option<u64> {
        if stashed {
            let first = 1 + self.geo.buckets as usize;
            for line in &lines[first..first + self.geo.stash as usize] {
                if let Some(v) = Self::probe_line(line, hi, lo) {
                    return Some(v);
                }
            }
        }
        let mut hops = 0;
        while ovf != 0 && hops < 1 << 20 {
            // A torn or stale pointer (the version check discards what it
            // read) must not fault.
            if !ovf.is_multiple_of(LINE) || self.pool.check_range(ovf, self.geo.bytes()).is_err() {
                break;
            }
            for line in &self.pool.lines(ovf, self.geo.lines as usize)[1..] {
                if let Some(v) = Self::probe_line(line, hi, lo) {
                    return Some(v);
                }
            }
            ovf = self.pool.load_u64(ovf + H_OVERFLOW);
            hops += 1;
        }
        None
    }

    // ----- writes ----------------------------------------------------------------

    /// The slot of `h`'s item in a locked segment, probed as a lookup
    /// probes (the window up to the home's reach, then the stash and the
    /// overflow chain out of line).
    #[inline(always)]
    fn find_locked(
        &self,
        seg: u64,
        id: Ident,
        hw: &[AtomicU64; HEAD_WORDS],
        h: u64,
    ) -> Option<Slot> {
        let (hi, lo) = (h >> 32, h & 0xffff_ffff);
        let home = self.geo.home(h);
        let lines = self.pool.lines(seg, self.geo.lines as usize);
        let mut b = home;
        for _ in 0..Spill::head_reach(hw, home) {
            if let Some(s) = Self::slot_of(&lines[1 + b as usize], hi, lo) {
                return Some(Slot {
                    line: self.geo.bucket(seg, b),
                    s,
                    bucket: Some(b),
                    stash: false,
                });
            }
            b += 1;
            if b == self.geo.buckets {
                b = 0;
            }
        }
        let stashed = hw[HD_STASH].load(Ordering::Relaxed) & Geometry::spill_bit(home) != 0;
        if stashed || hw[HD_OVERFLOW].load(Ordering::Relaxed) != 0 {
            return self.find_beyond(seg, id, hw, h);
        }
        None
    }

    /// `find_locked` past the window: the stash and the overflow chain.
    #[cold]
    #[inline(never)]
    fn find_beyond(
        &self,
        seg: u64,
        id: Ident,
        hw: &[AtomicU64; HEAD_WORDS],
        h: u64,
    ) -> Option<Slot> {
        self.scan(seg, id, hw, h, Want::Find)
            .found
            .map(|(slot, _, _)| slot)
    }

    /// The slot of one line that holds hash halves (`hi`, `lo`).
    #[inline(always)]
    fn slot_of(w: &[AtomicU64; 8], hi: u64, lo: u64) -> Option<usize> {
        (0..SLOTS).find(|&s| {
            w[2 * s + 1].load(Ordering::Relaxed) >> 32 == lo
                && w[2 * s].load(Ordering::Relaxed) >> 32 == hi
        })
    }

    /// Every slot a key may occupy in a locked segment: window, stash,
    /// overflow chain. Finds the key and the first slot free for it; `hw`
    /// is the segment's head.
    fn scan(&self, seg: u64, id: Ident, hw: &[AtomicU64; HEAD_WORDS], h: u64, want: Want) -> Scan {
        let want_free = want != Want::Find;
        let (hi, lo) = (h >> 32, h & 0xffff_ffff);
        let home = self.geo.home(h);
        let mut out = Scan {
            found: None,
            free: None,
        };
        let look = |line: u64, bucket: Option<u64>, stash: bool, out: &mut Scan| -> bool {
            let w = self.words(line);
            for s in 0..SLOTS {
                let w0 = w[2 * s].load(Ordering::Relaxed);
                let w1 = w[2 * s + 1].load(Ordering::Relaxed);
                let slot = Slot {
                    line,
                    s,
                    bucket,
                    stash,
                };
                if w0 >> 32 == hi && w1 >> 32 == lo {
                    if out.found.is_none() {
                        out.found = Some((slot, w0, w1));
                    }
                } else if want_free && out.free.is_none() && !self.valid(id, w0, w1, bucket) {
                    out.free = Some(slot);
                }
            }
            out.found.is_some() && (want != Want::Both || out.free.is_some())
        };
        let reach = Spill::head_reach(hw, home);
        for j in 0..PROBE {
            // Past the home bucket only a spilled key, or a free slot we
            // still need, can be found.
            if j >= reach && !(want_free && out.free.is_none()) {
                break;
            }
            let b = self.geo.ring(home, j);
            if look(self.geo.bucket(seg, b), Some(b), false, &mut out) {
                return out;
            }
        }
        // The stash is read for the key only where the home's stash bit
        // says it may be there; an insert looks there for a free slot only
        // after displacement fails (`stash_free`), so a full window does
        // not cost every insert 16 stash lines.
        let stashed = hw[HD_STASH].load(Ordering::Relaxed) & Geometry::spill_bit(home) != 0;
        if stashed || (want == Want::Both && out.free.is_none()) {
            for i in 0..self.geo.stash {
                if look(self.geo.stash_bucket(seg, i), None, true, &mut out) {
                    return out;
                }
            }
        }
        let mut ovf = hw[HD_OVERFLOW].load(Ordering::Relaxed);
        while ovf != 0 {
            for l in 1..self.geo.lines {
                if look(ovf + l * LINE, None, false, &mut out) {
                    return out;
                }
            }
            ovf = self.pool.load_u64(ovf + H_OVERFLOW);
        }
        out
    }

    /// Writes item (`h`, `v`) into an invalid slot of a locked segment.
    ///
    /// persist: the caller persists the line (strict) or leaves it to
    /// eviction (relaxed). Within one cache line x86 writes back stores in
    /// program order, so after a crash the slot holds a prefix of the
    /// stores below: word 1 first, then word 0 (which carries the prefix).
    /// The one intermediate state (old word 0, new word 1) must not read as
    /// a valid item: that is the paper's special-case check, done on the
    /// slot's current content. When it fails, an invalidating word 0 is
    /// stored first (same line, so no fence is needed).
    fn write_slot(&self, id: Ident, slot: Slot, h: u64, v: u64) {
        let w = self.words(slot.line);
        let (n0, n1) = encode_slot(h, v);
        let old0 = w[2 * slot.s].load(Ordering::Relaxed);
        if self.valid(id, old0, n1, slot.bucket) {
            w[2 * slot.s].store(id.invalid_hi() << 32, Ordering::Release);
            self.t.special_writes.fetch_add(1, Ordering::Relaxed);
        }
        w[2 * slot.s + 1].store(n1, Ordering::Release);
        w[2 * slot.s].store(n0, Ordering::Release);
    }

    /// Invalidates a slot with one 8-byte store (failure-atomic): word 0
    /// gets this segment's prefix with its top bit flipped, which no
    /// segment of the subtree takes for valid.
    fn kill_slot(&self, id: Ident, slot: Slot) {
        self.words(slot.line)[2 * slot.s].store(id.invalid_hi() << 32, Ordering::Release);
    }

    /// Sets the spill bit when an item with hash `h` goes to a normal
    /// bucket other than its home, the stash bit when it goes to the stash
    /// (the writer holds the lock; before the item is written, so a reader
    /// that sees the item sees the bit). `hw` is the segment's head.
    #[inline]
    fn mark_spill(&self, hw: &[AtomicU64; HEAD_WORDS], slot: Slot, h: u64) {
        let home = self.geo.home(h);
        match slot.bucket {
            Some(b) if b != home => Spill::head_set(hw, home, self.geo.dist(home, b)),
            None if slot.stash => {
                let w = &hw[HD_STASH];
                w.store(
                    w.load(Ordering::Relaxed) | Geometry::spill_bit(home),
                    Ordering::Release,
                );
            }
            _ => {}
        }
    }

    /// Adjusts a locked segment's item count (DRAM meaning).
    fn count_add(hw: &[AtomicU64; HEAD_WORDS], d: i64) {
        let c = hw[HD_COUNT].load(Ordering::Relaxed);
        hw[HD_COUNT].store(c.wrapping_add(d as u64), Ordering::Relaxed);
    }

    fn zero_op<T>(&self, f: impl FnOnce(&Pool, u64) -> T) -> T {
        let _g = self.zero.lock().expect("zero-key lock");
        f(&self.pool, self.root)
    }

    /// Makes room in the full window of `home` by moving items along a
    /// chain: an item of the window goes to another bucket of its own
    /// window, whose item (if that bucket is full too) goes on, up to 3
    /// moves (16 when `deep`), found breadth first (linear probing's
    /// displacement, bounded). Returns the window slot it freed.
    ///
    /// persist: moves run from the free end of the chain backwards; each
    /// moved copy is persisted (both modes) before its old slot is
    /// overwritten by the next move (or by the caller's item), so a crash
    /// leaves every item once or twice (recovery keeps one copy; both hold
    /// the same value), never zero times.
    fn displace(&self, seg: u64, id: Ident, home: u64, deep: bool) -> Option<Slot> {
        // A short search on every full window; a long one (rare: the
        // window and the stash are full) before giving up for a split.
        let (move_depth, max_nodes) = if deep { (16, 247) } else { (3, 48) };
        // BFS over buckets: (bucket, parent node index, slot in the parent
        // whose item moves into this bucket, depth).
        let mut nodes: Vec<(u64, usize, usize, usize)> = Vec::with_capacity(max_nodes);
        // Buckets already in the BFS, one bit each: a linear search of
        // `nodes` made the deep search quadratic (up to 247 x 16 x 247
        // compares before each split, the largest cost of a growing insert).
        let mut seen = Seen::new();
        for j in 0..PROBE {
            let b = self.geo.ring(home, j);
            seen.insert(b);
            nodes.push((b, usize::MAX, 0, 0));
        }
        let free_in = |b: u64| -> Option<usize> {
            let w = self.words(self.geo.bucket(seg, b));
            (0..SLOTS).find(|&s| {
                !self.valid(
                    id,
                    w[2 * s].load(Ordering::Relaxed),
                    w[2 * s + 1].load(Ordering::Relaxed),
                    Some(b),
                )
            })
        };
        let mut i = 0;
        while i < nodes.len() {
            let (b, _, _, depth) = nodes[i];
            if depth < move_depth {
                let w = self.words(self.geo.bucket(seg, b));
                for s in 0..SLOTS {
                    let hx = decode_slot(
                        w[2 * s].load(Ordering::Relaxed),
                        w[2 * s + 1].load(Ordering::Relaxed),
                    )
                    .0;
                    let hx_home = self.geo.home(hx);
                    for k in 0..PROBE {
                        let t = self.geo.ring(hx_home, k);
                        if !seen.insert(t) {
                            continue;
                        }
                        if nodes.len() >= max_nodes {
                            return None;
                        }
                        nodes.push((t, i, s, depth + 1));
                        if let Some(fs) = free_in(t) {
                            return Some(self.run_moves(seg, id, &nodes, fs));
                        }
                    }
                }
            }
            i += 1;
        }
        None
    }

    /// A free slot in the stash of a locked segment.
    fn stash_free(&self, seg: u64, id: Ident) -> Option<Slot> {
        (0..self.geo.stash).find_map(|i| {
            let line = self.geo.stash_bucket(seg, i);
            let w = self.words(line);
            (0..SLOTS)
                .find(|&s| {
                    !self.valid(
                        id,
                        w[2 * s].load(Ordering::Relaxed),
                        w[2 * s + 1].load(Ordering::Relaxed),
                        None,
                    )
                })
                .map(|s| Slot {
                    line,
                    s,
                    bucket: None,
                    stash: true,
                })
        })
    }

    /// Executes the chain ending at the last BFS node (whose bucket has the
    /// free slot `fs`); returns the freed window slot.
    fn run_moves(
        &self,
        seg: u64,
        id: Ident,
        nodes: &[(u64, usize, usize, usize)],
        fs: usize,
    ) -> Slot {
        let slot_at = |b: u64, s: usize| Slot {
            line: self.geo.bucket(seg, b),
            s,
            bucket: Some(b),
            stash: false,
        };
        let mut to = slot_at(nodes[nodes.len() - 1].0, fs);
        let mut at = nodes.len() - 1;
        loop {
            let (_, parent, ps, _) = nodes[at];
            let from = slot_at(nodes[parent].0, ps);
            let w = self.words(from.line);
            let (hx, vx) = decode_slot(
                w[2 * ps].load(Ordering::Relaxed),
                w[2 * ps + 1].load(Ordering::Relaxed),
            );
            self.mark_spill(self.head(seg), to, hx);
            self.write_slot(id, to, hx, vx);
            self.pool.persist_line(to.line);
            self.t.displacements.fetch_add(1, Ordering::Relaxed);
            to = from;
            at = parent;
            if nodes[at].1 == usize::MAX {
                return to;
            }
        }
    }

    // ----- the operation paths ------------------------------------------------

    /// The insert path (`Engine::insert`).
    pub(crate) fn insert_key(&self, key: u64, value: u64) -> Result<bool> {
        self.check_open()?;
        let h = self.hasher.hash(key);
        if h == 0 {
            return Ok(self.zero_op(|p, root| {
                if p.load_u64(root + R_ZERO_PRESENT) == 1 {
                    return false;
                }
                p.store_u64(root + R_ZERO_VALUE, value);
                p.store_u64(root + R_ZERO_PRESENT, 1);
                // persist: value then flag, one line: in order.
                if self.strict() {
                    p.persist_line(root);
                }
                self.len.add(1);
                true
            }));
        }
        loop {
            let (seg, id, hw) = self.lock_owner(h);
            let sc = self.scan(seg, id, hw, h, Want::Insert);
            if sc.found.is_some() {
                self.lock.unlock(&hw[HD_LOCK]);
                return Ok(false);
            }
            // Window, then a displacement chain (breadth first, up to 16
            // moves), then a split. The stash and overflow blocks take items
            // only at the depth cap, where a segment cannot split: a stashed
            // item costs every later miss of its home a read of all the
            // stash lines, and filling a segment's last slots through the
            // stash made a growing insert 2x slower (docs/engines/hmeh.md,
            // "Growth"). `stash_first` pools fill the stash before a split.
            let home = self.geo.home(h);
            let free = match sc.free {
                Some(f) if f.bucket.is_some() => Some(f),
                _ if id.ld < self.geo.max_depth && !self.geo.stash_first => {
                    self.displace(seg, id, home, true)
                }
                other => self
                    .displace(seg, id, home, false)
                    .or(other)
                    .or_else(|| self.stash_free(seg, id))
                    .or_else(|| self.displace(seg, id, home, true)),
            };
            if let Some(f) = free {
                self.mark_spill(hw, f, h);
                self.write_slot(id, f, h, value);
                if self.strict() {
                    // persist: the slot's line before the lock is released
                    // (no reader acts on a write a crash could undo): one
                    // persist per insert, the point of cross-KV.
                    self.pool.persist_line(f.line);
                }
                Self::count_add(hw, 1);
                self.lock.unlock(&hw[HD_LOCK]);
                self.len.add(1);
                return Ok(true);
            }
            self.grow(seg, id)?;
        }
    }

    /// The lookup path (`Engine::get`).
    #[inline]
    pub(crate) fn get_key(&self, key: u64) -> Option<u64> {
        let h = self.hasher.hash(key);
        if h == 0 {
            return self.zero_op(|p, root| {
                (p.load_u64(root + R_ZERO_PRESENT) == 1).then(|| p.load_u64(root + R_ZERO_VALUE))
            });
        }
        self.lookup(h)
    }

    /// The update path (`Engine::update`).
    pub(crate) fn update_key(&self, key: u64, value: u64) -> Result<bool> {
        self.check_open()?;
        let h = self.hasher.hash(key);
        if h == 0 {
            return Ok(self.zero_op(|p, root| {
                if p.load_u64(root + R_ZERO_PRESENT) != 1 {
                    return false;
                }
                p.store_u64(root + R_ZERO_VALUE, value);
                // persist: one 8-byte store.
                if self.strict() {
                    p.persist_line(root);
                }
                true
            }));
        }
        loop {
            let (seg, id, hw) = self.lock_owner(h);
            let Some(slot) = self.find_locked(seg, id, hw, h) else {
                self.lock.unlock(&hw[HD_LOCK]);
                return Ok(false);
            };
            let (n0, n1) = encode_slot(h, value);
            let w = self.words(slot.line);
            let (w0, w1) = (
                w[2 * slot.s].load(Ordering::Relaxed),
                w[2 * slot.s + 1].load(Ordering::Relaxed),
            );
            if n0 == w0 || n1 == w1 {
                // One value half changes: one 8-byte store, failure-atomic.
                if n0 == w0 {
                    w[2 * slot.s + 1].store(n1, Ordering::Release);
                } else {
                    w[2 * slot.s].store(n0, Ordering::Release);
                }
                // persist: one store, one line.
                if self.strict() {
                    self.pool.persist_line(slot.line);
                }
                self.t.inplace_updates.fetch_add(1, Ordering::Relaxed);
                self.lock.unlock(&hw[HD_LOCK]);
                return Ok(true);
            }
            let same_line = (0..SLOTS).find(|&s| {
                s != slot.s
                    && !self.valid(
                        id,
                        w[2 * s].load(Ordering::Relaxed),
                        w[2 * s + 1].load(Ordering::Relaxed),
                        slot.bucket,
                    )
            });
            if let Some(s) = same_line {
                // Out of place within the line: new copy, then the old one
                // killed. persist: one line, so a crash leaves old only,
                // both (recovery keeps one: either is allowed for an update
                // in flight) or new only, never neither.
                self.write_slot(id, Slot { s, ..slot }, h, value);
                self.kill_slot(id, slot);
                if self.strict() {
                    self.pool.persist_line(slot.line);
                }
                self.t.line_updates.fetch_add(1, Ordering::Relaxed);
                self.lock.unlock(&hw[HD_LOCK]);
                return Ok(true);
            }
            // A slot elsewhere: the full scan, for the first free one.
            if let Some(f) = self.scan(seg, id, hw, h, Want::Both).free {
                self.mark_spill(hw, f, h);
                self.write_slot(id, f, h, value);
                // persist: the new copy durable before the old one dies,
                // in both modes: otherwise a crash could keep neither.
                self.pool.persist_line(f.line);
                self.kill_slot(id, slot);
                if self.strict() {
                    self.pool.persist_line(slot.line);
                }
                self.t.cross_updates.fetch_add(1, Ordering::Relaxed);
                self.lock.unlock(&hw[HD_LOCK]);
                return Ok(true);
            }
            self.grow(seg, id)?;
        }
    }

    /// The delete path (`Engine::remove`).
    pub(crate) fn remove_key(&self, key: u64) -> Result<bool> {
        self.check_open()?;
        let h = self.hasher.hash(key);
        if h == 0 {
            return Ok(self.zero_op(|p, root| {
                if p.load_u64(root + R_ZERO_PRESENT) != 1 {
                    return false;
                }
                p.store_u64(root + R_ZERO_PRESENT, 0);
                // persist: one 8-byte store.
                if self.strict() {
                    p.persist_line(root);
                }
                self.len.add(-1);
                true
            }));
        }
        let (seg, id, hw) = self.lock_owner(h);
        let Some(slot) = self.find_locked(seg, id, hw, h) else {
            self.lock.unlock(&hw[HD_LOCK]);
            return Ok(false);
        };
        self.kill_slot(id, slot);
        // persist: one 8-byte store, failure-atomic; durable before the
        // lock is released (CRASH-PATTERNS #6).
        if self.strict() {
            self.pool.persist_line(slot.line);
        }
        Self::count_add(hw, -1);
        self.len.add(-1);
        self.maybe_merge(seg, id, hw);
        Ok(true)
    }
}

/// A set of bucket numbers below a segment's bucket count, one bit each.
struct Seen([u64; (MAX_LINES / 64) as usize]);

impl Seen {
    /// An empty set: a segment has fewer than `MAX_LINES` buckets.
    fn new() -> Seen {
        Seen([0; (MAX_LINES / 64) as usize])
    }

    /// Adds `b`; false if it was there.
    #[inline]
    fn insert(&mut self, b: u64) -> bool {
        let w = &mut self.0[(b / 64) as usize];
        let m = 1u64 << (b % 64);
        let new = *w & m == 0;
        *w |= m;
        new
    }
}
