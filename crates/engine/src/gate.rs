//! [`WriterGate`]: many writers pass it with two plain stores and a load;
//! one exclusive holder (a resize) closes it, waits until no writer is
//! inside, and keeps new ones out until it opens it again.
//!
//! A writer marks itself inside in a slot of its own, then checks that the
//! gate is open. The closer sets "closed", then checks every slot. This is
//! Dekker's pattern, which needs a full fence between each side's store and
//! load. Writers are many and frequent, closers rare, so the fence is moved
//! entirely to the closer: `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`
//! makes every running thread of the process execute a full barrier, after
//! which each writer's slot store is visible to the closer, or the closer's
//! store is visible to that writer's check. Where the kernel lacks the call,
//! writers issue the fence themselves (correct, slower).
//!
//! Why not a `RwLock`: its read lock is a locked read-modify-write on a
//! shared line. After a persist's store fence, a locked instruction waits
//! for the fence to complete, so the next operation's cache misses cannot
//! overlap the previous operation's flush. The gate's writer side has no
//! locked instruction.
//!
//! The first 63 threads to use any gate own a slot each; later threads
//! share one atomic counter (locked instructions, still correct). The gate
//! is not reentrant: a thread inside must not enter again or close it.

use std::sync::atomic::{compiler_fence, fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

const OWN_SLOTS: usize = 63;

#[repr(align(64))]
#[derive(Default)]
struct Slot(AtomicU64);

/// See the module documentation.
pub struct WriterGate {
    closed: AtomicBool,
    /// [`asymmetric`], read once at creation: the writers' fast path then
    /// costs no `OnceLock` check per entry.
    cheap: bool,
    closers: Mutex<()>,
    slots: Box<[Slot]>,
    shared: AtomicU64,
}

/// Inside the gate as a writer; leaves on drop.
pub struct Inside<'a> {
    gate: &'a WriterGate,
    slot: usize,
}

/// The gate closed, no writer inside; reopens on drop.
pub struct Closed<'a> {
    gate: &'a WriterGate,
    _serial: MutexGuard<'a, ()>,
}

/// This thread's slot: its [`crate::sync::thread_index`] (63 = shared).
#[inline]
fn thread_slot() -> usize {
    crate::sync::thread_index().min(OWN_SLOTS)
}

const MEMBARRIER_CMD_QUERY: libc::c_long = 0;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

fn membarrier(cmd: libc::c_long) -> libc::c_long {
    // SAFETY: membarrier takes two integer arguments and touches no memory
    // of ours; an unknown command returns -1 (EINVAL), never undefined
    // behaviour.
    unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            cmd,
            0 as libc::c_long,
            0 as libc::c_long,
        )
    }
}

/// Whether this process can use expedited private membarrier (registered
/// once, on first use).
fn asymmetric() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        let supported = membarrier(MEMBARRIER_CMD_QUERY);
        supported >= 0
            && supported & MEMBARRIER_CMD_PRIVATE_EXPEDITED != 0
            && membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0
    })
}

impl Default for WriterGate {
    fn default() -> Self {
        WriterGate {
            closed: AtomicBool::new(false),
            cheap: asymmetric(),
            closers: Mutex::new(()),
            slots: (0..OWN_SLOTS).map(|_| Slot::default()).collect(),
            shared: AtomicU64::new(0),
        }
    }
}

impl WriterGate {
    /// An open gate with no writer inside.
    pub fn new() -> WriterGate {
        WriterGate::default()
    }

    /// Enters as a writer, waiting while the gate is closed.
    #[inline(always)]
    pub fn enter(&self) -> Inside<'_> {
        // The common case inline: a thread with a slot of its own, the
        // fence left to the closer (`membarrier`), the gate open. Two
        // stores and a load; every other case is `enter_slow`.
        let slot = thread_slot();
        if slot < OWN_SLOTS && self.cheap && self.try_own_slot(slot, true) {
            return Inside { gate: self, slot };
        }
        self.enter_slow(slot)
    }

    /// One attempt through the thread's own `slot`: marks it, and keeps
    /// the mark if the gate is open (Dekker's pattern; the full fence is
    /// the closer's `membarrier` when `cheap`, [`WriterGate::cheap`], else
    /// here). `cheap` is a parameter so that the fast path, which has
    /// tested it already, does not load it again.
    #[inline(always)]
    fn try_own_slot(&self, slot: usize, cheap: bool) -> bool {
        let s = &self.slots[slot].0;
        s.store(1, Ordering::Relaxed);
        if cheap {
            compiler_fence(Ordering::SeqCst);
        } else {
            fence(Ordering::SeqCst);
        }
        if !self.closed.load(Ordering::Relaxed) {
            fence(Ordering::Acquire);
            return true;
        }
        s.store(0, Ordering::Release);
        false
    }

    /// [`enter`](Self::enter) when the gate was closed, the thread shares
    /// the counter, or the kernel lacks `membarrier`.
    #[cold]
    #[inline(never)]
    fn enter_slow(&self, slot: usize) -> Inside<'_> {
        let cheap = self.cheap;
        loop {
            if slot < OWN_SLOTS {
                if self.try_own_slot(slot, cheap) {
                    return Inside { gate: self, slot };
                }
            } else {
                self.shared.fetch_add(1, Ordering::SeqCst);
                if !self.closed.load(Ordering::SeqCst) {
                    return Inside { gate: self, slot };
                }
                self.shared.fetch_sub(1, Ordering::Release);
            }
            while self.closed.load(Ordering::Acquire) {
                std::thread::yield_now();
            }
        }
    }

    /// Closes the gate and waits until no writer is inside.
    pub fn close(&self) -> Closed<'_> {
        let serial = self.closers.lock().unwrap_or_else(|p| p.into_inner());
        self.closed.store(true, Ordering::SeqCst);
        if self.cheap {
            membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED);
        }
        fence(Ordering::SeqCst);
        loop {
            let busy = self.slots.iter().any(|s| s.0.load(Ordering::Acquire) != 0)
                || self.shared.load(Ordering::Acquire) != 0;
            if !busy {
                break;
            }
            std::thread::yield_now();
        }
        Closed {
            gate: self,
            _serial: serial,
        }
    }
}

impl Drop for Inside<'_> {
    #[inline]
    fn drop(&mut self) {
        if self.slot < OWN_SLOTS {
            self.gate.slots[self.slot].0.store(0, Ordering::Release);
        } else {
            self.gate.shared.fetch_sub(1, Ordering::Release);
        }
    }
}

impl Drop for Closed<'_> {
    fn drop(&mut self) {
        self.gate.closed.store(false, Ordering::Release);
    }
}
