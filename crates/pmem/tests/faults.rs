//! The pool under faults: a full file system is `Err(OutOfSpace)` (never a
//! SIGBUS), and a pool has one writer at a time (an exclusive `flock`
//! that the kernel drops when its holder dies).
//!
//! The full-file-system tests mount a small tmpfs, which needs root (CI
//! runs as root); elsewhere they print why and skip.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use pmhash_pmem::testfs::SmallFs;
use pmhash_pmem::{Error, Link, Pool, PoolLock, PoolOptions};

const LAYOUT: &str = "faults";

fn small_fs(bytes: u64) -> Option<SmallFs> {
    match SmallFs::mount(bytes) {
        Ok(fs) => Some(fs),
        Err(why) => {
            eprintln!("skipped: needs a small tmpfs ({why})");
            None
        }
    }
}

/// Fills the rest of the file system with a plain file.
fn fill_up(fs: &SmallFs) {
    let free = fs.free_bytes();
    let f = std::fs::File::create(fs.path("filler")).unwrap();
    // set_len is sparse; writing makes tmpfs take the pages.
    use std::io::Write;
    let mut w = std::io::BufWriter::new(f);
    let block = vec![0xa5u8; 64 << 10];
    let mut left = free;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        if w.write_all(&block[..n]).is_err() {
            break;
        }
        left -= n as u64;
    }
    let _ = w.flush();
}

fn assert_out_of_space(r: Result<impl Sized, Error>, path_part: &str, what: &str) {
    match r {
        Err(Error::OutOfSpace(m)) => {
            assert!(
                m.contains(path_part),
                "{what}: message {m:?} does not name the file"
            );
        }
        Err(e) => panic!("{what}: expected OutOfSpace, got {e}"),
        Ok(_) => panic!("{what}: succeeded on a full file system"),
    }
}

#[test]
fn create_larger_than_the_file_system_is_out_of_space() {
    let Some(fs) = small_fs(4 * MIB) else { return };
    let p = fs.path("big.pool");
    assert_out_of_space(
        Pool::create(&p, &mapped(8 * MIB, 0, LAYOUT)),
        "big.pool",
        "create",
    );
    assert!(!p.exists(), "a refused create leaves no file");
    // The space was given back: a pool that fits is made.
    let pool = Pool::create(&p, &mapped(2 * MIB, 0, LAYOUT)).unwrap();
    pool.close().unwrap();
}

#[test]
fn growth_on_a_full_file_system_is_out_of_space_and_the_pool_stays_usable() {
    let Some(fs) = small_fs(3 * MIB) else { return };
    let p = fs.path("grow.pool");
    let pool = Pool::create(&p, &mapped(MIB, 64 * MIB, LAYOUT)).unwrap();
    let root = pool.reserve(4096, Link::RootPointer).unwrap();
    let root_off = root.offset();
    pool.zero(root_off, 4096);
    pool.persist(root_off, 4096);
    pool.set_root(root_off).unwrap();
    pool.commit(root);
    // Blocks of 64 KiB, each linked from a root slot, until the pool can
    // grow no more.
    let mut blocks = Vec::new();
    let err = loop {
        let slot = root_off + 8 * blocks.len() as u64;
        assert!(blocks.len() < 500, "a 3 MiB file system held 32 MiB");
        match pool.reserve(64 << 10, Link::Pointer { owner: slot }) {
            Ok(r) => {
                let off = r.offset();
                let data = pattern(off, 64 << 10, 7);
                pool.write(off, &data);
                pool.persist(off, data.len());
                pool.store_u64(slot, off);
                pool.persist(slot, 8);
                pool.commit(r);
                blocks.push(off);
            }
            Err(e) => break e,
        }
    };
    assert!(!blocks.is_empty());
    assert_out_of_space(Err::<(), _>(err), "grow.pool", "grow");
    assert!(
        pool.size() < 3 * MIB,
        "the pool stayed inside the file system"
    );
    // Every block still reads back.
    for &off in &blocks {
        let mut v = vec![0u8; 64 << 10];
        pool.read(off, &mut v);
        assert_eq!(v, pattern(off, 64 << 10, 7));
    }
    // Freeing makes room again, inside the pool.
    let last = blocks.pop().unwrap();
    let slot = root_off + 8 * blocks.len() as u64;
    let t = pool
        .begin_free(last, Link::Pointer { owner: slot })
        .unwrap();
    pool.store_u64(slot, 0);
    pool.persist(slot, 8);
    pool.finish_free(t);
    let r = pool
        .reserve(64 << 10, Link::Pointer { owner: slot })
        .expect("a freed block is reused");
    pool.store_u64(slot, r.offset());
    pool.persist(slot, 8);
    pool.commit(r);
    pool.close().unwrap();
}

#[test]
fn a_sparse_pool_on_a_full_file_system_is_refused_untouched() {
    let Some(fs) = small_fs(8 * MIB) else { return };
    // A 4 MiB pool made elsewhere, copied in sparse: its free chunks are holes.
    let src = TempPath::new("sparse-src");
    {
        let pool = Pool::create(src.path(), &mapped(4 * MIB, 0, LAYOUT)).unwrap();
        pool.close().unwrap();
    }
    let p = fs.path("sparse.pool");
    let st = Command::new("cp")
        .arg("--sparse=always")
        .arg(src.path())
        .arg(&p)
        .status()
        .unwrap();
    assert!(st.success());
    fill_up(&fs);
    let before = file_bytes(&p);
    assert_out_of_space(
        Pool::open(&p, &mapped(0, 0, LAYOUT)),
        "sparse.pool",
        "writable open",
    );
    assert_file_is(&p, &before, "refused open");
    // Reading needs no new pages.
    let ro = PoolOptions {
        read_only: true,
        ..mapped(0, 0, LAYOUT)
    };
    let pool = Pool::open(&p, &ro).unwrap();
    assert_eq!(pool.size(), 4 * MIB);
    drop(pool);
    // With room again, the writable open backs the holes and succeeds.
    std::fs::remove_file(fs.path("filler")).unwrap();
    let pool = Pool::open(&p, &mapped(0, 0, LAYOUT)).unwrap();
    pool.close().unwrap();
}

/// Whether a read-only open stops seeing a writer within a few seconds.
/// (Not at once: a child that another test thread is spawning holds a copy
/// of every descriptor of this process until its `exec` closes them.)
fn lock_gone_soon(p: &std::path::Path) -> bool {
    let ro = PoolOptions {
        read_only: true,
        ..mapped(0, 0, LAYOUT)
    };
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        if !Pool::open(p, &ro).unwrap().writer_active() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

#[test]
fn a_second_writable_open_is_locked_out_until_the_first_closes() {
    let tmp = TempPath::new("lock");
    let opts = mapped(MIB, 0, LAYOUT);
    let first = Pool::create(tmp.path(), &opts).unwrap();
    first.close().unwrap();
    let before = file_bytes(tmp.path());
    let name = tmp
        .path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .to_string();
    for what in ["Pool::open", "PoolLock::exclusive"] {
        let r = if what == "Pool::open" {
            Pool::open(tmp.path(), &opts).map(|_| ())
        } else {
            PoolLock::exclusive(tmp.path()).map(|_| ())
        };
        match r {
            Err(Error::Locked(m)) => assert!(m.contains(&name), "{what}: {m:?} names no file"),
            Err(e) => panic!("{what}: expected Locked, got {e}"),
            Ok(()) => panic!("{what}: a second writer got in"),
        }
    }
    assert_file_is(tmp.path(), &before, "refused second open");
    // A reader opens and sees the writer.
    let ro = PoolOptions {
        read_only: true,
        ..opts.clone()
    };
    let reader = Pool::open(tmp.path(), &ro).unwrap();
    assert!(reader.writer_active());
    drop(reader);
    drop(first);
    assert!(
        lock_gone_soon(tmp.path()),
        "the writer's lock outlived the dropped pool"
    );
    // The reader holds no lock: a writer opens beside it.
    let second = Pool::open(tmp.path(), &opts).unwrap();
    second.close().unwrap();
}

/// Not a test on its own: the child process of
/// `a_killed_holder_leaves_no_lock`, which opens the pool named by the
/// environment, says so on stdout and waits to be killed.
#[test]
fn lock_holder_child() {
    let Ok(path) = std::env::var("PMEM_LOCK_HOLDER") else {
        return;
    };
    let pool = Pool::open(std::path::Path::new(&path), &mapped(0, 0, LAYOUT)).unwrap();
    println!("holding");
    std::thread::sleep(Duration::from_secs(30));
    drop(pool);
}

#[test]
fn a_killed_holder_leaves_no_lock() {
    let tmp = TempPath::new("killed");
    let opts = mapped(MIB, 0, LAYOUT);
    Pool::create(tmp.path(), &opts).unwrap().close().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "lock_holder_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("PMEM_LOCK_HOLDER", tmp.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let t0 = Instant::now();
    let mut line = String::new();
    while !line.contains("holding") {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 {
            let _ = child.kill();
            panic!("the holder exited before taking the lock");
        }
        assert!(t0.elapsed() < Duration::from_secs(20));
    }
    // Another process holds it: writers are refused, readers see it.
    let r = Pool::open(tmp.path(), &opts);
    assert!(
        matches!(r, Err(Error::Locked(_))),
        "second writer: {:?}",
        r.err()
    );
    let ro = PoolOptions {
        read_only: true,
        ..opts.clone()
    };
    assert!(Pool::open(tmp.path(), &ro).unwrap().writer_active());
    // SIGKILL: no destructor runs, the kernel drops the lock.
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        lock_gone_soon(tmp.path()),
        "the lock outlived its killed holder"
    );
    let pool = Pool::open(tmp.path(), &opts).expect("the lock died with its holder");
    pool.close().unwrap();
}
