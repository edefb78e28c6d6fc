//! In-memory fakes behind the core's seams: a source tree that can change
//! and stall, the complete-file side of the kit's block cache in memory
//! (`MemCache`), counting pins, and a kernel that registers passthrough
//! backings (or refuses to).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex};

use bytes::Bytes;
use locafs::cache::{BlockStore, CompleteFiles, DroppedHook, FileVersion, VersionKey};
use locafs::source::{Acls, EntryKind, Source, SourceAttr, SourceError, SourceVersion};

pub use crate::common::fakes::MemCache;

fn enoent() -> io::Error {
    io::Error::from_raw_os_error(libc::ENOENT)
}

fn attr(kind: EntryKind, size: u64, ino: u64, mtime_ns: i64) -> SourceAttr {
    let mode = match kind {
        EntryKind::Dir => libc::S_IFDIR | 0o755,
        EntryKind::File => libc::S_IFREG | 0o644,
        EntryKind::Symlink => libc::S_IFLNK | 0o777,
        EntryKind::Other => libc::S_IFIFO | 0o644,
    };
    SourceAttr {
        kind,
        size,
        blocks: size.div_ceil(512),
        mode,
        nlink: 1,
        uid: 0,
        gid: 0,
        rdev: 0,
        ino,
        atime_ns: mtime_ns,
        mtime_ns,
        ctime_ns: mtime_ns,
    }
}

#[derive(Clone)]
struct Entry {
    attr: SourceAttr,
    data: Bytes,
    target: PathBuf,
}

/// A source tree in memory. Every change gives the entry a new mtime;
/// `hold` makes every call wait until `resume` (a stalled source).
pub struct MemSource {
    tree: Mutex<BTreeMap<PathBuf, Entry>>,
    clock: AtomicU64,
    held: Mutex<bool>,
    resumed: Condvar,
    /// Calls waiting at the hold.
    pub waiting: AtomicU64,
    /// `stat` and `list` calls.
    pub metadata_calls: AtomicU64,
    /// POSIX ACLs by path (entries not here have none).
    acls: Mutex<HashMap<PathBuf, Acls>>,
    /// `acls` calls.
    pub acl_calls: AtomicU64,
}

impl MemSource {
    pub fn new() -> Arc<Self> {
        let s = MemSource {
            tree: Mutex::default(),
            clock: AtomicU64::new(1),
            held: Mutex::new(false),
            resumed: Condvar::new(),
            waiting: AtomicU64::new(0),
            metadata_calls: AtomicU64::new(0),
            acls: Mutex::default(),
            acl_calls: AtomicU64::new(0),
        };
        s.put(Path::new(""), EntryKind::Dir, Bytes::new(), PathBuf::new());
        Arc::new(s)
    }

    fn put(&self, rel: &Path, kind: EntryKind, data: Bytes, target: PathBuf) {
        let t = self.clock.fetch_add(1, SeqCst);
        let mut tree = self.tree.lock().unwrap();
        // An entry keeps its inode number across changes of content.
        let ino = tree.get(rel).map_or(1000 + t, |e| e.attr.ino);
        let a = attr(kind, data.len() as u64, ino, t as i64 * 1_000_000_007);
        tree.insert(
            rel.to_owned(),
            Entry {
                attr: a,
                data,
                target,
            },
        );
    }

    /// Creates or changes a file (and its parent directories).
    pub fn write(&self, rel: &str, data: &[u8]) {
        let rel = Path::new(rel);
        let mut dir = rel.parent();
        while let Some(d) = dir.filter(|d| !d.as_os_str().is_empty()) {
            if !self.tree.lock().unwrap().contains_key(d) {
                self.put(d, EntryKind::Dir, Bytes::new(), PathBuf::new());
            }
            dir = d.parent();
        }
        self.put(
            rel,
            EntryKind::File,
            Bytes::copy_from_slice(data),
            PathBuf::new(),
        );
    }

    pub fn symlink(&self, rel: &str, target: &str) {
        self.put(
            Path::new(rel),
            EntryKind::Symlink,
            Bytes::new(),
            target.into(),
        );
    }

    pub fn remove(&self, rel: &str) {
        self.tree.lock().unwrap().remove(Path::new(rel));
    }

    /// Sets (or, with none, removes) the POSIX ACLs of `rel`.
    pub fn set_acls(&self, rel: &str, acls: Acls) {
        self.acls.lock().unwrap().insert(rel.into(), acls);
    }

    /// The version of a file as the source has it now.
    pub fn version(&self, rel: &str) -> SourceVersion {
        self.tree.lock().unwrap()[Path::new(rel)].attr.version()
    }

    /// Every call waits from now on until [`MemSource::resume`].
    pub fn hold(&self) {
        *self.held.lock().unwrap() = true;
    }

    pub fn resume(&self) {
        *self.held.lock().unwrap() = false;
        self.resumed.notify_all();
    }

    fn gate(&self) {
        let mut held = self.held.lock().unwrap();
        if *held {
            self.waiting.fetch_add(1, SeqCst);
            while *held {
                held = self.resumed.wait(held).unwrap();
            }
            self.waiting.fetch_sub(1, SeqCst);
        }
    }
}

impl Source for MemSource {
    fn stat(&self, rel: &Path) -> io::Result<SourceAttr> {
        self.gate();
        self.metadata_calls.fetch_add(1, SeqCst);
        let tree = self.tree.lock().unwrap();
        tree.get(rel).map(|e| e.attr).ok_or_else(enoent)
    }

    fn list(&self, rel: &Path) -> io::Result<Vec<(OsString, SourceAttr)>> {
        self.gate();
        self.metadata_calls.fetch_add(1, SeqCst);
        let tree = self.tree.lock().unwrap();
        let dir = tree.get(rel).ok_or_else(enoent)?;
        if dir.attr.kind != EntryKind::Dir {
            return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        Ok(tree
            .iter()
            .filter(|(p, _)| p.parent() == Some(rel) && !p.as_os_str().is_empty())
            .map(|(p, e)| (p.file_name().unwrap().to_owned(), e.attr))
            .collect())
    }

    fn read_link(&self, rel: &Path) -> io::Result<PathBuf> {
        self.gate();
        let tree = self.tree.lock().unwrap();
        match tree.get(rel) {
            Some(e) if e.attr.kind == EntryKind::Symlink => Ok(e.target.clone()),
            Some(_) => Err(io::Error::from_raw_os_error(libc::EINVAL)),
            None => Err(enoent()),
        }
    }

    fn read_at(
        &self,
        rel: &Path,
        version: &SourceVersion,
        offset: u64,
        len: usize,
    ) -> Result<Bytes, SourceError> {
        self.gate();
        let tree = self.tree.lock().unwrap();
        let e = tree.get(rel).ok_or_else(|| SourceError::NotFound {
            path: rel.to_owned(),
        })?;
        if e.attr.version() != *version {
            return Err(SourceError::Changed {
                path: rel.to_owned(),
            });
        }
        let start = (offset as usize).min(e.data.len());
        let end = (start + len).min(e.data.len());
        if end - start != len {
            return Err(SourceError::Changed {
                path: rel.to_owned(),
            });
        }
        Ok(e.data.slice(start..end))
    }

    fn has_acls(&self) -> bool {
        true
    }

    fn acls(&self, rel: &Path) -> io::Result<Acls> {
        self.gate();
        self.acl_calls.fetch_add(1, SeqCst);
        if !self.tree.lock().unwrap().contains_key(rel) {
            return Err(enoent());
        }
        Ok(self
            .acls
            .lock()
            .unwrap()
            .get(rel)
            .cloned()
            .unwrap_or_default())
    }

    fn statvfs(&self) -> io::Result<libc::statvfs> {
        self.gate();
        // SAFETY: statvfs is plain old data; all zeroes is a valid value.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        s.f_bsize = 4096;
        s.f_blocks = 1000;
        s.f_namemax = 255;
        Ok(s)
    }
}

/// The complete-file side of a [`MemCache`]: counts the pins of each file
/// version as the disk cache keeps them (`open_complete` and `pin_complete`
/// take one, `unpin` gives one back), and calls the dropped-file hook when
/// a test drops a file.
pub struct MemComplete {
    pub cache: Arc<MemCache>,
    pins: Mutex<HashMap<VersionKey, i64>>,
    /// An unpin of a file with no pin (a pin given back twice).
    pub unpin_underflow: AtomicBool,
    hook: Mutex<Option<DroppedHook>>,
}

impl MemComplete {
    pub fn new(cache: Arc<MemCache>) -> Arc<Self> {
        Arc::new(MemComplete {
            cache,
            pins: Mutex::default(),
            unpin_underflow: AtomicBool::new(false),
            hook: Mutex::default(),
        })
    }

    /// Drops a file from the cache (evicted), telling the hook.
    pub fn drop_file(&self, key: &VersionKey) {
        self.cache.drop_blocks(key, None);
        if let Some(hook) = &*self.hook.lock().unwrap() {
            hook(key);
        }
    }

    pub fn pins(&self, key: &VersionKey) -> i64 {
        self.pins.lock().unwrap().get(key).copied().unwrap_or(0)
    }

    /// Pins of every version together.
    pub fn all_pins(&self) -> i64 {
        self.pins.lock().unwrap().values().sum()
    }
}

impl CompleteFiles for MemComplete {
    fn open_complete(&self, file: &FileVersion) -> Option<File> {
        // Any open file will do: the fake kernel never reads it.
        let f = File::open("/dev/null").ok()?;
        self.pin_complete(file).then_some(f)
    }
    fn pin_complete(&self, file: &FileVersion) -> bool {
        let whole = self.cache.is_complete(file);
        if whole {
            *self.pins.lock().unwrap().entry(file.key).or_default() += 1;
        }
        whole
    }
    fn unpin(&self, file: &FileVersion) {
        let mut pins = self.pins.lock().unwrap();
        let n = pins.entry(file.key).or_default();
        if *n == 0 {
            self.unpin_underflow.store(true, SeqCst);
        } else {
            *n -= 1;
        }
    }
    fn on_file_dropped(&self, hook: DroppedHook) {
        *self.hook.lock().unwrap() = Some(hook);
    }
}

/// A backing registered with the fake kernel; unregistered when dropped
/// (as fuser's `BackingId` is).
#[derive(Debug)]
pub struct Backing {
    pub id: u64,
    kernel: Arc<Kernel>,
}

impl Drop for Backing {
    fn drop(&mut self) {
        self.kernel.live.lock().unwrap().remove(&self.id);
    }
}

/// The kernel's side of passthrough: which backings are registered.
#[derive(Debug, Default)]
pub struct Kernel {
    next: AtomicU64,
    live: Mutex<HashSet<u64>>,
    /// Registrations asked for (granted or not).
    pub asked: AtomicU64,
    /// Refuse every registration (a kernel without passthrough).
    pub refuse: AtomicBool,
}

impl Kernel {
    pub fn register(self: &Arc<Self>, _file: &File) -> io::Result<Backing> {
        self.asked.fetch_add(1, SeqCst);
        if self.refuse.load(SeqCst) {
            return Err(io::Error::from_raw_os_error(libc::EPERM));
        }
        let id = self.next.fetch_add(1, SeqCst) + 1;
        self.live.lock().unwrap().insert(id);
        Ok(Backing {
            id,
            kernel: Arc::clone(self),
        })
    }

    /// Backings registered and not dropped.
    pub fn live(&self) -> usize {
        self.live.lock().unwrap().len()
    }
}
