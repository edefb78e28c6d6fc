//! A mount's life: its options (`config`, everything wrong with the user's
//! input found before anything is mounted), its FUSE connection
//! (`connection`), assembling the parts and serving (this file), the
//! control socket (`control`), a restart over a dead mount (`dead_mount`),
//! and the process that holds the mount while servers come and go
//! (`supervisor`). Only the command line sits above it.
//!
//! What serves a mount: the `Server` wires the parts together (source,
//! namespace, cache, reader, FUSE adapter) in the shared state and serves
//! a connection's descriptors, and reports readiness; `Mount` is a
//! connection, the lock and a server in one process (tests, benchmarks).
//! `locafs mount`'s entry and the process holding the mount are
//! `supervisor`'s; this module never looks at what is mounted where.
//!
//! Everything that can be wrong with the user's input is found by
//! `config::resolve` before this mounts anything.

pub mod config;
pub mod connection;
pub mod control;
pub mod dead_mount;
pub mod supervisor;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, info, warn};

use crate::cache::disk::DiskCache;
use crate::cache::{BlockStore, CompleteFiles};
use crate::fs::fuse::{FuseOptions, LocaFs};
use crate::meta::namespace::Namespace;
use crate::mount::config::MountConfig;
use crate::obs::logging::short_io;
use crate::obs::stats::Stats;
use crate::read::prefetch::ReadAhead;
use crate::read::reader::{Reader, ReaderConfig};
use crate::source::guard::{GuardConfig, SourceGuard};
use crate::source::object::ObjectSource;
use crate::source::{DirSource, Source};
use crate::sys::private_dir::PrivateDir;
use crate::sys::shm::SharedState;
use crate::sys::units::format_size;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;

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
                if cfg.dataset_dir.join(MANIFEST).is_file() =>
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

/// What serves one mount: the source, namespace, cache, reader,
/// read-ahead, peers and control socket, and the FUSE session over the
/// connection's descriptors. It never mounts or unmounts: the connection
/// is its holder's, and a server that dies (or is replaced) leaves it
/// live for the next, which finds the namespace and the open handles in
/// the shared state. Dropping it stops it.
pub struct Server {
    /// One line on what is mounted and the cache it uses.
    pub summary: String,
    saver: Arc<ManifestSaver>,
    peer_node: Option<Arc<crate::peer::PeerNode>>,
    mountpoint: PathBuf,
    session: Option<fuser::BackgroundSession>,
    readahead: Arc<ReadAhead>,
    stats: Arc<Stats>,
    rt: Option<tokio::runtime::Runtime>,
    /// Books the cache's use in the shared budget; dropped (booked out)
    /// when the server stops.
    budget: Option<crate::cache::budget::BudgetKeeper>,
    /// What the FUSE adapter is built from, until [`Server::serve`].
    parts: Option<FsParts>,
    state: Arc<SharedState>,
    /// Whether the namespace was attached (an earlier server's) rather
    /// than built.
    pub attached: bool,
}

/// The FUSE adapter's ingredients, kept from [`Server::build`] to
/// [`Server::serve`] (the adapter needs the connection's descriptor).
struct FsParts {
    ns: Arc<Namespace>,
    reader: Arc<Reader>,
    complete: Arc<dyn CompleteFiles>,
    opts: FuseOptions,
    fuse_threads: usize,
    kernel_readahead: u64,
}

/// Books the cache in its directory's shared budget and keeps it booked:
/// the grant is applied before this returns, then every 250 ms (`budget::BOOKING_INTERVAL`).
fn start_budget(
    cfg: &MountConfig,
    disk: &Arc<DiskCache>,
    stats: &Arc<Stats>,
) -> Result<crate::cache::budget::BudgetKeeper, (u8, String)> {
    use crate::cache::budget::{Booking, BudgetKeeper, Usage};
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
                crate::cache::budget::WANT_UNKNOWN
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
                crate::cache::budget::LEDGER,
                short_io(&e)
            ),
        )
    })?;
    let share = keeper.share_handle();
    stats.budget.set(Arc::new(move || share.lock().snapshot()));
    Ok(keeper)
}

impl Mount {
    /// Builds a server over `source` (cache, namespace, reader,
    /// read-ahead, control socket), then mounts `cfg.mountpoint` and
    /// serves it. The source is a parameter so that tests and benchmarks
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
        &self.server.mountpoint
    }

    pub fn stats(&self) -> &Arc<Stats> {
        &self.server.stats
    }

    /// The mount's namespace (what the kernel holds of it: lookup counts).
    pub fn namespace(&self) -> &Arc<Namespace> {
        &self.server.saver.ns
    }

    pub fn readahead(&self) -> &Arc<ReadAhead> {
        &self.server.readahead
    }

    /// Serves until SIGINT/SIGTERM (then unmounts) or until someone
    /// unmounts the file system.
    pub fn serve_until_stopped(mut self) {
        let Some(rt) = self.server.rt.as_ref() else {
            return;
        };
        let server = &self.server;
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
                        if server.finished() {
                            return false;
                        }
                    }
                }
            }
        });
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
        info!("unmounted {}", self.server.mountpoint.display());
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

impl Server {
    /// Builds the parts over `source`, in `state`: the namespace and open
    /// handles an earlier server left there are taken over (a restart),
    /// else the namespace comes from the manifest a previous mount saved,
    /// or from the source's root.
    pub fn build(
        cfg: &MountConfig,
        source: Arc<dyn Source>,
        state: &Arc<SharedState>,
    ) -> Result<Server, (u8, String)> {
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
            .thread_keep_alive(crate::source::guard::IDLE_EXIT)
            .thread_name("locafs-rt")
            .enable_all()
            .build()
            .map_err(|e| (1, format!("cannot start the runtime: {e}")))?;

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
        // The cache's books and the namespace (attached to what an earlier
        // server left, or loaded from the manifest) at once, on two
        // threads: each is about half of a remount's time (500 k files,
        // page cache dropped: 0.34 s and 0.25 s, one after the other
        // before; docs/benchmarks.md, ninth scale pass).
        let (opened, restored) = std::thread::scope(|scope| {
            let restoring = std::thread::Builder::new()
                .name("locafs-manifest".into())
                .spawn_scoped(scope, || load_namespace(cfg, &source, state));
            // Unbounded until the shared budget of the cache directory gives
            // this mount its grant (below, before anything is served).
            let opened = DiskCache::open_in(&cfg.dataset, None, cfg.block_size, Arc::clone(&stats));
            let restored = match restoring {
                Ok(t) => t.join().unwrap_or(Loaded::None),
                // No thread: loaded here, after the cache.
                Err(_) => load_namespace(cfg, &source, state),
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
        let attached = matches!(restored, Loaded::Attached(_));
        let ns = match restore_namespace(restored, &cfg.dataset, &cache) {
            Some(ns) => ns,
            None => Namespace::new_in(
                state,
                Arc::clone(&source),
                cfg.revalidate,
                cache.dataset_bytes_handle(),
            )
            .map_err(|e| {
                let why = if crate::source::guard::is_timeout(&e) {
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
        let peers: Option<Arc<dyn crate::read::reader::PeerTier>> = peer_node
            .as_ref()
            .map(|n| Arc::new(n.client()) as Arc<dyn crate::read::reader::PeerTier>);
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
        plug_views(&stats, &cache, &reader, &readahead);
        plug_process(&stats, state);
        if let Some(addr) = cfg.metrics {
            let (st, source, mountpoint) = (
                Arc::clone(&stats),
                cfg.source.display().to_string(),
                cfg.mountpoint.display().to_string(),
            );
            crate::obs::metrics::prometheus::start(
                addr,
                rt.handle(),
                crate::obs::metrics::prometheus::Labels {
                    source: source.clone(),
                    mountpoint: mountpoint.clone(),
                },
                Box::new(move || st.full_snapshot(&source, &mountpoint)),
            )
            .map_err(|e| (2, e))?;
        }
        // (A file a locafs before the abstract socket may have left.)
        let _ = cfg.dataset.remove_file("control.sock");
        let control_socket = crate::mount::control::serve(
            &cfg.mountpoint,
            Arc::clone(&readahead),
            peer_node.clone(),
            rt.handle(),
        )
        .map_err(|e| (1, format!("control socket: {e}")))?;
        let ttl = match cfg.revalidate {
            None => Duration::from_secs(24 * 3600),
            Some(d) => d,
        };
        let summary = format!(
            "mounted {} on {} (read-only); cache {} may hold {} of the budget {}",
            cfg.source.display(),
            cfg.mountpoint.display(),
            cfg.dataset_dir.display(),
            format_size(share.grant),
            format_size(share.limit),
        );

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
        let parts = FsParts {
            ns,
            reader,
            complete,
            opts: FuseOptions {
                ttl,
                passthrough: cfg.passthrough,
                kernel_open: cfg.open_mode == crate::mount::config::OpenMode::Kernel,
                source_label: cfg.source.display().to_string(),
                mount_label: cfg.mountpoint.display().to_string(),
                control_socket,
            },
            fuse_threads: cfg.fuse_threads,
            kernel_readahead: cfg.kernel_readahead,
        };
        Ok(Server {
            peer_node,
            saver,
            summary,
            mountpoint: cfg.mountpoint.clone(),
            session: None,
            readahead,
            stats,
            rt: Some(rt),
            budget: Some(budget),
            parts: Some(parts),
            state: Arc::clone(state),
            attached,
        })
    }

    /// Serves the connection read through `fds` (its descriptor and
    /// clones, one FUSE thread each), whose INIT settled `settled`: puts
    /// back the handles an earlier server left, then asks the kernel to
    /// send again what that server took and did not answer.
    pub fn serve(
        &mut self,
        fds: Vec<std::os::fd::OwnedFd>,
        settled: crate::mount::connection::Settled,
    ) -> Result<(), (u8, String)> {
        let Some(p) = self.parts.take() else {
            return Err((1, "already serving".into()));
        };
        let rt = self.rt.as_ref().ok_or((1, "stopped".to_string()))?;
        let first = fds.first().ok_or((1, "no FUSE descriptor".to_string()))?;
        let dev =
            Arc::new(rustix::io::fcntl_dupfd_cloexec(first, 0).map_err(|e| io_err(e.into()))?);
        let resend = Arc::clone(&dev);
        let mut fs = LocaFs::new(
            p.ns,
            p.reader,
            Some(p.complete),
            Arc::clone(&self.stats),
            rt.handle().clone(),
            p.opts,
            Arc::clone(&self.readahead),
            dev,
        );
        fs.apply_init(settled.granted);
        fs.count_requests_in(Arc::clone(&self.state));
        let (store, saved, backings) = crate::fs::handle_store::HandleStore::attach(&self.state)
            .ok_or((1, "the shared handle table is in use".to_string()))?;
        let (handles, closed) = fs.restore(Arc::new(store), saved, backings);
        if handles > 0 || closed > 0 {
            info!("took over {handles} open handles; closed {closed} passthrough backings no handle uses");
        }
        let mut fuse_cfg = fuser::Config::default();
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            fuse_cfg.acl = fuser::SessionACL::All;
        }
        let _ = p.fuse_threads;
        let session = fuser::Session::from_fds_initialized(
            fs,
            fds,
            fuse_cfg.acl,
            fuser::Version(7, settled.minor),
            fuse_cfg,
        )
        .and_then(|s| s.spawn())
        .map_err(|e| (1, format!("FUSE session: {e}")))?;
        self.session = Some(session);
        if settled.minor >= crate::mount::connection::RESEND_MINOR {
            if let Err(e) = crate::mount::connection::notify_resend(resend.as_fd()) {
                warn!("the kernel did not take FUSE_NOTIFY_RESEND: {e}");
            }
        }
        // Larger kernel read-ahead: bigger reads reach the daemon (its
        // 128 KiB default caps a sequential read served by the daemon at
        // ~0.3 GB/s here, against 1.4 GB/s with 4 MiB).
        if p.kernel_readahead > 0 {
            match crate::sys::set_bdi_readahead(&self.mountpoint, p.kernel_readahead) {
                Ok(()) => debug!(
                    "kernel read-ahead on the mount: {}",
                    format_size(p.kernel_readahead)
                ),
                Err(e) => info!(
                    "kernel read-ahead left at the kernel's default (setting it needs root): {e}"
                ),
            }
        }
        info!("{}", self.summary);
        Ok(())
    }

    /// Whether the session ended (the file system was unmounted, or its
    /// connection aborted).
    pub fn finished(&self) -> bool {
        self.session.as_ref().is_none_or(|s| s.guard.is_finished())
    }

    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// Stops serving: saves the manifest, books the cache out of the
    /// budget, closes the peer endpoint and the control socket. Call it
    /// once the session ended (after an unmount); the connection is not
    /// touched.
    pub fn stop(&mut self) {
        let Some(rt) = self.rt.take() else {
            return;
        };
        if let Some(session) = self.session.take() {
            if session.guard.is_finished() {
                let _ = session.join();
            }
        }
        self.saver.save();
        // Booked out with what the cache holds now (it stays for the next
        // mount), while the cache is still here to say so.
        drop(self.budget.take());
        if let Some(node) = &self.peer_node {
            node.close();
        }
        // (the control socket, in the abstract namespace, goes with the
        // runtime that listens on it)
        rt.shutdown_timeout(Duration::from_secs(2));
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
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

/// Plugs the processes behind the mount (from the shared state's header)
/// into `stats`.
fn plug_process(stats: &Stats, state: &Arc<SharedState>) {
    let st = Arc::downgrade(state);
    stats.process.set(Arc::new(move || {
        let Some(st) = st.upgrade() else {
            return Default::default();
        };
        let h = st.header();
        let restarts = h.restarts.load(Ordering::Relaxed);
        let last = (restarts > 0).then(|| h.last_restart_ms.load(Ordering::Relaxed));
        crate::obs::stats::ProcessSnapshot {
            pid: std::process::id(),
            supervisor_pid: h.supervisor_pid.load(Ordering::Relaxed),
            restarts,
            last_restart: last.map(|ms| ms as f64 / 1000.0),
            last_restart_reason: last.map(|_| {
                crate::sys::shm::reason_name(h.last_reason.load(Ordering::Relaxed)).into()
            }),
            last_restart_detail: last.map(|_| h.last_detail.load(Ordering::Relaxed)),
        }
    }));
}

/// How often the namespace manifest is saved while mounted (if it changed).
const MANIFEST_EVERY: Duration = Duration::from_secs(300);

/// The namespace a server starts from.
enum Loaded {
    /// The one an earlier server of this mount left in the shared state.
    Attached(Namespace),
    /// Restored from the manifest a previous mount saved (and its size).
    Manifest(Namespace, u64),
    None,
}

/// The namespace an earlier server of this mount left in `state`, if any;
/// else the one in the manifest a previous mount left, if usable, with the
/// manifest's size (its known bytes go to a sink of its own until
/// [`restore_namespace`] hands them to the cache).
fn load_namespace(cfg: &MountConfig, source: &Arc<dyn Source>, state: &Arc<SharedState>) -> Loaded {
    match Namespace::attach(state, Arc::clone(source), cfg.revalidate, Arc::default()) {
        Ok(Some(ns)) => {
            info!(
                "namespace: {} inodes taken over from the server this one replaces",
                ns.len()
            );
            return Loaded::Attached(ns);
        }
        Ok(None) => {}
        Err(e) => warn!("namespace: the shared state's cannot be used: {e}"),
    }
    match load_manifest(cfg, source, state) {
        Some((ns, len)) => Loaded::Manifest(ns, len),
        None => Loaded::None,
    }
}

fn load_manifest(
    cfg: &MountConfig,
    source: &Arc<dyn Source>,
    state: &Arc<SharedState>,
) -> Option<(Namespace, u64)> {
    let data = cfg.dataset.read(MANIFEST).ok()?;
    let data_len = data.len() as u64;
    let m = crate::meta::manifest::decode(data)?;
    if m.source != cfg.source.as_os_str().as_encoded_bytes() {
        return None;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_secs();
    let age = Duration::from_secs(now.checked_sub(m.saved_unix_s)?);
    let n = m.len();
    let ns = Namespace::restore_in(
        state,
        Arc::clone(source),
        cfg.revalidate,
        Arc::default(),
        m,
        age,
    )?;
    info!(
        "namespace: {n} entries from the manifest saved {}s ago",
        age.as_secs()
    );
    Some((ns, data_len))
}

/// The namespace [`load_namespace`] gave, tied to the cache (its known
/// bytes; a manifest's room in the cache's bound); None, and the manifest
/// removed, if there was none or there is no room for it.
fn restore_namespace(loaded: Loaded, dir: &PrivateDir, cache: &DiskCache) -> Option<Namespace> {
    let ns = match loaded {
        Loaded::Attached(ns) => {
            // The manifest on disk counts in the cache's bound, as the
            // server before booked it.
            let len = dir.stat(MANIFEST).map_or(0, |m| m.st_size as u64);
            let _ = cache.reserve_aux(len);
            ns.set_known_sink(cache.dataset_bytes_handle());
            return Some(ns);
        }
        Loaded::Manifest(ns, len) if cache.reserve_aux(len) => ns,
        _ => {
            let _ = dir.remove_file(MANIFEST);
            return None;
        }
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
