//! CRC-32C (Castagnoli), the checksum of log entries (format 2).
//!
//! On x86-64 with SSE4.2 it is one `crc32` instruction per 8 bytes: an
//! entry of an 8-byte key and value costs 8 of them, where the CRC-32 of
//! format 1 (`crc32fast`, whose fast path is for long buffers) took about
//! 240 instructions per entry (callgrind). Elsewhere, and on
//! x86-64 without SSE4.2, a table-driven loop computes the same value, so
//! a log written on one machine verifies on any other.
//!
//! [`crc32c_of`] takes words (each as its 8 little-endian bytes) and
//! byte strings, in that order, in one call.

/// The reflected Castagnoli polynomial.
const POLY: u32 = 0x82f6_3b78;

/// Byte-at-a-time table for the portable path.
const TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// CRC-32C of `words` (each as its 8 little-endian bytes), then each of
/// `parts`, in one call: on the hardware path one function with no
/// per-piece dispatch (a log entry's checksum is six words, a key and a
/// value).
#[inline]
pub(crate) fn crc32c_of(words: &[u64], parts: &[&[u8]]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if hw() {
        // SAFETY: SSE4.2 was detected.
        return !unsafe { hw_all(!0, words, parts) };
    }
    portable(words, parts)
}

/// [`crc32c_of`] by table, on any machine.
fn portable(words: &[u64], parts: &[&[u8]]) -> u32 {
    let mut c = !0;
    for w in words {
        c = sw_bytes(c, &w.to_le_bytes());
    }
    for p in parts {
        c = sw_bytes(c, p);
    }
    !c
}

/// CRC-32C of `b` in one call (the tests' reference form).
#[cfg(test)]
fn crc32c(b: &[u8]) -> u32 {
    crc32c_of(&[], &[b])
}

#[inline]
fn hw() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("sse4.2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn sw_bytes(mut c: u32, b: &[u8]) -> u32 {
    for &x in b {
        c = TABLE[((c ^ x as u32) & 0xff) as usize] ^ (c >> 8);
    }
    c
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
#[inline]
unsafe fn hw_bytes(mut c: u32, b: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    let mut words = b.chunks_exact(8);
    for w in &mut words {
        let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        c = _mm_crc32_u64(c as u64, w) as u32;
    }
    for &x in words.remainder() {
        c = _mm_crc32_u8(c, x);
    }
    c
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn hw_all(mut c: u32, words: &[u64], parts: &[&[u8]]) -> u32 {
    use std::arch::x86_64::_mm_crc32_u64;
    for &w in words {
        c = _mm_crc32_u64(c as u64, w) as u32;
    }
    for p in parts {
        // An 8-byte part (the fast path's key and value): one instruction.
        c = match <[u8; 8]>::try_from(*p) {
            Ok(w) => _mm_crc32_u64(c as u64, u64::from_le_bytes(w)) as u32,
            // SAFETY: `hw_all` runs only where SSE4.2 is present (its own
            // contract), which is all `hw_bytes` needs.
            Err(_) => unsafe { hw_bytes(c, p) },
        };
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        // The check value of CRC-32C (RFC 3720, appendix B.4).
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(b""), 0);
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(portable(&[], &[b"123456789"]), 0xe306_9283);
    }

    #[test]
    fn hardware_and_portable_agree() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for len in 0..200usize {
            let data: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let words = [x, x ^ 1];
            let parts: [&[u8]; 3] = [&data, &data[..len / 2], b"12345678"];
            assert_eq!(
                crc32c_of(&words, &parts),
                portable(&words, &parts),
                "length {len}"
            );
            // A word is its little-endian bytes.
            assert_eq!(crc32c_of(&[x], &[]), crc32c(&x.to_le_bytes()));
        }
    }
}
