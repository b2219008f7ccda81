//! Expansion: the spiral split of the leftmost logical segment `f`.
//!
//! Logical `f`'s keys go to `2f` (a new physical segment, number `f`,
//! appended) and `2f + 1` (which keeps `f`'s physical segment). Persist
//! order:
//!
//! 1. the octave tables the new window needs (each linked by one 8-byte
//!    slot store) and, if segment `f` starts a new directory entry, its
//!    array (linked by one 8-byte entry store);
//! 2. the new segment: zeroed, filled with the movers (records whose index
//!    in the new window maps to segment `f`), flushed — invisible, since
//!    segments `≥ first` are unused;
//! 3. **commit**: one 8-byte store of `first = f + 1`, persisted; only then
//!    do readers see the new state;
//! 4. the old segment: movers' allocation bits cleared, hints rebuilt,
//!    persisted. Until then it holds stale copies that no search reaches;
//!    a crash here leaves them to recovery, which drops every record whose
//!    index maps elsewhere (otherwise the next split of that segment would
//!    resurrect them).
//! 5. compaction: chain records that now fit in the old segment's buckets
//!    move there (copy, then clear), and empty chain buckets are freed.
//!
//! The old segment's every bucket (and its chain) is locked from step 2 to
//! the end, so writers wait and optimistic readers retry.

use std::sync::atomic::Ordering;

use engine::Result;
use pmem::{Link, Pool};

use crate::layout::*;
use crate::ops::{slot_bits, Held, Kind, Loc, Placed, Placing, Rec};
use crate::{spiral, table, table_slot, Pass, Snap};

impl Pass {
    /// Every valid record of `seg`: location, key word, value.
    pub(crate) fn records(&self, seg: u64) -> Vec<(Loc, u64, u64)> {
        let mut out = Vec::new();
        let g = self.geo;
        for b in 0..g.n + g.m {
            let bo = g.bucket(seg, b);
            let kind = if b < g.n {
                Kind::Normal
            } else {
                Kind::Stash(b - g.n)
            };
            self.bucket_records(bo, kind, &mut out);
        }
        for g in 0..self.geo.groups() {
            let mut chain = Vec::new();
            self.chain_of_group(seg, g, &mut chain);
            for cb in chain {
                self.bucket_records(cb, Kind::Chain(g), &mut out);
            }
        }
        out
    }

    /// Every slot of `seg` whose key word is not 0, whatever its bucket's
    /// hints say: what a record is after a crash.
    pub(crate) fn slots_in_use(&self, seg: u64) -> Vec<(Loc, u64, u64)> {
        let mut out = Vec::new();
        let g = self.geo;
        let mut each = |bo: u64, kind: Kind| {
            for s in 0..SLOTS {
                let so = slot_off(bo, s);
                let kw = self.pool.load_u64(so);
                if kw != 0 {
                    out.push((
                        Loc {
                            bucket: bo,
                            s,
                            kind,
                        },
                        kw,
                        self.pool.load_u64(so + 8),
                    ));
                }
            }
        };
        for b in 0..g.n + g.m {
            let kind = if b < g.n {
                Kind::Normal
            } else {
                Kind::Stash(b - g.n)
            };
            each(g.bucket(seg, b), kind);
        }
        for g in 0..self.geo.groups() {
            let mut chain = Vec::new();
            self.chain_of_group(seg, g, &mut chain);
            for cb in chain {
                each(cb, Kind::Chain(g));
            }
        }
        out
    }

    fn bucket_records(&self, bo: u64, kind: Kind, out: &mut Vec<(Loc, u64, u64)>) {
        for s in ones(alloc(self.pool.load_u64(bo + B_META))) {
            let so = slot_off(bo, s);
            out.push((
                Loc {
                    bucket: bo,
                    s,
                    kind,
                },
                self.pool.load_u64(so),
                self.pool.load_u64(so + 8),
            ));
        }
    }

    /// Chain buckets of `seg`, group by group, each head first.
    pub(crate) fn chain_of(&self, seg: u64) -> Vec<u64> {
        let mut v = Vec::new();
        for g in 0..self.geo.groups() {
            self.chain_of_group(seg, g, &mut v);
        }
        v
    }

    /// Appends the chain buckets of group `g` of `seg` to `v`, head first.
    pub(crate) fn chain_of_group(&self, seg: u64, g: u64, v: &mut Vec<u64>) {
        let mut cb = self.pool.load_u64(chain_head(seg, g));
        while cb != 0 {
            v.push(cb);
            cb = chain_next(self.pool.load_u64(cb + B_META));
        }
    }

    /// Frees every chain of `seg`, each head first: each step is one
    /// persisted 8-byte store of the head (the free lane decides on it).
    pub(crate) fn free_chain(&self, seg: u64) -> Result<()> {
        for g in 0..self.geo.groups() {
            let hw = chain_head(seg, g);
            loop {
                let head = self.pool.load_u64(hw);
                if head == 0 {
                    break;
                }
                let next = chain_next(self.pool.load_u64(head + B_META));
                let t = self.pool.begin_free(head, Link::Pointer { owner: hw })?;
                // persist: the head moves past the bucket before it is freed.
                self.pool.store_u64(hw, next);
                self.pool.persist(hw, 8);
                self.pool.finish_free(t);
                self.t.chain_freed.fetch_add(1, Ordering::Relaxed);
                self.t.chain_buckets.fetch_sub(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Recomputes the overflow hints (fingerprints, counts, chain flags) of
    /// `seg`'s normal buckets from its stash and chain. The caller holds
    /// the whole segment (or it is not live).
    pub(crate) fn rebuild_hints(&self, seg: u64) -> Result<()> {
        let g = self.geo;
        let hint_bits = ((1u64 << 28) - 1) << OFP_VALID_SHIFT | 0xff << OFP2_SHIFT;
        for b in 0..g.n {
            let mw = self.pool.atomic_u64(g.bucket(seg, b) + B_META);
            mw.store(mw.load(Ordering::Relaxed) & !hint_bits, Ordering::Relaxed);
            self.pool.store_u64(chain_filter(seg, b), 0);
        }
        for j in 0..g.m {
            let bo = g.bucket(seg, g.n + j);
            for s in ones(alloc(self.pool.load_u64(bo + B_META))) {
                let h = self.hash_kw(self.pool.load_u64(slot_off(bo, s)))?;
                self.add_hint(seg, h, j, false);
            }
        }
        for cb in self.chain_of(seg) {
            for s in ones(alloc(self.pool.load_u64(cb + B_META))) {
                let h = self.hash_kw(self.pool.load_u64(slot_off(cb, s)))?;
                let bix = self.fp_bix(h).1;
                let mw = self.pool.atomic_u64(g.bucket(seg, bix) + B_META);
                mw.store(
                    mw.load(Ordering::Relaxed) | overflow_bit(h),
                    Ordering::Relaxed,
                );
                let fw = self.pool.atomic_u64(chain_filter(seg, bix));
                fw.store(
                    fw.load(Ordering::Relaxed) | filter_bits(h),
                    Ordering::Relaxed,
                );
            }
        }
        Ok(())
    }

    /// Splits logical segment `first`. `Ok(false)`: the table is at the
    /// largest size its mapping table resolves. The caller holds `split_mx`.
    pub(crate) fn split_one(&self) -> Result<bool> {
        let g = self.geo;
        let sn = self.snap();
        let f = sn.first;
        if f + 1 > max_first(MAX_K) {
            return Ok(false);
        }
        let f2 = f + 1;
        // Step 1: the tables of the new window — at a larger k when the
        // cells would get wider than the narrowest bucket — and the array
        // for segment f. Replaced blocks are dead octaves or tables of the
        // old k that no current snapshot can still be using... except a
        // stale reader's, which validates its snapshot and retries.
        let k2 = sn.k.max(crate::table::cells_for(f2));
        // Octaves of both windows (at most three), so that every crash
        // state — (k, f), (k2, f), (k2, f2) — finds its tables.
        let (lo, _) = crate::window_octaves(f);
        let (_, hi) = crate::window_octaves(f2);
        for o in lo..=hi {
            let slot = crate::table_slot(o, k2);
            let cur = self.pool.load_u64(self.root + slot);
            let ok = cur != 0
                && self.pool.load_u64(cur + 8) == o as u64
                && self.pool.load_u64(cur + 16) == k2 as u64;
            if !ok {
                Self::write_octave(&self.pool, self.root, o, k2, cur)?;
                self.t.octaves_built.fetch_add(1, Ordering::Relaxed);
            }
        }
        let tables: [u64; 3] = std::array::from_fn(|s| {
            self.pool
                .load_u64(self.root + R_TABLES + 8 * (3 * (k2 as u64 % 2) + s as u64))
        });
        if k2 != sn.k {
            // persist: the new k after its tables, before the split commits.
            // Readers move to it at once (the tables cover the current
            // window too), so DRAM and PM agree even if the split fails.
            self.pool.store_u64(self.root + R_K, k2 as u64);
            self.pool.persist(self.root + R_K, 8);
            self.publish(f, k2, tables);
        }
        let (e, _) = dir_pos(f);
        if self.dir[e].load(Ordering::Acquire) == 0 {
            let blk = Self::new_array(&self.pool, &g, self.root, e)?;
            self.dir[e].store(blk, Ordering::Release);
        }
        let sn2 = Snap {
            v: sn.v,
            first: f2,
            cf: crate::table::fine_log2(f2),
            k: k2,
            tables,
        };
        let new = self.seg_off(f).expect("array just ensured");
        let p_old = spiral::physical(f);
        let old = self.seg_off(p_old).expect("live segment has an array");
        // Step 2: the new segment. Unused segments never keep a chain
        // (recovery frees them), so zeroing it leaks nothing.
        self.free_chain(new)?;
        self.pool.zero(new, g.seg_bytes() as usize);
        let mut held = Held::new(self);
        for b in 0..g.n + g.m {
            held.lock(g.bucket(old, b));
        }
        held.lock(old + H_LOCK);
        // Chain buckets are held apart: compaction releases them before it
        // frees any (writers stay out: they need a normal bucket first).
        let mut chain_held = Held::new(self);
        for cb in self.chain_of(old) {
            chain_held.lock(cb);
        }
        let recs = self.records(old);
        let mut movers = Vec::new();
        for &(loc, kw, v) in &recs {
            let h = self.hash_kw(kw)?;
            match self.phys_of(h, &sn2) {
                Some(p) if p == f => movers.push((loc, kw, v, h)),
                Some(p) if p == p_old => {}
                other => {
                    return Err(crate::corrupt(format!(
                        "record in segment {p_old} maps to {other:?} after the split of {f}"
                    )))
                }
            }
        }
        // The new segment is not live yet: no lock to take, and no record
        // persisted one by one (the whole segment is, before the commit).
        let how = Placing {
            persist: false,
            all_locked: true,
            allow_chain: true,
        };
        for &(_, kw, v, h) in &movers {
            if let Err(e) = self.place(new, h, Rec::Moved(kw), v, how) {
                let _ = self.free_chain(new);
                return Err(e);
            }
        }
        self.pool.store_u64(new + H_LOGICAL, 2 * f);
        // persist: every line of the new segment and its chain before the
        // commit store makes it live.
        self.pool.flush(new, g.seg_bytes() as usize);
        for cb in self.chain_of(new) {
            self.pool.flush(cb, BUCKET as usize);
        }
        self.pool.fence();
        // Step 3: commit.
        self.pool.store_u64(self.root + R_FIRST, f2);
        self.pool.persist(self.root + R_FIRST, 8);
        // Step 4: drop the movers' stale copies from the old segment (still
        // locked; readers and writers of the new state wait for step 4 to
        // be durable, so no key block a stale copy names is freed and
        // reused before the copy is gone).
        // A segment's slot lines hold two to four slots each, and a split
        // moves about half of the records: each dirty line is flushed
        // once (a flush per mover cost a fifth of the growing insert's
        // time in `split_one`, perf). Line 0 of every bucket is flushed
        // with the meta below.
        let seg_end = old + g.seg_bytes();
        let mut dirty = vec![0u64; (g.seg_bytes() / LINE).div_ceil(64) as usize];
        for &(loc, ..) in &movers {
            let so = slot_off(loc.bucket, loc.s);
            self.pool.store_u64(so, 0);
            let mw = self.pool.atomic_u64(loc.bucket + B_META);
            let bits = slot_bits(loc.kind, loc.s);
            mw.store(mw.load(Ordering::Relaxed) & !bits, Ordering::Release);
            let line = so & !(LINE - 1);
            if line == loc.bucket {
                continue;
            }
            if (old..seg_end).contains(&line) {
                let i = ((line - old) / LINE) as usize;
                dirty[i / 64] |= 1 << (i % 64);
            } else {
                self.pool.flush(line, LINE as usize);
            }
        }
        for (wi, &w) in dirty.iter().enumerate() {
            for b in ones(w) {
                self.pool
                    .flush(old + (wi as u64 * 64 + b as u64) * LINE, LINE as usize);
            }
        }
        self.rebuild_hints(old)?;
        self.pool.store_u64(old + H_LOGICAL, 2 * f + 1);
        // persist: the zeroed key words, the cleared bits and rebuilt hints
        // (every bucket's line 0, the header, the chain) — order among them
        // does not matter.
        self.flush_meta(old);
        self.pool.fence();
        self.publish(f2, k2, tables);
        self.set_threshold(f2);
        // Step 5: chain records move into the room the movers left.
        self.compact_chain(old, chain_held)?;
        drop(held);
        self.t.splits.fetch_add(1, Ordering::Relaxed);
        self.t
            .moved
            .fetch_add(movers.len() as u64, Ordering::Relaxed);
        Ok(true)
    }

    /// Flushes the header and every bucket's meta line of `seg` and its
    /// chain (no fence).
    pub(crate) fn flush_meta(&self, seg: u64) {
        self.pool.flush(seg, self.geo.header() as usize);
        for b in 0..self.geo.n + self.geo.m {
            self.pool.flush(self.geo.bucket(seg, b), LINE as usize);
        }
        for cb in self.chain_of(seg) {
            self.pool.flush(cb, LINE as usize);
        }
    }

    /// Moves chain records of `seg` (whole segment held) into free normal
    /// and stash slots, then frees chain buckets left empty.
    fn compact_chain(&self, seg: u64, chain_held: Held) -> Result<()> {
        let chain = self.chain_of(seg);
        if chain.is_empty() {
            return Ok(());
        }
        for &cb in &chain {
            for s in ones(alloc(self.pool.load_u64(cb + B_META))) {
                let so = slot_off(cb, s);
                let kw = self.pool.load_u64(so);
                let v = self.pool.load_u64(so + 8);
                let h = self.hash_kw(kw)?;
                let bix = self.fp_bix(h).1;
                // persist: the copy (persisted by place) before the chain
                // slot is cleared: a crash leaves a duplicate, which
                // recovery drops, never a loss.
                let how = Placing {
                    persist: true,
                    all_locked: true,
                    allow_chain: false,
                };
                if self.place(seg, h, Rec::Moved(kw), v, how)? == Placed::NoRoom {
                    continue;
                }
                self.clear_slot(cb, s, Kind::Chain(chain_group(bix)), true, false)?;
            }
        }
        drop(chain_held);
        // Unlink empty chain buckets; each unlink is one persisted store
        // of the pointer that names the bucket.
        for g in 0..self.geo.groups() {
            self.unlink_empty(seg, g)?;
        }
        // The chain flags follow what is left.
        self.rebuild_hints(seg)?;
        self.flush_meta(seg);
        self.pool.fence();
        Ok(())
    }

    /// Unlinks and frees the empty buckets of chain group `g` of `seg`
    /// (whole segment held).
    fn unlink_empty(&self, seg: u64, g: u64) -> Result<()> {
        let hw = chain_head(seg, g);
        let mut chain = Vec::new();
        self.chain_of_group(seg, g, &mut chain);
        let mut prev: Option<u64> = None;
        for &cb in &chain {
            let mb = self.pool.load_u64(cb + B_META);
            if alloc(mb) != 0 {
                prev = Some(cb);
                continue;
            }
            let next_bits = mb & !ALLOC_MASK;
            let (owner, link) = match prev {
                None => (hw, Link::Pointer { owner: hw }),
                Some(pb) => {
                    let pm = self.pool.load_u64(pb + B_META);
                    (
                        pb + B_META,
                        Link::Word {
                            owner: pb + B_META,
                            value: pm,
                        },
                    )
                }
            };
            let t = self.pool.begin_free(cb, link)?;
            // persist: the predecessor skips the bucket before it is freed.
            match prev {
                None => self.pool.store_u64(owner, chain_next(mb)),
                Some(_) => {
                    let pm = self.pool.load_u64(owner);
                    self.pool.store_u64(owner, (pm & ALLOC_MASK) | next_bits);
                }
            }
            self.pool.persist(owner & !7, 8);
            self.pool.finish_free(t);
            self.t.chain_freed.fetch_add(1, Ordering::Relaxed);
            self.t.chain_buckets.fetch_sub(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Publishes a new spiral state to readers (the caller holds
    /// `split_mx`, or no one else runs), with the DRAM mapping cells of
    /// its window ([`mirror`]). The segment arrays the window reaches are
    /// in `dir` already.
    pub(crate) fn publish(&self, first: u64, k: u32, tables: [u64; 3]) {
        let (f0, k0) = (
            self.s_first.load(Ordering::Relaxed),
            self.s_k.load(Ordering::Relaxed) as u32,
        );
        let cf = table::fine_log2(first);
        let end = cf + (1 << table::FINE);
        // A split (`first` one more, same k) brings in the cells of the
        // old segment's two children, `S(2·f0) .. S(2·first)`; the rest of
        // the window keeps its buckets and their segments. Anything else
        // fills the whole window: a new k into cells no reader uses yet
        // (readers take the cells of the k they read), before the publish.
        let step = k == k0 && f0 != 0 && first == f0 + 1;
        if !step && k != k0 {
            self.mirror_fill(first, k, tables, cf, end);
        }
        let v = self.sv.load(Ordering::Relaxed);
        self.sv.store(v | 1, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        if step {
            self.mirror_fill(
                first,
                k,
                tables,
                table::fine_log2(f0) + (1 << table::FINE),
                end,
            );
        } else if k == k0 {
            self.mirror_fill(first, k, tables, cf, end);
        }
        self.s_first.store(first, Ordering::Relaxed);
        self.s_cf.store(cf, Ordering::Relaxed);
        self.s_k.store(k as u64, Ordering::Relaxed);
        for (t, b) in self.tables.iter().zip(tables) {
            t.store(b, Ordering::Relaxed);
        }
        self.sv.store((v | 1) + 1, Ordering::Release);
    }

    /// Writes the DRAM cells (at `2^k` per octave) that cover fine
    /// positions `lo .. hi` of the window of `first`, from the PM octave
    /// tables `tables` of that `k`.
    fn mirror_fill(&self, first: u64, k: u32, tables: [u64; 3], lo: u64, hi: u64) {
        let sh = table::FINE - k;
        for j in lo >> sh..=(hi - 1) >> sh {
            let tb = tables[((j >> k) % 3) as usize];
            let e = if tb == 0 {
                0
            } else {
                self.pool
                    .load_u64(tb + OCT_HEADER + 8 * (j & ((1 << k) - 1)))
            };
            let l = e & 0xffff_ffff;
            let seg = (first..2 * first)
                .contains(&l)
                .then(|| self.seg_off(spiral::physical(l)))
                .flatten();
            let boff = e >> 32;
            self.mirror
                .set(k, j, seg, if boff == 0 { 1 << sh } else { boff });
        }
    }

    /// Builds octave `o`'s table at `2^k` cells into a new block and links
    /// it into its root slot (`table_slot`), freeing `old`, the block it
    /// replaces: a dead octave of this `k`'s parity (`k − 2`, or an octave
    /// no window of this size reaches). Returns the new block.
    pub(crate) fn write_octave(pool: &Pool, root: u64, o: u32, k: u32, old: u64) -> Result<u64> {
        let owner = root + table_slot(o, k);
        let size = octave_bytes(k);
        let r = pool.reserve(size, Link::Pointer { owner })?;
        let blk = r.offset();
        let cells = table::exact_octave(o, k);
        let mut bytes = Vec::with_capacity(size as usize);
        for w in [OCT_MAGIC, o as u64, k as u64, 1u64 << k] {
            bytes.extend_from_slice(&w.to_le_bytes());
        }
        bytes.resize(OCT_HEADER as usize, 0);
        for &c in &cells {
            bytes.extend_from_slice(&c.to_le_bytes());
        }
        pool.write_nt(blk, &bytes);
        // persist: the table (non-temporal stores) before the slot names it.
        pool.fence();
        let ticket = if old != 0 {
            match pool.begin_free(old, Link::Pointer { owner }) {
                Ok(t) => Some(t),
                Err(e) => {
                    pool.cancel(r);
                    return Err(e.into());
                }
            }
        } else {
            None
        };
        // persist: one 8-byte store links the new octave and unlinks the
        // one it replaces (both lanes decide on this word).
        pool.store_u64(owner, blk);
        pool.persist(owner, 8);
        pool.commit(r);
        if let Some(t) = ticket {
            pool.finish_free(t);
        }
        Ok(blk)
    }

    /// Allocates the segment array of directory entry `e`, zeroed, and
    /// links it into the root's directory.
    pub(crate) fn new_array(pool: &Pool, geo: &Geo, root: u64, e: usize) -> Result<u64> {
        let owner = root + R_DIR + 8 * e as u64;
        let size = entry_segments(e) * geo.seg_bytes();
        let r = pool.reserve(size, Link::Pointer { owner })?;
        let blk = r.offset();
        // An unused segment must read zero (recovery reads its chain
        // heads), although each split zeroes its new segment again. Space
        // the pool never used reads zero already (`is_zeroed`: above the
        // allocator's high-water mark, reserved by the file system when
        // the pool was made or grew), so only a reused block is zeroed:
        // through non-temporal stores in pieces (arrays reach MiBs).
        if !r.is_zeroed() {
            let zero = vec![0u8; 64 << 10];
            let mut off = 0;
            while off < size {
                let n = (size - off).min(zero.len() as u64);
                pool.write_nt(blk + off, &zero[..n as usize]);
                off += n;
            }
        }
        // persist: the zeroed array before the directory entry names it.
        pool.fence();
        pool.store_u64(owner, blk);
        pool.persist(owner, 8);
        pool.commit(r);
        Ok(blk)
    }
}
