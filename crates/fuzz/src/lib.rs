//! Fuzz targets for every parser of untrusted bytes: the server's RESP
//! framing, its glob matcher, its commands over a socket, and the pool
//! readers (the pmem header and allocator, each engine's structures, the
//! store's logs). They run on stable Rust (`docs/fuzzing.md`).
//!
//! Why a hand-written mutation loop rather than a fuzzing crate:
//! cargo-fuzz and libFuzzer need nightly, and the stable random modes of
//! the front-ends (bolero, proptest) run a closure in the test's own
//! process. These targets need what those modes do not give: a case that
//! kills the process by a signal (a stack overflow, an abort, a SIGBUS in
//! a mapping) or that never returns must still be caught, named and saved,
//! and the pool target checks files on disk, not return values. So each
//! run is a parent that watches a worker process (`driver`); the worker
//! draws cases from seed corpora with the usual mutations (bit flips, byte
//! sets, interesting integers, splices, truncations, zeroed pages), all
//! from a seeded RNG, so that a case is reproduced from its seed and
//! number alone, and every failing input is also saved to a file.

mod commands;
mod driver;
mod glob;
mod mutate;
mod pools;
mod resp;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

pub use driver::{run, worker, Options};
pub use engine::scratch::Rng;

/// A violated property. `fatal`: the worker cannot go on after it (a
/// runaway thread, a dead server), so the run stops even with
/// `--keep-going`.
#[derive(Debug)]
pub struct Failure {
    /// What went wrong.
    pub msg: String,
    /// The worker cannot go on after it.
    pub fatal: bool,
    /// The input that reproduces it, when that is more than the case's
    /// own input (the commands target: the earlier cases that built the
    /// server's state, then this one).
    pub repro: Option<Vec<u8>>,
}

impl Failure {
    /// A failure the run may go on after.
    pub fn new(msg: impl Into<String>) -> Failure {
        Failure {
            msg: msg.into(),
            fatal: false,
            repro: None,
        }
    }
    /// A failure that stops the run (see `fatal`).
    pub fn fatal(msg: impl Into<String>) -> Failure {
        Failure {
            msg: msg.into(),
            fatal: true,
            repro: None,
        }
    }
}

/// One fuzz target: makes inputs and runs them.
pub trait Target {
    /// Makes one input from `rng` (deterministic: the same RNG state gives
    /// the same bytes, so a case is reproduced from its seed and number).
    fn generate(&mut self, rng: &mut Rng) -> Vec<u8>;
    /// Runs one input (a generated one or a saved one): `Err` when a
    /// property does not hold. A panic is caught by the driver.
    fn run(&mut self, input: &[u8]) -> Result<(), Failure>;
}

/// The targets, by name.
pub const TARGETS: [&str; 4] = ["resp", "glob", "commands", "pools"];

/// A fresh instance of the target called `name`.
pub fn target(name: &str) -> Result<Box<dyn Target>, String> {
    Ok(match name {
        "resp" => Box::new(resp::Resp),
        "glob" => Box::new(glob::Glob),
        "commands" => Box::new(commands::Commands::default()),
        "pools" => Box::new(pools::Pools::default()),
        "selftest" => Box::new(SelfTest),
        _ => {
            return Err(format!(
                "unknown target {name:?}; known: {}",
                TARGETS.join(", ")
            ))
        }
    })
}

/// The driver's own test target (not listed in [`TARGETS`]): an input
/// names what goes wrong (`abort`, `hang`, `panic`, `thread-panic`,
/// `fail`); anything else passes.
pub struct SelfTest;

impl Target for SelfTest {
    fn generate(&mut self, rng: &mut Rng) -> Vec<u8> {
        format!("pass {}", rng.next()).into_bytes()
    }

    fn run(&mut self, input: &[u8]) -> Result<(), Failure> {
        match input.trim_ascii() {
            b"abort" => std::process::abort(),
            b"hang" => loop {
                std::thread::sleep(std::time::Duration::from_secs(1));
            },
            b"panic" => panic!("selftest panic"),
            b"thread-panic" => {
                let _ = std::thread::spawn(|| panic!("selftest thread panic")).join();
                Ok(())
            }
            b"fail" => Err(Failure::new("selftest failure")),
            _ => Ok(()),
        }
    }
}

/// The heap bytes live in this process, when the binary installs
/// [`CountingAlloc`] as its global allocator (0 otherwise).
pub fn heap_live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// Whether [`CountingAlloc`] is the global allocator (a heap bound is only
/// checked where it can be measured).
pub fn heap_counted() -> bool {
    COUNTING.load(Ordering::Relaxed) != 0
}

static LIVE: AtomicUsize = AtomicUsize::new(0);
static COUNTING: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting live bytes (for the RESP target's
/// memory bound).
pub struct CountingAlloc;

// SAFETY: every call is forwarded unchanged to the system allocator, which
// upholds GlobalAlloc's contract; the counters are plain atomics and never
// allocate.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        COUNTING.store(1, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout (see the impl).
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded unchanged (see the impl).
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            LIVE.fetch_add(new_size, Ordering::Relaxed);
        }
        p
    }
}

/// The CPU time the calling thread has used.
pub fn thread_cpu_time() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call to fill;
    // CLOCK_THREAD_CPUTIME_ID needs nothing else.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        // Never on Linux; a bound checked against this fails visibly.
        return std::time::Duration::MAX;
    }
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Printable form of some bytes for a failure message, cut at `max`.
pub fn show(b: &[u8], max: usize) -> String {
    let s: String = b
        .iter()
        .take(max)
        .flat_map(|&c| std::ascii::escape_default(c))
        .map(char::from)
        .collect();
    if b.len() > max {
        format!("\"{s}\"... ({} bytes)", b.len())
    } else {
        format!("\"{s}\"")
    }
}
