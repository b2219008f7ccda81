//! The on-disk format of a ROPHI table. Every offset is relative to the
//! block that holds it; every word is little-endian and 8-byte aligned.
//!
//! ```text
//! Root block (64 bytes, linked from the pool root)
//!   0    magic "ROPHI\0v1"
//!   8    hash seed (from the pool's uuid; checked at open)
//!   16   table: the live table, as a descriptor (block offset | k, the
//!        head array has 2^k buckets). 0 = create not finished.
//!        THE COMMIT WORD of a resize (one 8-byte store)
//!   24   next: a table a resize is building (0 = none); after a crash it
//!        is given back unless `table` already names it
//!   32   old: a table a finished resize is giving back (0 = none)
//!   40   item count: written at clean close, trusted only after one
//!
//! Table block (64 + 64·2^k bytes)
//!   0    magic "ROPHItb1"   8 k   16 slabs: first overflow slab (0 none)
//!   24   the root block's offset (a table of another pool is refused)
//!   64   head bucket[i], i = the top k bits of the key's hash
//!
//! Overflow slab (64 + 64·n bytes; chain buckets come from here)
//!   0    magic "ROPHIsl1"   8 next slab (0 none)   16 n
//!   64   n buckets
//!
//! Bucket (64 bytes, one cache line: the paper's layout, field order ours)
//!   0    tokens: byte i is 1 when slot i holds a pair, else 0; bytes
//!        3..8 are 0
//!   8    slot 0: key, value   24 slot 1   40 slot 2
//!   56   next: the next bucket of the chain (a slab bucket), 0 = end
//! ```
//!
//! A slot is a pair iff its token is 1: THE COMMIT of an insert is the
//! token store, in the same line as the key and value it covers, so one
//! flush and one fence persist all three (a line reaches PM whole, its
//! stores in program order). A delete is the token store alone.

/// Cache-line size in bytes.
pub const LINE: u64 = 64;
/// Bucket size in bytes (one line).
pub const BUCKET: u64 = 64;
/// Slots per bucket.
pub const SLOTS: usize = 3;

/// Root block size in bytes.
pub const ROOT_BYTES: u64 = 64;
/// Root block magic (offset 0).
pub const ROOT_MAGIC: u64 = u64::from_le_bytes(*b"ROPHI\0v1");
/// Root: hash seed.
pub const R_SEED: u64 = 8;
/// Root: the live table's descriptor (the commit word of a resize).
pub const R_TABLE: u64 = 16;
/// Root: the table a resize is building, or the one reserved ahead of the
/// next resize (0: none); open gives it back after a crash.
pub const R_NEXT: u64 = 24;
/// Root: the table a finished resize is giving back (0: none).
pub const R_OLD: u64 = 32;
/// Root: item count (written at clean close).
pub const R_LEN: u64 = 40;

/// Table block magic (offset 0).
pub const TABLE_MAGIC: u64 = u64::from_le_bytes(*b"ROPHItb1");
/// Table block: `k` (the head array has 2^k buckets).
pub const T_K: u64 = 8;
/// Table block: the first overflow slab (0: none).
pub const T_SLABS: u64 = 16;
/// Table block: the root block's offset.
pub const T_ROOT: u64 = 24;
/// Table block: the head buckets.
pub const T_HEADS: u64 = 64;

/// Overflow slab magic (offset 0).
pub const SLAB_MAGIC: u64 = u64::from_le_bytes(*b"ROPHIsl1");
/// Overflow slab: the next slab (0: none).
pub const S_NEXT: u64 = 8;
/// Overflow slab: its bucket count.
pub const S_COUNT: u64 = 16;
/// Overflow slab: its buckets.
pub const S_BUCKETS: u64 = 64;

/// Word indices inside a bucket.
pub const W_TOKENS: usize = 0;
/// Word index of the next-bucket word.
pub const W_NEXT: usize = 7;

/// Smallest and largest head arrays (log2).
pub const MIN_K: u32 = 4;
/// Largest head array (log2).
pub const MAX_K: u32 = 36;

/// Grow the head array when the table holds more than this many keys per
/// head bucket (3 slots each): at 2.0 a Poisson load leaves 11% of the keys
/// in chain buckets, at 1.0 (just after doubling) 2.4%.
pub const GROW_AT: f64 = 2.0;

/// Reserve the next doubling's table when the table holds more than this
/// many keys per head and, for several writers, fault its pages in on a
/// thread of its own, so that the doubling finds them mapped
/// (`docs/engines/rophi.md`, "The next table, ahead").
pub const PREPARE_AT: f64 = 1.5;

/// Only for tables of at least 2^this heads (a next table of 256 KiB): a
/// smaller one faults in about as fast as a thread starts. CI's wide
/// crash-checker run of ROPHI (`.ci/run`) doubles from 2^11 heads, so it
/// crashes tables reserved ahead too.
pub const PREPARE_MIN_K: u32 = 11;
/// A new table gets `capacity / CREATE_LOAD` heads, rounded up to a power
/// of two.
pub const CREATE_LOAD: f64 = 2.0;

/// Buckets per overflow slab: a sixteenth of the heads, within these bounds.
pub const SLAB_MIN: u64 = 64;
/// Most buckets per overflow slab.
pub const SLAB_MAX: u64 = 1 << 16;

/// The token bit of slot `i` in the tokens word.
#[inline]
pub const fn token(i: usize) -> u64 {
    1 << (8 * i)
}

/// Key word and value word of slot `i`.
#[inline]
pub const fn w_key(i: usize) -> usize {
    1 + 2 * i
}
/// Value word of slot `i`.
#[inline]
pub const fn w_val(i: usize) -> usize {
    2 + 2 * i
}

/// A table descriptor: the block offset (64-aligned) with `k` in the low
/// six bits. Descriptors are never reused while a reader may hold one: a
/// resize always makes `k` larger.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Table {
    /// Offset of the table block.
    pub off: u64,
    /// The head array has 2^k buckets.
    pub k: u32,
}

impl Table {
    /// The table a descriptor names.
    #[inline]
    pub fn from_desc(d: u64) -> Table {
        Table {
            off: d & !63,
            k: (d & 63) as u32,
        }
    }
    /// The table's descriptor.
    #[inline]
    pub fn desc(self) -> u64 {
        self.off | self.k as u64
    }
    /// Head buckets.
    #[inline]
    pub fn heads(self) -> u64 {
        1 << self.k
    }
    /// Bytes of the table block.
    #[inline]
    pub fn bytes(self) -> u64 {
        T_HEADS + BUCKET * self.heads()
    }
    /// The head bucket of a key hash: its top `k` bits.
    #[inline]
    pub fn bucket_of(self, h: u64) -> u64 {
        h >> (64 - self.k)
    }
    /// Offset of head bucket `bn`.
    #[inline]
    pub fn head(self, bn: u64) -> u64 {
        self.off + T_HEADS + BUCKET * bn
    }
}

/// Buckets per overflow slab for a table of `heads` heads.
pub fn slab_buckets(heads: u64) -> u64 {
    (heads / 16).clamp(SLAB_MIN, SLAB_MAX)
}
