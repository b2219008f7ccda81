//! OP-HMEH's bytes in the pool. `docs/engines/hmeh.md` draws the same
//! layout; keep the two in step.
//!
//! ```text
//! root block (the pool root, 64 bytes, one cache line)
//!   0     magic "PMHMEH01"
//!   8     seed            hash seed, random at create
//!   16    hash kind       0 = seeded fmix64 (default), 1 = identity (tests)
//!   24    geometry        segment lines (bits 0..16) | max depth (16..24)
//!   32    RT root node    offset of the radix-tree root (64 bytes)
//!   40    zero-hash key   1 = present: the one key whose hash is 0 lives here
//!   48    its value
//!   56    item count      written at clean close; trusted only after one
//!
//! RT node (64 bytes): 8 entries; entry = segment offset (64-aligned) or
//!   child node offset | 1. A node at level L (root = 1) resolves hash
//!   prefix bits 3(L-1)..3L; its "depth" is 3L. A segment of local depth
//!   LD in a node of depth D (D-3 <= LD <= D, LD >= 1) fills 2^(D-LD)
//!   contiguous entries.
//!
//! segment (S bytes, S = 2^k, 1 KiB..32 KiB; lines = S/64)
//!   line 0: header
//!     0   lock word       seqlock, epoch-tagged (engine::sync::LineLock)
//!     8   ident           "HS" magic (bits 48..64) | LD (32..40) | prefix
//!                         (0..32, top-aligned: the segment owns hashes
//!                         whose top LD bits equal the prefix's)
//!     16  count           valid items (DRAM meaning; exact after a clean
//!                         close, rebuilt after a crash)
//!     24  stash bits      bit (b % 64) set: an item whose home is bucket b
//!                         may sit in the stash (DRAM meaning, like the
//!                         spill bits below)
//!     32  backup          relaxed mode: a flushed backup segment (0 none)
//!     40  overflow        first overflow block (0 none)
//!     48  retired         1 once the segment left the directory (DRAM meaning)
//!     56  spill bits      bit (b % 64) set: an item whose home is bucket b
//!                         sits in a later bucket of its window (DRAM
//!                         meaning; a clear bit lets a search read bucket b
//!                         alone)
//!   lines 1..=N: normal buckets; lines N+1..lines: stash buckets
//!   bucket (64 bytes) = 4 cross-KV slots of 16 bytes:
//!     word 0 = hash[63:32] << 32 | value[63:32]
//!     word 1 = hash[31:0]  << 32 | value[31:0]
//!
//! overflow block (S bytes): header line (word 40 = next block), then
//!   lines-1 buckets of stash-like slots.
//! ```
//!
//! A slot holds the key's 64-bit hash, not the key: the hash is a
//! bijection, so the key is recovered by inverting it, and a slot's
//! validity is read off its own bits. A slot is *valid* in a segment when
//! its hash is not 0, its top LD bits equal the segment's prefix and, in a
//! normal bucket, its home bucket is this one or one of the three before.

pub(crate) const ROOT_MAGIC: u64 = u64::from_le_bytes(*b"PMHMEH01");
pub(crate) const ROOT_BYTES: u64 = 64;
pub(crate) const R_SEED: u64 = 8;
pub(crate) const R_HASH: u64 = 16;
pub(crate) const R_GEOMETRY: u64 = 24;
pub(crate) const R_RT_ROOT: u64 = 32;
pub(crate) const R_ZERO_PRESENT: u64 = 40;
pub(crate) const R_ZERO_VALUE: u64 = 48;
pub(crate) const R_COUNT: u64 = 56;

pub(crate) const LINE: u64 = 64;
pub(crate) const SLOTS: usize = 4;
pub(crate) const PROBE: u64 = 4;
pub(crate) const NODE_FANOUT: u64 = 8;
pub(crate) const NODE_BITS: u32 = 3;

/// PM header words, as byte offsets (`H_`) and word indices (`W_`). Words
/// 0 and 6 are reserved (docs/format.md, "Format versions") and written 0: the lock
/// and the flag live in the segment's DRAM head (`head.rs`), as do count,
/// spill and stash bits while the table is open (a clean close writes
/// those three here).
pub(crate) const H_IDENT: u64 = 8;
pub(crate) const H_BACKUP: u64 = 32;
pub(crate) const H_OVERFLOW: u64 = 40;
pub(crate) const W_IDENT: usize = 1;
pub(crate) const W_COUNT: usize = 2;
pub(crate) const W_STASH_BITS: usize = 3;
pub(crate) const W_BACKUP: usize = 4;
pub(crate) const W_OVERFLOW: usize = 5;
pub(crate) const W_SPILL: usize = 7;

const SEG_MAGIC: u64 = 0x4853; // "HS"
const OVF_MAGIC: u64 = 0x484f; // "HO"

/// Smallest and largest segment, in cache lines.
pub(crate) const MIN_LINES: u64 = 16;
pub(crate) const MAX_LINES: u64 = 512;
/// Local depth is at most 32: the prefix lives in the hash's high word.
pub(crate) const DEPTH_LIMIT: u32 = 32;

/// The segment geometry of a table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// Cache lines per segment (header included).
    pub(crate) lines: u64,
    /// Normal (addressable) buckets.
    pub(crate) buckets: u64,
    /// Stash buckets.
    pub(crate) stash: u64,
    /// Largest local depth; beyond it a full segment chains overflow blocks.
    pub(crate) max_depth: u32,
    /// Fill policy (`Options::stash_before_split`): a full window goes to
    /// the stash and a long displacement search before the segment splits.
    pub(crate) stash_first: bool,
}

impl Geometry {
    pub(crate) fn new(lines: u64, max_depth: u32) -> Option<Geometry> {
        if !lines.is_power_of_two() || !(MIN_LINES..=MAX_LINES).contains(&lines) {
            return None;
        }
        if !(1..=DEPTH_LIMIT).contains(&max_depth) {
            return None;
        }
        let stash = if lines >= 256 {
            16
        } else if lines >= 64 {
            4
        } else {
            2
        };
        Some(Geometry {
            lines,
            buckets: lines - 1 - stash,
            stash,
            max_depth,
            stash_first: false,
        })
    }

    /// The root's geometry word: lines | max depth << 16 | stash first << 24.
    pub(crate) fn encode(&self) -> u64 {
        self.lines | (self.max_depth as u64) << 16 | (self.stash_first as u64) << 24
    }

    pub(crate) fn decode(w: u64) -> Option<Geometry> {
        if w >> 25 != 0 {
            return None;
        }
        let g = Geometry::new(w & 0xffff, ((w >> 16) & 0xff) as u32)?;
        Some(Geometry {
            stash_first: w >> 24 & 1 == 1,
            ..g
        })
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.lines * LINE
    }

    /// Item slots per segment (normal and stash).
    pub(crate) fn slots(&self) -> u64 {
        (self.buckets + self.stash) * SLOTS as u64
    }

    /// Offset of normal bucket `b` in segment `seg`.
    #[inline]
    pub(crate) fn bucket(&self, seg: u64, b: u64) -> u64 {
        seg + (1 + b) * LINE
    }

    /// Offset of stash bucket `i` in segment `seg`.
    #[inline]
    pub(crate) fn stash_bucket(&self, seg: u64, i: u64) -> u64 {
        seg + (1 + self.buckets + i) * LINE
    }

    /// Home bucket of a hash (from its low word).
    #[inline]
    pub(crate) fn home(&self, h: u64) -> u64 {
        ((h & 0xffff_ffff) * self.buckets) >> 32
    }

    /// How many buckets past `home` bucket `b` is (0..buckets).
    #[inline]
    pub(crate) fn dist(&self, home: u64, b: u64) -> u64 {
        let d = b + self.buckets - home;
        if d >= self.buckets {
            d - self.buckets
        } else {
            d
        }
    }

    /// The spill bit of home bucket `home`.
    #[inline]
    pub(crate) fn spill_bit(home: u64) -> u64 {
        1 << (home & 63)
    }

    /// Whether a slot in normal bucket `b` is in the probe window of a hash
    /// whose home bucket is `home`.
    #[inline]
    pub(crate) fn in_window(&self, home: u64, b: u64) -> bool {
        // `(b - home) mod buckets < PROBE`, without a division: both are
        // below `buckets`, so one conditional subtraction reduces it (a
        // `%` here cost a divide per probed slot).
        let d = b + self.buckets - home;
        let d = if d >= self.buckets {
            d - self.buckets
        } else {
            d
        };
        d < PROBE
    }

    /// Bucket `home + j` of the ring of normal buckets (`j < buckets`).
    #[inline]
    pub(crate) fn ring(&self, home: u64, j: u64) -> u64 {
        let b = home + j;
        if b >= self.buckets {
            b - self.buckets
        } else {
            b
        }
    }
}

/// A segment's identity word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ident {
    pub(crate) ld: u32,
    /// Top-aligned prefix: only its top `ld` bits may be set.
    pub(crate) prefix: u32,
}

impl Ident {
    pub(crate) fn encode(&self) -> u64 {
        SEG_MAGIC << 48 | (self.ld as u64) << 32 | self.prefix as u64
    }

    pub(crate) fn decode(w: u64) -> Option<Ident> {
        let ld = ((w >> 32) & 0xffff) as u32;
        let prefix = w as u32;
        if w >> 48 != SEG_MAGIC || !(1..=DEPTH_LIMIT).contains(&ld) || prefix & !mask(ld) != 0 {
            return None;
        }
        Some(Ident { ld, prefix })
    }

    /// Whether `w` decodes to an identity that owns hash `h`, as a depth
    /// range check and one comparison: for depth `ld` the only such word is
    /// `h`'s top `ld` bits under that depth. Lookup's check, on every get; the same answer as
    /// `decode(w)` then `owns(h)` (tested).
    #[inline]
    pub(crate) fn word_owns(w: u64, h: u64) -> bool {
        let ld = ((w >> 32) & 0xffff) as u32;
        ld.wrapping_sub(1) < DEPTH_LIMIT
            && w == SEG_MAGIC << 48 | (ld as u64) << 32 | ((h >> 32) as u32 & mask(ld)) as u64
    }

    /// Whether this segment owns hash `h`.
    #[inline]
    pub(crate) fn owns(&self, h: u64) -> bool {
        ((h >> 32) as u32 ^ self.prefix) & mask(self.ld) == 0
    }

    /// The two halves of a split.
    pub(crate) fn children(&self) -> (Ident, Ident) {
        let ld = self.ld + 1;
        (
            Ident {
                ld,
                prefix: self.prefix,
            },
            Ident {
                ld,
                prefix: self.prefix | 1 << (32 - ld),
            },
        )
    }

    /// The prefix as an integer of `ld` bits (the directory index at GD = LD).
    pub(crate) fn index(&self) -> u64 {
        (self.prefix as u64) >> (32 - self.ld)
    }

    /// The hash high word a deleted slot gets: this prefix with its top bit
    /// flipped, so no segment of this subtree can take it for valid.
    pub(crate) fn invalid_hi(&self) -> u64 {
        (self.prefix ^ 0x8000_0000) as u64
    }
}

/// The overflow block magic word (header word 8).
pub(crate) fn overflow_ident() -> u64 {
    OVF_MAGIC << 48
}

/// Top `ld` bits set.
#[inline]
pub(crate) fn mask(ld: u32) -> u32 {
    if ld == 0 {
        0
    } else {
        u32::MAX << (32 - ld)
    }
}

/// The two words of a slot holding hash `h` and value `v`.
#[inline]
pub(crate) fn encode_slot(h: u64, v: u64) -> (u64, u64) {
    ((h >> 32) << 32 | v >> 32, h << 32 | (v & 0xffff_ffff))
}

/// Hash and value of a slot's two words (hash 0 = empty).
#[inline]
pub(crate) fn decode_slot(w0: u64, w1: u64) -> (u64, u64) {
    ((w0 >> 32) << 32 | w1 >> 32, w0 << 32 | (w1 & 0xffff_ffff))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_round_trip() {
        for (h, v) in [(1, 0), (u64::MAX, u64::MAX), (0x1234_5678_9abc_def0, 42)] {
            let (a, b) = encode_slot(h, v);
            assert_eq!(decode_slot(a, b), (h, v));
        }
    }

    #[test]
    fn idents_split_and_own() {
        let root = Ident { ld: 1, prefix: 0 };
        let (lo, hi) = root.children();
        assert_eq!(lo.prefix, 0);
        assert_eq!(hi.prefix, 0x4000_0000);
        assert!(hi.owns(0x4000_0000_0000_0000));
        assert!(!hi.owns(0x8000_0000_0000_0000));
        assert!(!lo.owns(0x4000_0000_0000_0000));
        assert_eq!(Ident::decode(hi.encode()), Some(hi));
        assert_eq!(Ident::decode(0), None);
        let ind = Ident {
            ld: 1,
            prefix: 0x8000_0000,
        };
        assert!(!ind.owns(ind.invalid_hi() << 32));
    }

    #[test]
    fn word_owns_answers_as_decode_then_owns() {
        // Words near valid identities (every depth, with a bit of the
        // magic, the depth or the prefix flipped) and pseudo-random words,
        // against hashes inside and outside each prefix.
        let mut rng = engine::testkit::Rng::new(0x9e37_79b9_7f4a_7c15);
        let mut next = || rng.next();
        let mut words = vec![0, u64::MAX, SEG_MAGIC << 48];
        for ld in 0..=40u32 {
            // A random prefix of the depth, and the two a depth past the
            // limit would most easily pass with (all zero, top bit only).
            for prefix in [(next() as u32) & mask(ld.min(32)), 0, 0x8000_0000] {
                let w = SEG_MAGIC << 48 | (ld as u64) << 32 | prefix as u64;
                words.push(w);
                for bit in [0, 1, 31, 32, 33, 47, 48, 63] {
                    words.push(w ^ 1 << bit);
                }
            }
        }
        words.extend((0..2000).map(|_| next()));
        let mut owned = 0;
        for &w in &words {
            let mut hashes: Vec<u64> = (0..8).map(|_| next()).collect();
            // Hashes with the word's own top bits, so owning ones occur.
            hashes.extend((0..8).map(|_| (w << 32) | (next() >> 32)));
            hashes.extend((0..8).map(|_| (w << 32) ^ (next() >> 20)));
            for h in hashes {
                let want = Ident::decode(w).is_some_and(|id| id.owns(h));
                assert_eq!(Ident::word_owns(w, h), want, "word {w:#x} hash {h:#x}");
                owned += want as u32;
            }
        }
        assert!(owned > 500, "only {owned} owning pairs were tried");
    }

    #[test]
    fn geometry_windows_wrap() {
        let g = Geometry::new(256, 24).unwrap();
        assert_eq!((g.buckets, g.stash), (239, 16));
        assert!(g.in_window(238, 2));
        assert!(!g.in_window(238, 3));
        assert!(g.in_window(3, 3));
        assert!(!g.in_window(3, 2));
        assert_eq!(Geometry::decode(g.encode()), Some(g));
        assert_eq!(Geometry::new(100, 24), None);
    }
}
