//! The [`Engine`] implementation.

use std::sync::atomic::Ordering;

use engine::{CheckReport, Engine, Fixed, Pow2, Result, Stats};

use crate::grow::slabs;
use crate::layout::*;
use crate::{recover, Rophi, Tallies, LOCKS};

impl Rophi {
    /// A snapshot of the table's figures (what `stats().detail` lists).
    pub fn tallies(&self) -> Tallies {
        let len = self.len();
        let t = self.table();
        let slab_total = self.slab_total.load(Ordering::Relaxed);
        let free = self.free.lock().unwrap_or_else(|e| e.into_inner()).len() as u64;
        let f = self.filter.get();
        let c = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let ms = |a: &std::sync::atomic::AtomicU64| Fixed(c(a) as f64 / 1000.0);
        Tallies {
            head_buckets: Pow2(t.k),
            chain_buckets_in_use: slab_total.saturating_sub(free),
            chain_buckets_free: free,
            keys_per_head: Fixed(len as f64 / t.heads() as f64),
            heads_per_region_lock: (t.heads() / LOCKS as u64).max(1),
            filter_buckets: f.buckets() as u64,
            filter_load: Fixed(f.load()),
            filter_expected_fpr: Fixed(f.expected_fpr()),
            filter_bytes: f.bytes(),
            filter_growths: c(&self.t.filter_growths),
            filter_refreshes: c(&self.t.filter_refreshes),
            filter_full_on_insert: c(&self.t.filter_full),
            filter_build_ms: ms(&self.t.filter_build_us),
            filter_build_threads: c(&self.t.filter_build_threads),
            resizes: c(&self.t.resizes),
            resize_ms: ms(&self.t.resize_us),
            resize_failures: c(&self.t.resize_failures),
            tables_prepared: c(&self.t.prepared),
            ahead_taken: c(&self.t.ahead_taken),
            ahead_given_back: c(&self.t.ahead_given_back),
            ahead_failures: c(&self.t.ahead_failures),
            prefaulted_mib: Fixed(c(&self.t.prefaulted) as f64 / (1u64 << 20) as f64),
            chain_inserts: c(&self.t.chain_inserts),
            slabs_added: c(&self.t.slabs_added),
            released_at_open: c(&self.t.released),
            reader_retries: c(&self.t.retries),
            open_ms: ms(&self.t.recovery_us),
        }
    }
}

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
        let tallies = self.tallies();
        let capacity = SLOTS as u64 * (t.heads() + tallies.chain_buckets_in_use);
        let slab_bytes: u64 = slabs(&self.pool, t)
            .iter()
            .map(|&(_, n)| S_BUCKETS + n * BUCKET)
            .sum();
        Stats {
            len,
            capacity,
            load_factor: len as f64 / capacity.max(1) as f64,
            pm_bytes: ROOT_BYTES + t.bytes() + slab_bytes,
            dram_bytes: tallies.filter_bytes + 8 * LOCKS as u64 + 8 * tallies.chain_buckets_free,
            structural_changes: self.t.structural.changes(),
            structural_nanos: self.t.structural.nanos(),
            detail: tallies.detail(),
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
        // persist: the table reserved ahead is given back (`next` cleared
        // and persisted, then the block freed) before the count and the
        // clean flag below; a crash before leaves it named, and open gives
        // it back.
        if let Err(e) = self.give_back_ahead() {
            // Nothing of the close is done: the engine stays open.
            self.closed.store(false, Ordering::Release);
            return Err(e);
        }
        self.pool.store_u64(self.root + R_LEN, self.len());
        // persist: the count before the clean flag that makes it trusted.
        self.pool.persist(self.root + R_LEN, 8);
        self.pool.close()?;
        Ok(())
    }
}
