//! Command arguments: an in-process [`server::Server`] on 127.0.0.1:0 over
//! a store in a scratch directory, fed sequences of real commands with
//! mutated arguments (and sometimes mutated framing) over a socket.
//!
//! Input: the bytes one connection sends.
//!
//! Checks, after each case: a second connection gets `+PONG` to `PING`
//! within [`LIVE_BOUND`] (the server is alive and its loops are not held),
//! and the process's resident memory stays under [`RSS_BOUND`]. A case
//! that kills the server's process by a signal or hangs it is caught by
//! the driver.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use engine::scratch::TempDir;
use server::{Config, Server};
use store::{CreateOptions, GcMode, OpenOptions, Options, Store};

use crate::mutate::{mutate, NUMBERS};
use crate::resp::encode;
use crate::{Failure, Rng, Target};

/// How long a `PING` on a fresh connection may take after a case.
pub(crate) const LIVE_BOUND: Duration = Duration::from_secs(3);
/// The most resident memory the process may reach.
pub(crate) const RSS_BOUND: u64 = 2 << 30;
/// How long a case's connection may stay quiet, once the whole case is
/// sent, before the server has answered everything and closed it.
const DRAIN: Duration = Duration::from_secs(3);
/// The server's event loops.
const THREADS: usize = 2;

/// Real commands, the seeds that arguments are mutated from.
const SEEDS: &[&str] = &[
    "SET k v",
    "SET k v NX",
    "SET k v XX GET",
    "SET k v EX 10",
    "SET k v PX 100 KEEPTTL",
    "GET k",
    "GETSET k v2",
    "DEL k k2",
    "UNLINK k",
    "EXISTS k k2 k3",
    "MGET k k2 k3",
    "MSET k v k2 v2",
    "INCR n",
    "DECR n",
    "INCRBY n 5",
    "DECRBY n 3",
    "SCAN 0",
    "SCAN 0 MATCH k* COUNT 10",
    "SCAN 0 MATCH k? TYPE string",
    "SCAN 0 MATCH [a-z]* COUNT 1000",
    "SET aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa v",
    "SCAN 0 MATCH *a*a*a*a*a*a*a*a*a*a*a*a*b COUNT 100",
    "RANGE a z",
    "RANGE a z LIMIT 10",
    "DBSIZE",
    "PING",
    "PING hello",
    "ECHO hello",
    "HELLO 3",
    "HELLO 2",
    "HELLO 3 AUTH default secret SETNAME fuzz",
    "AUTH secret",
    "SELECT 0",
    "INFO",
    "COMMAND",
    "COMMAND COUNT",
    "CONFIG GET *",
    "CONFIG GET max*",
    "CLIENT SETNAME fuzz",
    "CLIENT GETNAME",
    "CLIENT SETINFO lib-name fuzz",
    "SAVE",
    "FLUSHALL",
    "QUIT",
];

/// A running server over a scratch store (made at the first case).
struct Running {
    srv: Server,
    _dir: TempDir,
}

#[derive(Default)]
pub(crate) struct Commands {
    running: Option<Running>,
    /// What this server was sent so far, session by session (the state a
    /// failure may depend on), up to [`HISTORY`] bytes.
    history: Vec<Vec<u8>>,
}

/// Separates the sessions of an input (each is sent on a connection of its
/// own, with the checks after each).
pub(crate) const SESSION_BREAK: &[u8] = b"\n--pmhash-fuzz session--\n";
/// The most history kept for a reproducing input.
const HISTORY: usize = 8 << 20;

fn sessions(input: &[u8]) -> Vec<&[u8]> {
    let mut v = Vec::new();
    let mut rest = input;
    while let Some(i) = rest
        .windows(SESSION_BREAK.len())
        .position(|w| w == SESSION_BREAK)
    {
        v.push(&rest[..i]);
        rest = &rest[i + SESSION_BREAK.len()..];
    }
    v.push(rest);
    v
}

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

fn mutate_arg(rng: &mut Rng, a: &mut Vec<u8>) {
    match rng.below(6) {
        0 => *a = NUMBERS[rng.below(NUMBERS.len() as u64) as usize].into(),
        1 => *a = (0..rng.below(40)).map(|_| rng.next() as u8).collect(),
        2 => a.clear(),
        3 => *a = vec![b'x'; 1 + rng.below(20_000) as usize],
        _ => mutate(rng, a, 4, 4096),
    }
}

/// `SHUTDOWN` would stop the server (as it should): every spelling of it
/// becomes `PING` and spaces.
fn defuse(wire: &mut [u8]) {
    for i in 0..wire.len().saturating_sub(7) {
        if wire[i..i + 8].eq_ignore_ascii_case(b"shutdown") {
            wire[i..i + 8].copy_from_slice(b"PING    ");
        }
    }
}

fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// `PING` on `n` new connections at once (the acceptor deals connections
/// to the event loops in turn, so `n` = loops reaches every loop): each
/// must answer `+PONG` within [`LIVE_BOUND`].
fn ping_all(addr: SocketAddr, n: usize) -> Result<(), String> {
    let t0 = Instant::now();
    let mut socks = Vec::new();
    for _ in 0..n {
        let mut s =
            TcpStream::connect_timeout(&addr, LIVE_BOUND).map_err(|e| format!("connect: {e}"))?;
        s.set_write_timeout(Some(LIVE_BOUND))
            .map_err(|e| e.to_string())?;
        s.write_all(b"*1\r\n$4\r\nPING\r\n")
            .map_err(|e| format!("write: {e}"))?;
        socks.push(s);
    }
    for (i, mut s) in socks.into_iter().enumerate() {
        let left = LIVE_BOUND.saturating_sub(t0.elapsed());
        if left.is_zero() {
            return Err(format!("connection {i}: no answer in {LIVE_BOUND:?}"));
        }
        s.set_read_timeout(Some(left)).map_err(|e| e.to_string())?;
        let mut got = Vec::new();
        let mut buf = [0u8; 64];
        while !got.ends_with(b"\r\n") {
            match s.read(&mut buf) {
                Ok(0) => {
                    return Err(format!(
                        "connection {i}: closed after {:?}",
                        String::from_utf8_lossy(&got)
                    ))
                }
                Ok(k) => got.extend_from_slice(&buf[..k]),
                Err(e) => {
                    return Err(format!(
                        "connection {i}: {e} after {:?} (bound {LIVE_BOUND:?})",
                        t0.elapsed()
                    ))
                }
            }
        }
        if got != b"+PONG\r\n" {
            return Err(format!(
                "connection {i}: answered {:?}",
                String::from_utf8_lossy(&got)
            ));
        }
    }
    Ok(())
}

/// Sends the case on one connection, closes its sending side, and reads
/// until the server closes it. `Err` when the server goes quiet for
/// [`DRAIN`] without closing (a held event loop).
fn send_case(addr: SocketAddr, wire: &[u8]) -> Result<(), String> {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, LIVE_BOUND) else {
        return Ok(());
    };
    let _ = s.set_write_timeout(Some(DRAIN));
    let _ = s.set_read_timeout(Some(DRAIN));
    // A server that closes early (a framing error) makes the write fail:
    // that is its right.
    let _ = s.write_all(wire);
    let _ = s.shutdown(Shutdown::Write);
    let mut buf = vec![0u8; 64 << 10];
    let mut total = 0usize;
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => total += n,
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                return Err(format!(
                    "the case's connection got {total} bytes, then nothing and no close for {DRAIN:?} after the client's end of input"
                ))
            }
            Err(_) => return Ok(()),
        }
    }
}

impl Target for Commands {
    fn generate(&mut self, rng: &mut Rng) -> Vec<u8> {
        let mut wire = Vec::new();
        for _ in 0..1 + rng.below(12) {
            let seed = SEEDS[rng.below(SEEDS.len() as u64) as usize];
            let mut req: Vec<Vec<u8>> = seed.split(' ').map(|w| w.as_bytes().to_vec()).collect();
            for _ in 0..rng.below(4) {
                match rng.below(5) {
                    0 if req.len() > 1 => {
                        req.remove(1 + rng.below(req.len() as u64 - 1) as usize);
                    }
                    1 => {
                        let a = req[rng.below(req.len() as u64) as usize].clone();
                        let most = if rng.below(4) == 0 { 50 } else { 3 };
                        for _ in 0..1 + rng.below(most) {
                            req.push(a.clone());
                        }
                    }
                    _ => {
                        let i = if req.len() > 1 && rng.below(6) != 0 {
                            1 + rng.below(req.len() as u64 - 1) as usize
                        } else {
                            0
                        };
                        mutate_arg(rng, &mut req[i]);
                    }
                }
            }
            if rng.below(8) == 0 && req.iter().all(|a| !a.is_empty() && !a.contains(&b' ')) {
                // Inline form.
                wire.extend_from_slice(&req.join(&b' '));
                wire.extend_from_slice(b"\r\n");
            } else {
                encode(&req, &mut wire);
            }
        }
        if rng.below(6) == 0 {
            mutate(rng, &mut wire, 4, 1 << 18);
        }
        defuse(&mut wire);
        wire
    }

    fn run(&mut self, input: &[u8]) -> Result<(), Failure> {
        for session in sessions(input) {
            let mut wire = session.to_vec();
            defuse(&mut wire);
            self.history.push(wire.clone());
            while self.history.len() > 1
                && self.history.iter().map(Vec::len).sum::<usize>() > HISTORY
            {
                self.history.remove(0);
            }
            if let Err(mut f) = self.session(&wire) {
                f.repro = Some(self.history.join(SESSION_BREAK));
                f.msg.push_str(&format!(
                    " (the saved input holds the {} sessions this server was sent, the last one failing)",
                    self.history.len()
                ));
                return Err(f);
            }
        }
        Ok(())
    }
}

impl Commands {
    fn session(&mut self, wire: &[u8]) -> Result<(), Failure> {
        if self.running.is_none() {
            let dir = TempDir::new("pmhash-fuzz", "commands");
            let st = Store::open(dir.path(), options())
                .map_err(|e| Failure::fatal(format!("the scratch store does not open: {e}")))?;
            let cfg = Config {
                addr: "127.0.0.1:0".into(),
                threads: THREADS,
                ..Config::default()
            };
            let srv = Server::start(st, cfg)
                .map_err(|e| Failure::fatal(format!("the server does not start: {e}")))?;
            self.running = Some(Running { srv, _dir: dir });
        }
        let addr = self.running.as_ref().expect("started").srv.addr();
        send_case(addr, wire).map_err(Failure::fatal)?;
        ping_all(addr, THREADS).map_err(|e| {
            Failure::fatal(format!("after the case, PING on a new connection: {e}"))
        })?;
        let rss = resident_bytes();
        if rss > RSS_BOUND {
            return Err(Failure::fatal(format!(
                "the process holds {} MiB resident (bound {} MiB)",
                rss >> 20,
                RSS_BOUND >> 20
            )));
        }
        Ok(())
    }
}
