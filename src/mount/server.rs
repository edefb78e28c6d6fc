//! Serving an assembled mount (`assemble`): [`Server::start`] serves what
//! answers outside the kernel (the control socket, the metrics exporter,
//! the manifest saver); [`Server::serve`] runs the FUSE session over a
//! connection's descriptors, puts back the handles an earlier server left
//! in the shared state and asks the kernel to send again what that server
//! took and did not answer; [`Server::stop`] saves and books out.
//!
//! It never mounts or unmounts: the connection is its holder's (the
//! supervisor's, or `Mount`'s), and a server that dies (or is replaced)
//! leaves it live for the next, which finds the namespace and the open
//! handles in the shared state. It builds no part itself: everything it
//! serves comes from `assemble`.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, info, warn};

use crate::cache::budget::BudgetKeeper;
use crate::fs::fuse::{FuseOptions, KernelBacking, LocaFs};
use crate::fs::FsCore;
use crate::meta::namespace::Namespace;
use crate::mount::assemble::{assemble, Assembly};
use crate::mount::config::MountConfig;
use crate::mount::connection::Settled;
use crate::mount::tree::ManifestSaver;
use crate::obs::stats::Stats;
use crate::peer::PeerNode;
use crate::read::prefetch::ReadAhead;
use crate::source::Source;
use crate::sys::shm::SharedState;
use crate::sys::units::format_size;

/// What serves one mount: the assembled parts, the services started over
/// them, and the FUSE session once [`Server::serve`] runs. Dropping it
/// stops it.
pub struct Server {
    /// One line on what is mounted and the cache it uses.
    pub summary: String,
    saver: Arc<ManifestSaver>,
    peer_node: Option<Arc<PeerNode>>,
    mountpoint: PathBuf,
    session: Option<fuser::BackgroundSession>,
    readahead: Arc<ReadAhead>,
    stats: Arc<Stats>,
    rt: Option<tokio::runtime::Runtime>,
    /// Books the cache's use in the shared budget; dropped (booked out)
    /// when the server stops.
    budget: Option<BudgetKeeper>,
    /// What the FUSE adapter is built from, until [`Server::serve`].
    adapter: Option<(Arc<FsCore<KernelBacking>>, FuseOptions)>,
    kernel_readahead: u64,
    state: Arc<SharedState>,
    /// Whether the namespace was attached (an earlier server's) rather
    /// than built.
    pub attached: bool,
}

impl Server {
    /// Assembles a mount of `cfg` over `source` in `state`
    /// ([`assemble`]) and starts it ([`Server::start`]): how every server
    /// is made (`__serve`, and so every restart and takeover; `Mount`).
    pub fn build(
        cfg: &MountConfig,
        source: Arc<dyn Source>,
        state: &Arc<SharedState>,
    ) -> Result<Server, (u8, String)> {
        let parts = assemble(cfg, source, state)?;
        Server::start(cfg, parts, state)
    }

    /// Starts serving the assembled `parts` outside the kernel: the
    /// metrics exporter (`--metrics`), the control socket and the
    /// manifest saver. The FUSE session waits for [`Server::serve`].
    pub fn start(
        cfg: &MountConfig,
        parts: Assembly,
        state: &Arc<SharedState>,
    ) -> Result<Server, (u8, String)> {
        let Assembly {
            rt,
            stats,
            core,
            disk,
            budget,
            peer_node,
            control,
            fuse,
            attached,
            summary,
            ..
        } = parts;
        if let Some(addr) = cfg.metrics {
            start_metrics(cfg, addr, &stats, rt.handle())?;
        }
        // (A file a locafs before the abstract socket may have left.)
        let _ = cfg.dataset.remove_file("control.sock");
        crate::mount::control::serve(
            control,
            &cfg.mountpoint,
            Arc::clone(&core.readahead),
            peer_node.clone(),
            rt.handle(),
        )
        .map_err(|e| (1, format!("control socket: {e}")))?;
        let saver = Arc::new(ManifestSaver::new(cfg, Arc::clone(&core.ns), disk));
        saver.save_periodically(rt.handle());
        Ok(Server {
            summary,
            saver,
            peer_node,
            mountpoint: cfg.mountpoint.clone(),
            session: None,
            readahead: core.readahead,
            stats,
            rt: Some(rt),
            budget: Some(budget),
            adapter: Some((core.fs, fuse)),
            kernel_readahead: cfg.kernel_readahead,
            state: Arc::clone(state),
            attached,
        })
    }

    /// Serves the connection read through `fds` (its descriptor and
    /// clones, one FUSE thread each), whose INIT settled `settled`: puts
    /// back the handles an earlier server left, then asks the kernel to
    /// send again what that server took and did not answer.
    pub fn serve(&mut self, fds: Vec<OwnedFd>, settled: Settled) -> Result<(), (u8, String)> {
        if self.stopped() {
            return Err((1, "stopped".into()));
        }
        let Some((core, opts)) = self.adapter.take() else {
            return Err((1, "already serving".into()));
        };
        let first = fds.first().ok_or((1, "no FUSE descriptor".to_string()))?;
        let dev = Arc::new(
            rustix::io::fcntl_dupfd_cloexec(first, 0).map_err(|e| super::io_err(e.into()))?,
        );
        let resend = Arc::clone(&dev);
        let mut fs = LocaFs::new(core, opts, dev);
        fs.apply_init(settled.granted);
        fs.count_requests_in(Arc::clone(&self.state));
        let (store, saved, backings) = crate::fs::handle_store::HandleStore::attach(&self.state)
            .ok_or((1, "the shared handle table is in use".to_string()))?;
        let (handles, closed) = fs.restore(Arc::new(store), saved, backings);
        if handles > 0 || closed > 0 {
            info!("took over {handles} open handles; closed {closed} passthrough backings no handle uses");
        }
        self.session = Some(spawn_session(fs, fds, settled)?);
        if settled.minor >= crate::mount::connection::RESEND_MINOR {
            if let Err(e) = crate::mount::connection::notify_resend(resend.as_fd()) {
                warn!("the kernel did not take FUSE_NOTIFY_RESEND: {e}");
            }
        }
        raise_kernel_readahead(&self.mountpoint, self.kernel_readahead);
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

    /// The mount's namespace (what the kernel holds of it: lookup counts).
    pub fn namespace(&self) -> &Arc<Namespace> {
        &self.saver.ns
    }

    pub fn readahead(&self) -> &Arc<ReadAhead> {
        &self.readahead
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Whether [`Server::stop`] ran.
    pub(crate) fn stopped(&self) -> bool {
        self.rt.is_none()
    }

    /// Runs `f` on the server's runtime (None once stopped).
    pub(crate) fn block_on<T>(&self, f: impl std::future::Future<Output = T>) -> Option<T> {
        self.rt.as_ref().map(|rt| rt.block_on(f))
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

/// The Prometheus exporter of `--metrics` on `addr`, over `stats`.
fn start_metrics(
    cfg: &MountConfig,
    addr: std::net::SocketAddr,
    stats: &Arc<Stats>,
    rt: &tokio::runtime::Handle,
) -> Result<(), (u8, String)> {
    let (st, source, mountpoint) = (
        Arc::clone(stats),
        cfg.source.display().to_string(),
        cfg.mountpoint.display().to_string(),
    );
    crate::obs::metrics::prometheus::start(
        addr,
        rt,
        crate::obs::metrics::prometheus::Labels {
            source: source.clone(),
            mountpoint: mountpoint.clone(),
        },
        Box::new(move || st.full_snapshot(&source, &mountpoint)),
    )
    .map_err(|e| (2, e))
}

/// The FUSE session of `fs` over `fds`, whose INIT settled `settled`
/// (no handshake: the holder answered INIT), one thread per descriptor.
fn spawn_session(
    fs: LocaFs,
    fds: Vec<OwnedFd>,
    settled: Settled,
) -> Result<fuser::BackgroundSession, (u8, String)> {
    let mut fuse_cfg = fuser::Config::default();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        fuse_cfg.acl = fuser::SessionACL::All;
    }
    fuser::Session::from_fds_initialized(
        fs,
        fds,
        fuse_cfg.acl,
        fuser::Version(7, settled.minor),
        fuse_cfg,
    )
    .and_then(|s| s.spawn())
    .map_err(|e| (1, format!("FUSE session: {e}")))
}

/// Larger kernel read-ahead on the mount (`--kernel-readahead`; 0 leaves
/// the kernel's): bigger reads reach the daemon (its 128 KiB default caps
/// a sequential read served by the daemon at ~0.3 GB/s here, against
/// 1.4 GB/s with 4 MiB).
fn raise_kernel_readahead(mountpoint: &Path, bytes: u64) {
    if bytes == 0 {
        return;
    }
    match crate::sys::set_bdi_readahead(mountpoint, bytes) {
        Ok(()) => debug!("kernel read-ahead on the mount: {}", format_size(bytes)),
        Err(e) => {
            info!("kernel read-ahead left at the kernel's default (setting it needs root): {e}")
        }
    }
}
