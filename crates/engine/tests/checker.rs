//! The crash checker must pass a correct structure and catch a broken one.
//! A checker that never fails is no evidence, so both directions are tested.

use pmhash_engine::crashtest::{self, Config};
use pmhash_engine::{slotarray, Durability};

fn cfg(seed: u64, durability: Durability) -> Config {
    Config {
        ops: 600,
        states: 600,
        seed,
        durability,
        key_space: 120,
        ..Config::default()
    }
}

#[test]
fn correct_slot_array_passes_every_crash_state() {
    for durability in [Durability::Strict, Durability::Relaxed] {
        let r = crashtest::run(&slotarray::spec(), &cfg(7, durability)).expect("runs");
        assert!(r.states >= 590, "took {} states", r.states);
        assert_eq!(r.violations, 0, "{:#?}", r.messages);
        assert_eq!(r.leaked_bytes, 0);
        assert!(r.fences > 200, "workload issued only {} fences", r.fences);
    }
}

#[test]
fn misordered_slot_array_is_caught() {
    let r =
        crashtest::run(&slotarray::misordered_spec(), &cfg(7, Durability::Strict)).expect("runs");
    assert!(
        r.violations > 0,
        "the checker missed publish-before-persist"
    );
    assert!(
        r.messages
            .iter()
            .any(|m| m.contains("invented") || m.contains("wrong value")),
        "{:#?}",
        r.messages
    );
}

#[test]
fn reports_serialise_with_the_required_fields() {
    let r = crashtest::run(
        &slotarray::spec(),
        &Config {
            ops: 50,
            states: 40,
            ..Config::default()
        },
    )
    .unwrap();
    let j = r.to_json();
    for field in [
        "\"engine\":\"slotarray\"",
        "\"durability\":\"strict\"",
        "\"states\":",
        "\"violations\":0",
        "\"leaked_bytes\":0",
        "\"seed\":1",
    ] {
        assert!(j.contains(field), "{field} missing from {j}");
    }
}
