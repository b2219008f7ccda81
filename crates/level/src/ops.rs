//! The operation paths: lookup (optimistic, validated by line versions
//! and the move counters), insert (direct placement, one-item movement,
//! bottom-to-top movement; `resize` when all fail), update (log-free or
//! undo-logged) and delete, with the line locks and the undo/move log
//! slots they use.

use std::sync::atomic::{AtomicU64, Ordering};

use engine::{Error, Result};

use crate::layout::*;
use crate::{Geo, Level, Loc, Lvl, BOT, TOP};

/// A locked line: its words and the lock word as held (for `release`).
type Held<'a> = (&'a [AtomicU64], u64);

/// What one optimistic line read saw.
struct Scan {
    mask: u64,
    vals: [u64; 3],
    ver: u64,
    ok: bool,
}

/// Whether a slot write is persisted at once, or flushed and fenced by
/// the caller later (a rehash batch: it flushes the lines it filled after
/// releasing them, then fences once).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fence {
    Now,
    Later,
}

/// A one-item movement to be made: the item `item` in slot `slot` of line
/// `src`, bound for bucket `dst_b` of level `dst`.
struct Movement<'a> {
    src: u64,
    slot: usize,
    item: u64,
    dst: &'a Lvl,
    dst_b: u64,
}

enum Probe {
    Hit((Loc, u64)),
    Miss,
    Retry,
}

impl Level {
    /// [`Engine::insert`](engine::Engine::insert).
    #[inline]
    pub(crate) fn insert_key(&self, key: u64, value: u64) -> Result<bool> {
        let h = self.hashes(key);
        loop {
            // An optimistic look first, outside every lock, so its cache
            // misses overlap the previous operation's persist.
            if self.find(key, h, false).0.is_some() {
                return Ok(false);
            }
            let seq = {
                let _gate = self.gate.enter();
                self.check_open()?;
                let _stripe = self.stripes.lock(h.0);
                // Under the key's stripe the answer is final (lines are hot).
                if self.find(key, h, false).0.is_some() {
                    return Ok(false);
                }
                let g = self.geo_fields();
                // Normally no resize is in progress here (they finish behind
                // the closed gate); one that could not finish still takes
                // inserts into its top two levels.
                if let Some(level) = self.place(&g, h, key, value) {
                    self.counts[level].add(1);
                    self.tick();
                    return Ok(true);
                }
                g.seq
            };
            // Insertion failure (or a resize left in progress): resize, retry.
            self.expand(seq)?;
        }
    }

    /// [`Engine::get`](engine::Engine::get).
    #[inline]
    pub(crate) fn get_key(&self, key: u64) -> Option<u64> {
        self.find(key, self.hashes(key), false).0.map(|(_, v)| v)
    }

    /// [`Engine::update`](engine::Engine::update).
    #[inline]
    pub(crate) fn update_key(&self, key: u64, value: u64) -> Result<bool> {
        let h = self.hashes(key);
        {
            let Some((loc, (w, held), gate)) = self.lock_found(key, h)? else {
                return Ok(false);
            };
            let hdr = w[W_HDR].load(Ordering::Relaxed);
            if let Some(f) = free_slot(hdr) {
                // Opportunistic log-free update: the new item in a free slot
                // of the same line, then both tokens flipped by one store.
                w[w_key(f)].store(key, Ordering::Relaxed);
                w[w_val(f)].store(value, Ordering::Relaxed);
                w[W_HDR].store(
                    with_slot(hdr & !(1 << loc.slot), f, fingerprint(h.0)),
                    Ordering::Release,
                );
                // persist: new item and the token flip share the line and are
                // stored in that order: old or new item, never both or none.
                self.pool.persist_line(loc.line);
                self.logfree_updates.fetch_add(1, Ordering::Relaxed);
            } else {
                // Line full: undo-log the old value, update in place.
                let old = w[w_val(loc.slot)].load(Ordering::Relaxed);
                let log = self.logs.claim();
                let rec = LogRecord {
                    kind: LogKind::Update,
                    src_line: loc.line,
                    src_slot: loc.slot as u64,
                    key,
                    value: old,
                    dst_line: 0,
                    dst_slot: 0,
                };
                // persist: the undo record (fenced) before the in-place
                // write; then the write and the record's clearing share one
                // fence. A crash before that fence may leave either one
                // durable without the other: the value is then the old one
                // (undone, or never written) or the new one, and the call
                // had not returned, so both are allowed. Two fences, not
                // the three of write-clear-clear.
                self.write_log(log, &rec);
                w[w_val(loc.slot)].store(value, Ordering::Release);
                self.pool.flush(loc.line, LINE as usize);
                self.clear_log(log);
                self.pool.fence();
                self.logged_updates.fetch_add(1, Ordering::Relaxed);
            }
            self.lock.release(&w[W_LOCK], held);
            drop(gate);
        }
        Ok(true)
    }

    /// [`Engine::remove`](engine::Engine::remove).
    #[inline]
    pub(crate) fn remove_key(&self, key: u64) -> Result<bool> {
        let h = self.hashes(key);
        let Some((loc, (w, held), gate)) = self.lock_found(key, h)? else {
            return Ok(false);
        };
        let hdr = w[W_HDR].load(Ordering::Relaxed);
        w[W_HDR].store(hdr & !(1 << loc.slot), Ordering::Release);
        // persist: one 8-byte header store clears the token: failure-atomic.
        // The line stays locked until it is durable, so no reader acts on a
        // delete a crash could undo (CRASH-PATTERNS #6).
        self.pool.persist_line(loc.line);
        // The release is a store computed from the held word: a load of
        // the line just written back would wait for a cache miss.
        self.lock.release(&w[W_LOCK], held);
        // The count changes inside the gate, so a resize never relabels
        // the levels between the delete and its count. Leaving the gate is
        // a plain store: nothing after the fence holds back the next
        // operation's loads.
        self.counts[loc.level].add(-1);
        let removes = self.removes.bump();
        drop(gate);
        self.maybe_shrink(removes);
        Ok(true)
    }

    /// One optimistic read of a line, without data-dependent branches:
    /// the valid slots holding `key` (bit mask), the values, the version
    /// seen, and whether no writer held or changed the line meanwhile.
    #[inline(always)]
    fn scan_line(&self, line: u64, key: u64) -> Scan {
        let w = self.pool.words(line, 8);
        let v1 = w[W_LOCK].load(Ordering::Acquire);
        let hdr = w[W_HDR].load(Ordering::Relaxed);
        let keys = [
            w[2].load(Ordering::Relaxed),
            w[4].load(Ordering::Relaxed),
            w[6].load(Ordering::Relaxed),
        ];
        let vals = [
            w[3].load(Ordering::Relaxed),
            w[5].load(Ordering::Relaxed),
            w[7].load(Ordering::Relaxed),
        ];
        std::sync::atomic::fence(Ordering::Acquire);
        let v2 = w[W_LOCK].load(Ordering::Relaxed);
        let eq = (keys[0] == key) as u64
            | ((keys[1] == key) as u64) << 1
            | ((keys[2] == key) as u64) << 2;
        Scan {
            mask: hdr & eq & TOKEN_MASK,
            vals,
            ver: v1,
            ok: v1 == v2 && self.lock.is_free(v1),
        }
    }

    fn prefetch(&self, g: &Geo, h: (u64, u64)) {
        for l in &g.lv {
            if l.present() {
                let (c, n) = Self::cands(l, h);
                for &b in &c[..n] {
                    let off = l.bucket(b);
                    self.pool.prefetch(off);
                    self.pool.prefetch(off + LINE);
                }
            }
        }
    }

    /// Finds `key` with a validated search: a miss is returned only if no
    /// line probed changed while probing (a concurrent move re-probes).
    /// Levels are probed in the dynamic order, the interim level last (and
    /// only with `interim`); all candidate lines are prefetched first.
    pub(crate) fn locate(
        &self,
        key: u64,
        h: (u64, u64),
        interim: bool,
    ) -> (Option<(Loc, u64)>, Geo, u64) {
        'retry: loop {
            let (gv, g) = self.geo_read();
            self.prefetch(&g, h);
            let begun = self.moves_begun.load(Ordering::Acquire);
            let quiet = begun == self.moves_done.load(Ordering::Acquire);
            let (order, mut nlev) = self.order(&g);
            if !interim {
                nlev = nlev.min(2);
            }
            let mut seen = [(0u64, 0u64); 12];
            let mut ns = 0;
            for &li in &order[..nlev] {
                let l = g.lv[li];
                let (c, nc) = Self::cands(&l, h);
                let mut ok = true;
                let mut hit = None;
                for &b in &c[..nc] {
                    for line in [l.bucket(b), l.bucket(b) + LINE] {
                        let sc = self.scan_line(line, key);
                        ok &= sc.ok;
                        if sc.mask != 0 {
                            let slot = sc.mask.trailing_zeros() as usize;
                            hit = Some((
                                Loc {
                                    level: li,
                                    line,
                                    slot,
                                },
                                sc.vals[slot],
                            ));
                        }
                        seen[ns] = (line, sc.ver);
                        ns += 1;
                    }
                }
                if !ok {
                    std::hint::spin_loop();
                    continue 'retry;
                }
                if hit.is_some() {
                    if self.geo_ver.load(Ordering::Acquire) == gv {
                        return (hit, g, gv);
                    }
                    continue 'retry;
                }
            }
            std::sync::atomic::fence(Ordering::Acquire);
            // A miss stands if no move overlapped the probe (the common
            // case: one load), or else if no line probed has changed.
            let unchanged = (quiet && self.moves_begun.load(Ordering::Relaxed) == begun)
                || seen[..ns]
                    .iter()
                    .all(|&(line, ver)| self.pool.words(line, 1)[0].load(Ordering::Relaxed) == ver);
            if unchanged && self.geo_ver.load(Ordering::Acquire) == gv {
                return (None, g, gv);
            }
        }
    }

    /// The fast path of every search: fingerprints select the slots worth
    /// a key compare, and a miss is validated by one load (no move
    /// overlapped the probe) instead of re-reading every line. While a
    /// resize or a move is under way it falls back to
    /// [`locate`](Self::locate).
    fn find(&self, key: u64, h: (u64, u64), expect_hit: bool) -> (Option<(Loc, u64)>, u64) {
        let fp = fingerprint(h.0);
        loop {
            let gv = self.geo_ver.load(Ordering::Acquire);
            let begun = self.moves_begun.load(Ordering::Acquire);
            if gv & 1 == 1
                || begun != self.moves_done.load(Ordering::Acquire)
                || self.geo[7].load(Ordering::Relaxed) != 0
            {
                let (hit, _, gv) = self.locate(key, h, true);
                return (hit, gv);
            }
            let (tb, tm) = (
                level_base(self.geo[2].load(Ordering::Relaxed)),
                self.geo[3].load(Ordering::Relaxed).wrapping_sub(1),
            );
            let (bb, bm) = (
                level_base(self.geo[4].load(Ordering::Relaxed)),
                self.geo[5].load(Ordering::Relaxed).wrapping_sub(1),
            );
            // The fields belong together only if the geometry did not change
            // while they were read.
            std::sync::atomic::fence(Ordering::Acquire);
            if self.geo_ver.load(Ordering::Relaxed) != gv {
                continue;
            }
            let top = [tb + (h.0 & tm) * BUCKET, tb + (h.1 & tm) * BUCKET];
            let bot = [bb + (h.0 & bm) * BUCKET, bb + (h.1 & bm) * BUCKET];
            let ((first, fl), (second, sl)) = if self.bl_first.load(Ordering::Relaxed) {
                ((bot, BOT), (top, TOP))
            } else {
                ((top, TOP), (bot, BOT))
            };
            // Expecting a hit, prefetch the level probed first only: the
            // other level's lines would compete with the hit's and with a
            // writer's flush. Expecting a miss, prefetch both.
            let fetch: &[u64] = if expect_hit {
                &first
            } else {
                &[first[0], first[1], second[0], second[1]]
            };
            for &b in fetch {
                self.pool.prefetch(b);
                self.pool.prefetch(b + LINE);
            }
            match self.probe_fast(first, fl, key, fp) {
                Probe::Hit(hit) if self.geo_ver.load(Ordering::Acquire) == gv => {
                    return (Some(hit), gv)
                }
                Probe::Miss => {}
                _ => continue,
            }
            match self.probe_fast(second, sl, key, fp) {
                Probe::Hit(hit) if self.geo_ver.load(Ordering::Acquire) == gv => {
                    return (Some(hit), gv)
                }
                Probe::Miss => {}
                _ => continue,
            }
            std::sync::atomic::fence(Ordering::Acquire);
            if self.moves_begun.load(Ordering::Relaxed) == begun
                && self.geo_ver.load(Ordering::Relaxed) == gv
            {
                return (None, gv);
            }
        }
    }

    /// Probes the two buckets of one level. A hit is validated by its
    /// line's version; a miss needs no per-line validation: every change
    /// that could hide a present key from a reader is a move (the caller
    /// checks) or publishes through the header word after the slot it
    /// names is written.
    #[inline(always)]
    fn probe_fast(&self, buckets: [u64; 2], level: usize, key: u64, fp: u64) -> Probe {
        for b in buckets {
            // The bucket's two lines with one bounds check.
            for (line, w) in [b, b + LINE].into_iter().zip(self.pool.lines(b, 2)) {
                let v1 = w[W_LOCK].load(Ordering::Acquire);
                let hdr = w[W_HDR].load(Ordering::Acquire);
                if !self.lock.is_free(v1) {
                    // A writer holds the line until its change is durable:
                    // wait rather than act on what a crash could undo
                    // (CRASH-PATTERNS #6).
                    std::hint::spin_loop();
                    return Probe::Retry;
                }
                let mut c = fp_candidates(hdr, fp);
                let compared = c != 0;
                while c != 0 {
                    let slot = c.trailing_zeros() as usize;
                    if w[w_key(slot)].load(Ordering::Relaxed) == key {
                        let v = w[w_val(slot)].load(Ordering::Relaxed);
                        std::sync::atomic::fence(Ordering::Acquire);
                        let ok = w[W_LOCK].load(Ordering::Relaxed) == v1;
                        return if ok {
                            Probe::Hit((Loc { level, line, slot }, v))
                        } else {
                            Probe::Retry
                        };
                    }
                    c &= c - 1;
                }
                // A key compared against a slot that a writer reused since
                // the header was read (a log-free update moved the key to
                // another slot of this line, an insert took the old one)
                // would be a false miss: such a line must be unchanged.
                if compared {
                    std::sync::atomic::fence(Ordering::Acquire);
                    if w[W_LOCK].load(Ordering::Relaxed) != v1 {
                        return Probe::Retry;
                    }
                }
            }
        }
        Probe::Miss
    }

    /// Writes `key`/`value` into free `slot` of a locked line and makes it
    /// durable (`Fence::Now`), or leaves the flush to the caller
    /// (`Fence::Later`: a rehash, whose item stays valid in the interim
    /// level until the caller's flush and fence).
    fn fill_slot(
        &self,
        line: u64,
        w: &[AtomicU64],
        slot: usize,
        key: u64,
        value: u64,
        fence: Fence,
    ) {
        let hdr = w[W_HDR].load(Ordering::Relaxed);
        w[w_key(slot)].store(key, Ordering::Relaxed);
        w[w_val(slot)].store(value, Ordering::Relaxed);
        w[W_HDR].store(
            with_slot(hdr, slot, fingerprint(self.hashes(key).0)),
            Ordering::Release,
        );
        // persist: key, value, then the token, all in this one cache line.
        // x86 writes a line back whole, holding its stores in program order,
        // so the token is never durable without the item (CRASH-PATTERNS
        // #1): one flush and one fence per insert.
        match fence {
            Fence::Now => self.pool.persist_line(line),
            Fence::Later => {}
        }
    }

    /// Clears `slot`'s token of a locked line, durably.
    fn clear_slot(&self, line: u64, w: &[AtomicU64], slot: usize) {
        let hdr = w[W_HDR].load(Ordering::Relaxed);
        w[W_HDR].store(hdr & !(1 << slot), Ordering::Release);
        // persist: one 8-byte header store: failure-atomic.
        self.pool.persist_line(line);
    }

    pub(crate) fn bucket_free(&self, l: &Lvl, b: u64) -> u32 {
        let off = l.bucket(b);
        free_count(self.pool.load_u64(off + 8)) + free_count(self.pool.load_u64(off + LINE + 8))
    }

    /// Direct insert into the less-loaded of a level's candidate buckets.
    #[inline(always)]
    pub(crate) fn try_direct(
        &self,
        l: &Lvl,
        h: (u64, u64),
        key: u64,
        value: u64,
        fence: Fence,
    ) -> Option<u64> {
        let (c, nc) = Self::cands(l, h);
        loop {
            let (mut best, mut best_free) = (c[0], self.bucket_free(l, c[0]));
            if nc == 2 {
                let f = self.bucket_free(l, c[1]);
                if f > best_free {
                    (best, best_free) = (c[1], f);
                }
            }
            if best_free == 0 {
                return None;
            }
            if let Some(line) = self.fill_bucket(l, best, key, value, fence) {
                return Some(line);
            }
            // Another writer took the slots we saw free: look again.
        }
    }

    /// Writes `key`/`value` into the first free slot of bucket `b` of
    /// level `l`, under that line's lock (`fill_slot`'s persist order);
    /// the line written, `None` if the bucket has no free slot.
    #[inline(always)]
    pub(crate) fn fill_bucket(
        &self,
        l: &Lvl,
        b: u64,
        key: u64,
        value: u64,
        fence: Fence,
    ) -> Option<u64> {
        for line in [l.bucket(b), l.bucket(b) + LINE] {
            let w = self.pool.words(line, 8);
            if free_count(w[W_HDR].load(Ordering::Relaxed)) == 0 {
                continue;
            }
            let held = self.lock.acquire(&w[W_LOCK]);
            if let Some(s) = free_slot(w[W_HDR].load(Ordering::Relaxed)) {
                self.fill_slot(line, w, s, key, value, fence);
                self.lock.release(&w[W_LOCK], held);
                return Some(line);
            }
            self.lock.release(&w[W_LOCK], held);
        }
        None
    }

    /// Moves the item in (`src`, `slot`) to a free slot of bucket `dst_b` of
    /// level `dst`, then writes `key`/`value` into the freed slot. False if
    /// the item or the room is gone by the time both lines are locked.
    fn move_and_fill(&self, mv: Movement<'_>, key: u64, value: u64) -> bool {
        let Movement {
            src,
            slot,
            item,
            dst,
            dst_b,
        } = mv;
        let dst_line = [dst.bucket(dst_b), dst.bucket(dst_b) + LINE]
            .into_iter()
            .find(|&d| free_count(self.pool.load_u64(d + 8)) > 0);
        let Some(dline) = dst_line else { return false };
        let sw = self.pool.words(src, 8);
        let dw = self.pool.words(dline, 8);
        let (first, second) = if src < dline { (sw, dw) } else { (dw, sw) };
        let held1 = self.lock.acquire(&first[W_LOCK]);
        let held2 = self.lock.acquire(&second[W_LOCK]);
        let shdr = sw[W_HDR].load(Ordering::Relaxed);
        let ok = shdr & (1 << slot) != 0 && sw[w_key(slot)].load(Ordering::Relaxed) == item;
        let dslot = free_slot(dw[W_HDR].load(Ordering::Relaxed));
        if let (true, Some(ds)) = (ok, dslot) {
            self.move_begin();
            let ival = sw[w_val(slot)].load(Ordering::Relaxed);
            let log = self.logs.claim();
            let rec = LogRecord {
                kind: LogKind::Move,
                src_line: src,
                src_slot: slot as u64,
                key: item,
                value: ival,
                dst_line: dline,
                dst_slot: ds as u64,
            };
            // persist: the move record before the destination copy, so that
            // a crash leaving both copies valid finds the record and clears
            // the source (CRASH-PATTERNS #3: no key twice).
            self.write_log(log, &rec);
            self.fill_slot(dline, dw, ds, item, ival, Fence::Now);
            self.clear_slot(src, sw, slot);
            self.clear_log(log);
            self.move_end();
            // persist: the moved item's old slot is free and durable; the new
            // key goes in with the usual one-line order.
            self.fill_slot(src, sw, slot, key, value, Fence::Now);
            self.lock.release(&second[W_LOCK], held2);
            self.lock.release(&first[W_LOCK], held1);
            self.moves.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        self.lock.release(&second[W_LOCK], held2);
        self.lock.release(&first[W_LOCK], held1);
        false
    }

    /// One-item movement: an item of a candidate bucket in `from` moves to
    /// one of its own buckets in `to` (same level: its alternative bucket;
    /// `to` = top from bottom: bottom-to-top), and `key` takes its slot.
    fn try_move(
        &self,
        from: &Lvl,
        to: &Lvl,
        same_level: bool,
        h: (u64, u64),
        key: u64,
        value: u64,
    ) -> bool {
        let (c, nc) = Self::cands(from, h);
        for &b in &c[..nc] {
            for line in [from.bucket(b), from.bucket(b) + LINE] {
                let w = self.pool.words(line, 8);
                let hdr = w[W_HDR].load(Ordering::Relaxed);
                for s in 0..SLOTS_PER_LINE {
                    if hdr & (1 << s) == 0 {
                        continue;
                    }
                    let item = w[w_key(s)].load(Ordering::Relaxed);
                    let ih = self.hashes(item);
                    let (ic, inc) = Self::cands(to, ih);
                    for &alt in &ic[..inc] {
                        if (same_level && alt == b) || self.bucket_free(to, alt) == 0 {
                            continue;
                        }
                        let mv = Movement {
                            src: line,
                            slot: s,
                            item,
                            dst: to,
                            dst_b: alt,
                        };
                        if self.move_and_fill(mv, key, value) {
                            return true;
                        }
                    }
                }
            }
        }
        false
    }

    /// Places a new key in the top two levels; the level it landed in.
    pub(crate) fn place(&self, g: &Geo, h: (u64, u64), key: u64, value: u64) -> Option<usize> {
        let (top, bot) = (&g.lv[TOP], &g.lv[BOT]);
        if self.try_direct(top, h, key, value, Fence::Now).is_some() {
            return Some(TOP);
        }
        if self.try_move(top, top, true, h, key, value) {
            return Some(TOP);
        }
        if self.try_direct(bot, h, key, value, Fence::Now).is_some() {
            return Some(BOT);
        }
        if self.try_move(bot, bot, true, h, key, value) {
            return Some(BOT);
        }
        if self.try_move(bot, top, false, h, key, value) {
            // The moved item went up, the new key took its bottom slot.
            self.b2t_moves.fetch_add(1, Ordering::Relaxed);
            self.counts[TOP].add(1);
            self.counts[BOT].add(-1);
            return Some(BOT);
        }
        None
    }

    /// Announces a move to readers (before any line changes).
    pub(crate) fn move_begin(&self) {
        self.moves_begun.fetch_add(1, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    /// The move is complete: its source is cleared.
    pub(crate) fn move_end(&self) {
        self.moves_done.fetch_add(1, Ordering::Release);
    }

    fn write_log(&self, slot: usize, rec: &LogRecord) {
        let off = self.root + R_LOGS + slot as u64 * 64;
        for (i, w) in rec.encode().iter().enumerate() {
            self.pool.store_u64(off + i as u64 * 8, *w);
        }
        // persist: the whole record (with its CRC) before the caller changes
        // a slot it names, so a crash in that change finds it.
        self.pool.persist(off, 64);
    }

    fn clear_log(&self, slot: usize) {
        let off = self.root + R_LOGS + slot as u64 * 64;
        self.pool.store_u64(off, 0);
        // persist: flushed here, durable at the caller's next fence (every
        // caller fences before it returns).
        self.pool.flush(off, 8);
        self.logs.release(slot);
    }

    /// Counts this thread's writes to this engine; every 256th refreshes
    /// the dynamic search order. No shared cache line on the write path.
    fn tick(&self) -> u64 {
        let t = self.ticks.bump();
        if t.is_multiple_of(256) {
            self.bl_first.store(
                self.counts[BOT].get() > self.counts[TOP].get(),
                Ordering::Relaxed,
            );
        }
        t
    }

    /// Finds `key` and locks its line, holding the writers' gate: `None` if
    /// absent. Updaters and removers need no key stripe: they meet at the
    /// line lock, and the loser finds the key gone or moved and looks again.
    fn lock_found(
        &self,
        key: u64,
        h: (u64, u64),
    ) -> Result<Option<(Loc, Held<'_>, engine::gate::Inside<'_>)>> {
        loop {
            // Look before taking the gate, so the misses overlap the previous
            // operation's persist; then check the geometry did not change.
            let (hit, gv) = self.find(key, h, true);
            let Some((loc, _)) = hit else { return Ok(None) };
            let gate = self.gate.enter();
            self.check_open()?;
            if self.geo_ver.load(Ordering::Acquire) != gv {
                continue;
            }
            if let Some(held) = self.lock_at(&loc, key) {
                return Ok(Some((loc, held, gate)));
            }
        }
    }

    /// Writes after `close` would change a pool already marked clean (whose
    /// counters the next open trusts): they are refused.
    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::InvalidArgument("the engine was closed".into()));
        }
        Ok(())
    }

    /// Locks the line of `loc` and checks that it still holds `key`; the
    /// words and the held lock word on success (line left locked).
    fn lock_at(&self, loc: &Loc, key: u64) -> Option<Held<'_>> {
        let w = self.pool.words(loc.line, 8);
        let held = self.lock.acquire(&w[W_LOCK]);
        let hdr = w[W_HDR].load(Ordering::Relaxed);
        if hdr & (1 << loc.slot) != 0 && w[w_key(loc.slot)].load(Ordering::Relaxed) == key {
            Some((w, held))
        } else {
            self.lock.release(&w[W_LOCK], held);
            None
        }
    }
}
