//! murmur3's 64-bit finalizer and its inverse: a bijection on u64, so an
//! engine can store a key's hash instead of the key and still give the key
//! back.

const C1: u64 = 0xff51_afd7_ed55_8ccd;
const C2: u64 = 0xc4ce_b9fe_1a85_ec53;
const C1_INV: u64 = inverse(C1);
const C2_INV: u64 = inverse(C2);

/// Multiplicative inverse of an odd number modulo 2^64 (Newton's method:
/// each step doubles the correct low bits).
pub const fn inverse(c: u64) -> u64 {
    let mut x = c;
    let mut i = 0;
    while i < 6 {
        x = x.wrapping_mul(2u64.wrapping_sub(c.wrapping_mul(x)));
        i += 1;
    }
    x
}

/// murmur3's fmix64.
#[inline]
pub const fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(C1);
    h ^= h >> 33;
    h = h.wrapping_mul(C2);
    h ^ (h >> 33)
}

/// The inverse of [`fmix64`].
#[inline]
pub fn unfmix64(h: u64) -> u64 {
    // x ^= x >> 33 is its own inverse (33 >= 32).
    let mut x = h ^ (h >> 33);
    x = x.wrapping_mul(C2_INV);
    x ^= x >> 33;
    x = x.wrapping_mul(C1_INV);
    x ^ (x >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fmix_round_trips() {
        assert_eq!(C1.wrapping_mul(C1_INV), 1);
        assert_eq!(C2.wrapping_mul(C2_INV), 1);
        let mut x = 1u64;
        for k in [0, 1, u64::MAX, 1 << 63, 42] {
            assert_eq!(unfmix64(fmix64(k)), k);
        }
        for _ in 0..10_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            assert_eq!(unfmix64(fmix64(x)), x);
        }
    }
}
