//! The store's on-PM format. Everything lives in one pool (`store.pool`);
//! offsets are pool offsets. All words are little-endian `u64`.
//!
//! # Root block (linked as the pool's *aux* root; the pool root belongs to
//! the persistent hash engine of index options (b) and (c))
//!
//! ```text
//! 0    magic       "PMHSTOR1"
//! 8    format      3 (2: no durable mark in entries; 1: entries 8-aligned;
//!                  neither is readable by this version)
//! 16   nodes       NUMA nodes the log is split over (1..=64)
//! 24   clusters    hash clusters per node (1..=65536)
//! 32   extent      bytes per Nlog file, header line included (multiple of 64, >= 4096)
//! 40   table_len   extent table slots
//! 48   index       0: DRAM point index + ordered tree (a); 1: persistent hash
//!                  engine (b); 2: both (c)
//! 56   check       crc32 of bytes 0..56 and 96..112 (low 32 bits)
//! 64   next_seq    every extent sequence number below it may have been used;
//!                  bumped and persisted before a new extent takes a number (F7)
//! 72   image       offset of the clean-shutdown image block, 0 if none
//! 80   image_len   bytes of the image
//! 88   vbase       versions below it may have been used (options b and c,
//!                  which do not scan the log): each open starts its
//!                  counters here and persists vbase + 2^40 first (F8)
//! 96   engine      layout id of the hash engine (16 bytes, zero padded)
//! 128  table[table_len]  offset of each Nlog file (extent), 0 = empty slot
//! ```
//!
//! # Nlog file (an allocator block of `extent` bytes)
//!
//! ```text
//! 0    magic       "PMHNLOG1"
//! 8    node (low 32) | cluster (high 32)
//! 16   seq         never reused (root.next_seq)
//! 24   slot        its index in the extent table
//! 32   check       crc32 of bytes 0..32
//! 64.. entries, back to back, each 64-aligned; the rest is zero
//! ```
//!
//! # Entry
//!
//! ```text
//! 0    op:2 (bits 62..64) | version:62   op: 3 ins, 2 upd, 1 del, 0 inv
//! 8    klen (bits 0..16) | vlen (bits 16..48)
//! 16   h_addr      v_addr of the key's previous entry, NONE if none
//! 24   h_seq       sequence number of the file holding h_addr
//! 32   crc32c (bits 0..32) | durable (bits 32..64)
//!      crc32c of: file seq, entry offset, version, words 8..32, durable, key, value
//!      (CRC-32C, one instruction per word: `crc.rs`)
//!      durable: the file's durable prefix when the entry was written, in
//!      64-byte units from the file's start: every byte of the file before
//!      it was persisted (fenced) before this entry's first store
//! 40   key bytes, value bytes, zero padding to 64
//! ```
//!
//! The crc leaves out the op bits so that GC can mark an entry invalid in
//! place (one 8-byte store) and the entry still parses. A `v_addr` is
//! `node << 56 | entry offset`.
//!
//! **Torn or corrupt.** A crash can only tear entries that were not yet
//! durable. The durable mark says which those could be: an entry that
//! does not check at file position `b` is corruption as soon as a valid
//! entry after it has `durable > b` (its writer knew `b` durable), or when
//! its file is sealed (a file is synced before the next one of its pair is
//! made, so a sealed file holds no entry in flight). Otherwise it is the
//! torn tail: under `Strict` only the newest entry of a file can be in
//! flight (the append lock is held through the fence), under `Relaxed`
//! every entry since the file's last sync.

/// Pool layout id of a store.
pub const LAYOUT: &str = "store";
/// File name of the store's pool inside its directory.
pub const POOL_FILE: &str = "store.pool";

pub(crate) const ROOT_MAGIC: u64 = u64::from_le_bytes(*b"PMHSTOR1");
/// The root block's format number this version writes and reads.
pub const FORMAT: u64 = 3;
pub(crate) const R_CHECK: u64 = 56;
pub(crate) const R_NEXT_SEQ: u64 = 64;
pub(crate) const R_IMAGE: u64 = 72;
pub(crate) const R_IMAGE_LEN: u64 = 80;
pub(crate) const R_VBASE: u64 = 88;
pub(crate) const R_ENGINE: u64 = 96;
/// Versions each open of a store without log scan reserves.
pub(crate) const VBASE_STEP: u64 = 1 << 40;
pub(crate) const R_TABLE: u64 = 128;

pub(crate) const EXT_MAGIC: u64 = u64::from_le_bytes(*b"PMHNLOG1");
pub(crate) const X_CHECK: u64 = 32;
/// Entries start after the file's header line.
pub const X_DATA: u64 = 64;

pub(crate) const MAX_NODES: u64 = 64;
pub(crate) const MAX_CLUSTERS: u64 = 1 << 16;
/// Smallest Nlog file (extent) size in bytes, header line included.
pub const MIN_EXTENT: u64 = 4096;

/// Header bytes of an entry.
pub(crate) const ENTRY_HEADER: u64 = 40;
/// Entries start and end on cache-line boundaries (format 2): an entry of
/// up to 64 bytes (an 8-byte key with an 8-byte value is 56) is one line,
/// written back with one flush and never shared with the next entry.
/// With 8-byte alignment (format 1) seven of eight such entries spanned
/// two lines.
pub(crate) const ENTRY_ALIGN: u64 = 64;
/// Longest key in bytes.
pub const MAX_KEY: usize = 4096;
/// Longest value in bytes.
pub const MAX_VALUE: usize = 1 << 20;

pub(crate) const OP_INV: u64 = 0;
pub(crate) const OP_DEL: u64 = 1;
pub(crate) const OP_UPD: u64 = 2;
pub(crate) const OP_INS: u64 = 3;
pub(crate) const OP_SHIFT: u32 = 62;
pub(crate) const VERSION_MASK: u64 = (1 << OP_SHIFT) - 1;

/// "No previous entry".
pub(crate) const NONE: u64 = u64::MAX;
const OFF_MASK: u64 = (1 << 56) - 1;

#[inline]
pub(crate) fn vaddr(node: u32, off: u64) -> u64 {
    ((node as u64) << 56) | off
}

#[inline]
pub(crate) fn vaddr_off(v: u64) -> u64 {
    v & OFF_MASK
}

#[inline]
pub(crate) fn vaddr_node(v: u64) -> u32 {
    (v >> 56) as u32
}

/// Bytes an entry with these lengths occupies.
#[inline]
pub fn entry_len(klen: usize, vlen: usize) -> u64 {
    (ENTRY_HEADER + klen as u64 + vlen as u64).next_multiple_of(ENTRY_ALIGN)
}

/// An entry's lengths word (entry bytes 8..16): `klen | vlen << 16`.
#[inline]
pub fn lens_word(klen: usize, vlen: usize) -> u64 {
    klen as u64 | ((vlen as u64) << 16)
}

/// `(klen, vlen)` of a lengths word, `None` if out of range.
#[inline]
pub(crate) fn parse_lens(w: u64) -> Option<(usize, usize)> {
    let klen = (w & 0xffff) as usize;
    let vlen = ((w >> 16) & 0xffff_ffff) as usize;
    (w >> 48 == 0 && klen <= MAX_KEY && vlen <= MAX_VALUE).then_some((klen, vlen))
}

/// The words an entry's checksum covers besides its key and value, in
/// the order it covers them (see the module doc).
#[derive(Clone, Copy)]
pub(crate) struct CrcWords {
    /// Sequence number of the entry's file.
    pub seq: u64,
    /// Pool offset of the entry.
    pub off: u64,
    pub version: u64,
    /// The lengths word ([`lens_word`]).
    pub lens: u64,
    pub h_addr: u64,
    pub h_seq: u64,
    /// The durable mark, in 64-byte units.
    pub durable: u64,
}

/// The entry checksum of `w`, `key` and `value`.
#[inline]
pub(crate) fn entry_crc(w: &CrcWords, key: &[u8], value: &[u8]) -> u32 {
    crate::crc::crc32c_of(
        &[
            w.seq, w.off, w.version, w.lens, w.h_addr, w.h_seq, w.durable,
        ],
        &[key, value],
    )
}

/// The checksum word of an entry: its crc and its durable mark (64-byte
/// units of the file's durable prefix).
#[inline]
pub(crate) fn check_word(crc: u32, durable: u64) -> u64 {
    crc as u64 | (durable << 32)
}

/// Largest file the durable mark can describe (32 bits of 64-byte units).
pub(crate) const MAX_EXTENT: u64 = 1 << 38;

/// The root's checked words: bytes 0..56 and the engine name.
pub(crate) fn root_check_words(pool: &pmem::Pool, root: u64) -> Vec<u64> {
    let mut w: Vec<u64> = (0..7).map(|i| pool.load_u64(root + 8 * i)).collect();
    w.push(pool.load_u64(root + R_ENGINE));
    w.push(pool.load_u64(root + R_ENGINE + 8));
    w
}

/// The 16-byte engine name as two words.
pub(crate) fn name_words(name: &str) -> [u64; 2] {
    let mut b = [0u8; 16];
    let n = name.len().min(16);
    b[..n].copy_from_slice(&name.as_bytes()[..n]);
    [
        u64::from_le_bytes(b[..8].try_into().expect("8")),
        u64::from_le_bytes(b[8..].try_into().expect("8")),
    ]
}

/// crc32 of a run of words (root and file headers).
pub(crate) fn words_crc(words: &[u64]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    for w in words {
        h.update(&w.to_le_bytes());
    }
    h.finalize()
}

/// Bytes of the root block for a table of `table_len` slots.
pub(crate) fn root_len(table_len: u64) -> u64 {
    R_TABLE + 8 * table_len
}

/// The hash that picks a key's cluster and lock stripe (not persisted:
/// recovery re-derives clusters from keys, and the cluster count is fixed
/// at create).
#[inline]
pub fn key_hash(key: &[u8]) -> u64 {
    use engine::hash::fmix64;
    if let Ok(k) = <[u8; 8]>::try_from(key) {
        // The loop below for one 8-byte chunk, with the length's mix
        // folded: a bijection of the key, which the point index relies on.
        const H8: u64 = fmix64(8 ^ 0x9e37_79b9_7f4a_7c15);
        return fmix64(H8 ^ u64::from_le_bytes(k));
    }
    let mut h = fmix64(key.len() as u64 ^ 0x9e37_79b9_7f4a_7c15);
    let mut chunks = key.chunks_exact(8);
    for c in &mut chunks {
        h = fmix64(h ^ u64::from_le_bytes(c.try_into().expect("8 bytes")));
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut b = [0u8; 8];
        b[..rest.len()].copy_from_slice(rest);
        h = fmix64(h ^ u64::from_le_bytes(b) ^ 0x5bd1_e995);
    }
    h
}

/// The cluster of a key hash among `clusters`.
#[inline]
pub(crate) fn cluster_of(hash: u64, clusters: u32) -> u32 {
    (((hash as u128) * (clusters as u128)) >> 64) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lens_round_trip_and_limits() {
        assert_eq!(parse_lens(lens_word(4096, 1 << 20)), Some((4096, 1 << 20)));
        assert_eq!(parse_lens(lens_word(0, 0)), Some((0, 0)));
        assert_eq!(parse_lens(lens_word(4097, 0)), None);
        assert_eq!(parse_lens(lens_word(1, (1 << 20) + 1)), None);
        assert_eq!(parse_lens(1 << 50), None);
    }

    #[test]
    fn vaddr_parts() {
        let v = vaddr(3, 0x1234_5678);
        assert_eq!((vaddr_node(v), vaddr_off(v)), (3, 0x1234_5678));
        // Whole lines: an 8-byte key and value (56 bytes) is one.
        assert_eq!(entry_len(8, 8), 64);
        assert_eq!(entry_len(1, 0), 64);
        assert_eq!(entry_len(8, 17), 128);
        assert_eq!(entry_len(16, 200), 256);
    }

    #[test]
    fn clusters_cover_the_range() {
        let mut seen = [false; 7];
        for k in 0u64..1000 {
            let c = cluster_of(key_hash(&k.to_be_bytes()), 7) as usize;
            seen[c] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn crc_covers_position_and_payload() {
        let w = CrcWords {
            seq: 1,
            off: 64,
            version: 5,
            lens: lens_word(1, 1),
            h_addr: NONE,
            h_seq: 0,
            durable: 1,
        };
        let a = entry_crc(&w, b"k", b"v");
        assert_ne!(a, entry_crc(&CrcWords { seq: 2, ..w }, b"k", b"v"));
        assert_ne!(a, entry_crc(&CrcWords { off: 72, ..w }, b"k", b"v"));
        assert_ne!(a, entry_crc(&w, b"k", b"w"));
        assert_ne!(a, entry_crc(&CrcWords { durable: 2, ..w }, b"k", b"v"));
    }
}
