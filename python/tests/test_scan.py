"""Range scans: bounds, order, chunking, and laziness."""

import pytest


@pytest.fixture
def filled(store):
    for i in range(200):
        store[b"key%03d" % i] = b"value%d" % i
    return store


def test_range_bounds(filled):
    got = list(filled.range(b"key010", b"key015"))
    assert got == [(b"key%03d" % i, b"value%d" % i) for i in range(10, 15)]
    assert [k for k, _ in filled.range(b"key195")] == [b"key%03d" % i for i in range(195, 200)]
    assert len(list(filled.range())) == 200
    assert list(filled.range(b"key050", b"key050")) == []
    assert list(filled.range(b"key060", b"key050")) == []
    assert list(filled.range(b"zzz")) == []


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 200, 201, 5000])
def test_chunk_sizes_give_the_same_scan(filled, chunk):
    expected = [(b"key%03d" % i, b"value%d" % i) for i in range(200)]
    assert list(filled.range(chunk=chunk)) == expected
    assert list(filled.range(b"key100", b"key150", chunk=chunk)) == expected[100:150]


def test_chunk_boundary_next_to_zero_suffixed_keys(store):
    # The scan resumes after a chunk's last key k at k + b"\x00": keys that
    # are k followed by zero bytes must neither be skipped nor repeated.
    keys = [b"a", b"a\x00", b"a\x00\x00", b"a\x00\x01", b"a\x01", b"b"]
    for k in keys:
        store[k] = k
    for chunk in range(1, 8):
        assert [k for k, _ in store.range(chunk=chunk)] == keys


def test_range_is_read_in_chunks(filled):
    # Only the first chunk is read when the iterator is made: a key written
    # after that, beyond the first chunk, is seen by the same iterator.
    it = filled.range(chunk=10)
    assert next(it) == (b"key000", b"value0")
    filled[b"key199a"] = b"late"
    rest = list(it)
    assert (b"key199a", b"late") in rest
    assert len(rest) == 200


def test_range_argument_errors(filled):
    with pytest.raises(ValueError):
        filled.range(chunk=0)
    with pytest.raises(TypeError):
        filled.range("key")  # str, not bytes
