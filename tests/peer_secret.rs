//! The cluster secret from the command line: `locafs secret` prints what
//! `--cluster-secret-file` accepts, and a hand-made passphrase (or the bare
//! hex secret of older versions), which anyone reaching the peer port could
//! test offline, stops the mount with exit status 2 and one line saying to
//! run `locafs secret`, naming the file but never quoting it; so does a
//! missing file.
//!
//! Real `locafs` processes; only the binary's behaviour is used.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

/// A foreground `locafs mount` of `dir/source` with peers on, the secret
/// in `secret`, not waited for (it may well refuse to start).
fn attempt(dir: &Path, name: &str, secret: &Path) -> Mount {
    let base = dir.join(name);
    let (mnt, cache) = (base.join("mnt"), base.join("cache"));
    std::fs::create_dir_all(&mnt).unwrap();
    let addr = format!("127.0.0.1:{}", free_udp_port());
    let secret = secret.to_str().unwrap();
    Mount::spawn(
        &dir.join("source"),
        &mnt,
        &cache,
        &[
            "--cache-size",
            "64M",
            "--listen",
            &addr,
            "--peers",
            &addr,
            "--cluster-secret-file",
            secret,
        ],
    )
}

#[test]
fn only_a_secret_made_by_locafs_secret_is_accepted() {
    require_fuse!();
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
        write_private(&file, format!("{passphrase}\n"));
        let mut a = attempt(dir.path(), &format!("hand{i}"), &file);
        let code = a.wait_exit(Duration::from_secs(20)).map(|st| st.code());
        let err = a.stderr();
        assert_eq!(code, Some(Some(2)), "{passphrase:?} was not refused: {err}");
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{err}");
        assert!(lines[0].contains("run `locafs secret --out FILE`"), "{err}");
        assert!(lines[0].contains(&file.display().to_string()), "{err}");
        assert!(!err.contains(passphrase), "the secret was quoted: {err}");
        assert!(!is_mounted(&a.mnt));
    }

    // A missing file: the same one line, saying how to make one.
    let missing = dir.path().join("no-such-secret");
    let mut a = attempt(dir.path(), "missing", &missing);
    let code = a.wait_exit(Duration::from_secs(20)).map(|st| st.code());
    let err = a.stderr();
    assert_eq!(code, Some(Some(2)), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("no such file or directory"), "{err}");
    assert!(err.contains("run `locafs secret --out FILE`"), "{err}");
    assert!(!is_mounted(&a.mnt));

    // What `locafs secret` prints is accepted, and is new each time.
    let print = || {
        let out = Command::new(bin()).arg("secret").output().unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    let secret = print();
    assert!(secret.starts_with("locafs-secret-v1:"), "{secret}");
    assert_ne!(secret, print());
    let file = dir.path().join("good-secret");
    write_private(&file, &secret);
    let mut a = attempt(dir.path(), "good", &file);
    a.wait_mounted(Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("did not mount: {e}"));
    assert_eq!(
        std::fs::read(a.mnt.join("a")).unwrap(),
        b"hello",
        "{}",
        a.stderr()
    );
    assert_eq!(a.unmount().code(), Some(0), "{}", a.stderr());
}
