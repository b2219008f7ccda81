//! The crash checker (`engine::crashtest::run`) on OP-HMEH, both
//! durabilities, a few seeds: zero violations, zero leaked bytes, and the
//! paths the workload went through (splits, node splits, merges, backups)
//! read from the report's `detail` so that a workload that stops
//! exercising them is noticed.
//!
//! The white-box crash tests (torn slots, crafted duplicates, a crash
//! image at every fence of a split or merge, backups) live in
//! `src/tests.rs`.

use engine::crashtest::{self, Config, Report};
use engine::Durability;

const MIB: u64 = 1 << 20;

/// A figure of the checker's dry run (`Report::detail`, the engine's
/// `stats().detail` after the workload).
fn detail(r: &Report, name: &str) -> u64 {
    r.detail
        .iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("report detail has no {name:?}: {:?}", r.detail))
        .1
        .parse()
        .unwrap_or_else(|_| panic!("detail {name:?} is not an integer"))
}

fn config(durability: Durability, seed: u64, key_space: u64, ops: u64, states: u64) -> Config {
    Config {
        ops,
        states,
        seed,
        durability,
        key_space,
        pool_size: 2 * MIB,
        initial_capacity: 16,
        ..Config::default()
    }
}

/// Runs the checker and asserts a clean report.
fn assert_clean(c: &Config) -> Report {
    let t = std::time::Instant::now();
    let r = crashtest::run(&hmeh::spec(), c).expect("the crash test runs");
    eprintln!(
        "hmeh {} seed {} key space {}: {} states ({} during recovery), {} fences, {:.1}s; {:?}",
        c.durability.name(),
        c.seed,
        c.key_space,
        r.states,
        r.recovery_crashes,
        r.fences,
        t.elapsed().as_secs_f64(),
        r.detail
    );
    assert_eq!(
        r.violations,
        0,
        "{} seed {} key space {}: {:#?}",
        c.durability.name(),
        c.seed,
        c.key_space,
        r.messages
    );
    assert_eq!(
        r.leaked_bytes,
        0,
        "{} seed {}: leaked bytes",
        c.durability.name(),
        c.seed
    );
    assert!(
        r.states >= c.states,
        "only {} of {} states checked",
        r.states,
        c.states
    );
    r
}

/// Strict: every completed operation survives. 16-entry initial capacity
/// and 600 keys: 1 KiB segments split (in a node and at new nodes), and
/// the remove-heavy phase merges them back.
#[test]
fn checker_strict() {
    let mut splits = 0;
    let mut node_splits = 0;
    let mut merges = 0;
    for seed in [1u64, 2, 3] {
        let r = assert_clean(&config(Durability::Strict, seed, 600, 2000, 2000));
        splits += detail(&r, "splits");
        node_splits += detail(&r, "node splits");
        merges += detail(&r, "merges");
        assert_eq!(detail(&r, "backups made"), 0, "strict mode made a backup");
    }
    assert!(splits > 0, "no split in any strict run");
    assert!(node_splits > 0, "no node-creating split in any strict run");
    assert!(merges > 0, "no merge in any strict run");
}

/// Relaxed: every key holds a value it had since the last sync; splits at
/// new RT nodes keep the old segment as a backup.
#[test]
fn checker_relaxed() {
    let mut backups = 0;
    let mut splits = 0;
    let mut merges = 0;
    for seed in [1u64, 2, 3] {
        let r = assert_clean(&config(Durability::Relaxed, seed, 600, 2000, 2000));
        backups += detail(&r, "backups made");
        splits += detail(&r, "splits");
        merges += detail(&r, "merges");
    }
    assert!(splits > 0, "no split in any relaxed run");
    assert!(backups > 0, "no backup made in any relaxed run");
    assert!(merges > 0, "no merge in any relaxed run");
}

/// A small key space: few segments, same-line and cross-line updates and
/// duplicate inserts, the zero-hash key and `u64::MAX` among few others.
#[test]
fn checker_small_key_space_both_durabilities() {
    for d in [Durability::Strict, Durability::Relaxed] {
        let r = assert_clean(&config(d, 7, 40, 3000, 2000));
        assert!(
            detail(&r, "in-place updates") + detail(&r, "same-line updates") > 0,
            "{}: no update took the in-line paths",
            d.name()
        );
    }
}
