//! Times clean opens of a large pool, the way the tools open it.
//!
//! `cargo run --release -p pmhash-cli --example open_time -- ENGINE KEYS OPENS DIR`
//!
//! ENGINE is `level`, `hmeh`, `pass`, `pass-var` (each through
//! `engine::open_file`) or `store-hash` (a whole `Store::open` with a
//! persistent hmeh index). The pool (in DIR, e.g. /dev/shm/x) is built with
//! KEYS keys if it does not exist, then closed cleanly and opened OPENS
//! times; each open's milliseconds, then min and median, are printed.

use std::path::Path;
use std::time::Instant;

use engine::{EngineConfig, EngineKind, EngineSpec};

fn spec(name: &str) -> EngineSpec {
    match name {
        "level" => level::spec(),
        "hmeh" => hmeh::spec(),
        "pass" => pass::spec(),
        "pass-var" => pass::spec_var(),
        other => panic!("unknown engine {other}"),
    }
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 5 {
        eprintln!("usage: open_time ENGINE KEYS OPENS DIR");
        std::process::exit(2);
    }
    let (name, keys, opens) = (
        a[1].as_str(),
        a[2].parse::<u64>().expect("KEYS"),
        a[3].parse::<usize>().expect("OPENS"),
    );
    let dir = Path::new(&a[4]);
    std::fs::create_dir_all(dir).expect("DIR");
    let mut ms = Vec::new();
    if name == "store-hash" {
        let opts = store::Options {
            create: store::CreateOptions {
                index: store::IndexKind::Hash(hmeh::spec()),
                pool_size: 1 << 30,
                ..Default::default()
            },
            open: store::OpenOptions {
                expected_keys: keys,
                max_pool_size: 64 << 30,
                ..Default::default()
            },
        };
        let sdir = dir.join("store-hash");
        if !sdir.exists() {
            let s = store::Store::open(&sdir, opts.clone()).expect("create");
            for k in 0..keys {
                s.put(&k.to_le_bytes(), &k.to_le_bytes()).expect("put");
            }
            s.close().expect("close");
        }
        for _ in 0..opens {
            let t = Instant::now();
            let s = store::Store::open(&sdir, opts.clone()).expect("open");
            ms.push(t.elapsed().as_secs_f64() * 1e3);
            assert_eq!(s.len(), keys);
            s.close().expect("close");
        }
    } else {
        let sp = spec(name);
        let EngineKind::Persistent {
            layout,
            create,
            open,
        } = sp.kind
        else {
            unreachable!()
        };
        let path = dir.join(format!("{name}.pool"));
        let cfg = EngineConfig {
            initial_capacity: keys,
            threads: 1,
            ..Default::default()
        };
        let popts = pmem::PoolOptions {
            mode: pmem::Mode::Mapped,
            size: 64 << 20,
            max_size: 64 << 30,
            layout: layout.into(),
            ..Default::default()
        };
        if !path.exists() {
            let pool = std::sync::Arc::new(pmem::Pool::create(&path, &popts).expect("pool"));
            let e = create(pool, &cfg).expect("create");
            for k in 0..keys {
                e.insert(k.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1, k)
                    .expect("insert");
            }
            e.close().expect("close");
        }
        for _ in 0..opens {
            let t = Instant::now();
            let (_, e) = engine::open_file(open, &path, &popts, &cfg).expect("open");
            ms.push(t.elapsed().as_secs_f64() * 1e3);
            assert_eq!(e.len(), keys);
            e.close().expect("close");
        }
    }
    for m in &ms {
        print!("{m:.1} ");
    }
    ms.sort_by(f64::total_cmp);
    println!(
        "\n{name} {keys} keys: min {:.1} ms, median {:.1} ms over {} opens",
        ms[0],
        ms[ms.len() / 2],
        ms.len()
    );
}
