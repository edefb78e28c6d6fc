//! A listing reads names and kinds only (issue 14): the entries'
//! attributes are read from the source when they are first used (LOOKUP,
//! GETATTR, a READDIRPLUS that returns them), so a cold walk that needs no
//! attributes (`find`, an image-folder scan) costs the source only its
//! directories. Through real FUSE mounts over a real directory behind a
//! recording source that can make one entry's stat hang.

mod common;

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use common::inproc::{config, mount};
use common::Scratch;
use locafs::source::SourceAttr;
use locafs::testing::{Call, Hook, Hooked};

/// The name whose stat hangs while `Recorder::hang` is set.
const HANG: &str = "hang.bin";

/// A real directory that records every entry whose attributes were read
/// (a `stat`, or each entry of a listing with attributes, which stats
/// them all), and whose stat of `HANG` hangs while armed (as one file on a
/// hung NFS server would).
type Recording = Hooked<Recorder>;

#[derive(Default)]
struct Recorder {
    statted: Mutex<Vec<PathBuf>>,
    hang: Mutex<bool>,
    released: Condvar,
}

impl Recorder {
    fn new(root: &Path) -> Arc<Recording> {
        Arc::new(Hooked::wrap(root, Recorder::default()))
    }

    fn statted(&self) -> Vec<PathBuf> {
        self.statted.lock().unwrap().clone()
    }

    fn clear(&self) {
        self.statted.lock().unwrap().clear();
    }

    fn arm(&self) {
        *self.hang.lock().unwrap() = true;
    }

    fn release(&self) {
        *self.hang.lock().unwrap() = false;
        self.released.notify_all();
    }

    /// Records a read of `rel`'s attributes (hanging there if armed).
    fn attrs_of(&self, rel: &Path) {
        self.statted.lock().unwrap().push(rel.to_owned());
        if rel.file_name() == Some(HANG.as_ref()) {
            let mut h = self.hang.lock().unwrap();
            while *h {
                h = self.released.wait(h).unwrap();
            }
        }
    }
}

impl Hook for Recorder {
    fn around<T>(&self, call: Call<'_>, real: impl FnOnce() -> T) -> T {
        if let Call::Stat(rel) = call {
            self.attrs_of(rel);
        }
        real()
    }
    fn listed(&self, rel: &Path, entries: &[(OsString, SourceAttr)]) {
        for (name, _) in entries {
            self.attrs_of(&rel.join(name));
        }
    }
}

/// `src/d` with `n` files `f0000`... of different sizes.
fn files(d: &Scratch, n: usize) -> PathBuf {
    let dir = d.src.join("d");
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..n {
        std::fs::write(dir.join(format!("f{i:04}")), vec![b'x'; 1 + i % 97]).unwrap();
    }
    dir
}

/// The names of a directory, as `find` or an image-folder scan reads them
/// (getdents only: names and d_type).
fn names(dir: &Path) -> Vec<(String, bool)> {
    let mut v: Vec<(String, bool)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            (name, e.file_type().unwrap().is_dir())
        })
        .collect();
    v.sort();
    v
}

#[test]
fn a_listing_stats_no_entry_and_a_lookup_stats_exactly_that_one() {
    require_fuse!();
    let d = Scratch::new();
    let n = 2000;
    let src_dir = files(&d, n);
    let src = Recorder::new(&d.src);
    let m = mount(&config(&d, &["--no-readahead"]), src.clone());
    let dir = m.mountpoint().join("d");
    std::fs::metadata(&dir).unwrap();
    src.clear();
    // The whole listing, names and kinds right.
    assert_eq!(names(&dir), names(&src_dir));
    // No entry stat-ed at the source: the first READDIRPLUS the kernel
    // asks for answers from what is known, and it asks for plain READDIR
    // after that, unless lookups follow.
    let statted = src.statted();
    assert!(
        statted.is_empty(),
        "a listing of {n} entries stat-ed {} of them at the source",
        statted.len()
    );
    // A lookup of an entry not stat-ed yet stats exactly that entry, and
    // its attributes are the source's.
    let name = format!("f{:04}", n - 1);
    assert!(!statted.contains(&Path::new("d").join(&name)));
    src.clear();
    let through = std::fs::symlink_metadata(dir.join(&name)).unwrap();
    let direct = std::fs::symlink_metadata(src_dir.join(&name)).unwrap();
    assert_eq!(src.statted(), vec![Path::new("d").join(&name)]);
    assert_eq!(through.len(), direct.len());
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        (through.mtime(), through.mtime_nsec()),
        (direct.mtime(), direct.mtime_nsec())
    );
    assert_eq!(through.mode(), direct.mode());
}

/// `ls -ln` shows through the mount exactly what it shows on the source
/// (sizes, times, modes, links, the blocks total), cold.
#[test]
fn ls_l_shows_the_sources_attributes() {
    require_fuse!();
    let d = Scratch::new();
    let src_dir = files(&d, 600);
    std::fs::create_dir(src_dir.join("sub")).unwrap();
    std::os::unix::fs::symlink("f0001", src_dir.join("link")).unwrap();
    let src = Recorder::new(&d.src);
    let m = mount(&config(&d, &["--no-readahead"]), src.clone());
    let ls = |p: &Path| {
        let out = Command::new("ls")
            .args(["-ln", "--time-style=full-iso"])
            .arg(p)
            .output()
            .unwrap();
        assert!(out.status.success(), "ls {p:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    std::fs::metadata(m.mountpoint().join("d")).unwrap();
    src.clear();
    let through = ls(&m.mountpoint().join("d"));
    let direct = ls(&src_dir);
    assert_eq!(through.lines().count(), 1 + 600 + 2);
    assert_eq!(through, direct);
    // Each entry stat-ed at the source about once: READDIRPLUS, lookups
    // and their stat-ahead overlap (an entry whose stat is in flight for
    // one is asked again by another), the more so on a loaded machine
    // (602 + 75 and + 118 seen with the other tests of this file running
    // alongside), never for every entry (2 x 602).
    let mut statted = src.statted();
    let all = statted.len();
    statted.sort();
    statted.dedup();
    assert_eq!(statted.len(), 602, "entries stat-ed");
    assert!(all <= 602 * 3 / 2, "{all} stats for 602 entries");
    // And once more, warm.
    assert_eq!(ls(&m.mountpoint().join("d")), direct);
}

#[test]
fn a_stat_that_hangs_times_out_while_the_listing_answers() {
    require_fuse!();
    let d = Scratch::new();
    let src_dir = files(&d, 40);
    std::fs::write(src_dir.join(HANG), b"never seen").unwrap();
    let src = Recorder::new(&d.src);
    let m = mount(
        &config(&d, &["--no-readahead", "--metadata-timeout", "1s"]),
        src.clone(),
    );
    // Released whatever happens, so that the guard's thread ends.
    struct Release(Arc<Recording>);
    impl Drop for Release {
        fn drop(&mut self) {
            self.0.release();
        }
    }
    let _release = Release(src.clone());
    let dir = m.mountpoint().join("d");
    std::fs::metadata(&dir).unwrap();
    // Known before the source hangs.
    std::fs::symlink_metadata(dir.join("f0007")).unwrap();
    src.arm();
    // The listing answers, every name in it.
    let t = Instant::now();
    let listed = std::fs::read_dir(&dir).and_then(|it| {
        it.map(|e| e.map(|e| e.file_name()))
            .collect::<io::Result<Vec<_>>>()
    });
    let listed = listed.unwrap_or_else(|e| panic!("the listing failed: {e}"));
    assert_eq!(listed.len(), 41);
    assert!(listed.iter().any(|n| n == HANG));
    eprintln!("listing with one hung entry: {:?}", t.elapsed());
    // The hung entry's stat fails with ETIMEDOUT after the deadline (not
    // made-up attributes, not a hang); what is known answers.
    let t = Instant::now();
    let e = std::fs::symlink_metadata(dir.join(HANG)).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ETIMEDOUT), "{e}");
    // (A deadline of 1 s: the bound is far from it, and far from a hang.)
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    assert_eq!(
        std::fs::symlink_metadata(dir.join("f0007")).unwrap().len(),
        8
    );
    // Once the source answers, so does the entry.
    src.release();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match std::fs::symlink_metadata(dir.join(HANG)) {
            Ok(a) => {
                assert_eq!(a.len(), 10);
                break;
            }
            Err(e) if Instant::now() < deadline => {
                eprintln!("after release: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("{HANG} after the source answered: {e}"),
        }
    }
}

/// The manifest saved after a walk that stat-ed nothing holds the entries
/// flagged: the next mount lists nothing at the source, and the first
/// lookup of such an entry stats it (its attributes are the source's, not
/// the placeholders).
#[test]
fn a_remount_after_a_walk_keeps_entries_only_listed_flagged() {
    require_fuse!();
    let d = Scratch::new();
    let n = 1000;
    let src_dir = files(&d, n);
    let cfg = config(&d, &["--no-readahead", "--immutable"]);
    let last = Path::new("d").join(format!("f{:04}", n - 1));
    let first_walk = {
        let src = Recorder::new(&d.src);
        let m = mount(&cfg, src.clone());
        let walk = names(&m.mountpoint().join("d"));
        // One entry stat-ed on this mount: known on the next.
        std::fs::symlink_metadata(m.mountpoint().join("d/f0500")).unwrap();
        assert!(!src.statted().contains(&last));
        drop(m);
        walk
    };
    assert_eq!(first_walk, names(&src_dir));
    let src = Recorder::new(&d.src);
    let m = mount(&cfg, src.clone());
    let dir = m.mountpoint().join("d");
    std::fs::symlink_metadata(&dir).unwrap();
    assert_eq!(names(&dir), first_walk);
    src.clear();
    // Stat-ed on the first mount: no stat now.
    let a = std::fs::symlink_metadata(dir.join("f0500")).unwrap();
    assert_eq!(a.len(), 1 + 500 % 97);
    assert_eq!(src.statted(), Vec::<PathBuf>::new());
    // Only listed: stat-ed now, once, and right.
    let a = std::fs::symlink_metadata(m.mountpoint().join(&last)).unwrap();
    assert_eq!(a.len(), (1 + (n - 1) % 97) as u64);
    assert_eq!(src.statted(), vec![last]);
}

/// `locafs where` (issue 15) answers owners from the listing alone: over a
/// cold mount of 2000 files it stats none of them, in either form, and a
/// file read through the mount is reported cached.
#[test]
fn where_answers_from_listings_without_a_stat() {
    require_fuse!();
    use locafs::mount::control::{Client, Request};
    let d = Scratch::new();
    let n = 2000;
    files(&d, n);
    let src = Recorder::new(&d.src);
    let m = mount(&config(&d, &["--no-readahead"]), src.clone());
    let mut c = Client::connect(m.mountpoint()).unwrap();
    // (Connecting reads the root's extended attribute: a stat of "".)
    src.clear();
    let all = c
        .call(&Request::Where {
            paths: None,
            joined: None,
            payload: None,
            packed: true,
        })
        .unwrap();
    assert!(all.ok, "{:?}", all.error);
    assert_eq!(all.files, n as u64);
    let paths = all.paths_joined.clone().unwrap();
    let listed: Vec<&str> = paths.split('\0').collect();
    assert_eq!(listed.len(), n);
    assert_eq!(listed[0], "d/f0000");
    assert_eq!(all.where_owners().unwrap(), vec![Some(0); n]);
    assert_eq!(all.where_cached().unwrap(), vec![false; n]);
    assert_eq!(src.statted(), Vec::<PathBuf>::new(), "where stat-ed files");

    // By paths: one read through the mount shows as cached; a name the
    // listing lacks is not found; still no stat beyond the read's own.
    std::fs::read(m.mountpoint().join("d/f0007")).unwrap();
    // (The paths as a raw payload after the line, as the Python package
    // sends them.)
    let asked = b"d/f0007\0d/f1999\0d/nothere\0d";
    let mut ask = || {
        let req = Request::Where {
            paths: None,
            joined: None,
            payload: Some(asked.len() as u64),
            packed: true,
        };
        c.call_with(&req, asked).unwrap()
    };
    common::wait_until("f0007 cached", Duration::from_secs(10), || {
        ask().where_cached().unwrap()[0]
    });
    src.clear();
    let some = ask();
    assert!(some.ok, "{:?}", some.error);
    assert_eq!(
        some.where_owners().unwrap(),
        vec![Some(0), Some(0), None, None]
    );
    assert_eq!(some.unknown, 2);
    assert!(some.paths_joined.is_none());
    let cached = some.where_cached().unwrap();
    assert_eq!(cached, vec![true, false, false, false]);
    assert_eq!(src.statted(), Vec::<PathBuf>::new(), "where stat-ed files");
}
