//! The checked-in header `include/pmhash.h` is what cbindgen makes of the
//! code now. `PMHASH_BLESS=1` rewrites it instead of comparing.

use std::path::Path;

#[test]
fn the_header_matches_the_code() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml"))
        .unwrap_or_else(|e| panic!("cbindgen.toml: {e}"));
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/lib.rs"))
        .generate()
        .unwrap_or_else(|e| panic!("cbindgen: {e}"))
        .write(&mut generated);
    let generated = String::from_utf8(generated).expect("cbindgen writes UTF-8");
    let path = dir.join("include/pmhash.h");
    if std::env::var_os("PMHASH_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &generated).expect("write include/pmhash.h");
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    if checked_in != generated {
        let first = checked_in
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(checked_in.lines().count().min(generated.lines().count()));
        panic!(
            "include/pmhash.h does not match the code (first difference at line {}); \
             regenerate it with:\n    PMHASH_BLESS=1 cargo test --release -p pmhash-ffi --test header",
            first + 1
        );
    }
}
