//! Three `pmhash serve` shards behind twemproxy (Debian's `nutcracker`),
//! run by `scripts/cluster.sh` as a user would: keys loaded through the
//! proxy spread evenly over the shards and read back; a shard killed with
//! SIGKILL leaves the other shards' keys served without a failed request,
//! and comes back with every write it acknowledged (strict durability).
//! `cluster.sh` waits for each shard to open its store before it starts
//! the proxy. `docs/scale-out.md` describes the setup.

// The harness is shared with the other serve tests; this uses part of it.
#![allow(dead_code)]

include!("support/servekit.rs");

const KEYS: usize = 100_000;
const SHARDS: usize = 3;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `scripts/cluster.sh ARGS...` and fails the test on a non-zero exit.
fn cluster(args: &[&str]) {
    cluster_with(Path::new(env!("CARGO_BIN_EXE_pmhash")), args);
}

/// [`cluster`] with `bin` started as each shard's `pmhash`.
fn cluster_with(bin: &Path, args: &[&str]) {
    let out = Command::new("bash")
        .arg(repo().join("scripts/cluster.sh"))
        .args(args)
        .env("PMHASH", bin)
        // A shard that never opens fails the test in a minute, not five.
        .env("START_TIMEOUT", "60")
        .stdin(Stdio::null())
        .output()
        .expect("run scripts/cluster.sh");
    assert!(
        out.status.success(),
        "cluster.sh {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A cluster's directory with free ports for the proxy, its stats and up
/// to `ports.len()` shards; `cluster.sh down` when dropped, also when the
/// test fails.
struct Cluster {
    dir: TempDir,
    proxy: u16,
    stats: u16,
    ports: Vec<u16>,
}

impl Cluster {
    fn new(name: &str, shards: usize) -> Cluster {
        assert!(
            Command::new("nutcracker").arg("--version").output().is_ok(),
            "this test needs twemproxy: apt-get install nutcracker (.ci/run installs it)"
        );
        let dir = TempDir::new(name);
        std::fs::create_dir_all(dir.path()).unwrap();
        Cluster {
            dir,
            proxy: free_port(),
            stats: free_port(),
            ports: (0..shards).map(|_| free_port()).collect(),
        }
    }

    fn path(&self) -> &str {
        self.dir.path().to_str().unwrap()
    }

    /// Writes `cluster.conf` naming the first `n` shards, then runs
    /// `cluster.sh CMD` (`up` or `reload`).
    fn run_with(&self, n: usize, cmd: &str) {
        self.run_as(Path::new(env!("CARGO_BIN_EXE_pmhash")), n, cmd);
    }

    /// [`run_with`](Self::run_with), with `bin` as each shard's `pmhash`.
    fn run_as(&self, bin: &Path, n: usize, cmd: &str) {
        let mut conf = format!(
            "proxy 127.0.0.1:{}\nstats 127.0.0.1:{}\n",
            self.proxy, self.stats
        );
        for (i, p) in self.ports[..n].iter().enumerate() {
            let data = self.dir.path().join(format!("data{i}"));
            conf += &format!("server 127.0.0.1:{p} {}\n", data.display());
        }
        conf += "serve-args --durability strict\n";
        std::fs::write(self.dir.path().join("cluster.conf"), conf).unwrap();
        cluster_with(bin, &[cmd, self.path()]);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(repo().join("scripts/cluster.sh"))
            .args(["down", self.path()])
            .status();
    }
}

/// SETs keys `0..n` through the proxy, checking every reply.
fn load(proxy: u16, n: usize) {
    let mut c = Conn::connect(proxy);
    let sets: Vec<Vec<Vec<u8>>> = (0..n)
        .map(|i| vec![b"SET".to_vec(), key(i), value(i)])
        .collect();
    for (i, r) in pipeline(&mut c, &sets).into_iter().enumerate() {
        assert_eq!(r, V::Simple("OK".into()), "SET of key {i}");
    }
}

fn key(i: usize) -> Vec<u8> {
    format!("user:{i:06}").into_bytes()
}

fn value(i: usize) -> Vec<u8> {
    format!("value-{}", i * 7919).into_bytes()
}

/// Sends `reqs` in pipelined batches and returns the replies in order.
fn pipeline(c: &mut Conn, reqs: &[Vec<Vec<u8>>]) -> Vec<V> {
    let mut replies = Vec::with_capacity(reqs.len());
    for batch in reqs.chunks(500) {
        let mut wire = Vec::new();
        for r in batch {
            let args: Vec<&[u8]> = r.iter().map(Vec::as_slice).collect();
            Conn::encode(&mut wire, &args);
        }
        c.send_raw(&wire).expect("send a batch");
        for _ in batch {
            replies.push(c.read().expect("a reply"));
        }
    }
    replies
}

/// Every key a shard holds, by SCAN straight to it.
fn shard_keys(port: u16) -> Vec<Vec<u8>> {
    let mut c = Conn::connect(port);
    let mut cursor = b"0".to_vec();
    let mut keys = Vec::new();
    loop {
        match c.cmd(&[b"SCAN", &cursor, b"COUNT", b"10000"]) {
            V::Array(mut parts) if parts.len() == 2 => {
                let V::Array(found) = parts.pop().unwrap() else {
                    panic!("SCAN keys")
                };
                for k in found {
                    let V::Bulk(k) = k else { panic!("a SCAN key") };
                    keys.push(k);
                }
                let V::Bulk(next) = parts.pop().unwrap() else {
                    panic!("SCAN cursor")
                };
                if next == b"0" {
                    return keys;
                }
                cursor = next;
            }
            other => panic!("SCAN: {other:?}"),
        }
    }
}

fn index_of(k: &[u8]) -> usize {
    std::str::from_utf8(&k[5..]).unwrap().parse().unwrap()
}

#[test]
fn shards_behind_twemproxy_spread_keys_and_survive_a_kill() {
    let cl = Cluster::new("scale-out", SHARDS);
    let (proxy, ports, d) = (cl.proxy, cl.ports.clone(), cl.path());
    cl.run_with(SHARDS, "up");
    load(proxy, KEYS);
    let mut c = Conn::connect(proxy);

    // Each shard holds its share, within 15% of an even split.
    let held: Vec<Vec<Vec<u8>>> = ports.iter().map(|&p| shard_keys(p)).collect();
    let split: Vec<usize> = held.iter().map(Vec::len).collect();
    assert_eq!(split.iter().sum::<usize>(), KEYS, "split {split:?}");
    let even = KEYS / SHARDS;
    for (n, &h) in split.iter().enumerate() {
        assert!(
            h.abs_diff(even) * 100 <= even * 15,
            "shard {n} holds {h} of {KEYS} keys (split {split:?})"
        );
    }
    eprintln!("split over {SHARDS} shards: {split:?}");

    // Every key reads back through the proxy.
    let gets: Vec<Vec<Vec<u8>>> = (0..KEYS).map(|i| vec![b"GET".to_vec(), key(i)]).collect();
    for (i, r) in pipeline(&mut c, &gets).into_iter().enumerate() {
        assert_eq!(r, V::Bulk(value(i)), "GET of key {i} through the proxy");
    }

    // The Redis tools through the proxy: redis-cli, and redis-benchmark
    // with and without pipelining (its keys are `key:…`, apart from ours).
    let cli = |args: &[&str]| {
        let out = Command::new("redis-cli")
            .args(["-p", &proxy.to_string()])
            .args(args)
            .output()
            .expect("run redis-cli");
        assert!(out.status.success(), "redis-cli {args:?}: {}", out.status);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(cli(&["SET", "tool:a", "1"]), "OK");
    assert_eq!(cli(&["INCRBY", "tool:a", "41"]), "42");
    assert_eq!(
        cli(&["MGET", "tool:a", "user:000007"]),
        format!(
            "42
{}",
            String::from_utf8(value(7)).unwrap()
        )
    );
    for pipeline in ["1", "16"] {
        let out = Command::new("redis-benchmark")
            .args(["-p", &proxy.to_string(), "-t", "set,get", "-n", "20000"])
            .args(["-r", "100000", "-c", "20", "-P", pipeline, "-q"])
            .output()
            .expect("run redis-benchmark");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "redis-benchmark -P {pipeline}: {text}"
        );
        for t in ["SET: ", "GET: "] {
            assert!(
                text.lines()
                    .any(|l| l.contains(t) && l.contains("requests per second")),
                "redis-benchmark -P {pipeline} did not finish {t}: {text}"
            );
        }
    }

    // Shard 1 crashes. Clients of the other shards' keys are served
    // throughout: SETs and GETs of their keys for 3 s, none failing.
    cluster(&["kill", d, "1"]);
    let live: Vec<usize> = held[0]
        .iter()
        .chain(&held[2])
        .map(|k| index_of(k))
        .collect();
    let mut served = 0;
    let until = Instant::now() + Duration::from_secs(3);
    let mut i = 0;
    while Instant::now() < until {
        let k = live[i % live.len()];
        // Same values: the shard's copy stays what shard 1's restart checks.
        assert_eq!(
            c.cmd(&[b"SET", &key(k), &value(k)]),
            V::Simple("OK".into()),
            "SET of live key {k} while shard 1 is down"
        );
        assert_eq!(
            c.cmd(&[b"GET", &key(k)]),
            V::Bulk(value(k)),
            "GET of live key {k}"
        );
        served += 2;
        i += 7919;
    }
    // A key of the dead shard gets an answer, not a hang: an error until
    // the proxy ejects the shard, then the next shard's (absent) value.
    let mut other = Conn::connect(proxy);
    other
        .w
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let dead = index_of(&held[1][0]);
    match other.cmd(&[b"GET", &key(dead)]) {
        V::Err(_) | V::Nil => {}
        got => panic!("GET of a key of the killed shard: {got:?}"),
    }
    eprintln!("{served} requests to the live shards' keys served while shard 1 was down");

    // Back with every write it acknowledged: read straight from it.
    cluster(&["start", d, "1"]);
    let mut s1 = Conn::connect(ports[1]);
    let back: Vec<Vec<Vec<u8>>> = held[1]
        .iter()
        .map(|k| vec![b"GET".to_vec(), k.clone()])
        .collect();
    for (k, r) in held[1].iter().zip(pipeline(&mut s1, &back)) {
        assert_eq!(r, V::Bulk(value(index_of(k))), "shard 1 lost {k:?}");
    }

    // Once the proxy tries it again, every key reads back through it.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut c = Conn::connect(proxy);
        let bad = pipeline(&mut c, &gets)
            .into_iter()
            .enumerate()
            .filter(|(i, r)| *r != V::Bulk(value(*i)))
            .count();
        if bad == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{bad} keys still read wrong through the proxy 20 s after shard 1 came back"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Adding a third shard: ketama remaps about a third of the keys to it,
/// which the proxy then cannot find; `scripts/rebalance.py` moves exactly
/// those, and afterwards the shards hold every key once and each reads
/// back through the proxy.
#[test]
fn adding_a_shard_moves_the_remapped_keys_and_loses_none() {
    const N: usize = 30_000;
    let cl = Cluster::new("rebalance", 3);
    let (proxy, ports, d) = (cl.proxy, cl.ports.clone(), cl.path());
    cl.run_with(2, "up");
    load(proxy, N);
    cl.run_with(3, "reload");
    let gets: Vec<Vec<Vec<u8>>> = (0..N).map(|i| vec![b"GET".to_vec(), key(i)]).collect();
    let mut c = Conn::connect(proxy);
    let remapped = pipeline(&mut c, &gets)
        .iter()
        .filter(|r| **r == V::Nil)
        .count();
    assert!(
        (N / 5..N / 2).contains(&remapped),
        "adding a third shard remapped {remapped} of {N} keys (about a third expected)"
    );

    let out = Command::new("python3")
        .arg(repo().join("scripts/rebalance.py"))
        .args([d, "--old", "0,1"])
        .output()
        .expect("run scripts/rebalance.py");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "rebalance.py: {}\n{report}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{report}");
    assert!(
        report.contains(&format!("{remapped} moved (")),
        "rebalance.py moved other than the {remapped} remapped keys: {report}"
    );
    let held: Vec<usize> = ports.iter().map(|&p| shard_keys(p).len()).collect();
    assert_eq!(
        held.iter().sum::<usize>(),
        N,
        "split after the move {held:?}"
    );
    assert_eq!(held[2], remapped, "the new shard holds what moved");
    for (i, r) in pipeline(&mut c, &gets).into_iter().enumerate() {
        assert_eq!(r, V::Bulk(value(i)), "GET of key {i} after the move");
    }
}

/// `pmhash serve` binds its address before it opens its store, and the
/// kernel accepts connections from then on: `cluster.sh up` must wait for
/// each shard's "listening" line, printed once its store is open, not for
/// its port, or the proxy it starts next forwards to a shard still opening
/// and, after its 2 s timeout, ejects it. A shard that takes 1.5 s to open
/// (`support/slow_open_serve.py`, which binds at once and prints the line
/// and answers only once open) has opened when `up` returns; after `kill`,
/// `start` waits the same way.
#[test]
fn up_and_start_wait_until_each_shard_has_opened_its_store() {
    let cl = Cluster::new("slow-open", 2);
    let fake = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/slow_open_serve.py");
    let opened = |i: usize| cl.dir.path().join(format!("data{i}/opened"));
    let t0 = Instant::now();
    cl.run_as(&fake, 2, "up");
    let took = t0.elapsed();
    for i in 0..2 {
        assert!(
            opened(i).exists(),
            "cluster.sh up returned after {took:?}, before shard {i} opened its store"
        );
    }
    std::fs::remove_file(opened(1)).unwrap();
    cluster_with(&fake, &["kill", cl.path(), "1"]);
    cluster_with(&fake, &["start", cl.path(), "1"]);
    assert!(
        opened(1).exists(),
        "cluster.sh start returned before shard 1 opened its store"
    );
}
