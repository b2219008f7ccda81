//! The conformance suite (`pmhash_engine::testkit::suite`) on the crash
//! checker's reference structure, and the suite catching a subject whose
//! "corruption" damages nothing the engine reads (an open that accepts a
//! pool the suite expects refused must fail the suite).

use std::sync::Arc;

use pmem::Pool;
use pmhash_engine::slotarray::SlotArray;
use pmhash_engine::testkit::image::patch_byte;
use pmhash_engine::testkit::Subject;
use pmhash_engine::{EngineConfig, Result};

/// The slot array as the suite sees it (a fixed-size table: opened with
/// room for every key the suite puts).
struct SlotArraySubject;

impl Subject for SlotArraySubject {
    type E = SlotArray;
    const NAME: &'static str = "SlotArray";
    const LAYOUT: &'static str = pmhash_engine::slotarray::LAYOUT;
    const UUID_TAG: [u8; 16] = *b"slotarray-tests!";
    const TEMP_PREFIX: &'static str = "slotarray-test";
    const OPEN_CAPACITY: u64 = 1 << 15;

    fn create(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<SlotArray> {
        SlotArray::create(pool, cfg, false)
    }

    fn open(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<SlotArray> {
        SlotArray::open(pool, cfg, false)
    }

    /// The table's magic (its first word, at the root).
    fn corruptions(good: &[u8], root: u64) -> Vec<(String, Vec<u8>)> {
        vec![(
            "table magic".into(),
            patch_byte(good, root, good[root as usize] ^ 0x20),
        )]
    }
}

pmhash_engine::conformance_suite!(SlotArraySubject);

/// The slot array with a corruption list whose entry changes a byte of
/// the file's free tail, which no open reads.
struct HarmlessDamage;

impl Subject for HarmlessDamage {
    type E = SlotArray;
    const NAME: &'static str = "SlotArray";
    const LAYOUT: &'static str = pmhash_engine::slotarray::LAYOUT;
    const UUID_TAG: [u8; 16] = *b"slotarray-tests!";
    const TEMP_PREFIX: &'static str = "slotarray-test";
    const OPEN_CAPACITY: u64 = 1 << 15;

    fn create(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<SlotArray> {
        SlotArray::create(pool, cfg, false)
    }

    fn open(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<SlotArray> {
        SlotArray::open(pool, cfg, false)
    }

    fn corruptions(good: &[u8], _root: u64) -> Vec<(String, Vec<u8>)> {
        let last = good.len() as u64 - 1;
        vec![(
            "free tail".into(),
            patch_byte(good, last, good[last as usize] ^ 1),
        )]
    }
}

#[test]
#[should_panic(expected = "open accepted it")]
fn the_suite_fails_a_pool_the_engine_accepts() {
    pmhash_engine::testkit::suite::corruptions_are_refused_untouched::<HarmlessDamage>();
}
