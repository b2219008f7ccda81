//! Growth: new tables and overflow slabs, doubling of the head array, and
//! rebuilds of the filter (doubled, or at the same size to drop deleted
//! keys' fingerprints).
//!
//! The paper's table never grows; ours doubles its head array when the
//! table holds more than [`GROW_AT`] keys per head. Keys hash to the top
//! `k` bits, so head `h` of the old table splits into heads `2h` and
//! `2h + 1` of the new one: the rehash is one sequential sweep.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use engine::cuckoo::{CuckooFilter, MAX_LOAD};
use engine::{Error, Result};
use pmem::{Link, Pool};

use crate::layout::*;
use crate::Rophi;

/// Old heads per rehash thread, at least: a doubling of `h` old heads uses
/// `h / 512` threads, at most the available ones (a thread costs more than
/// a smaller sweep).
const REHASH_HEADS_PER_THREAD: u64 = 512;

/// Reserves, zeroes and names a table block of 2^k heads: `owner` (a root
/// word) ends up holding its descriptor.
///
/// `durable_body`: zero and persist the heads before `owner` names the
/// table (create). A resize passes false: only the header line is written
/// here; the rehash threads zero the heads (the table it names in `next`
/// is given back after a crash, and its heads are flushed before the
/// commit).
pub(crate) fn new_table(
    pool: &Pool,
    root: u64,
    k: u32,
    owner: u64,
    durable_body: bool,
) -> Result<Table> {
    let bytes = T_HEADS + (BUCKET << k);
    let r = pool.reserve(
        bytes,
        Link::Tagged {
            owner,
            tag: k as u64,
        },
    )?;
    let off = r.offset();
    if !off.is_multiple_of(LINE) {
        pool.cancel(r);
        return Err(Error::Corrupt(format!(
            "allocator gave an unaligned table block {off:#x}"
        )));
    }
    pool.zero(off, if durable_body { bytes } else { T_HEADS } as usize);
    pool.store_u64(off, TABLE_MAGIC);
    pool.store_u64(off + T_K, k as u64);
    pool.store_u64(off + T_ROOT, root);
    // persist: the table (its header, and the zeroed heads when asked)
    // before the root word names it; the allocator frees it if the crash
    // comes before that store.
    if durable_body {
        pool.persist(off, bytes as usize);
    } else {
        pool.persist_line(off);
    }
    let t = Table { off, k };
    pool.store_u64(owner, t.desc());
    // persist: the naming store before the reservation is committed.
    pool.persist(owner, 8);
    pool.commit(r);
    Ok(t)
}

/// Adds an overflow slab of `n` buckets to table `t`'s slab list.
pub(crate) fn add_slab(pool: &Pool, t: Table, n: u64) -> Result<u64> {
    let bytes = S_BUCKETS + n * BUCKET;
    let owner = t.off + T_SLABS;
    let r = pool.reserve(bytes, Link::Pointer { owner })?;
    let off = r.offset();
    if !off.is_multiple_of(LINE) {
        pool.cancel(r);
        return Err(Error::Corrupt(format!(
            "allocator gave an unaligned slab {off:#x}"
        )));
    }
    pool.zero(off, bytes as usize);
    pool.store_u64(off, SLAB_MAGIC);
    pool.store_u64(off + S_NEXT, pool.load_u64(owner));
    pool.store_u64(off + S_COUNT, n);
    // persist: the slab (header and zeroed buckets) before the table's slab
    // word names it.
    pool.persist(off, bytes as usize);
    pool.store_u64(owner, off);
    // persist: the slab word before the reservation is committed.
    pool.persist(owner, 8);
    pool.commit(r);
    Ok(off)
}

/// The slabs of table `t`: (offset, bucket count), newest first.
pub(crate) fn slabs(pool: &Pool, t: Table) -> Vec<(u64, u64)> {
    let mut v = Vec::new();
    let mut s = pool.load_u64(t.off + T_SLABS);
    while s != 0 {
        v.push((s, pool.load_u64(s + S_COUNT)));
        s = pool.load_u64(s + S_NEXT);
    }
    v
}

/// Gives back table `t` and its slabs. `owner` is the root word naming it
/// (`next` or `old`). Each free is decided by one persisted store, and the
/// words are cleared only after the blocks they name are given back, so a
/// crash in here is finished by recovery. Nothing may allocate from the
/// pool while a table named by `old` still has slabs (the resize holds
/// the writers' gate closed until this returns; recovery runs it before
/// the table opens), so a slab given back is never found reused.
pub(crate) fn free_table(pool: &Pool, t: Table, owner: u64) -> Result<()> {
    let sw = t.off + T_SLABS;
    loop {
        let s = pool.load_u64(sw);
        if s == 0 {
            break;
        }
        let next = pool.load_u64(s + S_NEXT);
        let ticket = pool.begin_free(s, Link::Pointer { owner: sw })?;
        pool.store_u64(sw, next);
        // persist: the slab word moves past the slab before it is free.
        pool.persist(sw, 8);
        pool.finish_free(ticket);
    }
    let ticket = pool.begin_free(
        t.off,
        Link::Tagged {
            owner,
            tag: t.k as u64,
        },
    )?;
    pool.store_u64(owner, 0);
    // persist: the root word cleared before the table block is free.
    pool.persist(owner, 8);
    pool.finish_free(ticket);
    Ok(())
}

/// Free chain buckets of a table being built, for one rehash thread.
struct Spare<'a> {
    /// Slab buckets taken by this thread and not used yet.
    free: Vec<u64>,
    /// Buckets of the slabs this thread added.
    added: u64,
    /// Serialises slab adds (they rewrite the table's slab word).
    slab_mx: &'a Mutex<()>,
}

/// What one rehash thread leaves: its unused slab buckets, the buckets of
/// the slabs it added, and its persist counts.
struct Rehashed {
    free: Vec<u64>,
    added: u64,
    spent: pmem::persist::Counters,
}

/// The next doubling's table, reserved ahead of it and named in the root's
/// `next` word (a crash gives it back, as it gives back a cut resize's),
/// with the thread that faults its pages in.
pub(crate) struct Ahead {
    table: Table,
    stop: Arc<AtomicBool>,
    worker: Option<JoinHandle<()>>,
}

impl Ahead {
    /// Stops the thread faulting the table's pages in (the pages it did
    /// not reach are faulted in by whoever writes them) and waits for it:
    /// nothing may write the table while it reads it. The thread only
    /// reads, so a panic of its own has changed nothing and is dropped
    /// here (re-raising it from `drop` while unwinding would abort).
    fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

impl Drop for Ahead {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Bytes faulted in between two looks at the stop flag; the steps end on
/// its multiples, so on page boundaries (`Pool::prefault` faults the whole
/// pages inside a range).
const FAULT_STEP: u64 = 2 << 20;

impl Rophi {
    /// Reserves the table of the next doubling once the table holds more
    /// than [`PREPARE_AT`] keys per head and, for several writers
    /// (`fault_ahead`), starts a thread that faults its heads' pages in:
    /// the first touch of the fresh pages (on tmpfs, a page allocated and
    /// cleared each) then runs beside the inserts, not inside the
    /// doubling, which stops every writer. Best effort, tried once per
    /// table size: a reservation or a thread that fails is counted
    /// (`ahead failures`) and leaves the doubling to reserve or fault in
    /// its table itself.
    pub(crate) fn prepare_next(&self) {
        let Ok(_m) = self.resize_mx.try_lock() else {
            return;
        };
        // The table may have doubled since the caller looked at it.
        let old = self.table();
        if self.ahead_k.load(Ordering::Relaxed) > old.k as u64
            || old.k >= MAX_K
            || self.closed.load(Ordering::Acquire)
            || self.len.get() as f64 <= PREPARE_AT * old.heads() as f64
        {
            return;
        }
        self.ahead_k.store(old.k as u64 + 1, Ordering::Relaxed);
        let start = Instant::now();
        let pool = &self.pool;
        // persist: `new_table` names the block in `next` and persists that
        // before it commits the reservation; from then on a crash gives the
        // table back at open (`recover::resolve`), a clean close gives it
        // back (`give_back_ahead`), and the doubling takes it over.
        let Ok(table) = new_table(pool, self.root, old.k + 1, self.root + R_NEXT, false) else {
            self.t.ahead_failures.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let stop = Arc::new(AtomicBool::new(false));
        let worker = self
            .fault_ahead
            .then(|| {
                let (pool, stop) = (self.pool.clone(), stop.clone());
                let faulted = self.t.prefaulted.clone();
                let (mut at, end) = (table.head(0), table.head(0) + table.bytes() - T_HEADS);
                std::thread::Builder::new()
                    .name("pmhash-rophi-ahead".into())
                    .spawn(move || {
                        while at < end && !stop.load(Ordering::Relaxed) {
                            let n = (FAULT_STEP - at % FAULT_STEP).min(end - at);
                            faulted.fetch_add(pool.prefault(at, n), Ordering::Relaxed);
                            at += n;
                        }
                    })
                    .ok()
            })
            .flatten();
        if self.fault_ahead && worker.is_none() {
            self.t.ahead_failures.fetch_add(1, Ordering::Relaxed);
        }
        self.t.prepared.fetch_add(1, Ordering::Relaxed);
        self.t.structural.record(start);
        *self.ahead.lock().unwrap_or_else(|e| e.into_inner()) = Some(Ahead {
            table,
            stop,
            worker,
        });
    }

    /// The table reserved ahead for 2^`k` heads, its thread stopped, if
    /// there is one; a table reserved for another size is given back.
    /// Called under `resize_mx`.
    fn take_ahead(&self, k: u32) -> Result<Option<Table>> {
        let Some(mut a) = self.ahead.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return Ok(None);
        };
        a.stop();
        if a.table.k == k {
            self.t.ahead_taken.fetch_add(1, Ordering::Relaxed);
            return Ok(Some(a.table));
        }
        // persist: `free_table` clears and persists `next` before the
        // block is free, so a crash leaves it named (given back at open)
        // or free, never both; a failure leaves it named and reserved.
        if let Err(e) = free_table(&self.pool, a.table, self.root + R_NEXT) {
            *self.ahead.lock().unwrap_or_else(|e| e.into_inner()) = Some(a);
            return Err(e);
        }
        Ok(None)
    }

    /// Gives back the table reserved ahead, if any, to make room in a pool
    /// that had none for what an insert needs now (a slab). The caller is
    /// outside the writers' gate: `resize_mx` may be held by a resize that
    /// waits for the gate to empty.
    pub(crate) fn make_room(&self) -> Result<()> {
        let _m = self.resize_mx.lock().unwrap_or_else(|e| e.into_inner());
        if self.ahead_desc() != 0 {
            self.give_back_ahead()?;
            self.t.ahead_given_back.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Gives back the table reserved ahead, if any (a clean close leaves
    /// no table in `next`). Called under `resize_mx`.
    pub(crate) fn give_back_ahead(&self) -> Result<()> {
        self.take_ahead(u32::MAX).map(|_| ())
    }

    /// The descriptor of the table reserved ahead, or 0.
    pub(crate) fn ahead_desc(&self) -> u64 {
        self.ahead
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or(0, |a| a.table.desc())
    }

    /// A free bucket of the live table's overflow slabs; adds a slab when
    /// none is left.
    pub(crate) fn take_bucket(&self, t: Table) -> Result<u64> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = free.pop() {
            return Ok(b);
        }
        let n = slab_buckets(t.heads());
        let s = add_slab(&self.pool, t, n)?;
        self.t.slabs_added.fetch_add(1, Ordering::Relaxed);
        self.slab_total.fetch_add(n, Ordering::Relaxed);
        free.extend((0..n).rev().map(|i| s + S_BUCKETS + i * BUCKET));
        Ok(free.pop().expect("a new slab has buckets"))
    }

    /// The filter rebuilt from table `t` with every available thread,
    /// starting at `buckets` buckets.
    pub(crate) fn build_filter(&self, t: Table, buckets: usize, seed: u64) -> CuckooFilter {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let heads = t.heads();
        let pool = &*self.pool;
        let start = Instant::now();
        let f = engine::cuckoo::build_with_buckets(buckets, seed, threads, &|i, sink| {
            let lo = heads * i as u64 / threads as u64;
            let hi = heads * (i as u64 + 1) / threads as u64;
            for h in lo..hi {
                let mut b = t.head(h);
                while b != 0 {
                    let w = pool.words(b, 8);
                    let tok = w[W_TOKENS].load(Ordering::Relaxed);
                    for s in 0..SLOTS {
                        if tok & token(s) != 0 {
                            sink(w[w_key(s)].load(Ordering::Relaxed));
                        }
                    }
                    b = w[W_NEXT].load(Ordering::Relaxed);
                }
            }
        });
        self.t
            .filter_build_us
            .store(start.elapsed().as_micros() as u64, Ordering::Relaxed);
        self.t
            .filter_build_threads
            .store(threads as u64, Ordering::Relaxed);
        f
    }

    /// Rebuilds the filter from PM if it is still the one `seen` names
    /// (its `CuckooFilter::id`: a failed insert saw its key's pair full,
    /// and it is doubled) or over its load. Over its load, it is rebuilt
    /// at the same size while the stored keys would fill at most half its
    /// load limit (the rest of its load is deleted keys' fingerprints,
    /// which the rebuild drops) and it has a slot per head bucket, and
    /// doubled otherwise, to a slot per head bucket at least (one walk,
    /// where a filter sized for the keys of an emptied table would take
    /// one per doubling). So at least 45% of its slots in inserts, 0.45 a
    /// head bucket or more, separate two rebuilds: a rebuild's walk of the
    /// table (every head, which deletes never shrink) is paid for by them.
    /// Returns whether it rebuilt.
    pub(crate) fn grow_filter(&self, seen: Option<u64>) -> Result<bool> {
        let start = Instant::now();
        let _m = self.resize_mx.lock().unwrap_or_else(|e| e.into_inner());
        let _closed = self.gate.close();
        // The table is still: resizes hold `resize_mx`.
        let t = self.table();
        let (nb, seed, double) = {
            let f = self.filter.get();
            let due = match seen {
                Some(id) => f.id() == id,
                None => f.needs_growth(),
            };
            if !due {
                return Ok(false);
            }
            // Exact: every writer is held out.
            let stored = self.len.get().max(0) as f64;
            let double = seen.is_some()
                || stored > MAX_LOAD / 2.0 * f.slots() as f64
                || f.slots() < t.heads();
            let nb = if double {
                let at_least = t.heads().div_ceil(engine::cuckoo::SLOTS);
                (f.buckets() * 2).max(usize::try_from(at_least).unwrap_or(usize::MAX))
            } else {
                f.buckets()
            };
            (nb, f.seed(), double)
        };
        let nf = self.build_filter(t, nb, seed);
        self.filter.replace(nf);
        if double {
            self.t.filter_growths.fetch_add(1, Ordering::Relaxed);
        } else {
            self.t.filter_refreshes.fetch_add(1, Ordering::Relaxed);
        }
        self.t.structural.record(start);
        Ok(true)
    }

    /// Doubles the head array if the table is over [`GROW_AT`]. A pool
    /// too full for the new table leaves the old one working (longer
    /// chains) and is counted in the stats.
    pub(crate) fn grow_table(&self) -> Result<()> {
        let Ok(_m) = self.resize_mx.try_lock() else {
            // Another growth (or a for_each) runs; a later insert retries.
            return Ok(());
        };
        let _closed = self.gate.close();
        let old = self.table();
        if self.len.get() as f64 <= GROW_AT * old.heads() as f64 || old.k >= MAX_K {
            return Ok(());
        }
        let start = Instant::now();
        let pool = &*self.pool;
        let reserved = match self.take_ahead(old.k + 1)? {
            Some(t) => Ok(t),
            None => new_table(pool, self.root, old.k + 1, self.root + R_NEXT, false),
        };
        let new = match reserved {
            Ok(t) => t,
            Err(Error::OutOfSpace(_)) => {
                self.resize_failed();
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        // The sweep is split by old head ranges over the available threads:
        // old heads [lo, hi) fill new heads [2lo, 2hi), disjoint for each
        // thread, so they share nothing but the slab list (`slab_mx`).
        let threads = (old.heads() / REHASH_HEADS_PER_THREAD).clamp(
            1,
            std::thread::available_parallelism().map_or(1, |n| n.get()) as u64,
        );
        let slab_mx = Mutex::new(());
        let parts: Vec<Result<Rehashed>> = if threads == 1 {
            vec![self.rehash_range(old, new, 0, 1, &slab_mx)]
        } else {
            std::thread::scope(|sc| {
                let workers: Vec<_> = (0..threads)
                    .map(|i| {
                        let slab_mx = &slab_mx;
                        sc.spawn(move || self.rehash_range(old, new, i, threads, slab_mx))
                    })
                    .collect();
                workers
                    .into_iter()
                    .map(|w| {
                        let part = w.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
                        // The helpers' flushes and fences are this insert's.
                        if let Ok(r) = &part {
                            pmem::persist::add_counters(&r.spent);
                        }
                        part
                    })
                    .collect()
            })
        };
        let mut free = Vec::new();
        let mut slab_total = 0;
        let mut failed = None;
        for part in parts {
            match part {
                Ok(r) => {
                    free.extend(r.free);
                    slab_total += r.added;
                }
                Err(e) => failed = Some(e),
            }
        }
        if let Some(e) = failed {
            free_table(pool, new, self.root + R_NEXT)?;
            return match e {
                Error::OutOfSpace(_) => {
                    self.resize_failed();
                    Ok(())
                }
                e => Err(e),
            };
        }
        for (s, n) in slabs(pool, new) {
            pool.flush(s, (S_BUCKETS + n * BUCKET) as usize);
        }
        // persist: every line of the new table (flushed and fenced by the
        // thread that wrote it, before it finished) and of its slabs,
        // before the commit below.
        pool.fence();
        let r = self.root;
        pool.store_u64(r + R_OLD, old.desc());
        pool.store_u64(r + R_TABLE, new.desc());
        pool.store_u64(r + R_NEXT, 0);
        // persist: the commit. The three words share the root's line and
        // reach PM as a prefix of these stores, in this order; recovery
        // reads every prefix right (recover::resolve).
        pool.persist_line(r);
        self.desc.store(new.desc(), Ordering::Release);
        *self.free.lock().unwrap_or_else(|e| e.into_inner()) = free;
        self.slab_total.store(slab_total, Ordering::Relaxed);
        // Readers still walking the old table see `desc` changed and retry.
        free_table(pool, old, r + R_OLD)?;
        self.t.resizes.fetch_add(1, Ordering::Relaxed);
        self.t
            .resize_us
            .fetch_add(start.elapsed().as_micros() as u64, Ordering::Relaxed);
        self.t.structural.record(start);
        Ok(())
    }

    /// Rehash thread `i` of `n`: moves the pairs of old heads
    /// `[lo, hi)` (the `i`-th of `n` equal ranges) into new heads
    /// `[2lo, 2hi)`, zeroed here first; returns the slab buckets it took
    /// and left free, the slab buckets it added, and the persists it made.
    fn rehash_range(
        &self,
        old: Table,
        new: Table,
        i: u64,
        n: u64,
        slab_mx: &Mutex<()>,
    ) -> Result<Rehashed> {
        let before = pmem::persist::counters();
        let pool = &*self.pool;
        let lo = old.heads() * i / n;
        let hi = old.heads() * (i + 1) / n;
        let (first, bytes) = (new.head(2 * lo), (2 * (hi - lo) * BUCKET) as usize);
        pool.zero(first, bytes);
        let mut spare = Spare {
            free: Vec::new(),
            added: 0,
            slab_mx,
        };
        for h in lo..hi {
            let mut b = old.head(h);
            while b != 0 {
                let w = pool.words(b, 8);
                let tok = w[W_TOKENS].load(Ordering::Relaxed);
                for s in 0..SLOTS {
                    if tok & token(s) != 0 {
                        let key = w[w_key(s)].load(Ordering::Relaxed);
                        let value = w[w_val(s)].load(Ordering::Relaxed);
                        let nh = new.head(new.bucket_of(self.hash(key)));
                        self.place(new, nh, key, value, &mut spare)?;
                    }
                }
                b = w[W_NEXT].load(Ordering::Relaxed);
            }
        }
        pool.flush(first, bytes);
        // persist: this thread's heads flushed and fenced before it
        // reports done; the committing thread joins it, then fences the
        // slabs, then commits.
        pool.fence();
        Ok(Rehashed {
            free: spare.free,
            added: spare.added,
            spent: pmem::persist::counters().since(&before),
        })
    }

    /// A resize found no room: count it, and wait for 1/8 more keys
    /// before the next try.
    fn resize_failed(&self) {
        self.t.resize_failures.fetch_add(1, Ordering::Relaxed);
        let len = self.len.get().max(0) as u64;
        self.resize_retry_at
            .store(len + len / 8 + 64, Ordering::Relaxed);
    }

    /// Puts a pair in the chain of `head` of a table being built (no
    /// reader sees it, nothing is flushed here).
    fn place(
        &self,
        t: Table,
        head: u64,
        key: u64,
        value: u64,
        spare: &mut Spare<'_>,
    ) -> Result<()> {
        let s = self.scan(head, key, false);
        let (b, i) = match s.empty {
            Some(slot) => slot,
            None => {
                if spare.free.is_empty() {
                    let n = slab_buckets(t.heads());
                    // The rehash threads share the table's slab word.
                    let sl = {
                        let _one = spare.slab_mx.lock().unwrap_or_else(|e| e.into_inner());
                        add_slab(&self.pool, t, n)?
                    };
                    spare.added += n;
                    spare
                        .free
                        .extend((0..n).rev().map(|i| sl + S_BUCKETS + i * BUCKET));
                }
                let nb = spare.free.pop().expect("refilled above");
                self.pool.store_u64(s.last + 8 * W_NEXT as u64, nb);
                (nb, 0)
            }
        };
        let w = self.pool.words(b, 8);
        w[w_key(i)].store(key, Ordering::Relaxed);
        w[w_val(i)].store(value, Ordering::Relaxed);
        let tok = w[W_TOKENS].load(Ordering::Relaxed);
        w[W_TOKENS].store(tok | token(i), Ordering::Relaxed);
        Ok(())
    }
}
