//! The store engine's runs: NStore's workloads, recovery, YCSB with real
//! scans and Viper's key/value sizes, with tiny sizes; checks the store's
//! figures in the report and its JSON.

use std::path::PathBuf;

use engine::EngineSpec;
use pmhash_bench::{baselines, run_cli, BenchArgs, Report};
use serde_json::Value;

/// A scratch directory removed at the end of the test.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "pmhash-bench-store-test-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
    fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }
    fn is_empty_but(&self, keep: &str) -> bool {
        std::fs::read_dir(&self.0)
            .unwrap()
            .all(|e| e.unwrap().file_name() == keep)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn registry() -> Vec<EngineSpec> {
    let mut r = vec![store::spec()];
    r.extend(baselines());
    r
}

/// Runs `pmhash bench` with `args`, writing no chart unless they name one
/// (the default chart path is under the working directory).
fn bench(args: &[&str]) -> Result<Report, String> {
    let mut args = args.to_vec();
    if !args.contains(&"--chart") {
        args.push("--no-chart");
    }
    run_cli(&BenchArgs::parse_from(args)?, &registry())
}

const STORE_WORKLOADS: &str =
    "put100,put95-get5,put50-get50,get100,get50-upd50,upd100,delete100,recovery";

fn u(run: &Value, field: &str) -> u64 {
    run[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} missing in {run}"))
}

#[test]
fn nstore_workloads_and_recovery_with_two_virtual_nodes() {
    let dir = Scratch::new("nstore");
    let json_path = dir.path("out.json");
    let report = bench(&[
        "--engine",
        "store",
        "--workload",
        STORE_WORKLOADS,
        "--keys",
        "2000",
        "--threads",
        "1,2",
        "--numa-emulate",
        "2",
        // The paper's read path: every get reads the log, so the local and
        // remote counts below cover every get.
        "--no-inline-values",
        "--pool",
        dir.0.to_str().unwrap(),
        "--json",
        json_path.to_str().unwrap(),
    ])
    .unwrap();
    assert_eq!(report.runs.len(), 8 * 2);
    assert!(report.table().contains("space amp"));
    assert!(dir.is_empty_but("out.json"), "store files left behind");

    let json: Value = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    let runs = json["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 16);
    for run in runs {
        let w = run["workload"].as_str().unwrap();
        let threads = u(run, "threads");
        let what = format!("{w} x{threads}");
        let mops = run["mops"].as_f64().unwrap();
        assert!(mops > 0.0 && mops.is_finite(), "{what}: mops {mops}");
        assert_eq!((u(run, "key_size"), u(run, "value_size")), (8, 8), "{what}");
        assert_eq!(u(run, "nodes"), 2, "{what}");
        // After delete100 nothing is live: the amplification is infinite
        // (null in JSON) unless GC already reclaimed every dead entry.
        match run["space_amplification"].as_f64() {
            Some(amp) => assert!(
                (1.0..10.0).contains(&amp),
                "{what}: space amplification {amp}"
            ),
            None => assert_eq!(w, "delete100", "{what}: space amplification is null"),
        }
        for f in ["local_reads", "remote_reads", "local_writes"] {
            u(run, f);
        }
        // Foreground writes go to the writer's own node; only GC copies
        // (none in runs this small) could count as remote, and a delete's
        // in-place mark, which is written where the key's entry lives
        // (the load put half of them on the other node).
        if run["detail"]["entries_relocated"] == "0" && w != "delete100" {
            assert_eq!(u(run, "remote_writes"), 0, "{what}");
        }
        assert!(run["reopen_ms"].as_f64().unwrap() > 0.0, "{what}");
        let (reads, writes) = (
            u(run, "local_reads") + u(run, "remote_reads"),
            u(run, "local_writes") + u(run, "remote_writes"),
        );
        let ops = u(run, "ops");
        let (p50, p99) = (
            run["lat_ns"]["p50"].as_u64().unwrap(),
            run["lat_ns"]["p99"].as_u64().unwrap(),
        );
        if w != "recovery" {
            assert!(p50 > 0 && p50 <= p99, "{what}: p50 {p50} p99 {p99}");
            assert!(run.get("recovery").is_none(), "{what}");
        }
        match w {
            "put100" => assert_eq!((ops, writes, reads), (2000, 2000, 0), "{what}"),
            "delete100" => assert_eq!((ops, writes), (2000, 2000), "{what}"),
            "upd100" => assert_eq!((ops, writes, reads), (2000, 2000, 0), "{what}"),
            "get100" => {
                assert_eq!(writes, 0, "{what}");
                assert!(reads > 0 && reads <= ops, "{what}: {reads} log reads");
            }
            "put95-get5" | "put50-get50" | "get50-upd50" => {
                assert!(writes > 0 && writes < ops && reads > 0, "{what}")
            }
            "recovery" => {
                let r = &run["recovery"];
                assert_eq!(u(r, "threads"), threads, "{what}");
                assert_eq!(u(r, "keys"), 2000, "{what}");
                // 2000 puts and 1000 updates, GC off.
                assert_eq!(writes, 3000, "{what}");
                let entries = u(r, "entries");
                assert!((2000..=3000).contains(&entries), "{what}: {entries}");
                assert_eq!(ops, entries, "{what}");
                for f in [
                    "ms",
                    "wall_ms",
                    "entries_per_s",
                    "ms_per_million_entries",
                    "clean_reopen_ms",
                    "clean_ms_per_million_keys",
                ] {
                    let x = r[f].as_f64().unwrap_or(-1.0);
                    assert!(x > 0.0 && x.is_finite(), "{what}: recovery.{f} = {x}");
                }
                assert!(r["wall_ms"].as_f64() >= r["ms"].as_f64(), "{what}");
            }
            _ => panic!("unexpected workload {w}"),
        }
    }
    let by = |w: &str| report.runs.iter().find(|r| r.workload == w).unwrap();
    assert_eq!(by("delete100").len_after, 0);
    assert_eq!(by("put100").len_after, 2000);
    assert_eq!(by("upd100").len_after, 2000);
}

#[test]
fn viper_sizes_ycsb_with_real_scans_next_to_a_baseline() {
    let dir = Scratch::new("viper");
    let report = bench(&[
        "--engine",
        "store,hashbrown",
        "--workload",
        "ycsb-a,ycsb-b,ycsb-c,ycsb-d,ycsb-e,ycsb-f,put100",
        "--keys",
        "2000",
        "--ops",
        "1000",
        "--threads",
        "2",
        "--key-size",
        "16",
        "--value-size",
        "200",
        "--pool",
        dir.0.to_str().unwrap(),
    ])
    .unwrap();
    // put100 is skipped for hashbrown.
    assert_eq!(report.runs.len(), 7 + 6);
    let json: Value = serde_json::from_str(&report.to_json()).unwrap();
    for run in json["runs"].as_array().unwrap() {
        let what = format!("{} {}", run["engine"], run["workload"]);
        if run["engine"] == "hashbrown" {
            assert!(run.get("space_amplification").is_none(), "{what}");
            assert!(run["workload"] != "put100", "{what}");
            continue;
        }
        assert_eq!(
            (u(run, "key_size"), u(run, "value_size")),
            (16, 200),
            "{what}"
        );
        assert_eq!(u(run, "remote_writes"), 0, "{what}");
        let scans = run["detail"]["range_scans"].as_str();
        if run["workload"] == "ycsb-e" {
            let n: u64 = scans.expect("ycsb-e scans").parse().unwrap();
            assert!(n > 800, "{what}: {n} range scans for ~950 expected");
        } else {
            assert!(scans.is_none(), "{what}");
        }
    }
    let d = report
        .runs
        .iter()
        .find(|r| r.engine == "store" && r.workload == "ycsb-d")
        .unwrap();
    assert!(d.len_after > 2000, "ycsb-d inserts");
    assert!(dir.is_empty_but(""), "store files left behind");
}

#[test]
fn store_options_are_checked() {
    let err = |args: &[&str]| bench(args).err().unwrap_or_default();
    let e = err(&["--engine", "hashbrown", "--workload", "put100"]);
    assert!(e.contains("put100 runs only on the store engine"), "{e}");
    let e = err(&["--engine", "hashbrown", "--value-size", "200"]);
    assert!(e.contains("only to the store engine"), "{e}");
    let e = err(&["--engine", "store", "--key-size", "4"]);
    assert!(e.contains("--key-size"), "{e}");
    let e = err(&["--engine", "store", "--numa-emulate", "0"]);
    assert!(e.contains("--numa-emulate"), "{e}");
    let e = err(&[
        "--engine",
        "store",
        "--workload",
        "recovery",
        "--keys",
        "100",
        "--mode",
        "volatile",
    ]);
    assert!(e.contains("--mode mapped or dax"), "{e}");
}

/// With the 8-byte fast path (the default), a get of an 8-byte key with an
/// 8-byte value is answered by the DRAM point index: no log read at all.
#[test]
fn inline_values_answer_gets_without_log_reads() {
    let dir = Scratch::new("inline");
    let json_path = dir.path("out.json");
    for (flag, inline) in [(None, true), (Some("--no-inline-values"), false)] {
        let mut args = vec![
            "--engine",
            "store",
            "--workload",
            "get100",
            "--keys",
            "2000",
            "--numa-emulate",
            "2",
            "--pool",
            dir.0.to_str().unwrap(),
            "--json",
            json_path.to_str().unwrap(),
        ];
        args.extend(flag);
        bench(&args).unwrap();
        let json: Value =
            serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
        let run = &json["runs"][0];
        assert_eq!(run["inline_values"], inline, "{run}");
        let reads = u(run, "local_reads") + u(run, "remote_reads");
        if inline {
            assert_eq!(reads, 0, "{run}");
        } else {
            // RAF hits read no log either.
            assert_eq!(reads + u(run, "raf_hits"), u(run, "ops"), "{run}");
        }
    }
}
