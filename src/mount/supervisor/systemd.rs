//! The mount across `systemctl restart` (and a package upgrade that
//! restarts the unit, and a holder that systemd restarts after a crash):
//! the holder keeps the connection's descriptors, the shared state and the
//! lock in systemd's file descriptor store (`FDSTORE=1`, the unit's
//! `FileDescriptorStoreMax=`), and the holder systemd starts next gets them
//! back (`LISTEN_FDS`, names in `LISTEN_FDNAMES`) and serves the live
//! mount on. On SIGTERM the holder asks systemd whether a restart of its
//! unit is queued (`systemctl list-jobs`): if so it leaves the mount to the
//! next holder; if not (`systemctl stop`) it unmounts and takes its
//! descriptors out of the store.
//!
//! It only speaks systemd's protocols (sd_notify, socket activation's
//! environment, `systemctl`); what to do with the descriptors is the
//! holder's.

use std::io;
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The names the descriptors are stored under.
pub const STATE: &str = "locafs-state";
pub const LOCK: &str = "locafs-lock";
pub const FUSE: &str = "locafs-fuse";

/// Whether systemd listens: the process is a `Type=notify` unit's own
/// ([`crate::sys::notify_socket`]; a child that inherited `NOTIFY_SOCKET`
/// is not).
pub fn under_systemd() -> bool {
    crate::sys::notify_socket().is_some()
}

/// Sends `state` to systemd with `fds` (sd_pid_notify_with_fds).
pub fn notify_with_fds(state: &str, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    crate::sys::sd_notify_with_fds(state, fds)
}

/// Keeps `fds` in systemd's store under `name` (replacing what was stored
/// under it).
pub fn store(name: &str, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    notify_with_fds(&format!("FDSTOREREMOVE=1\nFDNAME={name}"), &[])?;
    notify_with_fds(&format!("FDSTORE=1\nFDNAME={name}"), fds)
}

/// Takes the descriptors stored under every locafs name out of the store.
pub fn forget_stored() {
    for name in [STATE, LOCK, FUSE] {
        let _ = notify_with_fds(&format!("FDSTOREREMOVE=1\nFDNAME={name}"), &[]);
    }
}

/// Descriptors systemd passed this process (`LISTEN_FDS`, for this pid),
/// by name; the environment variables are removed (the children do not
/// inherit them).
pub fn passed() -> Vec<(String, OwnedFd)> {
    let pid_ok = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
        == Some(std::process::id());
    let n: usize = std::env::var("LISTEN_FDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let names = std::env::var("LISTEN_FDNAMES").unwrap_or_default();
    for k in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        std::env::remove_var(k);
    }
    if !pid_ok || n == 0 || n > 1024 {
        return Vec::new();
    }
    let names: Vec<&str> = names.split(':').collect();
    (0..n)
        .map(|i| {
            let fd = 3 + i as RawFd;
            // SAFETY: systemd passed descriptors 3..3+n to this process
            // for it alone (LISTEN_PID is ours); each is taken once.
            let owned = unsafe { OwnedFd::from_raw_fd(fd) };
            let _ = rustix::io::fcntl_setfd(&owned, rustix::io::FdFlags::CLOEXEC);
            (names.get(i).copied().unwrap_or("").to_string(), owned)
        })
        .collect()
}

/// The descriptors of a mount, as stored.
pub struct Stored {
    pub state: OwnedFd,
    pub lock: OwnedFd,
    pub fuse: Vec<OwnedFd>,
}

/// The mount's descriptors among those systemd passed, if they are all
/// there; None otherwise (anything else passed is closed).
pub fn take_stored() -> Option<Stored> {
    let (mut state, mut lock, mut fuse) = (None, None, Vec::new());
    for (name, fd) in passed() {
        match name.as_str() {
            STATE => state = Some(fd),
            LOCK => lock = Some(fd),
            FUSE => fuse.push(fd),
            _ => {}
        }
    }
    if fuse.is_empty() {
        return None;
    }
    Some(Stored {
        state: state?,
        lock: lock?,
        fuse,
    })
}

/// The unit this process runs in: the innermost `*.service` in its
/// cgroup paths (the unified hierarchy's, else systemd's named one on a
/// legacy layout).
fn own_unit() -> Option<String> {
    unit_of_cgroups(&std::fs::read_to_string("/proc/self/cgroup").ok()?)
}

/// [`own_unit`] from the text of /proc/PID/cgroup.
fn unit_of_cgroups(text: &str) -> Option<String> {
    let paths = text.lines().filter_map(|l| l.strip_prefix("0::")).chain(
        text.lines()
            .filter_map(|l| l.split_once(":name=systemd:").map(|x| x.1)),
    );
    for path in paths {
        if let Some(unit) = path.rsplit('/').find(|c| c.ends_with(".service")) {
            return Some(unit.to_owned());
        }
    }
    None
}

/// Whether systemd has a restart of this process's unit queued (it is
/// being stopped to be started again: `systemctl restart`, `try-restart`,
/// a package's upgrade): asked of `systemctl list-jobs`, within 5 s.
pub fn restart_queued() -> bool {
    let Some(unit) = own_unit() else {
        return false;
    };
    let Ok(mut child) = Command::new("systemctl")
        .args(["list-jobs", "--no-legend", "--plain", "--no-pager"])
        // (systemctl would tell our notify socket its own errors)
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
    else {
        return false;
    };
    let t0 = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if t0.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return false;
            }
        }
    }
    let Ok(out) = child.wait_with_output() else {
        return false;
    };
    jobs_restart(&String::from_utf8_lossy(&out.stdout), &unit)
}

/// Whether `systemctl list-jobs --plain` output lists a restart job of
/// `unit` (lines "JOB UNIT TYPE STATE").
fn jobs_restart(list: &str, unit: &str) -> bool {
    list.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() >= 3 && f[1] == unit && f[2].contains("restart")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unit_is_the_innermost_service_of_the_cgroup_paths() {
        let unified = "0::/system.slice/locafs@imagenet.service\n";
        assert_eq!(
            unit_of_cgroups(unified).as_deref(),
            Some("locafs@imagenet.service")
        );
        let delegated = "0::/system.slice/locafs@x.service/holder\n";
        assert_eq!(
            unit_of_cgroups(delegated).as_deref(),
            Some("locafs@x.service")
        );
        // Hybrid layout with the unified hierarchy unused, then legacy.
        let hybrid = "9:name=systemd:/system.slice/locafs@y.service\n0::/\n";
        assert_eq!(unit_of_cgroups(hybrid).as_deref(), Some("locafs@y.service"));
        // Not in a unit (a shell, a container): nothing.
        assert_eq!(unit_of_cgroups("9:name=systemd:/\n0::/\n"), None);
        assert_eq!(unit_of_cgroups("0::/user.slice/session-3.scope\n"), None);
    }

    #[test]
    fn a_queued_restart_of_this_unit_is_found_in_the_job_list() {
        let list = "101 locafs@imagenet.service restart running\n\
                    102 other.service start waiting\n";
        assert!(jobs_restart(list, "locafs@imagenet.service"));
        assert!(!jobs_restart(list, "other.service"));
        assert!(!jobs_restart(list, "locafs@coco.service"));
        assert!(!jobs_restart("", "locafs@imagenet.service"));
        assert!(jobs_restart(
            "7 locafs@x.service try-restart waiting",
            "locafs@x.service"
        ));
    }
}
