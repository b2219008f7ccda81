//! Level hashing as the conformance suite (`engine::testkit::suite`) sees
//! it: how a table is made and opened, its test pools, its corruption
//! list.

use std::sync::Arc;

use engine::testkit::image::{patch_byte, word};
use engine::testkit::Subject;
use engine::{EngineConfig, Result};
use pmem::Pool;
use pmhash_level::Level;

/// Level hashing as the suite sees it.
pub(crate) struct LevelSubject;

impl Subject for LevelSubject {
    type E = Level;
    const NAME: &'static str = "Level";
    const LAYOUT: &'static str = pmhash_level::LAYOUT;
    const UUID_TAG: [u8; 16] = *b"level-tests-uuid";
    const TEMP_PREFIX: &'static str = "level-test";

    fn create(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Level> {
        Level::create(pool, cfg)
    }

    fn open(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Level> {
        Level::open(pool, cfg)
    }

    /// The root's magic, and the current geometry record (root + 64 + 64 ·
    /// (selector mod 2), docs/engines/level.md) with a byte flipped.
    fn corruptions(good: &[u8], root: u64) -> Vec<(String, Vec<u8>)> {
        let flip = |off: u64, mask: u8| patch_byte(good, off, good[off as usize] ^ mask);
        let rec = root + 64 + (word(good, root + 24) % 2) * 64;
        vec![
            ("root magic".into(), flip(root, 0x20)),
            ("geometry record, first byte".into(), flip(rec, 0x01)),
            ("geometry record, byte 17".into(), flip(rec + 17, 0x80)),
            ("selector bit 1".into(), flip(root + 24, 0x02)),
        ]
    }
}
