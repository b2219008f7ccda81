//! End-to-end: small benchmarks through the public API, checked for
//! throughput, operation counts, engine contents, JSON, SVG and PNG output.

use std::path::PathBuf;

use engine::EngineSpec;
use pmhash_bench::{baselines, run_cli, BenchArgs, Report};

/// A scratch directory removed at the end of the test.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("pmhash-bench-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
    fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn registry() -> Vec<EngineSpec> {
    let mut r = engine::reference_engines();
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

const ALL_WORKLOADS: &str =
    "insert,get-pos,get-neg,update,delete,ycsb-a,ycsb-b,ycsb-c,ycsb-d,ycsb-e,ycsb-f";

/// Checks that `svg` is one `<svg>` element with balanced tags.
fn assert_balanced_svg(svg: &str) {
    assert!(svg.starts_with("<svg "), "does not start with <svg");
    let mut stack: Vec<String> = Vec::new();
    let mut rest = svg;
    while let Some(open) = rest.find('<') {
        let close = rest[open..].find('>').expect("unterminated tag") + open;
        let tag = &rest[open + 1..close];
        assert!(!tag.contains('<'), "'<' inside a tag: {tag}");
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(
                stack.pop().as_deref(),
                Some(name.trim()),
                "mismatched </{name}>"
            );
        } else if !tag.ends_with('/') {
            let name = tag.split_whitespace().next().unwrap_or("").to_string();
            stack.push(name);
        }
        if stack.is_empty() {
            assert!(rest[close + 1..].trim().is_empty(), "content after </svg>");
        }
        rest = &rest[close + 1..];
    }
    assert!(stack.is_empty(), "unclosed tags: {stack:?}");
    // Text between tags must not hold a raw '&' that starts no entity.
    for (i, _) in svg.match_indices('&') {
        let ent = &svg[i..svg[i..].find(';').map_or(svg.len(), |j| i + j + 1)];
        assert!(
            ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"].contains(&ent),
            "bad entity {ent}"
        );
    }
}

#[test]
fn every_workload_on_both_baselines_with_one_and_two_threads() {
    let dir = Scratch::new("baselines");
    let json_path = dir.path("out.json");
    let svg_path = dir.path("out.svg");
    let keys = 20_000u64;
    let ops = 25_000u64;
    let report = bench(&[
        "--engine",
        "hashbrown,dashmap",
        "--workload",
        ALL_WORKLOADS,
        "--keys",
        "20k",
        "--ops",
        "25_000",
        "--threads",
        "1,2",
        "--json",
        json_path.to_str().unwrap(),
        "--chart",
        svg_path.to_str().unwrap(),
    ])
    .unwrap();

    assert_eq!(report.runs.len(), 2 * 11 * 2);
    for r in &report.runs {
        let what = format!("{} {} x{}", r.engine, r.workload, r.threads);
        assert!(
            r.mops > 0.0 && r.mops.is_finite(),
            "{what}: mops {}",
            r.mops
        );
        assert_eq!(r.keys, keys, "{what}");
        let expected_ops = match r.workload.as_str() {
            "insert" | "delete" => keys,
            _ => ops,
        };
        assert_eq!(r.ops, expected_ops, "{what}: ops");
        match r.workload.as_str() {
            "delete" => assert_eq!(r.len_after, 0, "{what}: deleted keys are still there"),
            "ycsb-d" | "ycsb-e" => {
                // About 5% of the operations insert a fresh key.
                let added = r.len_after - keys;
                assert!(
                    added > ops / 40 && added < ops / 10,
                    "{what}: {added} inserted"
                );
            }
            _ => assert_eq!(r.len_after, keys, "{what}: len"),
        }
        assert!(
            r.lat_ns.p50 > 0 && r.lat_ns.p50 <= r.lat_ns.p99 && r.lat_ns.p99 <= r.lat_ns.p999,
            "{what}"
        );
        assert_eq!(
            (r.flushes_per_op, r.fences_per_op, r.pm_bytes),
            (0.0, 0.0, 0),
            "{what}"
        );
        if r.workload != "delete" {
            assert!(r.dram_bytes >= keys * 16, "{what}: dram {}", r.dram_bytes);
            assert!(
                r.load_factor > 0.2 && r.load_factor <= 1.0,
                "{what}: load {}",
                r.load_factor
            );
        }
        let ratio = r.ratio_to_hashbrown.expect("hashbrown ran every workload");
        if r.engine == "hashbrown" {
            assert_eq!(ratio, 1.0);
        }
    }

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    let machine = &json["machine"];
    for field in [
        "cpu",
        "cores",
        "mem_bytes",
        "flush_instr",
        "kernel",
        "mode",
        "durability",
        "pm_write_latency_ns",
        "date",
    ] {
        assert!(machine.get(field).is_some(), "machine.{field} missing");
    }
    assert!(machine["cores"].as_u64().unwrap() >= 1);
    assert_eq!(machine["durability"], "strict");
    let runs = json["runs"].as_array().unwrap();
    assert_eq!(runs.len(), report.runs.len());
    for (run, r) in runs.iter().zip(&report.runs) {
        for field in [
            "engine",
            "workload",
            "threads",
            "keys",
            "ops",
            "mops",
            "flushes_per_op",
            "fences_per_op",
            "load_factor",
            "pm_bytes",
            "dram_bytes",
            "ratio_to_hashbrown",
        ] {
            assert!(run.get(field).is_some(), "runs[].{field} missing");
        }
        for p in ["p50", "p99", "p999"] {
            assert!(run["lat_ns"][p].as_u64().is_some(), "lat_ns.{p} missing");
        }
        assert_eq!(run["engine"], r.engine.as_str());
        assert_eq!(run["ops"].as_u64(), Some(r.ops));
        assert!(run["mops"].as_f64().unwrap() > 0.0);
        assert!(run.get("repeats").is_none());
    }

    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert_balanced_svg(&svg);
    for name in ["hashbrown", "dashmap", "ycsb-e ×2", "get-neg ×1"] {
        assert!(svg.contains(name), "chart does not name {name}");
    }
    // The PNG of the same chart, beside it.
    let png = std::fs::read(svg_path.with_extension("png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
}

#[test]
fn persistent_engine_counts_persists_and_cleans_up_its_pool() {
    let dir = Scratch::new("pool");
    let report = bench(&[
        "--engine",
        "slotarray,hashbrown",
        "--workload",
        "insert,get-pos,update,delete,ycsb-d",
        "--keys",
        "5000",
        "--ops",
        "3000",
        "--threads",
        "2",
        "--dist",
        "zipfian",
        "--pool",
        dir.0.to_str().unwrap(),
        "--repeat",
        "3",
    ])
    .unwrap();
    assert_eq!(report.runs.len(), 10);
    for r in &report.runs {
        let what = format!("{} {}", r.engine, r.workload);
        assert_eq!(r.repeats.len(), 3, "{what}");
        let mut m: Vec<f64> = r.repeats.iter().map(|x| x.mops).collect();
        m.sort_by(f64::total_cmp);
        assert_eq!(r.mops, m[1], "{what}: not the median");
        match r.workload.as_str() {
            "delete" => assert_eq!((r.ops, r.len_after), (3000, 2000), "{what}"),
            "insert" => assert_eq!((r.ops, r.len_after), (5000, 5000), "{what}"),
            "ycsb-d" => assert!(r.len_after > 5000, "{what}"),
            _ => assert_eq!((r.ops, r.len_after), (3000, 5000), "{what}"),
        }
        if r.engine == "slotarray" {
            assert!(r.pm_bytes > 0, "{what}");
            match r.workload.as_str() {
                "get-pos" => assert_eq!(r.flushes_per_op, 0.0, "readers never write to PM"),
                // 5% inserts, each flushed and fenced.
                "ycsb-d" => assert!(r.flushes_per_op > 0.02 && r.fences_per_op > 0.02, "{what}"),
                // Strict durability: every write flushes and fences.
                _ => assert!(r.flushes_per_op >= 1.0 && r.fences_per_op >= 1.0, "{what}"),
            }
        }
    }
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    assert_eq!(json["runs"][0]["repeats"].as_array().unwrap().len(), 3);
    assert_eq!(json["machine"]["mode"], "mapped");
    let left: Vec<_> = std::fs::read_dir(&dir.0).unwrap().collect();
    assert!(left.is_empty(), "pool files left behind: {left:?}");
}

#[test]
fn errors_are_messages_not_panics() {
    let err = |args: &[&str]| bench(args).err().unwrap_or_default();
    assert!(err(&["--engine", "level9"]).contains("unknown engine"));
    assert!(err(&["--workload", "scan"]).contains("unknown workload"));
    assert!(err(&["--keys", "0"]).contains("--keys"));
    assert!(err(&["--pool", "/definitely/not/here"]).contains("not a directory"));
}
