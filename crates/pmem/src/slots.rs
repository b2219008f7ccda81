//! [`SlotSet`]: 64 numbered slots that threads claim and release — the
//! allocator's lanes, an engine's log slots. A claim waits (yielding) while
//! all 64 are taken.

use std::sync::atomic::{AtomicU64, Ordering};

/// See the module documentation.
#[derive(Default)]
pub struct SlotSet {
    used: AtomicU64,
}

impl SlotSet {
    /// Claims a free slot, waiting while none is free.
    pub fn claim(&self) -> usize {
        loop {
            let cur = self.used.load(Ordering::Acquire);
            if cur != u64::MAX {
                let i = (!cur).trailing_zeros() as usize;
                if self
                    .used
                    .compare_exchange(cur, cur | (1 << i), Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    return i;
                }
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Releases a slot claimed before.
    pub fn release(&self, i: usize) {
        self.used.fetch_and(!(1u64 << i), Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_are_distinct_until_released() {
        let s = SlotSet::default();
        let all: Vec<usize> = (0..64).map(|_| s.claim()).collect();
        let mut sorted = all.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..64).collect::<Vec<_>>());
        s.release(17);
        assert_eq!(s.claim(), 17);
    }
}
