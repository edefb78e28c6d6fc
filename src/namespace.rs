//! The namespace: the source tree as inodes. It maps inode numbers to paths
//! and attributes, lists directories, and revalidates what it knows against
//! the source once it is older than the revalidation interval (never with
//! `--immutable`), so that new, changed and deleted files show up in time.
//!
//! Inode numbers are stable for the life of the mount (a renamed or replaced
//! entry gets a new one) and never reused. This module never reads file data,
//! adds no entry of its own to the tree (no control files), and does no source
//! I/O while holding its lock.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::collections::HashMap;

use parking_lot::{Mutex, RwLock};
use tracing::warn;

use crate::source::{EntryKind, Source, SourceAttr};
use crate::source_guard::{is_timeout, timed_out};
use crate::stats::Stats;

/// The root's inode number (FUSE's convention).
pub const ROOT: u64 = 1;

#[derive(Debug)]
struct Node {
    parent: u64,
    name: Box<[u8]>,
    attr: SourceAttr,
    /// When `attr` was last read from the source (ms since the namespace
    /// started).
    checked_ms: u64,
    dir: Option<Box<DirState>>,
}

#[derive(Debug, Default)]
struct DirState {
    /// Children inode numbers, sorted by name.
    children: Vec<u64>,
    /// When the directory was last listed in full, if ever.
    listed_ms: Option<u64>,
}

#[derive(Debug)]
struct Inner {
    /// Node of inode `i` at index `i - 1`.
    nodes: Vec<Node>,
    known_bytes: u64,
    /// Where `known_bytes` is published (the cache policy reads it).
    known_sink: Arc<AtomicU64>,
    /// Bumped on every change (so the manifest is saved only when needed).
    changes: u64,
}

impl Inner {
    fn node(&self, ino: u64) -> Option<&Node> {
        self.nodes.get(ino.checked_sub(1)? as usize)
    }

    fn node_mut(&mut self, ino: u64) -> Option<&mut Node> {
        self.nodes.get_mut(ino.checked_sub(1)? as usize)
    }

    fn path(&self, mut ino: u64) -> Option<PathBuf> {
        let mut parts: Vec<&[u8]> = Vec::new();
        while ino != ROOT {
            let n = self.node(ino)?;
            parts.push(&n.name);
            ino = n.parent;
        }
        let mut p = PathBuf::new();
        for part in parts.iter().rev() {
            p.push(OsStr::from_bytes(part));
        }
        Some(p)
    }

    fn find_child(&self, dir: &DirState, name: &[u8]) -> Result<usize, usize> {
        dir.children
            .binary_search_by(|c| self.node(*c).map(|n| &*n.name).unwrap_or(&[]).cmp(name))
    }

    fn account(&mut self, old: Option<&SourceAttr>, new: Option<&SourceAttr>) {
        let size = |a: Option<&SourceAttr>| match a {
            Some(a) if a.kind == EntryKind::File => a.size,
            _ => 0,
        };
        self.changes += 1;
        self.known_bytes = (self.known_bytes + size(new)).saturating_sub(size(old));
        self.known_sink.store(self.known_bytes, Ordering::Relaxed);
    }

    fn push(&mut self, parent: u64, name: &[u8], attr: SourceAttr, now: u64) -> u64 {
        self.account(None, Some(&attr));
        self.nodes.push(Node {
            parent,
            name: name.into(),
            attr,
            checked_ms: now,
            dir: (attr.kind == EntryKind::Dir).then(Box::default),
        });
        self.nodes.len() as u64
    }

    /// Updates or replaces the child `name` of `parent` with a fresh `attr`;
    /// returns its inode.
    fn upsert_child(
        &mut self,
        parent: u64,
        name: &[u8],
        attr: SourceAttr,
        now: u64,
    ) -> Option<u64> {
        let pos = {
            let dir = self.node(parent)?.dir.as_deref()?;
            self.find_child(dir, name)
        };
        match pos {
            Ok(i) => {
                let ino = self.node(parent)?.dir.as_ref()?.children[i];
                let old = self.node(ino)?.attr;
                if (old.kind == EntryKind::Dir) == (attr.kind == EntryKind::Dir)
                    && old.ino == attr.ino
                {
                    self.account(Some(&old), Some(&attr));
                    let n = self.node_mut(ino)?;
                    n.attr = attr;
                    n.checked_ms = now;
                    Some(ino)
                } else {
                    // Replaced by another object: a new inode.
                    self.account(Some(&old), None);
                    let new = self.push(parent, name, attr, now);
                    self.node_mut(parent)?.dir.as_mut()?.children[i] = new;
                    Some(new)
                }
            }
            Err(i) => {
                let new = self.push(parent, name, attr, now);
                self.node_mut(parent)?.dir.as_mut()?.children.insert(i, new);
                Some(new)
            }
        }
    }

    /// Calls `f(parent, node)` for every node of the tree, that is every
    /// node reachable from the root through its parents' child lists:
    /// parents before their children, children in name order, the root
    /// first (as its own parent). Nodes are numbered 1, 2, ... in that
    /// order, and `parent` is the parent's number, not its inode. A node
    /// unlinked from its parent (deleted, or replaced by another object),
    /// and with it the subtree of a directory, is not visited.
    fn for_each_in_tree(&self, mut f: impl FnMut(u64, &Node)) {
        let Some(root) = self.node(ROOT) else {
            return;
        };
        f(ROOT, root);
        let mut numbered = ROOT;
        // (directory inode, its number, index of its next child)
        let mut stack: Vec<(u64, u64, usize)> = vec![(ROOT, ROOT, 0)];
        while let Some(top) = stack.last_mut() {
            let (dir, number, next) = *top;
            let child = self
                .node(dir)
                .and_then(|n| n.dir.as_deref())
                .and_then(|d| d.children.get(next).copied());
            let Some(c) = child else {
                stack.pop();
                continue;
            };
            top.2 += 1;
            // A child is always a younger inode than its parent, which
            // also rules out cycles.
            let Some(n) = self.node(c).filter(|n| c > dir && n.parent == dir) else {
                continue;
            };
            numbered += 1;
            f(number, n);
            if n.dir.is_some() {
                stack.push((c, numbered, 0));
            }
        }
    }

    fn remove_child(&mut self, parent: u64, name: &[u8]) {
        let pos = match self.node(parent).and_then(|p| p.dir.as_deref()) {
            Some(dir) => self.find_child(dir, name),
            None => return,
        };
        if let Ok(i) = pos {
            let Some(dir) = self.node_mut(parent).and_then(|p| p.dir.as_mut()) else {
                return;
            };
            let ino = dir.children.remove(i);
            let old = self.node(ino).map(|n| n.attr);
            self.account(old.as_ref(), None);
        }
    }

    /// Takes inode `ino` out of its parent's listing, if it is still there:
    /// the source no longer has it at its path.
    fn unlink(&mut self, ino: u64) {
        let Some(n) = self.node(ino) else { return };
        let (parent, name) = (n.parent, n.name.clone());
        let here = self
            .node(parent)
            .and_then(|p| p.dir.as_deref())
            .and_then(|d| self.find_child(d, &name).ok().map(|i| d.children[i]));
        if ino != ROOT && here == Some(ino) {
            self.remove_child(parent, &name);
        }
    }
}

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
}

/// One directory entry as `readdir` hands it out.
pub struct DirEntry<'a> {
    pub ino: u64,
    pub name: &'a OsStr,
    pub attr: &'a SourceAttr,
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
}

#[derive(Default)]
struct LastKnown {
    links: HashMap<u64, PathBuf>,
    statvfs: Option<libc::statvfs>,
}

/// At most one "answered from the last known tree" line a minute: an
/// outage must not flood the log (every such answer is counted in stats).
static STALE: crate::logging::RateLimit = crate::logging::RateLimit::new(60_000);

impl Namespace {
    /// `known_sink` receives the total size of the files seen so far, as it
    /// changes (the cache policy measures "passes over the data set" by it).
    pub fn new(
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
        let ns = Namespace {
            source,
            revalidate,
            started: Instant::now(),
            inner: RwLock::new(Inner {
                nodes: Vec::new(),
                known_bytes: 0,
                known_sink,
                changes: 0,
            }),
            last_known: Mutex::default(),
            stats: None,
        };
        ns.inner.write().push(ROOT, b"", root, 0);
        Ok(ns)
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
        manifest: crate::manifest::Manifest,
        age: Duration,
    ) -> Option<Self> {
        let started = Instant::now().checked_sub(age)?;
        if revalidate.is_some_and(|r| age >= r) {
            return None;
        }
        let mut inner = Inner {
            nodes: Vec::with_capacity(manifest.records.len()),
            known_bytes: 0,
            known_sink,
            changes: 0,
        };
        for r in &manifest.records {
            let ino = inner.push(r.parent, &r.name, r.attr, 0);
            if ino != ROOT {
                let name = &r.name[..];
                if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
                    return None;
                }
                let parent = inner.node_mut(r.parent)?;
                parent.dir.as_mut()?.children.push(ino);
            }
            if r.listed {
                inner.node_mut(ino)?.dir.as_mut()?.listed_ms = Some(0);
            }
        }
        if inner.nodes.first()?.attr.kind != EntryKind::Dir {
            return None;
        }
        // Children sorted by name, as lookups expect; one entry per name.
        for i in 0..inner.nodes.len() {
            if let Some(mut dir) = inner.nodes[i].dir.take() {
                let name = |x: &u64| inner.node(*x).map(|n| &n.name[..]).unwrap_or(&[]);
                dir.children.sort_by(|a, b| name(a).cmp(name(b)));
                if dir.children.windows(2).any(|w| name(&w[0]) == name(&w[1])) {
                    return None;
                }
                inner.nodes[i].dir = Some(dir);
            }
        }
        inner.changes = 0;
        Some(Namespace {
            source,
            revalidate,
            started,
            inner: RwLock::new(inner),
            last_known: Mutex::default(),
            stats: None,
        })
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
        let inner = self.inner.read();
        let mut e = crate::manifest::Encoder::new(source_label, saved_unix_s);
        inner.for_each_in_tree(|parent, n| {
            let listed = n.dir.as_ref().is_some_and(|d| d.listed_ms.is_some());
            e.push(parent, &n.name, &n.attr, listed);
        });
        e.finish(source_label.len())
    }

    /// A counter that moves whenever the namespace changes.
    pub fn changes(&self) -> u64 {
        self.inner.read().changes
    }

    fn ask<T>(&self, path: PathBuf) -> Step<T> {
        Step::Ask(Ask {
            path,
            at_ms: self.now_ms(),
        })
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn stale(&self, checked_ms: u64) -> bool {
        match self.revalidate {
            None => false,
            Some(d) => self.now_ms().saturating_sub(checked_ms) >= d.as_millis() as u64,
        }
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

    /// The source's `stat` for `ask`, without holding a thread.
    pub async fn stat_for(&self, ask: &Ask) -> io::Result<SourceAttr> {
        Arc::clone(&self.source).stat_async(ask.path.clone()).await
    }

    /// A lookup's answer if the namespace knows it fresh, else what to ask
    /// the source.
    pub fn lookup_local(&self, parent: u64, name: &OsStr) -> Step<(u64, SourceAttr)> {
        let name = name.as_bytes();
        let inner = self.inner.read();
        let Some(p) = inner.node(parent) else {
            return Step::Done(Err(enoent()));
        };
        let Some(dir) = p.dir.as_deref() else {
            return Step::Done(Err(io::Error::from_raw_os_error(libc::ENOTDIR)));
        };
        let listed_fresh = dir.listed_ms.is_some_and(|t| !self.stale(t));
        match inner.find_child(dir, name) {
            Ok(i) => {
                let ino = dir.children[i];
                if let Some(n) = inner.node(ino) {
                    if !self.stale(n.checked_ms) {
                        return Step::Done(Ok((ino, n.attr)));
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
            // No point asking: the last known answer now, or none.
            let known = inner
                .find_child(dir, name)
                .ok()
                .map(|i| dir.children[i])
                .and_then(|ino| Some((ino, inner.node(ino)?.attr)));
            drop(inner);
            return Step::Done(match known {
                Some(k) => {
                    self.stale_answer("lookup", &path.join(OsStr::from_bytes(name)));
                    Ok(k)
                }
                None => Err(timed_out()),
            });
        }
        self.ask(path.join(OsStr::from_bytes(name)))
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
                let ino = inner
                    .upsert_child(parent, name, attr, ask.at_ms)
                    .ok_or_else(enoent)?;
                Ok((ino, attr))
            }
            Err(e) if is_timeout(&e) => {
                // A known entry is answered as last seen; an unknown name
                // cannot be.
                let inner = self.inner.read();
                let known = inner
                    .node(parent)
                    .and_then(|p| p.dir.as_deref())
                    .and_then(|d| inner.find_child(d, name).ok().map(|i| d.children[i]))
                    .and_then(|ino| Some((ino, inner.node(ino)?.attr)));
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
        if !self.stale(n.checked_ms) {
            return Step::Done(Ok(n.attr));
        }
        let attr = n.attr;
        let Some(path) = inner.path(ino) else {
            return Step::Done(Err(enoent()));
        };
        drop(inner);
        if self.source.stalled() {
            // No point asking: the last known attributes now.
            self.stale_answer("stat", &path);
            return Step::Done(Ok(attr));
        }
        self.ask(path)
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
                let known = self.inner.read().node(ino).map(|n| n.attr);
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
        let old = inner.node(ino).ok_or_else(enoent)?.attr;
        if (old.kind == EntryKind::Dir) != (attr.kind == EntryKind::Dir) || old.ino != attr.ino {
            // Another object now lives at this path: this inode is gone
            // (the next lookup or listing finds the new one).
            inner.unlink(ino);
            return Err(enoent());
        }
        inner.account(Some(&old), Some(&attr));
        let n = inner.node_mut(ino).ok_or_else(enoent)?;
        n.attr = attr;
        n.checked_ms = ask.at_ms;
        Ok(attr)
    }

    /// Lists directory `ino` from the source if it was never listed or its
    /// listing is stale. Called at the start of a directory read.
    pub fn refresh_dir(&self, ino: u64) -> io::Result<()> {
        match self.listing_local(ino) {
            Step::Done(r) => r,
            Step::Ask(ask) => {
                let r = self.source.list(&ask.path);
                self.listing_answer(ino, ask, r)
            }
        }
    }

    /// [`Namespace::refresh_dir`] without holding a thread while the source
    /// answers.
    pub async fn refresh_dir_async(&self, ino: u64) -> io::Result<()> {
        match self.listing_local(ino) {
            Step::Done(r) => r,
            Step::Ask(ask) => {
                let r = Arc::clone(&self.source).list_async(ask.path.clone()).await;
                self.listing_answer(ino, ask, r)
            }
        }
    }

    /// Done if directory `ino`'s listing is fresh, else what to ask the
    /// source.
    pub fn listing_local(&self, ino: u64) -> Step<()> {
        let inner = self.inner.read();
        let Some(n) = inner.node(ino) else {
            return Step::Done(Err(enoent()));
        };
        let Some(dir) = n.dir.as_deref() else {
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

    /// Applies the source's listing `r` to [`Namespace::listing_local`]'s
    /// question.
    pub fn listing_answer(
        &self,
        ino: u64,
        ask: Ask,
        r: io::Result<Vec<(std::ffi::OsString, SourceAttr)>>,
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
                    .node(ino)
                    .and_then(|n| n.dir.as_deref())
                    .is_some_and(|d| d.listed_ms.is_some());
                if !listed {
                    return Err(e);
                }
                self.stale_answer("readdir", &path);
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        let mut inner = self.inner.write();
        let old: Vec<(Box<[u8]>, u64)> = {
            let dir = inner
                .node(ino)
                .and_then(|n| n.dir.as_deref())
                .ok_or_else(enoent)?;
            dir.children
                .iter()
                .filter_map(|c| inner.node(*c).map(|n| (n.name.clone(), *c)))
                .collect()
        };
        // Merge the sorted old and new listings, keeping inodes of entries
        // that are still the same object.
        let mut children = Vec::with_capacity(entries.len());
        let mut oi = 0;
        for (name, attr) in &entries {
            let nb = name.as_bytes();
            while oi < old.len() && &*old[oi].0 < nb {
                let gone = inner.node(old[oi].1).map(|n| n.attr);
                inner.account(gone.as_ref(), None);
                oi += 1;
            }
            let mut reuse = None;
            if oi < old.len() && &*old[oi].0 == nb {
                let c = old[oi].1;
                oi += 1;
                if let Some(n) = inner.node(c) {
                    let prev = n.attr;
                    if (prev.kind == EntryKind::Dir) == (attr.kind == EntryKind::Dir)
                        && prev.ino == attr.ino
                    {
                        inner.account(Some(&prev), Some(attr));
                        if let Some(n) = inner.node_mut(c) {
                            n.attr = *attr;
                            n.checked_ms = now;
                        }
                        reuse = Some(c);
                    } else {
                        inner.account(Some(&prev), None);
                    }
                }
            }
            let c = match reuse {
                Some(c) => c,
                None => inner.push(ino, nb, *attr, now),
            };
            children.push(c);
        }
        while oi < old.len() {
            let gone = inner.node(old[oi].1).map(|n| n.attr);
            inner.account(gone.as_ref(), None);
            oi += 1;
        }
        if let Some(dir) = inner.node_mut(ino).and_then(|n| n.dir.as_mut()) {
            dir.children = children;
            dir.listed_ms = Some(now);
        }
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
        let dir = n
            .dir
            .as_deref()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOTDIR))?;
        for (i, c) in dir.children.iter().enumerate().skip(offset as usize) {
            let Some(child) = inner.node(*c) else {
                continue;
            };
            let e = DirEntry {
                ino: *c,
                name: OsStr::from_bytes(&child.name),
                attr: &child.attr,
            };
            if f(e, i as u64 + 1) {
                break;
            }
        }
        Ok(())
    }

    /// The parent of a directory inode (for "..").
    pub fn parent(&self, ino: u64) -> u64 {
        self.inner
            .read()
            .node(ino)
            .map(|n| n.parent)
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

fn enoent() -> io::Error {
    io::Error::from_raw_os_error(libc::ENOENT)
}
