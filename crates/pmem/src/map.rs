//! The mapping core: a fixed virtual-address reservation into which the pool
//! file (or anonymous memory) is mapped piece by piece. Growing maps more of
//! the file right after what is mapped, so the base address never moves and
//! references handed out earlier stay valid.
//!
//! This file and `persist.rs` hold the pool layer's `unsafe`.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// How pool memory is backed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backing {
    /// `MAP_SHARED` file mapping: stores reach the file.
    Shared,
    /// `MAP_SHARED_VALIDATE | MAP_SYNC`: the file is on DAX and flushed
    /// stores are durable without msync.
    Sync,
    /// `MAP_PRIVATE` file mapping: copy-on-write, the file is never written
    /// (read-only opens: `check`, `inspect`).
    Private,
    /// Anonymous memory (volatile and simulated modes).
    Anonymous,
}

/// A reserved address range with its first `mapped` bytes usable.
pub(crate) struct Mapping {
    base: *mut u8,
    reserved: usize,
    backing: Backing,
}

// SAFETY: the mapping is plain memory shared by all threads; synchronisation
// of its contents is the business of the code that reads and writes it.
unsafe impl Send for Mapping {}
// SAFETY: as above; `Mapping` itself has no interior state that changes.
unsafe impl Sync for Mapping {}

fn last_os_error() -> io::Error {
    io::Error::last_os_error()
}

impl Mapping {
    /// Reserves `reserved` bytes of address space (no memory, no commit
    /// charge) to hold a pool that may grow up to that size.
    pub(crate) fn reserve(reserved: usize, backing: Backing) -> io::Result<Mapping> {
        // SAFETY: a fresh PROT_NONE anonymous mapping at an address of the
        // kernel's choosing touches no existing memory.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserved,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(last_os_error());
        }
        Ok(Mapping {
            base: p as *mut u8,
            reserved,
            backing,
        })
    }

    pub(crate) fn base(&self) -> *mut u8 {
        self.base
    }

    /// Maps `[offset, offset+len)` of the pool (of `file` for file backings)
    /// at the same offset of the reservation. `offset` and `len` are
    /// multiples of the page size and inside the reservation.
    pub(crate) fn map(&self, file: Option<&File>, offset: usize, len: usize) -> io::Result<()> {
        if !offset.is_multiple_of(4096) || !len.is_multiple_of(4096) || offset + len > self.reserved
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "map [{offset}, +{len}) outside a {}-byte reservation",
                    self.reserved
                ),
            ));
        }
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        let (flags, fd) = match (self.backing, file) {
            (Backing::Shared, Some(f)) => (libc::MAP_SHARED, f.as_raw_fd()),
            (Backing::Sync, Some(f)) => (libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC, f.as_raw_fd()),
            (Backing::Private, Some(f)) => (libc::MAP_PRIVATE, f.as_raw_fd()),
            (Backing::Anonymous, _) => (
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
            ),
            (_, None) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "file backing without a file",
                ))
            }
        };
        // SAFETY: the target range lies inside our own reservation (checked
        // above), so MAP_FIXED replaces only pages this Mapping owns.
        let p = unsafe {
            libc::mmap(
                self.base.add(offset) as *mut libc::c_void,
                len,
                prot,
                flags | libc::MAP_FIXED,
                fd,
                offset as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(last_os_error());
        }
        Ok(())
    }

    /// `msync(MS_SYNC)` over `[0, len)`: writes dirty page-cache pages of a
    /// shared file mapping to the file.
    pub(crate) fn msync(&self, len: usize) -> io::Result<()> {
        if !matches!(self.backing, Backing::Shared | Backing::Sync) || len == 0 {
            return Ok(());
        }
        // SAFETY: `[base, base+len)` is mapped (len never exceeds what was mapped).
        let r = unsafe { libc::msync(self.base as *mut libc::c_void, len, libc::MS_SYNC) };
        if r != 0 {
            return Err(last_os_error());
        }
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping our whole reservation; no reference into it
        // outlives the Pool that owns this Mapping.
        unsafe {
            libc::munmap(self.base as *mut libc::c_void, self.reserved);
        }
    }
}
