//! Byte-wise matching of a 16-byte fingerprint group: which of 16 bytes
//! equal a given byte. Engines with one fingerprint byte per slot (PASS's
//! buckets) test a whole bucket's fingerprints with one call.
//!
//! On x86_64 this is SSE2 (part of the architecture's baseline): a byte
//! compare and a mask move, about five instructions. Elsewhere it is an
//! exact word trick of some 25 instructions; both are tested against a
//! plain byte loop.

/// One bit per byte of `lo` (bytes 0..8, little-endian) and `hi` (bytes
/// 8..16) that equals `b`: bit `i` set iff byte `i` == `b`.
#[inline]
pub fn eq_mask16(lo: u64, hi: u64, b: u8) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_cmpeq_epi8, _mm_movemask_epi8, _mm_set1_epi8, _mm_set_epi64x};
        // SAFETY: SSE2 is enabled on every x86_64 target (baseline
        // feature); these intrinsics touch only registers.
        unsafe {
            let eq = _mm_cmpeq_epi8(_mm_set_epi64x(hi as i64, lo as i64), _mm_set1_epi8(b as i8));
            _mm_movemask_epi8(eq) as u32 & 0xffff
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    eq_mask16_words(lo, hi, b)
}

/// [`eq_mask16`] with word operations only (the portable version).
#[cfg(any(test, not(target_arch = "x86_64")))]
#[inline]
fn eq_mask16_words(lo: u64, hi: u64, b: u8) -> u32 {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    let bb = LO * b as u64;
    let zero = |x: u64| {
        let y = x ^ bb;
        // Exact zero-byte test (no borrow crosses into the next byte).
        !(((y & !HI).wrapping_add(!HI) | y) | !HI)
    };
    // Gather each byte's high bit into one byte.
    let pack = |z: u64| ((z >> 7) & LO).wrapping_mul(0x0102_0408_1020_4080) >> 56;
    (pack(zero(lo)) | pack(zero(hi)) << 8) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(lo: u64, hi: u64, b: u8) -> u32 {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&lo.to_le_bytes());
        bytes[8..].copy_from_slice(&hi.to_le_bytes());
        (0..16).filter(|&i| bytes[i] == b).map(|i| 1 << i).sum()
    }

    #[test]
    fn both_versions_match_a_byte_loop() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for i in 0..20_000 {
            let (mut lo, mut hi) = (next(), next());
            // Plant the byte in some positions, and neighbours that differ
            // by one bit (the borrow cases of the word trick).
            let b = (next() & 0xff) as u8;
            for pos in 0..16 {
                let sel = next() % 4;
                let byte = match sel {
                    0 => b,
                    1 => b ^ 1,
                    2 => b.wrapping_add(1),
                    _ => continue,
                } as u64;
                let w = if pos < 8 { &mut lo } else { &mut hi };
                let sh = 8 * (pos % 8);
                *w = (*w & !(0xff << sh)) | byte << sh;
            }
            if i % 7 == 0 {
                lo = 0;
            }
            let want = naive(lo, hi, b);
            assert_eq!(eq_mask16(lo, hi, b), want, "{lo:#x} {hi:#x} {b}");
            assert_eq!(eq_mask16_words(lo, hi, b), want, "{lo:#x} {hi:#x} {b}");
        }
        assert_eq!(eq_mask16(0, 0, 0), 0xffff);
        assert_eq!(eq_mask16(u64::MAX, u64::MAX, 0xff), 0xffff);
        assert_eq!(eq_mask16(0, u64::MAX, 0xff), 0xff00);
    }
}
