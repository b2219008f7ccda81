//! Epochs: when no reader can still hold an address into a file (gap F5).
//!
//! A reader [`pin`](Epochs::pin)s for the length of one operation: it
//! publishes the global epoch in its thread's slot. GC unlinks a file from
//! every DRAM map first, then calls [`synchronize`](Epochs::synchronize),
//! which advances the epoch and waits until every slot is empty or newer.
//! A reader that pinned after the unlink cannot find the file; one that
//! pinned before is waited for. Only then is the file freed.

use std::sync::atomic::{fence, AtomicU64, Ordering};

use engine::sync::thread_index;

const SLOTS: usize = 64;
/// Threads without a slot of their own share the last one as a count.
const SHARED: usize = SLOTS - 1;

#[repr(align(64))]
#[derive(Default)]
struct Slot(AtomicU64);

pub(crate) struct Epochs {
    global: AtomicU64,
    slots: [Slot; SLOTS],
}

/// Unpins on drop.
pub(crate) struct Pin<'a> {
    epochs: &'a Epochs,
    slot: usize,
    owner: bool,
}

impl Default for Epochs {
    fn default() -> Self {
        Epochs {
            global: AtomicU64::new(1),
            slots: std::array::from_fn(|_| Slot::default()),
        }
    }
}

impl Epochs {
    pub(crate) fn pin(&self) -> Pin<'_> {
        let i = thread_index().min(SHARED);
        if i == SHARED {
            self.slots[SHARED].0.fetch_add(1, Ordering::SeqCst);
            return Pin {
                epochs: self,
                slot: SHARED,
                owner: true,
            };
        }
        let s = &self.slots[i].0;
        if s.load(Ordering::Relaxed) != 0 {
            // Nested in a pin of this thread: the outer one covers it.
            return Pin {
                epochs: self,
                slot: i,
                owner: false,
            };
        }
        s.store(self.global.load(Ordering::Relaxed), Ordering::Relaxed);
        // The slot must be visible before this thread reads any DRAM map.
        fence(Ordering::SeqCst);
        Pin {
            epochs: self,
            slot: i,
            owner: true,
        }
    }

    /// Waits until every operation that started before this call is done.
    pub(crate) fn synchronize(&self) {
        fence(Ordering::SeqCst);
        let e = self.global.fetch_add(1, Ordering::SeqCst) + 1;
        for (i, s) in self.slots.iter().enumerate() {
            let mut spins = 0u32;
            loop {
                let v = s.0.load(Ordering::SeqCst);
                let done = if i == SHARED {
                    v == 0
                } else {
                    v == 0 || v >= e
                };
                if done {
                    break;
                }
                spins += 1;
                if spins > 64 {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
    }
}

impl Pin<'_> {
    /// Whether this is a pin of `e` (a map that takes its caller's pin
    /// checks that it protects the map's own tables).
    #[inline]
    pub(crate) fn belongs_to(&self, e: &Epochs) -> bool {
        std::ptr::eq(self.epochs, e)
    }
}

impl Drop for Pin<'_> {
    fn drop(&mut self) {
        if !self.owner {
            return;
        }
        let s = &self.epochs.slots[self.slot].0;
        if self.slot == SHARED {
            s.fetch_sub(1, Ordering::SeqCst);
        } else {
            s.store(0, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn synchronize_waits_for_a_pinned_reader() {
        let e = Arc::new(Epochs::default());
        let released = Arc::new(AtomicBool::new(false));
        let pinned = Arc::new(AtomicBool::new(false));
        let t = {
            let (e, released, pinned) = (e.clone(), released.clone(), pinned.clone());
            std::thread::spawn(move || {
                let _p = e.pin();
                pinned.store(true, Ordering::SeqCst);
                std::thread::sleep(std::time::Duration::from_millis(50));
                released.store(true, Ordering::SeqCst);
            })
        };
        while !pinned.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        e.synchronize();
        assert!(
            released.load(Ordering::SeqCst),
            "returned while a reader was pinned"
        );
        t.join().unwrap();
        // Nested pins and a later synchronize do not wait for anything.
        let p = e.pin();
        let q = e.pin();
        drop(q);
        drop(p);
        e.synchronize();
    }
}
