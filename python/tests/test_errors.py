"""Bad input raises a pmhash.Error (or TypeError/OverflowError) with a
message; it never crashes the interpreter, and a refused file is left as
it was."""

import os
import subprocess
import sys

import pytest

import pmhash
from conftest import POOL


def test_exception_classes():
    for cls in (
        pmhash.OutOfSpace,
        pmhash.PoolError,
        pmhash.CorruptError,
        pmhash.InvalidArgument,
        pmhash.ClosedError,
    ):
        assert issubclass(cls, pmhash.Error)
    assert issubclass(pmhash.Error, Exception)


def test_foreign_file_as_a_store(tmp_path):
    d = tmp_path / "store"
    d.mkdir()
    junk = os.urandom(1 << 20)
    (d / "store.pool").write_bytes(junk)
    with pytest.raises(pmhash.PoolError) as e:
        pmhash.Store(d)
    assert str(e.value)
    assert (d / "store.pool").read_bytes() == junk
    with pytest.raises(pmhash.PoolError):
        pmhash.Store(d, read_only=True)


def test_store_path_that_is_a_file(tmp_path):
    f = tmp_path / "plain"
    f.write_bytes(b"not a directory")
    with pytest.raises(pmhash.PoolError):
        pmhash.Store(f)
    assert f.read_bytes() == b"not a directory"


@pytest.mark.parametrize("content", [b"", b"x" * 100, None])
def test_foreign_file_as_an_index(tmp_path, content):
    path = tmp_path / "foreign.pool"
    data = os.urandom(4 << 20) if content is None else content
    path.write_bytes(data)
    for mode in ("open", "open_or_create"):
        with pytest.raises(pmhash.PoolError) as e:
            pmhash.Index(path, mode=mode)
        assert str(e.value)
    assert path.read_bytes() == data


def test_truncated_index(index_path):
    with pmhash.Index(index_path, pool_size=POOL) as ix:
        ix[1] = 1
    size = index_path.stat().st_size
    os.truncate(index_path, size // 2)
    with pytest.raises(pmhash.PoolError):
        pmhash.Index(index_path)


def test_a_store_pool_is_not_an_index(store_path):
    with pmhash.Store(store_path) as s:
        s[b"k"] = b"v"
    with pytest.raises(pmhash.Error) as e:
        pmhash.Index(store_path / "store.pool")
    assert "index" in str(e.value) or "layout" in str(e.value)


def test_oversized_key_and_value(store):
    too_long = b"k" * (pmhash.MAX_KEY + 1)
    with pytest.raises(pmhash.InvalidArgument, match="key of 4097 bytes"):
        store[too_long] = b"v"
    with pytest.raises(pmhash.InvalidArgument):
        store.insert(too_long, b"v")
    with pytest.raises(pmhash.InvalidArgument, match="value of"):
        store[b"k"] = b"v" * (pmhash.MAX_VALUE + 1)
    # A key too long to be stored is not in the store; reading it is refused.
    assert too_long not in store
    with pytest.raises(pmhash.InvalidArgument):
        store[too_long]
    # The store is unchanged and usable.
    assert len(store) == 0
    store[b"k"] = b"v"
    assert store[b"k"] == b"v"


def test_wrong_types(store, index_path):
    with pytest.raises(TypeError):
        store["str"] = b"v"
    with pytest.raises(TypeError):
        store[b"k"] = "str"
    with pytest.raises(TypeError):
        store[b"k"] = None
    with pytest.raises(TypeError):
        store.write_batch([("k", b"v")])
    # Membership of another type is False, as in a dict.
    assert "k" not in store
    with pmhash.Index(index_path) as ix:
        for bad in (-1, 2**64):
            with pytest.raises(OverflowError):
                ix[bad] = 1
            with pytest.raises(OverflowError):
                ix[1] = bad
        with pytest.raises(TypeError):
            ix["1"] = 1
        with pytest.raises(TypeError):
            ix[1.5]
        ix[2**64 - 1] = 2**64 - 1
        assert -1 not in ix and 2**64 not in ix and "1" not in ix
        assert ix[2**64 - 1] == 2**64 - 1


def test_closed_store_raises(store_path):
    s = pmhash.Store(store_path)
    s[b"k"] = b"v"
    s.close()
    assert s.closed
    s.close()  # again: nothing
    calls = [
        lambda: s[b"k"],
        lambda: s.__setitem__(b"k", b"v"),
        lambda: s.__delitem__(b"k"),
        lambda: b"k" in s,
        lambda: len(s),
        lambda: list(s),
        lambda: s.range(),
        lambda: s.get(b"k"),
        lambda: s.sync(),
        lambda: s.stats(),
        lambda: s.write_batch([]),
    ]
    for call in calls:
        with pytest.raises(pmhash.ClosedError, match="closed"):
            call()


def test_closed_index_raises(index_path):
    ix = pmhash.Index(index_path)
    ix[1] = 1
    ix.close()
    ix.close()
    for call in [
        lambda: ix[1],
        lambda: ix.__setitem__(1, 1),
        lambda: ix.insert(2, 2),
        lambda: ix.remove(1),
        lambda: len(ix),
        lambda: list(ix),
        lambda: ix.get_many([1]),
        lambda: ix.sync(),
    ]:
        with pytest.raises(pmhash.ClosedError):
            call()


def test_bad_engine_name(index_path):
    with pytest.raises(pmhash.InvalidArgument, match="unknown index engine.*known: pass"):
        pmhash.Index(index_path, engine="btree")
    assert not index_path.exists()
    names = [name for name, _ in pmhash.engines()]
    assert "pass" in names and "hmeh+filter" in names


def test_engine_that_does_not_read_the_pool(index_path):
    with pmhash.Index(index_path, "pass", pool_size=POOL) as ix:
        ix[1] = 1
    with pytest.raises(pmhash.InvalidArgument, match="not engine hmeh"):
        pmhash.Index(index_path, "hmeh")


def test_bad_options(store_path, index_path):
    with pytest.raises(pmhash.InvalidArgument, match="durability"):
        pmhash.Store(store_path, durability="sometimes")
    with pytest.raises(pmhash.InvalidArgument, match="mode"):
        pmhash.Index(index_path, mode="append")
    with pytest.raises(pmhash.Error):
        pmhash.Index(index_path, mode="open")  # no such file
    with pmhash.Index(index_path):
        pass
    with pytest.raises(pmhash.Error):
        pmhash.Index(index_path, mode="create")  # exists


def test_read_only_store_refuses_writes(store_path):
    with pmhash.Store(store_path) as s:
        s[b"k"] = b"v"
    with pmhash.Store(store_path, read_only=True) as s:
        assert s[b"k"] == b"v"
        with pytest.raises(pmhash.InvalidArgument, match="read-only"):
            s[b"k"] = b"w"


def test_second_writer_process_is_refused(store_path):
    with pmhash.Store(store_path) as s:
        s[b"k"] = b"v"
        code = (
            "import sys, pmhash\n"
            "try:\n"
            "    pmhash.Store(sys.argv[1])\n"
            "except pmhash.PoolError as e:\n"
            "    print('refused:', e)\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code, str(store_path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("refused:"), out.stdout


def test_second_open_in_the_same_process_is_refused(store_path, index_path):
    with pmhash.Store(store_path):
        with pytest.raises(pmhash.PoolError):
            pmhash.Store(store_path)
    with pmhash.Index(index_path):
        with pytest.raises(pmhash.PoolError):
            pmhash.Index(index_path)


def test_full_pool_raises_out_of_space_and_stays_usable(index_path):
    size = 1 << 20
    with pmhash.Index(index_path, "pass", pool_size=size, max_pool_size=size) as ix:
        written = 0
        with pytest.raises(pmhash.OutOfSpace):
            for k in range(10_000_000):
                ix[k] = k
                written += 1
        assert written > 0
        assert len(ix) == written
        assert all(ix[k] == k for k in range(0, written, 97))
        assert ix.update(0, 42) is True
        assert ix[0] == 42


def test_full_store_raises_out_of_space_and_stays_usable(store_path):
    size = 64 << 20  # room for a few of the log's 8 MiB files
    with pmhash.Store(store_path, pool_size=size, max_pool_size=size) as s:
        value = b"v" * 65536
        written = 0
        with pytest.raises(pmhash.OutOfSpace):
            for i in range(1000):
                s[b"%d" % i] = value
                written += 1
        assert written > 0
        assert len(s) == written
        assert all(s[b"%d" % i] == value for i in range(written))
        assert s.delete(b"0") is True
