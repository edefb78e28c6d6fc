//! The file system the kernel talks to. This file is its semantics without
//! FUSE (`FsCore`); `fuse` is the adapter, which translates and nothing
//! else; `handles` and `handle_store` are the open files and their
//! passthrough backings (kept in the shared state, so a new server answers
//! for the old one's handles).
//!
//! The file system's semantics, without FUSE: what every request means and
//! in what order it touches the namespace, the cache, the open-file table,
//! read-ahead and stats. The open protocol lives here: revalidation, the
//! choice of mode (passthrough for a fully cached, verified file, else
//! cached), the backing prepared with its cache pin, backings kept after
//! the last close, handles of reads without one (the kernel open mode),
//! EROFS, and the stats of opens. The FUSE adapter (fuse.rs) translates the
//! kernel's requests into calls on [`FsCore`] and the answers into replies;
//! a kernel backing is a type `B` the core never looks into, made by the
//! adapter's [`OpenReply::register_backing`] (tests use a fake one).
//!
//! Answers go to a reply given with each request (a closure, or one of the
//! small reply traits here). A request the core can answer from what is
//! local is answered before the call returns; one that needs the source is
//! answered from a task on the runtime (the blocking pool where it may
//! verify a cached file), so the caller's thread (a FUSE thread) never
//! waits on the source. It never panics; every error is an `io::Error`
//! with the errno of that one request. Every request that would change the
//! tree gets EROFS.

pub mod fuse;
pub mod handle_store;
pub mod handles;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use bytes::Bytes;
use parking_lot::Mutex;
use tracing::warn;

use crate::cache::{CompleteFiles, FileVersion};
use crate::fs::handle_store::UNIQUE_RESEND;
use crate::fs::handles::{Handle, InodeHandles, OpenFiles, OpenMode, Prepared};
use crate::meta::namespace::{Ask, Namespace, Step, ROOT};
use crate::obs::stats::Stats;
use crate::read::prefetch::ReadAhead;
use crate::read::reader::Reader;
use crate::source::{SourceAttr, SourceVersion};

/// At most one "read failed" line a second: a source that goes down must not
/// flood the log (failed reads are counted in stats).
static READ_FAILURES: crate::obs::logging::RateLimit = crate::obs::logging::RateLimit::new(1000);

/// Inodes per generation of the table of reads without a handle (kernel
/// open mode): at most twice this many are kept.
const INODE_HANDLES: usize = 4096;

/// Entries a READDIRPLUS stats at most before it answers (a reply of 32
/// KiB, what glibc asks for, holds about 190 ImageNet-like names; a longer
/// one ends early and the kernel asks for the rest).
const PLUS_BATCH: usize = 256;
/// Entries the first READDIRPLUS of a listing answers at most, and only
/// those already known: it stats none at the source. Under
/// `FUSE_READDIRPLUS_AUTO` the kernel asks for READDIRPLUS at the start of
/// every directory, also when nothing will look at the attributes (`find`,
/// an image-folder scan); it goes on with plain READDIR from where the
/// reply ended, unless lookups follow, and then asks for READDIRPLUS again
/// (of `PLUS_BATCH`, stat-ed in parallel). Stat-ing even 32 entries of
/// every directory there made a cold walk of 1 M files twice as slow (2.5
/// s against 1.3 s, most of it the daemon's CPU in the source calls), and
/// a walk over a known tree (after a remount) is slower when every reply
/// holds many entries: the kernel makes an inode and a dentry of each
/// entry of a READDIRPLUS reply (up to a 32 KiB buffer, about 200 entries;
/// 2.5-3x slower then).
const PLUS_FIRST: usize = 32;
/// Stats of one READDIRPLUS in flight at once (the guard runs at most
/// `METADATA_THREADS` metadata calls; more queue there).
const PLUS_PARALLEL: usize = 32;
/// Entries after a looked-up one stat-ed ahead when lookups follow the
/// listing's order ([`Namespace::ahead_asks`]).
const STAT_AHEAD: usize = 64;

/// The extended attribute of the root that names the control socket
/// (`control.rs` serves it; its value is `@` and the abstract name).
pub const CONTROL_XATTR: &str = "user.locafs.control";

/// The extended attribute of the mount root that returns `stats` as JSON.
pub const STATS_XATTR: &str = "user.locafs.stats";
/// The extended attribute of the mount root that returns the serving
/// process's pid, answered from a task on the runtime: the watchdog of the
/// process holding the mount asks it (`supervisor::watchdog`).
pub const PING_XATTR: &str = "user.locafs.ping";

/// Settings of the core that come from the command line.
#[derive(Clone, Debug, Default)]
pub struct FsOptions {
    pub source_label: String,
    pub mount_label: String,
    /// Path of the control socket (the `user.locafs.control` attribute).
    pub control_socket: String,
}

/// An open's answer: the handle number and its mode.
#[derive(Debug)]
pub struct Opened<B> {
    pub fh: u64,
    pub mode: OpenMode<B>,
}

/// The reply to an OPEN. Only it can register a cached file with the kernel
/// as a passthrough backing (`B`: the adapter's backing id; dropping it
/// unregisters it).
pub trait OpenReply<B>: Send + 'static {
    /// Registers `file` as a backing for passthrough.
    fn register_backing(&self, file: &File) -> io::Result<B>;
    fn done(self, r: io::Result<Opened<B>>);
    /// The kernel's id of the OPEN request (its `unique`, with
    /// [`UNIQUE_RESEND`] set when the kernel sends it again after a server
    /// died); 0 where there is none.
    fn request_id(&self) -> u64 {
        0
    }
}

/// Where the core records the handles it hands out, so that a server
/// started after this one dies answers for them (fuse.rs puts the shared
/// state's `HandleStore` behind it). Without one, handles die with the
/// process.
pub trait HandleJournal<B>: Send + Sync {
    /// Handle `fh` of `ino` at `version` in `mode`, opened by request
    /// `unique`: called before the OPEN's reply.
    fn opened(&self, fh: u64, ino: u64, version: &SourceVersion, mode: &OpenMode<B>, unique: u64);
    /// Handle `fh` was released.
    fn released(&self, fh: u64);
}

/// A handle an earlier server of this mount handed the kernel, to put
/// back in the open table ([`FsCore::restore_handles`]).
pub struct Restored<B> {
    pub fh: u64,
    pub ino: u64,
    pub version: SourceVersion,
    /// Its inode's backing, if it reads in passthrough.
    pub backing: Option<Arc<B>>,
    pub keep_cache: bool,
    /// The OPEN's request id (without the resend bit).
    pub unique: u64,
}

/// The reply to a READDIR.
pub trait DirReply: Send + 'static {
    /// Adds an entry (`next`: the offset of the one after it); true when
    /// the reply is full. `attr` is None for "." and "..": directories
    /// whose attributes a plain listing does not look up.
    fn add(&mut self, ino: u64, next: u64, name: &OsStr, attr: Option<&SourceAttr>) -> bool;
    fn done(self, r: io::Result<()>);
}

/// The reply to a READDIRPLUS.
pub trait DirPlusReply: Send + 'static {
    /// Adds an entry with its attributes (`next`: the offset of the one
    /// after it); true when the reply is full.
    fn add(&mut self, ino: u64, next: u64, name: &OsStr, attr: &SourceAttr) -> bool;
    /// Adds an entry whose attributes could not be read in time: only
    /// `attr`'s kind and source inode are right. The kernel must not keep
    /// them: the FUSE adapter hands them out valid for no time at all, so
    /// that any use asks again (LOOKUP, GETATTR). The default is `add`.
    fn add_unstated(&mut self, ino: u64, next: u64, name: &OsStr, attr: &SourceAttr) -> bool {
        self.add(ino, next, name, attr)
    }
    fn done(self, r: io::Result<()>);
}

/// One pin of a complete cached file, taken by
/// [`CompleteFiles::open_complete`] or [`CompleteFiles::pin_complete`]:
/// given back when dropped, so that every path that does not hand it over
/// (to the open table, with the backing it keeps readable) unpins exactly
/// once. (Weak: the cache's dropped-file hook holds the open table, which
/// holds pins.)
pub struct CachePin {
    /// None: no pin was taken (a restored passthrough whose file the cache
    /// no longer holds whole).
    cache: Option<Weak<dyn CompleteFiles>>,
    file: Arc<FileVersion>,
}

impl CachePin {
    /// Owns the pin the caller just took on `file`.
    fn taken(cache: &Arc<dyn CompleteFiles>, file: &Arc<FileVersion>) -> Self {
        CachePin {
            cache: Some(Arc::downgrade(cache)),
            file: Arc::clone(file),
        }
    }

    /// Stands for a pin that could not be taken: gives nothing back.
    fn missing(file: &Arc<FileVersion>) -> Self {
        CachePin {
            cache: None,
            file: Arc::clone(file),
        }
    }
}

impl Drop for CachePin {
    fn drop(&mut self) {
        if let Some(cache) = self.cache.as_ref().and_then(Weak::upgrade) {
            cache.unpin(&self.file);
        }
    }
}

fn err(errno: i32) -> io::Error {
    io::Error::from_raw_os_error(errno)
}

/// The file system of one mount, over kernel backings of type `B`.
pub struct FsCore<B> {
    ns: Arc<Namespace>,
    reader: Arc<Reader>,
    /// The cache's whole files, for passthrough (None: it keeps none, and
    /// every file is opened through the daemon).
    complete: Option<Arc<dyn CompleteFiles>>,
    files: Arc<OpenFiles<B, CachePin>>,
    /// Handles of reads without one (the kernel open mode).
    inode_handles: InodeHandles,
    stats: Arc<Stats>,
    rt: tokio::runtime::Handle,
    opts: FsOptions,
    passthrough: AtomicBool,
    /// The kernel open mode is on (and the kernel can open without us).
    kernel_open: AtomicBool,
    readahead: Arc<ReadAhead>,
    /// Where handles are recorded to outlive this process.
    journal: OnceLock<Arc<dyn HandleJournal<B>>>,
    /// Handles an earlier server made whose OPEN the kernel may send
    /// again: an OPEN sent again gets the handle already made for it.
    /// Each entry goes with that OPEN or with its handle's RELEASE (the
    /// kernel had the reply, so it never sends the OPEN again).
    resent: Mutex<Resent>,
    /// `resent` holds an entry (RELEASE takes its lock only then).
    resent_left: AtomicBool,
}

/// [`FsCore::resent`]: the handles restored with their OPEN's request id,
/// by request id and by handle.
#[derive(Default)]
struct Resent {
    by_unique: HashMap<u64, (u64, bool)>,
    by_fh: HashMap<u64, u64>,
}

impl Resent {
    fn insert(&mut self, unique: u64, fh: u64, keep_cache: bool) {
        if let Some((old, _)) = self.by_unique.insert(unique, (fh, keep_cache)) {
            self.by_fh.remove(&old);
        }
        if let Some(old) = self.by_fh.insert(fh, unique) {
            if old != unique {
                self.by_unique.remove(&old);
            }
        }
    }

    fn take_unique(&mut self, unique: u64) -> Option<(u64, bool)> {
        let made = self.by_unique.remove(&unique)?;
        self.by_fh.remove(&made.0);
        Some(made)
    }

    fn take_fh(&mut self, fh: u64) {
        if let Some(unique) = self.by_fh.remove(&fh) {
            self.by_unique.remove(&unique);
        }
    }

    fn is_empty(&self) -> bool {
        self.by_unique.is_empty()
    }
}

impl<B: Send + Sync + 'static> FsCore<B> {
    /// The core of a mount, with passthrough and the kernel open mode off
    /// until the adapter learns that the kernel offers them. `complete` is
    /// the complete-file side of the cache behind `reader` (the same disk
    /// cache), or None for a cache that keeps no whole files.
    pub fn new(
        ns: Arc<Namespace>,
        reader: Arc<Reader>,
        complete: Option<Arc<dyn CompleteFiles>>,
        stats: Arc<Stats>,
        rt: tokio::runtime::Handle,
        opts: FsOptions,
        readahead: Arc<ReadAhead>,
    ) -> Arc<Self> {
        let files: Arc<OpenFiles<B, CachePin>> = Arc::default();
        // Backings kept after their inode's last close name the cached file:
        // dropped as soon as it goes (or the kernel would keep its space and
        // read holes where blocks were dropped).
        if let Some(complete) = &complete {
            let (kept, gauge) = (Arc::clone(&files), Arc::clone(&stats));
            complete.on_file_dropped(Box::new(move |key| {
                kept.forget_idle(key);
                publish_kept(&kept, &gauge);
            }));
        }
        Arc::new(FsCore {
            ns,
            reader,
            complete,
            files,
            inode_handles: InodeHandles::new(INODE_HANDLES),
            stats,
            rt,
            opts,
            passthrough: AtomicBool::new(false),
            kernel_open: AtomicBool::new(false),
            readahead,
            journal: OnceLock::new(),
            resent: Mutex::default(),
            resent_left: AtomicBool::new(false),
        })
    }

    /// Records every handle from now on in `journal` (once; a second is
    /// ignored).
    pub fn set_journal(&self, journal: Arc<dyn HandleJournal<B>>) {
        let _ = self.journal.set(journal);
    }

    /// Puts back the handles an earlier server of this mount handed the
    /// kernel (a server restarted over a live mount): each on the version
    /// it opened, a passthrough one with its inode's backing and a pin on
    /// the cached file the kernel reads. Returns how many were put back
    /// (a handle of an inode the namespace no longer has is dropped: no
    /// request can name it).
    pub fn restore_handles(&self, saved: Vec<Restored<B>>) -> usize {
        let mut n = 0;
        for r in saved {
            let rel = match self.ns.path(r.ino) {
                Ok(p) => p,
                Err(e) => {
                    warn!(ino = r.ino, "open handle of an unknown inode dropped: {e}");
                    continue;
                }
            };
            let file = Arc::new(FileVersion::new(Arc::from(rel), r.version));
            let prepared = r.backing.map(|backing| {
                let pin = match &self.complete {
                    Some(c) if c.pin_in_use(&file) => CachePin::taken(c, &file),
                    _ => {
                        warn!(file = %file.rel.display(), "a file open in passthrough is no longer whole in the cache");
                        CachePin::missing(&file)
                    }
                };
                Prepared { backing, pin }
            });
            let passthrough = prepared.is_some();
            self.files.restore(r.fh, r.ino, file, prepared);
            if r.unique != 0 {
                self.resent.lock().insert(r.unique, r.fh, r.keep_cache);
                self.resent_left.store(true, Ordering::Release);
            }
            self.stats.open_handles.fetch_add(1, Ordering::Relaxed);
            if passthrough {
                self.stats.passthrough_opens.fetch_add(1, Ordering::Relaxed);
            }
            n += 1;
        }
        n
    }

    /// The kernel takes passthrough backings: fully cached files open in
    /// passthrough from now on.
    pub fn enable_passthrough(&self) {
        self.passthrough.store(true, Ordering::Relaxed);
    }

    /// The kernel opens files without asking: OPEN gets ENOSYS (the kernel's
    /// signal to stop sending it) and reads come without a handle.
    pub fn enable_kernel_open(&self) {
        self.kernel_open.store(true, Ordering::Relaxed);
    }

    /// Runs work that may wait on the source on the runtime's blocking
    /// pool, so that the caller's thread never waits on the source (the
    /// wait there is bounded by the source guard's deadline).
    fn off_thread(&self, f: impl FnOnce() + Send + 'static) {
        self.rt.spawn_blocking(f);
    }

    /// `name` in directory `parent`: its inode and attributes.
    pub fn lookup(
        &self,
        parent: u64,
        name: &OsStr,
        reply: impl FnOnce(io::Result<(u64, SourceAttr)>) + Send + 'static,
    ) {
        // The kernel holds every inode it is given until it forgets it.
        let counted = Arc::clone(&self.ns);
        let reply = move |r: io::Result<(u64, SourceAttr)>| {
            if let Ok((ino, _)) = &r {
                counted.looked_up(*ino);
            }
            reply(r)
        };
        match self.ns.lookup_local(parent, name) {
            Step::Done(r) => reply(r),
            Step::Ask(ask) => {
                let ahead = self.ns.ahead_asks(parent, name, STAT_AHEAD);
                if !ahead.is_empty() {
                    let ns = Arc::clone(&self.ns);
                    self.rt.spawn(async move { stat_entries(&ns, ahead).await });
                }
                // Answered by the metadata worker that gets the source's
                // answer: one hand-off (this thread to the worker), not
                // three (to the runtime, the worker, the runtime again).
                let (ns, name) = (Arc::clone(&self.ns), name.to_owned());
                self.ask_then(ask, move |ask, r| {
                    reply(ns.lookup_answer(parent, &name, ask, r))
                });
            }
        }
    }

    /// An inode's attributes, revalidated when stale.
    pub fn getattr(&self, ino: u64, reply: impl FnOnce(io::Result<SourceAttr>) + Send + 'static) {
        match self.ns.getattr_local(ino) {
            Step::Done(r) => reply(r),
            Step::Ask(ask) => {
                let ns = Arc::clone(&self.ns);
                self.ask_then(ask, move |ask, r| reply(ns.getattr_answer(ino, ask, r)));
            }
        }
    }

    /// Puts `ask` to the source without holding the caller's thread and
    /// hands `answer` the source's answer: a stat from the metadata worker
    /// that gets it, a listing of the parent directory (shared by every
    /// entry that waits on it) from a task.
    fn ask_then(
        &self,
        ask: Ask,
        answer: impl FnOnce(Ask, io::Result<SourceAttr>) + Send + 'static,
    ) {
        if !ask.by_listing() {
            return self.ns.stat_then(ask, answer);
        }
        let ns = Arc::clone(&self.ns);
        self.rt.spawn(async move {
            let r = ns.stat_for(&ask).await;
            answer(ask, r)
        });
    }

    /// A symlink's target: asked of the source every time (the kernel
    /// caches the answer).
    pub fn readlink(&self, ino: u64, reply: impl FnOnce(io::Result<PathBuf>) + Send + 'static) {
        let ns = Arc::clone(&self.ns);
        self.off_thread(move || reply(ns.read_link(ino)));
    }

    /// `statvfs` of the source.
    pub fn statfs(&self, reply: impl FnOnce(io::Result<libc::statvfs>) + Send + 'static) {
        let ns = Arc::clone(&self.ns);
        self.off_thread(move || reply(ns.statfs()));
    }

    /// Opens a file: EROFS for write access; its attributes revalidated
    /// first if stale (without holding the caller's thread), then its mode
    /// and handle.
    pub fn open(self: &Arc<Self>, ino: u64, write: bool, reply: impl OpenReply<B>) {
        if write {
            return reply.done(Err(err(libc::EROFS)));
        }
        let unique = reply.request_id();
        if unique & UNIQUE_RESEND != 0 {
            // Sent again: the server that died may have made its handle.
            let made = self.take_resent(|r| r.take_unique(unique & !UNIQUE_RESEND));
            if let Some((fh, keep)) = made {
                if let Some(mode) = self.files.mode_of(fh, keep) {
                    return reply.done(Ok(Opened { fh, mode }));
                }
            }
        }
        match self.ns.getattr_local(ino) {
            Step::Done(a) => {
                let file = a.and_then(|a| self.ns.file_with(ino, a));
                self.open_file(ino, file, reply)
            }
            Step::Ask(_) => {
                // Revalidation first, without holding a thread; the rest
                // (which may verify a cached file) on the blocking pool.
                let core = Arc::clone(self);
                self.rt.spawn(async move {
                    let file = core.ns.open_file_async(ino).await;
                    let c = Arc::clone(&core);
                    core.rt
                        .spawn_blocking(move || c.open_file(ino, file, reply));
                });
            }
        }
    }

    /// The rest of an OPEN once the file's attributes are known: its mode
    /// (passthrough for a fully cached file, else cached), its handle.
    fn open_file(
        &self,
        ino: u64,
        file: io::Result<(Arc<Path>, SourceAttr)>,
        reply: impl OpenReply<B>,
    ) {
        let (rel, a) = match file {
            Ok(x) => x,
            Err(e) => return reply.done(Err(e)),
        };
        if self.kernel_open.load(Ordering::Relaxed) {
            // The kernel sets no_open for the connection: no OPEN or
            // RELEASE for files from now on, reads come with handle 0.
            return reply.done(Err(err(libc::ENOSYS)));
        }
        let file = Arc::new(FileVersion::new(rel, a.version()));
        let cache = self.reader.cache();
        self.stats.opens.fetch_add(1, Ordering::Relaxed);
        // Two opens may both find the inode idle and both prepare a backing:
        // the table keeps one, and drops the other with its pin.
        let prepared =
            if self.passthrough.load(Ordering::Relaxed) && a.size > 0 && self.files.is_idle(ino) {
                self.prepare_backing(&reply, ino, &file)
            } else {
                None
            };
        let version = a.version();
        let keep_cache = self.ns.opened_at(ino, &version);
        let opened = self
            .files
            .open(ino, Arc::clone(&file), prepared, keep_cache);
        if opened.is_ok() {
            self.ns.note_opened(ino, &version);
            if !keep_cache {
                // Older versions of this path are stale from now on.
                cache.note_current(&file);
            }
        }
        match opened {
            Ok((fh, mode)) => {
                let passthrough = matches!(mode, OpenMode::Passthrough(_));
                // Recorded before the kernel has the number.
                if let Some(j) = self.journal.get() {
                    j.opened(fh, ino, &version, &mode, reply.request_id());
                }
                self.readahead.on_open(ino, &file, passthrough);
                self.stats.open_handles.fetch_add(1, Ordering::Relaxed);
                if passthrough {
                    self.stats.passthrough_opens.fetch_add(1, Ordering::Relaxed);
                }
                reply.done(Ok(Opened { fh, mode }));
            }
            Err(_) => {
                warn!(file = %file.rel.display(), "file changed at the source while open in passthrough mode; retry once it is closed");
                reply.done(Err(err(libc::EBUSY)));
            }
        }
    }

    /// A verified backing file for passthrough, if the file is fully cached:
    /// the one kept from the inode's previous open of this version if the
    /// cache still holds the file whole, else a new one; with the pin that
    /// keeps the file in the cache (given back when dropped).
    fn prepare_backing(
        &self,
        reply: &impl OpenReply<B>,
        ino: u64,
        file: &Arc<FileVersion>,
    ) -> Option<Prepared<B, CachePin>> {
        // (A cache that keeps no whole files never handed out a backing to
        // keep either.)
        let cache = self.complete.as_ref()?;
        if let Some(backing) = self.files.take_idle(ino, &file.key) {
            publish_kept(&self.files, &self.stats);
            if cache.pin_complete(file) {
                let pin = CachePin::taken(cache, file);
                return Some(Prepared { backing, pin });
            }
            // No longer whole: the kept backing goes.
        }
        let f = cache.open_complete(file)?;
        let pin = CachePin::taken(cache, file);
        match reply.register_backing(&f) {
            Ok(id) => Some(Prepared {
                backing: Arc::new(id),
                pin,
            }),
            Err(e) => {
                drop(pin);
                if self.passthrough.swap(false, Ordering::Relaxed) {
                    warn!("passthrough refused by the kernel ({e}); serving all reads through the daemon");
                }
                None
            }
        }
    }

    /// Reads `size` bytes at `offset` through handle `fh`; handle 0 is a
    /// read without one (the kernel open mode). Answered on the caller's
    /// thread when every block is in memory or the disk cache, else from a
    /// task.
    pub fn read(
        self: &Arc<Self>,
        ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
        reply: impl FnOnce(io::Result<Bytes>) + Send + 'static,
    ) {
        let h = if fh == 0 {
            // No handle (handles start at 1): the kernel opened the file
            // without us (kernel open mode).
            let a = match self.ns.getattr_local(ino) {
                Step::Done(Ok(a)) => a,
                Step::Done(Err(e)) => return reply(Err(e)),
                Step::Ask(_) => {
                    // Attributes to revalidate first: without a thread.
                    let core = Arc::clone(self);
                    self.rt.spawn(async move {
                        let h = match core.ns.getattr_async(ino).await {
                            Ok(a) => core.inode_handle(ino, a, offset),
                            Err(e) => Err(e),
                        };
                        match h {
                            Ok(h) => {
                                core.readahead.on_read(&h.seq, &h.file, offset, size as u64);
                                reply(read_path(&core.reader, &h.file, offset, size).await)
                            }
                            Err(e) => reply(Err(e)),
                        }
                    });
                    return;
                }
            };
            match self.inode_handle(ino, a, offset) {
                Ok(h) => h,
                Err(e) => return reply(Err(e)),
            }
        } else {
            match self.files.get(fh) {
                Some(h) => h,
                None => return reply(Err(err(libc::EBADF))),
            }
        };
        self.readahead.on_read(&h.seq, &h.file, offset, size as u64);
        if let Some(bytes) = self.reader.read_local(&h.file, offset, size) {
            return reply(Ok(bytes));
        }
        let reader = Arc::clone(&self.reader);
        let file = Arc::clone(&h.file);
        self.rt
            .spawn(async move { reply(read_path(&reader, &file, offset, size).await) });
    }

    /// The handle of a read that came without one (handle 0: the kernel open
    /// mode): the inode's current version and sequential-read state.
    fn inode_handle(&self, ino: u64, a: SourceAttr, offset: u64) -> io::Result<Arc<Handle>> {
        let r = match self.inode_handles.get(ino, &a.version(), offset) {
            Some(r) => r,
            None => {
                let (rel, a) = self.ns.file_with(ino, a)?;
                let file = Arc::new(FileVersion::new(rel, a.version()));
                self.inode_handles.install(ino, file, offset)
            }
        };
        if r.new_version {
            // Older versions of this path are stale from now on.
            self.reader.cache().note_current(&r.handle.file);
        }
        if r.starts_access {
            self.stats.opens.fetch_add(1, Ordering::Relaxed);
            self.readahead.on_open(ino, &r.handle.file, false);
        }
        Ok(r.handle)
    }

    /// Closes handle `fh`. The last passthrough close of an inode keeps its
    /// backing for the next open and gives its pin back (in the table).
    pub fn release(&self, fh: u64) {
        if self.resent_left.load(Ordering::Acquire) {
            self.take_resent(|r| r.take_fh(fh));
        }
        let released = self.files.release(fh);
        if let Some(j) = self.journal.get() {
            j.released(fh);
        }
        if released.is_some() {
            self.stats.open_handles.fetch_sub(1, Ordering::Relaxed);
        }
        if let Some((_, true)) = released {
            publish_kept(&self.files, &self.stats);
        }
    }

    /// Runs `f` on the restored handles whose OPEN may come again, and
    /// notes when none is left.
    fn take_resent<T>(&self, f: impl FnOnce(&mut Resent) -> T) -> T {
        let mut r = self.resent.lock();
        let out = f(&mut r);
        if r.is_empty() {
            self.resent_left.store(false, Ordering::Release);
        }
        out
    }

    /// Restored handles still waiting for an OPEN sent again (for tests:
    /// each goes with that OPEN or with its handle's RELEASE).
    pub fn resent_pending(&self) -> usize {
        self.resent.lock().by_unique.len()
    }

    /// The kernel forgot `nlookup` lookups of each inode (FORGET,
    /// BATCH_FORGET). An inode it no longer knows at all keeps nothing
    /// but its compact record in the namespace (which also notes that its
    /// pages went with the kernel's inode): its handle of the kernel open
    /// mode goes.
    pub fn forget(&self, nodes: &[(u64, u64)]) {
        let dropped = self.ns.forget(nodes);
        self.inode_handles.forget(&dropped);
    }

    /// Inodes with open handles in the open table.
    pub fn open_inodes(&self) -> usize {
        self.files.inode_count()
    }

    /// Lists directory `ino` from position `offset` ("." is 1, ".." 2, the
    /// entries after), refreshed from the source when the listing starts
    /// (offset 0) and is stale.
    pub fn readdir(&self, ino: u64, offset: u64, reply: impl DirReply) {
        self.readahead.on_listing();
        if offset > 0 {
            return fill_dir(&self.ns, ino, offset, reply);
        }
        match self.ns.listing_local(ino) {
            Step::Done(Ok(())) => fill_dir(&self.ns, ino, offset, reply),
            Step::Done(Err(e)) => reply.done(Err(e)),
            Step::Ask(_) => {
                let ns = Arc::clone(&self.ns);
                self.rt.spawn(async move {
                    match ns.refresh_dir_async(ino).await {
                        Ok(()) => fill_dir(&ns, ino, offset, reply),
                        Err(e) => reply.done(Err(e)),
                    }
                });
            }
        }
    }

    /// [`FsCore::readdir`] with every entry's attributes ("." and ".."
    /// revalidated like any getattr). A listing reads names and kinds
    /// only. The first reply of a listing stats nothing: it holds "." and
    /// "..", then at most `PLUS_FIRST` entries whose attributes are known
    /// and fresh, and ends before the first other one (see `PLUS_FIRST`).
    /// A reply further on (the kernel asks for one when lookups follow the
    /// listing) stats the entries it returns that were never stat-ed (or
    /// are stale) first, in parallel (at most `PLUS_PARALLEL` at once, each
    /// within the guard's metadata deadline); it ends before the first
    /// entry whose attributes did not come (the kernel asks again from
    /// there), and fails only if that is its first entry.
    pub fn readdirplus(&self, ino: u64, offset: u64, reply: impl DirPlusReply) {
        self.readahead.on_listing();
        if offset > 1 {
            let asks = self.ns.plus_asks(ino, offset - 2, PLUS_BATCH);
            if asks.is_empty() {
                return fill_dir_plus(&self.ns, ino, offset, None, None, reply);
            }
            let ns = Arc::clone(&self.ns);
            self.rt.spawn(async move {
                stat_entries(&ns, asks).await;
                fill_dir_plus(&ns, ino, offset, None, None, reply)
            });
            return;
        }
        let ns = &self.ns;
        let parent = ns.parent(ino);
        let listing = if offset == 0 {
            ns.listing_local(ino)
        } else {
            Step::Done(Ok(()))
        };
        let (me, up) = (ns.getattr_local(ino), ns.getattr_local(parent));
        if let (Step::Done(listed), Step::Done(me), Step::Done(up)) = (listing, me, up) {
            return match listed {
                Ok(()) => fill_dir_plus(ns, ino, offset, Some(me), Some(up), reply),
                Err(e) => reply.done(Err(e)),
            };
        }
        let ns = Arc::clone(&self.ns);
        self.rt.spawn(async move {
            if offset == 0 {
                if let Err(e) = ns.refresh_dir_async(ino).await {
                    return reply.done(Err(e));
                }
            }
            let me = ns.getattr_async(ino).await;
            let up = ns.getattr_async(parent).await;
            fill_dir_plus(&ns, ino, offset, Some(me), Some(up), reply)
        });
    }

    /// The value of extended attribute `name` of `ino`: the root's
    /// `stats` (as JSON) and the control socket's path, and every entry's
    /// POSIX ACLs as the source has them (`system.posix_acl_access`,
    /// `system.posix_acl_default`: the kernel reads them to check access,
    /// see [`FsCore::acls`]); ENODATA otherwise.
    pub fn getxattr(
        &self,
        ino: u64,
        name: &OsStr,
        reply: impl FnOnce(io::Result<Vec<u8>>) + Send + 'static,
    ) {
        use crate::source::{ACL_ACCESS_XATTR, ACL_DEFAULT_XATTR};
        match name.to_str() {
            Some(STATS_XATTR) if ino == ROOT => reply(Ok(self.stats_json())),
            Some(CONTROL_XATTR) if ino == ROOT => {
                reply(Ok(self.opts.control_socket.clone().into_bytes()))
            }
            Some(n @ (ACL_ACCESS_XATTR | ACL_DEFAULT_XATTR)) => {
                let access = n == ACL_ACCESS_XATTR;
                self.acls(ino, move |r| {
                    reply(r.and_then(|a| {
                        let v = if access { &a.access } else { &a.default };
                        v.as_deref()
                            .map(<[u8]>::to_vec)
                            .ok_or_else(|| err(libc::ENODATA))
                    }))
                })
            }
            _ => reply(Err(err(libc::ENODATA))),
        }
    }

    /// The answer to [`PING_XATTR`] (this process's pid), given from a task
    /// on the runtime: it comes only if the runtime runs tasks.
    pub fn ping(&self, reply: impl FnOnce(Vec<u8>) + Send + 'static) {
        self.rt
            .spawn(async move { reply(std::process::id().to_string().into_bytes()) });
    }

    /// The names of `ino`'s extended attributes, NUL-separated: its POSIX
    /// ACLs, if it has any. The root's own attributes are not listed, so
    /// copies (cp -a, rsync -X) do not pick them up.
    pub fn listxattr(&self, ino: u64, reply: impl FnOnce(io::Result<Vec<u8>>) + Send + 'static) {
        use crate::source::{ACL_ACCESS_XATTR, ACL_DEFAULT_XATTR};
        self.acls(ino, move |r| {
            reply(r.map(|a| {
                let mut names = Vec::new();
                for (has, name) in [
                    (a.access.is_some(), ACL_ACCESS_XATTR),
                    (a.default.is_some(), ACL_DEFAULT_XATTR),
                ] {
                    if has {
                        names.extend_from_slice(name.as_bytes());
                        names.push(0);
                    }
                }
                names
            }))
        })
    }

    /// The POSIX ACLs of `ino` from the namespace, read from the source
    /// when it holds none read since the attributes were (within
    /// `--metadata-timeout`, answered by the metadata worker that read
    /// them, as a lookup's stat is): the kernel asks for them when it
    /// checks a user's access (FUSE_POSIX_ACL), and caches them as long as
    /// the attributes.
    fn acls(
        &self,
        ino: u64,
        reply: impl FnOnce(io::Result<Arc<crate::source::Acls>>) + Send + 'static,
    ) {
        match self.ns.acls_local(ino) {
            Step::Done(r) => reply(r),
            Step::Ask(ask) => {
                let ns = Arc::clone(&self.ns);
                self.ns
                    .acls_then(ask, move |ask, r| reply(ns.acls_answer(ino, ask, r)));
            }
        }
    }

    /// The answer to every request that would change the tree: the file
    /// system is read-only.
    pub fn modify(&self) -> io::Error {
        err(libc::EROFS)
    }

    fn stats_json(&self) -> Vec<u8> {
        let snap = self
            .stats
            .full_snapshot(&self.opts.source_label, &self.opts.mount_label);
        serde_json::to_vec(&snap).unwrap_or_default()
    }
}

/// Answers a READDIR from what the namespace holds (refreshed first by the
/// caller when the listing starts).
fn fill_dir(ns: &Namespace, ino: u64, offset: u64, mut reply: impl DirReply) {
    if offset == 0 && reply.add(ino, 1, OsStr::new("."), None) {
        return reply.done(Ok(()));
    }
    if offset <= 1 && reply.add(ns.parent(ino), 2, OsStr::new(".."), None) {
        return reply.done(Ok(()));
    }
    let r = ns.read_dir(ino, offset.saturating_sub(2), |e, next| {
        reply.add(e.ino, next + 2, e.name, Some(e.attr))
    });
    reply.done(r)
}

/// Stats `asks` (entries about to go out in a READDIRPLUS) at the source,
/// at most `PLUS_PARALLEL` at once, each through the guard with its
/// deadline, and records the answers (an entry gone at the source leaves
/// the listing; one that did not answer stays unknown).
async fn stat_entries(ns: &Arc<Namespace>, asks: Vec<(u64, crate::meta::namespace::Ask)>) {
    use futures::stream::StreamExt;
    futures::stream::iter(asks)
        .map(|(ino, ask)| async move {
            let r = ns.stat_for(&ask).await;
            let _ = ns.getattr_answer(ino, ask, r);
        })
        .buffer_unordered(PLUS_PARALLEL)
        .for_each(|()| async {})
        .await
}

/// Answers a READDIRPLUS from what the namespace holds, with the attributes
/// of "." (`me`, at offset 0) and ".." (`up`, at offsets 0 and 1) already
/// looked up by the caller. Ends before the first entry whose attributes
/// are not known (its stat did not answer in time; the kernel asks again
/// from there), unless it is the reply's first: that one goes out unstated
/// ([`DirPlusReply::add_unstated`]), so that a listing always advances and
/// never waits on an entry's stat twice. The reply at offsets 0 and 1
/// (nothing stat-ed for it) holds at most `PLUS_FIRST` entries, fresh
/// ones only, after "." and "..".
fn fill_dir_plus(
    ns: &Namespace,
    ino: u64,
    offset: u64,
    me: Option<io::Result<SourceAttr>>,
    up: Option<io::Result<SourceAttr>>,
    mut reply: impl DirPlusReply,
) {
    // Whether the reply holds "." or "..": it is not empty then.
    let mut dots = false;
    if offset == 0 {
        match me {
            Some(Ok(a)) if reply.add(ino, 1, OsStr::new("."), &a) => return reply.done(Ok(())),
            Some(Ok(_)) => dots = true,
            Some(Err(e)) => return reply.done(Err(e)),
            None => {}
        }
    }
    if offset <= 1 {
        if let Some(Ok(a)) = up {
            if reply.add(ns.parent(ino), 2, OsStr::new(".."), &a) {
                return reply.done(Ok(()));
            }
            dots = true;
        }
    }
    // Every entry but "." and ".." counts as a lookup in the kernel.
    let mut handed = Vec::new();
    let first = offset <= 1;
    let most = if first { PLUS_FIRST } else { usize::MAX };
    let r = ns.read_dir(ino, offset.saturating_sub(2), |e, next| {
        if handed.len() >= most {
            return true;
        }
        let usable = if first { e.fresh } else { e.known };
        let full = match (usable, handed.is_empty() && !dots) {
            (true, _) => reply.add(e.ino, next + 2, e.name, e.attr),
            (false, true) => reply.add_unstated(e.ino, next + 2, e.name, e.attr),
            (false, false) => return true,
        };
        if !full {
            handed.push(e.ino);
        }
        full
    });
    ns.looked_up_all(&handed);
    reply.done(r)
}

/// A read through the read path (memory, disk cache, peers, source); a
/// failure is logged (rate-limited) and becomes its errno.
async fn read_path(
    reader: &Arc<Reader>,
    file: &Arc<FileVersion>,
    offset: u64,
    size: u32,
) -> io::Result<Bytes> {
    match Arc::clone(reader)
        .read(Arc::clone(file), offset, size)
        .await
    {
        Ok(bytes) => Ok(bytes),
        Err(e) => {
            if let Some(more) = READ_FAILURES.allow() {
                warn!(file = %file.rel.display(), offset, "read failed: {e} ({more} more failed reads not logged)");
            }
            Err(err(e.errno()))
        }
    }
}

/// Publishes the number of passthrough backings kept for closed files.
fn publish_kept<B>(files: &OpenFiles<B, CachePin>, stats: &Stats) {
    stats
        .passthrough_kept
        .store(files.idle_count() as u64, Ordering::Relaxed);
}
