//! RESP framing: [`server::Parser::next`] fed mutated pipelines.
//!
//! Input: byte 0 flags (bit 0: the wire is valid multibulk, unmutated),
//! bytes 1..9 the seed of the chunking, then the wire bytes.
//!
//! Checks: no panic; each call consumes at most the bytes it was given
//! and never hands out a request made of no bytes; the parser's heap stays
//! within a bound proportional to the bytes fed; the wire fed whole and
//! fed in random pieces gives the same requests and the same error; and a
//! valid pipeline parses with no error into requests that encode back to
//! exactly its bytes, and (up to 4 KiB) cut into two pieces at every byte
//! parses into the same requests.

use server::{Parser, ProtocolError, Request};

use crate::mutate::mutate;
use crate::{show, Failure, Rng, Target};

pub(crate) struct Resp;

/// Commands the seed pipelines are made of.
const COMMANDS: [&str; 16] = [
    "GET", "SET", "DEL", "MGET", "MSET", "INCRBY", "SCAN", "RANGE", "PING", "ECHO", "HELLO",
    "AUTH", "CONFIG", "CLIENT", "EXISTS", "GETSET",
];

/// Most heap a parser may hold beyond the bytes given to it.
const HEAP_SLACK: usize = 256 << 10;

fn arg(rng: &mut Rng) -> Vec<u8> {
    let n = match rng.below(8) {
        0 => 0,
        1 => 200 + rng.below(3000),
        _ => rng.below(12),
    } as usize;
    match rng.below(3) {
        0 => (0..n).map(|_| rng.next() as u8).collect(),
        _ => (0..n).map(|_| b'a' + rng.below(26) as u8).collect(),
    }
}

/// Encodes a request as a multibulk, as a client does.
pub(crate) fn encode(req: &[Vec<u8>], out: &mut Vec<u8>) {
    out.extend_from_slice(format!("*{}\r\n", req.len()).as_bytes());
    for a in req {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// What a parse gave: the requests, then the error that ended it (if any).
type Outcome = (Vec<Request>, Option<ProtocolError>, usize);

/// Feeds the whole wire at once; returns the outcome and the bytes left.
fn parse_whole(wire: &[u8]) -> Result<Outcome, Failure> {
    let mut p = Parser::default();
    let mut at = 0;
    let mut got = Vec::new();
    loop {
        let rest = &wire[at..];
        match p.next(rest) {
            Err(e) => return Ok((got, Some(e), wire.len() - at)),
            Ok((n, req)) => {
                if n > rest.len() {
                    return Err(Failure::new(format!(
                        "consumed {n} bytes of {} given",
                        rest.len()
                    )));
                }
                at += n;
                match req {
                    Some(_) if n == 0 => {
                        return Err(Failure::new(
                            "a request made of no bytes (a caller would loop forever)",
                        ))
                    }
                    Some(r) => got.push(r),
                    None if n == 0 => return Ok((got, None, wire.len() - at)),
                    None => {}
                }
            }
        }
    }
}

/// Feeds the wire in pieces drawn from `rng`, as the server does (append
/// what arrived, take requests until one is not whole), checking the heap
/// after every call, and compares each request with `want` as it comes.
fn parse_chunked(wire: &[u8], rng: &mut Rng, want: &Outcome) -> Result<(), Failure> {
    let base = crate::heap_live();
    let mut p = Parser::default();
    let mut pending: Vec<u8> = Vec::with_capacity(64);
    let mut fed = 0;
    let mut count = 0usize;
    let mut err = None;
    'feed: while fed < wire.len() {
        let step = match rng.below(4) {
            0 => 1,
            1 => 1 + rng.below(8) as usize,
            2 => 1 + rng.below(300) as usize,
            _ => 1 + rng.below(5000) as usize,
        }
        .min(wire.len() - fed);
        pending.extend_from_slice(&wire[fed..fed + step]);
        fed += step;
        loop {
            let r = p.next(&pending);
            let held = crate::heap_live().saturating_sub(base);
            let bound = 4 * fed + HEAP_SLACK;
            if crate::heap_counted() && held > bound {
                return Err(Failure::new(format!(
                    "the parser holds {held} bytes of heap after {fed} bytes fed (bound {bound})"
                )));
            }
            match r {
                Err(e) => {
                    err = Some(e);
                    break 'feed;
                }
                Ok((n, req)) => {
                    if n > pending.len() {
                        return Err(Failure::new(format!(
                            "consumed {n} bytes of {} given",
                            pending.len()
                        )));
                    }
                    pending.drain(..n);
                    let Some(req) = req else { break };
                    if n == 0 {
                        return Err(Failure::new("a request made of no bytes"));
                    }
                    match want.0.get(count) {
                        Some(w) if *w == req => {}
                        w => {
                            return Err(Failure::new(format!(
                                "request {count} fed in pieces is {:?}, fed whole {:?}",
                                req.iter().map(|a| show(a, 40)).collect::<Vec<_>>(),
                                w.map(|w| w.iter().map(|a| show(a, 40)).collect::<Vec<_>>())
                            )))
                        }
                    }
                    count += 1;
                    p.recycle(req);
                }
            }
        }
    }
    if count != want.0.len() || err != want.1 {
        return Err(Failure::new(format!(
            "fed in pieces: {count} requests then {err:?}; fed whole: {} requests then {:?}",
            want.0.len(),
            want.1
        )));
    }
    Ok(())
}

/// Feeds `wire[..cut]`, then the rest, as two arrivals; the requests must
/// be `want`'s.
fn parse_split(wire: &[u8], cut: usize, want: &Outcome) -> Result<(), Failure> {
    let mut p = Parser::default();
    let mut pending = Vec::new();
    let mut got = Vec::new();
    for piece in [&wire[..cut], &wire[cut..]] {
        pending.extend_from_slice(piece);
        loop {
            let (n, req) = p.next(&pending).map_err(|e| {
                Failure::new(format!(
                    "a valid pipeline cut at byte {cut} of {}: {e:?}",
                    wire.len()
                ))
            })?;
            pending.drain(..n);
            match req {
                Some(r) => got.push(r),
                None => break,
            }
        }
    }
    if got != want.0 || !pending.is_empty() {
        return Err(Failure::new(format!(
            "a valid pipeline cut at byte {cut} of {} parses into {} requests ({} bytes left), whole into {}",
            wire.len(),
            got.len(),
            pending.len(),
            want.0.len()
        )));
    }
    Ok(())
}

impl Target for Resp {
    fn generate(&mut self, rng: &mut Rng) -> Vec<u8> {
        let mut wire = Vec::new();
        for _ in 0..1 + rng.below(10) {
            let cmd = COMMANDS[rng.below(COMMANDS.len() as u64) as usize];
            let mut req = vec![cmd.as_bytes().to_vec()];
            for _ in 0..rng.below(5) {
                req.push(arg(rng));
            }
            encode(&req, &mut wire);
        }
        let mutated = rng.below(4) != 0;
        if mutated {
            if rng.below(5) == 0 {
                // Inline commands mixed in.
                let at = rng.below(wire.len() as u64 + 1) as usize;
                wire.splice(at..at, b"SET k v\r\nPING\n".iter().copied());
            }
            mutate(rng, &mut wire, 8, 1 << 16);
        }
        let mut input = vec![u8::from(!mutated)];
        input.extend_from_slice(&rng.next().to_le_bytes());
        input.extend_from_slice(&wire);
        input
    }

    fn run(&mut self, input: &[u8]) -> Result<(), Failure> {
        if input.len() < 9 {
            return Ok(());
        }
        let valid = input[0] & 1 == 1;
        let mut rng = Rng::new(u64::from_le_bytes(input[1..9].try_into().expect("8 bytes")));
        let wire = &input[9..];
        let whole = parse_whole(wire)?;
        if valid {
            let mut again = Vec::new();
            for r in &whole.0 {
                encode(r, &mut again);
            }
            if whole.1.is_some() || whole.2 != 0 || again != wire {
                return Err(Failure::new(format!(
                    "a valid pipeline of {} bytes parsed into {} requests, error {:?}, {} bytes left; they encode back to {} bytes",
                    wire.len(),
                    whole.0.len(),
                    whole.1,
                    whole.2,
                    again.len()
                )));
            }
        }
        for _ in 0..3 {
            parse_chunked(wire, &mut rng, &whole)?;
        }
        if valid && wire.len() <= 4096 {
            // Split anywhere: every cut into two pieces parses the same.
            for cut in 1..wire.len() {
                parse_split(wire, cut, &whole)?;
            }
        }
        Ok(())
    }
}
