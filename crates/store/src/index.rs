//! The DRAM ordered index: key → `v_addr` of the key's newest entry.
//!
//! A concurrent skip list (`crossbeam-skiplist`): lock-free reads and
//! ordered range scans. Keys up to 23 bytes are stored inline (the 8-byte
//! fast path allocates nothing beyond the skip-list node); values are
//! atomics, so an update of a present key is one store, not a new node.
//! Writers of one key are serialised by the store's stripe locks.

use std::borrow::Borrow;
use std::cmp::Ordering as CmpOrdering;
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_skiplist::SkipMap;

const INLINE: usize = 23;

/// A key as the index holds it.
#[derive(Clone)]
pub enum IKey {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<[u8]>),
}

impl IKey {
    pub fn new(key: &[u8]) -> IKey {
        if key.len() <= INLINE {
            let mut bytes = [0u8; INLINE];
            bytes[..key.len()].copy_from_slice(key);
            IKey::Inline {
                len: key.len() as u8,
                bytes,
            }
        } else {
            IKey::Heap(key.into())
        }
    }

    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            IKey::Inline { len, bytes } => &bytes[..*len as usize],
            IKey::Heap(b) => b,
        }
    }
}

impl PartialEq for IKey {
    fn eq(&self, o: &Self) -> bool {
        self.as_bytes() == o.as_bytes()
    }
}
impl Eq for IKey {}
impl PartialOrd for IKey {
    fn partial_cmp(&self, o: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(o))
    }
}
impl Ord for IKey {
    fn cmp(&self, o: &Self) -> CmpOrdering {
        self.as_bytes().cmp(o.as_bytes())
    }
}
impl Borrow<[u8]> for IKey {
    fn borrow(&self) -> &[u8] {
        self.as_bytes()
    }
}

#[derive(Default)]
pub struct Index {
    map: SkipMap<IKey, AtomicU64>,
}

impl Index {
    #[inline]
    pub fn get(&self, key: &[u8]) -> Option<u64> {
        self.map.get(key).map(|e| e.value().load(Ordering::Acquire))
    }

    /// Sets `key` to `v`; the caller holds the key's stripe.
    pub fn set(&self, key: &[u8], v: u64) {
        match self.map.get(key) {
            Some(e) => e.value().store(v, Ordering::Release),
            None => {
                self.map.insert(IKey::new(key), AtomicU64::new(v));
            }
        }
    }

    /// Removes `key`; the caller holds the key's stripe.
    pub fn remove(&self, key: &[u8]) -> Option<u64> {
        self.map
            .remove(key)
            .map(|e| e.value().load(Ordering::Acquire))
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Up to `limit` pairs with `start <= key < end` (`end` None: no bound),
    /// in key order.
    pub fn range(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
        out: &mut Vec<(IKey, u64)>,
    ) {
        let hi = match end {
            Some(e) => Bound::Excluded(e),
            None => Bound::Unbounded,
        };
        for e in self
            .map
            .range::<[u8], _>((Bound::Included(start), hi))
            .take(limit)
        {
            out.push((e.key().clone(), e.value().load(Ordering::Acquire)));
        }
    }

    pub fn for_each(&self, mut f: impl FnMut(&[u8], u64)) {
        for e in self.map.iter() {
            f(e.key().as_bytes(), e.value().load(Ordering::Acquire));
        }
    }

    pub fn clear(&self) {
        self.map.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_by_bytes_across_inline_and_heap_keys() {
        let ix = Index::default();
        let long = vec![b'b'; 40];
        ix.set(b"c", 3);
        ix.set(&long, 2);
        ix.set(b"a", 1);
        ix.set(b"a", 4);
        let mut out = Vec::new();
        ix.range(b"", None, 10, &mut out);
        let keys: Vec<&[u8]> = out.iter().map(|(k, _)| k.as_bytes()).collect();
        assert_eq!(keys, vec![&b"a"[..], &long[..], &b"c"[..]]);
        assert_eq!(out[0].1, 4);
        out.clear();
        ix.range(b"b", Some(b"c"), 10, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(ix.remove(b"a"), Some(4));
        assert_eq!(ix.get(b"a"), None);
    }
}
