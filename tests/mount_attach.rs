//! One data set, several mountpoints, one process (docs/operations.md,
//! "Many jobs on one node"): a second `locafs mount SRC /mnt/b` over the
//! cache dir a running mount holds attaches /mnt/b to that mount (a bind
//! mount of its live mountpoint) instead of being refused. Real FUSE, real
//! `locafs` processes, the commands the docs show:
//!
//! - both mountpoints give the source's bytes, from one cache: what the
//!   first read, the second reads with no source byte;
//! - either mountpoint goes on its own (umount, or SIGTERM to the command
//!   that made it); the holder exits when the last one goes;
//! - `locafs stats` and `locafs cache ls` show every mountpoint;
//! - an option that changes what is served is refused (exit 2, naming it),
//!   one that tunes the process keeps the running value (said once);
//! - a user without CAP_SYS_ADMIN gets exit 2 and what to do instead.

mod common;

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output};
use std::time::Duration;

use common::*;

/// `umount P` (the command a user types). Tried again while "busy": the
/// holder's watchdog probe asks the mountpoint once a second, and a umount
/// in the instant its request is out finds the mount in use.
fn umount(p: &Path) {
    let mut last = None;
    for _ in 0..50 {
        let out = Command::new("umount").arg(p).output().expect("umount");
        if out.status.success() {
            return;
        }
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        if !err.contains("busy") {
            panic!("umount {}: {err}", p.display());
        }
        last = Some(err);
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("umount {}: {}", p.display(), last.unwrap_or_default());
}

/// `locafs mount SRC MNT --cache-dir CACHE EXTRA...` run to completion.
fn mount_cmd(sc: &Scratch, mnt: &Path, extra: &[&str]) -> Output {
    let mut args: Vec<&OsStr> = vec![
        "mount".as_ref(),
        sc.src.as_os_str(),
        mnt.as_os_str(),
        "--cache-dir".as_ref(),
        sc.cache.as_os_str(),
    ];
    args.extend(extra.iter().map(OsStr::new));
    run_locafs(&args)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Every file of the scratch read through `mnt` with the source's bytes.
fn check_files(sc: &Scratch, mnt: &Path) {
    for (name, data) in &sc.files {
        let got = fs::read(mnt.join(name)).unwrap_or_else(|e| panic!("{name} via {mnt:?}: {e}"));
        assert!(
            got == *data,
            "{name}: wrong bytes through {}",
            mnt.display()
        );
    }
}

/// The `mountpoints` of `locafs stats MNT --json`.
fn stats_mountpoints(mnt: &Path) -> Vec<PathBuf> {
    let v = stats_of(mnt);
    v["mountpoints"]
        .as_array()
        .unwrap_or_else(|| panic!("no mountpoints in {v}"))
        .iter()
        .map(|p| PathBuf::from(p.as_str().unwrap()))
        .collect()
}

fn sorted(mut v: Vec<PathBuf>) -> Vec<PathBuf> {
    v.sort();
    v
}

fn exited_ok(st: Option<ExitStatus>, what: &str) {
    let st = st.unwrap_or_else(|| panic!("{what} did not exit"));
    assert!(st.success(), "{what}: {st}");
}

#[test]
fn a_second_mount_of_a_data_set_attaches_to_it_and_reads_no_source_byte_again() {
    require_fuse!();
    let sc = Scratch::with_sample_files();
    let mnt_b = sc.path().join("mnt-b");
    fs::create_dir(&mnt_b).unwrap();
    let mut a = sc.mount(&[]);
    check_files(&sc, &sc.mnt);
    let first = stats_of(&sc.mnt);
    let source_bytes = first["source_bytes"].as_u64().unwrap();
    assert!(source_bytes > 0, "{first}");
    let server = first["pid"].clone();

    // The same command for a second job: attached, not refused.
    let mut b = Mount::start(&sc.src, &mnt_b, &sc.cache, &[]);
    // (said just after the bind mount shows)
    wait_until("the attach to be said", Duration::from_secs(20), || {
        b.stderr().contains("attached to the running mount")
    });
    let _ = try_drop_page_cache();
    check_files(&sc, &mnt_b);
    let via_b = stats_of(&mnt_b);
    assert_eq!(
        via_b["source_bytes"].as_u64(),
        Some(source_bytes),
        "the second mountpoint read from the source: {via_b}"
    );
    assert_eq!(via_b["pid"], server, "one serving process: {via_b}");
    let both = sorted(vec![sc.mnt.clone(), mnt_b.clone()]);
    assert_eq!(sorted(stats_mountpoints(&mnt_b)), both);
    assert_eq!(sorted(stats_mountpoints(&sc.mnt)), both);
    let table = run_locafs(&["stats".as_ref(), mnt_b.as_os_str()]);
    let table = text(&table.stdout);
    assert!(
        table.contains(&format!("{}, {}", both[0].display(), both[1].display())),
        "{table}"
    );

    // `locafs cache ls` (as JSON and as the table) lists both.
    let ls = run_locafs(&[
        "cache".as_ref(),
        "ls".as_ref(),
        "--json".as_ref(),
        "--cache-dir".as_ref(),
        sc.cache.as_os_str(),
    ]);
    let v: serde_json::Value = serde_json::from_slice(&ls.stdout).expect("cache ls JSON");
    let listed: Vec<PathBuf> = v["datasets"][0]["mountpoints"]
        .as_array()
        .unwrap_or_else(|| panic!("no mountpoints in {v}"))
        .iter()
        .map(|p| PathBuf::from(p.as_str().unwrap()))
        .collect();
    assert_eq!(sorted(listed), both, "{v}");
    let ls = run_locafs(&[
        "cache".as_ref(),
        "ls".as_ref(),
        "--cache-dir".as_ref(),
        sc.cache.as_os_str(),
    ]);
    let ls = text(&ls.stdout);
    assert!(ls.contains(&format!(" at {}, ", both[0].display())), "{ls}");

    // The first mountpoint goes: the second reads on, the holder stays.
    umount(&sc.mnt);
    assert!(!is_mounted(&sc.mnt));
    let _ = try_drop_page_cache();
    check_files(&sc, &mnt_b);
    assert!(
        a.wait_exit(Duration::from_millis(500)).is_none(),
        "the holder exited while {} was mounted: {}",
        mnt_b.display(),
        a.stderr()
    );
    assert_eq!(stats_mountpoints(&mnt_b), vec![mnt_b.clone()]);

    // The last one goes: the command that made it and the holder exit 0.
    exited_ok(Some(b.unmount()), "the second locafs mount");
    exited_ok(a.wait_exit(Duration::from_secs(30)), "the holder");
    assert!(a.stderr().contains("attached"), "{}", a.stderr());
}

#[test]
fn sigterm_unmounts_only_the_mountpoint_of_the_command_that_gets_it() {
    require_fuse!();
    let sc = Scratch::with_sample_files();
    let mnt_b = sc.path().join("mnt-b");
    fs::create_dir(&mnt_b).unwrap();
    let mut a = sc.mount(&[]);
    let mut b = Mount::start(&sc.src, &mnt_b, &sc.cache, &[]);

    // SIGTERM to the second command: its mountpoint goes, the first stays.
    signal(b.pid().unwrap(), Signal::TERM).unwrap();
    exited_ok(
        b.wait_exit(Duration::from_secs(20)),
        "the second locafs mount",
    );
    assert!(!is_mounted(&mnt_b));
    check_files(&sc, &sc.mnt);

    // Attached again, then SIGTERM to the holder: its own mountpoint goes,
    // it serves the other until that is unmounted.
    let mut b = Mount::start(&sc.src, &mnt_b, &sc.cache, &[]);
    signal(a.pid().unwrap(), Signal::TERM).unwrap();
    wait_until(
        "the holder's mountpoint to go",
        Duration::from_secs(20),
        || !is_mounted(&sc.mnt),
    );
    let _ = try_drop_page_cache();
    check_files(&sc, &mnt_b);
    assert!(a.wait_exit(Duration::from_millis(500)).is_none());
    exited_ok(Some(b.unmount()), "the second locafs mount");
    exited_ok(a.wait_exit(Duration::from_secs(30)), "the holder");
}

#[test]
fn an_option_that_changes_what_is_served_is_refused_one_that_tunes_is_kept() {
    require_fuse!();
    let sc = Scratch::with_sample_files();
    let mnt_b = sc.path().join("mnt-b");
    fs::create_dir(&mnt_b).unwrap();
    let _a = sc.mount(&["--fuse-threads", "2"]);

    let out = mount_cmd(
        &sc,
        &mnt_b,
        &["--block-size", "4M", "--immutable", "--fuse-threads", "2"],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("--block-size is 1.0 MiB there, not 4.0 MiB")
            && err.contains("--immutable is off there, not on"),
        "{err}"
    );
    assert!(!is_mounted(&mnt_b));
    check_files(&sc, &sc.mnt);

    // --daemon: returns once attached; the process's tuning stays.
    let out = mount_cmd(&sc, &mnt_b, &["--daemon", "--fuse-threads", "3"]);
    let (o, e) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{o}{e}");
    assert!(o.contains("attached"), "{o}");
    assert!(
        e.contains("tuning stays") && e.contains("--fuse-threads is 2 there, not 3"),
        "{e}"
    );
    // (only what differs is named)
    assert!(!e.contains("--prefetch-memory"), "{e}");
    check_files(&sc, &mnt_b);
    umount(&mnt_b);
    check_files(&sc, &sc.mnt);
}

#[test]
fn a_user_without_cap_sys_admin_is_told_attaching_needs_root() {
    require_fuse!();
    if which("setpriv").is_none() {
        skip!("setpriv not installed");
    }
    use std::os::unix::fs::PermissionsExt;
    let sc = Scratch::with_sample_files();
    fs::set_permissions(sc.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let mnt_b = sc.path().join("mnt-b");
    fs::create_dir(&mnt_b).unwrap();
    std::os::unix::fs::chown(&mnt_b, Some(65534), Some(65534)).unwrap();
    let _a = sc.mount(&[]);
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
    let out = as_nobody(&[
        "mount".as_ref(),
        sc.src.as_os_str(),
        mnt_b.as_os_str(),
        "--cache-dir".as_ref(),
        sc.cache.as_os_str(),
    ]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("needs root") && err.contains(&format!("read through {}", sc.mnt.display())),
        "{err}"
    );
    assert!(!is_mounted(&mnt_b));
    check_files(&sc, &sc.mnt);
}

#[test]
fn an_attached_mount_whose_holder_is_killed_is_detached_and_its_command_fails() {
    require_fuse!();
    let sc = Scratch::with_sample_files();
    let mnt_b = sc.path().join("mnt-b");
    fs::create_dir(&mnt_b).unwrap();
    let mut a = sc.mount(&[]);
    let mut b = Mount::start(&sc.src, &mnt_b, &sc.cache, &[]);
    check_files(&sc, &mnt_b);
    // The holder killed outside systemd: its mount dies (ENOTCONN), the
    // attached one with it; the command that made it must not wait on a
    // dead mountpoint for ever.
    a.kill9_and_detach();
    let st = b
        .wait_exit(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("the attached command waits on a dead mount: {}", b.stderr()));
    assert_eq!(st.code(), Some(1), "{}", b.stderr());
    assert!(
        !is_mounted(&mnt_b),
        "the dead mount is left at {}",
        mnt_b.display()
    );
    assert!(b.stderr().contains("is gone"), "{}", b.stderr());
    // The next mount of the data set works as after any holder's death.
    let _a = sc.mount(&[]);
    check_files(&sc, &sc.mnt);
}

#[test]
fn the_watchdog_watches_an_attached_mountpoint_once_the_first_is_unmounted() {
    require_fuse!();
    let sc = Scratch::with_sample_files();
    let mnt_b = sc.path().join("mnt-b");
    fs::create_dir(&mnt_b).unwrap();
    let mut a = sc.mount(&["--watchdog", "2s"]);
    let mut b = Mount::start(&sc.src, &mnt_b, &sc.cache, &[]);
    umount(&sc.mnt);
    check_files(&sc, &mnt_b);
    // The server stops answering while only /mnt/b is left: the holder's
    // probe must ask /mnt/b (its own mountpoint is a plain directory now,
    // which never hangs) and replace the server.
    let stopped = common::restart::server_pid(&mnt_b).expect("a server answers");
    signal(stopped, Signal::STOP).unwrap();
    let reader = {
        let mnt_b = mnt_b.clone();
        let files = sc.files.clone();
        std::thread::spawn(move || {
            for (name, data) in &files {
                let got = fs::read(mnt_b.join(name)).map_err(|e| format!("{name}: {e}"))?;
                if got != *data {
                    return Err(format!("{name}: wrong bytes"));
                }
            }
            Ok(())
        })
    };
    // (the holder's log, not a request: one would wait on the stopped
    // server)
    let replaced = wait_for(Duration::from_secs(60), || a.stderr().contains("watchdog:"));
    if !replaced {
        // (else the reader, and the test's end, would wait on it for ever)
        let _ = signal(stopped, Signal::KILL);
        panic!(
            "the stopped server was not replaced within 60 s: {}",
            a.stderr()
        );
    }
    reader
        .join()
        .unwrap()
        .expect("a read through /mnt/b failed");
    let now = common::restart::server_pid(&mnt_b).expect("a server answers");
    assert_ne!(now, stopped, "{}", a.stderr());
    exited_ok(Some(b.unmount()), "the second locafs mount");
    exited_ok(a.wait_exit(Duration::from_secs(30)), "the holder");
}
