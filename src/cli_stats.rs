//! `locafs stats MOUNTPOINT`: reads the stats of a running mount through an
//! extended attribute of its root (nothing is added to the tree) and prints
//! them as a table or JSON.

use std::process::ExitCode;

use crate::config::StatsArgs;
use crate::fuse::STATS_XATTR;
use crate::stats::StatsSnapshot;

/// Fetches the stats of the mount at `mountpoint`.
pub fn fetch(mountpoint: &std::path::Path) -> Result<StatsSnapshot, String> {
    let raw = crate::sys::getxattr(mountpoint, STATS_XATTR).map_err(|e| {
        if e.raw_os_error() == Some(libc::ENODATA) || e.raw_os_error() == Some(libc::ENOTSUP) {
            format!("{}: not a locafs mount", mountpoint.display())
        } else {
            format!("{}: {}", mountpoint.display(), crate::config::short_io(&e))
        }
    })?;
    serde_json::from_slice(&raw)
        .map_err(|e| format!("{}: unreadable stats: {e}", mountpoint.display()))
}

pub fn main(args: StatsArgs) -> ExitCode {
    match fetch(&args.mountpoint) {
        Ok(s) => {
            if args.json {
                println!("{}", serde_json::to_string_pretty(&s).unwrap_or_default());
            } else {
                print!("{}", s.table());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("locafs: {e}");
            ExitCode::from(2)
        }
    }
}
