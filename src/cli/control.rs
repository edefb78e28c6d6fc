//! `locafs warm` and `locafs plan`: the command-line side of the control
//! channel. `warm` walks the given paths through the mount and asks the
//! daemon to cache each file, in parallel, with a progress bar (plain lines
//! when stdout is not a terminal), and ends with an honest summary: exit 0
//! only if everything asked for is cached.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::control::{mount_root_of, Client, Request};
use crate::units::format_size;

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

fn collect(root: &Path, rel: &Path, out: &mut Vec<(PathBuf, u64)>) -> std::io::Result<()> {
    let full = root.join(rel);
    let m = std::fs::symlink_metadata(&full)?;
    if m.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(&full)?.collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            collect(root, &rel.join(e.file_name()), out)?;
        }
    } else if m.is_file() {
        out.push((rel.to_owned(), m.len()));
    }
    Ok(())
}

pub fn warm(args: WarmArgs) -> ExitCode {
    let mut work: Vec<(PathBuf, PathBuf, u64)> = Vec::new();
    for p in &args.paths {
        let (root, rel) = match mount_root_of(p) {
            Ok(x) => x,
            Err(e) => {
                eprintln!("locafs: {e}");
                return ExitCode::from(2);
            }
        };
        let mut files = Vec::new();
        if let Err(e) = collect(&root, &rel, &mut files) {
            eprintln!("locafs: {}: {}", p.display(), crate::logging::short_io(&e));
            return ExitCode::from(2);
        }
        work.extend(files.into_iter().map(|(r, s)| (root.clone(), r, s)));
    }
    let total_files = work.len() as u64;
    let total_bytes: u64 = work.iter().map(|w| w.2).sum();
    let tty = std::io::stdout().is_terminal();
    let bar = if tty {
        let b = indicatif::ProgressBar::new(total_bytes);
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
    let queue = Arc::new(Mutex::new(work));
    let done_files = Arc::new(AtomicU64::new(0));
    let done_bytes = Arc::new(AtomicU64::new(0));
    let cached_bytes = Arc::new(AtomicU64::new(0));
    let missing_bytes = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let problems = Arc::new(Mutex::new(Vec::<String>::new()));
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..args.jobs.max(1) {
            let (queue, done_files, done_bytes) = (&queue, &done_files, &done_bytes);
            let (cached_bytes, missing_bytes, failed, problems, bar) =
                (&cached_bytes, &missing_bytes, &failed, &problems, &bar);
            s.spawn(move || {
                let mut client: Option<(PathBuf, Client)> = None;
                loop {
                    let Some((root, rel, size)) = queue.lock().ok().and_then(|mut q| q.pop())
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
                    match bar {
                        Some(bar) => {
                            bar.set_position(b);
                            bar.set_message(format!("{f}/{total_files} files"));
                        }
                        None => {
                            if f % 1000 == 0 || f == total_files {
                                let el = start.elapsed().as_secs_f64().max(1e-3);
                                println!(
                                    "{f}/{total_files} files, {}/{} ({}/s)",
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
        total_files,
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
                    crate::logging::short_io(&e)
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
            crate::logging::short_io(&e)
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
