//! `pmhash bench` as a user runs it: tables grow from the engines' default
//! size unless `--presized` (or `--initial-capacity`) says otherwise, and
//! every run reports its structural changes and bytes per key.

use std::path::PathBuf;

use serde_json::Value;

#[path = "support/run.rs"]
mod run;
use run::pmhash;

/// A JSON report path, removed when dropped.
struct Json(PathBuf);

impl Json {
    fn new(name: &str) -> Json {
        Json(std::env::temp_dir().join(format!(
            "pmhash-bench-sizing-{}-{name}.json",
            std::process::id()
        )))
    }
    fn read(&self) -> Value {
        serde_json::from_str(&std::fs::read_to_string(&self.0).expect("report written"))
            .expect("report is JSON")
    }
}

impl Drop for Json {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Runs the insert workload of 200k keys on hmeh and slotarray with
/// `extra` options; returns the printed table and the JSON report.
fn insert_run(name: &str, extra: &[&str]) -> (String, Value) {
    let json = Json::new(name);
    let path = json.0.to_str().expect("utf-8 path").to_string();
    let mut args = vec![
        "bench",
        "--no-chart",
        "--engine",
        "hmeh,slotarray",
        "--keys",
        "200k",
        "--workload",
        "insert",
        "--json",
        &path,
    ];
    args.extend_from_slice(extra);
    let (code, text) = pmhash(&args);
    assert_eq!(code, 0, "pmhash {args:?} failed: {text}");
    (text, json.read())
}

fn run<'a>(report: &'a Value, engine: &str) -> &'a Value {
    report["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .find(|r| r["engine"] == engine)
        .unwrap_or_else(|| panic!("no {engine} run in {report}"))
}

fn f(run: &Value, field: &str) -> f64 {
    run[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{field} is not a number in {run}"))
}

fn u(run: &Value, field: &str) -> u64 {
    run[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} is not a count in {run}"))
}

/// Every run holds PM (persistent engines) and DRAM, per key, after the
/// insert workload.
fn assert_bytes_per_key(report: &Value) {
    for r in report["runs"].as_array().expect("runs") {
        assert_eq!(u(r, "ops"), 200_000, "{r}");
        assert!(f(r, "pm_bytes_per_key") > 8.0, "{r}");
        assert!(f(r, "dram_bytes_per_key") > 0.0, "{r}");
        let per_key = u(r, "pm_bytes") as f64 / 200_000.0;
        assert!((f(r, "pm_bytes_per_key") - per_key).abs() < 1e-6, "{r}");
    }
}

#[test]
fn default_run_grows_from_the_engines_default_size() {
    let (table, report) = insert_run("grown", &[]);
    assert!(
        table.starts_with("tables grown from 1024 keys"),
        "table header: {table}"
    );
    assert_eq!(report["machine"]["sizing"], "grown");
    assert_eq!(report["machine"]["initial_capacity"], 1024);
    let hmeh = run(&report, "hmeh");
    assert_eq!(u(hmeh, "initial_capacity"), 1024);
    // 200k keys from 1024 take a few hundred splits (about one per 700
    // inserts once segments are full size).
    assert!(u(hmeh, "structural_changes") >= 100, "{hmeh}");
    assert!(f(hmeh, "structural_ms") > 0.0, "{hmeh}");
    let pct = f(hmeh, "structural_pct");
    assert!(pct > 0.0 && pct < 100.0, "{hmeh}");
    // The slot array doubles from 2048 slots to 512k: 8 doublings.
    assert_eq!(u(run(&report, "slotarray"), "structural_changes"), 8);
    assert_bytes_per_key(&report);
}

#[test]
fn presized_run_makes_no_structural_change() {
    let (table, report) = insert_run("presized", &["--presized"]);
    assert!(
        table.starts_with("tables and pool files pre-sized for 200000 keys"),
        "table header: {table}"
    );
    assert_eq!(report["machine"]["sizing"], "pre-sized");
    assert_eq!(report["machine"]["initial_capacity"], 200_000);
    for engine in ["hmeh", "slotarray"] {
        let r = run(&report, engine);
        assert_eq!(u(r, "initial_capacity"), 200_000);
        assert_eq!(u(r, "structural_changes"), 0, "{r}");
        assert_eq!(f(r, "structural_ms"), 0.0, "{r}");
    }
    assert_bytes_per_key(&report);
}

#[test]
fn presized_and_initial_capacity_conflict() {
    let (code, text) = pmhash(&[
        "bench",
        "--no-chart",
        "--engine",
        "hmeh",
        "--presized",
        "--initial-capacity",
        "5000",
    ]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("cannot be used with"), "{text}");
}
