//! Concurrency primitives shared by the engines, named for what they
//! guarantee.
//!
//! - [`LineLock`]: a seqlock in each line's first word. Writers hold it
//!   (odd) while they change the line; readers never write it, they read the
//!   line optimistically and retry when the version moved. The word lives in
//!   PM next to the data it guards, so taking it costs no extra cache miss.
//!   Its high 24 bits carry the *epoch* (the pool's open count): a word left
//!   odd by a crash belongs to an old epoch and counts as unlocked, so no
//!   recovery pass has to reset locks (CRASH-PATTERNS.md #5).
//! - [`Stripes`]: DRAM spinlocks by key hash, so that two writers of the
//!   same key never interleave (duplicate-free inserts).
//! - [`SpinMutex`]: a lock around a value whose release is one plain
//!   store, never a locked instruction: code that has just flushed and
//!   fenced can unlock without waiting for its write-backs (a locked
//!   instruction waits for every earlier `clwb` to finish).
//! - [`Counter`]: a sharded counter, cheap to bump from many threads.
//! - [`prefetch`], [`prefetch_addr`]: start loading a cache line (a hint:
//!   safe, whatever the address).

use std::sync::atomic::{fence, AtomicBool, AtomicI64, AtomicU64, Ordering};

const EPOCH_SHIFT: u32 = 40;
const VERSION_MASK: u64 = (1 << EPOCH_SHIFT) - 1;

/// Operations on an epoch-tagged lock word.
#[derive(Clone, Copy)]
pub struct LineLock {
    epoch: u64,
}

impl LineLock {
    /// Lock-word operations for a structure opened for the `opens`-th time (the
    /// epoch that makes lock bits left by a crash stale).
    pub fn new(opens: u64) -> LineLock {
        LineLock {
            epoch: opens & 0xff_ffff,
        }
    }

    /// The word's version in this epoch (0 for a word of an older epoch).
    #[inline]
    fn version(&self, w: u64) -> u64 {
        if w >> EPOCH_SHIFT == self.epoch {
            w & VERSION_MASK
        } else {
            0
        }
    }

    /// Whether a lock word read by a reader shows the line free.
    #[inline]
    pub fn is_free(&self, w: u64) -> bool {
        // `version(w) & 1 == 0` without the select: the low bit is the
        // version's, and a word of another epoch is free whatever it holds.
        w & 1 == 0 || w >> EPOCH_SHIFT != self.epoch
    }

    /// Takes the line (spins while another writer holds it).
    #[inline]
    pub fn lock(&self, word: &AtomicU64) {
        self.acquire(word);
    }

    /// Takes the line like [`lock`](Self::lock) and returns the word as
    /// held, for [`release`](Self::release).
    #[inline]
    pub fn acquire(&self, word: &AtomicU64) -> u64 {
        loop {
            let w = word.load(Ordering::Relaxed);
            let v = self.version(w);
            if v & 1 == 0 {
                let locked = (self.epoch << EPOCH_SHIFT) | ((v + 1) & VERSION_MASK);
                if word
                    .compare_exchange_weak(w, locked, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    fence(Ordering::Release);
                    return locked;
                }
            }
            std::hint::spin_loop();
        }
    }

    /// Takes the line if no writer holds it; `false` (and nothing changed)
    /// otherwise. For a writer that already holds another lock.
    #[inline]
    pub fn try_lock(&self, word: &AtomicU64) -> bool {
        let w = word.load(Ordering::Relaxed);
        let v = self.version(w);
        if v & 1 == 1 {
            return false;
        }
        let locked = (self.epoch << EPOCH_SHIFT) | ((v + 1) & VERSION_MASK);
        let ok = word
            .compare_exchange(w, locked, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok();
        if ok {
            fence(Ordering::Release);
        }
        ok
    }

    /// Releases the line; readers that saw the old version retry.
    #[inline]
    pub fn unlock(&self, word: &AtomicU64) {
        self.release(word, word.load(Ordering::Relaxed));
    }

    /// Releases a line taken by [`acquire`](Self::acquire), whose `held`
    /// word it returned, without reading the line: after a `clwb` (which
    /// leaves the line uncached on some CPUs, the AMD EPYC of
    /// `docs/engines/level.md`'s measurements among them) a load of the
    /// lock word would wait for a cache miss; the store waits in the store
    /// buffer instead.
    #[inline]
    pub fn release(&self, word: &AtomicU64, held: u64) {
        debug_assert!(
            word.load(Ordering::Relaxed) == held,
            "release of a line not held"
        );
        debug_assert!(self.version(held) & 1 == 1, "release of a line not held");
        word.store(
            (self.epoch << EPOCH_SHIFT) | ((held + 1) & VERSION_MASK),
            Ordering::Release,
        );
    }
}

/// Spinlocks by key hash.
pub struct Stripes {
    locks: Box<[AtomicBool]>,
}

/// Holds a stripe; released on drop.
pub struct StripeGuard<'a> {
    lock: &'a AtomicBool,
}

impl Stripes {
    /// At least `n` stripes (rounded up to a power of two), all free.
    pub fn new(n: usize) -> Stripes {
        Stripes {
            locks: (0..n.next_power_of_two())
                .map(|_| AtomicBool::new(false))
                .collect(),
        }
    }

    #[inline]
    fn index(&self, hash: u64) -> usize {
        (hash >> 32) as usize & (self.locks.len() - 1)
    }

    /// Starts loading the line of `hash`'s stripe, for a caller that
    /// locks it after other work.
    #[inline]
    pub fn prefetch(&self, hash: u64) {
        prefetch(&self.locks[self.index(hash)]);
    }

    /// Holds the stripe of `hash` (spins until free).
    pub fn lock(&self, hash: u64) -> StripeGuard<'_> {
        self.lock_index(self.index(hash))
    }

    fn lock_index(&self, i: usize) -> StripeGuard<'_> {
        let lock = &self.locks[i];
        while lock
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            while lock.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        }
        StripeGuard { lock }
    }

    /// Holds the stripes of all `hashes` (each once), taken in stripe
    /// order so that two callers can never deadlock.
    pub fn lock_all(&self, hashes: impl Iterator<Item = u64>) -> Vec<StripeGuard<'_>> {
        let mut idx: Vec<usize> = hashes.map(|h| self.index(h)).collect();
        idx.sort_unstable();
        idx.dedup();
        idx.into_iter().map(|i| self.lock_index(i)).collect()
    }

    /// Holds every stripe, taken in order (so no deadlock with
    /// [`lock_all`](Self::lock_all)): for a rare change that every holder
    /// of a stripe must see either entirely before or entirely after.
    pub fn lock_every(&self) -> Vec<StripeGuard<'_>> {
        (0..self.locks.len()).map(|i| self.lock_index(i)).collect()
    }

    /// The stripe of `hash` if it is free now; `None` if another holds it.
    pub fn try_lock(&self, hash: u64) -> Option<StripeGuard<'_>> {
        let lock = &self.locks[self.index(hash)];
        lock.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| StripeGuard { lock })
    }

    /// DRAM bytes the stripes take.
    pub fn bytes(&self) -> u64 {
        self.locks.len() as u64
    }
}

impl Drop for StripeGuard<'_> {
    fn drop(&mut self) {
        self.lock.store(false, Ordering::Release);
    }
}

/// A `T` alone in its cache line (64-byte aligned and sized), so that
/// writes to neighbours in an array never invalidate the line another
/// thread is using (false sharing).
#[repr(align(64))]
#[derive(Default, Debug)]
pub struct CachePadded<T>(pub T);

impl<T> std::ops::Deref for CachePadded<T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        &self.0
    }
}

/// A mutual-exclusion lock around a `T` whose unlock is a release store
/// (`mov` on x86), not a locked read-modify-write: after a `clwb` and an
/// `sfence`, the unlock retires at once, and the stores before it become
/// visible only after the write-backs complete (the fence orders them),
/// so the write-back latency overlaps the caller's next work instead of
/// stalling the unlock.
///
/// Waiters spin (with `pause`) and yield to the scheduler after
/// [`SPINS_BEFORE_YIELD`] tries, so a holder that was preempted or does
/// slow work (opening a file) gets the CPU back. There is no queue and no
/// parking: for short critical sections only. No poisoning: a panic while
/// holding releases the lock (the guard's drop), and the value stays as
/// the panic left it.
pub struct SpinMutex<T> {
    locked: AtomicBool,
    value: std::cell::UnsafeCell<T>,
}

/// Spins before a waiter of [`SpinMutex`] starts yielding.
pub(crate) const SPINS_BEFORE_YIELD: u32 = 64;

// SAFETY: the lock hands out `&mut T` to one thread at a time (the CAS in
// `lock`), so sharing the mutex is sharing a `T` by sending it.
unsafe impl<T: Send> Sync for SpinMutex<T> {}

/// Holds a [`SpinMutex`]; unlocks on drop.
pub struct SpinGuard<'a, T> {
    m: &'a SpinMutex<T>,
}

impl<T: Default> Default for SpinMutex<T> {
    fn default() -> Self {
        SpinMutex::new(T::default())
    }
}

impl<T> SpinMutex<T> {
    /// A free lock holding `value`.
    pub const fn new(value: T) -> SpinMutex<T> {
        SpinMutex {
            locked: AtomicBool::new(false),
            value: std::cell::UnsafeCell::new(value),
        }
    }

    /// Holds the lock (spins until free).
    #[inline]
    pub fn lock(&self) -> SpinGuard<'_, T> {
        if self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_slow();
        }
        SpinGuard { m: self }
    }

    #[cold]
    fn lock_slow(&self) {
        let mut spins = 0u32;
        loop {
            while self.locked.load(Ordering::Relaxed) {
                spins += 1;
                if spins > SPINS_BEFORE_YIELD {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
            if self
                .locked
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }

    /// The value, through exclusive access to the mutex (no locking).
    pub fn get_mut(&mut self) -> &mut T {
        self.value.get_mut()
    }
}

impl<T> std::ops::Deref for SpinGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard exists only while this thread holds the lock.
        unsafe { &*self.m.value.get() }
    }
}

impl<T> std::ops::DerefMut for SpinGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes the borrow unique.
        unsafe { &mut *self.m.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        // Release: every write made under the lock is visible to the next
        // holder, whose acquiring CAS reads this store.
        self.m.locked.store(false, Ordering::Release);
    }
}

#[repr(align(64))]
#[derive(Default)]
struct Padded(AtomicI64);

const SHARDS: usize = 64;

/// Indices a live thread can own: `0..OWNED`; [`OWNED`] is the shared one.
pub const OWNED: usize = 63;
/// Bit `i`: index `i` is owned by a live thread.
static TAKEN: AtomicU64 = AtomicU64::new(0);

/// A thread's claim on its index, given back when the thread exits.
struct Claim(usize);

impl Drop for Claim {
    fn drop(&mut self) {
        if self.0 < OWNED {
            // Release: the next owner sees this thread's last writes to
            // whatever the index owns (a counter shard).
            TAKEN.fetch_and(!(1 << self.0), Ordering::Release);
        }
    }
}

fn claim() -> usize {
    let mut t = TAKEN.load(Ordering::Relaxed);
    loop {
        let free = !t & ((1 << OWNED) - 1);
        if free == 0 {
            return OWNED;
        }
        let i = free.trailing_zeros() as usize;
        match TAKEN.compare_exchange_weak(t, t | 1 << i, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => return i,
            Err(seen) => t = seen,
        }
    }
}

/// A small index for this thread, unique among live threads: `0..63`
/// while fewer than 63 threads hold one, else [`OWNED`] (shared). Indices
/// are given back when threads exit, so a process that keeps starting
/// threads (a benchmark, a server) does not run out of them. Used for
/// per-thread slots ([`crate::gate::WriterGate`]) and counter shards.
#[inline]
pub fn thread_index() -> usize {
    thread_local!(static INDEX: Claim = Claim(claim()));
    INDEX.try_with(|c| c.0).unwrap_or(OWNED)
}

/// This thread's shard: its [`thread_index`]; the last shard is shared
/// (atomic adds).
#[inline]
fn shard() -> usize {
    thread_index().min(SHARDS - 1)
}

/// A counter split over cache-line-padded shards. A thread that owns its
/// shard adds with a plain load and store: no locked instruction, so the
/// counter never holds back the loads that follow a persist.
pub struct Counter {
    shards: [Padded; SHARDS],
}

impl Default for Counter {
    fn default() -> Self {
        Counter {
            shards: std::array::from_fn(|_| Padded::default()),
        }
    }
}

impl Counter {
    /// Adds `d` (negative to subtract) to the calling thread's shard.
    #[inline]
    pub fn add(&self, d: i64) {
        let i = shard();
        let s = &self.shards[i].0;
        if i < SHARDS - 1 {
            s.store(s.load(Ordering::Relaxed) + d, Ordering::Relaxed);
        } else {
            s.fetch_add(d, Ordering::Relaxed);
        }
    }

    /// Adds one and returns this thread's shard value after the add (a
    /// per-engine, per-thread tick).
    #[inline]
    pub fn bump(&self) -> u64 {
        let i = shard();
        let s = &self.shards[i].0;
        if i < SHARDS - 1 {
            let v = s.load(Ordering::Relaxed) + 1;
            s.store(v, Ordering::Relaxed);
            v as u64
        } else {
            s.fetch_add(1, Ordering::Relaxed) as u64 + 1
        }
    }

    /// The sum; exact when no writer runs.
    pub fn get(&self) -> i64 {
        self.shards
            .iter()
            .map(|s| s.0.load(Ordering::Relaxed))
            .sum()
    }

    /// Sets the sum (writers excluded).
    pub fn set(&self, v: i64) {
        for s in &self.shards[1..] {
            s.0.store(0, Ordering::Relaxed);
        }
        self.shards[0].0.store(v, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_free_is_an_even_version_in_the_lock_epoch() {
        // Every combination of epoch (this one, another), version parity
        // and high version bits: free exactly when the word's version in
        // this epoch is even (a word of another epoch has version 0).
        let lock = LineLock::new(5);
        for epoch in [0u64, 4, 5, 6, 0xff_ffff] {
            for version in [0u64, 1, 2, 3, 0x7f, 0x80, VERSION_MASK - 1, VERSION_MASK] {
                let w = epoch << EPOCH_SHIFT | version;
                assert_eq!(
                    lock.is_free(w),
                    lock.version(w) & 1 == 0,
                    "epoch {epoch} version {version:#x}"
                );
                assert_eq!(lock.is_free(w), epoch != 5 || version & 1 == 0);
            }
        }
    }

    #[test]
    fn stale_epoch_locks_count_as_free() {
        let word = AtomicU64::new(0);
        let old = LineLock::new(1);
        old.lock(&word);
        assert!(
            !old.is_free(word.load(Ordering::Relaxed)),
            "held in its own epoch"
        );
        // A crash while held, then a new open:
        let new = LineLock::new(2);
        let seen = word.load(Ordering::Relaxed);
        assert!(new.is_free(seen), "an old epoch's lock is free");
        new.lock(&word);
        assert!(!new.is_free(word.load(Ordering::Relaxed)));
        new.unlock(&word);
        assert!(new.is_free(word.load(Ordering::Relaxed)));
        assert_ne!(word.load(Ordering::Relaxed), seen, "the version moved");
    }

    #[test]
    fn release_matches_unlock() {
        // `release` from the held word leaves the same word as `unlock`
        // (which reads it back), across the version's wrap too.
        for start in [
            0,
            6,
            3 << EPOCH_SHIFT | 6,
            3 << EPOCH_SHIFT | (VERSION_MASK - 1),
        ] {
            let lock = LineLock::new(3);
            let (a, b) = (AtomicU64::new(start), AtomicU64::new(start));
            let held = lock.acquire(&a);
            lock.lock(&b);
            assert_eq!(held, b.load(Ordering::Relaxed), "acquire returns the word");
            assert!(!lock.is_free(held));
            lock.release(&a, held);
            lock.unlock(&b);
            let w = a.load(Ordering::Relaxed);
            assert_eq!(w, b.load(Ordering::Relaxed));
            assert!(lock.is_free(w) && w != held, "free again, a new version");
            // Taken again, it holds (not a stale word).
            let again = lock.acquire(&a);
            assert!(!lock.is_free(again) && again != held);
        }
    }

    #[test]
    fn spin_mutex_excludes() {
        // Each increment is a read and a separate write of a plain value:
        // without exclusion, increments from other threads would be lost.
        // A pair of values checked together also catches a holder seeing
        // another holder's half-done change.
        let m = SpinMutex::new((0u64, 0u64));
        let threads = 4;
        let per = 20_000u64;
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    for _ in 0..per {
                        let mut g = m.lock();
                        let (a, b) = *g;
                        assert_eq!(a, b, "another holder's change half done");
                        g.0 = a + 1;
                        std::hint::black_box(&mut *g);
                        g.1 = b + 1;
                    }
                });
            }
        });
        assert_eq!(*m.lock(), (threads * per, threads * per));
    }

    #[test]
    fn spin_mutex_released_by_a_panic() {
        let m = SpinMutex::new(1u32);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut g = m.lock();
            *g = 2;
            panic!("while holding");
        }));
        assert!(r.is_err());
        // Not poisoned, and not left locked: this would spin forever.
        assert_eq!(*m.lock(), 2);
    }

    #[test]
    fn counter_sums_across_threads() {
        let c = Counter::default();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        c.add(1);
                    }
                });
            }
        });
        assert_eq!(c.get(), 4000);
        c.set(7);
        assert_eq!(c.get(), 7);
    }

    #[test]
    fn stripes_exclude() {
        let s = Stripes::new(4);
        let n = AtomicU64::new(0);
        std::thread::scope(|sc| {
            for _ in 0..4 {
                sc.spawn(|| {
                    for _ in 0..10_000 {
                        let _g = s.lock(1 << 32);
                        let v = n.load(Ordering::Relaxed);
                        n.store(v + 1, Ordering::Relaxed);
                    }
                });
            }
        });
        assert_eq!(n.load(Ordering::Relaxed), 40_000);
    }
}

#[cfg(test)]
mod thread_index_tests {
    use super::*;

    #[test]
    fn indices_are_unique_among_live_threads_and_recycled() {
        // Far more threads over time than indices: each gets an owned one
        // (at most a few live at once here), unique while it lives.
        for _ in 0..20 {
            let ids: Vec<usize> = (0..8)
                .map(|_| std::thread::spawn(thread_index))
                .map(|h| h.join().unwrap())
                .collect();
            assert!(ids.iter().all(|&i| i < OWNED), "{ids:?}");
        }
        let barrier = std::sync::Barrier::new(10);
        let ids: Vec<usize> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..10)
                .map(|_| {
                    s.spawn(|| {
                        let i = thread_index();
                        barrier.wait();
                        i
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(
            sorted.len(),
            ids.len(),
            "two live threads share an index: {ids:?}"
        );
    }

    #[test]
    fn a_recycled_shard_keeps_its_count() {
        let c = Counter::default();
        for _ in 0..200 {
            std::thread::scope(|s| {
                s.spawn(|| c.add(1));
                s.spawn(|| c.add(2));
            });
        }
        assert_eq!(c.get(), 600);
    }
}

/// Asks the CPU to start loading the cache line of `x`, so that a miss
/// overlaps other work instead of stalling the load that needs it.
#[inline]
pub fn prefetch<T>(x: &T) {
    prefetch_addr(std::ptr::from_ref(x) as usize);
}

/// [`prefetch`] of any address, valid or not: a prefetch is a hint that
/// never faults and changes no memory, so a stale address (a table freed
/// since it was read) costs nothing but the hint.
#[inline]
pub fn prefetch_addr(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    #[allow(unused_unsafe)]
    // SAFETY: a prefetch is a hint: it never faults and changes no memory,
    // whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(addr as *const i8)
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}
