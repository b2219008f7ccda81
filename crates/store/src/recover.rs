//! Open: validate, then load the clean-shutdown image or scan the log.
//!
//! **Validation first.** The root, every extent-table slot and every file
//! header are checked before anything is written; a foreign or corrupt pool
//! is an `Err` and stays untouched.
//!
//! **Clean open.** When the pool was closed cleanly and holds an image, the
//! index, the per-cluster version counters (F8) and every file's tail and
//! dead bytes come from it. The image is then freed durably before the
//! store serves a write (F9): a later crash cannot load a stale image.
//!
//! **Crash open (log scan).** Clusters are split over threads (one thread
//! per group of clusters; the thread count is free and need not match the
//! run that wrote the log). Each thread reads every file of its clusters,
//! on every node, from the start to the first zero word or bad checksum
//! (a torn tail, F1/F10), and keeps, per key, the valid entry of highest
//! version (I5); a `del` winner means absent. Versions restart above the
//! highest seen, invalid entries included (F8). Garbage past the torn tail
//! of an active file is zeroed (so a later, shorter entry can never make it
//! parse), which is the only write of a crash open, and it is idempotent.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use engine::{Error, Result};
use pmem::{Link, Pool};

use crate::index::{IKey, Index};
use crate::inner::{new_inner, Inner};
use crate::layout::*;
use crate::nlog::{End, LogFile, LogRoot};
use crate::options::Options;
use crate::pindex::PIndex;
use crate::stats::OpenedFrom;
use engine::{EngineConfig, EngineKind};

/// "2": records may carry an inline value (an image of format 1 fails this
/// check, and the open scans the log instead).
const IMAGE_MAGIC: u64 = u64::from_le_bytes(*b"PMHSIMG2");
/// Set in an image record's length word when an 8-byte value follows.
const VALUE_FOLLOWS: u64 = 1 << 63;

fn corrupt(m: String) -> Error {
    Error::Corrupt(m)
}

struct RootInfo {
    nodes: u32,
    clusters: u32,
    extent: u64,
    table_len: u64,
    next_seq: u64,
    index: u64,
    engine: [u64; 2],
}

impl RootInfo {
    /// What the log works from, of the root block at `root`.
    fn log_root(&self, root: u64) -> LogRoot {
        LogRoot {
            root,
            nodes: self.nodes,
            clusters: self.clusters,
            extent_size: self.extent,
            table_len: self.table_len,
            next_seq: self.next_seq,
        }
    }
}

fn read_root(pool: &Pool, root: u64) -> Result<RootInfo> {
    let size = pool.block_size(root)?;
    if size < R_TABLE {
        return Err(corrupt(format!("root block of {size} bytes is too small")));
    }
    let w = root_check_words(pool, root);
    if w[0] != ROOT_MAGIC {
        return Err(corrupt("root block is not a store root (bad magic)".into()));
    }
    if w[1] != FORMAT {
        return Err(corrupt(format!(
            "store format {} is not supported: this version reads format {FORMAT} only \
             (format 2 entries carry no durable mark, so a torn tail cannot be told \
             from corruption; format 1 laid entries out differently); open it with \
             the pmhash that wrote it",
            w[1]
        )));
    }
    if pool.load_u64(root + R_CHECK) != words_crc(&w) as u64 {
        return Err(corrupt("store root checksum mismatch".into()));
    }
    let (nodes, clusters, extent, table_len) = (w[2], w[3], w[4], w[5]);
    if w[6] > 2 {
        return Err(corrupt(format!("unknown index kind {}", w[6])));
    }
    if nodes == 0 || nodes > MAX_NODES || clusters == 0 || clusters > MAX_CLUSTERS {
        return Err(corrupt(format!(
            "bad node/cluster counts {nodes}/{clusters}"
        )));
    }
    if extent < MIN_EXTENT || !extent.is_multiple_of(64) || root_len(table_len) > size {
        return Err(corrupt(format!(
            "bad extent size {extent} or table length {table_len}"
        )));
    }
    let next_seq = pool.load_u64(root + R_NEXT_SEQ);
    if next_seq == 0 {
        return Err(corrupt("next sequence number is 0".into()));
    }
    Ok(RootInfo {
        nodes: nodes as u32,
        clusters: clusters as u32,
        extent,
        table_len,
        next_seq,
        index: w[6],
        engine: [w[7], w[8]],
    })
}

fn engine_name(w: [u64; 2]) -> String {
    let mut b = Vec::with_capacity(16);
    b.extend_from_slice(&w[0].to_le_bytes());
    b.extend_from_slice(&w[1].to_le_bytes());
    String::from_utf8_lossy(&b)
        .trim_end_matches('\0')
        .to_string()
}

/// Opens (or, after a crash inside create, creates) the persistent hash
/// engine of index options (b) and (c), after checking that the options
/// name the index the store was created with.
fn open_engine(pool: &Arc<Pool>, ri: &RootInfo, opts: &Options) -> Result<Option<PIndex>> {
    let made = match ri.index {
        0 => "dram".to_string(),
        1 => format!("hash:{}", engine_name(ri.engine)),
        _ => format!("both:{}", engine_name(ri.engine)),
    };
    let asked = opts.create.index.describe();
    if made != asked {
        return Err(Error::InvalidArgument(format!(
            "the store was created with index {made}; it was opened with {asked}"
        )));
    }
    let Some(spec) = opts.create.index.spec() else {
        return Ok(None);
    };
    let EngineKind::Persistent { create, open, .. } = spec.kind else {
        return Err(Error::InvalidArgument(format!(
            "{} is not a persistent engine",
            spec.name
        )));
    };
    let cfg = EngineConfig {
        durability: opts.open.durability,
        initial_capacity: opts.open.expected_keys.max(16),
        threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
    };
    let e = if pool.root() == 0 {
        if pool.is_read_only() {
            return Err(corrupt("the store's hash index was never created".into()));
        }
        create(pool.clone(), &cfg)?
    } else {
        open(pool.clone(), &cfg)?
    };
    Ok(Some(PIndex::new(e, pool.clone())))
}

/// Reads and checks every file of the extent table.
fn read_files(pool: &Pool, root: u64, ri: &RootInfo) -> Result<(Vec<Arc<LogFile>>, Vec<u64>)> {
    let mut files = Vec::new();
    let mut free = Vec::new();
    let mut seqs = std::collections::HashSet::new();
    for slot in (0..ri.table_len).rev() {
        let off = pool.load_u64(root + R_TABLE + 8 * slot);
        if off == 0 {
            free.push(slot);
            continue;
        }
        let bad = |m: &str| corrupt(format!("Nlog file in slot {slot} at {off:#x}: {m}"));
        let size = pool
            .block_size(off)
            .map_err(|_| bad("not an allocated block"))?;
        if size < ri.extent {
            return Err(bad("block smaller than a file"));
        }
        let head: Vec<u64> = (0..4).map(|i| pool.load_u64(off + 8 * i)).collect();
        if head[0] != EXT_MAGIC || pool.load_u64(off + X_CHECK) != words_crc(&head) as u64 {
            return Err(bad("bad header"));
        }
        let (node, cluster) = (head[1] as u32, (head[1] >> 32) as u32);
        if node >= ri.nodes || cluster >= ri.clusters || head[3] != slot {
            return Err(bad("header names another place"));
        }
        if head[2] == 0 || head[2] >= ri.next_seq || !seqs.insert(head[2]) {
            return Err(bad("bad or repeated sequence number"));
        }
        let f = LogFile::new(off, node, cluster, head[2], slot, ri.extent);
        // Recovery decides which file of each pair takes appends.
        f.sealed.store(true, Ordering::Relaxed);
        files.push(Arc::new(f));
    }
    Ok((files, free))
}

/// `(offset, size)` of every file, as [`PIndex::check_slots`] takes them.
fn file_ranges(files: &[Arc<LogFile>]) -> Vec<(u64, u64)> {
    files.iter().map(|f| (f.off, f.size)).collect()
}

/// Checks a read-only pool the way a writable open would, without building
/// anything: the root, every file header, (options b and c) the hash
/// engine's own open and the form of every index slot, and for a clean
/// store with an image the image's records against the log. `Ok(true)`
/// when that is every check the open makes; `Ok(false)` when the open will
/// scan the log, which only a whole (read-only) open checks.
pub(crate) fn validate(pool: Arc<Pool>, opts: &Options) -> Result<bool> {
    let root = pool.aux_root();
    if root == 0 {
        crate::pindex::check_unformatted(&pool)?;
        return Ok(true);
    }
    let ri = read_root(&pool, root)?;
    let (files, _) = read_files(&pool, root, &ri)?;
    let pidx = open_engine(&pool, &ri, opts)?;
    let persistent = pidx.is_some();
    if let Some(p) = &pidx {
        // The writable open that follows skips this walk (it runs under
        // the same lock).
        p.check_slots(&file_ranges(&files))?;
        if pool.was_clean() {
            // A clean open of a persistent index is the engine's open: no
            // log scan.
            return Ok(true);
        }
    }
    let image = pool.load_u64(root + R_IMAGE);
    if !persistent && pool.was_clean() && image != 0 {
        // The clean open will load the image: its records must agree with
        // the log (the same check the load makes, without building the
        // index).
        let len = pool.load_u64(root + R_IMAGE_LEN);
        if let Some(img) = parse_image(
            &pool,
            ri.clusters as usize,
            ri.table_len as usize,
            &files,
            image,
            len,
        ) {
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
            check_image(&pool, &files, &img, threads)?;
            return Ok(true);
        }
    }
    // Any other open scans the log (or opens the index engine), which
    // only a whole open checks.
    Ok(false)
}

/// Builds the store's DRAM state for the pool's root. Returns the state,
/// how it was found and how many log entries were scanned. `image_checked`:
/// [`validate`] has just checked the image's records against the log (or
/// the hash index's slots), under the pool's lock, so the open need not
/// again.
pub(crate) fn open(
    pool: Arc<Pool>,
    root: u64,
    opts: Options,
    fresh: bool,
    image_checked: bool,
) -> Result<(Inner, OpenedFrom, u64)> {
    let ri = read_root(&pool, root)?;
    let (files, free) = read_files(&pool, root, &ri)?;
    let image = pool.load_u64(root + R_IMAGE);
    let image_len = pool.load_u64(root + R_IMAGE_LEN);
    let pidx = open_engine(&pool, &ri, &opts)?;
    let persistent = pidx.is_some();
    let epochs = Arc::new(crate::epoch::Epochs::default());
    let keys = crate::index::Keys::Log {
        pool: pool.clone(),
        epochs: epochs.clone(),
    };
    let index = Index::new(
        pidx,
        keys,
        opts.create.index.ordered(),
        matches!(opts.create.index, crate::options::IndexKind::Both(_)),
        // Pre-sized for at most 2^26 keys (about 1.3 GiB); past that the
        // shards grow as keys arrive, so a large `expected_keys` cannot
        // make open allocate more DRAM than the machine has. A clean
        // image's key count counts too: grown while the image loads, the
        // shards' replaced tables would all wait for the maintenance
        // thread, which starts after the open (twice the index's DRAM).
        opts.open
            .expected_keys
            .max(image_keys(&pool, image, image_len))
            .min(1 << 26) as usize,
        opts.open.inline_values,
    );
    let s = new_inner(pool.clone(), &ri.log_root(root), opts, index, epochs);
    if fresh {
        s.log.install(files, free);
        return Ok((s, OpenedFrom::Created, 0));
    }
    if persistent {
        return open_persistent(s, files, free, ri.clusters, image_checked);
    }
    let mut from = OpenedFrom::LogScan;
    let mut entries = 0;
    let loaded = if image != 0 && pool.was_clean() {
        load_image(&s, &files, image, image_len, image_checked)?
    } else {
        false
    };
    let torn: Vec<AtomicBool> = files.iter().map(|_| AtomicBool::new(false)).collect();
    if loaded {
        from = OpenedFrom::Image;
    } else {
        // Refuses the open, before anything is written, on corruption.
        entries = scan_log(&s, &files, &torn)?;
    }
    // The newest file of each (node, cluster) is its active file.
    for i in newest_files(&files) {
        let f = &files[i];
        f.sealed.store(false, Ordering::Release);
        let t = f.tail.load(Ordering::Acquire);
        if !pool.is_read_only() && torn[i].load(Ordering::Relaxed) {
            // persist: the torn tail (entries in flight at the crash, none
            // acknowledged) is zeroed before any new entry can be appended
            // there, so no part of it can make a later entry look valid or
            // be taken for corruption once the file is sealed.
            pool.zero(f.off + t, (f.size - t) as usize);
            pool.persist(f.off + t, (f.size - t) as usize);
        }
        f.synced.store(t, Ordering::Release);
        s.log.set_active(f.clone());
    }
    for f in &files {
        if !f.sealed.load(Ordering::Acquire) {
            continue;
        }
        f.synced
            .store(f.tail.load(Ordering::Acquire), Ordering::Release);
    }
    s.log.install(files, free);
    if image != 0 && !pool.is_read_only() {
        // persist: the image is unlinked durably before the first write,
        // so a crash from here on scans the log (F9).
        unlink_image(&pool, root, image)?;
    }
    s.keys.set(s.index.len() as i64);
    Ok((s, from, entries))
}

/// Open with a persistent point index: nothing to rebuild but the check of
/// the index's slots ([`PIndex::check_slots`]; `slots_checked`:
/// [`validate`] ran it under the pool's lock). Every file is
/// sealed (its tail is learned by the background accounting pass, which
/// GC waits for), and version counters start at a fresh reserved range.
fn open_persistent(
    s: Inner,
    files: Vec<Arc<LogFile>>,
    free: Vec<u64>,
    clusters: u32,
    slots_checked: bool,
) -> Result<(Inner, OpenedFrom, u64)> {
    let pool = &s.pool;
    let root = s.log.root;
    // A clean pool opened after a read-only open of it passed, under the
    // same lock (`Pool::prechecked`), has had this walk over the same
    // bytes (after a crash the writable open's index may differ: merged
    // backups).
    let slots_checked = slots_checked || (pool.was_clean() && pool.prechecked());
    if !slots_checked {
        if let crate::index::Point::Engine(p) = s.index.point() {
            // Before anything is written: a refused pool stays untouched.
            p.check_slots(&file_ranges(&files))?;
        }
    }
    let base = pool.load_u64(root + R_VBASE).max(1);
    if base > VERSION_MASK - VBASE_STEP {
        return Err(corrupt("version base exhausted".into()));
    }
    if !pool.is_read_only() {
        // persist: the next open's base before this run draws a version
        // from [base, base + STEP) (F8 without a log scan).
        pool.store_u64(root + R_VBASE, base + VBASE_STEP);
        pool.persist(root + R_VBASE, 8);
    }
    for c in 0..clusters as usize {
        s.log.version(c).store(base, Ordering::Relaxed);
    }
    for i in newest_files(&files) {
        files[i].tearable.store(true, Ordering::Release);
    }
    for f in &files {
        f.accounted.store(false, Ordering::Release);
        f.tail.store(f.size, Ordering::Release);
    }
    s.log.install(files, free);
    let keys = match s.index.point() {
        crate::index::Point::Engine(p) => p.engine.len(),
        crate::index::Point::Dram(..) => 0,
    };
    s.keys.set(keys as i64);
    Ok((s, OpenedFrom::HashIndex, 0))
}

/// The background accounting pass after a persistent-index open: finds
/// each file's tail and live bytes (an entry is live if the index names
/// it), so GC can pick files. Returns whether work remains.
pub(crate) fn account_one(s: &Inner) -> bool {
    let Some(f) = s
        .log
        .snapshot()
        .into_iter()
        .find(|f| !f.accounted.load(Ordering::Acquire))
    else {
        return false;
    };
    let (mut kbuf, mut vbuf) = (Vec::new(), Vec::new());
    let mut pos = X_DATA;
    let mut live = 0;
    let _p = s.epochs.pin();
    while let Some(e) = s.log.parse(&f, pos, &mut kbuf, &mut vbuf) {
        pos += e.len;
        if e.op == OP_INV || e.op == OP_DEL {
            continue;
        }
        let va = vaddr(f.node, e.off);
        let is_live = if e.h_seq == crate::pindex::OVF_MARK {
            matches!(s.index.point(), crate::index::Point::Engine(p) if p.names_ovf(e.h_addr, va))
        } else {
            s.index.get(&kbuf) == Some(va)
        };
        if is_live {
            live += e.len;
        }
    }
    // Only the files that were the newest of their pairs at open may have
    // a torn tail; anything else past the last entry is corruption, and
    // the file is kept whole (never reclaimed) rather than cut there.
    let newest = f.tearable.load(Ordering::Acquire);
    if matches!(s.log.classify_end(&f, pos, newest), End::Corrupt { .. }) {
        f.damaged.store(true, Ordering::Release);
    }
    f.tail.store(pos, Ordering::Release);
    f.synced.store(pos, Ordering::Release);
    f.dead.store(pos - X_DATA - live, Ordering::Relaxed);
    f.accounted.store(true, Ordering::Release);
    true
}

fn threads(s: &Inner) -> usize {
    let n = if s.opts.open.recovery_threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        s.opts.open.recovery_threads
    };
    n.clamp(1, s.log.clusters as usize)
}

/// Per-key winner of a cluster scan.
struct Win {
    version: u64,
    va: u64,
    op: u64,
    len: u64,
    file: usize,
    /// The value, when it is 8 bytes (the point index may keep it inline).
    val8: Option<[u8; 8]>,
}

/// The crash open: rebuilds index, versions, tails and dead bytes.
fn scan_log(s: &Inner, files: &[Arc<LogFile>], torn: &[AtomicBool]) -> Result<u64> {
    let clusters = s.log.clusters as usize;
    let mut by_cluster: Vec<Vec<usize>> = vec![Vec::new(); clusters];
    for (i, f) in files.iter().enumerate() {
        by_cluster[f.cluster as usize].push(i);
    }
    let newest = newest_files(files);
    let n = threads(s);
    let next = AtomicU64::new(0);
    let total = AtomicU64::new(0);
    let failed: std::sync::Mutex<Option<Error>> = std::sync::Mutex::new(None);
    std::thread::scope(|sc| {
        for _ in 0..n {
            sc.spawn(|| {
                let (mut kbuf, mut vbuf) = (Vec::new(), Vec::new());
                loop {
                    let c = next.fetch_add(1, Ordering::Relaxed) as usize;
                    if c >= clusters {
                        return;
                    }
                    // Keys up to 23 bytes stay inline: no allocation per entry.
                    let mut win: HashMap<IKey, Win, KeyHasher> =
                        HashMap::with_hasher(KeyHasher(c as u64 ^ 0x5bd1_e995));
                    let mut max_version = 0;
                    let mut written = vec![0u64; by_cluster[c].len()];
                    let mut count = 0;
                    for (fi, &i) in by_cluster[c].iter().enumerate() {
                        let f = &files[i];
                        let mut pos = X_DATA;
                        while let Some(e) = s.log.parse(f, pos, &mut kbuf, &mut vbuf) {
                            pos += e.len;
                            count += 1;
                            max_version = max_version.max(e.version);
                            if e.op == OP_INV {
                                continue;
                            }
                            let w = Win {
                                version: e.version,
                                va: vaddr(f.node, e.off),
                                op: e.op,
                                len: e.len,
                                file: fi,
                                val8: vbuf.as_slice().try_into().ok(),
                            };
                            match win.get_mut(kbuf.as_slice()) {
                                Some(old) if old.version >= e.version => {}
                                Some(old) => *old = w,
                                None => {
                                    win.insert(IKey::new(&kbuf), w);
                                }
                            }
                        }
                        match s.log.classify_end(f, pos, newest.contains(&i)) {
                            End::Clean => {}
                            End::Torn { .. } => torn[i].store(true, Ordering::Relaxed),
                            end @ End::Corrupt { .. } => {
                                let mut g = failed.lock().expect("scan error lock");
                                g.get_or_insert_with(|| corruption(f, end));
                                return;
                            }
                        }
                        f.tail.store(pos, Ordering::Release);
                        written[fi] = pos - X_DATA;
                    }
                    let mut live = vec![0u64; by_cluster[c].len()];
                    for (k, w) in &win {
                        if w.op != OP_DEL {
                            live[w.file] += w.len;
                            s.index
                                .load(k.as_bytes(), w.va, w.val8.as_ref().map(|v| &v[..]));
                        }
                    }
                    for (fi, &i) in by_cluster[c].iter().enumerate() {
                        files[i]
                            .dead
                            .store(written[fi] - live[fi], Ordering::Relaxed);
                    }
                    s.log.version(c).store(max_version + 1, Ordering::Relaxed);
                    total.fetch_add(count, Ordering::Relaxed);
                }
            });
        }
    });
    if let Some(e) = failed.into_inner().expect("scan error lock") {
        return Err(e);
    }
    Ok(total.load(Ordering::Relaxed))
}

/// Indexes (into `files`) of the newest file of each (node, cluster):
/// the only ones that may hold entries in flight at a crash.
pub(crate) fn newest_files(files: &[Arc<LogFile>]) -> std::collections::HashSet<usize> {
    let mut newest: HashMap<(u32, u32), usize> = HashMap::new();
    for (i, f) in files.iter().enumerate() {
        let e = newest.entry((f.node, f.cluster)).or_insert(i);
        if f.seq > files[*e].seq {
            *e = i;
        }
    }
    newest.into_values().collect()
}

/// The error that refuses an open on corruption found by the log scan.
fn corruption(f: &LogFile, end: End) -> Error {
    let End::Corrupt { at, proof } = end else {
        unreachable!("corruption() of a torn or clean end");
    };
    let why = match proof {
        Some(p) => format!(
            "the valid entry at pool offset {:#x} was written after it was durable",
            f.off + p
        ),
        None => "the file is sealed, so no crash left an entry of it in flight".into(),
    };
    corrupt(format!(
        "{}: the entry at pool offset {:#x} (byte {at} of the file) is corrupt, \
         not a torn tail: {why}. Nothing was changed; `pmhash check --repair` \
         drops the bad bytes and reports what they held",
        f.describe(),
        f.off + at
    ))
}

/// Image layout (one allocator block, linked from root.image):
///
/// ```text
/// 0   magic "PMHSIMG1"
/// 8   len        bytes of the image
/// 16  crc32 of bytes 24..len
/// 24  keys
/// 32  clusters
/// 40  table_len
/// 48  versions[clusters]        next version of each cluster
///     (tail, dead)[table_len]   per extent-table slot
///     records: klen | VALUE_FOLLOWS, key (padded to 8), v_addr,
///              value (8 bytes, only when VALUE_FOLLOWS)
/// ```
///
/// The value of an 8-byte key with an 8-byte value is recorded, so that a
/// clean open fills the point index's inline values without reading the
/// log.
/// The key count a clean-shutdown image at `off` (`len` bytes) claims, as
/// a size hint only (0 when there is no image; never more than its length
/// allows: a record takes at least 16 bytes). The image is checked in
/// full before it is used.
fn image_keys(pool: &Pool, off: u64, len: u64) -> u64 {
    if off == 0 || !pool.was_clean() || pool.block_size(off).map_or(true, |b| b < len.max(48)) {
        return 0;
    }
    if pool.load_u64(off) != IMAGE_MAGIC {
        return 0;
    }
    pool.load_u64(off + 24).min(len / 16)
}

/// Bytes of image records gathered per buffer (see [`write_image`]).
const IMAGE_CHUNK: usize = 4 << 20;

/// Writes the clean-shutdown image and links it from the root.
///
/// The records go straight into the pool block when a bound on their size
/// is known before the walk: every record (`16 + key` rounded to 8, `+ 8`
/// for an inline value) is no longer than the log entry it describes
/// (`40 + key + value`, whole lines), so the log's live bytes bound them.
/// The block is reserved at that bound and only the image's own length is
/// written (untouched pages of the rest take no memory). Gathering the
/// records in DRAM first held them twice at the close's peak (305 MiB
/// more at 10M 8-byte keys and values). If the bound cannot be reserved,
/// or the walk outgrows it (dead-byte accounting off after a repair, say),
/// the records are gathered in DRAM chunks and written after.
///
/// `release`: the close owns the store and frees the DRAM point index shard
/// by shard as its records are written ([`Index::drain_each`]); the walk
/// then cannot be repeated, so an image that outgrows its block is given
/// up (the next open scans the log) instead of gathered again.
///
/// [`Index::drain_each`]: crate::index::Index::drain_each
pub(crate) fn write_image(s: &Inner, release: bool) -> Result<()> {
    let pool = &s.pool;
    let head = image_head(s);
    let live: u64 = s
        .log
        .snapshot()
        .iter()
        .map(|f| f.used().saturating_sub(f.dead.load(Ordering::Relaxed)))
        .sum();
    let bound = (head.len() as u64).saturating_add(live).next_multiple_of(8);
    match pool.reserve(
        bound,
        Link::Pointer {
            owner: s.log.root + R_IMAGE,
        },
    ) {
        Ok(r) => {
            let off = r.offset();
            let mut at = off + head.len() as u64;
            let end = off + bound;
            let mut crc = crc32fast::Hasher::new();
            let mut fits = true;
            let mut stage: Vec<u8> = Vec::with_capacity(IMAGE_STAGE);
            let mut drain = |st: &mut Vec<u8>, at: &mut u64, fits: &mut bool| {
                if *at + st.len() as u64 > end {
                    *fits = false;
                } else {
                    pool.write(*at, st);
                    crc.update(st);
                    *at += st.len() as u64;
                }
                st.clear();
            };
            let keys = image_records(s, release, |rec| {
                if !fits {
                    return;
                }
                stage.extend_from_slice(rec);
                if stage.len() >= IMAGE_STAGE {
                    drain(&mut stage, &mut at, &mut fits);
                }
            });
            drain(&mut stage, &mut at, &mut fits);
            if fits {
                let len = at - off;
                link_image(s, r, head, keys, len, crc)
            } else if release {
                // Nothing links the block: returned as it is. The index is
                // gone: no image, and the next open scans the log.
                pool.cancel(r);
                Ok(())
            } else {
                // Nothing links the block: returned as it is.
                pool.cancel(r);
                write_image_gathered(s, head, release)
            }
        }
        Err(pmem::Error::OutOfSpace(_)) => write_image_gathered(s, head, release),
        Err(e) => Err(e.into()),
    }
}

/// Bytes of records staged in DRAM between writes into the image block.
const IMAGE_STAGE: usize = 1 << 20;

/// The image's head: magic, length, crc, key count, cluster count and
/// table length (the length, crc and count filled by [`link_image`]), the
/// per-cluster version counters and each table slot's (tail, dead bytes).
fn image_head(s: &Inner) -> Vec<u8> {
    let clusters = s.log.clusters as usize;
    let tl = s.log.table_len as usize;
    let mut buf: Vec<u8> = Vec::with_capacity(48 + 8 * clusters + 16 * tl);
    let put = |b: &mut Vec<u8>, w: u64| b.extend_from_slice(&w.to_le_bytes());
    buf.resize(48, 0);
    for v in s.log.versions() {
        put(&mut buf, v.load(Ordering::Acquire));
    }
    let mut slots = vec![(0u64, 0u64); tl];
    for f in s.log.snapshot() {
        slots[f.slot as usize] = (
            f.tail.load(Ordering::Acquire),
            f.dead.load(Ordering::Relaxed),
        );
    }
    for (t, d) in slots {
        put(&mut buf, t);
        put(&mut buf, d);
    }
    buf
}

/// Walks the index and hands each key's record to `out`; returns the
/// number of records (`release`: see [`write_image`]).
fn image_records(s: &Inner, release: bool, mut out: impl FnMut(&[u8])) -> u64 {
    let mut keys = 0u64;
    let inlines = s.index.inlines();
    let mut vbuf = Vec::new();
    let mut rec: Vec<u8> = Vec::new();
    let put = |b: &mut Vec<u8>, w: u64| b.extend_from_slice(&w.to_le_bytes());
    let record = |k: &[u8], va: u64| {
        // The key was just read from this entry: its header is in cache.
        let val = (inlines && k.len() == 8)
            .then(|| s.log.header(vaddr_off(va)))
            .flatten()
            .filter(|e| e.vlen == 8)
            .map(|e| {
                s.log.read_value(&e, &mut vbuf);
                u64::from_le_bytes(vbuf[..8].try_into().expect("8 bytes"))
            });
        rec.clear();
        put(
            &mut rec,
            k.len() as u64 | if val.is_some() { VALUE_FOLLOWS } else { 0 },
        );
        rec.extend_from_slice(k);
        rec.resize(rec.len().next_multiple_of(8), 0);
        put(&mut rec, va);
        if let Some(v) = val {
            put(&mut rec, v);
        }
        out(&rec);
        keys += 1;
    };
    if release {
        s.index.drain_each(record);
    } else {
        s.index.for_each(record);
    }
    keys
}

/// Fills the head's length, key count and crc (of the head from byte 24
/// on, then `records`, the crc of the records already written after it),
/// writes the head at the block's start and links the image.
fn link_image(
    s: &Inner,
    r: pmem::Reservation,
    mut head: Vec<u8>,
    keys: u64,
    len: u64,
    records: crc32fast::Hasher,
) -> Result<()> {
    let pool = &s.pool;
    let root = s.log.root;
    let clusters = s.log.clusters as u64;
    let tl = s.log.table_len;
    head[0..8].copy_from_slice(&IMAGE_MAGIC.to_le_bytes());
    head[8..16].copy_from_slice(&len.to_le_bytes());
    head[24..32].copy_from_slice(&keys.to_le_bytes());
    head[32..40].copy_from_slice(&clusters.to_le_bytes());
    head[40..48].copy_from_slice(&tl.to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&head[24..]);
    crc.combine(&records);
    head[16..24].copy_from_slice(&(crc.finalize() as u64).to_le_bytes());
    let off = r.offset();
    pool.write(off, &head);
    // persist: the image (records and head) before the root links it; the
    // link (with its length, same line) before commit.
    pool.persist(off, len as usize);
    pool.store_u64(root + R_IMAGE_LEN, len);
    pool.store_u64(root + R_IMAGE, off);
    pool.persist(root + R_IMAGE, 16);
    pool.commit(r);
    Ok(())
}

/// [`write_image`] with the records gathered in DRAM chunks of
/// IMAGE_CHUNK bytes first, for when no block of the bound could be had:
/// the block is then reserved at the image's exact length. (One buffer
/// grown by doubling held up to three times the records' size while it
/// copied.)
fn write_image_gathered(s: &Inner, head: Vec<u8>, release: bool) -> Result<()> {
    let pool = &s.pool;
    let mut chunks: Vec<Vec<u8>> = vec![Vec::with_capacity(IMAGE_CHUNK)];
    let keys = image_records(s, release, |rec| {
        let last = chunks.last_mut().expect("one chunk at least");
        if last.len() + rec.len() <= last.capacity() {
            last.extend_from_slice(rec);
        } else {
            let mut c = Vec::with_capacity(IMAGE_CHUNK.max(rec.len()));
            c.extend_from_slice(rec);
            chunks.push(c);
        }
    });
    let len = (head.len() + chunks.iter().map(Vec::len).sum::<usize>()) as u64;
    let r = match pool.reserve(
        len,
        Link::Pointer {
            owner: s.log.root + R_IMAGE,
        },
    ) {
        Ok(r) => r,
        // No room for an image: the next open scans the log instead.
        Err(pmem::Error::OutOfSpace(_)) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let mut crc = crc32fast::Hasher::new();
    let mut at = r.offset() + head.len() as u64;
    for c in chunks {
        pool.write(at, &c);
        crc.update(&c);
        at += c.len() as u64;
    }
    link_image(s, r, head, keys, len, crc)
}

/// A clean-shutdown image, parsed: its key count, cluster version
/// counters, each table slot's (tail, dead bytes), and where its records
/// lie. The records are read from the pool where they are, never copied
/// whole: a copy of the image plus a decoded list of its records took 720
/// MiB of DRAM at 10M keys, on top of the index being built from them.
struct Image {
    /// Pool offset of the image, and its length.
    off: u64,
    len: u64,
    versions: Vec<u64>,
    /// (tail, dead) per extent-table slot.
    slots: Vec<(u64, u64)>,
    /// The position (from `off`) of every `IMAGE_BLOCK`-th record: the
    /// starts of the blocks the loading threads share out.
    blocks: Vec<u64>,
}

/// Records per block of an image's loading (see [`Image::blocks`]).
const IMAGE_BLOCK: usize = 4096;

impl Image {
    /// The record at position `p` (checked by `parse_image`): key
    /// position, key length, v_addr, whether an 8-byte value follows, and
    /// the next record's position.
    #[inline]
    fn rec(pool: &Pool, off: u64, p: u64) -> (u64, usize, u64, bool, u64) {
        let w0 = pool.load_u64(off + p);
        let (kl, follows) = ((w0 & !VALUE_FOLLOWS) as usize, w0 & VALUE_FOLLOWS != 0);
        let kp = p + 8;
        let vp = kp + kl.next_multiple_of(8) as u64;
        let next = vp + 8 + if follows { 8 } else { 0 };
        (kp, kl, pool.load_u64(off + vp), follows, next)
    }

    /// Calls `f(key, v_addr, value)` for each record of block `b`.
    fn for_block(&self, pool: &Pool, b: usize, mut f: impl FnMut(&[u8], u64, Option<&[u8]>)) {
        let mut key = Vec::new();
        let mut p = self.blocks[b];
        for _ in 0..IMAGE_BLOCK {
            if p >= self.len {
                return;
            }
            let (kp, kl, va, follows, next) = Image::rec(pool, self.off, p);
            key.resize(kl, 0);
            pool.read(self.off + kp, &mut key);
            let val = follows.then(|| pool.load_u64(self.off + next - 8).to_le_bytes());
            f(&key, va, val.as_ref().map(|v| &v[..]));
            p = next;
        }
    }
}

/// Parses the image at `off` (`len` bytes) against the table's files:
/// `None` if it is not a well-formed image of this store (the open then
/// scans the log).
fn parse_image(
    pool: &Pool,
    clusters: usize,
    tl: usize,
    files: &[Arc<LogFile>],
    off: u64,
    len: u64,
) -> Option<Image> {
    let size = pool.block_size(off).ok()?;
    let head = 48 + 8 * clusters as u64 + 16 * tl as u64;
    if len > size || len < head || !len.is_multiple_of(8) {
        return None;
    }
    let w = |i: usize| pool.load_u64(off + i as u64);
    if w(0) != IMAGE_MAGIC || w(8) != len {
        return None;
    }
    let mut crc = crc32fast::Hasher::new();
    let mut chunk = vec![0u8; 1 << 20];
    let mut at = 24;
    while at < len {
        let n = (len - at).min(chunk.len() as u64) as usize;
        pool.read(off + at, &mut chunk[..n]);
        crc.update(&chunk[..n]);
        at += n as u64;
    }
    drop(chunk);
    if w(16) != crc.finalize() as u64 || w(32) != clusters as u64 || w(40) != tl as u64 {
        return None;
    }
    let keys = w(24);
    let mut p = 48;
    let mut versions = Vec::with_capacity(clusters);
    for _ in 0..clusters {
        versions.push(w(p));
        p += 8;
    }
    let by_slot: HashMap<u64, &Arc<LogFile>> = files.iter().map(|f| (f.slot, f)).collect();
    let mut slots = Vec::with_capacity(tl);
    for slot in 0..tl as u64 {
        let (t, d) = (w(p), w(p + 8));
        p += 16;
        if let Some(f) = by_slot.get(&slot) {
            if t < X_DATA || t > f.size || d > t - X_DATA {
                return None;
            }
        } else if t != 0 {
            return None;
        }
        slots.push((t, d));
    }
    let mut blocks = Vec::with_capacity((keys as usize).div_ceil(IMAGE_BLOCK));
    let mut count = 0u64;
    while p < len as usize {
        if p + 8 > len as usize {
            return None;
        }
        let (kl, follows) = ((w(p) & !VALUE_FOLLOWS) as usize, w(p) & VALUE_FOLLOWS != 0);
        let kp = p + 8;
        let vp = kp + kl.next_multiple_of(8);
        let end = vp + 8 + if follows { 8 } else { 0 };
        if kl > MAX_KEY || end > len as usize || (follows && kl != 8) {
            return None;
        }
        if count.is_multiple_of(IMAGE_BLOCK as u64) {
            blocks.push(p as u64);
        }
        count += 1;
        p = end;
    }
    if count != keys {
        return None;
    }
    Some(Image {
        off,
        len,
        versions,
        slots,
        blocks,
    })
}

/// Checks every record of a clean image against the log, on `threads`
/// threads: its entry must lie in a file of the table below that file's
/// recorded tail, be live (`ins` or `upd`) and hold the record's key. A
/// page zeroed or overwritten since the clean close would otherwise open
/// with keys silently missing. Reads only.
fn check_image(pool: &Pool, files: &[Arc<LogFile>], img: &Image, threads: usize) -> Result<()> {
    let mut spans: Vec<(u64, u64)> = files
        .iter()
        .filter_map(|f| {
            let (t, _) = *img.slots.get(f.slot as usize)?;
            Some((f.off, f.off + t))
        })
        .collect();
    spans.sort_unstable();
    let entry_holds = |key: &[u8], va: u64| -> bool {
        let off = vaddr_off(va);
        let i = spans.partition_point(|&(o, _)| o <= off);
        let Some(&(fo, end)) = i.checked_sub(1).map(|i| &spans[i]) else {
            return false;
        };
        off >= fo + X_DATA
            && off.is_multiple_of(8)
            && off + ENTRY_HEADER + key.len() as u64 <= end
            && matches!(pool.load_u64(off) >> OP_SHIFT, OP_INS | OP_UPD)
            && crate::nlog::entry_key_is(pool, off, key)
    };
    let n = img.blocks.len();
    let chunk = n.div_ceil(threads.max(1)).max(1);
    let bad = std::thread::scope(|sc| {
        let workers: Vec<_> = (0..n)
            .step_by(chunk)
            .map(|first| {
                let entry_holds = &entry_holds;
                sc.spawn(move || {
                    let mut bad = None;
                    for b in first..(first + chunk).min(n) {
                        img.for_block(pool, b, |key, va, _| {
                            if bad.is_none() && !entry_holds(key, va) {
                                bad = Some((key.to_vec(), va));
                            }
                        });
                        if bad.is_some() {
                            break;
                        }
                    }
                    bad
                })
            })
            .collect();
        workers
            .into_iter()
            .filter_map(|w| w.join().expect("image checker panicked"))
            .next()
    });
    match bad {
        None => Ok(()),
        Some((key, va)) => Err(corrupt(format!(
            "the clean-shutdown image maps key {:?} to offset {:#x}, where the log holds no \
             live entry of that key: {}",
            String::from_utf8_lossy(&key),
            vaddr_off(va),
            engine::damaged_after_close(pool)
        ))),
    }
}

/// Loads a clean-shutdown image; `Ok(false)` if it does not check out
/// (then the caller scans the log), `Err` if its records disagree with the
/// log ([`check_image`]).
fn load_image(
    s: &Inner,
    files: &[Arc<LogFile>],
    off: u64,
    len: u64,
    checked: bool,
) -> Result<bool> {
    let pool = &s.pool;
    let clusters = s.log.clusters as usize;
    let tl = s.log.table_len as usize;
    let Some(img) = parse_image(pool, clusters, tl, files, off, len) else {
        return Ok(false);
    };
    if files.iter().any(|f| f.slot as usize >= img.slots.len()) {
        return Ok(false);
    }
    let n = threads(s);
    if !checked {
        check_image(pool, files, &img, n)?;
    }
    for (c, v) in img.versions.iter().enumerate() {
        s.log.version(c).store(*v, Ordering::Relaxed);
    }
    for f in files {
        let (t, d) = img.slots[f.slot as usize];
        f.tail.store(t, Ordering::Release);
        f.dead.store(d, Ordering::Relaxed);
    }
    let blocks = img.blocks.len();
    let chunk = blocks.div_ceil(n).max(1);
    std::thread::scope(|sc| {
        for first in (0..blocks).step_by(chunk) {
            let img = &img;
            sc.spawn(move || {
                for b in first..(first + chunk).min(blocks) {
                    img.for_block(pool, b, |key, va, val| s.index.load(key, va, val));
                }
            });
        }
    });
    Ok(true)
}

/// The DRAM twin of a file found linked in the table.
fn live_file<'a>(live: &'a HashMap<u64, Arc<LogFile>>, f: &LogFile) -> Result<&'a Arc<LogFile>> {
    live.get(&f.off)
        .ok_or_else(|| corrupt(format!("file {:#x} is linked but not in DRAM", f.off)))
}

/// `check` with a persistent point index: every file parses to its end,
/// the engine passes its own check, and every pair it names resolves to a
/// valid entry of that key (through overflow entries where hashes collide).
fn check_persistent(
    s: &Inner,
    p: &PIndex,
    files: &[Arc<LogFile>],
    live: &HashMap<u64, Arc<LogFile>>,
    mut reach: u64,
) -> Result<(u64, u64)> {
    let pool = &s.pool;
    let (mut kbuf, mut vbuf) = (Vec::new(), Vec::new());
    for f in files {
        reach += pool.block_size(f.off)?;
        let lf = live_file(live, f)?;
        let mut pos = X_DATA;
        while let Some(e) = s.log.parse(lf, pos, &mut kbuf, &mut vbuf) {
            pos += e.len;
        }
        if lf.damaged.load(Ordering::Acquire)
            || (lf.accounted.load(Ordering::Acquire) && pos != lf.tail.load(Ordering::Acquire))
        {
            return Err(corrupt(format!(
                "{}: the entry at pool offset {:#x} is corrupt; \
                 `pmhash check --repair` salvages it",
                lf.describe(),
                f.off + pos
            )));
        }
    }
    reach += p.engine.check()?.reachable_bytes;
    // An entry named by the index: parses in a live file, holds `key`.
    let valid =
        |va: u64, key: Option<&[u8]>, kbuf: &mut Vec<u8>, vbuf: &mut Vec<u8>| -> Result<()> {
            let off = vaddr_off(va);
            let f = s
                .log
                .file_at(off)
                .ok_or_else(|| corrupt(format!("index names {va:#x}, outside every file")))?;
            let e = s
                .log
                .parse(&f, off - f.off, kbuf, vbuf)
                .ok_or_else(|| corrupt(format!("index names {va:#x}, not a valid entry")))?;
            if e.op == OP_INV || e.op == OP_DEL || key.is_some_and(|k| k != kbuf.as_slice()) {
                return Err(corrupt(format!(
                    "index names {va:#x}, an entry of another key or a dead one"
                )));
            }
            Ok(())
        };
    let mut keys = 0;
    for (h, v) in p.values() {
        if v & crate::pindex::OVF_TAG != 0 {
            valid(v & !crate::pindex::OVF_TAG, Some(b""), &mut kbuf, &mut vbuf)?;
            for (k, va) in p.ovf_pairs(v) {
                if key_hash(&k) != h {
                    return Err(corrupt(
                        "an overflow entry lists a key of another slot".into(),
                    ));
                }
                valid(va, Some(&k), &mut kbuf, &mut vbuf)?;
                keys += 1;
            }
        } else {
            valid(v, None, &mut kbuf, &mut vbuf)?;
            if key_hash(&kbuf) != h {
                return Err(corrupt(format!(
                    "slot {h:#x} names an entry of another hash"
                )));
            }
            keys += 1;
        }
    }
    Ok((keys, reach))
}

/// The read-only walk behind `Store::check`: returns keys and the PM bytes
/// reachable from the root.
pub(crate) fn check(s: &Inner) -> Result<(u64, u64)> {
    let pool = &s.pool;
    let root = s.log.root;
    let ri = read_root(pool, root)?;
    let (files, _) = read_files(pool, root, &ri)?;
    let mut reach = pool.block_size(root)?;
    let image = pool.load_u64(root + R_IMAGE);
    if image != 0 {
        reach += pool.block_size(image)?;
    }
    let live: HashMap<u64, Arc<LogFile>> =
        s.log.snapshot().into_iter().map(|f| (f.off, f)).collect();
    if let crate::index::Point::Engine(p) = s.index.point() {
        return check_persistent(s, p, &files, &live, reach);
    }
    let mut win: HashMap<Vec<u8>, (u64, u64, u64)> = HashMap::new();
    let (mut kbuf, mut vbuf) = (Vec::new(), Vec::new());
    for f in &files {
        reach += pool.block_size(f.off)?;
        let lf = live_file(&live, f)?;
        let mut pos = X_DATA;
        while let Some(e) = s.log.parse(lf, pos, &mut kbuf, &mut vbuf) {
            pos += e.len;
            if e.op == OP_INV {
                continue;
            }
            let va = vaddr(f.node, e.off);
            match win.get_mut(kbuf.as_slice()) {
                Some(o) if o.0 >= e.version => {}
                Some(o) => *o = (e.version, va, e.op),
                None => {
                    win.insert(kbuf.clone(), (e.version, va, e.op));
                }
            }
        }
        if pos != lf.tail.load(Ordering::Acquire) {
            return Err(corrupt(format!(
                "{}: the entry at pool offset {:#x} is corrupt (the file's entries \
                 reach byte {}); `pmhash check --repair` salvages it",
                lf.describe(),
                f.off + pos,
                lf.tail.load(Ordering::Acquire)
            )));
        }
    }
    let mut keys = 0;
    for (k, (_, va, op)) in &win {
        if *op == OP_DEL {
            if s.index.get(k).is_some() {
                return Err(corrupt("a deleted key is in the index".into()));
            }
            continue;
        }
        keys += 1;
        if s.index.get(k) != Some(*va) {
            return Err(corrupt(format!(
                "the index does not name the newest entry of a key ({:?})",
                String::from_utf8_lossy(k)
            )));
        }
    }
    if keys != s.index.len() as u64 {
        return Err(corrupt(format!(
            "the index holds {} keys, the log {keys}",
            s.index.len()
        )));
    }
    Ok((keys, reach))
}

/// A fast, seeded hasher for the per-cluster winner maps of a log scan.
#[derive(Clone)]
struct KeyHasher(u64);

impl BuildHasher for KeyHasher {
    type Hasher = KeyHasherState;
    fn build_hasher(&self) -> KeyHasherState {
        KeyHasherState(self.0)
    }
}

struct KeyHasherState(u64);

impl Hasher for KeyHasherState {
    fn finish(&self) -> u64 {
        engine::hash::fmix64(self.0)
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.0 =
                engine::hash::fmix64(self.0 ^ u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            self.0 = engine::hash::fmix64(self.0 ^ u64::from_le_bytes(b) ^ 0xff);
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = self.0.wrapping_add(n as u64).rotate_left(17);
    }
}

/// What [`Store::repair`](crate::Store::repair) dropped: a run of bytes of one Nlog file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dropped {
    /// The file's sequence number, node and cluster.
    pub file_seq: u64,
    /// The file's node.
    pub node: u32,
    /// The file's hash cluster.
    pub cluster: u32,
    /// Pool offset and length of the bytes dropped.
    pub offset: u64,
    /// Bytes dropped.
    pub len: u64,
    /// What the first entry there claimed to be, when its header still
    /// parses (its key and version may be the corrupt part).
    pub claimed: Option<String>,
}

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "dropped {} bytes at pool offset {:#x} of Nlog file {} (node {}, cluster {})",
            self.len, self.offset, self.file_seq, self.node, self.cluster
        )?;
        match &self.claimed {
            Some(c) => write!(f, ": {c}"),
            None => write!(f, ": no entry header parses there"),
        }
    }
}

/// The first valid entry of `f` at or after relative position `from`
/// (entries are 64-aligned, so every line is a candidate).
fn next_valid(s: &crate::nlog::Nlog, f: &LogFile, from: u64) -> Option<u64> {
    let (mut kbuf, mut vbuf) = (Vec::new(), Vec::new());
    let mut pos = from.next_multiple_of(ENTRY_ALIGN);
    while pos + ENTRY_HEADER <= f.size {
        if s.pool.load_u64(f.off + pos) != 0 && s.parse(f, pos, &mut kbuf, &mut vbuf).is_some() {
            return Some(pos);
        }
        pos += ENTRY_ALIGN;
    }
    None
}

/// What the header at `off` claims, if it parses.
fn claimed(s: &crate::nlog::Nlog, off: u64) -> Option<String> {
    let e = s.header(off)?;
    if e.version == 0 {
        return None;
    }
    let mut k = Vec::new();
    s.read_key(&e, &mut k);
    let shown: String = k.iter().take(32).map(|b| format!("{b:02x}")).collect();
    let op = ["invalid", "del", "upd", "ins"][e.op as usize];
    Some(format!(
        "an {op} entry, version {}, key of {} bytes (hex {shown}{}), value of {} bytes",
        e.version,
        e.klen,
        if k.len() > 32 { "…" } else { "" },
        e.vlen
    ))
}

/// Overwrites `[pos, end)` of `f` (relative, 64-aligned) with invalid
/// filler entries that parse: the log then reads past the bad bytes to
/// the valid entries after them.
fn fill(s: &crate::nlog::Nlog, f: &LogFile, mut pos: u64, end: u64) {
    let pool = &s.pool;
    // The longest filler: a value of at most MAX_VALUE bytes.
    let most = (ENTRY_HEADER + MAX_VALUE as u64) / ENTRY_ALIGN * ENTRY_ALIGN;
    while pos < end {
        let len = (end - pos).min(most);
        let off = f.off + pos;
        let vlen = (len - ENTRY_HEADER) as usize;
        let lens = lens_word(0, vlen);
        let mut value = vec![0u8; vlen];
        pool.read(off + ENTRY_HEADER, &mut value);
        let durable = pos / ENTRY_ALIGN;
        let w = CrcWords {
            seq: f.seq,
            off,
            version: 1,
            lens,
            h_addr: NONE,
            h_seq: 0,
            durable,
        };
        let crc = entry_crc(&w, b"", &value);
        pool.store_u64(off + 8, lens);
        pool.store_u64(off + 16, NONE);
        pool.store_u64(off + 24, 0);
        pool.store_u64(off + 32, check_word(crc, durable));
        // Op 0 (invalid), version 1: skipped by every reader.
        pool.store_u64(off, 1);
        // persist: each filler whole before the next; a crash midway
        // leaves bad bytes that a rerun of the repair fills again.
        pool.persist(off, ENTRY_HEADER as usize);
        pos += len;
    }
}

/// The salvage path (`pmhash check --repair`): every stretch of bad bytes
/// that the log scan would refuse as corruption is made into invalid
/// filler entries (when valid entries follow it) or zeroed (when nothing
/// valid follows, in a sealed file), and reported. Torn tails of the
/// newest files are left to the next open, which drops them as after any
/// crash. The clean-shutdown image is freed, so the next open rebuilds the
/// index from the repaired log. A key whose newest entry is dropped reads
/// as its previous value (or absent): the report says which bytes went.
/// `dry`: find and report only, write nothing.
pub(crate) fn repair(pool: Arc<Pool>, dry: bool) -> Result<Vec<Dropped>> {
    let root = pool.aux_root();
    if root == 0 {
        return Ok(Vec::new());
    }
    let ri = read_root(&pool, root)?;
    let (files, _) = read_files(&pool, root, &ri)?;
    let log = crate::nlog::Nlog::new(
        pool.clone(),
        &ri.log_root(root),
        engine::Durability::Strict,
        Arc::default(),
    );
    let newest = newest_files(&files);
    let mut dropped = Vec::new();
    let (mut kbuf, mut vbuf) = (Vec::new(), Vec::new());
    for (i, f) in files.iter().enumerate() {
        let mut pos = X_DATA;
        loop {
            while let Some(e) = log.parse(f, pos, &mut kbuf, &mut vbuf) {
                pos += e.len;
            }
            if !matches!(
                log.classify_end(f, pos, newest.contains(&i)),
                End::Corrupt { .. }
            ) {
                break;
            }
            let what = claimed(&log, f.off + pos);
            let (end, last) = match next_valid(&log, f, pos + ENTRY_ALIGN) {
                Some(c) => (c, false),
                None => (f.size, true),
            };
            let rec = Dropped {
                file_seq: f.seq,
                node: f.node,
                cluster: f.cluster,
                offset: f.off + pos,
                len: end - pos,
                claimed: what,
            };
            if !dry && last {
                // persist: nothing valid follows: the rest of the file is
                // zeroed, as a clean end.
                pool.zero(f.off + pos, (end - pos) as usize);
                pool.persist(f.off + pos, (end - pos) as usize);
            } else if !dry {
                fill(&log, f, pos, end);
            }
            dropped.push(rec);
            if last {
                break;
            }
            pos = end;
        }
    }
    let image = pool.load_u64(root + R_IMAGE);
    if image != 0 && !dropped.is_empty() && !dry {
        // persist: the image (which may name dropped entries) is unlinked
        // durably before it is freed; the next open scans the log.
        unlink_image(&pool, root, image)?;
    }
    Ok(dropped)
}

/// Unlinks and frees the clean-shutdown image at `image`.
// persist: the root's image words are cleared and persisted inside the
// free's reservation, so a crash either keeps the image linked and
// allocated or has it unlinked and free (never named and freed).
fn unlink_image(pool: &Pool, root: u64, image: u64) -> Result<()> {
    let t = pool.begin_free(
        image,
        Link::Pointer {
            owner: root + R_IMAGE,
        },
    )?;
    pool.store_u64(root + R_IMAGE, 0);
    pool.store_u64(root + R_IMAGE_LEN, 0);
    pool.persist(root + R_IMAGE, 16);
    pool.finish_free(t);
    Ok(())
}
