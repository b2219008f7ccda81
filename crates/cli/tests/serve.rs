//! `pmhash serve` driven as a user would: the real binary, the real Redis
//! clients (`redis-cli`, `redis-benchmark`), and a small raw RESP client for
//! what the clients cannot show (exact reply bytes, kill -9 mid-stream,
//! broken framing).
//!
//! Expected replies are what Redis 7.0 sends for the same command, except
//! where pmhash documents its own behaviour (`RANGE`, no expiry).

// The harness is shared with tests/hostile.rs; each file uses part of it.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

include!("support/servekit.rs");

// ---------------------------------------------------------------------------
// 2. Conformance through redis-cli
// ---------------------------------------------------------------------------

#[test]
fn redis_cli_conformance() {
    let dir = TempDir::new("conf");
    let srv = Server::start(dir.path(), &[]);
    let p = srv.port;

    // (command, exact redis-cli --no-raw stdout). Run in order against one
    // fresh store; mismatches are collected so one run reports them all.
    let cases: &[(&[&str], &str)] = &[
        (&["ping"], "PONG\n"),
        (&["ping", "hello"], "\"hello\"\n"),
        (&["echo", "hello world"], "\"hello world\"\n"),
        (&["dbsize"], "(integer) 0\n"),
        (&["get", "foo"], "(nil)\n"),
        (&["set", "foo", "bar"], "OK\n"),
        (&["get", "foo"], "\"bar\"\n"),
        (&["set", "empty", ""], "OK\n"),
        (&["get", "empty"], "\"\"\n"),
        // NX / XX / GET
        (&["set", "foo", "baz", "nx"], "(nil)\n"),
        (&["get", "foo"], "\"bar\"\n"),
        (&["set", "newk", "n1", "NX"], "OK\n"),
        (&["set", "absent", "v", "xx"], "(nil)\n"),
        (&["exists", "absent"], "(integer) 0\n"),
        (&["set", "foo", "qux", "XX"], "OK\n"),
        (&["get", "foo"], "\"qux\"\n"),
        (&["set", "foo", "v2", "get"], "\"qux\"\n"),
        (&["set", "nokey", "v", "GET"], "(nil)\n"),
        (&["get", "nokey"], "\"v\"\n"),
        // Redis 7.0 allows NX with GET: the old value, and no write.
        (&["set", "foo", "v3", "nx", "get"], "\"v2\"\n"),
        (&["get", "foo"], "\"v2\"\n"),
        (&["set", "foo", "v3", "xx", "get"], "\"v2\"\n"),
        (&["get", "foo"], "\"v3\"\n"),
        (&["set", "foo", "a", "nx", "xx"], "(error) ERR syntax error\n"),
        (&["set", "foo", "a", "bogus"], "(error) ERR syntax error\n"),
        // GETSET
        (&["getset", "foo", "g"], "\"v3\"\n"),
        (&["get", "foo"], "\"g\"\n"),
        (&["getset", "gnew", "x"], "(nil)\n"),
        (&["get", "gnew"], "\"x\"\n"),
        // MSET / MGET / EXISTS / DEL counts
        (&["mset", "m1", "1", "m2", "2", "m3", "3"], "OK\n"),
        (
            &["mget", "m1", "missing", "m3"],
            "1) \"1\"\n2) (nil)\n3) \"3\"\n",
        ),
        (
            &["mset", "m1", "1", "m2"],
            "(error) ERR wrong number of arguments for 'mset' command\n",
        ),
        (&["exists", "m1", "m2", "missing", "m1"], "(integer) 3\n"),
        (&["del", "m1", "m2", "missing", "m1"], "(integer) 2\n"),
        (&["exists", "m1", "m2", "m3"], "(integer) 1\n"),
        (&["del", "m1"], "(integer) 0\n"),
        // INCR family
        (&["incr", "counter"], "(integer) 1\n"),
        (&["incrby", "counter", "41"], "(integer) 42\n"),
        (&["decr", "counter"], "(integer) 41\n"),
        (&["decrby", "counter", "50"], "(integer) -9\n"),
        (&["get", "counter"], "\"-9\"\n"),
        (
            &["incr", "foo"],
            "(error) ERR value is not an integer or out of range\n",
        ),
        (
            &["incrby", "counter", "abc"],
            "(error) ERR value is not an integer or out of range\n",
        ),
        // Redis parses integers strictly (string2ll): no leading zeros, no '+'.
        (&["set", "num", "010"], "OK\n"),
        (
            &["incr", "num"],
            "(error) ERR value is not an integer or out of range\n",
        ),
        (&["set", "num", "+5"], "OK\n"),
        (
            &["incr", "num"],
            "(error) ERR value is not an integer or out of range\n",
        ),
        (&["set", "big", "9223372036854775807"], "OK\n"),
        (
            &["incr", "big"],
            "(error) ERR increment or decrement would overflow\n",
        ),
        // Arity and unknown commands, worded as Redis 7.0 words them.
        (
            &["get"],
            "(error) ERR wrong number of arguments for 'get' command\n",
        ),
        (
            &["foo", "bar"],
            "(error) ERR unknown command 'foo', with args beginning with: 'bar' \n",
        ),
        (
            &["nosuchcmd"],
            "(error) ERR unknown command 'nosuchcmd', with args beginning with: \n",
        ),
        (&["select", "0"], "OK\n"),
        (&["config", "get", "save"], "1) \"save\"\n2) \"\"\n"),
        // RANGE start end [LIMIT n]: start <= key < end in byte order.
        (
            &["mset", "r:a", "1", "r:b", "2", "r:c", "3", "r:B", "0"],
            "OK\n",
        ),
        (
            &["range", "r:", "r;"],
            "1) \"r:B\"\n2) \"0\"\n3) \"r:a\"\n4) \"1\"\n5) \"r:b\"\n6) \"2\"\n7) \"r:c\"\n8) \"3\"\n",
        ),
        (
            &["range", "r:a", "r:c"],
            "1) \"r:a\"\n2) \"1\"\n3) \"r:b\"\n4) \"2\"\n",
        ),
        (
            &["range", "r:a", "+", "LIMIT", "2"],
            "1) \"r:a\"\n2) \"1\"\n3) \"r:b\"\n4) \"2\"\n",
        ),
        (&["range", "r:c", "+"], "1) \"r:c\"\n2) \"3\"\n"),
        (&["range", "r:d", "+"], "(empty array)\n"),
        (&["range", "r:c", "r:a"], "(empty array)\n"),
        // foo empty newk nokey gnew m3 counter num big r:a r:b r:c r:B
        (&["dbsize"], "(integer) 13\n"),
    ];
    let mut diffs = Vec::new();
    for (args, want) in cases {
        let got = cli(p, args);
        if got != *want {
            diffs.push(format!(
                "redis-cli {}\n  expected {want:?}\n  actual   {got:?}",
                args.join(" ")
            ));
        }
    }

    // Expiry is not supported: an error that says so, and no write.
    let got = cli(p, &["set", "k", "v", "EX", "10"]);
    if !(got.starts_with("(error) ERR ") && got.to_lowercase().contains("expir")) {
        diffs.push(format!("SET k v EX 10: want an expiry error, got {got:?}"));
    }
    if cli(p, &["exists", "k"]) != "(integer) 0\n" {
        diffs.push("SET k v EX 10 wrote the key".into());
    }

    let info = cli(p, &["info"]);
    if !(info.contains("# Store") && info.contains("redis_version:")) {
        diffs.push(format!("INFO lacks '# Store' or redis_version: {info:?}"));
    }
    assert!(
        diffs.is_empty(),
        "{} reply(s) differ from Redis:\n{}",
        diffs.len(),
        diffs.join("\n")
    );
}

// ---------------------------------------------------------------------------
// SCAN
// ---------------------------------------------------------------------------

#[test]
fn scan_collects_exactly_the_keys() {
    let dir = TempDir::new("scan");
    let srv = Server::start(dir.path(), &[]);
    let mut c = Conn::connect(srv.port);
    let mut keys = BTreeSet::new();
    for i in 0..150 {
        keys.insert(format!("user:{i}"));
    }
    for i in 0..40 {
        keys.insert(format!("other:{i:03}"));
    }
    let mut mset: Vec<&[u8]> = vec![b"MSET"];
    for k in &keys {
        mset.push(k.as_bytes());
        mset.push(b"v");
    }
    assert_eq!(c.cmd(&mset), V::Simple("OK".into()));
    assert_eq!(c.cmd(&[b"DBSIZE"]), V::Int(keys.len() as i64));

    // The server's own iteration, cursor passed back verbatim: every key
    // exactly once, and the cursor is an unsigned decimal integer (Redis's
    // contract, which clients rely on).
    let mut seen = Vec::new();
    let mut cursor = b"0".to_vec();
    let mut bad_cursors = BTreeSet::new();
    for _ in 0..10_000 {
        let V::Array(mut reply) = c.cmd(&[b"SCAN", &cursor, b"COUNT", b"7"]) else {
            panic!("SCAN did not answer an array");
        };
        assert_eq!(reply.len(), 2, "SCAN reply {reply:?}");
        let V::Array(batch) = reply.pop().unwrap() else {
            panic!("SCAN keys not an array")
        };
        let V::Bulk(next) = reply.pop().unwrap() else {
            panic!("SCAN cursor not a bulk")
        };
        for k in batch {
            let V::Bulk(k) = k else {
                panic!("SCAN key not a bulk")
            };
            seen.push(String::from_utf8(k).unwrap());
        }
        if std::str::from_utf8(&next)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .is_none()
        {
            bad_cursors.insert(String::from_utf8_lossy(&next).into_owned());
        }
        if next == b"0" {
            break;
        }
        cursor = next;
    }
    seen.sort();
    let before = seen.len();
    seen.dedup();
    assert_eq!(before, seen.len(), "SCAN returned a key twice");
    assert_eq!(seen, keys.iter().cloned().collect::<Vec<_>>());

    // redis-cli --scan (parses the cursor as an integer, as clients do).
    let scan = |extra: &[&str]| {
        let p = srv.port.to_string();
        let mut a = vec!["-p", &p, "--scan"];
        a.extend_from_slice(extra);
        let out = tool("redis-cli", &a, None);
        let mut got: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect();
        got.sort();
        (out, got)
    };
    let (out, got) = scan(&[]);
    let expect: Vec<String> = keys.iter().cloned().collect();
    assert!(
        out.status.success() && got == expect,
        "redis-cli --scan: expected exit 0 and the {} keys; got {} with {} keys, stderr {:?}; \
         the server's cursors are not unsigned integers, e.g. {:?}",
        expect.len(),
        out.status,
        got.len(),
        String::from_utf8_lossy(&out.stderr),
        bad_cursors.iter().take(3).collect::<Vec<_>>()
    );
    let (out, got) = scan(&["--pattern", "user:1*"]);
    let expect: Vec<String> = keys
        .iter()
        .filter(|k| k.starts_with("user:1"))
        .cloned()
        .collect();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(got, expect);
    assert!(
        bad_cursors.is_empty(),
        "SCAN cursors must be unsigned decimal integers; got {bad_cursors:?}"
    );
}

// ---------------------------------------------------------------------------
// RESP3 and AUTH
// ---------------------------------------------------------------------------

#[test]
fn hello_3_switches_to_resp3() {
    let dir = TempDir::new("resp3");
    let srv = Server::start(dir.path(), &[]);
    let p = srv.port;

    let hello = cli(p, &["-3", "hello", "3"]);
    assert!(
        hello.starts_with("1# \"server\" => ") && hello.contains("\"proto\" => (integer) 3\n"),
        "HELLO 3 is not a RESP3 map with proto 3: {hello:?}"
    );
    let hello2 = cli(p, &["hello", "2"]);
    assert!(
        hello2.contains(") \"proto\"\n") && hello2.contains(") (integer) 2\n"),
        "HELLO 2 is not a flat array with proto 2: {hello2:?}"
    );

    // The wire: nil is $-1 in RESP2 and _ in RESP3; HELLO answers a map.
    let mut c = Conn::connect(p);
    c.send(&[b"GET", b"missing"]).unwrap();
    assert_eq!(c.raw_line().unwrap(), "$-1\r\n");
    c.send(&[b"HELLO", b"4"]).unwrap();
    let r = c.read().unwrap();
    assert!(matches!(&r, V::Err(e) if e.starts_with("NOPROTO")), "{r:?}");
    let V::Map(m) = c.cmd(&[b"HELLO", b"3"]) else {
        panic!("HELLO 3 did not answer a RESP3 map")
    };
    assert!(m.contains(&(bulk("proto"), V::Int(3))), "{m:?}");
    c.send(&[b"GET", b"missing"]).unwrap();
    assert_eq!(c.raw_line().unwrap(), "_\r\n");
    assert_eq!(c.cmd(&[b"SET", b"k", b"v"]), V::Simple("OK".into()));
    assert_eq!(
        c.cmd(&[b"MGET", b"k", b"missing"]),
        V::Array(vec![bulk("v"), V::Nil])
    );
    assert_eq!(cli(p, &["-3", "get", "missing"]), "(nil)\n");

    // Redis 7 answers CONFIG GET with a map under RESP3.
    assert_eq!(
        cli(p, &["-3", "config", "get", "save"]),
        "1# \"save\" => \"\"\n",
        "CONFIG GET under RESP3 must be a map"
    );
}

#[test]
fn requirepass_needs_auth() {
    let dir = TempDir::new("auth");
    let srv = Server::start(dir.path(), &["--requirepass", "s3cret"]);
    let p = srv.port;

    assert_eq!(
        cli(p, &["get", "x"]),
        "(error) NOAUTH Authentication required.\n"
    );
    assert_eq!(
        cli(p, &["set", "x", "1"]),
        "(error) NOAUTH Authentication required.\n"
    );
    assert_eq!(
        cli(p, &["-a", "s3cret", "--no-auth-warning", "get", "x"]),
        "(nil)\n",
        "the unauthenticated SET must not have written"
    );
    assert_eq!(
        cli(p, &["-a", "s3cret", "--no-auth-warning", "set", "x", "1"]),
        "OK\n"
    );
    assert_eq!(
        cli(p, &["-a", "s3cret", "--no-auth-warning", "get", "x"]),
        "\"1\"\n"
    );
    // A wrong password: redis-cli reports the failed AUTH, then NOAUTH.
    let pstr = p.to_string();
    let out = tool(
        "redis-cli",
        &[
            "-p",
            &pstr,
            "--no-raw",
            "-a",
            "wrong",
            "--no-auth-warning",
            "get",
            "x",
        ],
        None,
    );
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("WRONGPASS invalid username-password pair or user is disabled.")
            && text.contains("(error) NOAUTH Authentication required."),
        "{text:?}"
    );

    // The wire: AUTH, and HELLO 3 AUTH in one step.
    let mut c = Conn::connect(p);
    assert_eq!(
        c.cmd(&[b"PING"]),
        V::Err("NOAUTH Authentication required.".into())
    );
    assert_eq!(c.cmd(&[b"AUTH", b"s3cret"]), V::Simple("OK".into()));
    assert_eq!(c.cmd(&[b"GET", b"x"]), bulk("1"));
    let mut c = Conn::connect(p);
    let r = c.cmd(&[b"HELLO", b"3", b"AUTH", b"default", b"s3cret"]);
    assert!(matches!(r, V::Map(_)), "{r:?}");
    assert_eq!(c.cmd(&[b"GET", b"x"]), bulk("1"));
}

// ---------------------------------------------------------------------------
// 3. Many clients
// ---------------------------------------------------------------------------

#[test]
fn redis_benchmark_many_clients() {
    let dir = TempDir::new("bench");
    let srv = Server::start(dir.path(), &[]);
    let p = srv.port.to_string();
    for extra in [&["-c", "200"][..], &["-c", "50", "-P", "16"][..]] {
        let mut args = vec!["-p", &p, "-t", "set,get", "-n", "20000", "-q"];
        args.extend_from_slice(extra);
        let out = tool("redis-benchmark", &args, None);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "redis-benchmark {args:?}: {} {text} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        for t in ["SET: ", "GET: "] {
            assert!(
                text.split(['\r', '\n'])
                    .any(|l| l.trim_start().starts_with(t) && l.contains(" requests per second")),
                "redis-benchmark {args:?} printed no {t} rate: {text:?}"
            );
        }
    }
    let n: i64 = cli(srv.port, &["dbsize"])
        .trim()
        .strip_prefix("(integer) ")
        .expect("DBSIZE integer")
        .parse()
        .unwrap();
    assert!(n > 0, "DBSIZE {n} after redis-benchmark SETs");
    // Without -r redis-benchmark writes its (random) 3-byte value to one key.
    let v = Conn::connect(srv.port).cmd(&[b"GET", b"key:__rand_int__"]);
    assert!(matches!(&v, V::Bulk(b) if b.len() == 3), "{v:?}");
}

/// CPU time (user + system) the process has used, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc/PID/stat");
    // Fields after the command name (which may hold spaces), from field 3:
    // utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// The event loops poll without sleeping only right after work: a server
/// with a long busy poll that has nothing to do sleeps. (A loop that
/// polled after every wake-up, work or not, would spin 200 ms of every
/// 250 here.)
#[test]
fn an_idle_server_does_not_spin() {
    let dir = TempDir::new("idle");
    let srv = Server::start(dir.path(), &["--busy-poll-us", "200000"]);
    let mut c = Conn::connect(srv.port);
    for i in 0..50 {
        let k = format!("idle{i}");
        assert_eq!(c.cmd(&[b"SET", k.as_bytes(), b"v"]), V::Simple("OK".into()));
    }
    // The poll after the last request ends within 200 ms.
    std::thread::sleep(Duration::from_millis(400));
    let before = cpu_ticks(srv.pid());
    std::thread::sleep(Duration::from_secs(1));
    let used = cpu_ticks(srv.pid()) - before;
    let hz: u64 = Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100);
    assert!(
        used * 10 < hz * 3,
        "an idle server used {used} of {hz} clock ticks in one second"
    );
    // And it still answers at once.
    assert_eq!(c.cmd(&[b"GET", b"idle7"]), bulk("v"));
}

// ---------------------------------------------------------------------------
// 4. Durability
// ---------------------------------------------------------------------------

/// The state the clients were told about: key -> Some(value) or None
/// (deleted), plus the one write that was in flight when the server died
/// (it may or may not have happened).
#[derive(Default)]
struct Expect {
    state: BTreeMap<String, Option<String>>,
    in_flight: Option<(String, Option<String>)>,
}

fn key(round: usize, i: usize) -> String {
    format!("r{round}:k{i:06}")
}

/// Writes (SET, DEL, overwrites of earlier rounds' keys) one at a time,
/// recording each op only once its reply arrived, until the connection
/// dies. `acked` counts acknowledged ops for the main thread.
fn writer(port: u16, round: usize, acked: Arc<AtomicUsize>) -> Expect {
    let mut c = Conn::connect(port);
    let mut e = Expect::default();
    for i in 0..1_000_000 {
        let op: (String, Option<String>) = if i % 10 == 9 {
            (key(round, i - 5), None)
        } else if round > 0 && i % 7 == 3 {
            (
                key(round - 1, i),
                Some(format!("over{round}:{i}:{}", "y".repeat(i % 37))),
            )
        } else {
            (
                key(round, i),
                Some(format!("v{round}:{i}:{}", "x".repeat(i % 61))),
            )
        };
        let sent = match &op.1 {
            Some(v) => c.send(&[b"SET", op.0.as_bytes(), v.as_bytes()]),
            None => c.send(&[b"DEL", op.0.as_bytes()]),
        };
        let reply = sent.and_then(|()| c.read());
        match reply {
            Ok(V::Simple(s)) if s == "OK" && op.1.is_some() => {}
            Ok(V::Int(0 | 1)) if op.1.is_none() => {}
            Ok(other) => panic!("unexpected reply to {op:?}: {other:?}"),
            Err(_) => {
                e.in_flight = Some(op);
                return e;
            }
        }
        e.state.insert(op.0, op.1);
        acked.fetch_add(1, Ordering::SeqCst);
    }
    panic!("the server was never killed");
}

/// GETs every expected key (pipelined in chunks) and checks it.
fn verify(port: u16, exp: &mut Expect, what: &str) {
    let mut c = Conn::connect(port);
    let keys: Vec<&String> = exp.state.keys().collect();
    let mut wrong = Vec::new();
    for chunk in keys.chunks(500) {
        let mut buf = Vec::new();
        for k in chunk {
            Conn::encode(&mut buf, &[b"GET", k.as_bytes()]);
        }
        c.send_raw(&buf).unwrap();
        for k in chunk {
            let got = match c.read().unwrap() {
                V::Bulk(b) => Some(String::from_utf8(b).unwrap()),
                V::Nil => None,
                other => panic!("GET {k}: {other:?}"),
            };
            let acked = &exp.state[*k];
            let ok =
                got == *acked || matches!(&exp.in_flight, Some((fk, fv)) if fk == *k && got == *fv);
            if !ok {
                wrong.push(format!("{k}: expected {acked:?}, got {got:?}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{what}: {} acknowledged writes lost or wrong, e.g. {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );
    // The in-flight op either happened or not; from now on it is whatever
    // the store recovered.
    if let Some((k, _)) = exp.in_flight.take() {
        let got = match c.cmd(&[b"GET", k.as_bytes()]) {
            V::Bulk(b) => Some(String::from_utf8(b).unwrap()),
            _ => None,
        };
        exp.state.insert(k, got);
    }
    let live = exp.state.values().filter(|v| v.is_some()).count() as i64;
    assert_eq!(c.cmd(&[b"DBSIZE"]), V::Int(live), "{what}: DBSIZE");
}

#[test]
fn strict_writes_survive_kill_9() {
    const N: usize = 2000;
    let dir = TempDir::new("kill9");
    let mut exp = Expect::default();
    for round in 0..3 {
        let srv = Server::start(dir.path(), &["--durability", "strict"]);
        let port = srv.port;
        let acked = Arc::new(AtomicUsize::new(0));
        let a2 = acked.clone();
        let w = std::thread::spawn(move || writer(port, round, a2));
        // Kill while the writer is mid-stream, after N acknowledged ops.
        let until = Instant::now() + DEADLINE;
        while acked.load(Ordering::SeqCst) < N {
            assert!(
                !w.is_finished() && Instant::now() < until,
                "round {round}: only {} writes acknowledged",
                acked.load(Ordering::SeqCst)
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        srv.kill9();
        let got = w.join().expect("writer thread");
        assert!(got.state.len() >= N / 2, "round {round}");
        exp.state.extend(got.state);
        exp.in_flight = got.in_flight;

        let srv = Server::start(dir.path(), &["--durability", "strict"]);
        assert_eq!(
            info_field(srv.port, &[], "store_opened_from"),
            "log scan",
            "round {round}: after kill -9 the store must recover from its log"
        );
        verify(srv.port, &mut exp, &format!("round {round} after kill -9"));
        srv.kill9();
    }
}

#[test]
fn clean_shutdown_by_command_and_sigterm() {
    let dir = TempDir::new("clean");
    let mut exp = Expect::default();
    for (round, how) in ["SHUTDOWN", "SIGTERM"].into_iter().enumerate() {
        let srv = Server::start(dir.path(), &[]);
        let mut c = Conn::connect(srv.port);
        for i in 0..300 {
            let (k, v) = (key(round, i), format!("clean{round}:{i}"));
            assert_eq!(
                c.cmd(&[b"SET", k.as_bytes(), v.as_bytes()]),
                V::Simple("OK".into())
            );
            exp.state.insert(k, Some(v));
        }
        // `c` stays connected (idle) across the shutdown: the server must
        // not wait for it to go away.
        if how == "SHUTDOWN" {
            let out = tool(
                "redis-cli",
                &["-p", &srv.port.to_string(), "shutdown"],
                None,
            );
            assert!(out.status.success(), "redis-cli shutdown: {out:?}");
        } else {
            let st = Command::new("kill")
                .args(["-TERM", &srv.pid().to_string()])
                .status()
                .expect("run kill");
            assert!(st.success());
        }
        let (status, lines) = srv.wait_exit();
        assert!(status.success(), "{how}: pmhash serve exited with {status}");
        assert_eq!(
            lines,
            ["pmhash serve: store closed cleanly"],
            "{how}: stdout after listening"
        );
        // The exit above happened with `c` still open: the server shut its
        // idle connection down rather than waiting for the client to leave.
        drop(c);

        let srv = Server::start(dir.path(), &[]);
        assert_eq!(
            info_field(srv.port, &[], "store_opened_from"),
            "image",
            "{how}: the clean-shutdown image was not used"
        );
        verify(srv.port, &mut exp, how);
        srv.kill9();
    }
}

// ---------------------------------------------------------------------------
// 5. Bad input
// ---------------------------------------------------------------------------

#[test]
fn protocol_errors_close_only_that_connection() {
    let dir = TempDir::new("proto");
    let srv = Server::start(dir.path(), &[]);
    let mut other = Conn::connect(srv.port);
    assert_eq!(other.cmd(&[b"PING"]), V::Simple("PONG".into()));

    let cases: &[(&[u8], &str)] = &[
        (
            b"*1\r\n$99999999999\r\n",
            "-ERR Protocol error: invalid bulk length 99999999999 (the limit is 1052672 bytes)\r\n",
        ),
        (
            b"*99999999999\r\n",
            "-ERR Protocol error: invalid multibulk length 99999999999 (the limit is 1048576 arguments)\r\n",
        ),
        (
            b"*1\r\n+x\r\n",
            "-ERR Protocol error: expected '$', got '+'\r\n",
        ),
    ];
    for (bytes, want) in cases {
        let mut bad = Conn::connect(srv.port);
        bad.send_raw(bytes).unwrap();
        // Everything up to EOF: the error, then the server closes.
        let mut got = Vec::new();
        bad.r
            .read_to_end(&mut got)
            .unwrap_or_else(|e| panic!("{bytes:?}: no EOF after the error: {e}"));
        let got = String::from_utf8_lossy(&got);
        assert!(got.starts_with("-ERR Protocol error"), "{bytes:?}: {got:?}");
        assert_eq!(got, *want, "{bytes:?}");
        // The connection that was open all along still works.
        assert_eq!(other.cmd(&[b"PING"]), V::Simple("PONG".into()));
    }
    assert_eq!(
        Conn::connect(srv.port).cmd(&[b"PING"]),
        V::Simple("PONG".into())
    );
    assert_eq!(cli(srv.port, &["ping"]), "PONG\n");
}
