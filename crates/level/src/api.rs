//! The [`Engine`] implementation.

use std::sync::atomic::Ordering;

use engine::{CheckReport, Engine, Result, Stats};

use crate::layout::*;
use crate::Level;

impl Engine for Level {
    fn name(&self) -> &str {
        "level"
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
        self.counts.iter().map(|c| c.get()).sum::<i64>().max(0) as u64
    }

    fn stats(&self) -> Stats {
        let (_, g) = self.geo_read();
        let len = self.len();
        let capacity = Self::slots(&g);
        let mut pm = ROOT_BYTES;
        for l in g.lv.iter().filter(|l| l.present()) {
            pm += self.pool.block_size(l.raw).unwrap_or(0);
        }
        Stats {
            len,
            capacity,
            load_factor: len as f64 / capacity.max(1) as f64,
            pm_bytes: pm,
            dram_bytes: std::mem::size_of::<Self>() as u64 + self.stripes.bytes(),
            structural_changes: self.structural.changes(),
            structural_nanos: self.structural.nanos(),
            detail: self.tallies().detail(),
        }
    }

    fn for_each(&self, f: &mut dyn FnMut(u64, u64)) {
        self.visit(&mut |_, _, k, v| f(k, v));
    }

    fn check(&self) -> Result<CheckReport> {
        self.check_table()
    }

    fn close(&self) -> Result<()> {
        let _w = self.gate.close();
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        for (i, c) in self.counts.iter().enumerate() {
            self.pool
                .store_u64(self.root + R_COUNTS + i as u64 * 8, c.get().max(0) as u64);
        }
        // persist: the counters before the clean flag that makes them trusted.
        self.pool.persist(self.root + R_COUNTS, 24);
        self.pool.close()?;
        Ok(())
    }
}
