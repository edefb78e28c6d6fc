//! POSIX ACLs at the source, enforced through a root mount for a second,
//! unprivileged user (`nobody`, run with `setpriv --reuid=65534
//! --regid=65534 --clear-groups`, as issue 33 tried it): a file 0644 whose
//! ACL refuses user nobody (`u:65534:---`), one whose ACL refuses nobody's
//! group (`g:65534:---`), a file that inherited a directory's default ACL,
//! and a directory whose ACL keeps nobody out are refused through the mount
//! exactly as at the source, while a plain 0644 file stays readable;
//! `getfacl` through the mount shows the source's ACLs (access and
//! default); and a change of ACL at the source shows through the mount
//! within `--revalidate`, both ways. What the mount answered nobody, it
//! answers the same after its serving process was killed while the source
//! stalls (the ACLs it read live in the shared state the holder keeps).
//! Each test says SKIPPED without root, /dev/fuse, `setfacl` or `setpriv`.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::*;

/// Skips the test unless ACLs can be set and a command run as nobody.
macro_rules! require_acl_tools {
    () => {
        require_fuse!();
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            skip!("needs root (to run commands as user nobody)");
        }
        for tool in ["setfacl", "getfacl", "setpriv"] {
            if which(tool).is_none() {
                skip!("needs {tool} (apt-get install acl util-linux)");
            }
        }
    };
}

/// `args` run as user and group 65534 (nobody, nogroup) with no
/// supplementary groups.
fn as_nobody(args: &[&str]) -> Output {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .args(args)
        .output()
        .expect("setpriv runs")
}

/// Whether nobody can read the file `p` (`cat`), with what it said if not.
fn nobody_reads(p: &Path) -> Result<Vec<u8>, String> {
    let out = as_nobody(&["cat", p.to_str().unwrap()]);
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

/// Whether nobody can list the directory `p` (`ls`).
fn nobody_lists(p: &Path) -> Result<(), String> {
    let out = as_nobody(&["ls", p.to_str().unwrap()]);
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

fn setfacl(args: &[&str], p: &Path) {
    let out = Command::new("setfacl")
        .args(args)
        .arg(p)
        .output()
        .expect("setfacl runs");
    assert!(
        out.status.success(),
        "setfacl {args:?} {}: {}",
        p.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `getfacl`'s entries of `p` (no header: the path differs).
fn getfacl(p: &Path) -> String {
    let out = Command::new("getfacl")
        .args(["--omit-header", "--numeric"])
        .arg(p)
        .output()
        .expect("getfacl runs");
    assert!(out.status.success(), "getfacl {}", p.display());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A scratch directory others may enter (tempfile makes it 0700), so that
/// nobody reaches the source and the mount point.
fn open_scratch() -> Scratch {
    let s = Scratch::new();
    for d in [s.path(), &s.src, &s.mnt] {
        fs::set_permissions(d, fs::Permissions::from_mode(0o755)).unwrap();
    }
    s
}

fn write_0644(p: &Path, text: &str) {
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, text).unwrap();
    fs::set_permissions(p, fs::Permissions::from_mode(0o644)).unwrap();
}

#[test]
fn what_a_source_acl_refuses_nobody_is_refused_through_the_mount() {
    require_acl_tools!();
    let s = open_scratch();
    let src = &s.src;
    write_0644(&src.join("open.txt"), "open");
    write_0644(&src.join("user-denied.txt"), "user");
    setfacl(&["-m", "u:65534:---"], &src.join("user-denied.txt"));
    write_0644(&src.join("group-denied.txt"), "group");
    setfacl(&["-m", "g:65534:---"], &src.join("group-denied.txt"));
    // A directory with a default ACL: a file made in it afterwards
    // inherits `u:65534:---` (its mode stays 0644 by the mask).
    fs::create_dir(src.join("inherits")).unwrap();
    fs::set_permissions(src.join("inherits"), fs::Permissions::from_mode(0o755)).unwrap();
    setfacl(&["-d", "-m", "u:65534:---"], &src.join("inherits"));
    fs::write(src.join("inherits/child.txt"), "child").unwrap();
    // A directory whose ACL keeps nobody out (mode 0755).
    write_0644(&src.join("closed/inside.txt"), "inside");
    fs::set_permissions(src.join("closed"), fs::Permissions::from_mode(0o755)).unwrap();
    setfacl(&["-m", "u:65534:---"], &src.join("closed"));

    // What the source itself allows nobody (ext4 here enforces ACLs).
    assert_eq!(nobody_reads(&src.join("open.txt")).unwrap(), b"open");
    for rel in [
        "user-denied.txt",
        "group-denied.txt",
        "inherits/child.txt",
        "closed/inside.txt",
    ] {
        if nobody_reads(&src.join(rel)).is_ok() {
            skip!("the source's file system does not enforce POSIX ACLs ({rel})");
        }
    }

    let _m = s.mount(&[]);
    let mnt = &s.mnt;
    assert_eq!(
        nobody_reads(&mnt.join("open.txt")).unwrap(),
        b"open",
        "a plain 0644 file stays readable"
    );
    for rel in ["user-denied.txt", "group-denied.txt", "inherits/child.txt"] {
        let e = nobody_reads(&mnt.join(rel))
            .expect_err(&format!("{rel}: read by nobody through the mount"));
        assert!(e.contains("Permission denied"), "{rel}: {e}");
    }
    let e = nobody_lists(&mnt.join("closed")).expect_err("closed/ listed by nobody");
    assert!(e.contains("Permission denied"), "closed/: {e}");
    let e = nobody_reads(&mnt.join("closed/inside.txt")).expect_err("closed/inside.txt read");
    assert!(e.contains("Permission denied"), "closed/inside.txt: {e}");
    // Root still reads everything (as at the source).
    assert_eq!(fs::read(mnt.join("user-denied.txt")).unwrap(), b"user");
    assert_eq!(fs::read(mnt.join("closed/inside.txt")).unwrap(), b"inside");
    // The mount shows the source's ACLs, the default one included.
    for rel in [
        "open.txt",
        "user-denied.txt",
        "group-denied.txt",
        "inherits",
        "inherits/child.txt",
        "closed",
    ] {
        assert_eq!(getfacl(&mnt.join(rel)), getfacl(&src.join(rel)), "{rel}");
    }
    assert!(getfacl(&mnt.join("inherits")).contains("default:user:65534:---"));
}

#[test]
fn a_change_of_acl_at_the_source_shows_through_the_mount_within_revalidate() {
    require_acl_tools!();
    let s = open_scratch();
    let f = s.src.join("data.bin");
    write_0644(&f, "payload");
    let _m = s.mount(&["--revalidate", "1s"]);
    let through = s.mnt.join("data.bin");
    assert_eq!(nobody_reads(&through).unwrap(), b"payload");
    // Far from the expected second, so that a loaded machine passes.
    let limit = Duration::from_secs(20);

    setfacl(&["-m", "u:65534:---"], &f);
    let t = Instant::now();
    wait_until("nobody refused after the ACL was set", limit, || {
        nobody_reads(&through).is_err()
    });
    eprintln!("refused {:.1}s after setfacl -m", t.elapsed().as_secs_f64());
    // Refused from then on (not one lucky answer).
    for _ in 0..3 {
        assert!(nobody_reads(&through).is_err());
    }

    setfacl(&["-x", "u:65534"], &f);
    let t = Instant::now();
    wait_until(
        "nobody reads again after the ACL entry was removed",
        limit,
        || nobody_reads(&through).is_ok(),
    );
    eprintln!(
        "readable {:.1}s after setfacl -x",
        t.elapsed().as_secs_f64()
    );
    assert_eq!(nobody_reads(&through).unwrap(), b"payload");
}

#[test]
fn acl_answers_survive_a_killed_server_while_the_source_stalls() {
    require_acl_tools!();
    let s = open_scratch();
    write_0644(&s.src.join("open.txt"), "open");
    write_0644(&s.src.join("denied.txt"), "denied");
    setfacl(&["-m", "u:65534:---"], &s.src.join("denied.txt"));
    if nobody_reads(&s.src.join("denied.txt")).is_ok() {
        skip!("the source's file system does not enforce POSIX ACLs");
    }
    // The source: the data served by another locafs process (attributes
    // never cached by the kernel: --revalidate 0s), so that SIGSTOP of
    // its serving process stalls it as a hung NFS server would.
    let inner_mnt = s.path().join("inner");
    let inner_cache = s.path().join("inner-cache");
    fs::create_dir_all(&inner_mnt).unwrap();
    fs::set_permissions(&inner_mnt, fs::Permissions::from_mode(0o755)).unwrap();
    let inner = Mount::start(
        &s.src,
        &inner_mnt,
        &inner_cache,
        &["--no-readahead", "--no-passthrough", "--revalidate", "0s"],
    );
    // The mount under test: the kernel asks for ACLs again once the
    // attributes it holds are a second old.
    let m = Mount::start(
        &inner_mnt,
        &s.mnt,
        &s.cache,
        &["--revalidate", "1s", "--metadata-timeout", "1s"],
    );
    let answers = || {
        (
            nobody_reads(&s.mnt.join("open.txt")),
            nobody_reads(&s.mnt.join("denied.txt")),
        )
    };
    let before = answers();
    assert_eq!(before.0.as_deref(), Ok(&b"open"[..]));
    let e = before.1.clone().expect_err("denied.txt read by nobody");
    assert!(e.contains("Permission denied"), "{e}");

    let old = common::restart::kill_server(&s.mnt);
    common::restart::wait_new_server(&s.mnt, old, Duration::from_secs(60));
    let inner_pid = common::restart::server_pid(&inner_mnt).expect("the source's server");
    signal(inner_pid, Signal::STOP).unwrap();
    let cont = ResumeOnDrop(inner_pid);
    // Past the kernel's attribute timeout several times over: every
    // answer is the one given before the kill (no ETIMEDOUT: the ACLs,
    // and the knowledge that open.txt has none, were not lost).
    let t = Instant::now();
    let mut checks = 0;
    while t.elapsed() < Duration::from_secs(4) {
        assert_eq!(answers(), before, "after {:?} of stall", t.elapsed());
        checks += 1;
    }
    eprintln!("{checks} checks of nobody's access while the source stalled");
    drop(cont);
    drop(m);
    drop(inner);
}
