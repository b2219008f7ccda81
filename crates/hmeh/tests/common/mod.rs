//! Helpers shared by the hmeh integration tests, beside the conformance
//! suite's kit (`engine::testkit`): hmeh's options for small and capped
//! tables, a table reopened in four ways with its own configuration, the
//! structural counters summed over a run's engine handles, and the byte
//! offsets the image tests patch.

#![allow(dead_code)]

use std::sync::Arc;

use engine::testkit::{mem_pool, pool_opts, reopen, Subject};
use engine::{Durability, Engine, EngineConfig};
use pmem::{Mode, Pool, PoolOptions};
use pmhash_hmeh::{HashKind, Hmeh, Options};

pub(crate) const MIB: u64 = 1 << 20;

#[allow(unused_imports)]
pub(crate) use engine::testkit::bad_pool::open_guarded;
#[allow(unused_imports)]
pub(crate) use engine::testkit::{verify_model, Rng, TempPath};

mod spec;
pub(crate) use spec::HmehSubject;

/// murmur3's finalizer: a bijection, for spreading test keys.
#[allow(unused_imports)]
pub(crate) use engine::hash::fmix64 as fmix;

/// A unique temp pool path, removed on drop.
pub(crate) fn temp(tag: &str) -> TempPath {
    TempPath::new(HmehSubject::TEMP_PREFIX, tag)
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
        let popts = pool_opts::<HmehSubject>(mode, 2 * MIB, max_size, seed);
        let (path, pool) = if mode == Mode::Mapped {
            let p = temp("table");
            let pool = Arc::new(Pool::create(p.path(), &popts).unwrap());
            (Some(p), pool)
        } else {
            (None, mem_pool(&popts))
        };
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
                let path = self.path.as_ref().expect("a mapped table").path();
                let (e, pool) = (self.e.take().unwrap(), self.pool.take().unwrap());
                let (p2, e2) =
                    reopen::reopen_file_with::<HmehSubject>(e, pool, path, &self.popts, &self.cfg);
                self.e = Some(e2);
                self.pool = Some(p2);
            }
            Reopen::CleanImage => {
                assert_eq!(self.mode(), Mode::Simulated);
                let e = self.e.take().unwrap();
                let (p2, e2) = reopen::clean_image_reopen::<HmehSubject>(e, self.pool(), &self.cfg);
                self.e = Some(e2);
                self.pool = Some(p2);
            }
            Reopen::Crash => {
                assert_eq!(self.mode(), Mode::Simulated);
                assert!(
                    !self.closed_in_place,
                    "test bug: a crash image of a pool closed and reused in place"
                );
                self.e().sync().unwrap();
                let (p2, e2) =
                    reopen::crash_reopen_persisted_with::<HmehSubject>(self.pool(), &self.cfg);
                drop(self.e.take());
                self.e = Some(e2);
                self.pool = Some(p2);
            }
        }
    }
}

/// The structural counters a test asserts on, summed over a run's engine
/// handles (they live in DRAM: each handle counts from its own open).
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tally {
    pub(crate) splits: u64,
    pub(crate) backups_made: u64,
    pub(crate) node_splits: u64,
    pub(crate) delayed_splits: u64,
    pub(crate) doublings: u64,
    pub(crate) merges: u64,
    pub(crate) overflow_blocks: u64,
    pub(crate) inplace_updates: u64,
    pub(crate) same_line_updates: u64,
    pub(crate) cross_line_updates: u64,
}

impl Tally {
    /// Adds what the handle `e` counted.
    pub(crate) fn absorb(&mut self, e: &Hmeh) {
        let t = e.tallies();
        self.add(&Tally {
            splits: t.splits,
            backups_made: t.backups_made,
            node_splits: t.node_splits,
            delayed_splits: t.delayed_splits,
            doublings: t.doublings,
            merges: t.merges,
            overflow_blocks: t.overflow_blocks,
            inplace_updates: t.inplace_updates,
            same_line_updates: t.same_line_updates,
            cross_line_updates: t.cross_line_updates,
        });
    }

    /// Adds another sum.
    pub(crate) fn add(&mut self, o: &Tally) {
        self.splits += o.splits;
        self.backups_made += o.backups_made;
        self.node_splits += o.node_splits;
        self.delayed_splits += o.delayed_splits;
        self.doublings += o.doublings;
        self.merges += o.merges;
        self.overflow_blocks += o.overflow_blocks;
        self.inplace_updates += o.inplace_updates;
        self.same_line_updates += o.same_line_updates;
        self.cross_line_updates += o.cross_line_updates;
    }
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
