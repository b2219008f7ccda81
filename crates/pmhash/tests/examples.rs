//! The example programs, run as a user runs them: the crash-safe counter
//! killed with SIGKILL mid-count, and the key-value program across runs.
//! `cargo test` builds the examples beside the test binaries
//! (`target/<profile>/examples/`).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The built example `name`, next to this test's own binary's directory.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let path = profile_dir.join("examples").join(name);
    assert!(
        path.exists(),
        "example {name} not built at {} (cargo test builds examples)",
        path.display()
    );
    path
}

fn scratch(name: &str) -> PathBuf {
    let base = if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    base.join(format!("pmhash-ex-{}-{name}", std::process::id()))
}

/// Starts the counter, lets it count past `at_least` increments of this
/// run, SIGKILLs it, and returns the last value it printed.
fn count_then_kill(bin: &PathBuf, pool: &PathBuf, at_least: u64, extra: Duration) -> u64 {
    let mut child = Command::new(bin)
        .arg(pool)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start counter");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = lines.next().expect("a first line").expect("utf-8");
    let start: u64 = first
        .strip_prefix("start ")
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("first line {first:?} is not `start N`"));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = start;
    while last < start + at_least {
        assert!(Instant::now() < deadline, "counter too slow: {last}");
        let line = lines.next().expect("counter ended early").expect("utf-8");
        last = line.parse().expect("a count");
    }
    std::thread::sleep(extra);
    child.kill().expect("SIGKILL"); // std sends SIGKILL on Unix
                                    // Every line in the pipe was printed after its value was durable.
    for line in lines {
        last = line.expect("utf-8").parse().expect("a count");
    }
    let status = child.wait().expect("wait");
    assert!(!status.success(), "the counter was killed, not finished");
    last
}

#[test]
fn counter_survives_kill_9() {
    let bin = example("counter");
    let pool = scratch("counter.pool");
    let _ = std::fs::remove_file(&pool);
    let mut expect_at_least = 0;
    for (round, extra_ms) in [0u64, 3, 17, 41, 5].into_iter().enumerate() {
        let printed = count_then_kill(&bin, &pool, 200, Duration::from_millis(extra_ms));
        assert!(
            printed >= expect_at_least,
            "round {round}: counted backwards"
        );
        // Reopen in this process: the value is the last printed one, or
        // the one after it when the kill cut the next increment after it
        // reached the pool and before it was printed.
        let index = pmhash::Index::open(&pool).expect("reopen after kill -9");
        let v = index.get(0).expect("the count is there");
        assert!(
            v == printed || v == printed + 1,
            "round {round}: printed {printed}, pool holds {v}"
        );
        assert_eq!(index.check().expect("structure checks"), 1);
        index.close().expect("close");
        expect_at_least = v;
    }
    // A run that ends by itself goes on from there and closes cleanly.
    let out = Command::new(&bin)
        .arg(&pool)
        .arg("10")
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let mut it = text.lines();
    assert_eq!(it.next(), Some(format!("start {expect_at_least}").as_str()));
    assert_eq!(it.last(), Some((expect_at_least + 10).to_string().as_str()));
    std::fs::remove_file(&pool).expect("remove pool");
}

#[test]
fn kv_program_keeps_its_data_between_runs() {
    let bin = example("kv");
    let dir = scratch("kv");
    let _ = std::fs::remove_dir_all(&dir);
    let kv = |args: &[&str]| {
        let out = Command::new(&bin)
            .arg(&dir)
            .args(args)
            .output()
            .expect("run kv");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
        )
    };
    assert_eq!(kv(&["put", "apple", "red"]), (true, "OK".into()));
    assert_eq!(kv(&["put", "banana", "yellow"]), (true, "OK".into()));
    assert_eq!(kv(&["get", "apple"]), (true, "red".into()));
    assert_eq!(kv(&["scan", "a", "b"]), (true, "apple = red".into()));
    assert_eq!(kv(&["delete", "apple"]), (true, "deleted".into()));
    assert_eq!(kv(&["get", "apple"]), (true, "(absent)".into()));
    assert_eq!(kv(&["len"]), (true, "1".into()));
    assert!(!kv(&["frobnicate"]).0, "an unknown command fails");
    std::fs::remove_dir_all(&dir).expect("remove dir");
}

#[test]
fn index_program_reads_back_every_key() {
    let bin = example("index");
    let pool = scratch("index.pool");
    for engine in ["pass", "hmeh+filter"] {
        let out = Command::new(&bin)
            .arg(&pool)
            .args([engine, "20000"])
            .output()
            .expect("run index");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{engine}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            text.contains("read 20000 of 20000 back"),
            "{engine}: {text}"
        );
    }
    let out = Command::new(&bin)
        .arg(&pool)
        .arg("no-such-engine")
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown index engine"));
}
