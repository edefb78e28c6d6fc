//! The read-ahead engine: gets data onto local disk before the loader asks.
//!
//! - Within a file: each open handle has a [`SeqState`] that detects
//!   sequential reading (tolerating the kernel's own read-ahead pattern) and
//!   asks for the following blocks with a window that starts at two blocks,
//!   doubles while reads stay sequential, and collapses on a seek. A small
//!   file is fetched whole when it is opened.
//! - Across files: while the cache has room, the files the current epoch has
//!   not read yet are fetched in the background ([`EpochTracker`]), with
//!   bounded parallelism and bandwidth; when the loader handed over a plan
//!   (its order for the epoch), in exactly that order, a bounded distance
//!   ahead of where the loader is, until the loader diverges from it.
//!
//! Every prefetch goes through the reader's single-flight path (a block is
//! never fetched twice at once) and holds a share of one global memory
//! budget until it is done; when the budget is used up, read-ahead waits or
//! skips, it never grows. Read-ahead starts no fetch while a block the loader
//! read waits for room in the write-back queue (`WriteBack::room_ahead`),
//! and writes first the blocks the queue skipped (`WriteBack::take_unwritten`).

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::Semaphore;
use tracing::{debug, info};

use crate::cache::writeback::WriteBack;
use crate::cache::FileVersion;
use crate::meta::epoch::EpochTracker;
use crate::meta::namespace::{Namespace, Step};
use crate::obs::stats::ReadAheadSnapshot;
use crate::read::concurrency::{
    Jobs, Limiter, Tuner, Window, AUTO_CEILING, AUTO_FLOOR, AUTO_START,
};
use crate::read::reader::Reader;
use crate::source::EntryKind;

/// Settings of the read-ahead engine.
#[derive(Clone, Debug)]
pub struct ReadAheadConfig {
    /// Read-ahead within files (sequential windows, small files whole).
    pub sequential: bool,
    /// Background prefetch of the epoch's unread files.
    pub epoch: bool,
    /// The largest sequential window, in bytes.
    pub max_window: u64,
    /// One budget for all prefetch buffers, in bytes.
    pub memory: u64,
    /// Background (cross-file) fetches in flight: tuned, or fixed.
    pub jobs: Jobs,
    /// Bandwidth cap for background fetches, bytes/s (None: no cap).
    pub bandwidth: Option<u64>,
    /// Files up to this size are fetched whole at open.
    pub small_file: u64,
    /// How far ahead of the loader a plan is followed, in files.
    pub plan_ahead: usize,
}

/// Sequential-read detection of one open handle.
#[derive(Debug, Default, Clone)]
pub struct SeqState {
    /// Where the next sequential read would start.
    next: u64,
    /// Sequential reads in a row.
    run: u32,
    /// Current window in blocks (0: not reading ahead).
    window: u64,
    /// Blocks before this one have been asked for.
    asked_until: u64,
}

/// The kernel issues its own read-ahead in parallel, so "sequential" allows
/// reads that land a little before or after the expected offset.
const SEQ_SLACK: u64 = 512 * 1024;

impl SeqState {
    /// Feeds one read; returns the blocks to prefetch now.
    pub fn on_read(
        &mut self,
        offset: u64,
        len: u64,
        block_size: u64,
        nblocks: u64,
        max_window: u64,
    ) -> Range<u64> {
        let sequential = offset + SEQ_SLACK >= self.next && offset <= self.next + SEQ_SLACK;
        let end = offset + len;
        self.next = self.next.max(end);
        if !sequential {
            // A seek: stop reading ahead until reads are sequential again.
            self.run = 0;
            self.window = 0;
            self.next = end;
            self.asked_until = 0;
            return 0..0;
        }
        self.run = self.run.saturating_add(1);
        if self.run < 2 {
            return 0..0;
        }
        let max_blocks = (max_window / block_size).max(1);
        self.window = if self.window == 0 {
            2
        } else {
            (self.window * 2).min(max_blocks)
        };
        let current = end.saturating_sub(1) / block_size;
        let from = self.asked_until.max(current + 1);
        let to = (current + 1 + self.window).min(nblocks);
        if from >= to {
            return 0..0;
        }
        self.asked_until = to;
        from..to
    }

    /// Gives back blocks that could not be asked for (budget exhausted), so
    /// that a later read asks again.
    pub fn retract(&mut self, from: u64) {
        self.asked_until = self.asked_until.min(from);
    }

    pub fn window(&self) -> u64 {
        self.window
    }
}

/// A loader's announced order for the epoch.
#[derive(Debug, Default)]
struct Plan {
    order: Vec<u64>,
    index: HashMap<u64, usize>,
    /// Highest plan position the loader has reached.
    position: usize,
    /// Next plan position to prefetch.
    cursor: usize,
    /// Loader opens in a row that were not where the plan said.
    misses: u32,
}

const PLAN_DIVERGED_AFTER: u32 = 64;

/// Background opens at most in flight ahead of their fetches (each may hold
/// one of the source guard's metadata threads).
const OPENS_AHEAD: usize = 16;

/// Directories read-ahead's walk of the tree lists at once (each one
/// request in flight at the source, from the guard's metadata threads).
const WALK_JOBS: usize = 16;

/// The background prefetch starts nothing new until this long after the
/// last directory listing the kernel asked for. A listing is a scan (`find`,
/// an image folder's class walk before the first epoch), whose requests
/// wait one after the other on the source; the background's fetches of
/// whole files queue at the same disk. Measured (200 k files of 1-4 KiB in
/// 200 directories, one file read just before so the background had
/// started, page cache dropped): a cold `find` through the mount took 7.8 s
/// with the background fetching against 1.3-1.9 s for `find` on the source;
/// see docs/cache.md. A loader lists once, before it reads, so an epoch's
/// prefetch is not held.
const LISTING_QUIET: Duration = Duration::from_millis(300);

/// How long the background must still hold off, `since` after the last
/// listing (None: it may start).
fn listing_hold(since: Option<Duration>) -> Option<Duration> {
    let since = since?;
    LISTING_QUIET.checked_sub(since).filter(|d| !d.is_zero())
}

/// Counters of the engine, for `stats`.
#[derive(Debug, Default)]
pub struct ReadAheadStats {
    pub sequential_blocks: AtomicU64,
    pub background_files: AtomicU64,
    pub background_bytes: AtomicU64,
    pub plan_files: AtomicU64,
    pub budget_waits: AtomicU64,
}

struct EngineState {
    epoch: EpochTracker,
    plan: Option<Plan>,
    /// Regular files of the data set: one bit per inode number.
    files: crate::meta::epoch::BitSet,
    walked: bool,
    /// Background prefetch position (an inode number) in `files` for this
    /// epoch.
    cursor: u64,
}

/// The read-ahead engine of one mount.
pub struct ReadAhead {
    cfg: ReadAheadConfig,
    reader: Arc<Reader>,
    /// The reader's write-back queue: its backlog of skipped blocks.
    writeback: Arc<WriteBack>,
    ns: Arc<Namespace>,
    /// Permits are KiB of prefetch buffers.
    budget: Arc<Semaphore>,
    /// Slots of background fetches in flight; resized by the tuner when
    /// `--prefetch-jobs` is `auto`.
    jobs: Limiter,
    state: Mutex<EngineState>,
    pub stats: ReadAheadStats,
    wake: tokio::sync::Notify,
    rt: tokio::runtime::Handle,
    /// When the kernel last asked for a directory listing: milliseconds
    /// after `started`, plus one (0: never). See [`LISTING_QUIET`].
    listed_at: AtomicU64,
    started: Instant,
}

fn kib(bytes: u64) -> u32 {
    bytes.div_ceil(1024).min(u32::MAX as u64) as u32
}

impl ReadAhead {
    pub fn new(
        cfg: ReadAheadConfig,
        reader: Arc<Reader>,
        ns: Arc<Namespace>,
        rt: tokio::runtime::Handle,
    ) -> Arc<Self> {
        let permits = kib(cfg.memory).max(1) as usize;
        let jobs = Limiter::new(match cfg.jobs {
            Jobs::Auto => AUTO_START,
            Jobs::Fixed(n) => n,
        });
        let ra = Arc::new(ReadAhead {
            budget: Arc::new(Semaphore::new(permits)),
            jobs,
            cfg,
            writeback: Arc::clone(reader.writeback()),
            reader,
            ns,
            state: Mutex::new(EngineState {
                epoch: EpochTracker::new(),
                plan: None,
                files: Default::default(),
                walked: false,
                cursor: 0,
            }),
            stats: ReadAheadStats::default(),
            wake: tokio::sync::Notify::new(),
            rt,
            listed_at: AtomicU64::new(0),
            started: Instant::now(),
        });
        if ra.cfg.epoch {
            let me = Arc::clone(&ra);
            ra.rt.spawn(async move { me.background().await });
            if ra.cfg.jobs == Jobs::Auto {
                let me = Arc::clone(&ra);
                ra.rt.spawn(async move { me.tune().await });
            }
        }
        ra
    }

    /// `--prefetch-jobs auto`: measures the source over short windows (its
    /// counters: bytes, reads, their latency, errors and timeouts, the
    /// loader's reads included) and its own fetches in flight (the slots
    /// held, on average), and resizes the fetch slots by the [`Tuner`]'s
    /// verdict. A window lasts [`Tuner::window`], and until it saw enough
    /// reads to judge by (half the limit), at most 1 s.
    async fn tune(self: Arc<Self>) {
        let stats = Arc::clone(self.reader.stats());
        let mut tuner = Tuner::new(AUTO_START, AUTO_FLOOR, AUTO_CEILING, self.cfg.memory);
        let counters = || {
            (
                stats.source_bytes.load(Relaxed),
                stats.source_reads.load(Relaxed),
                stats.source_read_nanos.load(Relaxed),
                stats.source_errors.load(Relaxed) + stats.source_timeouts.load(Relaxed),
                stats.source_throttled.get(),
            )
        };
        let mut start = (Instant::now(), counters());
        self.jobs.take_saturated();
        self.jobs.take_mean_held();
        loop {
            tokio::time::sleep(tuner.window()).await;
            let now = (Instant::now(), counters());
            let (t0, (b0, r0, n0, e0, th0)) = start;
            let (t1, (b1, r1, n1, e1, th1)) = now;
            let secs = t1.duration_since(t0).as_secs_f64();
            let reads = r1.saturating_sub(r0);
            let errors = e1.saturating_sub(e0);
            let throttled = th1.saturating_sub(th0);
            if errors == 0
                && throttled == 0
                && (reads as usize) < (self.jobs.limit() / 2).max(1)
                && secs < 1.0
            {
                continue;
            }
            let w = Window {
                secs,
                bytes: b1.saturating_sub(b0),
                reads,
                latency_total: Duration::from_nanos(n1.saturating_sub(n0)),
                errors,
                throttled,
                saturated: self.jobs.take_saturated(),
                inflight: self.jobs.take_mean_held(),
            };
            let before = self.jobs.limit();
            let limit = tuner.observe(&w);
            if limit != before {
                debug!(limit, before, ?w, "read-ahead concurrency");
                self.jobs.resize(limit);
            }
            start = now;
        }
    }

    pub fn snapshot(&self) -> ReadAheadSnapshot {
        let st = self.state.lock();
        let limit = kib(self.cfg.memory) as u64 * 1024;
        ReadAheadSnapshot {
            epoch: st.epoch.epoch(),
            epoch_files_read: st.epoch.files_read(),
            epoch_files_total: st.files.len(),
            plan_active: st.plan.is_some(),
            plan_position: st.plan.as_ref().map_or(0, |p| p.position as u64),
            plan_length: st.plan.as_ref().map_or(0, |p| p.order.len() as u64),
            prefetch_sequential_blocks: self.stats.sequential_blocks.load(Relaxed),
            prefetch_background_files: self.stats.background_files.load(Relaxed),
            prefetch_background_bytes: self.stats.background_bytes.load(Relaxed),
            prefetch_memory_used: limit
                .saturating_sub(self.budget.available_permits() as u64 * 1024),
            prefetch_memory_limit: limit,
            prefetch_concurrency: self.jobs.limit() as u64,
            prefetch_concurrency_auto: self.cfg.epoch && self.cfg.jobs == Jobs::Auto,
        }
    }

    /// The kernel asked for a directory listing (READDIR, READDIRPLUS):
    /// the background prefetch holds off for [`LISTING_QUIET`]. One store,
    /// no lock.
    pub fn on_listing(&self) {
        let ms = self.started.elapsed().as_millis() as u64 + 1;
        self.listed_at.store(ms, Relaxed);
    }

    /// How long the background must still hold off for a listing.
    fn listing_wait(&self) -> Option<Duration> {
        let at = self.listed_at.load(Relaxed);
        let since = (at != 0).then(|| {
            self.started
                .elapsed()
                .saturating_sub(Duration::from_millis(at - 1))
        });
        listing_hold(since)
    }

    /// A file was opened for reading by the loader.
    /// `complete`: the cache is known to hold the whole file (passthrough).
    pub fn on_open(self: &Arc<Self>, ino: u64, file: &Arc<FileVersion>, complete: bool) {
        // Wake the background task only when it may have new work (a
        // wake-up per open costs a context switch on the open path).
        let wake = {
            let mut st = self.state.lock();
            let mut wake = false;
            if st.epoch.on_read(ino) {
                info!(epoch = st.epoch.epoch(), "new epoch detected");
                st.cursor = 0;
                wake = true;
            }
            wake |= st.epoch.files_read() == 1;
            if let Some(plan) = &mut st.plan {
                match plan.index.get(&ino) {
                    Some(&i) if i + self.cfg.plan_ahead >= plan.position => {
                        wake |= i > plan.position;
                        plan.position = plan.position.max(i);
                        plan.misses = 0;
                    }
                    _ => {
                        plan.misses += 1;
                        if plan.misses >= PLAN_DIVERGED_AFTER {
                            info!("the loader left its plan; back to default read-ahead");
                            st.plan = None;
                        }
                    }
                }
            }
            wake
        };
        if wake {
            self.wake.notify_one();
        }
        // A small file of several blocks is fetched whole at open (its blocks
        // in parallel), unless the cache has it, and only where the blocks
        // can wait for the loader: in the cache, or in memory. (A one-block
        // file gains nothing: the loader's first read fetches the block.)
        let bs = self.reader.block_size();
        if self.cfg.sequential
            && !complete
            && file.version.size <= self.cfg.small_file
            && file.version.size > bs
            && !self.reader.cache().is_complete(file)
            && (self.reader.cache().has_room_for(file)
                || self.reader.memory_capacity() >= file.version.size)
        {
            let n = file.block_count(self.reader.block_size());
            for i in 0..n {
                if !self.spawn_prefetch(file, i) {
                    break;
                }
            }
        }
    }

    /// A read of `len` bytes at `offset` on a handle with state `seq`.
    pub fn on_read(
        self: &Arc<Self>,
        seq: &Mutex<SeqState>,
        file: &Arc<FileVersion>,
        offset: u64,
        len: u64,
    ) {
        if !self.cfg.sequential {
            return;
        }
        let bs = self.reader.block_size();
        let nblocks = file.block_count(bs);
        let range = seq
            .lock()
            .on_read(offset, len, bs, nblocks, self.cfg.max_window);
        for i in range.clone() {
            if !self.spawn_prefetch(file, i) {
                seq.lock().retract(i);
                break;
            }
            self.stats.sequential_blocks.fetch_add(1, Relaxed);
        }
    }

    /// Starts a prefetch of one block if the budget allows; false if not.
    /// Its fetch (if the block is not cached) takes a slot of the same
    /// limiter as background prefetch (`--prefetch-jobs`, auto-tuned by
    /// default): windows of up to 64 MiB on many files at once (shards read
    /// side by side) would otherwise put a hundred block reads in the
    /// source's queue whatever its latency says, and a store or server that
    /// queues them makes the loader's opens and lookups wait behind them.
    fn spawn_prefetch(self: &Arc<Self>, file: &Arc<FileVersion>, index: u64) -> bool {
        let len = file.block_len(index, self.reader.block_size()) as u64;
        let Ok(permit) = Arc::clone(&self.budget).try_acquire_many_owned(kib(len)) else {
            self.stats.budget_waits.fetch_add(1, Relaxed);
            return false;
        };
        let me = Arc::clone(self);
        let file = Arc::clone(file);
        self.rt.spawn(async move {
            // Unbounded only where nothing sizes the limiter (`auto`
            // without the epoch's prefetch, whose tuner sizes it).
            let bounded = me.cfg.epoch || me.cfg.jobs != Jobs::Auto;
            let slot = async {
                if bounded {
                    me.jobs.acquire().await.map(Some)
                } else {
                    Some(None)
                }
            };
            let reader = Arc::clone(&me.reader);
            if let Err(e) = reader.prefetch(file, index, slot).await {
                debug!("prefetch failed: {e}");
            }
            drop(permit);
        });
        true
    }

    /// Installs a plan: paths relative to the mount root, in the order the
    /// loader will read them. Returns (files known, paths not found). The
    /// paths are resolved on the blocking pool: each may cost the source a
    /// `stat` (a round trip on NFS), and a plan of 100k paths would hold a
    /// runtime thread for many seconds.
    pub async fn set_plan(&self, paths: &[PathBuf]) -> (usize, usize) {
        let ns = Arc::clone(&self.ns);
        let owned = paths.to_vec();
        let resolved = tokio::task::spawn_blocking(move || {
            let mut order = Vec::with_capacity(owned.len());
            let mut unknown = 0;
            for p in &owned {
                match ns.lookup_path(p) {
                    Ok((ino, attr)) if attr.kind == EntryKind::File => order.push(ino),
                    _ => unknown += 1,
                }
            }
            (order, unknown)
        })
        .await;
        let Ok((order, unknown)) = resolved else {
            return (0, paths.len());
        };
        let index = order.iter().enumerate().map(|(i, ino)| (*ino, i)).collect();
        let n = order.len();
        let mut st = self.state.lock();
        st.plan = (n > 0).then_some(Plan {
            order,
            index,
            ..Default::default()
        });
        drop(st);
        self.wake.notify_one();
        info!(files = n, unknown, "read-ahead plan installed");
        (n, unknown)
    }

    /// The namespace read-ahead walks.
    pub fn namespace(&self) -> &Arc<Namespace> {
        &self.ns
    }

    /// The reader read-ahead fetches through.
    pub fn reader(&self) -> &Arc<Reader> {
        &self.reader
    }

    /// Makes sure every block of a file is cached (for `locafs warm`).
    /// Returns (bytes now cached, bytes that did not fit).
    pub async fn warm(self: &Arc<Self>, rel: &Path) -> Result<(u64, u64), String> {
        // Source metadata calls: on the blocking pool.
        let ns = Arc::clone(&self.ns);
        let path = rel.to_path_buf();
        let (rel, attr) = tokio::task::spawn_blocking(move || {
            let (ino, attr) = ns
                .lookup_path(&path)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            if attr.kind != EntryKind::File {
                return Err(format!("{}: not a regular file", path.display()));
            }
            ns.open_file(ino)
                .map_err(|e| format!("{}: {e}", path.display()))
        })
        .await
        .map_err(|e| format!("{}: {e}", rel.display()))??;
        let file = Arc::new(FileVersion::new(rel, attr.version()));
        let bs = self.reader.block_size();
        let (mut cached, mut missing) = (0, 0);
        for i in 0..file.block_count(bs) {
            let len = file.block_len(i, bs) as u64;
            match Arc::clone(&self.reader)
                .warm_block(Arc::clone(&file), i)
                .await
            {
                Ok(true) => cached += len,
                Ok(false) => missing += len,
                Err(e) => return Err(format!("{}: {e}", file.rel.display())),
            }
        }
        Ok((cached, missing))
    }

    /// Lists the whole tree once (in the background) so that the epoch's
    /// unread files are known: `WALK_JOBS` directories at a time (a remote
    /// source answers each in a round trip; an object store's listing of
    /// one prefix is paged, one page after the other). A lookup of the
    /// loader in a directory being listed waits for that listing rather
    /// than asking the source on its own, where listings carry attributes.
    async fn walk(self: &Arc<Self>) {
        let mut todo = vec![crate::meta::namespace::ROOT];
        let mut files = crate::meta::epoch::BitSet::default();
        let mut listing = futures::stream::FuturesUnordered::new();
        loop {
            while listing.len() < WALK_JOBS {
                let Some(dir) = todo.pop() else { break };
                let ns = Arc::clone(&self.ns);
                listing.push(async move {
                    if ns.refresh_dir_async(dir).await.is_err() {
                        return Vec::new();
                    }
                    // (a directory of a million entries is read off the
                    // runtime's threads)
                    tokio::task::spawn_blocking(move || {
                        let mut out = Vec::new();
                        let _ = ns.read_dir(dir, 0, |e, _| {
                            out.push((e.ino, e.attr.kind));
                            false
                        });
                        out
                    })
                    .await
                    .unwrap_or_default()
                });
            }
            let Some(listed) = futures::StreamExt::next(&mut listing).await else {
                break;
            };
            for (ino, kind) in listed {
                match kind {
                    EntryKind::Dir => todo.push(ino),
                    EntryKind::File => {
                        files.insert(ino);
                    }
                    _ => {}
                }
            }
        }
        let mut st = self.state.lock();
        info!(files = files.len(), "data set listed for read-ahead");
        st.files = files;
        st.walked = true;
    }

    /// The next file to fetch in the background, if any.
    fn next_background(&self) -> Option<(u64, bool)> {
        let mut st = self.state.lock();
        let st = &mut *st;
        if let Some(plan) = &mut st.plan {
            if plan.cursor < plan.position {
                plan.cursor = plan.position;
            }
            if plan.cursor <= plan.position + self.cfg.plan_ahead && plan.cursor < plan.order.len()
            {
                let ino = plan.order[plan.cursor];
                plan.cursor += 1;
                return Some((ino, true));
            }
            return None;
        }
        // Nothing ahead of a loader that has not started (a mount that is
        // only listed, or not used at all, costs the source nothing).
        if st.epoch.files_read() == 0 {
            return None;
        }
        while let Some(ino) = st.files.next_from(st.cursor) {
            st.cursor = ino + 1;
            if !st.epoch.was_read(ino) {
                return Some((ino, false));
            }
        }
        None
    }

    /// Starts the background fetch of one block once the bandwidth cap, a
    /// job slot and its memory allow it. False if the engine is shutting
    /// down (a semaphore closed).
    async fn fetch_block(
        self: &Arc<Self>,
        file: Arc<FileVersion>,
        i: u64,
        bucket: &mut TokenBucket,
    ) -> bool {
        let len = file.block_len(i, self.reader.block_size()) as u64;
        bucket.take(len).await;
        let Some(job) = self.jobs.acquire().await else {
            return false;
        };
        let Ok(mem) = Arc::clone(&self.budget).acquire_many_owned(kib(len)).await else {
            return false;
        };
        let reader = Arc::clone(&self.reader);
        let me = Arc::clone(self);
        self.rt.spawn(async move {
            // The job slot is held already (taken before the memory).
            let held = std::future::ready(Some(()));
            if reader.prefetch(file, i, held).await.is_ok() {
                me.stats.background_bytes.fetch_add(len, Relaxed);
            }
            drop((job, mem));
        });
        true
    }

    /// Whether `ino` is known, without asking the source, to be held whole
    /// by the cache (or empty): its attributes fresh, its version complete.
    fn cached_whole(&self, ino: u64) -> bool {
        let Step::Done(Ok(a)) = self.ns.getattr_local(ino) else {
            return false;
        };
        let Ok((rel, attr)) = self.ns.file_with(ino, a) else {
            return false;
        };
        attr.size == 0
            || self
                .reader
                .cache()
                .is_complete(&FileVersion::new(rel, attr.version()))
    }

    /// Background prefetch of the epoch's unread files (or the plan).
    async fn background(self: Arc<Self>) {
        self.walk().await;
        let mut bucket = TokenBucket::new(self.cfg.bandwidth);
        let mut opening = std::collections::VecDeque::new();
        loop {
            // Nothing to fetch from a stalled source: wait for its return
            // rather than skip the epoch's files on refused fetches.
            while self.reader.source_stalled() {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            // A scan of the tree goes first (fetches in flight finish).
            while let Some(wait) = self.listing_wait() {
                tokio::time::sleep(wait).await;
            }
            // First the blocks the loader read that did not reach the disk
            // cache (its write queue was full), so that their files are
            // complete (passthrough) before the next epoch; then the epoch's
            // unread files.
            if let Some((file, i)) = self.writeback.take_unwritten() {
                if !self.fetch_block(file, i, &mut bucket).await {
                    return;
                }
                continue;
            }
            // Then the blocks the disk cache refused (its share of a shared
            // budget was taken), once their backoff has passed: from memory
            // only, never from the source again.
            if let Some((file, i)) = self.writeback.take_refused() {
                Arc::clone(&self.reader).write_again(file, i).await;
                continue;
            }
            // The next files' opens (a fresh stat at the source when the
            // attributes are old; on the blocking pool) run ahead of their
            // fetches, as many at once as fetches may be in flight: one at a
            // time, the hops of each open capped the files fetched per
            // second whatever the concurrency (with a plan, those fetches are
            // all the loader has in flight).
            let ahead = self.jobs.limit().min(OPENS_AHEAD);
            let (mut skipped, mut held) = (0, false);
            while opening.len() < ahead {
                let Some((ino, planned)) = self.next_background() else {
                    break;
                };
                // A file whose attributes are fresh and that the cache holds
                // whole needs nothing: found out here, not by an open on the
                // blocking pool (in a warm epoch that is every file, and a
                // hop to the pool per file cost a quarter of the loader's
                // rate in warm reads of small files).
                if self.cached_whole(ino) {
                    skipped += 1;
                    if skipped % 1024 == 0 {
                        tokio::task::yield_now().await;
                        // A scan of the tree goes first here too: after a
                        // remount over a full cache this pass checks every
                        // file of the data set, a core's worth of work
                        // beside the scan.
                        if self.listing_wait().is_some() {
                            held = true;
                            break;
                        }
                    }
                    continue;
                }
                let ns = Arc::clone(&self.ns);
                opening.push_back((
                    planned,
                    tokio::task::spawn_blocking(move || ns.open_file(ino)),
                ));
            }
            let Some((planned, open)) = opening.pop_front() else {
                if held {
                    continue;
                }
                let _ =
                    tokio::time::timeout(Duration::from_millis(500), self.wake.notified()).await;
                continue;
            };
            let Ok(Ok((rel, attr))) = open.await else {
                continue;
            };
            let file = Arc::new(FileVersion::new(rel, attr.version()));
            let cache = self.reader.cache();
            if file.version.size == 0 || cache.is_complete(&file) {
                continue;
            }
            // Only while the cache has room: never churn the cache for
            // read-ahead (a plan is followed regardless: its blocks are read
            // next and can live in memory meanwhile).
            if !planned && !cache.has_room_for(&file) {
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            let bs = self.reader.block_size();
            for i in 0..file.block_count(bs) {
                // With peers, each node fills the cluster's cache with the
                // blocks it owns; others' blocks come from their owners when
                // the loader (or a plan) asks for them.
                if !planned && !self.reader.owns(&file, i) {
                    continue;
                }
                if !self.fetch_block(Arc::clone(&file), i, &mut bucket).await {
                    return;
                }
            }
            self.stats.background_files.fetch_add(1, Relaxed);
            if planned {
                self.stats.plan_files.fetch_add(1, Relaxed);
            }
        }
    }
}

/// A simple async token bucket (one second of burst).
struct TokenBucket {
    rate: Option<u64>,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    fn new(rate: Option<u64>) -> Self {
        TokenBucket {
            rate,
            tokens: rate.unwrap_or(0) as f64,
            last: Instant::now(),
        }
    }

    async fn take(&mut self, n: u64) {
        let Some(rate) = self.rate else { return };
        let rate = rate.max(1) as f64;
        loop {
            let now = Instant::now();
            self.tokens = (self.tokens + now.duration_since(self.last).as_secs_f64() * rate)
                .min(rate.max(n as f64));
            self.last = now;
            if self.tokens >= n as f64 {
                self.tokens -= n as f64;
                return;
            }
            let wait = (n as f64 - self.tokens) / rate;
            tokio::time::sleep(Duration::from_secs_f64(wait.min(1.0))).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BS: u64 = 1 << 20;

    #[test]
    fn a_listing_holds_the_background_for_its_quiet_time_only() {
        let ms = Duration::from_millis;
        assert_eq!(listing_hold(None), None, "no listing yet: go");
        assert_eq!(listing_hold(Some(ms(0))), Some(LISTING_QUIET));
        assert_eq!(listing_hold(Some(ms(100))), Some(LISTING_QUIET - ms(100)));
        assert_eq!(listing_hold(Some(LISTING_QUIET)), None);
        assert_eq!(listing_hold(Some(ms(60_000))), None);
    }

    #[test]
    fn sequential_reads_grow_the_window_and_seeks_stop_it() {
        let mut s = SeqState::default();
        let n = 1000;
        let max = 64 * BS;
        assert_eq!(
            s.on_read(0, 128 << 10, BS, n, max),
            0..0,
            "one read is not a pattern"
        );
        let r = s.on_read(128 << 10, 128 << 10, BS, n, max);
        assert_eq!(r, 1..3);
        let mut off = 256 << 10;
        let mut last_window = s.window();
        for _ in 0..40 {
            s.on_read(off, 128 << 10, BS, n, max);
            off += 128 << 10;
            assert!(s.window() >= last_window);
            assert!(s.window() <= 64, "window bounded");
            last_window = s.window();
        }
        assert_eq!(s.window(), 64);
        // A jump far away is a seek: read-ahead stops.
        assert_eq!(s.on_read(700 * BS, 4096, BS, n, max), 0..0);
        assert_eq!(s.window(), 0);
        // Random reads keep it stopped.
        for off in [3 * BS, 500 * BS, 90 * BS] {
            assert_eq!(s.on_read(off, 4096, BS, n, max), 0..0);
        }
    }

    #[test]
    fn asks_each_block_once_and_stops_at_eof() {
        let mut s = SeqState::default();
        let n = 10;
        let mut asked = Vec::new();
        let mut off = 0;
        while off < n * BS {
            asked.extend(s.on_read(off, 256 << 10, BS, n, 8 * BS));
            off += 256 << 10;
        }
        let mut sorted = asked.clone();
        sorted.dedup();
        assert_eq!(asked, sorted, "no block asked twice");
        assert!(asked.iter().all(|b| *b < n));
        assert_eq!(*asked.last().unwrap(), n - 1);
    }

    #[test]
    fn kernel_readahead_reordering_counts_as_sequential() {
        let mut s = SeqState::default();
        // Two overlapping streams like the kernel's async read-ahead.
        let reads = [0u64, 131072, 393216, 262144, 524288, 786432, 655360];
        let mut total = 0;
        for r in reads {
            total += s.on_read(r, 131072, BS, 100, 32 * BS).count();
        }
        assert!(total > 0);
        assert!(s.window() > 0);
    }

    #[test]
    fn retract_lets_blocks_be_asked_again() {
        let mut s = SeqState::default();
        s.on_read(0, BS, BS, 100, 8 * BS);
        let r = s.on_read(BS, BS, BS, 100, 8 * BS);
        assert!(!r.is_empty());
        s.retract(r.start);
        let r2 = s.on_read(2 * BS, BS, BS, 100, 8 * BS);
        assert!(r2.start <= r.start + 1);
    }

    /// Source metadata calls (a `stat` is a round trip on NFS, and may
    /// stall) must not run on the runtime's threads: a runtime of one
    /// thread, and a source whose `stat` of one path waits at a gate the
    /// `nth` time (1-based), until the test has seen whether another task
    /// still runs.
    mod off_the_runtime {
        use super::*;
        use crate::cache::disk::DiskCache;
        use crate::read::reader::ReaderConfig;
        use crate::testing::{Call, Gate, Hook, Hooked};
        use std::sync::atomic::AtomicUsize;

        /// Holds the `nth` stat of `path` (1-based) at a closed gate.
        struct NthStat {
            path: PathBuf,
            nth: usize,
            seen: AtomicUsize,
            gate: Gate,
        }

        impl Hook for NthStat {
            fn around<T>(&self, call: Call<'_>, real: impl FnOnce() -> T) -> T {
                if let Call::Stat(rel) = call {
                    if rel == self.path && self.seen.fetch_add(1, Relaxed) + 1 == self.nth {
                        self.gate.pass();
                    }
                }
                real()
            }
        }

        fn wait_for(cond: impl Fn() -> bool) -> bool {
            let deadline = Instant::now() + Duration::from_secs(60);
            while !cond() {
                if Instant::now() > deadline {
                    return false;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            true
        }

        /// Starts `act` on a one-thread runtime over a data set of files
        /// "a", "b", "p" and "w"; once the gated `stat` waits, checks that
        /// another task runs; then opens the gate and waits for `act`.
        fn runtime_stays_free<F, Fut>(gate: (&str, usize), epoch: bool, act: F) -> bool
        where
            F: FnOnce(Arc<ReadAhead>) -> Fut,
            Fut: std::future::Future<Output = ()> + Send + 'static,
        {
            let tmp = tempfile::tempdir().unwrap();
            let src = tmp.path().join("src");
            std::fs::create_dir_all(&src).unwrap();
            for f in ["a", "b", "p", "w"] {
                std::fs::write(src.join(f), vec![7u8; 10_000]).unwrap();
            }
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            let hook = NthStat {
                path: PathBuf::from(gate.0),
                nth: gate.1,
                seen: AtomicUsize::new(0),
                gate: Gate::new(true),
            };
            let source = Arc::new(Hooked::wrap(&src, hook));
            let stats = Arc::new(crate::obs::stats::Stats::default());
            let (cache, _) = DiskCache::open(
                &tmp.path().join("cache"),
                Some(64 << 20),
                BS,
                Arc::clone(&stats),
            )
            .unwrap();
            // Attributes always stale: every lookup and open asks the source.
            let ns = Arc::new(
                Namespace::new(source.clone(), Some(Duration::ZERO), Arc::default()).unwrap(),
            );
            let reader = Reader::new(
                ReaderConfig {
                    block_size: BS,
                    memory_bytes: 8 * BS,
                    write_queue_bytes: 8 * BS,
                    write_wait_bytes: 2 * BS,
                    source_timeout: Duration::from_secs(120),
                },
                Arc::new(cache),
                source.clone(),
                None,
                rt.handle().clone(),
                stats,
            );
            let ra = ReadAhead::new(
                ReadAheadConfig {
                    sequential: false,
                    epoch,
                    max_window: 8 * BS,
                    memory: 8 * BS,
                    jobs: Jobs::Fixed(2),
                    bandwidth: None,
                    small_file: 4 * BS,
                    plan_ahead: 8,
                },
                reader,
                ns,
                rt.handle().clone(),
            );
            let task = rt.spawn(act(ra));
            assert!(
                wait_for(|| source.gate.waiting() == 1),
                "the gated stat never came"
            );
            let ran = Arc::new(AtomicU64::new(0));
            let r2 = Arc::clone(&ran);
            rt.spawn(async move { r2.store(1, Relaxed) });
            let free = wait_for(|| ran.load(Relaxed) == 1);
            source.gate.open();
            rt.block_on(task).unwrap();
            rt.shutdown_background();
            free
        }

        #[test]
        fn set_plan_resolves_paths_off_the_runtime() {
            let free = runtime_stays_free(("b", 1), false, |ra| async move {
                let plan = [PathBuf::from("a"), PathBuf::from("b")];
                assert_eq!(ra.set_plan(&plan).await, (2, 0));
            });
            assert!(free, "set_plan held the runtime thread on a source stat");
        }

        #[test]
        fn warm_resolves_its_path_off_the_runtime() {
            let free = runtime_stays_free(("w", 1), false, |ra| async move {
                assert_eq!(ra.warm(Path::new("w")).await, Ok((10_000, 0)));
            });
            assert!(free, "warm held the runtime thread on a source stat");
        }

        #[test]
        fn background_prefetch_opens_files_off_the_runtime() {
            // The plan's lookup is the first stat of "p" (not gated); the
            // background task's open of it the second.
            let free = runtime_stays_free(("p", 2), true, |ra| async move {
                assert_eq!(ra.set_plan(&[PathBuf::from("p")]).await, (1, 0));
            });
            assert!(
                free,
                "background prefetch held the runtime thread on a source stat"
            );
        }
    }
}
