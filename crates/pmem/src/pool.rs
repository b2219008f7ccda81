//! The pool: one file (or anonymous memory) mapped at a stable address,
//! addressed by offsets, with a checksummed header and a crash-safe
//! allocator. Its bytes and persist primitives are the [`Region`] under it
//! (reached through `Deref`); the allocator is [`Heap`].

use std::fs::{File, OpenOptions};
use std::ops::Deref;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::alloc::{self, FreeTicket, Heap, Link, PoolStats, Reservation};
use crate::error::{Error, Result};
use crate::header::{self, Identity, State, HEADER_LEN, SLOT_LEN, SLOT_OFFSET};
use crate::map::{self as osmap, Backing, LockResult, Mapping};
use crate::region::{reserve_space, round_up, Mode, Region};
use crate::sim::{FenceHook, Sim};

/// Options for [`Pool::create`] and [`Pool::open`].
#[derive(Clone, Debug)]
pub struct PoolOptions {
    /// Persistence mode to map the pool in.
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

struct HeaderState {
    cur: State,
    slot: usize,
}

/// A mapped pool. Everything inside is addressed by byte offsets from the
/// pool start; the base address is stable for the pool's lifetime.
pub struct Pool {
    region: Region,
    dax_fallback: Option<String>,
    writer_active: bool,
    identity: Identity,
    state: Mutex<HeaderState>,
    root: AtomicU64,
    aux: AtomicU64,
    was_clean: bool,
    /// Opened by [`open_locked_checked`](Pool::open_locked_checked).
    prechecked: bool,
    heap: Heap,
}

impl Deref for Pool {
    type Target = Region;

    /// The pool's bytes and persist primitives.
    fn deref(&self) -> &Region {
        &self.region
    }
}

/// Smallest pool: the metadata chunk plus one heap chunk.
pub const MIN_POOL_SIZE: u64 = 2 * alloc::CHUNK;

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

    /// The locked file's path.
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
        let mut region = Region::new(
            map,
            file,
            opts.mode.uses_file().then(|| path.to_path_buf()),
            mode,
            false,
            size,
            max_size,
        );
        region.sim = sim;
        let pool = Pool {
            region,
            dax_fallback: fallback,
            writer_active: false,
            identity,
            state: Mutex::new(HeaderState {
                cur: state,
                slot: 0,
            }),
            root: AtomicU64::new(0),
            aux: AtomicU64::new(0),
            was_clean: false,
            prechecked: false,
            heap: Heap::empty(),
        };
        // persist: state slot and identity in one fence; the file was
        // zero-filled, so the heap (all chunks free) and lanes need no writes.
        pool.write(SLOT_OFFSET as u64, &state.encode());
        pool.write(0, &id_bytes);
        pool.persist(0, SLOT_OFFSET + SLOT_LEN);
        pool.heap.rebuild(&pool.region)?;
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
            // A sparse pool (a copy that made holes, or a file extended
            // without reserving its blocks) is backed
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
            region: Region::new(
                map,
                file,
                Some(path.to_path_buf()),
                mode,
                opts.read_only,
                size,
                if opts.read_only { size } else { max_size },
            ),
            dax_fallback: fallback,
            writer_active,
            identity,
            state: Mutex::new(HeaderState { cur: state, slot }),
            root: AtomicU64::new(state.root),
            aux: AtomicU64::new(state.aux),
            was_clean: state.clean == 1,
            prechecked: false,
            heap: Heap::empty(),
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

    /// [`from_image`](Self::from_image), with room to grow to `max_size`
    /// (rounded up to whole chunks, never below the pool's size), as a
    /// file opened with that [`PoolOptions::max_size`] has: a crash image
    /// of a pool that could still grow recovers to one that can.
    pub fn from_image_growable(image: Vec<u8>, mode: Mode, max_size: u64) -> Result<Pool> {
        Self::from_image_with(image, mode, max_size, "", None)
    }

    /// [`from_image_growable`](Self::from_image_growable) in simulated mode
    /// with a fence hook installed before recovery starts, so that crash
    /// states can be taken during the pool's own recovery (and the
    /// engine's, if it runs on this pool next). The hook stays installed.
    pub fn from_image_hooked(image: Vec<u8>, max_size: u64, hook: FenceHook) -> Result<Pool> {
        Self::from_image_with(image, Mode::Simulated, max_size, "", Some(hook))
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
        // Whole chunks, as `create` and a file open round it.
        let max_size = round_up(max_size, alloc::CHUNK).max(size);
        let map = Mapping::reserve(reservation(size, max_size)?, Backing::Anonymous)
            .map_err(|e| Error::io("cannot reserve address space", None, e))?;
        map.map(None, 0, size as usize)
            .map_err(|e| Error::io("cannot map memory", None, e))?;
        let mut persisted = image;
        persisted.truncate(size as usize);
        let mut region = Region::new(map, None, None, mode, false, size, max_size);
        region.write(0, &persisted);
        region.sim = (mode == Mode::Simulated).then(|| Mutex::new(Sim::new(persisted)));
        let pool = Pool {
            region,
            dax_fallback: None,
            writer_active: false,
            identity,
            state: Mutex::new(HeaderState { cur: state, slot }),
            root: AtomicU64::new(state.root),
            aux: AtomicU64::new(state.aux),
            was_clean: state.clean == 1,
            prechecked: false,
            heap: Heap::empty(),
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
        let st = self.header_state();
        self.heap.recover(&self.region, st.root, st.aux)?;
        // persist: the clean flag is cleared before any engine write, so a
        // crash from here on is seen as a crash at the next open.
        self.update_state(|s| {
            s.clean = 0;
            s.opens += 1;
        })
    }

    /// Why `dax` fell back to `mapped`, if it did.
    pub fn dax_fallback(&self) -> Option<&str> {
        self.dax_fallback.as_deref()
    }

    /// Whether a writable open held the file's lock when this read-only
    /// open looked (always `false` for a writable pool, which holds it).
    /// What such a reader sees may be mid-update.
    pub fn writer_active(&self) -> bool {
        self.writer_active
    }

    /// The header's immutable part (layout id, uuid, creation time).
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

    /// Grows the pool to at least `min_size` bytes (doubling, up to
    /// `max_size`). Offsets and references stay valid.
    fn grow(&self, min_size: u64) -> Result<u64> {
        // persist: the file is extended (zero-filled: all new chunks free)
        // and its new pages reserved before the header records the new
        // size; a crash in between leaves a longer file whose tail open
        // ignores.
        self.region.grow(min_size, alloc::CHUNK, |size| {
            self.update_state(|s| s.size = size)
        })
    }

    // ----- the allocator ----------------------------------------------------------

    /// Reserves a block of at least `size` bytes that will be linked by
    /// `link`. Contents are unspecified (stale) unless
    /// [`Reservation::is_zeroed`] says otherwise. `Err(OutOfSpace)` leaves
    /// the pool unchanged.
    pub fn reserve(&self, size: u64, link: Link) -> Result<Reservation> {
        self.heap
            .reserve(&self.region, &|want| self.grow(want), size, link)
    }

    /// Commits a reservation whose link is durable: after this the block
    /// stays allocated whatever happens to the owner word.
    pub fn commit(&self, r: Reservation) {
        self.heap.commit(&self.region, r)
    }

    /// Returns a reservation that was never linked.
    pub fn cancel(&self, r: Reservation) {
        self.heap.cancel(&self.region, r)
    }

    /// Starts freeing the allocated block at `off`, which `link` links while
    /// it is reachable. Unlink it and persist the unlink, then call
    /// [`finish_free`](Self::finish_free).
    pub fn begin_free(&self, off: u64, link: Link) -> Result<FreeTicket> {
        self.heap.begin_free(&self.region, off, link)
    }

    /// Completes a free whose unlink is durable.
    pub fn finish_free(&self, t: FreeTicket) {
        self.heap.finish_free(&self.region, t)
    }

    /// Abandons a free whose unlink never happened: the block stays
    /// allocated and the lane is released.
    pub fn cancel_free(&self, t: FreeTicket) {
        self.heap.cancel_free(&self.region, t)
    }

    /// Frees a block that nothing links any more (durably).
    pub fn free(&self, off: u64) -> Result<()> {
        self.heap.free(&self.region, off)
    }

    /// Usable size of the allocated block at `off`.
    /// `Err(Corrupt)` unless `off` is the start of an allocated block: an
    /// engine validating offsets read from PM learns that a pointer names
    /// free space.
    pub fn block_size(&self, off: u64) -> Result<u64> {
        self.heap.block_size(&self.region, off)
    }

    /// Allocator and size figures.
    pub fn stats(&self) -> PoolStats {
        self.heap.stats(&self.region)
    }
}
