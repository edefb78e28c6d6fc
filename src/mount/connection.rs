//! The FUSE connection of a mount as the process that holds it sees it:
//! the mount(2) and the INIT handshake (once per mount, through fuser's
//! `Session::new` with a file system that only negotiates), the
//! descriptors servers read requests from (the connection's own and
//! clones made with `FUSE_DEV_IOC_CLONE`, every one kept open here so that
//! the kernel aborts none of the requests a dying server had taken), the
//! request to send those again (`FUSE_NOTIFY_RESEND`), and the
//! connection's control files under /sys/fs/fuse/connections.
//!
//! It never reads a request and never looks at the mountpoint through the
//! mount (a request there would wait on the server being replaced).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use fuser::{Filesystem, KernelConfig, Request};

use crate::mount::config::MountConfig;

/// `FUSE_DEV_IOC_CLONE`: `_IOR(229, 0, uint32_t)`.
const FUSE_DEV_IOC_CLONE: libc::c_ulong = 0x8004_e500;
/// `enum fuse_notify_code`: FUSE_NOTIFY_RESEND (protocol 7.40, Linux 6.9).
const FUSE_NOTIFY_RESEND: i32 = 7;
/// The protocol minor version that has [`FUSE_NOTIFY_RESEND`].
pub const RESEND_MINOR: u32 = 40;
/// Where the kernel lists FUSE connections (fusectl).
pub const FUSECTL: &str = "/sys/fs/fuse/connections";

/// What INIT settled: the `shm::INIT_*` bits and the kernel's minor
/// version.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Settled {
    pub granted: u64,
    pub minor: u32,
}

/// The file system the holder mounts with: it answers INIT and nothing
/// else (its session never runs; servers read the requests).
struct Negotiator {
    passthrough: bool,
    kernel_open: bool,
    /// Whether the kernel is to enforce the source's POSIX ACLs (a
    /// directory source: its entries can carry them; an object store's
    /// cannot).
    posix_acl: bool,
    settled: std::sync::Arc<parking_lot::Mutex<Settled>>,
}

impl Filesystem for Negotiator {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let granted =
            crate::fs::fuse::negotiate(config, self.passthrough, self.kernel_open, self.posix_acl);
        *self.settled.lock() = Settled {
            granted,
            minor: config.kernel_abi().1,
        };
        Ok(())
    }
}

/// A live FUSE connection and the descriptors that keep it alive.
pub struct Connection {
    /// The mount made here (dropping it unmounts); None for a connection
    /// taken over from another holder.
    session: Option<fuser::Session<Negotiator>>,
    /// The connection's own descriptor, then its clones: servers read from
    /// the first `fuse_threads` of them.
    fds: Vec<OwnedFd>,
    pub settled: Settled,
    pub mountpoint: PathBuf,
}

impl Connection {
    /// Mounts `cfg`'s mountpoint and answers INIT: a connection with no
    /// server yet (requests wait in the kernel until one reads them).
    pub fn mount(cfg: &MountConfig) -> io::Result<Connection> {
        let mut fuse_cfg = fuser::Config::default();
        fuse_cfg.mount_options = vec![
            fuser::MountOption::FSName(format!("locafs:{}", cfg.source.display())),
            // fuser's own mount(2) drops MountOption::Subtype; the kernel
            // takes it as an option, so the type reads "fuse.locafs"
            // (mount -t, findmnt).
            fuser::MountOption::CUSTOM("subtype=locafs".into()),
            fuser::MountOption::RO,
            fuser::MountOption::DefaultPermissions,
            fuser::MountOption::NoDev,
            fuser::MountOption::NoSuid,
        ];
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            fuse_cfg.acl = fuser::SessionACL::All;
        }
        let settled = std::sync::Arc::default();
        let fs = Negotiator {
            passthrough: cfg.passthrough,
            kernel_open: cfg.open_mode == crate::mount::config::OpenMode::Kernel,
            posix_acl: cfg.object.is_none(),
            settled: std::sync::Arc::clone(&settled),
        };
        let session = fuser::Session::new(fs, &cfg.mountpoint, &fuse_cfg)?;
        let own = rustix::io::fcntl_dupfd_cloexec(session.as_fd(), 0)?;
        let settled = *settled.lock();
        Ok(Connection {
            session: Some(session),
            fds: vec![own],
            settled,
            mountpoint: cfg.mountpoint.clone(),
        })
    }

    /// A connection another holder made (a takeover): its descriptors,
    /// what its INIT settled, and where it is mounted.
    pub fn adopt(fds: Vec<OwnedFd>, settled: Settled, mountpoint: PathBuf) -> Connection {
        Connection {
            session: None,
            fds,
            settled,
            mountpoint,
        }
    }

    /// Every descriptor held (the connection's own first).
    pub fn fds(&self) -> &[OwnedFd] {
        &self.fds
    }

    /// `n` descriptors for a server to read from (at least one), cloning
    /// the connection's as needed; the clones stay held here too.
    pub fn server_fds(&mut self, n: usize) -> io::Result<Vec<BorrowedFd<'_>>> {
        let n = n.max(1);
        while self.fds.len() < n {
            let c = clone_fd(self.fds[0].as_fd())?;
            self.fds.push(c);
        }
        Ok(self.fds[..n].iter().map(|f| f.as_fd()).collect())
    }

    /// Whether the kernel can send again the requests a dead server took.
    pub fn can_resend(&self) -> bool {
        self.settled.minor >= RESEND_MINOR
    }

    /// The connection's number in /sys/fs/fuse/connections (the minor of
    /// the mount's anonymous device), from /proc/self/mountinfo.
    pub fn number(&self) -> Option<u32> {
        connection_number(&self.mountpoint)
    }

    /// Whether the connection is still there: not ended (its last mount
    /// gone and its files closed) nor aborted. While it is, the device
    /// number of its mounts is its own: a mount of another file system
    /// cannot have it (the kernel gives a freed number again at once).
    pub fn alive(&self) -> bool {
        let Some(fd) = self.fds.first() else {
            return false;
        };
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd on our own descriptor, no wait.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n >= 0 && p.revents & (libc::POLLERR | libc::POLLNVAL) == 0
    }

    /// Unmounts (lazily if busy); the connection ends once nothing holds
    /// it.
    pub fn unmount(&mut self) -> io::Result<()> {
        let r = match crate::sys::unmount(&self.mountpoint) {
            // (not root: fuser's session unmounts through fusermount)
            Err(e) if e.raw_os_error() == Some(libc::EPERM) && self.session.is_some() => {
                self.session.as_mut().map_or(Ok(()), |s| s.unmount())
            }
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                tracing::warn!(
                    "{} is busy: detaching it (open files get errors from now on)",
                    self.mountpoint.display()
                );
                crate::sys::lazy_unmount(&self.mountpoint)
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
            r => r,
        };
        if let Some(mut s) = self.session.take() {
            // (already unmounted above: this only forgets fuser's mount,
            // or unmounts through fusermount where mount(2) was not ours)
            let _ = s.unmount();
        }
        r
    }

    /// Ends the connection now: every request waiting gets an error
    /// (ENOTCONN), so that no reader waits on a mount nobody serves.
    pub fn abort(&self) {
        if let Some(n) = self.number() {
            let _ = std::fs::write(Path::new(FUSECTL).join(n.to_string()).join("abort"), b"1");
        }
    }

    /// Gives up the mount without unmounting it: for a holder that hands
    /// it to another (the descriptors go with it).
    pub fn release(mut self) -> Vec<OwnedFd> {
        if let Some(s) = self.session.take() {
            // fuser's session would unmount on drop.
            std::mem::forget(s);
        }
        std::mem::take(&mut self.fds)
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            // Unmounting is `unmount`'s job, called on purpose; a drop
            // (a panic, a takeover) leaves the mount to whoever holds the
            // descriptors.
            std::mem::forget(s);
        }
    }
}

/// A new descriptor reading the same connection as `fd`.
pub fn clone_fd(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let dev = File::options().read(true).write(true).open("/dev/fuse")?;
    let mut source = fd.as_raw_fd() as u32;
    // SAFETY: an ioctl on our descriptor with a pointer to a u32 that
    // outlives the call.
    let r = unsafe { libc::ioctl(dev.as_raw_fd(), FUSE_DEV_IOC_CLONE, &mut source as *mut u32) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(OwnedFd::from(dev))
}

/// Asks the kernel to send again every request a server read and did not
/// answer (`FUSE_NOTIFY_RESEND`): they go back to the head of the queue,
/// with `FUSE_UNIQUE_RESEND` set in their ids. An error on a kernel older
/// than 6.9 (EINVAL).
pub fn notify_resend(fd: BorrowedFd<'_>) -> io::Result<()> {
    // struct fuse_out_header { u32 len; i32 error; u64 unique; }: unique 0
    // is a notification, `error` its code.
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&16u32.to_ne_bytes());
    h[4..8].copy_from_slice(&FUSE_NOTIFY_RESEND.to_ne_bytes());
    let n = rustix::io::write(fd, &h)?;
    if n != h.len() {
        return Err(io::Error::other("short write of FUSE_NOTIFY_RESEND"));
    }
    Ok(())
}

/// The number of the FUSE connection mounted on `mountpoint` (the minor
/// of its device, as /proc/self/mountinfo gives it), if it is one.
pub fn connection_number(mountpoint: &Path) -> Option<u32> {
    let line = crate::sys::mountinfo_line(mountpoint)?;
    let dev = line.split(' ').nth(2)?;
    let (major, minor) = dev.split_once(':')?;
    (major == "0").then(|| minor.parse().ok()).flatten()
}

/// Every mountpoint of FUSE connection `n` in this mount namespace (the
/// mount a holder made, and the bind mounts of it a second `locafs mount`
/// of the data set made: they share the connection's device), in the
/// order of /proc/self/mountinfo. Only while the connection is alive
/// ([`Connection::alive`]) are these its own: once it ended, the number
/// may be another mount's.
pub fn mountpoints_of(n: u32) -> Vec<PathBuf> {
    let dev = format!("0:{n}");
    crate::sys::mounts()
        .into_iter()
        .filter(|m| m.dev == dev && m.fstype.starts_with("fuse"))
        .map(|m| m.mountpoint)
        .collect()
}

/// Requests the kernel holds for connection `n` now (sent to a server and
/// not answered, or waiting to be read), if fusectl is mounted.
pub fn waiting(n: u32) -> Option<u64> {
    std::fs::read_to_string(Path::new(FUSECTL).join(n.to_string()).join("waiting"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Mounts fusectl on /sys/fs/fuse/connections if it is not there (root
/// only; systemd mounts it at boot on most systems). Whether it is there.
pub fn ensure_fusectl() -> bool {
    if crate::sys::is_mountpoint(Path::new(FUSECTL)) {
        return true;
    }
    rustix::mount::mount(
        "fusectl",
        FUSECTL,
        "fusectl",
        rustix::mount::MountFlags::empty(),
        None,
    )
    .is_ok()
}
