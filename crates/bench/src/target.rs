//! What the benchmark threads drive: an engine through [`EngineTarget`]
//! (u64 keys and values), or the store with byte keys and values of any
//! size through [`crate::store_run::StoreTarget`].
//!
//! Keys and values are named by u64 numbers either way; a target encodes
//! them as it needs to and decodes a read value back to its number, so one
//! runner loads, times and checks both.

use engine::{Engine, Result};

/// What a real range scan returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Scanned {
    /// Pairs returned.
    pub count: usize,
    /// The first key returned.
    pub first: Option<u64>,
}

/// The operations a benchmark run performs.
pub(crate) trait Target: Sync {
    fn insert(&self, key: u64, value: u64) -> Result<bool>;
    /// Inserts or replaces.
    fn put(&self, key: u64, value: u64) -> Result<()>;
    fn update(&self, key: u64, value: u64) -> Result<bool>;
    fn remove(&self, key: u64) -> Result<bool>;
    fn get(&self, key: u64) -> Option<u64>;
    fn get_many(&self, keys: &[u64], out: &mut [Option<u64>]);
    /// Up to `limit` pairs from `start` on, in key order; `None` when the
    /// target has no range scan (YCSB E then emulates it with gets).
    fn scan(&self, start: u64, limit: usize) -> Option<Result<Scanned>>;
    fn len(&self) -> u64;
}

/// An engine as a [`Target`].
pub(crate) struct EngineTarget<'a>(pub &'a dyn Engine);

impl Target for EngineTarget<'_> {
    #[inline]
    fn insert(&self, key: u64, value: u64) -> Result<bool> {
        self.0.insert(key, value)
    }
    #[inline]
    fn put(&self, key: u64, value: u64) -> Result<()> {
        self.0.upsert(key, value)
    }
    #[inline]
    fn update(&self, key: u64, value: u64) -> Result<bool> {
        self.0.update(key, value)
    }
    #[inline]
    fn remove(&self, key: u64) -> Result<bool> {
        self.0.remove(key)
    }
    #[inline]
    fn get(&self, key: u64) -> Option<u64> {
        self.0.get(key)
    }
    #[inline]
    fn get_many(&self, keys: &[u64], out: &mut [Option<u64>]) {
        self.0.get_many(keys, out)
    }
    fn scan(&self, _start: u64, _limit: usize) -> Option<Result<Scanned>> {
        None
    }
    fn len(&self) -> u64 {
        self.0.len()
    }
}
