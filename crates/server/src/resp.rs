//! RESP2/RESP3 framing with hard limits.
//!
//! A request is an array of bulk strings (`*N\r\n$L\r\n...`) or an inline
//! command (one line of words). Lengths are checked against the limits
//! before anything is allocated, so a length bomb is an error, not an
//! allocation; any framing error ends the connection (the server keeps
//! serving the others).

use std::io::{self, BufRead, Write};

/// Most arguments in one request.
pub const MAX_ARGS: usize = 1 << 20;
/// Largest bulk string: the store's largest value plus slack.
pub const MAX_BULK: usize = (1 << 20) + 4096;
/// Longest inline command or header line.
pub const MAX_LINE: usize = 64 << 10;

#[derive(Debug)]
pub enum ReadError {
    /// The peer closed the connection between requests.
    Closed,
    /// Broken framing or a limit exceeded: reply with this, then close.
    Protocol(String),
    Io(io::Error),
}

impl From<io::Error> for ReadError {
    fn from(e: io::Error) -> Self {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            ReadError::Closed
        } else {
            ReadError::Io(e)
        }
    }
}

fn read_line<R: BufRead>(r: &mut R, buf: &mut Vec<u8>) -> Result<usize, ReadError> {
    buf.clear();
    loop {
        let avail = r.fill_buf()?;
        if avail.is_empty() {
            return if buf.is_empty() {
                Err(ReadError::Closed)
            } else {
                Err(ReadError::Protocol("unexpected end of stream".into()))
            };
        }
        match avail.iter().position(|&b| b == b'\n') {
            Some(i) => {
                buf.extend_from_slice(&avail[..i]);
                r.consume(i + 1);
                if buf.last() == Some(&b'\r') {
                    buf.pop();
                }
                return Ok(buf.len());
            }
            None => {
                let n = avail.len();
                buf.extend_from_slice(avail);
                r.consume(n);
                if buf.len() > MAX_LINE {
                    return Err(ReadError::Protocol("line too long".into()));
                }
            }
        }
    }
}

fn parse_len(line: &[u8], what: &str, max: usize) -> Result<Option<usize>, ReadError> {
    let s = std::str::from_utf8(line)
        .map_err(|_| ReadError::Protocol(format!("invalid {what} length")))?;
    let n: i64 = s
        .parse()
        .map_err(|_| ReadError::Protocol(format!("invalid {what} length")))?;
    if n < 0 {
        return Ok(None);
    }
    if n as u64 > max as u64 {
        return Err(ReadError::Protocol(format!("invalid {what} length")));
    }
    Ok(Some(n as usize))
}

/// Reads one request; `Ok(vec![])` for an empty inline line.
pub fn read_request<R: BufRead>(r: &mut R) -> Result<Vec<Vec<u8>>, ReadError> {
    let mut line = Vec::new();
    read_line(r, &mut line)?;
    if line.first() != Some(&b'*') {
        // Inline command: words split on spaces.
        return Ok(line
            .split(|&b| b == b' ' || b == b'\t')
            .filter(|w| !w.is_empty())
            .map(|w| w.to_vec())
            .collect());
    }
    let Some(n) = parse_len(&line[1..], "multibulk", MAX_ARGS)? else {
        return Ok(Vec::new());
    };
    let mut args = Vec::with_capacity(n.min(1024));
    for _ in 0..n {
        read_line(r, &mut line)?;
        if line.first() != Some(&b'$') {
            return Err(ReadError::Protocol(format!(
                "expected '$', got '{}'",
                line.first().map_or(' ', |&b| b as char)
            )));
        }
        let len = parse_len(&line[1..], "bulk", MAX_BULK)?
            .ok_or_else(|| ReadError::Protocol("invalid bulk length".into()))?;
        let mut data = vec![0u8; len + 2];
        r.read_exact(&mut data)?;
        if &data[len..] != b"\r\n" {
            return Err(ReadError::Protocol("bulk string not ended by CRLF".into()));
        }
        data.truncate(len);
        args.push(data);
    }
    Ok(args)
}

/// A reply, encoded for RESP2 or RESP3.
pub enum Reply {
    Ok,
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<Reply>),
    /// RESP3 map (RESP2: flat array of key, value, ...).
    Map(Vec<(Reply, Reply)>),
}

impl Reply {
    pub fn err(m: impl Into<String>) -> Reply {
        Reply::Error(m.into())
    }

    pub fn write<W: Write>(&self, w: &mut W, resp3: bool) -> io::Result<()> {
        match self {
            Reply::Ok => w.write_all(b"+OK\r\n"),
            Reply::Simple(s) => write!(w, "+{s}\r\n"),
            Reply::Error(e) => {
                if e.starts_with("ERR ")
                    || e.starts_with("WRONGTYPE")
                    || e.starts_with("NOAUTH")
                    || e.starts_with("WRONGPASS")
                    || e.starts_with("NOPROTO")
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

    fn parse(b: &[u8]) -> Result<Vec<Vec<u8>>, ReadError> {
        read_request(&mut std::io::BufReader::new(b))
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
    fn length_bombs_are_errors_not_allocations() {
        assert!(matches!(
            parse(b"*99999999999\r\n"),
            Err(ReadError::Protocol(_))
        ));
        assert!(matches!(
            parse(b"*1\r\n$1099511627776\r\n"),
            Err(ReadError::Protocol(_))
        ));
        assert!(matches!(
            parse(b"*1\r\n+x\r\n"),
            Err(ReadError::Protocol(_))
        ));
        assert!(matches!(
            parse(b"*1\r\n$3\r\nabcd\r\n"),
            Err(ReadError::Protocol(_))
        ));
        assert!(matches!(parse(b""), Err(ReadError::Closed)));
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
