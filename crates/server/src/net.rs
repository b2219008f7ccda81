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
//! - **Memory is bounded per connection.** The input buffer holds at most
//!   one unfinished line or bulk string (the parser consumes whole
//!   arguments), and a connection whose unsent replies pass `OUT_HIGH`
//!   stops being served until the peer reads them.

use std::io::{self, Read, Write};
use std::net::TcpListener as StdListener;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};

use crate::resp::{put_bulk, Parser, Reply, Request};
use crate::{dispatch, set_batch, stopping, After, Client, Shared};

/// How often a loop wakes to look at the stop flag when nothing happens
/// (signals only set a flag).
const TICK: Duration = Duration::from_millis(50);
const WAKER: Token = Token(usize::MAX);
const LISTENER: Token = Token(usize::MAX - 1);
/// Initial size of a connection's input buffer, and the size it shrinks
/// back to after a large request.
const IN_CHUNK: usize = 16 << 10;
/// Unsent reply bytes above which a connection is not served until its
/// peer reads.
const OUT_HIGH: usize = 4 << 20;
/// The default of [`Config::max_clients`](crate::Config::max_clients),
/// Redis's `maxclients` default.
pub const MAX_CLIENTS: u64 = 10_000;
/// Most pipelined `SET`s (or `GET`s) run as one batch.
const MAX_BATCH: usize = 32;
/// The default of [`Config::busy_poll`](crate::Config::busy_poll).
/// Measured against 0 and 200 µs with unpipelined redis-benchmark runs
/// (docs/benchmarks.md, "pmhash serve"): most of 200's gain, a quarter of
/// its spinning.
pub const BUSY_POLL: Duration = Duration::from_micros(50);

/// A worker as seen from the acceptor: where to leave new connections and
/// how to wake it.
pub(crate) struct Mailbox {
    inbox: Mutex<Vec<TcpStream>>,
    waker: Waker,
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
        }),
        poll,
    ))
}

/// Accepts connections and deals them round-robin to the workers, until
/// the server stops.
pub(crate) fn accept_loop(sh: &Shared, listener: StdListener, workers: &[Arc<Mailbox>]) {
    let run = || -> io::Result<()> {
        let mut poll = Poll::new()?;
        let mut listener = TcpListener::from_std(listener);
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let mut events = Events::with_capacity(16);
        let mut next = 0usize;
        while !stopping(sh) {
            if let Err(e) = poll.poll(&mut events, Some(TICK)) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            loop {
                let (mut sock, _) = match listener.accept() {
                    Ok(s) => s,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    // The peer gave up before we accepted, or descriptors
                    // ran out for a moment: keep serving.
                    Err(_) => break,
                };
                if sh.clients.load(Ordering::Relaxed) >= sh.cfg.max_clients {
                    let _ = sock.write(b"-ERR max number of clients reached\r\n");
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

/// Serves the connections the acceptor leaves in `mailbox` until the
/// server stops; then closes them.
pub(crate) fn worker_loop(sh: &Shared, mailbox: &Mailbox, mut poll: Poll) {
    let mut conns: Vec<Option<Conn>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut events = Events::with_capacity(256);
    // Whether the last round of events had any: only then is it worth
    // polling without sleeping.
    let mut busy = false;
    while !stopping(sh) {
        let spin = if busy { sh.busy_poll } else { Duration::ZERO };
        if let Err(e) = wait(&mut poll, &mut events, spin) {
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
                    let mut c = Conn::new(sock, sh);
                    let registered = poll.registry().register(
                        &mut c.sock,
                        Token(slot),
                        Interest::READABLE | Interest::WRITABLE,
                    );
                    if registered.is_err() {
                        sh.clients.fetch_sub(1, Ordering::SeqCst);
                        free.push(slot);
                        continue;
                    }
                    // Edge-triggered: bytes that came before the
                    // registration are read now.
                    if c.drive(sh) {
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
            if !c.drive(sh) {
                let c = conns[slot].take().expect("live connection");
                close(sh, &poll, c);
                free.push(slot);
            }
        }
    }
    // Stopping: send what is already answered, then close.
    for mut c in conns.into_iter().flatten() {
        let _ = c.flush();
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
    sh.clients.fetch_sub(1, Ordering::SeqCst);
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
    /// A value read for a lone GET, kept for the next one.
    value: Vec<u8>,
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
    fn new(sock: TcpStream, sh: &Shared) -> Conn {
        Conn {
            sock,
            buf: vec![0; IN_CHUNK],
            start: 0,
            end: 0,
            parser: Parser::default(),
            out: Vec::with_capacity(IN_CHUNK),
            sent: 0,
            client: Client::new(sh),
            batch: Vec::new(),
            batch_kind: Kind::Set,
            value: Vec::new(),
            drained: false,
            peer_closing: false,
            closing: false,
        }
    }

    /// Serves the connection as far as it can without blocking. Returns
    /// false when it should be closed.
    fn drive(&mut self, sh: &Shared) -> bool {
        loop {
            if self.out.len() - self.sent >= OUT_HIGH {
                match self.flush() {
                    Err(_) => return false,
                    Ok(Flushed::Partly) => {
                        // A writable event resumes us; nothing waits
                        // unexecuted meanwhile.
                        self.run_batch(sh);
                        return true;
                    }
                    Ok(Flushed::All) => {}
                }
            }
            if self.closing {
                break;
            }
            match self.parser.next(&self.buf[self.start..self.end]) {
                Err(e) => {
                    self.run_batch(sh);
                    let _ = Reply::err(format!("Protocol error: {}", e.0))
                        .write(&mut self.out, self.client.resp3);
                    self.closing = true;
                }
                Ok((n, Some(args))) => {
                    self.start += n;
                    if args.is_empty() {
                        continue;
                    }
                    if let Some(kind) = batchable(&args).filter(|_| self.client.authed) {
                        if kind != self.batch_kind {
                            self.run_batch(sh);
                            self.batch_kind = kind;
                        }
                        self.batch.push(args);
                        if self.batch.len() >= MAX_BATCH {
                            self.run_batch(sh);
                        }
                        continue;
                    }
                    // Replies go out in request order: the batch first.
                    self.run_batch(sh);
                    sh.commands.fetch_add(1, Ordering::Relaxed);
                    let (reply, after) = dispatch(sh, &mut self.client, &args);
                    if let Some(r) = reply {
                        // Writing to a Vec cannot fail.
                        let _ = r.write(&mut self.out, self.client.resp3);
                    }
                    if matches!(after, After::Close) {
                        self.closing = true;
                    }
                    self.parser.recycle(args);
                }
                Ok((n, None)) => {
                    self.start += n;
                    // Nothing more is whole: commit what is waiting before
                    // the read (which may find nothing) and the replies.
                    self.run_batch(sh);
                    match self.fill() {
                        Ok(true) => {}
                        Ok(false) => break, // would block
                        Err(_) => return false,
                    }
                }
            }
        }
        match self.flush() {
            Err(_) => false,
            Ok(Flushed::All) => !self.closing,
            Ok(Flushed::Partly) => true,
        }
    }

    /// Executes the waiting batch and writes its replies in order. SETs:
    /// `+OK` for each one set, the error for each one the batch stopped
    /// before. GETs: each value or nil.
    fn run_batch(&mut self, sh: &Shared) {
        if self.batch.is_empty() {
            return;
        }
        // Counted per batch, not per command: a locked add waits for the
        // store buffer to drain, as a fence does.
        sh.commands
            .fetch_add(self.batch.len() as u64, Ordering::Relaxed);
        match self.batch_kind {
            Kind::Set => {
                let pairs: Vec<(&[u8], &[u8])> =
                    self.batch.iter().map(|a| (&a[1][..], &a[2][..])).collect();
                let (done, err) = set_batch(sh, &pairs);
                for i in 0..pairs.len() {
                    match &err {
                        Some(e) if i >= done => {
                            let _ = e.write(&mut self.out, self.client.resp3);
                        }
                        _ => self.out.extend_from_slice(b"+OK\r\n"),
                    }
                }
            }
            // A lone GET (no pipeline) takes the single-key path: nothing
            // to overlap, and no vectors to allocate.
            Kind::Get if self.batch.len() == 1 => {
                match sh.store.get_into(&self.batch[0][1], &mut self.value) {
                    Ok(true) => put_bulk(&mut self.out, &self.value),
                    Ok(false) => {
                        let _ = Reply::Nil.write(&mut self.out, self.client.resp3);
                    }
                    Err(e) => {
                        let _ = Reply::err(e.to_string()).write(&mut self.out, self.client.resp3);
                    }
                }
            }
            Kind::Get => {
                let keys: Vec<&[u8]> = self.batch.iter().map(|a| &a[1][..]).collect();
                let mut vals = Vec::with_capacity(keys.len());
                if let Err(e) = sh.store.get_many(&keys, &mut vals) {
                    // A corrupt entry: every GET of the batch gets the error.
                    for _ in &keys {
                        let _ = Reply::err(e.to_string()).write(&mut self.out, self.client.resp3);
                    }
                    vals.clear();
                }
                for v in vals {
                    match v {
                        Some(v) => put_bulk(&mut self.out, &v),
                        None => {
                            let _ = Reply::Nil.write(&mut self.out, self.client.resp3);
                        }
                    }
                }
            }
        }
        for r in self.batch.drain(..) {
            self.parser.recycle(r);
        }
    }

    /// Reads more bytes. Ok(false): nothing to read now. The peer's close
    /// marks the connection closing (replies already made still go out).
    fn fill(&mut self) -> io::Result<bool> {
        if self.drained {
            return Ok(false);
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
                    return Ok(false);
                }
                Ok(n) => {
                    self.drained = !self.peer_closing && self.end + n < self.buf.len();
                    self.end += n;
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Writes pending replies until done or the socket would block.
    fn flush(&mut self) -> io::Result<Flushed> {
        while self.sent < self.out.len() {
            match self.sock.write(&self.out[self.sent..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Flushed::Partly),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.out.clear();
        self.sent = 0;
        if self.out.capacity() > OUT_HIGH {
            self.out = Vec::with_capacity(IN_CHUNK);
        }
        Ok(Flushed::All)
    }
}
