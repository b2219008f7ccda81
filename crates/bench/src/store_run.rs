//! Runs of the store engine (`--engine store`): the store is driven
//! directly, with byte keys and values of `--key-size` / `--value-size`
//! bytes (8/8 by default; Viper's setup is 16/200), real range scans for
//! YCSB E, and `--numa-emulate` virtual nodes passed in its options.
//!
//! Every workload runs here, through the shared loading, timing and
//! checking ([`measure::measure`]) on a [`StoreTarget`]; the run adds the
//! store's figures: space amplification, local and remote log reads and
//! writes, GC and cache counts, and the clean reopen. `recovery` is the
//! store's own: it writes the keys and updates every other one (with GC
//! off, so the log holds exactly 1.5 entries a key), drops the store
//! without closing it, and times the log scan of the next open with as
//! many recovery threads as the run's thread count; then it closes and
//! times the clean reopen from the index image.
//!
//! Key `k` (a u64 of the key set) is stored as its 8 big-endian bytes (so
//! scans run in numeric order, as with the engine form) followed by filler
//! bytes derived from `k`; value `v` as its 8 little-endian bytes followed
//! by constant filler. A value of the wrong length reads as a wrong value.
//!
//! The store's options: 256 hash clusters (the paper's), files sized to
//! the data (about half of what one (node, cluster) pair will write, 4 KiB
//! to the paper's 8 MiB), a background GC thread (manual for recovery), a
//! 64 MiB RAF cache, and the pool sized to the data.

use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use engine::EngineSpec;
use store::{CreateOptions, GcMode, OpenOptions, Options, Store, StoreStats};

use crate::config::{BenchConfig, Sizing};
use crate::keys::load_value;
use crate::measure::{self, Inputs, Measured, Ran};
use crate::progress::Meter;
use crate::report::{Recovery, StoreFigures};
use crate::rng::GAMMA;
use crate::target::{Scanned, Target};
use crate::workload::Workload;

/// Hash clusters per node (the paper's default).
const CLUSTERS: u32 = 256;
const MIB: u64 = 1 << 20;
/// Largest pool the benchmark lets the store grow to.
const MAX_POOL: u64 = 20 << 30;

/// The store as a benchmark [`Target`].
pub(crate) struct StoreTarget {
    store: Store,
    key_size: usize,
    value_size: usize,
    scans: AtomicU64,
}

/// A thread's key, value and read buffers.
#[derive(Default)]
struct Buffers {
    key: Vec<u8>,
    value: Vec<u8>,
    out: Vec<u8>,
}

thread_local! {
    static BUFFERS: RefCell<Buffers> = RefCell::new(Buffers::default());
}

/// Writes key `k` of `size` bytes into `buf`.
#[inline]
fn encode_key(buf: &mut Vec<u8>, k: u64, size: usize) {
    buf.clear();
    buf.extend_from_slice(&k.to_be_bytes());
    if size > 8 {
        let fill = k.wrapping_mul(GAMMA).to_le_bytes();
        buf.extend(fill.iter().cycle().take(size - 8));
    }
}

/// Writes value `v` of `size` bytes into `buf`.
#[inline]
fn encode_value(buf: &mut Vec<u8>, v: u64, size: usize) {
    buf.clear();
    buf.extend_from_slice(&v.to_le_bytes());
    buf.resize(size, 0x5A);
}

impl StoreTarget {
    fn new(store: Store, cfg: &BenchConfig) -> StoreTarget {
        StoreTarget {
            store,
            key_size: cfg.key_size,
            value_size: cfg.value_size,
            scans: AtomicU64::new(0),
        }
    }

    /// Runs `f` on the encoded key (and value, when given).
    #[inline]
    fn with<R>(&self, k: u64, v: Option<u64>, f: impl FnOnce(&Store, &mut Buffers) -> R) -> R {
        BUFFERS.with(|b| {
            let mut b = b.borrow_mut();
            encode_key(&mut b.key, k, self.key_size);
            if let Some(v) = v {
                encode_value(&mut b.value, v, self.value_size);
            }
            f(&self.store, &mut b)
        })
    }

    fn decode(&self, value: &[u8]) -> u64 {
        let mut w = [0u8; 8];
        let n = value.len().min(8);
        w[..n].copy_from_slice(&value[..n]);
        let v = u64::from_le_bytes(w);
        if value.len() == self.value_size {
            v
        } else {
            !v
        }
    }
}

impl Target for StoreTarget {
    fn insert(&self, key: u64, value: u64) -> engine::Result<bool> {
        self.with(key, Some(value), |s, b| s.insert(&b.key, &b.value))
    }

    fn put(&self, key: u64, value: u64) -> engine::Result<()> {
        self.with(key, Some(value), |s, b| s.put(&b.key, &b.value))
    }

    fn update(&self, key: u64, value: u64) -> engine::Result<bool> {
        self.with(key, Some(value), |s, b| s.update(&b.key, &b.value))
    }

    fn remove(&self, key: u64) -> engine::Result<bool> {
        self.with(key, None, |s, b| s.delete(&b.key))
    }

    fn get(&self, key: u64) -> Option<u64> {
        if self.key_size == 8 && self.value_size == 8 {
            // Key and value on the stack, as a caller with integer keys
            // and values would (`get_into_slice`: no buffer, no allocation).
            let mut v = [0u8; 8];
            let n = self
                .store
                .get_into_slice(&key.to_be_bytes(), &mut v)
                .ok()??;
            let w = u64::from_le_bytes(v);
            return Some(if n == 8 { w } else { !w });
        }
        if self.key_size == 8 {
            // An 8-byte key is made on the stack, as a caller with integer
            // keys would; only the value goes through a reused buffer.
            let k = key.to_be_bytes();
            return BUFFERS.with(|b| {
                let out = &mut b.borrow_mut().out;
                self.store.get_into(&k, out).ok()?.then(|| self.decode(out))
            });
        }
        self.with(key, None, |s, b| {
            s.get_into(&b.key, &mut b.out)
                .ok()?
                .then(|| self.decode(&b.out))
        })
    }

    fn get_many(&self, keys: &[u64], out: &mut [Option<u64>]) {
        for (k, o) in keys.iter().zip(out.iter_mut()) {
            *o = self.get(*k);
        }
    }

    fn scan(&self, start: u64, limit: usize) -> Option<engine::Result<Scanned>> {
        self.scans.fetch_add(1, Ordering::Relaxed);
        Some(self.with(start, None, |s, b| {
            let pairs = s.scan(&b.key, None, limit)?;
            Ok(Scanned {
                count: pairs.len(),
                first: pairs
                    .first()
                    .and_then(|(k, _)| Some(u64::from_be_bytes(k.get(..8)?.try_into().ok()?))),
            })
        }))
    }

    fn len(&self) -> u64 {
        self.store.len()
    }
}

/// The store's directory under `--pool`, removed when dropped.
struct StoreDir(PathBuf);

impl StoreDir {
    fn new(cfg: &BenchConfig) -> StoreDir {
        // Runs of one process may overlap (tests): each gets its own.
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = cfg.pool_dir.join(format!(
            "pmhash-bench-{}-store-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        // A directory of ours left by a failed earlier run of this process.
        let _ = std::fs::remove_dir_all(&dir);
        StoreDir(dir)
    }
}

impl Drop for StoreDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The store's options for a run that writes about `writes` entries.
fn options(cfg: &BenchConfig, writes: u64, gc: GcMode, recovery_threads: usize) -> Options {
    let nodes = cfg.numa_emulate.unwrap_or_else(store::detect_nodes).max(1) as u64;
    let entry = store::entry_len(cfg.key_size, cfg.value_size);
    let data = writes.saturating_mul(entry);
    let pairs = nodes * CLUSTERS as u64;
    let extent = (data / pairs / 2)
        .max(16 * entry + store::X_DATA)
        .next_power_of_two()
        .clamp(store::MIN_EXTENT, 8 * MIB);
    // Twice the data and a file per pair (GC copies before it frees), the
    // index image, and room for the allocator.
    let files = data.saturating_add(pairs * extent).saturating_mul(2);
    let image = cfg.keys.saturating_mul(cfg.key_size as u64 + 24);
    let size = (64 * MIB)
        .saturating_add(files)
        .saturating_add(image)
        .div_ceil(MIB)
        * MIB;
    let max_size = size.saturating_mul(4).min(MAX_POOL).max(size);
    // Pre-sized: a pool that holds the whole run. Grown: the pool a user
    // who sizes nothing gets (`CreateOptions::default().pool_size`, as `pmhash
    // serve` opens it), so the run also pays for growing the file; it may
    // grow as far as a pre-sized run's (the default, 16 × its size, could
    // be too small for a big run).
    let first = match cfg.sizing {
        Sizing::Presized => size,
        Sizing::Grown(_) => Options::default().create.pool_size,
    };
    Options {
        create: CreateOptions {
            pool_size: first,
            clusters: CLUSTERS,
            extent_size: extent,
            nodes: cfg.numa_emulate,
            ..Default::default()
        },
        open: OpenOptions {
            mode: cfg.mode,
            max_pool_size: max_size.max(first),
            numa_emulate: cfg.numa_emulate,
            durability: cfg.durability,
            gc,
            recovery_threads,
            // Sizes the point index, as the engines are sized.
            expected_keys: cfg.sizing.initial_capacity(cfg.keys),
            inline_values: cfg.inline_values,
            verify_checksums: cfg.verify_checksums,
            ..Default::default()
        },
    }
}

fn open(dir: &StoreDir, opts: &Options) -> Result<(Store, f64), String> {
    let t = Instant::now();
    let s = Store::open(&dir.0, opts.clone())
        .map_err(|e| format!("cannot open the store in {}: {e}", dir.0.display()))?;
    Ok((s, t.elapsed().as_secs_f64() * 1e3))
}

fn figures(cfg: &BenchConfig, s: &StoreStats) -> StoreFigures {
    StoreFigures {
        key_size: cfg.key_size,
        value_size: cfg.value_size,
        inline_values: cfg.inline_values,
        verify_checksums: cfg.verify_checksums,
        nodes: s.nodes,
        space_amplification: s.space_amplification,
        log_bytes: s.log_bytes,
        live_bytes: s.live_bytes,
        local_reads: s.local_reads,
        remote_reads: s.remote_reads,
        local_writes: s.local_writes,
        remote_writes: s.remote_writes,
        raf_hits: s.raf_hits,
        gc_runs: s.gc_runs,
        files_reclaimed: s.files_reclaimed,
        recovery: None,
    }
}

fn detail(s: &StoreStats, extent: u64) -> Vec<(String, String)> {
    vec![
        ("files".into(), s.files.to_string()),
        ("extent_size".into(), extent.to_string()),
        ("clusters".into(), s.clusters.to_string()),
        ("entries_relocated".into(), s.entries_relocated.to_string()),
        ("entries_marked".into(), s.entries_marked.to_string()),
        ("raf_enabled".into(), s.raf_enabled.to_string()),
        ("raf_items".into(), s.raf_items.to_string()),
    ]
}

/// Reopens the cleanly closed store, checks it came from the image with
/// `len` keys, and returns its recovery milliseconds.
fn clean_reopen(dir: &StoreDir, opts: &Options, len: u64) -> Result<f64, String> {
    let opts = Options {
        create: opts.create.clone(),
        open: OpenOptions {
            gc: GcMode::Manual,
            ..opts.open.clone()
        },
    };
    let (s, _) = open(dir, &opts)?;
    let st = s.stats();
    if st.opened_from != store::OpenedFrom::Image || st.keys != len {
        return Err(format!(
            "clean reopen: opened from {} with {} keys, expected the image with {len}",
            st.opened_from, st.keys
        ));
    }
    s.close_and_free()
        .map_err(|e| format!("close after reopen: {e}"))?;
    Ok(st.open_ms)
}

/// One run of the store on `workload` with `threads` threads.
pub(crate) fn run_one(
    cfg: &BenchConfig,
    spec: &EngineSpec,
    workload: Workload,
    threads: usize,
    inputs: &Inputs,
    rep: usize,
    meter: &Meter,
) -> Result<Ran, String> {
    if workload == Workload::Recovery {
        return recovery(cfg, spec, threads, inputs);
    }
    if matches!(
        workload,
        Workload::Overwrite1 | Workload::Overwrite10 | Workload::OverwriteZipf
    ) {
        return overwrite(cfg, spec, workload, threads);
    }
    let dir = StoreDir::new(cfg);
    let writes = cfg.keys + workload.op_count(cfg.keys, cfg.ops);
    let opts = options(cfg, writes, GcMode::Background, threads);
    let (store, _) = open(&dir, &opts)?;
    let (mode, fallback) = (
        store.pool().mode(),
        store.pool().dax_fallback().map(str::to_string),
    );
    let target = StoreTarget::new(store, cfg);
    if workload.preloads() {
        measure::load(&target, &inputs.keys.loaded)?;
    }
    let loaded = target.store.stats();
    let m = measure::measure(&target, cfg, workload, threads, inputs, rep, meter)?;
    let stats = target.store.stats();
    let scans = target.scans.load(Ordering::Relaxed);
    // The store's owner is done with it: its index is freed as its image
    // is written.
    target
        .store
        .close_and_free()
        .map_err(|e| format!("close: {e}"))?;
    let mut r = measure::new_result(spec.name, workload, threads, cfg.keys, m);
    if matches!(mode, pmem::Mode::Mapped | pmem::Mode::Dax) {
        r.reopen_ms = Some(clean_reopen(&dir, &opts, r.len_after)?);
        r.reopen_detail.insert("opened_from".into(), "image".into());
    }
    fill(&mut r, cfg, &stats, opts.create.extent_size);
    r.set_structural(
        stats
            .structural_changes
            .saturating_sub(loaded.structural_changes),
        stats
            .structural_nanos
            .saturating_sub(loaded.structural_nanos),
    );
    if let Some(f) = r.store.as_mut() {
        // The timed section's accesses, not the load's.
        f.local_reads = f.local_reads.saturating_sub(loaded.local_reads);
        f.remote_reads = f.remote_reads.saturating_sub(loaded.remote_reads);
        f.local_writes = f.local_writes.saturating_sub(loaded.local_writes);
        f.remote_writes = f.remote_writes.saturating_sub(loaded.remote_writes);
        f.raf_hits = f.raf_hits.saturating_sub(loaded.raf_hits);
    }
    if scans > 0 {
        r.detail.insert("range_scans".into(), scans.to_string());
    }
    Ok((r, Some(mode), fallback))
}

fn fill(r: &mut crate::RunResult, cfg: &BenchConfig, stats: &StoreStats, extent: u64) {
    r.load_factor = 1.0;
    r.initial_capacity = cfg.sizing.initial_capacity(cfg.keys);
    r.set_memory(stats.pm_bytes, stats.index_dram_bytes);
    r.detail = detail(stats, extent).into_iter().collect();
    r.store = Some(figures(cfg, stats));
}

/// Slices of an overwrite run reported as its throughput over time.
const SLICES: usize = 10;

/// The overwrite workloads: `--ops` puts (split over the threads) of one
/// key, ten keys, or `--keys` keys drawn zipfian with θ = 0.99, into a
/// fresh store with 16 clusters, 8 MiB files and the background GC. The
/// run reports its throughput in each tenth of the puts
/// (`mops_by_tenth`), the slowest tenth against the first
/// (`last_tenth_vs_first`), the GC figures, space amplification, and the
/// close time (`close_ms`); every key must read its last value at the end.
fn overwrite(
    cfg: &BenchConfig,
    spec: &EngineSpec,
    workload: Workload,
    threads: usize,
) -> Result<Ran, String> {
    let keys = match workload {
        Workload::Overwrite1 => 1,
        Workload::Overwrite10 => 10,
        _ => cfg.keys.max(1),
    };
    let zipf = (workload == Workload::OverwriteZipf)
        .then(|| crate::dist::Zipfian::new(keys, 0.99))
        .transpose()?;
    let dir = StoreDir::new(cfg);
    let opts = Options {
        create: CreateOptions {
            pool_size: 256 * MIB,
            clusters: 16,
            extent_size: 8 * MIB,
            nodes: cfg.numa_emulate,
            ..Default::default()
        },
        open: OpenOptions {
            mode: cfg.mode,
            max_pool_size: 4 << 30,
            numa_emulate: cfg.numa_emulate,
            durability: cfg.durability,
            gc: GcMode::Background,
            recovery_threads: threads,
            expected_keys: keys,
            inline_values: cfg.inline_values,
            verify_checksums: cfg.verify_checksums,
            ..Default::default()
        },
    };
    let (store, _) = open(&dir, &opts)?;
    let mode = store.pool().mode();
    let fallback = store.pool().dax_fallback().map(str::to_string);
    let target = StoreTarget::new(store, cfg);
    let threads = threads.max(1);
    let per_thread = (cfg.ops / threads as u64).max(1);
    let total = per_thread * threads as u64;
    let slice = total.div_ceil(SLICES as u64);
    // The op count at which each slice ended, and when.
    let done = AtomicU64::new(0);
    let ends: Vec<AtomicU64> = (0..SLICES).map(|_| AtomicU64::new(0)).collect();
    // The last value each thread wrote to each key it touched.
    let t0 = Instant::now();
    let lasts: Vec<Result<Vec<(u64, u64)>, String>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (target, done, ends, zipf) = (&target, &done, &ends, zipf.as_ref());
                sc.spawn(move || {
                    let mut rng = crate::rng::seeded(cfg.seed ^ (t as u64 + 1));
                    let mut last = std::collections::HashMap::new();
                    for i in 0..per_thread {
                        let k = match zipf {
                            Some(z) => crate::dist::fnvhash64(z.next(&mut rng)) % keys,
                            None => rand::RngExt::random_range(&mut rng, 0..keys),
                        };
                        // Each thread writes its own values of a key.
                        let v = (t as u64) << 48 | i;
                        target
                            .with(k, Some(v), |s, b| s.put(&b.key, &b.value))
                            .map_err(|e| format!("put: {e}"))?;
                        last.insert(k, v);
                        let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                        if n % slice == 0 || n == total {
                            let at = (n.div_ceil(slice) - 1) as usize;
                            ends[at.min(SLICES - 1)]
                                .store(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                        }
                    }
                    Ok(last.into_iter().collect())
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into())))
            .collect()
    });
    let seconds = t0.elapsed().as_secs_f64();
    // With one thread the last value of each key is known; with several,
    // a key must hold the last value of one of them.
    let mut want: std::collections::HashMap<u64, Vec<u64>> = std::collections::HashMap::new();
    for l in lasts {
        for (k, v) in l? {
            want.entry(k).or_default().push(v);
        }
    }
    for (k, vs) in &want {
        let got = target.with(*k, None, |s, b| {
            s.get(&b.key).map(|v| v.map(|v| target.decode(&v)))
        });
        match got {
            Ok(Some(g)) if vs.contains(&g) => {}
            other => {
                return Err(format!(
                    "after the run key {k} reads {other:?}, expected one of {vs:?}"
                ))
            }
        }
    }
    let stats = target.store.stats();
    let tc = Instant::now();
    target.store.close().map_err(|e| format!("close: {e}"))?;
    drop(target);
    let close_ms = tc.elapsed().as_secs_f64() * 1e3;
    let mut prev = 0u64;
    let mops: Vec<f64> = ends
        .iter()
        .map(|e| {
            let e = e.load(Ordering::Relaxed);
            let dt = e.saturating_sub(prev).max(1);
            prev = e;
            slice as f64 / dt as f64 * 1e3
        })
        .collect();
    let m = Measured {
        seconds,
        done: total,
        flushes: 0,
        fences: 0,
        latency: measure::latency_histogram(),
        len_after: stats.keys,
    };
    let mut r = measure::new_result(spec.name, workload, threads, keys, m);
    fill(&mut r, cfg, &stats, opts.create.extent_size);
    r.initial_capacity = keys;
    let list: Vec<String> = mops.iter().map(|m| format!("{m:.3}")).collect();
    r.detail.insert("mops_by_tenth".into(), list.join(","));
    let worst = mops.iter().copied().fold(f64::INFINITY, f64::min);
    r.detail.insert(
        "slowest_tenth_vs_first".into(),
        format!("{:.2}", worst / mops[0]),
    );
    r.detail.insert("close_ms".into(), format!("{close_ms:.1}"));
    r.detail.insert("gc_runs".into(), stats.gc_runs.to_string());
    r.detail
        .insert("files_reclaimed".into(), stats.files_reclaimed.to_string());
    r.detail.insert(
        "log_mib".into(),
        format!("{:.1}", stats.log_bytes as f64 / MIB as f64),
    );
    Ok((r, Some(mode), fallback))
}

/// Keys checked after the crash open (spread over the key set).
const CHECKED: usize = 10_000;

/// The recovery workload (see the module docs).
fn recovery(
    cfg: &BenchConfig,
    spec: &EngineSpec,
    threads: usize,
    inputs: &Inputs,
) -> Result<Ran, String> {
    let keys = &inputs.keys.loaded;
    let n = keys.len() as u64;
    let updated: Vec<u64> = keys.iter().step_by(2).copied().collect();
    let dir = StoreDir::new(cfg);
    let opts = options(cfg, n + updated.len() as u64, GcMode::Manual, threads);
    let (store, _) = open(&dir, &opts)?;
    let (mode, fallback) = (
        store.pool().mode(),
        store.pool().dax_fallback().map(str::to_string),
    );
    if !matches!(mode, pmem::Mode::Mapped | pmem::Mode::Dax) {
        return Err(format!(
            "recovery reopens the pool file: it needs --mode mapped or dax, not {}",
            mode.name()
        ));
    }
    let target = StoreTarget::new(store, cfg);
    measure::load(&target, keys)?;
    measure::for_all_keys(&target, &updated, "update", "found nothing", |t, k| {
        t.update(k, !load_value(k))
    })?;
    let before = target.store.stats();
    // No close: the next open finds no image and scans the log.
    drop(target);

    let (store, wall_ms) = open(&dir, &opts)?;
    let st = store.stats();
    if st.opened_from != store::OpenedFrom::LogScan || st.keys != n || st.recovered_entries == 0 {
        return Err(format!(
            "crash open: opened from {} with {} keys after scanning {} entries, expected a log scan with {n} keys",
            st.opened_from, st.keys, st.recovered_entries
        ));
    }
    let target = StoreTarget::new(store, cfg);
    let step = (keys.len() / CHECKED).max(1);
    for (i, &k) in keys.iter().enumerate().step_by(step) {
        let want = if i % 2 == 0 {
            !load_value(k)
        } else {
            load_value(k)
        };
        if target.get(k) != Some(want) {
            return Err(format!(
                "after the crash open, key {k:#x} reads {:x?}, stored {want:#x}",
                target.get(k)
            ));
        }
    }
    target.store.close().map_err(|e| format!("close: {e}"))?;
    drop(target);
    let clean_ms = clean_reopen(&dir, &opts, n)?;

    let entries = st.recovered_entries;
    let seconds = (st.open_ms / 1e3).max(1e-9);
    let m = Measured {
        seconds,
        done: entries,
        flushes: 0,
        fences: 0,
        latency: measure::latency_histogram(),
        len_after: st.keys,
    };
    let mut r = measure::new_result(spec.name, Workload::Recovery, threads, cfg.keys, m);
    r.reopen_ms = Some(clean_ms);
    r.reopen_detail.insert("opened_from".into(), "image".into());
    fill(&mut r, cfg, &before, opts.create.extent_size);
    if let Some(f) = r.store.as_mut() {
        f.recovery = Some(Recovery {
            threads,
            entries,
            keys: st.keys,
            ms: st.open_ms,
            wall_ms,
            entries_per_s: entries as f64 / seconds,
            ms_per_million_entries: st.open_ms * 1e6 / entries as f64,
            clean_reopen_ms: clean_ms,
            clean_ms_per_million_keys: clean_ms * 1e6 / n as f64,
        });
    }
    Ok((r, Some(mode), fallback))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values_encode_and_order() {
        let mut a = Vec::new();
        let mut b = Vec::new();
        encode_key(&mut a, 5, 16);
        encode_key(&mut b, 6, 16);
        assert_eq!((a.len(), b.len()), (16, 16));
        assert!(a < b, "keys sort in numeric order");
        assert_eq!(&a[..8], &5u64.to_be_bytes());
        encode_key(&mut a, 7, 8);
        assert_eq!(a, 7u64.to_be_bytes());
        encode_value(&mut a, 9, 200);
        assert_eq!(a.len(), 200);
        assert_eq!(&a[..8], &9u64.to_le_bytes());
    }
}
