//! Open file handles and the per-inode open mode. The kernel keeps each FUSE
//! inode either in cached mode (reads go through the daemon and the page
//! cache) or in passthrough mode (the kernel reads the cached file itself),
//! never both: an open that would mix them fails with EIO in the user's
//! `open()`. This table decides the mode of every open so that never
//! happens, shares one backing id among all passthrough opens of an inode,
//! and says when the page cache may be kept (same version as last open).
//!
//! Pure bookkeeping over a generic backing token `B`; no I/O, no FUSE types.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::cache::{FileVersion, VersionKey};

/// What an open turned into.
#[derive(Debug)]
pub enum OpenMode<B> {
    /// Reads come to the daemon; keep the kernel's page cache if the file is
    /// the same version as at the previous open.
    Cached { keep_cache: bool },
    /// The kernel reads the cached file through this backing token.
    Passthrough(Arc<B>),
}

/// One open file handle.
#[derive(Debug)]
pub struct Handle {
    pub ino: u64,
    pub file: Arc<FileVersion>,
    pub passthrough: bool,
    /// Sequential-read detection for read-ahead.
    pub seq: Mutex<crate::prefetch::SeqState>,
}

#[derive(Debug)]
struct InodeState<B> {
    cached_opens: u32,
    passthrough: Option<(u32, VersionKey, Arc<B>)>,
    last_version: Option<VersionKey>,
}

/// Why an open cannot be given any mode right now.
#[derive(Debug, PartialEq, Eq)]
pub struct ModeConflict;

#[derive(Debug)]
struct Inner<B> {
    handles: HashMap<u64, Arc<Handle>>,
    inodes: HashMap<u64, InodeState<B>>,
    next_fh: u64,
}

/// The table of open handles of one mount.
#[derive(Debug)]
pub struct OpenFiles<B> {
    inner: Mutex<Inner<B>>,
}

impl<B> Default for OpenFiles<B> {
    fn default() -> Self {
        OpenFiles {
            inner: Mutex::new(Inner {
                handles: HashMap::new(),
                inodes: HashMap::new(),
                next_fh: 1,
            }),
        }
    }
}

impl<B> OpenFiles<B> {
    /// Whether `ino` has no open handle: only then is it worth preparing a
    /// backing file for passthrough (otherwise the open follows the mode the
    /// inode is already in).
    pub fn is_idle(&self, ino: u64) -> bool {
        let inner = self.inner.lock();
        inner
            .inodes
            .get(&ino)
            .is_none_or(|s| s.cached_opens == 0 && s.passthrough.is_none())
    }

    /// Registers an open. `backing` is a ready backing token if the caller
    /// prepared one (it is used only if the inode can take passthrough now;
    /// otherwise it is dropped and the open is cached). Returns the handle
    /// number, the mode, and whether this version is new for the inode (not
    /// the one its previous open saw).
    pub fn open(
        &self,
        ino: u64,
        file: Arc<FileVersion>,
        backing: Option<B>,
    ) -> Result<(u64, OpenMode<B>, bool), ModeConflict> {
        let mut inner = self.inner.lock();
        let inner = &mut *inner;
        let st = inner.inodes.entry(ino).or_insert(InodeState {
            cached_opens: 0,
            passthrough: None,
            last_version: None,
        });
        let keep_cache = st.last_version == Some(file.key);
        let mode = match (&mut st.passthrough, backing) {
            (Some((n, key, b)), _) if *key == file.key => {
                *n += 1;
                OpenMode::Passthrough(Arc::clone(b))
            }
            // Open in passthrough on another version: neither mode works.
            (Some(_), _) => return Err(ModeConflict),
            (None, Some(b)) if st.cached_opens == 0 => {
                let b = Arc::new(b);
                st.passthrough = Some((1, file.key, Arc::clone(&b)));
                OpenMode::Passthrough(b)
            }
            (None, _) => {
                st.cached_opens += 1;
                OpenMode::Cached { keep_cache }
            }
        };
        let new_version = !keep_cache;
        st.last_version = Some(file.key);
        let fh = inner.next_fh;
        inner.next_fh += 1;
        let passthrough = matches!(mode, OpenMode::Passthrough(_));
        inner.handles.insert(
            fh,
            Arc::new(Handle {
                ino,
                file,
                passthrough,
                seq: Mutex::default(),
            }),
        );
        Ok((fh, mode, new_version))
    }

    pub fn get(&self, fh: u64) -> Option<Arc<Handle>> {
        self.inner.lock().handles.get(&fh).cloned()
    }

    /// Forgets a handle. Returns it, and whether it was the last passthrough
    /// open of its inode (the backing token has then been dropped).
    pub fn release(&self, fh: u64) -> Option<(Arc<Handle>, bool)> {
        let mut inner = self.inner.lock();
        let h = inner.handles.remove(&fh)?;
        let mut last_passthrough = false;
        if let Some(st) = inner.inodes.get_mut(&h.ino) {
            if h.passthrough {
                if let Some((n, _, _)) = &mut st.passthrough {
                    *n -= 1;
                    if *n == 0 {
                        st.passthrough = None;
                        last_passthrough = true;
                    }
                }
            } else {
                st.cached_opens = st.cached_opens.saturating_sub(1);
            }
        }
        Some((h, last_passthrough))
    }

    pub fn open_count(&self) -> usize {
        self.inner.lock().handles.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::SourceVersion;
    use std::path::Path;

    fn fv(size: u64) -> Arc<FileVersion> {
        Arc::new(FileVersion::new(
            Arc::from(Path::new("a")),
            SourceVersion {
                size,
                mtime_ns: 1,
                ino: 2,
            },
        ))
    }

    #[test]
    fn modes_never_mix_on_one_inode() {
        let t: OpenFiles<&'static str> = OpenFiles::default();
        let f = fv(10);
        let (a, m, _) = t.open(7, f.clone(), None).unwrap();
        assert!(matches!(m, OpenMode::Cached { keep_cache: false }));
        assert!(!t.is_idle(7));
        // A backing offered while cached handles exist is not used.
        let (b, m, _) = t.open(7, f.clone(), Some("backing")).unwrap();
        assert!(matches!(m, OpenMode::Cached { keep_cache: true }));
        t.release(a);
        t.release(b);
        assert!(t.is_idle(7));
        let (c, m, _) = t.open(7, f.clone(), Some("backing")).unwrap();
        let OpenMode::Passthrough(id) = m else {
            panic!()
        };
        // Later opens share the same backing, even without offering one.
        let (d, m, _) = t.open(7, f.clone(), None).unwrap();
        let OpenMode::Passthrough(id2) = m else {
            panic!()
        };
        assert!(Arc::ptr_eq(&id, &id2));
        // Another version cannot be opened while passthrough is active.
        assert_eq!(t.open(7, fv(11), None).unwrap_err(), ModeConflict);
        assert!(!t.release(c).unwrap().1);
        assert!(t.release(d).unwrap().1);
        assert_eq!(t.open_count(), 0);
    }

    #[test]
    fn keep_cache_only_for_the_same_version() {
        let t: OpenFiles<()> = OpenFiles::default();
        let (a, _, _) = t.open(3, fv(10), None).unwrap();
        t.release(a);
        let (_, m, _) = t.open(3, fv(10), None).unwrap();
        assert!(matches!(m, OpenMode::Cached { keep_cache: true }));
        let (_, m, _) = t.open(3, fv(20), None).unwrap();
        assert!(matches!(m, OpenMode::Cached { keep_cache: false }));
    }
}
