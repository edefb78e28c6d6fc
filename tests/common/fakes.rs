//! Fakes to put behind the seams, for injecting faults and slowness only
//! (everything else in a test is real):
//!
//! - [`Hooked`]: a real directory (`DirSource`), or any source, behind a [`Hook`] that sees
//!   every call: [`SlowSource`] (latency per read and one bandwidth cap,
//!   recording what reached the source) and [`StallSource`] (every call
//!   hangs while stalled, as a hard NFS mount whose server stopped). A test
//!   writes its own hook in a few lines.
//! - [`MemSource`]: a data set in memory; [`NoSource`]: refuses and counts
//!   every call.
//! - [`MemCache`]: a `BlockStore` in memory; [`GatedCache`]: any block
//!   store whose `put`s wait at a gate the test opens.
//!
//! `tests/kit_fakes.rs` checks that each fake answers as the real thing
//! does where it does not inject anything. None of this is a user feature.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::io;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use locafs::cache::{BlockStore, CacheUsage, ChecksummedBytes, FileVersion, VersionKey};
use locafs::source::{DirSource, EntryKind, Source, SourceAttr, SourceError, SourceVersion};

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
                None => self.inner.list_with_progress(rel, &entry),
            }
        })
    }
    fn list_names(
        &self,
        rel: &Path,
        progress: &dyn Fn(),
    ) -> io::Result<Vec<locafs::source::DirName>> {
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

#[derive(Default)]
pub struct Stall {
    stalled: Mutex<bool>,
    resumed: Condvar,
    /// Calls blocked in the stall right now, and the most there were.
    pub stuck: AtomicU64,
    pub max_stuck: AtomicU64,
}

impl StallSource {
    pub fn new(root: &Path) -> Self {
        Hooked::wrap(root, Stall::default())
    }
}

impl Stall {
    /// From now on every call hangs until [`Stall::resume`].
    pub fn stall(&self) {
        *self.stalled.lock().unwrap() = true;
    }

    pub fn resume(&self) {
        *self.stalled.lock().unwrap() = false;
        self.resumed.notify_all();
    }

    fn gate(&self) {
        let mut s = self.stalled.lock().unwrap();
        if !*s {
            return;
        }
        let n = self.stuck.fetch_add(1, SeqCst) + 1;
        self.max_stuck.fetch_max(n, SeqCst);
        while *s {
            s = self.resumed.wait(s).unwrap();
        }
        self.stuck.fetch_sub(1, SeqCst);
    }
}

impl Hook for Stall {
    fn around<T>(&self, _: Call<'_>, real: impl FnOnce() -> T) -> T {
        self.gate();
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
/// ("" is the root). Each `put_file` makes a new version (new inode and
/// mtime), as replacing a file at a real source does. Answers as
/// `DirSource` does, errors included; counts calls and reads.
pub struct MemSource {
    tree: Mutex<BTreeMap<PathBuf, (SourceAttr, MemEntry)>>,
    clock: AtomicU64,
    /// Calls of every kind, and reads, so far.
    pub calls: AtomicU64,
    pub reads: AtomicU64,
}

impl Default for MemSource {
    fn default() -> Self {
        Self::new()
    }
}

impl MemSource {
    /// An empty data set (the root directory only).
    pub fn new() -> Self {
        let s = MemSource {
            tree: Mutex::new(BTreeMap::new()),
            clock: AtomicU64::new(1),
            calls: AtomicU64::new(0),
            reads: AtomicU64::new(0),
        };
        s.insert(PathBuf::new(), EntryKind::Dir, MemEntry::Dir, 0);
        s
    }

    fn insert(&self, rel: PathBuf, kind: EntryKind, e: MemEntry, size: u64) -> SourceVersion {
        let tick = self.clock.fetch_add(1, SeqCst);
        let mode = match kind {
            EntryKind::Dir => libc::S_IFDIR | 0o755,
            EntryKind::File => libc::S_IFREG | 0o644,
            EntryKind::Symlink => libc::S_IFLNK | 0o777,
            EntryKind::Other => libc::S_IFIFO | 0o644,
        };
        let attr = SourceAttr {
            kind,
            size,
            blocks: size.div_ceil(512),
            mode,
            nlink: if kind == EntryKind::Dir { 2 } else { 1 },
            uid: 0,
            gid: 0,
            rdev: 0,
            ino: tick + 1,
            atime_ns: tick as i64 * 1_000_000_007,
            mtime_ns: tick as i64 * 1_000_000_007,
            ctime_ns: tick as i64 * 1_000_000_007,
        };
        let mut tree = self.tree.lock().unwrap();
        let mut dir = rel.parent();
        while let Some(d) = dir {
            if !tree.contains_key(d) {
                let mut a = attr;
                a.kind = EntryKind::Dir;
                a.mode = libc::S_IFDIR | 0o755;
                a.size = 0;
                a.blocks = 0;
                a.nlink = 2;
                tree.insert(d.to_owned(), (a, MemEntry::Dir));
            }
            dir = d.parent();
        }
        tree.insert(rel, (attr, e));
        attr.version()
    }

    /// Creates or replaces the file `rel` (and its directories); its new
    /// version.
    pub fn put_file(&self, rel: impl AsRef<Path>, data: impl Into<Bytes>) -> SourceVersion {
        let data = data.into();
        let size = data.len() as u64;
        let rel = rel.as_ref().to_owned();
        self.insert(rel, EntryKind::File, MemEntry::File(data), size)
    }

    /// Creates the directory `rel` (and its parents).
    pub fn mkdir(&self, rel: impl AsRef<Path>) {
        self.insert(rel.as_ref().to_owned(), EntryKind::Dir, MemEntry::Dir, 0);
    }

    /// Creates the symlink `rel` pointing at `target`.
    pub fn symlink(&self, rel: impl AsRef<Path>, target: impl AsRef<Path>) {
        let target = target.as_ref().to_owned();
        let size = target.as_os_str().len() as u64;
        let rel = rel.as_ref().to_owned();
        self.insert(rel, EntryKind::Symlink, MemEntry::Symlink(target), size);
    }

    /// Removes `rel` and everything under it.
    pub fn remove(&self, rel: impl AsRef<Path>) {
        let rel = rel.as_ref();
        self.tree
            .lock()
            .unwrap()
            .retain(|p, _| !p.starts_with(rel) || rel.as_os_str().is_empty() && p == rel);
    }

    fn enoent() -> io::Error {
        io::Error::from_raw_os_error(libc::ENOENT)
    }
}

impl Source for MemSource {
    fn stat(&self, rel: &Path) -> io::Result<SourceAttr> {
        self.calls.fetch_add(1, SeqCst);
        let tree = self.tree.lock().unwrap();
        tree.get(rel).map(|(a, _)| *a).ok_or_else(Self::enoent)
    }
    fn list(&self, rel: &Path) -> io::Result<Vec<(OsString, SourceAttr)>> {
        self.calls.fetch_add(1, SeqCst);
        let tree = self.tree.lock().unwrap();
        match tree.get(rel) {
            None => return Err(Self::enoent()),
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
        self.calls.fetch_add(1, SeqCst);
        match self.tree.lock().unwrap().get(rel) {
            None => Err(Self::enoent()),
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
        self.calls.fetch_add(1, SeqCst);
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
    fn statvfs(&self) -> io::Result<libc::statvfs> {
        self.calls.fetch_add(1, SeqCst);
        let mut st = libc::statvfs::default();
        st.f_bsize = 4096;
        st.f_frsize = 4096;
        st.f_namemax = 255;
        Ok(st)
    }
}

// ------------------------------------------------------------------ caches

/// A [`BlockStore`] in memory: keeps every block it is given (no bound, no
/// eviction, no policy). It keeps no whole files for passthrough: a mount
/// over it has no [`locafs::cache::CompleteFiles`] (tests/fs adds one).
pub struct MemCache {
    block_size: u64,
    blocks: Mutex<HashMap<(VersionKey, u64), ChecksummedBytes>>,
    /// Versions marked current (`note_current`), in order.
    pub current: Mutex<Vec<VersionKey>>,
}

impl MemCache {
    pub fn new(block_size: u64) -> Self {
        MemCache {
            block_size,
            blocks: Mutex::default(),
            current: Mutex::default(),
        }
    }

    /// Caches every block of `file` (whose bytes are `data`).
    pub fn fill(&self, file: &FileVersion, data: &[u8]) {
        for (i, chunk) in data.chunks(self.block_size as usize).enumerate() {
            let block = ChecksummedBytes::from_source(Bytes::copy_from_slice(chunk));
            self.put(file, i as u64, &block);
        }
    }

    /// Drops block `index` of `key` (every block if None), as an eviction.
    pub fn drop_blocks(&self, key: &VersionKey, index: Option<u64>) {
        let mut blocks = self.blocks.lock().unwrap();
        blocks.retain(|(k, i), _| k != key || index.is_some_and(|x| x != *i));
    }

    /// The indices of the blocks held for `file`, sorted.
    pub fn stored(&self, file: &FileVersion) -> Vec<u64> {
        let blocks = self.blocks.lock().unwrap();
        let mut v: Vec<u64> = blocks
            .keys()
            .filter(|(k, _)| *k == file.key)
            .map(|(_, i)| *i)
            .collect();
        v.sort();
        v
    }
}

impl BlockStore for MemCache {
    fn get(&self, file: &FileVersion, index: u64) -> Option<ChecksummedBytes> {
        self.blocks.lock().unwrap().get(&(file.key, index)).cloned()
    }
    fn put(&self, file: &FileVersion, index: u64, block: &ChecksummedBytes) -> bool {
        let mut blocks = self.blocks.lock().unwrap();
        blocks.insert((file.key, index), block.clone());
        true
    }
    fn is_block_cached(&self, file: &FileVersion, index: u64) -> bool {
        self.blocks.lock().unwrap().contains_key(&(file.key, index))
    }
    fn is_complete(&self, file: &FileVersion) -> bool {
        let blocks = self.blocks.lock().unwrap();
        (0..file.block_count(self.block_size)).all(|i| blocks.contains_key(&(file.key, i)))
    }
    fn note_current(&self, file: &FileVersion) {
        self.current.lock().unwrap().push(file.key);
    }
    fn usage(&self) -> CacheUsage {
        let blocks = self.blocks.lock().unwrap();
        let mut files: Vec<VersionKey> = blocks.keys().map(|(k, _)| *k).collect();
        files.sort();
        files.dedup();
        CacheUsage {
            used_bytes: blocks.values().map(|b| b.data().len() as u64).sum(),
            capacity_bytes: u64::MAX,
            files_cached: files.len() as u64,
            evictions: 0,
            writable: true,
        }
    }
    fn has_room_for(&self, _: &FileVersion) -> bool {
        true
    }
}

/// A cache whose `put`s (all kinds) wait until the test opens the gate;
/// everything else goes straight to the cache inside.
pub struct GatedCache<C = MemCache> {
    pub inner: C,
    open: Mutex<bool>,
    opened: Condvar,
    /// `put`s waiting at the gate right now.
    pub waiting: AtomicU64,
}

impl<C> GatedCache<C> {
    /// A closed gate in front of `inner`.
    pub fn new(inner: C) -> Self {
        GatedCache {
            inner,
            open: Mutex::new(false),
            opened: Condvar::new(),
            waiting: AtomicU64::new(0),
        }
    }

    pub fn open_gate(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }

    pub fn close_gate(&self) {
        *self.open.lock().unwrap() = false;
    }

    fn pass(&self) {
        let mut open = self.open.lock().unwrap();
        self.waiting.fetch_add(1, SeqCst);
        while !*open {
            open = self.opened.wait(open).unwrap();
        }
        self.waiting.fetch_sub(1, SeqCst);
    }
}

impl<C: BlockStore> BlockStore for GatedCache<C> {
    fn get(&self, file: &FileVersion, index: u64) -> Option<ChecksummedBytes> {
        self.inner.get(file, index)
    }
    fn put(&self, file: &FileVersion, index: u64, block: &ChecksummedBytes) -> bool {
        self.pass();
        self.inner.put(file, index, block)
    }
    fn put_guest(&self, file: &FileVersion, index: u64, block: &ChecksummedBytes) -> bool {
        self.pass();
        self.inner.put_guest(file, index, block)
    }
    fn put_ahead(
        &self,
        file: &FileVersion,
        index: u64,
        block: &ChecksummedBytes,
        guest: bool,
    ) -> bool {
        self.pass();
        self.inner.put_ahead(file, index, block, guest)
    }
    fn is_block_cached(&self, file: &FileVersion, index: u64) -> bool {
        self.inner.is_block_cached(file, index)
    }
    fn is_complete(&self, file: &FileVersion) -> bool {
        self.inner.is_complete(file)
    }
    fn note_current(&self, file: &FileVersion) {
        self.inner.note_current(file)
    }
    fn record_access(&self, file: &FileVersion, bytes: u64) {
        self.inner.record_access(file, bytes)
    }
    fn usage(&self) -> CacheUsage {
        self.inner.usage()
    }
    fn has_room_for(&self, file: &FileVersion) -> bool {
        self.inner.has_room_for(file)
    }
}
