//! The pool header: its byte layout, encoding, and validation.
//!
//! The layout is documented byte by byte in `docs/format.md`; keep the two in
//! step. All integers are little-endian.
//!
//! ```text
//! 0    ..64    identity line   written once at create, CRC-protected
//! 64   ..128   state slot A    \ double-buffered mutable state: the valid
//! 128  ..192   state slot B    / slot with the higher sequence number wins
//! 192  ..4096  reserved, zero
//! ```
//!
//! A state update writes the *other* slot with sequence + 1 and persists it:
//! a crash in the middle leaves a slot whose CRC fails, and the previous one
//! stays in force. That makes size, root and the clean flag failure-atomic
//! together without relying on more than 8-byte store atomicity.

use crate::error::{Error, Result};

/// First eight bytes of every pool file.
pub(crate) const MAGIC: [u8; 8] = *b"PMHASHPL";
/// The format version this build writes and reads.
pub(crate) const FORMAT_VERSION: u32 = 1;
/// Bytes reserved for the header at the start of the pool.
pub const HEADER_LEN: usize = 4096;
/// Longest layout id (engine name) a header can hold.
pub(crate) const LAYOUT_MAX: usize = 16;
/// Offset of state slot A; slot B follows 64 bytes later.
pub const SLOT_OFFSET: usize = 64;
/// Size of one state slot.
pub const SLOT_LEN: usize = 64;

/// The immutable part of the header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// Format version of the pool file.
    pub version: u32,
    /// Layout id: the name of the engine the pool was created for.
    pub layout: String,
    /// Random id of this pool, fixed at create.
    pub uuid: [u8; 16],
    /// Creation time, in nanoseconds since the Unix epoch.
    pub created_unix_ns: u64,
    /// Allocation granule of the heap, in bytes.
    pub chunk_size: u32,
}

/// The mutable part of the header (one state slot).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct State {
    /// Sequence number; the valid slot with the higher one is current.
    pub seq: u64,
    /// Pool size in bytes (the file may be longer after an interrupted grow).
    pub size: u64,
    /// Offset of the engine's root block, 0 if none yet.
    pub root: u64,
    /// 1 after a clean close, 0 while open (or after a crash).
    pub clean: u64,
    /// How many times the pool was opened for writing.
    pub opens: u64,
    /// Offset of a second root block, 0 if none: a structure that shares
    /// the pool with the engine (the store's log beside its hash index).
    pub aux: u64,
}

fn crc(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl Identity {
    /// A 64-bit value derived from the pool's uuid: engines seed their
    /// key hash with it (fixed for the pool's life, different per pool).
    pub fn seed(&self) -> u64 {
        let a = u64::from_le_bytes(self.uuid[..8].try_into().expect("8 bytes"));
        let b = u64::from_le_bytes(self.uuid[8..].try_into().expect("8 bytes"));
        a ^ b.rotate_left(29)
    }

    /// Encodes the 64-byte identity line.
    pub fn encode(&self) -> Result<[u8; 64]> {
        let lb = self.layout.as_bytes();
        if lb.is_empty() || lb.len() > LAYOUT_MAX || !lb.iter().all(|c| c.is_ascii_graphic()) {
            return Err(Error::InvalidArgument(format!(
                "layout id {:?} must be 1 to {LAYOUT_MAX} printable ASCII characters",
                self.layout
            )));
        }
        let mut b = [0u8; 64];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
        b[16..16 + lb.len()].copy_from_slice(lb);
        b[32..48].copy_from_slice(&self.uuid);
        b[48..56].copy_from_slice(&self.created_unix_ns.to_le_bytes());
        b[56..60].copy_from_slice(&self.chunk_size.to_le_bytes());
        let c = crc(&b[0..60]);
        b[60..64].copy_from_slice(&c.to_le_bytes());
        Ok(b)
    }

    /// Decodes and validates the identity line: magic, then version, then
    /// checksum, then field invariants.
    pub fn decode(b: &[u8]) -> Result<Identity> {
        if b.len() < 64 {
            return Err(Error::Truncated(format!(
                "{} bytes, a header needs {HEADER_LEN}",
                b.len()
            )));
        }
        if b[0..8] != MAGIC {
            return Err(Error::Foreign(format!(
                "magic is {:02x?}, expected {:02x?} (\"PMHASHPL\")",
                &b[0..8],
                MAGIC
            )));
        }
        let version = le_u32(b, 8);
        if version != FORMAT_VERSION {
            return Err(Error::Version {
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        let stored = le_u32(b, 60);
        let computed = crc(&b[0..60]);
        if stored != computed {
            return Err(Error::Corrupt(format!(
                "identity checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
            )));
        }
        let header_len = le_u32(b, 12);
        if header_len as usize != HEADER_LEN {
            return Err(Error::Corrupt(format!(
                "header length {header_len}, expected {HEADER_LEN}"
            )));
        }
        let raw = &b[16..32];
        let end = raw.iter().position(|&c| c == 0).unwrap_or(LAYOUT_MAX);
        if end == 0
            || raw[end..].iter().any(|&c| c != 0)
            || !raw[..end].iter().all(|c| c.is_ascii_graphic())
        {
            return Err(Error::Corrupt(
                "layout id is not NUL-padded printable ASCII".into(),
            ));
        }
        let layout = String::from_utf8_lossy(&raw[..end]).into_owned();
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[32..48]);
        Ok(Identity {
            version,
            layout,
            uuid,
            created_unix_ns: le_u64(b, 48),
            chunk_size: le_u32(b, 56),
        })
    }
}

impl State {
    /// Encodes one 64-byte state slot.
    pub fn encode(&self) -> [u8; SLOT_LEN] {
        let mut b = [0u8; SLOT_LEN];
        b[0..8].copy_from_slice(&self.seq.to_le_bytes());
        b[8..16].copy_from_slice(&self.size.to_le_bytes());
        b[16..24].copy_from_slice(&self.root.to_le_bytes());
        b[24..32].copy_from_slice(&self.clean.to_le_bytes());
        b[32..40].copy_from_slice(&self.opens.to_le_bytes());
        b[40..48].copy_from_slice(&self.aux.to_le_bytes());
        let c = crc(&b[0..60]);
        b[60..64].copy_from_slice(&c.to_le_bytes());
        b
    }

    /// Decodes a slot; `None` if it was never written or its checksum fails
    /// (a torn update).
    pub fn decode(b: &[u8]) -> Option<State> {
        let s = State {
            seq: le_u64(b, 0),
            size: le_u64(b, 8),
            root: le_u64(b, 16),
            clean: le_u64(b, 24),
            opens: le_u64(b, 32),
            aux: le_u64(b, 40),
        };
        if s.seq == 0 || le_u32(b, 60) != crc(&b[0..60]) || b[48..60].iter().any(|&c| c != 0) {
            return None;
        }
        Some(s)
    }

    /// The current state of a header page: the valid slot with the higher
    /// sequence number, and its index (0 = A, 1 = B).
    pub fn current(header: &[u8]) -> Result<(State, usize)> {
        let a = State::decode(&header[SLOT_OFFSET..SLOT_OFFSET + SLOT_LEN]);
        let b = State::decode(&header[SLOT_OFFSET + SLOT_LEN..SLOT_OFFSET + 2 * SLOT_LEN]);
        match (a, b) {
            (Some(a), Some(b)) if a.seq == b.seq => Err(Error::Corrupt(format!(
                "both state slots carry sequence {}",
                a.seq
            ))),
            (Some(a), Some(b)) => Ok(if a.seq > b.seq { (a, 0) } else { (b, 1) }),
            (Some(a), None) => Ok((a, 0)),
            (None, Some(b)) => Ok((b, 1)),
            (None, None) => Err(Error::Corrupt(
                "no valid state slot (both checksums fail)".into(),
            )),
        }
    }
}

/// Decodes and validates a whole header page (identity, state, reserved
/// bytes) against the file length. Reads only.
pub(crate) fn validate(
    header: &[u8],
    file_len: u64,
    min_size: u64,
) -> Result<(Identity, State, usize)> {
    if header.len() < HEADER_LEN {
        return Err(Error::Truncated(format!(
            "file is {} bytes, smaller than the {HEADER_LEN}-byte header",
            header.len()
        )));
    }
    let id = Identity::decode(header)?;
    let (st, slot) = State::current(header)?;
    if header[SLOT_OFFSET + 2 * SLOT_LEN..HEADER_LEN]
        .iter()
        .any(|&c| c != 0)
    {
        return Err(Error::Corrupt(
            "reserved header bytes 192..4096 are not zero".into(),
        ));
    }
    let chunk = id.chunk_size as u64;
    if chunk == 0 || !chunk.is_power_of_two() {
        return Err(Error::Corrupt(format!(
            "chunk size {chunk} is not a power of two"
        )));
    }
    if st.size < min_size || st.size % chunk != 0 {
        return Err(Error::Corrupt(format!(
            "pool size {} is not a multiple of the {chunk}-byte chunk of at least {min_size} bytes",
            st.size
        )));
    }
    if file_len < st.size {
        return Err(Error::Truncated(format!(
            "header says {} bytes, file has {file_len}",
            st.size
        )));
    }
    if st.root != 0 && (st.root < chunk || st.root >= st.size || st.root % 8 != 0) {
        return Err(Error::Corrupt(format!(
            "root offset {:#x} outside the heap",
            st.root
        )));
    }
    if st.aux != 0 && (st.aux < chunk || st.aux >= st.size || st.aux % 8 != 0) {
        return Err(Error::Corrupt(format!(
            "aux root offset {:#x} outside the heap",
            st.aux
        )));
    }
    if st.clean > 1 {
        return Err(Error::Corrupt(format!(
            "clean flag is {}, expected 0 or 1",
            st.clean
        )));
    }
    Ok((id, st, slot))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page() -> Vec<u8> {
        let id = Identity {
            version: FORMAT_VERSION,
            layout: "test".into(),
            uuid: [7; 16],
            created_unix_ns: 42,
            chunk_size: 1 << 18,
        };
        let mut p = vec![0u8; HEADER_LEN];
        p[0..64].copy_from_slice(&id.encode().unwrap());
        let st = State {
            seq: 1,
            size: 1 << 20,
            root: 0,
            clean: 0,
            opens: 1,
            aux: 0,
        };
        p[64..128].copy_from_slice(&st.encode());
        p
    }

    #[test]
    fn round_trip() {
        let p = page();
        let (id, st, slot) = validate(&p, 1 << 20, 1 << 19).unwrap();
        assert_eq!(id.layout, "test");
        assert_eq!(st.size, 1 << 20);
        assert_eq!(slot, 0);
    }

    #[test]
    fn newer_slot_wins_and_torn_slot_is_ignored() {
        let mut p = page();
        let st2 = State {
            seq: 2,
            size: 1 << 20,
            root: 1 << 18,
            clean: 1,
            opens: 1,
            aux: 1 << 19,
        };
        p[128..192].copy_from_slice(&st2.encode());
        let (_, st, slot) = validate(&p, 1 << 20, 1 << 19).unwrap();
        assert_eq!((st.seq, slot, st.root, st.aux), (2, 1, 1 << 18, 1 << 19));
        p[150] ^= 1; // tear slot B
        let (_, st, slot) = validate(&p, 1 << 20, 1 << 19).unwrap();
        assert_eq!((st.seq, slot), (1, 0));
    }

    #[test]
    fn rejects_bad_layout_names() {
        for bad in ["", "seventeen-chars!!", "a b", "é"] {
            let id = Identity {
                version: 1,
                layout: bad.into(),
                uuid: [0; 16],
                created_unix_ns: 0,
                chunk_size: 1 << 18,
            };
            assert!(id.encode().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn each_failure_has_its_error() {
        let p = page();
        assert!(matches!(
            validate(&p[..100], 100, 1),
            Err(Error::Truncated(_))
        ));
        let mut f = p.clone();
        f[0] = b'X';
        assert!(matches!(validate(&f, 1 << 20, 1), Err(Error::Foreign(_))));
        let mut v = p.clone();
        v[8] = 9;
        assert!(matches!(
            validate(&v, 1 << 20, 1),
            Err(Error::Version { found: 9, .. })
        ));
        let mut c = p.clone();
        c[40] ^= 0xff;
        assert!(matches!(validate(&c, 1 << 20, 1), Err(Error::Corrupt(_))));
        assert!(matches!(validate(&p, 1 << 19, 1), Err(Error::Truncated(_))));
        let mut r = p.clone();
        r[3000] = 1;
        assert!(matches!(validate(&r, 1 << 20, 1), Err(Error::Corrupt(_))));
    }
}
