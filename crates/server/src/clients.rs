//! What the server knows about each connection, for `CLIENT LIST`,
//! `CLIENT KILL` and `INFO`: one [`ClientInfo`] per connection in a
//! registry shared by the event loops.
//!
//! A connection belongs to one loop; only that loop writes its figures
//! (plain relaxed stores, no locked instruction on the request path), and
//! any loop may read them. `CLIENT KILL` marks the target and wakes its
//! loop, which closes it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// One connection's figures.
pub(crate) struct ClientInfo {
    pub(crate) id: u64,
    pub(crate) addr: String,
    pub(crate) laddr: String,
    pub(crate) fd: i64,
    /// The event loop that owns the connection.
    pub(crate) worker: usize,
    pub(crate) created: Instant,
    /// Milliseconds since `created` at the last request.
    pub(crate) last_ms: AtomicU64,
    /// The last command's entry in the command table (`usize::MAX`: none).
    pub(crate) last_cmd: AtomicUsize,
    pub(crate) qbuf: AtomicUsize,
    pub(crate) omem: AtomicUsize,
    pub(crate) tot_mem: AtomicUsize,
    /// Commands queued by `MULTI` (-1: not in a transaction).
    pub(crate) multi: AtomicI64,
    pub(crate) watching: AtomicUsize,
    pub(crate) resp: AtomicUsize,
    pub(crate) name: Mutex<Vec<u8>>,
    /// Set by `CLIENT KILL`: the owning loop closes the connection.
    pub(crate) kill: AtomicBool,
}

impl ClientInfo {
    pub(crate) fn new(
        id: u64,
        peer: Option<SocketAddr>,
        local: Option<SocketAddr>,
        fd: i64,
        worker: usize,
    ) -> ClientInfo {
        let show = |a: Option<SocketAddr>| a.map_or_else(|| "?:0".into(), |a| a.to_string());
        ClientInfo {
            id,
            addr: show(peer),
            laddr: show(local),
            fd,
            worker,
            created: Instant::now(),
            last_ms: AtomicU64::new(0),
            last_cmd: AtomicUsize::new(usize::MAX),
            qbuf: AtomicUsize::new(0),
            omem: AtomicUsize::new(0),
            tot_mem: AtomicUsize::new(0),
            multi: AtomicI64::new(-1),
            watching: AtomicUsize::new(0),
            resp: AtomicUsize::new(2),
            name: Mutex::new(Vec::new()),
            kill: AtomicBool::new(false),
        }
    }

    /// Notes a request: when it came and which command it was.
    pub(crate) fn note(&self, cmd: usize) {
        let ms = self.created.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
        self.last_cmd.store(cmd, Ordering::Relaxed);
    }

    /// One line of `CLIENT LIST`, in Redis's field order (the fields
    /// pmhash has).
    pub(crate) fn line(&self) -> String {
        let age = self.created.elapsed();
        let idle = age
            .as_millis()
            .saturating_sub(u128::from(self.last_ms.load(Ordering::Relaxed)))
            / 1000;
        let name = String::from_utf8_lossy(&self.name.lock().expect("client name")).into_owned();
        let multi = self.multi.load(Ordering::Relaxed);
        let flags = if multi >= 0 { "x" } else { "N" };
        let cmd = match self.last_cmd.load(Ordering::Relaxed) {
            usize::MAX => "NULL".to_string(),
            i => crate::table::TABLE
                .get(i)
                .map_or("NULL".into(), |s| s.name.to_ascii_lowercase()),
        };
        let mut l = String::new();
        let _ = write!(
            l,
            "id={} addr={} laddr={} fd={} name={} age={} idle={} flags={} db=0 sub=0 psub=0 ssub=0 multi={} watch={} qbuf={} qbuf-free=0 argv-mem=0 multi-mem=0 obl=0 oll=0 omem={} tot-mem={} events=r cmd={} user=default redir=-1 resp={}",
            self.id,
            self.addr,
            self.laddr,
            self.fd,
            name,
            age.as_secs(),
            idle,
            flags,
            multi,
            self.watching.load(Ordering::Relaxed),
            self.qbuf.load(Ordering::Relaxed),
            self.omem.load(Ordering::Relaxed),
            self.tot_mem.load(Ordering::Relaxed),
            cmd,
            self.resp.load(Ordering::Relaxed),
        );
        l
    }
}

/// Every live connection, by id.
#[derive(Default)]
pub(crate) struct Registry {
    map: Mutex<BTreeMap<u64, Arc<ClientInfo>>>,
}

impl Registry {
    pub(crate) fn add(&self, c: Arc<ClientInfo>) {
        self.map.lock().expect("clients").insert(c.id, c);
    }

    pub(crate) fn remove(&self, id: u64) {
        self.map.lock().expect("clients").remove(&id);
    }

    pub(crate) fn all(&self) -> Vec<Arc<ClientInfo>> {
        self.map
            .lock()
            .expect("clients")
            .values()
            .cloned()
            .collect()
    }

    /// The largest figures over all clients: (biggest input buffer,
    /// biggest output).
    pub(crate) fn biggest(&self) -> (usize, usize) {
        self.all().iter().fold((0, 0), |(q, o), c| {
            (
                q.max(c.qbuf.load(Ordering::Relaxed)),
                o.max(c.omem.load(Ordering::Relaxed)),
            )
        })
    }
}
