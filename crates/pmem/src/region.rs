//! The mapped region under a pool: the bytes, addressed by offsets from a
//! stable base, and the mode-aware persist primitives over them (flush,
//! fence, non-temporal writes, the crash simulator's hooks). The pool's
//! header and the allocator both work on a [`Region`]; neither is below
//! the other.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::map::{self as osmap, Mapping};
use crate::persist::{self, CACHE_LINE};
use crate::sim::{CrashChoice, CrashSite, FenceHook, Sim};

/// How stores become durable (ARCHITECTURE.md, "Persistence modes").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// DAX file mapped with MAP_SYNC: flush + fence make data durable
    /// against power loss.
    Dax,
    /// Ordinary file mapping (page cache): flush + fence order stores;
    /// durable against a process crash at once, against power loss after
    /// [`Region::sync`].
    Mapped,
    /// Anonymous memory, no flushes, no fences: durable against nothing.
    Volatile,
    /// Anonymous memory plus the crash simulator: flushes and fences are
    /// recorded, crash images can be taken.
    Simulated,
}

impl Mode {
    /// The mode's name, as [`Mode::parse`] reads it.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Dax => "dax",
            Mode::Mapped => "mapped",
            Mode::Volatile => "volatile",
            Mode::Simulated => "simulated",
        }
    }

    /// Reads a mode name (`dax`, `mapped`, `volatile`, `simulated`).
    pub fn parse(s: &str) -> Result<Mode> {
        match s {
            "dax" => Ok(Mode::Dax),
            "mapped" => Ok(Mode::Mapped),
            "volatile" => Ok(Mode::Volatile),
            "simulated" => Ok(Mode::Simulated),
            _ => Err(Error::InvalidArgument(format!(
                "unknown mode {s:?} (expected dax, mapped, volatile or simulated)"
            ))),
        }
    }

    pub(crate) fn uses_file(self) -> bool {
        matches!(self, Mode::Dax | Mode::Mapped)
    }
}

pub(crate) fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
}

/// `posix_fallocate` of `[off, off+len)`; a full file system is
/// `OutOfSpace` naming the file and the sizes.
pub(crate) fn reserve_space(file: &File, path: &Path, off: u64, len: u64, why: &str) -> Result<()> {
    osmap::reserve_file_space(file, off, len).map_err(|e| {
        if osmap::is_no_space(&e) {
            Error::OutOfSpace(format!(
                "the file system has no room to {why} pool file {}: reserving {len} bytes at \
                 offset {off} (to {} bytes) failed: {e}",
                path.display(),
                off + len
            ))
        } else {
            Error::io("cannot reserve space for pool file", Some(path), e)
        }
    })
}

/// The mapping of a pool's bytes and how they persist. Every access is
/// bounds-checked against the current size; the base address is stable
/// for the region's lifetime, so offsets and references survive growth.
pub struct Region {
    pub(crate) map: Mapping,
    pub(crate) file: Option<File>,
    pub(crate) path: Option<PathBuf>,
    pub(crate) mode: Mode,
    pub(crate) read_only: bool,
    pub(crate) size: AtomicU64,
    pub(crate) max_size: u64,
    pub(crate) sim: Option<Mutex<Sim>>,
    /// Bytes `zero_release` has zeroed (read by `zeroed_bytes`).
    pub(crate) zeroed: AtomicU64,
    grow_lock: Mutex<()>,
}

impl Region {
    /// A region over `map` (already mapped for `size` bytes).
    pub(crate) fn new(
        map: Mapping,
        file: Option<File>,
        path: Option<PathBuf>,
        mode: Mode,
        read_only: bool,
        size: u64,
        max_size: u64,
    ) -> Region {
        Region {
            map,
            file,
            path,
            mode,
            read_only,
            size: AtomicU64::new(size),
            max_size,
            sim: None,
            zeroed: AtomicU64::new(0),
            grow_lock: Mutex::new(()),
        }
    }
    /// The mode in force (`mapped` after a permitted dax fallback).
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The mapped file's path (`None` for anonymous memory).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Whether the mapping is read-only.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Current size in bytes.
    #[inline]
    pub fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    /// Largest size growth may reach.
    pub fn max_size(&self) -> u64 {
        self.max_size
    }
    /// Makes everything flushed so far durable for the mode: a fence, plus
    /// msync of the file in `mapped` mode (durable against power loss).
    pub fn sync(&self) -> Result<()> {
        self.fence();
        if self.mode == Mode::Mapped && !self.read_only {
            self.map
                .msync(self.size() as usize)
                .map_err(|e| Error::io("msync failed on", self.path.as_deref(), e))?;
        }
        Ok(())
    }

    // ----- bounds-checked access -------------------------------------------------

    /// `Err(Corrupt)` unless `[off, off+len)` lies inside the pool. For
    /// offsets read from the pool itself (recovery, `check`).
    ///
    /// Inline (the error apart): engines check offsets on their lookup
    /// paths, and a caller built without LTO would otherwise make a call
    /// per check.
    #[inline]
    pub fn check_range(&self, off: u64, len: u64) -> Result<()> {
        match off.checked_add(len) {
            Some(end) if end <= self.size() => Ok(()),
            _ => Err(self.outside(off, len)),
        }
    }

    #[cold]
    #[inline(never)]
    fn outside(&self, off: u64, len: u64) -> Error {
        Error::Corrupt(format!(
            "range {off:#x}+{len} lies outside the {}-byte pool",
            self.size()
        ))
    }

    #[inline]
    #[track_caller]
    fn bounds(&self, off: u64, len: usize) {
        let end = off.checked_add(len as u64);
        assert!(
            matches!(end, Some(e) if e <= self.size()),
            "pool access {off:#x}+{len} outside the {}-byte pool (an engine bug: offsets read from PM must be checked with check_range)",
            self.size()
        );
    }

    /// The 8-byte word at `off` (8-byte aligned), for failure-atomic stores
    /// and lock-free reads. Panics on a misaligned or out-of-pool offset.
    #[inline]
    #[track_caller]
    pub fn atomic_u64(&self, off: u64) -> &AtomicU64 {
        self.bounds(off, 8);
        assert!(
            off.is_multiple_of(8),
            "atomic_u64 at unaligned offset {off:#x}"
        );
        // SAFETY: in bounds (checked), aligned (checked), the mapping lives
        // as long as &self, and AtomicU64 tolerates concurrent access.
        unsafe { &*(self.map.base().add(off as usize) as *const AtomicU64) }
    }

    /// `n` consecutive 8-byte words from `off` (8-byte aligned) with one
    /// bounds check: a cache line or a bucket read by a hot path.
    #[inline]
    #[track_caller]
    pub fn words(&self, off: u64, n: usize) -> &[AtomicU64] {
        let len = n.checked_mul(8).expect("word count overflows");
        self.bounds(off, len);
        assert!(off.is_multiple_of(8), "words at unaligned offset {off:#x}");
        // SAFETY: `n` words in bounds (checked) and aligned (checked); the
        // mapping lives as long as &self; atomics tolerate concurrent access.
        unsafe {
            std::slice::from_raw_parts(self.map.base().add(off as usize) as *const AtomicU64, n)
        }
    }

    /// `n` consecutive lines of eight words from `off` (8-byte aligned,
    /// which is all `[AtomicU64; 8]` needs; engines pass line-aligned
    /// offsets) with one bounds check: a segment's buckets, which a lookup
    /// then indexes with one compare a line instead of a bounds check a
    /// line (hmeh: 12 instructions a probed line less, callgrind).
    /// Panics on a misaligned or out-of-pool range, as `words` does. Its
    /// checks are written out as `words`' are: through one shared helper an
    /// hmeh get ran 3 instructions more (callgrind).
    #[inline]
    #[track_caller]
    pub fn lines(&self, off: u64, n: usize) -> &[[AtomicU64; 8]] {
        let len = n.checked_mul(64).expect("line count overflows");
        self.bounds(off, len);
        assert!(off.is_multiple_of(8), "lines at unaligned offset {off:#x}");
        // SAFETY: `n` lines of 64 bytes in bounds (checked) and 8-byte
        // aligned (checked; [AtomicU64; 8] needs 8); the mapping lives as
        // long as &self; atomics tolerate concurrent access.
        unsafe {
            std::slice::from_raw_parts(
                self.map.base().add(off as usize) as *const [AtomicU64; 8],
                n,
            )
        }
    }

    /// [`words`](Self::words) for an offset that may be stale or torn (a
    /// reader's unvalidated snapshot): `None` instead of a panic when the
    /// range is outside the pool or misaligned.
    #[inline]
    pub fn try_words(&self, off: u64, n: usize) -> Option<&[AtomicU64]> {
        let end = off.checked_add((n as u64).checked_mul(8)?)?;
        if end > self.size() || !off.is_multiple_of(8) {
            return None;
        }
        // SAFETY: `n` words in bounds and aligned (both checked above); the
        // mapping lives as long as &self; atomics tolerate concurrent access.
        Some(unsafe {
            std::slice::from_raw_parts(self.map.base().add(off as usize) as *const AtomicU64, n)
        })
    }

    /// Hints the CPU to load the cache line at `off` (no effect on contents,
    /// never faults). For hot paths that know their next misses early.
    #[inline]
    pub fn prefetch(&self, off: u64) {
        #[cfg(target_arch = "x86_64")]
        self.prefetch_hint::<{ std::arch::x86_64::_MM_HINT_T0 }>(off);
        #[cfg(not(target_arch = "x86_64"))]
        let _ = off;
    }

    /// [`prefetch`](Self::prefetch) with intent to write (`prefetchw`): the
    /// line arrives owned, so a store to it does not wait for it.
    #[inline]
    pub fn prefetch_write(&self, off: u64) {
        #[cfg(target_arch = "x86_64")]
        self.prefetch_hint::<{ std::arch::x86_64::_MM_HINT_ET0 }>(off);
        #[cfg(not(target_arch = "x86_64"))]
        let _ = off;
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    fn prefetch_hint<const HINT: i32>(&self, off: u64) {
        debug_assert!(off < self.size());
        #[allow(unused_unsafe)]
        // SAFETY: prefetch is a hint; it neither faults nor changes memory,
        // and the address is inside our reservation.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<HINT>(self.map.base().add(off as usize) as *const i8)
        }
    }

    /// The byte at `off`, as an atomic.
    #[inline]
    #[track_caller]
    pub fn atomic_u8(&self, off: u64) -> &AtomicU8 {
        self.bounds(off, 1);
        // SAFETY: in bounds (checked); bytes need no alignment.
        unsafe { &*(self.map.base().add(off as usize) as *const AtomicU8) }
    }

    /// Acquire load of the word at `off`.
    #[inline]
    pub fn load_u64(&self, off: u64) -> u64 {
        self.atomic_u64(off).load(Ordering::Acquire)
    }

    /// Release store of the word at `off` (8-byte failure-atomic).
    #[inline]
    pub fn store_u64(&self, off: u64, v: u64) {
        self.atomic_u64(off).store(v, Ordering::Release)
    }

    /// Copies bytes out of the pool. Not atomic: callers synchronise with
    /// writers of the same range.
    #[track_caller]
    pub fn read(&self, off: u64, buf: &mut [u8]) {
        self.bounds(off, buf.len());
        // SAFETY: source range in bounds (checked); buf is a distinct
        // allocation, so the ranges do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.map.base().add(off as usize),
                buf.as_mut_ptr(),
                buf.len(),
            )
        }
    }

    /// Copies bytes into the pool. Not atomic and not flushed.
    #[track_caller]
    pub fn write(&self, off: u64, data: &[u8]) {
        self.bounds(off, data.len());
        // SAFETY: destination range in bounds (checked); data cannot alias
        // the pool's mapping through a shared borrow of a distinct slice
        // unless the caller passes pool memory, which `read` never hands out.
        unsafe { std::ptr::copy(data.as_ptr(), self.map.base().add(off as usize), data.len()) }
    }

    /// Zeroes `[off, off+len)`; not flushed.
    #[track_caller]
    pub fn zero(&self, off: u64, len: usize) {
        self.bounds(off, len);
        // SAFETY: in bounds (checked).
        unsafe { std::ptr::write_bytes(self.map.base().add(off as usize), 0, len) }
    }

    /// The address the pool is mapped at, as a number: it never changes
    /// for the region's life (growth maps in place), which tests check.
    pub fn base_addr(&self) -> usize {
        self.map.base() as usize
    }

    // ----- persist primitives ----------------------------------------------------

    /// Writes back the cache lines of `[off, off+len)`; ordered by the next
    /// [`fence`](Self::fence).
    #[inline]
    pub fn flush(&self, off: u64, len: usize) {
        match self.mode {
            Mode::Dax | Mode::Mapped => {
                debug_assert!(off + len as u64 <= self.size());
                // SAFETY: flushing needs a mapped address; a range outside the
                // pool is still inside our reservation (or a caller bug that
                // the assertion above reports in debug builds).
                persist::flush_range(unsafe { self.map.base().add(off as usize) }, len)
            }
            Mode::Volatile => {}
            Mode::Simulated => {
                self.bounds(off, len);
                let mut sim = self
                    .sim
                    .as_ref()
                    .expect("simulated pool has a simulator")
                    .lock()
                    .expect("sim lock");
                sim.record_flush(self.live(), off as usize, len);
                persist::count_flush(persist::lines_covered(off as usize, len));
            }
        }
    }

    /// Store fence: every earlier flush is durable before any later store.
    #[inline]
    pub fn fence(&self) {
        match self.mode {
            Mode::Dax | Mode::Mapped => persist::fence(),
            Mode::Volatile => {}
            Mode::Simulated => {
                let mut guard = self
                    .sim
                    .as_ref()
                    .expect("simulated pool has a simulator")
                    .lock()
                    .expect("sim lock");
                let sim = &mut *guard;
                // The hook sees the instant just before the fence takes
                // effect: lines flushed since the previous fence are still
                // undecided, so crash states between two fences are offered.
                if let Some(mut hook) = sim.hook.take() {
                    let n = sim.fences + 1;
                    hook(
                        n,
                        &CrashSite {
                            live: self.live(),
                            sim,
                        },
                    );
                    sim.hook = Some(hook);
                }
                guard.apply_fence(self.live());
                persist::count_fence();
            }
        }
    }

    /// `flush` then `fence`.
    #[inline]
    pub fn persist(&self, off: u64, len: usize) {
        self.flush(off, len);
        self.fence();
    }

    /// `persist` of the one cache line at `off` (64-byte aligned): the hot
    /// path of a slot write, with the least overhead.
    #[inline]
    #[track_caller]
    pub fn persist_line(&self, off: u64) {
        // Checked in every mode, so that tests on simulated pools catch
        // what would panic on a mapped one.
        assert!(
            off.is_multiple_of(CACHE_LINE as u64),
            "persist_line at unaligned offset {off:#x}"
        );
        match self.mode {
            Mode::Dax | Mode::Mapped => {
                self.bounds(off, CACHE_LINE);
                // SAFETY: the line is inside the mapping (checked above);
                // clwb and sfence do not change memory contents.
                persist::persist_one_line(unsafe { self.map.base().add(off as usize) })
            }
            _ => self.persist(off, CACHE_LINE),
        }
    }

    /// Copies `data` to `off` with non-temporal stores (no flush needed);
    /// durable after the next fence. For records of a cache line or more.
    pub fn write_nt(&self, off: u64, data: &[u8]) {
        self.bounds(off, data.len());
        match self.mode {
            // SAFETY: destination in bounds (checked); `data` is not pool memory.
            Mode::Dax | Mode::Mapped => unsafe {
                persist::nt_copy(self.map.base().add(off as usize), data)
            },
            Mode::Volatile => self.write(off, data),
            Mode::Simulated => {
                self.write(off, data);
                self.flush(off, data.len());
            }
        }
    }

    /// Zeroes `[off, off+len)` (whole lines) like [`zero_nt`](Self::zero_nt),
    /// but leaves the whole pages inside the range untouched by this
    /// process: in `mapped` mode their blocks are deallocated (a hole
    /// punched in the pool file, so they read as zeros) and reserved again
    /// at once (`posix_fallocate`, so a later store cannot raise SIGBUS on
    /// a full file system). The pages join the process's resident set only
    /// when first touched; zeroing them with stores faulted in all of them.
    /// The partial pages at the ends, and every other mode (`dax`, where a
    /// punched block's zeros are not known durable; the simulator, which
    /// must see the stores; volatile pools), are zeroed with non-temporal
    /// stores. Durable, as `zero_nt`, after the next fence: the hole is in
    /// the file when the call returns, and `sync` (msync) makes it durable
    /// against power loss with the rest of the file.
    ///
    /// The caller guarantees that nothing reads or writes the range
    /// meanwhile (a block just reserved from the allocator). An `Err`
    /// (`OutOfSpace` when the file system filled up between the punch and
    /// the reservation) may leave the range unbacked: the caller must not
    /// touch it nor hand it back to the allocator in this run (the next
    /// writable open backs every hole before mapping the file).
    pub fn zero_release(&self, off: u64, len: usize) -> Result<()> {
        self.bounds(off, len);
        self.zeroed.fetch_add(len as u64, Ordering::Relaxed);
        let page = 4096u64;
        let start = round_up(off, page);
        let end = (off + len as u64) / page * page;
        let file = match (&self.file, self.mode) {
            (Some(f), Mode::Mapped) if !self.read_only && end > start => f,
            _ => {
                self.zero_nt(off, len);
                return Ok(());
            }
        };
        let path = self.path.as_deref().unwrap_or(Path::new("(unnamed pool)"));
        osmap::punch_hole(file, start, end - start)
            .map_err(|e| Error::io("cannot punch a hole in pool file", Some(path), e))?;
        reserve_space(file, path, start, end - start, "back the zeroed range of")?;
        // The partial pages at both ends, if any.
        self.zero_nt(off, (start - off) as usize);
        self.zero_nt(end, (off + len as u64 - end) as usize);
        Ok(())
    }

    /// Faults in the pages of `[off, off+len)` ahead of their first store,
    /// so the thread that stores there does not take the page faults (on
    /// tmpfs each is a page allocated and zeroed): it reads one word of
    /// each whole page inside the range and the pool's current size, in
    /// `mapped` and `dax` modes on a writable pool, and does nothing
    /// elsewhere. No byte changes. On tmpfs a read maps the page writable;
    /// on a disk file system the first store still takes a minor fault,
    /// for the file system to track the dirty page. A read and not
    /// `madvise(MADV_POPULATE_WRITE)`, which holds the process's address
    /// space lock through its faults: called from an idle-priority thread,
    /// it slowed the store's writers where they mapped memory (docs/store.md).
    /// Returns the bytes it touched.
    pub fn prefault(&self, off: u64, len: u64) -> u64 {
        if self.read_only || !self.mode.uses_file() {
            return 0;
        }
        let page = 4096u64;
        let start = round_up(off, page);
        let end = off.saturating_add(len).min(self.size()) / page * page;
        let mut at = start;
        while at < end {
            std::hint::black_box(self.atomic_u64(at).load(Ordering::Relaxed));
            at += page;
        }
        end.saturating_sub(start)
    }

    /// Bytes [`zero_release`](Self::zero_release) has been asked to zero
    /// since this `Pool` was made (a block [`Reservation::is_zeroed`](crate::Reservation::is_zeroed) says
    /// reads zero needs none).
    pub fn zeroed_bytes(&self) -> u64 {
        self.zeroed.load(Ordering::Relaxed)
    }

    /// Zeroes `[off, off+len)` (whole lines) with non-temporal stores: no
    /// flush needed, durable after the next fence, and the cache is left
    /// alone. For large ranges (a new log file).
    pub fn zero_nt(&self, off: u64, len: usize) {
        self.bounds(off, len);
        if !off.is_multiple_of(64) || !len.is_multiple_of(64) {
            self.zero(off, len);
            self.flush(off, len);
            return;
        }
        match self.mode {
            // SAFETY: destination in bounds (checked) and whole lines (the
            // mapping's base is page-aligned, `off` and `len` line multiples).
            Mode::Dax | Mode::Mapped => unsafe {
                persist::nt_zero(self.map.base().add(off as usize), len)
            },
            Mode::Volatile => self.zero(off, len),
            Mode::Simulated => {
                self.zero(off, len);
                self.flush(off, len);
            }
        }
    }

    // ----- growth ---------------------------------------------------------------

    /// Grows the region to at least `min_size` bytes (doubling, up to
    /// `max_size`, in multiples of `unit`). Offsets and references stay
    /// valid. `record` makes the new size durable (the pool's header) once
    /// the file and mapping have it; it runs under the grow lock.
    pub(crate) fn grow(
        &self,
        min_size: u64,
        unit: u64,
        record: impl FnOnce(u64) -> Result<()>,
    ) -> Result<u64> {
        let _g = self.grow_lock.lock().expect("grow lock");
        let old = self.size();
        if old >= min_size {
            return Ok(old);
        }
        let target = round_up(min_size.max(old.saturating_mul(2)).min(self.max_size), unit);
        if target < min_size || target <= old {
            return Err(Error::OutOfSpace(format!(
                "pool is {old} bytes, growing to {min_size} would pass its limit of {}",
                self.max_size
            )));
        }
        if let Some(f) = &self.file {
            let path = self.path.as_deref().unwrap_or(Path::new(""));
            // persist: the file is extended and its new pages reserved
            // before `record` makes the new size durable (the pool's reason
            // is at `Pool::grow`).
            if let Err(e) = reserve_space(f, path, old, target - old, "grow") {
                // Give back what a partial reservation took; the pool keeps
                // its size and stays usable.
                if f.metadata().map(|m| m.len() > old).unwrap_or(false) {
                    let _ = f.set_len(old);
                }
                return Err(e);
            }
            f.set_len(target)
                .map_err(|e| Error::io("cannot grow pool file", self.path.as_deref(), e))?;
        }
        self.map
            .map(self.file.as_ref(), old as usize, (target - old) as usize)
            .map_err(|e| Error::io("cannot map grown pool", self.path.as_deref(), e))?;
        if let Some(sim) = &self.sim {
            sim.lock()
                .expect("sim lock")
                .persisted
                .resize(target as usize, 0);
        }
        self.size.store(target, Ordering::Release);
        record(target)?;
        Ok(target)
    }

    // ----- crash simulation --------------------------------------------------

    fn live(&self) -> &[u8] {
        // SAFETY: [base, base+size) is mapped; the simulator reads it while
        // the program may write it, which yields some mix of old and new
        // bytes: exactly the uncertainty a crash has.
        unsafe { std::slice::from_raw_parts(self.map.base(), self.size() as usize) }
    }

    /// Installs (or removes) the hook called at every fence of a simulated
    /// pool, just before the fence takes effect. The hook must not call this
    /// pool's flush or fence.
    pub fn set_fence_hook(&self, hook: Option<FenceHook>) -> Result<()> {
        let sim = self
            .sim
            .as_ref()
            .ok_or_else(|| Error::InvalidArgument("fence hooks need simulated mode".into()))?;
        let mut g = sim.lock().expect("sim lock");
        g.at_last_fence = hook.is_some().then(|| self.live().to_vec());
        g.hook = hook;
        Ok(())
    }

    /// Fences issued so far (simulated mode; 0 otherwise).
    pub fn fence_count(&self) -> u64 {
        self.sim
            .as_ref()
            .map(|s| s.lock().expect("sim lock").fences)
            .unwrap_or(0)
    }

    /// Runs `f` on the crash site of this instant (simulated mode only).
    fn at_site<R>(&self, f: impl FnOnce(&CrashSite<'_>) -> R) -> Result<R> {
        let sim = self
            .sim
            .as_ref()
            .ok_or_else(|| Error::InvalidArgument("crash sites need simulated mode".into()))?;
        let g = sim.lock().expect("sim lock");
        Ok(f(&CrashSite {
            live: self.live(),
            sim: &g,
        }))
    }

    /// A crash image of the pool as it stands now (simulated mode).
    pub fn crash_image(&self, choice: CrashChoice) -> Result<Vec<u8>> {
        self.at_site(|site| site.image(choice))
    }

    /// Cache lines not yet durable (simulated mode).
    pub fn undecided_lines(&self) -> Result<Vec<u64>> {
        self.at_site(|site| site.undecided_lines())
    }

    /// Undecided lines written since the previous fence (simulated mode;
    /// see `CrashSite::recent_lines`).
    pub fn recent_lines(&self) -> Result<Vec<u64>> {
        self.at_site(|site| site.recent_lines())
    }

    /// A copy of the whole live image.
    pub fn image(&self) -> Vec<u8> {
        self.live().to_vec()
    }
}
