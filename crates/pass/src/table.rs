//! The fused mapping table (paper §III-E), one octave at a time.
//!
//! The paper precomputes `power` and `mapping = physical ∘ power` for every
//! index up to a fixed maximum (182 MB for 200M records). But `first` only
//! grows, so the window only moves right, and it spans at most two
//! *octaves* (the keys whose `G` has integer part `a`); older ones are
//! dead, later ones are built when the window gets there. Octave `a` holds
//! logical buckets `2^a .. 2^(a+1) − 1`.
//!
//! Two tables live here:
//! - `Octave`: the paper's table, quantised to `2^-k` (with its
//!   Algorithm 2 corrected). Compiled for the tests only, as the
//!   reference that shows what the paper builds; the engine does not use
//!   it.
//! - `exact_octave`: the engine's table, exact to `2^-40` and free to
//!   grow `k` (see [`FINE`] and `docs/engines/pass.md`).

#[cfg(test)]
use crate::spiral::{physical, power_table};

/// The smallest `k` (scalar = 2^k) that gives every active bucket an index
/// when the table may grow to `max_segments` physical segments: the window
/// maps onto `first .. 2·first − 1` with `first ≤ max_segments`, and a
/// bucket of logical address `L` owns about `2^k / (L ln 2)` indices, so
/// `2^k ≥ 2 · max_segments / ln 2` (≈ 2.9×) suffices; we take the next
/// power of two above 3×, and at least 2^8.
#[cfg(test)]
pub(crate) fn scalar_bits_for(max_segments: u64) -> u32 {
    let need = max_segments.max(1).saturating_mul(3);
    (64 - (need - 1).leading_zeros()).max(8)
}

/// One octave of the power and mapping tables.
#[cfg(test)]
#[derive(Clone, Debug)]
pub(crate) struct Octave {
    /// Octave number `a`: indices `a·2^k .. (a+1)·2^k`.
    pub a: u32,
    /// `power[a·2^k + j]` = logical bucket (in `2^a .. 2^(a+1)`).
    pub power: Vec<u32>,
    /// `mapping[a·2^k + j]` = physical segment of that bucket.
    pub mapping: Vec<u32>,
}

#[cfg(test)]
impl Octave {
    /// Builds octave `a` for scalar `2^k` (`a + 1 ≤ 32`: buckets fit `u32`).
    pub(crate) fn build(a: u32, k: u32) -> Octave {
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
    pub(crate) fn bytes(k: u32) -> u64 {
        (1u64 << k) * 8
    }
}

/// The tables a table of leftmost bucket `first` needs: the octaves of
/// its window's first and last index.
#[cfg(test)]
pub(crate) fn octaves_for(first: u64, k: u32) -> (u32, u32) {
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

/// Fine resolution of a key's position: `G` is known to `2^-FINE`. The
/// key → logical bucket function is `L(P) = max{L : S(L) ≤ P}` with
/// `S(L) = ⌊2^FINE · log2 L⌋` (exact) and `P` the key's fine position.
/// Because `S(2L) = S(L) + 2^FINE` exactly, a split of `L` sends each of
/// its keys to `2L` or `2L + 1`, and buckets own exactly their share of
/// the hash space (the paper's quantisation to `2^-k` gave neighbouring
/// buckets shares that differ by up to one index, 30% and more).
pub const FINE: u32 = 40;

/// `S(l) = ⌊2^FINE · log2 l⌋`, exactly: by `f64` where it is far from an
/// integer (its error is below 2^-7 here), else by the exact routine.
pub fn fine_log2(l: u64) -> u64 {
    let v = (l as f64).log2() * (1u64 << FINE) as f64;
    let f = v.floor();
    if v - f < 0.05 || f + 1.0 - v < 0.05 {
        crate::spiral::scaled_log2_floor(l, FINE)
    } else {
        f as u64
    }
}

/// One octave of the exact mapping table at `2^k` cells per octave: cell
/// `i` covers fine positions `i·2^(FINE−k) ..` and holds the bucket at its
/// start (low 32 bits) and, if the next bucket starts inside the cell, the
/// offset of that start in the cell (high 32 bits; 0 = none). With
/// `2^k ≥ 3 · first` no bucket of a window is narrower than a cell, so one
/// boundary per cell suffices.
pub(crate) fn exact_octave(a: u32, k: u32) -> Vec<u64> {
    assert!(a < 32 && (8..=24).contains(&k));
    let w = 1u64 << (FINE - k);
    let mut out = Vec::with_capacity(1 << k);
    let mut l = 1u64 << a;
    let mut next = fine_log2(l + 1);
    for j in 0..1u64 << k {
        let p0 = ((a as u64) << FINE) + j * w;
        while next <= p0 {
            l += 1;
            next = fine_log2(l + 1);
        }
        let boff = if next < p0 + w { next - p0 } else { 0 };
        out.push(l | boff << 32);
    }
    out
}

/// The logical bucket of fine position `p` from its cell's entry.
#[inline]
pub(crate) fn entry_logical(e: u64, p: u64, k: u32) -> u64 {
    let boff = e >> 32;
    let off = p & ((1u64 << (FINE - k)) - 1);
    (e & 0xffff_ffff) + (boff != 0 && off >= boff) as u64
}

/// The smallest `k` (8..=24) whose cells are no wider than any bucket of
/// a window with leftmost bucket `first`.
pub(crate) fn cells_for(first: u64) -> u32 {
    let need = first.max(1).saturating_mul(3);
    (64 - (need - 1).leading_zeros()).clamp(8, 24)
}

#[cfg(test)]
mod exact_tests {
    use super::*;

    fn logical_exact(p: u64) -> u64 {
        // max L with S(L) <= p, by bisection on the exact routine.
        let (mut lo, mut hi) = (1u64, 1u64 << 33);
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            if crate::spiral::scaled_log2_floor(mid, FINE) <= p {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }

    #[test]
    fn fine_log2_is_exact_and_doubles_exactly() {
        for l in (1..200_000u64).step_by(7).chain([1 << 20, (1 << 32) - 1]) {
            assert_eq!(
                fine_log2(l),
                crate::spiral::scaled_log2_floor(l, FINE),
                "l {l}"
            );
            assert_eq!(fine_log2(2 * l), fine_log2(l) + (1 << FINE));
        }
    }

    #[test]
    fn exact_octaves_give_the_exact_bucket_everywhere() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        for (a, k) in [(3u32, 8u32), (9, 12), (12, 14), (15, 17)] {
            let t = exact_octave(a, k);
            let w = 1u64 << (FINE - k);
            for _ in 0..4000 {
                rng = rng
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let x = rng >> 24;
                let p = ((a as u64) << FINE) + x;
                let e = t[(x / w) as usize];
                // Only cells no wider than the buckets are ever used.
                let l = logical_exact(p);
                if (l as f64) * 1.45 > (1u64 << k) as f64 {
                    continue;
                }
                assert_eq!(entry_logical(e, p, k), l, "a {a} k {k} p {p}");
            }
            // Bucket starts are exact: the first position of each bucket.
            for l in (1u64 << a)..((1u64 << a) + 50).min((1u64 << k) / 2).min(1 << (a + 1)) {
                let s = fine_log2(l);
                let e = t[((s - ((a as u64) << FINE)) / w) as usize];
                assert_eq!(entry_logical(e, s, k), l);
                if s > (a as u64) << FINE {
                    assert_eq!(
                        entry_logical(t[((s - 1 - ((a as u64) << FINE)) / w) as usize], s - 1, k),
                        l - 1
                    );
                }
            }
        }
    }

    #[test]
    fn a_split_sends_every_key_to_a_child() {
        // Octave a at k cells and octave a+1 at k+1 cells (a table that grew).
        let (a, k) = (10u32, 12u32);
        let lo = exact_octave(a, k);
        let hi = exact_octave(a + 1, k + 1);
        let mut rng = 7u64;
        for _ in 0..20_000 {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let x = rng >> 24;
            let l = entry_logical(lo[(x >> (FINE - k)) as usize], ((a as u64) << FINE) + x, k);
            if (l as f64) * 1.45 > (1u64 << k) as f64 {
                continue;
            }
            let u = entry_logical(
                hi[(x >> (FINE - k - 1)) as usize],
                ((a as u64 + 1) << FINE) + x,
                k + 1,
            );
            assert!(u == 2 * l || u == 2 * l + 1, "{l} -> {u}");
        }
    }
}
