//! Gives the shared library the SONAME `libpmhash.so`, the name it is
//! installed under, so that programs linked against it ask for that file.

fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libpmhash.so");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
