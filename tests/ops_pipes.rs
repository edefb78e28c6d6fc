//! Every command ends quietly when its reader goes away, as Unix tools do
//! (`locafs where MNT | head -1`): no panic ("failed printing to stdout:
//! Broken pipe", exit 101), no message; killed by SIGPIPE like `cat`, or
//! exit 0. Each command runs with its stdout on a pipe whose read end is
//! already closed (the first write fails at once, whatever the output's
//! size), and once more into `head -1` through a real shell pipeline. A
//! mount keeps serving whatever happens to the pipes of the commands that
//! talk to it, and `mount --daemon` with a closed stdout still mounts.

mod common;

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

use common::*;

/// Runs `locafs ARGS` with stdout (and with `stderr_too`, stderr) on a
/// pipe nobody reads: its exit status and stderr. Killed after 60 s (a
/// `--watch` that did not notice would run forever).
fn into_closed_pipe(args: &[OsString], stderr_too: bool) -> (ExitStatus, String) {
    let writer = closed_pipe();
    let err_path = tempfile::NamedTempFile::new().unwrap();
    let stderr = if stderr_too {
        Stdio::from(writer.try_clone().unwrap())
    } else {
        Stdio::from(err_path.reopen().unwrap())
    };
    let mut child = Command::new(bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(stderr)
        .spawn()
        .unwrap();
    let ended = wait_for(Duration::from_secs(60), || {
        child.try_wait().ok().flatten().is_some()
    });
    if !ended {
        let _ = child.kill();
    }
    let st = child.wait().unwrap();
    assert!(ended, "locafs {args:?} did not end on a closed pipe");
    (st, std::fs::read_to_string(err_path.path()).unwrap())
}

/// The write end of a pipe whose read end is closed.
fn closed_pipe() -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors that we then own.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both are fresh descriptors owned by nothing else.
    let (reader, writer) = unsafe {
        (
            std::os::fd::OwnedFd::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    };
    drop(reader);
    writer
}

/// Quiet: SIGPIPE's default action (killed by signal 13) or exit 0, and
/// nothing on stderr.
fn assert_quiet(what: &str, st: ExitStatus, err: &str) {
    assert!(
        st.signal() == Some(libc::SIGPIPE) || st.code() == Some(0),
        "{what}: {st}; stderr: {err}"
    );
    assert!(err.is_empty(), "{what}: stderr: {err}");
}

fn os(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

#[test]
fn every_command_ends_quietly_on_a_closed_pipe() {
    require_fuse!();
    let sc = Scratch::new();
    // Enough files that `where` prints more than a pipe holds (64 KiB).
    for i in 0..3000 {
        std::fs::write(sc.src.join(format!("sample-{i:05}.bin")), [i as u8; 16]).unwrap();
    }
    let m = sc.mount(&[]);
    let mnt = sc.mnt.to_str().unwrap();
    let cache = sc.cache.to_str().unwrap();
    let order = sc.dir.path().join("order.txt");
    std::fs::write(&order, "sample-00001.bin\nsample-00002.bin\n").unwrap();
    let order = order.to_str().unwrap();
    let one = format!("{mnt}/sample-00007.bin");

    let commands: Vec<Vec<&str>> = vec![
        vec!["--help"],
        vec!["--version"],
        vec!["mount", "--help"],
        vec!["stats", mnt],
        vec!["stats", mnt, "--json"],
        vec!["stats", mnt, "--watch"],
        vec!["stats", mnt, "--watch", "--json"],
        vec!["where", mnt],
        vec!["where", mnt, "--json"],
        vec!["where", mnt, &one],
        vec!["warm", mnt, "--jobs", "2"],
        vec!["plan", mnt, order],
        vec!["secret"],
        vec!["cache", "ls", "--cache-dir", cache],
        vec!["cache", "ls", "--cache-dir", cache, "--json"],
        vec![
            "cache",
            "gc",
            "--cache-dir",
            cache,
            "--to",
            "1MiB",
            "--dry-run",
        ],
    ];
    for c in &commands {
        let (st, err) = into_closed_pipe(&os(c), false);
        assert_quiet(&format!("locafs {}", c.join(" ")), st, &err);
        // stdout and stderr on the same closed pipe (`2>&1 | head`): no
        // panic either (nothing to read: the exit status says it).
        let (st, _) = into_closed_pipe(&os(c), true);
        assert!(
            st.signal() == Some(libc::SIGPIPE) || st.code() == Some(0),
            "locafs {} 2>&1 into a closed pipe: {st}",
            c.join(" ")
        );
    }
    // A command that fails says so on a stderr that is a closed pipe
    // without a panic: killed by SIGPIPE, not exit 101.
    let (st, _) = into_closed_pipe(&os(&["stats", "/nonexistent-locafs"]), true);
    assert_ne!(st.code(), Some(101), "{st}");

    // The pipeline, through a shell: `head -1` gets its line, the
    // pipeline succeeds, and nothing else is printed.
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("'{}' where '{mnt}' | head -1", bin()))
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 1);
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The mount served all of it and still does.
    assert_eq!(
        std::fs::read(sc.mnt.join("sample-00042.bin")).unwrap(),
        [42u8; 16]
    );
    drop(m);
}

#[test]
fn mount_daemon_with_a_closed_stdout_still_mounts() {
    require_fuse!();
    let sc = Scratch::with_sample_files();
    // Owner-only already, so that the mount has nothing to say on stderr
    // (else: "made owner-only (it was 0755)").
    std::fs::set_permissions(
        &sc.cache,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let args: Vec<OsString> = vec![
        "mount".into(),
        sc.src.clone().into(),
        sc.mnt.clone().into(),
        "--cache-dir".into(),
        sc.cache.clone().into(),
        "--daemon".into(),
    ];
    let (st, err) = into_closed_pipe(&args, false);
    let pid: Option<u32> = std::fs::read_to_string(sc.dataset_dir().join("lock"))
        .ok()
        .and_then(|s| s.trim().parse().ok());
    struct Cleanup<'a>(&'a std::path::Path, Option<u32>);
    impl Drop for Cleanup<'_> {
        fn drop(&mut self) {
            force_unmount(self.0);
            if let Some(p) = self.1 {
                let _ = signal(p, Signal::KILL);
            }
        }
    }
    let _c = Cleanup(&sc.mnt, pid);
    assert_eq!(st.code(), Some(0), "{st}: {err}");
    assert!(err.is_empty(), "{err}");
    assert_eq!(mount_type(&sc.mnt).as_deref(), Some("fuse.locafs"));
    sc.check_files_through_mount();
    // The daemon does not die of a client that hangs up on it either.
    let (st, _) = into_closed_pipe(&os(&["stats", sc.mnt.to_str().unwrap()]), true);
    assert!(st.signal() == Some(libc::SIGPIPE) || st.success());
    sc.check_files_through_mount();
}
