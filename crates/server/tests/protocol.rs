//! The server in-process, over real TCP with a raw RESP client: command
//! semantics, RESP3, AUTH, pipelining, limits, many clients, clean stop.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use engine::testkit::TempDir;
use pmhash_server::{Config, Server};
use store::{CreateOptions, GcMode, OpenOptions, Options, Store};

fn options() -> Options {
    Options {
        create: CreateOptions {
            pool_size: 32 << 20,
            clusters: 4,
            extent_size: 1 << 20,
            ..Default::default()
        },
        open: OpenOptions {
            gc: GcMode::Background,
            raf_bytes: 1 << 20,
            ..Default::default()
        },
    }
}

fn start(dir: &TempDir, pass: Option<&str>) -> Server {
    start_with(dir, pass, 2)
}

fn start_with(dir: &TempDir, pass: Option<&str>, threads: usize) -> Server {
    start_cfg(
        dir,
        Config {
            addr: "127.0.0.1:0".into(),
            requirepass: pass.map(String::from),
            threads,
            ..Config::default()
        },
    )
}

fn start_cfg(dir: &TempDir, cfg: Config) -> Server {
    let st = Store::open(dir.path(), options()).expect("store opens");
    Server::start(st, cfg).expect("server starts")
}

struct Client {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

/// A reply as the test reads it back.
#[derive(Debug, PartialEq)]
enum V {
    Simple(String),
    Err(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    Arr(Vec<V>),
    Map(Vec<(V, V)>),
}

fn b(s: &str) -> V {
    V::Bulk(s.as_bytes().to_vec())
}

impl Client {
    fn new(addr: SocketAddr) -> Client {
        Client::new_from(TcpStream::connect(addr).expect("connect"))
    }

    fn new_from(s: TcpStream) -> Client {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        Client {
            r: BufReader::new(s.try_clone().unwrap()),
            w: s,
        }
    }

    fn encode(args: &[&[u8]]) -> Vec<u8> {
        let mut m = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            m.extend(format!("${}\r\n", a.len()).bytes());
            m.extend_from_slice(a);
            m.extend_from_slice(b"\r\n");
        }
        m
    }

    fn send(&mut self, args: &[&[u8]]) {
        self.w.write_all(&Self::encode(args)).unwrap();
    }

    fn cmd(&mut self, args: &[&str]) -> V {
        let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
        self.send(&a);
        self.read()
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.r.read_line(&mut l).unwrap();
        assert!(l.ends_with("\r\n"), "reply line {l:?}");
        l.truncate(l.len() - 2);
        l
    }

    fn read(&mut self) -> V {
        let l = self.line();
        let (t, rest) = l.split_at(1);
        match t {
            "+" => V::Simple(rest.into()),
            "-" => V::Err(rest.into()),
            ":" => V::Int(rest.parse().unwrap()),
            "_" => V::Nil,
            "$" => {
                let n: i64 = rest.parse().unwrap();
                if n < 0 {
                    return V::Nil;
                }
                let mut d = vec![0u8; n as usize + 2];
                self.r.read_exact(&mut d).unwrap();
                d.truncate(n as usize);
                V::Bulk(d)
            }
            "*" => {
                let n: i64 = rest.parse().unwrap();
                V::Arr((0..n).map(|_| self.read()).collect())
            }
            "%" => {
                let n: usize = rest.parse().unwrap();
                V::Map((0..n).map(|_| (self.read(), self.read())).collect())
            }
            _ => panic!("unknown reply type {l:?}"),
        }
    }

    /// True when the server closed the connection.
    fn closed(&mut self) -> bool {
        let mut buf = [0u8; 1];
        matches!(self.r.read(&mut buf), Ok(0))
    }
}

fn ok() -> V {
    V::Simple("OK".into())
}

fn is_err(v: &V, part: &str) -> bool {
    matches!(v, V::Err(e) if e.contains(part))
}

/// Retries `f` every 20 ms until it returns `Ok`; fails with its last
/// `Err` after 10 s.
fn eventually<T, E: std::fmt::Debug>(what: &str, mut f: impl FnMut() -> Result<T, E>) -> T {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match f() {
            Ok(t) => return t,
            Err(e) => assert!(
                std::time::Instant::now() < deadline,
                "{what}: not within 10 s; last: {e:?}"
            ),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn commands_behave_as_in_redis() {
    let dir = TempDir::new("srv", "cmds");
    let srv = start(&dir, None);
    let mut c = Client::new(srv.addr());
    assert_eq!(c.cmd(&["PING"]), V::Simple("PONG".into()));
    assert_eq!(c.cmd(&["ping", "hi"]), b("hi"));
    assert_eq!(c.cmd(&["ECHO", "x y"]), b("x y"));
    assert_eq!(c.cmd(&["GET", "k"]), V::Nil);
    assert_eq!(c.cmd(&["SET", "k", "v1"]), ok());
    assert_eq!(c.cmd(&["GET", "k"]), b("v1"));
    assert_eq!(c.cmd(&["SET", "k", "v2", "NX"]), V::Nil);
    assert_eq!(c.cmd(&["SET", "new", "x", "XX"]), V::Nil);
    assert_eq!(c.cmd(&["EXISTS", "new"]), V::Int(0));
    assert_eq!(c.cmd(&["SET", "k", "v3", "XX", "GET"]), b("v1"));
    assert_eq!(c.cmd(&["GETSET", "k", "v4"]), b("v3"));
    assert_eq!(c.cmd(&["GET", "k"]), b("v4"));
    assert!(is_err(&c.cmd(&["SET", "k", "v", "EX", "10"]), "expiry"));
    assert!(is_err(&c.cmd(&["SET", "k", "v", "NX", "XX"]), "syntax"));
    assert_eq!(c.cmd(&["GET", "k"]), b("v4"), "refused SETs change nothing");
    assert_eq!(c.cmd(&["MSET", "a", "1", "b", "2"]), ok());
    assert_eq!(
        c.cmd(&["MGET", "a", "nope", "b"]),
        V::Arr(vec![b("1"), V::Nil, b("2")])
    );
    assert_eq!(c.cmd(&["EXISTS", "a", "b", "nope", "a"]), V::Int(3));
    assert_eq!(c.cmd(&["INCR", "a"]), V::Int(2));
    assert_eq!(c.cmd(&["INCRBY", "a", "40"]), V::Int(42));
    assert_eq!(c.cmd(&["DECR", "cnt"]), V::Int(-1));
    assert!(is_err(&c.cmd(&["INCR", "k"]), "not an integer"));
    assert_eq!(c.cmd(&["SET", "big", &i64::MAX.to_string()]), ok());
    assert!(is_err(&c.cmd(&["INCR", "big"]), "overflow"));
    assert_eq!(c.cmd(&["DEL", "a", "nope", "b"]), V::Int(2));
    assert_eq!(c.cmd(&["DBSIZE"]), V::Int(3)); // k, cnt, big
    assert!(is_err(&c.cmd(&["GET"]), "wrong number of arguments"));
    assert!(is_err(&c.cmd(&["NOSUCH"]), "unknown command"));
    assert!(is_err(&c.cmd(&["AUTH", "x"]), "without any password"));
    let V::Bulk(info) = c.cmd(&["INFO"]) else {
        panic!("INFO is a bulk string")
    };
    let info = String::from_utf8(info).unwrap();
    assert!(
        info.contains("# Store") && info.contains("db0:keys=3"),
        "{info}"
    );
    assert_eq!(c.cmd(&["FLUSHALL"]), ok());
    assert_eq!(c.cmd(&["DBSIZE"]), V::Int(0));
    assert_eq!(c.cmd(&["QUIT"]), ok());
    assert!(c.closed());
    srv.stop().unwrap();
}

#[test]
fn scan_and_range_walk_the_ordered_index() {
    let dir = TempDir::new("srv", "scan");
    let srv = start(&dir, None);
    let mut c = Client::new(srv.addr());
    let mut keys: Vec<String> = (0..137).map(|i| format!("key:{i:04}")).collect();
    keys.push("other".into());
    for k in &keys {
        assert_eq!(c.cmd(&["SET", k, &format!("v-{k}")]), ok());
    }
    // SCAN until the cursor comes back to 0 visits every key once.
    let mut cursor = "0".to_string();
    let mut seen = Vec::new();
    let mut rounds = 0;
    loop {
        let V::Arr(r) = c.cmd(&["SCAN", &cursor, "MATCH", "key:*", "COUNT", "10"]) else {
            panic!("SCAN replies with an array")
        };
        let (V::Bulk(next), V::Arr(ks)) = (&r[0], &r[1]) else {
            panic!("SCAN reply shape {r:?}")
        };
        for k in ks {
            let V::Bulk(k) = k else { panic!() };
            seen.push(String::from_utf8(k.clone()).unwrap());
        }
        cursor = String::from_utf8(next.clone()).unwrap();
        rounds += 1;
        if cursor == "0" {
            break;
        }
        assert!(rounds < 100, "SCAN does not end");
    }
    keys.retain(|k| k.starts_with("key:"));
    assert_eq!(seen, keys, "every matching key once, in order");
    assert!(is_err(&c.cmd(&["SCAN", "zz"]), "invalid cursor"));
    // RANGE start end LIMIT n: pairs in key order, end excluded.
    assert_eq!(
        c.cmd(&["RANGE", "key:0010", "key:0013"]),
        V::Arr(vec![
            b("key:0010"),
            b("v-key:0010"),
            b("key:0011"),
            b("v-key:0011"),
            b("key:0012"),
            b("v-key:0012"),
        ])
    );
    let V::Arr(r) = c.cmd(&["RANGE", "key:0130", "+", "LIMIT", "100"]) else {
        panic!()
    };
    assert_eq!(r.len(), 2 * 8, "7 keys up to key:0136, then other");
    assert_eq!(r[r.len() - 2], b("other"));
    srv.stop().unwrap();
}

#[test]
fn hello_3_switches_to_resp3_and_auth_gates_everything() {
    let dir = TempDir::new("srv", "auth");
    let srv = start(&dir, Some("s3cret"));
    let mut c = Client::new(srv.addr());
    assert!(is_err(&c.cmd(&["GET", "k"]), "NOAUTH"));
    assert!(is_err(&c.cmd(&["SET", "k", "v"]), "NOAUTH"));
    assert!(is_err(&c.cmd(&["AUTH", "wrong"]), "WRONGPASS"));
    assert!(is_err(&c.cmd(&["HELLO", "3"]), "NOAUTH"));
    let V::Map(m) = c.cmd(&["HELLO", "3", "AUTH", "default", "s3cret"]) else {
        panic!("HELLO 3 replies with a RESP3 map")
    };
    assert!(m.contains(&(b("proto"), V::Int(3))));
    assert_eq!(c.cmd(&["GET", "k"]), V::Nil, "RESP3 null");
    assert!(is_err(&c.cmd(&["HELLO", "4"]), "NOPROTO"));
    let V::Arr(flat) = c.cmd(&["HELLO", "2"]) else {
        panic!("HELLO 2 replies with a flat array")
    };
    assert_eq!(flat.len() % 2, 0);
    assert_eq!(c.cmd(&["SET", "k", "v"]), ok());
    let mut d = Client::new(srv.addr());
    assert!(
        is_err(&d.cmd(&["GET", "k"]), "NOAUTH"),
        "auth is per connection"
    );
    assert_eq!(d.cmd(&["AUTH", "default", "s3cret"]), ok());
    assert_eq!(d.cmd(&["GET", "k"]), b("v"));
    srv.stop().unwrap();
}

/// A pipeline, then unpipelined requests, with loops that sleep at once
/// and with loops that poll a while first (the two ways a loop waits).
#[test]
fn pipelines_are_answered_in_order() {
    for busy_poll in [
        Duration::ZERO,
        pmhash_server::BUSY_POLL,
        Duration::from_millis(5),
    ] {
        let dir = TempDir::new("srv", "pipe");
        let srv = start_cfg(
            &dir,
            Config {
                addr: "127.0.0.1:0".into(),
                threads: 2,
                busy_poll: Some(busy_poll),
                ..Config::default()
            },
        );
        let mut c = Client::new(srv.addr());
        let mut batch = Vec::new();
        for i in 0..2000 {
            let k = format!("p{i}");
            batch.extend(Client::encode(&[b"SET", k.as_bytes(), k.as_bytes()]));
            batch.extend(Client::encode(&[b"GET", k.as_bytes()]));
        }
        batch.extend(b"PING\r\n"); // an inline command in the same stream
        c.w.write_all(&batch).unwrap();
        for i in 0..2000 {
            assert_eq!(c.read(), ok(), "{busy_poll:?}");
            assert_eq!(c.read(), b(&format!("p{i}")), "{busy_poll:?}");
        }
        assert_eq!(c.read(), V::Simple("PONG".into()));
        // One at a time, with pauses longer than the poll, so some
        // requests find the loop asleep and some find it polling.
        for i in 0..40 {
            if i % 4 == 0 {
                std::thread::sleep(Duration::from_millis(7));
            }
            assert_eq!(c.cmd(&["GET", &format!("p{i}")]), b(&format!("p{i}")));
        }
        srv.stop().unwrap();
    }
}

/// The loops poll by default only while they leave a CPU free; an
/// explicit setting wins. INFO says what the loops do.
#[test]
fn busy_poll_is_automatic_unless_set() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let auto_one_loop = if cpus > 1 {
        pmhash_server::BUSY_POLL
    } else {
        Duration::ZERO
    };
    for (threads, set, want) in [
        (1, None, auto_one_loop),
        (cpus, None, Duration::ZERO),
        (
            cpus,
            Some(Duration::from_millis(7)),
            Duration::from_millis(7),
        ),
        (1, Some(Duration::ZERO), Duration::ZERO),
    ] {
        let dir = TempDir::new("srv", "busypoll");
        let srv = start_cfg(
            &dir,
            Config {
                addr: "127.0.0.1:0".into(),
                threads,
                busy_poll: set,
                ..Config::default()
            },
        );
        let mut c = Client::new(srv.addr());
        let V::Bulk(info) = c.cmd(&["INFO"]) else {
            panic!("INFO is not a bulk string")
        };
        let line = format!("busy_poll_us:{}\r\n", want.as_micros());
        assert!(
            String::from_utf8_lossy(&info).contains(&line),
            "{threads} loops, busy_poll {set:?}: INFO lacks {line:?}"
        );
        srv.stop().unwrap();
    }
}

/// A busy poll past the limit is refused before anything listens.
#[test]
fn an_overlong_busy_poll_is_refused() {
    let dir = TempDir::new("srv", "busypoll-long");
    let st = Store::open(dir.path(), options()).expect("store opens");
    let r = Server::start(
        st,
        Config {
            addr: "127.0.0.1:0".into(),
            busy_poll: Some(pmhash_server::MAX_BUSY_POLL + Duration::from_micros(1)),
            ..Config::default()
        },
    );
    let e = r.err().expect("an overlong busy poll is an error");
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("busy poll"), "{e}");
}

/// Back-to-back SETs are committed as one store batch; replies and
/// effects must still follow request order, with repeated keys, other
/// commands and MSET in between, and survive a reopen.
#[test]
fn pipelined_sets_keep_request_order() {
    let dir = TempDir::new("srv", "setbatch");
    let srv = start(&dir, None);
    let mut c = Client::new(srv.addr());
    let mut wire = Vec::new();
    let mut want = Vec::new();
    for i in 0..300u32 {
        let k = format!("k{}", i % 7);
        let v = format!("v{i}");
        wire.extend(Client::encode(&[b"SET", k.as_bytes(), v.as_bytes()]));
        want.push(ok());
        if i % 5 == 0 {
            wire.extend(Client::encode(&[b"GET", k.as_bytes()]));
            want.push(b(&v));
        }
        if i % 11 == 0 {
            wire.extend(Client::encode(&[b"INCR", b"n"]));
            want.push(V::Int((i / 11 + 1) as i64));
        }
        if i % 13 == 0 {
            wire.extend(Client::encode(&[
                b"MSET",
                b"m1",
                v.as_bytes(),
                b"m2",
                b"x",
                b"m1",
                b"last",
            ]));
            want.push(ok());
            // Not a plain SET: executed in order between the batches.
            wire.extend(Client::encode(&[b"SET", b"m1", b"other", b"NX"]));
            want.push(V::Nil);
        }
    }
    // Wrong arity stays an error even between batched SETs.
    wire.extend(Client::encode(&[b"SET", b"only-key"]));
    want.push(V::Err(
        "ERR wrong number of arguments for 'set' command".into(),
    ));
    // A run of GETs (one batch): present, missing and repeated keys, a SET
    // in the middle that the GETs after it must see.
    let mut last: std::collections::HashMap<String, String> = Default::default();
    for i in 0..300u32 {
        last.insert(format!("k{}", i % 7), format!("v{i}"));
    }
    for j in [0, 1, 2, 3, 4, 5, 6, 0, 0] {
        let k = format!("k{j}");
        wire.extend(Client::encode(&[b"GET", k.as_bytes()]));
        want.push(b(&last[&k]));
    }
    wire.extend(Client::encode(&[b"GET", b"no-such-key"]));
    want.push(V::Nil);
    wire.extend(Client::encode(&[b"SET", b"k0", b"changed"]));
    want.push(ok());
    wire.extend(Client::encode(&[b"GET", b"k0"]));
    want.push(b("changed"));
    wire.extend(Client::encode(&[b"GET", b"k1"]));
    want.push(b(&last["k1"]));
    c.w.write_all(&wire).unwrap();
    for (i, w) in want.iter().enumerate() {
        assert_eq!(&c.read(), w, "reply {i}");
    }
    // An oversized key among pipelined GETs gets the single GET's error.
    let huge = vec![b'h'; store::MAX_KEY + 1];
    let mut wire = Client::encode(&[b"GET", b"k1"]);
    wire.extend(Client::encode(&[b"GET", &huge]));
    wire.extend(Client::encode(&[b"GET", b"k1"]));
    c.w.write_all(&wire).unwrap();
    assert_eq!(c.read(), b(&last["k1"]));
    let r = c.read();
    assert!(matches!(r, V::Err(_)), "oversized key gave {r:?}");
    assert_eq!(c.read(), b(&last["k1"]));
    // And in an MGET, the same error for the whole reply.
    let huge_s = String::from_utf8(huge.clone()).unwrap();
    let r = c.cmd(&["MGET", "k1", &huge_s]);
    assert!(
        matches!(r, V::Err(_)),
        "MGET with an oversized key gave {r:?}"
    );
    let finals: Vec<V> = (0..7).map(|j| c.cmd(&["GET", &format!("k{j}")])).collect();
    assert_eq!(c.cmd(&["GET", "m1"]), b("last"));
    srv.stop().unwrap();
    // Durable and the same after a reopen.
    let srv = start(&dir, None);
    let mut c = Client::new(srv.addr());
    for (j, f) in finals.iter().enumerate() {
        assert_eq!(&c.cmd(&["GET", &format!("k{j}")]), f);
    }
    assert_eq!(c.cmd(&["GET", "m1"]), b("last"));
    assert_eq!(c.cmd(&["GET", "m2"]), b("x"));
    srv.stop().unwrap();
}

/// A client that sends a long pipeline of large GETs without reading is
/// not served past the output limit until it reads, does not stall the
/// other clients of its event loop, and then gets every reply intact.
#[test]
fn a_client_that_does_not_read_does_not_stall_the_others() {
    let dir = TempDir::new("srv", "slow");
    let srv = start_with(&dir, None, 1);
    let mut c = Client::new(srv.addr());
    let big: Vec<u8> = (0..512 * 1024u32).map(|i| (i % 251) as u8).collect();
    c.send(&[b"SET", b"big", &big]);
    assert_eq!(c.read(), ok());
    const N: usize = 200; // 100 MiB of replies
    let mut wire = Vec::new();
    for _ in 0..N {
        wire.extend(Client::encode(&[b"GET", b"big"]));
    }
    c.w.write_all(&wire).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    // Same (only) worker: it must still answer someone else.
    let mut other = Client::new(srv.addr());
    for i in 0..50 {
        let k = format!("o{i}");
        assert_eq!(other.cmd(&["SET", &k, "1"]), ok());
    }
    for i in 0..N {
        assert_eq!(c.read(), V::Bulk(big.clone()), "reply {i}");
    }
    assert_eq!(c.cmd(&["PING"]), V::Simple("PONG".into()));
    srv.stop().unwrap();
}

/// A client that sends its requests and shuts its side down at once (as
/// `echo PING | nc` does) gets every reply and then the end of the
/// stream; the server forgets the connection.
#[test]
fn a_client_that_sends_then_half_closes_is_answered_and_forgotten() {
    let dir = TempDir::new("srv", "halfclose");
    let srv = start_with(&dir, None, 1);
    for i in 0..50 {
        let mut s = TcpStream::connect(srv.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        if i % 2 == 1 {
            // Registered and idle first: the bytes and the close then
            // arrive on a connection the loop already watches.
            std::thread::sleep(Duration::from_millis(20));
        }
        s.write_all(b"PING\r\nECHO hi\r\n").unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"+PONG\r\n$2\r\nhi\r\n", "round {i}");
    }
    let mut c = Client::new(srv.addr());
    eventually("half-closed connections closed", || {
        let V::Bulk(info) = c.cmd(&["INFO"]) else {
            panic!("INFO is a bulk string")
        };
        let info = String::from_utf8(info).unwrap();
        info.contains("connected_clients:1\r\n")
            .then_some(())
            .ok_or(info)
    });
    srv.stop().unwrap();
}

/// Past `max_clients` a new connection gets the error and is closed; once
/// a client leaves, a new one is served again.
#[test]
fn connections_past_max_clients_are_refused() {
    let dir = TempDir::new("srv", "maxclients");
    let srv = start_cfg(
        &dir,
        Config {
            addr: "127.0.0.1:0".into(),
            max_clients: 3,
            ..Config::default()
        },
    );
    let mut held: Vec<Client> = (0..3).map(|_| Client::new(srv.addr())).collect();
    for c in &mut held {
        assert_eq!(c.cmd(&["PING"]), V::Simple("PONG".into()));
    }
    let mut extra = Client::new(srv.addr());
    assert_eq!(
        extra.read(),
        V::Err("ERR max number of clients reached".into())
    );
    assert!(extra.closed(), "the refused connection is closed");
    assert_eq!(held[0].cmd(&["QUIT"]), ok());
    drop(held.remove(0));
    // The server notices the departure asynchronously.
    eventually("a connection served after a client left", || {
        // A refused connection is told at once; an accepted one says
        // nothing until asked.
        let mut s = TcpStream::connect(srv.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut first = [0u8; 64];
        match s.read(&mut first) {
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                let mut c = Client::new_from(s);
                assert_eq!(c.cmd(&["PING"]), V::Simple("PONG".into()));
                Ok(())
            }
            r => Err(format!("still refused: {r:?}")),
        }
    });
    srv.stop().unwrap();
}

#[test]
fn length_bombs_and_bad_framing_close_only_that_connection() {
    let dir = TempDir::new("srv", "bomb");
    let srv = start(&dir, None);
    let mut good = Client::new(srv.addr());
    assert_eq!(good.cmd(&["SET", "k", "v"]), ok());
    for bad in [
        &b"*1\r\n$99999999999\r\n"[..],
        b"*99999999999\r\n",
        b"*2\r\n$3\r\nGET\r\n+k\r\n",
        b"*1\r\n$3\r\nGETX\r\n",
        b"*x\r\n",
    ] {
        let mut c = Client::new(srv.addr());
        c.w.write_all(bad).unwrap();
        let r = c.read();
        assert!(is_err(&r, "Protocol error"), "{bad:?} gave {r:?}");
        assert!(c.closed(), "{bad:?}: the connection is closed");
    }
    assert_eq!(good.cmd(&["GET", "k"]), b("v"), "other clients go on");
    srv.stop().unwrap();
}

#[test]
fn many_clients_at_once() {
    let dir = TempDir::new("srv", "many");
    let srv = start(&dir, None);
    let addr = srv.addr();
    std::thread::scope(|s| {
        for t in 0..200 {
            s.spawn(move || {
                let mut c = Client::new(addr);
                for i in 0..20 {
                    let k = format!("c{t}-{i}");
                    assert_eq!(c.cmd(&["SET", &k, &k]), ok());
                    assert_eq!(c.cmd(&["GET", &k]), b(&k));
                }
                assert!(matches!(c.cmd(&["INCR", "shared"]), V::Int(1..=200)));
            });
        }
    });
    let mut c = Client::new(addr);
    assert_eq!(c.cmd(&["DBSIZE"]), V::Int(200 * 20 + 1));
    assert_eq!(c.cmd(&["GET", "shared"]), b("200"), "INCR is atomic");
    srv.stop().unwrap();
}

#[test]
fn stop_closes_the_store_cleanly() {
    let dir = TempDir::new("srv", "stop");
    {
        let srv = start(&dir, None);
        let mut c = Client::new(srv.addr());
        assert_eq!(c.cmd(&["SET", "durable", "yes"]), ok());
        // A client still connected does not block the stop.
        srv.stop().unwrap();
        assert!(c.closed());
    }
    let st = Store::open(dir.path(), options()).unwrap();
    assert_eq!(
        st.stats().opened_from,
        store::OpenedFrom::Image,
        "the shutdown was clean"
    );
    assert_eq!(st.get(b"durable").unwrap().as_deref(), Some(&b"yes"[..]));
    st.close().unwrap();
}
