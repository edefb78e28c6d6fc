//! The namespace: the source tree as inodes. It maps inode numbers to paths
//! and attributes, lists directories, and revalidates what it knows against
//! the source once it is older than the revalidation interval (never with
//! `--immutable`), so that new, changed and deleted files show up in time.
//!
//! Over a source whose listings carry every attribute (an object store),
//! a stale entry is revalidated by listing its directory again, one
//! request for up to 1,000 entries instead of one each, and every listing
//! of a directory is shared by all that wait on it (single flight).
//!
//! It also holds each entry's POSIX ACLs (a directory source's; the kernel
//! checks users who do not own an entry against them): read from the
//! source when the kernel first asks after the attributes were read, held
//! until the attributes are read again, kept in the shared state like the
//! records (a server that dies takes none with it), and costing memory
//! only for the entries that have one (two flag bits otherwise).
//!
//! Inode numbers are stable for the life of the mount (a renamed or replaced
//! entry gets a new one) and never reused. This module never reads file data,
//! adds no entry of its own to the tree (no control files), and does no source
//! I/O while holding its lock.
//!
//! Millions of entries are the normal case, so each inode is one compact
//! record of 48 bytes in a dense table indexed by inode number (u32 ids):
//! its name lives in one byte arena, the attributes many entries share
//! (mode, uid, gid, nlink, rdev) are interned, and a directory's children
//! are one sorted run of u32 ids (a lookup is a binary search, a readdir
//! resume an index), plus a small side run for names found by lookups
//! since the last listing (merged at about the square root of the run, so
//! that lookups in a flat directory never listed are not quadratic). The kernel's lookup counts are kept (FORGET): an
//! entry that left the tree and that the kernel has forgotten loses its
//! name too (the arena is compacted when half of it is dead).
//! docs/cache.md ("Per-file memory: the namespace") has the layout; the
//! table and its operations are `table.rs`, this file is what answers from
//! it and what asks the source.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use std::collections::HashMap;

use futures::future::{BoxFuture, FutureExt, Shared};
use parking_lot::{Mutex, RwLock};
use tracing::warn;

use crate::obs::stats::Stats;
use crate::source::guard::{is_timeout, timed_out};
use crate::source::{Acls, DirName, EntryKind, Source, SourceAttr, SourceVersion};
use crate::sys::shm::SharedState;

pub use super::table::ROOT;
use super::table::{
    enoent, kind_code, kind_of, tables, Dir, Inner, Node, Slot, ACL_FRESH, ACL_KNOWN, AHEAD,
    OPENED, TICK_MS, UNKNOWN,
};

/// A request the namespace answers alone, or the question it must put to
/// the source first. The FUSE adapter answers `Done` on its own thread and
/// puts `Ask` to the source without holding one.
pub enum Step<T> {
    Done(io::Result<T>),
    Ask(Ask),
}

/// What to ask the source (the path), and when the question was asked (the
/// answer counts as checked then).
#[derive(Debug)]
pub struct Ask {
    pub path: PathBuf,
    at_ms: u64,
    /// Asked by listing the parent directory instead of a stat (a source
    /// whose listing carries every attribute: an object store, where it
    /// is one LIST request for up to 1,000 entries instead of one HEAD
    /// each). Only [`Namespace::stat_for`] does so; a thread-holding
    /// caller stats.
    relist: Option<Relist>,
}

/// The directory to list for an [`Ask`].
#[derive(Clone, Debug)]
struct Relist {
    dir: u64,
    path: PathBuf,
}

impl Ask {
    /// Whether the question is a listing of the parent directory (asked
    /// with [`Namespace::stat_for`], from a task).
    pub fn by_listing(&self) -> bool {
        self.relist.is_some()
    }
}

/// Directories above this many entries are not listed again to revalidate
/// one entry (a listing of a flat directory of a million objects is a
/// thousand LIST pages, one after the other): their stale entries are
/// stat-ed (one HEAD each).
pub const RELIST_MAX: usize = 10_000;

/// A listing as every caller waiting on it gets it.
type Listed = Result<Arc<Vec<DirName>>, Arc<io::Error>>;

/// One listing of a directory, shared by every caller that waits on it
/// meanwhile (a `readdir`, read-ahead's walk, the revalidation of entries:
/// single flight): the first to get it applies it to the tree and takes it
/// out of the map of flights. Its callers are tasks that run to the end
/// (never dropped half-way), so a flight is never left unapplied.
struct Flight {
    listing: Shared<BoxFuture<'static, Listed>>,
    at_ms: u64,
    path: PathBuf,
    applied: OnceLock<Result<(), Arc<io::Error>>>,
}

/// A copy of a shared error, with its errno (a timeout stays one).
fn copy_err(e: &io::Error) -> io::Error {
    match e.raw_os_error() {
        Some(n) => io::Error::from_raw_os_error(n),
        None => io::Error::new(e.kind(), e.to_string()),
    }
}

/// One directory entry as `readdir` hands it out.
pub struct DirEntry<'a> {
    pub ino: u64,
    pub name: &'a OsStr,
    /// The attributes; only the kind and source inode if not `known`.
    pub attr: &'a SourceAttr,
    /// Whether `attr` was read from the source (else the entry was only
    /// listed: stat it before handing out its attributes).
    pub known: bool,
    /// Whether `attr` was read from the source within `--revalidate`.
    pub fresh: bool,
}

/// The inode table of one mount.
pub struct Namespace {
    source: Arc<dyn Source>,
    /// None: trust the source forever (`--immutable`).
    revalidate: Option<Duration>,
    started: Instant,
    inner: RwLock<Inner>,
    /// The last known answers that live outside the tree: symlink targets
    /// read so far, and the source's `statvfs`, for when it does not answer.
    last_known: Mutex<LastKnown>,
    /// Where answers from the last known tree are counted.
    stats: Option<Arc<Stats>>,
    /// Whether the source's listings carry every attribute (stale entries
    /// are then revalidated by listing their directory).
    listing_attrs: bool,
    /// Listings in flight, by directory inode (each shared by every
    /// caller waiting on it).
    relists: Mutex<HashMap<u64, Arc<Flight>>>,
    /// Whether the source's entries can carry POSIX ACLs (else every
    /// entry has none, and the source is never asked).
    acls_on: bool,
}

#[derive(Default)]
struct LastKnown {
    links: HashMap<u64, PathBuf>,
    statvfs: Option<libc::statvfs>,
}

/// At most one "answered from the last known tree" line a minute: an
/// outage must not flood the log (every such answer is counted in stats).
static STALE: crate::obs::logging::RateLimit = crate::obs::logging::RateLimit::new(60_000);

impl Namespace {
    /// `known_sink` receives the total size of the files seen so far, as it
    /// changes (the cache policy measures "passes over the data set" by it).
    /// The namespace lives in a shared state of its own: nothing of it
    /// outlives this process (see [`Namespace::new_in`]).
    pub fn new(
        source: Arc<dyn Source>,
        revalidate: Option<Duration>,
        known_sink: Arc<AtomicU64>,
    ) -> io::Result<Self> {
        Self::new_in(&SharedState::create()?, source, revalidate, known_sink)
    }

    /// A namespace of the source's root alone, built in `state` (whatever
    /// namespace it held is dropped), where a server started after this
    /// one dies finds it ([`Namespace::attach`]).
    pub fn new_in(
        state: &Arc<SharedState>,
        source: Arc<dyn Source>,
        revalidate: Option<Duration>,
        known_sink: Arc<AtomicU64>,
    ) -> io::Result<Self> {
        let root = source.stat(Path::new(""))?;
        if root.kind != EntryKind::Dir {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the source is not a directory",
            ));
        }
        let mut inner = Inner::new(state, known_sink)?;
        inner.push(ROOT, b"", root, 0)?;
        Ok(Self::ready(source, revalidate, Instant::now(), inner))
    }

    /// The namespace `inner` (whole) from now on, with its clock started at
    /// `started`: published in the shared state as the one to attach to.
    fn ready(
        source: Arc<dyn Source>,
        revalidate: Option<Duration>,
        started: Instant,
        inner: Inner,
    ) -> Self {
        let h = inner.state.header();
        let age = started.elapsed().as_nanos() as u64;
        h.started_mono_ns.store(
            crate::sys::shm::monotonic_ns().saturating_sub(age),
            Ordering::Release,
        );
        h.ns_ready.store(1, Ordering::Release);
        Namespace {
            listing_attrs: source.listing_carries_attrs(),
            acls_on: source.has_acls(),
            source,
            revalidate,
            started,
            inner: RwLock::new(inner),
            last_known: Mutex::default(),
            stats: None,
            relists: Mutex::default(),
        }
    }

    /// The namespace an earlier server built in `state` (None if none was
    /// finished there), as it left it: every inode number, name,
    /// attribute, listing and kernel lookup count. Only the indexes
    /// derived from the records are rebuilt ([`Inner::rebuild`], one pass
    /// over the records); a change the server was in the middle of is
    /// undone to what can be trusted (docs/architecture.md).
    pub fn attach(
        state: &Arc<SharedState>,
        source: Arc<dyn Source>,
        revalidate: Option<Duration>,
        known_sink: Arc<AtomicU64>,
    ) -> io::Result<Option<Self>> {
        let h = state.header();
        if h.ns_ready.load(Ordering::Acquire) == 0 {
            return Ok(None);
        }
        let mut inner = tables(state, known_sink)?;
        if inner.nodes.first().is_none_or(|n| !n.is_dir()) {
            return Ok(None);
        }
        inner.rebuild();
        let since = crate::sys::shm::monotonic_ns()
            .saturating_sub(h.started_mono_ns.load(Ordering::Acquire));
        let started = Instant::now()
            .checked_sub(Duration::from_nanos(since))
            .unwrap_or_else(Instant::now);
        Ok(Some(Namespace {
            listing_attrs: source.listing_carries_attrs(),
            acls_on: source.has_acls(),
            source,
            revalidate,
            started,
            inner: RwLock::new(inner),
            last_known: Mutex::default(),
            stats: None,
            relists: Mutex::default(),
        }))
    }

    /// Rebuilds the namespace from a manifest saved `age` ago, if it is
    /// usable: same source, and (unless immutable) younger than the
    /// revalidation interval would make worthless. Entries count as checked
    /// when the manifest was saved. The tree is exactly the manifest's (the
    /// tree the saving mount last saw): a manifest that does not describe
    /// one tree (a record under a non-directory, two entries of one name in
    /// a directory, a name that is not one path component) is not used.
    pub fn restore(
        source: Arc<dyn Source>,
        revalidate: Option<Duration>,
        known_sink: Arc<AtomicU64>,
        manifest: crate::meta::manifest::Manifest,
        age: Duration,
    ) -> Option<Self> {
        let state = SharedState::create().ok()?;
        Self::restore_in(&state, source, revalidate, known_sink, manifest, age)
    }

    /// [`Namespace::restore`] built in `state` (see
    /// [`Namespace::new_in`]).
    pub fn restore_in(
        state: &Arc<SharedState>,
        source: Arc<dyn Source>,
        revalidate: Option<Duration>,
        known_sink: Arc<AtomicU64>,
        manifest: crate::meta::manifest::Manifest,
        age: Duration,
    ) -> Option<Self> {
        let started = Instant::now().checked_sub(age)?;
        if revalidate.is_some_and(|r| age >= r) {
            return None;
        }
        let mut inner = Inner::new(state, known_sink).ok()?;
        let mut records = 0;
        for r in manifest.records() {
            records += 1;
            let ino = inner.push(r.parent, r.name, r.attr, 0).ok()?;
            if ino != ROOT {
                let name = r.name;
                if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
                    return None;
                }
                inner.dir_mut(r.parent)?.children.push(ino as u32);
            }
            if r.listed {
                let d = inner.node(ino)?.dir();
                inner.set_dir_meta(d, None, Some(Some(0)));
            }
            if !r.known {
                inner.mark_unknown(ino);
            }
        }
        if records != manifest.len() || inner.nodes.first()?.kind != kind_code(EntryKind::Dir) {
            return None;
        }
        // Children sorted by name, as lookups expect; one entry per name.
        let mut dirs = std::mem::take(&mut inner.dirs);
        for dir in &mut dirs {
            let name = |x: &u32| inner.name_of(*x as u64);
            let mut children = std::mem::take(&mut dir.children);
            children.sort_unstable_by(|a, b| name(a).cmp(name(b)));
            if children.windows(2).any(|w| name(&w[0]) == name(&w[1])) {
                return None;
            }
            dir.set_children(children);
        }
        inner.dirs = dirs;
        inner.changes = 0;
        Some(Self::ready(source, revalidate, started, inner))
    }

    /// Reports the total size of the files seen to `sink` from now on
    /// (the cache's, once it is open: the namespace may be restored
    /// before).
    pub fn set_known_sink(&self, sink: Arc<AtomicU64>) {
        let mut inner = self.inner.write();
        sink.store(inner.known_bytes, Ordering::Relaxed);
        inner.known_sink = sink;
    }

    /// Counts answers given from the last known tree in `stats`.
    pub fn with_stats(mut self, stats: Arc<Stats>) -> Self {
        self.stats = Some(stats);
        self
    }

    /// An answer from the last known tree, because the source did not
    /// answer `op` in time: counted, and logged now and then.
    fn stale_answer(&self, op: &str, path: &Path) {
        if let Some(s) = &self.stats {
            s.stale_answers.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(more) = STALE.allow() {
            warn!(
                "source did not answer {op} of {:?} in time: answered from the last known tree \
                 ({more} more such answers not logged)",
                path
            );
        }
    }

    /// A manifest of the tree as the mount sees it now, for the next mount:
    /// every entry reachable from the root, and nothing else. Inodes that
    /// left the tree (deleted, or replaced by another object, with the
    /// subtree of a directory) stay in the table, answerable, for the
    /// kernel may still hold them, but are not saved; the saved entries are
    /// numbered afresh (the next mount's inode numbers).
    pub fn save(&self, source_label: &[u8], saved_unix_s: u64) -> Vec<u8> {
        let len = self.manifest_len(source_label);
        let out = Vec::with_capacity(len as usize);
        match self.save_to(out, source_label, saved_unix_s) {
            Ok((bytes, _)) => bytes,
            Err(_) => Vec::new(), // not for a Vec
        }
    }

    /// [`Namespace::save`] streamed to `out` as the tree is walked (no copy
    /// of the tree in memory); returns `out` and the bytes written. Holds
    /// the read lock while it writes (lookups and listings that change the
    /// tree wait; answers do not): call it off the FUSE threads.
    pub fn save_to<W: std::io::Write>(
        &self,
        out: W,
        source_label: &[u8],
        saved_unix_s: u64,
    ) -> io::Result<(W, u64)> {
        let inner = self.inner.read();
        let mut count = 0;
        inner.for_each_in_tree(|_, _| count += 1);
        let mut e =
            crate::meta::manifest::StreamEncoder::new(out, source_label, saved_unix_s, count);
        let mut r = Ok(());
        inner.for_each_in_tree(|parent, n| {
            if r.is_ok() {
                let listed = inner.dir(n).is_some_and(|d| d.listed_ms.is_some());
                r = e.push_entry(parent, inner.name(n), &inner.attr(n), listed, n.known());
            }
        });
        r?;
        e.finish()
    }

    /// The size of the manifest [`Namespace::save`] would write now.
    pub fn manifest_len(&self, source_label: &[u8]) -> u64 {
        let inner = self.inner.read();
        let (mut count, mut names) = (0, 0);
        inner.for_each_in_tree(|_, n| {
            count += 1;
            names += n.name_len as u64;
        });
        crate::meta::manifest::manifest_len(source_label.len(), count, names)
    }

    /// The kernel was handed `ino` (a lookup's or a READDIRPLUS entry's
    /// reply): one more lookup to take back with [`Namespace::forget`].
    pub fn looked_up(&self, ino: u64) {
        if let Some(n) = self.inner.read().node(ino) {
            bump(&n.lookups);
        }
    }

    /// Whether the kernel may keep its page cache of `ino` at an open of
    /// version `v`: it opened the file at this version before and has held
    /// the inode since ([`OPENED`]).
    pub fn opened_at(&self, ino: u64, v: &SourceVersion) -> bool {
        let inner = self.inner.read();
        inner
            .node(ino)
            .is_some_and(|n| n.flags & OPENED != 0 && n.is_version(v))
    }

    /// An open of `ino` at version `v` succeeded: the pages the kernel
    /// caches from now on are of `v`, if that is still the version in the
    /// record (an open of a version already replaced marks nothing).
    pub fn note_opened(&self, ino: u64, v: &SourceVersion) {
        if self.opened_at(ino, v) {
            return;
        }
        let mut inner = self.inner.write();
        if let Some(n) = inner.node_mut(ino) {
            if n.is_version(v) {
                n.flags |= OPENED;
            }
        }
    }

    /// Several [`Namespace::looked_up`] under one lock.
    pub fn looked_up_all(&self, inos: &[u64]) {
        if inos.is_empty() {
            return;
        }
        let inner = self.inner.read();
        for ino in inos {
            if let Some(n) = inner.node(*ino) {
                bump(&n.lookups);
            }
        }
    }

    /// The kernel forgot `n` lookups of each inode (FORGET, BATCH_FORGET).
    /// Returns the inodes the kernel no longer knows at all (their lookup
    /// count is 0): what hangs off them elsewhere can go. An entry that
    /// also left the tree is dropped but for its inode number.
    pub fn forget(&self, nodes: &[(u64, u64)]) -> Vec<u64> {
        let mut inner = self.inner.write();
        let mut dropped = Vec::new();
        for &(ino, n) in nodes {
            inner.forget(ino, n);
            if inner
                .node(ino)
                .is_none_or(|x| x.lookups.load(Ordering::Relaxed) == 0)
            {
                dropped.push(ino);
            }
        }
        dropped
    }

    /// Drops what entries out of the tree still hold, unless the kernel
    /// holds them (one pass over the table under the write lock, only if
    /// an entry left the tree since the last time): called before a save.
    pub fn sweep(&self) {
        if self.inner.read().unlinked == 0 {
            return;
        }
        self.inner.write().sweep();
    }

    /// The kernel's lookup count of `ino` (0 for an unknown inode).
    pub fn lookups(&self, ino: u64) -> u32 {
        self.inner
            .read()
            .node(ino)
            .map_or(0, |n| n.lookups.load(Ordering::Relaxed))
    }

    /// Bytes of names held, and of them the bytes of dropped entries not
    /// yet compacted away (for tests and memory reporting).
    pub fn name_bytes(&self) -> (usize, usize) {
        let inner = self.inner.read();
        (inner.names.len(), inner.dead_names)
    }

    /// A counter that moves whenever the namespace changes.
    pub fn changes(&self) -> u64 {
        self.inner.read().changes
    }

    fn ask<T>(&self, path: PathBuf) -> Step<T> {
        Step::Ask(Ask {
            path,
            at_ms: self.now_ms(),
            relist: None,
        })
    }

    /// The question for entry `path` of directory `parent`: a listing of
    /// the directory where the source's listings carry every attribute and
    /// the directory was listed before (and is not too big to list again),
    /// or is being listed now (a listing of it is in flight: read-ahead's
    /// walk of the tree, a `readdir`), else a stat.
    fn ask_entry<T>(&self, inner: &Inner, parent: u64, path: PathBuf) -> Step<T> {
        let dir = inner.dir_of(parent);
        let listable = |d: &Dir| d.listed_ms.is_some() && d.len() <= RELIST_MAX;
        if !self.listing_attrs
            || !(dir.is_some_and(listable) || self.relists.lock().contains_key(&parent))
        {
            return self.ask(path);
        }
        let dir_path = path.parent().unwrap_or(Path::new("")).to_owned();
        Step::Ask(Ask {
            path,
            at_ms: self.now_ms(),
            relist: Some(Relist {
                dir: parent,
                path: dir_path,
            }),
        })
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn stale(&self, checked_ms: u64) -> bool {
        self.stale_at(checked_ms, self.now_ms())
    }

    /// Whether what was checked at `checked_ms` is stale at `now_ms`. Loops
    /// over a directory's entries read the clock once, before the loop: a
    /// clock read per entry was 8 % of the daemon's CPU in a walk of 500 k
    /// entries (perf, 2026-12-04).
    fn stale_at(&self, checked_ms: u64, now_ms: u64) -> bool {
        match self.revalidate {
            None => false,
            Some(d) => now_ms.saturating_sub(checked_ms) >= d.as_millis() as u64,
        }
    }

    /// Whether a node's attributes are stale.
    fn stale_node(&self, n: &Node) -> bool {
        self.stale(n.checked as u64 * TICK_MS)
    }

    /// Whether a node's attributes are stale at `now_ms`.
    fn stale_node_at(&self, n: &Node, now_ms: u64) -> bool {
        self.stale_at(n.checked as u64 * TICK_MS, now_ms)
    }

    /// Total size of the regular files seen so far.
    pub fn known_bytes(&self) -> u64 {
        self.inner.read().known_bytes
    }

    /// The number of inodes known (for memory reporting).
    pub fn len(&self) -> usize {
        self.inner.read().nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    /// The path of an inode relative to the source root.
    pub fn path(&self, ino: u64) -> io::Result<PathBuf> {
        self.inner
            .read()
            .path(ino)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))
    }

    /// Finds `name` in directory `parent`.
    pub fn lookup(&self, parent: u64, name: &OsStr) -> io::Result<(u64, SourceAttr)> {
        match self.lookup_local(parent, name) {
            Step::Done(r) => r,
            Step::Ask(ask) => {
                let r = self.source.stat(&ask.path);
                self.lookup_answer(parent, name, ask, r)
            }
        }
    }

    /// [`Namespace::lookup`] without holding a thread while the source
    /// answers.
    pub async fn lookup_async(&self, parent: u64, name: &OsStr) -> io::Result<(u64, SourceAttr)> {
        match self.lookup_local(parent, name) {
            Step::Done(r) => r,
            Step::Ask(ask) => {
                let r = self.stat_for(&ask).await;
                self.lookup_answer(parent, name, ask, r)
            }
        }
    }

    /// The source's `stat` for `ask`, without holding a thread (or the
    /// entry's attributes from a listing of its directory, see [`Ask`]).
    pub async fn stat_for(&self, ask: &Ask) -> io::Result<SourceAttr> {
        match &ask.relist {
            Some(by) => self.relisted(by, &ask.path).await,
            None => Arc::clone(&self.source).stat_async(ask.path.clone()).await,
        }
    }

    /// Lists directory `by` again (one listing for every caller waiting on
    /// it) and answers entry `path` of it from the tree as listed: its
    /// fresh attributes, or NotFound if the listing has it no more. The
    /// listing's error (a timeout: the caller answers from the last known
    /// tree) if it failed.
    async fn relisted(&self, by: &Relist, path: &Path) -> io::Result<SourceAttr> {
        let (listing, applied) = self.listing_shared(by.dir, &by.path).await;
        if let Err(e) = &listing {
            return Err(copy_err(e));
        }
        if let Err(e) = applied {
            return Err(copy_err(&e));
        }
        let name = path.file_name().unwrap_or_default().as_bytes();
        let inner = self.inner.read();
        inner
            .dir_of(by.dir)
            .and_then(|d| inner.child(d, name))
            .and_then(|c| inner.known_attr_of(c))
            .ok_or_else(enoent)
    }

    /// Lists directory `dir` (at `path`) from the source, one listing for
    /// every caller that waits on it meanwhile (single flight), applied to
    /// the tree once ([`Namespace::listing_answer`]): the listing as the
    /// source gave it, and what applying it gave.
    async fn listing_shared(&self, dir: u64, path: &Path) -> (Listed, Result<(), Arc<io::Error>>) {
        let flight = Arc::clone(self.relists.lock().entry(dir).or_insert_with(|| {
            let (source, at) = (Arc::clone(&self.source), path.to_owned());
            let listing = async move {
                source
                    .list_names_async(at)
                    .await
                    .map(Arc::new)
                    .map_err(Arc::new)
            };
            Arc::new(Flight {
                listing: listing.boxed().shared(),
                at_ms: self.now_ms(),
                path: path.to_owned(),
                applied: OnceLock::new(),
            })
        }));
        let listing = flight.listing.clone().await;
        let applied = flight.applied.get_or_init(|| {
            {
                let mut m = self.relists.lock();
                if m.get(&dir).is_some_and(|f| Arc::ptr_eq(f, &flight)) {
                    m.remove(&dir);
                }
            }
            let ask = Ask {
                path: flight.path.clone(),
                at_ms: flight.at_ms,
                relist: None,
            };
            let r = match &listing {
                Ok(v) => Ok(v.as_ref().clone()),
                Err(e) => Err(copy_err(e)),
            };
            self.listing_answer(dir, ask, r).map_err(Arc::new)
        });
        (listing, applied.clone())
    }

    /// Asks the source for `ask` and hands `answer` the source's
    /// attributes (or its error) on whatever thread has them, holding none:
    /// with the mount's source guard, the worker that did the `stat`, or
    /// its deadline thread.
    pub fn stat_then(
        &self,
        ask: Ask,
        answer: impl FnOnce(Ask, io::Result<SourceAttr>) + Send + 'static,
    ) {
        let path = ask.path.clone();
        Arc::clone(&self.source).stat_then(path, Box::new(move |r| answer(ask, r)));
    }

    /// A lookup's answer if the namespace knows it fresh, else what to ask
    /// the source.
    pub fn lookup_local(&self, parent: u64, name: &OsStr) -> Step<(u64, SourceAttr)> {
        let name = name.as_bytes();
        let inner = self.inner.read();
        let Some(p) = inner.node(parent) else {
            return Step::Done(Err(enoent()));
        };
        let Some(dir) = inner.dir(p) else {
            return Step::Done(Err(io::Error::from_raw_os_error(libc::ENOTDIR)));
        };
        let listed_fresh = dir.listed_ms.is_some_and(|t| !self.stale(t));
        match inner.find_child(dir, name) {
            Ok(slot) => {
                let ino = dir.at(slot) as u64;
                if let Some(n) = inner.node(ino) {
                    if n.known() && !self.stale_node(n) {
                        return Step::Done(Ok((ino, inner.attr(n))));
                    }
                }
            }
            // A fresh full listing knows every name: no need to ask.
            Err(_) if listed_fresh => return Step::Done(Err(enoent())),
            Err(_) => {}
        }
        let Some(path) = inner.path(parent) else {
            return Step::Done(Err(enoent()));
        };
        if self.source.stalled() {
            // No point asking: the last known answer now, or none (an
            // entry only listed has no attributes to answer with).
            let known = inner
                .child(dir, name)
                .and_then(|ino| Some((ino, inner.known_attr_of(ino)?)));
            drop(inner);
            return Step::Done(match known {
                Some(k) => {
                    self.stale_answer("lookup", &path.join(OsStr::from_bytes(name)));
                    Ok(k)
                }
                None => Err(timed_out()),
            });
        }
        self.ask_entry(&inner, parent, path.join(OsStr::from_bytes(name)))
    }

    /// Applies the source's answer `r` to [`Namespace::lookup_local`]'s
    /// question.
    pub fn lookup_answer(
        &self,
        parent: u64,
        name: &OsStr,
        ask: Ask,
        r: io::Result<SourceAttr>,
    ) -> io::Result<(u64, SourceAttr)> {
        let name = name.as_bytes();
        match r {
            Ok(attr) => {
                let mut inner = self.inner.write();
                let ino = inner.upsert_child(parent, name, attr, ask.at_ms)?;
                Ok((ino, attr))
            }
            Err(e) if is_timeout(&e) => {
                // A known entry is answered as last seen; an unknown name
                // cannot be.
                let inner = self.inner.read();
                let known = inner
                    .dir_of(parent)
                    .and_then(|d| inner.child(d, name))
                    .and_then(|ino| Some((ino, inner.known_attr_of(ino)?)));
                drop(inner);
                match known {
                    Some(k) => {
                        self.stale_answer("lookup", &ask.path);
                        Ok(k)
                    }
                    None => Err(e),
                }
            }
            Err(e) => {
                if e.kind() == io::ErrorKind::NotFound {
                    self.inner.write().remove_child(parent, name);
                }
                Err(e)
            }
        }
    }

    /// Attributes of an inode, revalidated against the source when stale.
    pub fn getattr(&self, ino: u64) -> io::Result<SourceAttr> {
        match self.getattr_local(ino) {
            Step::Done(r) => r,
            Step::Ask(ask) => {
                let r = self.source.stat(&ask.path);
                self.getattr_answer(ino, ask, r)
            }
        }
    }

    /// [`Namespace::getattr`] without holding a thread while the source
    /// answers.
    pub async fn getattr_async(&self, ino: u64) -> io::Result<SourceAttr> {
        match self.getattr_local(ino) {
            Step::Done(r) => r,
            Step::Ask(ask) => {
                let r = self.stat_for(&ask).await;
                self.getattr_answer(ino, ask, r)
            }
        }
    }

    /// An inode's attributes if they are fresh, else what to ask the source.
    pub fn getattr_local(&self, ino: u64) -> Step<SourceAttr> {
        let inner = self.inner.read();
        let Some(n) = inner.node(ino) else {
            return Step::Done(Err(enoent()));
        };
        let attr = inner.attr(n);
        let known = n.known();
        if known && !self.stale_node(n) {
            return Step::Done(Ok(attr));
        }
        let Some(path) = inner.path(ino) else {
            return Step::Done(Err(enoent()));
        };
        if self.source.stalled() {
            drop(inner);
            // No point asking: the last known attributes now (none for an
            // entry only listed).
            if !known {
                return Step::Done(Err(timed_out()));
            }
            self.stale_answer("stat", &path);
            return Step::Done(Ok(attr));
        }
        if ino == ROOT {
            return self.ask(path);
        }
        self.ask_entry(&inner, n.parent as u64, path)
    }

    /// Applies the source's answer `r` to [`Namespace::getattr_local`]'s
    /// question.
    pub fn getattr_answer(
        &self,
        ino: u64,
        ask: Ask,
        r: io::Result<SourceAttr>,
    ) -> io::Result<SourceAttr> {
        let attr = match r {
            Ok(a) => a,
            Err(e) if is_timeout(&e) => {
                let known = self.inner.read().known_attr_of(ino);
                let Some(known) = known else { return Err(e) };
                self.stale_answer("stat", &ask.path);
                return Ok(known);
            }
            Err(e) => {
                if e.kind() == io::ErrorKind::NotFound {
                    // Gone: not in the tree any more (nor in the next
                    // manifest).
                    self.inner.write().unlink(ino);
                }
                return Err(e);
            }
        };
        let mut inner = self.inner.write();
        let old = inner.attr_of(ino).ok_or_else(enoent)?;
        // (an entry only listed has getdents' inode number, a hint: its
        // first stat says which object it is)
        let listed = inner.node(ino).is_some_and(|n| !n.known());
        if (old.kind == EntryKind::Dir) != (attr.kind == EntryKind::Dir)
            || (old.ino != attr.ino && !listed)
        {
            // Another object now lives at this path: this inode is gone
            // (the next lookup or listing finds the new one).
            inner.unlink(ino);
            return Err(enoent());
        }
        inner.account(Some(&old), Some(&attr));
        inner.set_attr(ino, &attr, ask.at_ms)?;
        Ok(attr)
    }

    /// Lists directory `ino` from the source if it was never listed or its
    /// listing is stale. Called at the start of a directory read.
    pub fn refresh_dir(&self, ino: u64) -> io::Result<()> {
        match self.listing_local(ino) {
            Step::Done(r) => r,
            Step::Ask(ask) => {
                let r = self.source.list_names(&ask.path, &|| {});
                self.listing_answer(ino, ask, r)
            }
        }
    }

    /// [`Namespace::refresh_dir`] without holding a thread while the source
    /// answers.
    pub async fn refresh_dir_async(&self, ino: u64) -> io::Result<()> {
        match self.listing_local(ino) {
            Step::Done(r) => r,
            // (shared with every lookup, open and listing of the same
            // directory meanwhile)
            Step::Ask(ask) => self
                .listing_shared(ino, &ask.path)
                .await
                .1
                .map_err(|e| copy_err(&e)),
        }
    }

    /// Done if directory `ino`'s listing is fresh, else what to ask the
    /// source.
    pub fn listing_local(&self, ino: u64) -> Step<()> {
        let inner = self.inner.read();
        let Some(n) = inner.node(ino) else {
            return Step::Done(Err(enoent()));
        };
        let Some(dir) = inner.dir(n) else {
            return Step::Done(Err(io::Error::from_raw_os_error(libc::ENOTDIR)));
        };
        if dir.listed_ms.is_some_and(|t| !self.stale(t)) {
            return Step::Done(Ok(()));
        }
        let listed = dir.listed_ms.is_some();
        let Some(path) = inner.path(ino) else {
            return Step::Done(Err(enoent()));
        };
        drop(inner);
        if self.source.stalled() {
            // No point asking: the last listing now, if there is one.
            if !listed {
                return Step::Done(Err(timed_out()));
            }
            self.stale_answer("readdir", &path);
            return Step::Done(Ok(()));
        }
        self.ask(path)
    }

    /// Applies the source's listing `r` (names, kinds and source inodes,
    /// no attributes) to [`Namespace::listing_local`]'s question. An entry
    /// listed before keeps its inode and its attributes (and when they were
    /// checked: revalidated as any) if it is still the same object (same
    /// kind, same source inode); a new one is known by name and kind only
    /// until it is stat-ed (a lookup, a getattr, a READDIRPLUS that
    /// returns it).
    pub fn listing_answer(
        &self,
        ino: u64,
        ask: Ask,
        r: io::Result<Vec<crate::source::DirName>>,
    ) -> io::Result<()> {
        let (path, now) = (ask.path, ask.at_ms);
        let mut entries = match r {
            Ok(e) => e,
            Err(e) if is_timeout(&e) => {
                // A directory listed before is served as last listed; one
                // never listed in full cannot be (its known children may
                // be only some of them).
                let listed = self
                    .inner
                    .read()
                    .dir_of(ino)
                    .is_some_and(|d| d.listed_ms.is_some());
                if !listed {
                    return Err(e);
                }
                self.stale_answer("readdir", &path);
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        entries.sort_unstable_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
        entries.dedup_by(|a, b| a.name == b.name);
        let mut inner = self.inner.write();
        // The old listing, sorted by name (taken out; put back below).
        // (the side run merged in first: names found by lookups since the
        // last listing)
        if inner.dir_of(ino).is_none() {
            return Err(enoent());
        }
        // Many stores to the directory's entries: marked until done.
        inner.intend_dir(ino);
        if inner.dir_of(ino).is_some_and(|d| !d.side.is_empty()) {
            inner.merge_side(ino);
        }
        let old = std::mem::take(&mut inner.dir_mut(ino).ok_or_else(enoent)?.children);
        // Merge the sorted old and new listings, keeping inodes of entries
        // that are still the same object: linear in the two listings.
        let mut children = Vec::with_capacity(entries.len());
        let mut oi = 0;
        for e in &entries {
            let (name, nb) = (&e.name, e.name.as_bytes());
            while oi < old.len() && inner.name_of(old[oi] as u64) < nb {
                let gone = inner.attr_of(old[oi] as u64);
                inner.account(gone.as_ref(), None);
                inner.unlinked(old[oi] as u64);
                oi += 1;
            }
            let mut reuse = None;
            if oi < old.len() && inner.name_of(old[oi] as u64) == nb {
                let c = old[oi] as u64;
                oi += 1;
                if let Some(prev) = inner.attr_of(c) {
                    // (a source inode of 0: getdents did not say)
                    if prev.kind == e.kind && (e.ino == 0 || prev.ino == e.ino) {
                        reuse = Some(c);
                    } else {
                        inner.account(Some(&prev), None);
                        inner.unlinked(c);
                    }
                }
            }
            let c = match reuse {
                Some(c) => c,
                None => match inner.push_listed(ino, nb, e.kind, e.ino) {
                    Ok(c) => c,
                    Err(e) => {
                        warn!("{:?}: entry {name:?} left out: {e}", path);
                        continue;
                    }
                },
            };
            // Attributes that came with the listing: as fresh as a stat.
            if let Some(a) = &e.attr {
                let prev = inner.attr_of(c);
                inner.account(prev.as_ref(), Some(a));
                if let Err(e) = inner.set_attr(c, a, now) {
                    warn!("{:?}: attributes of {name:?} not kept: {e}", path);
                }
            }
            children.push(c as u32);
        }
        while oi < old.len() {
            let gone = inner.attr_of(old[oi] as u64);
            inner.account(gone.as_ref(), None);
            inner.unlinked(old[oi] as u64);
            oi += 1;
        }
        children.shrink_to_fit();
        inner.changes += 1;
        if let Some(d) = inner.node(ino).map(|n| n.dir()) {
            if let Some(dir) = inner.dirs.get_mut(d as usize) {
                dir.set_children(children);
            }
            inner.set_dir_meta(d, None, Some(Some(now)));
        }
        inner.done_dir();
        Ok(())
    }

    /// Hands the entries of directory `ino` from position `offset` on to `f`
    /// (with the position after each) until `f` returns true (buffer full).
    /// Call [`Namespace::refresh_dir`] first.
    pub fn read_dir(
        &self,
        ino: u64,
        offset: u64,
        mut f: impl FnMut(DirEntry<'_>, u64) -> bool,
    ) -> io::Result<()> {
        let inner = self.inner.read();
        let n = inner.node(ino).ok_or_else(enoent)?;
        let dir = inner
            .dir(n)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOTDIR))?;
        // A resume starts at its index: no cost for the entries before.
        let from = usize::try_from(offset).unwrap_or(usize::MAX);
        let now = self.now_ms();
        for i in from..dir.len() {
            let Some(c) = dir.get(i) else { break };
            let Some(child) = inner.node(c as u64) else {
                continue;
            };
            let attr = inner.attr(child);
            let e = DirEntry {
                ino: c as u64,
                name: OsStr::from_bytes(inner.name(child)),
                attr: &attr,
                known: child.known(),
                fresh: child.known() && !self.stale_node_at(child, now),
            };
            if f(e, i as u64 + 1) {
                break;
            }
        }
        Ok(())
    }

    /// The entries of directory `ino` at positions `from..from + max` whose
    /// attributes a READDIRPLUS cannot hand out as they are (never stat-ed,
    /// or stale), with the question to put to the source for each (answer
    /// it with [`Namespace::getattr_answer`]). Empty while the source is
    /// stalled (the reply then ends before the first such entry).
    pub fn plus_asks(&self, ino: u64, from: u64, max: usize) -> Vec<(u64, Ask)> {
        if self.source.stalled() {
            return Vec::new();
        }
        let inner = self.inner.read();
        let Some(dir) = inner.dir_of(ino) else {
            return Vec::new();
        };
        let from = usize::try_from(from).unwrap_or(usize::MAX);
        let at_ms = self.now_ms();
        let mut out = Vec::new();
        for i in from..dir.len().min(from.saturating_add(max)) {
            let Some(c) = dir.get(i) else { break };
            let Some(n) = inner.node(c as u64) else {
                continue;
            };
            if n.known() && !self.stale_node_at(n, at_ms) {
                continue;
            }
            if let Some(path) = inner.path(c as u64) {
                out.push((
                    c as u64,
                    Ask {
                        path,
                        at_ms,
                        relist: None,
                    },
                ));
            }
        }
        out
    }

    /// Stat-ahead for lookups in listing order (`ls -l`, `os.scandir` then
    /// `stat` of each entry, in the order the listing gave them): when the
    /// lookup of `name` in `parent` must stat it and the entry listed just
    /// before it is known (it was looked up just before), the entries
    /// after it that were never stat-ed (at most `max`), with the
    /// questions to ask of the source for them (answer with
    /// [`Namespace::getattr_answer`]). Empty otherwise (a lookup of one
    /// entry here and there costs no stat of its neighbours).
    pub fn ahead_asks(&self, parent: u64, name: &OsStr, max: usize) -> Vec<(u64, Ask)> {
        if self.source.stalled() {
            return Vec::new();
        }
        let mut inner = self.inner.write();
        let Some(dir) = inner.dir_of(parent) else {
            return Vec::new();
        };
        let Ok(Slot::Main(i)) = inner.find_child(dir, name.as_bytes()) else {
            return Vec::new();
        };
        let before = i
            .checked_sub(1)
            .and_then(|j| inner.node(dir.children[j] as u64));
        if !before.is_some_and(|n| n.known()) {
            return Vec::new();
        }
        let next: Vec<u32> = dir.children.iter().skip(i + 1).take(max).copied().collect();
        let at_ms = self.now_ms();
        let mut out = Vec::new();
        for c in next {
            let c = c as u64;
            match inner.node(c) {
                Some(n) if n.flags & (UNKNOWN | AHEAD) == UNKNOWN => {}
                _ => continue,
            }
            if let Some(path) = inner.path(c) {
                out.push((
                    c,
                    Ask {
                        path,
                        at_ms,
                        relist: None,
                    },
                ));
                if let Some(n) = inner.node_mut(c) {
                    n.flags |= AHEAD;
                }
            }
        }
        out
    }

    /// Whether `ino`'s attributes were read from the source (false for an
    /// entry only listed, and for an unknown inode).
    pub fn attrs_known(&self, ino: u64) -> bool {
        self.inner.read().node(ino).is_some_and(|n| n.known())
    }

    /// The parent of a directory inode (for "..").
    pub fn parent(&self, ino: u64) -> u64 {
        self.inner
            .read()
            .node(ino)
            .map(|n| n.parent as u64)
            .unwrap_or(ROOT)
    }

    /// The target of a symlink; the last one read if the source does not
    /// answer in time.
    pub fn read_link(&self, ino: u64) -> io::Result<PathBuf> {
        let path = self.path(ino)?;
        match self.source.read_link(&path) {
            Ok(t) => {
                self.last_known.lock().links.insert(ino, t.clone());
                Ok(t)
            }
            Err(e) if is_timeout(&e) => {
                let known = self.last_known.lock().links.get(&ino).cloned();
                let Some(t) = known else { return Err(e) };
                self.stale_answer("readlink", &path);
                Ok(t)
            }
            Err(e) => Err(e),
        }
    }

    /// The POSIX ACLs of `ino` if the namespace holds them read since its
    /// attributes were last read; else the question for the source. A
    /// source without ACLs is never asked.
    ///
    /// Whether the attributes themselves are stale is not asked here: the
    /// kernel keeps an ACL as long as the attributes it got with it, and
    /// asks for the attributes again (which reads them again here if they
    /// are stale, and so marks the ACL to be read again) before it asks
    /// for the ACL again. Asking the source whenever the record is stale
    /// made every check of an entry whose attributes the kernel still held
    /// a source call: the mount's root, whose ACL the kernel asks for at
    /// every path walk that crosses it, cost one per open of any file once
    /// `--revalidate` had passed (seen in `cargo bench --bench acl`).
    pub fn acls_local(&self, ino: u64) -> Step<Arc<Acls>> {
        let inner = self.inner.read();
        let Some(n) = inner.node(ino) else {
            return Step::Done(Err(enoent()));
        };
        if !self.acls_on {
            return Step::Done(Ok(Arc::clone(&inner.no_acls)));
        }
        let fresh = n.flags & ACL_FRESH != 0 && n.known();
        if fresh {
            return Step::Done(Ok(inner.acls_of(ino)));
        }
        let known = n.flags & ACL_KNOWN != 0;
        let Some(path) = inner.path(ino) else {
            return Step::Done(Err(enoent()));
        };
        if known && self.source.stalled() {
            let acls = inner.acls_of(ino);
            drop(inner);
            self.stale_answer("acls", &path);
            return Step::Done(Ok(acls));
        }
        drop(inner);
        self.ask(path)
    }

    /// Applies the source's answer `r` to [`Namespace::acls_local`]'s
    /// question: the ACLs are held from now on (revalidated with the
    /// attributes). When the source did not answer in time, the last
    /// known ACLs; with none known, the error (the kernel then refuses the
    /// access: an ACL is never guessed).
    pub fn acls_answer(&self, ino: u64, ask: Ask, r: io::Result<Acls>) -> io::Result<Arc<Acls>> {
        match r {
            Ok(a) => Ok(self.inner.write().set_acls(ino, a)),
            Err(e) if is_timeout(&e) => {
                let inner = self.inner.read();
                let known = inner.node(ino).is_some_and(|n| n.flags & ACL_KNOWN != 0);
                if !known {
                    return Err(e);
                }
                let acls = inner.acls_of(ino);
                drop(inner);
                self.stale_answer("acls", &ask.path);
                Ok(acls)
            }
            Err(e) => Err(e),
        }
    }

    /// Asks the source for the POSIX ACLs of `ask`'s entry and hands
    /// `answer` them (or the error) on whatever thread has them, holding
    /// none: with the mount's guard, the metadata worker that read them,
    /// or its deadline thread (as [`Namespace::stat_then`]).
    pub fn acls_then(&self, ask: Ask, answer: impl FnOnce(Ask, io::Result<Acls>) + Send + 'static) {
        let path = ask.path.clone();
        Arc::clone(&self.source).acls_then(path, Box::new(move |r| answer(ask, r)));
    }

    /// Entries holding an ACL now (for tests and memory reporting).
    pub fn entries_with_acls(&self) -> usize {
        self.inner.read().acls.len()
    }

    /// `statvfs` of the source; the last one if it does not answer in time.
    pub fn statfs(&self) -> io::Result<libc::statvfs> {
        match self.source.statvfs() {
            Ok(s) => {
                self.last_known.lock().statvfs = Some(s);
                Ok(s)
            }
            Err(e) if is_timeout(&e) => {
                let known = self.last_known.lock().statvfs;
                let Some(s) = known else { return Err(e) };
                self.stale_answer("statfs", Path::new(""));
                Ok(s)
            }
            Err(e) => Err(e),
        }
    }

    /// Child `name` of directory `parent` as the namespace knows it now:
    /// its inode, kind, and version if its attributes were read (None: only
    /// listed). Never asks the source and counts no kernel lookup: for
    /// `locafs where`, whose owners need only paths (refresh the listing
    /// first with [`Namespace::refresh_dir`]).
    ///
    /// `near` is where the last name found in this directory sat: a list of
    /// names in listing order (an image folder's, as a loader holds it)
    /// finds each next to the last one, without a binary search.
    pub fn listed_child(
        &self,
        parent: u64,
        name: &OsStr,
        near: &mut usize,
    ) -> Option<(u64, EntryKind, Option<SourceVersion>)> {
        let name = name.as_bytes();
        let inner = self.inner.read();
        let dir = inner.dir(inner.node(parent)?)?;
        let next = [*near, near.wrapping_add(1)];
        let hit = next.into_iter().find_map(|i| {
            let c = *dir.children.get(i)?;
            (inner.name_of(c as u64) == name).then_some((i, c as u64))
        });
        let ino = match hit {
            Some((i, ino)) => {
                *near = i;
                ino
            }
            None => match inner.find_child(dir, name).ok()? {
                Slot::Main(i) => {
                    *near = i;
                    dir.children[i] as u64
                }
                side => dir.at(side) as u64,
            },
        };
        let n = inner.node(ino)?;
        Some((
            ino,
            kind_of(n.kind),
            n.known().then(|| inner.attr(n).version()),
        ))
    }

    /// Resolves a path relative to the root, component by component (no
    /// "..", no symlinks followed).
    pub fn lookup_path(&self, rel: &Path) -> io::Result<(u64, SourceAttr)> {
        use std::path::Component;
        let mut cur = (ROOT, self.getattr(ROOT)?);
        for c in rel.components() {
            match c {
                Component::Normal(name) => cur = self.lookup(cur.0, name)?,
                Component::CurDir | Component::RootDir => {}
                _ => return Err(io::Error::from_raw_os_error(libc::EINVAL)),
            }
        }
        Ok(cur)
    }

    /// Path and fresh attributes of a regular file about to be opened.
    pub fn open_file(&self, ino: u64) -> io::Result<(Arc<Path>, SourceAttr)> {
        self.file_with(ino, self.getattr(ino)?)
    }

    /// [`Namespace::open_file`] without holding a thread while the source
    /// answers.
    pub async fn open_file_async(&self, ino: u64) -> io::Result<(Arc<Path>, SourceAttr)> {
        self.file_with(ino, self.getattr_async(ino).await?)
    }

    /// The path of `ino`, a regular file whose attributes are `attr`.
    pub fn file_with(&self, ino: u64, attr: SourceAttr) -> io::Result<(Arc<Path>, SourceAttr)> {
        match attr.kind {
            EntryKind::File => {}
            EntryKind::Dir => return Err(io::Error::from_raw_os_error(libc::EISDIR)),
            _ => return Err(io::Error::from_raw_os_error(libc::EINVAL)),
        }
        Ok((Arc::from(self.path(ino)?), attr))
    }
}

/// One more kernel lookup (saturating).
fn bump(c: &AtomicU32) {
    let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_add(1));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// keep_cache's bit: set by an open at the record's version, read back
    /// at the next open of that version only, gone when the file changes
    /// or the kernel forgets the inode (not when it forgets some lookups).
    #[test]
    fn the_opened_bit_follows_the_version_and_the_kernels_inode() {
        let src = tempfile::tempdir().unwrap();
        let f = src.path().join("f");
        std::fs::write(&f, b"one").unwrap();
        let source = Arc::new(crate::source::DirSource::new(src.path().to_owned()));
        // Everything stale at once: every getattr asks the source.
        let ns = Namespace::new(source, Some(Duration::ZERO), Arc::default()).unwrap();
        let (ino, a) = ns.lookup(ROOT, "f".as_ref()).unwrap();
        ns.looked_up(ino);
        ns.looked_up(ino);
        let v = a.version();
        assert!(!ns.opened_at(ino, &v), "never opened");
        ns.note_opened(ino, &v);
        assert!(ns.opened_at(ino, &v));
        // An open of another version says nothing of this one's pages and
        // marks nothing.
        let other = SourceVersion { size: 9, ..v };
        assert!(!ns.opened_at(ino, &other));
        ns.note_opened(ino, &other);
        assert!(!ns.opened_at(ino, &other) && ns.opened_at(ino, &v));
        // The kernel still holds one lookup: its pages stay.
        assert_eq!(ns.forget(&[(ino, 1)]), Vec::<u64>::new());
        assert!(ns.opened_at(ino, &v));
        // Forgotten: the pages went with the inode.
        assert_eq!(ns.forget(&[(ino, 1)]), vec![ino]);
        assert!(!ns.opened_at(ino, &v));
        ns.note_opened(ino, &v);
        assert!(ns.opened_at(ino, &v));
        // The file changed at the source: the bit goes with the old version,
        // and an open of the old version (raced with the change) marks
        // nothing.
        std::fs::write(&f, b"three").unwrap();
        let a2 = ns.getattr(ino).unwrap();
        assert_eq!(a2.size, 5);
        let v2 = a2.version();
        assert!(!ns.opened_at(ino, &v) && !ns.opened_at(ino, &v2));
        ns.note_opened(ino, &v);
        assert!(!ns.opened_at(ino, &v2));
        ns.note_opened(ino, &v2);
        assert!(ns.opened_at(ino, &v2));
    }

    #[test]
    fn listed_entries_are_stat_ed_on_first_use_and_keep_their_attributes_when_listed_again() {
        let src = tempfile::tempdir().unwrap();
        std::fs::write(src.path().join("a"), b"aaa").unwrap();
        std::fs::write(src.path().join("b"), b"b").unwrap();
        let source = Arc::new(crate::source::DirSource::new(src.path().to_owned()));
        // Everything stale at once: every refresh lists again.
        let ns = Namespace::new(source, Some(Duration::ZERO), Arc::default()).unwrap();
        ns.refresh_dir(ROOT).unwrap();
        let listed = |ns: &Namespace| {
            let mut v = Vec::new();
            ns.read_dir(ROOT, 0, |e, _| {
                v.push((e.name.to_owned(), e.ino, e.known, e.attr.kind));
                false
            })
            .unwrap();
            v
        };
        let l = listed(&ns);
        assert_eq!(l.len(), 2);
        assert!(l.iter().all(|e| !e.2 && e.3 == EntryKind::File), "{l:?}");
        let (a, b) = (l[0].1, l[1].1);
        // "a" replaced by another object before its first stat: the stat
        // says which object the entry is (getdents' inode was a hint).
        std::fs::write(src.path().join("a.new"), b"aaaaa").unwrap();
        std::fs::rename(src.path().join("a.new"), src.path().join("a")).unwrap();
        assert_eq!(ns.getattr(a).unwrap().size, 5);
        assert!(ns.attrs_known(a) && !ns.attrs_known(b));
        // Listed again: same inodes; "a" keeps its attributes.
        ns.refresh_dir(ROOT).unwrap();
        let l = listed(&ns);
        assert_eq!((l[0].1, l[0].2, l[1].1, l[1].2), (a, true, b, false));
        assert_eq!(ns.inner.read().attr_of(a).unwrap().size, 5);
        // Replaced again after its stat: a listing sees another object (a
        // new inode, attributes unknown).
        std::fs::write(src.path().join("a.new"), b"a").unwrap();
        std::fs::rename(src.path().join("a.new"), src.path().join("a")).unwrap();
        ns.refresh_dir(ROOT).unwrap();
        let l = listed(&ns);
        assert!(l[0].1 != a && !l[0].2, "{l:?}");
        assert_eq!(
            ns.lookup(ROOT, "a".as_ref()).unwrap(),
            (l[0].1, ns.getattr(l[0].1).unwrap())
        );
    }

    #[test]
    fn a_listing_after_lookups_keeps_their_inodes_and_resumes_at_stable_offsets() {
        let src = tempfile::tempdir().unwrap();
        let n = 500;
        for i in 0..n {
            std::fs::write(src.path().join(format!("f{i:04}")), b"x").unwrap();
        }
        let source = Arc::new(crate::source::DirSource::new(src.path().to_owned()));
        let ns = Namespace::new(source, None, Arc::default()).unwrap();
        // Lookups of every third name, scrambled: more than the side run
        // holds, so it is merged on the way.
        let mut looked = Vec::new();
        for k in 0..n {
            let i = k * 13 % n;
            if i % 3 == 0 {
                let name = format!("f{i:04}");
                let (ino, _) = ns.lookup(ROOT, name.as_ref()).unwrap();
                looked.push((name, ino));
            }
        }
        let entries = |from: u64| {
            let mut v = Vec::new();
            ns.read_dir(ROOT, from, |e, next| {
                v.push((e.name.to_string_lossy().into_owned(), e.ino, next));
                false
            })
            .unwrap();
            v
        };
        // Before any listing: the names looked up, each once.
        let known = entries(0);
        assert_eq!(known.len(), looked.len());
        for (name, ino) in &looked {
            assert!(
                known.iter().any(|(n, i, _)| n == name && i == ino),
                "{name}"
            );
        }
        // A resume at any position gives the rest, as the whole listing
        // does.
        for (k, (_, _, next)) in known.iter().enumerate() {
            assert_eq!(entries(*next)[..], known[k + 1..]);
        }
        // The listing: every name, in order, the looked-up ones with their
        // inodes.
        ns.refresh_dir(ROOT).unwrap();
        let all = entries(0);
        let names: Vec<String> = (0..n).map(|i| format!("f{i:04}")).collect();
        assert_eq!(all.iter().map(|e| e.0.clone()).collect::<Vec<_>>(), names);
        for (name, ino) in &looked {
            assert!(all.iter().any(|(n, i, _)| n == name && i == ino), "{name}");
        }
        for (k, (_, _, next)) in all.iter().enumerate().step_by(37) {
            assert_eq!(entries(*next)[..], all[k + 1..]);
        }
        for (name, ino) in &looked {
            assert_eq!(ns.lookup(ROOT, name.as_ref()).unwrap().0, *ino);
        }
    }
}
