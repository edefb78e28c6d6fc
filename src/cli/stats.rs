//! `locafs stats MOUNTPOINT`: reads the stats of a running mount through an
//! extended attribute of its root (nothing is added to the tree) and prints
//! them as a table or JSON, once or every second (`--watch`, with rates).
//!
//! Read-only: it never changes the mount or its cache.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::fs::fuse::STATS_XATTR;
use crate::obs::stats::StatsSnapshot;
use crate::sys::units::format_size;

/// Arguments of `locafs stats`.
#[derive(clap::Args, Debug)]
pub struct StatsArgs {
    /// The mountpoint of a locafs mount.
    pub mountpoint: PathBuf,
    /// Print JSON (the schema is stable; for scripts).
    #[arg(long)]
    pub json: bool,
    /// Refresh every second, with rates (bytes/s per tier); with --json, one
    /// JSON object per line per second. Stops on Ctrl-C or when the mount
    /// goes away.
    #[arg(long)]
    pub watch: bool,
}

/// Fetches the stats of the mount at `mountpoint`.
pub fn fetch(mountpoint: &std::path::Path) -> Result<StatsSnapshot, String> {
    let raw = crate::sys::getxattr(mountpoint, STATS_XATTR).map_err(|e| {
        if e.raw_os_error() == Some(libc::ENODATA) || e.raw_os_error() == Some(libc::ENOTSUP) {
            format!("{}: not a locafs mount", mountpoint.display())
        } else {
            format!(
                "{}: {}",
                mountpoint.display(),
                crate::obs::logging::short_io(&e)
            )
        }
    })?;
    let mut snap: StatsSnapshot = serde_json::from_slice(&raw)
        .map_err(|e| format!("{}: unreadable stats: {e}", mountpoint.display()))?;
    snap.mountpoints = mountpoints(mountpoint);
    Ok(snap)
}

/// Every mountpoint of the mount `mountpoint` is on: the mounts of its
/// FUSE connection (the same device in /proc/self/mountinfo).
fn mountpoints(mountpoint: &std::path::Path) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = std::fs::metadata(mountpoint) else {
        return Vec::new();
    };
    if libc::major(m.dev()) != 0 {
        return Vec::new();
    }
    crate::mount::connection::mountpoints_of(libc::minor(m.dev()))
        .iter()
        .map(|p| p.display().to_string())
        .collect()
}

/// Per-second rates between two snapshots.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rates {
    pub cache_bytes_s: f64,
    pub peer_bytes_s: f64,
    pub source_bytes_s: f64,
    pub source_reads_s: f64,
    pub opens_s: f64,
}

impl Rates {
    pub fn between(a: &StatsSnapshot, b: &StatsSnapshot, secs: f64) -> Rates {
        let r = |x: u64, y: u64| y.saturating_sub(x) as f64 / secs.max(1e-3);
        Rates {
            cache_bytes_s: r(a.cache_hit_bytes, b.cache_hit_bytes),
            peer_bytes_s: r(a.peer_bytes, b.peer_bytes),
            source_bytes_s: r(a.source_bytes, b.source_bytes),
            source_reads_s: r(a.source_reads, b.source_reads),
            opens_s: r(a.opens, b.opens),
        }
    }

    /// The rate lines shown under the table.
    pub fn lines(&self) -> String {
        let bps = |v: f64| format!("{}/s", format_size(v.round() as u64));
        format!(
            "rate cache   {}\nrate peer    {}\nrate source  {} ({:.0} reads/s)\nrate opens   {:.0}/s\n",
            bps(self.cache_bytes_s),
            bps(self.peer_bytes_s),
            bps(self.source_bytes_s),
            self.source_reads_s,
            self.opens_s
        )
    }
}

pub fn main(args: StatsArgs) -> ExitCode {
    if args.watch {
        return watch(&args);
    }
    match fetch(&args.mountpoint) {
        Ok(s) => {
            if args.json {
                println!("{}", serde_json::to_string_pretty(&s).unwrap_or_default());
            } else {
                print!("{}", super::stats_table::table(&s));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("locafs: {e}");
            ExitCode::from(2)
        }
    }
}

/// `--watch`: a fresh table (or JSON line) every second until the mount
/// goes away (exit 2 with the reason) or the output is closed (exit 0).
fn watch(args: &StatsArgs) -> ExitCode {
    let tty = std::io::stdout().is_terminal();
    let mut prev: Option<(StatsSnapshot, Instant)> = None;
    let mut next = Instant::now();
    loop {
        let snap = match fetch(&args.mountpoint) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("locafs: {e}");
                return ExitCode::from(2);
            }
        };
        let now = Instant::now();
        let out = if args.json {
            format!("{}\n", serde_json::to_string(&snap).unwrap_or_default())
        } else {
            let rates = match &prev {
                Some((p, t)) => Rates::between(p, &snap, now.duration_since(*t).as_secs_f64()),
                None => Rates::between(&snap, &snap, 1.0),
            };
            let head = if tty { "\x1b[H\x1b[2J" } else { "" };
            format!(
                "{head}{}{}\n",
                super::stats_table::table(&snap),
                rates.lines()
            )
        };
        let mut stdout = std::io::stdout().lock();
        if stdout
            .write_all(out.as_bytes())
            .and_then(|_| stdout.flush())
            .is_err()
        {
            return ExitCode::SUCCESS;
        }
        drop(stdout);
        prev = Some((snap, now));
        next += Duration::from_secs(1);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(cache: u64, source: u64, reads: u64) -> StatsSnapshot {
        StatsSnapshot {
            source: "s".into(),
            mountpoint: "m".into(),
            source_bytes: source,
            source_reads: reads,
            source_errors: 0,
            cache_hit_bytes: cache,
            cache_miss_bytes: 0,
            cache_used_bytes: 0,
            cache_capacity_bytes: 1,
            cache_writable: true,
            cache_evictions: 0,
            corrupt_blocks: 0,
            cache_write_errors: 0,
            cache_writes_skipped: 0,
            cache_writes_refused: 0,
            files_cached: 0,
            peer_bytes: 0,
            opens: 0,
            open_handles: 0,
            passthrough_kept: 0,
            passthrough_opens: 0,
            read_errors: 0,
            uptime_s: 0.0,
            read_ahead: Default::default(),
            peer_served_bytes: 0,
            peer_bad_blocks: 0,
            peer_busy: 0,
            peer_failures: 0,
            peer_bad_requests: 0,
            peer_refused_connections: 0,
            ..Default::default()
        }
    }

    #[test]
    fn rates_are_per_second_and_never_negative() {
        let r = Rates::between(&snap(0, 100, 1), &snap(4 << 20, 300, 3), 2.0);
        assert_eq!(r.cache_bytes_s, (2 << 20) as f64);
        assert_eq!(r.source_bytes_s, 100.0);
        assert_eq!(r.source_reads_s, 1.0);
        // A restarted daemon's counters go down: shown as 0, not negative.
        let r = Rates::between(&snap(10, 10, 1), &snap(0, 0, 0), 1.0);
        assert_eq!(r.cache_bytes_s, 0.0);
        assert!(r.lines().contains("rate cache   0 B/s"), "{}", r.lines());
    }
}
