//! A measurement, not a check (ignored by default): fills a `DiskCache`
//! with N one-block files of 1 KiB, then prints the resident memory per
//! cached file and the time to open the cache again with the page cache
//! dropped, from the index and (once, converting) by scanning every file.
//!
//! `LOCAFS_SCALE_FILES=500000 LOCAFS_SCALE_DIR=/var/tmp/x cargo test
//! --release --test disk_cache_scale -- --ignored --nocapture` (check
//! `df -i` first: one inode per file; the directory is removed at the end).

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use locafs::cache::disk::DiskCache;
use locafs::cache::{BlockStore, ChecksummedBytes, FileVersion};
use locafs::obs::stats::Stats;
use locafs::source::SourceVersion;

fn rss() -> u64 {
    common::proc_status(std::process::id(), "VmRSS").unwrap_or(0) * 1024
}

fn file(i: u64) -> FileVersion {
    FileVersion::new(
        Arc::from(PathBuf::from(format!("d{:04}/f{i:07}.jpg", i / 1000)).as_path()),
        SourceVersion {
            size: 1024,
            mtime_ns: 1,
            ino: i,
        },
    )
}

fn open(dir: &Path) -> (DiskCache, locafs::cache::disk::Recovery) {
    DiskCache::open(dir, Some(64 << 30), 1 << 20, Arc::new(Stats::default())).unwrap()
}

#[test]
#[ignore]
fn remount_time_and_memory_per_cached_file() {
    let n: u64 = std::env::var("LOCAFS_SCALE_FILES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500_000);
    let root = PathBuf::from(
        std::env::var("LOCAFS_SCALE_DIR").unwrap_or_else(|_| "/var/tmp/locafs-scale".into()),
    );
    let dir = root.join("ds");
    let base = rss();
    let t = Instant::now();
    {
        let (c, _) = open(&dir);
        let threads = 2;
        std::thread::scope(|s| {
            for th in 0..threads {
                let c = &c;
                s.spawn(move || {
                    for i in (th..n).step_by(threads as usize) {
                        let f = file(i);
                        let mut d = vec![0u8; 1024];
                        d[..8].copy_from_slice(&i.to_le_bytes());
                        assert!(c.put(&f, 0, &ChecksummedBytes::from_source(Bytes::from(d))));
                    }
                });
            }
        });
        let filled = rss();
        eprintln!(
            "filled {n} files in {:.1}s; RSS {} MiB -> {} MiB ({:.0} bytes per file while writing)",
            t.elapsed().as_secs_f64(),
            base >> 20,
            filled >> 20,
            (filled.saturating_sub(base)) as f64 / n as f64
        );
        let t = Instant::now();
        drop(c);
        eprintln!("clean close (checkpoint) {:.2}s", t.elapsed().as_secs_f64());
    }
    for what in ["index", "index again"] {
        common::drop_page_cache();
        let before = rss();
        let t = Instant::now();
        let (c, rec) = open(&dir);
        let took = t.elapsed();
        let after = rss();
        eprintln!(
            "open from the {what} ({} files, from_index {}): {:.2}s; RSS +{} MiB ({:.0} bytes per cached file)",
            rec.files,
            rec.from_index,
            took.as_secs_f64(),
            (after.saturating_sub(before)) >> 20,
            (after.saturating_sub(before)) as f64 / n as f64
        );
        assert_eq!(rec.files, n);
        assert!(c.get(&file(n / 2), 0).is_some());
        drop(c);
    }
    // An older locafs's cache (no index): read once by scanning, converted.
    std::fs::remove_dir_all(dir.join("index")).unwrap();
    common::drop_page_cache();
    let t = Instant::now();
    let (c, rec) = open(&dir);
    eprintln!(
        "open by scanning every file's meta ({} files, converted): {:.2}s",
        rec.files,
        t.elapsed().as_secs_f64()
    );
    drop(c);
    std::fs::remove_dir_all(&root).unwrap();
}

/// The books' memory per cached entry, and the open time, measured without
/// a mount and without data files: an index snapshot of N one-block files is
/// written directly (64 bytes each), then the cache is opened over it. Prints
/// the heap bytes of the books (capacities of the tables) and the RSS growth
/// per entry; asserts nothing about either (figures, not checks).
///
/// `LOCAFS_PROBE_FILES=200000,1000000 cargo test --test disk_cache_scale --
/// --ignored --nocapture books_per_entry` (uses `/var/tmp/wt-mem/probe`, or
/// `LOCAFS_PROBE_DIR`; about 64 MB per million entries, removed at the end).
#[test]
#[ignore]
fn books_per_entry() {
    use locafs::cache::recover::{Index, Put};
    let sizes: Vec<u64> = std::env::var("LOCAFS_PROBE_FILES")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.parse().ok()).collect())
        .unwrap_or_else(|| vec![200_000, 1_000_000]);
    let root = PathBuf::from(
        std::env::var("LOCAFS_PROBE_DIR").unwrap_or_else(|_| "/var/tmp/wt-mem/probe".into()),
    );
    for n in sizes {
        let dir = root.join(format!("n{n}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let puts = (0..n).map(|i| {
            let f = file(i);
            Put {
                key: f.key,
                index: 0,
                size: 1024,
                path_hash: i.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                sum: [i as u8; 16],
                guest: false,
                meta_in_xattr: true,
                table: 0,
            }
        });
        let handle = locafs::sys::private_dir::PrivateDir::create(&dir).unwrap();
        drop(Index::create(&handle, 1 << 20, puts).unwrap());
        for round in ["first", "second"] {
            common::drop_page_cache();
            let before = rss();
            let t = Instant::now();
            let (c, rec) = open(&dir);
            let took = t.elapsed();
            let after = rss();
            assert_eq!(rec.files, n);
            eprintln!(
                "PROBE n={n} {round} open: {:.3}s; books {:.1} B/entry (heap); RSS +{:.1} B/entry",
                took.as_secs_f64(),
                c.books_bytes() as f64 / n as f64,
                after.saturating_sub(before) as f64 / n as f64
            );
            c.crash();
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
