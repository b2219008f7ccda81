//! The calls `python/benches/throughput.py` makes, from Rust through the
//! front crate with the same options: the cost of the store itself, to
//! subtract from the Python figures.
//!
//! `cargo run --release --example store_calls -- [KEYS] [DIR]` from
//! `python/` (defaults: 200000 keys, the temporary directory).

use std::time::Instant;

fn per_op<R>(label: &str, n: u64, f: impl FnOnce() -> R) -> R {
    let t = Instant::now();
    let r = f();
    let us = t.elapsed().as_secs_f64() / n as f64 * 1e6;
    println!("{label:<36} {us:>6.2} us/op");
    r
}

fn main() -> Result<(), pmhash::Error> {
    let mut args = std::env::args().skip(1);
    let n: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let root = args
        .next()
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = root.join(format!("pmhash-store-calls-{}", std::process::id()));
    let store = pmhash::Store::options().expected_keys(n).open(&dir)?;
    // 8 random bytes a key (xorshift64), 8 bytes a value.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let keys: Vec<[u8; 8]> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect();
    let value = [b'v'; 8];
    per_op("Store::put, new keys", n, || {
        keys.iter().try_for_each(|k| store.put(k, &value))
    })?;
    per_op("Store::put, the same keys again", n, || {
        keys.iter().try_for_each(|k| store.put(k, &value))
    })?;
    per_op("Store::get", n, || {
        keys.iter().try_for_each(|k| store.get(k).map(drop))
    })?;
    store.close()?;
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}
