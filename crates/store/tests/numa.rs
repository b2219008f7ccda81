//! NUMA emulation and the RAF cache: with two emulated nodes, writes go to
//! the writer's own node's log (every write local), reads of another node's
//! entries count remote, with exact counters; a skewed get workload gets
//! RAF hits (and correct values, also right after updates), no cache means
//! no hits, and a write-heavy window turns the cache off until gets return.

use std::collections::BTreeMap;
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use engine::testkit::{mem_pool, test_pool_options, Rng};
use pmem::Mode;

use pmhash_store::{
    emulated_node, CreateOptions, GcMode, OpenOptions, Options, Store, StoreStats, LAYOUT,
};

type Job = Box<dyn FnOnce() + Send>;

/// A thread that runs jobs, on a known emulated node.
struct Worker {
    node: u32,
    tx: Option<Sender<Job>>,
    handle: Option<JoinHandle<()>>,
}

impl Worker {
    fn spawn() -> Worker {
        let (tx, rx) = channel::<Job>();
        let (ntx, nrx) = channel();
        let handle = std::thread::spawn(move || {
            // The store computes the emulated node the same way.
            ntx.send(emulated_node(2)).unwrap();
            for job in rx {
                job();
            }
        });
        Worker {
            node: nrx.recv().unwrap(),
            tx: Some(tx),
            handle: Some(handle),
        }
    }

    /// Runs `f` on this worker and waits for its result.
    fn run<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> R {
        let (rtx, rrx) = channel();
        self.tx
            .as_ref()
            .unwrap()
            .send(Box::new(move || {
                let _ = rtx.send(f());
            }))
            .unwrap();
        rrx.recv().expect("the worker's job panicked")
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// One live worker on node 0 and one on node 1. Threads are given their
/// emulated node by their thread index, which other tests' threads share,
/// so workers are started (and kept alive, so indices are not reused) until
/// both nodes are covered.
fn two_nodes() -> (Worker, Worker) {
    let mut spare = Vec::new();
    let mut by_node: [Option<Worker>; 2] = [None, None];
    for _ in 0..64 {
        let w = Worker::spawn();
        assert!(w.node < 2);
        let n = w.node as usize;
        if by_node[n].is_none() {
            by_node[n] = Some(w);
        } else {
            spare.push(w);
        }
        if by_node.iter().all(|w| w.is_some()) {
            break;
        }
    }
    drop(spare);
    let [a, b] = by_node;
    (
        a.expect("no thread on emulated node 0"),
        b.expect("no thread on emulated node 1"),
    )
}

fn opts(raf_bytes: u64) -> Options {
    Options {
        create: CreateOptions {
            pool_size: 8 << 20,
            clusters: 4,
            extent_size: 16 << 10,
            nodes: Some(2),
            ..Default::default()
        },
        open: OpenOptions {
            mode: Mode::Volatile,
            max_pool_size: 64 << 20,
            numa_emulate: Some(2),
            gc: GcMode::Manual,
            raf_bytes,
            raf_window: 1024,
            // Every get reads the log (or the RAF cache), as in the paper: an
            // 8-byte value kept in the point index would bypass both.
            inline_values: false,
            ..Default::default()
        },
    }
}

fn store(raf_bytes: u64, seed: u64) -> Arc<Store> {
    let o = opts(raf_bytes);
    let pool = mem_pool(&test_pool_options(
        LAYOUT,
        b"store-numa-tests",
        Mode::Volatile,
        o.create.pool_size,
        o.open.max_pool_size,
        seed,
    ));
    Arc::new(Store::open_pool(pool, o).unwrap())
}

fn key(tag: char, i: u32) -> Vec<u8> {
    format!("{tag}-{i:06}").into_bytes()
}

/// `(local_reads, remote_reads, local_writes, remote_writes)`.
fn counts(st: &StoreStats) -> (u64, u64, u64, u64) {
    (
        st.local_reads,
        st.remote_reads,
        st.local_writes,
        st.remote_writes,
    )
}

#[test]
fn writes_are_local_and_cross_node_reads_are_remote() {
    let (w0, w1) = two_nodes();
    let s = store(0, 1);
    assert_eq!(s.stats().nodes, 2);
    const N: u32 = 500;
    for (w, tag) in [(&w0, 'a'), (&w1, 'b')] {
        let s = s.clone();
        w.run(move || {
            for i in 0..N {
                s.put(&key(tag, i), &i.to_le_bytes()).unwrap();
            }
        });
    }
    let c0 = counts(&s.stats());
    assert_eq!(
        c0,
        (0, 0, 2 * N as u64, 0),
        "writes: every write goes to the writer's node"
    );
    // Node 0 reads its own keys: all local, exactly one count each.
    let s0 = s.clone();
    w0.run(move || {
        for i in 0..N {
            assert_eq!(
                s0.get(&key('a', i)).unwrap(),
                Some(i.to_le_bytes().to_vec())
            );
        }
    });
    let c1 = counts(&s.stats());
    assert_eq!(c1, (N as u64, 0, 2 * N as u64, 0), "own reads");
    // Node 0 reads node 1's keys: all remote.
    let s0 = s.clone();
    w0.run(move || {
        for i in 0..N {
            assert_eq!(
                s0.get(&key('b', i)).unwrap(),
                Some(i.to_le_bytes().to_vec())
            );
        }
    });
    let c2 = counts(&s.stats());
    assert_eq!(
        c2,
        (N as u64, N as u64, 2 * N as u64, 0),
        "reads of the other node's keys"
    );
    // Node 1 overwrites node 0's keys: the new entries are on node 1 (a
    // local write), so node 0 now reads them remotely and node 1 locally.
    let s1 = s.clone();
    w1.run(move || {
        for i in 0..N {
            assert!(s1.update(&key('a', i), &(i + 1).to_le_bytes()).unwrap());
        }
    });
    let c3 = counts(&s.stats());
    assert_eq!(c3.3, 0, "an overwrite from another node wrote remotely");
    assert_eq!(c3.2, 3 * N as u64);
    let s0 = s.clone();
    w0.run(move || {
        for i in 0..N {
            assert_eq!(
                s0.get(&key('a', i)).unwrap(),
                Some((i + 1).to_le_bytes().to_vec())
            );
        }
    });
    let c4 = counts(&s.stats());
    assert_eq!(
        (c4.0 - c3.0, c4.1 - c3.1),
        (0, N as u64),
        "node 0 reading node 1's newer entries"
    );
    let s1 = s.clone();
    w1.run(move || {
        for i in 0..N {
            s1.get(&key('a', i)).unwrap();
        }
    });
    let c5 = counts(&s.stats());
    assert_eq!(
        (c5.0 - c4.0, c5.1 - c4.1),
        (N as u64, 0),
        "node 1 reading its own entries"
    );
    // Deletes are writes too, and local.
    let s1 = s.clone();
    w1.run(move || {
        for i in 0..N / 2 {
            assert!(s1.delete(&key('a', i)).unwrap());
        }
    });
    let c6 = counts(&s.stats());
    assert_eq!((c6.2 - c5.2, c6.3), (N as u64 / 2, 0));
    s.check().unwrap();
}

/// A skewed get workload gets RAF hits, every value right, also right
/// after updates of the hottest keys; without a cache there are no hits.
fn skewed_gets(raf_bytes: u64) -> StoreStats {
    let (w0, w1) = two_nodes();
    let s = store(raf_bytes, 2 + raf_bytes);
    const N: u32 = 1000;
    let mut model = BTreeMap::new();
    // Half the keys written on each node, so gets are local and remote.
    for (w, part) in [(&w0, 0u32), (&w1, 1)] {
        let s = s.clone();
        let kv: Vec<(Vec<u8>, Vec<u8>)> = (0..N)
            .filter(|i| i % 2 == part)
            .map(|i| (key('k', i), format!("value {i}").into_bytes()))
            .collect();
        model.extend(kv.iter().cloned());
        w.run(move || {
            for (k, v) in kv {
                s.put(&k, &v).unwrap();
            }
        });
    }
    let model = Arc::new(model);
    let run_gets = |w: &Worker, seed: u64, model: Arc<BTreeMap<Vec<u8>, Vec<u8>>>| {
        let s = s.clone();
        w.run(move || {
            let mut rng = Rng::new(seed);
            let mut buf = Vec::new();
            for _ in 0..40_000 {
                let i = rng.skewed(N as u64) as u32;
                let k = key('k', i);
                assert!(s.get_into(&k, &mut buf).unwrap());
                assert_eq!(Some(&buf), model.get(&k), "get of key {i}");
            }
        })
    };
    run_gets(&w0, 1, model.clone());
    run_gets(&w1, 2, model.clone());
    let mid = s.stats();
    // Update the hottest keys from the other node; the cache must follow.
    let mut model2 = (*model).clone();
    for i in 0..20u32 {
        let v = format!("new value {i}").into_bytes();
        model2.insert(key('k', i), v.clone());
        let (s, k) = (s.clone(), key('k', i));
        w1.run(move || s.put(&k, &v).unwrap());
    }
    let model2 = Arc::new(model2);
    run_gets(&w0, 3, model2.clone());
    // A delete drops the cached item.
    let (s0, k0) = (s.clone(), key('k', 0));
    w1.run(move || assert!(s0.delete(&k0).unwrap()));
    let (s0, k0) = (s.clone(), key('k', 0));
    w0.run(move || {
        for _ in 0..100 {
            assert_eq!(
                s0.get(&k0).unwrap(),
                None,
                "a deleted key came from the cache"
            );
        }
    });
    let end = s.stats();
    assert!(end.raf_hits >= mid.raf_hits);
    s.check().unwrap();
    end
}

#[test]
fn raf_cache_hits_on_a_skewed_workload() {
    let st = skewed_gets(1 << 20);
    assert!(st.raf_items > 0, "{st:?}");
    assert!(st.raf_hits > 0, "a skewed workload got no RAF hits: {st:?}");
    // A hit reads no log entry, so hits and counted reads together cover
    // the gets (4 × 40,000 + 100; misses each count one read).
    let gets = 3 * 40_000 + 100;
    assert!(st.local_reads + st.remote_reads < gets, "{st:?}");
    assert!(
        st.local_reads + st.remote_reads + st.raf_hits >= gets - 100,
        "{st:?}"
    );
}

#[test]
fn no_raf_cache_means_no_hits() {
    let st = skewed_gets(0);
    assert_eq!(st.raf_hits, 0, "{st:?}");
    assert_eq!(st.raf_items, 0, "{st:?}");
    assert!(!st.raf_enabled, "{st:?}");
    // Every get that found a key read the log once.
    let gets = 3 * 40_000;
    assert_eq!(st.local_reads + st.remote_reads, gets, "{st:?}");
    assert!(st.remote_reads > 0 && st.local_reads > 0, "{st:?}");
}

#[test]
fn write_heavy_windows_turn_the_cache_off_and_gets_turn_it_back_on() {
    let s = store(1 << 20, 9);
    for i in 0..500u32 {
        s.put(&key('w', i), &[1; 16]).unwrap();
    }
    // Warm the cache with skewed gets.
    let mut rng = Rng::new(5);
    for _ in 0..20_000 {
        s.get(&key('w', rng.skewed(500) as u32)).unwrap();
    }
    assert!(s.stats().raf_enabled, "{:?}", s.stats());
    // Write-heavy: 100 puts per get, over many windows.
    for round in 0..200u32 {
        for i in 0..100u32 {
            s.put(&key('w', (round * 100 + i) % 500), &[2; 16]).unwrap();
        }
        s.get(&key('w', 0)).unwrap();
    }
    assert!(
        !s.stats().raf_enabled,
        "write-heavy windows left the cache on: {:?}",
        s.stats()
    );
    // Gets only, skewed again: the cache comes back and hits.
    let before = s.stats().raf_hits;
    for _ in 0..40_000 {
        let i = rng.skewed(500) as u32;
        assert_eq!(
            s.get(&key('w', i)).unwrap().as_deref(),
            Some(&[2u8; 16][..])
        );
    }
    let st = s.stats();
    assert!(
        st.raf_enabled,
        "a skewed read-only phase left the cache off: {st:?}"
    );
    assert!(st.raf_hits > before, "{st:?}");
}
