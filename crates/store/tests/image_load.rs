//! A clean reopen sizes the DRAM point index for the image's keys before
//! loading them (and reads the records in place): grown while the image loads, every shard's replaced
//! tables would wait for the maintenance thread (which starts after the
//! open), and the index would briefly take twice its DRAM.

mod common;

use common::{small_opts, verify, Model};
use engine::testkit::{mem_pool, test_pool_options};
use pmem::{Mode, Pool};
use pmhash_store::{Store, LAYOUT};
use std::sync::Arc;

#[test]
fn a_clean_reopen_loads_the_image_without_growing_the_index() {
    // Created for no keys (small_opts: expected_keys 0): the first run's
    // index grows as the keys arrive.
    let opts = small_opts();
    let pool = mem_pool(&test_pool_options(
        LAYOUT,
        b"store-image-test",
        Mode::Volatile,
        opts.create.pool_size,
        opts.open.max_pool_size,
        3,
    ));
    let s = Store::open_pool(pool.clone(), opts.clone()).unwrap();
    let mut m = Model::new();
    for i in 0..20_000u64 {
        let (k, v) = (i.to_be_bytes().to_vec(), (i * 7).to_le_bytes().to_vec());
        s.put(&k, &v).unwrap();
        m.insert(k, v);
    }
    s.put(b"a longer key than eight bytes", b"and its value")
        .unwrap();
    m.insert(
        b"a longer key than eight bytes".to_vec(),
        b"and its value".to_vec(),
    );
    assert!(
        s.stats().structural_changes > 0,
        "the first run's index never grew"
    );
    s.close().unwrap();
    let p2 = Arc::new(Pool::from_image(pool.image(), Mode::Volatile).unwrap());
    let s2 = Store::open_pool(p2, opts).unwrap();
    let st = s2.stats();
    assert_eq!(st.opened_from, pmhash_store::OpenedFrom::Image);
    // Sized for the image's count, a shard that draws more than its share
    // of the keys may still grow once (39 of 1,024 here); grown from
    // nothing, the shards were rebuilt 4,046 times.
    assert!(
        st.structural_changes <= 64,
        "the index grew while the image loaded: {st:?}"
    );
    verify(&s2, &m, "clean reopen");
}
