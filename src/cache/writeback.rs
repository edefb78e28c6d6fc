//! The write-back queue: fetched blocks on their way to the disk cache, off
//! the reply path. Room in it is counted in KiB and bounded twice: blocks
//! being written (`write_queue_bytes`), and the loader's blocks held in
//! memory while they wait for that room (`write_wait_bytes`). Where a block
//! goes is decided by [`admit`], the queue's whole admission policy, a pure
//! function: read-ahead brings room it waited for before fetching; a block
//! the loader read takes room if there is some, else waits for it in memory
//! if that bound allows, else is skipped: counted in `cache_writes_skipped`
//! and remembered (bounded, [`UNWRITTEN_MAX`]) for background prefetch to
//! write ([`WriteBack::take_unwritten`]). Read-ahead takes no room while a
//! loader's block waits ([`WriteBack::room_ahead`]): the loader's blocks go
//! first, and read-ahead runs at the pace the cache disk takes.
//!
//! It must never make a loader's read wait: [`WriteBack::submit`] returns at
//! once, the write runs on the blocking pool. It never drops a block it
//! took without saying so (skipped blocks are counted and remembered), and
//! its memory is bounded by its two bounds and [`UNWRITTEN_MAX`] entries.
//!
//! A block the disk cache itself refuses (no room in its share of a shared
//! budget, writes turned off after disk errors) is remembered too, apart
//! ([`WriteBack::take_refused`]): background prefetch writes it again from
//! the memory tier after a backoff that doubles while the cache keeps
//! refusing ([`REFUSED_FIRST_RETRY`] up to [`REFUSED_LAST_RETRY`]), and
//! never fetches it from the source again for that. Without this, a block
//! read every epoch stays in the memory tier (its admission favours blocks
//! read often) and its file never becomes complete on disk.

use std::collections::HashSet;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::runtime::Handle;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::cache::{BlockStore, ChecksummedBytes, FileVersion, VersionKey};
use crate::obs::stats::Stats;

/// Room in the queue free now, in KiB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Free {
    /// For blocks being written.
    pub queue: u32,
    /// For the loader's blocks waiting in memory for `queue` room.
    pub wait: u32,
}

/// Where a fetched block goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Written now (it has room in the queue).
    Now,
    /// Held in memory until the queue has room, then written.
    Wait,
    /// Not written now: counted, and left for background prefetch.
    Skip,
}

/// The admission policy: where a block of `kib` KiB goes, given the room
/// `free` now. `ahead`: read-ahead fetched it and brought room it waited
/// for (read-ahead waits; a loader's read never does).
pub fn admit(kib: u32, ahead: bool, free: Free) -> Admit {
    if ahead || kib <= free.queue {
        Admit::Now
    } else if kib <= free.wait {
        Admit::Wait
    } else {
        Admit::Skip
    }
}

/// A block's size in the queue's unit.
pub fn kib(len: usize) -> u32 {
    (len as u64).div_ceil(1024).min(u32::MAX as u64) as u32
}

/// A fetched block on its way to the disk cache.
pub struct Write {
    pub file: Arc<FileVersion>,
    pub index: u64,
    pub block: ChecksummedBytes,
    /// Fetched from a peer (stored as a guest).
    pub guest: bool,
    /// Written again from memory: it was skipped or refused before.
    pub again: bool,
}

/// Room read-ahead took in the queue before fetching its block
/// ([`WriteBack::room_ahead`]); the block's write uses it.
pub struct AheadRoom(OwnedSemaphorePermit);

/// Room for one write: taken, or to wait for while the block is held in
/// memory (the hold on the wait bound).
enum Room {
    Now(OwnedSemaphorePermit),
    Wait(OwnedSemaphorePermit),
}

/// Blocks in the order they were turned away, and the same as a set.
type Unwritten = (Vec<(Arc<FileVersion>, u64)>, HashSet<(VersionKey, u64)>);

/// Adds a block to a list of blocks to write later, once, if it has room.
fn remember(u: &mut Unwritten, file: &Arc<FileVersion>, index: u64) {
    if u.0.len() < UNWRITTEN_MAX && u.1.insert((file.key, index)) {
        u.0.push((Arc::clone(file), index));
    }
}

/// Unwritten blocks remembered, at most (a block beyond that is cached by
/// the next epoch's read of it instead).
pub const UNWRITTEN_MAX: usize = 4096;

/// The first wait before blocks the disk cache refused are tried again.
pub const REFUSED_FIRST_RETRY: Duration = Duration::from_secs(2);
/// The longest wait between tries while the cache keeps refusing.
pub const REFUSED_LAST_RETRY: Duration = Duration::from_secs(300);

/// Blocks the disk cache refused, and when they may be tried again.
struct Refused {
    blocks: Unwritten,
    next_try: Instant,
    backoff: Duration,
}

/// The write-back queue of one mount.
pub struct WriteBack {
    cache: Arc<dyn BlockStore>,
    rt: Handle,
    stats: Arc<Stats>,
    /// Bounds the blocks waiting to be written to the disk cache (KiB).
    queue: Arc<Semaphore>,
    /// Bounds the loader's blocks held while they wait for `queue` (KiB);
    /// while any wait, read-ahead takes no room.
    wait: Arc<Semaphore>,
    wait_kib: u32,
    /// Blocks the loader read that were not written (skipped), for
    /// background prefetch; at most [`UNWRITTEN_MAX`].
    unwritten: Mutex<Unwritten>,
    /// Blocks the disk cache refused, for a later try from memory; at most
    /// [`UNWRITTEN_MAX`].
    refused: Mutex<Refused>,
}

impl WriteBack {
    /// A queue of `queue_bytes` for writes and `wait_bytes` for the
    /// loader's blocks waiting for them (each at least one block).
    pub fn new(
        queue_bytes: u64,
        wait_bytes: u64,
        block_size: u64,
        cache: Arc<dyn BlockStore>,
        rt: Handle,
        stats: Arc<Stats>,
    ) -> Arc<Self> {
        let queue_kib = (queue_bytes.max(block_size) / 1024) as usize;
        let wait_kib = (wait_bytes.max(block_size) / 1024) as usize;
        Arc::new(WriteBack {
            cache,
            rt,
            stats,
            queue: Arc::new(Semaphore::new(queue_kib)),
            wait: Arc::new(Semaphore::new(wait_kib)),
            wait_kib: wait_kib as u32,
            unwritten: Mutex::new((Vec::new(), HashSet::new())),
            refused: Mutex::new(Refused {
                blocks: (Vec::new(), HashSet::new()),
                next_try: Instant::now(),
                backoff: REFUSED_FIRST_RETRY,
            }),
        })
    }

    /// The room free now.
    pub fn free(&self) -> Free {
        let n = |s: &Semaphore| s.available_permits().min(u32::MAX as usize) as u32;
        Free {
            queue: n(&self.queue),
            wait: n(&self.wait),
        }
    }

    /// Whether blocks the loader read are waiting for room in the queue.
    pub fn loader_writes_waiting(&self) -> bool {
        self.wait.available_permits() < self.wait_kib as usize
    }

    /// Room for a block of `kib` KiB that read-ahead is about to fetch:
    /// waits until no block the loader read is waiting (those go first),
    /// then for room in the queue. None if the queue is closed.
    pub async fn room_ahead(&self, kib: u32) -> Option<AheadRoom> {
        while self.loader_writes_waiting() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Arc::clone(&self.queue)
            .acquire_many_owned(kib)
            .await
            .ok()
            .map(AheadRoom)
    }

    /// Room for a loader's block of `kib` KiB, as [`admit`] decides; a
    /// decision that lost a race for the room it saw falls to the next.
    fn room_loader(&self, kib: u32) -> Option<Room> {
        let decided = admit(kib, false, self.free());
        if decided == Admit::Now {
            if let Ok(p) = Arc::clone(&self.queue).try_acquire_many_owned(kib) {
                return Some(Room::Now(p));
            }
        }
        if decided != Admit::Skip {
            if let Ok(hold) = Arc::clone(&self.wait).try_acquire_many_owned(kib) {
                return Some(Room::Wait(hold));
            }
        }
        None
    }

    /// Hands a fetched block to the queue, without waiting: written with
    /// `ahead`'s room if read-ahead brought some (the loader has not read
    /// it yet), else with room [`admit`] finds for it. `done` runs once the
    /// block is written, or at once if it is skipped (then it is counted
    /// and remembered for background prefetch). Returns whether it will be
    /// written.
    pub fn submit(
        self: &Arc<Self>,
        w: Write,
        ahead: Option<AheadRoom>,
        done: impl FnOnce() + Send + 'static,
    ) -> bool {
        let is_ahead = ahead.is_some();
        let room = match ahead {
            Some(AheadRoom(p)) => Some(Room::Now(p)),
            None => self.room_loader(kib(w.block.data().len())),
        };
        match room {
            Some(Room::Now(p)) => self.write_later(w, is_ahead, p, done),
            Some(Room::Wait(hold)) => {
                let me = Arc::clone(self);
                let kib = kib(w.block.data().len());
                self.rt.spawn(async move {
                    match Arc::clone(&me.queue).acquire_many_owned(kib).await {
                        Ok(p) => me.write_later(w, false, (p, hold), done),
                        Err(_) => done(),
                    }
                });
            }
            None => {
                done();
                self.stats.cache_writes_skipped.fetch_add(1, Relaxed);
                self.note_unwritten(&w.file, w.index);
                return false;
            }
        }
        true
    }

    /// A block that the loader read but that was not written to the disk
    /// cache, if any, the latest first: background prefetch writes it
    /// (from memory if it is still there, else from the source again), so
    /// that its file reaches passthrough without waiting for the next epoch.
    pub fn take_unwritten(&self) -> Option<(Arc<FileVersion>, u64)> {
        let mut u = self.unwritten.lock();
        let (f, i) = u.0.pop()?;
        u.1.remove(&(f.key, i));
        Some((f, i))
    }

    fn note_unwritten(&self, file: &Arc<FileVersion>, index: u64) {
        remember(&mut self.unwritten.lock(), file, index);
    }

    /// A block the disk cache refused, the latest first, once the backoff
    /// since the last refusal has passed: to be written again from memory
    /// (if it is no longer there, the next read of it caches it).
    pub fn take_refused(&self) -> Option<(Arc<FileVersion>, u64)> {
        let mut r = self.refused.lock();
        if Instant::now() < r.next_try {
            return None;
        }
        let (f, i) = r.blocks.0.pop()?;
        r.blocks.1.remove(&(f.key, i));
        Some((f, i))
    }

    /// The disk cache refused a block: remembered, and the next try put off
    /// by the backoff, which doubles with each refusal after a wait.
    fn note_refused(&self, file: &Arc<FileVersion>, index: u64) {
        let mut r = self.refused.lock();
        remember(&mut r.blocks, file, index);
        let now = Instant::now();
        if now >= r.next_try {
            r.next_try = now + r.backoff;
            r.backoff = (r.backoff * 2).min(REFUSED_LAST_RETRY);
        }
    }

    /// A block tried again was taken: the cache has room again.
    fn note_taken_again(&self) {
        self.refused.lock().backoff = REFUSED_FIRST_RETRY;
    }

    /// Writes a block to the disk cache on a blocking thread, then releases
    /// `room` and runs `done`.
    fn write_later(
        self: &Arc<Self>,
        w: Write,
        ahead: bool,
        room: impl Send + 'static,
        done: impl FnOnce() + Send + 'static,
    ) {
        let me = Arc::clone(self);
        self.rt.spawn_blocking(move || {
            let cache = &me.cache;
            let stored = if ahead {
                cache.put_ahead(&w.file, w.index, &w.block, w.guest)
            } else if w.guest {
                cache.put_guest(&w.file, w.index, &w.block)
            } else {
                cache.put(&w.file, w.index, &w.block)
            };
            // A guest block refused is the policy at work (guests live in
            // spare room only): not tried again.
            if !stored && !w.guest {
                me.stats.cache_writes_refused.fetch_add(1, Relaxed);
                me.note_refused(&w.file, w.index);
            } else if stored && w.again {
                me.note_taken_again();
            }
            drop(room);
            done();
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{GatedCache, MemCache};

    #[test]
    fn admission_read_ahead_brings_its_room_the_loader_takes_waits_or_skips() {
        let free = |queue, wait| Free { queue, wait };
        // Read-ahead waited for its room before fetching: always written.
        assert_eq!(admit(1024, true, free(0, 0)), Admit::Now);
        // A loader's block: room in the queue first, then in memory.
        assert_eq!(admit(1024, false, free(1024, 0)), Admit::Now);
        assert_eq!(admit(1024, false, free(1023, 1024)), Admit::Wait);
        assert_eq!(admit(1024, false, free(1023, 1023)), Admit::Skip);
        assert_eq!(admit(0, false, free(0, 0)), Admit::Now);
        assert_eq!(admit(4, false, free(3, 4096)), Admit::Wait);
        assert_eq!(kib(0), 0);
        assert_eq!(kib(1), 1);
        assert_eq!(kib(1024), 1);
        assert_eq!(kib(1025), 2);
    }

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
    fn submit_writes_holds_or_skips_and_read_ahead_waits_for_the_loader() {
        const BS: u64 = 4096;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let cache = Arc::new(GatedCache::new(MemCache::new(BS)));
        let stats = Arc::new(Stats::default());
        // Room for one block's write, and for two more to wait.
        let wb = WriteBack::new(
            BS,
            2 * BS,
            BS,
            cache.clone(),
            rt.handle().clone(),
            Arc::clone(&stats),
        );
        let file = Arc::new(FileVersion::new(
            Arc::from(std::path::Path::new("f")),
            crate::source::SourceVersion {
                size: 8 * BS,
                mtime_ns: 1,
                ino: 1,
            },
        ));
        let block = ChecksummedBytes::from_source(bytes::Bytes::from(vec![1u8; BS as usize]));
        let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let submit = |index, guest| {
            let d = Arc::clone(&done);
            let w = Write {
                file: Arc::clone(&file),
                index,
                block: block.clone(),
                guest,
                again: false,
            };
            wb.submit(w, None, move || {
                d.fetch_add(1, Relaxed);
            })
        };
        // Block 0 takes the queue, 1 and 2 wait in memory, 3 and 4 are
        // skipped: submit never waits for the gated writes.
        assert!(submit(0, false));
        assert!(!wb.loader_writes_waiting());
        assert!(submit(1, true));
        assert!(submit(2, false));
        assert!(wb.loader_writes_waiting());
        assert_eq!(wb.free(), Free { queue: 0, wait: 0 });
        assert!(!submit(3, false));
        assert!(!submit(4, false));
        assert_eq!(stats.cache_writes_skipped.load(Relaxed), 2);
        assert_eq!(done.load(Relaxed), 2, "a skipped block is done at once");
        // Read-ahead takes no room while the loader's blocks wait.
        let wb2 = Arc::clone(&wb);
        let ahead = rt.spawn(async move { wb2.room_ahead(4).await.is_some() });
        std::thread::sleep(Duration::from_millis(50));
        assert!(!ahead.is_finished());
        cache.open_gate();
        assert!(wait_for(|| done.load(Relaxed) == 5));
        assert!(rt.block_on(ahead).unwrap());
        let mut puts = cache.inner.puts();
        puts.sort();
        assert_eq!(puts, vec![(0, "put"), (1, "guest"), (2, "put")]);
        // The skipped blocks, the latest first, each once.
        let left: Vec<u64> = std::iter::from_fn(|| wb.take_unwritten())
            .map(|(_, i)| i)
            .collect();
        assert_eq!(left, vec![4, 3]);
        // A read-ahead block is written with the room it brought.
        let room = rt.block_on(wb.room_ahead(4)).unwrap();
        let d = Arc::clone(&done);
        let w = Write {
            file: Arc::clone(&file),
            index: 5,
            block: block.clone(),
            guest: false,
            again: false,
        };
        assert!(wb.submit(w, Some(room), move || {
            d.fetch_add(1, Relaxed);
        }));
        assert!(wait_for(|| done.load(Relaxed) == 6));
        assert!(cache.inner.puts().contains(&(5, "ahead")));
        assert!(wait_for(|| wb.free() == Free { queue: 4, wait: 8 }));
    }

    #[test]
    fn blocks_the_cache_refused_come_back_after_a_backoff_that_grows() {
        const BS: u64 = 4096;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let cache = Arc::new(GatedCache::new(MemCache::new(BS)));
        cache.open_gate();
        cache.inner.refuse_puts.store(true, Relaxed);
        let stats = Arc::new(Stats::default());
        let wb = WriteBack::new(
            8 * BS,
            8 * BS,
            BS,
            cache.clone(),
            rt.handle().clone(),
            Arc::clone(&stats),
        );
        let file = Arc::new(FileVersion::new(
            Arc::from(std::path::Path::new("f")),
            crate::source::SourceVersion {
                size: 8 * BS,
                mtime_ns: 1,
                ino: 1,
            },
        ));
        let block = ChecksummedBytes::from_source(bytes::Bytes::from(vec![1u8; BS as usize]));
        let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let submit = |index, guest, again| {
            let d = Arc::clone(&done);
            let w = Write {
                file: Arc::clone(&file),
                index,
                block: block.clone(),
                guest,
                again,
            };
            wb.submit(w, None, move || {
                d.fetch_add(1, Relaxed);
            })
        };
        // Two of this node's blocks and a guest block, all refused.
        // One at a time: written concurrently, they could be refused in
        // either order, and the order taken back is what is checked.
        assert!(submit(0, false, false));
        assert!(wait_for(|| done.load(Relaxed) == 1));
        assert!(submit(1, false, false));
        assert!(wait_for(|| done.load(Relaxed) == 2));
        assert!(submit(2, true, false));
        assert!(wait_for(|| done.load(Relaxed) == 3));
        // Not before the first backoff; then this node's blocks, the latest
        // first, each once (a guest refused is the policy at work).
        let t0 = Instant::now();
        assert!(wb.take_refused().is_none());
        assert!(wait_for(|| t0.elapsed() >= REFUSED_FIRST_RETRY));
        let left: Vec<u64> = std::iter::from_fn(|| wb.take_refused())
            .map(|(_, i)| i)
            .collect();
        assert_eq!(left, vec![1, 0]);
        // Refused again: the wait doubled.
        assert!(submit(0, false, true));
        assert!(wait_for(|| done.load(Relaxed) == 4));
        let t1 = Instant::now();
        assert!(wait_for(|| t1.elapsed() >= REFUSED_FIRST_RETRY));
        assert!(wb.take_refused().is_none(), "the backoff did not grow");
        assert!(wait_for(|| t1.elapsed() >= 2 * REFUSED_FIRST_RETRY));
        assert_eq!(wb.take_refused().map(|(_, i)| i), Some(0));
        // Taken this time: nothing left, and the backoff is back to its first
        // wait for the next refusal.
        cache.inner.refuse_puts.store(false, Relaxed);
        assert!(submit(0, false, true));
        assert!(wait_for(|| done.load(Relaxed) == 5));
        assert_eq!(cache.inner.puts(), vec![(0, "put")]);
        assert!(wb.take_refused().is_none());
        assert_eq!(wb.refused.lock().backoff, REFUSED_FIRST_RETRY);
        assert_eq!(stats.cache_writes_skipped.load(Relaxed), 0);
        assert_eq!(stats.cache_writes_refused.load(Relaxed), 3);
    }
}
