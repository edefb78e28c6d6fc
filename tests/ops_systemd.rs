//! The systemd side: the shipped `locafs@.service` passes
//! `systemd-analyze verify`, and the daemon keeps the unit's contract when
//! run the way the unit runs it (`locafs mount --config NAME.toml` with the
//! source and mountpoint in the file, NOTIFY_SOCKET set): READY=1 only once
//! the mount is live, STOPPING=1 and a clean unmount with exit 0 on SIGTERM,
//! and after a crash (SIGKILL) a restart over the dead mount and the same
//! cache works.

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
