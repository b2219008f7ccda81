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

/// The engine's tallies after the checker's dry run (`Report::detail` is
/// its `stats().detail`).
fn tallies(r: &Report) -> pmhash_hmeh::Tallies {
    pmhash_hmeh::Tallies::from_detail(&r.detail)
        .unwrap_or_else(|| panic!("the report's detail is not hmeh's tallies: {:?}", r.detail))
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
    let r = crashtest::run(&pmhash_hmeh::spec(), c).expect("the crash test runs");
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
        splits += tallies(&r).splits;
        node_splits += tallies(&r).node_splits;
        merges += tallies(&r).merges;
        assert_eq!(tallies(&r).backups_made, 0, "strict mode made a backup");
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
        backups += tallies(&r).backups_made;
        splits += tallies(&r).splits;
        merges += tallies(&r).merges;
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
            tallies(&r).inplace_updates + tallies(&r).same_line_updates > 0,
            "{}: no update took the in-line paths",
            d.name()
        );
    }
}
