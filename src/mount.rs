//! Running a mount: checks, daemonizing, wiring the parts together (source,
//! namespace, cache, reader, FUSE adapter), mounting, reporting readiness,
//! and unmounting cleanly on SIGINT/SIGTERM or when someone runs `umount`.
//!
//! Everything that can be wrong with the user's input is found by
//! `config::resolve` before this mounts anything.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::Duration;

use tracing::{error, info, warn};

use crate::cache::disk::DiskCache;
use crate::cache::BlockCache;
use crate::config::{short_io, MountArgs, MountConfig};
use crate::fuse::{FuseOptions, LocaFs};
use crate::namespace::Namespace;
use crate::reader::{Reader, ReaderConfig};
use crate::source::{DirSource, Source};
use crate::stats::Stats;
use crate::units::format_size;

/// Set in the environment of the background child of `--daemon`: it prints
/// READY on stdout once mounted.
const READY_ENV: &str = "LOCAFS_DAEMON_CHILD";

/// `locafs mount`.
pub fn main(args: MountArgs) -> ExitCode {
    let cfg = match crate::config::resolve(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("locafs: {e}");
            return ExitCode::from(2);
        }
    };
    if args.daemon {
        return daemonize();
    }
    crate::logging::init(cfg.log_format, cfg.log_file.as_deref());
    match run(cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, msg)) => {
            error!("{msg}");
            eprintln!("locafs: {msg}");
            ExitCode::from(code)
        }
    }
}

/// Starts this same command without --daemon in a new session and waits
/// until it says READY (exit 0) or dies (its exit status and message).
fn daemonize() -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("locafs: cannot find own executable: {e}");
            return ExitCode::from(1);
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
            eprintln!("locafs: cannot start the daemon: {e}");
            return ExitCode::from(1);
        }
    };
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = BufReader::new(out).read_line(&mut line);
    }
    if line.trim() == "READY" {
        return ExitCode::SUCCESS;
    }
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let status = child.wait().ok().and_then(|s| s.code()).unwrap_or(1);
    eprint!("{err}");
    if err.is_empty() {
        eprintln!("locafs: the daemon exited before the mount was ready");
    }
    ExitCode::from(if status == 0 { 1 } else { status as u8 })
}

/// Mounts and serves until unmounted or signalled.
fn run(cfg: MountConfig) -> Result<(), (u8, String)> {
    crate::sys::raise_nofile_limit();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2)
                .max(2),
        )
        .max_blocking_threads(128)
        .thread_name("locafs-rt")
        .enable_all()
        .build()
        .map_err(|e| (1, format!("cannot start the runtime: {e}")))?;

    let lock = crate::lock::DatasetLock::acquire(&cfg.dataset_dir).map_err(|e| (2, e))?;
    let stats = Arc::new(Stats::default());
    let (cache, rec) = DiskCache::open(
        &cfg.dataset_dir,
        cfg.cache_size,
        cfg.block_size,
        Arc::clone(&stats),
    )
    .map_err(|e| {
        (
            2,
            format!("cache dir {}: {}", cfg.dataset_dir.display(), short_io(&e)),
        )
    })?;
    info!(
        "cache {} limit {}{}; recovered {} files ({}), discarded {} bad entries",
        cfg.dataset_dir.display(),
        format_size(cache.capacity()),
        if cfg.cache_size.is_none() {
            " (80% of the disk's free space; set --cache-size to change)"
        } else {
            ""
        },
        rec.files,
        format_size(rec.bytes),
        rec.discarded
    );
    let source: Arc<dyn Source> = Arc::new(DirSource::new(cfg.source.clone()));
    let ns = Arc::new(
        Namespace::new(Arc::clone(&source), cfg.revalidate).map_err(|e| {
            (
                2,
                format!("source {}: {}", cfg.source.display(), short_io(&e)),
            )
        })?,
    );
    let cache: Arc<dyn BlockCache> = Arc::new(cache);
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
    let ttl = match cfg.revalidate {
        None => Duration::from_secs(24 * 3600),
        Some(d) => d,
    };
    let fs = LocaFs::new(
        Arc::clone(&ns),
        Arc::clone(&reader),
        Arc::clone(&source),
        Arc::clone(&stats),
        rt.handle().clone(),
        FuseOptions {
            ttl,
            passthrough: cfg.passthrough,
            source_label: cfg.source.display().to_string(),
            mount_label: cfg.mountpoint.display().to_string(),
        },
    );
    let mut fuse_cfg = fuser::Config::default();
    fuse_cfg.mount_options = vec![
        fuser::MountOption::FSName(format!("locafs:{}", cfg.source.display())),
        fuser::MountOption::Subtype("locafs".into()),
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
    let session = fuser::spawn_mount(fs, &cfg.mountpoint, &fuse_cfg).map_err(|e| {
        (
            1,
            format!("mount on {} failed: {e}", cfg.mountpoint.display()),
        )
    })?;
    info!(
        "mounted {} on {} (read-only)",
        cfg.source.display(),
        cfg.mountpoint.display()
    );

    // Keep the data set's size known to the cache policy.
    {
        let ns = Arc::clone(&ns);
        let cache = Arc::clone(&cache);
        rt.spawn(async move {
            loop {
                cache.set_dataset_bytes(ns.known_bytes());
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
    }

    announce_ready();

    let mountpoint = cfg.mountpoint.clone();
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
                    if session.guard.is_finished() {
                        return false;
                    }
                }
            }
        }
    });
    if signalled {
        info!("signal received: unmounting {}", mountpoint.display());
        crate::sys::sd_notify("STOPPING=1");
        match crate::sys::unmount(&mountpoint) {
            Ok(()) => {
                let _ = session.join();
            }
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                warn!(
                    "{} is busy: detaching it (open files get errors from now on)",
                    mountpoint.display()
                );
                let _ = crate::sys::lazy_unmount(&mountpoint);
            }
            Err(e) => warn!("unmount of {} failed: {e}", mountpoint.display()),
        }
    } else {
        let _ = session.join();
    }
    info!("unmounted {}", mountpoint.display());
    if let Some(node) = &peer_node {
        node.close();
    }
    drop(lock);
    rt.shutdown_timeout(Duration::from_secs(2));
    Ok(())
}

/// Tells whoever waits (the --daemon parent, systemd) that the mount is live,
/// then detaches a daemon child's output from the parent's pipes.
fn announce_ready() {
    crate::sys::sd_notify("READY=1");
    if std::env::var_os(READY_ENV).is_none() {
        return;
    }
    let mut out = std::io::stdout();
    let _ = writeln!(out, "READY");
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
