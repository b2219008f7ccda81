//! A u64 index program: loads N keys into a pool file with the engine you
//! name, reads them back, reopens the pool and reads them again, printing
//! the rates and the table's shape.
//!
//! ```sh
//! cargo run --release --example index -- /dev/shm/ix.pool pass 1000000
//! ```

use std::process::ExitCode;
use std::time::Instant;

use pmhash::Index;

fn run(path: &str, engine: &str, n: u64) -> Result<(), pmhash::Error> {
    let _ = std::fs::remove_file(path);
    let index = Index::options().engine(engine).create(path)?;
    let t = Instant::now();
    for k in 0..n {
        index.insert(k.wrapping_mul(0x9E37_79B9_7F4A_7C15), k)?;
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "{engine}: inserted {n} keys in {secs:.2} s ({:.2} Mops/s)",
        n as f64 / secs / 1e6
    );
    let s = index.stats();
    println!(
        "  {} keys, load factor {:.2}, {:.1} PM bytes/key, {:.1} DRAM bytes/key",
        s.len,
        s.load_factor,
        s.pm_bytes as f64 / s.len.max(1) as f64,
        s.dram_bytes as f64 / s.len.max(1) as f64
    );
    index.close()?;

    let t = Instant::now();
    let index = Index::open(path)?;
    println!("  reopened in {:.3} s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    let mut found = 0u64;
    for k in 0..n {
        if index.get(k.wrapping_mul(0x9E37_79B9_7F4A_7C15)) == Some(k) {
            found += 1;
        }
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "  read {found} of {n} back in {secs:.2} s ({:.2} Mops/s)",
        n as f64 / secs / 1e6
    );
    index.close()?;
    std::fs::remove_file(path).map_err(|e| pmhash::Error::InvalidArgument(e.to_string()))?;
    if found != n {
        return Err(pmhash::Error::Corrupt(format!(
            "{} keys missing",
            n - found
        )));
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (path, engine, n) = match args.as_slice() {
        [p] => (p.as_str(), "pass", 100_000),
        [p, e] => (p.as_str(), e.as_str(), 100_000),
        [p, e, n] => match n.parse() {
            Ok(n) => (p.as_str(), e.as_str(), n),
            Err(_) => {
                eprintln!("index: {n:?} is not a key count");
                return ExitCode::FAILURE;
            }
        },
        _ => {
            eprintln!(
                "usage: index POOL [ENGINE [KEYS]]   (engines: {})",
                engine_names()
            );
            return ExitCode::FAILURE;
        }
    };
    match run(path, engine, n) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("index: {e}");
            ExitCode::FAILURE
        }
    }
}

fn engine_names() -> String {
    pmhash::index_engines()
        .iter()
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}
