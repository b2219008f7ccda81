//! Level hashing's bytes in the pool. `docs/engines/level.md` draws the
//! same layout; keep the two in step.
//!
//! ```text
//! root block (the pool root, 8 KiB)
//!   0     magic "LEVELHS1"
//!   8     seed 1          \ hash seeds, random at create
//!   16    seed 2          /
//!   24    selector        sequence number of the current geometry record
//!   32    top count       \ item counts per level, written at clean close;
//!   40    bottom count     | trusted only when the pool was closed cleanly
//!   48    interim count   /
//!   56    min top buckets the table never shrinks below
//!   64    record 0        \ geometry records; record (selector % 2) is
//!   128   record 1        / current; see `Record`
//!   192   log slot 0..63  64 bytes each; see `LogRecord`
//!
//! level block: n buckets of 128 bytes, from the first 128-aligned offset
//!   bucket = 2 lines; line (64 bytes) =
//!   0     lock word       DRAM semantics only (epoch-tagged, `engine::sync`)
//!   8     header          bit i = token of slot i (1 valid, 0 empty), i < 3;
//!                         bits 8+8i..16+8i = slot i's 8-bit key fingerprint
//!   16    slot 0 key, 24 slot 0 value
//!   32    slot 1 key, 40 slot 1 value
//!   48    slot 2 key, 56 slot 2 value
//! ```

pub(crate) const ROOT_MAGIC: u64 = u64::from_le_bytes(*b"LEVELHS1");
pub(crate) const ROOT_BYTES: u64 = 8192;
pub(crate) const R_SEED1: u64 = 8;
pub(crate) const R_SEED2: u64 = 16;
pub(crate) const R_SELECTOR: u64 = 24;
pub(crate) const R_COUNTS: u64 = 32;
pub(crate) const R_MIN_TOP: u64 = 56;
pub(crate) const R_RECORDS: u64 = 64;
pub(crate) const R_LOGS: u64 = 192;
pub(crate) const LOG_SLOTS: usize = 64;

pub(crate) const LINE: u64 = 64;
pub(crate) const BUCKET: u64 = 128;
pub(crate) const SLOTS_PER_LINE: usize = 3;
pub(crate) const SLOTS_PER_BUCKET: u64 = 6;
pub(crate) const W_LOCK: usize = 0;
pub(crate) const W_HDR: usize = 1;
pub(crate) const TOKEN_MASK: u64 = 0b111;
pub(crate) const FP_SHIFT: u32 = 8;
pub(crate) const FP_MASK: u64 = 0xff_ffff << FP_SHIFT;

#[inline]
pub(crate) fn w_key(slot: usize) -> usize {
    2 + 2 * slot
}

#[inline]
pub(crate) fn w_val(slot: usize) -> usize {
    3 + 2 * slot
}

/// Bytes to allocate for a level of `n` buckets (room to align to 128).
pub(crate) fn level_alloc_bytes(n: u64) -> u64 {
    n * BUCKET + 64
}

/// First bucket of a level block.
pub(crate) fn level_base(raw: u64) -> u64 {
    raw.div_ceil(BUCKET) * BUCKET
}

/// What the table is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Normal = 0,
    /// Top = new (2N), bottom = old top (N), interim = old bottom (N/2).
    Expanding = 1,
    /// Top = old bottom (N/2), bottom = new (N/4), interim = old top (N).
    Shrinking = 2,
}

/// One level: its block and bucket count (0 = absent).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Lvl {
    pub(crate) raw: u64,
    pub(crate) n: u64,
}

impl Lvl {
    pub(crate) fn base(&self) -> u64 {
        level_base(self.raw)
    }
    pub(crate) fn present(&self) -> bool {
        self.n != 0
    }
    /// Offset of bucket `b`'s first line.
    #[inline]
    pub(crate) fn bucket(&self, b: u64) -> u64 {
        level_base(self.raw) + b * BUCKET
    }
}

/// A geometry record: 8 words, the last one = phase (low 32 bits) and a
/// CRC-32 of the first 60 bytes (high 32 bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) seq: u64,
    pub(crate) top: Lvl,
    pub(crate) bot: Lvl,
    pub(crate) il: Lvl,
    pub(crate) phase: Phase,
}

impl Record {
    pub(crate) fn encode(&self) -> [u64; 8] {
        let mut w = [
            self.seq,
            self.top.raw,
            self.top.n,
            self.bot.raw,
            self.bot.n,
            self.il.raw,
            self.il.n,
            self.phase as u64,
        ];
        w[7] |= (crc_words(&w) as u64) << 32;
        w
    }

    pub(crate) fn decode(w: &[u64; 8]) -> Option<Record> {
        if (w[7] >> 32) as u32 != crc_words(w) {
            return None;
        }
        let phase = match w[7] & 0xffff_ffff {
            0 => Phase::Normal,
            1 => Phase::Expanding,
            2 => Phase::Shrinking,
            _ => return None,
        };
        Some(Record {
            seq: w[0],
            top: Lvl { raw: w[1], n: w[2] },
            bot: Lvl { raw: w[3], n: w[4] },
            il: Lvl { raw: w[5], n: w[6] },
            phase,
        })
    }
}

/// CRC-32 of the first 60 bytes of an 8-word record (the low half of the
/// last word included, its high half excluded).
pub(crate) fn crc_words(w: &[u64; 8]) -> u32 {
    let mut b = [0u8; 60];
    for (i, word) in w.iter().enumerate().take(7) {
        b[i * 8..i * 8 + 8].copy_from_slice(&word.to_le_bytes());
    }
    b[56..60].copy_from_slice(&(w[7] as u32).to_le_bytes());
    crc32fast::hash(&b)
}

/// What a log slot records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LogKind {
    /// Undo record of an in-place update: the old value of `key` at
    /// (`src_line`, `src_slot`).
    Update = 1,
    /// A move of `key` from (`src_line`, `src_slot`) to (`dst_line`,
    /// `dst_slot`): if both copies are valid after a crash, the source is
    /// cleared.
    Move = 2,
}

/// A log slot: [kind, src line, src slot, key, value, dst line, dst slot,
/// crc32 of the first 56 bytes].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LogRecord {
    pub(crate) kind: LogKind,
    pub(crate) src_line: u64,
    pub(crate) src_slot: u64,
    pub(crate) key: u64,
    pub(crate) value: u64,
    pub(crate) dst_line: u64,
    pub(crate) dst_slot: u64,
}

impl LogRecord {
    pub(crate) fn encode(&self) -> [u64; 8] {
        let mut w = [
            self.kind as u64,
            self.src_line,
            self.src_slot,
            self.key,
            self.value,
            self.dst_line,
            self.dst_slot,
            0,
        ];
        w[7] = crc_words(&w) as u64;
        w
    }

    /// `None` for an empty slot or one torn while being written (its
    /// operation had not started changing the table).
    pub(crate) fn decode(w: &[u64; 8]) -> Option<LogRecord> {
        let kind = match w[0] {
            1 => LogKind::Update,
            2 => LogKind::Move,
            _ => return None,
        };
        let mut c = *w;
        c[7] = 0;
        if w[7] != crc_words(&c) as u64 {
            return None;
        }
        Some(LogRecord {
            kind,
            src_line: w[1],
            src_slot: w[2],
            key: w[3],
            value: w[4],
            dst_line: w[5],
            dst_slot: w[6],
        })
    }
}

// ----- the line header word ---------------------------------------------------

#[inline]
pub(crate) fn free_slot(hdr: u64) -> Option<usize> {
    let free = !hdr & TOKEN_MASK;
    (free != 0).then(|| free.trailing_zeros() as usize)
}

#[inline]
pub(crate) fn free_count(hdr: u64) -> u32 {
    (!hdr & TOKEN_MASK).count_ones()
}

/// The 8-bit fingerprint of a key (from its first hash's top byte).
#[inline]
pub(crate) fn fingerprint(h0: u64) -> u64 {
    h0 >> 56
}

/// Slots of a line whose token is set and whose fingerprint is `fp`.
#[inline(always)]
pub(crate) fn fp_candidates(hdr: u64, fp: u64) -> u64 {
    let x = (hdr >> FP_SHIFT) ^ (fp * 0x01_0101);
    let zero = ((x & 0xff) == 0) as u64
        | (((x >> 8) & 0xff == 0) as u64) << 1
        | (((x >> 16) & 0xff == 0) as u64) << 2;
    zero & hdr & TOKEN_MASK
}

/// `hdr` with slot `s` valid and carrying fingerprint `fp`.
#[inline]
pub(crate) fn with_slot(hdr: u64, s: usize, fp: u64) -> u64 {
    let shift = FP_SHIFT + 8 * s as u32;
    (hdr & !(0xff << shift)) | (fp << shift) | (1 << s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_detect_tears() {
        let r = Record {
            seq: 9,
            top: Lvl {
                raw: 1 << 20,
                n: 64,
            },
            bot: Lvl {
                raw: 3 << 20,
                n: 32,
            },
            il: Lvl { raw: 0, n: 0 },
            phase: Phase::Normal,
        };
        let mut w = r.encode();
        assert_eq!(Record::decode(&w), Some(r));
        w[2] ^= 1;
        assert_eq!(Record::decode(&w), None);
        let l = LogRecord {
            kind: LogKind::Move,
            src_line: 1,
            src_slot: 2,
            key: 3,
            value: 4,
            dst_line: 5,
            dst_slot: 6,
        };
        let mut w = l.encode();
        assert_eq!(LogRecord::decode(&w), Some(l));
        w[3] ^= 1 << 40;
        assert_eq!(LogRecord::decode(&w), None);
        assert_eq!(LogRecord::decode(&[0; 8]), None);
    }

    #[test]
    fn line_words_fit() {
        assert_eq!(w_val(SLOTS_PER_LINE - 1), 7);
        assert_eq!(level_base(64), 128);
        assert_eq!(level_base(256), 256);
    }
}
