//! The bounded smoke run (CI): every target for a few seconds with a fixed
//! seed, after its saved regression inputs (`regressions/TARGET/`). Each
//! runs as `pmhash-fuzz` does for a long run, in a worker process watched
//! by a parent, so a signal or a hang fails the test instead of killing
//! the test process. Failing inputs are saved under the test's scratch
//! directory and named in the output.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// Runs `target` for `seconds` with seed 1 after its regressions; panics
/// with the run's output unless every case passed.
fn smoke(target: &str, seconds: u32) {
    let regressions = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("regressions")
        .join(target);
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fuzz-smoke");
    let t0 = Instant::now();
    let run = Command::new(env!("CARGO_BIN_EXE_pmhash-fuzz"))
        .arg(target)
        .args(["--seconds", &seconds.to_string(), "--seed", "1"])
        .arg("--replay")
        .arg(&regressions)
        .arg("--out")
        .arg(&out)
        .args(["--case-timeout", "20"])
        .output()
        .expect("pmhash-fuzz runs");
    let text = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "pmhash-fuzz {target} failed ({}):\n{text}",
        run.status
    );
    assert!(
        text.contains(&format!("pmhash-fuzz {target}: ")) && text.contains(" 0 failures"),
        "pmhash-fuzz {target} did not report its run:\n{text}"
    );
    // Bounded: the run stops on time (a slow machine gets slack).
    assert!(
        t0.elapsed() < Duration::from_secs(u64::from(seconds) + 40),
        "pmhash-fuzz {target} took {:?}",
        t0.elapsed()
    );
}

#[test]
fn resp_framing() {
    smoke("resp", 3);
}

#[test]
fn glob_matcher() {
    smoke("glob", 3);
}

#[test]
fn server_commands() {
    smoke("commands", 6);
}

#[test]
fn pool_readers() {
    smoke("pools", 10);
}

/// The driver itself: a bad target name or argument is a clear error
/// (exit 2), and `--case` runs exactly one case.
#[test]
fn the_driver_refuses_bad_arguments_and_runs_one_case() {
    let exe = env!("CARGO_BIN_EXE_pmhash-fuzz");
    let bad = Command::new(exe).arg("nosuch").output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown target"));
    let bad = Command::new(exe)
        .args(["resp", "--seconds", "-1"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    let one = Command::new(exe)
        .args(["resp", "--seed", "5", "--case", "17"])
        .output()
        .unwrap();
    assert!(one.status.success());
    assert!(
        String::from_utf8_lossy(&one.stderr).contains("1 cases"),
        "{}",
        String::from_utf8_lossy(&one.stderr)
    );
}

/// The driver catches each way a case can go wrong (an abort, a hang, a
/// panic, a panic on another thread, a violated property), names each,
/// saves what it made, goes on after each to the next saved input, and
/// fails the run; a run of passing cases passes.
#[test]
fn the_driver_catches_aborts_hangs_and_panics_and_goes_on() {
    let exe = env!("CARGO_BIN_EXE_pmhash-fuzz");
    let inputs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/selftest");
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fuzz-selftest");
    let t0 = Instant::now();
    let run = Command::new(exe)
        .args(["selftest", "--seconds", "1", "--case-timeout", "3"])
        .arg("--replay")
        .arg(&inputs)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{text}");
    for (file, why) in [
        ("1-abort", "died of signal 6"),
        ("3-hang", "hang: no answer in 3s"),
        ("4-panic", "panic: selftest panic"),
        ("5-thread-panic", "a thread panicked: "),
        ("6-fail", "selftest failure"),
    ] {
        assert!(
            text.lines().any(|l| l.starts_with("FAIL selftest file")
                && l.contains(file)
                && l.contains(why)),
            "{file}: no FAIL line saying {why:?}:\n{text}"
        );
    }
    for file in ["2-pass", "7-pass"] {
        assert!(
            !text.contains(&format!("{file}:")),
            "{file} passes:\n{text}"
        );
    }
    // The worker went on after the abort and after the hang: the last one
    // started at the fourth input and ran the last four.
    assert!(
        text.contains("4 replayed"),
        "the last worker did not run the last two inputs:\n{text}"
    );
    assert!(t0.elapsed() < Duration::from_secs(30));
    let pass = Command::new(exe)
        .args(["selftest", "--seconds", "1", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        pass.status.success(),
        "{}",
        String::from_utf8_lossy(&pass.stderr)
    );
}
