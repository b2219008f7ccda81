//! The [`Engine`] implementation.

use std::sync::atomic::Ordering;

use engine::{CheckReport, Engine, Result, Stats};

use crate::grow::slabs;
use crate::layout::*;
use crate::{recover, Rophi, LOCKS};

impl Engine for Rophi {
    fn name(&self) -> &str {
        "rophi"
    }

    fn insert(&self, key: u64, value: u64) -> Result<bool> {
        self.insert_key(key, value)
    }

    fn get(&self, key: u64) -> Option<u64> {
        self.get_key(key)
    }

    fn get_many(&self, keys: &[u64], out: &mut [Option<u64>]) {
        self.get_many_keys(keys, out)
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
        let t = self.table();
        let slab_total = self.slab_total.load(Ordering::Relaxed);
        let free = self.free.lock().unwrap_or_else(|e| e.into_inner()).len() as u64;
        let chain = slab_total.saturating_sub(free);
        let capacity = SLOTS as u64 * (t.heads() + chain);
        let slab_bytes: u64 = slabs(&self.pool, t)
            .iter()
            .map(|&(_, n)| S_BUCKETS + n * BUCKET)
            .sum();
        let f = self.filter.get();
        let c = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed).to_string();
        let ms = |a: &std::sync::atomic::AtomicU64| {
            format!("{:.1}", a.load(Ordering::Relaxed) as f64 / 1000.0)
        };
        Stats {
            len,
            capacity,
            load_factor: len as f64 / capacity.max(1) as f64,
            pm_bytes: ROOT_BYTES + t.bytes() + slab_bytes,
            dram_bytes: f.bytes() + 8 * LOCKS as u64 + 8 * free,
            structural_changes: self.t.structural.changes(),
            structural_nanos: self.t.structural.nanos(),
            detail: vec![
                ("head buckets".into(), format!("2^{}", t.k)),
                ("chain buckets in use".into(), chain.to_string()),
                ("chain buckets free".into(), free.to_string()),
                (
                    "keys per head".into(),
                    format!("{:.3}", len as f64 / t.heads() as f64),
                ),
                (
                    "heads per region lock".into(),
                    (t.heads() / LOCKS as u64).max(1).to_string(),
                ),
                ("filter buckets".into(), f.buckets().to_string()),
                ("filter load".into(), format!("{:.4}", f.load())),
                (
                    "filter expected fpr".into(),
                    format!("{:.5}", f.expected_fpr()),
                ),
                ("filter bytes".into(), f.bytes().to_string()),
                ("filter growths".into(), c(&self.t.filter_growths)),
                ("filter full on insert".into(), c(&self.t.filter_full)),
                ("filter build ms".into(), ms(&self.t.filter_build_us)),
                (
                    "filter build threads".into(),
                    c(&self.t.filter_build_threads),
                ),
                ("resizes".into(), c(&self.t.resizes)),
                ("resize ms".into(), ms(&self.t.resize_us)),
                (
                    "resize failures (pool full)".into(),
                    c(&self.t.resize_failures),
                ),
                ("chain inserts".into(), c(&self.t.chain_inserts)),
                ("slabs added".into(), c(&self.t.slabs_added)),
                (
                    "empty chain buckets released at open".into(),
                    c(&self.t.released),
                ),
                ("reader retries".into(), c(&self.t.retries)),
                ("open ms".into(), ms(&self.t.recovery_us)),
            ],
        }
    }

    fn for_each(&self, f: &mut dyn FnMut(u64, u64)) {
        // Holds off resizes (which give tables back) for the walk; `f` must
        // not write to this table.
        let _m = self.resize_mx.lock().unwrap_or_else(|e| e.into_inner());
        let t = self.table();
        for h in 0..t.heads() {
            let mut b = t.head(h);
            while b != 0 {
                let w = self.pool.words(b, 8);
                let tok = w[W_TOKENS].load(Ordering::Acquire);
                for s in 0..SLOTS {
                    if tok & token(s) != 0 {
                        f(
                            w[w_key(s)].load(Ordering::Relaxed),
                            w[w_val(s)].load(Ordering::Relaxed),
                        );
                    }
                }
                b = w[W_NEXT].load(Ordering::Acquire);
            }
        }
    }

    fn check(&self) -> Result<CheckReport> {
        recover::check(self)
    }

    fn close(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        // Writes are durable when they return, so a clean close records
        // the count (checked by the next open) and marks the pool clean.
        let _m = self.resize_mx.lock().unwrap_or_else(|e| e.into_inner());
        let _closed = self.gate.close();
        self.pool.store_u64(self.root + R_LEN, self.len());
        // persist: the count before the clean flag that makes it trusted.
        self.pool.persist(self.root + R_LEN, 8);
        self.pool.close()?;
        Ok(())
    }
}
