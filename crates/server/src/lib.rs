//! `pmhash serve`: the store behind the Redis protocol (RESP2, and RESP3
//! after `HELLO 3`).
//!
//! - **Connections.** A few event-loop threads ([`net`]), each serving
//!   many connections; a connection's requests are answered in order, and
//!   a pipeline that arrives together is answered with one write.
//! - **Atomic commands.** Every write takes a per-key lock (stripes by key
//!   hash), so `SET NX/XX/GET`, `GETSET` and `INCR` are atomic with respect
//!   to every other write of the key. `MSET` sets its keys one after
//!   another: each key is atomic, the batch is not (and after a crash a
//!   prefix of it may be there).
//! - **Durability.** The store's: under `strict` a write is durable when
//!   its reply is sent.
//! - **Limits.** See [`resp`]: a length bomb or broken framing gets an
//!   error and that connection is closed; the server keeps serving.
//! - **Shutdown.** `SHUTDOWN`, SIGTERM or SIGINT stop accepting, close every
//!   connection and close the store cleanly (the next open is instant).

mod net;
pub mod resp;

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

pub use net::{BUSY_POLL, MAX_CLIENTS};
use resp::Reply;
use store::Store;

/// Server settings.
#[derive(Clone, Debug)]
pub struct Config {
    pub addr: String,
    /// Clients must `AUTH` with this before any other command.
    pub requirepass: Option<String>,
    /// Event-loop threads (0: one per CPU less one, at least one).
    pub threads: usize,
    /// Most connections at once; one more gets `-ERR max number of
    /// clients reached` and is closed.
    pub max_clients: u64,
    /// How long an event loop that just had work keeps polling before it
    /// sleeps in `epoll_wait` (zero: it sleeps at once, as Redis does).
    /// A request that arrives meanwhile is served without the thread's
    /// wake-up; the price is CPU: a loop whose requests come less than
    /// this far apart spins all the time. A loop with nothing to do does
    /// not spin. `None`: [`BUSY_POLL`] while the loops leave a CPU free,
    /// else zero (polling loops that fill every CPU slow down whatever
    /// else runs there, the clients on this machine included).
    pub busy_poll: Option<std::time::Duration>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            addr: "127.0.0.1:6379".into(),
            requirepass: None,
            threads: 0,
            max_clients: MAX_CLIENTS,
            busy_poll: None,
        }
    }
}

/// The longest [`Config::busy_poll`] accepted.
pub const MAX_BUSY_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// `Err` with the reason if `busy_poll` is over [`MAX_BUSY_POLL`]
/// ([`Server::start`] refuses such a config; a caller can ask first, before
/// it makes anything).
pub fn check_busy_poll(busy_poll: Option<std::time::Duration>) -> Result<(), String> {
    match busy_poll {
        Some(d) if d > MAX_BUSY_POLL => Err(format!(
            "a busy poll of {} µs is over the limit of {} µs: a loop would spin between requests a client sees as idle",
            d.as_micros(),
            MAX_BUSY_POLL.as_micros()
        )),
        _ => Ok(()),
    }
}

static SIGNALED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    SIGNALED.store(true, Ordering::SeqCst);
}

/// Makes SIGTERM and SIGINT request a clean shutdown of every server in
/// this process.
pub fn install_signal_handlers() {
    // SAFETY: the handler only stores to an atomic, which is
    // async-signal-safe; the sigaction struct is zeroed then filled.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGTERM, &sa, std::ptr::null_mut());
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
    }
}

struct Shared {
    store: Store,
    cfg: Config,
    stop: AtomicBool,
    locks: Box<[Mutex<()>]>,
    cursors: Mutex<Cursors>,
    next_id: AtomicU64,
    clients: AtomicU64,
    commands: AtomicU64,
    started: std::time::Instant,
    /// `cfg.busy_poll`, resolved.
    busy_poll: std::time::Duration,
}

/// A running server.
pub struct Server {
    shared: Arc<Shared>,
    addr: SocketAddr,
    threads: Vec<JoinHandle<()>>,
}

impl Server {
    /// Binds `cfg.addr` and starts serving `store`.
    pub fn start(store: Store, cfg: Config) -> std::io::Result<Server> {
        check_busy_poll(cfg.busy_poll)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let listener = TcpListener::bind(&cfg.addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let n = match cfg.threads {
            // One CPU is left to the store's background thread (GC, the
            // ordered index) and to clients on the same machine: on 2
            // CPUs, two loops against redis-benchmark made 3+ busy threads
            // on 2 CPUs and unpipelined requests 25% slower than one loop
            // (docs/benchmarks.md).
            0 => {
                std::thread::available_parallelism().map_or(1, |n| n.get().saturating_sub(1).max(1))
            }
            n => n,
        };
        let cpus = std::thread::available_parallelism().map_or(1, |c| c.get());
        let busy_poll = cfg.busy_poll.unwrap_or(if n < cpus {
            BUSY_POLL
        } else {
            std::time::Duration::ZERO
        });
        let shared = Arc::new(Shared {
            store,
            cfg,
            stop: AtomicBool::new(false),
            locks: (0..1024).map(|_| Mutex::new(())).collect(),
            cursors: Mutex::new(Cursors::default()),
            next_id: AtomicU64::new(1),
            clients: AtomicU64::new(0),
            commands: AtomicU64::new(0),
            started: std::time::Instant::now(),
            busy_poll,
        });
        let mut srv = Server {
            shared: shared.clone(),
            addr,
            threads: Vec::new(),
        };
        let mut mailboxes = Vec::new();
        for i in 0..n {
            let (mailbox, poll) = match net::new_worker() {
                Ok(w) => w,
                Err(e) => {
                    srv.halt();
                    return Err(e);
                }
            };
            let (sh, mb) = (shared.clone(), mailbox.clone());
            match std::thread::Builder::new()
                .name(format!("pmhash-worker-{i}"))
                .spawn(move || net::worker_loop(&sh, &mb, poll))
            {
                Ok(h) => srv.threads.push(h),
                Err(e) => {
                    srv.halt();
                    return Err(e);
                }
            }
            mailboxes.push(mailbox);
        }
        let sh = shared.clone();
        match std::thread::Builder::new()
            .name("pmhash-accept".into())
            .spawn(move || net::accept_loop(&sh, listener, &mailboxes))
        {
            Ok(h) => srv.threads.insert(0, h),
            Err(e) => {
                srv.halt();
                return Err(e);
            }
        }
        Ok(srv)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Blocks until `SHUTDOWN`, a signal, or [`stop`](Self::stop); then
    /// closes every connection and the store cleanly.
    pub fn wait(mut self) -> engine::Result<()> {
        // The acceptor returns first (it wakes every worker as it goes).
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
        self.shared.store.close()
    }

    /// Asks the server to stop (as `SHUTDOWN` does) and waits for it.
    pub fn stop(self) -> engine::Result<()> {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.wait()
    }

    /// Stops the threads a failed start had already made.
    fn halt(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }
}

fn stopping(sh: &Shared) -> bool {
    sh.stop.load(Ordering::SeqCst) || SIGNALED.load(Ordering::SeqCst)
}

/// Per-connection state.
struct Client {
    resp3: bool,
    authed: bool,
    name: Vec<u8>,
    id: u64,
}

impl Client {
    fn new(sh: &Shared) -> Client {
        Client {
            resp3: false,
            authed: sh.cfg.requirepass.is_none(),
            name: Vec::new(),
            id: sh.next_id.fetch_add(1, Ordering::Relaxed),
        }
    }
}

enum After {
    Continue,
    Close,
}

fn upper(a: &[u8]) -> String {
    String::from_utf8_lossy(a).to_ascii_uppercase()
}

fn wrong_args(cmd: &str) -> Reply {
    Reply::err(format!(
        "wrong number of arguments for '{}' command",
        cmd.to_ascii_lowercase()
    ))
}

fn store_err(e: engine::Error) -> Reply {
    Reply::err(e.to_string())
}

fn stripe(sh: &Shared, key: &[u8]) -> usize {
    (store::layout::key_hash(key) >> 40) as usize % sh.locks.len()
}

fn lock<'a>(sh: &'a Shared, key: &[u8]) -> std::sync::MutexGuard<'a, ()> {
    sh.locks[stripe(sh, key)].lock().expect("key lock")
}

/// Plain `SET key value` of every pair, as one store batch (one fence for
/// all). Every key's lock is held through the batch (taken in stripe
/// order: no deadlock). Returns how many pairs (a prefix) were set and,
/// if the batch stopped, the error for the rest.
fn set_batch(sh: &Shared, pairs: &[(&[u8], &[u8])]) -> (usize, Option<Reply>) {
    let mut stripes: Vec<usize> = pairs.iter().map(|(k, _)| stripe(sh, k)).collect();
    stripes.sort_unstable();
    stripes.dedup();
    let _held: Vec<_> = stripes
        .iter()
        .map(|&i| sh.locks[i].lock().expect("key lock"))
        .collect();
    match sh.store.put_batch(pairs) {
        Ok(()) => (pairs.len(), None),
        Err(e) => (e.done, Some(store_err(e.error))),
    }
}

fn get(sh: &Shared, key: &[u8]) -> Result<Option<Vec<u8>>, Reply> {
    sh.store.get(key).map_err(store_err)
}

/// Redis's integer syntax: an optional `-`, no `+`, no leading zeros, no
/// `-0`, no spaces.
fn parse_i64(b: &[u8]) -> Option<i64> {
    let digits = b.strip_prefix(b"-").unwrap_or(b);
    if digits.is_empty()
        || digits.len() > 19
        || !digits.iter().all(u8::is_ascii_digit)
        || (digits[0] == b'0' && (digits.len() > 1 || b.len() > 1))
    {
        return None;
    }
    std::str::from_utf8(b).ok()?.parse().ok()
}

fn dispatch(sh: &Shared, c: &mut Client, args: &[Vec<u8>]) -> (Option<Reply>, After) {
    let cmd = upper(&args[0]);
    let n = args.len();
    if !c.authed && !matches!(cmd.as_str(), "AUTH" | "HELLO" | "QUIT") {
        return (
            Some(Reply::err("NOAUTH Authentication required.")),
            After::Continue,
        );
    }
    let reply = match cmd.as_str() {
        "PING" => match n {
            1 => Reply::Simple("PONG".into()),
            2 => Reply::Bulk(args[1].clone()),
            _ => wrong_args(&cmd),
        },
        "ECHO" if n == 2 => Reply::Bulk(args[1].clone()),
        "QUIT" => return (Some(Reply::Ok), After::Close),
        "AUTH" => match n {
            2 | 3 => auth(sh, c, &args[n - 1]),
            _ => wrong_args(&cmd),
        },
        "HELLO" => return (Some(hello(sh, c, args)), After::Continue),
        "SELECT" if n == 2 => {
            if args[1] == b"0" {
                Reply::Ok
            } else {
                Reply::err("DB index is out of range")
            }
        }
        "GET" if n == 2 => match get(sh, &args[1]) {
            Ok(Some(v)) => Reply::Bulk(v),
            Ok(None) => Reply::Nil,
            Err(r) => r,
        },
        "SET" if n >= 3 => set(sh, args),
        "GETSET" if n == 3 => {
            let _l = lock(sh, &args[1]);
            match get(sh, &args[1]) {
                Err(r) => r,
                Ok(old) => match sh.store.put(&args[1], &args[2]) {
                    Err(e) => store_err(e),
                    Ok(()) => old.map_or(Reply::Nil, Reply::Bulk),
                },
            }
        }
        "DEL" | "UNLINK" if n >= 2 => {
            let mut count = 0;
            for k in &args[1..] {
                let _l = lock(sh, k);
                match sh.store.delete(k) {
                    Ok(true) => count += 1,
                    Ok(false) => {}
                    Err(e) => return (Some(store_err(e)), After::Continue),
                }
            }
            Reply::Int(count)
        }
        "EXISTS" if n >= 2 => {
            let mut count = 0;
            for k in &args[1..] {
                match get(sh, k) {
                    Ok(Some(_)) => count += 1,
                    Ok(None) => {}
                    Err(r) => return (Some(r), After::Continue),
                }
            }
            Reply::Int(count)
        }
        "MGET" if n >= 2 => Reply::Array(
            args[1..]
                .iter()
                .map(|k| match get(sh, k) {
                    Ok(Some(v)) => Reply::Bulk(v),
                    Ok(None) => Reply::Nil,
                    Err(r) => r,
                })
                .collect(),
        ),
        "MSET" if n >= 3 && n % 2 == 1 => {
            let pairs: Vec<(&[u8], &[u8])> = args[1..]
                .chunks(2)
                .map(|kv| (&kv[0][..], &kv[1][..]))
                .collect();
            match set_batch(sh, &pairs) {
                (_, Some(err)) => err,
                (_, None) => Reply::Ok,
            }
        }
        "INCR" | "DECR" if n == 2 => incr_by(sh, &args[1], if cmd == "INCR" { 1 } else { -1 }),
        "INCRBY" | "DECRBY" if n == 3 => match parse_i64(&args[2]) {
            Some(d) => incr_by(
                sh,
                &args[1],
                if cmd == "INCRBY" { d } else { d.wrapping_neg() },
            ),
            None => Reply::err("value is not an integer or out of range"),
        },
        "SCAN" if n >= 2 => scan(sh, args),
        "RANGE" if n >= 3 => range(sh, args),
        "DBSIZE" if n == 1 => Reply::Int(sh.store.len() as i64),
        "FLUSHALL" | "FLUSHDB" => {
            let mut keys = Vec::new();
            sh.store.for_each(|k, _| keys.push(k.to_vec()));
            for k in keys {
                let _l = lock(sh, &k);
                if let Err(e) = sh.store.delete(&k) {
                    return (Some(store_err(e)), After::Continue);
                }
            }
            Reply::Ok
        }
        "SAVE" | "BGSAVE" => match sh.store.sync() {
            Ok(()) => Reply::Ok,
            Err(e) => store_err(e),
        },
        "INFO" => Reply::Bulk(info(sh).into_bytes()),
        "COMMAND" => match args.get(1).map(|a| upper(a)).as_deref() {
            Some("COUNT") => Reply::Int(0),
            _ => Reply::Array(Vec::new()),
        },
        "CONFIG" if n >= 3 && upper(&args[1]) == "GET" => config_get(&args[2]),
        "CLIENT" if n >= 2 => match upper(&args[1]).as_str() {
            "SETNAME" if n == 3 => {
                c.name = args[2].clone();
                Reply::Ok
            }
            "GETNAME" => {
                if c.name.is_empty() {
                    Reply::Nil
                } else {
                    Reply::Bulk(c.name.clone())
                }
            }
            "SETINFO" => Reply::Ok,
            "ID" => Reply::Int(c.id as i64),
            _ => Reply::err("unsupported CLIENT subcommand"),
        },
        "SHUTDOWN" => {
            sh.stop.store(true, Ordering::SeqCst);
            return (None, After::Close);
        }
        "ECHO" | "SELECT" | "GET" | "SET" | "GETSET" | "DEL" | "UNLINK" | "EXISTS" | "MGET"
        | "MSET" | "INCR" | "DECR" | "INCRBY" | "DECRBY" | "SCAN" | "RANGE" | "DBSIZE"
        | "CONFIG" | "CLIENT" => wrong_args(&cmd),
        _ => Reply::err(format!(
            "unknown command '{}', with args beginning with: {}",
            String::from_utf8_lossy(&args[0]),
            args[1..]
                .iter()
                .map(|a| format!("'{}' ", String::from_utf8_lossy(a)))
                .collect::<String>()
        )),
    };
    (Some(reply), After::Continue)
}

fn auth(sh: &Shared, c: &mut Client, pass: &[u8]) -> Reply {
    match &sh.cfg.requirepass {
        None => Reply::err(
            "AUTH <password> called without any password configured for the default user",
        ),
        Some(p) if p.as_bytes() == pass => {
            c.authed = true;
            Reply::Ok
        }
        Some(_) => Reply::err("WRONGPASS invalid username-password pair or user is disabled."),
    }
}

fn hello(sh: &Shared, c: &mut Client, args: &[Vec<u8>]) -> Reply {
    let mut i = 1;
    let mut proto = if c.resp3 { 3 } else { 2 };
    if let Some(v) = args.get(1) {
        match parse_i64(v) {
            Some(2) => proto = 2,
            Some(3) => proto = 3,
            _ => return Reply::err("NOPROTO unsupported protocol version"),
        }
        i = 2;
    }
    while i < args.len() {
        match upper(&args[i]).as_str() {
            "AUTH" if i + 2 < args.len() => {
                if let r @ Reply::Error(_) = auth(sh, c, &args[i + 2]) {
                    return r;
                }
                i += 3;
            }
            "SETNAME" if i + 1 < args.len() => {
                c.name = args[i + 1].clone();
                i += 2;
            }
            _ => return Reply::err("syntax error in HELLO"),
        }
    }
    if !c.authed {
        return Reply::err("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time");
    }
    c.resp3 = proto == 3;
    let s = |v: &str| Reply::Bulk(v.as_bytes().to_vec());
    Reply::Map(vec![
        (s("server"), s("pmhash")),
        (s("version"), s(env!("CARGO_PKG_VERSION"))),
        (s("proto"), Reply::Int(proto)),
        (s("id"), Reply::Int(c.id as i64)),
        (s("mode"), s("standalone")),
        (s("role"), s("master")),
        (s("modules"), Reply::Array(Vec::new())),
    ])
}

fn set(sh: &Shared, args: &[Vec<u8>]) -> Reply {
    let (key, val) = (&args[1], &args[2]);
    let (mut nx, mut xx, mut want_old) = (false, false, false);
    for o in &args[3..] {
        match upper(o).as_str() {
            "NX" => nx = true,
            "XX" => xx = true,
            "GET" => want_old = true,
            "EX" | "PX" | "EXAT" | "PXAT" | "KEEPTTL" => {
                return Reply::err("expiry (EX/PX/EXAT/PXAT/KEEPTTL) is not supported by pmhash")
            }
            _ => return Reply::err("syntax error"),
        }
    }
    if nx && xx {
        return Reply::err("syntax error");
    }
    let _l = lock(sh, key);
    let old = if nx || xx || want_old {
        match get(sh, key) {
            Ok(o) => o,
            Err(r) => return r,
        }
    } else {
        None
    };
    let present = old.is_some();
    let skip = (nx && present) || (xx && !present);
    if !skip {
        if let Err(e) = sh.store.put(key, val) {
            return store_err(e);
        }
    }
    match (want_old, skip) {
        (true, _) => old.map_or(Reply::Nil, Reply::Bulk),
        (false, true) => Reply::Nil,
        (false, false) => Reply::Ok,
    }
}

fn incr_by(sh: &Shared, key: &[u8], d: i64) -> Reply {
    let _l = lock(sh, key);
    let cur = match get(sh, key) {
        Ok(None) => 0,
        Ok(Some(v)) => match parse_i64(&v) {
            Some(i) => i,
            None => return Reply::err("value is not an integer or out of range"),
        },
        Err(r) => return r,
    };
    let Some(next) = cur.checked_add(d) else {
        return Reply::err("increment or decrement would overflow");
    };
    match sh.store.put(key, next.to_string().as_bytes()) {
        Ok(()) => Reply::Int(next),
        Err(e) => store_err(e),
    }
}

/// SCAN cursors: Redis clients want unsigned decimal cursors, and ours name
/// a key to resume at, so the server keeps the most recent
/// [`Cursors::MAX`] of them (an evicted cursor is an error; start again
/// from 0).
#[derive(Default)]
struct Cursors {
    next: u64,
    keys: HashMap<u64, Vec<u8>>,
    order: std::collections::VecDeque<u64>,
}

impl Cursors {
    const MAX: usize = 1 << 16;

    fn put(&mut self, key: Vec<u8>) -> u64 {
        self.next += 1;
        let id = self.next;
        self.keys.insert(id, key);
        self.order.push_back(id);
        while self.order.len() > Self::MAX {
            if let Some(old) = self.order.pop_front() {
                self.keys.remove(&old);
            }
        }
        id
    }
}

/// `SCAN cursor [MATCH pattern] [COUNT n]`, in key order over the ordered
/// index.
fn scan(sh: &Shared, args: &[Vec<u8>]) -> Reply {
    let start: Vec<u8> = match std::str::from_utf8(&args[1])
        .ok()
        .and_then(|c| c.parse::<u64>().ok())
    {
        Some(0) => Vec::new(),
        Some(id) => match sh.cursors.lock().expect("cursors").keys.get(&id) {
            Some(k) => k.clone(),
            None => return Reply::err("invalid cursor"),
        },
        None => return Reply::err("invalid cursor"),
    };
    let (mut pattern, mut count) = (None, 10usize);
    let mut i = 2;
    while i + 1 < args.len() {
        match upper(&args[i]).as_str() {
            "MATCH" => pattern = Some(args[i + 1].clone()),
            "COUNT" => match parse_i64(&args[i + 1]) {
                Some(c) if c > 0 => count = (c as usize).min(100_000),
                _ => return Reply::err("value is not an integer or out of range"),
            },
            "TYPE" => {}
            _ => return Reply::err("syntax error"),
        }
        i += 2;
    }
    if i != args.len() {
        return Reply::err("syntax error");
    }
    let rows = match sh.store.scan(&start, None, count + 1) {
        Ok(r) => r,
        Err(e) => return store_err(e),
    };
    let next = if rows.len() > count {
        let id = sh
            .cursors
            .lock()
            .expect("cursors")
            .put(rows[count].0.clone());
        id.to_string().into_bytes()
    } else {
        b"0".to_vec()
    };
    let keys = rows
        .into_iter()
        .take(count)
        .filter(|(k, _)| pattern.as_ref().is_none_or(|p| glob(p, k)))
        .map(|(k, _)| Reply::Bulk(k))
        .collect();
    Reply::Array(vec![Reply::Bulk(next), Reply::Array(keys)])
}

/// `RANGE start end [LIMIT n]`: pairs with `start <= key < end` in key
/// order, as a flat array key, value, ... (`end` "+" means no bound).
fn range(sh: &Shared, args: &[Vec<u8>]) -> Reply {
    let mut limit = 1000usize;
    match args.len() {
        3 => {}
        5 if upper(&args[3]) == "LIMIT" => match parse_i64(&args[4]) {
            Some(l) if l > 0 => limit = (l as usize).min(1_000_000),
            _ => return Reply::err("value is not an integer or out of range"),
        },
        _ => return Reply::err("syntax error"),
    }
    let end = (args[2] != b"+").then_some(args[2].as_slice());
    match sh.store.scan(&args[1], end, limit) {
        Ok(rows) => Reply::Array(
            rows.into_iter()
                .flat_map(|(k, v)| [Reply::Bulk(k), Reply::Bulk(v)])
                .collect(),
        ),
        Err(e) => store_err(e),
    }
}

fn config_get(pattern: &[u8]) -> Reply {
    let known: [(&str, &str); 4] = [
        ("save", ""),
        ("appendonly", "no"),
        ("databases", "1"),
        ("maxmemory", "0"),
    ];
    // A map: RESP3 sends `%`, RESP2 the same pairs flattened.
    Reply::Map(
        known
            .iter()
            .filter(|(k, _)| glob(pattern, k.as_bytes()))
            .map(|(k, v)| {
                (
                    Reply::Bulk(k.as_bytes().to_vec()),
                    Reply::Bulk(v.as_bytes().to_vec()),
                )
            })
            .collect(),
    )
}

fn info(sh: &Shared) -> String {
    let s = sh.store.stats();
    format!(
        "# Server\r\nredis_version:7.0.0\r\npmhash_version:{}\r\nuptime_in_seconds:{}\r\nbusy_poll_us:{}\r\n\r\n# Clients\r\nconnected_clients:{}\r\n\r\n# Stats\r\ntotal_commands_processed:{}\r\n\r\n# Keyspace\r\ndb0:keys={},expires=0,avg_ttl=0\r\n\r\n# Store\r\nstore_files:{}\r\nstore_log_bytes:{}\r\nstore_live_bytes:{}\r\nstore_space_amplification:{:.3}\r\nstore_pm_bytes:{}\r\nstore_gc_runs:{}\r\nstore_files_reclaimed:{}\r\nstore_raf_enabled:{}\r\nstore_raf_hits:{}\r\nstore_nodes:{}\r\nstore_clusters:{}\r\nstore_opened_from:{}\r\nstore_open_ms:{:.2}\r\n",
        env!("CARGO_PKG_VERSION"),
        sh.started.elapsed().as_secs(),
        sh.busy_poll.as_micros(),
        sh.clients.load(Ordering::Relaxed),
        sh.commands.load(Ordering::Relaxed),
        s.keys,
        s.files,
        s.log_bytes,
        s.live_bytes,
        s.space_amplification,
        s.pm_bytes,
        s.gc_runs,
        s.files_reclaimed,
        s.raf_enabled as u8,
        s.raf_hits,
        s.nodes,
        s.clusters,
        s.opened_from,
        s.open_ms,
    )
}

/// Redis-style glob: `*`, `?`, `[...]` (with `^` and ranges), `\` escapes.
pub fn glob(p: &[u8], s: &[u8]) -> bool {
    match (p.first(), s.first()) {
        (None, None) => true,
        (None, Some(_)) => false,
        (Some(b'*'), _) => glob(&p[1..], s) || (!s.is_empty() && glob(p, &s[1..])),
        (Some(_), None) => false,
        (Some(b'?'), Some(_)) => glob(&p[1..], &s[1..]),
        (Some(b'['), Some(&c)) => {
            let Some(end) = p.iter().skip(1).position(|&b| b == b']').map(|e| e + 1) else {
                return p[0] == c && glob(&p[1..], &s[1..]);
            };
            let (neg, set) = match p[1..end].strip_prefix(b"^") {
                Some(rest) => (true, rest),
                None => (false, &p[1..end]),
            };
            let mut hit = false;
            let mut i = 0;
            while i < set.len() {
                if i + 2 < set.len() && set[i + 1] == b'-' {
                    hit |= set[i] <= c && c <= set[i + 2];
                    i += 3;
                } else {
                    hit |= set[i] == c;
                    i += 1;
                }
            }
            hit != neg && glob(&p[end + 1..], &s[1..])
        }
        (Some(b'\\'), Some(&c)) if p.len() > 1 => p[1] == c && glob(&p[2..], &s[1..]),
        (Some(&a), Some(&c)) => a == c && glob(&p[1..], &s[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_parse_as_in_redis() {
        assert_eq!(parse_i64(b"42"), Some(42));
        assert_eq!(parse_i64(b"-7"), Some(-7));
        assert_eq!(parse_i64(b"0"), Some(0));
        for bad in [
            &b"010"[..],
            b"+5",
            b"-0",
            b" 1",
            b"1 ",
            b"",
            b"-",
            b"99999999999999999999",
        ] {
            assert_eq!(parse_i64(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn globs() {
        assert!(glob(b"*", b"anything"));
        assert!(glob(b"user:*", b"user:42"));
        assert!(!glob(b"user:*", b"usr:42"));
        assert!(glob(b"h?llo", b"hello"));
        assert!(glob(b"h[ae]llo", b"hallo"));
        assert!(!glob(b"h[^e]llo", b"hello"));
        assert!(glob(b"k[0-9]", b"k7"));
        assert!(glob(b"a\\*", b"a*"));
    }
}
