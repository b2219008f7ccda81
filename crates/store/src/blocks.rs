//! [`BlockPool`]: zeroed blocks of `AtomicU64` for the point map's tables,
//! carved from the pool's own 64 MiB anonymous mappings (advised for
//! transparent huge pages) and reused once freed.
//!
//! - **Why not `malloc`.** A shard's table is replaced by one twice its
//!   size as the store grows, and the old one is freed a few milliseconds
//!   later. From `malloc`, the large new tables come from fresh `mmap`s
//!   (glibc's threshold) and the freed ones go back to the system, so
//!   every doubling faults in and zeroes fresh pages: in a 10M-key load
//!   grown from 64k keys, page faults held a quarter of all samples and the
//!   rebuilds about 30% of the load's time (`docs/store.md`, "The point
//!   index's rebuilds"). Here a freed table's memory is kept, already
//!   faulted, for the next one.
//! - **Buddy blocks.** A block of order `k` is `4 KiB << k` bytes and
//!   starts at a multiple of its size within its chunk (chunks are aligned
//!   to their size). A freed block merges with its buddy (its address xor
//!   its size) while that one is free too, so the halves that doubling
//!   tables leave behind become whole blocks again for the next doubling
//!   (shards grow at nearly the same key count, so a block of the size
//!   just freed is seldom wanted).
//! - **Warm and cold.** A free block is *warm* (its pages are in memory)
//!   or *cold* (never written since its chunk was mapped, or given back by
//!   a trim: it reads zero, and its first touch faults). A request takes a
//!   warm block when one is large enough, and a cold one only when none
//!   is. A warm block that has been written is zeroed (in the caller,
//!   outside the pool's lock) before it is handed out.
//!   [`BlockPool::warm_up`] makes a cold block warm ahead of the request
//!   that will want it (the store's idle-class prefault thread, for the
//!   point index's next doubling: `PointMap::warm_up`); it still reads
//!   zero, so it is neither zeroed again nor counted as written, and only
//!   a trim or the pool's drop gives it back.
//! - **Memory.** Free blocks stay warm (the next doubling wants them)
//!   until the written free blocks outweigh the blocks in use, as when a
//!   store's keys are mostly deleted and its tables rebuilt smaller: then
//!   the freeing call trims the pool ([`BlockPool::trim`], which the
//!   index's release at close also calls). A trim gives every warm free
//!   block's pages back and unmaps wholly free chunks. A table-doubling
//!   load stays under the threshold: the memory it leaves free peaks at
//!   about half of the live tables' (the unit test
//!   `doubling_tables_reuse_the_freed_halves`: 192 MiB mapped for 128
//!   live).
//!   The smallest cost: a store with any table of 4 KiB or more maps one
//!   chunk (64 MiB of address space), and its first block takes a whole
//!   2 MiB page where the kernel gives huge pages.
//!
//! Requests outside `[4 KiB, 64 MiB]` are not served ([`BlockPool::take`]
//! says `None`): the caller takes its words from elsewhere.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

/// log2 of the smallest block's bytes.
const MIN_SHIFT: u32 = 12;
/// Orders 0 (4 KiB) ..= `ORDERS - 1` (one whole chunk).
const ORDERS: usize = 15;
/// A chunk's bytes, and its alignment.
const CHUNK: usize = 1 << (MIN_SHIFT as usize + ORDERS - 1);
/// The largest block [`BlockPool::warm_up`] faults in at once: one huge
/// page, aligned to its size like every block.
const WARM_UP_BYTES: usize = 2 << 20;
fn block_bytes(order: usize) -> usize {
    1 << (MIN_SHIFT as usize + order)
}

/// The order of the smallest block of at least `bytes` (at least 4 KiB).
fn order_of(bytes: usize) -> usize {
    (bytes
        .max(1)
        .next_power_of_two()
        .trailing_zeros()
        .max(MIN_SHIFT)
        - MIN_SHIFT) as usize
}

/// See the module documentation.
#[derive(Default)]
pub(crate) struct BlockPool {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The warm free blocks of each order: address → whether it reads zero.
    warm: [BTreeMap<usize, bool>; ORDERS],
    /// The cold free blocks of each order (they read zero).
    cold: [BTreeSet<usize>; ORDERS],
    /// Base addresses of the mapped chunks.
    chunks: Vec<usize>,
    /// Bytes of the blocks handed out.
    used: usize,
    /// Bytes of the warm free blocks, and of those that do not read zero.
    warm_bytes: usize,
    dirty: usize,
    /// Bytes of the cold blocks handed out (unit tests).
    #[cfg(test)]
    cold_taken: usize,
}

/// A block of zeroed words from a [`BlockPool`], back to it on drop.
pub(crate) struct Block {
    ptr: NonNull<AtomicU64>,
    order: u8,
    pool: Arc<BlockPool>,
}

// SAFETY: the words are atomics; the block is the only owner of its range
// of the pool's mapping until its drop hands the range back.
unsafe impl Send for Block {}
// SAFETY: as above: shared access goes through `&[AtomicU64]`.
unsafe impl Sync for Block {}

impl BlockPool {
    /// `words` zeroed words (rounded up to a power-of-two block), or `None`
    /// when the request is outside the served sizes or no chunk could be
    /// mapped.
    pub(crate) fn take(self: &Arc<Self>, words: usize) -> Option<Block> {
        let bytes = Self::serves(words)?;
        let order = order_of(bytes);
        let (addr, zero) = self.state.lock().expect("block pool").take(order)?;
        let ptr = NonNull::new(addr as *mut AtomicU64)?;
        if !zero {
            // SAFETY: [addr, addr + bytes) is this block's range of a live
            // chunk mapping, owned by no one else until the block is freed;
            // zero bytes are valid `AtomicU64`s.
            unsafe { std::ptr::write_bytes(ptr.as_ptr() as *mut u8, 0, bytes) };
        }
        Some(Block {
            ptr,
            order: order as u8,
            pool: self.clone(),
        })
    }

    /// Gives every warm free block's pages back to the system (they read
    /// zero afterwards and take memory again only when written) and unmaps
    /// the chunks that are wholly free. Returns the bytes given back.
    pub(crate) fn trim(&self) -> usize {
        self.state.lock().expect("block pool").trim()
    }

    /// The bytes of the block [`take`](Self::take) hands out for `words`
    /// words, or `None` when it does not serve the size.
    pub(crate) fn serves(words: usize) -> Option<usize> {
        let bytes = words.checked_mul(8)?.max(1).checked_next_power_of_two()?;
        (block_bytes(0)..=CHUNK).contains(&bytes).then_some(bytes)
    }

    /// Faults in (writes) one cold block of at most `max_bytes` (2 MiB, a
    /// huge page, when that fits) and puts it back warm and zero, so that
    /// the next request that would have taken it cold finds its pages in
    /// memory. Maps a chunk when no cold block is left. Returns the bytes
    /// faulted in: 0 when `max_bytes` is under 4 KiB or no chunk could be
    /// mapped. The block is off the free lists while its pages are
    /// touched, outside the pool's lock, so a concurrent request takes
    /// another block.
    pub(crate) fn warm_up(&self, max_bytes: usize) -> usize {
        if max_bytes < block_bytes(0) {
            return 0;
        }
        // The largest block of at most `max_bytes` and a huge page.
        let order = (max_bytes.min(WARM_UP_BYTES).ilog2() - MIN_SHIFT) as usize;
        let addr = {
            let mut s = self.state.lock().expect("block pool");
            let k = (order..ORDERS).find(|&k| !s.cold[k].is_empty());
            match s.split_cold(k, order) {
                Some(a) => a,
                None => return 0,
            }
        };
        let bytes = block_bytes(order);
        for page in (addr..addr + bytes).step_by(4096) {
            // SAFETY: `page` lies in [addr, addr + bytes), a cold block of
            // a live chunk taken off the free lists above: no one else
            // reads or writes it until `give` puts it back. It reads zero
            // (cold), so writing a zero changes nothing but residency.
            unsafe { std::ptr::write_volatile(page as *mut u8, 0) };
        }
        self.state
            .lock()
            .expect("block pool")
            .give(addr, order, true);
        bytes
    }

    /// Bytes of the warm free blocks (faulted in, ready to be taken without
    /// a fault).
    pub(crate) fn warm_bytes(&self) -> usize {
        self.state.lock().expect("block pool").warm_bytes
    }

    /// Bytes of the cold blocks handed out so far.
    #[cfg(test)]
    pub(crate) fn cold_taken(&self) -> usize {
        self.state.lock().expect("block pool").cold_taken
    }

    /// Bytes of the chunks mapped now.
    #[cfg(test)]
    fn mapped(&self) -> usize {
        self.state.lock().expect("block pool").chunks.len() * CHUNK
    }
}

impl State {
    /// A free block of `order` and whether it reads zero: split from the
    /// smallest warm block that is large enough, else from the smallest
    /// such cold one, else from a new chunk.
    fn take(&mut self, order: usize) -> Option<(usize, bool)> {
        let r = match (order..ORDERS).find(|&k| !self.warm[k].is_empty()) {
            Some(k) => {
                let (addr, zero) = self.warm[k].pop_first()?;
                // The upper halves go back warm, each as zero as the block
                // they came from.
                for j in order..k {
                    self.warm[j].insert(addr + block_bytes(j), zero);
                }
                self.warm_bytes -= block_bytes(order);
                if !zero {
                    self.dirty -= block_bytes(order);
                }
                (addr, zero)
            }
            None => {
                #[cfg(test)]
                {
                    self.cold_taken += block_bytes(order);
                }
                let k = (order..ORDERS).find(|&k| !self.cold[k].is_empty());
                (self.split_cold(k, order)?, true)
            }
        };
        self.used += block_bytes(order);
        Some(r)
    }

    /// A cold block of `order` split from cold block order `k` (a new
    /// chunk when `None`); the upper halves stay cold.
    fn split_cold(&mut self, k: Option<usize>, order: usize) -> Option<usize> {
        let (k, addr) = match k {
            Some(k) => (k, self.cold[k].pop_first()?),
            None => (ORDERS - 1, self.map_chunk()?),
        };
        for j in order..k {
            self.cold[j].insert(addr + block_bytes(j));
        }
        Some(addr)
    }

    /// Puts the block of `order` at `addr` back on the warm free lists,
    /// merged with its warm free buddies; `zero`: it reads zero. (A cold
    /// buddy stays apart, so that a warm block is wholly faulted in.)
    fn give(&mut self, mut addr: usize, mut order: usize, mut zero: bool) {
        while order < ORDERS - 1 {
            let size = block_bytes(order);
            let buddy = addr ^ size;
            let Some(z) = self.warm[order].remove(&buddy) else {
                break;
            };
            self.warm_bytes -= size;
            if !z {
                self.dirty -= size;
            }
            zero &= z;
            addr = addr.min(buddy);
            order += 1;
        }
        self.warm[order].insert(addr, zero);
        self.warm_bytes += block_bytes(order);
        if !zero {
            self.dirty += block_bytes(order);
        }
    }

    /// Frees a block handed out (it has been written); trims the pool when
    /// the written free blocks outweigh the blocks in use.
    fn free(&mut self, addr: usize, order: usize) {
        self.used -= block_bytes(order);
        self.give(addr, order, false);
        if self.dirty > self.used {
            self.trim();
        }
    }

    /// Puts the cold block of `order` at `addr` on the cold free lists,
    /// merged with its cold free buddies.
    fn put_cold(&mut self, mut addr: usize, mut order: usize) {
        while order < ORDERS - 1 && self.cold[order].remove(&(addr ^ block_bytes(order))) {
            addr &= !block_bytes(order);
            order += 1;
        }
        self.cold[order].insert(addr);
    }

    /// See [`BlockPool::trim`].
    fn trim(&mut self) -> usize {
        let mut given = 0;
        for k in 0..ORDERS {
            for (addr, _) in std::mem::take(&mut self.warm[k]) {
                // SAFETY: a free block's range of a live chunk: no block
                // handed out lies in it; its pages read zero afterwards.
                unsafe {
                    libc::madvise(
                        addr as *mut libc::c_void,
                        block_bytes(k),
                        libc::MADV_DONTNEED,
                    )
                };
                self.put_cold(addr, k);
                given += block_bytes(k);
            }
        }
        self.warm_bytes = 0;
        self.dirty = 0;
        for base in std::mem::take(&mut self.cold[ORDERS - 1]) {
            self.chunks.retain(|&c| c != base);
            // SAFETY: a wholly free chunk: no block lies in it, and it was
            // mapped by `map_chunk` with exactly this base and length.
            unsafe { libc::munmap(base as *mut libc::c_void, CHUNK) };
        }
        given
    }

    /// A new chunk, aligned to its size and advised for huge pages.
    fn map_chunk(&mut self) -> Option<usize> {
        let len = 2 * CHUNK;
        let base = engine::hugemem::map_anonymous(len)?.as_ptr() as usize;
        let start = base.next_multiple_of(CHUNK);
        // SAFETY: [base, start) and [start + CHUNK, base + len) lie inside
        // the mapping just made and hold nothing; the chunk [start, start +
        // CHUNK) stays mapped. The advice only affects paging.
        unsafe {
            if start > base {
                libc::munmap(base as *mut libc::c_void, start - base);
            }
            let end = start + CHUNK;
            if base + len > end {
                libc::munmap(end as *mut libc::c_void, base + len - end);
            }
            libc::madvise(start as *mut libc::c_void, CHUNK, libc::MADV_HUGEPAGE);
        }
        self.chunks.push(start);
        Some(start)
    }
}

impl Drop for BlockPool {
    fn drop(&mut self) {
        let s = self.state.get_mut().expect("block pool");
        for &c in &s.chunks {
            // SAFETY: every block holds the pool alive, so none is left;
            // each chunk was mapped by `map_chunk` with this base and
            // length and is unmapped once.
            unsafe { libc::munmap(c as *mut libc::c_void, CHUNK) };
        }
    }
}

impl Deref for Block {
    type Target = [AtomicU64];
    fn deref(&self) -> &[AtomicU64] {
        // SAFETY: the block's range (zeroed when handed out, so every word
        // is a valid `AtomicU64`) belongs to it until its drop, and the
        // chunk stays mapped while the pool (held by `self`) lives.
        unsafe {
            std::slice::from_raw_parts(self.ptr.as_ptr(), block_bytes(self.order as usize) / 8)
        }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        self.pool
            .state
            .lock()
            .expect("block pool")
            .free(self.ptr.as_ptr() as usize, self.order as usize);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    fn fill(b: &Block, v: u64) {
        for w in b.iter() {
            w.store(v, Ordering::Relaxed);
        }
    }

    #[test]
    fn sizes_outside_the_served_range_are_refused() {
        let p = Arc::new(BlockPool::default());
        assert!(p.take(1).is_none(), "under 4 KiB");
        assert!(p.take(CHUNK / 8 + 1).is_none(), "over a chunk");
        assert_eq!(p.take(512).expect("4 KiB").len(), 512);
        assert_eq!(p.take(513).expect("rounded up").len(), 1024);
        assert_eq!(p.take(CHUNK / 8).expect("a chunk").len(), CHUNK / 8);
    }

    #[test]
    fn reused_blocks_read_zero_and_buddies_merge() {
        let p = Arc::new(BlockPool::default());
        // Two 4 KiB halves of one 8 KiB block, written and freed: they
        // merge, and the 8 KiB block handed out next is that one, zeroed.
        let a = p.take(512).unwrap();
        let b = p.take(512).unwrap();
        let (pa, pb) = (a.as_ptr() as usize, b.as_ptr() as usize);
        assert_eq!(pa ^ pb, 4096, "buddies");
        fill(&a, 7);
        fill(&b, 9);
        drop(a);
        drop(b);
        let c = p.take(1024).unwrap();
        assert_eq!(c.as_ptr() as usize, pa.min(pb), "the merged block");
        assert!(c.iter().all(|w| w.load(Ordering::Relaxed) == 0));
        assert_eq!(p.mapped(), CHUNK, "one chunk served them all");
    }

    #[test]
    fn doubling_tables_reuse_the_freed_halves() {
        // 64 "shards" doubling from 4 KiB to 2 MiB, each freeing its old
        // table after its new one is taken: the freed blocks merge and
        // serve later doublings, so fewer chunks are mapped than the bytes
        // ever taken would fill.
        let p = Arc::new(BlockPool::default());
        let mut tables: Vec<Block> = (0..64).map(|_| p.take(512).unwrap()).collect();
        let mut taken = 64 * 4096;
        for g in 1..=9 {
            for t in tables.iter_mut() {
                let new = p.take(512 << g).unwrap();
                fill(&new, g);
                taken += new.len() * 8;
                *t = new;
            }
        }
        assert!(tables
            .iter()
            .all(|t| t.iter().all(|w| w.load(Ordering::Relaxed) == 9)));
        // 256 MiB taken in all, 128 MiB live at the end: three chunks.
        assert_eq!(taken, 64 * 4096 * 1023);
        assert!(
            p.mapped() <= 3 * CHUNK,
            "mapped {} of {taken} taken",
            p.mapped()
        );
        drop(tables);
        p.trim();
        assert_eq!(p.mapped(), 0, "wholly free chunks are unmapped");
    }

    #[test]
    fn a_mostly_free_pool_gives_its_memory_back() {
        let p = Arc::new(BlockPool::default());
        // Four chunks' worth of 1 MiB blocks, written.
        let mut blocks: Vec<Block> = (0..256).map(|_| p.take(1 << 17).unwrap()).collect();
        blocks.iter().for_each(|b| fill(b, 1));
        assert_eq!(p.mapped(), 4 * CHUNK);
        // Half of them freed (every other one, so none merges): kept for
        // reuse.
        let mut i = 0;
        blocks.retain(|_| {
            i += 1;
            i % 2 == 0
        });
        assert_eq!(p.state.lock().unwrap().dirty, 2 * CHUNK);
        // One more: the free blocks outweigh those in use, so the freed
        // blocks' pages go back.
        blocks.pop();
        assert_eq!(p.state.lock().unwrap().dirty, 0);
        assert_eq!(p.mapped(), 4 * CHUNK, "no chunk was wholly free");
        // The rest freed: trims along the way, and the chunks are unmapped
        // as they empty.
        blocks.clear();
        {
            let s = p.state.lock().unwrap();
            assert!(s.dirty <= CHUNK, "trimmed along the way: {}", s.dirty);
        }
        p.trim();
        assert_eq!(p.mapped(), 0);
        // Reuse after a trim reads zero.
        let b = p.take(1 << 17).unwrap();
        assert!(b.iter().all(|w| w.load(Ordering::Relaxed) == 0));
    }

    /// Whether every 4 KiB page of `[addr, addr + bytes)` is resident.
    fn resident(addr: usize, bytes: usize) -> bool {
        let mut v = vec![0u8; bytes / 4096];
        // SAFETY: the range lies in a live chunk mapping (page-aligned);
        // `v` has one byte per page.
        let r = unsafe { libc::mincore(addr as *mut libc::c_void, bytes, v.as_mut_ptr()) };
        assert_eq!(r, 0, "mincore");
        v.iter().all(|b| b & 1 == 1)
    }

    #[test]
    fn warm_up_faults_in_a_cold_block_that_the_next_request_takes() {
        let p = Arc::new(BlockPool::default());
        assert_eq!(p.warm_up(4095), 0, "under the smallest block");
        let keep = p.take(512).unwrap();
        assert_eq!(p.warm_bytes(), 0);
        // Less than a huge page asked: the largest block that fits.
        assert_eq!(p.warm_up(3 << 19), 1 << 20);
        assert_eq!(p.warm_bytes(), 1 << 20);
        let n = p.warm_up(usize::MAX);
        assert_eq!(n, WARM_UP_BYTES, "one huge page at most");
        assert_eq!(p.warm_bytes(), (1 << 20) + WARM_UP_BYTES);
        // The next request of that size takes the warmed block: resident,
        // zero, and not zeroed again (it is not dirty).
        let b = p.take(WARM_UP_BYTES / 8).unwrap();
        assert_eq!(b.as_ptr() as usize % WARM_UP_BYTES, 0, "aligned");
        assert!(resident(b.as_ptr() as usize, WARM_UP_BYTES));
        assert!(b.iter().all(|w| w.load(Ordering::Relaxed) == 0));
        assert_eq!(p.warm_bytes(), 1 << 20);
        // A cold block, by contrast, is not resident until written.
        let c = p.take(WARM_UP_BYTES / 8).unwrap();
        assert!(!resident(c.as_ptr() as usize, WARM_UP_BYTES));
        drop((keep, b, c));
    }

    #[test]
    fn warm_up_maps_a_chunk_when_no_cold_block_is_left() {
        let p = Arc::new(BlockPool::default());
        let whole = p.take(CHUNK / 8).unwrap();
        assert_eq!(p.mapped(), CHUNK);
        assert_eq!(p.warm_up(WARM_UP_BYTES), WARM_UP_BYTES);
        assert_eq!(p.mapped(), 2 * CHUNK);
        drop(whole);
    }

    #[test]
    fn trimmed_blocks_read_zero_without_a_write() {
        let p = Arc::new(BlockPool::default());
        let keep = p.take(512).unwrap();
        let a = p.take(512).unwrap();
        fill(&a, 3);
        let pa = a.as_ptr() as usize;
        drop(a);
        assert!(p.trim() >= 4096);
        let b = p.take(512).unwrap();
        assert_eq!(b.as_ptr() as usize, pa);
        assert!(b.iter().all(|w| w.load(Ordering::Relaxed) == 0));
        drop(keep);
    }
}
