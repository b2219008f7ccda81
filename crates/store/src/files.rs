//! The live log files: each one's DRAM state ([`LogFile`]), and the table
//! of them by pool offset, read without a lock ([`FileTable`]).
//!
//! Every delete, every update and every get that checks a checksum looks
//! up the file of the entry it touches. The table is an immutable snapshot
//! (the files' start offsets, sorted, beside the files) behind one atomic
//! pointer: a lookup, under a pin of the store's epochs (which every such
//! operation holds already), loads the pointer and binary-searches the
//! offsets. It writes nothing, so lookups on two threads share no written
//! line. Why not a lock: a `RwLock<BTreeMap>` returning a cloned `Arc`
//! costs four locked read-modify-writes a lookup, two of them on a word
//! every thread writes; it held 9.6% of a delete's samples at one thread
//! (10M keys grown from 64k, `perf record`), and against it this table
//! makes 10M-key deletes 9% faster at one thread and 34% at two (the peers
//! driver beside Viper, medians of 3: `docs/benchmarks.md`). Why not a crate
//! such as `arc-swap`: its reads pay for their own protection, where the
//! store's pin is already paid for.
//!
//! A change (a file made, the files found at open, a file GC forgets: one
//! per 4 MiB of log or fewer) copies the snapshot under a mutex, publishes
//! the copy and retires the old one. [`collect`](FileTable::collect) frees
//! retired snapshots once `Epochs::synchronize` has waited out every pin
//! taken before they were replaced; the maintenance thread calls it when
//! [`GATHER`] of them wait.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::epoch::{Epochs, Pin};
use crate::layout::X_DATA;

/// One Nlog file, in DRAM.
pub(crate) struct LogFile {
    /// Pool offset of the file (its header line).
    pub off: u64,
    pub node: u32,
    pub cluster: u32,
    pub seq: u64,
    pub slot: u64,
    /// Bytes of the file, header included.
    pub size: u64,
    /// End of the written entries, relative to `off`.
    pub tail: AtomicU64,
    /// Bytes of entries that no longer hold a key's newest value.
    pub dead: AtomicU64,
    /// Flushed-but-maybe-unfenced prefix under `Relaxed` (relative).
    pub synced: AtomicU64,
    /// Full: no more appends.
    pub sealed: AtomicBool,
    /// `tail` and `dead` are known (false after a persistent-index open
    /// until the accounting pass has read the file).
    pub accounted: AtomicBool,
    /// A bad entry was found in it (by GC or the accounting pass): GC
    /// never reclaims it, so nothing after the bad entry is lost; `pmhash
    /// check` reports it and `pmhash check --repair` salvages it.
    pub damaged: AtomicBool,
    /// It was the newest file of its pair when the store was opened after
    /// a crash, unscanned (persistent index): its tail may be torn.
    pub tearable: AtomicBool,
}

impl LogFile {
    /// The DRAM state of a file whose entries are not read yet: its tail
    /// at the first entry, nothing dead, open for appends, accounted.
    pub(crate) fn new(
        off: u64,
        node: u32,
        cluster: u32,
        seq: u64,
        slot: u64,
        size: u64,
    ) -> LogFile {
        LogFile {
            off,
            node,
            cluster,
            seq,
            slot,
            size,
            tail: AtomicU64::new(X_DATA),
            dead: AtomicU64::new(0),
            synced: AtomicU64::new(X_DATA),
            sealed: AtomicBool::new(false),
            accounted: AtomicBool::new(true),
            damaged: AtomicBool::new(false),
            tearable: AtomicBool::new(false),
        }
    }

    /// Names the file for error messages: its sequence number, node,
    /// cluster, extent-table slot and pool offset.
    pub(crate) fn describe(&self) -> String {
        format!(
            "Nlog file {} (node {}, cluster {}, extent-table slot {}, pool offset {:#x})",
            self.seq, self.node, self.cluster, self.slot, self.off
        )
    }

    pub(crate) fn used(&self) -> u64 {
        self.tail.load(Ordering::Acquire) - X_DATA
    }
    pub(crate) fn contains(&self, off: u64) -> bool {
        off >= self.off + X_DATA && off < self.off + self.size
    }
}

/// Replaced snapshots the maintenance thread lets gather before it waits
/// for the pins that may hold them (see [`FileTable::collect`]): about
/// this many old copies of the file list are kept beside the current one
/// (more only while files are made faster than one per maintenance tick).
pub(crate) const GATHER: usize = 32;

/// The files, sorted by start offset.
#[derive(Clone, Default)]
struct Snapshot {
    /// Each file's `off`, in one array: a lookup's binary search reads
    /// these lines rather than one line per file.
    starts: Vec<u64>,
    files: Vec<Arc<LogFile>>,
}

/// A snapshot no longer published, freed by [`FileTable::collect`].
struct Retired(*mut Snapshot);

// SAFETY: a retired snapshot is only dropped, once, by `collect` or the
// table's drop, when no other thread can reach it.
unsafe impl Send for Retired {}

pub(crate) struct FileTable {
    /// The published snapshot; never null.
    cur: AtomicPtr<Snapshot>,
    /// Snapshots replaced since the last [`collect`](Self::collect). Its
    /// mutex also serialises changes.
    retired: Mutex<Vec<Retired>>,
    epochs: Arc<Epochs>,
}

impl FileTable {
    /// An empty table whose lookups are pinned with `epochs`.
    pub(crate) fn new(epochs: Arc<Epochs>) -> FileTable {
        FileTable {
            cur: AtomicPtr::new(Box::into_raw(Box::default())),
            retired: Mutex::new(Vec::new()),
            epochs,
        }
    }

    /// A pin under which [`get`](Self::get)'s answers stay valid (nested in
    /// the caller's pin of the same epochs, it costs no fence).
    #[inline]
    pub(crate) fn pin(&self) -> Pin<'_> {
        self.epochs.pin()
    }

    #[inline]
    fn snapshot<'p>(&self, p: &'p Pin<'_>) -> &'p Snapshot {
        debug_assert!(p.belongs_to(&self.epochs), "a pin of other epochs");
        let s = self.cur.load(Ordering::Acquire);
        // SAFETY: `cur` is never null, and a snapshot it stops naming is
        // freed only by `collect`, after `Epochs::synchronize` has waited out
        // every pin taken before the replacement was published; a pin taken
        // later loads the replacement. `p` is held for `'p`.
        unsafe { &*s }
    }

    /// The live file holding pool offset `off`, valid while `p` is held.
    #[inline]
    pub(crate) fn get<'p>(&self, off: u64, p: &'p Pin<'_>) -> Option<&'p Arc<LogFile>> {
        let s = self.snapshot(p);
        let i = s.starts.partition_point(|&start| start <= off);
        let f = s.files.get(i.checked_sub(1)?)?;
        f.contains(off).then_some(f)
    }

    /// Every live file, in offset order.
    pub(crate) fn all(&self) -> Vec<Arc<LogFile>> {
        let p = self.pin();
        self.snapshot(&p).files.clone()
    }

    /// Publishes a copy of the snapshot changed by `edit`.
    fn change(&self, edit: impl FnOnce(&mut Snapshot)) {
        let mut retired = self.retired.lock().expect("file table lock");
        let old = self.cur.load(Ordering::Acquire);
        // SAFETY: changes are serialised by `retired`'s lock, and only a
        // change or the table's drop replaces or frees `cur`.
        let mut next = unsafe { &*old }.clone();
        edit(&mut next);
        next.files.sort_unstable_by_key(|f| f.off);
        debug_assert!(
            next.files.windows(2).all(|w| w[0].off < w[1].off),
            "two files at one offset"
        );
        next.starts = next.files.iter().map(|f| f.off).collect();
        self.cur
            .store(Box::into_raw(Box::new(next)), Ordering::Release);
        retired.push(Retired(old));
    }

    /// Adds files (each starting at an offset no live file holds).
    pub(crate) fn insert(&self, files: impl IntoIterator<Item = Arc<LogFile>>) {
        self.change(|s| s.files.extend(files));
    }

    /// Removes the file that starts at `off`, if there is one.
    pub(crate) fn remove(&self, off: u64) {
        self.change(|s| s.files.retain(|f| f.off != off));
    }

    /// Frees the snapshots replaced since the last call, once no pin can
    /// still reach them, if there are at least `min` (else it does
    /// nothing). Waits for every pinned operation: never call it while
    /// holding a pin. Returns how many it freed.
    ///
    /// The wait is why the maintenance thread lets [`GATHER`] snapshots
    /// gather first: one wait per 32 new files instead of one per file (a
    /// 10M-key load of 8-byte keys makes about 150).
    pub(crate) fn collect(&self, min: usize) -> usize {
        let list = {
            let mut retired = self.retired.lock().expect("file table lock");
            if retired.is_empty() || retired.len() < min {
                return 0;
            }
            std::mem::take(&mut *retired)
        };
        self.epochs.synchronize();
        let n = list.len();
        for r in list {
            // SAFETY: `r` was replaced before `synchronize` began, so no pin
            // can reach it any more, and it is freed only here.
            drop(unsafe { Box::from_raw(r.0) });
        }
        n
    }
}

impl Drop for FileTable {
    fn drop(&mut self) {
        let retired = std::mem::take(self.retired.get_mut().expect("file table lock"));
        for r in retired
            .into_iter()
            .map(|r| r.0)
            .chain([*self.cur.get_mut()])
        {
            // SAFETY: `&mut self`: no lookup is running, and each snapshot
            // is freed once, here.
            drop(unsafe { Box::from_raw(r) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(off: u64, size: u64) -> Arc<LogFile> {
        Arc::new(LogFile::new(off, 0, 0, off, 0, size))
    }

    #[test]
    fn a_lookup_finds_the_file_that_holds_the_offset() {
        let t = FileTable::new(Arc::default());
        t.insert([file(1 << 20, 1 << 16), file(1 << 12, 1 << 12)]);
        t.insert([file(1 << 16, 1 << 12)]);
        let p = t.pin();
        let x = X_DATA;
        assert_eq!(t.get((1 << 12) + x, &p).map(|f| f.off), Some(1 << 12));
        assert_eq!(t.get((1 << 12) - 1, &p).map(|f| f.off), None);
        // Inside a file's header line: no entry is there.
        assert_eq!(t.get(1 << 12, &p).map(|f| f.off), None);
        assert_eq!(t.get((1 << 16) + x, &p).map(|f| f.off), Some(1 << 16));
        // Past the end of the file at 64 KiB and before the next one.
        assert_eq!(t.get((1 << 16) + (1 << 12), &p).map(|f| f.off), None);
        assert_eq!(
            t.get((1 << 20) + (1 << 16) - 1, &p).map(|f| f.off),
            Some(1 << 20)
        );
        assert_eq!(t.get(1 << 30, &p).map(|f| f.off), None);
        let offs: Vec<u64> = t.all().iter().map(|f| f.off).collect();
        assert_eq!(offs, [1 << 12, 1 << 16, 1 << 20]);
        drop(p);
        t.remove(1 << 16);
        t.remove(1 << 16);
        let p = t.pin();
        assert_eq!(t.get((1 << 16) + x, &p).map(|f| f.off), None);
        assert_eq!(t.get((1 << 12) + x, &p).map(|f| f.off), Some(1 << 12));
    }

    #[test]
    fn a_replaced_snapshot_lives_until_its_readers_unpin() {
        let t = Arc::new(FileTable::new(Arc::default()));
        let f = file(1 << 12, 1 << 16);
        t.insert([f.clone()]);
        assert_eq!(t.collect(2), 0, "one snapshot waits: fewer than asked for");
        assert_eq!(t.collect(1), 1, "the empty first snapshot");
        let (pinned, go) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let reader = {
            let (t, pinned, go) = (t.clone(), pinned.clone(), go.clone());
            std::thread::spawn(move || {
                let p = t.pin();
                let got = t.get((1 << 12) + 64, &p).expect("the file");
                pinned.store(true, Ordering::SeqCst);
                while !go.load(Ordering::SeqCst) {
                    std::hint::spin_loop();
                }
                // The answer is still readable (its snapshot is alive);
                // a new lookup sees the file gone.
                assert_eq!(got.off, 1 << 12);
                assert!(t.get((1 << 12) + 64, &p).is_none());
            })
        };
        while !pinned.load(Ordering::SeqCst) {
            std::hint::spin_loop();
        }
        t.remove(1 << 12);
        // The old snapshot (and its reference to the file) is kept while
        // the reader is pinned: collect waits for it.
        let collector = {
            let t = t.clone();
            std::thread::spawn(move || t.collect(1))
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(
            !collector.is_finished(),
            "collect must wait for the pinned reader"
        );
        assert_eq!(Arc::strong_count(&f), 2, "ours and the old snapshot's");
        go.store(true, Ordering::SeqCst);
        reader.join().expect("reader");
        assert_eq!(collector.join().expect("collector"), 1);
        assert_eq!(Arc::strong_count(&f), 1, "the old snapshot freed");
        let p = t.pin();
        assert!(t.get((1 << 12) + 64, &p).is_none());
    }
}
