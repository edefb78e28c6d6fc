//! `cargo bench --bench survive`: what a reader sees when the process
//! serving a mount dies and the holder starts another, with the defaults.
//! It prints, each beside the same measure without a restart:
//!
//! 1. the longest read during a kill: readers open a cached file, read
//!    64 KiB at a random offset and close it, in a loop, while the server
//!    is SIGKILLed 20 times; for each kill the longest operation that
//!    overlapped it (from the kill to 0.5 s after the new server answers),
//!    median and maximum over the 20 kills, beside the longest operation
//!    of 20 windows as long without a kill;
//! 2. the time from a kill to the first answered request with 1 M files in
//!    the namespace (a tree of 1,000 directories of 1,000 empty files,
//!    walked through the mount first): a request sent right after the
//!    kill (the `user.locafs.ping` attribute, which waits for the next
//!    server), median of 5 kills, beside the same request without a kill,
//!    and beside a remount of the same tree (unmount, mount over the
//!    manifest, first answer): what a restart would cost without the
//!    shared state;
//! 3. the time of a takeover (`locafs mount` with a copy of the binary at
//!    another path over the live mount, until its server answers), median
//!    of 5, and the longest read during one beside the same without.
//!
//! Between two kills the new server answers 100 requests (a server that
//! dies before it served anything counts toward the holder's crash-loop
//! bound, which would add its waits to the figures).
//!
//! The 1 M-file tree is built once under `LOCAFS_BENCH_DIR` (default
//! /var/tmp/locafs-bench-survive; about 1 M inodes and 40 MB) and kept;
//! `LOCAFS_SURVIVE_FILES` sets its size, `LOCAFS_SURVIVE_ONLY` the figures
//! (e.g. `2` or `1,3`). It measures and asserts nothing. Root and
//! /dev/fuse are needed (else it says SKIPPED).

#[path = "../tests/common/mod.rs"]
mod common;

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::restart::{kill_server, server_pid};
use common::{stats_of, wait_until, Mount, Rng};

const KILLS: usize = 20;
const READERS: usize = 4;
const SMALL_FILES: usize = 200;
const SMALL_SIZE: usize = 256 << 10;

fn main() {
    require_fuse!();
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let root = PathBuf::from(
        std::env::var("LOCAFS_BENCH_DIR")
            .unwrap_or_else(|_| "/var/tmp/locafs-bench-survive".into()),
    );
    let n_files: usize = std::env::var("LOCAFS_SURVIVE_FILES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    fs::create_dir_all(&root).expect("bench dir");
    let only = std::env::var("LOCAFS_SURVIVE_ONLY").unwrap_or_else(|_| "1,2,3".into());
    let on = |k: &str| only.split(',').any(|x| x.trim() == k);
    println!("survive bench (defaults; debug info on, release build)");
    if on("1") {
        reads_through_kills(&root);
    }
    if on("2") {
        kill_to_first_answer(&root, n_files);
    }
    if on("3") {
        takeovers(&root);
    }
}

/// One operation of a reader: when it started and how long it took.
type Op = (Instant, Duration);

/// Readers opening a random file, reading 64 KiB at a random offset and
/// closing it, until `stop`; every operation's start and duration, and
/// the failures.
fn readers(mnt: &Path, stop: &Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<(Vec<Op>, u64)>> {
    (0..READERS)
        .map(|t| {
            let (mnt, stop) = (mnt.to_owned(), Arc::clone(stop));
            std::thread::spawn(move || {
                let mut rng = Rng(t as u64 + 1);
                let (mut ops, mut failed) = (Vec::new(), 0);
                let mut buf = vec![0u8; 64 << 10];
                while !stop.load(Relaxed) {
                    let i = rng.below(SMALL_FILES as u64);
                    let off = rng.below((SMALL_SIZE - buf.len()) as u64);
                    let t0 = Instant::now();
                    let r = fs::File::open(mnt.join(format!("f{i:04}")))
                        .and_then(|f| f.read_exact_at(&mut buf, off));
                    ops.push((t0, t0.elapsed()));
                    if r.is_err() {
                        failed += 1;
                    }
                }
                (ops, failed)
            })
        })
        .collect()
}

fn collect(handles: Vec<std::thread::JoinHandle<(Vec<Op>, u64)>>) -> (Vec<Op>, u64) {
    let (mut all, mut failed) = (Vec::new(), 0);
    for h in handles {
        let (o, f) = h.join().expect("reader");
        all.extend(o);
        failed += f;
    }
    (all, failed)
}

/// The longest operation that overlapped [from, to].
fn longest(ops: &[Op], from: Instant, to: Instant) -> Duration {
    ops.iter()
        .filter(|(s, d)| *s <= to && *s + *d >= from)
        .map(|(_, d)| *d)
        .max()
        .unwrap_or_default()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NAN, f64::max)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn small_tree(root: &Path) -> PathBuf {
    let src = root.join("small");
    if !src.join(".complete").exists() {
        fs::create_dir_all(&src).unwrap();
        for i in 0..SMALL_FILES {
            fs::write(
                src.join(format!("f{i:04}")),
                common::pattern(i as u64, SMALL_SIZE),
            )
            .unwrap();
        }
        fs::write(src.join(".complete"), b"").unwrap();
    }
    src
}

/// A fresh mountpoint and cache for `name`.
fn dirs(root: &Path, name: &str) -> (PathBuf, PathBuf) {
    let (mnt, cache) = (
        root.join(format!("{name}-mnt")),
        root.join(format!("{name}-cache")),
    );
    common::force_unmount(&mnt);
    let _ = fs::remove_dir_all(&cache);
    fs::create_dir_all(&mnt).unwrap();
    fs::create_dir_all(&cache).unwrap();
    (mnt, cache)
}

/// The mount of the small tree, every file cached.
fn warm_mount(root: &Path, name: &str) -> (Mount, PathBuf) {
    let src = small_tree(root);
    let (mnt, cache) = dirs(root, name);
    let m = Mount::start(&src, &mnt, &cache, &[]);
    for i in 0..SMALL_FILES {
        let _ = fs::read(mnt.join(format!("f{i:04}")));
    }
    wait_until("every file cached", Duration::from_secs(300), || {
        stats_of(&mnt)["files_cached"].as_u64() >= Some(SMALL_FILES as u64)
    });
    (m, cache)
}

fn reads_through_kills(root: &Path) {
    let (mut m, cache) = warm_mount(root, "kills");
    let mnt = m.mnt.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let h = readers(&mnt, &stop);
    // Without kills: 20 windows of 2 s.
    std::thread::sleep(Duration::from_millis(500));
    let mut windows = Vec::new();
    for _ in 0..KILLS {
        let from = Instant::now();
        std::thread::sleep(Duration::from_secs(2));
        windows.push((from, Instant::now()));
    }
    // Kills, 2 s apart.
    let mut kills = Vec::new();
    for _ in 0..KILLS {
        std::thread::sleep(Duration::from_millis(1500));
        let at = Instant::now();
        let old = kill_server(&mnt);
        while server_pid(&mnt).is_none_or(|p| p == old) {
            std::thread::sleep(Duration::from_millis(2));
        }
        let up = Instant::now();
        kills.push((at, up + Duration::from_millis(500), up - at));
    }
    std::thread::sleep(Duration::from_millis(600));
    stop.store(true, Relaxed);
    let (ops, failed) = collect(h);
    let mut base: Vec<f64> = windows
        .iter()
        .map(|(a, b)| ms(longest(&ops, *a, *b)))
        .collect();
    let mut during: Vec<f64> = kills
        .iter()
        .map(|(a, b, _)| ms(longest(&ops, *a, *b)))
        .collect();
    let mut back: Vec<f64> = kills.iter().map(|(_, _, d)| ms(*d)).collect();
    let (bm, bx, dm, dx) = (
        median(&mut base),
        max(&base),
        median(&mut during),
        max(&during),
    );
    println!(
        "1. longest read (open + 64 KiB pread + close, {READERS} readers, cached files), over {KILLS} windows"
    );
    println!("   without a kill:   median {bm:8.1} ms   max {bx:8.1} ms");
    println!(
        "   during a kill:    median {dm:8.1} ms   max {dx:8.1} ms   (x{:.1} the median without)",
        dm / bm
    );
    println!(
        "   kill to the next server's answer: median {:.1} ms, max {:.1} ms; {} reads, {failed} failed",
        median(&mut back),
        max(&back),
        ops.len()
    );
    m.unmount();
    let _ = fs::remove_dir_all(cache);
}

/// `n` empty files in directories of 1,000, built once.
fn big_tree(root: &Path, n: usize) -> PathBuf {
    let src = root.join(format!("tree-{n}"));
    let done = src.join(".complete");
    if done.exists() {
        return src;
    }
    let t = Instant::now();
    let dirs = n.div_ceil(1000);
    std::thread::scope(|s| {
        for w in 0..4 {
            let src = &src;
            s.spawn(move || {
                for d in (w..dirs).step_by(4) {
                    let dir = src.join(format!("d{d:05}"));
                    fs::create_dir_all(&dir).unwrap();
                    for i in 0..1000.min(n - d * 1000) {
                        let p = dir.join(format!("n{d:05}_{i:04}.JPEG"));
                        if !p.exists() {
                            fs::File::create(p).unwrap();
                        }
                    }
                }
            });
        }
    });
    fs::write(&done, n.to_string()).unwrap();
    eprintln!(
        "  built a tree of {n} files in {:.0} s",
        t.elapsed().as_secs_f64()
    );
    src
}

/// How long `getxattr(user.locafs.ping)` takes (it waits for a server).
fn ping(mnt: &Path) -> Duration {
    let t = Instant::now();
    let _ = server_pid(mnt);
    t.elapsed()
}

fn kill_to_first_answer(root: &Path, n: usize) {
    let src = big_tree(root, n);
    let (mnt, cache) = dirs(root, "big");
    let log = root.join("big.log");
    let _ = fs::remove_file(&log);
    let mut m = Mount::start_logged(&src, &mnt, &cache, &[], &log);
    let t = Instant::now();
    let walked = Command::new("find")
        .arg(&mnt)
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success());
    let walk = t.elapsed();
    let mut plain: Vec<f64> = (0..20).map(|_| ms(ping(&mnt))).collect();
    let mut restart = Vec::new();
    for _ in 0..5 {
        // The server serves (see the module doc), then dies.
        for _ in 0..100 {
            ping(&mnt);
        }
        std::thread::sleep(Duration::from_millis(500));
        let old = server_pid(&mnt).unwrap();
        common::signal(old, common::Signal::KILL).unwrap();
        let t = Instant::now();
        while server_pid(&mnt).is_none_or(|p| p == old) {}
        restart.push(ms(t.elapsed()));
    }
    let text = fs::read_to_string(&log).unwrap_or_default();
    let starts: Vec<String> = text
        .lines()
        .filter_map(|l| l.split("it started in ").nth(1))
        .map(|s| s.trim_end_matches(')').to_string())
        .collect();
    let waits = text
        .lines()
        .filter(|l| l.contains("starting another in"))
        .count();
    // A remount of the same tree: the manifest and the cache's index.
    m.unmount();
    let t = Instant::now();
    let m2 = Mount::start(&src, &mnt, &cache, &[]);
    let _ = server_pid(&mnt);
    let remount = ms(t.elapsed());
    drop(m2);
    println!(
        "2. kill to the first answered request with {n} files in the namespace (walked in {:.1} s{})",
        walk.as_secs_f64(),
        if walked.is_ok_and(|ok| ok) { "" } else { ", walk FAILED" }
    );
    println!(
        "   request without a kill:  median {:8.1} ms",
        median(&mut plain)
    );
    let rm = median(&mut restart);
    println!(
        "   after a kill:            median {rm:8.1} ms   max {:8.1} ms   (the new server started in {}; {waits} backoff waits)",
        max(&restart),
        starts.join(", ")
    );
    println!(
        "   a remount instead:              {remount:8.1} ms   (x{:.1} the restart)",
        remount / rm
    );
    let _ = fs::remove_dir_all(cache);
}

fn takeovers(root: &Path) {
    let (mut m, cache) = warm_mount(root, "takeover");
    let mnt = m.mnt.clone();
    let src = root.join("small");
    let copies: Vec<PathBuf> = (0..2)
        .map(|i| {
            let p = root.join(format!("locafs-copy-{i}"));
            fs::copy(common::bin(), &p).unwrap();
            p
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let h = readers(&mnt, &stop);
    std::thread::sleep(Duration::from_millis(500));
    let mut windows = Vec::new();
    for _ in 0..5 {
        let from = Instant::now();
        std::thread::sleep(Duration::from_secs(2));
        windows.push((from, Instant::now()));
    }
    let holders: Arc<Mutex<Vec<Mount>>> = Arc::default();
    let mut taken = Vec::new();
    for k in 0..5 {
        std::thread::sleep(Duration::from_millis(1500));
        let before = stats_of(&mnt)["supervisor_pid"].as_u64();
        let at = Instant::now();
        let child = Command::new(&copies[k % 2])
            .arg("mount")
            .arg(&src)
            .arg(&mnt)
            .arg("--cache-dir")
            .arg(&cache)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let new = child.id() as u64;
        let err = root.join(format!("takeover-{k}.log"));
        holders.lock().unwrap().push(Mount::adopt(child, &mnt, err));
        while stats_of(&mnt)["supervisor_pid"].as_u64() != Some(new) {
            std::thread::sleep(Duration::from_millis(2));
        }
        let _ = before;
        let up = Instant::now();
        taken.push((at, up + Duration::from_millis(500), up - at));
    }
    std::thread::sleep(Duration::from_millis(600));
    stop.store(true, Relaxed);
    let (ops, failed) = collect(h);
    let mut base: Vec<f64> = windows
        .iter()
        .map(|(a, b)| ms(longest(&ops, *a, *b)))
        .collect();
    let mut during: Vec<f64> = taken
        .iter()
        .map(|(a, b, _)| ms(longest(&ops, *a, *b)))
        .collect();
    let mut took: Vec<f64> = taken.iter().map(|(_, _, d)| ms(*d)).collect();
    println!("3. takeover by a copy of the binary over the live mount, 5 times");
    println!(
        "   takeover (start of `locafs mount` to its server answering): median {:.1} ms, max {:.1} ms",
        median(&mut took),
        max(&took)
    );
    let bm = median(&mut base);
    let dm = median(&mut during);
    println!("   longest read without:  median {bm:8.1} ms");
    println!(
        "   longest read during:   median {dm:8.1} ms   max {:8.1} ms   (x{:.1}); {} reads, {failed} failed",
        max(&during),
        dm / bm,
        ops.len()
    );
    // The last holder unmounts; the ones before exited.
    m.child = None;
    if let Some(mut last) = holders.lock().unwrap().pop() {
        last.unmount();
    }
    drop(m);
    for c in copies {
        let _ = fs::remove_file(c);
    }
    let _ = fs::remove_dir_all(cache);
}
