"""Persistent hash indexes and a key-value store for DRAM + persistent memory.

Two kinds of object live in *pools* (files mapped into memory; on a DAX
filesystem over persistent memory, on ``/dev/shm``, or on an ordinary disk):

- :class:`Store`: a mapping of ``bytes`` keys to ``bytes`` values, kept in
  a directory of its own, iterated in key order, with range scans.
- :class:`Index`: a hash index from ``int`` keys to ``int`` values (both
  unsigned 64-bit), in one pool file, run by an engine chosen by name.

Every write that has returned survives a crash of the process (``kill -9``)
under the default ``durability="strict"``; under ``"relaxed"`` writes are
durable from the next ``sync()`` on. Calls release the GIL, so threads
sharing one object run at the same time.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import (
    ItemsView,
    Iterable,
    Iterator,
    KeysView,
    MutableMapping,
    ValuesView,
)
from typing import Any, Literal, Optional, TypeVar, Union, overload

from . import _pmhash
from ._pmhash import (
    MAX_KEY,
    MAX_VALUE,
    ClosedError,
    CorruptError,
    Error,
    InvalidArgument,
    OutOfSpace,
    PoolError,
    engines,
)

__all__ = [
    "Store",
    "Index",
    "engines",
    "Error",
    "OutOfSpace",
    "PoolError",
    "CorruptError",
    "InvalidArgument",
    "ClosedError",
    "MAX_KEY",
    "MAX_VALUE",
]

Durability = Literal["strict", "relaxed"]
_S = TypeVar("_S", bound="Store")
_I = TypeVar("_I", bound="Index")
_Path = Union[str, "os.PathLike[str]"]

# The number of pairs one native scan call fetches while iterating a store.
_CHUNK = 1024


class Store(MutableMapping[bytes, bytes]):
    """A persistent, crash-safe mapping of ``bytes`` keys to ``bytes`` values.

    ``Store(path)`` opens the store kept in directory ``path``, creating it
    if it does not exist and recovering it if it was not closed. Keys are up
    to :data:`MAX_KEY` bytes, values up to :data:`MAX_VALUE` bytes. Iteration
    (``iter``, ``keys()``, ``items()``, :meth:`range`) is in key order and
    fetches pairs in chunks, so a large store is never copied whole.

    One process at a time opens a store for writing (a second one gets
    :class:`PoolError`). Within the process one ``Store`` may be shared by
    threads. After :meth:`close` every call raises :class:`ClosedError`.

    Options (keyword only): ``durability`` (``"strict"``: a returned write
    survives a crash; ``"relaxed"``: writes are durable from the next
    :meth:`sync`), ``pool_size`` (bytes of the pool file at create),
    ``max_pool_size`` (the pool grows up to this; a write that needs more
    raises :class:`OutOfSpace`), ``expected_keys`` (sizes the DRAM index),
    ``cache_bytes`` (DRAM for hot values; 0: none), ``read_only``, and, fixed
    when the store is created, ``log_clusters`` (default 256) and
    ``log_file_size`` (default 8 MiB): each cluster appends to a file of its
    own, so a store that has written to every cluster holds at least their
    product (2 GiB by default) of its pool file; a small store wants fewer
    clusters or smaller files.
    """

    __slots__ = ("_native",)

    def __init__(
        self,
        path: _Path,
        *,
        durability: Durability = "strict",
        pool_size: Optional[int] = None,
        max_pool_size: Optional[int] = None,
        expected_keys: Optional[int] = None,
        cache_bytes: Optional[int] = None,
        read_only: bool = False,
        log_clusters: Optional[int] = None,
        log_file_size: Optional[int] = None,
    ) -> None:
        self._native = _pmhash.Store(
            path,
            durability=durability,
            pool_size=pool_size,
            max_pool_size=max_pool_size,
            expected_keys=expected_keys,
            cache_bytes=cache_bytes,
            read_only=read_only,
            log_clusters=log_clusters,
            log_file_size=log_file_size,
        )

    # The mapping protocol.

    def __getitem__(self, key: bytes) -> bytes:
        """The value of ``key``; ``KeyError`` if it is absent."""
        value = self._native.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __setitem__(self, key: bytes, value: bytes) -> None:
        """Stores ``value`` under ``key``, replacing any value it had."""
        self._native.put(key, value)

    def __delitem__(self, key: bytes) -> None:
        """Removes ``key``; ``KeyError`` if it is absent."""
        if not self._native.delete(key):
            raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is present (False for a key that is not bytes, as
        for a key too long to be stored)."""
        return isinstance(key, bytes) and self._native.contains(key)

    def __len__(self) -> int:
        """The number of keys."""
        return self._native.len()

    def __iter__(self) -> Iterator[bytes]:
        """The keys in order, fetched in chunks."""
        for key, _ in self.range():
            yield key

    def get(self, key: bytes, default: Any = None) -> Any:
        """The value of ``key``, or ``default`` if it is absent."""
        value = self._native.get(key)
        return default if value is None else value

    def keys(self) -> KeysView[bytes]:
        """A view of the keys, in order."""
        return KeysView(self)

    def items(self) -> ItemsView[bytes, bytes]:
        """A view of the (key, value) pairs, in key order."""
        return _StoreItems(self)

    def values(self) -> ValuesView[bytes]:
        """A view of the values, in key order."""
        return _StoreValues(self)

    def clear(self) -> None:
        """Removes every key (in batches of deletes)."""
        while True:
            batch = self._native.scan(b"", None, _CHUNK)
            if not batch:
                return
            self._native.write_batch([(key, None) for key, _ in batch])

    @overload
    def update(self, key: bytes, value: bytes, /) -> bool: ...
    @overload
    def update(self, other: Any = (), /, **kwargs: bytes) -> None: ...

    def update(self, /, *args: Any, **kwargs: Any) -> Optional[bool]:
        """``update(key, value)``: replaces the value of a present key and
        returns True, or returns False (writing nothing) if it is absent.

        Any other call is ``dict.update``: ``update(mapping_or_pairs)``
        stores every pair.
        """
        if len(args) == 2 and not kwargs:
            return self._native.update(args[0], args[1])
        MutableMapping.update(self, *args, **kwargs)
        return None

    # Beyond the mapping protocol.

    def insert(self, key: bytes, value: bytes) -> bool:
        """Stores ``value`` under ``key`` if the key is absent and returns
        True; returns False (writing nothing) if it is present."""
        return self._native.insert(key, value)

    def put(self, key: bytes, value: bytes) -> None:
        """Stores ``value`` under ``key`` (as ``store[key] = value``)."""
        self._native.put(key, value)

    def delete(self, key: bytes) -> bool:
        """Removes ``key``: True if it was present, False if not."""
        return self._native.delete(key)

    def write_batch(self, ops: Iterable[tuple[bytes, Optional[bytes]]]) -> None:
        """Applies ``(key, value)`` puts and ``(key, None)`` deletes, in order,
        as one call (under strict durability, one fence covers them all). On
        an error a prefix of the batch is written; the message says how many.
        """
        self._native.write_batch(list(ops))

    def range(
        self, start: bytes = b"", end: Optional[bytes] = None, *, chunk: int = _CHUNK
    ) -> Iterator[tuple[bytes, bytes]]:
        """The (key, value) pairs with ``start <= key < end`` (no upper bound
        if ``end`` is None), in key order.

        Pairs are fetched ``chunk`` at a time; each chunk is read when the
        previous one is used up, so a write made during the iteration may or
        may not be seen, and a large range is never held in memory at once.
        """
        if chunk < 1:
            raise ValueError(f"chunk must be at least 1, not {chunk}")
        # The first chunk is read now, so a closed store or a bad argument
        # raises here rather than at the first next().
        first = self._native.scan(start, end, chunk)
        return self._range(first, end, chunk)

    def _range(
        self, batch: list[tuple[bytes, bytes]], end: Optional[bytes], chunk: int
    ) -> Iterator[tuple[bytes, bytes]]:
        while True:
            yield from batch
            if len(batch) < chunk:
                return
            # The smallest key after the last one seen.
            batch = self._native.scan(batch[-1][0] + b"\x00", end, chunk)

    def sync(self) -> None:
        """Makes every completed write durable (under ``"strict"`` durability
        each already is)."""
        self._native.sync()

    def gc(self, max_files: Optional[int] = None) -> int:
        """Reclaims log files whose bytes are mostly dead, now (up to
        ``max_files`` of them); returns how many were reclaimed. A background
        thread does this too."""
        if max_files is None:
            return self._native.gc()
        return self._native.gc(max_files)

    def check(self) -> int:
        """Walks the log and the index read-only and checks them; returns the
        number of keys found, or raises :class:`CorruptError`."""
        return self._native.check()

    def stats(self) -> dict[str, Union[int, float]]:
        """Keys, log files, bytes, garbage collection and recovery figures."""
        return self._native.stats()

    def close(self) -> None:
        """Persists everything and marks the store clean, so the next open
        skips recovery. Later calls raise :class:`ClosedError`; closing again
        does nothing. A store that is garbage-collected is closed too."""
        self._native.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._native.closed

    @property
    def path(self) -> pathlib.Path:
        """The store's directory."""
        return self._native.path

    def __enter__(self: _S) -> _S:
        """Returns the store itself."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Closes the store."""
        self.close()

    def __repr__(self) -> str:
        """``pmhash.Store('path')``, marked when closed."""
        state = ", closed" if self.closed else ""
        return f"pmhash.Store({str(self.path)!r}{state})"


class _StoreItems(ItemsView[bytes, bytes]):
    """The (key, value) pairs of a store, read by range scans."""

    _mapping: Store

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        """The pairs in key order, fetched in chunks."""
        return self._mapping.range()


class _StoreValues(ValuesView[bytes]):
    """The values of a store, read by range scans."""

    _mapping: Store

    def __iter__(self) -> Iterator[bytes]:
        """The values in key order, fetched in chunks."""
        for _, value in self._mapping.range():
            yield value


class Index(MutableMapping[int, int]):
    """A persistent, crash-safe hash index of ``int`` keys to ``int`` values.

    Keys and values are unsigned 64-bit integers (0 to 2**64 - 1; others
    raise ``OverflowError``). ``Index(path, engine="pass")`` opens the pool
    file ``path`` or creates it with the named engine (see :func:`engines`;
    default ``"pass"``); when an existing pool is opened without an engine
    name, the engine that wrote it runs it. ``mode`` says whether the file
    may exist: ``"open_or_create"`` (the default), ``"open"`` or
    ``"create"``.

    Iteration is in no particular order; it walks a list of the pairs taken
    when the iteration starts (16 bytes per key, held natively).

    One process at a time opens a pool for writing (a second one gets
    :class:`PoolError`). Within the process one ``Index`` may be shared by
    threads. After :meth:`close` every call raises :class:`ClosedError`.

    Options (keyword only): ``durability`` (``"strict"`` or ``"relaxed"``),
    ``expected_keys`` (the table's size at create; it grows past it),
    ``pool_size`` (bytes of the file at create), ``max_pool_size`` (the file
    grows up to this; past it a write raises :class:`OutOfSpace`),
    ``read_only``.
    """

    __slots__ = ("_native",)

    def __init__(
        self,
        path: _Path,
        engine: Optional[str] = None,
        *,
        mode: Literal["open_or_create", "open", "create"] = "open_or_create",
        durability: Durability = "strict",
        expected_keys: Optional[int] = None,
        pool_size: Optional[int] = None,
        max_pool_size: Optional[int] = None,
        read_only: bool = False,
    ) -> None:
        self._native = _pmhash.Index(
            path,
            engine=engine,
            mode=mode,
            durability=durability,
            expected_keys=expected_keys,
            pool_size=pool_size,
            max_pool_size=max_pool_size,
            read_only=read_only,
        )

    # The mapping protocol.

    def __getitem__(self, key: int) -> int:
        """The value of ``key``; ``KeyError`` if it is absent."""
        value = self._native.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __setitem__(self, key: int, value: int) -> None:
        """Inserts ``key`` or replaces its value (an upsert)."""
        self._native.upsert(key, value)

    def __delitem__(self, key: int) -> None:
        """Removes ``key``; ``KeyError`` if it is absent."""
        if not self._native.remove(key):
            raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is present (False for anything but an int in
        0..2**64-1)."""
        return (
            isinstance(key, int)
            and 0 <= key < 1 << 64
            and self._native.get(key) is not None
        )

    def __len__(self) -> int:
        """The number of keys."""
        return self._native.len()

    def __iter__(self) -> Iterator[int]:
        """The keys, in no particular order."""
        for key, _ in self._native.pairs():
            yield key

    def get(self, key: int, default: Any = None) -> Any:
        """The value of ``key``, or ``default`` if it is absent."""
        value = self._native.get(key)
        return default if value is None else value

    def items(self) -> ItemsView[int, int]:
        """A view of the (key, value) pairs, in no particular order."""
        return _IndexItems(self)

    def values(self) -> ValuesView[int]:
        """A view of the values, in no particular order."""
        return _IndexValues(self)

    @overload
    def update(self, key: int, value: int, /) -> bool: ...
    @overload
    def update(self, other: Any = (), /, **kwargs: int) -> None: ...

    def update(self, /, *args: Any, **kwargs: Any) -> Optional[bool]:
        """``update(key, value)``: replaces the value of a present key and
        returns True, or returns False (changing nothing) if it is absent.

        Any other call is ``dict.update``: ``update(mapping_or_pairs)``
        upserts every pair.
        """
        if len(args) == 2 and not kwargs:
            return self._native.update(args[0], args[1])
        MutableMapping.update(self, *args, **kwargs)
        return None

    # Beyond the mapping protocol.

    def insert(self, key: int, value: int) -> bool:
        """Inserts a new key and returns True; returns False (changing
        nothing) if it is present."""
        return self._native.insert(key, value)

    def upsert(self, key: int, value: int) -> None:
        """Inserts ``key`` or replaces its value (as ``index[key] = value``)."""
        self._native.upsert(key, value)

    def remove(self, key: int) -> bool:
        """Removes ``key``: True if it was present, False if not."""
        return self._native.remove(key)

    def get_many(self, keys: Iterable[int]) -> list[Optional[int]]:
        """The values of ``keys`` (None where absent), looked up in one call;
        engines that overlap the memory misses of many keys (``rophi``) do."""
        return self._native.get_many(list(keys))

    def sync(self) -> None:
        """Makes every completed call durable (under ``"strict"`` durability
        each already is)."""
        self._native.sync()

    def check(self) -> int:
        """Walks the whole structure read-only and checks it; returns the
        number of keys, or raises :class:`CorruptError`."""
        return self._native.check()

    def stats(self) -> dict[str, Union[int, float]]:
        """Size, load factor and memory of the table."""
        return self._native.stats()

    def close(self) -> None:
        """Persists everything and marks the pool clean, so the next open
        skips recovery. Later calls raise :class:`ClosedError`; closing again
        does nothing. An index that is garbage-collected is closed too."""
        self._native.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._native.closed

    @property
    def path(self) -> pathlib.Path:
        """The pool file."""
        return self._native.path

    @property
    def engine(self) -> str:
        """The engine running the index (``"pass"``, ``"hmeh+filter"``, ...)."""
        return self._native.engine

    def __enter__(self: _I) -> _I:
        """Returns the index itself."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Closes the index."""
        self.close()

    def __repr__(self) -> str:
        """``pmhash.Index('path', engine='pass')``, marked when closed."""
        state = ", closed" if self.closed else ""
        return f"pmhash.Index({str(self.path)!r}, engine={self.engine!r}{state})"


class _IndexItems(ItemsView[int, int]):
    """The (key, value) pairs of an index, collected when iterated."""

    _mapping: Index

    def __iter__(self) -> Iterator[tuple[int, int]]:
        """The pairs, in no particular order."""
        return iter(self._mapping._native.pairs())


class _IndexValues(ValuesView[int]):
    """The values of an index, collected when iterated."""

    _mapping: Index

    def __iter__(self) -> Iterator[int]:
        """The values, in no particular order."""
        for _, value in self._mapping._native.pairs():
            yield value
