//! Persist primitives on real hardware: cache-line flush, store fence, and a
//! non-temporal copy, plus the per-thread counters and the optional PM
//! write-latency emulation.
//!
//! These functions act on raw addresses and know nothing of pools or modes;
//! [`crate::Pool`] decides, per persistence mode, whether to call them, to
//! record the flush in the crash simulator instead, or to do nothing.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Size of a CPU cache line, the unit of flushing and of crash simulation.
pub(crate) const CACHE_LINE: usize = 64;

/// The flush instruction this CPU offers, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlushInstr {
    /// `clwb`: writes the line back and may keep it cached.
    Clwb,
    /// `clflushopt`: writes back and invalidates, weakly ordered.
    Clflushopt,
    /// `clflush`: writes back and invalidates, strongly ordered (slowest).
    Clflush,
    /// Not an x86-64 CPU: flushes are no-ops and `fence` is a full fence.
    Unsupported,
}

impl FlushInstr {
    /// Lower-case name as printed by the tools.
    pub fn name(self) -> &'static str {
        match self {
            FlushInstr::Clwb => "clwb",
            FlushInstr::Clflushopt => "clflushopt",
            FlushInstr::Clflush => "clflush",
            FlushInstr::Unsupported => "none",
        }
    }
}

static FLUSH_INSTR: OnceLock<FlushInstr> = OnceLock::new();

/// The flush instruction used by this process, detected once with CPUID
/// (clwb > clflushopt > clflush).
pub fn flush_instr() -> FlushInstr {
    *FLUSH_INSTR.get_or_init(detect)
}

#[cfg(target_arch = "x86_64")]
fn detect() -> FlushInstr {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    #[allow(unused_unsafe)]
    // SAFETY: CPUID exists on every x86-64 CPU and has no side effects.
    let (leaf0, leaf1, leaf7) = unsafe { (__cpuid(0), __cpuid(1), __cpuid_count(7, 0)) };
    let max_leaf = leaf0.eax;
    if max_leaf >= 7 {
        if leaf7.ebx & (1 << 24) != 0 {
            return FlushInstr::Clwb;
        }
        if leaf7.ebx & (1 << 23) != 0 {
            return FlushInstr::Clflushopt;
        }
    }
    if leaf1.edx & (1 << 19) != 0 {
        return FlushInstr::Clflush;
    }
    FlushInstr::Unsupported
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> FlushInstr {
    FlushInstr::Unsupported
}

/// Per-thread persist counters. Plain numbers, read with [`counters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Cache lines flushed (or written non-temporally).
    pub flushes: u64,
    /// Store fences issued.
    pub fences: u64,
    /// Bytes made durable by flushes and non-temporal copies (lines × 64).
    pub bytes_flushed: u64,
}

impl Counters {
    /// `self - earlier`, field by field.
    pub fn since(&self, earlier: &Counters) -> Counters {
        Counters {
            flushes: self.flushes - earlier.flushes,
            fences: self.fences - earlier.fences,
            bytes_flushed: self.bytes_flushed - earlier.bytes_flushed,
        }
    }
}

thread_local! {
    static COUNTERS: Cell<Counters> = const { Cell::new(Counters { flushes: 0, fences: 0, bytes_flushed: 0 }) };
}

/// This thread's counters since it started.
pub fn counters() -> Counters {
    COUNTERS.with(|c| c.get())
}

/// Adds `c` to this thread's counters: a thread that hands persists to
/// helper threads charges their work to itself (per-operation counts then
/// stay whole).
pub fn add_counters(c: &Counters) {
    COUNTERS.with(|x| {
        let mut v = x.get();
        v.flushes += c.flushes;
        v.fences += c.fences;
        v.bytes_flushed += c.bytes_flushed;
        x.set(v);
    });
}

pub(crate) fn count_flush(lines: u64) {
    COUNTERS.with(|c| {
        let mut v = c.get();
        v.flushes += lines;
        v.bytes_flushed += lines * CACHE_LINE as u64;
        c.set(v);
    });
}

pub(crate) fn count_fence() {
    COUNTERS.with(|c| {
        let mut v = c.get();
        v.fences += 1;
        c.set(v);
    });
}

static WRITE_DELAY_NS: AtomicU64 = AtomicU64::new(0);

/// Sets the emulated PM write latency: every flushed line then costs this
/// many extra nanoseconds (busy-waited), as the level-hashing paper did to
/// emulate PM on DRAM. 0 turns it off. Process-wide.
pub fn set_write_latency_ns(ns: u64) {
    WRITE_DELAY_NS.store(ns, Ordering::Relaxed);
}

/// The emulated write latency per flushed line, in ns.
pub fn write_latency_ns() -> u64 {
    WRITE_DELAY_NS.load(Ordering::Relaxed)
}

#[inline]
pub(crate) fn emulate_latency(lines: u64) {
    let ns = WRITE_DELAY_NS.load(Ordering::Relaxed);
    if ns != 0 {
        let until = Instant::now() + Duration::from_nanos(ns * lines);
        while Instant::now() < until {
            std::hint::spin_loop();
        }
    }
}

/// Number of cache lines covered by `[addr, addr+len)`.
#[inline]
pub(crate) fn lines_covered(addr: usize, len: usize) -> u64 {
    if len == 0 {
        return 0;
    }
    let first = addr / CACHE_LINE;
    let last = (addr + len - 1) / CACHE_LINE;
    (last - first + 1) as u64
}

/// Writes back every cache line of `[addr, addr+len)` with the detected
/// instruction. Not ordered with later stores until [`fence`].
#[inline]
pub(crate) fn flush_range(addr: *const u8, len: usize) {
    if len == 0 {
        return;
    }
    let start = addr as usize & !(CACHE_LINE - 1);
    let end = addr as usize + len;
    let instr = flush_instr();
    let mut line = start;
    while line < end {
        flush_line(instr, line as *const u8);
        line += CACHE_LINE;
    }
    let lines = lines_covered(addr as usize, len);
    count_flush(lines);
    emulate_latency(lines);
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn flush_line(instr: FlushInstr, p: *const u8) {
    // SAFETY: the flush instructions take any address that is mapped; callers
    // pass addresses inside a live mapping. They do not modify memory contents.
    unsafe {
        match instr {
            FlushInstr::Clwb => {
                std::arch::asm!("clwb [{0}]", in(reg) p, options(nostack, preserves_flags))
            }
            FlushInstr::Clflushopt => {
                std::arch::asm!("clflushopt [{0}]", in(reg) p, options(nostack, preserves_flags))
            }
            FlushInstr::Clflush => {
                std::arch::asm!("clflush [{0}]", in(reg) p, options(nostack, preserves_flags))
            }
            FlushInstr::Unsupported => {}
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn flush_line(_instr: FlushInstr, _p: *const u8) {}

/// Writes back one cache line and fences: the common persist of a hash
/// table slot, with one counter update instead of two.
#[inline]
pub(crate) fn persist_one_line(addr: *const u8) {
    flush_line(flush_instr(), addr);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sfence has no operands and no memory effects besides ordering.
    unsafe {
        std::arch::asm!("sfence", options(nostack, preserves_flags));
    }
    #[cfg(not(target_arch = "x86_64"))]
    std::sync::atomic::fence(Ordering::SeqCst);
    COUNTERS.with(|c| {
        let mut v = c.get();
        v.flushes += 1;
        v.fences += 1;
        v.bytes_flushed += CACHE_LINE as u64;
        c.set(v);
    });
    emulate_latency(1);
}

/// Store fence: orders every earlier flush and non-temporal store before any
/// later store.
#[inline]
pub(crate) fn fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sfence has no operands and no memory effects besides ordering.
    unsafe {
        std::arch::asm!("sfence", options(nostack, preserves_flags));
    }
    #[cfg(not(target_arch = "x86_64"))]
    std::sync::atomic::fence(Ordering::SeqCst);
    count_fence();
}

/// Copies `src` to `dst` with non-temporal stores where both are 8-byte
/// aligned (bypassing the cache, so no flush is needed), and with ordinary
/// stores plus flushes for the unaligned head and tail. Needs a [`fence`]
/// afterwards, like a flush.
///
/// # Safety
/// `dst..dst+src.len()` must be valid for writes and not overlap `src`.
pub(crate) unsafe fn nt_copy(dst: *mut u8, src: &[u8]) {
    let len = src.len();
    if len == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::_mm_stream_si64;
        let mut i = 0usize;
        // Head: ordinary stores up to 8-byte alignment.
        while i < len && !(dst as usize + i).is_multiple_of(8) {
            // SAFETY: `i < len`, inside the range the caller made valid.
            unsafe { *dst.add(i) = src[i] };
            i += 1;
        }
        let head = i;
        while i + 8 <= len {
            let w = i64::from_ne_bytes(src[i..i + 8].try_into().unwrap());
            // SAFETY: `i + 8 <= len` and `dst + i` is 8-aligned (the head
            // loop above), inside the caller's range.
            unsafe { _mm_stream_si64(dst.add(i) as *mut i64, w) };
            i += 8;
        }
        let tail = i;
        while i < len {
            // SAFETY: `i < len`, inside the range the caller made valid.
            unsafe { *dst.add(i) = src[i] };
            i += 1;
        }
        // The cached head and tail still need write-back.
        if head > 0 {
            flush_range(dst, head);
        }
        if tail < len {
            // SAFETY: `tail < len`, inside the caller's range.
            flush_range(unsafe { dst.add(tail) }, len - tail);
        }
        let nt_lines = lines_covered(dst as usize + head, tail - head);
        count_flush(nt_lines);
        emulate_latency(nt_lines);
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        // SAFETY: the caller made `dst..dst+len` valid for writes and
        // disjoint from `src`.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, len) };
        flush_range(dst, len);
    }
}

/// Zeroes `[dst, dst+len)` with non-temporal stores: the zeros go to
/// memory without passing through the cache (no write-back to wait for,
/// nothing evicted), so zeroing a large range costs no flush per line and
/// leaves the cache to the data around it. `dst` and `len` must be
/// multiples of 64. Needs a [`fence`] afterwards, like a flush.
///
/// # Safety
/// `dst..dst+len` must be valid for writes.
pub(crate) unsafe fn nt_zero(dst: *mut u8, len: usize) {
    assert!(
        (dst as usize).is_multiple_of(64) && len.is_multiple_of(64),
        "nt_zero needs whole lines"
    );
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_setzero_si128, _mm_stream_si128};
        // SAFETY: SSE2 is part of x86_64.
        let z = unsafe { _mm_setzero_si128() };
        let mut i = 0usize;
        while i < len {
            // SAFETY: the line `[dst + i, dst + i + 64)` is inside the
            // caller's range (`i < len`, both multiples of 64) and 16-aligned
            // (`dst` is line-aligned, checked above).
            unsafe {
                let p = dst.add(i) as *mut std::arch::x86_64::__m128i;
                _mm_stream_si128(p, z);
                _mm_stream_si128(p.add(1), z);
                _mm_stream_si128(p.add(2), z);
                _mm_stream_si128(p.add(3), z);
            }
            i += 64;
        }
        let lines = (len / 64) as u64;
        count_flush(lines);
        emulate_latency(lines);
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        // SAFETY: the caller made `dst..dst+len` valid for writes.
        unsafe { std::ptr::write_bytes(dst, 0, len) };
        flush_range(dst, len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn added_counters_are_charged_to_this_thread() {
        let before = counters();
        let helper = std::thread::spawn(|| {
            let start = counters();
            let buf = vec![0u8; 256];
            flush_range(buf.as_ptr(), 256);
            fence();
            (
                counters().since(&start),
                lines_covered(buf.as_ptr() as usize, 256),
            )
        })
        .join()
        .unwrap();
        let (helper, lines) = helper;
        assert_eq!(counters().since(&before), Counters::default());
        assert_eq!(helper.flushes, lines);
        add_counters(&helper);
        let d = counters().since(&before);
        assert_eq!(
            (d.flushes, d.fences, d.bytes_flushed),
            (lines, 1, lines * 64)
        );
    }

    #[test]
    fn detects_an_instruction_and_counts() {
        let instr = flush_instr();
        assert_eq!(instr, flush_instr(), "detection is stable");
        let buf = vec![0u8; 256];
        let before = counters();
        flush_range(buf.as_ptr().wrapping_add(1), 130);
        fence();
        let d = counters().since(&before);
        assert_eq!(d.flushes, lines_covered(buf.as_ptr() as usize + 1, 130));
        assert_eq!(d.fences, 1);
        assert_eq!(d.bytes_flushed, d.flushes * 64);
    }

    #[test]
    fn nt_copy_copies_every_byte() {
        for off in 0..9 {
            for len in [0usize, 1, 7, 8, 9, 63, 64, 65, 200] {
                let src: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
                let mut dst = vec![0u8; 300];
                // SAFETY: dst has room for off + len bytes and does not overlap src.
                unsafe { nt_copy(dst.as_mut_ptr().add(off), &src) };
                fence();
                assert_eq!(&dst[off..off + len], &src[..]);
                assert!(dst[..off].iter().all(|&b| b == 0));
                assert!(dst[off + len..].iter().all(|&b| b == 0));
            }
        }
    }

    #[test]
    fn write_latency_slows_flushes() {
        let buf = vec![0u8; 64 * 100];
        set_write_latency_ns(2_000);
        let t = Instant::now();
        flush_range(buf.as_ptr(), buf.len());
        let took = t.elapsed();
        set_write_latency_ns(0);
        // 100 lines (or 101 if unaligned) x 2 us >= 200 us.
        assert!(took >= Duration::from_micros(200), "took {took:?}");
    }
}
