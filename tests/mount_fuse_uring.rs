//! `--fuse-uring`: FUSE requests over io_uring. A tree reads byte for byte
//! the same as the source over the rings, cold (answers from the daemon's
//! tasks), warm, with the page cache dropped, with and without passthrough,
//! under many readers at once and by mmap; the requests are counted as
//! having come over the rings; the daemon exits cleanly at umount. Where
//! the host has FUSE over io_uring off, the mount is refused with the
//! reason and what to do, and nothing is mounted.
//!
//! Both tests set the host's /sys/module/fuse/parameters/enable_uring (a
//! global switch), so they take one lock and put it back as they found it.

mod common;

use std::fs;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use common::*;

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";
const MIB: usize = 1 << 20;

static SWITCH: Mutex<()> = Mutex::new(());

/// Sets enable_uring for the test and puts back what was there on drop.
struct Uring {
    was: String,
}

impl Uring {
    /// None: this kernel has no FUSE over io_uring, or it cannot be set.
    fn set(on: bool) -> Result<Uring, String> {
        let was = fs::read_to_string(ENABLE_URING)
            .map_err(|e| format!("this kernel has no FUSE over io_uring ({ENABLE_URING}: {e})"))?;
        fs::write(ENABLE_URING, if on { "Y" } else { "N" })
            .map_err(|e| format!("cannot set {ENABLE_URING}: {e}"))?;
        Ok(Uring {
            was: was.trim().to_owned(),
        })
    }
}

impl Drop for Uring {
    fn drop(&mut self) {
        let _ = fs::write(ENABLE_URING, &self.was);
    }
}

fn generate_tree(src: &Path) {
    let sizes = [
        ("sizes/empty", 0),
        ("sizes/one", 1),
        ("sizes/page", 4096),
        ("sizes/small", 100_000),
        ("sizes/block", MIB),
        ("sizes/block_plus", MIB + 1),
        ("sizes/big", 5 * MIB + 123),
        ("a/b/c/leaf.bin", 70_000),
    ];
    for (i, (name, n)) in sizes.iter().enumerate() {
        write_file(&src.join(name), 40 + i as u64, *n);
    }
    for i in 0..300 {
        write_file(
            &src.join(format!("many/{:02}/{i:03}.jpg", i % 10)),
            200 + i,
            1000 + (i as usize * 977) % 200_000,
        );
    }
    std::os::unix::fs::symlink("../sizes/small", src.join("a/link")).unwrap();
}

/// Every file read by 16 threads at once, each compared with the source.
fn read_all_at_once(s: &Scratch) {
    let files = list_files(&s.src);
    std::thread::scope(|scope| {
        for t in 0..16 {
            let files = &files;
            scope.spawn(move || {
                for f in files.iter().skip(t).step_by(16) {
                    let want = fs::read(s.src.join(f)).unwrap();
                    let got = fs::read(s.mnt.join(f))
                        .unwrap_or_else(|e| panic!("{f:?} through the mount: {e}"));
                    assert!(got == want, "{f:?} differs from the source");
                }
            });
        }
    });
}

fn check(s: &Scratch, pass: &str) {
    assert_same_tree(&s.src, &s.mnt);
    for f in ["sizes/big", "sizes/small", "many/07/007.jpg"] {
        assert!(
            mmap_read(&s.mnt.join(f)) == fs::read(s.src.join(f)).unwrap(),
            "{pass}: mmap of {f} differs from the source"
        );
    }
}

fn tree_over_the_rings(extra: &[&str]) {
    let s = Scratch::new();
    generate_tree(&s.src);
    let mut args = vec!["--fuse-uring"];
    args.extend_from_slice(extra);
    let mut m = s.mount(&args);
    // Cold, many readers at once: answers come from the daemon's tasks
    // (source reads), not only from the rings' own threads.
    read_all_at_once(&s);
    let cold = m.stats();
    assert!(cold["source_bytes"].as_u64().unwrap() > 0, "{cold}");
    let rings_cold = cold["fuse_ring_requests"].as_u64().unwrap();
    let files = list_files(&s.src).len() as u64;
    assert!(
        rings_cold >= files,
        "{rings_cold} requests over the rings for {files} files read: {cold}"
    );
    check(&s, "cold");
    // The cache is written after the replies: give it a moment.
    std::thread::sleep(Duration::from_millis(500));
    check(&s, "warm");
    drop_page_cache();
    read_all_at_once(&s);
    check(&s, "page cache dropped");
    let after = m.stats();
    assert_eq!(after["read_errors"], 0, "{after}");
    assert!(
        after["fuse_ring_requests"].as_u64().unwrap() > rings_cold,
        "no requests over the rings after the cold pass: {after}"
    );
    assert!(
        m.stderr().contains("FUSE over io_uring:"),
        "no line about the rings: {}",
        m.stderr()
    );
    let st = m.unmount();
    assert!(st.success(), "exit {st:?}; stderr:\n{}", m.stderr());
}

#[test]
fn tree_reads_the_same_over_the_rings_and_the_daemon_exits_at_umount() {
    require_fuse!();
    let _one = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    let _on = match Uring::set(true) {
        Ok(u) => u,
        Err(why) => skip!("{why}"),
    };
    // Passthrough (the default): fully cached files are read by the kernel;
    // opens, lookups and first reads come over the rings.
    tree_over_the_rings(&[]);
    // No passthrough: every read that misses the page cache is a READ whose
    // data (up to 1 MiB) is answered in a ring entry's payload.
    tree_over_the_rings(&["--no-passthrough"]);
}

#[test]
fn refused_with_the_reason_where_the_host_has_it_off() {
    require_fuse!();
    let _one = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    let _off = match Uring::set(false) {
        Ok(u) => u,
        Err(why) => skip!("{why}"),
    };
    let s = Scratch::with_sample_files();
    let mut m = Mount::spawn(&s.src, &s.mnt, &s.cache, &["--fuse-uring"]);
    let st = m
        .wait_exit(Duration::from_secs(20))
        .unwrap_or_else(|| panic!("locafs --fuse-uring kept running: {}", m.stderr()));
    assert_eq!(st.code(), Some(2), "stderr:\n{}", m.stderr());
    let err = m.stderr();
    assert!(
        err.contains("enable_uring is N") && err.contains("echo Y >"),
        "the refusal does not say why and what to do:\n{err}"
    );
    assert!(!is_mounted(&s.mnt), "something is mounted after a refusal");
}
