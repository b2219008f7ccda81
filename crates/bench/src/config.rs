//! The benchmark plan: [`BenchConfig`] (what `BenchArgs` turns into),
//! [`Sizing`] (how engines and pool files are sized at creation), the
//! pool file size rules, and which engine is the store engine that runs
//! the store's own workloads.

use std::path::PathBuf;

use engine::{Durability, EngineKind, EngineSpec};

use crate::dist::Dist;
use crate::workload::Workload;

const MIB: u64 = 1 << 20;
const MAX_POOL: u64 = 20 << 30;

/// A validated benchmark plan (what `BenchArgs` turns into).
#[derive(Clone)]
pub struct BenchConfig {
    /// Engines to run, in order.
    pub engines: Vec<EngineSpec>,
    pub workloads: Vec<Workload>,
    /// Keys loaded before each run (inserted by `insert`).
    pub keys: u64,
    /// Operations per run (see [`Workload::op_count`]).
    pub ops: u64,
    /// Thread counts; every engine and workload runs with each.
    pub threads: Vec<usize>,
    pub dist: Dist,
    pub theta: f64,
    pub mode: pmem::Mode,
    pub durability: Durability,
    /// Directory for the pool files.
    pub pool_dir: PathBuf,
    pub seed: u64,
    /// Repetitions of each run; the report keeps the median.
    pub repeat: usize,
    /// What the engines, the store and the pool files are sized for.
    pub sizing: Sizing,
    /// Bytes per key of the store's runs (8 or more).
    pub key_size: usize,
    /// Bytes per value of the store's runs (8 or more).
    pub value_size: usize,
    /// Virtual NUMA nodes of the store (`None`: the machine's nodes).
    pub numa_emulate: Option<u32>,
    /// The store's `OpenOptions::inline_values`.
    pub inline_values: bool,
    /// The store's `OpenOptions::verify_checksums`.
    pub verify_checksums: bool,
}

/// How a run's engine (or store) and its pool file are sized at creation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sizing {
    /// Created for this many keys (the engines' default, 1024, unless
    /// `--initial-capacity` says otherwise): the load or the insert
    /// workload grows the table, and the pool file starts at the default
    /// size and grows with it.
    Grown(u64),
    /// Created for `--keys` (`--presized`): no table grows while the keys
    /// go in, and the pool file is made big enough up front.
    Presized,
}

impl Sizing {
    /// The `initial_capacity` an engine is created with.
    pub fn initial_capacity(self, keys: u64) -> u64 {
        match self {
            Sizing::Grown(n) => n,
            Sizing::Presized => keys,
        }
    }

    /// `"grown"` or `"pre-sized"`.
    pub fn name(self) -> &'static str {
        match self {
            Sizing::Grown(_) => "grown",
            Sizing::Presized => "pre-sized",
        }
    }

    /// One line for the report: "grown from 1024 keys" or "pre-sized for
    /// 2000000 keys".
    pub fn describe(self, keys: u64) -> String {
        match self {
            Sizing::Grown(n) => format!("grown from {n} keys"),
            Sizing::Presized => format!("pre-sized for {keys} keys"),
        }
    }
}

impl BenchConfig {
    /// Whether `workload` runs on `spec`: the store workloads only on the
    /// store engine, the others on every engine.
    pub fn runs_on(workload: Workload, spec: &EngineSpec) -> bool {
        !workload.store_only() || is_store(spec)
    }

    /// Runs this plan makes (engine × workload × threads × repetitions,
    /// without the skipped pairs).
    pub fn runs(&self) -> usize {
        let pairs = self
            .engines
            .iter()
            .flat_map(|s| self.workloads.iter().map(move |&w| (w, s)))
            .filter(|(w, s)| BenchConfig::runs_on(*w, s))
            .count();
        pairs * self.threads.len() * self.repeat
    }

    /// Operations the runs of this plan are to do, all together (what the
    /// progress display counts).
    pub fn planned_ops(&self) -> u64 {
        let one_pass: u64 = self
            .engines
            .iter()
            .flat_map(|s| self.workloads.iter().map(move |&w| (w, s)))
            .filter(|(w, s)| BenchConfig::runs_on(*w, s))
            .map(|(w, _)| w.op_count(self.keys, self.ops))
            .sum();
        one_pass * (self.threads.len() * self.repeat) as u64
    }

    /// What `run` leaves out, as a note ("put100, recovery run only on the
    /// store engine; skipped for level, hmeh"), or `None`.
    pub fn skipped(&self) -> Option<String> {
        let works: Vec<&str> = self
            .workloads
            .iter()
            .filter(|w| w.store_only())
            .map(|w| w.name())
            .collect();
        let others: Vec<&str> = self
            .engines
            .iter()
            .filter(|s| !is_store(s))
            .map(|s| s.name)
            .collect();
        (!works.is_empty() && !others.is_empty()).then(|| {
            format!(
                "note: {} {} only on the store engine; skipped for {}",
                works.join(", "),
                if works.len() == 1 { "runs" } else { "run" },
                others.join(", ")
            )
        })
    }
}

/// Pool size for `keys` keys: 64 MiB + 128 bytes a key, whole MiB; it may
/// grow to 16 times that, at most 20 GiB.
pub(crate) fn pool_sizes(keys: u64) -> (u64, u64) {
    let size = (64 * MIB)
        .saturating_add(keys.saturating_mul(128))
        .div_ceil(MIB)
        * MIB;
    (size, size.saturating_mul(16).min(MAX_POOL).max(size))
}

/// The pool file of a run that will hold `keys` keys: (size at create,
/// largest size).
///
/// Pre-sized: [`pool_sizes`], so the file never grows. Grown: the size a
/// pool gets when its user sizes nothing (`PoolOptions::default().size`,
/// 64 MiB), so a
/// grown run also pays for growing the file (extension and remap) as
/// the tables grow. Its largest size is the pre-sized rule's: the default
/// options (`max_size` 0) would not let the pool grow at all, and a run
/// that stops with a full pool measures nothing.
pub(crate) fn pool_file_sizes(sizing: Sizing, keys: u64) -> (u64, u64) {
    let (size, max_size) = pool_sizes(keys);
    match sizing {
        Sizing::Presized => (size, max_size),
        Sizing::Grown(_) => {
            let first = pmem::PoolOptions::default().size;
            (first, max_size.max(first))
        }
    }
}

/// Whether `spec` is the store engine `store` (driven directly by
/// the `store_run` module). Other engine forms of the store (other point
/// indexes, under other names) run through their `Engine` like any engine.
pub(crate) fn is_store(spec: &EngineSpec) -> bool {
    let own = store::spec();
    spec.name == own.name
        && matches!(spec.kind, EngineKind::Persistent { layout, .. } if layout == store::LAYOUT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_size_rule() {
        assert_eq!(pool_sizes(0), (64 * MIB, 1024 * MIB));
        let (s, m) = pool_sizes(2_000_000);
        assert_eq!(s, (64 * MIB + 256_000_000).div_ceil(MIB) * MIB);
        assert_eq!(m, 16 * s);
        assert_eq!(pool_sizes(1 << 26).1, MAX_POOL);
        // A pool bigger than the cap may still be created; it just won't grow.
        let (s, m) = pool_sizes(1 << 30);
        assert_eq!(m, s);
    }
}
