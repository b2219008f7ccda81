//! The crash simulator behind `simulated` mode.
//!
//! Beside the live image (what the program reads and writes) it keeps the
//! *persisted image*: what PM would hold after a power failure right now if
//! no dirty line were written back by chance. A flush snapshots the line's
//! contents as they are at the flush; a fence copies every snapshot taken
//! since the last fence into the persisted image.
//!
//! A crash state is the persisted image plus any subset of the lines that
//! are dirty but not guaranteed durable: lines flushed since the last fence
//! (as snapshotted, or with any later stores) and lines written but never
//! flushed (the CPU may evict any dirty line at any time). Those lines are
//! found by comparing the live image with the persisted one, so stores need
//! no instrumentation. The unit is the 64-byte cache line: x86 writes a line
//! back whole, and stores to one line reach PM in program order, so the
//! simulator's choices (old line, flushed snapshot, newest line) are states
//! real hardware can produce.

use std::collections::HashMap;

use crate::persist::CACHE_LINE;

/// Which crash state to build from a crash site.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashChoice {
    /// Only what is guaranteed durable: the persisted image.
    Persisted,
    /// Every dirty line written back, each with its newest contents.
    Newest,
    /// Each dirty line independently: old, flushed snapshot, or newest,
    /// drawn from this seed.
    Random(u64),
    /// Only this cache line (a line number: byte offset / 64) written back,
    /// with its newest contents; every other undecided line old. Catches a
    /// store that becomes durable before one it depends on.
    OnlyNew(u64),
    /// Every undecided line written back except this one, which stays old.
    /// Catches a store that must not be durable without this line.
    AllButOld(u64),
}

pub(crate) struct Sim {
    pub(crate) persisted: Vec<u8>,
    /// Line index → contents at the flush, for lines flushed since the last fence.
    pub(crate) pending: HashMap<u64, [u8; CACHE_LINE]>,
    pub(crate) fences: u64,
    pub(crate) hook: Option<FenceHook>,
    /// The live image at the previous fence, kept while a hook is
    /// installed: lines that differ from it were written since then.
    pub(crate) at_last_fence: Option<Vec<u8>>,
}

/// Called at every fence of a simulated pool, just before the fence takes
/// effect (lines flushed since the previous fence still undecided), with the
/// fence's number and the crash site at that instant.
pub type FenceHook = Box<dyn FnMut(u64, &CrashSite<'_>) + Send>;

impl Sim {
    pub(crate) fn new(persisted: Vec<u8>) -> Sim {
        Sim {
            persisted,
            pending: HashMap::new(),
            fences: 0,
            hook: None,
            at_last_fence: None,
        }
    }

    pub(crate) fn record_flush(&mut self, live: &[u8], off: usize, len: usize) {
        if len == 0 {
            return;
        }
        let first = off / CACHE_LINE;
        let last = (off + len - 1) / CACHE_LINE;
        for line in first..=last {
            let start = line * CACHE_LINE;
            let mut snap = [0u8; CACHE_LINE];
            snap.copy_from_slice(&live[start..start + CACHE_LINE]);
            self.pending.insert(line as u64, snap);
        }
    }

    pub(crate) fn apply_fence(&mut self, live: &[u8]) {
        for (line, snap) in self.pending.drain() {
            let start = line as usize * CACHE_LINE;
            self.persisted[start..start + CACHE_LINE].copy_from_slice(&snap);
        }
        self.fences += 1;
        if let Some(prev) = self.at_last_fence.as_mut() {
            prev.resize(live.len(), 0);
            for (p, l) in prev
                .chunks_exact_mut(CACHE_LINE)
                .zip(live.chunks_exact(CACHE_LINE))
            {
                if p != l {
                    p.copy_from_slice(l);
                }
            }
        }
    }
}

/// A moment at which the simulated machine may lose power.
pub struct CrashSite<'a> {
    pub(crate) live: &'a [u8],
    pub(crate) sim: &'a Sim,
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl CrashSite<'_> {
    /// Lines whose durable contents are not decided: dirty (live differs
    /// from persisted) or flushed and not yet fenced.
    pub fn undecided_lines(&self) -> Vec<u64> {
        let mut lines: Vec<u64> = self
            .live
            .chunks_exact(CACHE_LINE)
            .zip(self.sim.persisted.chunks_exact(CACHE_LINE))
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .map(|(i, _)| i as u64)
            .collect();
        for &l in self.sim.pending.keys() {
            if !lines.contains(&l) {
                lines.push(l);
            }
        }
        lines.sort_unstable();
        lines
    }

    /// The undecided lines written since the previous fence (or flushed
    /// since, and so not yet durable): where the operation in flight works.
    /// Lines left dirty long ago (a lock word released after its line's
    /// flush) are undecided too, but rarely where an ordering bug is.
    /// Without a fence hook installed this is every undecided line.
    pub fn recent_lines(&self) -> Vec<u64> {
        let all = self.undecided_lines();
        let Some(prev) = self.sim.at_last_fence.as_ref() else {
            return all;
        };
        all.into_iter()
            .filter(|&l| {
                let r = l as usize * CACHE_LINE..(l as usize + 1) * CACHE_LINE;
                self.sim.pending.contains_key(&l) || prev.get(r.clone()) != self.live.get(r)
            })
            .collect()
    }

    /// Size of the image in bytes.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// Whether the image has no bytes.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Builds one crash image: the bytes PM would hold after power loss.
    pub fn image(&self, choice: CrashChoice) -> Vec<u8> {
        let mut img = self.sim.persisted.clone();
        let lines = self.undecided_lines();
        let mut rng = match choice {
            CrashChoice::Random(s) => s ^ 0x5bd1_e995,
            _ => 0,
        };
        for line in lines {
            let start = line as usize * CACHE_LINE;
            let range = start..start + CACHE_LINE;
            let pending = self.sim.pending.get(&line);
            let pick = match choice {
                CrashChoice::Persisted => 0,
                CrashChoice::Newest => 2,
                CrashChoice::Random(_) => splitmix(&mut rng) % 3,
                CrashChoice::OnlyNew(j) => 2 * u64::from(line == j),
                CrashChoice::AllButOld(j) => 2 * u64::from(line != j),
            };
            match (pick, pending) {
                (0, _) => {}
                (1, Some(snap)) => img[range].copy_from_slice(snap),
                _ => img[range.clone()].copy_from_slice(&self.live[range]),
            }
        }
        img
    }
}
