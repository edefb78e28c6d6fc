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
use std::sync::{Arc, Mutex};
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
    let mut starts: Vec<(PathBuf, PathBuf, bool)> = Vec::new();
    for p in &args.paths {
        let (root, rel) = match mount_root_of(p) {
            Ok(x) => x,
            Err(e) => {
                eprintln!("locafs: {e}");
                return ExitCode::from(2);
            }
        };
        match std::fs::symlink_metadata(root.join(&rel)) {
            Ok(m) => starts.push((root, rel, m.is_dir())),
            Err(e) => {
                eprintln!(
                    "locafs: {}: {}",
                    p.display(),
                    crate::obs::logging::short_io(&e)
                );
                return ExitCode::from(2);
            }
        }
    }
    let tty = std::io::stdout().is_terminal();
    let bar = if tty {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        Some(b)
    } else {
        None
    };
    let (tx, rx) = std::sync::mpsc::sync_channel::<(PathBuf, PathBuf, u64)>(4096);
    let queue = Mutex::new(rx);
    let found = Found::default();
    let done_files = Arc::new(AtomicU64::new(0));
    let done_bytes = Arc::new(AtomicU64::new(0));
    let cached_bytes = Arc::new(AtomicU64::new(0));
    let missing_bytes = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let problems = Arc::new(Mutex::new(Vec::<String>::new()));
    let start = Instant::now();
    std::thread::scope(|s| {
        let (found, failed_walk, problems_walk) = (&found, &failed, &problems);
        s.spawn(move || {
            for (root, rel, is_dir) in starts {
                if is_dir {
                    let f = walk(&root, &rel, &tx, found, problems_walk);
                    failed_walk.fetch_add(f, Relaxed);
                } else if let Ok(m) = std::fs::symlink_metadata(root.join(&rel)) {
                    if m.is_file() {
                        found.files.fetch_add(1, Relaxed);
                        found.bytes.fetch_add(m.len(), Relaxed);
                        let _ = tx.send((root, rel, m.len()));
                    }
                }
            }
            found.done.store(true, Relaxed);
        });
        for _ in 0..args.jobs.max(1) {
            let (queue, done_files, done_bytes) = (&queue, &done_files, &done_bytes);
            let (cached_bytes, missing_bytes, failed, problems, bar) =
                (&cached_bytes, &missing_bytes, &failed, &problems, &bar);
            s.spawn(move || {
                let mut client: Option<(PathBuf, Client)> = None;
                loop {
                    let Some((root, rel, size)) = queue.lock().ok().and_then(|q| q.recv().ok())
                    else {
                        return;
                    };
                    if client.as_ref().is_none_or(|(r, _)| *r != root) {
                        match Client::connect(&root) {
                            Ok(c) => client = Some((root.clone(), c)),
                            Err(e) => {
                                failed.fetch_add(1, Relaxed);
                                if let Ok(mut p) = problems.lock() {
                                    p.push(e);
                                }
                                continue;
                            }
                        }
                    }
                    let Some((_, c)) = client.as_mut() else {
                        continue;
                    };
                    match c.call(&Request::Warm { path: rel.clone() }) {
                        Ok(r) => {
                            cached_bytes.fetch_add(r.cached_bytes, Relaxed);
                            missing_bytes.fetch_add(r.missing_bytes, Relaxed);
                            if !r.ok {
                                failed.fetch_add(1, Relaxed);
                                if let Ok(mut p) = problems.lock() {
                                    p.push(format!(
                                        "{}: {}",
                                        rel.display(),
                                        r.error.unwrap_or_default()
                                    ));
                                }
                            }
                        }
                        Err(e) => {
                            failed.fetch_add(1, Relaxed);
                            client = None;
                            if let Ok(mut p) = problems.lock() {
                                p.push(format!("{}: {e}", rel.display()));
                            }
                        }
                    }
                    let f = done_files.fetch_add(1, Relaxed) + 1;
                    let b = done_bytes.fetch_add(size, Relaxed) + size;
                    // The totals grow while the walk goes on.
                    let (total_files, total_bytes) =
                        (found.files.load(Relaxed), found.bytes.load(Relaxed));
                    let walking = if found.done.load(Relaxed) {
                        ""
                    } else {
                        " found so far"
                    };
                    match bar {
                        Some(bar) => {
                            bar.set_length(total_bytes);
                            bar.set_position(b);
                            bar.set_message(format!("{f}/{total_files} files{walking}"));
                        }
                        None => {
                            if f % 1000 == 0 || (f == total_files && walking.is_empty()) {
                                let el = start.elapsed().as_secs_f64().max(1e-3);
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
            });
        }
    });
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let el = start.elapsed().max(Duration::from_millis(1));
    let failed = failed.load(Relaxed);
    println!(
        "warm: {} files, {} cached in {:.1}s; {} did not fit; {} files with problems",
        found.files.load(Relaxed),
        format_size(cached_bytes.load(Relaxed)),
        el.as_secs_f64(),
        format_size(missing_bytes.load(Relaxed)),
        failed
    );
    let problems = problems.lock().map(|p| p.clone()).unwrap_or_default();
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
