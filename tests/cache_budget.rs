//! One cache disk shared by many data sets (real mounts over a small
//! tmpfs): one budget for the directory, unmounted data sets evicted first,
//! a data set being read never churned by a neighbour, `locafs cache
//! ls/rm/gc`, and the budget after a `kill -9`.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use serde_json::Value;

const MIB: usize = 1 << 20;

/// `n` files of `size` bytes under `src/name/`, distinct per data set.
fn data_set(root: &Path, name: &str, n: usize, size: usize) -> (PathBuf, Vec<(PathBuf, Vec<u8>)>) {
    let src = root.join(name);
    let mut files = Vec::new();
    for i in 0..n {
        let rel = PathBuf::from(format!("f{i:03}.bin"));
        let tag = name
            .bytes()
            .fold(7u64, |h, b| h.wrapping_mul(131) ^ b as u64);
        let bytes = pattern(tag ^ i as u64, size);
        fs::create_dir_all(&src).unwrap();
        fs::write(src.join(&rel), &bytes).unwrap();
        files.push((rel, bytes));
    }
    (src, files)
}

fn read_all(mnt: &Path, files: &[(PathBuf, Vec<u8>)]) {
    for (rel, want) in files {
        let got = fs::read(mnt.join(rel)).unwrap_or_else(|e| panic!("{}: {e}", rel.display()));
        assert!(
            got == *want,
            "{}: wrong bytes through the mount",
            rel.display()
        );
    }
}

fn cache_ls(cache: &Path) -> Value {
    let out = run_locafs(&[
        "cache".as_ref(),
        "ls".as_ref(),
        "--json".as_ref(),
        "--cache-dir".as_ref(),
        cache.as_os_str(),
    ]);
    assert!(
        out.status.success(),
        "cache ls: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("cache ls --json")
}

fn used_of(ls: &Value, id: &str) -> Option<u64> {
    ls["datasets"]
        .as_array()?
        .iter()
        .find(|d| {
            d["id"]
                .as_str()
                .is_some_and(|s| s == id || s.starts_with(&format!("{id}-")))
        })
        .and_then(|d| d["used"].as_u64())
}

/// Watches a file system's free space until stopped: the least seen. A
/// statvfs that fails ends the watch with a panic, which fails the test at
/// [`FreeWatch::least`] (a watch that saw nothing must not say "never full").
struct FreeWatch {
    stop: Arc<AtomicBool>,
    least: Arc<AtomicU64>,
    samples: Arc<AtomicU64>,
    /// (ms since start, bytes used on the file system), every 250 ms.
    series: Arc<parking_lot::Mutex<Vec<(u64, u64)>>>,
    t: Option<std::thread::JoinHandle<()>>,
}

impl FreeWatch {
    fn start(p: &Path) -> FreeWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let least = Arc::new(AtomicU64::new(u64::MAX));
        let samples = Arc::new(AtomicU64::new(0));
        let series = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let (s, l, n, p, v) = (
            stop.clone(),
            least.clone(),
            samples.clone(),
            p.to_owned(),
            series.clone(),
        );
        let t = std::thread::spawn(move || {
            let t0 = std::time::Instant::now();
            let mut next = 0;
            while !s.load(Relaxed) {
                let st = rustix::fs::statvfs(&p)
                    .unwrap_or_else(|e| panic!("statvfs of the cache disk {p:?}: {e}"));
                l.fetch_min(st.f_bavail * st.f_frsize, Relaxed);
                n.fetch_add(1, Relaxed);
                let ms = t0.elapsed().as_millis() as u64;
                if ms >= next {
                    v.lock()
                        .push((ms, (st.f_blocks - st.f_bfree) * st.f_frsize));
                    next = ms + 250;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        FreeWatch {
            stop,
            least,
            samples,
            series,
            t: Some(t),
        }
    }

    /// The disk use over time, as "t=0.25s 12.0MiB ...".
    fn series(&self) -> String {
        self.series
            .lock()
            .iter()
            .map(|(ms, b)| {
                format!(
                    "t={:.2}s {:.1}MiB",
                    *ms as f64 / 1000.0,
                    *b as f64 / 1048576.0
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The least free space seen; fails the test if the watch failed or
    /// saw nothing.
    fn least(mut self) -> u64 {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.t.take() {
            t.join().expect("the free-space watch failed");
        }
        let n = self.samples.load(Relaxed);
        assert!(n > 0, "the free-space watch took no sample");
        self.least.load(Relaxed)
    }
}

/// How long epochs may run until a data set is cached. Each epoch drops
/// the page cache after a `sync` of the whole machine, which waits on every
/// other writer's dirty data: one epoch took all of 30 s in a CI run while
/// a cache of 2 M files was being written on the same disk. Only a test
/// that fails waits this long.
const UNTIL_CACHED: Duration = Duration::from_secs(120);

#[test]
fn three_data_sets_filling_one_small_disk_at_once_never_fill_it() {
    require_fuse!();
    let s = Scratch::new();
    let tcache = s.path().join("tcache");
    let _disk = Tmpfs::mount(&tcache, "48M");
    // Three data sets of 24 MiB each on a 48 MiB disk, budget derived from
    // it (80 % of free, minus the 5 % floor).
    let sets: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|n| data_set(&s.src, n, 24, MIB))
        .collect();
    let watch = FreeWatch::start(&tcache);
    let mounts: Vec<Mount> = sets
        .iter()
        .enumerate()
        .map(|(i, (src, _))| {
            let mnt = s.path().join(format!("mnt{i}"));
            fs::create_dir_all(&mnt).unwrap();
            Mount::start(src, &mnt, &tcache, &[])
        })
        .collect();
    std::thread::scope(|sc| {
        for (m, (_, files)) in mounts.iter().zip(&sets) {
            sc.spawn(move || {
                for _ in 0..2 {
                    read_all(&m.mnt, files);
                }
            });
        }
    });
    // Two bookings, so that every mount has seen the others.
    std::thread::sleep(Duration::from_millis(2500));
    let ls = cache_ls(&tcache);
    eprintln!(
        "disk use of the 48 MiB cache disk over time: {}",
        watch.series()
    );
    let least = watch.least();
    let budget = ls["budget_bytes"].as_u64().unwrap();
    let used = ls["used_bytes"].as_u64().unwrap();
    eprintln!("budget {budget}, used {used}, least free {least}");
    assert!(budget > 0 && budget < 48 * MIB as u64, "{ls}");
    assert!(
        used <= budget,
        "the data sets hold {used}, over the budget {budget}: {ls}"
    );
    assert!(least > 0, "the cache disk was full");
    // Every mount cached something and reports the shared figures.
    for m in &mounts {
        let st = m.stats();
        assert!(
            st["files_cached"].as_u64() > Some(0),
            "cached nothing: {st}"
        );
        assert!(st["cache_used_bytes"].as_u64() > Some(0), "{st}");
        assert_eq!(st["cache_budget_bytes"].as_u64(), Some(budget), "{st}");
        assert_eq!(st["cache_shares"].as_array().map(Vec::len), Some(3), "{st}");
        assert_eq!(st["read_errors"].as_u64(), Some(0), "{st}");
    }
}

#[test]
fn a_new_data_set_evicts_the_unmounted_one_not_the_one_being_read() {
    require_fuse!();
    let s = Scratch::new();
    let tcache = s.path().join("tcache");
    let _disk = Tmpfs::mount(&tcache, "64M");
    let (src_a, files_a) = data_set(&s.src, "a", 20, MIB);
    let (src_b, files_b) = data_set(&s.src, "b", 20, MIB);
    let (src_c, files_c) = data_set(&s.src, "c", 20, MIB);
    let mk = |n: &str| {
        let p = s.path().join(n);
        fs::create_dir_all(&p).unwrap();
        p
    };
    let (ma, mb, mc) = (mk("ma"), mk("mb"), mk("mc"));
    // A budget for two data sets and a half. The smallest memory tier
    // (--prefetch-memory 8M, 8 blocks), so that an epoch's blocks come from
    // the cache or the source, where the budget decides. A block turned
    // away while the budget was taken stays in the memory tier (read every
    // epoch, it is not evicted there); background prefetch writes it again
    // from there once the refusal's backoff has passed
    // (`WriteBack::take_refused`), with no `locafs warm` here to help.
    let size = ["--cache-size", "50M", "--prefetch-memory", "8M"];
    let mut a = Mount::start(&src_a, &ma, &tcache, &size);
    let b = Mount::start(&src_b, &mb, &tcache, &size);
    // Both booked, and B's grant taken from A's spare room.
    wait_until("B's grant", Duration::from_secs(10), || {
        b.stat("cache_grant_bytes") >= 22 << 20
    });
    // Epochs (each from the cache or the source, not the page cache) until
    // both are cached: the second mount's first booking may find the budget
    // taken by the first until its next booking.
    wait_until("both cached", UNTIL_CACHED, || {
        drop_page_cache();
        read_all(&ma, &files_a);
        read_all(&mb, &files_b);
        let (sa, sb) = (a.stats(), b.stats());
        eprintln!(
            "a: {} files, grant {}, used {}; b: {} files, grant {}, used {}",
            sa["files_cached"],
            sa["cache_grant_bytes"],
            sa["cache_used_bytes"],
            sb["files_cached"],
            sb["cache_grant_bytes"],
            sb["cache_used_bytes"]
        );
        sa["files_cached"].as_u64() >= Some(20) && sb["files_cached"].as_u64() >= Some(20)
    });
    a.unmount();
    let b_before = used_of(&cache_ls(&tcache), "b").unwrap();
    // B goes on reading in epochs while C fills.
    struct StopOnDrop<'a>(&'a AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Relaxed);
        }
    }
    let stop = AtomicBool::new(false);
    std::thread::scope(|sc| {
        let _stop = StopOnDrop(&stop);
        sc.spawn(|| {
            while !stop.load(Relaxed) {
                read_all(&mb, &files_b);
            }
        });
        let c = Mount::start(&src_c, &mc, &tcache, &size);
        // C's room comes from A's cache once C's files are read (its size
        // known).
        wait_until("C cached", UNTIL_CACHED, || {
            drop_page_cache();
            read_all(&mc, &files_c);
            let sc = c.stats();
            eprintln!(
                "c: {} files, grant {}, used {}",
                sc["files_cached"], sc["cache_grant_bytes"], sc["cache_used_bytes"]
            );
            sc["files_cached"].as_u64() >= Some(20)
        });
        let ls = cache_ls(&tcache);
        assert!(c.stat("cache_grant_bytes") >= 22 << 20, "C's grant: {ls}");
        assert!(
            used_of(&ls, "a").unwrap_or(0) < 20 * MIB as u64,
            "A (unmounted) kept its cache: {ls}"
        );
        let b_after = used_of(&ls, "b").unwrap();
        assert!(
            b_after >= b_before,
            "B (mounted, read) lost {} bytes: {ls}",
            b_before - b_after
        );
        assert!(ls["used_bytes"].as_u64().unwrap() <= 50 << 20, "{ls}");
    });
    assert_eq!(b.stat("read_errors"), 0);
}

/// A new data set that fits beside an unmounted one leaves it alone: until
/// 2026-12-05 a first mount, not knowing its size yet, asked for the whole
/// budget and deleted every unmounted data set of the directory at its
/// first booking.
#[test]
fn a_new_data_set_that_fits_deletes_no_unmounted_one() {
    require_fuse!();
    let s = Scratch::new();
    let tcache = s.path().join("tcache");
    let _disk = Tmpfs::mount(&tcache, "128M");
    let (src_a, files_a) = data_set(&s.src, "a", 20, MIB);
    let (src_b, files_b) = data_set(&s.src, "b", 20, MIB);
    let (ma, mb) = (s.path().join("ma"), s.path().join("mb"));
    fs::create_dir_all(&ma).unwrap();
    fs::create_dir_all(&mb).unwrap();
    let size = ["--cache-size", "100M"];
    let mut a = Mount::start(&src_a, &ma, &tcache, &size);
    wait_until("A cached", UNTIL_CACHED, || {
        drop_page_cache();
        read_all(&ma, &files_a);
        a.stats()["files_cached"].as_u64() >= Some(20)
    });
    a.unmount();
    let a_used = used_of(&cache_ls(&tcache), "a").unwrap();
    assert!(a_used >= 20 * MIB as u64, "A's cache: {a_used} bytes");
    let mut b = Mount::start(&src_b, &mb, &tcache, &size);
    // Bookings once a second: three before B reads, then B's epochs until
    // it is cached (its size known).
    std::thread::sleep(Duration::from_millis(3500));
    assert_eq!(
        used_of(&cache_ls(&tcache), "a"),
        Some(a_used),
        "A was deleted before B read anything\n{}",
        b.stderr()
    );
    wait_until("B cached", UNTIL_CACHED, || {
        drop_page_cache();
        read_all(&mb, &files_b);
        b.stats()["files_cached"].as_u64() >= Some(20)
    });
    std::thread::sleep(Duration::from_millis(1500));
    let ls = cache_ls(&tcache);
    assert_eq!(used_of(&ls, "a"), Some(a_used), "{ls}\n{}", b.stderr());
    assert!(!b.stderr().contains("removed data set"), "{}", b.stderr());
    b.unmount();
    // A's cache serves A again.
    let a2 = Mount::start(&src_a, &ma, &tcache, &size);
    read_all(&ma, &files_a);
    assert_eq!(a2.stat("source_reads"), 0, "{}", a2.stderr());
}

#[test]
fn cache_ls_rm_and_gc_never_touch_a_mounted_data_set() {
    require_fuse!();
    let s = Scratch::new();
    let (src_a, files_a) = data_set(&s.src, "a", 4, 64 << 10);
    let (src_b, files_b) = data_set(&s.src, "b", 4, 64 << 10);
    let ma = s.path().join("ma");
    let mb = s.path().join("mb");
    fs::create_dir_all(&ma).unwrap();
    fs::create_dir_all(&mb).unwrap();
    // No free floor: on a machine short of disk space, the cache gives
    // space back by evicting the unmounted data set first, as it should,
    // and A would be gone before `cache ls` looks (seen in a CI run with
    // the disk's free space under 5 %).
    let floor = ["--cache-free-floor", "0"];
    let mut a = Mount::start(&src_a, &ma, &s.cache, &floor);
    let b = Mount::start(&src_b, &mb, &s.cache, &floor);
    read_all(&ma, &files_a);
    read_all(&mb, &files_b);
    wait_until("cached", Duration::from_secs(20), || {
        a.stat("files_cached") >= 4 && b.stat("files_cached") >= 4
    });
    a.unmount();
    std::thread::sleep(Duration::from_millis(1500));
    let ls = cache_ls(&s.cache);
    let sets = ls["datasets"].as_array().unwrap();
    assert_eq!(sets.len(), 2, "{ls}");
    let a_id = sets.iter().find(|d| d["mounted"] == false).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let b_id = sets.iter().find(|d| d["mounted"] == true).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        sets.iter()
            .all(|d| d["used"].as_u64().unwrap() > 0 && d["files"].as_u64().unwrap() > 0),
        "{ls}"
    );
    // The table form names both.
    let out = run_locafs(&[
        "cache".as_ref(),
        "ls".as_ref(),
        "--cache-dir".as_ref(),
        s.cache.as_os_str(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&a_id) && text.contains(&b_id) && text.contains("mounted ("),
        "{text}"
    );
    // rm of the mounted one is refused, and changes nothing.
    let out = run_locafs(&[
        "cache".as_ref(),
        "rm".as_ref(),
        b_id.as_ref(),
        "--cache-dir".as_ref(),
        s.cache.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is mounted"),
        "{out:?}"
    );
    read_all(&mb, &files_b);
    // gc down to nothing removes only the unmounted one.
    let out = run_locafs(&[
        "cache".as_ref(),
        "gc".as_ref(),
        "--to".as_ref(),
        "0".as_ref(),
        "--cache-dir".as_ref(),
        s.cache.as_os_str(),
    ]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("removed {a_id}")),
        "{out:?}"
    );
    // What is left is what `cache ls` shows, and it says why it stays.
    let ls = cache_ls(&s.cache);
    assert_eq!(ls["datasets"].as_array().unwrap().len(), 1, "{ls}");
    let err = String::from_utf8_lossy(&out.stderr);
    let left = used_of(&ls, &b_id).unwrap();
    assert!(
        err.contains(&format!(
            "still {} held",
            locafs::sys::units::format_size(left)
        )) && err.contains(&format!("mounted now, and never removed: {b_id}")),
        "{err} (cache ls: {ls})"
    );
    assert!(s.cache.join(&b_id).is_dir() && !s.cache.join(&a_id).exists());
    assert_eq!(b.stat("read_errors"), 0);
    read_all(&mb, &files_b);
    // A again: cold, and correct.
    let a = Mount::start(&src_a, &ma, &s.cache, &[]);
    read_all(&ma, &files_a);
    drop(a);
    // rm of an unknown name is a clear error.
    let out = run_locafs(&[
        "cache".as_ref(),
        "rm".as_ref(),
        "nope".as_ref(),
        "--cache-dir".as_ref(),
        s.cache.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no data set"),
        "{out:?}"
    );
}

/// The start-up line counts only the other data sets' use, and `cache gc`
/// over a directory where nothing is mounted leaves nothing and says
/// nothing is left (it once subtracted what removal freed on disk from
/// what the ledger booked, and claimed the difference was mounted).
#[test]
fn gc_with_nothing_mounted_empties_the_directory_and_says_nothing_is_left() {
    require_fuse!();
    let s = Scratch::new();
    let (src_a, files_a) = data_set(&s.src, "a", 6, 200 << 10);
    let ma = s.path().join("ma");
    fs::create_dir_all(&ma).unwrap();
    let log = s.path().join("a.log");
    for _ in 0..2 {
        let mut a = Mount::start_logged(&src_a, &ma, &s.cache, &[], &log);
        read_all(&ma, &files_a);
        a.unmount();
    }
    // The second mount's start-up line (the log holds that mount's):
    // alone in the directory, the other data sets hold nothing (not its
    // own 1.2 MiB).
    let text = fs::read_to_string(&log).unwrap();
    assert!(text.contains("recovered 6 files"), "{text}");
    let line = text
        .lines()
        .find(|l| l.contains("other data sets"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains("shares with 0 other data sets (they hold 0 B)"),
        "{line}"
    );
    assert!(used_of(&cache_ls(&s.cache), &dataset_id_of(&s.cache)).unwrap() > 0);
    let out = run_locafs(&[
        "cache".as_ref(),
        "gc".as_ref(),
        "--to".as_ref(),
        "1MiB".as_ref(),
        "--cache-dir".as_ref(),
        s.cache.as_os_str(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("still"), "{err}");
    let ls = cache_ls(&s.cache);
    assert_eq!(ls["datasets"].as_array().unwrap().len(), 0, "{ls}");
}

/// The one data set directory under `cache`.
fn dataset_id_of(cache: &Path) -> String {
    cache_ls(cache)["datasets"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[test]
fn a_kill_9_while_another_fills_leaves_the_budget_right() {
    require_fuse!();
    let s = Scratch::new();
    let tcache = s.path().join("tcache");
    let _disk = Tmpfs::mount(&tcache, "48M");
    let (src_a, files_a) = data_set(&s.src, "a", 24, MIB);
    let (src_b, files_b) = data_set(&s.src, "b", 24, MIB);
    let ma = s.path().join("ma");
    let mb = s.path().join("mb");
    fs::create_dir_all(&ma).unwrap();
    fs::create_dir_all(&mb).unwrap();
    let mut a = Mount::start(&src_a, &ma, &tcache, &[]);
    let b = Mount::start(&src_b, &mb, &tcache, &[]);
    // The serving processes book their share just after the mount is up:
    // the budget is the one both have settled.
    let mut budget = 0;
    assert!(
        wait_for(Duration::from_secs(20), || {
            budget = cache_ls(&tcache)["budget_bytes"].as_u64().unwrap();
            budget > 0
        }),
        "no budget was set: {}",
        cache_ls(&tcache)
    );
    let watch = FreeWatch::start(&tcache);
    std::thread::scope(|sc| {
        sc.spawn(|| read_all(&mb, &files_b));
        read_all(&ma, &files_a[..12]);
        a.kill9_and_detach();
    });
    read_all(&mb, &files_b);
    let a = Mount::start(&src_a, &ma, &tcache, &[]);
    read_all(&ma, &files_a);
    read_all(&mb, &files_b);
    std::thread::sleep(Duration::from_millis(2500));
    let ls = cache_ls(&tcache);
    assert_eq!(
        ls["budget_bytes"].as_u64(),
        Some(budget),
        "the budget changed: {ls}"
    );
    assert!(ls["used_bytes"].as_u64().unwrap() <= budget, "{ls}");
    assert!(watch.least() > 0, "the cache disk was full");
    assert_eq!(a.stat("read_errors") + b.stat("read_errors"), 0);
}

#[test]
fn when_another_program_fills_the_disk_the_cache_gives_space_back() {
    require_fuse!();
    let s = Scratch::new();
    let tcache = s.path().join("tcache");
    let _disk = Tmpfs::mount(&tcache, "48M");
    let (src, files) = data_set(&s.src, "a", 24, MIB);
    let m = Mount::start(&src, &s.mnt, &tcache, &[]);
    wait_until("cached", UNTIL_CACHED, || {
        drop_page_cache();
        read_all(&s.mnt, &files);
        m.stat("files_cached") >= 24
    });
    let before = m.stat("cache_used_bytes");
    // Another program fills the cache disk to 1 MiB of free space, under
    // the floor (5 % of 48 MiB = 2.4 MiB): the cache gives space back.
    let st = rustix::fs::statvfs(&tcache).unwrap();
    let free = (st.f_bavail * st.f_frsize) as usize;
    let filler = tcache.join("someone-else.bin");
    fs::write(&filler, vec![1u8; free - MIB]).expect("the filler fits in the free space");
    let floor = (st.f_blocks * st.f_frsize) / 20;
    wait_until("space given back", Duration::from_secs(10), || {
        let st = rustix::fs::statvfs(&tcache).unwrap();
        st.f_bavail * st.f_frsize >= floor
    });
    let after = m.stat("cache_used_bytes");
    assert!(
        after + floor - MIB as u64 <= before,
        "cache {before} -> {after}"
    );
    assert!(m.stat("cache_budget_effective_bytes") < m.stat("cache_budget_bytes"));
    // Everything still reads right, from the cache or the source.
    drop_page_cache();
    read_all(&s.mnt, &files);
    assert_eq!(m.stat("read_errors"), 0);
}

/// Issue 36: A unmounted, B being read, C mounted: C's booking deletes A
/// for room, as it should. A's directory is renamed away and its files
/// deleted after the ledger's lock; until then the disk's free space does
/// not show A's room, and B, booking in that window, was told to shrink
/// (on a 1 GiB disk B went from 352 to 89 MiB, and read it all again from
/// the source). Here A's cache also holds 30,000 empty files, so that its
/// deletion lasts what a real data set of many files takes on a fast disk
/// (about a second on this tmpfs): several of B's bookings (every 250 ms).
#[test]
fn a_data_set_being_read_loses_nothing_while_a_neighbour_deletes_an_unmounted_one() {
    require_fuse!();
    let s = Scratch::new();
    let tcache = s.path().join("tcache");
    let _disk = Tmpfs::mount(&tcache, "64M");
    let (src_a, files_a) = data_set(&s.src, "a", 24, MIB);
    let (src_b, files_b) = data_set(&s.src, "b", 16, MIB);
    let (src_c, files_c) = data_set(&s.src, "c", 24, MIB);
    let mk = |n: &str| {
        let p = s.path().join(n);
        fs::create_dir_all(&p).unwrap();
        p
    };
    let (ma, mb, mc) = (mk("ma"), mk("mb"), mk("mc"));
    // Room for A and B (about 27.5 and 19 MiB with their overhead), and
    // for B and C, not for all three.
    let size = ["--cache-size", "50M", "--prefetch-memory", "8M"];
    let mut a = Mount::start(&src_a, &ma, &tcache, &size);
    let b = Mount::start(&src_b, &mb, &tcache, &size);
    wait_until("A and B cached", UNTIL_CACHED, || {
        drop_page_cache();
        read_all(&ma, &files_a);
        read_all(&mb, &files_b);
        a.stat("files_cached") >= 24 && b.stat("files_cached") >= 16
    });
    a.unmount();
    let a_dir = fs::read_dir(&tcache)
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with("a-"))
        .expect("A's cache directory")
        .path();
    let junk = a_dir.join("many-files");
    fs::create_dir_all(&junk).unwrap();
    for i in 0..30_000 {
        fs::File::create(junk.join(format!("{i}"))).unwrap();
    }
    // B's epochs from its cache: nothing from the source from here on.
    let (b_used, b_reads) = (b.stat("cache_used_bytes"), b.stat("source_reads"));
    let least = AtomicU64::new(u64::MAX);
    let stop = AtomicBool::new(false);
    std::thread::scope(|sc| {
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Relaxed);
            }
        }
        let _stop = StopOnDrop(&stop);
        sc.spawn(|| {
            while !stop.load(Relaxed) {
                read_all(&mb, &files_b);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        sc.spawn(|| {
            while !stop.load(Relaxed) {
                least.fetch_min(b.stat("cache_used_bytes"), Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let c = Mount::start(&src_c, &mc, &tcache, &size);
        wait_until("C cached", UNTIL_CACHED, || {
            drop_page_cache();
            read_all(&mc, &files_c);
            c.stat("files_cached") >= 24
        });
        assert!(
            !a_dir.exists(),
            "A (unmounted) was not deleted: {}",
            cache_ls(&tcache)
        );
        assert!(c.stderr().contains("removed data set"), "{}", c.stderr());
        // Two more bookings of B after C's last.
        std::thread::sleep(Duration::from_millis(600));
    });
    let least = least.load(Relaxed);
    let ls = cache_ls(&tcache);
    eprintln!("B held {b_used} bytes, {least} at least while C filled: {ls}");
    assert_eq!(
        b.stat("source_reads"),
        b_reads,
        "B (mounted, read) read from the source again: it lost cached bytes\n{ls}"
    );
    assert!(
        least >= b_used,
        "B (mounted, read) went from {b_used} to {least} cached bytes: {ls}"
    );
    assert!(ls["used_bytes"].as_u64().unwrap() <= 50 << 20, "{ls}");
    assert_eq!(b.stat("read_errors"), 0);
    assert!(
        fs::read_dir(&tcache)
            .unwrap()
            .flatten()
            .all(|e| !e.file_name().to_string_lossy().starts_with(".trash")),
        "a deletion was left behind"
    );
    let ledger: Value = serde_json::from_slice(&fs::read(tcache.join("budget.json")).unwrap())
        .expect("budget.json");
    assert_eq!(ledger["deleting"], serde_json::json!({}), "{ledger}");
}

#[test]
fn cache_ls_accepts_a_cache_directory_reached_through_a_symlink_as_mount_does() {
    require_fuse!();
    let s = Scratch::new();
    let (src, files) = data_set(&s.src, "a", 3, 64 << 10);
    // /var/cache/locafs as a link to the cache disk.
    let link = s.path().join("cache-link");
    fs::create_dir_all(&s.cache).unwrap();
    std::os::unix::fs::symlink(&s.cache, &link).unwrap();
    let mut m = Mount::start(&src, &s.mnt, &link, &[]);
    read_all(&s.mnt, &files);
    m.unmount();
    let through_link = cache_ls(&link);
    assert_eq!(
        through_link["datasets"].as_array().map(Vec::len),
        Some(1),
        "{through_link}"
    );
    assert_eq!(
        used_of(&through_link, &dataset_id_of(&s.cache)),
        used_of(&cache_ls(&s.cache), &dataset_id_of(&s.cache))
    );
}
