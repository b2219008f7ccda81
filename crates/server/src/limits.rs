//! Memory bounds: what one connection may hold, what all of them may hold
//! together, and the writer that keeps a reply inside both while it is
//! built.
//!
//! - **Per connection.** Input: one request of at most
//!   [`MAX_REQUEST`](crate::resp::MAX_REQUEST) bytes (its finished
//!   arguments are kept until it is whole) plus the read buffer (twice the
//!   longest line or bulk string at most). Output: a connection whose
//!   unsent replies pass [`OUT_SOFT`] is not served until its peer reads;
//!   a single reply may take the unsent bytes up to
//!   [`Config::client_output_limit`](crate::Config::client_output_limit),
//!   and one that would pass it is replaced by an error while it is built.
//! - **All connections.** Every byte a connection holds beyond
//!   [`ALLOWANCE`] is charged to one [`Budget`] of
//!   [`Config::max_client_memory`](crate::Config::max_client_memory)
//!   bytes (as Redis's `maxmemory-clients`). A connection whose input
//!   would pass it gets an error and is closed; a reply that would pass it
//!   is replaced by an error. A connection within its allowance is never
//!   refused, so clients with ordinary requests are served whatever the
//!   others hold.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::resp::{put_bulk, Reply};

/// Bytes a connection holds without charging the shared budget: its
/// buffers at their starting sizes and a few ordinary requests.
pub const ALLOWANCE: usize = 256 << 10;
/// Unsent reply bytes past which a connection is not served until its
/// peer reads.
pub const OUT_SOFT: usize = 4 << 20;
/// The default of [`Config::client_output_limit`](crate::Config::client_output_limit).
pub const CLIENT_OUTPUT_LIMIT: usize = 64 << 20;
/// The default of [`Config::max_client_memory`](crate::Config::max_client_memory).
pub const MAX_CLIENT_MEMORY: usize = 1 << 30;

/// Memory shared by every connection: bytes beyond each one's
/// [`ALLOWANCE`] are taken from here first.
pub(crate) struct Budget {
    pub(crate) limit: usize,
    used: AtomicUsize,
    /// Requests and replies refused because the budget was spent.
    pub(crate) refusals: AtomicU64,
}

impl Budget {
    pub(crate) fn new(limit: usize) -> Budget {
        Budget {
            limit,
            used: AtomicUsize::new(0),
            refusals: AtomicU64::new(0),
        }
    }

    /// Takes `n` bytes if they fit.
    pub(crate) fn try_take(&self, n: usize) -> bool {
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            let Some(next) = cur.checked_add(n).filter(|&x| x <= self.limit) else {
                self.refusals.fetch_add(1, Ordering::Relaxed);
                return false;
            };
            match self
                .used
                .compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    pub(crate) fn give(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::Relaxed);
    }

    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

/// Why a reply could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Over {
    /// The connection's unsent output would pass its limit.
    Output(usize),
    /// The shared budget is spent.
    Memory(usize),
}

impl Over {
    pub(crate) fn reply(self) -> Reply {
        match self {
            Over::Output(limit) => Reply::err(format!(
                "reply too large: it would pass the client output limit of {limit} bytes; ask for fewer keys or a smaller LIMIT"
            )),
            Over::Memory(limit) => Reply::err(format!(
                "client memory limit reached: all clients together hold {limit} bytes (maxmemory-clients); try again later"
            )),
        }
    }
}

/// What a reply being built may still add.
pub(crate) struct Room<'a> {
    budget: &'a Budget,
    /// Before the connection's unsent output reaches its limit.
    conn_left: usize,
    /// Of the connection's allowance, not charged to the budget.
    free_left: usize,
    /// Taken from the budget for this reply; the connection adds it to
    /// what it is charged.
    pub(crate) taken: usize,
    output_limit: usize,
}

impl<'a> Room<'a> {
    pub(crate) fn new(
        budget: &'a Budget,
        output_limit: usize,
        unsent: usize,
        free_left: usize,
    ) -> Room<'a> {
        Room {
            budget,
            conn_left: output_limit.saturating_sub(unsent),
            free_left,
            taken: 0,
            output_limit,
        }
    }

    /// Whether `n` more bytes would fit now, taking nothing: for refusing
    /// a reply before it is built. [`take`](Self::take) still decides.
    pub(crate) fn would_fit(&self, n: usize) -> Result<(), Over> {
        if n > self.conn_left {
            return Err(Over::Output(self.output_limit));
        }
        let rest = n.saturating_sub(self.free_left);
        if rest > self.budget.limit.saturating_sub(self.budget.used()) {
            return Err(Over::Memory(self.budget.limit));
        }
        Ok(())
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<(), Over> {
        if n > self.conn_left {
            return Err(Over::Output(self.output_limit));
        }
        let free = n.min(self.free_left);
        let rest = n - free;
        if rest > 0 && !self.budget.try_take(rest) {
            return Err(Over::Memory(self.budget.limit));
        }
        self.free_left -= free;
        self.conn_left -= n;
        self.taken += rest;
        Ok(())
    }
}

/// A point in a reply being built, to go back to.
pub(crate) struct Mark {
    len: usize,
    conn_left: usize,
    free_left: usize,
    taken: usize,
}

impl Mark {
    /// The reply's length at the mark.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

/// Where a command writes its reply: the connection's output buffer, the
/// protocol, and the room left.
pub(crate) struct Out<'a> {
    pub(crate) buf: &'a mut Vec<u8>,
    pub(crate) resp3: bool,
    pub(crate) room: Room<'a>,
}

/// Bookkeeping bytes counted per element of a large reply (its type byte,
/// length and line ends).
pub(crate) const PER_ITEM: usize = 16;

impl Out<'_> {
    pub(crate) fn reply(&mut self, r: &Reply) {
        // Writing to a Vec cannot fail.
        let _ = r.write(self.buf, self.resp3);
    }

    pub(crate) fn err(&mut self, m: impl Into<String>) {
        self.reply(&Reply::err(m));
    }

    pub(crate) fn array(&mut self, n: usize) {
        let _ = std::io::Write::write_fmt(self.buf, format_args!("*{n}\r\n"));
    }

    pub(crate) fn nil(&mut self) {
        self.reply(&Reply::Nil);
    }

    /// A bulk string, if it fits.
    pub(crate) fn bulk(&mut self, v: &[u8]) -> Result<(), Over> {
        self.room.take(v.len() + PER_ITEM)?;
        put_bulk(self.buf, v);
        Ok(())
    }

    /// Where the reply being built starts, and the room left there.
    pub(crate) fn mark(&self) -> Mark {
        Mark {
            len: self.buf.len(),
            conn_left: self.room.conn_left,
            free_left: self.room.free_left,
            taken: self.room.taken,
        }
    }

    /// Drops everything written since `mark`, and gives its room back.
    pub(crate) fn rewind(&mut self, mark: &Mark) {
        self.buf.truncate(mark.len);
        self.room.budget.give(self.room.taken - mark.taken);
        self.room.conn_left = mark.conn_left;
        self.room.free_left = mark.free_left;
        self.room.taken = mark.taken;
    }

    /// Replaces everything written since `mark` by the error for `over`.
    pub(crate) fn overflow(&mut self, mark: &Mark, over: Over) {
        self.rewind(mark);
        self.reply(&over.reply());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_never_hands_out_more_than_its_limit() {
        let b = Budget::new(1000);
        assert!(b.try_take(600));
        assert!(!b.try_take(401));
        assert!(b.try_take(400));
        assert!(!b.try_take(1));
        b.give(500);
        assert_eq!(b.used(), 500);
        assert!(b.try_take(500));
        assert_eq!(b.refusals.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_reply_uses_the_allowance_first_then_the_budget_and_stops_at_either_limit() {
        let b = Budget::new(100);
        let mut r = Room::new(&b, 1000, 0, 50);
        assert_eq!(r.take(40), Ok(()));
        assert_eq!(b.used(), 0);
        assert_eq!(r.take(60), Ok(()));
        assert_eq!((b.used(), r.taken), (50, 50));
        assert_eq!(r.take(51), Err(Over::Memory(100)));
        let mut r = Room::new(&b, 1000, 990, 50);
        assert_eq!(r.take(11), Err(Over::Output(1000)));
    }

    #[test]
    fn would_fit_answers_as_take_would_and_takes_nothing() {
        let b = Budget::new(100);
        assert!(b.try_take(30));
        let r = Room::new(&b, 1000, 0, 50);
        assert_eq!(r.would_fit(120), Ok(()));
        assert_eq!(r.would_fit(121), Err(Over::Memory(100)));
        assert_eq!(r.would_fit(1001), Err(Over::Output(1000)));
        assert_eq!(b.used(), 30);
    }
}
