//! Pool-image patch helpers: words written into, and read out of, a pool
//! file's bytes, and the header's state slot rewritten with its CRC fixed.

/// The pool header's two state slots (docs/format.md): the only bytes a
/// writable open of a pool the engine refuses may change.
pub const STATE_SLOTS: std::ops::Range<usize> = 64..192;

/// `bytes` with each (offset, word) written little-endian.
pub fn patch(bytes: &[u8], words: &[(u64, u64)]) -> Vec<u8> {
    let mut v = bytes.to_vec();
    for &(off, w) in words {
        v[off as usize..off as usize + 8].copy_from_slice(&w.to_le_bytes());
    }
    v
}

/// `bytes` with the byte at `off` set to `b`.
pub fn patch_byte(bytes: &[u8], off: u64, b: u8) -> Vec<u8> {
    let mut v = bytes.to_vec();
    v[off as usize] = b;
    v
}

/// The little-endian word at `off`.
pub fn word(bytes: &[u8], off: u64) -> u64 {
    u64::from_le_bytes(bytes[off as usize..off as usize + 8].try_into().unwrap())
}

/// Rewrites the header's current state slot through `f` (CRC fixed).
pub fn edit_state(bytes: &mut [u8], f: impl FnOnce(&mut pmem::header::State)) {
    use pmem::header::{State, SLOT_LEN, SLOT_OFFSET};
    let (mut st, slot) = State::current(&bytes[..4096]).unwrap();
    f(&mut st);
    let off = SLOT_OFFSET + slot * SLOT_LEN;
    bytes[off..off + SLOT_LEN].copy_from_slice(&st.encode());
}

/// Clears the clean flag, as a crash would have left it (open then runs
/// crash recovery).
pub fn clear_clean_flag(bytes: &mut [u8]) {
    edit_state(bytes, |s| s.clean = 0);
}
