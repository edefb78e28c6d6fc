//! Real `locafs` processes: scratch directories, `locafs mount` children
//! owned by a [`Mount`] guard, `locafs stats`, and a tmpfs for a small or
//! read-only cache disk.
//!
//! Every mount is owned by a guard whose `Drop` unmounts (then detaches)
//! and kills and reaps the daemon, whatever state they are in, even when a
//! test panics.

use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::sys::{force_unmount, is_fuse_mounted, is_mounted, load_average};

/// The `locafs` binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_locafs")
}

/// A scratch directory with `src/`, `mnt/` and `cache/`, removed on drop.
pub struct Scratch {
    pub dir: tempfile::TempDir,
    pub src: PathBuf,
    pub mnt: PathBuf,
    pub cache: PathBuf,
    /// The files [`Scratch::with_sample_files`] wrote: (relative path,
    /// content).
    pub files: Vec<(String, Vec<u8>)>,
}

impl Scratch {
    pub fn new() -> Scratch {
        let dir = tempfile::Builder::new()
            .prefix("locafs-test-")
            .tempdir()
            .expect("tempdir");
        let src = dir.path().join("src");
        let mnt = dir.path().join("mnt");
        let cache = dir.path().join("cache");
        for d in [&src, &mnt, &cache] {
            fs::create_dir(d).expect("mkdir");
        }
        Scratch {
            dir,
            src,
            mnt,
            cache,
            files: Vec::new(),
        }
    }

    /// A scratch whose source holds three files: `class_a/big.bin`
    /// (3 MiB + 123 bytes), `class_a/small.txt` (4000) and `top.bin`
    /// (700 KiB).
    pub fn with_sample_files() -> Scratch {
        let mut s = Scratch::new();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for (name, len) in [
            ("class_a/big.bin", 3 * 1024 * 1024 + 123),
            ("class_a/small.txt", 4000),
            ("top.bin", 700 * 1024),
        ] {
            let data: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect();
            let p = s.src.join(name);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, &data).unwrap();
            s.files.push((name.to_string(), data));
        }
        s
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Reads every file of [`Scratch::files`] through the mount and checks
    /// its bytes.
    pub fn check_files_through_mount(&self) {
        for (name, data) in &self.files {
            let got = fs::read(self.mnt.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(got == *data, "{name}: wrong bytes through the mount");
        }
    }

    /// Starts a mount of `src` on `mnt` with the cache in `cache`.
    pub fn mount(&self, extra: &[&str]) -> Mount {
        Mount::start(&self.src, &self.mnt, &self.cache, extra)
    }

    /// The data set's directory inside the cache dir (the only one there).
    pub fn dataset_dir(&self) -> PathBuf {
        super::data::dataset_dir(&self.cache)
    }

    /// The cached data file of the version of `rel` now at the source.
    pub fn cached_data_file(&self, rel: &Path) -> PathBuf {
        super::data::cached_data_file(&self.dataset_dir(), &self.src, rel)
    }
}

impl Default for Scratch {
    fn default() -> Self {
        Self::new()
    }
}

/// Each thread of process `pid`: its name, state and where in the kernel
/// it waits (a daemon that does not exit: which thread holds it up).
fn threads_of(pid: u32) -> String {
    let mut out = String::new();
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let p = t.path();
        let read = |f: &str| fs::read_to_string(p.join(f)).unwrap_or_default();
        let stat = read("stat");
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.split(' ').next())
            .unwrap_or("?")
            .to_owned();
        out += &format!(
            "  {} {} {state} {}\n",
            t.file_name().to_string_lossy(),
            read("comm").trim(),
            read("wchan").trim()
        );
    }
    out
}

/// A running `locafs mount` and its mountpoint. Dropping it unmounts and
/// reaps the process, whatever state they are in.
pub struct Mount {
    pub child: Option<Child>,
    pub mnt: PathBuf,
    pub stderr_path: PathBuf,
    /// Whether `stderr_path` is the caller's (kept) or a temp file (removed).
    keep_stderr: bool,
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// The arguments of `locafs mount SRC MNT --cache-dir CACHE EXTRA...`.
fn mount_args(src: &Path, mnt: &Path, cache: &Path, extra: &[&str]) -> Vec<OsString> {
    let mut v: Vec<OsString> = vec![src.into(), mnt.into(), "--cache-dir".into(), cache.into()];
    v.extend(extra.iter().map(OsString::from));
    v
}

/// How long [`Mount::start_env`] waits for the mount to appear. Only a mount
/// that hangs waits this long (a daemon that exits fails at once): at load
/// 66 to 190 on the 2-core machine, gs:// mounts against fake-gcs-server did
/// not appear within 60 s, still waiting for the store's first answer.
pub const ENV_MOUNT: Duration = Duration::from_secs(180);

impl Mount {
    /// Starts `locafs mount SRC MNT --cache-dir CACHE EXTRA...` in the
    /// foreground as a child and waits (at most 20 s) until the mount shows
    /// in /proc/self/mountinfo; panics with the child's stderr if it dies.
    pub fn start(src: &Path, mnt: &Path, cache: &Path, extra: &[&str]) -> Mount {
        Mount::try_start(src, mnt, cache, extra).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Like [`Mount::start`], returning the failure instead of panicking.
    pub fn try_start(
        src: &Path,
        mnt: &Path,
        cache: &Path,
        extra: &[&str],
    ) -> Result<Mount, String> {
        let mut m = Mount::spawn_args(mnt, &mount_args(src, mnt, cache, extra), None, &[])?;
        m.wait_mounted(Duration::from_secs(20))?;
        Ok(m)
    }

    /// Like [`Mount::start`], with the daemon's stderr in `log` (kept).
    pub fn start_logged(src: &Path, mnt: &Path, cache: &Path, extra: &[&str], log: &Path) -> Mount {
        let mut m = Mount::spawn_args(mnt, &mount_args(src, mnt, cache, extra), Some(log), &[])
            .unwrap_or_else(|e| panic!("{e}"));
        m.wait_mounted(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("{e}"));
        m
    }

    /// `locafs mount ARGS` (the mountpoint `mnt` among them, or in a config
    /// file they name), waited for as [`Mount::start`] does.
    pub fn start_args(mnt: &Path, args: &[&str]) -> Mount {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        let mut m = Mount::spawn_args(mnt, &args, None, &[]).unwrap_or_else(|e| panic!("{e}"));
        m.wait_mounted(Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("{e}"));
        m
    }

    /// Like [`Mount::start`], the daemon started with umask `umask` (and
    /// its stderr in `log`, kept).
    pub fn start_umask(
        src: &Path,
        mnt: &Path,
        cache: &Path,
        extra: &[&str],
        umask: u32,
        log: &Path,
    ) -> Mount {
        let mut m = Mount::spawn_cmd(
            mnt,
            &mount_args(src, mnt, cache, extra),
            Some(log),
            &[],
            Some(umask),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        m.wait_mounted(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("{e}"));
        m
    }

    /// Starts `locafs mount SRC MNT --cache-dir CACHE EXTRA...` without
    /// waiting for anything (for a mount that is expected to fail).
    pub fn spawn(src: &Path, mnt: &Path, cache: &Path, extra: &[&str]) -> Mount {
        Mount::spawn_args(mnt, &mount_args(src, mnt, cache, extra), None, &[])
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Like [`Mount::start`], with `env` added to the daemon's environment
    /// (an object store's credentials, say), and [`ENV_MOUNT`] to mount: an
    /// object store is asked first, and an emulator on a loaded machine is
    /// slow.
    pub fn start_env(
        src: &Path,
        mnt: &Path,
        cache: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Mount {
        let mut m = Mount::spawn_args(mnt, &mount_args(src, mnt, cache, extra), None, env)
            .unwrap_or_else(|e| panic!("{e}"));
        m.wait_mounted(ENV_MOUNT).unwrap_or_else(|e| panic!("{e}"));
        m
    }

    fn spawn_args(
        mnt: &Path,
        args: &[OsString],
        log: Option<&Path>,
        env: &[(&str, &str)],
    ) -> Result<Mount, String> {
        Mount::spawn_cmd(mnt, args, log, env, None)
    }

    fn spawn_cmd(
        mnt: &Path,
        args: &[OsString],
        log: Option<&Path>,
        env: &[(&str, &str)],
        umask: Option<u32>,
    ) -> Result<Mount, String> {
        let (stderr_path, keep_stderr) = match log {
            Some(p) => (p.to_owned(), true),
            None => {
                let n = SEQ.fetch_add(1, Ordering::Relaxed);
                let name = format!("locafs-test-stderr-{}-{n}.log", std::process::id());
                (std::env::temp_dir().join(name), false)
            }
        };
        let errf = File::create(&stderr_path).map_err(|e| format!("stderr file: {e}"))?;
        let mut cmd = Command::new(bin());
        cmd.arg("mount")
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(errf);
        if let Some(mask) = umask {
            use std::os::unix::process::CommandExt;
            // SAFETY: umask is async-signal-safe and cannot fail.
            unsafe {
                cmd.pre_exec(move || {
                    libc::umask(mask as libc::mode_t);
                    Ok(())
                });
            }
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start locafs: {e}"))?;
        Ok(Mount {
            child: Some(child),
            mnt: mnt.to_owned(),
            stderr_path,
            keep_stderr,
        })
    }

    /// A guard over a holder process started some other way (the restart
    /// tests' role processes), with its stderr in `stderr_path` (removed
    /// on drop).
    pub fn adopt(child: Child, mnt: &Path, stderr_path: PathBuf) -> Mount {
        Mount {
            child: Some(child),
            mnt: mnt.to_owned(),
            stderr_path,
            keep_stderr: false,
        }
    }

    /// Waits (at most `limit`) until a FUSE mount shows on the mountpoint;
    /// an error with the daemon's stderr if it exits first or never does.
    pub fn wait_mounted(&mut self, limit: Duration) -> Result<(), String> {
        let t0 = Instant::now();
        loop {
            if is_fuse_mounted(&self.mnt) {
                return Ok(());
            }
            if let Some(st) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return Err(format!(
                    "locafs mount exited ({st}) before the mount appeared; stderr:\n{}",
                    self.stderr()
                ));
            }
            if t0.elapsed() > limit {
                return Err(format!(
                    "mount did not appear within {limit:?} (load average {}); stderr:\n{}",
                    load_average(),
                    self.stderr()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What the daemon wrote to stderr so far.
    pub fn stderr(&self) -> String {
        let mut s = Vec::new();
        if let Ok(mut f) = File::open(&self.stderr_path) {
            let _ = f.read_to_end(&mut s);
        }
        String::from_utf8_lossy(&s).into_owned()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// `locafs stats MNT --json` as JSON.
    pub fn stats(&self) -> Value {
        stats_of(&self.mnt)
    }

    /// One counter of the stats.
    pub fn stat(&self, key: &str) -> u64 {
        let v = self.stats();
        v[key]
            .as_u64()
            .unwrap_or_else(|| panic!("stats key {key} missing or not a number: {v}"))
    }

    /// Waits (at most `timeout`) for the daemon to exit, returning its status.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let t0 = Instant::now();
        while t0.elapsed() < timeout {
            if let Some(st) = self.child.as_mut()?.try_wait().ok().flatten() {
                self.child = None;
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// `umount MNT` and wait for the daemon to exit: its exit status.
    pub fn unmount(&mut self) -> ExitStatus {
        let t0 = Instant::now();
        loop {
            let out = Command::new("umount")
                .arg(&self.mnt)
                .output()
                .expect("umount");
            if out.status.success() {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "umount {:?} failed: {}",
                self.mnt,
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let pid = self.pid();
        let st = self.wait_exit(Duration::from_secs(20)).unwrap_or_else(|| {
            panic!(
                "locafs did not exit after umount; its threads:\n{}stderr:\n{}",
                pid.map(threads_of).unwrap_or_default(),
                self.stderr()
            )
        });
        assert!(!is_mounted(&self.mnt));
        st
    }

    /// SIGKILL the daemon (the mount stays, dead: ENOTCONN), reap it, then
    /// detach the dead mount.
    pub fn kill9_and_detach(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = locafs::sys::lazy_unmount(&self.mnt);
        assert!(!is_mounted(&self.mnt), "dead mount still listed");
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if is_mounted(&self.mnt) {
            let _ = locafs::sys::unmount(&self.mnt);
            if let Some(c) = self.child.as_mut() {
                // A loaded CI machine can take seconds to wind a daemon
                // down; killing it early loses its last log lines and its
                // final manifest save, which tests read afterwards.
                let t0 = Instant::now();
                while t0.elapsed() < Duration::from_secs(20) {
                    if c.try_wait().ok().flatten().is_some() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            force_unmount(&self.mnt);
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if !self.keep_stderr {
            let _ = fs::remove_file(&self.stderr_path);
        }
    }
}

/// `locafs stats MNT --json` of any mount; fails the test if it fails.
pub fn stats_of(mnt: &Path) -> Value {
    let out = Command::new(bin())
        .arg("stats")
        .arg(mnt)
        .arg("--json")
        .output()
        .expect("locafs stats");
    assert!(
        out.status.success(),
        "locafs stats failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stats JSON")
}

/// `locafs stats MNT --json`, or None if it fails (for benches).
pub fn try_stats_of(mnt: &Path) -> Option<Value> {
    let out = Command::new(bin())
        .arg("stats")
        .arg(mnt)
        .arg("--json")
        .output()
        .ok()?;
    serde_json::from_slice(&out.stdout).ok()
}

/// The stats of a mount as the library's client reads them (the
/// `user.locafs.stats` xattr); fails the test if the mount does not answer.
pub fn snapshot(mnt: &Path) -> locafs::obs::stats::StatsSnapshot {
    locafs::cli::stats::fetch(mnt).unwrap_or_else(|e| panic!("stats of {}: {e}", mnt.display()))
}

/// Whether the mount at `mnt` answers `locafs stats` (it is up).
pub fn answers_stats(mnt: &Path) -> bool {
    locafs::cli::stats::fetch(mnt).is_ok()
}

/// Runs `locafs ARGS` to completion (killed after 120 s: longer than the
/// 30 s `--metadata-timeout` the object-store tests give a slow emulator,
/// so a command that is only slow is not taken for one that hangs).
pub fn run_locafs(args: &[&OsStr]) -> Output {
    run_locafs_env(args, &[])
}

/// [`run_locafs`] with `env` added to (or replacing part of) the
/// environment.
pub fn run_locafs_env(args: &[&OsStr], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(bin())
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn locafs");
    let t0 = Instant::now();
    while c.try_wait().ok().flatten().is_none() {
        if t0.elapsed() > Duration::from_secs(120) {
            let _ = c.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    c.wait_with_output().expect("wait locafs")
}

/// A small tmpfs (mode 0700) mounted on a directory, unmounted on drop.
pub struct Tmpfs {
    pub path: PathBuf,
}

impl Tmpfs {
    pub fn mount(path: &Path, size: &str) -> Tmpfs {
        fs::create_dir_all(path).expect("mkdir tmpfs dir");
        let st = Command::new("mount")
            // 0700, as an admin makes a cache disk (a tmpfs is 1777
            // otherwise, and locafs refuses one others may write once it
            // holds anything).
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(path)
            .status()
            .expect("mount tmpfs");
        assert!(st.success(), "mount -t tmpfs failed");
        Tmpfs {
            path: path.to_owned(),
        }
    }

    pub fn remount_ro(&self) {
        let st = Command::new("mount")
            .args(["-o", "remount,ro"])
            .arg(&self.path)
            .status()
            .expect("remount");
        assert!(st.success(), "mount -o remount,ro failed");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        force_unmount(&self.path);
    }
}
