//! A seeded crash-checker run of the store repeats exactly: the same
//! fences, crash states and figures, so "a change never lowers the state
//! counts" can be checked for the store as for every hash engine. GC
//! reclaims a file's keys in file order (a hash map's order would change
//! its relocations, and so its fences, from run to run).

use engine::crashtest::{run, Config};

fn once(seed: u64) -> (u64, u64, u64, u64) {
    let cfg = Config {
        ops: 4000,
        states: 200,
        seed,
        ..Config::default()
    };
    let r = run(&pmhash_store::spec(), &cfg).expect("crash checker run");
    assert_eq!(r.violations, 0, "{:?}", r.messages);
    (r.fences, r.states, r.recovery_crashes, r.leaked_bytes)
}

#[test]
fn a_seeded_crash_checker_run_repeats_exactly() {
    for seed in [29, 4242] {
        let first = once(seed);
        for _ in 0..2 {
            assert_eq!(once(seed), first, "seed {seed}: the run did not repeat");
        }
    }
}
