//! The key hash: a seeded bijection on u64, so a slot can hold the hash
//! instead of the key and still give the key back.

const C1: u64 = 0xff51_afd7_ed55_8ccd;
const C2: u64 = 0xc4ce_b9fe_1a85_ec53;
const C1_INV: u64 = inverse(C1);
const C2_INV: u64 = inverse(C2);

/// Multiplicative inverse of an odd number modulo 2^64 (Newton's method:
/// each step doubles the correct low bits; 3 → 6 → 12 → 24 → 48 → 96).
const fn inverse(c: u64) -> u64 {
    let mut x = c;
    let mut i = 0;
    while i < 5 {
        x = x.wrapping_mul(2u64.wrapping_sub(c.wrapping_mul(x)));
        i += 1;
    }
    x
}

/// Which function maps keys to hashes (stored in the root).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HashKind {
    /// murmur3's 64-bit finalizer over `key ^ seed`: uniform.
    Mixed = 0,
    /// The key itself: adversarial on purpose (sequential keys share their
    /// high bits), for tests of the depth cap and the overflow path.
    Identity = 1,
}

impl HashKind {
    pub fn from_word(w: u64) -> Option<HashKind> {
        match w {
            0 => Some(HashKind::Mixed),
            1 => Some(HashKind::Identity),
            _ => None,
        }
    }
}

/// A key hasher and its inverse.
#[derive(Clone, Copy, Debug)]
pub struct Hasher {
    pub kind: HashKind,
    pub seed: u64,
}

impl Hasher {
    #[inline]
    pub fn hash(&self, key: u64) -> u64 {
        match self.kind {
            HashKind::Mixed => {
                let mut h = key ^ self.seed;
                h ^= h >> 33;
                h = h.wrapping_mul(C1);
                h ^= h >> 33;
                h = h.wrapping_mul(C2);
                h ^ (h >> 33)
            }
            HashKind::Identity => key,
        }
    }

    #[inline]
    pub fn key(&self, h: u64) -> u64 {
        match self.kind {
            HashKind::Mixed => {
                // x ^= x >> 33 is its own inverse (33 >= 32).
                let mut x = h ^ (h >> 33);
                x = x.wrapping_mul(C2_INV);
                x ^= x >> 33;
                x = x.wrapping_mul(C1_INV);
                x ^= x >> 33;
                x ^ self.seed
            }
            HashKind::Identity => h,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inverse_round_trips() {
        assert_eq!(C1.wrapping_mul(C1_INV), 1);
        assert_eq!(C2.wrapping_mul(C2_INV), 1);
        let h = Hasher {
            kind: HashKind::Mixed,
            seed: 0x9e37_79b9_7f4a_7c15,
        };
        let mut x = 1u64;
        for k in [0, 1, u64::MAX, 1 << 63, 42] {
            assert_eq!(h.key(h.hash(k)), k);
        }
        for _ in 0..10_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            assert_eq!(h.key(h.hash(x)), x);
        }
    }
}
