//! Checks every engine's tests share: an engine's whole contents against
//! a model, and its `stats()` figures by name.

use std::collections::HashMap;

use pmem::Pool;

use crate::Engine;

/// A figure from `stats().detail`, parsed (panics if absent or not a number).
pub fn detail(e: &dyn Engine, name: &str) -> f64 {
    e.stats()
        .detail
        .iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("stats().detail has no {name:?}"))
        .1
        .parse()
        .unwrap_or_else(|_| panic!("detail {name:?} is not a number"))
}

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
