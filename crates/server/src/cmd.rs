//! The commands: [`dispatch`], which checks a request against the command
//! table ([`crate::table`]) and runs it, or queues it inside `MULTI`.
//!
//! Every command is bounded in the work one call does: keys per call by
//! the request limits, rows per `SCAN`/`RANGE` call by `COUNT`/`LIMIT`
//! caps and a pattern-matching budget, reply bytes by the output limits
//! ([`crate::limits`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::clients::ClientInfo;
use crate::glob::Pattern;
use crate::limits::{Out, Over};
use crate::resp::{Reply, Request};
use crate::table::{lookup, Spec, TABLE};
use crate::txn::{self, Db, Overlay, TxnState, MAX_QUEUED, MAX_WATCHED};
use crate::{After, Shared};

fn arity_ok(arity: i64, n: usize) -> bool {
    if arity >= 0 {
        n as i64 == arity
    } else {
        n as i64 >= -arity
    }
}

/// The keys a request names, by its table entry.
pub(crate) fn keys_of<'r>(spec: &Spec, args: &'r Request) -> impl Iterator<Item = &'r [u8]> {
    let (first, last, step) = spec.keys;
    let n = args.len() as i64;
    let last = if last < 0 { n + last } else { last };
    let (first, last, step) = if first <= 0 || step <= 0 || last >= n {
        (1, 0, 1)
    } else {
        (first, last, step)
    };
    (first..=last)
        .step_by(step as usize)
        .map(move |i| &args[i as usize][..])
}

/// Per-connection state.
pub(crate) struct Client {
    pub(crate) resp3: bool,
    pub(crate) authed: bool,
    pub(crate) id: u64,
    pub(crate) info: Arc<ClientInfo>,
    pub(crate) txn: TxnState,
    /// A `FLUSHALL` runs, a slice per turn of the loop, and goes on from
    /// this key; its reply and the requests after it wait.
    pub(crate) flushing: Option<Vec<u8>>,
}

impl Client {
    pub(crate) fn new(sh: &Shared, info: Arc<ClientInfo>) -> Client {
        Client {
            resp3: false,
            authed: sh.cfg.requirepass.is_none(),
            id: info.id,
            info,
            txn: TxnState::default(),
            flushing: None,
        }
    }

    /// Leaves a transaction and every watch (the connection closes).
    pub(crate) fn reset(&mut self, sh: &Shared) {
        self.txn.queued = None;
        self.txn.queued_bytes = 0;
        self.txn.aborted = false;
        self.txn.unwatch_all(sh, self.id);
    }
}

fn wrong_args(name: &str) -> Reply {
    Reply::err(format!(
        "wrong number of arguments for '{}' command",
        name.to_ascii_lowercase()
    ))
}

fn store_err(e: engine::Error) -> Reply {
    Reply::err(e.to_string())
}

fn not_integer() -> Reply {
    Reply::err("value is not an integer or out of range")
}

/// Redis's integer syntax: an optional `-`, no `+`, no leading zeros, no
/// `-0`, no spaces.
pub(crate) fn parse_i64(b: &[u8]) -> Option<i64> {
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

/// Checks a request against the table, then runs it, or queues it inside
/// `MULTI`. The reply goes to `out`.
pub(crate) fn dispatch(sh: &Shared, c: &mut Client, args: &Request, out: &mut Out) -> After {
    let Some(idx) = lookup(&args[0]) else {
        if c.txn.queued.is_some() {
            c.txn.aborted = true;
        }
        out.err(format!(
            "unknown command '{}', with args beginning with: {}",
            String::from_utf8_lossy(&args[0])
                .chars()
                .take(128)
                .collect::<String>(),
            args[1..]
                .iter()
                .take(8)
                .map(|a| format!(
                    "'{}' ",
                    String::from_utf8_lossy(a)
                        .chars()
                        .take(128)
                        .collect::<String>()
                ))
                .collect::<String>()
        ));
        return After::Continue;
    };
    let spec = &TABLE[idx];
    c.info.note(idx);
    if !c.authed && !spec.flags.contains(&"no-auth") {
        out.err("NOAUTH Authentication required.");
        return After::Continue;
    }
    if !arity_ok(spec.arity, args.len()) {
        if c.txn.queued.is_some() {
            c.txn.aborted = true;
        }
        out.reply(&wrong_args(spec.name));
        return After::Continue;
    }
    if c.txn.queued.is_some()
        && !matches!(spec.name, "EXEC" | "DISCARD" | "MULTI" | "WATCH" | "QUIT")
    {
        return queue(c, args, out);
    }
    run(sh, c, idx, args, out, &mut Db::direct(sh))
}

/// Queues a request inside `MULTI`.
fn queue(c: &mut Client, args: &Request, out: &mut Out) -> After {
    let q = c.txn.queued.get_or_insert_with(Vec::new);
    if q.len() >= MAX_QUEUED {
        c.txn.aborted = true;
        out.err(format!(
            "too many commands in one transaction (the limit is {MAX_QUEUED})"
        ));
        return After::Continue;
    }
    c.txn.queued_bytes += txn::request_bytes(args);
    q.push(args.clone());
    c.info.multi.store(q.len() as i64, Ordering::Relaxed);
    out.reply(&Reply::Simple("QUEUED".into()));
    After::Continue
}

/// Runs one checked command against `db`.
fn run(
    sh: &Shared,
    c: &mut Client,
    idx: usize,
    args: &Request,
    out: &mut Out,
    db: &mut Db,
) -> After {
    let spec = &TABLE[idx];
    let n = args.len();
    let reply = match spec.name {
        "PING" => match n {
            1 => Reply::Simple("PONG".into()),
            2 => Reply::Bulk(args[1].clone()),
            _ => wrong_args(spec.name),
        },
        "ECHO" => Reply::Bulk(args[1].clone()),
        "QUIT" => {
            out.reply(&Reply::Ok);
            return After::Close;
        }
        "AUTH" => match n {
            2 | 3 => auth(sh, c, &args[n - 1]),
            _ => Reply::err("syntax error"),
        },
        "HELLO" => {
            let r = hello(sh, c, args);
            // The reply is in the protocol it switched to.
            out.resp3 = c.resp3;
            r
        }
        "SELECT" => {
            if args[1] == b"0" {
                Reply::Ok
            } else {
                Reply::err("DB index is out of range")
            }
        }
        "GET" => match db.get(&args[1]) {
            Ok(Some(v)) => {
                let mark = out.mark();
                if let Err(over) = out.bulk(&v) {
                    out.overflow(&mark, over);
                }
                return After::Continue;
            }
            Ok(None) => Reply::Nil,
            Err(e) => store_err(e),
        },
        "SET" => set(db, args),
        "GETSET" => {
            let _l = db.lock(&args[1]);
            match db.get_locked(&args[1]) {
                Err(e) => store_err(e),
                Ok(old) => match db.put(&args[1], &args[2]) {
                    Err(e) => store_err(e),
                    Ok(()) => old.map_or(Reply::Nil, Reply::Bulk),
                },
            }
        }
        "DEL" | "UNLINK" => {
            let mut count = 0;
            for k in &args[1..] {
                let _l = db.lock(k);
                match db.delete(k) {
                    Ok(true) => count += 1,
                    Ok(false) => {}
                    Err(e) => {
                        out.reply(&store_err(e));
                        return After::Continue;
                    }
                }
            }
            Reply::Int(count)
        }
        "EXISTS" => {
            let mut count = 0;
            if read_isolated(
                db,
                &args[1..],
                out,
                |_| {},
                |_, v| {
                    count += i64::from(v.is_some());
                    Ok(())
                },
            ) {
                out.reply(&Reply::Int(count));
            }
            return After::Continue;
        }
        "MGET" => {
            mget(db, &args[1..], out);
            return After::Continue;
        }
        "MSET" => {
            if n.is_multiple_of(2) {
                wrong_args(spec.name)
            } else {
                mset(db, args)
            }
        }
        "INCR" => incr_by(db, &args[1], 1),
        "DECR" => incr_by(db, &args[1], -1),
        "INCRBY" => match parse_i64(&args[2]) {
            Some(d) => incr_by(db, &args[1], d),
            None => not_integer(),
        },
        "DECRBY" => match parse_i64(&args[2]) {
            // -i64::MIN does not exist: Redis refuses it by name.
            Some(d) => match d.checked_neg() {
                Some(neg) => incr_by(db, &args[1], neg),
                None => Reply::err("decrement would overflow"),
            },
            None => not_integer(),
        },
        "SCAN" => match db.barrier() {
            Err(e) => Reply::err(e),
            Ok(()) => {
                scan(sh, args, out);
                return After::Continue;
            }
        },
        "RANGE" => match db.barrier() {
            Err(e) => Reply::err(e),
            Ok(()) => {
                range(sh, args, out);
                return After::Continue;
            }
        },
        "DBSIZE" => match db.barrier() {
            Err(e) => Reply::err(e),
            Ok(()) => Reply::Int(sh.store.len() as i64),
        },
        "FLUSHALL" | "FLUSHDB" => match db.barrier() {
            Err(e) => Reply::err(e),
            // Inside EXEC (every stripe held): all at once.
            Ok(()) if db.is_txn() => {
                let mut from = Vec::new();
                loop {
                    match flush_slice(db, &mut from) {
                        Ok(false) => {}
                        Ok(true) => break Reply::Ok,
                        Err(r) => break r,
                    }
                }
            }
            // Otherwise a slice at a time between the loop's other work:
            // the connection answers once the last slice is done.
            Ok(()) => {
                c.flushing = Some(Vec::new());
                return After::Continue;
            }
        },
        "SAVE" | "BGSAVE" => match db
            .barrier()
            .map_err(Reply::err)
            .and_then(|()| sh.store.sync().map_err(store_err))
        {
            Ok(()) => Reply::Ok,
            Err(r) => r,
        },
        "INFO" => Reply::Bulk(crate::info::info(sh, &args[1..]).into_bytes()),
        "COMMAND" => command(args),
        "CONFIG" => match (upper(&args[1]).as_str(), n) {
            ("GET", 3) => config_get(sh, &args[2]),
            ("GET", _) => wrong_args("config|get"),
            _ => Reply::err("unsupported CONFIG subcommand (CONFIG GET is supported)"),
        },
        "CLIENT" => return client(sh, c, args, out),
        "SHUTDOWN" => {
            sh.stop.store(true, Ordering::SeqCst);
            return After::Close;
        }
        "MULTI" => {
            if c.txn.queued.is_some() {
                Reply::err("MULTI calls can not be nested")
            } else {
                c.txn.queued = Some(Vec::new());
                c.txn.queued_bytes = 0;
                c.txn.aborted = false;
                c.info.multi.store(0, Ordering::Relaxed);
                Reply::Ok
            }
        }
        "DISCARD" => {
            if c.txn.queued.is_none() {
                Reply::err("DISCARD without MULTI")
            } else {
                c.reset(sh);
                c.info.multi.store(-1, Ordering::Relaxed);
                c.info.watching.store(0, Ordering::Relaxed);
                Reply::Ok
            }
        }
        "EXEC" => {
            exec(sh, c, out);
            return After::Continue;
        }
        "WATCH" => {
            if c.txn.queued.is_some() {
                Reply::err("WATCH inside MULTI is not allowed")
            } else if c.txn.watched.len() + n - 1 > MAX_WATCHED {
                Reply::err(format!(
                    "too many watched keys (the limit is {MAX_WATCHED} per client)"
                ))
            } else {
                for k in &args[1..] {
                    if !c.txn.watched.contains(k) {
                        sh.watches.watch(c.id, &c.txn.dirty, k);
                        c.txn.watched_bytes += k.len() + 64;
                        c.txn.watched.push(k.clone());
                    }
                }
                c.info
                    .watching
                    .store(c.txn.watched.len(), Ordering::Relaxed);
                Reply::Ok
            }
        }
        "UNWATCH" => {
            c.txn.unwatch_all(sh, c.id);
            c.info.watching.store(0, Ordering::Relaxed);
            Reply::Ok
        }
        other => Reply::err(format!("command '{other}' has no handler")),
    };
    out.reply(&reply);
    After::Continue
}

pub(crate) fn upper(a: &[u8]) -> String {
    String::from_utf8_lossy(a).to_ascii_uppercase()
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
    let mut name = None;
    while i < args.len() {
        match upper(&args[i]).as_str() {
            "AUTH" if i + 2 < args.len() => {
                if let r @ Reply::Error(_) = auth(sh, c, &args[i + 2]) {
                    return r;
                }
                i += 3;
            }
            "SETNAME" if i + 1 < args.len() => {
                name = Some(args[i + 1].clone());
                i += 2;
            }
            _ => return Reply::err("syntax error in HELLO"),
        }
    }
    if !c.authed {
        return Reply::err("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time");
    }
    if let Some(n) = name {
        *c.info.name.lock().expect("client name") = n;
    }
    c.resp3 = proto == 3;
    c.info.resp.store(proto as usize, Ordering::Relaxed);
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

fn set(db: &mut Db, args: &[Vec<u8>]) -> Reply {
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
    let _l = db.lock(key);
    let old = if nx || xx || want_old {
        match db.get_locked(key) {
            Ok(o) => o,
            Err(e) => return store_err(e),
        }
    } else {
        None
    };
    let present = old.is_some();
    let skip = (nx && present) || (xx && !present);
    if !skip {
        if let Err(e) = db.put(key, val) {
            return store_err(e);
        }
    }
    match (want_old, skip) {
        (true, _) => old.map_or(Reply::Nil, Reply::Bulk),
        (false, true) => Reply::Nil,
        (false, false) => Reply::Ok,
    }
}

fn incr_by(db: &mut Db, key: &[u8], d: i64) -> Reply {
    let _l = db.lock(key);
    let cur = match db.get_locked(key) {
        Ok(None) => 0,
        Ok(Some(v)) => match parse_i64(&v) {
            Some(i) => i,
            None => return not_integer(),
        },
        Err(e) => return store_err(e),
    };
    let Some(next) = cur.checked_add(d) else {
        return Reply::err("increment or decrement would overflow");
    };
    match db.put(key, next.to_string().as_bytes()) {
        Ok(()) => Reply::Int(next),
        Err(e) => store_err(e),
    }
}

/// Writes a reply for `keys` with `each` (called once per key, with the
/// key's value or `None`), isolated from transactions: the keys are read
/// without locks, and once more under their stripes if a transaction
/// started meanwhile (the first reply is dropped). A value is read only
/// when the reply before it fits, so memory stays within the reply's room.
/// False if it wrote an error instead.
fn read_isolated(
    db: &mut Db,
    keys: &[Vec<u8>],
    out: &mut Out,
    header: impl Fn(&mut Out),
    mut each: impl FnMut(&mut Out, Option<&[u8]>) -> Result<(), Over>,
) -> bool {
    let sh = db.sh;
    let mark = out.mark();
    let mut token = if db.is_txn() { None } else { sh.iso.snapshot() };
    let mut held = None;
    if !db.is_txn() && token.is_none() {
        held = Some(crate::lock_stripes(sh, keys.iter().map(|k| &k[..])));
    }
    loop {
        header(out);
        let mut value = Vec::new();
        for k in keys {
            let got = if db.is_txn() {
                db.get_locked(k)
                    .map(|v| v.inspect(|v| value.clone_from(v)).is_some())
            } else if k.len() > store::MAX_KEY {
                // The error a GET of it gets (`get_into` would say absent).
                sh.store.get(k).map(|_| false)
            } else {
                // Into one buffer for all the keys: a fresh vector per
                // value would map and unmap (and fault in) each large one.
                sh.store.get_into(k, &mut value)
            };
            let r = match got {
                Ok(found) => each(out, found.then_some(&value[..])),
                Err(e) => {
                    out.rewind(&mark);
                    out.reply(&store_err(e));
                    return false;
                }
            };
            if let Err(over) = r {
                out.overflow(&mark, over);
                return false;
            }
        }
        match token {
            Some(t) if !sh.iso.unchanged(t) => {
                out.rewind(&mark);
                token = None;
                held = Some(crate::lock_stripes(sh, keys.iter().map(|k| &k[..])));
            }
            _ => break,
        }
    }
    drop(held);
    true
}

fn mget(db: &mut Db, keys: &[Vec<u8>], out: &mut Out) {
    // A reply that grows past `SIZE_AFTER` is sized from the rest of its
    // entries' headers before more is copied, so that one which cannot fit
    // is refused early: building tens of MiB only to drop them held the
    // event loop (and every client on it) for ~50 ms. Smaller replies pay
    // nothing. Inside a transaction the values may be its own, so only the
    // build decides there.
    const SIZE_AFTER: usize = 1 << 20;
    let sh = db.sh;
    let sized = !db.is_txn();
    let next = std::cell::Cell::new(0usize);
    let start = std::cell::Cell::new(0usize);
    read_isolated(
        db,
        keys,
        out,
        |out| {
            next.set(0);
            start.set(out.buf.len());
            out.array(keys.len())
        },
        |out, v| {
            let i = next.get();
            next.set(i + 1);
            let before = out.buf.len() - start.get();
            match v {
                Some(v) => out.bulk(v)?,
                None => out.nil(),
            }
            let built = out.buf.len() - start.get();
            if sized && before < SIZE_AFTER && built >= SIZE_AFTER {
                let mut rest = 0usize;
                for k in &keys[i + 1..] {
                    // An entry that cannot be read is the build's to report.
                    let n = sh.store.value_len(k).ok().flatten().unwrap_or(0);
                    rest = rest.saturating_add(n + crate::limits::PER_ITEM);
                }
                out.room.would_fit(rest)?;
            }
            Ok(())
        },
    );
}

fn mset(db: &mut Db, args: &[Vec<u8>]) -> Reply {
    let pairs: Vec<(&[u8], &[u8])> = args[1..]
        .chunks(2)
        .map(|kv| (&kv[0][..], &kv[1][..]))
        .collect();
    if db.is_txn() {
        for (k, v) in pairs {
            if let Err(e) = db.put(k, v) {
                return store_err(e);
            }
        }
        return Reply::Ok;
    }
    match crate::set_batch(db.sh, &pairs, true) {
        (_, Some(err)) => err,
        (_, None) => Reply::Ok,
    }
}

/// Most keys one `SCAN` call examines, and the default.
pub const SCAN_MAX_COUNT: usize = 100_000;
/// Pattern-matching steps one `SCAN` call may spend (about a few
/// milliseconds); past it the call returns what it has and a cursor.
pub const SCAN_MATCH_BUDGET: usize = 1 << 24;
/// Keys read from the index at a time.
const PAGE: usize = 1024;

/// `SCAN cursor [MATCH pattern] [COUNT n] [TYPE t]`, in key order over the
/// ordered index. A call examines at most `COUNT` keys and spends at most
/// [`SCAN_MATCH_BUDGET`] matching steps; either way it returns the cursor
/// of the next key.
fn scan(sh: &Shared, args: &[Vec<u8>], out: &mut Out) {
    let start: Vec<u8> = match std::str::from_utf8(&args[1])
        .ok()
        .and_then(|c| c.parse::<u64>().ok())
    {
        Some(0) => Vec::new(),
        Some(id) => match sh.cursors.lock().expect("cursors").keys.get(&id) {
            Some(k) => k.clone(),
            None => return out.err("invalid cursor"),
        },
        None => return out.err("invalid cursor"),
    };
    let (mut pattern, mut count) = (None, 10usize);
    let mut i = 2;
    while i + 1 < args.len() {
        match upper(&args[i]).as_str() {
            "MATCH" => pattern = Some(Pattern::new(&args[i + 1])),
            "COUNT" => match parse_i64(&args[i + 1]) {
                Some(c) if c > 0 => count = (c as usize).min(SCAN_MAX_COUNT),
                _ => return out.reply(&not_integer()),
            },
            "TYPE" => {}
            _ => return out.err("syntax error"),
        }
        i += 2;
    }
    if i != args.len() {
        return out.err("syntax error");
    }
    let mut keys = Vec::new();
    let mut examined = 0usize;
    let mut spent = 0usize;
    // The next call's key (None: the walk is over).
    let mut next: Option<Vec<u8>> = None;
    // Pages resume at the last key examined, which they skip.
    let mut at = start;
    let mut resumed = false;
    'pages: loop {
        let want = (count - examined).min(PAGE) + 1 + usize::from(resumed);
        let page = match sh.store.scan_keys(&at, None, want) {
            Ok(p) => p,
            Err(e) => return out.reply(&store_err(e)),
        };
        let got = page.len();
        let mut last = None;
        for k in page {
            if resumed && k == at {
                continue;
            }
            let cost = pattern.as_ref().map_or(0, |p| p.cost(k.len()));
            if examined == count || (examined > 0 && spent + cost > SCAN_MATCH_BUDGET) {
                next = Some(k);
                break 'pages;
            }
            examined += 1;
            spent += cost;
            let keep = pattern.as_ref().is_none_or(|p| p.matches(&k));
            if keep {
                keys.push(k.clone());
            }
            last = Some(k);
        }
        match last {
            Some(k) if got == want => {
                at = k;
                resumed = true;
            }
            _ => break,
        }
    }
    let cursor = match next {
        Some(k) => sh.cursors.lock().expect("cursors").put(k).to_string(),
        None => "0".to_string(),
    };
    let mark = out.mark();
    out.array(2);
    out.reply(&Reply::Bulk(cursor.into_bytes()));
    out.array(keys.len());
    for k in &keys {
        if let Err(over) = out.bulk(k) {
            return out.overflow(&mark, over);
        }
    }
}

/// Most pairs one `RANGE` call returns.
pub const RANGE_MAX_LIMIT: usize = 100_000;
/// Pairs read from the store at a time (values included: bounded memory).
const RANGE_PAGE: usize = 16;

/// `RANGE start end [LIMIT n]`: pairs with `start <= key < end` in key
/// order, as a flat array key, value, ... (`end` "+" means no bound). Read
/// a page at a time, and stopped with an error if the reply would pass the
/// output limits.
fn range(sh: &Shared, args: &[Vec<u8>], out: &mut Out) {
    let mut limit = 1000usize;
    match args.len() {
        3 => {}
        5 if upper(&args[3]) == "LIMIT" => match parse_i64(&args[4]) {
            Some(l) if l > 0 => limit = (l as usize).min(RANGE_MAX_LIMIT),
            _ => return out.reply(&not_integer()),
        },
        _ => return out.err("syntax error"),
    }
    let end = (args[2] != b"+").then_some(args[2].as_slice());
    // The count is known only at the end: the items are built, then the
    // header is put in front of them.
    let body_mark = out.mark();
    let mut rows = 0usize;
    let mut at = args[1].clone();
    let mut skip_first = false;
    loop {
        let want = (limit - rows).min(RANGE_PAGE) + usize::from(skip_first);
        let page = match sh.store.scan(&at, end, want) {
            Ok(p) => p,
            Err(e) => {
                out.rewind(&body_mark);
                return out.reply(&store_err(e));
            }
        };
        let got = page.len();
        let mut last = None;
        for (k, v) in page {
            if skip_first && k == at {
                continue;
            }
            if let Err(over) = out.bulk(&k).and_then(|()| out.bulk(&v)) {
                return out.overflow(&body_mark, over);
            }
            rows += 1;
            last = Some(k);
        }
        match last {
            Some(k) if got == want && rows < limit => {
                at = k;
                skip_first = true;
            }
            _ => break,
        }
    }
    let header = format!("*{}\r\n", rows * 2);
    let at = body_mark.len();
    out.buf.splice(at..at, header.bytes()).for_each(drop);
}

/// Keys `FLUSHALL` deletes between two turns of its loop.
pub(crate) const FLUSH_SLICE: usize = 1024;

/// Deletes up to [`FLUSH_SLICE`] keys from `from` on, and moves `from`
/// past them; `Ok(true)` once none is left.
pub(crate) fn flush_slice(db: &mut Db, from: &mut Vec<u8>) -> Result<bool, Reply> {
    let sh = db.sh;
    let mut page = sh
        .store
        .scan_keys(from, None, FLUSH_SLICE + 1)
        .map_err(store_err)?;
    let done = page.len() <= FLUSH_SLICE;
    if !done {
        // The next slice starts at the first key this one leaves.
        *from = page.pop().expect("a page of FLUSH_SLICE + 1 keys");
    }
    for k in &page {
        let _l = db.lock(k);
        match sh.store.delete(k) {
            Ok(true) => sh.watches.touch(k),
            Ok(false) => {}
            Err(e) => return Err(store_err(e)),
        }
    }
    Ok(done)
}

/// `EXEC`: the queued commands, isolated and under their keys' stripes,
/// their writes committed with one fence.
fn exec(sh: &Shared, c: &mut Client, out: &mut Out) {
    let Some(queued) = c.txn.queued.take() else {
        return out.err("EXEC without MULTI");
    };
    c.info.multi.store(-1, Ordering::Relaxed);
    let aborted = std::mem::take(&mut c.txn.aborted);
    c.txn.queued_bytes = 0;
    if aborted {
        c.txn.unwatch_all(sh, c.id);
        return out.err("EXECABORT Transaction discarded because of previous errors.");
    }
    let specs: Vec<usize> = queued
        .iter()
        .map(|r| lookup(&r[0]).expect("queued commands are known"))
        .collect();
    let global = specs.iter().any(|&i| TABLE[i].global);
    let _running = sh.iso.begin();
    let _held = if global {
        crate::lock_every_stripe(sh)
    } else {
        let keys = queued
            .iter()
            .zip(&specs)
            .flat_map(|(r, &i)| keys_of(&TABLE[i], r))
            .chain(c.txn.watched.iter().map(|k| &k[..]));
        crate::lock_stripes(sh, keys)
    };
    // Under the stripes: a write of a watched key either came before (and
    // marked us) or waits until we are done.
    let dirty = c.txn.dirty.load(Ordering::SeqCst);
    c.txn.unwatch_all(sh, c.id);
    c.info.watching.store(0, Ordering::Relaxed);
    if dirty {
        return out.reply(&if c.resp3 { Reply::Nil } else { Reply::NilArray });
    }
    let mark = out.mark();
    out.array(queued.len());
    let mut overlay = Overlay::default();
    for (r, &i) in queued.iter().zip(&specs) {
        let mut db = Db::in_txn(sh, &mut overlay);
        run(sh, c, i, r, out, &mut db);
    }
    if let Err(e) = txn::commit(sh, &mut overlay) {
        out.rewind(&mark);
        out.err(e);
    }
}

fn command(args: &[Vec<u8>]) -> Reply {
    let sub = args.get(1).map(|a| upper(a));
    let names = |which: &[Vec<u8>]| -> Vec<usize> {
        if which.is_empty() {
            (0..TABLE.len()).collect()
        } else {
            which.iter().filter_map(|n| lookup(n)).collect()
        }
    };
    let s = |v: &str| Reply::Bulk(v.as_bytes().to_vec());
    let info = |i: usize| {
        let t = &TABLE[i];
        Reply::Array(vec![
            s(&t.name.to_ascii_lowercase()),
            Reply::Int(t.arity),
            Reply::Array(t.flags.iter().map(|f| Reply::Simple((*f).into())).collect()),
            Reply::Int(t.keys.0),
            Reply::Int(t.keys.1),
            Reply::Int(t.keys.2),
        ])
    };
    match sub.as_deref() {
        None => Reply::Array((0..TABLE.len()).map(info).collect()),
        Some("COUNT") => Reply::Int(TABLE.len() as i64),
        Some("LIST") => Reply::Array(
            TABLE
                .iter()
                .map(|t| s(&t.name.to_ascii_lowercase()))
                .collect(),
        ),
        Some("INFO") => Reply::Array(
            args[2..]
                .iter()
                .map(|n| lookup(n).map_or(Reply::Nil, info))
                .collect(),
        ),
        Some("DOCS") => Reply::Map(
            names(&args[2..])
                .into_iter()
                .map(|i| {
                    let t = &TABLE[i];
                    let arguments = t
                        .args
                        .iter()
                        .map(|a| {
                            let mut m = vec![(s("name"), s(a.name)), (s("type"), s(a.kind))];
                            if a.kind == "pure-token" {
                                m.push((s("token"), s(&a.name.to_ascii_uppercase())));
                            }
                            let mut flags = Vec::new();
                            if a.optional {
                                flags.push(Reply::Simple("optional".into()));
                            }
                            if a.multiple {
                                flags.push(Reply::Simple("multiple".into()));
                            }
                            if !flags.is_empty() {
                                m.push((s("flags"), Reply::Array(flags)));
                            }
                            Reply::Map(m)
                        })
                        .collect();
                    (
                        s(&t.name.to_ascii_lowercase()),
                        Reply::Map(vec![
                            (s("summary"), s(t.summary)),
                            (s("since"), s("1.0.0")),
                            (s("group"), s(t.group)),
                            (s("arguments"), Reply::Array(arguments)),
                        ]),
                    )
                })
                .collect(),
        ),
        Some(_) => {
            Reply::err("unknown COMMAND subcommand (COUNT, LIST, INFO and DOCS are supported)")
        }
    }
}

fn config_get(sh: &Shared, pattern: &[u8]) -> Reply {
    let maxclients = sh.max_clients.to_string();
    let maxmem = sh.budget.limit.to_string();
    let known: [(&str, &str); 6] = [
        ("save", ""),
        ("appendonly", "no"),
        ("databases", "1"),
        ("maxmemory", "0"),
        ("maxclients", &maxclients),
        ("maxmemory-clients", &maxmem),
    ];
    let p = Pattern::new(pattern);
    // A map: RESP3 sends `%`, RESP2 the same pairs flattened.
    Reply::Map(
        known
            .iter()
            .filter(|(k, _)| p.matches(k.as_bytes()))
            .map(|(k, v)| {
                (
                    Reply::Bulk(k.as_bytes().to_vec()),
                    Reply::Bulk(v.as_bytes().to_vec()),
                )
            })
            .collect(),
    )
}

fn client(sh: &Shared, c: &mut Client, args: &[Vec<u8>], out: &mut Out) -> After {
    let n = args.len();
    let reply = match upper(&args[1]).as_str() {
        "SETNAME" if n == 3 => {
            if args[2].iter().any(|&b| b <= b' ' || b > b'~') {
                Reply::err("Client names cannot contain spaces, newlines or special characters.")
            } else {
                *c.info.name.lock().expect("client name") = args[2].clone();
                Reply::Ok
            }
        }
        "GETNAME" if n == 2 => {
            let name = c.info.name.lock().expect("client name").clone();
            if name.is_empty() {
                Reply::Nil
            } else {
                Reply::Bulk(name)
            }
        }
        "SETINFO" => Reply::Ok,
        "ID" if n == 2 => Reply::Int(c.id as i64),
        "INFO" if n == 2 => Reply::Bulk(format!("{}\n", c.info.line()).into_bytes()),
        "LIST" => {
            let mut ids = None;
            if n >= 4 && upper(&args[2]) == "ID" {
                match args[3..].iter().map(|a| parse_i64(a)).collect::<Option<Vec<_>>>() {
                    Some(v) => ids = Some(v),
                    None => {
                        out.reply(&Reply::err("Invalid client ID"));
                        return After::Continue;
                    }
                }
            } else if n != 2 && !(n == 4 && upper(&args[2]) == "TYPE") {
                out.err("syntax error");
                return After::Continue;
            }
            let text: String = sh
                .registry
                .all()
                .iter()
                .filter(|i| ids.as_ref().is_none_or(|v| v.contains(&(i.id as i64))))
                .map(|i| i.line() + "\n")
                .collect();
            Reply::Bulk(text.into_bytes())
        }
        "KILL" if n == 3 => {
            // The old form: CLIENT KILL addr:port.
            let target = String::from_utf8_lossy(&args[2]).into_owned();
            match kill(sh, c, |i| i.addr == target, false) {
                (0, _) => Reply::err("No such client"),
                (_, me) => {
                    out.reply(&Reply::Ok);
                    return if me { After::Close } else { After::Continue };
                }
            }
        }
        "KILL" if n >= 4 && n.is_multiple_of(2) => {
            let mut id = None;
            let mut addr = None;
            let mut laddr = None;
            let mut skipme = true;
            for kv in args[2..].chunks(2) {
                let v = &kv[1];
                match upper(&kv[0]).as_str() {
                    "ID" => match parse_i64(v) {
                        Some(i) if i > 0 => id = Some(i as u64),
                        _ => {
                            out.err("client-id should be greater than 0");
                            return After::Continue;
                        }
                    },
                    "ADDR" => addr = Some(String::from_utf8_lossy(v).into_owned()),
                    "LADDR" => laddr = Some(String::from_utf8_lossy(v).into_owned()),
                    "SKIPME" => match upper(v).as_str() {
                        "YES" => skipme = true,
                        "NO" => skipme = false,
                        _ => {
                            out.err("syntax error");
                            return After::Continue;
                        }
                    },
                    "USER" | "TYPE" | "MAXAGE" => {}
                    _ => {
                        out.err("syntax error");
                        return After::Continue;
                    }
                }
            }
            let (count, me) = kill(
                sh,
                c,
                |i| {
                    id.is_none_or(|x| x == i.id)
                        && addr.as_ref().is_none_or(|a| *a == i.addr)
                        && laddr.as_ref().is_none_or(|a| *a == i.laddr)
                },
                skipme,
            );
            out.reply(&Reply::Int(count as i64));
            return if me { After::Close } else { After::Continue };
        }
        "KILL" => Reply::err("syntax error"),
        "SETNAME" | "GETNAME" | "ID" | "INFO" => wrong_args("client"),
        _ => Reply::err(
            "unsupported CLIENT subcommand (LIST, KILL, ID, INFO, SETNAME, GETNAME, SETINFO are supported)",
        ),
    };
    out.reply(&reply);
    After::Continue
}

/// Marks every client `pick` chooses to be closed by its loop. Returns how
/// many, and whether the caller is one of them (it closes after its
/// reply).
fn kill(
    sh: &Shared,
    c: &Client,
    pick: impl Fn(&ClientInfo) -> bool,
    skipme: bool,
) -> (usize, bool) {
    let mut count = 0;
    let mut me = false;
    for i in sh.registry.all() {
        if !pick(&i) || (skipme && i.id == c.id) {
            continue;
        }
        count += 1;
        if i.id == c.id {
            me = true;
            continue;
        }
        i.kill.store(true, Ordering::SeqCst);
        if let Some(w) = sh.workers.get(i.worker) {
            w.kill_pending.store(true, Ordering::SeqCst);
            w.wake();
        }
    }
    (count, me)
}
