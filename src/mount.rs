//! Running a mount: checks, daemonizing, wiring the parts together (source,
//! namespace, cache, reader, FUSE adapter), mounting, reporting readiness,
//! and unmounting cleanly on SIGINT/SIGTERM or when someone runs `umount`.
//!
//! Everything that can be wrong with the user's input is found by
//! `config::resolve` before this mounts anything.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, error, info, warn};

use crate::cache::disk::DiskCache;
use crate::cache::{BlockStore, CompleteFiles};
use crate::config::{MountConfig, MountRequest};
use crate::fuse::{FuseOptions, LocaFs};
use crate::logging::short_io;
use crate::namespace::Namespace;
use crate::prefetch::ReadAhead;
use crate::private_dir::PrivateDir;
use crate::reader::{Reader, ReaderConfig};
use crate::source::object::ObjectSource;
use crate::source::{DirSource, Source};
use crate::source_guard::{GuardConfig, SourceGuard};
use crate::stats::Stats;
use crate::units::format_size;

/// Set in the environment of the background child of `--daemon`: it prints
/// READY on stdout once mounted.
const READY_ENV: &str = "LOCAFS_DAEMON_CHILD";

/// `locafs mount` (`daemon`: return once the mount is live, see
/// [`daemonize`]).
pub fn main(args: MountRequest, daemon: bool) -> ExitCode {
    if let Err(e) = clear_dead_mount(&args) {
        crate::logging::say(&e.to_string());
        return ExitCode::from(2);
    }
    let cfg = match crate::config::resolve(&args) {
        Ok(c) => c,
        Err(e) => {
            crate::logging::say(&e.to_string());
            return ExitCode::from(2);
        }
    };
    if let Err(msg) = check_fuse_access() {
        eprintln!("locafs: {msg}");
        return ExitCode::from(1);
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
    crate::logging::init(cfg.log_format, cfg.log_file.as_deref());
    match run(cfg.clone()) {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, msg)) => {
            // One line: on stderr the log line would say it twice.
            if crate::logging::logs_to_file() {
                error!("{msg}");
            }
            crate::logging::say(&msg);
            forget_new_dataset_dir(&cfg);
            ExitCode::from(code)
        }
    }
}

/// A mount that failed leaves nothing behind: the data set's cache
/// directory, if this attempt made it, goes (with its booking in the
/// budget), unless a mount holds it now.
fn forget_new_dataset_dir(cfg: &MountConfig) {
    if cfg.dataset_dir_created {
        let _ = crate::budget::remove_dataset(&cfg.cache, &cfg.dataset_name);
    }
}

/// If the mountpoint holds a dead locafs mount (its daemon died: every
/// access fails with "Transport endpoint is not connected"), detaches it so
/// that a restart (systemd Restart=on-failure, a remount) mounts again over
/// the same cache (`dead_mount`). An error if a locafs mount there does not
/// answer.
fn clear_dead_mount(args: &MountRequest) -> Result<(), String> {
    let mp = match (&args.mountpoint, args.config_file()) {
        (Some(m), _) => m.clone(),
        (None, Some(c)) => match crate::config::read_config(&c) {
            Ok(crate::config::ConfigFile {
                mountpoint: Some(m),
                ..
            }) => m,
            _ => return Ok(()),
        },
        _ => return Ok(()),
    };
    crate::dead_mount::clear(&mp).map(|_| ())
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
            crate::logging::say(&format!("cannot find own executable: {e}"));
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
            crate::logging::say(&format!("cannot start the daemon: {e}"));
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
        crate::logging::say("the daemon exited before the mount was ready");
    }
    if status == 0 {
        1
    } else {
        status as u8
    }
}

/// Mounts and serves until unmounted or signalled.
fn run(cfg: MountConfig) -> Result<(), (u8, String)> {
    let source: Arc<dyn Source> = match &cfg.object {
        None => Arc::new(DirSource::new(cfg.source.clone())),
        // One listing request before anything is mounted: a missing bucket,
        // refused credentials or a dead endpoint end here, with exit 2;
        // except a store that does not answer when an earlier mount left
        // its tree and cache: those are served, as while a store stalls.
        Some(spec) => match ObjectSource::open(spec, cfg.source_timeout, cfg.metadata_timeout) {
            Ok(s) => Arc::new(s),
            Err(crate::source::object::ProbeError::Unreachable(why))
                if cfg.dataset_dir.join("manifest").is_file() =>
            {
                tracing::warn!(
                    "{why}: mounting the tree and cache the last mount left; what is not \
                     cached fails until the store answers"
                );
                Arc::new(ObjectSource::unprobed(spec, cfg.source_timeout).map_err(|e| (2, e))?)
            }
            Err(e) => return Err((2, e.to_string())),
        },
    };
    let mount = Mount::start(&cfg, source)?;
    announce_ready(&mount.summary);
    mount.serve_until_stopped();
    Ok(())
}

/// A live mount and everything behind it. Dropping it unmounts.
pub struct Mount {
    /// One line on what was mounted and the cache it uses.
    pub summary: String,
    saver: Arc<ManifestSaver>,
    peer_node: Option<Arc<crate::peer::PeerNode>>,
    mountpoint: PathBuf,
    session: Option<fuser::BackgroundSession>,
    readahead: Arc<ReadAhead>,
    stats: Arc<Stats>,
    rt: Option<tokio::runtime::Runtime>,
    /// Books the cache's use in the shared budget; dropped (booked out)
    /// before the lock, so that no neighbour takes this data set for an
    /// unmounted one while it is still booked in.
    budget: Option<crate::budget::BudgetKeeper>,
    _lock: crate::lock::DatasetLock,
}

/// Books the cache in its directory's shared budget and keeps it booked:
/// the grant is applied before this returns, then every 250 ms (`budget::BOOKING_INTERVAL`).
fn start_budget(
    cfg: &MountConfig,
    disk: &Arc<DiskCache>,
    stats: &Arc<Stats>,
) -> Result<crate::budget::BudgetKeeper, (u8, String)> {
    use crate::budget::{Booking, BudgetKeeper, Usage};
    let booking = Booking {
        cache_dir: cfg.cache.clone(),
        id: cfg.dataset_name.clone(),
        source: cfg.source.display().to_string(),
        asked: cfg.cache_size,
        floor_percent: cfg.cache_free_floor,
    };
    let (u, a) = (Arc::downgrade(disk), Arc::downgrade(disk));
    let known = disk.dataset_bytes_handle();
    // What it booked last stays booked when the cache is gone (the mount
    // dropping its parts before it books out).
    let last = parking_lot::Mutex::new(Usage::default());
    let usage = move || {
        let Some(d) = u.upgrade() else {
            return *last.lock();
        };
        let us = d.usage();
        let size = known.load(std::sync::atomic::Ordering::Relaxed);
        let now = Usage {
            used: us.used_bytes,
            files: us.files_cached,
            hot: d.hot_bytes(),
            // Until the tree is known, what is free (`WANT_UNKNOWN`); then
            // the data set with some allocation overhead (the spare room of
            // the budget covers more: `budget::plan`).
            want: if size == 0 {
                crate::budget::WANT_UNKNOWN
            } else {
                size + size / 16 + crate::cache::disk::FIXED_OVERHEAD
            },
        };
        *last.lock() = now;
        now
    };
    let apply = move |grant: u64| {
        if let Some(d) = a.upgrade() {
            d.set_capacity(grant);
        }
    };
    let keeper = BudgetKeeper::start(booking, Box::new(usage), Box::new(apply)).map_err(|e| {
        (
            2,
            format!(
                "cache dir {}: its budget ({}): {}",
                cfg.cache_dir.display(),
                crate::budget::LEDGER,
                short_io(&e)
            ),
        )
    })?;
    let share = keeper.share_handle();
    stats.budget.set(Arc::new(move || share.lock().snapshot()));
    Ok(keeper)
}

impl Mount {
    /// Builds the parts (cache, namespace, reader, read-ahead, control
    /// socket) over `source` and mounts them on `cfg.mountpoint`. The source
    /// is a parameter so that tests and benchmarks can put a slow or failing
    /// source behind a real mount.
    pub fn start(cfg: &MountConfig, source: Arc<dyn Source>) -> Result<Mount, (u8, String)> {
        for n in &cfg.notes {
            info!("{n}");
        }
        crate::sys::raise_nofile_limit();
        crate::sys::tune_allocator(cfg.block_size);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(
                std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(2)
                    .max(2),
            )
            .max_blocking_threads(128)
            // Blocking threads left by a burst (opens and cache reads of
            // read-ahead) end as soon as the source guard's workers do, not
            // after tokio's 10 s.
            .thread_keep_alive(crate::source_guard::IDLE_EXIT)
            .thread_name("locafs-rt")
            .enable_all()
            .build()
            .map_err(|e| (1, format!("cannot start the runtime: {e}")))?;

        let lock =
            crate::lock::DatasetLock::acquire(&cfg.dataset).map_err(|e| (2, e.to_string()))?;
        let stats = Arc::new(Stats::default());
        // Every call into the source from here on has a deadline and runs
        // on the guard's bounded threads (a hung NFS server holds those,
        // never a FUSE thread).
        let source: Arc<dyn Source> = Arc::new(SourceGuard::new(
            source,
            GuardConfig::new(cfg.metadata_timeout, cfg.source_timeout),
            Arc::clone(&stats),
        ));
        {
            let s = Arc::clone(&source);
            stats
                .source_skipped
                .set(Arc::new(move || s.skipped_entries()));
            let s = Arc::clone(&source);
            stats
                .source_throttled
                .set(Arc::new(move || s.throttled_responses()));
            let s = Arc::clone(&source);
            stats
                .source_bad_replies
                .set(Arc::new(move || s.bad_replies()));
        }
        // The cache's books and the namespace's manifest load at once, on
        // two threads: each is about half of a remount's time (500 k files,
        // page cache dropped: 0.34 s and 0.25 s, one after the other
        // before; docs/benchmarks.md, ninth scale pass).
        let (opened, restored) = std::thread::scope(|scope| {
            let restoring = std::thread::Builder::new()
                .name("locafs-manifest".into())
                .spawn_scoped(scope, || load_namespace(cfg, &source));
            // Unbounded until the shared budget of the cache directory gives
            // this mount its grant (below, before anything is served).
            let opened = DiskCache::open_in(&cfg.dataset, None, cfg.block_size, Arc::clone(&stats));
            let restored = match restoring {
                Ok(t) => t.join().ok().flatten(),
                // No thread: loaded here, after the cache.
                Err(_) => load_namespace(cfg, &source),
            };
            (opened, restored)
        });
        let (cache, rec) = opened.map_err(|e| {
            (
                2,
                format!("cache dir {}: {}", cfg.dataset_dir.display(), short_io(&e)),
            )
        })?;
        info!(
            "cache {}: recovered {} files ({}), discarded {} bad entries",
            cfg.dataset_dir.display(),
            rec.files,
            format_size(rec.bytes),
            rec.discarded
        );
        if rec.other_block_size > 0 {
            warn!(
                "cache: {} files were cached with another --block-size and were discarded",
                rec.other_block_size
            );
        }
        let ns = match restore_namespace(restored, &cfg.dataset, &cache) {
            Some(ns) => ns,
            None => Namespace::new(
                Arc::clone(&source),
                cfg.revalidate,
                cache.dataset_bytes_handle(),
            )
            .map_err(|e| {
                let why = if crate::source_guard::is_timeout(&e) {
                    format!(
                        "did not answer within --metadata-timeout ({}s)",
                        cfg.metadata_timeout.as_secs_f64()
                    )
                } else {
                    short_io(&e)
                };
                (2, format!("source {}: {why}", cfg.source.display()))
            })?,
        };
        let ns = Arc::new(ns.with_stats(Arc::clone(&stats)));
        let disk = Arc::new(cache);
        let budget = start_budget(cfg, &disk, &stats)?;
        let share = budget.share();
        // What the other data sets hold: not this one's own use.
        let others: u64 = share
            .datasets
            .iter()
            .filter(|(id, ..)| *id != cfg.dataset_name)
            .map(|(_, used, _)| used)
            .sum();
        info!(
            "cache {}: may hold {} of the budget {} that {} shares with {} other data sets (they hold {}){}",
            cfg.dataset_dir.display(),
            format_size(share.grant),
            format_size(share.limit),
            cfg.cache_dir.display(),
            share.datasets.len().saturating_sub(1),
            format_size(others),
            if cfg.cache_size.is_none() {
                "; set --cache-size to change the budget"
            } else {
                ""
            }
        );
        // One disk cache behind both seams: blocks for the reader, whole files
        // for the open path (passthrough).
        let cache: Arc<dyn BlockStore> = Arc::clone(&disk) as Arc<dyn BlockStore>;
        let complete: Arc<dyn CompleteFiles> = Arc::clone(&disk) as Arc<dyn CompleteFiles>;
        let peer_node = match &cfg.peer {
            None => None,
            Some(pc) => {
                let node = crate::peer::PeerNode::start(
                    pc.clone(),
                    &cfg.dataset_name,
                    cfg.block_size,
                    Arc::clone(&stats),
                    rt.handle(),
                )
                .map_err(|e| (2, format!("--listen {}: {}", pc.listen, short_io(&e))))?;
                info!(
                    "peer cache: listening on {} (cluster {}), peers {}",
                    pc.listen,
                    pc.identity.cluster_id(),
                    pc.peers.join(",")
                );
                let m = Arc::clone(node.membership());
                stats.peers.set(Arc::new(move || m.snapshot()));
                Some(node)
            }
        };
        let peers: Option<Arc<dyn crate::reader::PeerTier>> = peer_node
            .as_ref()
            .map(|n| Arc::new(n.client()) as Arc<dyn crate::reader::PeerTier>);
        let reader = Reader::new(
            ReaderConfig {
                block_size: cfg.block_size,
                memory_bytes: cfg.memory_cache,
                write_queue_bytes: cfg.write_queue,
                write_wait_bytes: cfg.write_wait,
                source_timeout: cfg.source_timeout,
            },
            Arc::clone(&cache),
            Arc::clone(&source),
            peers,
            rt.handle().clone(),
            Arc::clone(&stats),
        );
        if let Some(node) = &peer_node {
            node.serve(Arc::clone(&reader), Arc::clone(&source), rt.handle());
        }
        let readahead = ReadAhead::new(
            cfg.readahead.clone(),
            Arc::clone(&reader),
            Arc::clone(&ns),
            rt.handle().clone(),
        );
        if let Some(node) = &peer_node {
            readahead.set_peer_node(Arc::clone(node));
        }
        plug_views(&stats, &cache, &reader, &readahead);
        if let Some(addr) = cfg.metrics {
            let (st, source, mountpoint) = (
                Arc::clone(&stats),
                cfg.source.display().to_string(),
                cfg.mountpoint.display().to_string(),
            );
            crate::metrics::prometheus::start(
                addr,
                rt.handle(),
                crate::metrics::prometheus::Labels {
                    source: source.clone(),
                    mountpoint: mountpoint.clone(),
                },
                Box::new(move || st.full_snapshot(&source, &mountpoint)),
            )
            .map_err(|e| (2, e))?;
        }
        // (A file a locafs before the abstract socket may have left.)
        let _ = cfg.dataset.remove_file("control.sock");
        let control_socket =
            crate::control::serve(&cfg.mountpoint, Arc::clone(&readahead), rt.handle())
                .map_err(|e| (1, format!("control socket: {e}")))?;
        let ttl = match cfg.revalidate {
            None => Duration::from_secs(24 * 3600),
            Some(d) => d,
        };
        let fs = LocaFs::new(
            Arc::clone(&ns),
            Arc::clone(&reader),
            Some(complete),
            Arc::clone(&stats),
            rt.handle().clone(),
            FuseOptions {
                ttl,
                passthrough: cfg.passthrough,
                kernel_open: cfg.open_mode == crate::config::OpenMode::Kernel,
                source_label: cfg.source.display().to_string(),
                mount_label: cfg.mountpoint.display().to_string(),
                control_socket,
                posix_acl: ns.has_acls(),
            },
            Arc::clone(&readahead),
        );
        let mut fuse_cfg = fuser::Config::default();
        fuse_cfg.mount_options = vec![
            fuser::MountOption::FSName(format!("locafs:{}", cfg.source.display())),
            // fuser's own mount(2) drops MountOption::Subtype; the kernel takes
            // it as an option, so the type reads "fuse.locafs" (mount -t, findmnt).
            fuser::MountOption::CUSTOM("subtype=locafs".into()),
            fuser::MountOption::RO,
            fuser::MountOption::DefaultPermissions,
            fuser::MountOption::NoDev,
            fuser::MountOption::NoSuid,
        ];
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            fuse_cfg.acl = fuser::SessionACL::All;
        }
        fuse_cfg.n_threads = Some(cfg.fuse_threads);
        fuse_cfg.clone_fd = true;
        let session = fuser::spawn_mount(fs, &cfg.mountpoint, &fuse_cfg)
            .map_err(|e| mount_failed(&cfg.mountpoint, &e))?;
        // Larger kernel read-ahead: bigger reads reach the daemon (its
        // 128 KiB default caps a sequential read served by the daemon at
        // ~0.3 GB/s here, against 1.4 GB/s with 4 MiB).
        if cfg.kernel_readahead > 0 {
            match crate::sys::set_bdi_readahead(&cfg.mountpoint, cfg.kernel_readahead) {
                Ok(()) => debug!(
                    "kernel read-ahead on the mount: {}",
                    format_size(cfg.kernel_readahead)
                ),
                Err(e) => info!(
                    "kernel read-ahead left at the kernel's default (setting it needs root): {e}"
                ),
            }
        }
        let summary = format!(
            "mounted {} on {} (read-only); cache {} may hold {} of the budget {}",
            cfg.source.display(),
            cfg.mountpoint.display(),
            cfg.dataset_dir.display(),
            format_size(share.grant),
            format_size(share.limit),
        );
        info!("{summary}");

        let saver = ManifestSaver {
            ns: Arc::clone(&ns),
            disk,
            dir: cfg.dataset.clone(),
            source: cfg.source.as_os_str().as_encoded_bytes().to_vec(),
            saved_at: parking_lot::Mutex::new(u64::MAX),
        };
        let saver = Arc::new(saver);
        {
            let saver = Arc::clone(&saver);
            rt.spawn(async move {
                loop {
                    tokio::time::sleep(MANIFEST_EVERY).await;
                    let s = Arc::clone(&saver);
                    let _ = tokio::task::spawn_blocking(move || s.save()).await;
                }
            });
        }
        Ok(Mount {
            peer_node,
            saver,
            summary,
            mountpoint: cfg.mountpoint.clone(),
            session: Some(session),
            readahead,
            stats,
            rt: Some(rt),
            budget: Some(budget),
            _lock: lock,
        })
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// The mount's namespace (what the kernel holds of it: lookup counts).
    pub fn namespace(&self) -> &Arc<Namespace> {
        &self.saver.ns
    }

    pub fn readahead(&self) -> &Arc<ReadAhead> {
        &self.readahead
    }

    /// Serves until SIGINT/SIGTERM (then unmounts) or until someone
    /// unmounts the file system.
    pub fn serve_until_stopped(mut self) {
        let Some(rt) = self.rt.as_ref() else { return };
        let finished = || self.session.as_ref().is_none_or(|s| s.guard.is_finished());
        let signalled = rt.block_on(async {
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
                        if finished() {
                            return false;
                        }
                    }
                }
            }
        });
        if signalled {
            info!("signal received: unmounting {}", self.mountpoint.display());
            crate::sys::sd_notify("STOPPING=1");
        }
        self.unmount();
    }

    /// Unmounts (detaching lazily if files are still open) and stops.
    pub fn unmount(&mut self) {
        let Some(session) = self.session.take() else {
            return;
        };
        if !session.guard.is_finished() {
            match crate::sys::unmount(&self.mountpoint) {
                Ok(()) => {
                    let _ = session.join();
                }
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    warn!(
                        "{} is busy: detaching it (open files get errors from now on)",
                        self.mountpoint.display()
                    );
                    let _ = crate::sys::lazy_unmount(&self.mountpoint);
                }
                Err(e) => warn!("unmount of {} failed: {e}", self.mountpoint.display()),
            }
        } else {
            let _ = session.join();
        }
        info!("unmounted {}", self.mountpoint.display());
        self.saver.save();
        // Booked out with what the cache holds now (it stays for the next
        // mount), while the cache is still here to say so.
        drop(self.budget.take());
        if let Some(node) = &self.peer_node {
            node.close();
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(2));
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.unmount();
    }
}

/// The exit status and message of a failed mount(2): a refusal for lack of
/// privilege is the setup's problem (exit 2: a restart will not help), with
/// what it takes; anything else exit 1. A user's mount goes through
/// fusermount3, whose refusal (several lines on its stderr) is said on one
/// line.
fn mount_failed(mountpoint: &Path, e: &std::io::Error) -> (u8, String) {
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

/// Plugs the parts of the stats snapshot that the cache, the reader and
/// read-ahead own into `stats` (weakly: each of them holds the stats).
fn plug_views(
    stats: &Stats,
    cache: &Arc<dyn BlockStore>,
    reader: &Arc<Reader>,
    readahead: &Arc<ReadAhead>,
) {
    let c = Arc::downgrade(cache);
    stats.cache.set(Arc::new(move || {
        c.upgrade().map(|c| c.usage()).unwrap_or_default()
    }));
    let r = Arc::downgrade(reader);
    stats.memory_cache.set(Arc::new(move || {
        r.upgrade().map(|r| r.memory_bytes()).unwrap_or_default()
    }));
    let ra = Arc::downgrade(readahead);
    stats.read_ahead.set(Arc::new(move || {
        ra.upgrade().map(|ra| ra.snapshot()).unwrap_or_default()
    }));
}

/// How often the namespace manifest is saved while mounted (if it changed).
const MANIFEST_EVERY: Duration = Duration::from_secs(300);

/// Loads the namespace from the manifest a previous mount left, if usable,
/// with the manifest's size; its known bytes go to a sink of its own until
/// [`restore_namespace`] hands them to the cache.
fn load_namespace(cfg: &MountConfig, source: &Arc<dyn Source>) -> Option<(Namespace, u64)> {
    let data = cfg.dataset.read(MANIFEST).ok()?;
    let data_len = data.len() as u64;
    let m = crate::manifest::decode(data)?;
    if m.source != cfg.source.as_os_str().as_encoded_bytes() {
        return None;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_secs();
    let age = Duration::from_secs(now.checked_sub(m.saved_unix_s)?);
    let n = m.len();
    let ns = Namespace::restore(Arc::clone(source), cfg.revalidate, Arc::default(), m, age)?;
    info!(
        "namespace: {n} entries from the manifest saved {}s ago",
        age.as_secs()
    );
    Some((ns, data_len))
}

/// The namespace [`load_namespace`] gave, tied to the cache (its known
/// bytes, the manifest's room in the cache's bound); None, and the
/// manifest removed, if there was none or there is no room for it.
fn restore_namespace(
    loaded: Option<(Namespace, u64)>,
    dir: &PrivateDir,
    cache: &DiskCache,
) -> Option<Namespace> {
    let usable = loaded.filter(|(_, len)| cache.reserve_aux(*len));
    let Some((ns, _)) = usable else {
        let _ = dir.remove_file(MANIFEST);
        return None;
    };
    ns.set_known_sink(cache.dataset_bytes_handle());
    Some(ns)
}

/// The namespace manifest's name in the data set's directory.
const MANIFEST: &str = "manifest";

/// Saves the namespace manifest beside the cache, within its size bound.
struct ManifestSaver {
    ns: Arc<Namespace>,
    disk: Arc<DiskCache>,
    /// The data set's directory.
    dir: PrivateDir,
    source: Vec<u8>,
    /// The namespace's change counter at the last save.
    saved_at: parking_lot::Mutex<u64>,
}

impl ManifestSaver {
    fn save(&self) {
        let mut saved_at = self.saved_at.lock();
        let changes = self.ns.changes();
        if *saved_at == changes {
            return;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        // Entries that left the tree and that the kernel does not hold lose
        // their names first.
        self.ns.sweep();
        let old = self
            .dir
            .stat(MANIFEST)
            .map(|m| m.st_size as u64)
            .unwrap_or(0);
        // Old and new exist side by side until the rename. (The tree may
        // grow a little between this count and the save: booked again
        // with the size written.)
        let len = self.ns.manifest_len(&self.source);
        if !self.disk.reserve_aux(old + len) {
            debug!("manifest not saved: the cache is full");
            return;
        }
        // Streamed from the namespace to the file: no copy of the tree in
        // memory.
        let tmp = "manifest.tmp";
        let written = self
            .dir
            .create_file(tmp)
            .and_then(|f| self.ns.save_to(f, &self.source, now))
            .and_then(|(f, n)| f.sync_data().map(|()| n))
            .and_then(|n| self.dir.rename(tmp, MANIFEST).map(|()| n));
        match written {
            Ok(n) => {
                self.disk.reserve_aux(n);
                *saved_at = changes;
            }
            Err(e) => {
                let _ = self.dir.remove_file(tmp);
                self.disk.reserve_aux(old);
                debug!("manifest not saved: {e}");
            }
        }
    }
}

/// Tells whoever waits (the --daemon parent, systemd) that the mount is live,
/// then detaches a daemon child's output from the parent's pipes.
fn announce_ready(summary: &str) {
    crate::sys::sd_notify("READY=1");
    if std::env::var_os(READY_ENV).is_none() {
        return;
    }
    let mut out = std::io::stdout();
    let _ = writeln!(out, "READY {summary}");
    let _ = out.flush();
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        use std::os::fd::AsRawFd;
        // SAFETY: dup2 onto our own stdout/stderr descriptors.
        unsafe {
            libc::dup2(null.as_raw_fd(), 1);
            if !crate::logging::logs_to_file() {
                libc::dup2(null.as_raw_fd(), 2);
            }
        }
    }
}
