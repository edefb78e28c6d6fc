//! Mounting locafs inside the test process, over any `Source`: the real
//! FUSE mount, cache and read path, with a test source (see `fakes`)
//! behind them. The mount is `locafs::mount::Mount`: dropping it unmounts.

use std::sync::Arc;

use locafs::config::MountConfig;
use locafs::mount::Mount;
use locafs::source::Source;

use super::daemon::Scratch;

/// Resolves a configuration as `locafs mount SRC MNT --cache-dir CACHE
/// EXTRA...` would for the scratch's directories.
pub fn config(d: &Scratch, extra: &[&str]) -> MountConfig {
    use clap::Parser;
    let mut argv: Vec<String> = vec!["locafs".into(), "mount".into()];
    argv.push(d.src.display().to_string());
    argv.push(d.mnt.display().to_string());
    argv.push("--cache-dir".into());
    argv.push(d.cache.display().to_string());
    argv.extend(extra.iter().map(|s| s.to_string()));
    let cli = locafs::cli::Cli::try_parse_from(argv).unwrap();
    let locafs::cli::Command::Mount(args) = cli.command else {
        unreachable!()
    };
    locafs::config::resolve(&args.request).unwrap()
}

/// Mounts `cfg` over `source` in this process.
pub fn mount(cfg: &MountConfig, source: Arc<dyn Source>) -> Mount {
    Mount::start(cfg, source).unwrap_or_else(|(_, e)| panic!("mount failed: {e}"))
}
