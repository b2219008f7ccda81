//! C bindings for pmhash: `libpmhash` (shared and static) and its header
//! `include/pmhash.h`, generated from this crate by cbindgen.
//!
//! Two kinds of handle: `pmhash_store` (byte keys and values, ordered
//! scans, in a directory) and `pmhash_index` (`uint64_t` keys and values
//! in one pool file, run by an engine chosen by name). The rules that hold
//! for every function:
//!
//! - **Status.** Every call that can fail returns a `pmhash_status`: 0
//!   (`PMHASH_STATUS_OK`) for success, a positive value for an outcome
//!   that is not an error (`PMHASH_STATUS_NOT_FOUND`,
//!   `PMHASH_STATUS_EXISTS`), a negative value for an error. After an
//!   error, `pmhash_last_error()` returns its message.
//! - **Bad input.** A NULL pointer where a value is needed, a path that is
//!   not UTF-8, a length out of range, an unknown engine name: each is
//!   `PMHASH_STATUS_INVALID_ARGUMENT` with a message, never a crash. What
//!   the library cannot check (a dangling pointer, a closed handle, a
//!   buffer shorter than its length) is the caller's to get right.
//! - **Panics.** No panic crosses the boundary: each function catches one
//!   and returns `PMHASH_STATUS_PANIC`.
//! - **Ownership.** What a `*_new()` or an open returns is the caller's,
//!   freed with the matching `*_free()` or `*_close()`; a `pmhash_bytes`
//!   filled by the library is freed with `pmhash_bytes_free()`. Strings
//!   and buffers passed in are only read during the call (the library
//!   keeps copies). A `const char *` returned by the library is owned by
//!   it; how long it lives is said with each function.
//! - **Threads.** A store or index handle may be used by many threads at
//!   once; its close must be the last call on it. An options object is
//!   used by one thread at a time.

mod boundary;
mod index;
mod store;

use std::ffi::{c_char, c_int, CStr};

pub use boundary::PmhashStatus;
pub use index::{
    pmhash_index_close, pmhash_index_create, pmhash_index_engine, pmhash_index_get,
    pmhash_index_get_stats, pmhash_index_insert, pmhash_index_len, pmhash_index_open,
    pmhash_index_open_or_create, pmhash_index_options_durability, pmhash_index_options_engine,
    pmhash_index_options_expected_keys, pmhash_index_options_free,
    pmhash_index_options_max_pool_size, pmhash_index_options_mode, pmhash_index_options_new,
    pmhash_index_options_pool_size, pmhash_index_options_read_only, pmhash_index_options_threads,
    pmhash_index_remove, pmhash_index_sync, pmhash_index_update, pmhash_index_upsert, PmhashIndex,
    PmhashIndexOptions, PmhashIndexStats,
};
pub use store::{
    pmhash_store_close, pmhash_store_delete, pmhash_store_get, pmhash_store_get_stats,
    pmhash_store_insert, pmhash_store_len, pmhash_store_open, pmhash_store_options_cache_bytes,
    pmhash_store_options_durability, pmhash_store_options_expected_keys, pmhash_store_options_free,
    pmhash_store_options_log_clusters, pmhash_store_options_log_file_size,
    pmhash_store_options_max_pool_size, pmhash_store_options_mode, pmhash_store_options_new,
    pmhash_store_options_pool_size, pmhash_store_options_read_only, pmhash_store_put,
    pmhash_store_scan, pmhash_store_sync, pmhash_store_update, PmhashScanFn, PmhashStore,
    PmhashStoreOptions, PmhashStoreStats,
};

use boundary::{guard, invalid, Failure};

/// The longest key a store takes, in bytes.
pub const PMHASH_MAX_KEY: usize = 4096;

/// The longest value a store takes, in bytes.
pub const PMHASH_MAX_VALUE: usize = 1 << 20;

/// What a returned write promises (the `durability_code` of the options'
/// durability setters).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PmhashDurability {
    /// A write that has returned survives a crash (the default).
    Strict = 0,
    /// A write is durable once a later sync has returned; after a crash
    /// the contents are consistent, and each key holds a value once
    /// written to it.
    Relaxed = 1,
}

/// How a pool file is mapped (the `mode_code` of the options' mode
/// setters).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PmhashMode {
    /// An ordinary file through the page cache (the default): durable
    /// against a crash of the process at once, against power loss once
    /// the page cache is written back.
    Mapped = 0,
    /// A file on a DAX filesystem mapped with `MAP_SYNC`: durable against
    /// power loss.
    Dax = 1,
}

pub(crate) fn durability(code: u32) -> Result<pmhash::Durability, Failure> {
    match code {
        c if c == PmhashDurability::Strict as u32 => Ok(pmhash::Durability::Strict),
        c if c == PmhashDurability::Relaxed as u32 => Ok(pmhash::Durability::Relaxed),
        _ => Err(invalid(format!(
            "unknown durability {code}; PMHASH_DURABILITY_STRICT (0) or PMHASH_DURABILITY_RELAXED (1)"
        ))),
    }
}

pub(crate) fn mode(code: u32) -> Result<pmhash::Mode, Failure> {
    match code {
        c if c == PmhashMode::Mapped as u32 => Ok(pmhash::Mode::Mapped),
        c if c == PmhashMode::Dax as u32 => Ok(pmhash::Mode::Dax),
        _ => Err(invalid(format!(
            "unknown mode {code}; PMHASH_MODE_MAPPED (0) or PMHASH_MODE_DAX (1)"
        ))),
    }
}

/// A buffer of bytes the library allocated (a value read by
/// `pmhash_store_get()`): the caller's, freed with `pmhash_bytes_free()`.
/// An empty buffer is `{NULL, 0}`.
#[repr(C)]
#[derive(Debug)]
pub struct PmhashBytes {
    /// The bytes; NULL when `len` is 0.
    pub data: *mut u8,
    /// How many.
    pub len: usize,
}

impl PmhashBytes {
    pub(crate) fn empty() -> PmhashBytes {
        PmhashBytes {
            data: std::ptr::null_mut(),
            len: 0,
        }
    }

    pub(crate) fn from_vec(v: Vec<u8>) -> PmhashBytes {
        if v.is_empty() {
            return PmhashBytes::empty();
        }
        let boxed = v.into_boxed_slice();
        let len = boxed.len();
        PmhashBytes {
            data: Box::into_raw(boxed).cast::<u8>(),
            len,
        }
    }
}

/// Frees the buffer of `*bytes` and sets it to `{NULL, 0}`; NULL, or a
/// buffer that is already `{NULL, 0}`, is accepted and does nothing.
///
/// # Safety
///
/// `bytes` is NULL or points to a `pmhash_bytes` that the library filled
/// (or `{NULL, 0}`), not changed since.
#[no_mangle]
pub unsafe extern "C" fn pmhash_bytes_free(bytes: *mut PmhashBytes) {
    guard(|| {
        // SAFETY: the caller promises a valid `pmhash_bytes` or NULL.
        let Some(b) = (unsafe { bytes.as_mut() }) else {
            return Ok(PmhashStatus::Ok);
        };
        if !b.data.is_null() {
            let slice = std::ptr::slice_from_raw_parts_mut(b.data, b.len);
            // SAFETY: a non-NULL `data` with its `len` was made by
            // `PmhashBytes::from_vec` from a boxed slice of that length,
            // and the caller frees it once (it is cleared below).
            drop(unsafe { Box::from_raw(slice) });
        }
        *b = PmhashBytes::empty();
        Ok(PmhashStatus::Ok)
    });
}

/// The message of the last error on the calling thread ("" if none): a
/// NUL-terminated string owned by the library, valid until the thread's
/// next call into the library. Each thread has its own.
#[no_mangle]
pub extern "C" fn pmhash_last_error() -> *const c_char {
    let mut message = c"".as_ptr();
    guard(|| {
        message = boundary::last_error();
        Ok(PmhashStatus::Ok)
    });
    message
}

/// The name of a status code (`"PMHASH_STATUS_NOT_FOUND"`), or
/// `"unknown status"` for a value that is none: a static string.
#[no_mangle]
pub extern "C" fn pmhash_status_name(status: c_int) -> *const c_char {
    let mut name = c"unknown status".as_ptr();
    guard(|| {
        if let Some(s) = PmhashStatus::from_code(status) {
            name = s.name().as_ptr();
        }
        Ok(PmhashStatus::Ok)
    });
    name
}

/// The library's version (`"0.1.0"`): a static string.
#[no_mangle]
pub extern "C" fn pmhash_version() -> *const c_char {
    const VERSION: &CStr =
        match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
            Ok(v) => v,
            Err(_) => panic!("the version has no NUL"),
        };
    let mut version = c"".as_ptr();
    guard(|| {
        version = VERSION.as_ptr();
        Ok(PmhashStatus::Ok)
    });
    version
}

/// For tests of the boundary only: panics inside the library on purpose,
/// and so always returns `PMHASH_STATUS_PANIC` with the panic's message
/// in `pmhash_last_error()`. Shows that a panic is caught, not carried
/// into the caller.
#[no_mangle]
pub extern "C" fn pmhash_debug_panic() -> PmhashStatus {
    guard(|| panic!("pmhash_debug_panic was called"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_constants_are_the_front_crates() {
        assert_eq!(PMHASH_MAX_KEY, pmhash::MAX_KEY);
        assert_eq!(PMHASH_MAX_VALUE, pmhash::MAX_VALUE);
    }

    #[test]
    fn every_status_has_its_own_name_and_code() {
        for code in -10..10 {
            match PmhashStatus::from_code(code) {
                Some(s) => {
                    assert_eq!(s as i32, code);
                    // SAFETY: a static NUL-terminated string.
                    let name = unsafe { CStr::from_ptr(pmhash_status_name(code)) };
                    assert_eq!(name, s.name());
                }
                None => {
                    // SAFETY: a static NUL-terminated string.
                    let name = unsafe { CStr::from_ptr(pmhash_status_name(code)) };
                    assert_eq!(name, c"unknown status");
                }
            }
        }
    }
}
