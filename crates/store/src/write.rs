//! The write path: single writes (`put`, `insert`, `update`, `delete`)
//! and batches (`put_batch`, `write_batch`). Each appends to the writer's
//! node's Nlog, fences, then publishes the entry in the index and the
//! cache.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use engine::{Error, Result};

use crate::index::KeyChange;
use crate::layout::*;
use crate::nlog::LogFile;
use crate::store::{check_key, check_value, Store};

impl Store {
    /// Inserts or replaces.
    #[inline]
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.write(key, Some(value), Want::Any)
            .map(|_| ())
            .map_err(|e| *e)
    }

    /// Inserts a new key; `Ok(false)` (nothing written) if it is present.
    #[inline]
    pub fn insert(&self, key: &[u8], value: &[u8]) -> Result<bool> {
        self.write(key, Some(value), Want::Absent).map_err(|e| *e)
    }

    /// Replaces the value of a present key; `Ok(false)` if absent.
    #[inline]
    pub fn update(&self, key: &[u8], value: &[u8]) -> Result<bool> {
        self.write(key, Some(value), Want::Present).map_err(|e| *e)
    }

    /// Removes `key`; `Ok(false)` if absent.
    #[inline]
    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        self.write(key, None, Want::Present).map_err(|e| *e)
    }

    /// One write. Its order is built so that nothing after the entry's
    /// fence is a locked instruction or a fence: such an instruction waits
    /// for the entry's write-back to finish, while plain stores after an
    /// `sfence` retire at once (the fence only keeps them from being seen
    /// before the write-back). The write-back then overlaps the rest of
    /// this write and the start of the next one, whose index miss is
    /// issued before its first fence (the pin). What needs a locked
    /// instruction — the stripe, the point map's shard (reserved), the
    /// version, the active file's lock, the tree's queue, the old entry's
    /// accounting — comes before the fence; after it come the index
    /// commit (plain stores), the unlocks (plain stores), and the cache
    /// update only when the cache is on.
    ///
    /// The error is boxed so that the result fits two registers: a result
    /// returned through memory, read back by the caller with a wider load
    /// than the stores that wrote it, cannot be forwarded from the store
    /// buffer and waits for those stores to reach the cache, which after
    /// the `sfence` means waiting for the entry's write-back (perf put 15%
    /// of a put's samples there, in the benchmark's caller).
    fn write(
        &self,
        key: &[u8],
        value: Option<&[u8]>,
        want: Want,
    ) -> std::result::Result<bool, Box<Error>> {
        check_key(key)?;
        if let Some(v) = value {
            check_value(v)?;
        }
        self.writable()?;
        let s = &*self.inner;
        crate::gc::pace(s);
        let hash = key_hash(key);
        let here = s.numa.current();
        // The index bucket's miss, the lock lines' and the log tail's start
        // before the pin, whose fence waits for the previous write's flush:
        // they overlap that wait and each other. Not the log's for a delete
        // that will most likely only mark its entry (below): loading the
        // pair's line would pull it from a writer that needs it.
        s.index.prefetch_write(hash);
        if value.is_some() || !s.in_place_deletes {
            s.log.prefetch_tail(
                here,
                cluster_of(hash, s.log.clusters),
                entry_len(key.len(), value.map_or(0, <[u8]>::len)),
            );
        }
        // One pin for the whole write: the point map's and the log's own
        // pins nest in it and cost no fence each.
        let p = s.epochs.pin();
        s.raf.note_op();
        let _k = s.index.stripes.lock(hash);
        let held = s.index.reserve(key, hash);
        let old = held.current();
        match (want, old) {
            (Want::Absent, Some(_)) | (Want::Present, None) => return Ok(false),
            _ => {}
        }
        if value.is_none() && s.in_place_deletes {
            if let Some(o) = old.filter(|&o| s.history_is_dead(o)) {
                // A delete of an entry with no valid history marks the
                // entry itself invalid: no `del` entry, so no new log bytes
                // and nothing for GC to mark later (its file is all dead
                // once every key in it is deleted). Recovery keeps the
                // highest-version valid entry of a key; with this one
                // invalid and nothing older valid, the key is absent.
                if let Some(f) = s.log.file_in(vaddr_off(o), &p) {
                    s.account_replaced(f, o, held.current_len());
                }
                s.numa.count_write(vaddr_node(o), here);
                let cache = !s.raf.writes_may_skip();
                // persist: the mark (flushed in mark_invalid) before the
                // index forgets the key and before the delete returns
                // (acknowledged => durable); the one fence orders it.
                s.log.mark_invalid(vaddr_off(o));
                s.log.pool.fence();
                let c = KeyChange {
                    key,
                    hash,
                    va: o,
                    value: None,
                };
                let changed = s
                    .index
                    .commit(held, &c, false, &mut |h, p| s.append_ovf(h, p))?;
                s.after_index(&c, here, changed, cache);
                return Ok(true);
            }
        }
        let (e, old_file) = s.stage(key, hash, value, old)?;
        let staged = s.log.append_flushed(here, &e, &s.numa)?;
        // Before the fence (see above): the accounting of the old entry
        // and of a del entry (never live data), the tree's queue, and
        // whether the cache needs this write.
        if let (Some(f), Some(o)) = (&old_file, old) {
            s.account_replaced(f, o, held.current_len());
        }
        drop(old_file);
        if value.is_none() {
            staged
                .file()
                .dead
                .fetch_add(entry_len(key.len(), 0), Ordering::Relaxed);
        }
        let queued = value.is_some() && s.index.queue_insert_early(&held, key, hash);
        let cache = !s.raf.writes_may_skip();
        // persist: the entry (flushed in append_flushed) before the index
        // and the cache name it, so a reader never returns a value a crash
        // could take back (I1, CRASH-PATTERNS #6); the commit fences it.
        let va = staged.commit();
        let c = KeyChange {
            key,
            hash,
            va,
            value,
        };
        let changed = s
            .index
            .commit(held, &c, queued, &mut |h, p| s.append_ovf(h, p))?;
        s.after_index(&c, here, changed, cache);
        Ok(true)
    }

    /// Puts every pair, in order (a later pair of the same key wins), with
    /// one fence for the whole batch instead of one per pair: the group
    /// commit `pmhash serve` uses for pipelined `SET`s and `MSET`.
    ///
    /// Every pair is checked before anything is written. When the call
    /// returns `Ok`, every pair is durable (under `Strict`) and visible.
    /// The batch is not atomic: a crash during the call may keep any subset
    /// of its pairs, and a reader may see some pairs before others. On an
    /// error the pairs before the failing one are put, and the error says
    /// how many ([`BatchError::done`]); a bad key or value fails the batch
    /// before anything is written.
    pub fn put_batch(&self, pairs: &[(&[u8], &[u8])]) -> std::result::Result<(), BatchError> {
        let ops: Vec<(&[u8], Option<&[u8]>)> = pairs.iter().map(|&(k, v)| (k, Some(v))).collect();
        self.write_batch(&ops)
    }

    /// As [`put_batch`](Self::put_batch), with deletes: `(key, None)`
    /// deletes `key` (nothing is written for a key that is absent at that
    /// point of the batch). One fence for all of them: `pmhash serve`'s
    /// `EXEC` commits a transaction's writes with it.
    pub fn write_batch(
        &self,
        ops: &[(&[u8], Option<&[u8]>)],
    ) -> std::result::Result<(), BatchError> {
        let pairs = ops;
        let none = |error| BatchError { done: 0, error };
        for (k, v) in pairs {
            check_key(k).map_err(none)?;
            if let Some(v) = v {
                check_value(v).map_err(none)?;
            }
        }
        self.writable().map_err(none)?;
        let s = &*self.inner;
        crate::gc::pace(s);
        let here = s.numa.current();
        let hashes: Vec<u64> = pairs.iter().map(|(k, _)| key_hash(k)).collect();
        // Every key's stripe is held until the index names its new entry,
        // as a single write holds its key's (taken sorted: no deadlock with
        // another batch; GC holds one stripe at a time).
        let _k = s.index.stripes.lock_all(hashes.iter().copied());
        let _p = s.epochs.pin();
        let mut done: Vec<Unpublished> = Vec::with_capacity(pairs.len());
        // What pair i left the index naming: its entry's address (None
        // for a delete, or a pair not reached yet).
        let mut addr_of: Vec<Option<u64>> = vec![None; pairs.len()];
        // Where pair i's key appeared before in the batch, if it did.
        let earlier: Vec<Option<usize>> = if pairs.len() <= 32 {
            (0..pairs.len())
                .map(|i| (0..i).rev().find(|&j| pairs[j].0 == pairs[i].0))
                .collect()
        } else {
            let mut last: HashMap<&[u8], usize> = HashMap::with_capacity(pairs.len());
            (0..pairs.len())
                .map(|i| last.insert(pairs[i].0, i))
                .collect()
        };
        let mut r = Ok(());
        let mut start = 0;
        while start < pairs.len() && r.is_ok() {
            // A run ends before the first key it already holds: a repeated
            // key's entry must name (h_addr) the one before it, whose
            // address is known only once appended.
            let mut end = start + 1;
            while end < pairs.len() && !matches!(earlier[end], Some(j) if j >= start) {
                end += 1;
            }
            // Independent misses the CPU can overlap, where one key at a
            // time would wait for each in turn: every key's index bucket,
            // log tail (the append's stores would otherwise miss) and cache
            // bucket (locked after the fence, one key after another), then
            // every candidate entry that confirms a key, then the lookups
            // (current addresses), then a touch of each old entry's header
            // (read again when the old entry is accounted dead).
            for i in (start..end).filter(|&i| earlier[i].is_none()) {
                s.index.prefetch(hashes[i]);
                s.log.prefetch_tail(
                    here,
                    cluster_of(hashes[i], s.log.clusters),
                    entry_len(pairs[i].0.len(), pairs[i].1.map_or(0, <[u8]>::len)),
                );
                s.raf.prefetch(hashes[i]);
            }
            for i in (start..end).filter(|&i| earlier[i].is_none()) {
                s.index.prefetch_candidates(pairs[i].0, hashes[i]);
            }
            let cur: Vec<Option<u64>> = (start..end)
                .map(|i| match earlier[i] {
                    // Written in an earlier run.
                    Some(j) => addr_of[j],
                    None => s.index.get_hashed(pairs[i].0, hashes[i]),
                })
                .collect();
            for o in cur.iter().flatten() {
                s.log.touch(vaddr_off(*o));
            }
            let mut staged = Vec::with_capacity(end - start);
            let mut olds = Vec::with_capacity(end - start);
            let mut which = Vec::with_capacity(end - start);
            for (i, &old) in (start..end).zip(&cur) {
                let (k, v) = pairs[i];
                if v.is_none() && old.is_none() {
                    // A delete of an absent key writes nothing.
                    continue;
                }
                s.raf.note_op();
                match s.stage(k, hashes[i], v, old) {
                    Ok((e, f)) => {
                        staged.push(e);
                        olds.push((old, f));
                        which.push(i);
                    }
                    Err(e) => {
                        r = Err(e);
                        break;
                    }
                }
            }
            let mut out = Vec::with_capacity(staged.len());
            // persist: every entry of the run with one fence (inside
            // append_batch) before the index and the cache name any of
            // them (I1, CRASH-PATTERNS #6).
            let appended = s.log.append_batch(here, &staged, &mut out, &s.numa);
            if r.is_ok() {
                r = appended;
            }
            for (((va, file), (old, old_file)), i) in out.into_iter().zip(olds).zip(which) {
                addr_of[i] = pairs[i].1.map(|_| va);
                done.push((i, old, old_file, va, file));
            }
            start = end;
        }
        // Pairs before the first one not written: every pair of the runs
        // done (a skipped delete counts as done).
        let n = if r.is_ok() {
            pairs.len()
        } else {
            done.last().map_or(0, |d| d.0 + 1)
        };
        for (i, old, old_file, va, file) in done {
            let (k, v) = pairs[i];
            let c = KeyChange {
                key: k,
                hash: hashes[i],
                va,
                value: v,
            };
            s.publish(&c, old, old_file.as_deref(), &file, here)
                .map_err(|error| BatchError { done: i, error })?;
        }
        r.map_err(|error| BatchError { done: n, error })
    }
}

/// An entry of a batch, appended and not yet published: (pair, old
/// address, old file, address, file).
type Unpublished = (usize, Option<u64>, Option<Arc<LogFile>>, u64, Arc<LogFile>);

/// A [`Store::put_batch`] that stopped: its first `done` pairs are put,
/// the rest are not.
#[derive(Debug)]
pub struct BatchError {
    /// Pairs put, from the batch's start.
    pub done: usize,
    /// Why the next pair was not.
    pub error: Error,
}

impl std::fmt::Display for BatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (after {} pairs of the batch)", self.error, self.done)
    }
}

impl std::error::Error for BatchError {}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Want {
    Any,
    Absent,
    Present,
}
