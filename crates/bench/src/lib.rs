//! The pmhash benchmark harness behind `pmhash bench`.
//!
//! YCSB-style workloads (insert, positive and negative gets, update,
//! delete, YCSB A–F) over any registered engine and the DRAM baselines,
//! plus the store's own (NStore's put/get/update/delete mixes, recovery),
//! with uniform, zipfian and latest request distributions, any number of
//! threads, sampled latency percentiles, persist counters per operation,
//! a progress display, a table on stdout, JSON, and a chart as SVG and
//! PNG.
//!
//! One file per concept (all private; the crate's surface is the items
//! re-exported below): `keys` (distinct random keys), `dist`
//! (distributions), `workload` (workloads and YCSB mixes), `baselines`
//! (hashbrown, dashmap), `target` (what the threads drive), `config`
//! (the plan: engines, workloads, sizing, pool file sizes), `measure`
//! (loading, timing, checking), `runner` (building each engine, running
//! the plan), `store_run` (the store engine: byte keys and values, real
//! scans, recovery, its figures), `report` (table and JSON), `chart`
//! (SVG and PNG), `progress` (the display on stderr), `rng` (the workers'
//! generator, the key format's bijection), `cli` (options).
//!
//! The modules form layers, each using only those below it: `cli`, then
//! `runner`, then `store_run`, then `measure`, then `config` and
//! the rest.

#![forbid(unsafe_code)]

mod baselines;
mod chart;
mod cli;
mod config;
mod dist;
mod keys;
mod machine;
mod measure;
mod progress;
mod report;
mod rng;
mod runner;
mod store_run;
mod target;
mod workload;

pub use baselines::baselines;
pub use cli::{run_cli, BenchArgs};
pub use machine::Machine;
pub use report::{Latency, Recovery, Report, RunResult, StoreFigures};
