//! Search, insert, update, delete.
//!
//! Writers hold the writers' gate (a resize closes it) and the region
//! lock of their head bucket, a DRAM seqlock. Readers take no lock: they
//! read the region's version, walk the chain, and retry if the version
//! moved or the table was replaced meanwhile. A writer releases its region
//! only after its persist, so a reader never returns a pair whose persist
//! has not completed (CRASH-PATTERNS.md #6), and an in-place update cannot
//! be mistaken for an unchanged value (the paper's value re-check would be
//! fooled by an update that writes back an earlier value).

use std::sync::atomic::{fence, Ordering};

use engine::{hits, Result};

use crate::layout::*;
use crate::Rophi;

/// Batch width of [`Rophi::get_many`]: keys whose misses overlap.
const BATCH: usize = 16;

/// What a locked walk of one chain found.
pub(crate) struct Scan {
    /// Bucket and slot holding the key.
    pub hit: Option<(u64, usize)>,
    /// The first free slot of the chain.
    pub empty: Option<(u64, usize)>,
    /// The chain's last bucket.
    pub last: u64,
}

impl Rophi {
    /// One optimistic walk of the chain of `h` in table `t`: `Some(answer)`
    /// when the walk was validated, `None` to retry.
    #[inline]
    pub(crate) fn read_chain(&self, t: Table, h: u64, key: u64) -> Option<Option<u64>> {
        let bn = t.bucket_of(h);
        let lw = self.lock_word(bn);
        let v = lw.load(Ordering::Acquire);
        if v & 1 != 0 {
            std::hint::spin_loop();
            return None;
        }
        let mut b = t.head(bn);
        let mut found = None;
        let mut steps = 0u64;
        let size = self.pool.size();
        // A stale reader (its table replaced and given back) may follow a
        // pointer into reused space: every pointer is checked, the walk is
        // bounded, and the validation below sends it back.
        while let Some(w) = self.bucket_checked(b) {
            let next = w[W_NEXT].load(Ordering::Relaxed);
            if next != 0 && next < size {
                // The paper prefetches a bucket just before reading it; we
                // do it as soon as its address is known, before scanning
                // this bucket's slots.
                self.pool.prefetch(next);
            }
            let tok = w[W_TOKENS].load(Ordering::Relaxed);
            for i in 0..SLOTS {
                if tok & token(i) != 0 && w[w_key(i)].load(Ordering::Relaxed) == key {
                    found = Some(w[w_val(i)].load(Ordering::Relaxed));
                    break;
                }
            }
            steps += 1;
            if found.is_some() || next == 0 || steps > size / BUCKET {
                break;
            }
            b = next;
        }
        fence(Ordering::Acquire);
        if lw.load(Ordering::Relaxed) != v || self.desc.load(Ordering::Relaxed) != t.desc() {
            self.t.retries.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(found)
    }

    pub(crate) fn get_key(&self, key: u64) -> Option<u64> {
        // A positive get needs the chain whatever the filter says, so in a
        // run of hits the filter probe is a second cache miss in series
        // with the head bucket's; a negative get wants the filter alone
        // (no PM line). Each thread keeps a score of its recent answers
        // (`engine::hits`)
        // and, while nearly all were hits, walks the chain without asking
        // the filter: a validated walk is exact on its own (the region
        // seqlock covers every writer's persist), the filter only saves
        // PM reads for absent keys. (Prefetching the head under the
        // filter probe for every get was measured at 10M keys: +8%
        // positive gets, -40% negative gets.)
        if hits::in_run() {
            let r = self.walk(self.hash(key), key);
            hits::record(r.is_some());
            return r;
        }
        // The table's hash only once the filter admits the key: a negative
        // get computes the filter's alone.
        if !self.filter.get().contains(key) {
            hits::record(false);
            return None;
        }
        let r = self.walk(self.hash(key), key);
        // A false positive of the filter is a miss all the same.
        hits::record(r.is_some());
        r
    }

    /// Walks the chain of hash `h` in the live table until a walk
    /// validates.
    #[inline]
    fn walk(&self, h: u64, key: u64) -> Option<u64> {
        loop {
            if let Some(r) = self.read_chain(self.table(), h, key) {
                return r;
            }
        }
    }

    /// Looks up many keys with their misses overlapped, [`BATCH`] keys at
    /// a time: all their filter buckets are prefetched, then probed, then
    /// the head buckets of the keys the filter passed are prefetched, then
    /// walked.
    pub(crate) fn get_many_keys(&self, keys: &[u64], out: &mut [Option<u64>]) {
        assert_eq!(
            keys.len(),
            out.len(),
            "get_many: keys and out differ in length"
        );
        let f = self.filter.get();
        for (kc, oc) in keys.chunks(BATCH).zip(out.chunks_mut(BATCH)) {
            // Stage 1: both filter buckets of every key start loading.
            let probes: [_; BATCH] =
                std::array::from_fn(|j| f.probe(kc.get(j).copied().unwrap_or(0)));
            for p in &probes[..kc.len()] {
                f.prefetch(p);
            }
            // Stage 2: the filter answers; the head buckets of the keys it
            // passed start loading (a negative costs no PM line).
            let t = self.table();
            let mut hs = [None; BATCH];
            for (j, &k) in kc.iter().enumerate() {
                if f.contains_probe(&probes[j]) {
                    let h = self.hash(k);
                    self.pool.prefetch(t.head(t.bucket_of(h)));
                    hs[j] = Some(h);
                }
            }
            // Stage 3: the walks, their first lines (mostly) in cache.
            for (j, &k) in kc.iter().enumerate() {
                oc[j] = match hs[j] {
                    None => None,
                    Some(h) => {
                        let mut t = t;
                        loop {
                            if let Some(r) = self.read_chain(t, h, k) {
                                break r;
                            }
                            t = self.table();
                        }
                    }
                };
            }
        }
    }

    /// Walks the chain at `head` under its region lock: the key's slot
    /// (only looked for when `want_key`), the first free slot, the last
    /// bucket.
    pub(crate) fn scan(&self, head: u64, key: u64, want_key: bool) -> Scan {
        let mut s = Scan {
            hit: None,
            empty: None,
            last: head,
        };
        let mut b = head;
        loop {
            let w = self.pool.words(b, 8);
            let tok = w[W_TOKENS].load(Ordering::Relaxed);
            for i in 0..SLOTS {
                if tok & token(i) == 0 {
                    if s.empty.is_none() {
                        s.empty = Some((b, i));
                        if !want_key {
                            return s;
                        }
                    }
                } else if want_key && w[w_key(i)].load(Ordering::Relaxed) == key {
                    s.hit = Some((b, i));
                    return s;
                }
            }
            let next = w[W_NEXT].load(Ordering::Relaxed);
            s.last = b;
            if next == 0 {
                return s;
            }
            b = next;
        }
    }

    pub(crate) fn insert_key(&self, key: u64, value: u64) -> Result<bool> {
        self.check_open()?;
        let h = self.hash(key);
        let mut grown = false;
        loop {
            let gate = self.gate.enter();
            let t = self.table();
            let bn = t.bucket_of(h);
            let head = t.head(bn);
            self.pool.prefetch(head);
            let f = self.filter.get();
            let p = f.probe(key);
            f.prefetch(&p);
            let region = self.lock_region(bn);
            // The uniqueness check runs under the region lock (the paper
            // runs it before locking: two inserts of one key could both
            // pass). A writer of this key puts it in the filter (or finds a
            // copy in its pair) before it releases the region, and nothing
            // but a rebuild from PM takes
            // a fingerprint out, so here the filter has no false negatives,
            // and a filter miss skips the PM key compare.
            let maybe = f.contains_probe(&p);
            let s = self.scan(head, key, maybe);
            if s.hit.is_some() {
                return Ok(false);
            }
            // The fingerprint goes into the filter before the pair into PM,
            // unless a copy of it is in the key's bucket pair already (a
            // deleted key's, or another key's with the same fingerprint and
            // pair): copies leave only when the filter is rebuilt from PM,
            // which puts every stored key back, so that copy covers this
            // key too, and a key deleted and put back adds nothing. A
            // filter insert is a locked instruction: after the pair's
            // persist it would wait for the line's write-back, before it it
            // waits for nothing (the write-back then overlaps this thread's
            // next operation). No reader reaches the pair early: one that
            // the fingerprint sends to PM walks the chain under this
            // region's version, odd until the pair is durable. A saturated
            // filter answers "maybe" to every key, so there the copy is
            // looked for in the pair itself: a key without one adds one,
            // and its load brings the next rebuild (saturated again while
            // the keys that saturated it are stored: the seed is kept).
            let covered = maybe && (!f.is_saturated() || f.holds_copy(&p));
            if !covered && f.insert(key).is_err() {
                // The filter found no room: grow it and start over.
                self.t.filter_full.fetch_add(1, Ordering::Relaxed);
                if grown {
                    // Still no room after a doubling: the key's bucket
                    // pair is full of other fingerprints and no cuckoo path
                    // frees a lane, nor does the filter's exact stash have
                    // room (a seeded hash makes that an attack needing the
                    // pool, not bad luck).
                    return Err(engine::Error::OutOfSpace(format!(
                        "the DRAM filter has no room for key {key:#x}, even doubled ({} keys in its exact stash)",
                        f.stashed()
                    )));
                }
                let seen = f.id();
                drop(region);
                drop(f);
                drop(gate);
                // Another thread may have rebuilt the filter meanwhile:
                // then this insert tries the new one before giving up.
                grown = self.grow_filter(Some(seen))?;
                continue;
            }
            match s.empty {
                Some(slot) => {
                    let w = self.pool.words(slot.0, 8);
                    let tok = w[W_TOKENS].load(Ordering::Relaxed);
                    w[w_val(slot.1)].store(value, Ordering::Relaxed);
                    w[w_key(slot.1)].store(key, Ordering::Relaxed);
                    w[W_TOKENS].store(tok | token(slot.1), Ordering::Release);
                    // persist: value, key, then token, all in this line: the
                    // line reaches PM whole with its stores in program
                    // order, so a durable token implies a durable pair. One
                    // flush and one fence (the paper's merge-flush).
                    self.pool.persist_line(slot.0);
                }
                None => {
                    // Nothing of the key reaches PM on an error: a copy of
                    // its fingerprint put in above stays, a false positive
                    // until the next rebuild (another key with the same
                    // fingerprint and pair may have found it since and
                    // relied on it).
                    let nb = match self.take_bucket(t) {
                        // A pool with no room for a slab gives back the
                        // table reserved ahead first, outside the gate
                        // (a resize may hold `resize_mx` waiting for it),
                        // and the insert starts over: its fingerprint is
                        // in the filter already, so it covers the key.
                        Err(engine::Error::OutOfSpace(_)) if self.ahead_desc() != 0 => {
                            drop(region);
                            drop(f);
                            drop(gate);
                            self.make_room()?;
                            continue;
                        }
                        r => r?,
                    };
                    let w = self.pool.words(nb, 8);
                    w[w_key(0)].store(key, Ordering::Relaxed);
                    w[w_val(0)].store(value, Ordering::Relaxed);
                    for x in &w[w_key(1)..W_NEXT] {
                        x.store(0, Ordering::Relaxed);
                    }
                    w[W_NEXT].store(0, Ordering::Relaxed);
                    w[W_TOKENS].store(token(0), Ordering::Release);
                    // persist: the new bucket whole before the pointer that
                    // makes it reachable; a crash between leaves a bucket no
                    // chain reaches, which open puts back on the free list.
                    self.pool.persist_line(nb);
                    self.pool.store_u64(s.last + 8 * W_NEXT as u64, nb);
                    // persist: the link, before the insert returns.
                    self.pool.persist_line(s.last);
                    self.t.chain_inserts.fetch_add(1, Ordering::Relaxed);
                }
            }
            drop(region);
            // The sum of the sharded count reads 64 lines: look at it every
            // 64th insert of a thread (and always while the table is small).
            let tick = self.len.bump();
            let filter_full = f.should_grow();
            drop(f);
            drop(gate);
            // A filter rebuild or table growth after the pair is durable
            // is best effort: the insert took, whatever happens here (a
            // failure is counted in stats).
            if filter_full && self.grow_filter(None).is_err() {
                self.t.resize_failures.fetch_add(1, Ordering::Relaxed);
            }
            if tick.is_multiple_of(64) || t.k < 12 {
                let len = self.len.get().max(0) as u64;
                if len as f64 > GROW_AT * t.heads() as f64
                    && len >= self.resize_retry_at.load(Ordering::Relaxed)
                    && self.grow_table().is_err()
                {
                    self.t.resize_failures.fetch_add(1, Ordering::Relaxed);
                } else if len as f64 > PREPARE_AT * t.heads() as f64
                    && t.k >= PREPARE_MIN_K
                    && self.ahead_k.load(Ordering::Relaxed) <= t.k as u64
                {
                    self.prepare_next();
                }
            }
            return Ok(true);
        }
    }

    pub(crate) fn update_key(&self, key: u64, value: u64) -> Result<bool> {
        self.check_open()?;
        let h = self.hash(key);
        let _gate = self.gate.enter();
        let t = self.table();
        let bn = t.bucket_of(h);
        self.pool.prefetch(t.head(bn));
        let f = self.filter.get();
        if !f.contains(key) {
            return Ok(false);
        }
        let _region = self.lock_region(bn);
        let Some((b, i)) = self.scan(t.head(bn), key, true).hit else {
            return Ok(false);
        };
        self.pool.words(b, 8)[w_val(i)].store(value, Ordering::Release);
        // persist: the value word (one 8-byte failure-atomic store) before
        // the region is released and the call returns.
        self.pool.persist_line(b);
        Ok(true)
    }

    pub(crate) fn remove_key(&self, key: u64) -> Result<bool> {
        self.check_open()?;
        let h = self.hash(key);
        let _gate = self.gate.enter();
        let t = self.table();
        let bn = t.bucket_of(h);
        self.pool.prefetch(t.head(bn));
        // In a run of hits (see `get_key`) the key is looked for in PM
        // straight away; otherwise a filter miss answers without touching
        // PM.
        if !hits::in_run() && !self.filter.get().contains(key) {
            hits::record(false);
            return Ok(false);
        }
        let region = self.lock_region(bn);
        let Some((b, i)) = self.scan(t.head(bn), key, true).hit else {
            hits::record(false);
            return Ok(false);
        };
        hits::record(true);
        let w = self.pool.words(b, 8);
        let tok = w[W_TOKENS].load(Ordering::Relaxed);
        w[W_TOKENS].store(tok & !token(i), Ordering::Release);
        // persist: the token (lazy deletion: the pair's bytes stay) before
        // the call returns. The key's fingerprint stays in the filter, a
        // false positive for it (and cover for a re-insert) until the
        // filter is next rebuilt from PM (`grow_filter`): taking it out
        // would be a locked instruction and its bucket lines on every
        // delete (`docs/engines/rophi.md`, "Delete").
        self.pool.persist_line(b);
        drop(region);
        self.len.add(-1);
        Ok(true)
    }
}
