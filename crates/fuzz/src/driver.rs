//! Runs a target: a parent process that watches a worker process.
//!
//! The worker ([`worker`]) runs cases one after another and, before each,
//! names it on its stdout (`case N` or `file PATH`); a panic or a violated
//! property is caught there, printed with its seed and case number, and
//! the input saved. The parent ([`run`]) reads those lines: when the worker
//! dies by a signal (a stack overflow, an abort, SIGBUS) or names no new
//! case for `case_timeout` (a hang), the parent kills it, makes the case
//! again from its seed and number, saves it and reports it.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{Failure, Rng, Target};

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// The fuzz target's name (see `TARGETS`).
    pub target: String,
    /// Run new cases for this long (0: none, only the replays).
    pub seconds: f64,
    /// The seed the cases are drawn from.
    pub seed: u64,
    /// Run only this case of `seed` (reproduces a reported failure).
    pub case: Option<u64>,
    /// Saved inputs (files, or directories of them) to run first.
    pub replay: Vec<PathBuf>,
    /// Where failing inputs are saved.
    pub out: PathBuf,
    /// A case that takes longer than this is a hang.
    pub case_timeout: Duration,
    /// Items (saved inputs, then cases) to pass over: where a new worker
    /// starts after one died.
    pub skip: u64,
    /// Go on after a failing new case (to collect several); the exit
    /// status is a failure all the same. Saved inputs all run regardless.
    pub keep_going: bool,
}

/// The RNG of case `i` of a run seeded `seed`.
pub(crate) fn case_rng(seed: u64, i: u64) -> Rng {
    let mut r = Rng::new(seed ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    r.next();
    r
}

/// Every file named by `paths` (directories: their files, sorted; a
/// `README` is skipped).
pub(crate) fn replay_files(paths: &[PathBuf]) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut v: Vec<PathBuf> = std::fs::read_dir(p)
                .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
                .unwrap_or_default();
            v.retain(|f| f.is_file() && f.file_name().is_some_and(|n| n != "README.md"));
            v.sort();
            files.extend(v);
        } else {
            files.push(p.clone());
        }
    }
    files
}

fn save(out: &Path, name: &str, input: &[u8]) -> PathBuf {
    let _ = std::fs::create_dir_all(out);
    let path = out.join(name);
    if let Err(e) = std::fs::write(&path, input) {
        eprintln!("pmhash-fuzz: cannot save {}: {e}", path.display());
    }
    path
}

/// Prints a failure and how to run it again; saves `input` unless it is
/// the saved file `file`. `by_case`: the case's seed and number alone
/// reproduce it.
fn report(o: &Options, what: &str, input: &[u8], msg: &str, file: Option<&Path>, by_case: bool) {
    let path = match file {
        Some(f) => f.to_path_buf(),
        None => {
            let tag: String = what
                .chars()
                .filter(|c| c.is_ascii_alphanumeric())
                .take(40)
                .collect();
            save(
                &o.out,
                &format!("{}-seed{}-{tag}.bin", o.target, o.seed),
                input,
            )
        }
    };
    let mut again = vec![format!(
        "cargo run --release -p pmhash-fuzz -- {} --replay {}",
        o.target,
        path.display()
    )];
    if let (true, Some(i)) = (by_case, what.strip_prefix("case ")) {
        again.push(format!(
            "cargo run --release -p pmhash-fuzz -- {} --seed {} --case {i}",
            o.target, o.seed
        ));
    }
    eprintln!(
        "FAIL {} {what}: {msg}\n  input: {}\n  reproduce: {}",
        o.target,
        path.display(),
        again.join("\n         or: ")
    );
}

/// The worker: runs the replays, then cases until the time is up. Returns
/// the number of failures.
pub fn worker(o: &Options) -> Result<u64, String> {
    limit_address_space(WORKER_ADDRESS_SPACE)?;
    let mut t = crate::target(&o.target)?;
    let mut failures = 0;
    let stdout = std::io::stdout();
    let announce = |line: &str| {
        let mut s = stdout.lock();
        let _ = writeln!(s, "{line}");
        let _ = s.flush();
    };
    count_panics();
    let one = |t: &mut Box<dyn Target>, what: &str, input: &[u8], file: Option<&Path>| {
        announce(what);
        let panics = PANICS.load(Ordering::SeqCst);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| t.run(input)));
        let f = match r {
            // A panic on another thread (a server's event loop, a store's
            // background thread) fails the case too.
            Ok(Ok(())) if PANICS.load(Ordering::SeqCst) != panics => Failure::new(format!(
                "a thread panicked: {}",
                LAST_PANIC.lock().map(|m| m.clone()).unwrap_or_default()
            )),
            Ok(Ok(())) => return Ok(()),
            Ok(Err(f)) => f,
            Err(p) => Failure::new(format!("panic: {}", panic_text(&p))),
        };
        match &f.repro {
            Some(r) => report(o, what, r, &f.msg, None, false),
            None => report(o, what, input, &f.msg, file, true),
        }
        Err(f.fatal)
    };
    let files = replay_files(&o.replay);
    for f in files.iter().skip(o.skip as usize) {
        let input = std::fs::read(f).map_err(|e| format!("{}: {e}", f.display()))?;
        let what = format!("file {}", f.display());
        // Every saved input runs (each is a known case worth naming),
        // unless one leaves the worker unable to go on.
        if let Err(fatal) = one(&mut t, &what, &input, Some(f)) {
            failures += 1;
            if fatal {
                return Ok(failures);
            }
        }
    }
    let started = Instant::now();
    let first = o.skip.saturating_sub(files.len() as u64);
    let cases: Box<dyn Iterator<Item = u64>> = match o.case {
        Some(c) => Box::new(std::iter::once(c).skip(first as usize)),
        None => Box::new(first..),
    };
    let mut ran = 0u64;
    for i in cases {
        if o.case.is_none() && started.elapsed().as_secs_f64() >= o.seconds {
            break;
        }
        let input = t.generate(&mut case_rng(o.seed, i));
        ran += 1;
        if let Err(fatal) = one(&mut t, &format!("case {i}"), &input, None) {
            failures += 1;
            if fatal || !o.keep_going {
                break;
            }
        }
    }
    eprintln!(
        "pmhash-fuzz {}: {} replayed, {ran} cases in {:.1} s (seed {}), {failures} failures",
        o.target,
        files.len().saturating_sub(o.skip as usize),
        started.elapsed().as_secs_f64(),
        o.seed
    );
    Ok(failures)
}

/// The most address space a worker may map: a case that makes the code
/// under test allocate without bound (a length read from a corrupt file)
/// then fails its allocation and aborts, and is reported, instead of
/// taking the machine's memory.
pub(crate) const WORKER_ADDRESS_SPACE: u64 = 8 << 30;

fn limit_address_space(bytes: u64) -> Result<(), String> {
    let lim = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: bytes,
    };
    // SAFETY: `lim` is a valid rlimit that the call only reads.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_AS, &lim) };
    if rc != 0 {
        return Err(format!(
            "cannot limit the worker's address space: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Panics anywhere in the worker, and the last one's message and thread.
static PANICS: AtomicU64 = AtomicU64::new(0);
static LAST_PANIC: Mutex<String> = Mutex::new(String::new());

/// Counts every panic (then prints it as before), so that one on a thread
/// the case did not run on is not missed.
fn count_panics() {
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, Ordering::SeqCst);
        if let Ok(mut m) = LAST_PANIC.lock() {
            let thread = std::thread::current();
            *m = format!("{info} (thread {})", thread.name().unwrap_or("unnamed"))
                .replace('\n', " ");
        }
        prev(info);
    }));
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(not a string)".into()
    }
}

/// Most times a run starts a new worker after one died or hung.
const RESTARTS: u32 = 20;

/// The parent: starts `exe` as the worker with `args`, watches it, and
/// returns whether the run passed. A worker that stops on a failure it
/// cannot go on from (a signal, a hang, a fatal one) is followed by a new
/// one that goes on after the item it was on, while saved inputs remain
/// (and, with `keep_going`, while time remains).
pub fn run(o: &Options, exe: &Path, args: &[String]) -> Result<bool, String> {
    let files = replay_files(&o.replay).len() as u64;
    let started = Instant::now();
    let mut skip = 0u64;
    let mut passed = true;
    for _ in 0..=RESTARTS {
        let left = (o.seconds - started.elapsed().as_secs_f64()).max(0.0);
        let (ok, items) = run_worker(o, exe, args, skip, left)?;
        passed &= ok;
        skip += items;
        // Every saved input runs; new cases go on after a failure only
        // with `keep_going`.
        let left = o.seconds - started.elapsed().as_secs_f64();
        let go_on = skip < files || (o.keep_going && o.case.is_none() && left > 0.5);
        if ok || !go_on {
            break;
        }
        eprintln!(
            "pmhash-fuzz {}: a new worker goes on after item {skip}",
            o.target
        );
    }
    Ok(passed)
}

/// One worker, from item `skip` on (saved inputs first, then cases), for
/// `seconds`. Returns whether it passed and how many items it started.
fn run_worker(
    o: &Options,
    exe: &Path,
    args: &[String],
    skip: u64,
    seconds: f64,
) -> Result<(bool, u64), String> {
    // The worker's scratch files (pools, stores) go in a directory of its
    // own, removed when it ends, even if it was killed.
    let scratch = std::env::temp_dir().join(format!(
        "pmhash-fuzz-{}-{}-{skip}",
        o.target,
        std::process::id()
    ));
    std::fs::create_dir_all(&scratch)
        .map_err(|e| format!("cannot make {}: {e}", scratch.display()))?;
    let r = watch_worker(o, exe, args, skip, seconds, &scratch);
    let _ = std::fs::remove_dir_all(&scratch);
    r
}

fn watch_worker(
    o: &Options,
    exe: &Path,
    args: &[String],
    skip: u64,
    seconds: f64,
    scratch: &Path,
) -> Result<(bool, u64), String> {
    let mut child = Command::new(exe)
        .env("TMPDIR", scratch)
        .args(args)
        .args([
            "--skip",
            &skip.to_string(),
            "--seconds",
            &seconds.to_string(),
        ])
        .arg("--worker")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start the worker {}: {e}", exe.display()))?;
    let out = child.stdout.take().expect("piped stdout");
    // The item in flight, when it started, and how many were started.
    let current: Arc<Mutex<(String, Instant, u64)>> =
        Arc::new(Mutex::new(("start".into(), Instant::now(), 0)));
    let cur = current.clone();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            let mut c = cur.lock().expect("case lock");
            *c = (line, Instant::now(), c.2 + 1);
        }
    });
    let status = loop {
        if let Some(st) = child.try_wait().map_err(|e| e.to_string())? {
            break Some(st);
        }
        let (what, since, _) = current.lock().expect("case lock").clone();
        if since.elapsed() > o.case_timeout {
            let _ = child.kill();
            let _ = child.wait();
            lost(
                o,
                &what,
                &format!("hang: no answer in {:?}", o.case_timeout),
            );
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = reader.join();
    let (what, _, items) = current.lock().expect("case lock").clone();
    let Some(st) = status else {
        return Ok((false, items));
    };
    if st.success() {
        return Ok((true, items));
    }
    use std::os::unix::process::ExitStatusExt;
    if let Some(sig) = st.signal() {
        lost(o, &what, &format!("the worker died of signal {sig}"));
    }
    Ok((false, items))
}

/// Reports a case that took its worker down: makes it again from its seed
/// and number (or names its file) and saves it.
fn lost(o: &Options, what: &str, msg: &str) {
    if let Some(i) = what
        .strip_prefix("case ")
        .and_then(|n| n.parse::<u64>().ok())
    {
        match crate::target(&o.target) {
            Ok(mut t) => {
                let input = t.generate(&mut case_rng(o.seed, i));
                report(o, what, &input, msg, None, true);
            }
            Err(e) => eprintln!("FAIL {} {what}: {msg} ({e})", o.target),
        }
    } else if let Some(f) = what.strip_prefix("file ") {
        report(o, what, &[], msg, Some(Path::new(f)), false);
    } else {
        eprintln!("FAIL {} while starting ({what}): {msg}", o.target);
    }
}
