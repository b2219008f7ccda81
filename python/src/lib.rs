//! `pmhash._pmhash`: the native half of the `pmhash` Python package.
//!
//! It wraps the front crate's [`pmhash::Store`] and [`pmhash::Index`] in
//! two Python classes; `pmhash/__init__.py` builds the mapping protocol
//! on top. Every call into the store or an index runs with the GIL
//! released ([`Python::detach`]), so Python threads using one object (or
//! several) run at the same time. An object holds its handle in an
//! `RwLock<Option<..>>`: calls share the read lock, `close()` takes the
//! write lock (waiting for the calls in flight) and leaves `None`, so a
//! call after `close()` raises `ClosedError` instead of touching a closed
//! pool.

// No unsafe code of our own: the FFI glue is what PyO3's macros generate.
#![deny(unsafe_code)]

use std::path::PathBuf;
use std::sync::{PoisonError, RwLock};

use pmhash::Durability;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};

create_exception!(
    pmhash,
    Error,
    PyException,
    "Base class of every error pmhash raises."
);
create_exception!(
    pmhash,
    OutOfSpace,
    Error,
    "The pool (or its filesystem) is full; the store or index is unchanged and still usable."
);
create_exception!(
    pmhash,
    PoolError,
    Error,
    "The pool file was refused: foreign, truncated or corrupt, locked by another writer, or an I/O error."
);
create_exception!(
    pmhash,
    CorruptError,
    Error,
    "The structure inside the pool is inconsistent."
);
create_exception!(
    pmhash,
    InvalidArgument,
    Error,
    "A caller error: an oversized key or value, an unknown engine or option, a write to a read-only store."
);
create_exception!(pmhash, ClosedError, Error, "The store or index was closed.");

/// Why a call failed, built without the GIL and turned into a Python
/// exception after it is taken back.
enum Failure {
    Pm(pmhash::Error),
    Closed(&'static str),
}

impl From<pmhash::Error> for Failure {
    fn from(e: pmhash::Error) -> Self {
        Failure::Pm(e)
    }
}

impl From<Failure> for PyErr {
    fn from(f: Failure) -> PyErr {
        match f {
            Failure::Closed(what) => ClosedError::new_err(format!("the {what} is closed")),
            Failure::Pm(e) => {
                let msg = e.to_string();
                match e {
                    pmhash::Error::OutOfSpace(_) => OutOfSpace::new_err(msg),
                    pmhash::Error::Pool(_) => PoolError::new_err(msg),
                    pmhash::Error::Corrupt(_) => CorruptError::new_err(msg),
                    pmhash::Error::InvalidArgument(_) => InvalidArgument::new_err(msg),
                }
            }
        }
    }
}

fn durability(name: &str) -> PyResult<Durability> {
    match name {
        "strict" => Ok(Durability::Strict),
        "relaxed" => Ok(Durability::Relaxed),
        other => Err(InvalidArgument::new_err(format!(
            "unknown durability {other:?}; known: strict, relaxed"
        ))),
    }
}

/// A handle that `close()` can take away while other threads hold `&self`.
struct Slot<T> {
    what: &'static str,
    handle: RwLock<Option<T>>,
}

impl<T: Send + Sync> Slot<T> {
    fn new(what: &'static str, handle: T) -> Self {
        Slot {
            what,
            handle: RwLock::new(Some(handle)),
        }
    }

    /// Runs `f` on the open handle with the GIL released.
    fn call<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&T) -> Result<R, pmhash::Error> + Send,
    ) -> PyResult<R> {
        py.detach(|| {
            // A panic inside `f` poisons the lock, and PyO3 turns the panic
            // into a Python exception; the handle itself is still sound.
            let guard = self.handle.read().unwrap_or_else(PoisonError::into_inner);
            match guard.as_ref() {
                Some(h) => f(h).map_err(Failure::from),
                None => Err(Failure::Closed(self.what)),
            }
        })
        .map_err(PyErr::from)
    }

    /// Takes the handle out (waiting for the calls in flight), with the
    /// GIL released: `None` if it was already closed.
    fn take(&self, py: Python<'_>) -> Option<T> {
        py.detach(|| {
            self.handle
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .take()
        })
    }

    fn is_closed(&self) -> bool {
        self.handle
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none()
    }
}

/// The native key-value store; `pmhash.Store` wraps it as a mapping.
#[pyclass(module = "pmhash._pmhash", name = "Store", frozen)]
pub struct Store {
    slot: Slot<pmhash::Store>,
    path: PathBuf,
}

#[pymethods]
impl Store {
    /// Opens (or creates) the store in directory `path`.
    #[new]
    #[pyo3(signature = (path, *, durability="strict", pool_size=None, max_pool_size=None,
                        expected_keys=None, cache_bytes=None, read_only=false,
                        log_clusters=None, log_file_size=None))]
    #[allow(clippy::too_many_arguments)] // the Python keyword arguments
    fn new(
        py: Python<'_>,
        path: PathBuf,
        durability: &str,
        pool_size: Option<u64>,
        max_pool_size: Option<u64>,
        expected_keys: Option<u64>,
        cache_bytes: Option<u64>,
        read_only: bool,
        log_clusters: Option<u32>,
        log_file_size: Option<u64>,
    ) -> PyResult<Store> {
        let mut opts = pmhash::Store::options()
            .durability(self::durability(durability)?)
            .read_only(read_only);
        if let Some(n) = pool_size {
            opts = opts.pool_size(n);
        }
        if let Some(n) = max_pool_size {
            opts = opts.max_pool_size(n);
        }
        if let Some(n) = expected_keys {
            opts = opts.expected_keys(n);
        }
        if let Some(n) = cache_bytes {
            opts = opts.cache_bytes(n);
        }
        if let Some(n) = log_clusters {
            opts = opts.log_clusters(n);
        }
        if let Some(n) = log_file_size {
            opts = opts.log_file_size(n);
        }
        let store = py
            .detach(|| opts.open(&path))
            .map_err(|e| PyErr::from(Failure::from(e)))?;
        Ok(Store {
            slot: Slot::new("store", store),
            path,
        })
    }

    /// The value of `key` (bytes), or None if absent.
    fn get<'py>(&self, py: Python<'py>, key: &[u8]) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let v = self.slot.call(py, |s| s.get(key))?;
        Ok(v.map(|v| PyBytes::new(py, &v)))
    }

    /// Whether `key` is present.
    fn contains(&self, py: Python<'_>, key: &[u8]) -> PyResult<bool> {
        // A key too long to be stored is not in the store (as `in` asks),
        // where reading it is an error.
        if key.len() > pmhash::MAX_KEY {
            return Ok(false);
        }
        self.slot.call(py, |s| {
            let mut buf = Vec::new();
            s.get_into(key, &mut buf)
        })
    }

    /// Stores `value` under `key`, replacing any value it had.
    fn put(&self, py: Python<'_>, key: &[u8], value: &[u8]) -> PyResult<()> {
        self.slot.call(py, |s| s.put(key, value))
    }

    /// Stores `value` under `key` if the key is absent; False (and
    /// nothing written) if it is present.
    fn insert(&self, py: Python<'_>, key: &[u8], value: &[u8]) -> PyResult<bool> {
        self.slot.call(py, |s| s.insert(key, value))
    }

    /// Replaces the value of a present key; False if it is absent.
    fn update(&self, py: Python<'_>, key: &[u8], value: &[u8]) -> PyResult<bool> {
        self.slot.call(py, |s| s.update(key, value))
    }

    /// Removes `key`; False if it is absent.
    fn delete(&self, py: Python<'_>, key: &[u8]) -> PyResult<bool> {
        self.slot.call(py, |s| s.delete(key))
    }

    /// Applies `(key, value)` puts and `(key, None)` deletes in order.
    fn write_batch(
        &self,
        py: Python<'_>,
        ops: Vec<(Bound<'_, PyBytes>, Option<Bound<'_, PyBytes>>)>,
    ) -> PyResult<()> {
        let slices: Vec<(&[u8], Option<&[u8]>)> = ops
            .iter()
            .map(|(k, v)| (k.as_bytes(), v.as_ref().map(|v| v.as_bytes())))
            .collect();
        self.slot.call(py, |s| s.write_batch(&slices))
    }

    /// Up to `limit` (key, value) pairs with `start <= key < end` (no end
    /// if `end` is None), in key order.
    #[pyo3(signature = (start, end, limit))]
    fn scan<'py>(
        &self,
        py: Python<'py>,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
    ) -> PyResult<Bound<'py, PyList>> {
        let pairs = self.slot.call(py, |s| s.scan(start, end, limit))?;
        let items = pairs
            .iter()
            .map(|(k, v)| PyTuple::new(py, [PyBytes::new(py, k), PyBytes::new(py, v)]))
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, items)
    }

    /// Number of keys.
    fn len(&self, py: Python<'_>) -> PyResult<u64> {
        self.slot.call(py, |s| Ok(s.len()))
    }

    /// Makes every completed write durable.
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        self.slot.call(py, |s| s.sync())
    }

    /// Runs garbage collection now on up to `max_files` log files.
    #[pyo3(signature = (max_files=usize::MAX))]
    fn gc(&self, py: Python<'_>, max_files: usize) -> PyResult<usize> {
        self.slot.call(py, |s| s.gc(max_files))
    }

    /// Checks the log and the index read-only; returns the keys found.
    fn check(&self, py: Python<'_>) -> PyResult<u64> {
        self.slot.call(py, |s| s.check())
    }

    /// Keys, log files, bytes and garbage-collection figures, as a dict.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let st = self.slot.call(py, |s| Ok(s.stats()))?;
        let d = PyDict::new(py);
        d.set_item("keys", st.keys)?;
        d.set_item("files", st.files)?;
        d.set_item("log_bytes", st.log_bytes)?;
        d.set_item("live_bytes", st.live_bytes)?;
        d.set_item("space_amplification", st.space_amplification)?;
        d.set_item("pm_bytes", st.pm_bytes)?;
        d.set_item("gc_runs", st.gc_runs)?;
        d.set_item("files_reclaimed", st.files_reclaimed)?;
        d.set_item("cache_hits", st.raf_hits)?;
        d.set_item("open_ms", st.open_ms)?;
        d.set_item("recovered_entries", st.recovered_entries)?;
        Ok(d)
    }

    /// Persists everything and marks the store clean; later calls raise
    /// ClosedError. Closing a closed store does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        match self.slot.take(py) {
            Some(s) => py
                .detach(|| s.close())
                .map_err(|e| PyErr::from(Failure::from(e))),
            None => Ok(()),
        }
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.slot.is_closed()
    }

    /// The store's directory.
    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }
}

/// The native u64 hash index; `pmhash.Index` wraps it as a mapping.
#[pyclass(module = "pmhash._pmhash", name = "Index", frozen)]
pub struct Index {
    slot: Slot<pmhash::Index>,
    path: PathBuf,
    engine: String,
}

#[pymethods]
impl Index {
    /// Opens or creates the index in pool file `path`.
    #[new]
    #[pyo3(signature = (path, *, engine=None, mode="open_or_create", durability="strict",
                        expected_keys=None, pool_size=None, max_pool_size=None, read_only=false))]
    #[allow(clippy::too_many_arguments)] // the Python keyword arguments
    fn new(
        py: Python<'_>,
        path: PathBuf,
        engine: Option<&str>,
        mode: &str,
        durability: &str,
        expected_keys: Option<u64>,
        pool_size: Option<u64>,
        max_pool_size: Option<u64>,
        read_only: bool,
    ) -> PyResult<Index> {
        let mut opts = pmhash::Index::options()
            .durability(self::durability(durability)?)
            .read_only(read_only);
        if let Some(name) = engine {
            opts = opts.engine(name);
        }
        if let Some(n) = expected_keys {
            opts = opts.expected_keys(n);
        }
        if let Some(n) = pool_size {
            opts = opts.pool_size(n);
        }
        if let Some(n) = max_pool_size {
            opts = opts.max_pool_size(n);
        }
        let index = match mode {
            "open_or_create" => py.detach(|| opts.open_or_create(&path)),
            "open" => py.detach(|| opts.open(&path)),
            "create" => py.detach(|| opts.create(&path)),
            other => {
                return Err(InvalidArgument::new_err(format!(
                    "unknown mode {other:?}; known: open_or_create, open, create"
                )))
            }
        }
        .map_err(|e| PyErr::from(Failure::from(e)))?;
        let engine = index.engine_name().to_string();
        Ok(Index {
            slot: Slot::new("index", index),
            path,
            engine,
        })
    }

    /// Inserts a new key; False (and nothing changed) if it is present.
    fn insert(&self, py: Python<'_>, key: u64, value: u64) -> PyResult<bool> {
        self.slot.call(py, |i| i.insert(key, value))
    }

    /// The value of `key`, or None if absent.
    fn get(&self, py: Python<'_>, key: u64) -> PyResult<Option<u64>> {
        self.slot.call(py, |i| Ok(i.get(key)))
    }

    /// The values of `keys` (None where absent), looked up at once.
    fn get_many(&self, py: Python<'_>, keys: Vec<u64>) -> PyResult<Vec<Option<u64>>> {
        self.slot.call(py, |i| Ok(i.get_many(&keys)))
    }

    /// Replaces the value of a present key; False if it is absent.
    fn update(&self, py: Python<'_>, key: u64, value: u64) -> PyResult<bool> {
        self.slot.call(py, |i| i.update(key, value))
    }

    /// Inserts `key` or replaces its value.
    fn upsert(&self, py: Python<'_>, key: u64, value: u64) -> PyResult<()> {
        self.slot.call(py, |i| i.upsert(key, value))
    }

    /// Removes `key`; False if it is absent.
    fn remove(&self, py: Python<'_>, key: u64) -> PyResult<bool> {
        self.slot.call(py, |i| i.remove(key))
    }

    /// Number of keys.
    fn len(&self, py: Python<'_>) -> PyResult<u64> {
        self.slot.call(py, |i| Ok(i.len()))
    }

    /// Every (key, value) pair, collected now, in no particular order.
    fn pairs(&self, py: Python<'_>) -> PyResult<Pairs> {
        let pairs = self.slot.call(py, |i| {
            let mut v = Vec::with_capacity(usize::try_from(i.len()).unwrap_or(0));
            i.for_each(|k, val| v.push((k, val)));
            Ok(v)
        })?;
        Ok(Pairs {
            pairs: pairs.into_iter(),
        })
    }

    /// Makes every completed call durable.
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        self.slot.call(py, |i| i.sync())
    }

    /// Walks the whole structure read-only and checks it; returns the keys.
    fn check(&self, py: Python<'_>) -> PyResult<u64> {
        self.slot.call(py, |i| i.check())
    }

    /// Size, load factor and memory of the table, as a dict.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let st = self.slot.call(py, |i| Ok(i.stats()))?;
        let d = PyDict::new(py);
        d.set_item("len", st.len)?;
        d.set_item("capacity", st.capacity)?;
        d.set_item("load_factor", st.load_factor)?;
        d.set_item("pm_bytes", st.pm_bytes)?;
        d.set_item("dram_bytes", st.dram_bytes)?;
        d.set_item("structural_changes", st.structural_changes)?;
        Ok(d)
    }

    /// Persists everything and marks the pool clean; later calls raise
    /// ClosedError. Closing a closed index does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        match self.slot.take(py) {
            Some(i) => py
                .detach(|| i.close())
                .map_err(|e| PyErr::from(Failure::from(e))),
            None => Ok(()),
        }
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.slot.is_closed()
    }

    /// The pool file.
    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// The engine running the index ("pass", "hmeh+filter", ...).
    #[getter]
    fn engine(&self) -> &str {
        &self.engine
    }
}

/// An iterator over (key, value) pairs collected from an index.
#[pyclass(module = "pmhash._pmhash")]
pub struct Pairs {
    pairs: std::vec::IntoIter<(u64, u64)>,
}

#[pymethods]
impl Pairs {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self) -> Option<(u64, u64)> {
        self.pairs.next()
    }
}

/// The engine names `Index(engine=...)` takes, as (name, description) pairs.
#[pyfunction]
fn engines() -> Vec<(&'static str, &'static str)> {
    pmhash::index_engines()
}

/// The native module.
#[pymodule]
fn _pmhash(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<Store>()?;
    m.add_class::<Index>()?;
    m.add_class::<Pairs>()?;
    m.add_function(wrap_pyfunction!(engines, m)?)?;
    m.add("Error", py.get_type::<Error>())?;
    m.add("OutOfSpace", py.get_type::<OutOfSpace>())?;
    m.add("PoolError", py.get_type::<PoolError>())?;
    m.add("CorruptError", py.get_type::<CorruptError>())?;
    m.add("InvalidArgument", py.get_type::<InvalidArgument>())?;
    m.add("ClosedError", py.get_type::<ClosedError>())?;
    m.add("MAX_KEY", pmhash::MAX_KEY)?;
    m.add("MAX_VALUE", pmhash::MAX_VALUE)?;
    Ok(())
}
