//! A restart after a crash, exactly as docs/operations.md promises it:
//! `locafs mount SRC MNT --daemon`, `ls -la MNT`, `stat MNT`, `kill -9` of
//! the daemon, then the same command mounts again at once over the same
//! cache (the kernel still answers `stat` from the attributes it cached, so
//! the dead mount is recognised by what it cannot cache: `dead_mount`).
//! And what a restart must leave alone: a locafs mount whose daemon is
//! stopped (reported, exit 2, without hanging), a live locafs mount (the
//! same command takes it over, without taking it away; another data set
//! is refused), and a mount of another type.
//!
//! The same through systemd's `Restart=on-failure` is in tests/ops_systemd.rs.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// `locafs mount SRC MNT --cache-dir CACHE --daemon` as a user types it.
fn mount_daemon(sc: &Scratch) -> Output {
    Command::new(bin())
        .arg("mount")
        .arg(&sc.src)
        .arg(&sc.mnt)
        .arg("--cache-dir")
        .arg(&sc.cache)
        .arg("--daemon")
        .stdin(Stdio::null())
        .output()
        .expect("locafs mount")
}

/// The pid the mount's lock records: the daemon.
fn daemon_pid(sc: &Scratch) -> u32 {
    let lock = sc.dataset_dir().join("lock");
    std::fs::read_to_string(&lock)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no pid in {}", lock.display()))
}

/// Cleans up after a `--daemon` mount whatever happened: resumes, kills
/// and detaches.
struct Daemons<'a> {
    mnt: &'a Path,
    pids: Vec<u32>,
}

impl Drop for Daemons<'_> {
    fn drop(&mut self) {
        for &pid in &self.pids {
            let _ = signal(pid, Signal::CONT);
        }
        force_unmount(self.mnt);
        for &pid in &self.pids {
            let _ = signal(pid, Signal::KILL);
        }
        force_unmount(self.mnt);
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn run(cmd: &str, arg: &Path) -> Output {
    Command::new(cmd).arg(arg).output().expect(cmd)
}

#[test]
fn the_same_command_mounts_again_at_once_after_kill_9() {
    require_fuse!();
    let sc = Scratch::with_sample_files();
    let mut guard = Daemons {
        mnt: &sc.mnt,
        pids: vec![],
    };
    let out = mount_daemon(&sc);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let pid = daemon_pid(&sc);
    guard.pids.push(pid);
    // What a user does with a fresh mount: the kernel now holds the root's
    // attributes (and the entries') for the --revalidate time.
    assert!(run("ls", &sc.mnt).status.success());
    assert!(Command::new("ls")
        .arg("-la")
        .arg(&sc.mnt)
        .status()
        .unwrap()
        .success());
    assert!(run("stat", &sc.mnt).status.success());
    sc.check_files_through_mount();
    // Cache writes trail the reads: wait until every file is in the cache
    // (what the kill must not lose).
    wait_until("every file cached", Duration::from_secs(20), || {
        stats_of(&sc.mnt)["files_cached"] == 3
    });

    signal(pid, Signal::KILL).unwrap();
    wait_until("the daemon to die", Duration::from_secs(10), || !alive(pid));
    assert_eq!(mount_type(&sc.mnt).as_deref(), Some("fuse.locafs"));
    // The connection is gone (once the last of the daemon's threads is):
    // what must reach the daemon fails.
    wait_until("the connection to go", Duration::from_secs(10), || {
        rustix::fs::statfs(&sc.mnt).err() == Some(rustix::io::Errno::NOTCONN)
    });

    // The same command: it mounts at once, the first time (before the
    // fix it failed with "something is already mounted there" for as
    // long as the kernel trusted the cached attributes, about 65 s).
    let t0 = Instant::now();
    let out = mount_daemon(&sc);
    let took = t0.elapsed();
    let err = text(&out.stderr);
    assert!(out.status.success(), "restart failed: {err}");
    assert!(
        err.contains("detached a dead locafs mount left by a daemon that died"),
        "{err}"
    );
    let pid2 = daemon_pid(&sc);
    guard.pids.push(pid2);
    assert_ne!(pid2, pid);
    assert_eq!(mount_type(&sc.mnt).as_deref(), Some("fuse.locafs"));
    // One mount, not one over the other.
    let stacked = mountinfo().iter().filter(|m| m.point == sc.mnt).count();
    assert_eq!(stacked, 1);
    sc.check_files_through_mount();
    // Over the same cache: nothing came from the source again.
    let v = stats_of(&sc.mnt);
    assert_eq!(v["source_bytes"], 0, "{v}");
    // A bound far from what it takes (well under a second here): the
    // point is that it does not wait for the kernel's caches to expire.
    assert!(took < Duration::from_secs(30), "{took:?}");

    // And a clean unmount ends the daemon.
    assert!(run("umount", &sc.mnt).status.success());
    wait_until("the daemon to exit", Duration::from_secs(20), || {
        !alive(pid2)
    });
}

#[test]
fn a_stopped_daemon_is_reported_and_left_alone() {
    require_fuse!();
    let sc = Scratch::with_sample_files();
    let mut guard = Daemons {
        mnt: &sc.mnt,
        pids: vec![],
    };
    let out = mount_daemon(&sc);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let pid = daemon_pid(&sc);
    guard.pids.push(pid);
    assert!(run("stat", &sc.mnt).status.success());

    // The daemon is the mount's holder (its serving process goes on
    // answering: the mount is alive, and the same command asks the holder
    // for a takeover, which it cannot answer).
    signal(pid, Signal::STOP).unwrap();
    let _resume = ResumeOnDrop(pid);
    // The same command must neither hang on the stopped daemon nor take
    // its mount away: exit 2 and what it found. (Run in a thread so that a
    // hang fails the test instead of blocking it.)
    let child = Command::new(bin())
        .arg("mount")
        .args([&sc.src, &sc.mnt])
        .arg("--cache-dir")
        .arg(&sc.cache)
        .arg("--daemon")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let cpid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let mut where_ = String::new();
            for t in std::fs::read_dir(format!("/proc/{cpid}/task"))
                .into_iter()
                .flatten()
                .flatten()
            {
                let p = t.path();
                where_ += &format!(
                    "{}: {} {}\n",
                    p.display(),
                    std::fs::read_to_string(p.join("wchan")).unwrap_or_default(),
                    std::fs::read_to_string(p.join("stack")).unwrap_or_default()
                );
            }
            let _ = signal(cpid, Signal::KILL);
            panic!("locafs mount hung on a stopped daemon's mount:\n{where_}");
        }
    };
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("does not answer"), "{err}");
    signal(pid, Signal::CONT).unwrap();
    // Its mount is still there and serves again.
    assert_eq!(mount_type(&sc.mnt).as_deref(), Some("fuse.locafs"));
    sc.check_files_through_mount();
    assert!(alive(pid));
}

#[test]
fn a_live_mount_and_other_mounts_are_not_touched() {
    require_fuse!();
    let sc = Scratch::with_sample_files();
    let mut guard = Daemons {
        mnt: &sc.mnt,
        pids: vec![],
    };
    let out = mount_daemon(&sc);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let pid = daemon_pid(&sc);
    guard.pids.push(pid);
    // The same command over the live mount takes it over (issue 35: an
    // upgrade or new options): the mount is never taken away, the daemon
    // before hands it over and exits.
    let out = mount_daemon(&sc);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // (the lock file still names the holder that took the lock: the lock
    // itself was handed over)
    let pid2 = stats_of(&sc.mnt)["supervisor_pid"].as_u64().unwrap() as u32;
    guard.pids.push(pid2);
    assert_ne!(pid2, pid);
    wait_until("the daemon before to exit", Duration::from_secs(20), || {
        !alive(pid)
    });
    assert_eq!(mount_type(&sc.mnt).as_deref(), Some("fuse.locafs"));
    let stacked = mountinfo().iter().filter(|m| m.point == sc.mnt).count();
    assert_eq!(stacked, 1);
    sc.check_files_through_mount();
    // Another data set (another cache) over it is refused (its holder is
    // not this mount's), and the mount is untouched.
    let other_cache = sc.dir.path().join("other-cache");
    let out = Command::new(bin())
        .arg("mount")
        .arg(&sc.src)
        .arg(&sc.mnt)
        .arg("--cache-dir")
        .arg(&other_cache)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("a locafs mount is live there"),
        "{}",
        text(&out.stderr)
    );
    assert!(alive(pid2));
    sc.check_files_through_mount();
    drop(guard);

    // A tmpfs: not locafs's, never detached.
    let other: PathBuf = sc.dir.path().join("other");
    let _t = Tmpfs::mount(&other, "1M");
    let out = Command::new(bin())
        .arg("mount")
        .arg(&sc.src)
        .arg(&other)
        .arg("--cache-dir")
        .arg(&sc.cache)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert_eq!(mount_type(&other).as_deref(), Some("tmpfs"));
}
