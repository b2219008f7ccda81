//! The engine conformance suite (`engine::testkit::suite`) on each
//! persistent engine behind the DRAM cuckoo filter (`engine::filtered`):
//! model runs, races, reopen and crash-reopen (the filter rebuilt at
//! open), and bad pools refused untouched. The pool format is the inner
//! engine's, so the corruption list is the one byte every inner format
//! checks first, its root magic; each engine's own list runs in its crate.
//! Filter-specific checks (growths, false positives, lost removes,
//! registry wiring) are in `filtered.rs`.

/// A filtered engine as the suite sees it: `$inner` (a registry entry's
/// `fn() -> EngineSpec`) behind a filter named `$name`, with the inner
/// pool layout `$layout`.
macro_rules! filtered_subject {
    ($module:ident, $inner:path, $name:literal, $layout:expr, $tag:literal) => {
        mod $module {
            use std::sync::Arc;

            use engine::filtered::Filtered;
            use engine::testkit::image::patch_byte;
            use engine::testkit::Subject;
            use engine::{EngineConfig, Result};
            use pmem::Pool;

            pub(crate) struct Spec;

            impl Subject for Spec {
                type E = Filtered;
                const NAME: &'static str = $name;
                const LAYOUT: &'static str = $layout;
                const UUID_TAG: [u8; 16] = *$tag;
                const TEMP_PREFIX: &'static str = "pmhash-filtered-suite";

                fn create(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Filtered> {
                    Filtered::create($inner, $name, pool, cfg)
                }

                fn open(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Filtered> {
                    Filtered::open($inner, $name, pool, cfg)
                }

                fn corruptions(good: &[u8], root: u64) -> Vec<(String, Vec<u8>)> {
                    vec![(
                        "root magic".into(),
                        patch_byte(good, root, good[root as usize] ^ 0x20),
                    )]
                }
            }

            engine::conformance_suite!(Spec);
        }
    };
}

filtered_subject!(
    level_filter,
    level::spec,
    "level+filter",
    level::LAYOUT,
    b"level+filter-tag"
);
filtered_subject!(
    hmeh_filter,
    hmeh::spec,
    "hmeh+filter",
    hmeh::LAYOUT,
    b"hmeh+filter-tags"
);
filtered_subject!(
    pass_filter,
    pass::spec,
    "pass+filter",
    pass::LAYOUT,
    b"pass+filter-tags"
);
filtered_subject!(
    pass_var_filter,
    pass::spec_var,
    "pass-var+filter",
    pass::LAYOUT,
    b"pass-var+filter!"
);
filtered_subject!(
    pass_dense_filter,
    pass::spec_dense,
    "pass-dense+filter",
    pass::LAYOUT,
    b"pass-dense+filt!"
);
