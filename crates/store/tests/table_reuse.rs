//! The DRAM point index's tables are rebuilt into blocks of the store's
//! block pool, and a replaced table's block is freed by the maintenance
//! thread and handed to a later rebuild (`blocks.rs`). Here two writers
//! grow, drain and regrow their own key ranges (shards' tables grow past
//! the pool's smallest block, are rebuilt without their tombstones, and
//! take reused blocks), while two readers get a stable set of 8-byte keys
//! through the inline-value path and must always find each one with its
//! own value, and see a writer's key either absent or with its value; each
//! writer finds its deleted keys absent and its put keys with their values.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use engine::testkit::{mem_pool, test_pool_options, Rng};
use pmem::Mode;
use pmhash_store::{CreateOptions, GcMode, OpenOptions, Options, Store, LAYOUT};

/// Keys every reader checks; present from start to end.
const STABLE: u64 = 20_000;
/// Keys each writer puts, deletes and puts again: with the stable ones,
/// about 300 keys per shard at the peak, so the tables reach 16–32 KiB.
const CHURN: u64 = 140_000;
const WRITERS: u64 = 2;
const READERS: u64 = 2;

fn value_of(k: u64) -> u64 {
    k.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5555
}

#[test]
fn readers_see_exact_values_while_tables_are_rebuilt_into_reused_blocks() {
    let o = Options {
        create: CreateOptions {
            pool_size: 64 << 20,
            clusters: 2,
            ..Default::default()
        },
        open: OpenOptions {
            mode: Mode::Volatile,
            max_pool_size: 1 << 30,
            gc: GcMode::Background,
            // The point index starts at its smallest and grows.
            expected_keys: 0,
            ..Default::default()
        },
    };
    let pool = mem_pool(&test_pool_options(
        LAYOUT,
        b"store-tablereuse",
        Mode::Volatile,
        o.create.pool_size,
        o.open.max_pool_size,
        7,
    ));
    let store = Arc::new(Store::open_pool(pool, o).unwrap());
    for k in 0..STABLE {
        store
            .put(&k.to_be_bytes(), &value_of(k).to_le_bytes())
            .unwrap();
    }
    let before = store.stats().structural_changes;
    let done = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..READERS)
        .map(|r| {
            let (store, done, reads) = (store.clone(), done.clone(), reads.clone());
            std::thread::spawn(move || {
                let mut rng = Rng::new(100 + r);
                let mut out = [0u8; 8];
                let mut n = 0u64;
                while !done.load(Ordering::Relaxed) {
                    let k = rng.below(STABLE);
                    let got = store.get_into_slice(&k.to_be_bytes(), &mut out).unwrap();
                    assert_eq!(got, Some(8), "stable key {k} missing");
                    assert_eq!(u64::from_le_bytes(out), value_of(k), "stable key {k}");
                    // A writer's key: absent, or with its own value.
                    let c = STABLE + rng.below(WRITERS * CHURN);
                    if let Some(len) = store.get_into_slice(&c.to_be_bytes(), &mut out).unwrap() {
                        assert_eq!(len, 8);
                        assert_eq!(u64::from_le_bytes(out), value_of(c), "churn key {c}");
                    }
                    n += 1;
                }
                reads.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let store = store.clone();
            std::thread::spawn(move || {
                // Only this writer touches its range: each key reads as
                // written, and deleted keys stay absent through rebuilds.
                let keys = STABLE + w * CHURN..STABLE + (w + 1) * CHURN;
                let mut out = [0u8; 8];
                for round in 0..3 {
                    for k in keys.clone() {
                        let kb = k.to_be_bytes();
                        assert_eq!(store.get_into_slice(&kb, &mut out).unwrap(), None);
                        store.put(&kb, &value_of(k).to_le_bytes()).unwrap();
                    }
                    if round < 2 {
                        for k in keys.clone() {
                            let kb = k.to_be_bytes();
                            assert_eq!(store.get_into_slice(&kb, &mut out).unwrap(), Some(8));
                            assert_eq!(u64::from_le_bytes(out), value_of(k), "key {k}");
                            assert!(store.delete(&kb).unwrap(), "key {k}");
                        }
                    }
                }
            })
        })
        .collect();
    for w in writers {
        w.join().expect("writer");
    }
    done.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().expect("reader");
    }
    assert!(reads.load(Ordering::Relaxed) > 0);
    // Every shard grew past the pool's smallest block and was rebuilt
    // again as its tombstones filled it.
    let rebuilds = store.stats().structural_changes - before;
    assert!(rebuilds > 4 * 1024, "only {rebuilds} table rebuilds");
    let mut out = [0u8; 8];
    for k in 0..STABLE + WRITERS * CHURN {
        assert_eq!(
            store.get_into_slice(&k.to_be_bytes(), &mut out).unwrap(),
            Some(8),
            "key {k}"
        );
        assert_eq!(u64::from_le_bytes(out), value_of(k), "key {k}");
    }
}
