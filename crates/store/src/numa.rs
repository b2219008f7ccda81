//! NUMA: which node a thread runs on, which node a file lives on, and the
//! exact count of local and remote PM accesses.
//!
//! - **Real nodes.** `/sys/devices/system/node/node*/cpulist` gives the
//!   CPU → node map; a thread's node is the node of the CPU it runs on
//!   (`sched_getcpu`, re-read every 256 calls). With several nodes, a new
//!   Nlog file's pages are bound to its node (`mbind`, preferred) and the
//!   store's own threads (GC, scan readers) are pinned to their node's CPUs.
//! - **Emulated nodes** (`numa_emulate = N`): thread *t* (its
//!   [`thread_index`]) belongs to virtual node `t mod N`. Nothing is bound,
//!   but placement decisions, counters and latency injection behave as on
//!   an N-node machine.
//! - **Counters.** Every log read and append is counted local or remote
//!   against the node in its `v_addr`. They are exact: one count per access.
//! - **Latency injection.** `remote_latency_ns` > 0 adds a busy wait to each
//!   remote access, a stand-in for the ~1.6× remote PM latency of the paper.

use std::time::{Duration, Instant};

use engine::sync::{thread_index, Counter};

/// Node of each CPU, from sysfs; `[0; n]` when sysfs says nothing.
pub(crate) fn cpu_nodes() -> Vec<u32> {
    let mut map: Vec<u32> = Vec::new();
    let Ok(dir) = std::fs::read_dir("/sys/devices/system/node") else {
        return map;
    };
    for ent in dir.flatten() {
        let name = ent.file_name().to_string_lossy().into_owned();
        let Some(node) = name
            .strip_prefix("node")
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(list) = std::fs::read_to_string(ent.path().join("cpulist")) else {
            continue;
        };
        for cpu in parse_cpulist(list.trim()) {
            if map.len() <= cpu {
                map.resize(cpu + 1, 0);
            }
            map[cpu] = node;
        }
    }
    map
}

/// `"0-3,8,10-11"` → the CPUs.
pub(crate) fn parse_cpulist(s: &str) -> Vec<usize> {
    let mut v = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.trim().parse::<usize>(), b.trim().parse::<usize>()) {
                    v.extend(a..=b);
                }
            }
            None => {
                if let Ok(c) = part.trim().parse() {
                    v.push(c)
                }
            }
        }
    }
    v
}

/// Number of real nodes.
pub fn detect_nodes() -> u32 {
    cpu_nodes().iter().copied().max().map_or(1, |m| m + 1)
}

/// The node `numa_emulate: Some(nodes)` puts the calling thread on (a
/// store with that many nodes writes the thread's entries to that node's
/// log).
pub fn emulated_node(nodes: u32) -> u32 {
    Numa::new(nodes, Some(nodes), 0).current()
}

/// The node map of a store (real or emulated nodes) and its local/remote
/// access counters.
pub(crate) struct Numa {
    /// Nodes the log is split over (the pool's, fixed at create).
    pub nodes: u32,
    /// `Some(n)`: virtual nodes by thread index.
    emulate: Option<u32>,
    cpu_node: Vec<u32>,
    remote_latency: Duration,
    /// Reads of an entry on the reader's own node.
    pub local_reads: Counter,
    /// Reads of an entry on another node.
    pub remote_reads: Counter,
    /// Writes to the writer's own node.
    pub local_writes: Counter,
    /// Writes to another node.
    pub remote_writes: Counter,
}

thread_local! {
    /// A node forced on this thread by [`Numa::as_node`].
    static FORCED: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
    static CPU_CACHE: std::cell::Cell<(u32, u32)> = const { std::cell::Cell::new((0, 0)) };
}

impl Numa {
    /// `nodes` nodes (at least 1); `emulate: Some(n)` gives threads `n`
    /// virtual nodes by thread index instead of the CPUs' real ones;
    /// a remote access waits `remote_latency_ns` more.
    pub(crate) fn new(nodes: u32, emulate: Option<u32>, remote_latency_ns: u64) -> Numa {
        Numa {
            nodes: nodes.max(1),
            emulate,
            cpu_node: if emulate.is_some() {
                Vec::new()
            } else {
                cpu_nodes()
            },
            remote_latency: Duration::from_nanos(remote_latency_ns),
            local_reads: Counter::default(),
            remote_reads: Counter::default(),
            local_writes: Counter::default(),
            remote_writes: Counter::default(),
        }
    }

    /// Whether the nodes are virtual (`numa_emulate`).
    pub(crate) fn is_emulated(&self) -> bool {
        self.emulate.is_some()
    }

    /// Whether files and threads are really placed (several real nodes).
    pub(crate) fn places(&self) -> bool {
        self.emulate.is_none() && self.nodes > 1
    }

    /// Runs `f` as if the calling thread were on `node` (the crash
    /// checker's engine form uses it to spread one thread's writes over
    /// every node's log, so that a key's entries cross nodes).
    pub(crate) fn as_node<R>(node: u32, f: impl FnOnce() -> R) -> R {
        let prev = FORCED.with(|c| c.replace(Some(node)));
        let r = f();
        FORCED.with(|c| c.set(prev));
        r
    }

    /// The calling thread's node, in `0..nodes`. Every write asks, so the
    /// one-node answer is inlined and the rest kept out of line.
    #[inline(always)]
    pub(crate) fn current(&self) -> u32 {
        if self.nodes == 1 {
            return 0;
        }
        self.current_of_many()
    }

    /// [`current`](Self::current) with more than one node.
    #[inline(never)]
    fn current_of_many(&self) -> u32 {
        if let Some(n) = FORCED.with(|c| c.get()) {
            return n % self.nodes;
        }
        if let Some(n) = self.emulate {
            return (thread_index() as u32 % n.max(1)) % self.nodes;
        }
        CPU_CACHE.with(|c| {
            let (node, calls) = c.get();
            if calls % 256 != 0 {
                c.set((node, calls.wrapping_add(1)));
                return node;
            }
            // SAFETY: sched_getcpu has no arguments and no side effects.
            let cpu = unsafe { libc::sched_getcpu() };
            let node = usize::try_from(cpu)
                .ok()
                .and_then(|c| self.cpu_node.get(c).copied())
                .unwrap_or(0)
                % self.nodes;
            c.set((node, calls.wrapping_add(1)));
            node
        })
    }

    /// Counts a read of an entry on `node` by a thread on `here`, local or
    /// remote (a remote one waits the remote latency).
    #[inline]
    pub(crate) fn count_read(&self, node: u32, here: u32) {
        if node == here {
            self.local_reads.add(1);
        } else {
            self.remote_reads.add(1);
            self.delay();
        }
    }

    /// Counts a write to `node` by a thread on `here`, local or remote (a
    /// remote one waits the remote latency).
    #[inline]
    pub(crate) fn count_write(&self, node: u32, here: u32) {
        if node == here {
            self.local_writes.add(1);
        } else {
            self.remote_writes.add(1);
            self.delay();
        }
    }

    #[inline]
    fn delay(&self) {
        if self.remote_latency.is_zero() {
            return;
        }
        let t = Instant::now();
        while t.elapsed() < self.remote_latency {
            std::hint::spin_loop();
        }
    }

    /// Binds `len` bytes at `addr` to `node` (preferred), on real
    /// multi-node machines; a no-op elsewhere. Best effort: placement is a
    /// performance hint, never a correctness matter.
    pub(crate) fn place(&self, addr: *const u8, len: usize, node: u32) {
        if !self.places() || node >= 64 {
            return;
        }
        const MPOL_PREFERRED: libc::c_long = 1;
        let mask: u64 = 1 << node;
        let page = 4096usize;
        let start = (addr as usize) & !(page - 1);
        let end = (addr as usize + len).next_multiple_of(page);
        // SAFETY: mbind only changes the placement policy of pages we map;
        // the mask outlives the call and maxnode covers its 64 bits.
        unsafe {
            libc::syscall(
                libc::SYS_mbind,
                start,
                end - start,
                MPOL_PREFERRED,
                &mask as *const u64,
                64usize,
                0usize,
            );
        }
    }

    /// Pins the calling thread to the CPUs of `node` (real nodes only).
    pub(crate) fn pin_thread(&self, node: u32) {
        if !self.places() {
            return;
        }
        // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET writes bits
        // inside it; sched_setaffinity reads it for this thread (pid 0).
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            let mut any = false;
            for (cpu, &n) in self.cpu_node.iter().enumerate() {
                if n == node && cpu < libc::CPU_SETSIZE as usize {
                    libc::CPU_SET(cpu, &mut set);
                    any = true;
                }
            }
            if any {
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
            }
        }
    }

    /// `(local_reads, remote_reads, local_writes, remote_writes)`.
    pub(crate) fn counts(&self) -> (u64, u64, u64, u64) {
        (
            self.local_reads.get().max(0) as u64,
            self.remote_reads.get().max(0) as u64,
            self.local_writes.get().max(0) as u64,
            self.remote_writes.get().max(0) as u64,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpulist_parses() {
        assert_eq!(parse_cpulist("0-3,8,10-11"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpulist(""), Vec::<usize>::new());
    }

    #[test]
    fn emulated_nodes_split_threads_and_count_exactly() {
        let n = Numa::new(2, Some(2), 0);
        let mine = n.current();
        assert!(mine < 2);
        n.count_read(mine, mine);
        n.count_read(1 - mine, mine);
        n.count_write(mine, mine);
        assert_eq!(n.counts(), (1, 1, 1, 0));
        let other = std::thread::scope(|s| {
            let a = s.spawn(|| n.current());
            let b = s.spawn(|| n.current());
            (a.join().unwrap(), b.join().unwrap())
        });
        assert!(other.0 < 2 && other.1 < 2);
    }
}
