//! The machine around the tests: what is mounted (one /proc/self/mountinfo
//! parser), unmounting, the page cache, free ports, `/proc/PID/status`,
//! signals, waiting for a condition, and running a command as another
//! user (`nobody`).

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use rustix::process::Signal;

/// One line of /proc/self/mountinfo.
#[derive(Debug, Clone)]
pub struct MountEntry {
    /// Where it is mounted (octal escapes decoded).
    pub point: PathBuf,
    /// The file system type, e.g. `fuse.locafs`.
    pub fstype: String,
    /// The mount source, e.g. `locafs:/path/to/src`.
    pub source: String,
}

/// Every mount of this mount namespace, in mount order.
pub fn mountinfo() -> Vec<MountEntry> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            // After the optional fields: "-", the type, the source.
            let dash = f.iter().position(|x| *x == "-")?;
            let point = locafs::sys::unescape_mount(f.get(4)?);
            let source = locafs::sys::unescape_mount(f.get(dash + 2)?);
            Some(MountEntry {
                point: PathBuf::from(OsStr::from_bytes(&point)),
                fstype: f.get(dash + 1)?.to_string(),
                source: String::from_utf8_lossy(&source).into_owned(),
            })
        })
        .collect()
}

/// The mount points, in mount order.
pub fn mountpoints() -> Vec<PathBuf> {
    mountinfo().into_iter().map(|m| m.point).collect()
}

/// The "mount source" field of every mount (e.g. `locafs:/path/to/src`).
pub fn mounted_sources() -> Vec<String> {
    mountinfo().into_iter().map(|m| m.source).collect()
}

/// Whether anything is mounted on `p` (exact path).
pub fn is_mounted(p: &Path) -> bool {
    mountinfo().iter().any(|m| m.point == p)
}

/// Whether a FUSE file system is mounted on `p`.
pub fn is_fuse_mounted(p: &Path) -> bool {
    mountinfo()
        .iter()
        .any(|m| m.point == p && m.fstype.starts_with("fuse"))
}

/// The type of the file system mounted on `p` (the top one if several are
/// stacked), if any.
pub fn mount_type(p: &Path) -> Option<String> {
    mountinfo()
        .into_iter()
        .rev()
        .find(|m| m.point == p)
        .map(|m| m.fstype)
}

/// Unmounts `p`, retrying for `patience` while it is busy, then detaches it
/// (`umount -l`); true if nothing is mounted on `p` afterwards.
pub fn unmount_within(p: &Path, patience: Duration) -> bool {
    let t0 = Instant::now();
    while is_mounted(p) {
        let _ = locafs::sys::unmount(p);
        if !is_mounted(p) {
            return true;
        }
        if t0.elapsed() >= patience {
            let _ = locafs::sys::lazy_unmount(p);
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    !is_mounted(p)
}

/// Test cleanup: unmounts `p` (lazily if it stays busy for a second).
pub fn force_unmount(p: &Path) -> bool {
    unmount_within(p, Duration::from_secs(1))
}

/// Writes dirty pages back and drops the kernel's page cache, so that
/// reads reach the daemon (or the disk) again. Needs root.
pub fn try_drop_page_cache() -> io::Result<()> {
    rustix::fs::sync();
    std::fs::write("/proc/sys/vm/drop_caches", "3")
}

/// [`try_drop_page_cache`], failing the test if it fails.
pub fn drop_page_cache() {
    try_drop_page_cache().expect("drop_caches");
}

/// A free TCP port on 127.0.0.1 (free when asked: good enough on a test box).
pub fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .map(|a| a.port())
        .expect("a free TCP port")
}

/// A free UDP port on 127.0.0.1 (free when asked: good enough on a test box).
pub fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .map(|a| a.port())
        .expect("a free UDP port")
}

/// The number at the start of the `field:` line of /proc/PID/status (kB
/// for the Vm* lines), e.g. `proc_status(pid, "VmHWM")`.
pub fn proc_status(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Peak resident memory of a process (VmHWM), in bytes.
pub fn peak_rss(pid: u32) -> Option<u64> {
    proc_status(pid, "VmHWM").map(|kb| kb * 1024)
}

/// Threads of a process.
pub fn threads(pid: u32) -> Option<u64> {
    proc_status(pid, "Threads")
}

/// Sends `sig` to process `pid`.
pub fn signal(pid: u32, sig: Signal) -> io::Result<()> {
    let pid = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    Ok(rustix::process::kill_process(pid, sig)?)
}

/// Whether process `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    let exists = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .is_some_and(|p| rustix::process::test_kill_process(p).is_ok());
    exists
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| s.contains(") Z "))
            .unwrap_or(true)
}

/// Resumes a stopped process when dropped: a failing test must not leave
/// a SIGSTOPped server with mounts over it.
pub struct ResumeOnDrop(pub u32);

impl Drop for ResumeOnDrop {
    fn drop(&mut self) {
        let _ = signal(self.0, Signal::CONT);
    }
}

/// Polls `f` every 20 ms until it holds or `limit` has passed; whether it
/// held.
pub fn wait_for(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    loop {
        if f() {
            return true;
        }
        if t0.elapsed() >= limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Like [`wait_for`], failing the test with `what` if `f` never holds.
pub fn wait_until(what: &str, limit: Duration, f: impl FnMut() -> bool) {
    assert!(
        wait_for(limit, f),
        "timed out after {limit:?} waiting for {what}"
    );
}

/// The 1-, 5- and 15-minute load averages as /proc/loadavg says them
/// ("?" if it cannot be read), for messages of tests that time out.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// The unprivileged user the multi-user tests act as (nobody).
pub const NOBODY: u32 = 65534;

/// `cmd ARGS` as user and group [`NOBODY`] with no supplementary groups
/// (`setpriv --reuid=65534 --regid=65534 --clear-groups`), or why that
/// cannot run here (not root, no setpriv).
pub fn as_nobody(cmd: impl AsRef<OsStr>) -> Result<std::process::Command, String> {
    if !rustix::process::geteuid().is_root() {
        return Err("running a command as another user needs root".into());
    }
    let setpriv = super::skip::which("setpriv").ok_or("setpriv (util-linux) is not installed")?;
    let mut c = std::process::Command::new(setpriv);
    c.args([
        format!("--reuid={NOBODY}"),
        format!("--regid={NOBODY}"),
        "--clear-groups".into(),
    ])
    .arg(cmd)
    .stdin(std::process::Stdio::null());
    Ok(c)
}

/// CPU time (user + system) process `pid` has used, from /proc/PID/stat.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces): utime and
    // stime are the 12th and 13th of them, in clock ticks.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some(Duration::from_millis(ticks * 1000 / hz))
}
