//! Mounting locafs inside the test process, over any `Source`: the real
//! FUSE mount, cache and read path, with a test source behind them.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use locafs::config::MountConfig;
use locafs::mount::Mount;
use locafs::source::Source;

/// Whether this machine can run FUSE tests; prints a loud skip if not.
pub fn fuse_available(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root || !Path::new("/dev/fuse").exists() {
        eprintln!("SKIPPED {test}: needs root and /dev/fuse");
        return false;
    }
    true
}

/// A temp dir with `src/`, `mnt/` and `cache/`.
pub struct Dirs {
    pub tmp: tempfile::TempDir,
    pub src: PathBuf,
    pub mnt: PathBuf,
    pub cache: PathBuf,
}

pub fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let mnt = tmp.path().join("mnt");
    let cache = tmp.path().join("cache");
    for d in [&src, &mnt, &cache] {
        std::fs::create_dir_all(d).unwrap();
    }
    Dirs {
        tmp,
        src,
        mnt,
        cache,
    }
}

/// Resolves a configuration as `locafs mount SRC MNT --cache-dir CACHE ARGS`.
pub fn config(d: &Dirs, extra: &[&str]) -> MountConfig {
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

pub fn mount(cfg: &MountConfig, source: Arc<dyn Source>) -> Mount {
    Mount::start(cfg, source).unwrap_or_else(|(_, e)| panic!("mount failed: {e}"))
}

pub fn stats(mnt: &Path) -> locafs::stats::StatsSnapshot {
    locafs::cli::stats::fetch(mnt).unwrap()
}

/// Drops the kernel's page cache (so reads reach the daemon again).
pub fn drop_page_cache() {
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
}
