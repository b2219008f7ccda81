//! Structural changes: a full segment split (with the directory doubling
//! it may need) or, at the depth cap, chained to an overflow block; an
//! emptied pair merged; the backups relaxed-durability splits make, and
//! the `sync` that drops them.

use std::sync::atomic::Ordering;

use super::*;

impl Hmeh {
    /// Makes room in a locked, full segment: split, or chain an overflow
    /// block at the depth cap. Releases the lock.
    pub(crate) fn grow(&self, seg: u64, id: Ident) -> Result<()> {
        let start = std::time::Instant::now();
        let r = if id.ld >= self.geo.max_depth {
            self.add_overflow(seg)
        } else {
            self.split(seg, id)
        };
        if r.is_err() {
            self.unlock(seg);
        } else {
            self.t.structural.record(start);
        }
        r
    }

    fn note_split_load(&self) {
        let cap = self.t.segments.load(Ordering::Relaxed) * self.geo.slots();
        let lf = self.len.get().max(0) as f64 / cap.max(1) as f64;
        self.t
            .max_lf_bits
            .fetch_max(lf.to_bits(), Ordering::Relaxed);
        self.t
            .min_split_lf_bits
            .fetch_min(lf.to_bits(), Ordering::Relaxed);
    }

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
    /// nearly empty (the inverse of a split). Releases `seg`'s lock; `hw`
    /// is its head.
    pub(crate) fn maybe_merge(&self, seg: u64, id: Ident, hw: &[AtomicU64; HEAD_WORDS]) {
        let few = hw[HD_COUNT].load(Ordering::Relaxed) <= self.geo.slots() / 8;
        if !few
            || id.ld < 2
            || hw[HD_BACKUP].load(Ordering::Relaxed) != 0
            || hw[HD_OVERFLOW].load(Ordering::Relaxed) != 0
            || Self::merge_refused(hw, id)
            || self.recovering.load(Ordering::Relaxed)
        {
            self.lock.unlock(&hw[HD_LOCK]);
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

    /// Whether a merge of the segment with head `hw` and identity `id` was
    /// refused for where it sits in the RT-directory (`HD_NO_MERGE`).
    pub(crate) fn merge_refused(hw: &[AtomicU64; HEAD_WORDS], id: Ident) -> bool {
        hw[HD_NO_MERGE].load(Ordering::Relaxed) == id.encode()
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
            // A segment's place in the RT-directory follows from its
            // identity and the tree, which only grows (a node split moves
            // only the splitting segment's entries; a merge makes a new
            // segment; no node is removed), so this pair stays
            // unmergeable while both keep their identities: later deletes
            // skip the attempt. A split changes the identity and so voids
            // the mark.
            for (s, id) in [(l, lid), (u, uid)] {
                self.head(s)[HD_NO_MERGE].store(id.encode(), Ordering::Relaxed);
            }
            self.t.merge_refusals.fetch_add(1, Ordering::Relaxed);
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
    pub(crate) fn sync_all(&self) -> Result<()> {
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
