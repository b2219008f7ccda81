//! Memory the store's pool takes in the process: a new log file's
//! unwritten pages, the close's image, the open's read-only check.
//!
//! Each test runs its store in a tmpfs directory (`/dev/shm`), where the
//! pool file's pages are memory, and reads the process's resident pages
//! from `/proc/self`: the pages of the pool file's mappings
//! (`/proc/self/smaps`), or the resident-set high-water mark (`VmHWM`,
//! reset through `/proc/self/clear_refs`). The tests in this file run one
//! at a time (a lock), so one test's allocations never show in another's
//! figures.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use pmhash_store::{CreateOptions, GcMode, OpenOptions, Options, Store};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const MIB: u64 = 1 << 20;

/// A directory in `/dev/shm`, removed on drop.
struct ShmDir(PathBuf);

impl ShmDir {
    fn new(tag: &str) -> ShmDir {
        let shm = Path::new("/dev/shm");
        assert!(shm.is_dir(), "these tests need a tmpfs at /dev/shm");
        let d = shm.join(format!("store-memory-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        ShmDir(d)
    }
}

impl Drop for ShmDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Resident bytes of every mapping of `file` in this process.
fn mapped_rss(file: &Path) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("read /proc/self/smaps");
    let name = file.to_str().expect("utf-8 path");
    let mut ours = false;
    let mut kib = 0u64;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            ours = line.ends_with(name);
        } else if ours && first == "Rss:" {
            kib += line
                .split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
                .expect("Rss value");
        }
    }
    kib * 1024
}

/// `VmHWM` or `VmRSS` of this process, in bytes.
fn status_bytes(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let line = s
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"));
    line.split_whitespace()
        .nth(1)
        .and_then(|v| v.parse::<u64>().ok())
        .expect("a number of kB")
        * 1024
}

/// Resets the resident-set high-water mark to the current resident set.
fn reset_peak() {
    std::fs::write("/proc/self/clear_refs", "5").expect("write /proc/self/clear_refs");
}

fn opts(extent: u64, expected_keys: u64) -> Options {
    Options {
        create: CreateOptions {
            pool_size: 64 * MIB,
            clusters: 4,
            extent_size: extent,
            nodes: Some(1),
            ..Default::default()
        },
        open: OpenOptions {
            max_pool_size: 4096 * MIB,
            gc: GcMode::Manual,
            raf_bytes: 0,
            recovery_threads: 2,
            expected_keys,
            ..Default::default()
        },
    }
}

fn key(i: u64) -> [u8; 8] {
    i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes()
}

/// A new store in a tmpfs directory (4 clusters, 8 MiB files), its pool
/// file, the file's resident bytes before the first put, and `n`: keys
/// `0..n` were put, until each cluster had made its first file.
fn four_new_files(tag: &str, expected_keys: u64) -> (ShmDir, Store, PathBuf, u64, u64) {
    let dir = ShmDir::new(tag);
    let s = Store::open(&dir.0, opts(8 * MIB, expected_keys)).expect("create");
    let pool = dir.0.join("store.pool");
    let before = mapped_rss(&pool);
    let mut n = 0u64;
    while s.stats().files < 4 {
        s.put(&key(n), &n.to_le_bytes()).expect("put");
        n += 1;
        assert!(n < 10_000, "4 files never made");
    }
    (dir, s, pool, before, n)
}

#[test]
fn a_new_log_file_takes_no_pages_until_written() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (dir, s, pool, before, i) = four_new_files("newfile", 1024);
    let after = mapped_rss(&pool);
    let grown = after.saturating_sub(before);
    // Zeroed with stores, the 4 files faulted in 32 MiB; untouched, only
    // their headers' and entries' pages (and a few of the allocator's).
    assert!(
        grown < 2 * MIB,
        "4 new 8 MiB log files made the pool's mapping {} KiB larger",
        grown / 1024
    );
    // The files read as zeros past their entries, so a crash open (a scan
    // that checks every byte after each file's last entry) finds clean
    // ends, and every key.
    drop(s); // no close: the next open scans the log
    let s = Store::open(&dir.0, opts(8 * MIB, 1024)).expect("crash open");
    assert_eq!(s.stats().opened_from, pmhash_store::OpenedFrom::LogScan);
    for j in 0..i {
        assert_eq!(s.get(&key(j)).expect("get"), Some(j.to_le_bytes().to_vec()));
    }
    s.close().expect("close");
}

#[test]
fn a_log_file_from_never_used_pool_space_is_not_zeroed_again() {
    // Pool space no block has used reads zero already: punching a hole in
    // it and reserving it again (or storing zeros) would only cost time.
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = ShmDir::new("fresh");
    let o = opts(8 * MIB, 1024);
    let s = Store::open(&dir.0, o.clone()).expect("create");
    let size_at_create = s.pool().size();
    // Enough files that the pool grows past its 64 MiB: files from the
    // space it was created with and from the space it grew into.
    let mut i = 0u64;
    while s.pool().size() == size_at_create || s.stats().files < 12 {
        s.put(&key(i), &[1u8; 4000]).expect("put");
        i += 1;
        assert!(i < 200_000, "the pool never grew");
    }
    assert_eq!(
        s.pool().zeroed_bytes(),
        0,
        "{} new files from never-used space were zeroed",
        s.stats().files
    );
    drop(s); // no close: a crash open reads every file's unwritten rest
    let s = Store::open(&dir.0, o.clone()).expect("crash open");
    assert_eq!(s.stats().opened_from, pmhash_store::OpenedFrom::LogScan);
    assert_eq!(s.len(), i);
    let free_at_open = s.pool().stats().free_chunks * pmem::CHUNK;
    assert!(
        free_at_open > 8 * MIB + pmem::CHUNK,
        "the test needs room for a file in the space held at open ({free_at_open} bytes free)"
    );
    // After an open nothing the pool held is known to be zero: the next
    // new file is zeroed (a crash leaves no record of which free space a
    // block used before).
    let files = s.stats().files;
    let mut j = i;
    while s.stats().files == files {
        s.put(&key(j), &[2u8; 4000]).expect("put");
        j += 1;
        assert!(j < i + 10_000, "no new file");
    }
    assert_eq!(
        s.pool().zeroed_bytes(),
        8 * MIB,
        "a file from space held at open is zeroed, once"
    );
    s.close().expect("close");
    drop(s);
    let s = Store::open(&dir.0, o).expect("clean open");
    for k in (0..j).step_by(97) {
        let want = if k < i { 1u8 } else { 2u8 };
        assert_eq!(s.get(&key(k)).expect("get"), Some(vec![want; 4000]));
    }
    s.close().expect("close");
}

#[test]
fn a_reused_log_block_is_zero_past_its_entries() {
    // Files freed by GC come back from the allocator holding old entries;
    // a new file made from one must read as zeros past its header, or the
    // crash open would find bytes after the file's last entry.
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = ShmDir::new("reuse");
    let o = opts(64 << 10, 1024);
    let s = Store::open(&dir.0, o.clone()).expect("create");
    let v = [7u8; 200];
    for round in 0..20u64 {
        for i in 0..500u64 {
            s.put(&key(i), &v).expect("put");
        }
        s.gc(64).expect("gc");
        assert_eq!(s.len(), 500, "round {round}");
    }
    let st = s.stats();
    assert!(
        st.files_reclaimed > 20,
        "GC freed {} files",
        st.files_reclaimed
    );
    assert!(
        s.pool().zeroed_bytes() >= 64 << 10,
        "files made from reclaimed blocks were zeroed ({} bytes)",
        s.pool().zeroed_bytes()
    );
    drop(s); // no close: the next open scans every file to its end
    let s = Store::open(&dir.0, o).expect("crash open");
    assert_eq!(s.stats().opened_from, pmhash_store::OpenedFrom::LogScan);
    assert_eq!(s.len(), 500);
    for i in 0..500u64 {
        assert_eq!(s.get(&key(i)).expect("get").as_deref(), Some(&v[..]));
    }
    s.close().expect("close");
}

/// Puts `n` 8-byte keys with 8-byte values.
fn fill(s: &Store, n: u64) {
    for i in 0..n {
        s.put(&key(i), &i.to_le_bytes()).expect("put");
    }
}

#[test]
fn the_close_holds_the_image_once() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = ShmDir::new("close");
    let n = 1_000_000u64;
    let s = Store::open(&dir.0, opts(4 * MIB, n)).expect("create");
    fill(&s, n);
    reset_peak();
    let base = status_bytes("VmRSS:");
    s.close().expect("close");
    let rise = status_bytes("VmHWM:").saturating_sub(base);
    // The image: 32 bytes a record (length word, key, v_addr, value).
    let image = 32 * n;
    // Gathered in DRAM and then copied into the pool, the records were
    // resident twice at the end of the close.
    assert!(
        rise < image * 3 / 2,
        "the close raised the resident set by {} MiB for a {} MiB image",
        rise / MIB,
        image / MIB
    );
    drop(s);
    let s = Store::open(&dir.0, opts(4 * MIB, n)).expect("reopen");
    assert_eq!(s.stats().opened_from, pmhash_store::OpenedFrom::Image);
    assert_eq!(s.len(), n);
    for i in (0..n).step_by(997) {
        assert_eq!(s.get(&key(i)).expect("get"), Some(i.to_le_bytes().to_vec()));
    }
    s.close().expect("close");
}

#[test]
fn the_open_unmaps_its_check_before_loading() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = ShmDir::new("open");
    let n = 1_000_000u64;
    let s = Store::open(&dir.0, opts(4 * MIB, n)).expect("create");
    fill(&s, n);
    s.close().expect("close");
    drop(s);
    reset_peak();
    let base = status_bytes("VmRSS:");
    let s = Store::open(&dir.0, opts(4 * MIB, n)).expect("reopen");
    let rise = status_bytes("VmHWM:").saturating_sub(base);
    let after = status_bytes("VmRSS:").saturating_sub(base);
    assert_eq!(s.stats().opened_from, pmhash_store::OpenedFrom::Image);
    // The read-only check reads the image and every key's log entry; left
    // mapped through the writable open's load, its pages were resident
    // beside the loaded index and the writable mapping's image.
    assert!(
        rise < after + after / 4,
        "the open's peak was {} MiB over the start, {} MiB once open",
        rise / MIB,
        after / MIB
    );
    s.close().expect("close");
}

/// Opens the store at `dir` after a clean close: it must load the image
/// and hold the `n` keys `fill` put (every `step`-th one is read back).
fn reopen_from_image(dir: &Path, n: u64, step: usize) -> Store {
    let s = Store::open(dir, opts(4 * MIB, 1024)).expect("reopen");
    assert_eq!(s.stats().opened_from, pmhash_store::OpenedFrom::Image);
    assert_eq!(s.len(), n);
    for i in (0..n).step_by(step) {
        assert_eq!(s.get(&key(i)).expect("get"), Some(i.to_le_bytes().to_vec()));
    }
    s
}

#[test]
fn a_close_that_frees_the_index_never_holds_it_beside_the_image() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = ShmDir::new("free");
    let n = 1_000_000u64;
    // Grown from small, as a user's store is: every shard's table is an
    // allocation of its own.
    let s = Store::open(&dir.0, opts(4 * MIB, 1024)).expect("create");
    fill(&s, n);
    let index = s.stats().index_dram_bytes;
    // The image: 32 bytes a record (length word, key, v_addr, value).
    let image = 32 * n;
    assert!(index > image, "index {index} B, image {image} B");
    reset_peak();
    let base = status_bytes("VmRSS:");
    s.close_and_free().expect("close");
    let rise = status_bytes("VmHWM:").saturating_sub(base);
    let end = status_bytes("VmRSS:");
    // Holding the index while the image was written raised the resident
    // set by the whole image; freed shard by shard as the image grows, by
    // at most a few shards' worth.
    assert!(
        rise < image / 4,
        "the close raised the resident set by {} MiB for a {} MiB image",
        rise / MIB,
        image / MIB
    );
    assert!(
        end + index / 2 < base + image,
        "after the close {} MiB resident, {} MiB before (index {} MiB, image {} MiB)",
        end / MIB,
        base / MIB,
        index / MIB,
        image / MIB
    );
    let s = reopen_from_image(&dir.0, n, 997);
    // Loaded from the image, the index is one array every shard's table
    // is a part of: each part's pages go back as its shard is written.
    // This close also reads every key from the log (not mapped since the
    // open) and writes a new image.
    let st = s.stats();
    let (index, log) = (st.index_dram_bytes, st.log_bytes);
    reset_peak();
    let base = status_bytes("VmRSS:");
    s.close_and_free().expect("close after reopen");
    let rise = status_bytes("VmHWM:").saturating_sub(base);
    // Held whole, the index stood beside the log's pages and the new
    // image at the end of the close (a rise of 58 MiB here, index 64);
    // given back as they come in, 14.
    assert!(
        rise < index / 2,
        "the close raised the resident set by {} MiB (log {} MiB, image {} MiB, index {} MiB)",
        rise / MIB,
        log / MIB,
        image / MIB,
        index / MIB
    );
    let s = reopen_from_image(&dir.0, n, 991);
    s.close().expect("close");
}

/// Waits up to 5 s for `done`.
fn wait_for(mut done: impl FnMut() -> bool) -> bool {
    let t = std::time::Instant::now();
    while t.elapsed() < std::time::Duration::from_secs(5) {
        if done() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    done()
}

#[test]
fn the_log_is_faulted_in_ahead_of_its_tails_and_no_further() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (_dir, s, pool, before, mut i) = four_new_files("ahead", 100_000);
    // The window past each of the 4 tails: 32 KiB, its tail's page
    // already written.
    assert!(
        wait_for(|| s.stats().log_prefaulted_bytes >= 4 * 28 * 1024),
        "faulted in {} bytes ahead of 4 tails",
        s.stats().log_prefaulted_bytes
    );
    // Writes at a pace the maintenance thread (a run every 2 ms) keeps up
    // with: 200 one-line entries over 4 tails, then a pause.
    for _ in 0..50 {
        for _ in 0..200 {
            s.put(&key(i), &i.to_le_bytes()).expect("put");
            i += 1;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let st = s.stats();
    assert!(
        wait_for(|| s.stats().log_prefaulted_bytes >= st.log_bytes),
        "faulted in {} bytes ahead of {} bytes of entries",
        s.stats().log_prefaulted_bytes,
        st.log_bytes
    );
    // No further than the window: the entries' pages, 32 KiB past each
    // tail, the 4 file headers' pages and the allocator's few.
    let grown = mapped_rss(&pool).saturating_sub(before);
    let bound = st.log_bytes + 4 * (32 + 4 + 4) * 1024 + MIB;
    assert!(
        grown <= bound,
        "the pool's mapping grew by {} KiB for {} KiB of entries",
        grown / 1024,
        st.log_bytes / 1024
    );
    for j in (0..i).step_by(7) {
        assert_eq!(s.get(&key(j)).expect("get"), Some(j.to_le_bytes().to_vec()));
    }
    s.close().expect("close");
}

#[test]
fn the_point_index_is_faulted_in_ahead_of_its_rebuilds_and_no_further() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = ShmDir::new("indexahead");
    // Sized for 64k keys (a 128-slot table per shard), then 600k put:
    // every shard's table doubles three times (point_map.rs), the third
    // time from 512 slots, at about 435 keys a shard.
    let s = Store::open(&dir.0, opts(8 * MIB, 64 << 10)).expect("create");
    let first = s.stats().index_dram_bytes;
    let n = 600_000u64;
    let mut before_third = 0;
    for i in 0..n {
        s.put(&key(i), &i.to_le_bytes()).expect("put");
        if i == 300_000 {
            // The second wave is done, the third not yet near (293 keys a
            // shard).
            before_third = s.stats().index_prefaulted_bytes;
        }
        if i == 400_000 {
            // About 390 keys a shard: most shards have passed 3/4 of their
            // 512 slots, and few have been rebuilt; the prefault thread
            // faults in what the rest of the wave will take, at the idle
            // class, so only once this thread waits.
            assert!(
                wait_for(|| s.stats().index_prefaulted_bytes > before_third),
                "nothing faulted in ahead of the third wave"
            );
        }
    }
    let st = s.stats();
    assert_eq!(st.index_dram_bytes, 8 * first, "three doublings");
    // What the rebuilds took beyond what they gave back is the last
    // tables' bytes (the first tables give nothing back, each later wave
    // its old tables): no more is faulted in ahead, give or take what the
    // thread's reads of the counts race with the writer's rebuilds (a
    // table or two).
    assert!(
        st.index_prefaulted_bytes <= st.index_dram_bytes + MIB,
        "faulted in {} bytes ahead of {} bytes of tables",
        st.index_prefaulted_bytes,
        st.index_dram_bytes
    );
    for j in (0..n).step_by(7) {
        assert_eq!(s.get(&key(j)).expect("get"), Some(j.to_le_bytes().to_vec()));
    }
    s.close().expect("close");
}
