//! `cargo bench --bench stall`: what a training job sees while the source
//! stalls, with the defaults. The source is a real FUSE file system (a
//! `locafs` process serving the data set, the stand-in for an NFS server)
//! that is stopped with SIGSTOP, so every call into it sleeps
//! uninterruptibly in the kernel, as on a hard NFS mount whose server hangs.
//!
//! It caches the data set through the mount under test, measures a loader
//! of 16 workers reading random cached files with the source healthy, stops
//! the source for `LOCAFS_STALL_SECS` (default 300) while the same loader
//! runs, then resumes it. It prints: the loader's files/s and read latency
//! healthy and stalled (and their ratio), the time of a full listing, the
//! time for an uncached read to fail, the daemon's threads before and at
//! most during the stall, and the time to recover.
//!
//! It measures and asserts nothing. Root and /dev/fuse are needed (else it
//! says SKIPPED). Environment: `LOCAFS_STALL_SECS`, `LOCAFS_BENCH_DIR`
//! (default /var/tmp/locafs-bench-stall), `LOCAFS_BENCH_LOCAFS_ARGS` (extra
//! `locafs mount` options for the mount under test: a figure for a flag).

#[path = "../tests/common/mod.rs"]
mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{signal, threads, try_stats_of, Mount, ResumeOnDrop, Signal};

const FILES: usize = 4000;
const DIRS: usize = 40;
const FILE_SIZE: usize = 96 << 10;
const WORKERS: usize = 16;

fn main() {
    require_fuse!();
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let stall_secs: u64 = std::env::var("LOCAFS_STALL_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let root = PathBuf::from(
        std::env::var("LOCAFS_BENCH_DIR").unwrap_or_else(|_| "/var/tmp/locafs-bench-stall".into()),
    );
    let extra: Vec<String> = std::env::var("LOCAFS_BENCH_LOCAFS_ARGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(String::from)
        .collect();
    let (src, server_mnt, server_cache, mnt, cache) = (
        root.join("src"),
        root.join("server"),
        root.join("server-cache"),
        root.join("mnt"),
        root.join("cache"),
    );
    for m in [&mnt, &server_mnt] {
        let _ = locafs::sys::lazy_unmount(m);
    }
    for d in [&server_cache, &cache] {
        let _ = fs::remove_dir_all(d);
    }
    for d in [&src, &server_mnt, &server_cache, &mnt, &cache] {
        fs::create_dir_all(d).unwrap();
    }
    let _ = fs::remove_file(src.join("late.bin"));
    let files = generate(&src);
    // Each daemon's stderr is kept beside its cache directory.
    let server = Mount::start_logged(
        &src,
        &server_mnt,
        &server_cache,
        &["--no-readahead", "--no-passthrough", "--revalidate", "0s"],
        &server_cache.with_extension("log"),
    );
    let server_pid = common::restart::server_pid(&server.mnt).expect("the server runs");
    // Declared after the server, so dropped before it: never leaves it
    // stopped under its mount.
    let _resume = ResumeOnDrop(server_pid);
    let extra_refs: Vec<&str> = extra.iter().map(String::as_str).collect();
    let under_test = Mount::start_logged(
        &server_mnt,
        &mnt,
        &cache,
        &extra_refs,
        &cache.with_extension("log"),
    );
    println!(
        "locafs mount {} {} {} (source: a locafs process serving {})",
        server_mnt.display(),
        mnt.display(),
        extra.join(" "),
        src.display()
    );

    // Cache everything, and let the cache settle.
    let t = Instant::now();
    loader(&mnt, &files, Duration::ZERO, true);
    while stats(&mnt)["files_cached"].as_u64().unwrap_or(0) < files.len() as u64 {
        if t.elapsed() > Duration::from_secs(600) {
            println!("the cache did not settle; stopping");
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    println!(
        "cached {} files in {:.1} s",
        files.len(),
        t.elapsed().as_secs_f64()
    );
    // A file the mount knows but has not cached: it appears at the next
    // revalidation of the root's listing.
    fs::write(src.join("late.bin"), vec![1u8; FILE_SIZE]).unwrap();
    let t = Instant::now();
    while fs::metadata(mnt.join("late.bin")).is_err() {
        if t.elapsed() > Duration::from_secs(600) {
            println!("late.bin never showed; stopping");
            return;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    println!("late.bin visible after {:.0} s", t.elapsed().as_secs_f64());

    let healthy = loader(&mnt, &files, Duration::from_secs(20), false);
    let pid = common::restart::server_pid(&under_test.mnt).expect("the server runs");
    let threads_of = move || threads(pid).unwrap_or(0);
    let threads_before = threads_of();

    // Stop the source.
    signal(server_pid, Signal::STOP).unwrap();
    let stalled_at = Instant::now();
    let peak = Arc::new(AtomicU64::new(threads_before));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (peak, sampling) = (Arc::clone(&peak), Arc::clone(&sampling));
        std::thread::spawn(move || {
            while sampling.load(Relaxed) {
                peak.fetch_max(threads_of(), Relaxed);
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let uncached = {
        let p = mnt.join("late.bin");
        std::thread::spawn(move || {
            let t = Instant::now();
            let r = fs::read(&p);
            (t.elapsed(), r.err().and_then(|e| e.raw_os_error()))
        })
    };
    // Listings while stalled: one at the start, then one a minute (the
    // entries turn stale after --revalidate).
    let walks = {
        let mnt = mnt.clone();
        let end = stalled_at + Duration::from_secs(stall_secs);
        std::thread::spawn(move || {
            let mut out = Vec::new();
            while Instant::now() + Duration::from_secs(5) < end {
                let t = Instant::now();
                let n = walk(&mnt);
                out.push((stalled_at.elapsed(), t.elapsed(), n));
                std::thread::sleep(Duration::from_secs(60).min(end - Instant::now()));
            }
            out
        })
    };
    let stalled = loader(&mnt, &files, Duration::from_secs(stall_secs), false);
    let walks = walks.join().unwrap();
    let (uncached_took, uncached_errno) = uncached.join().unwrap();
    let s = stats(&mnt);
    sampling.store(false, Relaxed);
    sampler.join().unwrap();

    signal(server_pid, Signal::CONT).unwrap();
    let t = Instant::now();
    while !stats(&mnt)["source_stalled_since"].is_null() && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let recovered = t.elapsed();
    let late_ok = fs::read(mnt.join("late.bin")).map(|b| b.len() == FILE_SIZE);
    let served = t.elapsed();

    println!();
    println!("| figure | source healthy | source stalled {stall_secs} s | ratio |");
    println!("|---|---|---|---|");
    println!(
        "| loader, 16 workers, files/s | {:.0} | {:.0} | {:.2} |",
        healthy.rate(),
        stalled.rate(),
        stalled.rate() / healthy.rate().max(1e-9)
    );
    for (name, q) in [("median", 0.5), ("p99", 0.99), ("max", 1.0)] {
        println!(
            "| read of a cached file, {name} | {:.2} ms | {:.2} ms | - |",
            healthy.latency(q) * 1e3,
            stalled.latency(q) * 1e3
        );
    }
    println!(
        "| failed reads | {} | {} | - |",
        healthy.errors, stalled.errors
    );
    for (at, took, n) in &walks {
        println!(
            "| listing of {n} entries, {:.0} s into the stall | - | {:.1} ms | - |",
            at.as_secs_f64(),
            took.as_secs_f64() * 1e3
        );
    }
    println!(
        "| uncached read | - | failed in {:.2} s ({}) | - |",
        uncached_took.as_secs_f64(),
        match uncached_errno {
            Some(libc::ETIMEDOUT) => "ETIMEDOUT".to_string(),
            Some(e) => format!("errno {e}"),
            None => "succeeded".to_string(),
        }
    );
    println!(
        "| daemon threads | {threads_before} | at most {} | - |",
        peak.load(Relaxed)
    );
    println!(
        "| recovery after SIGCONT | - | stall cleared in {:.3} s, late.bin read ({:?}) at {:.3} s | - |",
        recovered.as_secs_f64(),
        late_ok.map_err(|e| e.to_string()),
        served.as_secs_f64()
    );
    println!(
        "\nstats while stalled: stale_answers {}, source_calls_refused {}, source_timeouts {}, \
         source_threads_peak {}",
        s["stale_answers"],
        s["source_calls_refused"],
        s["source_timeouts"],
        s["source_threads_peak"]
    );
    drop(under_test);
    drop(server);
}

/// `FILES` files in `DIRS` directories, generated once and reused.
fn generate(src: &Path) -> Vec<PathBuf> {
    let mut out = Vec::with_capacity(FILES);
    for i in 0..FILES {
        let rel = PathBuf::from(format!("d{:03}/f{i:05}.bin", i % DIRS));
        let p = src.join(&rel);
        if fs::metadata(&p).map(|m| m.len() as usize).ok() != Some(FILE_SIZE) {
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            let data: Vec<u8> = (0..FILE_SIZE).map(|b| (b * 7 + i) as u8).collect();
            fs::write(&p, data).unwrap();
        }
        out.push(rel);
    }
    out
}

/// What a loader run measured.
struct Run {
    files: u64,
    errors: u64,
    took: Duration,
    latencies: Vec<f64>,
}

impl Run {
    fn rate(&self) -> f64 {
        self.files as f64 / self.took.as_secs_f64().max(1e-9)
    }
    fn latency(&self, q: f64) -> f64 {
        if self.latencies.is_empty() {
            return 0.0;
        }
        let i = ((self.latencies.len() - 1) as f64 * q).round() as usize;
        self.latencies[i]
    }
}

/// 16 workers reading whole files: every file once (`once`), or random
/// files for `secs`.
fn loader(mnt: &Path, files: &[PathBuf], secs: Duration, once: bool) -> Run {
    let next = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let lat = Arc::new(Mutex::new(Vec::new()));
    let t = Instant::now();
    let handles: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (mnt, files) = (mnt.to_owned(), files.to_vec());
            let (next, errors, lat) = (Arc::clone(&next), Arc::clone(&errors), Arc::clone(&lat));
            std::thread::spawn(move || {
                let mut rng = (w as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                let mut mine = Vec::new();
                loop {
                    let i = if once {
                        let i = next.fetch_add(1, Relaxed) as usize;
                        if i >= files.len() {
                            break;
                        }
                        i
                    } else {
                        if t.elapsed() >= secs {
                            break;
                        }
                        next.fetch_add(1, Relaxed);
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        (rng % files.len() as u64) as usize
                    };
                    let s = Instant::now();
                    if fs::read(mnt.join(&files[i])).map(|b| b.len()).ok() != Some(FILE_SIZE) {
                        errors.fetch_add(1, Relaxed);
                    }
                    mine.push(s.elapsed().as_secs_f64());
                }
                lat.lock().unwrap().extend(mine);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let mut latencies = std::mem::take(&mut *lat.lock().unwrap());
    latencies.sort_by(f64::total_cmp);
    Run {
        files: latencies.len() as u64,
        errors: errors.load(Relaxed),
        took: t.elapsed(),
        latencies,
    }
}

/// Entries under `dir` (a full `ls -lR`).
fn walk(dir: &Path) -> usize {
    let mut n = 0;
    let Ok(rd) = fs::read_dir(dir) else { return 0 };
    for e in rd.flatten() {
        n += 1;
        if let Ok(m) = fs::symlink_metadata(e.path()) {
            if m.is_dir() {
                n += walk(&e.path());
            }
        }
    }
    n
}

fn stats(mnt: &Path) -> serde_json::Value {
    try_stats_of(mnt).unwrap_or_default()
}
