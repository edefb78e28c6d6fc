//! The mount outlives the process that serves it. `locafs mount` (in the
//! foreground, as the `--daemon` child, as systemd's main process or a
//! container's entrypoint) becomes the **holder**: it resolves the
//! options, takes the data set's lock, makes the shared state
//! (`shm::SharedState`), mounts and answers INIT (`connection`), and
//! then only watches: it runs the **server** (this same binary, the
//! hidden `__serve` subcommand, [`serve::serve_main`]) as a child that inherits
//! the connection's descriptors and the state, and starts another when it
//! dies for any reason (signal, panic, OOM kill, exit), at once the first
//! time and with a growing wait after quick failures ([`policy`]); after
//! too many in a row it unmounts, says why and exits non-zero. Its
//! watchdog ([`watchdog`]) replaces a server that stops answering. A newer
//! `locafs mount` over the live mount takes it over ([`takeover`]), and
//! under systemd the mount outlives the holder too ([`systemd`]). A
//! second `locafs mount` of the data set on another mountpoint attaches
//! to the live mount ([`attach`]); the holder then exits when the last of
//! its connection's mountpoints goes. The server's side is [`serve`].
//!
//! The holder does no I/O on the data path: it never reads a request, a
//! cached block or the source (an object store is asked once, before the
//! mount). Everything a server must find again (the namespace's inodes,
//! the open handles, the backing ids, what INIT settled) is in the shared
//! state, which the holder keeps; the rest a server rebuilds.

pub mod attach;
pub mod entry;
pub mod policy;
pub mod serve;
pub mod signals;
pub mod systemd;
pub mod takeover;
pub mod watchdog;

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{debug, error, info, warn};

use crate::mount::config::{MountConfig, MountRequest};
use crate::mount::connection::{self, Connection, Settled};
use crate::obs::logging::short_io;
use crate::sys::shm::{self, SharedState};
use policy::{Backoff, Next};

/// The environment variable that tells a server where its descriptors
/// are: `state=N;config=N;ready=N;fuse=N,N,...`.
pub(crate) const SERVE_FDS: &str = "LOCAFS_SERVE_FDS";

pub use serve::{serve_main, serve_with};

/// How the holder starts a server process: [`ThisBinary`] runs this
/// binary's hidden `__serve`; tests start their own (a server over a
/// source that stops at a gate, or one that exits at once) through it.
/// The holder adds the descriptors and the environment.
pub trait Launcher {
    fn command(&self) -> Command;
}

/// Servers are this very binary (`/proc/self/exe`: the one the holder
/// runs, even if a newer one was installed since; an upgrade is a
/// takeover), with `__serve`.
pub struct ThisBinary;

impl Launcher for ThisBinary {
    fn command(&self) -> Command {
        let exe = std::env::current_exe().unwrap_or_else(|_| "locafs".into());
        let mut cmd = Command::new("/proc/self/exe");
        cmd.arg0(exe).arg("__serve");
        cmd
    }
}

/// Holds the mount `cfg` (resolved from `args`) until it is unmounted or
/// the holder is told to stop, serving it through server processes.
pub fn hold(args: &MountRequest, cfg: MountConfig) -> ExitCode {
    hold_with(args, cfg, Box::new(ThisBinary))
}

/// [`hold`] with servers started by `launcher`.
pub fn hold_with(args: &MountRequest, cfg: MountConfig, launcher: Box<dyn Launcher>) -> ExitCode {
    for n in &cfg.notes {
        info!("{n}");
    }
    match Holder::start(args, cfg.clone(), launcher) {
        Ok(h) => h.run(),
        Err((code, msg)) => {
            // One line: on stderr the log line would say it twice.
            if crate::obs::logging::logs_to_file() {
                error!("{msg}");
            }
            crate::obs::logging::say(&msg);
            // (a mount that failed leaves no data set directory it made)
            crate::mount::forget_new_dataset_dir(&cfg);
            ExitCode::from(code)
        }
    }
}

/// Takes over the live mount of `cfg`'s mountpoint from its holder (see
/// [`takeover`]) and holds it from now on, with `cfg`'s options: exit 2,
/// the mount untouched, if an option that cannot change on a live mount
/// differs or no holder answers.
pub fn take_over(args: &MountRequest, cfg: MountConfig) -> ExitCode {
    take_over_with(args, cfg, Box::new(ThisBinary))
}

/// [`take_over`] with servers started by `launcher`.
pub fn take_over_with(
    args: &MountRequest,
    cfg: MountConfig,
    launcher: Box<dyn Launcher>,
) -> ExitCode {
    let sock = takeover::socket_path(&cfg.dataset_dir);
    let fail = |code: u8, msg: String| {
        // (exit 2 is a usage error: one line on stderr, as before a mount)
        if code != 2 || crate::obs::logging::logs_to_file() {
            error!("{msg}");
        }
        eprintln!("locafs: {msg}");
        ExitCode::from(code)
    };
    let taken = match takeover::take(&sock, &cfg) {
        Ok(t) => t,
        Err(takeover::NotTaken::NoHolder(why)) => {
            return fail(
                2,
                format!(
                    "mountpoint {}: a locafs mount is live there, and no holder answers a takeover ({why}); unmount it first",
                    cfg.mountpoint.display()
                ),
            )
        }
        Err(takeover::NotTaken::Refused(why)) => {
            return fail(
                2,
                format!(
                    "mountpoint {}: cannot take over the live mount: {why}; nothing changed (unmount it to change these)",
                    cfg.mountpoint.display()
                ),
            )
        }
        Err(takeover::NotTaken::Failed(why)) => return fail(1, why),
    };
    info!(
        "taking over {} from holder {} (locafs {}): its server {} stopped",
        cfg.mountpoint.display(),
        taken.offer.pid,
        taken.offer.version,
        taken.handover.server_pid
    );
    match Holder::adopt(args, cfg, launcher, taken) {
        Ok(h) => h.run(),
        Err((code, msg)) => fail(code, msg),
    }
}

/// Holds the live mount of `cfg` whose descriptors systemd's store gave
/// back (`stored`: the holder before this one stored them; see
/// [`systemd`]).
pub fn hold_stored(args: &MountRequest, cfg: MountConfig, stored: systemd::Stored) -> ExitCode {
    let systemd::Stored { state, lock, fuse } = stored;
    let state = match SharedState::open(state) {
        Ok(s) => s,
        Err(e) => return remount(args, cfg, fuse, lock, &format!("its state: {e}")),
    };
    let fixed = state.header().fixed_options.load(Ordering::Acquire);
    if let Some(why) = takeover::stored_refusal(fixed, &cfg) {
        drop(state);
        return remount(args, cfg, fuse, lock, &why);
    }
    match Holder::from_store(args, cfg, Box::new(ThisBinary), state, lock, fuse) {
        Ok(h) => h.run(),
        Err((code, msg)) => {
            error!("{msg}");
            eprintln!("locafs: {msg}");
            ExitCode::from(code)
        }
    }
}

/// The mount systemd kept cannot be served with `cfg`: it is unmounted,
/// the stored lock let go (the new mount takes the data set's lock
/// afresh: a lock still held through the stored descriptor would refuse
/// it) and the data set mounted again.
fn remount(
    args: &MountRequest,
    cfg: MountConfig,
    fuse: Vec<OwnedFd>,
    lock: OwnedFd,
    why: &str,
) -> ExitCode {
    warn!(
        "{}: the mount systemd kept cannot be served ({why}): mounting it again",
        cfg.mountpoint.display()
    );
    let mut old = Connection::adopt(fuse, Settled::default(), cfg.mountpoint.clone());
    let _ = old.unmount();
    drop(old);
    systemd::forget_stored();
    drop(lock);
    hold(args, cfg)
}

/// A server process and what the holder knows of it.
struct Running {
    child: Child,
    started: Instant,
    /// The read end of the pipe it says READY on; None once the server
    /// has closed its end (it does, after READY): a pipe at its end is
    /// readable for ever, and polled it woke the holder at once, again and
    /// again (an idle holder took a fifth of a core).
    ready_rx: Option<OwnedFd>,
    /// CLOCK_MONOTONIC ns when it said READY (0: not yet).
    ready_ns: u64,
    /// The shared count of requests taken, when it said READY.
    requests_at_ready: u64,
    /// Why the holder killed it, if it did (`shm::REASON_*`).
    killed_for: Option<u32>,
}

/// The process that holds a mount.
struct Holder {
    cfg: MountConfig,
    launcher: Box<dyn Launcher>,
    conn: Connection,
    /// The connection's number under /sys/fs/fuse/connections.
    conn_no: Option<u32>,
    state: Arc<SharedState>,
    /// The options every server runs with (a TOML file in a memfd).
    config_fd: OwnedFd,
    lock: crate::cache::lock::DatasetLock,
    signals: signals::Signals,
    /// Where a new `locafs mount` asks to take the mount over.
    listener: Option<takeover::Listener>,
    /// The holder this one took the mount from, waiting for READY (it
    /// serves again if this one goes away before).
    handover: Option<std::os::unix::net::UnixStream>,
    /// Whether the descriptors are in systemd's store.
    in_fd_store: bool,
    backoff: Backoff,
    probe: Option<watchdog::Probe>,
    running: Option<Running>,
    /// When to start the next server (after a death's wait).
    restart_at: Option<Instant>,
    /// Why the next server is started (`shm::REASON_*`, detail).
    restart_reason: Option<(u32, i32)>,
    /// Whether a server ever said READY (and the mount was announced).
    announced: bool,
    stopping: bool,
    /// Its own mountpoint unmounted on a signal while others of the
    /// connection remain: it serves on until they go.
    detached: bool,
}

/// What every holder makes for itself, however it got the mount: the
/// options its servers run with (a TOML file in a memfd) and the signals
/// it waits on.
struct Parts {
    config_fd: OwnedFd,
    signals: signals::Signals,
}

impl Parts {
    fn new(args: &MountRequest, cfg: &MountConfig) -> Result<Parts, (u8, String)> {
        let toml = crate::mount::config::serving_toml(args, cfg).map_err(|e| (2, e.to_string()))?;
        let config_fd = memfd_with("locafs-options", toml.as_bytes())
            .map_err(|e| (1, format!("options for the server: {}", short_io(&e))))?;
        let signals =
            signals::Signals::catch(&[libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGCHLD])
                .map_err(|e| (1, format!("signals: {e}")))?;
        Ok(Parts { config_fd, signals })
    }
}

/// The takeover socket of `cfg`'s data set, listening (None, said once,
/// if it cannot: the mount is served, not taken over).
fn bind_listener(cfg: &MountConfig) -> Option<takeover::Listener> {
    takeover::Listener::bind(&takeover::socket_path(&cfg.dataset_dir))
        .map_err(|e| warn!("takeover socket: {e} (this mount cannot be taken over)"))
        .ok()
}

/// The data set's lock, taken on the directory that is still at its path.
/// Until the lock is held, the data set directory looks unmounted, and a
/// neighbour's budget keeper may take it away (rename it to the trash and
/// delete it) between `config::resolve` and this
/// ([`crate::cache::lock::LockError::Moved`]); then the directory is resolved
/// (made) again and the lock taken on the new one.
fn lock_in_place(
    args: &MountRequest,
    mut cfg: MountConfig,
) -> Result<(MountConfig, crate::cache::lock::DatasetLock), (u8, String)> {
    let mut tries = 0;
    loop {
        match crate::cache::lock::DatasetLock::acquire(&cfg.dataset) {
            Ok(lock) => return Ok((cfg, lock)),
            Err(crate::cache::lock::LockError::Moved { .. }) if tries < 3 => {}
            Err(crate::cache::lock::LockError::Moved { .. }) => {
                return Err((
                    1,
                    format!(
                        "cache dir {}: removed again and again while mounting",
                        cfg.dataset.path().display()
                    ),
                ))
            }
            Err(e) => return Err((2, e.to_string())),
        }
        tries += 1;
        cfg = crate::mount::config::resolve(args).map_err(|e| (2, e.to_string()))?;
    }
}

impl Holder {
    fn start(
        args: &MountRequest,
        cfg: MountConfig,
        launcher: Box<dyn Launcher>,
    ) -> Result<Holder, (u8, String)> {
        crate::mount::probe_source(&cfg)?;
        let (cfg, lock) = lock_in_place(args, cfg)?;
        // (signals caught before the mount: a SIGTERM while mounting
        // unmounts rather than leave a mount nobody holds)
        let parts = Parts::new(args, &cfg)?;
        let state =
            SharedState::create().map_err(|e| (1, format!("shared state: {}", short_io(&e))))?;
        // Listening before the mount shows: a second `locafs mount` of the
        // data set that sees it ([`attach`]) finds the socket (its offer
        // waits in the backlog until the holder's loop runs).
        let listener = bind_listener(&cfg);
        let conn =
            Connection::mount(&cfg).map_err(|e| crate::mount::mount_failed(&cfg.mountpoint, &e))?;
        crate::mount::record_init(&state, conn.settled);
        let mut h = Holder::with(cfg, launcher, conn, state, lock, parts)?;
        h.listener = listener;
        Ok(h)
    }

    /// The holder of a mount taken over from another (`taken`).
    fn adopt(
        args: &MountRequest,
        cfg: MountConfig,
        launcher: Box<dyn Launcher>,
        taken: takeover::Taken,
    ) -> Result<Holder, (u8, String)> {
        let parts = Parts::new(args, &cfg)?;
        let state = SharedState::open(taken.state)
            .map_err(|e| (2, format!("the mount's shared state: {e}")))?;
        let lock = crate::cache::lock::DatasetLock::from_file(std::fs::File::from(taken.lock));
        let settled = Settled {
            granted: taken.offer.granted,
            minor: taken.offer.minor,
        };
        let conn = Connection::adopt(taken.fuse, settled, cfg.mountpoint.clone());
        let mut h = Holder::with(cfg, launcher, conn, state, lock, parts)?;
        h.restart_reason = Some((shm::REASON_TAKEOVER, taken.offer.pid as i32));
        h.handover = Some(taken.stream);
        Ok(h)
    }

    /// The holder of a mount whose descriptors systemd's store gave back.
    fn from_store(
        args: &MountRequest,
        cfg: MountConfig,
        launcher: Box<dyn Launcher>,
        state: Arc<SharedState>,
        lock: OwnedFd,
        fuse: Vec<OwnedFd>,
    ) -> Result<Holder, (u8, String)> {
        let parts = Parts::new(args, &cfg)?;
        let lock = crate::cache::lock::DatasetLock::from_file(std::fs::File::from(lock));
        let settled = crate::mount::recorded_init(&state);
        let h = state.header();
        // The server of the holder before, if it has not died yet (it dies
        // with its holder): two servers never share the state.
        let old = h.server_pid.load(Ordering::Relaxed);
        let previous = h.supervisor_pid.load(Ordering::Relaxed);
        if old != 0 {
            end_process(old, &state);
        }
        let conn = Connection::adopt(fuse, settled, cfg.mountpoint.clone());
        info!(
            "{}: serving on the mount that systemd kept (holder {previous} before)",
            cfg.mountpoint.display()
        );
        let mut h = Holder::with(cfg, launcher, conn, state, lock, parts)?;
        // (they came from the store, where they stay: not stored again)
        h.in_fd_store = true;
        h.restart_reason = Some((shm::REASON_TAKEOVER, previous as i32));
        h.listener = bind_listener(&h.cfg);
        Ok(h)
    }

    /// The holder of `conn`, before its first server.
    fn with(
        cfg: MountConfig,
        launcher: Box<dyn Launcher>,
        conn: Connection,
        state: Arc<SharedState>,
        lock: crate::cache::lock::DatasetLock,
        parts: Parts,
    ) -> Result<Holder, (u8, String)> {
        let Parts { config_fd, signals } = parts;
        let h = state.header();
        h.supervisor_pid
            .store(std::process::id(), Ordering::Relaxed);
        h.fixed_options
            .store(takeover::fixed_options(&cfg), Ordering::Release);
        let conn_no = conn.number();
        if conn.can_resend() {
            debug!(
                "mounted {}: the FUSE connection outlives its server (FUSE 7.{}: a request in flight when a server dies is answered by the next)",
                cfg.mountpoint.display(),
                conn.settled.minor
            );
        } else {
            warn!(
                "this kernel (FUSE 7.{}) cannot resend requests (FUSE_NOTIFY_RESEND, Linux 6.9): a request in flight when a server dies fails with ECONNABORTED",
                conn.settled.minor
            );
        }
        let probe = match cfg.watchdog {
            Some(_) => {
                // (the kernel's count of waiting requests, to tell a hang
                // from an idle mount; the probe alone decides without it)
                if !connection::ensure_fusectl() {
                    info!(
                        "watchdog: {} not available, the probe alone decides",
                        connection::FUSECTL
                    );
                }
                Some(
                    watchdog::Probe::start(cfg.mountpoint.clone(), conn_no)
                        .map_err(|e| (1, format!("watchdog: {e}")))?,
                )
            }
            None => None,
        };
        Ok(Holder {
            cfg,
            launcher,
            conn,
            conn_no,
            state,
            config_fd,
            lock,
            signals,
            listener: None,
            handover: None,
            in_fd_store: false,
            backoff: Backoff::default(),
            probe,
            running: None,
            restart_at: Some(Instant::now()),
            restart_reason: None,
            announced: false,
            stopping: false,
            detached: false,
        })
    }

    /// Supervises until unmounted, stopped or given up; the exit status.
    fn run(mut self) -> ExitCode {
        loop {
            if let Some(code) = self.step() {
                return code;
            }
        }
    }

    /// One turn of the loop: starts a server when due, waits for a signal,
    /// a READY or 100 ms, then looks at the server. Some(exit status) when
    /// the holder is done.
    fn step(&mut self) -> Option<ExitCode> {
        if self.running.is_none() && !self.stopping {
            if let Some(at) = self.restart_at {
                if Instant::now() >= at {
                    self.restart_at = None;
                    if let Err(e) = self.spawn() {
                        return Some(self.give_up(&format!("cannot start a server: {e}")));
                    }
                }
            }
        }
        let mut fds: Vec<BorrowedFd<'_>> = vec![self.signals.fd()];
        let at_listener = self.listener.as_ref().map(|l| {
            fds.push(l.fd());
            fds.len() - 1
        });
        let at_ready = self
            .running
            .as_ref()
            .and_then(|r| r.ready_rx.as_ref())
            .map(|rx| {
                fds.push(rx.as_fd());
                fds.len() - 1
            });
        let woke = signals::wait_readable(&fds, Duration::from_millis(100));
        let woke_at = |i: Option<usize>| i.and_then(|i| woke.get(i).copied()).unwrap_or(false);
        let (take, ready) = (woke_at(at_listener), woke_at(at_ready));
        if ready {
            self.read_ready();
        }
        if take {
            let stream = self.listener.as_ref().and_then(|l| l.accept());
            if let Some(s) = stream {
                if let Some(code) = self.offer_takeover(s) {
                    return Some(code);
                }
            }
        }
        for sig in self.signals.drain() {
            if matches!(sig, libc::SIGTERM | libc::SIGINT | libc::SIGHUP) && !self.stopping {
                if self.detached {
                    info!(
                        "signal {sig} received: {} is unmounted already; serving on until the other mountpoints of this data set are",
                        self.cfg.mountpoint.display()
                    );
                    continue;
                }
                info!(
                    "signal {sig} received: unmounting {}",
                    self.cfg.mountpoint.display()
                );
                if let Some(code) = self.stop() {
                    return Some(code);
                }
            }
        }
        if let Some(code) = self.reap() {
            return Some(code);
        }
        self.watch();
        None
    }

    /// Starts a server over the connection and the shared state.
    fn spawn(&mut self) -> std::io::Result<()> {
        let (ready_rx, ready_tx) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        // A kernel that can resend: the server reads from descriptors the
        // holder keeps (its death aborts nothing). One that cannot: from
        // clones of its own, so that what it held when it died ends with
        // ECONNABORTED as its descriptors close, rather than wait forever.
        let own: Vec<OwnedFd> = if self.conn.can_resend() {
            Vec::new()
        } else {
            (0..self.cfg.fuse_threads.max(1))
                .map(|_| connection::clone_fd(self.conn.fds()[0].as_fd()))
                .collect::<std::io::Result<_>>()?
        };
        let fuse: Vec<RawFd> = if own.is_empty() {
            self.conn
                .server_fds(self.cfg.fuse_threads)?
                .iter()
                .map(|f| f.as_raw_fd())
                .collect()
        } else {
            own.iter().map(|f| f.as_raw_fd()).collect()
        };
        let pass: Vec<RawFd> = [
            self.state.fd().as_raw_fd(),
            self.config_fd.as_raw_fd(),
            ready_tx.as_raw_fd(),
        ]
        .into_iter()
        .chain(fuse.iter().copied())
        .collect();
        let env = format!(
            "state={};config={};ready={};fuse={}",
            pass[0],
            pass[1],
            pass[2],
            fuse.iter()
                .map(|f| f.to_string())
                .collect::<Vec<_>>()
                .join(",")
        );
        let mut cmd = self.launcher.command();
        cmd.env(SERVE_FDS, env)
            // Only the holder speaks to systemd (and says when it is ready).
            .env_remove("NOTIFY_SOCKET")
            .env_remove(crate::mount::READY_SOCKET_ENV)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let holder = std::process::id() as libc::pid_t;
        // SAFETY: between fork and exec, only async-signal-safe calls: the
        // descriptors to pass lose FD_CLOEXEC; the server gets a process
        // group of its own (a Ctrl-C in the holder's terminal is the
        // holder's to handle: it unmounts, and the server then saves and
        // exits); and it dies with the holder (the lock and the mount are
        // the holder's: a server must not go on without them).
        unsafe {
            cmd.pre_exec(move || {
                for fd in &pass {
                    if libc::fcntl(*fd, libc::F_SETFD, 0) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                libc::setpgid(0, 0);
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if libc::getppid() != holder {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        let child = cmd.spawn()?;
        drop(ready_tx);
        drop(own);
        let h = self.state.header();
        h.server_pid.store(child.id(), Ordering::Relaxed);
        h.server_started_mono_ns
            .store(shm::monotonic_ns(), Ordering::Relaxed);
        if let Some((reason, detail)) = self.restart_reason.take() {
            h.restarts.fetch_add(1, Ordering::Relaxed);
            h.last_restart_ms.store(unix_ms(), Ordering::Relaxed);
            h.last_reason.store(reason, Ordering::Relaxed);
            h.last_detail.store(detail, Ordering::Relaxed);
        }
        self.running = Some(Running {
            child,
            started: Instant::now(),
            ready_rx: Some(ready_rx),
            ready_ns: 0,
            requests_at_ready: 0,
            killed_for: None,
        });
        if systemd::under_systemd() && !self.in_fd_store {
            self.store_in_systemd();
        }
        Ok(())
    }

    /// Keeps the state, the lock and every descriptor of the connection in
    /// systemd's store (the unit's FileDescriptorStoreMax=), so that the
    /// holder systemd starts next (a restart, a crash of this one) serves
    /// the mount on.
    fn store_in_systemd(&mut self) {
        let fuse: Vec<BorrowedFd<'_>> = self.conn.fds().iter().map(|f| f.as_fd()).collect();
        let r = systemd::store(systemd::STATE, &[self.state.fd()])
            .and_then(|()| systemd::store(systemd::LOCK, &[self.lock.fd()]))
            .and_then(|()| systemd::store(systemd::FUSE, &fuse));
        match r {
            Ok(()) => self.in_fd_store = true,
            Err(e) => {
                warn!("systemd's file descriptor store: {e} (a restart of the unit will remount)")
            }
        }
    }

    /// Reads the server's READY line: the first one announces the mount.
    fn read_ready(&mut self) {
        let Some(r) = self.running.as_mut() else {
            return;
        };
        let Some(rx) = r.ready_rx.as_ref() else {
            return;
        };
        let mut buf = [0u8; 4096];
        let n = match rustix::io::read(rx, &mut buf) {
            Ok(n) => n,
            Err(rustix::io::Errno::INTR) => return,
            Err(_) => 0,
        };
        if n == 0 {
            // Its end is closed: nothing more will come.
            r.ready_rx = None;
            return;
        }
        let line = String::from_utf8_lossy(&buf[..n]);
        let Some(summary) = line.lines().find_map(|l| l.strip_prefix("READY ")) else {
            return;
        };
        if r.ready_ns != 0 {
            return;
        }
        r.ready_ns = shm::monotonic_ns();
        r.requests_at_ready = self.state.header().answered.load(Ordering::Relaxed);
        let pid = r.child.id();
        let took = r.started.elapsed();
        if let Some(mut old) = self.handover.take() {
            // The holder this one took over from may go now.
            let _ = old.write_all(b"READY\n");
            info!(
                "server {pid} serves {} (taken over; it started in {} ms)",
                self.cfg.mountpoint.display(),
                took.as_millis()
            );
            self.announced = true;
            crate::mount::announce_ready(summary);
            self.listener = bind_listener(&self.cfg);
        } else if self.announced {
            let restarts = self.state.header().restarts.load(Ordering::Relaxed);
            info!(
                "server {pid} serves {} ({restarts} restarts; it started in {} ms)",
                self.cfg.mountpoint.display(),
                took.as_millis()
            );
        } else {
            self.announced = true;
            // (the server logged its summary itself)
            debug!("server {pid}: {summary}");
            crate::mount::announce_ready(summary);
        }
        if let Some(p) = &self.probe {
            p.set_on(true);
        }
    }

    /// Looks at the server: if it died, decides what comes next.
    fn reap(&mut self) -> Option<ExitCode> {
        let r = self.running.as_mut()?;
        let status = match r.child.try_wait() {
            Ok(Some(s)) => s,
            Ok(None) => return None,
            Err(e) => return Some(self.give_up(&format!("cannot wait for the server: {e}"))),
        };
        let r = self.running.take()?;
        if let Some(p) = &self.probe {
            p.set_on(false);
        }
        let pid = r.child.id();
        self.state.header().server_pid.store(0, Ordering::Relaxed);
        if self.stopping {
            return None;
        }
        if !self.still_mounted() {
            info!(
                "unmounted {} (by umount; server {pid} exited: {status})",
                self.cfg.mountpoint.display()
            );
            return Some(ExitCode::SUCCESS);
        }
        let (reason, detail, what) = match (r.killed_for, status.signal(), status.code()) {
            (Some(why), _, _) => (
                why,
                libc::SIGKILL,
                format!("killed by the {}", shm::reason_name(why)),
            ),
            (None, Some(sig), _) => (
                shm::REASON_SIGNAL,
                sig,
                format!("killed by signal {sig}{}", core_note(&status)),
            ),
            (None, None, Some(code)) => {
                (shm::REASON_EXIT, code, format!("exited with status {code}"))
            }
            (None, None, None) => (shm::REASON_EXIT, -1, "ended".to_string()),
        };
        if !self.announced && status.code() == Some(2) {
            // A configuration error the server found (its message is on
            // stderr): starting it again will not help.
            return Some(self.finish(2, "the server could not start (see above)"));
        }
        let lived = r.started.elapsed();
        let served = (r.ready_ns != 0)
            .then(|| Duration::from_nanos(shm::monotonic_ns().saturating_sub(r.ready_ns)));
        let requests = self
            .state
            .header()
            .answered
            .load(Ordering::Relaxed)
            .saturating_sub(r.requests_at_ready);
        match self.backoff.after_exit(served, requests) {
            Next::Restart(wait) => {
                warn!(
                    "server {pid} {what} after {:.1} s; starting another{}",
                    lived.as_secs_f64(),
                    if wait.is_zero() {
                        String::new()
                    } else {
                        format!(" in {} ms", wait.as_millis())
                    }
                );
                self.restart_at = Some(Instant::now() + wait);
                self.restart_reason = Some((reason, detail));
                None
            }
            Next::GiveUp => Some(self.give_up(&format!(
                "server {pid} {what}: {} servers in a row died before they served (each before it was ready, or within {} s of it with fewer than {} requests taken)",
                self.backoff.quick_failures(),
                policy::STABLE.as_secs(),
                policy::PROGRESS
            ))),
        }
    }

    /// Whether the mount this holder made is still there: at its own
    /// mountpoint or at another of the connection's (one a second `locafs
    /// mount` attached, [`attach`]).
    fn still_mounted(&self) -> bool {
        match self.conn_no {
            Some(n) if !self.conn.alive() => {
                // (aborted, or ended: what the mountpoint shows, as before
                // mountpoints could be attached)
                connection::connection_number(&self.cfg.mountpoint) == Some(n)
            }
            Some(_) => !self.mountpoints().is_empty(),
            None => crate::sys::is_mountpoint(&self.cfg.mountpoint),
        }
    }

    /// Every mountpoint of the connection, while it is alive (once it
    /// ended, its device number may be another mount's: none).
    fn mountpoints(&self) -> Vec<std::path::PathBuf> {
        match self.conn_no {
            Some(n) if self.conn.alive() => connection::mountpoints_of(n),
            _ => Vec::new(),
        }
    }

    /// The connection's mountpoints other than this holder's own.
    fn other_mountpoints(&self) -> Vec<std::path::PathBuf> {
        if self.conn_no.is_none() {
            return Vec::new();
        }
        self.mountpoints()
            .into_iter()
            .filter(|p| *p != self.cfg.mountpoint)
            .collect()
    }

    /// The watchdog: a server that leaves the probe (and other requests)
    /// waiting longer than `--watchdog` is killed; its death is reaped as
    /// any other.
    fn watch(&mut self) {
        let (Some(deadline), Some(probe)) = (self.cfg.watchdog, self.probe.as_ref()) else {
            return;
        };
        let Some(r) = self.running.as_mut() else {
            return;
        };
        if r.ready_ns == 0 || r.killed_for.is_some() {
            return;
        }
        let waited = probe.waited(r.ready_ns);
        let waiting = self.conn_no.and_then(connection::waiting);
        if policy::hung(waited, deadline, waiting) {
            warn!(
                "watchdog: server {} left requests unanswered for {:.1} s ({} waiting): killing it",
                r.child.id(),
                waited.unwrap_or_default().as_secs_f64(),
                waiting.map_or("?".to_string(), |w| w.to_string())
            );
            let _ = r.child.kill();
            r.killed_for = Some(shm::REASON_WATCHDOG);
        }
    }

    /// SIGTERM/SIGINT: unmounts; the server sees the session end, saves
    /// and exits (it is told to, then killed, if it does not). While other
    /// mountpoints of the connection remain (attached by a second `locafs
    /// mount`), only this holder's own is unmounted and it serves on
    /// (None): it exits when the connection ends, as after a `umount`.
    /// Under a systemd unit (no restart queued) the others are detached
    /// too: the unit's stop ends its process either way.
    fn stop(&mut self) -> Option<ExitCode> {
        let others = self.other_mountpoints();
        // (a queued systemd restart keeps every mountpoint: `stop_all`)
        let restarting = self.in_fd_store && systemd::restart_queued();
        if !others.is_empty() && !restarting && systemd::under_systemd() {
            // A unit's stop ends its process (systemd kills what is left
            // after TimeoutStopSec): serving on would end the others as a
            // dead mount a minute later. They are detached now, said.
            for p in &others {
                if let Err(e) = crate::sys::lazy_unmount(p) {
                    warn!("unmount of {} failed: {e}", p.display());
                }
            }
            warn!(
                "this unit is stopping: the mountpoints attached to it are detached too: {}",
                others
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        } else if !others.is_empty() && !restarting {
            if let Err(e) = self.conn.unmount() {
                warn!("unmount of {} failed: {e}", self.cfg.mountpoint.display());
            }
            self.detached = true;
            info!(
                "unmounted {}; serving on for {} (this process exits when the last is unmounted)",
                self.cfg.mountpoint.display(),
                others
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            return None;
        }
        Some(self.stop_all())
    }

    /// [`Holder::stop`] when this holder's mountpoint is the last.
    fn stop_all(&mut self) -> ExitCode {
        self.stopping = true;
        crate::sys::sd_notify("STOPPING=1");
        if self.in_fd_store && systemd::restart_queued() {
            // `systemctl restart`: the next holder gets the mount from
            // systemd's store; this one only stops its server (what it held
            // the kernel sends again to the next).
            if let Some(mut r) = self.running.take() {
                let _ = r.child.kill();
                let _ = r.child.wait();
            }
            // (no server of this holder's left for the next one to end)
            self.state.header().server_pid.store(0, Ordering::Relaxed);
            info!(
                "a restart of this unit is queued: {} stays mounted for the next holder (systemd keeps its descriptors)",
                self.cfg.mountpoint.display()
            );
            return ExitCode::SUCCESS;
        }
        if self.in_fd_store {
            systemd::forget_stored();
        }
        if let Err(e) = self.conn.unmount() {
            warn!("unmount of {} failed: {e}", self.cfg.mountpoint.display());
        }
        self.end_server(Duration::from_secs(10));
        info!("unmounted {}", self.cfg.mountpoint.display());
        ExitCode::SUCCESS
    }

    /// Waits for the server to exit (at most `grace`), then tells it to
    /// (SIGTERM), then kills it.
    fn end_server(&mut self, grace: Duration) {
        let Some(mut r) = self.running.take() else {
            return;
        };
        let t0 = Instant::now();
        let mut termed = false;
        loop {
            if let Ok(Some(_)) = r.child.try_wait() {
                return;
            }
            if !termed && t0.elapsed() > grace {
                termed = true;
                // SAFETY: a signal to our own child.
                unsafe { libc::kill(r.child.id() as i32, libc::SIGTERM) };
            }
            if t0.elapsed() > grace * 3 {
                let _ = r.child.kill();
                let _ = r.child.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Crash loop or a holder fault: unmounts, ends the connection (no
    /// reader waits on a mount nobody serves), says why, exits 1.
    fn give_up(&mut self, why: &str) -> ExitCode {
        self.finish(
            1,
            &format!(
                "{why}; giving up: {} unmounted",
                self.cfg.mountpoint.display()
            ),
        )
    }

    fn finish(&mut self, code: u8, msg: &str) -> ExitCode {
        self.stopping = true;
        if self.handover.is_some() {
            // A takeover that did not get as far as a serving server: the
            // holder it came from serves again (it sees this one go).
            let msg = format!("{msg}; the takeover did not happen: the previous holder serves on");
            error!("{msg}");
            eprintln!("locafs: {msg}");
            self.end_server(Duration::from_secs(2));
            return ExitCode::from(code);
        }
        error!("{msg}");
        eprintln!("locafs: {msg}");
        if self.in_fd_store {
            systemd::forget_stored();
        }
        let _ = self.conn.unmount();
        // (the mountpoints attached to it go too: nobody serves them)
        for p in self.other_mountpoints() {
            let _ = crate::sys::lazy_unmount(&p);
        }
        if let Some(n) = self.conn_no {
            let _ = std::fs::write(
                Path::new(connection::FUSECTL)
                    .join(n.to_string())
                    .join("abort"),
                b"1",
            );
        }
        self.end_server(Duration::from_secs(2));
        ExitCode::from(code)
    }
}

impl Holder {
    /// A new `locafs mount` asks to take the mount over: offer it; if it
    /// takes it, stop the server, hand over the descriptors and wait for
    /// its READY, then exit without unmounting (Some(exit status)). If it
    /// refuses, or goes away before READY, serve on (None).
    fn offer_takeover(&mut self, stream: std::os::unix::net::UnixStream) -> Option<ExitCode> {
        let settled = self.conn.settled;
        let mut offer = takeover::Offer::of(&self.cfg, settled.granted, settled.minor);
        offer.connection = self.conn_no;
        let line = serde_json::to_string(&offer).ok()? + "\n";
        let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
        if (&stream).write_all(line.as_bytes()).is_err() {
            return None;
        }
        let reply = takeover::read_line(&mut &stream).unwrap_or_default();
        if let Some(why) = reply.strip_prefix("REFUSE ") {
            info!(
                "a takeover of {} was refused: {why}",
                self.cfg.mountpoint.display()
            );
            return None;
        }
        if let Some(path) = reply.strip_prefix("ATTACH ") {
            // A second mountpoint of this data set (a bind mount the other
            // command made): served by this connection from now on.
            info!(
                "{path} attached: a second mountpoint of this mount ({})",
                self.cfg.mountpoint.display()
            );
            return None;
        }
        if reply != "TAKE" {
            return None;
        }
        info!(
            "handing {} over to a new holder",
            self.cfg.mountpoint.display()
        );
        // The socket's name goes with it (the new holder listens under it
        // once it serves; a takeover that does not finish binds it again).
        self.listener = None;
        // Our server stops first: two servers never share the state. What
        // it held the kernel sends again to the next.
        if let Some(p) = &self.probe {
            p.set_on(false);
        }
        let mut server_pid = 0;
        if let Some(mut r) = self.running.take() {
            server_pid = r.child.id();
            let _ = r.child.kill();
            let _ = r.child.wait();
        }
        self.state.header().server_pid.store(0, Ordering::Relaxed);
        let handover = takeover::Handover {
            fuse: self.conn.fds().len(),
            server_pid,
        };
        let text = serde_json::to_vec(&handover).ok()?;
        let mut fds: Vec<BorrowedFd<'_>> = vec![self.state.fd(), self.lock.fd()];
        fds.extend(self.conn.fds().iter().map(|f| f.as_fd()));
        let sent = takeover::send_fds(&stream, &text, &fds);
        let _ = stream.set_read_timeout(Some(Duration::from_secs(600)));
        let ready = sent.and_then(|()| takeover::read_line(&mut &stream));
        match ready {
            Ok(l) if l == "READY" => {
                info!(
                    "{} handed over: the new holder serves it; this one exits without unmounting",
                    self.cfg.mountpoint.display()
                );
                // (systemd's store would keep the mount and the lock the new
                // holder now has: its own unit, if any, stores them anew)
                if self.in_fd_store {
                    systemd::forget_stored();
                    self.in_fd_store = false;
                }
                self.stopping = true;
                Some(ExitCode::SUCCESS)
            }
            other => {
                warn!(
                    "the takeover of {} did not finish ({}): serving it again",
                    self.cfg.mountpoint.display(),
                    other
                        .err()
                        .map_or("no READY".to_string(), |e| e.to_string())
                );
                self.restart_at = Some(Instant::now());
                self.restart_reason = Some((shm::REASON_TAKEOVER, 0));
                if self.listener.is_none() {
                    self.listener = bind_listener(&self.cfg);
                }
                None
            }
        }
    }
}

/// SIGKILLs the previous holder's server `pid` and waits (at most 5 s)
/// until it is gone, if it is still there and still that server: a
/// process that has `state` open (only this mount's holders and servers
/// have it). A pid recorded by a holder that has gone may since name
/// another process: that one is left alone.
fn end_process(pid: u32, state: &SharedState) {
    if pid <= 1 || pid == std::process::id() {
        return;
    }
    let Some(p) = rustix::process::Pid::from_raw(pid as i32) else {
        return;
    };
    // (the pidfd names the process, whatever its pid names later)
    let Ok(pidfd) = rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()) else {
        return;
    };
    if !has_open(pid, state.fd()) {
        debug!(
            "pid {pid} is not the previous server (it does not hold the mount's state): left alone"
        );
        return;
    }
    if rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::KILL).is_err() {
        return;
    }
    // (a pidfd turns readable when its process is gone)
    let _ = signals::wait_readable(&[pidfd.as_fd()], Duration::from_secs(5));
}

/// Whether process `pid` has a descriptor of what `fd` is open (by
/// /proc/PID/fd: same device and inode).
fn has_open(pid: u32, fd: BorrowedFd<'_>) -> bool {
    let Ok(want) = rustix::fs::fstat(fd) else {
        return false;
    };
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    dir.flatten().any(|e| {
        rustix::fs::stat(e.path())
            .is_ok_and(|st| (st.st_dev, st.st_ino) == (want.st_dev, want.st_ino))
    })
}

/// " (core dumped)" if it did.
fn core_note(s: &std::process::ExitStatus) -> &'static str {
    if s.core_dumped() {
        " (core dumped)"
    } else {
        ""
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A memfd holding `bytes`.
fn memfd_with(name: &str, bytes: &[u8]) -> std::io::Result<OwnedFd> {
    let fd = rustix::fs::memfd_create(name, rustix::fs::MemfdFlags::CLOEXEC)?;
    let mut f = std::fs::File::from(fd);
    f.write_all(bytes)?;
    Ok(OwnedFd::from(f))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sleeper(inherit: Option<RawFd>) -> Child {
        let mut c = Command::new("sleep");
        c.arg("30");
        if let Some(fd) = inherit {
            // SAFETY: between fork and exec, only fcntl on a descriptor of
            // this process.
            unsafe {
                c.pre_exec(move || {
                    if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        c.spawn().unwrap()
    }

    #[test]
    fn only_a_process_holding_the_mounts_state_is_ended_as_its_server() {
        let state = SharedState::create().unwrap();
        // A pid that names some other process now (a recycled one).
        let mut other = sleeper(None);
        end_process(other.id(), &state);
        assert!(other.try_wait().unwrap().is_none(), "a stranger was killed");
        other.kill().unwrap();
        other.wait().unwrap();
        // The previous server: it has the state open.
        let mut server = sleeper(Some(state.fd().as_raw_fd()));
        end_process(server.id(), &state);
        let status = server.try_wait().unwrap().expect("ended, and waited for");
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        // Nothing for pid 0, 1 or this process.
        end_process(0, &state);
        end_process(1, &state);
        end_process(std::process::id(), &state);
    }
}
