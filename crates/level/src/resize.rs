//! The structural changes: expansion (a new top level of 2N buckets; the
//! old bottom becomes the interim level and is rehashed into the top two)
//! and shrinking (a new bottom level of N/4; the old top becomes the
//! interim level), each committed by a geometry record and one 8-byte
//! selector store, with the interim level rehashed in batches, shared
//! among threads when it is large.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use engine::{Error, Result};
use pmem::Link;

use crate::layout::*;
use crate::ops::Fence;
use crate::{Geo, Level, BOT, IL, MAX_BUCKETS, TOP};

/// Interim buckets rehashed per batch (two fences per batch).
const REHASH_BATCH: u64 = 8;
/// Slots of a rehash batch: two lines a bucket.
const BATCH_SLOTS: usize = REHASH_BATCH as usize * 2 * SLOTS_PER_LINE;
/// An expansion's interim level of at least this many buckets is rehashed
/// by several threads (`EngineConfig::threads`, at most 8).
const PARALLEL_REHASH_BUCKETS: u64 = 1024;
/// A table of more than this many top buckets shrinks when its items fall
/// below 1/[`SHRINK_DIVISOR_LARGE`] of the slots; a smaller one below 1/5
/// (the result is at most 2/5 full). Both take the same shrink path.
const SHRINK_LARGE_TOP: u64 = 1024;
/// Shrink when items fall below 1/5 of the slots (tables of at most
/// [`SHRINK_LARGE_TOP`] top buckets: a shrink of at most ~6k items takes
/// well under a millisecond, so giving memory back early costs nothing).
const SHRINK_DIVISOR: u64 = 5;
/// Shrink a larger table when its items fall below 1/10 of the slots (the
/// result is at most 1/5 full). A shrink rehashes the old top level (about
/// 2/3 of the items, ~500 ns each on a 2-vCPU EPYC), so a draining table
/// that waits until it is this sparse moves half as many items per shrink
/// as at 1/5. The cost is memory: a table between 1/10 and 1/5 full keeps
/// twice the slots it needs. Expansion happens only on an insertion
/// failure (0.8 to 0.9 load), far above, so a table never alternates
/// between expanding and shrinking.
const SHRINK_DIVISOR_LARGE: u64 = 10;

impl Level {
    fn write_record(&self, r: &Record) {
        let off = self.root + R_RECORDS + (r.seq % 2) * 64;
        for (i, w) in r.encode().iter().enumerate() {
            self.pool.store_u64(off + i as u64 * 8, *w);
        }
        // persist: the whole record before the selector names it (CRASH-
        // PATTERNS #2: geometry changes with one 8-byte store).
        self.pool.persist(off, 64);
        self.pool.store_u64(self.root + R_SELECTOR, r.seq);
        self.pool.persist(self.root + R_SELECTOR, 8);
    }

    fn new_level(&self, n: u64, seq: u64) -> Result<pmem::Reservation> {
        let r = self.pool.reserve(
            level_alloc_bytes(n),
            Link::Word {
                owner: self.root + R_SELECTOR,
                value: seq,
            },
        )?;
        self.pool.zero(r.offset(), r.size() as usize);
        // persist: an empty level (all tokens 0) before a record names it.
        self.pool.flush(r.offset(), r.size() as usize);
        self.pool.fence();
        Ok(r)
    }

    /// Expands the table if its geometry is still `seen` (another writer may
    /// have done it already). Writers are excluded, readers are not.
    pub(crate) fn expand(&self, seen: u64) -> Result<()> {
        let start = std::time::Instant::now();
        let _w = self.gate.close();
        let g = self.geo_fields();
        if g.seq != seen {
            return Ok(());
        }
        if g.phase != Phase::Normal {
            return self.finish_resize(&g, false, None);
        }
        let len = self.counts.iter().map(|c| c.get()).sum::<i64>().max(0) as f64;
        let lf = len / Self::slots(&g) as f64;
        if lf > f64::from_bits(self.max_lf_bits.load(Ordering::Relaxed)) {
            self.max_lf_bits.store(lf.to_bits(), Ordering::Relaxed);
        }
        if lf < f64::from_bits(self.min_lf_bits.load(Ordering::Relaxed)) {
            self.min_lf_bits.store(lf.to_bits(), Ordering::Relaxed);
        }
        let top_n = g.lv[TOP].n * 2;
        if top_n > MAX_BUCKETS {
            return Err(Error::OutOfSpace(format!(
                "the top level cannot grow past {MAX_BUCKETS} buckets"
            )));
        }
        let r = self.new_level(top_n, g.seq + 1)?;
        let rec = Record {
            seq: g.seq + 1,
            top: Lvl {
                raw: r.offset(),
                n: top_n,
            },
            bot: g.lv[TOP],
            il: g.lv[BOT],
            phase: Phase::Expanding,
        };
        let (t, b) = (self.counts[TOP].get(), self.counts[BOT].get());
        self.expansions.fetch_add(1, Ordering::Relaxed);
        let done = self.start_resize(r, &rec, [0, t, b], None);
        if done.is_ok() {
            self.structural.record(start);
        }
        done
    }

    /// Shrinks the table if its geometry is still `seen` and it is still
    /// sparse enough.
    fn shrink(&self, seen: u64) -> Result<()> {
        let start = std::time::Instant::now();
        let _w = self.gate.close();
        let g = self.geo_fields();
        let len = self.counts.iter().map(|c| c.get()).sum::<i64>().max(0) as u64;
        if g.seq != seen
            || g.phase != Phase::Normal
            || g.lv[TOP].n / 2 < self.min_top
            || len * Self::shrink_divisor(&g) >= Self::slots(&g)
        {
            return Ok(());
        }
        let Some(plan) = self.shrink_plan(&g) else {
            return Ok(());
        };
        let bot_n = g.lv[TOP].n / 4;
        let r = self.new_level(bot_n, g.seq + 1)?;
        let rec = Record {
            seq: g.seq + 1,
            top: g.lv[BOT],
            bot: Lvl {
                raw: r.offset(),
                n: bot_n,
            },
            il: g.lv[TOP],
            phase: Phase::Shrinking,
        };
        let (t, b) = (self.counts[TOP].get(), self.counts[BOT].get());
        self.shrinks.fetch_add(1, Ordering::Relaxed);
        let done = self.start_resize(r, &rec, [b, 0, t], Some(&plan));
        if done.is_ok() {
            self.structural.record(start);
        }
        done
    }

    /// Makes `rec` (a resize with its new level reserved in `r`) current,
    /// relabels the per-level counts to `counts` (top, bottom, interim),
    /// publishes the geometry to readers, and rehashes the interim level.
    fn start_resize(
        &self,
        r: pmem::Reservation,
        rec: &Record,
        counts: [i64; 3],
        plan: Option<&[u8]>,
    ) -> Result<()> {
        // persist: the new level is zeroed and durable (`new_level`) before
        // the record names it; the record, then the selector
        // (`write_record`), before the reservation is committed, because
        // the selector store is the link that keeps the new level allocated
        // (CRASH-PATTERNS #2, #8).
        self.write_record(rec);
        self.pool.commit(r);
        for (c, v) in self.counts.iter().zip(counts) {
            c.set(v);
        }
        let g = Geo::from_record(rec);
        self.publish(&g);
        self.finish_resize(&g, true, plan)
    }

    /// Rehashes every item left in the interim level into the top two
    /// levels, then drops the interim level. Callers hold the gate
    /// exclusively (or are `open`). `fresh`: the resize was started by
    /// this handle and nothing interrupted its rehash, so no interim item
    /// can have a copy in the top two levels yet and none is looked for.
    /// `plan`: a shrink's placements ([`shrink_plan`](Self::shrink_plan)),
    /// computed by this handle after it closed the gate.
    pub(crate) fn finish_resize(&self, g: &Geo, fresh: bool, plan: Option<&[u8]>) -> Result<()> {
        let il = g.lv[IL];
        let batches = il.n.div_ceil(REHASH_BATCH);
        // An expansion's rehash is shared, and so is a shrink's that follows
        // its plan (each item goes to the bucket the plan chose, which has
        // room whatever the order). A shrink resumed by `open` has no plan
        // and keeps to one thread.
        let shared = g.phase == Phase::Expanding || plan.is_some();
        let helpers = if shared && il.n >= PARALLEL_REHASH_BUCKETS {
            self.rehash_threads.min(batches as usize)
        } else {
            1
        };
        // Batches are claimed in order from one cursor, by this thread and
        // `helpers - 1` more (the writers the gate holds back would
        // otherwise wait idle). Each batch is rehashed by exactly one
        // thread and keeps its own persist order (`rehash_batch`); batches
        // share nothing but the line locks every writer takes.
        let next = AtomicU64::new(0);
        let stop = AtomicBool::new(false);
        let work = || -> Result<()> {
            while !stop.load(Ordering::Relaxed) {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= batches {
                    break;
                }
                let b = i * REHASH_BATCH;
                let done = self.rehash_batch(g, b..(b + REHASH_BATCH).min(il.n), fresh, plan);
                if done.is_err() {
                    stop.store(true, Ordering::Relaxed);
                    return done;
                }
            }
            Ok(())
        };
        if helpers > 1 {
            self.parallel_rehashes.fetch_add(1, Ordering::Relaxed);
            std::thread::scope(|sc| {
                // A helper's flushes and fences are charged to this
                // thread, whose operation they belong to (per-operation
                // persist counts stay whole).
                let others: Vec<_> = (1..helpers)
                    .map(|_| {
                        sc.spawn(|| {
                            let before = pmem::persist::counters();
                            let done = work();
                            (done, pmem::persist::counters().since(&before))
                        })
                    })
                    .collect();
                let mine = work();
                others
                    .into_iter()
                    .map(|t| {
                        let (done, spent) =
                            t.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
                        pmem::persist::add_counters(&spent);
                        done
                    })
                    .fold(mine, |a, b| a.and(b))
            })?;
        } else {
            work()?;
        }
        let ticket = self.pool.begin_free(
            il.raw,
            Link::Word {
                owner: self.root + R_SELECTOR,
                value: g.seq,
            },
        )?;
        let rec = Record {
            seq: g.seq + 1,
            top: g.lv[TOP],
            bot: g.lv[BOT],
            il: Lvl::default(),
            phase: Phase::Normal,
        };
        // persist: every rehashed copy is durable (each batch fences)
        // before the record that drops the interim level; that record's
        // selector store is the unlink, durable (`write_record`) before
        // `finish_free` gives the block back (CRASH-PATTERNS #8).
        self.write_record(&rec);
        self.pool.finish_free(ticket);
        self.counts[IL].set(0);
        self.publish(&Geo::from_record(&rec));
        self.bl_first.store(
            self.counts[BOT].get() > self.counts[TOP].get(),
            Ordering::Relaxed,
        );
        Ok(())
    }

    /// Rehashes the items of interim buckets `range` with two fences for
    /// the batch instead of two per item.
    ///
    /// persist: every copy placed in the top two levels (flushed by its
    /// direct placement, or fenced by a movement) is made durable by one
    /// fence before any interim token of the batch is cleared; the cleared
    /// headers (one 8-byte store per line) are then flushed and fenced
    /// before the next batch starts. A crash in between leaves items valid
    /// in both places, which recovery's non-fresh rehash removes (the
    /// paper's I_first rule). Readers never act on a non-durable copy's
    /// absence or presence alone: until the fence the same item is valid
    /// and durable in the interim level, which readers probe too.
    fn rehash_batch(
        &self,
        g: &Geo,
        range: std::ops::Range<u64>,
        fresh: bool,
        plan: Option<&[u8]>,
    ) -> Result<()> {
        let il = g.lv[IL];
        let top = g.lv[TOP];
        let mut items = [(0u64, 0u64, 0u64, (0u64, 0u64)); BATCH_SLOTS];
        let mut n = 0;
        for b in range.clone() {
            for (half, line) in [il.bucket(b), il.bucket(b) + LINE].into_iter().enumerate() {
                let w = self.pool.words(line, 8);
                let hdr = w[W_HDR].load(Ordering::Relaxed);
                for s in 0..SLOTS_PER_LINE {
                    if hdr & (1 << s) == 0 {
                        continue;
                    }
                    let k = w[w_key(s)].load(Ordering::Relaxed);
                    let h = self.hashes(k);
                    // The top level's candidates are where a direct
                    // placement looks first: start loading them now.
                    let (c, nc) = Self::cands(&top, h);
                    for &tb in &c[..nc] {
                        self.pool.prefetch(top.bucket(tb));
                        self.pool.prefetch(top.bucket(tb) + LINE);
                    }
                    let slot_id =
                        ((b - range.start) * 2 + half as u64) * SLOTS_PER_LINE as u64 + s as u64;
                    items[n] = (slot_id, k, w[w_val(s)].load(Ordering::Relaxed), h);
                    n += 1;
                }
            }
        }
        if n == 0 {
            return Ok(());
        }
        self.move_begin();
        // Bit i: interim slot `slot_id` i is placed (or had a copy already).
        let mut done = [0u64; BATCH_SLOTS.div_ceil(64)];
        let mut failed = None;
        // The lines of the direct placements, flushed after the loop: a
        // line lock taken after a `clwb` would wait for its write-back.
        let mut flush = [0u64; BATCH_SLOTS];
        let mut nf = 0;
        for &(slot_id, k, v, h) in &items[..n] {
            // An item whose copy already sits in the top two levels was
            // being rehashed when a crash hit (the paper's I_first rule,
            // applied to every remaining item).
            if !fresh && self.locate(k, h, false).0.is_some() {
                done[slot_id as usize / 64] |= 1 << (slot_id % 64);
                continue;
            }
            let placed = match plan {
                Some(p) => {
                    let code = p[(range.start * SLOTS_PER_BUCKET + slot_id) as usize];
                    self.place_planned(g, code, h, k, v)
                }
                None => self.place_rehash(g, h, k, v),
            };
            match placed {
                Some((level, line)) => {
                    if let Some(line) = line {
                        flush[nf] = line;
                        nf += 1;
                    }
                    self.counts[level].add(1);
                    done[slot_id as usize / 64] |= 1 << (slot_id % 64);
                }
                None => {
                    failed = Some(k);
                    break;
                }
            }
        }
        // persist: the copies above (flushed here, or persisted by their
        // movements) before the interim tokens below.
        for &line in &flush[..nf] {
            self.pool.flush(line, LINE as usize);
        }
        self.pool.fence();
        // The interim lines to clear, each with its rehashed slots.
        let mut lines = [(0u64, 0u64, 0u64); 2 * REHASH_BATCH as usize];
        let mut nl = 0;
        for b in range.clone() {
            for (half, line) in [il.bucket(b), il.bucket(b) + LINE].into_iter().enumerate() {
                let base = ((b - range.start) * 2 + half as u64) * SLOTS_PER_LINE as u64;
                let mask = (0..SLOTS_PER_LINE as u64)
                    .filter(|s| done[((base + s) / 64) as usize] & (1 << ((base + s) % 64)) != 0)
                    .fold(0u64, |m, s| m | 1 << s);
                if mask != 0 {
                    lines[nl] = (line, mask, 0);
                    nl += 1;
                }
            }
        }
        // All the lines are locked (in address order) before the first
        // `clwb`: a locked instruction waits for every earlier `clwb`, so
        // locking each line after the previous line's flush would wait
        // for one write-back per line.
        for (line, _, held) in &mut lines[..nl] {
            *held = self.lock.acquire(&self.pool.words(*line, 1)[W_LOCK]);
        }
        let mut cleared = 0;
        for &(line, mask, _) in &lines[..nl] {
            let w = self.pool.words(line, 8);
            let hdr = w[W_HDR].load(Ordering::Relaxed);
            // persist: one 8-byte store clears the line's rehashed
            // tokens; flushed here, fenced once for the batch below.
            w[W_HDR].store(hdr & !mask, Ordering::Release);
            self.pool.flush(line, LINE as usize);
            cleared += mask.count_ones() as i64;
        }
        for &(line, _, held) in &lines[..nl] {
            self.lock.release(&self.pool.words(line, 1)[W_LOCK], held);
        }
        self.pool.fence();
        self.move_end();
        self.counts[IL].add(-cleared);
        match failed {
            None => Ok(()),
            Some(k) => Err(Error::OutOfSpace(format!(
                "rehash of key {k:#x} found no slot in the top two levels; the resize stays in progress and every key stays reachable"
            ))),
        }
    }

    /// Placement during a rehash: direct into the top level, then direct
    /// into the bottom level, and only then the full insert algorithm. The
    /// first two steps are what [`shrink_plan`](Self::shrink_plan)
    /// simulates (a shrink started by this handle follows the plan itself:
    /// [`place_planned`](Self::place_planned)).
    ///
    /// A direct placement is neither flushed nor fenced here: the level
    /// it went to and its line, which the rehash flushes and fences once
    /// for a batch of items, before it clears their interim tokens. The
    /// full algorithm's movements persist as they go (no line to flush).
    fn place_rehash(
        &self,
        g: &Geo,
        h: (u64, u64),
        key: u64,
        value: u64,
    ) -> Option<(usize, Option<u64>)> {
        if let Some(line) = self.try_direct(&g.lv[TOP], h, key, value, Fence::Later) {
            return Some((TOP, Some(line)));
        }
        if let Some(line) = self.try_direct(&g.lv[BOT], h, key, value, Fence::Later) {
            return Some((BOT, Some(line)));
        }
        self.place(g, h, key, value).map(|level| (level, None))
    }

    /// Whether every item of the top level would find a slot by direct
    /// placement in the shrunk table (the old bottom as top, a new empty
    /// bottom of N/4), simulated in DRAM on bucket counts. A shrink that
    /// could get stuck is not started (the paper gives no fallback for a
    /// failed rehash). `Some(plan)`: every item fits, and `plan[i]` names
    /// the bucket chosen for the item in slot `i` of the old top level
    /// (bucket × 6 + line × 3 + slot): bit 1 the level (0 top, 1 bottom),
    /// bit 0 the candidate. No bucket is chosen more often than it has
    /// free slots, so the rehash may place the items in any order, on any
    /// number of threads, and never runs out of room.
    fn shrink_plan(&self, g: &Geo) -> Option<Vec<u8>> {
        let (old, top) = (g.lv[TOP], g.lv[BOT]);
        let bot = Lvl {
            raw: 0,
            n: old.n / 4,
        };
        let mut top_free: Vec<u32> = (0..top.n).map(|b| self.bucket_free(&top, b)).collect();
        let mut bot_free: Vec<u32> = vec![SLOTS_PER_BUCKET as u32; bot.n as usize];
        let mut plan = vec![0u8; (old.n * SLOTS_PER_BUCKET) as usize];
        for b in 0..old.n {
            for (half, line) in [old.bucket(b), old.bucket(b) + LINE]
                .into_iter()
                .enumerate()
            {
                let w = self.pool.words(line, 8);
                let hdr = w[W_HDR].load(Ordering::Relaxed);
                for s in 0..SLOTS_PER_LINE {
                    if hdr & (1 << s) == 0 {
                        continue;
                    }
                    let h = self.hashes(w[w_key(s)].load(Ordering::Relaxed));
                    let mut placed = false;
                    for (li, (l, free)) in [(&top, &mut top_free), (&bot, &mut bot_free)]
                        .into_iter()
                        .enumerate()
                    {
                        let (c, nc) = Self::cands(l, h);
                        let mut pick = 0;
                        if nc == 2 && free[c[1] as usize] > free[c[0] as usize] {
                            pick = 1;
                        }
                        let best = c[pick] as usize;
                        if free[best] > 0 {
                            free[best] -= 1;
                            let i = b * SLOTS_PER_BUCKET + (half * SLOTS_PER_LINE + s) as u64;
                            plan[i as usize] = (li << 1 | pick) as u8;
                            placed = true;
                            break;
                        }
                    }
                    if !placed {
                        return None;
                    }
                }
            }
        }
        Some(plan)
    }

    /// Places an interim item in the bucket `code` names (see
    /// [`shrink_plan`](Self::shrink_plan)); the level it went to and the
    /// line to flush, like a rehash's direct placement. The plan guarantees a
    /// free slot; if none is found anyway the full algorithm places it.
    fn place_planned(
        &self,
        g: &Geo,
        code: u8,
        h: (u64, u64),
        key: u64,
        value: u64,
    ) -> Option<(usize, Option<u64>)> {
        let level = if code & 2 == 0 { TOP } else { BOT };
        let l = &g.lv[level];
        let (c, _) = Self::cands(l, h);
        let b = c[(code & 1) as usize];
        // persist: the copy (item before its token, `fill_slot`) is
        // flushed and fenced by `rehash_batch` before the batch clears any
        // interim token, because until that fence the interim copy is the
        // durable one.
        if let Some(line) = self.fill_bucket(l, b, key, value, Fence::Later) {
            return Some((level, Some(line)));
        }
        self.place_rehash(g, h, key, value)
    }

    /// Items below 1/this of the slots make the table shrink.
    fn shrink_divisor(g: &Geo) -> u64 {
        if g.lv[TOP].n > SHRINK_LARGE_TOP {
            SHRINK_DIVISOR_LARGE
        } else {
            SHRINK_DIVISOR
        }
    }

    /// Every 128th remove of a thread: refresh the dynamic search order and
    /// shrink if the table became sparse.
    pub(crate) fn maybe_shrink(&self, t: u64) {
        if !t.is_multiple_of(128) {
            return;
        }
        self.bl_first.store(
            self.counts[BOT].get() > self.counts[TOP].get(),
            Ordering::Relaxed,
        );
        let g = self.geo_fields();
        let len = self.counts.iter().map(|c| c.get()).sum::<i64>().max(0) as u64;
        if g.phase == Phase::Normal
            && g.lv[TOP].n / 2 >= self.min_top
            && len * Self::shrink_divisor(&g) < Self::slots(&g)
        {
            // A failed shrink (out of space for the small new level) leaves
            // the table as it was; there is nothing to report to the caller
            // whose delete succeeded.
            let _ = self.shrink(g.seq);
        }
    }
}
