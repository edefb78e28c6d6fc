//! fstab-style mounts through the `mount.fuse.locafs` helper
//! (packaging/mount.fuse.locafs), with the real mount(8):
//! `mount -t fuse.locafs SRC MNT -o ...` returns only when the mount is live,
//! standard options (_netdev, nofail, x-systemd.*) are accepted, an fstab
//! line works, bad options fail with mount(8)'s status 1 and nothing
//! mounted, `-f` mounts nothing; and both helpers (the script, and the
//! binary called by the helper's name) called directly as mount(8) calls
//! them (with -n -s -v). The binary as the helper of mount(8) itself, from
//! an fstab line, is tested by tests/docs_readme.rs, following the README.
//!
//! mount(8) (util-linux) looks for helpers only in /sbin, /sbin/fs.d and
//! /sbin/fs, not in PATH: the test installs the helper as
//! /sbin/mount.fuse.locafs for its duration (and removes it unless an
//! identical one was there before).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::*;

fn helper_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/mount.fuse.locafs")
}

const SBIN_HELPER: &str = "/sbin/mount.fuse.locafs";

/// Installs the helper in /sbin; removes it on drop if we put it there.
struct Installed {
    remove: bool,
}

impl Installed {
    fn new() -> Result<Installed, String> {
        let ours = std::fs::read(helper_src()).unwrap();
        match std::fs::read(SBIN_HELPER) {
            Ok(existing) if existing == ours => return Ok(Installed { remove: false }),
            Ok(_) => {
                return Err(format!(
                    "{SBIN_HELPER} exists and differs from packaging/mount.fuse.locafs; not touching it"
                ))
            }
            Err(_) => {}
        }
        let tmp = format!("{SBIN_HELPER}.{}", std::process::id());
        std::fs::write(&tmp, &ours).map_err(|e| format!("cannot write {tmp}: {e}"))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&tmp, SBIN_HELPER).map_err(|e| format!("cannot install: {e}"))?;
        Ok(Installed { remove: true })
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        if self.remove {
            let _ = std::fs::remove_file(SBIN_HELPER);
        }
    }
}

fn mount8(args: &[&str]) -> Output {
    Command::new("mount")
        .args(args)
        .env("LOCAFS_BIN", bin())
        .output()
        .unwrap()
}

/// Unmounts with umount(8) and waits for the daemon to be gone (its log
/// says so).
fn umount_and_wait(sc: &Scratch, log: &Path) {
    let count = || {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .matches("unmounted")
            .count()
    };
    let before = count();
    let st = Command::new("umount").arg(&sc.mnt).status().unwrap();
    assert!(st.success());
    assert!(mount_type(&sc.mnt).is_none());
    assert!(
        wait_for(Duration::from_secs(10), || count() > before),
        "the daemon did not notice the unmount: {}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

#[test]
fn mount_t_fuse_locafs_and_fstab() {
    require_fuse!();
    if Command::new("mount").arg("--version").output().is_err() {
        skip!("no mount(8) on this machine");
    }
    let _installed = match Installed::new() {
        Ok(i) => i,
        Err(e) => skip!("{e}"),
    };
    let sc = Scratch::with_sample_files();
    let log = sc.dir.path().join("locafs.log");
    let opts = format!(
        "cache_dir={},cache_size=64M,_netdev,nofail,x-systemd.automount,x-systemd.requires=network-online.target,noatime,log_file={}",
        sc.cache.display(),
        log.display()
    );

    // mount -t: live as soon as mount(8) returns (no waiting here).
    let out = mount8(&[
        "-t",
        "fuse.locafs",
        sc.src.to_str().unwrap(),
        sc.mnt.to_str().unwrap(),
        "-o",
        &opts,
    ]);
    assert!(
        out.status.success(),
        "mount -t fuse.locafs failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(mount_type(&sc.mnt).as_deref(), Some("fuse.locafs"));
    sc.check_files_through_mount();
    // The options reached locafs: the cache limit is 64 MiB.
    let v = stats_of(&sc.mnt);
    assert_eq!(v["cache_capacity_bytes"], 64 * 1024 * 1024);
    // findmnt-style listing shows it as what it is.
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(
        mounts.contains(&format!("locafs:{}", sc.src.display())),
        "{mounts}"
    );
    umount_and_wait(&sc, &log);

    // An fstab line (with the options admins write there), mounted by
    // mountpoint alone.
    let fstab = sc.dir.path().join("fstab");
    std::fs::write(
        &fstab,
        format!(
            "# locafs test\n{} {} fuse.locafs {},defaults 0 0\n",
            sc.src.display(),
            sc.mnt.display(),
            opts
        ),
    )
    .unwrap();
    let out = mount8(&["--fstab", fstab.to_str().unwrap(), sc.mnt.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "mount from fstab failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    sc.check_files_through_mount();
    // The cache survived the remount: nothing more came from the source.
    let v = stats_of(&sc.mnt);
    assert_eq!(v["source_bytes"], 0, "{v}");
    umount_and_wait(&sc, &log);

    // A bad option: mount(8) status 1, the reason on stderr, nothing mounted.
    let out = mount8(&[
        "-t",
        "fuse.locafs",
        sc.src.to_str().unwrap(),
        sc.mnt.to_str().unwrap(),
        "-o",
        &format!("cache_dir={},bogus_option=1", sc.cache.display()),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("bogus"), "{err}");
    assert!(mount_type(&sc.mnt).is_none());

    // A missing source: the same.
    let out = mount8(&[
        "-t",
        "fuse.locafs",
        "/nonexistent/locafs-source",
        sc.mnt.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("/nonexistent/locafs-source"), "{err}");
    assert!(mount_type(&sc.mnt).is_none());

    // -f (fake): nothing is mounted, success.
    let out = mount8(&[
        "-f",
        "-t",
        "fuse.locafs",
        sc.src.to_str().unwrap(),
        sc.mnt.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    assert!(mount_type(&sc.mnt).is_none());
}

/// The two helpers: the shell script (packaging/mount.fuse.locafs, which
/// the Debian package installs) and the binary itself called by that name
/// (what the README's install links). Each runs the way mount(8) runs it.
enum Helper {
    Script,
    /// A link named mount.fuse.locafs to the binary, in a scratch dir.
    Binary(tempfile::TempDir),
}

impl Helper {
    fn both() -> Vec<Helper> {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(bin(), dir.path().join("mount.fuse.locafs")).unwrap();
        vec![Helper::Script, Helper::Binary(dir)]
    }

    /// `mount.fuse.locafs` ready for its arguments.
    fn command(&self) -> Command {
        match self {
            Helper::Script => {
                let mut c = Command::new("sh");
                c.arg(helper_src()).env("LOCAFS_BIN", bin());
                c
            }
            Helper::Binary(dir) => Command::new(dir.path().join("mount.fuse.locafs")),
        }
    }
}

/// Both helpers, run the way mount(8) runs them, without installing
/// anything: the same statuses and the same command run.
#[test]
fn helper_called_as_mount8_does() {
    require_fuse!();
    for helper in Helper::both() {
        let sc = Scratch::with_sample_files();
        let log = sc.dir.path().join("locafs.log");
        let out = helper
            .command()
            .arg(&sc.src)
            .arg(&sc.mnt)
            .args(["-n", "-sv", "-o"])
            .arg(format!(
                "rw,cache_dir={},immutable,fuse_threads=2,log_file={}",
                sc.cache.display(),
                log.display()
            ))
            .args(["-t", "fuse.locafs"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        // -v shows the command it ran; "rw" (added by mount(8)) was dropped.
        assert!(err.contains("mount --daemon -o cache_dir="), "{err}");
        assert!(!err.contains("rw,"), "{err}");
        assert_eq!(mount_type(&sc.mnt).as_deref(), Some("fuse.locafs"));
        sc.check_files_through_mount();
        umount_and_wait(&sc, &log);

        // -f: nothing mounted, success.
        let out = helper
            .command()
            .arg(&sc.src)
            .arg(&sc.mnt)
            .arg("-f")
            .output()
            .unwrap();
        assert!(out.status.success());
        assert!(mount_type(&sc.mnt).is_none());
        // Bad options: mount(8)'s status 1, the reason on stderr.
        let out = helper
            .command()
            .arg(&sc.src)
            .arg(&sc.mnt)
            .args(["-o", "bogus_option=1"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&out.stderr).contains("bogus"));
        assert!(mount_type(&sc.mnt).is_none());
        // A mount that fails for another reason (a mount namespace that
        // is not there): status 32.
        let out = helper
            .command()
            .arg(&sc.src)
            .arg(&sc.mnt)
            .args(["-N", "/nonexistent/ns/mnt"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(32));
        assert!(mount_type(&sc.mnt).is_none());
        // An unknown flag: usage, status 1.
        let out = helper
            .command()
            .arg(&sc.src)
            .arg(&sc.mnt)
            .arg("-Z")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&out.stderr).contains("unknown flag -Z"));
    }

    // The script: a binary that cannot be found is status 32.
    let sc = Scratch::with_sample_files();
    let out = Command::new("sh")
        .arg(helper_src())
        .arg(&sc.src)
        .arg(&sc.mnt)
        .env("LOCAFS_BIN", "/nonexistent/locafs")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(32));
    assert!(mount_type(&sc.mnt).is_none());
}
