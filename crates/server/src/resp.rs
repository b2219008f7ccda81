//! RESP2/RESP3 framing with hard limits.
//!
//! A request is an array of bulk strings (`*N\r\n$L\r\n...`) or an inline
//! command (one line of words). [`Parser`] takes bytes as they arrive from a
//! non-blocking socket and hands out whole requests. Lengths are checked
//! against the limits before anything is allocated, so a length bomb is an
//! error, not an allocation; any framing error ends the connection (the
//! server keeps serving the others).

use std::io::{self, Write};

/// Most arguments in one request.
pub(crate) const MAX_ARGS: usize = 1 << 20;
/// Largest bulk string: the store's largest value plus slack.
pub(crate) const MAX_BULK: usize = (1 << 20) + 4096;
/// Longest inline command or header line.
pub(crate) const MAX_LINE: usize = 64 << 10;
/// Most bytes one request may hold (its arguments plus 32 bytes of
/// bookkeeping each), so that a request of many large arguments cannot
/// take the server's memory.
pub(crate) const MAX_REQUEST: usize = 64 << 20;

/// A request's arguments, the command name first.
pub type Request = Vec<Vec<u8>>;

/// Broken framing or a limit exceeded: reply with this, then close.
#[derive(Debug, PartialEq, Eq)]
pub struct ProtocolError(pub String);

/// Where an unfinished request stands between two calls of
/// [`Parser::next`].
#[derive(Default)]
pub struct Parser {
    args: Vec<Vec<u8>>,
    /// Arguments of the current multibulk still to come (0: between
    /// requests).
    want: usize,
    bytes: usize,
    /// Requests handed back by [`Parser::recycle`], emptied, and the
    /// argument buffers they held: a pipelined SET would otherwise cost
    /// four allocations and four frees.
    free_reqs: Vec<Request>,
    free_bufs: Vec<Vec<u8>>,
    /// Capacity of `free_bufs`, summed.
    free_bytes: usize,
}

/// Most requests and argument buffers a parser keeps for reuse, and the
/// largest buffer it keeps: enough for a pipeline, bounded per connection.
const KEEP_REQS: usize = 64;
const KEEP_BUFS: usize = 128;
const KEEP_BUF_BYTES: usize = 4096;
const KEEP_REQ_ARGS: usize = 64;

/// One line (without its `\r\n` or `\n`) and the bytes it took, or `None`
/// when its end has not arrived yet.
fn line(buf: &[u8]) -> Result<Option<(&[u8], usize)>, ProtocolError> {
    // Only the first MAX_LINE + 2 bytes can hold the end of a line that
    // is allowed: a long bulk string behind it is not searched.
    let window = &buf[..buf.len().min(MAX_LINE + 2)];
    match window.iter().position(|&b| b == b'\n') {
        Some(i) if i <= MAX_LINE + 1 => {
            let l = &buf[..i];
            Ok(Some((l.strip_suffix(b"\r").unwrap_or(l), i + 1)))
        }
        None if buf.len() <= MAX_LINE + 1 => Ok(None),
        _ => Err(ProtocolError(format!(
            "too big inline request or header line (the limit is {MAX_LINE} bytes)"
        ))),
    }
}

fn parse_len(line: &[u8], what: &str, max: usize) -> Result<Option<usize>, ProtocolError> {
    // The common case, plain digits, without the UTF-8 check and the
    // generic integer parser (a pipelined SET parses four lengths).
    let over = |n: u64| {
        ProtocolError(format!(
            "invalid {what} length {n} (the limit is {max} {})",
            if what == "bulk" { "bytes" } else { "arguments" }
        ))
    };
    if (1..=18).contains(&line.len()) && line.iter().all(u8::is_ascii_digit) {
        let n = line.iter().fold(0u64, |n, &d| n * 10 + u64::from(d - b'0'));
        if n > max as u64 {
            return Err(over(n));
        }
        return Ok(Some(n as usize));
    }
    let bad = || ProtocolError(format!("invalid {what} length"));
    let n: i64 = std::str::from_utf8(line)
        .map_err(|_| bad())?
        .parse()
        .map_err(|_| bad())?;
    if n < 0 {
        return Ok(None);
    }
    if n as u64 > max as u64 {
        return Err(over(n as u64));
    }
    Ok(Some(n as usize))
}

impl Parser {
    /// Parses from `buf`, the bytes received and not yet consumed. Returns
    /// how many bytes it consumed and, once a request is whole, the
    /// request (empty for an empty line or `*0`). A part of a request that
    /// has arrived is consumed and kept here; call again with more bytes.
    pub fn next(&mut self, buf: &[u8]) -> Result<(usize, Option<Request>), ProtocolError> {
        let mut at = 0;
        if self.want == 0 {
            let Some((l, n)) = line(buf)? else {
                return Ok((0, None));
            };
            at = n;
            if l.first() != Some(&b'*') {
                // Inline command: words split on spaces and tabs.
                let words = l
                    .split(|&b| b == b' ' || b == b'\t')
                    .filter(|w| !w.is_empty())
                    .map(|w| w.to_vec())
                    .collect();
                return Ok((at, Some(words)));
            }
            match parse_len(&l[1..], "multibulk", MAX_ARGS)? {
                None | Some(0) => return Ok((at, Some(Vec::new()))),
                Some(n) => {
                    self.want = n;
                    self.args = self.free_reqs.pop().unwrap_or_default();
                    self.args.reserve(n.min(KEEP_REQ_ARGS));
                    self.bytes = 0;
                }
            }
        }
        while self.want > 0 {
            let Some((l, n)) = line(&buf[at..])? else {
                break;
            };
            if l.first() != Some(&b'$') {
                return Err(ProtocolError(format!(
                    "expected '$', got '{}'",
                    l.first().map_or(' ', |&b| b as char)
                )));
            }
            let len = parse_len(&l[1..], "bulk", MAX_BULK)?
                .ok_or_else(|| ProtocolError("invalid bulk length".into()))?;
            self.bytes += len + 32;
            if self.bytes > MAX_REQUEST {
                return Err(ProtocolError(format!(
                    "request too large (the limit is {MAX_REQUEST} bytes: arguments plus 32 bytes each)"
                )));
            }
            let body = at + n;
            if buf.len() < body + len + 2 {
                // Wait for the whole string; its header is read again then.
                self.bytes -= len + 32;
                break;
            }
            if &buf[body + len..body + len + 2] != b"\r\n" {
                return Err(ProtocolError("bulk string not ended by CRLF".into()));
            }
            let mut arg = self.pop_buf();
            arg.extend_from_slice(&buf[body..body + len]);
            self.args.push(arg);
            at = body + len + 2;
            self.want -= 1;
        }
        if self.want == 0 {
            self.bytes = 0;
            return Ok((at, Some(std::mem::take(&mut self.args))));
        }
        Ok((at, None))
    }

    /// Takes back a request [`next`](Self::next) returned, once it is
    /// done with, to reuse its memory (within bounds).
    pub fn recycle(&mut self, mut req: Request) {
        for mut a in req.drain(..) {
            if self.free_bufs.len() < KEEP_BUFS && a.capacity() <= KEEP_BUF_BYTES {
                a.clear();
                self.free_bytes += a.capacity();
                self.free_bufs.push(a);
            }
        }
        if self.free_reqs.len() < KEEP_REQS && req.capacity() <= KEEP_REQ_ARGS {
            self.free_reqs.push(req);
        }
    }

    fn pop_buf(&mut self) -> Vec<u8> {
        let b = self.free_bufs.pop().unwrap_or_default();
        self.free_bytes -= b.capacity();
        b
    }

    /// Bytes this parser holds: the finished arguments of an unfinished
    /// request (with 32 bytes of bookkeeping each, as the request limit
    /// counts them) and the buffers kept for reuse.
    pub fn held(&self) -> usize {
        self.bytes
            + self.free_bytes
            + self.free_reqs.len() * KEEP_REQ_ARGS * std::mem::size_of::<Vec<u8>>()
    }
}

/// Appends a bulk string reply for `v` (what `Reply::Bulk(v)` writes),
/// without the formatter or a copy of `v` into a reply: the hot path of
/// GET.
pub(crate) fn put_bulk(out: &mut Vec<u8>, v: &[u8]) {
    let mut digits = [0u8; 20];
    let mut n = v.len();
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.push(b'$');
    out.extend_from_slice(&digits[at..]);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(v);
    out.extend_from_slice(b"\r\n");
}

/// A reply, encoded for RESP2 or RESP3.
pub(crate) enum Reply {
    Ok,
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    /// A null array (RESP2 `*-1`; RESP3 has one null).
    NilArray,
    Array(Vec<Reply>),
    /// RESP3 map (RESP2: flat array of key, value, ...).
    Map(Vec<(Reply, Reply)>),
}

impl Reply {
    pub(crate) fn err(m: impl Into<String>) -> Reply {
        Reply::Error(m.into())
    }

    pub(crate) fn write<W: Write>(&self, w: &mut W, resp3: bool) -> io::Result<()> {
        match self {
            Reply::Ok => w.write_all(b"+OK\r\n"),
            Reply::Simple(s) => write!(w, "+{s}\r\n"),
            Reply::Error(e) => {
                if e.starts_with("ERR ")
                    || e.starts_with("WRONGTYPE")
                    || e.starts_with("NOAUTH")
                    || e.starts_with("WRONGPASS")
                    || e.starts_with("NOPROTO")
                    || e.starts_with("EXECABORT")
                {
                    write!(w, "-{e}\r\n")
                } else {
                    write!(w, "-ERR {e}\r\n")
                }
            }
            Reply::Int(i) => write!(w, ":{i}\r\n"),
            Reply::Bulk(b) => {
                write!(w, "${}\r\n", b.len())?;
                w.write_all(b)?;
                w.write_all(b"\r\n")
            }
            Reply::Nil => w.write_all(if resp3 { b"_\r\n" } else { b"$-1\r\n" }),
            Reply::NilArray => w.write_all(if resp3 { b"_\r\n" } else { b"*-1\r\n" }),
            Reply::Array(items) => {
                write!(w, "*{}\r\n", items.len())?;
                for i in items {
                    i.write(w, resp3)?;
                }
                Ok(())
            }
            Reply::Map(pairs) => {
                if resp3 {
                    write!(w, "%{}\r\n", pairs.len())?;
                } else {
                    write!(w, "*{}\r\n", pairs.len() * 2)?;
                }
                for (k, v) in pairs {
                    k.write(w, resp3)?;
                    v.write(w, resp3)?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `b` in pieces of `step` bytes; returns the requests.
    fn parse_in_steps(b: &[u8], step: usize) -> Result<Vec<Vec<Vec<u8>>>, ProtocolError> {
        let mut p = Parser::default();
        let (mut got, mut pending, mut fed) = (Vec::new(), Vec::new(), 0);
        loop {
            let (n, req) = p.next(&pending)?;
            pending.drain(..n);
            match req {
                Some(r) => got.push(r),
                None if fed == b.len() => return Ok(got),
                None => {
                    let m = step.min(b.len() - fed);
                    pending.extend_from_slice(&b[fed..fed + m]);
                    fed += m;
                }
            }
        }
    }

    fn parse(b: &[u8]) -> Result<Vec<Vec<u8>>, ProtocolError> {
        let mut p = Parser::default();
        match p.next(b)? {
            (_, Some(r)) => Ok(r),
            (_, None) => Err(ProtocolError("incomplete".into())),
        }
    }

    /// The generic parse `parse_len` had before its digits fast path.
    fn parse_len_generic(line: &[u8], max: usize) -> Result<Option<usize>, ()> {
        let n: i64 = std::str::from_utf8(line)
            .map_err(|_| ())?
            .parse()
            .map_err(|_| ())?;
        if n < 0 {
            return Ok(None);
        }
        if n as u64 > max as u64 {
            return Err(());
        }
        Ok(Some(n as usize))
    }

    #[test]
    fn lengths_parse_as_the_generic_integer_parser_does() {
        let mut cases: Vec<Vec<u8>> = [
            "",
            "0",
            "7",
            "007",
            "-1",
            "-0",
            "+5",
            " 5",
            "5 ",
            "1a",
            "-",
            "99999999999999999",
            "999999999999999999",
            "9999999999999999999",
            "99999999999999999999",
            "1048576",
            "1052672",
            "1052673",
        ]
        .iter()
        .map(|c| c.as_bytes().to_vec())
        .collect();
        cases.push(vec![0xff, b'1']);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            x = x.rotate_left(7).wrapping_mul(0x2545_f491_4f6c_dd1d);
            cases.push(
                (x % 10u64.pow((x >> 59) as u32 % 20))
                    .to_string()
                    .into_bytes(),
            );
        }
        for c in &cases {
            for max in [0, 1, MAX_BULK, MAX_ARGS, usize::MAX] {
                let fast = parse_len(c, "bulk", max).map_err(|_| ());
                assert_eq!(fast, parse_len_generic(c, max), "{c:?} max {max}");
            }
        }
    }

    #[test]
    fn put_bulk_writes_what_a_bulk_reply_writes() {
        for len in [0usize, 1, 9, 10, 99, 100, 1000, 65_536, 1 << 20] {
            let v: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut want = Vec::new();
            Reply::Bulk(v.clone()).write(&mut want, false).unwrap();
            let mut got = b"x".to_vec();
            put_bulk(&mut got, &v);
            assert_eq!(&got[1..], &want[..], "length {len}");
        }
    }

    #[test]
    fn multibulk_and_inline() {
        let a = parse(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n").unwrap();
        assert_eq!(a, vec![b"GET".to_vec(), b"k".to_vec()]);
        let a = parse(b"SET  k v\r\n").unwrap();
        assert_eq!(a, vec![b"SET".to_vec(), b"k".to_vec(), b"v".to_vec()]);
        let a = parse(b"*1\r\n$0\r\n\r\n").unwrap();
        assert_eq!(a, vec![Vec::<u8>::new()]);
    }

    #[test]
    fn requests_split_anywhere_parse_the_same() {
        let mut wire = Vec::new();
        let mut want = Vec::new();
        for i in 0..50u32 {
            let v = vec![b'a' + (i % 26) as u8; (i as usize * 37) % 300];
            wire.extend_from_slice(
                format!("*3\r\n$3\r\nSET\r\n$2\r\nk{}\r\n${}\r\n", i % 10, v.len()).as_bytes(),
            );
            wire.extend_from_slice(&v);
            wire.extend_from_slice(b"\r\n");
            want.push(vec![
                b"SET".to_vec(),
                format!("k{}", i % 10).into_bytes(),
                v,
            ]);
            wire.extend_from_slice(b"PING\r\n");
            want.push(vec![b"PING".to_vec()]);
        }
        for step in [1, 2, 3, 7, 64, 1000, wire.len()] {
            assert_eq!(parse_in_steps(&wire, step).unwrap(), want, "step {step}");
        }
    }

    #[test]
    fn incomplete_requests_wait_for_more() {
        let mut p = Parser::default();
        assert_eq!(p.next(b"*2\r\n$3\r\nGE").unwrap(), (4, None));
        // The first bulk is not whole: its header is not consumed.
        assert_eq!(p.next(b"$3\r\nGE").unwrap(), (0, None));
        assert_eq!(p.next(b"$3\r\nGET\r\n$1").unwrap(), (9, None));
        assert_eq!(
            p.next(b"$1\r\nk\r\n").unwrap(),
            (7, Some(vec![b"GET".to_vec(), b"k".to_vec()]))
        );
        assert_eq!(p.next(b"").unwrap(), (0, None));
    }

    #[test]
    fn length_bombs_are_errors_not_allocations() {
        assert!(parse(b"*99999999999\r\n").is_err());
        assert!(parse(b"*1\r\n$1099511627776\r\n").is_err());
        assert!(parse(b"*1\r\n+x\r\n").is_err());
        assert!(parse(b"*1\r\n$3\r\nabcd\r\n").is_err());
        assert!(parse(&vec![b'x'; MAX_LINE + 1]).is_err());
        // Many large arguments: refused once the request passes MAX_REQUEST,
        // long before the arguments arrive.
        let mut p = Parser::default();
        let mut wire = b"*1000\r\n".to_vec();
        let mut refused = false;
        for _ in 0..1000 {
            let mut hdr = format!("${}\r\n", MAX_BULK).into_bytes();
            hdr.resize(hdr.len() + MAX_BULK, b'v');
            hdr.extend_from_slice(b"\r\n");
            wire.extend_from_slice(&hdr);
            match p.next(&wire) {
                Ok((n, None)) => {
                    wire.drain(..n);
                }
                Ok((_, Some(_))) => panic!("a request over MAX_REQUEST was accepted"),
                Err(_) => {
                    refused = true;
                    break;
                }
            }
        }
        assert!(refused);
    }

    #[test]
    fn replies_encode_for_both_protocols() {
        let mut v = Vec::new();
        Reply::Array(vec![Reply::Int(1), Reply::Nil, Reply::Bulk(b"x".to_vec())])
            .write(&mut v, false)
            .unwrap();
        assert_eq!(v, b"*3\r\n:1\r\n$-1\r\n$1\r\nx\r\n");
        v.clear();
        Reply::Nil.write(&mut v, true).unwrap();
        assert_eq!(v, b"_\r\n");
        v.clear();
        Reply::err("boom").write(&mut v, false).unwrap();
        assert_eq!(v, b"-ERR boom\r\n");
    }
}
