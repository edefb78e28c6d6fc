//! The open file handles and the passthrough backing ids as the shared
//! state (`shm`) keeps them, so that a server started after one dies
//! answers for every handle the kernel holds: its inode, the version it
//! opened, its mode, and the backing id its inode reads through in
//! passthrough (registered on the connection, which outlives the server:
//! the new one must close it at the last RELEASE, and give later opens of
//! the inode that same backing, since the kernel refuses a second one).
//!
//! Two tables of fixed-size records with free slots: a handle is recorded
//! before the OPEN's reply hands its number to the kernel (its `fh`
//! written last: that publishes it), and forgotten at RELEASE; a backing
//! id is recorded as soon as the kernel gave it, and forgotten when it is
//! closed. It keeps also the OPEN's request id (`unique`), so that an OPEN
//! the kernel sends again after a server died between recording and
//! replying gets the handle already made for it, not a second one.
//!
//! Bookkeeping in shared memory only: no I/O, no FUSE types, no policy.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::source::SourceVersion;
use crate::sys::shm::{Pod, Region, SharedState, ShmVec};

/// `HandleRec::flags`: the handle reads through a passthrough backing.
const PASSTHROUGH: u32 = 1;
/// `HandleRec::flags`: the OPEN was answered with FOPEN_KEEP_CACHE.
const KEEP_CACHE: u32 = 2;

/// One open handle (64 bytes; `fh` 0: a free slot).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
struct HandleRec {
    fh: u64,
    ino: u64,
    size: u64,
    mtime_ns: i64,
    src_ino: u64,
    /// The OPEN's request id, without the resend bit.
    unique: u64,
    backing: u32,
    flags: u32,
    _pad: u64,
}

// SAFETY: repr(C), integers only, no padding.
unsafe impl Pod for HandleRec {}

/// One backing id registered on the connection (16 bytes; `live` 0: a
/// free slot).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
struct BackingRec {
    id: u32,
    live: u32,
    ino: u64,
}

// SAFETY: repr(C), integers only, no padding.
unsafe impl Pod for BackingRec {}

/// A handle as an earlier server recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavedHandle {
    pub fh: u64,
    pub ino: u64,
    pub version: SourceVersion,
    /// The backing id it reads through, if it is in passthrough.
    pub backing: Option<u32>,
    pub keep_cache: bool,
    pub unique: u64,
}

/// A backing id as an earlier server recorded it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SavedBacking {
    pub id: u32,
    pub ino: u64,
}

/// A table of records with free slots, and where each key is.
struct Slots<T: Pod> {
    recs: ShmVec<T>,
    free: Vec<usize>,
    at: HashMap<u64, usize>,
}

impl<T: Pod + Copy> Slots<T> {
    /// Writes `rec` (keyed `key`) into a free slot, or a new one: `publish`
    /// stores the field that makes a slot used, last.
    fn put(&mut self, key: u64, rec: T, publish: impl FnOnce(&mut T)) -> bool {
        let mut used = rec;
        publish(&mut used);
        match self.free.pop() {
            Some(i) => {
                let slot: *mut T = &mut self.recs[i];
                // Every field with the slot still free, then the whole
                // record again with the "used" field set: a server killed
                // in between leaves a free slot. (Volatile: the compiler
                // keeps both stores, in this order.)
                // SAFETY: `slot` points into the region, at a record of ours.
                unsafe {
                    std::ptr::write_volatile(slot, rec);
                    std::ptr::write_volatile(slot, used);
                }
                self.at.insert(key, i);
                true
            }
            None => {
                // (the push publishes it)
                if self.recs.push(used).is_err() {
                    return false;
                }
                self.at.insert(key, self.recs.len() - 1);
                true
            }
        }
    }
}

/// The handles and backing ids of one mount in the shared state.
pub struct HandleStore {
    handles: Mutex<Slots<HandleRec>>,
    backings: Mutex<Slots<BackingRec>>,
}

impl std::fmt::Debug for HandleStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandleStore").finish_non_exhaustive()
    }
}

/// The resend bit of a request id (`FUSE_UNIQUE_RESEND`): set in every
/// request the kernel sends again after `FUSE_NOTIFY_RESEND`.
pub const UNIQUE_RESEND: u64 = 1 << 63;

impl HandleStore {
    /// The tables of `state` as an earlier server left them (empty in a new
    /// state), with what they hold: the handles, and the backing ids.
    /// None if another store of this process holds them.
    pub fn attach(
        state: &Arc<SharedState>,
    ) -> Option<(HandleStore, Vec<SavedHandle>, Vec<SavedBacking>)> {
        let recs: ShmVec<HandleRec> = state.vec(Region::Handles)?;
        let brecs: ShmVec<BackingRec> = state.vec(Region::Backings)?;
        let mut handles = Slots {
            recs,
            free: Vec::new(),
            at: HashMap::new(),
        };
        let mut saved = Vec::new();
        for (i, r) in handles.recs.iter().enumerate() {
            if r.fh == 0 {
                handles.free.push(i);
                continue;
            }
            handles.at.insert(r.fh, i);
            saved.push(SavedHandle {
                fh: r.fh,
                ino: r.ino,
                version: SourceVersion {
                    size: r.size,
                    mtime_ns: r.mtime_ns,
                    ino: r.src_ino,
                },
                backing: (r.flags & PASSTHROUGH != 0).then_some(r.backing),
                keep_cache: r.flags & KEEP_CACHE != 0,
                unique: r.unique,
            });
        }
        let mut backings = Slots {
            recs: brecs,
            free: Vec::new(),
            at: HashMap::new(),
        };
        let mut ids = Vec::new();
        for (i, r) in backings.recs.iter().enumerate() {
            if r.live == 0 {
                backings.free.push(i);
                continue;
            }
            backings.at.insert(r.id as u64, i);
            ids.push(SavedBacking {
                id: r.id,
                ino: r.ino,
            });
        }
        let store = HandleStore {
            handles: Mutex::new(handles),
            backings: Mutex::new(backings),
        };
        Some((store, saved, ids))
    }

    /// Records an open handle (before its number goes to the kernel);
    /// false if the table is full (the handle then dies with this server).
    pub fn opened(&self, h: &SavedHandle) -> bool {
        let rec = HandleRec {
            fh: 0,
            ino: h.ino,
            size: h.version.size,
            mtime_ns: h.version.mtime_ns,
            src_ino: h.version.ino,
            unique: h.unique & !UNIQUE_RESEND,
            backing: h.backing.unwrap_or(0),
            flags: if h.backing.is_some() { PASSTHROUGH } else { 0 }
                | if h.keep_cache { KEEP_CACHE } else { 0 },
            _pad: 0,
        };
        let fh = h.fh;
        self.handles.lock().put(fh, rec, |r| r.fh = fh)
    }

    /// Forgets handle `fh` (RELEASE).
    pub fn released(&self, fh: u64) {
        let mut t = self.handles.lock();
        if let Some(i) = t.at.remove(&fh) {
            t.recs[i].fh = 0;
            t.free.push(i);
        }
    }

    /// Records backing id `id`, registered for inode `ino`.
    pub fn backing_opened(&self, id: u32, ino: u64) -> bool {
        let rec = BackingRec { id, live: 0, ino };
        self.backings.lock().put(id as u64, rec, |r| r.live = 1)
    }

    /// Forgets backing id `id` (closed).
    pub fn backing_closed(&self, id: u32) {
        let mut t = self.backings.lock();
        if let Some(i) = t.at.remove(&(id as u64)) {
            t.recs[i].live = 0;
            t.free.push(i);
        }
    }

    /// Handles recorded now.
    pub fn handle_count(&self) -> usize {
        self.handles.lock().at.len()
    }

    /// Backing ids recorded now.
    pub fn backing_count(&self) -> usize {
        self.backings.lock().at.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(fh: u64, backing: Option<u32>) -> SavedHandle {
        SavedHandle {
            fh,
            ino: fh + 100,
            version: SourceVersion {
                size: fh * 10,
                mtime_ns: -5,
                ino: 77,
            },
            backing,
            keep_cache: fh % 2 == 0,
            unique: (fh * 2) | UNIQUE_RESEND,
        }
    }

    #[test]
    fn a_new_server_finds_every_handle_and_backing_not_yet_released() {
        let state = SharedState::create().unwrap();
        {
            let (store, saved, ids) = HandleStore::attach(&state).unwrap();
            assert!(saved.is_empty() && ids.is_empty());
            assert!(
                HandleStore::attach(&state).is_none(),
                "one holder at a time"
            );
            for fh in 1..=5 {
                assert!(store.opened(&h(fh, (fh > 3).then_some(9))));
            }
            assert!(store.backing_opened(9, 104));
            assert!(store.backing_opened(11, 200));
            store.released(2);
            store.released(2);
            store.backing_closed(11);
            // A freed slot is used again.
            assert!(store.opened(&h(6, None)));
            assert_eq!(store.handle_count(), 5);
        }
        let (store, mut saved, ids) = HandleStore::attach(&state).unwrap();
        saved.sort_by_key(|s| s.fh);
        let want: Vec<SavedHandle> = [1, 3, 4, 5, 6]
            .into_iter()
            .map(|fh| {
                let mut x = h(fh, (fh > 3 && fh < 6).then_some(9));
                x.unique &= !UNIQUE_RESEND;
                x
            })
            .collect();
        assert_eq!(saved, want);
        assert_eq!(ids, vec![SavedBacking { id: 9, ino: 104 }]);
        store.released(4);
        assert_eq!(store.handle_count(), 4);
    }
}
