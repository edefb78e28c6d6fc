//! A source that can be made to hang, as a hard NFS mount does when its
//! server stops: while stalled, every call (stat, list, readlink, statvfs,
//! read) blocks until the stall ends, and cannot be cancelled. A test seam
//! (the `Source` trait) around a real directory, never a user feature.

#![allow(dead_code)]

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Condvar, Mutex};

use locafs::source::{DirSource, Source, SourceAttr, SourceError, SourceVersion};

pub struct StallSource {
    inner: DirSource,
    stalled: Mutex<bool>,
    resumed: Condvar,
    /// Calls blocked in the stall right now, and the most there were.
    pub stuck: AtomicU64,
    pub max_stuck: AtomicU64,
}

impl StallSource {
    pub fn new(root: &Path) -> Self {
        StallSource {
            inner: DirSource::new(root.to_owned()),
            stalled: Mutex::new(false),
            resumed: Condvar::new(),
            stuck: AtomicU64::new(0),
            max_stuck: AtomicU64::new(0),
        }
    }

    /// From now on every call hangs until [`StallSource::resume`].
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

impl Source for StallSource {
    fn stat(&self, rel: &Path) -> io::Result<SourceAttr> {
        self.gate();
        self.inner.stat(rel)
    }
    fn list(&self, rel: &Path) -> io::Result<Vec<(OsString, SourceAttr)>> {
        self.gate();
        self.inner.list(rel)
    }
    fn read_link(&self, rel: &Path) -> io::Result<PathBuf> {
        self.gate();
        self.inner.read_link(rel)
    }
    fn read_at(
        &self,
        rel: &Path,
        version: &SourceVersion,
        offset: u64,
        len: usize,
    ) -> Result<bytes::Bytes, SourceError> {
        self.gate();
        self.inner.read_at(rel, version, offset, len)
    }
    fn statvfs(&self) -> io::Result<libc::statvfs> {
        self.gate();
        self.inner.statvfs()
    }
}
