//! Concurrent tests: writer threads whose panic fails the test instead of
//! leaving the readers spinning.

use std::sync::atomic::{AtomicBool, Ordering};

/// Joins every writer thread, then raises `done` (the flag readers loop
/// on) before passing on the first writer's panic: a failing writer fails
/// its test instead of leaving the readers spinning and the test hung.
pub fn join_then_stop<T>(
    writers: Vec<std::thread::ScopedJoinHandle<'_, T>>,
    done: &AtomicBool,
) -> Vec<T> {
    let joined: Vec<_> = writers.into_iter().map(|h| h.join()).collect();
    done.store(true, Ordering::Release);
    joined
        .into_iter()
        .map(|r| r.unwrap_or_else(|p| std::panic::resume_unwind(p)))
        .collect()
}
