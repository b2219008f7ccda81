//! The FS-directory: a flat array of segment offsets in DRAM, indexed by
//! the top GD bits of a hash, doubled lazily (the paper's §3.3 and §4.1).
//!
//! Each directory carries its own GD, so the (pointer, GD) pair the paper
//! guards with two version numbers is one pointer here. A doubling
//! allocates a directory of nulls, links it with one CAS on the old one's
//! `next` and swings the current pointer; entries are copied on first
//! touch (`resolve`) by CAS from null, so a filler never overwrites what a
//! split stored. Splits and merges store into the current directory and
//! every newer one (`set_range`). Old directories stay allocated until the
//! table is dropped: readers may still hold them, and they are the
//! `prior` source of lazy filling. Together they never exceed the current
//! directory's size.
//!
//! One concept, this DRAM structure alone: the splits and merges that
//! change it are in `split.rs`, the open that builds it in `recover.rs`.

use std::sync::atomic::{fence, AtomicPtr, AtomicU64, Ordering};
use std::sync::Mutex;

pub(crate) struct Dir {
    pub(crate) gd: u32,
    entries: Box<[AtomicU64]>,
    next: AtomicPtr<Dir>,
    prior: *const Dir,
}

impl Dir {
    fn boxed(gd: u32, prior: *const Dir) -> *mut Dir {
        Box::into_raw(Box::new(Dir {
            gd,
            entries: (0..1u64 << gd).map(|_| AtomicU64::new(0)).collect(),
            next: AtomicPtr::new(std::ptr::null_mut()),
            prior,
        }))
    }

    /// The entry for hash `h` (0 = not filled yet).
    #[inline]
    pub(crate) fn index(&self, h: u64) -> usize {
        (h >> (64 - self.gd)) as usize
    }

    #[inline]
    pub(crate) fn load(&self, i: usize) -> u64 {
        self.entries[i].load(Ordering::Acquire)
    }
}

pub(crate) struct FsDir {
    cur: AtomicPtr<Dir>,
    /// Every directory ever installed, freed on drop.
    all: Mutex<Vec<*mut Dir>>,
}

// SAFETY: the raw pointers name heap directories owned by `all` and freed
// only in `drop`; all shared state inside them is atomic.
unsafe impl Send for FsDir {}
// SAFETY: as above.
unsafe impl Sync for FsDir {}

impl FsDir {
    /// A directory of global depth `gd` with every entry set by `fill`.
    pub(crate) fn build(gd: u32, mut fill: impl FnMut(usize) -> u64) -> FsDir {
        let d = Dir::boxed(gd, std::ptr::null());
        // SAFETY: freshly boxed, not shared yet.
        let r = unsafe { &*d };
        for (i, e) in r.entries.iter().enumerate() {
            e.store(fill(i), Ordering::Relaxed);
        }
        FsDir {
            cur: AtomicPtr::new(d),
            all: Mutex::new(vec![d]),
        }
    }

    /// The current directory.
    #[inline]
    pub(crate) fn current(&self) -> &Dir {
        // SAFETY: every directory lives until `self` is dropped.
        unsafe { &*self.cur.load(Ordering::Acquire) }
    }

    /// The segment for entry `i` of `d`, copying it from the older
    /// directories if it was not filled yet.
    pub(crate) fn resolve<'a>(&'a self, d: &'a Dir, i: usize) -> u64 {
        let e = d.entries[i].load(Ordering::SeqCst);
        if e != 0 {
            return e;
        }
        // SAFETY: a directory with a null entry was made by a doubling and
        // has a prior, alive as long as `self`.
        let prior = unsafe { &*d.prior };
        let v = self.resolve(prior, i >> 1);
        for j in [i & !1, i | 1] {
            let _ = d.entries[j].compare_exchange(0, v, Ordering::SeqCst, Ordering::SeqCst);
        }
        d.entries[i].load(Ordering::SeqCst)
    }

    /// Doubles `from` (or adopts the doubling another thread made) and
    /// returns the newer directory, installed as current.
    pub(crate) fn double<'a>(&'a self, from: &'a Dir) -> &'a Dir {
        let mut next = from.next.load(Ordering::SeqCst);
        if next.is_null() {
            let mine = Dir::boxed(from.gd + 1, from);
            match from.next.compare_exchange(
                std::ptr::null_mut(),
                mine,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => {
                    self.all.lock().expect("directory list").push(mine);
                    next = mine;
                }
                Err(theirs) => {
                    // SAFETY: `mine` was never shared.
                    drop(unsafe { Box::from_raw(mine) });
                    next = theirs;
                }
            }
        }
        let _ = self.cur.compare_exchange(
            from as *const Dir as *mut Dir,
            next,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
        // SAFETY: alive as long as `self`.
        unsafe { &*next }
    }

    /// Points the entries of the segment (`ld`, `index` = its prefix as an
    /// `ld`-bit integer) at `seg` in `from` and every newer directory.
    /// Called with the segment's lock held, after the RT-directory change
    /// is durable.
    pub(crate) fn set_range(&self, from: &Dir, ld: u32, index: u64, seg: u64) {
        let mut d: *const Dir = from;
        while !d.is_null() {
            // SAFETY: alive as long as `self`.
            let r = unsafe { &*d };
            // A directory shallower than the segment cannot name it.
            if r.gd >= ld {
                let shift = r.gd - ld;
                let start = (index << shift) as usize;
                for e in &r.entries[start..start + (1usize << shift)] {
                    e.store(seg, Ordering::SeqCst);
                }
            }
            fence(Ordering::SeqCst);
            d = r.next.load(Ordering::SeqCst);
        }
    }

    /// Bytes of DRAM held by all directories.
    pub(crate) fn bytes(&self) -> u64 {
        let all = self.all.lock().expect("directory list");
        all.iter()
            // SAFETY: alive as long as `self`.
            .map(|&d| unsafe { &*d }.entries.len() as u64 * 8)
            .sum()
    }
}

impl Drop for FsDir {
    fn drop(&mut self) {
        for d in self.all.get_mut().expect("directory list").drain(..) {
            // SAFETY: each pointer came from `Box::into_raw` and is freed once.
            drop(unsafe { Box::from_raw(d) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lazy_doubling_fills_from_prior_and_keeps_split_stores() {
        let fs = FsDir::build(1, |i| 100 + i as u64);
        let d1 = fs.current();
        let d2 = fs.double(d1);
        assert_eq!(d2.gd, 2);
        assert_eq!(fs.current().gd, 2);
        // A split of segment 101 (ld 1, index 1) into ld 2 stores into d2.
        fs.set_range(d1, 2, 3, 555);
        assert_eq!(fs.resolve(d2, 3), 555);
        assert_eq!(fs.resolve(d2, 2), 101, "filled from the prior");
        let d3 = fs.double(d2);
        assert_eq!(fs.resolve(d3, 0), 100, "two doublings: recursive fill");
        assert_eq!(fs.resolve(d3, 7), 555);
        assert!(fs.bytes() >= 8 * (2 + 4 + 8));
    }
}
