//! Redis-style glob patterns (`SCAN … MATCH`, `CONFIG GET`): `*`, `?`,
//! `[...]` (with `^` and `a-z` ranges) and `\` escapes.
//!
//! The syntax is Redis's (`stringmatchlen`): escapes inside classes, a
//! reversed range is the same range, a class without its `]` runs to
//! the end of the pattern. One difference: a `-` last in a class is a
//! literal `-` (Redis would take the class's `]` as the range's end).
//!
//! The pattern comes from a client, so matching is bounded: no recursion
//! (a pattern of 100,000 `*` must not overflow the event loop's stack) and
//! no exponential backtracking (`*a*a*a*a*a*a*a*b` against sixty `a`s,
//! the class of Redis's CVE-2022-36021). A pattern is compiled once into
//! tokens, runs of `*` collapsed into one; the matcher walks key and
//! pattern once, and on a mismatch goes back only to the last `*` seen,
//! which then swallows one more byte. Each `*` restart moves the key
//! position forward, so a match costs at most (tokens + 1) times (key
//! length + 1) token steps, which [`Pattern::cost`] reports for the
//! caller's work budget.
//!
//! Why only the last `*`: every token other than `*` matches exactly one
//! byte, so once the tokens after the last `*` are placed, moving an
//! earlier `*` can only shift where the later segment starts, which the
//! last `*` already tries.

/// Patterns needing more bytes than this match nothing (and are not
/// compiled further): it bounds the memory a client's pattern can take.
const MAX_FIXED: usize = 1 << 16;

/// One element of a compiled pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    /// Any run of bytes (a run of `*` in the pattern).
    Star,
    /// Any one byte.
    Any,
    /// Exactly this byte (a literal, an escaped byte, or a `[` without
    /// its `]`).
    Byte(u8),
    /// A byte class: bytes and inclusive ranges, negated with `^`.
    Class { neg: bool, ranges: Vec<(u8, u8)> },
}

impl Token {
    fn matches(&self, c: u8) -> bool {
        match self {
            Token::Star | Token::Any => true,
            Token::Byte(b) => *b == c,
            Token::Class { neg, ranges } => {
                ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *neg
            }
        }
    }
}

/// A compiled glob pattern.
#[derive(Clone, Debug)]
pub struct Pattern {
    tokens: Vec<Token>,
    /// Tokens that consume exactly one byte: a key shorter than this
    /// cannot match.
    fixed: usize,
}

impl Pattern {
    /// Compiles `p`. Every byte string is a pattern (as in Redis): a `[`
    /// without a closing `]` is a literal `[`, a trailing `\` a literal
    /// `\`.
    pub fn new(p: &[u8]) -> Pattern {
        let mut tokens = Vec::new();
        let mut fixed = 0;
        let mut i = 0;
        while i < p.len() {
            if fixed > MAX_FIXED {
                // No byte string this long is matched here (keys are at
                // most 4 KiB): compiling the rest would only cost memory.
                return Pattern {
                    tokens: vec![Token::Byte(0); 1],
                    fixed: usize::MAX,
                };
            }
            let t = match p[i] {
                b'*' => {
                    while i < p.len() && p[i] == b'*' {
                        i += 1;
                    }
                    tokens.push(Token::Star);
                    continue;
                }
                b'?' => Token::Any,
                b'\\' if i + 1 < p.len() => {
                    i += 1;
                    Token::Byte(p[i])
                }
                b'[' => {
                    // As in Redis, a class without its `]` runs to the
                    // end of the pattern.
                    let end = class_end(p, i + 1).unwrap_or(p.len());
                    let body = &p[i + 1..end];
                    i = end;
                    class(body)
                }
                b => Token::Byte(b),
            };
            tokens.push(t);
            fixed += 1;
            i += 1;
        }
        Pattern { tokens, fixed }
    }

    /// The most token steps [`matches`](Self::matches) takes on a key of
    /// `key_len` bytes.
    pub fn cost(&self, key_len: usize) -> usize {
        if key_len < self.fixed {
            return 1;
        }
        (self.tokens.len() + 1).saturating_mul(key_len + 1)
    }

    /// Whether the whole of `s` matches.
    pub fn matches(&self, s: &[u8]) -> bool {
        if s.len() < self.fixed {
            return false;
        }
        let t = &self.tokens;
        let (mut pi, mut si) = (0usize, 0usize);
        // The last `*` seen: the token after it, and the key position it
        // was last resumed from.
        let mut star: Option<(usize, usize)> = None;
        loop {
            if pi < t.len() {
                if t[pi] == Token::Star {
                    pi += 1;
                    star = Some((pi, si));
                    continue;
                }
                if si < s.len() && t[pi].matches(s[si]) {
                    pi += 1;
                    si += 1;
                    continue;
                }
            } else if si == s.len() {
                return true;
            }
            // A mismatch (or pattern used up before the key): the last
            // `*` takes one more byte, and the tokens after it start over.
            match star {
                Some((after, from)) if from < s.len() => {
                    star = Some((after, from + 1));
                    pi = after;
                    si = from + 1;
                }
                _ => return false,
            }
        }
    }
}

/// Where the class whose body starts at `from` ends (its `]`), skipping
/// escaped bytes; `None` if it does not.
fn class_end(p: &[u8], from: usize) -> Option<usize> {
    let mut j = from;
    while j < p.len() {
        match p[j] {
            b'\\' => j += 2,
            b']' => return Some(j),
            _ => j += 1,
        }
    }
    None
}

/// The body of `[...]`: `^` first negates; `\x` is the byte `x`; `a-z`
/// is a range (either order, as in Redis).
fn class(body: &[u8]) -> Token {
    let (neg, body) = match body.strip_prefix(b"^") {
        Some(rest) => (true, rest),
        None => (false, body),
    };
    let mut ranges = Vec::new();
    let mut i = 0;
    while i < body.len() {
        if body[i] == b'\\' && i + 1 < body.len() {
            ranges.push((body[i + 1], body[i + 1]));
            i += 2;
        } else if i + 2 < body.len() && body[i + 1] == b'-' {
            let (a, b) = (body[i], body[i + 2]);
            ranges.push((a.min(b), a.max(b)));
            i += 3;
        } else {
            ranges.push((body[i], body[i]));
            i += 1;
        }
    }
    Token::Class { neg, ranges }
}

/// Whether `s` matches the glob `p` (compiles `p` each call; for many keys
/// compile a [`Pattern`] once).
pub fn glob(p: &[u8], s: &[u8]) -> bool {
    Pattern::new(p).matches(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plain dynamic-programming matcher over the same tokens: the
    /// specification the fast matcher is checked against.
    fn reference(p: &[u8], s: &[u8]) -> bool {
        let t = Pattern::new(p).tokens;
        // m[i][j]: tokens[i..] match s[j..].
        let mut m = vec![vec![false; s.len() + 1]; t.len() + 1];
        m[t.len()][s.len()] = true;
        for i in (0..t.len()).rev() {
            for j in (0..=s.len()).rev() {
                m[i][j] = match &t[i] {
                    Token::Star => m[i + 1][j] || (j < s.len() && m[i][j + 1]),
                    tok => j < s.len() && tok.matches(s[j]) && m[i + 1][j + 1],
                };
            }
        }
        m[0][0]
    }

    #[test]
    fn patterns_match_as_in_redis() {
        assert!(glob(b"*", b"anything"));
        assert!(glob(b"*", b""));
        assert!(glob(b"user:*", b"user:42"));
        assert!(!glob(b"user:*", b"usr:42"));
        assert!(glob(b"h?llo", b"hello"));
        assert!(!glob(b"h?llo", b"hllo"));
        assert!(glob(b"h[ae]llo", b"hallo"));
        assert!(!glob(b"h[^e]llo", b"hello"));
        assert!(glob(b"h[^e]llo", b"hallo"));
        assert!(glob(b"k[0-9]", b"k7"));
        assert!(glob(b"k[9-0]", b"k7"));
        assert!(!glob(b"k[0-9]", b"kx"));
        assert!(glob(b"a\\*", b"a*"));
        assert!(!glob(b"a\\*", b"ab"));
        assert!(!glob(b"a[", b"a["));
        assert!(glob(b"a[bc", b"ac"));
        assert!(glob(b"a[^b\\[]?", b"a\\a"));
        assert!(!glob(b"a[^b\\[]?", b"a[a"));
        assert!(glob(b"a\\", b"a\\"));
        assert!(glob(b"*b*c", b"abxbc"));
        assert!(!glob(b"*b*c", b"abxbd"));
        assert!(glob(b"a*b*c*", b"aXbYcZ"));
        assert!(glob(b"[\\]]", b"]"));
    }

    #[test]
    fn the_matcher_agrees_with_the_reference_on_every_small_case() {
        let alphabet: &[u8] = b"ab*?[]^-\\";
        let keys: Vec<Vec<u8>> = (0..=4)
            .flat_map(|len| {
                (0..3usize.pow(len as u32)).map(move |mut x| {
                    (0..len)
                        .map(|_| {
                            let c = b"ab]"[x % 3];
                            x /= 3;
                            c
                        })
                        .collect()
                })
            })
            .collect();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 7) as usize;
            let p: Vec<u8> = (0..len)
                .map(|i| alphabet[((x >> (8 + 5 * i)) % alphabet.len() as u64) as usize])
                .collect();
            for k in &keys {
                assert_eq!(
                    Pattern::new(&p).matches(k),
                    reference(&p, k),
                    "pattern {:?} key {:?}",
                    String::from_utf8_lossy(&p),
                    String::from_utf8_lossy(k)
                );
            }
        }
    }

    #[test]
    fn a_pattern_longer_than_any_key_matches_nothing_and_costs_little() {
        let p = b"a".repeat(MAX_FIXED + 10);
        let pat = Pattern::new(&p);
        assert!(pat.tokens.len() <= 1);
        assert!(!pat.matches(&p));
        assert!(!pat.matches(b"a"));
        assert_eq!(pat.cost(4096), 1);
    }

    #[test]
    fn a_pattern_of_a_hundred_thousand_stars_neither_recurses_nor_crawls() {
        let p = vec![b'*'; 100_000];
        let t = std::time::Instant::now();
        assert!(glob(&p, b"key"));
        let mut q = vec![b'*'; 100_000];
        q.push(b'z');
        assert!(!glob(&q, &[b'a'; 4096]));
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
    }

    #[test]
    fn the_backtracking_pattern_of_cve_2022_36021_costs_pattern_times_key() {
        let p = b"*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b";
        let key = [b'a'; 4096];
        let pat = Pattern::new(p);
        assert!(pat.cost(key.len()) <= (p.len() + 1) * (key.len() + 1));
        let t = std::time::Instant::now();
        assert!(!pat.matches(&key));
        assert!(!pat.matches(&key[..60]));
        assert!(
            t.elapsed() < std::time::Duration::from_millis(200),
            "took {:?}",
            t.elapsed()
        );
    }
}
