//! An untrusted object store (or a man in the middle of a plain `http://`
//! endpoint) against a real `locafs mount`, with the hostile store of
//! tests/common/hostile.rs:
//!
//! - a 100-byte ranged GET answered with `Content-Length: 10 GiB` and a
//!   body streamed at full speed fails that read with EIO at once, counted
//!   in `source_bad_replies`; the daemon reads none of the body (its peak
//!   RSS stays far below the 300 MiB the store streams per try), the
//!   source is never marked stalled, and other files keep reading;
//! - a directory whose listing repeats its continuation token for ever
//!   (S3's and GCS's `NextContinuationToken`, Azure's `NextMarker`) fails
//!   its `ls` with EIO after the second page, for s3://, gs:// and az://
//!   alike, while the rest of the tree lists and reads.
//!
//! Each test says SKIPPED without root and /dev/fuse.

mod common;

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use common::hostile::{Dialect, HostileStore, HUGE_STREAM};
use common::*;

/// Which of the three kinds of store the mount is told it reads.
#[derive(Clone, Copy, Debug)]
enum Kind {
    S3,
    Gcs,
    Azure,
}

/// Mounts `kind://bucket/data` from `store` (no readahead: the test says
/// what is read).
fn mount(kind: Kind, store: &HostileStore, s: &Scratch, extra: &[&str]) -> Mount {
    let url = match kind {
        Kind::S3 => format!("s3://{}/data", store.bucket),
        Kind::Gcs => format!("gs://{}/data", store.bucket),
        Kind::Azure => format!("az://{}/data", store.bucket),
    };
    let sa = s.path().join("service-account.json");
    let mut args: Vec<String> = vec!["--block-size".into(), "256K".into()];
    let mut env: Vec<(&str, String)> = Vec::new();
    match kind {
        Kind::S3 => {
            args.extend(["--endpoint".into(), store.endpoint.clone()]);
            args.push("--no-sign-request".into());
        }
        Kind::Gcs => {
            fs::write(&sa, common::gcs::service_account_json(&store.endpoint)).unwrap();
            env.push(("GOOGLE_SERVICE_ACCOUNT", sa.to_string_lossy().into_owned()));
        }
        Kind::Azure => {
            args.extend(["--endpoint".into(), store.endpoint.clone()]);
            env.push(("AZURE_STORAGE_USE_EMULATOR", "true".into()));
        }
    }
    args.extend(extra.iter().map(|a| a.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Mount::start_env(Path::new(&url), &s.mnt, &s.cache, &args, &env)
}

/// How a bounded command ended.
enum Ended {
    /// It exited: whether it succeeded, and its stderr.
    Exited(bool, String),
    /// It ran past its limit (still waiting, perhaps in the kernel on the
    /// mount: only ending the daemon frees it).
    Running(std::process::Child),
}

/// `cmd args` as a child, waited for at most `limit`.
fn run_bounded(cmd: &str, args: &[&Path], limit: Duration) -> Ended {
    let mut child = Command::new(cmd)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let t0 = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            let _ = child.stderr.take().unwrap().read_to_string(&mut err);
            return Ended::Exited(status.success(), err);
        }
        if t0.elapsed() > limit {
            return Ended::Running(child);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn bytes(seed: u64, len: usize) -> Vec<u8> {
    pattern(seed, len)
}

#[test]
fn an_answer_longer_than_the_range_asked_fails_that_read_and_nothing_else() {
    require_fuse!();
    let store = HostileStore::start(Dialect::S3, "hostile");
    let good = bytes(1, 300_000);
    let small = bytes(2, 100);
    store.put("data/good.bin", &good);
    store.put("data/small.txt", &small);
    store.put("data/huge.bin", &bytes(3, 100));
    store.state.huge.lock().insert("data/huge.bin".into());
    let s = Scratch::new();
    let m = mount(Kind::S3, &store, &s, &["--no-readahead"]);
    let pid = m.pid().expect("the daemon's pid");

    let t0 = Instant::now();
    let e = fs::read(s.mnt.join("huge.bin")).expect_err("the malformed answer was served");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    eprintln!(
        "the read failed after {:.2}s; the store got {} MiB of its body out in {} requests",
        t0.elapsed().as_secs_f64(),
        store.state.huge_sent.load(Relaxed) >> 20,
        store.state.huge_requests.load(Relaxed)
    );
    // Asked once (the kernel tries a page whose read-ahead failed once
    // more), never again from a position past the range.
    assert!(store.state.huge_requests.load(Relaxed) <= 2);
    assert_eq!(store.state.unsatisfiable.load(Relaxed), 0);
    // Other files read, before and after another try of the bad one.
    assert_eq!(fs::read(s.mnt.join("good.bin")).unwrap(), good);
    assert!(fs::read(s.mnt.join("huge.bin")).is_err());
    assert_eq!(fs::read(s.mnt.join("small.txt")).unwrap(), small);
    // The body was not read: the socket buffers took what the store got
    // out (a few MiB on loopback), far from the 300 MiB it streams.
    let sent = store.state.huge_sent.load(Relaxed);
    assert!(sent < HUGE_STREAM / 4, "the daemon read {} MiB", sent >> 20);
    // The daemon's memory: 20-30 MiB here; a generous bound far below
    // what reading one such answer takes.
    let peak = peak_rss(pid).expect("VmHWM");
    eprintln!("daemon peak RSS {} MiB", peak >> 20);
    assert!(peak < 300 << 20, "peak RSS {} MiB", peak >> 20);
    assert_eq!(
        m.stat("source_bad_replies"),
        store.state.huge_requests.load(Relaxed),
        "one per bad answer"
    );
    assert_eq!(store.state.unsatisfiable.load(Relaxed), 0);
    assert_eq!(
        m.stat("source_stalls"),
        0,
        "one bad answer stalled the source"
    );
    assert!(m.stat("read_errors") >= 2);
}

fn endless_listing(kind: Kind) {
    let dialect = match kind {
        Kind::Azure => Dialect::Azure,
        Kind::S3 | Kind::Gcs => Dialect::S3,
    };
    let store = HostileStore::start(dialect, "hostile");
    let file = bytes(4, 5000);
    store.put("data/ok/file.bin", &file);
    store.put("data/loop/.keep", b"");
    store.state.endless.lock().insert("data/loop/".into());
    let s = Scratch::new();
    let m = mount(kind, &store, &s, &["--no-readahead"]);

    // Bounded far from the expected fraction of a second: on main the
    // listing never ends.
    let t0 = Instant::now();
    let (ok, err) = match run_bounded("ls", &[&s.mnt.join("loop")], Duration::from_secs(60)) {
        Ended::Exited(ok, err) => (ok, err),
        Ended::Running(mut ls) => {
            // The ls waits in the kernel for the daemon: end the daemon,
            // which ends the wait, before failing.
            let pages = store.state.endless_pages.load(Relaxed);
            let _ = signal(m.pid().unwrap(), Signal::KILL);
            let _ = ls.kill();
            let _ = ls.wait();
            panic!("{kind:?}: ls of an endless listing still ran after 60 s ({pages} pages)");
        }
    };
    let pages = store.state.endless_pages.load(Relaxed);
    assert!(!ok, "{kind:?}: an endless listing listed");
    assert!(err.contains("Input/output error"), "{kind:?}: {err}");
    eprintln!(
        "{kind:?}: ls failed after {:.2}s and {pages} pages",
        t0.elapsed().as_secs_f64()
    );
    assert!(pages <= 4, "{kind:?}: {pages} pages fetched");
    // The rest of the tree lists and reads.
    assert_eq!(listing(&s.mnt), ["loop", "ok"]);
    assert_eq!(fs::read(s.mnt.join("ok/file.bin")).unwrap(), file);
    assert!(m.stat("source_bad_replies") >= 1, "{kind:?}");
    assert_eq!(m.stat("source_stalls"), 0, "{kind:?}");
}

#[test]
fn a_listing_that_repeats_its_token_fails_and_the_rest_is_served() {
    require_fuse!();
    endless_listing(Kind::S3);
}

#[test]
fn gs_a_listing_that_repeats_its_token_fails_and_the_rest_is_served() {
    require_fuse!();
    endless_listing(Kind::Gcs);
}

#[test]
fn az_a_listing_that_repeats_its_marker_fails_and_the_rest_is_served() {
    require_fuse!();
    endless_listing(Kind::Azure);
}
