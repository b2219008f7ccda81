//! ROPHI as the conformance suite (`engine::testkit::suite`) sees it: how
//! a table is made and opened, its test pools, its corruption list.

use std::sync::Arc;

use engine::testkit::image::patch;
use engine::testkit::Subject;
use engine::{EngineConfig, Result};
use pmem::Pool;
use pmhash_rophi::layout::*;
use pmhash_rophi::Rophi;

/// ROPHI as the suite sees it.
pub(crate) struct RophiSubject;

impl Subject for RophiSubject {
    type E = Rophi;
    const NAME: &'static str = "Rophi";
    const LAYOUT: &'static str = pmhash_rophi::LAYOUT;
    const UUID_TAG: [u8; 16] = *b"rophi-test-uuid!";
    const TEMP_PREFIX: &'static str = "rophi-test";

    fn create(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Rophi> {
        Rophi::create(pool, cfg)
    }

    fn open(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Rophi> {
        Rophi::open(pool, cfg)
    }

    fn corruptions(good: &[u8], root: u64) -> Vec<(String, Vec<u8>)> {
        let desc = engine::testkit::image::word(good, root + R_TABLE);
        let table = Table::from_desc(desc).off;
        vec![
            ("root magic".into(), patch(good, &[(root, ROOT_MAGIC ^ 1)])),
            (
                "table descriptor".into(),
                patch(good, &[(root + R_TABLE, !desc)]),
            ),
            (
                "table magic".into(),
                patch(good, &[(table, TABLE_MAGIC ^ 1)]),
            ),
            ("table k".into(), patch(good, &[(table + T_K, 63)])),
        ]
    }
}
