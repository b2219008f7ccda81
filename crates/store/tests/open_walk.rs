//! The open's check of a persistent hmeh index's slots runs on the
//! machine's threads, each walking one part of the table
//! (`Engine::for_each_part`): a slot damaged in the last part is refused
//! as one in the first is, by a read-only and a writable open alike, and
//! the refused file is left byte for byte as it was.

use std::sync::Arc;

use engine::testkit::TempDir;
use engine::{Engine, EngineConfig};
use pmem::{Mode, Pool, PoolOptions};
use pmhash_store::{CreateOptions, GcMode, IndexKind, OpenOptions, Options, Store, POOL_FILE};

fn opts(read_only: bool) -> Options {
    Options {
        create: CreateOptions {
            pool_size: 8 << 20,
            clusters: 2,
            extent_size: 1 << 20,
            nodes: Some(1),
            index: IndexKind::Hash(hmeh::spec()),
            ..Default::default()
        },
        open: OpenOptions {
            mode: Mode::Mapped,
            max_pool_size: 32 << 20,
            gc: GcMode::Manual,
            raf_bytes: 0,
            recovery_threads: 1,
            expected_keys: 4000,
            read_only,
            ..Default::default()
        },
    }
}

fn word(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}

/// A value the hmeh index holds in part `part` of `parts` of its walk.
fn a_value_in_part(path: &std::path::Path, part: usize, parts: usize) -> u64 {
    let ro = PoolOptions {
        mode: Mode::Mapped,
        read_only: true,
        ..PoolOptions::default()
    };
    let pool = Arc::new(Pool::open(path, &ro).unwrap());
    let e = hmeh::Hmeh::open(pool, &EngineConfig::default()).unwrap();
    let mut v = None;
    e.for_each_part(part, parts, &mut |_, x| {
        v.get_or_insert(x);
    });
    v.expect("a value in that part")
}

#[test]
fn a_slot_damaged_in_any_part_of_the_walk_is_refused_untouched() {
    let dir = TempDir::new("store-open-walk", "parts");
    let st = Store::open(dir.path(), opts(false)).unwrap();
    for i in 0..3000u32 {
        st.put(format!("key-{i:05}").as_bytes(), &[i as u8; 40])
            .unwrap();
    }
    st.close().unwrap();
    drop(st);
    let path = dir.path().join(POOL_FILE);
    let good = std::fs::read(&path).unwrap();
    let parts = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 8);
    for part in [0, parts - 1] {
        let v = a_value_in_part(&path, part, parts);
        // The cross-KV slot naming `v`: value bits 63..32 in word 0's low
        // half, 31..0 in word 1's.
        let at: Vec<usize> = (0..good.len() - 16)
            .step_by(16)
            .filter(|&o| {
                word(&good, o) & 0xffff_ffff == v >> 32
                    && word(&good, o + 8) & 0xffff_ffff == v & 0xffff_ffff
                    && word(&good, o) >> 32 | word(&good, o + 8) >> 32 != 0
            })
            .collect();
        assert_eq!(at.len(), 1, "part {part}: the slot naming {v:#x}, once");
        let mut bad = good.clone();
        // Off an entry boundary, inside the same entry.
        let w1 = word(&good, at[0] + 8) + 8;
        bad[at[0] + 8..at[0] + 16].copy_from_slice(&w1.to_le_bytes());
        for read_only in [true, false] {
            std::fs::write(&path, &bad).unwrap();
            let what = format!("part {part} of {parts}, read_only {read_only}");
            match Store::open(dir.path(), opts(read_only)) {
                Ok(_) => panic!("{what}: an open accepted a slot off an entry boundary"),
                Err(e) => {
                    let m = e.to_string();
                    assert!(
                        m.contains("entry boundary") && m.contains("pmhash check"),
                        "{what}: {m}"
                    );
                }
            }
            assert!(
                std::fs::read(&path).unwrap() == bad,
                "{what}: the file changed"
            );
        }
    }
    std::fs::write(&path, &good).unwrap();
    let st = Store::open(dir.path(), opts(false)).unwrap();
    assert_eq!(st.len(), 3000);
    st.close().unwrap();
}
