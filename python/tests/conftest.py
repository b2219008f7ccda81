"""Shared fixtures: a fresh store directory and index path per test."""

import shutil

import pytest

import pmhash

# A small pool for indexes; it grows when needed. The shared store fixture
# takes small logs (16 clusters of 2 MiB files, room for the largest value); the tests that open stores
# themselves take the defaults (256 clusters of 8 MiB files: a store of a
# few hundred keys or more holds about 2 GiB of its pool file).
POOL = 8 << 20


@pytest.fixture(autouse=True)
def _remove_pools(tmp_path):
    """Removes each test's pools when it ends (pytest keeps the last runs'
    temporary directories, and a store's pool file is gigabytes)."""
    yield
    shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.fixture
def store_path(tmp_path):
    """A directory for a new store."""
    return tmp_path / "store"


@pytest.fixture
def store(store_path):
    """A new, open store, closed after the test."""
    s = pmhash.Store(store_path, cache_bytes=1 << 20, log_clusters=16, log_file_size=2 << 20)
    yield s
    s.close()


@pytest.fixture
def index_path(tmp_path):
    """A path for a new index pool file."""
    return tmp_path / "index.pool"
