//! What every entry point does at the boundary: runs its body inside
//! `catch_unwind`, turns an error or a panic into a status code and the
//! thread's last-error message, and checks the pointers and lengths it is
//! given before using them.

use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The result of a call: zero for success, a positive value for an
/// outcome that is not an error (a key that is absent, or already
/// present), a negative value for an error. After an error,
/// `pmhash_last_error()` says what went wrong.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PmhashStatus {
    /// The call did what it was asked.
    Ok = 0,
    /// Not an error: the key is absent (get, update, remove, delete).
    NotFound = 1,
    /// Not an error: the key is already present (insert); nothing changed.
    Exists = 2,
    /// A caller error: a NULL pointer, a path that is not UTF-8, a length
    /// out of range, an unknown engine name, a write to a read-only handle.
    InvalidArgument = -1,
    /// The pool is full (it reached its maximum size); the index or store
    /// is unchanged and still usable.
    OutOfSpace = -2,
    /// The pool file was refused: foreign, truncated or corrupt, locked by
    /// another writer, or an I/O error.
    Pool = -3,
    /// The structure inside the pool is inconsistent.
    Corrupt = -4,
    /// A panic inside the library was caught at the boundary. Close the
    /// handle the call was given: the library promises nothing more about
    /// it.
    Panic = -5,
}

impl PmhashStatus {
    /// The status of a code returned by an earlier call, if it is one.
    pub(crate) fn from_code(code: i32) -> Option<PmhashStatus> {
        use PmhashStatus::*;
        [
            Ok,
            NotFound,
            Exists,
            InvalidArgument,
            OutOfSpace,
            Pool,
            Corrupt,
            Panic,
        ]
        .into_iter()
        .find(|s| *s as i32 == code)
    }

    /// The constant's name, NUL-terminated.
    pub(crate) fn name(self) -> &'static CStr {
        match self {
            PmhashStatus::Ok => c"PMHASH_STATUS_OK",
            PmhashStatus::NotFound => c"PMHASH_STATUS_NOT_FOUND",
            PmhashStatus::Exists => c"PMHASH_STATUS_EXISTS",
            PmhashStatus::InvalidArgument => c"PMHASH_STATUS_INVALID_ARGUMENT",
            PmhashStatus::OutOfSpace => c"PMHASH_STATUS_OUT_OF_SPACE",
            PmhashStatus::Pool => c"PMHASH_STATUS_POOL",
            PmhashStatus::Corrupt => c"PMHASH_STATUS_CORRUPT",
            PmhashStatus::Panic => c"PMHASH_STATUS_PANIC",
        }
    }
}

/// An error on its way out through the boundary: the status and the
/// message that `pmhash_last_error()` will return.
#[derive(Debug)]
pub(crate) struct Failure {
    status: PmhashStatus,
    message: String,
}

/// A caller error with `message`.
pub(crate) fn invalid(message: impl Into<String>) -> Failure {
    Failure {
        status: PmhashStatus::InvalidArgument,
        message: message.into(),
    }
}

impl From<pmhash::Error> for Failure {
    fn from(e: pmhash::Error) -> Failure {
        let status = match &e {
            pmhash::Error::OutOfSpace(_) => PmhashStatus::OutOfSpace,
            pmhash::Error::Pool(_) => PmhashStatus::Pool,
            pmhash::Error::Corrupt(_) => PmhashStatus::Corrupt,
            pmhash::Error::InvalidArgument(_) => PmhashStatus::InvalidArgument,
        };
        Failure {
            status,
            message: e.to_string(),
        }
    }
}

thread_local! {
    /// The message of the last error on this thread.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    // A message never holds a NUL byte in practice; one that did would be
    // cut there by C, so it is replaced instead.
    let text = CString::new(message.replace('\0', "\u{fffd}")).unwrap_or_default();
    LAST_ERROR.with(|last| *last.borrow_mut() = text);
}

/// The thread's last-error message, valid until the thread's next call
/// into the library.
pub(crate) fn last_error() -> *const c_char {
    LAST_ERROR.with(|last| last.borrow().as_ptr())
}

/// Runs an entry point's body: its `Ok` is the status returned, its `Err`
/// and any panic become an error status and the thread's last error.
pub(crate) fn guard(body: impl FnOnce() -> Result<PmhashStatus, Failure>) -> PmhashStatus {
    // `AssertUnwindSafe`: after a caught panic the caller is told to close
    // the handle (`PmhashStatus::Panic`), and the boundary's own state, the
    // last error, is written only after the body has returned or unwound.
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(status)) => status,
        Ok(Err(failure)) => {
            set_last_error(&failure.message);
            failure.status
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic with no message".to_string());
            set_last_error(&format!("panic inside pmhash: {what}"));
            PmhashStatus::Panic
        }
    }
}

/// The value behind a handle or options pointer.
///
/// # Safety
///
/// `ptr` is NULL or points to a live `T` that nothing writes to while the
/// returned reference is used.
pub(crate) unsafe fn deref<'a, T>(ptr: *const T, what: &str) -> Result<&'a T, Failure> {
    // SAFETY: the caller promises that a non-NULL `ptr` points to a live
    // `T` that is not written meanwhile; NULL is `None`.
    unsafe { ptr.as_ref() }.ok_or_else(|| invalid(format!("{what} is NULL")))
}

/// The value behind a mutable options pointer.
///
/// # Safety
///
/// `ptr` is NULL or points to a live `T` that nothing else uses while the
/// returned reference is used.
pub(crate) unsafe fn deref_mut<'a, T>(ptr: *mut T, what: &str) -> Result<&'a mut T, Failure> {
    // SAFETY: the caller promises that a non-NULL `ptr` points to a live
    // `T` used by no one else meanwhile; NULL is `None`.
    unsafe { ptr.as_mut() }.ok_or_else(|| invalid(format!("{what} is NULL")))
}

/// Writes `value` to an out-parameter.
///
/// # Safety
///
/// `out` is NULL or valid for a write of a `T`.
pub(crate) unsafe fn put_out<T>(out: *mut T, value: T, what: &str) -> Result<(), Failure> {
    if out.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    // SAFETY: `out` is not NULL and the caller promises it is valid for a
    // write of a `T`; `write` drops no old value (it may be uninitialized).
    unsafe { out.write(value) };
    Ok(())
}

/// The bytes at `ptr`: NULL with length 0 is the empty slice.
///
/// # Safety
///
/// A non-NULL `ptr` is valid for reads of `len` bytes that nothing writes
/// to while the slice is used.
pub(crate) unsafe fn bytes<'a>(
    ptr: *const u8,
    len: usize,
    what: &str,
) -> Result<&'a [u8], Failure> {
    if ptr.is_null() {
        return if len == 0 {
            Ok(&[])
        } else {
            Err(invalid(format!("{what} is NULL with length {len}")))
        };
    }
    if len > isize::MAX as usize {
        return Err(invalid(format!("{what} length {len} is out of range")));
    }
    // SAFETY: `ptr` is not NULL, `len` fits in an `isize`, and the caller
    // promises `len` readable bytes that stay unchanged while in use.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// A NUL-terminated UTF-8 string argument (a path, an engine name).
///
/// # Safety
///
/// A non-NULL `ptr` points to a NUL-terminated string that nothing writes
/// to while the result is used.
pub(crate) unsafe fn text<'a>(ptr: *const c_char, what: &str) -> Result<&'a str, Failure> {
    if ptr.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    // SAFETY: `ptr` is not NULL and the caller promises a NUL-terminated
    // string that stays unchanged while in use.
    let raw = unsafe { CStr::from_ptr(ptr) };
    let s = raw.to_str().map_err(|e| {
        invalid(format!(
            "{what} is not valid UTF-8 (bad byte at offset {})",
            e.valid_up_to()
        ))
    })?;
    if s.is_empty() {
        return Err(invalid(format!("{what} is empty")));
    }
    Ok(s)
}
