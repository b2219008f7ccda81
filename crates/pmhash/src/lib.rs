//! Persistent hash indexes and a key-value store for hybrid DRAM +
//! persistent memory (PM).
//!
//! pmhash keeps a table in a *pool*: one file mapped into memory, on a DAX
//! filesystem over real PM, on `/dev/shm`, or on an ordinary disk. Writes
//! reach the pool with cache-line flushes and fences in an order that
//! survives a crash at any instruction, so a reopened pool holds every
//! acknowledged write and no torn one. Two things live in pools:
//!
//! - [`Store`]: a key-value store of byte keys (up to [`MAX_KEY`] bytes)
//!   and byte values (up to [`MAX_VALUE`] bytes), with ordered range scans.
//!   It keeps a directory of its own (the pool file and its lock).
//! - [`Index`]: a hash index from `u64` keys to `u64` values, in one pool
//!   file, run by one of five engines (see "Which engine" below).
//!
//! # A key-value store
//!
//! ```
//! use pmhash::{Durability, Store};
//!
//! fn main() -> Result<(), pmhash::Error> {
//!     let dir = std::env::temp_dir().join(format!("pmhash-front-{}", std::process::id()));
//!     let store = Store::options().durability(Durability::Strict).open(&dir)?;
//!     store.put(b"apple", b"red")?;
//!     store.put(b"banana", b"yellow")?;
//!     assert_eq!(store.get(b"apple")?.as_deref(), Some(&b"red"[..]));
//!     // An ordered scan of the keys from "a" (inclusive) to "b" (exclusive).
//!     let fruit = store.scan(b"a", Some(b"b"), 10)?;
//!     assert_eq!(fruit, vec![(b"apple".to_vec(), b"red".to_vec())]);
//!     assert!(store.delete(b"banana")?);
//!     store.close()?;
//!
//!     // Everything acknowledged is there after a reopen (after a crash too).
//!     let store = Store::open(&dir)?;
//!     assert_eq!(store.len(), 1);
//!     store.close()?;
//!     std::fs::remove_dir_all(&dir).ok();
//!     Ok(())
//! }
//! ```
//!
//! # A u64 index
//!
//! The engine is chosen by name ([`IndexOptions::engine`]) or by type
//! ([`IndexOptions::create_as`]):
//!
//! ```
//! use pmhash::{engines::Hmeh, Index};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = std::env::temp_dir();
//! let path = dir.join(format!("pmhash-index-{}.pool", std::process::id()));
//! # let _ = std::fs::remove_file(&path);
//! let index = Index::options().engine("pass").create(&path)?;
//! assert!(index.insert(7, 49)?);
//! assert!(!index.insert(7, 50)?, "a key is inserted once");
//! assert!(index.update(7, 50)?);
//! assert_eq!(index.get(7), Some(50));
//! index.close()?;
//!
//! // Reopen: the pool says which engine wrote it.
//! let index = Index::open(&path)?;
//! assert_eq!((index.engine_name(), index.get(7)), ("pass", Some(50)));
//! index.close()?;
//! std::fs::remove_file(&path)?;
//!
//! // By type: static dispatch to one engine.
//! let typed: Index<Hmeh> = Index::options().create_as(&path)?;
//! typed.upsert(1, 2)?;
//! assert_eq!(typed.get(1), Some(2));
//! typed.close()?;
//! # std::fs::remove_file(&path)?;
//! # Ok(())
//! # }
//! ```
//!
//! # The model
//!
//! **Pools and persistence modes** ([`Mode`]). A pool is a file mapped into
//! the process. [`Mode::Dax`] maps it with `MAP_SYNC` on a DAX filesystem:
//! a flushed and fenced store is durable against power loss. [`Mode::Mapped`]
//! (the default) maps an ordinary file: flushed stores survive a crash of
//! the process (`kill -9`, a panic, an abort) at once, and power loss once
//! the page cache is written back. A pool grows (the file is extended and
//! remapped) up to its maximum size; a full pool is an [`Error::OutOfSpace`]
//! that leaves the table unchanged and usable. One process opens a pool
//! for writing at a time (an exclusive file lock); a second writer gets an
//! error, not a shared table.
//!
//! **Durability** ([`Durability`]). Under [`Durability::Strict`] (the
//! default) a mutating call that has returned survives a crash, and a call
//! cut by a crash is all or nothing. Under [`Durability::Relaxed`] the
//! write path has no fence: after a crash the table is consistent and each
//! key holds a value once written to it, but writes since the last `sync`
//! may be missing; `sync()` makes everything before it durable.
//!
//! **Closing.** `close()` persists everything and marks the pool clean, so
//! the next open skips crash recovery; dropping a handle closes it too
//! (ignoring errors: call `close` to see them). Without a close (a crash,
//! `kill -9`) the next open recovers: it may take longer, and it returns
//! the same contents.
//!
//! **Bad input.** A foreign, truncated or corrupt file, an oversized key, a
//! full pool or filesystem: each is an [`Error`] with a message, and a
//! refused open leaves the file byte for byte as it was. Nothing panics.
//!
//! **Threads.** [`Store`] and [`Index`] are `Send + Sync`: share one by
//! reference or in an `Arc`; readers never block writers of other keys.
//!
//! # Which engine
//!
//! | engine | for | notes |
//! |---|---|---|
//! | `pass` | the default: inserts and gets on a table that grows | one fence per insert; `pass-var` keeps 16-byte keys out of line, `pass-dense` trades insert speed for less memory |
//! | `hmeh` | write-heavy use that can take `Relaxed` durability | extendible hashing; no fence at all under `Relaxed` |
//! | `rophi` | lookups of keys that are mostly absent, batched gets | a DRAM cuckoo filter answers misses without touching PM |
//! | `level` | small memory per key | level hashing, in-place resizing |
//! | `E+filter` | any of the above when most gets miss | the same pool format behind a DRAM filter |
//!
//! [`index_engines`] lists them with one line each. The measured numbers
//! (against Dash, CCEH, level hashing and Viper, side by side on one
//! machine) are in the repository's
//! [`docs/benchmarks.md`](https://github.com/pmhash/pmhash/blob/main/docs/benchmarks.md);
//! each engine's design and persist order is in `docs/engines/`.

#![forbid(unsafe_code)]

mod index;
mod kv;

pub use engine::{Durability, Error, Result, Stats as IndexStats};
pub use index::{engines, index_engines, AnyEngine, Index, IndexEngine, IndexOptions};
pub use kv::{Store, StoreOptions};
pub use pmem::{Error as PoolError, Mode};
pub use store::{StoreStats, MAX_KEY, MAX_VALUE};
