//! The [`Engine`] implementation: the operations (`ops.rs`), stats,
//! `sync`, `for_each`, `check` (`recover.rs`) and `close`.

use super::*;

impl Engine for Hmeh {
    fn name(&self) -> &str {
        "hmeh"
    }

    fn insert(&self, key: u64, value: u64) -> Result<bool> {
        self.insert_key(key, value)
    }

    fn get(&self, key: u64) -> Option<u64> {
        self.get_key(key)
    }

    fn update(&self, key: u64, value: u64) -> Result<bool> {
        self.update_key(key, value)
    }

    fn remove(&self, key: u64) -> Result<bool> {
        self.remove_key(key)
    }

    fn len(&self) -> u64 {
        self.len.get().max(0) as u64
    }

    fn stats(&self) -> Stats {
        let len = self.len();
        let segs = self.t.segments.load(Ordering::Relaxed);
        let capacity = segs * self.geo.slots();
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
            detail: self.tallies().detail(),
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
                if self.listed(
                    id,
                    SlotAt {
                        w0,
                        w1,
                        bucket,
                        stash,
                    },
                    &spill,
                    stash_bits,
                ) {
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
