//! Spiral storage with growth factor b = 2, in integers.
//!
//! A key's hash `h ∈ [0, 1)` and the state `c` give `G = ⌈c − h⌉ + h`, the
//! unique number ≡ h (mod 1) in `[c, c + 1)`, and the logical bucket
//! `⌊2^G⌋` (paper Eq. 1–2). Expansion deletes the leftmost bucket `first`
//! and moves `c` to `log2(first + 1)`: its keys go to logical `2·first` and
//! `2·first + 1`. We keep no real `c`: the state is the integer `first`,
//! the active logical buckets are `first .. 2·first − 1`, and physical
//! segments are `0 .. first − 1` (the paper's narrative counts the range
//! inclusively and is off by one; its Algorithm 1 and Table III fit this
//! convention, see `docs/engines/pass.md`).
//!
//! The hash is quantized to `k` bits (`scalar = 2^k`): index
//! `i = ⌊scalar·G⌋`, and `power[i]` stands for `⌊2^G⌋`. The table then
//! *defines* the key → bucket function, so every path (insert, search,
//! split) must use it and nothing else.

/// The paper's Algorithm 1 for b = 2, as printed (recursive): the physical
/// segment of logical bucket `l`. The last child of a bucket (odd `l`)
/// reuses its parent's segment; the other child is appended at `l − ⌊l/2⌋`.
#[cfg(test)]
pub(crate) fn physical_alg1(l: u64) -> u64 {
    let high = l.div_ceil(2); // ⌊(1 + l) / 2⌋
    let low = l / 2;
    if low < high {
        physical_alg1(low)
    } else {
        l - low
    }
}

/// Algorithm 1 without recursion: strip the trailing "last child" steps
/// (odd `l` → `⌊l/2⌋`), then the bucket was appended at `l − ⌊l/2⌋`.
#[inline]
pub(crate) fn physical(l: u64) -> u64 {
    let l = l >> l.trailing_ones();
    l - l / 2
}

/// `⌊2^k · log2(l)⌋` for `l ≥ 1`, exactly (for every `l` this crate can
/// see): the integer part from the bit length, the `k` fractional bits by
/// repeated squaring in 124-bit fixed point. A bit could only come out
/// wrong if `log2 l` had some 90 equal binary digits in a row after bit
/// `k`, which an irrational number of this size does not.
pub(crate) fn scaled_log2_floor(l: u64, k: u32) -> u64 {
    assert!(l >= 1 && k <= 40);
    let n = 63 - l.leading_zeros();
    const F: u32 = 124;
    // y = l / 2^n in [1, 2), F fractional bits.
    let mut y: u128 = (l as u128) << (F - n);
    let mut frac = 0u64;
    for _ in 0..k {
        y = mul_shift(y, y, F);
        frac <<= 1;
        if y >> (F + 1) != 0 {
            frac |= 1;
            y >>= 1;
        }
    }
    ((n as u64) << k) | frac
}

/// `(a · b) >> s` for 128-bit operands, through a 256-bit product.
fn mul_shift(a: u128, b: u128, s: u32) -> u128 {
    let (a1, a0) = (a >> 64, a & u64::MAX as u128);
    let (b1, b0) = (b >> 64, b & u64::MAX as u128);
    let p00 = a0 * b0;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let p11 = a1 * b1;
    let mid = (p00 >> 64) + (p01 & u64::MAX as u128) + (p10 & u64::MAX as u128);
    let lo = (p00 & u64::MAX as u128) | (mid << 64);
    let hi = p11 + (p01 >> 64) + (p10 >> 64) + (mid >> 64);
    debug_assert!(s < 128 && (hi >> s) == 0);
    (hi << (128 - s)) | (lo >> s)
}

/// `⌊2^k · log2(l)⌋` by `f64`, checked: where the `f64` value lies close
/// to an integer the exact routine decides.
#[cfg(test)]
#[inline]
pub(crate) fn scaled_log2_fast(l: u64, k: u32) -> u64 {
    let v = (l as f64).log2() * (1u64 << k) as f64;
    let f = v.floor();
    if v - f < 1e-6 || f + 1.0 - v < 1e-6 {
        scaled_log2_floor(l, k)
    } else {
        f as u64
    }
}

/// The power table entry for index `i`: the largest `L` with
/// `⌊2^k · log2 L⌋ ≤ i`, i.e. `⌈2^((i+1)/2^k)⌉ − 1` (what the paper's
/// Algorithm 2 means, with its undefined `init` read as `logical`).
#[cfg(test)]
pub(crate) fn power_exact(i: u64, k: u32) -> u64 {
    // Start from the f64 estimate and correct it with the exact test.
    let est = (((i + 1) as f64) / (1u64 << k) as f64).exp2().ceil() as u64;
    let mut l = est.saturating_sub(1).max(1);
    while l > 1 && scaled_log2_floor(l, k) > i {
        l -= 1;
    }
    while scaled_log2_floor(l + 1, k) <= i {
        l += 1;
    }
    l
}

/// Algorithm 2 as the paper prints it (with `init` = `logical`): at most
/// one increment of `logical` per index, so it falls behind once buckets
/// are denser than indices (`L > scalar / ln 2`). Kept to show the bug.
#[cfg(test)]
pub(crate) fn power_table_alg2(k: u32, len: u64) -> Vec<u64> {
    let scalar = (1u64 << k) as f64;
    let mut logical = 1u64;
    let mut t = Vec::with_capacity(len as usize);
    for i in 0..len {
        let temp = (logical as f64).log2() * scalar;
        if i as f64 >= temp.floor() {
            logical += 1;
        }
        t.push(logical - 1);
    }
    t
}

/// The corrected Algorithm 2: `power[i]` for `i` in `from .. to`, built in
/// one pass that advances `L` as many times as an index needs.
#[cfg(test)]
pub(crate) fn power_table(k: u32, from: u64, to: u64) -> Vec<u64> {
    let mut t = Vec::with_capacity((to - from) as usize);
    let mut l = power_exact(from, k);
    for i in from..to {
        while scaled_log2_fast(l + 1, k) <= i {
            l += 1;
        }
        t.push(l);
    }
    t
}

/// The window of indices when the leftmost bucket is `first`: the first
/// index whose logical bucket is at least `first` (`cI`); the window is
/// `cI .. cI + 2^k` and maps onto logical `first .. 2·first − 1`.
#[cfg(test)]
pub(crate) fn window_start(first: u64, k: u32) -> u64 {
    // The smallest i with power[i] >= first: power[i] >= first iff
    // ⌊2^k·log2 first⌋ <= i.
    scaled_log2_floor(first, k)
}

/// Index of a key in the window starting at `ci`: the unique index
/// ≡ `hq` (mod 2^k) in `ci .. ci + 2^k`, where `hq` is the hash's top `k`
/// bits (`⌊2^k · h⌋`): `⌊2^k · G⌋` in integers.
#[cfg(test)]
#[inline]
pub(crate) fn index(hq: u64, ci: u64, k: u32) -> u64 {
    let m = (1u64 << k) - 1;
    ci + (hq.wrapping_sub(ci) & m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn algorithm_1_matches_table_iii_and_the_closed_form() {
        let table_iii = [
            (1, 0),
            (2, 1),
            (3, 0),
            (4, 2),
            (5, 1),
            (6, 3),
            (7, 0),
            (8, 4),
        ];
        for (l, p) in table_iii {
            assert_eq!(physical_alg1(l), p, "Table III at {l}");
        }
        for l in 0..1 << 20 {
            assert_eq!(physical(l), physical_alg1(l), "logical {l}");
        }
    }

    #[test]
    fn the_active_buckets_fill_the_physical_segments_exactly() {
        // With leftmost bucket `first`, logical first .. 2·first−1 occupy
        // physical 0 .. first−1, each once; a split of `first` keeps
        // 2·first+1 in first's segment and appends 2·first at `first`.
        for first in 1..2000u64 {
            let mut seen = vec![false; first as usize];
            for l in first..2 * first {
                let p = physical(l) as usize;
                assert!(p < first as usize && !seen[p], "first {first}, logical {l}");
                seen[p] = true;
            }
            assert_eq!(physical(2 * first + 1), physical(first));
            assert_eq!(physical(2 * first), first);
        }
    }

    #[test]
    fn scaled_log2_is_exact_on_powers_of_two_and_agrees_with_f64() {
        for k in [0, 1, 8, 16, 20] {
            for n in 0..40 {
                assert_eq!(scaled_log2_floor(1 << n, k), (n as u64) << k);
            }
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let l = (x >> 40).max(1);
            for k in [8, 19] {
                let exact = scaled_log2_floor(l, k);
                let approx = (l as f64).log2() * (1u64 << k) as f64;
                assert!((exact as f64 - approx.floor()).abs() <= 1.0, "{l} {k}");
                assert_eq!(scaled_log2_fast(l, k), exact, "{l} {k}");
            }
        }
    }

    #[test]
    fn table_ii_and_the_worked_example() {
        // Paper Table II (scalar = 256): index → value.
        let t = power_table(8, 0, 256 * 17);
        for (i, v) in [
            (1583, 72),
            (1584, 73),
            (1588, 73),
            (1589, 74),
            (1593, 74),
            (1594, 75),
        ] {
            assert_eq!(t[i], v, "Table II at {i}");
        }
        // G = 6.21 → index ⌊256 · 6.21⌋ = 1589 → 74 = ⌊2^6.21⌋.
        assert_eq!(t[(256.0f64 * 6.21) as usize], 74);
        // The printed Algorithm 2 agrees up to index 2187 and then lags.
        let printed = power_table_alg2(8, 256 * 17);
        assert_eq!(printed[..2188], t[..2188]);
        assert_ne!(printed[2188], t[2188]);
        assert_eq!((printed[2188], t[2188]), (374, 375));
        assert!(*printed.last().unwrap() < 65535);
        assert_eq!(*t.last().unwrap(), (1 << 17) - 1);
    }

    #[test]
    fn power_table_matches_its_definition_and_the_split_invariant() {
        for k in [6, 10, 14] {
            let s = 1u64 << k;
            let len = s * 12;
            let t = power_table(k, 0, len);
            for i in 0..len {
                let l = t[i as usize];
                // The definition: the largest L with ⌊s·log2 L⌋ <= i.
                assert!(scaled_log2_floor(l, k) <= i && scaled_log2_floor(l + 1, k) > i);
                if i % 97 == 0 {
                    assert_eq!(power_exact(i, k), l);
                }
                // One more octave doubles the bucket: a split of L sends
                // its keys to 2L and 2L + 1, and nowhere else.
                if i + s < len {
                    let up = t[(i + s) as usize];
                    assert!(up == 2 * l || up == 2 * l + 1, "k {k} i {i}: {l} → {up}");
                }
            }
        }
    }

    #[test]
    fn every_window_maps_onto_the_active_buckets() {
        let k = 10;
        let s = 1u64 << k;
        for first in [1u64, 2, 3, 5, 64, 100, 333, 511, 512, 700] {
            let ci = window_start(first, k);
            let t = power_table(k, ci, ci + s);
            assert!(
                t.iter().all(|&l| l >= first && l < 2 * first),
                "first {first}"
            );
            // Resolution: with s >= 1.44·(2·first) every active bucket
            // owns at least one index.
            if (s as f64) >= 1.45 * 2.0 * first as f64 {
                let mut owned = vec![false; first as usize];
                for &l in &t {
                    owned[(l - first) as usize] = true;
                }
                assert!(owned.iter().all(|&o| o), "first {first}");
            }
            // A key's index in the window, and after the split of `first`
            // it moves by exactly one octave or stays.
            for hq in (0..s).step_by(37) {
                let i = index(hq, ci, k);
                assert!((ci..ci + s).contains(&i) && i % s == hq);
                let l = power_exact(i, k);
                let ci2 = window_start(first + 1, k);
                let i2 = index(hq, ci2, k);
                let l2 = power_exact(i2, k);
                if l == first {
                    assert_eq!(i2, i + s);
                    assert!(l2 == 2 * first || l2 == 2 * first + 1);
                } else {
                    assert_eq!((i2, l2), (i, l));
                }
            }
        }
    }
}
