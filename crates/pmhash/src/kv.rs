//! [`Store`]: the key-value store of byte keys and values, in a directory
//! of its own.

use std::path::Path;

use engine::{Durability, Error, Result};
use pmem::Mode;
use store::{GcMode, IndexKind, Options, StoreStats, MAX_KEY};

/// How a [`Store`] is opened: a builder. The settings marked "at create"
/// are fixed in the store when it is created and ignored by later opens.
///
/// ```
/// use pmhash::{Durability, Store};
///
/// # fn main() -> Result<(), pmhash::Error> {
/// let dir = std::env::temp_dir().join(format!("pmhash-sopts-{}", std::process::id()));
/// # let _ = std::fs::remove_dir_all(&dir);
/// let store = Store::options()
///     .durability(Durability::Relaxed)
///     .pool_size(64 << 20)
///     .expected_keys(10_000)
///     .cache_bytes(0)
///     .open(&dir)?;
/// store.put(b"k", b"v")?;
/// store.sync()?; // Relaxed: durable from here on
/// store.close()?;
/// # std::fs::remove_dir_all(&dir).ok();
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, Default)]
pub struct StoreOptions {
    opts: Options,
}

impl StoreOptions {
    /// The defaults: strict durability, a 256 MiB pool that grows up to 16
    /// times that, ordered scans, background garbage collection, a 64 MiB
    /// read cache.
    pub fn new() -> StoreOptions {
        StoreOptions::default()
    }

    /// What a returned write promises (default strict).
    pub fn durability(mut self, d: Durability) -> Self {
        self.opts.open.durability = d;
        self
    }

    /// Pool file size at create, in bytes (default 256 MiB).
    pub fn pool_size(mut self, bytes: u64) -> Self {
        self.opts.create.pool_size = bytes;
        self
    }

    /// The pool grows up to this size (default 16 × the create size); a
    /// write that needs more gets [`Error::OutOfSpace`].
    pub fn max_pool_size(mut self, bytes: u64) -> Self {
        self.opts.open.max_pool_size = bytes;
        self
    }

    /// Keys expected: sizes the DRAM index so that loading it never
    /// resizes (default 2^20).
    pub fn expected_keys(mut self, n: u64) -> Self {
        self.opts.open.expected_keys = n;
        self
    }

    /// At create: keep the point index in the pool too (a persistent
    /// `hmeh` index) so that a reopen after a crash does not rebuild it
    /// from the log. Range scans are then refused unless `ordered` is also
    /// set, which keeps the DRAM ordered index beside it (built in the
    /// background after open).
    pub fn persistent_index(mut self, ordered: bool) -> Self {
        self.opts.create.index = if ordered {
            IndexKind::Both(hmeh::spec())
        } else {
            IndexKind::Hash(hmeh::spec())
        };
        self
    }

    /// At create: the hash clusters of each node's log (default 256, at
    /// most 65,536). Each cluster appends to a log file of its own, so a
    /// store that has written to every cluster holds at least `clusters` ×
    /// [`log_file_size`](Self::log_file_size) bytes of pool per node:
    /// 2 GiB by default. A small store wants fewer clusters or smaller
    /// files; many writer threads want more clusters (less contention).
    pub fn log_clusters(mut self, clusters: u32) -> Self {
        self.opts.create.clusters = clusters;
        self
    }

    /// At create: bytes per log file (default 8 MiB; a multiple of 64, at
    /// least 4096). An entry (a key, its value and 64 bytes of header) must
    /// fit one file. Garbage collection reclaims whole files.
    pub fn log_file_size(mut self, bytes: u64) -> Self {
        self.opts.create.extent_size = bytes;
        self
    }

    /// Bytes of DRAM for the cache of hot values (default 64 MiB; 0: none).
    pub fn cache_bytes(mut self, bytes: u64) -> Self {
        self.opts.open.raf_bytes = bytes;
        self
    }

    /// Reclaim a log file once this fraction of its bytes is dead (default
    /// 0.5), in a background thread, or only when [`Store::gc`] is called.
    pub fn gc(mut self, threshold: f64, background: bool) -> Self {
        self.opts.open.gc_threshold = threshold;
        self.opts.open.gc = if background {
            GcMode::Background
        } else {
            GcMode::Manual
        };
        self
    }

    /// Threads for crash recovery at open (default 0: one per CPU).
    pub fn recovery_threads(mut self, n: usize) -> Self {
        self.opts.open.recovery_threads = n;
        self
    }

    /// How the pool is mapped (default [`Mode::Mapped`]).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.opts.open.mode = mode;
        self
    }

    /// Opens without writing the pool; writes are refused.
    pub fn read_only(mut self, yes: bool) -> Self {
        self.opts.open.read_only = yes;
        self
    }

    /// Opens the store in `dir`, creating the directory and the store if
    /// they do not exist, and recovering it if it was not closed.
    pub fn open(&self, dir: impl AsRef<Path>) -> Result<Store> {
        Ok(Store {
            inner: store::Store::open(dir.as_ref(), self.opts.clone())?,
        })
    }
}

/// A persistent key-value store of byte keys (up to [`MAX_KEY`](crate::MAX_KEY)
/// bytes) and byte values (up to [`MAX_VALUE`](crate::MAX_VALUE) bytes),
/// ordered for range scans. `Send + Sync`: share it between threads.
///
/// Dropping a store closes it (errors ignored; call [`close`](Store::close)
/// to see them).
pub struct Store {
    inner: store::Store,
}

impl Store {
    /// The builder, with the defaults of [`StoreOptions::new`].
    pub fn options() -> StoreOptions {
        StoreOptions::new()
    }

    /// Opens (or creates) the store in `dir` with the default options.
    pub fn open(dir: impl AsRef<Path>) -> Result<Store> {
        StoreOptions::new().open(dir)
    }

    /// Stores `value` under `key`, replacing any value it had.
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.inner.put(key, value)
    }

    /// Stores `value` under `key` if the key is absent: `Ok(false)` (and
    /// nothing written) if it is present.
    pub fn insert(&self, key: &[u8], value: &[u8]) -> Result<bool> {
        self.inner.insert(key, value)
    }

    /// Replaces the value of a present key: `Ok(false)` if it is absent.
    pub fn update(&self, key: &[u8], value: &[u8]) -> Result<bool> {
        self.inner.update(key, value)
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.inner.get(key)
    }

    /// The value of `key` into `out` (cleared first), reusing its buffer:
    /// `Ok(false)` if the key is absent. A key longer than [`MAX_KEY`] is
    /// an error, as for [`get`](Self::get).
    pub fn get_into(&self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        if key.len() > MAX_KEY {
            // The engine's fast path answers absent; users get `get`'s error.
            return self.inner.get(key).map(|_| false);
        }
        self.inner.get_into(key, out)
    }

    /// Removes `key`: `Ok(false)` if it is absent.
    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        self.inner.delete(key)
    }

    /// Applies the writes in order, as one: each pair is `(key, Some(value))`
    /// for a put or `(key, None)` for a delete. Under strict durability one
    /// fence covers them all. On `Err` a prefix of the batch is written;
    /// the message says how many.
    pub fn write_batch(&self, ops: &[(&[u8], Option<&[u8]>)]) -> Result<()> {
        self.inner.write_batch(ops).map_err(|b| match b.error {
            Error::OutOfSpace(m) => {
                Error::OutOfSpace(format!("{m} (after {} writes of the batch)", b.done))
            }
            Error::InvalidArgument(m) => {
                Error::InvalidArgument(format!("{m} (after {} writes of the batch)", b.done))
            }
            other => other,
        })
    }

    /// Up to `limit` pairs with keys from `start` (inclusive) to `end`
    /// (exclusive; `None`: no end), in key order.
    pub fn scan(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.inner.scan(start, end, limit)
    }

    /// Calls `f` for every pair, in no particular order.
    pub fn for_each(&self, f: impl FnMut(&[u8], &[u8])) -> Result<()> {
        self.inner.for_each(f)
    }

    /// Number of keys.
    pub fn len(&self) -> u64 {
        self.inner.len()
    }

    /// Whether the store holds no key.
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    /// Keys, log files, bytes and garbage-collection figures.
    pub fn stats(&self) -> StoreStats {
        self.inner.stats()
    }

    /// Makes every completed write durable (under strict durability each
    /// already is).
    pub fn sync(&self) -> Result<()> {
        self.inner.sync()
    }

    /// Runs garbage collection now: reclaims up to `max_files` log files
    /// past the threshold; returns how many it reclaimed.
    pub fn gc(&self, max_files: usize) -> Result<usize> {
        self.inner.gc(max_files)
    }

    /// Walks the log and the index read-only and checks them: returns the
    /// keys found.
    pub fn check(&self) -> Result<u64> {
        Ok(self.inner.check()?.0)
    }

    /// Persists everything and marks the store clean, so the next open
    /// skips the log scan.
    pub fn close(self) -> Result<()> {
        self.inner.close()
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // `close` is idempotent: after an explicit close this does nothing.
        let _ = self.inner.close();
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("dir", &self.inner.dir())
            .field("len", &self.inner.len())
            .finish()
    }
}
