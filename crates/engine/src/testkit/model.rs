//! Model runs: an engine's whole contents checked against a model, and
//! versioned values whose versions a reader can decode.

use std::collections::HashMap;

use pmem::Pool;

use crate::Engine;

/// Everything the engine holds must equal `model`: `for_each` visits each
/// pair exactly once, `len` and `get` of every key agree, `get` of each key
/// in `absent` that the model lacks is `None`, and `check()` passes with
/// the model's key count and no leaked byte (reachable = the allocator's
/// bytes in use).
pub fn verify_model(
    e: &dyn Engine,
    pool: &Pool,
    model: &HashMap<u64, u64>,
    absent: &[u64],
    ctx: &str,
) {
    let mut seen: HashMap<u64, u64> = HashMap::with_capacity(model.len());
    let mut dup = None;
    e.for_each(&mut |k, v| {
        if seen.insert(k, v).is_some() && dup.is_none() {
            dup = Some(k);
        }
    });
    assert_eq!(dup, None, "{ctx}: for_each visited a key twice");
    if seen != *model {
        let missing: Vec<_> = model
            .keys()
            .filter(|k| !seen.contains_key(k))
            .take(5)
            .collect();
        let extra: Vec<_> = seen
            .keys()
            .filter(|k| !model.contains_key(k))
            .take(5)
            .collect();
        let wrong: Vec<_> = model
            .iter()
            .filter(|(k, v)| seen.get(k).is_some_and(|s| s != *v))
            .take(5)
            .collect();
        panic!(
            "{ctx}: for_each differs from the model ({} vs {} keys): missing {missing:x?}, extra {extra:x?}, wrong (key, model value) {wrong:x?}",
            seen.len(),
            model.len()
        );
    }
    assert_eq!(e.len(), model.len() as u64, "{ctx}: len()");
    for (&k, &v) in model {
        assert_eq!(e.get(k), Some(v), "{ctx}: get({k:#x})");
    }
    for &k in absent {
        if !model.contains_key(&k) {
            assert_eq!(e.get(k), None, "{ctx}: get({k:#x}) of an absent key");
        }
    }
    let r = e
        .check()
        .unwrap_or_else(|err| panic!("{ctx}: check() failed: {err}"));
    assert_eq!(r.keys, model.len() as u64, "{ctx}: check().keys");
    assert_eq!(
        r.reachable_bytes,
        pool.stats().bytes_in_use,
        "{ctx}: reachable bytes differ from the allocator's bytes in use (leak)"
    );
}

/// Versioned values for concurrent tests: `key.rotate_left(17) ^ ver · M`.
/// Any value a reader gets decodes back to a version with [`version_of`];
/// a torn value (halves of two writes) or one of another key decodes to
/// garbage.
pub const VER_MUL: u64 = 0x9e37_79b9_7f4a_7c15;
const VER_INV: u64 = crate::hash::inverse(VER_MUL);

/// Value number `ver` of `key`.
pub fn val(key: u64, ver: u64) -> u64 {
    key.rotate_left(17) ^ ver.wrapping_mul(VER_MUL)
}

/// The version a value of `key` was made with (garbage for a value that
/// was never made for `key`).
pub fn version_of(key: u64, v: u64) -> u64 {
    (v ^ key.rotate_left(17)).wrapping_mul(VER_INV)
}
