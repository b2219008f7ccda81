"""Reopening: after close(), after a `with` block, and in another mode."""

import pytest

import pmhash
from conftest import POOL


def test_store_reopens_with_its_contents(store_path):
    model = {b"k%05d" % i: b"v%d" % (i * 7) for i in range(5000)}
    with pmhash.Store(store_path) as s:
        s.update(model)
        for k in list(model)[::3]:
            del s[k]
            del model[k]
    assert s.closed
    with pmhash.Store(store_path) as s:
        assert len(s) == len(model)
        assert dict(s.items()) == model
        assert s.check() == len(model)
        s[b"after"] = b"reopen"
    with pmhash.Store(store_path, read_only=True) as s:
        assert s[b"after"] == b"reopen"
        assert len(s) == len(model) + 1


def test_relaxed_store_sync_then_reopen(store_path):
    with pmhash.Store(store_path, durability="relaxed") as s:
        for i in range(1000):
            s[b"%d" % i] = b"x"
        s.sync()
    with pmhash.Store(store_path) as s:
        assert len(s) == 1000


@pytest.mark.parametrize("engine", ["pass", "hmeh", "level", "rophi"])
def test_index_reopens_with_its_engine_and_contents(index_path, engine):
    with pmhash.Index(index_path, engine, pool_size=POOL, expected_keys=100) as ix:
        for k in range(20000):  # grows past the size given at create
            ix[k * 2654435761 % 2**64] = k
    with pmhash.Index(index_path, mode="open") as ix:
        assert ix.engine == engine
        assert len(ix) == 20000
        assert all(ix[k * 2654435761 % 2**64] == k for k in range(20000))
        assert ix.check() == 20000


def test_index_reopens_behind_a_filter(index_path):
    with pmhash.Index(index_path, "pass", pool_size=POOL) as ix:
        ix[5] = 25
    with pmhash.Index(index_path, "pass+filter") as ix:
        assert ix.engine == "pass+filter"
        assert ix[5] == 25
        assert 6 not in ix


def test_drop_closes(store_path):
    s = pmhash.Store(store_path)
    s[b"k"] = b"v"
    del s  # the last reference: the store is closed, its lock released
    with pmhash.Store(store_path) as s:
        assert s[b"k"] == b"v"
        assert s.stats()["recovered_entries"] == 0  # closed clean: no log scan
