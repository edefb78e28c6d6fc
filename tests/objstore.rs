//! Object-store sources end to end: a real S3 server (moto_server) on
//! loopback, a real `locafs mount s3://...` over it, and the tree and bytes
//! the mount shows compared with what was put in the bucket, cold and after
//! a remount; reads across block boundaries; keys that cannot be file names
//! (skipped, counted, warned about once, the rest listed); a missing bucket,
//! a dead endpoint and refused credentials refused with exit status 2; an
//! AWS profile (`--profile`, `AWS_PROFILE`) signing the mount with a key
//! moto issued, and a wrong or unsupported one refused with exit 2; a
//! profile's `credential_process` (a script) signing the mount, refreshed
//! near expiry, and failing ones refused with exit 2 (at mount) or failing
//! reads with EIO (once the keys expired, until it works again); real
//! loaders (Python's tarfile over shards, pyarrow over mmap), cold and warm.
//! Then, with the proxy of tests/common/proxy.rs between the mount and the
//! server: no GET for cached data after a remount; stale files revalidated
//! by listing their directory, never a HEAD each; every read served while
//! the store answers 503 SlowDown to a share of the requests, each counted;
//! read-ahead's concurrency cut to its floor by such answers; cached reads
//! going on and uncached ones failing within --source-timeout while the
//! store stalls; an object replaced mid-epoch (EIO for the old version's
//! uncached blocks, the new bytes after revalidation). Last, three nodes
//! with peers mounting the same s3:// URL GET each block of each object once
//! over three epochs.
//!
//! The tree and bytes (cold and warm) and ranged reads also run against
//! Azurite (az://, AZURE_STORAGE_USE_EMULATOR=true and `--endpoint`),
//! fake-gcs-server (gs://, a service-account file naming it) and s3s-fs
//! (s3://, whose listings carry no ETag and whose GETs ignore `If-Match`);
//! against each of the four servers, cached files read after a remount
//! with the server stopped, and an object replaced on the server is seen
//! after revalidation and never mixed with the old bytes. The keys that
//! cannot be names against Azurite, and a missing container or bucket and
//! a wrong account key exit 2, as does a gs:// service-account file that
//! cannot be used (fake-gcs-server checks no credentials). Each kind's tests say SKIPPED without its
//! server.

mod common;

use std::ffi::OsStr;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::azurite::{Azurite, Container};
use common::gcs::{FakeGcs, GcsBucket};
use common::proxy::Proxy;
use common::s3::{Bucket, Moto};
use common::s3s::S3sFs;
use common::*;
use std::sync::atomic::Ordering::Relaxed;

const BLOCK: usize = 256 * 1024;

/// A local tree with what goes in the bucket: image-sized files in class
/// directories, a file of several blocks plus a tail, one of exactly one
/// block, an empty one, and names with spaces and non-ASCII.
fn sample_tree(dir: &Path) -> Vec<PathBuf> {
    let files: &[(&str, usize)] = &[
        ("train/cat/0001.jpg", 40_000),
        ("train/cat/0002.jpg", 71_234),
        ("train/dog/0001.jpg", 12_345),
        ("train/dog/deep/er/x.bin", 3 * BLOCK + 777),
        ("val/one block.bin", BLOCK),
        ("val/empty", 0),
        ("val/été.txt", 999),
        ("top.bin", 700_000),
    ];
    for (i, (rel, len)) in files.iter().enumerate() {
        let p = dir.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        write_file(&p, seed("objstore") + i as u64, *len);
    }
    list_files(dir)
}

/// Every file of `src` reads the same through `mnt`, and every directory
/// of `mnt` lists exactly the names of `src`'s.
fn assert_same_files(src: &Path, mnt: &Path) {
    assert_eq!(list_files(src), list_files(mnt), "the trees differ");
    for rel in list_files(src) {
        let (a, b) = (src.join(&rel), mnt.join(&rel));
        assert_eq!(
            fs::metadata(&a).unwrap().len(),
            fs::metadata(&b).unwrap().len(),
            "size of {rel:?}"
        );
        assert_same_content(&a, &b);
    }
    let mut dirs = vec![PathBuf::new()];
    while let Some(d) = dirs.pop() {
        assert_eq!(listing(&src.join(&d)), listing(&mnt.join(&d)), "{d:?}");
        for e in fs::read_dir(src.join(&d)).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                dirs.push(d.join(e.file_name()));
            }
        }
    }
}

/// Which kind of store a test runs against: moto_server (s3://), Azurite
/// (az://), fake-gcs-server (gs://) or s3s-fs (s3://).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    S3,
    Az,
    Gs,
    S3s,
}

/// A running server of one kind.
enum Server {
    S3(Moto),
    Az(Azurite),
    Gs(FakeGcs),
    S3s(S3sFs),
}

/// A bucket (container) of one kind of server, to put objects in.
enum Client {
    S3(Bucket),
    Az(Container),
    Gs(GcsBucket),
    /// s3s-fs's buckets are directories, made with the client.
    S3s(Bucket),
}

impl Server {
    fn start(kind: Kind) -> Server {
        match kind {
            Kind::S3 => Server::S3(Moto::start()),
            Kind::Az => Server::Az(Azurite::start()),
            Kind::Gs => Server::Gs(FakeGcs::start()),
            Kind::S3s => Server::S3s(S3sFs::start()),
        }
    }

    fn scheme(&self) -> &'static str {
        match self {
            Server::S3(_) | Server::S3s(_) => "s3",
            Server::Az(_) => "az",
            Server::Gs(_) => "gs",
        }
    }

    fn client(&self, bucket: &str) -> Client {
        match self {
            Server::S3(m) => Client::S3(m.bucket(bucket)),
            Server::Az(a) => Client::Az(a.container(bucket)),
            Server::Gs(g) => Client::Gs(g.bucket(bucket)),
            Server::S3s(f) => {
                f.create(bucket);
                Client::S3s(f.bucket(bucket))
            }
        }
    }

    /// Stops the server (as a store that went away).
    fn kill(&mut self) {
        match self {
            Server::S3(m) => m.kill(),
            Server::Az(a) => a.kill(),
            Server::Gs(g) => g.kill(),
            Server::S3s(f) => f.kill(),
        }
    }

    /// What `locafs mount` needs to reach it, as a user gives it: s3://
    /// and az:// (with AZURE_STORAGE_USE_EMULATOR=true) take `--endpoint`;
    /// gs:// a service-account file naming the emulator.
    fn reach(&self) -> (Vec<String>, Vec<(&'static str, String)>) {
        match self {
            Server::S3(m) => (vec!["--endpoint".into(), m.endpoint.clone()], vec![]),
            Server::Az(a) => (
                vec!["--endpoint".into(), a.endpoint.clone()],
                Azurite::mount_env()
                    .into_iter()
                    .map(|(k, v)| (k, v.to_owned()))
                    .collect(),
            ),
            Server::Gs(g) => (vec![], g.mount_env()),
            Server::S3s(f) => (vec!["--endpoint".into(), f.endpoint.clone()], vec![]),
        }
    }
}

impl Client {
    fn create(&self) {
        match self {
            Client::S3(b) => b.create(),
            Client::Az(c) => c.create(),
            Client::Gs(b) => b.create(),
            Client::S3s(_) => {}
        }
    }

    fn name(&self) -> &str {
        match self {
            Client::S3(b) => &b.name,
            Client::Az(c) => &c.name,
            Client::Gs(b) => &b.name,
            Client::S3s(b) => &b.name,
        }
    }

    fn put(&self, key: &str, bytes: &[u8]) {
        match self {
            Client::S3(b) => b.put(key, bytes),
            Client::Az(c) => c.put(key, bytes),
            Client::Gs(b) => b.put(key, bytes),
            Client::S3s(b) => b.put(key, bytes),
        }
    }

    /// A key put as it is, even one object_store would not name.
    fn put_raw(&self, key: &str, bytes: &[u8]) {
        match self {
            Client::S3(b) => b.put_raw(key, bytes),
            Client::Az(c) => c.put_raw(key, bytes),
            Client::Gs(_) => panic!("no raw puts to fake-gcs-server here"),
            Client::S3s(_) => panic!("no raw (unsigned) puts to s3s-fs here"),
        }
    }

    fn put_tree(&self, dir: &Path, prefix: &str) {
        match self {
            Client::S3(b) => b.put_tree(dir, prefix),
            Client::Az(c) => c.put_tree(dir, prefix),
            Client::Gs(b) => b.put_tree(dir, prefix),
            Client::S3s(b) => b.put_tree(dir, prefix),
        }
    }
}

struct Setup {
    server: Server,
    bucket: Client,
    data: tempfile::TempDir,
    scratch: Scratch,
}

impl Setup {
    /// The moto_server of an s3:// setup.
    fn moto(&self) -> &Moto {
        match &self.server {
            Server::S3(m) => m,
            _ => panic!("not an s3:// setup"),
        }
    }

    /// `scheme://rest` for this setup's kind.
    fn url(&self, rest: &str) -> String {
        format!("{}://{rest}", self.server.scheme())
    }
}

fn setup(bucket: &str, prefix: &str) -> Setup {
    setup_on(Kind::S3, bucket, prefix)
}

/// A server of `kind` with a bucket holding the sample tree under `prefix`.
fn setup_on(kind: Kind, bucket: &str, prefix: &str) -> Setup {
    let server = Server::start(kind);
    let b = server.client(bucket);
    b.create();
    let data = tempfile::tempdir().unwrap();
    sample_tree(data.path());
    b.put_tree(data.path(), prefix);
    Setup {
        server,
        bucket: b,
        data,
        scratch: Scratch::new(),
    }
}

/// `extra` with `--metadata-timeout 30s` added unless it sets that or a
/// `--source-timeout` (which the metadata timeout may not exceed): at the
/// default 5 s, a listing or stat that a slow emulator on a loaded machine
/// answers late fails the mount's first check or a lookup, as if the store
/// were stalled. A store that answers is not waited on any longer; the
/// tests of stalls and timeouts set their own.
fn patient<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = extra.to_vec();
    if !extra
        .iter()
        .any(|a| *a == "--metadata-timeout" || *a == "--source-timeout")
    {
        args.extend(["--metadata-timeout", "30s"]);
    }
    args
}

fn mount(s: &Setup, url: &str, extra: &[&str]) -> common::Mount {
    let (reach, env) = s.server.reach();
    let mut args: Vec<&str> = reach.iter().map(String::as_str).collect();
    args.extend(["--block-size", "256K"]);
    args.extend(patient(extra));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Mount::start_env(
        Path::new(url),
        &s.scratch.mnt,
        &s.scratch.cache,
        &args,
        &env,
    )
}

#[test]
fn the_tree_and_bytes_are_the_buckets_cold_and_after_a_remount() {
    require_fuse!();
    require_moto!();
    tree_and_bytes_cold_and_warm(Kind::S3);
}

#[test]
fn az_the_tree_and_bytes_are_the_containers_cold_and_after_a_remount() {
    require_fuse!();
    require_azurite!();
    tree_and_bytes_cold_and_warm(Kind::Az);
}

#[test]
fn gs_the_tree_and_bytes_are_the_buckets_cold_and_after_a_remount() {
    require_fuse!();
    require_fake_gcs!();
    tree_and_bytes_cold_and_warm(Kind::Gs);
}

#[test]
fn s3s_the_tree_and_bytes_are_the_buckets_cold_and_after_a_remount() {
    // Its listings carry no ETag and its GETs do: before versions were
    // compared on what both carry, every read failed with EIO here.
    require_fuse!();
    require_s3s!();
    tree_and_bytes_cold_and_warm(Kind::S3s);
}

/// The tree and bytes of the mount are the bucket's, cold, then warm (a
/// remount: the same cache directory, nothing read from the store), and
/// the bucket's root mounts too.
fn tree_and_bytes_cold_and_warm(kind: Kind) {
    let s = setup_on(kind, "data", "imagenet/train");
    let url = &s.url("data/imagenet/train");
    let mut m = mount(&s, url, &[]);
    assert_same_files(s.data.path(), &s.scratch.mnt);
    let cold_reads = m.stat("source_reads");
    assert!(cold_reads > 0, "the cold pass read nothing from the store");
    assert_eq!(m.stat("source_entries_skipped"), 0);
    // The data set's cache directory is named by the URL and endpoint.
    let ds: Vec<_> = fs::read_dir(&s.scratch.cache)
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().unwrap().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(ds.len(), 1, "{ds:?}");
    assert!(ds[0].starts_with("train-"), "{ds:?}");
    assert!(m.unmount().success());

    // Warm: the same cache directory, the same tree and bytes, and not one
    // block read from the store.
    let m = mount(&s, url, &[]);
    assert_same_files(s.data.path(), &s.scratch.mnt);
    assert_eq!(m.stat("source_reads"), 0, "a warm pass read from the store");
    let ds2 = fs::read_dir(&s.scratch.cache).unwrap().flatten().count();
    assert_eq!(
        ds2,
        fs::read_dir(&s.scratch.cache).unwrap().flatten().count()
    );
    drop(m);

    // The bucket's root (no prefix) mounts too, with the prefix as a
    // directory.
    let m = mount(&s, &s.url("data"), &[]);
    assert_same_files(s.data.path(), &s.scratch.mnt.join("imagenet/train"));
    drop(m);
}

#[test]
fn reads_across_block_boundaries_return_the_objects_bytes() {
    require_fuse!();
    require_moto!();
    ranged_reads(Kind::S3);
}

#[test]
fn az_reads_across_block_boundaries_return_the_blobs_bytes() {
    require_fuse!();
    require_azurite!();
    ranged_reads(Kind::Az);
}

#[test]
fn gs_reads_across_block_boundaries_return_the_objects_bytes() {
    require_fuse!();
    require_fake_gcs!();
    ranged_reads(Kind::Gs);
}

/// Reads that start and end inside blocks, span several, and run past the
/// end, each equal to the object's bytes.
#[test]
fn s3s_reads_across_block_boundaries_return_the_objects_bytes() {
    require_fuse!();
    require_s3s!();
    ranged_reads(Kind::S3s);
}

fn ranged_reads(kind: Kind) {
    let s = setup_on(kind, "ranges", "");
    let _m = mount(&s, &s.url("ranges"), &["--no-readahead"]);
    let rel = "train/dog/deep/er/x.bin";
    let want = fs::read(s.data.path().join(rel)).unwrap();
    let f = File::open(s.scratch.mnt.join(rel)).unwrap();
    let b = BLOCK as u64;
    for (off, len) in [
        (b - 100, 300),
        (2 * b - 1, 2),
        (b / 2, 2 * BLOCK),
        (3 * b - 5, 777 + 5),
        (0, want.len()),
        (3 * b + 700, 500),
    ] {
        let mut buf = vec![0u8; len];
        let n = read_full_at(&f, &mut buf, off).unwrap();
        let end = (off as usize + len).min(want.len());
        assert_eq!(n, end - off as usize, "length at {off}+{len}");
        assert!(buf[..n] == want[off as usize..end], "bytes at {off}+{len}");
    }
}

#[test]
fn keys_that_cannot_be_names_are_skipped_and_counted() {
    require_fuse!();
    require_moto!();
    odd_keys_skipped_and_counted(Kind::S3);
}

#[test]
fn az_keys_that_cannot_be_names_are_skipped_and_counted() {
    require_fuse!();
    require_azurite!();
    odd_keys_skipped_and_counted(Kind::Az);
}

// Not on gs://: fake-gcs-server ignores a listing's max-keys and
// start-after, which stepping past such a key needs (GCS itself takes both);
// see docs/objstore.md.

/// Keys that cannot be names are skipped (one log line each), counted in
/// stats and metrics, and the rest of each directory lists whole.
fn odd_keys_skipped_and_counted(kind: Kind) {
    let s = setup_on(kind, "odd", "p");
    // "p/clash" is an object and a prefix of "p/clash/inner": the
    // directory wins, the object is skipped. "p/marker/" is a directory
    // marker (an empty object named like a directory): not an entry.
    s.bucket.put("p/clash", b"file");
    s.bucket.put("p/clash/inner", b"inner");
    s.bucket.put_raw("p/marker/", b"");
    s.bucket.put("p/marker/m.txt", b"m");
    // Keys with an empty, `.` or `..` segment, put as they are. In the
    // listing of "p/" they show as the common prefixes "p/../", "p/./" and
    // "p//"; "p/a//b" as "p/a//" in the listing of "p/a/"; "p/x/." and
    // "p/y/.." as keys of theirs. Good keys sort before and after each of
    // them in the same listing page ("-" < "." < "/" < letters).
    let bad = ["p/../e", "p/./d", "p//c", "p/a//b", "p/x/.", "p/y/.."];
    for k in bad {
        s.bucket.put_raw(k, b"bad");
    }
    for k in ["p/-first", "p/a/ok", "p/x/-before", "p/x/z", "p/y/ok"] {
        s.bucket.put(k, k.as_bytes());
    }
    let addr = format!("127.0.0.1:{}", free_tcp_port());
    let mut m = mount(
        &s,
        &s.url("odd/p"),
        &["--log-format", "json", "--metrics", &addr],
    );
    let mnt = &s.scratch.mnt;
    assert!(mnt.join("clash").is_dir());
    assert_eq!(fs::read(mnt.join("clash/inner")).unwrap(), b"inner");
    assert_eq!(listing(&mnt.join("marker")), vec!["m.txt".to_string()]);
    assert_eq!(
        listing(mnt),
        ["-first", "a", "clash", "marker", "top.bin", "train", "val", "x", "y"]
    );
    assert_eq!(listing(&mnt.join("a")), ["ok"]);
    assert_eq!(listing(&mnt.join("x")), ["-before", "z"]);
    assert_eq!(listing(&mnt.join("y")), ["ok"]);
    for k in ["p/-first", "p/a/ok", "p/x/-before", "p/x/z", "p/y/ok"] {
        let rel = k.strip_prefix("p/").unwrap();
        assert_eq!(fs::read(mnt.join(rel)).unwrap(), k.as_bytes(), "{k}");
    }
    // The rest of the tree is whole.
    for rel in list_files(s.data.path()) {
        assert_same_content(&s.data.path().join(&rel), &mnt.join(&rel));
    }
    // Each bad key once: the clash and the six keys (as the prefix or key
    // their listing shows).
    assert_eq!(m.stat("source_entries_skipped"), 7);
    // Listing again warns no more and counts no more.
    for d in ["", "a", "x", "y"] {
        let _ = listing(&mnt.join(d));
    }
    assert_eq!(m.stat("source_entries_skipped"), 7);
    // And in the metrics (copied twice a second).
    let metric = || {
        let (samples, _, _) = common::prom::scrape(&addr);
        common::prom::value(&samples, "locafs_source_entries_skipped_total", &[])
    };
    wait_until(
        "the skipped keys in the metrics",
        Duration::from_secs(30),
        || metric() == Some(7.0),
    );
    assert!(m.unmount().success());
    let log = m.stderr();
    assert_eq!(
        log.matches("skipped: it is both an object and a prefix")
            .count(),
        1,
        "{log}"
    );
    for shown in ["p/../", "p/./", "p//", "p/a//", "p/x/.", "p/y/.."] {
        let line = format!("key \\\"{shown}\\\" skipped: a segment is empty");
        assert_eq!(log.matches(&line).count(), 1, "{shown}: {log}");
    }
}

fn mount_fails(args: &[&str]) -> (i32, String, Duration) {
    mount_fails_env(args, &[])
}

/// `locafs mount ARGS` with `env` added, expected to fail: its exit code,
/// stderr and how long it took.
fn mount_fails_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String, Duration) {
    let t0 = std::time::Instant::now();
    let mut full: Vec<&OsStr> = vec![OsStr::new("mount")];
    full.extend(args.iter().map(OsStr::new));
    let out = run_locafs_env(&full, env);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        t0.elapsed(),
    )
}

/// What docs/objstore.md promises for an endpoint nothing answers at: one
/// line on stderr (not object_store's retries at INFO, nor the error twice,
/// as a log line and as the message), exit 2, and nothing left behind: no
/// data set directory in the cache, in the foreground or with --daemon.
#[test]
fn a_dead_endpoint_gives_one_line_and_leaves_nothing() {
    require_fuse!();
    let sc = Scratch::new();
    // Owner-only already: else the mount also logs that it made it so.
    fs::set_permissions(
        &sc.cache,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let (mnt, cache) = (sc.mnt.to_str().unwrap(), sc.cache.to_str().unwrap());
    let dead = format!("http://127.0.0.1:{}", free_tcp_port());
    for daemon in [false, true] {
        let mut args = vec![
            "s3://b/x",
            mnt,
            "--cache-dir",
            cache,
            "--endpoint",
            &dead,
            "--no-sign-request",
        ];
        if daemon {
            args.push("--daemon");
        }
        let (code, err, _) = mount_fails(&args);
        assert_eq!(code, 2, "{err}");
        assert_eq!(err.trim().lines().count(), 1, "daemon {daemon}: {err}");
        assert!(err.starts_with("locafs: s3://b/x: "), "{err}");
        assert!(err.contains(&dead), "{err}");
        assert!(!is_mounted(&sc.mnt));
        let left: Vec<_> = std::fs::read_dir(&sc.cache)
            .unwrap()
            .flatten()
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name())
            .collect();
        assert!(left.is_empty(), "daemon {daemon}: left {left:?}");
    }
}

#[test]
fn a_missing_bucket_or_a_dead_endpoint_exits_2_before_mounting() {
    require_fuse!();
    require_moto!();
    let moto = Moto::start();
    let sc = Scratch::new();
    let (mnt, cache) = (sc.mnt.to_str().unwrap(), sc.cache.to_str().unwrap());
    let (code, err, _) = mount_fails(&[
        "s3://no-such-bucket/x",
        mnt,
        "--cache-dir",
        cache,
        "--endpoint",
        &moto.endpoint,
        // A slow moto on a loaded machine is not a missing bucket.
        "--metadata-timeout",
        "30s",
    ]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(
        err.lines().filter(|l| l.starts_with("locafs:")).count(),
        1,
        "{err}"
    );
    assert!(err.contains("\"no-such-bucket\" does not exist"), "{err}");
    assert!(!is_mounted(&sc.mnt));

    // Nothing listens on this port: refused at once, with one line.
    let dead = format!("http://127.0.0.1:{}", free_tcp_port());
    let (code, err, took) = mount_fails(&[
        "s3://b/x",
        mnt,
        "--cache-dir",
        cache,
        "--endpoint",
        &dead,
        "--metadata-timeout",
        "3s",
    ]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(
        err.lines().filter(|l| l.starts_with("locafs:")).count(),
        1,
        "{err}"
    );
    assert!(err.contains(&dead), "{err}");
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert!(!is_mounted(&sc.mnt));

    // Options for object stores on a directory source: a usage error.
    let (code, err, _) = mount_fails(&[
        sc.src.to_str().unwrap(),
        mnt,
        "--cache-dir",
        cache,
        "--endpoint",
        &moto.endpoint,
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--endpoint"), "{err}");
}

#[test]
fn refused_credentials_exit_2_before_mounting() {
    require_fuse!();
    require_moto!();
    // Credentials checked after two free requests: the bucket and one
    // object are made with them, so the only thing wrong below is the key.
    let moto = Moto::start_with_auth(2);
    let b = moto.bucket("guarded");
    b.create();
    b.put("ds/a.bin", b"a");
    let sc = Scratch::new();
    let (mnt, cache) = (sc.mnt.to_str().unwrap(), sc.cache.to_str().unwrap());
    let args = [
        "mount",
        "s3://guarded/ds",
        mnt,
        "--cache-dir",
        cache,
        "--endpoint",
        &moto.endpoint,
        "--metadata-timeout",
        "10s",
    ];
    let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    let t0 = std::time::Instant::now();
    let out = run_locafs_env(
        &args,
        &[
            ("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG1"),
            ("AWS_SECRET_ACCESS_KEY", "wrong"),
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("locafs:")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains("s3://guarded/ds: the credentials were refused")
            && lines[0].contains("InvalidAccessKeyId"),
        "{err}"
    );
    assert!(lines[0].len() < 500, "not one short line: {err}");
    // Refused at once: a 403 is not retried.
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    assert!(!is_mounted(&sc.mnt));
    assert_eq!(
        fs::read_dir(&sc.mnt).unwrap().count(),
        0,
        "something was left in the mountpoint"
    );
}

/// The servers of the credential tests: a moto that takes any key, behind
/// a proxy that records which key signed each request, holding `objects`
/// in `bucket`; and a moto with its IAM checks on (which refuses keys it
/// never issued) holding the first object.
fn signing_servers(bucket: &str, objects: &[(&str, &[u8])]) -> (Moto, Proxy, Moto) {
    let moto = Moto::start();
    let b = moto.bucket(bucket);
    b.create();
    for (key, bytes) in objects {
        b.put(key, bytes);
    }
    let proxy = Proxy::start(&format!("127.0.0.1:{}", moto.port));
    let guarded = Moto::start_with_auth(2);
    let g = guarded.bucket(bucket);
    g.create();
    if let Some((key, bytes)) = objects.first() {
        g.put(key, bytes);
    }
    (moto, proxy, guarded)
}

/// The (key, session token) pairs that signed requests through `proxy`
/// since the last call, sorted.
fn signers_seen(proxy: &Proxy) -> Vec<(String, Option<String>)> {
    let mut s: Vec<(String, Option<String>)> = proxy
        .counts
        .signers
        .lock()
        .drain()
        .map(|(k, _)| k)
        .collect();
    s.sort();
    s
}

#[test]
fn an_aws_profile_signs_the_mount_and_a_wrong_or_unsupported_one_exits_2() {
    require_fuse!();
    require_moto!();
    // moto 5.2.1 with its IAM checks on refuses the signature of every
    // listing whose query holds a '/' (delimiter=/), even a boto3 one with a
    // key it issued: so the right key is checked through the proxy (which
    // key signed each request), the wrong one by moto's checks.
    let bytes = pattern(17, 300_000);
    let (_moto, proxy, guarded) = signing_servers("profiled", &[("ds/a.bin", &bytes)]);

    // ~/.aws of a home of its own: in `right`, a key and, in the config
    // file, the proxy's endpoint and a region; in `wrong`, a key moto never
    // issued and the guarded server; in `role`, an assumed role.
    let home = tempfile::tempdir().unwrap();
    let aws = home.path().join(".aws");
    fs::create_dir(&aws).unwrap();
    let (creds, config) = (aws.join("credentials"), aws.join("config"));
    fs::write(
        &creds,
        "[right]\naws_access_key_id = AKIAPROFILERIGHT0001\naws_secret_access_key = r\n\n\
         [wrong]\naws_access_key_id = AKIAWRONGWRONGWRONG1\naws_secret_access_key = wrong\n",
    )
    .unwrap();
    fs::write(
        &config,
        format!(
            "[profile right]\nregion = us-east-1\nendpoint_url = {}\n\n\
             [profile wrong]\nendpoint_url = {}\n\n\
             [profile role]\nrole_arn = arn:aws:iam::123456789012:role/r\nsource_profile = right\n",
            proxy.endpoint, guarded.endpoint
        ),
    )
    .unwrap();
    let home_env = home.path().to_str().unwrap();
    let sc = Scratch::new();
    let (mnt, cache) = (sc.mnt.to_str().unwrap(), sc.cache.to_str().unwrap());
    let signers = || signers_seen(&proxy);

    // --profile right, no --endpoint (the profile's): signed with its key
    // alone, not the environment's AWS_ACCESS_KEY_ID (testing), and without
    // the environment's session token (it is not the profile key's).
    {
        let m = Mount::start_env(
            Path::new("s3://profiled/ds"),
            &sc.mnt,
            &sc.cache,
            &["--profile", "right", "--metadata-timeout", "30s"],
            &[("HOME", home_env), ("AWS_SESSION_TOKEN", "env-token")],
        );
        assert_eq!(fs::read(m.mnt.join("a.bin")).unwrap(), bytes);
    }
    assert_eq!(signers(), [("AKIAPROFILERIGHT0001".to_owned(), None)]);
    // The same profile from AWS_PROFILE: its endpoint, but the
    // environment's key wins, as in the AWS CLI.
    {
        let m = Mount::start_env(
            Path::new("s3://profiled/ds"),
            &sc.mnt,
            &sc.cache,
            &["--metadata-timeout", "30s"],
            &[("HOME", home_env), ("AWS_PROFILE", "right")],
        );
        assert_eq!(fs::read(m.mnt.join("a.bin")).unwrap(), bytes);
    }
    assert_eq!(signers(), [("testing".to_owned(), None)]);

    let base = [
        "s3://profiled/ds",
        mnt,
        "--cache-dir",
        cache,
        "--metadata-timeout",
        "30s",
    ];
    let fails = |extra: &[&str], env: &[(&str, &str)]| {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        let (code, err, _) = mount_fails_env(&args, env);
        one_line_exit_2(&sc, code, &err)
    };
    // A key moto never issued, the files named by AWS_SHARED_CREDENTIALS_FILE
    // and AWS_CONFIG_FILE.
    let line = fails(
        &["--profile", "wrong"],
        &[
            ("HOME", "/nonexistent"),
            ("AWS_SHARED_CREDENTIALS_FILE", creds.to_str().unwrap()),
            ("AWS_CONFIG_FILE", config.to_str().unwrap()),
        ],
    );
    assert!(
        line.contains(&format!(
            "s3://profiled/ds: the credentials were refused at {}",
            guarded.endpoint
        )) && line.contains("InvalidAccessKeyId"),
        "{line}"
    );
    // What locafs does not do, and a profile that is not there: refused
    // before any request.
    let line = fails(&["--profile", "role"], &[("HOME", home_env)]);
    assert!(
        line.starts_with("locafs: --profile role: role_arn (in ")
            && line.contains("aws configure export-credentials --profile role"),
        "{line}"
    );
    let line = fails(&["--profile", "nope"], &[("HOME", home_env)]);
    assert!(
        line.starts_with("locafs: --profile nope: no such profile in "),
        "{line}"
    );
    assert!(signers().is_empty());
}

/// `print keys.sh KEY_PREFIX SECONDS`, a credential_process for the tests
/// (its path has a space: the command line is split as the AWS CLI splits
/// it): prints keys whose id is KEY_PREFIX and its run count (4 digits),
/// with the session token `token-N`, expiring SECONDS from now; counts its
/// runs in `runs-KEY_PREFIX`; with a file `broken-KEY_PREFIX` beside it, it
/// fails instead (exit 1, a line on stderr).
fn keys_script(dir: &Path) -> PathBuf {
    let script = dir.join("print keys.sh");
    fs::write(
        &script,
        "#!/bin/sh\n\
         dir=$(dirname \"$0\")\n\
         n=$(( $(cat \"$dir/runs-$1\" 2>/dev/null || echo 0) + 1 )); echo $n > \"$dir/runs-$1\"\n\
         if [ -e \"$dir/broken-$1\" ]; then echo \"helper: session for $1 ended\" >&2; exit 1; fi\n\
         printf '{\"Version\": 1, \"AccessKeyId\": \"%s%04d\", \"SecretAccessKey\": \"testing\", \
         \"SessionToken\": \"token-%d\", \"Expiration\": \"%s\"}\\n' \
         \"$1\" $n $n \"$(date -u -d \"+$2 seconds\" +%Y-%m-%dT%H:%M:%SZ)\"\n",
    )
    .unwrap();
    script
}

/// How many times `keys_script` ran for `prefix`.
fn script_runs(dir: &Path, prefix: &str) -> u32 {
    fs::read_to_string(dir.join(format!("runs-{prefix}")))
        .map(|s| s.trim().parse().unwrap())
        .unwrap_or(0)
}

#[test]
fn a_credential_process_profile_signs_the_mount_and_a_failing_one_exits_2() {
    require_fuse!();
    require_moto!();
    // As in the static-key test above: the keys that sign are seen at the
    // proxy in front of a moto that takes any; a wrong key is refused by a
    // moto with its IAM checks on.
    let bytes = pattern(23, 600_000);
    let (_moto, proxy, guarded) = signing_servers(
        "processed",
        &[
            ("ds/a.bin", &bytes),
            ("ds/b.bin", &bytes[..300_000]),
            ("ds/c.bin", &bytes[300_000..]),
        ],
    );

    let home = tempfile::tempdir().unwrap();
    let aws = home.path().join(".aws");
    fs::create_dir(&aws).unwrap();
    let script = keys_script(home.path());
    let run = format!("sh \"{}\"", script.display());
    let config = aws.join("config");
    fs::write(
        &config,
        format!(
            "[profile process]\ncredential_process = {run} AKIAPROCESS00000 3600\n\
             endpoint_url = {p}\nregion = us-east-1\n\n\
             [profile soon]\ncredential_process = {run} AKIAPROCESSSOON0 240\nendpoint_url = {p}\n\n\
             [profile wrongproc]\ncredential_process = {run} AKIAWRONGWRONGWR 3600\n\
             endpoint_url = {g}\n\n\
             [profile failing]\ncredential_process = sh -c \"echo 'helper: not logged in' >&2; exit 1\"\n\
             endpoint_url = {p}\n\n\
             [profile garbage]\ncredential_process = echo AKIANOTJSON\nendpoint_url = {p}\n\n\
             [profile badurl]\naws_access_key_id = A\naws_secret_access_key = B\n\
             endpoint_url = 127.0.0.1:9\n",
            p = proxy.endpoint,
            g = guarded.endpoint
        ),
    )
    .unwrap();
    let home_env = home.path().to_str().unwrap();
    let sc = Scratch::new();
    let (mnt, cache) = (sc.mnt.to_str().unwrap(), sc.cache.to_str().unwrap());
    let signers = || signers_seen(&proxy);

    // The command's keys and session token sign every request, not the
    // environment's key or token; run once by the holder's check of the
    // store before mounting and once by the serving process (its own
    // client), and no more (the keys last an hour).
    {
        let m = Mount::start_env(
            Path::new("s3://processed/ds"),
            &sc.mnt,
            &sc.cache,
            &[
                "--profile",
                "process",
                "--metadata-timeout",
                "30s",
                "--no-readahead",
            ],
            &[("HOME", home_env), ("AWS_SESSION_TOKEN", "env-token")],
        );
        assert_eq!(fs::read(m.mnt.join("a.bin")).unwrap(), bytes);
        assert!(
            !m.stderr().contains("refreshing the keys failed"),
            "{}",
            m.stderr()
        );
    }
    assert_eq!(
        signers(),
        [
            (
                "AKIAPROCESS000000001".to_owned(),
                Some("token-1".to_owned())
            ),
            (
                "AKIAPROCESS000000002".to_owned(),
                Some("token-2".to_owned())
            )
        ]
    );
    assert_eq!(script_runs(home.path(), "AKIAPROCESS00000"), 2);

    // Keys within 5 minutes of their Expiration are fetched again, at most
    // every 10 s while they are valid (not for every request): a read more
    // than 10 s after the last run is signed by a later run's keys, each
    // with its own token. (No read-ahead in these mounts: b.bin and c.bin
    // are read from the store here.)
    let t0 = std::time::Instant::now();
    let (runs, seen) = {
        let m = Mount::start_env(
            Path::new("s3://processed/ds"),
            &sc.mnt,
            &sc.cache,
            &[
                "--profile",
                "soon",
                "--metadata-timeout",
                "30s",
                "--no-readahead",
            ],
            &[("HOME", home_env)],
        );
        assert_eq!(fs::read(m.mnt.join("b.bin")).unwrap(), bytes[..300_000]);
        let before = script_runs(home.path(), "AKIAPROCESSSOON0");
        signers();
        std::thread::sleep(Duration::from_millis(10_500));
        assert_eq!(fs::read(m.mnt.join("c.bin")).unwrap(), bytes[300_000..]);
        let runs = script_runs(home.path(), "AKIAPROCESSSOON0");
        assert!(runs > before, "not run again ({runs} runs)");
        assert!(
            !m.stderr().contains("refreshing the keys failed"),
            "{}",
            m.stderr()
        );
        (runs, signers())
    };
    // Twice at mount (the holder's check, the server), then at most once
    // per 10 s (and once more at a boundary).
    let most = 3 + t0.elapsed().as_secs() as u32 / 10;
    assert!(runs <= most, "ran {runs} times in {:?}", t0.elapsed());
    let mut later = false;
    for (key, token) in &seen {
        let n: u32 = key
            .strip_prefix("AKIAPROCESSSOON0")
            .unwrap_or_else(|| panic!("{seen:?}"))
            .parse()
            .unwrap();
        assert!(n >= 1 && n <= runs, "{seen:?}");
        assert_eq!(token.as_deref(), Some(format!("token-{n}").as_str()));
        later |= n >= 2;
    }
    assert!(later, "c.bin not signed by a later run's keys: {seen:?}");

    let base = [
        "s3://processed/ds",
        mnt,
        "--cache-dir",
        cache,
        "--metadata-timeout",
        "30s",
    ];
    let fails = |profile: &str| {
        let args: Vec<&str> = base.iter().copied().chain(["--profile", profile]).collect();
        let (code, err, _) = mount_fails_env(&args, &[("HOME", home_env)]);
        one_line_exit_2(&sc, code, &err)
    };
    // Keys the store refuses: refused as any wrong key is.
    let line = fails("wrongproc");
    assert!(
        line.contains(&format!(
            "s3://processed/ds: the credentials were refused at {}",
            guarded.endpoint
        )) && line.contains("InvalidAccessKeyId"),
        "{line}"
    );
    // A command that fails: the profile, the command, its status and the
    // first line of its stderr; no request sent.
    let line = fails("failing");
    let config_s = config.display().to_string();
    assert!(
        line.starts_with("locafs: --profile failing: credential_process `sh -c")
            && line.contains(&format!(
                "(in {config_s}) exited with status 1: helper: not logged in"
            )),
        "{line}"
    );
    // Output that is not keys: said so, without the output.
    let line = fails("garbage");
    assert!(
        line.contains("credential_process `echo AKIANOTJSON`")
            && line.contains("its output is not JSON")
            && line.matches("AKIANOTJSON").count() == 1,
        "{line}"
    );
    // A malformed endpoint_url is the profile's, not --endpoint's.
    let line = fails("badurl");
    assert_eq!(
        line,
        format!(
            "locafs: --profile badurl: endpoint_url 127.0.0.1:9 (in {config_s}) is not an \
             http:// or https:// URL"
        )
    );
    assert!(signers().is_empty());
}

#[test]
fn keys_a_credential_process_can_no_longer_renew_fail_reads_with_eio_then_recover() {
    require_fuse!();
    require_moto!();
    let moto = Moto::start();
    let b = moto.bucket("renewed");
    b.create();
    let files: Vec<(String, Vec<u8>)> = (0..50)
        .map(|i| (format!("f{i:02}.bin"), pattern(100 + i, 70_000)))
        .collect();
    for (name, bytes) in &files {
        b.put(&format!("ds/{name}"), bytes);
    }
    let home = tempfile::tempdir().unwrap();
    let aws = home.path().join(".aws");
    fs::create_dir(&aws).unwrap();
    let script = keys_script(home.path());
    // Keys for 15 s: always within the refresh window, so every request
    // runs the command again (one at a time) while it works.
    fs::write(
        aws.join("config"),
        format!(
            "[profile short]\ncredential_process = sh \"{}\" AKIASHORTLIVED00 15\n\
             endpoint_url = {}\n",
            script.display(),
            moto.endpoint
        ),
    )
    .unwrap();
    let sc = Scratch::new();
    let m = Mount::start_env(
        Path::new("s3://renewed/ds"),
        &sc.mnt,
        &sc.cache,
        &[
            "--profile",
            "short",
            "--metadata-timeout",
            "30s",
            "--no-readahead",
        ],
        &[("HOME", home.path().to_str().unwrap())],
    );
    let mut next = files.iter();
    let (name, bytes) = next.next().unwrap();
    assert_eq!(&fs::read(m.mnt.join(name)).unwrap(), bytes);

    // The helper's session ends: the keys in hand sign until they expire,
    // then uncached reads fail with EIO.
    fs::write(home.path().join("broken-AKIASHORTLIVED00"), "").unwrap();
    let mut failed = None;
    wait_until(
        "a read failing once the keys expired",
        Duration::from_secs(120),
        || {
            let Some((name, bytes)) = next.next() else {
                panic!("no read failed; stderr:\n{}", m.stderr());
            };
            match fs::read(m.mnt.join(name)) {
                Ok(got) => {
                    assert_eq!(&got, bytes, "{name}");
                    std::thread::sleep(Duration::from_millis(500));
                    false
                }
                Err(e) => {
                    failed = Some((name, bytes, e));
                    true
                }
            }
        },
    );
    let (name, bytes, e) = failed.unwrap();
    assert_eq!(
        e.raw_os_error(),
        Some(libc::EIO),
        "{e}; stderr:\n{}",
        m.stderr()
    );
    let log = m.stderr();
    assert!(
        log.contains("refreshing the keys failed: --profile short: credential_process `sh ")
            && log.contains("exited with status 1: helper: session for AKIASHORTLIVED00 ended"),
        "{log}"
    );
    assert!(
        !log.contains("AKIASHORTLIVED0001"),
        "a key in the log: {log}"
    );
    // The helper works again: the next reads run it again and succeed.
    fs::remove_file(home.path().join("broken-AKIASHORTLIVED00")).unwrap();
    wait_until(
        "the read after renewal",
        Duration::from_secs(60),
        || match fs::read(m.mnt.join(name)) {
            Ok(got) => {
                assert_eq!(&got, bytes);
                true
            }
            Err(_) => {
                std::thread::sleep(Duration::from_millis(500));
                false
            }
        },
    );
}

/// A failed mount said so in one `locafs:` line (returned), exited 2 and
/// left nothing mounted.
fn one_line_exit_2(sc: &Scratch, code: i32, err: &str) -> String {
    assert_eq!(code, 2, "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("locafs:")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].len() < 500, "not one short line: {err}");
    assert!(!is_mounted(&sc.mnt));
    assert_eq!(
        fs::read_dir(&sc.mnt).unwrap().count(),
        0,
        "something was left in the mountpoint"
    );
    lines[0].to_owned()
}

#[test]
fn az_a_missing_container_or_a_wrong_key_exits_2_before_mounting() {
    require_fuse!();
    require_azurite!();
    let az = Azurite::start();
    let c = az.container("there");
    c.create();
    c.put("ds/a.bin", b"a");
    let sc = Scratch::new();
    let (mnt, cache) = (sc.mnt.to_str().unwrap(), sc.cache.to_str().unwrap());
    let env = Azurite::mount_env();
    let base = ["--cache-dir", cache, "--endpoint", &az.endpoint];
    let args = |url: &'static str| {
        let mut a = vec![url, mnt, "--metadata-timeout", "30s"];
        a.extend_from_slice(&base);
        a
    };
    let (code, err, _) = mount_fails_env(&args("az://no-such-container/x"), &env);
    let line = one_line_exit_2(&sc, code, &err);
    assert!(
        line.contains("container \"no-such-container\" does not exist")
            && line.contains(&az.endpoint),
        "{err}"
    );

    // The right container, a wrong key (valid base64): refused at once.
    let mut wrong = env.clone();
    wrong.push(("AZURE_STORAGE_ACCOUNT_KEY", "d3Jvbmcgd3Jvbmcgd3Jvbmc="));
    let t0 = std::time::Instant::now();
    let (code, err, _) = mount_fails_env(&args("az://there/ds"), &wrong);
    let line = one_line_exit_2(&sc, code, &err);
    assert!(
        line.contains("az://there/ds: the credentials were refused")
            && line.contains("AuthorizationFailure"),
        "{err}"
    );
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());

    // And with the emulator's key, the same command mounts.
    let m = Mount::start_env(
        Path::new("az://there/ds"),
        &sc.mnt,
        &sc.cache,
        &base[2..],
        &env,
    );
    assert_eq!(fs::read(sc.mnt.join("a.bin")).unwrap(), b"a");
    drop(m);
}

/// fake-gcs-server takes any credentials (no flag turns checks on; a
/// bearer token it never issued lists a bucket), so refused keys are not
/// tested on gs://; what is checked before any request is: a
/// service-account file that is missing, not JSON, or whose private key is
/// not one (named through each variable object_store reads) gives one line
/// naming the variable and file, exit 2, nothing mounted. No server is
/// needed: no request is sent.
#[test]
fn gs_a_malformed_service_account_exits_2_naming_it() {
    require_fuse!();
    let d = tempfile::tempdir().unwrap();
    let not_json = d.path().join("not-json.json");
    fs::write(&not_json, "{client_email: oops").unwrap();
    let bad_key = d.path().join("bad-key.json");
    fs::write(
        &bad_key,
        "{\"type\": \"service_account\", \"client_email\": \"sa@p.iam.gserviceaccount.com\", \
         \"private_key_id\": \"k1\", \"private_key\": \
         \"-----BEGIN PRIVATE KEY-----\\nAAAA\\n-----END PRIVATE KEY-----\\n\"}",
    )
    .unwrap();
    let missing = d.path().join("missing.json");
    let sc = Scratch::new();
    let (mnt, cache) = (sc.mnt.to_str().unwrap(), sc.cache.to_str().unwrap());
    let args = ["gs://b/x", mnt, "--cache-dir", cache];
    let path = |p: &Path| p.to_str().unwrap().to_owned();
    for (var, file, said) in [
        (
            "GOOGLE_SERVICE_ACCOUNT",
            path(&not_json),
            "Unable to decode service account file",
        ),
        (
            "GOOGLE_SERVICE_ACCOUNT",
            path(&missing),
            "No such file or directory",
        ),
        (
            "GOOGLE_APPLICATION_CREDENTIALS",
            path(&not_json),
            "Unable to decode service account file",
        ),
        ("GOOGLE_SERVICE_ACCOUNT", path(&bad_key), "Invalid RSA key"),
    ] {
        let (code, err, _) = mount_fails_env(&args, &[(var, &file)]);
        let line = one_line_exit_2(&sc, code, &err);
        assert!(
            line.starts_with(&format!(
                "locafs: gs://b/x: the credentials of {var}={file} cannot be used"
            )) && line.contains(said),
            "{var}={file}: {line}"
        );
    }
    // The key itself in GOOGLE_SERVICE_ACCOUNT_KEY: named by its length,
    // never shown.
    let (code, err, _) = mount_fails_env(&args, &[("GOOGLE_SERVICE_ACCOUNT_KEY", "{secret")]);
    let line = one_line_exit_2(&sc, code, &err);
    assert!(
        line.contains("GOOGLE_SERVICE_ACCOUNT_KEY (a key of 7 bytes) cannot be used")
            && !line.contains("secret"),
        "{line}"
    );
}

#[test]
fn gs_a_missing_bucket_exits_2_before_mounting() {
    require_fuse!();
    require_fake_gcs!();
    let gcs = FakeGcs::start();
    let b = gcs.bucket("there");
    b.create();
    b.put("ds/a.bin", b"a");
    let sc = Scratch::new();
    let (mnt, cache) = (sc.mnt.to_str().unwrap(), sc.cache.to_str().unwrap());
    let env = gcs.mount_env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    // Reached through the service-account file, and through --endpoint
    // with unsigned requests: both find that the bucket is not there.
    for (extra, env) in [
        (vec![], env.clone()),
        (
            vec!["--endpoint", gcs.endpoint.as_str(), "--no-sign-request"],
            vec![],
        ),
    ] {
        // fake-gcs-server answers 500, which object_store retries with
        // backoff for 4-8 s: more than the default --metadata-timeout.
        let mut args = vec![
            "gs://no-such-bucket/x",
            mnt,
            "--cache-dir",
            cache,
            "--metadata-timeout",
            "30s",
        ];
        args.extend_from_slice(&extra);
        let (code, err, _) = mount_fails_env(&args, &env);
        let line = one_line_exit_2(&sc, code, &err);
        assert!(
            line.contains("bucket \"no-such-bucket\" does not exist"),
            "{extra:?}: {err}"
        );
    }
    // The bucket that is there mounts both ways.
    let m = Mount::start_env(
        Path::new("gs://there/ds"),
        &sc.mnt,
        &sc.cache,
        &patient(&[]),
        &env,
    );
    assert_eq!(fs::read(sc.mnt.join("a.bin")).unwrap(), b"a");
    drop(m);
    let args = patient(&["--endpoint", gcs.endpoint.as_str(), "--no-sign-request"]);
    let m = Mount::start_env(Path::new("gs://there/ds"), &sc.mnt, &sc.cache, &args, &[]);
    assert_eq!(fs::read(sc.mnt.join("a.bin")).unwrap(), b"a");
    drop(m);
}

/// A setup with a proxy between the mount and moto.
fn setup_proxied(bucket: &str) -> (Setup, Proxy) {
    let s = setup(bucket, "ds");
    let p = Proxy::start(&format!("127.0.0.1:{}", s.moto().port));
    (s, p)
}

/// A mount of the setup's `ds` through the proxy, given 60 s to appear (as
/// [`mount`]: the store is asked before anything is mounted).
fn mount_via(s: &Setup, p: &Proxy, extra: &[&str]) -> common::Mount {
    let mut args = vec!["--endpoint", p.endpoint.as_str(), "--block-size", "256K"];
    args.extend(patient(extra));
    let url = format!("s3://{}/ds", s.bucket.name());
    Mount::start_env(
        Path::new(&url),
        &s.scratch.mnt,
        &s.scratch.cache,
        &args,
        &[],
    )
}

#[test]
fn a_remount_reads_cached_data_with_no_get() {
    require_fuse!();
    require_moto!();
    let (s, p) = setup_proxied("persist");
    let mut m = mount_via(&s, &p, &[]);
    assert_same_files(s.data.path(), &s.scratch.mnt);
    let cold = p.counts.total_gets();
    // Every non-empty object was fetched, in cache blocks (a few more
    // GETs than objects: the multi-block file).
    let objects = list_files(s.data.path())
        .iter()
        .filter(|r| fs::metadata(s.data.path().join(r)).unwrap().len() > 0)
        .count() as u64;
    assert!(cold >= objects, "{cold} GETs for {objects} objects");
    // Listings give every attribute: no HEAD per lookup or open.
    assert_eq!(p.counts.heads.load(Relaxed), 0, "HEAD requests were sent");
    assert!(m.unmount().success());
    let gets = p.counts.gets.lock().clone();
    let lists = p.counts.lists.load(Relaxed);

    let m = mount_via(&s, &p, &[]);
    assert_same_files(s.data.path(), &s.scratch.mnt);
    assert_eq!(m.stat("source_reads"), 0);
    assert_eq!(
        *p.counts.gets.lock(),
        gets,
        "the remount sent GETs for cached data"
    );
    // The tree came from the manifest: no listing but the one that checks
    // the bucket and credentials before mounting.
    assert_eq!(
        p.counts.lists.load(Relaxed),
        lists + 1,
        "the remount listed"
    );
}

#[test]
fn stale_files_are_revalidated_by_listing_their_directory_not_by_a_head_each() {
    require_fuse!();
    require_moto!();
    let (s, p) = setup_proxied("relist");
    // Forty more files in one directory: a HEAD each would show.
    for i in 0..40 {
        let rel = format!("train/many/{i:03}.jpg");
        let path = s.data.path().join(&rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        write_file(&path, seed("relist") + i, 1000 + i as usize);
        s.bucket
            .put(&format!("ds/{rel}"), &fs::read(&path).unwrap());
    }
    let m = mount_via(&s, &p, &["--revalidate", "2s"]);
    assert_same_files(s.data.path(), &s.scratch.mnt);
    let files = list_files(s.data.path());
    let mut dirs: Vec<PathBuf> = files
        .iter()
        .flat_map(|f| f.ancestors().skip(1).map(Path::to_owned))
        .collect();
    dirs.sort();
    dirs.dedup();
    let lists0 = p.counts.lists.load(Relaxed);
    let gets0 = p.counts.total_gets();
    // Every entry stale, then every file opened and read again: the
    // kernel looks each path up again, and each open revalidates.
    std::thread::sleep(Duration::from_millis(2500));
    let t0 = std::time::Instant::now();
    for rel in &files {
        assert_same_content(&s.data.path().join(rel), &s.scratch.mnt.join(rel));
    }
    let took = t0.elapsed();
    let lists = p.counts.lists.load(Relaxed) - lists0;
    assert_eq!(p.counts.heads.load(Relaxed), 0, "stale files were HEAD-ed");
    assert_eq!(
        p.counts.total_gets(),
        gets0,
        "cached data was fetched again"
    );
    // One listing per directory (the root's stat is a listing too) while
    // the pass took less than --revalidate, and one more round: a listing
    // made in the pass's first moments may be due again at its end (the
    // root's stat and its listing are not made at the same instant); one
    // more each per 2 s past it. A HEAD or a listing per file (48) shows.
    let rounds = 2 + took.as_secs() / 2;
    assert!(
        lists <= (dirs.len() as u64 + 1) * rounds,
        "{lists} listings for {} files in {} directories in {took:?}",
        files.len(),
        dirs.len()
    );
    assert!(lists > 0, "nothing was revalidated");
    assert_eq!(m.stat("read_errors"), 0);
    eprintln!(
        "{} files in {} directories revalidated with {lists} listings, 0 HEAD, in {took:?}",
        files.len(),
        dirs.len()
    );
}

#[test]
fn throttling_answers_are_retried_and_every_read_succeeds() {
    require_fuse!();
    require_moto!();
    let (s, p) = setup_proxied("throttle");
    // Every third request answered 503 SlowDown, listings included.
    p.knobs.slowdown_every.store(3, Relaxed);
    let addr = format!("127.0.0.1:{}", free_tcp_port());
    let m = mount_via(&s, &p, &["--metrics", &addr]);
    assert_same_files(s.data.path(), &s.scratch.mnt);
    assert_eq!(m.stat("read_errors"), 0);
    // Each 503 the proxy sent was seen and counted by the mount (the
    // bucket check before mounting included; read once no more are sent, as
    // read-ahead may still be fetching).
    p.knobs.slowdown_every.store(0, Relaxed);
    let mut sent = 0;
    wait_until(
        "the mount's count equal to the proxy's",
        Duration::from_secs(30),
        || {
            sent = p.counts.throttled();
            m.stat("source_throttled_responses") == sent
        },
    );
    assert!(sent > 0, "nothing was throttled");
    wait_until(
        "the throttled count in the metrics",
        Duration::from_secs(30),
        || {
            let (samples, _, _) = common::prom::scrape(&addr);
            common::prom::value(&samples, "locafs_source_throttled_total", &[]) == Some(sent as f64)
        },
    );
}

#[test]
fn throttling_cuts_read_ahead_concurrency_to_its_floor() {
    require_fuse!();
    require_moto!();
    let moto = Moto::start();
    let bucket = moto.bucket("slow");
    bucket.create();
    // 600 files of 32 KiB behind 50 ms a request: at 4 fetches in flight
    // (where the tuner starts) about 7 s of background fetching, so it has
    // time to raise its limit.
    let data = tempfile::tempdir().unwrap();
    for i in 0..600u64 {
        write_file(
            &data.path().join(format!("c{}/{i:04}.bin", i % 6)),
            seed("slow") + i,
            32 << 10,
        );
    }
    bucket.put_tree(data.path(), "ds");
    let p = Proxy::start(&format!("127.0.0.1:{}", moto.port));
    p.knobs.latency_us.store(50_000, Relaxed);
    let sc = Scratch::new();
    let m = Mount::start_env(
        Path::new("s3://slow/ds"),
        &sc.mnt,
        &sc.cache,
        &[
            "--endpoint",
            &p.endpoint,
            "--block-size",
            "256K",
            "--revalidate",
            "1s",
        ],
        &[],
    );
    let t0 = std::time::Instant::now();
    // The loader lists and reads a file: read-ahead fetches the rest, and
    // its tuner raises the limit while throughput rises with it.
    let _ = listing(&sc.mnt);
    assert_same_content(
        &data.path().join("c0/0000.bin"),
        &sc.mnt.join("c0/0000.bin"),
    );
    let floor = locafs::read::concurrency::AUTO_FLOOR as u64;
    let mut high = m.stat("prefetch_concurrency");
    wait_until(
        "read-ahead to raise its concurrency",
        Duration::from_secs(120),
        || {
            high = high.max(m.stat("prefetch_concurrency"));
            high > floor
        },
    );
    let raised = t0.elapsed();
    // No throttling so far but what the store itself sent (a loaded moto
    // answers 503 now and then), each counted by the mount.
    wait_until(
        "the mount's count of the store's own 503s equal to the proxy's",
        Duration::from_secs(30),
        || m.stat("source_throttled_responses") == p.counts.throttled(),
    );
    // Now the store answers every other request 503 SlowDown. The tree's
    // revalidation (listings) and any fetch still going meet it: the tuner
    // halves its limit on each window with such answers, to the floor.
    p.knobs.slowdown_every.store(2, Relaxed);
    wait_until(
        "the concurrency back at its floor",
        Duration::from_secs(120),
        || {
            for d in 0..6 {
                let _ = fs::read_dir(sc.mnt.join(format!("c{d}"))).map(|r| r.count());
            }
            std::thread::sleep(Duration::from_millis(300));
            m.stat("prefetch_concurrency") == floor
        },
    );
    let cut_after = t0.elapsed();
    // And no read failed: files read as they were put, while the store
    // still throttles (every open revalidates its directory against the
    // store, with retries: a sample of 12, not all 600;
    // throttling_answers_are_retried reads a whole tree so).
    for rel in list_files(data.path()).iter().step_by(50) {
        assert_same_content(&data.path().join(rel), &sc.mnt.join(rel));
    }
    assert_eq!(m.stat("read_errors"), 0);
    // Each 503 the proxy sent was counted by the mount (read once no more
    // are sent: revalidation and read-ahead send requests all along).
    p.knobs.slowdown_every.store(0, Relaxed);
    let mut throttled = 0;
    wait_until(
        "the mount's count equal to the proxy's",
        Duration::from_secs(30),
        || {
            throttled = m.stat("source_throttled_responses");
            throttled == p.counts.throttled()
        },
    );
    assert!(throttled > 0);
    eprintln!(
        "concurrency {floor} -> {high} (after {raised:?}) -> {floor} (after {cut_after:?}); \
         {throttled} answers throttled; done after {:?}",
        t0.elapsed()
    );
}

#[test]
fn a_stalled_store_serves_what_is_cached_and_times_out_the_rest() {
    require_fuse!();
    require_moto!();
    let (s, p) = setup_proxied("stall");
    let m = mount_via(
        &s,
        &p,
        &[
            "--source-timeout",
            "4s",
            "--metadata-timeout",
            "2s",
            "--no-readahead",
        ],
    );
    let mnt = &s.scratch.mnt;
    let files = list_files(s.data.path());
    let (cached, uncached) = files.split_at(files.len() / 2);
    for rel in cached {
        assert_same_content(&s.data.path().join(rel), &mnt.join(rel));
    }
    p.knobs.stalled.store(true, Relaxed);
    let t0 = std::time::Instant::now();
    for rel in cached {
        assert_same_content(&s.data.path().join(rel), &mnt.join(rel));
    }
    let mut failed = 0;
    for rel in uncached {
        if fs::metadata(s.data.path().join(rel)).unwrap().len() == 0 {
            continue;
        }
        let t = std::time::Instant::now();
        let r = fs::read(mnt.join(rel));
        let took = t.elapsed();
        let e = r.expect_err("an uncached read succeeded while the store stalled");
        assert!(
            matches!(e.raw_os_error(), Some(libc::ETIMEDOUT) | Some(libc::EIO)),
            "{rel:?}: {e}"
        );
        // (Its deadline is the 4 s --source-timeout; the bounds are far
        // from it, and far from a hang.)
        assert!(took < Duration::from_secs(60), "{rel:?} waited {took:?}");
        failed += 1;
    }
    assert!(failed > 0);
    assert!(
        t0.elapsed() < Duration::from_secs(180),
        "{:?}",
        t0.elapsed()
    );
    p.knobs.stalled.store(false, Relaxed);
    // Once the store answers again, so does the mount.
    wait_until(
        "the uncached files read again",
        Duration::from_secs(30),
        || {
            uncached.iter().all(|rel| {
                fs::read(mnt.join(rel))
                    .is_ok_and(|b| b == fs::read(s.data.path().join(rel)).unwrap())
            })
        },
    );
    drop(m);
}

#[test]
fn an_object_replaced_mid_epoch_fails_old_blocks_then_shows_new_bytes() {
    require_fuse!();
    require_moto!();
    let (s, p) = setup_proxied("replace");
    let _m = mount_via(&s, &p, REPLACE_ARGS);
    replaced_mid_epoch(&s);
}

#[test]
fn az_a_blob_replaced_mid_epoch_fails_old_blocks_then_shows_new_bytes() {
    require_fuse!();
    require_azurite!();
    let s = setup_on(Kind::Az, "replace", "ds");
    let _m = mount(&s, &s.url("replace/ds"), REPLACE_ARGS);
    replaced_mid_epoch(&s);
}

#[test]
fn gs_an_object_replaced_mid_epoch_fails_old_blocks_then_shows_new_bytes() {
    require_fuse!();
    require_fake_gcs!();
    let s = setup_on(Kind::Gs, "replace", "ds");
    let _m = mount(&s, &s.url("replace/ds"), REPLACE_ARGS);
    replaced_mid_epoch(&s);
}

#[test]
fn s3s_an_object_replaced_mid_epoch_fails_old_blocks_then_shows_new_bytes() {
    // s3s-fs ignores If-Match: the ETag of the answer, remembered from the
    // first GET of the version, tells.
    require_fuse!();
    require_s3s!();
    let s = setup_on(Kind::S3s, "replace", "ds");
    let _m = mount(&s, &s.url("replace/ds"), REPLACE_ARGS);
    replaced_mid_epoch(&s);
}

#[test]
fn cached_files_read_after_a_remount_with_the_server_stopped() {
    require_fuse!();
    require_moto!();
    stopped_server_remount(Kind::S3);
}

#[test]
fn az_cached_files_read_after_a_remount_with_the_server_stopped() {
    require_fuse!();
    require_azurite!();
    stopped_server_remount(Kind::Az);
}

#[test]
fn gs_cached_files_read_after_a_remount_with_the_server_stopped() {
    require_fuse!();
    require_fake_gcs!();
    stopped_server_remount(Kind::Gs);
}

#[test]
fn s3s_cached_files_read_after_a_remount_with_the_server_stopped() {
    require_fuse!();
    require_s3s!();
    stopped_server_remount(Kind::S3s);
}

/// Every file read once (so cached whole), the mount stopped, the server
/// stopped, the mount started again over the same cache: it comes up from
/// what it saved, says the store does not answer, and serves the tree and
/// every byte with no request to the store.
fn stopped_server_remount(kind: Kind) {
    let mut s = setup_on(kind, "gone", "ds");
    let url = s.url("gone/ds");
    let mut m = mount(&s, &url, &["--no-readahead"]);
    assert_same_files(s.data.path(), &s.scratch.mnt);
    assert!(m.unmount().success());
    s.server.kill();
    let m = mount(&s, &url, &["--no-readahead", "--metadata-timeout", "2s"]);
    assert_same_files(s.data.path(), &s.scratch.mnt);
    assert_eq!(
        m.stat("source_reads"),
        0,
        "a read went to the stopped store"
    );
    assert_eq!(m.stat("read_errors"), 0);
}

/// Revalidation every 2 s, no read-ahead: only what is read is cached.
const REPLACE_ARGS: &[&str] = &[
    "--revalidate",
    "2s",
    "--no-readahead",
    "--kernel-readahead",
    "0",
];

/// An object of the mounted `ds` prefix replaced while open, by one of the
/// same size: its uncached blocks fail with EIO (the ETag tells), its
/// cached block reads as it was, and after revalidation the new bytes show.
fn replaced_mid_epoch(s: &Setup) {
    let rel = "train/dog/deep/er/x.bin";
    let key = format!("ds/{rel}");
    let old = fs::read(s.data.path().join(rel)).unwrap();
    let f = File::open(s.scratch.mnt.join(rel)).unwrap();
    let mut buf = vec![0u8; 100];
    assert_eq!(read_full_at(&f, &mut buf, 0).unwrap(), 100);
    assert!(buf[..] == old[..100]);
    // The same size, other bytes: only the ETag tells.
    let new: Vec<u8> = old.iter().map(|b| b.wrapping_add(1)).collect();
    s.bucket.put(&key, &new);
    let mut buf = vec![0u8; 1000];
    let e = read_full_at(&f, &mut buf, 2 * BLOCK as u64 + 10)
        .expect_err("an uncached block of the replaced object was served");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    // The cached block of the open version still reads as it was.
    let mut buf = vec![0u8; 100];
    assert_eq!(read_full_at(&f, &mut buf, 0).unwrap(), 100);
    assert!(buf[..] == old[..100]);
    drop(f);
    // After revalidation, the new object, whole.
    wait_until("the new bytes", Duration::from_secs(30), || {
        fs::read(s.scratch.mnt.join(rel)).is_ok_and(|b| b == new)
    });
}

#[test]
fn three_nodes_with_peers_get_each_object_once_over_three_epochs() {
    use common::cluster::*;
    require_fuse!();
    require_moto!();
    let moto = Moto::start();
    let bucket = moto.bucket("peers");
    bucket.create();
    let mut c = Cluster::new(60, 1_000, 300_000, 7);
    bucket.put_tree(&c.source(), "ds");
    let proxy = Proxy::start(&format!("127.0.0.1:{}", moto.port));
    c.url = Some("s3://peers/ds".into());
    let ports = [free_udp_port(), free_udp_port(), free_udp_port()];
    let nodes: Vec<Node> = (0..3)
        .map(|i| {
            let spec = NodeSpec {
                listen: format!("127.0.0.1:{}", ports[i]),
                peers: ports.iter().map(|p| format!("127.0.0.1:{p}")).collect(),
                secret: &c.secret,
                cache_size: "256M",
                // A node that waits past --peer-timeout for its peer reads
                // the source itself (as it should: a peer's fault falls back
                // to the source), and that is one more GET of the block; so
                // do an owner's stat of the path at the store past
                // --metadata-timeout (it answers "not found") and a peer
                // answering Busy for that long. Waits a loaded machine can
                // reach with 5 s; a healthy peer answers in milliseconds, so
                // 30 s costs the normal case nothing.
                peer_timeout: "30s",
                netns: None,
            };
            Node::start_spec_with(
                &c,
                &format!("n{i}"),
                spec,
                &["--endpoint", &proxy.endpoint, "--metadata-timeout", "30s"],
            )
        })
        .collect();
    for n in &nodes {
        n.wait_peers_up(&ports);
    }
    let refs: Vec<&Node> = nodes.iter().collect();
    for epoch in 0..3 {
        run_epoch(&c, &refs, epoch, 1);
    }
    for n in &nodes {
        let s = n.stats();
        eprintln!(
            "{}: source {} peers {} served {}; peer failures {}, busy {}",
            n.name, s.source_bytes, s.peer_bytes, s.peer_served_bytes, s.peer_failures, s.peer_busy
        );
        assert_eq!(s.read_errors, 0, "{}", n.name);
        assert!(s.peer_bytes > 0, "{} got nothing from its peers", n.name);
    }
    // Counted at the store: each block of each object GET once, by one node.
    let gets = proxy.counts.gets.lock().clone();
    let mut twice = Vec::new();
    for (rel, data) in &c.files {
        let blocks = (data.len() as u64).div_ceil(BLOCK);
        let got = gets.get(&format!("peers/ds/{rel}")).copied().unwrap_or(0);
        if got != blocks {
            twice.push(format!("{rel}: {got} GETs for {blocks} blocks"));
        }
    }
    if !twice.is_empty() {
        // Why a node went to the store for a block it should have had from
        // its owner: what each node logged about its peers.
        let why: Vec<String> = nodes
            .iter()
            .flat_map(|n| {
                n.log_text()
                    .lines()
                    .filter(|l| {
                        l.contains("peer down")
                            || l.contains("peer request failed")
                            || l.contains("peer stayed busy")
                            || l.contains("bad block")
                    })
                    .map(|l| format!("{}: {l}", n.name))
                    .collect::<Vec<_>>()
            })
            .collect();
        panic!("{twice:#?}\nwhat the nodes logged about their peers: {why:#?}");
    }
    let source: u64 = nodes.iter().map(|n| n.stats().source_bytes).sum();
    assert_eq!(
        source,
        c.total_bytes(),
        "bytes GET over 3 epochs on 3 nodes"
    );
}

/// Runs `python3 -c SCRIPT ARGS...`; its stdout, trimmed. Fails the test
/// with the script's stderr if it fails.
fn python(script: &str, args: &[&Path]) -> String {
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "python3 failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Whether python3 can import `module`, or why not.
fn python_has(module: &str) -> Result<(), String> {
    if which("python3").is_none() {
        return Err("python3 is not installed".into());
    }
    let ok = std::process::Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "python3 cannot import {module} (pip install {module})"
        ))
    }
}

/// A loader's pass over the data set through `mnt`, cold (the first mount)
/// then warm (a remount with the page cache dropped: every block from the
/// cache, none from the store); `check` runs the loader with the local copy
/// and the mounted one and returns what it counted.
fn cold_and_warm(bucket: &str, data: &Path, check: impl Fn(&Path) -> String) -> String {
    let moto = Moto::start();
    let b = moto.bucket(bucket);
    b.create();
    b.put_tree(data, "ds");
    let sc = Scratch::new();
    let url = format!("s3://{bucket}/ds");
    let args = patient(&["--endpoint", moto.endpoint.as_str(), "--block-size", "256K"]);
    let mut m = Mount::start_env(Path::new(&url), &sc.mnt, &sc.cache, &args, &[]);
    let cold = check(&sc.mnt);
    assert!(m.stat("source_reads") > 0, "the cold pass read nothing");
    assert_eq!(m.stat("read_errors"), 0);
    assert!(m.unmount().success());
    drop_page_cache();
    let m = Mount::start_env(Path::new(&url), &sc.mnt, &sc.cache, &args, &[]);
    let warm = check(&sc.mnt);
    assert_eq!(cold, warm);
    assert_eq!(
        m.stat("source_reads"),
        0,
        "the warm pass read from the store"
    );
    assert_eq!(m.stat("read_errors"), 0);
    cold
}

#[test]
fn tar_shards_read_with_pythons_tarfile_cold_and_warm() {
    require_fuse!();
    require_moto!();
    if let Err(why) = python_has("tarfile") {
        skip!("{why}");
    }
    // Two shards as WebDataset writes them: a sample's image and class
    // label side by side, images from 1 KB to 400 KB (many cross a 256 KiB
    // block boundary, and so do the tar headers between them).
    let data = tempfile::tempdir().unwrap();
    let made = python(
        r#"
import io, random, sys, tarfile
out, rnd, n = sys.argv[1], random.Random(17), 0
for s in range(2):
    with tarfile.open(f"{out}/shard-{s:04d}.tar", "w") as t:
        for i in range(30):
            for ext, size in (("jpg", rnd.randint(1000, 400_000)), ("cls", rnd.randint(1, 4))):
                ti = tarfile.TarInfo(f"{s:04d}{i:05d}.{ext}")
                ti.size = size
                t.addfile(ti, io.BytesIO(rnd.randbytes(size)))
                n += 1
print(n)
"#,
        &[data.path()],
    );
    // Streamed ("r|", as WebDataset reads a shard): every member's bytes
    // equal to the same member of the local shard.
    let check = |mnt: &Path| {
        python(
            r#"
import hashlib, os, sys, tarfile
src, mnt, n = sys.argv[1], sys.argv[2], 0
def members(path, mode):
    with tarfile.open(path, mode) as t:
        return {m.name: hashlib.sha256(t.extractfile(m).read()).hexdigest() for m in t if m.isfile()}
for name in sorted(os.listdir(src)):
    want = members(os.path.join(src, name), "r")
    got = members(os.path.join(mnt, name), "r|")
    assert got == want, f"{name}: members differ"
    n += len(got)
print(n)
"#,
            &[data.path(), mnt],
        )
    };
    let n = cold_and_warm("shards", data.path(), check);
    assert_eq!(n, made, "members read");
    assert_eq!(n, "120");
}

#[test]
fn parquet_read_by_pyarrow_over_mmap_cold_and_warm() {
    require_fuse!();
    require_moto!();
    if let Err(why) = python_has("pyarrow") {
        skip!("{why}");
    }
    // 300 k rows in 6 row groups, uncompressed: several MB, many blocks.
    let data = tempfile::tempdir().unwrap();
    python(
        r#"
import sys, pyarrow as pa, pyarrow.parquet as pq
n = 300_000
t = pa.table({
    "id": pa.array(range(n), pa.int64()),
    "label": pa.array([i * 7919 % 1000 for i in range(n)], pa.int32()),
    "path": pa.array([f"train/{i % 1000:04d}/img-{i:08d}.jpg" for i in range(n)]),
})
pq.write_table(t, f"{sys.argv[1]}/train.parquet", row_group_size=50_000, compression="none")
"#,
        &[data.path()],
    );
    let size = fs::metadata(data.path().join("train.parquet"))
        .unwrap()
        .len();
    assert!(size > 8 * BLOCK as u64, "{size} bytes");
    let check = |mnt: &Path| {
        python(
            r#"
import sys, pyarrow.parquet as pq
want = pq.read_table(sys.argv[1] + "/train.parquet")
got = pq.read_table(sys.argv[2] + "/train.parquet", memory_map=True)
assert got.equals(want), "the tables differ"
print(got.num_rows)
"#,
            &[data.path(), mnt],
        )
    };
    assert_eq!(cold_and_warm("parquet", data.path(), check), "300000");
}
