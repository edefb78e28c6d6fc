//! The FUSE adapter: translates kernel requests (fuser types) into calls on
//! the file system core (fs.rs) and the core's answers into replies. It
//! holds no logic of its own beyond that translation, the choice of kernel
//! features at INIT ([`negotiate`], which the process that holds the mount
//! runs once), and counting requests for metrics. The kernel's passthrough
//! backing ids live here ([`KernelBacking`]): the core asks the reply to
//! an OPEN to register a cached file ([`OpenReply`]), and every id and
//! handle is recorded in the shared state (`handle_store`) so that a server
//! restarted over the mount answers for them ([`LocaFs::restore`]).
//!
//! It must never block a FUSE thread on the source or a peer: the core
//! answers on the calling thread only what is local and the rest from a
//! task. It never panics; every error becomes an errno for that one
//! request. Every write path answers EROFS.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use tracing::{debug, info, warn};

use crate::fs::handle_store::{HandleStore, SavedBacking, SavedHandle};
use crate::fs::handles::OpenMode;
use crate::fs::{DirPlusReply, DirReply, FsCore, HandleJournal, OpenReply, Opened, Restored};
use crate::obs::metrics::{self, FuseOp};
use crate::source::{EntryKind, SourceAttr};

pub use crate::fs::STATS_XATTR;

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
}

/// The mounted file system: the core, and the adapter's settings.
pub struct LocaFs {
    fs: Arc<FsCore<KernelBacking>>,
    opts: FuseOptions,
    /// A descriptor of the connection, for the backing ids' ioctls.
    dev: Arc<OwnedFd>,
    /// Where handles and backing ids are recorded (the shared state).
    store: Option<Arc<HandleStore>>,
    /// The shared state whose header counts the requests this server took
    /// (the holder's measure of a server's progress).
    state: Option<Arc<crate::sys::shm::SharedState>>,
}

/// `FUSE_DEV_IOC_BACKING_CLOSE`: `_IOW(229, 2, uint32_t)`.
const FUSE_DEV_IOC_BACKING_CLOSE: libc::c_ulong = 0x4004_e502;

/// A passthrough backing id registered on the FUSE connection: closed
/// (`FUSE_DEV_IOC_BACKING_CLOSE`) when dropped. The id belongs to the
/// connection, not to this process: it is recorded in the shared state
/// while it lives, so that a server restarted over the mount can close it
/// or go on using it.
#[derive(Debug)]
pub struct KernelBacking {
    id: u32,
    dev: Arc<OwnedFd>,
    store: Option<Arc<HandleStore>>,
}

impl KernelBacking {
    /// Registers `file` on the connection as a backing of inode `ino`.
    fn register(
        dev: &Arc<OwnedFd>,
        store: &Option<Arc<HandleStore>>,
        file: &File,
        ino: u64,
    ) -> std::io::Result<Self> {
        let id = BackingId::create_raw(dev.as_fd(), file.as_fd())?;
        // (a server killed between these two leaves an id nobody closes
        // until the mount ends: a few hundred bytes in the kernel)
        if let Some(s) = store {
            s.backing_opened(id, ino);
        }
        Ok(KernelBacking {
            id,
            dev: Arc::clone(dev),
            store: store.clone(),
        })
    }

    /// Takes over id `id`, which an earlier server registered.
    fn adopt(dev: &Arc<OwnedFd>, store: &Option<Arc<HandleStore>>, id: u32) -> Self {
        KernelBacking {
            id,
            dev: Arc::clone(dev),
            store: store.clone(),
        }
    }

    pub fn id(&self) -> u32 {
        self.id
    }
}

impl Drop for KernelBacking {
    fn drop(&mut self) {
        let id = self.id;
        // SAFETY: an ioctl on our descriptor with a pointer to a u32 that
        // outlives the call.
        let r = unsafe {
            libc::ioctl(
                self.dev.as_raw_fd(),
                FUSE_DEV_IOC_BACKING_CLOSE,
                &id as *const u32,
            )
        };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            // (ENODEV: the connection ended, and every id with it)
            if e.raw_os_error() != Some(libc::ENODEV) {
                warn!("passthrough backing {id} not closed: {e}");
            }
        }
        if let Some(s) = &self.store {
            s.backing_closed(id);
        }
    }
}

/// The handle journal of the core: the shared state's handle table.
struct StoreJournal(Arc<HandleStore>);

impl HandleJournal<KernelBacking> for StoreJournal {
    fn opened(
        &self,
        fh: u64,
        ino: u64,
        version: &crate::source::SourceVersion,
        mode: &OpenMode<KernelBacking>,
        unique: u64,
    ) {
        let (backing, keep_cache) = match mode {
            OpenMode::Passthrough(b) => (Some(b.id), false),
            OpenMode::Cached { keep_cache } => (None, *keep_cache),
        };
        self.0.opened(&SavedHandle {
            fh,
            ino,
            version: *version,
            backing,
            keep_cache,
            unique,
        });
    }

    fn released(&self, fh: u64) {
        self.0.released(fh);
    }
}

/// What the INIT handshake settled (`shm::INIT_*` bits): chosen once per
/// connection by [`negotiate`], applied by every server.
pub type Granted = u64;

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
    /// The adapter over the core `fs` (assembled by `mount::assemble`);
    /// `dev` is a descriptor of the connection (for the backing ids'
    /// ioctls).
    pub fn new(fs: Arc<FsCore<KernelBacking>>, opts: FuseOptions, dev: Arc<OwnedFd>) -> Self {
        LocaFs {
            fs,
            opts,
            dev,
            store: None,
            state: None,
        }
    }

    /// Counts every request from now on in `state`'s header.
    pub fn count_requests_in(&mut self, state: Arc<crate::sys::shm::SharedState>) {
        self.state = Some(state);
    }

    /// One request of kind `op`: for metrics, and for the holder.
    fn op(&self, op: FuseOp) {
        metrics::fuse_op(op);
        if let Some(s) = &self.state {
            s.header()
                .answered
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Records every handle and backing id in `store` (the shared state),
    /// and puts back those an earlier server of this mount recorded there:
    /// `saved` handles, and `backings`, of which the ids no handle reads
    /// through any more (kept after their last close, or registered by a
    /// server killed before its reply) are closed. Returns (handles put
    /// back, ids closed).
    pub fn restore(
        &mut self,
        store: Arc<HandleStore>,
        saved: Vec<SavedHandle>,
        backings: Vec<SavedBacking>,
    ) -> (usize, usize) {
        self.store = Some(Arc::clone(&store));
        self.fs
            .set_journal(Arc::new(StoreJournal(Arc::clone(&store))));
        let mut ids: HashMap<u32, Arc<KernelBacking>> = backings
            .iter()
            .map(|b| {
                let k = KernelBacking::adopt(&self.dev, &self.store, b.id);
                (b.id, Arc::new(k))
            })
            .collect();
        let restored: Vec<Restored<KernelBacking>> = saved
            .into_iter()
            .map(|h| Restored {
                fh: h.fh,
                ino: h.ino,
                version: h.version,
                backing: h.backing.map(|id| {
                    Arc::clone(ids.entry(id).or_insert_with(|| {
                        Arc::new(KernelBacking::adopt(&self.dev, &self.store, id))
                    }))
                }),
                keep_cache: h.keep_cache,
                unique: h.unique,
            })
            .collect();
        let n = self.fs.restore_handles(restored);
        // Every id no handle took is closed as its last Arc goes.
        let closed = ids.values().filter(|b| Arc::strong_count(b) == 1).count();
        drop(ids);
        (n, closed)
    }

    /// Applies what the INIT handshake settled ([`negotiate`]):
    /// passthrough only if this server's options want it too (a takeover
    /// with --no-passthrough turns it off).
    pub fn apply_init(&self, flags: Granted) {
        if flags & crate::sys::shm::INIT_KERNEL_OPEN != 0 {
            self.fs.enable_kernel_open();
        } else if flags & crate::sys::shm::INIT_PASSTHROUGH != 0 && self.opts.passthrough {
            self.fs.enable_passthrough();
        }
    }
}

/// The reply to an OPEN with what the core needs beside it: the request's
/// id and the connection to register backings on.
struct OpenTx {
    reply: ReplyOpen,
    unique: u64,
    ino: u64,
    dev: Arc<OwnedFd>,
    store: Option<Arc<HandleStore>>,
}

impl OpenReply<KernelBacking> for OpenTx {
    fn register_backing(&self, file: &File) -> std::io::Result<KernelBacking> {
        KernelBacking::register(&self.dev, &self.store, file, self.ino)
    }

    fn request_id(&self) -> u64 {
        self.unique
    }

    fn done(self, r: std::io::Result<Opened<KernelBacking>>) {
        match r {
            Ok(Opened {
                fh,
                mode: OpenMode::Passthrough(b),
            }) => {
                // A BackingId that does not close the id (the backing does).
                // SAFETY: the id is registered on this connection and lives
                // as long as `b`, which the open table keeps.
                let id = unsafe { self.reply.wrap_backing(b.id) };
                self.reply
                    .opened_passthrough(FileHandle(fh), FopenFlags::empty(), &id);
                let _ = id.into_raw();
            }
            Ok(Opened {
                fh,
                mode: OpenMode::Cached { keep_cache },
            }) => {
                let flags = if keep_cache {
                    FopenFlags::FOPEN_KEEP_CACHE
                } else {
                    FopenFlags::empty()
                };
                self.reply.opened(FileHandle(fh), flags)
            }
            Err(e) => self.reply.error(errno(&e)),
        }
    }
}

impl DirReply for ReplyDirectory {
    fn add(&mut self, ino: u64, next: u64, name: &OsStr, a: Option<&SourceAttr>) -> bool {
        let k = a.map_or(FileType::Directory, kind);
        ReplyDirectory::add(self, INodeNo(ino), next, k, name)
    }

    fn done(self, r: std::io::Result<()>) {
        match r {
            Ok(()) => self.ok(),
            Err(e) => self.error(errno(&e)),
        }
    }
}

/// A READDIRPLUS reply and the attributes' time to live.
struct PlusReply(ReplyDirectoryPlus, Duration);

impl DirPlusReply for PlusReply {
    fn add(&mut self, ino: u64, next: u64, name: &OsStr, a: &SourceAttr) -> bool {
        self.0.add(
            INodeNo(ino),
            next,
            name,
            &self.1,
            &attr(ino, a),
            Generation(0),
        )
    }

    fn add_unstated(&mut self, ino: u64, next: u64, name: &OsStr, a: &SourceAttr) -> bool {
        // Valid for no time: the kernel asks (LOOKUP, GETATTR) before it
        // uses the entry or its attributes.
        let now = Duration::ZERO;
        self.0
            .add(INodeNo(ino), next, name, &now, &attr(ino, a), Generation(0))
    }

    fn done(self, r: std::io::Result<()>) {
        match r {
            Ok(()) => self.0.ok(),
            Err(e) => self.0.error(errno(&e)),
        }
    }
}

impl Filesystem for LocaFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.op(FuseOp::Lookup);
        let ttl = self.opts.ttl;
        self.fs.lookup(parent.0, name, move |r| match r {
            Ok((ino, a)) => reply.entry(&ttl, &attr(ino, &a), Generation(0)),
            Err(e) => reply.error(errno(&e)),
        });
    }

    // BATCH_FORGET: fuser's default calls this for each inode (its
    // `ForgetOne` is not exported, so it cannot be taken in one call).
    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.fs.forget(&[(ino.0, nlookup)]);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.op(FuseOp::Getattr);
        let ttl = self.opts.ttl;
        self.fs.getattr(ino.0, move |r| match r {
            Ok(a) => reply.attr(&ttl, &attr(ino.0, &a)),
            Err(e) => reply.error(errno(&e)),
        });
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.op(FuseOp::Readlink);
        self.fs.readlink(ino.0, move |r| {
            use std::os::unix::ffi::OsStrExt;
            match r {
                Ok(t) => reply.data(t.as_os_str().as_bytes()),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.op(FuseOp::Open);
        let write = flags.acc_mode() != OpenAccMode::O_RDONLY;
        let tx = OpenTx {
            reply,
            unique: req.unique().0,
            ino: ino.0,
            dev: Arc::clone(&self.dev),
            store: self.store.clone(),
        };
        self.fs.open(ino.0, write, tx);
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
        self.op(FuseOp::Read);
        self.fs.read(ino.0, fh.0, offset, size, move |r| match r {
            Ok(bytes) => reply.data(&bytes),
            Err(e) => reply.error(errno(&e)),
        });
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
        self.op(FuseOp::Release);
        self.fs.release(fh.0);
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
        self.op(FuseOp::Flush);
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
        self.op(FuseOp::Readdir);
        self.fs.readdir(ino.0, offset, reply);
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        self.op(FuseOp::Readdirplus);
        self.fs
            .readdirplus(ino.0, offset, PlusReply(reply, self.opts.ttl));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.op(FuseOp::Statfs);
        self.fs.statfs(move |r| match r {
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
        self.op(FuseOp::Getxattr);
        if ino.0 == crate::meta::namespace::ROOT && name == crate::fs::PING_XATTR {
            return self.fs.ping(move |v| xattr_reply(&v, size, reply));
        }
        self.fs.getxattr(ino.0, name, move |r| match r {
            Ok(v) => xattr_reply(&v, size, reply),
            Err(e) => reply.error(errno(&e)),
        });
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.op(FuseOp::Listxattr);
        self.fs.listxattr(ino.0, move |r| match r {
            Ok(v) => xattr_reply(&v, size, reply),
            Err(e) => reply.error(errno(&e)),
        });
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
        self.op(FuseOp::Modify);
        reply.error(errno(&self.fs.modify()));
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
        self.op(FuseOp::Modify);
        reply.error(errno(&self.fs.modify()));
    }

    fn mkdir(&self, _req: &Request, _p: INodeNo, _n: &OsStr, _m: u32, _u: u32, reply: ReplyEntry) {
        self.op(FuseOp::Modify);
        reply.error(errno(&self.fs.modify()));
    }

    fn unlink(&self, _req: &Request, _p: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        self.op(FuseOp::Modify);
        reply.error(errno(&self.fs.modify()));
    }

    fn rmdir(&self, _req: &Request, _p: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        self.op(FuseOp::Modify);
        reply.error(errno(&self.fs.modify()));
    }

    fn symlink(&self, _req: &Request, _p: INodeNo, _n: &OsStr, _t: &Path, reply: ReplyEntry) {
        self.op(FuseOp::Modify);
        reply.error(errno(&self.fs.modify()));
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
        self.op(FuseOp::Modify);
        reply.error(errno(&self.fs.modify()));
    }

    fn link(&self, _req: &Request, _i: INodeNo, _np: INodeNo, _nn: &OsStr, reply: ReplyEntry) {
        self.op(FuseOp::Modify);
        reply.error(errno(&self.fs.modify()));
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
        self.op(FuseOp::Modify);
        reply.error(errno(&self.fs.modify()));
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
        self.op(FuseOp::Modify);
        reply.error(errno(&self.fs.modify()));
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
        self.op(FuseOp::Modify);
        reply.error(errno(&self.fs.modify()));
    }

    fn removexattr(&self, _req: &Request, _i: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        self.op(FuseOp::Modify);
        reply.error(errno(&self.fs.modify()));
    }
}

/// Chooses the kernel features of a new connection at INIT: run once per
/// mount, by the process that holds it (`supervisor`), which keeps the
/// answer in the shared state for every server. Returns the `shm::INIT_*`
/// bits granted.
pub fn negotiate(
    config: &mut KernelConfig,
    passthrough: bool,
    kernel_open: bool,
    posix_acl: bool,
) -> Granted {
    // READDIRPLUS_AUTO: the kernel asks for READDIRPLUS at the start
    // of a listing and where lookups of the directory's entries follow
    // (`ls -l`, scandir + stat), plain READDIR otherwise (`find`, an
    // image folder scan), which needs no stat of the entries at the
    // source (fuse_use_readdirplus in fs/fuse/readdir.c).
    let wanted = InitFlags::FUSE_DO_READDIRPLUS
        | InitFlags::FUSE_READDIRPLUS_AUTO
        | InitFlags::FUSE_PARALLEL_DIROPS
        | InitFlags::FUSE_CACHE_SYMLINKS
        | InitFlags::FUSE_NO_OPENDIR_SUPPORT;
    for flag in wanted.iter() {
        let _ = config.add_capabilities(flag);
    }
    // POSIX ACLs: the kernel checks every access against the ACL of
    // the entry (the source's `system.posix_acl_access`, which it asks
    // for with GETXATTR and caches as long as the attributes), not the
    // mode bits alone. It implies default_permissions (which the mount
    // has anyway). Without it, a file the source's ACL keeps from a
    // user would be readable through the mount by its mode bits.
    if posix_acl {
        if config.add_capabilities(InitFlags::FUSE_POSIX_ACL).is_ok() {
            debug!("POSIX ACLs of the source enforced by the kernel");
        } else {
            warn!("this kernel cannot enforce POSIX ACLs on a FUSE mount: access through the mount is checked against the mode bits only, which an ACL at the source may narrow (see docs/security.md)");
        }
    }
    // Loader reads in flight (each may hold a block) stay within 32.
    let _ = config.set_max_background(32);
    if kernel_open {
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
            info!("open mode kernel: files are opened by the kernel without a request to the daemon and keep their page cache across opens; no passthrough (reads that miss the page cache go through the daemon)");
            return crate::sys::shm::INIT_KERNEL_OPEN;
        }
        info!("open mode kernel unavailable: this kernel cannot open files without the daemon; opens are served as in passthrough mode, without passthrough");
    } else if passthrough {
        if !crate::sys::has_cap_sys_admin() {
            info!("passthrough off: it needs CAP_SYS_ADMIN; cached files are served through the daemon");
        } else if config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
            && config.set_max_stack_depth(1).is_ok()
        {
            debug!("passthrough on for fully cached files");
            return crate::sys::shm::INIT_PASSTHROUGH;
        } else {
            info!("passthrough off: this kernel does not offer it");
        }
    }
    0
}

/// Answers an xattr request of `size` bytes with `value`: its size when
/// asked for 0, ERANGE when it does not fit.
fn xattr_reply(value: &[u8], size: u32, reply: ReplyXattr) {
    if size == 0 {
        reply.size(value.len() as u32);
    } else if (size as usize) < value.len() {
        reply.error(Errno::from_i32(libc::ERANGE));
    } else {
        reply.data(value);
    }
}
