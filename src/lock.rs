//! One mount per data-set cache directory: an exclusive `flock` on
//! `<dataset dir>/lock`, held for the life of the mount, so two daemons never
//! write the same cache files. It never blocks: a held lock is an error that
//! names the holder.

use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::Path;

/// The held lock; released when dropped (or when the process dies).
pub struct DatasetLock {
    _file: File,
}

impl DatasetLock {
    pub fn acquire(dir: &Path) -> Result<Self, String> {
        let path = dir.join("lock");
        if !path.exists() {
            std::fs::write(&path, b"").map_err(|e| format!("cache dir {}: {e}", dir.display()))?;
        }
        // Held through a read-only descriptor, so that the cache disk can
        // still be remounted read-only under a running mount.
        let mut f = File::open(&path).map_err(|e| format!("cache dir {}: {e}", dir.display()))?;
        // SAFETY: flock on an owned descriptor.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let mut holder = String::new();
            let _ = f.read_to_string(&mut holder);
            return Err(format!(
                "cache dir {} is in use by another locafs mount (pid {})",
                dir.display(),
                holder.trim()
            ));
        }
        // Who holds it, for the message above (best effort).
        let _ = std::fs::write(&path, std::process::id().to_string());
        Ok(DatasetLock { _file: f })
    }
}
