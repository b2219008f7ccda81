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

/// Reserves disk (or tmpfs) space for `[offset, offset+len)` of `file`
/// with `posix_fallocate`, extending the file if the range passes its end.
/// A page of a shared mapping that the file system cannot back raises
/// SIGBUS when touched; reserving first turns a full file system into an
/// error here instead.
pub(crate) fn reserve_file_space(file: &File, offset: u64, len: u64) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    let (Ok(off), Ok(n)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return Err(io::Error::from_raw_os_error(libc::EFBIG));
    };
    // SAFETY: posix_fallocate reads no memory of ours; the fd is open for
    // the lifetime of `file`.
    let r = unsafe { libc::posix_fallocate(file.as_raw_fd(), off, n) };
    if r != 0 {
        // posix_fallocate returns the error number instead of setting errno.
        return Err(io::Error::from_raw_os_error(r));
    }
    Ok(())
}

/// Deallocates the blocks of `[offset, offset+len)` of `file`
/// (`fallocate` with `FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`): the
/// range reads as zeros afterwards, and every mapping of its pages is
/// dropped. The caller reserves the range again before anything touches it.
pub(crate) fn punch_hole(file: &File, offset: u64, len: u64) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    let (Ok(off), Ok(n)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return Err(io::Error::from_raw_os_error(libc::EFBIG));
    };
    // SAFETY: fallocate reads no memory of ours; the fd is open for the
    // lifetime of `file`.
    let r = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off,
            n,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether the error says the file system (or a quota) has no room.
pub(crate) fn is_no_space(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EFBIG)
    )
}

/// What `try_lock` found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LockResult {
    Taken,
    HeldElsewhere,
}

/// A non-blocking `flock` on `file`: exclusive for writers, shared for a
/// reader that only asks whether a writer holds the file. The lock belongs
/// to the open file description, so a second `open` of the same file in the
/// same process conflicts like another process does, and the kernel drops
/// it when the last descriptor closes (a killed process included).
pub(crate) fn try_lock(file: &File, exclusive: bool) -> io::Result<LockResult> {
    let op = if exclusive {
        libc::LOCK_EX
    } else {
        libc::LOCK_SH
    } | libc::LOCK_NB;
    loop {
        // SAFETY: flock takes a descriptor and flags; no memory is passed.
        let r = unsafe { libc::flock(file.as_raw_fd(), op) };
        if r == 0 {
            return Ok(LockResult::Taken);
        }
        let e = last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) => return Ok(LockResult::HeldElsewhere),
            _ => return Err(e),
        }
    }
}

/// Releases a lock taken with [`try_lock`].
pub(crate) fn unlock(file: &File) {
    // SAFETY: flock takes a descriptor and flags; no memory is passed.
    unsafe {
        libc::flock(file.as_raw_fd(), libc::LOCK_UN);
    }
}
