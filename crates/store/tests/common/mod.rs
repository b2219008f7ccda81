//! Helpers shared by the store's test files.

use store::{GcMode, Options};

/// Small files and few clusters, so that files fill and GC has work.
pub fn small_opts() -> Options {
    Options {
        pool_size: 4 << 20,
        max_pool_size: 64 << 20,
        clusters: 4,
        extent_size: 4096,
        nodes: Some(1),
        gc: GcMode::Manual,
        raf_bytes: 64 << 10,
        recovery_threads: 2,
        ..Options::default()
    }
}
