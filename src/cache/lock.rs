//! One mount per data-set cache directory: an exclusive `flock` on
//! `<dataset dir>/lock`, held for the life of the mount, so two daemons never
//! write the same cache files. It never blocks: a held lock is an error that
//! names the holder. The lock file is opened through the data set's checked
//! directory handle (`private_dir`), never through a symlink, and taken
//! only on the directory still at its path: one a neighbour's budget
//! keeper renamed to its trash (or replaced) before the lock was held is
//! refused ([`LockError::Moved`]), never locked and used.

use std::fs::File;
use std::io::{Read, Write};

use rustix::fs::OFlags;

use crate::sys::private_dir::PrivateDir;

/// The lock file's name in a data set's directory.
pub const LOCK_FILE: &str = "lock";

/// The held lock; released when dropped (or when the process dies).
pub struct DatasetLock {
    _file: File,
}

/// Why the lock was not taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// A mount holds it.
    #[error("cache dir {dir} is in use by another locafs mount (pid {pid})")]
    Held { dir: String, pid: String },
    /// The directory is no longer at its path (renamed away or deleted,
    /// or something else put there) before the lock was held: resolve it
    /// again.
    #[error("cache dir {dir}: taken away (no longer at its path) while it was being locked")]
    Moved { dir: String },
    /// The lock file cannot be opened (a symlink in its place, say).
    #[error("cache dir {dir}: {source}")]
    Io { dir: String, source: std::io::Error },
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
    pub fn acquire(dir: &PrivateDir) -> Result<Self, LockError> {
        let t = std::time::Instant::now();
        loop {
            match Self::try_acquire(dir) {
                Err(LockError::Held { .. })
                    if t.elapsed() < std::time::Duration::from_millis(200) =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                r => return r,
            }
        }
    }

    /// One attempt at the lock, never waiting.
    pub fn try_acquire(dir: &PrivateDir) -> Result<Self, LockError> {
        let moved = || LockError::Moved {
            dir: dir.path().display().to_string(),
        };
        // (a lock file that cannot be opened in a directory gone from its
        // path: the directory's fault)
        let fail = |source| {
            if in_place(dir) {
                LockError::Io {
                    dir: dir.path().display().to_string(),
                    source,
                }
            } else {
                moved()
            }
        };
        // Held through a read-only descriptor, so that the cache disk can
        // still be remounted read-only under a running mount (created 0600
        // if missing).
        let mut f = match dir.open_file(LOCK_FILE, OFlags::RDONLY) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => dir
                .open_file(LOCK_FILE, OFlags::RDONLY | OFlags::CREATE)
                .map_err(fail)?,
            r => r.map_err(fail)?,
        };
        if rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
            let mut holder = String::new();
            let _ = f.read_to_string(&mut holder);
            return Err(LockError::Held {
                dir: dir.path().display().to_string(),
                pid: holder.trim().to_owned(),
            });
        }
        // Held: on the directory at the path (not one a budget keeper took
        // away between its resolve and this, and so about to be deleted).
        if !in_place(dir) {
            return Err(moved());
        }
        // Who holds it, for the message above (best effort).
        if let Ok(mut w) = dir.open_file(LOCK_FILE, OFlags::WRONLY | OFlags::TRUNC) {
            let _ = w.write_all(std::process::id().to_string().as_bytes());
        }
        Ok(DatasetLock { _file: f })
    }
}

/// Whether `dir`'s handle is still the directory at its path (its last
/// component not followed: a symlink put there is not it).
fn in_place(dir: &PrivateDir) -> bool {
    let (Ok(held), Ok(now)) = (
        rustix::fs::fstat(dir.as_fd()),
        rustix::fs::lstat(dir.path()),
    ) else {
        return false;
    };
    (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_with_the_holder_until_the_first_is_dropped() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = PrivateDir::create(&tmp.path().join("ds")).unwrap();
        let first = DatasetLock::acquire(&dir).unwrap();
        let e = DatasetLock::acquire(&dir)
            .err()
            .expect("refused")
            .to_string();
        assert!(
            e.contains("in use by another locafs mount")
                && e.contains(&format!("(pid {})", std::process::id())),
            "{e}"
        );
        drop(first);
        DatasetLock::acquire(&dir).expect("free again");
    }

    #[test]
    fn a_directory_no_longer_at_its_path_is_not_locked() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("ds");
        let moved =
            |dir: &PrivateDir| matches!(DatasetLock::acquire(dir), Err(LockError::Moved { .. }));
        // Renamed away (a budget keeper's trash).
        let dir = PrivateDir::create(&path).unwrap();
        std::fs::rename(&path, tmp.path().join("trash")).unwrap();
        assert!(moved(&dir));
        // Deleted.
        let dir = PrivateDir::create(&path).unwrap();
        std::fs::remove_dir(&path).unwrap();
        assert!(moved(&dir));
        // A symlink to it in its place (followed, it would look the same).
        let dir = PrivateDir::create(&path).unwrap();
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::rename(&path, &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        assert!(moved(&dir));
        // The one at its path is locked (and the lock let go on Moved).
        std::fs::remove_file(&path).unwrap();
        std::fs::rename(&elsewhere, &path).unwrap();
        DatasetLock::acquire(&dir).expect("in place");
    }

    #[test]
    fn a_symlinked_lock_file_is_refused_and_its_target_untouched() {
        let tmp = tempfile::tempdir().unwrap();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let dir = PrivateDir::create(&tmp.path().join("ds")).unwrap();
        std::os::unix::fs::symlink(&victim, dir.display(LOCK_FILE)).unwrap();
        let e = DatasetLock::acquire(&dir)
            .err()
            .expect("refused")
            .to_string();
        assert!(
            e.starts_with("cache dir ") && e.contains("is a symlink"),
            "{e}"
        );
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    }
}
