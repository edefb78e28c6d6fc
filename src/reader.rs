//! The read path: turns "bytes [offset, offset+len) of this file version"
//! into verified bytes, block by block, from the fastest tier that has each
//! block: memory, the local disk cache, then the source (later: the owner
//! peer). Concurrent requests for one missing block share a single fetch
//! (single flight), and every wait on the source has a deadline.
//!
//! Blocks fetched from the source are handed to the reader first and written
//! to the disk cache afterwards, off the reply path. Nothing here may panic
//! or serve a byte that did not pass its checksum or come straight from the
//! source version that was opened; a cache fault is a miss, and only a source
//! failure fails a read, and then only that read.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::future::{BoxFuture, FutureExt, Shared};
use parking_lot::Mutex;
use thiserror::Error;
use tokio::runtime::Handle;

use crate::cache::{BlockCache, BlockId, ChecksummedBytes, FileVersion};
use crate::source::{Source, SourceError};
use crate::stats::Stats;

/// Why a read failed; carries the errno the FUSE reply gets.
#[derive(Debug, Error, Clone)]
pub enum ReadError {
    #[error("{0}")]
    Source(Arc<SourceError>),
    #[error("timed out after {0:?} waiting for the source")]
    Timeout(Duration),
    #[error("internal error: {0}")]
    Internal(String),
}

impl ReadError {
    pub fn errno(&self) -> i32 {
        match self {
            ReadError::Source(e) => e.errno(),
            ReadError::Timeout(_) => libc::ETIMEDOUT,
            ReadError::Internal(_) => libc::EIO,
        }
    }
}

type Fetch = Shared<BoxFuture<'static, Result<ChecksummedBytes, ReadError>>>;

/// Tunables of the read path.
#[derive(Clone, Debug)]
pub struct ReaderConfig {
    pub block_size: u64,
    /// Bytes of recently used blocks kept in memory (serves partial-block
    /// reads without re-reading and re-hashing the block).
    pub memory_bytes: u64,
    /// The longest a read waits on the source before failing with ETIMEDOUT.
    pub source_timeout: Duration,
}

/// The read path of one mount.
pub struct Reader {
    cfg: ReaderConfig,
    cache: Arc<dyn BlockCache>,
    source: Arc<dyn Source>,
    memory: moka::sync::Cache<BlockId, ChecksummedBytes>,
    inflight: Mutex<HashMap<BlockId, Fetch>>,
    rt: Handle,
    stats: Arc<Stats>,
}

impl Reader {
    pub fn new(
        cfg: ReaderConfig,
        cache: Arc<dyn BlockCache>,
        source: Arc<dyn Source>,
        rt: Handle,
        stats: Arc<Stats>,
    ) -> Arc<Self> {
        let memory = moka::sync::Cache::builder()
            .max_capacity(cfg.memory_bytes)
            .weigher(|_k: &BlockId, v: &ChecksummedBytes| {
                v.data().len().try_into().unwrap_or(u32::MAX)
            })
            .build();
        Arc::new(Reader {
            cfg,
            cache,
            source,
            memory,
            inflight: Mutex::new(HashMap::new()),
            rt,
            stats,
        })
    }

    pub fn cache(&self) -> &Arc<dyn BlockCache> {
        &self.cache
    }

    pub fn block_size(&self) -> u64 {
        self.cfg.block_size
    }

    fn blocks(&self, file: &FileVersion, offset: u64, len: u32) -> std::ops::Range<u64> {
        let end = (offset + len as u64).min(file.version.size);
        if offset >= end {
            return 0..0;
        }
        offset / self.cfg.block_size..end.div_ceil(self.cfg.block_size)
    }

    /// A block from memory or the local disk cache, without waiting on
    /// anything remote. Cheap enough to call on a FUSE thread.
    fn local_block(&self, file: &FileVersion, index: u64) -> Option<ChecksummedBytes> {
        let id = BlockId {
            key: file.key,
            index,
        };
        if let Some(b) = self.memory.get(&id) {
            return Some(b);
        }
        let b = self.cache.get(file, index)?;
        self.memory.insert(id, b.clone());
        Some(b)
    }

    fn assemble(
        &self,
        file: &FileVersion,
        offset: u64,
        len: u32,
        blocks: &[ChecksummedBytes],
        first: u64,
    ) -> Bytes {
        let end = (offset + len as u64).min(file.version.size);
        if blocks.len() == 1 {
            let start = (offset - first * self.cfg.block_size) as usize;
            return blocks[0]
                .data()
                .slice(start..start + (end - offset) as usize);
        }
        let mut out = BytesMut::with_capacity((end - offset) as usize);
        for (i, b) in blocks.iter().enumerate() {
            let bstart = (first + i as u64) * self.cfg.block_size;
            let from = offset.saturating_sub(bstart) as usize;
            let to = ((end - bstart) as usize).min(b.data().len());
            out.extend_from_slice(&b.data()[from..to]);
        }
        out.freeze()
    }

    /// The fast path: the whole range from memory and the disk cache, or None
    /// if any block is missing there.
    pub fn read_local(&self, file: &FileVersion, offset: u64, len: u32) -> Option<Bytes> {
        let range = self.blocks(file, offset, len);
        if range.is_empty() {
            return Some(Bytes::new());
        }
        let mut blocks = Vec::with_capacity(range.clone().count());
        for i in range.clone() {
            blocks.push(self.local_block(file, i)?);
        }
        let out = self.assemble(file, offset, len, &blocks, range.start);
        self.stats
            .cache_hit_bytes
            .fetch_add(out.len() as u64, Relaxed);
        self.cache.record_access(file, out.len() as u64);
        Some(out)
    }

    /// The full path: each block from the fastest tier that has it, fetching
    /// missing blocks from the source (once, however many readers wait).
    pub async fn read(
        self: Arc<Self>,
        file: Arc<FileVersion>,
        offset: u64,
        len: u32,
    ) -> Result<Bytes, ReadError> {
        let range = self.blocks(&file, offset, len);
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        let mut fetches = Vec::new();
        let mut hit = 0u64;
        let mut miss = 0u64;
        for i in range.clone() {
            match self.local_block(&file, i) {
                Some(b) => {
                    hit += b.data().len() as u64;
                    fetches.push(futures::future::ready(Ok(b)).boxed());
                }
                None => {
                    miss += file.block_len(i, self.cfg.block_size) as u64;
                    fetches.push(self.fetch(&file, i).boxed());
                }
            }
        }
        let deadline = self.cfg.source_timeout;
        let blocks =
            match tokio::time::timeout(deadline, futures::future::try_join_all(fetches)).await {
                Ok(Ok(b)) => b,
                Ok(Err(e)) => {
                    self.stats.read_errors.fetch_add(1, Relaxed);
                    return Err(e);
                }
                Err(_) => {
                    self.stats.read_errors.fetch_add(1, Relaxed);
                    return Err(ReadError::Timeout(deadline));
                }
            };
        let out = self.assemble(&file, offset, len, &blocks, range.start);
        self.stats
            .cache_hit_bytes
            .fetch_add(hit.min(out.len() as u64), Relaxed);
        self.stats
            .cache_miss_bytes
            .fetch_add(miss.min(out.len() as u64), Relaxed);
        self.cache.record_access(&file, out.len() as u64);
        Ok(out)
    }

    /// Makes sure a block is in the cache (or in memory) without returning
    /// it: what read-ahead and warm-up ask for.
    pub async fn prefetch(
        self: Arc<Self>,
        file: Arc<FileVersion>,
        index: u64,
    ) -> Result<(), ReadError> {
        if self.local_block(&file, index).is_some() {
            return Ok(());
        }
        tokio::time::timeout(self.cfg.source_timeout, self.fetch(&file, index))
            .await
            .map_err(|_| ReadError::Timeout(self.cfg.source_timeout))?
            .map(|_| ())
    }

    /// The single-flight fetch of one block from the source.
    fn fetch(self: &Arc<Self>, file: &Arc<FileVersion>, index: u64) -> Fetch {
        let id = BlockId {
            key: file.key,
            index,
        };
        let mut inflight = self.inflight.lock();
        if let Some(f) = inflight.get(&id) {
            return f.clone();
        }
        let me = Arc::clone(self);
        let file = Arc::clone(file);
        // The fetch runs as its own task so that it completes (and fills the
        // cache) even if every reader waiting on it gives up.
        let task = self.rt.spawn(async move {
            let me2 = Arc::clone(&me);
            let file2 = Arc::clone(&file);
            let res = tokio::task::spawn_blocking(move || me2.fetch_blocking(&file2, index))
                .await
                .unwrap_or_else(|e| Err(ReadError::Internal(format!("fetch task failed: {e}"))));
            me.inflight.lock().remove(&id);
            if let Ok(block) = &res {
                me.memory.insert(id, block.clone());
                // Written after the waiters got their bytes.
                let (me3, file3, block3) = (Arc::clone(&me), Arc::clone(&file), block.clone());
                tokio::task::spawn_blocking(move || {
                    me3.cache.put(&file3, index, &block3);
                });
            }
            res
        });
        let fut: Fetch = async move {
            task.await
                .unwrap_or_else(|e| Err(ReadError::Internal(format!("fetch task failed: {e}"))))
        }
        .boxed()
        .shared();
        inflight.insert(id, fut.clone());
        fut
    }

    fn fetch_blocking(
        &self,
        file: &FileVersion,
        index: u64,
    ) -> Result<ChecksummedBytes, ReadError> {
        // Another fetch may have filled the cache since we looked.
        if let Some(b) = self.cache.get(file, index) {
            return Ok(b);
        }
        let len = file.block_len(index, self.cfg.block_size);
        let data = self
            .source
            .read_at(&file.rel, &file.version, index * self.cfg.block_size, len)
            .map_err(|e| {
                self.stats.source_errors.fetch_add(1, Relaxed);
                ReadError::Source(Arc::new(e))
            })?;
        self.stats.source_bytes.fetch_add(len as u64, Relaxed);
        self.stats.source_reads.fetch_add(1, Relaxed);
        Ok(ChecksummedBytes::from_source(Bytes::from(data)))
    }
}
