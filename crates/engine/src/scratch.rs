//! Scratch pieces the tests and the fuzzer share: a seeded RNG and
//! unique temp files and directories removed on drop.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// splitmix64: small, seeded, good enough for workloads.
pub struct Rng(pub u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x853c_49e6_748f_ea9b)
    }
    /// The next value (an endless stream, so not an `Iterator`).
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// A value in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// A uniform float in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// An index in 0..n, log-uniform (Zipf-like with exponent ~1): index 0
    /// is drawn about as often as all of 1..e together.
    pub fn skewed(&mut self, n: u64) -> u64 {
        let x = (n as f64).powf(self.unit()) - 1.0;
        (x as u64).min(n - 1)
    }
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A unique path under the temp dir (`{prefix}-{pid}-{tag}-{n}.pool`),
/// removed (if it exists) on drop.
pub struct TempPath(PathBuf);

impl TempPath {
    /// A fresh path (any file there is removed first).
    pub fn new(prefix: &str, tag: &str) -> TempPath {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let p =
            std::env::temp_dir().join(format!("{prefix}-{}-{tag}-{n}.pool", std::process::id()));
        let _ = std::fs::remove_file(&p);
        TempPath(p)
    }
    /// The path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A unique scratch directory path under the temp dir (not created),
/// removed with its contents on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// A fresh directory path (any directory there is removed first).
    pub fn new(prefix: &str, tag: &str) -> TempDir {
        let p = TempPath::new(prefix, tag);
        let dir = p.path().with_extension("d");
        let _ = std::fs::remove_dir_all(&dir);
        TempDir(dir)
    }
    /// The path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
