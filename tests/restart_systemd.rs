//! `systemctl restart locafs@...` keeps the mount: the daemon keeps its
//! descriptors (the FUSE connection's, the shared state, the lock) in
//! systemd's file descriptor store, and on SIGTERM with a restart of its
//! unit queued it leaves the mount to the daemon systemd starts next,
//! which gets them back (LISTEN_FDS) and serves on: readers see no failed
//! read. With no restart queued (`systemctl stop`) it unmounts and empties
//! the store. This test plays systemd: the notify socket (receiving the
//! descriptors), socket activation's environment for the next daemon,
//! `systemctl list-jobs` (a script first in PATH), and the unit's cgroup
//! (a cgroup of its own in the unified hierarchy, named like a unit, that
//! the daemons start in and that is removed at the end).

mod common;

use std::collections::BTreeMap;
use std::io::IoSliceMut;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::restart::server_pid;
use common::*;

/// What systemd keeps: the descriptors stored, by name.
#[derive(Default)]
struct FdStore {
    fds: BTreeMap<String, Vec<OwnedFd>>,
    /// How many FDSTORE=1 messages came.
    stores: usize,
}

impl FdStore {
    /// Receives messages until one that is not about the store; returns it.
    fn recv_until_other(&mut self, sock: &UnixDatagram) -> Option<String> {
        use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
        loop {
            let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(300))];
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let mut buf = vec![0u8; 4096];
            let mut iov = [IoSliceMut::new(&mut buf)];
            let r =
                rustix::net::recvmsg(sock, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC).ok()?;
            let text = String::from_utf8_lossy(&buf[..r.bytes]).into_owned();
            let mut fds = Vec::new();
            for m in control.drain() {
                if let RecvAncillaryMessage::ScmRights(it) = m {
                    fds.extend(it);
                }
            }
            let name = text
                .lines()
                .find_map(|l| l.strip_prefix("FDNAME="))
                .unwrap_or("stored")
                .to_string();
            if text.contains("FDSTOREREMOVE=1") {
                self.fds.remove(&name);
            } else if text.contains("FDSTORE=1") {
                self.stores += 1;
                self.fds.entry(name).or_default().extend(fds);
            } else {
                return Some(text);
            }
        }
    }

    fn count(&self) -> usize {
        self.fds.values().map(Vec::len).sum()
    }
}

/// Where cgroup v2 is mounted here (the unified hierarchy).
fn cgroup2_root() -> Option<std::path::PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts.lines().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        (f.len() > 2 && f[2] == "cgroup2").then(|| f[1].into())
    })
}

/// The unit's cgroup: a directory of the unified hierarchy named like a
/// unit, removed when dropped (once its processes are gone).
struct UnitCgroup {
    dir: std::path::PathBuf,
    procs: std::ffi::CString,
}

impl UnitCgroup {
    fn create() -> Result<UnitCgroup, String> {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let root = cgroup2_root().ok_or("no cgroup2 hierarchy mounted")?;
        let name = format!(
            "locafs-test-{}-{}@restart.service",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let dir = root.join(name);
        std::fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        let procs = std::ffi::CString::new(dir.join("cgroup.procs").into_os_string().into_vec())
            .map_err(|e| e.to_string())?;
        Ok(UnitCgroup { dir, procs })
    }
}

impl Drop for UnitCgroup {
    fn drop(&mut self) {
        // (the daemons and their servers exit first; wait for the kernel
        // to see them gone)
        let _ = wait_for(Duration::from_secs(10), || {
            std::fs::read_to_string(self.dir.join("cgroup.procs"))
                .is_ok_and(|t| t.trim().is_empty())
        });
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Starts `locafs mount --config CONF` as systemd would: in the unit's
/// cgroup, NOTIFY_SOCKET, PATH with the fake systemctl first, and the
/// stored descriptors as LISTEN_FDS (at 3, 4, ...) with their names in
/// LISTEN_FDNAMES.
fn start(conf: &Path, notify: &Path, fake_bin: &Path, store: &FdStore, unit: &UnitCgroup) -> Child {
    let procs = unit.procs.clone();
    let mut names = Vec::new();
    let mut raw = Vec::new();
    for (name, fds) in &store.fds {
        for f in fds {
            names.push(name.clone());
            raw.push(f.as_raw_fd());
        }
    }
    let path = format!(
        "{}:{}",
        fake_bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut c = Command::new("sh");
    // LISTEN_PID and SYSTEMD_EXEC_PID are the daemon's own pid: sh's,
    // which exec keeps.
    c.arg("-c")
        .arg(format!(
            "LISTEN_PID=$$ SYSTEMD_EXEC_PID=$$ exec {} mount --config {}",
            bin(),
            conf.display()
        ))
        .env("NOTIFY_SOCKET", notify)
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if !raw.is_empty() {
        c.env("LISTEN_FDS", raw.len().to_string())
            .env("LISTEN_FDNAMES", names.join(":"));
    }
    // SAFETY: between fork and exec: this process joins the unit's
    // cgroup (open and write of a path made before the fork), then dup2
    // of descriptors we own to 3.., which the daemon inherits.
    unsafe {
        c.pre_exec(move || {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                return Err(std::io::Error::last_os_error());
            }
            libc::close(fd);
            // (first out of the way of 3.., then into place)
            let high: Vec<i32> = raw
                .iter()
                .map(|fd| libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 1000))
                .collect();
            for (i, fd) in high.iter().enumerate() {
                if libc::dup2(*fd, 3 + i as i32) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    c.spawn().unwrap()
}

/// What a test plays systemd with: the unit's cgroup, its configuration
/// file (with `extra` lines), `systemctl list-jobs` (a restart job of
/// whatever unit asks while `flag` exists) and the notify socket.
struct Systemd {
    sc: Scratch,
    log: std::path::PathBuf,
    conf: std::path::PathBuf,
    fake_bin: std::path::PathBuf,
    flag: std::path::PathBuf,
    notify_path: std::path::PathBuf,
    notify: UnixDatagram,
    /// (last: removed once the daemons are gone)
    unit: UnitCgroup,
}

impl Systemd {
    fn new(extra: &str) -> Result<Systemd, String> {
        let unit = UnitCgroup::create()?;
        let sc = Scratch::new();
        let log = sc.dir.path().join("log.txt");
        let conf = sc.dir.path().join("unit.toml");
        let s = Systemd {
            log,
            fake_bin: sc.dir.path().join("bin"),
            flag: sc.dir.path().join("restart-queued"),
            notify_path: sc.dir.path().join("notify.sock"),
            notify: UnixDatagram::unbound().unwrap(),
            conf,
            unit,
            sc,
        };
        s.configure(extra);
        std::fs::create_dir(&s.fake_bin).unwrap();
        let systemctl = s.fake_bin.join("systemctl");
        std::fs::write(
            &systemctl,
            format!(
                "#!/bin/sh\n[ -e {} ] || exit 0\nunit=$(basename \"$(sed -n 's/^0:://p' /proc/$PPID/cgroup)\")\necho \"42 $unit restart running\"\n",
                s.flag.display()
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&systemctl, std::fs::Permissions::from_mode(0o755)).unwrap();
        let notify = UnixDatagram::bind(&s.notify_path).unwrap();
        notify
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        Ok(Systemd { notify, ..s })
    }

    /// Writes the unit's configuration file, with `extra` lines.
    fn configure(&self, extra: &str) {
        std::fs::write(
            &self.conf,
            format!(
                "source = \"{}\"\nmountpoint = \"{}\"\ncache-dir = \"{}\"\nlog-file = \"{}\"\n{extra}",
                self.sc.src.display(),
                self.sc.mnt.display(),
                self.sc.cache.display(),
                self.log.display()
            ),
        )
        .unwrap();
    }

    fn start(&self, store: &FdStore) -> Child {
        start(
            &self.conf,
            &self.notify_path,
            &self.fake_bin,
            store,
            &self.unit,
        )
    }
}

#[test]
fn a_restart_of_the_unit_keeps_the_mount_and_a_stop_unmounts() {
    require_fuse!();
    let sd = match Systemd::new("") {
        Ok(u) => u,
        Err(e) => skip!("a unit's cgroup cannot be made here: {e}"),
    };
    let Systemd {
        sc,
        log,
        flag,
        notify,
        ..
    } = &sd;
    let files: Vec<(String, Vec<u8>)> = (0..20u64)
        .map(|i| {
            (
                format!("f{i:02}.bin"),
                pattern(i, 40_000 + 30_000 * i as usize),
            )
        })
        .collect();
    for (n, d) in &files {
        std::fs::write(sc.src.join(n), d).unwrap();
    }
    let mut store = FdStore::default();

    let mut first = sd.start(&store);
    assert_eq!(store.recv_until_other(notify).as_deref(), Some("READY=1"));
    // The state, the lock and the FUSE descriptors (8: --fuse-threads).
    assert_eq!(store.fds["locafs-state"].len(), 1);
    assert_eq!(store.fds["locafs-lock"].len(), 1);
    assert_eq!(store.fds["locafs-fuse"].len(), 8);
    let before = server_pid(&sc.mnt).unwrap();

    // Readers all through the restart.
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..4)
        .map(|t| {
            let (stop, mnt, files) = (Arc::clone(&stop), sc.mnt.clone(), files.clone());
            std::thread::spawn(move || {
                let (mut bad, mut n, mut i) = (Vec::new(), 0, t);
                while !stop.load(Ordering::Relaxed) {
                    let (name, want) = &files[i % files.len()];
                    i += 1;
                    match std::fs::read(mnt.join(name)) {
                        Ok(got) if got == *want => n += 1,
                        Ok(_) => bad.push(format!("{name}: wrong bytes")),
                        Err(e) => bad.push(format!("{name}: {e}")),
                    }
                }
                (bad, n)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));

    // systemctl restart: a restart job is queued, SIGTERM, then the next
    // daemon with the store.
    std::fs::write(flag, b"").unwrap();
    signal(first.id(), Signal::TERM).unwrap();
    assert_eq!(
        store.recv_until_other(notify).as_deref(),
        Some("STOPPING=1")
    );
    assert!(
        wait_for(Duration::from_secs(20), || first
            .try_wait()
            .ok()
            .flatten()
            .is_some()),
        "the daemon did not exit"
    );
    assert_eq!(first.wait().unwrap().code(), Some(0));
    assert_eq!(
        mount_type(&sc.mnt).as_deref(),
        Some("fuse.locafs"),
        "unmounted on restart"
    );
    std::fs::remove_file(flag).unwrap();
    let stores = store.stores;
    let mut second = sd.start(&store);
    assert_eq!(store.recv_until_other(notify).as_deref(), Some("READY=1"));
    // What systemd passed stays in its store: nothing taken out and stored
    // again.
    assert_eq!(
        store.stores, stores,
        "the new daemon stored its descriptors again"
    );
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let (mut bad, mut reads) = (Vec::new(), 0);
    for r in readers {
        let (b, n) = r.join().unwrap();
        bad.extend(b);
        reads += n;
    }
    let log_text = std::fs::read_to_string(log).unwrap_or_default();
    eprintln!("{reads} reads through the restart");
    assert!(bad.is_empty(), "{bad:#?}\n{log_text}");
    let st = stats_of(&sc.mnt);
    assert_ne!(st["pid"], before);
    assert_eq!(st["supervisor_pid"], second.id(), "{st}");
    assert_eq!(st["restarts"], 1, "{st}");
    assert!(
        log_text.contains("stays mounted for the next holder"),
        "{log_text}"
    );
    assert!(
        log_text.contains("serving on the mount that systemd kept"),
        "{log_text}"
    );
    assert_eq!(
        store.fds["locafs-fuse"].len(),
        8,
        "kept in the store for the new daemon"
    );

    // systemctl stop: no restart queued: unmount, the store emptied.
    signal(second.id(), Signal::TERM).unwrap();
    assert_eq!(
        store.recv_until_other(notify).as_deref(),
        Some("STOPPING=1")
    );
    assert!(wait_for(Duration::from_secs(20), || second
        .try_wait()
        .ok()
        .flatten()
        .is_some()));
    assert_eq!(second.wait().unwrap().code(), Some(0));
    assert!(mount_type(&sc.mnt).is_none(), "still mounted after stop");
    // (what is left in the notify socket's queue)
    notify
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let _ = store.recv_until_other(notify);
    assert_eq!(store.count(), 0, "the store still holds descriptors");
    force_unmount(&sc.mnt);
}

/// `systemctl restart` after the unit's options changed where a live mount
/// cannot change (the block size): the daemon systemd starts next gets the
/// stored mount, unmounts it and mounts the data set again, with the new
/// options. (It did exit 2 with the mount gone: the stored lock descriptor
/// it still held refused the data set's lock to its own new mount.)
#[test]
fn a_restart_with_options_the_live_mount_cannot_take_mounts_it_again() {
    require_fuse!();
    let sd = match Systemd::new("") {
        Ok(u) => u,
        Err(e) => skip!("a unit's cgroup cannot be made here: {e}"),
    };
    let data = pattern(7, 300_000);
    std::fs::write(sd.sc.src.join("a.bin"), &data).unwrap();
    let mut store = FdStore::default();
    let mut first = sd.start(&store);
    assert_eq!(
        store.recv_until_other(&sd.notify).as_deref(),
        Some("READY=1")
    );
    assert_eq!(std::fs::read(sd.sc.mnt.join("a.bin")).unwrap(), data);

    std::fs::write(&sd.flag, b"").unwrap();
    signal(first.id(), Signal::TERM).unwrap();
    assert_eq!(
        store.recv_until_other(&sd.notify).as_deref(),
        Some("STOPPING=1")
    );
    assert!(wait_for(Duration::from_secs(20), || first
        .try_wait()
        .ok()
        .flatten()
        .is_some()));
    assert_eq!(first.wait().unwrap().code(), Some(0));
    assert_eq!(mount_type(&sd.sc.mnt).as_deref(), Some("fuse.locafs"));
    std::fs::remove_file(&sd.flag).unwrap();

    sd.configure("block-size = \"4MiB\"\n");
    let mut second = sd.start(&store);
    let said = store.recv_until_other(&sd.notify);
    let log_text = std::fs::read_to_string(&sd.log).unwrap_or_default();
    assert_eq!(
        said.as_deref(),
        Some("READY=1"),
        "exit {:?}\n{log_text}",
        second.try_wait()
    );
    assert!(
        log_text.contains("the mount systemd kept cannot be served"),
        "{log_text}"
    );
    assert_eq!(std::fs::read(sd.sc.mnt.join("a.bin")).unwrap(), data);
    let st = stats_of(&sd.sc.mnt);
    assert_eq!(st["supervisor_pid"], second.id(), "{st}");
    assert_eq!(
        store.fds.get("locafs-lock").map(Vec::len),
        Some(1),
        "the new mount's lock stored"
    );

    signal(second.id(), Signal::TERM).unwrap();
    assert_eq!(
        store.recv_until_other(&sd.notify).as_deref(),
        Some("STOPPING=1")
    );
    assert!(wait_for(Duration::from_secs(20), || second
        .try_wait()
        .ok()
        .flatten()
        .is_some()));
    assert_eq!(second.wait().unwrap().code(), Some(0));
    assert!(mount_type(&sd.sc.mnt).is_none(), "still mounted after stop");
    force_unmount(&sd.sc.mnt);
}
