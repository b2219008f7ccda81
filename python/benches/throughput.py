"""Single-thread throughput of the Python bindings, to set beside the Rust
store's own figures from ``pmhash bench --engine store``.

    python3 python/benches/throughput.py --keys 200000 --dir /tmp

Keys are 8 random bytes and values 8 bytes (the Rust benchmark's default
sizes), written in random order to a new store with strict durability,
then read back in another random order. The index runs are the same with
``int`` keys and values on engine ``pass``.
"""

import argparse
import os
import random
import shutil
import tempfile
import threading
import time

import pmhash


def rate(n, seconds):
    return f"{n / seconds / 1e6:.3f} Mops/s"


def timed(label, n, fn):
    t0 = time.perf_counter()
    fn()
    took = time.perf_counter() - t0
    print(f"{label:<44} {rate(n, took):>14}  ({took:.2f} s)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the pools go")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    n = args.keys
    rng = random.Random(args.seed)
    ints = rng.sample(range(1 << 62), n)
    keys = [k.to_bytes(8, "little") for k in ints]
    value = b"v" * 8
    reads = keys[:]
    rng.shuffle(reads)
    root = tempfile.mkdtemp(dir=args.dir, prefix="pmhash-pybench-")
    try:
        with pmhash.Store(os.path.join(root, "store"), expected_keys=n) as s:

            def puts():
                for k in keys:
                    s[k] = value

            def gets():
                for k in reads:
                    s[k]

            timed("Store: store[key] = value", n, puts)
            timed("Store: store[key]", n, gets)
            timed("Store: range() over every pair", n, lambda: sum(1 for _ in s.range()))

            native = s._native  # the calls the mapping makes, without it

            def native_gets():
                get = native.get
                for k in reads:
                    get(k)

            timed("Store: the native get alone", n, native_gets)

            def threaded_gets(t):
                part = len(reads) // t

                def run(i):
                    get = native.get
                    for k in reads[i * part : (i + 1) * part]:
                        get(k)

                th = [threading.Thread(target=run, args=(i,)) for i in range(t)]
                for x in th:
                    x.start()
                for x in th:
                    x.join()

            for t in (2, 4):
                timed(f"Store: the native get, {t} threads", n // t * t,
                      lambda t=t: threaded_gets(t))

        with pmhash.Index(os.path.join(root, "index.pool"), "pass", expected_keys=n) as ix:

            def inserts():
                for k in ints:
                    ix.insert(k, k)

            def lookups():
                for k in ints[::-1]:
                    ix[k]

            timed("Index (pass): insert(key, value)", n, inserts)
            timed("Index (pass): index[key]", n, lookups)
            timed("Index (pass): get_many(all keys)", n, lambda: ix.get_many(ints))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
