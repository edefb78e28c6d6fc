//! Reads through two mountpoints of one data set at once against reads
//! through one: `cargo bench --bench attach`.
//!
//! One data set of LOCAFS_ATTACH_FILES files (default 8) of
//! LOCAFS_ATTACH_MB MiB each (default 32), mounted at A with `locafs mount
//! --daemon` and attached at B by the same command (docs/operations.md,
//! "Many jobs on one node"), then read once through A so that the cache
//! holds all of it. Each round drops the page cache and reads, in turn:
//!
//! - one reader, every file through A (the figure of one job alone);
//! - two readers at once, each half of the files, both through A: the
//!   baseline of two jobs on one mountpoint;
//! - two readers at once, each half of the files, one through A and one
//!   through B: two jobs on two mountpoints.
//!
//! The two-reader cases go first in turn. It prints the median MB/s of
//! LOCAFS_ATTACH_ROUNDS rounds (default 5) of
//! each reader and in all, the source bytes the reads through B cost (0:
//! the cache serves both), and the ratio two mountpoints / one mountpoint
//! for the two-reader cases (1.0: a second mountpoint costs nothing).
//!
//! LOCAFS_BENCH_DIR (default /var/tmp/locafs-bench-attach) holds the data
//! set, the mountpoints and the cache.

#[path = "../tests/common/mod.rs"]
mod common;

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{bin, force_unmount, fuse_missing, stats_of, try_drop_page_cache, wait_for};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `locafs mount SRC MNT --cache-dir CACHE --daemon`, failing the bench if
/// it fails.
fn mount_daemon(src: &Path, mnt: &Path, cache: &Path) {
    let out = Command::new(bin())
        .arg("mount")
        .args([src, mnt])
        .arg("--cache-dir")
        .arg(cache)
        .arg("--daemon")
        .output()
        .expect("locafs mount");
    assert!(
        out.status.success(),
        "locafs mount {}: {}",
        mnt.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Reads `files` to the end; the bytes read.
fn read_all(files: &[PathBuf]) -> u64 {
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0;
    for p in files {
        let mut f = fs::File::open(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        loop {
            let k = f.read(&mut buf).expect("read");
            if k == 0 {
                break;
            }
            n += k as u64;
        }
    }
    n
}

/// Readers at once, each over its list: each one's MB/s, and all's.
fn readers(lists: Vec<Vec<PathBuf>>) -> (Vec<f64>, f64) {
    let _ = try_drop_page_cache();
    let t0 = Instant::now();
    let handles: Vec<_> = lists
        .into_iter()
        .map(|l| {
            std::thread::spawn(move || {
                let t = Instant::now();
                let n = read_all(&l);
                (n, t.elapsed())
            })
        })
        .collect();
    let done: Vec<(u64, Duration)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let all = t0.elapsed();
    let mbs = |n: u64, d: Duration| n as f64 / 1e6 / d.as_secs_f64();
    let total: u64 = done.iter().map(|d| d.0).sum();
    (
        done.iter().map(|&(n, d)| mbs(n, d)).collect(),
        mbs(total, all),
    )
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    if let Some(why) = fuse_missing() {
        println!("SKIPPED: attach bench: {why}");
        return;
    }
    let files = env_usize("LOCAFS_ATTACH_FILES", 8).max(2);
    let mb = env_usize("LOCAFS_ATTACH_MB", 32);
    let rounds = env_usize("LOCAFS_ATTACH_ROUNDS", 5).max(1);
    let dir = PathBuf::from(
        std::env::var("LOCAFS_BENCH_DIR").unwrap_or_else(|_| "/var/tmp/locafs-bench-attach".into()),
    );
    let (src, a, b, cache) = (
        dir.join("src"),
        dir.join("a"),
        dir.join("b"),
        dir.join("cache"),
    );
    for m in [&b, &a] {
        force_unmount(m);
    }
    let _ = fs::remove_dir_all(&dir);
    for d in [&src, &a, &b] {
        fs::create_dir_all(d).unwrap();
    }
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for i in 0..files {
        let data: Vec<u8> = (0..mb << 20)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        fs::write(src.join(format!("f{i:03}.bin")), data).unwrap();
    }
    mount_daemon(&src, &a, &cache);
    mount_daemon(&src, &b, &cache);
    let names: Vec<String> = (0..files).map(|i| format!("f{i:03}.bin")).collect();
    let under = |m: &Path, part: &[String]| part.iter().map(|n| m.join(n)).collect::<Vec<_>>();
    let (first, second) = names.split_at(files / 2);
    read_all(&under(&a, &names));
    let source_before = stats_of(&a)["source_bytes"].as_u64().unwrap_or(0);

    let (mut one, mut aa, mut aa_each, mut ab, mut ab_each) =
        (vec![], vec![], vec![], vec![], vec![]);
    for round in 0..rounds {
        let (_, all) = readers(vec![under(&a, &names)]);
        one.push(all);
        // (the two cases in turn first: neither gains from going second)
        for case in [round % 2, 1 - round % 2] {
            let other = if case == 0 { &a } else { &b };
            let (each, all) = readers(vec![under(&a, first), under(other, second)]);
            let (v, e) = if case == 0 {
                (&mut aa, &mut aa_each)
            } else {
                (&mut ab, &mut ab_each)
            };
            v.push(all);
            e.extend(each);
        }
    }
    let source_after = stats_of(&b)["source_bytes"].as_u64().unwrap_or(0);
    let (one, aa, aa_each, ab, ab_each) = (
        median(one),
        median(aa),
        median(aa_each),
        median(ab),
        median(ab_each),
    );
    println!(
        "attach: {files} files x {mb} MiB, cached, page cache dropped, median of {rounds} rounds"
    );
    println!("one reader through A             {one:8.0} MB/s");
    println!(
        "two readers, both through A      {aa:8.0} MB/s in all, {aa_each:8.0} MB/s each (baseline)"
    );
    println!("two readers, one via A, one via B {ab:7.0} MB/s in all, {ab_each:8.0} MB/s each");
    println!(
        "ratio two mountpoints / one: {:.2} in all, {:.2} each",
        ab / aa.max(1e-9),
        ab_each / aa_each.max(1e-9)
    );
    println!(
        "source bytes read during the rounds (through A and B): {}",
        source_after.saturating_sub(source_before)
    );

    let _ = Command::new("umount").arg(&b).status();
    let _ = Command::new("umount").arg(&a).status();
    wait_for(Duration::from_secs(20), || {
        !common::is_mounted(&a) && !common::is_mounted(&b)
    });
    let _ = fs::remove_dir_all(&dir);
}
