//! A restart after a crash against a clean remount: `cargo bench --bench
//! restart`.
//!
//! One data set (LOCAFS_RESTART_FILES files of 64 KiB, default 20,000, in
//! directories of 1,000, read once so that the cache holds all of it), one
//! cache directory. Each round does, in turn:
//!
//! - a clean remount, the baseline: `umount MNT`, wait for the daemon to
//!   exit, then `locafs mount SRC MNT --daemon`;
//! - a restart after a crash, as docs/operations.md tells it: `ls -la MNT`,
//!   `stat MNT`, `kill -9` of the daemon, then the same `locafs mount SRC
//!   MNT --daemon` over the dead mount it left.
//!
//! Each time is from the command's start until it returns with the mount
//! live (then a file is read through it to be sure). It prints the median
//! and the slowest of LOCAFS_RESTART_ROUNDS rounds (default 10) of each,
//! and the ratio restart / remount. Before the dead mount was recognised
//! by a `statfs` the restart failed (exit 2, "something is already mounted
//! there") for as long as the kernel trusted the attributes it had cached
//! of the mountpoint, about a minute.
//!
//! LOCAFS_BENCH_DIR (default /var/tmp/locafs-bench-restart) holds the data
//! set, the mountpoint and the cache.

#[path = "../tests/common/mod.rs"]
mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{alive, bin, force_unmount, signal, wait_for, Signal};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `locafs mount SRC MNT --cache-dir CACHE --daemon`: how long until it
/// returned (the mount live), failing the bench if it did not mount.
fn mount_daemon(src: &Path, mnt: &Path, cache: &Path) -> Duration {
    let t0 = Instant::now();
    let out = Command::new(bin())
        .arg("mount")
        .args([src, mnt])
        .arg("--cache-dir")
        .arg(cache)
        .arg("--daemon")
        .output()
        .expect("locafs mount");
    let took = t0.elapsed();
    assert!(
        out.status.success(),
        "locafs mount failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

fn daemon_pid(cache: &Path) -> u32 {
    let ds = fs::read_dir(cache)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.is_dir())
        .expect("the data set's cache");
    fs::read_to_string(ds.join("lock"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    require_fuse!();
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if !std::env::args().any(|a| a == "--bench") {
        println!("restart: run with `cargo bench --bench restart`");
        return;
    }
    let files = env_usize("LOCAFS_RESTART_FILES", 20_000);
    let rounds = env_usize("LOCAFS_RESTART_ROUNDS", 10).max(1);
    let root = PathBuf::from(
        std::env::var("LOCAFS_BENCH_DIR")
            .unwrap_or_else(|_| "/var/tmp/locafs-bench-restart".into()),
    );
    let (src, mnt, cache) = (root.join("src"), root.join("mnt"), root.join("cache"));
    force_unmount(&mnt);
    let _ = fs::remove_dir_all(&cache);
    let ready = root.join(format!("ready-{files}"));
    if !ready.exists() {
        let _ = fs::remove_dir_all(&src);
        for i in 0..files {
            let dir = src.join(format!("d{:03}", i / 1000));
            if i % 1000 == 0 {
                fs::create_dir_all(&dir).unwrap();
            }
            fs::write(
                dir.join(format!("f{i:06}.bin")),
                common::pattern(i as u64, 64 << 10),
            )
            .unwrap();
        }
        fs::write(&ready, b"").unwrap();
    }
    fs::create_dir_all(&mnt).unwrap();
    fs::create_dir_all(&cache).unwrap();

    // Fill the cache: every file read once, and written back.
    mount_daemon(&src, &mnt, &cache);
    let mut pid = daemon_pid(&cache);
    common::walk_files(&mnt, &mut |p| {
        fs::read(p).unwrap();
    });
    let filled = wait_for(Duration::from_secs(300), || {
        common::try_stats_of(&mnt).is_some_and(|v| v["files_cached"] == files as u64)
    });
    assert!(filled, "the cache did not fill");
    let probe = mnt.join("d000/f000000.bin");

    let (mut clean, mut crash) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        // The baseline: unmount, then mount.
        assert!(Command::new("umount").arg(&mnt).status().unwrap().success());
        assert!(wait_for(Duration::from_secs(60), || !alive(pid)));
        clean.push(mount_daemon(&src, &mnt, &cache).as_secs_f64());
        fs::read(&probe).unwrap();
        pid = daemon_pid(&cache);

        // A crash: what a user did before, kill -9, the same command.
        Command::new("ls").arg("-la").arg(&mnt).output().unwrap();
        Command::new("stat").arg(&mnt).output().unwrap();
        signal(pid, Signal::KILL).unwrap();
        assert!(wait_for(Duration::from_secs(60), || !alive(pid)));
        crash.push(mount_daemon(&src, &mnt, &cache).as_secs_f64());
        fs::read(&probe).unwrap();
        pid = daemon_pid(&cache);
    }
    assert!(Command::new("umount").arg(&mnt).status().unwrap().success());
    let _ = wait_for(Duration::from_secs(60), || !alive(pid));

    let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    let (cm, xm) = (max(&clean), max(&crash));
    let (c, x) = (median(&mut clean), median(&mut crash));
    println!("restart: {files} files of 64 KiB, all cached; {rounds} rounds");
    println!("| figure | clean remount | restart after kill -9 | ratio |");
    println!("|---|---|---|---|");
    println!(
        "| `locafs mount --daemon` until live, median | {:.0} ms | {:.0} ms | {:.2} |",
        c * 1e3,
        x * 1e3,
        x / c
    );
    println!(
        "| the same, slowest | {:.0} ms | {:.0} ms | {:.2} |",
        cm * 1e3,
        xm * 1e3,
        xm / cm
    );
    let _ = fs::remove_dir_all(&cache);
}
