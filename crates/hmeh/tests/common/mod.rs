//! Helpers shared by the hmeh integration tests: pools in every mode, a
//! seeded RNG, unique temp files, `stats().detail` lookups, reopen in four
//! ways and a full model comparison.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use engine::{Durability, Engine, EngineConfig};
use hmeh::{HashKind, Hmeh, Options};
use pmem::{Mode, Pool, PoolOptions};

pub(crate) const MIB: u64 = 1 << 20;

pub(crate) use engine::testkit::Rng;
use engine::testkit::Subject;

mod spec;
pub(crate) use spec::HmehSubject;

/// murmur3's finalizer: a bijection, for spreading test keys.
#[allow(unused_imports)]
pub(crate) use engine::hash::fmix64 as fmix;

/// A unique temp pool path, removed on drop.
pub(crate) struct TempPath(engine::testkit::TempPath);

impl TempPath {
    pub(crate) fn new(tag: &str) -> TempPath {
        TempPath(engine::testkit::TempPath::new(
            HmehSubject::TEMP_PREFIX,
            tag,
        ))
    }
    pub(crate) fn path(&self) -> &Path {
        self.0.path()
    }
}

pub(crate) fn pool_opts(
    mode: Mode,
    size: u64,
    max_size: u64,
    uuid: Option<[u8; 16]>,
) -> PoolOptions {
    PoolOptions {
        mode,
        size,
        max_size,
        layout: HmehSubject::LAYOUT.into(),
        uuid,
        ..PoolOptions::default()
    }
}

pub(crate) fn cfg(durability: Durability, initial_capacity: u64, threads: usize) -> EngineConfig {
    EngineConfig {
        durability,
        initial_capacity,
        threads,
    }
}

/// 1 KiB segments (60 slots): splits, node splits, doublings and merges
/// come after a few hundred keys.
pub(crate) fn small_segments() -> Options {
    Options {
        segment_bytes: Some(1024),
        ..Options::default()
    }
}

/// Identity hash, 1 KiB segments, local depth capped at `max_depth`: keys
/// that share their top bits pile into one segment that chains overflow
/// blocks.
pub(crate) fn identity_capped(max_depth: u32) -> Options {
    Options {
        segment_bytes: Some(1024),
        max_depth,
        hash: HashKind::Identity,
        stash_before_split: false,
    }
}

/// A uuid made from a seed: the hash seed (hence every path) repeats.
pub(crate) fn uuid_of(seed: u64) -> [u8; 16] {
    engine::testkit::test_uuid(&HmehSubject::UUID_TAG, seed)
}

/// How a table is closed and opened again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reopen {
    /// `close()`, then `Hmeh::open` on the same `Arc<Pool>`.
    SamePool,
    /// Mapped file: `close()`, drop, `Pool::open` from the path, `Hmeh::open`.
    File,
    /// Simulated pool: `close()`, then the durable image opened as a new pool
    /// (proves close made everything durable and marked the pool clean).
    CleanImage,
    /// Simulated pool, no close: a crash right now (relaxed tables `sync()`
    /// first), recovered from the durable image. Not right after `SamePool`:
    /// `Pool::close` leaves the clean flag set for the rest of that pool
    /// object's life, so its image would read as cleanly closed.
    Crash,
}

/// An engine, its pool and what is needed to open them again.
pub(crate) struct Table {
    e: Option<Hmeh>,
    pool: Option<Arc<Pool>>,
    path: Option<TempPath>,
    pub cfg: EngineConfig,
    pub popts: PoolOptions,
    pub reopens: u64,
    /// The pool was closed and is used again in place (its clean flag is
    /// set until a new pool object opens it).
    closed_in_place: bool,
}

impl Table {
    /// A fresh table; `Mapped` pools get a temp file.
    pub(crate) fn create(
        mode: Mode,
        max_size: u64,
        c: &EngineConfig,
        o: &Options,
        seed: u64,
    ) -> Table {
        let popts = pool_opts(mode, 2 * MIB, max_size, Some(uuid_of(seed)));
        let (path, pool) = if mode == Mode::Mapped {
            let p = TempPath::new("table");
            let pool = Pool::create(p.path(), &popts).unwrap();
            (Some(p), pool)
        } else {
            (None, Pool::create(Path::new(""), &popts).unwrap())
        };
        let pool = Arc::new(pool);
        let e = Hmeh::create_with(pool.clone(), c, o).unwrap();
        Table {
            e: Some(e),
            pool: Some(pool),
            path,
            cfg: c.clone(),
            popts,
            reopens: 0,
            closed_in_place: false,
        }
    }

    pub(crate) fn e(&self) -> &Hmeh {
        self.e.as_ref().expect("engine")
    }

    pub(crate) fn pool(&self) -> &Arc<Pool> {
        self.pool.as_ref().expect("pool")
    }

    pub(crate) fn mode(&self) -> Mode {
        self.popts.mode
    }

    /// Closes (or crashes) and opens again; the caller verifies.
    pub(crate) fn reopen(&mut self, how: Reopen) {
        self.reopens += 1;
        if how != Reopen::SamePool && how != Reopen::Crash {
            self.closed_in_place = false;
        }
        match how {
            Reopen::SamePool => {
                self.e().close().unwrap();
                assert!(
                    self.e().insert(0x5eed, 1).is_err(),
                    "insert after close() was accepted"
                );
                drop(self.e.take());
                let pool = self.pool().clone();
                self.e = Some(Hmeh::open(pool, &self.cfg).unwrap());
                self.closed_in_place = true;
            }
            Reopen::File => {
                self.e().close().unwrap();
                let path = self
                    .path
                    .as_ref()
                    .expect("a mapped table")
                    .path()
                    .to_owned();
                drop(self.e.take());
                let old = self.pool.take().unwrap();
                assert_eq!(
                    Arc::strong_count(&old),
                    1,
                    "the engine still holds the pool"
                );
                drop(old);
                let p2 = Arc::new(Pool::open(&path, &self.popts).unwrap());
                assert!(p2.was_clean(), "close() did not mark the file clean");
                self.e = Some(Hmeh::open(p2.clone(), &self.cfg).unwrap());
                self.pool = Some(p2);
            }
            Reopen::CleanImage => {
                assert_eq!(self.mode(), Mode::Simulated);
                self.e().close().unwrap();
                let img = self
                    .pool()
                    .crash_image(pmem::CrashChoice::Persisted)
                    .unwrap();
                drop(self.e.take());
                let p2 = Arc::new(Pool::from_image(img, Mode::Simulated).unwrap());
                assert!(
                    p2.was_clean(),
                    "close() did not durably mark the pool clean"
                );
                self.e = Some(Hmeh::open(p2.clone(), &self.cfg).unwrap());
                self.pool = Some(p2);
            }
            Reopen::Crash => {
                assert_eq!(self.mode(), Mode::Simulated);
                assert!(
                    !self.closed_in_place,
                    "test bug: a crash image of a pool closed and reused in place"
                );
                self.e().sync().unwrap();
                let img = self
                    .pool()
                    .crash_image(pmem::CrashChoice::Persisted)
                    .unwrap();
                drop(self.e.take());
                let p2 = Arc::new(Pool::from_image(img, Mode::Simulated).unwrap());
                assert!(!p2.was_clean(), "a crash image reads as cleanly closed");
                self.e = Some(Hmeh::open(p2.clone(), &self.cfg).unwrap());
                self.pool = Some(p2);
            }
        }
    }
}

/// A figure from `stats().detail`, parsed.
pub(crate) fn detail(e: &dyn Engine, name: &str) -> f64 {
    engine::testkit::detail(e, name)
}

pub(crate) fn detail_u(e: &dyn Engine, name: &str) -> u64 {
    detail(e, name) as u64
}

/// The structural counters a test asserts on (they live in DRAM, so a run
/// sums them over its engine handles).
pub(crate) const COUNTERS: [&str; 10] = [
    "splits",
    "backups made",
    "node splits",
    "delayed splits",
    "doublings",
    "merges",
    "overflow blocks",
    "in-place updates",
    "same-line updates",
    "cross-line updates",
];

#[derive(Default, Debug, Clone)]
pub(crate) struct Tally(pub HashMap<&'static str, u64>);

impl Tally {
    pub(crate) fn absorb(&mut self, e: &dyn Engine) {
        for c in COUNTERS {
            *self.0.entry(c).or_default() += detail_u(e, c);
        }
    }
    pub(crate) fn get(&self, c: &str) -> u64 {
        self.0.get(c).copied().unwrap_or(0)
    }
}

/// Everything the engine holds must equal `model` (see
/// `engine::testkit::verify_model`), absent keys included.
pub(crate) fn verify(
    e: &dyn Engine,
    pool: &Pool,
    model: &HashMap<u64, u64>,
    absent: &[u64],
    ctx: &str,
) {
    engine::testkit::verify_model(e, pool, model, absent, ctx);
}

// ----- pool images -----------------------------------------------------------------

#[allow(unused_imports)]
pub(crate) use engine::testkit::image::{clear_clean_flag, patch, word, STATE_SLOTS};

/// Byte offsets of the words the image tests patch
/// (`crates/hmeh/src/layout.rs`): root block (`R_`), segment header (`H_`).
pub(crate) mod off {
    pub(crate) const R_HASH: u64 = 16;
    pub(crate) const R_GEOMETRY: u64 = 24;
    pub(crate) const R_RT_ROOT: u64 = 32;
    pub(crate) const R_ZERO_PRESENT: u64 = 40;
    pub(crate) const H_IDENT: u64 = 8;
    pub(crate) const H_BACKUP: u64 = 32;
    pub(crate) const H_OVERFLOW: u64 = 40;
    pub(crate) const H_RETIRED: u64 = 48;
}

/// CRC-32 (IEEE), bitwise: the header's checksum (docs/format.md).
pub(crate) fn crc32(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xedb8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// Pool open then engine open (strict) of a pool file, in a panic guard:
/// `Err("PANIC")` if either panicked (`engine::testkit::bad_pool`).
pub(crate) fn open_file(path: &Path, read_only: bool) -> Result<(Arc<Pool>, Hmeh), String> {
    engine::testkit::bad_pool::open_guarded::<HmehSubject>(path, read_only)
}
