//! The namespace manifest of a mount, beside its cache: where a server's
//! namespace comes from when it is assembled (the one an earlier server
//! left in the shared state, else the manifest a previous mount saved,
//! else none: the source's root), and the saver that writes the manifest
//! back while the mount is served and when it stops. The format is
//! `meta::manifest`'s.
//!
//! It never writes outside the data set's directory, and never beyond the
//! cache's size bound: the manifest's bytes are booked in the cache
//! (`reserve_aux`) before they are written, and a manifest that no longer
//! fits is removed.

use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, info, warn};

use crate::cache::disk::DiskCache;
use crate::meta::namespace::Namespace;
use crate::mount::config::MountConfig;
use crate::source::Source;
use crate::sys::private_dir::PrivateDir;
use crate::sys::shm::SharedState;

/// The namespace manifest's name in the data set's directory.
pub(crate) const MANIFEST: &str = "manifest";

/// How often the namespace manifest is saved while mounted (if it changed).
pub(crate) const MANIFEST_EVERY: Duration = Duration::from_secs(300);

/// The namespace a server starts from.
pub(crate) enum Loaded {
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
pub(crate) fn load_namespace(
    cfg: &MountConfig,
    source: &Arc<dyn Source>,
    state: &Arc<SharedState>,
) -> Loaded {
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
pub(crate) fn restore_namespace(
    loaded: Loaded,
    dir: &PrivateDir,
    cache: &DiskCache,
) -> Option<Namespace> {
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

/// Saves the namespace manifest beside the cache, within its size bound.
pub(crate) struct ManifestSaver {
    pub(crate) ns: Arc<Namespace>,
    disk: Arc<DiskCache>,
    /// The data set's directory.
    dir: PrivateDir,
    source: Vec<u8>,
    /// The namespace's change counter at the last save.
    saved_at: parking_lot::Mutex<u64>,
}

impl ManifestSaver {
    /// A saver of `ns` into the data set's directory of `cfg`, booked in
    /// `disk`; nothing saved yet.
    pub(crate) fn new(cfg: &MountConfig, ns: Arc<Namespace>, disk: Arc<DiskCache>) -> Self {
        ManifestSaver {
            ns,
            disk,
            dir: cfg.dataset.clone(),
            source: cfg.source.as_os_str().as_encoded_bytes().to_vec(),
            saved_at: parking_lot::Mutex::new(u64::MAX),
        }
    }

    /// Saves every [`MANIFEST_EVERY`] on `rt`'s blocking pool, until the
    /// runtime stops.
    pub(crate) fn save_periodically(self: &Arc<Self>, rt: &tokio::runtime::Handle) {
        let saver = Arc::clone(self);
        rt.spawn(async move {
            loop {
                tokio::time::sleep(MANIFEST_EVERY).await;
                let s = Arc::clone(&saver);
                let _ = tokio::task::spawn_blocking(move || s.save()).await;
            }
        });
    }

    /// Saves the manifest if the namespace changed since the last save.
    pub(crate) fn save(&self) {
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
