//! `pmhash bench` options and the entry point the binary calls.

use std::path::{Path, PathBuf};

use clap::Parser;
use engine::{Durability, EngineConfig, EngineSpec};

use crate::chart;
use crate::config::{BenchConfig, Sizing};
use crate::dist::Dist;
use crate::progress::Progress;
use crate::report::Report;
use crate::runner;
use crate::workload::Workload;

/// Options of `pmhash bench` (embed with `#[command(flatten)]` or as a
/// subcommand's arguments).
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Engines to run, comma-separated [default: hmeh, pass, rophi, level,
    /// store and hashbrown; with --full every registered engine except the
    /// "-misordered" ones]
    #[arg(long = "engine", value_name = "E[,E..]", value_delimiter = ',')]
    pub engines: Vec<String>,

    /// The full comparison: every engine and DRAM baseline (unless
    /// --engine names some) on 2M keys (unless --keys says otherwise)
    #[arg(long)]
    pub full: bool,

    /// Workloads: insert, get-pos, get-neg, get-batch, update, delete, ycsb-a ..
    /// ycsb-f (YCSB E's scans are emulated by consecutive gets, except on the
    /// store, which scans); store engine only: put100, put95-get5,
    /// put50-get50, get100, get50-upd50, upd100, delete100 (NStore's),
    /// recovery (log scan with each --threads value as recovery threads,
    /// and the clean reopen), and overwrite-1, overwrite-10, overwrite-zipf
    /// (--ops puts of one key, of ten keys, of --keys keys drawn zipfian
    /// with theta 0.99; throughput by tenth of the run)
    #[arg(
        long = "workload",
        value_name = "W[,W..]",
        value_delimiter = ',',
        default_value = "insert,get-pos,get-neg,update,delete"
    )]
    pub workloads: Vec<String>,

    /// Keys loaded before each run (accepts 2_000_000, 2M, 500k)
    /// [default: 1M; 2M with --full]
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub keys: Option<u64>,

    /// Operations per run [default: the number of keys]; insert always
    /// does one per key and delete at most one per key
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub ops: Option<u64>,

    /// Thread counts, comma-separated; every run is made with each
    #[arg(
        long,
        value_name = "T[,T..]",
        value_delimiter = ',',
        default_value = "1"
    )]
    pub threads: Vec<usize>,

    /// Request distribution: uniform, zipfian or latest
    #[arg(long, value_name = "DIST", default_value = "uniform")]
    pub dist: String,

    /// Zipfian skew, between 0 and 1
    #[arg(long, value_name = "F", default_value_t = 0.99)]
    pub theta: f64,

    /// Persistence mode of the pools: dax, mapped, volatile or simulated
    #[arg(long, value_name = "MODE", default_value = "mapped")]
    pub mode: String,

    /// Durability contract of the engines: strict or relaxed
    #[arg(long, value_name = "D", default_value = "strict")]
    pub durability: String,

    /// Emulated PM write latency per flushed cache line, in ns
    #[arg(long = "pm-write-latency", value_name = "NS", default_value_t = 0)]
    pub pm_write_latency: u64,

    /// Directory for the pool files [default: /dev/shm if it exists, else
    /// the temporary directory]
    #[arg(long, value_name = "DIR")]
    pub pool: Option<PathBuf>,

    /// Write the report as JSON to FILE
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Write the chart (throughput and latency per workload) as SVG to
    /// FILE.svg and as PNG to FILE.png [default: target/bench/bench.svg;
    /// a chart that cannot be written to the default path is a warning]
    #[arg(long, value_name = "FILE.svg")]
    pub chart: Option<PathBuf>,

    /// Write no chart
    #[arg(long, conflicts_with = "chart")]
    pub no_chart: bool,

    /// TrueType font for the chart's text [default: DejaVu Sans or
    /// another common system font, e.g. /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf]
    #[arg(long, value_name = "FILE.ttf")]
    pub font: Option<PathBuf>,

    /// Seed of the keys and of every thread's random choices
    #[arg(long, value_name = "S", default_value_t = 1)]
    pub seed: u64,

    /// Repetitions of each run; the table shows the median by Mops/s and
    /// the JSON keeps all of them
    #[arg(long, value_name = "R", default_value_t = 1)]
    pub repeat: usize,

    /// Keys the engines (and the store's point index) are sized for at
    /// creation [default: each engine's default, 1024 keys, so the tables
    /// grow as a user's would]
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub initial_capacity: Option<u64>,

    /// Size the engines, the store and the pool files for --keys at
    /// creation, so that loading them never grows a table
    #[arg(long, conflicts_with = "initial_capacity")]
    pub presized: bool,

    /// Bytes per key in the store engine's runs (Viper's setup: 16)
    #[arg(long, value_name = "BYTES", default_value_t = 8)]
    pub key_size: usize,

    /// Bytes per value in the store engine's runs (Viper's setup: 200)
    #[arg(long, value_name = "BYTES", default_value_t = 8)]
    pub value_size: usize,

    /// Virtual NUMA nodes for the store engine: thread i works on node
    /// i mod N, and log accesses are counted local or remote
    #[arg(long, value_name = "N")]
    pub numa_emulate: Option<u32>,

    /// The store reads every value from its log, as in NStore, instead of
    /// keeping 8-byte values of 8-byte keys in its DRAM point index
    #[arg(long)]
    pub no_inline_values: bool,

    /// The store's gets do not check the checksum of the log entry they
    /// read (`OpenOptions::verify_checksums` off)
    #[arg(long)]
    pub no_verify_checksums: bool,
}

#[derive(Parser)]
#[command(name = "bench", no_binary_name = true)]
struct Standalone {
    #[command(flatten)]
    args: BenchArgs,
}

impl BenchArgs {
    /// Parses options as they would follow `pmhash bench` (for tests and
    /// embedding); the error is clap's message.
    pub fn parse_from<I, T>(args: I) -> Result<BenchArgs, String>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        Standalone::try_parse_from(args)
            .map(|s| s.args)
            .map_err(|e| e.to_string())
    }

    /// Checks every option and resolves the engine names in `registry`.
    pub fn to_config(&self, registry: &[EngineSpec]) -> Result<BenchConfig, String> {
        let engines = resolve_engines(&self.engines, registry, self.full)?;
        let mut workloads = Vec::new();
        for name in &self.workloads {
            let w = Workload::parse(name.trim())?;
            if !workloads.contains(&w) {
                workloads.push(w);
            }
        }
        if workloads.is_empty() {
            return Err("--workload needs at least one workload".to_string());
        }
        let keys = self
            .keys
            .unwrap_or(if self.full { FULL_KEYS } else { QUICK_KEYS });
        if keys == 0 {
            return Err("--keys must be at least 1".to_string());
        }
        let ops = self.ops.unwrap_or(keys);
        if ops == 0 {
            return Err("--ops must be at least 1".to_string());
        }
        if self.threads.is_empty() || self.threads.iter().any(|&t| t == 0 || t > 1024) {
            return Err(format!(
                "--threads must be between 1 and 1024, got {:?}",
                self.threads
            ));
        }
        let mut threads: Vec<usize> = Vec::new();
        for &t in &self.threads {
            if !threads.contains(&t) {
                threads.push(t);
            }
        }
        if !(self.theta > 0.0 && self.theta < 1.0) {
            return Err(format!(
                "--theta must lie strictly between 0 and 1, got {}",
                self.theta
            ));
        }
        if self.repeat == 0 {
            return Err("--repeat must be at least 1".to_string());
        }
        let sizing = match (self.presized, self.initial_capacity) {
            (true, _) => Sizing::Presized,
            (false, Some(0)) => return Err("--initial-capacity must be at least 1".to_string()),
            (false, Some(n)) => Sizing::Grown(n),
            (false, None) => Sizing::Grown(EngineConfig::default().initial_capacity),
        };
        let has_store = engines.iter().any(crate::config::is_store);
        if let Some(w) = workloads.iter().find(|w| w.store_only()) {
            if !has_store {
                return Err(format!(
                    "workload {} runs only on the store engine (--engine store)",
                    w.name()
                ));
            }
        }
        if !(8..=store::MAX_KEY).contains(&self.key_size) {
            return Err(format!(
                "--key-size must be between 8 and {}, got {}",
                store::MAX_KEY,
                self.key_size
            ));
        }
        if !(8..=store::MAX_VALUE).contains(&self.value_size) {
            return Err(format!(
                "--value-size must be between 8 and {}, got {}",
                store::MAX_VALUE,
                self.value_size
            ));
        }
        if let Some(n) = self.numa_emulate {
            if !(1..=64).contains(&n) {
                return Err(format!("--numa-emulate must be between 1 and 64, got {n}"));
            }
        }
        let store_options = self.key_size != 8
            || self.value_size != 8
            || self.numa_emulate.is_some()
            || self.no_inline_values
            || self.no_verify_checksums;
        if store_options && !has_store {
            return Err(
                "--key-size, --value-size, --numa-emulate, --no-inline-values and --no-verify-checksums apply only to the store engine (--engine store)"
                    .to_string(),
            );
        }
        let pool_dir = match &self.pool {
            Some(dir) if dir.is_dir() => dir.clone(),
            Some(dir) => return Err(format!("--pool {}: not a directory", dir.display())),
            None => default_pool_dir(),
        };
        Ok(BenchConfig {
            engines,
            workloads,
            keys,
            ops,
            threads,
            dist: Dist::parse(&self.dist)?,
            theta: self.theta,
            mode: pmem::Mode::parse(&self.mode).map_err(|e| format!("--mode: {e}"))?,
            durability: Durability::parse(&self.durability)
                .map_err(|e| format!("--durability: {e}"))?,
            pool_dir,
            seed: self.seed,
            repeat: self.repeat,
            sizing,
            key_size: self.key_size,
            value_size: self.value_size,
            numa_emulate: self.numa_emulate,
            inline_values: !self.no_inline_values,
            verify_checksums: !self.no_verify_checksums,
        })
    }
}

/// `/dev/shm` if it exists, else the system's temporary directory.
pub(crate) fn default_pool_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// Keys of the default run.
pub(crate) const QUICK_KEYS: u64 = 1_000_000;

/// Keys of the full comparison (`--full`).
pub(crate) const FULL_KEYS: u64 = 2_000_000;

/// The default run's engines: each design once (OP-HMEH, PASS, ROPHI,
/// level hashing, the store) and the DRAM reference.
pub(crate) const QUICK_ENGINES: [&str; 6] =
    ["hmeh", "pass", "rophi", "level", "store", "hashbrown"];

/// Where the chart goes when `--chart` is not given.
pub(crate) const DEFAULT_CHART: &str = "target/bench/bench.svg";

/// The engines named in `names`, each once, in the order given; when
/// `names` is empty, those of [`QUICK_ENGINES`] in `registry` (all but
/// the reference structures if `full`, or if it has none of them).
fn resolve_engines(
    names: &[String],
    registry: &[EngineSpec],
    full: bool,
) -> Result<Vec<EngineSpec>, String> {
    if names.is_empty() {
        let quick: Vec<EngineSpec> = QUICK_ENGINES
            .iter()
            .filter_map(|q| registry.iter().find(|s| s.name == *q))
            .copied()
            .collect();
        if !full && !quick.is_empty() {
            return Ok(quick);
        }
        let all: Vec<EngineSpec> = registry.iter().filter(|s| !s.reference).copied().collect();
        if all.is_empty() {
            return Err("no engine registered".to_string());
        }
        return Ok(all);
    }
    let mut out: Vec<EngineSpec> = Vec::new();
    for name in names {
        let name = name.trim();
        let spec = registry.iter().find(|s| s.name == name).ok_or_else(|| {
            let known: Vec<&str> = registry.iter().map(|s| s.name).collect();
            format!("unknown engine {name:?} (known: {})", known.join(", "))
        })?;
        if !out.iter().any(|s| s.name == spec.name) {
            out.push(*spec);
        }
    }
    Ok(out)
}

/// Parses a count: digits with optional `_` separators and an optional
/// `k`, `M` or `G` suffix (powers of 1000). Written here because the
/// size-parsing crates read such suffixes as byte units.
pub(crate) fn parse_count(s: &str) -> Result<u64, String> {
    let t = s.trim().replace('_', "");
    let (digits, mult) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1_000),
        Some((i, 'm' | 'M')) => (&t[..i], 1_000_000),
        Some((i, 'g' | 'G')) => (&t[..i], 1_000_000_000),
        _ => (&t[..], 1),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("{s:?} is not a count (examples: 20000, 2_000_000, 500k, 2M)"))
}

/// Restores the process-wide emulated write latency when dropped.
struct LatencyGuard(u64);

impl Drop for LatencyGuard {
    fn drop(&mut self) {
        pmem::persist::set_write_latency_ns(self.0);
    }
}

/// Runs `pmhash bench`: every selected engine (from `registry`, which
/// should include [`crate::baselines()`] for the ratio column) on every
/// workload and thread count. Prints the table on stdout and a progress
/// display on stderr (only on a terminal), writes the JSON file if asked
/// and the chart (SVG and PNG) unless `--no-chart`, and returns the
/// report. A chart that cannot be written is an error when `--chart` or
/// `--font` was given, and a warning on stderr otherwise.
pub fn run_cli(args: &BenchArgs, registry: &[EngineSpec]) -> Result<Report, String> {
    let cfg = args.to_config(registry)?;
    let _restore = LatencyGuard(pmem::persist::write_latency_ns());
    pmem::persist::set_write_latency_ns(args.pm_write_latency);
    let report = runner::run(&cfg, &mut Progress::new(cfg.runs(), cfg.planned_ops()))?;
    print!("{}", report.table());
    if let Some(path) = &args.json {
        std::fs::write(path, report.to_json() + "\n")
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if !args.no_chart {
        let explicit = args.chart.is_some() || args.font.is_some();
        let svg = args
            .chart
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CHART));
        match chart::write(&report, &svg, args.font.as_deref()) {
            Ok(png) => eprintln!("chart: {} and {}", svg.display(), png.display()),
            Err(e) if explicit => return Err(format!("chart: {e}")),
            Err(e) => eprintln!("warning: no chart written: {e}"),
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts() {
        assert_eq!(parse_count("2_000_000"), Ok(2_000_000));
        assert_eq!(parse_count("2M"), Ok(2_000_000));
        assert_eq!(parse_count("500k"), Ok(500_000));
        assert_eq!(parse_count("7"), Ok(7));
        assert!(parse_count("").is_err());
        assert!(parse_count("k").is_err());
        assert!(parse_count("-3").is_err());
        assert!(parse_count("99999999999G").is_err());
    }

    #[test]
    fn defaults() {
        let a = BenchArgs::parse_from(Vec::<String>::new()).unwrap();
        assert!(a.engines.is_empty());
        assert_eq!(
            a.workloads,
            ["insert", "get-pos", "get-neg", "update", "delete"]
        );
        assert_eq!(a.keys, None);
        assert!(!a.full && !a.no_chart && a.chart.is_none());
        assert_eq!(a.ops, None);
        assert_eq!(a.threads, [1]);
        assert_eq!((a.dist.as_str(), a.theta, a.repeat), ("uniform", 0.99, 1));
        assert_eq!(
            (a.mode.as_str(), a.durability.as_str()),
            ("mapped", "strict")
        );
        let b = BenchArgs::parse_from(["--engine", "a,b", "--threads", "1,2", "--keys", "20k"])
            .unwrap();
        assert_eq!(b.engines, ["a", "b"]);
        assert_eq!(b.threads, [1, 2]);
        assert_eq!(b.keys, Some(20_000));
        assert!(BenchArgs::parse_from(["--keys", "lots"]).is_err());
    }

    #[test]
    fn bad_options_are_clear_errors() {
        let reg = crate::baselines::baselines();
        let with = |extra: &[&str]| {
            BenchArgs::parse_from(extra.iter().copied())
                .unwrap()
                .to_config(&reg)
        };
        let err = |extra: &[&str]| with(extra).err().unwrap_or_default();
        assert!(err(&["--engine", "nosuch"]).contains("unknown engine \"nosuch\""));
        assert!(err(&["--engine", "nosuch"]).contains("hashbrown"));
        assert!(err(&["--workload", "ycsb-z"]).contains("unknown workload"));
        assert!(err(&["--keys", "0"]).contains("--keys"));
        assert!(err(&["--ops", "0"]).contains("--ops"));
        assert!(err(&["--threads", "0"]).contains("--threads"));
        assert!(err(&["--theta", "1.5"]).contains("--theta"));
        assert!(err(&["--dist", "pareto"]).contains("unknown distribution"));
        assert!(err(&["--mode", "nvram"]).contains("--mode"));
        assert!(err(&["--durability", "maybe"]).contains("--durability"));
        assert!(err(&["--repeat", "0"]).contains("--repeat"));
        assert!(err(&["--initial-capacity", "0"]).contains("--initial-capacity"));
        assert!(
            BenchArgs::parse_from(["--presized", "--initial-capacity", "5"])
                .err()
                .unwrap_or_default()
                .contains("cannot be used with")
        );
        assert!(err(&["--pool", "/no/such/dir"]).contains("not a directory"));
        assert!(err(&["--workload", "put100"]).contains("only on the store engine"));
        assert!(err(&["--key-size", "16"]).contains("only to the store engine"));
        assert!(err(&["--numa-emulate", "2"]).contains("only to the store engine"));
        assert_eq!(with(&[]).unwrap().sizing, Sizing::Grown(1024));
        assert_eq!(with(&[]).unwrap().keys, QUICK_KEYS);
        assert_eq!(with(&["--full"]).unwrap().keys, FULL_KEYS);
        assert_eq!(with(&["--full", "--keys", "30k"]).unwrap().keys, 30_000);
        assert!(BenchArgs::parse_from(["--no-chart", "--chart", "x.svg"])
            .err()
            .unwrap_or_default()
            .contains("cannot be used with"));
        assert_eq!(
            with(&["--initial-capacity", "5k"]).unwrap().sizing,
            Sizing::Grown(5000)
        );
        assert_eq!(with(&["--presized"]).unwrap().sizing, Sizing::Presized);
        let cfg = with(&["--engine", "dashmap,hashbrown,dashmap"]).unwrap();
        let names: Vec<&str> = cfg.engines.iter().map(|s| s.name).collect();
        assert_eq!(names, ["dashmap", "hashbrown"]);
    }

    #[test]
    fn default_engines_skip_reference_structures() {
        let mut reg = crate::baselines::baselines();
        let mut odd = reg[0];
        odd.name = "slot-misordered";
        odd.reference = true;
        reg.push(odd);
        let names = |full| -> Vec<&str> {
            resolve_engines(&[], &reg, full)
                .unwrap()
                .iter()
                .map(|s| s.name)
                .collect()
        };
        // The default run takes the quick set's engines the registry has.
        assert_eq!(names(false), ["hashbrown"]);
        assert_eq!(names(true), ["hashbrown", "dashmap"]);
        let named = resolve_engines(&["slot-misordered".to_string()], &reg, false).unwrap();
        assert_eq!(named[0].name, "slot-misordered");
    }
}
