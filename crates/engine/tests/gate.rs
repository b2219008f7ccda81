//! `WriterGate` under a closer: no writer is ever inside while the gate is
//! closed, and every writer gets through. Also with more threads alive at
//! once than there are own slots (`sync::OWNED`): the later ones share the
//! gate's counter (its slow path). Its own process: that test takes every
//! thread index while it runs, which other tests of the library assume
//! they can get.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;

use pmhash_engine::gate::WriterGate;
use pmhash_engine::sync::{thread_index, OWNED};

/// What [`hammer`] saw.
struct Seen {
    /// Times the closer found a writer inside.
    violations: usize,
    /// Writer passes through the gate.
    passes: usize,
    /// Writers that held no own thread index.
    shared: usize,
}

/// `writers` threads pass the gate `rounds` times each while one closer
/// closes it `closes` times and checks, `checks` times per close, that no
/// writer is inside. Every thread claims its index (given back at its
/// exit) and all start together, so with more writers than own slots some
/// get none.
fn hammer(writers: usize, rounds: usize, closes: usize, checks: usize) -> Seen {
    let gate = WriterGate::new();
    let inside = AtomicUsize::new(0);
    let violations = AtomicUsize::new(0);
    let passes = AtomicUsize::new(0);
    let shared = AtomicUsize::new(0);
    let ready = Barrier::new(writers + 1);
    std::thread::scope(|s| {
        for _ in 0..writers {
            s.spawn(|| {
                if thread_index() == OWNED {
                    shared.fetch_add(1, Ordering::Relaxed);
                }
                ready.wait();
                for _ in 0..rounds {
                    let _g = gate.enter();
                    inside.fetch_add(1, Ordering::SeqCst);
                    passes.fetch_add(1, Ordering::Relaxed);
                    inside.fetch_sub(1, Ordering::SeqCst);
                }
            });
        }
        s.spawn(|| {
            ready.wait();
            for _ in 0..closes {
                let _c = gate.close();
                // No writer may be between its increment and decrement.
                for _ in 0..checks {
                    if inside.load(Ordering::SeqCst) != 0 {
                        violations.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
    });
    Seen {
        violations: violations.into_inner(),
        passes: passes.into_inner(),
        shared: shared.into_inner(),
    }
}

#[test]
fn closer_excludes_writers_and_writers_all_get_through() {
    let seen = hammer(4, 20_000, 300, 50);
    assert_eq!(seen.violations, 0);
    assert_eq!(seen.passes, 80_000);
}

#[test]
fn threads_past_the_own_slots_are_excluded_too() {
    const THREADS: usize = OWNED + 9;
    let seen = hammer(THREADS, 500, 100, 20);
    assert!(
        seen.shared >= THREADS - OWNED,
        "only {} threads shared the counter",
        seen.shared
    );
    assert_eq!(seen.violations, 0);
    assert_eq!(seen.passes, THREADS * 500);
}
