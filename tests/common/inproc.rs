//! Mounting locafs inside the test process, over any `Source`: the real
//! FUSE mount, cache and read path, with a test source (see `locafs::testing`)
//! behind them. The mount is `locafs::mount::Mount`: dropping it unmounts.
//! Also the engine alone, without FUSE ([`read_ahead`]): cache, namespace,
//! reader and read-ahead over a source, on a runtime of the caller's.

use std::sync::Arc;

use locafs::mount::config::MountConfig;
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
    locafs::mount::config::resolve(&args.into_request()).unwrap()
}

/// Mounts `cfg` over `source` in this process.
pub fn mount(cfg: &MountConfig, source: Arc<dyn Source>) -> Mount {
    Mount::start(cfg, source).unwrap_or_else(|(_, e)| panic!("mount failed: {e}"))
}

/// Read-ahead over `source` (a cache of 64 MiB in `cache_dir`, 1 MiB
/// blocks, attributes held an hour, `jobs` fetches in flight, sequential
/// and epoch prefetch off), on `rt`: what a mount runs behind FUSE, for
/// tests and benches that drive the engine itself (plans, the runtime).
pub fn read_ahead(
    source: Arc<dyn Source>,
    cache_dir: &std::path::Path,
    rt: &tokio::runtime::Runtime,
    jobs: usize,
) -> Arc<locafs::read::prefetch::ReadAhead> {
    use std::time::Duration;
    let stats = Arc::new(locafs::obs::stats::Stats::default());
    let (disk, _) = locafs::cache::disk::DiskCache::open(
        cache_dir,
        Some(64 << 20),
        1 << 20,
        Arc::clone(&stats),
    )
    .unwrap();
    let cache: Arc<dyn locafs::cache::BlockStore> = Arc::new(disk);
    let ns = Arc::new(
        locafs::meta::namespace::Namespace::new(
            Arc::clone(&source),
            Some(Duration::from_secs(3600)),
            Arc::default(),
        )
        .unwrap(),
    );
    let reader = locafs::read::reader::Reader::new(
        locafs::read::reader::ReaderConfig {
            block_size: 1 << 20,
            memory_bytes: 16 << 20,
            write_queue_bytes: 16 << 20,
            write_wait_bytes: 4 << 20,
            source_timeout: Duration::from_secs(30),
        },
        cache,
        source,
        None,
        rt.handle().clone(),
        stats,
    );
    locafs::read::prefetch::ReadAhead::new(
        locafs::read::prefetch::ReadAheadConfig {
            sequential: false,
            epoch: false,
            max_window: 8 << 20,
            memory: 64 << 20,
            jobs: locafs::read::concurrency::Jobs::Fixed(jobs),
            bandwidth: None,
            small_file: 4 << 20,
            plan_ahead: 64,
        },
        reader,
        ns,
        rt.handle().clone(),
    )
}
