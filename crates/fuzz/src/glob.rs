//! The glob matcher: [`server::glob`] against a reference matcher on short
//! random patterns and keys (so that any disagreement shows), and on long
//! hostile ones under a time bound per call.
//!
//! Input: the pattern's length (4 bytes, little-endian), the pattern, then
//! the key.
//!
//! Checks: the same answer as [`reference`]; the call returns within
//! [`time_bound`] (it runs in a thread of its own: a call that does not
//! return in time fails the run, which then stops, as the thread cannot be
//! stopped); no stack overflow (that kills the worker, and the parent
//! reports the case).

use std::time::{Duration, Instant};

use crate::{show, Failure, Rng, Target};

pub(crate) struct Glob;

/// One element of a pattern.
#[derive(Debug)]
enum Tok<'a> {
    /// `*`: any run of bytes, the empty one included.
    Star,
    /// `?`: any one byte.
    One,
    /// One byte, as written or after `\`.
    Lit(u8),
    /// `[...]`: one byte in (or with `^`, not in) the set; `a-z` is a
    /// range (an empty one when `a > z`).
    Set { neg: bool, body: &'a [u8] },
}

/// Splits a pattern into elements, as the server's matcher reads it: `[`
/// with no `]` after it is a plain `[`; `\` before a byte makes it plain,
/// and a `\` at the end is itself; inside `[...]` every byte is plain but
/// a leading `^` and the `-` of a range.
fn tokens(p: &[u8]) -> Vec<Tok<'_>> {
    let mut v = Vec::new();
    let mut i = 0;
    while i < p.len() {
        match p[i] {
            b'*' => v.push(Tok::Star),
            b'?' => v.push(Tok::One),
            b'[' => {
                // Redis: the first `]` not escaped ends the class; without
                // one, the class runs to the end of the pattern.
                let mut j = i + 1;
                while j < p.len() && p[j] != b']' {
                    j += if p[j] == b'\\' { 2 } else { 1 };
                }
                let end = j.min(p.len());
                let body = &p[i + 1..end];
                let (neg, body) = match body.split_first() {
                    Some((b'^', rest)) => (true, rest),
                    _ => (false, body),
                };
                v.push(Tok::Set { neg, body });
                i = end + 1;
                continue;
            }
            b'\\' if i + 1 < p.len() => {
                v.push(Tok::Lit(p[i + 1]));
                i += 2;
                continue;
            }
            c => v.push(Tok::Lit(c)),
        }
        i += 1;
    }
    v
}

fn in_set(body: &[u8], c: u8) -> bool {
    let mut rest = body;
    loop {
        match rest {
            [] => return false,
            [b'\\', x, tail @ ..] => {
                if *x == c {
                    return true;
                }
                rest = tail;
            }
            [lo, b'-', hi, tail @ ..] => {
                if (*lo.min(hi)..=*lo.max(hi)).contains(&c) {
                    return true;
                }
                rest = tail;
            }
            [b, tail @ ..] => {
                if *b == c {
                    return true;
                }
                rest = tail;
            }
        }
    }
}

/// The reference matcher: dynamic programming over (element, key
/// position), O(pattern × key) time, no recursion. `m[j]` after element
/// `t`: the elements before `t` match the first `j` key bytes.
pub(crate) fn reference(pattern: &[u8], key: &[u8]) -> bool {
    let mut m = vec![false; key.len() + 1];
    m[0] = true;
    for t in tokens(pattern) {
        let mut next = vec![false; key.len() + 1];
        match t {
            Tok::Star => {
                let mut any = false;
                for j in 0..=key.len() {
                    any |= m[j];
                    next[j] = any;
                }
            }
            _ => {
                for j in 0..key.len() {
                    let c = key[j];
                    let ok = match t {
                        Tok::One => true,
                        Tok::Lit(b) => b == c,
                        Tok::Set { neg, body } => in_set(body, c) != neg,
                        Tok::Star => unreachable!(),
                    };
                    next[j + 1] = m[j] && ok;
                }
            }
        }
        m = next;
    }
    m[key.len()]
}

/// The longest one call may take: a matcher that costs at most pattern ×
/// key steps does every input this target makes (at most 2^24 such steps)
/// in well under it, with room for a slow shared machine.
pub(crate) fn time_bound(pattern: &[u8], key: &[u8]) -> Duration {
    Duration::from_millis(250 + (pattern.len() as u64 * key.len().max(1) as u64) / 20_000)
}

const ALPHABET: &[u8] = b"ab*?[]^-\\";

fn short(rng: &mut Rng, max: u64, alphabet: &[u8]) -> Vec<u8> {
    (0..rng.below(max + 1))
        .map(|_| alphabet[rng.below(alphabet.len() as u64) as usize])
        .collect()
}

/// A hostile pattern and key: what makes a backtracking matcher take
/// exponential time, or a recursive one overflow its stack.
fn hostile(rng: &mut Rng) -> (Vec<u8>, Vec<u8>) {
    match rng.below(5) {
        0 => {
            // `*a*a*...*a*b` over a run of `a`: every split of the run is
            // tried before the `b` fails.
            let stars = 4 + rng.below(16) as usize;
            let mut p = b"*a".repeat(stars);
            p.extend_from_slice(b"*b");
            let key = vec![b'a'; 30 + rng.below(60) as usize];
            (p, key)
        }
        1 => {
            // One `*` per byte, a hundred thousand of them.
            let n = 1000 + rng.below(100_000) as usize;
            (vec![b'*'; n], b"key".to_vec())
        }
        2 => {
            // A long pattern of single-byte elements over a long key.
            let n = 1000 + rng.below(3000) as usize;
            let p: Vec<u8> = (0..n)
                .map(|i| if i % 2 == 0 { b'?' } else { b'a' })
                .collect();
            (p, vec![b'a'; n])
        }
        3 => {
            let n = 3 + rng.below(12) as usize;
            let mut p = b"*[a-z]".repeat(n);
            p.extend_from_slice(b"*!");
            (p, vec![b'q'; 40 + rng.below(40) as usize])
        }
        _ => {
            let mut p = b"a*".repeat(1 + rng.below(20) as usize);
            p.extend_from_slice(b"?*b");
            let key: Vec<u8> = (0..60 + rng.below(60)).map(|_| b'a').collect();
            (p, key)
        }
    }
}

impl Target for Glob {
    fn generate(&mut self, rng: &mut Rng) -> Vec<u8> {
        let (p, k) = if rng.below(8) == 0 {
            hostile(rng)
        } else {
            let p = short(rng, 10, ALPHABET);
            let k = short(rng, 8, b"ab-]^[\\*");
            (p, k)
        };
        let mut input = (p.len() as u32).to_le_bytes().to_vec();
        input.extend_from_slice(&p);
        input.extend_from_slice(&k);
        input
    }

    fn run(&mut self, input: &[u8]) -> Result<(), Failure> {
        let Some((n, rest)) = input.split_first_chunk::<4>() else {
            return Ok(());
        };
        let n = (u32::from_le_bytes(*n) as usize).min(rest.len());
        let (p, k) = rest.split_at(n);
        let want = reference(p, k);
        let bound = time_bound(p, k);
        let (tx, rx) = std::sync::mpsc::channel();
        let (pc, kc) = (p.to_vec(), k.to_vec());
        let t0 = Instant::now();
        std::thread::Builder::new()
            .name("glob".into())
            .spawn(move || {
                let c0 = crate::thread_cpu_time();
                let got = server::glob(&pc, &kc);
                let _ = tx.send((got, crate::thread_cpu_time().saturating_sub(c0)));
            })
            .map_err(|e| Failure::fatal(format!("cannot start a thread: {e}")))?;
        // The bound is on the call's own CPU time (a loaded machine may
        // leave the thread waiting for a CPU); a call that does not
        // return at all is caught by a far longer wall-clock wait.
        let wall = (bound * 20).max(Duration::from_secs(5));
        match rx.recv_timeout(wall) {
            Ok((_, cpu)) if cpu > bound => Err(Failure::fatal(format!(
                "glob({}, {}) took {cpu:?} of CPU (bound {bound:?}: a pattern of {} bytes over a key of {} allows at most pattern × key steps)",
                show(p, 80),
                show(k, 80),
                p.len(),
                k.len()
            ))),
            Ok((got, _)) if got == want => Ok(()),
            Ok((got, _)) => Err(Failure::new(format!(
                "glob({}, {}) is {got}, the reference says {want}",
                show(p, 80),
                show(k, 80)
            ))),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(Failure::fatal(format!(
                "glob({}, {}) did not return in {:?} (bound {bound:?} of CPU: a pattern of {} bytes over a key of {} allows at most pattern × key steps)",
                show(p, 80),
                show(k, 80),
                t0.elapsed(),
                p.len(),
                k.len()
            ))),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(Failure::new(format!(
                "glob({}, {}) panicked",
                show(p, 80),
                show(k, 80)
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::reference;

    #[test]
    fn the_reference_matches_as_documented() {
        let yes: [(&[u8], &[u8]); 14] = [
            (b"*", b""),
            (b"*", b"anything"),
            (b"user:*", b"user:42"),
            (b"h?llo", b"hello"),
            (b"h[ae]llo", b"hallo"),
            (b"h[^e]llo", b"hallo"),
            (b"k[0-9]", b"k7"),
            (b"a\\*", b"a*"),
            (b"a\\", b"a\\"),
            (b"[abc", b"b"),
            (b"[z-a]", b"m"),
            (b"[^]", b"x"),
            (b"*a*a*b", b"aaab"),
            (b"[a-]", b"-"),
        ];
        for (p, k) in yes {
            assert!(reference(p, k), "{p:?} {k:?}");
        }
        let no: [(&[u8], &[u8]); 10] = [
            (b"user:*", b"usr:42"),
            (b"h[^e]llo", b"hello"),
            (b"?", b""),
            (b"[]", b"]"),
            (b"[abc", b"[abc"),
            (b"a\\*", b"ab"),
            (b"*a*a*b", b"aaaa"),
            (b"", b"x"),
            (b"[", b""),
            (b"[z-a]x", b"-x"),
        ];
        for (p, k) in no {
            assert!(!reference(p, k), "{p:?} {k:?}");
        }
    }
}

#[cfg(test)]
mod agreement {
    use super::*;

    /// The reference and the server's matcher agree on short inputs over
    /// the alphabet that matters (these never take long, whatever the
    /// matcher).
    #[test]
    fn the_reference_agrees_with_the_server_on_short_inputs() {
        let mut rng = Rng::new(3);
        for _ in 0..200_000 {
            let p = short(&mut rng, 8, ALPHABET);
            let k = short(&mut rng, 6, b"ab-]^[\\*");
            assert_eq!(
                server::glob(&p, &k),
                reference(&p, &k),
                "{} {}",
                show(&p, 20),
                show(&k, 20)
            );
        }
    }
}
