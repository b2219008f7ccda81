//! DRAM baselines that run in the same harness as the persistent engines,
//! as the ceiling they are measured against.
//!
//! * `hashbrown`: `hashbrown::HashMap<u64, u64>` with its default hasher
//!   (foldhash), not pre-sized. One thread goes through a single
//!   `Mutex<HashMap>` — the lock is never contended, so this measures the
//!   map plus one uncontended lock/unlock per operation. With several threads
//!   the map is split into [`SHARDS`] shards, each behind its own `Mutex`,
//!   chosen by a multiplicative hash of the key (independent of foldhash).
//! * `dashmap`: `dashmap::DashMap<u64, u64>` with its default hasher.
//!
//! The shard count follows `EngineConfig::threads`.
//!
//! DRAM use is an estimate: buckets × (16-byte entry + 1 control byte),
//! with buckets derived from the map's capacity (7/8 maximum load, power of
//! two, as hashbrown sizes its tables).

use std::sync::{Mutex, MutexGuard};

use dashmap::DashMap;
use engine::{CheckReport, Engine, EngineKind, EngineSpec, Stats};
use hashbrown::hash_map::Entry;
use hashbrown::HashMap;

/// Registry name of the hashbrown baseline.
pub(crate) const HASHBROWN: &str = "hashbrown";
/// Registry name of the dashmap baseline.
pub(crate) const DASHMAP: &str = "dashmap";
/// Shards of the hashbrown baseline when more than one thread runs.
pub(crate) const SHARDS: usize = 64;

/// Bytes per bucket: a `(u64, u64)` entry plus hashbrown's control byte.
const BUCKET_BYTES: u64 = 16 + 1;

/// The two DRAM baselines as registry entries (`EngineKind::Volatile`).
pub fn baselines() -> Vec<EngineSpec> {
    vec![
        EngineSpec {
            reference: false,
            name: HASHBROWN,
            about:
                "DRAM baseline: hashbrown::HashMap<u64,u64>, default hasher, behind Mutex shards",
            kind: EngineKind::Volatile {
                create: |cfg| {
                    Box::new(ShardedHashbrown::new(if cfg.threads > 1 {
                        SHARDS
                    } else {
                        1
                    }))
                },
            },
        },
        EngineSpec {
            reference: false,
            name: DASHMAP,
            about: "DRAM baseline: dashmap::DashMap<u64,u64>, default hasher",
            kind: EngineKind::Volatile {
                create: |_| Box::new(DashMapEngine::default()),
            },
        },
    ]
}

/// Number of buckets hashbrown allocates to hold `capacity` items.
fn buckets_for(capacity: u64) -> u64 {
    match capacity {
        0 => 0,
        1..=3 => 4,
        4..=7 => 8,
        _ => (capacity * 8 / 7).next_power_of_two(),
    }
}

fn stats_from(len: u64, buckets: u64, detail: Vec<(String, String)>) -> Stats {
    Stats {
        len,
        capacity: buckets,
        load_factor: if buckets == 0 {
            0.0
        } else {
            len as f64 / buckets as f64
        },
        pm_bytes: 0,
        dram_bytes: buckets * BUCKET_BYTES,
        // The maps rehash inside the library, untimed.
        structural_changes: 0,
        structural_nanos: 0,
        detail,
    }
}

/// `hashbrown::HashMap` behind one or more `Mutex` shards.
pub(crate) struct ShardedHashbrown {
    shards: Box<[Mutex<HashMap<u64, u64>>]>,
    /// `64 - log2(shards)`: the shift that takes the shard bits of a key's
    /// multiplicative hash (unused with one shard).
    shift: u32,
}

impl ShardedHashbrown {
    /// A map with `shards` shards (rounded up to a power of two, at least 1).
    pub(crate) fn new(shards: usize) -> ShardedHashbrown {
        let shards = shards.max(1).next_power_of_two();
        ShardedHashbrown {
            shards: (0..shards).map(|_| Mutex::new(HashMap::new())).collect(),
            shift: 64 - shards.trailing_zeros(),
        }
    }

    #[inline]
    fn shard(&self, key: u64) -> MutexGuard<'_, HashMap<u64, u64>> {
        let i = if self.shards.len() == 1 {
            0
        } else {
            (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
        };
        // A panic while holding a shard cannot leave a HashMap half-changed
        // in a way that matters to a benchmark: ignore poisoning.
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    fn each_shard(&self, mut f: impl FnMut(&HashMap<u64, u64>)) {
        for s in self.shards.iter() {
            f(&s.lock().unwrap_or_else(|e| e.into_inner()));
        }
    }
}

impl Engine for ShardedHashbrown {
    fn name(&self) -> &str {
        HASHBROWN
    }

    fn insert(&self, key: u64, value: u64) -> engine::Result<bool> {
        Ok(match self.shard(key).entry(key) {
            Entry::Occupied(_) => false,
            Entry::Vacant(v) => {
                v.insert(value);
                true
            }
        })
    }

    fn get(&self, key: u64) -> Option<u64> {
        self.shard(key).get(&key).copied()
    }

    fn update(&self, key: u64, value: u64) -> engine::Result<bool> {
        Ok(match self.shard(key).get_mut(&key) {
            Some(v) => {
                *v = value;
                true
            }
            None => false,
        })
    }

    fn remove(&self, key: u64) -> engine::Result<bool> {
        Ok(self.shard(key).remove(&key).is_some())
    }

    fn upsert(&self, key: u64, value: u64) -> engine::Result<()> {
        self.shard(key).insert(key, value);
        Ok(())
    }

    fn len(&self) -> u64 {
        let mut n = 0;
        self.each_shard(|m| n += m.len() as u64);
        n
    }

    fn stats(&self) -> Stats {
        let (mut len, mut buckets) = (0, 0);
        self.each_shard(|m| {
            len += m.len() as u64;
            buckets += buckets_for(m.capacity() as u64);
        });
        stats_from(
            len,
            buckets,
            vec![("shards".to_string(), self.shards.len().to_string())],
        )
    }

    fn for_each(&self, f: &mut dyn FnMut(u64, u64)) {
        self.each_shard(|m| m.iter().for_each(|(&k, &v)| f(k, v)));
    }

    fn check(&self) -> engine::Result<CheckReport> {
        Ok(CheckReport {
            keys: self.len(),
            reachable_bytes: 0,
        })
    }
}

/// `dashmap::DashMap` with its default hasher.
#[derive(Default)]
pub(crate) struct DashMapEngine {
    map: DashMap<u64, u64>,
}

impl Engine for DashMapEngine {
    fn name(&self) -> &str {
        DASHMAP
    }

    fn insert(&self, key: u64, value: u64) -> engine::Result<bool> {
        Ok(match self.map.entry(key) {
            dashmap::Entry::Occupied(_) => false,
            dashmap::Entry::Vacant(v) => {
                v.insert(value);
                true
            }
        })
    }

    fn get(&self, key: u64) -> Option<u64> {
        self.map.get(&key).map(|v| *v)
    }

    fn update(&self, key: u64, value: u64) -> engine::Result<bool> {
        Ok(match self.map.get_mut(&key) {
            Some(mut v) => {
                *v = value;
                true
            }
            None => false,
        })
    }

    fn remove(&self, key: u64) -> engine::Result<bool> {
        Ok(self.map.remove(&key).is_some())
    }

    fn upsert(&self, key: u64, value: u64) -> engine::Result<()> {
        self.map.insert(key, value);
        Ok(())
    }

    fn len(&self) -> u64 {
        self.map.len() as u64
    }

    fn stats(&self) -> Stats {
        // DashMap reports the summed usable capacity of its shards; the
        // bucket count is estimated from it as a whole.
        let cap = self.map.capacity() as u64;
        let buckets = if cap == 0 { 0 } else { (cap * 8).div_ceil(7) };
        stats_from(self.map.len() as u64, buckets, Vec::new())
    }

    fn for_each(&self, f: &mut dyn FnMut(u64, u64)) {
        for r in self.map.iter() {
            f(*r.key(), *r.value());
        }
    }

    fn check(&self) -> engine::Result<CheckReport> {
        Ok(CheckReport {
            keys: self.len(),
            reachable_bytes: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::EngineConfig;

    fn exercise(e: &dyn Engine) {
        for k in [0u64, 1, u64::MAX, 12345] {
            assert!(e.insert(k, k ^ 7).unwrap());
            assert!(!e.insert(k, 1).unwrap(), "duplicate insert must be refused");
        }
        assert_eq!(e.len(), 4);
        assert_eq!(e.get(u64::MAX), Some(u64::MAX ^ 7));
        assert_eq!(e.get(99), None);
        assert!(e.update(0, 42).unwrap());
        assert!(!e.update(99, 1).unwrap());
        assert_eq!(e.get(0), Some(42));
        assert!(e.remove(1).unwrap());
        assert!(!e.remove(1).unwrap());
        e.upsert(5, 6).unwrap();
        e.upsert(5, 7).unwrap();
        assert_eq!(e.get(5), Some(7));
        let mut seen = Vec::new();
        e.for_each(&mut |k, _| seen.push(k));
        seen.sort_unstable();
        assert_eq!(seen, vec![0, 5, 12345, u64::MAX]);
        assert_eq!(
            e.check().unwrap(),
            CheckReport {
                keys: 4,
                reachable_bytes: 0
            }
        );
        let s = e.stats();
        assert_eq!(s.len, 4);
        assert!(s.capacity >= 4 && s.dram_bytes >= 4 * 16);
        assert!(s.load_factor > 0.0 && s.load_factor <= 1.0);
    }

    #[test]
    fn baselines_behave_like_engines() {
        let specs = baselines();
        assert_eq!(specs.len(), 2);
        for spec in &specs {
            let EngineKind::Volatile { create } = spec.kind else {
                panic!("{} is not volatile", spec.name)
            };
            for threads in [1, 4] {
                let e = create(&EngineConfig {
                    threads,
                    ..EngineConfig::default()
                });
                assert_eq!(e.name(), spec.name);
                exercise(e.as_ref());
            }
        }
        exercise(&ShardedHashbrown::new(SHARDS));
    }

    #[test]
    fn one_thread_gets_one_lock_several_get_shards() {
        let spec = baselines()[0];
        let EngineKind::Volatile { create } = spec.kind else {
            panic!("not volatile")
        };
        let shards = |threads| {
            let e = create(&EngineConfig {
                threads,
                ..EngineConfig::default()
            });
            e.stats()
                .detail
                .iter()
                .find(|(k, _)| k == "shards")
                .map(|(_, v)| v.clone())
        };
        assert_eq!(shards(1).as_deref(), Some("1"));
        assert_eq!(shards(2).as_deref(), Some("64"));
    }

    #[test]
    fn sharded_map_spreads_keys() {
        let m = ShardedHashbrown::new(SHARDS);
        for k in 0..10_000u64 {
            m.insert(k, k).unwrap();
        }
        let mut empty = 0;
        m.each_shard(|s| empty += usize::from(s.is_empty()));
        assert_eq!(empty, 0);
        assert_eq!(m.len(), 10_000);
    }

    #[test]
    fn bucket_estimate() {
        assert_eq!(buckets_for(0), 0);
        assert_eq!(buckets_for(3), 4);
        assert_eq!(buckets_for(7), 8);
        assert_eq!(buckets_for(14), 16);
        assert_eq!(buckets_for(28), 32);
    }
}
