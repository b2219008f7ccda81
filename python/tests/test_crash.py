"""Reopen after `kill -9`: every write the child acknowledged is there.

A child process writes keys one by one and prints each key after the call
that wrote it has returned (with strict durability), or after the sync()
that covered it (with relaxed durability). The parent SIGKILLs it in the
middle of its writes, reopens the pool, and checks every printed key.
"""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

import pmhash
from conftest import POOL

CHILD = textwrap.dedent(
    """
    import sys
    import pmhash

    kind, path, durability = sys.argv[1], sys.argv[2], sys.argv[3]
    if kind == "store":
        table = pmhash.Store(path, durability=durability)
    else:
        table = pmhash.Index(path, "pass", pool_size={pool}, durability=durability)
    print("open", flush=True)
    i = 0
    while True:
        if kind == "store":
            table[b"key%08d" % i] = b"value%d" % i
        else:
            table[i] = i * 3 + 1
        if durability == "strict":
            print(i, flush=True)
        elif i % 50 == 49:
            table.sync()
            print(i, flush=True)
        i += 1
    """
).format(pool=POOL)


def run_and_kill(tmp_path, kind, path, durability, acks_before_kill):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    child = subprocess.Popen(
        [sys.executable, str(script), kind, str(path), durability],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline() == "open\n"
        acked = []
        while len(acked) < acks_before_kill:
            line = child.stdout.readline()
            assert line, "the child ended before it was killed"
            acked.append(int(line))
        os.kill(child.pid, signal.SIGKILL)
        rest = child.stdout.read()
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL
    # Everything printed before the kill counts: complete lines only.
    acked += [int(line) for line in rest.split("\n")[:-1]]
    return acked[-1]


@pytest.mark.parametrize("durability", ["strict", "relaxed"])
def test_store_after_kill9(tmp_path, durability):
    path = tmp_path / "store"
    last = run_and_kill(tmp_path, "store", path, durability, 3000)
    assert last >= 2999
    with pmhash.Store(path) as s:
        missing = [i for i in range(last + 1) if s.get(b"key%08d" % i) != b"value%d" % i]
        assert missing == []
        # Writes are sequential: beyond the acknowledged ones at most the
        # writes in flight (one; under relaxed, those since the last sync).
        extra = len(s) - (last + 1)
        assert 0 <= extra <= (1 if durability == "strict" else 50)
        assert s.check() == len(s)


@pytest.mark.parametrize("durability", ["strict", "relaxed"])
def test_index_after_kill9(tmp_path, durability):
    path = tmp_path / "index.pool"
    last = run_and_kill(tmp_path, "index", path, durability, 3000)
    assert last >= 2999
    with pmhash.Index(path, mode="open") as ix:
        assert ix.engine == "pass"
        missing = [i for i in range(last + 1) if ix.get(i) != i * 3 + 1]
        assert missing == []
        extra = len(ix) - (last + 1)
        assert 0 <= extra <= (1 if durability == "strict" else 50)
        assert ix.check() == len(ix)
