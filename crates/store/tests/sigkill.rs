//! Process crashes: the test runs its own binary again as a child
//! (`child_writer`, which does nothing unless `STORE_CHILD_DIR` is set).
//! The child opens a file-backed store (mapped mode: durable against a
//! process crash through the page cache) with small files and the
//! background GC, and does a deterministic sequence of puts, inserts,
//! updates and deletes, printing one line per operation after it returned
//! (an acknowledgement, with its result). The parent kills it with SIGKILL
//! after a random short time, reopens the store (a log scan) and checks it
//! against a model replayed from the acknowledged operations: every
//! acknowledged write is there, every result the child saw was right, and
//! only the one operation that may have been in flight (the one after the
//! last acknowledgement) is allowed either outcome. Rounds repeat on the
//! same directory, so recovered stores crash and recover again; some rounds
//! end with a clean close by the parent (the next child opens the image).

mod common;

use common::check_without_leak;
use engine::testkit::TempDir;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::time::Duration;

use engine::testkit::Rng;
use pmem::Mode;
use pmhash_store::{CreateOptions, GcMode, OpenOptions, Options, Store};

const DIR_VAR: &str = "STORE_CHILD_DIR";
const ROUND_VAR: &str = "STORE_CHILD_ROUND";
const KEYS: u64 = 700;

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

/// A scratch directory, removed on drop.
fn temp_dir(tag: &str) -> TempDir {
    TempDir::new("store-sigkill", tag)
}

fn opts(gc: GcMode) -> Options {
    Options {
        create: CreateOptions {
            pool_size: 4 << 20,
            clusters: 4,
            extent_size: 4096,
            nodes: Some(2),
            ..Default::default()
        },
        open: OpenOptions {
            mode: Mode::Mapped,
            max_pool_size: 256 << 20,
            numa_emulate: Some(2),
            gc,
            gc_threshold: 0.5,
            raf_bytes: 32 << 10,
            recovery_threads: 2,
            ..Default::default()
        },
    }
}

/// Key `id`: the empty key, then lengths on both sides of the index's
/// 23-byte inline limit, up to 300 bytes.
fn key(id: u64) -> Vec<u8> {
    if id == 0 {
        return Vec::new();
    }
    let mut k = format!("k{id:04}").into_bytes();
    k.resize([5usize, 8, 23, 24, 100, 300][id as usize % 6], b'#');
    k
}

fn value(round: u64, i: u64, id: u64, len: usize) -> Vec<u8> {
    let mut r = Rng::new(round << 40 ^ i << 12 ^ id);
    let mut v = format!("r{round} i{i} k{id} ").into_bytes();
    v.extend((0..len).map(|_| r.next() as u8));
    v
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Put,
    Insert,
    Update,
    Delete,
}

/// Operation `i` of round `round`: the same on both sides of the pipe.
struct Ops {
    rng: Rng,
    round: u64,
    i: u64,
}

impl Ops {
    fn new(round: u64) -> Ops {
        Ops {
            rng: Rng::new(0x5161_4b11 ^ round),
            round,
            i: 0,
        }
    }
    fn next_op(&mut self) -> (Kind, Vec<u8>, Vec<u8>) {
        let (a, b, c) = (self.rng.next(), self.rng.next(), self.rng.next());
        let kind = match a % 40 {
            0..=23 => Kind::Put,
            24..=26 => Kind::Insert,
            27..=29 => Kind::Update,
            _ => Kind::Delete,
        };
        // Keys from a window that slides with the round, so later rounds
        // both revisit old keys and make new ones.
        let id = (b % KEYS + self.round * 37) % (KEYS * 2);
        let len = (c % 600) as usize;
        let v = value(self.round, self.i, id, len);
        self.i += 1;
        (kind, key(id), v)
    }
}

/// What an operation does to the model; returns its bool result (`None`
/// for a put).
fn apply(m: &mut Model, kind: Kind, k: &[u8], v: &[u8]) -> Option<bool> {
    match kind {
        Kind::Put => {
            m.insert(k.to_vec(), v.to_vec());
            None
        }
        Kind::Insert => {
            let r = !m.contains_key(k);
            if r {
                m.insert(k.to_vec(), v.to_vec());
            }
            Some(r)
        }
        Kind::Update => {
            let r = m.contains_key(k);
            if r {
                m.insert(k.to_vec(), v.to_vec());
            }
            Some(r)
        }
        Kind::Delete => Some(m.remove(k).is_some()),
    }
}

/// The child: runs only when the parent set `STORE_CHILD_DIR`.
#[test]
fn child_writer() {
    let Ok(dir) = std::env::var(DIR_VAR) else {
        return;
    };
    let round: u64 = std::env::var(ROUND_VAR).unwrap().parse().unwrap();
    let s = Store::open(Path::new(&dir), opts(GcMode::Background)).unwrap();
    let mut ops = Ops::new(round);
    let out = std::io::stdout();
    let t0 = std::time::Instant::now();
    // Bounded, in case the parent never kills (it then checks the end state).
    while ops.i < 2_000_000 && t0.elapsed() < Duration::from_secs(20) {
        let i = ops.i;
        let (kind, k, v) = ops.next_op();
        let r = match kind {
            Kind::Put => s.put(&k, &v).map(|_| None),
            Kind::Insert => s.insert(&k, &v).map(Some),
            Kind::Update => s.update(&k, &v).map(Some),
            Kind::Delete => s.delete(&k).map(Some),
        }
        .unwrap();
        let r = match r {
            None => "-",
            Some(true) => "1",
            Some(false) => "0",
        };
        let mut o = out.lock();
        writeln!(o, "ACK {i} {r}").unwrap();
        o.flush().unwrap();
        // GC calls of its own beside the background thread's, so that
        // kills land in reclaims whatever the timing.
        if i % 500 == 499 {
            let n = s.gc(4).unwrap();
            writeln!(o, "GC {n}").unwrap();
            o.flush().unwrap();
        }
    }
}

/// Completely printed lines of the child's stdout (a line cut by the kill
/// has no newline and is no acknowledgement).
fn spawn_reader(
    stdout: std::process::ChildStdout,
) -> (
    std::sync::mpsc::Receiver<String>,
    std::thread::JoinHandle<()>,
) {
    let (tx, rx) = channel();
    let h = std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match r.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    if buf.last() != Some(&b'\n') {
                        return;
                    }
                    let line = String::from_utf8_lossy(&buf[..buf.len() - 1]).into_owned();
                    if tx.send(line).is_err() {
                        return;
                    }
                }
            }
        }
    });
    (rx, h)
}

/// The acknowledgement in a line of the child's stdout (the test harness
/// prints "test child_writer ... " without a newline before the first).
fn ack(line: &str) -> Option<String> {
    line.split_once("ACK ").map(|(_, a)| a.to_string())
}

/// Files the child's own GC calls reclaimed, from a line of its stdout.
fn gc_line(line: &str) -> Option<u64> {
    line.strip_prefix("GC ").and_then(|n| n.parse().ok())
}

/// Runs one child round until killed; returns the acknowledged results and
/// how many files the child's own GC calls reclaimed.
fn child_round(dir: &Path, round: u64, wait_ms: u64) -> (Vec<String>, u64) {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args(["--exact", "child_writer", "--nocapture", "--test-threads=1"])
        .env(DIR_VAR, dir)
        .env(ROUND_VAR, round.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut s);
        s
    });
    let (rx, reader) = spawn_reader(child.stdout.take().unwrap());
    let mut acks = Vec::new();
    // Wait for the first acknowledgement (the child is open and writing),
    // then let it run a while.
    loop {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(l) => {
                if let Some(a) = ack(&l) {
                    acks.push(a);
                    break;
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                panic!("round {round}: the child wrote nothing in 60 s");
            }
            Err(RecvTimeoutError::Disconnected) => {
                let st = child.wait().unwrap();
                panic!(
                    "round {round}: the child ended ({st}) before any write: {}",
                    err_reader.join().unwrap()
                );
            }
        }
    }
    std::thread::sleep(Duration::from_millis(wait_ms));
    // SIGKILL (Child::kill on unix); an error means it already exited.
    let _ = child.kill();
    let status = child.wait().unwrap();
    reader.join().unwrap();
    let mut reclaimed = 0;
    for l in rx.try_iter() {
        if let Some(a) = ack(&l) {
            acks.push(a);
        } else if let Some(n) = gc_line(&l) {
            reclaimed += n;
        }
    }
    let err = err_reader.join().unwrap();
    assert!(
        !err.contains("panicked"),
        "round {round}: the child panicked ({status}): {err}"
    );
    (acks, reclaimed)
}

fn check_store(s: &Store, m: &Model, ctx: &str) {
    let mut seen = Vec::new();
    s.for_each(|k, v| seen.push((k.to_vec(), v.to_vec())))
        .unwrap_or_else(|e| panic!("{ctx}: for_each: {e}"));
    seen.sort();
    let want: Vec<(Vec<u8>, Vec<u8>)> = m.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    if seen != want {
        let missing: Vec<_> = m
            .keys()
            .filter(|k| s.get(k).unwrap().is_none())
            .map(|k| String::from_utf8_lossy(&k[..k.len().min(6)]).into_owned())
            .take(5)
            .collect();
        let wrong = m
            .iter()
            .filter(|(k, v)| s.get(k).unwrap().is_some_and(|sv| sv != **v))
            .count();
        panic!(
            "{ctx}: the store differs from the acknowledged writes: {} keys vs {}; missing {missing:?}, {wrong} wrong",
            seen.len(),
            m.len()
        );
    }
    assert_eq!(s.len(), m.len() as u64, "{ctx}: len");
    check_without_leak(s, m.len() as u64, ctx);
}

#[test]
fn sigkill_rounds_keep_every_acknowledged_write() {
    let dir = temp_dir("rounds");
    let mut m = Model::new();
    let mut rng = Rng::new(std::process::id() as u64);
    let mut total_acks = 0;
    let mut gc_reclaimed = 0;
    for round in 0..10u64 {
        let wait_ms = 20 + rng.below(181);
        let (acks, reclaimed) = child_round(dir.path(), round, wait_ms);
        gc_reclaimed += reclaimed;
        let ctx = format!(
            "round {round} (killed after {wait_ms} ms, {} acks)",
            acks.len()
        );
        assert!(!acks.is_empty(), "{ctx}");
        total_acks += acks.len();
        // Replay the acknowledged operations; each result must be the
        // model's.
        let mut ops = Ops::new(round);
        for (n, a) in acks.iter().enumerate() {
            let (i, r) = a
                .split_once(' ')
                .unwrap_or_else(|| panic!("{ctx}: bad line {a:?}"));
            assert_eq!(
                i.parse::<usize>().unwrap(),
                n,
                "{ctx}: acknowledgements out of order"
            );
            let (kind, k, v) = ops.next_op();
            let want = match apply(&mut m, kind, &k, &v) {
                None => "-",
                Some(true) => "1",
                Some(false) => "0",
            };
            assert_eq!(
                r, want,
                "{ctx}: op {n} ({kind:?}) returned {r} in the child, the model says {want}"
            );
        }
        // The operation in flight at the kill may or may not have happened.
        let (kind, k, v) = ops.next_op();
        let before = m.get(&k).cloned();
        let mut after_m = m.clone();
        apply(&mut after_m, kind, &k, &v);
        let after = after_m.get(&k).cloned();
        let s = Store::open(dir.path(), opts(GcMode::Manual)).unwrap();
        let st = s.stats();
        assert_eq!(st.opened_from, pmhash_store::OpenedFrom::LogScan, "{ctx}");
        let now = s.get(&k).unwrap();
        assert!(
            now == before || now == after,
            "{ctx}: the in-flight {kind:?} left its key neither as before nor as after"
        );
        match now {
            Some(v) => m.insert(k.clone(), v),
            None => m.remove(&k),
        };
        check_store(&s, &m, &ctx);
        // Every other round the parent closes cleanly: the next child
        // opens from the image.
        if round % 2 == 1 {
            s.close().unwrap();
            drop(s);
            let s = Store::open(dir.path(), opts(GcMode::Manual)).unwrap();
            assert_eq!(
                s.stats().opened_from,
                pmhash_store::OpenedFrom::Image,
                "{ctx}"
            );
            check_store(&s, &m, &format!("{ctx}, image reopen"));
            s.close().unwrap();
        }
    }
    assert!(total_acks > 10);
    assert!(gc_reclaimed > 0, "the children's GC never reclaimed a file");
}
