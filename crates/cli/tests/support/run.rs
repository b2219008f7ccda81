//! Runs the `pmhash` binary of this build, for the tests that drive it as
//! a user does.

use std::process::Command;

/// Runs `pmhash ARGS`; its exit code (-1 for a signal) and its stdout
/// followed by its stderr.
pub(crate) fn pmhash(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pmhash"))
        .args(args)
        .output()
        .expect("runs pmhash");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}
