//! A second `locafs mount SRC /mnt/b` of a data set that a locafs process
//! already serves from the same cache directory: rather than a second
//! process over a second copy of the cache (refused: the data set's lock is
//! held), the new mountpoint is attached to the running mount. The command
//! asks the holder (its takeover socket, with the same credential checks:
//! [`super::takeover::connect`]) for its offer, refuses with exit 2 if an
//! option that changes what is served differs (one line naming each), and
//! otherwise bind-mounts a live mountpoint of that FUSE connection (as
//! /proc/self/mountinfo lists it) onto the new one: the same connection,
//! so the same process, cache, namespace, read-ahead, budget booking and
//! peer identity. Then it behaves as a mount for its user: in the
//! foreground it stays until its mountpoint is unmounted, and on
//! SIGTERM/SIGINT unmounts its own path (lazily if busy) and exits 0; with
//! `--daemon` it returns once attached; under systemd it says READY once
//! attached. The holder exits, as always, when its connection ends: when
//! the last of the data set's mountpoints is gone.
//!
//! Attaching needs CAP_SYS_ADMIN (a bind mount): as a user, it is refused
//! with what to do instead. It never serves a request, never opens the
//! cache and never takes the data set's lock.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use tracing::info;

use super::takeover::{self, NotTaken};
use crate::mount::config::{MountConfig, MountRequest};
use crate::mount::connection;

/// Whether `cfg`'s data set is served by a live holder this command could
/// attach to (its socket listens, in this network namespace).
pub fn holder_serves(cfg: &MountConfig) -> bool {
    takeover::listening(&takeover::socket_path(&cfg.dataset_dir))
}

/// For a caller without CAP_SYS_ADMIN, before the cache dir is opened (a
/// root mount's cache dir is not this user's to open): if a holder serves
/// the data set the request names, the one line that says attaching needs
/// root, and exit 2.
pub fn unprivileged(args: &MountRequest) -> Option<ExitCode> {
    if crate::sys::has_cap_sys_admin() {
        return None;
    }
    let dir = crate::mount::config::dataset_dir_path(args)?;
    if !takeover::listening(&takeover::socket_path(&dir)) {
        return None;
    }
    let mp = args
        .mountpoint
        .as_deref()
        .map_or("MOUNTPOINT".into(), |m| m.display().to_string());
    let served = crate::mount::config::source_path(args)
        .map(|s| mountpoints_of_source(&s))
        .unwrap_or_default();
    let there = match served.first() {
        Some(p) => format!(" at {}", p.display()),
        None => String::new(),
    };
    let through = served
        .first()
        .map_or("its mountpoint".into(), |p| p.display().to_string());
    crate::obs::logging::say(&format!(
        "mountpoint {mp}: this data set (cache {}) is already mounted{there} by a locafs process; attaching a second mountpoint to it needs root (a bind mount, CAP_SYS_ADMIN): as this user, read through {through} or a symlink to it (ln -s {through} {mp})",
        dir.display()
    ));
    Some(ExitCode::from(2))
}

/// The live locafs mounts whose file system name is `source`'s.
fn mountpoints_of_source(source: &Path) -> Vec<PathBuf> {
    let want = format!("locafs:{}", source.display());
    crate::sys::mounts()
        .into_iter()
        .filter(|m| m.fstype == "fuse.locafs" && m.source == want.as_bytes())
        .map(|m| m.mountpoint)
        .collect()
}

/// Attaches `cfg`'s mountpoint to the running mount of its data set; in
/// the foreground (`stay`) waits until it is unmounted.
pub fn attach(cfg: &MountConfig, stay: bool) -> ExitCode {
    let mp = cfg.mountpoint.display().to_string();
    let fail = |code: u8, msg: String| {
        crate::obs::logging::say(&format!("mountpoint {mp}: {msg}"));
        ExitCode::from(code)
    };
    let sock = takeover::socket_path(&cfg.dataset_dir);
    let (offer, stream) = match takeover::connect(&sock) {
        Ok(o) => o,
        Err(NotTaken::NoHolder(why) | NotTaken::Refused(why) | NotTaken::Failed(why)) => {
            return fail(
                2,
                format!(
                    "cache dir {} is in use by a locafs mount that does not answer ({why})",
                    cfg.dataset_dir.display()
                ),
            )
        }
    };
    let refuse = |why: &str| {
        let _ = (&stream).write_all(format!("REFUSE {why}\n").as_bytes());
    };
    let running = format!(
        "the running mount of this data set ({}, locafs pid {})",
        offer
            .mountpoint
            .as_ref()
            .map_or("?".into(), |p| p.display().to_string()),
        offer.pid
    );
    if let Some(why) = takeover::attach_refusal(&offer, cfg) {
        refuse("options differ");
        return fail(
            2,
            format!(
                "cannot attach to {running}: {}; unmount it to change these, or mount with another --cache-dir",
                why.join("; ")
            ),
        );
    }
    if !crate::sys::has_cap_sys_admin() {
        refuse("not root");
        return fail(
            2,
            format!(
                "attaching a second mountpoint to {running} needs root (a bind mount, CAP_SYS_ADMIN): as this user, read through its mountpoint or a symlink to it"
            ),
        );
    }
    let Some(n) = offer.connection else {
        refuse("no connection");
        return fail(2, format!("{running} does not say its connection"));
    };
    // The holder's own mountpoint if it is still there, else any other.
    let live = connection::mountpoints_of(n);
    let from = offer
        .mountpoint
        .clone()
        .filter(|p| live.contains(p))
        .or_else(|| live.first().cloned());
    let Some(from) = from else {
        refuse("no mountpoint");
        return fail(1, format!("{running} has no mountpoint left"));
    };
    // Caught before the bind mount: a SIGTERM right after it unmounts what
    // it made rather than leave a mount nobody stands for.
    let signals = match super::signals::Signals::catch(&[libc::SIGTERM, libc::SIGINT, libc::SIGHUP])
    {
        Ok(s) => s,
        Err(e) => {
            refuse("signals");
            return fail(1, format!("signals: {e}"));
        }
    };
    if let Err(e) = rustix::mount::mount_bind(&from, &cfg.mountpoint) {
        refuse("bind mount failed");
        return fail(1, format!("bind mount of {} failed: {e}", from.display()));
    }
    let _ = (&stream).write_all(format!("ATTACH {mp}\n").as_bytes());
    drop(stream);
    let kept = takeover::tuning_kept(&offer, cfg);
    if !kept.is_empty() {
        info!(
            "the running process's tuning stays (to change it, run this locafs mount over {}): {}",
            from.display(),
            kept.join("; ")
        );
    }
    let summary = format!(
        "{mp} attached to {running}: one process, one cache (served as {})",
        from.display()
    );
    if !stay {
        println!("locafs: {summary}");
        return ExitCode::SUCCESS;
    }
    info!("{summary}");
    crate::mount::announce_ready(&summary);
    wait_unmounted(&cfg.mountpoint, n, &signals)
}

/// How often a waiting attached mount asks whether its connection still
/// has a process behind it.
const ALIVE_EVERY: Duration = Duration::from_secs(2);

/// Stays until `mp` is no longer a mount of connection `n` (exit 0), or a
/// signal says stop: then unmounts `mp` (lazily if busy) and exits 0. If
/// the process serving the connection is gone for good (its holder killed:
/// reads fail with ENOTCONN), `mp` is detached and the exit is 1, as the
/// holder's own would be.
fn wait_unmounted(mp: &Path, n: u32, signals: &super::signals::Signals) -> ExitCode {
    let mut asked = std::time::Instant::now();
    loop {
        if connection::connection_number(mp) != Some(n) {
            info!("{} unmounted", mp.display());
            return ExitCode::SUCCESS;
        }
        let _ = super::signals::wait_readable(&[signals.fd()], Duration::from_millis(200));
        if asked.elapsed() >= ALIVE_EVERY {
            asked = std::time::Instant::now();
            let deadline = crate::mount::dead_mount::PROBE_DEADLINE;
            if crate::mount::dead_mount::probe(mp, deadline)
                == crate::mount::dead_mount::MountState::Dead
            {
                tracing::error!(
                    "{}: the locafs process serving it is gone (its holder died); detaching it",
                    mp.display()
                );
                let _ = crate::sys::lazy_unmount(mp);
                return ExitCode::from(1);
            }
        }
        if let Some(sig) = signals.drain().into_iter().next() {
            crate::sys::sd_notify("STOPPING=1");
            info!("signal {sig} received: unmounting {}", mp.display());
            let r = match crate::sys::unmount(mp) {
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    tracing::warn!(
                        "{} is busy: detaching it (files open through it read on until closed)",
                        mp.display()
                    );
                    crate::sys::lazy_unmount(mp)
                }
                r => r,
            };
            if let Err(e) = r {
                tracing::error!("unmount of {} failed: {e}", mp.display());
                return ExitCode::from(1);
            }
            return ExitCode::SUCCESS;
        }
    }
}
