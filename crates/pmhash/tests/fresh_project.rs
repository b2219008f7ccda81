//! What a new user does first: `cargo new`, add `pmhash` by path, paste the
//! front page's first example, `cargo run`. This test does exactly that
//! with the example as `src/lib.rs`'s documentation has it, in a fresh
//! project outside the workspace, with its own target directory (under
//! this workspace's `target/`, so a second run is incremental).
//!
//! The fresh project starts from this workspace's `Cargo.lock`, so it
//! builds with the same dependency versions and needs no registry access
//! beyond what the workspace's own build fetched.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The first fenced Rust example of the crate's front page (`//!` lines of
/// `src/lib.rs`), without its hidden (`# `) lines' markers.
fn front_page_example() -> String {
    let lib = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs"))
        .expect("read src/lib.rs");
    let mut code = Vec::new();
    let mut inside = false;
    for line in lib.lines() {
        let Some(doc) = line.strip_prefix("//!") else {
            continue;
        };
        let doc = doc.strip_prefix(' ').unwrap_or(doc);
        if doc.starts_with("```") {
            if inside {
                break;
            }
            inside = true;
            continue;
        }
        if inside {
            // A hidden line (`# code`, after any indentation) is code too.
            let indent = &doc[..doc.len() - doc.trim_start().len()];
            let rest = doc.trim_start();
            let text = match rest.strip_prefix("# ") {
                Some(hidden) => format!("{indent}{hidden}"),
                None if rest == "#" => String::new(),
                None => doc.to_string(),
            };
            code.push(text);
        }
    }
    assert!(!code.is_empty(), "src/lib.rs's front page has no example");
    code.join("\n") + "\n"
}

#[test]
fn a_fresh_project_runs_the_front_page_example() {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let workspace = manifest_dir
        .parent()
        .and_then(Path::parent)
        .expect("workspace root");
    let target = workspace.join("target").join("fresh-project");
    let project = std::env::temp_dir().join(format!("pmhash-fresh-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&project);

    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(&cargo)
        .args(["new", "--bin", "--name", "hello-pmhash", "--vcs", "none"])
        .arg(&project)
        .output()
        .expect("cargo new");
    assert!(
        out.status.success(),
        "cargo new: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The project is not part of this workspace: an empty [workspace]
    // table makes it its own root.
    let manifest = std::fs::read_to_string(project.join("Cargo.toml")).expect("manifest");
    let manifest = format!(
        "{manifest}pmhash = {{ path = {:?} }}\n\n[workspace]\n",
        manifest_dir.display().to_string()
    );
    std::fs::write(project.join("Cargo.toml"), manifest).expect("write manifest");
    std::fs::copy(workspace.join("Cargo.lock"), project.join("Cargo.lock")).expect("lock file");
    let example = front_page_example();
    assert!(
        example.contains("fn main"),
        "the front page example has its own main"
    );
    std::fs::write(project.join("src/main.rs"), &example).expect("write main.rs");

    let out = Command::new(&cargo)
        .arg("run")
        .arg("--quiet")
        .current_dir(&project)
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("RUSTFLAGS")
        .output()
        .expect("cargo run");
    assert!(
        out.status.success(),
        "the front page example failed in a fresh project:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(&project).expect("remove project");
}
