//! A source that behaves like shared storage over a network: a fixed
//! latency per request and one bandwidth cap for all requests, wrapped around
//! a real directory. It records every read so tests can see what reached the
//! source, in what order, and how much was in flight at once. A test seam
//! (the `Source` trait), never a user feature.

#![allow(dead_code)]

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use locafs::source::{DirSource, Source, SourceAttr, SourceError, SourceVersion};

/// One read that reached the source.
#[derive(Clone, Debug)]
pub struct SourceRead {
    pub path: PathBuf,
    pub offset: u64,
    pub len: usize,
    pub at: Instant,
}

pub struct SlowSource {
    inner: DirSource,
    latency: Duration,
    /// Bytes per second for all requests together (0: unlimited).
    bandwidth: u64,
    next_free: Mutex<Instant>,
    pub reads: Mutex<Vec<SourceRead>>,
    pub inflight_bytes: AtomicU64,
    pub max_inflight_bytes: AtomicU64,
    /// Metadata requests (stat, list, readlink) that reached the source.
    pub metadata_ops: AtomicU64,
}

impl SlowSource {
    pub fn new(root: &Path, latency: Duration, bandwidth: u64) -> Self {
        SlowSource {
            inner: DirSource::new(root.to_owned()),
            latency,
            bandwidth,
            next_free: Mutex::new(Instant::now()),
            reads: Mutex::new(Vec::new()),
            inflight_bytes: AtomicU64::new(0),
            max_inflight_bytes: AtomicU64::new(0),
            metadata_ops: AtomicU64::new(0),
        }
    }

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

impl Source for SlowSource {
    fn stat(&self, rel: &Path) -> io::Result<SourceAttr> {
        self.metadata_ops.fetch_add(1, SeqCst);
        self.inner.stat(rel)
    }
    fn list(&self, rel: &Path) -> io::Result<Vec<(OsString, SourceAttr)>> {
        self.metadata_ops.fetch_add(1, SeqCst);
        self.inner.list(rel)
    }
    fn read_link(&self, rel: &Path) -> io::Result<PathBuf> {
        self.metadata_ops.fetch_add(1, SeqCst);
        self.inner.read_link(rel)
    }
    fn read_at(
        &self,
        rel: &Path,
        version: &SourceVersion,
        offset: u64,
        len: usize,
    ) -> Result<bytes::Bytes, SourceError> {
        let now = self.inflight_bytes.fetch_add(len as u64, SeqCst) + len as u64;
        self.max_inflight_bytes.fetch_max(now, SeqCst);
        self.reads.lock().unwrap().push(SourceRead {
            path: rel.to_owned(),
            offset,
            len,
            at: Instant::now(),
        });
        self.delay(len);
        let r = self.inner.read_at(rel, version, offset, len);
        self.inflight_bytes.fetch_sub(len as u64, SeqCst);
        r
    }
    fn statvfs(&self) -> io::Result<libc::statvfs> {
        self.inner.statvfs()
    }
}
