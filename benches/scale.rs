//! `cargo bench --bench scale`: what millions of files cost the daemon, with
//! the defaults. It generates trees of small files (1-4 KiB, 1,000 per
//! directory) of each size in `LOCAFS_SCALE_SIZES` (default 500000,
//! 1000000, 2000000) and one flat directory of `LOCAFS_SCALE_FLAT` files
//! (default 1000000), and prints, side by side with direct access to the
//! source where there is one:
//!
//! - the daemon's RSS after mounting, after a cold walk (`find`), after
//!   reading every file once cold (8 threads, shuffled), after the kernel
//!   drops its dentries (`echo 2 > drop_caches`, FORGET), and after a
//!   remount over the full cache; and the bytes per file of each: the slope
//!   of RSS between the smallest and the largest tree;
//! - the cold walk (`find`, page cache dropped, on a mount that has read
//!   nothing yet, as a loader scans before it reads: a read starts the
//!   epoch's prefetch of every file) and the walk after a
//!   remount, against `find` on the source cold and warm, and the walk
//!   after a remount against a warm walk of the same mount right after it;
//! - the cold read of every file against the same read of the source;
//! - the remount time over the full cache with the page cache dropped
//!   (until the mount answers a stat and a read);
//! - in the flat directory: its listing, and lookups per second of random
//!   names (the kernel's dentries dropped, so each is a LOOKUP) against the
//!   same lookups in directories of 1,000.
//!
//! The trees are built once under `LOCAFS_BENCH_DIR` (default
//! /var/tmp/locafs-bench-scale) and kept (the data sets of smaller sizes
//! and the flat directory are hard links into the largest, so they cost
//! directory entries only); each size's cache is removed after its figures.
//! The largest tree and its cache need about 2 inodes per file: the bench
//! checks `df -i` and free space first and says SKIPPED if they do not fit.
//! `LOCAFS_SCALE_PREPARE_ONLY=1` builds the trees and stops.
//! It measures and asserts nothing. Root and /dev/fuse are needed.
//! `LOCAFS_BENCH_LOCAFS_ARGS` adds `locafs mount` options (a figure for a
//! flag).

#[path = "../tests/common/mod.rs"]
mod common;

use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use common::{force_unmount, is_mounted, proc_status, Mount, Rng};

const PER_DIR: usize = 1000;
const READERS: usize = 8;
const LOOKUPS: usize = 50_000;

fn env_list(name: &str, default: &str) -> Vec<usize> {
    std::env::var(name)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .filter(|&n| n > 0)
        .collect()
}

fn main() {
    require_fuse!();
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let mut sizes = env_list("LOCAFS_SCALE_SIZES", "500000,1000000,2000000");
    sizes.sort_unstable();
    let flat = env_list("LOCAFS_SCALE_FLAT", "1000000")
        .first()
        .copied()
        .unwrap_or(0);
    let root = PathBuf::from(
        std::env::var("LOCAFS_BENCH_DIR").unwrap_or_else(|_| "/var/tmp/locafs-bench-scale".into()),
    );
    let extra: Vec<String> = std::env::var("LOCAFS_BENCH_LOCAFS_ARGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(String::from)
        .collect();
    let largest = sizes.iter().copied().max().unwrap_or(0).max(flat);
    if largest == 0 {
        skip!("no sizes in LOCAFS_SCALE_SIZES / LOCAFS_SCALE_FLAT");
    }
    fs::create_dir_all(&root).expect("bench dir");
    if let Err(why) = room_for(&root, largest) {
        skip!("{why}");
    }
    let mnt = root.join("mnt");
    fs::create_dir_all(&mnt).expect("mountpoint");
    if is_mounted(&mnt) {
        force_unmount(&mnt);
    }
    let t = Instant::now();
    let pool = root.join("pool");
    make_pool(&pool, largest).expect("generate the tree");
    eprintln!(
        "tree of {largest} files ready in {:.0} s",
        t.elapsed().as_secs_f64()
    );
    if std::env::var_os("LOCAFS_SCALE_PREPARE_ONLY").is_some() {
        for &n in &sizes {
            dataset(&root, &pool, n, largest).expect("data set of links");
        }
        if flat > 0 {
            flat_dataset(&root, &pool, flat).expect("flat data set");
        }
        eprintln!(
            "trees ready under {} (LOCAFS_SCALE_PREPARE_ONLY)",
            root.display()
        );
        return;
    }
    println!("# scale bench: locafs defaults{}", flag_note(&extra));
    println!("# {}", machine());
    let mut runs = Vec::new();
    for &n in &sizes {
        let src = dataset(&root, &pool, n, largest).expect("data set of links");
        let r = run_tree(&src, &mnt, &root.join(format!("cache-{n}")), n, &extra);
        print_tree(&r);
        runs.push(r);
    }
    if runs.len() >= 2 {
        print_slopes(&runs);
    }
    if flat > 0 {
        let src = flat_dataset(&root, &pool, flat).expect("flat data set");
        run_flat(&src, &mnt, &root.join("cache-flat"), flat, &extra);
    }
}

fn flag_note(extra: &[String]) -> String {
    if extra.is_empty() {
        String::new()
    } else {
        format!(" plus {}", extra.join(" "))
    }
}

/// Whether the file system under `root` has the inodes and bytes for a
/// tree of `n` files and its cache (two inodes and about 8 KiB per file,
/// less what is there already).
fn room_for(root: &Path, n: usize) -> Result<(), String> {
    let st = rustix::fs::statvfs(root).map_err(|e| format!("statvfs {}: {e}", root.display()))?;
    let have = count_files(&root.join("pool"));
    let need_inodes = (2 * n).saturating_sub(have) as u64 + 10_000;
    let need_bytes = ((2 * n).saturating_sub(have) as u64 + n as u64) * 4096 + (1 << 30);
    let free_bytes = st.f_bavail * st.f_frsize;
    if st.f_favail < need_inodes || free_bytes < need_bytes {
        return Err(format!(
            "{} has {} free inodes and {} MiB free; {n} files and their cache need about {need_inodes} and {} MiB",
            root.display(),
            st.f_favail,
            free_bytes >> 20,
            need_bytes >> 20
        ));
    }
    Ok(())
}

fn count_files(pool: &Path) -> usize {
    fs::read_to_string(pool.join(".complete"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

fn dir_name(d: usize) -> String {
    format!("n{d:05}")
}

fn file_name(d: usize, i: usize) -> String {
    format!("n{d:05}_{i:04}.jpg")
}

fn file_size(d: usize, i: usize) -> usize {
    let mut r = Rng((d * PER_DIR + i) as u64 ^ 0x5ca1e);
    1024 + r.below(3 * 1024 + 1) as usize
}

/// The largest tree: `n` files in directories of [`PER_DIR`], written by 4
/// threads; `.complete` records how many, so a later run reuses it.
fn make_pool(pool: &Path, n: usize) -> io::Result<()> {
    if count_files(pool) >= n {
        return Ok(());
    }
    let dirs = n.div_ceil(PER_DIR);
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| -> io::Result<()> {
                    let mut buf = vec![0u8; 4096];
                    loop {
                        let d = next.fetch_add(1, Relaxed);
                        if d >= dirs {
                            return Ok(());
                        }
                        let dir = pool.join(dir_name(d));
                        fs::create_dir_all(&dir)?;
                        for i in 0..PER_DIR.min(n - d * PER_DIR) {
                            let p = dir.join(file_name(d, i));
                            let len = file_size(d, i);
                            if fs::metadata(&p).is_ok_and(|m| m.len() == len as u64) {
                                continue;
                            }
                            Rng((d * PER_DIR + i) as u64).fill(&mut buf[..len]);
                            fs::write(&p, &buf[..len])?;
                        }
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().expect("writer"))
    })?;
    rustix::fs::sync();
    fs::write(pool.join(".complete"), n.to_string())
}

/// A data set of the first `n` files of the pool: the pool itself when it
/// is that size, else hard links (made once).
fn dataset(root: &Path, pool: &Path, n: usize, largest: usize) -> io::Result<PathBuf> {
    if n == largest && !pool.join(dir_name(n.div_ceil(PER_DIR))).exists() {
        // The pool holds exactly n files; its `.complete` marker is one
        // more entry, which the walk counts.
        return Ok(pool.to_owned());
    }
    let ds = root.join(format!("ds-{n}"));
    let done = ds.join(".complete");
    if done.exists() {
        return Ok(ds);
    }
    for d in 0..n.div_ceil(PER_DIR) {
        let dir = ds.join(dir_name(d));
        fs::create_dir_all(&dir)?;
        for i in 0..PER_DIR.min(n - d * PER_DIR) {
            let to = dir.join(file_name(d, i));
            if !to.exists() {
                fs::hard_link(pool.join(dir_name(d)).join(file_name(d, i)), to)?;
            }
        }
    }
    fs::write(&done, n.to_string())?;
    Ok(ds)
}

/// The flat data set: `flat/` with `n` links into the pool, and `small/`
/// with 100 directories of 1,000 links, for lookups in small directories.
fn flat_dataset(root: &Path, pool: &Path, n: usize) -> io::Result<PathBuf> {
    let ds = root.join("ds-flat");
    let done = ds.join(".complete");
    if fs::read_to_string(&done).is_ok_and(|s| s.trim() == n.to_string()) {
        return Ok(ds);
    }
    if done.exists() {
        // Made for another size: start again.
        fs::remove_dir_all(&ds)?;
    }
    fs::create_dir_all(ds.join("flat"))?;
    for k in 0..n {
        let (d, i) = (k / PER_DIR, k % PER_DIR);
        let to = ds.join("flat").join(file_name(d, i));
        if !to.exists() {
            fs::hard_link(pool.join(dir_name(d)).join(file_name(d, i)), to)?;
        }
    }
    for d in 0..100.min(n / PER_DIR) {
        let dir = ds.join("small").join(dir_name(d));
        fs::create_dir_all(&dir)?;
        for i in 0..PER_DIR {
            let to = dir.join(file_name(d, i));
            if !to.exists() {
                fs::hard_link(pool.join(dir_name(d)).join(file_name(d, i)), to)?;
            }
        }
    }
    fs::write(&done, n.to_string())?;
    Ok(ds)
}

/// `find DIR`: the entries it printed and the seconds it took.
fn find(dir: &Path) -> io::Result<(u64, f64)> {
    let t = Instant::now();
    let mut child = Command::new("find")
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let mut out = child.stdout.take().expect("piped");
    let mut buf = vec![0u8; 1 << 16];
    let mut lines = 0u64;
    loop {
        let k = out.read(&mut buf)?;
        if k == 0 {
            break;
        }
        lines += buf[..k].iter().filter(|&&b| b == b'\n').count() as u64;
    }
    let st = child.wait()?;
    if !st.success() {
        return Err(io::Error::other(format!(
            "find {} failed: {st}",
            dir.display()
        )));
    }
    Ok((lines, t.elapsed().as_secs_f64()))
}

fn drop_caches(what: &str) {
    rustix::fs::sync();
    if let Err(e) = fs::write("/proc/sys/vm/drop_caches", what) {
        eprintln!("drop_caches {what}: {e}");
    }
}

/// Every file of the tree, relative, in a shuffled order.
fn shuffled_files(n: usize, seed: u64) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = (0..n)
        .map(|k| {
            let (d, i) = (k / PER_DIR, k % PER_DIR);
            Path::new(&dir_name(d)).join(file_name(d, i))
        })
        .collect();
    Rng(seed).shuffle(&mut v);
    v
}

/// Reads every file under `base` whole with [`READERS`] threads: files/s
/// and errors.
fn read_all(base: &Path, files: &[PathBuf]) -> (f64, usize) {
    let next = AtomicUsize::new(0);
    let errors = AtomicUsize::new(0);
    let t = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..READERS {
            s.spawn(|| {
                let mut buf = Vec::with_capacity(8192);
                loop {
                    let k = next.fetch_add(1, Relaxed);
                    let Some(rel) = files.get(k) else { return };
                    buf.clear();
                    let ok = File::open(base.join(rel)).and_then(|mut f| f.read_to_end(&mut buf));
                    if let Err(e) = ok {
                        if errors.fetch_add(1, Relaxed) < 5 {
                            eprintln!("  read {}: {e}", rel.display());
                        }
                    }
                }
            });
        }
    });
    (
        files.len() as f64 / t.elapsed().as_secs_f64(),
        errors.load(Relaxed),
    )
}

fn rss_mib(m: &Mount) -> f64 {
    common::restart::server_pid(&m.mnt)
        .and_then(|p| proc_status(p, "VmRSS"))
        .map_or(f64::NAN, |kb| kb as f64 / 1024.0)
}

fn mount_args(extra: &[String]) -> Vec<&str> {
    extra.iter().map(String::as_str).collect()
}

/// Mounts and waits until `probe` answers a stat, and a read if `read`:
/// the seconds that took. A read starts the epoch (the cross-file prefetch
/// of the whole data set), so the mount whose cold walk is measured is
/// only stat-ed, as a loader scans its tree before it reads.
fn mount_ready(
    src: &Path,
    mnt: &Path,
    cache: &Path,
    extra: &[String],
    probe: &Path,
    read: bool,
) -> (Mount, f64) {
    let t = Instant::now();
    let mut m = Mount::spawn(src, mnt, cache, &mount_args(extra));
    m.wait_mounted(Duration::from_secs(900))
        .unwrap_or_else(|e| panic!("{e}"));
    let p = mnt.join(probe);
    let r = if read {
        fs::read(&p).map(drop)
    } else {
        fs::metadata(&p).map(drop)
    };
    if let Err(e) = r {
        panic!("{} after mounting: {e}\n{}", p.display(), m.stderr());
    }
    (m, t.elapsed().as_secs_f64())
}

fn wait_cached(m: &Mount, files: usize) -> (u64, f64) {
    let t = Instant::now();
    let mut cached = 0;
    while t.elapsed() < Duration::from_secs(300) {
        cached = common::try_stats_of(&m.mnt)
            .and_then(|v| v.get("files_cached")?.as_u64())
            .unwrap_or(0);
        if cached >= files as u64 {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    (cached, t.elapsed().as_secs_f64())
}

struct TreeRun {
    n: usize,
    /// RSS (MiB) after: mount, walk, read, forget, remount, walk after remount.
    rss: [f64; 6],
    find_src_cold: f64,
    find_src_warm: f64,
    walk_cold: f64,
    walk_warm: f64,
    walk_remount: f64,
    /// A warm walk of the remounted mount, after `walk_remount`.
    walk_remount_warm: f64,
    read_src: f64,
    read_mnt: f64,
    read_errors: usize,
    remount: f64,
    cached: u64,
    /// `/proc/loadavg`'s first three fields when this size started and ended.
    load: [String; 2],
}

const RSS_STAGES: [&str; 6] = [
    "after mount",
    "after cold walk",
    "after cold read of every file",
    "after drop_caches 2 (FORGET)",
    "after remount (full cache)",
    "after walk after remount",
];

fn run_tree(src: &Path, mnt: &Path, cache: &Path, n: usize, extra: &[String]) -> TreeRun {
    eprintln!("== {n} files: {}", src.display());
    let load_start = loadavg();
    let _ = fs::remove_dir_all(cache);
    fs::create_dir_all(cache).expect("cache dir");
    let files = shuffled_files(n, n as u64);
    let probe = files[0].clone();

    drop_caches("3");
    let (entries, find_src_cold) = find(src).expect("find on the source");
    let (_, find_src_warm) = find(src).expect("find on the source");
    drop_caches("3");
    let (read_src, _) = read_all(src, &files);

    let mut rss = [f64::NAN; 6];
    drop_caches("3");
    let (mut m, _) = mount_ready(src, mnt, cache, extra, &probe, false);
    rss[0] = rss_mib(&m);
    drop_caches("3");
    let (seen, walk_cold) = find(mnt).expect("find on the mount");
    if seen != entries {
        eprintln!("  walk of the mount saw {seen} entries, the source {entries}");
    }
    rss[1] = rss_mib(&m);
    drop_caches("2");
    let (_, walk_warm) = find(mnt).expect("warm walk");

    drop_caches("3");
    let (read_mnt, read_errors) = read_all(mnt, &files);
    let (cached, settle) = wait_cached(&m, n);
    eprintln!("  cache settled: {cached} of {n} files cached, {settle:.1} s after the cold read");
    rss[2] = rss_mib(&m);
    drop_caches("2");
    std::thread::sleep(Duration::from_secs(3));
    rss[3] = rss_mib(&m);

    m.unmount();
    drop_caches("3");
    let (m2, remount) = mount_ready(src, mnt, cache, extra, &probe, true);
    rss[4] = rss_mib(&m2);
    let (_, walk_remount) = find(mnt).expect("walk after remount");
    rss[5] = rss_mib(&m2);
    // The same mount's warm walk: the walk after the remount against a
    // warm walk of the same mount at the same moment (the first mount's
    // warm walk came before the cold read and its gigabytes of writes).
    drop_caches("2");
    let (_, walk_remount_warm) = find(mnt).expect("warm walk after remount");
    drop(m2);
    let _ = fs::remove_dir_all(cache);
    TreeRun {
        n,
        rss,
        find_src_cold: entries as f64 / find_src_cold,
        find_src_warm: entries as f64 / find_src_warm,
        walk_cold: entries as f64 / walk_cold,
        walk_warm: entries as f64 / walk_warm,
        walk_remount: entries as f64 / walk_remount,
        walk_remount_warm: entries as f64 / walk_remount_warm,
        read_src,
        read_mnt,
        read_errors,
        remount,
        cached,
        load: [load_start, loadavg()],
    }
}

fn print_tree(r: &TreeRun) {
    let n = r.n;
    println!();
    println!("## {n} files in directories of {PER_DIR}");
    println!("| figure | locafs | direct | ratio |");
    println!("|---|---|---|---|");
    let row = |what: &str, l: f64, d: f64| {
        println!(
            "| {what} | {l:.0} entries/s | {d:.0} entries/s | {:.2} |",
            l / d
        );
    };
    row(
        "cold walk (find), vs find on the source cold",
        r.walk_cold,
        r.find_src_cold,
    );
    row(
        "warm walk (daemon knows the tree, kernel dentries dropped), vs find warm",
        r.walk_warm,
        r.find_src_warm,
    );
    row(
        "walk after remount (persisted namespace), vs find warm",
        r.walk_remount,
        r.find_src_warm,
    );
    println!(
        "| walk after remount vs a warm walk of the same mount after it (kernel dentries dropped) | {:.0} entries/s | {:.0} entries/s | {:.2} |",
        r.walk_remount,
        r.walk_remount_warm,
        r.walk_remount / r.walk_remount_warm
    );
    println!(
        "| cold read of every file, {READERS} threads shuffled | {:.0} files/s | {:.0} files/s | {:.2} |",
        r.read_mnt,
        r.read_src,
        r.read_mnt / r.read_src
    );
    println!("| remount over the full cache ({} files cached), page cache dropped, until a stat and a read answer | {:.2} s | | |", r.cached, r.remount);
    for (k, what) in RSS_STAGES.iter().enumerate() {
        println!(
            "| daemon RSS {what} | {:.0} MiB ({:.0} B/file) | | |",
            r.rss[k],
            r.rss[k] * 1048576.0 / n as f64
        );
    }
    if r.read_errors > 0 {
        println!("| read errors | {} | | |", r.read_errors);
    }
    println!(
        "| load average (1, 5, 15 min) at the start / end of this size | {} / {} | | |",
        r.load[0], r.load[1]
    );
}

fn print_slopes(runs: &[TreeRun]) {
    let (a, b) = (&runs[0], &runs[runs.len() - 1]);
    println!();
    println!(
        "## bytes of daemon memory per file: RSS slope between {} and {} files",
        a.n, b.n
    );
    println!("| stage | slope |");
    println!("|---|---|");
    for (k, what) in RSS_STAGES.iter().enumerate() {
        let slope = (b.rss[k] - a.rss[k]) * 1048576.0 / (b.n - a.n) as f64;
        println!("| {what} | {slope:.0} B/file |");
    }
    println!();
    println!("| files | remount s | cold walk / find cold | cold read / direct |");
    println!("|---|---|---|---|");
    for r in runs {
        println!(
            "| {} | {:.2} | {:.2} | {:.2} |",
            r.n,
            r.remount,
            r.walk_cold / r.find_src_cold,
            r.read_mnt / r.read_src
        );
    }
}

/// Stats `names` under `base` in order: lookups per second.
fn stat_all(base: &Path, names: &[PathBuf]) -> f64 {
    let t = Instant::now();
    let mut bad = 0;
    for p in names {
        if fs::symlink_metadata(base.join(p)).is_err() {
            bad += 1;
        }
    }
    if bad > 0 {
        eprintln!(
            "  {bad} of {} stats failed under {}",
            names.len(),
            base.display()
        );
    }
    names.len() as f64 / t.elapsed().as_secs_f64()
}

/// Lists `dir` with getdents (as `ls -f` does): entries per second.
fn list_dir(dir: &Path) -> (u64, f64) {
    let t = Instant::now();
    let n = fs::read_dir(dir).map_or(0, |it| it.filter(|e| e.is_ok()).count() as u64);
    (n, n as f64 / t.elapsed().as_secs_f64())
}

fn run_flat(src: &Path, mnt: &Path, cache: &Path, n: usize, extra: &[String]) {
    eprintln!("== one flat directory of {n} files: {}", src.display());
    let load_start = loadavg();
    let _ = fs::remove_dir_all(cache);
    fs::create_dir_all(cache).expect("cache dir");
    let mut rng = Rng(7);
    let small_files = 100.min(n / PER_DIR) * PER_DIR;
    let flat_names: Vec<PathBuf> = (0..LOOKUPS)
        .map(|_| {
            let k = rng.below(n as u64) as usize;
            Path::new("flat").join(file_name(k / PER_DIR, k % PER_DIR))
        })
        .collect();
    // Other names for the lookups after the listing: the first ones are
    // known by then (and older than --revalidate if the cold lookups took
    // a minute), so they would measure revalidation, not a listed entry's
    // first lookup as the small directories' do.
    let listed_names: Vec<PathBuf> = (0..LOOKUPS)
        .map(|_| {
            let k = rng.below(n as u64) as usize;
            Path::new("flat").join(file_name(k / PER_DIR, k % PER_DIR))
        })
        .collect();
    let small_names: Vec<PathBuf> = (0..LOOKUPS)
        .map(|_| {
            let k = rng.below(small_files.max(1) as u64) as usize;
            let d = k / PER_DIR;
            Path::new("small")
                .join(dir_name(d))
                .join(file_name(d, k % PER_DIR))
        })
        .collect();

    drop_caches("3");
    let (_, src_list_cold) = list_dir(&src.join("flat"));
    let (_, src_list_warm) = list_dir(&src.join("flat"));
    drop_caches("2");
    let src_flat_lookups = stat_all(src, &flat_names);
    drop_caches("2");
    let src_small_lookups = stat_all(src, &small_names);

    drop_caches("3");
    let probe = small_names[0].clone();
    let (m, _) = mount_ready(src, mnt, cache, extra, &probe, false);
    drop_caches("3");
    let cold_flat_lookups = stat_all(mnt, &flat_names);
    let (listed, list_cold) = list_dir(&mnt.join("flat"));
    if listed != n as u64 {
        eprintln!("  listing of the flat directory saw {listed} entries, not {n}");
    }
    drop_caches("2");
    let (_, list_warm) = list_dir(&mnt.join("flat"));
    drop_caches("2");
    let flat_lookups = stat_all(mnt, &listed_names);
    // The small directories listed just before their lookups, as the flat
    // one was (a listing older than --revalidate is listed again).
    let _ = list_dir(&mnt.join("small"));
    for d in 0..100.min(n / PER_DIR) {
        let _ = list_dir(&mnt.join("small").join(dir_name(d)));
    }
    drop_caches("2");
    let small_lookups = stat_all(mnt, &small_names);
    // The same names again with the kernel's dentries dropped: each is a
    // LOOKUP of an entry whose attributes the daemon knows (fresh), so no
    // call to the source: what the namespace costs in each directory. (The
    // first lookups above stat each file at the source, whose own cost in
    // a flat directory is in the direct column.)
    drop_caches("2");
    let flat_known = stat_all(mnt, &listed_names);
    drop_caches("2");
    let small_known = stat_all(mnt, &small_names);
    drop_caches("2");
    let src_flat_again = stat_all(src, &listed_names);
    drop_caches("2");
    let src_small_again = stat_all(src, &small_names);
    let rss = rss_mib(&m);
    drop(m);
    let _ = fs::remove_dir_all(cache);

    println!();
    println!("## one flat directory of {n} files");
    println!("| figure | locafs | direct | ratio |");
    println!("|---|---|---|---|");
    let row = |what: &str, unit: &str, l: f64, d: f64| {
        println!("| {what} | {l:.0} {unit} | {d:.0} {unit} | {:.2} |", l / d);
    };
    row(
        "listing (getdents), first through the mount, vs source cold",
        "entries/s",
        list_cold,
        src_list_cold,
    );
    row(
        "listing again, kernel dentries dropped, vs source warm",
        "entries/s",
        list_warm,
        src_list_warm,
    );
    row(
        &format!("first lookups of {LOOKUPS} random names, never listed"),
        "lookups/s",
        cold_flat_lookups,
        src_flat_lookups,
    );
    row(
        "first lookups of other random names, listed, kernel dentries dropped",
        "lookups/s",
        flat_lookups,
        src_flat_lookups,
    );
    row(
        "the same in directories of 1,000",
        "lookups/s",
        small_lookups,
        src_small_lookups,
    );
    println!(
        "| flat vs small directories, lookups through the mount | {:.2} | {:.2} | |",
        flat_lookups / small_lookups,
        src_flat_lookups / src_small_lookups
    );
    row(
        "the listed names again, attributes known, kernel dentries dropped",
        "lookups/s",
        flat_known,
        src_flat_again,
    );
    row(
        "the same in directories of 1,000",
        "lookups/s",
        small_known,
        src_small_again,
    );
    println!(
        "| flat vs small directories, lookups of known entries (no source call) | {:.2} | {:.2} | |",
        flat_known / small_known,
        src_flat_again / src_small_again
    );
    println!("| daemon RSS at the end | {rss:.0} MiB | | |");
    println!(
        "| load average (1, 5, 15 min) at the start / end | {load_start} / {} | | |",
        loadavg()
    );
}

/// The first three fields of `/proc/loadavg`: the figures are only
/// comparable with others measured under the same load.
fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn machine() -> String {
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("kernel {kernel}, {cpus} CPUs, load average {}", loadavg())
}
