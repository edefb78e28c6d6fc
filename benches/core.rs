//! `cargo bench --bench core`: the core speed and memory figures of locafs
//! (issue 2), each measured side by side with its baselines in the same run
//! (direct reads of the source, locafs with and without passthrough, bindfs,
//! rclone) and printed as a markdown table of medians with the ratio to
//! direct. docs/benchmarks.md says what each figure means.
//!
//! It mounts real `locafs`, `bindfs` and `rclone` processes on real FUSE
//! mounts (root and /dev/fuse needed, otherwise it says SKIPPED and exits).
//! It asserts nothing and never fails on a slow figure: it measures. It must
//! never leave a mount behind: every mount is a guard that unmounts on drop
//! (also while a panic unwinds), and each run first detaches whatever an
//! interrupted earlier run left mounted under its directory.
//!
//! Environment:
//! - `LOCAFS_BENCH_SCALE` (default 1): multiplies file counts and sizes
//!   (0.1 for a quick check).
//! - `LOCAFS_BENCH_ONLY` (default all): figures to run, e.g. `1,3` (`1` means
//!   1 and 1b; `1b` alone means only 1b).
//! - `LOCAFS_BENCH_TOOLS` (default all): columns to measure, e.g.
//!   `direct,locafs` (names: direct, locafs, locafs-nopt, locafs-kernel,
//!   bindfs, rclone).
//! - `LOCAFS_BENCH_RUNS` (default 3): timed passes per warm figure (median).
//! - `LOCAFS_BENCH_COLD_RUNS` (default 3): cold passes of figure 4 (median),
//!   each on a fresh mount with an empty cache.
//! - `LOCAFS_BENCH_LOCAFS_ARGS`: extra `locafs mount` options for both locafs
//!   columns (experiments, e.g. `--fuse-threads 4`).
//! - `LOCAFS_BENCH_DIR` (default /var/tmp/locafs-bench): generated data (kept
//!   and reused across runs), mountpoints, caches and daemon logs.
//! - `LOCAFS_BENCH_CACHE_DIR` (default `$LOCAFS_BENCH_DIR/cache`): where the
//!   locafs and rclone caches (and figure 4's copy floor) go; point it at
//!   another device to measure a cache that does not share the source's disk.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{is_mounted, mountpoints, try_drop_page_cache, which, Rng};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// Reader threads of figures 2 and 4 (a data loader's workers).
const THREADS: usize = 8;
/// Class directories of the image-folder-like set.
const CLASSES: usize = 100;

// ---------------------------------------------------------------- settings

struct Settings {
    scale: f64,
    only: Option<BTreeSet<String>>,
    tools: Option<BTreeSet<String>>,
    runs: usize,
    cold_runs: usize,
    root: PathBuf,
    cache_root: PathBuf,
}

impl Settings {
    fn from_env() -> Result<Settings, String> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let scale = match var("LOCAFS_BENCH_SCALE") {
            Some(v) => v
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|s| *s > 0.0 && *s <= 10.0)
                .ok_or_else(|| format!("LOCAFS_BENCH_SCALE={v}: want a number in (0, 10]"))?,
            None => 1.0,
        };
        let only = var("LOCAFS_BENCH_ONLY").map(|v| {
            v.split(',')
                .map(|s| s.trim().to_ascii_lowercase())
                .filter(|s| !s.is_empty())
                .collect::<BTreeSet<_>>()
        });
        if let Some(set) = &only {
            for f in set {
                if !ROWS
                    .iter()
                    .any(|r| r.id == f || r.id.trim_end_matches('b') == f)
                {
                    return Err(format!("LOCAFS_BENCH_ONLY: no figure {f:?}"));
                }
            }
        }
        let tools = var("LOCAFS_BENCH_TOOLS").map(|v| {
            v.split(',')
                .map(|s| s.trim().to_ascii_lowercase())
                .filter(|s| !s.is_empty())
                .collect::<BTreeSet<_>>()
        });
        if let Some(set) = &tools {
            for t in set {
                if !TOOLS.iter().any(|x| x.tag() == t) {
                    return Err(format!("LOCAFS_BENCH_TOOLS: no tool {t:?}"));
                }
            }
        }
        let runs = match var("LOCAFS_BENCH_RUNS") {
            Some(v) => v
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|n| *n >= 1)
                .ok_or_else(|| format!("LOCAFS_BENCH_RUNS={v}: want a whole number >= 1"))?,
            None => 3,
        };
        let cold_runs = match var("LOCAFS_BENCH_COLD_RUNS") {
            Some(v) => v
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|n| *n >= 1)
                .ok_or_else(|| format!("LOCAFS_BENCH_COLD_RUNS={v}: want a whole number >= 1"))?,
            None => 3,
        };
        let root = var("LOCAFS_BENCH_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/var/tmp/locafs-bench"));
        let cache_root = var("LOCAFS_BENCH_CACHE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("cache"));
        Ok(Settings {
            scale,
            only,
            tools,
            runs,
            cold_runs,
            root,
            cache_root,
        })
    }

    fn wants(&self, row: &str) -> bool {
        match &self.only {
            None => true,
            Some(set) => set.contains(row) || set.contains(row.trim_end_matches('b')),
        }
    }

    fn uses(&self, t: Tool) -> bool {
        self.tools.as_ref().is_none_or(|set| set.contains(t.tag()))
    }

    fn count(&self, n: u64) -> u64 {
        ((n as f64 * self.scale).round() as u64).max(1)
    }
}

// ------------------------------------------------------------- the figures

#[derive(Clone, Copy, PartialEq)]
enum Unit {
    GBps,
    FilesPerS,
    EntriesPerS,
    Seconds,
    MiB,
}

#[derive(Clone, Copy)]
enum Goal {
    /// locafs (passthrough, the default) at least this fraction of direct.
    AtLeastRatio(f64),
    /// locafs at most this multiple of direct (times).
    AtMostRatio(f64),
    /// locafs below this value.
    Below(f64),
}

struct Row {
    id: &'static str,
    unit: Unit,
    goal: Option<Goal>,
}

const ROWS: &[Row] = &[
    Row {
        id: "1",
        unit: Unit::GBps,
        goal: Some(Goal::AtLeastRatio(0.9)),
    },
    Row {
        id: "1b",
        unit: Unit::GBps,
        goal: None,
    },
    Row {
        id: "2",
        unit: Unit::FilesPerS,
        goal: Some(Goal::AtLeastRatio(0.6)),
    },
    Row {
        id: "2b",
        unit: Unit::FilesPerS,
        goal: None,
    },
    Row {
        id: "3",
        unit: Unit::EntriesPerS,
        goal: Some(Goal::AtLeastRatio(0.5)),
    },
    Row {
        id: "4",
        unit: Unit::Seconds,
        goal: Some(Goal::AtMostRatio(1.3)),
    },
    Row {
        id: "5",
        unit: Unit::MiB,
        goal: Some(Goal::Below(300.0)),
    },
];

/// The data set sizes of one run (after scaling).
struct Sizes {
    large_files: u64,
    large_size: u64,
    small_files: u64,
    meta_files: u64,
    tree_files: u64,
    tree_dirs: u64,
}

impl Sizes {
    fn new(s: &Settings) -> Sizes {
        Sizes {
            large_files: 4,
            large_size: s.count(512).max(1) * MIB,
            small_files: s.count(50_000).max(CLASSES as u64),
            meta_files: s.count(100_000).max(CLASSES as u64),
            tree_files: s.count(1_000_000).max(1000),
            tree_dirs: 1000,
        }
    }

    fn label(&self, row: &str, runs: usize) -> String {
        let large = format!(
            "{} x {} MiB, 1 MiB reads",
            self.large_files,
            self.large_size / MIB
        );
        let small = format!(
            "{} files of 4-256 KiB in {CLASSES} dirs, {THREADS} threads",
            self.small_files
        );
        match row {
            "1" => format!("1 warm seq read, {large}; page cache warm; median of {runs}"),
            "1b" => format!("1b seq read, {large}; page cache dropped before each pass, locafs/rclone cache warm; median of {runs}"),
            "2" => format!("2 warm random reads, {small}; page cache warm; median of {runs}"),
            "2b" => format!("2b random reads, {small}; page cache dropped before each pass, locafs/rclone cache warm; median of {runs}"),
            "3" => format!("3 warm metadata walk (readdir + lstat), {} files in {CLASSES} dirs; kernel caches warm; median of {runs}", self.meta_files),
            "4" => format!("4 cold first pass, {small}; page cache dropped, empty cache, fresh mount each run; median of {runs}"),
            "5" => format!("5 daemon peak RSS (VmHWM) after lstat of {} files in {} dirs; fresh mount", self.tree_files, self.tree_dirs),
            _ => row.to_string(),
        }
    }
}

fn unit_name(u: Unit) -> &'static str {
    match u {
        Unit::GBps => "GB/s",
        Unit::FilesPerS => "files/s",
        Unit::EntriesPerS => "entries/s",
        Unit::Seconds => "s",
        Unit::MiB => "MiB",
    }
}

fn fmt_value(u: Unit, v: f64) -> String {
    match u {
        Unit::GBps => format!("{v:.2}"),
        Unit::FilesPerS | Unit::EntriesPerS => format!("{v:.0}"),
        Unit::Seconds => format!("{v:.2}"),
        Unit::MiB => format!("{v:.1}"),
    }
}

// ------------------------------------------------------------------- tools

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Tool {
    Direct,
    Locafs,
    LocafsNoPt,
    LocafsKernel,
    Bindfs,
    Rclone,
}

const TOOLS: [Tool; 6] = [
    Tool::Direct,
    Tool::Locafs,
    Tool::LocafsNoPt,
    Tool::LocafsKernel,
    Tool::Bindfs,
    Tool::Rclone,
];

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Tool::Direct => "direct",
            Tool::Locafs => "locafs",
            Tool::LocafsNoPt => "locafs --no-passthrough",
            Tool::LocafsKernel => "locafs --open-mode kernel",
            Tool::Bindfs => "bindfs",
            Tool::Rclone => "rclone",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Tool::Direct => "direct",
            Tool::Locafs => "locafs",
            Tool::LocafsNoPt => "locafs-nopt",
            Tool::LocafsKernel => "locafs-kernel",
            Tool::Bindfs => "bindfs",
            Tool::Rclone => "rclone",
        }
    }

    /// The program, or None if it is not installed.
    fn program(self) -> Option<PathBuf> {
        match self {
            Tool::Direct => None,
            Tool::Locafs | Tool::LocafsNoPt | Tool::LocafsKernel => {
                Some(PathBuf::from(common::bin()))
            }
            Tool::Bindfs => which("bindfs"),
            Tool::Rclone => which("rclone"),
        }
    }
}

/// A live FUSE mount served by a child process. Dropping it unmounts, waits
/// for (or kills) the process and removes its cache directory.
struct Mounted {
    mnt: PathBuf,
    child: Child,
    cache: Option<PathBuf>,
}

impl Mounted {
    /// Mounts the data set `source` at `root/mnt/TOOL-TAG/NAME` (NAME the
    /// source's own name, so paths relative to the source's parent work under
    /// the mountpoint's parent).
    fn start(tool: Tool, source: &Path, s: &Settings, tag: &str) -> Result<Mounted, String> {
        let root = &s.root;
        let program = tool.program().ok_or_else(|| "not installed".to_string())?;
        let name = source
            .file_name()
            .ok_or_else(|| format!("{}: no name", source.display()))?;
        let mnt = root
            .join("mnt")
            .join(format!("{}-{tag}", tool.tag()))
            .join(name);
        let cache = s.cache_root.join(format!("{}-{tag}", tool.tag()));
        let logs = root.join("logs");
        for d in [&mnt, &logs] {
            fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
        }
        if cache.exists() {
            fs::remove_dir_all(&cache).map_err(|e| format!("{}: {e}", cache.display()))?;
        }
        fs::create_dir_all(&cache).map_err(|e| format!("{}: {e}", cache.display()))?;
        let log_path = logs.join(format!("{}-{tag}.log", tool.tag()));
        let log = File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
        let log2 = log.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&program);
        match tool {
            Tool::Direct => unreachable!("direct reads mount nothing"),
            Tool::Locafs | Tool::LocafsNoPt | Tool::LocafsKernel => {
                cmd.arg("mount")
                    .arg(source)
                    .arg(&mnt)
                    .arg("--cache-dir")
                    .arg(&cache)
                    .arg("--dataset-id")
                    .arg("bench");
                if tool == Tool::LocafsNoPt {
                    cmd.arg("--no-passthrough");
                }
                if tool == Tool::LocafsKernel {
                    cmd.args(["--open-mode", "kernel"]);
                }
                // Extra options for experiments, e.g. "--fuse-threads 4".
                if let Ok(extra) = std::env::var("LOCAFS_BENCH_LOCAFS_ARGS") {
                    cmd.args(extra.split_whitespace());
                }
            }
            Tool::Bindfs => {
                cmd.arg("-f").arg("-o").arg("ro").arg(source).arg(&mnt);
            }
            Tool::Rclone => {
                cmd.arg("mount")
                    .arg(source)
                    .arg(&mnt)
                    .arg("--read-only")
                    .arg("--vfs-cache-mode")
                    .arg("full")
                    .arg("--cache-dir")
                    .arg(&cache);
            }
        }
        cmd.stdin(Stdio::null()).stdout(log).stderr(log2);
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", program.display()))?;
        let mut m = Mounted {
            mnt,
            child,
            cache: Some(cache),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if is_mounted(&m.mnt) {
                return Ok(m);
            }
            if let Ok(Some(st)) = m.child.try_wait() {
                let tail = fs::read_to_string(&log_path).unwrap_or_default();
                let tail = tail.lines().last().unwrap_or("").to_string();
                return Err(format!(
                    "{} exited ({st}) before mounting: {tail}",
                    tool.name()
                ));
            }
            if Instant::now() > deadline {
                // Drop kills the child.
                m.cache.take();
                return Err(format!("{} did not mount within 60 s", tool.name()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if is_mounted(&self.mnt) {
            let mut done = false;
            for _ in 0..50 {
                if locafs::sys::unmount(&self.mnt).is_ok() {
                    done = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            if !done {
                eprintln!("  {} busy: detaching it", self.mnt.display());
                let _ = locafs::sys::lazy_unmount(&self.mnt);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() > deadline => {
                    eprintln!(
                        "  pid {} did not exit after unmount: killing it",
                        self.pid()
                    );
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
        if let Some(c) = self.cache.take() {
            let _ = fs::remove_dir_all(c);
        }
    }
}

/// Detaches mounts that an interrupted earlier run left under `root/mnt`.
fn detach_leftovers(root: &Path) {
    let base = root.join("mnt");
    for m in mountpoints() {
        if m.starts_with(&base) {
            eprintln!("detaching {} left by an earlier run", m.display());
            let _ = locafs::sys::lazy_unmount(&m);
        }
    }
}

// -------------------------------------------------------------- data sets

/// Files of a data set: path relative to the mount root, and size.
type FileList = Vec<(PathBuf, u64)>;

fn large_list(sz: &Sizes) -> (String, FileList) {
    let dir = format!("large-{}x{}MiB", sz.large_files, sz.large_size / MIB);
    let files = (0..sz.large_files)
        .map(|i| {
            (
                PathBuf::from(&dir).join(format!("shard-{i}.bin")),
                sz.large_size,
            )
        })
        .collect();
    (dir, files)
}

fn small_list(sz: &Sizes) -> (String, FileList) {
    let dir = format!("small-{}", sz.small_files);
    let mut rng = Rng(42);
    let files = (0..sz.small_files)
        .map(|i| {
            let class = i as usize % CLASSES;
            let size = 4 * KIB + rng.below(252 * KIB + 1);
            (
                PathBuf::from(&dir)
                    .join(format!("n{class:03}"))
                    .join(format!("img_{i:07}.jpg")),
                size,
            )
        })
        .collect();
    (dir, files)
}

/// Writes `files` under `data` unless a marker says it was done before.
fn ensure_files(root: &Path, data: &Path, name: &str, files: &FileList) -> io::Result<()> {
    let marker = root.join("ready").join(name);
    if marker.exists() {
        return Ok(());
    }
    let dir = data.join(name);
    if dir.exists() {
        fs::remove_dir_all(&dir)?;
    }
    let total: u64 = files.iter().map(|f| f.1).sum();
    eprintln!(
        "generating {} ({} files, {:.2} GiB) ...",
        dir.display(),
        files.len(),
        total as f64 / (1u64 << 30) as f64
    );
    let t = Instant::now();
    let mut pool = vec![0u8; 8 * MIB as usize];
    Rng(7).fill(&mut pool);
    for (i, (rel, size)) in files.iter().enumerate() {
        let p = data.join(rel);
        if let Some(parent) = p.parent() {
            fs::create_dir_all(parent)?;
        }
        let mut f = File::create(&p)?;
        let mut left = *size;
        let mut off = (i as u64 * 4099) % (4 * MIB);
        let mut first = true;
        while left > 0 {
            let n = left.min(4 * MIB);
            let chunk = &mut pool[off as usize..(off + n) as usize];
            if first {
                // Every file distinct.
                chunk[..8].copy_from_slice(&(i as u64).to_le_bytes());
                first = false;
            }
            f.write_all(chunk)?;
            left -= n;
            off = (off + 4099) % (4 * MIB);
        }
    }
    fs::create_dir_all(marker.parent().unwrap_or(root))?;
    File::create(&marker)?;
    eprintln!("  done in {:.1} s", t.elapsed().as_secs_f64());
    Ok(())
}

/// `files` empty files spread over `dirs` directories (2 writer threads).
fn ensure_empty_tree(root: &Path, dir: &Path, name: &str, files: u64, dirs: u64) -> io::Result<()> {
    let marker = root.join("ready").join(name);
    if marker.exists() {
        return Ok(());
    }
    if dir.exists() {
        fs::remove_dir_all(dir)?;
    }
    eprintln!(
        "generating {} ({files} empty files in {dirs} dirs; once, then reused) ...",
        dir.display()
    );
    let t = Instant::now();
    let per = files.div_ceil(dirs);
    std::thread::scope(|s| -> io::Result<()> {
        let hs: Vec<_> = (0..2u64)
            .map(|w| {
                s.spawn(move || -> io::Result<()> {
                    for d in (w..dirs).step_by(2) {
                        let sub = dir.join(format!("d{d:04}"));
                        fs::create_dir_all(&sub)?;
                        let lo = d * per;
                        let hi = ((d + 1) * per).min(files);
                        for i in lo..hi {
                            File::create(sub.join(format!("f{i:07}")))?;
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for h in hs {
            h.join()
                .map_err(|_| io::Error::other("generator thread panicked"))??;
        }
        Ok(())
    })?;
    fs::create_dir_all(marker.parent().unwrap_or(root))?;
    File::create(&marker)?;
    eprintln!("  done in {:.1} s", t.elapsed().as_secs_f64());
    Ok(())
}

// --------------------------------------------------------------- workloads

/// Reads `rel` under `base` to its end with `buf`-sized reads; checks the size.
fn read_whole(base: &Path, rel: &Path, size: u64, buf: &mut [u8]) -> io::Result<()> {
    let p = base.join(rel);
    let mut f = File::open(&p)?;
    let mut n = 0u64;
    loop {
        match f.read(buf)? {
            0 => break,
            k => n += k as u64,
        }
    }
    if n != size {
        return Err(io::Error::other(format!(
            "{}: read {n} bytes, expected {size}",
            p.display()
        )));
    }
    Ok(())
}

/// Sequential pass over `files`, one after the other, 1 MiB reads: GB/s.
fn seq_pass(base: &Path, files: &FileList) -> io::Result<f64> {
    let mut buf = vec![0u8; MIB as usize];
    let t = Instant::now();
    for (rel, size) in files {
        read_whole(base, rel, *size, &mut buf)?;
    }
    let bytes: u64 = files.iter().map(|f| f.1).sum();
    Ok(bytes as f64 / t.elapsed().as_secs_f64() / 1e9)
}

/// All `files` in a shuffled order by THREADS threads, each file opened,
/// read whole and closed: (seconds, files/s).
fn random_pass(base: &Path, files: &FileList, seed: u64) -> io::Result<(f64, f64)> {
    let mut order: Vec<usize> = (0..files.len()).collect();
    Rng(seed).shuffle(&mut order);
    let next = AtomicUsize::new(0);
    let t = Instant::now();
    std::thread::scope(|s| -> io::Result<()> {
        let hs: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| -> io::Result<()> {
                    let mut buf = vec![0u8; 256 * KIB as usize];
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&k) = order.get(i) else {
                            return Ok(());
                        };
                        let (rel, size) = &files[k];
                        read_whole(base, rel, *size, &mut buf)?;
                    }
                })
            })
            .collect();
        for h in hs {
            h.join()
                .map_err(|_| io::Error::other("reader thread panicked"))??;
        }
        Ok(())
    })?;
    let secs = t.elapsed().as_secs_f64();
    Ok((secs, files.len() as f64 / secs))
}

/// `random_pass` with O_DIRECT reads (no page cache) that also writes each
/// file to `dst` (flat, one file per index) with O_DIRECT from an aligned
/// buffer, padded to 4 KiB and cut back to size: each byte read once and
/// written once, the least disk traffic a cache can cause, with no FUSE and
/// no hashing. (seconds, files/s).
fn copy_pass(base: &Path, files: &FileList, seed: u64, dst: &Path) -> io::Result<(f64, f64)> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut order: Vec<usize> = (0..files.len()).collect();
    Rng(seed).shuffle(&mut order);
    let next = AtomicUsize::new(0);
    let t = Instant::now();
    std::thread::scope(|s| -> io::Result<()> {
        let hs: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| -> io::Result<()> {
                    let cap = 256 * KIB as usize + 4096;
                    let layout =
                        std::alloc::Layout::from_size_align(cap, 4096).map_err(io::Error::other)?;
                    // SAFETY: the layout is non-zero; the buffer is zeroed,
                    // freed below with the same layout, and only used as a
                    // byte slice of `cap` bytes in between.
                    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
                    if ptr.is_null() {
                        return Err(io::Error::other("out of memory"));
                    }
                    let buf = unsafe { std::slice::from_raw_parts_mut(ptr, cap) };
                    let r = (|| loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&k) = order.get(i) else {
                            return Ok(());
                        };
                        let (rel, size) = &files[k];
                        let mut f = fs::OpenOptions::new()
                            .read(true)
                            .custom_flags(libc::O_DIRECT)
                            .open(base.join(rel))?;
                        let mut n = 0usize;
                        loop {
                            // Whole aligned reads until a short one (the end).
                            let want = (*size as usize - n).div_ceil(4096) * 4096;
                            match f.read(&mut buf[n..n + want])? {
                                0 => break,
                                m => n += m,
                            }
                            if n % 4096 != 0 {
                                break;
                            }
                        }
                        if n as u64 != *size {
                            return Err(io::Error::other(format!("{}: short read", rel.display())));
                        }
                        let padded = n.div_ceil(4096) * 4096;
                        buf[n..padded].fill(0);
                        let mut o = fs::OpenOptions::new()
                            .write(true)
                            .create(true)
                            .truncate(true)
                            .custom_flags(libc::O_DIRECT)
                            .open(dst.join(k.to_string()))?;
                        o.write_all(&buf[..padded])?;
                        o.set_len(n as u64)?;
                    })();
                    // SAFETY: allocated above with this layout.
                    unsafe { std::alloc::dealloc(ptr, layout) };
                    r
                })
            })
            .collect();
        for h in hs {
            h.join()
                .map_err(|_| io::Error::other("copy thread panicked"))??;
        }
        Ok(())
    })?;
    let secs = t.elapsed().as_secs_f64();
    Ok((secs, files.len() as f64 / secs))
}

/// os.walk-like: list every directory, lstat every entry. Returns the number
/// of entries.
fn walk(dir: &Path) -> io::Result<u64> {
    let mut stack = vec![dir.to_path_buf()];
    let mut n = 0u64;
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d)? {
            let p = e?.path();
            let md = fs::symlink_metadata(&p)?;
            n += 1;
            if md.is_dir() {
                stack.push(p);
            }
        }
    }
    Ok(n)
}

fn walk_pass(dir: &Path, expect: u64) -> io::Result<f64> {
    let t = Instant::now();
    let n = walk(dir)?;
    let secs = t.elapsed().as_secs_f64();
    if n != expect {
        return Err(io::Error::other(format!(
            "walk of {} saw {n} entries, expected {expect}",
            dir.display()
        )));
    }
    Ok(n as f64 / secs)
}

fn vm_hwm_mib(pid: u32) -> io::Result<f64> {
    let kb = common::proc_status(pid, "VmHWM").ok_or_else(|| io::Error::other("no VmHWM"))?;
    Ok(kb as f64 / 1024.0)
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

// ------------------------------------------------------------------ driver

enum Cell {
    Value(f64),
    Text(String),
}

struct Bench {
    s: Settings,
    sz: Sizes,
    data: PathBuf,
    cells: BTreeMap<(String, Tool), Cell>,
    /// Median of the per-pair ratios to direct, per row and tool.
    ratios: BTreeMap<(String, Tool), f64>,
    /// Figure 4's floor for a cache on the cache directory's disk: (copy
    /// pass seconds, the direct cold pass just before it).
    floor4: Option<(f64, f64)>,
}

impl Bench {
    fn put(&mut self, row: &str, tool: Tool, c: Cell) {
        self.cells.insert((row.to_string(), tool), c);
    }

    fn record(&mut self, row: &str, tool: Tool, r: io::Result<Vec<f64>>, unit: Unit) {
        match r {
            Ok(v) => {
                let parts: Vec<String> = v.iter().map(|x| fmt_value(unit, *x)).collect();
                eprintln!(
                    "  [{row}] {}: {} {} (runs: {})",
                    tool.name(),
                    fmt_value(unit, median(&v)),
                    unit_name(unit),
                    parts.join(", ")
                );
                self.put(row, tool, Cell::Value(median(&v)));
            }
            Err(e) => {
                eprintln!("  [{row}] {}: ERROR {e}", tool.name());
                self.put(row, tool, Cell::Text(format!("ERROR: {e}")));
            }
        }
    }

    fn mark_all(&mut self, rows: &[&str], tool: Tool, text: &str) {
        for r in rows {
            if self.s.wants(r) {
                self.put(r, tool, Cell::Text(text.to_string()));
            }
        }
    }

    /// Runs `f` `runs` times on `base` (the tool's view) and records the
    /// median. For a mounted tool, each run is paired with a run of the same
    /// workload on the source directly just before it, and the ratio
    /// reported is the median of the per-pair ratios: the machine's drift
    /// (other builds, the VM's memory reclaim) hits both sides of a pair.
    fn paired(
        &mut self,
        row: &str,
        tool: Tool,
        unit: Unit,
        base: &Path,
        drop: bool,
        mut f: impl FnMut(&Path, u64) -> io::Result<f64>,
    ) {
        let data = self.data.clone();
        let mut vals = Vec::new();
        let mut ratios = Vec::new();
        let mut one = |i: u64| -> io::Result<()> {
            let d = if tool == Tool::Direct {
                None
            } else {
                if drop {
                    try_drop_page_cache()?;
                }
                Some(f(&data, i)?)
            };
            if drop {
                try_drop_page_cache()?;
            }
            let v = f(base, i)?;
            vals.push(v);
            if let Some(d) = d {
                ratios.push(v / d);
            }
            Ok(())
        };
        let runs = self.s.runs;
        let r = (0..runs as u64).try_for_each(&mut one);
        if !ratios.is_empty() {
            let parts: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
            eprintln!(
                "  [{row}] {}: paired ratios {}",
                tool.name(),
                parts.join(", ")
            );
            self.ratios.insert((row.to_string(), tool), median(&ratios));
        }
        self.record(row, tool, r.map(|_| vals), unit);
    }

    /// Figure 4's floor on this machine: the same cold pass, every file
    /// read with O_DIRECT and written to the cache directory's disk as a
    /// cache would write it (O_DIRECT, 4 KiB aligned, no FUSE, no hashing):
    /// what a cache costs when it shares the source's disk, whatever its
    /// code does.
    fn floor_figure(&mut self, small: &FileList, direct: f64) {
        let dst = self.s.cache_root.join("copy-floor");
        let r = (|| -> io::Result<f64> {
            if dst.exists() {
                fs::remove_dir_all(&dst)?;
            }
            fs::create_dir_all(&dst)?;
            try_drop_page_cache()?;
            let (secs, _) = copy_pass(&self.data, small, 1, &dst)?;
            Ok(secs)
        })();
        let _ = fs::remove_dir_all(&dst);
        match r {
            Ok(secs) => {
                eprintln!(
                    "  [4] floor (read + O_DIRECT copy to {}): {secs:.2} s, {:.2}x the direct pass",
                    self.s.cache_root.display(),
                    secs / direct
                );
                self.floor4 = Some((secs, direct));
            }
            Err(e) => eprintln!("  [4] floor: ERROR {e}"),
        }
    }

    /// Figures 1-4 for one tool, on one mount of the data directory.
    fn main_figures(&mut self, tool: Tool) {
        let rows = ["1", "1b", "2", "2b", "3", "4"];
        if !rows.iter().any(|r| self.s.wants(r)) {
            return;
        }
        eprintln!("== {} ==", tool.name());
        if tool != Tool::Direct && tool.program().is_none() {
            self.mark_all(&rows, tool, "SKIPPED (not installed)");
            return;
        }
        let (_, small) = small_list(&self.sz);
        let (_, large) = large_list(&self.sz);
        let data = self.data.clone();
        // One mount per data set, as a user mounts one data set: a mount of
        // the whole bench directory would have background prefetch read the
        // other figures' files while this one is timed.
        let (small_dir, _) = small_list(&self.sz);
        let (large_dir, _) = large_list(&self.sz);
        let meta_dir = format!("meta-{}", self.sz.meta_files);
        let mut small_passes = 0;
        let mut mounted = None;
        if self.s.wants("4") {
            // Each run: a direct cold pass (for the ratio), then a fresh
            // mount with an empty cache and the same pass through it. The
            // last mount stays for figure 2.
            let mut vals = Vec::new();
            let mut ratios = Vec::new();
            let mut err = None;
            for _ in 0..self.s.cold_runs {
                // The previous run's mount and cache go first: a cache on
                // tmpfs would otherwise hold its memory through the direct
                // pass.
                drop(mounted.take());
                let direct = if tool == Tool::Direct {
                    None
                } else {
                    match try_drop_page_cache().and_then(|_| random_pass(&data, &small, 1)) {
                        Ok((secs, _)) => Some(secs),
                        Err(e) => {
                            err = Some(e);
                            break;
                        }
                    }
                };
                let Some((mount, base)) = self.mount_set(tool, &small_dir, &rows) else {
                    return;
                };
                match try_drop_page_cache().and_then(|_| random_pass(&base, &small, 1)) {
                    Ok((secs, _)) => {
                        if let Some(d) = direct {
                            eprintln!(
                                "  [4] {}: {secs:.2} s, paired direct cold pass {d:.2} s",
                                tool.name()
                            );
                            ratios.push(secs / d);
                        }
                        vals.push(secs);
                    }
                    Err(e) => err = Some(e),
                }
                mounted = Some((mount, base));
                if err.is_some() {
                    break;
                }
            }
            small_passes += 1;
            if !ratios.is_empty() {
                self.ratios.insert(("4".into(), tool), median(&ratios));
            }
            if tool == Tool::Direct && !vals.is_empty() {
                self.floor_figure(&small, median(&vals));
            }
            self.record("4", tool, err.map_or(Ok(vals), Err), Unit::Seconds);
        }
        let (mount, base) = match mounted {
            Some(m) => m,
            None => match self.mount_set(tool, &small_dir, &rows) {
                Some(m) => m,
                None => return,
            },
        };
        if self.s.wants("2") || self.s.wants("2b") {
            // Warm-up: fills the locafs/rclone cache, then a pass that opens
            // every file from the complete cache (passthrough); and one
            // direct pass for the paired direct runs.
            let warm: io::Result<()> = (small_passes..2)
                .try_for_each(|i| {
                    if i == 1 {
                        wait_cache_settled(tool, mount.as_ref(), small.len());
                    }
                    eprintln!("  warm-up pass {} over the small files", i + 1);
                    random_pass(&base, &small, 100 + i).map(|_| ())
                })
                .and_then(|_| random_pass(&data, &small, 150).map(|_| ()));
            if let Err(e) = warm {
                self.record("2", tool, Err(e), Unit::FilesPerS);
            } else {
                if self.s.wants("2") {
                    self.paired("2", tool, Unit::FilesPerS, &base, false, |b, i| {
                        random_pass(b, &small, 200 + i).map(|x| x.1)
                    });
                }
                if self.s.wants("2b") {
                    self.paired("2b", tool, Unit::FilesPerS, &base, true, |b, i| {
                        random_pass(b, &small, 300 + i).map(|x| x.1)
                    });
                }
            }
            if let Some(m) = &mount {
                print_locafs_stats(tool, m);
            }
        }
        drop(mount);
        if self.s.wants("1") || self.s.wants("1b") {
            let Some((mount, base)) = self.mount_set(tool, &large_dir, &["1", "1b"]) else {
                return;
            };
            let warm: io::Result<()> = (0..2)
                .try_for_each(|i| {
                    if i == 1 {
                        wait_cache_settled(tool, mount.as_ref(), large.len());
                    }
                    eprintln!("  warm-up pass {} over the large files", i + 1);
                    seq_pass(&base, &large).map(|_| ())
                })
                .and_then(|_| seq_pass(&data, &large).map(|_| ()));
            if let Err(e) = warm {
                self.record("1", tool, Err(e), Unit::GBps);
            } else {
                if self.s.wants("1") {
                    self.paired("1", tool, Unit::GBps, &base, false, |b, _| {
                        seq_pass(b, &large)
                    });
                }
                if self.s.wants("1b") {
                    self.paired("1b", tool, Unit::GBps, &base, true, |b, _| {
                        seq_pass(b, &large)
                    });
                }
            }
            if let Some(m) = &mount {
                print_locafs_stats(tool, m);
            }
        }
        if self.s.wants("3") {
            let Some((_mount, base)) = self.mount_set(tool, &meta_dir, &["3"]) else {
                return;
            };
            let name = meta_dir;
            let expect = self.sz.meta_files + CLASSES as u64;
            let warm = walk_pass(&base.join(&name), expect)
                .and_then(|_| walk_pass(&data.join(&name), expect));
            match warm {
                Err(e) => self.record("3", tool, Err(e), Unit::EntriesPerS),
                Ok(_) => self.paired("3", tool, Unit::EntriesPerS, &base, false, |b, _| {
                    walk_pass(&b.join(&name), expect)
                }),
            }
        }
    }

    /// Mounts data set `dir` (under the data directory) for `tool`; returns
    /// the guard (None for direct) and the directory under which `dir`'s
    /// relative paths are read. On failure marks `rows` and returns None.
    fn mount_set(
        &mut self,
        tool: Tool,
        dir: &str,
        rows: &[&str],
    ) -> Option<(Option<Mounted>, PathBuf)> {
        if tool == Tool::Direct {
            return Some((None, self.data.clone()));
        }
        match Mounted::start(tool, &self.data.join(dir), &self.s, "set") {
            Ok(m) => {
                let base = m.mnt.parent().map(Path::to_path_buf).unwrap_or_default();
                Some((Some(m), base))
            }
            Err(e) => {
                eprintln!("  mount of {dir} failed: {e}");
                self.mark_all(rows, tool, &format!("ERROR: {e}"));
                None
            }
        }
    }

    /// Figure 5 for one tool: peak RSS of the daemon after a walk of the
    /// big tree on a fresh mount.
    fn rss_figure(&mut self, tool: Tool, tree: &Path) {
        if !self.s.wants("5") {
            return;
        }
        match tool {
            Tool::Direct => {
                self.put("5", tool, Cell::Text("n/a (no daemon)".into()));
                return;
            }
            Tool::LocafsNoPt | Tool::LocafsKernel => {
                self.put("5", tool, Cell::Text("n/a (same path as locafs)".into()));
                return;
            }
            _ => {}
        }
        if tool.program().is_none() {
            self.put("5", tool, Cell::Text("SKIPPED (not installed)".into()));
            return;
        }
        eprintln!("== {} (figure 5) ==", tool.name());
        let m = match Mounted::start(tool, tree, &self.s, "tree") {
            Ok(m) => m,
            Err(e) => {
                self.record("5", tool, Err(io::Error::other(e)), Unit::MiB);
                return;
            }
        };
        let before =
            vm_hwm_mib(common::restart::server_pid(&m.mnt).unwrap_or(m.pid())).unwrap_or(f64::NAN);
        let expect = self.sz.tree_files + self.sz.tree_dirs;
        let t = Instant::now();
        let r = walk(&m.mnt).and_then(|n| {
            if n != expect {
                return Err(io::Error::other(format!(
                    "walk saw {n} entries, expected {expect}"
                )));
            }
            eprintln!(
                "  walk of {n} entries in {:.1} s; VmHWM at mount {before:.1} MiB",
                t.elapsed().as_secs_f64()
            );
            vm_hwm_mib(common::restart::server_pid(&m.mnt).unwrap_or(m.pid())).map(|v| vec![v])
        });
        self.record("5", tool, r, Unit::MiB);
        drop(m);
    }

    /// The ratio of a tool's figure to direct: the median of the paired
    /// ratios if there are any, else against the direct column.
    fn ratio(&self, row: &Row, tool: Tool, v: f64, direct: Option<f64>) -> Option<f64> {
        if row.unit == Unit::MiB || tool == Tool::Direct {
            return None;
        }
        if let Some(r) = self.ratios.get(&(row.id.to_string(), tool)) {
            return Some(*r);
        }
        direct.filter(|d| *d > 0.0).map(|d| v / d)
    }

    fn table(&self) -> String {
        let mut out = String::new();
        let cols: Vec<Tool> = TOOLS.to_vec();
        out.push_str("| figure | unit |");
        for t in &cols {
            if *t == Tool::Direct {
                out.push_str(" direct |");
            } else {
                out.push_str(&format!(" {} | ratio |", t.name()));
            }
        }
        out.push_str(" goal (locafs) |\n|---|---|");
        for t in &cols {
            out.push_str(if *t == Tool::Direct {
                "---:|"
            } else {
                "---:|---:|"
            });
        }
        out.push_str("---|\n");
        for row in ROWS {
            if !self.s.wants(row.id) {
                continue;
            }
            out.push_str(&format!(
                "| {} | {} |",
                self.sz.label(
                    row.id,
                    if row.id == "4" {
                        self.s.cold_runs
                    } else {
                        self.s.runs
                    }
                ),
                unit_name(row.unit)
            ));
            let direct = match self.cells.get(&(row.id.to_string(), Tool::Direct)) {
                Some(Cell::Value(v)) => Some(*v),
                _ => None,
            };
            for t in &cols {
                let cell = self.cells.get(&(row.id.to_string(), *t));
                let (v, ratio) = match cell {
                    Some(Cell::Value(v)) => (
                        fmt_value(row.unit, *v),
                        match self.ratio(row, *t, *v, direct) {
                            Some(r) => format!("{r:.2}"),
                            None => "-".into(),
                        },
                    ),
                    Some(Cell::Text(s)) => (s.clone(), "-".into()),
                    None => ("-".into(), "-".into()),
                };
                if *t == Tool::Direct {
                    out.push_str(&format!(" {v} |"));
                } else {
                    out.push_str(&format!(" {v} | {ratio} |"));
                }
            }
            let ours = match self.cells.get(&(row.id.to_string(), Tool::Locafs)) {
                Some(Cell::Value(v)) => Some(*v),
                _ => None,
            };
            let ours_ratio = ours.and_then(|v| self.ratio(row, Tool::Locafs, v, direct));
            let goal = match (row.goal, ours, ours_ratio) {
                (None, _, _) => "-".to_string(),
                (Some(Goal::AtLeastRatio(g)), _, Some(r)) => format!(
                    ">= {g:.2} x direct: {} ({r:.2})",
                    if r >= g { "met" } else { "NOT met" },
                ),
                (Some(Goal::AtMostRatio(g)), _, Some(r)) => format!(
                    "<= {g:.2} x direct: {} ({r:.2})",
                    if r <= g { "met" } else { "NOT met" },
                ),
                (Some(Goal::Below(g)), Some(v), _) => format!(
                    "< {g:.0} {}: {}",
                    unit_name(row.unit),
                    if v < g { "met" } else { "NOT met" }
                ),
                (Some(_), _, _) => "not measured".to_string(),
            };
            out.push_str(&format!(" {goal} |\n"));
        }
        out
    }
}

/// `locafs stats --json` of a locafs mount.
fn locafs_stats(m: &Mounted) -> Option<serde_json::Value> {
    common::try_stats_of(&m.mnt)
}

/// Waits (at most 2 minutes) until a locafs mount holds all `files` whole
/// in its cache, and says how long that took. A cold pass that outruns the
/// cache disk has blocks turned away, and background prefetch writes them
/// in the seconds after (up to a minute when the disk is still flushing an
/// earlier figure's writes); a warm figure measures the cache once it has
/// settled, as a loader's second epoch finds it, not that catch-up.
fn wait_cache_settled(tool: Tool, m: Option<&Mounted>, files: usize) {
    let Some(m) = m else { return };
    if !matches!(tool, Tool::Locafs | Tool::LocafsNoPt | Tool::LocafsKernel) {
        return;
    }
    let t = Instant::now();
    let mut cached = 0;
    while t.elapsed() < Duration::from_secs(120) {
        cached = locafs_stats(m)
            .and_then(|v| v.get("files_cached")?.as_u64())
            .unwrap_or(0);
        if cached >= files as u64 {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    eprintln!(
        "  cache settled: {cached} of {files} files cached whole, {:.1} s after the cold pass",
        t.elapsed().as_secs_f64()
    );
}

/// Prints what the locafs daemon says it did (passthrough opens, bytes from
/// source and cache), so a figure can be read against it.
fn print_locafs_stats(tool: Tool, m: &Mounted) {
    if !matches!(tool, Tool::Locafs | Tool::LocafsNoPt | Tool::LocafsKernel) {
        return;
    }
    if let Some(v) = locafs_stats(m) {
        let pick = |k: &str| v.get(k).map_or_else(|| "?".into(), |x| x.to_string());
        eprintln!(
            "  {} stats: opens {} passthrough_opens {} source_bytes {} cache_hit_bytes {} read_errors {}",
            tool.name(),
            pick("opens"),
            pick("passthrough_opens"),
            pick("source_bytes"),
            pick("cache_hit_bytes"),
            pick("read_errors")
        );
    }
}

fn machine() -> String {
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem = fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .map(|kb| format!("{:.0} GiB", kb / 1024.0 / 1024.0))
        .unwrap_or_else(|| "?".into());
    let model = fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "?".into());
    format!("{cpus} cores ({model}), {mem} RAM, kernel {kernel}")
}

fn main() {
    // `cargo test --all-targets` runs bench binaries without --bench: do not
    // start a half-hour benchmark then.
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("core: a benchmark; run it with `cargo bench --bench core`");
        return;
    }
    let s = match Settings::from_env() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("core: {e}");
            std::process::exit(2);
        }
    };
    // It mounts FUSE file systems and drops caches.
    require_fuse!();
    if let Err(e) = fs::create_dir_all(&s.root) {
        eprintln!("core: {}: {e}", s.root.display());
        std::process::exit(1);
    }
    detach_leftovers(&s.root);
    let sz = Sizes::new(&s);
    let data = s.root.join("data");
    let mut b = Bench {
        data,
        sz,
        s,
        cells: BTreeMap::new(),
        ratios: BTreeMap::new(),
        floor4: None,
    };
    let started = Instant::now();
    let gen = || -> io::Result<PathBuf> {
        let (ln, large) = large_list(&b.sz);
        if b.s.wants("1") || b.s.wants("1b") {
            ensure_files(&b.s.root, &b.data, &ln, &large)?;
        }
        let (sn, small) = small_list(&b.sz);
        if b.s.wants("2") || b.s.wants("2b") || b.s.wants("4") {
            ensure_files(&b.s.root, &b.data, &sn, &small)?;
        }
        if b.s.wants("3") {
            let name = format!("meta-{}", b.sz.meta_files);
            ensure_empty_tree(
                &b.s.root,
                &b.data.join(&name),
                &name,
                b.sz.meta_files,
                CLASSES as u64,
            )?;
        }
        let name = format!("tree-{}", b.sz.tree_files);
        let tree = b.s.root.join(&name);
        if b.s.wants("5") {
            ensure_empty_tree(&b.s.root, &tree, &name, b.sz.tree_files, b.sz.tree_dirs)?;
        }
        Ok(tree)
    };
    let tree = match gen() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("core: generating the data sets failed: {e}");
            std::process::exit(1);
        }
    };
    let tools: Vec<Tool> = TOOLS.into_iter().filter(|t| b.s.uses(*t)).collect();
    for t in &tools {
        b.main_figures(*t);
    }
    for t in &tools {
        b.rss_figure(*t, &tree);
    }
    let date = Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d %H:%M UTC")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    println!();
    println!(
        "locafs core benchmark, {date}; {}; scale {}; {:.0} s",
        machine(),
        b.s.scale,
        started.elapsed().as_secs_f64()
    );
    println!(
        "ratio = tool / direct, the median of per-run ratios against a direct run made just before \
         each tool run (higher is better for rates, lower for times); the direct column is the \
         median of the direct runs of the direct section."
    );
    println!();
    print!("{}", b.table());
    if let Some((floor, direct)) = b.floor4 {
        let f = floor / direct;
        println!();
        println!(
            "4 floor: the cold pass with O_DIRECT reads, plus an O_DIRECT write of every file to {} \
             (a cache's disk traffic, no FUSE, no hashing): {floor:.2} s against {direct:.2} s, \
             {f:.2}x direct.",
            b.s.cache_root.display()
        );
        for t in [
            Tool::Locafs,
            Tool::LocafsNoPt,
            Tool::LocafsKernel,
            Tool::Rclone,
        ] {
            if let Some(r) = b.ratios.get(&("4".to_string(), t)) {
                println!("  {}: {r:.2}x direct = {:.2}x the floor", t.name(), r / f);
            }
        }
    }
}
