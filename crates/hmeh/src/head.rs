//! The DRAM copy of every segment's header line ("heads").
//!
//! A segment's header line in PM holds its identity, its chain pointers and
//! words with DRAM meaning only (lock, count, spill and stash bits, retired
//! flag). Reading them from PM cost every operation a second miss, on a
//! second 4 KiB page, beside the bucket's: 2^14 header lines at 10M keys are
//! 2^14 pages, more than the TLB holds. Here they live in dense DRAM
//! arrays, 128 bytes a segment (2 MiB at 10M keys), which stay cached.
//!
//! A head holds the header's words (`HD_*` below) and the segment's spill
//! bits at a finer grain than the PM header's one word (`Spill`). The PM
//! header stays the durable truth for the identity and the chain pointers:
//! whoever writes one of those writes both, the PM word first. The
//! DRAM-meaning words live only here while the table is open; a clean
//! close writes count, spill and stash bits back to the PM header (a clean
//! open reads them there), and an open fills the heads from PM.
//!
//! A head is found from its segment's pool offset: `offset >> shift`, with
//! `2^shift` at most the segment size. Two live blocks of at least
//! `2^shift` bytes cannot start in the same `2^shift`-aligned window, so
//! the index names one block; a freed and reused block gets the same head,
//! just as it gets the same PM header line (readers tell the two apart by
//! identity and the table's free counter, as they do for the PM header).
//!
//! One concept, these DRAM arrays alone: the table's code that fills and
//! writes them back is in `lib.rs` (`load_head`, `store_head`).

use std::sync::atomic::AtomicU64;
use std::sync::OnceLock;

/// Heads in one lazily allocated chunk (512 KiB).
const CHUNK: usize = 4096;

/// Head words. The first line holds what a lookup reads (lock, identity,
/// spill and stash bits, overflow pointer); the second what only writers
/// read.
pub(crate) const HD_LOCK: usize = 0;
pub(crate) const HD_IDENT: usize = 1;
/// Four words of spill bits, one bit per home bucket (`home & 255`).
pub(crate) const HD_SPILL: usize = 2;
pub(crate) const HD_STASH: usize = 6;
pub(crate) const HD_OVERFLOW: usize = 7;
pub(crate) const HD_COUNT: usize = 8;
pub(crate) const HD_BACKUP: usize = 9;
pub(crate) const HD_RETIRED: usize = 10;
/// Four words of spill plane B (see [`Spill`]).
pub(crate) const HD_SPILL_FAR: usize = 11;
/// The identity (`Ident::encode`, never 0) under which a merge with the
/// buddy was refused for where the two sit in the RT-directory
/// (`Hmeh::merge`): that does not change while both keep their
/// identities, so later deletes do not try again. A split gives the
/// segment a new identity, which voids the word.
pub(crate) const HD_NO_MERGE: usize = 15;
pub(crate) const HEAD_WORDS: usize = 16;

/// One segment's head: two cache lines of its own (no two segments'
/// locks share a line).
#[repr(align(64))]
#[derive(Default)]
pub(crate) struct Head(pub(crate) [AtomicU64; HEAD_WORDS]);

/// A segment's spill bits, two planes of one bit per home bucket
/// (`home & 255`): plane A, an item whose home is `home` may sit 1 to 3
/// buckets past it; plane B, 2 or 3 buckets past it. A lookup reads the
/// home bucket alone without A, two buckets with A alone, the whole window
/// with B (`reach`). Exact for segments of up to 256 buckets (the default
/// has 239); two homes share a bit in larger ones. Plane A sits in the
/// head's first line (every lookup reads it), plane B in the second (read
/// only where A is set). The PM header keeps plane A's 64-bit fold (bit
/// `home & 63`), written at a clean close; an open expands it into both
/// planes, so a reopened segment reads as coarsely as the file says until
/// its next split or merge.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(crate) struct Spill(pub(crate) [u64; 8]);

impl Spill {
    #[inline]
    pub(crate) fn word_mask(home: u64) -> (usize, u64) {
        (((home >> 6) & 3) as usize, 1 << (home & 63))
    }

    /// Records an item of home `home` sitting `d` (1..=3) buckets past it.
    #[inline]
    pub(crate) fn set(&mut self, home: u64, d: u64) {
        let (w, m) = Self::word_mask(home);
        self.0[w] |= m;
        if d >= 2 {
            self.0[4 + w] |= m;
        }
    }

    /// Buckets a lookup of home `home` reads: 1, 2 or the window (4).
    #[inline]
    pub(crate) fn reach(&self, home: u64) -> u64 {
        let (w, m) = Self::word_mask(home);
        Self::reach_of(m, self.0[w], || self.0[4 + w])
    }

    /// Reach from a home's mask and its plane words (plane B read only
    /// where plane A is set).
    #[inline]
    fn reach_of(m: u64, a: u64, b: impl FnOnce() -> u64) -> u64 {
        if a & m == 0 {
            1
        } else if b() & m == 0 {
            2
        } else {
            4
        }
    }

    /// The PM header's 64-bit form.
    pub(crate) fn fold(&self) -> u64 {
        self.0[..4].iter().fold(0, |a, w| a | w)
    }

    /// From the PM header's 64-bit form (conservative: the whole window).
    pub(crate) fn expand(coarse: u64) -> Spill {
        Spill([coarse; 8])
    }

    pub(crate) fn load(hw: &[AtomicU64; HEAD_WORDS]) -> Spill {
        Spill(std::array::from_fn(|i| {
            hw[Self::head_word(i)].load(std::sync::atomic::Ordering::Relaxed)
        }))
    }

    pub(crate) fn store(&self, hw: &[AtomicU64; HEAD_WORDS]) {
        for (i, w) in self.0.iter().enumerate() {
            hw[Self::head_word(i)].store(*w, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The head word of plane word `i` (0..4 plane A, 4..8 plane B).
    #[inline]
    pub(crate) fn head_word(i: usize) -> usize {
        if i < 4 {
            HD_SPILL + i
        } else {
            HD_SPILL_FAR + i - 4
        }
    }

    /// Reach of home `home` read from a live head (lookup's fast path).
    #[inline]
    pub(crate) fn head_reach(hw: &[AtomicU64; HEAD_WORDS], home: u64) -> u64 {
        use std::sync::atomic::Ordering::Relaxed;
        let (w, m) = Self::word_mask(home);
        Self::reach_of(m, hw[HD_SPILL + w].load(Relaxed), || {
            hw[HD_SPILL_FAR + w].load(Relaxed)
        })
    }

    /// Sets home `home`'s bits for distance `d` in a live head (the writer
    /// holds the lock).
    #[inline]
    pub(crate) fn head_set(hw: &[AtomicU64; HEAD_WORDS], home: u64, d: u64) {
        use std::sync::atomic::Ordering::{Relaxed, Release};
        let (w, m) = Self::word_mask(home);
        if d >= 2 {
            let b = &hw[HD_SPILL_FAR + w];
            b.store(b.load(Relaxed) | m, Release);
        }
        let a = &hw[HD_SPILL + w];
        a.store(a.load(Relaxed) | m, Release);
    }
}

pub(crate) struct Heads {
    shift: u32,
    chunks: Box<[OnceLock<Box<[Head; CHUNK]>>]>,
}

impl Heads {
    /// Heads for segments of `seg_bytes` in a pool that may grow to
    /// `max_bytes`.
    pub(crate) fn new(seg_bytes: u64, max_bytes: u64) -> Heads {
        let shift = 63 - seg_bytes.leading_zeros();
        let n = (max_bytes >> shift) as usize / CHUNK + 1;
        Heads {
            shift,
            chunks: (0..n).map(|_| OnceLock::new()).collect(),
        }
    }

    /// The head of the segment at pool offset `seg`.
    #[inline]
    pub(crate) fn get(&self, seg: u64) -> &[AtomicU64; HEAD_WORDS] {
        let i = (seg >> self.shift) as usize;
        // A chunk of fixed length: `i % CHUNK` needs no bounds check.
        let chunk = self.chunks[i / CHUNK].get_or_init(|| {
            let heads: Box<[Head]> = (0..CHUNK).map(|_| Head::default()).collect();
            heads
                .try_into()
                .unwrap_or_else(|_| unreachable!("CHUNK heads"))
        });
        &chunk[i % CHUNK].0
    }

    /// DRAM bytes allocated.
    pub(crate) fn bytes(&self) -> u64 {
        let n = self.chunks.iter().filter(|c| c.get().is_some()).count();
        (n * CHUNK * std::mem::size_of::<Head>() + self.chunks.len() * 8) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn blocks_of_segment_size_get_distinct_heads() {
        // 12 KiB segments: shift 13; blocks 12 KiB apart never share.
        let h = Heads::new(12 << 10, 64 << 20);
        let offs: Vec<u64> = (0..5000).map(|i| 4096 + i * (12 << 10)).collect();
        for (i, &o) in offs.iter().enumerate() {
            h.get(o)[2].store(i as u64 + 1, Ordering::Relaxed);
        }
        for (i, &o) in offs.iter().enumerate() {
            assert_eq!(h.get(o)[2].load(Ordering::Relaxed), i as u64 + 1);
        }
        assert!(h.bytes() >= 5000 * 128);
    }
}
