//! The public API: the [`Engine`] trait (u64 keys; in bytes mode the key
//! `k` stands for [`wide_key`]`(k)`) and byte-string keys.

use std::sync::atomic::Ordering;

use engine::{CheckReport, Engine, Fixed, Pow2, Result, Stats};

use crate::layout::*;
use crate::{is_wide, recover, wide_key, Buckets, Key, Pass, Tallies};

impl Pass {
    /// A snapshot of the table's figures (what `stats().detail` lists).
    /// Also raises the recorded highest load factor to the current one.
    pub fn tallies(&self) -> Tallies {
        let stored = self.len_bytes();
        let first = self.first();
        let chains = self.t.chain_buckets.load(Ordering::Relaxed);
        let capacity = first * self.geo.seg_slots() + chains * SLOTS as u64;
        // The load factor counts every record (the slots they fill).
        let lf = stored as f64 / capacity.max(1) as f64;
        let max_lf = f64::from_bits(self.t.max_lf_bits.load(Ordering::Relaxed)).max(lf);
        self.t
            .max_lf_bits
            .store(max_lf.to_bits(), Ordering::Relaxed);
        let sn = self.snap();
        let tables: u64 = (0..6)
            .map(|s| self.pool.load_u64(self.root + R_TABLES + 8 * s))
            .filter(|&b| b != 0)
            .map(|b| octave_bytes(self.pool.load_u64(b + 16) as u32))
            .sum();
        let c = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        Tallies {
            segments: first,
            segment_bytes: self.geo.seg_bytes(),
            buckets: Buckets {
                normal: self.geo.n,
                stash: self.geo.m,
            },
            table_cells_per_octave: Pow2(sn.k),
            table_bytes: tables,
            key_mode: if self.geo.bytes_keys {
                crate::KeyMode::Bytes
            } else {
                crate::KeyMode::Inline
            },
            stored_keys: stored,
            split_load: Fixed(self.split_load),
            splits: c(&self.t.splits),
            moved: c(&self.t.moved),
            split_failures: c(&self.t.split_failures),
            displacements: c(&self.t.displacements),
            stash_inserts: c(&self.t.stash_inserts),
            chain_inserts: c(&self.t.chain_inserts),
            chain_buckets: chains,
            chain_buckets_freed: c(&self.t.chain_freed),
            octaves_built: c(&self.t.octaves_built),
            stale_removed: c(&self.t.stale_removed),
            duplicates_removed: c(&self.t.duplicates_removed),
            recovery_us: c(&self.t.recovery_us),
            clean_open_segments_walked: c(&self.t.clean_walked),
            max_load_factor: Fixed(max_lf),
        }
    }

    /// Inserts a byte-string key (bytes mode). `Ok(false)`: already present.
    pub fn insert_bytes(&self, key: &[u8], value: u64) -> Result<bool> {
        self.check_bytes_key(key)?;
        let r = self.insert_key(Key::Bytes(key), value)?;
        if r && !is_wide(key) {
            self.odd.add(1);
        }
        Ok(r)
    }

    /// The value of a byte-string key (bytes mode).
    pub fn get_bytes(&self, key: &[u8]) -> Result<Option<u64>> {
        self.check_bytes_key(key)?;
        Ok(self.get_key(Key::Bytes(key)))
    }

    /// Replaces the value of a byte-string key. `Ok(false)`: absent.
    pub fn update_bytes(&self, key: &[u8], value: u64) -> Result<bool> {
        self.check_bytes_key(key)?;
        self.update_key(Key::Bytes(key), value)
    }

    /// Removes a byte-string key (and frees its key block). `Ok(false)`:
    /// absent.
    pub fn remove_bytes(&self, key: &[u8]) -> Result<bool> {
        self.check_bytes_key(key)?;
        let r = self.remove_key(Key::Bytes(key))?;
        if r && !is_wide(key) {
            self.odd.add(-1);
        }
        Ok(r)
    }

    /// Every stored key, byte keys of any shape included (`Engine::len`
    /// counts only the keys in the form of a u64 key, those `for_each`
    /// visits). Exact when no writer runs.
    pub fn len_bytes(&self) -> u64 {
        self.len.get().max(0) as u64
    }

    /// Every stored pair of a bytes-mode table (not linearizable with
    /// writers).
    pub fn for_each_bytes(&self, f: &mut dyn FnMut(&[u8], u64)) {
        if !self.geo.bytes_keys {
            return;
        }
        self.each_record(&mut |kw, v| {
            if let Ok(b) = self.key_bytes(kw) {
                f(&b, v);
            }
        });
    }

    /// Every record's key word and value, segment by segment: by the
    /// allocation bits, or, in a read-only view of a crashed pool (whose
    /// hints nobody rebuilt), the records recovery would keep, as `len()`
    /// counts them there.
    fn each_record(&self, f: &mut dyn FnMut(u64, u64)) {
        let st = self.snap();
        let crashed_view = self.pool.is_read_only() && !self.pool.was_clean();
        for p in 0..st.first {
            let Some(seg) = self.seg_off(p) else { return };
            if crashed_view {
                let Ok(found) = recover::classify(self, p, &st) else {
                    continue;
                };
                for r in found.iter().filter(|r| r.fate == recover::Fate::Keep) {
                    f(r.kw, r.value);
                }
            } else {
                for (_, kw, v) in self.records(seg) {
                    f(kw, v);
                }
            }
        }
    }

    #[inline]
    fn with_key<T>(&self, key: u64, f: impl FnOnce(Key) -> T) -> T {
        if self.geo.bytes_keys {
            let w = wide_key(key);
            f(Key::Bytes(&w))
        } else {
            f(Key::Word(key))
        }
    }
}

impl Engine for Pass {
    fn name(&self) -> &str {
        self.name
    }

    fn insert(&self, key: u64, value: u64) -> Result<bool> {
        self.with_key(key, |k| self.insert_key(k, value))
    }

    fn get(&self, key: u64) -> Option<u64> {
        if self.geo.bytes_keys {
            self.with_key(key, |k| self.get_key(k))
        } else {
            self.get_word(key)
        }
    }

    fn update(&self, key: u64, value: u64) -> Result<bool> {
        self.with_key(key, |k| self.update_key(k, value))
    }

    fn remove(&self, key: u64) -> Result<bool> {
        self.with_key(key, |k| self.remove_key(k))
    }

    /// The keys `for_each` visits: in bytes mode, the stored keys in the
    /// form of a u64 key ([`wide_key`]); other byte keys count in
    /// [`Pass::len_bytes`] only.
    fn len(&self) -> u64 {
        (self.len.get() - self.odd.get()).max(0) as u64
    }

    fn stats(&self) -> Stats {
        let len = self.len();
        let t = self.tallies();
        let capacity = t.segments * self.geo.seg_slots() + t.chain_buckets * SLOTS as u64;
        let arrays: u64 = self
            .dir
            .iter()
            .enumerate()
            .filter(|(_, d)| d.load(Ordering::Relaxed) != 0)
            .map(|(e, _)| entry_segments(e) * self.geo.seg_bytes())
            .sum();
        Stats {
            len,
            capacity,
            load_factor: t.stored_keys as f64 / capacity.max(1) as f64,
            pm_bytes: ROOT_BYTES + arrays + t.table_bytes + t.chain_buckets * BUCKET,
            dram_bytes: std::mem::size_of::<Self>() as u64 + 8 * DIR_ENTRIES as u64,
            structural_changes: self.t.structural.changes(),
            structural_nanos: self.t.structural.nanos(),
            detail: t.detail(),
        }
    }

    fn for_each(&self, f: &mut dyn FnMut(u64, u64)) {
        if self.geo.bytes_keys {
            self.for_each_bytes(&mut |b, v| {
                if b.len() == 16 {
                    let k = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
                    if b == wide_key(k) {
                        f(k, v);
                    }
                }
            });
            return;
        }
        if self.pool.load_u64(self.root + R_ZERO) == 1 {
            f(
                engine::hash::unfmix64(0) ^ self.seed,
                self.pool.load_u64(self.root + R_ZERO_VALUE),
            );
        }
        self.each_record(&mut |kw, v| {
            // The key word is the key's hash: invert it.
            f(engine::hash::unfmix64(kw) ^ self.seed, v)
        });
    }

    fn check(&self) -> Result<CheckReport> {
        recover::check(self)
    }

    fn close(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        // Records are durable when their writes return (both
        // durabilities); the hints in the meta lines are not written back
        // by the writes (recovery rebuilds them after a crash), so a clean
        // close writes them back here, with the count.
        let _g = self.split_mx.lock().unwrap_or_else(|e| e.into_inner());
        for p in 0..self.first() {
            if let Some(seg) = self.seg_off(p) {
                self.flush_meta(seg);
            }
        }
        // Every record counts (the clean open's walk finds them all).
        self.pool.store_u64(self.root + R_LEN, self.len_bytes());
        // persist: every meta line and the item count before the clean
        // flag that makes them trusted (a clean open rebuilds nothing).
        self.pool.persist(self.root + R_LEN, 8);
        self.pool.close()?;
        Ok(())
    }
}
