//! The pool: one file (or anonymous memory) mapped at a stable address,
//! addressed by offsets, with mode-aware persist primitives.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;

use crate::alloc::{self, Heap};
use crate::error::{Error, Result};
use crate::header::{self, Identity, State, HEADER_LEN, SLOT_LEN, SLOT_OFFSET};
use crate::map::{self as osmap, Backing, LockResult, Mapping};
use crate::persist::{self, CACHE_LINE};
use crate::sim::{CrashChoice, CrashSite, FenceHook, Sim};

/// How stores become durable (ARCHITECTURE.md, "Persistence modes").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// DAX file mapped with MAP_SYNC: flush + fence make data durable
    /// against power loss.
    Dax,
    /// Ordinary file mapping (page cache): flush + fence order stores;
    /// durable against a process crash at once, against power loss after
    /// [`Pool::sync`].
    Mapped,
    /// Anonymous memory, no flushes, no fences: durable against nothing.
    Volatile,
    /// Anonymous memory plus the crash simulator: flushes and fences are
    /// recorded, crash images can be taken.
    Simulated,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Dax => "dax",
            Mode::Mapped => "mapped",
            Mode::Volatile => "volatile",
            Mode::Simulated => "simulated",
        }
    }

    pub fn parse(s: &str) -> Result<Mode> {
        match s {
            "dax" => Ok(Mode::Dax),
            "mapped" => Ok(Mode::Mapped),
            "volatile" => Ok(Mode::Volatile),
            "simulated" => Ok(Mode::Simulated),
            _ => Err(Error::InvalidArgument(format!(
                "unknown mode {s:?} (expected dax, mapped, volatile or simulated)"
            ))),
        }
    }

    fn uses_file(self) -> bool {
        matches!(self, Mode::Dax | Mode::Mapped)
    }
}

/// Options for [`Pool::create`] and [`Pool::open`].
#[derive(Clone, Debug)]
pub struct PoolOptions {
    pub mode: Mode,
    /// Size at create, in bytes (rounded up to the 256 KiB chunk).
    pub size: u64,
    /// The pool may grow up to this size; 0 means "no growth".
    pub max_size: u64,
    /// Layout id (engine name) written at create and required at open; an
    /// empty string at open accepts any layout.
    pub layout: String,
    /// In `dax` mode, fall back to `mapped` when the kernel refuses MAP_SYNC.
    pub allow_dax_fallback: bool,
    /// Open without ever writing the file: a private copy-on-write mapping.
    /// Recovery still runs, in memory only.
    pub read_only: bool,
    /// The uuid to write at create; `None` draws a random one. Fixed uuids
    /// make simulated runs reproducible (engines may seed hashes from it).
    pub uuid: Option<[u8; 16]>,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            mode: Mode::Mapped,
            size: 64 << 20,
            max_size: 0,
            layout: String::new(),
            allow_dax_fallback: false,
            read_only: false,
            uuid: None,
        }
    }
}

/// Allocation and recovery figures of a pool, for `inspect` and leak checks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    pub size: u64,
    /// Bytes in allocated blocks (usable sizes).
    pub bytes_in_use: u64,
    /// Allocated blocks.
    pub blocks_in_use: u64,
    /// Chunks not used by any run or extent.
    pub free_chunks: u64,
    /// Reservations and frees that recovery completed or rolled back at open.
    pub recovered_lanes: u64,
}

struct HeaderState {
    cur: State,
    slot: usize,
}

/// A mapped pool. Everything inside is addressed by byte offsets from the
/// pool start; the base address is stable for the pool's lifetime.
pub struct Pool {
    map: Mapping,
    file: Option<File>,
    path: Option<PathBuf>,
    mode: Mode,
    dax_fallback: Option<String>,
    read_only: bool,
    writer_active: bool,
    size: AtomicU64,
    max_size: u64,
    identity: Identity,
    state: Mutex<HeaderState>,
    root: AtomicU64,
    aux: AtomicU64,
    was_clean: bool,
    /// Opened by [`open_locked_checked`](Pool::open_locked_checked).
    prechecked: bool,
    sim: Option<Mutex<Sim>>,
    pub(crate) heap: Heap,
    grow_lock: Mutex<()>,
}

/// Smallest pool: the metadata chunk plus one heap chunk.
pub const MIN_POOL_SIZE: u64 = 2 * alloc::CHUNK;

fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
}

fn random_uuid() -> [u8; 16] {
    let mut u = [0u8; 16];
    // SAFETY: getrandom writes at most 16 bytes into our 16-byte buffer.
    let n = unsafe { libc::getrandom(u.as_mut_ptr() as *mut libc::c_void, 16, 0) };
    if n != 16 {
        // Fall back to time and pid: a uuid need only be unlikely to repeat.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        u.copy_from_slice(&(t ^ ((std::process::id() as u128) << 64)).to_le_bytes());
    }
    u[6] = (u[6] & 0x0f) | 0x40; // version 4
    u[8] = (u[8] & 0x3f) | 0x80; // RFC 4122 variant
    u
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Address space to reserve for a pool that may grow to `max`.
fn reservation(size: u64, max: u64) -> Result<usize> {
    let r = round_up(max.max(size), 1 << 21);
    usize::try_from(r)
        .map_err(|_| Error::InvalidArgument(format!("pool size {r} exceeds the address space")))
}

/// Takes the exclusive writer's lock on `file`, or says who holds it.
fn lock_exclusive(file: &File, path: &Path) -> Result<()> {
    match osmap::try_lock(file, true) {
        Ok(LockResult::Taken) => Ok(()),
        Ok(LockResult::HeldElsewhere) => Err(Error::Locked(format!(
            "{} is open for writing elsewhere (another process, or another open in this one); \
             a pool has one writer at a time",
            path.display()
        ))),
        Err(e) => Err(Error::io("cannot lock pool file", Some(path), e)),
    }
}

/// `posix_fallocate` of `[off, off+len)`; a full file system is
/// `OutOfSpace` naming the file and the sizes.
fn reserve_space(file: &File, path: &Path, off: u64, len: u64, why: &str) -> Result<()> {
    osmap::reserve_file_space(file, off, len).map_err(|e| {
        if osmap::is_no_space(&e) {
            Error::OutOfSpace(format!(
                "the file system has no room to {why} pool file {}: reserving {len} bytes at \
                 offset {off} (to {} bytes) failed: {e}",
                path.display(),
                off + len
            ))
        } else {
            Error::io("cannot reserve space for pool file", Some(path), e)
        }
    })
}

/// Whether fewer than `size` bytes of `file` are backed by blocks (a
/// sparse file).
fn has_holes(file: &File, path: &Path, size: u64) -> Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let md = file
        .metadata()
        .map_err(|e| Error::io("cannot stat pool file", Some(path), e))?;
    Ok(md.blocks().saturating_mul(512) < size)
}

/// The exclusive lock of a pool file, held from [`PoolLock::exclusive`]
/// until dropped or handed to [`Pool::open_locked`]. It is a `flock` on
/// the open file: the kernel releases it when the holder exits or is
/// killed.
pub struct PoolLock {
    file: File,
    path: PathBuf,
}

impl PoolLock {
    /// Opens `path` for reading and writing and takes the lock, or fails at
    /// once with `Err(Locked)` when another open holds it. Writes nothing.
    pub fn exclusive(path: &Path) -> Result<PoolLock> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| Error::io("cannot open pool file", Some(path), e))?;
        lock_exclusive(&file, path)?;
        Ok(PoolLock {
            file,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Pool {
    /// Creates a new pool. File modes refuse to overwrite an existing file.
    /// `volatile` and `simulated` pools live in memory and ignore `path`.
    pub fn create(path: &Path, opts: &PoolOptions) -> Result<Pool> {
        if opts.read_only {
            return Err(Error::InvalidArgument(
                "cannot create a pool read-only".into(),
            ));
        }
        let size = round_up(opts.size.max(MIN_POOL_SIZE), alloc::CHUNK);
        let max_size = if opts.max_size == 0 {
            size
        } else {
            round_up(opts.max_size, alloc::CHUNK)
        };
        if max_size < size {
            return Err(Error::InvalidArgument(format!(
                "max size {max_size} is below the size {size}"
            )));
        }
        let identity = Identity {
            version: header::FORMAT_VERSION,
            layout: opts.layout.clone(),
            uuid: opts.uuid.unwrap_or_else(random_uuid),
            created_unix_ns: now_ns(),
            chunk_size: alloc::CHUNK as u32,
        };
        let id_bytes = identity.encode()?;
        let reserve = reservation(size, max_size)?;
        let (map, file, mode, fallback) = if opts.mode.uses_file() {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(path)
                .map_err(|e| Error::io("cannot create pool file", Some(path), e))?;
            let made = (|| {
                lock_exclusive(&file, path)?;
                file.set_len(size)
                    .map_err(|e| Error::io("cannot size pool file", Some(path), e))?;
                // Every page is backed before the first is touched, so a
                // full file system is an error here, not a SIGBUS later.
                reserve_space(&file, path, 0, size, "create")?;
                Self::map_file(&file, path, opts, size, reserve)
            })();
            match made {
                Ok((map, mode, fb)) => (map, Some(file), mode, fb),
                Err(e) => {
                    drop(file);
                    let _ = std::fs::remove_file(path);
                    return Err(e);
                }
            }
        } else {
            let map = Mapping::reserve(reserve, Backing::Anonymous)
                .map_err(|e| Error::io("cannot reserve address space", None, e))?;
            map.map(None, 0, size as usize)
                .map_err(|e| Error::io("cannot map memory", None, e))?;
            (map, None, opts.mode, None)
        };
        let sim = (mode == Mode::Simulated).then(|| Mutex::new(Sim::new(vec![0u8; size as usize])));
        let state = State {
            seq: 1,
            size,
            root: 0,
            clean: 0,
            opens: 1,
            aux: 0,
        };
        let pool = Pool {
            map,
            file,
            path: opts.mode.uses_file().then(|| path.to_path_buf()),
            mode,
            dax_fallback: fallback,
            read_only: false,
            writer_active: false,
            size: AtomicU64::new(size),
            max_size,
            identity,
            state: Mutex::new(HeaderState {
                cur: state,
                slot: 0,
            }),
            root: AtomicU64::new(0),
            aux: AtomicU64::new(0),
            was_clean: false,
            prechecked: false,
            sim,
            heap: Heap::empty(),
            grow_lock: Mutex::new(()),
        };
        // persist: state slot and identity in one fence; the file was
        // zero-filled, so the heap (all chunks free) and lanes need no writes.
        pool.write(SLOT_OFFSET as u64, &state.encode());
        pool.write(0, &id_bytes);
        pool.persist(0, SLOT_OFFSET + SLOT_LEN);
        pool.heap.rebuild(&pool)?;
        pool.heap.mark_all_fresh();
        pool.sync()?;
        Ok(pool)
    }

    fn map_file(
        file: &File,
        path: &Path,
        opts: &PoolOptions,
        size: u64,
        reserve: usize,
    ) -> Result<(Mapping, Mode, Option<String>)> {
        let map_with = |backing| -> std::io::Result<Mapping> {
            let m = Mapping::reserve(reserve, backing)?;
            m.map(Some(file), 0, size as usize)?;
            Ok(m)
        };
        if opts.read_only {
            let m = map_with(Backing::Private)
                .map_err(|e| Error::io("cannot map pool file", Some(path), e))?;
            return Ok((m, opts.mode, None));
        }
        match opts.mode {
            Mode::Dax => match map_with(Backing::Sync) {
                Ok(m) => Ok((m, Mode::Dax, None)),
                Err(e) => {
                    let why = format!(
                        "the kernel refused MAP_SYNC for {} ({e}); the file is not on a DAX file system",
                        path.display()
                    );
                    if !opts.allow_dax_fallback {
                        return Err(Error::DaxUnavailable(format!(
                            "{why}; allow the fallback to mapped mode to use it anyway"
                        )));
                    }
                    let m = map_with(Backing::Shared)
                        .map_err(|e| Error::io("cannot map pool file", Some(path), e))?;
                    Ok((m, Mode::Mapped, Some(why)))
                }
            },
            _ => {
                let m = map_with(Backing::Shared)
                    .map_err(|e| Error::io("cannot map pool file", Some(path), e))?;
                Ok((m, opts.mode, None))
            }
        }
    }

    /// Opens an existing pool and runs allocator recovery. The file is
    /// validated before anything is written: a corrupt, truncated, foreign,
    /// wrong-version or wrong-layout file gives `Err` and stays untouched.
    /// In `volatile` and `simulated` mode the file is read into memory and
    /// never written.
    ///
    /// A writable file open first takes an exclusive lock on the file
    /// ([`PoolLock`]): a second writable open, from this process or another,
    /// is `Err(Locked)`. A read-only open takes no lock; it tells whether a
    /// writer holds the file ([`writer_active`](Self::writer_active)).
    pub fn open(path: &Path, opts: &PoolOptions) -> Result<Pool> {
        if !opts.read_only && opts.mode.uses_file() {
            return Self::open_locked(PoolLock::exclusive(path)?, opts);
        }
        let file = OpenOptions::new()
            .read(true)
            .open(path)
            .map_err(|e| Error::io("cannot open pool file", Some(path), e))?;
        // A shared lock is refused while a writer holds the exclusive one;
        // it is dropped at once so that this reader never blocks a writer.
        let writer_active = match osmap::try_lock(&file, false) {
            Ok(LockResult::Taken) => {
                osmap::unlock(&file);
                false
            }
            Ok(LockResult::HeldElsewhere) => true,
            Err(e) => {
                return Err(Error::io(
                    "cannot test the lock of pool file",
                    Some(path),
                    e,
                ))
            }
        };
        Self::open_file(file, path, opts, writer_active)
    }

    /// [`open`](Self::open) with the exclusive lock already held (taken by
    /// the caller to validate the pool read-only first, with no writer
    /// able to come in between). The lock's file becomes the pool's.
    pub fn open_locked(lock: PoolLock, opts: &PoolOptions) -> Result<Pool> {
        let PoolLock { file, path } = lock;
        Self::open_file(file, &path, opts, false)
    }

    /// [`open_locked`](Self::open_locked) for a caller that has already
    /// opened this file read-only under the same lock and run the same
    /// engine (or store) open on it, with success: every check of the
    /// bytes passed, and no writer can have changed them since (the lock
    /// has been held throughout). [`prechecked`](Self::prechecked) tells
    /// the engine's open so; a clean open may then skip the walks that
    /// only check (the clean-shutdown cross-checks) instead of reading the
    /// whole table a second time.
    pub fn open_locked_checked(lock: PoolLock, opts: &PoolOptions) -> Result<Pool> {
        let mut pool = Self::open_locked(lock, opts)?;
        pool.prechecked = true;
        Ok(pool)
    }

    fn open_file(file: File, path: &Path, opts: &PoolOptions, writer_active: bool) -> Result<Pool> {
        let writable = !opts.read_only && opts.mode.uses_file();
        let len = file
            .metadata()
            .map_err(|e| Error::io("cannot stat pool file", Some(path), e))?
            .len();
        let mut hdr = vec![0u8; (len as usize).min(HEADER_LEN)];
        file.read_exact_at(&mut hdr, 0)
            .map_err(|e| Error::io("cannot read pool header", Some(path), e))?;
        let (identity, state, slot) = header::validate(&hdr, len, MIN_POOL_SIZE)?;
        Self::check_identity(&identity, opts)?;
        let size = state.size;
        let max_size = if opts.max_size == 0 {
            size
        } else {
            round_up(opts.max_size, alloc::CHUNK).max(size)
        };
        let reserve = reservation(size, max_size)?;
        let holes = has_holes(&file, path, size)?;
        if writable && holes {
            // A pool made sparse (by a copy, or an older build) is backed
            // now, before a store to a hole could raise SIGBUS. This
            // allocates blocks and changes no byte of the file.
            reserve_space(&file, path, 0, size, "back the holes of")?;
        }
        // A read-only open of a sparse file reads it into memory: on tmpfs
        // even a read fault on a hole takes a page, and on a full file
        // system that fault is a SIGBUS; read(2) of a hole takes none.
        let copy_in = opts.read_only && holes && opts.mode.uses_file();
        let (map, file, mode, fallback) = if copy_in {
            let map = Mapping::reserve(reserve, Backing::Anonymous)
                .map_err(|e| Error::io("cannot reserve address space", None, e))?;
            map.map(None, 0, size as usize)
                .map_err(|e| Error::io("cannot map memory", None, e))?;
            (map, Some(file), opts.mode, None)
        } else if opts.mode.uses_file() {
            let (map, mode, fb) = Self::map_file(&file, path, opts, size, reserve)?;
            (map, Some(file), mode, fb)
        } else {
            let mut img = vec![0u8; size as usize];
            file.read_exact_at(&mut img, 0)
                .map_err(|e| Error::io("cannot read pool file", Some(path), e))?;
            return Self::from_image_with(img, opts.mode, max_size, &opts.layout, None);
        };
        let pool = Pool {
            map,
            file,
            path: Some(path.to_path_buf()),
            mode,
            dax_fallback: fallback,
            read_only: opts.read_only,
            writer_active,
            size: AtomicU64::new(size),
            max_size: if opts.read_only { size } else { max_size },
            identity,
            state: Mutex::new(HeaderState { cur: state, slot }),
            root: AtomicU64::new(state.root),
            aux: AtomicU64::new(state.aux),
            was_clean: state.clean == 1,
            prechecked: false,
            sim: None,
            heap: Heap::empty(),
            grow_lock: Mutex::new(()),
        };
        if copy_in {
            let f = pool.file.as_ref().expect("file-backed");
            let mut buf = vec![0u8; 1 << 20];
            let mut off = 0u64;
            while off < size {
                let n = buf.len().min((size - off) as usize);
                f.read_exact_at(&mut buf[..n], off)
                    .map_err(|e| Error::io("cannot read pool file", Some(path), e))?;
                pool.write(off, &buf[..n]);
                off += n as u64;
            }
        }
        pool.finish_open()?;
        Ok(pool)
    }

    fn check_identity(identity: &Identity, opts: &PoolOptions) -> Result<()> {
        if !opts.layout.is_empty() && identity.layout != opts.layout {
            return Err(Error::WrongLayout {
                found: identity.layout.clone(),
                expected: opts.layout.clone(),
            });
        }
        if identity.chunk_size as u64 != alloc::CHUNK {
            return Err(Error::Corrupt(format!(
                "chunk size {} differs from this build's {}",
                identity.chunk_size,
                alloc::CHUNK
            )));
        }
        Ok(())
    }

    /// Makes an in-memory pool (`simulated` or `volatile`) from a pool image,
    /// such as a crash image. The image is validated like a file.
    pub fn from_image(image: Vec<u8>, mode: Mode) -> Result<Pool> {
        let size = image.len() as u64;
        Self::from_image_with(image, mode, size, "", None)
    }

    /// [`from_image`](Self::from_image) in simulated mode with a fence hook
    /// installed before recovery starts, so that crash states can be taken
    /// during the pool's own recovery (and the engine's, if it runs on this
    /// pool next). The hook stays installed.
    pub fn from_image_hooked(image: Vec<u8>, hook: FenceHook) -> Result<Pool> {
        let size = image.len() as u64;
        Self::from_image_with(image, Mode::Simulated, size, "", Some(hook))
    }

    fn from_image_with(
        image: Vec<u8>,
        mode: Mode,
        max_size: u64,
        layout: &str,
        hook: Option<FenceHook>,
    ) -> Result<Pool> {
        if mode.uses_file() {
            return Err(Error::InvalidArgument(format!(
                "an image opens in volatile or simulated mode, not {}",
                mode.name()
            )));
        }
        let (identity, state, slot) = header::validate(&image, image.len() as u64, MIN_POOL_SIZE)?;
        let opts = PoolOptions {
            layout: layout.to_string(),
            ..PoolOptions::default()
        };
        Self::check_identity(&identity, &opts)?;
        let size = state.size;
        let max_size = max_size.max(size);
        let map = Mapping::reserve(reservation(size, max_size)?, Backing::Anonymous)
            .map_err(|e| Error::io("cannot reserve address space", None, e))?;
        map.map(None, 0, size as usize)
            .map_err(|e| Error::io("cannot map memory", None, e))?;
        let mut persisted = image;
        persisted.truncate(size as usize);
        let pool = Pool {
            map,
            file: None,
            path: None,
            mode,
            dax_fallback: None,
            read_only: false,
            writer_active: false,
            size: AtomicU64::new(size),
            max_size,
            identity,
            state: Mutex::new(HeaderState { cur: state, slot }),
            root: AtomicU64::new(state.root),
            aux: AtomicU64::new(state.aux),
            was_clean: state.clean == 1,
            prechecked: false,
            sim: None,
            heap: Heap::empty(),
            grow_lock: Mutex::new(()),
        };
        pool.write(0, &persisted);
        let pool = Pool {
            sim: (mode == Mode::Simulated).then(|| Mutex::new(Sim::new(persisted))),
            ..pool
        };
        if let Some(h) = hook {
            pool.set_fence_hook(Some(h))?;
        }
        pool.finish_open()?;
        Ok(pool)
    }

    /// Allocator recovery (validate first, then repair), then mark the pool
    /// open (not clean) in the header.
    fn finish_open(&self) -> Result<()> {
        self.heap.recover(self)?;
        // persist: the clean flag is cleared before any engine write, so a
        // crash from here on is seen as a crash at the next open.
        self.update_state(|s| {
            s.clean = 0;
            s.opens += 1;
        })
    }

    /// The mode in force (`mapped` after a permitted dax fallback).
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Why `dax` fell back to `mapped`, if it did.
    pub fn dax_fallback(&self) -> Option<&str> {
        self.dax_fallback.as_deref()
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Whether a writable open held the file's lock when this read-only
    /// open looked (always `false` for a writable pool, which holds it).
    /// What such a reader sees may be mid-update.
    pub fn writer_active(&self) -> bool {
        self.writer_active
    }

    /// Current size in bytes.
    pub fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    /// Largest size growth may reach.
    pub fn max_size(&self) -> u64 {
        self.max_size
    }

    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// The layout id (engine name) recorded at create.
    pub fn layout(&self) -> &str {
        &self.identity.layout
    }

    /// The header state in force (sequence, size, root, clean flag, opens).
    pub fn header_state(&self) -> State {
        self.state.lock().expect("header lock").cur
    }

    /// Whether the pool was closed cleanly before this open. Engines use it
    /// to skip crash recovery.
    pub fn was_clean(&self) -> bool {
        self.was_clean
    }

    /// Whether this open's checks already ran, and passed, on a read-only
    /// open of the same bytes under the lock this pool holds
    /// ([`open_locked_checked`](Self::open_locked_checked)). An engine's
    /// clean open may skip a walk that only checks; it must still do every
    /// walk that builds DRAM state or writes.
    pub fn prechecked(&self) -> bool {
        self.prechecked
    }

    /// Offset of the engine's root block (0 before the engine set one).
    pub fn root(&self) -> u64 {
        self.root.load(Ordering::Acquire)
    }

    /// Makes `off` the root, durably and atomically (a header state-slot
    /// write). This is also the link step for a block reserved with
    /// [`crate::Link::Root`].
    pub fn set_root(&self, off: u64) -> Result<()> {
        if off != 0 {
            // Refuse what open's header validation would refuse.
            if off < alloc::CHUNK || !off.is_multiple_of(8) {
                return Err(Error::InvalidArgument(format!(
                    "root offset {off:#x} must be 8-aligned and inside the heap"
                )));
            }
            self.check_range(off, 8)?;
        }
        self.update_state(|s| s.root = off)?;
        self.root.store(off, Ordering::Release);
        Ok(())
    }

    /// Offset of the auxiliary root block (0 if none): a second structure
    /// that shares the pool with the engine at [`root`](Self::root).
    pub fn aux_root(&self) -> u64 {
        self.aux.load(Ordering::Acquire)
    }

    /// Makes `off` the auxiliary root, durably and atomically, as
    /// [`set_root`](Self::set_root) does for the root; the link step for a
    /// block reserved with [`crate::Link::AuxRootPointer`].
    pub fn set_aux_root(&self, off: u64) -> Result<()> {
        if off != 0 {
            if off < alloc::CHUNK || !off.is_multiple_of(8) {
                return Err(Error::InvalidArgument(format!(
                    "aux root offset {off:#x} must be 8-aligned and inside the heap"
                )));
            }
            self.check_range(off, 8)?;
        }
        self.update_state(|s| s.aux = off)?;
        self.aux.store(off, Ordering::Release);
        Ok(())
    }

    fn update_state(&self, f: impl FnOnce(&mut State)) -> Result<()> {
        let mut g = self.state.lock().expect("header lock");
        let mut next = g.cur;
        f(&mut next);
        next.seq = g.cur.seq + 1;
        let slot = 1 - g.slot;
        let off = SLOT_OFFSET + slot * SLOT_LEN;
        self.write(off as u64, &next.encode());
        // persist: the whole new slot before it counts; until the fence the
        // old slot (lower sequence, valid CRC) stays in force, and a torn new
        // slot fails its CRC.
        self.persist(off as u64, SLOT_LEN);
        g.cur = next;
        g.slot = slot;
        Ok(())
    }

    /// Clean shutdown: syncs and sets the clean flag. The pool stays usable;
    /// a later write clears nothing, so call this last.
    pub fn close(&self) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        self.sync()?;
        // persist: data (synced above) before the clean flag, because the
        // flag lets the next open skip recovery.
        self.update_state(|s| s.clean = 1)?;
        self.sync()
    }

    /// Makes everything flushed so far durable for the mode: a fence, plus
    /// msync of the file in `mapped` mode (durable against power loss).
    pub fn sync(&self) -> Result<()> {
        self.fence();
        if self.mode == Mode::Mapped && !self.read_only {
            self.map
                .msync(self.size() as usize)
                .map_err(|e| Error::io("msync failed on", self.path.as_deref(), e))?;
        }
        Ok(())
    }

    // ----- bounds-checked access -------------------------------------------------

    /// `Err(Corrupt)` unless `[off, off+len)` lies inside the pool. For
    /// offsets read from the pool itself (recovery, `check`).
    pub fn check_range(&self, off: u64, len: u64) -> Result<()> {
        match off.checked_add(len) {
            Some(end) if end <= self.size() => Ok(()),
            _ => Err(Error::Corrupt(format!(
                "range {off:#x}+{len} lies outside the {}-byte pool",
                self.size()
            ))),
        }
    }

    #[inline]
    #[track_caller]
    fn bounds(&self, off: u64, len: usize) {
        let end = off.checked_add(len as u64);
        assert!(
            matches!(end, Some(e) if e <= self.size()),
            "pool access {off:#x}+{len} outside the {}-byte pool (an engine bug: offsets read from PM must be checked with check_range)",
            self.size()
        );
    }

    /// The 8-byte word at `off` (8-byte aligned), for failure-atomic stores
    /// and lock-free reads. Panics on a misaligned or out-of-pool offset.
    #[inline]
    #[track_caller]
    pub fn atomic_u64(&self, off: u64) -> &AtomicU64 {
        self.bounds(off, 8);
        assert!(
            off.is_multiple_of(8),
            "atomic_u64 at unaligned offset {off:#x}"
        );
        // SAFETY: in bounds (checked), aligned (checked), the mapping lives
        // as long as &self, and AtomicU64 tolerates concurrent access.
        unsafe { &*(self.map.base().add(off as usize) as *const AtomicU64) }
    }

    /// `n` consecutive 8-byte words from `off` (8-byte aligned) with one
    /// bounds check: a cache line or a bucket read by a hot path.
    #[inline]
    #[track_caller]
    pub fn words(&self, off: u64, n: usize) -> &[AtomicU64] {
        self.bounds(off, n * 8);
        assert!(off.is_multiple_of(8), "words at unaligned offset {off:#x}");
        // SAFETY: `n` words in bounds (checked) and aligned (checked); the
        // mapping lives as long as &self; atomics tolerate concurrent access.
        unsafe {
            std::slice::from_raw_parts(self.map.base().add(off as usize) as *const AtomicU64, n)
        }
    }

    /// [`words`](Self::words) for an offset that may be stale or torn (a
    /// reader's unvalidated snapshot): `None` instead of a panic when the
    /// range is outside the pool or misaligned.
    #[inline]
    pub fn try_words(&self, off: u64, n: usize) -> Option<&[AtomicU64]> {
        let end = off.checked_add(n as u64 * 8)?;
        if end > self.size() || !off.is_multiple_of(8) {
            return None;
        }
        // SAFETY: `n` words in bounds and aligned (both checked above); the
        // mapping lives as long as &self; atomics tolerate concurrent access.
        Some(unsafe {
            std::slice::from_raw_parts(self.map.base().add(off as usize) as *const AtomicU64, n)
        })
    }

    /// Hints the CPU to load the cache line at `off` (no effect on contents,
    /// never faults). For hot paths that know their next misses early.
    #[inline]
    pub fn prefetch(&self, off: u64) {
        #[cfg(target_arch = "x86_64")]
        self.prefetch_hint::<{ std::arch::x86_64::_MM_HINT_T0 }>(off);
        #[cfg(not(target_arch = "x86_64"))]
        let _ = off;
    }

    /// [`prefetch`](Self::prefetch) with intent to write (`prefetchw`): the
    /// line arrives owned, so a store to it does not wait for it.
    #[inline]
    pub fn prefetch_write(&self, off: u64) {
        #[cfg(target_arch = "x86_64")]
        self.prefetch_hint::<{ std::arch::x86_64::_MM_HINT_ET0 }>(off);
        #[cfg(not(target_arch = "x86_64"))]
        let _ = off;
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    fn prefetch_hint<const HINT: i32>(&self, off: u64) {
        debug_assert!(off < self.size());
        #[allow(unused_unsafe)]
        // SAFETY: prefetch is a hint; it neither faults nor changes memory,
        // and the address is inside our reservation.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<HINT>(self.map.base().add(off as usize) as *const i8)
        }
    }

    /// The byte at `off`, as an atomic.
    #[inline]
    #[track_caller]
    pub fn atomic_u8(&self, off: u64) -> &AtomicU8 {
        self.bounds(off, 1);
        // SAFETY: in bounds (checked); bytes need no alignment.
        unsafe { &*(self.map.base().add(off as usize) as *const AtomicU8) }
    }

    /// Acquire load of the word at `off`.
    #[inline]
    pub fn load_u64(&self, off: u64) -> u64 {
        self.atomic_u64(off).load(Ordering::Acquire)
    }

    /// Release store of the word at `off` (8-byte failure-atomic).
    #[inline]
    pub fn store_u64(&self, off: u64, v: u64) {
        self.atomic_u64(off).store(v, Ordering::Release)
    }

    /// Copies bytes out of the pool. Not atomic: callers synchronise with
    /// writers of the same range.
    #[track_caller]
    pub fn read(&self, off: u64, buf: &mut [u8]) {
        self.bounds(off, buf.len());
        // SAFETY: source range in bounds (checked); buf is a distinct
        // allocation, so the ranges do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.map.base().add(off as usize),
                buf.as_mut_ptr(),
                buf.len(),
            )
        }
    }

    /// Copies bytes into the pool. Not atomic and not flushed.
    #[track_caller]
    pub fn write(&self, off: u64, data: &[u8]) {
        self.bounds(off, data.len());
        // SAFETY: destination range in bounds (checked); data cannot alias
        // the pool's mapping through a shared borrow of a distinct slice
        // unless the caller passes pool memory, which `read` never hands out.
        unsafe { std::ptr::copy(data.as_ptr(), self.map.base().add(off as usize), data.len()) }
    }

    /// Zeroes `[off, off+len)`; not flushed.
    #[track_caller]
    pub fn zero(&self, off: u64, len: usize) {
        self.bounds(off, len);
        // SAFETY: in bounds (checked).
        unsafe { std::ptr::write_bytes(self.map.base().add(off as usize), 0, len) }
    }

    /// Raw pointer to `off`, for engines' hot paths that need it.
    ///
    /// # Safety
    /// The caller keeps every access inside the pool and synchronises
    /// concurrent accesses itself. The pointer is valid while `self` lives.
    pub unsafe fn ptr(&self, off: u64) -> *mut u8 {
        self.map.base().add(off as usize)
    }

    // ----- persist primitives ----------------------------------------------------

    /// Writes back the cache lines of `[off, off+len)`; ordered by the next
    /// [`fence`](Self::fence).
    #[inline]
    pub fn flush(&self, off: u64, len: usize) {
        match self.mode {
            Mode::Dax | Mode::Mapped => {
                // SAFETY: flushing needs a mapped address; a range outside the
                // pool is still inside our reservation (or a caller bug that
                // `bounds` below reports in debug builds).
                debug_assert!(off + len as u64 <= self.size());
                persist::flush_range(unsafe { self.map.base().add(off as usize) }, len)
            }
            Mode::Volatile => {}
            Mode::Simulated => {
                self.bounds(off, len);
                let mut sim = self
                    .sim
                    .as_ref()
                    .expect("simulated pool has a simulator")
                    .lock()
                    .expect("sim lock");
                sim.record_flush(self.live(), off as usize, len);
                persist::count_flush(persist::lines_covered(off as usize, len));
            }
        }
    }

    /// Store fence: every earlier flush is durable before any later store.
    #[inline]
    pub fn fence(&self) {
        match self.mode {
            Mode::Dax | Mode::Mapped => persist::fence(),
            Mode::Volatile => {}
            Mode::Simulated => {
                let mut guard = self
                    .sim
                    .as_ref()
                    .expect("simulated pool has a simulator")
                    .lock()
                    .expect("sim lock");
                let sim = &mut *guard;
                // The hook sees the instant just before the fence takes
                // effect: lines flushed since the previous fence are still
                // undecided, so crash states between two fences are offered.
                if let Some(mut hook) = sim.hook.take() {
                    let n = sim.fences + 1;
                    hook(
                        n,
                        &CrashSite {
                            live: self.live(),
                            sim,
                        },
                    );
                    sim.hook = Some(hook);
                }
                guard.apply_fence(self.live());
                persist::count_fence();
            }
        }
    }

    /// `flush` then `fence`.
    #[inline]
    pub fn persist(&self, off: u64, len: usize) {
        self.flush(off, len);
        self.fence();
    }

    /// `persist` of the one cache line at `off` (64-byte aligned): the hot
    /// path of a slot write, with the least overhead.
    #[inline]
    #[track_caller]
    pub fn persist_line(&self, off: u64) {
        // Checked in every mode, so that tests on simulated pools catch
        // what would panic on a mapped one.
        assert!(
            off.is_multiple_of(CACHE_LINE as u64),
            "persist_line at unaligned offset {off:#x}"
        );
        match self.mode {
            Mode::Dax | Mode::Mapped => {
                self.bounds(off, CACHE_LINE);
                // SAFETY: the line is inside the mapping (checked above);
                // clwb and sfence do not change memory contents.
                persist::persist_one_line(unsafe { self.map.base().add(off as usize) })
            }
            _ => self.persist(off, CACHE_LINE),
        }
    }

    /// Copies `data` to `off` with non-temporal stores (no flush needed);
    /// durable after the next fence. For records of a cache line or more.
    pub fn write_nt(&self, off: u64, data: &[u8]) {
        self.bounds(off, data.len());
        match self.mode {
            // SAFETY: destination in bounds (checked); `data` is not pool memory.
            Mode::Dax | Mode::Mapped => unsafe {
                persist::nt_copy(self.map.base().add(off as usize), data)
            },
            Mode::Volatile => self.write(off, data),
            Mode::Simulated => {
                self.write(off, data);
                self.flush(off, data.len());
            }
        }
    }

    /// Zeroes `[off, off+len)` (whole lines) like [`zero_nt`](Self::zero_nt),
    /// but leaves the whole pages inside the range untouched by this
    /// process: in `mapped` mode their blocks are deallocated (a hole
    /// punched in the pool file, so they read as zeros) and reserved again
    /// at once (`posix_fallocate`, so a later store cannot raise SIGBUS on
    /// a full file system). The pages join the process's resident set only
    /// when first touched; zeroing them with stores faulted in all of them.
    /// The partial pages at the ends, and every other mode (`dax`, where a
    /// punched block's zeros are not known durable; the simulator, which
    /// must see the stores; volatile pools), are zeroed with non-temporal
    /// stores. Durable, as `zero_nt`, after the next fence: the hole is in
    /// the file when the call returns, and `sync` (msync) makes it durable
    /// against power loss with the rest of the file.
    ///
    /// The caller guarantees that nothing reads or writes the range
    /// meanwhile (a block just reserved from the allocator). An `Err`
    /// (`OutOfSpace` when the file system filled up between the punch and
    /// the reservation) may leave the range unbacked: the caller must not
    /// touch it nor hand it back to the allocator in this run (the next
    /// writable open backs every hole before mapping the file).
    pub fn zero_release(&self, off: u64, len: usize) -> Result<()> {
        self.bounds(off, len);
        self.heap.zeroed.fetch_add(len as u64, Ordering::Relaxed);
        let page = 4096u64;
        let start = round_up(off, page);
        let end = (off + len as u64) / page * page;
        let file = match (&self.file, self.mode) {
            (Some(f), Mode::Mapped) if !self.read_only && end > start => f,
            _ => {
                self.zero_nt(off, len);
                return Ok(());
            }
        };
        let path = self.path.as_deref().unwrap_or(Path::new("(unnamed pool)"));
        osmap::punch_hole(file, start, end - start)
            .map_err(|e| Error::io("cannot punch a hole in pool file", Some(path), e))?;
        reserve_space(file, path, start, end - start, "back the zeroed range of")?;
        // The partial pages at both ends, if any.
        self.zero_nt(off, (start - off) as usize);
        self.zero_nt(end, (off + len as u64 - end) as usize);
        Ok(())
    }

    /// Bytes [`zero_release`](Self::zero_release) has been asked to zero
    /// since this `Pool` was made (a block [`Reservation::is_zeroed`](crate::Reservation::is_zeroed) says
    /// reads zero needs none).
    pub fn zeroed_bytes(&self) -> u64 {
        self.heap.zeroed.load(Ordering::Relaxed)
    }

    /// Zeroes `[off, off+len)` (whole lines) with non-temporal stores: no
    /// flush needed, durable after the next fence, and the cache is left
    /// alone. For large ranges (a new log file).
    pub fn zero_nt(&self, off: u64, len: usize) {
        self.bounds(off, len);
        if !off.is_multiple_of(64) || !len.is_multiple_of(64) {
            self.zero(off, len);
            self.flush(off, len);
            return;
        }
        match self.mode {
            // SAFETY: destination in bounds (checked) and whole lines (the
            // mapping's base is page-aligned, `off` and `len` line multiples).
            Mode::Dax | Mode::Mapped => unsafe {
                persist::nt_zero(self.map.base().add(off as usize), len)
            },
            Mode::Volatile => self.zero(off, len),
            Mode::Simulated => {
                self.zero(off, len);
                self.flush(off, len);
            }
        }
    }

    // ----- growth ---------------------------------------------------------------

    /// Grows the pool to at least `min_size` bytes (doubling, up to
    /// `max_size`). Offsets and references stay valid.
    pub(crate) fn grow(&self, min_size: u64) -> Result<u64> {
        let _g = self.grow_lock.lock().expect("grow lock");
        let old = self.size();
        if old >= min_size {
            return Ok(old);
        }
        let target = round_up(
            min_size.max(old.saturating_mul(2)).min(self.max_size),
            alloc::CHUNK,
        );
        if target < min_size || target <= old {
            return Err(Error::OutOfSpace(format!(
                "pool is {old} bytes, growing to {min_size} would pass its limit of {}",
                self.max_size
            )));
        }
        if let Some(f) = &self.file {
            let path = self.path.as_deref().unwrap_or(Path::new(""));
            // persist: the file is extended (zero-filled: all new chunks free)
            // and its new pages reserved before the header records the new
            // size; a crash in between leaves a longer file whose tail open
            // ignores.
            if let Err(e) = reserve_space(f, path, old, target - old, "grow") {
                // Give back what a partial reservation took; the pool keeps
                // its size and stays usable.
                if f.metadata().map(|m| m.len() > old).unwrap_or(false) {
                    let _ = f.set_len(old);
                }
                return Err(e);
            }
            f.set_len(target)
                .map_err(|e| Error::io("cannot grow pool file", self.path.as_deref(), e))?;
        }
        self.map
            .map(self.file.as_ref(), old as usize, (target - old) as usize)
            .map_err(|e| Error::io("cannot map grown pool", self.path.as_deref(), e))?;
        if let Some(sim) = &self.sim {
            sim.lock()
                .expect("sim lock")
                .persisted
                .resize(target as usize, 0);
        }
        self.size.store(target, Ordering::Release);
        self.update_state(|s| s.size = target)?;
        Ok(target)
    }

    // ----- crash simulation --------------------------------------------------

    fn live(&self) -> &[u8] {
        // SAFETY: [base, base+size) is mapped; the simulator reads it while
        // the program may write it, which yields some mix of old and new
        // bytes: exactly the uncertainty a crash has.
        unsafe { std::slice::from_raw_parts(self.map.base(), self.size() as usize) }
    }

    /// Installs (or removes) the hook called at every fence of a simulated
    /// pool, just before the fence takes effect. The hook must not call this
    /// pool's flush or fence.
    pub fn set_fence_hook(&self, hook: Option<FenceHook>) -> Result<()> {
        let sim = self
            .sim
            .as_ref()
            .ok_or_else(|| Error::InvalidArgument("fence hooks need simulated mode".into()))?;
        let mut g = sim.lock().expect("sim lock");
        g.at_last_fence = hook.is_some().then(|| self.live().to_vec());
        g.hook = hook;
        Ok(())
    }

    /// Fences issued so far (simulated mode; 0 otherwise).
    pub fn fence_count(&self) -> u64 {
        self.sim
            .as_ref()
            .map(|s| s.lock().expect("sim lock").fences)
            .unwrap_or(0)
    }

    /// Runs `f` on the crash site of this instant (simulated mode only).
    fn at_site<R>(&self, f: impl FnOnce(&CrashSite<'_>) -> R) -> Result<R> {
        let sim = self
            .sim
            .as_ref()
            .ok_or_else(|| Error::InvalidArgument("crash sites need simulated mode".into()))?;
        let g = sim.lock().expect("sim lock");
        Ok(f(&CrashSite {
            live: self.live(),
            sim: &g,
        }))
    }

    /// A crash image of the pool as it stands now (simulated mode).
    pub fn crash_image(&self, choice: CrashChoice) -> Result<Vec<u8>> {
        self.at_site(|site| site.image(choice))
    }

    /// Cache lines not yet durable (simulated mode).
    pub fn undecided_lines(&self) -> Result<Vec<u64>> {
        self.at_site(|site| site.undecided_lines())
    }

    /// Undecided lines written since the previous fence (simulated mode;
    /// see `CrashSite::recent_lines`).
    pub fn recent_lines(&self) -> Result<Vec<u64>> {
        self.at_site(|site| site.recent_lines())
    }

    /// A copy of the whole live image.
    pub fn image(&self) -> Vec<u8> {
        self.live().to_vec()
    }

    /// Allocator and size figures.
    pub fn stats(&self) -> PoolStats {
        self.heap.stats(self)
    }
}
