//! The edges of a mount: every write path answers EROFS and changes nothing;
//! bad input exits 2 with one line naming the problem and mounts nothing;
//! `--daemon`, SIGTERM and `umount` end the way the CLI promises; a source
//! file that shrinks under an open handle never yields stale bytes.

mod common;

use std::ffi::{CString, OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// The errno of a libc call that returned `rc` (None if it succeeded).
fn errno_of(rc: libc::c_int) -> Option<i32> {
    (rc != 0).then(|| std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
}

fn io_errno<T>(r: std::io::Result<T>) -> Option<i32> {
    r.err().map(|e| e.raw_os_error().unwrap_or(0))
}

#[test]
fn every_write_path_is_erofs() {
    require_fuse!();
    let s = Scratch::new();
    write_file(&s.src.join("file"), 1, 1000);
    fs::create_dir(s.src.join("dir")).unwrap();
    fs::create_dir(s.src.join("dir/sub")).unwrap();
    write_file(&s.src.join("dir/inner"), 2, 10);
    std::os::unix::fs::symlink("file", s.src.join("link")).unwrap();
    let before = snapshot(&s.src);
    let _m = s.mount(&[]);
    let mnt = &s.mnt;
    let f = mnt.join("file");
    let cf = cstr(&f);
    let erofs = Some(libc::EROFS);

    let mut checks: Vec<(&str, Option<i32>)> = Vec::new();
    checks.push(("create", io_errno(File::create(mnt.join("new")))));
    checks.push((
        "create_new",
        io_errno(
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(mnt.join("new2")),
        ),
    ));
    checks.push((
        "open O_WRONLY",
        io_errno(OpenOptions::new().write(true).open(&f)),
    ));
    checks.push((
        "open O_RDWR",
        io_errno(OpenOptions::new().read(true).write(true).open(&f)),
    ));
    // write(2) needs a writable descriptor; every way to get one is refused.
    checks.push((
        "write (O_APPEND)",
        io_errno(
            OpenOptions::new()
                .append(true)
                .open(&f)
                .and_then(|mut h| h.write_all(b"x")),
        ),
    ));
    checks.push((
        "write (O_TRUNC)",
        io_errno(
            OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(&f)
                .and_then(|mut h| h.write_all(b"x")),
        ),
    ));
    checks.push((
        "open O_RDONLY|O_TRUNC",
        io_errno(
            OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_TRUNC)
                .open(&f),
        ),
    ));
    // SAFETY (all libc calls below): plain system calls on NUL-terminated
    // paths that live until the call returns.
    checks.push((
        "truncate",
        errno_of(unsafe { libc::truncate(cf.as_ptr(), 1) }),
    ));
    {
        let h = File::open(&f).unwrap();
        use std::os::fd::AsRawFd;
        let rc = unsafe { libc::ftruncate(h.as_raw_fd(), 1) };
        // ftruncate on a read-only descriptor is EINVAL or EBADF by POSIX; on
        // a read-only mount Linux answers EROFS first or EINVAL: either way
        // it must fail.
        assert_ne!(rc, 0, "ftruncate through the mount succeeded");
    }
    checks.push(("mkdir", io_errno(fs::create_dir(mnt.join("newdir")))));
    checks.push(("rmdir", io_errno(fs::remove_dir(mnt.join("dir/sub")))));
    checks.push(("unlink", io_errno(fs::remove_file(&f))));
    checks.push((
        "unlink symlink",
        io_errno(fs::remove_file(mnt.join("link"))),
    ));
    checks.push(("rename", io_errno(fs::rename(&f, mnt.join("renamed")))));
    checks.push((
        "rename over",
        io_errno(fs::rename(&f, mnt.join("dir/inner"))),
    ));
    checks.push((
        "symlink",
        io_errno(std::os::unix::fs::symlink("file", mnt.join("newlink"))),
    ));
    checks.push(("link", io_errno(fs::hard_link(&f, mnt.join("hardlink")))));
    checks.push((
        "chmod",
        errno_of(unsafe { libc::chmod(cf.as_ptr(), 0o777) }),
    ));
    checks.push(("chown", errno_of(unsafe { libc::chown(cf.as_ptr(), 1, 1) })));
    checks.push((
        "lchown",
        errno_of(unsafe { libc::lchown(cstr(&mnt.join("link")).as_ptr(), 1, 1) }),
    ));
    let times = [
        libc::timespec {
            tv_sec: 1,
            tv_nsec: 0,
        },
        libc::timespec {
            tv_sec: 2,
            tv_nsec: 0,
        },
    ];
    checks.push((
        "utimes",
        errno_of(unsafe { libc::utimensat(libc::AT_FDCWD, cf.as_ptr(), times.as_ptr(), 0) }),
    ));
    checks.push((
        "utimes now",
        errno_of(unsafe { libc::utimensat(libc::AT_FDCWD, cf.as_ptr(), std::ptr::null(), 0) }),
    ));
    let name = CString::new("user.test").unwrap();
    checks.push((
        "setxattr",
        errno_of(unsafe { libc::setxattr(cf.as_ptr(), name.as_ptr(), b"v".as_ptr().cast(), 1, 0) }),
    ));
    checks.push((
        "setxattr root",
        errno_of(unsafe {
            libc::setxattr(
                cstr(mnt).as_ptr(),
                name.as_ptr(),
                b"v".as_ptr().cast(),
                1,
                0,
            )
        }),
    ));
    checks.push((
        "removexattr",
        errno_of(unsafe { libc::removexattr(cf.as_ptr(), name.as_ptr()) }),
    ));
    checks.push((
        "mknod fifo",
        errno_of(unsafe {
            libc::mknod(cstr(&mnt.join("fifo")).as_ptr(), libc::S_IFIFO | 0o644, 0)
        }),
    ));
    checks.push((
        "mknod reg",
        errno_of(unsafe { libc::mknod(cstr(&mnt.join("reg")).as_ptr(), libc::S_IFREG | 0o644, 0) }),
    ));

    let wrong: Vec<String> = checks
        .iter()
        .filter(|(_, e)| *e != erofs)
        .map(|(n, e)| format!("{n}: {e:?}"))
        .collect();
    assert!(
        wrong.is_empty(),
        "expected EROFS ({}) from every write path; got: {wrong:?}",
        libc::EROFS
    );
    // Reading still works, and the source is untouched.
    assert_same_content(&s.src.join("file"), &f);
    assert_eq!(snapshot(&s.src), before, "the source changed");
}

/// Names, sizes, modes, owners and mtimes of everything under `p`.
fn snapshot(p: &Path) -> Vec<(PathBuf, u64, u32, u32, i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    fn go(p: &Path, out: &mut Vec<(PathBuf, u64, u32, u32, i64, i64)>) {
        for e in fs::read_dir(p).unwrap().flatten() {
            let m = fs::symlink_metadata(e.path()).unwrap();
            out.push((
                e.path(),
                m.len(),
                m.mode(),
                m.uid(),
                m.mtime(),
                m.mtime_nsec(),
            ));
            if m.is_dir() {
                go(&e.path(), out);
            }
        }
    }
    go(p, &mut out);
    out.sort();
    out
}

/// Runs `locafs mount ARGS`, expects exit 2, a single stderr line mentioning
/// `needle` (case-insensitive), and nothing mounted on `mnt`.
fn expect_usage_error(case: &str, args: &[&OsStr], mnt: &Path, needle: &str) {
    let out = run_locafs(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{case}: exit status; stderr: {err}"
    );
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "{case}: expected one stderr line, got: {err:?}"
    );
    assert!(
        lines[0].to_lowercase().contains(&needle.to_lowercase()),
        "{case}: stderr {:?} does not name the problem ({needle:?})",
        lines[0]
    );
    assert!(!is_fuse_mounted(mnt), "{case}: something got mounted");
    assert!(
        !mounted_sources().iter().any(|m| m.starts_with("locafs:")
            && args.iter().any(|a| m.as_bytes().ends_with(a.as_bytes()))),
        "{case}: a locafs mount of this source appeared"
    );
}

fn os(s: &str) -> OsString {
    OsString::from(s)
}

#[test]
fn bad_input_exits_2_with_one_line_and_mounts_nothing() {
    require_fuse!();
    let s = Scratch::new();
    write_file(&s.src.join("a"), 1, 10);
    let t = s.path();
    let cache = s.cache.as_os_str();
    let (src, mnt) = (s.src.as_os_str(), s.mnt.as_os_str());
    let m = OsStr::new("mount");
    let cd = OsStr::new("--cache-dir");

    let missing = t.join("nope");
    expect_usage_error(
        "missing source",
        &[m, missing.as_os_str(), mnt, cd, cache],
        &s.mnt,
        "source",
    );
    let afile = t.join("afile");
    fs::write(&afile, b"x").unwrap();
    expect_usage_error(
        "source is a file",
        &[m, afile.as_os_str(), mnt, cd, cache],
        &s.mnt,
        "not a directory",
    );
    expect_usage_error(
        "missing mountpoint",
        &[m, src, missing.as_os_str(), cd, cache],
        &missing,
        "mountpoint",
    );
    let full = t.join("full");
    fs::create_dir(&full).unwrap();
    fs::write(full.join("x"), b"x").unwrap();
    expect_usage_error(
        "non-empty mountpoint",
        &[m, src, full.as_os_str(), cd, cache],
        &full,
        "not empty",
    );
    {
        let busy = t.join("busy");
        let _tmp = Tmpfs::mount(&busy, "1M");
        expect_usage_error(
            "already-mounted mountpoint",
            &[m, src, busy.as_os_str(), cd, cache],
            &busy,
            "already mounted",
        );
        assert!(is_mounted(&busy), "the tmpfs there must be left alone");
    }
    let under_file = afile.join("cache");
    expect_usage_error(
        "cache dir under a file",
        &[m, src, mnt, cd, under_file.as_os_str()],
        &s.mnt,
        "cache dir",
    );
    {
        let ro = t.join("rocache");
        let tmp = Tmpfs::mount(&ro, "1M");
        tmp.remount_ro();
        expect_usage_error(
            "read-only cache dir",
            &[m, src, mnt, cd, ro.as_os_str()],
            &s.mnt,
            "cache dir",
        );
    }
    let toml = t.join("c.toml");
    fs::write(&toml, "cache-size = \"1G\"\ncache-sise = \"2G\"\n").unwrap();
    expect_usage_error(
        "unknown config key",
        &[m, src, mnt, cd, cache, &os("--config"), toml.as_os_str()],
        &s.mnt,
        "cache-sise",
    );
    expect_usage_error(
        "bad size",
        &[m, src, mnt, cd, cache, &os("--cache-size"), &os("12X")],
        &s.mnt,
        "12X",
    );
    expect_usage_error(
        "bad -o option",
        &[m, src, mnt, cd, cache, &os("-o"), &os("ro,bogus_opt=1")],
        &s.mnt,
        "bogus",
    );
    expect_usage_error(
        "bad size in -o",
        &[m, src, mnt, cd, cache, &os("-o"), &os("cache_size=lots")],
        &s.mnt,
        "lots",
    );
    expect_usage_error(
        "bad --open-mode",
        &[m, src, mnt, cd, cache, &os("--open-mode"), &os("fast")],
        &s.mnt,
        "--open-mode \"fast\": expected passthrough or kernel",
    );
    expect_usage_error(
        "bad open_mode in -o",
        &[
            m,
            src,
            mnt,
            cd,
            cache,
            &os("-o"),
            &os("ro,open_mode=kernal"),
        ],
        &s.mnt,
        "kernal",
    );
    let toml_mode = t.join("mode.toml");
    fs::write(&toml_mode, "open-mode = \"direct\"\n").unwrap();
    expect_usage_error(
        "bad open-mode in the config file",
        &[
            m,
            src,
            mnt,
            cd,
            cache,
            &os("--config"),
            toml_mode.as_os_str(),
        ],
        &s.mnt,
        "direct",
    );
    expect_usage_error(
        "bad -o with --daemon",
        &[
            m,
            src,
            mnt,
            cd,
            cache,
            &os("--daemon"),
            &os("-o"),
            &os("bogus_opt"),
        ],
        &s.mnt,
        "bogus",
    );

    // Peer authentication: a secret or the three PEM files, never both nor
    // a part, from flags, -o or the TOML file alike.
    let cert = common::pki::TestCa::new("test CA")
        .node_files(t, "n1", "n1.example.com")
        .cert;
    let secret = t.join("secret");
    common::write_private(&secret, locafs::peer::tls::generate_secret().unwrap());
    let peer = [
        os("--listen"),
        os("127.0.0.1:17071"),
        os("--peers"),
        os("127.0.0.1:17071"),
    ];
    let mut args: Vec<&OsStr> = vec![m, src, mnt, cd, cache];
    args.extend(peer.iter().map(|a| a.as_os_str()));
    let (pca, pcert, pkey, psecret) = (
        os("--peer-ca"),
        os("--peer-cert"),
        os("--peer-key"),
        os("--cluster-secret-file"),
    );
    let mut both = args.clone();
    both.extend([
        pca.as_os_str(),
        cert.as_os_str(),
        &pcert,
        cert.as_os_str(),
        &pkey,
        cert.as_os_str(),
        &psecret,
        secret.as_os_str(),
    ]);
    expect_usage_error("secret and certificates", &both, &s.mnt, "give only one");
    let partial_o = os(&format!(
        "peer_ca={},peer_cert={}",
        cert.display(),
        cert.display()
    ));
    let mut partial = args.clone();
    partial.extend([OsStr::new("-o"), partial_o.as_os_str()]);
    expect_usage_error(
        "certificates without a key (-o)",
        &partial,
        &s.mnt,
        "--peer-key missing",
    );
    // (A copy of the certificate that only its owner may read: one that
    // others may read is refused before it is parsed.)
    let not_key = t.join("not-a-key.pem");
    common::write_private(&not_key, fs::read(&cert).unwrap());
    let toml = t.join("peer.toml");
    fs::write(
        &toml,
        format!(
            "peer-ca = {:?}\npeer-cert = {:?}\npeer-key = {:?}\n",
            cert.display().to_string(),
            cert.display().to_string(),
            not_key.display().to_string()
        ),
    )
    .unwrap();
    let mut no_key = args.clone();
    no_key.extend([OsStr::new("--config"), toml.as_os_str()]);
    expect_usage_error(
        "a --peer-key file without a key (TOML)",
        &no_key,
        &s.mnt,
        &format!("--peer-key {}: no private key found", not_key.display()),
    );
}

/// The pid recorded in the data set's lock file (the daemon that holds it).
fn lock_holder(cache: &Path) -> Option<u32> {
    let p = dataset_dir(cache).join("lock");
    fs::read_to_string(p).ok()?.trim().parse().ok()
}

/// Unmounts a --daemon mount and makes sure its process is gone.
struct DaemonGuard {
    mnt: PathBuf,
    pid: Option<u32>,
}

impl Drop for DaemonGuard {
    fn drop(&mut self) {
        force_unmount(&self.mnt);
        if let Some(pid) = self.pid {
            for _ in 0..100 {
                if !alive(pid) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            // The daemon we started; it did not exit on its own.
            let _ = signal(pid, Signal::KILL);
        }
    }
}

#[test]
fn daemon_returns_once_the_mount_is_live() {
    require_fuse!();
    let s = Scratch::new();
    write_file(&s.src.join("a"), 1, 100_000);
    let mut guard = DaemonGuard {
        mnt: s.mnt.clone(),
        pid: None,
    };
    let out = run_locafs(&[
        OsStr::new("mount"),
        s.src.as_os_str(),
        s.mnt.as_os_str(),
        OsStr::new("--cache-dir"),
        s.cache.as_os_str(),
        OsStr::new("--daemon"),
    ]);
    guard.pid = lock_holder(&s.cache);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Live right away: no waiting.
    assert!(
        is_fuse_mounted(&s.mnt),
        "--daemon returned before the mount was live"
    );
    let st = stats_of(&s.mnt);
    assert_eq!(st["source"], s.src.to_str().unwrap());
    assert_same_content(&s.src.join("a"), &s.mnt.join("a"));
    let pid = guard.pid.expect("daemon pid in the lock file");
    assert!(alive(pid));
    let st = Command::new("umount").arg(&s.mnt).status().unwrap();
    assert!(st.success());
    for _ in 0..200 {
        if !alive(pid) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!alive(pid), "the daemon did not exit after umount");
}

#[test]
fn sigterm_unmounts_and_exits_0() {
    require_fuse!();
    let s = Scratch::new();
    write_file(&s.src.join("a"), 1, 10);
    let mut m = s.mount(&[]);
    assert_same_content(&s.src.join("a"), &s.mnt.join("a"));
    signal(m.pid().unwrap(), Signal::TERM).unwrap();
    let st = m
        .wait_exit(Duration::from_secs(20))
        .expect("locafs did not exit on SIGTERM");
    assert_eq!(st.code(), Some(0), "stderr: {}", m.stderr());
    assert!(!is_mounted(&s.mnt), "still mounted after SIGTERM");
}

#[test]
fn umount_of_a_foreground_mount_exits_0() {
    require_fuse!();
    let s = Scratch::new();
    write_file(&s.src.join("a"), 1, 10);
    let mut m = s.mount(&[]);
    assert_same_content(&s.src.join("a"), &s.mnt.join("a"));
    let st = m.unmount();
    assert_eq!(st.code(), Some(0), "stderr: {}", m.stderr());
}

#[test]
fn source_file_shrinking_under_an_open_handle_never_yields_stale_bytes() {
    require_fuse!();
    let s = Scratch::new();
    const MIB: usize = 1 << 20;
    let p = s.src.join("shrinks");
    write_file(&p, 1, 8 * MIB);
    let orig = fs::read(&p).unwrap();
    write_file(&s.src.join("other"), 2, 3 * MIB);
    let m = s.mount(&[
        "--no-passthrough",
        "--block-size",
        "64KiB",
        "--memory-cache",
        "0",
    ]);
    let h = File::open(s.mnt.join("shrinks")).unwrap();
    let mut head = vec![0u8; 4096];
    assert_eq!(read_full_at(&h, &mut head, 0).unwrap(), 4096);
    assert!(head[..] == orig[..4096]);

    // Shrink the source file in place (same inode, new size and mtime).
    let f = OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(MIB as u64).unwrap();
    drop(f);

    for off in [3 * MIB, 6 * MIB, 8 * MIB - 4096] {
        let mut buf = vec![0u8; 64 * 1024];
        match read_full_at(&h, &mut buf, off as u64) {
            Err(e) => {
                let code = e.raw_os_error();
                assert!(
                    [Some(libc::EIO), Some(libc::ENOENT), Some(libc::ESTALE)].contains(&code),
                    "read at {off}: unexpected error {e}"
                );
            }
            Ok(n) => {
                // Only a short read is acceptable, and never bytes of the
                // old version or zeros standing in for them.
                assert_eq!(
                    n, 0,
                    "read at {off} returned {n} bytes of a region that no longer exists"
                );
            }
        }
    }
    // Other files stay readable, and so does the same file's new content
    // once it is opened again.
    assert_same_content(&s.src.join("other"), &s.mnt.join("other"));
    let st = m.stats();
    assert!(
        st["source_errors"].as_u64().unwrap() > 0 || st["read_errors"].as_u64().unwrap() > 0,
        "{st}"
    );
}

/// A user who may not mount (here: /dev/fuse hidden behind a root-only
/// file, in a mount namespace of the test's own, so that neither mount(2)
/// nor fusermount can help) gets exit 2, one line saying what mounting as
/// a user takes, and nothing left in the cache directory: no data set directory
/// the attempt made, no control socket in one that was there before.
#[test]
fn a_user_who_may_not_mount_gets_exit_2_what_it_takes_and_no_leftovers() {
    require_fuse!();
    for tool in ["setpriv", "unshare"] {
        if which(tool).is_none() {
            skip!("{tool} not installed");
        }
    }
    use std::os::unix::fs::PermissionsExt;
    let s = Scratch::new();
    write_file(&s.src.join("a"), 1, 1000);
    fs::set_permissions(s.path(), fs::Permissions::from_mode(0o755)).unwrap();
    for d in [&s.mnt, &s.cache] {
        std::os::unix::fs::chown(d, Some(65534), Some(65534)).unwrap();
    }
    let as_nobody = |args: &[&OsStr]| {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", bin()])
            .args(args)
            .output()
            .unwrap()
    };
    if !as_nobody(&["--version".as_ref()]).status.success() {
        skip!("user nobody cannot run {}", bin());
    }
    let blocker = s.path().join("no-fuse");
    fs::write(&blocker, b"").unwrap();
    fs::set_permissions(&blocker, fs::Permissions::from_mode(0o600)).unwrap();
    let attempt = || {
        Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c"])
            .arg(
                "mount --bind \"$1\" /dev/fuse && exec setpriv --reuid=65534 --regid=65534 \
                 --clear-groups \"$2\" mount \"$3\" \"$4\" --cache-dir \"$5\"",
            )
            .arg("sh")
            .args([blocker.as_os_str(), bin().as_ref()])
            .args([s.src.as_os_str(), s.mnt.as_os_str(), s.cache.as_os_str()])
            .output()
            .unwrap()
    };
    let dataset_dirs = || -> Vec<PathBuf> {
        fs::read_dir(&s.cache)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect()
    };
    let out = attempt();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let last = err.trim().lines().last().unwrap_or("");
    // Found before mount(2) is tried: the user's /dev/fuse does not open
    // (mount(2) itself would say "mounting needs root or CAP_SYS_ADMIN").
    assert!(
        last.starts_with("locafs: cannot open /dev/fuse (permission denied")
            && last.contains("mounting as a user needs /dev/fuse readable and writable by all"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(!is_mounted(&s.mnt));
    assert_eq!(dataset_dirs(), Vec::<PathBuf>::new(), "{err}");

    // A data set directory from before stays, without a stale socket.
    let id = locafs::mount::config::dataset_id(&fs::canonicalize(&s.src).unwrap());
    let kept = s.cache.join(id);
    fs::create_dir(&kept).unwrap();
    std::os::unix::fs::chown(&kept, Some(65534), Some(65534)).unwrap();
    let out = attempt();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert_eq!(dataset_dirs(), vec![kept.clone()]);
    assert!(!kept.join("control.sock").exists());
}
