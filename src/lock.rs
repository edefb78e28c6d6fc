//! One mount per data-set cache directory: an exclusive `flock` on
//! `<dataset dir>/lock`, held for the life of the mount, so two daemons never
//! write the same cache files. It never blocks: a held lock is an error that
//! names the holder.

use std::fs::File;
use std::io::Read;
use std::path::Path;

/// The held lock; released when dropped (or when the process dies).
pub struct DatasetLock {
    _file: File,
}

impl DatasetLock {
    /// The lock held through `file`, a descriptor another process took it
    /// with and passed on (a takeover of the mount): the same open file,
    /// so the same lock.
    pub fn from_file(file: File) -> Self {
        DatasetLock { _file: file }
    }

    /// The descriptor the lock is held through (to pass it on).
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self._file.as_fd()
    }

    /// Takes the lock, waiting at most 200 ms (`locafs cache ls` and the
    /// budget probe it with a shared lock for an instant); an error that
    /// names the holder if a mount holds it.
    pub fn acquire(dir: &Path) -> Result<Self, String> {
        let t = std::time::Instant::now();
        loop {
            match Self::try_acquire(dir) {
                Err(e)
                    if e.contains("in use")
                        && t.elapsed() < std::time::Duration::from_millis(200) =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                r => return r,
            }
        }
    }

    /// One attempt at the lock, never waiting.
    pub fn try_acquire(dir: &Path) -> Result<Self, String> {
        let path = dir.join("lock");
        if !path.exists() {
            std::fs::write(&path, b"").map_err(|e| format!("cache dir {}: {e}", dir.display()))?;
        }
        // Held through a read-only descriptor, so that the cache disk can
        // still be remounted read-only under a running mount.
        let mut f = File::open(&path).map_err(|e| format!("cache dir {}: {e}", dir.display()))?;
        if rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_with_the_holder_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let first = DatasetLock::acquire(dir.path()).unwrap();
        let e = DatasetLock::acquire(dir.path()).err().expect("refused");
        assert!(
            e.contains("in use by another locafs mount")
                && e.contains(&format!("(pid {})", std::process::id())),
            "{e}"
        );
        drop(first);
        DatasetLock::acquire(dir.path()).expect("free again");
        let e = DatasetLock::acquire(&dir.path().join("missing"))
            .err()
            .expect("no such dir");
        assert!(e.starts_with("cache dir "), "{e}");
    }
}
