//! `WriterGate` with more threads alive at once than there are own slots
//! (`sync::OWNED`): the later ones share the gate's counter, which is the
//! gate's slow path, and a closer keeps them out as it keeps out the
//! others. Its own process: the test takes every thread index while it
//! runs, which other tests of the library assume they can get.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;

use pmhash_engine::gate::WriterGate;
use pmhash_engine::sync::{thread_index, OWNED};

#[test]
fn threads_past_the_own_slots_are_excluded_too() {
    const THREADS: usize = OWNED + 9;
    let gate = WriterGate::new();
    let inside = AtomicUsize::new(0);
    let violations = AtomicUsize::new(0);
    let passes = AtomicUsize::new(0);
    let shared = AtomicUsize::new(0);
    let ready = Barrier::new(THREADS + 1);
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                // Every thread claims its index (given back at its exit)
                // while all are alive, so some get none.
                if thread_index() == OWNED {
                    shared.fetch_add(1, Ordering::Relaxed);
                }
                ready.wait();
                for _ in 0..500 {
                    let _g = gate.enter();
                    inside.fetch_add(1, Ordering::SeqCst);
                    passes.fetch_add(1, Ordering::Relaxed);
                    inside.fetch_sub(1, Ordering::SeqCst);
                }
            });
        }
        s.spawn(|| {
            ready.wait();
            for _ in 0..100 {
                let _c = gate.close();
                // No writer may be between its increment and decrement.
                for _ in 0..20 {
                    if inside.load(Ordering::SeqCst) != 0 {
                        violations.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
    });
    assert!(
        shared.load(Ordering::Relaxed) >= THREADS - OWNED,
        "only {} threads shared the counter",
        shared.load(Ordering::Relaxed)
    );
    assert_eq!(violations.load(Ordering::Relaxed), 0);
    assert_eq!(passes.load(Ordering::Relaxed), THREADS * 500);
}
