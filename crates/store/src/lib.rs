//! pmhash's key-value store: the NStore design on persistent memory.
//!
//! - **Nlog** ([`nlog`]): per (node, hash cluster) append logs of fixed-size
//!   files inside one pool; a write goes to the writer's own node. Format in
//!   [`layout`].
//! - **Index** ([`index`]): a DRAM ordered index (a concurrent skip list)
//!   from key to the `v_addr` of its newest entry; scans walk it.
//! - **RAF cache** ([`raf`]): hot items in DRAM, remote reads weighted by
//!   the remote/local latency ratio, off when it does not pay.
//! - **GC** ([`gc`]): two-phase, history marking through `h_addr`, files
//!   freed only after an epoch ([`epoch`]).
//! - **Recovery** ([`recover`]): a clean-shutdown image, or a parallel log
//!   scan by cluster.
//! - **NUMA** ([`numa`]): real nodes or `numa_emulate` virtual ones, with
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

pub mod crc;
pub mod engine_impl;
pub mod epoch;
pub mod gc;
pub mod index;
mod inner;
pub mod layout;
pub mod nlog;
pub mod numa;
mod options;
pub mod pindex;
pub mod point_map;
pub mod raf;
mod read;
mod readers;
pub mod recover;
mod scan;
mod stats;
mod store;
mod write;

pub use engine_impl::spec;
pub use layout::{LAYOUT, MAX_KEY, MAX_VALUE, POOL_FILE};
pub use options::{CreateOptions, GcMode, IndexKind, OpenOptions, Options};
pub use recover::Dropped;
pub use stats::{OpenedFrom, StoreStats};
pub use store::Store;
pub use write::BatchError;
