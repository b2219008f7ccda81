//! The persistent-memory layer of pmhash.
//!
//! - [`Pool`]: a pool file (or memory) mapped at a stable address, addressed
//!   by offsets, with a checksummed header (`docs/format.md`).
//! - [`Region`]: the pool's mapped bytes and persist primitives, below both
//!   the pool's header and the allocator (a `Pool` derefs to its region).
//! - Persistence [`Mode`]s: `dax`, `mapped`, `volatile`, `simulated`.
//! - Persist primitives [`Region::flush`], [`Region::fence`], [`Region::persist`],
//!   [`Region::write_nt`], counted per thread ([`persist::counters`]).
//! - The crash-safe allocator: [`Pool::reserve`] → link → [`Pool::commit`].
//! - The crash simulator: fence hooks and crash images in `simulated` mode.

mod alloc;
mod error;
pub mod header;
mod map;
pub mod persist;
mod pool;
mod region;
mod sim;
mod slots;
pub mod testfs;

pub use alloc::{FreeTicket, Link, PoolStats, Reservation, CHUNK, CLASSES};
pub use error::{Error, Result};
pub use header::Identity;
pub use pool::{Pool, PoolLock, PoolOptions, MIN_POOL_SIZE};
pub use region::{Mode, Region};
pub use sim::{CrashChoice, CrashSite, FenceHook};
pub use slots::SlotSet;
