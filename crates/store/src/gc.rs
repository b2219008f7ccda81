//! Two-phase garbage collection (§3.7 of the spec).
//!
//! A sealed file whose dead bytes reach `gc_threshold` of its written bytes
//! is reclaimed:
//!
//! **Phase A, marking.** For every valid entry E of the file, under E's key
//! stripe: walk E's history through `h_addr` (stopping at an invalid entry,
//! at `NONE`, or at a file whose sequence number no longer matches — F7),
//! and note it, oldest first. Once every entry of the file is walked, the
//! histories are marked invalid **level by level**: the oldest entry of
//! every history, one fence, the next ones, one fence, and so on, so each
//! history is marked oldest first and a durable mark always has a durable
//! history (I3), for one fence per level instead of one per entry (70% of
//! GC's time under pipelined SETs went to those fences). Marks wait for
//! the end of the walk safely: only this GC frees files (one GC at a
//! time), and the file goes only after the marks are durable. Then, if the index names
//! E, E is live: it is copied to the active file of the same (node,
//! cluster) with a new version whose history is E itself, and the index is switched
//! to the copy while the stripe is held (F3: no foreground write can slip
//! between). Otherwise E is stale (or a `del`) and is left as it is: it
//! goes with its file, and until then something outranks it (a newer entry
//! of its key, or, for a `del`, only invalid history). Marking it too, as
//! the paper does, costs one persist per dead entry: the crash checker's
//! 6,000-operation run takes about 5,040 fences with it and about 3,700
//! without, with no violation either way (and 981 with history marking switched off).
//!
//! **Phase B, reclaim.** The file leaves the DRAM maps, an epoch passes (no
//! reader still holds an address into it, F5), and it is unlinked from the
//! extent table and freed through the allocator's lane protocol.
//!
//! Why no delete comes back: a `del` entry disappears (with its file)
//! only after every older entry of its key is invalid or gone, and a
//! relocated copy's history is the original it replaced: a crash after the
//! copy but before the original's file is freed leaves both valid, and
//! whatever later supersedes the copy then marks the original too (while
//! the original's file lives; F7 stops the walk after).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use engine::{Durability, Result};

use crate::inner::Inner;
use crate::layout::*;
use crate::nlog::{LogFile, NewEntry};
use crate::options::GcMode;

/// Files whose dead fraction reaches the threshold, most dead first.
fn candidates(s: &Inner) -> Vec<Arc<LogFile>> {
    let mut v: Vec<(f64, Arc<LogFile>)> = s
        .log
        .snapshot()
        .into_iter()
        .filter(|f| {
            f.sealed.load(Ordering::Acquire)
                && f.accounted.load(Ordering::Acquire)
                && !f.damaged.load(Ordering::Acquire)
        })
        .filter_map(|f| {
            let used = f.used();
            if used == 0 {
                return Some((1.0, f));
            }
            let r = f.dead.load(Ordering::Relaxed) as f64 / used as f64;
            (r >= s.opts.open.gc_threshold).then_some((r, f))
        })
        .collect();
    // Most dead first; among equals the oldest first, whose entries are
    // the ends of the others' histories (reclaimed first, they leave the
    // newer files' walks nothing to mark).
    v.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.seq.cmp(&b.1.seq)));
    v.into_iter().map(|(_, f)| f).collect()
}

/// A writer's share of GC, when files fill faster than the background
/// thread reclaims them (overwrite-heavy work: one hot key fills an 8 MiB
/// file in tens of milliseconds): it reclaims a file itself, or, while
/// the background thread holds GC, waits a moment for it. This bounds the
/// log at about [`GC_BACKLOG`](crate::nlog::GC_BACKLOG) reclaimable files
/// past what the live data needs, and paces writers to GC. Called with no
/// lock and no epoch pin held.
#[cold]
pub(crate) fn help(s: &Inner) {
    if run(s, 1, false).is_ok_and(|n| n > 0) {
        return;
    }
    if s.log.backlog.load(Ordering::Relaxed) >= crate::nlog::GC_BACKLOG {
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
}

/// Reclaims up to `max_files` files; returns how many.
/// `own_thread`: called on the store's background thread, which may be
/// pinned to each file's node in turn (on real NUMA machines).
pub(crate) fn run(s: &Inner, max_files: usize, own_thread: bool) -> Result<usize> {
    let Ok(_g) = s.gc_lock.try_lock() else {
        return Ok(0);
    };
    let mut done = 0;
    let cands = candidates(s);
    let mut left = cands.len() as u64;
    s.log.backlog.store(left, Ordering::Relaxed);
    for f in cands.into_iter().take(max_files) {
        if s.closed.load(Ordering::Acquire) || s.stopping.load(Ordering::Acquire) {
            break;
        }
        // GC of a file runs as a thread of the file's node (the paper's
        // per-node GC threads): the background thread is pinned there on
        // real NUMA machines, and under emulation it counts as that node's,
        // so its copies are local writes. A caller's thread is never
        // pinned, and on real nodes it counts where it runs.
        if own_thread && s.numa.places() {
            s.numa.pin_thread(f.node);
        }
        if own_thread || s.numa.is_emulated() {
            crate::numa::Numa::as_node(f.node, || reclaim(s, &f))?;
        } else {
            reclaim(s, &f)?;
        }
        done += 1;
        left -= 1;
        s.log.backlog.store(left, Ordering::Relaxed);
    }
    if done > 0 {
        s.gc_runs.fetch_add(1, Ordering::Relaxed);
    }
    Ok(done)
}

fn reclaim(s: &Inner, f: &Arc<LogFile>) -> Result<()> {
    let log = &s.log;
    let (mut kbuf, mut vbuf) = (Vec::new(), Vec::new());
    let mut pos = X_DATA;
    let tail = f.tail.load(Ordering::Acquire);
    let persistent = s.index.is_persistent();
    let mut touched: Vec<Arc<LogFile>> = Vec::new();
    // The file's valid entries, grouped by key in the order each key first
    // appears in the file (so a reclaim's relocations, hence its writes
    // and fences, follow the file and not a hash map's random order: a
    // seeded crash-checker run repeats exactly). One pass reads and checks
    // them without any stripe held.
    let mut by_key: Vec<(Vec<u8>, Vec<crate::nlog::Entry>)> = Vec::new();
    let mut slot_of: HashMap<Vec<u8>, usize> = HashMap::new();
    while pos < tail {
        let Some(e) = log.parse(f, pos, &mut kbuf, &mut vbuf) else {
            // Below the file's known tail: corruption. Freeing the file
            // would drop every entry after it; it stays, never reclaimed.
            f.damaged.store(true, Ordering::Release);
            return Err(engine::Error::Corrupt(format!(
                "{}: the entry at pool offset {:#x} fails its checksum; \
                 the file is kept (run `pmhash check --repair` to salvage it)",
                f.describe(),
                f.off + pos
            )));
        };
        pos += e.len;
        if e.op == OP_INV {
            continue;
        }
        if e.h_seq == crate::pindex::OVF_MARK {
            reclaim_ovf(s, f, &e, &vbuf, &mut touched)?;
            continue;
        }
        match slot_of.get(kbuf.as_slice()) {
            Some(&i) => by_key[i].1.push(e),
            None => {
                slot_of.insert(kbuf.clone(), by_key.len());
                by_key.push((kbuf.clone(), vec![e]));
            }
        }
    }
    // levels[i]: the i-th oldest entry of every history to mark.
    let mut levels: Vec<Vec<u64>> = Vec::new();
    drop(slot_of);
    for (key, mut entries) in by_key {
        if s.stopping.load(Ordering::Acquire) {
            // Nothing is marked or freed yet: the file stays as it is.
            return Ok(());
        }
        // Newest first: only the newest can be the live one.
        entries.sort_unstable_by_key(|e| std::cmp::Reverse(e.version));
        let hash = key_hash(&key);
        let _k = s.index.stripes.lock(hash);
        let cur = s.index.get(&key);
        // With a persistent point index, recovery never reads op bits, so
        // marks would only cost fences: stale entries die with their file.
        if !persistent {
            let marks = history(s, f, &entries, cur);
            for (level, off) in marks.into_iter().enumerate() {
                if levels.len() <= level {
                    levels.push(Vec::new());
                }
                levels[level].push(off);
            }
        }
        // Only the key's newest entry in this file can be the one the
        // index names.
        let e = &entries[0];
        let here_va = vaddr(f.node, e.off);
        if e.op != OP_DEL && cur == Some(here_va) {
            log.read_value(e, &mut vbuf);
            let cluster = f.cluster;
            let version = s
                .log
                .version(cluster as usize)
                .fetch_add(1, Ordering::AcqRel);
            // persist: the copy (durable in append; fenced below under
            // Relaxed) before the index names it and before the file is
            // freed. Its history is E (whose own history is marked
            // invalid before this file goes), so that E is marked with the
            // copy if a crash keeps this file alive past the copy.
            let copy = NewEntry {
                cluster,
                op: OP_INS,
                version,
                key: &key,
                value: &vbuf,
                h_addr: here_va,
                h_seq: f.seq,
            };
            let (va, nf) = log.append(f.node, &copy, &s.numa)?;
            s.index
                .set(&key, hash, va, &vbuf, &mut |h, p| s.append_ovf(h, p))?;
            s.raf.relocate(&key, hash, here_va, va, f.node);
            f.dead.fetch_add(e.len, Ordering::Relaxed);
            s.relocated.fetch_add(1, Ordering::Relaxed);
            if !touched.iter().any(|t| Arc::ptr_eq(t, &nf)) {
                touched.push(nf);
            }
        } else if !persistent && s.opts.open.durability == Durability::Relaxed {
            // The entry that supersedes E must be durable before E's file
            // is freed, or a crash could leave the key with neither. E
            // itself is not marked: it goes with its file, and until then
            // a newer entry (or, for a `del`, nothing older) outranks it.
            if let Some(c) = cur.and_then(|c| log.file_at(vaddr_off(c))) {
                log.sync_file(&c);
            }
        }
    }
    for level in &levels {
        for &off in level {
            log.mark_invalid(off);
        }
        // persist: this level of every history before the next (I3), and
        // all of them before the file is freed below.
        log.pool.fence();
        s.marked.fetch_add(level.len() as u64, Ordering::Relaxed);
    }
    if s.opts.open.durability == Durability::Relaxed {
        for t in &touched {
            log.sync_file(t);
        }
    }
    if let crate::index::Point::Engine(p) = s.index.point() {
        // persist: the engine's slots for the relocated copies before the
        // file goes (under Relaxed they may still be in flight).
        p.engine.sync()?;
    }
    // Phase B: out of the maps, past an epoch, then freed.
    log.forget(f);
    s.epochs.synchronize();
    log.free_file(f)
}

/// Phase A/B for an overflow entry of the persistent index: copied if its
/// hash slot still names it, else marked invalid.
fn reclaim_ovf(
    s: &Inner,
    f: &Arc<LogFile>,
    e: &crate::nlog::Entry,
    payload: &[u8],
    touched: &mut Vec<Arc<LogFile>>,
) -> Result<()> {
    let h = e.h_addr;
    let _k = s.index.stripes.lock(h);
    let here_va = vaddr(f.node, e.off);
    let live = match s.index.point() {
        crate::index::Point::Engine(p) if p.names_ovf(h, here_va) => Some(p),
        _ => None,
    };
    // Not named: it dies with its file (no mark needed, see reclaim).
    if let Some(p) = live {
        {
            let version = s
                .log
                .version(f.cluster as usize)
                .fetch_add(1, Ordering::AcqRel);
            // persist: the copy before the slot names it (engine update).
            let copy = NewEntry {
                cluster: f.cluster,
                op: OP_INS,
                version,
                key: b"",
                value: payload,
                h_addr: h,
                h_seq: crate::pindex::OVF_MARK,
            };
            let (va, nf) = s.log.append(f.node, &copy, &s.numa)?;
            p.relocate_ovf(h, here_va, va)?;
            s.relocated.fetch_add(1, Ordering::Relaxed);
            if !touched.iter().any(|t| Arc::ptr_eq(t, &nf)) {
                touched.push(nf);
            }
        }
    }
    Ok(())
}

/// The valid history behind the entries of one key in file `f`
/// (`entries`), oldest first: what must be marked invalid before `f` goes.
/// The entries of `f` itself go with the file and are not marked; each of
/// them is taken in turn, and only a link that leaves the file is walked.
/// A walk goes back through `h_addr` and stops at an invalid entry, at
/// `NONE`, at a file whose sequence number no longer matches (F7), at the
/// entry the index names (`cur`: never mark the live entry nor what lies
/// behind it; an orphan, an entry whose index update a crash cut off,
/// points at it), at an entry of `f` (taken in its own turn), or at an
/// entry an earlier walk passed. Every entry is so visited once per
/// reclaim: a hot key's tens of thousands of entries in one file cost one
/// pass, where a walk per entry through all the older ones was quadratic.
fn history(s: &Inner, f: &LogFile, entries: &[crate::nlog::Entry], cur: Option<u64>) -> Vec<u64> {
    let log = &s.log;
    let mut seen: HashSet<u64> = HashSet::new();
    let mut marks: Vec<(u64, u64)> = Vec::new();
    let in_f = |h: u64| vaddr_node(h) == f.node && f.contains(vaddr_off(h));
    for e in entries {
        let (mut h, mut hs, mut ver) = (e.h_addr, e.h_seq, e.version);
        while h != NONE && Some(h) != cur && !in_f(h) {
            if !s.has_file_with_seq(h, hs) {
                break;
            }
            let Some(p) = log.header(vaddr_off(h)) else {
                break;
            };
            if p.op == OP_INV || p.version >= ver || !seen.insert(p.off) {
                break;
            }
            marks.push((p.version, p.off));
            (h, hs, ver) = (p.h_addr, p.h_seq, p.version);
        }
    }
    // Oldest first: a key's versions grow along its history.
    marks.sort_unstable();
    marks.into_iter().map(|(_, off)| off).collect()
}

/// Lets GC keep up with writers (background GC only): one relaxed load
/// unless reclaimable files have piled up (see [`help`]).
#[inline]
pub(crate) fn pace(s: &Inner) {
    if s.log.backlog.load(Ordering::Relaxed) >= crate::nlog::GC_BACKLOG
        && s.opts.open.gc == GcMode::Background
    {
        help(s);
    }
}
