//! A source that stalls, as a hard NFS mount does when its server hangs:
//! the mount must not freeze. Cached files open and read with their last
//! known attributes, listings and `stat` of known entries answer from what
//! the mount knows, what it cannot answer (an uncached block, an unknown
//! name) fails with ETIMEDOUT within its deadline, threads stay bounded, and
//! the mount recovers on its own when the source answers again.
//!
//! Two sources that stall: an in-process source whose every call blocks on
//! a gate, and a real FUSE file system (another `locafs` process) stopped
//! with SIGSTOP, whose callers sleep uninterruptibly in the kernel.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::inproc;
use common::{listing, signal, snapshot, stats_of, threads, ResumeOnDrop, Signal};
use locafs::testing::StallSource;

/// Every file's bytes, by path relative to the root.
type Tree = BTreeMap<PathBuf, Vec<u8>>;

fn make_tree(src: &Path) -> Tree {
    let mut tree = Tree::new();
    for i in 0..50u32 {
        // Mostly image-sized files, and a few of several blocks.
        let len = if i % 10 == 9 {
            (2 << 20) + 4096 * i as usize
        } else {
            3000 + 1000 * i as usize
        };
        let dir = if i < 40 { "" } else { "sub" };
        let rel = Path::new(dir).join(format!("f{i:03}.bin"));
        let data: Vec<u8> = (0..len).map(|b| (b as u32 * 31 + i) as u8).collect();
        fs::create_dir_all(src.join(dir)).unwrap();
        fs::write(src.join(&rel), &data).unwrap();
        tree.insert(rel, data);
    }
    std::os::unix::fs::symlink("f000.bin", src.join("link")).unwrap();
    tree
}

/// Runs `f` on a thread and waits for it at most `limit`. A mount that
/// froze would hold the thread in the kernel for as long as the stall
/// lasts: then `on_hang` ends the stall (so that the test can clean up) and
/// the test fails.
fn within<T: Send + 'static>(
    what: &str,
    limit: Duration,
    on_hang: impl FnOnce(),
    f: impl FnOnce() -> T + Send + 'static,
) -> (T, Duration) {
    let (tx, rx) = mpsc::channel();
    let t = Instant::now();
    std::thread::spawn(move || {
        let v = f();
        let _ = tx.send((v, t.elapsed()));
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(_) => {
            on_hang();
            panic!("{what}: no answer within {limit:?} while the source stalled: the mount froze");
        }
    }
}

/// What the stalled mount must still do, and what it must refuse at once.
/// Returns (time to read every cached file, time to list, time for the
/// uncached read to fail).
fn check_stalled(
    mnt: PathBuf,
    tree: Tree,
    attrs: BTreeMap<PathBuf, (u64, i64)>,
    listing: (Vec<String>, Vec<String>),
    on_hang: impl FnOnce(),
) -> (Duration, Duration, Duration) {
    within(
        "the stalled mount",
        Duration::from_secs(60),
        on_hang,
        move || {
            // Cached files: open, read whole, compare; stat gives the last
            // known attributes.
            let t = Instant::now();
            for (rel, data) in &tree {
                let got = fs::read(mnt.join(rel)).unwrap_or_else(|e| panic!("{rel:?}: {e}"));
                assert!(
                    got == *data,
                    "{rel:?}: wrong bytes while the source stalled"
                );
                let m = fs::metadata(mnt.join(rel)).unwrap();
                assert_eq!((m.len(), m.mtime_nsec()), attrs[rel], "{rel:?}");
            }
            let read_all = t.elapsed();
            let t = Instant::now();
            assert_eq!(common::listing(&mnt), listing.0);
            assert_eq!(common::listing(&mnt.join("sub")), listing.1);
            let list = t.elapsed();
            assert_eq!(
                fs::read_link(mnt.join("link")).unwrap(),
                Path::new("f000.bin")
            );
            // df: the last known figures.
            let st = locafs::sys::statvfs(&mnt).unwrap();
            assert!(st.f_blocks > 0);
            // A name the mount never saw: it cannot answer, and says so.
            let e = fs::metadata(mnt.join("never-seen")).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::ETIMEDOUT), "{e}");
            // The uncached file again: refused at once now (counted as a
            // call refused, not waited out: far under the 30 s
            // --source-timeout a read that waited would take).
            let refused = snapshot(&mnt).source_calls_refused;
            let t = Instant::now();
            let e = fs::read(mnt.join("late.bin")).unwrap_err();
            let failed = t.elapsed();
            assert_eq!(e.raw_os_error(), Some(libc::ETIMEDOUT), "{e}");
            assert!(
                snapshot(&mnt).source_calls_refused > refused,
                "the read was not refused at once ({failed:?})"
            );
            assert!(failed < Duration::from_secs(15), "{failed:?}");
            (read_all, list, failed)
        },
    )
    .0
}

/// The first request after the source stopped: a read of a file the mount
/// knows (fresh attributes) but has not cached. It fails with ETIMEDOUT
/// once the source has been silent for --metadata-timeout (1 s here), well
/// before its own --source-timeout (30 s here; the bound is half of it,
/// far from the 1 s expected). Returns how long it took.
fn uncached_read_fails(mnt: &Path, metadata_timeout: Duration, on_hang: impl FnOnce()) -> Duration {
    let path = mnt.join("late.bin");
    let (e, took) = within(
        "an uncached read",
        Duration::from_secs(60),
        on_hang,
        move || fs::read(path).unwrap_err(),
    );
    assert_eq!(e.raw_os_error(), Some(libc::ETIMEDOUT), "{e}");
    assert!(took >= metadata_timeout / 2, "{took:?}");
    assert!(took < Duration::from_secs(15), "{took:?}");
    took
}

fn known_attrs(mnt: &Path, tree: &Tree) -> BTreeMap<PathBuf, (u64, i64)> {
    tree.keys()
        .map(|rel| {
            let m = fs::metadata(mnt.join(rel)).unwrap();
            (rel.clone(), (m.len(), m.mtime_nsec()))
        })
        .collect()
}

/// Reads everything once through the mount and waits until the cache
/// holds every file whole.
fn cache_everything(mnt: &Path, tree: &Tree, files_cached: impl Fn() -> u64) {
    for (rel, data) in tree {
        assert!(fs::read(mnt.join(rel)).unwrap() == *data, "{rel:?}");
    }
    let t = Instant::now();
    while files_cached() < tree.len() as u64 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the cache did not settle: {} of {} files",
            files_cached(),
            tree.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_stalled_source_does_not_freeze_the_mount_and_it_recovers_on_its_own() {
    require_fuse!();
    let d = common::Scratch::new();
    let tree = make_tree(&d.src);
    let source = Arc::new(StallSource::new(&d.src));
    let cfg = inproc::config(
        &d,
        &[
            "--revalidate",
            "1s",
            "--metadata-timeout",
            "1s",
            "--source-timeout",
            "30s",
        ],
    );
    let m = inproc::mount(&cfg, Arc::clone(&source) as _);
    let mnt = d.mnt.clone();
    cache_everything(&mnt, &tree, || snapshot(&mnt).files_cached);
    let attrs = known_attrs(&mnt, &tree);
    let listing = (listing(&mnt), listing(&mnt.join("sub")));
    fs::read_link(mnt.join("link")).unwrap();
    locafs::sys::statvfs(&mnt).unwrap();
    // A file the mount knows by name but has not cached.
    fs::write(d.src.join("late.bin"), vec![5u8; 100_000]).unwrap();
    let listing = (
        {
            let mut l = listing.0;
            l.push("late.bin".into());
            l.sort();
            l
        },
        listing.1,
    );
    // (once the listing that did not have it is past --revalidate)
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(fs::metadata(mnt.join("late.bin")).unwrap().len(), 100_000);

    // The threads the mount ran before the stall (read-ahead's fetches
    // and stat-ahead of the listings above start as many as they keep
    // busy, up to the pools' bounds).
    let threads_before = snapshot(&mnt).source_threads_peak;
    source.stall();
    let s2 = Arc::clone(&source);
    let first = uncached_read_fails(&mnt, cfg.metadata_timeout, move || s2.resume());
    // Every entry is past --revalidate: each request would ask the source.
    std::thread::sleep(Duration::from_millis(1500));
    let s2 = Arc::clone(&source);
    let (read_all, list, failed) =
        check_stalled(mnt.clone(), tree.clone(), attrs, listing, move || {
            s2.resume()
        });
    eprintln!(
        "stalled source: first uncached read failed in {first:?}; {} cached files read in \
         {read_all:?}, listing {list:?}, uncached read failed in {failed:?}",
        tree.len()
    );
    let s = snapshot(&mnt);
    assert!(s.source_stalled_since.is_some(), "{s:?}");
    assert!(s.source_stalls >= 1);
    assert!(s.stale_answers > 0, "{s:?}");
    // Calls into the stalled source stopped: the stuck ones are few.
    let stuck = source.max_waiting();
    assert!(stuck <= 8, "{stuck} calls stuck in the source");
    // ... and the stall started no more threads than the mount ran before
    // (stuck calls hold threads it had; new calls are refused, not given
    // one; one probe).
    assert!(
        s.source_threads_peak <= threads_before.max(16) + 1,
        "{} threads before the stall; {s:?}",
        threads_before
    );

    // The source answers again: no remount needed.
    let t = Instant::now();
    source.resume();
    while snapshot(&mnt).source_stalled_since.is_some() {
        assert!(t.elapsed() < Duration::from_secs(20), "no recovery");
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("recovered {:?} after the source answered", t.elapsed());
    assert!(fs::read(mnt.join("late.bin")).unwrap() == vec![5u8; 100_000]);
    // Revalidation resumes: a changed file shows its new bytes.
    let rel = Path::new("f001.bin");
    fs::write(d.src.join(rel), b"new bytes").unwrap();
    let t = Instant::now();
    loop {
        match fs::read(mnt.join(rel)) {
            Ok(b) if b == b"new bytes" => break,
            _ if t.elapsed() < Duration::from_secs(20) => {
                std::thread::sleep(Duration::from_millis(100))
            }
            other => panic!("the change did not show after recovery: {other:?}"),
        }
    }
    drop(m);
}

#[test]
fn a_source_whose_server_is_stopped_does_not_freeze_a_real_mount() {
    require_fuse!();
    // The "server": a locafs process serving the data set over FUSE; the
    // mount under test reads through it. SIGSTOP makes every call into it
    // sleep uninterruptibly, as a hard NFS mount does.
    let s = common::Scratch::new();
    let tree = make_tree(&s.src);
    let server_mnt = s.path().join("server");
    let server_cache = s.path().join("server-cache");
    fs::create_dir_all(&server_mnt).unwrap();
    fs::create_dir_all(&server_cache).unwrap();
    let server = common::Mount::start(
        &s.src,
        &server_mnt,
        &server_cache,
        &["--no-readahead", "--no-passthrough", "--revalidate", "0s"],
    );
    let mut m = common::Mount::start(
        &server_mnt,
        &s.mnt,
        &s.cache,
        &[
            "--revalidate",
            "1s",
            "--metadata-timeout",
            "1s",
            "--source-timeout",
            "30s",
        ],
    );
    let mnt = s.mnt.clone();
    cache_everything(&mnt, &tree, || {
        stats_of(&mnt)["files_cached"].as_u64().unwrap()
    });
    let attrs = known_attrs(&mnt, &tree);
    fs::read_link(mnt.join("link")).unwrap();
    locafs::sys::statvfs(&mnt).unwrap();
    fs::write(s.src.join("late.bin"), vec![5u8; 100_000]).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(fs::metadata(mnt.join("late.bin")).unwrap().len(), 100_000);
    let listing = (listing(&mnt), listing(&mnt.join("sub")));
    // (the serving processes, not the ones holding the mounts)
    let pid = common::restart::server_pid(&mnt).unwrap();
    let threads_before = threads(pid).expect("Threads of the daemon");

    let server_pid = common::restart::server_pid(&server.mnt).unwrap();
    signal(server_pid, Signal::STOP).unwrap();
    let cont = ResumeOnDrop(server_pid);
    let resume = move || {
        let _ = signal(server_pid, Signal::CONT);
    };
    let first = uncached_read_fails(&mnt, Duration::from_secs(1), resume);
    std::thread::sleep(Duration::from_millis(1500));
    let (read_all, list, failed) = check_stalled(mnt.clone(), tree.clone(), attrs, listing, resume);
    let threads_stalled = threads(pid).expect("Threads of the daemon");
    let stats = stats_of(&mnt);
    eprintln!(
        "server stopped: first uncached read failed in {first:?}; {} cached files read in \
         {read_all:?}, listing {list:?}, uncached read failed in {failed:?}; daemon threads {threads_before} before, {threads_stalled} while \
         stalled; {stats}",
        tree.len()
    );
    assert!(stats["source_stalled_since"].is_number(), "{stats}");
    assert!(stats["stale_answers"].as_u64().unwrap() > 0, "{stats}");
    assert!(
        threads_stalled <= threads_before + 16,
        "{threads_before} -> {threads_stalled} threads"
    );

    drop(cont);
    let t = Instant::now();
    while !stats_of(&mnt)["source_stalled_since"].is_null() {
        assert!(t.elapsed() < Duration::from_secs(20), "no recovery");
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("recovered {:?} after SIGCONT", t.elapsed());
    assert!(fs::read(mnt.join("late.bin")).unwrap() == vec![5u8; 100_000]);
    assert!(m.stderr().contains("source stalled"), "{}", m.stderr());
    assert!(
        m.stderr().contains("source answers again"),
        "{}",
        m.stderr()
    );
    m.unmount();
    drop(server);
}

#[test]
fn a_request_waiting_on_the_source_holds_no_fuse_thread() {
    require_fuse!();
    // One FUSE thread, reads through the daemon, and a long metadata
    // deadline: while a lookup waits on the stalled source (30 s before
    // its deadline), reads of a cached file must still be served.
    let d = common::Scratch::new();
    let tree = make_tree(&d.src);
    let source = Arc::new(StallSource::new(&d.src));
    let cfg = inproc::config(
        &d,
        &[
            "--fuse-threads",
            "1",
            "--no-passthrough",
            "--revalidate",
            "1s",
            "--metadata-timeout",
            "30s",
        ],
    );
    let m = inproc::mount(&cfg, Arc::clone(&source) as _);
    let mnt = d.mnt.clone();
    cache_everything(&mnt, &tree, || snapshot(&mnt).files_cached);
    let rel = Path::new("f009.bin");
    let f = fs::File::open(mnt.join(rel)).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    // So that the read below reaches the daemon.
    common::drop_page_cache();
    source.stall();
    // A lookup that must ask the source (its entry is past --revalidate),
    // and is waiting in it.
    let p = mnt.join("sub/f040.bin");
    let waiting = std::thread::spawn(move || fs::metadata(p).map(|m| m.len()).ok());
    common::wait_until(
        "the lookup waiting in the source",
        Duration::from_secs(30),
        || source.waiting() > 0,
    );
    let s2 = Arc::clone(&source);
    let data = tree[rel].clone();
    let (_, took) = within(
        "a read while a lookup waits",
        Duration::from_secs(20),
        move || s2.resume(),
        move || {
            use std::os::unix::fs::FileExt;
            let mut buf = vec![0u8; data.len()];
            f.read_exact_at(&mut buf, 0).unwrap();
            assert!(buf == data);
        },
    );
    // Served while the lookup still waited (its deadline is 30 s away).
    assert!(
        !waiting.is_finished(),
        "the lookup did not wait on the source"
    );
    eprintln!("cached read served in {took:?} while a lookup waited on the stalled source");
    source.resume();
    let len = waiting.join().unwrap();
    assert_eq!(len, Some(tree[Path::new("sub/f040.bin")].len() as u64));
    drop(m);
}
