//! `slotarray`: the crash checker's reference structure, and its
//! deliberately broken twin `slotarray-misordered`.
//!
//! A small persistent hash table with linear probing over one block of
//! 32-byte slots. It is simple on purpose: its only job is to show that the
//! crash checker passes a correct persist order and catches a wrong one.
//! It is a real persistent structure all the same (every u64 key, growth by
//! copy-and-switch through the allocator, recovery, `check`).
//!
//! # Layout of the table block (the pool root)
//!
//! ```text
//! 0   magic  u64  "SLOTARR1"
//! 8   cap    u64  number of slots, a power of two
//! 16  count  u64  0, or 1 + the number of valid slots, written by a clean close
//! 64  slots  cap × 32 bytes: meta u64 (0 empty, 1 valid, 2 deleted), key u64, value u64, 0
//! ```
//!
//! # Clean open
//!
//! A pool the pool layer reports cleanly closed, whose count word is not 0,
//! must hold exactly that many valid slots: otherwise it was damaged after
//! its clean close, and the open is refused (reading only) with an error
//! that points at `pmhash check`. A count word of 0 (a table never closed
//! cleanly, or one made before the word existed) is not checked.
//!
//! # Persist orders
//!
//! - insert: key and value, persisted → meta = 1, persisted. A crash in
//!   between leaves an invisible slot. (The misordered twin persists
//!   meta = 1 first: a crash in between shows a valid slot over stale
//!   key/value, pattern 1 of CRASH-PATTERNS.md.)
//! - update: one 8-byte store of the value, persisted: failure-atomic.
//! - remove: meta = 2, persisted.
//! - close: count word, persisted → the pool layer's clean flag.
//! - growth: reserve the new block (link: root = new) → copy and persist it
//!   → begin_free(old, link: root = old) → set_root(new) (the one atomic
//!   switch) → commit(new), finish_free(old). The allocator's link rule
//!   settles a crash anywhere in between: exactly one table survives.
//!
//! `Relaxed` durability is accepted and treated as `Strict`.

use std::sync::{Arc, Mutex};

use pmem::{Link, Pool};

use crate::{CheckReport, Engine, EngineConfig, EngineKind, EngineSpec, Error, Result, Stats};

const MAGIC: u64 = u64::from_le_bytes(*b"SLOTARR1");
const HEADER: u64 = 64;
const SLOT: u64 = 32;
const EMPTY: u64 = 0;
const VALID: u64 = 1;
const DELETED: u64 = 2;
const MIN_CAP: u64 = 8;
/// The table header's count word (see "Clean open").
const COUNT: u64 = 16;

/// Layout id of the slot array's pools.
pub const LAYOUT: &str = "slotarray";

/// The registry entry of the correct slot array (the crash checker's reference).
pub fn spec() -> EngineSpec {
    EngineSpec {
        reference: true,
        name: "slotarray",
        about: "crash checker reference: linear-probing slot array, correct persist order",
        kind: EngineKind::Persistent {
            layout: LAYOUT,
            create: create_correct,
            open: open_correct,
        },
    }
}

/// The registry entry of the slot array that persists in the wrong order (the
/// crash checker must catch it).
pub fn misordered_spec() -> EngineSpec {
    EngineSpec {
        reference: true,
        name: "slotarray-misordered",
        about: "crash checker self-test: slot array that persists the valid bit before the payload (must fail)",
        kind: EngineKind::Persistent { layout: LAYOUT, create: create_misordered, open: open_misordered },
    }
}

fn create_correct(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Box<dyn Engine>> {
    Ok(Box::new(SlotArray::create(pool, cfg, false)?))
}
fn open_correct(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Box<dyn Engine>> {
    Ok(Box::new(SlotArray::open(pool, cfg, false)?))
}
fn create_misordered(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Box<dyn Engine>> {
    Ok(Box::new(SlotArray::create(pool, cfg, true)?))
}
fn open_misordered(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Box<dyn Engine>> {
    Ok(Box::new(SlotArray::open(pool, cfg, true)?))
}

/// A write after `close` is a caller error, as in every engine.
fn refuse_if_closed(inner: &Inner) -> Result<()> {
    if inner.closed {
        return Err(Error::InvalidArgument("the engine was closed".into()));
    }
    Ok(())
}

struct Inner {
    table: u64,
    cap: u64,
    len: u64,
    used: u64, // valid + deleted slots
    /// Set by `close`: every later write is refused.
    closed: bool,
}

/// The slot array. Writers and readers serialise on one mutex: this
/// structure is for checking, not for speed.
pub struct SlotArray {
    pool: Arc<Pool>,
    misordered: bool,
    inner: Mutex<Inner>,
    /// Table doublings and the time spent in them (`Stats::structural_*`).
    structural: crate::StructuralClock,
}

fn hash(key: u64) -> u64 {
    let mut z = key.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn slot_off(table: u64, i: u64) -> u64 {
    table + HEADER + i * SLOT
}

enum Probe {
    Found(u64),
    Absent(Option<u64>),
}

crate::tallies! {
    /// The slot array's figures ([`SlotArray::tallies`]).
    pub struct Tallies {
        /// Slots freed by removes and not yet reused.
        tombstones: u64 => "tombstones",
    }
}

impl SlotArray {
    /// The slot array's figures now.
    pub fn tallies(&self) -> Tallies {
        let inner = self.inner.lock().expect("slotarray lock");
        Tallies {
            tombstones: inner.used - inner.len,
        }
    }

    fn name_for(misordered: bool) -> &'static str {
        if misordered {
            "slotarray-misordered"
        } else {
            "slotarray"
        }
    }

    fn handle(pool: Arc<Pool>, misordered: bool, inner: Inner) -> SlotArray {
        SlotArray {
            pool,
            misordered,
            inner: Mutex::new(inner),
            structural: Default::default(),
        }
    }

    /// Formats a fresh pool with a table for `initial_capacity` keys.
    pub fn create(pool: Arc<Pool>, cfg: &EngineConfig, misordered: bool) -> Result<SlotArray> {
        if pool.root() != 0 {
            return Err(Error::InvalidArgument("pool already holds a table".into()));
        }
        let cap = (cfg.initial_capacity.max(MIN_CAP) * 4 / 3).next_power_of_two();
        let (table, r) = Self::new_table(&pool, cap)?;
        publish_root(&pool, (table, r))?;
        Ok(Self::handle(
            pool,
            misordered,
            Inner {
                table,
                cap,
                len: 0,
                used: 0,
                closed: false,
            },
        ))
    }

    /// Reserves and formats an empty table; returns it uncommitted.
    fn new_table(pool: &Pool, cap: u64) -> Result<(u64, pmem::Reservation)> {
        let bytes = HEADER + cap * SLOT;
        let r = pool.reserve(bytes, Link::RootPointer)?;
        let t = r.offset();
        pool.zero(t, bytes as usize);
        pool.store_u64(t, MAGIC);
        pool.store_u64(t + 8, cap);
        Ok((t, r))
    }

    /// Opens and validates the table of an existing pool.
    pub fn open(pool: Arc<Pool>, _cfg: &EngineConfig, misordered: bool) -> Result<SlotArray> {
        let table = pool.root();
        if table == 0 {
            return Err(Error::Corrupt(
                "pool has no slot-array table (root is 0)".into(),
            ));
        }
        let size = pool.block_size(table)?;
        if pool.load_u64(table) != MAGIC {
            return Err(Error::Corrupt(format!(
                "table at {table:#x} has no slot-array magic"
            )));
        }
        let cap = pool.load_u64(table + 8);
        if !cap.is_power_of_two() || HEADER + cap.saturating_mul(SLOT) > size {
            return Err(Error::Corrupt(format!(
                "table capacity {cap} does not fit its {size}-byte block"
            )));
        }
        let (mut len, mut used) = (0, 0);
        for i in 0..cap {
            match pool.load_u64(slot_off(table, i)) {
                EMPTY => {}
                VALID => {
                    len += 1;
                    used += 1
                }
                DELETED => used += 1,
                m => return Err(Error::Corrupt(format!("slot {i} has meta {m}"))),
            }
        }
        let recorded = pool.load_u64(table + COUNT);
        if pool.was_clean() && recorded != 0 && recorded - 1 != len {
            return Err(Error::Corrupt(format!(
                "clean pool records {} keys, its table holds {len}: {}",
                recorded - 1,
                crate::damaged_after_close(&pool)
            )));
        }
        Ok(Self::handle(
            pool,
            misordered,
            Inner {
                table,
                cap,
                len,
                used,
                closed: false,
            },
        ))
    }

    fn probe(&self, inner: &Inner, key: u64) -> Probe {
        let mask = inner.cap - 1;
        let mut i = hash(key) & mask;
        let mut reuse = None;
        for _ in 0..inner.cap {
            let s = slot_off(inner.table, i);
            match self.pool.load_u64(s) {
                EMPTY => return Probe::Absent(reuse.or(Some(s))),
                VALID if self.pool.load_u64(s + 8) == key => return Probe::Found(s),
                DELETED if reuse.is_none() => reuse = Some(s),
                _ => {}
            }
            i = (i + 1) & mask;
        }
        Probe::Absent(reuse)
    }

    fn grow(&self, inner: &mut Inner) -> Result<()> {
        let pool = &*self.pool;
        let cap = inner.cap * 2;
        let (new, r) = Self::new_table(pool, cap)?;
        let mask = cap - 1;
        for i in 0..inner.cap {
            let s = slot_off(inner.table, i);
            if pool.load_u64(s) != VALID {
                continue;
            }
            let (k, v) = (pool.load_u64(s + 8), pool.load_u64(s + 16));
            let mut j = hash(k) & mask;
            while pool.load_u64(slot_off(new, j)) != EMPTY {
                j = (j + 1) & mask;
            }
            let d = slot_off(new, j);
            pool.store_u64(d + 8, k);
            pool.store_u64(d + 16, v);
            pool.store_u64(d, VALID);
        }
        // persist: the whole new table before the root switch, because the
        // switch makes it the only table.
        pool.flush(new, (HEADER + cap * SLOT) as usize);
        pool.fence();
        let old = inner.table;
        // persist: the free lane for the old table before the switch that
        // unlinks it (inside begin_free); the switch is one header-slot write.
        let ticket = match pool.begin_free(old, Link::RootPointer) {
            Ok(t) => t,
            Err(e) => {
                pool.cancel(r);
                return Err(e.into());
            }
        };
        pool.set_root(new)?;
        pool.commit(r);
        pool.finish_free(ticket);
        inner.table = new;
        inner.cap = cap;
        inner.used = inner.len;
        Ok(())
    }
}

/// Makes a fresh, empty table the root.
fn publish_root(pool: &Pool, (t, r): (u64, pmem::Reservation)) -> Result<()> {
    // persist: the table's header and zeroed slots before the root names it.
    pool.flush(t, (HEADER + pool.load_u64(t + 8) * SLOT) as usize);
    pool.fence();
    if let Err(e) = pool.set_root(t) {
        pool.cancel(r);
        return Err(e.into());
    }
    pool.commit(r);
    Ok(())
}

impl Engine for SlotArray {
    fn name(&self) -> &str {
        Self::name_for(self.misordered)
    }

    fn insert(&self, key: u64, value: u64) -> Result<bool> {
        let mut inner = self.inner.lock().expect("slotarray lock");
        refuse_if_closed(&inner)?;
        if let Probe::Found(_) = self.probe(&inner, key) {
            return Ok(false);
        }
        if (inner.used + 1) * 4 > inner.cap * 3 {
            let start = std::time::Instant::now();
            self.grow(&mut inner)?;
            self.structural.record(start);
        }
        let Probe::Absent(Some(s)) = self.probe(&inner, key) else {
            return Err(Error::Corrupt("no free slot after growth".into()));
        };
        let pool = &*self.pool;
        let was_empty = pool.load_u64(s) == EMPTY;
        if self.misordered {
            // Deliberately wrong: publish before persist.
            pool.store_u64(s, VALID);
            pool.persist(s, 8);
            pool.store_u64(s + 8, key);
            pool.store_u64(s + 16, value);
            pool.persist(s + 8, 16);
        } else {
            // persist: key and value before the valid meta, because a valid
            // meta over stale key/value would invent an entry.
            pool.store_u64(s + 8, key);
            pool.store_u64(s + 16, value);
            pool.persist(s + 8, 16);
            pool.store_u64(s, VALID);
            pool.persist(s, 8);
        }
        inner.len += 1;
        if was_empty {
            inner.used += 1;
        }
        Ok(true)
    }

    fn get(&self, key: u64) -> Option<u64> {
        let inner = self.inner.lock().expect("slotarray lock");
        match self.probe(&inner, key) {
            Probe::Found(s) => Some(self.pool.load_u64(s + 16)),
            Probe::Absent(_) => None,
        }
    }

    fn update(&self, key: u64, value: u64) -> Result<bool> {
        let inner = self.inner.lock().expect("slotarray lock");
        refuse_if_closed(&inner)?;
        let Probe::Found(s) = self.probe(&inner, key) else {
            return Ok(false);
        };
        // persist: a single 8-byte store is failure-atomic.
        self.pool.store_u64(s + 16, value);
        self.pool.persist(s + 16, 8);
        Ok(true)
    }

    fn remove(&self, key: u64) -> Result<bool> {
        let mut inner = self.inner.lock().expect("slotarray lock");
        refuse_if_closed(&inner)?;
        let Probe::Found(s) = self.probe(&inner, key) else {
            return Ok(false);
        };
        // persist: one 8-byte meta store turns the slot into a tombstone.
        self.pool.store_u64(s, DELETED);
        self.pool.persist(s, 8);
        inner.len -= 1;
        Ok(true)
    }

    fn len(&self) -> u64 {
        self.inner.lock().expect("slotarray lock").len
    }

    fn stats(&self) -> Stats {
        let inner = self.inner.lock().expect("slotarray lock");
        Stats {
            len: inner.len,
            capacity: inner.cap,
            load_factor: inner.len as f64 / inner.cap as f64,
            pm_bytes: HEADER + inner.cap * SLOT,
            dram_bytes: std::mem::size_of::<Self>() as u64,
            structural_changes: self.structural.changes(),
            structural_nanos: self.structural.nanos(),
            detail: Tallies {
                tombstones: inner.used - inner.len,
            }
            .detail(),
        }
    }

    fn for_each(&self, f: &mut dyn FnMut(u64, u64)) {
        let inner = self.inner.lock().expect("slotarray lock");
        for i in 0..inner.cap {
            let s = slot_off(inner.table, i);
            if self.pool.load_u64(s) == VALID {
                f(self.pool.load_u64(s + 8), self.pool.load_u64(s + 16));
            }
        }
    }

    fn check(&self) -> Result<CheckReport> {
        let inner = self.inner.lock().expect("slotarray lock");
        let mut seen = std::collections::HashSet::new();
        let mut keys = 0;
        for i in 0..inner.cap {
            let s = slot_off(inner.table, i);
            match self.pool.load_u64(s) {
                VALID => {
                    let k = self.pool.load_u64(s + 8);
                    if !seen.insert(k) {
                        return Err(Error::Corrupt(format!("key {k} is stored twice")));
                    }
                    if !matches!(self.probe(&inner, k), Probe::Found(p) if p == s) {
                        return Err(Error::Corrupt(format!(
                            "key {k} in slot {i} is not reachable by probing"
                        )));
                    }
                    keys += 1;
                }
                EMPTY | DELETED => {}
                m => return Err(Error::Corrupt(format!("slot {i} has meta {m}"))),
            }
        }
        if keys != inner.len {
            return Err(Error::Corrupt(format!(
                "walk found {keys} keys, counter says {}",
                inner.len
            )));
        }
        Ok(CheckReport {
            keys,
            reachable_bytes: self.pool.block_size(inner.table)?,
        })
    }

    fn close(&self) -> Result<()> {
        let mut inner = self.inner.lock().expect("slotarray lock");
        inner.closed = true;
        let at = inner.table + COUNT;
        if !self.pool.is_read_only() && self.pool.load_u64(at) != inner.len + 1 {
            self.pool.store_u64(at, inner.len + 1);
            // persist: the count before the clean flag (set by the pool's
            // close) that makes the open trust it.
            self.pool.persist(at, 8);
        }
        self.pool.close().map_err(Error::from)
    }
}
