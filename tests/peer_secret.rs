//! The cluster secret from the command line: `locafs secret` prints what
//! `--cluster-secret-file` accepts, and a hand-made passphrase (or the bare
//! hex secret of older versions), which anyone reaching the peer port could
//! test offline, stops the mount with exit status 2 and one line saying to
//! run `locafs secret`, naming the file but never quoting it.
//!
//! Real `locafs` processes; only the binary's behaviour is used.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn can_run() -> bool {
    if !Path::new("/dev/fuse").exists() {
        eprintln!("SKIPPED: /dev/fuse is missing");
        return false;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: mounting needs root here");
        return false;
    }
    true
}

fn free_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .map(|a| a.port())
        .expect("a free UDP port")
}

fn is_mounted(mnt: &Path) -> bool {
    let want = mnt.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
}

/// A foreground `locafs mount` with peers on, the secret in `secret`; its
/// stderr goes to `err`.
struct Attempt {
    child: Child,
    mnt: PathBuf,
    err: PathBuf,
}

impl Attempt {
    fn start(dir: &Path, name: &str, secret: &Path) -> Attempt {
        let base = dir.join(name);
        let (mnt, cache, err) = (base.join("mnt"), base.join("cache"), base.join("stderr"));
        std::fs::create_dir_all(&mnt).unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let child = Command::new(env!("CARGO_BIN_EXE_locafs"))
            .arg("mount")
            .arg(dir.join("source"))
            .arg(&mnt)
            .arg("--cache-dir")
            .arg(&cache)
            .args(["--cache-size", "64M", "--listen", &addr, "--peers", &addr])
            .arg("--cluster-secret-file")
            .arg(secret)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&err).unwrap())
            .spawn()
            .expect("start locafs");
        Attempt { child, mnt, err }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// The exit status if the process ends within `limit`; None if it is
    /// still running (then mounted, or about to be).
    fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        let t0 = Instant::now();
        while t0.elapsed() < limit {
            if let Some(st) = self.child.try_wait().unwrap() {
                return Some(st.code().unwrap_or(-1));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// Unmounts (if mounted) and reaps the process; its exit status.
    fn stop(&mut self) -> Option<i32> {
        if self.child.try_wait().unwrap().is_none() {
            let _ = Command::new("umount").arg(&self.mnt).status();
            if let Some(code) = self.wait_exit(Duration::from_secs(10)) {
                return Some(code);
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
            return None;
        }
        self.child.try_wait().unwrap().and_then(|s| s.code())
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        self.stop();
    }
}

#[test]
fn only_a_secret_made_by_locafs_secret_is_accepted() {
    if !can_run() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("source")).unwrap();
    std::fs::write(dir.path().join("source/a"), b"hello").unwrap();

    // Each of these passed the old strength estimate (128 bits "or more").
    let hand_made = [
        "0123456789abcdef0123456789abcdef",
        "abcdefghabcdefghabcdefghabcdefgh",
        "imagenet-cluster-secret-2026-abc",
        // What `locafs secret` printed before: 64 hex digits, no prefix.
        "8f3a0c5d7e9b1a2c4d6e8f0a1b3c5d7e9f1a2b3c4d5e6f708192a3b4c5d6e7f8",
    ];
    for (i, passphrase) in hand_made.iter().enumerate() {
        let file = dir.path().join(format!("secret{i}"));
        std::fs::write(&file, format!("{passphrase}\n")).unwrap();
        let mut a = Attempt::start(dir.path(), &format!("hand{i}"), &file);
        let code = a.wait_exit(Duration::from_secs(20));
        let err = a.stderr();
        if code.is_none() {
            a.stop();
        }
        assert_eq!(code, Some(2), "{passphrase:?} was not refused: {err}");
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{err}");
        assert!(lines[0].contains("run `locafs secret > FILE`"), "{err}");
        assert!(lines[0].contains(&file.display().to_string()), "{err}");
        assert!(!err.contains(passphrase), "the secret was quoted: {err}");
        assert!(!is_mounted(&a.mnt));
    }

    // What `locafs secret` prints is accepted, and is new each time.
    let print = || {
        let out = Command::new(env!("CARGO_BIN_EXE_locafs"))
            .arg("secret")
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    let secret = print();
    assert!(secret.starts_with("locafs-secret-v1:"), "{secret}");
    assert_ne!(secret, print());
    let file = dir.path().join("good-secret");
    std::fs::write(&file, &secret).unwrap();
    let mut a = Attempt::start(dir.path(), "good", &file);
    let t0 = Instant::now();
    while !is_mounted(&a.mnt) {
        if let Some(code) = a.wait_exit(Duration::from_millis(50)) {
            panic!("exited with {code}: {}", a.stderr());
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "did not mount");
    }
    assert_eq!(
        std::fs::read(a.mnt.join("a")).unwrap(),
        b"hello",
        "{}",
        a.stderr()
    );
    assert_eq!(a.stop(), Some(0), "{}", a.stderr());
}
