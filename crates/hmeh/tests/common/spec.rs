//! OP-HMEH as the conformance suite (`engine::testkit::suite`) sees it:
//! how a table is made and opened, its test pools, its corruption list.

use std::sync::Arc;

use engine::testkit::image::{patch, patch_byte, word};
use engine::testkit::Subject;
use engine::{EngineConfig, Result};
use pmem::Pool;
use pmhash_hmeh::Hmeh;

use super::off;

/// OP-HMEH as the suite sees it.
pub(crate) struct HmehSubject;

impl Subject for HmehSubject {
    type E = Hmeh;
    const NAME: &'static str = "Hmeh";
    const LAYOUT: &'static str = pmhash_hmeh::LAYOUT;
    const UUID_TAG: [u8; 16] = *b"hmeh-tests-uuid!";
    const TEMP_PREFIX: &'static str = "hmeh-test";

    fn create(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Hmeh> {
        Hmeh::create(pool, cfg)
    }

    fn open(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Hmeh> {
        Hmeh::open(pool, cfg)
    }

    /// The root block's magic, geometry and radix-tree root words
    /// (`off`, from `crates/hmeh/src/layout.rs`).
    fn corruptions(good: &[u8], root: u64) -> Vec<(String, Vec<u8>)> {
        let geometry = word(good, root + off::R_GEOMETRY);
        vec![
            (
                "root magic".into(),
                patch_byte(good, root, good[root as usize] ^ 0x20),
            ),
            (
                "geometry".into(),
                patch(good, &[(root + off::R_GEOMETRY, !geometry)]),
            ),
            (
                "radix-tree root".into(),
                patch(good, &[(root + off::R_RT_ROOT, 1 << 50)]),
            ),
        ]
    }
}
