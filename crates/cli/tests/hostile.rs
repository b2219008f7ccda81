//! `pmhash serve` against hostile clients and the features ordinary clients
//! expect: each test drives the real binary over TCP and checks that no
//! request stops the server, that memory stays within the documented
//! bounds (measured as the server's RSS), and that the other clients are
//! served meanwhile. `docs/serve.md` states the bounds these tests check.

// The harness is shared with tests/serve.rs; each file uses part of it.
#![allow(dead_code)]

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

include!("support/servekit.rs");

const MIB: u64 = 1 << 20;

fn is_err(v: &V, part: &str) -> bool {
    matches!(v, V::Err(e) if e.contains(part))
}

/// PINGs from another connection while `busy` is set; returns the slowest
/// round trip.
fn pinger(port: u16, busy: Arc<AtomicBool>) -> std::thread::JoinHandle<Duration> {
    std::thread::spawn(move || {
        let mut c = Conn::connect(port);
        let mut worst = Duration::ZERO;
        while busy.load(Ordering::SeqCst) {
            let t = Instant::now();
            assert_eq!(c.cmd(&[b"PING"]), V::Simple("PONG".into()));
            worst = worst.max(t.elapsed());
            std::thread::sleep(Duration::from_millis(5));
        }
        worst
    })
}

#[test]
fn a_pattern_of_a_hundred_thousand_stars_does_not_stop_the_server() {
    let dir = TempDir::new("stars");
    let srv = Server::start(dir.path(), &[]);
    let mut c = Conn::connect(srv.port);
    assert_eq!(c.cmd(&[b"SET", b"key", b"v"]), V::Simple("OK".into()));
    let stars = vec![b'*'; 100_000];
    let got = c.cmd(&[b"SCAN", b"0", b"MATCH", &stars]);
    assert_eq!(got, V::Array(vec![bulk("0"), V::Array(vec![bulk("key")])]));
    let mut miss = stars.clone();
    miss.push(b'x');
    assert_eq!(c.cmd(&[b"CONFIG", b"GET", &miss]), V::Array(vec![]));
    assert_eq!(
        Conn::connect(srv.port).cmd(&[b"PING"]),
        V::Simple("PONG".into())
    );
}

#[test]
fn a_backtracking_pattern_costs_pattern_times_key_and_others_are_served() {
    let dir = TempDir::new("backtrack");
    let srv = Server::start(dir.path(), &[]);
    let mut c = Conn::connect(srv.port);
    let long_a = vec![b'a'; 60];
    assert_eq!(c.cmd(&[b"SET", &long_a, b"v"]), V::Simple("OK".into()));
    let busy = Arc::new(AtomicBool::new(true));
    let ping = pinger(srv.port, busy.clone());
    let t = Instant::now();
    for _ in 0..20 {
        let got = c.cmd(&[
            b"SCAN",
            b"0",
            b"MATCH",
            b"*a*a*a*a*a*a*a*a*a*a*a*a*b",
            b"COUNT",
            b"100",
        ]);
        assert_eq!(got, V::Array(vec![bulk("0"), V::Array(vec![])]));
    }
    let took = t.elapsed();
    busy.store(false, Ordering::SeqCst);
    let worst = ping.join().expect("the pinger");
    assert!(took < Duration::from_secs(2), "20 SCANs took {took:?}");
    assert!(worst < Duration::from_secs(1), "a PING waited {worst:?}");
}

#[test]
fn a_reply_is_bounded_while_it_is_built() {
    let dir = TempDir::new("amplify");
    let srv = Server::start(dir.path(), &[]);
    let mut c = Conn::connect(srv.port);
    let big = vec![b'v'; 1 << 20];
    assert_eq!(c.cmd(&[b"SET", b"big", &big]), V::Simple("OK".into()));
    let before = srv.rss();
    // 26 KB of request naming 1 MiB 3,000 times.
    let mut args: Vec<&[u8]> = vec![b"MGET"];
    args.extend(std::iter::repeat_n(&b"big"[..], 3000));
    let got = c.cmd(&args);
    assert!(is_err(&got, "client output limit"), "{got:?}");
    // The same over RANGE: 100 values of 1 MiB is over the 64 MiB limit.
    for i in 0..100 {
        let k = format!("r:{i:03}");
        assert_eq!(c.cmd(&[b"SET", k.as_bytes(), &big]), V::Simple("OK".into()));
    }
    let got = c.cmd(&[b"RANGE", b"r:", b"r;", b"LIMIT", b"1000000"]);
    assert!(is_err(&got, "client output limit"), "{got:?}");
    let grew = srv.rss().saturating_sub(before);
    // The limit is 64 MiB; the store's own pages for the 100 MiB written
    // count too.
    assert!(grew < 400 * MIB, "RSS grew by {} MiB", grew / MIB);
    // What fits is served, and the connection goes on.
    match c.cmd(&[b"RANGE", b"r:", b"r;", b"LIMIT", b"10"]) {
        V::Array(items) => assert_eq!(items.len(), 20),
        other => panic!("RANGE LIMIT 10: {other:?}"),
    }
    match c.cmd(&[b"MGET", b"big", b"big", b"nope"]) {
        V::Array(items) => assert_eq!(items.len(), 3),
        other => panic!("MGET: {other:?}"),
    }
}

/// An MGET whose reply cannot fit is refused from its entries' sizes,
/// not after copying 64 MiB of values: it costs less than serving one
/// that fits a third of that.
#[test]
fn an_oversized_mget_is_refused_before_its_reply_is_built() {
    let dir = TempDir::new("mget-size");
    let srv = Server::start(dir.path(), &[]);
    let mut c = Conn::connect(srv.port);
    let big = vec![b'v'; 1 << 20];
    assert_eq!(c.cmd(&[b"SET", b"big", &big]), V::Simple("OK".into()));
    let time = |c: &mut Conn, n: usize| {
        let mut args: Vec<&[u8]> = vec![b"MGET"];
        args.extend(std::iter::repeat_n(&b"big"[..], n));
        (0..5)
            .map(|_| {
                let t = Instant::now();
                let got = c.cmd(&args);
                (t.elapsed(), got)
            })
            .min_by_key(|(t, _)| *t)
            .unwrap()
    };
    let (served, got) = time(&mut c, 20);
    assert!(matches!(&got, V::Array(v) if v.len() == 20), "MGET x20");
    let (refused, got) = time(&mut c, 3000);
    assert!(is_err(&got, "client output limit"), "{got:?}");
    assert!(
        refused * 2 < served,
        "refusing 3000 x 1 MiB took {refused:?}, serving 20 x 1 MiB {served:?}"
    );
}

#[test]
fn unfinished_requests_are_bounded_across_connections() {
    let dir = TempDir::new("unfinished");
    let srv = Server::start(dir.path(), &["--maxmemory-clients", "32mb"]);
    let mut good = Conn::connect(srv.port);
    assert_eq!(good.cmd(&[b"SET", b"k", b"v"]), V::Simple("OK".into()));
    let before = srv.rss();
    let arg = {
        let mut a = format!("${}\r\n", 1 << 20).into_bytes();
        a.resize(a.len() + (1 << 20), b'x');
        a.extend_from_slice(b"\r\n");
        a
    };
    let mut attackers = Vec::new();
    let mut refused = 0;
    for _ in 0..16 {
        let mut a = Conn::connect(srv.port);
        let mut sent_all = a.send_raw(b"*100\r\n").is_ok();
        // 24 finished arguments of 1 MiB, and the request never ends.
        for _ in 0..24 {
            if a.send_raw(&arg).is_err() {
                sent_all = false;
                break;
            }
        }
        if !sent_all {
            refused += 1;
        }
        attackers.push(a);
        assert_eq!(good.cmd(&[b"GET", b"k"]), bulk("v"));
    }
    // Each held connection either holds its request or was told why it is
    // closed.
    std::thread::sleep(Duration::from_millis(300));
    for a in &mut attackers {
        a.w.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        if let Ok(V::Err(e)) = a.read() {
            assert!(e.contains("client memory limit"), "{e}");
            refused += 1;
        }
    }
    let grew = srv.rss().saturating_sub(before);
    assert!(refused >= 10, "only {refused} of 16 attackers were refused");
    assert!(
        grew < 100 * MIB,
        "RSS grew by {} MiB with a 32 MiB budget",
        grew / MIB
    );
    let info = cli(srv.port, &["info", "stats"]);
    let closed: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("client_query_buffer_limit_disconnections:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("the disconnections in INFO stats");
    assert!(closed >= 10, "{info}");
    assert_eq!(good.cmd(&[b"PING"]), V::Simple("PONG".into()));
}

#[test]
fn a_client_that_never_reads_has_at_most_the_soft_limit_queued() {
    let dir = TempDir::new("noread");
    let srv = Server::start(dir.path(), &[]);
    let mut c = Conn::connect(srv.port);
    let big = vec![b'v'; 1 << 20];
    assert_eq!(c.cmd(&[b"SET", b"big", &big]), V::Simple("OK".into()));
    let mut sink = Conn::connect(srv.port);
    let mut wire = Vec::new();
    Conn::encode(&mut wire, &[b"CLIENT", b"SETNAME", b"sink"]);
    for _ in 0..200 {
        Conn::encode(&mut wire, &[b"GET", b"big"]);
    }
    sink.send_raw(&wire).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let list = match c.cmd(&[b"CLIENT", b"LIST"]) {
        V::Bulk(b) => String::from_utf8(b).unwrap(),
        other => panic!("CLIENT LIST: {other:?}"),
    };
    let line = list
        .lines()
        .find(|l| l.contains(" name=sink "))
        .unwrap_or_else(|| panic!("no sink in {list}"));
    let omem: u64 = line
        .split(' ')
        .find_map(|f| f.strip_prefix("omem="))
        .and_then(|v| v.parse().ok())
        .expect("omem");
    // The soft limit (4 MiB) plus the one reply that passed it.
    assert!(omem <= 5 * MIB + 64 * 1024, "omem {omem}: {line}");
    assert!(omem > 0, "{line}");
    assert_eq!(c.cmd(&[b"PING"]), V::Simple("PONG".into()));
}

#[test]
fn maxclients_fits_the_descriptor_limit_and_no_connection_hangs() {
    let dir = TempDir::new("fds");
    let log = dir.path().with_extension("log");
    let _ = std::fs::remove_file(&log);
    let srv = Server::start_wrapped(dir.path(), &[], Some(("ulimit -n 256", &log)));
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    assert!(
        said.contains("maxclients lowered from 10000"),
        "stderr: {said:?}"
    );
    let max: u64 = match Conn::connect(srv.port).cmd(&[b"CONFIG", b"GET", b"maxclients"]) {
        V::Array(kv) if kv.len() == 2 => match &kv[1] {
            V::Bulk(b) => String::from_utf8_lossy(b).parse().unwrap(),
            other => panic!("{other:?}"),
        },
        other => panic!("CONFIG GET maxclients: {other:?}"),
    };
    assert!(max < 256, "maxclients {max} with 256 descriptors");
    let (mut served, mut refused) = (0, 0);
    let mut held = Vec::new();
    for i in 0..400 {
        let s = TcpStream::connect(("127.0.0.1", srv.port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut c = Conn {
            r: BufReader::new(s.try_clone().unwrap()),
            w: s,
        };
        c.send(&[b"PING"]).unwrap();
        match c.read() {
            Ok(V::Simple(p)) if p == "PONG" => served += 1,
            Ok(V::Err(e)) if e.contains("max number of clients") => refused += 1,
            other => panic!("connection {i}: neither served nor refused: {other:?}"),
        }
        held.push(c);
    }
    assert_eq!(served + refused, 400);
    assert!(
        served as u64 >= max - 1,
        "served {served} of maxclients {max}"
    );
    assert!(refused > 0);
}

#[test]
fn decrby_the_least_integer_is_an_overflow_error() {
    let dir = TempDir::new("decrby");
    let srv = Server::start(dir.path(), &[]);
    let mut c = Conn::connect(srv.port);
    assert_eq!(c.cmd(&[b"SET", b"n", b"5"]), V::Simple("OK".into()));
    let got = c.cmd(&[b"DECRBY", b"n", b"-9223372036854775808"]);
    assert_eq!(got, V::Err("ERR decrement would overflow".into()));
    assert_eq!(c.cmd(&[b"GET", b"n"]), bulk("5"));
    assert_eq!(c.cmd(&[b"DECRBY", b"n", b"-5"]), V::Int(10));
}

#[test]
fn arguments_are_checked_before_the_store_is_made() {
    let dir = TempDir::new("badargs");
    for bad in [
        &["--addr", "notanaddr"][..],
        &["--addr", "127.0.0.1:0", "--maxmemory-clients", "lots"],
        &["--addr", "127.0.0.1:0", "--maxclients", "0"],
        &["--addr", "127.0.0.1:0", "--durability", "sometimes"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_pmhash"))
            .arg("serve")
            .arg("--dir")
            .arg(dir.path())
            .args(bad)
            .output()
            .expect("run pmhash serve");
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        let (flag, value) = (bad[bad.len() - 2], bad[bad.len() - 1]);
        assert!(err.contains(flag) || err.contains(value), "{bad:?}: {err}");
        assert!(
            !dir.path().exists(),
            "{bad:?} made {}",
            dir.path().display()
        );
    }
}

#[test]
fn multi_exec_applies_the_queue_and_exec_abort_applies_nothing() {
    let dir = TempDir::new("multi");
    let srv = Server::start(dir.path(), &[]);
    let mut c = Conn::connect(srv.port);
    let ok = || V::Simple("OK".into());
    let queued = || V::Simple("QUEUED".into());
    assert_eq!(c.cmd(&[b"EXEC"]), V::Err("ERR EXEC without MULTI".into()));
    assert_eq!(
        c.cmd(&[b"DISCARD"]),
        V::Err("ERR DISCARD without MULTI".into())
    );
    assert_eq!(c.cmd(&[b"MULTI"]), ok());
    assert_eq!(
        c.cmd(&[b"MULTI"]),
        V::Err("ERR MULTI calls can not be nested".into())
    );
    assert_eq!(c.cmd(&[b"SET", b"a", b"1"]), queued());
    assert_eq!(c.cmd(&[b"INCR", b"a"]), queued());
    assert_eq!(c.cmd(&[b"GET", b"a"]), queued());
    assert_eq!(c.cmd(&[b"INCR", b"text"]), queued());
    assert_eq!(c.cmd(&[b"SET", b"text", b"x"]), queued());
    assert_eq!(c.cmd(&[b"INCR", b"text"]), queued());
    assert_eq!(c.cmd(&[b"DEL", b"a", b"nope"]), queued());
    assert_eq!(
        c.cmd(&[b"EXEC"]),
        V::Array(vec![
            ok(),
            V::Int(2),
            bulk("2"),
            V::Int(1),
            ok(),
            V::Err("ERR value is not an integer or out of range".into()),
            V::Int(1),
        ])
    );
    assert_eq!(c.cmd(&[b"GET", b"a"]), V::Nil);
    assert_eq!(c.cmd(&[b"GET", b"text"]), bulk("x"));
    // A queued error discards the whole transaction.
    assert_eq!(c.cmd(&[b"MULTI"]), ok());
    assert_eq!(c.cmd(&[b"SET", b"b", b"1"]), queued());
    assert!(is_err(&c.cmd(&[b"NOSUCH"]), "unknown command"));
    assert!(is_err(&c.cmd(&[b"GET"]), "wrong number of arguments"));
    assert_eq!(
        c.cmd(&[b"EXEC"]),
        V::Err("EXECABORT Transaction discarded because of previous errors.".into())
    );
    assert_eq!(c.cmd(&[b"GET", b"b"]), V::Nil);
    // DISCARD drops the queue.
    assert_eq!(c.cmd(&[b"MULTI"]), ok());
    assert_eq!(c.cmd(&[b"SET", b"b", b"1"]), queued());
    assert_eq!(c.cmd(&[b"DISCARD"]), ok());
    assert_eq!(c.cmd(&[b"GET", b"b"]), V::Nil);
}

#[test]
fn watch_aborts_exec_after_another_clients_write() {
    let dir = TempDir::new("watch");
    let srv = Server::start(dir.path(), &[]);
    let mut c = Conn::connect(srv.port);
    let mut other = Conn::connect(srv.port);
    let ok = || V::Simple("OK".into());
    assert_eq!(c.cmd(&[b"SET", b"w", b"1"]), ok());
    // Untouched: applied.
    assert_eq!(c.cmd(&[b"WATCH", b"w"]), ok());
    assert_eq!(c.cmd(&[b"MULTI"]), ok());
    assert_eq!(c.cmd(&[b"INCR", b"w"]), V::Simple("QUEUED".into()));
    assert_eq!(c.cmd(&[b"EXEC"]), V::Array(vec![V::Int(2)]));
    // Written by another client in between: nothing applied, null reply.
    assert_eq!(c.cmd(&[b"WATCH", b"w"]), ok());
    assert_eq!(other.cmd(&[b"SET", b"w", b"10"]), ok());
    assert_eq!(c.cmd(&[b"MULTI"]), ok());
    assert_eq!(c.cmd(&[b"INCR", b"w"]), V::Simple("QUEUED".into()));
    assert_eq!(c.cmd(&[b"EXEC"]), V::Nil);
    assert_eq!(c.cmd(&[b"GET", b"w"]), bulk("10"));
    // A pipelined SET (the batch path) marks watchers too.
    assert_eq!(c.cmd(&[b"WATCH", b"w"]), ok());
    let mut wire = Vec::new();
    Conn::encode(&mut wire, &[b"SET", b"w", b"20"]);
    Conn::encode(&mut wire, &[b"SET", b"x", b"20"]);
    other.send_raw(&wire).unwrap();
    assert_eq!(other.read().unwrap(), ok());
    assert_eq!(other.read().unwrap(), ok());
    assert_eq!(c.cmd(&[b"MULTI"]), ok());
    assert_eq!(c.cmd(&[b"INCR", b"w"]), V::Simple("QUEUED".into()));
    assert_eq!(c.cmd(&[b"EXEC"]), V::Nil);
    // UNWATCH forgets.
    assert_eq!(c.cmd(&[b"WATCH", b"w"]), ok());
    assert_eq!(other.cmd(&[b"SET", b"w", b"30"]), ok());
    assert_eq!(c.cmd(&[b"UNWATCH"]), ok());
    assert_eq!(c.cmd(&[b"MULTI"]), ok());
    assert_eq!(c.cmd(&[b"INCR", b"w"]), V::Simple("QUEUED".into()));
    assert_eq!(c.cmd(&[b"EXEC"]), V::Array(vec![V::Int(31)]));
    assert_eq!(c.cmd(&[b"MULTI"]), ok());
    assert!(is_err(&c.cmd(&[b"WATCH", b"w"]), "WATCH inside MULTI"));
    assert_eq!(c.cmd(&[b"DISCARD"]), ok());
}

/// Two keys that every transaction and MSET moves together: no reader,
/// through any read path, ever sees them differ.
#[test]
fn readers_see_all_of_a_transaction_or_none() {
    let dir = TempDir::new("isolation");
    let srv = Server::start(dir.path(), &["--threads", "2"]);
    let port = srv.port;
    let mut c = Conn::connect(port);
    assert_eq!(
        c.cmd(&[b"MSET", b"a", b"0", b"b", b"0"]),
        V::Simple("OK".into())
    );
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut c = Conn::connect(port);
                let mut n = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    if w == 0 {
                        let mut wire = Vec::new();
                        Conn::encode(&mut wire, &[b"MULTI"]);
                        Conn::encode(&mut wire, &[b"INCR", b"a"]);
                        Conn::encode(&mut wire, &[b"INCR", b"b"]);
                        Conn::encode(&mut wire, &[b"EXEC"]);
                        c.send_raw(&wire).unwrap();
                        for _ in 0..3 {
                            c.read().unwrap();
                        }
                        match c.read().unwrap() {
                            V::Array(r) => assert_eq!(r[0], r[1]),
                            other => panic!("EXEC: {other:?}"),
                        }
                    } else {
                        let v = (1_000_000 + n).to_string();
                        let got = c.cmd(&[b"MSET", b"a", v.as_bytes(), b"b", v.as_bytes()]);
                        assert_eq!(got, V::Simple("OK".into()));
                    }
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut reader = Conn::connect(port);
    let until = Instant::now() + Duration::from_secs(2);
    let mut reads = 0;
    while Instant::now() < until {
        match reader.cmd(&[b"MGET", b"a", b"b"]) {
            V::Array(v) => assert_eq!(v[0], v[1], "MGET saw half a transaction"),
            other => panic!("MGET: {other:?}"),
        }
        // A pipeline of GETs runs as one batch.
        let mut wire = Vec::new();
        Conn::encode(&mut wire, &[b"GET", b"a"]);
        Conn::encode(&mut wire, &[b"GET", b"b"]);
        reader.send_raw(&wire).unwrap();
        let (x, y) = (reader.read().unwrap(), reader.read().unwrap());
        // Sent in one write, read in one read: one batch, isolated as MGET.
        assert_eq!(x, y, "a pipeline of GETs saw half a transaction");
        reads += 1;
    }
    stop.store(true, Ordering::SeqCst);
    let done: Vec<u64> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    assert!(
        reads > 100 && done.iter().all(|&n| n > 10),
        "reads {reads}, writes {done:?}"
    );
}

#[test]
fn redis_py_pipelines_and_transactions_work() {
    let dir = TempDir::new("redis-py");
    let srv = Server::start(dir.path(), &[]);
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/redis_py_transactions.py"
    );
    let out = Command::new("python3")
        .arg(script)
        .arg(srv.port.to_string())
        .output()
        .expect("run python3 (redis-py: pip install redis)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("redis-py transactions: all checks passed"),
        "{text}"
    );
}

#[test]
fn info_client_and_command_answer_what_clients_ask() {
    let dir = TempDir::new("introspect");
    let srv = Server::start(dir.path(), &[]);
    let mut c = Conn::connect(srv.port);
    assert_eq!(c.cmd(&[b"SET", b"k", b"v"]), V::Simple("OK".into()));
    let text = |v: V| match v {
        V::Bulk(b) => String::from_utf8(b).unwrap(),
        other => panic!("{other:?}"),
    };
    let mem = text(c.cmd(&[b"INFO", b"memory"]));
    assert!(mem.starts_with("# Memory\r\n"), "{mem}");
    assert!(!mem.contains("# Server"), "{mem}");
    let rss: u64 = mem
        .lines()
        .find_map(|l| l.strip_prefix("used_memory_rss:"))
        .and_then(|v| v.parse().ok())
        .expect("used_memory_rss");
    assert!(rss > MIB, "{mem}");
    let all = text(c.cmd(&[b"INFO"]));
    for want in [
        "# Server\r\n",
        "server_name:pmhash\r\n",
        "# Persistence\r\n",
        "durability:strict\r\n",
        "# Stats\r\n",
        "# Keyspace\r\ndb0:keys=1,expires=0,avg_ttl=0\r\n",
    ] {
        assert!(all.contains(want), "INFO lacks {want:?}: {all}");
    }
    assert_eq!(text(c.cmd(&[b"INFO", b"nosuchsection"])), "");
    let mut victim = Conn::connect(srv.port);
    assert_eq!(
        victim.cmd(&[b"CLIENT", b"SETNAME", b"victim"]),
        V::Simple("OK".into())
    );
    let id = match victim.cmd(&[b"CLIENT", b"ID"]) {
        V::Int(i) => i,
        other => panic!("{other:?}"),
    };
    let list = text(c.cmd(&[b"CLIENT", b"LIST"]));
    assert_eq!(list.lines().count(), 2, "{list}");
    assert!(
        list.contains(&format!("id={id} ")) && list.contains("name=victim"),
        "{list}"
    );
    assert_eq!(
        c.cmd(&[b"CLIENT", b"KILL", b"ID", id.to_string().as_bytes()]),
        V::Int(1)
    );
    assert!(victim.send(&[b"PING"]).is_err() || victim.read().is_err());
    assert_eq!(c.cmd(&[b"CLIENT", b"KILL", b"ID", b"999999"]), V::Int(0));
    let count = match c.cmd(&[b"COMMAND", b"COUNT"]) {
        V::Int(n) => n,
        other => panic!("{other:?}"),
    };
    match c.cmd(&[b"COMMAND", b"LIST"]) {
        V::Array(names) => {
            assert_eq!(names.len() as i64, count);
            assert!(names.contains(&bulk("multi")) && names.contains(&bulk("get")));
        }
        other => panic!("{other:?}"),
    }
    let docs = cli(srv.port, &["command", "docs", "set"]);
    assert!(
        docs.contains("summary") && docs.contains("arguments"),
        "{docs}"
    );
    assert!(is_err(
        &c.cmd(&[b"NOSUCH", b"x"]),
        "unknown command 'NOSUCH'"
    ));
}

/// Well-behaved clients keep bounded latency while every hostile pattern
/// above runs at once.
#[test]
fn well_behaved_clients_are_served_while_every_attack_runs() {
    let dir = TempDir::new("mixed");
    let srv = Server::start(dir.path(), &["--maxmemory-clients", "64mb"]);
    let port = srv.port;
    let mut setup = Conn::connect(port);
    let big = vec![b'v'; 1 << 20];
    assert_eq!(setup.cmd(&[b"SET", b"big", &big]), V::Simple("OK".into()));
    assert_eq!(
        setup.cmd(&[b"SET", &[b'a'; 60][..], b"v"]),
        V::Simple("OK".into())
    );
    let stop = Arc::new(AtomicBool::new(false));
    let mut attacks = Vec::new();
    type Attack = fn(&mut Conn) -> io::Result<()>;
    let patterns: [Attack; 6] = [
        |c| {
            c.send(&[b"SCAN", b"0", b"MATCH", &[b'*'; 100_000]])?;
            c.read().map(drop)
        },
        |c| {
            c.send(&[
                b"SCAN",
                b"0",
                b"MATCH",
                b"*a*a*a*a*a*a*a*a*a*a*a*b",
                b"COUNT",
                b"1000",
            ])?;
            c.read().map(drop)
        },
        |c| {
            let mut a: Vec<&[u8]> = vec![b"MGET"];
            a.extend(std::iter::repeat_n(&b"big"[..], 3000));
            c.send(&a)?;
            c.read().map(drop)
        },
        |c| {
            // Never finished, and its connection dropped by the caller.
            c.send_raw(b"*10\r\n")?;
            let mut a = format!("${}\r\n", 1 << 20).into_bytes();
            a.resize(a.len() + (1 << 20), b'x');
            a.extend_from_slice(b"\r\n");
            for _ in 0..8 {
                c.send_raw(&a)?;
            }
            Ok(())
        },
        |c| {
            // Asks for 30 MiB and reads none of it.
            let mut wire = Vec::new();
            for _ in 0..30 {
                Conn::encode(&mut wire, &[b"GET", b"big"]);
            }
            c.send_raw(&wire)
        },
        |c| {
            c.send_raw(b"*1\r\n$99999999999\r\n")?;
            c.read().map(drop)
        },
    ];
    for attack in patterns {
        let stop = stop.clone();
        attacks.push(std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let mut c = Conn::connect(port);
                c.w.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let _ = attack(&mut c);
                std::thread::sleep(Duration::from_millis(20));
            }
        }));
    }
    let good: Vec<_> = (0..3)
        .map(|g| {
            std::thread::spawn(move || {
                let mut c = Conn::connect(port);
                let mut lat = Vec::new();
                let until = Instant::now() + Duration::from_secs(4);
                let mut i = 0u64;
                while Instant::now() < until {
                    let k = format!("good:{g}:{}", i % 100);
                    let t = Instant::now();
                    assert_eq!(
                        c.cmd(&[b"SET", k.as_bytes(), b"value"]),
                        V::Simple("OK".into())
                    );
                    assert_eq!(c.cmd(&[b"GET", k.as_bytes()]), bulk("value"));
                    lat.push(t.elapsed());
                    i += 1;
                }
                lat
            })
        })
        .collect();
    let mut lat: Vec<Duration> = good.into_iter().flat_map(|g| g.join().unwrap()).collect();
    stop.store(true, Ordering::SeqCst);
    for a in attacks {
        a.join().unwrap();
    }
    lat.sort();
    let p99 = lat[lat.len() * 99 / 100];
    let worst = *lat.last().unwrap();
    assert!(lat.len() > 300, "only {} round trips in 4 s", lat.len());
    assert!(p99 < Duration::from_millis(300), "p99 {p99:?}");
    assert!(worst < Duration::from_secs(2), "worst {worst:?}");
    assert_eq!(setup.cmd(&[b"PING"]), V::Simple("PONG".into()));
}

#[test]
fn flushall_runs_in_slices_between_other_clients_requests() {
    let dir = TempDir::new("flushall");
    let srv = Server::start(dir.path(), &["--threads", "1"]);
    let mut c = Conn::connect(srv.port);
    let keys = 200_000;
    let mut wire = Vec::new();
    for i in 0..keys {
        Conn::encode(&mut wire, &[b"SET", format!("f:{i:07}").as_bytes(), b"v"]);
        if wire.len() > 1 << 20 || i + 1 == keys {
            c.send_raw(&wire).unwrap();
            wire.clear();
        }
    }
    for _ in 0..keys {
        assert_eq!(c.read().unwrap(), V::Simple("OK".into()));
    }
    assert_eq!(c.cmd(&[b"DBSIZE"]), V::Int(keys as i64));
    // The ordered index takes in the new keys at the first walk.
    assert!(matches!(c.cmd(&[b"SCAN", b"0"]), V::Array(_)));
    let busy = Arc::new(AtomicBool::new(true));
    let ping = pinger(srv.port, busy.clone());
    std::thread::sleep(Duration::from_millis(50));
    // FLUSHALL and a request behind it: answered in order.
    let mut wire = Vec::new();
    Conn::encode(&mut wire, &[b"FLUSHALL"]);
    Conn::encode(&mut wire, &[b"DBSIZE"]);
    let t = Instant::now();
    c.send_raw(&wire).unwrap();
    assert_eq!(c.read().unwrap(), V::Simple("OK".into()));
    assert_eq!(c.read().unwrap(), V::Int(0));
    let took = t.elapsed();
    std::thread::sleep(Duration::from_millis(50));
    busy.store(false, Ordering::SeqCst);
    let worst = ping.join().expect("the pinger");
    // One loop serves both: the PINGs wait at most a slice, not the whole.
    assert!(
        worst < took / 3 || worst < Duration::from_millis(20),
        "FLUSHALL took {took:?}; a PING waited {worst:?}"
    );
}

/// Fences the event loop issued, from `INFO persistence`.
fn fences(c: &mut Conn) -> u64 {
    let info = match c.cmd(&[b"INFO", b"persistence"]) {
        V::Bulk(b) => String::from_utf8(b).unwrap(),
        other => panic!("{other:?}"),
    };
    info.lines()
        .find_map(|l| l.strip_prefix("persist_fences:"))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no persist_fences in {info}"))
}

#[test]
fn a_transaction_costs_one_fence() {
    let dir = TempDir::new("onefence");
    let srv = Server::start(dir.path(), &["--threads", "1"]);
    let mut c = Conn::connect(srv.port);
    for k in [&b"c"[..], b"d"] {
        assert_eq!(c.cmd(&[b"SET", k, b"1"]), V::Simple("OK".into()));
    }
    // One by one: a fence each.
    let f0 = fences(&mut c);
    assert_eq!(c.cmd(&[b"SET", b"a", b"1"]), V::Simple("OK".into()));
    assert_eq!(c.cmd(&[b"INCR", b"d"]), V::Int(2));
    assert_eq!(c.cmd(&[b"DEL", b"c"]), V::Int(1));
    let f1 = fences(&mut c);
    assert!(f1 - f0 >= 3, "three writes, {} fences", f1 - f0);
    // The same writes (and more) in a transaction: one.
    let mut wire = Vec::new();
    for cmd in [
        &[&b"MULTI"[..]][..],
        &[b"SET", b"a", b"2"],
        &[b"SET", b"b", b"2"],
        &[b"INCR", b"d"],
        &[b"DEL", b"d"],
        &[b"SET", b"c", b"3"],
        &[b"EXEC"],
    ] {
        Conn::encode(&mut wire, cmd);
    }
    c.send_raw(&wire).unwrap();
    for _ in 0..6 {
        c.read().unwrap();
    }
    assert_eq!(
        c.read().unwrap(),
        V::Array(vec![
            V::Simple("OK".into()),
            V::Simple("OK".into()),
            V::Int(3),
            V::Int(1),
            V::Simple("OK".into()),
        ])
    );
    let f2 = fences(&mut c);
    assert_eq!(f2 - f1, 1, "a transaction of five writes");
    assert_eq!(c.cmd(&[b"GET", b"d"]), V::Nil);
    assert_eq!(c.cmd(&[b"GET", b"c"]), bulk("3"));
}

#[test]
fn a_full_file_system_is_an_error_reply_and_deletes_make_room() {
    let fs = match pmem::testfs::SmallFs::mount(320 << 20) {
        Ok(fs) => fs,
        Err(why) => {
            eprintln!("skipped: needs a small tmpfs ({why})");
            return;
        }
    };
    let dir = fs.path("db");
    let srv = Server::start(&dir, &[]);
    let mut c = Conn::connect(srv.port);
    let big = vec![b'v'; 1 << 20];
    let mut n = 0;
    let err = loop {
        assert!(n < 400, "400 MiB of values fit in a 320 MiB file system");
        match c.cmd(&[b"SET", format!("k{n:04}").as_bytes(), &big]) {
            V::Simple(ok) if ok == "OK" => n += 1,
            V::Err(e) => break e,
            other => panic!("SET: {other:?}"),
        }
    };
    assert!(err.contains("out of space"), "{err}");
    assert!(n >= 10, "only {n} SETs before the file system filled");
    // The server stays up: reads and other clients are served.
    assert_eq!(c.cmd(&[b"GET", b"k0000"]), V::Bulk(big.clone()));
    assert_eq!(
        Conn::connect(srv.port).cmd(&[b"PING"]),
        V::Simple("PONG".into())
    );
    // Deleting (and the background GC) makes room again.
    for i in 0..n {
        c.cmd(&[b"DEL", format!("k{i:04}").as_bytes()]);
    }
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        match c.cmd(&[b"SET", b"again", &big]) {
            V::Simple(ok) if ok == "OK" => break,
            V::Err(e) if e.contains("out of space") && Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(100));
            }
            other => panic!("SET after DEL and GC: {other:?}"),
        }
    }
    assert_eq!(c.cmd(&[b"GET", b"again"]), V::Bulk(big));
}
