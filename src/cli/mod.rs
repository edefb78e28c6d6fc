//! The command line: clap's types for every subcommand and the front ends of
//! `locafs stats` ([`stats`]), `warm` and `plan` ([`control`]); `mount` hands
//! over to `supervisor::entry::main`. Called as `mount.fuse.locafs`, the binary is its
//! own mount(8) helper ([`mount_helper`]). The library below does not import this module:
//! the command line depends on the library, never the other way round.
//!
//! Usage errors exit 2 with one line on stderr, sizes and durations
//! included (they parse here, at the edge: `units::Size`, `units::Span`).

pub mod cache;
pub mod control;
pub mod mount_args;
pub mod mount_helper;
pub mod secret;
pub mod stats;
pub mod stats_table;
pub mod where_;

use std::process::ExitCode;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Parser, Subcommand};

use crate::sys::units::ParseError;
use cache::CacheArgs;
use control::{PlanArgs, WarmArgs};
use mount_args::MountArgs;
use secret::SecretArgs;
use stats::StatsArgs;
use where_::WhereArgs;

/// locafs: a read-only caching FUSE mount for training data sets.
///
/// locafs presents a data set (a directory on NFS, Lustre, GPFS or a local
/// disk, or an object store: s3://, gs://, az://) as ordinary read-only
/// files, keeps what the training job reads in a persistent, checksummed
/// cache on local disk, and serves fully cached files at local-disk speed.
#[derive(Parser, Debug)]
#[command(name = "locafs", version, about, long_about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Mount SOURCE read-only on MOUNTPOINT with a local cache.
    ///
    /// Runs in the foreground until the mount is unmounted (umount MOUNTPOINT)
    /// or the process gets SIGINT/SIGTERM, then unmounts and exits 0. With
    /// --daemon, returns once the mount is live (exit 0) or has failed
    /// (non-zero, with the reason on stderr).
    ///
    /// Every option can also be given in a TOML file (--config FILE, keys as
    /// the long option names, e.g. cache-size = "500G") or as fstab-style
    /// -o options (cache_size=500G,immutable); flags win over -o, and -o
    /// wins over the file.
    Mount(Box<MountArgs>),
    /// Show what a mount has done: bytes from cache and source, cache use,
    /// corruption found.
    Stats(StatsArgs),
    /// Fill the cache with files or directories of a mount (parallel,
    /// resumable: cached blocks are skipped). Exit 0 only if everything fits.
    /// Only the user running the mount and root may warm it.
    Warm(WarmArgs),
    /// Hand the loader's order for this epoch to a mount's read-ahead (one
    /// path per line). On a mount made by root, any user who may read the
    /// mount root may plan (and ask `where`) about the files they can reach.
    Plan(PlanArgs),
    /// Show which node owns each file and whether it is cached here.
    ///
    /// The owner of a file is the node that peer placement gives the file's
    /// first block, over the configured --peers list (every member, up or
    /// down): every node gives the same answer. Nodes are numbered by their
    /// member id (the resolved ip:port of their --peers entry) sorted as
    /// strings, whatever order a command line lists them in. Without peers
    /// every file belongs to node 0 of 1. With no FILE, the whole data set
    /// in listing order (depth first, entries sorted by name). The
    /// LocalitySampler of the Python package (packaging/python) uses the
    /// same query; see docs/locality.md.
    Where(WhereArgs),
    /// Make a new random cluster secret (256 bits, as
    /// locafs-secret-v1:HEX:CHECK) for --cluster-secret-file: `locafs secret
    /// --out /etc/locafs/secret` (created 0600). Without --out it is printed
    /// (for pipes), but not into a file others may read. Only secrets made
    /// by this are accepted.
    Secret(SecretArgs),
    /// See and clean the cache directory that many data sets share:
    /// `cache ls`, `cache rm DATASET`, `cache gc --older-than 30d --to 500G`.
    Cache(CacheArgs),
    /// The serving process of a mount, started by `locafs mount` (which
    /// holds the mount and starts another when one dies): not for users.
    #[command(name = "__serve", hide = true)]
    Serve,
}

/// Parses the command line and runs the subcommand.
pub fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if mount_helper::called_as_helper(argv.first().map(|a| a.as_os_str())) {
        return mount_helper::main(&argv[1..]);
    }
    quiet_on_closed_pipes(argv.get(1).map(|a| a.as_os_str()));
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => return parse_error(e),
    };
    match cli.command {
        Command::Mount(args) => {
            let daemon = args.daemon;
            crate::mount::supervisor::entry::main(args.into_request(), daemon)
        }
        Command::Stats(args) => stats::main(args),
        Command::Warm(args) => control::warm(args),
        Command::Plan(args) => control::plan(args),
        Command::Where(args) => where_::main(args),
        Command::Cache(args) => cache::main(args),
        Command::Serve => crate::mount::supervisor::serve_main(),
        Command::Secret(args) => secret::main(args),
    }
}

/// A command whose reader went away (`locafs where MNT | head -1`) ends
/// quietly, as Unix tools do: SIGPIPE gets its default action back (Rust
/// ignores it, and `println!` then panics on EPIPE), for every command but
/// `mount` (and its `__serve`), whose daemon writes to sockets (peers, metrics, the control
/// socket) and must never die of a client that went away; what `mount`
/// prints, it prints ignoring errors.
fn quiet_on_closed_pipes(command: Option<&std::ffi::OsStr>) {
    // (`__serve`: the process serving a mount, which `mount` starts)
    if command == Some(std::ffi::OsStr::new("mount"))
        || command == Some(std::ffi::OsStr::new("__serve"))
    {
        return;
    }
    // SAFETY: sets the disposition of one signal, before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// A size or duration that does not parse is a usage error like any other
/// (`locafs: --cache-size: bad size "12X": ...`, exit 2); everything else
/// (help, version, unknown flags) is clap's own answer.
fn parse_error(e: clap::Error) -> ExitCode {
    match unit_error(&e) {
        Some(msg) => {
            eprintln!("locafs: {msg}");
            ExitCode::from(2)
        }
        None => e.exit(),
    }
}

/// `--OPTION: why` for a size or duration clap refused.
fn unit_error(e: &clap::Error) -> Option<String> {
    if e.kind() != ErrorKind::ValueValidation {
        return None;
    }
    let why = std::error::Error::source(e)?.downcast_ref::<ParseError>()?;
    let ContextValue::String(arg) = e.get(ContextKind::InvalidArg)? else {
        return None;
    };
    // "--cache-size <SIZE>"
    let name = arg.split_whitespace().next().unwrap_or(arg);
    Some(format!("{name}: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(args: &[&str]) -> Result<MountArgs, clap::Error> {
        let argv = ["locafs", "mount", "/src", "/mnt"].iter().chain(args);
        Cli::try_parse_from(argv).map(|c| match c.command {
            Command::Mount(a) => *a,
            other => panic!("{other:?}"),
        })
    }

    #[test]
    fn sizes_and_durations_parse_at_the_edge_and_fail_in_one_line() {
        use crate::sys::units::{Size, Span};
        let a = mount(&["--cache-size", "5G", "--revalidate", "5m", "--daemon"]).unwrap();
        assert_eq!(a.flags.cache_size, Some(Size(5 << 30)));
        assert_eq!(
            a.flags.revalidate,
            Some(Span(std::time::Duration::from_secs(300)))
        );
        assert!(a.daemon);
        let e = mount(&["--cache-size", "12X"]).unwrap_err();
        assert_eq!(
            unit_error(&e).unwrap(),
            format!(
                "--cache-size: {}",
                crate::sys::units::parse_size("12X").unwrap_err()
            )
        );
        let e = mount(&["--peer-timeout", "5y"]).unwrap_err();
        assert_eq!(
            unit_error(&e).unwrap(),
            "--peer-timeout: bad duration \"5y\": unknown unit \"y\""
        );
        // Other refusals stay clap's.
        for bad in [
            &["--fuse-threads", "x"][..],
            &["--bogus"],
            &["--log-format", "xml"],
        ] {
            let e = mount(bad).unwrap_err();
            assert!(unit_error(&e).is_none(), "{bad:?}: {e}");
        }
    }
}
