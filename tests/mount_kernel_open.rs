//! `--open-mode kernel`: the daemon answers OPEN with ENOSYS once, and the
//! kernel then opens files by itself (no OPEN or RELEASE request ever again,
//! reads with handle 0, page cache kept across opens). A tree reads byte for
//! byte the same as the source cold, warm and with the page cache dropped
//! (sequential reads of multi-block files and mmap included) while the
//! daemon sees no further OPEN; writes are still refused; a changed source
//! file shows after the revalidation interval, even through a descriptor
//! opened before the change.

mod common;

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime};

use common::prom::{self, Sample};
use common::*;

const MIB: usize = 1 << 20;

/// A tree with files of one and several blocks, nesting, a symlink and
/// modes. Returns the files to read with mmap.
fn generate_tree(src: &Path) -> Vec<&'static str> {
    let sizes = [
        ("sizes/empty", 0),
        ("sizes/one", 1),
        ("sizes/page", 4096),
        ("sizes/small", 100_000),
        ("sizes/block", MIB),
        ("sizes/block_plus", MIB + 1),
        ("sizes/three_blocks", 2 * MIB + 4095),
        ("sizes/big", 5 * MIB + 123),
        ("a/b/c/leaf.bin", 70_000),
        ("a/mid.bin", 3),
    ];
    for (i, (name, n)) in sizes.iter().enumerate() {
        write_file(&src.join(name), 40 + i as u64, *n);
    }
    for i in 0..20 {
        write_file(
            &src.join(format!("many/{i:03}.jpg")),
            200 + i,
            4096 + i as usize * 1000,
        );
    }
    fs::create_dir(src.join("empty_dir")).unwrap();
    std::os::unix::fs::symlink("../sizes/small", src.join("a/link")).unwrap();
    let p = src.join("modes_private");
    write_file(&p, 9, 321);
    fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
    // Fixed mtimes (with nanoseconds), compared by assert_same_tree.
    for (i, f) in list_files(src).iter().enumerate() {
        let t =
            SystemTime::UNIX_EPOCH + Duration::new(1_600_000_000 + i as u64, 123_456 + i as u32);
        File::open(src.join(f)).unwrap().set_modified(t).unwrap();
    }
    vec!["sizes/big", "sizes/small", "sizes/one", "many/007.jpg"]
}

/// The whole tree and the mmap reads equal the source.
fn check_tree(s: &Scratch, mmaps: &[&str], pass: &str) {
    assert_same_tree(&s.src, &s.mnt);
    for f in mmaps {
        let want = fs::read(s.src.join(f)).unwrap();
        assert!(
            mmap_read(&s.mnt.join(f)) == want,
            "{pass}: mmap of {f} differs from the source"
        );
    }
}

/// FUSE request counters of a mount's metrics endpoint.
struct Requests {
    addr: String,
}

impl Requests {
    fn new() -> (Requests, String) {
        let addr = format!("127.0.0.1:{}", free_tcp_port());
        (Requests { addr: addr.clone() }, addr)
    }

    fn scrape(&self) -> Vec<Sample> {
        prom::scrape(&self.addr).0
    }

    fn op(samples: &[Sample], op: &str) -> u64 {
        prom::value(samples, "locafs_fuse_requests_total", &[("op", op)]).unwrap_or(0.0) as u64
    }

    /// (OPEN, RELEASE) requests so far, as of after everything done before
    /// this call: the counters are copied into the endpoint twice a second,
    /// so this makes a GETXATTR (`locafs stats`), waits until the endpoint
    /// counts it, then waits one more copy.
    fn settled(&self, m: &Mount) -> (u64, u64) {
        let before = Self::op(&self.scrape(), "getxattr");
        let _ = m.stats();
        let seen = wait_for(Duration::from_secs(10), || {
            Self::op(&self.scrape(), "getxattr") > before
        });
        assert!(seen, "the metrics endpoint never counted the GETXATTR");
        std::thread::sleep(Duration::from_millis(1200));
        let s = self.scrape();
        (Self::op(&s, "open"), Self::op(&s, "release"))
    }
}

fn non_empty_files(src: &Path) -> u64 {
    list_files(src)
        .iter()
        .filter(|f| fs::metadata(src.join(f)).unwrap().len() > 0)
        .count() as u64
}

#[test]
fn tree_equals_source_cold_warm_and_uncached_without_open_requests() {
    require_fuse!();
    let s = Scratch::new();
    let mmaps = generate_tree(&s.src);
    let files = non_empty_files(&s.src);
    let (req, addr) = Requests::new();
    let m = s.mount(&["--open-mode", "kernel", "--metrics", &addr]);
    // Logged when the daemon answers the kernel's INIT, which need not have
    // been written yet when the mount returned (a fresh-clone CI once saw
    // the line missing right after it).
    let logged = wait_for(Duration::from_secs(10), || {
        m.stderr().contains("open mode kernel:")
    });
    assert!(logged, "no info line about the open mode: {}", m.stderr());

    check_tree(&s, &mmaps, "cold");
    let (opens_cold, releases) = req.settled(&m);
    // The first open got ENOSYS (that is what switches the kernel); the
    // test reads one file at a time, so no other open raced it.
    assert_eq!(opens_cold, 1, "OPEN requests of the cold pass");
    assert_eq!(releases, 0, "a RELEASE came without OPEN");
    let cold = m.stats();
    assert!(cold["source_bytes"].as_u64().unwrap() > 0, "{cold}");
    assert_eq!(cold["passthrough_opens"], 0, "{cold}");
    assert_eq!(cold["read_errors"], 0, "{cold}");
    // Every non-empty file reached the daemon and counted as an open
    // (for epoch tracking and stats).
    let opens = cold["opens"].as_u64().unwrap();
    assert!(opens >= files, "opens {opens} < {files} files read: {cold}");

    // Warm: the page cache serves; nothing new from the source.
    check_tree(&s, &mmaps, "warm");
    // The cache is filled after the replies: give it a moment.
    std::thread::sleep(Duration::from_millis(500));
    // Without the page cache every read goes through the daemon (handle 0),
    // served from the disk cache.
    drop_page_cache();
    check_tree(&s, &mmaps, "page cache dropped");
    let after = m.stats();
    assert_eq!(
        after["source_bytes"], cold["source_bytes"],
        "the uncached pass read from the source again: {after}"
    );
    assert!(
        after["cache_hit_bytes"].as_u64().unwrap() >= 5 * MIB as u64,
        "{after}"
    );
    assert_eq!(after["read_errors"], 0, "{after}");
    // Re-reads that reach the daemon are seen as accesses again.
    let reopens = after["opens"].as_u64().unwrap();
    assert!(
        reopens >= opens + files,
        "opens {reopens} after the uncached pass, {opens} before ({files} files): {after}"
    );

    // No OPEN or RELEASE in either later pass: the kernel opened alone.
    let (opens_end, releases) = req.settled(&m);
    assert_eq!(opens_end, opens_cold, "OPEN requests after the cold pass");
    assert_eq!(releases, 0, "RELEASE requests");
}

#[test]
fn write_opens_are_refused_after_the_kernel_stopped_sending_open() {
    require_fuse!();
    let s = Scratch::new();
    write_file(&s.src.join("a"), 1, 5000);
    write_file(&s.src.join("b"), 2, 5000);
    let before = fs::read(s.src.join("a")).unwrap();
    let (req, addr) = Requests::new();
    let m = s.mount(&["--open-mode", "kernel", "--metrics", &addr]);
    assert_eq!(fs::read(s.mnt.join("a")).unwrap(), before);
    let (opens, _) = req.settled(&m);
    assert_eq!(opens, 1);
    // The switch is made: another file opens without a request.
    assert_eq!(fs::read(s.mnt.join("b")).unwrap(), pattern(2, 5000));
    assert_eq!(req.settled(&m).0, 1, "no_open is not set");

    let p = s.mnt.join("a");
    let attempts: [(&str, OpenOptions); 5] = [
        ("O_WRONLY", OpenOptions::new().write(true).clone()),
        ("O_RDWR", OpenOptions::new().read(true).write(true).clone()),
        ("O_APPEND", OpenOptions::new().append(true).clone()),
        (
            "O_WRONLY|O_TRUNC",
            OpenOptions::new().write(true).truncate(true).clone(),
        ),
        (
            "O_RDONLY|O_TRUNC",
            OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_TRUNC)
                .clone(),
        ),
    ];
    for (name, o) in attempts {
        match o.open(&p) {
            Ok(_) => panic!("{name} open of a file succeeded"),
            Err(e) => assert!(
                matches!(e.raw_os_error(), Some(libc::EROFS) | Some(libc::EACCES)),
                "{name}: {e}"
            ),
        }
    }
    let e = File::create(s.mnt.join("new")).unwrap_err();
    assert!(
        matches!(e.raw_os_error(), Some(libc::EROFS) | Some(libc::EACCES)),
        "create: {e}"
    );
    // Nothing changed, through the mount or at the source.
    assert_eq!(fs::read(&p).unwrap(), before);
    assert_eq!(fs::read(s.src.join("a")).unwrap(), before);
    assert!(!s.src.join("new").exists());
    assert_eq!(req.settled(&m), (1, 0));
}

#[test]
fn source_changes_show_after_the_revalidation_interval() {
    require_fuse!();
    let s = Scratch::new();
    write_file(&s.src.join("a.bin"), 1, 100_000);
    write_file(&s.src.join("b.bin"), 2, 3 * MIB);
    write_file(&s.src.join("gone.bin"), 3, 10_000);
    let m = s.mount(&["--open-mode", "kernel", "--revalidate", "1s"]);
    for _ in 0..2 {
        // The second round is served from the page cache.
        assert_same_content(&s.src.join("a.bin"), &s.mnt.join("a.bin"));
        assert_same_content(&s.src.join("b.bin"), &s.mnt.join("b.bin"));
        assert_same_content(&s.src.join("gone.bin"), &s.mnt.join("gone.bin"));
    }
    // Descriptors opened before the change.
    let held_gone = File::open(s.mnt.join("gone.bin")).unwrap();
    let held = File::open(s.mnt.join("b.bin")).unwrap();
    let mut buf = vec![0u8; 4096];
    held.read_exact_at(&mut buf, MIB as u64).unwrap();
    assert!(buf == pattern(2, 3 * MIB)[MIB..MIB + 4096]);
    std::thread::sleep(Duration::from_millis(300));

    // a.bin: new size; b.bin: same size, new content and a later mtime;
    // gone.bin deleted.
    write_file(&s.src.join("a.bin"), 11, 150_000);
    write_file(&s.src.join("b.bin"), 22, 3 * MIB);
    File::options()
        .write(true)
        .open(s.src.join("b.bin"))
        .unwrap()
        .set_modified(SystemTime::now() + Duration::from_secs(5))
        .unwrap();
    fs::remove_file(s.src.join("gone.bin")).unwrap();
    std::thread::sleep(Duration::from_millis(2500));

    assert_eq!(fs::metadata(s.mnt.join("a.bin")).unwrap().len(), 150_000);
    assert_same_content(&s.src.join("a.bin"), &s.mnt.join("a.bin"));
    assert_same_content(&s.src.join("b.bin"), &s.mnt.join("b.bin"));
    // The old descriptor sees the new version too (no handle stays on the
    // version it opened in this mode).
    held.read_exact_at(&mut buf, MIB as u64).unwrap();
    assert!(
        buf == pattern(22, 3 * MIB)[MIB..MIB + 4096],
        "the descriptor opened before the change still reads the old bytes"
    );
    assert_eq!(
        fs::read(s.mnt.join("gone.bin")).unwrap_err().raw_os_error(),
        Some(libc::ENOENT)
    );
    // A read of the deleted file through a descriptor opened before fails.
    let e = held_gone.read_exact_at(&mut buf[..100], 0).unwrap_err();
    assert!(
        matches!(
            e.raw_os_error(),
            Some(libc::ENOENT) | Some(libc::EIO) | Some(libc::ESTALE)
        ),
        "read of a deleted file: {e}"
    );
    // And without the page cache, the new version comes from the daemon.
    drop_page_cache();
    assert_same_content(&s.src.join("a.bin"), &s.mnt.join("a.bin"));
    assert_same_content(&s.src.join("b.bin"), &s.mnt.join("b.bin"));
    let st = m.stats();
    assert_eq!(st["read_errors"], 0, "{st}");
}
