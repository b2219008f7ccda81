"""Type stubs of the native module pmhash._pmhash (the Rust extension).

Use the wrappers in ``pmhash`` (``pmhash.Store``, ``pmhash.Index``); these
classes are the calls they make.
"""

import os
import pathlib
from typing import Iterator, Literal, Optional, Union, final

_Path = Union[str, os.PathLike[str]]
_Durability = Literal["strict", "relaxed"]

__all__ = [
    "Store",
    "Index",
    "Pairs",
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

MAX_KEY: int
MAX_VALUE: int

class Error(Exception):
    """Base class of every error pmhash raises."""

class OutOfSpace(Error):
    """The pool (or its filesystem) is full; nothing was changed."""

class PoolError(Error):
    """The pool file was refused: foreign, truncated, corrupt, locked, or I/O."""

class CorruptError(Error):
    """The structure inside the pool is inconsistent."""

class InvalidArgument(Error):
    """A caller error: an oversized key, an unknown engine or option."""

class ClosedError(Error):
    """The store or index was closed."""

def engines() -> list[tuple[str, str]]:
    """The engine names Index takes, as (name, description) pairs."""

@final
class Store:
    """The native key-value store."""

    def __new__(
        cls,
        path: _Path,
        *,
        durability: _Durability = "strict",
        pool_size: Optional[int] = None,
        max_pool_size: Optional[int] = None,
        expected_keys: Optional[int] = None,
        cache_bytes: Optional[int] = None,
        read_only: bool = False,
        log_clusters: Optional[int] = None,
        log_file_size: Optional[int] = None,
    ) -> "Store": ...
    def get(self, key: bytes) -> Optional[bytes]:
        """The value of key, or None if absent."""
    def contains(self, key: bytes) -> bool:
        """Whether key is present."""
    def put(self, key: bytes, value: bytes) -> None:
        """Stores value under key."""
    def insert(self, key: bytes, value: bytes) -> bool:
        """Stores value under key if absent."""
    def update(self, key: bytes, value: bytes) -> bool:
        """Replaces the value of a present key."""
    def delete(self, key: bytes) -> bool:
        """Removes key."""
    def write_batch(self, ops: list[tuple[bytes, Optional[bytes]]]) -> None:
        """Applies puts and deletes in order."""
    def scan(
        self, start: bytes, end: Optional[bytes], limit: int
    ) -> list[tuple[bytes, bytes]]:
        """Up to limit pairs with start <= key < end, in key order."""
    def len(self) -> int:
        """Number of keys."""
    def sync(self) -> None:
        """Makes every completed write durable."""
    def gc(self, max_files: int = ...) -> int:
        """Runs garbage collection now."""
    def check(self) -> int:
        """Checks the store read-only; returns the keys found."""
    def stats(self) -> dict[str, Union[int, float]]:
        """Figures of the store."""
    def close(self) -> None:
        """Persists everything and closes the store."""
    @property
    def closed(self) -> bool:
        """Whether close() was called."""
    @property
    def path(self) -> pathlib.Path:
        """The store's directory."""

@final
class Index:
    """The native u64 hash index."""

    def __new__(
        cls,
        path: _Path,
        *,
        engine: Optional[str] = None,
        mode: Literal["open_or_create", "open", "create"] = "open_or_create",
        durability: _Durability = "strict",
        expected_keys: Optional[int] = None,
        pool_size: Optional[int] = None,
        max_pool_size: Optional[int] = None,
        read_only: bool = False,
    ) -> "Index": ...
    def insert(self, key: int, value: int) -> bool:
        """Inserts a new key."""
    def get(self, key: int) -> Optional[int]:
        """The value of key, or None if absent."""
    def get_many(self, keys: list[int]) -> list[Optional[int]]:
        """The values of keys, looked up at once."""
    def update(self, key: int, value: int) -> bool:
        """Replaces the value of a present key."""
    def upsert(self, key: int, value: int) -> None:
        """Inserts key or replaces its value."""
    def remove(self, key: int) -> bool:
        """Removes key."""
    def len(self) -> int:
        """Number of keys."""
    def pairs(self) -> Pairs:
        """Every (key, value) pair, collected now."""
    def sync(self) -> None:
        """Makes every completed call durable."""
    def check(self) -> int:
        """Checks the structure read-only; returns the keys."""
    def stats(self) -> dict[str, Union[int, float]]:
        """Figures of the table."""
    def close(self) -> None:
        """Persists everything and closes the index."""
    @property
    def closed(self) -> bool:
        """Whether close() was called."""
    @property
    def path(self) -> pathlib.Path:
        """The pool file."""
    @property
    def engine(self) -> str:
        """The engine running the index."""

@final
class Pairs(Iterator[tuple[int, int]]):
    """An iterator over (key, value) pairs collected from an index."""

    def __iter__(self) -> Pairs: ...
    def __next__(self) -> tuple[int, int]: ...
