//! `locafs warm` and `locafs plan`: the command-line side of the control
//! channel. `warm` walks the given paths through the mount and asks the
//! daemon to cache each file as the walk finds it (a walk of millions of
//! files must not come before the first byte), in parallel, with a progress
//! bar (plain lines when stdout is not a terminal), and ends with an honest
//! summary: exit 0 only if everything asked for is cached.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::mount::control::{mount_root_of, Client, Request};
use crate::sys::units::format_size;

/// Arguments of `locafs warm`.
#[derive(clap::Args, Debug)]
pub struct WarmArgs {
    /// Files or directories inside a locafs mount.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Files cached in parallel.
    #[arg(long, default_value_t = 8)]
    pub jobs: usize,
}

/// Arguments of `locafs plan`.
#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// The mountpoint.
    pub mountpoint: PathBuf,
    /// A file with one path per line (relative to the mount, or absolute
    /// under it), in the order the loader will read them; - for stdin.
    pub file: PathBuf,
}

/// What the walk has found so far, for the progress line and the summary.
#[derive(Default)]
struct Found {
    files: AtomicU64,
    bytes: AtomicU64,
    /// The walk has ended: `files` and `bytes` are the totals.
    done: std::sync::atomic::AtomicBool,
}

/// Walks `rel` under the mount `root` depth first, in name order, and hands
/// each regular file to `tx` as it finds it (so that the workers start on
/// the first file, not after a walk of millions). A directory's kind comes
/// from the listing (no stat); a file's size from one `lstat`, which the
/// kernel answers from the listing's attributes. A directory that cannot be
/// read is a problem of the run, not its end.
fn walk(
    root: &Path,
    rel: &Path,
    tx: &std::sync::mpsc::SyncSender<(PathBuf, PathBuf, u64)>,
    found: &Found,
    problems: &Mutex<Vec<String>>,
) -> usize {
    let mut failed = 0;
    let mut stack = vec![rel.to_owned()];
    while let Some(dir) = stack.pop() {
        let entries =
            std::fs::read_dir(root.join(&dir)).and_then(|rd| rd.collect::<Result<Vec<_>, _>>());
        let mut entries = match entries {
            Ok(e) => e,
            Err(e) => {
                failed += 1;
                if let Ok(mut p) = problems.lock() {
                    p.push(format!(
                        "{}: {}",
                        dir.display(),
                        crate::obs::logging::short_io(&e)
                    ));
                }
                continue;
            }
        };
        entries.sort_by_key(|e| e.file_name());
        let mut subdirs = Vec::new();
        for e in entries {
            let rel = dir.join(e.file_name());
            match e.file_type() {
                Ok(t) if t.is_dir() => subdirs.push(rel),
                Ok(t) if t.is_file() => {
                    let size = e.metadata().map_or(0, |m| m.len());
                    found.files.fetch_add(1, Relaxed);
                    found.bytes.fetch_add(size, Relaxed);
                    if tx.send((root.to_owned(), rel, size)).is_err() {
                        return failed;
                    }
                }
                _ => {}
            }
        }
        // Popped last first: the first subdirectory is walked next.
        stack.extend(subdirs.into_iter().rev());
    }
    failed
}

pub fn warm(args: WarmArgs) -> ExitCode {
    // Every path is checked before anything is asked of the daemon: a wrong
    // one is a usage error, not a problem found halfway.
    let starts = match starting_points(&args.paths) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("locafs: {e}");
            return ExitCode::from(2);
        }
    };
    let (tx, rx) = std::sync::mpsc::sync_channel::<(PathBuf, PathBuf, u64)>(4096);
    let queue = Mutex::new(rx);
    let progress = Progress::new();
    std::thread::scope(|s| {
        let progress = &progress;
        s.spawn(move || {
            for (root, rel, is_dir) in starts {
                if is_dir {
                    let f = walk(&root, &rel, &tx, &progress.found, &progress.problems);
                    progress.failed.fetch_add(f, Relaxed);
                } else if let Ok(m) = std::fs::symlink_metadata(root.join(&rel)) {
                    if m.is_file() {
                        progress.found.files.fetch_add(1, Relaxed);
                        progress.found.bytes.fetch_add(m.len(), Relaxed);
                        let _ = tx.send((root, rel, m.len()));
                    }
                }
            }
            progress.found.done.store(true, Relaxed);
        });
        for _ in 0..args.jobs.max(1) {
            let queue = &queue;
            s.spawn(move || warm_worker(queue, progress));
        }
    });
    progress.finish()
}

/// Each path as (its mount's root, the path below it, whether a
/// directory); the first that is not in a locafs mount or not there is the
/// error.
fn starting_points(paths: &[PathBuf]) -> Result<Vec<(PathBuf, PathBuf, bool)>, String> {
    let mut starts = Vec::new();
    for p in paths {
        let (root, rel) = mount_root_of(p)?;
        let m = std::fs::symlink_metadata(root.join(&rel))
            .map_err(|e| format!("{}: {}", p.display(), crate::obs::logging::short_io(&e)))?;
        starts.push((root, rel, m.is_dir()));
    }
    Ok(starts)
}

/// One worker of `warm`: asks the mount of each file it takes from the
/// queue to cache it, one connection per mount, until the queue ends.
fn warm_worker(
    queue: &Mutex<std::sync::mpsc::Receiver<(PathBuf, PathBuf, u64)>>,
    progress: &Progress,
) {
    let mut client: Option<(PathBuf, Client)> = None;
    loop {
        let Some((root, rel, size)) = queue.lock().ok().and_then(|q| q.recv().ok()) else {
            return;
        };
        if client.as_ref().is_none_or(|(r, _)| *r != root) {
            match Client::connect(&root) {
                Ok(c) => client = Some((root.clone(), c)),
                Err(e) => {
                    progress.problem(e);
                    continue;
                }
            }
        }
        let Some((_, c)) = client.as_mut() else {
            continue;
        };
        match c.call(&Request::Warm { path: rel.clone() }) {
            Ok(r) => {
                progress.cached_bytes.fetch_add(r.cached_bytes, Relaxed);
                progress.missing_bytes.fetch_add(r.missing_bytes, Relaxed);
                if !r.ok {
                    progress.problem(format!(
                        "{}: {}",
                        rel.display(),
                        r.error.unwrap_or_default()
                    ));
                }
            }
            Err(e) => {
                client = None;
                progress.problem(format!("{}: {e}", rel.display()));
            }
        }
        progress.advance(size);
    }
}

/// What `warm` has found, done and met, shown as it goes (a bar on a
/// terminal, else a line every 1,000 files) and summed up at the end.
struct Progress {
    found: Found,
    done_files: AtomicU64,
    done_bytes: AtomicU64,
    cached_bytes: AtomicU64,
    missing_bytes: AtomicU64,
    failed: AtomicUsize,
    problems: Mutex<Vec<String>>,
    bar: Option<indicatif::ProgressBar>,
    start: Instant,
}

impl Progress {
    fn new() -> Progress {
        let bar = std::io::stdout().is_terminal().then(|| {
            let b = indicatif::ProgressBar::new(0);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            b
        });
        Progress {
            found: Found::default(),
            done_files: AtomicU64::new(0),
            done_bytes: AtomicU64::new(0),
            cached_bytes: AtomicU64::new(0),
            missing_bytes: AtomicU64::new(0),
            failed: AtomicUsize::new(0),
            problems: Mutex::new(Vec::new()),
            bar,
            start: Instant::now(),
        }
    }

    /// A file that failed, and why.
    fn problem(&self, why: String) {
        self.failed.fetch_add(1, Relaxed);
        if let Ok(mut p) = self.problems.lock() {
            p.push(why);
        }
    }

    /// One more file done, of `size` bytes.
    fn advance(&self, size: u64) {
        let f = self.done_files.fetch_add(1, Relaxed) + 1;
        let b = self.done_bytes.fetch_add(size, Relaxed) + size;
        // The totals grow while the walk goes on.
        let (total_files, total_bytes) = (
            self.found.files.load(Relaxed),
            self.found.bytes.load(Relaxed),
        );
        let walking = if self.found.done.load(Relaxed) {
            ""
        } else {
            " found so far"
        };
        match &self.bar {
            Some(bar) => {
                bar.set_length(total_bytes);
                bar.set_position(b);
                bar.set_message(format!("{f}/{total_files} files{walking}"));
            }
            None => {
                if f % 1000 == 0 || (f == total_files && walking.is_empty()) {
                    let el = self.start.elapsed().as_secs_f64().max(1e-3);
                    println!(
                        "{f}/{total_files} files{walking}, {}/{} ({}/s)",
                        format_size(b),
                        format_size(total_bytes),
                        format_size((b as f64 / el) as u64)
                    );
                }
            }
        }
    }

    /// The summary, the first problems, and the exit code (1 if any file
    /// failed).
    fn finish(&self) -> ExitCode {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
        let el = self.start.elapsed().max(Duration::from_millis(1));
        let failed = self.failed.load(Relaxed);
        println!(
            "warm: {} files, {} cached in {:.1}s; {} did not fit; {} files with problems",
            self.found.files.load(Relaxed),
            format_size(self.cached_bytes.load(Relaxed)),
            el.as_secs_f64(),
            format_size(self.missing_bytes.load(Relaxed)),
            failed
        );
        let problems = self.problems.lock().map(|p| p.clone()).unwrap_or_default();
        for p in problems.iter().take(20) {
            println!("  {p}");
        }
        if problems.len() > 20 {
            println!("  ... and {} more", problems.len() - 20);
        }
        if failed == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        }
    }
}

pub fn plan(args: PlanArgs) -> ExitCode {
    let text = if args.file.as_os_str() == "-" {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut std::io::stdin(), &mut s);
        s
    } else {
        match std::fs::read_to_string(&args.file) {
            Ok(s) => s,
            Err(e) => {
                eprintln!(
                    "locafs: {}: {}",
                    args.file.display(),
                    crate::obs::logging::short_io(&e)
                );
                return ExitCode::from(2);
            }
        }
    };
    let (root, mut c) = match connect_mount(&args.mountpoint) {
        Ok(x) => x,
        Err(code) => return code,
    };
    let paths: Vec<PathBuf> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| relative(Path::new(l), &root, &args.mountpoint))
        .collect();
    match c.call(&Request::Plan { paths }) {
        Ok(r) => {
            println!(
                "plan: {} files in order, {} paths not found",
                r.files, r.unknown
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("locafs: {e}");
            ExitCode::from(1)
        }
    }
}

/// The mount root of `mountpoint` and a client of its control socket;
/// the error is printed and its exit code returned (2: not a mount).
pub(crate) fn connect_mount(mountpoint: &Path) -> Result<(PathBuf, Client), ExitCode> {
    let root = std::fs::canonicalize(mountpoint).map_err(|e| {
        eprintln!(
            "locafs: {}: {}",
            mountpoint.display(),
            crate::obs::logging::short_io(&e)
        );
        ExitCode::from(2)
    })?;
    let c = Client::connect(&root).map_err(|e| {
        eprintln!("locafs: {e}");
        ExitCode::from(2)
    })?;
    Ok((root, c))
}

/// `file` relative to the mount root `root` (given as `mnt` on the command
/// line).
pub(crate) fn relative(file: &Path, root: &Path, mnt: &Path) -> PathBuf {
    let p = file
        .strip_prefix(root)
        .or_else(|_| file.strip_prefix(mnt))
        .unwrap_or(file);
    p.strip_prefix("/").unwrap_or(p).to_owned()
}
