//! The results of a benchmark: one record per run, the table printed on
//! stdout, and the JSON file.
//!
//! JSON shape: `{"machine": {...}, "runs": [...]}` with one run object per
//! engine × workload × threads. With `--repeat R > 1` each run object is
//! the median of its R repetitions by Mops/s and carries all R of them
//! (same fields, in the order they ran) under `"repeats"`. Runs of the
//! store engine add the fields of [`StoreFigures`] (and `"recovery"` for
//! the recovery workload) to their run object, and a second table.

use serde::Serialize;

use crate::baselines::HASHBROWN;
use crate::machine::Machine;

/// Latency percentiles of the sampled operations, in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Latency {
    /// Median (50th percentile).
    pub p50: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// The slowest sampled operation.
    pub max: u64,
    /// Operations sampled.
    pub samples: u64,
}

impl Latency {
    /// The percentiles of `hist` (values in ns; exact to its significant
    /// figures, 3 for the runs' histograms); all zero when it is empty.
    pub fn from_histogram(hist: &hdrhistogram::Histogram<u64>) -> Latency {
        if hist.is_empty() {
            return Latency::default();
        }
        Latency {
            p50: hist.value_at_quantile(0.50),
            p99: hist.value_at_quantile(0.99),
            p999: hist.value_at_quantile(0.999),
            max: hist.max(),
            samples: hist.len(),
        }
    }
}

/// One timed run of one engine on one workload with one thread count.
#[derive(Clone, Debug, Serialize)]
pub struct RunResult {
    /// The engine's registry name.
    pub engine: String,
    /// The workload's name.
    pub workload: String,
    /// Worker threads.
    pub threads: usize,
    /// Keys loaded (or inserted, for the `insert` workload).
    pub keys: u64,
    /// Operations timed (a YCSB E scan counts as one).
    pub ops: u64,
    /// Millions of operations per second, over the wall time from the
    /// first thread's start to the last thread's end.
    pub mops: f64,
    /// Latency percentiles of the sampled operations.
    pub lat_ns: Latency,
    /// Cache-line flushes per timed operation.
    pub flushes_per_op: f64,
    /// Store fences per timed operation.
    pub fences_per_op: f64,
    /// `Stats::load_factor` after the run.
    pub load_factor: f64,
    /// PM and DRAM bytes the engine (or the store) holds after the run
    /// (`Stats::pm_bytes`, `Stats::dram_bytes`).
    pub pm_bytes: u64,
    /// DRAM bytes held after the run.
    pub dram_bytes: u64,
    /// `pm_bytes` and `dram_bytes` over the keys held after the run
    /// (null when it holds none).
    pub pm_bytes_per_key: Option<f64>,
    /// `dram_bytes` per key held after the run (null when it holds none).
    pub dram_bytes_per_key: Option<f64>,
    /// Keys the engine was created for (`--keys` when pre-sized).
    pub initial_capacity: u64,
    /// Structural changes (splits, merges, doublings, expansions,
    /// rehashes: `Stats::structural_changes`) during the timed section.
    pub structural_changes: u64,
    /// Milliseconds spent in them (`Stats::structural_nanos`), summed over
    /// the threads.
    pub structural_ms: f64,
    /// `structural_ms` as a percentage of the timed section's thread time
    /// (wall time × threads).
    pub structural_pct: f64,
    /// The engine's own figures after the run (`Stats::detail`): levels,
    /// resizes, movements, the highest load factor reached.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub detail: std::collections::BTreeMap<String, String>,
    /// `mops` divided by hashbrown's on the same workload and threads,
    /// when this invocation ran hashbrown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio_to_hashbrown: Option<f64>,
    /// Milliseconds `open` took on the cleanly closed pool after the run
    /// (file-backed persistent engines): the clean-restart cost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reopen_ms: Option<f64>,
    /// The reopened engine's figures (`Stats::detail` right after that
    /// `open`): what the restart did (recovery time, filter rebuild).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub reopen_detail: std::collections::BTreeMap<String, String>,
    /// The store's figures (store engine only; flattened into the run
    /// object).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub store: Option<StoreFigures>,
    /// Every repetition, when `--repeat` was above 1.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub repeats: Vec<RunResult>,
    /// `engine.len()` after the run (checked by the runner; not in JSON).
    #[serde(skip)]
    pub len_after: u64,
    /// Wall time of the timed section in seconds (not in JSON).
    #[serde(skip)]
    pub seconds: f64,
}

/// The store's own figures after a run (`StoreStats`), for the store engine.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StoreFigures {
    /// Key size in bytes.
    pub key_size: usize,
    /// Value size in bytes.
    pub value_size: usize,
    /// 8-byte values of 8-byte keys kept in the DRAM point index (their
    /// gets read no log, so they count no local or remote read).
    pub inline_values: bool,
    /// Gets check the checksum of the log entries they read.
    pub verify_checksums: bool,
    /// Log nodes (virtual ones with `--numa-emulate`).
    pub nodes: u32,
    /// Log bytes written and not reclaimed, over the bytes holding a key's
    /// newest value.
    pub space_amplification: f64,
    /// Log bytes written and not reclaimed.
    pub log_bytes: u64,
    /// Log bytes holding a key's newest value.
    pub live_bytes: u64,
    /// Log reads and appends of the timed section (of writing the log, for
    /// `recovery`) on the accessing thread's node (local) or another
    /// (remote); RAF cache hits read no log. GC copies count as writes.
    pub local_reads: u64,
    /// Log reads on another node than the reading thread's.
    pub remote_reads: u64,
    /// Log appends on the writing thread's node.
    pub local_writes: u64,
    /// Log appends on another node than the writing thread's.
    pub remote_writes: u64,
    /// Gets answered from the RAF cache.
    pub raf_hits: u64,
    /// Garbage-collection passes.
    pub gc_runs: u64,
    /// Log files reclaimed by garbage collection.
    pub files_reclaimed: u64,
    /// The crash and clean reopens of the recovery workload.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recovery: Option<Recovery>,
}

/// What the recovery workload measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Recovery {
    /// Recovery threads of the log scan.
    pub threads: usize,
    /// Log entries the scan read.
    pub entries: u64,
    /// Keys recovered.
    pub keys: u64,
    /// Milliseconds the store's open spent recovering (the log scan; the
    /// pool mapping not counted).
    pub ms: f64,
    /// The whole `Store::open`, pool mapping included.
    pub wall_ms: f64,
    /// Log entries scanned per second.
    pub entries_per_s: f64,
    /// Milliseconds per million log entries scanned.
    pub ms_per_million_entries: f64,
    /// Milliseconds the open of the cleanly closed store took (index image).
    pub clean_reopen_ms: f64,
    /// `clean_reopen_ms` per million keys held.
    pub clean_ms_per_million_keys: f64,
}

/// Everything one `pmhash bench` invocation measured.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The machine the runs ran on.
    pub machine: Machine,
    /// One record per engine × workload × threads, in the order they ran.
    pub runs: Vec<RunResult>,
}

impl RunResult {
    /// Sets the structural figures from the timed section's `changes` and
    /// `nanos` (needs `seconds` and `threads`).
    pub fn set_structural(&mut self, changes: u64, nanos: u64) {
        self.structural_changes = changes;
        self.structural_ms = nanos as f64 / 1e6;
        let thread_ns = self.seconds * 1e9 * self.threads.max(1) as f64;
        self.structural_pct = if thread_ns > 0.0 {
            100.0 * nanos as f64 / thread_ns
        } else {
            0.0
        };
    }

    /// Sets the memory figures from the bytes held after the run (needs
    /// `len_after`).
    pub fn set_memory(&mut self, pm_bytes: u64, dram_bytes: u64) {
        self.pm_bytes = pm_bytes;
        self.dram_bytes = dram_bytes;
        let per_key = |b: u64| (self.len_after > 0).then(|| b as f64 / self.len_after as f64);
        self.pm_bytes_per_key = per_key(pm_bytes);
        self.dram_bytes_per_key = per_key(dram_bytes);
    }
}

impl Report {
    /// Builds the report from the repetitions of each run: keeps the median
    /// by Mops/s (the lower one for an even count) and fills in the ratios
    /// to hashbrown.
    pub fn from_repetitions(machine: Machine, groups: Vec<Vec<RunResult>>) -> Report {
        let mut runs: Vec<RunResult> = groups
            .into_iter()
            .filter(|g| !g.is_empty())
            .map(|group| {
                let mut order: Vec<usize> = (0..group.len()).collect();
                order.sort_by(|&a, &b| group[a].mops.total_cmp(&group[b].mops));
                let mut median = group[order[(group.len() - 1) / 2]].clone();
                if group.len() > 1 {
                    median.repeats = group;
                }
                median
            })
            .collect();
        let baseline: Vec<(String, usize, f64)> = runs
            .iter()
            .filter(|r| r.engine == HASHBROWN)
            .map(|r| (r.workload.clone(), r.threads, r.mops))
            .collect();
        for r in &mut runs {
            r.ratio_to_hashbrown = baseline
                .iter()
                .find(|(w, t, m)| *w == r.workload && *t == r.threads && *m > 0.0)
                .map(|(_, _, m)| r.mops / m);
        }
        Report { machine, runs }
    }

    /// The report as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        // Serializing plain structs of numbers and strings cannot fail
        // (non-finite floats become null).
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// The table printed on stdout (and one for the store's runs, if any).
    pub fn table(&self) -> String {
        let head = [
            "engine",
            "workload",
            "thr",
            "Mops/s",
            "x hbrown",
            "p50 ns",
            "p99 ns",
            "p999 ns",
            "flush/op",
            "fence/op",
            "load",
            "struct ms",
            "struct %",
            "changes",
            "PM B/key",
            "DRAM B/key",
            "reopen ms",
        ];
        let rows: Vec<Vec<String>> = self
            .runs
            .iter()
            .map(|r| {
                vec![
                    r.engine.clone(),
                    r.workload.clone(),
                    r.threads.to_string(),
                    format!("{:.3}", r.mops),
                    r.ratio_to_hashbrown
                        .map_or("-".to_string(), |x| format!("{x:.2}")),
                    r.lat_ns.p50.to_string(),
                    r.lat_ns.p99.to_string(),
                    r.lat_ns.p999.to_string(),
                    format!("{:.2}", r.flushes_per_op),
                    format!("{:.2}", r.fences_per_op),
                    format!("{:.3}", r.load_factor),
                    format!("{:.1}", r.structural_ms),
                    format!("{:.1}", r.structural_pct),
                    r.structural_changes.to_string(),
                    r.pm_bytes_per_key
                        .map_or("-".to_string(), |x| format!("{x:.1}")),
                    r.dram_bytes_per_key
                        .map_or("-".to_string(), |x| format!("{x:.1}")),
                    r.reopen_ms.map_or("-".to_string(), |x| format!("{x:.1}")),
                ]
            })
            .collect();
        let mut out = self.machine.sizing_line() + "\n";
        out += &render(&head, &rows);
        let store: Vec<Vec<String>> = self
            .runs
            .iter()
            .filter_map(|r| {
                let s = r.store.as_ref()?;
                let rec = s.recovery.as_ref();
                let opt = |f: fn(&Recovery) -> f64| {
                    rec.map_or("-".to_string(), |x| format!("{:.1}", f(x)))
                };
                Some(vec![
                    r.engine.clone(),
                    r.workload.clone(),
                    r.threads.to_string(),
                    format!("{}/{}", s.key_size, s.value_size),
                    s.nodes.to_string(),
                    format!("{:.3}", s.space_amplification),
                    s.local_reads.to_string(),
                    s.remote_reads.to_string(),
                    s.local_writes.to_string(),
                    s.remote_writes.to_string(),
                    rec.map_or("-".to_string(), |x| x.entries.to_string()),
                    opt(|x| x.ms),
                    opt(|x| x.ms_per_million_entries),
                ])
            })
            .collect();
        if !store.is_empty() {
            let head = [
                "engine",
                "workload",
                "thr",
                "key/val B",
                "nodes",
                "space amp",
                "local rd",
                "remote rd",
                "local wr",
                "remote wr",
                "recovered",
                "recovery ms",
                "ms/M entries",
            ];
            out += "\n";
            out += &render(&head, &store);
        }
        out
    }
}

/// A table: the first two columns left-aligned, the others right-aligned,
/// cells two spaces apart, no borders (plain columns that the docs quote
/// and that split on whitespace; kept by hand as a few lines rather than a
/// table crate's styled output).
fn render(head: &[&str], rows: &[Vec<String>]) -> String {
    let mut width: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in width.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: &[String]| -> String {
        let parts: Vec<String> = cells
            .iter()
            .zip(&width)
            .enumerate()
            .map(|(i, (c, &w))| {
                if i < 2 {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect();
        parts.join("  ").trim_end().to_string() + "\n"
    };
    let mut out = line(&head.iter().map(|h| h.to_string()).collect::<Vec<_>>());
    out += &line(&width.iter().map(|&w| "-".repeat(w)).collect::<Vec<_>>());
    for row in rows {
        out += &line(row);
    }
    out
}

/// A run record with the given names and throughput, for tests.
#[cfg(test)]
pub(crate) fn test_run(engine: &str, workload: &str, mops: f64) -> RunResult {
    tests::run(engine, workload, mops)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn run(engine: &str, workload: &str, mops: f64) -> RunResult {
        RunResult {
            engine: engine.to_string(),
            workload: workload.to_string(),
            threads: 1,
            keys: 10,
            ops: 10,
            mops,
            lat_ns: Latency::default(),
            flushes_per_op: 0.0,
            fences_per_op: 0.0,
            load_factor: 0.5,
            pm_bytes: 0,
            dram_bytes: 0,
            pm_bytes_per_key: None,
            dram_bytes_per_key: None,
            initial_capacity: 10,
            structural_changes: 0,
            structural_ms: 0.0,
            structural_pct: 0.0,
            detail: Default::default(),
            ratio_to_hashbrown: None,
            reopen_ms: None,
            reopen_detail: Default::default(),
            store: None,
            repeats: Vec::new(),
            len_after: 10,
            seconds: 1.0,
        }
    }

    #[test]
    fn percentiles_match_a_known_distribution() {
        // 1..=100_000 ns, each once: the q-quantile is q * 100_000, and a
        // 3-significant-figure histogram reports it within 0.1%.
        let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 1_000_000, 3).unwrap();
        for v in (1..=100_000u64).rev() {
            h.record(v).unwrap();
        }
        let l = Latency::from_histogram(&h);
        let near = |got: u64, want: u64| (got as f64 / want as f64 - 1.0).abs() <= 0.001;
        assert!(near(l.p50, 50_000), "{l:?}");
        assert!(near(l.p99, 99_000), "{l:?}");
        assert!(near(l.p999, 99_900), "{l:?}");
        assert!(near(l.max, 100_000), "{l:?}");
        assert_eq!(l.samples, 100_000);
        // A two-valued distribution: 99% at 100 ns, 1% at 10 µs.
        let mut h = hdrhistogram::Histogram::<u64>::new(3).unwrap();
        h.record_n(100, 9_900).unwrap();
        h.record_n(10_000, 100).unwrap();
        let l = Latency::from_histogram(&h);
        assert_eq!((l.p50, l.p99), (100, 100), "{l:?}");
        assert!(near(l.p999, 10_000), "{l:?}");
        let empty = hdrhistogram::Histogram::<u64>::new(3).unwrap();
        assert_eq!(Latency::from_histogram(&empty), Latency::default());
    }

    #[test]
    fn median_and_ratio() {
        let m = Machine::detect("mapped", "strict", 0);
        let r = Report::from_repetitions(
            m,
            vec![
                vec![run("hashbrown", "get-pos", 10.0)],
                vec![
                    run("x", "get-pos", 1.0),
                    run("x", "get-pos", 9.0),
                    run("x", "get-pos", 5.0),
                ],
                vec![run("x", "insert", 3.0)],
            ],
        );
        assert_eq!(r.runs.len(), 3);
        assert_eq!(r.runs[0].ratio_to_hashbrown, Some(1.0));
        assert_eq!(r.runs[1].mops, 5.0);
        assert_eq!(r.runs[1].repeats.len(), 3);
        assert_eq!(r.runs[1].ratio_to_hashbrown, Some(0.5));
        assert_eq!(r.runs[2].ratio_to_hashbrown, None);
        let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert!(json["runs"][2].get("ratio_to_hashbrown").is_none());
        assert!(json["runs"][0].get("repeats").is_none());
        assert_eq!(json["runs"][1]["repeats"].as_array().unwrap().len(), 3);
        assert!(json["runs"][0].get("len_after").is_none());
        let table = r.table();
        assert_eq!(table.lines().count(), 6);
        assert!(table.starts_with("tables and pool files pre-sized"));
        assert!(table.contains("0.50") && table.contains("hashbrown"));
    }
}
