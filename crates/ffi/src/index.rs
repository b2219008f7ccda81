//! The u64 index: `pmhash_index_*` and its options, `pmhash_index_options_*`.

use std::ffi::{c_char, CString};

use pmhash::{Index, IndexOptions};

use crate::boundary::{deref, deref_mut, guard, invalid, put_out, text, Failure, PmhashStatus};
use crate::{durability, mode};

/// How an index is created or opened: a builder. Make one with
/// `pmhash_index_options_new()`, set what differs from the defaults, pass
/// it to `pmhash_index_create()`, `pmhash_index_open()` or
/// `pmhash_index_open_or_create()` (which only read it, so one options
/// object serves many opens), and free it with
/// `pmhash_index_options_free()`. Not for use by two threads at once.
pub struct PmhashIndexOptions {
    opts: IndexOptions,
    read_only: bool,
}

/// A persistent hash index from `uint64_t` keys to `uint64_t` values in one
/// pool file. Every `uint64_t` is a valid key, 0 and `UINT64_MAX` included.
///
/// Thread-safe: any number of threads may call the `pmhash_index_*`
/// functions on one handle at once, except `pmhash_index_close()`, which
/// frees it and must be the last call on it from any thread.
pub struct PmhashIndex {
    index: Index,
    engine: CString,
    /// Opened read-only: the boundary refuses writes itself, because
    /// the front crate's `Index` takes them into its private mapping.
    read_only: bool,
}

/// Size, load and memory of an index's table (`pmhash_index_get_stats()`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PmhashIndexStats {
    /// Keys stored.
    pub len: u64,
    /// Key slots the table has now.
    pub capacity: u64,
    /// `len / capacity`.
    pub load_factor: f64,
    /// Bytes of the pool the table holds.
    pub pm_bytes: u64,
    /// Bytes of DRAM the engine holds beyond the pool (directories,
    /// filters).
    pub dram_bytes: u64,
    /// Structural changes (splits, doublings, resizes, expansions) since
    /// the index was created or opened.
    pub structural_changes: u64,
    /// Nanoseconds spent in those changes, summed over threads.
    pub structural_nanos: u64,
}

/// A new index options object with the defaults: engine `pass` at create
/// (at open, the pool's own), strict durability, a table sized for 1024
/// keys that grows, a 64 MiB pool file that grows up to 64 GiB, mapped
/// mode, writable. Free it with `pmhash_index_options_free()`. Returns
/// NULL only if a panic was caught (see `pmhash_last_error()`).
#[no_mangle]
pub extern "C" fn pmhash_index_options_new() -> *mut PmhashIndexOptions {
    let mut made = std::ptr::null_mut();
    guard(|| {
        made = Box::into_raw(Box::new(PmhashIndexOptions {
            opts: IndexOptions::new(),
            read_only: false,
        }));
        Ok(PmhashStatus::Ok)
    });
    made
}

/// Frees an options object made by `pmhash_index_options_new()`. NULL is
/// accepted and does nothing.
///
/// # Safety
///
/// `opts` is NULL or an options object from `pmhash_index_options_new()`
/// that is not used again.
#[no_mangle]
pub unsafe extern "C" fn pmhash_index_options_free(opts: *mut PmhashIndexOptions) {
    guard(|| {
        if !opts.is_null() {
            // SAFETY: the caller gives back a pointer made by
            // `Box::into_raw` in `pmhash_index_options_new` and never uses
            // it again.
            drop(unsafe { Box::from_raw(opts) });
        }
        Ok(PmhashStatus::Ok)
    });
}

/// Applies `f` to the options behind `opts`.
///
/// # Safety
///
/// `opts` is NULL or a live options object that no other thread uses.
unsafe fn set(
    opts: *mut PmhashIndexOptions,
    f: impl FnOnce(IndexOptions) -> Result<IndexOptions, Failure>,
) -> PmhashStatus {
    guard(|| {
        // SAFETY: the caller's promise, passed on.
        let o = unsafe { deref_mut(opts, "the index options") }?;
        // A refused setting leaves the options as they were.
        o.opts = f(o.opts.clone())?;
        Ok(PmhashStatus::Ok)
    })
}

/// The engine, by name: `pass` (the default), `pass-var`, `pass-dense`,
/// `hmeh`, `rophi`, `level`, or any of these but `rophi` followed by
/// `+filter`. At create it picks the engine; at open it must be one that
/// reads the pool's layout; unset, an open takes the pool's own engine.
/// The string is copied. An unknown name is refused when the index is
/// created or opened.
///
/// # Safety
///
/// `opts` is NULL or a live options object no other thread uses; `name`
/// is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn pmhash_index_options_engine(
    opts: *mut PmhashIndexOptions,
    name: *const c_char,
) -> PmhashStatus {
    let apply = |o: IndexOptions| {
        // SAFETY: the caller promises a NUL-terminated `name` or NULL.
        let name = unsafe { text(name, "the engine name") }?;
        Ok(o.engine(name))
    };
    // SAFETY: the caller's promise about `opts`, passed on.
    unsafe { set(opts, apply) }
}

/// What a returned write promises: `PMHASH_DURABILITY_STRICT` (the
/// default) or `PMHASH_DURABILITY_RELAXED`.
///
/// # Safety
///
/// `opts` is NULL or a live options object no other thread uses.
#[no_mangle]
pub unsafe extern "C" fn pmhash_index_options_durability(
    opts: *mut PmhashIndexOptions,
    durability_code: u32,
) -> PmhashStatus {
    // SAFETY: the caller's promise, passed on.
    unsafe { set(opts, |o| Ok(o.durability(durability(durability_code)?))) }
}

/// Keys the table is sized for at create (it grows past them).
///
/// # Safety
///
/// `opts` is NULL or a live options object no other thread uses.
#[no_mangle]
pub unsafe extern "C" fn pmhash_index_options_expected_keys(
    opts: *mut PmhashIndexOptions,
    keys: u64,
) -> PmhashStatus {
    // SAFETY: the caller's promise, passed on.
    unsafe { set(opts, |o| Ok(o.expected_keys(keys))) }
}

/// Threads that will use the index (a sizing hint; at least 1).
///
/// # Safety
///
/// `opts` is NULL or a live options object no other thread uses.
#[no_mangle]
pub unsafe extern "C" fn pmhash_index_options_threads(
    opts: *mut PmhashIndexOptions,
    threads: u32,
) -> PmhashStatus {
    // SAFETY: the caller's promise, passed on.
    unsafe {
        set(opts, |o| {
            if threads == 0 {
                return Err(invalid("threads must be at least 1"));
            }
            Ok(o.threads(threads as usize))
        })
    }
}

/// Pool file size at create, in bytes (default 64 MiB).
///
/// # Safety
///
/// `opts` is NULL or a live options object no other thread uses.
#[no_mangle]
pub unsafe extern "C" fn pmhash_index_options_pool_size(
    opts: *mut PmhashIndexOptions,
    bytes: u64,
) -> PmhashStatus {
    // SAFETY: the caller's promise, passed on.
    unsafe { set(opts, |o| Ok(o.pool_size(bytes))) }
}

/// The size the pool file may grow to, in bytes (default 64 GiB); a table
/// that needs more gets `PMHASH_STATUS_OUT_OF_SPACE`.
///
/// # Safety
///
/// `opts` is NULL or a live options object no other thread uses.
#[no_mangle]
pub unsafe extern "C" fn pmhash_index_options_max_pool_size(
    opts: *mut PmhashIndexOptions,
    bytes: u64,
) -> PmhashStatus {
    // SAFETY: the caller's promise, passed on.
    unsafe { set(opts, |o| Ok(o.max_pool_size(bytes))) }
}

/// How the pool is mapped: `PMHASH_MODE_MAPPED` (the default: an
/// ordinary file) or `PMHASH_MODE_DAX` (`MAP_SYNC` on a DAX filesystem).
///
/// # Safety
///
/// `opts` is NULL or a live options object no other thread uses.
#[no_mangle]
pub unsafe extern "C" fn pmhash_index_options_mode(
    opts: *mut PmhashIndexOptions,
    mode_code: u32,
) -> PmhashStatus {
    // SAFETY: the caller's promise, passed on.
    unsafe { set(opts, |o| Ok(o.mode(mode(mode_code)?))) }
}

/// Opens without ever writing the file (non-zero: read-only); writes are
/// then refused, and a read-only index cannot be created.
///
/// # Safety
///
/// `opts` is NULL or a live options object no other thread uses.
#[no_mangle]
pub unsafe extern "C" fn pmhash_index_options_read_only(
    opts: *mut PmhashIndexOptions,
    read_only: bool,
) -> PmhashStatus {
    guard(|| {
        // SAFETY: the caller's promise, passed on.
        let o = unsafe { deref_mut(opts, "the index options") }?;
        o.opts = o.opts.clone().read_only(read_only);
        o.read_only = read_only;
        Ok(PmhashStatus::Ok)
    })
}

#[derive(Clone, Copy)]
enum How {
    Create,
    Open,
    OpenOrCreate,
}

/// The body of the three opens.
///
/// # Safety
///
/// As `pmhash_index_open`.
unsafe fn open_with(
    how: How,
    path: *const c_char,
    opts: *const PmhashIndexOptions,
    out: *mut *mut PmhashIndex,
) -> PmhashStatus {
    guard(|| {
        if out.is_null() {
            return Err(invalid("the out-pointer for the index is NULL"));
        }
        // SAFETY: `out` is not NULL and the caller promises it is valid
        // for a write; it is cleared first so that it is NULL on error.
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY: the caller promises a NUL-terminated `path` or NULL.
        let path = unsafe { text(path, "the path") }?;
        let defaults;
        let (opts, read_only) = if opts.is_null() {
            defaults = IndexOptions::new();
            (&defaults, false)
        } else {
            // SAFETY: the caller promises a live options object that no
            // thread writes meanwhile.
            let o = unsafe { deref(opts, "the index options") }?;
            (&o.opts, o.read_only)
        };
        let index = match how {
            How::Create => opts.create(path),
            How::Open => opts.open(path),
            How::OpenOrCreate => opts.open_or_create(path),
        }?;
        let engine = CString::new(index.engine_name()).unwrap_or_default();
        let handle = Box::into_raw(Box::new(PmhashIndex {
            index,
            engine,
            read_only,
        }));
        // SAFETY: as above, `out` is valid for a write.
        unsafe { out.write(handle) };
        Ok(PmhashStatus::Ok)
    })
}

/// Creates a new pool file at `path` (refused if a file is there) and an
/// index in it. `opts` may be NULL for the defaults. On success `*out` is
/// the new handle, which the caller closes with `pmhash_index_close()`;
/// on error `*out` is NULL.
///
/// # Safety
///
/// `path` is NULL or a NUL-terminated string; `opts` is NULL or a live
/// options object; `out` is NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn pmhash_index_create(
    path: *const c_char,
    opts: *const PmhashIndexOptions,
    out: *mut *mut PmhashIndex,
) -> PmhashStatus {
    // SAFETY: the caller's promises, passed on.
    unsafe { open_with(How::Create, path, opts, out) }
}

/// Opens the pool file at `path`, recovering it if it was not closed (a
/// crash, `kill -9`). `opts` may be NULL for the defaults. One process
/// may have a pool open for writing at a time: a second open for writing
/// gets `PMHASH_STATUS_POOL`. On success `*out` is the handle, which the
/// caller closes with `pmhash_index_close()`; on error `*out` is NULL
/// and the file is as it was.
///
/// # Safety
///
/// `path` is NULL or a NUL-terminated string; `opts` is NULL or a live
/// options object; `out` is NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn pmhash_index_open(
    path: *const c_char,
    opts: *const PmhashIndexOptions,
    out: *mut *mut PmhashIndex,
) -> PmhashStatus {
    // SAFETY: the caller's promises, passed on.
    unsafe { open_with(How::Open, path, opts, out) }
}

/// `pmhash_index_open()` if a file is at `path`, else
/// `pmhash_index_create()`.
///
/// # Safety
///
/// `path` is NULL or a NUL-terminated string; `opts` is NULL or a live
/// options object; `out` is NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn pmhash_index_open_or_create(
    path: *const c_char,
    opts: *const PmhashIndexOptions,
    out: *mut *mut PmhashIndex,
) -> PmhashStatus {
    // SAFETY: the caller's promises, passed on.
    unsafe { open_with(How::OpenOrCreate, path, opts, out) }
}

/// The index behind a handle.
///
/// # Safety
///
/// `ix` is NULL or a live handle.
unsafe fn index<'a>(ix: *const PmhashIndex) -> Result<&'a Index, Failure> {
    // SAFETY: the caller's promise; a live handle is only read through
    // shared references (the index is `Sync`).
    Ok(&unsafe { deref(ix, "the index handle") }?.index)
}

/// The index behind a handle, for a write.
///
/// # Safety
///
/// `ix` is NULL or a live handle.
unsafe fn writable<'a>(ix: *const PmhashIndex) -> Result<&'a Index, Failure> {
    // SAFETY: the caller's promise, passed on.
    let handle = unsafe { deref(ix, "the index handle") }?;
    if handle.read_only {
        return Err(invalid("the index was opened read-only"));
    }
    Ok(&handle.index)
}

/// Inserts a new key: `PMHASH_STATUS_EXISTS` (and nothing changed) if it is
/// already present.
///
/// # Safety
///
/// `ix` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn pmhash_index_insert(
    ix: *const PmhashIndex,
    key: u64,
    value: u64,
) -> PmhashStatus {
    guard(|| {
        // SAFETY: the caller's promise, passed on.
        let fresh = unsafe { writable(ix) }?.insert(key, value)?;
        Ok(if fresh {
            PmhashStatus::Ok
        } else {
            PmhashStatus::Exists
        })
    })
}

/// The value of `key` into `*value`: `PMHASH_STATUS_NOT_FOUND` (and
/// `*value` untouched) if the key is absent.
///
/// # Safety
///
/// `ix` is NULL or a live handle; `value` is NULL or valid for writing a
/// `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn pmhash_index_get(
    ix: *const PmhashIndex,
    key: u64,
    value: *mut u64,
) -> PmhashStatus {
    guard(|| {
        // SAFETY: the caller's promise, passed on.
        let ix = unsafe { index(ix) }?;
        if value.is_null() {
            return Err(invalid("the out-pointer for the value is NULL"));
        }
        match ix.get(key) {
            Some(v) => {
                // SAFETY: `value` is not NULL and the caller promises it
                // is valid for a write.
                unsafe { value.write(v) };
                Ok(PmhashStatus::Ok)
            }
            None => Ok(PmhashStatus::NotFound),
        }
    })
}

/// Replaces the value of a present key: `PMHASH_STATUS_NOT_FOUND` if it
/// is absent.
///
/// # Safety
///
/// `ix` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn pmhash_index_update(
    ix: *const PmhashIndex,
    key: u64,
    value: u64,
) -> PmhashStatus {
    guard(|| {
        // SAFETY: the caller's promise, passed on.
        let present = unsafe { writable(ix) }?.update(key, value)?;
        Ok(if present {
            PmhashStatus::Ok
        } else {
            PmhashStatus::NotFound
        })
    })
}

/// Inserts `key` or replaces its value.
///
/// # Safety
///
/// `ix` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn pmhash_index_upsert(
    ix: *const PmhashIndex,
    key: u64,
    value: u64,
) -> PmhashStatus {
    guard(|| {
        // SAFETY: the caller's promise, passed on.
        unsafe { writable(ix) }?.upsert(key, value)?;
        Ok(PmhashStatus::Ok)
    })
}

/// Removes `key`: `PMHASH_STATUS_NOT_FOUND` if it is absent.
///
/// # Safety
///
/// `ix` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn pmhash_index_remove(ix: *const PmhashIndex, key: u64) -> PmhashStatus {
    guard(|| {
        // SAFETY: the caller's promise, passed on.
        let present = unsafe { writable(ix) }?.remove(key)?;
        Ok(if present {
            PmhashStatus::Ok
        } else {
            PmhashStatus::NotFound
        })
    })
}

/// The number of keys into `*len`.
///
/// # Safety
///
/// `ix` is NULL or a live handle; `len` is NULL or valid for writing a
/// `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn pmhash_index_len(ix: *const PmhashIndex, len: *mut u64) -> PmhashStatus {
    guard(|| {
        // SAFETY: the caller's promises, passed on.
        let n = unsafe { index(ix) }?.len();
        // SAFETY: the caller's promise, passed on.
        unsafe { put_out(len, n, "the out-pointer for the length") }?;
        Ok(PmhashStatus::Ok)
    })
}

/// The table's figures into `*stats`.
///
/// # Safety
///
/// `ix` is NULL or a live handle; `stats` is NULL or valid for writing a
/// `pmhash_index_stats`.
#[no_mangle]
pub unsafe extern "C" fn pmhash_index_get_stats(
    ix: *const PmhashIndex,
    stats: *mut PmhashIndexStats,
) -> PmhashStatus {
    guard(|| {
        // SAFETY: the caller's promise, passed on.
        let s = unsafe { index(ix) }?.stats();
        let figures = PmhashIndexStats {
            len: s.len,
            capacity: s.capacity,
            load_factor: s.load_factor,
            pm_bytes: s.pm_bytes,
            dram_bytes: s.dram_bytes,
            structural_changes: s.structural_changes,
            structural_nanos: s.structural_nanos,
        };
        // SAFETY: the caller's promise, passed on.
        unsafe { put_out(stats, figures, "the out-pointer for the stats") }?;
        Ok(PmhashStatus::Ok)
    })
}

/// The engine's name (`"pass"`, `"hmeh+filter"`, ...): a string owned by
/// the handle, valid until `pmhash_index_close()`. NULL if `ix` is NULL.
///
/// # Safety
///
/// `ix` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn pmhash_index_engine(ix: *const PmhashIndex) -> *const c_char {
    let mut name = std::ptr::null();
    guard(|| {
        // SAFETY: the caller's promise, passed on.
        name = unsafe { deref(ix, "the index handle") }?.engine.as_ptr();
        Ok(PmhashStatus::Ok)
    });
    name
}

/// Makes every completed write durable (under strict durability each
/// already is).
///
/// # Safety
///
/// `ix` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn pmhash_index_sync(ix: *const PmhashIndex) -> PmhashStatus {
    guard(|| {
        // SAFETY: the caller's promise, passed on.
        unsafe { index(ix) }?.sync()?;
        Ok(PmhashStatus::Ok)
    })
}

/// Persists everything, marks the pool clean (so the next open skips
/// crash recovery) and frees the handle, which is gone after the call
/// even when it returns an error. No other thread may be using the handle
/// during or after the call.
///
/// # Safety
///
/// `ix` is NULL or a live handle that is not used again.
#[no_mangle]
pub unsafe extern "C" fn pmhash_index_close(ix: *mut PmhashIndex) -> PmhashStatus {
    guard(|| {
        if ix.is_null() {
            return Err(invalid("the index handle is NULL"));
        }
        // SAFETY: `ix` is not NULL; the caller gives back a handle made by
        // `Box::into_raw` in an open and never uses it again.
        let handle = unsafe { Box::from_raw(ix) };
        handle.index.close()?;
        Ok(PmhashStatus::Ok)
    })
}
