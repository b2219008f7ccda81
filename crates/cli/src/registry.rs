//! Every engine this build knows, by name: the persistent engines, the
//! crash checker's reference structures, and the DRAM baselines.

use engine::EngineSpec;

/// All engines, persistent first.
pub(crate) fn all() -> Vec<EngineSpec> {
    let mut v = vec![
        level::spec(),
        hmeh::spec(),
        pass::spec(),
        pass::spec_var(),
        pass::spec_dense(),
        rophi::spec(),
        store::spec(),
        store::store_spec!(hmeh::spec, "store-hash", false),
        store::store_spec!(hmeh::spec, "store-both", true),
    ];
    // The persistent engines behind a DRAM cuckoo filter: pools of the
    // inner engine's layout (`find_layout` meets the unfiltered one first).
    v.extend([
        engine::filtered_spec!(level::spec, "level+filter"),
        engine::filtered_spec!(hmeh::spec, "hmeh+filter"),
        engine::filtered_spec!(pass::spec, "pass+filter"),
        engine::filtered_spec!(pass::spec_var, "pass-var+filter"),
        engine::filtered_spec!(pass::spec_dense, "pass-dense+filter"),
    ]);
    v.extend(engine::reference_engines());
    v.extend(bench::baselines());
    v
}

/// The engine called `name`, or an error listing the known names.
pub(crate) fn find(name: &str) -> Result<EngineSpec, String> {
    let all = all();
    all.iter().find(|s| s.name == name).copied().ok_or_else(|| {
        let names: Vec<&str> = all.iter().map(|s| s.name).collect();
        format!("unknown engine {name:?}; known: {}", names.join(", "))
    })
}

/// The (correct) persistent engine that writes pools of `layout`.
pub(crate) fn find_layout(layout: &str) -> Option<EngineSpec> {
    all().into_iter().find(|s| {
        !s.name.ends_with("-misordered")
            && matches!(s.kind, engine::EngineKind::Persistent { layout: l, .. } if l == layout)
    })
}
