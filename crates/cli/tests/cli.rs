//! The command-line tools, run as a user would: crashtest, inspect, check.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use engine::{slotarray, EngineConfig, EngineKind};
use pmem::{Mode, Pool, PoolOptions};

#[path = "support/run.rs"]
mod run;
use run::pmhash;

fn temp(name: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    std::env::temp_dir().join(format!(
        "pmhash-cli-{}-{}-{name}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

/// A slot-array pool file with `n` keys, closed cleanly or not.
fn make_pool(path: &Path, n: u64, clean: bool) {
    let opts = PoolOptions {
        mode: Mode::Mapped,
        size: 4 << 20,
        layout: slotarray::LAYOUT.into(),
        ..PoolOptions::default()
    };
    let pool = Arc::new(Pool::create(path, &opts).unwrap());
    let EngineKind::Persistent { create, .. } = slotarray::spec().kind else {
        unreachable!()
    };
    let e = create(
        pool.clone(),
        &EngineConfig {
            initial_capacity: 8,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    for k in 0..n {
        assert!(e.insert(k.wrapping_mul(0x9e37_79b9_7f4a_7c15), k).unwrap());
    }
    if clean {
        e.close().unwrap();
    }
}

#[test]
fn crashtest_passes_reference_and_fails_misordered() {
    let json = temp("ct.json");
    let (code, out) = pmhash(&[
        "crashtest",
        "--engine",
        "slotarray",
        "--ops",
        "300",
        "--states",
        "300",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("0 violations"), "{out}");
    let j = std::fs::read_to_string(&json).unwrap();
    assert!(
        j.contains("\"violations\":0")
            && j.contains("\"leaked_bytes\":0")
            && j.contains("\"seed\":1"),
        "{j}"
    );
    std::fs::remove_file(&json).unwrap();

    let (code, out) = pmhash(&[
        "crashtest",
        "--engine",
        "slotarray-misordered",
        "--ops",
        "300",
        "--states",
        "300",
    ]);
    assert_eq!(code, 1, "misordered must fail: {out}");
    assert!(out.contains("violation:"), "{out}");

    let (code, out) = pmhash(&["crashtest", "--engine", "no-such-engine"]);
    assert_eq!(code, 2);
    assert!(out.contains("unknown engine"), "{out}");
}

#[test]
fn inspect_and_check_a_good_pool_without_writing_it() {
    let path = temp("good.pool");
    make_pool(&path, 500, false);
    let before = std::fs::read(&path).unwrap();
    let (code, out) = pmhash(&["inspect", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("layout          slotarray") && out.contains("keys            500"),
        "{out}"
    );
    assert!(out.contains("clean shutdown  no"), "{out}");
    let (code, out) = pmhash(&["check", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("OK slotarray: 500 keys"), "{out}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "inspect/check wrote the file"
    );
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn check_fails_on_corruption_and_foreign_files() {
    let path = temp("bad.pool");
    make_pool(&path, 100, true);
    // Find a valid slot's meta word (1) inside the table and make it 7.
    let mut bytes = std::fs::read(&path).unwrap();
    let state = pmem::header::State::current(&bytes).unwrap().0;
    let table = state.root as usize;
    let slot = (0..)
        .map(|i| table + 64 + i * 32)
        .find(|&s| u64::from_le_bytes(bytes[s..s + 8].try_into().unwrap()) == 1)
        .unwrap();
    bytes[slot] = 7;
    std::fs::write(&path, &bytes).unwrap();
    let (code, out) = pmhash(&["check", path.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.starts_with("FAIL") && out.contains("meta 7"), "{out}");
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "check wrote the file");

    std::fs::write(
        &path,
        b"this is not a pool, just some text that is long enough",
    )
    .unwrap();
    let (code, out) = pmhash(&["check", path.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("FAIL"), "{out}");
    let (code, out) = pmhash(&["inspect", path.to_str().unwrap()]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("truncated") || out.contains("not a pmhash pool"),
        "{out}"
    );
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn inspect_and_check_an_hmeh_pool_after_a_crash_without_writing_it() {
    use engine::Engine;
    let path = temp("hmeh.pool");
    let opts = PoolOptions {
        mode: Mode::Mapped,
        size: 8 << 20,
        max_size: 64 << 20,
        layout: hmeh::LAYOUT.into(),
        ..PoolOptions::default()
    };
    let pool = Arc::new(Pool::create(&path, &opts).unwrap());
    let cfg = EngineConfig {
        initial_capacity: 16,
        ..EngineConfig::default()
    };
    let e = hmeh::Hmeh::create(pool.clone(), &cfg).unwrap();
    for k in 0..3000u64 {
        assert!(e.insert(k.wrapping_mul(0x9e37_79b9_7f4a_7c15), k).unwrap());
    }
    // No close: the file is left as a crash would leave it (every strict
    // insert is durable).
    drop(e);
    drop(pool);
    let before = std::fs::read(&path).unwrap();
    let (code, out) = pmhash(&["inspect", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("layout          hmeh") && out.contains("keys            3000"),
        "{out}"
    );
    assert!(out.contains("splits"), "engine detail shown: {out}");
    let (code, out) = pmhash(&["check", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("OK hmeh: 3000 keys"), "{out}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "inspect/check wrote the file"
    );
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn inspect_and_check_a_rophi_pool_after_a_crash_without_writing_it() {
    use engine::Engine;
    let path = temp("rophi.pool");
    let opts = PoolOptions {
        mode: Mode::Mapped,
        size: 8 << 20,
        max_size: 64 << 20,
        layout: rophi::LAYOUT.into(),
        ..PoolOptions::default()
    };
    let pool = Arc::new(Pool::create(&path, &opts).unwrap());
    let cfg = EngineConfig {
        initial_capacity: 16,
        ..EngineConfig::default()
    };
    let e = rophi::Rophi::create(pool.clone(), &cfg).unwrap();
    for k in 0..3000u64 {
        assert!(e.insert(k.wrapping_mul(0x9e37_79b9_7f4a_7c15), k).unwrap());
    }
    for k in 0..500u64 {
        assert!(e.remove(k.wrapping_mul(0x9e37_79b9_7f4a_7c15)).unwrap());
    }
    // No close: the file is left as a crash would leave it.
    drop(e);
    drop(pool);
    let before = std::fs::read(&path).unwrap();
    let (code, out) = pmhash(&["inspect", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("layout          rophi") && out.contains("keys            2500"),
        "{out}"
    );
    assert!(out.contains("filter buckets"), "engine detail shown: {out}");
    let (code, out) = pmhash(&["check", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("OK rophi: 2500 keys"), "{out}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "inspect/check wrote the file"
    );
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn serve_refuses_an_overlong_busy_poll_before_making_anything() {
    let dir = temp("serve-busy-poll");
    let store = dir.join("store");
    let (code, out) = pmhash(&[
        "serve",
        "--dir",
        store.to_str().unwrap(),
        "--addr",
        "127.0.0.1:0",
        "--busy-poll-us",
        "1000001",
    ]);
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("--busy-poll-us: a busy poll of 1000001 µs is over the limit"),
        "{out}"
    );
    assert!(!store.exists(), "a refused serve made {}", store.display());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_second_writer_is_refused_and_check_sees_the_first() {
    use std::time::{Duration, Instant};
    let dir = temp("two-writers");
    let opts = store::Options {
        create: store::CreateOptions {
            pool_size: 4 << 20,
            clusters: 4,
            extent_size: 1 << 20,
            nodes: Some(1),
            ..Default::default()
        },
        open: store::OpenOptions {
            raf_bytes: 0,
            expected_keys: 1024,
            ..Default::default()
        },
    };
    let s = store::Store::open(&dir, opts).unwrap();
    s.put(b"k", b"v").unwrap();
    // Another process: `serve` on the same directory must fail at open,
    // at once and saying why, not start a second writer.
    let mut child = Command::new(env!("CARGO_BIN_EXE_pmhash"))
        .args([
            "serve",
            "--dir",
            dir.to_str().unwrap(),
            "--addr",
            "127.0.0.1:0",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("a second `pmhash serve` on the same store kept running");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(!status.success(), "second serve: {text}");
    assert!(text.contains("in use"), "second serve says: {text}");
    // check and inspect read beside the writer and say it is there.
    let pool = dir.join(store::POOL_FILE);
    let (code, text) = pmhash(&["check", pool.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("open for writing"), "{text}");
    let (code, text) = pmhash(&["inspect", pool.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("open for writing"), "{text}");
    s.close().unwrap();
    drop(s);
    let (code, text) = pmhash(&["check", pool.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    assert!(!text.contains("open for writing"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
