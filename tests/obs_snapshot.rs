//! One stats snapshot for every reader (`locafs stats`, the stats xattr,
//! the Prometheus exporter): on a real in-process mount, the xattr carries
//! the parts the cache and read-ahead own, the in-process snapshot agrees
//! with it, and the views the mount plugs into its stats hold the engine
//! only weakly, so that dropping the mount frees the engine.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::inproc::{config, mount};
use common::{snapshot as stats, Scratch};
use locafs::source::{DirSource, Source};

fn wait_until(what: &str, f: impl FnMut() -> bool) {
    common::wait_until(what, Duration::from_secs(30), f)
}

#[test]
fn one_snapshot_with_every_part_and_the_mount_frees_the_engine() {
    require_fuse!();
    let d = Scratch::new();
    let files: Vec<(String, Vec<u8>)> = (0..3u8)
        .map(|i| {
            (
                format!("f{i}"),
                vec![i.wrapping_mul(37); 100_000 + i as usize],
            )
        })
        .collect();
    for (n, data) in &files {
        std::fs::write(d.src.join(n), data).unwrap();
    }
    let total: u64 = files.iter().map(|(_, b)| b.len() as u64).sum();
    let cfg = config(&d, &["--cache-size", "64MiB", "--no-passthrough"]);
    let source: Arc<dyn Source> = Arc::new(DirSource::new(cfg.source.clone()));
    let m = mount(&cfg, source);
    for (n, data) in &files {
        assert!(std::fs::read(d.mnt.join(n)).unwrap() == *data, "{n}");
    }
    // Through the xattr, as `locafs stats` reads it.
    wait_until("every file cached and listed for read-ahead", || {
        let s = stats(&d.mnt);
        s.files_cached == files.len() as u64 && s.read_ahead.epoch_files_total == files.len() as u64
    });
    let s = stats(&d.mnt);
    assert_eq!(s.mountpoint, cfg.mountpoint.display().to_string());
    assert_eq!(s.source, cfg.source.display().to_string());
    // The cache's part.
    assert_eq!(s.cache_capacity_bytes, 64 << 20);
    assert!(s.cache_used_bytes >= total, "{s:?}");
    assert!(s.cache_writable);
    // Read-ahead's part.
    assert_eq!(s.read_ahead.epoch_files_read, files.len() as u64, "{s:?}");
    assert!(s.read_ahead.prefetch_memory_limit > 0, "{s:?}");
    // The memory tier is for the exporter only: not in the JSON schema.
    assert_eq!(s.memory_cache_bytes, 0);

    // In process, the same snapshot (plus the memory tier).
    let mine = m.stats().full_snapshot(&s.source, &s.mountpoint);
    assert_eq!(mine.read_ahead, s.read_ahead);
    assert_eq!(mine.files_cached, s.files_cached);
    assert_eq!(mine.cache_capacity_bytes, s.cache_capacity_bytes);
    assert_eq!(mine.source_bytes, s.source_bytes);
    assert!(mine.memory_cache_bytes > 0, "{mine:?}");

    // The views hold the cache, the reader and read-ahead weakly (each of
    // them holds the stats, which the source guard's idle threads may keep
    // a while): the mount gone, read-ahead is gone.
    let readahead = Arc::downgrade(m.readahead());
    drop(m);
    wait_until("read-ahead freed after the mount", || {
        readahead.upgrade().is_none()
    });
}
