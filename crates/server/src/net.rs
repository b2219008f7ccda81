//! The event loops: one acceptor and a few workers, each worker an epoll
//! loop (through `mio`) over the connections it was handed.
//!
//! - A connection belongs to one worker for its whole life, so its requests
//!   are executed and answered in order without locks of its own.
//! - Sockets are non-blocking and registered edge-triggered for reading and
//!   writing. On any event the worker runs [`Conn::drive`], which reads until
//!   the socket would block, executes every whole request, and writes the
//!   replies. A pipeline of N requests that arrives together costs one read
//!   and one write.
//! - **Memory is bounded** per connection and across connections
//!   ([`crate::limits`]): a connection's footprint (buffers, the unfinished
//!   request, queued batch and transaction, unsent replies) beyond its
//!   allowance is charged to the shared budget. Input that cannot be
//!   charged closes the connection with an error; a connection whose unsent
//!   replies pass [`OUT_SOFT`] or cannot be charged is not served until its
//!   peer reads, and its loop goes on serving the others.
//! - **Descriptors.** Past `max_clients` a new connection gets an error and
//!   is closed; if descriptors run out anyway, a spare one kept for the
//!   purpose lets the acceptor take the connection, answer it and close it,
//!   so none is left hanging in the backlog.

use std::io::{self, Read, Write};
use std::net::TcpListener as StdListener;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};

use crate::clients::ClientInfo;
use crate::cmd::{dispatch, Client};
use crate::limits::{Out, Room, ALLOWANCE, OUT_SOFT};
use crate::resp::{Parser, Reply, Request};
use crate::stats::WorkerStats;
use crate::txn::request_bytes;
use crate::{set_batch, stopping, After, Shared};

/// How often a loop wakes to look at the stop flag when nothing happens
/// (signals only set a flag).
const TICK: Duration = Duration::from_millis(50);
const WAKER: Token = Token(usize::MAX);
const LISTENER: Token = Token(usize::MAX - 1);
/// Initial size of a connection's input buffer, and the size it shrinks
/// back to after a large request.
const IN_CHUNK: usize = 16 << 10;
/// Bytes one connection may read in one turn; past them the loop's other
/// connections are served before it reads more. A peer streaming a large
/// request held the loop for ~9 ms a turn without it.
const TURN_INPUT: usize = 1 << 20;
/// The default of [`Config::max_clients`](crate::Config::max_clients),
/// Redis's `maxclients` default.
pub const MAX_CLIENTS: u64 = 10_000;
/// Most pipelined `SET`s (or `GET`s) run as one batch.
const MAX_BATCH: usize = 32;
/// GETs of a batch read together (their cache misses overlap), between
/// two checks of the output limit.
const GET_CHUNK: usize = 8;
/// The default of [`Config::busy_poll`](crate::Config::busy_poll).
/// Measured against 0 and 200 µs with unpipelined redis-benchmark runs
/// (docs/bench/log.md, "`pmhash serve` against redis-server"): most of
/// 200's gain, a quarter of its spinning.
pub const BUSY_POLL: Duration = Duration::from_micros(50);

/// A worker as seen from the other threads: where to leave new
/// connections, how to wake it, and its figures.
pub(crate) struct Mailbox {
    inbox: Mutex<Vec<TcpStream>>,
    waker: Waker,
    /// Some of this loop's connections were marked by `CLIENT KILL`.
    pub(crate) kill_pending: AtomicBool,
    pub(crate) stats: WorkerStats,
}

impl Mailbox {
    pub(crate) fn wake(&self) {
        let _ = self.waker.wake();
    }
}

/// Starts a worker's poll; returns its mailbox and the poll to run.
pub(crate) fn new_worker() -> io::Result<(Arc<Mailbox>, Poll)> {
    let poll = Poll::new()?;
    let waker = Waker::new(poll.registry(), WAKER)?;
    Ok((
        Arc::new(Mailbox {
            inbox: Mutex::new(Vec::new()),
            waker,
            kill_pending: AtomicBool::new(false),
            stats: WorkerStats::default(),
        }),
        poll,
    ))
}

/// A descriptor held in reserve: closed to make room for one more accept
/// when the process is out of descriptors, then taken again.
fn spare_fd() -> Option<std::fs::File> {
    std::fs::File::open("/dev/null").ok()
}

/// Accepts connections and deals them round-robin to the workers, until
/// the server stops.
pub(crate) fn accept_loop(sh: &Shared, listener: StdListener) {
    let workers = &sh.workers;
    let run = || -> io::Result<()> {
        let mut poll = Poll::new()?;
        let mut listener = TcpListener::from_std(listener);
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let mut events = Events::with_capacity(16);
        let mut next = 0usize;
        let mut spare = spare_fd();
        while !stopping(sh) {
            if let Err(e) = poll.poll(&mut events, Some(TICK)) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            // Accepts until the backlog is empty, also after a timeout:
            // the listener is edge-triggered, and a connection left behind
            // by an error must not wait for another one to arrive.
            loop {
                let (mut sock, _) = match listener.accept() {
                    Ok(s) => s,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                        // Out of descriptors: use the spare to take the
                        // connection off the backlog, refuse it, and close
                        // it, rather than leave it hanging.
                        drop(spare.take());
                        if let Ok((mut s, _)) = listener.accept() {
                            let _ = s.write(
                                b"-ERR max number of clients reached (out of file descriptors)\r\n",
                            );
                            sh.rejected_connections.fetch_add(1, Ordering::Relaxed);
                        }
                        spare = spare_fd();
                        if spare.is_none() {
                            // Not even the spare came back: wait a tick.
                            break;
                        }
                        continue;
                    }
                    // The peer gave up before we accepted: keep serving.
                    Err(_) => break,
                };
                sh.connections_received.fetch_add(1, Ordering::Relaxed);
                if sh.clients.load(Ordering::Relaxed) >= sh.max_clients {
                    let _ = sock.write(b"-ERR max number of clients reached\r\n");
                    sh.rejected_connections.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let _ = sock.set_nodelay(true);
                sh.clients.fetch_add(1, Ordering::SeqCst);
                let w = &workers[next % workers.len()];
                next = next.wrapping_add(1);
                w.inbox.lock().expect("inbox").push(sock);
                w.wake();
            }
        }
        Ok(())
    };
    if let Err(e) = run() {
        eprintln!("pmhash serve: the acceptor failed: {e}");
    }
    sh.stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.wake();
    }
}

/// Serves the connections the acceptor leaves in worker `me`'s mailbox
/// until the server stops; then closes them.
pub(crate) fn worker_loop(sh: &Shared, me: usize, mut poll: Poll) {
    let mailbox = &*sh.workers[me];
    let mut conns: Vec<Option<Conn>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut events = Events::with_capacity(256);
    // Whether the last round of events had any: only then is it worth
    // polling without sleeping.
    let mut busy = false;
    // Connections with work left between turns (`Conn::more`).
    let mut ready: Vec<usize> = Vec::new();
    while !stopping(sh) {
        let spin = if busy { sh.busy_poll } else { Duration::ZERO };
        let waited = if ready.is_empty() {
            wait(&mut poll, &mut events, spin)
        } else {
            poll.poll(&mut events, Some(Duration::ZERO))
        };
        if let Err(e) = waited {
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            eprintln!("pmhash serve: a worker's poll failed: {e}");
            sh.stop.store(true, Ordering::SeqCst);
            break;
        }
        busy = !events.is_empty();
        for ev in events.iter() {
            if ev.token() == WAKER {
                let fresh = std::mem::take(&mut *mailbox.inbox.lock().expect("inbox"));
                for sock in fresh {
                    let slot = free.pop().unwrap_or_else(|| {
                        conns.push(None);
                        conns.len() - 1
                    });
                    let mut c = Conn::new(sock, sh, me);
                    let registered = poll.registry().register(
                        &mut c.sock,
                        Token(slot),
                        Interest::READABLE | Interest::WRITABLE,
                    );
                    if registered.is_err() {
                        close(sh, &poll, c);
                        free.push(slot);
                        continue;
                    }
                    // Edge-triggered: bytes that came before the
                    // registration are read now.
                    if c.drive(sh, mailbox) {
                        if c.more {
                            ready.push(slot);
                        }
                        conns[slot] = Some(c);
                    } else {
                        close(sh, &poll, c);
                        free.push(slot);
                    }
                }
                continue;
            }
            let slot = ev.token().0;
            let Some(c) = conns.get_mut(slot).and_then(Option::as_mut) else {
                continue;
            };
            if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                // New bytes (or the peer's close) raised this edge.
                c.drained = false;
                c.peer_closing |= ev.is_read_closed();
            }
            if !c.drive(sh, mailbox) {
                let c = conns[slot].take().expect("live connection");
                close(sh, &poll, c);
                free.push(slot);
            } else if c.more && !ready.contains(&slot) {
                ready.push(slot);
            }
        }
        for slot in std::mem::take(&mut ready) {
            let Some(c) = conns.get_mut(slot).and_then(Option::as_mut) else {
                continue;
            };
            if !c.more {
                continue;
            }
            c.more = false;
            if !c.drive(sh, mailbox) {
                let c = conns[slot].take().expect("live connection");
                close(sh, &poll, c);
                free.push(slot);
            } else if c.more {
                ready.push(slot);
            }
        }
        let persisted = pmem::persist::counters();
        mailbox.stats.fences.set(persisted.fences);
        mailbox.stats.flushes.set(persisted.flushes);
        if mailbox.kill_pending.load(Ordering::Relaxed) {
            mailbox.kill_pending.store(false, Ordering::SeqCst);
            for (slot, entry) in conns.iter_mut().enumerate() {
                if entry
                    .as_ref()
                    .is_some_and(|c| c.client.info.kill.load(Ordering::SeqCst))
                {
                    let c = entry.take().expect("live connection");
                    close(sh, &poll, c);
                    free.push(slot);
                }
            }
        }
    }
    // Stopping: send what is already answered, then close.
    for mut c in conns.into_iter().flatten() {
        let _ = c.flush(mailbox);
        close(sh, &poll, c);
    }
    for sock in std::mem::take(&mut *mailbox.inbox.lock().expect("inbox")) {
        drop(sock);
        sh.clients.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Waits for events: polls without sleeping for up to `spin`, then (if
/// none came) sleeps in the kernel for up to [`TICK`].
///
/// Why spin: a loop that sleeps in `epoll_wait` between two requests pays
/// for its own wake-up on the second (the scheduler, and on a virtual
/// machine the idle vCPU's exit and re-entry) before it can even read it.
/// Unpipelined clients pay that on every request; polling for a few tens
/// of microseconds after each round of work catches most of them awake.
fn wait(poll: &mut Poll, events: &mut Events, spin: Duration) -> io::Result<()> {
    if !spin.is_zero() {
        let start = std::time::Instant::now();
        loop {
            poll.poll(events, Some(Duration::ZERO))?;
            if !events.is_empty() || start.elapsed() >= spin {
                break;
            }
            std::hint::spin_loop();
        }
        if !events.is_empty() {
            return Ok(());
        }
    }
    poll.poll(events, Some(TICK))
}

fn close(sh: &Shared, poll: &Poll, mut c: Conn) {
    let _ = poll.registry().deregister(&mut c.sock);
    c.client.reset(sh);
    sh.registry.remove(c.client.id);
    sh.budget.give(c.charged);
    sh.clients.fetch_sub(1, Ordering::SeqCst);
}

/// What the connection does next, before reading anything new.
enum Deferred {
    /// A request read while a batch waited for the peer to read.
    Request(Request),
    /// A framing error, answered once the batch before it is.
    Error(String),
}

/// One client connection: its socket, buffers and protocol state.
struct Conn {
    sock: TcpStream,
    /// Received bytes; `buf[start..end]` is not consumed yet.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    parser: Parser,
    /// Replies; `out[sent..]` is not written yet.
    out: Vec<u8>,
    sent: usize,
    client: Client,
    /// Plain `SET key value` (or plain `GET key`) requests received back
    /// to back and not yet executed. They run together as soon as another
    /// command comes or the input runs dry: SETs as one store batch with
    /// one fence (group commit), GETs through `get_many`, whose cache
    /// misses overlap.
    batch: Vec<Request>,
    batch_kind: Kind,
    /// Bytes the batch holds.
    batch_bytes: usize,
    /// A batch of GETs stopped at the output limit; the rest runs once
    /// the peer reads.
    stalled: bool,
    deferred: Option<Deferred>,
    /// A value read for a lone GET, kept for the next one.
    value: Vec<u8>,
    /// Bytes charged to the shared budget.
    charged: usize,
    /// Has work left that no socket event will announce (a `FLUSHALL`
    /// between slices, or input left unread at the end of its turn): the
    /// loop drives it again on its next turn.
    more: bool,
    /// The last read was short: the socket had nothing more then, and new
    /// bytes raise a new readable edge, so the next read waits for that
    /// event. Saves a read that would only say "would block": with few
    /// clients, a quarter of the server's system calls.
    drained: bool,
    /// The peer has shut down its side (an event said so): read until the
    /// end is seen, however short the reads (no edge will follow).
    peer_closing: bool,
    /// Close once `out` is written (QUIT, a protocol error, the peer's
    /// half-close).
    closing: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Set,
    Get,
}

/// Whether `args` may join a batch, and which.
fn batchable(args: &Request) -> Option<Kind> {
    match args.len() {
        3 if args[0].eq_ignore_ascii_case(b"SET") => Some(Kind::Set),
        // An oversized key goes the single way, for its error.
        2 if args[0].eq_ignore_ascii_case(b"GET") && args[1].len() <= store::MAX_KEY => {
            Some(Kind::Get)
        }
        _ => None,
    }
}

enum Flushed {
    All,
    Partly,
}

impl Conn {
    fn new(sock: TcpStream, sh: &Shared, worker: usize) -> Conn {
        let id = sh.next_id.fetch_add(1, Ordering::Relaxed);
        let info = Arc::new(ClientInfo::new(
            id,
            sock.peer_addr().ok(),
            sock.local_addr().ok(),
            i64::from(sock.as_raw_fd()),
            worker,
        ));
        sh.registry.add(info.clone());
        Conn {
            sock,
            buf: vec![0; IN_CHUNK],
            start: 0,
            end: 0,
            parser: Parser::default(),
            out: Vec::with_capacity(IN_CHUNK),
            sent: 0,
            client: Client::new(sh, info),
            batch: Vec::new(),
            batch_kind: Kind::Set,
            batch_bytes: 0,
            stalled: false,
            deferred: None,
            value: Vec::new(),
            charged: 0,
            more: false,
            drained: false,
            peer_closing: false,
            closing: false,
        }
    }

    /// Bytes the connection holds now.
    fn footprint(&self) -> usize {
        self.buf.capacity()
            + self.out.capacity()
            + self.parser.held()
            + self.batch_bytes
            + self.client.txn.held()
            + self.value.capacity()
            + match &self.deferred {
                Some(Deferred::Request(r)) => request_bytes(r),
                _ => 0,
            }
    }

    /// Charges the shared budget for what the connection holds beyond its
    /// allowance (or gives back what it no longer holds). False if the
    /// budget cannot take it: the connection stays charged as it was.
    fn settle(&mut self, sh: &Shared) -> bool {
        let want = self.footprint().saturating_sub(ALLOWANCE);
        if want == self.charged {
            return true;
        }
        if want > self.charged {
            if !sh.budget.try_take(want - self.charged) {
                return false;
            }
        } else {
            sh.budget.give(self.charged - want);
        }
        self.charged = want;
        true
    }

    /// Charges the input just read or parsed; if it cannot be, answers
    /// with the reason and marks the connection to close.
    fn settle_input(&mut self, sh: &Shared, mailbox: &Mailbox) -> bool {
        if self.settle(sh) {
            return true;
        }
        mailbox.stats.closed_for_input.add(1);
        // What the peer sent so far is dropped, then the error goes out.
        self.parser = Parser::default();
        self.start = self.end;
        let _ = Reply::err(format!(
            "client memory limit reached: all clients together may hold {} bytes beyond {} each (maxmemory-clients); closing this connection",
            sh.budget.limit, ALLOWANCE
        ))
        .write(&mut self.out, self.client.resp3);
        self.closing = true;
        false
    }

    fn unsent(&self) -> usize {
        self.out.len() - self.sent
    }

    /// The writer a command's reply goes to.
    fn out<'a>(
        out: &'a mut Vec<u8>,
        sent: usize,
        resp3: bool,
        sh: &'a Shared,
        free_left: usize,
    ) -> Out<'a> {
        let unsent = out.len() - sent;
        Out {
            buf: out,
            resp3,
            room: Room::new(&sh.budget, sh.cfg.client_output_limit, unsent, free_left),
        }
    }

    /// What the connection may still hold without charging the budget.
    fn free_left(&self) -> usize {
        (ALLOWANCE + self.charged).saturating_sub(self.footprint())
    }

    /// Serves the connection as far as it can without blocking. Returns
    /// false when it should be closed.
    fn drive(&mut self, sh: &Shared, mailbox: &Mailbox) -> bool {
        let alive = self.serve(sh, mailbox);
        let info = &self.client.info;
        info.qbuf.store(
            self.end - self.start + self.parser.held(),
            Ordering::Relaxed,
        );
        info.omem.store(self.unsent(), Ordering::Relaxed);
        info.tot_mem.store(self.footprint(), Ordering::Relaxed);
        alive
    }

    fn serve(&mut self, sh: &Shared, mailbox: &Mailbox) -> bool {
        let mut turn_input = 0usize;
        loop {
            // Unsent replies past the soft limit, or more than the budget
            // can hold: not served until the peer reads.
            if self.unsent() >= OUT_SOFT || (self.unsent() > 0 && !self.settle(sh)) {
                match self.flush(mailbox) {
                    Err(_) => return false,
                    Ok(Flushed::Partly) => {
                        // A writable event resumes us. SETs waiting in a
                        // batch are committed now (their replies are small);
                        // GETs wait.
                        if self.batch_kind == Kind::Set {
                            self.run_batch(sh);
                        }
                        return true;
                    }
                    Ok(Flushed::All) => {}
                }
            }
            if self.stalled {
                self.run_batch(sh);
                continue;
            }
            if let Some(from) = self.client.flushing.as_mut() {
                // One slice, then the loop's other connections get a turn.
                match crate::cmd::flush_slice(&mut crate::txn::Db::direct(sh), from) {
                    Ok(false) => {
                        self.more = true;
                        break;
                    }
                    Ok(true) => self.out.extend_from_slice(b"+OK\r\n"),
                    Err(r) => {
                        let _ = r.write(&mut self.out, self.client.resp3);
                    }
                }
                self.client.flushing = None;
                continue;
            }
            let next = match self.deferred.take() {
                Some(d) => Some(d),
                None if self.closing => None,
                None => match self.parser.next(&self.buf[self.start..self.end]) {
                    Err(e) => Some(Deferred::Error(e.0)),
                    Ok((n, Some(args))) => {
                        self.start += n;
                        Some(Deferred::Request(args))
                    }
                    Ok((n, None)) => {
                        self.start += n;
                        // Nothing more is whole: commit what is waiting
                        // before the read (which may find nothing) and the
                        // replies.
                        if !self.run_batch(sh) {
                            continue;
                        }
                        if !self.settle_input(sh, mailbox) {
                            continue;
                        }
                        if turn_input >= TURN_INPUT {
                            // The rest next turn, after the others.
                            self.more = true;
                            break;
                        }
                        match self.fill(mailbox) {
                            Ok(Some(n)) => {
                                turn_input += n;
                                if !self.settle_input(sh, mailbox) {
                                    continue;
                                }
                                continue;
                            }
                            Ok(None) => break, // would block
                            Err(_) => return false,
                        }
                    }
                },
            };
            let Some(next) = next else { break };
            let args = match next {
                Deferred::Error(e) => {
                    if !self.run_batch(sh) {
                        self.deferred = Some(Deferred::Error(e));
                        continue;
                    }
                    let _ = Reply::err(format!("Protocol error: {e}"))
                        .write(&mut self.out, self.client.resp3);
                    self.closing = true;
                    continue;
                }
                Deferred::Request(args) => args,
            };
            if args.is_empty() {
                continue;
            }
            let kind =
                batchable(&args).filter(|_| self.client.authed && self.client.txn.queued.is_none());
            if let Some(kind) = kind {
                if kind != self.batch_kind && !self.batch.is_empty() && !self.run_batch(sh) {
                    self.deferred = Some(Deferred::Request(args));
                    continue;
                }
                self.batch_kind = kind;
                self.batch_bytes += request_bytes(&args);
                self.batch.push(args);
                if self.batch.len() >= MAX_BATCH {
                    self.run_batch(sh);
                }
                continue;
            }
            // Replies go out in request order: the batch first.
            if !self.run_batch(sh) {
                self.deferred = Some(Deferred::Request(args));
                continue;
            }
            sh.commands.fetch_add(1, Ordering::Relaxed);
            let free = self.free_left();
            let mut out = Self::out(&mut self.out, self.sent, self.client.resp3, sh, free);
            let after = dispatch(sh, &mut self.client, &args, &mut out);
            let taken = out.room.taken;
            self.charged += taken;
            if matches!(after, After::Close) {
                self.closing = true;
            }
            self.parser.recycle(args);
        }
        match self.flush(mailbox) {
            Err(_) => false,
            Ok(Flushed::All) => !self.closing,
            Ok(Flushed::Partly) => true,
        }
    }

    /// Executes the waiting batch and writes its replies in order. SETs:
    /// `+OK` for each one set, the error for each one the batch stopped
    /// before. GETs: each value or nil, stopping once the unsent replies
    /// pass [`OUT_SOFT`] (the rest stay queued: `stalled`). Returns
    /// whether the batch is done.
    fn run_batch(&mut self, sh: &Shared) -> bool {
        if self.batch.is_empty() {
            self.stalled = false;
            return true;
        }
        match self.batch_kind {
            Kind::Set => {
                // Counted per batch, not per command: a locked add waits
                // for the store buffer to drain, as a fence does.
                sh.commands
                    .fetch_add(self.batch.len() as u64, Ordering::Relaxed);
                let pairs: Vec<(&[u8], &[u8])> =
                    self.batch.iter().map(|a| (&a[1][..], &a[2][..])).collect();
                let (done, err) = set_batch(sh, &pairs, false);
                for i in 0..pairs.len() {
                    match &err {
                        Some(e) if i >= done => {
                            let _ = e.write(&mut self.out, self.client.resp3);
                        }
                        _ => self.out.extend_from_slice(b"+OK\r\n"),
                    }
                }
                self.finish_batch(self.batch.len());
                true
            }
            Kind::Get => {
                let done = self.run_gets(sh);
                sh.commands.fetch_add(done as u64, Ordering::Relaxed);
                self.finish_batch(done);
                self.stalled = !self.batch.is_empty();
                !self.stalled
            }
        }
    }

    /// Answers the batch's GETs from the front while the unsent replies
    /// stay under [`OUT_SOFT`] (at least one chunk). Returns how many.
    fn run_gets(&mut self, sh: &Shared) -> usize {
        // A lone GET (no pipeline) takes the single-key path: nothing
        // to overlap, and no vectors to allocate.
        if self.batch.len() == 1 {
            let key = &self.batch[0][1];
            let found = if sh.iso.running() {
                let _l = crate::lock_stripes(sh, std::iter::once(&key[..]));
                sh.store.get_into(key, &mut self.value)
            } else {
                sh.store.get_into(key, &mut self.value)
            };
            let free = self.free_left();
            let mut out = Self::out(&mut self.out, self.sent, self.client.resp3, sh, free);
            match found {
                Ok(true) => {
                    let mark = out.mark();
                    if let Err(over) = out.bulk(&self.value) {
                        out.overflow(&mark, over);
                    }
                }
                Ok(false) => out.nil(),
                // A corrupt entry: an error, never wrong bytes.
                Err(e) => out.err(e.to_string()),
            }
            self.charged += out.room.taken;
            if self.value.capacity() > IN_CHUNK {
                self.value = Vec::new();
            }
            return 1;
        }
        // Read a few at a time (their misses overlap within a chunk), and
        // no more than is answered: a pipeline of GETs of large values is
        // read only as fast as its peer takes the replies.
        let mut done = 0;
        while done < self.batch.len() && (done == 0 || self.unsent() < OUT_SOFT) {
            let end = (done + GET_CHUNK).min(self.batch.len());
            let keys: Vec<&[u8]> = self.batch[done..end].iter().map(|a| &a[1][..]).collect();
            let mut vals = Vec::with_capacity(keys.len());
            // Isolated from transactions: read again under the stripes if
            // one ran meanwhile.
            let mut read = match sh.iso.snapshot() {
                Some(token) => {
                    let r = sh.store.get_many(&keys, &mut vals);
                    sh.iso.unchanged(token).then_some(r)
                }
                None => None,
            };
            if read.is_none() {
                let _held = crate::lock_stripes(sh, keys.iter().copied());
                vals.clear();
                read = Some(sh.store.get_many(&keys, &mut vals));
            }
            let free = self.free_left();
            let mut out = Self::out(&mut self.out, self.sent, self.client.resp3, sh, free);
            if let Some(Err(e)) = read {
                // A corrupt entry: every GET of the chunk gets the error,
                // never wrong bytes.
                for _ in &keys {
                    out.err(e.to_string());
                }
                vals.clear();
            }
            for v in vals {
                match v {
                    Some(v) => {
                        let mark = out.mark();
                        if let Err(over) = out.bulk(&v) {
                            out.overflow(&mark, over);
                        }
                    }
                    None => out.nil(),
                }
            }
            self.charged += out.room.taken;
            done = end;
        }
        done
    }

    /// Drops the first `n` requests of the batch (answered).
    fn finish_batch(&mut self, n: usize) {
        for r in self.batch.drain(..n) {
            self.batch_bytes -= request_bytes(&r);
            self.parser.recycle(r);
        }
    }

    /// Reads more bytes and says how many. Ok(None): nothing to read now.
    /// The peer's close marks the connection closing (replies already made
    /// still go out).
    fn fill(&mut self, mailbox: &Mailbox) -> io::Result<Option<usize>> {
        if self.drained {
            return Ok(None);
        }
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            if self.buf.len() > 4 * IN_CHUNK {
                self.buf = vec![0; IN_CHUNK];
            }
        }
        if self.end == self.buf.len() {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            } else {
                // One unfinished line or bulk string fills the buffer; the
                // parser's limits bound how far this grows.
                let n = self.buf.len() * 2;
                self.buf.resize(n, 0);
            }
        }
        loop {
            match self.sock.read(&mut self.buf[self.end..]) {
                Ok(0) => {
                    self.closing = true;
                    return Ok(None);
                }
                Ok(n) => {
                    mailbox.stats.net_in.add(n as u64);
                    self.drained = !self.peer_closing && self.end + n < self.buf.len();
                    self.end += n;
                    return Ok(Some(n));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Writes pending replies until done or the socket would block.
    fn flush(&mut self, mailbox: &Mailbox) -> io::Result<Flushed> {
        while self.sent < self.out.len() {
            match self.sock.write(&self.out[self.sent..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    mailbox.stats.net_out.add(n as u64);
                    self.sent += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Flushed::Partly),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.out.clear();
        self.sent = 0;
        if self.out.capacity() > OUT_SOFT {
            self.out = Vec::with_capacity(IN_CHUNK);
        }
        Ok(Flushed::All)
    }
}
