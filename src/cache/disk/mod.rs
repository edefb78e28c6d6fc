//! The persistent block cache on local disk.
//!
//! Layout, under one directory per data set (`<cache-dir>/<dataset-id>/`):
//! `blocks/<2 hex>/<version key>.data` is a sparse file the size of the
//! source file holding the cached blocks at their own offsets (so a complete
//! file can be handed to the kernel for passthrough as it is), and
//! `<version key>.meta` holds a header (magic, format, block size, the source
//! version and path) and one fixed-size slot per block (xxh3-128 checksum,
//! length, presence marker); integers are little-endian, written with
//! `bytes::BufMut` and read with `Buf`, as in the other binary formats. A one-block file has no `.meta`: its meta (40
//! bytes, kept by ext4 in the inode) is the `user.locafs.meta` xattr of its
//! `.data` file, so that caching a small file creates one file, not two. A
//! block is written data first, slot second, so
//! a crash at any point leaves either an absent block or a slot whose
//! checksum will not match: both are misses, never wrong bytes. At start-up
//! the index (`recover`: a snapshot and a journal, appended after a block's
//! data and meta are written, before anything is deleted) is read instead
//! of every file's meta; a cache without one is scanned once and converted.
//! Every block is verified when it is served (and a whole file before its
//! first passthrough open): against the checksum in the books for a file of
//! several blocks, against its meta on disk for a one-block file (the books
//! keep no checksum of one: 16 bytes a file, see docs/cache.md).
//!
//! A block owned by another node (fetched from a peer) carries a different
//! presence marker: it is a guest. The policy keeps the guests of each file
//! version as an entry of their own, admitted only into spare room and
//! evicted (by punching their blocks out) before any of this node's own
//! blocks.
//!
//! Disk use is bounded by the configured size counting data (in 4 KiB
//! allocation units), meta files and directory overhead. A cache disk that
//! fails a write (full, read-only, I/O error) turns writes off for a while
//! with a warning; reads go on from the source. Nothing here may panic or
//! fail a read.
//!
//! This file is the cache itself (the write path, the read path with its
//! verification, passthrough pins, evictions on disk); beside it:
//! `format.rs` (the meta's bytes), `books.rs` (the dense records and the
//! eviction plan), `direct_io.rs` (O_DIRECT writes and their bounce
//! buffers) and `startup.rs` (the books from the index or a scan,
//! checkpoints, the orphan sweep).
//!
//! Every file is reached through a checked directory handle
//! (`private_dir`: the data set's directory, `blocks/` and each of its 256
//! fan-out directories, opened once), never through a path a symlink could
//! redirect, and created owner-only (0600; directories 0700).

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
#[cfg(test)]
use std::path::PathBuf;

use rustix::fs::OFlags;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use tracing::{debug, info, warn};

use super::policy::{Admission, Evicted, Policy, Tier};
use super::recover::{self, Op, Put};
use super::{
    BlockStore, CacheUsage, Checksum, ChecksummedBytes, CompleteFiles, FileVersion, VersionKey,
};
use crate::obs::stats::Stats;
use crate::source::SourceVersion;
use crate::sys::private_dir::PrivateDir;

mod books;
mod direct_io;
mod format;
mod startup;

use books::{
    new_books, round_alloc, tier_of, Entry, Eviction, Slot, State, CREATED, MAX_BLOCKS,
    MAX_PASSTHROUGH_PINS, MAX_VERSIONS, META_IN_XATTR, META_ON_GUEST, PER_FILE_OVERHEAD,
};
use direct_io::{Bounce, DataFile, Via};
use format::{
    decode_inline, decode_slot, encode_inline, encode_slot, header_key, path_hash, HEADER_FIXED,
    INLINE_LEN, META_XATTR, PRESENT, PRESENT_GUEST, SLOT,
};
pub use startup::Recovery;

/// Directory blocks and the like, reserved once per cache directory.
pub const FIXED_OVERHEAD: u64 = 2 << 20;
/// How long writes stay off after the cache disk failed one.
const WRITE_BACKOFF: Duration = Duration::from_secs(30);

/// The block cache of one data set on local disk: the read path's
/// [`BlockStore`] and the open path's [`CompleteFiles`] (a mount wires both
/// from one `Arc<DiskCache>`).
pub struct DiskCache {
    core: Arc<Core>,
}

impl Drop for DiskCache {
    fn drop(&mut self) {
        // A background verification still running stops at its next block.
        self.core.closed.store(true, Ordering::Relaxed);
        if let Some(t) = self.core.sweeper.lock().take() {
            let _ = t.join();
        }
        // A clean shutdown: the journal is folded into a new snapshot, and
        // if every file on disk is the index's (no sweep left unfinished),
        // the next start-up is told so and sweeps nothing.
        if !self.core.crashed.load(Ordering::Relaxed)
            && self.core.checkpoint()
            && !self.core.orphans_possible.load(Ordering::Relaxed)
        {
            if let Err(e) = recover::mark_clean(&self.core.dir) {
                debug!("cache: marking a clean shutdown failed ({e})");
            }
        }
    }
}

impl DiskCache {
    /// Drops the cache as a `kill -9` would leave it: no checkpoint (tests).
    #[doc(hidden)]
    pub fn crash(self) {
        self.core.crashed.store(true, Ordering::Relaxed);
    }

    /// Books `bytes` of files the mount keeps beside the cache (the
    /// namespace manifest) against the size bound; false if they do not fit.
    /// The reservation is never evicted.
    pub fn reserve_aux(&self, bytes: u64) -> bool {
        self.core.reserve_aux(bytes)
    }

    /// The counter the namespace keeps the data set's known size in.
    pub fn dataset_bytes_handle(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.core.dataset_bytes)
    }

    /// Sets the bound on disk use (the grant of the shared budget,
    /// `cache::budget`); a lower one evicts down to it at once, in the
    /// policy's order (stale versions, guests, abandoned entries, then the
    /// oldest).
    pub fn set_capacity(&self, bytes: u64) {
        self.core.set_capacity(bytes)
    }

    /// Bytes of entries read within the last two passes (the policy's
    /// horizon), counted with the fixed overhead.
    pub fn hot_bytes(&self) -> u64 {
        self.core.hot_bytes()
    }

    /// Heap bytes of the books (the tables' capacities; a hash table at
    /// its bucket count, 4 bytes and a control byte each): the probe of
    /// `tests/disk_cache_scale.rs` prints it per entry.
    #[doc(hidden)]
    pub fn books_bytes(&self) -> usize {
        self.core.state.lock().books.heap_bytes()
    }

    /// Deletes the files no index entry owns now, on the caller's thread
    /// (tests; a start-up after a crash does it in the background).
    #[doc(hidden)]
    pub fn sweep_orphans(&self) -> u64 {
        self.core.sweep_orphans()
    }
}

/// The state of a [`DiskCache`], shared with its background threads (the
/// verifier and the orphan sweeper hold it weakly: they stop once the
/// cache is dropped).
struct Core {
    /// The data set's directory.
    dir: PrivateDir,
    /// Its `blocks/`, and the fan-out directories below it
    /// (`blocks/00`..`blocks/ff`), each opened at its first use.
    blocks: PrivateDir,
    fanout: Vec<std::sync::OnceLock<PrivateDir>>,
    block_size: u64,
    state: Mutex<State>,
    readers: moka::sync::Cache<VersionKey, Arc<File>>,
    writes_off_until: Mutex<Option<Instant>>,
    /// The data set's total size as far as the namespace knows it.
    dataset_bytes: Arc<AtomicU64>,
    /// Bytes booked by `reserve_aux`.
    aux_bytes: Mutex<u64>,
    /// Held while the files of a new version are created: one of
    /// `CREATE_LOCKS`, picked by the version key, so that creations of
    /// different files go on in parallel.
    create_locks: Vec<Mutex<()>>,
    /// Whether block data is written with O_DIRECT (until the cache's file
    /// system refuses it, e.g. tmpfs).
    direct: std::sync::atomic::AtomicBool,
    /// Whether one-block files keep their meta in an extended attribute
    /// (until the cache's file system refuses user xattrs).
    xattr: std::sync::atomic::AtomicBool,
    /// Bounce buffers for direct writes: at most `BOUNCE_MAX`, reused.
    bounce: Mutex<Bounce>,
    bounce_free: parking_lot::Condvar,
    stats: Arc<Stats>,
    /// Told when a version's cached file is deleted or loses blocks.
    dropped: std::sync::OnceLock<super::DroppedHook>,
    /// Complete files waiting for a background verification.
    verify: Mutex<VerifyQueue>,
    /// The cache is gone: a background verification stops.
    closed: std::sync::atomic::AtomicBool,
    /// The thread deleting orphan files after start-up (joined when the
    /// cache is dropped, so that it never sweeps a later cache's files).
    sweeper: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// A checkpoint of the index is being written.
    checkpointing: std::sync::atomic::AtomicBool,
    /// Dropped without a clean shutdown (tests: see [`DiskCache::crash`]).
    crashed: std::sync::atomic::AtomicBool,
    /// Files that no index entry owns may be on disk (a start-up after a
    /// crash, until its sweep has gone through every block directory).
    orphans_possible: std::sync::atomic::AtomicBool,
}

/// A block booked for writing (`Core::book_block`).
struct Booked {
    /// Evictions to carry out before the write.
    work: Vec<Eviction>,
    /// The entry was made for this block.
    new: bool,
    /// What was booked: the block, and a new entry's meta and overhead.
    bytes: u64,
    meta_in_xattr: bool,
    /// The entry's generation: it was dropped meanwhile if it differs.
    gen: u32,
}

/// Complete files to verify in the background (see
/// [`CompleteFiles::open_complete`]): at most [`VERIFY_QUEUE_MAX`], each once.
#[derive(Default)]
struct VerifyQueue {
    files: std::collections::VecDeque<FileVersion>,
    queued: std::collections::HashSet<VersionKey>,
    /// Whether the verifier thread is running (it exits when the queue is
    /// empty).
    running: bool,
}

/// Files waiting for a background verification, at most (a file beyond that
/// is queued by a later open).
const VERIFY_QUEUE_MAX: usize = 1024;

/// Whether an error opening or reading a cache file says nothing about the
/// file (the process or the machine is short of something, or a signal):
/// then it is a miss that leaves the entry as it is.
fn transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::EMFILE | libc::ENFILE | libc::ENOMEM | libc::EINTR | libc::EAGAIN | libc::ENOBUFS
        )
    )
}

/// What a present cached block is checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// Its checksum, kept in the books (a file of several blocks).
    Sum(Checksum),
    /// Its meta on disk: the books keep no checksum for a one-block file
    /// (see [`Core::stored_sum`]).
    Meta { in_xattr: bool, table: u16 },
}

/// What block `i` of an entry is checked against; None if it is not
/// present.
fn expect(e: &Entry, i: usize) -> Option<Expect> {
    if e.slot(i)? != Slot::Present {
        return None;
    }
    Some(match e.sum(i) {
        Some(sum) => Expect::Sum(sum),
        None => Expect::Meta {
            in_xattr: e.meta_in_xattr(),
            table: e.table,
        },
    })
}

/// What reading one cached block found.
enum Checked {
    Good(ChecksummedBytes),
    /// A transient error (see [`transient`]): nothing is known of the block.
    Transient,
    /// A read error or a checksum that does not match.
    Bad,
}

/// Locks serializing the creation of new versions' files (by key).
const CREATE_LOCKS: usize = 64;

impl DiskCache {
    /// [`DiskCache::open_in`] the directory `dir` (created owner-only if
    /// missing, and checked as every cache directory is: `private_dir`).
    pub fn open(
        dir: &Path,
        capacity: Option<u64>,
        block_size: u64,
        stats: Arc<Stats>,
    ) -> io::Result<(Self, Recovery)> {
        Self::open_in(&PrivateDir::create(dir)?, capacity, block_size, stats)
    }

    /// Opens (or creates) the cache in `dir` with a total size bound of
    /// `capacity` bytes (None: unbounded until [`Core::set_capacity`], as a
    /// mount does until the shared budget, `budget.rs`, gives it its grant),
    /// recovering what a previous run left there.
    pub fn open_in(
        dir: &PrivateDir,
        capacity: Option<u64>,
        block_size: u64,
        stats: Arc<Stats>,
    ) -> io::Result<(Self, Recovery)> {
        let capacity = capacity.unwrap_or(u64::MAX / 4);
        if capacity < FIXED_OVERHEAD * 2 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "cache size {} is too small (at least {})",
                    crate::sys::units::format_size(capacity),
                    crate::sys::units::format_size(FIXED_OVERHEAD * 2)
                ),
            ));
        }
        let blocks = dir.subdir("blocks", true)?;
        let cache = Core {
            dir: dir.clone(),
            blocks,
            fanout: (0..256).map(|_| std::sync::OnceLock::new()).collect(),
            block_size,
            state: Mutex::new(State {
                books: new_books(capacity - FIXED_OVERHEAD, block_size),
                files_complete: 0,
                gens: 0,
                index: None,
            }),
            readers: moka::sync::Cache::builder()
                .max_capacity(1024)
                .time_to_idle(Duration::from_secs(60))
                .build(),
            writes_off_until: Mutex::new(None),
            dataset_bytes: Arc::new(AtomicU64::new(0)),
            aux_bytes: Mutex::new(0),
            create_locks: (0..CREATE_LOCKS).map(|_| Mutex::new(())).collect(),
            direct: std::sync::atomic::AtomicBool::new(true),
            xattr: std::sync::atomic::AtomicBool::new(true),
            bounce: Mutex::new(Bounce::default()),
            bounce_free: parking_lot::Condvar::new(),
            stats,
            dropped: std::sync::OnceLock::new(),
            verify: Mutex::new(VerifyQueue::default()),
            closed: std::sync::atomic::AtomicBool::new(false),
            sweeper: Mutex::new(None),
            checkpointing: std::sync::atomic::AtomicBool::new(false),
            crashed: std::sync::atomic::AtomicBool::new(false),
            orphans_possible: std::sync::atomic::AtomicBool::new(false),
        };
        // Taken before anything is written: a crash from here on leaves no
        // mark.
        let clean = recover::take_clean(&cache.dir);
        let rec = cache.recover()?;
        let core = Arc::new(cache);
        if rec.from_index && !clean {
            // Files no entry owns (written just before a crash, or whose
            // records a torn journal lost) are deleted in the background.
            core.orphans_possible.store(true, Ordering::Relaxed);
            let me = Arc::downgrade(&core);
            let spawned = std::thread::Builder::new()
                .name("locafs-sweep".into())
                .spawn(move || {
                    if let Some(core) = me.upgrade() {
                        let n = core.sweep_orphans();
                        if n > 0 {
                            info!("cache: deleted {n} files that no index entry owns (left by a crash)");
                        }
                    }
                });
            *core.sweeper.lock() = spawned.ok();
        }
        Ok((DiskCache { core }, rec))
    }
}

impl Core {
    /// Books `bytes` of files the mount keeps beside the cache (the
    /// namespace manifest) against the size bound; false if they do not fit.
    /// The reservation is never evicted.
    pub fn reserve_aux(&self, bytes: u64) -> bool {
        let bytes = round_alloc(bytes);
        let work = {
            let mut st = self.state.lock();
            let st = &mut *st;
            let mut cur = self.aux_bytes.lock();
            if bytes <= *cur {
                st.books.release_fixed(*cur - bytes);
                *cur = bytes;
                return true;
            }
            let victims = match st.books.admit_fixed(bytes - *cur) {
                Admission::Reject => return false,
                Admission::Admit { evict } => evict,
            };
            *cur = bytes;
            self.plan_evictions(st, victims)
        };
        self.evict(work);
        true
    }

    /// Sets the bound on disk use (the grant of the shared budget,
    /// `budget.rs`); a lower one evicts down to it at once, in the policy's
    /// order (stale versions, guests, abandoned entries, then the oldest).
    pub fn set_capacity(&self, bytes: u64) {
        let cap = bytes.max(FIXED_OVERHEAD * 2);
        let work = {
            let mut st = self.state.lock();
            if st.books.capacity() == cap - FIXED_OVERHEAD {
                return;
            }
            st.books.set_capacity(cap - FIXED_OVERHEAD);
            let victims = st.books.shrink_to_capacity();
            self.plan_evictions(&mut st, victims)
        };
        self.evict(work);
    }

    /// Bytes of entries read within the last two passes (the policy's
    /// horizon), counted with the fixed overhead.
    pub fn hot_bytes(&self) -> u64 {
        self.state.lock().books.hot_bytes() + FIXED_OVERHEAD
    }

    /// The paths of a version's data and meta files (tests).
    #[cfg(test)]
    fn paths(&self, key: &VersionKey) -> (PathBuf, PathBuf) {
        let hex = key.hex();
        let d = self.dir.path().join("blocks").join(&hex[..2]);
        (d.join(format!("{hex}.data")), d.join(format!("{hex}.meta")))
    }

    /// Fan-out directory `i` (`blocks/<i as 2 hex digits>`), created if
    /// missing and checked at its first use.
    fn fan(&self, i: usize) -> io::Result<&PrivateDir> {
        if let Some(d) = self.fanout[i].get() {
            return Ok(d);
        }
        let d = self.blocks.subdir(format!("{i:02x}"), true)?;
        // (Two first uses at once: one handle stays, the other is closed.)
        Ok(self.fanout[i].get_or_init(|| d))
    }

    /// Fan-out directory `i` for a walk through all of them (the orphan
    /// sweep, the scan of an older cache): the handle in use if there is
    /// one, else one for the walk only, so that a cache holds descriptors
    /// only for the directories its files are in. None if it is missing.
    fn fan_for_walk(&self, i: usize) -> Option<PrivateDir> {
        match self.fanout[i].get() {
            Some(d) => Some(d.clone()),
            None => self.blocks.subdir(format!("{i:02x}"), false).ok(),
        }
    }

    /// A version's fan-out directory and the names of its data and meta
    /// files in it.
    fn files(&self, key: &VersionKey) -> io::Result<(&PrivateDir, String, String)> {
        let hex = key.hex();
        let dir = self.fan(key.0[0] as usize)?;
        Ok((dir, format!("{hex}.data"), format!("{hex}.meta")))
    }

    /// Does the disk part of evictions (outside the lock).
    fn evict(&self, work: Vec<Eviction>) {
        for w in work {
            match w {
                Eviction::File(k) => self.unlink(&k),
                Eviction::Blocks {
                    key,
                    table,
                    blocks,
                    meta_in_xattr,
                    gen,
                } => {
                    self.punch_blocks(&key, table, &blocks, meta_in_xattr);
                    self.punched(&key, gen, &blocks);
                }
            }
        }
    }

    /// A version's cached file is going or losing blocks: forget open
    /// descriptors of it and tell the hook.
    fn dropping(&self, key: &VersionKey) {
        self.readers.invalidate(key);
        self.tell_dropped(key);
    }

    /// Tells the hook that a version's cached file is no longer whole.
    fn tell_dropped(&self, key: &VersionKey) {
        if let Some(hook) = self.dropped.get() {
            hook(key);
        }
    }

    fn unlink(&self, key: &VersionKey) {
        self.dropping(key);
        let Ok((dir, data, meta)) = self.files(key) else {
            return;
        };
        // Meta first: a data file without meta is discarded at recovery.
        let _ = dir.remove_file(meta);
        let _ = dir.remove_file(data);
    }

    /// Drops evicted blocks of a file that stays: slot first, then data.
    fn punch_blocks(
        &self,
        key: &VersionKey,
        table: u64,
        blocks: &[(u64, u64)],
        meta_in_xattr: bool,
    ) {
        self.dropping(key);
        let Ok((dir, data, meta)) = self.files(key) else {
            return;
        };
        let d = dir.open_file(data, OFlags::WRONLY);
        if meta_in_xattr {
            // One block, so no slot is left: the meta goes (a data file
            // without meta is discarded at recovery).
            if let Ok(d) = &d {
                let _ = crate::sys::fremovexattr(d, META_XATTR);
            }
        } else if let Ok(m) = dir.open_file(meta, OFlags::WRONLY) {
            for (i, _) in blocks {
                let _ = m.write_all_at(&[0u8; SLOT as usize], table + i * SLOT);
            }
        }
        if let Ok(d) = d {
            for (i, len) in blocks {
                let _ = crate::sys::punch_hole(&d, i * self.block_size, *len);
            }
        }
    }

    fn writes_allowed(&self) -> bool {
        let mut off = self.writes_off_until.lock();
        match *off {
            Some(t) if Instant::now() < t => false,
            Some(_) => {
                *off = None;
                info!("cache: trying writes to the cache disk again");
                true
            }
            None => true,
        }
    }

    fn write_failed(&self, what: &str, e: &io::Error) {
        let mut off = self.writes_off_until.lock();
        if off.is_none() {
            warn!(
                "cache: {what} failed: {e}; serving from the source without caching for {}s",
                WRITE_BACKOFF.as_secs()
            );
        }
        *off = Some(Instant::now() + WRITE_BACKOFF);
        self.stats
            .cache_write_errors
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Creates the data and meta files of a new version; returns them open
    /// for writing the first block. With `meta_in_xattr` only the data file
    /// is created: its meta is set with its one block ([`Self::write_block`]).
    fn create_files(
        &self,
        file: &FileVersion,
        nblocks: u64,
        via: Via,
        meta_in_xattr: bool,
    ) -> io::Result<(DataFile, Option<File>)> {
        let (dir, data, meta) = self.files(&file.key)?;
        // The data file needs no set_len: it reaches its full size once every
        // block is written, and only a complete file is handed to the kernel.
        // Always a new inode: a file left at this path (by an entry dropped
        // while its unlink failed) may be in use by a passthrough reader, so
        // it is unlinked, never truncated.
        let d = match self.open_data(dir, &data, true, via) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                let _ = dir.remove_file(&data);
                self.open_data(dir, &data, true, via)?
            }
            r => r?,
        };
        if meta_in_xattr {
            return Ok((d, None));
        }
        // Header and an empty slot table in one write.
        let mut m = dir.create_file(&meta)?;
        m.write_all(&self.new_meta(file, nblocks))?;
        Ok((d, Some(m)))
    }

    #[allow(clippy::too_many_arguments)]
    fn write_block(
        &self,
        file: &FileVersion,
        index: u64,
        block: &ChecksummedBytes,
        guest: bool,
        via: Via,
        created: Option<(DataFile, Option<File>)>,
        meta_in_xattr: bool,
    ) -> io::Result<()> {
        let (dir, data, meta) = self.files(&file.key)?;
        let nblocks = file.block_count(self.block_size);
        let (d, m) = match created {
            Some(files) => files,
            None => (self.open_data(dir, &data, false, via)?, None),
        };
        self.write_data(&d, index * self.block_size, block.data())?;
        let (table, _) = self.meta_layout(&file.rel, nblocks);
        let slot = encode_slot(block.checksum(), block.data().len() as u32, guest);
        if meta_in_xattr {
            // Data first, then the meta.
            let raw = encode_inline(
                file.version.size,
                path_hash(&file.rel),
                block.checksum(),
                guest,
            );
            return self.set_inline_meta(file, &d.file, (dir, &meta), &raw, &slot);
        }
        let m = match m {
            Some(m) => m,
            None => dir.open_file(&meta, OFlags::WRONLY)?,
        };
        m.write_all_at(&slot, table + index * SLOT)?;
        Ok(())
    }

    /// Sets a one-block file's meta on its data file. A file system
    /// without user xattrs (or one that finds the value too large) gets a
    /// `.meta` file with `slot` instead: for good, or for this file.
    fn set_inline_meta(
        &self,
        file: &FileVersion,
        d: &File,
        meta: (&PrivateDir, &str),
        raw: &[u8],
        slot: &[u8; SLOT as usize],
    ) -> io::Result<()> {
        let err = match crate::sys::fsetxattr(d, META_XATTR, raw) {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        match err.raw_os_error() {
            Some(libc::ENOTSUP) => {
                if self.xattr.swap(false, Ordering::Relaxed) {
                    info!("cache: the cache directory's file system refuses user extended attributes ({err}); every cached file gets a .meta file");
                }
            }
            Some(libc::E2BIG) | Some(libc::ERANGE) => {
                debug!(file = %file.rel.display(), "meta too large for an xattr ({err}); writing a .meta file");
            }
            _ => return Err(err),
        }
        let mut full = self.new_meta(file, 1);
        let at = self.meta_layout(&file.rel, 1).0 as usize;
        full[at..at + SLOT as usize].copy_from_slice(slot);
        meta.0.create_file(meta.1)?.write_all(&full)?;
        let mut st = self.state.lock();
        if let Some(e) = st.books.get_mut(&file.key) {
            // (Booked as the xattr's 4 KiB: the `.meta` file may take more.)
            let more = {
                let was = e.meta_bytes();
                e.set_bit(META_IN_XATTR, false);
                e.meta_bytes().saturating_sub(was)
            };
            let tier = tier_of(e.meta_on_guest());
            if more > 0 {
                st.books.add(&file.key, more, tier);
            }
        }
        Ok(())
    }

    /// Drops one block found bad (on the books and, best effort, on disk).
    /// A file in use by passthrough is not modified: it is dropped whole.
    fn drop_block(&self, file: &FileVersion, index: u64, corrupt: bool) {
        let len = file.block_len(index, self.block_size) as u64;
        if corrupt && self.good_again(file, index) {
            // Two reads found the same bad block; the other dropped it and
            // it was written again since: the new bytes stay.
            return;
        }
        if corrupt {
            self.stats.corrupt_blocks.fetch_add(1, Ordering::Relaxed);
            warn!(file = %file.rel.display(), block = index, "cache: corrupt block dropped; refetching from the source");
        }
        let meta_in_xattr = {
            let mut guard = self.state.lock();
            let st = &mut *guard;
            // Passthrough pins (`open_complete`, `pin_complete`, less
            // `unpin`): while any is held the kernel may read the data file
            // without us.
            let passthrough = st.books.held(&file.key) > 0;
            let Some(e) = st.books.get_mut(&file.key) else {
                return;
            };
            let was_complete = e.complete();
            if e.slot(index as usize) != Some(Slot::Present) {
                return;
            }
            if passthrough || e.blocks.len() == 1 {
                // Punching the block out would show the kernel a hole (zeros)
                // where a passthrough reader expects the file's bytes. A
                // one-block file goes whole too: its meta (checked with its
                // block, the books keep no checksum of it) is written anew
                // with it, not patched.
                st.forget(&file.key);
                drop(guard);
                self.unlink(&file.key);
                return;
            }
            // Writing until the hole is punched: a write of the same block
            // waits, so that the punch cannot land on its new bytes.
            e.set_slot(index as usize, Slot::Writing);
            let gen = e.gen;
            e.blocks[index as usize].verified = false;
            if let Some(ix) = &mut st.index {
                ix.append(&Op::DropBlock {
                    key: file.key,
                    index: index as u32,
                });
            }
            let tier = tier_of(e.blocks[index as usize].guest);
            let meta_in_xattr = e.meta_in_xattr();
            if was_complete {
                st.files_complete -= 1;
            }
            st.books.shrink(&file.key, round_alloc(len), tier);
            (meta_in_xattr, gen)
        };
        let (meta_in_xattr, gen) = meta_in_xattr;
        let nblocks = file.block_count(self.block_size);
        let (table, _) = self.meta_layout(&file.rel, nblocks);
        self.punch_blocks(&file.key, table, &[(index, len)], meta_in_xattr);
        self.punched(&file.key, gen, &[(index, len)]);
    }

    /// Whether a block reported bad is present and good now (read afresh
    /// from its file: dropped by another reader and written again).
    fn good_again(&self, file: &FileVersion, index: u64) -> bool {
        let want = {
            let st = self.state.lock();
            match st
                .books
                .get(&file.key)
                .and_then(|e| expect(e, index as usize))
            {
                Some(w) => w,
                None => return false,
            }
        };
        let Ok(f) = self
            .files(&file.key)
            .and_then(|(dir, data, _)| dir.open_read(data))
        else {
            return false;
        };
        matches!(self.read_checked(&f, file, index, want), Checked::Good(_))
    }

    /// The holes of dropped blocks are punched: their slots (held at
    /// `Writing` meanwhile) are free for new writes.
    fn punched(&self, key: &VersionKey, gen: u32, blocks: &[(u64, u64)]) {
        let mut st = self.state.lock();
        if let Some(e) = st.books.get_mut(key).filter(|e| e.gen == gen) {
            for (i, _) in blocks {
                if e.slot(*i as usize) == Some(Slot::Writing) {
                    e.set_slot(*i as usize, Slot::Empty);
                }
            }
        }
    }

    /// Writes one block as an own block or a guest: waits out another
    /// writer of it, books it (evicting what must go), creates the files of
    /// a new entry, writes, and settles the books with the outcome.
    fn store(
        &self,
        file: &FileVersion,
        index: u64,
        block: &ChecksummedBytes,
        guest: bool,
        via: Via,
    ) -> bool {
        let nblocks = file.block_count(self.block_size);
        if index >= nblocks
            || nblocks > MAX_BLOCKS
            || block.data().len() != file.block_len(index, self.block_size)
            || self.meta_layout(&file.rel, nblocks).0 > u16::MAX as u64
        {
            // (The index records a block number in 32 bits and the slot
            // table's offset in 16: no real file comes near either.)
            return false;
        }
        // A file of several blocks is written through the page cache only.
        // Its blocks are written side by side (the loader's, read-ahead's),
        // and ext4 runs an O_DIRECT write that allocates under the inode's
        // lock until the device completes it: buffered writes of the same
        // file queued behind each one, and on a cold pass of large files the
        // loader outran the cache (65-1868 of 2048 blocks left unwritten,
        // read from the source again; buffered only: 0-54).
        let via = if nblocks > 1 { Via::PageCache } else { via };
        if !self.writes_allowed() {
            return false;
        }
        let len = round_alloc(block.data().len() as u64);
        if self.wait_for_other_writer(file, index) {
            return true;
        }
        let mut booked = match self.book_block(file, index, nblocks, len, guest) {
            Ok(b) => b,
            Err(answer) => return answer,
        };
        self.evict(std::mem::take(&mut booked.work));
        let result = self
            .create_once(file, nblocks, via, booked.meta_in_xattr)
            .and_then(|handles| {
                self.write_block(
                    file,
                    index,
                    block,
                    guest,
                    via,
                    handles,
                    booked.meta_in_xattr,
                )
            });
        self.settle(file, index, block, guest, &booked, result)
    }

    /// Waits (at most about 5 s) while another writer has the same block
    /// (a warm-up racing a read), rather than report a failure that did not
    /// happen; true if the block is present now.
    fn wait_for_other_writer(&self, file: &FileVersion, index: u64) -> bool {
        let mut waited = 0;
        loop {
            let writing = {
                let st = self.state.lock();
                match st
                    .books
                    .get(&file.key)
                    .map(|e| e.blocks[index as usize].slot)
                {
                    Some(Slot::Present) => return true,
                    Some(Slot::Writing) => true,
                    _ => false,
                }
            };
            if !writing || waited >= 5000 {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
            waited += 1;
        }
    }

    /// Books a block about to be written: admitted (its entry made if
    /// new, older versions of the path beyond `MAX_VERSIONS` dropped), its
    /// slot `Writing` and the entry pinned. Err with the answer to give if
    /// there is nothing to write (refused: false; present already: true).
    fn book_block(
        &self,
        file: &FileVersion,
        index: u64,
        nblocks: u64,
        len: u64,
        guest: bool,
    ) -> Result<Booked, bool> {
        let tier = tier_of(guest);
        let mut st = self.state.lock();
        let st = &mut *st;
        st.books
            .set_dataset_bytes(self.dataset_bytes.load(Ordering::Relaxed));
        let new = !st.books.contains(&file.key);
        if let Some(e) = st.books.get(&file.key) {
            if e.blocks[index as usize].slot != Slot::Empty {
                return Err(e.blocks[index as usize].slot == Slot::Present);
            }
        }
        let (table, _) = self.meta_layout(&file.rel, nblocks);
        let inline = nblocks == 1 && self.xattr.load(Ordering::Relaxed);
        let gen = if new { st.next_gen() } else { 0 };
        let bits = if inline { META_IN_XATTR } else { 0 } | if guest { META_ON_GUEST } else { 0 };
        let fresh = Entry::new(file.version.size, nblocks, table, bits, gen);
        let bytes = len
            + if new {
                fresh.meta_bytes() + PER_FILE_OVERHEAD
            } else {
                0
            };
        let make = || fresh;
        let mut victims = match st.books.admit_with(file.key, bytes, tier, make) {
            Admission::Reject => return Err(false),
            Admission::Admit { evict } => evict,
        };
        if new {
            // (A path's versions are bounded: see `MAX_VERSIONS`.)
            let others: Vec<VersionKey> = st
                .books
                .keys_like(&file.key)
                .filter(|k| *k != file.key)
                .collect();
            if others.len() >= MAX_VERSIONS {
                for k in others {
                    if st.books.is_pinned(&k) {
                        continue;
                    }
                    if let Some((x, _)) = st.books.remove(&k) {
                        victims.push(Evicted {
                            key: k,
                            tier: Tier::Own,
                            gone: Some(x),
                        });
                    }
                }
            }
        }
        let work = self.plan_evictions(st, victims);
        // (Admitted: on the books, and never its own victim.)
        let Some(e) = st.books.get_mut(&file.key) else {
            return Err(false);
        };
        let gen = e.gen;
        e.set_slot(index as usize, Slot::Writing);
        e.blocks[index as usize].guest = guest;
        // Read once: only this write (the file's one block) changes it.
        let meta_in_xattr = e.meta_in_xattr();
        // Writing entries are pinned: an eviction must not unlink files
        // that a write is about to recreate.
        st.books.pin(&file.key);
        Ok(Booked {
            work,
            new,
            bytes,
            meta_in_xattr,
            gen,
        })
    }

    /// Creates the files of a new entry once, however many writers of its
    /// blocks come at once (each would truncate them): serialized and
    /// checked again inside. The open files, if this call created them.
    fn create_once(
        &self,
        file: &FileVersion,
        nblocks: u64,
        via: Via,
        meta_in_xattr: bool,
    ) -> io::Result<Option<(DataFile, Option<File>)>> {
        let created = |me: &Self| {
            let st = me.state.lock();
            st.books.get(&file.key).is_none_or(|e| e.created())
        };
        if created(self) {
            return Ok(None);
        }
        let lock = &self.create_locks[file.key.0[0] as usize % CREATE_LOCKS];
        let _creating = lock.lock();
        if created(self) {
            return Ok(None);
        }
        let files = self.create_files(file, nblocks, via, meta_in_xattr)?;
        if let Some(e) = self.state.lock().books.get_mut(&file.key) {
            e.set_bit(CREATED, true);
        }
        Ok(Some(files))
    }

    /// The books after a block's write: present and logged to the index,
    /// or, on failure, its room given back (a new entry forgotten whole).
    fn settle(
        &self,
        file: &FileVersion,
        index: u64,
        block: &ChecksummedBytes,
        guest: bool,
        booked: &Booked,
        result: io::Result<()>,
    ) -> bool {
        let Booked {
            new, bytes, gen, ..
        } = *booked;
        let tier = tier_of(guest);
        let mut st = self.state.lock();
        if st.books.get(&file.key).is_none_or(|e| e.gen != gen) {
            // The entry was dropped while this block was written (its data
            // file unlinked; the bytes went to that inode or, being the same
            // version's bytes, to a new file of the same key, whose entry
            // does not count them): nothing to book, and no fault of the
            // cache disk.
            return false;
        }
        st.books.unpin(&file.key);
        match result {
            Ok(()) => {
                let Some(e) = st.books.get_mut(&file.key) else {
                    return false;
                };
                e.set_present(index as usize, *block.checksum());
                e.blocks[index as usize].verified = true;
                // Data and meta are written: now the index may say so.
                let put = Put {
                    key: file.key,
                    index: index as u32,
                    size: e.size(),
                    path_hash: file.key.path_part() as u64,
                    sum: *block.checksum(),
                    guest,
                    meta_in_xattr: e.meta_in_xattr(),
                    table: e.table,
                };
                if e.complete() {
                    st.files_complete += 1;
                }
                st.log(Op::Put(put));
                let due = st.index.as_ref().is_some_and(|ix| ix.checkpoint_due());
                drop(st);
                if due {
                    self.checkpoint();
                }
                true
            }
            Err(err) => {
                if new {
                    st.forget(&file.key);
                    drop(st);
                    self.unlink(&file.key);
                } else {
                    if let Some(e) = st.books.get_mut(&file.key) {
                        e.set_slot(index as usize, Slot::Empty);
                    }
                    st.books.shrink(&file.key, bytes, tier);
                    drop(st);
                }
                self.write_failed("writing a block", &err);
                false
            }
        }
    }

    /// Reads one block and checks it against its checksum; drops nothing.
    fn read_checked(&self, f: &File, file: &FileVersion, index: u64, want: Expect) -> Checked {
        let sum = match want {
            Expect::Sum(sum) => sum,
            Expect::Meta { in_xattr, table } => {
                match self.stored_sum(f, file, index, in_xattr, table) {
                    Ok(sum) => sum,
                    Err(c) => return c,
                }
            }
        };
        let len = file.block_len(index, self.block_size);
        match crate::sys::read_vec_at(f, len, index * self.block_size) {
            Ok(buf) => match ChecksummedBytes::verified(Bytes::from(buf), sum) {
                Some(b) => Checked::Good(b),
                None => Checked::Bad,
            },
            Err(e) => self.unreadable(file, &e),
        }
    }

    /// A read error of the cache's files: transient (nothing is known of the
    /// block) or not (the block is bad).
    fn unreadable(&self, file: &FileVersion, e: &io::Error) -> Checked {
        debug!(file = %file.rel.display(), "cache read failed: {e}");
        if transient(e) {
            Checked::Transient
        } else {
            Checked::Bad
        }
    }

    /// A one-block file's checksum, from its meta on disk (`f` is its data
    /// file): its [`META_XATTR`], or block `index`'s slot in its `.meta`
    /// file. Meta that is gone, or that does not describe this block of
    /// this version, makes the block bad.
    fn stored_sum(
        &self,
        f: &File,
        file: &FileVersion,
        index: u64,
        in_xattr: bool,
        table: u16,
    ) -> Result<Checksum, Checked> {
        if in_xattr {
            let mut raw = [0u8; INLINE_LEN];
            let n = crate::sys::fgetxattr(f, META_XATTR, &mut raw)
                .map_err(|e| self.unreadable(file, &e))?;
            return match decode_inline(&raw[..n]) {
                Some((size, path_hash, sum, _))
                    if index == 0
                        && size == file.version.size
                        && path_hash as u32 == file.key.path_part() =>
                {
                    Ok(sum)
                }
                _ => Err(Checked::Bad),
            };
        }
        // A `.meta` file (a cache file system without user xattrs): its
        // header must name this version, its slot this block.
        let mut head = [0u8; HEADER_FIXED];
        let mut slot = [0u8; SLOT as usize];
        self.files(&file.key)
            .and_then(|(dir, _, meta)| dir.open_read(meta))
            .and_then(|m| {
                m.read_exact_at(&mut head, 0)?;
                m.read_exact_at(&mut slot, table as u64 + index * SLOT)
            })
            .map_err(|e| self.unreadable(file, &e))?;
        let len = file.block_len(index, self.block_size) as u64;
        match decode_slot(&slot) {
            Some((sum, l, m))
                if index == 0
                    && header_key(&head) == Some(file.key)
                    && l as u64 == len
                    && (m == PRESENT || m == PRESENT_GUEST) =>
            {
                Ok(sum)
            }
            _ => Err(Checked::Bad),
        }
    }

    /// One verified block; a bad one is dropped.
    fn read_verified(
        &self,
        f: &File,
        file: &FileVersion,
        index: u64,
        want: Expect,
    ) -> Option<ChecksummedBytes> {
        match self.read_checked(f, file, index, want) {
            Checked::Good(b) => Some(b),
            Checked::Transient => None,
            Checked::Bad => {
                self.drop_block(file, index, true);
                None
            }
        }
    }

    /// The version's data file, open for reading (kept open for a while).
    fn reader(&self, key: &VersionKey) -> io::Result<Arc<File>> {
        self.readers
            .try_get_with(*key, || {
                let (dir, data, _) = self.files(key)?;
                dir.open_read(data).map(Arc::new)
            })
            .map_err(|e| match e.raw_os_error() {
                Some(n) => io::Error::from_raw_os_error(n),
                None => io::Error::new(e.kind(), e.to_string()),
            })
    }

    /// A version's data file could not be opened. A transient error leaves
    /// the entry as it is (a miss); any other (the file is gone, EIO) drops
    /// the entry properly: off the books, its files deleted, the FUSE layer
    /// told.
    fn data_unreadable(&self, file: &FileVersion, e: &io::Error) {
        if transient(e) {
            debug!(file = %file.rel.display(), "cache: data file not opened ({e}); a miss");
            return;
        }
        warn!(file = %file.rel.display(), "cache: data file cannot be opened ({e}); entry dropped");
        self.drop_file(&file.key);
    }

    /// Drops a version's entry whole: off the books (its space and pins with
    /// it), then its files unlinked (descriptors open on them keep the old
    /// inode) and the dropped-file hook told.
    fn drop_file(&self, key: &VersionKey) {
        self.state.lock().forget(key);
        self.unlink(key);
    }

    /// Marks blocks verified, if the entry still holds them as they were
    /// checked.
    fn mark_verified(&self, key: &VersionKey, blocks: &[(u64, Expect)]) {
        let mut st = self.state.lock();
        if let Some(e) = st.books.get_mut(key) {
            for (i, want) in blocks {
                if expect(e, *i as usize) == Some(*want) {
                    e.blocks[*i as usize].verified = true;
                }
            }
        }
    }

    /// The present blocks of a complete file not yet verified in this mount;
    /// None if the file is not complete.
    fn unverified(&self, key: &VersionKey) -> Option<Vec<(u64, Expect)>> {
        let st = self.state.lock();
        let e = st.books.get(key)?;
        if !e.complete() {
            return None;
        }
        // (Every block is usually verified already: opened before, or
        // written during this mount.)
        Some(
            (0..e.blocks.len())
                .filter(|&i| !e.blocks[i].verified)
                .filter_map(|i| Some((i as u64, expect(e, i)?)))
                .collect(),
        )
    }

    /// Queues a complete file for verification on the background verifier
    /// thread (started if it is not running; it exits when the queue is
    /// empty).
    fn verify_later(self: &Arc<Self>, file: &FileVersion) {
        let mut q = self.verify.lock();
        if q.queued.contains(&file.key) || q.files.len() >= VERIFY_QUEUE_MAX {
            return;
        }
        q.queued.insert(file.key);
        q.files.push_back(file.clone());
        if q.running {
            return;
        }
        let me = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("locafs-verify".into())
            .spawn(move || {
                while let Some(core) = me.upgrade() {
                    let next = {
                        let mut q = core.verify.lock();
                        let next = q.files.pop_front();
                        match &next {
                            Some(f) => {
                                q.queued.remove(&f.key);
                            }
                            None => q.running = false,
                        }
                        next
                    };
                    match next {
                        Some(f) => core.verify_file(&f),
                        None => return,
                    }
                }
            });
        match spawned {
            Ok(_) => q.running = true,
            Err(e) => {
                debug!("cache: no verifier thread ({e}); the file is verified as it is read");
                q.files.clear();
                q.queued.clear();
            }
        }
    }

    /// Verifies every unverified block of a complete file (the background
    /// verifier); a bad block is dropped.
    fn verify_file(&self, file: &FileVersion) {
        let Some(todo) = self.unverified(&file.key) else {
            return;
        };
        if todo.is_empty() {
            return;
        }
        let f = match self.reader(&file.key) {
            Ok(f) => f,
            Err(e) => return self.data_unreadable(file, &e),
        };
        let mut done = Vec::with_capacity(todo.len());
        for (i, want) in todo {
            if self.closed.load(Ordering::Relaxed) {
                break;
            }
            if self.read_verified(&f, file, i, want).is_none() {
                break;
            }
            done.push((i, want));
        }
        self.mark_verified(&file.key, &done);
    }

    /// Takes back one passthrough pin.
    fn unpin_passthrough(&self, file: &FileVersion) {
        self.state.lock().books.unpin_held(&file.key);
    }
}

impl Core {
    /// The state of block `index` of `file`'s cache entry; None if the
    /// cache has no entry of that version.
    fn slot_of(&self, file: &FileVersion, index: u64) -> Option<Slot> {
        let st = self.state.lock();
        st.books.get(&file.key).and_then(|e| e.slot(index as usize))
    }
}

impl BlockStore for DiskCache {
    fn get(&self, file: &FileVersion, index: u64) -> Option<ChecksummedBytes> {
        let want = {
            let st = self.core.state.lock();
            expect(st.books.get(&file.key)?, index as usize)?
        };
        let f = match self.core.reader(&file.key) {
            Ok(f) => f,
            Err(e) => {
                // Out of descriptors (a miss), or the file is gone (someone
                // cleaned the cache dir): dropped properly.
                self.core.data_unreadable(file, &e);
                return None;
            }
        };
        let block = self.core.read_verified(&f, file, index, want)?;
        self.core.mark_verified(&file.key, &[(index, want)]);
        self.core.state.lock().touch(file.key);
        Some(block)
    }

    fn put(&self, file: &FileVersion, index: u64, block: &ChecksummedBytes) -> bool {
        self.core.store(file, index, block, false, Via::Direct)
    }

    fn put_guest(&self, file: &FileVersion, index: u64, block: &ChecksummedBytes) -> bool {
        self.core.store(file, index, block, true, Via::Direct)
    }

    fn put_ahead(
        &self,
        file: &FileVersion,
        index: u64,
        block: &ChecksummedBytes,
        guest: bool,
    ) -> bool {
        self.core.store(file, index, block, guest, Via::PageCache)
    }

    fn is_block_cached(&self, file: &FileVersion, index: u64) -> bool {
        self.core.slot_of(file, index) == Some(Slot::Present)
    }

    fn is_block_being_written(&self, file: &FileVersion, index: u64) -> bool {
        self.core.slot_of(file, index) == Some(Slot::Writing)
    }

    fn is_complete(&self, file: &FileVersion) -> bool {
        self.core
            .state
            .lock()
            .books
            .get(&file.key)
            .is_some_and(Entry::complete)
    }

    fn note_current(&self, file: &FileVersion) {
        let mut st = self.core.state.lock();
        let st = &mut *st;
        // (Every version of the path hashes as its key does; another path
        // that shares the 32 bits of its path part only has its old
        // versions go first when room is needed: nothing is served by it.)
        let old: Vec<VersionKey> = st
            .books
            .keys_like(&file.key)
            .filter(|k| *k != file.key)
            .collect();
        for k in old {
            st.books.mark_stale(&k);
        }
    }

    fn record_access(&self, file: &FileVersion, bytes: u64) {
        let mut st = self.core.state.lock();
        st.books.record_read(bytes);
        st.touch(file.key);
    }

    fn has_room_for(&self, file: &FileVersion) -> bool {
        let nblocks = file.block_count(self.core.block_size);
        let data = (nblocks.saturating_sub(1)) * round_alloc(self.core.block_size)
            + round_alloc(file.block_len(nblocks.saturating_sub(1), self.core.block_size) as u64);
        let need =
            data + round_alloc(self.core.meta_layout(&file.rel, nblocks).1) + PER_FILE_OVERHEAD;
        let st = self.core.state.lock();
        let have = st.books.get(&file.key).map_or(0, |e| {
            self.core.part_bytes(e, false) + self.core.part_bytes(e, true)
        });
        st.books.used() + need.saturating_sub(have) <= st.books.capacity()
    }

    fn usage(&self) -> CacheUsage {
        let st = self.core.state.lock();
        CacheUsage {
            used_bytes: st.books.used() + FIXED_OVERHEAD,
            capacity_bytes: st.books.capacity() + FIXED_OVERHEAD,
            files_cached: st.files_complete,
            evictions: st.books.evictions(),
            writable: self.core.writes_off_until.lock().is_none(),
        }
    }
}

impl CompleteFiles for DiskCache {
    /// Verifies on the caller's thread (a FUSE thread) at most one block's
    /// bytes, as a read served from the cache does; a file with more not yet
    /// verified in this mount (after a remount or a crash) gets None (it is
    /// opened without passthrough, its reads verified as they are served)
    /// and is queued for the background verifier, so that a later open can
    /// hand it to the kernel.
    fn open_complete(&self, file: &FileVersion) -> Option<File> {
        let todo = self.core.unverified(&file.key)?;
        let unverified: u64 = todo
            .iter()
            .map(|(i, _)| file.block_len(*i, self.core.block_size) as u64)
            .sum();
        if unverified > self.core.block_size {
            self.core.verify_later(file);
            return None;
        }
        {
            let mut st = self.core.state.lock();
            let e = st.books.get(&file.key)?;
            // (So many opens of one file at once: the next are served
            // through the daemon.)
            if !e.complete() || st.books.held(&file.key) >= MAX_PASSTHROUGH_PINS {
                return None;
            }
            st.books.pin_held(&file.key);
            // The kernel reads it without us: count it as read whole.
            st.books.record_read(file.version.size);
            st.touch(file.key);
        }
        let f = match self
            .core
            .files(&file.key)
            .and_then(|(dir, data, _)| dir.open_read(data))
        {
            Ok(f) => f,
            Err(e) => {
                self.core.unpin_passthrough(file);
                self.core.data_unreadable(file, &e);
                return None;
            }
        };
        // The kernel reads a passthrough file to its own end: it must be
        // exactly the source file's size (a cache directory edited by hand,
        // or written by an older version that padded direct writes).
        if f.metadata().map(|m| m.len()).ok() != Some(file.version.size) {
            self.core.unpin_passthrough(file);
            return None;
        }
        for (i, want) in &todo {
            match self.core.read_checked(&f, file, *i, *want) {
                Checked::Good(_) => {}
                Checked::Transient => {
                    self.core.unpin_passthrough(file);
                    return None;
                }
                Checked::Bad => {
                    // Unpinned first: nobody else reads it by passthrough
                    // (it was not verified), so only the block goes.
                    self.core.unpin_passthrough(file);
                    self.core.drop_block(file, *i, true);
                    return None;
                }
            }
        }
        self.core.mark_verified(&file.key, &todo);
        Some(f)
    }

    fn pin_complete(&self, file: &FileVersion) -> bool {
        let mut st = self.core.state.lock();
        match st.books.get(&file.key) {
            Some(e)
                if e.complete()
                    && st.books.held(&file.key) < MAX_PASSTHROUGH_PINS
                    && e.blocks.iter().all(|b| b.verified) => {}
            _ => return false,
        }
        st.books.pin_held(&file.key);
        // The kernel reads it without us: count it as read whole.
        st.books.record_read(file.version.size);
        st.touch(file.key);
        true
    }

    fn pin_in_use(&self, file: &FileVersion) -> bool {
        let mut st = self.core.state.lock();
        match st.books.get(&file.key) {
            Some(e) if e.complete() => {}
            _ => return false,
        }
        st.books.pin_held(&file.key);
        true
    }

    fn unpin(&self, file: &FileVersion) {
        self.core.unpin_passthrough(file);
    }

    fn on_file_dropped(&self, hook: super::DroppedHook) {
        if self.core.dropped.set(hook).is_err() {
            warn!("cache: a second dropped-file hook was ignored");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::disk::books::Blocks;
    use crate::cache::disk::books::Books;
    use crate::cache::disk::direct_io::DIRECT_ALIGN;
    use crate::source::SourceVersion;
    use crate::test_skip::skipped;
    use std::fs::{self, OpenOptions};

    const BS: u64 = 4096;
    /// Meta file and directory entries of a small new file.
    const NEW_FILE: u64 = 4096 + PER_FILE_OVERHEAD;

    /// The books of a one-block file: one record of at most RECORD_MAX
    /// bytes, the disk's (16) and the policy's (32) in one, with its block
    /// and size inline (no heap block of its own, and no checksum: that is
    /// on disk, in its meta), plus a u32 in the one lookup table (by key,
    /// which finds a path's versions too). Before (2026-12-02): a 64-byte
    /// record whose disk half kept the checksum (32); before (until
    /// 2026-12-02): a 72-byte record (the path hash and the
    /// passthrough pins in the disk's half) and a second table by path
    /// hash; an 88-byte record
    /// (the policy's half 47, with the guest part's bytes and the second
    /// list's links in every record), a 120-byte one; before that an 80-byte record, a policy record of
    /// 56 bytes and three lookup tables; before that a hash map bucket of
    /// about 144 bytes and three vectors.
    #[test]
    fn the_record_of_a_one_block_file_is_small() {
        const RECORD_MAX: usize = 48;
        assert_eq!(std::mem::size_of::<Entry>(), 16);
        let rec = Books::record_size();
        assert!(rec <= RECORD_MAX, "a record is {rec} bytes");
        let one = Blocks::new(BS, 1);
        assert!(one.is_one() && one.many().is_none());
        assert_eq!((one.size(), one.len()), (BS, 1));
        let many = Blocks::new(BS + 1, 2);
        assert_eq!(
            many.many().map(|m| (m.size, m.sums.len())),
            Some((BS + 1, 2))
        );
        assert_eq!((many.is_one(), many.size(), many.len()), (false, BS + 1, 2));
        // A one-block file larger than 4 GiB (a block size that large) has
        // its size in a side table.
        let huge = Blocks::new(1 << 33, 1);
        assert_eq!(
            (huge.is_one(), huge.size(), huge.len()),
            (false, 1 << 33, 1)
        );
        let mut p = new_books(1 << 40, BS);
        let n = 100_000u32;
        p.reserve(n as usize);
        for i in 0..n {
            let mut k = [0u8; 16];
            k[..4].copy_from_slice(&i.to_le_bytes());
            p.get_or_insert_with(VersionKey(k), || new_entry(i as u64));
            p.add(&VersionKey(k), 8192 + PER_FILE_OVERHEAD, Tier::Own);
        }
        let per = p.heap_bytes() / n as usize;
        assert!(per <= RECORD_MAX + 6, "the books: {per} bytes per entry");
    }

    fn new_entry(i: u64) -> Entry {
        Entry::new(i % BS + 1, 1, 0, META_IN_XATTR, 0)
    }

    /// The dense table keeps its lookups right as records are removed (the
    /// last record moves into the freed place), and finds every version of
    /// a path.
    #[test]
    fn the_dense_table_finds_every_record_after_removals() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let mut t = new_books(1 << 40, BS);
        let mut model: std::collections::HashMap<VersionKey, u64> = Default::default();
        for _ in 0..5000 {
            let i: u8 = rng.random_range(0..200);
            let mut key = VersionKey(blake3::hash(&[i]).as_bytes()[..16].try_into().unwrap());
            // Few paths, several versions each.
            let ph = (i % 23) as u64;
            key.0[..4].copy_from_slice(&(ph as u32).to_le_bytes());
            if rng.random_bool(0.5) {
                t.get_or_insert_with(key, || new_entry(i as u64));
                model.insert(key, ph);
            } else {
                assert_eq!(t.remove(&key).is_some(), model.remove(&key).is_some());
            }
            assert_eq!(t.len(), model.len());
            for (k, ph) in &model {
                assert!(t.get(k).is_some());
                assert_eq!(k.path_part() as u64, *ph);
            }
            for ph in 0..23u32 {
                let mut probe = VersionKey([0xee; 16]);
                probe.0[..4].copy_from_slice(&ph.to_le_bytes());
                let mut got: Vec<_> = t.keys_like(&probe).collect();
                let mut want: Vec<_> = model
                    .iter()
                    .filter(|(_, p)| **p == ph as u64)
                    .map(|(k, _)| *k)
                    .collect();
                got.sort();
                want.sort();
                assert_eq!(got, want);
            }
        }
    }

    fn file(name: &str, blocks: u64) -> FileVersion {
        FileVersion::new(
            Arc::from(Path::new(name)),
            SourceVersion {
                size: blocks * BS,
                mtime_ns: 1,
                ino: name.len() as u64,
            },
        )
    }

    /// A path's versions share a hash in the books: a file rewritten and
    /// cached again and again keeps at most `MAX_VERSIONS` of them (the
    /// older ones go, files and all), and a reopen finds the same.
    #[test]
    fn the_versions_of_one_path_are_bounded() {
        let d = tempfile::tempdir().unwrap();
        let c = open(d.path(), 1 << 30);
        let v = |m: i64| {
            FileVersion::new(
                Arc::from(Path::new("x/y.jpg")),
                SourceVersion {
                    size: BS,
                    mtime_ns: m,
                    ino: 9,
                },
            )
        };
        let other = file("x/z.jpg", 1);
        assert!(c.put(&other, 0, &block(&other, 0)));
        for m in 0..3 * MAX_VERSIONS as i64 {
            let f = v(m);
            assert!(c.put(&f, 0, &block(&f, 0)), "version {m}");
            let n = c.core.state.lock().books.keys_like(&f.key).count();
            assert!((1..=MAX_VERSIONS).contains(&n), "{n} versions after {m}");
            assert!(c.get(&f, 0).is_some());
        }
        assert!(c.get(&other, 0).is_some(), "another path is untouched");
        // The first versions' files are gone (evicted whole).
        assert!(!c.core.paths(&v(0).key).0.exists());
        assert!(c.get(&v(0), 0).is_none());
        let last = v(3 * MAX_VERSIONS as i64 - 1);
        drop(c);
        let c = open(d.path(), 1 << 30);
        assert!(c.get(&last, 0).is_some());
        assert!(c.get(&v(0), 0).is_none());
        assert!(c.core.state.lock().books.keys_like(&last.key).count() <= MAX_VERSIONS);
    }

    fn block(f: &FileVersion, i: u64) -> ChecksummedBytes {
        let mut d = vec![0u8; BS as usize];
        d[..8].copy_from_slice(&i.to_le_bytes());
        d[8] = f.rel.as_os_str().len() as u8;
        ChecksummedBytes::from_source(Bytes::from(d))
    }

    /// A cache with `room` bytes for entries (below the smallest size a
    /// user may configure, to keep the test small).
    fn open(dir: &Path, room: u64) -> DiskCache {
        let c = DiskCache::open(dir, Some(FIXED_OVERHEAD * 2), BS, Arc::default())
            .unwrap()
            .0;
        let mut st = c.core.state.lock();
        st.books.set_capacity(room);
        let v = st.books.shrink_to_capacity();
        let work = c.core.plan_evictions(&mut st, v);
        drop(st);
        c.core.evict(work);
        c
    }

    #[test]
    fn concurrent_writers_of_a_new_file_never_clobber_each_other() {
        // Read-ahead writes several blocks of a new file at once; each must
        // survive, since blocks written in this mount are trusted by
        // passthrough without being read back.
        for round in 0..20 {
            let dir = tempfile::tempdir().unwrap();
            let c = open(dir.path(), 1 << 20);
            let f = file(&format!("r{round}"), 16);
            std::thread::scope(|s| {
                for i in 0..16 {
                    let (c, f) = (&c, &f);
                    s.spawn(move || assert!(c.put(f, i, &block(f, i))));
                }
            });
            let back = c.open_complete(&f).expect("complete");
            for i in 0..16 {
                let mut b = vec![0u8; BS as usize];
                back.read_exact_at(&mut b, i * BS).unwrap();
                assert_eq!(&b[..], &block(&f, i).data()[..], "round {round} block {i}");
            }
        }
    }

    #[test]
    fn guests_fill_spare_room_and_give_way_to_own_blocks() {
        let d = tempfile::tempdir().unwrap();
        // Room for two small files and six blocks.
        let c = open(d.path(), 2 * NEW_FILE + 6 * BS);
        let g = file("guest", 4);
        let m = file("mixed", 4);
        let o = file("own", 4);
        for i in 0..4 {
            assert!(c.put_guest(&g, i, &block(&g, i)));
        }
        c.record_access(&m, 1); // "guest" is now the oldest entry
                                // A mixed file: one own block, then guests until the room is full;
                                // a guest never evicts anything.
        assert!(c.put(&m, 0, &block(&m, 0)));
        assert!(c.put_guest(&m, 1, &block(&m, 1)));
        assert!(
            !c.put_guest(&m, 2, &block(&m, 2)),
            "a guest evicted something"
        );
        // Own blocks evict guests, oldest first: all of "guest" (the whole
        // file goes), then the guest block of "mixed" but not its own one.
        for i in 0..4 {
            assert!(c.put(&o, i, &block(&o, i)), "own block {i} refused");
        }
        assert!(c.put(&m, 3, &block(&m, 3)));
        assert!((0..4).all(|i| c.get(&g, i).is_none()));
        let (gdata, gmeta) = c.core.paths(&g.key);
        assert!(
            !gdata.exists() && !gmeta.exists(),
            "evicted file left on disk"
        );
        assert_eq!(c.get(&m, 0).unwrap().data(), block(&m, 0).data());
        assert_eq!(c.get(&m, 3).unwrap().data(), block(&m, 3).data());
        assert!(c.get(&m, 1).is_none() && c.get(&m, 2).is_none());
        assert!(c.core.paths(&m.key).0.exists());
        assert!((0..4).all(|i| c.get(&o, i).is_some()));
        let st = c.core.state.lock();
        assert!(st.books.used() <= st.books.capacity());
        drop(st);
        // Own blocks are not churned for other own blocks.
        let more = file("more", 1);
        assert!(!c.put(&more, 0, &block(&more, 0)));
    }

    #[test]
    fn guest_marks_survive_a_restart() {
        let d = tempfile::tempdir().unwrap();
        let room = NEW_FILE * 2 + 3 * BS;
        let q = file("q-guest", 2);
        let r = file("r-own", 1);
        let used = {
            let c = open(d.path(), room);
            assert!(c.put_guest(&q, 0, &block(&q, 0)));
            assert!(c.put_guest(&q, 1, &block(&q, 1)));
            assert!(c.put(&r, 0, &block(&r, 0)));
            c.usage().used_bytes
        };
        let c = open(d.path(), room);
        assert_eq!(c.usage().used_bytes, used);
        assert!(c.get(&q, 1).is_some() && c.get(&r, 0).is_some());
        // The recovered guests still go first.
        let s = file("s-own", 1);
        assert!(c.put(&s, 0, &block(&s, 0)));
        assert!(c.get(&q, 0).is_none());
        assert!(c.get(&r, 0).is_some() && c.get(&s, 0).is_some());
    }

    #[test]
    fn one_block_files_keep_their_meta_in_the_data_file() {
        let d = tempfile::tempdir().unwrap();
        let one = file("one", 1);
        let two = file("two", 2);
        let bad = file("bad", 1);
        let (xattrs, bad_data) = {
            let c = open(d.path(), 1 << 20);
            assert!(c.put(&one, 0, &block(&one, 0)));
            assert!(c.put_ahead(&bad, 0, &block(&bad, 0), true));
            assert!(c.put(&two, 0, &block(&two, 0)) && c.put(&two, 1, &block(&two, 1)));
            let xattrs = c.core.xattr.load(Ordering::Relaxed);
            if !xattrs {
                eprintln!("NOTE: the temp dir's file system refuses user xattrs: checking the .meta fallback");
            }
            assert_eq!(c.core.paths(&one.key).1.exists(), !xattrs, "one-block file");
            assert!(
                c.core.paths(&two.key).1.exists(),
                "a file of two blocks has a .meta"
            );
            (xattrs, c.core.paths(&bad.key).0)
        };
        // A garbled inline meta: the entry is discarded when a cache
        // without an index (an older locafs's) is read.
        if xattrs {
            let f = File::open(&bad_data).unwrap();
            crate::sys::fsetxattr(&f, META_XATTR, &[7u8; INLINE_LEN]).unwrap();
        }
        fs::remove_dir_all(recover::index_dir(d.path())).unwrap();
        let c = open(d.path(), 1 << 20);
        assert_eq!(c.get(&one, 0).unwrap().data(), block(&one, 0).data());
        assert!(c.is_complete(&one) && c.is_complete(&two));
        if xattrs {
            assert!(c.get(&bad, 0).is_none());
            assert!(!bad_data.exists(), "the garbled entry's data file stayed");
        }
        // A corrupt block of a one-block file: dropped, its meta with it, so
        // that the next start-up discards the data file.
        let data = c.core.paths(&one.key).0;
        drop(c);
        let f = OpenOptions::new().write(true).open(&data).unwrap();
        f.write_all_at(b"rot", 100).unwrap();
        let c = open(d.path(), 1 << 20);
        assert!(c.get(&one, 0).is_none());
        assert_eq!(c.core.stats.corrupt_blocks.load(Ordering::Relaxed), 1);
        drop(c);
        let c = open(d.path(), 1 << 20);
        assert!(!c.core.state.lock().books.contains(&one.key));
        c.sweep_orphans();
        assert!(!data.exists(), "a data file without meta is discarded");
        // Written again, it is whole again.
        assert!(c.put(&one, 0, &block(&one, 0)));
        assert!(c.is_complete(&one));
    }

    /// A clean shutdown leaves a mark in the index directory that spares
    /// the next start-up its sweep of the block directories; that start-up
    /// takes the mark away, so a crash after it is followed by a sweep.
    #[test]
    fn only_a_start_after_a_crash_sweeps_for_orphans() {
        let d = tempfile::tempdir().unwrap();
        let mark = recover::index_dir(d.path()).join("clean");
        let a = file("a", 2);
        let c = open(d.path(), 1 << 20);
        assert!(c.put(&a, 0, &block(&a, 0)));
        drop(c);
        assert!(mark.exists(), "a clean shutdown is marked");
        // A file no entry owns (as a crash between a block's data and its
        // record leaves one).
        let stray = d.path().join("blocks").join("00").join("stray.data");
        fs::create_dir_all(stray.parent().unwrap()).unwrap();
        fs::write(&stray, b"x").unwrap();
        let c = open(d.path(), 1 << 20);
        assert!(!mark.exists(), "start-up takes the mark away");
        assert!(
            c.core.sweeper.lock().is_none(),
            "a sweep after a clean shutdown"
        );
        assert_eq!(c.get(&a, 0).unwrap().data(), block(&a, 0).data());
        c.crash();
        assert!(!mark.exists(), "a crash leaves no mark");
        let c = open(d.path(), 1 << 20);
        let sweep = c
            .core
            .sweeper
            .lock()
            .take()
            .expect("no sweep after a crash");
        sweep.join().unwrap();
        assert!(!stray.exists(), "the sweep after a crash missed an orphan");
        assert_eq!(c.get(&a, 0).unwrap().data(), block(&a, 0).data());
        // Its sweep went through every directory: the next start-up is
        // spared again.
        drop(c);
        assert!(mark.exists());
        // A sweep cut short by the shutdown leaves no mark.
        let c = open(d.path(), 1 << 20);
        c.core.orphans_possible.store(true, Ordering::Relaxed);
        drop(c);
        assert!(!mark.exists(), "marked clean with a sweep unfinished");
    }

    /// The books keep no checksum of a one-block file: after a remount
    /// (from the index) its block is checked against its own meta on disk,
    /// which must be there, be this version's and match the bytes.
    #[test]
    fn a_one_block_file_is_checked_against_its_own_meta_after_a_remount() {
        one_block_meta_checked(false);
        // The same with `.meta` files (a cache file system without user
        // xattrs).
        one_block_meta_checked(true);
    }

    fn one_block_meta_checked(meta_files: bool) {
        let d = tempfile::tempdir().unwrap();
        let [good, flipped, swapped, bare, other] =
            ["good", "flipped", "swapped", "bare", "other-file"].map(|n| file(n, 1));
        let xattrs = {
            let c = open(d.path(), 1 << 20);
            if meta_files {
                c.core.xattr.store(false, Ordering::Relaxed);
            }
            for f in [&good, &flipped, &swapped, &bare, &other] {
                assert!(c.put(f, 0, &block(f, 0)));
                assert_eq!(c.core.state.lock().books.get(&f.key).unwrap().sum(0), None);
            }
            c.core.xattr.load(Ordering::Relaxed)
        };
        let c = open(d.path(), 1 << 20);
        let data = |f: &FileVersion| c.core.paths(&f.key).0;
        let meta = |f: &FileVersion| c.core.paths(&f.key).1;
        let set = |f: &FileVersion, raw: &[u8]| {
            if xattrs {
                let h = File::open(data(f)).unwrap();
                crate::sys::fsetxattr(&h, META_XATTR, raw).unwrap();
            } else {
                fs::write(meta(f), raw).unwrap();
            }
        };
        let get = |f: &FileVersion| {
            if xattrs {
                crate::sys::getxattr(&data(f), META_XATTR).unwrap()
            } else {
                fs::read(meta(f)).unwrap()
            }
        };
        // The checksum in the meta flipped; another file's bytes and meta
        // under this one's name; the meta gone.
        let mut raw = get(&flipped);
        let at = if xattrs {
            20
        } else {
            raw.len() - SLOT as usize
        };
        raw[at] ^= 1;
        set(&flipped, &raw);
        fs::copy(data(&other), data(&swapped)).unwrap();
        set(&swapped, &get(&other));
        if xattrs {
            let h = File::open(data(&bare)).unwrap();
            crate::sys::fremovexattr(&h, META_XATTR).unwrap();
        } else {
            fs::remove_file(meta(&bare)).unwrap();
        }
        drop(c);
        let c = open(d.path(), 1 << 20);
        assert_eq!(c.get(&good, 0).unwrap().data(), block(&good, 0).data());
        for f in [&flipped, &swapped, &bare] {
            assert!(c.get(f, 0).is_none(), "{:?} served", f.rel);
            assert!(!c.is_block_cached(f, 0), "{:?} kept", f.rel);
        }
        assert_eq!(c.core.stats.corrupt_blocks.load(Ordering::Relaxed), 3);
        // Passthrough opens check the same way.
        assert!(c.open_complete(&other).is_some());
        // Cached again, each is served.
        for f in [&flipped, &swapped, &bare] {
            assert!(c.put(f, 0, &block(f, 0)));
            assert_eq!(c.get(f, 0).unwrap().data(), block(f, 0).data());
        }
    }

    #[test]
    fn passthrough_opens_count_as_reads_of_the_whole_file() {
        // The kernel reads a passthrough file without us; the policy's
        // clock ("passes over the data set") must still move.
        let d = tempfile::tempdir().unwrap();
        let c = open(d.path(), 1 << 20);
        let f = file("pt", 3);
        for i in 0..3 {
            assert!(c.put(&f, i, &block(&f, i)));
        }
        let clock = || c.core.state.lock().books.clock();
        let before = clock();
        assert!(c.open_complete(&f).is_some());
        assert_eq!(clock(), before + 3 * BS);
        assert!(c.pin_complete(&f));
        assert_eq!(clock(), before + 6 * BS);
        c.unpin(&f);
        c.unpin(&f);
    }

    /// Passthrough pins are counted in 16 bits: past the cap, opens of the
    /// file are served through the daemon (no pin taken), and the pins
    /// taken keep the file from eviction until each is given back.
    #[test]
    fn passthrough_pins_stop_at_the_cap_and_hold_the_file() {
        let d = tempfile::tempdir().unwrap();
        let c = open(d.path(), 1 << 20);
        let f = file("capped", 1);
        assert!(c.put(&f, 0, &block(&f, 0)));
        assert!(c.open_complete(&f).is_some());
        for _ in 1..MAX_PASSTHROUGH_PINS {
            assert!(c.pin_complete(&f));
        }
        assert!(!c.pin_complete(&f), "a pin beyond the cap");
        assert!(c.open_complete(&f).is_none(), "an open beyond the cap");
        let pins = || {
            let st = c.core.state.lock();
            st.books.get(&f.key).map(|_| st.books.held(&f.key))
        };
        assert_eq!(pins(), Some(MAX_PASSTHROUGH_PINS));
        // Pinned: not evicted to make room for a stream of other files.
        let mut st = c.core.state.lock();
        st.books.set_capacity(0);
        let v = st.books.shrink_to_capacity();
        assert!(v.iter().all(|e| e.key != f.key));
        st.books.set_capacity(1 << 20);
        drop(st);
        c.unpin(&f);
        assert!(c.pin_complete(&f), "room for one pin again");
        for _ in 0..MAX_PASSTHROUGH_PINS {
            c.unpin(&f);
        }
        assert_eq!(pins(), Some(0));
        let mut st = c.core.state.lock();
        st.books.set_capacity(0);
        let v = st.books.shrink_to_capacity();
        assert!(v.iter().any(|e| e.key == f.key), "unpinned, it may go");
    }

    #[test]
    fn a_complete_file_is_exactly_its_size_whatever_the_write_path() {
        // Odd sizes: the last block does not end on the direct-I/O alignment,
        // so a direct write sends its tail through the page cache. Blocks
        // fetched ahead (put_ahead) go through the page cache whole; a file
        // can mix both.
        for (direct, ahead, aligned) in [
            (true, [false; 3], false),
            (true, [false; 3], true),
            (false, [false; 3], false),
            (true, [true; 3], false),
            (true, [true, false, true], true),
        ] {
            for size in [2 * BS + 1234, 100, 3 * BS - 4096] {
                let tmp = tempfile::tempdir().unwrap();
                let c = open(tmp.path(), 64 << 20);
                if !direct {
                    c.core.direct.store(false, Ordering::Relaxed);
                }
                let f = FileVersion::new(
                    Arc::from(Path::new("odd")),
                    SourceVersion {
                        size,
                        mtime_ns: 1,
                        ino: 9,
                    },
                );
                let data: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
                let what =
                    format!("size {size}, direct {direct}, ahead {ahead:?}, aligned {aligned}");
                // The last block first: the file must end at its size.
                for i in [2u64, 0, 1].into_iter().filter(|i| i * BS < size) {
                    let s = (i * BS) as usize;
                    let e = ((i + 1) * BS).min(size) as usize;
                    let bytes = if aligned {
                        // As a direct read from the source leaves them.
                        let mut v = vec![0u8; e - s + DIRECT_ALIGN];
                        let at = v.as_ptr().align_offset(DIRECT_ALIGN);
                        v[at..at + e - s].copy_from_slice(&data[s..e]);
                        Bytes::from(v).slice(at..at + e - s)
                    } else {
                        // Off the alignment, so that the bounce buffer is used.
                        let mut v = vec![0u8; e - s + 1];
                        v[1..].copy_from_slice(&data[s..e]);
                        Bytes::from(v).slice(1..)
                    };
                    let b = ChecksummedBytes::from_source(bytes);
                    let stored = if ahead[i as usize] {
                        c.put_ahead(&f, i, &b, false)
                    } else {
                        c.put(&f, i, &b)
                    };
                    assert!(stored, "block {i} ({what})");
                }
                let h = c.open_complete(&f).expect("complete file opens");
                assert_eq!(h.metadata().unwrap().len(), size, "{what}");
                let mut back = vec![0u8; size as usize];
                h.read_exact_at(&mut back, 0).unwrap();
                assert!(back == data, "bytes differ ({what})");
                c.unpin(&f);
            }
        }
    }

    /// Records the keys the dropped-file hook is told.
    fn watch_drops(c: &DiskCache) -> Arc<Mutex<Vec<VersionKey>>> {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = Arc::clone(&seen);
        c.on_file_dropped(Box::new(move |k| s2.lock().push(*k)));
        seen
    }

    fn read_whole(f: &File) -> Vec<u8> {
        let mut b = vec![0u8; f.metadata().unwrap().len() as usize];
        f.read_exact_at(&mut b, 0).unwrap();
        b
    }

    const EMFILE_CHILD: &str = "LOCAFS_TEST_EMFILE_CHILD";

    #[test]
    fn running_out_of_descriptors_is_a_miss_that_keeps_the_entry() {
        // The descriptor limit is lowered in a child process (this test
        // binary run again for this one test), not in this one, whose other
        // tests run in parallel.
        if std::env::var_os(EMFILE_CHILD).is_some() {
            return emfile_child();
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "cache::disk::tests::running_out_of_descriptors_is_a_miss_that_keeps_the_entry",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(EMFILE_CHILD, "1")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "the child failed:\n{text}");
        assert!(text.contains("1 passed"), "the child ran no test:\n{text}");
    }

    fn emfile_child() {
        let d = tempfile::tempdir().unwrap();
        let c = open(d.path(), 1 << 20);
        let drops = watch_drops(&c);
        let f = file("in-use", 3);
        for i in 0..3 {
            assert!(c.put(&f, i, &block(&f, i)));
        }
        // Open in passthrough: the kernel reads this file without us.
        let pt = c.open_complete(&f).expect("complete and verified");
        let seen = read_whole(&pt);
        let used = c.usage().used_bytes;
        {
            use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
            let r = getrlimit(Resource::Nofile);
            let low = Rlimit {
                current: Some(64),
                maximum: r.maximum,
            };
            setrlimit(Resource::Nofile, low).unwrap();
        }
        let mut fill = Vec::new();
        let e = loop {
            match File::open("/dev/null") {
                Ok(f) => fill.push(f),
                Err(e) => break e,
            }
        };
        assert_eq!(e.raw_os_error(), Some(libc::EMFILE));
        assert!(c.get(&f, 1).is_none(), "read without a descriptor");
        drop(fill);
        // Nothing was lost: still cached, still booked, still pinned.
        assert!(c.is_block_cached(&f, 1), "the entry was forgotten");
        assert_eq!(c.usage().used_bytes, used);
        assert!(drops.lock().is_empty());
        assert!(c.core.paths(&f.key).1.exists());
        // Caching it again does not recreate (truncate) the file in use.
        assert!(c.put(&f, 1, &block(&f, 1)));
        assert_eq!(c.get(&f, 1).unwrap().data(), block(&f, 1).data());
        assert!(read_whole(&pt) == seen, "the file in use was modified");
        c.unpin(&f);
    }

    #[test]
    fn a_data_file_gone_drops_its_entry_properly() {
        let d = tempfile::tempdir().unwrap();
        let c = open(d.path(), 1 << 20);
        let drops = watch_drops(&c);
        let base = c.usage().used_bytes;
        let f = file("gone", 3);
        for i in 0..3 {
            assert!(c.put(&f, i, &block(&f, i)));
        }
        let (data, meta) = c.core.paths(&f.key);
        fs::remove_file(&data).unwrap();
        assert!(c.get(&f, 0).is_none());
        assert!(!c.is_block_cached(&f, 2));
        assert!(!meta.exists(), "its meta file was left behind");
        assert_eq!(c.usage().used_bytes, base, "its space is still booked");
        assert_eq!(*drops.lock(), vec![f.key], "the FUSE layer was not told");
        // Cached again from scratch.
        for i in 0..3 {
            assert!(c.put(&f, i, &block(&f, i)));
        }
        assert_eq!(c.get(&f, 2).unwrap().data(), block(&f, 2).data());
    }

    #[test]
    fn a_bad_block_of_a_file_in_use_by_passthrough_drops_the_file_whole() {
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir().unwrap();
        let c = open(d.path(), 1 << 20);
        let drops = watch_drops(&c);
        let base = c.usage().used_bytes;
        let f = file("pinned", 3);
        for i in 0..3 {
            assert!(c.put(&f, i, &block(&f, i)));
        }
        let pt = c.open_complete(&f).expect("complete and verified");
        let (data, meta) = c.core.paths(&f.key);
        // Rot in block 1 of the file the passthrough reader holds.
        let w = OpenOptions::new().write(true).open(&data).unwrap();
        w.write_all_at(b"rot", BS + 10).unwrap();
        drop(w);
        let seen = read_whole(&pt);
        assert!(c.get(&f, 1).is_none(), "a corrupt block served");
        assert_eq!(c.core.stats.corrupt_blocks.load(Ordering::Relaxed), 1);
        assert!(
            read_whole(&pt) == seen,
            "the file in use was modified in place (a hole punched)"
        );
        assert!(!data.exists() && !meta.exists(), "not dropped whole");
        assert_eq!(*drops.lock(), vec![f.key]);
        assert_eq!(c.usage().used_bytes, base);
        // Cached again: a new file; the reader's inode is left alone.
        for i in 0..3 {
            assert!(c.put(&f, i, &block(&f, i)));
        }
        assert_ne!(
            fs::metadata(&data).unwrap().ino(),
            pt.metadata().unwrap().ino()
        );
        assert!(read_whole(&pt) == seen);
        assert_eq!(c.get(&f, 1).unwrap().data(), block(&f, 1).data());
        c.unpin(&f);
    }

    #[test]
    fn open_complete_verifies_one_block_inline_and_larger_files_in_the_background() {
        let d = tempfile::tempdir().unwrap();
        let one = file("one", 1);
        let big = file("big", 4);
        let bad = file("bad", 4);
        {
            let c = open(d.path(), 1 << 20);
            assert!(c.put(&one, 0, &block(&one, 0)));
            for i in 0..4 {
                assert!(c.put(&big, i, &block(&big, i)));
                assert!(c.put(&bad, i, &block(&bad, i)));
            }
            let w = OpenOptions::new()
                .write(true)
                .open(c.core.paths(&bad.key).0)
                .unwrap();
            w.write_all_at(b"rot", 2 * BS + 1).unwrap();
        }
        // Remounted: nothing verified yet.
        let c = open(d.path(), 1 << 20);
        let h = c
            .open_complete(&one)
            .expect("one block is verified at once");
        drop(h);
        c.unpin(&one);
        assert!(
            c.open_complete(&big).is_none(),
            "four blocks verified on the caller's (a FUSE) thread"
        );
        assert!(c.open_complete(&bad).is_none());
        let deadline = Instant::now() + Duration::from_secs(30);
        let h = loop {
            if let Some(h) = c.open_complete(&big) {
                break h;
            }
            assert!(
                Instant::now() < deadline,
                "never verified in the background"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(
            read_whole(&h)
                == (0..4)
                    .flat_map(|i| block(&big, i).data().to_vec())
                    .collect::<Vec<u8>>()
        );
        c.unpin(&big);
        while c.is_complete(&bad) {
            assert!(Instant::now() < deadline, "the corrupt block was not found");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(c.core.stats.corrupt_blocks.load(Ordering::Relaxed), 1);
        assert!(c.get(&bad, 2).is_none());
        assert!(c.get(&bad, 3).is_some());
    }

    #[test]
    fn a_dropped_block_written_again_at_once_is_never_a_hole() {
        // A corrupt block is dropped (its hole punched outside the lock)
        // while the read that found it fetches it again and writes it: the
        // punch must never land on the new bytes, which passthrough trusts
        // without reading them back. The write is made to come at the worst
        // moment: from the dropped-file hook, which the drop calls after it
        // has let go of the books and before it punches. The drop then waits
        // (50 ms) for the write to finish: a write that does not wait for
        // the punch has finished by then and is punched out; one that waits
        // goes in after the punch. Each round: the write goes in (it is not
        // refused), and the complete file holds the new bytes, read from
        // the data file as the kernel would read it.
        use std::sync::atomic::AtomicBool;
        #[derive(Default)]
        struct Window {
            armed: parking_lot::Mutex<Option<(VersionKey, std::sync::mpsc::Sender<()>)>>,
            finished: AtomicBool,
        }
        let d = tempfile::tempdir().unwrap();
        let c = open(d.path(), 64 << 20);
        let window = Arc::new(Window::default());
        let w = Arc::clone(&window);
        c.on_file_dropped(Box::new(move |key| {
            let armed = w.armed.lock().take_if(|(k, _)| k == key);
            if let Some((_, write_now)) = armed {
                write_now.send(()).unwrap();
                let t = Instant::now();
                while !w.finished.load(Ordering::SeqCst) && t.elapsed() < Duration::from_millis(50)
                {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }));
        for round in 0..20 {
            let f = file(&format!("hole{round}"), 2);
            assert!(c.put(&f, 0, &block(&f, 0)) && c.put(&f, 1, &block(&f, 1)));
            let w = OpenOptions::new()
                .write(true)
                .open(c.core.paths(&f.key).0)
                .unwrap();
            w.write_all_at(b"rot", 10).unwrap();
            let (write_now, when) = std::sync::mpsc::channel();
            window.finished.store(false, Ordering::SeqCst);
            *window.armed.lock() = Some((f.key, write_now));
            let written = std::thread::scope(|s| {
                let (c, f, window) = (&c, &f, &window);
                let writer = s.spawn(move || {
                    when.recv_timeout(Duration::from_secs(10))
                        .unwrap_or_else(|_| panic!("round {round}: the drop never told its hook"));
                    let written = c.put(f, 0, &block(f, 0));
                    window.finished.store(true, Ordering::SeqCst);
                    written
                });
                assert!(c.get(f, 0).is_none(), "a rotten block served");
                writer.join().unwrap()
            });
            assert!(
                written,
                "round {round}: the write after the drop was refused"
            );
            let h = c
                .open_complete(&f)
                .unwrap_or_else(|| panic!("round {round}: not complete after the write"));
            let back = read_whole(&h);
            assert!(
                back[..BS as usize] == block(&f, 0).data()[..],
                "round {round}: a complete file with a hole (or old bytes) in block 0"
            );
            c.unpin(&f);
        }
    }

    #[test]
    fn a_late_report_of_a_block_written_again_since_keeps_the_new_bytes() {
        // Two reads find the same rotten block; the first drops it and the
        // refetch writes it again before the second reports it.
        let d = tempfile::tempdir().unwrap();
        let c = open(d.path(), 1 << 20);
        let f = file("late", 2);
        assert!(c.put(&f, 0, &block(&f, 0)) && c.put(&f, 1, &block(&f, 1)));
        let w = OpenOptions::new()
            .write(true)
            .open(c.core.paths(&f.key).0)
            .unwrap();
        w.write_all_at(b"rot", 10).unwrap();
        assert!(c.get(&f, 0).is_none(), "a rotten block served");
        assert!(c.put(&f, 0, &block(&f, 0)));
        c.core.drop_block(&f, 0, true);
        assert_eq!(c.get(&f, 0).unwrap().data(), block(&f, 0).data());
        assert!(c.is_complete(&f));
        assert_eq!(c.core.stats.corrupt_blocks.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_cache_dir_that_refuses_direct_io_at_open_still_caches() {
        // ramfs creates the file, then refuses O_DIRECT: new data files are
        // created with O_EXCL, and the buffered retry finds it in the way
        // (it is unlinked and created again).
        let d = tempfile::tempdir().unwrap();
        let flags = rustix::mount::MountFlags::empty();
        if let Err(e) = rustix::mount::mount("ramfs", d.path(), "ramfs", flags, None) {
            skipped(module_path!(), &format!("cannot mount a ramfs ({e})"));
            return;
        }
        let result = std::panic::catch_unwind(|| {
            let cache = open(d.path(), 1 << 20);
            let f = file("ramfs", 1);
            assert!(cache.put(&f, 0, &block(&f, 0)), "not cached");
            assert!(!cache.core.direct.load(Ordering::Relaxed));
            assert_eq!(cache.get(&f, 0).unwrap().data(), block(&f, 0).data());
        });
        let _ = crate::sys::unmount(d.path());
        if let Err(e) = result {
            std::panic::resume_unwind(e);
        }
    }

    /// `hex` with spaces and newlines for reading, as bytes.
    fn unhex(hex: &str) -> Vec<u8> {
        let digits: Vec<u8> = hex.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
        digits
            .chunks(2)
            .map(|d| u8::from_str_radix(std::str::from_utf8(d).unwrap(), 16).unwrap())
            .collect()
    }

    /// Today's bytes on disk, pinned: a `.meta` file (header and slots, own
    /// and guest) and a one-block file's meta xattr, as written by `put` and
    /// read back by recovery. A cache written by this version must load in
    /// the next one (or the format gets a new number).
    #[test]
    fn the_meta_formats_are_pinned_byte_for_byte() {
        let d = tempfile::tempdir().unwrap();
        let c = open(d.path(), 1 << 20);
        let data = |len: usize, seed: u8| {
            ChecksummedBytes::from_source(Bytes::from(
                (0..len)
                    .map(|i| (i as u8).wrapping_mul(seed))
                    .collect::<Vec<u8>>(),
            ))
        };
        // Three blocks, the last of 100 bytes: block 0 own, block 2 a guest.
        let f = FileVersion::new(
            Arc::from(Path::new("d/x")),
            SourceVersion {
                size: 2 * BS + 100,
                mtime_ns: -7,
                ino: 0x0102_0304,
            },
        );
        assert!(c.put(&f, 0, &data(BS as usize, 3)));
        assert!(c.put_guest(&f, 2, &data(100, 5)));
        let meta = fs::read(c.core.paths(&f.key).1).unwrap();
        // Little-endian throughout: magic, format 3, block size, size,
        // mtime (ns), inode, version key, path length, path, zeros up to the
        // 64-byte aligned slot table; a slot is checksum (xxh3-128), length
        // and presence marker ("SERP" own, "SEUG" guest), an empty one zeros.
        let want = unhex(&format!(
            "4c4f434146534d31 03000000 00100000 6420000000000000 f9ffffffffffffff 0403020100000000
             {key} 03000000 642f78 00
             {own} 00100000 53455250
             {empty}
             {guest} 64000000 53455547",
            // (Its first 4 bytes: blake3 of "d/x", the path part.)
            key = "7f8e99fa7c7dcfa335e973a4b48a0a3e",
            own = "284b5362b443f9038da94e46cab50e4d",
            empty = "00".repeat(24),
            guest = "7c2771745a6799c6a3bc6b37bf85b584",
        ));
        assert_eq!(
            meta,
            want,
            "{}",
            meta.iter().map(|b| format!("{b:02x}")).collect::<String>()
        );
        let (key, e) = c
            .core
            .parse_meta(&want)
            .unwrap()
            .expect("the pinned bytes load");
        assert_eq!(key, f.key);
        assert_eq!(header_key(&want), Some(f.key));
        assert_eq!(header_key(&want[..HEADER_FIXED - 1]), None);
        assert_eq!(e.size(), f.version.size);
        assert_eq!(e.present(), 2);
        assert_eq!(
            e.blocks.iter().map(|b| b.guest).collect::<Vec<_>>(),
            vec![false, false, true]
        );
        assert_eq!(
            e.blocks.iter().map(|b| b.slot).collect::<Vec<_>>(),
            vec![Slot::Present, Slot::Empty, Slot::Present]
        );
        assert_eq!(e.sum(0), Some(*data(BS as usize, 3).checksum()));
        assert_eq!(e.sum(1), None);
        assert_eq!(e.sum(2), Some(*data(100, 5).checksum()));

        // One block: the meta is an xattr of the data file (where the file
        // system has user xattrs): magic, size, path hash, checksum, marker.
        let g = FileVersion::new(
            Arc::from(Path::new("y")),
            SourceVersion {
                size: 1000,
                mtime_ns: 1,
                ino: 2,
            },
        );
        assert!(c.put(&g, 0, &data(1000, 7)));
        let (gdata, gmeta) = c.core.paths(&g.key);
        if gmeta.exists() {
            skipped(
                module_path!(),
                &format!("the inline meta: no user xattrs under {:?}", d.path()),
            );
            return;
        }
        let raw = crate::sys::getxattr(&gdata, META_XATTR).unwrap();
        let want = unhex(
            "4c434933 e803000000000000 08112a9e334ce730 30c826442630ad106dd7dada9c22eeab 53455250",
        );
        assert_eq!(
            raw,
            want,
            "{}",
            raw.iter().map(|b| format!("{b:02x}")).collect::<String>()
        );
        let (key, e) = c
            .core
            .parse_inline(&gdata, &want)
            .expect("the pinned bytes load");
        assert_eq!(key, g.key);
        assert_eq!(
            (e.size(), key.path_part()),
            (1000, path_hash(Path::new("y")) as u32)
        );
        // An attribute of the old format (keys of the old derivation) is
        // not an entry; nor one whose path hash is not its key's.
        let mut old = want.clone();
        old[..4].copy_from_slice(b"LCI2");
        assert!(c.core.parse_inline(&gdata, &old).is_none());
        let mut other = want.clone();
        other[12] ^= 1;
        assert!(c.core.parse_inline(&gdata, &other).is_none());
        assert_eq!(
            e.blocks.iter().map(|b| b.slot).collect::<Vec<_>>(),
            vec![Slot::Present]
        );
        // (The books keep no checksum of a one-block file: it is read from
        // the attribute when the block is served.)
        assert_eq!(e.sum(0), None);
        assert_eq!(
            decode_inline(&want).map(|(_, _, sum, _)| sum),
            Some(*data(1000, 7).checksum())
        );
    }
}
