//! A restart over a dead mount: recognises a locafs mount whose daemon died
//! (its FUSE connection is gone) on the mountpoint a new `locafs mount`
//! wants, and detaches it, so that a crashed daemon restarted by hand, by
//! systemd (`Restart=on-failure`) or by a container runtime mounts again at
//! once over the same cache.
//!
//! A dead mount is recognised from what the kernel cannot answer from its
//! caches: the mount table says the mount is `fuse.locafs`, and a
//! `statfs(2)` on it, which FUSE always sends to the daemon, fails with
//! ENOTCONN (the kernel aborted the connection when the last descriptor of
//! `/dev/fuse` closed; ECONNABORTED if the call came as it did). A `stat` is no test: the kernel answers it from the
//! attributes it cached for as long as their time to live, so a freshly
//! dead mount looks alive to it for a minute. The probe runs in a child
//! process with a deadline, since a daemon that is alive but hung would hold
//! it forever.
//!
//! It must never detach a mount that is not locafs's, nor one whose daemon
//! still answers or might (a slow or hung daemon is not a dead one: it is
//! reported and left alone).

use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long the probe waits for the daemon of a mount to answer. A live
/// locafs answers `statfs` from its last figures within `--metadata-timeout`
/// (5 s by default) even when the source stalls; a dead connection answers
/// at once. Past this the mount is left alone (and reported), so this
/// bounds only how long a restart waits before it says so.
pub const PROBE_DEADLINE: Duration = Duration::from_secs(3);

/// What is on a mountpoint, as far as a restart cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountState {
    /// Nothing is mounted there.
    NotMounted,
    /// A mount of another type (`tmpfs`, `nfs4`, another FUSE file system).
    Other(String),
    /// A locafs mount whose daemon answered.
    Alive,
    /// A locafs mount whose connection is gone: its daemon died.
    Dead,
    /// A locafs mount whose daemon did not answer within the deadline
    /// (hung, stopped, or very slow): not provably dead.
    NoAnswer,
}

/// Looks at what is mounted on `mountpoint` (an absolute, canonical path,
/// as the mount table spells it) and, for a locafs mount, whether its
/// daemon answers within `deadline`.
pub fn probe(mountpoint: &Path, deadline: Duration) -> MountState {
    match crate::sys::mount_fstype(mountpoint) {
        None => return MountState::NotMounted,
        Some(t) if t != "fuse.locafs" => return MountState::Other(t),
        Some(_) => {}
    }
    match statfs_within(mountpoint, deadline) {
        Some(Err(libc::ENOTCONN | libc::ECONNABORTED)) => MountState::Dead,
        // Any answer (figures, or an error the daemon sent) means a daemon
        // is there to answer.
        Some(_) => MountState::Alive,
        None => MountState::NoAnswer,
    }
}

/// `statfs(2)` on `path` in a child process, waited for at most
/// `deadline`: its result (the errno of a failure), or None if it did not
/// return in time. A child, not a thread: a daemon that took the request
/// and never answers holds the caller in an uninterruptible wait that not
/// even exiting ends, and it must be the child that stays behind (it ends
/// when the daemon answers or dies), never this process.
fn statfs_within(path: &Path, deadline: Duration) -> Option<Result<(), i32>> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: the child calls only async-signal-safe functions (statfs,
    // _exit) on memory allocated before the fork, so forking a process that
    // may have other threads is sound.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // The child's exit status: 0 for figures, 1 for ENOTCONN or
        // ECONNABORTED (the request was queued as the connection went), 2
        // for any other error.
        // SAFETY: see above; `st` is a plain C struct for statfs to fill.
        unsafe {
            let mut st: libc::statfs = std::mem::zeroed();
            let code = if libc::statfs(c_path.as_ptr(), &mut st) == 0 {
                0
            } else {
                match *libc::__errno_location() {
                    libc::ENOTCONN | libc::ECONNABORTED => 1,
                    _ => 2,
                }
            };
            libc::_exit(code);
        }
    }
    if pid < 0 {
        return None;
    }
    let t0 = std::time::Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: waits for our own child without blocking.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return match libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)) {
                Some(0) => Some(Ok(())),
                Some(1) => Some(Err(libc::ENOTCONN)),
                _ => Some(Err(libc::EIO)),
            };
        }
        if r < 0 || t0.elapsed() >= deadline {
            // A request the daemon never read ends with the child; one it
            // read keeps the child until it answers (then init reaps it).
            // SAFETY: our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The mountpoint as the mount table spells it: its parent made absolute
/// and canonical (the mountpoint itself is not resolved: on a dead mount
/// that would fail).
pub fn table_path(mountpoint: &Path) -> Option<PathBuf> {
    let name = mountpoint.file_name()?;
    let parent = match mountpoint.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    Some(std::fs::canonicalize(parent).ok()?.join(name))
}

/// Detaches every dead locafs mount stacked on `mountpoint` (a daemon that
/// died after each of several restarts leaves one each), saying so on
/// stderr, one line per mount detached; returns how many. An error, with
/// what to do, if a locafs mount there does not answer: going on would
/// hang on it (every look at the mountpoint waits for its daemon).
pub fn clear(mountpoint: &Path) -> Result<usize, String> {
    let Some(abs) = table_path(mountpoint) else {
        return Ok(0);
    };
    let mut detached = 0;
    // Bounded: each turn removes one mount of the stack.
    for _ in 0..16 {
        match probe(&abs, PROBE_DEADLINE) {
            MountState::Dead => {}
            MountState::NoAnswer => {
                return Err(format!(
                    "mountpoint {}: the locafs mount there does not answer within {}s (its \
                     daemon is hung or stopped); `umount -l {}` detaches it",
                    mountpoint.display(),
                    PROBE_DEADLINE.as_secs(),
                    abs.display()
                ))
            }
            _ => return Ok(detached),
        }
        match crate::sys::lazy_unmount(&abs) {
            Ok(()) => {
                detached += 1;
                crate::obs::logging::say(&format!(
                    "{}: detached a dead locafs mount left by a daemon that died",
                    abs.display()
                ));
            }
            Err(e) => {
                crate::obs::logging::say(&format!(
                    "{}: dead locafs mount, cannot detach it: {e}",
                    abs.display()
                ));
                return Ok(detached);
            }
        }
    }
    Ok(detached)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_with_nothing_mounted_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let abs = table_path(dir.path()).unwrap();
        assert_eq!(probe(&abs, PROBE_DEADLINE), MountState::NotMounted);
        assert_eq!(clear(dir.path()), Ok(0));
        assert!(dir.path().is_dir());
    }

    #[test]
    fn the_table_path_resolves_the_parent_only() {
        let dir = tempfile::tempdir().unwrap();
        let real = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(real.join("a")).unwrap();
        let rel = real.join("a/../a/mnt");
        assert_eq!(table_path(&rel).unwrap(), real.join("a/mnt"));
        // The mountpoint itself need not exist (nor answer).
        assert_eq!(table_path(&real.join("nope")).unwrap(), real.join("nope"));
    }
}
