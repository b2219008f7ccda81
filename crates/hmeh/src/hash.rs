//! The key hash: a seeded bijection on u64, so a slot can hold the hash
//! instead of the key and still give the key back. One concept: the
//! function and its inverse, nothing of the table.

use engine::hash::{fmix64, unfmix64};

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
    /// The kind a root block's hash-kind word names (`None` for any other word).
    pub(crate) fn from_word(w: u64) -> Option<HashKind> {
        match w {
            0 => Some(HashKind::Mixed),
            1 => Some(HashKind::Identity),
            _ => None,
        }
    }
}

/// A key hasher and its inverse.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Hasher {
    pub(crate) kind: HashKind,
    pub(crate) seed: u64,
}

impl Hasher {
    #[inline]
    pub(crate) fn hash(&self, key: u64) -> u64 {
        match self.kind {
            HashKind::Mixed => fmix64(key ^ self.seed),
            HashKind::Identity => key,
        }
    }

    #[inline]
    pub(crate) fn key(&self, h: u64) -> u64 {
        match self.kind {
            HashKind::Mixed => unfmix64(h) ^ self.seed,
            HashKind::Identity => h,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inverse_round_trips() {
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
