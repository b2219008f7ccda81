//! The persistent point index (index options (b) and (c)): one of our hash
//! engines, in the same pool as the log, maps `key_hash(key)` to the
//! `v_addr` of the key's newest entry. The store then opens in the time the
//! engine takes (no log scan, no image).
//!
//! - **Verified reads.** A get reads the entry the engine names and
//!   compares its key with the one asked for.
//! - **Collisions.** Keys whose 64-bit hashes are equal share one engine
//!   slot. When that happens the slot names an *overflow entry* (OVF) in the
//!   log instead, tagged with [`OVF_TAG`]: an entry with an empty key,
//!   `h_addr` = the slot, `h_seq` = [`OVF_MARK`], and as value the list of
//!   `(key, v_addr)` of every key in the slot. A change to such a slot
//!   appends a new OVF entry and repoints the slot (one engine update).
//!   All keys of a slot share a stripe lock (stripes are picked by the
//!   hash), so slot changes are serialised.
//! - **Commit point.** The engine update is the commit: a log entry the
//!   engine does not name (an *orphan*, left by a crash between the append
//!   and the engine update) is never returned and GC treats it as dead.

use engine::{Engine, Error, Result};
use pmem::Pool;

use crate::layout::*;

/// Tag bit of an engine value that names an OVF entry.
pub(crate) const OVF_TAG: u64 = 1 << 63;
/// `h_seq` of an OVF entry (real file numbers stay far below it).
pub(crate) const OVF_MARK: u64 = u64::MAX;

pub(crate) struct PIndex {
    pub engine: Box<dyn Engine>,
    pool: std::sync::Arc<Pool>,
}

/// Where a key stands in its slot.
enum Slot {
    Empty,
    /// The slot names one entry: its key and `v_addr`.
    One(Vec<u8>, u64),
    /// The slot names an OVF entry listing these pairs.
    Many(Vec<(Vec<u8>, u64)>),
}

impl PIndex {
    pub(crate) fn new(engine: Box<dyn Engine>, pool: std::sync::Arc<Pool>) -> PIndex {
        PIndex { engine, pool }
    }

    /// Where the entry `va` names lies: its offset and its key and value
    /// lengths, after checking that the whole entry is inside the pool and
    /// starts on an entry boundary. `Err` says what is wrong: the index
    /// names entries by offsets read from PM, which a corrupt pool can set
    /// to anything.
    #[inline]
    fn entry_at(&self, va: u64) -> std::result::Result<(u64, usize, usize), &'static str> {
        let off = vaddr_off(va);
        if !off.is_multiple_of(ENTRY_ALIGN) {
            return Err("not on an entry boundary");
        }
        if self.pool.check_range(off, ENTRY_HEADER).is_err() {
            return Err("outside the pool");
        }
        let (klen, vlen) =
            parse_lens(self.pool.load_u64(off + 8)).ok_or("an entry with bad lengths")?;
        if self
            .pool
            .check_range(off + ENTRY_HEADER, (klen + vlen) as u64)
            .is_err()
        {
            return Err("an entry that runs past the end of the pool");
        }
        Ok((off, klen, vlen))
    }

    /// The key of the entry `va` names.
    fn key_at(&self, va: u64) -> std::result::Result<Vec<u8>, &'static str> {
        let (off, klen, _) = self.entry_at(va)?;
        let mut k = vec![0u8; klen];
        self.pool.read(off + ENTRY_HEADER, &mut k);
        Ok(k)
    }

    /// Whether `va` names a well-formed entry of `key`.
    #[inline]
    fn key_is(&self, va: u64, key: &[u8]) -> bool {
        self.names_key(va, key).unwrap_or(false)
    }

    /// Whether `va`, read from slot `h`, names an entry of `key`; `Err`
    /// when it names no well-formed entry (bits no write produces: see
    /// [`entry_at`](Self::entry_at)).
    #[inline]
    fn names_key(&self, va: u64, key: &[u8]) -> std::result::Result<bool, &'static str> {
        let (off, klen, _) = self.entry_at(va)?;
        if klen != key.len() {
            return Ok(false);
        }
        let mut k = [0u8; 64];
        if klen <= 64 {
            self.pool.read(off + ENTRY_HEADER, &mut k[..klen]);
            Ok(&k[..klen] == key)
        } else {
            Ok(self.key_at(va)? == key)
        }
    }

    /// The pairs the OVF entry `va` (tag bit set or not) lists, after
    /// checking that it is a well-formed entry with an empty key.
    fn ovf_pairs_checked(&self, va: u64) -> std::result::Result<Vec<(Vec<u8>, u64)>, &'static str> {
        let (off, klen, vlen) = self.entry_at(va & !OVF_TAG)?;
        if klen != 0 {
            return Err("an entry with a key where an overflow entry belongs");
        }
        let mut v = vec![0u8; vlen];
        self.pool.read(off + ENTRY_HEADER, &mut v);
        Ok(decode_pairs(&v))
    }

    /// The pairs an OVF entry lists; none if `va` names no well-formed
    /// overflow entry (`check` reports that case).
    pub(crate) fn ovf_pairs(&self, va: u64) -> Vec<(Vec<u8>, u64)> {
        self.ovf_pairs_checked(va).unwrap_or_default()
    }

    /// What slot `h` holds. `Err(Corrupt)` when it names something that is
    /// not a well-formed entry (or an overflow entry lists one): a write to
    /// such a slot would build on garbage.
    fn slot(&self, h: u64) -> Result<Slot> {
        let bad = |va: u64, what: &str| {
            Error::Corrupt(format!(
                "hash index slot {h:#x} names {va:#x}, {what}; run `pmhash check` on the pool"
            ))
        };
        Ok(match self.engine.get(h) {
            None => Slot::Empty,
            Some(v) if v & OVF_TAG != 0 => {
                let pairs = self.ovf_pairs_checked(v).map_err(|w| bad(v, w))?;
                for (_, va) in &pairs {
                    self.entry_at(*va).map_err(|w| bad(*va, w))?;
                }
                Slot::Many(pairs)
            }
            Some(v) => Slot::One(self.key_at(v).map_err(|w| bad(v, w))?, v),
        })
    }

    /// The `v_addr` of `key` (hash `h`), lenient: a slot that names no
    /// well-formed entry is a miss (for GC and recovery, which compare
    /// addresses; reads use [`lookup`](Self::lookup)).
    #[inline]
    pub(crate) fn get(&self, key: &[u8], h: u64) -> Option<u64> {
        self.lookup(key, h).unwrap_or(None)
    }

    /// The `v_addr` of `key` (hash `h`), as a read needs it: `Ok(None)`
    /// when the slot is empty or holds other keys, `Err(Corrupt)` when it
    /// holds bits no write produces (an address that is not a well-formed
    /// entry, an overflow entry that is not one, or an entry whose key
    /// belongs to another slot), so that a damaged slot is an error, never
    /// a key silently absent.
    #[inline]
    pub(crate) fn lookup(&self, key: &[u8], h: u64) -> Result<Option<u64>> {
        let bad = |va: u64, what: &str| {
            Error::Corrupt(format!(
                "hash index slot {h:#x} names {va:#x}, {what}; run `pmhash check` on the pool"
            ))
        };
        let Some(v) = self.engine.get(h) else {
            return Ok(None);
        };
        let va = if v & OVF_TAG == 0 {
            v
        } else {
            // The pair's address is checked like the slot's own: only a
            // well-formed entry of `key` is returned.
            let pairs = self.ovf_pairs_checked(v).map_err(|w| bad(v, w))?;
            match pairs.into_iter().find(|(k, _)| k == key) {
                Some((_, va)) => va,
                None => return Ok(None),
            }
        };
        if self.names_key(va, key).map_err(|w| bad(va, w))? {
            return Ok(Some(va));
        }
        // Another key's entry: a miss only if that key shares the slot
        // (a 64-bit hash collision); one of another slot is damage.
        match self.key_at(va) {
            Ok(k) if key_hash(&k) == h => Ok(None),
            Ok(_) => Err(bad(va, "an entry of another slot's key")),
            Err(w) => Err(bad(va, w)),
        }
    }

    /// Points `key` at `va`. `ovf` appends an OVF entry for slot `h` with
    /// the given payload and returns its `v_addr`. The caller holds the
    /// slot's stripe. Returns whether the key was new.
    pub(crate) fn set(
        &self,
        key: &[u8],
        h: u64,
        va: u64,
        ovf: &mut dyn FnMut(u64, &[u8]) -> Result<u64>,
    ) -> Result<bool> {
        // persist: the entry `va` is durable (the caller appended it); the
        // engine's own persist is the commit.
        match self.slot(h)? {
            Slot::Empty => {
                if !self.engine.insert(h, va)? {
                    return Err(Error::Corrupt(format!(
                        "hash slot {h:#x} filled while its stripe was held"
                    )));
                }
                Ok(true)
            }
            Slot::One(k, _) if k == key => {
                self.engine.update(h, va)?;
                Ok(false)
            }
            Slot::One(k, old) => {
                let o = ovf(h, &encode_pairs(&[(k, old), (key.to_vec(), va)]))?;
                self.engine.update(h, o | OVF_TAG)?;
                Ok(true)
            }
            Slot::Many(mut pairs) => {
                let new = match pairs.iter_mut().find(|(k, _)| k == key) {
                    Some(p) => {
                        p.1 = va;
                        false
                    }
                    None => {
                        pairs.push((key.to_vec(), va));
                        true
                    }
                };
                let o = ovf(h, &encode_pairs(&pairs))?;
                self.engine.update(h, o | OVF_TAG)?;
                Ok(new)
            }
        }
    }

    /// Removes `key`; returns whether it was present.
    pub(crate) fn remove(
        &self,
        key: &[u8],
        h: u64,
        ovf: &mut dyn FnMut(u64, &[u8]) -> Result<u64>,
    ) -> Result<bool> {
        // persist: the caller's del entry and any OVF entry `ovf` appends
        // are durable before the engine update that drops or repoints the
        // slot; that update is the commit.
        match self.slot(h)? {
            Slot::Empty => Ok(false),
            Slot::One(k, _) if k == key => self.engine.remove(h),
            Slot::One(..) => Ok(false),
            Slot::Many(mut pairs) => {
                let Some(i) = pairs.iter().position(|(k, _)| k == key) else {
                    return Ok(false);
                };
                pairs.remove(i);
                if pairs.len() == 1 {
                    self.engine.update(h, pairs[0].1)?;
                } else {
                    let o = ovf(h, &encode_pairs(&pairs))?;
                    self.engine.update(h, o | OVF_TAG)?;
                }
                Ok(true)
            }
        }
    }

    /// GC moved OVF entry `old` of slot `h` to `new`, if the slot still
    /// names `old`.
    pub(crate) fn relocate_ovf(&self, h: u64, old: u64, new: u64) -> Result<bool> {
        if self.engine.get(h) != Some(old | OVF_TAG) {
            return Ok(false);
        }
        self.engine.update(h, new | OVF_TAG)
    }

    /// Whether slot `h` names the OVF entry at `va`.
    pub(crate) fn names_ovf(&self, h: u64, va: u64) -> bool {
        self.engine.get(h) == Some(va | OVF_TAG)
    }

    /// Every (key, v_addr), in no order: only well-formed entries (a
    /// corrupt pool's other slot values are skipped here, and `check`
    /// reports them).
    pub(crate) fn for_each(&self, f: &mut dyn FnMut(&[u8], u64)) {
        let _ = self.walk(false, f);
    }

    /// [`for_each`](Self::for_each) for a read that must not miss a key:
    /// the first slot that names no well-formed entry is an
    /// `Err(Corrupt)` (as [`lookup`](Self::lookup)'s), after the pairs
    /// before it were visited.
    pub(crate) fn for_each_checked(&self, f: &mut dyn FnMut(&[u8], u64)) -> Result<()> {
        self.walk(true, f)
    }

    fn walk(&self, strict: bool, f: &mut dyn FnMut(&[u8], u64)) -> Result<()> {
        let mut slots = Vec::new();
        self.engine.for_each(&mut |h, v| slots.push((h, v)));
        for (h, v) in slots {
            let bad = |va: u64, what: &str| {
                Error::Corrupt(format!(
                    "hash index slot {h:#x} names {va:#x}, {what}; run `pmhash check` on the pool"
                ))
            };
            if v & OVF_TAG != 0 {
                let pairs = match self.ovf_pairs_checked(v) {
                    Ok(p) => p,
                    Err(w) if strict => return Err(bad(v, w)),
                    Err(_) => continue,
                };
                for (k, va) in pairs {
                    match self.names_key(va, &k) {
                        Ok(true) => f(&k, va),
                        Ok(false) if strict => return Err(bad(va, "an entry of another key")),
                        Err(w) if strict => return Err(bad(va, w)),
                        _ => {}
                    }
                }
            } else {
                match self.key_at(v) {
                    Ok(k) => f(&k, v),
                    Err(w) if strict => return Err(bad(v, w)),
                    Err(_) => {}
                }
            }
        }
        Ok(())
    }

    /// The open's check of every slot (index options b and c): each value
    /// must have the form of an entry address in a live log file (on an
    /// entry boundary, its header inside the file's data), and an overflow
    /// entry must be a well-formed entry with an empty key whose pairs all
    /// have that form and this slot's hash. For an evenly spread sample of
    /// at most [`SAMPLE`] slots (all of them in a smaller index) the entry
    /// itself is read too: its lengths must be valid, it must fit in its
    /// file, its key must hash to the slot, and a lookup of the slot's hash
    /// must find that slot. `files`: `(offset, size)` of every live file.
    /// Reads only: one walk of the table, then the sampled entries, each
    /// split over the machine's threads (up to 8).
    /// `Err(Corrupt)` names the first bad slot. So an index of up to
    /// [`SAMPLE`] keys never opens with a counted key silently missing, and
    /// a larger one never opens with a slot that names anything but an
    /// entry boundary in a live file.
    pub(crate) fn check_slots(&self, files: &[(u64, u64)]) -> Result<()> {
        let files = Files::new(files);
        let stride = (self.engine.len() / SAMPLE).max(1);
        // The walk runs on the machine's threads, one part of the table
        // each (`Engine::for_each_part`). Slots read whole run after every
        // part's walk: an engine's `for_each` may hold a lock its `get`
        // takes.
        let parts = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, 8);
        type Bad = (u64, u64, &'static str);
        // Per part: its first slot of a bad form, and its slots to read
        // whole.
        type Walked = (Option<Bad>, Vec<(u64, u64)>);
        let walked: Vec<Walked> = std::thread::scope(|sc| {
            let files = &files;
            let walks: Vec<_> = (0..parts)
                .map(|part| {
                    sc.spawn(move || {
                        // Slots left before the next sampled one (a
                        // count down, not a division per slot).
                        let mut next = 0u64;
                        let mut first_bad: Option<Bad> = None;
                        let mut deep = Vec::new();
                        self.engine.for_each_part(part, parts, &mut |h, v| {
                            if first_bad.is_some() {
                                return;
                            }
                            // Overflow entries exist only where 64-bit
                            // hashes collide: rare, so each is read whole.
                            let sampled = next == 0;
                            next = if sampled { stride - 1 } else { next - 1 };
                            if v & OVF_TAG != 0 || sampled {
                                deep.push((h, v));
                            } else if let Err(w) = files.holds(vaddr_off(v), 0) {
                                first_bad = Some((h, v, w));
                            }
                        });
                        (first_bad, deep)
                    })
                })
                .collect();
            walks
                .into_iter()
                .map(|w| w.join().expect("a slot-check thread panicked"))
                .collect()
        });
        let mut first_bad = walked.iter().find_map(|w| w.0);
        if first_bad.is_none() {
            first_bad = std::thread::scope(|sc| {
                let files = &files;
                let checks: Vec<_> = walked
                    .iter()
                    .map(|(_, deep)| {
                        sc.spawn(move || {
                            deep.iter().find_map(|&(h, v)| {
                                self.slot_ok(files, h, v).err().map(|w| (h, v, w))
                            })
                        })
                    })
                    .collect();
                checks
                    .into_iter()
                    .map(|c| c.join().expect("a slot-check thread panicked"))
                    .find_map(|bad| bad)
            });
        }
        match first_bad {
            None => Ok(()),
            Some((h, v, w)) => Err(Error::Corrupt(format!(
                "hash index slot {h:#x} names {v:#x}, {w}; run `pmhash check` on the pool"
            ))),
        }
    }

    /// A slot of [`check_slots`](Self::check_slots) read whole.
    fn slot_ok(&self, files: &Files, h: u64, v: u64) -> std::result::Result<(), &'static str> {
        // The slot must be what a lookup of its hash finds: a damaged
        // engine can list a slot that its get never reaches.
        if self.engine.get(h) != Some(v) {
            return Err("a slot that a lookup of its hash does not find");
        }
        if v & OVF_TAG != 0 {
            let (off, _, vlen) = self.entry_at(v & !OVF_TAG)?;
            files.holds(off, vlen as u64)?;
            let pairs = self.ovf_pairs_checked(v)?;
            if pairs.len() < 2 {
                return Err("an overflow entry that lists fewer than two keys");
            }
            for (k, va) in &pairs {
                if key_hash(k) != h {
                    return Err("an overflow entry that lists a key of another slot");
                }
                self.entry_in_file(files, *va, Some(k))?;
            }
            return Ok(());
        }
        self.entry_in_file(files, v, None)?;
        match self.key_at(v) {
            Ok(k) if key_hash(&k) == h => Ok(()),
            Ok(_) => Err("an entry of another slot's key"),
            Err(w) => Err(w),
        }
    }

    /// `va` is on an entry boundary in a live file and, read, an entry
    /// that fits in that file (of `key`, if given).
    fn entry_in_file(
        &self,
        files: &Files,
        va: u64,
        key: Option<&[u8]>,
    ) -> std::result::Result<(), &'static str> {
        let off = vaddr_off(va);
        files.holds(off, 0)?;
        let (_, klen, vlen) = self.entry_at(va)?;
        files.holds(off, (klen + vlen) as u64)?;
        if key.is_some_and(|k| !self.key_is(va, k)) {
            return Err("an entry of another key");
        }
        Ok(())
    }

    /// Every engine value (entries and tagged OVF entries).
    pub(crate) fn values(&self) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        self.engine.for_each(&mut |h, v| out.push((h, v)));
        out
    }
}

/// How many slots an open reads the entry of (see
/// [`PIndex::check_slots`]): every slot of an index this small, an evenly
/// spread sample of a larger one. A sampled slot costs a lookup and a
/// random read of its entry (about 1 µs on the AMD host of
/// docs/benchmarks.md), so 8,192 cost about 8 ms; reading all 10M entries
/// of a large store would cost seconds.
pub(crate) const SAMPLE: u64 = 1 << 13;

/// The live log files, found by offset in O(1): `units[i]` holds the
/// (at most two, as files do not overlap) files that touch unit `i` of the
/// pool from `base`, a unit being the largest file's size rounded up to a
/// power of two (found by a shift: the open's walk asks once per slot).
pub(crate) struct Files {
    base: u64,
    /// log2 of the unit's size.
    shift: u32,
    units: Vec<[(u64, u64); 2]>,
}

impl Files {
    /// `files`: `(offset, size)` of every live file.
    pub(crate) fn new(files: &[(u64, u64)]) -> Files {
        let base = files.iter().map(|f| f.0).min().unwrap_or(0);
        let end = files.iter().map(|f| f.0 + f.1).max().unwrap_or(0);
        let unit = files
            .iter()
            .map(|f| f.1)
            .max()
            .unwrap_or(1)
            .max(ENTRY_ALIGN)
            .next_power_of_two();
        let shift = unit.trailing_zeros();
        let n = (end - base).div_ceil(unit) as usize;
        let mut units = vec![[(0, 0); 2]; n];
        for &(off, size) in files {
            if size == 0 {
                continue;
            }
            let first = ((off - base) >> shift) as usize;
            let last = ((off + size - 1 - base) >> shift) as usize;
            for u in &mut units[first..=last] {
                let k = usize::from(u[0].1 != 0);
                u[k] = (off, size);
            }
        }
        Files { base, shift, units }
    }

    /// Whether an entry at pool offset `off`, its header and `body` more
    /// bytes, lies on an entry boundary inside the entries of one file.
    #[inline]
    fn holds(&self, off: u64, body: u64) -> std::result::Result<(), &'static str> {
        if !off.is_multiple_of(ENTRY_ALIGN) {
            return Err("not on an entry boundary");
        }
        let u = off
            .checked_sub(self.base)
            .map(|d| (d >> self.shift) as usize)
            .and_then(|u| self.units.get(u))
            .ok_or("outside every log file")?;
        let end = off
            .checked_add(ENTRY_HEADER + body)
            .ok_or("outside every log file")?;
        for &(f, size) in u {
            if size != 0 && f <= off && off < f + size {
                if off < f + X_DATA || end > f + size {
                    return Err("outside every log file's entries");
                }
                return Ok(());
            }
        }
        Err("outside every log file")
    }
}

/// `Ok` if a pool without a store root (aux root 0) may be formatted as a
/// fresh store: only when nothing was ever built in it. A store's create
/// links its root before anything else is allocated (and a crash before
/// that link leaves nothing allocated), so a pool that holds allocated
/// blocks or a hash-index root but no store root has lost its root word:
/// formatting it would hide every key it holds. Reads only.
pub(crate) fn check_unformatted(pool: &Pool) -> Result<()> {
    let blocks = pool.stats().blocks_in_use;
    let root = pool.root();
    if blocks == 0 && root == 0 {
        return Ok(());
    }
    let what = if root != 0 {
        format!("a hash index root at {root:#x} and {blocks} allocated blocks")
    } else {
        format!("{blocks} allocated blocks")
    };
    Err(Error::Corrupt(format!(
        "the pool's header names no store root, yet the pool holds {what}: \
         it is not a fresh pool and will not be formatted over; \
         run `pmhash check` on it"
    )))
}

pub(crate) fn encode_pairs(pairs: &[(Vec<u8>, u64)]) -> Vec<u8> {
    let mut b = Vec::new();
    for (k, va) in pairs {
        b.extend_from_slice(&(k.len() as u16).to_le_bytes());
        b.extend_from_slice(k);
        b.extend_from_slice(&va.to_le_bytes());
    }
    b
}

pub(crate) fn decode_pairs(mut b: &[u8]) -> Vec<(Vec<u8>, u64)> {
    let mut out = Vec::new();
    while b.len() >= 2 {
        let kl = u16::from_le_bytes([b[0], b[1]]) as usize;
        if b.len() < 2 + kl + 8 {
            break;
        }
        let k = b[2..2 + kl].to_vec();
        let va = u64::from_le_bytes(b[2 + kl..10 + kl].try_into().expect("8 bytes"));
        out.push((k, va));
        b = &b[10 + kl..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_round_trip() {
        let p = vec![(b"".to_vec(), 1), (vec![7u8; 300], u64::MAX >> 1)];
        assert_eq!(decode_pairs(&encode_pairs(&p)), p);
    }
}

#[cfg(test)]
mod collision_tests {
    use super::*;
    use engine::{EngineConfig, EngineKind};

    /// Writes a bare entry (lengths and key: all `PIndex` reads) and
    /// returns its `v_addr`.
    fn entry(pool: &Pool, off: u64, key: &[u8]) -> u64 {
        pool.store_u64(off + 8, lens_word(key.len(), 0));
        pool.write(off + ENTRY_HEADER, key);
        vaddr(0, off)
    }

    #[test]
    fn colliding_hashes_share_a_slot_through_overflow_entries() {
        let opts = engine::testkit::test_pool_options(
            "slotarray",
            b"pindex-collision",
            pmem::Mode::Volatile,
            4 << 20,
            0,
            1,
        );
        let pool = engine::testkit::mem_pool(&opts);
        let EngineKind::Persistent { create, .. } = engine::slotarray::spec().kind else {
            panic!("slotarray is persistent")
        };
        let e = create(pool.clone(), &EngineConfig::default()).unwrap();
        let p = PIndex::new(e, pool.clone());
        // A scratch area for entries, past what the engine uses.
        let r = pool.reserve(1 << 20, pmem::Link::Nothing).unwrap();
        let base = r.offset();
        let mut next = base;
        let mut ovf_log: Vec<Vec<(Vec<u8>, u64)>> = Vec::new();
        let mut ovf = |_: u64, payload: &[u8]| -> engine::Result<u64> {
            // An OVF entry: empty key, the payload as value.
            let off = next;
            next += 4096;
            pool.store_u64(off + 8, lens_word(0, payload.len()));
            pool.write(off + ENTRY_HEADER, payload);
            ovf_log.push(decode_pairs(payload));
            Ok(vaddr(0, off))
        };
        const H: u64 = 42;
        let a = entry(&pool, base + 512 * 1024, b"alpha");
        let b = entry(&pool, base + 513 * 1024, b"beta");
        let c = entry(&pool, base + 514 * 1024, b"gamma");
        assert!(p.set(b"alpha", H, a, &mut ovf).unwrap());
        assert_eq!(p.get(b"alpha", H), Some(a));
        assert_eq!(
            p.get(b"beta", H),
            None,
            "a different key in the slot is absent"
        );
        assert!(
            p.set(b"beta", H, b, &mut ovf).unwrap(),
            "collision: new key"
        );
        assert!(p.set(b"gamma", H, c, &mut ovf).unwrap());
        assert_eq!(p.get(b"alpha", H), Some(a));
        assert_eq!(p.get(b"beta", H), Some(b));
        assert_eq!(p.get(b"gamma", H), Some(c));
        let a2 = entry(&pool, base + 515 * 1024, b"alpha");
        assert!(
            !p.set(b"alpha", H, a2, &mut ovf).unwrap(),
            "update in a shared slot"
        );
        assert_eq!(p.get(b"alpha", H), Some(a2));
        let mut seen = Vec::new();
        p.for_each(&mut |k, v| seen.push((k.to_vec(), v)));
        seen.sort();
        assert_eq!(seen.len(), 3);
        assert!(p.remove(b"beta", H, &mut ovf).unwrap());
        assert!(!p.remove(b"beta", H, &mut ovf).unwrap());
        assert_eq!(p.get(b"beta", H), None);
        assert!(p.remove(b"gamma", H, &mut ovf).unwrap());
        // One key left: the slot names its entry directly again.
        assert_eq!(p.engine.get(H), Some(a2));
        assert!(p.remove(b"alpha", H, &mut ovf).unwrap());
        assert_eq!(p.engine.get(H), None);
        assert_eq!(
            ovf_log.len(),
            4,
            "one overflow entry per change of a shared slot"
        );
    }
}
