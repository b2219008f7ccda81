//! The state every part of an open store shares ([`Inner`]): the pool,
//! the log, the index, the epochs, the counters, and the operations on
//! them that the write path, the read path, garbage collection and
//! recovery all use. The [`Store`](crate::Store) facade holds it in an
//! `Arc`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use engine::{Durability, Error, Result};
use pmem::Pool;

use crate::epoch::Epochs;
use crate::index::{Index, KeyChange};
use crate::layout::*;
use crate::nlog::{LogFile, LogRoot, NewEntry, Nlog};
use crate::numa::Numa;
use crate::options::Options;
use crate::raf::{LogRead, Raf};
use crate::stats::OpenedFrom;

pub(crate) struct Inner {
    pub(crate) pool: Arc<Pool>,
    pub(crate) log: Nlog,
    pub(crate) index: Index,
    pub(crate) raf: Raf,
    pub(crate) numa: Numa,
    pub(crate) epochs: Arc<Epochs>,
    pub(crate) opts: Options,
    /// Live keys (a sharded counter: every insert and delete adds to it).
    pub(crate) keys: engine::sync::Counter,
    pub(crate) gc_lock: Mutex<()>,
    pub(crate) gc_runs: AtomicU64,
    pub(crate) relocated: AtomicU64,
    pub(crate) marked: AtomicU64,
    pub(crate) closed: AtomicBool,
    /// Set when the background thread is told to stop: GC gives up the
    /// file it is on (before marking anything) so that close and drop
    /// return promptly.
    pub(crate) stopping: AtomicBool,
    pub(crate) opened_from: OpenedFrom,
    pub(crate) open_ms: f64,
    pub(crate) recovered_entries: u64,
    pub(crate) readers: Option<crate::readers::Readers>,
    /// A delete marks the key's entry invalid in place when nothing older
    /// of the key is valid (`Store::write`, `history_is_dead`): with the
    /// DRAM index (recovery reads op bits; a persistent index's recovery
    /// does not) under `Strict` (the mark is fenced before the delete
    /// returns; `Relaxed` syncs files, and a mark lies outside their
    /// unsynced ranges).
    pub(crate) in_place_deletes: bool,
}

pub(crate) fn new_inner(
    pool: Arc<Pool>,
    log_root: &LogRoot,
    opts: Options,
    index: Index,
    epochs: Arc<Epochs>,
) -> Inner {
    let nodes = log_root.nodes;
    let numa = Numa::new(nodes, opts.open.numa_emulate, opts.open.remote_latency_ns);
    let readers = (opts.open.scan_readers > 0)
        .then(|| crate::readers::Readers::new(nodes, opts.open.scan_readers));
    let in_place_deletes = opts.open.durability == Durability::Strict && !index.is_persistent();
    Inner {
        log: Nlog::new(
            pool.clone(),
            log_root,
            // With a persistent point index the log always fences: the
            // engine may persist a slot at any time (Relaxed), and a slot
            // must never name an entry that is not durable.
            if index.is_persistent() {
                Durability::Strict
            } else {
                opts.open.durability
            },
            epochs.clone(),
        ),
        pool,
        index,
        raf: Raf::new(
            opts.open.raf_bytes,
            opts.open.remote_ratio,
            opts.open.raf_window,
        ),
        numa,
        epochs,
        keys: engine::sync::Counter::default(),
        gc_lock: Mutex::new(()),
        gc_runs: AtomicU64::new(0),
        relocated: AtomicU64::new(0),
        marked: AtomicU64::new(0),
        closed: AtomicBool::new(false),
        stopping: AtomicBool::new(false),
        opened_from: OpenedFrom::Created,
        open_ms: 0.0,
        recovered_entries: 0,
        readers,
        in_place_deletes,
        opts,
    }
}

impl Inner {
    /// Reads the value of `key` from its entry at `va` (the index named
    /// it; the caller is pinned) into `out`, counting the access and, for a
    /// sampled get, offering the value to the RAF cache. False if the entry
    /// cannot be read; an `Err` if it fails its checksum (when reads
    /// verify: `OpenOptions::verify_checksums`).
    pub(crate) fn read_entry(
        &self,
        key: &[u8],
        hash: u64,
        va: u64,
        sampled: bool,
        here: u32,
        out: &mut Vec<u8>,
    ) -> Result<bool> {
        let mut va = va;
        let mut tries = 0;
        let (node, _entry) = loop {
            let node = vaddr_node(va);
            self.numa.count_read(node, here);
            let Some(e) = self.log.header(vaddr_off(va)) else {
                return Ok(false);
            };
            self.log.read_value(&e, out);
            if !self.opts.open.verify_checksums {
                break (node, e);
            }
            // Nested in the caller's pin: no fence, and no reference count.
            let p = self.log.files.pin();
            match self.log.file_in(e.off, &p) {
                Some(f) => {
                    self.verify(key, &e, out, Some(f))?;
                    break (node, e);
                }
                // GC took the file out of its maps (it stays mapped while
                // this read is pinned): the key moved to a relocated copy
                // or went, and the index says where.
                None if tries < 8 => {
                    tries += 1;
                    match self.index.lookup(key, hash)? {
                        Some(now) if now != va => va = now,
                        Some(_) => return Err(self.verify(key, &e, out, None).unwrap_err()),
                        None => return Ok(false),
                    }
                }
                None => return Err(self.verify(key, &e, out, None).unwrap_err()),
            }
        };
        // A fill holds the key's stripe (see `Raf::writes_may_skip`); while
        // a write of the key holds it, this get offers nothing.
        if sampled {
            if let Some(_k) = self.index.stripes.try_lock(hash) {
                let read = LogRead {
                    key,
                    hash,
                    value: out,
                    vaddr: va,
                    node,
                };
                self.raf
                    .fill(&read, here, || self.index.get_hashed(key, hash) == Some(va));
            }
        }
        Ok(true)
    }

    /// Checks the log entry `e` a read of `key` found, whose value is in
    /// `value`: its checksum (which covers the key: the index confirmed
    /// the entry holds `key`, so the caller's copy stands in for it).
    #[cold]
    #[inline(never)]
    pub(crate) fn verify(
        &self,
        key: &[u8],
        e: &crate::nlog::Entry,
        value: &[u8],
        f: Option<&LogFile>,
    ) -> Result<()> {
        if f.is_some_and(|f| {
            e.klen == key.len() && crate::nlog::entry_checks(&self.pool, f.seq, e, key, value)
        }) {
            return Ok(());
        }
        Err(Error::Corrupt(format!(
            "{}: the entry of a key of {} bytes at pool offset {:#x} fails its checksum; \
             its value is not returned (`pmhash check --repair` salvages the log)",
            f.map_or_else(
                || "no Nlog file".to_string(),
                crate::nlog::LogFile::describe
            ),
            key.len(),
            e.off
        )))
    }

    /// The entry for a write of `key` (`value` None: a delete) whose
    /// newest entry is `old`, and the file holding `old`. The caller holds
    /// the key's stripe.
    pub(crate) fn stage<'a>(
        &self,
        key: &'a [u8],
        hash: u64,
        value: Option<&'a [u8]>,
        old: Option<u64>,
    ) -> Result<(NewEntry<'a>, Option<Arc<LogFile>>)> {
        let cluster = cluster_of(hash, self.log.clusters);
        let (h_addr, h_seq, old_file) = match old {
            Some(v) => {
                let f = self.log.file_at(vaddr_off(v)).ok_or_else(|| {
                    Error::Corrupt(format!("index names {v:#x}, outside every Nlog file"))
                })?;
                (v, f.seq, Some(f))
            }
            None => (NONE, 0, None),
        };
        let op = match (value, old) {
            (None, _) => OP_DEL,
            (Some(_), Some(_)) => OP_UPD,
            (Some(_), None) => OP_INS,
        };
        // D9: one version counter per cluster, drawn under the key's stripe,
        // so a key's versions grow in the order its writes reach the index
        // (F2).
        let version = self
            .log
            .version(cluster as usize)
            .fetch_add(1, Ordering::AcqRel);
        if version > VERSION_MASK {
            return Err(Error::OutOfSpace(
                "cluster version counter exhausted".into(),
            ));
        }
        let e = NewEntry {
            cluster,
            op,
            version,
            key,
            value: value.unwrap_or(&[]),
            h_addr,
            h_seq,
        };
        Ok((e, old_file))
    }

    /// Makes a durable entry (`va` in `file`) the key's newest: accounts
    /// the old entry dead, then updates the index and the cache. The caller
    /// holds the key's stripe.
    pub(crate) fn publish(
        &self,
        c: &KeyChange<'_>,
        old: Option<u64>,
        old_file: Option<&LogFile>,
        file: &LogFile,
        here: u32,
    ) -> Result<()> {
        let KeyChange {
            key,
            hash,
            va,
            value,
        } = *c;
        if let (Some(f), Some(o)) = (old_file, old) {
            self.account_replaced(f, o, None);
        }
        let changed = match value {
            Some(val) => self
                .index
                .set(key, hash, va, val, &mut |h, p| self.append_ovf(h, p))?,
            None => {
                // A del entry is never live data.
                file.dead
                    .fetch_add(entry_len(key.len(), 0), Ordering::Relaxed);
                self.index
                    .remove(key, hash, &mut |h, p| self.append_ovf(h, p))?
            }
        };
        self.after_index(c, here, changed, true);
        Ok(())
    }

    /// Whether no entry of the key older than the entry at `old` (the one
    /// the index names; the caller holds the key's stripe) can still be
    /// valid: its `h_addr` chain ends (`NONE`), leaves for a file that is
    /// gone (F7: its number no longer matches), or passes only invalid
    /// entries on the way there. Then marking `old` invalid deletes the key
    /// as a `del` entry would. Invalid entries are walked through, not
    /// trusted as ends: GC leaves the entries of the file it reclaims
    /// unmarked until the file goes, so an older valid one may lie behind
    /// a marked one for a while (and after a crash in between). A chain
    /// longer than 8 entries, or one that does not parse, says no: the
    /// caller writes a `del` entry.
    pub(crate) fn history_is_dead(&self, old: u64) -> bool {
        let Some(e) = self.log.header(vaddr_off(old)) else {
            return false;
        };
        if e.op == OP_INV || e.op == OP_DEL {
            return false;
        }
        let (mut h, mut hs, mut ver) = (e.h_addr, e.h_seq, e.version);
        for _ in 0..8 {
            if h == NONE || !self.has_file_with_seq(h, hs) {
                return true;
            }
            let Some(p) = self.log.header(vaddr_off(h)) else {
                return false;
            };
            if p.op != OP_INV || p.version >= ver {
                return false;
            }
            (h, hs, ver) = (p.h_addr, p.h_seq, p.version);
        }
        false
    }

    /// The entry at `old`, in `f`, no longer holds its key's newest value:
    /// its bytes count as dead. `known`: its length when the caller knows
    /// it without reading the entry (an inline 8-byte value: a miss saved
    /// per update).
    pub(crate) fn account_replaced(&self, f: &LogFile, old: u64, known: Option<u64>) {
        let len = known.or_else(|| self.log.header(vaddr_off(old)).map(|e| e.len));
        if let Some(len) = len {
            f.dead.fetch_add(len, Ordering::Relaxed);
        }
    }

    /// What follows a write's index change (`changed`: the key set
    /// changed): the RAF cache, when `cache` says it may need the write,
    /// and the key count.
    pub(crate) fn after_index(&self, c: &KeyChange<'_>, here: u32, changed: bool, cache: bool) {
        let KeyChange {
            key,
            hash,
            va,
            value,
        } = *c;
        match value {
            Some(val) => {
                if cache {
                    self.raf.update(key, hash, val, va, here);
                }
                if changed {
                    self.keys.add(1);
                }
            }
            None => {
                if cache {
                    self.raf.remove(key, hash);
                }
                if changed {
                    self.keys.add(-1);
                }
            }
        }
    }

    /// Appends an overflow entry for hash slot `h` (see `pindex`) on this
    /// thread's node; returns its `v_addr`.
    pub(crate) fn append_ovf(&self, h: u64, payload: &[u8]) -> Result<u64> {
        let cluster = cluster_of(h, self.log.clusters);
        let version = self
            .log
            .version(cluster as usize)
            .fetch_add(1, Ordering::AcqRel);
        // persist: the OVF entry is durable (inside append) before the
        // engine slot names it.
        let e = NewEntry {
            cluster,
            op: OP_INS,
            version,
            key: b"",
            value: payload,
            h_addr: h,
            h_seq: crate::pindex::OVF_MARK,
        };
        let (va, _) = self.log.append(self.numa.current(), &e, &self.numa)?;
        Ok(va)
    }

    /// Whether the file of `v_addr` is live and the one numbered `seq` (F7:
    /// a number never comes back, so a freed file is never mistaken for a
    /// new one).
    pub(crate) fn has_file_with_seq(&self, va: u64, seq: u64) -> bool {
        let p = self.log.files.pin();
        self.log
            .file_in(vaddr_off(va), &p)
            .is_some_and(|f| f.seq == seq)
    }
}
