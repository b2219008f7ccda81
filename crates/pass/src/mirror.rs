//! The DRAM copy of the live window's mapping cells, with segment
//! offsets: the 8-byte-key get turns a fine position into its segment's
//! offset with one load here (and its neighbour, in the same line seven
//! times in eight), instead of the PM cell, the logical-to-physical step
//! and the directory. Rebuilt from the PM tables by every open and kept by
//! [`Pass::publish`](crate::Pass::publish); nothing of it is on PM.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::layout::MAX_K;
use crate::table::FINE;

/// The smallest `k` of the mapping table (`table::cells_for`).
const MIN_K: usize = 8;

/// Cells for each `k` the table has had since this open (a `k` only grows,
/// and a reader may still hold the array of the previous one: arrays live
/// as long as the table's handle; together they are under twice the last).
///
/// The array of `k` has one cell per mapping cell of two consecutive
/// octaves, at index (fine cell number) mod `2^(k+1)`, so the two octaves
/// a window spans never share one, and one more cell after them: a copy
/// of cell 0, the neighbour of the last. A cell is one word: low 32 bits
/// the offset / 64 of the segment of the bucket at the cell's start (0
/// when that bucket is not in the window, or its offset does not fit: the
/// get then takes the general path), high 32 bits the offset in the cell
/// at which the next bucket starts, minus one (the cell's width minus one
/// when no bucket starts inside it). The next bucket's segment is the
/// next cell's low half: no bucket of a window is narrower than a cell.
pub(crate) struct Mirror {
    by_k: [OnceLock<Box<[AtomicU64]>>; MAX_K as usize - MIN_K + 1],
}

impl Mirror {
    pub(crate) fn new() -> Mirror {
        Mirror {
            by_k: Default::default(),
        }
    }

    /// The cells of `k`, made (zero) on first use.
    fn cells(&self, k: u32) -> &[AtomicU64] {
        self.by_k[k as usize - MIN_K]
            .get_or_init(|| (0..(2usize << k) + 1).map(|_| AtomicU64::new(0)).collect())
    }

    /// Sets the cell of fine cell number `j` (at `2^k` cells per octave).
    pub(crate) fn set(&self, k: u32, j: u64, seg: Option<u64>, next_at: u64) {
        let cells = self.cells(k);
        let i = (j & ((2u64 << k) - 1)) as usize;
        let a = seg
            .filter(|s| s % 64 == 0 && s >> 6 <= u32::MAX as u64)
            .map_or(0, |s| s >> 6);
        let w = a | (next_at - 1) << 32;
        cells[i].store(w, Ordering::Relaxed);
        if i == 0 {
            cells[cells.len() - 1].store(w, Ordering::Relaxed);
        }
    }

    /// The offset of the segment of fine position `pos` at `2^k` cells
    /// per octave, or `None` (no cells for `k`, or a cell that names no
    /// live segment). The caller validates what it reads with the spiral
    /// state's version, as for every other DRAM copy.
    #[inline(always)]
    pub(crate) fn seg(&self, pos: u64, k: u32) -> Option<u64> {
        let cells = self.by_k.get((k as usize).wrapping_sub(MIN_K))?.get()?;
        let sh = FINE - k;
        let j = ((pos >> sh) & ((2u64 << k) - 1)) as usize;
        let c = cells.get(j)?.load(Ordering::Relaxed);
        let n = cells.get(j + 1)?.load(Ordering::Relaxed);
        let off = pos & ((1u64 << sh) - 1);
        let s = if off > c >> 32 { n } else { c } & 0xffff_ffff;
        (s != 0).then_some(s << 6)
    }
}
