//! The store as an [`Engine`] (`--engine store`): u64 keys as 8-byte
//! big-endian byte keys (so scans run in numeric order), u64 values as 8
//! bytes. This is how the crash checker and the benchmark drive it.
//!
//! Sizing follows `EngineConfig::initial_capacity`: a small capacity (the
//! crash checker's) gets 4 clusters of 4 KiB files, so that files fill,
//! seal and are garbage-collected within a short run; a large one gets the
//! paper's 8 MB files and 16..=256 clusters, as many as the expected data
//! fills. GC runs inline (every 64 writes)
//! rather than on a background thread, so that runs are deterministic.
//! The engine form always emulates its nodes (two for the small sizing,
//! so that remote accesses happen, one for the large); a program that
//! wants other nodes opens a [`Store`] with its own
//! [`OpenOptions::numa_emulate`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use engine::{CheckReport, Engine, EngineConfig, EngineKind, EngineSpec, Result, Stats};
use pmem::Pool;

use crate::layout::LAYOUT;
use crate::options::{CreateOptions, GcMode, IndexKind, OpenOptions, Options};
use crate::store::Store;

/// The store as an [`Engine`](engine::Engine): what [`spec`] opens.
pub(crate) struct StoreEngine {
    name: &'static str,
    store: Store,
    writes: AtomicU64,
    /// Small (crash-checker) sizing: writes rotate over the nodes.
    spread: bool,
}

/// The store's entry in the engine registry (layout [`LAYOUT`]).
pub fn spec() -> EngineSpec {
    EngineSpec {
        name: "store",
        about: "NStore-style key-value store: per-node hash-clustered logs, DRAM index (hash + ordered tree), RAF cache, GC",
        kind: EngineKind::Persistent {
            layout: LAYOUT,
            create: open,
            open,
        },
        reference: false,
    }
}

/// A store whose point index is the persistent engine `inner` (option b,
/// or c with the ordered tree): `store::store_spec!(hmeh::spec, "store-hash", false)`.
#[macro_export]
macro_rules! store_spec {
    ($inner:path, $name:literal, $ordered:expr) => {
        $crate::engine_impl::spec_named(
            $name,
            if $ordered {
                "store with a persistent hash index in the pool plus the ordered tree (index option c)"
            } else {
                "store with a persistent hash index in the pool: instant open, no scans (index option b)"
            },
            |pool, cfg| {
                let kind = if $ordered {
                    $crate::IndexKind::Both($inner())
                } else {
                    $crate::IndexKind::Hash($inner())
                };
                $crate::engine_impl::open_with(pool, cfg, $name, kind)
            },
        )
    };
}

/// How an engine form is opened (and created: the store formats a fresh pool).
pub type OpenFn = fn(Arc<Pool>, &EngineConfig) -> Result<Box<dyn Engine>>;

/// The spec of a store engine form opened by `open`.
pub fn spec_named(name: &'static str, about: &'static str, open: OpenFn) -> EngineSpec {
    EngineSpec {
        name,
        about,
        kind: EngineKind::Persistent {
            layout: LAYOUT,
            create: open,
            open,
        },
        reference: false,
    }
}

/// Options the engine form uses for `cfg`.
pub fn options_for(cfg: &EngineConfig) -> Options {
    let small = cfg.initial_capacity < 100_000;
    let nodes = if small { 2 } else { 1 };
    Options {
        create: CreateOptions {
            // Enough clusters that their active files hold about the data
            // (the paper's 256 × 8 MB per node is 2 GiB of files for any size).
            clusters: if small {
                4
            } else {
                (cfg.initial_capacity.saturating_mul(64) >> 23)
                    .next_power_of_two()
                    .clamp(16, 256) as u32
            },
            extent_size: if small { 4096 } else { 8 << 20 },
            nodes: Some(nodes),
            ..Default::default()
        },
        open: OpenOptions {
            numa_emulate: Some(nodes),
            durability: cfg.durability,
            gc: GcMode::Manual,
            raf_bytes: if small { 16 << 10 } else { 64 << 20 },
            recovery_threads: cfg.threads.max(1),
            expected_keys: cfg.initial_capacity,
            ..Default::default()
        },
    }
}

fn open(pool: Arc<Pool>, cfg: &EngineConfig) -> Result<Box<dyn Engine>> {
    open_with(pool, cfg, "store", IndexKind::Dram)
}

/// Opens (or creates) the engine form with point index `index`.
pub fn open_with(
    pool: Arc<Pool>,
    cfg: &EngineConfig,
    name: &'static str,
    index: IndexKind,
) -> Result<Box<dyn Engine>> {
    let mut opts = options_for(cfg);
    opts.create.index = index;
    let spread = opts.create.extent_size < (1 << 20) && opts.create.nodes.unwrap_or(1) > 1;
    let store = Store::open_pool(pool, opts)?;
    Ok(Box::new(StoreEngine {
        name,
        store,
        writes: AtomicU64::new(0),
        spread,
    }))
}

impl StoreEngine {
    /// Runs a write, on a rotating node under small sizing, so that one
    /// thread's keys get entries on every node's log (the cross-node
    /// version order is then crash-checked too).
    fn on_node<R>(&self, f: impl FnOnce() -> R) -> R {
        if !self.spread {
            return f();
        }
        let n = self.writes.load(Ordering::Relaxed) / 5;
        crate::numa::Numa::as_node(n as u32, f)
    }

    fn after_write(&self) -> Result<()> {
        if self.writes.fetch_add(1, Ordering::Relaxed) % 64 == 63 {
            crate::gc::run(&self.store.inner, 1, false)?;
        }
        Ok(())
    }
}

#[inline]
fn val(v: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = v.len().min(8);
    b[..n].copy_from_slice(&v[..n]);
    u64::from_le_bytes(b)
}

impl Engine for StoreEngine {
    fn name(&self) -> &str {
        self.name
    }

    fn insert(&self, key: u64, value: u64) -> Result<bool> {
        let r = self.on_node(|| self.store.insert(&key.to_be_bytes(), &value.to_le_bytes()))?;
        self.after_write()?;
        Ok(r)
    }

    fn get(&self, key: u64) -> Option<u64> {
        // The value's first 8 bytes, zero-filled past a shorter one (as
        // `val`), with nothing allocated.
        let mut out = [0u8; 8];
        // A corrupt entry (an `Err`) reads as absent: the trait's get has
        // no error, and wrong bytes are never returned.
        self.store
            .get_into_slice(&key.to_be_bytes(), &mut out)
            .ok()??;
        Some(u64::from_le_bytes(out))
    }

    fn update(&self, key: u64, value: u64) -> Result<bool> {
        let r = self.on_node(|| self.store.update(&key.to_be_bytes(), &value.to_le_bytes()))?;
        self.after_write()?;
        Ok(r)
    }

    fn remove(&self, key: u64) -> Result<bool> {
        let r = self.on_node(|| self.store.delete(&key.to_be_bytes()))?;
        self.after_write()?;
        Ok(r)
    }

    fn upsert(&self, key: u64, value: u64) -> Result<()> {
        self.on_node(|| self.store.put(&key.to_be_bytes(), &value.to_le_bytes()))?;
        self.after_write()
    }

    fn len(&self) -> u64 {
        self.store.len()
    }

    fn stats(&self) -> Stats {
        let s = self.store.stats();
        Stats {
            len: s.keys,
            capacity: s.keys,
            load_factor: 1.0,
            pm_bytes: s.pm_bytes,
            dram_bytes: s.index_dram_bytes,
            structural_changes: s.structural_changes,
            structural_nanos: s.structural_nanos,
            detail: vec![
                ("files".into(), s.files.to_string()),
                ("log_bytes".into(), s.log_bytes.to_string()),
                ("live_bytes".into(), s.live_bytes.to_string()),
                (
                    "space_amplification".into(),
                    format!("{:.3}", s.space_amplification),
                ),
                ("gc_runs".into(), s.gc_runs.to_string()),
                ("files_reclaimed".into(), s.files_reclaimed.to_string()),
                ("entries_relocated".into(), s.entries_relocated.to_string()),
                ("entries_marked".into(), s.entries_marked.to_string()),
                ("raf_enabled".into(), s.raf_enabled.to_string()),
                ("raf_hits".into(), s.raf_hits.to_string()),
                ("nodes".into(), s.nodes.to_string()),
                ("clusters".into(), s.clusters.to_string()),
                ("local_reads".into(), s.local_reads.to_string()),
                ("remote_reads".into(), s.remote_reads.to_string()),
                ("local_writes".into(), s.local_writes.to_string()),
                ("remote_writes".into(), s.remote_writes.to_string()),
                ("opened_from".into(), s.opened_from.to_string()),
                ("open_ms".into(), format!("{:.2}", s.open_ms)),
                ("recovered_entries".into(), s.recovered_entries.to_string()),
            ],
        }
    }

    fn sync(&self) -> Result<()> {
        self.store.sync()
    }

    fn for_each(&self, f: &mut dyn FnMut(u64, u64)) {
        // A corrupt entry (an `Err`) ends the walk: the trait's for_each has
        // no error, wrong bytes are never passed on, and `check` reports it.
        let _ = self.store.for_each(|k, v| {
            if let Ok(kb) = <[u8; 8]>::try_from(k) {
                f(u64::from_be_bytes(kb), val(v));
            }
        });
    }

    fn check(&self) -> Result<CheckReport> {
        let (keys, reachable_bytes) = self.store.check()?;
        Ok(CheckReport {
            keys,
            reachable_bytes,
        })
    }

    fn close(&self) -> Result<()> {
        self.store.close()
    }
}
