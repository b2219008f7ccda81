//! Persistence modes: dax refusal and fallback, volatile and simulated
//! pools, counters per mode.

use std::path::{Path, PathBuf};

use pmhash_pmem::persist::counters;
use pmhash_pmem::{CrashChoice, Error, Mode, Pool, PoolOptions};

fn temp(name: &str) -> PathBuf {
    let dir = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    dir.join(format!("pmhash-modes-{}-{name}", std::process::id()))
}

fn opts(mode: Mode) -> PoolOptions {
    PoolOptions {
        mode,
        size: 1 << 20,
        layout: "modes".into(),
        ..PoolOptions::default()
    }
}

fn is_dax_fs(path: &Path) -> bool {
    // A tmpfs or ordinary disk file system refuses MAP_SYNC; only check the
    // refusal where the file system is certainly not DAX.
    std::fs::read_to_string("/proc/mounts")
        .map(|m| {
            m.lines().any(|l| {
                l.contains("dax") && path.starts_with(l.split(' ').nth(1).unwrap_or("/nonexistent"))
            })
        })
        .unwrap_or(false)
}

#[test]
fn dax_is_refused_on_a_non_dax_file_unless_fallback_is_allowed() {
    let path = temp("dax.pool");
    let _ = std::fs::remove_file(&path);
    if is_dax_fs(&path) {
        eprintln!(
            "{} is on a DAX mount: MAP_SYNC would succeed; refusal not testable here",
            path.display()
        );
        let pool = Pool::create(&path, &opts(Mode::Dax)).unwrap();
        assert_eq!(pool.mode(), Mode::Dax);
        std::fs::remove_file(&path).unwrap();
        return;
    }
    match Pool::create(&path, &opts(Mode::Dax)) {
        Err(Error::DaxUnavailable(msg)) => assert!(msg.contains("MAP_SYNC"), "{msg}"),
        Err(e) => panic!("expected DaxUnavailable, got {e}"),
        Ok(_) => panic!("MAP_SYNC accepted on a non-DAX file"),
    }
    assert!(
        !path.exists(),
        "a refused create must not leave a file behind"
    );
    let pool = Pool::create(
        &path,
        &PoolOptions {
            allow_dax_fallback: true,
            ..opts(Mode::Dax)
        },
    )
    .unwrap();
    assert_eq!(pool.mode(), Mode::Mapped);
    assert!(pool.dax_fallback().unwrap().contains("MAP_SYNC"));
    pool.close().unwrap();
    drop(pool);
    // Reopening an existing pool follows the same rule.
    assert!(matches!(
        Pool::open(&path, &opts(Mode::Dax)),
        Err(Error::DaxUnavailable(_))
    ));
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn counters_follow_the_mode() {
    for (mode, counted) in [(Mode::Volatile, false), (Mode::Simulated, true)] {
        let pool = Pool::create(Path::new(""), &opts(mode)).unwrap();
        let off = pool.size() - 4096;
        let before = counters();
        pool.store_u64(off, 1);
        pool.persist(off, 200);
        let d = counters().since(&before);
        if counted {
            assert_eq!(
                (d.flushes, d.fences, d.bytes_flushed),
                (4, 1, 256),
                "{mode:?}"
            );
        } else {
            assert_eq!((d.flushes, d.fences), (0, 0), "{mode:?}");
        }
    }
    let path = temp("counters.pool");
    let _ = std::fs::remove_file(&path);
    let pool = Pool::create(&path, &opts(Mode::Mapped)).unwrap();
    let before = counters();
    pool.persist(8192, 64);
    pool.write_nt(16384, &[7u8; 256]);
    pool.fence();
    let d = counters().since(&before);
    assert_eq!((d.flushes, d.fences), (1 + 4, 2));
    let mut back = [0u8; 256];
    pool.read(16384, &mut back);
    assert_eq!(back, [7u8; 256]);
    drop(pool);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn non_temporal_writes_are_durable_only_after_a_fence_in_the_simulator() {
    let pool = Pool::create(Path::new(""), &opts(Mode::Simulated)).unwrap();
    let off = 300_000;
    pool.write_nt(off, &[0xab; 128]);
    let img = pool.crash_image(CrashChoice::Persisted).unwrap();
    assert!(
        img[off as usize..off as usize + 128]
            .iter()
            .all(|&b| b == 0),
        "durable before the fence"
    );
    pool.fence();
    let img = pool.crash_image(CrashChoice::Persisted).unwrap();
    assert!(
        img[off as usize..off as usize + 128]
            .iter()
            .all(|&b| b == 0xab),
        "not durable after the fence"
    );
}

#[test]
fn volatile_pool_works_and_mode_names_round_trip() {
    let pool = Pool::create(Path::new(""), &opts(Mode::Volatile)).unwrap();
    let r = pool.reserve(100, pmhash_pmem::Link::Nothing).unwrap();
    pool.store_u64(r.offset(), 5);
    assert_eq!(pool.load_u64(r.offset()), 5);
    pool.commit(r);
    for m in [Mode::Dax, Mode::Mapped, Mode::Volatile, Mode::Simulated] {
        assert_eq!(Mode::parse(m.name()).unwrap(), m);
    }
    assert!(Mode::parse("pmem").is_err());
}

#[test]
fn targeted_crash_choices_write_back_exactly_one_line() {
    let pool = Pool::create(Path::new(""), &opts(Mode::Simulated)).unwrap();
    let (a, b) = (300_032u64, 400_000u64);
    pool.set_fence_hook(Some(Box::new(|_, _| {}))).unwrap();
    pool.fence();
    pool.store_u64(a, 7);
    pool.store_u64(b, 9);
    pool.flush(a, 8);
    let (la, lb) = (a / 64, b / 64);
    let recent = pool.recent_lines().unwrap();
    assert!(recent.contains(&la) && recent.contains(&lb), "{recent:?}");
    let word = |img: &[u8], off: u64| {
        u64::from_le_bytes(img[off as usize..off as usize + 8].try_into().unwrap())
    };
    let only_b = pool.crash_image(CrashChoice::OnlyNew(lb)).unwrap();
    assert_eq!((word(&only_b, a), word(&only_b, b)), (0, 9));
    let all_but_b = pool.crash_image(CrashChoice::AllButOld(lb)).unwrap();
    assert_eq!((word(&all_but_b, a), word(&all_but_b, b)), (7, 0));
    pool.fence();
    // After the fence the flushed line is durable; b is still undecided but
    // no longer recent (not written since this fence).
    assert_eq!(pool.undecided_lines().unwrap(), vec![lb]);
    assert!(pool.recent_lines().unwrap().is_empty());
}

#[test]
fn prefault_touches_whole_file_pages_and_changes_no_byte() {
    // Volatile and simulated pools have no file pages to fault in ahead.
    for mode in [Mode::Volatile, Mode::Simulated] {
        let pool = Pool::create(Path::new(""), &opts(mode)).unwrap();
        assert_eq!(pool.prefault(0, 1 << 20), 0, "{mode:?}");
    }
    let path = temp("prefault.pool");
    let _ = std::fs::remove_file(&path);
    let pool = Pool::create(&path, &opts(Mode::Mapped)).unwrap();
    pool.write(65536, &[0x5a; 100]);
    pool.write(65536 + 5000, &[0xa5; 64]);
    let before = pool.image();
    // Whole pages inside the range: [64 KiB + 4 KiB, 96 KiB) of a range
    // that starts one byte into a page and ends 100 bytes past one.
    assert_eq!(pool.prefault(65537, 32768 + 99), 28672);
    // Pages already written are populated without a change; the pool's
    // end bounds the range.
    assert_eq!(pool.prefault(65536, 8192), 8192);
    assert_eq!(pool.prefault((1 << 20) - 4096, 1 << 30), 4096);
    assert_eq!(pool.prefault(1 << 21, 4096), 0, "past the end");
    assert_eq!(pool.prefault(4096, 100), 0, "no whole page");
    assert!(pool.image() == before, "prefault changed the pool's bytes");
    drop(pool);
    let ro = Pool::open(
        &path,
        &PoolOptions {
            read_only: true,
            ..opts(Mode::Mapped)
        },
    )
    .unwrap();
    assert_eq!(ro.prefault(0, 1 << 20), 0, "a read-only pool");
    drop(ro);
    std::fs::remove_file(&path).unwrap();
}
