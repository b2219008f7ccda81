//! The on-disk format of a PASS table. Every offset is relative to the
//! block that holds it; every word is little-endian and 8-byte aligned.
//!
//! ```text
//! Root block (2 KiB, linked from the pool root)
//!   0    magic "PASS\0v02"
//!   8    geometry: n normal buckets (bits 0..16), m stash buckets (16..24),
//!        key mode (32..40: 0 inline u64, 1 bytes)
//!   16   hash seed
//!   24   split load (f64 bits): split `first` when len > this × slots
//!   32   k: the mapping table has 2^k cells per octave (grows with the
//!        table; a cache of a fixed function, see below)
//!   40   1 if the inline key whose hash is 0 is present; 48 its value
//!        (a key word of 0 marks a free slot, so that one key lives here)
//!   64   first: the leftmost active logical segment. THE COMMIT WORD of
//!        every expansion (one 8-byte store); alone with the count below
//!        in its line
//!   72   item count: written at clean close, trusted only after one
//!   128  octave table slots [6]: octave `o` of a table with 2^k cells lives
//!        in slot `3·(k mod 2) + o mod 3`
//!   192  directory [STRIDE × GROUPS]: entry `e` of group `g = e / STRIDE`
//!        is an array of 2^g contiguous segments (Dash-LH hybrid expansion)
//!
//! Octave table block (64 + 8·2^k bytes)
//!   0    magic "PASSoct1"   8 octave number o   16 k   24 entries (2^k)
//!   64   u64 cell[j], covering fine positions (o·2^k + j)·2^(40−k) ..:
//!        the logical bucket at the cell's start (bits 0..32) and the
//!        offset in the cell where the next bucket starts (32..64, 0 =
//!        none) — the paper's fused power + look-up table made exact
//!        (`table::exact_octave`); physical = `spiral::physical(logical)`
//!
//! Segment (64 + 64·⌈n/7⌉ + (n + m)·256 bytes, inside an array)
//!   0    lock: a LineLock serialising chain appends
//!   16   logical id: the logical bucket this physical segment serves
//!   64   one line per chain group g (homes 7g .. 7g+6):
//!          0  head: offset of the group's first overflow (chain) bucket,
//!             0 if none
//!          8  filter words [7], one per home: a 64-bit Bloom filter
//!             (two bits from hash bits 24..36) of the home's overflow
//!             records, stash and chain; read when the meta word's
//!             overflow filter hits, and on a hit here the search reads
//!             every stash bucket and the chain. A hint like the meta word's, kept
//!             exact-or-over while running, rebuilt after a crash
//!        (one chain per segment made every chain search walk all of a
//!        crowded segment's overflow, and Dash's overflow count made a
//!        miss read every stash bucket once a home had a record without a
//!        fingerprint hint; the chain's head shares the filter's line)
//!   64 + 64·⌈n/7⌉   n normal buckets, then m stash buckets, 256 bytes each
//!
//! Bucket (256 bytes: Dash-EH's layout with an 8-byte lock)
//!   0    lock: LineLock (epoch-tagged seqlock)
//!   8    meta: alloc bits 0..14, member bits 14..28 (the record's home is
//!        the previous bucket: balanced insert), then for normal buckets the
//!        overflow hints: valid 28..31, member 31..34, stash index 34..40
//!        (2 bits each), overflow filter 40..56 (bit (h >> 36) mod 16 set
//!        for every stash and chain record of this home), overflow
//!        fingerprint 2 in 56..64.
//!        Chain buckets: alloc bits 0..14, next chain bucket / 64 in 16..64
//!   16   fingerprints of slots 0..13 (1 byte each), overflow fingerprints
//!        0 and 1 (bytes 30, 31)
//!   32   14 slots of {key word, value}: key word = the key's hash (inline
//!        mode; fmix64 of key ^ seed, a bijection) or the offset of its key
//!        block (bytes mode). A slot is a record iff its key word is not 0:
//!        THE COMMIT of an insert or delete is that one 8-byte store. The
//!        meta word and fingerprints are hints kept exact while running,
//!        written back by a clean close (not by each write), and rebuilt
//!        from the slots after a crash
//!
//! Key block (bytes mode; 8 + len rounded up to 8)
//!   0    length in bytes   8  the key, zero-padded to a whole word
//! ```

/// Cache-line size in bytes.
pub const LINE: u64 = 64;
/// Bucket size in bytes.
pub const BUCKET: u64 = 256;
/// Slots per bucket.
pub const SLOTS: usize = 14;
/// Offset of slot 0 in a bucket.
pub const SLOT0: u64 = 32;
/// Bytes per slot (key word, value).
pub const SLOT_BYTES: u64 = 16;

/// Root block size in bytes.
pub const ROOT_BYTES: u64 = 2048;
/// Root block magic (offset 0).
pub const ROOT_MAGIC: u64 = u64::from_le_bytes(*b"PASS\0v02");
/// Root: geometry word.
pub const R_GEO: u64 = 8;
/// Root: hash seed.
pub const R_SEED: u64 = 16;
/// Root: split load (`f64` bits).
pub const R_SPLIT_LOAD: u64 = 24;
/// Root: `k`, the mapping table's cells per octave as a power of two.
pub const R_K: u64 = 32;
/// Root: 1 if the inline key whose hash is 0 is present.
pub const R_ZERO: u64 = 40;
/// Root: that key's value.
pub const R_ZERO_VALUE: u64 = 48;
/// Root: `first`, the leftmost active logical segment (the commit word of every expansion).
pub const R_FIRST: u64 = 64;
/// Root: item count (written at clean close).
pub const R_LEN: u64 = 72;
/// Root: the octave table slots.
pub const R_TABLES: u64 = 128;
/// Root: the directory.
pub const R_DIR: u64 = 192;
/// Directory entries per group (Dash-LH's `fixedExpandNum`).
pub const STRIDE: u64 = 8;
/// Groups: 8·(2^28 − 1) segments, far beyond any pool.
pub const GROUPS: u64 = 28;
/// Directory entries in all.
pub const DIR_ENTRIES: usize = (STRIDE * GROUPS) as usize;

/// Octave table block magic (offset 0).
pub const OCT_MAGIC: u64 = u64::from_le_bytes(*b"PASSoct1");
/// Octave table block header bytes (the cells follow).
pub const OCT_HEADER: u64 = 64;

/// Segment: the lock word serialising chain appends.
pub const H_LOCK: u64 = 0;
/// Segment: the logical bucket this physical segment serves.
pub const H_LOGICAL: u64 = 16;
/// The first chain group's line.
pub const H_CHAINS: u64 = 64;
/// Homes per chain group: a group's line holds its head and one filter
/// word per home.
pub const GROUP_HOMES: u64 = 7;

/// The chain group of home bucket `bix`.
#[inline]
pub fn chain_group(bix: u64) -> u64 {
    bix / GROUP_HOMES
}

/// The chain head word of group `g` in segment `seg`.
#[inline]
pub fn chain_head(seg: u64, g: u64) -> u64 {
    seg + H_CHAINS + LINE * g
}

/// The filter word of home `bix` in segment `seg` (its counted stash
/// records and its chain records).
#[inline]
pub fn chain_filter(seg: u64, bix: u64) -> u64 {
    chain_head(seg, chain_group(bix)) + 8 * (1 + bix % GROUP_HOMES)
}

/// The filter-word bits of hash `h`: two of 64, from hash bits 24..36
/// (fingerprint and bucket index use bits 0..24).
#[inline]
pub fn filter_bits(h: u64) -> u64 {
    1 << ((h >> 24) & 63) | 1 << ((h >> 30) & 63)
}

/// Bucket: the meta word.
pub const B_META: u64 = 8;
/// Bucket: the fingerprints.
pub const B_FP: u64 = 16;

/// Meta word: the alloc bits (one per slot).
pub const ALLOC_MASK: u64 = (1 << SLOTS) - 1;
/// Meta word: first member bit (the record's home is the previous bucket).
pub const MEMBER_SHIFT: u32 = 14;
/// Meta word: first overflow-hint valid bit.
pub const OFP_VALID_SHIFT: u32 = 28;
/// Meta word: first overflow-hint member bit.
pub const OFP_MEMBER_SHIFT: u32 = 31;
/// Meta word: first overflow-hint stash index (2 bits each).
pub const OFP_IDX_SHIFT: u32 = 34;
/// Overflow filter, meta bits 40..56: bit `(h >> 36) mod 16` is set for
/// every stash and chain record of this home (a 16-bit Bloom filter, one
/// hash; it takes the place of Dash's overflow count and our earlier
/// one-byte chain flag). A lookup with its bit set reads the home's
/// filter word; one with it clear is done once the hinted stash buckets
/// are searched.
pub const OFILTER_SHIFT: u32 = 40;
/// Meta word: the overflow filter's bits.
pub const OFILTER_MASK: u64 = 0xffff << OFILTER_SHIFT;

/// The overflow-filter bit of hash `h` (hash bits 36..40).
#[inline]
pub fn overflow_bit(h: u64) -> u64 {
    1 << (OFILTER_SHIFT + ((h >> 36) & 15) as u32)
}
/// Meta word: overflow fingerprint 2 (bits 56..64).
pub const OFP2_SHIFT: u32 = 56;
/// Overflow fingerprint hints per normal bucket (Dash has 4; our lock word
/// is 8 bytes, so one fingerprint byte moved into the meta word and one
/// was dropped).
pub const OFPS: usize = 3;
/// Chain bucket meta word: the next chain bucket / 64 starts at this bit.
pub const CHAIN_NEXT_SHIFT: u32 = 16;

/// Geometry key mode: 8-byte keys stored inline as their hash.
pub const KEY_MODE_INLINE: u64 = 0;
/// Geometry key mode: keys stored out of line in key blocks.
pub const KEY_MODE_BYTES: u64 = 1;

/// The shape of a table, fixed at create.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geo {
    /// Normal buckets per segment.
    pub n: u64,
    /// Stash buckets per segment (1..=4: a hint names one in 2 bits).
    pub m: u64,
    /// Keys are stored out of line (bytes mode).
    pub bytes_keys: bool,
    /// Header bytes, [`Geo::header`] (kept: it is on every bucket's
    /// address path, and `n` is not a constant).
    hdr: u64,
}

impl Geo {
    /// The geometry of `n` normal and `m` stash buckets per segment.
    pub fn new(n: u64, m: u64, bytes_keys: bool) -> Geo {
        let g = Geo {
            n,
            m,
            bytes_keys,
            hdr: 0,
        };
        Geo {
            hdr: H_CHAINS + LINE * g.groups(),
            ..g
        }
    }

    /// The root's geometry word.
    pub fn encode(&self) -> u64 {
        self.n | self.m << 16 | (self.bytes_keys as u64) << 32
    }

    /// Reads a geometry word; `None` if it is not a valid geometry.
    pub fn decode(w: u64) -> Option<Geo> {
        let bytes_keys = match w >> 24 {
            k if k & 0xff != 0 => return None,
            k => match k >> 8 {
                KEY_MODE_INLINE => false,
                KEY_MODE_BYTES => true,
                _ => return None,
            },
        };
        let g = Geo::new(w & 0xffff, (w >> 16) & 0xff, bytes_keys);
        g.valid().then_some(g)
    }

    /// Whether `n` and `m` are in range.
    pub fn valid(&self) -> bool {
        (4..=1024).contains(&self.n) && (1..=4).contains(&self.m)
    }

    /// The probe bucket of home `bix`: the next one, wrapping (no
    /// division on the lookup path).
    #[inline]
    pub fn probe(&self, bix: u64) -> u64 {
        if bix + 1 == self.n {
            0
        } else {
            bix + 1
        }
    }

    /// Chain groups per segment.
    #[inline]
    pub fn groups(&self) -> u64 {
        self.n.div_ceil(GROUP_HOMES)
    }

    /// Bytes of a segment's header: the lock line and the group lines.
    #[inline]
    pub fn header(&self) -> u64 {
        self.hdr
    }

    /// Bytes of one segment.
    pub fn seg_bytes(&self) -> u64 {
        self.header() + (self.n + self.m) * BUCKET
    }

    /// Slots of one segment (normal and stash).
    pub fn seg_slots(&self) -> u64 {
        (self.n + self.m) * SLOTS as u64
    }

    /// Offset of bucket `b` of the segment at `seg`.
    #[inline]
    pub fn bucket(&self, seg: u64, b: u64) -> u64 {
        seg + self.header() + b * BUCKET
    }
}

/// Most cells per octave (2^24): 128 MiB per octave table.
pub const MAX_K: u32 = 24;

/// Bytes of one octave table block at `2^k` cells.
pub fn octave_bytes(k: u32) -> u64 {
    OCT_HEADER + 8 * (1u64 << k)
}

/// The most segments a table of `2^k` cells per octave resolves: every
/// bucket of the window must be at least one cell wide (`2^k ≥ 2.9·first`).
pub fn max_first(k: u32) -> u64 {
    (1u64 << k) / 3
}

/// Directory position of physical segment `p`: (entry, index in its array).
#[inline]
pub fn dir_pos(p: u64) -> (usize, u64) {
    let g = 63 - (p / STRIDE + 1).leading_zeros() as u64;
    let r = p - STRIDE * ((1 << g) - 1);
    ((STRIDE * g + (r >> g)) as usize, r & ((1 << g) - 1))
}

/// Segments in the array of directory entry `e`.
#[inline]
pub fn entry_segments(e: usize) -> u64 {
    1 << (e as u64 / STRIDE)
}

/// First physical segment of directory entry `e`.
pub fn entry_first(e: usize) -> u64 {
    let g = e as u64 / STRIDE;
    STRIDE * ((1 << g) - 1) + (e as u64 % STRIDE) * (1 << g)
}

/// Offset of slot `s` of `bucket`.
#[inline]
pub fn slot_off(bucket: u64, s: usize) -> u64 {
    bucket + SLOT0 + s as u64 * SLOT_BYTES
}

/// Offset of the cache line holding slot `s` of `bucket`.
#[inline]
pub fn slot_line(bucket: u64, s: usize) -> u64 {
    slot_off(bucket, s) & !(LINE - 1)
}

/// The set bits of `m`, lowest first (slots of an allocation mask).
#[inline]
pub fn ones(mut m: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (m != 0).then(|| {
            let s = m.trailing_zeros() as usize;
            m &= m - 1;
            s
        })
    })
}

/// The lowest free slot of a bucket whose meta word is `meta`.
#[inline]
pub fn first_free(meta: u64) -> Option<usize> {
    let free = !meta & ALLOC_MASK;
    (free != 0).then(|| free.trailing_zeros() as usize)
}

/// The alloc bits of a meta word.
#[inline]
pub fn alloc(meta: u64) -> u64 {
    meta & ALLOC_MASK
}

/// The member bits of a meta word.
#[inline]
pub fn member(meta: u64) -> u64 {
    (meta >> MEMBER_SHIFT) & ALLOC_MASK
}

/// The next chain bucket's offset in a chain bucket's meta word (0: none).
#[inline]
pub fn chain_next(meta: u64) -> u64 {
    (meta >> CHAIN_NEXT_SHIFT) << 6
}

/// Overflow hint `j` of a normal bucket: (valid, member, stash index, fp).
#[inline]
pub fn ofp(meta: u64, fps_hi: u64, j: usize) -> (bool, bool, u64, u8) {
    let valid = meta >> (OFP_VALID_SHIFT + j as u32) & 1 == 1;
    let mem = meta >> (OFP_MEMBER_SHIFT + j as u32) & 1 == 1;
    let idx = (meta >> (OFP_IDX_SHIFT + 2 * j as u32)) & 3;
    let fp = match j {
        0 => (fps_hi >> 48) as u8,
        1 => (fps_hi >> 56) as u8,
        _ => (meta >> OFP2_SHIFT) as u8,
    };
    (valid, mem, idx, fp)
}

/// Bits of `x`'s 16 fingerprint bytes (two words) equal to `fp`, one bit
/// per byte (slots 0..14 only).
#[inline]
pub fn fp_matches(lo: u64, hi: u64, fp: u8) -> u64 {
    engine::eq_mask16(lo, hi, fp) as u64 & ALLOC_MASK
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dir_positions_are_dense_and_match_entry_first() {
        let mut expect = (0usize, 0u64);
        for p in 0..20_000u64 {
            let (e, o) = dir_pos(p);
            if p > 0 {
                if expect.1 + 1 == entry_segments(expect.0) {
                    expect = (expect.0 + 1, 0);
                } else {
                    expect.1 += 1;
                }
            }
            assert_eq!((e, o), expect, "p {p}");
            assert_eq!(entry_first(e) + o, p);
        }
        // The paper's example shape: stride entries of one segment, then of two.
        assert_eq!(dir_pos(7), (7, 0));
        assert_eq!(dir_pos(8), (8, 0));
        assert_eq!(dir_pos(9), (8, 1));
        assert_eq!(dir_pos(24), (16, 0));
    }

    #[test]
    fn fingerprint_matching_is_exact() {
        let mut rng = 0x1234_5678_9abc_def0u64;
        for _ in 0..20_000 {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let lo = rng;
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let hi = rng;
            let fp = (rng >> 17) as u8;
            let bytes: Vec<u8> = lo
                .to_le_bytes()
                .into_iter()
                .chain(hi.to_le_bytes())
                .collect();
            let want = (0..SLOTS)
                .filter(|&s| bytes[s] == fp)
                .fold(0u64, |a, s| a | 1 << s);
            assert_eq!(fp_matches(lo, hi, fp), want);
        }
        let mut b = [7u8; 16];
        b[3] = 0;
        b[13] = 0;
        let lo = u64::from_le_bytes(b[..8].try_into().unwrap());
        let hi = u64::from_le_bytes(b[8..].try_into().unwrap());
        assert_eq!(fp_matches(lo, hi, 0), 1 << 3 | 1 << 13);
        assert_eq!(fp_matches(lo, hi, 7), ALLOC_MASK & !(1 << 3 | 1 << 13));
    }

    #[test]
    fn geometry_round_trips() {
        let g = Geo::new(56, 4, true);
        assert_eq!(Geo::decode(g.encode()), Some(g));
        assert_eq!(Geo::decode(g.encode() | 7 << 32), None);
        assert_eq!(g.seg_bytes(), 64 + 8 * 64 + 60 * 256);
    }
}
