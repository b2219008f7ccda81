//! A crash-safe counter: counts up in a pool file and prints each value
//! once it is durable. Kill it at any moment (`kill -9` included) and run
//! it again: it goes on from the last value it printed, or the one after
//! it (an increment that was cut by the kill either happened or did not).
//!
//! ```sh
//! cargo run --release --example counter -- /tmp/counter.pool          # counts until killed
//! cargo run --release --example counter -- /tmp/counter.pool 1000     # counts 1000 more, then exits
//! ```
//!
//! `tests/counter.rs` kills it with SIGKILL mid-count and checks exactly
//! that promise.

use std::io::Write;
use std::process::ExitCode;

use pmhash::{Durability, Index};

/// The key the count is kept under.
const COUNT: u64 = 0;

fn run(path: &str, steps: Option<u64>) -> Result<(), Box<dyn std::error::Error>> {
    // Strict durability: `update` returns only once the new value is in
    // the pool, so a value printed below survives any crash after it.
    let index = Index::options()
        .durability(Durability::Strict)
        .open_or_create(path)?;
    let mut count = match index.get(COUNT) {
        Some(c) => c,
        None => {
            index.insert(COUNT, 0)?;
            0
        }
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "start {count}")?;
    out.flush()?;
    let mut done = 0;
    while steps.is_none_or(|s| done < s) {
        count += 1;
        index.update(COUNT, count)?;
        writeln!(out, "{count}")?;
        out.flush()?;
        done += 1;
    }
    index.close()?;
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (path, steps) = match args.as_slice() {
        [p] => (p, None),
        [p, n] => match n.parse() {
            Ok(n) => (p, Some(n)),
            Err(_) => {
                eprintln!("counter: {n:?} is not a number of steps");
                return ExitCode::FAILURE;
            }
        },
        _ => {
            eprintln!("usage: counter POOL [STEPS]");
            return ExitCode::FAILURE;
        }
    };
    match run(path, steps) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("counter: {e}");
            ExitCode::FAILURE
        }
    }
}
