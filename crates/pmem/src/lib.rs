//! The persistent-memory layer of pmhash.
//!
//! - [`Pool`]: a pool file (or memory) mapped at a stable address, addressed
//!   by offsets, with a checksummed header (`docs/format.md`).
//! - Persistence [`Mode`]s: `dax`, `mapped`, `volatile`, `simulated`.
//! - Persist primitives [`Pool::flush`], [`Pool::fence`], [`Pool::persist`],
//!   [`Pool::write_nt`], counted per thread ([`persist::counters`]).
//! - The crash-safe allocator: [`Pool::reserve`] → link → [`Pool::commit`].
//! - The crash simulator: fence hooks and crash images in `simulated` mode.

pub mod alloc;
mod error;
pub mod header;
mod map;
pub mod persist;
mod pool;
pub mod sim;
pub mod slots;
pub mod testfs;

pub use alloc::{FreeTicket, Link, Reservation, CHUNK};
pub use error::{Error, Result};
pub use pool::{Mode, Pool, PoolLock, PoolOptions, PoolStats, MIN_POOL_SIZE};
pub use sim::{CrashChoice, CrashSite, FenceHook};
pub use slots::SlotSet;
