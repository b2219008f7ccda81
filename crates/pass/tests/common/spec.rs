//! PASS as the conformance suite (`engine::testkit::suite`) sees it: how
//! a table is made and opened, its test pools, its corruption list.

use std::sync::Arc;

use engine::testkit::image::{patch, word};
use engine::testkit::Subject;
use engine::{EngineConfig, Result};
use pmem::Pool;
use pmhash_pass::layout::*;
use pmhash_pass::{Options, Pass};

/// PASS as the suite sees it.
pub(crate) struct PassSubject;

impl Subject for PassSubject {
    type E = Pass;
    const NAME: &'static str = "Pass";
    const LAYOUT: &'static str = pmhash_pass::LAYOUT;
    const UUID_TAG: [u8; 16] = *b"pass-tests-uuid!";
    const TEMP_PREFIX: &'static str = "pass-test";
    // Every file PASS's bad-pool tests damage is a sound pool; only the
    // table in it is bad.
    const POOL_MAY_REFUSE: bool = false;

    fn create(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Pass> {
        Pass::create(pool, cfg)
    }

    fn open(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Pass> {
        Pass::open(pool, cfg)
    }

    fn corruptions(good: &[u8], root: u64) -> Vec<(String, Vec<u8>)> {
        let geo = word(good, root + R_GEO);
        let first = word(good, root + R_FIRST);
        vec![
            ("root magic".into(), patch(good, &[(root, ROOT_MAGIC ^ 1)])),
            ("geometry".into(), patch(good, &[(root + R_GEO, !geo)])),
            ("mapping table k".into(), patch(good, &[(root + R_K, 63)])),
            (
                "first".into(),
                patch(good, &[(root + R_FIRST, first ^ (1 << 40))]),
            ),
            (
                "octave table pointer".into(),
                patch(good, &[(root + R_TABLES, 1 << 50)]),
            ),
        ]
    }
}

/// PASS in bytes mode (keys out of line, `pmhash_pass::spec_var`): the same
/// table as [`PassSubject`], made with `bytes_keys`.
pub(crate) struct PassBytesSubject;

impl Subject for PassBytesSubject {
    type E = Pass;
    const NAME: &'static str = "Pass (bytes keys)";
    const LAYOUT: &'static str = PassSubject::LAYOUT;
    const UUID_TAG: [u8; 16] = PassSubject::UUID_TAG;
    const TEMP_PREFIX: &'static str = PassSubject::TEMP_PREFIX;
    const POOL_MAY_REFUSE: bool = PassSubject::POOL_MAY_REFUSE;

    fn create(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Pass> {
        let opts = Options {
            bytes_keys: true,
            ..Options::default()
        };
        Pass::create_with(pool, cfg, &opts)
    }

    fn open(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Pass> {
        Pass::open(pool, cfg)
    }

    fn corruptions(good: &[u8], root: u64) -> Vec<(String, Vec<u8>)> {
        PassSubject::corruptions(good, root)
    }
}
