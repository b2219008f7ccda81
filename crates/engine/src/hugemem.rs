//! [`HugeWords`]: a zeroed DRAM array of `AtomicU64` that asks the kernel
//! for transparent huge pages (`madvise(MADV_HUGEPAGE)`), for the large,
//! randomly probed DRAM structures (the cuckoo filter). With 4 KiB pages
//! every probe of a 32 MiB array is a TLB miss as well as a cache miss; a
//! 2 MiB page covers 512 times more. Where the kernel says no (THP off, or
//! `mmap` fails) the array is an ordinary heap allocation: same contents,
//! only slower.

use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;

const HUGE: usize = 2 << 20;

/// See the module documentation.
pub struct HugeWords {
    ptr: NonNull<AtomicU64>,
    len: usize,
    /// The mapping to unmap on drop (`None`: `heap` holds the words).
    map: Option<(NonNull<libc::c_void>, usize)>,
    heap: Option<Box<[AtomicU64]>>,
}

// SAFETY: the words are atomics; the mapping is owned by this value and
// only unmapped by its drop.
unsafe impl Send for HugeWords {}
// SAFETY: as above: shared access goes through `&[AtomicU64]`.
unsafe impl Sync for HugeWords {}

impl HugeWords {
    /// `n` words, all zero.
    pub fn zeroed(n: usize) -> HugeWords {
        let bytes = n.saturating_mul(8);
        if bytes >= HUGE {
            if let Some(w) = Self::mapped(n, bytes) {
                return w;
            }
        }
        let mut heap: Box<[AtomicU64]> = (0..n).map(|_| AtomicU64::new(0)).collect();
        HugeWords {
            ptr: NonNull::new(heap.as_mut_ptr()).unwrap_or(NonNull::dangling()),
            len: n,
            map: None,
            heap: Some(heap),
        }
    }

    /// An anonymous mapping, 2 MiB aligned, advised for huge pages.
    fn mapped(n: usize, bytes: usize) -> Option<HugeWords> {
        let len = bytes.checked_add(HUGE)?;
        let base = map_anonymous(len)?.as_ptr();
        let start = (base as usize).next_multiple_of(HUGE);
        // SAFETY: [start, start + bytes) lies inside the mapping just made
        // (it is `bytes + HUGE` long); the advice only affects paging.
        unsafe { libc::madvise(start as *mut libc::c_void, bytes, libc::MADV_HUGEPAGE) };
        Some(HugeWords {
            ptr: NonNull::new(start as *mut AtomicU64)?,
            len: n,
            map: Some((NonNull::new(base)?, len)),
            heap: None,
        })
    }

    /// Whether the words live in a huge-page-advised mapping.
    #[cfg(test)]
    fn is_mapped(&self) -> bool {
        self.map.is_some()
    }

    /// Gives the pages lying wholly inside words `[from, to)` back to the
    /// system (`madvise(MADV_DONTNEED)`): they read zero afterwards and
    /// take memory again only when written. For a part of the array its
    /// owner is done with while the rest is in use. Only a mapped array's
    /// pages are given back; returns the bytes given back.
    pub fn discard(&self, from: usize, to: usize) -> usize {
        if self.map.is_none() || from >= to || to > self.len {
            return 0;
        }
        let page = 4096usize;
        let base = self.ptr.as_ptr() as usize;
        let start = (base + from * 8).next_multiple_of(page);
        let end = (base + to * 8) / page * page;
        if end <= start {
            return 0;
        }
        // SAFETY: [start, end) lies inside this array's mapping (checked
        // above: whole pages within words [from, to) of `len`). The words
        // are atomics and stay mapped: any later load reads zero.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
        end - start
    }
}

/// A new anonymous private read-write mapping of `len` bytes (zero-filled,
/// no address hint), or `None` where the kernel refuses it. The caller
/// owns it and unmaps it.
pub fn map_anonymous(len: usize) -> Option<NonNull<libc::c_void>> {
    // SAFETY: an anonymous private mapping with no address hint touches no
    // memory of ours; the result is checked before use.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return None;
    }
    NonNull::new(base)
}

impl Deref for HugeWords {
    type Target = [AtomicU64];
    fn deref(&self) -> &[AtomicU64] {
        // SAFETY: `ptr` points to `len` zero-initialised (mmap zero-fills)
        // or constructed AtomicU64s, aligned (2 MiB or the heap's), alive
        // until drop.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for HugeWords {
    fn drop(&mut self) {
        self.heap = None;
        if let Some((base, len)) = self.map.take() {
            // SAFETY: the mapping made in `mapped`, unmapped once; no
            // borrow of it outlives `self`.
            unsafe { libc::munmap(base.as_ptr(), len) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn small_and_large_arrays_are_zeroed_and_writable() {
        for n in [0, 1, 1000, (4 << 20) / 8 + 3] {
            let w = HugeWords::zeroed(n);
            assert_eq!(w.len(), n);
            assert!(w.iter().all(|x| x.load(Ordering::Relaxed) == 0));
            for (i, x) in w.iter().enumerate() {
                x.store(i as u64, Ordering::Relaxed);
            }
            assert!(w
                .iter()
                .enumerate()
                .all(|(i, x)| x.load(Ordering::Relaxed) == i as u64));
            if n >= HUGE / 8 {
                assert!(w.is_mapped());
                assert_eq!(w.as_ptr() as usize % HUGE, 0);
            }
        }
    }

    #[test]
    fn discarded_pages_read_zero_and_the_rest_is_kept() {
        let n = (4 << 20) / 8;
        let w = HugeWords::zeroed(n);
        for (i, x) in w.iter().enumerate() {
            x.store(i as u64 + 1, Ordering::Relaxed);
        }
        // Words 1000..300_000: the whole pages inside go, the partial
        // pages at both ends stay.
        let gone = w.discard(1000, 300_000);
        assert_eq!(gone % 4096, 0);
        assert!(gone > 2 << 20, "{gone} bytes given back");
        let first = 1000usize.next_multiple_of(512);
        let last = 300_000 / 512 * 512;
        for (i, x) in w.iter().enumerate() {
            let want = if (first..last).contains(&i) {
                0
            } else {
                i as u64 + 1
            };
            assert_eq!(x.load(Ordering::Relaxed), want, "word {i}");
        }
        assert_eq!(w.discard(10, 5), 0);
        assert_eq!(w.discard(0, n + 1), 0);
        assert_eq!(HugeWords::zeroed(1000).discard(0, 1000), 0, "heap array");
    }
}
