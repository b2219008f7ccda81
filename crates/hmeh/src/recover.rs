//! Opening a pool: validation, crash repair (paper §3.5 plus what it
//! leaves out), the FS-directory rebuild, and `check`; `open` runs one
//! function per numbered phase. Also the segment walks they (and
//! `for_each`, `sync`) share.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use super::*;

/// A segment pointer read from PM, checked before use.
fn segment_ident(pool: &Pool, geo: &Geometry, s: u64) -> Result<Ident> {
    if s == 0 || !s.is_multiple_of(LINE) {
        return Err(corrupt(format!("RT entry {s:#x} is not a segment offset")));
    }
    let size = pool.block_size(s).map_err(|e| {
        corrupt(format!(
            "RT entry names segment {s:#x}, not an allocated block: {e}"
        ))
    })?;
    if size < geo.bytes() {
        return Err(corrupt(format!(
            "segment {s:#x} is a block of {size} bytes, not {}",
            geo.bytes()
        )));
    }
    Ident::decode(pool.load_u64(s + H_IDENT))
        .ok_or_else(|| corrupt(format!("segment {s:#x} has no valid identity word")))
}

/// Checks segment `s`'s overflow chain (allocated blocks of segment size
/// with the overflow magic) and backup chain (allocated segments, not live,
/// each an ancestor of the one before: a shorter prefix of it).
fn validate_chains(
    pool: &Pool,
    geo: &Geometry,
    s: u64,
    id: Ident,
    live: &std::collections::HashSet<u64>,
    chained: &mut std::collections::HashSet<u64>,
) -> Result<()> {
    let mut ovf = pool.load_u64(s + H_OVERFLOW);
    let mut seen = 0u64;
    while ovf != 0 {
        seen += 1;
        let ok = ovf.is_multiple_of(LINE)
            && pool.block_size(ovf).is_ok_and(|n| n >= geo.bytes())
            && pool.load_u64(ovf + H_IDENT) == overflow_ident();
        if !ok || seen > 1 << 20 {
            return Err(corrupt(format!(
                "segment {s:#x} chains {ovf:#x}, which is not an overflow block"
            )));
        }
        if !chained.insert(ovf) {
            return Err(corrupt(format!(
                "overflow block {ovf:#x} of segment {s:#x} is chained twice"
            )));
        }
        ovf = pool.load_u64(ovf + H_OVERFLOW);
    }
    let mut b = pool.load_u64(s + H_BACKUP);
    let mut child = id;
    let mut hops = 0;
    while b != 0 {
        hops += 1;
        if hops > 32 || live.contains(&b) || !chained.insert(b) {
            return Err(corrupt(format!(
                "segment {s:#x} names {b:#x} as a backup, but that is a live segment or a loop of backups, or another segment's"
            )));
        }
        let bid = segment_ident(pool, geo, b)?;
        if pool.load_u64(b + H_OVERFLOW) != 0 {
            return Err(corrupt(format!(
                "backup {b:#x} of segment {s:#x} has an overflow chain (backups never do)"
            )));
        }
        if bid.ld >= child.ld || (child.prefix ^ bid.prefix) & mask(bid.ld) != 0 {
            return Err(corrupt(format!(
                "backup {b:#x} of segment {s:#x} does not cover its hashes"
            )));
        }
        child = bid;
        b = pool.load_u64(b + H_BACKUP);
    }
    Ok(())
}

/// Calls `f(hash, w0, w1)` for every slot of segment `s` (identity `id`)
/// and of its overflow chain that `for_each` lists ([`Hmeh::listed`]:
/// valid, and within its search's reach), in [`Hmeh::each_valid`]'s
/// order, with no dynamic call and no division per slot: the clean open's
/// count and the store's slot check read every slot of the table.
fn valid_slots(hm: &Hmeh, s: u64, id: Ident, mut f: impl FnMut(u64, u64, u64)) {
    let geo = hm.geo;
    let (spill, stash_bits) = hm.search_bits(s);
    hm.slot_words(s, |bucket, stash, w0, w1| {
        let h = decode_slot(w0, w1).0;
        if h == 0 || !id.owns(h) {
            return;
        }
        let home = geo.home(h);
        match bucket {
            // A slot counts in its home's probe window only, and past
            // its home only with the home's spill bit. `in_window`'s
            // distance: home and bucket are both below `buckets`, so it
            // takes one subtraction at most, not a division.
            Some(b) => {
                let d = b + geo.buckets - home;
                let d = if d >= geo.buckets { d - geo.buckets } else { d };
                if d >= spill.reach(home) {
                    return;
                }
            }
            // A stash slot with its home's stash bit; in an overflow
            // block any slot of the segment's hashes counts.
            None if stash && stash_bits & Geometry::spill_bit(home) == 0 => return,
            None => {}
        }
        f(h, w0, w1);
    });
}

/// The valid slots of segment `s` and its overflow chain.
fn count_valid(hm: &Hmeh, s: u64, id: Ident) -> u64 {
    let mut n = 0;
    valid_slots(hm, s, id, |_, _, _| n += 1);
    n
}

impl Hmeh {
    /// Calls `f(hash, word0, word1)` for every valid item of a segment
    /// (buckets, stash, overflow chain).
    pub(crate) fn each_valid(&self, seg: u64, id: Ident, f: &mut dyn FnMut(u64, u64, u64)) {
        self.slot_words(seg, |bucket, _, w0, w1| {
            if self.valid(id, w0, w1, bucket) {
                f(decode_slot(w0, w1).0, w0, w1);
            }
        });
    }

    /// Calls `f(bucket, stash, word0, word1)` for every slot of segment
    /// `seg` and of its overflow chain, in `each_slot`'s order: `bucket`
    /// is a normal bucket's number, `stash` tells the segment's stash lines
    /// from an overflow block's (both bucket-less).
    ///
    /// Each block's lines are taken once (one bounds check) and `f` is
    /// called statically: a merge reads both buddies' slots, most of them
    /// free, and a dynamic call and a bounds check a slot (`each_slot`)
    /// were most of a merge's instructions.
    #[inline]
    fn slot_words(&self, seg: u64, mut f: impl FnMut(Option<u64>, bool, u64, u64)) {
        let n = self.geo.lines as usize;
        // Line 0 is the header; lines 1..=`normal` are normal buckets.
        let mut block = |off: u64, normal: u64, stash: bool| {
            for (l, w) in (1u64..).zip(&self.pool.lines(off, n)[1..]) {
                let bucket = (l <= normal).then(|| l - 1);
                for s in 0..SLOTS {
                    f(
                        bucket,
                        stash,
                        w[2 * s].load(Ordering::Relaxed),
                        w[2 * s + 1].load(Ordering::Relaxed),
                    );
                }
            }
        };
        block(seg, self.geo.buckets, true);
        let mut ovf = self.pool.load_u64(seg + H_OVERFLOW);
        let mut hops = 0u64;
        while ovf != 0 && hops < 1 << 20 {
            block(ovf, 0, false);
            ovf = self.pool.load_u64(ovf + H_OVERFLOW);
            hops += 1;
        }
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
    pub(crate) fn segments_lenient(&self) -> Vec<(u64, Ident)> {
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
}

/// `Engine::for_each_part`: part `part` of `parts` visits the zero-hash
/// key (part 0) and an equal share of the live segments, as `for_each`
/// visits them.
pub(crate) fn for_each_part(hm: &Hmeh, part: usize, parts: usize, f: &mut dyn FnMut(u64, u64)) {
    if part == 0 && hm.pool.load_u64(hm.root + R_ZERO_PRESENT) == 1 {
        f(hm.hasher.key(0), hm.pool.load_u64(hm.root + R_ZERO_VALUE));
    }
    let Ok(segs) = hm.segments() else { return };
    let per = segs.len().div_ceil(parts.max(1));
    for &(s, id) in segs.iter().skip(part.saturating_mul(per)).take(per) {
        valid_slots(hm, s, id, |h, w0, w1| {
            f(hm.hasher.key(h), decode_slot(w0, w1).1)
        });
    }
}

/// The root block's words, checked before anything follows them: where
/// the table is and how it is shaped.
#[derive(Clone, Copy)]
struct Root {
    root: u64,
    rt_root: u64,
    geo: Geometry,
    hasher: Hasher,
}

/// What phase 2 of [`open`] hands on: the table, its live segments, and
/// the blocks they chain (overflow blocks and backups).
struct Rebuilt {
    hm: Hmeh,
    segs: Vec<(u64, Ident)>,
    chained: std::collections::HashSet<u64>,
}

/// Opens a pool in its numbered phases (`docs/engines/hmeh.md`,
/// "Recovery"): the root is read and checked, then each phase runs in
/// turn; a cleanly closed pool stops after phase 2.
pub(crate) fn open(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Hmeh> {
    let r = read_root(&pool)?;
    let clean = pool.was_clean();
    // 1. Repair the RT-directory's leaf runs (a crash mid-split or merge);
    // the same pass lists every node and segment.
    let rep = repair_runs(&pool, &r, clean)?;
    // 2. Rebuild the FS-directory.
    let Rebuilt { hm, segs, chained } = rebuild_dir(&pool, cfg, r, rep)?;
    let zero = pool.load_u64(r.root + R_ZERO_PRESENT);
    if clean {
        check_clean(&hm, &segs, &chained, zero)?;
        hm.len.set(pool.load_u64(r.root + R_COUNT) as i64);
        return Ok(hm);
    }
    // 3. After a crash: recount, reset DRAM-meaning header words, remove
    // the second copy a crashed update may leave, then merge backups.
    hm.recovering.store(true, Ordering::Relaxed);
    recount(&hm, &segs, zero);
    if pool.is_read_only() {
        // `inspect` and `check` look without writing: backups stay (their
        // items are not merged into this view; `check` counts their blocks).
        hm.recovering.store(false, Ordering::Relaxed);
        return Ok(hm);
    }
    merge_backups(&hm, &segs)?;
    hm.recovering.store(false, Ordering::Relaxed);
    Ok(hm)
}

/// Reads and checks the root block: magic, geometry, hash kind, the
/// zero-hash key's flag and the RT root.
fn read_root(pool: &Pool) -> Result<Root> {
    let root = pool.root();
    if root == 0 {
        return Err(corrupt("pool has no hmeh root (root is 0)".into()));
    }
    if pool.block_size(root)? < ROOT_BYTES {
        return Err(corrupt(format!(
            "root block at {root:#x} is smaller than {ROOT_BYTES} bytes"
        )));
    }
    if pool.load_u64(root) != ROOT_MAGIC {
        return Err(corrupt(format!(
            "root block at {root:#x} has no hmeh magic"
        )));
    }
    let gw = pool.load_u64(root + R_GEOMETRY);
    let geo = Geometry::decode(gw).ok_or_else(|| corrupt(format!("bad geometry word {gw:#x}")))?;
    let hw = pool.load_u64(root + R_HASH);
    let kind = HashKind::from_word(hw).ok_or_else(|| corrupt(format!("unknown hash kind {hw}")))?;
    let hasher = Hasher {
        kind,
        seed: pool.load_u64(root + R_SEED),
    };
    if pool.load_u64(root + R_ZERO_PRESENT) > 1 {
        return Err(corrupt("zero-hash key flag is neither 0 nor 1".into()));
    }
    let rt_root = pool.load_u64(root + R_RT_ROOT);
    if !rt_root.is_multiple_of(LINE) || pool.block_size(rt_root).ok() != Some(LINE) {
        return Err(corrupt(format!(
            "RT root {rt_root:#x} is not an allocated 64-byte node"
        )));
    }
    Ok(Root {
        root,
        rt_root,
        geo,
        hasher,
    })
}

/// Phase 1: the RT-directory's leaf runs repaired (refused in a cleanly
/// closed pool, which has none to repair); lists every node and segment.
fn repair_runs(pool: &Pool, r: &Root, clean: bool) -> Result<rt::Repair> {
    let Root { rt_root, geo, .. } = *r;
    let ident_of = |s: u64| segment_ident(pool, &geo, s);
    let rep = rt::repair(pool, rt_root, &ident_of, !clean)?;
    if !rep.changed.is_empty() {
        if clean {
            return Err(corrupt(
                "RT-directory runs are inconsistent in a cleanly closed pool".into(),
            ));
        }
        for n in &rep.changed {
            pool.flush(*n, LINE as usize);
        }
        // persist: repaired runs before anything relies on them.
        pool.fence();
    }
    Ok(rep)
}

/// Phase 2: the FS-directory rebuilt from the live segments (each hash
/// owned by exactly one), every chained block checked, and the table's
/// handle made with its heads filled from the PM headers.
fn rebuild_dir(pool: &Arc<Pool>, cfg: &EngineConfig, r: Root, rep: rt::Repair) -> Result<Rebuilt> {
    let Root {
        root,
        rt_root,
        geo,
        hasher,
    } = r;
    let segs = rep.segments;
    let nodes = rep.nodes.len() as u64;
    let gd = segs.iter().map(|(_, id)| id.ld).max().unwrap_or(1);
    if gd > geo.max_depth {
        return Err(corrupt(format!(
            "a segment has local depth {gd}, above the cap {}",
            geo.max_depth
        )));
    }
    let mut table = vec![0u64; 1 << gd];
    for &(s, id) in &segs {
        let shift = gd - id.ld;
        let start = (id.index() << shift) as usize;
        for e in &mut table[start..start + (1 << shift)] {
            if *e != 0 {
                return Err(corrupt(format!(
                    "segments {:#x} and {s:#x} claim the same hashes",
                    *e
                )));
            }
            *e = s;
        }
    }
    if let Some(i) = table.iter().position(|&e| e == 0) {
        return Err(corrupt(format!("no segment owns directory entry {i}")));
    }
    // Every chained block must be what its link says, before anything
    // follows a chain (a garbage pointer would be read as slots).
    let live: std::collections::HashSet<u64> = segs.iter().map(|&(s, _)| s).collect();
    let mut chained = std::collections::HashSet::new();
    for &(s, id) in &segs {
        validate_chains(pool, &geo, s, id, &live, &mut chained)?;
    }
    let dir = FsDir::build(gd, |i| table[i]);
    let hm = Hmeh::handle(
        pool.clone(),
        root,
        rt_root,
        geo,
        hasher,
        cfg.durability,
        dir,
    );
    hm.t.segments.store(segs.len() as u64, Ordering::Relaxed);
    hm.t.nodes.store(nodes.saturating_sub(1), Ordering::Relaxed);
    // The heads: from the PM headers, every lock free and no segment
    // retired (the PM lock and retired words are not read: a corrupt file
    // cannot make a reader or writer wait forever).
    for &(s, _) in &segs {
        hm.load_head(s);
    }
    Ok(Rebuilt { hm, segs, chained })
}

/// A cleanly closed pool's checks: no backup left, and the recorded
/// count equal to the slots `for_each` lists.
fn check_clean(
    hm: &Hmeh,
    segs: &[(u64, Ident)],
    chained: &std::collections::HashSet<u64>,
    zero: u64,
) -> Result<()> {
    let (pool, geo, root) = (&hm.pool, hm.geo, hm.root);
    // A clean close dropped every backup; one left means a crash.
    if segs.iter().any(|&(s, _)| pool.load_u64(s + H_BACKUP) != 0) {
        return Err(corrupt("a cleanly closed pool still holds backups".into()));
    }
    // The count a clean close recorded must match the slots `for_each`
    // lists (`listed`: valid and within the search's reach), so a page
    // zeroed or overwritten since, or a slot moved out of its search's
    // reach, would otherwise open with keys silently missing. One read of the table, on all threads; a
    // writable open after a read-only one that passed this walk under
    // the same lock (`Pool::prechecked`) does not read it again.
    if !pool.prechecked() {
        let found = zero + engine::par_sum(segs.len(), |i| count_valid(hm, segs[i].0, segs[i].1));
        // Live segments and their overflow blocks (a clean pool holds
        // no backups: `chained` is the overflow blocks).
        let blocks = (segs.len() + chained.len()) as u64;
        hm.t.clean_walk_slots
            .store(blocks * (geo.lines - 1) * SLOTS as u64, Ordering::Relaxed);
        let recorded = pool.load_u64(root + R_COUNT);
        if recorded != found {
            return Err(corrupt(format!(
                "clean pool records {recorded} keys, its segments hold {found}: {}",
                engine::damaged_after_close(pool)
            )));
        }
    }
    Ok(())
}

/// Phase 3, after a crash: every segment's items recounted, its
/// DRAM-meaning header words reset, and the second copy a crashed update
/// may leave removed.
fn recount(hm: &Hmeh, segs: &[(u64, Ident)], zero: u64) {
    let pool = &hm.pool;
    let mut total = zero;
    for &(s, id) in segs {
        let mut seen: HashMap<u64, ()> = HashMap::new();
        let (mut n, mut ns, mut spill) = (0u64, 0u64, Spill::default());
        let mut dups = Vec::new();
        hm.each_slot(s, &mut |line, slot, bucket, stash| {
            let w = hm.words(line);
            let w0 = w[2 * slot].load(Ordering::Relaxed);
            let w1 = w[2 * slot + 1].load(Ordering::Relaxed);
            if hm.valid(id, w0, w1, bucket) {
                let h = decode_slot(w0, w1).0;
                if seen.insert(h, ()).is_some() {
                    dups.push((line, slot));
                } else {
                    n += 1;
                    let home = hm.geo.home(h);
                    if stash {
                        ns |= Geometry::spill_bit(home);
                    } else if let Some(b) = bucket.filter(|&b| b != home) {
                        spill.set(home, hm.geo.dist(home, b));
                    }
                }
            }
        });
        for &(line, slot) in &dups {
            hm.words(line)[2 * slot].store(id.invalid_hi() << 32, Ordering::Release);
            // persist: one failure-atomic store per duplicate; a crash here
            // reruns the same dedupe.
            pool.persist_line(line);
        }
        hm.t.duplicates_removed
            .fetch_add(dups.len() as u64, Ordering::Relaxed);
        let w = hm.head(s);
        w[HD_COUNT].store(n, Ordering::Relaxed);
        w[HD_STASH].store(ns, Ordering::Relaxed);
        w[HD_RETIRED].store(0, Ordering::Relaxed);
        spill.store(w);
        total += n;
    }
    hm.len.set(total as i64);
}

/// Phase 3, last step (writable opens): every backup's items merged into
/// the table, then the backups dropped.
fn merge_backups(hm: &Hmeh, segs: &[(u64, Ident)]) -> Result<()> {
    let (pool, geo, hasher) = (&hm.pool, hm.geo, hm.hasher);
    for &(s, _) in segs {
        let first = pool.load_u64(s + H_BACKUP);
        if first == 0 {
            continue;
        }
        let mut b = first;
        let mut hops = 0;
        while b != 0 {
            if hops >= 32 {
                return Err(corrupt(format!("backup chain of {s:#x} is too long")));
            }
            let bid = segment_ident(pool, &geo, b)?;
            let mut items = Vec::new();
            hm.each_valid(b, bid, &mut |h, w0, w1| {
                items.push((h, decode_slot(w0, w1).1))
            });
            for (h, v) in items {
                // Insert if absent: the backup holds each key's value at
                // the split, a state since the last sync.
                if hm.lookup(h).is_none() {
                    hm.insert(hasher.key(h), v)?;
                    hm.t.backups_merged.fetch_add(1, Ordering::Relaxed);
                }
            }
            b = pool.load_u64(b + H_BACKUP);
            hops += 1;
        }
    }
    // persist: every merged item is durable (inserts persist during
    // recovery) before the backups are dropped.
    pool.fence();
    for &(s, _) in segs {
        hm.drop_backups(s)?;
    }
    Ok(())
}

/// Read-only walk: runs, identities, items, counts, reachable bytes.
pub(crate) fn check(hm: &Hmeh) -> Result<CheckReport> {
    let pool = &hm.pool;
    let geo = hm.geo;
    let ident_of = |s: u64| segment_ident(pool, &geo, s);
    let rep = rt::repair(pool, hm.rt_root, &ident_of, false)?;
    if let Some(n) = rep.changed.first() {
        return Err(corrupt(format!("RT node {n:#x} has an inconsistent run")));
    }
    let mut reachable = pool.block_size(hm.root)?;
    for &n in &rep.nodes {
        reachable += pool.block_size(n)?;
    }
    let segs = rep.segments;
    let live: std::collections::HashSet<u64> = segs.iter().map(|&(s, _)| s).collect();
    let mut backups = std::collections::HashSet::new();
    for &(s, id) in &segs {
        validate_chains(pool, &geo, s, id, &live, &mut backups)?;
    }
    let mut keys = std::collections::HashSet::new();
    let zero = pool.load_u64(hm.root + R_ZERO_PRESENT);
    if zero == 1 {
        keys.insert(hm.hasher.key(0));
    }
    for &(s, id) in &segs {
        reachable += pool.block_size(s)?;
        let mut ovf = pool.load_u64(s + H_OVERFLOW);
        while ovf != 0 {
            reachable += pool.block_size(ovf)?;
            if pool.load_u64(ovf + H_IDENT) != overflow_ident() {
                return Err(corrupt(format!("overflow block {ovf:#x} has no magic")));
            }
            ovf = pool.load_u64(ovf + H_OVERFLOW);
        }
        let mut b = pool.load_u64(s + H_BACKUP);
        while b != 0 {
            reachable += pool.block_size(b)?;
            b = pool.load_u64(b + H_BACKUP);
        }
        let (spill, stash_bits) = hm.search_bits(s);
        let mut unmarked = None;
        hm.each_slot(s, &mut |line, slot, bucket, stash| {
            let w = hm.words(line);
            let (w0, w1) = (
                w[2 * slot].load(Ordering::Relaxed),
                w[2 * slot + 1].load(Ordering::Relaxed),
            );
            if !hm.valid(id, w0, w1, bucket) {
                return;
            }
            let h = decode_slot(w0, w1).0;
            let home = hm.geo.home(h);
            let marked = match bucket {
                Some(b) if b != home => hm.geo.dist(home, b) < spill.reach(home),
                None if stash => stash_bits & Geometry::spill_bit(home) != 0,
                _ => return,
            };
            if !marked {
                unmarked.get_or_insert(h);
            }
        });
        if let Some(h) = unmarked {
            return Err(corrupt(format!(
                "key {:#x} sits outside its home bucket in segment {s:#x} without its spill or stash bit",
                hm.hasher.key(h)
            )));
        }
        let mut n = 0u64;
        let mut dup = None;
        hm.each_valid(s, id, &mut |h, _, _| {
            n += 1;
            if !keys.insert(hm.hasher.key(h)) && dup.is_none() {
                dup = Some(h);
            }
        });
        if let Some(h) = dup {
            return Err(corrupt(format!(
                "key {:#x} is stored twice",
                hm.hasher.key(h)
            )));
        }
        let counted = hm.head(s)[HD_COUNT].load(Ordering::Relaxed);
        if counted != n {
            return Err(corrupt(format!(
                "segment {s:#x} holds {n} items, its header says {counted}"
            )));
        }
    }
    if keys.len() as u64 != hm.len() {
        return Err(corrupt(format!(
            "the table holds {} keys, its counter says {}",
            keys.len(),
            hm.len()
        )));
    }
    Ok(CheckReport {
        keys: keys.len() as u64,
        reachable_bytes: reachable,
    })
}
