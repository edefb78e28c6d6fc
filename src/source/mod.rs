//! The source subsystem: where the data set lives (`posix`, `object` with
//! `aws_profile` and `credential_process`) and the guard that is the only
//! way the mount calls into it, every call with a deadline (`guard`).
//!
//! The source: where the data set really lives (a directory on NFS, Lustre,
//! GPFS or a local disk). This module lists, stats and reads it, and pins
//! every read to a [`SourceVersion`] so that bytes of a changed file are never
//! mixed with bytes of the version that was opened.
//!
//! It must never write to the source, and never return bytes without checking
//! that the file still is the version the caller asked for.
//!
//! Two kinds sit behind the [`Source`] trait: [`posix`] (a directory) and
//! [`object`] (an object store: s3://, gs://, az://; with [`aws_profile`]
//! for AWS named profiles and [`credential_process`] for the profiles whose
//! keys a command prints). Nothing above this module knows which kind it
//! reads.

pub mod aws_profile;
pub mod credential_process;
pub mod guard;
pub mod object;
pub mod posix;

pub use posix::DirSource;

use std::ffi::OsString;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use thiserror::Error;

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
            atime_ns: unix_ns(m.atime(), m.atime_nsec()),
            mtime_ns: unix_ns(m.mtime(), m.mtime_nsec()),
            ctime_ns: unix_ns(m.ctime(), m.ctime_nsec()),
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

pub use crate::sys::unix_ns;

/// One entry of a directory as `getdents` gives it: no attributes beyond
/// its kind and source inode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirName {
    pub name: OsString,
    pub kind: EntryKind,
    pub ino: u64,
    /// The entry's attributes when the listing gives them at no extra cost
    /// (an object store's listing does, `getdents` does not): the namespace
    /// then needs no stat (no HEAD request) to hand them out.
    pub attr: Option<SourceAttr>,
}

/// The extended attribute holding a file's or directory's POSIX access ACL
/// (the kernel's binary format: a version word, then 8-byte entries).
pub const ACL_ACCESS_XATTR: &str = "system.posix_acl_access";
/// The extended attribute holding a directory's default POSIX ACL.
pub const ACL_DEFAULT_XATTR: &str = "system.posix_acl_default";

/// The POSIX ACLs of one source entry, as the source's
/// `system.posix_acl_access` and `system.posix_acl_default` hold them,
/// passed to the kernel byte for byte (the kernel checks access against
/// them: see docs/security.md). None: the entry has no such ACL (its mode
/// bits say everything).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Acls {
    pub access: Option<Box<[u8]>>,
    pub default: Option<Box<[u8]>>,
}

impl Acls {
    /// Whether the entry has neither ACL.
    pub fn is_empty(&self) -> bool {
        self.access.is_none() && self.default.is_none()
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
    pub(crate) fn io(path: &Path, e: io::Error) -> Self {
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
    /// [`Source::list`] that calls `progress` as it goes (after each entry,
    /// or at least every few thousand), so that a caller waiting with a
    /// deadline can tell a long listing that advances from a source that
    /// stopped answering. The default lists in one piece, with no progress
    /// before the end.
    fn list_with_progress(
        &self,
        rel: &Path,
        progress: &dyn Fn(),
    ) -> io::Result<Vec<(OsString, SourceAttr)>> {
        let _ = progress;
        self.list(rel)
    }
    /// The names of a directory's entries with their kind and source inode
    /// only, as `getdents` gives them (no `lstat` of each entry: a cold walk
    /// of the source reads only its directories), calling `progress` as
    /// [`Source::list_with_progress`] does. The default takes them from
    /// [`Source::list_with_progress`].
    fn list_names(&self, rel: &Path, progress: &dyn Fn()) -> io::Result<Vec<DirName>> {
        Ok(self
            .list_with_progress(rel, progress)?
            .into_iter()
            .map(|(name, a)| DirName {
                name,
                kind: a.kind,
                ino: a.ino,
                attr: Some(a),
            })
            .collect())
    }
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

    /// Whether entries of this source can carry POSIX ACLs (a directory of
    /// a file system: its ACLs are served and the kernel enforces them); an
    /// object store has none. The default: none.
    fn has_acls(&self) -> bool {
        false
    }

    /// The POSIX ACLs of `rel` (of the entry itself, no symlink followed).
    /// The default: none.
    fn acls(&self, rel: &Path) -> io::Result<Acls> {
        let _ = rel;
        Ok(Acls::default())
    }

    /// [`Source::acls`] for a caller that must not wait (a FUSE thread), as
    /// [`Source::stat_then`]: `done` gets the answer on whatever thread has
    /// it; the source guard answers from its bounded workers within
    /// `--metadata-timeout`.
    fn acls_then(self: Arc<Self>, rel: PathBuf, done: Box<dyn FnOnce(io::Result<Acls>) + Send>) {
        on_own_thread("locafs-acls", "an ACL read", move || done(self.acls(&rel)));
    }

    /// [`Source::stat`] for async callers (see [`Source::read_at_async`]).
    fn stat_async(self: Arc<Self>, rel: PathBuf) -> BoxFuture<'static, io::Result<SourceAttr>> {
        Box::pin(async move {
            tokio::task::spawn_blocking(move || self.stat(&rel))
                .await
                .unwrap_or_else(|e| Err(io::Error::other(e)))
        })
    }

    /// [`Source::stat`] for a caller that must not wait (a FUSE thread):
    /// `done` gets the answer on whatever thread has it. The default asks
    /// on a thread of its own (with no deadline: for test sources); the
    /// source guard that every mount puts in front of its source answers
    /// from its bounded workers, within `--metadata-timeout`.
    fn stat_then(
        self: Arc<Self>,
        rel: PathBuf,
        done: Box<dyn FnOnce(io::Result<SourceAttr>) + Send>,
    ) {
        on_own_thread("locafs-stat", "a stat", move || done(self.stat(&rel)));
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

    /// [`Source::list_names`] for async callers (see
    /// [`Source::read_at_async`]).
    fn list_names_async(
        self: Arc<Self>,
        rel: PathBuf,
    ) -> BoxFuture<'static, io::Result<Vec<DirName>>> {
        Box::pin(async move {
            tokio::task::spawn_blocking(move || self.list_names(&rel, &|| {}))
                .await
                .unwrap_or_else(|e| Err(io::Error::other(e)))
        })
    }

    /// [`Source::read_at`] for async callers. The default runs it on the
    /// runtime's blocking pool; the [`SourceGuard`](crate::source::guard::SourceGuard)
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

    /// Whether [`Source::list_names`] gives every entry's attributes (an
    /// object store's listing does): a stale entry is then revalidated by
    /// listing its directory again, one request for many entries, rather
    /// than by a stat of each.
    fn listing_carries_attrs(&self) -> bool {
        false
    }

    /// Whether the source has stopped answering (calls that need it fail
    /// at once until it answers again). Only the guard knows; a plain
    /// source is never stalled.
    fn stalled(&self) -> bool {
        false
    }

    /// Entries of the source skipped because they cannot be presented as
    /// file names (an object key with an empty segment, `.` or `..`, or that
    /// is both a file and a directory), each warned about once.
    fn skipped_entries(&self) -> u64 {
        0
    }

    /// Answers of the source asking to slow down (an object store's 503
    /// SlowDown or 429), since it was opened. The source retries them
    /// itself; read-ahead takes a rise as a cut of its concurrency.
    fn throttled_responses(&self) -> u64 {
        0
    }

    /// Answers of the source refused as malformed, since it was opened: an
    /// object store's body longer or shorter than the range asked, a
    /// listing page past its size bound or that repeats its continuation
    /// token. Each failed only its own call.
    fn bad_replies(&self) -> u64 {
        0
    }
}

/// Runs `f` on a thread of its own named `name` (the defaults of
/// [`Source::stat_then`] and [`Source::acls_then`]); a thread that cannot
/// be made is logged (`what`: the call it was for).
fn on_own_thread(name: &str, what: &str, f: impl FnOnce() + Send + 'static) {
    if let Err(e) = std::thread::Builder::new().name(name.into()).spawn(f) {
        tracing::warn!("no thread for {what}: {e}");
    }
}
