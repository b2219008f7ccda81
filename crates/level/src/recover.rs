//! Open (validate the root and the geometry record, replay the undo and
//! move logs, check a clean pool's recorded counts against its buckets,
//! finish an interrupted resize) and `check` (every key in one of its
//! candidate buckets, once, with a right fingerprint; counts as recorded).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use engine::{CheckReport, EngineConfig, Error, Result};
use pmem::Pool;

use crate::layout::*;
use crate::{Geo, Level, BOT, MAX_BUCKETS, MIN_TOP, TOP};

fn corrupt(m: String) -> Error {
    Error::Corrupt(m)
}

impl Level {
    /// Opens an existing pool: validates the root and geometry, applies the
    /// logs, finishes an interrupted resize and rebuilds the counters.
    pub fn open(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Level> {
        let root = pool.root();
        if root == 0 {
            return Err(corrupt("pool has no level-hashing root (root is 0)".into()));
        }
        if pool.block_size(root)? < ROOT_BYTES {
            return Err(corrupt(format!(
                "root block at {root:#x} is smaller than {ROOT_BYTES} bytes"
            )));
        }
        if pool.load_u64(root) != ROOT_MAGIC {
            return Err(corrupt(format!(
                "root block at {root:#x} has no level-hashing magic"
            )));
        }
        let seeds = (pool.load_u64(root + R_SEED1), pool.load_u64(root + R_SEED2));
        let selector = pool.load_u64(root + R_SELECTOR);
        let rec_off = root + R_RECORDS + (selector % 2) * 64;
        let mut w = [0u64; 8];
        for (i, x) in w.iter_mut().enumerate() {
            *x = pool.load_u64(rec_off + i as u64 * 8);
        }
        let rec = Record::decode(&w)
            .filter(|r| r.seq == selector)
            .ok_or_else(|| corrupt(format!("geometry record {selector} is missing or torn")))?;
        Self::validate_record(&pool, &rec)?;
        let min_top = pool.load_u64(root + R_MIN_TOP).max(MIN_TOP);
        let lv = Level::new_handle(pool, root, seeds, min_top, cfg.threads);
        let g = Geo::from_record(&rec);
        lv.replay_logs(&g)?;
        lv.publish(&g);
        if lv.pool.was_clean() && rec.phase == Phase::Normal {
            // A clean close recorded each level's count; the buckets must
            // still hold that many items (a page zeroed or overwritten
            // since would otherwise open with keys silently missing). A
            // writable open after a read-only one that passed this scan
            // under the same lock (`Pool::prechecked`) does not scan again.
            let recorded: [u64; 3] =
                std::array::from_fn(|i| lv.pool.load_u64(root + R_COUNTS + i as u64 * 8));
            let found = if lv.pool.prechecked() {
                recorded
            } else {
                let buckets: u64 = g.lv.iter().map(|l| l.n).sum();
                lv.clean_scan_buckets.store(buckets, Ordering::Relaxed);
                lv.scan_counts(&g)
            };
            for (i, c) in lv.counts.iter().enumerate() {
                let recorded = recorded[i];
                if recorded != found[i] {
                    return Err(corrupt(format!(
                        "clean pool records {recorded} items in level {i}, its buckets hold {}: {}",
                        found[i],
                        engine::damaged_after_close(&lv.pool)
                    )));
                }
                c.set(recorded as i64);
            }
        } else {
            let counts = lv.scan_counts(&g);
            for (c, n) in lv.counts.iter().zip(counts) {
                c.set(n as i64);
            }
        }
        lv.bl_first.store(
            lv.counts[BOT].get() > lv.counts[TOP].get(),
            Ordering::Relaxed,
        );
        if rec.phase != Phase::Normal {
            let _w = lv.gate.close();
            match lv.finish_resize(&g, false, None) {
                // A rehash that finds no slot leaves the resize in progress:
                // every key stays reachable (searches probe the interim
                // level) and the table opens; inserts report the lack of room.
                Ok(()) | Err(Error::OutOfSpace(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(lv)
    }

    fn validate_record(pool: &Pool, r: &Record) -> Result<()> {
        let check = |name: &str, l: &Lvl| -> Result<()> {
            if !l.present() {
                return Ok(());
            }
            if !l.n.is_power_of_two() || l.n > MAX_BUCKETS {
                return Err(corrupt(format!(
                    "{name} level has {} buckets, not a power of two",
                    l.n
                )));
            }
            let size = pool.block_size(l.raw)?;
            if size < level_alloc_bytes(l.n) {
                return Err(corrupt(format!(
                    "{name} level block of {size} bytes cannot hold {} buckets",
                    l.n
                )));
            }
            Ok(())
        };
        check("top", &r.top)?;
        check("bottom", &r.bot)?;
        check("interim", &r.il)?;
        let shape_ok = match r.phase {
            Phase::Normal => r.top.n >= 2 && r.bot.n * 2 == r.top.n && !r.il.present(),
            Phase::Expanding => r.bot.n * 2 == r.top.n && r.il.n * 2 == r.bot.n,
            Phase::Shrinking => r.bot.n * 2 == r.top.n && r.il.n == r.top.n * 2,
        };
        if !shape_ok {
            return Err(corrupt(format!(
                "geometry {r:?} has inconsistent level sizes"
            )));
        }
        Ok(())
    }

    /// Which level block holds `line`, if it is a line of one.
    fn line_ok(g: &Geo, line: u64, slot: u64) -> bool {
        slot < SLOTS_PER_LINE as u64
            && line.is_multiple_of(LINE)
            && g.lv
                .iter()
                .any(|l| l.present() && line >= l.base() && line < l.base() + l.n * BUCKET)
    }

    /// Applies the undo and move records a crash left behind.
    fn replay_logs(&self, g: &Geo) -> Result<()> {
        let mut touched = false;
        for i in 0..LOG_SLOTS {
            let off = self.root + R_LOGS + i as u64 * 64;
            let mut w = [0u64; 8];
            for (j, x) in w.iter_mut().enumerate() {
                *x = self.pool.load_u64(off + j as u64 * 8);
            }
            if w[0] == 0 {
                continue;
            }
            touched = true;
            let Some(rec) = LogRecord::decode(&w) else {
                self.pool.store_u64(off, 0);
                self.pool.flush(off, 8);
                continue;
            };
            if !Self::line_ok(g, rec.src_line, rec.src_slot)
                || (rec.kind == LogKind::Move && !Self::line_ok(g, rec.dst_line, rec.dst_slot))
            {
                return Err(corrupt(format!(
                    "log slot {i} names lines outside the table: {rec:?}"
                )));
            }
            let sw = self.pool.words(rec.src_line, 8);
            let s = rec.src_slot as usize;
            let src_holds = sw[W_HDR].load(Ordering::Relaxed) & (1 << s) != 0
                && sw[w_key(s)].load(Ordering::Relaxed) == rec.key;
            match rec.kind {
                LogKind::Update if src_holds => {
                    // persist: the old value back, before the log is cleared.
                    sw[w_val(s)].store(rec.value, Ordering::Relaxed);
                    self.pool.flush(rec.src_line, LINE as usize);
                }
                LogKind::Move if src_holds => {
                    let dw = self.pool.words(rec.dst_line, 8);
                    let d = rec.dst_slot as usize;
                    if dw[W_HDR].load(Ordering::Relaxed) & (1 << d) != 0
                        && dw[w_key(d)].load(Ordering::Relaxed) == rec.key
                    {
                        // Both copies valid: drop the source.
                        let hdr = sw[W_HDR].load(Ordering::Relaxed);
                        sw[W_HDR].store(hdr & !(1 << s), Ordering::Relaxed);
                        self.pool.flush(rec.src_line, LINE as usize);
                    }
                }
                _ => {}
            }
        }
        if touched {
            // persist: every repair before any log slot is cleared, so a
            // crash during recovery replays the same idempotent repairs.
            self.pool.fence();
            for i in 0..LOG_SLOTS {
                let off = self.root + R_LOGS + i as u64 * 64;
                if self.pool.load_u64(off) != 0 {
                    self.pool.store_u64(off, 0);
                    self.pool.flush(off, 8);
                }
            }
            self.pool.fence();
        }
        Ok(())
    }

    fn scan_counts(&self, g: &Geo) -> [u64; 3] {
        let mut out = [0u64; 3];
        for (li, l) in g.lv.iter().enumerate() {
            out[li] = engine::par_sum(l.n as usize, |b| {
                let off = l.bucket(b as u64);
                (self.pool.load_u64(off + 8) & TOKEN_MASK).count_ones() as u64
                    + (self.pool.load_u64(off + LINE + 8) & TOKEN_MASK).count_ones() as u64
            });
        }
        out
    }

    pub(crate) fn visit(&self, f: &mut dyn FnMut(usize, u64, u64, u64)) {
        let (_, g) = self.geo_read();
        for (li, l) in g.lv.iter().enumerate() {
            for b in 0..l.n {
                for line in [l.bucket(b), l.bucket(b) + LINE] {
                    let w = self.pool.words(line, 8);
                    let hdr = w[W_HDR].load(Ordering::Acquire);
                    for s in 0..SLOTS_PER_LINE {
                        if hdr & (1 << s) != 0 {
                            f(
                                li,
                                b,
                                w[w_key(s)].load(Ordering::Relaxed),
                                w[w_val(s)].load(Ordering::Relaxed),
                            );
                        }
                    }
                }
            }
        }
    }

    /// [`Engine::check`](engine::Engine::check).
    #[inline]
    pub(crate) fn check_table(&self) -> Result<CheckReport> {
        let (_, g) = self.geo_read();
        let mut seen = std::collections::HashSet::new();
        let mut bad = None;
        let mut per_level = [0u64; 3];
        self.visit(&mut |li, b, k, _| {
            let (c, nc) = Self::cands(&g.lv[li], self.hashes(k));
            if !c[..nc].contains(&b) && bad.is_none() {
                bad = Some(format!(
                    "key {k:#x} sits in bucket {b} of level {li}, not one of its candidates"
                ));
            }
            if !seen.insert(k) && bad.is_none() {
                bad = Some(format!("key {k:#x} is stored twice"));
            }
            per_level[li] += 1;
        });
        if let Some(m) = bad {
            return Err(corrupt(m));
        }
        for l in g.lv.iter().filter(|l| l.present()) {
            for b in 0..l.n {
                for line in [l.bucket(b), l.bucket(b) + LINE] {
                    let hdr = self.pool.load_u64(line + 8);
                    if hdr & !(TOKEN_MASK | FP_MASK) != 0 {
                        return Err(corrupt(format!("line {line:#x} has header {hdr:#x}")));
                    }
                    for s in 0..SLOTS_PER_LINE {
                        let k = self.pool.load_u64(line + 16 + 16 * s as u64);
                        if hdr & (1 << s) != 0
                            && fp_candidates(hdr, fingerprint(self.hashes(k).0)) & (1 << s) == 0
                        {
                            return Err(corrupt(format!(
                                "key {k:#x} in line {line:#x} has a wrong fingerprint"
                            )));
                        }
                    }
                }
            }
        }
        for (li, (&found, counter)) in per_level.iter().zip(&self.counts).enumerate() {
            if found as i64 != counter.get() {
                return Err(corrupt(format!(
                    "level {li} holds {found} items, its counter says {}",
                    counter.get()
                )));
            }
        }
        let mut reachable = self.pool.block_size(self.root)?;
        for l in g.lv.iter().filter(|l| l.present()) {
            reachable += self.pool.block_size(l.raw)?;
        }
        Ok(CheckReport {
            keys: seen.len() as u64,
            reachable_bytes: reachable,
        })
    }
}
