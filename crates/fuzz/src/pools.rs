//! The pool readers: mutated pool images (header, allocator lanes and
//! chunks, each engine's structures, the store's logs) opened read-only
//! with `check` (as `pmhash check` and `inspect` do) and writable (as the
//! engines and `pmhash serve` do).
//!
//! The images: one small valid pool per persistent engine (made by the
//! engine's own `create`, filled with inserts, updates and removes, closed
//! cleanly) and one store directory (`Store::open`, byte keys and values,
//! closed cleanly). They are made the same way every time (fixed uuid and
//! creation time), so a saved input reproduces.
//!
//! Input: text, one item a line: `kind NAME`, then the mutations in order
//! (`flip OFF BIT`, `set OFF BYTE`, `word OFF VALUE`, `zero OFF LEN`,
//! `trunc LEN`, `fixcrc`: recompute the header's and the lanes' CRCs, so
//! that a change reaches past them).
//!
//! Checks: no panic at any step; a read-only open, its check and reads
//! leave the file byte-for-byte as it was; a writable open that is refused
//! (by the pool layer or by the engine) leaves the file byte-for-byte as
//! it was; an open that is accepted serves every key it counts (`len()` =
//! the keys `for_each` visits); an accepted writable open takes a few
//! writes and closes with no panic. A hang (a walk that never ends) or a signal is caught by the
//! driver.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::Arc;

use engine::scratch::{TempDir, TempPath};
use engine::{Durability, Engine, EngineConfig, EngineKind, EngineSpec};
use pmem::{Mode, Pool, PoolOptions};
use store::{GcMode, Store};

use crate::{Failure, Rng, Target};

/// The engine forms a pool is made by, and `store-dir` (a store directory
/// opened with `Store::open`, as `pmhash serve` does).
pub(crate) fn kinds() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = specs().iter().map(|s| s.name).collect();
    v.push(STORE_DIR);
    v
}

const STORE_DIR: &str = "store-dir";

fn specs() -> Vec<EngineSpec> {
    vec![
        engine::slotarray::spec(),
        level::spec(),
        hmeh::spec(),
        pass::spec(),
        pass::spec_var(),
        pass::spec_dense(),
        rophi::spec(),
        store::spec(),
        store::store_spec!(hmeh::spec, "store-hash", false),
        store::store_spec!(hmeh::spec, "store-both", true),
    ]
}

fn spec(name: &str) -> Option<EngineSpec> {
    specs().into_iter().find(|s| s.name == name)
}

fn cfg() -> EngineConfig {
    EngineConfig {
        durability: Durability::Strict,
        initial_capacity: 64,
        threads: 1,
    }
}

const UUID: [u8; 16] = *b"pmhash-fuzz-pool";
const KEYS: u64 = 300;

fn store_options(read_only: bool) -> store::Options {
    store::Options {
        create: store::CreateOptions {
            pool_size: 2 << 20,
            clusters: 2,
            extent_size: 16 << 10,
            nodes: Some(1),
            uuid: Some(UUID),
            ..Default::default()
        },
        open: store::OpenOptions {
            max_pool_size: 2 << 20,
            numa_emulate: Some(1),
            gc: GcMode::Manual,
            raf_bytes: 0,
            recovery_threads: 1,
            expected_keys: 512,
            read_only,
            ..Default::default()
        },
    }
}

/// A valid image and the offsets of its non-zero 8-byte words (where the
/// structures are: mutations aim there more often than not).
struct Base {
    image: Vec<u8>,
    words: Vec<u64>,
}

/// Overwrites the creation time (the one field that differs from run to
/// run) and fixes the identity CRC.
fn normalize(image: &mut [u8]) {
    if image.len() >= 64 {
        image[48..56].copy_from_slice(&1u64.to_le_bytes());
        fix_crcs(image);
    }
}

fn crc_at(image: &mut [u8], start: usize) {
    if image.len() >= start + 64 {
        let c = crc32fast::hash(&image[start..start + 60]);
        image[start + 60..start + 64].copy_from_slice(&c.to_le_bytes());
    }
}

/// Recomputes the CRC of the identity line, of each state slot that was
/// written, and of each lane in use (`docs/format.md`).
fn fix_crcs(image: &mut [u8]) {
    crc_at(image, 0);
    for slot in [64, 128] {
        if image.len() >= slot + 64 && image[slot..slot + 8] != [0; 8] {
            crc_at(image, slot);
        }
    }
    for lane in 0..64 {
        let at = 4096 + 64 * lane;
        if image.len() >= at + 64 && image[at..at + 8] != [0; 8] {
            crc_at(image, at);
        }
    }
}

fn build_engine(s: &EngineSpec) -> Result<Vec<u8>, String> {
    let EngineKind::Persistent { layout, create, .. } = s.kind else {
        return Err(format!("{} is not persistent", s.name));
    };
    let mut last = String::new();
    for size in [1u64 << 20, 2 << 20, 4 << 20, 8 << 20] {
        let tmp = TempPath::new("pmhash-fuzz", s.name);
        let opts = PoolOptions {
            mode: Mode::Mapped,
            size,
            max_size: 0,
            layout: layout.into(),
            uuid: Some(UUID),
            ..PoolOptions::default()
        };
        let pool = Arc::new(Pool::create(tmp.path(), &opts).map_err(|e| e.to_string())?);
        let r = (|| -> engine::Result<()> {
            let e = create(pool.clone(), &cfg())?;
            let mut rng = Rng::new(7);
            let keys: Vec<u64> = (0..KEYS)
                .map(|i| {
                    if i < 4 {
                        [0, 1, u64::MAX, 42][i as usize]
                    } else {
                        rng.next()
                    }
                })
                .collect();
            for (i, &k) in keys.iter().enumerate() {
                e.insert(k, i as u64 * 3 + 1)?;
            }
            for &k in keys.iter().step_by(7) {
                e.remove(k)?;
            }
            for &k in keys.iter().skip(3).step_by(5) {
                e.update(k, k ^ 0x5555)?;
            }
            e.close()
        })();
        drop(pool);
        match r {
            Ok(()) => {
                let mut image = std::fs::read(tmp.path()).map_err(|e| e.to_string())?;
                normalize(&mut image);
                return Ok(image);
            }
            Err(e) => last = e.to_string(),
        }
    }
    Err(format!("cannot build a {} pool: {last}", s.name))
}

fn build_store() -> Result<Vec<u8>, String> {
    let dir = TempDir::new("pmhash-fuzz", STORE_DIR);
    let st = Store::open(dir.path(), store_options(false)).map_err(|e| e.to_string())?;
    let mut rng = Rng::new(9);
    for i in 0..KEYS {
        let key = if i % 3 == 0 {
            i.to_le_bytes().to_vec()
        } else {
            format!("key:{i}:{}", "x".repeat((i % 40) as usize)).into_bytes()
        };
        let len = if i % 4 == 0 {
            8
        } else {
            rng.below(300) as usize
        };
        let val: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        st.put(&key, &val).map_err(|e| e.to_string())?;
        if i % 7 == 0 {
            st.delete(&key).map_err(|e| e.to_string())?;
        } else if i % 5 == 0 {
            st.put(&key, b"again").map_err(|e| e.to_string())?;
        }
    }
    st.close().map_err(|e| e.to_string())?;
    drop(st);
    let mut image = std::fs::read(dir.path().join(store::POOL_FILE)).map_err(|e| e.to_string())?;
    normalize(&mut image);
    Ok(image)
}

fn build(kind: &str) -> Result<Base, String> {
    let image = if kind == STORE_DIR {
        build_store()?
    } else {
        build_engine(&spec(kind).ok_or_else(|| format!("unknown kind {kind:?}"))?)?
    };
    let words = (0..image.len() as u64 / 8)
        .map(|i| i * 8)
        .filter(|&o| image[o as usize..o as usize + 8] != [0; 8])
        .collect();
    Ok(Base { image, words })
}

/// One change to an image.
#[derive(Clone, Debug, PartialEq)]
enum Mutation {
    Flip(u64, u8),
    Set(u64, u8),
    Word(u64, u64),
    Zero(u64, u64),
    Trunc(u64),
    FixCrc,
}

impl Mutation {
    fn apply(&self, image: &mut Vec<u8>) {
        let len = image.len() as u64;
        match *self {
            Mutation::Flip(o, bit) if o < len => image[o as usize] ^= 1 << (bit & 7),
            Mutation::Set(o, b) if o < len => image[o as usize] = b,
            Mutation::Word(o, v) if o + 8 <= len => {
                image[o as usize..o as usize + 8].copy_from_slice(&v.to_le_bytes())
            }
            Mutation::Zero(o, n) if o < len => {
                let end = o.saturating_add(n).min(len);
                image[o as usize..end as usize].fill(0);
            }
            Mutation::Trunc(n) => image.truncate(n as usize),
            Mutation::FixCrc => fix_crcs(image),
            _ => {}
        }
    }

    fn line(&self) -> String {
        match self {
            Mutation::Flip(o, b) => format!("flip {o} {b}"),
            Mutation::Set(o, b) => format!("set {o} {b}"),
            Mutation::Word(o, v) => format!("word {o} {v}"),
            Mutation::Zero(o, n) => format!("zero {o} {n}"),
            Mutation::Trunc(n) => format!("trunc {n}"),
            Mutation::FixCrc => "fixcrc".into(),
        }
    }

    fn parse(line: &str) -> Option<Mutation> {
        let w: Vec<&str> = line.split_whitespace().collect();
        let n = |i: usize| w.get(i)?.parse::<u64>().ok();
        Some(match *w.first()? {
            "flip" => Mutation::Flip(n(1)?, n(2)? as u8),
            "set" => Mutation::Set(n(1)?, n(2)? as u8),
            "word" => Mutation::Word(n(1)?, n(2)?),
            "zero" => Mutation::Zero(n(1)?, n(2)?),
            "trunc" => Mutation::Trunc(n(1)?),
            "fixcrc" => Mutation::FixCrc,
            _ => return None,
        })
    }
}

/// A case: which image, and what is done to it.
fn encode(kind: &str, muts: &[Mutation]) -> Vec<u8> {
    let mut s = format!("kind {kind}\n");
    for m in muts {
        s.push_str(&m.line());
        s.push('\n');
    }
    s.into_bytes()
}

fn decode(input: &[u8]) -> Option<(String, Vec<Mutation>)> {
    let text = std::str::from_utf8(input).ok()?;
    let mut lines = text.lines();
    let kind = lines.next()?.strip_prefix("kind ")?.trim().to_string();
    let muts = lines
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(Mutation::parse)
        .collect::<Option<Vec<_>>>()?;
    Some((kind, muts))
}

#[derive(Default)]
pub(crate) struct Pools {
    bases: HashMap<String, Base>,
}

impl Pools {
    fn base(&mut self, kind: &str) -> Result<&Base, Failure> {
        if !self.bases.contains_key(kind) {
            let b = build(kind).map_err(|e| Failure::fatal(format!("the {kind} image: {e}")))?;
            self.bases.insert(kind.to_string(), b);
        }
        Ok(&self.bases[kind])
    }
}

/// An offset to change: the header, the allocator lanes, a word that holds
/// something, or anywhere.
fn offset(rng: &mut Rng, b: &Base) -> u64 {
    let len = b.image.len() as u64;
    match rng.below(20) {
        0..=2 => rng.below(192),
        3 | 4 => 4096 + rng.below(4096),
        5..=14 if !b.words.is_empty() => {
            b.words[rng.below(b.words.len() as u64) as usize] + rng.below(8)
        }
        _ => rng.below(len),
    }
}

fn value(rng: &mut Rng, old: u64, len: u64) -> u64 {
    match rng.below(12) {
        0 => 0,
        1 => 1,
        2 => u64::MAX,
        3 => old.wrapping_add(1),
        4 => old.wrapping_sub(1),
        5 => old ^ (1 << rng.below(64)),
        6 => len,
        7 => len - 8,
        8 => 4096,
        9 => 1 << 40,
        10 => old.wrapping_mul(2),
        _ => rng.next(),
    }
}

/// Runs `f`, turning a panic into a failure that names `what`.
fn guarded<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, Failure> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Failure::new(format!("{what} panicked: {msg}"))
    })
}

fn unchanged(path: &Path, want: &[u8], what: &str) -> Result<(), Failure> {
    let now = std::fs::read(path).map_err(|e| Failure::fatal(format!("{what}: {e}")))?;
    if now.len() != want.len() {
        return Err(Failure::new(format!(
            "{what}: the file's length changed from {} to {}",
            want.len(),
            now.len()
        )));
    }
    if let Some(i) = (0..now.len()).find(|&i| now[i] != want[i]) {
        let n = (0..now.len()).filter(|&i| now[i] != want[i]).count();
        return Err(Failure::new(format!(
            "{what}: {n} bytes of the file changed, the first at {i:#x} ({:#04x} -> {:#04x})",
            want[i], now[i]
        )));
    }
    Ok(())
}

/// Reads everything an engine reaches, as `pmhash check` and `inspect` do.
/// `Some`: the open was accepted, yet the key count it serves and the keys
/// it visits disagree (keys silently missing or invented). `hidden`: the
/// engine form of a store, whose reads of an entry that fails its checksum
/// are errors the trait cannot carry (its get reads the key as absent, its
/// for_each stops there): a disagreement that `check` reports is then the
/// damage reported, not a key silently missing.
fn read_all(e: &dyn Engine, hidden: bool) -> Option<String> {
    let len = e.len();
    let _ = e.stats();
    let checked = e.check();
    let mut n = 0u64;
    e.for_each(&mut |_, _| n += 1);
    for k in [0, 1, 42, u64::MAX, 7, n] {
        let _ = e.get(k);
    }
    (len != n && !(hidden && checked.is_err()))
        .then(|| format!("len() says {len} keys, for_each visits {n}"))
}

/// [`read_all`] for a store.
fn read_store(st: &Store) -> Option<String> {
    let len = st.len();
    let _ = st.check();
    let _ = st.stats();
    let mut n = 0u64;
    // An `Err` (an entry that fails its checksum) reports the damage: no
    // key is silently missing.
    let walked = st.for_each(|_, _| n += 1);
    for k in [&b"key:1:x"[..], &3u64.to_le_bytes(), b"absent"] {
        let _ = st.get(k);
    }
    (walked.is_ok() && len != n).then(|| format!("len() says {len} keys, for_each visits {n}"))
}

fn write_some(e: &dyn Engine) {
    for k in [3u64, 1 << 33, u64::MAX - 5] {
        let _ = e.insert(k, k);
        let _ = e.get(k);
    }
    let _ = e.remove(3);
    let _ = e.close();
}

fn run_engine(s: &EngineSpec, path: &Path, image: &[u8]) -> Result<(), Failure> {
    let EngineKind::Persistent { open, .. } = s.kind else {
        return Ok(());
    };
    let hidden = s.name.starts_with("store");
    let opts = |read_only| PoolOptions {
        mode: Mode::Mapped,
        read_only,
        ..PoolOptions::default()
    };
    write(path, image)?;
    let wrong = guarded("a read-only open and check", || {
        let pool = Arc::new(Pool::open(path, &opts(true)).ok()?);
        let _ = pool.stats();
        read_all(open(pool.clone(), &cfg()).ok()?.as_ref(), hidden)
    })?;
    unchanged(path, image, "a read-only open")?;
    if let Some(w) = wrong {
        return Err(Failure::new(format!(
            "a read-only open was accepted, but {w}"
        )));
    }
    // As the tools open a pool file: every check read-only first, under
    // the writer's lock, so that a refused open writes nothing.
    let (refused, wrong) = guarded("a writable open", || {
        match engine::open_file(open, path, &opts(false), &cfg()) {
            Err(e) => (Some(format!("it was refused ({e})")), None),
            Ok((_pool, e)) => {
                let wrong = read_all(e.as_ref(), hidden);
                write_some(e.as_ref());
                (None, wrong)
            }
        }
    })?;
    if let Some(why) = refused {
        unchanged(path, image, &format!("a writable open that {why}"))?;
    }
    if let Some(w) = wrong {
        return Err(Failure::new(format!(
            "a writable open was accepted, but {w}"
        )));
    }
    Ok(())
}

fn run_store(dir: &Path, image: &[u8]) -> Result<(), Failure> {
    let path = dir.join(store::POOL_FILE);
    write(&path, image)?;
    let wrong = guarded("a read-only Store::open and check", || {
        let st = Store::open(dir, store_options(true)).ok()?;
        let w = read_store(&st);
        let _ = st.close();
        w
    })?;
    unchanged(&path, image, "a read-only Store::open")?;
    if let Some(w) = wrong {
        return Err(Failure::new(format!(
            "a read-only Store::open was accepted, but {w}"
        )));
    }
    let (refused, wrong) = guarded("a writable Store::open", || {
        match Store::open(dir, store_options(false)) {
            Err(e) => (Some(e.to_string()), None),
            Ok(st) => {
                let w = read_store(&st);
                let _ = st.put(b"fuzz", b"value");
                let _ = st.get(b"fuzz");
                let _ = st.delete(b"key:2:xx");
                let _ = st.close();
                (None, w)
            }
        }
    })?;
    if let Some(why) = refused {
        unchanged(
            &path,
            image,
            &format!("a writable Store::open that refused it ({why})"),
        )?;
    }
    if let Some(w) = wrong {
        return Err(Failure::new(format!(
            "a writable Store::open was accepted, but {w}"
        )));
    }
    Ok(())
}

fn write(path: &Path, image: &[u8]) -> Result<(), Failure> {
    std::fs::write(path, image)
        .map_err(|e| Failure::fatal(format!("cannot write {}: {e}", path.display())))
}

impl Target for Pools {
    fn generate(&mut self, rng: &mut Rng) -> Vec<u8> {
        let kinds = kinds();
        let kind = kinds[rng.below(kinds.len() as u64) as usize];
        let Ok(b) = self.base(kind) else {
            return encode(kind, &[]);
        };
        let len = b.image.len() as u64;
        let mut muts = Vec::new();
        for _ in 0..1 + rng.below(4) {
            let m = match rng.below(12) {
                0..=2 => Mutation::Flip(offset(rng, b), rng.below(8) as u8),
                3 => Mutation::Set(offset(rng, b), rng.next() as u8),
                4..=7 => {
                    let o = offset(rng, b) & !7;
                    let old = u64::from_le_bytes(
                        b.image[o as usize..o as usize + 8]
                            .try_into()
                            .expect("8 bytes"),
                    );
                    Mutation::Word(o, value(rng, old, len))
                }
                8 | 9 => Mutation::Zero(offset(rng, b) & !4095, 4096),
                10 => Mutation::Trunc(match rng.below(3) {
                    0 => rng.below(len),
                    1 => rng.below(len / 4096) * 4096,
                    _ => len - 1 - rng.below(64),
                }),
                _ => Mutation::Zero(offset(rng, b), 1 + rng.below(64)),
            };
            muts.push(m);
        }
        // Half the time, past the CRCs: the header and the lanes then hold
        // what was changed, checksummed, and the checks behind them run.
        if rng.below(2) == 0 {
            muts.push(Mutation::FixCrc);
        }
        encode(kind, &muts)
    }

    fn run(&mut self, input: &[u8]) -> Result<(), Failure> {
        let Some((kind, muts)) = decode(input) else {
            return Err(Failure::new(format!(
                "not a pools input: {}",
                crate::show(input, 200)
            )));
        };
        let mut image = self.base(&kind)?.image.clone();
        for m in &muts {
            m.apply(&mut image);
        }
        let dir = TempDir::new("pmhash-fuzz", "pools");
        std::fs::create_dir_all(dir.path())
            .map_err(|e| Failure::fatal(format!("cannot make {}: {e}", dir.path().display())))?;
        if kind == STORE_DIR {
            run_store(dir.path(), &image)
        } else {
            let s = spec(&kind).ok_or_else(|| Failure::new(format!("unknown kind {kind:?}")))?;
            run_engine(&s, &dir.path().join("case.pool"), &image)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_read_back_as_written() {
        let muts = vec![
            Mutation::Flip(4096, 3),
            Mutation::Set(9, 255),
            Mutation::Word(8192, u64::MAX),
            Mutation::Zero(262144, 4096),
            Mutation::Trunc(1000),
            Mutation::FixCrc,
        ];
        let (kind, back) = decode(&encode("hmeh", &muts)).unwrap();
        assert_eq!(kind, "hmeh");
        assert_eq!(back, muts);
        assert!(decode(b"kind x\nbogus 1\n").is_none());
    }
}
