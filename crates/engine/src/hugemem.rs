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
        // SAFETY: an anonymous private mapping with no address hint; the
        // result is checked before use.
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
    pub fn is_mapped(&self) -> bool {
        self.map.is_some()
    }
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
}
