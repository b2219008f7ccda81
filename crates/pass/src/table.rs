//! The fused mapping table (paper §III-E), one octave at a time.
//!
//! The paper precomputes `power` and `mapping = physical ∘ power` for every
//! index up to a fixed maximum (182 MB for 200M records). But `first` only
//! grows, so the window `cI .. cI + 2^k` only moves right, and it spans at
//! most two *octaves* (indices `a·2^k .. (a+1)·2^k`, the keys whose `G` has
//! integer part `a`). The engine needs the current octave and the next;
//! older ones are dead, later ones are built when the window gets there.
//! Octave `a` holds logical buckets `2^a .. 2^(a+1) − 1`.

use crate::spiral::{physical, power_table};

/// The smallest `k` (scalar = 2^k) that gives every active bucket an index
/// when the table may grow to `max_segments` physical segments: the window
/// maps onto `first .. 2·first − 1` with `first ≤ max_segments`, and a
/// bucket of logical address `L` owns about `2^k / (L ln 2)` indices, so
/// `2^k ≥ 2 · max_segments / ln 2` (≈ 2.9×) suffices; we take the next
/// power of two above 3×, and at least 2^8.
pub fn scalar_bits_for(max_segments: u64) -> u32 {
    let need = max_segments.max(1).saturating_mul(3);
    (64 - (need - 1).leading_zeros()).max(8)
}

/// One octave of the power and mapping tables.
#[derive(Clone, Debug)]
pub struct Octave {
    /// Octave number `a`: indices `a·2^k .. (a+1)·2^k`.
    pub a: u32,
    /// `power[a·2^k + j]` = logical bucket (in `2^a .. 2^(a+1)`).
    pub power: Vec<u32>,
    /// `mapping[a·2^k + j]` = physical segment of that bucket.
    pub mapping: Vec<u32>,
}

impl Octave {
    /// Builds octave `a` for scalar `2^k` (`a + 1 ≤ 32`: buckets fit `u32`).
    pub fn build(a: u32, k: u32) -> Octave {
        assert!(a < 32 && k <= 30);
        let s = 1u64 << k;
        let power = power_table(k, a as u64 * s, (a as u64 + 1) * s);
        let mapping = power.iter().map(|&l| physical(l) as u32).collect();
        Octave {
            a,
            power: power.into_iter().map(|l| l as u32).collect(),
            mapping,
        }
    }

    /// Bytes the two tables of one octave take.
    pub fn bytes(k: u32) -> u64 {
        (1u64 << k) * 8
    }
}

/// The tables a table of leftmost bucket `first` needs: the octaves of
/// its window's first and last index.
pub fn octaves_for(first: u64, k: u32) -> (u32, u32) {
    let ci = crate::spiral::window_start(first, k);
    let last = ci + (1u64 << k) - 1;
    ((ci >> k) as u32, (last >> k) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spiral::{index, power_exact, window_start};

    #[test]
    fn scalar_bits_give_every_active_bucket_an_index() {
        assert_eq!(scalar_bits_for(1), 8);
        assert_eq!(scalar_bits_for(1 << 20), 22);
        assert_eq!(scalar_bits_for(100_000), 19);
        // Resolution at the largest window the pool allows.
        for max in [100u64, 1000, 5000] {
            let k = scalar_bits_for(max);
            let first = max;
            let ci = window_start(first, k);
            let (a, b) = octaves_for(first, k);
            let tables: Vec<Octave> = (a..=b).map(|o| Octave::build(o, k)).collect();
            let mut owned = vec![false; first as usize];
            for i in ci..ci + (1 << k) {
                let o = &tables[((i >> k) as u32 - a) as usize];
                let l = o.power[(i - ((o.a as u64) << k)) as usize] as u64;
                assert!((first..2 * first).contains(&l));
                owned[(l - first) as usize] = true;
            }
            assert!(
                owned.iter().all(|&x| x),
                "max {max}: a bucket owns no index"
            );
        }
    }

    #[test]
    fn octaves_agree_with_the_exact_definitions() {
        let k = 12;
        for a in [0u32, 3, 9, 14] {
            let o = Octave::build(a, k);
            assert_eq!(o.power.len(), 1 << k);
            for (j, (&l, &p)) in o.power.iter().zip(&o.mapping).enumerate() {
                let l = l as u64;
                assert!((1u64 << a..1u64 << (a + 1)).contains(&l), "octave {a}");
                assert_eq!(p as u64, physical(l));
                if j % 61 == 0 {
                    assert_eq!(l, power_exact(((a as u64) << k) + j as u64, k));
                }
            }
        }
        // Two octaves cover every window, and one octave up is a split.
        let lo = Octave::build(5, k);
        let hi = Octave::build(6, k);
        for j in 0..1usize << k {
            let (l, u) = (lo.power[j], hi.power[j]);
            assert!(u == 2 * l || u == 2 * l + 1);
        }
        for first in [32u64, 33, 40, 63] {
            let (a, b) = octaves_for(first, k);
            assert!(a == 5 && (b == 5 || b == 6), "first {first}: {a}..{b}");
            let ci = window_start(first, k);
            assert_eq!(
                index(0, ci, k) >> k,
                if ci & ((1 << k) - 1) == 0 { 5 } else { 6 }
            );
        }
        // 16 GiB of 16 KiB segments: two octaves of 2^22 entries, 64 MiB.
        assert_eq!(2 * Octave::bytes(scalar_bits_for(1 << 20)), 64 << 20);
    }
}
