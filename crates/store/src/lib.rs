//! pmhash's key-value store: the NStore design on persistent memory.
//!
//! - **Nlog** (`nlog.rs`): per (node, hash cluster) append logs of fixed-size
//!   files inside one pool; a write goes to the writer's own node. Format in
//!   `layout.rs`.
//! - **Index** (`index.rs`): a DRAM ordered index (a concurrent skip list)
//!   from key to the `v_addr` of its newest entry; scans walk it.
//! - **RAF cache** (`raf.rs`): hot items in DRAM, remote reads weighted by
//!   the remote/local latency ratio, off when it does not pay.
//! - **GC** (`gc.rs`): two-phase, history marking through `h_addr`, files
//!   freed only after an epoch (`epoch.rs`).
//! - **Recovery** (`recover.rs`): a clean-shutdown image, or a parallel log
//!   scan by cluster.
//! - **NUMA** (`numa.rs`): real nodes or `numa_emulate` virtual ones, with
//!   exact local/remote access counters.
//!
//! - **The facade** (`store.rs`, [`Store`]: open, close, sync, GC, stats),
//!   the write path (`write.rs`) and the read path (`read.rs`), over the
//!   state every part shares (`inner.rs`), with the options (`options.rs`: [`Options`],
//!   [`IndexKind`], [`GcMode`]), the figures (`stats.rs`: [`StoreStats`],
//!   [`OpenedFrom`]) and the range scans' reader threads (`scan.rs`,
//!   `readers.rs`). No module imports itself back through others.
//!
//! `docs/store.md` has the formats, persist orders, the spec's eleven gaps
//! (F1–F11) and how each is closed, and the tuning knobs.

mod blocks;
mod crc;
pub mod engine_impl;
mod epoch;
mod files;
mod gc;
mod index;
mod inner;
mod layout;
mod nlog;
mod numa;
mod options;
mod pindex;
mod point_map;
mod raf;
mod read;
mod readers;
mod recover;
mod scan;
mod stats;
mod store;
mod write;

pub use engine_impl::spec;
pub use layout::{
    entry_len, key_hash, lens_word, FORMAT, LAYOUT, MAX_KEY, MAX_VALUE, MIN_EXTENT, POOL_FILE,
    X_DATA,
};
pub use numa::{detect_nodes, emulated_node};
pub use options::{CreateOptions, GcMode, IndexKind, OpenOptions, Options};
pub use recover::Dropped;
pub use stats::{OpenedFrom, StoreStats};
pub use store::Store;
pub use write::BatchError;
