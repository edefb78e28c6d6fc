//! Sources to put behind the `Source` seam: a directory (or any source)
//! behind a hook that sees every call (slow, stalling, or a test's own in a
//! few lines), a data set in memory, and a source that must not be asked.
//! Each answers as the real source does wherever it injects nothing
//! (`tests/kit_fakes.rs`); none of it may ship.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::io;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::Gate;
use crate::source::{
    Acls, DirName, DirSource, EntryKind, Source, SourceAttr, SourceError, SourceVersion,
};

// ------------------------------------------------------------ hooked sources

/// One call into a source, as a [`Hook`] sees it.
#[derive(Debug, Clone, Copy)]
pub enum Call<'a> {
    Stat(&'a Path),
    List(&'a Path),
    /// One more entry of a listing of this directory (inside its `List`).
    ListEntry(&'a Path),
    ReadLink(&'a Path),
    Read {
        path: &'a Path,
        offset: u64,
        len: usize,
    },
    Statvfs,
}

/// What a [`Hooked`] source does around each call into its directory.
pub trait Hook: Send + Sync + 'static {
    /// Runs `real` (the directory's answer to `call`) and returns its result.
    fn around<T>(&self, call: Call<'_>, real: impl FnOnce() -> T) -> T;
    /// An error to answer a metadata call (stat, list) with instead of
    /// asking the directory, if any (after `around` has seen the call).
    fn refuse(&self, _call: Call<'_>) -> Option<io::Error> {
        None
    }
    /// Sees the entries of a listing with attributes that the directory
    /// answered (each entry's attributes were read), before the caller does.
    fn listed(&self, _rel: &Path, _entries: &[(OsString, SourceAttr)]) {}
    /// What the source says of its listings (see
    /// [`Source::listing_carries_attrs`]).
    fn listing_carries_attrs(&self) -> bool {
        false
    }
}

/// A real directory (or, with [`Hooked::over`], any source) behind a hook.
/// Derefs to the hook, so a test reads the hook's records through the
/// source.
pub struct Hooked<H, S = DirSource> {
    inner: S,
    hook: H,
}

impl<H> Hooked<H> {
    pub fn wrap(root: &Path, hook: H) -> Self {
        Hooked::over(DirSource::new(root.to_owned()), hook)
    }
}

impl<H, S> Hooked<H, S> {
    pub fn over(inner: S, hook: H) -> Self {
        Hooked { inner, hook }
    }

    /// The source behind the hook.
    pub fn inner(&self) -> &S {
        &self.inner
    }
}

impl<H, S> Deref for Hooked<H, S> {
    type Target = H;
    fn deref(&self) -> &H {
        &self.hook
    }
}

impl<H: Hook, S: Source> Source for Hooked<H, S> {
    fn stat(&self, rel: &Path) -> io::Result<SourceAttr> {
        self.hook.around(Call::Stat(rel), || {
            match self.hook.refuse(Call::Stat(rel)) {
                Some(e) => Err(e),
                None => self.inner.stat(rel),
            }
        })
    }
    fn listing_carries_attrs(&self) -> bool {
        self.hook.listing_carries_attrs()
    }
    fn list(&self, rel: &Path) -> io::Result<Vec<(OsString, SourceAttr)>> {
        self.list_with_progress(rel, &|| {})
    }
    fn list_with_progress(
        &self,
        rel: &Path,
        progress: &dyn Fn(),
    ) -> io::Result<Vec<(OsString, SourceAttr)>> {
        let entry = || {
            self.hook.around(Call::ListEntry(rel), || ());
            progress()
        };
        self.hook.around(Call::List(rel), || {
            match self.hook.refuse(Call::List(rel)) {
                Some(e) => Err(e),
                None => self
                    .inner
                    .list_with_progress(rel, &entry)
                    .inspect(|all| self.hook.listed(rel, all)),
            }
        })
    }
    fn list_names(&self, rel: &Path, progress: &dyn Fn()) -> io::Result<Vec<DirName>> {
        let entry = || {
            self.hook.around(Call::ListEntry(rel), || ());
            progress()
        };
        self.hook.around(Call::List(rel), || {
            match self.hook.refuse(Call::List(rel)) {
                Some(e) => Err(e),
                None => self.inner.list_names(rel, &entry),
            }
        })
    }
    fn read_link(&self, rel: &Path) -> io::Result<PathBuf> {
        self.hook
            .around(Call::ReadLink(rel), || self.inner.read_link(rel))
    }
    fn read_at(
        &self,
        rel: &Path,
        version: &SourceVersion,
        offset: u64,
        len: usize,
    ) -> Result<Bytes, SourceError> {
        let call = Call::Read {
            path: rel,
            offset,
            len,
        };
        self.hook
            .around(call, || self.inner.read_at(rel, version, offset, len))
    }
    fn statvfs(&self) -> io::Result<libc::statvfs> {
        self.hook.around(Call::Statvfs, || self.inner.statvfs())
    }
}

/// One read that reached a [`SlowSource`].
#[derive(Clone, Debug)]
pub struct SourceRead {
    pub path: PathBuf,
    pub offset: u64,
    pub len: usize,
    pub at: Instant,
}

/// Shared storage over a network: a fixed latency per read and one
/// bandwidth cap for all reads together; records every read, how much was
/// in flight at once, and the metadata calls (not delayed).
pub type SlowSource = Hooked<Slow>;

pub struct Slow {
    latency: Duration,
    /// Bytes per second for all reads together (0: unlimited).
    bandwidth: u64,
    next_free: Mutex<Instant>,
    pub reads: Mutex<Vec<SourceRead>>,
    pub inflight_bytes: AtomicU64,
    pub max_inflight_bytes: AtomicU64,
    /// Metadata calls (stat, list, readlink) that reached the source.
    pub metadata_ops: AtomicU64,
}

impl SlowSource {
    pub fn new(root: &Path, latency: Duration, bandwidth: u64) -> Self {
        Hooked::wrap(
            root,
            Slow {
                latency,
                bandwidth,
                next_free: Mutex::new(Instant::now()),
                reads: Mutex::new(Vec::new()),
                inflight_bytes: AtomicU64::new(0),
                max_inflight_bytes: AtomicU64::new(0),
                metadata_ops: AtomicU64::new(0),
            },
        )
    }
}

impl Slow {
    pub fn reads(&self) -> Vec<SourceRead> {
        self.reads.lock().unwrap().clone()
    }

    pub fn bytes_read(&self) -> u64 {
        self.reads
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.len as u64)
            .sum()
    }

    fn delay(&self, len: usize) {
        let mut wait = self.latency;
        if self.bandwidth > 0 {
            let cost = Duration::from_secs_f64(len as f64 / self.bandwidth as f64);
            let mut next = self.next_free.lock().unwrap();
            let now = Instant::now();
            let start = (*next).max(now);
            *next = start + cost;
            wait += (start + cost) - now;
        }
        std::thread::sleep(wait);
    }
}

impl Hook for Slow {
    fn around<T>(&self, call: Call<'_>, real: impl FnOnce() -> T) -> T {
        match call {
            Call::Read { path, offset, len } => {
                let now = self.inflight_bytes.fetch_add(len as u64, SeqCst) + len as u64;
                self.max_inflight_bytes.fetch_max(now, SeqCst);
                self.reads.lock().unwrap().push(SourceRead {
                    path: path.to_owned(),
                    offset,
                    len,
                    at: Instant::now(),
                });
                self.delay(len);
                let r = real();
                self.inflight_bytes.fetch_sub(len as u64, SeqCst);
                r
            }
            Call::Statvfs | Call::ListEntry(_) => real(),
            Call::Stat(_) | Call::List(_) | Call::ReadLink(_) => {
                self.metadata_ops.fetch_add(1, SeqCst);
                real()
            }
        }
    }
}

/// A source that can be made to hang, as a hard NFS mount does when its
/// server stops: while stalled, every call blocks until the stall ends,
/// and cannot be cancelled.
pub type StallSource = Hooked<Stall>;

/// The hook of a [`StallSource`].
#[derive(Default)]
pub struct Stall {
    gate: Gate,
}

impl StallSource {
    pub fn new(root: &Path) -> Self {
        Hooked::wrap(root, Stall::default())
    }
}

impl Stall {
    /// From now on every call hangs until [`Stall::resume`].
    pub fn stall(&self) {
        self.gate.close();
    }

    pub fn resume(&self) {
        self.gate.open();
    }

    /// Calls blocked in the stall right now.
    pub fn waiting(&self) -> u64 {
        self.gate.waiting()
    }

    /// The most calls that were blocked in the stall at once.
    pub fn max_waiting(&self) -> u64 {
        self.gate.max_waiting()
    }
}

impl Hook for Stall {
    fn around<T>(&self, _: Call<'_>, real: impl FnOnce() -> T) -> T {
        self.gate.pass();
        real()
    }
}

// ---------------------------------------------------------- other sources

/// A source that must not be asked anything: counts every call and fails it
/// (`read_at` with NotFound, the others with an error of their own).
#[derive(Default)]
pub struct NoSource(AtomicU64);

impl NoSource {
    fn no<T>(&self) -> io::Result<T> {
        self.0.fetch_add(1, SeqCst);
        Err(io::Error::other(
            "a source that must not be asked was asked",
        ))
    }

    /// Calls so far.
    pub fn calls(&self) -> u64 {
        self.0.load(SeqCst)
    }
}

impl Source for NoSource {
    fn stat(&self, _: &Path) -> io::Result<SourceAttr> {
        self.no()
    }
    fn list(&self, _: &Path) -> io::Result<Vec<(OsString, SourceAttr)>> {
        self.no()
    }
    fn read_link(&self, _: &Path) -> io::Result<PathBuf> {
        self.no()
    }
    fn read_at(
        &self,
        rel: &Path,
        _: &SourceVersion,
        _: u64,
        _: usize,
    ) -> Result<Bytes, SourceError> {
        self.0.fetch_add(1, SeqCst);
        Err(SourceError::NotFound {
            path: rel.to_owned(),
        })
    }
    fn statvfs(&self) -> io::Result<libc::statvfs> {
        self.no()
    }
}

enum MemEntry {
    Dir,
    File(Bytes),
    Symlink(PathBuf),
}

/// A data set in memory: directories, files and symlinks by relative path
/// ("" is the root). Answers as `DirSource` does, errors included.
///
/// [`MemSource::put_file`] replaces a file (a new inode and mtime, as a
/// rename over it does at a real source), [`MemSource::write`] changes it
/// in place (same inode, new mtime); either makes a new version. It can
/// stall ([`MemSource::hold`]: every call waits until
/// [`MemSource::resume`]), serves POSIX ACLs set by the test, and counts
/// its calls by kind.
pub struct MemSource {
    tree: Mutex<BTreeMap<PathBuf, (SourceAttr, MemEntry)>>,
    clock: AtomicU64,
    /// POSIX ACLs by path (entries not here have none).
    acls: Mutex<HashMap<PathBuf, Acls>>,
    held: Gate,
    /// Calls of every kind so far.
    pub calls: AtomicU64,
    /// `read_at` calls.
    pub reads: AtomicU64,
    /// `stat` and `list` calls.
    pub metadata_calls: AtomicU64,
    /// `acls` calls.
    pub acl_calls: AtomicU64,
}

impl Default for MemSource {
    fn default() -> Self {
        Self::new()
    }
}

fn mode_of(kind: EntryKind) -> u32 {
    match kind {
        EntryKind::Dir => libc::S_IFDIR | 0o755,
        EntryKind::File => libc::S_IFREG | 0o644,
        EntryKind::Symlink => libc::S_IFLNK | 0o777,
        EntryKind::Other => libc::S_IFIFO | 0o644,
    }
}

fn enoent() -> io::Error {
    io::Error::from_raw_os_error(libc::ENOENT)
}

impl MemSource {
    /// An empty data set (the root directory only).
    pub fn new() -> Self {
        let s = MemSource {
            tree: Mutex::default(),
            clock: AtomicU64::new(1),
            acls: Mutex::default(),
            held: Gate::default(),
            calls: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            metadata_calls: AtomicU64::new(0),
            acl_calls: AtomicU64::new(0),
        };
        s.insert(PathBuf::new(), EntryKind::Dir, MemEntry::Dir, 0, false);
        s
    }

    /// Puts `e` at `rel` (and its missing parent directories); with
    /// `in_place` an entry already there keeps its inode. Its new version.
    fn insert(
        &self,
        rel: PathBuf,
        kind: EntryKind,
        e: MemEntry,
        size: u64,
        in_place: bool,
    ) -> SourceVersion {
        let tick = self.clock.fetch_add(1, SeqCst);
        let time = tick as i64 * 1_000_000_007;
        let attr = SourceAttr {
            kind,
            size,
            blocks: size.div_ceil(512),
            mode: mode_of(kind),
            nlink: if kind == EntryKind::Dir { 2 } else { 1 },
            uid: 0,
            gid: 0,
            rdev: 0,
            ino: tick + 1,
            atime_ns: time,
            mtime_ns: time,
            ctime_ns: time,
        };
        let mut tree = self.tree.lock().unwrap();
        let mut dir = rel.parent();
        while let Some(d) = dir {
            if !tree.contains_key(d) {
                let mut a = attr;
                a.kind = EntryKind::Dir;
                a.mode = mode_of(EntryKind::Dir);
                (a.size, a.blocks, a.nlink) = (0, 0, 2);
                tree.insert(d.to_owned(), (a, MemEntry::Dir));
            }
            dir = d.parent();
        }
        let mut attr = attr;
        if let Some((old, _)) = tree.get(&rel).filter(|_| in_place) {
            attr.ino = old.ino;
        }
        tree.insert(rel, (attr, e));
        attr.version()
    }

    /// Creates or replaces the file `rel` (and its directories): a new
    /// inode, as a rename over it does. Its new version.
    pub fn put_file(&self, rel: impl AsRef<Path>, data: impl Into<Bytes>) -> SourceVersion {
        let data = data.into();
        let size = data.len() as u64;
        let rel = rel.as_ref().to_owned();
        self.insert(rel, EntryKind::File, MemEntry::File(data), size, false)
    }

    /// Creates or changes the file `rel` in place (and its directories):
    /// an existing file keeps its inode, with a new mtime. Its new version.
    pub fn write(&self, rel: &str, data: &[u8]) -> SourceVersion {
        let data = Bytes::copy_from_slice(data);
        let size = data.len() as u64;
        let rel = PathBuf::from(rel);
        self.insert(rel, EntryKind::File, MemEntry::File(data), size, true)
    }

    /// Creates the directory `rel` (and its parents).
    pub fn mkdir(&self, rel: impl AsRef<Path>) {
        let rel = rel.as_ref().to_owned();
        self.insert(rel, EntryKind::Dir, MemEntry::Dir, 0, false);
    }

    /// Creates the symlink `rel` pointing at `target`.
    pub fn symlink(&self, rel: impl AsRef<Path>, target: impl AsRef<Path>) {
        let target = target.as_ref().to_owned();
        let size = target.as_os_str().len() as u64;
        let rel = rel.as_ref().to_owned();
        let e = MemEntry::Symlink(target);
        self.insert(rel, EntryKind::Symlink, e, size, false);
    }

    /// Removes `rel` and everything under it.
    pub fn remove(&self, rel: impl AsRef<Path>) {
        let rel = rel.as_ref();
        self.tree
            .lock()
            .unwrap()
            .retain(|p, _| !p.starts_with(rel) || rel.as_os_str().is_empty() && p == rel);
    }

    /// Sets (or, with none, removes) the POSIX ACLs of `rel`.
    pub fn set_acls(&self, rel: impl AsRef<Path>, acls: Acls) {
        self.acls.lock().unwrap().insert(rel.as_ref().into(), acls);
    }

    /// The version of `rel` as the source has it now.
    ///
    /// # Panics
    /// If there is no `rel` (a test's mistake).
    pub fn version(&self, rel: impl AsRef<Path>) -> SourceVersion {
        self.tree.lock().unwrap()[rel.as_ref()].0.version()
    }

    /// Every call waits from now on until [`MemSource::resume`] (a stalled
    /// source).
    pub fn hold(&self) {
        self.held.close();
    }

    pub fn resume(&self) {
        self.held.open();
    }

    /// Calls waiting at the hold now.
    pub fn waiting(&self) -> u64 {
        self.held.waiting()
    }

    /// Waits while held, then counts the call.
    fn call(&self) {
        self.held.pass();
        self.calls.fetch_add(1, SeqCst);
    }
}

impl Source for MemSource {
    fn stat(&self, rel: &Path) -> io::Result<SourceAttr> {
        self.call();
        self.metadata_calls.fetch_add(1, SeqCst);
        let tree = self.tree.lock().unwrap();
        tree.get(rel).map(|(a, _)| *a).ok_or_else(enoent)
    }
    fn list(&self, rel: &Path) -> io::Result<Vec<(OsString, SourceAttr)>> {
        self.call();
        self.metadata_calls.fetch_add(1, SeqCst);
        let tree = self.tree.lock().unwrap();
        match tree.get(rel) {
            None => return Err(enoent()),
            Some((_, MemEntry::Dir)) => {}
            Some(_) => return Err(io::Error::from_raw_os_error(libc::ENOTDIR)),
        }
        Ok(tree
            .iter()
            .filter(|(p, _)| !p.as_os_str().is_empty() && p.parent() == Some(rel))
            .map(|(p, (a, _))| (p.file_name().unwrap().to_owned(), *a))
            .collect())
    }
    fn read_link(&self, rel: &Path) -> io::Result<PathBuf> {
        self.call();
        match self.tree.lock().unwrap().get(rel) {
            None => Err(enoent()),
            Some((_, MemEntry::Symlink(t))) => Ok(t.clone()),
            Some(_) => Err(io::Error::from_raw_os_error(libc::EINVAL)),
        }
    }
    fn read_at(
        &self,
        rel: &Path,
        version: &SourceVersion,
        offset: u64,
        len: usize,
    ) -> Result<Bytes, SourceError> {
        self.call();
        self.reads.fetch_add(1, SeqCst);
        let tree = self.tree.lock().unwrap();
        let path = rel.to_owned();
        let Some((attr, e)) = tree.get(rel) else {
            return Err(SourceError::NotFound { path });
        };
        let MemEntry::File(data) = e else {
            return Err(SourceError::Io {
                path,
                source: io::Error::from_raw_os_error(libc::EISDIR),
            });
        };
        let end = offset.checked_add(len as u64);
        if attr.version() != *version || end.is_none_or(|e| e > data.len() as u64) {
            return Err(SourceError::Changed { path });
        }
        Ok(data.slice(offset as usize..offset as usize + len))
    }
    fn has_acls(&self) -> bool {
        true
    }
    fn acls(&self, rel: &Path) -> io::Result<Acls> {
        self.call();
        self.acl_calls.fetch_add(1, SeqCst);
        if !self.tree.lock().unwrap().contains_key(rel) {
            return Err(enoent());
        }
        let acls = self.acls.lock().unwrap();
        Ok(acls.get(rel).cloned().unwrap_or_default())
    }
    fn statvfs(&self) -> io::Result<libc::statvfs> {
        self.call();
        let mut st = libc::statvfs::default();
        st.f_bsize = 4096;
        st.f_frsize = 4096;
        st.f_blocks = 1000;
        st.f_namemax = 255;
        Ok(st)
    }
}
