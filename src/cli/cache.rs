//! `locafs cache ls|rm|gc`: what an admin sees and cleans in a cache
//! directory that many data sets share (`budget.rs` keeps its ledger).
//! Every command works without a mount running.
//!
//! It must never delete a data set that a running mount holds: each
//! removal takes that data set's lock first, and is refused when it cannot.
//! Nor may it follow a symlink in the cache directory or act in one that
//! another user owns or can write: every command works through the
//! directory's checked handle (`private_dir`), as a mount does.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::cache::budget::{self, DatasetInfo};
use crate::sys::private_dir::PrivateDir;
use crate::sys::units::{format_size, Size, Span};

/// Arguments of `locafs cache`.
#[derive(clap::Args, Debug)]
pub struct CacheArgs {
    #[command(subcommand)]
    pub command: CacheCommand,
    /// The cache directory [default: /var/cache/locafs as root, else
    /// $XDG_CACHE_HOME/locafs (~/.cache/locafs without it)].
    #[arg(long, global = true, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
}

#[derive(clap::Subcommand, Debug)]
pub enum CacheCommand {
    /// Each data set in the cache directory: its source, bytes and files
    /// held, last mount, and whether it is mounted now; with the budget.
    Ls {
        /// Print JSON (for scripts).
        #[arg(long)]
        json: bool,
    },
    /// Delete the cache of one data set (the names `ls` prints). Refused
    /// while it is mounted.
    Rm {
        /// The data set's name in the cache directory.
        dataset: String,
    },
    /// Delete the caches of data sets not mounted now: those last mounted
    /// longer ago than --older-than, then, least recently mounted first,
    /// more until all data sets hold at most --to.
    Gc {
        /// e.g. 30d, 12h.
        #[arg(long, value_name = "AGE")]
        older_than: Option<Span>,
        /// e.g. 500G.
        #[arg(long, value_name = "SIZE")]
        to: Option<Size>,
        /// Print what would be deleted, delete nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

pub fn main(args: CacheArgs) -> ExitCode {
    let dir = args
        .cache_dir
        .unwrap_or_else(crate::mount::config::default_cache_dir);
    // As `mount` opens it: the path may pass through symlinks (a link to
    // the cache disk).
    let dir = match PrivateDir::open_root(&dir, false) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("locafs: cache dir {}: no such directory", dir.display());
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!(
                "locafs: cache dir {}: {}",
                dir.display(),
                crate::obs::logging::short_io(&e)
            );
            return ExitCode::from(2);
        }
    };
    match args.command {
        CacheCommand::Ls { json } => ls(&dir, json),
        CacheCommand::Rm { dataset } => match budget::remove_dataset(&dir, &dataset) {
            Ok(bytes) => {
                println!("removed {dataset} ({})", format_size(bytes));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("locafs: {e}");
                ExitCode::from(1)
            }
        },
        CacheCommand::Gc {
            older_than,
            to,
            dry_run,
        } => gc(
            &dir,
            older_than.map(|s| s.0.as_secs()),
            to.map(|s| s.0),
            dry_run,
        ),
    }
}

/// The ledger and the data sets of `dir`, or None after saying why.
fn listed(dir: &PrivateDir) -> Option<(budget::Ledger, Vec<DatasetInfo>)> {
    budget::list(dir)
        .map_err(|e| {
            eprintln!(
                "locafs: cache dir {}: {}",
                dir.path().display(),
                crate::obs::logging::short_io(&e)
            )
        })
        .ok()
}

fn ls(dir: &PrivateDir, json: bool) -> ExitCode {
    let Some((ledger, mut list)) = listed(dir) else {
        return ExitCode::from(1);
    };
    for d in list.iter_mut().filter(|d| d.mounted) {
        d.mountpoints = mountpoints(dir, &d.id);
    }
    let used: u64 = list.iter().map(|d| d.used).sum();
    if json {
        let v = serde_json::json!({
            "cache_dir": dir.path(),
            "budget_bytes": ledger.limit,
            "budget_explicit": ledger.explicit,
            "free_floor_percent": ledger.free_floor_percent,
            "used_bytes": used,
            "datasets": list,
        });
        println!("{v}");
        return ExitCode::SUCCESS;
    }
    let budget = if ledger.limit == 0 {
        "none yet (set at the first mount)".to_owned()
    } else {
        format!(
            "{} ({})",
            format_size(ledger.limit),
            if ledger.explicit {
                "--cache-size"
            } else {
                "derived from the disk"
            }
        )
    };
    println!(
        "cache dir {}: {} used of budget {budget}, free-space floor {}%",
        dir.path().display(),
        format_size(used),
        if ledger.format == 0 {
            budget::DEFAULT_FREE_FLOOR_PERCENT
        } else {
            ledger.free_floor_percent
        }
    );
    println!(
        "{:<28} {:>10} {:>10} {:>10} {:<20} {:<14} SOURCE [MOUNTPOINTS]",
        "DATASET", "USED", "FILES", "GRANT", "LAST MOUNT", "STATE"
    );
    let now = budget::now();
    for d in &list {
        println!(
            "{:<28} {:>10} {:>10} {:>10} {:<20} {:<14} {}{}",
            d.id,
            format_size(d.used),
            d.files,
            if d.mounted {
                format_size(d.grant)
            } else {
                "-".into()
            },
            ago(now, d.last_mount),
            state(d),
            d.source,
            if d.mountpoints.is_empty() {
                String::new()
            } else {
                format!(" at {}", d.mountpoints.join(", "))
            }
        );
    }
    ExitCode::SUCCESS
}

/// Every mountpoint of data set `id`'s mount, as its holder tells its
/// connection (a holder of another user's, or one that does not answer:
/// none).
fn mountpoints(dir: &PrivateDir, id: &str) -> Vec<String> {
    let Ok(top) = std::fs::canonicalize(dir.path()) else {
        return Vec::new();
    };
    let sock = crate::mount::supervisor::takeover::socket_path(&top.join(id));
    if !crate::mount::supervisor::takeover::listening(&sock) {
        return Vec::new();
    }
    let Ok((offer, _)) = crate::mount::supervisor::takeover::connect(&sock) else {
        return Vec::new();
    };
    offer
        .connection
        .map(crate::mount::connection::mountpoints_of)
        .unwrap_or_default()
        .iter()
        .map(|p| p.display().to_string())
        .collect()
}

fn state(d: &DatasetInfo) -> String {
    match d.pid {
        Some(p) => format!("mounted ({p})"),
        None => "not mounted".into(),
    }
}

fn ago(now: u64, t: u64) -> String {
    if t == 0 {
        return "unknown".into();
    }
    let s = now.saturating_sub(t);
    match s {
        0..=119 => format!("{s} s ago"),
        120..=7199 => format!("{} min ago", s / 60),
        7200..=172_799 => format!("{} h ago", s / 3600),
        _ => format!("{} days ago", s / 86400),
    }
}

fn gc(dir: &PrivateDir, older_than: Option<u64>, to: Option<u64>, dry_run: bool) -> ExitCode {
    if older_than.is_none() && to.is_none() {
        eprintln!("locafs: cache gc: give --older-than AGE, --to SIZE, or both");
        return ExitCode::from(2);
    }
    budget::sweep_trash(dir);
    let Some((_, list)) = listed(dir) else {
        return ExitCode::from(1);
    };
    let victims = budget::gc_victims(&list, budget::now(), older_than, to);
    let mut code = ExitCode::SUCCESS;
    let mut freed = 0;
    let mut removed: Vec<&str> = Vec::new();
    for id in &victims {
        if dry_run {
            println!("would remove {id}");
            continue;
        }
        match budget::remove_dataset(dir, id) {
            Ok(b) => {
                freed += b;
                removed.push(id);
                println!("removed {id} ({})", format_size(b));
            }
            Err(e) => {
                eprintln!("locafs: {e}");
                code = ExitCode::from(1);
            }
        }
    }
    if !dry_run {
        println!(
            "freed {} in {} data sets",
            format_size(freed),
            victims.len()
        );
    }
    // What is left, as `cache ls` counts it: the data sets not removed.
    let kept: Vec<&DatasetInfo> = list
        .iter()
        .filter(|d| !removed.contains(&d.id.as_str()))
        .collect();
    let total: u64 = kept.iter().map(|d| d.used).sum();
    if let Some(limit) = to.filter(|&l| total > l && !dry_run) {
        let mounted: Vec<&str> = kept
            .iter()
            .filter(|d| d.mounted)
            .map(|d| d.id.as_str())
            .collect();
        eprintln!(
            "locafs: still {} held, more than --to {}: {}",
            format_size(total),
            format_size(limit),
            if mounted.is_empty() {
                "the data sets above could not be removed".to_owned()
            } else {
                format!("mounted now, and never removed: {}", mounted.join(", "))
            }
        );
    }
    code
}
