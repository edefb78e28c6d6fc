//! `cargo bench --bench objstore`: locafs over an S3 store, with the
//! defaults, against reading the store directly with its own client
//! (object_store) at the loader's concurrency, and against the store's
//! bandwidth cap, the limit of what it can give. The store is
//! benches/dirs3.py (an S3 server over a directory; or moto_server) behind
//! the test proxy (tests/common/proxy.rs), which adds a latency to every
//! request and caps the bandwidth, as a region-local store does.
//!
//! The data set is an image folder plus tar-like shards (scaled down from the
//! issue's 20 k files and 8 x 256 MiB so that one run takes minutes on two
//! cores; the knobs below scale it back up). Each epoch reads every image
//! file with `LOCAFS_OBJ_WORKERS` threads in a new random order, and every
//! shard sequentially, one thread each. It prints, each next to its
//! baseline measured in the same run and the ratio: the first epoch's
//! files/s and MB/s, a warm epoch (page cache dropped), the GET requests of
//! each epoch, and the GETs of an epoch after a remount. The direct reader
//! runs twice: reading each shard in one GET (the limit a client gets), and
//! in ranged GETs of a 1 MiB cache block, four in flight (the requests
//! locafs makes, at the store's own cost of ranges: moto reads the whole
//! object for each).
//!
//! rclone (`rclone mount --vfs-cache-mode full`, its S3 backend configured
//! by a temporary rclone.conf to the same proxy and bucket) is measured in
//! the same run when it is on PATH, with the same epochs (first, warm,
//! after a remount of rclone with its cache directory kept); otherwise the
//! line says it was skipped. mountpoint-s3 (`mount-s3 --cache DIR`, the
//! binary named by `LOCAFS_BENCH_MOUNT_S3`; it is not packaged, and builds
//! from its source repository, docs/benchmarks.md) is measured the same
//! way, with its default metadata TTL and with `--metadata-ttl indefinite`;
//! without the variable its lines say it was skipped.
//!
//! It measures and asserts nothing. Root, /dev/fuse and python3 (or
//! moto_server) are needed (else it says SKIPPED). Environment (defaults in
//! brackets): LOCAFS_OBJ_SERVER [dir: benches/dirs3.py, which reads only
//! the range asked for; or `moto`], LOCAFS_OBJ_FILES [2000],
//! LOCAFS_OBJ_FILE_KB [110], LOCAFS_OBJ_SHARDS [2],
//! LOCAFS_OBJ_SHARD_MB [64], LOCAFS_OBJ_LATENCY_MS [20],
//! LOCAFS_OBJ_BANDWIDTH_MB [100] (MB/s, 0: none), LOCAFS_OBJ_WORKERS [16],
//! LOCAFS_BENCH_DIR [/var/tmp/locafs-bench-objstore], LOCAFS_BENCH_LOCAFS_ARGS
//! (extra `locafs mount` options: a figure for a flag) [none].

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use common::proxy::Proxy;
use common::s3::{Bucket, Moto};
use common::server::Server;
use futures::StreamExt;
use object_store::{ObjectStore, ObjectStoreExt};

fn knob(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The S3 server the bench reads: benches/dirs3.py, a small S3 server over
/// a directory that answers a range by reading that range (the default),
/// or with `LOCAFS_OBJ_SERVER=moto` moto_server, the tests' server. moto
/// reads the whole object for each ranged GET (with shards of 256 MiB,
/// moto's file reads are then what the bench measures) and, one Python
/// process at a core, it reached 35 MB/s of the proxy's 100 MB/s: the
/// store, not the readers, set every figure.
enum BenchStore {
    Moto(Moto),
    Dir(Server),
}

impl BenchStore {
    fn start(dir: &Path) -> BenchStore {
        match std::env::var("LOCAFS_OBJ_SERVER").as_deref() {
            Ok("dir") | Err(_) => {
                let port = common::free_tcp_port();
                let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/dirs3.py");
                let mut cmd = std::process::Command::new("python3");
                cmd.arg(script).arg(port.to_string()).arg(dir);
                BenchStore::Dir(Server::start("dirs3.py", cmd, port))
            }
            Ok("moto") => BenchStore::Moto(Moto::start()),
            Ok(other) => panic!("LOCAFS_OBJ_SERVER={other}: moto or dir"),
        }
    }
    fn endpoint(&self) -> &str {
        match self {
            BenchStore::Moto(m) => &m.endpoint,
            BenchStore::Dir(s) => &s.endpoint,
        }
    }
    fn name(&self) -> &str {
        match self {
            BenchStore::Moto(_) => "moto_server",
            BenchStore::Dir(_) => "dirs3.py (an S3 server over a directory)",
        }
    }
}

/// What one epoch did.
struct Epoch {
    secs: f64,
    files: usize,
    bytes: u64,
    gets: u64,
}

impl Epoch {
    fn files_per_s(&self) -> f64 {
        self.files as f64 / self.secs
    }
    fn mb_per_s(&self) -> f64 {
        self.bytes as f64 / 1e6 / self.secs
    }
}

fn line(what: &str, v: f64, base_name: &str, base: f64) {
    // No ratio to a baseline of nothing (a warm epoch's GETs against
    // another warm epoch's): "-" for both zero, "inf" past a zero.
    let ratio = match (v, base) {
        (_, b) if b > 0.0 => format!("{:.2}", v / b),
        (0.0, _) => "-".to_string(),
        _ => "inf".to_string(),
    };
    println!("{what:<34} {v:>10.1}   {base_name} {base:>10.1}   ratio {ratio}");
}

/// One epoch through a mount: the image files by `workers` threads in a
/// shuffled order, each shard by a thread of its own, every byte checked
/// against its length.
fn epoch_fs(
    mnt: &Path,
    images: &[(String, u64)],
    shards: &[(String, u64)],
    workers: usize,
    seed: u64,
) -> (f64, u64) {
    let mut order: Vec<usize> = (0..images.len()).collect();
    common::Rng(seed).shuffle(&mut order);
    let next = AtomicUsize::new(0);
    let t0 = Instant::now();
    let bytes = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for (rel, len) in shards {
            let bytes = &bytes;
            s.spawn(move || {
                let b = std::fs::read(mnt.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
                assert_eq!(b.len() as u64, *len, "{rel}");
                bytes.fetch_add(*len, Relaxed);
            });
        }
        for _ in 0..workers {
            let (next, order, bytes) = (&next, &order, &bytes);
            s.spawn(move || loop {
                let i = next.fetch_add(1, Relaxed);
                let Some(&k) = order.get(i) else { break };
                let (rel, len) = &images[k];
                let b = std::fs::read(mnt.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
                assert_eq!(b.len() as u64, *len, "{rel}");
                bytes.fetch_add(*len, Relaxed);
            });
        }
    });
    (t0.elapsed().as_secs_f64(), bytes.load(Relaxed))
}

/// One epoch read directly with object_store through the proxy: whole-object
/// GETs, `workers` at once for the images, one task per shard.
fn epoch_direct(
    endpoint: &str,
    images: &[(String, u64)],
    shards: &[(String, u64)],
    workers: usize,
    seed: u64,
    ranges: Option<u64>,
) -> (f64, u64) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let store: Arc<dyn ObjectStore> = Arc::new(
        object_store::aws::AmazonS3Builder::new()
            .with_endpoint(endpoint)
            .with_allow_http(true)
            .with_bucket_name("bench")
            .with_region("us-east-1")
            .with_access_key_id("testing")
            .with_secret_access_key("testing")
            .build()
            .unwrap(),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut order: Vec<usize> = (0..images.len()).collect();
    common::Rng(seed).shuffle(&mut order);
    let keys: Vec<(String, u64)> = order.iter().map(|&i| images[i].clone()).collect();
    let shards = shards.to_vec();
    let t0 = Instant::now();
    let bytes = rt.block_on(async move {
        let get = |store: Arc<dyn ObjectStore>, rel: String, len: u64| async move {
            let k = object_store::path::Path::parse(format!("ds/{rel}")).unwrap();
            let b = store.get(&k).await.unwrap().bytes().await.unwrap();
            assert_eq!(b.len() as u64, len, "{rel}");
            len
        };
        // A shard: one GET of the whole object, or (`ranges`) ranged GETs
        // of that many bytes, as locafs's cache blocks are, four in flight.
        let shard = |store: Arc<dyn ObjectStore>, rel: String, len: u64| async move {
            let Some(step) = ranges else {
                return get(store, rel, len).await;
            };
            let k = object_store::path::Path::parse(format!("ds/{rel}")).unwrap();
            futures::stream::iter((0..len).step_by(step as usize))
                .map(|at| {
                    let (store, k) = (Arc::clone(&store), k.clone());
                    async move {
                        let r = at..(at + step).min(len);
                        store.get_range(&k, r).await.unwrap().len() as u64
                    }
                })
                .buffered(4)
                .fold(0u64, |a, b| async move { a + b })
                .await
        };
        let sh = futures::future::join_all(
            shards
                .into_iter()
                .map(|(r, l)| tokio::spawn(shard(Arc::clone(&store), r, l))),
        );
        let im = futures::stream::iter(keys)
            .map(|(r, l)| get(Arc::clone(&store), r, l))
            .buffer_unordered(workers)
            .fold(0u64, |a, b| async move { a + b });
        let (sh, im) = tokio::join!(sh, im);
        im + sh.into_iter().map(|r| r.unwrap()).sum::<u64>()
    });
    (t0.elapsed().as_secs_f64(), bytes)
}

/// A running `rclone mount`; dropping it ends rclone and unmounts.
struct Rclone {
    child: std::process::Child,
    mnt: PathBuf,
}

impl Rclone {
    /// `rclone mount bench:bench/ds MNT --vfs-cache-mode full` against
    /// `endpoint`, its cache under `dir`; waits (60 s) for the mount.
    fn start(endpoint: &str, mnt: &Path, dir: &Path) -> Rclone {
        let conf = dir.join("rclone.conf");
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(
            &conf,
            format!(
                "[bench]\ntype = s3\nprovider = Other\naccess_key_id = testing\n\
                 secret_access_key = testing\nregion = us-east-1\nendpoint = {endpoint}\n\
                 force_path_style = true\n"
            ),
        )
        .unwrap();
        let child = std::process::Command::new("rclone")
            .args(["mount", "bench:bench/ds"])
            .arg(mnt)
            .arg("--config")
            .arg(&conf)
            .arg("--cache-dir")
            .arg(dir.join("cache"))
            .args(["--vfs-cache-mode", "full", "--log-level", "ERROR"])
            .arg("--log-file")
            .arg(dir.join("rclone.log"))
            // rclone's S3 backend fails at start while this is set.
            .env_remove("AWS_CA_BUNDLE")
            .stdin(std::process::Stdio::null())
            .spawn()
            .expect("start rclone");
        let r = Rclone {
            child,
            mnt: mnt.to_owned(),
        };
        common::wait_until("rclone's mount", std::time::Duration::from_secs(60), || {
            common::is_fuse_mounted(mnt)
        });
        r
    }
}

/// A running `mount-s3` (mountpoint-s3) in the foreground; dropping it
/// unmounts and ends it.
struct MountS3 {
    child: std::process::Child,
    mnt: PathBuf,
}

impl MountS3 {
    /// `mount-s3 bench MNT --prefix ds/ --cache DIR/cache` against
    /// `endpoint` (path-style, the test credentials from the environment),
    /// with `extra` options; waits (60 s) for the mount.
    fn start(bin: &str, endpoint: &str, mnt: &Path, dir: &Path, extra: &[&str]) -> MountS3 {
        let cache = dir.join("cache");
        std::fs::create_dir_all(&cache).unwrap();
        let child = std::process::Command::new(bin)
            .arg("bench")
            .arg(mnt)
            .args(["--prefix", "ds/", "--endpoint-url", endpoint])
            .args(["--force-path-style", "--region", "us-east-1", "--read-only"])
            .arg("--cache")
            .arg(&cache)
            .arg("--foreground")
            .args(extra)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.join("mount-s3.log")).unwrap())
            .spawn()
            .expect("start mount-s3");
        let m = MountS3 {
            child,
            mnt: mnt.to_owned(),
        };
        common::wait_until(
            "mount-s3's mount",
            std::time::Duration::from_secs(60),
            || common::is_fuse_mounted(mnt),
        );
        m
    }
}

impl Drop for MountS3 {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.mnt).status();
        let t0 = Instant::now();
        while self.child.try_wait().ok().flatten().is_none()
            && t0.elapsed() < std::time::Duration::from_secs(30)
        {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if common::is_mounted(&self.mnt) {
            common::force_unmount(&self.mnt);
        }
    }
}

/// The same three epochs as locafs's (first, warm, after a remount of the
/// tool with its cache directory kept) through another tool's mount, each
/// figure beside locafs's and the ratio.
fn other_tool<G>(
    name: &str,
    start: impl Fn() -> G,
    run: &dyn Fn(u64) -> Epoch,
    locafs: (&Epoch, &Epoch, &Epoch),
) {
    let (cold, warm, remount) = locafs;
    let (oc, ow, or) = {
        let g = start();
        let c = run(2);
        let w = run(3);
        drop(g);
        let g = start();
        let r = run(4);
        drop(g);
        (c, w, r)
    };
    println!("{name}, the same epochs:");
    for (what, v, l) in [
        ("first epoch files/s", oc.files_per_s(), cold.files_per_s()),
        ("first epoch MB/s", oc.mb_per_s(), cold.mb_per_s()),
        ("warm epoch files/s", ow.files_per_s(), warm.files_per_s()),
        ("warm epoch MB/s", ow.mb_per_s(), warm.mb_per_s()),
        ("GETs, first epoch", oc.gets as f64, cold.gets as f64),
        ("GETs, warm epoch", ow.gets as f64, warm.gets as f64),
        (
            "GETs, epoch after a remount",
            or.gets as f64,
            remount.gets as f64,
        ),
        (
            "after a remount files/s",
            or.files_per_s(),
            remount.files_per_s(),
        ),
    ] {
        line(&format!("  {what}"), v, "locafs", l);
    }
    println!(
        "  (seconds: first {:.1}, warm {:.1}, after remount {:.1}; ratio = {name} / locafs)",
        oc.secs, ow.secs, or.secs
    );
}

impl Drop for Rclone {
    fn drop(&mut self) {
        let _ = common::signal(self.child.id(), common::Signal::TERM);
        let t0 = Instant::now();
        while self.child.try_wait().ok().flatten().is_none()
            && t0.elapsed() < std::time::Duration::from_secs(30)
        {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if common::is_mounted(&self.mnt) {
            common::force_unmount(&self.mnt);
        }
    }
}

fn main() {
    require_fuse!();
    if std::env::var("LOCAFS_OBJ_SERVER").as_deref() == Ok("moto") {
        require_moto!();
    } else if common::which("python3").is_none() {
        skip!("needs python3 for benches/dirs3.py (or LOCAFS_OBJ_SERVER=moto)");
    }
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let files = knob("LOCAFS_OBJ_FILES", 2000) as usize;
    let file_kb = knob("LOCAFS_OBJ_FILE_KB", 110);
    let nshards = knob("LOCAFS_OBJ_SHARDS", 2) as usize;
    let shard_mb = knob("LOCAFS_OBJ_SHARD_MB", 64);
    let latency_ms = knob("LOCAFS_OBJ_LATENCY_MS", 20);
    let bw_mb = knob("LOCAFS_OBJ_BANDWIDTH_MB", 100);
    let workers = knob("LOCAFS_OBJ_WORKERS", 16) as usize;
    let root = PathBuf::from(
        std::env::var("LOCAFS_BENCH_DIR")
            .unwrap_or_else(|_| "/var/tmp/locafs-bench-objstore".into()),
    );
    let _ = std::fs::remove_dir_all(&root);
    let (mnt, cache) = (root.join("mnt"), root.join("cache"));
    std::fs::create_dir_all(&mnt).unwrap();
    std::fs::create_dir_all(&cache).unwrap();

    let store = BenchStore::start(&root.join("store"));
    let bucket = Bucket::at(store.endpoint(), "bench");
    bucket.create();
    let mut rng = common::Rng(17);
    let mut images = Vec::new();
    let t0 = Instant::now();
    for i in 0..files {
        // Image-sized: +-50% around the mean.
        let len = (file_kb * 1024 / 2 + rng.below(file_kb * 1024)) as usize;
        let rel = format!("train/c{:03}/img{i:06}.jpg", i % 100);
        bucket.put(&format!("ds/{rel}"), &common::pattern(i as u64, len));
        images.push((rel, len as u64));
    }
    let mut shards = Vec::new();
    for i in 0..nshards {
        let len = (shard_mb << 20) as usize;
        let rel = format!("shards/shard-{i:04}.tar");
        bucket.put(
            &format!("ds/{rel}"),
            &common::pattern(1_000_000 + i as u64, len),
        );
        shards.push((rel, len as u64));
    }
    let total: u64 = images.iter().chain(&shards).map(|(_, l)| l).sum();
    let proxy = Proxy::start(store.endpoint().trim_start_matches("http://"));
    proxy.knobs.latency_us.store(latency_ms * 1000, Relaxed);
    proxy.knobs.bandwidth.store(bw_mb * 1_000_000, Relaxed);
    println!(
        "objstore bench: {files} files of ~{file_kb} KiB + {nshards} shards of {shard_mb} MiB \
         ({:.0} MB), {} behind a proxy adding {latency_ms} ms per request, \
         {bw_mb} MB/s cap; {workers} loader threads (uploaded in {:.0} s)",
        total as f64 / 1e6,
        store.name(),
        t0.elapsed().as_secs_f64()
    );
    let n = files + nshards;

    // Direct: the store's own client at the loader's concurrency. With the
    // page cache dropped, as before every epoch below (both stores keep
    // objects in files: dirs3.py its directory, moto big objects).
    common::drop_page_cache();
    let gets0 = proxy.counts.total_gets();
    let (secs, bytes) = epoch_direct(&proxy.endpoint, &images, &shards, workers, 1, None);
    let direct = Epoch {
        secs,
        files: n,
        bytes,
        gets: proxy.counts.total_gets() - gets0,
    };
    // The same with the shards read in ranged GETs of a cache block, the
    // requests locafs must make, at the store's own cost of ranges (moto
    // reads the whole object to answer each).
    common::drop_page_cache();
    let gets0 = proxy.counts.total_gets();
    let (secs, bytes) = epoch_direct(&proxy.endpoint, &images, &shards, workers, 1, Some(1 << 20));
    let ranged = Epoch {
        secs,
        files: n,
        bytes,
        gets: proxy.counts.total_gets() - gets0,
    };

    // locafs, defaults.
    let url = PathBuf::from("s3://bench/ds");
    let cache_s = cache.to_string_lossy().into_owned();
    let extra = std::env::var("LOCAFS_BENCH_LOCAFS_ARGS").unwrap_or_default();
    let mut args = vec!["--endpoint", proxy.endpoint.as_str()];
    args.extend(extra.split_whitespace());
    if !extra.is_empty() {
        println!("locafs mount options: {extra}");
    }
    let run = |seed: u64| {
        common::drop_page_cache();
        let g = proxy.counts.total_gets();
        let (secs, bytes) = epoch_fs(&mnt, &images, &shards, workers, seed);
        Epoch {
            secs,
            files: n,
            bytes,
            gets: proxy.counts.total_gets() - g,
        }
    };
    let mut m = common::Mount::start(&url, &mnt, Path::new(&cache_s), &args);
    let cold = run(2);
    let warm = run(3);
    assert!(m.unmount().success());
    let m = common::Mount::start(&url, &mnt, Path::new(&cache_s), &args);
    let remount = run(4);
    drop(m);

    println!(
        "{:<34} {:>10}   {:<6} {:>10}",
        "figure", "locafs", "direct", ""
    );
    line(
        "first epoch files/s",
        cold.files_per_s(),
        "direct",
        direct.files_per_s(),
    );
    line(
        "first epoch MB/s",
        cold.mb_per_s(),
        "direct",
        direct.mb_per_s(),
    );
    line(
        "first epoch MB/s, vs ranged direct",
        cold.mb_per_s(),
        "ranged",
        ranged.mb_per_s(),
    );
    if bw_mb > 0 {
        // The proxy's cap is the store's bandwidth: the limit no reader
        // passes, whatever its concurrency.
        line(
            "first epoch MB/s, vs bandwidth cap",
            cold.mb_per_s(),
            "cap",
            bw_mb as f64,
        );
    }
    line(
        "warm epoch files/s",
        warm.files_per_s(),
        "direct",
        direct.files_per_s(),
    );
    line(
        "warm epoch MB/s",
        warm.mb_per_s(),
        "direct",
        direct.mb_per_s(),
    );
    line(
        "GETs, first epoch",
        cold.gets as f64,
        "direct",
        direct.gets as f64,
    );
    line(
        "GETs, warm epoch",
        warm.gets as f64,
        "direct",
        direct.gets as f64,
    );
    line(
        "GETs, epoch after a remount",
        remount.gets as f64,
        "direct",
        direct.gets as f64,
    );
    line(
        "epoch after a remount files/s",
        remount.files_per_s(),
        "direct",
        direct.files_per_s(),
    );
    println!(
        "(seconds: direct {:.1} (shards in 1 MiB ranges: {:.1}, {} GETs), locafs first {:.1}, \
         warm {:.1}, after remount {:.1}; 503s injected: none)",
        direct.secs, ranged.secs, ranged.gets, cold.secs, warm.secs, remount.secs
    );
    // rclone and mountpoint-s3, the same epochs over the same proxy (after
    // the figures above are out).
    let locafs = (&cold, &warm, &remount);
    if common::which("rclone").is_none() {
        println!("rclone mount --vfs-cache-mode full: rclone is not installed, skipped");
    } else if common::which("fusermount").is_none() {
        println!(
            "rclone mount --vfs-cache-mode full: rclone mounts through fusermount, \
             not installed (Debian: fuse3), skipped"
        );
    } else {
        let dir = root.join("rclone");
        other_tool(
            "rclone mount --vfs-cache-mode full",
            || Rclone::start(&proxy.endpoint, &mnt, &dir),
            &run,
            locafs,
        );
    }
    match std::env::var("LOCAFS_BENCH_MOUNT_S3") {
        Err(_) => println!(
            "mountpoint-s3: LOCAFS_BENCH_MOUNT_S3 does not name its mount-s3 binary, skipped"
        ),
        Ok(bin) => {
            for (label, extra) in [
                ("mountpoint-s3 --cache", &[][..]),
                (
                    "mountpoint-s3 --cache --metadata-ttl indefinite",
                    &["--metadata-ttl", "indefinite"][..],
                ),
            ] {
                let dir = root.join("mount-s3");
                let _ = std::fs::remove_dir_all(&dir);
                other_tool(
                    label,
                    || MountS3::start(&bin, &proxy.endpoint, &mnt, &dir, extra),
                    &run,
                    locafs,
                );
            }
        }
    }
}
