//! The event loops' figures for `INFO`: one [`WorkerStats`] per loop,
//! written only by that loop and read by any thread.

use std::sync::atomic::{AtomicU64, Ordering};

/// A counter one loop writes and any thread reads: a plain load and store,
/// no locked instruction on the request path.
#[derive(Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    pub(crate) fn set(&self, n: u64) {
        self.0.store(n, Ordering::Relaxed);
    }

    pub(crate) fn add(&self, n: u64) {
        self.0
            .store(self.0.load(Ordering::Relaxed) + n, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// One loop's figures for `INFO`.
#[derive(Default)]
pub(crate) struct WorkerStats {
    pub(crate) net_in: Counter,
    pub(crate) net_out: Counter,
    /// Connections closed because their input could not be charged.
    pub(crate) closed_for_input: Counter,
    /// Persist fences and flushed lines the loop's thread has issued
    /// (the store's writes run on it).
    pub(crate) fences: Counter,
    pub(crate) flushes: Counter,
}
