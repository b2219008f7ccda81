//! Errors of the pool layer. Every bad input ends here, never in a panic.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// Why a pool operation failed.
#[derive(Debug)]
pub enum Error {
    /// An operating-system call failed.
    Io {
        /// What was being done.
        what: String,
        /// The file it was done to, if any.
        path: Option<PathBuf>,
        /// The operating system's error.
        source: io::Error,
    },
    /// The file does not start with the pmhash magic: not a pool.
    Foreign(String),
    /// The file is a pmhash pool of another format version.
    Version {
        /// The version in the file.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },
    /// The pool was made for another engine than the one opening it.
    WrongLayout {
        /// The layout id in the file.
        found: String,
        /// The layout id the opener asked for.
        expected: String,
    },
    /// The file is shorter than the header says (or than a header).
    Truncated(String),
    /// Checksums or invariants do not hold.
    Corrupt(String),
    /// The pool (and its growth limit) has no room for the request.
    OutOfSpace(String),
    /// The caller asked for something invalid (bad size, bad mode name).
    InvalidArgument(String),
    /// `dax` was requested, the kernel refused MAP_SYNC, and fallback to
    /// `mapped` was not allowed.
    DaxUnavailable(String),
    /// Another writable open (this process or another) holds the pool file.
    Locked(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { what, path: Some(p), source } => write!(f, "{what} {}: {source}", p.display()),
            Error::Io { what, path: None, source } => write!(f, "{what}: {source}"),
            Error::Foreign(m) => write!(f, "not a pmhash pool: {m}"),
            Error::Version { found, supported } => write!(
                f,
                "pool format version {found} is not supported (this build reads version {supported})"
            ),
            Error::WrongLayout { found, expected } => {
                write!(f, "pool holds layout {found:?}, expected {expected:?}")
            }
            Error::Truncated(m) => write!(f, "pool file is truncated: {m}"),
            Error::Corrupt(m) => write!(f, "pool is corrupt: {m}"),
            Error::OutOfSpace(m) => write!(f, "out of space: {m}"),
            Error::InvalidArgument(m) => write!(f, "invalid argument: {m}"),
            Error::DaxUnavailable(m) => write!(f, "dax mode unavailable: {m}"),
            Error::Locked(m) => write!(f, "pool is in use: {m}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl Error {
    pub(crate) fn io(what: &str, path: Option<&std::path::Path>, source: io::Error) -> Error {
        Error::Io {
            what: what.to_string(),
            path: path.map(|p| p.to_path_buf()),
            source,
        }
    }
}

/// A result whose error is the pool's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
