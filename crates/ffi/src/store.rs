//! The key-value store: `pmhash_store_*` and its options,
//! `pmhash_store_options_*`.

use std::ffi::{c_char, c_int, c_void};

use pmhash::{Store, StoreOptions};

use crate::boundary::{
    bytes, deref, deref_mut, guard, invalid, put_out, text, Failure, PmhashStatus,
};
use crate::{durability, mode, PmhashBytes};

/// How a store is opened: a builder. Make one with
/// `pmhash_store_options_new()`, set what differs from the defaults, pass
/// it to `pmhash_store_open()` (which only reads it), and free it with
/// `pmhash_store_options_free()`. Not for use by two threads at once.
pub struct PmhashStoreOptions {
    opts: StoreOptions,
}

/// A persistent key-value store of byte keys (up to `PMHASH_MAX_KEY`
/// bytes) and byte values (up to `PMHASH_MAX_VALUE` bytes), ordered for
/// range scans, in a directory of its own.
///
/// Thread-safe: any number of threads may call the `pmhash_store_*`
/// functions on one handle at once, except `pmhash_store_close()`, which
/// frees it and must be the last call on it from any thread.
pub struct PmhashStore {
    store: Store,
}

/// A store's figures (`pmhash_store_get_stats()`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PmhashStoreStats {
    /// Keys present.
    pub keys: u64,
    /// Log files in use.
    pub files: u64,
    /// Bytes of log entries written and not yet reclaimed.
    pub log_bytes: u64,
    /// Of those, bytes holding a key's newest value.
    pub live_bytes: u64,
    /// `log_bytes / live_bytes` (infinite when the log holds only dead
    /// entries).
    pub space_amplification: f64,
    /// Bytes of the pool.
    pub pm_bytes: u64,
    /// Garbage-collection passes run.
    pub gc_runs: u64,
    /// Log files garbage collection freed.
    pub files_reclaimed: u64,
    /// Gets served by the DRAM cache of hot values.
    pub cache_hits: u64,
    /// Milliseconds the last open spent recovering.
    pub open_ms: f64,
    /// Log entries the last recovery scanned.
    pub recovered_entries: u64,
    /// DRAM bytes of the point index.
    pub index_dram_bytes: u64,
}

/// Called by `pmhash_store_scan()` for each pair, in key order, with the
/// `context` given to the scan. The key and value pointers are valid only
/// during the call. Return 0 to go on, anything else to stop the scan.
/// The callback must not unwind (a C++ exception) or `longjmp` out, and
/// must not close the store.
pub type PmhashScanFn = Option<
    unsafe extern "C" fn(
        context: *mut c_void,
        key: *const u8,
        key_len: usize,
        value: *const u8,
        value_len: usize,
    ) -> c_int,
>;

/// A new store options object with the defaults: strict durability, a
/// 256 MiB pool that grows up to 16 times that, a DRAM index sized for
/// 2^20 keys, a 64 MiB cache of hot values, mapped mode, writable. Free it
/// with `pmhash_store_options_free()`. Returns NULL only if a panic was
/// caught (see `pmhash_last_error()`).
#[no_mangle]
pub extern "C" fn pmhash_store_options_new() -> *mut PmhashStoreOptions {
    let mut made = std::ptr::null_mut();
    guard(|| {
        made = Box::into_raw(Box::new(PmhashStoreOptions {
            opts: StoreOptions::new(),
        }));
        Ok(PmhashStatus::Ok)
    });
    made
}

/// Frees an options object made by `pmhash_store_options_new()`. NULL is
/// accepted and does nothing.
///
/// # Safety
///
/// `opts` is NULL or an options object from `pmhash_store_options_new()`
/// that is not used again.
#[no_mangle]
pub unsafe extern "C" fn pmhash_store_options_free(opts: *mut PmhashStoreOptions) {
    guard(|| {
        if !opts.is_null() {
            // SAFETY: the caller gives back a pointer made by
            // `Box::into_raw` in `pmhash_store_options_new` and never uses
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
    opts: *mut PmhashStoreOptions,
    f: impl FnOnce(StoreOptions) -> Result<StoreOptions, Failure>,
) -> PmhashStatus {
    guard(|| {
        // SAFETY: the caller's promise, passed on.
        let o = unsafe { deref_mut(opts, "the store options") }?;
        // A refused setting leaves the options as they were.
        o.opts = f(o.opts.clone())?;
        Ok(PmhashStatus::Ok)
    })
}

/// What a returned write promises: `PMHASH_DURABILITY_STRICT` (the
/// default) or `PMHASH_DURABILITY_RELAXED`.
///
/// # Safety
///
/// `opts` is NULL or a live options object no other thread uses.
#[no_mangle]
pub unsafe extern "C" fn pmhash_store_options_durability(
    opts: *mut PmhashStoreOptions,
    durability_code: u32,
) -> PmhashStatus {
    // SAFETY: the caller's promise, passed on.
    unsafe { set(opts, |o| Ok(o.durability(durability(durability_code)?))) }
}

/// Pool file size at create, in bytes (default 256 MiB).
///
/// # Safety
///
/// `opts` is NULL or a live options object no other thread uses.
#[no_mangle]
pub unsafe extern "C" fn pmhash_store_options_pool_size(
    opts: *mut PmhashStoreOptions,
    bytes: u64,
) -> PmhashStatus {
    // SAFETY: the caller's promise, passed on.
    unsafe { set(opts, |o| Ok(o.pool_size(bytes))) }
}

/// The size the pool may grow to, in bytes (default 16 times the create
/// size); a write that needs more gets `PMHASH_STATUS_OUT_OF_SPACE`.
///
/// # Safety
///
/// `opts` is NULL or a live options object no other thread uses.
#[no_mangle]
pub unsafe extern "C" fn pmhash_store_options_max_pool_size(
    opts: *mut PmhashStoreOptions,
    bytes: u64,
) -> PmhashStatus {
    // SAFETY: the caller's promise, passed on.
    unsafe { set(opts, |o| Ok(o.max_pool_size(bytes))) }
}

/// Keys expected: sizes the DRAM index so that loading it never resizes.
///
/// # Safety
///
/// `opts` is NULL or a live options object no other thread uses.
#[no_mangle]
pub unsafe extern "C" fn pmhash_store_options_expected_keys(
    opts: *mut PmhashStoreOptions,
    keys: u64,
) -> PmhashStatus {
    // SAFETY: the caller's promise, passed on.
    unsafe { set(opts, |o| Ok(o.expected_keys(keys))) }
}

/// Bytes of DRAM for the cache of hot values (default 64 MiB; 0: none).
///
/// # Safety
///
/// `opts` is NULL or a live options object no other thread uses.
#[no_mangle]
pub unsafe extern "C" fn pmhash_store_options_cache_bytes(
    opts: *mut PmhashStoreOptions,
    bytes: u64,
) -> PmhashStatus {
    // SAFETY: the caller's promise, passed on.
    unsafe { set(opts, |o| Ok(o.cache_bytes(bytes))) }
}

/// At create: the hash clusters of each node's log (default 256). Each
/// cluster appends to a log file of its own, so a store that has written
/// to every cluster holds at least clusters x log file size of its pool
/// per node (2 GiB by default): a small store wants fewer clusters or
/// smaller files. Checked when the store is opened.
///
/// # Safety
///
/// `opts` is NULL or a live options object no other thread uses.
#[no_mangle]
pub unsafe extern "C" fn pmhash_store_options_log_clusters(
    opts: *mut PmhashStoreOptions,
    clusters: u32,
) -> PmhashStatus {
    // SAFETY: the caller's promise, passed on.
    unsafe { set(opts, |o| Ok(o.log_clusters(clusters))) }
}

/// At create: bytes per log file (default 8 MiB; a multiple of 64, at
/// least 4096). An entry (key, value and 64 bytes of header) must fit one
/// file. Checked when the store is opened.
///
/// # Safety
///
/// `opts` is NULL or a live options object no other thread uses.
#[no_mangle]
pub unsafe extern "C" fn pmhash_store_options_log_file_size(
    opts: *mut PmhashStoreOptions,
    bytes: u64,
) -> PmhashStatus {
    // SAFETY: the caller's promise, passed on.
    unsafe { set(opts, |o| Ok(o.log_file_size(bytes))) }
}

/// How the pool is mapped: `PMHASH_MODE_MAPPED` (the default) or
/// `PMHASH_MODE_DAX`.
///
/// # Safety
///
/// `opts` is NULL or a live options object no other thread uses.
#[no_mangle]
pub unsafe extern "C" fn pmhash_store_options_mode(
    opts: *mut PmhashStoreOptions,
    mode_code: u32,
) -> PmhashStatus {
    // SAFETY: the caller's promise, passed on.
    unsafe { set(opts, |o| Ok(o.mode(mode(mode_code)?))) }
}

/// Opens without writing the pool (non-zero: read-only); writes are then
/// refused.
///
/// # Safety
///
/// `opts` is NULL or a live options object no other thread uses.
#[no_mangle]
pub unsafe extern "C" fn pmhash_store_options_read_only(
    opts: *mut PmhashStoreOptions,
    read_only: bool,
) -> PmhashStatus {
    // SAFETY: the caller's promise, passed on.
    unsafe { set(opts, |o| Ok(o.read_only(read_only))) }
}

/// Opens the store in directory `dir`, creating the directory and the
/// store if they do not exist, and recovering it if it was not closed (a
/// crash, `kill -9`). `opts` may be NULL for the defaults. One process
/// may have a store open for writing at a time: a second open for writing
/// gets `PMHASH_STATUS_POOL`. On success `*out` is the handle, which the
/// caller closes with `pmhash_store_close()`; on error `*out` is NULL.
///
/// # Safety
///
/// `dir` is NULL or a NUL-terminated string; `opts` is NULL or a live
/// options object; `out` is NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn pmhash_store_open(
    dir: *const c_char,
    opts: *const PmhashStoreOptions,
    out: *mut *mut PmhashStore,
) -> PmhashStatus {
    guard(|| {
        if out.is_null() {
            return Err(invalid("the out-pointer for the store is NULL"));
        }
        // SAFETY: `out` is not NULL and the caller promises it is valid
        // for a write; it is cleared first so that it is NULL on error.
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY: the caller promises a NUL-terminated `dir` or NULL.
        let dir = unsafe { text(dir, "the directory") }?;
        let store = if opts.is_null() {
            StoreOptions::new().open(dir)
        } else {
            // SAFETY: the caller promises a live options object that no
            // thread writes meanwhile.
            unsafe { deref(opts, "the store options") }?.opts.open(dir)
        }?;
        let handle = Box::into_raw(Box::new(PmhashStore { store }));
        // SAFETY: as above, `out` is valid for a write.
        unsafe { out.write(handle) };
        Ok(PmhashStatus::Ok)
    })
}

/// The store behind a handle.
///
/// # Safety
///
/// `s` is NULL or a live handle.
unsafe fn store<'a>(s: *const PmhashStore) -> Result<&'a Store, Failure> {
    // SAFETY: the caller's promise; a live handle is only read through
    // shared references (the store is `Sync`).
    Ok(&unsafe { deref(s, "the store handle") }?.store)
}

/// What `pmhash_store_put()`, `_insert()` and `_update()` share: the
/// handle, the key and the value checked at the boundary, then `op`.
///
/// # Safety
///
/// As `pmhash_store_put()`.
unsafe fn write_pair(
    s: *const PmhashStore,
    (key, key_len): (*const u8, usize),
    (value, value_len): (*const u8, usize),
    op: impl FnOnce(&Store, &[u8], &[u8]) -> Result<PmhashStatus, Failure>,
) -> PmhashStatus {
    guard(|| {
        // SAFETY: the caller's promises, passed on.
        let (s, k, v) = unsafe {
            (
                store(s)?,
                bytes(key, key_len, "the key")?,
                bytes(value, value_len, "the value")?,
            )
        };
        op(s, k, v)
    })
}

/// Stores `value` under `key`, replacing any value it had. A key is up to
/// `PMHASH_MAX_KEY` bytes, a value up to `PMHASH_MAX_VALUE`; a pointer may
/// be NULL only with length 0.
///
/// # Safety
///
/// `s` is NULL or a live handle; `key` and `value` are NULL or valid for
/// reads of their lengths.
#[no_mangle]
pub unsafe extern "C" fn pmhash_store_put(
    s: *const PmhashStore,
    key: *const u8,
    key_len: usize,
    value: *const u8,
    value_len: usize,
) -> PmhashStatus {
    // SAFETY: the caller's promises, passed on.
    unsafe {
        write_pair(s, (key, key_len), (value, value_len), |s, k, v| {
            s.put(k, v)?;
            Ok(PmhashStatus::Ok)
        })
    }
}

/// Stores `value` under `key` if the key is absent:
/// `PMHASH_STATUS_EXISTS` (and nothing written) if it is present.
///
/// # Safety
///
/// As `pmhash_store_put()`.
#[no_mangle]
pub unsafe extern "C" fn pmhash_store_insert(
    s: *const PmhashStore,
    key: *const u8,
    key_len: usize,
    value: *const u8,
    value_len: usize,
) -> PmhashStatus {
    // SAFETY: the caller's promises, passed on.
    unsafe {
        write_pair(s, (key, key_len), (value, value_len), |s, k, v| {
            Ok(if s.insert(k, v)? {
                PmhashStatus::Ok
            } else {
                PmhashStatus::Exists
            })
        })
    }
}

/// Replaces the value of a present key: `PMHASH_STATUS_NOT_FOUND` if it
/// is absent.
///
/// # Safety
///
/// As `pmhash_store_put()`.
#[no_mangle]
pub unsafe extern "C" fn pmhash_store_update(
    s: *const PmhashStore,
    key: *const u8,
    key_len: usize,
    value: *const u8,
    value_len: usize,
) -> PmhashStatus {
    // SAFETY: the caller's promises, passed on.
    unsafe {
        write_pair(s, (key, key_len), (value, value_len), |s, k, v| {
            Ok(if s.update(k, v)? {
                PmhashStatus::Ok
            } else {
                PmhashStatus::NotFound
            })
        })
    }
}

/// The value of `key` into `*value`, a buffer the library allocates and
/// the caller frees with `pmhash_bytes_free()`: `PMHASH_STATUS_NOT_FOUND`
/// if the key is absent. On any status but `PMHASH_STATUS_OK`, `*value`
/// is set to `{NULL, 0}`, which needs no freeing.
///
/// # Safety
///
/// `s` is NULL or a live handle; `key` is NULL or valid for reads of
/// `key_len` bytes; `value` is NULL or valid for writing a `pmhash_bytes`.
#[no_mangle]
pub unsafe extern "C" fn pmhash_store_get(
    s: *const PmhashStore,
    key: *const u8,
    key_len: usize,
    value: *mut PmhashBytes,
) -> PmhashStatus {
    guard(|| {
        // SAFETY: the caller's promise about `value`, passed on.
        unsafe { put_out(value, PmhashBytes::empty(), "the out-pointer for the value") }?;
        // SAFETY: the caller's promises, passed on.
        let (s, k) = unsafe { (store(s)?, bytes(key, key_len, "the key")?) };
        match s.get(k)? {
            Some(v) => {
                // SAFETY: checked non-NULL above; the caller promises it
                // is valid for a write.
                unsafe { value.write(PmhashBytes::from_vec(v)) };
                Ok(PmhashStatus::Ok)
            }
            None => Ok(PmhashStatus::NotFound),
        }
    })
}

/// Removes `key`: `PMHASH_STATUS_NOT_FOUND` if it is absent.
///
/// # Safety
///
/// `s` is NULL or a live handle; `key` is NULL or valid for reads of
/// `key_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn pmhash_store_delete(
    s: *const PmhashStore,
    key: *const u8,
    key_len: usize,
) -> PmhashStatus {
    guard(|| {
        // SAFETY: the caller's promises, passed on.
        let (s, k) = unsafe { (store(s)?, bytes(key, key_len, "the key")?) };
        Ok(if s.delete(k)? {
            PmhashStatus::Ok
        } else {
            PmhashStatus::NotFound
        })
    })
}

/// Calls `callback(context, key, key_len, value, value_len)` for up to
/// `limit` pairs with keys from `start` (inclusive) to `end` (exclusive),
/// in key order, until the callback returns non-zero. `end` NULL (with
/// `end_len` 0) means no end; `start` NULL with `start_len` 0 starts at
/// the first key. The pairs are read before the first callback: a write
/// made by the callback is not seen by this scan.
///
/// # Safety
///
/// `s` is NULL or a live handle; `start` and `end` are NULL or valid for
/// reads of their lengths; `callback` follows the rules of
/// `pmhash_scan_fn`.
#[no_mangle]
pub unsafe extern "C" fn pmhash_store_scan(
    s: *const PmhashStore,
    start: *const u8,
    start_len: usize,
    end: *const u8,
    end_len: usize,
    limit: usize,
    callback: PmhashScanFn,
    context: *mut c_void,
) -> PmhashStatus {
    guard(|| {
        let callback = callback.ok_or_else(|| invalid("the scan callback is NULL"))?;
        // SAFETY: the caller's promises, passed on.
        let (s, from) = unsafe { (store(s)?, bytes(start, start_len, "the scan start")?) };
        let to = if end.is_null() && end_len == 0 {
            None
        } else {
            // SAFETY: the caller's promise, passed on.
            Some(unsafe { bytes(end, end_len, "the scan end") }?)
        };
        for (k, v) in s.scan(from, to, limit)? {
            // SAFETY: the callback is the caller's function with the
            // signature of `pmhash_scan_fn`; the pointers are valid for
            // their lengths for the duration of the call.
            let stop = unsafe { callback(context, k.as_ptr(), k.len(), v.as_ptr(), v.len()) };
            if stop != 0 {
                break;
            }
        }
        Ok(PmhashStatus::Ok)
    })
}

/// The number of keys into `*len`.
///
/// # Safety
///
/// `s` is NULL or a live handle; `len` is NULL or valid for writing a
/// `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn pmhash_store_len(s: *const PmhashStore, len: *mut u64) -> PmhashStatus {
    guard(|| {
        // SAFETY: the caller's promise, passed on.
        let n = unsafe { store(s) }?.len();
        // SAFETY: the caller's promise, passed on.
        unsafe { put_out(len, n, "the out-pointer for the length") }?;
        Ok(PmhashStatus::Ok)
    })
}

/// The store's figures into `*stats`.
///
/// # Safety
///
/// `s` is NULL or a live handle; `stats` is NULL or valid for writing a
/// `pmhash_store_stats`.
#[no_mangle]
pub unsafe extern "C" fn pmhash_store_get_stats(
    s: *const PmhashStore,
    stats: *mut PmhashStoreStats,
) -> PmhashStatus {
    guard(|| {
        // SAFETY: the caller's promise, passed on.
        let st = unsafe { store(s) }?.stats();
        let figures = PmhashStoreStats {
            keys: st.keys,
            files: st.files,
            log_bytes: st.log_bytes,
            live_bytes: st.live_bytes,
            space_amplification: st.space_amplification,
            pm_bytes: st.pm_bytes,
            gc_runs: st.gc_runs,
            files_reclaimed: st.files_reclaimed,
            cache_hits: st.raf_hits,
            open_ms: st.open_ms,
            recovered_entries: st.recovered_entries,
            index_dram_bytes: st.index_dram_bytes,
        };
        // SAFETY: the caller's promise, passed on.
        unsafe { put_out(stats, figures, "the out-pointer for the stats") }?;
        Ok(PmhashStatus::Ok)
    })
}

/// Makes every completed write durable (under strict durability each
/// already is).
///
/// # Safety
///
/// `s` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn pmhash_store_sync(s: *const PmhashStore) -> PmhashStatus {
    guard(|| {
        // SAFETY: the caller's promise, passed on.
        unsafe { store(s) }?.sync()?;
        Ok(PmhashStatus::Ok)
    })
}

/// Persists everything, marks the store clean (so the next open skips the
/// log scan) and frees the handle, which is gone after the call even when
/// it returns an error. No other thread may be using the handle during or
/// after the call.
///
/// # Safety
///
/// `s` is NULL or a live handle that is not used again.
#[no_mangle]
pub unsafe extern "C" fn pmhash_store_close(s: *mut PmhashStore) -> PmhashStatus {
    guard(|| {
        if s.is_null() {
            return Err(invalid("the store handle is NULL"));
        }
        // SAFETY: `s` is not NULL; the caller gives back a handle made by
        // `Box::into_raw` in `pmhash_store_open` and never uses it again.
        let handle = unsafe { Box::from_raw(s) };
        handle.store.close()?;
        Ok(PmhashStatus::Ok)
    })
}
