//! `locafs mount`'s entry: what runs before anything is mounted and
//! decides which way the command goes: a mount systemd kept for this unit
//! (its descriptor store), a dead mount on the mountpoint detached, a live
//! locafs mount taken over, a data set served already attached to
//! ([`super::attach`]), or a new mount held ([`super::hold`]); and the
//! FUSE access check and `--daemon` (this same command run again in the
//! background, waited for until it says READY).
//!
//! It never serves a request and never looks at a live mount through the
//! mount itself, but for the dead-mount probe (a `statfs` in a child
//! process with a deadline).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode, Stdio};

use crate::mount::config::MountRequest;
use crate::mount::{forget_new_dataset_dir, READY_ENV};
use crate::obs::logging::short_io;

/// `locafs mount` (`daemon`: return once the mount is live, see
/// [`daemonize`]).
pub fn main(args: MountRequest, daemon: bool) -> ExitCode {
    // A unit restarted by systemd: the holder before left the mount in
    // systemd's descriptor store (before anything looks at the
    // mountpoint: nobody serves it until this holder starts a server).
    if let Some(stored) = super::systemd::take_stored() {
        if live_locafs_mount(&args) {
            let cfg = match crate::mount::config::resolve_live(&args) {
                Ok(c) => c,
                Err(e) => {
                    crate::obs::logging::say(&e.to_string());
                    return ExitCode::from(2);
                }
            };
            crate::obs::logging::init(cfg.log_format, cfg.log_file.as_deref());
            return super::hold_stored(&args, cfg, stored);
        }
        // (a mount gone since: its descriptors close here)
        drop(stored);
        super::systemd::forget_stored();
    }
    if let Err(e) = clear_dead_mount(&args) {
        // A mount that does not answer but whose holder is there (its
        // server hangs, and the watchdog has not replaced it yet): taking
        // it over replaces the server too (the holder kills it).
        if !(live_locafs_mount(&args) && holder_listens(&args)) {
            crate::obs::logging::say(&e.to_string());
            return ExitCode::from(2);
        }
    }
    if live_locafs_mount(&args) {
        // A live locafs mount there: take it over (new binary or options).
        let cfg = match crate::mount::config::resolve_live(&args) {
            Ok(c) => c,
            Err(e) => {
                crate::obs::logging::say(&e.to_string());
                return ExitCode::from(2);
            }
        };
        if daemon {
            return ExitCode::from(daemonize());
        }
        crate::obs::logging::init(cfg.log_format, cfg.log_file.as_deref());
        return super::take_over(&args, cfg);
    }
    let cfg = match crate::mount::config::resolve(&args) {
        Ok(c) => c,
        Err(e) => {
            // (a user who cannot open the cache dir of a root mount that
            // serves this data set: told that attaching needs root)
            if let Some(code) = super::attach::unprivileged(&args) {
                return code;
            }
            crate::obs::logging::say(&e.to_string());
            return ExitCode::from(2);
        }
    };
    if super::attach::holder_serves(&cfg) {
        // A process serves this data set already: a second mountpoint of
        // it, not a second process over the same cache.
        crate::obs::logging::init(cfg.log_format, cfg.log_file.as_deref());
        return super::attach::attach(&cfg, !daemon);
    }
    if let Err(msg) = check_fuse_access() {
        // The setup's problem, as a refused mount(2) is (exit 2: a restart
        // will not help), and nothing left behind.
        crate::obs::logging::say(&msg);
        forget_new_dataset_dir(&cfg);
        return ExitCode::from(2);
    }
    if daemon {
        // (The daemon resolves again and finds nothing left to change: what
        // this one changed is told here.)
        for n in &cfg.notes {
            eprintln!("locafs: {n}");
        }
        let code = daemonize();
        if code != 0 {
            forget_new_dataset_dir(&cfg);
        }
        return ExitCode::from(code);
    }
    crate::obs::logging::init(cfg.log_format, cfg.log_file.as_deref());
    super::hold(&args, cfg)
}

/// Whether the holder of the live mount the request names has its
/// takeover socket listening (a holder that died took its mount with it).
fn holder_listens(args: &MountRequest) -> bool {
    crate::mount::config::resolve_live(args).is_ok_and(|cfg| {
        super::takeover::listening(&super::takeover::socket_path(&cfg.dataset_dir))
    })
}

/// The mountpoint the request names: on the command line, or in its
/// configuration file (None if neither gives one: `resolve` says so).
fn requested_mountpoint(args: &MountRequest) -> Option<std::path::PathBuf> {
    match (&args.mountpoint, args.config_file()) {
        (Some(m), _) => Some(m.clone()),
        (None, Some(c)) => crate::mount::config::read_config(&c).ok()?.mountpoint,
        _ => None,
    }
}

/// Whether the mountpoint the request names has a locafs mount on it
/// (from /proc/self/mountinfo: the mount itself is not asked).
fn live_locafs_mount(args: &MountRequest) -> bool {
    requested_mountpoint(args)
        .and_then(|mp| crate::mount::dead_mount::table_path(&mp))
        .is_some_and(|abs| crate::sys::mount_fstype(&abs).as_deref() == Some("fuse.locafs"))
}

/// If the mountpoint holds a dead locafs mount (its daemon died: every
/// access fails with "Transport endpoint is not connected"), detaches it so
/// that a restart (systemd Restart=on-failure, a remount) mounts again over
/// the same cache (`dead_mount`). An error if a locafs mount there does not
/// answer.
fn clear_dead_mount(args: &MountRequest) -> Result<(), String> {
    match requested_mountpoint(args) {
        Some(mp) => crate::mount::dead_mount::clear(&mp).map(|_| ()),
        None => Ok(()),
    }
}

/// Whether this process can mount at all, and if not, the one line that
/// says why and what to do: it needs /dev/fuse open for reading and
/// writing, and without CAP_SYS_ADMIN (an ordinary user) the setuid helper
/// `fusermount3`, through which fuser mounts when mount(2) is refused.
/// Checked before anything is opened, so that a user sees this rather
/// than "Permission denied" or "No such file or directory" from fuser.
fn check_fuse_access() -> Result<(), String> {
    const DEV: &str = "/dev/fuse";
    if let Err(e) = std::fs::OpenOptions::new().read(true).write(true).open(DEV) {
        if e.kind() == std::io::ErrorKind::NotFound {
            return Err(format!(
                "{DEV} does not exist: this system offers no FUSE (in a container, add --device {DEV})"
            ));
        }
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(DEV)
            .map(|m| format!("mode {:04o}", m.permissions().mode() & 0o7777))
            .unwrap_or_else(|_| "mode unknown".into());
        return Err(format!(
            "cannot open {DEV} ({}, {mode}): mounting as a user needs {DEV} readable and writable by all (mode 0666, most distributions' default); ask an administrator, or mount as root",
            short_io(&e)
        ));
    }
    if !crate::sys::has_cap_sys_admin() && crate::sys::fusermount().is_none() {
        return Err("mounting as a user needs fusermount3, the setuid FUSE helper (package fuse3: apt install fuse3, dnf install fuse3), and none was found; or mount as root".into());
    }
    Ok(())
}

/// Starts this same command without --daemon in a new session and waits
/// until it says READY (exit 0) or dies (its exit status and message).
fn daemonize() -> u8 {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            crate::obs::logging::say(&format!("cannot find own executable: {e}"));
            return 1;
        }
    };
    let args: Vec<_> = std::env::args_os()
        .skip(1)
        .filter(|a| a != "--daemon")
        .collect();
    let mut cmd = Command::new(exe);
    cmd.args(args)
        .env(READY_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: setsid is async-signal-safe; it detaches the child from our
    // terminal and process group.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            crate::obs::logging::say(&format!("cannot start the daemon: {e}"));
            return 1;
        }
    };
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = BufReader::new(out).read_line(&mut line);
    }
    // (A closed stdout or stderr is no reason to fail a mount that is live.)
    if let Some(summary) = line.trim_end().strip_prefix("READY") {
        let _ = writeln!(std::io::stdout(), "locafs: {}", summary.trim());
        return 0;
    }
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let status = child.wait().ok().and_then(|s| s.code()).unwrap_or(1);
    let mut stderr = std::io::stderr();
    let _ = write!(stderr, "{err}");
    if err.is_empty() {
        crate::obs::logging::say("the daemon exited before the mount was ready");
    }
    if status == 0 {
        1
    } else {
        status as u8
    }
}
