//! The C API driven from C: `install.sh` puts libpmhash, its header and
//! its pkg-config file under a scratch prefix, the system compiler (`cc`)
//! builds `c/test.c` against the shared library (flags from pkg-config)
//! and against the static one, and each program runs every check of
//! `c/test.c`. `c/bench.c` is built the same way and run on a few keys,
//! so that the benchmark keeps compiling and working.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `target/<profile>/deps`, where this test runs from: `cargo test` builds
/// the libraries there (it copies them up to `target/<profile>` only in
/// `cargo build`).
fn build_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    exe.parent()
        .expect("target/<profile>/deps/<test>")
        .to_path_buf()
}

fn run(cmd: &mut Command) -> String {
    let shown = format!("{cmd:?}");
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{shown}: cannot run: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{shown} failed ({}):\n{text}",
        out.status
    );
    text
}

/// A scratch prefix with libpmhash installed in it, and a scratch
/// directory for pools, both fresh and removed on drop.
struct Setup {
    root: PathBuf,
    prefix: PathBuf,
}

impl Setup {
    fn new(name: &str) -> Setup {
        let root = std::env::temp_dir().join(format!("pmhash-ffi-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let prefix = root.join("prefix");
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
        run(Command::new("sh")
            .arg(manifest.join("install.sh"))
            .arg(&prefix)
            .arg(build_dir()));
        Setup { root, prefix }
    }

    fn pkg_config(&self, args: &[&str]) -> Vec<String> {
        let out = run(Command::new("pkg-config")
            .args(args)
            .arg("pmhash")
            .env("PKG_CONFIG_PATH", self.prefix.join("lib/pkgconfig")));
        out.split_whitespace().map(String::from).collect()
    }

    /// Builds `c/<source>` into `<root>/<exe>`: against the shared library
    /// with pkg-config's flags, or against the static one.
    fn compile(&self, source: &str, exe: &str, shared: bool) -> PathBuf {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
        let out = self.root.join(exe);
        let mut cc = Command::new("cc");
        cc.args(["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror"])
            .arg(manifest.join("c").join(source))
            .arg("-o")
            .arg(&out)
            .args(self.pkg_config(&["--cflags"]));
        if shared {
            let libdir = self.prefix.join("lib");
            cc.args(self.pkg_config(&["--libs"]))
                .arg(format!("-Wl,-rpath,{}", libdir.display()));
        } else {
            // The archive itself, then the system libraries it needs
            // (pkg-config's Libs.private).
            cc.arg(self.prefix.join("lib/libpmhash.a")).args(
                self.pkg_config(&["--libs", "--static"])
                    .into_iter()
                    .filter(|f| f != "-lpmhash" && !f.starts_with("-L")),
            );
        }
        run(&mut cc);
        out
    }

    fn scratch(&self, name: &str) -> PathBuf {
        let dir = self.root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

#[test]
fn install_puts_libpmhash_the_header_and_pkg_config_in_place() {
    let s = Setup::new("install");
    for f in ["lib/libpmhash.so", "lib/libpmhash.a", "include/pmhash.h"] {
        assert!(s.prefix.join(f).is_file(), "{f} not installed");
    }
    let version = s.pkg_config(&["--modversion"]);
    assert_eq!(version, vec![env!("CARGO_PKG_VERSION").to_string()]);
    let libs = s.pkg_config(&["--libs", "--static"]);
    assert!(libs.contains(&"-lpmhash".to_string()), "{libs:?}");
    assert!(libs.contains(&"-lpthread".to_string()), "{libs:?}");
}

#[test]
fn the_c_test_passes_against_the_shared_library() {
    let s = Setup::new("shared");
    let exe = s.compile("test.c", "test-shared", true);
    // It really is the shared library that the program loads.
    let deps = run(Command::new("ldd").arg(&exe));
    assert!(deps.contains("libpmhash.so"), "{deps}");
    let out = run(Command::new(&exe).arg(s.scratch("pools")));
    assert!(out.contains("checks passed"), "{out}");
    assert!(
        out.contains("kill -9 (index)") && out.contains("kill -9 (store)"),
        "{out}"
    );
    println!("{out}");
}

#[test]
fn the_c_test_passes_against_the_static_library() {
    let s = Setup::new("static");
    let exe = s.compile("test.c", "test-static", false);
    let deps = run(Command::new("ldd").arg(&exe));
    assert!(!deps.contains("libpmhash"), "{deps}");
    let out = run(Command::new(&exe).arg(s.scratch("pools")));
    assert!(out.contains("checks passed"), "{out}");
    println!("{out}");
}

#[test]
fn the_c_benchmark_runs() {
    let s = Setup::new("bench");
    let exe = s.compile("bench.c", "bench", false);
    let pools = s.scratch("pools");
    let out = run(Command::new(&exe)
        .args(["--engine", "pass", "--keys", "20000", "--pool"])
        .arg(&pools));
    for workload in ["insert", "get-pos", "get-neg", "delete", "call"] {
        assert!(
            out.lines()
                .any(|l| l.starts_with(workload) && l.contains("Mops/s")),
            "no {workload} line in:\n{out}"
        );
    }
    assert!(out.contains("ns per call"), "{out}");
    println!("{out}");
}
