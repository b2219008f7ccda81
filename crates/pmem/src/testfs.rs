//! A small tmpfs for tests of a full file system. Mounting needs root
//! (CI runs as root); elsewhere `mount` refuses and [`SmallFs::mount`] returns its message;
//! the test prints that and skips. The file system is unmounted and
//! its directory removed on drop.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A tmpfs of a fixed size mounted on a fresh directory.
pub struct SmallFs {
    dir: PathBuf,
}

impl SmallFs {
    /// Mounts a tmpfs of `bytes` bytes (rounded up to pages by the kernel)
    /// on a new directory under the temp dir, with
    /// `mount -t tmpfs -o size=BYTES tmpfs DIR`.
    pub fn mount(bytes: u64) -> Result<SmallFs, String> {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("pmhash-smallfs-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(&dir)
            .output();
        match out {
            Ok(o) if o.status.success() => Ok(SmallFs { dir }),
            Ok(o) => {
                let _ = std::fs::remove_dir(&dir);
                Err(format!(
                    "mount -t tmpfs failed: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                ))
            }
            Err(e) => {
                let _ = std::fs::remove_dir(&dir);
                Err(format!("cannot run mount: {e}"))
            }
        }
    }

    /// The mount point.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A path inside the file system.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Bytes still free for files, as `df -B1 --output=avail` says.
    pub fn free_bytes(&self) -> u64 {
        Command::new("df")
            .args(["-B1", "--output=avail"])
            .arg(&self.dir)
            .output()
            .ok()
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .nth(1)
                    .and_then(|l| l.trim().parse().ok())
            })
            .unwrap_or(0)
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        // Lazy, so that a mapping a failing test left behind cannot keep
        // the mount point busy.
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        let _ = std::fs::remove_dir(&self.dir);
    }
}
