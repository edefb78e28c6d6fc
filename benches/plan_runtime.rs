//! `cargo bench --bench plan_runtime`: how late unrelated work on the
//! daemon's runtime is while a read-ahead plan of 100k paths is installed
//! (`locafs plan`), against the same runtime idle (the baseline, measured
//! in the same run). tests/runtime_stall.rs checks the property (the
//! runtime keeps running tasks while a plan's lookups wait on the source);
//! this measures it.
//!
//! The parts are the daemon's own (runtime of 2 workers as on a 2-CPU
//! machine, `DiskCache`, `Namespace`, `Reader`, `ReadAhead`) over a source
//! of 100k files in 100 directories, each metadata call delayed by
//! `LOCAFS_STALL_STAT_US` µs (default 100: a network file system's round
//! trip; 0 for the local disk as it is). While `LOCAFS_STALL_PLANS` plans
//! (default 2, one per worker) are installed from tasks on the runtime (as
//! the control socket does), two probes run: a task spawned from outside
//! the runtime every millisecond (how a FUSE read or a peer's stream
//! reaches the runtime), timed from spawn to its first poll, and a task on
//! the runtime sleeping 1 ms in a loop, timed for how late it wakes. It
//! prints percentiles of each, idle and installing, and the ratio of the
//! p99s. It asserts nothing.

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use locafs::source::Source;
use locafs::testing::{Call, Hook, Hooked};

const DIRS: usize = 100;
const PER_DIR: usize = 1000;

/// Metadata calls (stat, list) of a directory source take a round trip.
struct RoundTrip(Duration);

impl Hook for RoundTrip {
    fn around<T>(&self, call: Call<'_>, real: impl FnOnce() -> T) -> T {
        if matches!(call, Call::Stat(_) | Call::List(_)) && !self.0.is_zero() {
            std::thread::sleep(self.0);
        }
        real()
    }
}

/// "n N p50 .. p99 .. max ..", and the p99.
fn percentiles(mut v: Vec<Duration>) -> (String, Duration) {
    if v.is_empty() {
        return ("no samples".into(), Duration::ZERO);
    }
    v.sort();
    let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize];
    let text = format!(
        "n {} p50 {:.2?} p99 {:.2?} max {:.2?}",
        v.len(),
        at(0.5),
        at(0.99),
        v[v.len() - 1]
    );
    (text, at(0.99))
}

/// `x / base` as "1.23x", or "-" without a base.
fn ratio(x: Duration, base: Duration) -> String {
    if base.is_zero() {
        "-".into()
    } else {
        format!("{:.2}x", x.as_secs_f64() / base.as_secs_f64())
    }
}

fn main() {
    // `cargo test --all-targets` runs bench binaries without --bench.
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("plan_runtime: a benchmark; run it with `cargo bench --bench plan_runtime`");
        return;
    }
    let rtt = Duration::from_micros(
        std::env::var("LOCAFS_STALL_STAT_US")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(100),
    );
    let plans: usize = std::env::var("LOCAFS_STALL_PLANS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let tmp = tempfile::tempdir_in("/var/tmp").unwrap();
    let src = tmp.path().join("src");
    let mut paths = Vec::with_capacity(DIRS * PER_DIR);
    for d in 0..DIRS {
        let dir = src.join(format!("d{d:03}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..PER_DIR {
            let rel = PathBuf::from(format!("d{d:03}/f{f:04}.jpg"));
            std::fs::write(src.join(&rel), b"x").unwrap();
            paths.push(rel);
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(128)
        .enable_all()
        .build()
        .unwrap();
    let source: Arc<dyn Source> = Arc::new(Hooked::wrap(&src, RoundTrip(rtt)));
    let ra = common::inproc::read_ahead(source, &tmp.path().join("cache"), &rt, 4);
    let paths = Arc::new(paths);

    let measure = |install: bool| -> (Duration, Vec<Duration>, Vec<Duration>) {
        let stop = Arc::new(AtomicBool::new(false));
        let timer = {
            let stop = Arc::clone(&stop);
            rt.spawn(async move {
                let mut late = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    late.push(t.elapsed().saturating_sub(Duration::from_millis(1)));
                }
                late
            })
        };
        let spawner = {
            let stop = Arc::clone(&stop);
            let h = rt.handle().clone();
            std::thread::spawn(move || {
                let mut waits = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    waits.push(h.spawn(async move { t.elapsed() }));
                    std::thread::sleep(Duration::from_millis(1));
                }
                waits
            })
        };
        std::thread::sleep(Duration::from_millis(200));
        let t0 = Instant::now();
        if install {
            let tasks: Vec<_> = (0..plans)
                .map(|_| {
                    let (ra, paths) = (Arc::clone(&ra), Arc::clone(&paths));
                    rt.spawn(async move {
                        let (n, unknown) = ra.set_plan(&paths).await;
                        assert_eq!((n, unknown), (paths.len(), 0));
                    })
                })
                .collect();
            for t in tasks {
                rt.block_on(t).unwrap();
            }
        } else {
            std::thread::sleep(Duration::from_secs(2));
        }
        let took = t0.elapsed();
        std::thread::sleep(Duration::from_millis(200));
        stop.store(true, Ordering::Relaxed);
        let late = rt.block_on(timer).unwrap();
        let spawned: Vec<Duration> = spawner
            .join()
            .unwrap()
            .into_iter()
            .map(|h| rt.block_on(h).unwrap())
            .collect();
        (took, spawned, late)
    };

    let (_, spawned, late) = measure(false);
    let (spawned, idle_spawn) = percentiles(spawned);
    let (late, idle_late) = percentiles(late);
    println!("idle (baseline): spawn-to-poll {spawned}");
    println!("idle (baseline): 1 ms timer late by {late}");
    for round in ["cold namespace", "warm namespace"] {
        let (took, spawned, late) = measure(true);
        let (spawned, spawn_p99) = percentiles(spawned);
        let (late, late_p99) = percentiles(late);
        println!(
            "{plans} plan(s) of {} paths, {round}, metadata round trip {rtt:?}: installed in {took:.2?}",
            paths.len()
        );
        println!(
            "  spawn-to-poll {spawned}; p99 {} of idle",
            ratio(spawn_p99, idle_spawn)
        );
        println!(
            "  1 ms timer late by {late}; p99 {} of idle",
            ratio(late_p99, idle_late)
        );
    }
}
