//! `pmhash serve`: the store behind the Redis protocol (RESP2, and RESP3
//! after `HELLO 3`).
//!
//! - **Connections.** A few event-loop threads ([`net`]), each serving
//!   many connections; a connection's requests are answered in order, and
//!   a pipeline that arrives together is answered with one write.
//! - **Atomic commands.** Every write takes a per-key lock (stripes by key
//!   hash), so `SET NX/XX/GET`, `GETSET` and `INCR` are atomic with respect
//!   to every other write of the key. `MSET` and `MULTI`/`EXEC` are
//!   isolated from every other client ([`txn`]).
//! - **Durability.** The store's: under `strict` a write is durable when
//!   its reply is sent.
//! - **Bounds.** Framing limits in [`resp`], memory per connection and
//!   across connections in [`limits`], work per command in [`cmd`]: no
//!   request can stop the server or starve the other clients.
//! - **Shutdown.** `SHUTDOWN`, SIGTERM or SIGINT stop accepting, close every
//!   connection and close the store cleanly (the next open is instant).
//!
//! The modules form layers, each using only the ones after it in this
//! list (and the shared state defined here): [`net`] (event loops),
//! [`cmd`] (dispatch), [`info`] (`INFO`), [`txn`] (transactions),
//! [`clients`] (the connection registry), [`table`] (the command table),
//! [`stats`] (the loops' figures), [`limits`], [`resp`], [`glob`].

mod clients;
mod cmd;
mod glob;
mod info;
mod limits;
mod net;
mod resp;
mod stats;
mod table;
mod txn;

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

pub use cmd::{RANGE_MAX_LIMIT, SCAN_MATCH_BUDGET, SCAN_MAX_COUNT};
pub use glob::{glob, Pattern};
pub use limits::{ALLOWANCE, CLIENT_OUTPUT_LIMIT, MAX_CLIENT_MEMORY, OUT_SOFT};
pub use net::{BUSY_POLL, MAX_CLIENTS};
pub use resp::{Parser, ProtocolError, Request};
pub use txn::{MAX_QUEUED, MAX_WATCHED};

use limits::Budget;
use resp::Reply;
use store::Store;

/// Server settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// The address to listen on (`host:port`), for `Server::start`.
    pub addr: String,
    /// Clients must `AUTH` with this before any other command.
    pub requirepass: Option<String>,
    /// Event-loop threads (0: one per CPU less one, at least one).
    pub threads: usize,
    /// Most connections at once; one more gets `-ERR max number of
    /// clients reached` and is closed. Lowered at start to what the
    /// process's descriptor limit allows (and said so on stderr).
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
    /// Bytes all connections together may hold beyond their allowance
    /// ([`ALLOWANCE`] each): input, replies, queued transactions (as
    /// Redis's `maxmemory-clients`). See [`limits`].
    pub max_client_memory: usize,
    /// Most unsent reply bytes one connection may have: a reply that would
    /// pass it is replaced by an error while it is built.
    pub client_output_limit: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            addr: "127.0.0.1:6379".into(),
            requirepass: None,
            threads: 0,
            max_clients: MAX_CLIENTS,
            busy_poll: None,
            max_client_memory: MAX_CLIENT_MEMORY,
            client_output_limit: CLIENT_OUTPUT_LIMIT,
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

impl Config {
    /// Every setting checked, before anything is bound or opened: `Err`
    /// names the first one that is wrong.
    pub fn validate(&self) -> Result<(), String> {
        use std::net::ToSocketAddrs;
        match self.addr.to_socket_addrs().map(|mut a| a.next()) {
            Ok(Some(_)) => {}
            Ok(None) => return Err(format!("--addr {}: names no address", self.addr)),
            Err(e) => {
                return Err(format!(
                    "--addr {}: not an address to listen on (HOST:PORT): {e}",
                    self.addr
                ))
            }
        }
        check_busy_poll(self.busy_poll).map_err(|e| format!("--busy-poll-us: {e}"))?;
        if self.max_clients == 0 {
            return Err("--maxclients must be at least 1".into());
        }
        if self.max_client_memory < ALLOWANCE {
            return Err(format!(
                "--maxmemory-clients {} is under the least useful value, {ALLOWANCE} bytes",
                self.max_client_memory
            ));
        }
        if self.client_output_limit < OUT_SOFT {
            return Err(format!(
                "--client-output-limit {} is under the soft output limit of {OUT_SOFT} bytes",
                self.client_output_limit
            ));
        }
        if self.requirepass.as_deref().is_some_and(str::is_empty) {
            return Err("--requirepass must not be empty".into());
        }
        Ok(())
    }
}

/// Parses a byte size as Redis's config does: a number with an optional
/// `k`, `kb`, `m`, `mb`, `g` or `gb` (powers of 1024 for the `b` forms and
/// for the bare letters alike).
pub fn parse_bytes(s: &str) -> Result<usize, String> {
    let t = s.trim().to_ascii_lowercase();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: usize = num
        .parse()
        .map_err(|_| format!("{s:?} is not a byte size (e.g. 1073741824, 512mb, 1gb)"))?;
    let mul: usize = match unit {
        "" | "b" => 1,
        "k" | "kb" => 1 << 10,
        "m" | "mb" => 1 << 20,
        "g" | "gb" => 1 << 30,
        _ => {
            return Err(format!(
                "{s:?}: unknown unit {unit:?} (k, kb, m, mb, g, gb)"
            ))
        }
    };
    n.checked_mul(mul)
        .ok_or_else(|| format!("{s:?} is too large"))
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
    /// Connections now.
    clients: AtomicU64,
    /// `cfg.max_clients`, lowered to fit the descriptor limit.
    max_clients: u64,
    commands: AtomicU64,
    connections_received: AtomicU64,
    rejected_connections: AtomicU64,
    started: std::time::Instant,
    /// `cfg.busy_poll`, resolved.
    busy_poll: std::time::Duration,
    budget: Budget,
    registry: clients::Registry,
    watches: txn::Watches,
    iso: txn::Isolation,
    workers: Vec<Arc<net::Mailbox>>,
    port: u16,
    durability: String,
}

/// A running server.
pub struct Server {
    shared: Arc<Shared>,
    addr: SocketAddr,
    threads: Vec<JoinHandle<()>>,
}

/// Descriptors kept back from `max_clients`: the listener, the loops'
/// epoll and wake-up descriptors, the store's files, a spare for refusing
/// connections, and slack for the standard streams and libraries.
const RESERVED_FDS: u64 = 64;

/// The most clients the descriptor limit allows, raising the soft limit
/// to the hard one first (as Redis does). Returns (allowed, soft limit).
fn fd_room() -> (u64, u64) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return (u64::MAX, u64::MAX);
        }
        if r.rlim_cur < r.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: r.rlim_max,
                rlim_max: r.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                r.rlim_cur = r.rlim_max;
            }
        }
    }
    let soft = r.rlim_cur;
    (soft.saturating_sub(RESERVED_FDS), soft)
}

impl Server {
    /// Binds `cfg.addr` and starts serving `store`.
    pub fn start(store: Store, cfg: Config) -> std::io::Result<Server> {
        cfg.validate()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let listener = TcpListener::bind(&cfg.addr)?;
        Self::start_on(store, cfg, listener)
    }

    /// Starts serving `store` on a listener already bound (so a caller can
    /// bind before it opens the store, and a taken port leaves the store
    /// untouched).
    pub fn start_on(store: Store, cfg: Config, listener: TcpListener) -> std::io::Result<Server> {
        cfg.validate()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let n = match cfg.threads {
            // One CPU is left to the store's background thread (GC, the
            // ordered index) and to clients on the same machine: on 2
            // CPUs, two loops against redis-benchmark made 3+ busy threads
            // on 2 CPUs and unpipelined requests 25% slower than one loop.
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
        let (room, soft) = fd_room();
        let max_clients = cfg.max_clients.min(room.max(1));
        if max_clients < cfg.max_clients {
            eprintln!(
                "pmhash serve: maxclients lowered from {} to {max_clients}: the open-file limit is {soft} descriptors ({RESERVED_FDS} kept for the server); raise it with ulimit -n",
                cfg.max_clients
            );
        }
        let mut workers = Vec::new();
        let mut polls = Vec::new();
        for _ in 0..n {
            let (mailbox, poll) = net::new_worker()?;
            workers.push(mailbox);
            polls.push(poll);
        }
        let durability = store.durability().name().to_string();
        let shared = Arc::new(Shared {
            store,
            budget: Budget::new(cfg.max_client_memory),
            cfg,
            stop: AtomicBool::new(false),
            locks: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            cursors: Mutex::new(Cursors::default()),
            next_id: AtomicU64::new(1),
            clients: AtomicU64::new(0),
            max_clients,
            commands: AtomicU64::new(0),
            connections_received: AtomicU64::new(0),
            rejected_connections: AtomicU64::new(0),
            started: std::time::Instant::now(),
            busy_poll,
            registry: clients::Registry::default(),
            watches: txn::Watches::default(),
            iso: txn::Isolation::default(),
            workers,
            port: addr.port(),
            durability,
        });
        let mut srv = Server {
            shared: shared.clone(),
            addr,
            threads: Vec::new(),
        };
        for (i, poll) in polls.into_iter().enumerate() {
            let sh = shared.clone();
            match std::thread::Builder::new()
                .name(format!("pmhash-worker-{i}"))
                .spawn(move || net::worker_loop(&sh, i, poll))
            {
                Ok(h) => srv.threads.push(h),
                Err(e) => {
                    srv.halt();
                    return Err(e);
                }
            }
        }
        let sh = shared.clone();
        match std::thread::Builder::new()
            .name("pmhash-accept".into())
            .spawn(move || net::accept_loop(&sh, listener))
        {
            Ok(h) => srv.threads.insert(0, h),
            Err(e) => {
                srv.halt();
                return Err(e);
            }
        }
        Ok(srv)
    }

    /// The address the server listens on (the bound port when it was asked for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The connection limit in force (`Config::max_clients`, lowered to
    /// what the descriptor limit allows).
    pub fn max_clients(&self) -> u64 {
        self.shared.max_clients
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
        for w in &self.shared.workers {
            w.wake();
        }
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }
}

fn stopping(sh: &Shared) -> bool {
    sh.stop.load(Ordering::SeqCst) || SIGNALED.load(Ordering::SeqCst)
}

enum After {
    Continue,
    Close,
}

/// Key stripes: every write holds its key's.
const STRIPES: usize = 1024;

fn stripe(sh: &Shared, key: &[u8]) -> usize {
    (store::key_hash(key) >> 40) as usize % sh.locks.len()
}

/// The stripes of `keys`, taken in stripe order (so two lockers never
/// deadlock).
fn lock_stripes<'a, 'k>(
    sh: &'a Shared,
    keys: impl Iterator<Item = &'k [u8]>,
) -> Vec<MutexGuard<'a, ()>> {
    let mut stripes: Vec<usize> = keys.map(|k| stripe(sh, k)).collect();
    stripes.sort_unstable();
    stripes.dedup();
    stripes
        .iter()
        .map(|&i| sh.locks[i].lock().expect("key lock"))
        .collect()
}

fn lock_every_stripe(sh: &Shared) -> Vec<MutexGuard<'_, ()>> {
    sh.locks
        .iter()
        .map(|l| l.lock().expect("key lock"))
        .collect()
}

/// Plain `SET key value` of every pair, as one store batch (one fence for
/// all). Every key's lock is held through the batch. With `isolated`
/// (`MSET`), readers see all of the batch or none of it. Returns how many
/// pairs (a prefix) were set and, if the batch stopped, the error for the
/// rest.
fn set_batch(sh: &Shared, pairs: &[(&[u8], &[u8])], isolated: bool) -> (usize, Option<Reply>) {
    let _running = isolated.then(|| sh.iso.begin());
    let _held = lock_stripes(sh, pairs.iter().map(|(k, _)| *k));
    let (done, err) = match sh.store.put_batch(pairs) {
        Ok(()) => (pairs.len(), None),
        Err(e) => (e.done, Some(Reply::err(e.error.to_string()))),
    };
    for (k, _) in &pairs[..done] {
        sh.watches.touch(k);
    }
    (done, err)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_parse_as_in_redis() {
        use cmd::parse_i64;
        assert_eq!(parse_i64(b"42"), Some(42));
        assert_eq!(parse_i64(b"-7"), Some(-7));
        assert_eq!(parse_i64(b"0"), Some(0));
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            &b"010"[..],
            b"+5",
            b"-0",
            b" 1",
            b"1 ",
            b"",
            b"-",
            b"99999999999999999999",
            b"9223372036854775808",
        ] {
            assert_eq!(parse_i64(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn byte_sizes_parse_as_redis_config_does() {
        assert_eq!(parse_bytes("1024"), Ok(1024));
        assert_eq!(parse_bytes("512mb"), Ok(512 << 20));
        assert_eq!(parse_bytes("1G"), Ok(1 << 30));
        assert_eq!(parse_bytes("4k"), Ok(4096));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("5tb").is_err());
        assert!(parse_bytes("99999999999999999999gb").is_err());
    }

    #[test]
    fn a_config_is_checked_before_anything_is_made() {
        let ok = Config::default();
        assert!(ok.validate().is_ok());
        let bad = |f: fn(&mut Config)| {
            let mut c = Config::default();
            f(&mut c);
            c.validate().unwrap_err()
        };
        assert!(bad(|c| c.addr = "notanaddr".into()).contains("notanaddr"));
        assert!(bad(|c| c.max_clients = 0).contains("maxclients"));
        assert!(bad(|c| c.max_client_memory = 1).contains("maxmemory-clients"));
        assert!(bad(|c| c.client_output_limit = 1).contains("client-output-limit"));
    }

    #[test]
    fn every_command_in_the_table_is_found_in_any_case() {
        for (i, s) in table::TABLE.iter().enumerate() {
            assert_eq!(table::lookup(s.name.as_bytes()), Some(i));
            assert_eq!(
                table::lookup(s.name.to_ascii_lowercase().as_bytes()),
                Some(i)
            );
        }
        assert_eq!(table::lookup(b"NOSUCH"), None);
    }
}
