//! The workloads `--workload` accepts, and the YCSB operation mixes.
//!
//! The hash engines have no range scans, so on them YCSB E's "short scan"
//! is *emulated by gets*: a scan of length `1..=100` (uniform) is that many
//! consecutive gets from a start index in the key array (loaded keys, then
//! the keys the run inserted), stopping at its end. The store runs a real
//! range scan of that length from the start key (`Store::scan`). A scan
//! counts as one operation, as in YCSB.
//!
//! The store workloads are NStore's (put100, put95-get5, put50-get50,
//! get100, get50-upd50, upd100, delete100) and `recovery`; they run only
//! on the store engine (see [`crate::store_run`]).

use crate::dist::Dist;
use rand::RngExt;

use crate::rng::Rng;

/// Longest emulated scan of YCSB E.
pub(crate) const MAX_SCAN: u64 = 100;

/// One benchmark workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Workload {
    /// Timed inserts of every key into a fresh engine (ops = keys).
    Insert,
    /// Gets of loaded keys.
    GetPos,
    /// Gets of keys known absent.
    GetNeg,
    /// Gets of loaded keys through `get_many`, 64 keys a call (engines
    /// that overlap the misses of a batch override it).
    GetBatch,
    /// Updates of loaded keys.
    Update,
    /// Deletes of distinct loaded keys (ops = at most keys).
    Delete,
    /// 50% read, 50% update.
    YcsbA,
    /// 95% read, 5% update.
    YcsbB,
    /// 100% read.
    YcsbC,
    /// 95% read (latest distribution), 5% insert.
    YcsbD,
    /// 95% scan (emulated by gets), 5% insert.
    YcsbE,
    /// 50% read, 50% read-modify-write.
    YcsbF,
    /// NStore: puts of every key into a fresh store (ops = keys).
    Put100,
    /// NStore: 95% put (overwrite a loaded key), 5% get.
    Put95Get5,
    /// NStore: 50% put (overwrite a loaded key), 50% get.
    Put50Get50,
    /// NStore: gets of loaded keys (values checked).
    Get100,
    /// NStore: 50% get, 50% update.
    Get50Upd50,
    /// NStore: updates of loaded keys.
    Upd100,
    /// NStore: deletes of distinct loaded keys (ops = at most keys).
    Delete100,
    /// Store recovery: the log scan after a crash (with each `--threads`
    /// value as recovery threads) and the clean reopen.
    Recovery,
    /// Store: `--ops` puts of one key, on default-sized (8 MiB) files with
    /// the background GC, reporting the throughput over time.
    Overwrite1,
    /// The same over ten keys (uniform).
    Overwrite10,
    /// The same over `--keys` keys, zipfian with θ = 0.99 (a fresh store:
    /// the first put of a key inserts it).
    OverwriteZipf,
}

/// One operation of a YCSB mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum YcsbOp {
    Read,
    Update,
    Insert,
    Scan,
    ReadModifyWrite,
    /// Overwrite of a present key (the store's `put`; `upsert` elsewhere).
    Put,
}

/// Percentages of each operation in a YCSB workload; they add up to 100.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mix {
    pub read: u32,
    pub update: u32,
    pub insert: u32,
    pub scan: u32,
    pub rmw: u32,
    pub put: u32,
}

impl Mix {
    const fn new(read: u32, update: u32, insert: u32, scan: u32, rmw: u32) -> Mix {
        Mix {
            read,
            update,
            insert,
            scan,
            rmw,
            put: 0,
        }
    }

    const fn put_get(put: u32, read: u32) -> Mix {
        Mix {
            put,
            ..Mix::new(read, 0, 0, 0, 0)
        }
    }

    /// Draws one operation with the mix's probabilities.
    #[inline]
    pub fn choose(&self, rng: &mut Rng) -> YcsbOp {
        let mut x = rng.random_range(0..100u32);
        for (pct, op) in [
            (self.read, YcsbOp::Read),
            (self.update, YcsbOp::Update),
            (self.insert, YcsbOp::Insert),
            (self.scan, YcsbOp::Scan),
            (self.put, YcsbOp::Put),
        ] {
            if x < pct {
                return op;
            }
            x -= pct;
        }
        YcsbOp::ReadModifyWrite
    }
}

impl Workload {
    /// Every workload, in the order of the help text.
    pub const ALL: [Workload; 23] = [
        Workload::Insert,
        Workload::GetPos,
        Workload::GetNeg,
        Workload::GetBatch,
        Workload::Update,
        Workload::Delete,
        Workload::YcsbA,
        Workload::YcsbB,
        Workload::YcsbC,
        Workload::YcsbD,
        Workload::YcsbE,
        Workload::YcsbF,
        Workload::Put100,
        Workload::Put95Get5,
        Workload::Put50Get50,
        Workload::Get100,
        Workload::Get50Upd50,
        Workload::Upd100,
        Workload::Delete100,
        Workload::Recovery,
        Workload::Overwrite1,
        Workload::Overwrite10,
        Workload::OverwriteZipf,
    ];

    /// The workloads run when `--workload` is not given.
    pub const DEFAULT: [Workload; 5] = [
        Workload::Insert,
        Workload::GetPos,
        Workload::GetNeg,
        Workload::Update,
        Workload::Delete,
    ];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Insert => "insert",
            Workload::GetPos => "get-pos",
            Workload::GetNeg => "get-neg",
            Workload::GetBatch => "get-batch",
            Workload::Update => "update",
            Workload::Delete => "delete",
            Workload::YcsbA => "ycsb-a",
            Workload::YcsbB => "ycsb-b",
            Workload::YcsbC => "ycsb-c",
            Workload::YcsbD => "ycsb-d",
            Workload::YcsbE => "ycsb-e",
            Workload::YcsbF => "ycsb-f",
            Workload::Put100 => "put100",
            Workload::Put95Get5 => "put95-get5",
            Workload::Put50Get50 => "put50-get50",
            Workload::Get100 => "get100",
            Workload::Get50Upd50 => "get50-upd50",
            Workload::Upd100 => "upd100",
            Workload::Delete100 => "delete100",
            Workload::Recovery => "recovery",
            Workload::Overwrite1 => "overwrite-1",
            Workload::Overwrite10 => "overwrite-10",
            Workload::OverwriteZipf => "overwrite-zipf",
        }
    }

    /// Parses one `--workload` name.
    pub fn parse(s: &str) -> Result<Workload, String> {
        Workload::ALL
            .into_iter()
            .find(|w| w.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Workload::ALL.iter().map(|w| w.name()).collect();
                format!(
                    "unknown workload {s:?} (expected one of: {})",
                    names.join(", ")
                )
            })
    }

    /// The YCSB operation mix, or `None` for the single-operation workloads.
    pub fn mix(self) -> Option<Mix> {
        match self {
            Workload::YcsbA => Some(Mix::new(50, 50, 0, 0, 0)),
            Workload::YcsbB => Some(Mix::new(95, 5, 0, 0, 0)),
            Workload::YcsbC => Some(Mix::new(100, 0, 0, 0, 0)),
            Workload::YcsbD => Some(Mix::new(95, 0, 5, 0, 0)),
            Workload::YcsbE => Some(Mix::new(0, 0, 5, 95, 0)),
            Workload::YcsbF => Some(Mix::new(50, 0, 0, 0, 50)),
            Workload::Put95Get5 => Some(Mix::put_get(95, 5)),
            Workload::Put50Get50 => Some(Mix::put_get(50, 50)),
            Workload::Get50Upd50 => Some(Mix::new(50, 50, 0, 0, 0)),
            _ => None,
        }
    }

    /// Whether the workload runs only on the store engine (NStore's
    /// workloads and `recovery`).
    pub fn store_only(self) -> bool {
        matches!(
            self,
            Workload::Put100
                | Workload::Put95Get5
                | Workload::Put50Get50
                | Workload::Get100
                | Workload::Get50Upd50
                | Workload::Upd100
                | Workload::Delete100
                | Workload::Recovery
                | Workload::Overwrite1
                | Workload::Overwrite10
                | Workload::OverwriteZipf
        )
    }

    /// Whether the run adds keys beyond the loaded ones (YCSB D and E).
    pub fn inserts_during_run(self) -> bool {
        self.mix().is_some_and(|m| m.insert > 0)
    }

    /// Whether the keys are loaded, untimed, before the timed section
    /// (every workload but `insert` and `put100`).
    pub fn preloads(self) -> bool {
        !matches!(
            self,
            Workload::Insert
                | Workload::Put100
                | Workload::Overwrite1
                | Workload::Overwrite10
                | Workload::OverwriteZipf
        )
    }

    /// The distribution reads and updates use: YCSB D always reads the
    /// latest keys, the others follow `--dist`.
    pub fn request_dist(self, dist: Dist) -> Dist {
        if self == Workload::YcsbD {
            Dist::Latest
        } else {
            dist
        }
    }

    /// Number of operations a run performs for `--keys keys --ops ops`:
    /// `insert`, `put100` and `recovery` do exactly `keys`, `delete` and
    /// `delete100` at most `keys`.
    pub fn op_count(self, keys: u64, ops: u64) -> u64 {
        match self {
            Workload::Insert | Workload::Put100 | Workload::Recovery => keys,
            Workload::Delete | Workload::Delete100 => ops.min(keys),
            _ => ops,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for w in Workload::ALL {
            assert_eq!(Workload::parse(w.name()), Ok(w));
        }
        let err = Workload::parse("ycsb-g").unwrap_err();
        assert!(err.contains("ycsb-g") && err.contains("ycsb-f"), "{err}");
    }

    #[test]
    fn mixes_add_up_and_draw_in_proportion() {
        for w in Workload::ALL {
            if let Some(m) = w.mix() {
                assert_eq!(
                    m.read + m.update + m.insert + m.scan + m.rmw + m.put,
                    100,
                    "{}",
                    w.name()
                );
            }
        }
        let m = Workload::YcsbB.mix().unwrap();
        let mut rng = crate::rng::seeded(4);
        let updates = (0..100_000)
            .filter(|_| m.choose(&mut rng) == YcsbOp::Update)
            .count();
        assert!((4_500..5_500).contains(&updates), "{updates}");
        let f = Workload::YcsbF.mix().unwrap();
        let rmw = (0..10_000)
            .filter(|_| f.choose(&mut rng) == YcsbOp::ReadModifyWrite)
            .count();
        assert!((4_700..5_300).contains(&rmw), "{rmw}");
        let p = Workload::Put95Get5.mix().unwrap();
        let puts = (0..10_000)
            .filter(|_| p.choose(&mut rng) == YcsbOp::Put)
            .count();
        assert!((9_300..9_700).contains(&puts), "{puts}");
    }

    #[test]
    fn op_counts() {
        assert_eq!(Workload::Insert.op_count(10, 99), 10);
        assert_eq!(Workload::Delete.op_count(10, 99), 10);
        assert_eq!(Workload::Delete.op_count(10, 4), 4);
        assert_eq!(Workload::YcsbA.op_count(10, 99), 99);
        assert_eq!(Workload::YcsbD.request_dist(Dist::Uniform), Dist::Latest);
        assert!(Workload::YcsbE.inserts_during_run() && !Workload::YcsbF.inserts_during_run());
        assert_eq!(Workload::Put100.op_count(10, 99), 10);
        assert_eq!(Workload::Delete100.op_count(10, 4), 4);
        assert!(!Workload::Put100.preloads() && Workload::Get100.preloads());
        let store_only: Vec<&str> = Workload::ALL
            .iter()
            .filter(|w| w.store_only())
            .map(|w| w.name())
            .collect();
        assert_eq!(
            store_only,
            [
                "put100",
                "put95-get5",
                "put50-get50",
                "get100",
                "get50-upd50",
                "upd100",
                "delete100",
                "recovery",
                "overwrite-1",
                "overwrite-10",
                "overwrite-zipf"
            ]
        );
        assert!(!Workload::Overwrite1.preloads() && !Workload::OverwriteZipf.preloads());
    }
}
