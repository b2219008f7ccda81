//! Structural changes (split, overflow, merge), durability (sync, close)
//! and the `Engine` implementation.

use std::sync::atomic::Ordering;

use super::*;

impl Hmeh {
    /// Copies the items of locked segment `src` that `dst_id` owns into a
    /// fresh segment at `dst`, each into the same slot position (so it
    /// always fits). The copies in `src` stay: they turn invalid when
    /// `src`'s local depth grows (paper §3.3). Returns (items, stash bits).
    ///
    /// persist: eager: the whole segment is flushed, durable at the
    /// caller's next fence. Delayed (relaxed durability, a node with a
    /// live backup): the buckets were zeroed by non-temporal stores (durable
    /// at that fence) and only the header is flushed; the items reach PM by
    /// eviction, and the backup covers them until the next `sync`.
    fn fill_half(
        &self,
        src: u64,
        src_id: Ident,
        dst: u64,
        dst_id: Ident,
        delayed: bool,
        backup: u64,
    ) -> (u64, Spill) {
        self.init_segment(dst, dst_id, delayed);
        let geo = self.geo;
        let mut kept = Spill::default();
        // The items that move: (line, slot) in `src`, words.
        let mut moving: Vec<(u64, usize, u64, u64)> = Vec::with_capacity(geo.slots() as usize);
        for l in 1..geo.lines {
            let bucket = (l <= geo.buckets).then_some(l - 1);
            let sw = self.words(src + l * LINE);
            for s in 0..SLOTS {
                let w0 = sw[2 * s].load(Ordering::Relaxed);
                let w1 = sw[2 * s + 1].load(Ordering::Relaxed);
                if !self.valid(src_id, w0, w1, bucket) {
                    continue;
                }
                let h = decode_slot(w0, w1).0;
                if dst_id.owns(h) {
                    moving.push((l, s, w0, w1));
                } else if let Some(b) = bucket.filter(|&b| b != geo.home(h)) {
                    // Stays in `src`: its spill bits after the split.
                    kept.set(geo.home(h), geo.dist(geo.home(h), b));
                }
            }
        }
        // Where they go: each as close to its home as the half-empty
        // segment allows (first free slot of its window, in home order;
        // then the stash), so that `dst`'s lookups read fewer buckets. If
        // that does not place every item, each keeps its `src` position
        // (always free in `dst`).
        let plan = self
            .compact_plan(&moving)
            .unwrap_or_else(|| moving.iter().map(|&(l, s, _, _)| (l, s)).collect());
        let (mut n, mut ns, mut spill) = (0u64, 0u64, Spill::default());
        for (&(_, _, w0, w1), &(l, s)) in moving.iter().zip(&plan) {
            let bucket = (l <= geo.buckets).then_some(l - 1);
            let h = decode_slot(w0, w1).0;
            let dw = self.words(dst + l * LINE);
            // persist: as in `write_slot`: word 1 then word 0 in one
            // line, and where (zero, word 1) would read as an item
            // (a delayed segment's line may be written back between
            // the two stores) an invalid word 0 goes first.
            if self.valid(dst_id, 0, w1, bucket) {
                dw[2 * s].store(dst_id.invalid_hi() << 32, Ordering::Relaxed);
                self.t.special_writes.fetch_add(1, Ordering::Relaxed);
            }
            dw[2 * s + 1].store(w1, Ordering::Relaxed);
            dw[2 * s].store(w0, Ordering::Relaxed);
            n += 1;
            match bucket {
                None => ns |= Geometry::spill_bit(geo.home(h)),
                Some(b) if b != geo.home(h) => spill.set(geo.home(h), geo.dist(geo.home(h), b)),
                Some(_) => {}
            }
        }
        let hw = self.head(dst);
        hw[HD_COUNT].store(n, Ordering::Relaxed);
        hw[HD_STASH].store(ns, Ordering::Relaxed);
        spill.store(hw);
        // persist: with the header line flushed below.
        self.set_header(dst, W_BACKUP, backup);
        if delayed {
            self.pool.flush(dst, LINE as usize);
        } else {
            self.pool.flush(dst, self.geo.bytes() as usize);
        }
        (n, kept)
    }

    /// A placement of `moving` (in `src` order) in an empty segment: each
    /// window item in the first free slot of its window, each stash item
    /// in the stash; `None` when some item does not fit so.
    fn compact_plan(&self, moving: &[(u64, usize, u64, u64)]) -> Option<Vec<(u64, usize)>> {
        let geo = self.geo;
        let mut used = [0u8; MAX_LINES as usize];
        let mut plan = Vec::with_capacity(moving.len());
        for &(l, _, w0, w1) in moving {
            let h = decode_slot(w0, w1).0;
            let home = geo.home(h);
            let free = |b: &u64| used[*b as usize] < SLOTS as u8;
            let line = if l <= geo.buckets {
                // A window item that would need the stash: keep positions
                // instead (a stashed item costs its home's misses 16 lines).
                (0..PROBE).map(|j| geo.ring(home, j) + 1).find(free)?
            } else {
                (geo.buckets + 1..geo.lines).find(free)?
            };
            plan.push((line, used[line as usize] as usize));
            used[line as usize] += 1;
        }
        Some(plan)
    }

    fn sub_counts(&self, seg: u64, n: u64) {
        let hw = self.head(seg);
        hw[HD_COUNT].store(
            hw[HD_COUNT].load(Ordering::Relaxed).saturating_sub(n),
            Ordering::Relaxed,
        );
    }

    /// Splits locked segment `seg` (paper §3.3, Fig. 7, with the spec's F3
    /// order). Releases its lock.
    pub(crate) fn split(&self, seg: u64, id: Ident) -> Result<()> {
        self.note_split_load();
        // Step A: the FS-directory must resolve LD + 1 bits.
        let mut d = self.dir.current();
        while d.gd < id.ld + 1 {
            d = self.dir.double(d);
            self.t.doublings.fetch_add(1, Ordering::Relaxed);
        }
        let pos = rt::find(&self.pool, self.rt_root, id);
        let (lo, hi) = id.children();
        let relaxed = !self.strict();
        let bytes = self.geo.bytes();
        if id.ld < pos.depth {
            // Inside one RT node: the upper half of the run moves. A
            // relaxed split holds the backup set until its commit point.
            let covered = relaxed.then(|| self.backups.read().expect("backups"));
            let delayed = covered.as_ref().is_some_and(|b| b.contains(&pos.node));
            // The split's commit point is S_old's identity word (C3):
            // recovery keeps S_new iff it holds the deeper identity.
            let r = self.pool.reserve(
                bytes,
                Link::Word {
                    owner: seg + H_IDENT,
                    value: lo.encode(),
                },
            )?;
            let s_new = r.offset();
            let (n, kept) = self.fill_half(seg, id, s_new, hi, delayed, 0);
            // persist: C1: S_new (items and LD) durable before any entry
            // names it.
            self.pool.fence();
            let half = pos.len / 2;
            for i in pos.start + half..pos.start + pos.len {
                self.pool.store_u64(pos.entry(i), s_new);
            }
            // persist: C2: the upper half of S_old's run names S_new. One
            // node line, so after a crash the entries hold a prefix of
            // these stores; the repair points them back at S_old unless
            // C3 is durable.
            self.pool.persist_line(pos.node);
            self.set_header(seg, W_IDENT, lo.encode());
            // persist: C3: S_old's deeper identity, the commit point; only
            // now may S_old's migrated copies be overwritten.
            self.pool.persist_line(seg);
            drop(covered);
            self.pool.commit(r);
            self.sub_counts(seg, n);
            // What S_old keeps needs fewer spill bits (readers are held off
            // by the lock until then).
            kept.store(self.head(seg));
            // Step D: RT before FS (paper §4.1).
            self.dir.set_range(d, hi.ld, hi.index(), s_new);
            if delayed {
                self.t.delayed_splits.fetch_add(1, Ordering::Relaxed);
            }
            self.unlock(s_new);
        } else if relaxed {
            // Releases `seg` itself (before a sync may free it).
            self.split_to_backup(seg, id, pos, d)?;
            self.t.splits.fetch_add(1, Ordering::Relaxed);
            self.t.segments.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        } else {
            // A new RT node (Fig. 7): entries 0..4 keep S_old, 4..8 name S_new.
            let parent = pos.entry(pos.start);
            let rn = self.reserve_node(parent)?;
            let node = rn.offset();
            let r = match self.pool.reserve(
                bytes,
                Link::Word {
                    owner: seg + H_IDENT,
                    value: lo.encode(),
                },
            ) {
                Ok(r) => r,
                Err(e) => {
                    self.pool.cancel(rn);
                    return Err(e.into());
                }
            };
            let s_new = r.offset();
            let (n, kept) = self.fill_half(seg, id, s_new, hi, false, 0);
            // C1 and C2 (the node's commit point). Before C3 the repair
            // points all eight entries back at S_old (LD = node depth - 3
            // covers it).
            self.link_node(node, seg, s_new, parent);
            self.set_header(seg, W_IDENT, lo.encode());
            // persist: C3: S_old's deeper identity, the split's commit point.
            self.pool.persist_line(seg);
            self.pool.commit(rn);
            self.pool.commit(r);
            self.sub_counts(seg, n);
            kept.store(self.head(seg));
            self.t.nodes.fetch_add(1, Ordering::Relaxed);
            self.t.node_splits.fetch_add(1, Ordering::Relaxed);
            self.dir.set_range(d, hi.ld, hi.index(), s_new);
            self.unlock(s_new);
        }
        self.t.splits.fetch_add(1, Ordering::Relaxed);
        self.t.segments.fetch_add(1, Ordering::Relaxed);
        self.unlock(seg);
        Ok(())
    }

    /// Reserves a new RT node, linked (tagged) by the parent entry it will
    /// replace.
    fn reserve_node(&self, parent: u64) -> pmem::Result<Reservation> {
        self.pool.reserve(
            LINE,
            Link::Tagged {
                owner: parent,
                tag: 1,
            },
        )
    }

    /// Fills a new RT node (entries 0..4 = `lower`, 4..8 = `upper`) and
    /// links it by the 8-byte switch of `parent`.
    fn link_node(&self, node: u64, lower: u64, upper: u64, parent: u64) {
        for i in 0..NODE_FANOUT {
            self.pool.store_u64(
                node + i * 8,
                if i < NODE_FANOUT / 2 { lower } else { upper },
            );
        }
        self.pool.flush(node, LINE as usize);
        // persist: C1: the node and everything the caller wrote and flushed
        // (new segments, a backup) durable before the parent names the node.
        self.pool.fence();
        self.pool
            .atomic_u64(parent)
            .store(node | 1, Ordering::Release);
        // persist: C2: the switch, the node's (and its reservation's) commit
        // point.
        self.pool.persist(parent, 8);
    }

    /// The paper's delayed-flush split at a new RT node (relaxed only):
    /// S_old is flushed and kept, unreachable, as the node's backup; two
    /// new segments take its items without being flushed. Releases `seg`'s
    /// lock on success, while the backup set is still held: once it is
    /// released a `sync` may free S_old.
    fn split_to_backup(&self, seg: u64, id: Ident, pos: rt::Pos, d: &Dir) -> Result<()> {
        let mut held = self.backups.write().expect("backups");
        let (lo, hi) = id.children();
        let bytes = self.geo.bytes();
        let parent = pos.entry(pos.start);
        let rn = self.reserve_node(parent)?;
        let node = rn.offset();
        // Both new segments live iff the parent entry names the node.
        let link = Link::Word {
            owner: parent,
            value: node | 1,
        };
        let ra = match self.pool.reserve(bytes, link) {
            Ok(r) => r,
            Err(e) => {
                self.pool.cancel(rn);
                return Err(e.into());
            }
        };
        let rb = match self.pool.reserve(bytes, link) {
            Ok(r) => r,
            Err(e) => {
                self.pool.cancel(ra);
                self.pool.cancel(rn);
                return Err(e.into());
            }
        };
        let (sa, sb) = (ra.offset(), rb.offset());
        // The backup: every item S_old holds, durable.
        self.pool.flush(seg, bytes as usize);
        self.fill_half(seg, id, sa, lo, true, seg);
        self.fill_half(seg, id, sb, hi, true, 0);
        // C1 (backup, node, both headers, the zeroed buckets) and C2, the
        // commit point of all three blocks; from here S_old is the backup
        // (named by S_a's header).
        self.link_node(node, sa, sb, parent);
        self.pool.commit(rn);
        self.pool.commit(ra);
        self.pool.commit(rb);
        held.insert(node);
        self.head(seg)[HD_RETIRED].store(1, Ordering::Release);
        self.dir.set_range(d, lo.ld, lo.index(), sa);
        self.dir.set_range(d, hi.ld, hi.index(), sb);
        self.t.nodes.fetch_add(1, Ordering::Relaxed);
        self.t.node_splits.fetch_add(1, Ordering::Relaxed);
        self.t.backups_made.fetch_add(1, Ordering::Relaxed);
        self.unlock(sa);
        self.unlock(sb);
        self.unlock(seg);
        drop(held);
        Ok(())
    }

    /// At the depth cap: chains an overflow block to locked segment `seg`.
    /// Releases the lock.
    pub(crate) fn add_overflow(&self, seg: u64) -> Result<()> {
        let mut owner = seg + H_OVERFLOW;
        let mut cur = self.pool.load_u64(owner);
        while cur != 0 {
            owner = cur + H_OVERFLOW;
            cur = self.pool.load_u64(owner);
        }
        let r = self
            .pool
            .reserve(self.geo.bytes(), Link::Pointer { owner })?;
        let b = r.offset();
        // Word 0 is left alone: a writer holding a stale offset may still
        // be locking this (recycled) block; it finds no segment and lets go.
        self.pool.zero(b + 8, self.geo.bytes() as usize - 8);
        self.pool.store_u64(b + H_IDENT, overflow_ident());
        self.pool.flush(b, self.geo.bytes() as usize);
        // persist: the empty block durable before it is linked (fence),
        // then the link (its reservation's commit point).
        self.pool.fence();
        self.pool.atomic_u64(owner).store(b, Ordering::Release);
        self.pool.persist(owner, 8);
        if owner == seg + H_OVERFLOW {
            self.head(seg)[HD_OVERFLOW].store(b, Ordering::Release);
        }
        self.pool.commit(r);
        self.t.overflow_blocks.fetch_add(1, Ordering::Relaxed);
        self.unlock(seg);
        Ok(())
    }

    /// After a delete: merges locked `seg` with its buddy when both are
    /// nearly empty (the inverse of a split). Releases `seg`'s lock.
    fn maybe_merge(&self, seg: u64, id: Ident) {
        let hw = self.head(seg);
        let few = hw[HD_COUNT].load(Ordering::Relaxed) <= self.geo.slots() / 8;
        if !few
            || id.ld < 2
            || hw[HD_BACKUP].load(Ordering::Relaxed) != 0
            || hw[HD_OVERFLOW].load(Ordering::Relaxed) != 0
            || self.recovering.load(Ordering::Relaxed)
        {
            self.unlock(seg);
            return;
        }
        let bid = Ident {
            ld: id.ld,
            prefix: id.prefix ^ (1 << (32 - id.ld)),
        };
        let bh = (bid.prefix as u64) << 32;
        let (_, bseg) = self.locate(bh);
        let bw = self.head(bseg);
        if bseg == seg || !self.lock.try_lock(&bw[HD_LOCK]) {
            self.unlock(seg);
            return;
        }
        let ok = Ident::decode(bw[HD_IDENT].load(Ordering::Relaxed)) == Some(bid)
            && bw[HD_RETIRED].load(Ordering::Relaxed) == 0
            && bw[HD_BACKUP].load(Ordering::Relaxed) == 0
            && bw[HD_OVERFLOW].load(Ordering::Relaxed) == 0
            && self.locate(bh).1 == bseg
            && hw[HD_COUNT]
                .load(Ordering::Relaxed)
                .saturating_add(bw[HD_COUNT].load(Ordering::Relaxed))
                <= self.geo.slots() / 4;
        let done = ok && {
            let start = std::time::Instant::now();
            let merged = self.merge(seg, id, bseg, bid).is_ok();
            if merged {
                self.t.structural.record(start);
            }
            merged
        };
        if !done {
            self.unlock(bseg);
            self.unlock(seg);
        }
    }

    /// Merges two locked buddies into a new segment; `Err` (nothing
    /// changed) when they cannot be merged. Releases both locks on success.
    fn merge(&self, a: u64, aid: Ident, b: u64, bid: Ident) -> Result<()> {
        let (l, lid, u, uid) = if aid.prefix < bid.prefix {
            (a, aid, b, bid)
        } else {
            (b, bid, a, aid)
        };
        let pl = rt::find(&self.pool, self.rt_root, lid);
        let pu = rt::find(&self.pool, self.rt_root, uid);
        let mid = Ident {
            ld: lid.ld - 1,
            prefix: lid.prefix,
        };
        let min = if pl.depth == NODE_BITS {
            1
        } else {
            pl.depth - NODE_BITS
        };
        if pl.node != pu.node || pu.start != pl.start + pl.len || mid.ld < min {
            return Err(Error::InvalidArgument("not mergeable here".into()));
        }
        let first = pl.entry(pl.start);
        // The merge's commit point is the run's first entry.
        let r = self
            .pool
            .reserve(self.geo.bytes(), Link::Pointer { owner: first })?;
        let m = r.offset();
        self.init_segment(m, mid, false);
        let (mut n, mut ns, mut spill) = (0u64, 0u64, Spill::default());
        for src in [(l, lid), (u, uid)] {
            let mut fits = true;
            self.each_valid(
                src.0,
                src.1,
                &mut |h, w0, w1| match self.place_fresh(m, h) {
                    Some((line, s, stash)) => {
                        let w = self.words(line);
                        w[2 * s + 1].store(w1, Ordering::Relaxed);
                        w[2 * s].store(w0, Ordering::Relaxed);
                        n += 1;
                        let home = self.geo.home(h);
                        if stash {
                            ns |= Geometry::spill_bit(home);
                        } else if line != self.geo.bucket(m, home) {
                            let b = (line - m) / LINE - 1;
                            spill.set(home, self.geo.dist(home, b));
                        }
                    }
                    None => fits = false,
                },
            );
            if !fits {
                self.unlock(m);
                self.pool.cancel(r);
                return Err(Error::InvalidArgument("merged items do not fit".into()));
            }
        }
        let mw = self.head(m);
        mw[HD_COUNT].store(n, Ordering::Relaxed);
        mw[HD_STASH].store(ns, Ordering::Relaxed);
        spill.store(mw);
        self.pool.flush(m, self.geo.bytes() as usize);
        // persist: C1: the merged segment durable before any entry names it.
        self.pool.fence();
        // Both old segments are freed iff the first entry no longer names L.
        let unlinked = Link::Word {
            owner: first,
            value: l,
        };
        let tl = match self.pool.begin_free(l, unlinked) {
            Ok(t) => t,
            Err(e) => {
                self.unlock(m);
                self.pool.cancel(r);
                return Err(e.into());
            }
        };
        let tu = match self.pool.begin_free(u, unlinked) {
            Ok(t) => t,
            Err(e) => {
                // Nothing is unlinked yet: L's free is abandoned.
                self.unlock(m);
                self.pool.cancel(r);
                self.pool.cancel_free(tl);
                return Err(e.into());
            }
        };
        for i in pl.start..pl.start + 2 * pl.len {
            self.pool.store_u64(pl.entry(i), m);
        }
        // persist: C2: every entry of both runs names M, first entry first
        // (one line: a prefix of these stores survives a crash, and the
        // repair follows the first entry).
        self.pool.persist_line(pl.node);
        self.pool.commit(r);
        let d = self.dir.current();
        self.dir.set_range(d, mid.ld, mid.index(), m);
        self.head(l)[HD_RETIRED].store(1, Ordering::Release);
        self.head(u)[HD_RETIRED].store(1, Ordering::Release);
        // Readers that may still be inside L or U retry from here on.
        self.frees.fetch_add(1, Ordering::SeqCst);
        self.unlock(l);
        self.unlock(u);
        self.pool.finish_free(tl);
        self.pool.finish_free(tu);
        self.unlock(m);
        self.t.merges.fetch_add(1, Ordering::Relaxed);
        self.t.segments.fetch_sub(1, Ordering::Relaxed);
        Ok(())
    }

    /// A free slot for `h` in a fresh (unshared) segment: window, then stash.
    fn place_fresh(&self, seg: u64, h: u64) -> Option<(u64, usize, bool)> {
        let home = self.geo.home(h);
        let lines = (0..PROBE)
            .map(|j| (self.geo.bucket(seg, self.geo.ring(home, j)), false))
            .chain((0..self.geo.stash).map(|i| (self.geo.stash_bucket(seg, i), true)));
        for (line, stash) in lines {
            let w = self.words(line);
            for s in 0..SLOTS {
                if w[2 * s].load(Ordering::Relaxed) == 0
                    && w[2 * s + 1].load(Ordering::Relaxed) == 0
                {
                    return Some((line, s, stash));
                }
            }
        }
        None
    }

    /// Calls `f(hash, word0, word1)` for every valid item of a segment
    /// (buckets, stash, overflow chain).
    pub(crate) fn each_valid(&self, seg: u64, id: Ident, f: &mut dyn FnMut(u64, u64, u64)) {
        self.each_slot(seg, &mut |line, s, bucket, _| {
            let w = self.words(line);
            let w0 = w[2 * s].load(Ordering::Relaxed);
            let w1 = w[2 * s + 1].load(Ordering::Relaxed);
            if self.valid(id, w0, w1, bucket) {
                f(decode_slot(w0, w1).0, w0, w1);
            }
        });
    }

    /// Calls `f(line, slot, bucket, stash)` for every slot of a segment
    /// and its overflow chain.
    pub(crate) fn each_slot(&self, seg: u64, f: &mut dyn FnMut(u64, usize, Option<u64>, bool)) {
        for l in 1..self.geo.lines {
            let bucket = (l <= self.geo.buckets).then_some(l - 1);
            for s in 0..SLOTS {
                f(seg + l * LINE, s, bucket, bucket.is_none());
            }
        }
        let mut ovf = self.pool.load_u64(seg + H_OVERFLOW);
        let mut hops = 0u64;
        while ovf != 0 && hops < 1 << 20 {
            for l in 1..self.geo.lines {
                for s in 0..SLOTS {
                    f(ovf + l * LINE, s, None, false);
                }
            }
            ovf = self.pool.load_u64(ovf + H_OVERFLOW);
            hops += 1;
        }
    }

    /// Every live segment with its identity (walks the RT-directory).
    pub(crate) fn segments(&self) -> Result<Vec<(u64, Ident)>> {
        let mut v = Vec::new();
        rt::walk(
            &self.pool,
            self.rt_root,
            |_, _| Ok(()),
            |s| {
                let id = Ident::decode(self.pool.load_u64(s + H_IDENT))
                    .ok_or_else(|| corrupt(format!("segment {s:#x} has no identity")))?;
                v.push((s, id));
                Ok(())
            },
        )?;
        Ok(v)
    }

    /// Every segment the RT-directory names now, skipping entries that no
    /// longer hold a segment (a merge may free one while `sync` walks).
    fn segments_lenient(&self) -> Vec<(u64, Ident)> {
        let mut v = Vec::new();
        let _ = rt::walk(
            &self.pool,
            self.rt_root,
            |_, _| Ok(()),
            |s| {
                if let Some(id) = Ident::decode(self.pool.load_u64(s + H_IDENT)) {
                    v.push((s, id));
                }
                Ok(())
            },
        );
        v
    }

    /// Frees the backup chain named by live segment `seg`.
    pub(crate) fn drop_backups(&self, seg: u64) -> Result<()> {
        let first = self.pool.load_u64(seg + H_BACKUP);
        if first == 0 {
            return Ok(());
        }
        let mut chain = vec![first];
        let mut b = self.pool.load_u64(first + H_BACKUP);
        while b != 0 && chain.len() < 32 && !chain.contains(&b) {
            chain.push(b);
            b = self.pool.load_u64(b + H_BACKUP);
        }
        // Every block of the chain is freed iff `seg` no longer names the first.
        let link = Link::Word {
            owner: seg + H_BACKUP,
            value: first,
        };
        let mut tickets = Vec::new();
        for &b in &chain {
            match self.pool.begin_free(b, link) {
                Ok(t) => tickets.push(t),
                Err(e) => {
                    for t in tickets {
                        self.pool.cancel_free(t);
                    }
                    return Err(e.into());
                }
            }
        }
        self.set_header(seg, W_BACKUP, 0);
        // persist: the unlink, commit point of every free in the chain.
        self.pool.persist_line(seg);
        self.frees.fetch_add(1, Ordering::SeqCst);
        for t in tickets {
            self.pool.finish_free(t);
        }
        Ok(())
    }

    /// Relaxed durability: every segment written back, then every backup
    /// dropped (they only cover writes since the last sync).
    fn sync_all(&self) -> Result<()> {
        let mut held = self.backups.write().expect("backups");
        // Unlocked walk: a segment merged away meanwhile (its block maybe
        // reused) is skipped, not an error.
        let segs = self.segments_lenient();
        for &(s, _) in &segs {
            self.pool.flush(s, self.geo.bytes() as usize);
            let mut ovf = self.pool.load_u64(s + H_OVERFLOW);
            while ovf != 0 {
                self.pool.flush(ovf, self.geo.bytes() as usize);
                ovf = self.pool.load_u64(ovf + H_OVERFLOW);
            }
        }
        // The root line holds the zero-hash key.
        self.pool.flush(self.root, LINE as usize);
        // persist: every segment (and the root line) durable before any
        // backup is dropped.
        self.pool.fence();
        for &(s, _) in &segs {
            self.drop_backups(s)?;
        }
        held.clear();
        Ok(())
    }
}

impl Engine for Hmeh {
    fn name(&self) -> &str {
        "hmeh"
    }

    fn insert(&self, key: u64, value: u64) -> Result<bool> {
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
            let (seg, id) = self.lock_owner(h);
            let sc = self.scan(seg, id, h, Want::Insert);
            if sc.found.is_some() {
                self.unlock(seg);
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
                self.mark_spill(seg, f, h);
                self.write_slot(id, f, h, value);
                if self.strict() {
                    // persist: the slot's line before the lock is released
                    // (no reader acts on a write a crash could undo): one
                    // persist per insert, the point of cross-KV.
                    self.pool.persist_line(f.line);
                }
                self.count_add(seg, 1);
                self.unlock(seg);
                self.len.add(1);
                return Ok(true);
            }
            self.grow(seg, id)?;
        }
    }

    fn get(&self, key: u64) -> Option<u64> {
        let h = self.hasher.hash(key);
        if h == 0 {
            return self.zero_op(|p, root| {
                (p.load_u64(root + R_ZERO_PRESENT) == 1).then(|| p.load_u64(root + R_ZERO_VALUE))
            });
        }
        self.lookup(h)
    }

    fn update(&self, key: u64, value: u64) -> Result<bool> {
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
            let (seg, id) = self.lock_owner(h);
            let sc = self.scan(seg, id, h, Want::Both);
            let Some((slot, w0, w1)) = sc.found else {
                self.unlock(seg);
                return Ok(false);
            };
            let (n0, n1) = encode_slot(h, value);
            let w = self.words(slot.line);
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
                self.unlock(seg);
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
                self.unlock(seg);
                return Ok(true);
            }
            if let Some(f) = sc.free {
                self.mark_spill(seg, f, h);
                self.write_slot(id, f, h, value);
                // persist: the new copy durable before the old one dies,
                // in both modes: otherwise a crash could keep neither.
                self.pool.persist_line(f.line);
                self.kill_slot(id, slot);
                if self.strict() {
                    self.pool.persist_line(slot.line);
                }
                self.t.cross_updates.fetch_add(1, Ordering::Relaxed);
                self.unlock(seg);
                return Ok(true);
            }
            self.grow(seg, id)?;
        }
    }

    fn remove(&self, key: u64) -> Result<bool> {
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
        let (seg, id) = self.lock_owner(h);
        let sc = self.scan(seg, id, h, Want::Find);
        let Some((slot, _, _)) = sc.found else {
            self.unlock(seg);
            return Ok(false);
        };
        self.kill_slot(id, slot);
        // persist: one 8-byte store, failure-atomic; durable before the
        // lock is released (CRASH-PATTERNS #6).
        if self.strict() {
            self.pool.persist_line(slot.line);
        }
        self.count_add(seg, -1);
        self.len.add(-1);
        self.maybe_merge(seg, id);
        Ok(true)
    }

    fn len(&self) -> u64 {
        self.len.get().max(0) as u64
    }

    fn stats(&self) -> Stats {
        let len = self.len();
        let segs = self.t.segments.load(Ordering::Relaxed);
        let capacity = segs * self.geo.slots();
        let c = |a: &AtomicU64| a.load(Ordering::Relaxed).to_string();
        let lf = |a: &AtomicU64| match f64::from_bits(a.load(Ordering::Relaxed)) {
            x if x <= 1.0 => format!("{x:.4}"),
            _ => "none".into(),
        };
        let cur = f64::from_bits(self.t.max_lf_bits.load(Ordering::Relaxed))
            .max(len as f64 / capacity.max(1) as f64);
        Stats {
            len,
            capacity,
            load_factor: len as f64 / capacity.max(1) as f64,
            pm_bytes: ROOT_BYTES
                + segs * self.geo.bytes()
                + (self.t.nodes.load(Ordering::Relaxed) + 1) * LINE
                + self.t.overflow_blocks.load(Ordering::Relaxed) * self.geo.bytes(),
            dram_bytes: std::mem::size_of::<Self>() as u64 + self.dir.bytes() + self.heads.bytes(),
            structural_changes: self.t.structural.changes(),
            structural_nanos: self.t.structural.nanos(),
            detail: vec![
                ("segment bytes".into(), self.geo.bytes().to_string()),
                ("segments".into(), segs.to_string()),
                ("global depth".into(), self.dir.current().gd.to_string()),
                ("splits".into(), c(&self.t.splits)),
                ("node splits".into(), c(&self.t.node_splits)),
                ("delayed splits".into(), c(&self.t.delayed_splits)),
                ("doublings".into(), c(&self.t.doublings)),
                ("merges".into(), c(&self.t.merges)),
                ("overflow blocks".into(), c(&self.t.overflow_blocks)),
                ("backups made".into(), c(&self.t.backups_made)),
                ("backup items merged".into(), c(&self.t.backups_merged)),
                ("duplicates removed".into(), c(&self.t.duplicates_removed)),
                ("clean-open slots read".into(), c(&self.t.clean_walk_slots)),
                ("special-case writes".into(), c(&self.t.special_writes)),
                ("displacements".into(), c(&self.t.displacements)),
                ("in-place updates".into(), c(&self.t.inplace_updates)),
                ("same-line updates".into(), c(&self.t.line_updates)),
                ("cross-line updates".into(), c(&self.t.cross_updates)),
                ("max load factor".into(), format!("{cur:.4}")),
                (
                    "min load factor at split".into(),
                    lf(&self.t.min_split_lf_bits),
                ),
            ],
        }
    }

    fn sync(&self) -> Result<()> {
        if self.durability == Durability::Relaxed {
            self.sync_all()?;
        }
        Ok(())
    }

    fn for_each(&self, f: &mut dyn FnMut(u64, u64)) {
        if self.pool.load_u64(self.root + R_ZERO_PRESENT) == 1 {
            f(
                self.hasher.key(0),
                self.pool.load_u64(self.root + R_ZERO_VALUE),
            );
        }
        let Ok(segs) = self.segments() else { return };
        for (s, id) in segs {
            // What a lookup finds (`listed`): a damaged slot that is valid
            // but outside the search's reach is not a key of this table.
            let (spill, stash_bits) = self.search_bits(s);
            self.each_slot(s, &mut |line, slot, bucket, stash| {
                let w = self.words(line);
                let w0 = w[2 * slot].load(Ordering::Relaxed);
                let w1 = w[2 * slot + 1].load(Ordering::Relaxed);
                if self.listed(id, w0, w1, bucket, stash, &spill, stash_bits) {
                    let (h, v) = decode_slot(w0, w1);
                    f(self.hasher.key(h), v);
                }
            });
        }
    }

    fn for_each_part(&self, part: usize, parts: usize, f: &mut dyn FnMut(u64, u64)) {
        recover::for_each_part(self, part, parts, f)
    }

    fn check(&self) -> Result<CheckReport> {
        recover::check(self)
    }

    fn close(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        if self.durability == Durability::Relaxed {
            self.sync_all()?;
        }
        for (s, _) in self.segments()? {
            self.store_head(s);
            self.pool.flush(s, LINE as usize);
        }
        self.pool.store_u64(self.root + R_COUNT, self.len());
        // persist: segment headers (their counts) and the item count
        // before the clean flag that makes them trusted.
        self.pool.persist(self.root, LINE as usize);
        self.pool.close()?;
        Ok(())
    }
}
