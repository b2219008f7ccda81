"""Store and Index against a dict model: random operations, same answers."""

import random
from collections.abc import MutableMapping

import pytest

import pmhash
from conftest import POOL


def test_store_is_a_mutable_mapping(store):
    assert isinstance(store, MutableMapping)
    assert len(store) == 0
    assert list(store) == []
    with pytest.raises(KeyError):
        store[b"absent"]
    assert store.get(b"absent") is None
    assert store.get(b"absent", b"dflt") == b"dflt"


def test_store_matches_a_dict_model(store):
    rng = random.Random(31)
    model = {}
    # A small key space so that keys are rewritten and deleted often; the
    # empty key and keys that are prefixes of others are included.
    keys = [b"", b"a", b"a\x00", b"ab", b"b"] + [
        bytes(rng.randrange(256) for _ in range(rng.randrange(1, 12))) for _ in range(60)
    ]
    for step in range(4000):
        key = rng.choice(keys)
        op = rng.randrange(10)
        if op < 4:
            value = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40)))
            store[key] = value
            model[key] = value
        elif op == 4:
            if key in model:
                del store[key]
                del model[key]
            else:
                with pytest.raises(KeyError):
                    del store[key]
        elif op == 5:
            assert store.pop(key, None) == model.pop(key, None)
        elif op == 6:
            value = b"i%d" % step
            assert store.insert(key, value) == (key not in model)
            model.setdefault(key, value)
        elif op == 7:
            value = b"u%d" % step
            assert store.update(key, value) == (key in model)
            if key in model:
                model[key] = value
        elif op == 8:
            assert store.setdefault(key, b"s") == model.setdefault(key, b"s")
        else:
            assert (key in store) == (key in model)
            assert store.get(key) == model.get(key)
        if step % 500 == 0:
            assert len(store) == len(model)
            assert list(store) == sorted(model)
    assert len(store) == len(model)
    assert list(store.keys()) == sorted(model)
    assert list(store.items()) == sorted(model.items())
    assert list(store.values()) == [model[k] for k in sorted(model)]
    assert store == model
    assert dict(store) == model
    some = sorted(model)[:20]
    assert all((k, model[k]) in store.items() for k in some)
    assert not any((k, model[k] + b"!") in store.items() for k in some)


def test_store_update_forms(store):
    # dict.update's forms store every pair.
    store.update({b"k1": b"v1"})
    store.update([(b"k2", b"v2")])
    assert dict(store) == {b"k1": b"v1", b"k2": b"v2"}
    # update(key, value) replaces a present key only.
    assert store.update(b"k1", b"new") is True
    assert store.update(b"k3", b"x") is False
    assert dict(store) == {b"k1": b"new", b"k2": b"v2"}


def test_store_clear_and_batches(store):
    store.write_batch((b"%04d" % i, b"v%d" % i) for i in range(3000))
    assert len(store) == 3000
    store.write_batch([(b"0000", None), (b"0001", b"again"), (b"0002", None)])
    assert b"0000" not in store and b"0002" not in store
    assert store[b"0001"] == b"again"
    assert len(store) == 2998
    store.clear()
    assert len(store) == 0
    assert list(store) == []


def test_store_large_values(store):
    big = bytes(range(256)) * 4096  # 1 MiB, the limit
    assert len(big) == pmhash.MAX_VALUE
    store[b"big"] = big
    store[b"k" * pmhash.MAX_KEY] = b"longest key"
    assert store[b"big"] == big
    assert store[b"k" * pmhash.MAX_KEY] == b"longest key"


@pytest.mark.parametrize("engine", ["pass", "hmeh", "level", "rophi", "pass+filter"])
def test_index_matches_a_dict_model(index_path, engine):
    rng = random.Random(engine)
    model = {}
    keys = [0, 1, 2**64 - 1] + [rng.randrange(2**64) for _ in range(200)]
    with pmhash.Index(index_path, engine, pool_size=POOL) as index:
        assert isinstance(index, MutableMapping)
        assert index.engine == engine
        for step in range(4000):
            key = rng.choice(keys)
            value = rng.randrange(2**64)
            op = rng.randrange(8)
            if op < 2:
                index[key] = value
                model[key] = value
            elif op == 2:
                assert index.insert(key, value) == (key not in model)
                model.setdefault(key, value)
            elif op == 3:
                assert index.update(key, value) == (key in model)
                if key in model:
                    model[key] = value
            elif op == 4:
                assert index.remove(key) == (key in model)
                model.pop(key, None)
            elif op == 5:
                if key in model:
                    del index[key]
                    del model[key]
                else:
                    with pytest.raises(KeyError):
                        del index[key]
            elif op == 6:
                index.upsert(key, value)
                model[key] = value
            else:
                assert index.get(key) == model.get(key)
                assert (key in index) == (key in model)
                if key not in model:
                    with pytest.raises(KeyError):
                        index[key]
        assert len(index) == len(model)
        assert sorted(index) == sorted(model)
        assert dict(index.items()) == model
        assert sorted(index.values()) == sorted(model.values())
        assert index == model
        probe = keys[:50]
        assert index.get_many(probe) == [model.get(k) for k in probe]
        assert index.check() == len(model)


def test_index_update_forms(index_path):
    with pmhash.Index(index_path) as index:
        index.update({1: 10, 2: 20})
        index.update([(3, 30)], **{})
        assert dict(index) == {1: 10, 2: 20, 3: 30}
        assert index.update(1, 11) is True
        assert index.update(9, 90) is False
        assert dict(index) == {1: 11, 2: 20, 3: 30}
        index.clear()
        assert len(index) == 0
