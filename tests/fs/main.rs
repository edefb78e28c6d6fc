//! The file system core (src/fs/) without FUSE and without root: the
//! real namespace, reader, read-ahead and open table, wired as a mount
//! wires them (`mount::assemble::core`), over an in-memory source, the kit's in-memory block cache with a complete-file side that
//! counts pins, and a fake kernel that registers passthrough backings
//! (the kit's, `locafs::testing`). Requests go in as the FUSE adapter sends them; answers come
//! back through the replies. Covers the open protocol (modes, keep_cache,
//! errors, stats), passthrough bookkeeping (one pin per inode in
//! passthrough, every other pin given back, kept backings, racing opens),
//! revalidation, EROFS, the kernel open mode, listings, and that a request
//! needing the source never holds the caller's thread.

#[path = "../common/mod.rs"]
mod common;

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use locafs::cache::{FileVersion, VersionKey};
use locafs::fs::handles::OpenMode;
use locafs::fs::{
    DirPlusReply, DirReply, FsCore, FsOptions, HandleJournal, OpenReply, Opened, Restored,
    STATS_XATTR,
};
use locafs::meta::namespace::{Namespace, ROOT};
use locafs::mount::assemble::{self, CoreConfig, Tiers};
use locafs::obs::stats::Stats;
use locafs::read::prefetch::ReadAheadConfig;
use locafs::read::reader::ReaderConfig;
use locafs::source::{EntryKind, SourceAttr, SourceVersion};
use locafs::testing::{Backing, Kernel, MemCache, MemComplete, MemSource};

const BS: u64 = 4096;
const WAIT: Duration = Duration::from_secs(60);

/// A core over the fakes, with its runtime.
struct Harness {
    fs: Arc<FsCore<Backing>>,
    source: Arc<MemSource>,
    cache: Arc<MemCache>,
    /// The cache's complete-file side, counting pins.
    complete: Arc<MemComplete>,
    kernel: Arc<Kernel>,
    stats: Arc<Stats>,
    /// Kept alive with the core (its tasks run there).
    _rt: tokio::runtime::Runtime,
}

/// The reply to an open: registers with the fake kernel, sends the answer.
struct OpenTx {
    kernel: Arc<Kernel>,
    tx: mpsc::Sender<io::Result<Opened<Backing>>>,
    /// The request's id (0: none).
    unique: u64,
}

impl OpenReply<Backing> for OpenTx {
    fn register_backing(&self, file: &File) -> io::Result<Backing> {
        self.kernel.register(file)
    }
    fn done(self, r: io::Result<Opened<Backing>>) {
        let _ = self.tx.send(r);
    }
    fn request_id(&self) -> u64 {
        self.unique
    }
}

/// Handles the core recorded (a server's journal in the shared state):
/// (fh, ino, request id) of the live ones.
#[derive(Default)]
struct Journal(Mutex<Vec<(u64, u64, u64)>>);

impl HandleJournal<Backing> for Journal {
    fn opened(&self, fh: u64, ino: u64, _v: &SourceVersion, _m: &OpenMode<Backing>, unique: u64) {
        self.0.lock().unwrap().push((fh, ino, unique));
    }
    fn released(&self, fh: u64) {
        self.0.lock().unwrap().retain(|h| h.0 != fh);
    }
}

/// One listed entry: inode, next offset, name, kind (None: "." or ".." of
/// a plain listing).
type Listed = (u64, u64, OsString, Option<EntryKind>);

/// The reply to a listing, with room for `room` entries.
struct DirTx {
    room: usize,
    got: Vec<Listed>,
    tx: mpsc::Sender<io::Result<Vec<Listed>>>,
}

impl DirReply for DirTx {
    fn add(&mut self, ino: u64, next: u64, name: &OsStr, attr: Option<&SourceAttr>) -> bool {
        if self.got.len() == self.room {
            return true;
        }
        self.got
            .push((ino, next, name.to_owned(), attr.map(|a| a.kind)));
        false
    }
    fn done(self, r: io::Result<()>) {
        let _ = self.tx.send(r.map(|()| self.got));
    }
}

impl DirPlusReply for DirTx {
    fn add(&mut self, ino: u64, next: u64, name: &OsStr, attr: &SourceAttr) -> bool {
        DirReply::add(self, ino, next, name, Some(attr))
    }
    fn done(self, r: io::Result<()>) {
        DirReply::done(self, r)
    }
}

fn wait<T>(rx: mpsc::Receiver<T>) -> T {
    rx.recv_timeout(WAIT).expect("the core never replied")
}

fn errno<T: std::fmt::Debug>(r: io::Result<T>) -> i32 {
    r.expect_err("an error").raw_os_error().expect("an errno")
}

fn backing(o: &Opened<Backing>) -> Option<&Arc<Backing>> {
    match &o.mode {
        OpenMode::Passthrough(b) => Some(b),
        OpenMode::Cached { .. } => None,
    }
}

fn keep_cache(o: &Opened<Backing>) -> Option<bool> {
    match o.mode {
        OpenMode::Cached { keep_cache } => Some(keep_cache),
        OpenMode::Passthrough(_) => None,
    }
}

/// Waits (at most a minute) for `cond`.
fn eventually(cond: impl Fn() -> bool) -> bool {
    let t0 = Instant::now();
    while !cond() {
        if t0.elapsed() > WAIT {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

impl Harness {
    /// `revalidate`: None never asks the source again (`--immutable`);
    /// zero asks it at every request.
    fn new(source: Arc<MemSource>, revalidate: Option<Duration>) -> Harness {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let cache = Arc::new(MemCache::new(BS));
        let complete = MemComplete::new(Arc::clone(&cache));
        let stats = Arc::new(Stats::default());
        // Wired as a mount wires its core, over the fakes.
        let tiers = Tiers {
            source: source.clone(),
            ns: Namespace::new(source.clone(), revalidate, Arc::default()).unwrap(),
            cache: cache.clone(),
            complete: Some(complete.clone()),
            peers: None,
        };
        let config = CoreConfig {
            reader: ReaderConfig {
                block_size: BS,
                memory_bytes: 64 * BS,
                write_queue_bytes: 16 * BS,
                write_wait_bytes: 16 * BS,
                source_timeout: WAIT,
            },
            // No read-ahead: the tests decide what is cached.
            readahead: ReadAheadConfig {
                sequential: false,
                epoch: false,
                max_window: 8 * BS,
                memory: 64 * BS,
                jobs: locafs::read::concurrency::Jobs::Fixed(1),
                bandwidth: None,
                small_file: 0,
                plan_ahead: 0,
            },
            fs: FsOptions {
                source_label: "mem:".into(),
                mount_label: "/mnt".into(),
                control_socket: "/run/locafs/ctl.sock".into(),
            },
        };
        let fs = assemble::core(tiers, config, &stats, rt.handle()).fs;
        Harness {
            fs,
            source,
            cache,
            complete,
            kernel: Arc::default(),
            stats,
            _rt: rt,
        }
    }

    fn lookup(&self, path: &str) -> io::Result<(u64, SourceAttr)> {
        let mut cur = (ROOT, None);
        for name in Path::new(path).iter() {
            let (tx, rx) = mpsc::channel();
            self.fs.lookup(cur.0, name, move |r| {
                let _ = tx.send(r);
            });
            let (ino, a) = wait(rx)?;
            cur = (ino, Some(a));
        }
        Ok((cur.0, cur.1.expect("a path")))
    }

    fn getattr(&self, ino: u64) -> io::Result<SourceAttr> {
        let (tx, rx) = mpsc::channel();
        self.fs.getattr(ino, move |r| {
            let _ = tx.send(r);
        });
        wait(rx)
    }

    fn getxattr(&self, ino: u64, name: &str) -> io::Result<Vec<u8>> {
        let (tx, rx) = mpsc::channel();
        self.fs.getxattr(ino, OsStr::new(name), move |r| {
            let _ = tx.send(r);
        });
        wait(rx)
    }

    fn listxattr(&self, ino: u64) -> io::Result<Vec<u8>> {
        let (tx, rx) = mpsc::channel();
        self.fs.listxattr(ino, move |r| {
            let _ = tx.send(r);
        });
        wait(rx)
    }

    fn ino(&self, path: &str) -> u64 {
        self.lookup(path).unwrap().0
    }

    fn open_rx(&self, ino: u64, write: bool) -> mpsc::Receiver<io::Result<Opened<Backing>>> {
        self.open_rx_id(ino, write, 0)
    }

    /// An open by request `unique`.
    fn open_rx_id(
        &self,
        ino: u64,
        write: bool,
        unique: u64,
    ) -> mpsc::Receiver<io::Result<Opened<Backing>>> {
        let (tx, rx) = mpsc::channel();
        let reply = OpenTx {
            kernel: Arc::clone(&self.kernel),
            tx,
            unique,
        };
        self.fs.open(ino, write, reply);
        rx
    }

    fn open(&self, ino: u64) -> io::Result<Opened<Backing>> {
        wait(self.open_rx(ino, false))
    }

    fn read(&self, ino: u64, fh: u64, offset: u64, size: u32) -> io::Result<Bytes> {
        let (tx, rx) = mpsc::channel();
        self.fs.read(ino, fh, offset, size, move |r| {
            let _ = tx.send(r);
        });
        wait(rx)
    }

    fn opens(&self) -> u64 {
        self.stats.opens.load(SeqCst)
    }

    /// The current version of `rel` at the source.
    fn file(&self, rel: &str) -> FileVersion {
        FileVersion::new(Arc::from(Path::new(rel)), self.source.version(rel))
    }

    fn key(&self, rel: &str) -> VersionKey {
        self.file(rel).key
    }

    /// Caches every block of the current version of `rel` (`data`).
    fn cache_whole(&self, rel: &str, data: &[u8]) {
        self.cache.fill(&self.file(rel), data);
    }

    fn listing(&self, ino: u64, offset: u64, room: usize, plus: bool) -> io::Result<Vec<Listed>> {
        let (tx, rx) = mpsc::channel();
        let reply = DirTx {
            room,
            got: Vec::new(),
            tx,
        };
        if plus {
            self.fs.readdirplus(ino, offset, reply);
        } else {
            self.fs.readdir(ino, offset, reply);
        }
        wait(rx)
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        // Never leave a test's tasks waiting on a held source.
        self.source.resume();
    }
}

fn data(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32 * 31 + seed as u32) as u8)
        .collect()
}

#[test]
fn an_uncached_file_opens_in_cached_mode_reads_its_bytes_and_counts_its_opens() {
    let src = Arc::new(MemSource::new());
    let a = data(3 * BS as usize + 100, 1);
    src.write("dir/a", &a);
    let h = Harness::new(src, None);
    h.fs.enable_passthrough();
    let ino = h.ino("dir/a");
    let first = h.open(ino).unwrap();
    assert_eq!(
        keep_cache(&first),
        Some(false),
        "a version new to the inode"
    );
    assert_eq!(h.read(ino, first.fh, 0, a.len() as u32).unwrap(), &a[..]);
    assert_eq!(
        h.read(ino, first.fh, BS - 10, 20).unwrap(),
        &a[BS as usize - 10..][..20]
    );
    assert!(h
        .read(ino, first.fh, a.len() as u64, 10)
        .unwrap()
        .is_empty());
    // The same version again: the kernel may keep its page cache.
    let second = h.open(ino).unwrap();
    assert_eq!(keep_cache(&second), Some(true));
    assert_ne!(first.fh, second.fh);
    assert_eq!(h.opens(), 2);
    assert_eq!(h.stats.open_handles.load(SeqCst), 2);
    assert_eq!(h.stats.passthrough_opens.load(SeqCst), 0);
    assert_eq!(
        h.kernel.asked.load(SeqCst),
        0,
        "nothing cached to pass through"
    );
    assert_eq!(*h.cache.current.lock().unwrap(), vec![h.key("dir/a")]);
    h.fs.release(first.fh);
    h.fs.release(second.fh);
    h.fs.release(second.fh);
    assert_eq!(h.stats.open_handles.load(SeqCst), 0, "a handle closes once");
    assert_eq!(errno(h.read(ino, first.fh, 0, 10)), libc::EBADF);
    assert_eq!(h.complete.all_pins(), 0);
}

#[test]
fn write_access_and_every_change_of_the_tree_get_erofs() {
    let src = Arc::new(MemSource::new());
    src.write("a", b"data");
    let h = Harness::new(src, None);
    h.fs.enable_passthrough();
    let ino = h.ino("a");
    h.cache_whole("a", b"data");
    assert_eq!(errno(wait(h.open_rx(ino, true))), libc::EROFS);
    assert_eq!(h.fs.modify().raw_os_error(), Some(libc::EROFS));
    // Refused before anything was done for it.
    assert_eq!(h.opens(), 0);
    assert_eq!(h.kernel.asked.load(SeqCst), 0);
    assert_eq!(h.complete.all_pins(), 0);
}

#[test]
fn opens_of_what_is_not_a_file_fail_with_its_errno() {
    let src = Arc::new(MemSource::new());
    src.write("d/f", b"x");
    src.symlink("link", "d/f");
    let h = Harness::new(src, None);
    assert_eq!(errno(h.open(h.ino("d"))), libc::EISDIR);
    assert_eq!(errno(h.open(h.ino("link"))), libc::EINVAL);
    assert_eq!(errno(h.open(9999)), libc::ENOENT);
    assert_eq!(errno(h.lookup("d/nothing")), libc::ENOENT);
    assert_eq!(h.opens(), 0);
    assert_eq!(h.stats.open_handles.load(SeqCst), 0);
}

#[test]
fn a_cached_file_opens_in_passthrough_with_one_pin_and_its_backing_is_kept_after_close() {
    let src = Arc::new(MemSource::new());
    let a = data(2 * BS as usize + 7, 2);
    src.write("a", &a);
    let h = Harness::new(src, None);
    h.fs.enable_passthrough();
    let ino = h.ino("a");
    let key = h.key("a");
    h.cache_whole("a", &a);
    // Two opens share one backing and one pin.
    let x = h.open(ino).unwrap();
    let y = h.open(ino).unwrap();
    let (bx, by) = (
        backing(&x).expect("passthrough"),
        backing(&y).expect("passthrough"),
    );
    assert!(Arc::ptr_eq(bx, by));
    assert_eq!(h.kernel.asked.load(SeqCst), 1);
    assert_eq!(h.complete.pins(&key), 1);
    assert_eq!(h.stats.passthrough_opens.load(SeqCst), 2);
    assert_eq!(h.opens(), 2);
    drop((x.mode, y.mode));
    h.fs.release(x.fh);
    assert_eq!(h.complete.pins(&key), 1, "still open in passthrough");
    assert_eq!(h.stats.passthrough_kept.load(SeqCst), 0);
    h.fs.release(y.fh);
    // The last close gives the pin back and keeps the backing.
    assert_eq!(h.complete.pins(&key), 0);
    assert_eq!(h.stats.passthrough_kept.load(SeqCst), 1);
    assert_eq!(h.kernel.live(), 1);
    // The next open of the same version takes the kept backing: no new
    // registration, a new pin.
    let z = h.open(ino).unwrap();
    assert!(backing(&z).is_some());
    assert_eq!(h.kernel.asked.load(SeqCst), 1);
    assert_eq!(h.complete.pins(&key), 1);
    assert_eq!(h.stats.passthrough_kept.load(SeqCst), 0);
    drop(z.mode);
    h.fs.release(z.fh);
    assert_eq!(h.stats.passthrough_kept.load(SeqCst), 1);
    // The cache drops the file: its kept backing goes too.
    h.complete.drop_file(&key);
    assert_eq!(h.stats.passthrough_kept.load(SeqCst), 0);
    assert_eq!(h.kernel.live(), 0);
    // Now it opens cached (reading it brings it back).
    let w = h.open(ino).unwrap();
    assert_eq!(keep_cache(&w), Some(true));
    assert_eq!(h.read(ino, w.fh, 0, a.len() as u32).unwrap(), &a[..]);
    h.fs.release(w.fh);
    assert_eq!(h.complete.all_pins(), 0);
    assert!(!h.complete.unpin_underflow.load(SeqCst));
}

/// A server killed after it recorded a handle and before the kernel got
/// the OPEN's reply: the next server puts the handle back, and the OPEN the
/// kernel sends again (its id with the resend bit) gets that handle, not a
/// second one that nothing would ever release.
#[test]
fn an_open_sent_again_after_a_restart_gets_the_handle_made_for_it() {
    const RESEND: u64 = 1 << 63;
    let src = Arc::new(MemSource::new());
    let a = data(3 * BS as usize, 4);
    src.write("a", &a);
    let h = Harness::new(src.clone(), None);
    let journal = Arc::new(Journal::default());
    h.fs.set_journal(journal.clone());
    let ino = h.ino("a");
    let x = wait(h.open_rx_id(ino, false, 77)).unwrap();
    assert_eq!(*journal.0.lock().unwrap(), vec![(x.fh, ino, 77)]);
    // The next server, over the same namespace.
    let h2 = Harness::new(src, None);
    assert_eq!(h2.ino("a"), ino);
    let version = h2.lookup("a").unwrap().1.version();
    let put = h2.fs.restore_handles(vec![Restored {
        fh: x.fh,
        ino,
        version,
        backing: None,
        keep_cache: true,
        unique: 77,
    }]);
    assert_eq!(put, 1);
    assert_eq!(h2.stats.open_handles.load(SeqCst), 1);
    let again = wait(h2.open_rx_id(ino, false, 77 | RESEND)).unwrap();
    assert_eq!(again.fh, x.fh);
    assert_eq!(keep_cache(&again), Some(true));
    // Only that once, and only for that id: other opens get new handles,
    // numbered above.
    let other = wait(h2.open_rx_id(ino, false, 78 | RESEND)).unwrap();
    assert!(other.fh > x.fh);
    assert_eq!(h2.read(ino, x.fh, 0, 100).unwrap(), &a[..100]);
    h2.fs.release(x.fh);
    h2.fs.release(other.fh);
    assert_eq!(h2.stats.open_handles.load(SeqCst), 0);
}

/// The restored handles' OPEN ids are kept only while the kernel may send
/// that OPEN again: each goes with the OPEN sent again or with its handle's
/// RELEASE (the kernel had the reply), so the table ends empty instead of
/// holding every handle the server ever took over.
#[test]
fn restored_open_ids_go_with_their_resent_open_or_their_release() {
    const RESEND: u64 = 1 << 63;
    let src = Arc::new(MemSource::new());
    src.write("a", &data(BS as usize, 5));
    let h = Harness::new(src.clone(), None);
    let ino = h.ino("a");
    let made: Vec<u64> = (0..3u64)
        .map(|i| wait(h.open_rx_id(ino, false, 100 + i)).unwrap().fh)
        .collect();
    let h2 = Harness::new(src, None);
    let version = h2.lookup("a").unwrap().1.version();
    let restored = made
        .iter()
        .enumerate()
        .map(|(i, &fh)| Restored {
            fh,
            ino,
            version,
            backing: None,
            keep_cache: true,
            unique: 100 + i as u64,
        })
        .collect();
    assert_eq!(h2.fs.restore_handles(restored), 3);
    assert_eq!(h2.fs.resent_pending(), 3);
    // The first OPEN is sent again: it gets its handle, and its id goes.
    let again = wait(h2.open_rx_id(ino, false, 100 | RESEND)).unwrap();
    assert_eq!(again.fh, made[0]);
    assert_eq!(h2.fs.resent_pending(), 2);
    // The kernel releases the second: its OPEN never comes again.
    h2.fs.release(made[1]);
    assert_eq!(h2.fs.resent_pending(), 1);
    h2.fs.release(made[0]);
    assert_eq!(h2.fs.resent_pending(), 1);
    h2.fs.release(made[2]);
    assert_eq!(h2.fs.resent_pending(), 0);
    // An OPEN of a released handle's id sent again gets a new handle.
    let late = wait(h2.open_rx_id(ino, false, 102 | RESEND)).unwrap();
    assert!(!made.contains(&late.fh));
    h2.fs.release(late.fh);
    assert_eq!(h2.stats.open_handles.load(SeqCst), 0);
}

#[test]
fn a_kept_backing_whose_file_is_no_longer_whole_is_not_used() {
    let src = Arc::new(MemSource::new());
    let a = data(3 * BS as usize, 3);
    src.write("a", &a);
    let h = Harness::new(src, None);
    h.fs.enable_passthrough();
    let ino = h.ino("a");
    let key = h.key("a");
    h.cache_whole("a", &a);
    let x = h.open(ino).unwrap();
    drop(x.mode);
    h.fs.release(x.fh);
    assert_eq!(h.kernel.live(), 1);
    // A block lost without the cache's hook being told: the kept backing
    // is taken, found not whole (no pin), and dropped; the open is cached.
    h.cache.drop_blocks(&key, Some(1));
    let y = h.open(ino).unwrap();
    assert_eq!(keep_cache(&y), Some(true));
    assert_eq!(h.kernel.live(), 0);
    assert_eq!(h.stats.passthrough_kept.load(SeqCst), 0);
    assert_eq!(h.kernel.asked.load(SeqCst), 1, "no new registration");
    assert_eq!(h.complete.all_pins(), 0);
    h.fs.release(y.fh);
    // Whole again: a new backing.
    h.cache_whole("a", &a);
    let z = h.open(ino).unwrap();
    assert!(backing(&z).is_some());
    assert_eq!(h.kernel.asked.load(SeqCst), 2);
    assert_eq!(h.complete.pins(&key), 1);
    drop(z.mode);
    h.fs.release(z.fh);
    assert_eq!(h.complete.all_pins(), 0);
    assert!(!h.complete.unpin_underflow.load(SeqCst));
}

#[test]
fn without_passthrough_from_the_kernel_a_cached_file_opens_cached_and_pins_nothing() {
    let src = Arc::new(MemSource::new());
    src.write("a", b"abc");
    let h = Harness::new(src, None);
    let ino = h.ino("a");
    h.cache_whole("a", b"abc");
    let x = h.open(ino).unwrap();
    assert_eq!(keep_cache(&x), Some(false));
    assert_eq!(h.read(ino, x.fh, 0, 3).unwrap(), &b"abc"[..]);
    assert_eq!(h.kernel.asked.load(SeqCst), 0);
    assert_eq!(h.complete.all_pins(), 0);
    h.fs.release(x.fh);
}

#[test]
fn a_refused_registration_gives_the_pin_back_and_turns_passthrough_off() {
    let src = Arc::new(MemSource::new());
    src.write("a", b"first");
    src.write("b", b"second");
    let h = Harness::new(src, None);
    h.fs.enable_passthrough();
    h.kernel.refuse.store(true, SeqCst);
    let (a, b) = (h.ino("a"), h.ino("b"));
    h.cache_whole("a", b"first");
    h.cache_whole("b", b"second");
    let x = h.open(a).unwrap();
    assert_eq!(keep_cache(&x), Some(false), "served through the daemon");
    assert_eq!(h.complete.all_pins(), 0, "the pin of the refused backing");
    assert_eq!(h.read(a, x.fh, 0, 5).unwrap(), &b"first"[..]);
    // Passthrough is off from now on: nothing more is asked of the kernel.
    let y = h.open(b).unwrap();
    assert!(backing(&y).is_none());
    assert_eq!(h.kernel.asked.load(SeqCst), 1);
    assert_eq!(h.complete.all_pins(), 0);
    h.fs.release(x.fh);
    h.fs.release(y.fh);
    assert!(!h.complete.unpin_underflow.load(SeqCst));
}

#[test]
fn racing_opens_of_one_cached_file_leave_no_pin_behind() {
    // DataLoader workers open the same shard at the same moment: opens
    // that all find the inode idle all prepare (and pin) a backing; one
    // inode keeps one, every other pin goes back.
    let src = Arc::new(MemSource::new());
    let a = data(2 * BS as usize, 4);
    src.write("a", &a);
    let h = Arc::new(Harness::new(src, None));
    h.fs.enable_passthrough();
    let ino = h.ino("a");
    let key = h.key("a");
    h.cache_whole("a", &a);
    const THREADS: usize = 8;
    for round in 0..50 {
        let barrier = Arc::new(std::sync::Barrier::new(THREADS));
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                let (h, barrier) = (Arc::clone(&h), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    barrier.wait();
                    let o = h.open(ino).unwrap();
                    assert!(backing(&o).is_some(), "every open in passthrough");
                    barrier.wait();
                    drop(o.mode);
                    h.fs.release(o.fh);
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        assert_eq!(h.complete.pins(&key), 0, "round {round}: a pin left behind");
        assert_eq!(h.stats.open_handles.load(SeqCst), 0);
        assert_eq!(h.stats.passthrough_kept.load(SeqCst), 1);
        assert_eq!(h.kernel.live(), 1, "round {round}: one backing kept");
    }
    assert!(
        !h.complete.unpin_underflow.load(SeqCst),
        "a pin given back twice"
    );
    // And the file can go: nothing holds it.
    h.complete.drop_file(&key);
    assert_eq!(h.kernel.live(), 0);
}

#[test]
fn a_file_changed_while_open_in_passthrough_is_ebusy_until_closed() {
    let src = Arc::new(MemSource::new());
    let (v1, v2) = (data(BS as usize + 1, 5), data(BS as usize + 2, 6));
    src.write("a", &v1);
    // Attributes revalidated at every request.
    let h = Harness::new(src.clone(), Some(Duration::ZERO));
    h.fs.enable_passthrough();
    let ino = h.ino("a");
    let k1 = h.key("a");
    h.cache_whole("a", &v1);
    let x = h.open(ino).unwrap();
    assert!(backing(&x).is_some());
    src.write("a", &v2);
    let k2 = h.key("a");
    h.cache_whole("a", &v2);
    // Neither mode works for the new version while the old one is open
    // in passthrough; nothing is pinned for it.
    assert_eq!(errno(h.open(ino)), libc::EBUSY);
    assert_eq!(h.complete.pins(&k1), 1);
    assert_eq!(h.complete.pins(&k2), 0);
    drop(x.mode);
    h.fs.release(x.fh);
    assert_eq!(h.complete.pins(&k1), 0);
    // Once closed, the new version opens (in passthrough) and is current.
    let y = h.open(ino).unwrap();
    assert!(backing(&y).is_some());
    assert_eq!(h.complete.pins(&k2), 1);
    assert_eq!(*h.cache.current.lock().unwrap(), vec![k1, k2]);
    drop(y.mode);
    h.fs.release(y.fh);
    assert_eq!(h.complete.all_pins(), 0);
}

#[test]
fn revalidation_shows_a_changed_file_and_a_deleted_one() {
    let src = Arc::new(MemSource::new());
    src.write("a", b"version one");
    let h = Harness::new(src.clone(), Some(Duration::ZERO));
    let ino = h.ino("a");
    let x = h.open(ino).unwrap();
    assert_eq!(h.read(ino, x.fh, 0, 100).unwrap(), &b"version one"[..]);
    h.fs.release(x.fh);
    src.write("a", b"version two, longer");
    let y = h.open(ino).unwrap();
    assert_eq!(
        keep_cache(&y),
        Some(false),
        "a new version drops the page cache"
    );
    assert_eq!(
        h.read(ino, y.fh, 0, 100).unwrap(),
        &b"version two, longer"[..]
    );
    assert_eq!(h.cache.current.lock().unwrap().last(), Some(&h.key("a")));
    let (tx, rx) = mpsc::channel();
    h.fs.getattr(ino, move |r| {
        let _ = tx.send(r);
    });
    assert_eq!(wait(rx).unwrap().size, 19);
    h.fs.release(y.fh);
    src.remove("a");
    assert_eq!(errno(h.open(ino)), libc::ENOENT);
    assert_eq!(errno(h.lookup("a")), libc::ENOENT);
    assert_eq!(h.opens(), 2);
}

#[test]
fn without_revalidation_the_source_is_not_asked_again() {
    let src = Arc::new(MemSource::new());
    src.write("a", b"kept");
    let h = Harness::new(src.clone(), None);
    let ino = h.ino("a");
    let calls = src.metadata_calls.load(SeqCst);
    src.write("a", b"changed");
    for _ in 0..3 {
        let x = h.open(ino).unwrap();
        h.fs.release(x.fh);
    }
    let (tx, rx) = mpsc::channel();
    h.fs.getattr(ino, move |r| {
        let _ = tx.send(r);
    });
    assert_eq!(wait(rx).unwrap().size, 4, "the attributes first seen");
    assert_eq!(src.metadata_calls.load(SeqCst), calls);
}

#[test]
fn requests_that_need_the_source_return_before_it_answers() {
    let src = Arc::new(MemSource::new());
    let a = data(BS as usize, 7);
    src.write("a", &a);
    src.write("d/b", b"b");
    src.symlink("l", "a");
    let h = Harness::new(src.clone(), Some(Duration::ZERO));
    h.fs.enable_passthrough();
    let ino = h.ino("a");
    let (d, l) = (h.ino("d"), h.ino("l"));
    let cached = h.open(ino).unwrap();
    h.cache_whole("a", &a);
    src.hold();
    // A read the cache can answer is answered before the call returns,
    // without the source.
    let (tx, rx) = mpsc::channel();
    h.fs.read(ino, cached.fh, 0, 100, move |r| {
        let _ = tx.send(r);
    });
    assert_eq!(rx.try_recv().expect("answered at once").unwrap(), &a[..100]);
    // Every request below needs the source (attributes always stale): each
    // call returns while the source holds, and its reply comes later.
    let (fs, kernel) = (Arc::clone(&h.fs), Arc::clone(&h.kernel));
    let (open_tx, open_rx) = mpsc::channel();
    let (attr_tx, attr_rx) = mpsc::channel();
    let (look_tx, look_rx) = mpsc::channel();
    let (dir_tx, dir_rx) = mpsc::channel();
    let (plus_tx, plus_rx) = mpsc::channel();
    let (link_tx, link_rx) = mpsc::channel();
    let (df_tx, df_rx) = mpsc::channel();
    let caller = std::thread::spawn(move || {
        fs.open(
            ino,
            false,
            OpenTx {
                kernel,
                tx: open_tx,
                unique: 0,
            },
        );
        fs.getattr(ino, move |r| drop(attr_tx.send(r)));
        fs.lookup(d, OsStr::new("b"), move |r| drop(look_tx.send(r)));
        let dir = DirTx {
            room: 100,
            got: Vec::new(),
            tx: dir_tx,
        };
        fs.readdir(d, 0, dir);
        let plus = DirTx {
            room: 100,
            got: Vec::new(),
            tx: plus_tx,
        };
        fs.readdirplus(d, 0, plus);
        fs.readlink(l, move |r| drop(link_tx.send(r)));
        fs.statfs(move |r| drop(df_tx.send(r.map(|s| s.f_blocks))));
    });
    assert!(
        eventually(|| caller.is_finished()),
        "a request held the caller's thread on the source"
    );
    assert!(eventually(|| src.waiting() > 0));
    assert!(open_rx.try_recv().is_err(), "answered without the source");
    src.resume();
    let o = wait(open_rx).unwrap();
    assert!(backing(&o).is_none(), "the inode is open cached");
    assert_eq!(wait(attr_rx).unwrap().size, BS);
    assert_eq!(wait(look_rx).unwrap().1.size, 1);
    let names = |v: Vec<Listed>| v.into_iter().map(|e| e.2).collect::<Vec<_>>();
    assert_eq!(names(wait(dir_rx).unwrap()), [".", "..", "b"]);
    // The first READDIRPLUS of a listing stats no entry: "b" (stale) is
    // left to the next one.
    assert_eq!(names(wait(plus_rx).unwrap()), [".", ".."]);
    assert_eq!(wait(link_rx).unwrap(), Path::new("a"));
    assert_eq!(wait(df_rx).unwrap(), 1000);
    h.fs.release(o.fh);
    h.fs.release(cached.fh);
    assert_eq!(h.complete.all_pins(), 0);
}

#[test]
fn kernel_open_mode_refuses_open_and_serves_reads_without_a_handle() {
    let src = Arc::new(MemSource::new());
    let a = data(2 * BS as usize, 8);
    src.write("a", &a);
    let h = Harness::new(src.clone(), Some(Duration::ZERO));
    h.fs.enable_passthrough();
    h.fs.enable_kernel_open();
    let ino = h.ino("a");
    h.cache_whole("a", &a);
    // ENOSYS: the kernel's sign to open by itself from now on.
    assert_eq!(errno(h.open(ino)), libc::ENOSYS);
    assert_eq!(h.opens(), 0);
    assert_eq!(h.complete.all_pins(), 0);
    // Reads come with handle 0; the first (and any from offset 0) counts
    // as an open of the current version.
    assert_eq!(h.read(ino, 0, 0, 10).unwrap(), &a[..10]);
    assert_eq!(h.opens(), 1);
    assert_eq!(*h.cache.current.lock().unwrap(), vec![h.key("a")]);
    assert_eq!(h.read(ino, 0, BS, 10).unwrap(), &a[BS as usize..][..10]);
    assert_eq!(h.opens(), 1);
    assert_eq!(h.read(ino, 0, 0, 10).unwrap(), &a[..10]);
    assert_eq!(h.opens(), 2);
    // A changed file: the next read sees the new version.
    src.write("a", b"new bytes");
    assert_eq!(h.read(ino, 0, 4, 100).unwrap(), &b"bytes"[..]);
    assert_eq!(h.opens(), 3);
    assert_eq!(h.cache.current.lock().unwrap().last(), Some(&h.key("a")));
    assert_eq!(errno(h.read(ROOT, 0, 0, 10)), libc::EISDIR);
    assert_eq!(h.stats.open_handles.load(SeqCst), 0);
    assert_eq!(h.kernel.asked.load(SeqCst), 0);
}

#[test]
fn listings_give_dot_dotdot_then_the_entries_and_resume_at_an_offset() {
    let src = Arc::new(MemSource::new());
    for name in ["d/z", "d/x", "d/y"] {
        src.write(name, name.as_bytes());
    }
    src.write("d/sub/f", b"f");
    let h = Harness::new(src, Some(Duration::ZERO));
    let d = h.ino("d");
    for plus in [false, true] {
        // The first READDIRPLUS stats nothing: with attributes always
        // stale it holds "." and ".." only, and the kernel asks again from
        // there (those replies stat their entries).
        let mut all = h.listing(d, 0, 100, plus).unwrap();
        if plus {
            assert_eq!(all.len(), 2, "the first READDIRPLUS: {all:?}");
            all.extend(h.listing(d, 2, 100, plus).unwrap());
        }
        let names: Vec<_> = all.iter().map(|e| e.2.clone()).collect();
        assert_eq!(names, [".", "..", "sub", "x", "y", "z"], "plus: {plus}");
        assert_eq!((all[0].0, all[1].0), (d, ROOT));
        let kinds: Vec<_> = all.iter().map(|e| e.3).collect();
        let dots = if plus { Some(EntryKind::Dir) } else { None };
        assert_eq!(kinds[..3], [dots, dots, Some(EntryKind::Dir)]);
        assert_eq!(kinds[3..], [Some(EntryKind::File); 3]);
        let offsets: Vec<_> = all.iter().map(|e| e.1).collect();
        assert_eq!(offsets, [1, 2, 3, 4, 5, 6]);
        // A full reply, then the rest from where it stopped.
        let from = if plus { 2 } else { 0 };
        let first = h.listing(d, from, 4 - from as usize, plus).unwrap();
        assert_eq!(first, all[from as usize..4]);
        let rest = h.listing(d, first.last().unwrap().1, 100, plus).unwrap();
        assert_eq!(rest, all[4..]);
        let end = if plus { 2 } else { all.len() };
        assert_eq!(h.listing(d, 1, 100, plus).unwrap(), all[1..end]);
        assert!(h.listing(d, 6, 100, plus).unwrap().is_empty());
    }
    assert_eq!(errno(h.listing(h.ino("d/x"), 0, 10, false)), libc::ENOTDIR);
    assert_eq!(errno(h.listing(9999, 0, 10, false)), libc::ENOENT);
}

/// The first READDIRPLUS of a listing holds at most 32 entries even when
/// all are known (the kernel makes an inode of each: a walk that never
/// looks at them, `find` or an image-folder scan, pays for that); a
/// READDIRPLUS from further on fills its reply.
#[test]
fn the_first_readdirplus_is_short_even_over_known_entries() {
    let src = Arc::new(MemSource::new());
    for i in 0..100 {
        src.write(&format!("d/f{i:03}"), b"x");
    }
    let h = Harness::new(src, None);
    let d = h.ino("d");
    for i in 0..100 {
        h.ino(&format!("d/f{i:03}"));
    }
    let first = h.listing(d, 0, 1000, true).unwrap();
    assert_eq!(first.len(), 2 + 32, "\".\", \"..\" and 32 entries");
    assert!(first.iter().all(|e| e.3.is_some()), "with their attributes");
    let rest = h.listing(d, first.last().unwrap().1, 1000, true).unwrap();
    assert_eq!(rest.len(), 100 - 32);
    assert_eq!(rest.last().unwrap().2, "f099");
    // Plain READDIR is not cut.
    assert_eq!(h.listing(d, 0, 1000, false).unwrap().len(), 102);
}

#[test]
fn the_root_has_the_stats_and_control_attributes_and_lists_none() {
    let src = Arc::new(MemSource::new());
    src.write("a", b"a");
    let h = Harness::new(src, None);
    let stats = h.getxattr(ROOT, STATS_XATTR).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&stats).unwrap();
    assert_eq!(v["source"], "mem:");
    assert_eq!(v["mountpoint"], "/mnt");
    assert_eq!(v["opens"], 0);
    let ctl = h.getxattr(ROOT, "user.locafs.control");
    assert_eq!(ctl.unwrap(), b"/run/locafs/ctl.sock");
    let a = h.ino("a");
    for (ino, name) in [
        (a, STATS_XATTR),
        (ROOT, "user.other"),
        (ROOT, "user.locafs.statsx"),
    ] {
        let r = h.getxattr(ino, name);
        assert_eq!(errno(r), libc::ENODATA);
    }
    assert!(h.listxattr(ROOT).unwrap().is_empty());
}

/// FORGET: an inode the kernel no longer knows keeps no page cache at its
/// next open (its pages went with the kernel's inode); a closed inode keeps
/// nothing in the open table, only the namespace's bit that its pages are
/// of the version last opened.
#[test]
fn an_inode_the_kernel_forgot_keeps_no_open_state() {
    let src = Arc::new(MemSource::new());
    src.write("a", &data(100, 1));
    src.write("b", &data(100, 2));
    let h = Harness::new(src, None);
    let (a, b) = (h.ino("a"), h.ino("b"));
    let first = h.open(a).unwrap();
    assert_eq!(keep_cache(&first), Some(false), "never opened");
    h.fs.release(first.fh);
    let second = h.open(a).unwrap();
    assert_eq!(keep_cache(&second), Some(true), "the kernel still has it");
    h.fs.release(second.fh);
    let open_b = h.open(b).unwrap();
    assert_eq!(h.fs.open_inodes(), 1, "a closed inode keeps no open state");
    // One lookup each (`ino`), taken back.
    h.fs.forget(&[(a, 1), (b, 1)]);
    assert_eq!(h.fs.open_inodes(), 1, "the open inode keeps its state");
    let third = h.open(a).unwrap();
    assert_eq!(keep_cache(&third), Some(false), "nothing kept of a");
    assert_eq!(h.read(a, third.fh, 0, 100).unwrap(), &data(100, 1)[..]);
    h.fs.release(third.fh);
    h.fs.release(open_b.fh);
}

/// An ACL in the kernel's xattr format (version 2): the owner rw-, named
/// user `uid` with `perm`, group r--, mask r--, other r--.
fn acl_value(uid: u32, perm: u16) -> Box<[u8]> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (0x01u16, 6u16, u32::MAX),
        (0x02, perm, uid),
        (0x04, 4, u32::MAX),
        (0x10, 4, u32::MAX),
        (0x20, 4, u32::MAX),
    ] {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v.into_boxed_slice()
}

#[test]
fn posix_acls_are_the_sources_held_with_the_attributes_and_read_again_with_them() {
    use locafs::source::{Acls, ACL_ACCESS_XATTR as ACCESS, ACL_DEFAULT_XATTR as DEFAULT};
    let src = Arc::new(MemSource::new());
    src.write("secret", b"s");
    src.write("open", b"o");
    src.write("d/x", b"x");
    let denied = acl_value(65534, 0);
    src.set_acls(
        "secret",
        Acls {
            access: Some(denied.clone()),
            default: None,
        },
    );
    src.set_acls(
        "d",
        Acls {
            access: None,
            default: Some(denied.clone()),
        },
    );
    // Held until the attributes are read again: never (--immutable).
    let h = Harness::new(src.clone(), None);
    let (secret, open, d) = (h.ino("secret"), h.ino("open"), h.ino("d"));
    assert_eq!(&*h.getxattr(secret, ACCESS).unwrap(), &*denied);
    assert_eq!(errno(h.getxattr(secret, DEFAULT)), libc::ENODATA);
    assert_eq!(errno(h.getxattr(open, ACCESS)), libc::ENODATA);
    assert_eq!(&*h.getxattr(d, DEFAULT).unwrap(), &*denied);
    assert_eq!(h.listxattr(secret).unwrap(), b"system.posix_acl_access\0");
    assert_eq!(h.listxattr(d).unwrap(), b"system.posix_acl_default\0");
    assert_eq!(h.listxattr(open).unwrap(), b"");
    let calls = src.acl_calls.load(SeqCst);
    assert_eq!(calls, 3, "one read of each entry's ACLs");
    src.set_acls("secret", Acls::default());
    for _ in 0..3 {
        assert_eq!(&*h.getxattr(secret, ACCESS).unwrap(), &*denied);
        assert_eq!(errno(h.getxattr(open, ACCESS)), libc::ENODATA);
    }
    assert_eq!(src.acl_calls.load(SeqCst), calls, "held, not asked again");

    // Revalidated with the attributes: always stale here, so each GETATTR
    // reads them again, and the ACL is read again at the next request (the
    // kernel asks for the attributes before it asks for the ACL again);
    // without a GETATTR in between it is held.
    let h = Harness::new(src.clone(), Some(Duration::ZERO));
    let secret = h.ino("secret");
    assert_eq!(errno(h.getxattr(secret, ACCESS)), libc::ENODATA);
    let granted = acl_value(65534, 4);
    src.set_acls(
        "secret",
        Acls {
            access: Some(granted.clone()),
            default: None,
        },
    );
    assert_eq!(errno(h.getxattr(secret, ACCESS)), libc::ENODATA, "held");
    h.getattr(secret).unwrap();
    assert_eq!(&*h.getxattr(secret, ACCESS).unwrap(), &*granted);
    // A file gone at the source: its ACL read again fails as its stat does.
    let open = h.ino("open");
    h.getattr(open).unwrap();
    src.remove("open");
    assert_eq!(errno(h.getxattr(open, ACCESS)), libc::ENOENT);
}
