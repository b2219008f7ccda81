//! The read path: point gets (`get`, `get_into`, `get_into_slice`,
//! `get_many`), range scans and the full walk (`for_each`). Reads pin an
//! epoch, ask the index (and the point map's inline values), then the
//! RAF cache, then the log.

use engine::Result;

use crate::epoch::Pin;
use crate::layout::*;
use crate::point_map::Got;
use crate::raf::Probe;
use crate::store::{check_key, Store};

impl Store {
    /// an `Err(Corrupt)` naming the entry (see `OpenOptions::verify_checksums`).
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        check_key(key)?;
        let mut out = Vec::new();
        Ok(self.get_into(key, &mut out)?.then_some(out))
    }

    /// Copies the value of `key` into `out`; false if absent (an `Err`
    /// as [`get`](Self::get)'s).
    pub fn get_into(&self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        if key.len() > MAX_KEY {
            return Ok(false);
        }
        let s = &*self.inner;
        let hash = key_hash(key);
        // The bucket's miss starts before the pin, whose fence would hold
        // it back until the fence completes.
        s.index.prefetch(hash);
        let p = s.epochs.pin();
        let mut known = None;
        if let (8, Some(m)) = (key.len(), s.index.inline_map()) {
            // The 8-byte fast path: one probe of the point index, which
            // holds an 8-byte value inline; the cache and the log only for
            // a longer value.
            match m.get8_pinned(hash, &p) {
                Got::Absent => return Ok(false),
                Got::Value(_, v) => {
                    out.clear();
                    out.extend_from_slice(&v.to_le_bytes());
                    return Ok(true);
                }
                Got::Addr(va) => known = Some(va),
            }
        }
        self.get_slow(key, hash, known, out, &p)
    }

    /// The length of `key`'s value, `None` if absent: what the index and
    /// the log entry's header say, with nothing copied and no checksum
    /// checked (a later [`get`](Self::get) may still find the entry
    /// corrupt, or a write may change it meanwhile). For sizing a reply
    /// before building it.
    pub fn value_len(&self, key: &[u8]) -> Result<Option<usize>> {
        if key.len() > MAX_KEY {
            return Ok(None);
        }
        let s = &*self.inner;
        let hash = key_hash(key);
        let p = s.epochs.pin();
        let mut known = None;
        if let (8, Some(m)) = (key.len(), s.index.inline_map()) {
            match m.get8_pinned(hash, &p) {
                Got::Absent => return Ok(None),
                Got::Value(..) => return Ok(Some(8)),
                Got::Addr(va) => known = Some(va),
            }
        }
        let va = match known {
            Some(va) => va,
            None => match s.index.lookup(key, hash)? {
                Some(va) => va,
                None => return Ok(None),
            },
        };
        // `p` pins the log while its header is read.
        Ok(s.log.header(vaddr_off(va)).map(|e| e.vlen))
    }

    /// Copies the value of `key` into the front of `out` and returns the
    /// value's length; `None` if absent. A value longer than `out` fills
    /// it and is cut there (the length returned is still the whole
    /// value's). Allocates nothing: an 8-byte key whose 8-byte value the
    /// point index holds inline is one probe and one copy, and any other
    /// value goes through a buffer the thread keeps.
    ///
    /// The fast path is [`get_into`](Self::get_into)'s with nothing
    /// around it: with 2M keys a get waits for one cache miss, and gets
    /// overlap their misses only while the instructions between two of
    /// them fit the CPU's out-of-order window (docs/bench/log.md,
    /// "Why a get's length matters: the out-of-order window").
    #[inline]
    pub fn get_into_slice(&self, key: &[u8], out: &mut [u8]) -> Result<Option<usize>> {
        let s = &*self.inner;
        if let (Ok(k), Some(m)) = (<&[u8; 8]>::try_from(key), s.index.inline_map()) {
            let hash = key_hash(k);
            m.prefetch(hash);
            let p = s.epochs.pin();
            match m.get8_pinned(hash, &p) {
                Got::Absent => return Ok(None),
                Got::Value(_, v) => {
                    let n = out.len().min(8);
                    out[..n].copy_from_slice(&v.to_le_bytes()[..n]);
                    return Ok(Some(8));
                }
                // A longer value, in the log: the general path below.
                Got::Addr(_) => {}
            }
        }
        self.get_into_slice_slow(key, out)
    }

    /// [`get_into_slice`](Self::get_into_slice) of a value not inline, through the
    /// thread's buffer.
    #[cold]
    #[inline(never)]
    fn get_into_slice_slow(&self, key: &[u8], out: &mut [u8]) -> Result<Option<usize>> {
        thread_local!(static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) });
        BUF.with(|b| {
            let mut v = b.borrow_mut();
            if !self.get_into(key, &mut v)? {
                return Ok(None);
            }
            let n = out.len().min(v.len());
            out[..n].copy_from_slice(&v[..n]);
            Ok(Some(v.len()))
        })
    }

    /// A get past the point index's inline values: the RAF cache, then the
    /// log entry (at `known` when the point index gave it). `_p` pins the
    /// log while the entry is read.
    fn get_slow(
        &self,
        key: &[u8],
        hash: u64,
        known: Option<u64>,
        out: &mut Vec<u8>,
        _p: &Pin<'_>,
    ) -> Result<bool> {
        let s = &*self.inner;
        let here = s.numa.current();
        let sampled = match s.raf.probe(key, hash, here) {
            Probe::Hit(v) => {
                *out = v;
                return Ok(true);
            }
            Probe::Miss { sampled } => sampled,
            Probe::Off => false,
        };
        let va = match known {
            Some(va) => va,
            None => match s.index.lookup(key, hash)? {
                Some(va) => va,
                None => return Ok(false),
            },
        };
        s.read_entry(key, hash, va, sampled, here, out)
    }

    /// The values of `keys`, in order, into `out` (cleared first): what
    /// `get` would return for each. Looks every key up in the index, then
    /// touches every entry, then reads them, so the cache misses of a batch
    /// overlap instead of queueing (`pmhash serve` uses it for pipelined
    /// GETs). A corrupt entry fails the call (as [`get`](Self::get)).
    pub fn get_many(&self, keys: &[&[u8]], out: &mut Vec<Option<Vec<u8>>>) -> Result<()> {
        out.clear();
        let s = &*self.inner;
        let here = s.numa.current();
        let inlines = s.index.inlines();
        let _p = s.epochs.pin();
        // None: a key too long to be present.
        let hashes: Vec<Option<u64>> = keys
            .iter()
            .map(|k| (k.len() <= MAX_KEY).then(|| key_hash(k)))
            .collect();
        // The lookups' misses overlap: every bucket, then every candidate
        // entry that confirms a key, then the lookups below.
        for h in hashes.iter().flatten() {
            s.index.prefetch(*h);
        }
        for (key, h) in keys.iter().zip(&hashes) {
            if let Some(h) = h {
                s.index.prefetch_candidates(key, *h);
            }
        }
        // (position, hash, sampled, v_addr if known) of the keys the index
        // and the cache did not answer.
        let mut todo = Vec::with_capacity(keys.len());
        for (i, (key, hash)) in keys.iter().zip(&hashes).enumerate() {
            out.push(None);
            let Some(hash) = *hash else {
                continue;
            };
            let mut known = None;
            if key.len() == 8 && inlines {
                match s.index.get8(key, hash, &_p) {
                    Got::Absent => continue,
                    Got::Value(_, v) => {
                        out[i] = Some(v.to_le_bytes().to_vec());
                        continue;
                    }
                    Got::Addr(va) => known = Some(va),
                }
            }
            match s.raf.probe(key, hash, here) {
                Probe::Hit(v) => out[i] = Some(v),
                Probe::Miss { sampled } => todo.push((i, hash, sampled, known)),
                Probe::Off => todo.push((i, hash, false, known)),
            }
        }
        let vas: Vec<Option<u64>> = todo
            .iter()
            .map(|&(i, h, _, known)| match known {
                Some(va) => Ok(Some(va)),
                None => s.index.lookup(keys[i], h),
            })
            .collect::<Result<_>>()?;
        for va in vas.iter().flatten() {
            s.log.touch(vaddr_off(*va));
        }
        for (&(i, hash, sampled, _), va) in todo.iter().zip(vas) {
            let Some(va) = va else { continue };
            let mut v = Vec::new();
            if s.read_entry(keys[i], hash, va, sampled, here, &mut v)? {
                out[i] = Some(v);
            }
        }
        Ok(())
    }

    /// Up to `limit` pairs with `start <= key < end` (`end` None: to the
    /// last key), in key order. Values are read by the reader threads of
    /// the node that holds each entry when `scan_readers` > 0.
    pub fn scan(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        check_key(start)?;
        if let Some(e) = end {
            check_key(e)?;
        }
        crate::scan::scan(&self.inner, start, end, limit)
    }

    /// Up to `limit` keys with `start <= key < end` (`end` None: to the
    /// last key), in key order, without reading their values.
    pub fn scan_keys(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>> {
        check_key(start)?;
        if let Some(e) = end {
            check_key(e)?;
        }
        crate::scan::keys(&self.inner, start, end, limit)
    }

    /// Visits every pair, in no particular order (not a snapshot: a key
    /// written meanwhile may show its old or its new value). `f` may write
    /// to the store: the keys are listed first (about 32 bytes of DRAM
    /// per key), then visited with no lock held, each with its value at
    /// that moment. Each value is read as [`get`](Self::get) reads it: an
    /// entry that fails its checksum (when reads verify:
    /// `OpenOptions::verify_checksums`) stops the walk with that `Err(Corrupt)`
    /// naming the file and offset, and its bytes never reach `f`; so does
    /// an index slot of a persistent index that names no well-formed entry.
    pub fn for_each(&self, mut f: impl FnMut(&[u8], &[u8])) -> Result<()> {
        let s = &*self.inner;
        let mut keys = Vec::new();
        {
            // Pinned while the slots are read and their entries confirmed:
            // no file they name is freed and reused meanwhile.
            let _p = s.epochs.pin();
            s.index
                .for_each_checked(|k, _| keys.push(crate::index::IKey::new(k)))?;
        }
        let here = s.numa.current();
        let mut v = Vec::new();
        for k in keys {
            let key = k.as_bytes();
            let hash = key_hash(key);
            // The key's address now (it may have moved or gone since it was
            // listed), read under an epoch so its file stays mapped; `f`
            // runs unpinned.
            let found = {
                let _p = s.epochs.pin();
                match s.index.lookup(key, hash)? {
                    Some(va) => s.read_entry(key, hash, va, false, here, &mut v)?,
                    None => false,
                }
            };
            if found {
                f(key, &v);
            }
        }
        Ok(())
    }
}
