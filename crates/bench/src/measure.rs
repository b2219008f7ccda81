//! The measurement core every run shares: loading a [`Target`] untimed,
//! timing a workload on worker threads, and checking every answer. The
//! runner (engines) and `store_run` (the store engine) build the target,
//! call [`load`] and [`measure`], and turn the [`Measured`] figures into a
//! [`RunResult`] with [`new_result`].
//!
//! Timing: all workers wait on a barrier, then each notes its start
//! `Instant` and its persist counters, runs its share, and notes its end.
//! Wall time is from the earliest start to the latest end.
//!
//! Latency: timing every operation would cost two `Instant::now()` (about
//! 20–40 ns each) per operation and distort fast DRAM maps, so each thread
//! times one operation in [`SAMPLE_EVERY`] (the 1st, 65th, ...) on its own
//! and records it in its own `hdrhistogram` histogram (3 significant
//! figures); the percentiles come from the threads' histograms merged.
//! A sample includes about 20 ns of timer overhead, and it is the latency
//! of one operation on its own: the timer reads order the operation, so
//! its cache misses cannot overlap its neighbours' as they do between
//! untimed operations. That is why `1 / Mops` can be well below p50.
//!
//! Every result is checked: inserts and deletes of fresh/loaded keys must
//! succeed, positive gets must return the loaded value, negative gets must
//! miss, updates must find their key, and `len()` after the run must equal
//! what the workload implies. A wrong answer fails the benchmark with a
//! message instead of producing a number.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::Instant;

use rand::RngExt;

use crate::config::BenchConfig;
use crate::dist::{Dist, Picker, Zipfian};
use crate::keys::{load_value, KeySet};
use crate::progress::Meter;
use crate::report::{Latency, RunResult};
use crate::rng::{mix64, Rng};
use crate::target::Target;
use crate::workload::{Workload, YcsbOp, MAX_SCAN};

/// One operation in this many is timed for the latency percentiles.
pub(crate) const SAMPLE_EVERY: u64 = 64;

/// A worker reports its operations to the progress display once per this
/// many (a multiple of [`SAMPLE_EVERY`]).
const REPORT_EVERY: u64 = 1 << 14;

/// Latencies above this many ns (an hour) are recorded as this.
const MAX_LATENCY_NS: u64 = 3_600_000_000_000;

/// An empty latency histogram: 1 ns to an hour, 3 significant figures
/// (a fixed size, so recording never allocates in the timed loop).
pub(crate) fn latency_histogram() -> hdrhistogram::Histogram<u64> {
    // The bounds are constants that `new_with_bounds` accepts (low >= 1,
    // high >= 2 * low, sigfig <= 5); the fallback is unreachable.
    hdrhistogram::Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3)
        .unwrap_or_else(|_| hdrhistogram::Histogram::new(3).expect("3 significant figures"))
}

/// What every run shares: the keys and the precomputed zipfian generator.
pub(crate) struct Inputs {
    pub(crate) keys: KeySet,
    pub(crate) zipf: Option<Zipfian>,
}

/// A run's result, the pool mode it got, and why `dax` fell back if it did.
pub(crate) type Ran = (RunResult, Option<pmem::Mode>, Option<String>);

/// `[start, end)` of part `t` of `n` items split into `parts` chunks.
fn chunk(n: u64, parts: usize, t: usize) -> (u64, u64) {
    let at = |i: usize| (n as u128 * i as u128 / parts as u128) as u64;
    (at(t), at(t + 1))
}

/// Applies `op` to every key of `keys`, untimed, on as many threads as
/// there are cores (at most 8); `op` returning false is an error ("`what`
/// of key K `refused`").
pub(crate) fn for_all_keys(
    target: &dyn Target,
    keys: &[u64],
    what: &str,
    refused: &str,
    op: impl Fn(&dyn Target, u64) -> engine::Result<bool> + Sync,
) -> Result<(), String> {
    let parts = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8);
    let n = keys.len() as u64;
    let op = &op;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..parts)
            .map(|t| {
                let (a, b) = chunk(n, parts, t);
                let slice = &keys[a as usize..b as usize];
                s.spawn(move || -> Result<(), String> {
                    for &k in slice {
                        if !op(target, k).map_err(|e| format!("{what}: {e}"))? {
                            return Err(format!("{what}: key {k:#x} {refused}"));
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(format!("{what}: a thread panicked")))
            })
            .collect::<Result<Vec<()>, String>>()
    })?;
    Ok(())
}

/// Inserts every loaded key, untimed (see [`for_all_keys`]).
pub(crate) fn load(target: &dyn Target, keys: &[u64]) -> Result<(), String> {
    for_all_keys(target, keys, "load", "reported a duplicate", |t, k| {
        t.insert(k, load_value(k))
    })?;
    let (n, len) = (keys.len() as u64, target.len());
    if len != n {
        return Err(format!("after loading {n} keys, len() = {len}"));
    }
    Ok(())
}

/// What one worker thread brings back.
struct Outcome {
    start: Instant,
    end: Instant,
    ops: u64,
    inserted: u64,
    counters: pmem::persist::Counters,
    latency: hdrhistogram::Histogram<u64>,
    result: Result<(), String>,
}

/// Everything a worker reads.
struct Job<'a> {
    target: &'a dyn Target,
    inputs: &'a Inputs,
    workload: Workload,
    dist: Dist,
    threads: usize,
    ops: u64,
    seed: u64,
    /// Where the workers count their operations for the progress display.
    meter: Meter,
    /// Fresh keys handed out so far (YCSB D/E inserts).
    claimed: AtomicU64,
}

/// What the timed section of a run measured.
pub(crate) struct Measured {
    /// Wall time from the first thread's start to the last one's end.
    pub(crate) seconds: f64,
    /// Operations done.
    pub(crate) done: u64,
    pub(crate) flushes: u64,
    pub(crate) fences: u64,
    /// Latencies of the sampled operations (ns), all threads merged.
    pub(crate) latency: hdrhistogram::Histogram<u64>,
    /// `len()` after the run (checked against the workload).
    pub(crate) len_after: u64,
}

/// Times `workload` on `threads` threads over `target` (loaded by the
/// caller when the workload preloads), and checks every answer and `len()`
/// after the run.
pub(crate) fn measure(
    target: &dyn Target,
    cfg: &BenchConfig,
    workload: Workload,
    threads: usize,
    inputs: &Inputs,
    rep: usize,
    meter: &Meter,
) -> Result<Measured, String> {
    let ops = workload.op_count(cfg.keys, cfg.ops);
    let job = Job {
        target,
        inputs,
        workload,
        dist: workload.request_dist(cfg.dist),
        threads,
        ops,
        seed: mix64(cfg.seed ^ mix64(rep as u64 + 1) ^ mix64(workload as u64 + 77)),
        meter: meter.clone(),
        claimed: AtomicU64::new(0),
    };
    let barrier = Barrier::new(threads);
    let outcomes: Vec<Outcome> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (job, barrier) = (&job, &barrier);
                s.spawn(move || worker(job, t, barrier))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join())
            .collect::<Result<Vec<_>, _>>()
    })
    .map_err(|_| "a worker thread panicked".to_string())?;

    for o in &outcomes {
        o.result.clone()?;
    }
    let start = outcomes
        .iter()
        .map(|o| o.start)
        .min()
        .unwrap_or_else(Instant::now);
    let end = outcomes.iter().map(|o| o.end).max().unwrap_or(start);
    let seconds = end.duration_since(start).as_secs_f64().max(1e-9);
    let done: u64 = outcomes.iter().map(|o| o.ops).sum();
    let inserted: u64 = outcomes.iter().map(|o| o.inserted).sum();
    let (flushes, fences) = outcomes.iter().fold((0, 0), |(f, n), o| {
        (f + o.counters.flushes, n + o.counters.fences)
    });
    let mut latency = latency_histogram();
    for o in &outcomes {
        latency
            .add(&o.latency)
            .map_err(|e| format!("merging latency histograms: {e:?}"))?;
    }

    let expected_len = match workload {
        Workload::Delete | Workload::Delete100 => cfg.keys - ops,
        _ => cfg.keys + inserted,
    };
    let len_after = target.len();
    if len_after != expected_len {
        return Err(format!(
            "len() = {len_after} after the run, expected {expected_len}"
        ));
    }
    Ok(Measured {
        seconds,
        done,
        flushes,
        fences,
        latency,
        len_after,
    })
}

/// The fields of a run's result that every engine has, from `m`; the
/// engine's own figures are left empty for the caller.
pub(crate) fn new_result(
    engine: &str,
    workload: Workload,
    threads: usize,
    keys: u64,
    m: Measured,
) -> RunResult {
    let Measured {
        seconds,
        done,
        flushes,
        fences,
        latency,
        len_after,
    } = m;
    let per_op = |x: u64| {
        if done == 0 {
            0.0
        } else {
            x as f64 / done as f64
        }
    };
    RunResult {
        engine: engine.to_string(),
        workload: workload.name().to_string(),
        threads,
        keys,
        ops: done,
        mops: done as f64 / seconds / 1e6,
        lat_ns: Latency::from_histogram(&latency),
        flushes_per_op: per_op(flushes),
        fences_per_op: per_op(fences),
        load_factor: 0.0,
        pm_bytes: 0,
        dram_bytes: 0,
        pm_bytes_per_key: None,
        dram_bytes_per_key: None,
        initial_capacity: 0,
        structural_changes: 0,
        structural_ms: 0.0,
        structural_pct: 0.0,
        detail: Default::default(),
        ratio_to_hashbrown: None,
        reopen_ms: None,
        reopen_detail: Default::default(),
        store: None,
        repeats: Vec::new(),
        len_after,
        seconds,
    }
}

/// Runs `count` operations, timing one in [`SAMPLE_EVERY`] into `hist`
/// and counting them on `meter` every [`REPORT_EVERY`]; stops at the first
/// wrong answer or engine error.
#[inline]
fn timed(
    count: u64,
    hist: &mut hdrhistogram::Histogram<u64>,
    meter: &Meter,
    mut op: impl FnMut(u64) -> Result<(), String>,
) -> Result<(), String> {
    for i in 0..count {
        if i % SAMPLE_EVERY == 0 {
            if i % REPORT_EVERY == 0 && i > 0 {
                meter.add(REPORT_EVERY);
            }
            let t = Instant::now();
            op(i)?;
            hist.saturating_record(t.elapsed().as_nanos() as u64);
        } else {
            op(i)?;
        }
    }
    if count > 0 {
        meter.add((count - 1) % REPORT_EVERY + 1);
    }
    Ok(())
}

/// Keys a `get-batch` call looks up.
pub(crate) const BATCH_KEYS: usize = 64;

/// Runs `op` over `stream` in batches of [`BATCH_KEYS`]; a latency sample
/// is a sampled batch's time divided by its keys.
fn batched(
    stream: &[u64],
    hist: &mut hdrhistogram::Histogram<u64>,
    meter: &Meter,
    mut op: impl FnMut(&[u64], &mut [Option<u64>]) -> Result<(), String>,
) -> Result<(), String> {
    let mut out = [None; BATCH_KEYS];
    let every = (SAMPLE_EVERY as usize / BATCH_KEYS).max(1);
    let report = (REPORT_EVERY as usize / BATCH_KEYS).max(1);
    for (i, ks) in stream.chunks(BATCH_KEYS).enumerate() {
        let out = &mut out[..ks.len()];
        if i % every == 0 {
            if i % report == 0 && i > 0 {
                meter.add((report * BATCH_KEYS) as u64);
            }
            let t = Instant::now();
            op(ks, out)?;
            hist.saturating_record(t.elapsed().as_nanos() as u64 / ks.len() as u64);
        } else {
            op(ks, out)?;
        }
    }
    let batches = stream.len().div_ceil(BATCH_KEYS);
    let reported = batches.saturating_sub(1) / report * report * BATCH_KEYS;
    meter.add((stream.len() - reported.min(stream.len())) as u64);
    Ok(())
}

fn engine_err(what: &str, key: u64, e: engine::Error) -> String {
    format!("{what} of key {key:#x} failed: {e}")
}

fn worker(job: &Job<'_>, t: usize, barrier: &Barrier) -> Outcome {
    let keys = &job.inputs.keys;
    let n = keys.loaded.len() as u64;
    let target = job.target;
    // Disjoint slice of the key space (insert, delete) or share of the ops.
    let (lo, hi) = chunk(job.ops, job.threads, t);
    let count = hi - lo;
    let mut rng = crate::rng::seeded(job.seed ^ mix64(t as u64));
    let picker = Picker::new(job.dist, job.inputs.zipf.as_ref());
    let mut hist = latency_histogram();
    let meter = &job.meter;
    let mut inserted = 0u64;
    // Read and update workloads draw their keys before timing, into a
    // sequential stream: a random index into the key array at run time would
    // add a cache miss (and a TLB miss) per operation that belongs to the
    // harness, not to the engine.
    let stream: Vec<u64> = match (&picker, job.workload) {
        (
            Ok(p),
            Workload::GetPos
            | Workload::Get100
            | Workload::GetBatch
            | Workload::Update
            | Workload::Upd100,
        ) => {
            let mut p = p.clone();
            (0..count)
                .map(|_| keys.loaded[p.pick(&mut rng, n) as usize])
                .collect()
        }
        (Ok(p), Workload::GetNeg) => {
            let mut p = p.clone();
            (0..count)
                .map(|_| keys.absent[p.pick(&mut rng, n) as usize])
                .collect()
        }
        _ => Vec::new(),
    };

    barrier.wait();
    let c0 = pmem::persist::counters();
    let start = Instant::now();
    let result = match picker {
        Err(e) => Err(e),
        Ok(mut picker) => match job.workload {
            Workload::Insert | Workload::Put100 => {
                let put = job.workload == Workload::Put100;
                timed(count, &mut hist, meter, |i| {
                    let k = keys.loaded[(lo + i) as usize];
                    let done = if put {
                        target.put(k, load_value(k)).map(|()| true)
                    } else {
                        target.insert(k, load_value(k))
                    };
                    match done {
                        Ok(true) => Ok(()),
                        Ok(false) => Err(format!("insert of new key {k:#x} reported a duplicate")),
                        Err(e) => Err(engine_err("insert", k, e)),
                    }
                })
            }
            Workload::Delete | Workload::Delete100 => timed(count, &mut hist, meter, |i| {
                let k = keys.loaded[(lo + i) as usize];
                match target.remove(k) {
                    Ok(true) => Ok(()),
                    Ok(false) => Err(format!("delete of loaded key {k:#x} found nothing")),
                    Err(e) => Err(engine_err("delete", k, e)),
                }
            }),
            Workload::GetPos | Workload::Get100 => timed(count, &mut hist, meter, |i| {
                let k = stream[i as usize];
                match target.get(k) {
                    Some(v) if v == load_value(k) => Ok(()),
                    Some(v) => Err(format!(
                        "get of key {k:#x} returned {v:#x}, stored {:#x}",
                        load_value(k)
                    )),
                    None => Err(format!("get of loaded key {k:#x} found nothing")),
                }
            }),
            Workload::GetBatch => batched(&stream, &mut hist, meter, |ks, out| {
                target.get_many(ks, out);
                for (k, v) in ks.iter().zip(out.iter()) {
                    match v {
                        Some(v) if *v == load_value(*k) => {}
                        Some(v) => {
                            return Err(format!(
                                "get_many of key {k:#x} returned {v:#x}, stored {:#x}",
                                load_value(*k)
                            ))
                        }
                        None => return Err(format!("get_many of loaded key {k:#x} found nothing")),
                    }
                }
                Ok(())
            }),
            Workload::GetNeg => timed(count, &mut hist, meter, |i| {
                let k = stream[i as usize];
                match target.get(k) {
                    None => Ok(()),
                    Some(v) => Err(format!("get of absent key {k:#x} returned {v:#x}")),
                }
            }),
            Workload::Update | Workload::Upd100 => timed(count, &mut hist, meter, |i| {
                let k = stream[i as usize];
                match target.update(k, i) {
                    Ok(true) => Ok(()),
                    Ok(false) => Err(format!("update of loaded key {k:#x} found nothing")),
                    Err(e) => Err(engine_err("update", k, e)),
                }
            }),
            _ => mixed(job, &mut picker, &mut rng, count, &mut hist, &mut inserted),
        },
    };
    let end = Instant::now();
    let counters = pmem::persist::counters().since(&c0);
    let ops = if result.is_ok() { count } else { 0 };
    Outcome {
        start,
        end,
        ops,
        inserted,
        counters,
        latency: hist,
        result,
    }
}

/// The YCSB (and NStore) mixes. Reads, updates and puts pick an index
/// among the keys visible so far (loaded, then inserted by this run); a key
/// whose insert another thread has claimed but not finished may be missed,
/// so misses are only errors below the loaded count.
fn mixed(
    job: &Job<'_>,
    picker: &mut Picker,
    rng: &mut Rng,
    count: u64,
    hist: &mut hdrhistogram::Histogram<u64>,
    inserted: &mut u64,
) -> Result<(), String> {
    let keys = &job.inputs.keys;
    let target = job.target;
    let n = keys.loaded.len() as u64;
    let mix = job.workload.mix().ok_or("not a mixed workload")?;
    let grows = mix.insert > 0;
    let claimed = &job.claimed;
    let visible = || {
        if grows {
            n + claimed.load(Ordering::Relaxed)
        } else {
            n
        }
    };
    let read = |idx: u64| -> Result<Option<u64>, String> {
        let k = keys.in_insert_order(idx);
        match target.get(k) {
            None if idx < n => Err(format!("get of loaded key {k:#x} found nothing")),
            v => Ok(v),
        }
    };
    timed(count, hist, &job.meter, |i| match mix.choose(rng) {
        YcsbOp::Read => read(picker.pick(rng, visible())).map(drop),
        YcsbOp::Update => {
            let idx = picker.pick(rng, visible());
            let k = keys.in_insert_order(idx);
            match target.update(k, i) {
                Ok(false) if idx < n => Err(format!("update of loaded key {k:#x} found nothing")),
                Ok(_) => Ok(()),
                Err(e) => Err(engine_err("update", k, e)),
            }
        }
        YcsbOp::Put => {
            // Overwrites a visible key (never adds one, so len() holds).
            let idx = picker.pick(rng, visible());
            let k = keys.in_insert_order(idx);
            target.put(k, i).map_err(|e| engine_err("put", k, e))
        }
        YcsbOp::Insert => {
            let j = claimed.fetch_add(1, Ordering::Relaxed);
            let k = *keys.fresh.get(j as usize).ok_or("ran out of fresh keys")?;
            match target.insert(k, load_value(k)) {
                Ok(true) => {
                    *inserted += 1;
                    Ok(())
                }
                Ok(false) => Err(format!("insert of new key {k:#x} reported a duplicate")),
                Err(e) => Err(engine_err("insert", k, e)),
            }
        }
        YcsbOp::Scan => {
            let vis = visible();
            let first = picker.pick(rng, vis);
            let len = 1 + rng.random_range(0..MAX_SCAN);
            let k = keys.in_insert_order(first);
            match target.scan(k, len as usize) {
                // A real range scan from the key: a loaded key comes first.
                Some(Ok(got)) if first < n && got.first != Some(k) => Err(format!(
                    "scan from loaded key {k:#x} started at {:x?} ({} pairs)",
                    got.first, got.count
                )),
                Some(r) => r.map(drop).map_err(|e| engine_err("scan", k, e)),
                // Emulated scan: consecutive gets in the key array.
                None => (first..(first + len).min(vis)).try_for_each(|idx| read(idx).map(drop)),
            }
        }
        YcsbOp::ReadModifyWrite => {
            let idx = picker.pick(rng, visible());
            let k = keys.in_insert_order(idx);
            match read(idx)? {
                Some(v) => target
                    .update(k, v.wrapping_add(1))
                    .map(drop)
                    .map_err(|e| engine_err("update", k, e)),
                None => Ok(()),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_without_overlap() {
        for (n, parts) in [(10u64, 3usize), (0, 2), (2, 5), (1_000_001, 7)] {
            let mut next = 0;
            for t in 0..parts {
                let (a, b) = chunk(n, parts, t);
                assert_eq!(a, next);
                assert!(b >= a);
                next = b;
            }
            assert_eq!(next, n);
        }
    }
}
