//! Byte-level mutations over a seed, the classic set: bit flips, byte
//! sets, interesting bytes and integers, inserted and deleted ranges,
//! splices from the input itself, truncations.

use crate::Rng;

/// Bytes that matter to a text protocol and to integer fields.
pub(crate) const BYTES: [u8; 16] = [
    0, 0xff, 0x7f, 0x80, b'\r', b'\n', b'*', b'$', b'-', b'0', b'9', b' ', b'[', b']', b'\\', b'?',
];

/// Integers, as text, that sit on a boundary somewhere.
pub(crate) const NUMBERS: [&str; 18] = [
    "0",
    "-0",
    "1",
    "-1",
    "-2",
    "00",
    "+1",
    "127",
    "65535",
    "65537",
    "1048576",
    "1052673",
    "2147483648",
    "4294967296",
    "9223372036854775807",
    "-9223372036854775808",
    "9223372036854775808",
    "18446744073709551616",
];

/// A position in `0..=len`.
fn pos(rng: &mut Rng, len: usize) -> usize {
    rng.below(len as u64 + 1) as usize
}

/// Applies 1 to `max_ops` random mutations to `data`, keeping it at most
/// `max_len` bytes long.
pub(crate) fn mutate(rng: &mut Rng, data: &mut Vec<u8>, max_ops: u64, max_len: usize) {
    for _ in 0..1 + rng.below(max_ops) {
        let len = data.len();
        match rng.below(10) {
            0 if len > 0 => {
                let i = rng.below(len as u64) as usize;
                data[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len as u64) as usize;
                data[i] = rng.next() as u8;
            }
            2 if len > 0 => {
                let i = rng.below(len as u64) as usize;
                data[i] = BYTES[rng.below(BYTES.len() as u64) as usize];
            }
            3 => {
                let at = pos(rng, len);
                let n = NUMBERS[rng.below(NUMBERS.len() as u64) as usize];
                data.splice(at..at, n.bytes());
            }
            4 if len > 0 => {
                // Replace a run of digits (a length, an integer argument)
                // with an interesting number.
                let i = rng.below(len as u64) as usize;
                let mut j = i;
                while j < len && data[j].is_ascii_digit() {
                    j += 1;
                }
                let n = NUMBERS[rng.below(NUMBERS.len() as u64) as usize];
                data.splice(i..j, n.bytes());
            }
            5 if len > 0 => {
                let a = rng.below(len as u64) as usize;
                let b = (a + 1 + rng.below(16) as usize).min(len);
                data.drain(a..b);
            }
            6 if len > 0 => {
                // Splice: a copy of a range of the input, somewhere else.
                let a = rng.below(len as u64) as usize;
                let b = (a + 1 + rng.below(64) as usize).min(len);
                let piece = data[a..b].to_vec();
                let at = pos(rng, len);
                data.splice(at..at, piece);
            }
            7 => {
                let at = pos(rng, len);
                let n = 1 + rng.below(8) as usize;
                let fill: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                data.splice(at..at, fill);
            }
            8 if len > 0 => {
                let at = pos(rng, len);
                data.truncate(at);
            }
            _ => {
                let at = pos(rng, len);
                let c = BYTES[rng.below(BYTES.len() as u64) as usize];
                let n = 1 + rng.below(4) as usize;
                data.splice(at..at, vec![c; n]);
            }
        }
        data.truncate(max_len);
    }
}
