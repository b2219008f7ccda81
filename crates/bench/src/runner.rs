//! Runs the benchmark: builds each engine fresh (and its pool file),
//! loads it untimed, times and checks the workload through
//! [`crate::measure`], adds the engine's own figures (structural changes,
//! memory, the clean reopen), and collects one
//! [`RunResult`](crate::RunResult) per run.
//!
//! The threads drive a [`Target`](crate::target::Target): an engine, or
//! for the store engine the store itself ([`crate::store_run`]), which
//! builds its own instance and adds its figures but shares the loading,
//! timing and checking.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use engine::{Engine, EngineConfig, EngineKind, EngineSpec};

use crate::config::{is_store, pool_file_sizes, pool_sizes, BenchConfig};
use crate::dist::{Dist, Zipfian};
use crate::keys::KeySet;
use crate::machine::Machine;
use crate::measure::{load, measure, new_result, Inputs, Ran};
use crate::progress::{Meter, Progress};
use crate::report::Report;
use crate::store_run;
use crate::target::EngineTarget;
use crate::workload::Workload;

/// Runs every engine × workload × threads × repetition of `cfg`, ticking
/// `progress`, and builds the report.
pub(crate) fn run(cfg: &BenchConfig, progress: &mut Progress) -> Result<Report, String> {
    if cfg.keys == 0 {
        return Err("--keys must be at least 1".to_string());
    }
    let fresh = if cfg.workloads.iter().any(|w| w.inserts_during_run()) {
        cfg.ops
    } else {
        0
    };
    progress.note(&format!("generating {} keys", cfg.keys));
    let keys = KeySet::generate(cfg.seed, to_usize(cfg.keys)?, to_usize(fresh)?)?;
    let skewed = cfg.dist != Dist::Uniform || cfg.workloads.contains(&Workload::YcsbD);
    let zipf = if skewed {
        Some(Zipfian::new(cfg.keys, cfg.theta)?)
    } else {
        None
    };
    let inputs = Inputs { keys, zipf };
    if let Some(note) = cfg.skipped() {
        progress.warn(&note);
    }

    let mut effective_mode: Option<pmem::Mode> = None;
    let mut groups = Vec::new();
    for spec in &cfg.engines {
        for &workload in &cfg.workloads {
            if !BenchConfig::runs_on(workload, spec) {
                continue;
            }
            for &threads in &cfg.threads {
                let mut group = Vec::with_capacity(cfg.repeat);
                for rep in 0..cfg.repeat {
                    let what = format!(
                        "{} · {} · {threads} thread{} · repeat {}/{}",
                        spec.name,
                        workload.name(),
                        if threads == 1 { "" } else { "s" },
                        rep + 1,
                        cfg.repeat
                    );
                    let meter = progress.start_run(&what, workload.op_count(cfg.keys, cfg.ops));
                    let (result, mode, fallback) =
                        run_one(cfg, spec, workload, threads, &inputs, rep, &meter)?;
                    if let (Some(m), None) = (mode, effective_mode) {
                        if let Some(why) = fallback {
                            progress.warn(&format!(
                                "note: --mode {} fell back to {}: {why}",
                                cfg.mode.name(),
                                m.name()
                            ));
                        }
                        effective_mode = Some(m);
                    }
                    group.push(result);
                }
                groups.push(group);
            }
        }
    }
    progress.finish();
    let machine = Machine::detect(
        effective_mode.unwrap_or(cfg.mode).name(),
        cfg.durability.name(),
        pmem::persist::write_latency_ns(),
    )
    .with_sizing(cfg.sizing.name(), cfg.sizing.initial_capacity(cfg.keys));
    Ok(Report::from_repetitions(machine, groups))
}

fn to_usize(n: u64) -> Result<usize, String> {
    usize::try_from(n).map_err(|_| format!("{n} keys do not fit in memory"))
}

/// Removes the pool file when dropped, so it goes on every path out.
struct PoolFile(PathBuf);

impl Drop for PoolFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A freshly built engine. Fields drop in order: the engine (and with it
/// the last `Arc<Pool>`), then the pool file.
struct Instance {
    engine: Box<dyn Engine>,
    mode: Option<pmem::Mode>,
    /// Why `dax` fell back to `mapped`, if it did.
    fallback: Option<String>,
    _file: Option<PoolFile>,
}

fn instantiate(
    cfg: &BenchConfig,
    spec: &EngineSpec,
    threads: usize,
    capacity_keys: u64,
) -> Result<Instance, String> {
    let ecfg = EngineConfig {
        durability: cfg.durability,
        initial_capacity: cfg.sizing.initial_capacity(cfg.keys),
        threads,
    };
    match spec.kind {
        EngineKind::Volatile { create } => Ok(Instance {
            engine: create(&ecfg),
            mode: None,
            fallback: None,
            _file: None,
        }),
        EngineKind::Persistent { layout, create, .. } => {
            let safe: String = spec
                .name
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            let path = cfg
                .pool_dir
                .join(format!("pmhash-bench-{}-{safe}.pool", std::process::id()));
            // A file of ours left by a failed earlier run of this process.
            let _ = std::fs::remove_file(&path);
            let file = PoolFile(path);
            let (size, max_size) = pool_file_sizes(cfg.sizing, capacity_keys);
            let opts = pmem::PoolOptions {
                mode: cfg.mode,
                size,
                max_size,
                layout: layout.to_string(),
                allow_dax_fallback: true,
                ..Default::default()
            };
            let pool = pmem::Pool::create(&file.0, &opts).map_err(|e| {
                format!(
                    "{}: cannot create pool {}: {e}",
                    spec.name,
                    file.0.display()
                )
            })?;
            let mode = pool.mode();
            let fallback = pool.dax_fallback().map(str::to_string);
            let engine = create(Arc::new(pool), &ecfg)
                .map_err(|e| format!("{}: cannot create engine: {e}", spec.name))?;
            Ok(Instance {
                engine,
                mode: Some(mode),
                fallback,
                _file: Some(file),
            })
        }
    }
}

fn run_one(
    cfg: &BenchConfig,
    spec: &EngineSpec,
    workload: Workload,
    threads: usize,
    inputs: &Inputs,
    rep: usize,
    meter: &Meter,
) -> Result<Ran, String> {
    let ctx = |e: String| {
        format!(
            "{} / {} / {threads} threads: {e}",
            spec.name,
            workload.name()
        )
    };
    if is_store(spec) {
        return store_run::run_one(cfg, spec, workload, threads, inputs, rep, meter).map_err(ctx);
    }
    let ops = workload.op_count(cfg.keys, cfg.ops);
    let extra = if workload.inserts_during_run() {
        ops
    } else {
        0
    };
    let inst = instantiate(cfg, spec, threads, cfg.keys + extra).map_err(ctx)?;
    let engine = inst.engine.as_ref();
    let target = EngineTarget(engine);
    if workload.preloads() {
        load(&target, &inputs.keys.loaded).map_err(ctx)?;
    }
    let before = engine.stats();
    let m = measure(&target, cfg, workload, threads, inputs, rep, meter).map_err(ctx)?;
    let stats = engine.stats();
    let len_after = m.len_after;
    inst.engine
        .close()
        .map_err(|e| ctx(format!("close: {e}")))?;
    let Instance {
        engine,
        mode,
        fallback,
        _file,
    } = inst;
    drop(engine);
    let mut result = new_result(spec.name, workload, threads, cfg.keys, m);
    result.initial_capacity = cfg.sizing.initial_capacity(cfg.keys);
    result.set_structural(
        stats
            .structural_changes
            .saturating_sub(before.structural_changes),
        stats
            .structural_nanos
            .saturating_sub(before.structural_nanos),
    );
    result.set_memory(stats.pm_bytes, stats.dram_bytes);
    if let (EngineKind::Persistent { open, layout, .. }, Some(m), Some(f)) =
        (spec.kind, mode, &_file)
    {
        if matches!(m, pmem::Mode::Mapped | pmem::Mode::Dax) {
            let (ms, detail) =
                reopen(cfg, open, layout, m, &f.0, threads, len_after).map_err(ctx)?;
            result.reopen_ms = Some(ms);
            result.reopen_detail = detail.into_iter().collect();
        }
    }
    result.load_factor = if stats.load_factor.is_finite() {
        stats.load_factor
    } else {
        0.0
    };
    result.detail = stats.detail.into_iter().collect();
    Ok((result, mode, fallback))
}

type OpenFn = fn(Arc<pmem::Pool>, &EngineConfig) -> engine::Result<Box<dyn Engine>>;

/// Opens the cleanly closed pool at `path` again and times the engine's
/// `open` (the pool mapping is not counted); checks the key count.
fn reopen(
    cfg: &BenchConfig,
    open: OpenFn,
    layout: &str,
    mode: pmem::Mode,
    path: &std::path::Path,
    threads: usize,
    len: u64,
) -> Result<(f64, Vec<(String, String)>), String> {
    let (_, max_size) = pool_sizes(cfg.keys);
    let opts = pmem::PoolOptions {
        mode,
        max_size,
        layout: layout.to_string(),
        ..Default::default()
    };
    let pool = Arc::new(pmem::Pool::open(path, &opts).map_err(|e| format!("reopen: {e}"))?);
    let ecfg = EngineConfig {
        durability: cfg.durability,
        initial_capacity: cfg.sizing.initial_capacity(cfg.keys),
        threads,
    };
    let t = Instant::now();
    let e = open(pool, &ecfg).map_err(|e| format!("reopen: {e}"))?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    if e.len() != len {
        return Err(format!(
            "reopen: len() = {} after a clean close of {len}",
            e.len()
        ));
    }
    let detail = e.stats().detail;
    e.close().map_err(|e| format!("close after reopen: {e}"))?;
    Ok((ms, detail))
}
