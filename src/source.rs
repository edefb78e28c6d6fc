//! The source: where the data set really lives (a directory on NFS, Lustre,
//! GPFS or a local disk). This module lists, stats and reads it, and pins
//! every read to a [`SourceVersion`] so that bytes of a changed file are never
//! mixed with bytes of the version that was opened.
//!
//! It must never write to the source, and never return bytes without checking
//! that the file still is the version the caller asked for.

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use thiserror::Error;
use tracing::info;

/// The identity and content version of a file at the source: a changed file
/// is a new version, and cached bytes of the old one are never served for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SourceVersion {
    pub size: u64,
    pub mtime_ns: i64,
    pub ino: u64,
}

/// What kind of object a directory entry is (only what a read-only mount
/// presents).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    Dir,
    File,
    Symlink,
    Other,
}

/// The attributes of one source entry, as `lstat` gives them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SourceAttr {
    pub kind: EntryKind,
    pub size: u64,
    pub blocks: u64,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub ino: u64,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

impl SourceAttr {
    pub fn from_metadata(m: &std::fs::Metadata) -> Self {
        let ft = m.file_type();
        let kind = if ft.is_dir() {
            EntryKind::Dir
        } else if ft.is_file() {
            EntryKind::File
        } else if ft.is_symlink() {
            EntryKind::Symlink
        } else {
            EntryKind::Other
        };
        SourceAttr {
            kind,
            size: m.size(),
            blocks: m.blocks(),
            mode: m.mode(),
            nlink: m.nlink() as u32,
            uid: m.uid(),
            gid: m.gid(),
            rdev: m.rdev() as u32,
            ino: m.ino(),
            atime_ns: m.atime() * 1_000_000_000 + m.atime_nsec(),
            mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
            ctime_ns: m.ctime() * 1_000_000_000 + m.ctime_nsec(),
        }
    }

    /// The content version this attribute set describes.
    pub fn version(&self) -> SourceVersion {
        SourceVersion {
            size: self.size,
            mtime_ns: self.mtime_ns,
            ino: self.ino,
        }
    }
}

/// Why a read from the source failed; each maps to one errno for the reader.
#[derive(Debug, Error)]
pub enum SourceError {
    #[error("{path}: not found at the source")]
    NotFound { path: PathBuf },
    #[error("{path}: changed at the source while being read (the opened version is gone)")]
    Changed { path: PathBuf },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl SourceError {
    fn io(path: &Path, e: io::Error) -> Self {
        if e.kind() == io::ErrorKind::NotFound {
            SourceError::NotFound {
                path: path.to_owned(),
            }
        } else {
            SourceError::Io {
                path: path.to_owned(),
                source: e,
            }
        }
    }

    /// The errno a FUSE reply should carry for this error.
    pub fn errno(&self) -> i32 {
        match self {
            SourceError::NotFound { .. } => libc::ENOENT,
            SourceError::Changed { .. } => libc::EIO,
            SourceError::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}

/// The seam between locafs and the storage it caches. Paths are relative to
/// the data set's root ("" is the root). Tests put slow or failing sources
/// behind it.
pub trait Source: Send + Sync + 'static {
    /// `lstat` of one entry.
    fn stat(&self, rel: &Path) -> io::Result<SourceAttr>;
    /// Every entry of a directory with its attributes (no "." or "..").
    fn list(&self, rel: &Path) -> io::Result<Vec<(OsString, SourceAttr)>>;
    /// The target of a symlink.
    fn read_link(&self, rel: &Path) -> io::Result<PathBuf>;
    /// Exactly `len` bytes at `offset` of version `version` of a file, or an
    /// error; `SourceError::Changed` if the file is not (or no longer) that
    /// version.
    fn read_at(
        &self,
        rel: &Path,
        version: &SourceVersion,
        offset: u64,
        len: usize,
    ) -> Result<Bytes, SourceError>;
    /// `statvfs` of the source, for `df` on the mount.
    fn statvfs(&self) -> io::Result<libc::statvfs>;

    /// [`Source::stat`] for async callers (see [`Source::read_at_async`]).
    fn stat_async(self: Arc<Self>, rel: PathBuf) -> BoxFuture<'static, io::Result<SourceAttr>> {
        Box::pin(async move {
            tokio::task::spawn_blocking(move || self.stat(&rel))
                .await
                .unwrap_or_else(|e| Err(io::Error::other(e)))
        })
    }

    /// [`Source::list`] for async callers (see [`Source::read_at_async`]).
    fn list_async(
        self: Arc<Self>,
        rel: PathBuf,
    ) -> BoxFuture<'static, io::Result<Vec<(OsString, SourceAttr)>>> {
        Box::pin(async move {
            tokio::task::spawn_blocking(move || self.list(&rel))
                .await
                .unwrap_or_else(|e| Err(io::Error::other(e)))
        })
    }

    /// [`Source::read_at`] for async callers. The default runs it on the
    /// runtime's blocking pool; the [`SourceGuard`](crate::source_guard::SourceGuard)
    /// runs it on its own bounded pool and holds no thread while it waits.
    fn read_at_async(
        self: Arc<Self>,
        rel: Arc<Path>,
        version: SourceVersion,
        offset: u64,
        len: usize,
    ) -> BoxFuture<'static, Result<Bytes, SourceError>> {
        Box::pin(async move {
            let r = Arc::clone(&rel);
            tokio::task::spawn_blocking(move || self.read_at(&r, &version, offset, len))
                .await
                .unwrap_or_else(|e| {
                    Err(SourceError::Io {
                        path: rel.to_path_buf(),
                        source: io::Error::other(e),
                    })
                })
        })
    }

    /// Whether the source has stopped answering (calls that need it fail
    /// at once until it answers again). Only the guard knows; a plain
    /// source is never stalled.
    fn stalled(&self) -> bool {
        false
    }
}

/// A source that is a directory of the local file system (which may itself be
/// an NFS, Lustre or GPFS mount).
pub struct DirSource {
    root: PathBuf,
    /// Whether blocks are read with O_DIRECT (until the source's file system
    /// refuses it).
    direct: AtomicBool,
}

impl DirSource {
    pub fn new(root: PathBuf) -> Self {
        DirSource {
            root,
            direct: AtomicBool::new(true),
        }
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
        let dir = self.full(rel);
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&dir)? {
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

    fn read_link(&self, rel: &Path) -> io::Result<PathBuf> {
        std::fs::read_link(self.full(rel))
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
        let check = |f: &File| -> Result<(), SourceError> {
            let m = f.metadata().map_err(|e| SourceError::io(rel, e))?;
            if SourceAttr::from_metadata(&m).version() != *version {
                return Err(SourceError::Changed {
                    path: rel.to_owned(),
                });
            }
            Ok(())
        };
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
        // after the read: a file rewritten before or during the read has
        // another size, mtime or inode by then.
        check(&file)?;
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
}
