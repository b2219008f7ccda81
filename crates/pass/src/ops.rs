//! Search, insert, update and delete.
//!
//! Readers never write PM: they read the spiral state, the mapping table
//! and the key's two buckets (home `t`, probe `t + 1`) optimistically, and
//! retry when either bucket's version or the spiral state moved. Writers
//! lock `t` and `t + 1` (lower index first), then stash and chain buckets
//! one at a time. Every u64 key is usable: validity is the allocation bit,
//! never a reserved key value.

use std::sync::atomic::{fence, AtomicU64, Ordering};

use engine::{hits, Error, Result};
use pmem::Link;

use crate::layout::*;
use crate::{spiral, table, Key, Pass, Snap};

/// The meta bits of slot `s` (allocation, and member for normal buckets;
/// a chain bucket keeps its next pointer in those bits).
#[inline]
pub(crate) fn slot_bits(kind: Kind, s: usize) -> u64 {
    match kind {
        Kind::Chain(_) => 1 << s,
        _ => 1 << s | 1 << (MEMBER_SHIFT as usize + s),
    }
}

/// Where a record lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Normal,
    Stash(u64),
    /// An overflow chain bucket of this group.
    Chain(u64),
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Loc {
    pub bucket: u64,
    pub s: usize,
    pub kind: Kind,
}

/// What a placement writes into the key word.
#[derive(Clone, Copy)]
pub(crate) enum Rec<'a> {
    /// A new record: its key (bytes mode allocates the key block).
    New(Key<'a>),
    /// A record moving inside the table: its existing key word.
    Moved(u64),
}

/// Where a placement put the record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Placed {
    Normal,
    Displaced,
    Stash,
    Chain,
    /// `allow_chain` was false and the segment had no room.
    NoRoom,
}

/// How a record is placed: what it persists, what the caller holds, and
/// whether the overflow chain may take it.
#[derive(Clone, Copy)]
pub(crate) struct Placing {
    /// Write the record's lines back (fenced as each path says).
    pub(crate) persist: bool,
    /// The caller holds the whole segment: no bucket lock is taken.
    pub(crate) all_locked: bool,
    /// The overflow chain takes the record when home, probe and stash are
    /// full; without it the placement answers [`Placed::NoRoom`].
    pub(crate) allow_chain: bool,
}

/// Where a record is written: a free slot of a bucket, and the meta bits
/// its write sets (its allocation bit, and the member bit for a
/// probe-bucket record).
#[derive(Clone, Copy)]
struct SlotAt {
    bucket: u64,
    s: usize,
    bits: u64,
}

/// Lock words held by one writer, released (version bumped) on drop. The
/// two words of an ordinary write live inline (no allocation on the hot
/// path); a split's whole segment spills to a vector.
pub(crate) struct Held<'a> {
    ps: &'a Pass,
    pair: [Option<&'a AtomicU64>; 2],
    more: Vec<&'a AtomicU64>,
}

impl<'a> Held<'a> {
    pub(crate) fn new(ps: &'a Pass) -> Held<'a> {
        Held {
            ps,
            pair: [None, None],
            more: Vec::new(),
        }
    }
    pub(crate) fn lock(&mut self, off: u64) {
        let w = self.ps.pool.atomic_u64(off);
        self.ps.lock.lock(w);
        match self.pair.iter_mut().find(|x| x.is_none()) {
            Some(x) => *x = Some(w),
            None => self.more.push(w),
        }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        for w in self.more.drain(..).rev() {
            self.ps.lock.unlock(w);
        }
        for w in self.pair.iter_mut().rev().filter_map(|x| x.take()) {
            self.ps.lock.unlock(w);
        }
    }
}

impl Pass {
    // ----- address computation ----------------------------------------------------

    /// The physical segment of hash `h` in the window of snapshot `s`, or
    /// `None` when the snapshot is stale (a concurrent split moved on).
    #[inline(always)]
    pub(crate) fn phys_of(&self, h: u64, s: &Snap) -> Option<u64> {
        let l = self.logical_of_hash(h, s)?;
        let p = spiral::physical(l);
        (p < s.first).then_some(p)
    }

    /// The logical bucket of hash `h`: its fine position `P` is the unique
    /// number ≡ its top 40 bits (mod 2^40) in the window `S(first) ..
    /// S(first) + 2^40` (the paper's `G = ⌈c − h⌉ + h`, in integers), and
    /// its cell's entry gives `max{L : S(L) ≤ P}`.
    #[inline(always)]
    pub(crate) fn logical_of_hash(&self, h: u64, s: &Snap) -> Option<u64> {
        self.logical_in(h, s.cf, s.k, |t| s.tables[t])
    }

    /// [`logical_of_hash`](Self::logical_of_hash) from the window's fields:
    /// `cf` and `k`, and `table(t)` the octave table of slot `t`.
    #[inline(always)]
    fn logical_in(&self, h: u64, cf: u64, k: u32, table: impl FnOnce(usize) -> u64) -> Option<u64> {
        const FMASK: u64 = (1 << table::FINE) - 1;
        let x = h >> (64 - table::FINE);
        let pos = cf + (x.wrapping_sub(cf) & FMASK);
        let i = pos >> (table::FINE - k);
        let tb = table(((pos >> table::FINE) % 3) as usize);
        if tb == 0 {
            return None;
        }
        let off = tb + OCT_HEADER + 8 * (i & ((1 << k) - 1));
        // A torn snapshot may name a freed block: still inside the pool,
        // and the caller's version check rejects what it reads.
        let e = self.pool.try_words(off, 1)?[0].load(Ordering::Acquire);
        Some(table::entry_logical(e, pos, k))
    }

    /// [`locate`](Self::locate) with the spiral state read once, for the
    /// 8-byte-key get: the segment of `h` (from the DRAM cells,
    /// [`mirror`]) and the state's version, or `None` while a publish is
    /// in flight or where the cells name no segment. Unlike
    /// [`snap`](Self::snap) it does not check that the fields it reads
    /// belong together (a publish may land between their loads): the
    /// cells only ever hold offsets of segments (arrays are never freed
    /// while the table is open), and the caller keeps its answer only if
    /// [`still_at`](Self::still_at) the version.
    #[inline(always)]
    pub(crate) fn locate_once(&self, h: u64) -> Option<(u64, u64)> {
        const FMASK: u64 = (1 << table::FINE) - 1;
        let v = self.sv.load(Ordering::Acquire);
        if v & 1 != 0 {
            return None;
        }
        let cf = self.s_cf.load(Ordering::Relaxed);
        let k = self.s_k.load(Ordering::Relaxed) as u32;
        let x = h >> (64 - table::FINE);
        let pos = cf + (x.wrapping_sub(cf) & FMASK);
        Some((v, self.mirror.seg(pos, k)?))
    }

    /// Offset of physical segment `p`, if its array exists.
    #[inline(always)]
    pub(crate) fn seg_off(&self, p: u64) -> Option<u64> {
        let (e, i) = dir_pos(p);
        let base = self.dir.get(e)?.load(Ordering::Acquire);
        (base != 0).then(|| base + i * self.geo.seg_bytes())
    }

    #[inline(always)]
    pub(crate) fn locate(&self, h: u64, s: &Snap) -> Option<u64> {
        self.seg_off(self.phys_of(h, s)?)
    }

    // ----- key words ------------------------------------------------------------

    /// Whether the key word `kw` of a slot holds key `k`. In bytes mode
    /// the word is a key block offset, checked before it is followed (a
    /// torn optimistic read may see any value).
    #[inline]
    pub(crate) fn key_is(&self, kw: u64, k: Key) -> bool {
        match k {
            Key::Word(x) => kw == x,
            Key::Bytes(b) => {
                let nw = b.len().div_ceil(8);
                if kw == 0
                    || !kw.is_multiple_of(8)
                    || self.pool.check_range(kw, 8 + 8 * nw as u64).is_err()
                {
                    return false;
                }
                let w = self.pool.words(kw, 1 + nw);
                if w[0].load(Ordering::Relaxed) != b.len() as u64 {
                    return false;
                }
                b.chunks(8).enumerate().all(|(i, c)| {
                    let mut x = [0u8; 8];
                    x[..c.len()].copy_from_slice(c);
                    w[1 + i].load(Ordering::Relaxed) == u64::from_le_bytes(x)
                })
            }
        }
    }

    /// A key block, checked (bytes mode): its length and its words.
    pub(crate) fn key_block(&self, kw: u64) -> Result<(u64, &[AtomicU64])> {
        if kw == 0 || !kw.is_multiple_of(8) {
            return Err(crate::corrupt(format!(
                "key pointer {kw:#x} is not a block"
            )));
        }
        self.pool.check_range(kw, 8)?;
        let len = self.pool.load_u64(kw);
        if len == 0 || len > crate::MAX_KEY_BYTES as u64 {
            return Err(crate::corrupt(format!(
                "key block {kw:#x} claims {len} bytes"
            )));
        }
        let nw = len.div_ceil(8);
        self.pool.check_range(kw + 8, 8 * nw)?;
        Ok((len, self.pool.words(kw + 8, nw as usize)))
    }

    /// The key bytes behind a key block, checked (bytes mode).
    pub(crate) fn key_bytes(&self, kw: u64) -> Result<Vec<u8>> {
        let (len, w) = self.key_block(kw)?;
        let mut b = vec![0u8; len as usize];
        for (c, w) in b.chunks_mut(8).zip(w) {
            let x = w.load(Ordering::Relaxed).to_le_bytes();
            c.copy_from_slice(&x[..c.len()]);
        }
        Ok(b)
    }

    /// The hash of the record whose key word is `kw` (no copy of the key;
    /// an inline key word is the hash).
    pub(crate) fn hash_kw(&self, kw: u64) -> Result<u64> {
        Ok(self.hash_kw_odd(kw)?.0)
    }

    /// The hash of the record whose key word is `kw`, and whether its key
    /// is not the form of a u64 key (bytes mode; see [`crate::is_wide`]),
    /// from one read of the key block.
    pub(crate) fn hash_kw_odd(&self, kw: u64) -> Result<(u64, bool)> {
        if self.geo.bytes_keys {
            let (len, w) = self.key_block(kw)?;
            let h = self.hash_words(len, w.iter().map(|x| x.load(Ordering::Relaxed)));
            let odd = len != 16 || w[1].load(Ordering::Relaxed) != !w[0].load(Ordering::Relaxed);
            Ok((h, odd))
        } else {
            Ok((kw, false))
        }
    }

    // ----- the key whose hash is 0 -------------------------------------------------

    /// Whether `k` is the one inline key whose hash is 0 (a key word of 0
    /// marks a free slot, so that key lives in the root instead).
    #[inline]
    fn is_zero_hash(&self, k: Key, h: u64) -> bool {
        h == 0 && matches!(k, Key::Word(_))
    }

    /// What a slot's key word holds for `k`: its hash (a bijection of the
    /// key, so it compares like the key and gives the key back), or in
    /// bytes mode the key itself, compared through its block.
    #[inline]
    fn slot_key<'a>(&self, k: Key<'a>, h: u64) -> Key<'a> {
        match k {
            Key::Word(_) => Key::Word(h),
            b => b,
        }
    }

    fn zero_get(&self) -> Option<u64> {
        let _g = self.zero.lock().unwrap_or_else(|e| e.into_inner());
        (self.pool.load_u64(self.root + R_ZERO) == 1)
            .then(|| self.pool.load_u64(self.root + R_ZERO_VALUE))
    }

    /// Applies `f` to the root's zero-hash key: `f(present)` says what to
    /// store (`Some(Some(v))` the value, `Some(None)` absence, `None`
    /// nothing). Whether something was stored.
    fn zero_write(&self, f: impl FnOnce(bool) -> Option<Option<u64>>) -> bool {
        let _g = self.zero.lock().unwrap_or_else(|e| e.into_inner());
        let present = self.pool.load_u64(self.root + R_ZERO) == 1;
        let Some(want) = f(present) else {
            return false;
        };
        // persist: value, then flag, in one line (lines persist whole): the
        // flag never survives without its value; one persist commits.
        match want {
            Some(v) => {
                self.pool.store_u64(self.root + R_ZERO_VALUE, v);
                self.pool.store_u64(self.root + R_ZERO, 1);
            }
            None => self.pool.store_u64(self.root + R_ZERO, 0),
        }
        self.pool.persist_line(self.root);
        true
    }

    // ----- readers --------------------------------------------------------------

    /// The lookup of an inline 8-byte key: one straight pass over the home
    /// and probe buckets that answers a hit, and a miss whose home shows no
    /// overflow, without the general loop. Anything else (a lock or a split
    /// in flight, the zero hash, a home whose overflow filter admits the
    /// key) goes to [`get_key`](Self::get_key).
    ///
    /// Why a second path: a miss reads two bucket lines from memory, and
    /// the general path's ~340 instructions kept the next lookup's misses
    /// out of the CPU's window, so misses ran one at a time. This path
    /// reads the same words and validates the same versions as
    /// `read_find`.
    #[inline]
    pub(crate) fn get_word(&self, key: u64) -> Option<u64> {
        let h = self.hash(Key::Word(key));
        match self.try_get_word(h) {
            Some(r) => r,
            None => self.get_key(Key::Word(key)),
        }
    }

    /// [`get_word`](Self::get_word)'s one attempt: `None` to take the
    /// general path.
    #[inline(always)]
    fn try_get_word(&self, h: u64) -> Option<Option<u64>> {
        if h == 0 {
            return None;
        }
        let (sv, seg) = self.locate_once(h)?;
        let (fp, bix) = self.fp_bix(h);
        let (bt, bp) = (
            self.geo.bucket(seg, bix),
            self.geo.bucket(seg, self.geo.probe(bix)),
        );
        let wt = self.pool.words(bt, 32);
        let wp = self.pool.words(bp, 32);
        // In a run of hits (`engine::hits`) the slot lines of both
        // buckets are requested with their line 0: a hit's key line then
        // arrives with the fingerprints instead of after them (one miss
        // instead of two in a row). A miss needs line 0 alone, and the six
        // extra lines cost negative gets 2-17% (4M keys grown, one thread,
        // interleaved sittings), so outside a run they are not requested.
        if hits::in_run() {
            for l in 1..4 {
                self.pool.prefetch(bt + l * LINE);
                self.pool.prefetch(bp + l * LINE);
            }
        }
        let word = |w: &[AtomicU64], i: usize| w[i].load(Ordering::Relaxed);
        let (vt, vp) = (wt[0].load(Ordering::Acquire), wp[0].load(Ordering::Acquire));
        let (mt, mp) = (word(wt, 1), word(wp, 1));
        // Candidates: the home's own records and the probe's records whose
        // home is this bucket, with the key's fingerprint.
        let ct = fp_matches(word(wt, 2), word(wt, 3), fp) & alloc(mt) & !member(mt);
        let cp = fp_matches(word(wp, 2), word(wp, 3), fp) & alloc(mp) & member(mp);
        let find = |w: &[AtomicU64], c: u64| {
            ones(c)
                .find(|&s| word(w, 4 + 2 * s) == h)
                .map(|s| word(w, 5 + 2 * s))
        };
        let res = match find(wt, ct) {
            None => find(wp, cp),
            r => r,
        };
        if res.is_none() && mt & overflow_bit(h) != 0 {
            return None;
        }
        // Validate as `read_find` does: both lock words free and unchanged,
        // and no split published since the snapshot.
        fence(Ordering::Acquire);
        let stable = word(wt, 0) == vt && word(wp, 0) == vp && self.still_at(sv);
        let r = (self.lock.is_free(vt) && self.lock.is_free(vp) && stable).then_some(res);
        if let Some(found) = r {
            hits::record(found.is_some());
        }
        r
    }

    pub(crate) fn get_key(&self, k: Key) -> Option<u64> {
        let h = self.hash(k);
        if self.is_zero_hash(k, h) {
            return self.zero_get();
        }
        let k = self.slot_key(k, h);
        loop {
            let sn = self.snap();
            if let Some(seg) = self.locate(h, &sn) {
                if let Some(r) = self.read_find(seg, h, k) {
                    if self.still(&sn) {
                        return r;
                    }
                }
            }
            std::hint::spin_loop();
        }
    }

    /// Searches one bucket's candidate slots (a mask of slots) for `k`.
    #[inline(always)]
    fn scan(&self, w: &[AtomicU64], cand: u64, fp: u8, k: Key) -> Option<(usize, u64)> {
        for s in ones(
            fp_matches(
                w[2].load(Ordering::Relaxed),
                w[3].load(Ordering::Relaxed),
                fp,
            ) & cand,
        ) {
            if self.key_is(w[4 + 2 * s].load(Ordering::Relaxed), k) {
                return Some((s, w[5 + 2 * s].load(Ordering::Relaxed)));
            }
        }
        None
    }

    /// One optimistic attempt: `None` to retry, else the answer.
    fn read_find(&self, seg: u64, h: u64, k: Key) -> Option<Option<u64>> {
        let (fp, bix) = self.fp_bix(h);
        let t = self.geo.bucket(seg, bix);
        let p = self.geo.bucket(seg, self.geo.probe(bix));
        // One pool bounds check for the segment; the two buckets are then
        // slices of it (register compares, not reloads of the pool size).
        let segw = self.pool.words(seg, (self.geo.seg_bytes() / 8) as usize);
        let bucket = |b: u64| &segw[((b - seg) / 8) as usize..][..32];
        let wt = bucket(t);
        // Only the probe is fetched ahead. Fetching the home's filter word
        // too (a dense table reads it for one miss in six) gains nothing
        // measurable with the exit test below (interleaved runs).
        self.pool.prefetch(p);
        let vt = wt[0].load(Ordering::Acquire);
        if !self.lock.is_free(vt) {
            return None;
        }
        let mt = wt[1].load(Ordering::Acquire);
        let wp = bucket(p);
        let vp = wp[0].load(Ordering::Acquire);
        if !self.lock.is_free(vp) {
            return None;
        }
        let res = match self.scan(wt, alloc(mt) & !member(mt), fp, k) {
            Some((_, v)) => Some(v),
            None => {
                let mp = wp[1].load(Ordering::Acquire);
                match self.scan(wp, alloc(mp) & member(mp), fp, k) {
                    Some((_, v)) => Some(v),
                    None => {
                        let hints = (
                            mt,
                            wt[3].load(Ordering::Relaxed),
                            mp,
                            wp[3].load(Ordering::Relaxed),
                        );
                        match self.overflow_lookup(seg, h, hints, k) {
                            Ok(Some(l)) => Some(self.pool.load_u64(slot_off(l.bucket, l.s) + 8)),
                            Ok(None) => None,
                            Err(()) => return None,
                        }
                    }
                }
            }
        };
        fence(Ordering::Acquire);
        if wt[0].load(Ordering::Relaxed) != vt || wp[0].load(Ordering::Relaxed) != vp {
            return None;
        }
        Some(res)
    }

    /// Stash buckets the hints of home `t` (meta `mt`, fingerprint word
    /// `ht`) and probe `p` point to for fingerprint `fp`, as a bit set.
    #[inline]
    fn stash_candidates(&self, (mt, ht, mp, hp): (u64, u64, u64, u64), fp: u8) -> u64 {
        let mut set = 0;
        for j in 0..OFPS {
            let (v, mem, idx, f) = ofp(mt, ht, j);
            if v && !mem && f == fp {
                set |= 1 << idx;
            }
            let (v, mem, idx, f) = ofp(mp, hp, j);
            if v && mem && f == fp {
                set |= 1 << idx;
            }
        }
        set
    }

    /// Searches stash bucket set `set` of `seg` for `k`, fetching every
    /// line first so that the misses overlap.
    fn stash_find(&self, seg: u64, mut set: u64, fp: u8, k: Key) -> Option<Loc> {
        let mut ahead = set;
        while ahead != 0 {
            let j = ahead.trailing_zeros() as u64;
            ahead &= ahead - 1;
            self.pool.prefetch(self.geo.bucket(seg, self.geo.n + j));
        }
        while set != 0 {
            let j = set.trailing_zeros() as u64;
            set &= set - 1;
            let b = self.geo.bucket(seg, self.geo.n + j);
            let w = self.pool.words(b, 32);
            let mb = w[1].load(Ordering::Acquire);
            if let Some((s, _)) = self.scan(w, alloc(mb), fp, k) {
                return Some(Loc {
                    bucket: b,
                    s,
                    kind: Kind::Stash(j),
                });
            }
        }
        None
    }

    /// The overflow search of a key that home and probe do not hold. The
    /// home's overflow filter (meta word `hints.0`) rules out the stash
    /// and the chain when its bit is clear — every overflow record of the
    /// home sets its bit, hinted or not, and `check` verifies it — so most
    /// misses end here, inline, after two lines. (A test of "no valid
    /// hint in home or probe, and no filter bit" would send half the misses
    /// at high load into `overflow_find`, a branch the CPU cannot predict,
    /// taken on loaded data; against it this test gives dense get-neg
    /// 4.9-5.2 Mops/s instead of 4.0-4.2.)
    #[inline(always)]
    fn overflow_lookup(
        &self,
        seg: u64,
        h: u64,
        hints: (u64, u64, u64, u64),
        k: Key,
    ) -> std::result::Result<Option<Loc>, ()> {
        if hints.0 & overflow_bit(h) == 0 {
            return Ok(None);
        }
        self.overflow_find(seg, h, hints, k)
    }

    /// Looks for `k` in the stash of `seg` and the chain of home `bix`'s
    /// group, once the home's overflow filter admits the key
    /// (`overflow_lookup`, the only caller): first the stash buckets the
    /// hints name, then — when the home's filter word admits the key too —
    /// every stash bucket and the chain. `Err(())`: a chain link was torn
    /// (retry). Safe without the stash and chain locks: only a writer
    /// holding the home bucket's lock adds or removes this key, and
    /// callers validate that lock's version (or hold it).
    fn overflow_find(
        &self,
        seg: u64,
        h: u64,
        hints: (u64, u64, u64, u64),
        k: Key,
    ) -> std::result::Result<Option<Loc>, ()> {
        let (fp, bix) = self.fp_bix(h);
        let hinted = self.stash_candidates(hints, fp);
        if let Some(l) = self.stash_find(seg, hinted, fp, k) {
            return Ok(Some(l));
        }
        let fb = filter_bits(h);
        if self.pool.load_u64(chain_filter(seg, bix)) & fb != fb {
            return Ok(None);
        }
        let rest = ((1 << self.geo.m) - 1) & !hinted;
        if let Some(l) = self.stash_find(seg, rest, fp, k) {
            return Ok(Some(l));
        }
        // The chain, whose head shares the filter word's line.
        let mut cb = self.pool.load_u64(chain_head(seg, chain_group(bix)));
        let mut steps = 0u32;
        while cb != 0 {
            steps += 1;
            if !cb.is_multiple_of(LINE)
                || self.pool.check_range(cb, BUCKET).is_err()
                || steps > 1 << 20
            {
                return Err(());
            }
            let w = self.pool.words(cb, 32);
            let mb = w[1].load(Ordering::Acquire);
            if let Some((s, _)) = self.scan(w, alloc(mb), fp, k) {
                return Ok(Some(Loc {
                    bucket: cb,
                    s,
                    kind: Kind::Chain(chain_group(bix)),
                }));
            }
            cb = chain_next(mb);
        }
        Ok(None)
    }

    /// The record of `k` in a segment whose home and probe buckets the
    /// caller holds.
    pub(crate) fn find_locked(&self, seg: u64, h: u64, k: Key) -> Option<Loc> {
        let (fp, bix) = self.fp_bix(h);
        let t = self.geo.bucket(seg, bix);
        let p = self.geo.bucket(seg, self.geo.probe(bix));
        let wt = self.pool.words(t, 32);
        let mt = wt[1].load(Ordering::Acquire);
        if let Some((s, _)) = self.scan(wt, alloc(mt) & !member(mt), fp, k) {
            return Some(Loc {
                bucket: t,
                s,
                kind: Kind::Normal,
            });
        }
        let wp = self.pool.words(p, 32);
        let mp = wp[1].load(Ordering::Acquire);
        if let Some((s, _)) = self.scan(wp, alloc(mp) & member(mp), fp, k) {
            return Some(Loc {
                bucket: p,
                s,
                kind: Kind::Normal,
            });
        }
        let hints = (
            mt,
            wt[3].load(Ordering::Relaxed),
            mp,
            wp[3].load(Ordering::Relaxed),
        );
        // Under the home lock a chain cannot be torn.
        self.overflow_lookup(seg, h, hints, k).ok().flatten()
    }

    // ----- writers --------------------------------------------------------------

    /// Locks the home and probe buckets of `bix` (lower index first).
    fn lock_pair(&self, seg: u64, bix: u64) -> Held<'_> {
        let q = self.geo.probe(bix);
        let (a, b) = if bix < q { (bix, q) } else { (q, bix) };
        // Both buckets' lines are requested, owned, before the first lock:
        // a locked compare-and-swap waits for its line before the next one
        // starts, so the two lock words were two misses in a row, and the
        // slot line the write takes a third. Inserts +12%, deletes +15%
        // (4M keys grown, one thread, interleaved).
        let (ba, bb) = (self.geo.bucket(seg, a), self.geo.bucket(seg, b));
        for l in 0..4 {
            self.pool.prefetch_write(ba + l * LINE);
            self.pool.prefetch_write(bb + l * LINE);
        }
        let mut h = Held::new(self);
        h.lock(self.geo.bucket(seg, a));
        h.lock(self.geo.bucket(seg, b));
        h
    }

    /// Runs `f` with the key's segment located and its two buckets held,
    /// under a spiral state no split has moved.
    fn with_locked<T>(&self, h: u64, bix: u64, mut f: impl FnMut(u64) -> T) -> T {
        loop {
            // The segment from the DRAM cells as the get finds it (the
            // version read first, so a publish after it fails the check
            // below), else from a full snapshot.
            let at = self.locate_once(h).or_else(|| {
                let sn = self.snap();
                Some((sn.v, self.locate(h, &sn)?))
            });
            if let Some((v, seg)) = at {
                let held = self.lock_pair(seg, bix);
                if self.still_at(v) {
                    let r = f(seg);
                    drop(held);
                    return r;
                }
            }
            std::hint::spin_loop();
        }
    }

    pub(crate) fn insert_key(&self, k: Key, v: u64) -> Result<bool> {
        self.check_open()?;
        let h = self.hash(k);
        if self.is_zero_hash(k, h) {
            let r = self.zero_write(|present| (!present).then_some(Some(v)));
            if r {
                self.len.add(1);
            }
            return Ok(r);
        }
        let k = self.slot_key(k, h);
        let bix = self.fp_bix(h).1;
        let r = self.with_locked(h, bix, |seg| {
            if self.find_locked(seg, h, k).is_some() {
                return Ok(None);
            }
            let how = Placing {
                persist: true,
                all_locked: false,
                allow_chain: true,
            };
            self.place(seg, h, Rec::New(k), v, how).map(Some)
        })?;
        let Some(placed) = r else { return Ok(false) };
        let tick = self.len.bump();
        if tick.is_multiple_of(16) || placed != Placed::Normal {
            self.maybe_split();
        }
        Ok(true)
    }

    pub(crate) fn update_key(&self, k: Key, v: u64) -> Result<bool> {
        self.check_open()?;
        let h = self.hash(k);
        if self.is_zero_hash(k, h) {
            return Ok(self.zero_write(|present| present.then_some(Some(v))));
        }
        let k = self.slot_key(k, h);
        let bix = self.fp_bix(h).1;
        Ok(self.with_locked(h, bix, |seg| {
            let Some(l) = self.find_locked(seg, h, k) else {
                return false;
            };
            let off = slot_off(l.bucket, l.s) + 8;
            // persist: the value word is one failure-atomic store; its line
            // is written back before the update returns.
            self.pool.store_u64(off, v);
            self.pool.persist_line(off & !(LINE - 1));
            true
        }))
    }

    pub(crate) fn remove_key(&self, k: Key) -> Result<bool> {
        self.check_open()?;
        let h = self.hash(k);
        if self.is_zero_hash(k, h) {
            let r = self.zero_write(|present| present.then_some(None));
            if r {
                self.len.add(-1);
            }
            return Ok(r);
        }
        let k = self.slot_key(k, h);
        let (fp, bix) = self.fp_bix(h);
        let r = self.with_locked(h, bix, |seg| -> Result<bool> {
            let Some(l) = self.find_locked(seg, h, k) else {
                return Ok(false);
            };
            let mut held = Held::new(self);
            if l.kind != Kind::Normal {
                held.lock(l.bucket);
            }
            self.clear_slot(l.bucket, l.s, l.kind, true, true)?;
            drop(held);
            if let Kind::Stash(j) = l.kind {
                self.drop_hint(seg, bix, j, fp);
            }
            Ok(true)
        })?;
        if r {
            self.len.add(-1);
        }
        Ok(r)
    }

    /// Clears slot `s` of `bucket` (the caller holds what guards it). In
    /// bytes mode with `free_key`, the key block is freed by the same
    /// store.
    pub(crate) fn clear_slot(
        &self,
        bucket: u64,
        s: usize,
        kind: Kind,
        persist: bool,
        free_key: bool,
    ) -> Result<()> {
        let so = slot_off(bucket, s);
        let kwa = self.pool.atomic_u64(so);
        let ticket = if self.geo.bytes_keys && free_key {
            let kw = kwa.load(Ordering::Relaxed);
            Some(self.pool.begin_free(kw, Link::Pointer { owner: so })?)
        } else {
            None
        };
        // persist: zeroing the key word is the delete's commit (one 8-byte
        // store: a slot is a record iff its key word is not 0); only its
        // line is written back. The meta bits are hints, rebuilt after a
        // crash and written back by a clean close (as for an insert, see
        // `write_slot`). In bytes mode the key block's free lane is
        // durable before it and decides on that word.
        kwa.store(0, Ordering::Release);
        let mw = self.pool.atomic_u64(bucket + B_META);
        mw.store(
            mw.load(Ordering::Relaxed) & !slot_bits(kind, s),
            Ordering::Release,
        );
        if persist {
            self.pool.persist_line(so & !(LINE - 1));
        }
        if let Some(t) = ticket {
            self.pool.finish_free(t);
        }
        Ok(())
    }

    /// Writes a record into free slot `s` of `bucket` and sets `bits`
    /// (see [`SlotAt`]). With `persist`, its lines are written back, and
    /// fenced unless `defer` (the caller fences with its hints; a new key
    /// block always fences here, before its reservation is committed).
    fn write_slot(
        &self,
        at: SlotAt,
        rec: Rec,
        v: u64,
        fp: u8,
        persist: bool,
        defer: bool,
    ) -> Result<()> {
        let SlotAt { bucket, s, bits } = at;
        let so = slot_off(bucket, s);
        let (kw, res) = match rec {
            Rec::Moved(kw) | Rec::New(Key::Word(kw)) => (kw, None),
            Rec::New(Key::Bytes(b)) => {
                let size = 8 + 8 * b.len().div_ceil(8) as u64;
                // The key block is allocated iff the slot's key word holds
                // it: the store that makes the record decides the block.
                let r = self.pool.reserve(size, Link::Pointer { owner: so })?;
                let blk = r.offset();
                let mut data = Vec::with_capacity(size as usize);
                data.extend_from_slice(&(b.len() as u64).to_le_bytes());
                data.extend_from_slice(b);
                data.resize(size as usize, 0);
                self.pool.write(blk, &data);
                // persist: the key block before the key word that names it
                // (else a crash could leave a record naming garbage).
                self.pool.persist(blk, size as usize);
                (blk, Some(r))
            }
        };
        debug_assert_ne!(kw, 0, "a key word of 0 marks a free slot");
        let sw = self.pool.words(so, 2);
        // The value before the key word, in one line: lines persist whole,
        // so a key word that survives a crash brings its value with it.
        sw[1].store(v, Ordering::Relaxed);
        sw[0].store(kw, Ordering::Release);
        self.pool
            .atomic_u8(bucket + B_FP + s as u64)
            .store(fp, Ordering::Relaxed);
        let mw = self.pool.atomic_u64(bucket + B_META);
        mw.store(mw.load(Ordering::Relaxed) | bits, Ordering::Release);
        if persist {
            // persist: the slot line, whose key word is the commit. Dash
            // persists the record, then the allocation bit, with two
            // fences; we persist no hint at all here (allocation bit,
            // member bit, fingerprint): recovery rebuilds them from the
            // slots after a crash, and a clean close writes every meta
            // line back before it marks the pool clean (`Pass::close`).
            // One line instead of two when the slot is not in line 0:
            // inserts +5% (interleaved runs, `pass-dense` at 10M).
            // A stash or chain record's line is fenced by its caller once
            // the home's hints are set (`add_hint`, `chain_place`): one
            // fence per insert all the same.
            if defer && res.is_none() {
                self.pool.flush(so & !(LINE - 1), LINE as usize);
            } else {
                self.pool.persist_line(so & !(LINE - 1));
            }
        }
        if let Some(r) = res {
            self.pool.commit(r);
        }
        Ok(())
    }

    /// Writes the record into the first free slot of stash or chain bucket
    /// `b`, holding its lock unless the caller holds the whole segment.
    /// `false` if the bucket is full. With `persist` the lines are written
    /// back but not fenced: the caller's hint update fences them.
    fn try_put(
        &self,
        b: u64,
        rec: Rec,
        v: u64,
        fp: u8,
        persist: bool,
        all_locked: bool,
    ) -> Result<bool> {
        let mut held = Held::new(self);
        if !all_locked {
            held.lock(b);
        }
        let Some(s) = first_free(self.pool.load_u64(b + B_META)) else {
            return Ok(false);
        };
        let at = SlotAt {
            bucket: b,
            s,
            bits: 1 << s,
        };
        self.write_slot(at, rec, v, fp, persist, true)?;
        Ok(true)
    }

    /// Places a record of home `bix` in `seg`: balanced insert into the
    /// less loaded of home and probe, displacement, the stash, then (with
    /// `allow_chain`) the overflow chain. The caller holds home and probe,
    /// or the whole segment (`all_locked`), or the segment is not live yet.
    pub(crate) fn place(&self, seg: u64, h: u64, rec: Rec, v: u64, how: Placing) -> Result<Placed> {
        let Placing {
            persist,
            all_locked,
            allow_chain,
        } = how;
        let (fp, bix) = self.fp_bix(h);
        let n = self.geo.n;
        let t = self.geo.bucket(seg, bix);
        let p = self.geo.bucket(seg, self.geo.probe(bix));
        let mut displaced = false;
        loop {
            let mt = self.pool.load_u64(t + B_META);
            let mp = self.pool.load_u64(p + B_META);
            let (ct, cp) = (alloc(mt).count_ones(), alloc(mp).count_ones());
            let full = SLOTS as u32;
            if ct < full && (ct <= cp || cp == full) {
                let s = first_free(mt).expect("home has room");
                let at = SlotAt {
                    bucket: t,
                    s,
                    bits: 1 << s,
                };
                self.write_slot(at, rec, v, fp, persist, false)?;
                return Ok(if displaced {
                    Placed::Displaced
                } else {
                    Placed::Normal
                });
            }
            if cp < full {
                let s = first_free(mp).expect("probe has room");
                let at = SlotAt {
                    bucket: p,
                    s,
                    bits: 1 << s | 1 << (MEMBER_SHIFT as usize + s),
                };
                self.write_slot(at, rec, v, fp, persist, false)?;
                return Ok(if displaced {
                    Placed::Displaced
                } else {
                    Placed::Normal
                });
            }
            if displaced || !self.displace(seg, bix, persist, all_locked)? {
                break;
            }
            displaced = true;
        }
        // The stash, starting at the home's own stash bucket.
        let m = self.geo.m;
        for d in 0..m {
            let j = (bix + d) % m;
            if self.try_put(self.geo.bucket(seg, n + j), rec, v, fp, persist, all_locked)? {
                self.add_hint(seg, h, j, persist);
                self.t.stash_inserts.fetch_add(1, Ordering::Relaxed);
                return Ok(Placed::Stash);
            }
        }
        if !allow_chain {
            return Ok(Placed::NoRoom);
        }
        self.chain_place(seg, h, rec, v, how)?;
        Ok(Placed::Chain)
    }

    /// Dash's displacement: frees a slot in home or probe by moving a
    /// record that may live elsewhere — a probe-bucket record whose home
    /// is the probe moves on to its own probe, or a home-bucket record
    /// whose home is the previous bucket moves back there. `false` when
    /// neither can move.
    fn displace(&self, seg: u64, bix: u64, persist: bool, all_locked: bool) -> Result<bool> {
        let n = self.geo.n;
        let pi = self.geo.probe(bix);
        // (from bucket, to bucket, take records whose member bit is, mark member at target)
        let moves = [
            (pi, (pi + 1) % n, false, true),
            (bix, (bix + n - 1) % n, true, false),
        ];
        for (from, to, want_member, to_member) in moves {
            let fb = self.geo.bucket(seg, from);
            let tb = self.geo.bucket(seg, to);
            let tw = self.pool.atomic_u64(tb);
            if !all_locked && !self.lock.try_lock(tw) {
                continue;
            }
            let mut done = false;
            let mtb = self.pool.load_u64(tb + B_META);
            let mf = self.pool.load_u64(fb + B_META);
            let cands = alloc(mf) & if want_member { member(mf) } else { !member(mf) };
            if alloc(mtb) != ALLOC_MASK && cands != 0 {
                let s = cands.trailing_zeros() as usize;
                let so = slot_off(fb, s);
                let kw = self.pool.load_u64(so);
                let val = self.pool.load_u64(so + 8);
                let fpb = self
                    .pool
                    .atomic_u8(fb + B_FP + s as u64)
                    .load(Ordering::Relaxed);
                let d = first_free(mtb).expect("target has room");
                let bits = 1 << d
                    | if to_member {
                        1 << (MEMBER_SHIFT as usize + d)
                    } else {
                        0
                    };
                // persist: the copy is a record before the original is
                // cleared, so a crash leaves the key once or twice (recovery
                // drops the duplicate), never zero times.
                let at = SlotAt {
                    bucket: tb,
                    s: d,
                    bits,
                };
                let r = self.write_slot(at, Rec::Moved(kw), val, fpb, persist, false);
                if r.is_ok() {
                    let _ = self.clear_slot(fb, s, Kind::Normal, persist, false);
                    self.t.displacements.fetch_add(1, Ordering::Relaxed);
                    done = true;
                }
                if !all_locked {
                    self.lock.unlock(tw);
                }
                r?;
            } else if !all_locked {
                self.lock.unlock(tw);
            }
            if done {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Notes a stash record of hash `h` in stash bucket `j`: its home's
    /// overflow filter bit and filter word (every stash record), and a
    /// fingerprint hint in the home's (or the probe's) meta word when one
    /// is free. Hints are rebuilt by crash recovery, so their persist order
    /// does not matter for safety; they are persisted so that a clean
    /// close needs no walk.
    pub(crate) fn add_hint(&self, seg: u64, h: u64, j: u64, persist: bool) {
        let (fp, bix) = self.fp_bix(h);
        let t = self.geo.bucket(seg, bix);
        let p = self.geo.bucket(seg, self.geo.probe(bix));
        // Filters, for every record (a delete may take back a hint that
        // named another record with the same fingerprint and bucket; the
        // filters still find that one).
        self.note_overflow(seg, bix, h);
        for (b, mem) in [(t, false), (p, true)] {
            let mw = self.pool.atomic_u64(b + B_META);
            let m = mw.load(Ordering::Acquire);
            let hi = self.pool.load_u64(b + 24);
            if let Some(jj) = (0..OFPS).find(|&jj| !ofp(m, hi, jj).0) {
                let mut nm = m | 1 << (OFP_VALID_SHIFT as usize + jj);
                nm &= !(1 << (OFP_MEMBER_SHIFT as usize + jj));
                if mem {
                    nm |= 1 << (OFP_MEMBER_SHIFT as usize + jj);
                }
                nm &= !(3 << (OFP_IDX_SHIFT as usize + 2 * jj));
                nm |= j << (OFP_IDX_SHIFT as usize + 2 * jj);
                match jj {
                    0 => self.pool.atomic_u8(b + 30).store(fp, Ordering::Relaxed),
                    1 => self.pool.atomic_u8(b + 31).store(fp, Ordering::Relaxed),
                    _ => nm = (nm & !(0xff << OFP2_SHIFT)) | (fp as u64) << OFP2_SHIFT,
                }
                mw.store(nm, Ordering::Release);
                break;
            }
        }
        if persist {
            // persist: the fence of the stash record's line (flushed by
            // `try_put`). The hints are not written back: recovery
            // rebuilds them from the slots, a clean close flushes them.
            self.pool.fence();
        }
    }

    /// Sets the overflow filter bit (home meta) and the filter word bits
    /// of a stash or chain record of hash `h` whose home is `bix` (the
    /// caller holds the home). Hints: not written back here (see
    /// `write_slot`).
    fn note_overflow(&self, seg: u64, bix: u64, h: u64) {
        let t = self.geo.bucket(seg, bix);
        let mw = self.pool.atomic_u64(t + B_META);
        let m = mw.load(Ordering::Acquire);
        let ob = overflow_bit(h);
        if m & ob == 0 {
            mw.store(m | ob, Ordering::Release);
        }
        let fw = self.pool.atomic_u64(chain_filter(seg, bix));
        let f = fw.load(Ordering::Acquire);
        let fb = filter_bits(h);
        if f & fb != fb {
            fw.store(f | fb, Ordering::Release);
        }
    }

    /// Undoes [`add_hint`](Self::add_hint)'s fingerprint hint for a
    /// removed stash record (the filters keep their bits until the
    /// segment's hints are rebuilt).
    fn drop_hint(&self, seg: u64, bix: u64, j: u64, fp: u8) {
        let t = self.geo.bucket(seg, bix);
        let p = self.geo.bucket(seg, self.geo.probe(bix));
        for (b, mem) in [(t, false), (p, true)] {
            let mw = self.pool.atomic_u64(b + B_META);
            let m = mw.load(Ordering::Acquire);
            let hi = self.pool.load_u64(b + 24);
            if let Some(jj) = (0..OFPS).find(|&jj| ofp(m, hi, jj) == (true, mem, j, fp)) {
                mw.store(
                    m & !(1 << (OFP_VALID_SHIFT as usize + jj)),
                    Ordering::Release,
                );
                return;
            }
        }
    }

    /// Puts a record into the overflow chain of its home's group,
    /// appending a chain bucket when every one is full (`how.allow_chain`
    /// is the caller's to check).
    fn chain_place(&self, seg: u64, h: u64, rec: Rec, v: u64, how: Placing) -> Result<()> {
        let Placing {
            persist,
            all_locked,
            ..
        } = how;
        let (fp, bix) = self.fp_bix(h);
        let hw = chain_head(seg, chain_group(bix));
        loop {
            let head = self.pool.load_u64(hw);
            let mut cb = head;
            while cb != 0 {
                if self.try_put(cb, rec, v, fp, persist, all_locked)? {
                    // The home's filters are hints (the caller holds the
                    // home), set after the record and rebuilt after a crash.
                    self.note_overflow(seg, bix, h);
                    if persist {
                        // persist: the fence of the chain record's line
                        // (flushed by `try_put`); the filters are hints.
                        self.pool.fence();
                    }
                    self.t.chain_inserts.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                let mb = self.pool.load_u64(cb + B_META);
                cb = chain_next(mb);
            }
            // Every chain bucket is full: append an empty one at the head.
            let mut held = Held::new(self);
            if !all_locked {
                held.lock(seg + H_LOCK);
            }
            if self.pool.load_u64(hw) != head {
                continue;
            }
            let r = self.pool.reserve(BUCKET, Link::Pointer { owner: hw })?;
            let blk = r.offset();
            let mut z = [0u8; BUCKET as usize];
            z[8..16].copy_from_slice(&((head >> 6) << CHAIN_NEXT_SHIFT).to_le_bytes());
            self.pool.write_nt(blk, &z);
            // persist: the empty bucket (its link to the old head) before
            // the head names it; records go in afterwards, one by one, so
            // a key block never hangs off a bucket that is not linked.
            self.pool.fence();
            self.pool.store_u64(hw, blk);
            self.pool.persist(hw, 8);
            self.pool.commit(r);
            self.t.chain_buckets.fetch_add(1, Ordering::Relaxed);
            drop(held);
        }
    }

    /// Splits while the table is over its split load (one splitter at a
    /// time; others go on).
    pub(crate) fn maybe_split(&self) {
        if (self.len.get().max(0) as u64) <= self.threshold.load(Ordering::Relaxed) {
            return;
        }
        let Ok(_g) = self.split_mx.try_lock() else {
            return;
        };
        while (self.len.get().max(0) as u64) > self.threshold.load(Ordering::Relaxed) {
            let start = std::time::Instant::now();
            match self.split_one() {
                Ok(true) => self.t.structural.record(start),
                Ok(false) => break,
                Err(_) => {
                    self.t.split_failures.fetch_add(1, Ordering::Relaxed);
                    break;
                }
            }
        }
    }

    /// Checks a byte key's length.
    pub(crate) fn check_bytes_key(&self, key: &[u8]) -> Result<()> {
        if !self.geo.bytes_keys {
            return Err(Error::InvalidArgument(
                "this table stores 8-byte keys inline; byte keys need a table created with bytes_keys".into(),
            ));
        }
        if key.is_empty() || key.len() > crate::MAX_KEY_BYTES {
            return Err(Error::InvalidArgument(format!(
                "key of {} bytes (1..={} allowed)",
                key.len(),
                crate::MAX_KEY_BYTES
            )));
        }
        Ok(())
    }
}
