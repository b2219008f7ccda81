//! Helpers shared by the pmem integration tests: unique temp files that
//! delete themselves, a small deterministic RNG, and file snapshots.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use pmhash_pmem::{Mode, PoolOptions};

pub(crate) const KIB: u64 = 1 << 10;
pub(crate) const MIB: u64 = 1 << 20;

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A unique path under the temp dir, removed (if it exists) on drop.
pub(crate) struct TempPath(PathBuf);

impl TempPath {
    pub(crate) fn new(tag: &str) -> TempPath {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!(
            "pmem-test-{}-{}-{}.pool",
            std::process::id(),
            tag,
            n
        ));
        let _ = std::fs::remove_file(&p);
        TempPath(p)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Options for a `mapped` pool of `size` bytes that may grow to `max_size`.
pub(crate) fn mapped(size: u64, max_size: u64, layout: &str) -> PoolOptions {
    PoolOptions {
        mode: Mode::Mapped,
        size,
        max_size,
        layout: layout.to_string(),
        ..PoolOptions::default()
    }
}

/// Options for a `simulated` pool.
pub(crate) fn simulated(size: u64, max_size: u64, layout: &str) -> PoolOptions {
    PoolOptions {
        mode: Mode::Simulated,
        size,
        max_size,
        layout: layout.to_string(),
        ..PoolOptions::default()
    }
}

/// The whole file, for before/after comparisons.
pub(crate) fn file_bytes(p: &Path) -> Vec<u8> {
    std::fs::read(p).expect("read pool file")
}

/// Asserts the file still holds exactly `before` (length and every byte).
#[track_caller]
pub(crate) fn assert_file_is(p: &Path, before: &[u8], what: &str) {
    let after = file_bytes(p);
    assert_eq!(after.len(), before.len(), "{what}: file length changed");
    if after != before {
        let first = after.iter().zip(before).position(|(a, b)| a != b).unwrap();
        panic!("{what}: file modified, first difference at byte {first}");
    }
}

/// splitmix64: small, deterministic, good enough for test inputs.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    pub(crate) fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let w = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&w[..chunk.len()]);
        }
    }
}

/// The byte pattern stored in a block at `off` of `len` bytes with `tag`:
/// depends on the offset, so a block written at the wrong place shows.
pub(crate) fn pattern(off: u64, len: usize, tag: u64) -> Vec<u8> {
    let mut r = Rng::new(
        off.wrapping_mul(31)
            .wrapping_add(tag)
            .wrapping_add(len as u64),
    );
    let mut v = vec![0u8; len];
    r.fill(&mut v);
    v
}

/// CRC-32 (IEEE, reflected, as `crc32fast`), for crafting on-disk records.
pub(crate) fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A 64-byte allocator lane record (docs/format.md) with a valid CRC.
pub(crate) fn lane_record(state: u64, block: u64, info: u64, owner: u64, value: u64) -> [u8; 64] {
    let mut b = [0u8; 64];
    for (i, w) in [state, block, info, owner, value].iter().enumerate() {
        b[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
    }
    let c = crc32(&b[..60]);
    b[60..64].copy_from_slice(&c.to_le_bytes());
    b
}
