//! What a store reports: [`StoreStats`] and how its last open found the
//! index ([`OpenedFrom`]).

/// How an open found the index.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OpenedFrom {
    /// The pool was new: the store was created.
    #[default]
    Created,
    /// A clean close's index image was loaded.
    Image,
    /// The index was rebuilt by scanning the log (after a crash, or with
    /// no usable image).
    LogScan,
    /// The persistent hash index was opened in place (`IndexKind::Hash`).
    HashIndex,
}

impl OpenedFrom {
    /// The name `inspect` and the server's `INFO` print: "created",
    /// "image", "log scan" or "hash index".
    pub fn name(self) -> &'static str {
        match self {
            OpenedFrom::Created => "created",
            OpenedFrom::Image => "image",
            OpenedFrom::LogScan => "log scan",
            OpenedFrom::HashIndex => "hash index",
        }
    }
}

impl std::fmt::Display for OpenedFrom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Figures for `inspect`, the benchmark and tests.
#[derive(Clone, Debug, Default)]
pub struct StoreStats {
    /// Keys present.
    pub keys: u64,
    /// Nlog files (extents) in use.
    pub files: u64,
    /// Bytes of entries written and not yet reclaimed.
    pub log_bytes: u64,
    /// Of those, bytes holding a key's newest value.
    pub live_bytes: u64,
    /// `log_bytes / live_bytes`: 1.0 for an empty log, infinite when the log
    /// holds only dead entries (JSON writes it as null).
    pub space_amplification: f64,
    /// Bytes of the pool.
    pub pm_bytes: u64,
    /// GC passes run.
    pub gc_runs: u64,
    /// Nlog files GC freed.
    pub files_reclaimed: u64,
    /// Live entries GC copied out of files it freed.
    pub entries_relocated: u64,
    /// Entries GC marked invalid in place.
    pub entries_marked: u64,
    /// Whether the RAF cache is on now.
    pub raf_enabled: bool,
    /// Gets served by the RAF cache.
    pub raf_hits: u64,
    /// Items in the RAF cache.
    pub raf_items: u64,
    /// Entry reads on the reader's own node.
    pub local_reads: u64,
    /// Entry reads on another node.
    pub remote_reads: u64,
    /// Writes to the writer's own node.
    pub local_writes: u64,
    /// Writes to another node.
    pub remote_writes: u64,
    /// NUMA nodes the log is split over.
    pub nodes: u32,
    /// Hash clusters per node.
    pub clusters: u32,
    /// How the last open found the index.
    pub opened_from: OpenedFrom,
    /// Milliseconds the last open spent recovering.
    pub open_ms: f64,
    /// Log entries the last recovery scanned.
    pub recovered_entries: u64,
    /// The point index's structural changes since open: table rebuilds
    /// of the DRAM index, or the persistent engine's splits and merges.
    pub structural_changes: u64,
    /// Nanoseconds spent in those changes.
    pub structural_nanos: u64,
    /// Bytes of log pages the maintenance thread faulted in ahead of the
    /// writers (0 where the pool is not a file mapping).
    pub log_prefaulted_bytes: u64,
    /// Bytes of the DRAM point index's coming tables that the same thread
    /// faulted in ahead of their rebuilds (0 where it does not run, or
    /// the index is persistent).
    pub index_prefaulted_bytes: u64,
    /// DRAM bytes of the point index (its tables, or the persistent
    /// engine's directory); the ordered tree and the RAF cache are not
    /// counted.
    pub index_dram_bytes: u64,
}
