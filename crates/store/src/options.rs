//! What a store is opened with: its [`Options`], the kind of point index
//! ([`IndexKind`]) and how garbage collection runs ([`GcMode`]).

use engine::{Durability, EngineSpec, Error, Result};
use pmem::{Mode, PoolOptions};

use crate::layout::*;

/// What the store's point index is (the spec's options a, b, c).
#[derive(Clone, Copy)]
pub enum IndexKind {
    /// (a) DRAM hash table for point operations plus the ordered tree for
    /// scans, rebuilt at open from the shutdown image or the log.
    Dram,
    /// (b) A persistent hash engine in the same pool: open takes what the
    /// engine's open takes. No ordered index: scans are refused.
    Hash(EngineSpec),
    /// (c) The persistent hash engine plus the ordered tree, built in the
    /// background after open (scans wait for it).
    Both(EngineSpec),
}

impl IndexKind {
    /// The root block's `index` word: 0 dram, 1 hash, 2 both.
    pub fn code(&self) -> u64 {
        match self {
            IndexKind::Dram => 0,
            IndexKind::Hash(_) => 1,
            IndexKind::Both(_) => 2,
        }
    }
    /// The persistent hash engine, `None` for the DRAM index.
    pub fn spec(&self) -> Option<EngineSpec> {
        match self {
            IndexKind::Dram => None,
            IndexKind::Hash(s) | IndexKind::Both(s) => Some(*s),
        }
    }
    /// Whether there is an ordered index (scans are served).
    pub fn ordered(&self) -> bool {
        !matches!(self, IndexKind::Hash(_))
    }
    /// `"dram"`, `"hash:E"` or `"both:E"`.
    pub fn describe(&self) -> String {
        match self {
            IndexKind::Dram => "dram".into(),
            IndexKind::Hash(s) => format!("hash:{}", s.name),
            IndexKind::Both(s) => format!("both:{}", s.name),
        }
    }
}

impl std::fmt::Debug for IndexKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

/// When GC runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GcMode {
    /// A background thread reclaims files past the threshold.
    Background,
    /// Only [`Store::gc`](crate::Store::gc) reclaims.
    Manual,
}

/// Store options: the settings fixed in the pool at create
/// ([`CreateOptions`]) and those each open applies ([`OpenOptions`]).
///
/// An open of an existing store ignores every create setting except
/// [`CreateOptions::index`], which it checks against the index the store
/// was created with.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Fixed in the pool and the log's format at create.
    pub create: CreateOptions,
    /// Applied by every open, the one that creates the store included.
    pub open: OpenOptions,
}

/// The settings a store is created with, fixed in its pool (an existing
/// store ignores them, except `index`, which an open checks).
#[derive(Clone, Debug)]
pub struct CreateOptions {
    /// Pool size at create.
    pub pool_size: u64,
    /// Hash clusters per node (the paper's default is 256).
    pub clusters: u32,
    /// Bytes per Nlog file (the paper's 8 MB).
    pub extent_size: u64,
    /// Log nodes at create; `None`: the real node count, or
    /// `OpenOptions::numa_emulate`.
    pub nodes: Option<u32>,
    /// The point index (fixed at create; an open that names another one is
    /// refused).
    pub index: IndexKind,
    /// Fixed pool uuid (reproducible test runs).
    pub uuid: Option<[u8; 16]>,
}

/// The settings every open applies.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    /// Pool mode (`mapped` by default; `dax` on real PM).
    pub mode: Mode,
    /// The pool grows up to this size (0: 16 × `CreateOptions::pool_size`).
    pub max_pool_size: u64,
    /// Virtual nodes on a one-node machine.
    pub numa_emulate: Option<u32>,
    /// Busy wait added to each remote log access (ns).
    pub remote_latency_ns: u64,
    /// Remote / local read latency, the RAF weight (the paper measured 1.59).
    pub remote_ratio: f64,
    /// When a write is durable: `Strict` before it returns, `Relaxed` at
    /// the next [`Store::sync`](crate::Store::sync).
    pub durability: Durability,
    /// Reclaim a file once this fraction of its bytes is dead.
    pub gc_threshold: f64,
    /// When GC runs.
    pub gc: GcMode,
    /// RAF capacity in bytes (0: no cache).
    pub raf_bytes: u64,
    /// Operations per RAF auto-disable window.
    pub raf_window: u64,
    /// Threads for crash recovery (0: all CPUs).
    pub recovery_threads: usize,
    /// Reader threads per node for scans (0: the scanning thread reads).
    pub scan_readers: usize,
    /// Open without writing the pool.
    pub read_only: bool,
    /// Expected number of keys: sizes the persistent hash engine (when it
    /// is created), and the DRAM point index (up to 2^26 keys) so that
    /// loading it never resizes.
    pub expected_keys: u64,
    /// The 8-byte fast path: an 8-byte key's 8-byte value is also kept in
    /// the DRAM point index, so its get reads no log entry (the log stays
    /// the only durable copy). Off: every get reads the log, as in NStore.
    pub inline_values: bool,
    /// Reads check the checksum of the log entry they return a value from
    /// (a get of a corrupt entry is an `Err`, never wrong bytes). On by
    /// default; off saves the checksum (and a file lookup) per log read.
    /// Values the point index holds inline and cached values came from
    /// checked entries.
    pub verify_checksums: bool,
}

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions {
            pool_size: 256 << 20,
            clusters: 256,
            extent_size: 8 << 20,
            nodes: None,
            uuid: None,
            index: IndexKind::Dram,
        }
    }
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            mode: Mode::Mapped,
            max_pool_size: 0,
            numa_emulate: None,
            remote_latency_ns: 0,
            remote_ratio: 1.59,
            durability: Durability::Strict,
            gc_threshold: 0.5,
            gc: GcMode::Background,
            raf_bytes: 64 << 20,
            raf_window: 1 << 16,
            recovery_threads: 0,
            scan_readers: 0,
            read_only: false,
            expected_keys: 1 << 20,
            inline_values: true,
            verify_checksums: true,
        }
    }
}

impl Options {
    pub(crate) fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
        if self.create.clusters == 0 || self.create.clusters as u64 > MAX_CLUSTERS {
            return bad(format!("clusters must be 1..={MAX_CLUSTERS}"));
        }
        if self.create.extent_size < MIN_EXTENT
            || self.create.extent_size > MAX_EXTENT
            || !self.create.extent_size.is_multiple_of(64)
        {
            return bad(format!(
                "extent_size must be a multiple of 64 in {MIN_EXTENT}..={MAX_EXTENT}"
            ));
        }
        if let Some(n) = self.create.nodes.or(self.open.numa_emulate) {
            if n == 0 || n as u64 > MAX_NODES {
                return bad(format!("nodes must be 1..={MAX_NODES}"));
            }
        }
        if !(self.open.gc_threshold > 0.0 && self.open.gc_threshold <= 1.0) {
            return bad("gc_threshold must be in (0, 1]".into());
        }
        Ok(())
    }

    pub(crate) fn pool_options(&self) -> PoolOptions {
        PoolOptions {
            mode: self.open.mode,
            size: self.create.pool_size,
            max_size: if self.open.max_pool_size == 0 {
                self.create.pool_size.saturating_mul(16)
            } else {
                self.open.max_pool_size
            },
            layout: LAYOUT.into(),
            allow_dax_fallback: true,
            read_only: self.open.read_only,
            uuid: self.create.uuid,
        }
    }
}
