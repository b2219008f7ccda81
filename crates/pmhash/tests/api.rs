//! The front crate's API on its error paths: every refusal is an `Err`
//! with a message, and a refused open leaves the file as it was.

use std::path::PathBuf;

use pmhash::engines::{Hmeh, Level, Pass, Rophi};
use pmhash::{Durability, Index, Store};

fn scratch(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("pmhash-api-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    let _ = std::fs::remove_dir_all(&p);
    p
}

fn err_text<T>(r: Result<T, pmhash::Error>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn every_index_engine_by_name_round_trips_a_reopen() {
    for (name, _) in pmhash::index_engines() {
        let path = scratch(&format!("byname-{name}"));
        let ix = Index::options()
            .engine(name)
            .create(&path)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(ix.engine_name(), name);
        for k in [0, 1, u64::MAX] {
            assert!(ix.insert(k, !k).unwrap());
        }
        assert!(ix.remove(1).unwrap());
        assert!(!ix.remove(1).unwrap());
        ix.close().unwrap();
        // Reopened by name: the same engine, the same contents.
        let ix = Index::options().engine(name).open(&path).unwrap();
        assert_eq!(
            (ix.len(), ix.get(0), ix.get(u64::MAX)),
            (2, Some(!0), Some(0))
        );
        assert_eq!(
            ix.get_many(&[0, 1, u64::MAX]),
            vec![Some(!0), None, Some(0)]
        );
        let mut seen = Vec::new();
        ix.for_each(|k, v| seen.push((k, v)));
        seen.sort_unstable();
        assert_eq!(seen, vec![(0, !0), (u64::MAX, 0)]);
        assert_eq!(ix.check().unwrap(), 2);
        drop(ix); // a drop closes too
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn typed_indexes_open_their_own_layout_only() {
    let path = scratch("typed");
    let ix: Index<Hmeh> = Index::options().create_as(&path).unwrap();
    ix.upsert(5, 6).unwrap();
    ix.close().unwrap();
    let before = std::fs::read(&path).unwrap();
    assert!(err_text(Index::options().open_as::<Pass>(&path)).contains("layout"));
    assert!(Index::options().open_as::<Level>(&path).is_err());
    assert!(Index::options().open_as::<Rophi>(&path).is_err());
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "refused opens wrote nothing"
    );
    // By name, an engine of another layout is refused too.
    assert!(err_text(Index::options().engine("pass").open(&path)).contains("not engine pass"));
    // A name and a type at once is a caller error.
    assert!(err_text(Index::options().engine("hmeh").open_as::<Hmeh>(&path)).contains("type"));
    // The nameless open finds the engine; E+filter reads E's pool.
    assert_eq!(Index::open(&path).unwrap().engine_name(), "hmeh");
    let f = Index::options().engine("hmeh+filter").open(&path).unwrap();
    assert_eq!(
        (f.engine_name(), f.get(5), f.get(6)),
        ("hmeh+filter", Some(6), None)
    );
    f.close().unwrap();
    let ix: Index<Hmeh> = Index::options().open_as(&path).unwrap();
    assert_eq!(ix.get(5), Some(6));
    drop(ix);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn bad_names_foreign_files_and_existing_pools_are_errors() {
    let path = scratch("bad");
    assert!(
        err_text(Index::options().engine("nope").create(&path)).contains("unknown index engine")
    );
    assert!(!path.exists(), "a refused create leaves no file");
    assert!(Index::open(&path).is_err(), "no such file");

    std::fs::write(&path, vec![0x5a; 1 << 20]).unwrap();
    let before = std::fs::read(&path).unwrap();
    assert!(Index::open(&path).is_err());
    assert!(Index::options().engine("rophi").open(&path).is_err());
    assert!(
        Index::options().create(&path).is_err(),
        "create never overwrites"
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "the foreign file is untouched"
    );
    std::fs::remove_file(&path).unwrap();

    // A store directory whose pool file is foreign.
    let dir = scratch("badstore");
    std::fs::create_dir_all(&dir).unwrap();
    let pool = dir.join("store.pool");
    std::fs::write(&pool, vec![0xa5; 1 << 20]).unwrap();
    let before = std::fs::read(&pool).unwrap();
    assert!(Store::open(&dir).is_err());
    assert_eq!(std::fs::read(&pool).unwrap(), before);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_second_writer_is_refused_and_read_only_opens_refuse_writes() {
    let path = scratch("lock");
    let ix = Index::options().engine("pass").create(&path).unwrap();
    ix.insert(1, 1).unwrap();
    assert!(Index::open(&path).is_err(), "one writer at a time");
    ix.close().unwrap();

    let ro = Index::options().read_only(true).open(&path).unwrap();
    assert_eq!(ro.get(1), Some(1));
    assert!(ro.insert(2, 2).is_err(), "a read-only index refuses writes");
    drop(ro);
    assert!(Index::options().read_only(true).create(&path).is_err());
    let ix = Index::open(&path).unwrap();
    assert_eq!((ix.len(), ix.get(2)), (1, None));
    ix.close().unwrap();
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_full_pool_is_out_of_space_and_the_index_stays_usable() {
    let path = scratch("full");
    let ix = Index::options()
        .engine("hmeh")
        .pool_size(4 << 20)
        .max_pool_size(4 << 20)
        .create(&path)
        .unwrap();
    let mut k = 0u64;
    let err = loop {
        match ix.insert(k, k) {
            Ok(true) => k += 1,
            Ok(false) => panic!("fresh key {k} reported present"),
            Err(e) => break e,
        }
        assert!(k < 10_000_000, "a 4 MiB pool never filled");
    };
    assert!(matches!(err, pmhash::Error::OutOfSpace(_)), "{err}");
    assert!(k > 1000, "only {k} keys fit");
    for probe in [0, k / 2, k - 1] {
        assert_eq!(ix.get(probe), Some(probe));
    }
    assert!(ix.remove(0).unwrap());
    ix.close().unwrap();
    assert_eq!(Index::open(&path).unwrap().len(), k - 1);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn the_store_rejects_oversized_keys_and_values_and_keeps_going() {
    let dir = scratch("store");
    let store = Store::options()
        .durability(Durability::Relaxed)
        .open(&dir)
        .unwrap();
    let big_key = vec![b'k'; pmhash::MAX_KEY + 1];
    assert!(err_text(store.put(&big_key, b"v")).contains("key"));
    let big_value = vec![0u8; pmhash::MAX_VALUE + 1];
    assert!(err_text(store.put(b"k", &big_value)).contains("value"));
    store
        .write_batch(&[(b"a", Some(b"1")), (b"b", Some(b"2")), (b"a", None)])
        .unwrap();
    assert!(store
        .write_batch(&[(b"c", Some(b"3")), (&big_key, Some(b"4"))])
        .is_err());
    assert_eq!(
        store.get(b"c").unwrap(),
        None,
        "a refused batch writes nothing"
    );
    assert!(store.insert(b"b", b"x").is_ok_and(|fresh| !fresh));
    assert!(store.update(b"b", b"3").unwrap());
    let mut buf = Vec::new();
    assert!(store.get_into(b"b", &mut buf).unwrap());
    assert_eq!(buf, b"3");
    // An oversized key is an error for every read, as for every write.
    assert!(store.get(&big_key).is_err());
    assert!(store.get_into(&big_key, &mut buf).is_err());
    store.sync().unwrap();
    assert_eq!(store.len(), 1);
    assert_eq!(store.check().unwrap(), 1);
    store.close().unwrap();
    let store = Store::open(&dir).unwrap();
    assert_eq!(
        store.scan(b"", None, 10).unwrap(),
        vec![(b"b".to_vec(), b"3".to_vec())]
    );
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_small_store_takes_small_logs() {
    let dir = scratch("small");
    let small = Store::options()
        .log_clusters(4)
        .log_file_size(256 << 10)
        .pool_size(16 << 20)
        .cache_bytes(0);
    let store = small.clone().open(&dir).unwrap();
    for i in 0..2000u32 {
        store.put(&i.to_be_bytes(), &[7u8; 100]).unwrap();
    }
    let stats = store.stats();
    assert!(
        stats.files <= 4 * 3,
        "{} log files for 4 clusters",
        stats.files
    );
    assert!(stats.log_bytes < 4 << 20, "{} log bytes", stats.log_bytes);
    store.close().unwrap();
    assert_eq!(small.open(&dir).unwrap().len(), 2000);
    std::fs::remove_dir_all(&dir).unwrap();

    let bad = scratch("badopts");
    assert!(err_text(Store::options().log_clusters(0).open(&bad)).contains("clusters"));
    assert!(err_text(Store::options().log_file_size(1000).open(&bad)).contains("extent"));
    let _ = std::fs::remove_dir_all(&bad);
}
