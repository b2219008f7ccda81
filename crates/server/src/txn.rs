//! Transactions (`MULTI`/`EXEC`/`DISCARD`, `WATCH`/`UNWATCH`) and the
//! isolation they need from readers.
//!
//! - **Writers.** Every write holds its key's stripe lock (1024 stripes by
//!   key hash). `EXEC` takes the stripes of every key its queued commands
//!   name and of every watched key, in stripe order (so no two lockers
//!   deadlock), or every stripe when a queued command has no keys of its
//!   own (`FLUSHALL`, `SCAN`, `RANGE`, `DBSIZE`). No other write of those
//!   keys runs until the transaction is done.
//! - **Readers** take no lock while no transaction runs. [`Isolation`]
//!   counts running transactions and numbers each start: a one-key read
//!   that sees one running takes its key's stripe (waiting for that
//!   transaction to end), and a many-key read (`MGET`, `EXISTS`, a
//!   pipeline of `GET`s) reads again under the stripes if a transaction
//!   started while it read. So a reader sees all of a transaction's writes
//!   or none, and once it has seen one it sees the rest.
//! - **One fence.** Inside `EXEC` the commands write to an [`Overlay`]
//!   (their own later reads see it); at the end its puts and deletes go to
//!   the store as one `write_batch`, one fence for all of them. The
//!   batch is not crash-atomic: after a crash any subset of a
//!   transaction's writes may be there (as Redis without an AOF).
//! - **WATCH.** Every write of a key, under its stripe, marks the clients
//!   watching it ([`Watches::touch`]); `EXEC` checks its mark under the
//!   stripes, so a write that landed between `WATCH` and `EXEC` aborts it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::resp::Request;
use crate::Shared;

/// Counts running transactions (and `MSET`s), and numbers their starts.
#[derive(Default)]
pub(crate) struct Isolation {
    active: AtomicUsize,
    started: AtomicU64,
}

/// A running transaction; ends when dropped.
pub(crate) struct Running<'a>(&'a Isolation);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Isolation {
    /// Marks a transaction as running. Call before taking its stripes: a
    /// reader that does not see it running then has read before any of
    /// its writes.
    pub(crate) fn begin(&self) -> Running<'_> {
        self.active.fetch_add(1, Ordering::SeqCst);
        self.started.fetch_add(1, Ordering::SeqCst);
        Running(self)
    }

    /// Whether a transaction runs now.
    pub(crate) fn running(&self) -> bool {
        self.active.load(Ordering::SeqCst) > 0
    }

    /// A token for [`unchanged`](Self::unchanged), or `None` if a
    /// transaction runs now.
    pub(crate) fn snapshot(&self) -> Option<u64> {
        let s = self.started.load(Ordering::SeqCst);
        (!self.running()).then_some(s)
    }

    /// Whether no transaction started since `snapshot` gave `token`.
    pub(crate) fn unchanged(&self, token: u64) -> bool {
        self.started.load(Ordering::SeqCst) == token
    }
}

/// Most keys one client may watch.
pub const MAX_WATCHED: usize = 1 << 16;
/// Most commands one `MULTI` may queue.
pub const MAX_QUEUED: usize = 1 << 16;

/// The clients watching one key: their ids and their dirty marks.
type Watchers = Vec<(u64, Arc<AtomicBool>)>;

/// Who watches which key.
#[derive(Default)]
pub(crate) struct Watches {
    count: AtomicUsize,
    map: Mutex<HashMap<Vec<u8>, Watchers>>,
}

impl Watches {
    pub(crate) fn watch(&self, id: u64, dirty: &Arc<AtomicBool>, key: &[u8]) {
        let mut m = self.map.lock().expect("watches");
        let who = m.entry(key.to_vec()).or_default();
        if !who.iter().any(|(i, _)| *i == id) {
            who.push((id, dirty.clone()));
            self.count.fetch_add(1, Ordering::SeqCst);
        }
    }

    pub(crate) fn unwatch(&self, id: u64, keys: &[Vec<u8>]) {
        if keys.is_empty() {
            return;
        }
        let mut m = self.map.lock().expect("watches");
        for k in keys {
            if let Some(who) = m.get_mut(k) {
                let before = who.len();
                who.retain(|(i, _)| *i != id);
                self.count.fetch_sub(before - who.len(), Ordering::SeqCst);
                if who.is_empty() {
                    m.remove(k);
                }
            }
        }
    }

    /// A write of `key` landed: every client watching it fails its next
    /// `EXEC`. Called under the key's stripe.
    pub(crate) fn touch(&self, key: &[u8]) {
        if self.count.load(Ordering::SeqCst) == 0 {
            return;
        }
        if let Some(who) = self.map.lock().expect("watches").get(key) {
            for (_, d) in who {
                d.store(true, Ordering::SeqCst);
            }
        }
    }
}

/// A connection's transaction state.
#[derive(Default)]
pub(crate) struct TxnState {
    /// Commands queued since `MULTI` (`None`: not in one).
    pub(crate) queued: Option<Vec<Request>>,
    /// Bytes the queued commands hold.
    pub(crate) queued_bytes: usize,
    /// A queued command was refused: `EXEC` answers `EXECABORT`.
    pub(crate) aborted: bool,
    pub(crate) watched: Vec<Vec<u8>>,
    pub(crate) watched_bytes: usize,
    /// Set when a watched key is written.
    pub(crate) dirty: Arc<AtomicBool>,
}

impl TxnState {
    /// Bytes held for the transaction and the watches.
    pub(crate) fn held(&self) -> usize {
        self.queued_bytes + self.watched_bytes
    }

    pub(crate) fn unwatch_all(&mut self, sh: &Shared, id: u64) {
        sh.watches.unwatch(id, &self.watched);
        self.watched.clear();
        self.watched_bytes = 0;
        self.dirty.store(false, Ordering::SeqCst);
    }
}

/// The bytes a request holds, as the memory bounds count them.
pub(crate) fn request_bytes(r: &Request) -> usize {
    r.iter().map(|a| a.len() + 32).sum()
}

/// A transaction's writes, not yet in the store: the value each key will
/// have (`None`: deleted).
#[derive(Default)]
pub(crate) struct Overlay {
    writes: HashMap<Vec<u8>, Option<Vec<u8>>>,
}

/// The keyspace as one command sees it: the store itself (taking each
/// key's stripe to write), or a transaction's overlay over the store
/// (stripes already held by `EXEC`).
pub(crate) struct Db<'a> {
    pub(crate) sh: &'a Shared,
    overlay: Option<&'a mut Overlay>,
}

impl<'a> Db<'a> {
    pub(crate) fn direct(sh: &'a Shared) -> Db<'a> {
        Db { sh, overlay: None }
    }

    pub(crate) fn in_txn(sh: &'a Shared, o: &'a mut Overlay) -> Db<'a> {
        Db {
            sh,
            overlay: Some(o),
        }
    }

    pub(crate) fn is_txn(&self) -> bool {
        self.overlay.is_some()
    }

    /// The key's stripe, for a write (or a read that must not interleave
    /// with one); inside a transaction `EXEC` holds it already.
    pub(crate) fn lock(&self, key: &[u8]) -> Option<MutexGuard<'a, ()>> {
        if self.overlay.is_some() {
            return None;
        }
        Some(
            self.sh.locks[crate::stripe(self.sh, key)]
                .lock()
                .expect("key lock"),
        )
    }

    /// The value of `key`, as a read isolated from transactions.
    pub(crate) fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, engine::Error> {
        if let Some(o) = self.overlay.as_deref() {
            if let Some(v) = o.writes.get(key) {
                return Ok(v.clone());
            }
            return self.sh.store.get(key);
        }
        if self.sh.iso.running() {
            let _l = self.lock(key);
            return self.sh.store.get(key);
        }
        self.sh.store.get(key)
    }

    /// The value of `key` when the caller holds its stripe already.
    pub(crate) fn get_locked(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, engine::Error> {
        if let Some(o) = self.overlay.as_deref() {
            if let Some(v) = o.writes.get(key) {
                return Ok(v.clone());
            }
        }
        self.sh.store.get(key)
    }

    /// Puts `key`; the caller holds its stripe (outside a transaction).
    pub(crate) fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), engine::Error> {
        if let Some(o) = self.overlay.as_deref_mut() {
            store_checks(key, Some(value))?;
            o.writes.insert(key.to_vec(), Some(value.to_vec()));
            return Ok(());
        }
        self.sh.store.put(key, value)?;
        self.sh.watches.touch(key);
        Ok(())
    }

    /// Deletes `key`; the caller holds its stripe (outside a transaction).
    pub(crate) fn delete(&mut self, key: &[u8]) -> Result<bool, engine::Error> {
        if self.overlay.is_some() {
            store_checks(key, None)?;
            let present = self.get_locked(key)?.is_some();
            if present {
                if let Some(o) = self.overlay.as_deref_mut() {
                    o.writes.insert(key.to_vec(), None);
                }
            }
            return Ok(present);
        }
        let gone = self.sh.store.delete(key)?;
        if gone {
            self.sh.watches.touch(key);
        }
        Ok(gone)
    }

    /// Writes what the overlay holds to the store (inside a transaction,
    /// before a command that reads the store past the overlay); a no-op
    /// outside one.
    pub(crate) fn barrier(&mut self) -> Result<(), String> {
        match self.overlay.as_deref_mut() {
            Some(o) => commit(self.sh, o),
            None => Ok(()),
        }
    }
}

/// The checks the store makes on a write, made when it is queued in an
/// overlay so that the command's reply is the error the store would give.
fn store_checks(key: &[u8], value: Option<&[u8]>) -> Result<(), engine::Error> {
    if key.len() > store::MAX_KEY {
        return Err(engine::Error::InvalidArgument(format!(
            "key of {} bytes is over the limit of {} bytes",
            key.len(),
            store::MAX_KEY
        )));
    }
    if let Some(v) = value.filter(|v| v.len() > store::MAX_VALUE) {
        return Err(engine::Error::InvalidArgument(format!(
            "value of {} bytes is over the limit of {} bytes",
            v.len(),
            store::MAX_VALUE
        )));
    }
    Ok(())
}

/// Writes a transaction's overlay as one store batch of puts and deletes
/// (one fence for all of them); touches every written key for `WATCH`.
/// The caller holds every key's stripe. Leaves the overlay empty.
pub(crate) fn commit(sh: &Shared, o: &mut Overlay) -> Result<(), String> {
    let writes = std::mem::take(&mut o.writes);
    let total = writes.len();
    let ops: Vec<(&[u8], Option<&[u8]>)> =
        writes.iter().map(|(k, v)| (&k[..], v.as_deref())).collect();
    // persist: the store's batch fences every entry before it returns and
    // before the index names any of them; the replies go out after.
    let (done, err) = match sh.store.write_batch(&ops) {
        Ok(()) => (total, None),
        Err(e) => (e.done, Some(e.error)),
    };
    for (k, _) in &ops[..done] {
        sh.watches.touch(k);
    }
    match err {
        None => Ok(()),
        Some(e) => Err(format!(
            "transaction applied in part: {done} of its {total} writes landed, then: {e}"
        )),
    }
}
