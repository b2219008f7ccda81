"""Threads: writers of disjoint keys all land, close() under readers, and
the GIL is released while a native call runs."""

import threading
import time

import pytest

import pmhash
from conftest import POOL


def run_threads(target, n):
    errors = []

    def wrapped(t):
        try:
            target(t)
        except BaseException as e:  # reported below, with the thread's number
            errors.append((t, e))

    threads = [threading.Thread(target=wrapped, args=(t,)) for t in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []


def test_store_threads_writing_disjoint_keys_all_land(store):
    per = 3000

    def writer(t):
        for i in range(per):
            store[b"t%d-%06d" % (t, i)] = b"%d" % (t * per + i)

    run_threads(writer, 4)
    assert len(store) == 4 * per
    for t in range(4):
        for i in range(per):
            assert store[b"t%d-%06d" % (t, i)] == b"%d" % (t * per + i)


def test_index_threads_writing_disjoint_keys_all_land(index_path):
    per = 5000
    with pmhash.Index(index_path, "pass", pool_size=POOL) as ix:

        def writer(t):
            for i in range(per):
                assert ix.insert(t * per + i, i)

        run_threads(writer, 4)
        assert len(ix) == 4 * per
        assert all(ix[k] == k % per for k in range(4 * per))


def test_close_while_threads_read(store):
    for i in range(100):
        store[b"%d" % i] = b"v"
    outcome = []
    started = threading.Barrier(5)

    def reader(t):
        started.wait()
        try:
            while True:
                assert store[b"%d" % (t * 7 % 100)] == b"v"
        except pmhash.ClosedError:
            outcome.append(t)

    threads = [threading.Thread(target=reader, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    started.wait()
    time.sleep(0.05)
    store.close()
    for th in threads:
        th.join(timeout=30)
    assert sorted(outcome) == [0, 1, 2, 3]


def stamps_in_the_middle(make_call):
    """Runs the call that `make_call(n)` returns, with n doubled until the
    call lasts 0.3 s, while a Python thread stamps the time in a loop;
    returns the call's duration and the stamps in its middle third.

    If the call held the GIL, the stamping thread could not run between
    the call's first and last moments (a switch is requested only every
    5 ms, and a thread in native code holding the GIL never answers it), so
    it has no stamp in the middle third of a 0.3 s call.
    """
    stamps = []
    stop = threading.Event()

    def stamper():
        while not stop.is_set():
            stamps.append(time.perf_counter())
            time.sleep(0.0005)

    n = 20000
    th = threading.Thread(target=stamper)
    th.start()
    try:
        while True:
            call = make_call(n)
            t0 = time.perf_counter()
            call()
            t1 = time.perf_counter()
            if t1 - t0 >= 0.3 or n >= 4_000_000:
                break
            n *= 2
    finally:
        stop.set()
        th.join()
    assert t1 - t0 >= 0.3, f"the call took {t1 - t0:.3f} s at n = {n}; too short"
    third = (t1 - t0) / 3
    return t1 - t0, [s for s in stamps if t0 + third <= s <= t1 - third]


def test_gil_is_released_during_a_native_call(store):
    # The long call: one write_batch of n puts.
    def make_call(n):
        ops = [(b"gil%08d" % i, b"x" * 100) for i in range(n)]
        return lambda: store.write_batch(ops)

    took, middle = stamps_in_the_middle(make_call)
    assert len(middle) >= 3, f"{len(middle)} stamps in the middle of a {took:.3f} s call"


def test_the_gil_check_sees_a_call_that_holds_the_gil():
    # The control: list.sort of floats runs in C holding the GIL throughout.
    import random

    def make_call(n):
        rng = random.Random(n)
        data = [rng.random() for _ in range(n)]
        return data.sort

    took, middle = stamps_in_the_middle(make_call)
    assert middle == [], f"{len(middle)} stamps in a {took:.3f} s call holding the GIL"
