//! Assembling a mount: the one place where its parts are built and wired
//! together, for every way a mount is served (`locafs mount`'s server
//! process, `__serve`, which is also what a restart and a takeover start;
//! `Mount`, in one process, for tests and benchmarks). [`assemble`] takes
//! the resolved options, the source and the shared state and returns the
//! parts ([`Assembly`]): the runtime, the guarded source, the cache (booked
//! in its directory's budget), the namespace (taken over, restored from the
//! manifest, or new), the peer node, and the [`Core`] over them: reader,
//! read-ahead and the file system core, with their views plugged into the
//! stats. [`core`] is the wiring of that core over any tiers: the FUSE-free
//! suite (tests/fs) builds its core through it over its fakes.
//!
//! It never mounts, unmounts or reads a FUSE request, and starts nothing
//! that answers anyone but the peers (the control socket is bound, not
//! served): serving is `server`'s.

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use crate::cache::budget::{Booking, BudgetKeeper, Usage};
use crate::cache::disk::DiskCache;
use crate::cache::{BlockStore, CompleteFiles};
use crate::fs::fuse::{FuseOptions, KernelBacking};
use crate::fs::{FsCore, FsOptions};
use crate::meta::namespace::Namespace;
use crate::mount::config::{MountConfig, OpenMode};
use crate::mount::control;
use crate::mount::tree::{load_namespace, restore_namespace, Loaded};
use crate::obs::logging::short_io;
use crate::obs::stats::Stats;
use crate::peer::PeerNode;
use crate::read::prefetch::{ReadAhead, ReadAheadConfig};
use crate::read::reader::{PeerTier, Reader, ReaderConfig};
use crate::source::guard::{GuardConfig, SourceGuard};
use crate::source::Source;
use crate::sys::shm::SharedState;
use crate::sys::units::format_size;

/// The tiers a core is wired over: what a read reaches, in order, and the
/// tree the requests name.
pub struct Tiers {
    /// The source (a mount's is behind the source guard).
    pub source: Arc<dyn Source>,
    pub ns: Namespace,
    pub cache: Arc<dyn BlockStore>,
    /// The cache's whole files, for passthrough (None: every file is
    /// opened through the daemon).
    pub complete: Option<Arc<dyn CompleteFiles>>,
    pub peers: Option<Arc<dyn PeerTier>>,
}

/// How a core is tuned.
pub struct CoreConfig {
    pub reader: ReaderConfig,
    pub readahead: ReadAheadConfig,
    pub fs: FsOptions,
}

/// A mount's engine without FUSE: the namespace, the reader over the
/// tiers, read-ahead, and the file system core over backings of type `B`
/// (the kernel's, or a test's).
pub struct Core<B> {
    pub ns: Arc<Namespace>,
    pub reader: Arc<Reader>,
    pub readahead: Arc<ReadAhead>,
    pub fs: Arc<FsCore<B>>,
}

/// Wires a core over `tiers` on `rt`, counting in `stats`, and plugs the
/// views of the cache, the reader and read-ahead into `stats`.
pub fn core<B: Send + Sync + 'static>(
    tiers: Tiers,
    config: CoreConfig,
    stats: &Arc<Stats>,
    rt: &tokio::runtime::Handle,
) -> Core<B> {
    let ns = Arc::new(tiers.ns.with_stats(Arc::clone(stats)));
    let reader = Reader::new(
        config.reader,
        Arc::clone(&tiers.cache),
        tiers.source,
        tiers.peers,
        rt.clone(),
        Arc::clone(stats),
    );
    let readahead = ReadAhead::new(
        config.readahead,
        Arc::clone(&reader),
        Arc::clone(&ns),
        rt.clone(),
    );
    plug_views(stats, &tiers.cache, &reader, &readahead);
    let fs = FsCore::new(
        Arc::clone(&ns),
        Arc::clone(&reader),
        tiers.complete,
        Arc::clone(stats),
        rt.clone(),
        config.fs,
        Arc::clone(&readahead),
    );
    Core {
        ns,
        reader,
        readahead,
        fs,
    }
}

/// A mount's parts, assembled and not served: what [`assemble`] returns
/// and `Server::start` serves.
pub struct Assembly {
    /// The runtime every task of the mount runs on.
    pub rt: tokio::runtime::Runtime,
    pub stats: Arc<Stats>,
    /// The source behind its guard.
    pub source: Arc<dyn Source>,
    pub core: Core<KernelBacking>,
    /// The cache behind both seams of the core's tiers.
    pub disk: Arc<DiskCache>,
    /// Books the cache's use in the shared budget (booked out when
    /// dropped).
    pub budget: BudgetKeeper,
    /// Listening already, and serving blocks from the reader.
    pub peer_node: Option<Arc<PeerNode>>,
    /// The control socket, bound under the name the core answers with.
    pub control: control::Listener,
    /// The FUSE adapter's settings.
    pub fuse: FuseOptions,
    /// Whether the namespace was attached (an earlier server's) rather
    /// than built.
    pub attached: bool,
    /// One line on what is mounted and the cache it uses.
    pub summary: String,
}

/// Assembles a mount of `cfg` over `source` in `state`: the namespace and
/// open handles an earlier server left there are taken over (a restart, a
/// takeover), else the namespace comes from the manifest a previous mount
/// saved, or from the source's root.
pub fn assemble(
    cfg: &MountConfig,
    source: Arc<dyn Source>,
    state: &Arc<SharedState>,
) -> Result<Assembly, (u8, String)> {
    for n in &cfg.notes {
        info!("{n}");
    }
    crate::sys::raise_nofile_limit();
    crate::sys::tune_allocator(cfg.block_size);
    let rt = runtime()?;
    let stats = Arc::new(Stats::default());
    let source = guard(cfg, source, &stats);
    let (disk, loaded) = open_cache_and_tree(cfg, &source, state, &stats)?;
    let attached = matches!(loaded, Loaded::Attached(_));
    let ns = namespace(cfg, loaded, &disk, &source, state)?;
    let disk = Arc::new(disk);
    let budget = start_budget(cfg, &disk, &stats)?;
    let share = budget.share();
    log_share(cfg, &share);
    let peer_node = start_peers(cfg, &stats, rt.handle())?;
    let control = control::bind().map_err(|e| (1, format!("control socket: {e}")))?;
    let tiers = Tiers {
        source: Arc::clone(&source),
        ns,
        // One disk cache behind both seams: blocks for the reader, whole
        // files for the open path (passthrough).
        cache: Arc::clone(&disk) as Arc<dyn BlockStore>,
        complete: Some(Arc::clone(&disk) as Arc<dyn CompleteFiles>),
        peers: peer_node
            .as_ref()
            .map(|n| Arc::new(n.client()) as Arc<dyn PeerTier>),
    };
    let core = core(tiers, core_config(cfg, control.name()), &stats, rt.handle());
    if let Some(node) = &peer_node {
        node.serve(Arc::clone(&core.reader), Arc::clone(&source), rt.handle());
    }
    plug_process(&stats, state);
    let summary = format!(
        "mounted {} on {} (read-only); cache {} may hold {} of the budget {}",
        cfg.source.display(),
        cfg.mountpoint.display(),
        cfg.dataset_dir.display(),
        format_size(share.grant),
        format_size(share.limit),
    );
    Ok(Assembly {
        rt,
        stats,
        source,
        core,
        disk,
        budget,
        peer_node,
        control,
        fuse: fuse_options(cfg),
        attached,
        summary,
    })
}

/// The runtime of a mount: a worker per core (two at least), and blocking
/// threads for opens, cache reads and the source guard's calls.
fn runtime() -> Result<tokio::runtime::Runtime, (u8, String)> {
    tokio::runtime::Builder::new_multi_thread()
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
        .map_err(|e| (1, format!("cannot start the runtime: {e}")))
}

/// `source` behind the source guard, its counters plugged into `stats`:
/// every call into the source from here on has a deadline and runs on the
/// guard's bounded threads (a hung NFS server holds those, never a FUSE
/// thread).
fn guard(cfg: &MountConfig, source: Arc<dyn Source>, stats: &Arc<Stats>) -> Arc<dyn Source> {
    let source: Arc<dyn Source> = Arc::new(SourceGuard::new(
        source,
        GuardConfig::new(cfg.metadata_timeout, cfg.source_timeout),
        Arc::clone(stats),
    ));
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
    source
}

/// Opens the cache's books and loads the namespace (attached to what an
/// earlier server left, or from the manifest) at once, on two threads:
/// each is about half of a remount's time (500 k files, page cache
/// dropped: 0.34 s and 0.25 s, one after the other before;
/// docs/benchmarks.md, ninth scale pass).
fn open_cache_and_tree(
    cfg: &MountConfig,
    source: &Arc<dyn Source>,
    state: &Arc<SharedState>,
    stats: &Arc<Stats>,
) -> Result<(DiskCache, Loaded), (u8, String)> {
    let (opened, loaded) = std::thread::scope(|scope| {
        let restoring = std::thread::Builder::new()
            .name("locafs-manifest".into())
            .spawn_scoped(scope, || load_namespace(cfg, source, state));
        // Unbounded until the shared budget of the cache directory gives
        // this mount its grant (before anything is served).
        let opened = DiskCache::open_in(&cfg.dataset, None, cfg.block_size, Arc::clone(stats));
        let loaded = match restoring {
            Ok(t) => t.join().unwrap_or(Loaded::None),
            // No thread: loaded here, after the cache.
            Err(_) => load_namespace(cfg, source, state),
        };
        (opened, loaded)
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
    Ok((cache, loaded))
}

/// The namespace `loaded` gave, tied to `cache`; else a new one over the
/// source's root (the source must answer within --metadata-timeout).
fn namespace(
    cfg: &MountConfig,
    loaded: Loaded,
    cache: &DiskCache,
    source: &Arc<dyn Source>,
    state: &Arc<SharedState>,
) -> Result<Namespace, (u8, String)> {
    if let Some(ns) = restore_namespace(loaded, &cfg.dataset, cache) {
        return Ok(ns);
    }
    Namespace::new_in(
        state,
        Arc::clone(source),
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
    })
}

/// Books the cache in its directory's shared budget and keeps it booked:
/// the grant is applied before this returns, then every 250 ms
/// (`budget::BOOKING_INTERVAL`).
fn start_budget(
    cfg: &MountConfig,
    disk: &Arc<DiskCache>,
    stats: &Arc<Stats>,
) -> Result<BudgetKeeper, (u8, String)> {
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

/// Says what the cache may hold of the budget it shares.
fn log_share(cfg: &MountConfig, share: &crate::cache::budget::Share) {
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
}

/// The peer node of `--listen`, listening (it serves blocks once the
/// reader is there), its membership plugged into `stats`; None without
/// peers.
fn start_peers(
    cfg: &MountConfig,
    stats: &Arc<Stats>,
    rt: &tokio::runtime::Handle,
) -> Result<Option<Arc<PeerNode>>, (u8, String)> {
    let Some(pc) = &cfg.peer else {
        return Ok(None);
    };
    let node = PeerNode::start(
        pc.clone(),
        &cfg.dataset_name,
        cfg.block_size,
        Arc::clone(stats),
        rt,
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
    Ok(Some(node))
}

/// The core's settings from the options; `control_socket` is the control
/// socket's name (the `user.locafs.control` value).
fn core_config(cfg: &MountConfig, control_socket: &str) -> CoreConfig {
    CoreConfig {
        reader: ReaderConfig {
            block_size: cfg.block_size,
            memory_bytes: cfg.memory_cache,
            write_queue_bytes: cfg.write_queue,
            write_wait_bytes: cfg.write_wait,
            source_timeout: cfg.source_timeout,
        },
        readahead: cfg.readahead.clone(),
        fs: FsOptions {
            source_label: cfg.source.display().to_string(),
            mount_label: cfg.mountpoint.display().to_string(),
            control_socket: control_socket.to_owned(),
        },
    }
}

/// The FUSE adapter's settings from the options.
fn fuse_options(cfg: &MountConfig) -> FuseOptions {
    FuseOptions {
        ttl: cfg.revalidate.unwrap_or(Duration::from_secs(24 * 3600)),
        passthrough: cfg.passthrough,
        kernel_open: cfg.open_mode == OpenMode::Kernel,
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
    use std::sync::atomic::Ordering;
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
