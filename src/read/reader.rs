//! The read path: turns "bytes [offset, offset+len) of this file version"
//! into verified bytes, block by block, from the fastest tier that has each
//! block: memory, the local disk cache, then the source (later: the owner
//! peer). Concurrent requests for one missing block share a single fetch
//! (single flight), and every wait on the source has a deadline.
//!
//! Blocks fetched from the source are handed to the reader first and written
//! to the disk cache afterwards, off the reply path: a fetch is submitted to
//! the write-back queue (writeback.rs), which decides whether it is written. Nothing here may panic
//! or serve a byte that did not pass its checksum or come straight from the
//! source version that was opened; a cache fault is a miss, and only a source
//! failure fails a read, and then only that read.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures::future::{BoxFuture, FutureExt, Shared};
use parking_lot::Mutex;
use thiserror::Error;
use tokio::runtime::Handle;

use crate::cache::writeback::{AheadRoom, Write, WriteBack};
use crate::cache::{BlockId, BlockStore, ChecksummedBytes, FileVersion};
use crate::obs::metrics::{self, Tier};
use crate::obs::stats::Stats;
use crate::source::{Source, SourceError};

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

/// The tier between the local cache and the source: the caches of the other
/// nodes of the job. Implemented by the peer module; the reader only asks it.
pub trait PeerTier: Send + Sync + 'static {
    /// Whether this node reads this block from the source itself (it is the
    /// block's owner among the live members, or there is nobody else).
    fn owns(&self, file: &FileVersion, index: u64) -> bool;
    /// The block from its owner (or the next owner), verified against the
    /// checksum it came with; None on any failure, after a bounded wait: the
    /// caller then reads the source.
    fn fetch(
        &self,
        file: Arc<FileVersion>,
        index: u64,
        len: usize,
    ) -> BoxFuture<'static, Option<ChecksummedBytes>>;
}

type Fetch = Shared<BoxFuture<'static, Result<ChecksummedBytes, ReadError>>>;

/// Tunables of the read path.
#[derive(Clone, Debug)]
pub struct ReaderConfig {
    pub block_size: u64,
    /// Bytes of recently used blocks kept in memory (serves partial-block
    /// reads without re-reading and re-hashing the block).
    pub memory_bytes: u64,
    /// The most block bytes waiting for the disk cache at once; past it,
    /// blocks are served but not cached (the memory tier still holds them).
    pub write_queue_bytes: u64,
    /// The most bytes of the loader's blocks held in memory while they wait
    /// for room in the write queue; past it, such a block is not written
    /// now but remembered for background prefetch to complete.
    pub write_wait_bytes: u64,
    /// The longest a read waits on the source before failing with ETIMEDOUT.
    pub source_timeout: Duration,
}

/// The read path of one mount.
pub struct Reader {
    cfg: ReaderConfig,
    cache: Arc<dyn BlockStore>,
    source: Arc<dyn Source>,
    memory: moka::sync::Cache<BlockId, ChecksummedBytes>,
    inflight: Mutex<HashMap<BlockId, Fetch>>,
    peers: Option<Arc<dyn PeerTier>>,
    rt: Handle,
    stats: Arc<Stats>,
    /// Where fetched blocks go on their way to the disk cache.
    writeback: Arc<WriteBack>,
}

impl Reader {
    pub fn new(
        cfg: ReaderConfig,
        cache: Arc<dyn BlockStore>,
        source: Arc<dyn Source>,
        peers: Option<Arc<dyn PeerTier>>,
        rt: Handle,
        stats: Arc<Stats>,
    ) -> Arc<Self> {
        let memory = moka::sync::Cache::builder()
            .max_capacity(cfg.memory_bytes)
            // LRU, not moka's default TinyLFU: TinyLFU may refuse a block
            // just fetched (seen once) in favour of older ones, and the next
            // small read of that block then fetches it again; the block
            // just fetched is the one most likely to be read next.
            .eviction_policy(moka::policy::EvictionPolicy::lru())
            .weigher(|_k: &BlockId, v: &ChecksummedBytes| {
                v.data().len().try_into().unwrap_or(u32::MAX)
            })
            .build();
        let writeback = WriteBack::new(
            cfg.write_queue_bytes,
            cfg.write_wait_bytes,
            cfg.block_size,
            Arc::clone(&cache),
            rt.clone(),
            Arc::clone(&stats),
        );
        Arc::new(Reader {
            cfg,
            cache,
            source,
            memory,
            inflight: Mutex::new(HashMap::new()),
            peers,
            rt,
            stats,
            writeback,
        })
    }

    /// The write-back queue the reader's fetches go to (read-ahead asks it
    /// about the backlog).
    pub fn writeback(&self) -> &Arc<WriteBack> {
        &self.writeback
    }

    /// The mount's counters (read-ahead measures the source by them).
    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    pub fn cache(&self) -> &Arc<dyn BlockStore> {
        &self.cache
    }

    pub fn block_size(&self) -> u64 {
        self.cfg.block_size
    }

    /// Bytes of blocks held in memory now (for metrics).
    pub fn memory_bytes(&self) -> u64 {
        self.memory.run_pending_tasks();
        self.memory.weighted_size()
    }

    fn blocks(&self, file: &FileVersion, offset: u64, len: u32) -> std::ops::Range<u64> {
        let end = (offset + len as u64).min(file.version.size);
        if offset >= end {
            return 0..0;
        }
        offset / self.cfg.block_size..end.div_ceil(self.cfg.block_size)
    }

    /// A block from memory or the local disk cache, without waiting on
    /// anything remote: a disk read and a checksum of up to a block. Cheap
    /// enough for a FUSE thread (the fast path), not for a runtime thread:
    /// async code calls [`Reader::local_block_async`].
    fn local_block(&self, file: &FileVersion, index: u64) -> Option<ChecksummedBytes> {
        let id = BlockId {
            key: file.key,
            index,
        };
        let t = metrics::timer();
        if let Some(b) = self.memory.get(&id) {
            metrics::observe_tier(Tier::Cache, t, true);
            return Some(b);
        }
        let b = self.cache.get(file, index)?;
        metrics::observe_tier(Tier::Cache, t, true);
        self.remember(id, b.clone());
        Some(b)
    }

    /// [`Reader::local_block`] for async code: the disk read and checksum
    /// run on the blocking pool, and only for a block the cache holds.
    async fn local_block_async(
        self: &Arc<Self>,
        file: &Arc<FileVersion>,
        index: u64,
    ) -> Option<ChecksummedBytes> {
        let id = BlockId {
            key: file.key,
            index,
        };
        if let Some(b) = self.memory.get(&id) {
            metrics::observe_tier(Tier::Cache, metrics::timer(), true);
            return Some(b);
        }
        if !self.cache.is_block_cached(file, index) {
            return None;
        }
        let (me, f) = (Arc::clone(self), Arc::clone(file));
        tokio::task::spawn_blocking(move || me.local_block(&f, index))
            .await
            .ok()
            .flatten()
    }

    /// A block the disk cache holds, read on the blocking pool; fetched if
    /// the cache fails to serve it after all. Also says whether it was a
    /// hit.
    async fn cached_or_fetch(
        self: Arc<Self>,
        file: Arc<FileVersion>,
        index: u64,
    ) -> Result<(ChecksummedBytes, bool), ReadError> {
        if let Some(b) = self.local_block_async(&file, index).await {
            return Ok((b, true));
        }
        self.fetch(&file, index).await.map(|b| (b, false))
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
        // Blocks in the disk cache are read on the blocking pool (this is a
        // runtime thread), those missing fetched; all at once.
        let mut fetches = Vec::new();
        for i in range.clone() {
            let id = BlockId {
                key: file.key,
                index: i,
            };
            fetches.push(if let Some(b) = self.memory.get(&id) {
                metrics::observe_tier(Tier::Cache, metrics::timer(), true);
                futures::future::ready(Ok((b, true))).boxed()
            } else if self.cache.is_block_cached(&file, i) {
                Arc::clone(&self)
                    .cached_or_fetch(Arc::clone(&file), i)
                    .boxed()
            } else {
                self.fetch(&file, i).map(|r| r.map(|b| (b, false))).boxed()
            });
        }
        let deadline = self.cfg.source_timeout;
        let (mut hit, mut miss) = (0u64, 0u64);
        let blocks =
            match tokio::time::timeout(deadline, futures::future::try_join_all(fetches)).await {
                Ok(Ok(b)) => b
                    .into_iter()
                    .map(|(b, was_hit)| {
                        let n = b.data().len() as u64;
                        if was_hit {
                            hit += n;
                        } else {
                            miss += n;
                        }
                        b
                    })
                    .collect::<Vec<_>>(),
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

    /// Puts a block in the memory tier. moka evicts in batches (and its
    /// size figure lags), so under a stream of inserts it can run well past
    /// its bound: eviction is run here, at every insert (inserts are per
    /// block, at most a few thousand a second).
    fn remember(&self, id: BlockId, block: ChecksummedBytes) {
        self.memory.insert(id, block);
        self.memory.run_pending_tasks();
    }

    /// Bytes the memory tier may hold.
    pub fn memory_capacity(&self) -> u64 {
        self.cfg.memory_bytes
    }

    /// Whether this node reads this block from the source itself (always,
    /// without peers).
    pub fn owns(&self, file: &FileVersion, index: u64) -> bool {
        self.peers.as_ref().is_none_or(|p| p.owns(file, index))
    }

    /// Makes sure a block is in the disk cache, waiting for the write; for
    /// `locafs warm`. Ok(false) if the cache would not take it (full of data
    /// still in use, or the cache disk failing).
    pub async fn warm_block(
        self: Arc<Self>,
        file: Arc<FileVersion>,
        index: u64,
    ) -> Result<bool, ReadError> {
        if self.cache.is_block_cached(&file, index) {
            return Ok(true);
        }
        let block = tokio::time::timeout(self.cfg.source_timeout, self.fetch(&file, index))
            .await
            .map_err(|_| ReadError::Timeout(self.cfg.source_timeout))??;
        let (me, f) = (Arc::clone(&self), Arc::clone(&file));
        let stored = tokio::task::spawn_blocking(move || {
            me.cache.is_block_cached(&f, index) || me.cache.put(&f, index, &block)
        })
        .await
        .unwrap_or(false);
        if stored {
            return Ok(true);
        }
        // Another writer of this block (read-ahead's, racing the warm-up)
        // still at it on a saturated disk: `put` gave up waiting for it,
        // nothing failed. Wait for its outcome here, holding no thread, up
        // to the source timeout.
        let until = Instant::now() + self.cfg.source_timeout;
        while self.cache.is_block_being_written(&file, index) {
            if Instant::now() >= until {
                tracing::warn!(
                    "warm: {}: block {index}: another write of it to the cache disk has not finished in {}s (the disk is that slow)",
                    file.rel.display(),
                    self.cfg.source_timeout.as_secs()
                );
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(self.cache.is_block_cached(&file, index))
    }

    /// Makes sure a block is in the disk cache (or on its way there) without
    /// returning it: what read-ahead asks for. It first takes room in the
    /// write-back queue ([`WriteBack::room_ahead`]: after the loader's
    /// blocks), so read-ahead runs at the pace the cache disk takes and
    /// nothing it fetched is dropped for want of room. Then, only if the
    /// block must come from a peer or the source, it waits for `slot` (the
    /// read-ahead's limit of fetches in flight; None: give up) and holds
    /// it for the fetch: a fetch never holds a slot while it waits for the
    /// disk.
    pub async fn prefetch<S>(
        self: Arc<Self>,
        file: Arc<FileVersion>,
        index: u64,
        slot: impl std::future::Future<Output = Option<S>>,
    ) -> Result<(), ReadError> {
        // Nothing to do for a block the disk cache holds (without reading
        // and hashing it: the loader's read will verify it).
        if self.cache.is_block_cached(&file, index) {
            return Ok(());
        }
        let id = BlockId {
            key: file.key,
            index,
        };
        let kib = crate::cache::writeback::kib(file.block_len(index, self.cfg.block_size));
        let room = self
            .writeback
            .room_ahead(kib)
            .await
            .ok_or_else(|| ReadError::Internal("write queue closed".into()))?;
        if self.cache.is_block_cached(&file, index) {
            return Ok(());
        }
        // Fetched before but not written (the queue was full then): write
        // it from memory, unless a fetch of it is still in flight (that one
        // writes it).
        if let Some(block) = self.memory.get(&id) {
            if !self.inflight.lock().contains_key(&id) {
                let guest = !self.owns(&file, index);
                let write = Write {
                    file,
                    index,
                    block,
                    guest,
                    again: true,
                };
                self.writeback.submit(write, Some(room), || {});
            }
            return Ok(());
        }
        let Some(_slot) = slot.await else {
            return Ok(());
        };
        if self.cache.is_block_cached(&file, index) {
            return Ok(());
        }
        tokio::time::timeout(
            self.cfg.source_timeout,
            self.single_flight(&file, index, true, Some(room)),
        )
        .await
        .map_err(|_| ReadError::Timeout(self.cfg.source_timeout))?
        .map(|_| ())
    }

    /// Writes a block the disk cache refused before again, from the memory
    /// tier, with room taken in the write-back queue as read-ahead takes
    /// it; nothing if the block is cached by now, no longer in memory (the
    /// next read of it caches it) or being fetched (that fetch writes it).
    /// Never reads the source.
    pub async fn write_again(self: Arc<Self>, file: Arc<FileVersion>, index: u64) {
        let id = BlockId {
            key: file.key,
            index,
        };
        if self.cache.is_block_cached(&file, index) || !self.memory.contains_key(&id) {
            return;
        }
        let kib = crate::cache::writeback::kib(file.block_len(index, self.cfg.block_size));
        let Some(room) = self.writeback.room_ahead(kib).await else {
            return;
        };
        let Some(block) = self.memory.get(&id) else {
            return;
        };
        if self.cache.is_block_cached(&file, index) || self.inflight.lock().contains_key(&id) {
            return;
        }
        let write = Write {
            file,
            index,
            block,
            guest: false,
            again: true,
        };
        self.writeback.submit(write, Some(room), || {});
    }

    /// The single-flight fetch of one block: from the owner peer when another
    /// node owns it, else (or if that fails) from the source.
    fn fetch(self: &Arc<Self>, file: &Arc<FileVersion>, index: u64) -> Fetch {
        self.single_flight(file, index, true, None)
    }

    /// A block for a peer that asked this node as its owner: from the local
    /// cache or the source, never forwarded to another peer.
    pub async fn fetch_for_peer(
        self: Arc<Self>,
        file: Arc<FileVersion>,
        index: u64,
    ) -> Result<ChecksummedBytes, ReadError> {
        if let Some(b) = self.local_block_async(&file, index).await {
            return Ok(b);
        }
        tokio::time::timeout(
            self.cfg.source_timeout,
            self.single_flight(&file, index, false, None),
        )
        .await
        .map_err(|_| ReadError::Timeout(self.cfg.source_timeout))?
    }

    /// The fetch of one block shared by every request for it, then its
    /// submission to the write-back queue. `ahead`, if given, is room
    /// read-ahead already took in the queue for its cache write; without
    /// it the queue decides ([`crate::cache::writeback::admit`]).
    fn single_flight(
        self: &Arc<Self>,
        file: &Arc<FileVersion>,
        index: u64,
        ask_peers: bool,
        ahead: Option<AheadRoom>,
    ) -> Fetch {
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
            let res = me.fetch_uncached(&file, index, ask_peers).await;
            // The single flight stays open (resolved: later requests get the
            // block from it at once) until the block is in the disk cache, so
            // that no request can fall between the memory tier evicting the
            // block and the cache write landing, and read the source again.
            match &res {
                Ok((block, from_peer)) => {
                    me.remember(id, block.clone());
                    // Written after the waiters got their bytes, without
                    // making them wait; the single flight closes once the
                    // block is written (or at once if the queue skips it).
                    let write = Write {
                        file: Arc::clone(&file),
                        index,
                        block: block.clone(),
                        guest: *from_peer,
                        again: false,
                    };
                    let me2 = Arc::clone(&me);
                    me.writeback.submit(write, ahead, move || {
                        me2.inflight.lock().remove(&id);
                    });
                }
                Err(_) => {
                    me.inflight.lock().remove(&id);
                }
            }
            res.map(|(b, _)| b)
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

    /// Disk cache, then owner peer, then source. Returns the block and
    /// whether it came from a peer.
    async fn fetch_uncached(
        self: &Arc<Self>,
        file: &Arc<FileVersion>,
        index: u64,
        ask_peers: bool,
    ) -> Result<(ChecksummedBytes, bool), ReadError> {
        // Another fetch may have filled the cache since we looked (checked
        // in memory first: a blocking hop only when there is something to read).
        if self.cache.is_block_cached(file, index) {
            let me = Arc::clone(self);
            let f = Arc::clone(file);
            let cached = tokio::task::spawn_blocking(move || me.cache.get(&f, index))
                .await
                .ok()
                .flatten();
            if let Some(b) = cached {
                return Ok((b, false));
            }
        }
        if let (true, Some(peers)) = (ask_peers, &self.peers) {
            if !peers.owns(file, index) {
                let len = file.block_len(index, self.cfg.block_size);
                let t = metrics::timer();
                let got = peers.fetch(Arc::clone(file), index, len).await;
                let got = got.filter(|b| b.data().len() == len);
                metrics::observe_tier(Tier::Peer, t, got.is_some());
                if let Some(b) = got {
                    self.stats.peer_bytes.fetch_add(len as u64, Relaxed);
                    return Ok((b, true));
                }
            }
        }
        // The source read holds no thread here while it waits: the source
        // (its guard) runs it on a bounded pool of its own, and refuses it
        // at once while the source is stalled.
        let len = file.block_len(index, self.cfg.block_size);
        let t = metrics::timer();
        let data = Arc::clone(&self.source)
            .read_at_async(
                Arc::clone(&file.rel),
                file.version,
                index * self.cfg.block_size,
                len,
            )
            .await;
        metrics::observe_tier(Tier::Source, t, data.is_ok());
        let data = data.map_err(|e| {
            self.stats.source_errors.fetch_add(1, Relaxed);
            ReadError::Source(Arc::new(e))
        })?;
        self.stats.source_bytes.fetch_add(len as u64, Relaxed);
        self.stats.source_reads.fetch_add(1, Relaxed);
        Ok((ChecksummedBytes::from_source(data), false))
    }

    /// Whether the source is stalled now (read-ahead waits for its return
    /// rather than spend the epoch's files on refused fetches).
    pub fn source_stalled(&self) -> bool {
        self.source.stalled()
    }
}

#[cfg(test)]
mod tests {
    //! The write-back queue as the reader uses it, with a cache whose writes
    //! block until the test opens a gate (the kit's fakes): a loader's read never waits for a write, a loader's
    //! block that finds the queue full waits for room in memory (up to
    //! `write_wait_bytes`), and only past that is it left for background
    //! prefetch.

    use super::*;
    use crate::testing::{GatedCache, MemCache, MemSource};
    use std::path::Path;
    use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

    const BS: u64 = 4096;

    fn runtime(threads: usize) -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
            .unwrap()
    }

    /// The bytes of a file of `size` bytes whose block `i` is filled with
    /// byte `i`.
    fn file_data(size: u64) -> Vec<u8> {
        (0..size).map(|o| (o / BS) as u8).collect()
    }

    /// A source holding the file `f` of [`file_data`]`(size)`, and that
    /// file's version.
    fn one_file(size: u64) -> (Arc<MemSource>, Arc<FileVersion>) {
        let source = Arc::new(MemSource::new());
        let version = source.put_file("f", file_data(size));
        let file = FileVersion::new(Arc::from(Path::new("f")), version);
        (source, Arc::new(file))
    }

    /// A reader with room to spare (64 blocks of memory, 4 in the write
    /// queue) over `cache` and `source`.
    fn roomy_reader(
        cache: Arc<dyn BlockStore>,
        source: Arc<MemSource>,
        source_timeout: Duration,
        rt: &tokio::runtime::Runtime,
    ) -> Arc<Reader> {
        Reader::new(
            ReaderConfig {
                block_size: BS,
                memory_bytes: 64 * BS,
                write_queue_bytes: 4 * BS,
                write_wait_bytes: 4 * BS,
                source_timeout,
            },
            cache,
            source,
            None,
            rt.handle().clone(),
            Arc::new(Stats::default()),
        )
    }

    #[test]
    fn loader_blocks_wait_in_memory_for_the_write_queue_then_are_left_for_background() {
        let rt = runtime(2);
        let blocks = 8u64;
        let cache = Arc::new(GatedCache::new(MemCache::new(BS)));
        let (source, file) = one_file(blocks * BS);
        let stats = Arc::new(Stats::default());
        let reader = Reader::new(
            ReaderConfig {
                block_size: BS,
                memory_bytes: 64 * BS,
                // Room for one block's write, and for three more to wait.
                write_queue_bytes: BS,
                write_wait_bytes: 3 * BS,
                source_timeout: Duration::from_secs(60),
            },
            cache.clone(),
            source.clone(),
            None,
            rt.handle().clone(),
            Arc::clone(&stats),
        );
        // Every read is answered while no write can finish: a write never
        // delays the reply.
        for i in 0..blocks {
            let got = rt
                .block_on(Arc::clone(&reader).read(Arc::clone(&file), i * BS, BS as u32))
                .unwrap();
            assert_eq!(got.len() as u64, BS);
            assert!(got.iter().all(|b| *b == i as u8), "block {i}");
        }
        assert_eq!(source.reads.load(SeqCst), blocks);
        // Block 0 holds the queue, 1-3 wait for it, 4-7 found no room.
        assert_eq!(stats.cache_writes_skipped.load(Relaxed), blocks - 4);
        assert!(cache.inner.stored(&file).is_empty());
        cache.open_gate();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while cache.inner.stored(&file).len() < 4 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(cache.inner.stored(&file), vec![0, 1, 2, 3]);
        // The turned-away blocks are there for background prefetch, the
        // latest first.
        let left: Vec<u64> = std::iter::from_fn(|| reader.writeback().take_unwritten())
            .map(|(_, i)| i)
            .collect();
        assert_eq!(left, vec![7, 6, 5, 4]);
        // Nothing was read from the source twice.
        assert_eq!(source.reads.load(SeqCst), blocks);
    }

    /// Waits (up to a minute) for `cond`.
    fn wait_for(cond: impl Fn() -> bool) -> bool {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !cond() {
            if std::time::Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    #[test]
    fn disk_reads_of_async_reads_leave_the_runtime_free() {
        // One runtime thread: a disk read done on it would stop every other
        // task (peer requests, timers, the reads of other files).
        let rt = runtime(1);
        for peer in [false, true] {
            // Every block is cached; a `get` (a disk read and a checksum)
            // waits at the gate.
            let (source, file) = one_file(2 * BS);
            let cache = Arc::new(GatedCache::on_gets(MemCache::new(BS)));
            cache.inner.fill(&file, &file_data(2 * BS));
            let reader = roomy_reader(cache.clone(), source, Duration::from_secs(120), &rt);
            let (r, f) = (Arc::clone(&reader), Arc::clone(&file));
            let read = rt.spawn(async move {
                if peer {
                    r.fetch_for_peer(f, 1).await.map(|b| b.data().clone())
                } else {
                    r.read(f, BS, BS as u32).await
                }
            });
            assert!(wait_for(|| cache.waiting() > 0));
            // While the disk read waits, another task runs.
            let ran = Arc::new(AtomicU64::new(0));
            let r2 = Arc::clone(&ran);
            rt.spawn(async move { r2.store(1, Relaxed) });
            let free = wait_for(|| ran.load(Relaxed) == 1);
            cache.open_gate();
            let got = rt.block_on(read).unwrap().unwrap();
            assert!(got.iter().all(|b| *b == 1) && got.len() as u64 == BS);
            assert!(
                free,
                "a disk read held the runtime thread (fetch_for_peer: {peer})"
            );
        }
    }

    #[test]
    fn a_warm_up_racing_another_write_of_its_block_reports_that_write() {
        // `locafs warm` over a tree read-ahead is also fetching: the block's
        // other write finishes after `put` gave up on it. The warm-up waits
        // for it (and says the block is cached) instead of reporting a cache
        // full of data still in use; a cache that is full says so.
        let rt = runtime(2);
        for full in [false, true] {
            let (source, file) = one_file(BS);
            // Another writer holds block 0 (a write on a saturated disk):
            // `put` of it gives up, as `DiskCache::store` does after 5 s.
            // With `full`, nothing is stored.
            let cache = Arc::new(MemCache::new(BS));
            if full {
                cache.full.store(true, SeqCst);
            } else {
                cache.begin_other_write(&file, 0);
            }
            let reader = roomy_reader(cache.clone(), source, Duration::from_secs(60), &rt);
            let (other, f) = (Arc::clone(&cache), Arc::clone(&file));
            let finisher = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                let block = ChecksummedBytes::from_source(Bytes::from(file_data(BS)));
                other.end_other_write(&f, 0, Some(&block));
            });
            let got = rt
                .block_on(Arc::clone(&reader).warm_block(Arc::clone(&file), 0))
                .unwrap();
            // Not before the other write ended (it alone stores the block).
            assert_eq!(got, !full, "full: {full}");
            assert_eq!(cache.is_block_cached(&file, 0), !full);
            finisher.join().unwrap();
        }
    }
}
