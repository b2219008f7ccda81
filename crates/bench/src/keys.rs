//! Benchmark keys: distinct random 64-bit values, made before any timing.
//!
//! Key number `i` of a seed is `mix64(base + i * GAMMA)` with
//! `base = mix64(seed)`. Multiplying by the odd `GAMMA`, adding `base` and
//! `mix64` are all bijections on `u64`, so different numbers always give
//! different keys: no hash set, no retries, and the three sets below
//! (numbers `0..n`, `n..2n`, `2n..`) are disjoint by construction.

use crate::rng::{mix64, GAMMA};

/// The keys of one benchmark invocation.
#[derive(Clone, Debug)]
pub(crate) struct KeySet {
    /// Keys loaded into the engine (or inserted by the `insert` workload).
    pub loaded: Vec<u64>,
    /// Keys known to be absent: the negative gets look these up.
    pub absent: Vec<u64>,
    /// Keys that workloads with inserts (YCSB D and E) add during the run;
    /// disjoint from both sets above.
    pub fresh: Vec<u64>,
}

impl KeySet {
    /// `loaded` keys, as many absent ones, and `fresh` keys for inserts
    /// during a run, all distinct, all fixed by `seed`. Fails cleanly when
    /// the arrays do not fit in memory.
    pub(crate) fn generate(seed: u64, loaded: usize, fresh: usize) -> Result<KeySet, String> {
        let space = KeySpace::new(seed);
        let n = loaded as u64;
        let make = |from: u64, count: usize| -> Result<Vec<u64>, String> {
            let mut v = Vec::new();
            v.try_reserve_exact(count).map_err(|_| {
                format!(
                    "not enough memory for {count} keys ({} bytes)",
                    count as u128 * 8
                )
            })?;
            v.extend((from..from + count as u64).map(|i| space.key(i)));
            Ok(v)
        };
        Ok(KeySet {
            loaded: make(0, loaded)?,
            absent: make(n, loaded)?,
            fresh: make(2 * n, fresh)?,
        })
    }

    /// Key number `index` of the "insertion order": the loaded keys, then the
    /// fresh ones. Used by YCSB D/E, where reads may reach keys inserted
    /// during the run. `index` must be below `loaded.len() + fresh.len()`.
    #[inline]
    pub(crate) fn in_insert_order(&self, index: u64) -> u64 {
        let n = self.loaded.len() as u64;
        if index < n {
            self.loaded[index as usize]
        } else {
            self.fresh[(index - n) as usize]
        }
    }
}

/// The value the untimed load (and the `insert` workload) stores for `key`,
/// so that positive gets can verify what they read.
#[inline]
pub(crate) fn load_value(key: u64) -> u64 {
    key.rotate_left(29) ^ 0xA5A5_5A5A_0F0F_F0F0
}

/// The numbered key sequence of one seed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeySpace {
    base: u64,
}

impl KeySpace {
    /// The sequence for `seed`.
    pub(crate) fn new(seed: u64) -> KeySpace {
        KeySpace { base: mix64(seed) }
    }

    /// Key number `i`; distinct `i` give distinct keys.
    #[inline]
    pub(crate) fn key(&self, i: u64) -> u64 {
        mix64(self.base.wrapping_add(i.wrapping_mul(GAMMA)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn keys_are_distinct_and_sets_disjoint() {
        let ks = KeySet::generate(12345, 50_000, 10_000).unwrap();
        assert_eq!(ks.loaded.len(), 50_000);
        assert_eq!(ks.absent.len(), 50_000);
        assert_eq!(ks.fresh.len(), 10_000);
        let loaded: HashSet<u64> = ks.loaded.iter().copied().collect();
        assert_eq!(loaded.len(), ks.loaded.len(), "loaded keys repeat");
        let absent: HashSet<u64> = ks.absent.iter().copied().collect();
        assert_eq!(absent.len(), ks.absent.len(), "absent keys repeat");
        assert!(
            ks.absent.iter().all(|k| !loaded.contains(k)),
            "negative key among loaded"
        );
        assert!(
            ks.fresh
                .iter()
                .all(|k| !loaded.contains(k) && !absent.contains(k)),
            "fresh key overlaps"
        );
        let fresh: HashSet<u64> = ks.fresh.iter().copied().collect();
        assert_eq!(fresh.len(), ks.fresh.len());
    }

    #[test]
    fn keys_look_random_and_depend_on_the_seed() {
        let a = KeySet::generate(1, 1000, 0).unwrap();
        let b = KeySet::generate(2, 1000, 0).unwrap();
        assert_eq!(a.loaded, KeySet::generate(1, 1000, 0).unwrap().loaded);
        assert_ne!(a.loaded, b.loaded);
        // Top bits spread: each of the 16 top-nibble buckets gets some keys.
        let mut buckets = [0u32; 16];
        for k in &a.loaded {
            buckets[(k >> 60) as usize] += 1;
        }
        assert!(buckets.iter().all(|&c| c > 30), "{buckets:?}");
    }

    #[test]
    fn absurd_sizes_fail_cleanly() {
        assert!(KeySet::generate(1, usize::MAX / 16, 0).is_err());
    }

    #[test]
    fn insert_order_spans_loaded_then_fresh() {
        let ks = KeySet::generate(9, 10, 5).unwrap();
        assert_eq!(ks.in_insert_order(0), ks.loaded[0]);
        assert_eq!(ks.in_insert_order(9), ks.loaded[9]);
        assert_eq!(ks.in_insert_order(10), ks.fresh[0]);
        assert_eq!(ks.in_insert_order(14), ks.fresh[4]);
    }
}
