//! The FUSE adapter: translates kernel requests into calls on the namespace,
//! the open-file table and the reader, and their answers into replies. It
//! holds no logic of its own beyond that translation (and the choice of
//! kernel features at init).
//!
//! It must never block a FUSE thread on the source or a peer: anything that
//! is not already local is answered from a task on the runtime. It never
//! panics; every error becomes an errno for that one request. Every write
//! path answers EROFS.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use tracing::{debug, info, warn};

use crate::cache::{BlockCache, FileVersion};
use crate::handles::{Handle, InodeHandles, OpenFiles, OpenMode, Prepared};
use crate::metrics::{self, FuseOp};
use crate::namespace::{Namespace, Step, ROOT};
use crate::prefetch::ReadAhead;
use crate::reader::Reader;
use crate::source::{EntryKind, SourceAttr};
use crate::stats::Stats;

/// At most one "read failed" line a second: a source that goes down must not
/// flood the log (failed reads are counted in stats).
static READ_FAILURES: crate::logging::RateLimit = crate::logging::RateLimit::new(1000);

/// Inodes per generation of the table of reads without a handle (kernel
/// open mode): at most twice this many are kept.
const INODE_HANDLES: usize = 4096;

/// The extended attribute of the mount root that returns `stats` as JSON.
pub const STATS_XATTR: &str = "user.locafs.stats";

/// Settings of the adapter that come from the command line.
#[derive(Clone, Debug)]
pub struct FuseOptions {
    /// How long the kernel may trust attributes and entries.
    pub ttl: Duration,
    /// Try FUSE passthrough for fully cached files.
    pub passthrough: bool,
    /// The kernel open mode (`--open-mode kernel`): answer OPEN with ENOSYS
    /// so that the kernel opens files without the daemon; no passthrough.
    pub kernel_open: bool,
    pub source_label: String,
    pub mount_label: String,
    /// Path of the control socket (the `user.locafs.control` attribute).
    pub control_socket: String,
}

/// The mounted file system: the adapter's state, shared with the tasks that
/// finish requests off the FUSE threads.
pub struct LocaFs(Arc<Core>);

impl std::ops::Deref for LocaFs {
    type Target = Core;
    fn deref(&self) -> &Core {
        &self.0
    }
}

/// What the adapter holds.
pub struct Core {
    ns: Arc<Namespace>,
    reader: Arc<Reader>,
    files: Arc<OpenFiles<BackingId, CachePin>>,
    /// Handles of reads without one (the kernel open mode).
    inode_handles: InodeHandles,
    stats: Arc<Stats>,
    rt: tokio::runtime::Handle,
    opts: FuseOptions,
    passthrough: AtomicBool,
    /// The kernel open mode is on (and the kernel can open without us).
    kernel_open: AtomicBool,
    readahead: Arc<ReadAhead>,
}

/// One pin of a complete cached file, taken by [`BlockCache::open_complete`]
/// or [`BlockCache::pin_complete`]: given back when dropped, so that every
/// path that does not hand it over (to the open table, with the backing it
/// keeps readable) unpins exactly once. (Weak: the cache's dropped-file hook
/// holds the open table, which holds pins.)
struct CachePin {
    cache: Weak<dyn BlockCache>,
    file: Arc<FileVersion>,
}

impl CachePin {
    /// Owns the pin the caller just took on `file`.
    fn taken(cache: &Arc<dyn BlockCache>, file: &Arc<FileVersion>) -> Self {
        CachePin {
            cache: Arc::downgrade(cache),
            file: Arc::clone(file),
        }
    }
}

impl Drop for CachePin {
    fn drop(&mut self) {
        if let Some(cache) = self.cache.upgrade() {
            cache.unpin(&self.file);
        }
    }
}

fn errno(e: &std::io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

fn time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

fn kind(a: &SourceAttr) -> FileType {
    match a.kind {
        EntryKind::Dir => FileType::Directory,
        EntryKind::File => FileType::RegularFile,
        EntryKind::Symlink => FileType::Symlink,
        EntryKind::Other => match a.mode & libc::S_IFMT {
            libc::S_IFIFO => FileType::NamedPipe,
            libc::S_IFCHR => FileType::CharDevice,
            libc::S_IFBLK => FileType::BlockDevice,
            _ => FileType::Socket,
        },
    }
}

fn attr(ino: u64, a: &SourceAttr) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: a.size,
        blocks: a.blocks,
        atime: time(a.atime_ns),
        mtime: time(a.mtime_ns),
        ctime: time(a.ctime_ns),
        crtime: time(a.ctime_ns),
        kind: kind(a),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: 128 * 1024,
        flags: 0,
    }
}

impl LocaFs {
    pub fn new(
        ns: Arc<Namespace>,
        reader: Arc<Reader>,
        stats: Arc<Stats>,
        rt: tokio::runtime::Handle,
        opts: FuseOptions,
        readahead: Arc<ReadAhead>,
    ) -> Self {
        let files: Arc<OpenFiles<BackingId, CachePin>> = Arc::default();
        // Backings kept after their inode's last close name the cached file:
        // dropped as soon as it goes (or the kernel would keep its space and
        // read holes where blocks were dropped).
        let (kept, gauge) = (Arc::clone(&files), Arc::clone(&stats));
        reader.cache().on_file_dropped(Box::new(move |key| {
            kept.forget_idle(key);
            publish_kept(&kept, &gauge);
        }));
        LocaFs(Arc::new(Core {
            ns,
            reader,
            files,
            inode_handles: InodeHandles::new(INODE_HANDLES),
            stats,
            rt,
            opts,
            passthrough: AtomicBool::new(false),
            kernel_open: AtomicBool::new(false),
            readahead,
        }))
    }
}

impl Core {
    /// Answers a request that needs the source on the runtime's blocking
    /// pool, so that a FUSE thread never waits on the source (the wait there
    /// is bounded by the source guard's deadline).
    fn off_thread(&self, f: impl FnOnce() + Send + 'static) {
        self.rt.spawn_blocking(f);
    }

    fn stats_json(&self) -> Vec<u8> {
        let snap = self
            .stats
            .full_snapshot(&self.opts.source_label, &self.opts.mount_label);
        serde_json::to_vec(&snap).unwrap_or_default()
    }

    /// The handle of a read that came without one (handle 0: the kernel open
    /// mode): the inode's current version and sequential-read state.
    fn inode_handle(&self, ino: u64, a: SourceAttr, offset: u64) -> std::io::Result<Arc<Handle>> {
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

    /// The rest of an OPEN once the file's attributes are known: its mode
    /// (passthrough for a fully cached file, else cached), its handle.
    fn open_file(
        &self,
        ino: u64,
        file: std::io::Result<(Arc<Path>, SourceAttr)>,
        reply: ReplyOpen,
    ) {
        let (rel, a) = match file {
            Ok(x) => x,
            Err(e) => return reply.error(errno(&e)),
        };
        if self.kernel_open.load(Ordering::Relaxed) {
            // The kernel sets no_open for the connection: no OPEN or
            // RELEASE for files from now on, reads come with handle 0.
            return reply.error(Errno::ENOSYS);
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
        let opened = self.files.open(ino, Arc::clone(&file), prepared);
        if let Ok((_, _, true)) = &opened {
            // Older versions of this path are stale from now on.
            cache.note_current(&file);
        }
        match opened {
            Ok((fh, OpenMode::Passthrough(id), _)) => {
                self.readahead.on_open(ino, &file, true);
                self.stats.open_handles.fetch_add(1, Ordering::Relaxed);
                self.stats.passthrough_opens.fetch_add(1, Ordering::Relaxed);
                reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &id);
            }
            Ok((fh, OpenMode::Cached { keep_cache }, _)) => {
                self.stats.open_handles.fetch_add(1, Ordering::Relaxed);
                self.readahead.on_open(ino, &file, false);
                let flags = if keep_cache {
                    FopenFlags::FOPEN_KEEP_CACHE
                } else {
                    FopenFlags::empty()
                };
                reply.opened(FileHandle(fh), flags);
            }
            Err(_) => {
                warn!(file = %file.rel.display(), "file changed at the source while open in passthrough mode; retry once it is closed");
                reply.error(Errno::from_i32(libc::EBUSY));
            }
        }
    }

    /// A verified backing file for passthrough, if the file is fully cached:
    /// the one kept from the inode's previous open of this version if the
    /// cache still holds the file whole, else a new one; with the pin that
    /// keeps the file in the cache (given back when dropped).
    fn prepare_backing(
        &self,
        reply: &ReplyOpen,
        ino: u64,
        file: &Arc<FileVersion>,
    ) -> Option<Prepared<BackingId, CachePin>> {
        let cache = self.reader.cache();
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
        match reply.open_backing(&f) {
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
}

/// Answers a READDIR from what the namespace holds (refreshed first by the
/// caller when the listing starts).
fn fill_dir(ns: &Namespace, ino: INodeNo, offset: u64, mut reply: ReplyDirectory) {
    if offset == 0 && reply.add(ino, 1, FileType::Directory, ".") {
        return reply.ok();
    }
    if offset <= 1 && reply.add(INodeNo(ns.parent(ino.0)), 2, FileType::Directory, "..") {
        return reply.ok();
    }
    let r = ns.read_dir(ino.0, offset.saturating_sub(2), |e, next| {
        reply.add(INodeNo(e.ino), next + 2, kind(e.attr), e.name)
    });
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

/// Answers a READDIRPLUS from what the namespace holds, with the attributes
/// of "." (`me`, at offset 0) and ".." (`up`, at offsets 0 and 1) already
/// looked up by the caller.
fn fill_dir_plus(
    ns: &Namespace,
    ttl: Duration,
    ino: INodeNo,
    offset: u64,
    me: Option<std::io::Result<SourceAttr>>,
    up: Option<std::io::Result<SourceAttr>>,
    mut reply: ReplyDirectoryPlus,
) {
    if offset == 0 {
        match me {
            Some(Ok(a)) if reply.add(ino, 1, ".", &ttl, &attr(ino.0, &a), Generation(0)) => {
                return reply.ok()
            }
            Some(Err(e)) => return reply.error(errno(&e)),
            _ => {}
        }
    }
    if offset <= 1 {
        let parent = ns.parent(ino.0);
        if let Some(Ok(a)) = up {
            if reply.add(
                INodeNo(parent),
                2,
                "..",
                &ttl,
                &attr(parent, &a),
                Generation(0),
            ) {
                return reply.ok();
            }
        }
    }
    let r = ns.read_dir(ino.0, offset.saturating_sub(2), |e, next| {
        reply.add(
            INodeNo(e.ino),
            next + 2,
            e.name,
            &ttl,
            &attr(e.ino, e.attr),
            Generation(0),
        )
    });
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

/// Answers a READ from the read path (memory, disk cache, peers, source).
async fn read_reply(
    reader: &Arc<Reader>,
    file: &Arc<FileVersion>,
    offset: u64,
    size: u32,
    reply: ReplyData,
) {
    match Arc::clone(reader)
        .read(Arc::clone(file), offset, size)
        .await
    {
        Ok(bytes) => reply.data(&bytes),
        Err(e) => {
            if let Some(more) = READ_FAILURES.allow() {
                warn!(file = %file.rel.display(), offset, "read failed: {e} ({more} more failed reads not logged)");
            }
            reply.error(Errno::from_i32(e.errno()));
        }
    }
}

/// Publishes the number of passthrough backings kept for closed files.
fn publish_kept(files: &OpenFiles<BackingId, CachePin>, stats: &Stats) {
    stats
        .passthrough_kept
        .store(files.idle_count() as u64, Ordering::Relaxed);
}

impl Filesystem for LocaFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let wanted = InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_CACHE_SYMLINKS
            | InitFlags::FUSE_NO_OPENDIR_SUPPORT;
        for flag in wanted.iter() {
            let _ = config.add_capabilities(flag);
        }
        // Loader reads in flight (each may hold a block) stay within 32.
        let _ = config.set_max_background(32);
        if self.opts.kernel_open {
            // The kernel takes ENOSYS to OPEN as "open without the daemon"
            // only if it says so; an older one would fail the user's open().
            if config
                .add_capabilities(InitFlags::FUSE_NO_OPEN_SUPPORT)
                .is_ok()
            {
                // Without OPEN the page cache is kept across opens: drop a
                // file's pages when a refreshed attribute shows a new mtime
                // or size (how a changed source file becomes visible).
                let _ = config.add_capabilities(InitFlags::FUSE_AUTO_INVAL_DATA);
                self.kernel_open.store(true, Ordering::Relaxed);
                info!("open mode kernel: files are opened by the kernel without a request to the daemon and keep their page cache across opens; no passthrough (reads that miss the page cache go through the daemon)");
            } else {
                info!("open mode kernel unavailable: this kernel cannot open files without the daemon; opens are served as in passthrough mode, without passthrough");
            }
        } else if self.opts.passthrough {
            if !crate::sys::has_cap_sys_admin() {
                info!("passthrough off: it needs CAP_SYS_ADMIN; cached files are served through the daemon");
            } else if config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
                && config.set_max_stack_depth(1).is_ok()
            {
                self.passthrough.store(true, Ordering::Relaxed);
                debug!("passthrough on for fully cached files");
            } else {
                info!("passthrough off: this kernel does not offer it");
            }
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        metrics::fuse_op(FuseOp::Lookup);
        let ttl = self.opts.ttl;
        let answer = move |r: std::io::Result<(u64, SourceAttr)>, reply: ReplyEntry| match r {
            Ok((ino, a)) => reply.entry(&ttl, &attr(ino, &a), Generation(0)),
            Err(e) => reply.error(errno(&e)),
        };
        match self.ns.lookup_local(parent.0, name) {
            Step::Done(r) => answer(r, reply),
            Step::Ask(ask) => {
                let (ns, name) = (Arc::clone(&self.ns), name.to_owned());
                self.rt.spawn(async move {
                    let r = ns.stat_for(&ask).await;
                    answer(ns.lookup_answer(parent.0, &name, ask, r), reply)
                });
            }
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        metrics::fuse_op(FuseOp::Getattr);
        let ttl = self.opts.ttl;
        let answer = move |r: std::io::Result<SourceAttr>, reply: ReplyAttr| match r {
            Ok(a) => reply.attr(&ttl, &attr(ino.0, &a)),
            Err(e) => reply.error(errno(&e)),
        };
        match self.ns.getattr_local(ino.0) {
            Step::Done(r) => answer(r, reply),
            Step::Ask(ask) => {
                let ns = Arc::clone(&self.ns);
                self.rt.spawn(async move {
                    let r = ns.stat_for(&ask).await;
                    answer(ns.getattr_answer(ino.0, ask, r), reply)
                });
            }
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        metrics::fuse_op(FuseOp::Readlink);
        // Asks the source every time (the kernel caches the answer).
        let ns = Arc::clone(&self.ns);
        self.off_thread(move || {
            use std::os::unix::ffi::OsStrExt;
            match ns.read_link(ino.0) {
                Ok(t) => reply.data(t.as_os_str().as_bytes()),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        metrics::fuse_op(FuseOp::Open);
        if flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        match self.ns.getattr_local(ino.0) {
            Step::Done(a) => {
                let file = a.and_then(|a| self.ns.file_with(ino.0, a));
                self.open_file(ino.0, file, reply)
            }
            Step::Ask(_) => {
                // Revalidation first, without holding a thread; the rest
                // (which may verify a cached file) on the blocking pool.
                let core = Arc::clone(&self.0);
                self.rt.spawn(async move {
                    let file = core.ns.open_file_async(ino.0).await;
                    let c = Arc::clone(&core);
                    core.rt
                        .spawn_blocking(move || c.open_file(ino.0, file, reply));
                });
            }
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        metrics::fuse_op(FuseOp::Read);
        let h = if fh.0 == 0 {
            // No handle (handles start at 1): the kernel opened the file
            // without us (kernel open mode).
            let a = match self.ns.getattr_local(ino.0) {
                Step::Done(Ok(a)) => a,
                Step::Done(Err(e)) => return reply.error(errno(&e)),
                Step::Ask(_) => {
                    // Attributes to revalidate first: without a thread.
                    let core = Arc::clone(&self.0);
                    self.rt.spawn(async move {
                        let h = match core.ns.getattr_async(ino.0).await {
                            Ok(a) => core.inode_handle(ino.0, a, offset),
                            Err(e) => Err(e),
                        };
                        match h {
                            Ok(h) => {
                                core.readahead.on_read(&h.seq, &h.file, offset, size as u64);
                                read_reply(&core.reader, &h.file, offset, size, reply).await
                            }
                            Err(e) => reply.error(errno(&e)),
                        }
                    });
                    return;
                }
            };
            match self.inode_handle(ino.0, a, offset) {
                Ok(h) => h,
                Err(e) => return reply.error(errno(&e)),
            }
        } else {
            match self.files.get(fh.0) {
                Some(h) => h,
                None => return reply.error(Errno::EBADF),
            }
        };
        self.readahead.on_read(&h.seq, &h.file, offset, size as u64);
        if let Some(bytes) = self.reader.read_local(&h.file, offset, size) {
            return reply.data(&bytes);
        }
        let reader = Arc::clone(&self.reader);
        let file = Arc::clone(&h.file);
        self.rt
            .spawn(async move { read_reply(&reader, &file, offset, size, reply).await });
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        metrics::fuse_op(FuseOp::Release);
        let released = self.files.release(fh.0);
        if released.is_some() {
            self.stats.open_handles.fetch_sub(1, Ordering::Relaxed);
        }
        // The last passthrough close gave its pin back (in the table).
        if let Some((_, true)) = released {
            publish_kept(&self.files, &self.stats);
        }
        reply.ok();
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        metrics::fuse_op(FuseOp::Flush);
        // Nothing to flush on a read-only file system: ENOSYS makes the
        // kernel stop sending FLUSH on every close() (a round trip per file).
        reply.error(Errno::ENOSYS);
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // ENOSYS makes the kernel skip OPENDIR/RELEASEDIR from now on and
        // cache directory listings itself.
        reply.error(Errno::ENOSYS);
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        metrics::fuse_op(FuseOp::Readdir);
        // A listing is refreshed when it starts (offset 0), at most.
        if offset > 0 {
            return fill_dir(&self.ns, ino, offset, reply);
        }
        match self.ns.listing_local(ino.0) {
            Step::Done(Ok(())) => fill_dir(&self.ns, ino, offset, reply),
            Step::Done(Err(e)) => reply.error(errno(&e)),
            Step::Ask(_) => {
                let ns = Arc::clone(&self.ns);
                self.rt.spawn(async move {
                    match ns.refresh_dir_async(ino.0).await {
                        Ok(()) => fill_dir(&ns, ino, offset, reply),
                        Err(e) => reply.error(errno(&e)),
                    }
                });
            }
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        metrics::fuse_op(FuseOp::Readdirplus);
        let ttl = self.opts.ttl;
        if offset > 1 {
            return fill_dir_plus(&self.ns, ttl, ino, offset, None, None, reply);
        }
        let ns = &self.ns;
        let parent = ns.parent(ino.0);
        let listing = if offset == 0 {
            ns.listing_local(ino.0)
        } else {
            Step::Done(Ok(()))
        };
        let (me, up) = (ns.getattr_local(ino.0), ns.getattr_local(parent));
        if let (Step::Done(listed), Step::Done(me), Step::Done(up)) = (listing, me, up) {
            return match listed {
                Ok(()) => fill_dir_plus(ns, ttl, ino, offset, Some(me), Some(up), reply),
                Err(e) => reply.error(errno(&e)),
            };
        }
        let ns = Arc::clone(&self.ns);
        self.rt.spawn(async move {
            if offset == 0 {
                if let Err(e) = ns.refresh_dir_async(ino.0).await {
                    return reply.error(errno(&e));
                }
            }
            let me = ns.getattr_async(ino.0).await;
            let up = ns.getattr_async(parent).await;
            fill_dir_plus(&ns, ttl, ino, offset, Some(me), Some(up), reply)
        });
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        metrics::fuse_op(FuseOp::Statfs);
        let ns = Arc::clone(&self.ns);
        self.off_thread(move || match ns.statfs() {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                s.f_namemax as u32,
                s.f_frsize as u32,
            ),
            Err(e) => reply.error(errno(&e)),
        });
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        metrics::fuse_op(FuseOp::Getxattr);
        let value = match name.to_str() {
            Some(STATS_XATTR) if ino.0 == ROOT => self.stats_json(),
            Some(crate::control::CONTROL_XATTR) if ino.0 == ROOT => {
                self.opts.control_socket.clone().into_bytes()
            }
            _ => return reply.error(Errno::from_i32(libc::ENODATA)),
        };
        if size == 0 {
            reply.size(value.len() as u32);
        } else if (size as usize) < value.len() {
            reply.error(Errno::from_i32(libc::ERANGE));
        } else {
            reply.data(&value);
        }
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: ReplyXattr) {
        metrics::fuse_op(FuseOp::Listxattr);
        // The control attribute is not listed, so copies (cp -a, rsync -X)
        // do not pick it up.
        if size == 0 {
            reply.size(0);
        } else {
            reply.data(&[]);
        }
    }

    // Every way of changing the tree: read-only.

    fn setattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        metrics::fuse_op(FuseOp::Modify);
        reply.error(Errno::EROFS);
    }

    fn mknod(
        &self,
        _req: &Request,
        _p: INodeNo,
        _n: &OsStr,
        _m: u32,
        _u: u32,
        _r: u32,
        reply: ReplyEntry,
    ) {
        metrics::fuse_op(FuseOp::Modify);
        reply.error(Errno::EROFS);
    }

    fn mkdir(&self, _req: &Request, _p: INodeNo, _n: &OsStr, _m: u32, _u: u32, reply: ReplyEntry) {
        metrics::fuse_op(FuseOp::Modify);
        reply.error(Errno::EROFS);
    }

    fn unlink(&self, _req: &Request, _p: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        metrics::fuse_op(FuseOp::Modify);
        reply.error(Errno::EROFS);
    }

    fn rmdir(&self, _req: &Request, _p: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        metrics::fuse_op(FuseOp::Modify);
        reply.error(Errno::EROFS);
    }

    fn symlink(&self, _req: &Request, _p: INodeNo, _n: &OsStr, _t: &Path, reply: ReplyEntry) {
        metrics::fuse_op(FuseOp::Modify);
        reply.error(Errno::EROFS);
    }

    fn rename(
        &self,
        _req: &Request,
        _p: INodeNo,
        _n: &OsStr,
        _np: INodeNo,
        _nn: &OsStr,
        _f: RenameFlags,
        reply: ReplyEmpty,
    ) {
        metrics::fuse_op(FuseOp::Modify);
        reply.error(Errno::EROFS);
    }

    fn link(&self, _req: &Request, _i: INodeNo, _np: INodeNo, _nn: &OsStr, reply: ReplyEntry) {
        metrics::fuse_op(FuseOp::Modify);
        reply.error(Errno::EROFS);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _data: &[u8],
        _wf: WriteFlags,
        _flags: OpenFlags,
        _lo: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        metrics::fuse_op(FuseOp::Modify);
        reply.error(Errno::EROFS);
    }

    fn create(
        &self,
        _req: &Request,
        _p: INodeNo,
        _n: &OsStr,
        _m: u32,
        _u: u32,
        _f: i32,
        reply: ReplyCreate,
    ) {
        metrics::fuse_op(FuseOp::Modify);
        reply.error(Errno::EROFS);
    }

    fn setxattr(
        &self,
        _req: &Request,
        _i: INodeNo,
        _n: &OsStr,
        _v: &[u8],
        _f: i32,
        _p: u32,
        reply: ReplyEmpty,
    ) {
        metrics::fuse_op(FuseOp::Modify);
        reply.error(Errno::EROFS);
    }

    fn removexattr(&self, _req: &Request, _i: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        metrics::fuse_op(FuseOp::Modify);
        reply.error(Errno::EROFS);
    }
}
