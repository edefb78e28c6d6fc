//! A mount's life: its options (`config`, everything wrong with the user's
//! input found before anything is mounted), its FUSE connection
//! (`connection`), assembling its parts (`assemble`) and serving them
//! (`server`), the namespace manifest beside the cache (`manifest`), the
//! control socket (`control`), a restart over a dead mount (`dead_mount`),
//! and the process that holds the mount while servers come and go
//! (`supervisor`). Only the command line sits above it.
//!
//! A mount is made in two steps, the same way for every caller:
//! `assemble::assemble` builds and wires the parts over any `Source` in
//! the shared state (nothing mounted, nothing served), then
//! `server::Server` serves them (control socket, metrics, manifest saver,
//! then the FUSE session over a connection's descriptors). `Server::build`
//! is both steps but the session; the server process (`supervisor::serve`,
//! which is every restart and takeover too) and `Mount` call it. This
//! file holds `Mount`, a connection, the lock and a server in one process
//! (tests, benchmarks), and what the callers share around a mount: the
//! source from the options, the probe of an object store, INIT recorded
//! in the shared state, readiness. The FUSE-free suite wires its core
//! through `assemble::core`.
//!
//! It never looks at what is mounted where (`supervisor`'s), and mounts
//! nothing before `config::resolve` has found everything that can be wrong
//! with the user's input.

pub mod assemble;
pub mod config;
pub mod connection;
pub mod control;
pub mod dead_mount;
pub mod server;
pub mod supervisor;
pub mod tree;

pub use server::Server;

use std::io::Write;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use crate::meta::namespace::Namespace;
use crate::mount::config::MountConfig;
use crate::obs::logging::short_io;
use crate::obs::stats::Stats;
use crate::read::prefetch::ReadAhead;
use crate::source::object::ObjectSource;
use crate::source::{DirSource, Source};
use crate::sys::shm::SharedState;

/// Set in the environment of the background child of `--daemon`: it prints
/// READY on stdout once mounted.
pub(crate) const READY_ENV: &str = "LOCAFS_DAEMON_CHILD";

/// A datagram socket (path, or `@name`) that is sent `READY=1` once the
/// mount is live: how a supervisor of its own (`locafs.mount()` in
/// Python) waits for it, where `NOTIFY_SOCKET` would make locafs act as a
/// systemd unit (keep its descriptors in a store, leave the mount on
/// SIGTERM).
pub const READY_SOCKET_ENV: &str = "LOCAFS_READY_SOCKET";

/// A mount that failed leaves nothing behind: the data set's cache
/// directory, if this attempt made it, goes (with its booking in the
/// budget), unless a mount holds it now.
pub fn forget_new_dataset_dir(cfg: &MountConfig) {
    if cfg.dataset_dir_created {
        let _ = crate::cache::budget::remove_dataset(&cfg.cache, &cfg.dataset_name);
    }
}

/// The source a mount reads: a directory, or an object store (built
/// without a request: the holder asked the store once before mounting).
pub fn open_source(cfg: &MountConfig) -> Result<Arc<dyn Source>, (u8, String)> {
    Ok(match &cfg.object {
        None => Arc::new(DirSource::new(cfg.source.clone())),
        Some(spec) => {
            Arc::new(ObjectSource::unprobed(spec, cfg.source_timeout).map_err(|e| (2, e))?)
        }
    })
}

/// Asks an object store once, before anything is mounted: a missing
/// bucket, refused credentials or a dead endpoint end here, with exit 2;
/// except a store that does not answer when an earlier mount left its tree
/// and cache: those are served, as while a store stalls. Nothing to ask of
/// a directory (`config::resolve` looked at it).
pub fn probe_source(cfg: &MountConfig) -> Result<(), (u8, String)> {
    if let Some(spec) = &cfg.object {
        match ObjectSource::open(spec, cfg.source_timeout, cfg.metadata_timeout) {
            Ok(_) => {}
            Err(crate::source::object::ProbeError::Unreachable(why))
                if cfg.dataset_dir.join(tree::MANIFEST).is_file() =>
            {
                warn!(
                    "{why}: mounting the tree and cache the last mount left; what is not \
                     cached fails until the store answers"
                );
            }
            Err(e) => return Err((2, e.to_string())),
        }
    }
    Ok(())
}

/// A live mount and everything behind it, in one process: the FUSE
/// connection and the data set's lock (what the holder process keeps,
/// `supervisor`) and one server over them. For tests and benchmarks,
/// which put their own source behind a real mount; `locafs mount` runs
/// the server in a process of its own. Dropping it unmounts.
pub struct Mount {
    /// One line on what was mounted and the cache it uses.
    pub summary: String,
    server: Server,
    conn: Option<crate::mount::connection::Connection>,
    _lock: crate::cache::lock::DatasetLock,
}

impl Mount {
    /// Assembles a server over `source` as every mount is
    /// (`Server::build`), then mounts `cfg.mountpoint` and serves it. The source is a parameter so that tests and benchmarks
    /// can put a slow or failing source behind a real mount.
    pub fn start(cfg: &MountConfig, source: Arc<dyn Source>) -> Result<Mount, (u8, String)> {
        let lock = crate::cache::lock::DatasetLock::acquire(&cfg.dataset)
            .map_err(|e| (2, e.to_string()))?;
        let state =
            SharedState::create().map_err(|e| (1, format!("shared state: {}", short_io(&e))))?;
        let mut server = Server::build(cfg, source, &state)?;
        let mut conn = crate::mount::connection::Connection::mount(cfg)
            .map_err(|e| mount_failed(&cfg.mountpoint, &e))?;
        let fds = dup_fds(&conn.server_fds(cfg.fuse_threads).map_err(io_err)?).map_err(io_err)?;
        record_init(&state, conn.settled);
        let h = state.header();
        h.supervisor_pid
            .store(std::process::id(), Ordering::Relaxed);
        h.server_pid.store(std::process::id(), Ordering::Relaxed);
        server.serve(fds, conn.settled)?;
        Ok(Mount {
            summary: server.summary.clone(),
            server,
            conn: Some(conn),
            _lock: lock,
        })
    }

    pub fn mountpoint(&self) -> &Path {
        self.server.mountpoint()
    }

    pub fn stats(&self) -> &Arc<Stats> {
        self.server.stats()
    }

    /// The mount's namespace (what the kernel holds of it: lookup counts).
    pub fn namespace(&self) -> &Arc<Namespace> {
        self.server.namespace()
    }

    pub fn readahead(&self) -> &Arc<ReadAhead> {
        self.server.readahead()
    }

    /// Serves until SIGINT/SIGTERM (then unmounts) or until someone
    /// unmounts the file system.
    pub fn serve_until_stopped(mut self) {
        let server = &self.server;
        let signalled = server.block_on(async {
            use tokio::signal::unix::{signal, SignalKind};
            let (Ok(mut term), Ok(mut int)) = (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) else {
                return false;
            };
            loop {
                tokio::select! {
                    _ = term.recv() => return true,
                    _ = int.recv() => return true,
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {
                        if server.finished() {
                            return false;
                        }
                    }
                }
            }
        });
        let Some(signalled) = signalled else {
            return;
        };
        if signalled {
            info!(
                "signal received: unmounting {}",
                self.mountpoint().display()
            );
            crate::sys::sd_notify("STOPPING=1");
        }
        self.unmount();
    }

    /// Unmounts (detaching lazily if files are still open) and stops.
    pub fn unmount(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        if !self.server.finished() {
            if let Err(e) = conn.unmount() {
                warn!("unmount of {} failed: {e}", conn.mountpoint.display());
            }
        }
        self.server.stop();
        // (the connection's descriptors close with it: a lazily detached
        // mount's open files get errors from now on)
        drop(conn);
        info!("unmounted {}", self.server.mountpoint().display());
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.unmount();
    }
}

fn io_err(e: std::io::Error) -> (u8, String) {
    (1, short_io(&e))
}

/// Owned copies of `fds` (the same open files: a copy handed to a server
/// keeps nothing alive that the holder does not).
pub fn dup_fds(fds: &[std::os::fd::BorrowedFd<'_>]) -> std::io::Result<Vec<std::os::fd::OwnedFd>> {
    fds.iter()
        .map(|f| rustix::io::fcntl_dupfd_cloexec(f, 0).map_err(Into::into))
        .collect()
}

/// Keeps what INIT settled in the shared state, for every server.
pub fn record_init(state: &SharedState, settled: crate::mount::connection::Settled) {
    let h = state.header();
    h.init_flags.store(settled.granted, Ordering::Release);
    h.proto_minor.store(settled.minor, Ordering::Release);
    h.init_done.store(1, Ordering::Release);
}

/// What INIT settled, as [`record_init`] kept it.
pub fn recorded_init(state: &SharedState) -> crate::mount::connection::Settled {
    let h = state.header();
    crate::mount::connection::Settled {
        granted: h.init_flags.load(Ordering::Acquire),
        minor: h.proto_minor.load(Ordering::Acquire),
    }
}

/// The exit status and message of a failed mount(2): a refusal for lack of
/// privilege is the setup's problem (exit 2: a restart will not help), with
/// what it takes; anything else exit 1. A user's mount goes through
/// fusermount3, whose refusal (several lines on its stderr) is said on one
/// line.
pub(crate) fn mount_failed(mountpoint: &Path, e: &std::io::Error) -> (u8, String) {
    if e.raw_os_error().is_none() {
        let why = e.to_string();
        let why: Vec<&str> = why
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        return (
            1,
            format!(
                "mount on {} failed: {}",
                mountpoint.display(),
                why.join("; ")
            ),
        );
    }
    match e.raw_os_error() {
        Some(libc::EPERM | libc::EACCES) => (
            2,
            format!(
                "mount on {} failed: {}: mounting needs root or CAP_SYS_ADMIN (or, for a \
                 user, fusermount3 and a /dev/fuse the user may open)",
                mountpoint.display(),
                short_io(e)
            ),
        ),
        _ => (
            1,
            format!("mount on {} failed: {}", mountpoint.display(), short_io(e)),
        ),
    }
}

/// Tells whoever waits (the --daemon parent, systemd, a
/// [`READY_SOCKET_ENV`] socket) that the mount is
/// live, then detaches a daemon child's output from the parent's pipes.
pub fn announce_ready(summary: &str) {
    crate::sys::sd_notify("READY=1");
    if let Some(path) = std::env::var_os(READY_SOCKET_ENV).filter(|p| !p.is_empty()) {
        if let Err(e) = crate::sys::send_notify(&path, "READY=1", &[]) {
            warn!("{READY_SOCKET_ENV}: {}", short_io(&e));
        }
    }
    if std::env::var_os(READY_ENV).is_none() {
        return;
    }
    let mut out = std::io::stdout();
    let _ = writeln!(out, "READY {summary}");
    let _ = out.flush();
    detach_output();
}

/// In a `--daemon` child (or a server it started), points stdout and
/// stderr (unless logs go to a file) at /dev/null: the parent that read
/// them has gone once the mount is live.
pub fn detach_output() {
    if std::env::var_os(READY_ENV).is_none() {
        return;
    }
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        use std::os::fd::AsRawFd;
        // SAFETY: dup2 onto our own stdout/stderr descriptors.
        unsafe {
            libc::dup2(null.as_raw_fd(), 1);
            if !crate::obs::logging::logs_to_file() {
                libc::dup2(null.as_raw_fd(), 2);
            }
        }
    }
}
