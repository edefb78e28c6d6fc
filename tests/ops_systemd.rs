//! The systemd side: the shipped `locafs@.service` passes
//! `systemd-analyze verify`, and the daemon keeps the unit's contract when
//! run the way the unit runs it (`locafs mount --config NAME.toml` with the
//! source and mountpoint in the file, NOTIFY_SOCKET set): READY=1 only once
//! the mount is live, STOPPING=1 and a clean unmount with exit 0 on SIGTERM,
//! and after a crash (SIGKILL) a restart over the dead mount and the same
//! cache works. And the unit itself under a real systemd (a `systemd
//! --user` manager in a mount namespace of its own, as systemd is not PID 1
//! here): Restart=on-failure brings a killed daemon's mount back.

mod common;

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

#[test]
fn unit_passes_systemd_analyze_verify() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        skip!("systemd-analyze not installed (apt-get install systemd)");
    }
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/systemd/locafs@.service"),
    )
    .unwrap();
    assert!(unit.contains("ExecStart=/usr/bin/locafs mount --config /etc/locafs/%i.toml"));
    assert!(unit.contains("Type=notify"));
    assert!(unit.contains("Restart=on-failure"));
    // verify checks that ExecStart is executable: point it at this build.
    let dir = tempfile::tempdir().unwrap();
    let unit = unit.replace("/usr/bin/locafs", bin());
    let path = dir.path().join("locafs@imagenet.service");
    std::fs::write(&path, &unit).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "systemd-analyze verify: {err}");
    assert!(
        err.trim().is_empty(),
        "systemd-analyze verify warned: {err}"
    );
    // And it does catch mistakes (the check is not vacuous).
    std::fs::write(&path, unit.replace("Type=notify", "Type=notfy")).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&out.stderr).trim().is_empty());
}

/// The next message to systemd, but the file descriptor store's (the
/// mount's descriptors, which a real systemd keeps across restarts:
/// tests/restart_systemd.rs; here they are received and closed).
fn recv(sock: &UnixDatagram) -> Option<String> {
    let mut buf = [0u8; 4096];
    loop {
        let msg = sock
            .recv(&mut buf)
            .ok()
            .map(|n| String::from_utf8_lossy(&buf[..n]).into_owned())?;
        if !msg.starts_with("FDSTORE") {
            return Some(msg);
        }
    }
}

#[test]
fn notify_readiness_clean_stop_and_restart_after_a_crash() {
    require_fuse!();
    let sc = Scratch::with_sample_files();
    let conf = sc.dir.path().join("imagenet.toml");
    let log = sc.dir.path().join("log.txt");
    std::fs::write(
        &conf,
        format!(
            "source = \"{}\"\nmountpoint = \"{}\"\ncache-dir = \"{}\"\ncache-size = \"64MiB\"\nlog-file = \"{}\"\n",
            sc.src.display(),
            sc.mnt.display(),
            sc.cache.display(),
            log.display()
        ),
    )
    .unwrap();
    let notify_path = sc.dir.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let start = || {
        Command::new(bin())
            .args(["mount", "--config"])
            .arg(&conf)
            .env("NOTIFY_SOCKET", &notify_path)
            // (systemd's, if this test runs in a unit, would name another process)
            .env_remove("SYSTEMD_EXEC_PID")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };

    let mut child = start();
    let msg = recv(&notify).expect("no READY=1 from the daemon");
    assert_eq!(msg, "READY=1");
    // Ready means live: no waiting.
    assert_eq!(mount_type(&sc.mnt).as_deref(), Some("fuse.locafs"));
    sc.check_files_through_mount();
    // systemctl stop: SIGTERM.
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert_eq!(recv(&notify).as_deref(), Some("STOPPING=1"));
    let ok = wait_for(Duration::from_secs(15), || {
        child.try_wait().ok().flatten().is_some()
    });
    assert!(ok, "daemon did not exit after SIGTERM");
    assert_eq!(child.wait().unwrap().code(), Some(0));
    assert!(mount_type(&sc.mnt).is_none(), "still mounted after stop");

    // A crash leaves a dead mount; Restart=on-failure starts the same
    // command again, which must detach it and mount over the same cache.
    let mut child = start();
    assert_eq!(recv(&notify).as_deref(), Some("READY=1"));
    child.kill().unwrap();
    child.wait().unwrap();
    // (its server dies with it: a request that server had taken as it
    // went ends with ECONNABORTED, every one after with ENOTCONN)
    let dead = loop {
        let e = std::fs::metadata(&sc.mnt).unwrap_err();
        if e.raw_os_error() != Some(libc::ECONNABORTED) {
            break e;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(dead.raw_os_error(), Some(libc_enotconn()), "{dead}");
    let mut child = start();
    let msg = recv(&notify);
    let mut err = String::new();
    if msg.is_none() {
        use std::io::Read;
        let _ = child.kill();
        let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    }
    assert_eq!(msg.as_deref(), Some("READY=1"), "restart failed: {err}");
    sc.check_files_through_mount();
    let v = stats_of(&sc.mnt);
    assert_eq!(v["source_bytes"], 0, "cache not reused after restart: {v}");
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(
        log_text.contains(&format!("recovered {} files", sc.files.len())),
        "{log_text}"
    );
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let ok = wait_for(Duration::from_secs(15), || {
        child.try_wait().ok().flatten().is_some()
    });
    assert!(ok);
    assert!(mount_type(&sc.mnt).is_none());
    force_unmount(&sc.mnt);
}

fn libc_enotconn() -> i32 {
    107
}

/// A `systemd --user` manager in a mount namespace of its own: systemd is
/// not PID 1 on these machines ("System has not been booted with systemd"),
/// and the manager refuses to start unless /run/systemd/system exists,
/// which only a booted systemd makes. In a private mount namespace a tmpfs
/// over /run/systemd gives it that directory without touching the machine;
/// the mounts its units make are then visible only in that namespace (read
/// through /proc/PID/root). Stopped and reaped on drop.
struct UserManager {
    child: std::process::Child,
    runtime: std::path::PathBuf,
}

impl UserManager {
    /// Starts the manager with its runtime and configuration directories
    /// under `dir`; Err(why) if this machine cannot run one.
    fn start(dir: &Path) -> Result<UserManager, String> {
        if ["systemd", "systemctl", "unshare", "nsenter"]
            .iter()
            .any(|p| which(p).is_none())
        {
            return Err("needs systemd, systemctl, unshare and nsenter".into());
        }
        if !Path::new("/run/systemd").is_dir() {
            return Err("no /run/systemd to put the manager's marker in".into());
        }
        let runtime = dir.join("runtime");
        std::fs::create_dir_all(&runtime).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o700)).unwrap();
        let child = Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c"])
            .arg(
                "mount -t tmpfs tmpfs /run/systemd && mkdir /run/systemd/system && \
                 exec systemd --user",
            )
            .env("XDG_RUNTIME_DIR", &runtime)
            .env("XDG_CONFIG_HOME", dir.join("config"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("manager.log")).unwrap())
            .spawn()
            .map_err(|e| format!("unshare: {e}"))?;
        let mut m = UserManager { child, runtime };
        let up = wait_for(Duration::from_secs(30), || {
            matches!(
                m.systemctl(&["is-system-running"]).trim(),
                "running" | "degraded"
            ) || m.child.try_wait().ok().flatten().is_some()
        });
        if !up || m.child.try_wait().ok().flatten().is_some() {
            return Err(format!(
                "systemd --user did not start: {}",
                std::fs::read_to_string(dir.join("manager.log")).unwrap_or_default()
            ));
        }
        Ok(m)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `systemctl --user ARGS` in the manager's namespace (outside it,
    /// systemctl sees no booted systemd and says "offline"): its stdout.
    fn systemctl(&self, args: &[&str]) -> String {
        let out = Command::new("nsenter")
            .arg("-t")
            .arg(self.pid().to_string())
            .args(["-m", "systemctl", "--user"])
            .args(args)
            .env("XDG_RUNTIME_DIR", &self.runtime)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// One property of a unit (`systemctl show -p NAME --value`).
    fn property(&self, unit: &str, name: &str) -> String {
        self.systemctl(&["show", "-p", name, "--value", unit])
            .trim()
            .to_owned()
    }

    /// A path as processes in the manager's mount namespace see it.
    fn inside(&self, p: &Path) -> std::path::PathBuf {
        Path::new(&format!("/proc/{}/root", self.pid())).join(p.strip_prefix("/").unwrap())
    }

    /// The type of what is mounted on `p` in the manager's namespace.
    fn mount_type(&self, p: &Path) -> Option<String> {
        let info = std::fs::read_to_string(format!("/proc/{}/mountinfo", self.pid())).ok()?;
        let target = p.to_str()?;
        info.lines().rev().find_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let dash = f.iter().position(|x| *x == "-")?;
            (f.get(4) == Some(&target)).then(|| f[dash + 1].to_owned())
        })
    }

    /// Runs `cmd ARGS` in the manager's mount namespace.
    fn run_inside(&self, cmd: &str, args: &[&std::ffi::OsStr]) -> bool {
        Command::new("nsenter")
            .arg("-t")
            .arg(self.pid().to_string())
            .arg("-m")
            .arg(cmd)
            .args(args)
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for UserManager {
    fn drop(&mut self) {
        // SIGTERM: the manager stops its units (locafs unmounts) and exits.
        let _ = signal(self.child.id(), Signal::TERM);
        let gone = wait_for(Duration::from_secs(30), || {
            self.child.try_wait().ok().flatten().is_some()
        });
        if !gone {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// The shipped unit, as is, run by a real systemd: `systemctl start`
/// returns once the mount is live (Type=notify); `kill -9` of the daemon
/// after `ls -la` and `stat` of the mountpoint (the kernel then answers
/// `stat` from its caches for a minute) is followed by a restart that
/// mounts again over the same cache (before the fix the restarted locafs
/// exited 2, "already mounted", which RestartPreventExitStatus=2 made
/// final); `systemctl stop` unmounts.
#[test]
fn restart_on_failure_under_a_real_systemd() {
    require_fuse!();
    let sc = Scratch::with_sample_files();
    let conf = sc.dir.path().join("t40.toml");
    let log = sc.dir.path().join("log.txt");
    std::fs::write(
        &conf,
        format!(
            "source = \"{}\"\nmountpoint = \"{}\"\ncache-dir = \"{}\"\ncache-size = \"64MiB\"\nlog-file = \"{}\"\n",
            sc.src.display(),
            sc.mnt.display(),
            sc.cache.display(),
            log.display()
        ),
    )
    .unwrap();
    // The shipped unit with two paths changed: this build's binary, and
    // the scratch directory for /etc/locafs.
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/systemd/locafs@.service"),
    )
    .unwrap()
    .replace("/usr/bin/locafs", bin())
    .replace("/etc/locafs/", &format!("{}/", sc.dir.path().display()));
    let units = sc.dir.path().join("config/systemd/user");
    std::fs::create_dir_all(&units).unwrap();
    std::fs::write(units.join("locafs@.service"), unit).unwrap();

    let m = match UserManager::start(sc.dir.path()) {
        Ok(m) => m,
        Err(why) => skip!("{why}"),
    };
    let name = "locafs@t40.service";
    m.systemctl(&["start", name]);
    assert_eq!(
        m.property(name, "ActiveState"),
        "active",
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    // Active means live.
    assert_eq!(m.mount_type(&sc.mnt).as_deref(), Some("fuse.locafs"));
    for (rel, data) in &sc.files {
        assert!(std::fs::read(m.inside(&sc.mnt.join(rel))).unwrap() == *data);
    }
    let mnt_inside = m.inside(&sc.mnt);
    wait_until("every file cached", Duration::from_secs(20), || {
        locafs::cli::stats::fetch(&mnt_inside).is_ok_and(|s| s.files_cached == 3)
    });
    assert!(m.run_inside("ls", &["-la".as_ref(), sc.mnt.as_os_str()]));
    assert!(m.run_inside("stat", &[sc.mnt.as_os_str()]));

    let pid: u32 = m.property(name, "MainPID").parse().unwrap();
    assert!(pid > 0);
    signal(pid, Signal::KILL).unwrap();
    // Restart=on-failure, RestartSec=2s: a new daemon, live, once.
    let restarted = wait_for(Duration::from_secs(60), || {
        m.property(name, "NRestarts") == "1"
            && m.property(name, "ActiveState") == "active"
            && m.property(name, "MainPID") != pid.to_string()
    });
    assert!(
        restarted,
        "not restarted: {} {} {}; log:\n{}",
        m.property(name, "ActiveState"),
        m.property(name, "Result"),
        m.property(name, "ExecMainStatus"),
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert_eq!(m.mount_type(&sc.mnt).as_deref(), Some("fuse.locafs"));
    for (rel, data) in &sc.files {
        assert!(std::fs::read(m.inside(&sc.mnt.join(rel))).unwrap() == *data);
    }
    let s = locafs::cli::stats::fetch(&mnt_inside).unwrap();
    assert_eq!(s.source_bytes, 0, "cache not reused after the restart");

    m.systemctl(&["stop", name]);
    assert_eq!(m.property(name, "ActiveState"), "inactive");
    assert_eq!(m.mount_type(&sc.mnt), None, "still mounted after stop");
}
