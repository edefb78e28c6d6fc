//! Open file handles and the per-inode open mode. The kernel keeps each FUSE
//! inode either in cached mode (reads go through the daemon and the page
//! cache) or in passthrough mode (the kernel reads the cached file itself),
//! never both: an open that would mix them fails with EIO in the user's
//! `open()`. This table decides the mode of every open so that never
//! happens, shares one backing id among all passthrough opens of an inode,
//! and says when the page cache may be kept (same version as last open).
//! When an inode's last passthrough open closes, its backing id is kept
//! (bounded, [`IDLE_BACKINGS`]) for the next open of the same version, which
//! then needs neither an open of the cached file nor a registration with
//! the kernel; the cache drops it through [`OpenFiles::forget_idle`] when
//! the cached file goes or loses blocks.
//!
//! A backing offered to an open comes as a [`Prepared`]: the backing and
//! the pin that keeps its cached file whole, a guard that gives the pin
//! back when dropped. The table keeps the one an inode's passthrough uses
//! until its last close; every other one (the open joined another's
//! passthrough, took the cached mode, or conflicted) is dropped by the
//! table itself, so no path can forget a pin.
//!
//! In the kernel open mode there are no handles: the kernel sends no OPEN
//! or RELEASE and every read comes with handle 0. [`InodeHandles`] then
//! keeps one handle per inode (its current version and sequential-read
//! state) in a bounded table.
//!
//! Pure bookkeeping over a generic backing token `B`; no I/O, no FUSE types.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::cache::{FileVersion, VersionKey};
use crate::source::SourceVersion;

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
    pub seq: Mutex<crate::read::prefetch::SeqState>,
}

/// What the table knows of an inode with open handles: kept while it has
/// any (the passthrough, rare and short-lived, boxed). Once the last is
/// released nothing stays (whether the kernel's pages are of the version
/// opened next is the namespace's to say: it keeps one bit per inode).
#[derive(Debug)]
struct InodeState<B, P> {
    cached_opens: u32,
    passthrough: Option<Box<Passthrough<B, P>>>,
}

/// A backing prepared for a passthrough open, with the pin (`P`, a guard)
/// that keeps its cached file whole while the kernel may read it: whoever
/// holds it owns one pin, and dropping it gives the pin back.
#[derive(Debug)]
pub struct Prepared<B, P> {
    pub backing: Arc<B>,
    pub pin: P,
}

/// An inode's passthrough: its open count, version, and the prepared
/// backing (and so the one pin) all its opens share.
#[derive(Debug)]
struct Passthrough<B, P> {
    opens: u32,
    key: VersionKey,
    prepared: Prepared<B, P>,
}

/// Why an open cannot be given any mode right now.
#[derive(Debug, PartialEq, Eq)]
pub struct ModeConflict;

/// Backing ids kept after their inode's last passthrough open, at most
/// (in two generations of half as many: when the newer is full the older
/// is dropped). Each holds an open file in the kernel (a few hundred bytes)
/// and none in this process.
pub const IDLE_BACKINGS: usize = 131072;

#[derive(Debug)]
struct Inner<B, P> {
    handles: HashMap<u64, Arc<Handle>>,
    /// Inodes with open handles.
    inodes: HashMap<u64, InodeState<B, P>>,
    next_fh: u64,
    /// Backing ids of closed inodes by version: (inode, backing).
    idle: [HashMap<VersionKey, (u64, Arc<B>)>; 2],
}

/// The table of open handles of one mount: backing tokens `B`, pin guards
/// `P`.
#[derive(Debug)]
pub struct OpenFiles<B, P = ()> {
    inner: Mutex<Inner<B, P>>,
    /// Entries of `Inner::idle`, kept up to date under the lock.
    kept: std::sync::atomic::AtomicUsize,
}

impl<B, P> Default for OpenFiles<B, P> {
    fn default() -> Self {
        OpenFiles {
            inner: Mutex::new(Inner {
                handles: HashMap::new(),
                inodes: HashMap::new(),
                next_fh: 1,
                idle: [HashMap::new(), HashMap::new()],
            }),
            kept: Default::default(),
        }
    }
}

impl<B, P> OpenFiles<B, P> {
    /// Whether `ino` has no open handle: only then is it worth preparing a
    /// backing file for passthrough (otherwise the open follows the mode the
    /// inode is already in).
    pub fn is_idle(&self, ino: u64) -> bool {
        !self.inner.lock().inodes.contains_key(&ino)
    }

    /// The backing id kept from an earlier passthrough open of this version
    /// of `ino`, taken out of the idle table.
    pub fn take_idle(&self, ino: u64, key: &VersionKey) -> Option<Arc<B>> {
        let mut inner = self.inner.lock();
        // Only the same inode's: another inode with the same path and
        // version (the path forgotten and looked up again) keeps its own.
        let g = inner
            .idle
            .iter_mut()
            .find(|g| g.get(key).is_some_and(|(i, _)| *i == ino))?;
        let (_, b) = g.remove(key)?;
        self.count_kept(&inner);
        Some(b)
    }

    fn count_kept(&self, inner: &Inner<B, P>) {
        let n = inner.idle.iter().map(HashMap::len).sum();
        self.kept.store(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// Drops the kept backing id of a version, if any: its cached file is
    /// gone or no longer complete.
    pub fn forget_idle(&self, key: &VersionKey) {
        let dropped: Vec<_> = {
            let mut inner = self.inner.lock();
            let dropped = inner
                .idle
                .iter_mut()
                .filter_map(|g| g.remove(key))
                .collect();
            self.count_kept(&inner);
            dropped
        };
        // Each drop unregisters the backing from the kernel: outside the lock.
        drop(dropped);
    }

    /// Number of backing ids kept for closed inodes (no lock taken).
    pub fn idle_count(&self) -> usize {
        self.kept.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Registers an open. `prepared` is a ready backing and its pin if the
    /// caller prepared one: the inode's passthrough takes it if the inode
    /// can take passthrough now and has none; otherwise it is dropped here
    /// (its pin given back), whatever the outcome. `keep_cache`: the
    /// kernel's pages of the inode are of this version (it opened it at
    /// this version before and has held it since). Returns the handle
    /// number and the mode.
    pub fn open(
        &self,
        ino: u64,
        file: Arc<FileVersion>,
        prepared: Option<Prepared<B, P>>,
        keep_cache: bool,
    ) -> Result<(u64, OpenMode<B>), ModeConflict> {
        let mut unused = prepared;
        let mut guard = self.inner.lock();
        let opened = Self::open_locked(&mut guard, ino, file, &mut unused, keep_cache);
        drop(guard);
        // Not taken: its pin goes back and its backing is unregistered
        // from the kernel, outside the lock.
        drop(unused);
        opened
    }

    fn open_locked(
        inner: &mut Inner<B, P>,
        ino: u64,
        file: Arc<FileVersion>,
        prepared: &mut Option<Prepared<B, P>>,
        keep_cache: bool,
    ) -> Result<(u64, OpenMode<B>), ModeConflict> {
        let st = inner.inodes.entry(ino).or_insert(InodeState {
            cached_opens: 0,
            passthrough: None,
        });
        let mode = match &mut st.passthrough {
            Some(p) if p.key == file.key => {
                p.opens += 1;
                OpenMode::Passthrough(Arc::clone(&p.prepared.backing))
            }
            // Open in passthrough on another version: neither mode works
            // (the state is the open passthrough's: nothing added).
            Some(_) => return Err(ModeConflict),
            None => match prepared.take() {
                Some(prepared) if st.cached_opens == 0 => {
                    let p = st.passthrough.insert(Box::new(Passthrough {
                        opens: 1,
                        key: file.key,
                        prepared,
                    }));
                    OpenMode::Passthrough(Arc::clone(&p.prepared.backing))
                }
                not_taken => {
                    *prepared = not_taken;
                    st.cached_opens += 1;
                    OpenMode::Cached { keep_cache }
                }
            },
        };
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
        Ok((fh, mode))
    }

    pub fn get(&self, fh: u64) -> Option<Arc<Handle>> {
        self.inner.lock().handles.get(&fh).cloned()
    }

    /// Puts back handle `fh` on `file` of `ino` as an earlier server of
    /// this mount opened it (a server restarted over a live mount). A
    /// passthrough handle gives `Some(prepared)`: its inode's backing and
    /// pin, taken by the inode's first such handle and dropped by the
    /// others (they share the first one's). Handles made from now on get
    /// numbers above every one put back.
    pub fn restore(
        &self,
        fh: u64,
        ino: u64,
        file: Arc<FileVersion>,
        passthrough: Option<Prepared<B, P>>,
    ) {
        let mut unused = None;
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        inner.next_fh = inner.next_fh.max(fh + 1);
        let st = inner.inodes.entry(ino).or_insert(InodeState {
            cached_opens: 0,
            passthrough: None,
        });
        let is_pt = passthrough.is_some();
        match (passthrough, &mut st.passthrough) {
            (Some(prepared), Some(p)) => {
                p.opens += 1;
                unused = Some(prepared);
            }
            (Some(prepared), slot @ None) => {
                *slot = Some(Box::new(Passthrough {
                    opens: 1,
                    key: file.key,
                    prepared,
                }));
            }
            (None, _) => st.cached_opens += 1,
        }
        inner.handles.insert(
            fh,
            Arc::new(Handle {
                ino,
                file,
                passthrough: is_pt,
                seq: Mutex::default(),
            }),
        );
        drop(guard);
        drop(unused);
    }

    /// The mode handle `fh` was opened in (for an OPEN the kernel sends
    /// again, answered with the handle already made for it).
    pub fn mode_of(&self, fh: u64, keep_cache: bool) -> Option<OpenMode<B>> {
        let inner = self.inner.lock();
        let h = inner.handles.get(&fh)?;
        if !h.passthrough {
            return Some(OpenMode::Cached { keep_cache });
        }
        let p = inner.inodes.get(&h.ino)?.passthrough.as_ref()?;
        Some(OpenMode::Passthrough(Arc::clone(&p.prepared.backing)))
    }

    /// Forgets a handle. Returns it, and whether it was the last passthrough
    /// open of its inode: its backing is then kept in the idle table, and
    /// its pin given back.
    pub fn release(&self, fh: u64) -> Option<(Arc<Handle>, bool)> {
        let mut dropped = None;
        let mut unpinned = None;
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        let h = inner.handles.remove(&fh)?;
        let mut last_passthrough = false;
        if let Some(st) = inner.inodes.get_mut(&h.ino) {
            if h.passthrough {
                if let Some(p) = &mut st.passthrough {
                    p.opens -= 1;
                    if p.opens == 0 {
                        last_passthrough = true;
                        if let Some(p) = st.passthrough.take() {
                            if inner.idle[0].len() >= IDLE_BACKINGS / 2 {
                                dropped = Some(std::mem::take(&mut inner.idle[1]));
                                inner.idle.swap(0, 1);
                            }
                            let Prepared { backing, pin } = p.prepared;
                            inner.idle[0].insert(p.key, (h.ino, backing));
                            unpinned = Some(pin);
                        }
                    }
                }
            } else {
                st.cached_opens = st.cached_opens.saturating_sub(1);
            }
            if st.cached_opens == 0 && st.passthrough.is_none() {
                inner.inodes.remove(&h.ino);
            }
        }
        if last_passthrough {
            self.count_kept(inner);
        }
        drop(guard);
        // Unpinning and unregistering an older generation: outside the lock.
        drop(unpinned);
        drop(dropped);
        Some((h, last_passthrough))
    }

    /// Inodes with open handles.
    pub fn inode_count(&self) -> usize {
        self.inner.lock().inodes.len()
    }

    pub fn open_count(&self) -> usize {
        self.inner.lock().handles.len()
    }
}

/// The handle a read without a handle (handle 0) is served with.
#[derive(Debug)]
pub struct InodeRead {
    pub handle: Arc<Handle>,
    /// This version of the inode is new to the table (its first read, or the
    /// file changed): the caller marks it as the current version in the cache.
    pub new_version: bool,
    /// The read starts an access to the file as far as the daemon can tell
    /// (a new version, or a read from offset 0): the caller counts it as an
    /// open, for stats and read-ahead (epoch tracking, small files whole).
    pub starts_access: bool,
}

#[derive(Debug, Default)]
struct Generations {
    current: HashMap<u64, Arc<Handle>>,
    old: HashMap<u64, Arc<Handle>>,
}

/// Per-inode handles for reads that come without one (the kernel open
/// mode). Bounded: two generations of at most `bound` inodes each; when the
/// current one is full it becomes the old one and the previous old one is
/// dropped, and an inode found in the old generation moves back to the
/// current one, so inodes being read keep their state while idle ones go.
/// An inode's path never changes (namespace.rs), so its version alone says
/// whether a handle is still current.
#[derive(Debug)]
pub struct InodeHandles {
    inner: Mutex<Generations>,
    bound: usize,
}

impl InodeHandles {
    /// A table of at most `2 * bound` inodes (`bound` at least 1).
    pub fn new(bound: usize) -> Self {
        InodeHandles {
            inner: Mutex::default(),
            bound: bound.max(1),
        }
    }

    /// The inode's handle if it is on `version`; None if the inode is not in
    /// the table or on another version (then the caller builds the current
    /// [`FileVersion`] and calls [`InodeHandles::install`]).
    pub fn get(&self, ino: u64, version: &SourceVersion, offset: u64) -> Option<InodeRead> {
        let mut inner = self.inner.lock();
        let inner = &mut *inner;
        let handle = match inner.current.get(&ino) {
            Some(h) if h.file.version == *version => Arc::clone(h),
            Some(_) => return None,
            None => {
                let h = inner.old.remove(&ino)?;
                if h.file.version != *version {
                    return None;
                }
                self.insert_current(inner, ino, Arc::clone(&h));
                h
            }
        };
        Some(InodeRead {
            handle,
            new_version: false,
            starts_access: offset == 0,
        })
    }

    /// Installs a handle on `file`, the inode's current version, replacing
    /// one on another version. If a concurrent read installed the same
    /// version first, its handle is used (and the version is not new).
    pub fn install(&self, ino: u64, file: Arc<FileVersion>, offset: u64) -> InodeRead {
        let mut inner = self.inner.lock();
        let inner = &mut *inner;
        let existing = inner
            .current
            .get(&ino)
            .or_else(|| inner.old.get(&ino))
            .filter(|h| h.file.key == file.key)
            .cloned();
        if let Some(handle) = existing {
            inner.old.remove(&ino);
            self.insert_current(inner, ino, Arc::clone(&handle));
            return InodeRead {
                handle,
                new_version: false,
                starts_access: offset == 0,
            };
        }
        inner.old.remove(&ino);
        let handle = Arc::new(Handle {
            ino,
            file,
            passthrough: false,
            seq: Mutex::default(),
        });
        self.insert_current(inner, ino, Arc::clone(&handle));
        InodeRead {
            handle,
            new_version: true,
            starts_access: true,
        }
    }

    fn insert_current(&self, inner: &mut Generations, ino: u64, h: Arc<Handle>) {
        if inner.current.len() >= self.bound && !inner.current.contains_key(&ino) {
            inner.old = std::mem::take(&mut inner.current);
        }
        inner.current.insert(ino, h);
    }

    /// The kernel no longer knows these inodes: their handles go.
    pub fn forget(&self, inos: &[u64]) {
        if inos.is_empty() {
            return;
        }
        let mut inner = self.inner.lock();
        for ino in inos {
            inner.current.remove(ino);
            inner.old.remove(ino);
        }
    }

    /// Inodes in the table.
    #[cfg(test)]
    fn len(&self) -> usize {
        let inner = self.inner.lock();
        inner.current.len() + inner.old.len()
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

    /// A backing prepared without a pin.
    fn prep<B>(b: B) -> Prepared<B, ()> {
        Prepared {
            backing: Arc::new(b),
            pin: (),
        }
    }

    /// A pin on a counter (the cache's pin count of one file), given back
    /// when dropped.
    #[derive(Debug)]
    struct Pin(Arc<std::sync::atomic::AtomicI64>);

    impl Pin {
        fn take(count: &Arc<std::sync::atomic::AtomicI64>) -> Pin {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Pin(Arc::clone(count))
        }
    }

    impl Drop for Pin {
        fn drop(&mut self) {
            self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    fn pinned(count: &Arc<std::sync::atomic::AtomicI64>) -> Option<Prepared<u32, Pin>> {
        Some(Prepared {
            backing: Arc::new(1),
            pin: Pin::take(count),
        })
    }

    fn pins(count: &Arc<std::sync::atomic::AtomicI64>) -> i64 {
        count.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[test]
    fn an_inode_in_passthrough_holds_one_pin_and_every_other_is_given_back() {
        let t: OpenFiles<u32, Pin> = OpenFiles::default();
        let (v1, v2) = (fv(10), fv(11));
        let (p1, p2) = (Arc::default(), Arc::default());
        // Two opens that both found the inode idle and both prepared one:
        // the second joins the first's passthrough and its pin goes back.
        let (a, m) = t.open(7, v1.clone(), pinned(&p1), false).unwrap();
        assert!(matches!(m, OpenMode::Passthrough(_)));
        let (b, m) = t.open(7, v1.clone(), pinned(&p1), false).unwrap();
        assert!(matches!(m, OpenMode::Passthrough(_)));
        assert_eq!(pins(&p1), 1);
        // Another version while in passthrough: refused, its pin goes back.
        assert_eq!(
            t.open(7, v2.clone(), pinned(&p2), false).unwrap_err(),
            ModeConflict
        );
        assert_eq!(pins(&p2), 0);
        assert!(!t.release(a).unwrap().1);
        assert_eq!(pins(&p1), 1, "still open in passthrough");
        assert!(t.release(b).unwrap().1);
        assert_eq!(pins(&p1), 0, "the last close gives the pin back");
        assert_eq!(t.idle_count(), 1, "its backing is kept, unpinned");
        // Cached mode chosen (a cached open is there): the pin goes back.
        let (c, m) = t.open(8, v1.clone(), None, false).unwrap();
        assert!(matches!(m, OpenMode::Cached { .. }));
        let (d, m) = t.open(8, v1.clone(), pinned(&p1), false).unwrap();
        assert!(matches!(m, OpenMode::Cached { .. }));
        assert_eq!(pins(&p1), 0);
        t.release(c);
        t.release(d);
        assert_eq!(pins(&p1), 0);
    }

    #[test]
    fn racing_opens_of_one_idle_inode_leave_no_pin_behind() {
        // Each worker does what the FUSE open does: prepares (and pins) a
        // backing if the inode looks idle, opens, then closes.
        let t: Arc<OpenFiles<u32, Pin>> = Arc::default();
        let count = Arc::default();
        let f = fv(10);
        for _ in 0..50 {
            let barrier = Arc::new(std::sync::Barrier::new(8));
            let workers: Vec<_> = (0..8)
                .map(|_| {
                    let (t, count, f, barrier) =
                        (t.clone(), Arc::clone(&count), f.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        let prepared = if t.is_idle(7) { pinned(&count) } else { None };
                        let (fh, _) = t.open(7, f, prepared, false).unwrap();
                        t.release(fh);
                    })
                })
                .collect();
            for w in workers {
                w.join().unwrap();
            }
            assert_eq!(pins(&count), 0);
            assert!(t.is_idle(7));
        }
    }

    #[test]
    fn modes_never_mix_on_one_inode() {
        let t: OpenFiles<&'static str> = OpenFiles::default();
        let f = fv(10);
        let (a, m) = t.open(7, f.clone(), None, false).unwrap();
        assert!(matches!(m, OpenMode::Cached { .. }));
        assert!(!t.is_idle(7));
        // A backing offered while cached handles exist is not used.
        let (b, m) = t.open(7, f.clone(), Some(prep("backing")), false).unwrap();
        assert!(matches!(m, OpenMode::Cached { .. }));
        t.release(a);
        t.release(b);
        assert!(t.is_idle(7));
        let (c, m) = t.open(7, f.clone(), Some(prep("backing")), false).unwrap();
        let OpenMode::Passthrough(id) = m else {
            panic!()
        };
        // Later opens share the same backing, even without offering one.
        let (d, m) = t.open(7, f.clone(), None, false).unwrap();
        let OpenMode::Passthrough(id2) = m else {
            panic!()
        };
        assert!(Arc::ptr_eq(&id, &id2));
        // Another version cannot be opened while passthrough is active.
        assert_eq!(t.open(7, fv(11), None, false).unwrap_err(), ModeConflict);
        assert!(!t.release(c).unwrap().1);
        assert!(t.release(d).unwrap().1);
        assert_eq!(t.open_count(), 0);
    }

    #[test]
    fn the_backing_of_a_closed_inode_is_kept_for_its_next_open() {
        let t: OpenFiles<u32> = OpenFiles::default();
        let f = fv(10);
        let (a, m) = t.open(7, f.clone(), Some(prep(1)), false).unwrap();
        assert!(matches!(m, OpenMode::Passthrough(_)));
        assert_eq!(t.idle_count(), 0);
        assert!(t.release(a).unwrap().1);
        assert_eq!(t.idle_count(), 1);
        // Not for another inode or another version.
        assert!(t.take_idle(8, &f.key).is_none());
        assert!(t.take_idle(7, &fv(11).key).is_none());
        assert_eq!(t.idle_count(), 1);
        let b = t.take_idle(7, &f.key).expect("kept");
        assert_eq!(*b, 1);
        assert_eq!(t.idle_count(), 0);
        let (a, m) = t
            .open(
                7,
                f.clone(),
                Some(Prepared {
                    backing: b,
                    pin: (),
                }),
                false,
            )
            .unwrap();
        assert!(matches!(m, OpenMode::Passthrough(ref x) if **x == 1));
        t.release(a);
        // Dropped when the cache says its file went.
        t.forget_idle(&f.key);
        assert_eq!(t.idle_count(), 0);
        assert!(t.take_idle(7, &f.key).is_none());
    }

    #[test]
    fn handles_put_back_after_a_restart_share_their_inodes_passthrough() {
        let t: OpenFiles<u32, Pin> = OpenFiles::default();
        let count = Arc::default();
        let f = fv(10);
        // Two passthrough handles of inode 7 and a cached one of inode 8,
        // as the dead server left them; each passthrough one brings the
        // inode's backing and pin, the second is given back.
        t.restore(4, 7, f.clone(), pinned(&count));
        t.restore(9, 7, f.clone(), pinned(&count));
        t.restore(5, 8, fv(11), None);
        assert_eq!(pins(&count), 1);
        assert!(matches!(
            t.mode_of(4, false),
            Some(OpenMode::Passthrough(_))
        ));
        assert!(matches!(
            t.mode_of(5, true),
            Some(OpenMode::Cached { keep_cache: true })
        ));
        // A new open of inode 7 joins its passthrough; numbers go on above.
        let (fh, m) = t.open(7, f.clone(), None, false).unwrap();
        assert!(fh > 9);
        assert!(matches!(m, OpenMode::Passthrough(_)));
        assert!(!t.release(4).unwrap().1);
        assert!(!t.release(fh).unwrap().1);
        assert!(t.release(9).unwrap().1, "the last close of the inode");
        assert_eq!(pins(&count), 0);
        assert!(t.release(5).is_some());
        assert_eq!(t.open_count(), 0);
    }

    #[test]
    fn kept_backings_are_bounded() {
        let t: OpenFiles<u64> = OpenFiles::default();
        for ino in 1..=(IDLE_BACKINGS as u64 + 1000) {
            let (h, _) = t.open(ino, fv(ino), Some(prep(ino)), false).unwrap();
            t.release(h);
            assert!(t.idle_count() <= IDLE_BACKINGS);
        }
        // The latest are kept, the oldest went.
        let last = IDLE_BACKINGS as u64 + 1000;
        assert!(t.take_idle(last, &fv(last).key).is_some());
        assert!(t.take_idle(1, &fv(1).key).is_none());
    }

    #[test]
    fn inode_handles_follow_the_version_and_keep_their_state() {
        let t = InodeHandles::new(100);
        let v1 = fv(10);
        assert!(t.get(5, &v1.version, 0).is_none());
        let r = t.install(5, v1.clone(), 4096);
        assert!(r.new_version && r.starts_access, "first read of the inode");
        let h1 = r.handle;
        h1.seq.lock().on_read(0, 4096, 4096, 100, 1 << 20);
        // Same version: the same handle (and sequential state), an access
        // only when the read starts at offset 0.
        let r = t.get(5, &v1.version, 8192).unwrap();
        assert!(Arc::ptr_eq(&r.handle, &h1));
        assert!(!r.new_version && !r.starts_access);
        let r = t.get(5, &v1.version, 0).unwrap();
        assert!(!r.new_version && r.starts_access);
        // A read that raced the first one installs the same version again:
        // it gets the existing handle.
        let r = t.install(5, fv(10), 8192);
        assert!(Arc::ptr_eq(&r.handle, &h1));
        assert!(!r.new_version && !r.starts_access);
        // The file changed: the old handle no longer matches; a new one
        // replaces it.
        let v2 = fv(20);
        assert!(t.get(5, &v2.version, 4096).is_none());
        let r = t.install(5, v2.clone(), 4096);
        assert!(r.new_version && r.starts_access);
        assert!(!Arc::ptr_eq(&r.handle, &h1));
        assert_eq!(r.handle.file.key, v2.key);
        assert!(!r.handle.passthrough);
        assert!(t.get(5, &v1.version, 0).is_none());
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn inode_handles_are_bounded_and_keep_the_inodes_being_read() {
        let t = InodeHandles::new(3);
        let hot = t.install(1, fv(1), 0).handle;
        for ino in 2..1000 {
            t.install(ino, fv(ino), 0);
            assert!(t.len() <= 6, "at most two generations of 3");
            // The inode read all along stays, with its state.
            let r = t.get(1, &fv(1).version, 4096).expect("hot inode kept");
            assert!(Arc::ptr_eq(&r.handle, &hot));
        }
        // Idle inodes went.
        assert!(t.get(2, &fv(2).version, 0).is_none());
        assert!(t.get(500, &fv(500).version, 0).is_none());
        // An evicted inode comes back as a new entry (counted as an access).
        let r = t.install(2, fv(2), 4096);
        assert!(r.new_version && r.starts_access);
        assert!(InodeHandles::new(0).install(1, fv(1), 0).new_version);
    }
}
