//! CRC-32C (Castagnoli), the checksum of log entries (format 2).
//!
//! On x86-64 with SSE4.2 it is one `crc32` instruction per 8 bytes: an
//! entry of an 8-byte key and value costs 8 of them, where the CRC-32 of
//! format 1 (`crc32fast`, whose fast path is for long buffers) took about
//! 240 instructions per entry (callgrind, 2026-11-26). Elsewhere, and on
//! x86-64 without SSE4.2, a table-driven loop computes the same value, so
//! a log written on one machine verifies on any other.
//!
//! [`Crc32c`] is the running state: `new`, any number of `word` and
//! `bytes` calls, then `finish`. A word is fed as its 8 little-endian
//! bytes.

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

/// A CRC-32C in progress.
#[derive(Clone, Copy)]
pub struct Crc32c {
    state: u32,
    hw: bool,
}

impl Default for Crc32c {
    fn default() -> Self {
        Crc32c::new()
    }
}

impl Crc32c {
    #[inline]
    pub fn new() -> Crc32c {
        Crc32c {
            state: !0,
            hw: hw(),
        }
    }

    /// The portable path only (tests compare the two).
    #[cfg(test)]
    fn portable() -> Crc32c {
        Crc32c {
            state: !0,
            hw: false,
        }
    }

    /// Feeds the 8 little-endian bytes of `w`.
    #[inline]
    pub fn word(&mut self, w: u64) {
        #[cfg(target_arch = "x86_64")]
        if self.hw {
            // SAFETY: `hw` is true only where SSE4.2 was detected.
            self.state = unsafe { hw_word(self.state, w) };
            return;
        }
        self.state = sw_bytes(self.state, &w.to_le_bytes());
    }

    /// Feeds `b`.
    #[inline]
    pub fn bytes(&mut self, b: &[u8]) {
        #[cfg(target_arch = "x86_64")]
        if self.hw {
            // SAFETY: as in `word`.
            self.state = unsafe { hw_bytes(self.state, b) };
            return;
        }
        self.state = sw_bytes(self.state, b);
    }

    #[inline]
    pub fn finish(self) -> u32 {
        !self.state
    }
}

/// CRC-32C of `b` in one call.
pub fn crc32c(b: &[u8]) -> u32 {
    let mut c = Crc32c::new();
    c.bytes(b);
    c.finish()
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
unsafe fn hw_word(c: u32, w: u64) -> u32 {
    std::arch::x86_64::_mm_crc32_u64(c as u64, w) as u32
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        // The check value of CRC-32C (RFC 3720, appendix B.4).
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(b""), 0);
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
        let mut c = Crc32c::portable();
        c.bytes(b"123456789");
        assert_eq!(c.finish(), 0xe306_9283);
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
            let (mut a, mut b) = (Crc32c::new(), Crc32c::portable());
            a.word(x);
            b.word(x);
            a.bytes(&data);
            b.bytes(&data);
            assert_eq!(a.finish(), b.finish(), "length {len}");
            // Feeding a word is feeding its little-endian bytes.
            let (mut w, mut by) = (Crc32c::new(), Crc32c::new());
            w.word(x);
            by.bytes(&x.to_le_bytes());
            assert_eq!(w.finish(), by.finish());
        }
    }
}
