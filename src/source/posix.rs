//! The POSIX source: a directory of the local file system (which may itself
//! be an NFS, Lustre or GPFS mount), read with O_DIRECT where it can, every
//! read checked against the asked-for version before and after.
//!
//! It must never write to the source, and never return bytes without checking
//! that the file still is the version the caller asked for.

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use tracing::{info, warn};

use super::{
    Acls, DirName, EntryKind, Source, SourceAttr, SourceError, SourceVersion, ACL_ACCESS_XATTR,
    ACL_DEFAULT_XATTR,
};

/// A source that is a directory of the local file system (which may itself be
/// an NFS, Lustre or GPFS mount).
pub struct DirSource {
    root: PathBuf,
    /// Whether blocks are read with O_DIRECT (until the source's file system
    /// refuses it).
    direct: AtomicBool,
    /// Whether versions are checked with `statx(AT_STATX_FORCE_SYNC)` (until
    /// the kernel says it has no statx: then `fstat`).
    fresh_stat: AtomicBool,
    /// Called between the version check before a read and the read itself
    /// (tests change the file at exactly that point).
    #[cfg(test)]
    before_read: parking_lot::Mutex<Option<Box<dyn Fn() + Send + Sync>>>,
}

impl DirSource {
    pub fn new(root: PathBuf) -> Self {
        DirSource {
            root,
            direct: AtomicBool::new(true),
            fresh_stat: AtomicBool::new(true),
            #[cfg(test)]
            before_read: parking_lot::Mutex::new(None),
        }
    }

    /// The version an open file is now, asked of the file system itself:
    /// `statx` with `AT_STATX_FORCE_SYNC`, so that NFS (or FUSE) asks its
    /// server rather than answering from an attribute cache that may predate
    /// a rewrite (then new bytes would be taken for the old version's). Falls
    /// back to `fstat` for good, with one log line, where statx is missing.
    fn version_now(&self, rel: &Path, f: &File) -> Result<SourceVersion, SourceError> {
        if self.fresh_stat.load(Ordering::Relaxed) {
            match crate::sys::fstat_fresh(f) {
                Ok((size, mtime_ns, ino)) => {
                    return Ok(SourceVersion {
                        size,
                        mtime_ns,
                        ino,
                    })
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                    if self.fresh_stat.swap(false, Ordering::Relaxed) {
                        warn!("source: statx(2) is not available ({e}); checking versions with fstat, which a network file system may answer from its attribute cache");
                    }
                }
                Err(e) => return Err(SourceError::io(rel, e)),
            }
        }
        let m = f.metadata().map_err(|e| SourceError::io(rel, e))?;
        Ok(SourceAttr::from_metadata(&m).version())
    }

    /// `SourceError::Changed` unless the open file is `version` now.
    fn check_version(
        &self,
        rel: &Path,
        f: &File,
        version: &SourceVersion,
    ) -> Result<(), SourceError> {
        if self.version_now(rel, f)? != *version {
            return Err(SourceError::Changed {
                path: rel.to_owned(),
            });
        }
        Ok(())
    }

    /// Opens a file for a block read: with O_DIRECT while the file system
    /// takes it, unless the range is in the source's page cache already
    /// (then a buffered read is a memory copy, and a direct one would read
    /// the disk again). Source bytes are read once into the cache, so a copy
    /// in the source's page cache only costs a memory copy and a page per
    /// 4 KiB (and pushes useful pages out). Returns the file and whether it
    /// is direct.
    fn open_for_read(&self, path: &Path, offset: u64, len: usize) -> io::Result<(File, bool)> {
        let f = File::open(path)?;
        let aligned = offset % crate::sys::DIRECT_READ_ALIGN as u64 == 0;
        if !aligned
            || !self.direct.load(Ordering::Relaxed)
            || crate::sys::is_cached(&f, offset, len)
        {
            return Ok((f, false));
        }
        // This descriptor is ours alone: switching it to O_DIRECT affects
        // no one else.
        match crate::sys::set_direct(&f, true) {
            Ok(()) => Ok((f, true)),
            Err(e) if refuses_direct(&e) => {
                self.direct_refused(&e);
                Ok((f, false))
            }
            Err(e) => Err(e),
        }
    }

    fn direct_refused(&self, e: &io::Error) {
        if self.direct.swap(false, Ordering::Relaxed) {
            info!("source: direct reads refused ({e}); reading the source through the page cache");
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn full(&self, rel: &Path) -> PathBuf {
        if rel.as_os_str().is_empty() {
            self.root.clone()
        } else {
            self.root.join(rel)
        }
    }
}

/// How a file system says it does not do direct I/O (or not with our
/// alignment).
fn refuses_direct(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP))
}

impl Source for DirSource {
    fn stat(&self, rel: &Path) -> io::Result<SourceAttr> {
        std::fs::symlink_metadata(self.full(rel)).map(|m| SourceAttr::from_metadata(&m))
    }

    fn list(&self, rel: &Path) -> io::Result<Vec<(OsString, SourceAttr)>> {
        self.list_with_progress(rel, &|| {})
    }

    fn list_with_progress(
        &self,
        rel: &Path,
        progress: &dyn Fn(),
    ) -> io::Result<Vec<(OsString, SourceAttr)>> {
        let dir = self.full(rel);
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&dir)? {
            progress();
            let entry = entry?;
            // An entry deleted between readdir and lstat is simply skipped.
            match entry.metadata() {
                Ok(m) => out.push((entry.file_name(), SourceAttr::from_metadata(&m))),
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    fn list_names(&self, rel: &Path, progress: &dyn Fn()) -> io::Result<Vec<DirName>> {
        use std::os::unix::fs::DirEntryExt;
        let mut out = Vec::new();
        for entry in std::fs::read_dir(self.full(rel))? {
            progress();
            let entry = entry?;
            // d_type; a file system that does not fill it in costs an
            // lstat here (as `find` does).
            let kind = match entry.file_type() {
                Ok(t) if t.is_dir() => EntryKind::Dir,
                Ok(t) if t.is_file() => EntryKind::File,
                Ok(t) if t.is_symlink() => EntryKind::Symlink,
                Ok(_) => EntryKind::Other,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            out.push(DirName {
                name: entry.file_name(),
                kind,
                ino: entry.ino(),
                attr: None,
            });
        }
        Ok(out)
    }

    fn read_link(&self, rel: &Path) -> io::Result<PathBuf> {
        std::fs::read_link(self.full(rel))
    }

    fn has_acls(&self) -> bool {
        true
    }

    /// Two `lgetxattr`s, neither following a symlink (a symlink has no ACL
    /// of its own); a file's default ACL is always absent.
    fn acls(&self, rel: &Path) -> io::Result<Acls> {
        let path = self.full(rel);
        let access = crate::sys::lgetxattr_opt(&path, ACL_ACCESS_XATTR)?;
        let default = crate::sys::lgetxattr_opt(&path, ACL_DEFAULT_XATTR)?;
        Ok(Acls {
            access: access.map(Vec::into_boxed_slice),
            default: default.map(Vec::into_boxed_slice),
        })
    }

    fn read_at(
        &self,
        rel: &Path,
        version: &SourceVersion,
        offset: u64,
        len: usize,
    ) -> Result<Bytes, SourceError> {
        let path = self.full(rel);
        let (mut file, direct) = self
            .open_for_read(&path, offset, len)
            .map_err(|e| SourceError::io(rel, e))?;
        // Before the read: the path may name another version already (no
        // byte of it is read then).
        self.check_version(rel, &file, version)?;
        #[cfg(test)]
        if let Some(hook) = &*self.before_read.lock() {
            hook();
        }
        let mut read = None;
        if direct {
            match crate::sys::read_direct_at(&file, len, offset) {
                Err(e) if refuses_direct(&e) => self.direct_refused(&e),
                Ok(None) => {}
                r => read = r.transpose(),
            }
            if read.is_none() {
                file = File::open(&path).map_err(|e| SourceError::io(rel, e))?;
            }
        }
        let read =
            read.unwrap_or_else(|| crate::sys::read_vec_at(&file, len, offset).map(Bytes::from));
        let buf = read.map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                SourceError::Changed {
                    path: rel.to_owned(),
                }
            } else {
                SourceError::io(rel, e)
            }
        })?;
        // The bytes are good only if the file is still the asked-for version
        // after the read: a file rewritten during the read has another size,
        // mtime or inode by then (a fresh stat: see `version_now`).
        self.check_version(rel, &file, version)?;
        Ok(buf)
    }

    fn statvfs(&self) -> io::Result<libc::statvfs> {
        crate::sys::statvfs(&self.root)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_time_past_2262_saturates_instead_of_overflowing() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("future");
        let f = std::fs::File::create(&p).unwrap();
        // 2300-01-01 (ext4 and xfs keep times up to 2446).
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(10_413_792_000);
        if f.set_modified(t).is_err() {
            eprintln!("SKIPPED: this file system cannot hold a time in 2300");
            return;
        }
        drop(f);
        std::fs::write(&p, b"from the future").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_modified(t)
            .unwrap();
        let src = DirSource::new(dir.path().to_owned());
        let a = src.stat(Path::new("future")).unwrap();
        assert_eq!(a.mtime_ns, i64::MAX);
        // Its version is the one a read checks against (statx's time is
        // converted the same way): the read succeeds.
        let got = src
            .read_at(Path::new("future"), &a.version(), 5, 3)
            .unwrap();
        assert_eq!(&got[..], b"the");
    }

    #[test]
    fn dir_source_names_match_its_listing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        std::fs::write(dir.path().join("f"), b"x").unwrap();
        std::os::unix::fs::symlink("f", dir.path().join("l")).unwrap();
        let src = DirSource::new(dir.path().to_owned());
        let calls = std::sync::atomic::AtomicU64::new(0);
        let tick = || {
            calls.fetch_add(1, Ordering::Relaxed);
        };
        let mut names = src.list_names(Path::new(""), &tick).unwrap();
        names.sort_by(|a, b| a.name.cmp(&b.name));
        let mut full: Vec<DirName> = src
            .list(Path::new(""))
            .unwrap()
            .into_iter()
            .map(|(name, a)| DirName {
                name,
                kind: a.kind,
                ino: a.ino,
                attr: None,
            })
            .collect();
        full.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(names, full);
        assert_eq!(names.len(), 3);
        assert_eq!(calls.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn dir_source_reads_exact_bytes_of_the_asked_version() {
        // /var/tmp: a disk file system, where reads are direct.
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let data: Vec<u8> = (0..3 * 4096 + 777u32).map(|i| (i % 253) as u8).collect();
        std::fs::write(dir.path().join("f"), &data).unwrap();
        // Out of the page cache, so that reads take the direct path.
        {
            use std::os::unix::io::AsRawFd;
            let f = File::open(dir.path().join("f")).unwrap();
            f.sync_all().unwrap();
            // SAFETY: posix_fadvise on an open descriptor.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
        let src = DirSource::new(dir.path().to_path_buf());
        let rel = Path::new("f");
        let v = src.stat(rel).unwrap().version();
        let direct = |s: &DirSource| s.direct.load(Ordering::Relaxed);
        let got = src.read_at(rel, &v, 0, data.len()).unwrap();
        assert!(got == data[..]);
        let was_direct = direct(&src);
        for (off, len) in [(8192, data.len() - 8192), (100, 5000), (4096, 1)] {
            let got = src.read_at(rel, &v, off as u64, len).unwrap();
            assert!(got == data[off..off + len], "offset {off} len {len}");
        }
        // An unaligned read is buffered; it does not turn direct reads off.
        assert_eq!(direct(&src), was_direct);
        // Past the end, or another version: Changed, never bytes.
        let e = src.read_at(rel, &v, 8192, 8192).unwrap_err();
        assert!(matches!(e, SourceError::Changed { .. }), "{e}");
        std::fs::write(dir.path().join("f"), b"new").unwrap();
        let e = src.read_at(rel, &v, 0, 3).unwrap_err();
        assert!(matches!(e, SourceError::Changed { .. }), "{e}");
    }

    #[test]
    fn a_file_rewritten_in_place_between_the_check_and_the_read_is_refused() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, vec![1u8; 8192]).unwrap();
        let src = DirSource::new(dir.path().to_path_buf());
        let rel = Path::new("f");
        let v = src.stat(rel).unwrap().version();
        let p2 = p.clone();
        *src.before_read.lock() = Some(Box::new(move || {
            // Same inode and size, new bytes and mtime.
            let f = std::fs::OpenOptions::new().write(true).open(&p2).unwrap();
            std::os::unix::fs::FileExt::write_all_at(&f, &[2u8; 8192], 0).unwrap();
            f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))
                .unwrap();
        }));
        let e = src.read_at(rel, &v, 0, 8192).unwrap_err();
        assert!(matches!(e, SourceError::Changed { .. }), "{e}");
    }

    /// A network file system in miniature: a FUSE mount serving one file
    /// ("f", inode 2) whose bytes and mtime the test changes on the
    /// "server", while the kernel keeps its attributes for an hour (as an
    /// NFS client's attribute cache does). Reads are direct (no page cache),
    /// so they see the server's bytes at once; the test counts them.
    mod stale_attrs {
        use super::*;
        use fuser::{
            FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
            OpenFlags, ReplyAttr, ReplyData, ReplyEntry, ReplyOpen, Request,
        };
        use std::ffi::OsStr;
        use std::sync::atomic::AtomicU64;
        use std::sync::Arc;
        use std::time::{Duration, UNIX_EPOCH};

        const TTL: Duration = Duration::from_secs(3600);

        #[derive(Default)]
        struct Server {
            /// The file's bytes and mtime (seconds).
            file: parking_lot::Mutex<(Vec<u8>, u64)>,
            reads: AtomicU64,
        }

        impl Server {
            fn set(&self, bytes: Vec<u8>, mtime_s: u64) {
                *self.file.lock() = (bytes, mtime_s);
            }
            fn attr(&self, ino: u64) -> FileAttr {
                let (size, mtime, kind, perm) = if ino == 1 {
                    (0, 1, FileType::Directory, 0o755)
                } else {
                    let f = self.file.lock();
                    (f.0.len() as u64, f.1, FileType::RegularFile, 0o644)
                };
                let t = UNIX_EPOCH + Duration::from_secs(mtime);
                FileAttr {
                    ino: INodeNo(ino),
                    size,
                    blocks: size.div_ceil(512),
                    atime: t,
                    mtime: t,
                    ctime: t,
                    crtime: t,
                    kind,
                    perm,
                    nlink: 1,
                    uid: 0,
                    gid: 0,
                    rdev: 0,
                    blksize: 4096,
                    flags: 0,
                }
            }
        }

        struct Fs(Arc<Server>);

        impl Filesystem for Fs {
            fn lookup(&self, _: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
                if parent.0 == 1 && name == "f" {
                    reply.entry(&TTL, &self.0.attr(2), Generation(0));
                } else {
                    reply.error(fuser::Errno::ENOENT);
                }
            }
            fn getattr(&self, _: &Request, ino: INodeNo, _: Option<FileHandle>, reply: ReplyAttr) {
                reply.attr(&TTL, &self.0.attr(ino.0));
            }
            fn open(&self, _: &Request, _: INodeNo, _: OpenFlags, reply: ReplyOpen) {
                reply.opened(FileHandle(1), FopenFlags::FOPEN_DIRECT_IO);
            }
            fn read(
                &self,
                _: &Request,
                _: INodeNo,
                _: FileHandle,
                offset: u64,
                size: u32,
                _: OpenFlags,
                _: Option<LockOwner>,
                reply: ReplyData,
            ) {
                self.0.reads.fetch_add(1, Ordering::SeqCst);
                let f = self.0.file.lock();
                let start = (offset as usize).min(f.0.len());
                let end = (start + size as usize).min(f.0.len());
                reply.data(&f.0[start..end]);
            }
        }

        #[test]
        fn new_bytes_under_a_cached_attribute_are_refused() {
            // Root, and a /dev/fuse that opens (as the kit's `fuse_missing`).
            // SAFETY: geteuid has no preconditions.
            use std::os::unix::fs::FileTypeExt;
            let root = unsafe { libc::geteuid() } == 0;
            let dev = std::fs::metadata("/dev/fuse").is_ok_and(|m| m.file_type().is_char_device())
                && std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open("/dev/fuse")
                    .is_ok();
            if !root || !dev {
                let why = format!(
                    "needs root and a /dev/fuse that opens (root: {root}, /dev/fuse: {dev})"
                );
                crate::test_skip::skipped(module_path!(), &why);
                return;
            }
            let mnt = tempfile::tempdir().unwrap();
            let server = Arc::new(Server::default());
            let old = vec![1u8; 8192];
            server.set(old.clone(), 1_000);
            let mut cfg = fuser::Config::default();
            cfg.mount_options = vec![fuser::MountOption::RO];
            let session = fuser::spawn_mount(Fs(Arc::clone(&server)), mnt.path(), &cfg)
                .expect("mount the test file system");
            let src = DirSource::new(mnt.path().to_path_buf());
            let rel = Path::new("f");
            let v = src.stat(rel).unwrap().version();
            assert!(src.read_at(rel, &v, 0, 8192).unwrap() == old[..]);

            // Rewritten on the server: same size, new bytes, new mtime. The
            // kernel still holds the old attributes (fstat says v).
            server.set(vec![2u8; 8192], 2_000);
            let f = File::open(mnt.path().join("f")).unwrap();
            assert_eq!(
                SourceAttr::from_metadata(&f.metadata().unwrap()).version(),
                v,
                "the kernel answered fstat from its attribute cache"
            );
            drop(f);
            let reads = server.reads.load(Ordering::SeqCst);
            let r = src.read_at(rel, &v, 0, 8192);
            assert!(
                matches!(r, Err(SourceError::Changed { .. })),
                "bytes of the new version served as the old one: {:?}",
                r.map(|b| b[0])
            );
            assert_eq!(
                server.reads.load(Ordering::SeqCst),
                reads,
                "the new version was read before its version was checked"
            );

            // Rewritten between the check before the read and the read.
            let v2 = SourceVersion {
                mtime_ns: 2_000 * 1_000_000_000,
                ..v
            };
            let s2 = Arc::clone(&server);
            *src.before_read.lock() = Some(Box::new(move || s2.set(vec![3u8; 8192], 3_000)));
            let r = src.read_at(rel, &v2, 0, 8192);
            assert!(
                matches!(r, Err(SourceError::Changed { .. })),
                "bytes of a newer version served: {:?}",
                r.map(|b| b[0])
            );
            drop(src);
            session.umount_and_join().unwrap();
        }
    }
}
